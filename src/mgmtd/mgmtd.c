/*
 * mgmtd: the RPC layer over the cluster state of state.c.
 *
 * Three requests (MGMT_REGISTER, MGMT_HEARTBEAT, MGMT_GET_ROUTING) and one
 * background thread that marks silent nodes OFFLINE, runs the rebalancer's round
 * (chain moves for balance and drains, state.h) and replaces nodes gone too long;
 * operators' requests (MGMT_REMOVE_NODE, MGMT_DRAIN_NODE, MGMT_REBALANCE,
 * MGMT_ACCEPT_LOSS) and the
 * storage nodes' reports (MGMT_TARGET_SYNCED, MGMT_TARGET_WIPED) change or read
 * the same state. mgmtd is not on the data
 * path: each node talks to it once a second, so one mutex around the state is
 * plenty, and every change that must survive a restart is saved to
 * data_dir/mgmtd.state before the reply goes out (the file is replaced atomically,
 * so a crash leaves either the old state or the new one). A node is only told its
 * id once that id is on disk, so ids are never handed out twice.
 *
 * Cluster mode (--etcd): the state is the value of PREFIX/mgmtd/state in etcd,
 * and any number of mgmtd run at once. An election thread campaigns for
 * PREFIX/mgmtd/leader (a txn that puts this mgmtd's address with a lease of
 * ELECT_TTL_S seconds if the key is absent) and, once it leads, keeps the lease
 * alive every second. The leader loads the state from etcd, moves its routing
 * version past anything a predecessor may have handed out, gives every node a
 * fresh heartbeat (a full timeout to find the new leader), and then serves as in
 * embedded mode, saving with a txn that only succeeds while the leader key still
 * has the create revision it won with: a deposed leader can never overwrite its
 * successor's state. It steps down at once, and answers NOT_LEADER from then on,
 * when a keepalive says the lease is gone, when the lease's time runs out without
 * a successful keepalive, or when a guarded save fails. Followers answer every
 * request but MGMT_LEADER with NOT_LEADER; MGMT_LEADER names the leader, read
 * from the leader key.
 */
#include "mgmtd.h"

#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../daemon/daemon.h"
#include "../common/log.h"
#include "../common/util.h"
#include "../net/net.h"
#include "../proto/msg.h"
#include "dash.h"
#include "etcd.h"
#include "metrics.h"
#include "state.h"

#define MGMTD_DEFAULT_HB_TIMEOUT_MS 10000u
/* The leader lease: a dead leader is replaced within about this long. */
#define ELECT_TTL_S 3u
#define ELECT_KEEPALIVE_MS 1000u
#define ELECT_RETRY_MS 500u
/* Smallest encoded target record: u32 + 3 x u64 + an empty string + 2 x u64, then
 * the resync figures: 2 x u32 + 3 x u64. */
#define TARGET_INFO_MIN 78
/*
 * Chains form once no new target registered for this long: the nodes of a cluster
 * started at once (`stoker up --nodes N`) all register first, so chains spread over
 * all of them from the start rather than being moved there (state.h).
 */
#define FORM_SETTLE_NS 1500000000ull

struct mgmtd {
	pthread_mutex_t lock; /* protects st and stop */
	pthread_cond_t wake;  /* wakes the expiry thread to stop; CLOCK_MONOTONIC */
	struct stk_mgmt_state st;
	int stop;
	uint64_t timeout_ns;
	uint64_t replace_after_ns; /* 0: never (opts.replace_after_s) */
	unsigned rebalance_moves;  /* moves in flight at most; 0: no balancing (opts) */
	char state_path[PATH_MAX];
	char addr[STK_ADDR_MAX]; /* the address it serves on, set before it serves */
	/* Start-up's, on stk_mgmtd_run's thread only. */
	const char *ready_file;
	struct stk_mgmtd_metrics *metrics; /* NULL without --metrics */
	struct stk_mgmtd_dash *dash;	   /* the dashboard, NULL without --metrics */
	unsigned ui_interval_ms;	   /* opts.ui_interval_ms */
	char *prometheus;		   /* opts.prometheus, or NULL */
	pthread_t expiry;
	int expiry_started;

	/* Cluster mode; etcd NULL in embedded mode. */
	struct stk_etcd *etcd;
	char leader_key[256], state_key[256];
	unsigned replicas_opt;	    /* --replicas, applied whenever it takes over */
	unsigned meta_replicas_opt; /* --meta-replicas, the same */
	unsigned meta_shards_opt;   /* --meta-shards, the same */
	int leading;		    /* under lock: 1 while this mgmtd leads (always in embedded) */
	int64_t lease;		    /* the leader lease, while leading (election thread's) */
	int64_t leader_rev;	    /* under lock: the leader key's create revision we won */
	char leader[STK_ADDR_MAX];  /* under lock: the leader's address, "" if unknown */
	pthread_t elect;
	int elect_started;
};

static void step_down(struct mgmtd *m, const char *why);

/* Saves the state if it changed. Called with m->lock held. */
static int persist(struct mgmtd *m)
{
	int rc;

	if (!m->st.dirty)
		return 0;
	if (m->etcd) {
		uint8_t *buf;
		size_t len;

		if (!m->leading)
			return -EREMCHG;
		rc = stk_mgmt_state_encode(&m->st, &buf, &len);
		if (rc == 0)
			rc = stk_etcd_put_guarded(m->etcd, m->state_key, buf, len, m->leader_key,
						  m->leader_rev);
		free(buf);
		if (rc == 0)
			m->st.dirty = 0;
		else if (rc == -ESTALE)
			step_down(m, "another mgmtd holds the leader key");
		else
			stk_error("cannot save the state to etcd: %s", strerror(-rc));
		return rc == -ESTALE ? -EREMCHG : rc;
	}
	rc = stk_mgmt_state_save(&m->st, m->state_path);
	if (rc)
		stk_error("cannot save %s: %s", m->state_path, strerror(-rc));
	return rc;
}

