/*
 * The node agent: registration, heartbeats and the routing snapshot of a meta or
 * storage daemon (see agent.h).
 *
 * All talk with mgmtd goes through one connection guarded by call_lock: mgmtd is
 * asked a few things a second at most, so there is nothing to gain from more.
 * Calls go through stk_mgmt_call (net/mgmtaddr.h), which follows the leading
 * mgmtd of the list given (--mgmtd a,b,c): a transport failure moves to the next
 * address, NOT_LEADER to the leader named. While no mgmtd leads (an election),
 * the agent waits as if mgmtd were unreachable.
 *
 * The routing table is published as a reference-counted snapshot: readers take a
 * reference under `lock`, use the table without any lock, and drop it; a refresh
 * swaps in a new snapshot and the old one is freed when its last reader lets go.
 * Many request threads may ask for a refresh at once (every client with a stale
 * table sends them); fetches are numbered as they start, so a thread that finds,
 * once it gets its turn, that a fetch which started after its request has already
 * finished, skips its own.
 */
#include "agent.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "../daemon/daemon.h"
#include "../common/auth.h"
#include "../common/host.h"
#include "../common/log.h"
#include "../common/util.h"
#include "../net/mgmtaddr.h"
#include "../net/net.h"
#include "../proto/status.h"

#define AGENT_CONNECT_TIMEOUT_MS 2000
#define AGENT_RETRY_MS 200
#define AGENT_HEARTBEAT_MS 1000
#define AGENT_MAX_TARGETS 1024

struct stk_agent {
	struct stk_mgmt_addrs mgmtd; /* under call_lock */
	char addr[STK_ADDR_MAX];
	char host_id[STK_HOST_ID_MAX]; /* reported at registration and with each heartbeat */
	char zone[STK_HOST_ID_MAX]; /* reported at registration; "" for the host id */
	uint8_t role;
	uint8_t shard; /* a meta node's shard; 0 for storage */
	stk_agent_targets_fn targets;
	stk_agent_state_fn state;
	void (*meta_pos)(void *ctx, struct stk_ns_id *ns, uint64_t *epoch, uint64_t *seq);
	int (*qos)(const struct stk_msg_qos_rec *list, uint32_t n);
	void *ctx;

	pthread_mutex_t call_lock; /* protects conn, buf, resp, tinfo, tids, ntids, node_id */
	struct stk_conn *conn;
	uint8_t *buf;			   /* STK_MAX_PAYLOAD: requests are built here */
	uint8_t *resp;			   /* STK_MAX_PAYLOAD: replies land here */
	struct stk_msg_target_info *tinfo; /* AGENT_MAX_TARGETS records; NULL without targets */
	uint32_t *tids;			   /* ids mgmtd gave the targets, by report position */
	uint32_t ntids;
	uint32_t node_id;
	struct stk_ns_id ns;	   /* this node's store identity (meta), zero for storage */
	struct stk_ns_id shard_ns; /* shard 1's identity, as the last registration said */
	int refused;		   /* the last registration was refused (see agent.h) */

	pthread_mutex_t lock;	     /* protects cur, its refs, stop, fetch_started, fetch_done */
	struct stk_routing_ref *cur; /* replaced under both locks, so either one may read it */
	uint64_t fetch_started;	     /* fetches started so far (each one's number) */
	uint64_t fetch_done;	     /* number of the last fetch that succeeded */
	int stop;
	pthread_t hb_thread;
	/*
	 * Atomic: stk_now_ns() until which mgmtd surely counts this node alive (a
	 * heartbeat's sending plus mgmtd's timeout, less a margin); 0 until one is
	 * answered. See stk_agent_fenced.
	 */
	uint64_t alive_until_ns;
};

/*
 * One request/reply with mgmtd. Call with call_lock held. *answered is set when
 * mgmtd replied (whatever the status): the caller tells "mgmtd said no" from
 * "mgmtd is unreachable". Returns 0 or -errno (a transport error or the status).
 */
