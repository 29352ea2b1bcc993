/*
 * Client keys on meta (docs/security.md, "Client keys"): what a connection that
 * proved a client key (req->client, net.h) may ask, applied before the handler
 * runs, so that no handler needs to know of it.
 *
 * - Read-only: every change answers EROFS (reason read_only).
 * - Squash: the request's credentials (every record's, for META_NAMES) act as the
 *   anonymous uid and gid: all of them (squash-all), or uid 0 and gid 0 only.
 * - Subtree: the client's root, STK_ROOT_INO on the wire, is the subtree's
 *   folder; ".." of that folder is the folder itself; every other inode a
 *   request names must lie under it (stk_meta_span_within, across shards),
 *   else EACCES (reason outside). So no lookup, rename, link or request
 *   crafted by inode number reaches outside.
 * - Operators' requests (quota set, rm, recount, list) answer EPERM (admin).
 *
 * The handler then reads the request from a rewritten copy (credentials squashed,
 * the root mapped). A subtree is resolved on each request (a few LMDB reads;
 * another shard's part kept for a second, span.h), so renaming the subtree's
 * folder moves the client with it only if the policy's path still names it: a
 * path that names no folder refuses everything (ENOENT).
 */
#ifndef STK_META_CONFINE_H
#define STK_META_CONFINE_H

#include "../net/net.h"
#include "span.h"
#include "store.h"

/*
 * 0: serve req, whose payload may now read *copy (free it once the handler has
 * returned; NULL when nothing was rewritten). -errno: answer that, counted in
 * stoker_client_refused_total where the policy refused it. No-op (0) for a
 * request without req->client. Any thread: with may_wait 0 (an event loop), a
 * check that needs another shard's answer, none being cached (span.h), returns
 * -EWOULDBLOCK having answered nothing, and the request goes to a worker.
 */
int stk_meta_confine(struct stk_meta_store *st, struct stk_meta_span *sp, int may_wait,
		     struct stk_rpc_req *req, struct stk_rpc_resp *resp, void **copy);

#endif