/* Reads `n` target records following a request's fields into a new array. */
static int decode_targets(struct stk_rbuf *r, uint32_t n, struct stk_msg_target_info **out)
{
	struct stk_msg_target_info *t;
	int rc = 0;

	*out = NULL;
	if ((uint64_t)n * TARGET_INFO_MIN > r->len - r->off)
		return -EBADMSG;
	if (n > STK_MGMT_MAX_NODE_TARGETS)
		return -EINVAL;
	t = calloc(n ? n : 1, sizeof(*t));
	if (!t)
		return -ENOMEM;
	for (uint32_t i = 0; i < n && rc == 0; i++)
		rc = stk_msg_target_info_dec(r, &t[i]);
	if (rc == 0)
		rc = stk_rbuf_finish(r);
	if (rc) {
		free(t);
		return -EBADMSG;
	}
	*out = t;
	return 0;
}

static int handle_register(struct mgmtd *m, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	struct stk_msg_mgmt_register_req rq;
	struct stk_msg_mgmt_register_resp rp;
	struct stk_msg_target_info *tgts = NULL;
	const struct stk_mgmt_node *node;
	uint32_t *ids = NULL;
	int rc;

	memset(&rp, 0, sizeof(rp));

	if (stk_msg_mgmt_register_req_dec(&req->payload, &rq))
		return -EBADMSG;
	rc = decode_targets(&req->payload, rq.ntargets, &tgts);
	if (rc)
		return rc;
	rc = -ENOMEM;
	ids = calloc(rq.ntargets ? rq.ntargets : 1, sizeof(*ids));
	if (!ids)
		goto out;
	pthread_mutex_lock(&m->lock);
	rc = m->leading ? stk_mgmt_state_register(&m->st, &rq, tgts, rq.ntargets, stk_now_ns(),
						  &rp.node_id, ids)
			: -EREMCHG;
	if (rc == 0) {
		/* Read under the lock: the node's entry may move with the next change. */
		node = stk_mgmt_state_node(&m->st, rp.node_id);
		rp.refused = node ? node->refused : 0;
		if (node && node->shard >= 1 && node->shard <= STK_MGMT_MAX_SHARDS) {
			rp.shard_ns_hi = m->st.shards[node->shard - 1].ns.hi;
			rp.shard_ns_lo = m->st.shards[node->shard - 1].ns.lo;
		} else {
			rp.shard_ns_hi = m->st.shards[0].ns.hi;
			rp.shard_ns_lo = m->st.shards[0].ns.lo;
		}
		rc = persist(m);
	}
	pthread_mutex_unlock(&m->lock);
	if (rc) {
		if (rc != -EREMCHG)
			stk_warn("registration from %s (%s) refused: %s", req->peer, rq.addr,
				 strerror(-rc));
		goto out;
	}
	rp.ntargets = rq.ntargets;
	stk_msg_mgmt_register_resp_enc(&resp->payload, &rp);
	for (uint32_t i = 0; i < rq.ntargets; i++)
		stk_put_u32(&resp->payload, ids[i]);
	rc = resp->payload.err;
out:
	free(ids);
	free(tgts);
	return rc;
}

/* --meta-replicas, when given, replaces what the state says (for the followers to come). */
static void meta_replicas_apply(struct mgmtd *m)
{
	if (!m->meta_replicas_opt || m->meta_replicas_opt == m->st.meta_replicas)
		return;
	stk_info("meta replicas: %u (was %u)", m->meta_replicas_opt,
		 m->st.meta_replicas ? m->st.meta_replicas : 1);
	m->st.meta_replicas = (uint8_t)m->meta_replicas_opt;
	m->st.dirty = 1;
}

/*
 * --meta-shards, when given and larger, raises what the state says; a smaller one
 * is ignored with a warning (each shard holds part of the namespace).
 */
static void meta_shards_apply(struct mgmtd *m)
{
	unsigned have = m->st.meta_shards ? m->st.meta_shards : 1;

	if (!m->meta_shards_opt || m->meta_shards_opt == have)
		return;
	if (m->meta_shards_opt < have) {
		stk_warn("--meta-shards %u ignored: the cluster has %u metadata shards, and a "
			 "shard is never dropped",
			 m->meta_shards_opt, have);
		return;
	}
	stk_info("metadata shards: %u (was %u)", m->meta_shards_opt, have);
	m->st.meta_shards = (uint8_t)m->meta_shards_opt;
	m->st.version++; /* clients and meta nodes see the new shard map */
	m->st.dirty = 1;
}

static int handle_heartbeat(struct mgmtd *m, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	struct stk_msg_mgmt_heartbeat_req rq;
	struct stk_msg_mgmt_heartbeat_resp rp;
	struct stk_msg_target_info *tgts = NULL;
	int rc;

	if (stk_msg_mgmt_heartbeat_req_dec(&req->payload, &rq))
		return -EBADMSG;
	rc = decode_targets(&req->payload, rq.ntargets, &tgts);
	if (rc)
		return rc;
	pthread_mutex_lock(&m->lock);
	rc = m->leading ? stk_mgmt_state_heartbeat(&m->st, rq.node_id, tgts, rq.ntargets,
						   stk_now_ns())
			: -EREMCHG;
	if (rc == 0) {
		stk_mgmt_state_set_host(&m->st, rq.node_id, rq.host_id);
		stk_mgmt_state_meta_report(&m->st, rq.node_id,
					   &(struct stk_ns_id){.hi = rq.ns_hi, .lo = rq.ns_lo},
					   rq.meta_epoch, rq.meta_seq);
	}
	if (rc == 0)
		persist(m); /* a failed save is logged; the node is alive all the same */
	rp.routing_version = m->st.version;
	rp.timeout_ms = (uint32_t)(m->timeout_ns / 1000000);
	pthread_mutex_unlock(&m->lock);
	if (rc == 0)
		rc = stk_msg_mgmt_heartbeat_resp_enc(&resp->payload, &rp);
	free(tgts);
	return rc;
}

