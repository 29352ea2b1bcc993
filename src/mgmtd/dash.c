/*
 * mgmtd's web dashboard (see dash.h and docs/dashboard.md).
 *
 * Two halves that meet under d->lock:
 *
 * - The sampler thread. Every interval, while this mgmtd leads, it copies the
 *   list of meta and storage nodes out of the state (under mgmtd's lock, briefly),
 *   then, holding no lock, reads each online node's /metrics (scrape.h, 2 s at
 *   most each) into a compact snapshot of the counters it needs: per target the
 *   bytes and operations read and written and the latency histograms, per client
 *   host the requests and bytes, the host's TCP segments sent and retransmitted,
 *   and the disks' SMART verdicts. Rates and percentiles are differences between
 *   two snapshots of one node, as `stoker top` computes them; the cluster's
 *   percentiles come from the targets' histogram increments added together (not
 *   the worst node's). Each round adds one point to the history ring
 *   (STK_MGMTD_DASH_POINTS, 360: an hour at 10 s, about 40 KiB) and evaluates the
 *   alerts.
 *
 * - The route, on the metrics endpoint's thread: the embedded files, and JSON built
 *   with Jansson from the state as it is now (so a node that goes offline shows at
 *   once) and from the sampler's last figures.
 *
 * Alert windows: latency, media errors and TCP loss are judged over the last
 * minute or two, between the newest snapshot of a node and one at least
 * ALERT_WINDOW_NS old. Each node keeps four snapshots (newest, previous, and two
 * that rotate every window), so memory does not grow with a short interval.
 *
 * Memory: the ring, plus per node four snapshots of (targets x 44 doubles) and up
 * to 64 clients each; a few KiB per node.
 */
#include "dash.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "stoker/stoker.h" /* STK_VERSION */

#include "../common/auth.h"
#include "../common/host.h"
#include "../common/metrics.h" /* STK_METRIC_BUCKETS */
#include "../common/scrape.h"
#include "../common/util.h"
#include "../daemon/daemon.h"
#include "../daemon/metrics_http.h"
#include "jobs.h"
#include "promq.h"
#include "ui_assets.h"

/* Where a node's /metrics is: its RPC port + 10, as `stoker up` places it (cli.h). */
#define METRICS_PORT_OFFSET 10u
#define SCRAPE_TIMEOUT_MS 2000u
#define SCRAPE_MAX (32u << 20)
#define NB (STK_METRIC_BUCKETS + 1) /* bounded buckets, then +Inf */
#define ALERT_WINDOW_NS 60000000000ull
/* The seed rules (deploy/prometheus/alerts.yml): capacity, latency. */
#define CAPACITY_LIMIT 0.8
#define LATENCY_LIMIT_S 0.005
/* A p99 needs some operations to mean anything: fewer in the window, no verdict. */
#define LATENCY_MIN_OPS 20
/* More than 1% of the segments a host sent were retransmitted: the network loses. */
#define LOSS_LIMIT 0.01
#define LOSS_MIN_SEGMENTS 1000
#define TOP_CLIENTS 10
/*
 * A fill forecast needs some history: at least this many samples (two minutes at
 * the default interval), or it says it does not know yet.
 */
#define FORECAST_MIN_POINTS 12
#define MAX_ALERTS 200
#define MAX_UNHEALTHY_CHAINS 100
#define CLIENT_MAX 64 /* what a node counts at most (common/metrics.c), plus "other" */

/* ---- snapshots of one node's counters ---- */

struct tsnap {
	uint32_t id;
	double rbytes, wbytes, reads, writes;
	double hist[2][NB]; /* cumulative counts by bucket: [0] reads, [1] writes */
	int smart;	    /* -1 not reported, 0 failing, 1 passing */
	double media;	    /* media errors; -1 not reported */
};

struct csnap {
	char client[48];
	double reqs, rx, tx;
};

struct snap {
	uint64_t at_ns; /* 0: empty */
	struct tsnap *t;
	uint32_t nt, capt;
	struct csnap *c;
	uint32_t nc;
	double tcp_out, tcp_retrans; /* -1 when not reported */
};

/* A node the sampler reads (sampler thread only). */
struct dnode {
	uint32_t id;
	uint8_t role;
	char addr[STK_ADDR_MAX];
	char maddr[STK_ADDR_MAX + 8];
	int err; /* the last scrape: 0, -errno, or 1 when not tried (offline) */
	struct snap cur, prev, mid, base;
};

/* ---- what one round computed (under d->lock once published) ---- */

struct tfig {
	uint32_t id, node;
	double rbps, wbps, riops, wiops, rp99, wp99; /* the last interval */
	double rp99w, wp99w, ropsw, wopsw;	     /* the alert window */
	int smart;
	double media_w; /* media errors the window added; 0 when not reported */
};

struct nfig {
	uint32_t id;
	int err;
	double rbps, wbps, riops, wiops;
	double loss, sent_w; /* retransmitted / sent over the window; NAN if unknown */
};

struct cfig {
	char client[48];
	double reqs, rx, tx; /* per second, over every node */
};

struct point {
	int64_t t_ms; /* wall clock */
	double rbps, wbps, riops, wiops;
	double rq[3], wq[3]; /* p50, p95, p99 in seconds; NAN when nothing was served */
	double used, capacity;
};

struct figs {
	struct tfig *t;
	uint32_t nt;
	struct nfig *n;
	uint32_t nn;
	struct cfig *c;
	uint32_t nc;
	int64_t at_ms; /* when the round ended; 0 before the first */
};

/*
 * The history's columns, in the order of struct point after t_ms and of
 * /ui/api/history; with --prometheus, each is asked of Prometheus with its query.
 */
#define NCOLS 12
/*
 * The same figures from what Prometheus scraped: the targets' counters and
 * histograms summed over the cluster (short-circuit reads counted as reads, as
 * the sampler does; a node without them adds 0), the capacity as mgmtd exports
 * it. Rates over a minute: two scrapes at least at Prometheus's default 15 s.
 */
static const char *const prom_query[NCOLS] = {
    "sum(rate(stoker_target_read_bytes_total[1m])) + "
    "(sum(rate(stoker_target_short_circuit_read_bytes_total[1m])) or vector(0))",
    "sum(rate(stoker_target_write_bytes_total[1m]))",
    "sum(rate(stoker_target_reads_total[1m])) + "
    "(sum(rate(stoker_target_short_circuit_reads_total[1m])) or vector(0))",
    "sum(rate(stoker_target_writes_total[1m]))",
    "histogram_quantile(0.5, sum by (le) "
    "(rate(stoker_target_io_duration_seconds_bucket{op=\"read\"}[1m])))",
    "histogram_quantile(0.95, sum by (le) "
    "(rate(stoker_target_io_duration_seconds_bucket{op=\"read\"}[1m])))",
    "histogram_quantile(0.99, sum by (le) "
    "(rate(stoker_target_io_duration_seconds_bucket{op=\"read\"}[1m])))",
    "histogram_quantile(0.5, sum by (le) "
    "(rate(stoker_target_io_duration_seconds_bucket{op=\"write\"}[1m])))",
    "histogram_quantile(0.95, sum by (le) "
    "(rate(stoker_target_io_duration_seconds_bucket{op=\"write\"}[1m])))",
    "histogram_quantile(0.99, sum by (le) "
    "(rate(stoker_target_io_duration_seconds_bucket{op=\"write\"}[1m])))",
    "max(stoker_cluster_used_bytes)",
    "max(stoker_cluster_capacity_bytes)",
};

/* The last hour as Prometheus has it: cols[c][k] at t0_ms + k * step_ms. */
struct phist {
	int64_t t0_ms, step_ms;
	unsigned n;
	double *cols[NCOLS];
	int64_t fetched_ns; /* monotonic; 0: never */
};

struct since {
	char key[96];
	int64_t since_ms;
	int seen;
};

struct stk_mgmtd_dash {
	struct stk_mgmtd_dash_src src;
	unsigned interval_ms;
	struct stk_metrics_http *http;
	/* the sampler's own, no lock */
	struct dnode *nodes;
	uint32_t nnodes, capnodes;
	pthread_t thread;
	int started;

	pthread_mutex_t lock; /* protects everything below */
	pthread_cond_t wake;  /* CLOCK_MONOTONIC; wakes the sampler to stop */
	int stop;
	char self[STK_ADDR_MAX];
	struct point ring[STK_MGMTD_DASH_POINTS];
	unsigned head, count; /* ring[head] is the next slot; count points held */
	struct figs figs;
	struct since *since;
	uint32_t nsince, capsince;
	struct stk_mgmtd_jobs *jobs; /* training jobs' reports; its own lock */
	/* --prometheus: the client (the sampler's), and what it last fetched */
	struct stk_promq *promq;
	char prom_url[512];
	struct phist ph;
	char prom_err[256]; /* why the last fetch failed; "" when it did not */
};

static const double q3[3] = {0.5, 0.95, 0.99};

