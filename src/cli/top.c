/*
 * `stoker top`: a live view of the cluster from every daemon's /metrics.
 *
 * Each interval it scrapes every node, and from the difference between two
 * scrapes of the same node computes read and write bandwidth and IOPS (the
 * stoker_target_* counters), p99 latency (the bucket increments of the latency
 * histograms, interpolated as Prometheus's histogram_quantile does), RPC rates,
 * and shows capacity from the gauges: per target, per node and for the cluster,
 * like dstat or `juicefs stats`. --once takes two scrapes one interval apart and
 * prints one sample, for scripts. Under the table, from the cluster status: how
 * many chains are healthy, degraded (a member offline or syncing) or unavailable,
 * and each syncing target's progress and copy speed (show_chains).
 *
 * Which addresses to scrape: by default the nodes of the cluster status (and
 * mgmtd itself), each at its RPC port + STK_METRICS_PORT_OFFSET, the convention
 * `stoker up` follows; --metrics ADDR,... names them instead (their roles then
 * come from stoker_build_info). Nodes do not report their metrics address to
 * mgmtd, which keeps the registration message unchanged. --mount ADDR,... adds
 * client-side daemons (a mount's -o metrics, a gateway's --metrics): their rows
 * show what that client read and wrote, its read and write calls per second and
 * their p99, and all its calls per second and their p99 in the RPC columns; they
 * are not added into the cluster line, which counts what the servers did.
 *
 * The HTTP client is a few lines over a blocking socket: HTTP/1.0, one request
 * per connection, read to EOF. The exposition parser reads only what top needs:
 * sample lines "name{labels} value", comments skipped.
 */
#include "cli.h"

#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "stoker/stoker.h"

#include "../common/util.h"

#define MAX_NODES 256
#define HTTP_TIMEOUT_MS 2000
#define HTTP_MAX (16u << 20)

/* ---- HTTP ---- */

/* Connects to "HOST:PORT" within HTTP_TIMEOUT_MS. fd or -errno. */
static int dial(const char *addr)
{
	char host[256], port[8];
	uint16_t p;
	struct addrinfo hints, *res = NULL;
	struct timeval tv = {.tv_sec = HTTP_TIMEOUT_MS / 1000,
			     .tv_usec = (HTTP_TIMEOUT_MS % 1000) * 1000};
	int fd, rc;

	if (stk_parse_hostport(addr, host, sizeof(host), &p))
		return -EINVAL;
	snprintf(port, sizeof(port), "%u", p);
	memset(&hints, 0, sizeof(hints));
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_NUMERICSERV;
	if (getaddrinfo(host, port, &hints, &res) || !res)
		return -EHOSTUNREACH;
	fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		rc = -errno;
		goto out;
	}
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	if (connect(fd, res->ai_addr, res->ai_addrlen) < 0) {
		rc = -errno;
		close(fd);
		goto out;
	}
	rc = fd;
out:
	freeaddrinfo(res);
	return rc;
}

/* GET http://addr/path; the body (NUL-terminated, malloc'ed) if the status is 200. */
static int http_get(const char *addr, const char *path, char **body)
{
	char req[512], *buf = NULL, *b;
	size_t len = 0, cap = 0;
	int fd, n, rc;

	*body = NULL;
	fd = dial(addr);
	if (fd < 0)
		return fd;
	n = snprintf(req, sizeof(req), "GET %s HTTP/1.0\r\nHost: %s\r\nAccept: text/plain\r\n\r\n",
		     path, addr);
	rc = stk_write_all(fd, req, (size_t)n);
	if (rc)
		goto out;
	for (;;) {
		ssize_t r;
		if (cap - len < 65536) {
			char *nb;
			rc = -EFBIG;
			if (cap >= HTTP_MAX)
				goto out;
			cap = cap ? cap * 2 : 262144;
			nb = realloc(buf, cap + 1);
			rc = -ENOMEM;
			if (!nb)
				goto out;
			buf = nb;
		}
		r = read(fd, buf + len, cap - len);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			rc = errno == EAGAIN ? -ETIMEDOUT : -errno;
			goto out;
		}
		if (r == 0)
			break;
		len += (size_t)r;
	}
	rc = -EBADMSG;
	if (!buf)
		goto out;
	buf[len] = 0;
	if (strncmp(buf, "HTTP/1.", 7) != 0 || strlen(buf) < 12 || strncmp(buf + 9, "200", 3) != 0)
		goto out;
	b = strstr(buf, "\r\n\r\n");
	if (!b)
		goto out;
	b += 4;
	memmove(buf, b, strlen(b) + 1);
	*body = buf;
	buf = NULL;
	rc = 0;