static int handle_target_synced(struct mgmtd *m, struct stk_rpc_req *req)
{
	struct stk_msg_mgmt_target_synced_req rq;
	int rc;

	if (stk_msg_mgmt_target_synced_req_dec(&req->payload, &rq) ||
	    stk_rbuf_finish(&req->payload))
		return -EBADMSG;
	pthread_mutex_lock(&m->lock);
	rc = m->leading ? stk_mgmt_state_target_synced(&m->st, rq.node_id, rq.target_id,
						       rq.chain_id, rq.chain_ver)
			: -EREMCHG;
	if (rc == 0)
		rc = persist(m);
	pthread_mutex_unlock(&m->lock);
	return rc;
}

static int handle_remove_node(struct mgmtd *m, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	struct stk_msg_mgmt_remove_node_req rq;
	struct stk_msg_mgmt_remove_node_resp rp = {0};
	const struct stk_mgmt_node *n;
	int rc = 0;

	if (stk_msg_mgmt_remove_node_req_dec(&req->payload, &rq) ||
	    stk_rbuf_finish(&req->payload))
		return -EBADMSG;
	pthread_mutex_lock(&m->lock);
	n = stk_mgmt_state_node(&m->st, rq.node_id);
	if (!m->leading)
		rc = -EREMCHG;
	else if (!n || n->role != STK_ROLE_STORAGE)
		rc = -ENOENT;
	else if (n->state == STK_NODE_ONLINE &&
		 (!n->draining || stk_mgmt_state_node_members(&m->st, n->id)))
		rc = -EBUSY; /* only a drained node may go while it runs: it holds no copy */
	if (rc == 0) {
		stk_warn("node %u (%s): removal asked for: its targets are replaced now", n->id,
			 n->addr);
		rp.replaced = stk_mgmt_state_replace(&m->st, stk_now_ns(), 0, rq.node_id);
		rp.kept = stk_mgmt_state_node_members(&m->st, rq.node_id);
		if (rp.replaced)
			rc = persist(m);
	}
	pthread_mutex_unlock(&m->lock);
	if (rc == 0)
		rc = stk_msg_mgmt_remove_node_resp_enc(&resp->payload, &rp);
	return rc;
}

/* MGMT_TARGET_WIPED: a WIPING target is empty, SERVING again (state.h). */
static int handle_target_wiped(struct mgmtd *m, struct stk_rpc_req *req)
{
	struct stk_msg_mgmt_target_wiped_req rq;
	int rc;

	if (stk_msg_mgmt_target_wiped_req_dec(&req->payload, &rq) ||
	    stk_rbuf_finish(&req->payload))
		return -EBADMSG;
	pthread_mutex_lock(&m->lock);
	rc = m->leading ? stk_mgmt_state_target_wiped(&m->st, rq.node_id, rq.target_id)
			: -EREMCHG;
	if (rc == 0 && rq.chunks)
		stk_info("target %u: node %u removed %llu stale chunks (%llu bytes)", rq.target_id,
			 rq.node_id, (unsigned long long)rq.chunks, (unsigned long long)rq.bytes);
	if (rc == 0) {
		m->st.wiped_chunks += rq.chunks;
		m->st.wiped_bytes += rq.bytes;
	}
	if (rc == 0)
		rc = persist(m);
	pthread_mutex_unlock(&m->lock);
	return rc;
}

/*
 * What a node holds that a drain must move: a storage node's chain memberships;
 * a meta node's place in its shard (1 while it leads or follows, else 0).
 */
static uint32_t node_holds(const struct stk_mgmt_state *st, uint32_t node_id)
{
	const struct stk_mgmt_node *n = stk_mgmt_state_node((struct stk_mgmt_state *)st, node_id);

	if (n && n->role == STK_ROLE_META)
		return stk_mgmt_state_meta_role(st, node_id) != 0;
	return stk_mgmt_state_node_members(st, node_id);
}

/* MGMT_DRAIN_NODE: drains a storage or meta node, or cancels its drain. */
static int handle_drain_node(struct mgmtd *m, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	struct stk_msg_mgmt_drain_node_req rq;
	struct stk_msg_mgmt_drain_node_resp rp = {0};
	int rc;

	if (stk_msg_mgmt_drain_node_req_dec(&req->payload, &rq) ||
	    stk_rbuf_finish(&req->payload) || rq.drain > 1)
		return -EBADMSG;
	pthread_mutex_lock(&m->lock);
	rc = m->leading ? stk_mgmt_state_drain(&m->st, rq.node_id, rq.drain) : -EREMCHG;
	if (rc == 0) {
		/* the first moves start now, not at the next round */
		stk_mgmt_state_rebalance(&m->st, stk_now_ns(), m->rebalance_moves);
		rp.members = node_holds(&m->st, rq.node_id);
		rc = persist(m);
	}
	pthread_mutex_unlock(&m->lock);
	if (rc == 0)
		rc = stk_msg_mgmt_drain_node_resp_enc(&resp->payload, &rp);
	return rc;
}

/* MGMT_ACCEPT_LOSS: a chain whose every copy is lost serves from the one back. */
static int handle_accept_loss(struct mgmtd *m, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	struct stk_msg_mgmt_accept_loss_req rq;
	struct stk_msg_mgmt_accept_loss_resp rp = {0};
	int rc;

	if (stk_msg_mgmt_accept_loss_req_dec(&req->payload, &rq) ||
	    stk_rbuf_finish(&req->payload))
		return -EBADMSG;
	pthread_mutex_lock(&m->lock);
	rc = m->leading ? stk_mgmt_state_accept_loss(&m->st, rq.chain_id, &rp.promoted,
						     &rp.dropped, &rp.added)
			: -EREMCHG;
	if (rc == 0)
		rc = persist(m);
	pthread_mutex_unlock(&m->lock);
	if (rc == 0)
		rc = stk_msg_mgmt_accept_loss_resp_enc(&resp->payload, &rp);
	return rc;
}

