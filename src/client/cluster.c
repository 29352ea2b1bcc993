/*
 * Cluster status (stoker.h, "Cluster status"): the routing table as a read-only
 * snapshot for programs that show the cluster, `stoker status` and `stoker top`
 * among them.
 *
 * It asks mgmtd alone, over a connection of its own, once: a status tool must
 * answer while meta is down (stk_connect would wait for meta and retry for
 * retry_ms), and must say at once that mgmtd cannot be reached rather than retry.
 *
 * The snapshot keeps the decoded table and beside it the public structs, which
 * point into it for their strings and chain lists. The public types are
 * translated here from the wire's (proto/msg.h), as ll.c does for inodes, so the
 * wire can change under an unchanged API: roles and states by value, namespace
 * identities as hex text, the space summed as statfs sums it (common/host.h).
 */
#include "client.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../common/auth.h"
#include "../common/host.h"
#include "../common/log.h"
#include "../common/util.h"
#include "../proto/status.h"

/* As the node agent's one-shot fetch: long enough for a loaded host, short for a person. */
#define CLUSTER_CONNECT_TIMEOUT_MS 2000

struct cluster_node {
	struct stk_cluster_node pub;
	char ns[STK_NS_ID_STR];
};

struct cluster_shard {
	struct stk_cluster_shard pub;
	char ns[STK_NS_ID_STR];
};

struct stk_cluster_status {
	char addr[STK_ADDR_MAX];	/* the mgmtd that answered */
	struct stk_mgmt_addrs mgmt;	/* the list asked */
	int mgmt_state[STK_MGMT_ADDRS_MAX]; /* STK_CLUSTER_MGMTD_*, by list position */
	struct stk_routing rt; /* what the public structs point into */
	struct cluster_node *nodes;
	struct stk_cluster_target *targets;
	struct stk_cluster_chain *chains;
	struct cluster_shard *shards;
	struct stk_cluster_space space;
	struct stk_cluster_move *moves; /* nmoves, from MGMT_REBALANCE */
	uint32_t nmoves;
	struct stk_cluster_rebalance rebalance;
};

int stk_cluster_resolve(const char *cluster, char *addr, size_t len)
{
	return cluster ? stk_client_parse_cluster(cluster, addr, len)
		       : stk_client_default_cluster(addr, len);
}

/*
 * MGMT_GET_ROUTING from the leading mgmtd of s->mgmt, then MGMT_LEADER to each
 * mgmtd of the list for who leads and who follows. 0, or -errno (-EBADMSG: not a
 * routing table).
 */
static int fetch_routing(struct stk_cluster_status *s)
{
	struct stk_conn *c = NULL;
	int rc;

	rc = stk_routing_fetch_leader(&s->mgmt, &c, CLUSTER_CONNECT_TIMEOUT_MS, &s->rt);
	if (c)
		stk_conn_close(c);
	if (rc)
		return rc;
	stk_strlcpy(s->addr, stk_mgmt_addrs_cur(&s->mgmt), sizeof(s->addr));
	for (unsigned i = 0; i < s->mgmt.n; i++) {
		char leader[STK_ADDR_MAX];
		int leads = 0, etcd = 0;

		s->mgmt_state[i] = STK_CLUSTER_MGMTD_DOWN;
		if (stk_conn_connect(s->mgmt.addr[i], CLUSTER_CONNECT_TIMEOUT_MS / 2, &c))
			continue;
		if (stk_mgmt_leader_ask(c, &leads, &etcd, leader) == 0)
			s->mgmt_state[i] =
			    leads ? STK_CLUSTER_MGMTD_LEADER : STK_CLUSTER_MGMTD_FOLLOWER;
		else if (strcmp(s->mgmt.addr[i], s->addr) == 0)
			s->mgmt_state[i] = STK_CLUSTER_MGMTD_LEADER; /* a mgmtd before MGMT_LEADER */
		stk_conn_close(c);
	}
	return 0;
}

static int role_from_wire(uint8_t r)
{
	switch (r) {
	case STK_ROLE_MGMTD:
		return STK_CLUSTER_ROLE_MGMTD;
	case STK_ROLE_META:
		return STK_CLUSTER_ROLE_META;
	case STK_ROLE_STORAGE:
		return STK_CLUSTER_ROLE_STORAGE;
	default:
		return 0;
	}
}

