/*
 * The client's session with meta (session.c) and its advisory locks (locks.c).
 *
 * Every stk_client has one session: a random 64-bit id that meta learns from
 * the first request naming it. Once the client opens a regular file, a
 * background thread renews the session every quarter of meta's lease (10 s by
 * default, STOKER_SESSION_LEASE_MS on meta), and keeps the list of the inodes it
 * holds open with their counts, so that after a meta restart ("session
 * unknown") it registers them again. stk_disconnect ends the session, dropping
 * its open references and locks at once; a client that dies loses them when the
 * lease runs out.
 *
 * A meta that does not serve sessions (ENOSYS) turns them off for the client:
 * files then keep the old behaviour (data removed at the last unlink) and lock
 * calls fail with -ENOSYS.
 */
#ifndef STK_CLIENT_SESSION_H
#define STK_CLIENT_SESSION_H

#include <stdint.h>

#include "stoker/stoker.h"

#include "../proto/msg.h"

struct stk_session;

/* At connect: allocates the session (no thread, no request yet). 0 or -ENOMEM. */
int stk_session_create(stk_client *c);
/*
 * At disconnect: stops the renewal thread and ends the session on meta (its
 * references and locks go); later calls of the session's functions are no-ops.
 */
void stk_session_end(stk_client *c);
/* After stk_session_end and once no other thread calls in (the lookup cache's watch
 * is joined): frees it (ending it first if need be). */
void stk_session_destroy(stk_client *c);
/* In a child after fork(): a new session of its own, holding nothing. */
void stk_session_after_fork(stk_client *c);
/*
 * The session id, starting the renewal thread on first use. 0 if sessions are
 * off (meta said ENOSYS).
 */
uint64_t stk_session_id(stk_client *c);
/*
 * Registers one open reference on ino (META_OPEN). With attr, returns 1 with *attr
 * the inode's attributes as meta read them with the registration (no unlink came
 * between), or 0 when there are none (sessions off, or a meta that does not send
 * them): the caller then fetches them itself. -ENOENT (gone, nothing registered),
 * -ENOMEM, -EIO.
 */
int stk_session_open(stk_client *c, uint64_t ino, struct stk_attr *attr);
/*
 * As stk_session_open without a round trip, when this client's lookup cache holds
 * ino's attributes under a lease (*attr): the reference is registered here and
 * meta learns it within a few milliseconds, unless it is dropped first (then
 * meta never does), and always before a change that could remove the file
 * (session.c). 1 registered, 0 not (nothing cached, sessions off, a sync under
 * way, out of memory): the caller registers through meta.
 */
int stk_session_open_cached(stk_client *c, uint64_t ino, struct stk_attr *attr);
/*
 * Before this client unlinks or renames anything, and before its watch
 * acknowledges a revocation: every reference registered here is sent to meta
 * first (waits for them).
 */
void stk_session_sync_opens(stk_client *c);
/*
 * Around a request that registers an open reference as a side effect (META_CREATE
 * with a session): reg_begin returns the session id to send (0: sessions off) and
 * holds off a re-registration (after a meta restart) until reg_end, which records
 * the reference meta added on ino (ino 0: none was). Every reg_begin is followed
 * by one reg_end with the same id. reg_end: 0, or -ENOMEM (the reference is then
 * dropped on meta again).
 */
uint64_t stk_session_reg_begin(stk_client *c);
int stk_session_reg_end(stk_client *c, uint64_t id, uint64_t ino);
/*
 * Drops one reference (the last of an unnamed file lets meta remove it). Does not
 * wait: the renewal thread sends it at once, merged with other queued closes.
 */
void stk_session_close(stk_client *c, uint64_t ino);
/*
 * Queues a read of ino for meta to record in its atime (relatime), sent with the
 * queued closes within a few milliseconds. 0, or -ENOSYS when there is no queue
 * (sessions off or not started, or a meta without META_CLOSES) or -ENOMEM: the
 * caller then sends META_SETATTR with STK_SETATTR_ATIME_READ itself.
 */
int stk_session_note_read(stk_client *c, uint64_t ino);

/*
 * A lock call for the FUSE daemon and stk_lock: kind STK_LOCK_POSIX / FLOCK,
 * r->type STK_LOCK_RD / WR / UN over [r->start, r->end]. With wait, a conflict
 * is retried with backoff (10 ms doubling to 250 ms) until granted, or until
 * cancelled(ctx) returns nonzero or a signal interrupts the sleep: -EINTR.
 * Without wait, a conflict is -EAGAIN. 0, -EAGAIN, -EINTR, -EINVAL, -ENOSYS, -EIO.
 */
int stk_ino_lock(stk_client *c, uint64_t ino, int kind, const struct stk_lock_range *r,
		 uint64_t owner, int wait, int (*cancelled)(void *), void *ctx);
/* F_GETLK: *r becomes the first conflicting lock, or r->type STK_LOCK_UN. */
int stk_ino_lock_test(stk_client *c, uint64_t ino, int kind, struct stk_lock_range *r,
		      uint64_t owner);

#endif