static int agent_call(struct stk_agent *a, uint16_t op, size_t req_len, size_t *resp_len,
		      int *answered)
{
	struct stk_rpc rpc;
	int rc;

	*answered = 0;
	memset(&rpc, 0, sizeof(rpc));
	rpc.opcode = op;
	rpc.req = a->buf;
	rpc.req_len = req_len;
	rpc.resp = a->resp;
	rpc.resp_cap = STK_MAX_PAYLOAD;
	rc = stk_mgmt_call(&a->mgmtd, &a->conn, AGENT_CONNECT_TIMEOUT_MS, &rpc);
	if (rc)
		return rc;
	*answered = 1;
	*resp_len = rpc.resp_len;
	return stk_status_to_errno(rpc.status);
}

/* Asks the daemon for its targets, filling in the ids mgmtd gave them earlier. */
static uint32_t collect_targets(struct stk_agent *a)
{
	uint32_t n;

	if (!a->targets)
		return 0;
	n = a->targets(a->ctx, a->tinfo, AGENT_MAX_TARGETS);
	if (n > AGENT_MAX_TARGETS)
		n = AGENT_MAX_TARGETS;
	for (uint32_t i = 0; i < n && i < a->ntids; i++)
		if (a->tinfo[i].target_id == 0)
			a->tinfo[i].target_id = a->tids[i];
	return n;
}

/* MGMT_REGISTER. Call with call_lock held. */
static int do_register(struct stk_agent *a, int *answered)
{
	struct stk_msg_mgmt_register_req rq;
	struct stk_msg_mgmt_register_resp rp;
	struct stk_wbuf w;
	struct stk_rbuf r;
	size_t resp_len = 0;
	uint32_t n;
	int rc;

	n = collect_targets(a);
	memset(&rq, 0, sizeof(rq));
	if (a->meta_pos) {
		struct stk_ns_id ns;
		uint64_t e, s;

		/* zero while the store is being copied: register with the last one known */
		a->meta_pos(a->ctx, &ns, &e, &s);
		if (!stk_ns_id_is_zero(&ns))
			a->ns = ns;
	}
	rq.node_id = a->node_id;
	rq.role = a->role;
	stk_strlcpy(rq.addr, a->addr, sizeof(rq.addr));
	rq.ntargets = n;
	stk_strlcpy(rq.host_id, a->host_id, sizeof(rq.host_id));
	rq.ns_hi = a->ns.hi;
	rq.ns_lo = a->ns.lo;
	stk_strlcpy(rq.zone, a->zone, sizeof(rq.zone));
	rq.shard = a->shard;
	stk_wbuf_init(&w, a->buf, STK_MAX_PAYLOAD);
	stk_msg_mgmt_register_req_enc(&w, &rq);
	for (uint32_t i = 0; i < n; i++)
		stk_msg_target_info_enc(&w, &a->tinfo[i]);
	if (w.err)
		return w.err;
	rc = agent_call(a, STK_OP_MGMT_REGISTER, w.len, &resp_len, answered);
	if (rc)
		return rc;
	stk_rbuf_init(&r, a->resp, resp_len);
	if (stk_msg_mgmt_register_resp_dec(&r, &rp) || rp.ntargets != n || rp.node_id == 0)
		return -EBADMSG;
	for (uint32_t i = 0; i < n; i++)
		a->tids[i] = stk_get_u32(&r);
	if (stk_rbuf_finish(&r))
		return -EBADMSG;
	a->ntids = n;
	if (a->node_id && a->node_id != rp.node_id)
		stk_warn("mgmtd did not know node %u: registered as node %u", a->node_id,
			 rp.node_id);
	a->node_id = rp.node_id;
	pthread_mutex_lock(&a->lock);
	a->refused = rp.refused != 0;
	a->shard_ns.hi = rp.shard_ns_hi;
	a->shard_ns.lo = rp.shard_ns_lo;
	pthread_mutex_unlock(&a->lock);
	return 0;
}

int stk_agent_refused(struct stk_agent *a, struct stk_ns_id *shard_ns)
{
	int refused;

	pthread_mutex_lock(&a->lock);
	refused = a->refused;
	if (shard_ns)
		*shard_ns = a->shard_ns;
	pthread_mutex_unlock(&a->lock);
	return refused;
}

