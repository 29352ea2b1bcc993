/*
 * The vouchers meta gave this client (wire.h STK_FRAME_VOUCH; docs/security.md,
 * "Vouchers"), kept so that its chunk requests carry them and storage serves a
 * subtree client key's reads and writes without asking meta.
 *
 * Only a client holding a subtree client key gets any: for any other client these
 * calls do nothing (stk_vouch_take finds no flag, stk_vouch_find nothing). The
 * table holds one voucher per inode in VOUCH_SLOTS slots (a newer one replaces
 * whatever held its slot) and the last few ranges of inode numbers reserved for
 * this client's creates. Losing one costs only a META_WITHIN at storage.
 *
 * Thread rules: any thread; one mutex, held for a copy.
 */
#ifndef STK_CLIENT_VOUCH_H
#define STK_CLIENT_VOUCH_H

#include <stddef.h>
#include <stdint.h>

#include "../proto/msg.h"

struct stk_client;
struct stk_vouches;

/* The table; *out NULL on -ENOMEM. */
int stk_vouches_create(struct stk_vouches **out);
/* NULL is fine. */
void stk_vouches_destroy(struct stk_vouches *v);

/*
 * A meta reply whose header flags are flags, payload resp[0..*len): with
 * STK_FRAME_VOUCH, takes the vouchers off its end (keeping them) and shortens
 * *len to the message's own fields. 0, or -EIO for a malformed trailer (the reply
 * is not to be read).
 */
int stk_vouch_take(struct stk_vouches *v, uint32_t flags, const void *resp, size_t *len);

/*
 * A voucher for ino that still has more than a second to live, into *out: 1, or
 * 0 for none.
 */
int stk_vouch_find(struct stk_vouches *v, uint64_t ino, struct stk_msg_vouch_rec *out);

#endif
