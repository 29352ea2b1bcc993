/*
 * Cross-shard folders (docs/meta-shards.md): a folder whose entry lives on its
 * parent's shard A and whose inode on another shard B.
 *
 * mkdir: (1) A writes an intent (its id X, parent, name, B); (2) B makes the folder
 * marked "pending for (A, X)"; (3) A writes the entry and drops the intent in one
 * transaction; (4) B clears the mark. rmdir: (1) A's intent; (2) B marks the empty
 * folder "dying for (A, X)" and makes nothing more in it; (3) A removes the entry
 * and the intent in one transaction; (4) B deletes the folder. Each step is one
 * transaction on one shard, held by that shard's followers before the next.
 *
 * Recovery, by each shard's leader, at once and every second: A gives up each
 * intent no request of its is working on (B deletes a pending folder of it,
 * unmarks a dying one, then A drops the intent); B asks A about each mark: an
 * intent still held means wait; otherwise the entry decides (present: the folder
 * lives; absent: it goes). So no name ever points at nothing (the entry is
 * written after the folder exists and removed before it goes) and no folder with
 * contents is lost (only an empty one is ever marked dying, and a dying one
 * takes nothing new).
 *
 * Files renamed across shards: (1) S's intent; (2) D's entry, replacing the old
 * one, and a mark with what it replaced; (3) S removes its entry, moves the
 * name's records and drops the intent, in one transaction (the commit); (4) D
 * drops the mark and what was replaced loses its name. Recovery: S gives up its
 * intents (D puts the old entry back); D asks S about each mark (committed: step
 * 4; not: undone). A name of a file off its home that goes is a release, told to
 * the home by the recovery thread until it answers.
 *
 * Hard links across shards, D the new name's shard: (1) D's intent; (2) H counts
 * the link and its record, marked; (3) D writes the entry and its record, drops
 * the intent (the commit); (4) H drops the mark. Recovery as for a rename.
 *
 * Folders moved across shards (folder F of shard C from P on A to Q on B): (1) A's
 * intent, F held; then, on a cluster of shards and to another parent, shard 1's
 * folder-move lock for (A, X) and the walk from Q up to the root (F met: EINVAL);
 * (2) B's entry and mark, C's mark; (3) A's commit, a done record for the intent;
 * (4) B and C settle, A drops the done record and the lock. Recovery: A gives up
 * intents and finishes done records; B and C ask A about their marks; shard 1
 * asks the lock's holder whether it still works under it.
 *
 * Test hook: STOKER_TEST_XSHARD_STOP=OP:K[:FILE] (OP mkdir, rmdir, rename, rmove or link,
 * K 1 to 4)
 * makes the meta node that completes step K of such an operation kill itself
 * (SIGKILL) right after it, once: it makes FILE (default: xshard-stopped in its
 * data folder) and no node stops while that file is there, so with FILE shared
 * the follower that takes over does not stop in turn.
 * STOKER_TEST_XSHARD_HOLD=rename:FILE makes the source's meta node, once step 2 of
 * a rename across shards is done (D's entry and mark), wait before step 3 while
 * FILE is there (at most 120 s): the rename is held mid-protocol, its intent and
 * mark in place, for as long as a test wants (the request waits meanwhile).
 * rename-undo:FILE holds it so too, then gives it up as if step 3 had failed: D
 * undoes its step 2 and the rename answers -EIO.
 *
 * Threads: every function may be called from any worker thread (they block on
 * the network); none from an event loop.
 */
#ifndef STK_META_XSHARD_H
#define STK_META_XSHARD_H

#include <stdint.h>

#include "../proto/msg.h"

struct stk_meta_store;
struct stk_meta_repl;
struct stk_agent;
struct stk_meta_xshard;

/* dir: the meta's data folder (the hook's file). 0, -ENOMEM, -EINVAL (a bad hook). */
int stk_meta_xshard_create(struct stk_meta_store *st, struct stk_meta_repl *repl, const char *dir,
			   struct stk_meta_xshard **out);
/*
 * The meta node's leases (leases.h), set before start and not owned: they must
 * outlive x. The marks settled here (a step 4, an undo, by a request or by
 * recovery) recall what clients cached of them; NULL (the default): none.
 */
struct stk_meta_leases;
void stk_meta_xshard_leases(struct stk_meta_xshard *x, struct stk_meta_leases *leases);
/* Once the agent runs: starts the recovery thread. 0 or -errno. */
int stk_meta_xshard_start(struct stk_meta_xshard *x, struct stk_agent *agent);
/* Stops the thread (before the agent goes) and frees. NULL: nothing. */
void stk_meta_xshard_destroy(struct stk_meta_xshard *x);

/*
 * Placement (docs/meta-shards.md): a folder's setting for the folders made in it,
 * the extended attribute trusted.stoker.shard: "N" (shard N) or "spread" (the
 * shard a hash of the new folder's name picks among the cluster's S).
 */
#define STK_XSHARD_PIN_XATTR "trusted.stoker.shard"
/*
 * The shard a new folder `name` in parent goes to: by parent's setting, else (none,
 * one shard, a shard the cluster does not have) this one. A routing table that
 * shows one shard is fetched again (at most once a second) before "spread" puts a
 * folder on this one: a meta node just started may not know the others yet.
 */
unsigned stk_meta_xshard_place(struct stk_meta_xshard *x, uint64_t parent, const char *name);
/* A setting's value (len bytes) is one: 0, or -EINVAL. */
int stk_meta_xshard_pin_check(struct stk_meta_xshard *x, const void *value, size_t len);
/*
 * mkdir of `name` in parent (of this shard) on shard `shard`: the four steps above.
 * *out: the new folder. The errors of a mkdir, or -EIO when the other shard could
 * not be reached (nothing is left behind: recovery settles what was begun).
 */
