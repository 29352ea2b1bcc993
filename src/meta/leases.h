/*
 * Cache leases of a meta node: which client may answer which lookups itself, and
 * the revocations that keep those answers right.
 *
 * A client that wants to cache lookups opens a watch (META_WATCH, a long poll on a
 * connection of its own) and becomes a holder with a 32-bit id that is never
 * reused while meta runs (and, counting from a random point, unlikely to be
 * reused by the meta that follows a restart). Its lookups (META_LOOKUP_CACHE) are then granted a lease on the folder
 * (its names, present or absent) and on the inode found (its attributes), for
 * STK_LEASE_GRANT_MS. Every change meta makes to an inode's names or attributes
 * is bracketed by stk_meta_leases_begin and _end: begin stops new leases on the
 * inode, queues it for every holder with a lease on it (but the holder that made
 * the change, the request's origin, which forgets its own copies itself), wakes
 * their watches, and waits until each has acknowledged (its next watch names the
 * record as done); the change is committed after that. So no client answers from
 * before a change once anyone can see it.
 *
 * A holder that stops polling is not waited for forever: a client trusts its
 * cache only until STK_LEASE_VALID_MS after it sent the watch that meta last
 * answered, and meta waits for it no longer than that after it received that
 * watch (plus a margin). Such a holder is reset: its leases go, and its next
 * watch tells it to forget everything. A holder silent for much longer is
 * forgotten altogether; a meta restart forgets every holder, and a client whose
 * watch connection breaks forgets its cache at once.
 *
 * Delegations: a folder a holder made itself (META_MKDIR with STK_MKDIR_DELEGATE)
 * may be delegated to it: until meta recalls it, no one else reads or changes the
 * folder, so the holder answers creates and unlinks of files in it by itself and
 * sends them later (META_NAMES). A delegated folder has exactly one holder, and
 * no other holder has a lease on it meanwhile. A change by anyone else (begin,
 * changed) and a read by anyone else (stk_meta_leases_recall) recall it: the
 * folder is queued for the holder's watch as a revocation is, and the caller
 * waits as a change does. The holder, when its watch brings any record, first
 * sends every name it has not sent yet and only then acknowledges; so once the
 * recall returns, the store holds all the holder did in the folder. Until then
 * every other reader and changer of the folder waits for the same record. A
 * holder's delegations go with it (reset, end of its session, forgotten).
 *
 * Threads: every function may be called from any thread; one mutex guards all.
 * stk_meta_leases_watch, _begin, _changed and _recall block (the watch for at most
 * its wait, a change or a recall for at most the validity above); callers hold
 * nothing of the store or the sessions while they wait.
 */
#ifndef STK_META_LEASES_H
#define STK_META_LEASES_H

#include <stddef.h>
#include <stdint.h>

#include "../common/lease.h" /* STK_LEASE_GRANT_MS, STK_LEASE_VALID_MS */

struct stk_meta_leases;

/* Meta waits for a holder this long past STK_LEASE_VALID_MS after its last watch. */
#define STK_LEASE_MARGIN_MS 500u
#define STK_LEASE_WAIT_MAX_MS 1000u /* the longest a watch is held open empty */
#define STK_LEASE_HOLDERS_MAX 1024u
#define STK_LEASE_GRANTS_MAX (1u << 20)	     /* beyond: lookups are answered without a lease */
#define STK_LEASE_DELEGATIONS_MAX (1u << 16) /* beyond: new folders are not delegated */

/* 0 or -ENOMEM. */
int stk_meta_leases_create(struct stk_meta_leases **out);
/* Wakes every waiting watch and change and frees everything; nothing may call in after. */
void stk_meta_leases_destroy(struct stk_meta_leases *l);

/*
 * One watch of session's holder *holder (0: a new holder, whose id is returned in
 * *holder): records up to `acked` are done. Waits up to wait_ms (at most
 * STK_LEASE_WAIT_MAX_MS) for records, then returns up to `max` of them in inos[]
 * (*n), *seq the number of the last one returned (the next `acked`). *reset 1: the
 * holder was unknown or reset; the client must forget everything it cached, and
 * *holder is a new id. 0, -EINVAL (session 0), -EAGAIN (no free holder slot),
 * -ESHUTDOWN (meta stopping).
 */