static int64_t wall_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The bucket index of an `le` bound (1-2-5 steps from 10 us), NB - 1 for +Inf, -1 if unknown. */
static int bucket_of(const char *le)
{
	static const double steps[3] = {1, 2, 5};
	double v;

	if (strcmp(le, "+Inf") == 0)
		return NB - 1;
	v = strtod(le, NULL);
	for (int i = 0; i < STK_METRIC_BUCKETS; i++) {
		double b = steps[i % 3] * pow(10, i / 3 - 5);

		if (fabs(v - b) <= b * 1e-6)
			return i;
	}
	return -1;
}

static double bucket_bound(int i)
{
	static const double steps[3] = {1, 2, 5};

	return steps[i % 3] * pow(10, i / 3 - 5);
}

/*
 * The q-quantile of the observations whose cumulative bucket counts are cum[NB],
 * interpolated inside its bucket as Prometheus's histogram_quantile does; beyond the
 * last bound, the last bound. NAN when nothing was observed.
 */
static double quantile(const double *cum, double q)
{
	double total = cum[NB - 1], rank, prev = 0;

	if (!(total > 0))
		return NAN;
	rank = q * total;
	for (int i = 0; i < NB; i++) {
		double lo = i ? bucket_bound(i - 1) : 0;

		if (cum[i] >= rank) {
			if (i == NB - 1)
				return bucket_bound(NB - 2);
			if (cum[i] == prev)
				return bucket_bound(i);
			return lo + (bucket_bound(i) - lo) * (rank - prev) / (cum[i] - prev);
		}
		prev = cum[i];
	}
	return NAN;
}

static void snap_free(struct snap *s)
{
	free(s->t);
	free(s->c);
	memset(s, 0, sizeof(*s));
}

static int snap_copy(struct snap *dst, const struct snap *src)
{
	memset(dst, 0, sizeof(*dst));
	dst->at_ns = src->at_ns;
	dst->tcp_out = src->tcp_out;
	dst->tcp_retrans = src->tcp_retrans;
	if (src->nt) {
		dst->t = malloc(src->nt * sizeof(*dst->t));
		if (!dst->t)
			return -ENOMEM;
		memcpy(dst->t, src->t, src->nt * sizeof(*dst->t));
		dst->nt = dst->capt = src->nt;
	}
	if (src->nc) {
		dst->c = malloc(src->nc * sizeof(*dst->c));
		if (!dst->c) {
			snap_free(dst);
			return -ENOMEM;
		}
		memcpy(dst->c, src->c, src->nc * sizeof(*dst->c));
		dst->nc = src->nc;
	}
	return 0;
}

static struct tsnap *snap_target(const struct snap *s, uint32_t id)
{
	for (uint32_t i = 0; i < s->nt; i++)
		if (s->t[i].id == id)
			return &s->t[i];
	return NULL;
}

/* Parsing: what a line adds to the snapshot being filled. */
struct fill {
	struct snap *s;
	int err;
};

static struct tsnap *fill_target(struct fill *f, const char *labels)
{
	char id[16];
	uint64_t v;
	struct tsnap *t;

	if (stk_scrape_label(labels, "target", id, sizeof(id)) || stk_parse_u64(id, &v) ||
	    v > UINT32_MAX)
		return NULL;
	t = snap_target(f->s, (uint32_t)v);
	if (t)
		return t;
	if (f->s->nt == f->s->capt) {
		uint32_t nc = f->s->capt ? f->s->capt * 2 : 8;
		struct tsnap *nt;

		if (nc > STK_MGMT_MAX_NODE_TARGETS)
			return NULL;
		nt = realloc(f->s->t, nc * sizeof(*nt));
		if (!nt) {
			f->err = -ENOMEM;
			return NULL;
		}
		f->s->t = nt;
		f->s->capt = nc;
	}
	t = &f->s->t[f->s->nt++];
	memset(t, 0, sizeof(*t));
	t->id = (uint32_t)v;
	t->smart = -1;
	t->media = -1;
	return t;
}

static struct csnap *fill_client(struct fill *f, const char *labels)
{
	char name[48];
	struct snap *s = f->s;

	if (stk_scrape_label(labels, "client", name, sizeof(name)))
		return NULL;
	for (uint32_t i = 0; i < s->nc; i++)
		if (strcmp(s->c[i].client, name) == 0)
			return &s->c[i];
	if (s->nc == CLIENT_MAX + 1)
		return NULL;
	if (!s->c) {
		s->c = calloc(CLIENT_MAX + 1, sizeof(*s->c));
		if (!s->c) {
			f->err = -ENOMEM;
			return NULL;
		}
	}
	stk_strlcpy(s->c[s->nc].client, name, sizeof(s->c[s->nc].client));
	return &s->c[s->nc++];
}

static void fill_line(void *ctx, const char *name, const char *labels, double v)
{
	struct fill *f = ctx;
	struct tsnap *t;
	struct csnap *c;
	char buf[32];

	if (strncmp(name, "stoker_target_", 14) == 0) {
		const char *n = name + 14;
		int op;

		if (strcmp(n, "read_bytes_total") && strcmp(n, "write_bytes_total") &&
		    strcmp(n, "reads_total") && strcmp(n, "writes_total") &&
		    strcmp(n, "short_circuit_reads_total") &&
		    strcmp(n, "short_circuit_read_bytes_total") &&
		    strcmp(n, "io_duration_seconds_bucket"))
			return;
		t = fill_target(f, labels);
		if (!t)
			return;
		/*
		 * Short-circuit reads (a client on the node's host reading chunk files
		 * itself) are reads the target served all the same: they count in its
		 * throughput and IOPS, though not in its latency, which the node never saw.
		 */
		if (strcmp(n, "short_circuit_read_bytes_total") == 0)
			t->rbytes += v;
		else if (strcmp(n, "short_circuit_reads_total") == 0)
			t->reads += v;
		else if (strcmp(n, "read_bytes_total") == 0)
			t->rbytes += v;
		else if (strcmp(n, "write_bytes_total") == 0)
			t->wbytes = v;
		else if (strcmp(n, "reads_total") == 0)
			t->reads += v;
		else if (strcmp(n, "writes_total") == 0)
			t->writes = v;
		else if (stk_scrape_label(labels, "op", buf, sizeof(buf)) == 0) {
			int b;

			op = strcmp(buf, "read") == 0 ? 0 : strcmp(buf, "write") == 0 ? 1 : -1;
			if (op < 0 || stk_scrape_label(labels, "le", buf, sizeof(buf)))
				return;
			b = bucket_of(buf);
			if (b >= 0)
				t->hist[op][b] = v;
		}
	} else if (strcmp(name, "stoker_device_smart_healthy") == 0) {
		t = fill_target(f, labels);
		if (t)
			t->smart = v != 0; /* one device per target: the folder's */
	} else if (strcmp(name, "stoker_device_media_errors_total") == 0) {
		t = fill_target(f, labels);
		if (t)
			t->media = v;
	} else if (strncmp(name, "stoker_rpc_client_", 18) == 0) {
		const char *n = name + 18;

		if (strcmp(n, "requests_total") && strcmp(n, "received_bytes_total") &&
		    strcmp(n, "sent_bytes_total"))
			return;
		c = fill_client(f, labels);
		if (!c)
			return;
		if (n[0] == 'r' && n[2] == 'q')
			c->reqs = v;
		else if (n[0] == 'r')
			c->rx = v;
		else
			c->tx = v;
	} else if (strcmp(name, "stoker_host_tcp_sent_segments_total") == 0) {
		f->s->tcp_out = v;
	} else if (strcmp(name, "stoker_host_tcp_retransmitted_segments_total") == 0) {
		f->s->tcp_retrans = v;
	}
}

/* Reads node n's /metrics into a new snapshot *s. 0 or -errno. */
static int scrape_node(const struct dnode *n, struct snap *s)
{
	struct fill f = {.s = s, .err = 0};
	char *body;
	int rc;

	memset(s, 0, sizeof(*s));
	s->tcp_out = s->tcp_retrans = -1;
	rc = stk_scrape_get(n->maddr, "/metrics", SCRAPE_TIMEOUT_MS, SCRAPE_MAX, &body);
	if (rc)
		return rc;
	s->at_ns = stk_now_ns();
	stk_scrape_parse(body, fill_line, &f);
	free(body);
	if (f.err)
		snap_free(s);
	return f.err;
}

/*
 * The newest snapshot in; the previous one kept for the interval's rates, and the
 * two window snapshots rotated once the older of them is a window old.
 */
static void node_push(struct dnode *n, struct snap *s)
{
	snap_free(&n->prev);
	n->prev = n->cur;
	n->cur = *s;
	memset(s, 0, sizeof(*s));
	if (!n->mid.at_ns || n->cur.at_ns - n->mid.at_ns >= ALERT_WINDOW_NS) {
		struct snap copy;

		if (snap_copy(&copy, &n->cur))
			return; /* no memory: the window just stays longer */
		snap_free(&n->base);
		n->base = n->mid;
		n->mid = copy;
	}
}