/* Fetches the routing table newer than `known` from mgmtd. Call with call_lock held. */
static int fetch_routing(struct stk_agent *a, uint64_t known, struct stk_routing *rt, int *answered)
{
	struct stk_msg_mgmt_get_routing_req rq = {.known_version = known};
	struct stk_wbuf w;
	struct stk_rbuf r;
	size_t resp_len = 0;
	int rc;

	stk_wbuf_init(&w, a->buf, STK_MAX_PAYLOAD);
	rc = stk_msg_mgmt_get_routing_req_enc(&w, &rq);
	if (rc)
		return rc;
	rc = agent_call(a, STK_OP_MGMT_GET_ROUTING, w.len, &resp_len, answered);
	if (rc)
		return rc;
	stk_rbuf_init(&r, a->resp, resp_len);
	rc = stk_routing_decode(&r, rt);
	if (rc)
		return rc;
	if (stk_rbuf_finish(&r)) {
		stk_routing_free(rt);
		return -EBADMSG;
	}
	return 0;
}

/*
 * MGMT_CLIENTS: the removed client identities, handed to this process's server,
 * which refuses them at connection set-up. Every change of the list bumps the
 * routing version, so fetching it with each new table keeps it fresh. Call with
 * call_lock held. A mgmtd that knows no clients (NOSYS) has removed none.
 */
static int fetch_clients(struct stk_agent *a, int *answered)
{
	struct stk_auth_client *list = NULL;
	struct stk_rbuf r;
	size_t resp_len = 0;
	uint32_t n, k = 0;
	int rc;

	rc = agent_call(a, STK_OP_MGMT_CLIENTS, 0, &resp_len, answered);
	if (rc == -ENOSYS)
		return 0;
	if (rc)
		return rc;
	stk_rbuf_init(&r, a->resp, resp_len);
	n = stk_get_u32(&r);
	if (r.err || n > resp_len / 25)
		return -EBADMSG;
	if (n && !(list = calloc(n, sizeof(*list))))
		return -ENOMEM;
	for (uint32_t i = 0; i < n; i++) {
		struct stk_msg_client_rec rec;

		if (stk_msg_client_rec_dec(&r, &rec)) {
			free(list);
			return -EBADMSG;
		}
		if (!rec.removed)
			continue;
		stk_strlcpy(list[k].name, rec.name, sizeof(list[k].name));
		list[k++].gen = rec.gen;
	}
	rc = stk_rbuf_finish(&r) ? -EBADMSG : stk_net_clients_revoked_set(list, k);
	free(list);
	return rc;
}

/*
 * MGMT_QOS_LIST: the tenants' QoS limits, handed to opts->qos (a storage node's
 * buckets, storage/qos.h). Each change bumps the routing version, as the client
 * list does. Call with call_lock held. A mgmtd without QoS (NOSYS) sets none.
 */
static int fetch_qos(struct stk_agent *a, int *answered)
{
	struct stk_msg_qos_rec *list = NULL;
	struct stk_rbuf r;
	size_t resp_len = 0;
	uint32_t n;
	int rc;

	rc = agent_call(a, STK_OP_MGMT_QOS_LIST, 0, &resp_len, answered);
	if (rc == -ENOSYS)
		return 0;
	if (rc)
		return rc;
	stk_rbuf_init(&r, a->resp, resp_len);
	n = stk_get_u32(&r);
	if (r.err || n > STK_QOS_MAX)
		return -EBADMSG;
	if (n && !(list = calloc(n, sizeof(*list))))
		return -ENOMEM;
	for (uint32_t i = 0; i < n; i++) {
		if (stk_msg_qos_rec_dec(&r, &list[i])) {
			free(list);
			return -EBADMSG;
		}
	}
	rc = stk_rbuf_finish(&r) ? -EBADMSG : a->qos(list, n);
	free(list);
	return rc;
}

static void ref_drop(struct stk_agent *a, struct stk_routing_ref *ref)
{
	int last;

	if (!ref)
		return;
	pthread_mutex_lock(&a->lock);
	last = --ref->refs == 0;
	pthread_mutex_unlock(&a->lock);
	if (last) {
		stk_routing_free(&ref->rt);
		free(ref);
	}
}

/*
 * Fetches the routing table and publishes it if it is newer; with `full`, the
 * whole table whatever version we hold. Call with call_lock held. 0 or -errno.
 */
