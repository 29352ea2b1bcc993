/*
 * Replication of the metadata shard (repl.h says what; docs/meta-replication.md
 * says why). This file has four parts:
 *
 *   1. the ring: the last REPL_RING_BYTES of changes this node committed as a
 *      leader or applied as a follower, each with its epoch and number, from
 *      which a follower that was away is sent what it misses; `base` is the
 *      change just before the first one kept (what a store at that position
 *      holds);
 *   2. the followers' senders, one thread each: probe what the follower holds,
 *      send it a copy of the store if its history is not a prefix of ours, then
 *      batches of everything new, and record what it acknowledged;
 *   3. the manager: the role the routing table gives, applied to the store and
 *      the senders;
 *   4. the follower's side of META_REPL.
 *
 * Locks: r->mu guards everything in struct repl but the store (which has its
 * own) and is never held across a network call or a store call that waits for
 * LMDB's writer (stk_meta_store_repl_set), with one exception: the redo hook
 * runs under the store's replication lock and takes r->mu, so nothing holding
 * r->mu may call into the store's writing side.
 */
#include "repl.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../common/log.h"
#include "../common/metrics.h"
#include "../common/util.h"
#include "../mgmtd/agent.h"
#include "../proto/status.h"
#include "../proto/wire.h"

#define REPL_RING_BYTES (64u << 20)
#define REPL_BATCH_BYTES (8u << 20) /* a LOG request's log, at most (one entry may be more) */
#define REPL_SNAP_PART (4u << 20)   /* a SNAP request's part */
#define REPL_CONNECT_MS 1000
#define REPL_RETRY_MS 100
#define REPL_TICK_MS 200
#define REPL_OWE_BYTES (64u << 10) /* replies go after a request of this much, before larger */
#define REPL_CLOSE_MS 2000	   /* at a stop, the longest the replies wait for the followers */
#define REPL_LEARNERS 2		   /* spares a leader keeps copies on at once */
#define REPL_LEARN_BPS (64ull << 20) /* a learner's copy, bytes a second at most */

struct entry {
	uint64_t epoch, seq;
	uint32_t len;
	uint8_t data[];
};

struct peer {
	struct repl *r;
	uint32_t node_id;
	char addr[STK_ADDR_MAX];
	pthread_t th;
	int stop;	 /* under r->mu */
	uint64_t acked;	 /* under r->mu: the last change it holds, once in step with us */
	int in_step;	 /* under r->mu: acked is meaningful */
	uint64_t synced; /* under r->mu: the last of r->sync_want its store flushed for */
	int learner;	 /* under r->mu: a spare kept in step, which no reply waits for */
	stk_metric_t lag_series;
};

/* A reply that waits for the followers (stk_meta_repl_wait_async). */
struct waiter {
	struct waiter *next;
	uint64_t seq;
	void (*done)(void *arg, int rc);
	void *arg;
};

struct repl {
	struct stk_meta_store *st;
	struct stk_agent *agent;
	uint32_t self;
	void (*promoted)(void *ctx, int failover);
	void *promoted_ctx;
	int metrics;

	pthread_mutex_t mu;
	/* signalled, with mu held: data_cond, new changes (senders wait); ack_cond, a
	 * follower's acknowledgement or a role change (requests wait); mgr_cond, a new
	 * routing table (the manager waits); each also on stop */
	pthread_cond_t data_cond, ack_cond, mgr_cond;
	/* the ring */
	struct entry **ring;
	size_t ring_cap, ring_head, ring_n, ring_bytes;
	uint64_t base_epoch, base_seq;
	/* the role in force */
	int role;
	uint64_t epoch;	       /* the shard epoch of the role in force */
	uint64_t known_epoch;  /* the newest shard epoch heard of (routing, or a leader) */
	uint32_t known_leader; /* the leader the routing table names for known_epoch, 0 unknown */
	uint8_t replicas;
	uint64_t sync_want; /* flushes asked for (stk_meta_repl_sync), numbered */
	/* replies that wait for the followers, and whether more may (0 once closed) */
	struct waiter *waiters;
	int async_open;
	struct peer *peers[STK_MAX_REPLICAS + REPL_LEARNERS]; /* a sender per follower and learner */
	unsigned npeers;
	/* what the routing table wants (set by the agent's hook, applied by the manager) */
	int want_set;
	uint64_t want_epoch;
	int want_role;
	uint8_t want_replicas;
	uint32_t want_followers[STK_MAX_REPLICAS];
	char want_addrs[STK_MAX_REPLICAS][STK_ADDR_MAX];
	uint8_t want_nfollowers;
	uint32_t want_learners[REPL_LEARNERS];
	char want_laddrs[REPL_LEARNERS][STK_ADDR_MAX];
	uint8_t want_nlearners;
	int stop;
	pthread_t manager;
	int manager_started;
	pthread_mutex_t apply_mu; /* one META_REPL applied at a time */
	stk_metric_t role_series, seq_series, snap_series;
};

/* Condition variables here wait on the monotonic clock. */
static void cond_init(pthread_cond_t *c)
{
	pthread_condattr_t ca;

	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(c, &ca);
	pthread_condattr_destroy(&ca);
}

static void deadline_ms(struct timespec *ts, unsigned ms)
{
	clock_gettime(CLOCK_MONOTONIC, ts);
	ts->tv_sec += ms / 1000;
	ts->tv_nsec += (long)(ms % 1000) * 1000000L;
	if (ts->tv_nsec >= 1000000000L) {
		ts->tv_sec++;
		ts->tv_nsec -= 1000000000L;
	}
}

/* ---- 1. the ring ---- */

static struct entry *ring_at(struct repl *r, size_t i)
{
	return r->ring[(r->ring_head + i) % r->ring_cap];
}

static uint64_t ring_last_seq(struct repl *r)
{
	return r->ring_n ? ring_at(r, r->ring_n - 1)->seq : r->base_seq;
}

static void ring_reset(struct repl *r, uint64_t epoch, uint64_t seq)
{
	for (size_t i = 0; i < r->ring_n; i++)
		free(ring_at(r, i));
	r->ring_n = 0;
	r->ring_head = 0;
	r->ring_bytes = 0;
	r->base_epoch = epoch;
	r->base_seq = seq;
}