static void node_reset(struct dnode *n)
{
	snap_free(&n->cur);
	snap_free(&n->prev);
	snap_free(&n->mid);
	snap_free(&n->base);
}

/* The snapshot the alert window starts from: the oldest that is older than cur. */
static const struct snap *window_start(const struct dnode *n)
{
	if (n->base.at_ns && n->base.at_ns < n->cur.at_ns)
		return &n->base;
	if (n->mid.at_ns && n->mid.at_ns < n->cur.at_ns)
		return &n->mid;
	return n->prev.at_ns ? &n->prev : NULL;
}

/* A counter's increase from a to b: a restarted node counts from zero. */
static double inc(double a, double b)
{
	return b >= a ? b - a : b;
}

/* Adds the histogram increments of target b since a (NULL: none) into out[2][NB]. */
static void hist_inc(const struct tsnap *a, const struct tsnap *b, double out[2][NB])
{
	for (int op = 0; op < 2; op++) {
		int restarted = a && b->hist[op][NB - 1] < a->hist[op][NB - 1];

		if (!a)
			continue; /* nothing to compare with: no increment known */
		for (int i = 0; i < NB; i++)
			out[op][i] += restarted ? b->hist[op][i] : b->hist[op][i] - a->hist[op][i];
	}
}

/* ---- the state as the page shows it ---- */

struct vnode {
	uint32_t id;
	uint8_t role, state, draining, refused;
	char addr[STK_ADDR_MAX];
	char host[STK_HOST_ID_MAX];
	double last_seen_s;
};

struct vtarget {
	uint32_t id, node;
	uint8_t state;
	uint64_t capacity, used, avail, chunks;
	uint32_t sync_permille;
	char path[256];
};

struct vchain {
	uint32_t id;
	int health;
	uint8_t ntargets;
	uint32_t targets[STK_MAX_REPLICAS];
	uint8_t states[STK_MAX_REPLICAS]; /* 0: the target is not known */
};

struct view {
	int leading, cluster_mode;
	char leader[STK_ADDR_MAX];
	uint64_t version;
	struct vnode *n;
	uint32_t nn;
	struct vtarget *t;
	uint32_t nt;
	struct vchain *c; /* the unhealthy ones, MAX_UNHEALTHY_CHAINS at most */
	uint32_t nc;
	uint32_t chains[3]; /* by enum stk_mgmt_chain_health */
	struct stk_space sp;
	int have_space;
};

static void view_free(struct view *v)
{
	free(v->n);
	free(v->t);
	free(v->c);
	memset(v, 0, sizeof(*v));
}

/* Copies what the page shows of mgmtd's state, under its lock. 0 or -ENOMEM. */
static int view_take(struct stk_mgmtd_dash *d, struct view *v)
{
	const struct stk_mgmt_state *st = d->src.st;
	uint64_t now = stk_now_ns();
	int rc = 0;

	memset(v, 0, sizeof(*v));
	v->cluster_mode = d->src.cluster_mode;
	pthread_mutex_lock(d->src.lock);
	v->leading = *d->src.leading;
	stk_strlcpy(v->leader, d->src.leader, sizeof(v->leader));
	if (!v->leading)
		goto out;
	v->version = st->version;
	v->n = calloc(st->nnodes ? st->nnodes : 1, sizeof(*v->n));
	v->t = calloc(st->ntargets ? st->ntargets : 1, sizeof(*v->t));
	v->c = calloc(MAX_UNHEALTHY_CHAINS, sizeof(*v->c));
	rc = -ENOMEM;
	if (!v->n || !v->t || !v->c)
		goto out;
	rc = 0;
	for (uint32_t i = 0; i < st->nnodes; i++) {
		const struct stk_mgmt_node *n = &st->nodes[i];
		struct vnode *o = &v->n[v->nn++];

		o->id = n->id;
		o->role = n->role;
		o->state = n->state;
		o->draining = n->draining;
		o->refused = n->refused;
		stk_strlcpy(o->addr, n->addr, sizeof(o->addr));
		stk_strlcpy(o->host, n->host_id, sizeof(o->host));
		o->last_seen_s = now > n->last_hb_ns ? (double)(now - n->last_hb_ns) / 1e9 : 0;
	}
	for (uint32_t i = 0; i < st->ntargets; i++) {
		const struct stk_rt_target *t = &st->targets[i];
		struct vtarget *o = &v->t[v->nt++];

		o->id = t->id;
		o->node = t->node_id;
		o->state = t->state;
		o->capacity = t->capacity;
		o->used = t->used;
		o->avail = t->avail;
		o->chunks = t->chunks;
		o->sync_permille = t->sync_permille;
		stk_strlcpy(o->path, t->path, sizeof(o->path));
	}
	for (uint32_t i = 0; i < st->nchains; i++) {
		const struct stk_rt_chain *c = &st->chains[i];
		int h;

		if (!c->ntargets)
			continue;
		h = stk_mgmt_state_chain_health(st, c);
		v->chains[h]++;
		if (h != STK_MGMT_CHAIN_HEALTHY && v->nc < MAX_UNHEALTHY_CHAINS) {
			struct vchain *o = &v->c[v->nc++];

			o->id = c->id;
			o->health = h;
			o->ntargets = c->ntargets;
			for (uint8_t j = 0; j < c->ntargets && j < STK_MAX_REPLICAS; j++) {
				const struct stk_rt_target *t =
				    stk_mgmt_state_target(st, c->targets[j]);

				o->targets[j] = c->targets[j];
				o->states[j] = t ? t->state : 0;
			}
		}
	}
	v->have_space = stk_host_space_sum(st->targets, st->ntargets, &v->sp) == 0;
out:
	pthread_mutex_unlock(d->src.lock);
	if (rc)
		view_free(v);
	return rc;
}

static const char *node_state_name(uint8_t s)
{
	return s == STK_NODE_ONLINE ? "online" : "offline";
}

static const char *target_state_name(uint8_t s)
{
	switch (s) {
	case STK_TARGET_SERVING:
		return "serving";
	case STK_TARGET_OFFLINE:
		return "offline";
	case STK_TARGET_FULL:
		return "full";
	case STK_TARGET_SYNCING:
		return "syncing";
	case STK_TARGET_WIPING:
		return "wiping";
	default:
		return "unknown";
	}
}

/* ---- the sampler ---- */

static struct dnode *dnode_get(struct stk_mgmtd_dash *d, uint32_t id)
{
	for (uint32_t i = 0; i < d->nnodes; i++)
		if (d->nodes[i].id == id)
			return &d->nodes[i];
	if (d->nnodes == d->capnodes) {
		uint32_t nc = d->capnodes ? d->capnodes * 2 : 8;
		struct dnode *nn = realloc(d->nodes, nc * sizeof(*nn));

		if (!nn)
			return NULL;
		d->nodes = nn;
		d->capnodes = nc;
	}
	memset(&d->nodes[d->nnodes], 0, sizeof(d->nodes[0]));
	d->nodes[d->nnodes].id = id;
	return &d->nodes[d->nnodes++];
}

/* "HOST:PORT" of the metrics of the node at RPC address addr. 0 or -EINVAL. */
static int metrics_addr(const char *addr, char *out, size_t len)
{
	char host[STK_ADDR_MAX];
	uint16_t port;

	if (stk_parse_hostport(addr, host, sizeof(host), &port) ||
	    port + METRICS_PORT_OFFSET > 65535)
		return -EINVAL;
	snprintf(out, len, strchr(host, ':') ? "[%s]:%u" : "%s:%u", host,
		 (unsigned)(port + METRICS_PORT_OFFSET));
	return 0;
}

static void figs_free(struct figs *f)
{
	free(f->t);
	free(f->n);
	free(f->c);
	memset(f, 0, sizeof(*f));
}

static int cmp_client(const void *a, const void *b)
{
	const struct cfig *x = a, *y = b;
	double bx = x->rx + x->tx, by = y->rx + y->tx;

	if (bx != by)
		return bx < by ? 1 : -1;
	if (x->reqs != y->reqs)
		return x->reqs < y->reqs ? 1 : -1;
	return strcmp(x->client, y->client);
}

/* Adds a client's rates into the merged table (by host: each node counts it apart). */
static void client_add(struct figs *f, uint32_t cap, const char *client, double reqs, double rx,
		       double tx)
{
	uint32_t i;

	for (i = 0; i < f->nc; i++)
		if (strcmp(f->c[i].client, client) == 0)
			break;
	if (i == f->nc) {
		if (f->nc == cap)
			return;
		stk_strlcpy(f->c[i].client, client, sizeof(f->c[i].client));
		f->nc++;
	}
	f->c[i].reqs += reqs;
	f->c[i].rx += rx;
	f->c[i].tx += tx;
}

/*
 * Computes one round's figures from the nodes' snapshots, and the history point.
 * 1 when some node had two snapshots to compare (the point means something), 0
 * when not, -ENOMEM.
 */