/* MGMT_REBALANCE: the moves in flight and every storage node's load. */
static int handle_rebalance(struct mgmtd *m, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	struct stk_msg_mgmt_rebalance_resp rp = {0};
	const struct stk_mgmt_state *st = &m->st;
	int rc = 0;

	if (stk_rbuf_finish(&req->payload))
		return -EBADMSG;
	pthread_mutex_lock(&m->lock);
	if (!m->leading) {
		pthread_mutex_unlock(&m->lock);
		return -EREMCHG;
	}
	rp.max_moves = m->rebalance_moves;
	rp.started = st->moves_started;
	rp.finished = st->moves_finished;
	rp.abandoned = st->moves_abandoned;
	rp.nmoves = st->nmoves;
	for (uint32_t i = 0; i < st->nnodes; i++)
		rp.nnodes += st->nodes[i].role == STK_ROLE_STORAGE ||
			     st->nodes[i].role == STK_ROLE_META;
	stk_msg_mgmt_rebalance_resp_enc(&resp->payload, &rp);
	for (uint32_t i = 0; i < st->nmoves; i++) {
		struct stk_msg_move_rec mr = {.chain_id = st->moves[i].chain_id,
					      .out = st->moves[i].out,
					      .in = st->moves[i].in,
					      .drain = st->moves[i].drain};

		stk_msg_move_rec_enc(&resp->payload, &mr);
	}
	for (uint32_t i = 0; i < st->nnodes; i++) {
		const struct stk_mgmt_node *n = &st->nodes[i];
		struct stk_msg_node_load nl = {.node_id = n->id, .draining = n->draining};

		if (n->role != STK_ROLE_STORAGE && n->role != STK_ROLE_META)
			continue;
		nl.members = node_holds(st, n->id); /* a meta node: its place in its shard */
		for (uint32_t k = 0; k < st->ntargets; k++)
			nl.targets += st->targets[k].node_id == n->id &&
				      st->targets[k].state != STK_TARGET_OFFLINE;
		stk_msg_node_load_enc(&resp->payload, &nl);
	}
	rc = resp->payload.err;
	pthread_mutex_unlock(&m->lock);
	return rc;
}

static int handle_get_routing(struct mgmtd *m, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	struct stk_msg_mgmt_get_routing_req rq;
	int rc;

	if (stk_msg_mgmt_get_routing_req_dec(&req->payload, &rq) || stk_rbuf_finish(&req->payload))
		return -EBADMSG;
	pthread_mutex_lock(&m->lock);
	rc = m->leading ? stk_mgmt_state_encode_routing(&m->st, rq.known_version, stk_now_ns(),
							&resp->payload)
			: -EREMCHG;
	pthread_mutex_unlock(&m->lock);
	if (rc == -EMSGSIZE)
		stk_error("routing table does not fit in one reply (%u bytes at most)",
			  STK_MAX_PAYLOAD);
	return rc;
}

/* MGMT_LEADER: whether this one leads, and who does (an embedded mgmtd always leads). */
static int handle_leader(struct mgmtd *m, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	struct stk_msg_mgmt_leader_resp rp;

	if (stk_rbuf_finish(&req->payload))
		return -EBADMSG;
	memset(&rp, 0, sizeof(rp));
	pthread_mutex_lock(&m->lock);
	rp.leader = (uint8_t)m->leading;
	rp.etcd = m->etcd != NULL;
	stk_strlcpy(rp.addr, m->leading ? m->addr : m->leader, sizeof(rp.addr));
	pthread_mutex_unlock(&m->lock);
	return stk_msg_mgmt_leader_resp_enc(&resp->payload, &rp);
}

/* Hands this process's server the removed client identities. Call with m->lock held. */
static void revoked_sync(struct mgmtd *m)
{
	struct stk_auth_client *list = NULL;
	uint32_t n = 0;

	if (stk_mgmt_state_clients_revoked(&m->st, &list, &n) == 0)
		stk_net_clients_revoked_set(list, n);
	free(list);
}

/* MGMT_CLIENT_ADD: records a client identity under a new generation. */
static int handle_client_add(struct mgmtd *m, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	struct stk_msg_client_rec rq;
	struct stk_msg_mgmt_client_gen rp;
	struct stk_auth_client c;
	int rc;

	if (stk_msg_client_rec_dec(&req->payload, &rq) || stk_rbuf_finish(&req->payload))
		return -EBADMSG;
	if (strlen(rq.name) > STK_CLIENT_NAME_MAX || strlen(rq.subtree) > STK_CLIENT_SUBTREE_MAX)
		return -EINVAL;
	memset(&c, 0, sizeof(c));
	stk_strlcpy(c.name, rq.name, sizeof(c.name));
	c.flags = rq.flags;
	c.anon_uid = rq.anon_uid;
	c.anon_gid = rq.anon_gid;
	stk_strlcpy(c.subtree, rq.subtree, sizeof(c.subtree));
	pthread_mutex_lock(&m->lock);
	rc = m->leading ? stk_mgmt_state_client_add(&m->st, &c) : -EREMCHG;
	if (rc == 0)
		rc = persist(m);
	pthread_mutex_unlock(&m->lock);
	if (rc)
		return rc;
	stk_info("client %s added (generation %llu, subtree %s)", c.name, (unsigned long long)c.gen,
		 c.subtree);
	rp.gen = c.gen;
	return stk_msg_mgmt_client_gen_enc(&resp->payload, &rp);
}