/* Appends a change (with r->mu held); drops the oldest past REPL_RING_BYTES. */
static void ring_add(struct repl *r, uint64_t epoch, uint64_t seq, const uint8_t *ops, size_t len)
{
	struct entry *e;

	if (seq != ring_last_seq(r) + 1) {
		ring_reset(r, epoch, seq); /* not a follow-on (a copy came between): start anew */
		return;
	}
	if (r->ring_n == r->ring_cap) {
		size_t cap = r->ring_cap ? r->ring_cap * 2 : 1024;
		struct entry **n = malloc(cap * sizeof(*n));

		if (!n) {
			ring_reset(r, epoch, seq);
			return;
		}
		for (size_t i = 0; i < r->ring_n; i++)
			n[i] = ring_at(r, i);
		free(r->ring);
		r->ring = n;
		r->ring_cap = cap;
		r->ring_head = 0;
	}
	e = malloc(sizeof(*e) + len);
	if (!e) {
		ring_reset(r, epoch, seq); /* those that need it get a copy of the store */
		return;
	}
	e->epoch = epoch;
	e->seq = seq;
	e->len = (uint32_t)len;
	memcpy(e->data, ops, len);
	r->ring[(r->ring_head + r->ring_n) % r->ring_cap] = e;
	r->ring_n++;
	r->ring_bytes += len + sizeof(*e);
	while (r->ring_bytes > REPL_RING_BYTES && r->ring_n > 1) {
		struct entry *old = ring_at(r, 0);

		r->base_epoch = old->epoch;
		r->base_seq = old->seq;
		r->ring_bytes -= old->len + sizeof(*old);
		r->ring_head = (r->ring_head + 1) % r->ring_cap;
		r->ring_n--;
		free(old);
	}
	pthread_cond_broadcast(&r->data_cond);
}

/* Whether a store at (epoch, seq) holds a prefix of our history that the ring continues. */
static int ring_continues(struct repl *r, uint64_t epoch, uint64_t seq)
{
	if (seq == 0)
		return 0; /* an empty or half-copied store: it needs a copy */
	if (seq == r->base_seq)
		return epoch == r->base_epoch;
	if (seq < r->base_seq || seq > ring_last_seq(r))
		return 0;
	return ring_at(r, (size_t)(seq - r->base_seq - 1))->epoch == epoch;
}

/* The store's redo hook (a leader's commit), under the store's replication lock. */
static void on_commit(void *ctx, uint64_t epoch, uint64_t seq, const uint8_t *ops, size_t len)
{
	struct repl *r = ctx;

	pthread_mutex_lock(&r->mu);
	ring_add(r, epoch, seq, ops, len);
	pthread_mutex_unlock(&r->mu);
}

/* ---- 2. the followers' senders ---- */

struct call {
	struct stk_msg_meta_repl_req q;
	const void *data;
	size_t len;
	struct stk_msg_meta_repl_resp p;
};

struct waiter;
static void waiters_done(struct waiter *w, int rc);

/*
 * One META_REPL. 0, a transport error, or the follower's status as -errno. *owed:
 * replies that may go now (NULL: none), sent once the request is on its way and
 * before its reply is waited for, so that they do not delay the request.
 */
static int repl_call_owing(struct stk_conn *conn, struct call *c, struct waiter **owed, int owed_rc)
{
	uint8_t req[128], resp[128];
	struct stk_wbuf w;
	struct stk_rbuf rb;
	struct stk_rpc rpc;
	int rc;

	c->q.len = (uint32_t)c->len;
	stk_wbuf_init(&w, req, sizeof(req));
	rc = stk_msg_meta_repl_req_enc(&w, &c->q);
	if (rc)
		return rc;
	stk_rpc_prepare(&rpc, STK_OP_META_REPL, &w, resp, sizeof(resp));
	rpc.bulk_out = c->data;
	rpc.bulk_out_len = c->len;
	if (owed && c->len > REPL_OWE_BYTES) { /* its sending may wait for the follower */
		waiters_done(*owed, owed_rc);
		*owed = NULL;
	}
	rc = stk_rpc_send(conn, &rpc);
	if (owed) {
		waiters_done(*owed, owed_rc);
		*owed = NULL;
	}
	if (rc == 0)
		rc = stk_rpc_recv(conn, &rpc);
	if (rc == 0)
		rc = stk_status_to_errno(rpc.status);
	if (rc)
		return rc;
	stk_rbuf_init(&rb, resp, rpc.resp_len);
	if (stk_msg_meta_repl_resp_dec(&rb, &c->p) || stk_rbuf_finish(&rb))
		return -EBADMSG;
	return 0;
}

static int repl_call(struct stk_conn *conn, struct call *c)
{
	return repl_call_owing(conn, c, NULL, 0);
}

static int peer_stopped(struct peer *p)
{
	struct repl *r = p->r;
	int stop;

	pthread_mutex_lock(&r->mu);
	stop = p->stop;
	pthread_mutex_unlock(&r->mu);
	return stop;
}

/* With r->mu held: the last change every follower holds (all of them without followers). */
static uint64_t held_by_all(struct repl *r)
{
	uint64_t all = UINT64_MAX;

	for (unsigned i = 0; i < r->npeers; i++)
		if (!r->peers[i]->learner)
			all = STK_MIN(all, r->peers[i]->in_step ? r->peers[i]->acked : 0);
	return all;
}

/*
 * With r->mu held: takes the waiters whose change every follower holds (all of
 * them, with rc -EREMCHG, when this node leads no more or is cut off from mgmtd),
 * for waiters_done once r->mu is released.
 */
static struct waiter *waiters_take(struct repl *r, int *rc)
{
	struct waiter *done = NULL, **wp = &r->waiters;
	uint64_t all;

	*rc = 0;
	if (!r->waiters)
		return NULL;
	if (r->role == STK_META_ROLE_OFF) {
		all = UINT64_MAX;
	} else if (r->role != STK_META_ROLE_LEADER || r->stop ||
		   (r->agent && stk_agent_fenced(r->agent))) {
		*rc = -EREMCHG;
		all = UINT64_MAX;
	} else {
		all = held_by_all(r);
	}
	while (*wp) {
		struct waiter *w = *wp;

		if (w->seq > all) {
			wp = &w->next;
			continue;
		}
		*wp = w->next;
		w->next = done;
		done = w;
	}
	return done;
}

