/*
 * The client's lookup cache: answers (folder, name) -> inode and attributes, and
 * "no such name", without a round trip to meta, for as long as meta's lease on
 * the answer holds (src/meta/leases.h).
 *
 * A background thread per metadata shard the client has used keeps a watch open
 * on that shard's meta (META_WATCH), with a holder id of that shard's: every inode it
 * names drops whatever the cache holds about it (as a folder: its names; as an
 * inode: its attributes). Meta answers a change only after every other client
 * with a lease on what it touched has acknowledged that, so a cached answer is
 * never older than the last change anyone was answered. The cache is trusted
 * only while the watch is answered within STK_LEASE_VALID_MS of being sent;
 * a broken watch of a shard, or a reset from its meta, empties what that shard
 * leased (the names in its folders, the attributes of its inodes); what the other
 * shards leased stays.
 *
 * Changes this client makes itself are sent with its holder id as the frame's
 * origin; meta then leaves this client out of the revocations and the client
 * forgets what the change touched itself, after the reply, at the same instant as
 * it keeps the new state when it can (stk_lcache_changed, _updated). Until then
 * answering from before the change is right: it has not happened yet. Requests
 * without the origin are revoked like anyone's.
 *
 * Invalidation is by inode: the cache keeps a generation per hash of an inode, an
 * entry remembers those of its folder and inode, and a revocation bumps them. A
 * lookup's reply is kept only if no revocation at all came between its request
 * and its reply (stk_lcache_begin/put).
 *
 * Off unless stk_lcache_start is called (the mount does; STOKER_LOOKUP_CACHE=0
 * keeps it off), and off for good against a meta without META_WATCH or without
 * sessions. Threads: every function may be called from any thread.
 */
#ifndef STK_CLIENT_LCACHE_H
#define STK_CLIENT_LCACHE_H

#include <stdint.h>

#include "stoker/stoker.h"

#include "../proto/msg.h"

struct stk_lcache;

/* Starts the cache and its watch thread (freed by stk_lcache_destroy). 0 (also when
 * STOKER_LOOKUP_CACHE=0 keeps it off), -ENOMEM or -EAGAIN (no thread): the client
 * then goes without. */
int stk_lcache_start(stk_client *c);
/* At disconnect, before the session ends: the watch thread stops at its next wake. */
void stk_lcache_stop(stk_client *c);
/* At disconnect, after the session ended (which wakes a parked watch): joins and frees. */
void stk_lcache_destroy(stk_client *c);
/* In a child after fork(): no thread there; the cache is off in the child. */
void stk_lcache_after_fork(stk_client *c);

struct stk_lcache_tok {
	uint64_t epoch, rev, t_ns;
	uint32_t holder;  /* 0: not trusted now, do not ask for a lease */
	uint32_t pend[2]; /* a change's keys in flight (stk_lcache_begin_change) */
};

/*
 * A cached answer for cred: 1 with *rc 0 (*out the inode's attributes) or -ENOENT
 * or -EACCES (no search permission on the folder), 0 when there is none to trust.
 */
int stk_lcache_get(stk_client *c, const struct stk_cred *cred, uint64_t parent, const char *name,
		   struct stk_attr *out, int *rc);
/*
 * Inode ino's attributes as a cached lookup answered them, under a lease on the
 * inode that still holds: 1 (*out filled), or 0 when there are none to trust. No
 * permission is checked (an open by inode: the kernel has checked).
 */
int stk_lcache_get_ino(stk_client *c, uint64_t ino, struct stk_attr *out);
/*
 * As stk_lcache_get_ino, and on a hit *until_ns (CLOCK_MONOTONIC, stk_now_ns) is
 * when the answer stops being trusted unless a revocation ends it sooner: the end
 * of the cache's trust in its watch or of the entry's lease, whichever is first.
 */
int stk_lcache_get_ino_until(stk_client *c, uint64_t ino, struct stk_attr *out, uint64_t *until_ns);
/*
 * Before a lookup that may be cached, sent to shard (the shard of the folder it
 * names): the state its answer must still match, and in .holder that shard's
 * holder while its watch is trusted (0: do not ask for a lease). Another shard's
 * watch, broken or not, does not matter.
 */
struct stk_lcache_tok stk_lcache_begin_at(stk_client *c, unsigned shard);
/* stk_lcache_begin_at shard 1. */
struct stk_lcache_tok stk_lcache_begin(stk_client *c);
/*
 * Before a change of this client's to parent's `name` (NULL: none) or to inode ino's
 * attributes (0: none): as stk_lcache_begin_at the shard of parent (else of ino),
 * and until the call that ends it
 * (stk_lcache_changed, _updated or _forget_name with this tok, exactly one) the
 * cache answers nothing about them and keeps no answer about them, so that no
 * thread of this client sees the change from meta and then the old state from
 * here.
 */
struct stk_lcache_tok stk_lcache_begin_change(stk_client *c, uint64_t parent, const char *name,
					      uint64_t ino);
/* Keeps a leased answer (found 0: no such name), unless anything was revoked since tok. */
void stk_lcache_put(stk_client *c, struct stk_lcache_tok tok, uint64_t parent, const char *name,
		    int found, const struct stk_attr *attr, const struct stk_attr *dir);
/*
 * After this client created `name` in parent (tok taken before the request):
 * forgets the name (lookups that raced with the create lose their answers)
 * and, at the same instant, keeps the new entry (attr, dir) if meta leased it
 * (leased 1) and nothing was revoked or forgotten since tok. attr and dir may be
 * NULL when leased is 0.
 */