int stk_meta_xshard_mkdir(struct stk_meta_xshard *x, const struct stk_cred *cred, uint64_t parent,
			  const char *name, uint32_t mode, unsigned shard, struct stk_attr *out);
/* rmdir of `name` in parent, which names folder ino of another shard. Errors as rmdir's. */
int stk_meta_xshard_rmdir(struct stk_meta_xshard *x, const struct stk_cred *cred, uint64_t parent,
			  const char *name, uint64_t ino);
/*
 * rename of src_name in src_parent (of this shard) to dst_name in dst_parent, a
 * folder of another shard (docs/meta-shards.md, "Files renamed across shards"):
 * the four steps of xshard.c. The errors of a rename; -EXDEV for what is not
 * built (a folder, a file of a third shard, one with a name off its home
 * already, RENAME_EXCHANGE); -EIO when the other shard could not be reached
 * (recovery settles what was begun: the file under one of the two names).
 */
int stk_meta_xshard_rename(struct stk_meta_xshard *x, const struct stk_cred *cred,
			   uint64_t src_parent, const char *src_name, uint64_t dst_parent,
			   const char *dst_name, uint32_t flags);
/*
 * rename of the folder src_name in src_parent (of this shard) to dst_name in
 * dst_parent, when the folder or dst_parent is another shard's (above): the
 * errors of a rename; -EXDEV for RENAME_EXCHANGE or a folder of another shard
 * replaced; -EBUSY when the folder is in another move, or the lock could not be
 * had in 30 s; -EIO when a shard could not be reached (recovery settles what was
 * begun: the folder under one of its two names).
 */
int stk_meta_xshard_fmove(struct stk_meta_xshard *x, const struct stk_cred *cred,
			  uint64_t src_parent, const char *src_name, uint64_t dst_parent,
			  const char *dst_name, uint32_t flags);
/*
 * A folder `moved` of this shard moved to another parent `dst` of this shard (and,
 * for RENAME_EXCHANGE, folder moved2 to dst2; 0: none): on a cluster of shards,
 * the folder-move lock and the walk from each destination up to the root
 * (-EINVAL: a folder moved is its destination or above it); *token for _end. One
 * shard: nothing (token 0). -EBUSY, -EIO as for fmove.
 */
int stk_meta_xshard_dirmove_begin(struct stk_meta_xshard *x, uint64_t moved, uint64_t dst,
				  uint64_t moved2, uint64_t dst2, uint64_t *token);
void stk_meta_xshard_dirmove_end(struct stk_meta_xshard *x, uint64_t token);
/* Whether the cluster has more than one shard (as the routing table says). */
int stk_meta_xshard_sharded(struct stk_meta_xshard *x);
/*
 * hard link of file ino of another shard as `name` in parent (of this shard): the
 * four steps of xshard.c. *out: the file after. The errors of a link; -EXDEV when
 * the file has a name off its home already; -EIO as for rename.
 */
int stk_meta_xshard_link(struct stk_meta_xshard *x, const struct stk_cred *cred, uint64_t ino,
			 uint64_t parent, const char *name, struct stk_attr *out);
/*
 * A name here of a file of another shard went (unlink, rename over it): the
 * recovery thread tells its home now rather than within a second.
 */
void stk_meta_xshard_kick(struct stk_meta_xshard *x);
/* The attributes of inode ino of another shard, asked of its leader. 0 or -errno. */
int stk_meta_xshard_getattr(struct stk_meta_xshard *x, uint64_t ino, struct stk_attr *out);
/*
 * As stk_meta_xshard_getattr, on behalf of the client of `session` (META_XSHARD
 * ATTR, msg.h): its own delegation of ino there is not recalled, and *leased
 * says whether that shard leased ino to its holder there before reading it.
 * session 0, or an older leader: stk_meta_xshard_getattr, *leased 0.
 */
int stk_meta_xshard_getattr_for(struct stk_meta_xshard *x, uint64_t ino, uint64_t session,
				struct stk_attr *out, int *leased);
/* META_XSHARD: one step asked by another shard (q), answered in r. 0 or -errno. */
int stk_meta_xshard_serve(struct stk_meta_xshard *x, const struct stk_msg_meta_xshard_req *q,
			  struct stk_msg_meta_xshard_resp *r);

/*
 * One META_XSHARD request q to the leader of `shard`, retried as
 * stk_meta_xshard_ask is; its reply decoded into the caller's *r (nothing kept).
 * 0, the reply's -errno, -EINVAL (q does not encode), or -EIO (no answer, or a
 * malformed one). Worker threads only.
 */
int stk_meta_xshard_call(struct stk_meta_xshard *x, unsigned shard,
			 const struct stk_msg_meta_xshard_req *q, struct stk_msg_meta_xshard_resp *r);

/*
 * One request (opcode, req[0..len)) to the leader of `shard`, as this meta node
 * (unconfined), retried as the steps above are (5 s); the reply's payload into
 * resp (cap bytes), its length into *rlen. 0, the reply's -errno, or -EIO (no
 * answer). For meta/span.c. Worker threads only.
 */
int stk_meta_xshard_ask(struct stk_meta_xshard *x, unsigned shard, uint16_t opcode, const void *req,
			size_t len, void *resp, size_t cap, size_t *rlen);

#endif