static int node_state_from_wire(uint8_t s)
{
	switch (s) {
	case STK_NODE_ONLINE:
		return STK_CLUSTER_NODE_ONLINE;
	case STK_NODE_OFFLINE:
		return STK_CLUSTER_NODE_OFFLINE;
	default:
		return 0;
	}
}

static int target_state_from_wire(uint8_t s)
{
	switch (s) {
	case STK_TARGET_SERVING:
		return STK_CLUSTER_TARGET_SERVING;
	case STK_TARGET_OFFLINE:
		return STK_CLUSTER_TARGET_OFFLINE;
	case STK_TARGET_FULL:
		return STK_CLUSTER_TARGET_FULL;
	case STK_TARGET_SYNCING:
		return STK_CLUSTER_TARGET_SYNCING;
	case STK_TARGET_WIPING:
		return STK_CLUSTER_TARGET_WIPING;
	default:
		return 0;
	}
}

/* A namespace identity as the public structs carry it: "" for none. */
static const char *ns_text(const struct stk_ns_id *id, char *out)
{
	if (stk_ns_id_is_zero(id))
		out[0] = 0;
	else
		stk_ns_id_str(id, out);
	return out;
}

/* Builds the public view of s->rt. 0 or -ENOMEM. */
static int build(struct stk_cluster_status *s)
{
	const struct stk_routing *rt = &s->rt;
	struct stk_space sp;
	int rc;

	/* One element more than asked: calloc(0) may give NULL. */
	s->nodes = calloc(rt->nnodes + 1, sizeof(*s->nodes));
	s->targets = calloc(rt->ntargets + 1, sizeof(*s->targets));
	s->chains = calloc(rt->nchains + 1, sizeof(*s->chains));
	s->shards = calloc(rt->nshards + 1, sizeof(*s->shards));
	if (!s->nodes || !s->targets || !s->chains || !s->shards)
		return -ENOMEM;
	for (uint32_t i = 0; i < rt->nnodes; i++) {
		const struct stk_rt_node *n = &rt->nodes[i];
		struct cluster_node *o = &s->nodes[i];

		o->pub = (struct stk_cluster_node){
		    .id = n->id,
		    .role = role_from_wire(n->role),
		    .state = node_state_from_wire(n->state),
		    .addr = n->addr,
		    .last_seen_ms = n->last_seen_ms,
		    .host_id = n->host_id,
		    .refused = n->refused != 0,
		    .ns = ns_text(&n->ns, o->ns),
		    .meta_seq = n->meta_seq,
		    .meta_epoch = n->meta_epoch,
		    .shard = n->shard,
		};
	}
	for (uint32_t i = 0; i < rt->ntargets; i++) {
		const struct stk_rt_target *t = &rt->targets[i];

		s->targets[i] = (struct stk_cluster_target){
		    .id = t->id,
		    .node_id = t->node_id,
		    .state = target_state_from_wire(t->state),
		    .capacity = t->capacity,
		    .used = t->used,
		    .avail = t->avail,
		    .chunks = t->chunks,
		    .path = t->path,
		    .dev = t->dev,
		    .sync_permille = t->state == STK_TARGET_SYNCING ? t->sync_permille : 0,
		    .sync_checked = t->state == STK_TARGET_SYNCING ? t->sync_checked : 0,
		    .sync_copied = t->state == STK_TARGET_SYNCING ? t->sync_copied : 0,
		    .sync_bytes = t->state == STK_TARGET_SYNCING ? t->sync_bytes : 0,
		};
	}
	for (uint32_t i = 0; i < rt->nchains; i++) {
		const struct stk_rt_chain *c = &rt->chains[i];

		s->chains[i] = (struct stk_cluster_chain){
		    .id = c->id,
		    .version = c->version,
		    .ntargets = c->ntargets,
		    .targets = c->targets,
		};
	}
	for (uint32_t i = 0; i < rt->nshards; i++) {
		const struct stk_rt_shard *sh = &rt->shards[i];
		struct cluster_shard *o = &s->shards[i];

		o->pub = (struct stk_cluster_shard){
		    .id = sh->id,
		    .node_id = sh->node_id,
		    .ns = ns_text(&sh->ns, o->ns),
		    .replicas = sh->replicas,
		    .nfollowers = sh->nfollowers,
		    .followers = sh->followers,
		    .epoch = sh->epoch,
		};
	}
	rc = stk_host_space_sum(rt->targets, rt->ntargets, &sp);
	if (rc)
		return rc;
	s->space = (struct stk_cluster_space){
	    .capacity = sp.capacity,
	    .used = sp.used,
	    .avail = sp.avail,
	    .devices = sp.devices,
	};
	return 0;
}

