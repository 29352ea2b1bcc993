/*
 * Replication of the metadata shard between meta nodes (docs/meta-replication.md).
 *
 * mgmtd decides who leads the shard and who follows (the shard's entry in the
 * routing table: leader, followers, epoch); this module does what the entry
 * says. A leader ships each write transaction's redo record (meta/store.h,
 * "Replication") to every follower of its epoch, one batch of all that is new
 * per follower at a time, and a request that changed something is answered only
 * once every follower holds its change (stk_meta_repl_wait): the store's group
 * commit is kept, and a change costs at most one round trip more. A follower
 * applies what it is sent and serves no client. One that is new or behind is
 * sent the log it misses from the leader's memory (the last REPL_RING_BYTES of
 * changes), or a copy of the store followed by the log.
 *
 * Fencing: a follower refuses changes from a leader of an older epoch than it
 * knows (META_REPL answers STALE_ROUTING), so a leader that mgmtd replaced can
 * acknowledge nothing more; it learns of its demotion from the routing table,
 * from then on refuses every write (its store is a follower's) and clients
 * (NOT_LEADER), and follows the new leader, which copies its store to it when
 * their histories differ. A leader cut off from mgmtd (stk_agent_fenced) serves
 * nothing either.
 *
 * With one copy (the shard's replicas 0 or 1) it does nothing: the store
 * records nothing and every request is served, as before replication.
 *
 * Threads: stk_meta_repl_routing is called from the agent's threads; a manager
 * thread applies role changes; one sender thread per follower; the rest from
 * the server's threads. All entry points are thread-safe.
 */
#ifndef STK_META_REPL_H
#define STK_META_REPL_H

#include <stdint.h>

#include "../net/net.h"
#include "../proto/msg.h"
#include "store.h"

struct stk_meta_repl;
struct stk_agent;

/*
 * What a meta node is for its shard: OFF (no replication: serves), LEADER,
 * FOLLOWER, or NONE (not in the shard's entry yet: serves nothing).
 */
enum stk_meta_role {
	STK_META_ROLE_OFF = 0,
	STK_META_ROLE_LEADER = 1,
	STK_META_ROLE_FOLLOWER = 2,
	STK_META_ROLE_NONE = 3,
};

/*
 * promoted(ctx, failover): called (from the manager thread, or from start) when
 * this node becomes the leader, before it serves; failover: it followed before,
 * so what clients of the leader before may still trust must be waited for
 * (leases). 0, or -ENOMEM.
 */
int stk_meta_repl_create(struct stk_meta_store *st, void (*promoted)(void *ctx, int failover),
			 void *ctx, struct stk_meta_repl **out);
/*
 * Starts following the routing table: takes the role the agent's current table
 * gives (synchronously: when it returns, the node serves only if it should), then
 * starts the manager thread. metrics: register the series. 0 or -errno.
 */
int stk_meta_repl_start(struct stk_meta_repl *r, struct stk_agent *agent, uint32_t node_id,
			int metrics);
/*
 * stop: stops every thread (waiters return -EREMCHG) and ignores routing tables
 * from then on; destroy (after the agent is stopped): frees r. NULL is ignored.
 */
void stk_meta_repl_stop(struct stk_meta_repl *r);
void stk_meta_repl_destroy(struct stk_meta_repl *r);

/* The agent's state hook (stk_agent_state_fn): a new routing table. Never blocks. */
void stk_meta_repl_routing(void *ctx, const struct stk_routing *rt, uint64_t alive_until_ns);
/* The agent's meta_pos hook: the store's identity and last change. */
void stk_meta_repl_pos(void *ctx, struct stk_ns_id *ns, uint64_t *epoch, uint64_t *seq);

/* 1 when clients may be served: no replication, or the leader not cut off. */
int stk_meta_repl_serving(struct stk_meta_repl *r);
/* The current role (enum stk_meta_role). */
int stk_meta_repl_role(struct stk_meta_repl *r);
/*
 * Waits until every follower holds change seq (a number stk_meta_store_thread_seq
 * gave). 0, or -EREMCHG: this node no longer leads (the change may be lost; the
 * client asks the new leader).
 */
int stk_meta_repl_wait(struct stk_meta_repl *r, uint64_t seq);
/*
 * stk_meta_repl_wait for at most timeout_ms: also -ETIMEDOUT. For a thread of
 * the node's own that must not outwait a follower mgmtd has yet to drop (the
 * purger, which is stopped before replication).
 */
int stk_meta_repl_wait_ms(struct stk_meta_repl *r, uint64_t seq, unsigned timeout_ms);
/*
 * stk_meta_repl_wait without blocking the caller, for a reply that can be sent
 * from another thread: returns 1 when the change is not yet held by every
 * follower, and then done(arg, rc) runs exactly once, from a replication thread
 * (or the one that calls stk_meta_repl_close_async), with rc 0 once every
 * follower holds it or -EREMCHG as stk_meta_repl_wait returns it. Otherwise done
 * never runs, and it returns what stk_meta_repl_wait would (0 or -EREMCHG), or
 * -ENOMEM or -EAGAIN (closed: wait with stk_meta_repl_wait).
 */
int stk_meta_repl_wait_async(struct stk_meta_repl *r, uint64_t seq, void (*done)(void *arg, int rc),
			     void *arg);
/*
 * No more stk_meta_repl_wait_async (later calls return -EAGAIN); the replies that
 * wait are given up to 2 s for the followers, then called back with -EREMCHG.
 * Before the server that sends the replies goes away (stk_meta_repl_stop calls it
 * too). Blocks.
 */
void stk_meta_repl_close_async(struct stk_meta_repl *r);
/*
 * A leader's META_SYNC: every follower flushes its store to stable storage (what
 * it holds: all the leader acknowledged) before this returns, so that fsync and
 * close are durable on every replica. Concurrent calls share the followers'
 * flushes. 0 (also without replication), or -EREMCHG: this node no longer leads.
 */
int stk_meta_repl_sync(struct stk_meta_repl *r);
/* The META_REPL handler (a follower's side). 0 or -errno, as a handler returns. */
int stk_meta_repl_handle(struct stk_meta_repl *r, struct stk_rpc_req *req,
			 struct stk_rpc_resp *resp);

#endif