/* Calls back what waiters_take took (r->mu not held). */
static void waiters_done(struct waiter *w, int rc)
{
	while (w) {
		struct waiter *next = w->next;

		w->done(w->arg, rc);
		free(w);
		w = next;
	}
}

/* r->mu not held: calls back the waiters that may be answered now. */
static void waiters_settle(struct repl *r)
{
	struct waiter *w;
	int rc;

	pthread_mutex_lock(&r->mu);
	w = waiters_take(r, &rc);
	pthread_mutex_unlock(&r->mu);
	waiters_done(w, rc);
}

/*
 * The follower holds change seq: the replies whose change every follower holds
 * now are owed, for this sender to send (*owed, *owed_rc: see waiters_take).
 */
static void peer_acked_owing(struct peer *p, uint64_t seq, struct waiter **owed, int *owed_rc)
{
	struct repl *r = p->r;

	pthread_mutex_lock(&r->mu);
	p->acked = seq;
	p->in_step = 1;
	pthread_cond_broadcast(&r->ack_cond);
	*owed = waiters_take(r, owed_rc);
	pthread_mutex_unlock(&r->mu);
}

static void peer_acked(struct peer *p, uint64_t seq)
{
	struct waiter *w;
	int rc;

	peer_acked_owing(p, seq, &w, &rc);
	waiters_done(w, rc);
}

/* A copy's pace: bytes sent since it began. */
struct pace {
	uint64_t start_ns, sent;
};

/*
 * Before a part of len bytes of a copy to a learner: waits so that the copy goes at
 * REPL_LEARN_BPS at most (a spare's copy takes the leader's disk and network, and
 * nothing waits for it). A follower's copy goes at once: the replies wait for it.
 */
static void learn_pace(struct peer *p, struct pace *pc, size_t len)
{
	uint64_t now = stk_now_ns(), due;
	int learner;

	pthread_mutex_lock(&p->r->mu);
	learner = p->learner;
	pthread_mutex_unlock(&p->r->mu);
	if (!pc->start_ns)
		pc->start_ns = now;
	due = pc->start_ns + pc->sent * 1000000000ull / REPL_LEARN_BPS;
	pc->sent += len;
	/* in slices, so that a sender told to stop (a role change) is not held up */
	for (; learner && due > now && !peer_stopped(p); now = stk_now_ns())
		usleep((useconds_t)STK_MIN((due - now) / 1000, 50000ull));
}

/* Sends the follower a copy of the store, then where the log goes on. 0 or -errno. */
static int send_copy(struct peer *p, struct stk_conn *conn, uint64_t epoch, uint64_t *next)
{
	struct repl *r = p->r;
	struct stk_meta_snap *snap = NULL;
	uint64_t pe, ps;
	struct call c;
	struct pace pace = {0};
	uint8_t *buf;
	size_t len;
	int done = 0, first = 1, learner, rc;

	buf = malloc(REPL_SNAP_PART);
	if (!buf)
		return -ENOMEM;
	/* The position first: the copy is at least as new, and the log from there makes it exact.
	 */
	stk_meta_store_repl_pos(r->st, &pe, &ps);
	pthread_mutex_lock(&r->mu);
	learner = p->learner;
	pthread_mutex_unlock(&r->mu);
	stk_info("replication: copying the store to meta node %u (%s) as of change %" PRIu64 "%s",
		 p->node_id, p->addr, ps,
		 learner ? ", a spare that learns the shard (at most 64 MiB/s; no reply waits)"
			 : "");
	rc = stk_meta_store_snap_begin(r->st, &snap);
	while (rc == 0 && !done && !peer_stopped(p)) {
		rc = stk_meta_store_snap_next(snap, buf, REPL_SNAP_PART, &len, &done);
		if (rc)
			break;
		learn_pace(p, &pace, len);
		memset(&c, 0, sizeof(c));
		c.q.epoch = epoch;
		c.q.leader = r->self;
		c.q.kind = STK_REPL_SNAP;
		c.q.first = (uint8_t)first;
		c.data = buf;
		c.len = len;
		rc = repl_call(conn, &c);
		first = 0;
	}
	if (rc == 0 && !done)
		rc = -ECANCELED;
	if (rc == 0) {
		memset(&c, 0, sizeof(c));
		c.q.epoch = epoch;
		c.q.leader = r->self;
		c.q.kind = STK_REPL_SNAP_DONE;
		c.q.snap_epoch = pe;
		c.q.snap_seq = ps;
		rc = repl_call(conn, &c);
	}
	stk_meta_store_snap_end(snap);
	free(buf);
	if (rc) {
		stk_warn("replication: copy to meta node %u (%s) failed: %s", p->node_id, p->addr,
			 strerror(-rc));
		return rc;
	}
	stk_metric_add(r->snap_series, 1);
	*next = ps + 1;
	stk_info("replication: meta node %u (%s) has the copy; the log follows from change "
		 "%" PRIu64,
		 p->node_id, p->addr, ps + 1);
	return 0;
}

/* With r->mu held: the log from `next` (at most REPL_BATCH_BYTES but one entry) into *buf. */
static int log_gather(struct repl *r, uint64_t next, uint8_t **buf, size_t *cap, size_t *len,
		      uint64_t *last)
{
	size_t i = (size_t)(next - r->base_seq - 1), n = 0;
	struct stk_wbuf w;

	*len = 0;
	for (; i < r->ring_n; i++) {
		struct entry *e = ring_at(r, i);
		size_t need = 20 + e->len;

		if (n && n + need > REPL_BATCH_BYTES)
			break;
		if (n + need > *cap) {
			size_t nc = STK_MAX(n + need, *cap * 2);
			uint8_t *nb = realloc(*buf, nc);

			if (!nb)
				return -ENOMEM;
			*buf = nb;
			*cap = nc;
		}
		stk_wbuf_init(&w, *buf + n, need);
		stk_put_u64(&w, e->epoch);
		stk_put_u64(&w, e->seq);
		stk_put_u32(&w, e->len);
		stk_put_bytes(&w, e->data, e->len);
		n += need;
		*last = e->seq;
	}
	*len = n;
	return 0;
}