static int compute(struct stk_mgmtd_dash *d, const struct view *v, struct figs *f, struct point *p)
{
	double hist[2][NB];
	uint32_t ntargets = 0, ccap = 0;
	int any = 0;

	memset(f, 0, sizeof(*f));
	memset(p, 0, sizeof(*p));
	memset(hist, 0, sizeof(hist));
	for (uint32_t i = 0; i < d->nnodes; i++) {
		ntargets += d->nodes[i].cur.nt;
		ccap += d->nodes[i].cur.nc;
	}
	f->t = calloc(ntargets ? ntargets : 1, sizeof(*f->t));
	f->n = calloc(d->nnodes ? d->nnodes : 1, sizeof(*f->n));
	f->c = calloc(ccap ? ccap : 1, sizeof(*f->c));
	if (!f->t || !f->n || !f->c) {
		figs_free(f);
		return -ENOMEM;
	}
	for (uint32_t i = 0; i < d->nnodes; i++) {
		const struct dnode *n = &d->nodes[i];
		const struct snap *w = window_start(n);
		struct nfig *nf = &f->n[f->nn++];
		double dt = n->prev.at_ns && n->cur.at_ns > n->prev.at_ns
				? (double)(n->cur.at_ns - n->prev.at_ns) / 1e9
				: 0;

		nf->id = n->id;
		nf->err = n->err;
		nf->loss = NAN;
		if (!n->cur.at_ns || n->err)
			continue;
		if (w && w->tcp_out >= 0 && n->cur.tcp_out >= 0 && w->tcp_retrans >= 0 &&
		    n->cur.tcp_retrans >= 0) {
			nf->sent_w = inc(w->tcp_out, n->cur.tcp_out);
			if (nf->sent_w > 0)
				nf->loss = inc(w->tcp_retrans, n->cur.tcp_retrans) / nf->sent_w;
		}
		for (uint32_t k = 0; k < n->cur.nt; k++) {
			const struct tsnap *c = &n->cur.t[k];
			const struct tsnap *a = dt > 0 ? snap_target(&n->prev, c->id) : NULL;
			const struct tsnap *ws = w ? snap_target(w, c->id) : NULL;
			struct tfig *tf = &f->t[f->nt++];
			double th[2][NB], wh[2][NB];

			memset(th, 0, sizeof(th));
			memset(wh, 0, sizeof(wh));
			tf->id = c->id;
			tf->node = n->id;
			tf->smart = c->smart;
			tf->rp99 = tf->wp99 = tf->rp99w = tf->wp99w = NAN;
			if (ws) {
				hist_inc(ws, c, wh);
				tf->rp99w = quantile(wh[0], 0.99);
				tf->wp99w = quantile(wh[1], 0.99);
				tf->ropsw = wh[0][NB - 1];
				tf->wopsw = wh[1][NB - 1];
				if (c->media >= 0 && ws->media >= 0)
					tf->media_w = inc(ws->media, c->media);
			}
			if (!a)
				continue;
			tf->rbps = inc(a->rbytes, c->rbytes) / dt;
			tf->wbps = inc(a->wbytes, c->wbytes) / dt;
			tf->riops = inc(a->reads, c->reads) / dt;
			tf->wiops = inc(a->writes, c->writes) / dt;
			hist_inc(a, c, th);
			tf->rp99 = quantile(th[0], 0.99);
			tf->wp99 = quantile(th[1], 0.99);
			for (int op = 0; op < 2; op++)
				for (int b = 0; b < NB; b++)
					hist[op][b] += th[op][b];
			nf->rbps += tf->rbps;
			nf->wbps += tf->wbps;
			nf->riops += tf->riops;
			nf->wiops += tf->wiops;
		}
		if (dt <= 0)
			continue;
		any = 1;
		p->rbps += nf->rbps;
		p->wbps += nf->wbps;
		p->riops += nf->riops;
		p->wiops += nf->wiops;
	}
	/*
	 * Clients over the alert window rather than the last interval: a page that shows
	 * who was busy in the last minute or two is steadier than one that empties
	 * between two bursts.
	 */
	for (uint32_t i = 0; i < d->nnodes; i++) {
		const struct dnode *n = &d->nodes[i];
		const struct snap *w = window_start(n);
		double dt;

		if (!w || n->err || n->cur.at_ns <= w->at_ns)
			continue;
		dt = (double)(n->cur.at_ns - w->at_ns) / 1e9;
		for (uint32_t k = 0; k < n->cur.nc; k++) {
			const struct csnap *c = &n->cur.c[k];
			const struct csnap *a = NULL;

			for (uint32_t j = 0; j < w->nc && !a; j++)
				if (strcmp(w->c[j].client, c->client) == 0)
					a = &w->c[j];
			client_add(f, ccap, c->client, inc(a ? a->reqs : 0, c->reqs) / dt,
				   inc(a ? a->rx : 0, c->rx) / dt, inc(a ? a->tx : 0, c->tx) / dt);
		}
	}
	/* only clients that did something in the window, busiest first */
	qsort(f->c, f->nc, sizeof(*f->c), cmp_client);
	while (f->nc && f->c[f->nc - 1].reqs <= 0 && f->c[f->nc - 1].rx + f->c[f->nc - 1].tx <= 0)
		f->nc--;
	for (int k = 0; k < 3; k++) {
		p->rq[k] = quantile(hist[0], q3[k]);
		p->wq[k] = quantile(hist[1], q3[k]);
	}
	p->t_ms = wall_ms();
	if (v->have_space) {
		p->used = (double)v->sp.used;
		p->capacity = (double)v->sp.capacity;
	}
	f->at_ms = p->t_ms;
	return any;
}

/* ---- alerts ---- */

struct alert {
	char name[40];
	const char *severity; /* "critical", "warning", "info" */
	char subject[64];
	char summary[200];
	int64_t since_ms;
};

struct alerts {
	struct alert a[MAX_ALERTS];
	unsigned n, dropped;
};

static struct alert *alert_add(struct alerts *al, const char *name, const char *severity,
			       const char *subject)
{
	struct alert *a;

	if (al->n == MAX_ALERTS) {
		al->dropped++;
		return NULL;
	}
	a = &al->a[al->n++];
	memset(a, 0, sizeof(*a));
	stk_strlcpy(a->name, name, sizeof(a->name));
	a->severity = severity;
	stk_strlcpy(a->subject, subject, sizeof(a->subject));
	return a;
}

static const struct tfig *fig_target(const struct figs *f, uint32_t id)
{
	for (uint32_t i = 0; i < f->nt; i++)
		if (f->t[i].id == id)
			return &f->t[i];
	return NULL;
}

static const struct nfig *fig_node(const struct figs *f, uint32_t id)
{
	for (uint32_t i = 0; i < f->nn; i++)
		if (f->n[i].id == id)
			return &f->n[i];
	return NULL;
}

/*
 * The seed rules and the cluster's own troubles, judged now on the state v and the
 * sampler's last figures f: what deploy/prometheus/alerts.yml fires on, without its
 * `for` delays (the page shows the condition as it is; "since" says how long). Then
 * each alert's since comes from d->since, which forgets alerts no longer active.
 * Called with d->lock held.
 */
static void evaluate(struct stk_mgmtd_dash *d, const struct view *v, const struct figs *f,
		     struct alerts *al)
{
	char subj[64];
	struct alert *a;
	int64_t now = wall_ms();