/* MGMT_CLIENT_RM: revokes the name's identity; daemons refuse it from then on. */
static int handle_client_rm(struct mgmtd *m, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	struct stk_msg_mgmt_client_name rq;
	struct stk_msg_mgmt_client_gen rp = {0};
	int rc;

	if (stk_msg_mgmt_client_name_dec(&req->payload, &rq) || stk_rbuf_finish(&req->payload))
		return -EBADMSG;
	pthread_mutex_lock(&m->lock);
	rc = m->leading ? stk_mgmt_state_client_rm(&m->st, rq.name, &rp.gen) : -EREMCHG;
	if (rc == 0)
		rc = persist(m);
	if (rc == 0)
		revoked_sync(m);
	pthread_mutex_unlock(&m->lock);
	if (rc)
		return rc;
	stk_info("client %s removed (generation %llu)", rq.name, (unsigned long long)rp.gen);
	return stk_msg_mgmt_client_gen_enc(&resp->payload, &rp);
}

/* MGMT_CLIENTS: every client identity, removed ones too. */
static int handle_clients(struct mgmtd *m, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	int rc;

	if (stk_rbuf_finish(&req->payload))
		return -EBADMSG;
	pthread_mutex_lock(&m->lock);
	if (!m->leading) {
		pthread_mutex_unlock(&m->lock);
		return -EREMCHG;
	}
	revoked_sync(m); /* a follower that took over learns them here at the latest */
	stk_put_u32(&resp->payload, m->st.nclients);
	for (uint32_t i = 0; i < m->st.nclients; i++) {
		const struct stk_mgmt_client *c = &m->st.clients[i];
		struct stk_msg_client_rec r;

		memset(&r, 0, sizeof(r));
		stk_strlcpy(r.name, c->id.name, sizeof(r.name));
		r.gen = c->id.gen;
		r.flags = c->id.flags;
		r.anon_uid = c->id.anon_uid;
		r.anon_gid = c->id.anon_gid;
		stk_strlcpy(r.subtree, c->id.subtree, sizeof(r.subtree));
		r.removed = c->removed;
		stk_msg_client_rec_enc(&resp->payload, &r);
	}
	rc = resp->payload.err;
	pthread_mutex_unlock(&m->lock);
	return rc;
}

/* MGMT_QOS_SET: sets a tenant's limits; storage nodes fetch them with the next table. */
static int handle_qos_set(struct mgmtd *m, struct stk_rpc_req *req)
{
	struct stk_msg_qos_rec rq;
	int rc;

	if (stk_msg_qos_rec_dec(&req->payload, &rq) || stk_rbuf_finish(&req->payload))
		return -EBADMSG;
	pthread_mutex_lock(&m->lock);
	rc = m->leading ? stk_mgmt_state_qos_set(&m->st, &rq) : -EREMCHG;
	if (rc == 0)
		rc = persist(m);
	pthread_mutex_unlock(&m->lock);
	if (rc == 0)
		stk_info("qos %s: read %llu B/s, write %llu B/s, %u IOPS (0: no limit)", rq.tenant,
			 (unsigned long long)rq.read_bw, (unsigned long long)rq.write_bw, rq.iops);
	return rc;
}

/* MGMT_QOS_RM: drops a tenant's limits. */
static int handle_qos_rm(struct mgmtd *m, struct stk_rpc_req *req)
{
	struct stk_msg_mgmt_client_name rq;
	int rc;

	if (stk_msg_mgmt_client_name_dec(&req->payload, &rq) || stk_rbuf_finish(&req->payload))
		return -EBADMSG;
	pthread_mutex_lock(&m->lock);
	rc = m->leading ? stk_mgmt_state_qos_rm(&m->st, rq.name) : -EREMCHG;
	if (rc == 0)
		rc = persist(m);
	pthread_mutex_unlock(&m->lock);
	if (rc == 0)
		stk_info("qos %s: limits dropped", rq.name);
	return rc;
}

/* MGMT_QOS_LIST: every tenant's limits. */
static int handle_qos_list(struct mgmtd *m, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	int rc;

	if (stk_rbuf_finish(&req->payload))
		return -EBADMSG;
	pthread_mutex_lock(&m->lock);
	if (!m->leading) {
		pthread_mutex_unlock(&m->lock);
		return -EREMCHG;
	}
	stk_put_u32(&resp->payload, m->st.nqos);
	for (uint32_t i = 0; i < m->st.nqos; i++)
		stk_msg_qos_rec_enc(&resp->payload, &m->st.qos[i]);
	rc = resp->payload.err;
	pthread_mutex_unlock(&m->lock);
	return rc;
}

static int mgmtd_handle(void *ctx, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	struct mgmtd *m = ctx;

	/* A client key reads the routing table and nothing else of mgmtd's. */
	if (req->client && req->hdr.opcode != STK_OP_MGMT_GET_ROUTING &&
	    req->hdr.opcode != STK_OP_MGMT_LEADER) {
		stk_warn("%s: client %s may not %s: refused", req->peer, req->client->name,
			 stk_opcode_name(req->hdr.opcode));
		return stk_rpc_client_refused(resp, STK_CLIENT_REFUSED_ADMIN, -EPERM);
	}
	switch (req->hdr.opcode) {
	case STK_OP_MGMT_CLIENT_ADD:
		return handle_client_add(m, req, resp);
	case STK_OP_MGMT_CLIENT_RM:
		return handle_client_rm(m, req, resp);
	case STK_OP_MGMT_CLIENTS:
		return handle_clients(m, req, resp);
	case STK_OP_MGMT_QOS_SET:
		return handle_qos_set(m, req);
	case STK_OP_MGMT_QOS_RM:
		return handle_qos_rm(m, req);
	case STK_OP_MGMT_QOS_LIST:
		return handle_qos_list(m, req, resp);
	case STK_OP_MGMT_REGISTER:
		return handle_register(m, req, resp);
	case STK_OP_MGMT_HEARTBEAT:
		return handle_heartbeat(m, req, resp);
	case STK_OP_MGMT_GET_ROUTING:
		return handle_get_routing(m, req, resp);
	case STK_OP_MGMT_REMOVE_NODE:
		return handle_remove_node(m, req, resp);
	case STK_OP_MGMT_TARGET_SYNCED:
		return handle_target_synced(m, req);
	case STK_OP_MGMT_TARGET_WIPED:
		return handle_target_wiped(m, req);
	case STK_OP_MGMT_DRAIN_NODE:
		return handle_drain_node(m, req, resp);
	case STK_OP_MGMT_ACCEPT_LOSS:
		return handle_accept_loss(m, req, resp);
	case STK_OP_MGMT_REBALANCE:
		return handle_rebalance(m, req, resp);
	case STK_OP_MGMT_LEADER:
		return handle_leader(m, req, resp);
	default:
		return -ENOSYS;
	}
}