static void *peer_main(void *arg)
{
	struct peer *p = arg;
	struct repl *r = p->r;
	struct stk_conn *conn = NULL;
	uint8_t *buf = NULL;
	size_t cap = 0, len;
	uint64_t next = 0, last = 0, epoch, want;
	int probe = 1, rc, owed_rc = 0;
	struct waiter *owed = NULL; /* replies this sender sends with its next request */
	struct call c;

	for (;;) {
		pthread_mutex_lock(&r->mu);
		epoch = r->epoch;
		if (p->stop) {
			pthread_mutex_unlock(&r->mu);
			break;
		}
		pthread_mutex_unlock(&r->mu);
		if (!conn) {
			rc = stk_conn_connect(p->addr, REPL_CONNECT_MS, &conn);
			if (rc) {
				conn = NULL;
				usleep(REPL_RETRY_MS * 1000);
				continue;
			}
			probe = 1;
		}
		if (probe) {
			struct stk_ns_id mine, theirs;
			int cont;

			memset(&c, 0, sizeof(c));
			c.q.epoch = epoch;
			c.q.leader = r->self;
			c.q.kind = STK_REPL_PROBE;
			rc = repl_call(conn, &c);
			if (rc)
				goto failed;
			stk_meta_store_ns_id(r->st, &mine);
			theirs.hi = c.p.ns_hi;
			theirs.lo = c.p.ns_lo;
			pthread_mutex_lock(&r->mu);
			cont = stk_ns_id_eq(&mine, &theirs) &&
			       ring_continues(r, c.p.pos_epoch, c.p.pos_seq);
			pthread_mutex_unlock(&r->mu);
			if (cont) {
				next = c.p.pos_seq + 1;
			} else {
				rc = send_copy(p, conn, epoch, &next);
				if (rc)
					goto failed;
			}
			peer_acked(p, next - 1);
			probe = 0;
		}
		pthread_mutex_lock(&r->mu);
		if (owed && ring_last_seq(r) < next && p->synced >= r->sync_want) {
			/* nothing to send: the replies go now */
			pthread_mutex_unlock(&r->mu);
			waiters_done(owed, owed_rc);
			owed = NULL;
			pthread_mutex_lock(&r->mu);
		}
		while (!p->stop && ring_last_seq(r) < next && p->synced >= r->sync_want &&
		       r->epoch == epoch) {
			struct timespec ts;

			deadline_ms(&ts, REPL_TICK_MS);
			pthread_cond_timedwait(&r->data_cond, &r->mu, &ts);
		}
		if (p->stop || r->epoch != epoch || next <= r->base_seq) {
			if (next <= r->base_seq)
				probe = 1; /* what it misses left the ring: a copy */
			pthread_mutex_unlock(&r->mu);
			waiters_done(owed, owed_rc);
			owed = NULL;
			continue;
		}
		last = next - 1;
		want = r->sync_want;
		rc = log_gather(r, next, &buf, &cap, &len, &last);
		pthread_mutex_unlock(&r->mu);
		if (rc)
			goto failed;
		memset(&c, 0, sizeof(c));
		c.q.epoch = epoch;
		c.q.leader = r->self;
		c.q.kind = STK_REPL_LOG;
		c.q.first = want > p->synced; /* LOG's flag: flush before answering */
		c.data = buf;
		c.len = len;
		rc = repl_call_owing(conn, &c, &owed, owed_rc);
		if (rc)
			goto failed;
		if (c.p.pos_seq >= last) {
			/* the replies it completes go with the next request (or before a wait) */
			peer_acked_owing(p, c.p.pos_seq, &owed, &owed_rc);
			next = c.p.pos_seq + 1;
			if (c.q.first) {
				pthread_mutex_lock(&r->mu);
				p->synced = want;
				pthread_cond_broadcast(&r->ack_cond);
				pthread_mutex_unlock(&r->mu);
			}
		} else {
			probe = 1; /* it holds something else than we thought */
		}
		continue;
	failed:
		waiters_done(owed, owed_rc);
		owed = NULL;
		if (rc == -ESTALE) {
			/* it knows a newer epoch: we may lead no more; the routing table says */
			stk_warn("replication: meta node %u (%s) knows a newer epoch than %" PRIu64
				 ": asking mgmtd",
				 p->node_id, p->addr, epoch);
			if (r->agent)
				stk_agent_routing_refresh(r->agent);
		} else if (rc != -ECONNREFUSED && rc != -EAGAIN) {
			stk_debug("replication: meta node %u (%s): %s", p->node_id, p->addr,
				  strerror(-rc));
		}
		if (conn && (stk_conn_broken(conn) || (rc != -ESTALE && rc != -EAGAIN))) {
			stk_conn_close(conn);
			conn = NULL;
		}
		probe = 1;
		usleep(REPL_RETRY_MS * 1000);
	}
	waiters_done(owed, owed_rc);
	if (conn)
		stk_conn_close(conn);
	free(buf);
	return NULL;
}

static struct peer *peer_start(struct repl *r, uint32_t node_id, const char *addr, int learner)
{
	struct peer *p = calloc(1, sizeof(*p));
	char label[16];
	const char *values[1] = {label};

	if (!p)
		return NULL;
	p->r = r;
	p->node_id = node_id;
	p->learner = learner;
	stk_strlcpy(p->addr, addr, sizeof(p->addr));
	if (r->metrics) {
		snprintf(label, sizeof(label), "%u", node_id);
		stk_metric_series(STK_M_META_REPL_LAG, values, &p->lag_series);
	}
	if (pthread_create(&p->th, NULL, peer_main, p)) {
		free(p);
		return NULL;
	}
	return p;
}

/* Stops and frees the peers (r->mu not held). */
static void peers_stop(struct repl *r, struct peer **ps, unsigned n)
{
	pthread_mutex_lock(&r->mu);
	for (unsigned i = 0; i < n; i++)
		ps[i]->stop = 1;
	pthread_cond_broadcast(&r->data_cond);
	pthread_mutex_unlock(&r->mu);
	for (unsigned i = 0; i < n; i++) {
		pthread_join(ps[i]->th, NULL);
		stk_metric_hide(ps[i]->lag_series, 1);
		free(ps[i]);
	}
}

/* ---- 3. the manager ---- */