out:
	close(fd);
	free(buf);
	return rc;
}

/* ---- exposition ---- */

struct sample {
	const char *name;
	const char *labels; /* the text between { and }, "" without */
	double value;
};

struct scrape {
	char *text; /* owns the strings samples point into */
	struct sample *s;
	size_t n, cap;
	uint64_t at_ns;
};

static void scrape_free(struct scrape *sc)
{
	free(sc->text);
	free(sc->s);
	memset(sc, 0, sizeof(*sc));
}

/* Splits sample lines in place; comments and malformed lines are skipped. */
static int parse_text(char *text, struct scrape *sc)
{
	char *line = text;

	while (line && *line) {
		char *nl = strchr(line, '\n'), *p = line, *v, *end;
		struct sample smp = {.labels = ""};

		if (nl)
			*nl = 0;
		if (*line == '#' || !*line)
			goto next;
		smp.name = line;
		p = line + strcspn(line, "{ ");
		if (*p == '{') {
			char *q = p + 1;
			int inq = 0;
			*p = 0;
			smp.labels = q;
			/* the closing brace outside a quoted value */
			for (; *q && (inq || *q != '}'); q++) {
				if (inq && *q == '\\' && q[1])
					q++;
				else if (*q == '"')
					inq = !inq;
			}
			if (*q != '}')
				goto next;
			*q = 0;
			v = q + 1;
		} else if (*p == ' ') {
			*p = 0;
			v = p + 1;
		} else {
			goto next;
		}
		while (*v == ' ')
			v++;
		smp.value = strtod(v, &end);
		if (end == v)
			goto next;
		if (sc->n == sc->cap) {
			size_t nc = sc->cap ? sc->cap * 2 : 1024;
			struct sample *ns = realloc(sc->s, nc * sizeof(*ns));
			if (!ns)
				return -ENOMEM;
			sc->s = ns;
			sc->cap = nc;
		}
		sc->s[sc->n++] = smp;
	next:
		line = nl ? nl + 1 : NULL;
	}
	return 0;
}

/* The value of label key in labels, unescaped into out. 0 or -ENOENT. */
static int label(const char *labels, const char *key, char *out, size_t len)
{
	size_t klen = strlen(key);
	const char *p = labels;

	while (*p) {
		const char *eq = strchr(p, '=');
		size_t o = 0;
		int match;

		if (!eq || eq[1] != '"')
			return -ENOENT;
		match = (size_t)(eq - p) == klen && strncmp(p, key, klen) == 0;
		for (p = eq + 2; *p && *p != '"'; p++) {
			char c = *p;
			if (c == '\\' && p[1]) {
				p++;
				c = *p == 'n' ? '\n' : *p;
			}
			if (match && o + 1 < len)
				out[o++] = c;
		}
		if (match) {
			out[o] = 0;
			return 0;
		}
		if (*p == '"')
			p++;
		if (*p == ',')
			p++;
	}
	return -ENOENT;
}

/*
 * Which series of a family to add up: those whose labels k[i] equal v[i] (unset k:
 * any), and, when ops is set, whose op label is one of ops (NULL-terminated).
 */
struct filt {
	const char *k[2];
	const char *v[2];
	const char *const *ops;
};

static int matches(const struct sample *s, const char *name, const struct filt *f)
{
	char buf[128];

	if (strcmp(s->name, name) != 0)
		return 0;
	for (int i = 0; f && i < 2; i++)
		if (f->k[i] &&
		    (label(s->labels, f->k[i], buf, sizeof(buf)) || strcmp(buf, f->v[i]) != 0))
			return 0;
	if (f && f->ops) {
		const char *const *op;

		if (label(s->labels, "op", buf, sizeof(buf)))
			return 0;
		for (op = f->ops; *op && strcmp(*op, buf) != 0; op++)
			;
		if (!*op)
			return 0;
	}
	return 1;
}