/*
 * MGMT_REBALANCE from the leading mgmtd: moves in flight and each storage node's
 * share, into s (after build). A mgmtd without a rebalancer (NOSYS) leaves them
 * unknown; anything else that fails is the status's error.
 */
static int fetch_rebalance(struct stk_cluster_status *s)
{
	struct stk_msg_mgmt_rebalance_resp rp;
	struct stk_conn *c = NULL;
	struct stk_rpc rpc;
	struct stk_wbuf w;
	struct stk_rbuf r;
	uint8_t *resp = malloc(STK_MAX_PAYLOAD);
	int rc = -ENOMEM;

	if (!resp)
		return rc;
	stk_wbuf_init(&w, NULL, 0);
	stk_rpc_prepare(&rpc, STK_OP_MGMT_REBALANCE, &w, resp, STK_MAX_PAYLOAD);
	rc = stk_mgmt_call(&s->mgmt, &c, CLUSTER_CONNECT_TIMEOUT_MS, &rpc);
	if (c)
		stk_conn_close(c);
	if (rc == 0)
		rc = stk_status_to_errno(rpc.status);
	if (rc == -ENOSYS) {
		rc = 0;
		goto out;
	}
	if (rc)
		goto out;
	rc = -EBADMSG;
	stk_rbuf_init(&r, resp, rpc.resp_len);
	if (stk_msg_mgmt_rebalance_resp_dec(&r, &rp) || rp.nmoves > rpc.resp_len / 13 ||
	    rp.nnodes > rpc.resp_len / 13)
		goto out;
	s->moves = calloc(rp.nmoves + 1, sizeof(*s->moves));
	if (!s->moves) {
		rc = -ENOMEM;
		goto out;
	}
	for (uint32_t i = 0; i < rp.nmoves; i++) {
		struct stk_msg_move_rec m;

		if (stk_msg_move_rec_dec(&r, &m))
			goto out;
		s->moves[i] = (struct stk_cluster_move){.chain_id = m.chain_id,
							.from_target = m.out,
							.to_target = m.in,
							.drain = m.drain != 0};
	}
	s->nmoves = rp.nmoves;
	for (uint32_t i = 0; i < rp.nnodes; i++) {
		struct stk_msg_node_load nl;

		if (stk_msg_node_load_dec(&r, &nl))
			goto out;
		for (uint32_t k = 0; k < s->rt.nnodes; k++) {
			struct stk_cluster_node *n = &s->nodes[k].pub;

			if (n->id != nl.node_id)
				continue;
			n->draining = nl.draining != 0;
			n->members = nl.members;
			n->targets = nl.targets;
		}
	}
	if (stk_rbuf_finish(&r))
		goto out;
	s->rebalance = (struct stk_cluster_rebalance){.known = 1,
						      .max_moves = rp.max_moves,
						      .started = rp.started,
						      .finished = rp.finished,
						      .abandoned = rp.abandoned};
	rc = 0;
out:
	free(resp);
	return rc;
}

int stk_cluster_status_fetch(const char *cluster, stk_cluster_status **out)
{
	struct stk_cluster_status *s;
	int rc;

	*out = NULL;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	{
		char list[STK_CLUSTER_ADDR_MAX];

		rc = stk_cluster_resolve(cluster, list, sizeof(list));
		if (rc == 0)
			rc = stk_mgmt_addrs_parse(&s->mgmt, list);
		if (rc == 0)
			rc = stk_client_auth_find(list, NULL);
	}
	if (rc)
		goto out;
	rc = fetch_routing(s);
	if (rc == -EREMCHG)
		rc = -EAGAIN; /* no mgmtd leads just now: an election is under way */
	if (rc)
		goto out;
	rc = build(s);
	if (rc == 0)
		rc = fetch_rebalance(s);
	if (rc == -EREMCHG)
		rc = -EAGAIN;
	if (rc)
		goto out;
	*out = s;
	s = NULL;
out:
	stk_cluster_status_free(s);
	return rc;
}

void stk_cluster_status_free(stk_cluster_status *s)
{
	if (!s)
		return;
	stk_routing_free(&s->rt);
	free(s->nodes);
	free(s->targets);
	free(s->chains);
	free(s->shards);
	free(s->moves);
	free(s);
}