static int role_of(const struct stk_routing *rt, uint32_t self, unsigned shard, uint64_t *epoch,
		   uint8_t *replicas, const struct stk_rt_shard **out)
{
	for (uint32_t i = 0; i < rt->nshards; i++) {
		const struct stk_rt_shard *sh = &rt->shards[i];

		if (sh->id != shard) /* this node's shard alone (docs/meta-shards.md) */
			continue;
		*out = sh;
		*epoch = sh->epoch;
		*replicas = sh->replicas;
		if (sh->replicas <= 1)
			return STK_META_ROLE_OFF;
		if (sh->node_id == self)
			return STK_META_ROLE_LEADER;
		for (uint8_t j = 0; j < sh->nfollowers; j++)
			if (sh->followers[j] == self)
				return STK_META_ROLE_FOLLOWER;
		return STK_META_ROLE_NONE;
	}
	*out = NULL;
	*epoch = 0;
	*replicas = 0;
	return STK_META_ROLE_OFF; /* no shard yet (a new cluster): as before replication */
}

/*
 * With r->mu held, leading shard sh: the spares to keep in step (learners), at most
 * REPL_LEARNERS: the online meta nodes of the shard that neither lead nor follow it
 * and that mgmtd did not refuse: those mgmtd would make followers (and copy to).
 * When mgmtd later makes one a follower (a drain, a lost follower replaced), it
 * holds the shard already and joins with the log alone: no reply waits for a copy.
 */
static void learners_of(struct repl *r, const struct stk_routing *rt,
			const struct stk_rt_shard *sh)
{
	for (uint32_t i = 0; i < rt->nnodes && r->want_nlearners < REPL_LEARNERS; i++) {
		const struct stk_rt_node *n = &rt->nodes[i];
		int follows = 0;

		for (uint8_t j = 0; j < sh->nfollowers; j++)
			follows |= sh->followers[j] == n->id;
		if (n->role != STK_ROLE_META || n->state != STK_NODE_ONLINE || n->refused ||
		    n->id == r->self || follows || !n->addr[0] ||
		    (n->shard ? n->shard : 1) != stk_meta_store_shard(r->st))
			continue;
		r->want_learners[r->want_nlearners] = n->id;
		stk_strlcpy(r->want_laddrs[r->want_nlearners], n->addr, STK_ADDR_MAX);
		r->want_nlearners++;
	}
}

void stk_meta_repl_routing(void *ctx, const struct stk_routing *rt, uint64_t alive_until_ns)
{
	struct repl *r = ctx;
	const struct stk_rt_shard *sh;
	uint64_t epoch;
	uint8_t replicas;
	int role;

	(void)alive_until_ns;
	pthread_mutex_lock(&r->mu);
	if (!r->self || r->stop) {
		pthread_mutex_unlock(&r->mu);
		return;
	}
	role = role_of(rt, r->self, stk_meta_store_shard(r->st), &epoch, &replicas, &sh);
	r->want_set = 1;
	r->want_role = role;
	r->want_epoch = epoch;
	r->want_replicas = replicas;
	r->want_nfollowers = 0;
	r->want_nlearners = 0;
	if (epoch > r->known_epoch || (epoch == r->known_epoch && !r->known_leader)) {
		r->known_epoch = epoch;
		r->known_leader = sh ? sh->node_id : 0;
	}
	if (role == STK_META_ROLE_LEADER) {
		for (uint8_t j = 0; j < sh->nfollowers && j < STK_MAX_REPLICAS; j++) {
			const struct stk_rt_node *n = stk_routing_node(rt, sh->followers[j]);

			r->want_followers[r->want_nfollowers] = sh->followers[j];
			stk_strlcpy(r->want_addrs[r->want_nfollowers], n ? n->addr : "",
				    STK_ADDR_MAX);
			r->want_nfollowers++;
		}
		learners_of(r, rt, sh);
	}
	pthread_cond_broadcast(&r->mgr_cond);
	pthread_mutex_unlock(&r->mu);
}

static const char *role_name(int role)
{
	static const char *names[] = {"off", "leader", "follower", "none"};

	return role >= 0 && role < 4 ? names[role] : "?";
}

/*
 * Applies what the routing table wants. Called by the manager only (and by
 * start, before the manager runs): the only writer of role, epoch and peers.
 */
/* Whether node id at addr is among the n of ids/addrs. */
static int listed(uint32_t id, const char *addr, const uint32_t *ids,
		  const char (*addrs)[STK_ADDR_MAX], unsigned n)
{
	for (unsigned j = 0; j < n; j++)
		if (ids[j] == id && strcmp(addrs[j], addr) == 0)
			return 1;
	return 0;
}

/*
 * The senders the role wants (none unless leading): one per follower and per
 * learner. A learner that becomes a follower keeps its sender, in step already:
 * from then on the replies wait for it. Others no longer wanted stop.
 */
static void peers_apply(struct repl *r, int role, const uint32_t *fol,
			const char (*addrs)[STK_ADDR_MAX], unsigned nf, const uint32_t *lrn,
			const char (*laddrs)[STK_ADDR_MAX], unsigned nl)
{
	struct peer *gone[STK_MAX_REPLICAS + REPL_LEARNERS];
	unsigned ngone = 0;

	if (role != STK_META_ROLE_LEADER)
		nf = nl = 0;
	pthread_mutex_lock(&r->mu);
	for (unsigned i = 0; i < r->npeers;) {
		struct peer *p = r->peers[i];

		if (listed(p->node_id, p->addr, fol, addrs, nf)) {
			if (p->learner)
				stk_info("replication: meta node %u (%s) follows now, its store "
					 "learned",
					 p->node_id, p->addr);
			p->learner = 0;
			i++;
			continue;
		}
		if (p->learner && listed(p->node_id, p->addr, lrn, laddrs, nl)) {
			i++;
			continue;
		}
		gone[ngone++] = p;
		r->peers[i] = r->peers[--r->npeers];
	}
	pthread_mutex_unlock(&r->mu);
	peers_stop(r, gone, ngone);
	waiters_settle(r); /* a follower less to wait for, or no longer the leader */
	for (unsigned j = 0; j < nf + nl; j++) {
		uint32_t id = j < nf ? fol[j] : lrn[j - nf];
		const char *addr = j < nf ? addrs[j] : laddrs[j - nf];
		int have = 0;
		struct peer *p;

		pthread_mutex_lock(&r->mu);
		for (unsigned i = 0; i < r->npeers; i++)
			have |= r->peers[i]->node_id == id;
		pthread_mutex_unlock(&r->mu);
		if (have || !addr[0])
			continue;
		p = peer_start(r, id, addr, j >= nf);
		if (!p) {
			stk_error("replication: cannot start a sender to meta node %u", id);
			continue;
		}
		pthread_mutex_lock(&r->mu);
		r->peers[r->npeers++] = p;
		pthread_mutex_unlock(&r->mu);
	}
}