static double sum(const struct scrape *sc, const char *name, const struct filt *f)
{
	double v = 0;

	for (size_t i = 0; i < sc->n; i++)
		if (matches(&sc->s[i], name, f))
			v += sc->s[i].value;
	return v;
}

static int has(const struct scrape *sc, const char *name)
{
	for (size_t i = 0; i < sc->n; i++)
		if (strcmp(sc->s[i].name, name) == 0)
			return 1;
	return 0;
}

/* Per-second increase of a counter between two scrapes (a restart counts from zero). */
static double rate(const struct scrape *a, const struct scrape *b, const char *name,
		   const struct filt *f)
{
	double va = sum(a, name, f), vb = sum(b, name, f);
	double dt = (double)(b->at_ns - a->at_ns) / 1e9;

	if (dt <= 0)
		return 0;
	return (vb >= va ? vb - va : vb) / dt;
}

#define NBOUNDS 24

/* Bucket increments of histogram `name` (summed over series) between two scrapes. */
struct hist {
	double le[NBOUNDS];
	double cum[NBOUNDS];
	int n;
};

static void hist_add(struct hist *h, double le, double v)
{
	int i;

	for (i = 0; i < h->n; i++)
		if (h->le[i] == le)
			break;
	if (i == h->n) {
		if (h->n == NBOUNDS)
			return;
		h->le[h->n] = le;
		h->cum[h->n++] = 0;
	}
	h->cum[i] += v;
}

/*
 * The q-quantile of what histogram `name` observed between scrapes a and b, by
 * linear interpolation inside the bucket that holds it; NAN when nothing was
 * observed.
 */
static double quantile(const struct scrape *a, const struct scrape *b, const char *hname,
		       const struct filt *f, double q)
{
	char bucket[160], le[32];
	struct hist h = {.n = 0};
	double total, rank, prev_le = 0, prev_cum = 0;

	snprintf(bucket, sizeof(bucket), "%s_bucket", hname);
	for (int pass = 0; pass < 2; pass++) {
		const struct scrape *sc = pass ? b : a;
		for (size_t i = 0; i < sc->n; i++) {
			const struct sample *s = &sc->s[i];
			if (!matches(s, bucket, f) || label(s->labels, "le", le, sizeof(le)))
				continue;
			hist_add(&h, strcmp(le, "+Inf") == 0 ? INFINITY : strtod(le, NULL),
				 pass ? s->value : -s->value);
		}
	}
	/* sort by bound (a handful of entries) */
	for (int i = 1; i < h.n; i++)
		for (int j = i; j > 0 && h.le[j - 1] > h.le[j]; j--) {
			double t = h.le[j];
			h.le[j] = h.le[j - 1];
			h.le[j - 1] = t;
			t = h.cum[j];
			h.cum[j] = h.cum[j - 1];
			h.cum[j - 1] = t;
		}
	if (h.n == 0 || !isinf(h.le[h.n - 1]))
		return NAN;
	total = h.cum[h.n - 1];
	if (total <= 0)
		return NAN;
	rank = q * total;
	for (int i = 0; i < h.n; i++) {
		if (h.cum[i] >= rank) {
			if (isinf(h.le[i]))
				return prev_le; /* beyond the last bound: say the last bound */
			if (h.cum[i] == prev_cum)
				return h.le[i];
			return prev_le +
			       (h.le[i] - prev_le) * (rank - prev_cum) / (h.cum[i] - prev_cum);
		}
		prev_le = h.le[i];
		prev_cum = h.cum[i];
	}
	return NAN;
}

/* ---- nodes ---- */

struct node {
	char maddr[80]; /* where its /metrics is */
	char role[16];
	uint32_t id; /* 0 when not from the routing table */
	struct scrape prev, cur;
	int err; /* of the last scrape */
};

struct top {
	char cluster[STK_CLUSTER_ADDR_MAX]; /* "" with --metrics only */
	struct node nodes[MAX_NODES];
	int nnodes;
	/* The cluster status last fetched; NULL when none. */
	stk_cluster_status *st;
	int fixed; /* --metrics: the node list does not follow the routing table */
};