static int fetch_and_publish(struct stk_agent *a, int full, int *answered)
{
	struct stk_routing_ref *ref, *old;
	uint64_t known = 0, seq;
	int rc;

	pthread_mutex_lock(&a->lock);
	if (a->cur && !full)
		known = a->cur->rt.version;
	seq = ++a->fetch_started;
	pthread_mutex_unlock(&a->lock);
	ref = calloc(1, sizeof(*ref));
	if (!ref)
		return -ENOMEM;
	rc = fetch_routing(a, known, &ref->rt, answered);
	if (rc) {
		free(ref);
		return rc;
	}
	/* An unchanged table comes back as a bare header: keep the one we hold. */
	if (a->cur && known && ref->rt.version == known) {
		stk_routing_free(&ref->rt);
		free(ref);
		pthread_mutex_lock(&a->lock);
		a->fetch_done = seq;
		pthread_mutex_unlock(&a->lock);
		return 0;
	}
	ref->refs = 1;
	/* Published before the node serves by it (see stk_agent_state_fn). */
	if (a->state)
		a->state(a->ctx, &ref->rt, __atomic_load_n(&a->alive_until_ns, __ATOMIC_RELAXED));
	pthread_mutex_lock(&a->lock);
	old = a->cur;
	a->cur = ref;
	a->fetch_done = seq;
	pthread_mutex_unlock(&a->lock);
	rc = fetch_clients(a, answered);
	if (rc)
		stk_warn("cannot fetch the client identities from mgmtd: %s", strerror(-rc));
	if (a->qos && (rc = fetch_qos(a, answered)))
		stk_warn("cannot fetch the QoS limits from mgmtd: %s", strerror(-rc));
	rc = 0;
	stk_debug("routing version %llu: %u nodes, %u targets, %u chains",
		  (unsigned long long)ref->rt.version, ref->rt.nnodes, ref->rt.ntargets,
		  ref->rt.nchains);
	ref_drop(a, old);
	return 0;
}

static int refresh_locked(struct stk_agent *a, int *answered)
{
	return fetch_and_publish(a, 0, answered);
}

/* MGMT_HEARTBEAT; *version is mgmtd's routing version. Call with call_lock held. */
static int do_heartbeat(struct stk_agent *a, uint64_t *version, int *answered)
{
	struct stk_msg_mgmt_heartbeat_req rq;
	struct stk_msg_mgmt_heartbeat_resp rp;
	struct stk_wbuf w;
	struct stk_rbuf r;
	size_t resp_len = 0;
	uint32_t n;
	int rc;

	uint64_t sent = stk_now_ns();

	n = collect_targets(a);
	memset(&rq, 0, sizeof(rq));
	rq.node_id = a->node_id;
	rq.ntargets = n;
	stk_strlcpy(rq.host_id, a->host_id, sizeof(rq.host_id));
	if (a->meta_pos) {
		struct stk_ns_id ns;

		a->meta_pos(a->ctx, &ns, &rq.meta_epoch, &rq.meta_seq);
		rq.ns_hi = ns.hi;
		rq.ns_lo = ns.lo;
		if (!stk_ns_id_is_zero(&ns))
			a->ns = ns;
	}
	stk_wbuf_init(&w, a->buf, STK_MAX_PAYLOAD);
	stk_msg_mgmt_heartbeat_req_enc(&w, &rq);
	for (uint32_t i = 0; i < n; i++)
		stk_msg_target_info_enc(&w, &a->tinfo[i]);
	if (w.err)
		return w.err;
	rc = agent_call(a, STK_OP_MGMT_HEARTBEAT, w.len, &resp_len, answered);
	if (rc)
		return rc;
	stk_rbuf_init(&r, a->resp, resp_len);
	if (stk_msg_mgmt_heartbeat_resp_dec(&r, &rp) || stk_rbuf_finish(&r))
		return -EBADMSG;
	*version = rp.routing_version;
	/* mgmtd saw this heartbeat after `sent`: it waits timeout_ms from then at least */
	if (rp.timeout_ms)
		__atomic_store_n(&a->alive_until_ns,
				 sent + (uint64_t)rp.timeout_ms * 1000000ull * 3 / 4, __ATOMIC_RELAXED);
	if (a->state && rp.timeout_ms) {
		struct stk_routing_ref *ref;

		pthread_mutex_lock(&a->lock);
		ref = a->cur;
		if (ref)
			ref->refs++;
		pthread_mutex_unlock(&a->lock);
		if (ref)
			a->state(a->ctx, &ref->rt,
				 __atomic_load_n(&a->alive_until_ns, __ATOMIC_RELAXED));
		ref_drop(a, ref);
	}
	return 0;
}