static void apply_wanted(struct repl *r)
{
	int role, old_role, rc;
	uint64_t epoch, old_epoch;
	uint8_t nf, nl;
	uint32_t fol[STK_MAX_REPLICAS], lrn[REPL_LEARNERS];
	char addrs[STK_MAX_REPLICAS][STK_ADDR_MAX], laddrs[REPL_LEARNERS][STK_ADDR_MAX];

	pthread_mutex_lock(&r->mu);
	if (!r->want_set) {
		pthread_mutex_unlock(&r->mu);
		return;
	}
	r->want_set = 0;
	role = r->want_role;
	epoch = r->want_epoch;
	nf = r->want_nfollowers;
	memcpy(fol, r->want_followers, sizeof(fol));
	memcpy(addrs, r->want_addrs, sizeof(addrs));
	nl = r->want_nlearners;
	memcpy(lrn, r->want_learners, sizeof(lrn));
	memcpy(laddrs, r->want_laddrs, sizeof(laddrs));
	old_role = r->role;
	old_epoch = r->epoch;
	r->replicas = r->want_replicas;
	pthread_mutex_unlock(&r->mu);

	if (role == old_role && epoch == old_epoch) {
		/* the same followers: spares may have come or gone */
		peers_apply(r, role, fol, addrs, nf, lrn, laddrs, nl);
		return;
	}
	/* A leader's store first stops taking writes, then the senders and waiters learn. */
	if (role != STK_META_ROLE_LEADER && old_role == STK_META_ROLE_LEADER)
		stk_warn("replication: meta node %u leads no more (epoch %" PRIu64 "): %s", r->self,
			 epoch, role_name(role));
	switch (role) {
	case STK_META_ROLE_OFF:
		rc = stk_meta_store_repl_set(r->st, STK_META_REPL_OFF, 0, NULL, NULL);
		break;
	case STK_META_ROLE_LEADER:
		rc = stk_meta_store_repl_set(r->st, STK_META_REPL_LEADER, epoch, on_commit, r);
		break;
	default:
		rc = stk_meta_store_repl_set(r->st, STK_META_REPL_FOLLOWER, 0, NULL, NULL);
		break;
	}
	if (rc) {
		stk_error("replication: cannot switch the store to %s: %s", role_name(role),
			  strerror(-rc));
		pthread_mutex_lock(&r->mu);
		r->want_set = 1; /* again at the next tick */
		pthread_mutex_unlock(&r->mu);
		return;
	}
	if (role == STK_META_ROLE_LEADER && old_role != STK_META_ROLE_LEADER && r->promoted)
		r->promoted(r->promoted_ctx, old_role == STK_META_ROLE_FOLLOWER);

	/* The senders of the epoch before go (followers of another epoch refuse them). */
	pthread_mutex_lock(&r->mu);
	r->role = role;
	r->epoch = epoch;
	pthread_cond_broadcast(&r->data_cond);
	pthread_cond_broadcast(&r->ack_cond);
	pthread_mutex_unlock(&r->mu);
	peers_apply(r, role, fol, addrs, nf, lrn, laddrs, nl);
	stk_metric_set_int(r->role_series, role);
	if (role != old_role || role == STK_META_ROLE_LEADER)
		stk_info("replication: meta node %u is %s of shard %u (epoch %" PRIu64
			 ", %u follower%s)",
			 r->self, role_name(role), stk_meta_store_shard(r->st), epoch, nf,
			 nf == 1 ? "" : "s");
}

static void collect(void *ctx)
{
	struct repl *r = ctx;
	uint64_t seq;

	stk_meta_store_repl_pos(r->st, NULL, &seq);
	stk_metric_set_int(r->seq_series, (int64_t)seq);
	pthread_mutex_lock(&r->mu);
	for (unsigned i = 0; i < r->npeers; i++) {
		struct peer *p = r->peers[i];

		stk_metric_set_int(p->lag_series, (int64_t)(seq - STK_MIN(seq, p->acked)));
	}
	pthread_mutex_unlock(&r->mu);
}

static void *manager_main(void *arg)
{
	struct repl *r = arg;

	for (;;) {
		pthread_mutex_lock(&r->mu);
		if (!r->stop && !r->want_set) {
			struct timespec ts;

			deadline_ms(&ts, REPL_TICK_MS);
			pthread_cond_timedwait(&r->mgr_cond, &r->mu, &ts);
		}
		if (r->stop) {
			pthread_mutex_unlock(&r->mu);
			break;
		}
		pthread_mutex_unlock(&r->mu);
		apply_wanted(r);
		waiters_settle(r); /* cut off from mgmtd meanwhile: the waiting replies fail */
	}
	return NULL;
}

int stk_meta_repl_create(struct stk_meta_store *st, void (*promoted)(void *ctx, int failover),
			 void *ctx, struct stk_meta_repl **out)
{
	struct repl *r = calloc(1, sizeof(*r));

	if (!r)
		return -ENOMEM;
	r->st = st;
	r->promoted = promoted;
	r->promoted_ctx = ctx;
	r->role = STK_META_ROLE_NONE;
	r->async_open = 1;
	pthread_mutex_init(&r->mu, NULL);
	pthread_mutex_init(&r->apply_mu, NULL);
	cond_init(&r->data_cond);
	cond_init(&r->ack_cond);
	cond_init(&r->mgr_cond);
	stk_meta_store_repl_pos(st, &r->base_epoch, &r->base_seq);
	/* Serves nothing until it knows its role: the store takes no write meanwhile. */
	stk_meta_store_repl_set(st, STK_META_REPL_FOLLOWER, 0, NULL, NULL);
	*out = (struct stk_meta_repl *)r;
	return 0;
}