int stk_meta_leases_watch(struct stk_meta_leases *l, uint64_t session, uint32_t *holder,
			  uint64_t acked, uint32_t wait_ms, uint64_t *inos, uint32_t max,
			  uint32_t *n, uint64_t *seq, int *reset);

/*
 * Grants holder a lease on ino. Must come before the store is read for the answer,
 * so that a change committed after the read finds the lease. 1 granted, 0 not (no
 * such holder, or the table is full).
 */
int stk_meta_leases_grant(struct stk_meta_leases *l, uint32_t holder, uint64_t ino);

/*
 * A meta node restarted after serving: a client cut off from the one before may
 * still trust its cache until STK_LEASE_VALID_MS after its last answered watch, and
 * a change committed sooner could be missed by it. From now on, changes wait (in
 * stk_meta_leases_begin) until the trust of any such client has run out, as the
 * old meta would have waited for it: STK_LEASE_VALID_MS plus meta's margin, 2.5 s.
 * Reads and grants do not wait. Call once, before serving.
 */
void stk_meta_leases_grace(struct stk_meta_leases *l);
/* stk_meta_leases_grace for ms from now instead of 2.5 s (0: none). */
void stk_meta_leases_grace_ms(struct stk_meta_leases *l, unsigned ms);

/*
 * The grace a follower promoted in a failover needs, in ms, counted from when it
 * learns of its promotion (docs/meta-replication.md, "Failover and fencing").
 * mgmtd promotes only once the old leader sent no heartbeat for hb_timeout_ms (T),
 * and the old leader serves nothing, watches included, from 3/4 T after its last
 * answered heartbeat (stk_agent_fenced): so the last watch it answered was sent at
 * least T/4 before the promotion, and its clients' trust ends by then plus
 * STK_LEASE_VALID_MS. The wait is STK_LEASE_VALID_MS plus meta's margin less T/4,
 * counted from the old leader's last heartbeat rather than from the promotion: 2 s
 * for T = 2 s, none from T = 10 s (the default). hb_timeout_ms 0 (unknown): the
 * whole 2.5 s, as after a restart.
 */
unsigned stk_meta_leases_failover_ms(unsigned hb_timeout_ms);

/*
 * Before a change to the names or attributes of inos[0..n) is committed: from now
 * until stk_meta_leases_end no lease on them is granted, and every holder's lease on
 * them but the origin's (0: none; it forgets its copies itself, and its leases stay)
 * is revoked: queued for its watch, and this returns once each has acknowledged or
 * run out of time (then it is reset). So when the change becomes visible, no other
 * client can still answer from before it. An inode delegated to a holder other
 * than the origin is recalled the same way, with or without a lease of that
 * holder on it; one delegated to the origin stays delegated. During a grace
 * period (stk_meta_leases_grace) this first waits for its end.
 */
void stk_meta_leases_begin(struct stk_meta_leases *l, uint32_t origin, const uint64_t *inos,
			   size_t n);
/* After the change (committed or failed): leases on inos may be granted again. */
void stk_meta_leases_end(struct stk_meta_leases *l, const uint64_t *inos, size_t n);
/* begin and end at once: for an inode found changed only after the commit. */
void stk_meta_leases_changed(struct stk_meta_leases *l, uint32_t origin, const uint64_t *inos,
			     size_t n);

/*
 * Delegates folder ino to holder (see the top of this file); call it once the
 * folder is made and found empty under holder's lease, before the reply. 1
 * delegated (or already delegated to holder), 0 not: no such holder or it is
 * being reset, the table holds STK_LEASE_DELEGATIONS_MAX, ino is delegated to
 * another holder or being changed, or another holder has a lease on it.
 * From now on stk_meta_leases_grant gives no other holder a lease on ino.
 */
