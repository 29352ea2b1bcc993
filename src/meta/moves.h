/*
 * Meta's vouch epoch and its log of moves (docs/security.md, "How long one is good
 * for"): what storage needs to tell whether a voucher still holds.
 *
 * A voucher carries the epoch meta read before it checked that the file lies under
 * the client's subtree. Every rename moves the epoch by one, after it commits, and
 * is recorded with that epoch (its `at`) as one of:
 *
 *   - a move of that file (of both, for an exchange), for a file renamed: META_WITHIN
 *     judges a file by the folder it was made in or last renamed into, so only its
 *     own vouchers may have left a subtree (within one folder too: a file with a
 *     second name in another folder, renamed there, now counts there);
 *   - wide, for a folder renamed (even within its parent: it may be a subtree's
 *     own folder, or one above it, whose path then names another folder or none)
 *     and for a rename that failed (nothing changed, but it is not worth telling).
 *
 * A voucher of epoch e for inode i is then good while e >= the last wide epoch and
 * e >= the epoch of i's last move: a rename of epoch <= e committed before the
 * voucher's check (and the check saw it), and one that committed after the check
 * has an epoch > e. Storage learns the log at most a second
 * late (META_EPOCH with `since`); the log keeps the last STK_META_MOVES_LOG moves,
 * and moves it dropped are reported as `lost` (every voucher older ends).
 *
 * Thread rules: any thread; one mutex, held while a rename is recorded or a reply
 * written; the epoch itself is read without it.
 */
#ifndef STK_META_MOVES_H
#define STK_META_MOVES_H

#include <stdint.h>

#include "../proto/codec.h"

#define STK_META_MOVES_LOG 4096u

struct stk_meta_moves;

/* The log, at epoch `base`; *out NULL on -ENOMEM. */
int stk_meta_moves_create(uint64_t base, struct stk_meta_moves **out);
/* NULL is fine. */
void stk_meta_moves_destroy(struct stk_meta_moves *mv);

/* Starts again at epoch base (a start, a promotion): every voucher before ends. */
void stk_meta_moves_restart(struct stk_meta_moves *mv, uint64_t base);

/* The epoch now: a voucher is stamped with it before its file is checked. */
uint64_t stk_meta_moves_epoch(struct stk_meta_moves *mv);

/*
 * A rename, once it committed (or failed): moves the epoch and records what it
 * moved. wide: a folder moved, or unknown; else inos[0..n) are the files
 * renamed. Returns its epoch.
 */
uint64_t stk_meta_moves_rename(struct stk_meta_moves *mv, int wide, const uint64_t *inos,
			       unsigned n);

/*
 * META_EPOCH's reply to a request with since: epoch, then meta_moves_resp and
 * the moves after since, newest last, at most STK_MOVED_MAX (older ones past
 * that counted in lost). 0, or -ENOSPC when w has no room.
 */
int stk_meta_moves_enc(struct stk_meta_moves *mv, uint64_t since, struct stk_wbuf *w);

#endif