const char *stk_cluster_status_addr(const stk_cluster_status *s)
{
	return s->addr;
}

int stk_cluster_status_mgmtd(const stk_cluster_status *s, unsigned i, const char **addr,
			     int *state)
{
	if (i >= s->mgmt.n)
		return -ENOENT;
	*addr = s->mgmt.addr[i];
	*state = s->mgmt_state[i];
	return 0;
}

uint64_t stk_cluster_status_version(const stk_cluster_status *s)
{
	return s->rt.version;
}

const struct stk_cluster_node *stk_cluster_status_node(const stk_cluster_status *s, uint32_t i)
{
	return i < s->rt.nnodes ? &s->nodes[i].pub : NULL;
}

const struct stk_cluster_target *stk_cluster_status_target(const stk_cluster_status *s, uint32_t i)
{
	return i < s->rt.ntargets ? &s->targets[i] : NULL;
}

const struct stk_cluster_chain *stk_cluster_status_chain(const stk_cluster_status *s, uint32_t i)
{
	return i < s->rt.nchains ? &s->chains[i] : NULL;
}

const struct stk_cluster_shard *stk_cluster_status_shard(const stk_cluster_status *s, uint32_t i)
{
	return i < s->rt.nshards ? &s->shards[i].pub : NULL;
}

const struct stk_cluster_space *stk_cluster_status_space(const stk_cluster_status *s)
{
	return &s->space;
}

const struct stk_cluster_move *stk_cluster_status_move(const stk_cluster_status *s, uint32_t i)
{
	return i < s->nmoves ? &s->moves[i] : NULL;
}

const struct stk_cluster_rebalance *stk_cluster_status_rebalance(const stk_cluster_status *s)
{
	return &s->rebalance;
}

/*
 * One operator's request to the leading mgmtd of cluster: op with the request
 * encoded in w, the reply's payload into resp (cap bytes) and *r set to read it.
 * 0, the status's -errno, or as stk_connect for reaching the cluster.
 */
static int admin_call(const char *cluster, uint16_t op, struct stk_wbuf *w, uint8_t *resp,
		      size_t cap, struct stk_rbuf *r)
{
	struct stk_mgmt_addrs l;
	struct stk_conn *c = NULL;
	struct stk_rpc rpc;
	char list[STK_CLUSTER_ADDR_MAX];
	int rc = stk_cluster_resolve(cluster, list, sizeof(list));

	if (rc == 0)
		rc = stk_mgmt_addrs_parse(&l, list);
	if (rc == 0)
		rc = stk_client_auth_find(list, NULL);
	if (rc)
		return rc;
	if (w->err)
		return -EINVAL;
	stk_rpc_prepare(&rpc, op, w, resp, cap);
	rc = stk_mgmt_call(&l, &c, 2000, &rpc);
	if (c)
		stk_conn_close(c);
	if (rc == 0)
		rc = stk_status_to_errno(rpc.status);
	if (rc == 0)
		stk_rbuf_init(r, resp, rpc.resp_len);
	return rc;
}

int stk_cluster_drain_node(const char *cluster, uint32_t node_id, int drain, uint32_t *members)
{
	struct stk_msg_mgmt_drain_node_req rq = {.node_id = node_id, .drain = drain ? 1 : 0};
	struct stk_msg_mgmt_drain_node_resp rp;
	uint8_t req[16], resp[64];
	struct stk_wbuf w;
	struct stk_rbuf r;
	int rc;

	stk_wbuf_init(&w, req, sizeof(req));
	stk_msg_mgmt_drain_node_req_enc(&w, &rq);
	rc = admin_call(cluster, STK_OP_MGMT_DRAIN_NODE, &w, resp, sizeof(resp), &r);
	if (rc)
		return rc;
	if (stk_msg_mgmt_drain_node_resp_dec(&r, &rp) || stk_rbuf_finish(&r))
		return -EBADMSG;
	*members = rp.members;
	return 0;
}