/* Marks silent nodes OFFLINE, checking a few times per timeout. */
static void *expiry_thread(void *arg)
{
	struct mgmtd *m = arg;
	uint64_t period_ns = m->timeout_ns / 4;
	struct timespec ts;

	if (period_ns > 1000000000ull)
		period_ns = 1000000000ull;
	if (period_ns < 50000000ull)
		period_ns = 50000000ull;
	pthread_mutex_lock(&m->lock);
	while (!m->stop) {
		clock_gettime(CLOCK_MONOTONIC, &ts);
		ts.tv_nsec += (long)(period_ns % 1000000000ull);
		ts.tv_sec +=
		    (time_t)(period_ns / 1000000000ull + (uint64_t)ts.tv_nsec / 1000000000);
		ts.tv_nsec %= 1000000000;
		pthread_cond_timedwait(&m->wake, &m->lock, &ts);
		if (m->stop)
			break;
		/* the rebalancer's round first: it abandons moves whose new member is gone,
		 * which replacement then leaves alone */
		if (m->leading &&
		    (stk_mgmt_state_expire(&m->st, stk_now_ns(), m->timeout_ns) +
		     stk_mgmt_state_rebalance(&m->st, stk_now_ns(), m->rebalance_moves) +
		     stk_mgmt_state_replace(&m->st, stk_now_ns(), m->replace_after_ns, 0)))
			persist(m);
	}
	pthread_mutex_unlock(&m->lock);
	return NULL;
}

/* ---- cluster mode: the election ---- */

/* Stops leading at once. Called with m->lock held. */
static void step_down(struct mgmtd *m, const char *why)
{
	if (!m->leading)
		return;
	m->leading = 0;
	m->leader[0] = 0;
	stk_warn("mgmtd %s no longer leads: %s", m->addr, why);
}

/* Sleeps up to ms, or less when mgmtd stops. 1 when it stops. */
static int elect_sleep(struct mgmtd *m, unsigned ms)
{
	struct timespec ts;
	int stop;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	ts.tv_sec += ms / 1000;
	ts.tv_nsec += (long)(ms % 1000) * 1000000L;
	if (ts.tv_nsec >= 1000000000L) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&m->lock);
	if (!m->stop)
		pthread_cond_timedwait(&m->wake, &m->lock, &ts);
	stop = m->stop;
	pthread_mutex_unlock(&m->lock);
	return stop;
}

/*
 * Just won the leader key (create revision rev): loads the state from etcd and
 * starts serving. The routing version moves past the clock's, so that it is
 * beyond any version a former leader handed out and failed to save.
 */
static int take_over(struct mgmtd *m, int64_t rev)
{
	struct stk_mgmt_state fresh;
	uint8_t *buf = NULL;
	size_t len = 0;
	int rc;

	rc = stk_etcd_get(m->etcd, m->state_key, &buf, &len, NULL);
	if (rc && rc != -ENOENT)
		return rc;
	pthread_mutex_lock(&m->lock);
	stk_mgmt_state_init(&fresh);
	if (rc == -ENOENT) {
		stk_info("no state in etcd (%s): starting a new cluster", m->state_key);
		stk_mgmt_state_free(&m->st);
		m->st = fresh;
		rc = 0;
	} else {
		/* Every node gets a fresh heartbeat: a full timeout to find this leader. */
		rc = stk_mgmt_state_decode(&m->st, buf, len, stk_now_ns());
		if (rc == 0 && m->st.version < fresh.version)
			m->st.version = fresh.version;
		m->st.version++;
		stk_mgmt_state_free(&fresh);
	}
	if (rc == 0) {
		revoked_sync(m);
		if (m->replicas_opt && m->replicas_opt != m->st.replicas)
			m->st.replicas = (uint8_t)m->replicas_opt;
		meta_replicas_apply(m);
		meta_shards_apply(m);
		m->st.form_settle_ns = FORM_SETTLE_NS;
		m->st.dirty = 1;
		m->leading = 1;
		m->leader_rev = rev;
		stk_strlcpy(m->leader, m->addr, sizeof(m->leader));
		rc = persist(m);
		if (rc)
			step_down(m, "cannot save the state");
	}
	if (rc == 0)
		stk_info("mgmtd %s leads (routing version %llu: %u nodes, %u targets, %u chains)",
			 m->addr, (unsigned long long)m->st.version, m->st.nnodes, m->st.ntargets,
			 m->st.nchains);
	pthread_mutex_unlock(&m->lock);
	free(buf);
	return rc;
}

/* A follower's round: learns the leader, or campaigns when there is none. */
static void campaign(struct mgmtd *m)
{
	uint8_t *val = NULL;
	size_t len = 0;
	int64_t lease = 0, rev = 0;
	int won = 0, rc;

	rc = stk_etcd_get(m->etcd, m->leader_key, &val, &len, NULL);
	if (rc == 0) {
		pthread_mutex_lock(&m->lock);
		if (strcmp(m->leader, (char *)val) != 0)
			stk_info("mgmtd %s follows %s", m->addr, (char *)val);
		stk_strlcpy(m->leader, (char *)val, sizeof(m->leader));
		pthread_mutex_unlock(&m->lock);
		free(val);
		return;
	}
	if (rc != -ENOENT)
		return;
	rc = stk_etcd_lease_grant(m->etcd, ELECT_TTL_S, &lease);
	if (rc == 0)
		rc = stk_etcd_put_if_absent(m->etcd, m->leader_key, m->addr, strlen(m->addr), lease,
					    &won, &rev);
	if (rc || !won) {
		if (lease)
			stk_etcd_lease_revoke(m->etcd, lease);
		return;
	}
	m->lease = lease;
	if (take_over(m, rev)) {
		stk_etcd_lease_revoke(m->etcd, lease);
		m->lease = 0;
	}
}

