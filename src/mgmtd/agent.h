/*
 * The node agent: how a meta or storage daemon joins the cluster.
 *
 * stk_agent_start() registers the node with mgmtd (retrying until mgmtd answers
 * or the daemon is stopped), then runs a thread that heartbeats every second with
 * fresh target figures and re-fetches the routing table whenever mgmtd reports a
 * newer version. If mgmtd forgets the node (NOENT), the agent registers again.
 *
 * The daemon reads the routing table with stk_agent_routing_get(), which returns
 * a reference-counted snapshot that stays valid until stk_agent_routing_put();
 * any thread may call these.
 */
#ifndef STK_AGENT_H
#define STK_AGENT_H

#include <stdint.h>

#include "../proto/msg.h"

struct stk_agent;

/* Fills up to max target records (capacity, used, chunks, path, id). Returns the count. */
typedef uint32_t (*stk_agent_targets_fn)(void *ctx, struct stk_msg_target_info *out, uint32_t max);

/*
 * What a node that publishes its serving state (storage: its serve maps,
 * src/chunk/servemap.h) is told: rt, the routing table about to become the
 * agent's current one (or the current one), and alive_until_ns, the stk_now_ns()
 * time from which the node is fenced (stk_agent_fenced; 0 until a heartbeat is
 * answered). Called from the agent's threads, one call at a time, with no agent
 * lock that stk_agent_routing_get takes held: before a new table becomes current
 * (so nothing the node serves by it precedes its publication) and after each
 * answered heartbeat. It must not call into the agent but for
 * stk_agent_routing_get/put and stk_agent_fenced.
 */
typedef void (*stk_agent_state_fn)(void *ctx, const struct stk_routing *rt,
				   uint64_t alive_until_ns);

struct stk_agent_opts {
	size_t size; /* sizeof(struct stk_agent_opts) */
	const char *mgmtd; /* "HOST:PORT[,HOST:PORT...]": every mgmtd; the leader is followed */
	uint8_t role; /* STK_ROLE_META or STK_ROLE_STORAGE */
	const char *addr; /* the address this node serves on */
	uint32_t node_id; /* the id it had before, or 0 for a new node */
	stk_agent_targets_fn targets; /* NULL for a node without targets */
	void *ctx;
	/* The host id to report (--host-id), or NULL for this host's (common/host.h). */
	const char *host_id;
	/* Its failure domain (--zone; storage), or NULL: its host id stands for it. */
	const char *zone;
	struct stk_ns_id ns; /* a meta node's store identity (never zero); zero for storage */
	stk_agent_state_fn state; /* NULL, or told of table and fence changes (with ctx) */
	/*
	 * A meta node: what its store holds now (identity, last change; meta/store.h),
	 * asked before each registration and heartbeat, from the agent's threads, with
	 * ctx. NULL for storage.
	 */
	void (*meta_pos)(void *ctx, struct stk_ns_id *ns, uint64_t *epoch, uint64_t *seq);
	/*
	 * NULL, or handed mgmtd's QoS limits (MGMT_QOS_LIST, docs/qos.md) after each new
	 * table (storage: storage/qos.h); 0 or -errno.
	 */
	int (*qos)(const struct stk_msg_qos_rec *list, uint32_t n);
	/* A meta node's metadata shard (1 to the cluster's count; 0: 1). 0 for storage. */
	unsigned shard;
};

/*
 * Registers and starts heartbeating. On success *node_id is the node's id and, if
 * target_ids is not NULL, target_ids[i] is the id of the i-th target that
 * opts->targets reported (which the daemon persists next to the target's data).
 * 0, -EINTR (stopped while waiting for mgmtd), -EINVAL (opts->host_id is not a
 * valid host id), or -errno.
 */
int stk_agent_start(const struct stk_agent_opts *opts, struct stk_agent **out, uint32_t *node_id,
		    uint32_t *target_ids, uint32_t max_targets);
void stk_agent_stop(struct stk_agent *a);

/*
 * 1 when mgmtd refused this meta node (its store is not the namespace of shard 1):
 * it is registered, with an id, but must serve nothing. Known after a successful
 * stk_agent_start; a later registration (mgmtd lost the node) may also set it, and
 * then the agent logs it and asks the daemon to stop. *shard_ns: shard 1's identity
 * as mgmtd gave it (may be NULL). Any thread.
 */
int stk_agent_refused(struct stk_agent *a, struct stk_ns_id *shard_ns);

struct stk_routing_ref {
	struct stk_routing rt;
	int refs; /* owned by the agent */
};

/* The newest routing table; never NULL after a successful start. */
struct stk_routing_ref *stk_agent_routing_get(struct stk_agent *a);
void stk_agent_routing_put(struct stk_agent *a, struct stk_routing_ref *r);
/* Fetches the routing table now (after a peer said STALE_ROUTING). 0 or -errno. */
int stk_agent_routing_refresh(struct stk_agent *a);
/*
 * Tells mgmtd that target_id, SYNCING in chain chain_id at chain_ver, has copied
 * everything (MGMT_TARGET_SYNCED), then fetches the table. 0, -ESTALE (the chain
 * changed: sync again) or -errno.
 */
int stk_agent_target_synced(struct stk_agent *a, uint32_t target_id, uint32_t chain_id,
			    uint32_t chain_ver);

/*
 * Tells mgmtd that target_id, WIPING, holds no chunk any more (MGMT_TARGET_WIPED;
 * chunks and bytes: what was removed, for its log and metrics), then fetches the
 * table. 0, -ESTALE (the target is in a chain: mgmtd never asked) or -errno.
 */
int stk_agent_target_wiped(struct stk_agent *a, uint32_t target_id, uint64_t chunks,
			   uint64_t bytes);

/*
 * Whether mgmtd may already have given up on this node: no heartbeat answered for
 * three quarters of mgmtd's heartbeat timeout. A storage node then serves nothing
 * of a replicated chain, since mgmtd may have moved its chains on without it
 * (the node is cut off from mgmtd, not necessarily from clients). 0 until mgmtd
 * has answered one heartbeat. Any thread, no lock.
 */
int stk_agent_fenced(struct stk_agent *a);

/*
 * One-shot fetch from the leading mgmtd of the list `mgmtd`, for tools. Fills *rt
 * (free with stk_routing_free).
 */
int stk_mgmt_fetch_routing(const char *mgmtd, struct stk_routing *rt);

#endif