int stk_meta_leases_delegate(struct stk_meta_leases *l, uint32_t holder, uint64_t ino);

/*
 * A counter that moves whenever folder ino, or another that shares its counter, is
 * delegated. A read reads it for each inode before it recalls them and again after
 * it read the store: if it moved, a delegation was made in between (whose holder
 * may already have answered creates or unlinks in it), and the read is made again,
 * recalling first. ino 0: a counter of every delegation made. Any thread; no lock.
 */
uint64_t stk_meta_leases_deleg_gen(struct stk_meta_leases *l, uint64_t ino);

/*
 * Would stk_meta_leases_recall(l, requester, inos, n) wait for anyone? 1 if one of
 * inos is delegated to a holder other than requester, else 0. Takes the lock only
 * while some folder is delegated somewhere; never waits otherwise.
 */
int stk_meta_leases_delegated_elsewhere(struct stk_meta_leases *l, uint32_t requester,
					const uint64_t *inos, size_t n);

/*
 * Before a read of inos[0..n) for requester (a holder, or 0 for a client without a
 * watch): each one delegated to another holder is recalled (the delegation goes,
 * the ino is queued for that holder), and this returns once each such holder has
 * acknowledged or run out of time (then it is reset), so the store then holds
 * everything the holders did in those folders. Leases are not touched (a read
 * changes nothing others cached), nor inodes delegated to requester itself.
 * Without any delegation this takes no lock. Returns how many of inos were
 * delegated to another holder (0: nothing was waited for); the caller reads again
 * what it read before such a recall.
 */
int stk_meta_leases_recall(struct stk_meta_leases *l, uint32_t requester, const uint64_t *inos,
			   size_t n);

/*
 * The delegation of folder ino goes, with nothing recalled: for a folder known gone
 * (its holder removed it, or renamed another over it, keeping its delegation), or
 * one whose holder has not been told of it yet (the reply of its META_MKDIR is not
 * sent). Any other would leave its holder answering alone while others read and
 * change it. Takes no lock without delegations.
 */
void stk_meta_leases_undelegate(struct stk_meta_leases *l, uint64_t ino);

/*
 * The holder is at work on what it owes (it sends the names of its delegated
 * folders, META_NAMES): the wait for its acknowledgement runs from now, as from a
 * watch. Waiting longer than its trust lasts is always safe; a holder that flushes
 * a long queue before it acknowledges is then not reset half-way.
 */
void stk_meta_leases_alive(struct stk_meta_leases *l, uint32_t holder);

/*
 * fn(ctx, session) is called, under the table's lock, whenever a holder of session
 * is reset or goes (forgotten, its session ended): what meta keeps for the holder
 * outside this table (its inode allowances, meta/store.h) goes with it. fn must not
 * call into this table. Set once, before serving; NULL: nothing is called.
 */
typedef void (*stk_meta_leases_drop_fn)(void *ctx, uint64_t session);
void stk_meta_leases_on_drop(struct stk_meta_leases *l, stk_meta_leases_drop_fn fn, void *ctx);

/* The session of holder `holder`, or 0: no such holder, or it is being reset. */
uint64_t stk_meta_leases_session_of(struct stk_meta_leases *l, uint32_t holder);
/* The live holder of session here (one per session and shard), or 0: none. */
uint32_t stk_meta_leases_holder_of(struct stk_meta_leases *l, uint64_t session);

/* The session ended: its holders go (their waiters stop waiting for them). */
void stk_meta_leases_end_session(struct stk_meta_leases *l, uint64_t session);

/*
 * Counts for /metrics and tests: holders, grants and delegations now; revokes
 * (records queued for a revocation), resets and recalls (delegations recalled by a
 * change or read by someone else) since create.
 */
struct stk_meta_leases_stats {
	uint64_t holders, grants, revokes, resets, delegations, recalls;
};
void stk_meta_leases_stats(struct stk_meta_leases *l, struct stk_meta_leases_stats *out);

#endif