static void *elect_thread(void *arg)
{
	struct mgmtd *m = arg;
	uint64_t deadline = 0; /* monotonic ns: the lease is surely alive until then */
	int leading;

	for (;;) {
		pthread_mutex_lock(&m->lock);
		leading = m->leading;
		pthread_mutex_unlock(&m->lock);
		if (!leading) {
			if (m->lease) {
				stk_etcd_lease_revoke(m->etcd, m->lease);
				m->lease = 0;
			}
			campaign(m);
			pthread_mutex_lock(&m->lock);
			leading = m->leading;
			pthread_mutex_unlock(&m->lock);
			if (leading)
				deadline = stk_now_ns() + (uint64_t)ELECT_TTL_S * 1000000000ull;
		} else {
			uint64_t sent = stk_now_ns();
			unsigned ttl = 0;
			int rc = stk_etcd_lease_keepalive(m->etcd, m->lease, &ttl);

			pthread_mutex_lock(&m->lock);
			if (rc == 0 && ttl == 0)
				step_down(m, "its etcd lease is gone");
			else if (rc == 0)
				deadline = sent + (uint64_t)ttl * 1000000000ull;
			else if (stk_now_ns() >= deadline)
				step_down(m, "etcd unreachable for the lease's lifetime");
			leading = m->leading;
			pthread_mutex_unlock(&m->lock);
		}
		if (elect_sleep(m, leading ? ELECT_KEEPALIVE_MS : ELECT_RETRY_MS))
			break;
	}
	pthread_mutex_lock(&m->lock);
	step_down(m, "stopping");
	pthread_mutex_unlock(&m->lock);
	if (m->lease)
		stk_etcd_lease_revoke(m->etcd, m->lease); /* the next leader need not wait */
	return NULL;
}

/* ---- the daemon: stk_daemon_run's hooks ---- */

/* The cluster's metrics, and the dashboard on the same endpoint. */
static int mgmtd_metrics(void *ctx, struct stk_daemon *d)
{
	struct mgmtd *m = ctx;
	struct stk_mgmtd_dash_src src = {
	    .lock = &m->lock,
	    .st = &m->st,
	    .leading = &m->leading,
	    .leader = m->leader,
	    .cluster_mode = m->etcd != NULL,
	};
	int rc;

	rc = stk_mgmtd_metrics_create(&m->lock, &m->st, &m->metrics);
	if (rc == 0)
		rc = stk_mgmtd_dash_create(&src, m->ui_interval_ms, stk_daemon_metrics_http(d),
					   &m->dash);
	if (rc == 0 && m->prometheus)
		rc = stk_mgmtd_dash_prometheus(m->dash, m->prometheus);
	return rc;
}

static void mgmtd_metrics_stop(void *ctx)
{
	struct mgmtd *m = ctx;

	stk_mgmtd_dash_destroy(m->dash);
	m->dash = NULL;
	stk_mgmtd_metrics_destroy(m->metrics);
	m->metrics = NULL;
}

/* The heartbeat checker, then the ready file and the line that says mgmtd serves. */
static int mgmtd_start(void *ctx, struct stk_daemon *d)
{
	struct mgmtd *m = ctx;
	const char *addr = stk_daemon_addr(d);
	int rc;

	stk_strlcpy(m->addr, addr, sizeof(m->addr));
	rc = -pthread_create(&m->expiry, NULL, expiry_thread, m);
	if (rc) {
		stk_error("cannot start the heartbeat checker: %s", strerror(-rc));
		return rc;
	}
	m->expiry_started = 1;
	if (m->etcd) {
		rc = -pthread_create(&m->elect, NULL, elect_thread, m);
		if (rc) {
			stk_error("cannot start the election: %s", strerror(-rc));
			return rc;
		}
		m->elect_started = 1;
	}
	if (m->dash) {
		rc = stk_mgmtd_dash_start(m->dash, addr);
		if (rc) {
			stk_error("cannot start the dashboard's sampler: %s", strerror(-rc));
			return rc;
		}
	}
	if (m->ready_file) {
		rc = stk_write_file_atomic(m->ready_file, addr, strlen(addr));
		if (rc) {
			stk_error("cannot write %s: %s", m->ready_file, strerror(-rc));
			return rc;
		}
	}
	if (m->etcd)
		stk_info("mgmtd serving on %s, cluster mode: state in etcd at %s", addr,
			 m->state_key);
	else
		stk_info("mgmtd serving on %s (routing version %llu: %u nodes, %u targets, %u "
			 "chains)",
			 addr, (unsigned long long)m->st.version, m->st.nnodes, m->st.ntargets,
			 m->st.nchains);
	return 0;
}

static void mgmtd_stop(void *ctx)
{
	struct mgmtd *m = ctx;

	if (!m->expiry_started)
		return;
	pthread_mutex_lock(&m->lock);
	m->stop = 1;
	pthread_cond_broadcast(&m->wake);
	pthread_mutex_unlock(&m->lock);
	pthread_join(m->expiry, NULL);
	if (m->elect_started)
		pthread_join(m->elect, NULL);
}