static int metrics_addr(const char *rpc_addr, char *out, size_t len)
{
	char host[256];
	uint16_t port;

	if (stk_parse_hostport(rpc_addr, host, sizeof(host), &port) ||
	    port + STK_METRICS_PORT_OFFSET > 65535)
		return -EINVAL;
	snprintf(out, len, strchr(host, ':') ? "[%s]:%u" : "%s:%u", host,
		 (unsigned)(port + STK_METRICS_PORT_OFFSET));
	return 0;
}

static struct node *node_find(struct top *t, const char *maddr)
{
	for (int i = 0; i < t->nnodes; i++)
		if (strcmp(t->nodes[i].maddr, maddr) == 0)
			return &t->nodes[i];
	return NULL;
}

static struct node *node_add(struct top *t, const char *maddr, const char *role, uint32_t id)
{
	struct node *n = node_find(t, maddr);

	if (!n) {
		if (t->nnodes == MAX_NODES)
			return NULL;
		n = &t->nodes[t->nnodes++];
		memset(n, 0, sizeof(*n));
		stk_strlcpy(n->maddr, maddr, sizeof(n->maddr));
	}
	if (role)
		stk_strlcpy(n->role, role, sizeof(n->role));
	n->id = id;
	return n;
}

/* Refreshes the node list from the cluster status (new nodes appear as they join). */
static int discover(struct top *t)
{
	const struct stk_cluster_node *n;
	stk_cluster_status *st;
	char maddr[80];
	int rc;

	if (!t->cluster[0])
		return 0;
	rc = stk_cluster_status_fetch(t->cluster, &st);
	if (rc)
		return rc;
	stk_cluster_status_free(t->st);
	t->st = st;
	if (t->fixed)
		return 0;
	/* The leading mgmtd's (the one that answered): a follower's figures are not the cluster's. */
	if (metrics_addr(stk_cluster_status_addr(st), maddr, sizeof(maddr)) == 0) {
		struct node *m = NULL;

		for (int i = 0; i < t->nnodes && !m; i++)
			if (strcmp(t->nodes[i].role, "mgmtd") == 0)
				m = &t->nodes[i];
		if (m && strcmp(m->maddr, maddr) != 0) {
			/* Another mgmtd leads now: its row takes the old one's place. */
			memset(m, 0, sizeof(*m));
			stk_strlcpy(m->maddr, maddr, sizeof(m->maddr));
			stk_strlcpy(m->role, "mgmtd", sizeof(m->role));
		} else if (!m) {
			node_add(t, maddr, "mgmtd", 0);
		}
	}
	for (uint32_t i = 0; (n = stk_cluster_status_node(st, i)); i++)
		if (metrics_addr(n->addr, maddr, sizeof(maddr)) == 0)
			node_add(t, maddr, cli_role_name(n->role), n->id);
	return 0;
}

static void scrape_all(struct top *t)
{
	for (int i = 0; i < t->nnodes; i++) {
		struct node *n = &t->nodes[i];
		struct scrape sc = {0};
		char *body;

		n->err = http_get(n->maddr, "/metrics", &body);
		if (n->err)
			continue;
		sc.text = body;
		sc.at_ns = stk_now_ns();
		n->err = parse_text(body, &sc);
		if (n->err) {
			scrape_free(&sc);
			continue;
		}
		scrape_free(&n->prev);
		n->prev = n->cur;
		n->cur = sc;
		if (!n->role[0] || strcmp(n->role, "?") == 0) {
			for (size_t k = 0; k < sc.n; k++)
				if (strcmp(sc.s[k].name, "stoker_build_info") == 0)
					label(sc.s[k].labels, "role", n->role, sizeof(n->role));
		}
	}
}

/* ---- display ---- */

static void fmt_rate(char *out, size_t len, double bytes_per_s)
{
	char b[32];

	if (isnan(bytes_per_s)) {
		snprintf(out, len, "-");
		return;
	}
	stk_format_size((uint64_t)(bytes_per_s + 0.5), b, sizeof(b));
	snprintf(out, len, "%s/s", b);
}