int stk_cluster_remove_node(const char *cluster, uint32_t node_id, uint32_t *replaced,
			    uint32_t *kept)
{
	struct stk_msg_mgmt_remove_node_req rq = {.node_id = node_id};
	struct stk_msg_mgmt_remove_node_resp rp;
	uint8_t req[16], resp[64];
	struct stk_wbuf w;
	struct stk_rbuf r;
	int rc;

	stk_wbuf_init(&w, req, sizeof(req));
	stk_msg_mgmt_remove_node_req_enc(&w, &rq);
	rc = admin_call(cluster, STK_OP_MGMT_REMOVE_NODE, &w, resp, sizeof(resp), &r);
	if (rc)
		return rc;
	if (stk_msg_mgmt_remove_node_resp_dec(&r, &rp) || stk_rbuf_finish(&r))
		return -EBADMSG;
	*replaced = rp.replaced;
	*kept = rp.kept;
	return 0;
}

int stk_cluster_accept_loss(const char *cluster, uint32_t chain_id, uint32_t *kept,
			    uint32_t *dropped, uint32_t *added)
{
	struct stk_msg_mgmt_accept_loss_req rq = {.chain_id = chain_id};
	struct stk_msg_mgmt_accept_loss_resp rp;
	uint8_t req[16], resp[64];
	struct stk_wbuf w;
	struct stk_rbuf r;
	int rc;

	stk_wbuf_init(&w, req, sizeof(req));
	stk_msg_mgmt_accept_loss_req_enc(&w, &rq);
	rc = admin_call(cluster, STK_OP_MGMT_ACCEPT_LOSS, &w, resp, sizeof(resp), &r);
	if (rc)
		return rc;
	if (stk_msg_mgmt_accept_loss_resp_dec(&r, &rp) || stk_rbuf_finish(&r))
		return -EBADMSG;
	*kept = rp.promoted;
	*dropped = rp.dropped;
	*added = rp.added;
	return 0;
}

int stk_cluster_ping(const char *addr, unsigned timeout_ms, unsigned count, double *seconds)
{
	struct stk_conn *c = NULL;
	uint8_t resp[4096];
	int rc;

	if (!addr || !*addr || count == 0 || count > 64)
		return -EINVAL;
	rc = stk_conn_connect(addr, (int)timeout_ms, &c);
	if (rc)
		return rc;
	for (int i = -1; i < (int)count; i++) {
		struct stk_rpc rpc;
		struct stk_wbuf w;
		uint64_t t0;

		stk_wbuf_init(&w, NULL, 0);
		stk_rpc_prepare(&rpc, STK_OP_MGMT_LEADER, &w, resp, sizeof(resp));
		t0 = stk_now_ns();
		rc = stk_rpc_send(c, &rpc);
		if (rc == 0)
			rc = stk_rpc_recv(c, &rpc);
		if (rc)
			break;
		if (i >= 0)
			seconds[i] = (double)(stk_now_ns() - t0) / 1e9;
	}
	stk_conn_close(c);
	return rc;
}

/* ---- client identities ---- */

_Static_assert(STK_IDENT_READ_ONLY == STK_CLIENT_RO &&
		   STK_IDENT_SQUASH_ROOT == STK_CLIENT_SQUASH_ROOT &&
		   STK_IDENT_SQUASH_ALL == STK_CLIENT_SQUASH_ALL,
	       "client flags");
_Static_assert(STK_IDENT_NAME_MAX == STK_CLIENT_NAME_MAX &&
		   STK_IDENT_SUBTREE_MAX == STK_CLIENT_SUBTREE_MAX,
	       "client limits");

static void ident_to_auth(const struct stk_client_ident *c, struct stk_auth_client *a)
{
	memset(a, 0, sizeof(*a));
	stk_strlcpy(a->name, c->name, sizeof(a->name));
	a->gen = c->gen;
	a->flags = c->flags;
	a->anon_uid = c->anon_uid;
	a->anon_gid = c->anon_gid;
	stk_strlcpy(a->subtree, c->subtree, sizeof(a->subtree));
}

int stk_cluster_client_rm(const char *cluster, const char *name, uint64_t *gen)
{
	struct stk_msg_mgmt_client_name rq;
	struct stk_msg_mgmt_client_gen rp;
	uint8_t req[512], resp[64];
	struct stk_wbuf w;
	struct stk_rbuf r;
	int rc;

	if (!name || strlen(name) > STK_CLIENT_NAME_MAX)
		return -EINVAL;
	memset(&rq, 0, sizeof(rq));
	stk_strlcpy(rq.name, name, sizeof(rq.name));
	stk_wbuf_init(&w, req, sizeof(req));
	stk_msg_mgmt_client_name_enc(&w, &rq);
	rc = admin_call(cluster, STK_OP_MGMT_CLIENT_RM, &w, resp, sizeof(resp), &r);
	if (rc)
		return rc;
	if (stk_msg_mgmt_client_gen_dec(&r, &rp) || stk_rbuf_finish(&r))
		return -EBADMSG;
	if (gen)
		*gen = rp.gen;
	return 0;
}

