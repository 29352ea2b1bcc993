/*
 * Client sessions of a meta node: who has which file open, who holds which
 * lock, and the orphans (files whose last name went while open) that wait for
 * their last reference to go.
 *
 * A session is a client's random 64-bit id, kept alive by META_SESSION within
 * the lease (STOKER_SESSION_LEASE_MS on the meta daemon, default 10000 ms). Any
 * request naming a session renews it. A session that misses its lease expires:
 * its open references and locks go as if it had closed everything (a client
 * killed with kill -9, a machine cut off). Sessions live in memory; after a meta
 * restart clients find their session unknown at their next renewal and register
 * their open files again, and orphans found in the store are reaped only once a
 * lease and a margin have passed without anyone claiming them. Locks do not
 * survive a meta restart.
 *
 * Reaping: the reaper thread drops an orphan whose last reference went
 * (stk_meta_store_orphan_drop), which records its chunks for the purge in the
 * same transaction (purge.h removes them from storage); a failure is retried a
 * second later, and a crash before the drop leaves the orphan to be reaped after
 * the restart.
 *
 * Threads: every function may be called from any thread; one mutex guards the
 * tables. stk_meta_sessions_hold/release bracket the store calls whose outcome
 * depends on whether a file is open (unlink, rename), so that no META_OPEN slips
 * in between the check and the commit, and a create that registers the file it
 * returns (so that no unlink slips in between); the store's open hook is
 * stk_meta_sessions_is_open, which expects that mutex held.
 */
#ifndef STK_META_SESSION_H
#define STK_META_SESSION_H

#include <stdint.h>

#include "../mgmtd/agent.h"
#include "locks.h"
#include "store.h"

struct stk_meta_sessions;

#define STK_SESSION_LEASE_MS_DEFAULT 10000u

/* lease_ms 0 = $STOKER_SESSION_LEASE_MS or the default. 0 or -ENOMEM. */
int stk_meta_sessions_create(struct stk_meta_store *st, uint32_t lease_ms,
			     struct stk_meta_sessions **out);
/*
 * may_reap(ctx): whether orphans may be reaped now (their chunks removed): only
 * on the node that serves the shard (a replicated shard's leader). Set before
 * start; the reaper asks before each orphan and retries later on 0.
 */
void stk_meta_sessions_set_gate(struct stk_meta_sessions *s, int (*may_reap)(void *ctx), void *ctx);
/* Starts the reaper, which uses the agent's routing table (set before). 0 or -errno. */
int stk_meta_sessions_start(struct stk_meta_sessions *s, struct stk_agent *agent);
/* Stops the reaper and frees everything. */
void stk_meta_sessions_destroy(struct stk_meta_sessions *s);
uint32_t stk_meta_sessions_lease_ms(const struct stk_meta_sessions *s);

void stk_meta_sessions_hold(struct stk_meta_sessions *s);
void stk_meta_sessions_release(struct stk_meta_sessions *s);
/* With the mutex held: 1 if some session has ino open. */
int stk_meta_sessions_is_open(void *s, uint64_t ino);

/*
 * Creates or renews a session; *known 0 if it was new, or named before only by
 * other requests (an open after a restart: the client must register again what
 * it held). 0 or -ENOMEM, -EINVAL (id 0).
 */
int stk_meta_sessions_renew(struct stk_meta_sessions *s, uint64_t session, int *known);
/* Ends a session: references and locks go at once. */
void stk_meta_sessions_end(struct stk_meta_sessions *s, uint64_t session);
/*
 * Adds count references of session on ino, which must exist: with a name, or an
 * orphan this session still holds (-ENOENT otherwise, even if others hold it); with set, the session then holds
 * exactly count (a client registering again after a restart). *out (if not NULL)
 * becomes the inode's attributes, read under the mutex with the registration, so
 * that no unlink falls between them. On an error nothing is registered and *out
 * is untouched. 0, -ENOENT, -EINVAL, -ENOMEM.
 */
int stk_meta_sessions_open(struct stk_meta_sessions *s, uint64_t session, uint64_t ino,
			   uint32_t count, int set, struct stk_attr *out);
/*
 * With the mutex held (stk_meta_sessions_hold), adds one reference of session on
 * ino, which the caller has just created or found by name under the same hold
 * (META_CREATE). 0, -EINVAL (session 0), -ENOMEM.
 */
int stk_meta_sessions_open_held(struct stk_meta_sessions *s, uint64_t session, uint64_t ino);
/* Drops count references (fewer if it holds fewer); the last one of an orphan reaps it. */
int stk_meta_sessions_close(struct stk_meta_sessions *s, uint64_t session, uint64_t ino,
			    uint32_t count);
/* The lock table calls of locks.h, for session's requests (renewing it). */
int stk_meta_sessions_lock(struct stk_meta_sessions *s, uint64_t ino, const struct stk_lock *want,
			   int test, struct stk_lock *conflict);

#endif