static void fmt_num(char *out, size_t len, double v)
{
	if (isnan(v))
		snprintf(out, len, "-");
	else if (v >= 10000)
		snprintf(out, len, "%.1fk", v / 1000);
	else
		snprintf(out, len, "%.0f", v);
}

static void fmt_lat(char *out, size_t len, double s)
{
	if (isnan(s))
		snprintf(out, len, "-");
	else if (s < 1e-3)
		snprintf(out, len, "%.0f us", s * 1e6);
	else if (s < 1)
		snprintf(out, len, "%.2f ms", s * 1e3);
	else
		snprintf(out, len, "%.2f s", s);
}

static void fmt_used(char *out, size_t len, double used, double cap)
{
	char c[32];

	if (cap <= 0) {
		snprintf(out, len, "-");
		return;
	}
	stk_format_size((uint64_t)cap, c, sizeof(c));
	snprintf(out, len, "%.1f%% of %s", 100.0 * used / cap, c);
}

struct row {
	double rbw, wbw, riops, wiops, rp99, wp99, rpc, rpcp99, used, cap;
};

static void print_row(const char *name, const char *role, const char *where, const struct row *r)
{
	char a[32], b[32], c[16], d[16], e[16], f[16], g[16], h[16], u[48];

	fmt_rate(a, sizeof(a), r->rbw);
	fmt_rate(b, sizeof(b), r->wbw);
	fmt_num(c, sizeof(c), r->riops);
	fmt_num(d, sizeof(d), r->wiops);
	fmt_lat(e, sizeof(e), r->rp99);
	fmt_lat(f, sizeof(f), r->wp99);
	fmt_num(g, sizeof(g), r->rpc);
	fmt_lat(h, sizeof(h), r->rpcp99);
	fmt_used(u, sizeof(u), r->used, r->cap);
	printf("%-8s %-8s %-22.22s %11s %11s %7s %7s %9s %9s %7s %9s  %s\n", name, role, where, a,
	       b, c, d, e, f, g, h, u);
}

static const char *target_path(const struct top *t, const char *id)
{
	const struct stk_cluster_target *tg;
	uint64_t v;

	if (!t->st || stk_parse_u64(id, &v))
		return "";
	for (uint32_t i = 0; (tg = stk_cluster_status_target(t->st, i)); i++)
		if (tg->id == v)
			return tg->path;
	return "";
}

/*
 * The operations of client-side daemons that move file data, by the op label each
 * frontend counts them under: the mount's read and write calls, the S3 gateway's
 * downloads and uploads. A frontend has none of the others' names, so one list
 * serves them all. Listings, heads and server-side copies are not data I/O; they
 * show in the RPC/s columns with every other call.
 */
static const char *const client_read_ops[] = {"read", "GetObject", NULL};
static const char *const client_write_ops[] = {"write", "PutObject", "UploadPart", NULL};

/* A client-side daemon's figures (stoker_client_*): what it read and wrote. */
static void client_row(const struct scrape *a, const struct scrape *b, struct row *r)
{
	struct filt rd = {.ops = client_read_ops};
	struct filt wr = {.ops = client_write_ops};

	r->rbw = rate(a, b, "stoker_client_read_bytes_total", NULL);
	r->wbw = rate(a, b, "stoker_client_write_bytes_total", NULL);
	r->riops = rate(a, b, "stoker_client_ops_total", &rd);
	r->wiops = rate(a, b, "stoker_client_ops_total", &wr);
	r->rp99 = quantile(a, b, "stoker_client_op_duration_seconds", &rd, 0.99);
	r->wp99 = quantile(a, b, "stoker_client_op_duration_seconds", &wr, 0.99);
	r->rpc = rate(a, b, "stoker_client_ops_total", NULL);
	r->rpcp99 = quantile(a, b, "stoker_client_op_duration_seconds", NULL, 0.99);
}

/* A storage node's figures (target NULL: all its targets) or one target's. */
static void storage_row(const struct scrape *a, const struct scrape *b, const char *target,
			struct row *r)
{
	const char *tk = target ? "target" : NULL;
	struct filt all = {{tk, NULL}, {target, NULL}, NULL};
	struct filt rd = {{"op", tk}, {"read", target}, NULL};
	struct filt wr = {{"op", tk}, {"write", target}, NULL};