int stk_agent_fenced(struct stk_agent *a)
{
	uint64_t until = __atomic_load_n(&a->alive_until_ns, __ATOMIC_RELAXED);

	return until && stk_now_ns() > until;
}

static int agent_stopping(struct stk_agent *a)
{
	int stop;

	pthread_mutex_lock(&a->lock);
	stop = a->stop;
	pthread_mutex_unlock(&a->lock);
	return stop || stk_daemon_stopping();
}

/* Sleeps ms in short slices so that both a daemon stop and stk_agent_stop wake it. */
static int agent_sleep(struct stk_agent *a, unsigned ms)
{
	while (ms > 0) {
		unsigned slice = ms < 100 ? ms : 100;

		if (agent_stopping(a) || stk_daemon_sleep_ms(slice))
			return 1;
		ms -= slice;
	}
	return agent_stopping(a);
}

static void heartbeat_once(struct stk_agent *a, int *reachable)
{
	uint64_t version = 0, held = 0;
	int answered = 0, rc;

	pthread_mutex_lock(&a->call_lock);
	rc = do_heartbeat(a, &version, &answered);
	if (rc == -ENOENT) {
		stk_warn("mgmtd does not know node %u: registering again", a->node_id);
		rc = do_register(a, &answered);
		if (rc == 0 && stk_agent_refused(a, NULL)) {
			/* mgmtd gave the shard to another store meanwhile: this one must stop. */
			stk_error("mgmtd refused this node on registering again: its store is "
				  "not shard %u's namespace; stopping",
				  a->shard ? a->shard : 1);
			stk_daemon_request_stop();
		}
		/* mgmtd's state was reset: its versions are not comparable with ours. */
		if (rc == 0)
			rc = fetch_and_publish(a, 1, &answered);
	} else if (rc == 0) {
		pthread_mutex_lock(&a->lock);
		held = a->cur->rt.version;
		pthread_mutex_unlock(&a->lock);
		if (version != held)
			rc = refresh_locked(a, &answered);
	}
	pthread_mutex_unlock(&a->call_lock);

	/* Report reachability changes once, not every second. */
	if (!answered && *reachable) {
		stk_warn("mgmtd at %s unreachable: %s", stk_mgmt_addrs_cur(&a->mgmtd), strerror(-rc));
		*reachable = 0;
	} else if (answered && !*reachable) {
		stk_info("mgmtd at %s reachable again", stk_mgmt_addrs_cur(&a->mgmtd));
		*reachable = 1;
	} else if (answered && rc) {
		stk_warn("heartbeat to mgmtd at %s: %s", stk_mgmt_addrs_cur(&a->mgmtd), strerror(-rc));
	}
}

static void *heartbeat_thread(void *arg)
{
	struct stk_agent *a = arg;
	int reachable = 1;

	while (!agent_sleep(a, AGENT_HEARTBEAT_MS))
		heartbeat_once(a, &reachable);
	return NULL;
}

static void agent_free(struct stk_agent *a)
{
	if (!a)
		return;
	if (a->conn)
		stk_conn_close(a->conn);
	if (a->cur) {
		stk_routing_free(&a->cur->rt);
		free(a->cur);
	}
	free(a->buf);
	free(a->resp);
	free(a->tinfo);
	free(a->tids);
	pthread_mutex_destroy(&a->call_lock);
	pthread_mutex_destroy(&a->lock);
	free(a);
}

/*
 * Runs step until mgmtd answers, retrying every AGENT_RETRY_MS while it is
 * unreachable. -EINTR if the daemon stops first.
 */