int stk_mgmtd_run(const struct stk_mgmtd_opts *opts)
{
	struct stk_daemon_spec spec;
	struct stk_server_opts so;
	struct mgmtd *m;
	pthread_condattr_t ca;
	int rc;

	stk_daemon_init("mgmtd");
	if (!opts || opts->size < sizeof(*opts) || !opts->listen || !opts->data_dir) {
		stk_error("mgmtd: missing options (listen address and data folder are required)");
		return -EINVAL;
	}
	m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	pthread_mutex_init(&m->lock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&m->wake, &ca);
	pthread_condattr_destroy(&ca);
	stk_mgmt_state_init(&m->st);
	m->timeout_ns = (uint64_t)(opts->heartbeat_timeout_ms ? opts->heartbeat_timeout_ms
							      : MGMTD_DEFAULT_HB_TIMEOUT_MS) *
			1000000ull;
	m->ready_file = opts->ready_file;
	m->rebalance_moves = STK_MGMTD_REBALANCE_MOVES;
	if (opts->size >= offsetof(struct stk_mgmtd_opts, rebalance_moves) +
			      sizeof(opts->rebalance_moves) &&
	    opts->rebalance_moves)
		m->rebalance_moves = opts->rebalance_moves < 0 ? 0 : (unsigned)opts->rebalance_moves;
	m->replace_after_ns = opts->replace_after_s < 0 ? 0
			      : (uint64_t)(opts->replace_after_s ? opts->replace_after_s
								 : STK_MGMTD_REPLACE_AFTER_S) *
					1000000000ull;

	rc = stk_mkdir_p(opts->data_dir, 0755);
	if (rc) {
		stk_error("cannot create %s: %s", opts->data_dir, strerror(-rc));
		goto out;
	}
	if ((size_t)snprintf(m->state_path, sizeof(m->state_path), "%s/mgmtd.state",
			     opts->data_dir) >= sizeof(m->state_path)) {
		rc = -ENAMETOOLONG;
		stk_error("data folder path too long: %s", opts->data_dir);
		goto out;
	}
	m->replicas_opt = opts->replicas;
	if (opts->size >= offsetof(struct stk_mgmtd_opts, ui_interval_ms) +
			      sizeof(opts->ui_interval_ms))
		m->ui_interval_ms = opts->ui_interval_ms;
	if (opts->size >=
	    offsetof(struct stk_mgmtd_opts, meta_replicas) + sizeof(opts->meta_replicas)) {
		if (opts->meta_replicas > STK_MAX_REPLICAS) {
			stk_error("--meta-replicas %u: at most %d", opts->meta_replicas,
				  STK_MAX_REPLICAS);
			rc = -EINVAL;
			goto out;
		}
		m->meta_replicas_opt = opts->meta_replicas;
	}
	if (opts->size >=
	    offsetof(struct stk_mgmtd_opts, meta_shards) + sizeof(opts->meta_shards)) {
		if (opts->meta_shards > STK_MGMT_MAX_SHARDS) {
			stk_error("--meta-shards %u: at most %d", opts->meta_shards,
				  STK_MGMT_MAX_SHARDS);
			rc = -EINVAL;
			goto out;
		}
		m->meta_shards_opt = opts->meta_shards;
	}
	if (opts->size >= offsetof(struct stk_mgmtd_opts, prometheus) + sizeof(opts->prometheus) &&
	    opts->prometheus && !(m->prometheus = strdup(opts->prometheus))) {
		rc = -ENOMEM;
		goto out;
	}
	if (opts->size >= offsetof(struct stk_mgmtd_opts, etcd_prefix) + sizeof(opts->etcd_prefix) &&
	    opts->etcd) {
		const char *prefix = opts->etcd_prefix ? opts->etcd_prefix : "/stoker";

		rc = stk_etcd_create(opts->etcd, &m->etcd);
		if (rc) {
			stk_error("bad --etcd '%s': %s", opts->etcd, strerror(-rc));
			goto out;
		}
		snprintf(m->leader_key, sizeof(m->leader_key), "%s/mgmtd/leader", prefix);
		snprintf(m->state_key, sizeof(m->state_key), "%s/mgmtd/state", prefix);
		goto serve;
	}
	m->leading = 1;
	rc = stk_mgmt_state_load(&m->st, m->state_path, stk_now_ns());
	if (rc == -ENOENT) {
		stk_info("no state in %s: starting a new cluster", m->state_path);
		m->st.dirty = 1;
	} else if (rc) {
		stk_error("cannot load %s: %s%s", m->state_path, strerror(-rc),
			  rc == -EBADMSG ? " (corrupt; move it away to start a new cluster)" : "");
		goto out;
	}
	m->st.form_settle_ns = FORM_SETTLE_NS;
	revoked_sync(m);
	if (opts->replicas && opts->replicas != m->st.replicas) {
		if (m->st.replicas || m->st.nchains)
			stk_info("replicas: %u for chains made from now on (was %u)", opts->replicas,
				 m->st.replicas ? m->st.replicas : 1);
		m->st.replicas = (uint8_t)opts->replicas;
		m->st.dirty = 1;
	}
	meta_replicas_apply(m);
	meta_shards_apply(m);
	rc = persist(m);
	if (rc)
		goto out;

serve:
	memset(&so, 0, sizeof(so));
	so.size = sizeof(so);
	so.listen = opts->listen;
	so.handler = mgmtd_handle;
	so.ctx = m;
	so.workers = 4; /* its handlers hold a lock and never wait on the disk for long */
	memset(&spec, 0, sizeof(spec));
	spec.size = sizeof(spec);
	spec.role = "mgmtd";
	spec.server = &so;
	spec.metrics_listen = opts->metrics_listen;
	spec.rpc_lo = 1;
	spec.rpc_hi = 31;
	spec.ctx = m;
	spec.metrics = mgmtd_metrics;
	spec.metrics_stop = mgmtd_metrics_stop;
	spec.start = mgmtd_start;
	spec.stop = mgmtd_stop;
	rc = stk_daemon_run(&spec);
out:
	if (m->st.dirty && !m->etcd)
		persist(m);
	stk_etcd_destroy(m->etcd);
	stk_mgmt_state_free(&m->st);
	pthread_cond_destroy(&m->wake);
	pthread_mutex_destroy(&m->lock);
	free(m->prometheus);
	free(m);
	return rc;
}
