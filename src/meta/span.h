/*
 * Client keys' subtrees across metadata shards (docs/security.md, "Subtrees
 * across shards"; docs/meta-shards.md). A subtree key's root is a folder named
 * by a path from the namespace's root, and an inode lies under it when the
 * folder is on its chain of parent pointers (stk_meta_store_within). With
 * several shards both walks cross shards: a folder placed on another shard
 * points at its parent on its parent's shard, and a file renamed across shards
 * at the folder on the shard that names it. Here the walks go on where they
 * leave this shard's store:
 *
 * - resolve: the path's names are looked up on the shard of each folder, the
 *   others' by META_LOOKUP to their leader (as this meta node, which sees all);
 * - within: the parent pointers are followed in this store, then on the shard
 *   the walk left to, by META_XSHARD op UP, which walks that shard's store only
 *   and answers inside, outside, or the inode of yet another shard where it left
 *   (so no shard's answer waits on a third: the asker makes every hop). UP is
 *   served on the event loop (service.c), so two shards' workers asking each
 *   other never wait on each other's workers.
 *
 * What is cached: the answers of other shards only (what this store says is
 * read afresh each time), for SPAN_TTL_MS (1 s): a path resolved with another
 * shard's help, and each UP that did not answer outside. Nothing tells this node
 * of another shard's renames (each shard logs its own moves, moves.h), so a
 * folder moved out of a subtree on another shard, or a subtree's folder renamed
 * there, is seen here within that second, well within storage's own 5 s for a
 * META_WITHIN yes. A "no" is never kept: a folder moved in is reached at once.
 *
 * Threads: any; may_wait 0 (an event loop) answers -EWOULDBLOCK where another
 * shard would have to be asked and nothing is cached, and the caller hands the
 * request to a worker.
 */
#ifndef STK_META_SPAN_H
#define STK_META_SPAN_H

#include <stdint.h>

#include "../proto/msg.h"

struct stk_meta_store;
struct stk_meta_xshard;
struct stk_meta_span;

/* 0 or -ENOMEM. x asks the other shards; both outlive the span. */
int stk_meta_span_create(struct stk_meta_store *st, struct stk_meta_xshard *x,
			 struct stk_meta_span **out);
/* NULL: nothing. */
void stk_meta_span_destroy(struct stk_meta_span *sp);

/*
 * The folder an absolute path names, looked up as root without following
 * symlinks, on whatever shards its folders live. 0 with *ino; -ENOENT, -ENOTDIR,
 * -EINVAL (not absolute), -ENAMETOOLONG, -EIO (another shard did not answer),
 * -EWOULDBLOCK (may_wait 0), or the store's -errno.
 */
int stk_meta_span_resolve(struct stk_meta_span *sp, const char *path, uint64_t *ino, int may_wait);
/*
 * 1 when ino is top or lies under it, whatever shards the walk crosses; 0 when
 * not (or ino does not exist); -EIO (another shard did not answer, or more than
 * 64 crossings), -EWOULDBLOCK (may_wait 0), or the store's -errno.
 */
int stk_meta_span_within(struct stk_meta_span *sp, uint64_t ino, uint64_t top, int may_wait);
/* META_XSHARD op UP, served: r's state and attr.ino (msg.h). 0 or -errno. */
int stk_meta_span_up(struct stk_meta_span *sp, uint64_t ino, uint64_t top,
		     struct stk_msg_meta_xshard_resp *r);

#endif