static int until_answered(struct stk_agent *a, int (*step)(struct stk_agent *, int *),
			  const char *what)
{
	int answered = 0, logged = 0, rc;

	for (;;) {
		pthread_mutex_lock(&a->call_lock);
		rc = step(a, &answered);
		pthread_mutex_unlock(&a->call_lock);
		if (answered ||
		    (rc && rc != -ECONNREFUSED && rc != -ETIMEDOUT && rc != -EHOSTUNREACH &&
		     rc != -EREMCHG &&
		     rc != -ECONNRESET && rc != -EPIPE && rc != -ENETUNREACH && rc != -ENOTCONN))
			return rc;
		if (!logged) {
			stk_info("waiting for mgmtd at %s to %s: %s", stk_mgmt_addrs_cur(&a->mgmtd), what,
				 strerror(-rc));
			logged = 1;
		}
		if (agent_sleep(a, AGENT_RETRY_MS))
			return -EINTR;
	}
}

int stk_agent_start(const struct stk_agent_opts *opts, struct stk_agent **out, uint32_t *node_id,
		    uint32_t *target_ids, uint32_t max_targets)
{
	struct stk_agent *a;
	int rc;

	if (!opts || opts->size < sizeof(*opts) || !opts->mgmtd || !opts->addr ||
	    (opts->role != STK_ROLE_META && opts->role != STK_ROLE_STORAGE))
		return -EINVAL;
	a = calloc(1, sizeof(*a));
	if (!a)
		return -ENOMEM;
	pthread_mutex_init(&a->call_lock, NULL);
	pthread_mutex_init(&a->lock, NULL);
	rc = -EINVAL;
	if (stk_mgmt_addrs_parse(&a->mgmtd, opts->mgmtd)) {
		stk_error("bad mgmtd address list '%s'", opts->mgmtd);
		goto out;
	}
	if (stk_strlcpy(a->addr, opts->addr, sizeof(a->addr)))
		goto out;
	rc = stk_host_id(opts->host_id, a->host_id, sizeof(a->host_id));
	if (rc) {
		stk_error("bad host id '%s': at most %d printable characters, no spaces",
			  opts->host_id, STK_HOST_ID_MAX - 1);
		goto out;
	}
	if (opts->zone && stk_strlcpy(a->zone, opts->zone, sizeof(a->zone))) {
		stk_error("bad zone '%s': at most %d characters", opts->zone, STK_HOST_ID_MAX - 1);
		rc = -EINVAL;
		goto out;
	}
	a->role = opts->role;
	a->targets = opts->targets;
	a->state = opts->state;
	if (opts->size >= offsetof(struct stk_agent_opts, meta_pos) + sizeof(opts->meta_pos))
		a->meta_pos = opts->meta_pos;
	if (opts->size >= offsetof(struct stk_agent_opts, qos) + sizeof(opts->qos))
		a->qos = opts->qos;
	if (opts->size >= offsetof(struct stk_agent_opts, shard) + sizeof(opts->shard))
		a->shard = (uint8_t)opts->shard;
	a->ctx = opts->ctx;
	a->node_id = opts->node_id;
	a->ns = opts->ns;
	rc = -ENOMEM;
	a->buf = malloc(STK_MAX_PAYLOAD);
	a->resp = malloc(STK_MAX_PAYLOAD);
	if (!a->buf || !a->resp)
		goto out;
	if (a->targets) {
		a->tinfo = calloc(AGENT_MAX_TARGETS, sizeof(*a->tinfo));
		a->tids = calloc(AGENT_MAX_TARGETS, sizeof(*a->tids));
		if (!a->tinfo || !a->tids)
			goto out;
	}

	rc = until_answered(a, do_register, "register");
	if (rc) {
		if (rc != -EINTR)
			stk_error("registration with mgmtd at %s failed: %s", stk_mgmt_addrs_cur(&a->mgmtd),
				  strerror(-rc));
		goto out;
	}
	rc = until_answered(a, refresh_locked, "send the routing table");
	if (rc) {
		if (rc != -EINTR)
			stk_error("cannot fetch the routing table from %s: %s", stk_mgmt_addrs_cur(&a->mgmtd),
				  strerror(-rc));
		goto out;
	}
	rc = -pthread_create(&a->hb_thread, NULL, heartbeat_thread, a);
	if (rc)
		goto out;
	stk_info("registered with mgmtd at %s as node %u (routing version %llu)", stk_mgmt_addrs_cur(&a->mgmtd),
		 a->node_id, (unsigned long long)a->cur->rt.version);
	*node_id = a->node_id;
	if (target_ids)
		for (uint32_t i = 0; i < max_targets; i++)
			target_ids[i] = i < a->ntids ? a->tids[i] : 0;
	*out = a;
	return 0;
out:
	agent_free(a);
	return rc;
}