	al->n = al->dropped = 0;
	for (uint32_t i = 0; i < v->nn; i++) {
		const struct vnode *n = &v->n[i];

		snprintf(subj, sizeof(subj), "node %u", n->id);
		if (n->state != STK_NODE_ONLINE &&
		    (a = alert_add(al, "StokerNodeOffline", "critical", subj)))
			snprintf(a->summary, sizeof(a->summary),
				 "%s node %u (%s) stopped heartbeating: mgmtd marked it offline",
				 stk_mgmt_role_name(n->role), n->id, n->addr);
	}
	for (uint32_t i = 0; i < v->nt; i++) {
		const struct vtarget *t = &v->t[i];
		const struct tfig *tf = fig_target(f, t->id);

		snprintf(subj, sizeof(subj), "target %u", t->id);
		if (t->state == STK_TARGET_OFFLINE &&
		    (a = alert_add(al, "StokerTargetOffline", "critical", subj)))
			snprintf(a->summary, sizeof(a->summary),
				 "target %u of node %u is offline; its chains run without it",
				 t->id, t->node);
		if (t->state != STK_TARGET_OFFLINE && t->capacity &&
		    (double)t->used / (double)t->capacity > CAPACITY_LIMIT &&
		    (a = alert_add(al, "StokerTargetCapacityHigh", "warning", subj)))
			snprintf(a->summary, sizeof(a->summary),
				 "target %u of node %u is %.1f%% full (over 80%%)", t->id, t->node,
				 100.0 * (double)t->used / (double)t->capacity);
		if (!tf || t->state == STK_TARGET_OFFLINE)
			continue;
		if (tf->ropsw >= LATENCY_MIN_OPS && tf->rp99w > LATENCY_LIMIT_S &&
		    (a = alert_add(al, "StokerReadLatencyHigh", "warning", subj)))
			snprintf(a->summary, sizeof(a->summary),
				 "read p99 of target %u (node %u) is %.1f ms over the last minute "
				 "(over 5 ms)",
				 t->id, t->node, tf->rp99w * 1e3);
		if (tf->wopsw >= LATENCY_MIN_OPS && tf->wp99w > LATENCY_LIMIT_S &&
		    (a = alert_add(al, "StokerWriteLatencyHigh", "warning", subj)))
			snprintf(a->summary, sizeof(a->summary),
				 "write p99 of target %u (node %u) is %.1f ms over the last minute "
				 "(over 5 ms)",
				 t->id, t->node, tf->wp99w * 1e3);
		if (tf->smart == 0 && (a = alert_add(al, "StokerDiskUnhealthy", "critical", subj)))
			snprintf(a->summary, sizeof(a->summary),
				 "the device of target %u (node %u) fails its SMART health check",
				 t->id, t->node);
		if (tf->media_w > 0 &&
		    (a = alert_add(al, "StokerDiskMediaErrors", "warning", subj)))
			snprintf(a->summary, sizeof(a->summary),
				 "the device of target %u (node %u) reported %.0f new media errors",
				 t->id, t->node, tf->media_w);
	}
	if (v->have_space && v->sp.capacity &&
	    (double)v->sp.used / (double)v->sp.capacity > CAPACITY_LIMIT &&
	    (a = alert_add(al, "StokerClusterCapacityHigh", "warning", "cluster")))
		snprintf(a->summary, sizeof(a->summary), "the cluster is %.1f%% full (over 80%%)",
			 100.0 * (double)v->sp.used / (double)v->sp.capacity);
	if (v->chains[STK_MGMT_CHAIN_UNAVAILABLE] &&
	    (a = alert_add(al, "StokerChainUnavailable", "critical", "chains")))
		snprintf(a->summary, sizeof(a->summary),
			 "%u chain(s) have no working member: their files can be neither read "
			 "nor written",
			 v->chains[STK_MGMT_CHAIN_UNAVAILABLE]);
	if (v->chains[STK_MGMT_CHAIN_DEGRADED] &&
	    (a = alert_add(al, "StokerChainDegraded", "warning", "chains")))
		snprintf(a->summary, sizeof(a->summary),
			 "%u chain(s) run short of a copy (a member offline or syncing)",
			 v->chains[STK_MGMT_CHAIN_DEGRADED]);
	/* Network loss: one alert per host (nodes on one host share its counters). */
	for (uint32_t i = 0; i < v->nn; i++) {
		const struct vnode *n = &v->n[i];
		const struct nfig *nf = fig_node(f, n->id);
		int first = 1;

		if (!nf || isnan(nf->loss) || nf->sent_w < LOSS_MIN_SEGMENTS ||
		    nf->loss <= LOSS_LIMIT)
			continue;
		for (uint32_t j = 0; j < i && first; j++)
			first = !n->host[0] || strcmp(v->n[j].host, n->host) != 0 ||
				!fig_node(f, v->n[j].id) || isnan(fig_node(f, v->n[j].id)->loss);
		snprintf(subj, sizeof(subj), "host of node %u", n->id);
		if (first && (a = alert_add(al, "StokerNetworkLoss", "warning", subj)))
			snprintf(
			    a->summary, sizeof(a->summary),
			    "node %u's host retransmitted %.2f%% of its TCP segments in the last "
			    "minute (over 1%%)",
			    n->id, 100.0 * nf->loss);
	}
	for (uint32_t i = 0; i < v->nn; i++) {
		const struct vnode *n = &v->n[i];
		const struct nfig *nf = fig_node(f, n->id);

		snprintf(subj, sizeof(subj), "node %u", n->id);
		if (n->state == STK_NODE_ONLINE && nf && nf->err < 0 &&
		    (a = alert_add(al, "StokerMetricsUnreachable", "info", subj)))
			snprintf(a->summary, sizeof(a->summary),
				 "mgmtd cannot read node %u's /metrics at its RPC port + 10: %s "
				 "(its figures are missing here)",
				 n->id, strerror(-nf->err));
	}
	/* training jobs that wait on their loader: info, for it may be their CPU, not storage */
	{
		json_t *jobs = stk_mgmtd_jobs_json(d->jobs, (int64_t)(stk_now_ns() / 1000000));
		size_t i;
		json_t *e;

		json_array_foreach(jobs, i, e)
		{
			const char *name = json_string_value(json_object_get(e, "name"));
			json_int_t rank = json_integer_value(json_object_get(e, "rank"));

			if (!json_is_true(json_object_get(e, "data_bound")))
				continue;
			if (rank >= 0)
				snprintf(subj, sizeof(subj), "job %.40s rank %lld", name,
					 (long long)rank);
			else
				snprintf(subj, sizeof(subj), "job %.40s pid %lld", name,
					 (long long)json_integer_value(json_object_get(e, "pid")));
			if ((a = alert_add(al, "StokerJobDataBound", "info", subj)))
				snprintf(
				    a->summary, sizeof(a->summary),
				    "training job %.60s on %.40s waited %.0f%% of its last %.1f s "
				    "for data (its accelerators idle): compare the read latency",
				    name, json_string_value(json_object_get(e, "host")),
				    100 * json_real_value(json_object_get(e, "data_wait_ratio")),
				    json_real_value(json_object_get(e, "window_s")));
		}
		json_decref(jobs);
	}

	/* since: kept across evaluations while the alert stays active */
	for (uint32_t k = 0; k < d->nsince; k++)
		d->since[k].seen = 0;
	for (unsigned i = 0; i < al->n; i++) {
		char key[96];
		uint32_t k;

		snprintf(key, sizeof(key), "%s/%s", al->a[i].name, al->a[i].subject);
		for (k = 0; k < d->nsince; k++)
			if (strcmp(d->since[k].key, key) == 0)
				break;
		if (k == d->nsince) {
			if (d->nsince == d->capsince) {
				uint32_t nc = d->capsince ? d->capsince * 2 : 16;
				struct since *ns;

				if (nc > 4 * MAX_ALERTS ||
				    !(ns = realloc(d->since, nc * sizeof(*ns)))) {
					al->a[i].since_ms = now;
					continue;
				}
				d->since = ns;
				d->capsince = nc;
			}
			stk_strlcpy(d->since[k].key, key, sizeof(d->since[k].key));
			d->since[k].since_ms = now;
			d->nsince++;
		}
		d->since[k].seen = 1;
		al->a[i].since_ms = d->since[k].since_ms;
	}
	for (uint32_t k = 0; k < d->nsince;)
		if (!d->since[k].seen)
			d->since[k] = d->since[--d->nsince];
		else
			k++;
}

/* One round: read every online node, publish the figures, add a point. */
static void sample(struct stk_mgmtd_dash *d)
{
	struct view v;
	struct figs f;
	struct point p;
	struct alerts *al;
	int rc;

	if (view_take(d, &v))
		return;
	if (!v.leading) {
		view_free(&v);
		return;
	}
	for (uint32_t i = 0; i < v.nn; i++) {
		const struct vnode *vn = &v.n[i];
		struct dnode *n;
		struct snap s;

		if (vn->role != STK_ROLE_META && vn->role != STK_ROLE_STORAGE)
			continue;
		n = dnode_get(d, vn->id);
		if (!n)
			break;
		n->role = vn->role;
		if (strcmp(n->addr, vn->addr) != 0) {
			node_reset(n); /* another process now: its counters start anew */
			stk_strlcpy(n->addr, vn->addr, sizeof(n->addr));
			if (metrics_addr(n->addr, n->maddr, sizeof(n->maddr)))
				n->maddr[0] = 0;
		}
		if (vn->state != STK_NODE_ONLINE || !n->maddr[0]) {
			node_reset(n);
			n->err = vn->state != STK_NODE_ONLINE ? 1 : -EINVAL;
			continue;
		}
		n->err = scrape_node(n, &s);
		if (n->err == 0)
			node_push(n, &s);
	}
	rc = compute(d, &v, &f, &p);
	al = rc >= 0 ? malloc(sizeof(*al)) : NULL;
	pthread_mutex_lock(&d->lock);
	if (rc >= 0) {
		figs_free(&d->figs);
		d->figs = f;
	}
	if (rc > 0) {
		d->ring[d->head] = p;
		d->head = (d->head + 1) % STK_MGMTD_DASH_POINTS;
		if (d->count < STK_MGMTD_DASH_POINTS)
			d->count++;
	}
	if (al)
		evaluate(d, &v, &d->figs, al); /* keeps "since" going while nobody looks */
	pthread_mutex_unlock(&d->lock);
	free(al);
	view_free(&v);
}

static int leading_now_plain(struct stk_mgmtd_dash *d)
{
	int leading;

	pthread_mutex_lock(d->src.lock);
	leading = *d->src.leading;
	pthread_mutex_unlock(d->src.lock);
	return leading;
}

static void phist_free(struct phist *h)
{
	for (int c = 0; c < NCOLS; c++)
		free(h->cols[c]);
	memset(h, 0, sizeof(*h));
}

