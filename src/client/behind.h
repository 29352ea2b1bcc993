/*
 * Write-behind of names in delegated folders.
 *
 * A folder this client made with a delegation (META_MKDIR with STK_MKDIR_DELEGATE,
 * meta/leases.h) is its own until meta revokes it: nobody else reads or changes it
 * before this client's watch has acknowledged a revocation of it. While the lookup
 * cache holds it complete and delegated (lcache.h), creates and unlinks of regular
 * files in it are answered here, at once, and queued; a thread sends the queue to
 * meta in batches (META_NAMES) a millisecond or two later. What keeps that right:
 *
 *   - Nobody else sees the folder before the queue reached meta: a revocation of
 *     it waits for this client's acknowledgement, and the watch sends the queue
 *     before it acknowledges (stk_behind_gate_* around the revocations, then
 *     stk_behind_flush).
 *   - This client sees its own changes in order: every other call it makes to meta
 *     sends the queue first (stk_client_meta_call_from), so meta never gets a write,
 *     an open, a rename or a listing before the creates and unlinks that came
 *     before it. A file answered here is laid out here too (META_INOS gives the
 *     numbers and the placement), and its first write sends the queue first, so no
 *     byte reaches storage under a layout meta did not take.
 *   - A record meta refuses (it should not: the folder was this client's) is
 *     logged as an error and fails the next fsync, syncfs or flush of the mount.
 *
 * With several metadata shards (docs/meta-shards.md) each shard delegates its own
 * folders to the holder this client has there (lcache.h, stk_lcache_holder): the
 * records of a folder of shard K go to K's meta with K's holder as origin, its new
 * files take numbers K reserved, and K's watch sends K's records before it
 * acknowledges. Allowances are asked of, and counted for, the holder of the
 * quota's shard.
 *
 * What it costs: the numbers of a client that dies with records queued are lost
 * with them, like the data of a write-back cache (fsync makes them durable, as it
 * does data). Off unless stk_behind_start is called (the mount does, unless
 * -o nowritebehind or STOKER_WRITE_BEHIND=0).
 */
#ifndef STK_CLIENT_BEHIND_H
#define STK_CLIENT_BEHIND_H

#include <stdint.h>

#include "stoker/stoker.h"

#include "../proto/msg.h"

struct stk_behind;

/* Starts the queue and its thread (needs the lookup cache on). 0, -ENOMEM or -EAGAIN. */
int stk_behind_start(stk_client *c);
/* At disconnect: sends what is queued, stops the thread and frees. */
void stk_behind_destroy(stk_client *c);
/* In a child after fork(): no thread there; nothing is answered here in the child. */
void stk_behind_after_fork(stk_client *c);

/*
 * Creates regular file `name` (permission bits mode & 07777) in parent if parent is
 * delegated here and the name is known to be free: *out is the new file, already in
 * the lookup cache. 0, or -EAGAIN: not here (the caller asks meta).
 */
int stk_behind_create(stk_client *c, const struct stk_cred *cred, uint64_t parent,
		      const char *name, uint32_t mode, struct stk_attr *out);
/*
 * Removes `name` from parent if parent is delegated here and the name is a regular
 * file with one link that busy(ctx, ino) says nobody here has open: 0 (*ino_out
 * the inode), or -EAGAIN: not here (the caller asks meta).
 */
int stk_behind_unlink(stk_client *c, const struct stk_cred *cred, uint64_t parent,
		      const char *name, int (*busy)(void *ctx, uint64_t ino), void *ctx,
		      uint64_t *ino_out);
/*
 * A folder of shard was delegated here: reserves that shard's first inode numbers
 * now if it has none (one call to its meta, once), so that the first creates in
 * it are answered here too. Blocks; any thread but the watch's.
 */
void stk_behind_prepare(stk_client *c, unsigned shard);
/* Sends everything queued so far and waits for meta's answers. */
void stk_behind_send(stk_client *c);
/* As stk_behind_send; 0, or -EIO when a record was refused or lost since the last
 * call (each is logged when it happens). */
int stk_behind_flush(stk_client *c);
/*
 * As stk_behind_flush, for the records of shard's folders alone (a shard's watch
 * before it acknowledges: another shard's meta, down, does not hold it up).
 */
int stk_behind_flush_shard(stk_client *c, unsigned shard);
/*
 * Before the first write to inode ino, created here: sends the queue. 0, or -EIO
 * when meta refused ino's create (its bytes would belong to no file).
 */
int stk_behind_settle(stk_client *c, uint64_t ino);
/* Whether anything is queued (a cheap look, for the callers that must flush first). */
int stk_behind_queued(stk_client *c);
/* Around the watch's revocations: no answer is made here meanwhile. */
void stk_behind_gate_close(stk_client *c);
void stk_behind_gate_open(stk_client *c);

/* Counts for the mount's /metrics and tests. */
struct stk_behind_stats {
	uint64_t creates, unlinks, batches, failed;
	uint64_t allowed; /* inodes granted by META_ALLOW (quota allowances) */
	uint64_t allowed_bytes; /* bytes granted by META_ALLOW_BYTES */
};
void stk_behind_stats(stk_client *c, struct stk_behind_stats *out);

/*
 * Byte allowances (docs/quotas.md, "Bytes a mount writes"): room meta set aside in
 * a quota for this session's writes past files' sizes, so that such a write asks
 * meta nothing. A handle takes n bytes of quota qid's allowance for file ino
 * (stk_behind_bytes_take: 0 and *tag, or -EAGAIN: none here and none granted, or
 * no write-behind, no holder, an older meta; the caller reserves, META_QUOTA). The
 * bytes are the handle's until its size report spends them (sent with the tag's
 * session only while stk_behind_bytes_valid) or it gives them back
 * (stk_behind_bytes_done). A tag whose holder was reset, or whose session meta
 * lost, is no longer valid: meta dropped that allowance, and done ignores it.
 * Thread-safe; take may call meta (at most once) and must not be called with
 * the write-behind's lock held.
 */
struct stk_bytes_tag {
	uint64_t qid; /* 0: nothing taken */
	uint32_t holder, qepoch; /* holder: of qid's shard's meta */
};
int stk_behind_bytes_take(stk_client *c, uint64_t ino, uint64_t qid, uint64_t n,
			  struct stk_bytes_tag *tag);
int stk_behind_bytes_valid(stk_client *c, const struct stk_bytes_tag *tag);
void stk_behind_bytes_done(stk_client *c, const struct stk_bytes_tag *tag, uint64_t spent,
			   uint64_t back);
/*
 * Gives what this client holds of quota qid's byte allowance and no handle took
 * back to meta now (one META_ALLOW_BYTES), so that a reservation of the room
 * left (META_QUOTA) does not find it set aside for this very client.
 */
void stk_behind_bytes_release(stk_client *c, uint64_t qid);

#endif