	r->rbw = rate(a, b, "stoker_target_read_bytes_total", &all);
	r->wbw = rate(a, b, "stoker_target_write_bytes_total", &all);
	r->riops = rate(a, b, "stoker_target_reads_total", &all);
	r->wiops = rate(a, b, "stoker_target_writes_total", &all);
	r->rp99 = quantile(a, b, "stoker_target_io_duration_seconds", &rd, 0.99);
	r->wp99 = quantile(a, b, "stoker_target_io_duration_seconds", &wr, 0.99);
	/*
	 * A node's capacity from its own total, which counts a file system that several
	 * targets share once; the sum of its targets' figures would count it per target
	 * (a node without that total, an older one, gets the sum).
	 */
	if (!target && has(b, "stoker_node_capacity_bytes")) {
		r->used = sum(b, "stoker_node_used_bytes", NULL);
		r->cap = sum(b, "stoker_node_capacity_bytes", NULL);
		return;
	}
	r->used = sum(b, "stoker_target_used_bytes", &all);
	r->cap = sum(b, "stoker_target_capacity_bytes", &all);
}

static void worst(double *acc, double v)
{
	if (!isnan(v) && (isnan(*acc) || v > *acc))
		*acc = v;
}

/*
 * Replication, under the table, from the cluster status: how many chains are
 * short of a member, then each syncing target with its copy's progress (mgmtd's
 * figures) and speed (its node's stoker_target_resync_copied_bytes_total, over
 * the last interval).
 */
static void show_chains(const struct top *t)
{
	const struct stk_cluster_chain *c;
	const struct stk_cluster_target *tg;
	unsigned healthy = 0, degraded = 0, unavailable = 0;

	if (!t->st)
		return;
	for (uint32_t i = 0; (c = stk_cluster_status_chain(t->st, i)); i++) {
		const struct stk_cluster_move *mv;
		uint32_t w = 0, need = c->ntargets;

		if (!c->ntargets)
			continue;
		for (uint32_t j = 0; j < c->ntargets; j++)
			for (uint32_t k = 0; (tg = stk_cluster_status_target(t->st, k)); k++) {
				int working = tg->state == STK_CLUSTER_TARGET_SERVING ||
					      tg->state == STK_CLUSTER_TARGET_FULL;

				if (tg->id != c->targets[j])
					continue;
				w += working;
				/* a move's new member copies beside those it relieves: not missed */
				for (uint32_t m = 0; !working && (mv = stk_cluster_status_move(t->st, m));
				     m++)
					need -= mv->chain_id == c->id && mv->to_target == tg->id;
			}
		healthy += w >= need;
		degraded += w && w < need;
		unavailable += !w;
	}
	printf("\nchains: %u healthy, %u degraded, %u unavailable\n", healthy, degraded,
	       unavailable);
	for (uint32_t k = 0; (tg = stk_cluster_status_target(t->st, k)); k++) {
		char id[16], sp[32], by[32];
		struct filt f = {{"target", NULL}, {id, NULL}, NULL};
		double bps = NAN;

		if (tg->state != STK_CLUSTER_TARGET_SYNCING)
			continue;
		snprintf(id, sizeof(id), "%u", tg->id);
		for (int i = 0; i < t->nnodes; i++) {
			const struct node *n = &t->nodes[i];

			if (!n->err && n->prev.text && n->cur.text &&
			    has(&n->cur, "stoker_target_resync_copied_bytes_total") &&
			    sum(&n->cur, "stoker_target_capacity_bytes", &f) > 0)
				bps = rate(&n->prev, &n->cur, "stoker_target_resync_copied_bytes_total",
					   &f);
		}
		fmt_rate(sp, sizeof(sp), bps);
		printf("  t%-6u syncing (node %u): %u.%u%% done, %llu chunks compared, %llu "
		       "copied (%s), copying at %s\n",
		       tg->id, tg->node_id, tg->sync_permille / 10, tg->sync_permille % 10,
		       (unsigned long long)tg->sync_checked, (unsigned long long)tg->sync_copied,
		       stk_format_size(tg->sync_bytes, by, sizeof(by)), sp);
	}
}