int stk_cluster_client_add(const char *cluster, struct stk_client_ident *c, const char *key_out)
{
	struct stk_msg_client_rec rq;
	struct stk_msg_mgmt_client_gen rp;
	struct stk_auth_client a;
	uint8_t req[2048], resp[64], ckey[STK_AUTH_KEY_MAX], key[STK_AUTH_MAC];
	size_t clen = 0;
	char err[256];
	struct stk_wbuf w;
	struct stk_rbuf r;
	int rc;

	if (!c || !key_out || !*key_out)
		return -EINVAL;
	c->gen = 0;
	ident_to_auth(c, &a);
	if (stk_auth_client_valid(&a, err, sizeof(err))) {
		stk_error("%s", err);
		return -EINVAL;
	}
	if (access(key_out, F_OK) == 0)
		return -EEXIST;
	memset(&rq, 0, sizeof(rq));
	stk_strlcpy(rq.name, a.name, sizeof(rq.name));
	rq.flags = a.flags;
	rq.anon_uid = a.anon_uid;
	rq.anon_gid = a.anon_gid;
	stk_strlcpy(rq.subtree, a.subtree, sizeof(rq.subtree));
	stk_wbuf_init(&w, req, sizeof(req));
	stk_msg_client_rec_enc(&w, &rq);
	rc = admin_call(cluster, STK_OP_MGMT_CLIENT_ADD, &w, resp, sizeof(resp), &r);
	if (rc)
		return rc;
	if (stk_msg_mgmt_client_gen_dec(&r, &rp) || stk_rbuf_finish(&r))
		return -EBADMSG;
	a.gen = rp.gen;
	rc = stk_net_auth_cluster_key(ckey, &clen);
	if (rc == 0)
		rc = stk_auth_client_key(ckey, clen, &a, key);
	if (rc == 0)
		rc = stk_auth_client_save(key_out, &a, key);
	memset(ckey, 0, sizeof(ckey));
	memset(key, 0, sizeof(key));
	if (rc) {
		/* no key file: the identity is of no use, so it goes again */
		stk_cluster_client_rm(cluster, a.name, NULL);
		return rc;
	}
	c->gen = a.gen;
	return 0;
}

int stk_cluster_client_list(const char *cluster, struct stk_client_ident **out, uint32_t *n)
{
	struct stk_client_ident *list = NULL;
	struct stk_wbuf w;
	struct stk_rbuf r;
	uint8_t *resp;
	uint32_t k;
	int rc;

	*out = NULL;
	*n = 0;
	resp = malloc(STK_MAX_PAYLOAD);
	if (!resp)
		return -ENOMEM;
	stk_wbuf_init(&w, NULL, 0);
	rc = admin_call(cluster, STK_OP_MGMT_CLIENTS, &w, resp, STK_MAX_PAYLOAD, &r);
	if (rc)
		goto out;
	k = stk_get_u32(&r);
	rc = -EBADMSG;
	if (r.err || k > r.len / 25)
		goto out;
	rc = -ENOMEM;
	if (k && !(list = calloc(k, sizeof(*list))))
		goto out;
	rc = -EBADMSG;
	for (uint32_t i = 0; i < k; i++) {
		struct stk_msg_client_rec rec;

		if (stk_msg_client_rec_dec(&r, &rec))
			goto out;
		stk_strlcpy(list[i].name, rec.name, sizeof(list[i].name));
		list[i].gen = rec.gen;
		list[i].flags = rec.flags;
		list[i].anon_uid = rec.anon_uid;
		list[i].anon_gid = rec.anon_gid;
		stk_strlcpy(list[i].subtree, rec.subtree, sizeof(list[i].subtree));
		list[i].removed = rec.removed;
	}
	if (stk_rbuf_finish(&r))
		goto out;
	*out = list;
	*n = k;
	list = NULL;
	rc = 0;
out:
	free(list);
	free(resp);
	return rc;
}

/* ---- QoS limits (docs/qos.md) ---- */

static const char *const qos_classes[] = {"default", "training-read", "checkpoint"};