/*
 * Asks Prometheus for the last STK_MGMTD_DASH_POINTS intervals of every column and
 * publishes them, or why it could not; stops at the first query that fails (a
 * server away would otherwise cost every query its timeout).
 */
static void prom_fetch(struct stk_mgmtd_dash *d)
{
	struct phist h = {0};
	char err[256] = "";
	int64_t now = wall_ms();
	int rc = 0;

	h.step_ms = d->interval_ms;
	h.n = STK_MGMTD_DASH_POINTS;
	h.t0_ms = (now / h.step_ms) * h.step_ms - (int64_t)(h.n - 1) * h.step_ms;
	for (int c = 0; c < NCOLS && !rc; c++) {
		h.cols[c] = malloc(h.n * sizeof(double));
		if (!h.cols[c]) {
			snprintf(err, sizeof(err), "out of memory");
			rc = -ENOMEM;
			break;
		}
		rc = stk_promq_range(d->promq, prom_query[c], h.t0_ms, h.step_ms, h.n, h.cols[c],
				     err, sizeof(err));
	}
	if (rc == 0) {
		int any = 0;

		for (int c = 0; c < NCOLS && !any; c++)
			for (unsigned k = 0; k < h.n && !any; k++)
				any = !isnan(h.cols[c][k]);
		if (!any) {
			/* a Prometheus that scrapes no Stoker node: say so, draw our own */
			snprintf(err, sizeof(err),
				 "%s has none of the cluster's series in the last %u intervals: "
				 "does it scrape the nodes' /metrics?",
				 d->prom_url, h.n);
			rc = -ENODATA;
		}
	}
	h.fetched_ns = (int64_t)stk_now_ns();
	pthread_mutex_lock(&d->lock);
	if (rc == 0) {
		phist_free(&d->ph);
		d->ph = h;
		d->prom_err[0] = 0;
	} else {
		stk_strlcpy(d->prom_err, err[0] ? err : strerror(-rc), sizeof(d->prom_err));
	}
	pthread_mutex_unlock(&d->lock);
	if (rc)
		phist_free(&h);
}

static void *sampler(void *arg)
{
	struct stk_mgmtd_dash *d = arg;
	struct timespec ts;

	pthread_mutex_lock(&d->lock);
	while (!d->stop) {
		pthread_mutex_unlock(&d->lock);
		sample(d);
		if (d->promq && leading_now_plain(d))
			prom_fetch(d);
		pthread_mutex_lock(&d->lock);
		clock_gettime(CLOCK_MONOTONIC, &ts);
		ts.tv_sec += d->interval_ms / 1000;
		ts.tv_nsec += (long)(d->interval_ms % 1000) * 1000000L;
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
		while (!d->stop && pthread_cond_timedwait(&d->wake, &d->lock, &ts) == 0)
			;
	}
	pthread_mutex_unlock(&d->lock);
	return NULL;
}

/* ---- JSON ---- */

/* A number, or null for NAN and infinities (which JSON cannot hold). */
static json_t *jnum(double x)
{
	return isfinite(x) ? json_real(x) : json_null();
}

/*
 * The fill forecast: a least-squares line through the history's used bytes. Sets
 * growing, bytes_per_day and days_to_full (null when not growing) on o. Called
 * with d->lock held.
 */
static void forecast(const struct stk_mgmtd_dash *d, const struct view *v, json_t *o)
{
	double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0, t0 = 0, span, slope = NAN;
	unsigned first = (d->head + STK_MGMTD_DASH_POINTS - d->count) % STK_MGMTD_DASH_POINTS;

	for (unsigned i = 0; i < d->count; i++) {
		const struct point *p = &d->ring[(first + i) % STK_MGMTD_DASH_POINTS];
		double x;

		if (!(p->capacity > 0))
			continue;
		if (n == 0)
			t0 = (double)p->t_ms;
		x = ((double)p->t_ms - t0) / 1000.0;
		n++;
		sx += x;
		sy += p->used;
		sxx += x * x;
		sxy += x * p->used;
	}
	span = n > 0
		   ? (double)(d->ring[(d->head + STK_MGMTD_DASH_POINTS - 1) % STK_MGMTD_DASH_POINTS]
				  .t_ms -
			      t0) /
			 1000.0
		   : 0;
	if (n >= FORECAST_MIN_POINTS && n * sxx - sx * sx > 0)
		slope = (n * sxy - sx * sy) / (n * sxx - sx * sx); /* bytes a second */
	json_object_set_new(o, "points", json_integer((json_int_t)n));
	json_object_set_new(o, "span_s", jnum(span));
	json_object_set_new(o, "bytes_per_day", jnum(slope * 86400.0));
	if (!isfinite(slope)) {
		json_object_set_new(o, "growing", json_null()); /* not enough history yet */
		json_object_set_new(o, "days_to_full", json_null());
	} else if (slope > 0 && v->have_space && (double)v->sp.avail / (slope * 86400.0) < 3650) {
		json_object_set_new(o, "growing", json_true());
		json_object_set_new(o, "days_to_full",
				    jnum((double)v->sp.avail / (slope * 86400.0)));
	} else {
		json_object_set_new(o, "growing", json_false());
		json_object_set_new(o, "days_to_full", json_null());
	}
}

/* Where the leader's dashboard is: its RPC address's host, port + 10. */
static json_t *leader_ui(const char *leader)
{
	char maddr[STK_ADDR_MAX + 8], url[STK_ADDR_MAX + 32];

	if (!leader[0] || metrics_addr(leader, maddr, sizeof(maddr)))
		return json_null();
	snprintf(url, sizeof(url), "http://%s/ui", maddr);
	return json_string(url);
}