/* Prints one sample. Returns how many nodes could be scraped twice. */
static int show(struct top *t, double interval)
{
	struct row cl = {.rp99 = NAN, .wp99 = NAN, .rpcp99 = NAN};
	double cluster_cap = NAN, cluster_used = NAN;
	struct row *rows = calloc((size_t)t->nnodes + 1, sizeof(*rows));
	char when[32], title[160];
	time_t now = time(NULL);
	struct tm tm;
	int ok = 0;

	if (!rows)
		return 0;
	localtime_r(&now, &tm);
	strftime(when, sizeof(when), "%H:%M:%S", &tm);
	if (t->cluster[0])
		snprintf(title, sizeof(title), "stk://%s", t->cluster);
	else
		snprintf(title, sizeof(title), "%d nodes", t->nnodes);
	/* Every node's figures first: the cluster line, printed first, adds them up. */
	for (int i = 0; i < t->nnodes; i++) {
		struct node *n = &t->nodes[i];
		struct row *r = &rows[i];
		const struct scrape *a = &n->prev, *b = &n->cur;

		*r = (struct row){NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, 0, 0};
		if (n->err || !a->text || !b->text)
			continue;
		ok++;
		if (has(b, "stoker_client_ops_total")) {
			client_row(a, b, r);
			continue;
		}
		if (has(b, "stoker_target_capacity_bytes")) {
			storage_row(a, b, NULL, r);
			cl.rbw += r->rbw;
			cl.wbw += r->wbw;
			cl.riops += r->riops;
			cl.wiops += r->wiops;
			cl.used += r->used;
			cl.cap += r->cap;
			/* The cluster's p99 shown is the worst node's: a bound, not a merge. */
			worst(&cl.rp99, r->rp99);
			worst(&cl.wp99, r->wp99);
		}
		/*
		 * mgmtd's totals count each device once over the whole cluster; the sum of
		 * the nodes' own would count one shared by several nodes (one machine's
		 * `stoker up --nodes`) once per node.
		 */
		if (has(b, "stoker_cluster_capacity_bytes")) {
			cluster_cap = sum(b, "stoker_cluster_capacity_bytes", NULL);
			cluster_used = sum(b, "stoker_cluster_used_bytes", NULL);
		}
		r->rpc = rate(a, b, "stoker_rpc_requests_total", NULL);
		r->rpcp99 = quantile(a, b, "stoker_rpc_duration_seconds", NULL, 0.99);
		if (strcmp(n->role, "meta") == 0) {
			cl.rpc += r->rpc; /* the cluster's metadata operations */
			worst(&cl.rpcp99, r->rpcp99);
		}
	}
	if (!isnan(cluster_cap) && cluster_cap > 0) {
		cl.cap = cluster_cap;
		cl.used = cluster_used;
	}
	printf("stoker top  %s  %s  every %.1f s\n\n", title, when, interval);
	printf("%-8s %-8s %-22s %11s %11s %7s %7s %9s %9s %7s %9s  %s\n", "NAME", "ROLE",
	       "METRICS / PATH", "READ", "WRITE", "R-IOPS", "W-IOPS", "R-P99", "W-P99", "RPC/s",
	       "RPC-P99", "USED");
	print_row("cluster", "", "(RPC: meta)", &cl);
	for (int i = 0; i < t->nnodes; i++) {
		struct node *n = &t->nodes[i];
		char name[16];
		const struct scrape *a = &n->prev, *b = &n->cur;

		snprintf(name, sizeof(name), n->id ? "node %u" : "-", n->id);
		if (n->err) {
			printf("%-8s %-8s %-22.22s unreachable: %s\n", name, n->role, n->maddr,
			       stk_strerror(n->err));
			continue;
		}
		if (!a->text || !b->text) {
			printf("%-8s %-8s %-22.22s (waiting for a second scrape)\n", name, n->role,
			       n->maddr);
			continue;
		}
		print_row(name, n->role, n->maddr, &rows[i]);
		/* its targets, in the order the node lists them */
		for (size_t k = 0; k < b->n; k++) {
			char id[16], tname[24];
			struct row r;

			if (strcmp(b->s[k].name, "stoker_target_capacity_bytes") != 0 ||
			    label(b->s[k].labels, "target", id, sizeof(id)))
				continue;
			storage_row(a, b, id, &r);
			r.rpc = r.rpcp99 = NAN;
			snprintf(tname, sizeof(tname), "  t%s", id);
			print_row(tname, "target", target_path(t, id), &r);
		}
	}
	show_chains(t);
	fflush(stdout);
	free(rows);
	return ok;
}