int stk_meta_repl_start(struct stk_meta_repl *rp, struct stk_agent *agent, uint32_t node_id,
			int metrics)
{
	struct repl *r = (struct repl *)rp;
	struct stk_routing_ref *ref;
	int rc;

	r->agent = agent;
	r->metrics = metrics;
	if (metrics) {
		stk_metric_series(STK_M_META_REPL_ROLE, NULL, &r->role_series);
		stk_metric_series(STK_M_META_REPL_SEQ, NULL, &r->seq_series);
		stk_metric_series(STK_M_META_REPL_SNAPSHOTS, NULL, &r->snap_series);
		stk_metrics_collector_add(collect, r);
	}
	pthread_mutex_lock(&r->mu);
	r->self = node_id;
	pthread_mutex_unlock(&r->mu);
	ref = stk_agent_routing_get(agent);
	if (ref) {
		stk_meta_repl_routing(r, &ref->rt, 0);
		stk_agent_routing_put(agent, ref);
	}
	apply_wanted(r);
	rc = -pthread_create(&r->manager, NULL, manager_main, r);
	if (rc == 0)
		r->manager_started = 1;
	return rc;
}

void stk_meta_repl_stop(struct stk_meta_repl *rp)
{
	struct repl *r = (struct repl *)rp;

	if (!r)
		return;
	pthread_mutex_lock(&r->mu);
	r->stop = 1;
	r->role = STK_META_ROLE_NONE;
	pthread_cond_broadcast(&r->data_cond);
	pthread_cond_broadcast(&r->ack_cond);
	pthread_cond_broadcast(&r->mgr_cond);
	pthread_mutex_unlock(&r->mu);
	if (r->manager_started)
		pthread_join(r->manager, NULL);
	r->manager_started = 0;
	if (r->metrics)
		stk_metrics_collector_remove(collect, r);
	r->metrics = 0;
	peers_stop(r, r->peers, r->npeers);
	r->npeers = 0;
	stk_meta_repl_close_async(rp);
	/* the store's hook is ours: off before r goes (the daemon writes no more now) */
	stk_meta_store_repl_set(r->st, STK_META_REPL_OFF, 0, NULL, NULL);
}

void stk_meta_repl_destroy(struct stk_meta_repl *rp)
{
	struct repl *r = (struct repl *)rp;

	if (!r)
		return;
	stk_meta_repl_stop(rp);
	ring_reset(r, 0, 0);
	free(r->ring);
	pthread_mutex_destroy(&r->mu);
	pthread_mutex_destroy(&r->apply_mu);
	pthread_cond_destroy(&r->data_cond);
	pthread_cond_destroy(&r->ack_cond);
	pthread_cond_destroy(&r->mgr_cond);
	free(r);
}

void stk_meta_repl_pos(void *ctx, struct stk_ns_id *ns, uint64_t *epoch, uint64_t *seq)
{
	struct repl *r = ctx;

	stk_meta_store_ns_id(r->st, ns);
	stk_meta_store_repl_pos(r->st, epoch, seq);
}

int stk_meta_repl_role(struct stk_meta_repl *rp)
{
	struct repl *r = (struct repl *)rp;
	int role;

	pthread_mutex_lock(&r->mu);
	role = r->role;
	pthread_mutex_unlock(&r->mu);
	return role;
}

int stk_meta_repl_serving(struct stk_meta_repl *rp)
{
	struct repl *r = (struct repl *)rp;
	int role = stk_meta_repl_role(rp);

	if (role == STK_META_ROLE_OFF)
		return 1;
	/* a leader mgmtd may have replaced already (cut off from it) serves nothing */
	return role == STK_META_ROLE_LEADER && !(r->agent && stk_agent_fenced(r->agent));
}

/* timeout_ms 0: none. */
static int repl_wait(struct repl *r, uint64_t seq, unsigned timeout_ms)
{
	uint64_t until = timeout_ms ? stk_now_ns() + (uint64_t)timeout_ms * 1000000ull : 0;
	int rc = 0;

	pthread_mutex_lock(&r->mu);
	for (;;) {
		int all = 1;

		if (r->role == STK_META_ROLE_OFF)
			break;
		/* replaced, or cut off from mgmtd (which may be replacing it): not acknowledged */
		if (r->role != STK_META_ROLE_LEADER || (r->agent && stk_agent_fenced(r->agent))) {
			rc = -EREMCHG;
			break;
		}
		for (unsigned i = 0; i < r->npeers && all; i++)
			all = r->peers[i]->learner ||
			      (r->peers[i]->in_step && r->peers[i]->acked >= seq);
		if (all)
			break;
		if (until && stk_now_ns() >= until) {
			rc = -ETIMEDOUT;
			break;
		}
		struct timespec ts;

		deadline_ms(&ts, REPL_TICK_MS);
		pthread_cond_timedwait(&r->ack_cond, &r->mu, &ts);
	}
	pthread_mutex_unlock(&r->mu);
	return rc;
}

int stk_meta_repl_wait(struct stk_meta_repl *rp, uint64_t seq)
{
	return repl_wait((struct repl *)rp, seq, 0);
}

int stk_meta_repl_wait_ms(struct stk_meta_repl *rp, uint64_t seq, unsigned timeout_ms)
{
	return repl_wait((struct repl *)rp, seq, timeout_ms ? timeout_ms : 1);
}

int stk_meta_repl_wait_async(struct stk_meta_repl *rp, uint64_t seq,
			     void (*done)(void *arg, int rc), void *arg)
{
	struct repl *r = (struct repl *)rp;
	struct waiter *w = malloc(sizeof(*w));
	int rc = 1;

	if (!w)
		return -ENOMEM;
	pthread_mutex_lock(&r->mu);
	if (r->role == STK_META_ROLE_OFF)
		rc = 0;
	else if (r->role != STK_META_ROLE_LEADER || (r->agent && stk_agent_fenced(r->agent)))
		rc = -EREMCHG;
	else if (held_by_all(r) >= seq)
		rc = 0;
	else if (!r->async_open)
		rc = -EAGAIN;
	if (rc == 1) {
		w->seq = seq;
		w->done = done;
		w->arg = arg;
		w->next = r->waiters;
		r->waiters = w;
	}
	pthread_mutex_unlock(&r->mu);
	if (rc != 1)
		free(w);
	return rc;
}