static json_t *overview(struct stk_mgmtd_dash *d)
{
	json_t *o = json_object(), *arr, *x;
	struct alerts *al = NULL;
	struct view v;
	unsigned crit = 0, warn = 0;
	char self[STK_ADDR_MAX];

	if (!o)
		return NULL;
	pthread_mutex_lock(&d->lock);
	stk_strlcpy(self, d->self, sizeof(self));
	pthread_mutex_unlock(&d->lock);
	json_object_set_new(o, "version", json_string(STK_VERSION));
	json_object_set_new(o, "self", json_string(self));
	json_object_set_new(o, "generated_ms", json_integer(wall_ms()));
	json_object_set_new(o, "interval_s", json_real(d->interval_ms / 1000.0));
	if (view_take(d, &v)) {
		json_decref(o);
		return NULL;
	}
	json_object_set_new(o, "mode", json_string(v.cluster_mode ? "cluster" : "embedded"));
	json_object_set_new(o, "leading", json_boolean(v.leading));
	json_object_set_new(o, "leader", json_string(v.leading ? self : v.leader));
	json_object_set_new(o, "leader_ui", v.leading ? json_null() : leader_ui(v.leader));
	if (!v.leading)
		goto out;
	json_object_set_new(o, "routing_version", json_integer((json_int_t)v.version));
	al = malloc(sizeof(*al));
	if (!al) {
		json_decref(o);
		o = NULL;
		goto out;
	}
	pthread_mutex_lock(&d->lock);
	evaluate(d, &v, &d->figs, al);

	x = json_object();
	json_object_set_new(x, "capacity", json_integer((json_int_t)v.sp.capacity));
	json_object_set_new(x, "used", json_integer((json_int_t)v.sp.used));
	json_object_set_new(x, "available", json_integer((json_int_t)v.sp.avail));
	json_object_set_new(x, "devices", json_integer(v.sp.devices));
	json_object_set_new(x, "used_ratio",
			    v.sp.capacity ? json_real((double)v.sp.used / (double)v.sp.capacity)
					  : json_null());
	{
		json_t *fc = json_object();

		forecast(d, &v, fc);
		json_object_set_new(x, "forecast", fc);
	}
	json_object_set_new(o, "capacity", x);

	x = json_object();
	json_object_set_new(x, "sampled_ms", json_integer(d->figs.at_ms));
	if (d->count) {
		const struct point *p =
		    &d->ring[(d->head + STK_MGMTD_DASH_POINTS - 1) % STK_MGMTD_DASH_POINTS];

		json_object_set_new(x, "read_bps", jnum(p->rbps));
		json_object_set_new(x, "write_bps", jnum(p->wbps));
		json_object_set_new(x, "read_iops", jnum(p->riops));
		json_object_set_new(x, "write_iops", jnum(p->wiops));
		json_object_set_new(x, "read_p99", jnum(p->rq[2]));
		json_object_set_new(x, "write_p99", jnum(p->wq[2]));
	}
	json_object_set_new(o, "throughput", x);

	arr = json_array();
	for (uint32_t i = 0; i < v.nn; i++) {
		const struct vnode *n = &v.n[i];
		const struct nfig *nf = fig_node(&d->figs, n->id);
		json_t *e = json_object();

		json_object_set_new(e, "id", json_integer(n->id));
		json_object_set_new(e, "role", json_string(stk_mgmt_role_name(n->role)));
		json_object_set_new(e, "state", json_string(node_state_name(n->state)));
		json_object_set_new(e, "addr", json_string(n->addr));
		json_object_set_new(e, "host", json_string(n->host));
		json_object_set_new(e, "last_seen_s", jnum(n->last_seen_s));
		json_object_set_new(e, "draining", json_boolean(n->draining));
		json_object_set_new(e, "refused", json_boolean(n->refused));
		json_object_set_new(e, "metrics",
				    json_string(n->state != STK_NODE_ONLINE ? "not read (offline)"
						: !nf			    ? "not read yet"
						: nf->err == 1		    ? "not read (offline)"
						: nf->err		    ? strerror(-nf->err)
									    : "ok"));
		if (nf && !nf->err && n->state == STK_NODE_ONLINE) {
			json_object_set_new(e, "read_bps", jnum(nf->rbps));
			json_object_set_new(e, "write_bps", jnum(nf->wbps));
			json_object_set_new(e, "read_iops", jnum(nf->riops));
			json_object_set_new(e, "write_iops", jnum(nf->wiops));
			json_object_set_new(e, "tcp_retransmit_ratio", jnum(nf->loss));
		}
		json_array_append_new(arr, e);
	}
	json_object_set_new(o, "nodes", arr);

	arr = json_array();
	for (uint32_t i = 0; i < v.nt; i++) {
		const struct vtarget *t = &v.t[i];
		const struct tfig *tf = fig_target(&d->figs, t->id);
		json_t *e = json_object();

		json_object_set_new(e, "id", json_integer(t->id));
		json_object_set_new(e, "node", json_integer(t->node));
		json_object_set_new(e, "state", json_string(target_state_name(t->state)));
		json_object_set_new(e, "path", json_string(t->path));
		json_object_set_new(e, "capacity", json_integer((json_int_t)t->capacity));
		json_object_set_new(e, "used", json_integer((json_int_t)t->used));
		json_object_set_new(e, "available", json_integer((json_int_t)t->avail));
		json_object_set_new(e, "chunks", json_integer((json_int_t)t->chunks));
		json_object_set_new(e, "sync_permille", json_integer(t->sync_permille));
		if (tf && t->state != STK_TARGET_OFFLINE) {
			json_object_set_new(e, "read_bps", jnum(tf->rbps));
			json_object_set_new(e, "write_bps", jnum(tf->wbps));
			json_object_set_new(e, "read_iops", jnum(tf->riops));
			json_object_set_new(e, "write_iops", jnum(tf->wiops));
			json_object_set_new(e, "read_p99", jnum(tf->rp99));
			json_object_set_new(e, "write_p99", jnum(tf->wp99));
			json_object_set_new(e, "smart_healthy",
					    tf->smart < 0 ? json_null() : json_boolean(tf->smart));
		}
		json_array_append_new(arr, e);
	}
	json_object_set_new(o, "targets", arr);

	x = json_object();
	json_object_set_new(x, "total", json_integer(v.chains[0] + v.chains[1] + v.chains[2]));
	json_object_set_new(x, "healthy", json_integer(v.chains[STK_MGMT_CHAIN_HEALTHY]));
	json_object_set_new(x, "degraded", json_integer(v.chains[STK_MGMT_CHAIN_DEGRADED]));
	json_object_set_new(x, "unavailable", json_integer(v.chains[STK_MGMT_CHAIN_UNAVAILABLE]));
	arr = json_array();
	for (uint32_t i = 0; i < v.nc; i++) {
		json_t *e = json_object(), *m = json_array();

		json_object_set_new(e, "id", json_integer(v.c[i].id));
		json_object_set_new(e, "state",
				    json_string(v.c[i].health == STK_MGMT_CHAIN_DEGRADED
						    ? "degraded"
						    : "unavailable"));
		for (uint8_t j = 0; j < v.c[i].ntargets; j++) {
			json_t *mt = json_object();

			json_object_set_new(mt, "target", json_integer(v.c[i].targets[j]));
			json_object_set_new(mt, "state",
					    json_string(target_state_name(v.c[i].states[j])));
			json_array_append_new(m, mt);
		}
		json_object_set_new(e, "members", m);
		json_array_append_new(arr, e);
	}
	json_object_set_new(x, "unhealthy", arr);
	json_object_set_new(o, "chains", x);

	arr = json_array();
	for (unsigned i = 0; i < al->n; i++) {
		const struct alert *a = &al->a[i];
		json_t *e = json_object();

		crit += strcmp(a->severity, "critical") == 0;
		warn += strcmp(a->severity, "warning") == 0;
		json_object_set_new(e, "name", json_string(a->name));
		json_object_set_new(e, "severity", json_string(a->severity));
		json_object_set_new(e, "subject", json_string(a->subject));
		json_object_set_new(e, "summary", json_string(a->summary));
		json_object_set_new(e, "since_ms", json_integer(a->since_ms));
		json_array_append_new(arr, e);
	}
	json_object_set_new(o, "alerts", arr);
	json_object_set_new(o, "alerts_left_out", json_integer(al->dropped));
	x = json_object();
	json_object_set_new(x, "status", json_string(crit ? "critical" : warn ? "warning" : "ok"));
	json_object_set_new(x, "critical", json_integer(crit));
	json_object_set_new(x, "warning", json_integer(warn));
	json_object_set_new(o, "health", x);

	arr = json_array();
	for (uint32_t i = 0; i < d->figs.nc && i < TOP_CLIENTS; i++) {
		const struct cfig *c = &d->figs.c[i];
		json_t *e = json_object();

		json_object_set_new(e, "client", json_string(c->client));
		/* a client's reads are what the servers sent it */
		json_object_set_new(e, "read_bps", jnum(c->tx));
		json_object_set_new(e, "write_bps", jnum(c->rx));
		json_object_set_new(e, "requests_per_s", jnum(c->reqs));
		json_array_append_new(arr, e);
	}
	json_object_set_new(o, "clients", arr);
	pthread_mutex_unlock(&d->lock);
	x = stk_mgmtd_jobs_json(d->jobs, (int64_t)(stk_now_ns() / 1000000));
	json_object_set_new(o, "jobs", x ? x : json_null());
out:
	free(al);
	view_free(&v);
	return o;
}

static json_t *series(const struct stk_mgmtd_dash *d, size_t off, int kind)
{
	json_t *arr = json_array();
	unsigned first = (d->head + STK_MGMTD_DASH_POINTS - d->count) % STK_MGMTD_DASH_POINTS;

	for (unsigned i = 0; i < d->count; i++) {
		const struct point *p = &d->ring[(first + i) % STK_MGMTD_DASH_POINTS];
		const char *base = (const char *)p + off;

		if (kind)
			json_array_append_new(arr, json_integer(p->t_ms));
		else
			json_array_append_new(arr, jnum(*(const double *)base));
	}
	return arr;
}

static json_t *history(struct stk_mgmtd_dash *d)
{
	json_t *o = json_object();
	static const struct {
		const char *name;
		size_t off;
	} cols[] = {
	    {"read_bps", offsetof(struct point, rbps)},
	    {"write_bps", offsetof(struct point, wbps)},
	    {"read_iops", offsetof(struct point, riops)},
	    {"write_iops", offsetof(struct point, wiops)},
	    {"read_p50", offsetof(struct point, rq[0])},
	    {"read_p95", offsetof(struct point, rq[1])},
	    {"read_p99", offsetof(struct point, rq[2])},
	    {"write_p50", offsetof(struct point, wq[0])},
	    {"write_p95", offsetof(struct point, wq[1])},
	    {"write_p99", offsetof(struct point, wq[2])},
	    {"used", offsetof(struct point, used)},
	    {"capacity", offsetof(struct point, capacity)},
	};
	_Static_assert(sizeof(cols) / sizeof(cols[0]) == NCOLS, "prom_query has every column");
	int leading;

	if (!o)
		return NULL;
	pthread_mutex_lock(d->src.lock);
	leading = *d->src.leading;
	pthread_mutex_unlock(d->src.lock);
	json_object_set_new(o, "leading", json_boolean(leading));
	json_object_set_new(o, "interval_s", json_real(d->interval_ms / 1000.0));
	json_object_set_new(o, "capacity_points", json_integer(STK_MGMTD_DASH_POINTS));
	pthread_mutex_lock(&d->lock);
	if (d->promq) {
		json_object_set_new(o, "prometheus", json_string(d->prom_url));
		json_object_set_new(o, "prometheus_error",
				    d->prom_err[0] ? json_string(d->prom_err) : json_null());
	}
	/* Prometheus's hour while its last fetch is fresh (it failed less than 3 rounds) */
	if (d->promq && d->ph.fetched_ns &&
	    (int64_t)stk_now_ns() - d->ph.fetched_ns <
		(int64_t)(3 * d->interval_ms + 5000) * 1000000) {
		json_t *t = json_array(), *c[NCOLS];
		unsigned first = d->ph.n;

		/* from the first time anything was known: not an hour of nothing before */
		for (unsigned k = 0; k < d->ph.n && first == d->ph.n; k++)
			for (int j = 0; j < NCOLS; j++)
				if (!isnan(d->ph.cols[j][k]))
					first = k;
		for (int j = 0; j < NCOLS; j++)
			c[j] = json_array();
		for (unsigned k = first; k < d->ph.n; k++) {
			json_array_append_new(
			    t, json_integer(d->ph.t0_ms + (int64_t)k * d->ph.step_ms));
			for (int j = 0; j < NCOLS; j++)
				json_array_append_new(c[j], jnum(d->ph.cols[j][k]));
		}
		json_object_set_new(o, "source", json_string("prometheus"));
		json_object_set_new(o, "t_ms", t);
		for (int j = 0; j < NCOLS; j++)
			json_object_set_new(o, cols[j].name, c[j]);
	} else {
		json_object_set_new(o, "source", json_string("mgmtd"));
		json_object_set_new(o, "t_ms", series(d, 0, 1));
		for (size_t i = 0; i < STK_ARRAY_SIZE(cols); i++)
			json_object_set_new(o, cols[i].name, series(d, cols[i].off, 0));
	}
	pthread_mutex_unlock(&d->lock);
	return o;
}