static volatile sig_atomic_t top_stop;

static void on_signal(int sig)
{
	(void)sig;
	top_stop = 1;
}

/* Sleeps interval seconds unless interrupted. */
static void nap(double interval)
{
	uint64_t end = stk_now_ns() + (uint64_t)(interval * 1e9);

	while (!top_stop) {
		uint64_t now = stk_now_ns();
		if (now >= end)
			break;
		poll(NULL, 0, (int)STK_MIN((end - now) / 1000000 + 1, 200));
	}
}

int cmd_top(int argc, char **argv)
{
	struct top *t = calloc(1, sizeof(*t));
	const char *cluster = NULL, *list = NULL, *mounts = NULL;
	double interval = 1.0;
	int once = 0, rc = 1, tty = isatty(1);
	struct sigaction sa;

	if (!t)
		return 1;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--cluster") == 0 && i + 1 < argc) {
			cluster = argv[++i];
		} else if (strcmp(argv[i], "--metrics") == 0 && i + 1 < argc) {
			list = argv[++i];
		} else if (strcmp(argv[i], "--mount") == 0 && i + 1 < argc) {
			mounts = argv[++i];
		} else if (strcmp(argv[i], "--interval") == 0 && i + 1 < argc) {
			char *end;
			interval = strtod(argv[++i], &end);
			if (*end || !(interval >= 0.1 && interval <= 3600)) {
				cli_err("top", "--interval must be 0.1 to 3600 seconds");
				rc = 2;
				goto out;
			}
		} else if (strcmp(argv[i], "--once") == 0) {
			once = 1;
		} else {
			rc = cli_usage("top");
			goto out;
		}
	}
	if (list)
		t->fixed = 1;
	for (int pass = 0; pass < 2; pass++) {
		const char *p = pass ? mounts : list;
		const char *opt = pass ? "--mount" : "--metrics";
		while (p && *p) {
			size_t l = strcspn(p, ",");
			char a[80];
			if (l == 0 || l >= sizeof(a)) {
				cli_err("top", "bad %s list '%s'", opt, pass ? mounts : list);
				rc = 2;
				goto out;
			}
			memcpy(a, p, l);
			a[l] = 0;
			if (!node_add(t, a, NULL, 0)) {
				cli_err("top", "at most %d addresses", MAX_NODES);
				rc = 2;
				goto out;
			}
			p += l;
			if (*p == ',')
				p++;
		}
	}
	if (cluster || !list) {
		int e = stk_cluster_resolve(cluster, t->cluster, sizeof(t->cluster));
		if (e == -ENOENT) {
			cli_err("top",
				"no cluster given: use --cluster stk://HOST:PORT or --metrics "
				"ADDR,..., set STOKER_CLUSTER, or start one with `stoker up`");
			goto out;
		}
		if (e) {
			cli_err("top", "malformed cluster address");
			goto out;
		}
		e = discover(t);
		if (e) {
			cli_err("top", "cannot reach mgmtd at %s: %s", t->cluster, stk_strerror(e));
			goto out;
		}
	}
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);

	scrape_all(t);
	for (;;) {
		int ok;

		nap(interval);
		if (top_stop)
			break;
		discover(t); /* a failure keeps the nodes we know */
		scrape_all(t);
		if (tty && !once)
			printf("\033[H\033[2J");
		ok = show(t, interval);
		if (once) {
			if (!ok)
				cli_err("top", "no node's metrics could be read (is the cluster "
					       "running with metrics on?)");
			rc = ok ? 0 : 1;
			break;
		}
		if (!tty)
			printf("\n");
		rc = 0;
	}
out:
	for (int i = 0; i < t->nnodes; i++) {
		scrape_free(&t->nodes[i].prev);
		scrape_free(&t->nodes[i].cur);
	}
	stk_cluster_status_free(t->st);
	free(t);
	return rc;
}