const char *stk_qos_class_name(int qos_class)
{
	return qos_class >= 0 && qos_class < 3 ? qos_classes[qos_class] : NULL;
}

int stk_qos_class_parse(const char *name)
{
	for (int i = 0; name && i < 3; i++)
		if (strcmp(name, qos_classes[i]) == 0)
			return i;
	return -EINVAL;
}

int stk_cluster_qos_set(const char *cluster, const struct stk_qos_limits *l)
{
	struct stk_msg_qos_rec rq;
	uint8_t req[512], resp[64];
	struct stk_wbuf w;
	struct stk_rbuf r;
	size_t n;

	if (!l)
		return -EINVAL;
	n = strnlen(l->tenant, sizeof(l->tenant));
	if (n == 0 || n >= sizeof(l->tenant))
		return -EINVAL;
	memset(&rq, 0, sizeof(rq));
	stk_strlcpy(rq.tenant, l->tenant, sizeof(rq.tenant));
	rq.read_bw = l->read_bw;
	rq.write_bw = l->write_bw;
	rq.iops = l->iops;
	rq.max_class = l->max_class;
	stk_wbuf_init(&w, req, sizeof(req));
	stk_msg_qos_rec_enc(&w, &rq);
	return admin_call(cluster, STK_OP_MGMT_QOS_SET, &w, resp, sizeof(resp), &r);
}

int stk_cluster_qos_rm(const char *cluster, const char *tenant)
{
	struct stk_msg_mgmt_client_name rq;
	uint8_t req[512], resp[64];
	struct stk_wbuf w;
	struct stk_rbuf r;

	if (!tenant || !*tenant || strlen(tenant) > STK_IDENT_NAME_MAX)
		return -EINVAL;
	memset(&rq, 0, sizeof(rq));
	stk_strlcpy(rq.name, tenant, sizeof(rq.name));
	stk_wbuf_init(&w, req, sizeof(req));
	stk_msg_mgmt_client_name_enc(&w, &rq);
	return admin_call(cluster, STK_OP_MGMT_QOS_RM, &w, resp, sizeof(resp), &r);
}

int stk_cluster_qos_list(const char *cluster, struct stk_qos_limits **out, uint32_t *n)
{
	struct stk_qos_limits *list = NULL;
	struct stk_wbuf w;
	struct stk_rbuf r;
	uint8_t *resp;
	uint32_t k;
	int rc;

	*out = NULL;
	*n = 0;
	resp = malloc(STK_MAX_PAYLOAD);
	if (!resp)
		return -ENOMEM;
	stk_wbuf_init(&w, NULL, 0);
	rc = admin_call(cluster, STK_OP_MGMT_QOS_LIST, &w, resp, STK_MAX_PAYLOAD, &r);
	if (rc)
		goto out;
	k = stk_get_u32(&r);
	rc = -EBADMSG;
	if (r.err || k > STK_QOS_MAX)
		goto out;
	rc = -ENOMEM;
	if (k && !(list = calloc(k, sizeof(*list))))
		goto out;
	rc = -EBADMSG;
	for (uint32_t i = 0; i < k; i++) {
		struct stk_msg_qos_rec rec;

		if (stk_msg_qos_rec_dec(&r, &rec))
			goto out;
		stk_strlcpy(list[i].tenant, rec.tenant, sizeof(list[i].tenant));
		list[i].read_bw = rec.read_bw;
		list[i].write_bw = rec.write_bw;
		list[i].iops = rec.iops;
		list[i].max_class = rec.max_class;
	}
	if (stk_rbuf_finish(&r))
		goto out;
	*out = list;
	*n = k;
	list = NULL;
	rc = 0;
out:
	free(list);
	free(resp);
	return rc;
}

int stk_client_identity(stk_client *c, struct stk_client_ident *out)
{
	struct stk_auth_client a;

	(void)c; /* a process holds one identity, whichever cluster it talks to */
	if (!stk_net_auth_client(&a))
		return 0;
	if (out) {
		memset(out, 0, sizeof(*out));
		stk_strlcpy(out->name, a.name, sizeof(out->name));
		out->gen = a.gen;
		out->flags = a.flags;
		out->anon_uid = a.anon_uid;
		out->anon_gid = a.anon_gid;
		stk_strlcpy(out->subtree, a.subtree, sizeof(out->subtree));
	}
	return 1;
}