void stk_meta_repl_close_async(struct stk_meta_repl *rp)
{
	struct repl *r = (struct repl *)rp;
	struct waiter *w;
	uint64_t deadline;

	if (!r)
		return;
	pthread_mutex_lock(&r->mu);
	r->async_open = 0;
	/* a moment for the followers to acknowledge what waits (a stop, not a failover) */
	deadline = stk_now_ns() + (uint64_t)REPL_CLOSE_MS * 1000000ull;
	while (r->waiters && r->role == STK_META_ROLE_LEADER && stk_now_ns() < deadline) {
		struct timespec ts;

		deadline_ms(&ts, REPL_RETRY_MS);
		pthread_cond_timedwait(&r->ack_cond, &r->mu, &ts);
	}
	w = r->waiters;
	r->waiters = NULL;
	pthread_mutex_unlock(&r->mu);
	waiters_done(w, -EREMCHG);
}

int stk_meta_repl_sync(struct stk_meta_repl *rp)
{
	struct repl *r = (struct repl *)rp;
	uint64_t my;
	int rc = 0;

	pthread_mutex_lock(&r->mu);
	if (r->role != STK_META_ROLE_LEADER) {
		rc = r->role == STK_META_ROLE_OFF ? 0 : -EREMCHG;
		pthread_mutex_unlock(&r->mu);
		return rc;
	}
	my = ++r->sync_want;
	pthread_cond_broadcast(&r->data_cond);
	for (;;) {
		int all = 1;

		if (r->role != STK_META_ROLE_LEADER || (r->agent && stk_agent_fenced(r->agent))) {
			rc = -EREMCHG;
			break;
		}
		for (unsigned i = 0; i < r->npeers && all; i++)
			all = r->peers[i]->learner || r->peers[i]->synced >= my;
		if (all)
			break;
		struct timespec ts;

		deadline_ms(&ts, REPL_TICK_MS);
		pthread_cond_timedwait(&r->ack_cond, &r->mu, &ts);
	}
	pthread_mutex_unlock(&r->mu);
	return rc;
}

/* ---- 4. the follower's side ---- */

/* Puts the entries of a log just applied (those past `from`) in the ring. */
static void ring_add_log(struct repl *r, const uint8_t *log, size_t len, uint64_t from)
{
	struct stk_rbuf rb;

	stk_rbuf_init(&rb, log, len);
	pthread_mutex_lock(&r->mu);
	while (rb.off < rb.len && !rb.err) {
		uint64_t e = stk_get_u64(&rb), s = stk_get_u64(&rb);
		uint32_t n = stk_get_u32(&rb);
		const uint8_t *ops = stk_rbuf_take(&rb, n);

		if (rb.err)
			break;
		if (s > from)
			ring_add(r, e, s, ops, n);
	}
	pthread_mutex_unlock(&r->mu);
}

int stk_meta_repl_handle(struct stk_meta_repl *rp, struct stk_rpc_req *req,
			 struct stk_rpc_resp *resp)
{
	struct repl *r = (struct repl *)rp;
	struct stk_msg_meta_repl_req q;
	struct stk_msg_meta_repl_resp p;
	struct stk_ns_id ns;
	uint64_t e, s;
	int rc, role;

	rc = stk_msg_meta_repl_req_dec(&req->payload, &q);
	if (rc == 0)
		rc = stk_rbuf_finish(&req->payload);
	if (rc == 0 && q.len != req->bulk_len)
		rc = -EBADMSG;
	if (rc == 0 && q.kind > STK_REPL_SNAP_DONE)
		rc = -EINVAL;
	if (rc) {
		stk_warn("META_REPL from %s: malformed", req->peer);
		return -EBADMSG;
	}
	/*
	 * Only the leader the routing table names for the newest epoch known: a newer
	 * epoch is looked up first (never taken on the sender's word, so a stray or
	 * hostile request cannot fence the real leader out).
	 */
	for (int looked = 0;; looked = 1) {
		pthread_mutex_lock(&r->mu);
		role = r->role;
		if (q.epoch < r->known_epoch ||
		    (q.epoch == r->known_epoch && q.leader != r->known_leader)) {
			pthread_mutex_unlock(&r->mu);
			return -ESTALE; /* the sender leads no more (or never did in our eyes) */
		}
		if (q.epoch == r->known_epoch && role != STK_META_ROLE_LEADER)
			break; /* mu held */
		pthread_mutex_unlock(&r->mu);
		if (looked || !r->agent)
			return -EAGAIN; /* not (yet) in the routing table: the sender tries again */
		stk_agent_routing_refresh(r->agent);
	}
	pthread_mutex_unlock(&r->mu);

	pthread_mutex_lock(&r->apply_mu);
	stk_meta_store_repl_pos(r->st, &e, &s);
	switch (q.kind) {
	case STK_REPL_LOG:
		rc = stk_meta_store_apply(r->st, req->bulk, req->bulk_len, NULL, NULL);
		if (rc == 0)
			ring_add_log(r, req->bulk, req->bulk_len, s);
		else if (rc == -ESTALE)
			rc = 0; /* a gap: the reply's position tells the leader where we are */
		if (rc == 0 && q.first)
			rc = stk_meta_store_sync(r->st); /* the leader's client asked for fsync */
		break;
	case STK_REPL_SNAP:
		rc = stk_meta_store_snap_apply(r->st, q.first, req->bulk, req->bulk_len);
		if (rc == 0 && q.first) {
			pthread_mutex_lock(&r->mu);
			ring_reset(r, 0, 0);
			pthread_mutex_unlock(&r->mu);
			stk_info("replication: meta node %u (%s) copies its store to us", q.leader,
				 req->peer);
		}
		break;
	case STK_REPL_SNAP_DONE:
		rc = stk_meta_store_snap_done(r->st, q.snap_epoch, q.snap_seq);
		if (rc == 0) {
			pthread_mutex_lock(&r->mu);
			ring_reset(r, q.snap_epoch, q.snap_seq);
			pthread_mutex_unlock(&r->mu);
			stk_info(
			    "replication: store copied from meta node %u as of change %" PRIu64,
			    q.leader, q.snap_seq);
		}
		break;
	default:
		break;
	}
	pthread_mutex_unlock(&r->apply_mu);
	if (rc) {
		stk_warn("META_REPL from meta node %u (%s): %s", q.leader, req->peer,
			 strerror(-rc));
		return rc;
	}
	memset(&p, 0, sizeof(p));
	stk_meta_store_repl_pos(r->st, &p.pos_epoch, &p.pos_seq);
	stk_meta_store_ns_id(r->st, &ns);
	p.ns_hi = ns.hi;
	p.ns_lo = ns.lo;
	return stk_msg_meta_repl_resp_enc(&resp->payload, &p);
}