void stk_lcache_changed(stk_client *c, struct stk_lcache_tok tok, uint64_t parent, const char *name,
			int leased, const struct stk_attr *attr, const struct stk_attr *dir);
/*
 * This client created or removed parent's `name` (nothing else in the folder
 * changed) and changed inode ino's attributes (0: none): forget those. failed 1:
 * the change failed or its outcome is unknown.
 */
void stk_lcache_forget_name(stk_client *c, struct stk_lcache_tok tok, uint64_t parent,
			    const char *name, uint64_t ino, int failed);
/*
 * After this client made folder dir (tok taken before the request) and meta said it
 * was empty under a lease: every name in it is known here from now (lookups of
 * other names are answered "no such name" without meta) until anything about the
 * folder is revoked or forgotten, or one of its names goes from the cache.
 * delegated: meta delegated it to this client too (behind.h).
 */
void stk_lcache_complete(stk_client *c, struct stk_lcache_tok tok, const struct stk_attr *dir,
			 int delegated);
/*
 * Write-behind (behind.h), under its gate. _free: 1 when parent is complete and
 * delegated here and `name` is not in it (*dmode, *dgid, *dqid: the folder's mode,
 * group and quota root, 0: none). _made: the new file is parent's `name` from now. _victim: 1 when
 * parent is delegated here and `name` is a regular file with one link (*out). _gone: the name is no
 * longer there (its folder stays complete).
 */
int stk_lcache_behind_free(stk_client *c, uint64_t parent, const char *name, uint32_t *dmode,
			   uint32_t *dgid, uint64_t *dqid);
void stk_lcache_behind_made(stk_client *c, uint64_t parent, const char *name,
			    const struct stk_attr *attr);
int stk_lcache_behind_victim(stk_client *c, uint64_t parent, const char *name,
			     struct stk_attr *out);
void stk_lcache_behind_gone(stk_client *c, uint64_t parent, const char *name, uint64_t ino);
/*
 * After this client changed inode ino's attributes (tok taken before the request):
 * forgets ino (lookups that raced with the change lose) and, at the same instant, puts attr (the
 * reply's; NULL when the change failed) into ino's cached entry if nothing else
 * touched ino since tok, so that the entry outlives this client's own writes.
 */
void stk_lcache_updated(stk_client *c, struct stk_lcache_tok tok, uint64_t ino,
			const struct stk_attr *attr);
/*
 * Names whose lease another client's change revoked: fn(ctx, parent, name, ino) is
 * called for each name the cache held for a revoked inode ino that is not a folder
 * (the last name it learnt for it; a folder is revoked at every change of its
 * names, which leaves its own name be), so that a cache above this one (the
 * kernel's, in the mount) can drop it too. Called from the watch thread, with the cache's mutex held, just
 * before the watch that acknowledges the revocation is sent (so, before meta
 * commits the change): fn must not block and must not call into this cache. At
 * most a few dozen per watch; names of more are not reported (the cache above must
 * cope with a stale name anyway). fn NULL: none from now; once this returns, no
 * call is in progress. Nothing happens while the cache is off.
 */
typedef void (*stk_lcache_revoked_fn)(void *ctx, uint64_t parent, const char *name, uint64_t ino);
void stk_lcache_on_revoked(stk_client *c, stk_lcache_revoked_fn fn, void *ctx);
/*
 * Every inode a revocation names: fn(ctx, ino) once per record of a watch's reply,
 * folders included, from the watch thread without the cache's mutex, after the
 * cache dropped them and before the watch that acknowledges them is sent (so,
 * before meta commits the change). fn may block briefly (a write to /dev/fuse) but
 * must not call into this cache. fn NULL: none from now; once this returns, no
 * call is in progress.
 */
typedef void (*stk_lcache_ino_fn)(void *ctx, uint64_t ino);
void stk_lcache_on_revoked_ino(stk_client *c, stk_lcache_ino_fn fn, void *ctx);

/*
 * The origin for a change this client forgets itself: shard 1's holder id; 0 when
 * the cache is off. A request to another shard with an origin goes with that
 * shard's own holder instead (stk_lcache_holder), as tokens taken for it carry.
 */
uint32_t stk_lcache_origin(stk_client *c);
/*
 * The holder id shard's meta knows this client by (its watch's), or 0: none yet,
 * the watch broken, or the cache off. Changes only when that shard's leases are
 * dropped, so an answer leased to it is kept only if it is still the one
 * (stk_lcache_put).
 */
uint32_t stk_lcache_holder(stk_client *c, unsigned shard);
/*
 * The client sends a request to shard (2..) for the first time: its watch starts,
 * on a thread of its own, and once it is answered that shard's folders are cached,
 * delegated and written behind as shard 1's are. Any thread; cheap after the first
 * call.
 */
void stk_lcache_use_shard(stk_client *c, unsigned shard);

/*
 * shard's holder id once its watch is answered and trusted, waiting up to ms for
 * it (its watch is started if it was not): 0 when none came, or the cache is off.
 * Any thread; blocks.
 */
uint32_t stk_lcache_wait_holder(stk_client *c, unsigned shard, unsigned ms);

/* Counts for the mount's /metrics and tests. */
struct stk_lcache_stats {
	uint64_t hits, misses, revoked, resets;
};
void stk_lcache_stats(stk_client *c, struct stk_lcache_stats *out);

#endif