void stk_agent_stop(struct stk_agent *a)
{
	if (!a)
		return;
	pthread_mutex_lock(&a->lock);
	a->stop = 1;
	pthread_mutex_unlock(&a->lock);
	pthread_join(a->hb_thread, NULL);
	/* Readers must have dropped their references before the daemon stops the agent. */
	pthread_mutex_lock(&a->lock);
	if (a->cur && a->cur->refs > 1)
		stk_warn("agent stopped with %d routing references still held", a->cur->refs - 1);
	pthread_mutex_unlock(&a->lock);
	agent_free(a);
}

struct stk_routing_ref *stk_agent_routing_get(struct stk_agent *a)
{
	struct stk_routing_ref *r;

	pthread_mutex_lock(&a->lock);
	r = a->cur;
	r->refs++;
	pthread_mutex_unlock(&a->lock);
	return r;
}

void stk_agent_routing_put(struct stk_agent *a, struct stk_routing_ref *r)
{
	ref_drop(a, r);
}

int stk_agent_routing_refresh(struct stk_agent *a)
{
	uint64_t started;
	int answered = 0, rc = 0;

	pthread_mutex_lock(&a->lock);
	started = a->fetch_started;
	pthread_mutex_unlock(&a->lock);
	pthread_mutex_lock(&a->call_lock);
	/* A fetch that began after this call did finish while it waited: new enough. */
	pthread_mutex_lock(&a->lock);
	if (a->fetch_done > started) {
		pthread_mutex_unlock(&a->lock);
		goto out;
	}
	pthread_mutex_unlock(&a->lock);
	rc = refresh_locked(a, &answered);
out:
	pthread_mutex_unlock(&a->call_lock);
	return rc;
}

int stk_agent_target_synced(struct stk_agent *a, uint32_t target_id, uint32_t chain_id,
			    uint32_t chain_ver)
{
	struct stk_msg_mgmt_target_synced_req rq;
	struct stk_wbuf w;
	size_t len = 0;
	int answered = 0, rc;

	pthread_mutex_lock(&a->call_lock);
	rq.node_id = a->node_id;
	rq.target_id = target_id;
	rq.chain_id = chain_id;
	rq.chain_ver = chain_ver;
	stk_wbuf_init(&w, a->buf, STK_MAX_PAYLOAD);
	stk_msg_mgmt_target_synced_req_enc(&w, &rq);
	rc = agent_call(a, STK_OP_MGMT_TARGET_SYNCED, w.len, &len, &answered);
	if (rc == 0)
		rc = refresh_locked(a, &answered); /* the change is ours to see at once */
	pthread_mutex_unlock(&a->call_lock);
	return rc;
}

int stk_agent_target_wiped(struct stk_agent *a, uint32_t target_id, uint64_t chunks,
			   uint64_t bytes)
{
	struct stk_msg_mgmt_target_wiped_req rq;
	struct stk_wbuf w;
	size_t len = 0;
	int answered = 0, rc;

	pthread_mutex_lock(&a->call_lock);
	rq.node_id = a->node_id;
	rq.target_id = target_id;
	rq.chunks = chunks;
	rq.bytes = bytes;
	stk_wbuf_init(&w, a->buf, STK_MAX_PAYLOAD);
	stk_msg_mgmt_target_wiped_req_enc(&w, &rq);
	rc = agent_call(a, STK_OP_MGMT_TARGET_WIPED, w.len, &len, &answered);
	if (rc == 0)
		rc = refresh_locked(a, &answered);
	pthread_mutex_unlock(&a->call_lock);
	return rc;
}

int stk_mgmt_fetch_routing(const char *mgmtd, struct stk_routing *rt)
{
	struct stk_mgmt_addrs l;
	struct stk_conn *c = NULL;
	int rc = stk_mgmt_addrs_parse(&l, mgmtd);

	memset(rt, 0, sizeof(*rt));
	if (rc)
		return rc;
	rc = stk_routing_fetch_leader(&l, &c, AGENT_CONNECT_TIMEOUT_MS, rt);
	if (c)
		stk_conn_close(c);
	return rc;
}