/* ---- the route ---- */

static const char *type_of(const char *name)
{
	const char *dot = strrchr(name, '.');

	if (!dot)
		return "application/octet-stream";
	if (strcmp(dot, ".html") == 0)
		return "text/html; charset=utf-8";
	if (strcmp(dot, ".js") == 0)
		return "text/javascript; charset=utf-8";
	if (strcmp(dot, ".css") == 0)
		return "text/css; charset=utf-8";
	if (strcmp(dot, ".svg") == 0)
		return "image/svg+xml";
	if (strcmp(dot, ".png") == 0)
		return "image/png";
	return "application/octet-stream";
}

static void answer_json(json_t *j, struct stk_metrics_http_answer *a)
{
	static const char fail[] = "{\"error\":\"out of memory\"}\n";
	char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;

	json_decref(j);
	a->type = "application/json";
	a->cache = "no-store";
	if (!s) {
		a->status = 500;
		a->body = fail;
		a->len = sizeof(fail) - 1;
		return;
	}
	a->body = s;
	a->len = strlen(s);
	a->owned = 1;
}

static int leading_now(struct stk_mgmtd_dash *d, char *leader, size_t len)
{
	int leading;

	pthread_mutex_lock(d->src.lock);
	leading = *d->src.leading;
	stk_strlcpy(leader, d->src.leader ? d->src.leader : "", len);
	pthread_mutex_unlock(d->src.lock);
	return leading;
}

/* GET /ui/api/jobs: the training jobs reporting now. */
static json_t *jobs_get(struct stk_mgmtd_dash *d)
{
	json_t *o = json_object(), *arr;
	char leader[STK_ADDR_MAX];
	int leading = leading_now(d, leader, sizeof(leader));

	if (!o)
		return NULL;
	json_object_set_new(o, "leading", json_boolean(leading));
	json_object_set_new(o, "data_bound_ratio", json_real(STK_MGMTD_JOBS_DATA_BOUND));
	arr = stk_mgmtd_jobs_json(d->jobs, (int64_t)(stk_now_ns() / 1000000));
	if (!arr) {
		json_decref(o);
		return NULL;
	}
	json_object_set_new(o, "jobs", arr);
	return o;
}

/*
 * POST /ui/api/jobs: a training job's report (jobs.h). Only the leader keeps them
 * (the others answer 503 and where the leader's dashboard is, so that the job
 * reports there). 200, or 400, 413, 429 with {"error": why}.
 */
static void jobs_post(void *ctx, const char *url, const char *body, size_t len,
		      const char *signature, struct stk_metrics_http_answer *a)
{
	struct stk_mgmtd_dash *d = ctx;
	char leader[STK_ADDR_MAX], err[256];
	json_t *o = json_object();
	int rc;

	(void)url;
	if (!leading_now(d, leader, sizeof(leader))) {
		stk_mgmtd_jobs_not_leader(d->jobs);
		json_object_set_new(o, "error",
				    json_string("this mgmtd does not lead: report to "
						"the leader's dashboard"));
		json_object_set_new(o, "leader_ui", leader_ui(leader));
		answer_json(o, a);
		a->status = 503;
		return;
	}
	rc = stk_mgmtd_jobs_report(d->jobs, body, len, signature, (int64_t)(stk_now_ns() / 1000000),
				   err, sizeof(err));
	if (rc) {
		json_object_set_new(o, "error", json_string(err));
		answer_json(o, a);
		a->status = rc == -E2BIG    ? 413
			    : rc == -ENOSPC ? 429
			    : rc == -EACCES ? 401
			    : rc == -ENOMEM ? 503
					    : 400;
		return;
	}
	json_object_set_new(o, "ok", json_true());
	answer_json(o, a);
}

static void route(void *ctx, const char *url, struct stk_metrics_http_answer *a)
{
	static const char notfound[] = "not found: the dashboard is at /ui\n";
	struct stk_mgmtd_dash *d = ctx;
	const char *name;

	if (strcmp(url, "/ui/api/overview") == 0) {
		answer_json(overview(d), a);
		return;
	}
	if (strcmp(url, "/ui/api/history") == 0) {
		answer_json(history(d), a);
		return;
	}
	if (strcmp(url, "/ui/api/jobs") == 0) {
		answer_json(jobs_get(d), a);
		return;
	}
	name = strcmp(url, "/ui") == 0 || strcmp(url, "/ui/") == 0 ? "index.html" : url + 4;
	for (const struct stk_ui_asset *f = stk_ui_assets; f->name; f++) {
		if (strcmp(f->name, name) != 0)
			continue;
		a->type = type_of(f->name);
		a->body = (const char *)f->data;
		a->len = f->len;
		a->cache = "no-cache"; /* a new release's page shows at once */
		return;
	}
	a->status = 404;
	a->type = "text/plain; charset=utf-8";
	a->body = notfound;
	a->len = sizeof(notfound) - 1;
}

/* ---- life ---- */

int stk_mgmtd_dash_create(const struct stk_mgmtd_dash_src *src, unsigned interval_ms,
			  struct stk_metrics_http *http, struct stk_mgmtd_dash **out)
{
	struct stk_mgmtd_dash *d = calloc(1, sizeof(*d));
	pthread_condattr_t ca;
	int rc;

	*out = NULL;
	if (!d)
		return -ENOMEM;
	d->src = *src;
	d->interval_ms = interval_ms ? interval_ms : STK_MGMTD_DASH_INTERVAL_MS;
	if (d->interval_ms < 100)
		d->interval_ms = 100;
	d->http = http;
	pthread_mutex_init(&d->lock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&d->wake, &ca);
	pthread_condattr_destroy(&ca);
	{
		uint8_t key[STK_AUTH_KEY_MAX];
		size_t klen = stk_daemon_key(key);

		rc = stk_mgmtd_jobs_create(0, key, klen, &d->jobs);
		memset(key, 0, sizeof(key));
	}
	rc = rc ? rc : stk_metrics_http_route(http, "/ui", route, d);
	rc =
	    rc ? rc
	       : stk_metrics_http_post(http, "/ui/api/jobs", STK_MGMTD_JOBS_BODY_MAX, jobs_post, d);
	if (rc) {
		stk_mgmtd_jobs_destroy(d->jobs);
		pthread_cond_destroy(&d->wake);
		pthread_mutex_destroy(&d->lock);
		free(d);
		return rc;
	}
	*out = d;
	return 0;
}

int stk_mgmtd_dash_prometheus(struct stk_mgmtd_dash *d, const char *url)
{
	int rc = stk_promq_create(url, &d->promq);

	if (rc == 0)
		stk_strlcpy(d->prom_url, url, sizeof(d->prom_url));
	return rc;
}

int stk_mgmtd_dash_start(struct stk_mgmtd_dash *d, const char *self)
{
	int rc;

	pthread_mutex_lock(&d->lock);
	stk_strlcpy(d->self, self, sizeof(d->self));
	pthread_mutex_unlock(&d->lock);
	rc = -pthread_create(&d->thread, NULL, sampler, d);
	if (rc == 0)
		d->started = 1;
	return rc;
}

void stk_mgmtd_dash_destroy(struct stk_mgmtd_dash *d)
{
	if (!d)
		return;
	if (d->started) {
		pthread_mutex_lock(&d->lock);
		d->stop = 1;
		pthread_cond_broadcast(&d->wake);
		pthread_mutex_unlock(&d->lock);
		pthread_join(d->thread, NULL);
	}
	for (uint32_t i = 0; i < d->nnodes; i++)
		node_reset(&d->nodes[i]);
	free(d->nodes);
	figs_free(&d->figs);
	free(d->since);
	stk_mgmtd_jobs_destroy(d->jobs);
	stk_promq_destroy(d->promq);
	phist_free(&d->ph);
	pthread_cond_destroy(&d->wake);
	pthread_mutex_destroy(&d->lock);
	free(d);
}
