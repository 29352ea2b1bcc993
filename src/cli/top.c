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
 * The HTTP client and the exposition parser are prom.c's, shared with `stoker
 * doctor`.
 */
#include "cli.h"

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "stoker/stoker.h"

#include "../common/util.h"
#include "prom.h"

#define MAX_NODES 256

/* ---- nodes ---- */

struct node {
	char maddr[80]; /* where its /metrics is */
	char role[16];
	uint32_t id; /* 0 when not from the routing table */
	struct cli_scrape prev, cur;
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
	/* The leading mgmtd's (the one that answered): a follower's figures are not the cluster's.
	 */
	if (cli_metrics_addr(stk_cluster_status_addr(st), maddr, sizeof(maddr)) == 0) {
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
		if (cli_metrics_addr(n->addr, maddr, sizeof(maddr)) == 0)
			node_add(t, maddr, cli_role_name(n->role), n->id);
	return 0;
}

static void scrape_all(struct top *t)
{
	for (int i = 0; i < t->nnodes; i++) {
		struct node *n = &t->nodes[i];
		struct cli_scrape sc = {0};
		char *body;

		n->err = cli_http_get(n->maddr, "/metrics", &body, NULL);
		if (n->err)
			continue;
		sc.text = body;
		sc.at_ns = stk_now_ns();
		n->err = cli_prom_parse(body, &sc);
		if (n->err) {
			cli_scrape_free(&sc);
			continue;
		}
		cli_scrape_free(&n->prev);
		n->prev = n->cur;
		n->cur = sc;
		if (!n->role[0] || strcmp(n->role, "?") == 0) {
			for (size_t k = 0; k < sc.n; k++)
				if (strcmp(sc.s[k].name, "stoker_build_info") == 0)
					stk_scrape_label(sc.s[k].labels, "role", n->role,
							 sizeof(n->role));
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
static void client_row(const struct cli_scrape *a, const struct cli_scrape *b, struct row *r)
{
	struct cli_filt rd = {.ops = client_read_ops};
	struct cli_filt wr = {.ops = client_write_ops};

	r->rbw = cli_prom_rate(a, b, "stoker_client_read_bytes_total", NULL);
	r->wbw = cli_prom_rate(a, b, "stoker_client_write_bytes_total", NULL);
	r->riops = cli_prom_rate(a, b, "stoker_client_ops_total", &rd);
	r->wiops = cli_prom_rate(a, b, "stoker_client_ops_total", &wr);
	r->rp99 = cli_prom_quantile(a, b, "stoker_client_op_duration_seconds", &rd, 0.99);
	r->wp99 = cli_prom_quantile(a, b, "stoker_client_op_duration_seconds", &wr, 0.99);
	r->rpc = cli_prom_rate(a, b, "stoker_client_ops_total", NULL);
	r->rpcp99 = cli_prom_quantile(a, b, "stoker_client_op_duration_seconds", NULL, 0.99);
}

/* A storage node's figures (target NULL: all its targets) or one target's. */
static void storage_row(const struct cli_scrape *a, const struct cli_scrape *b, const char *target,
			struct row *r)
{
	const char *tk = target ? "target" : NULL;
	struct cli_filt all = {{tk, NULL}, {target, NULL}, NULL};
	struct cli_filt rd = {{"op", tk}, {"read", target}, NULL};
	struct cli_filt wr = {{"op", tk}, {"write", target}, NULL};

	r->rbw = cli_prom_rate(a, b, "stoker_target_read_bytes_total", &all);
	r->wbw = cli_prom_rate(a, b, "stoker_target_write_bytes_total", &all);
	r->riops = cli_prom_rate(a, b, "stoker_target_reads_total", &all);
	r->wiops = cli_prom_rate(a, b, "stoker_target_writes_total", &all);
	r->rp99 = cli_prom_quantile(a, b, "stoker_target_io_duration_seconds", &rd, 0.99);
	r->wp99 = cli_prom_quantile(a, b, "stoker_target_io_duration_seconds", &wr, 0.99);
	/*
	 * A node's capacity from its own total, which counts a file system that several
	 * targets share once; the sum of its targets' figures would count it per target
	 * (a node without that total, an older one, gets the sum).
	 */
	if (!target && cli_prom_has(b, "stoker_node_capacity_bytes")) {
		r->used = cli_prom_sum(b, "stoker_node_used_bytes", NULL);
		r->cap = cli_prom_sum(b, "stoker_node_capacity_bytes", NULL);
		return;
	}
	r->used = cli_prom_sum(b, "stoker_target_used_bytes", &all);
	r->cap = cli_prom_sum(b, "stoker_target_capacity_bytes", &all);
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
				/* a move's new member copies beside those it relieves: not missed
				 */
				for (uint32_t m = 0;
				     !working && (mv = stk_cluster_status_move(t->st, m)); m++)
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
		struct cli_filt f = {{"target", NULL}, {id, NULL}, NULL};
		double bps = NAN;

		if (tg->state != STK_CLUSTER_TARGET_SYNCING)
			continue;
		snprintf(id, sizeof(id), "%u", tg->id);
		for (int i = 0; i < t->nnodes; i++) {
			const struct node *n = &t->nodes[i];

			if (!n->err && n->prev.text && n->cur.text &&
			    cli_prom_has(&n->cur, "stoker_target_resync_copied_bytes_total") &&
			    cli_prom_sum(&n->cur, "stoker_target_capacity_bytes", &f) > 0)
				bps = cli_prom_rate(&n->prev, &n->cur,
						    "stoker_target_resync_copied_bytes_total", &f);
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
/*
 * QoS per tenant (docs/qos.md), added up over the storage nodes: its requests per
 * second, the share of them held, and throttled time per second (the waits of
 * its held requests, summed: 2.0 is two requests held on average). Only tenants
 * with limits show; nothing when none has.
 */
static void show_qos(const struct top *t)
{
	char names[STK_QOS_TENANTS_MAX][STK_IDENT_NAME_MAX + 1];
	int nt = 0;
	double held = 0;

	for (int i = 0; i < t->nnodes; i++) {
		const struct cli_scrape *b = &t->nodes[i].cur;

		if (t->nodes[i].err || !b->text)
			continue;
		held += cli_prom_sum(b, "stoker_qos_held_requests", NULL);
		for (size_t k = 0; k < b->n; k++) {
			char name[STK_IDENT_NAME_MAX + 1];
			int j;

			if (strcmp(b->s[k].name, "stoker_qos_requests_total") != 0 ||
			    stk_scrape_label(b->s[k].labels, "tenant", name, sizeof(name)))
				continue;
			for (j = 0; j < nt && strcmp(names[j], name) != 0; j++)
				;
			if (j == nt && nt < STK_QOS_TENANTS_MAX)
				snprintf(names[nt++], sizeof(names[0]), "%s", name);
		}
	}
	if (!nt)
		return;
	printf("\nqos: %.0f requests held now\n", held);
	printf("  %-20s %9s %7s %11s\n", "TENANT", "REQ/s", "HELD", "THROTTLED");
	for (int j = 0; j < nt; j++) {
		struct cli_filt f = {.k = {"tenant"}, .v = {names[j]}};
		double req = 0, nheld = 0, secs = 0;
		char rq[16];

		for (int i = 0; i < t->nnodes; i++) {
			const struct node *n = &t->nodes[i];

			if (n->err || !n->prev.text || !n->cur.text)
				continue;
			req += cli_prom_rate(&n->prev, &n->cur, "stoker_qos_requests_total", &f);
			nheld += cli_prom_rate(&n->prev, &n->cur,
					       "stoker_qos_throttled_seconds_count", &f);
			secs += cli_prom_rate(&n->prev, &n->cur, "stoker_qos_throttled_seconds_sum",
					      &f);
		}
		fmt_num(rq, sizeof(rq), req);
		printf("  %-20s %9s %6.0f%% %9.2f s/s\n", names[j], rq,
		       req > 0 ? 100.0 * nheld / req : 0.0, secs);
	}
}

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
		const struct cli_scrape *a = &n->prev, *b = &n->cur;

		*r = (struct row){NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, 0, 0};
		if (n->err || !a->text || !b->text)
			continue;
		ok++;
		if (cli_prom_has(b, "stoker_client_ops_total")) {
			client_row(a, b, r);
			continue;
		}
		if (cli_prom_has(b, "stoker_target_capacity_bytes")) {
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
		if (cli_prom_has(b, "stoker_cluster_capacity_bytes")) {
			cluster_cap = cli_prom_sum(b, "stoker_cluster_capacity_bytes", NULL);
			cluster_used = cli_prom_sum(b, "stoker_cluster_used_bytes", NULL);
		}
		r->rpc = cli_prom_rate(a, b, "stoker_rpc_requests_total", NULL);
		r->rpcp99 = cli_prom_quantile(a, b, "stoker_rpc_duration_seconds", NULL, 0.99);
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
		const struct cli_scrape *a = &n->prev, *b = &n->cur;

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
			    stk_scrape_label(b->s[k].labels, "target", id, sizeof(id)))
				continue;
			storage_row(a, b, id, &r);
			r.rpc = r.rpcp99 = NAN;
			snprintf(tname, sizeof(tname), "  t%s", id);
			print_row(tname, "target", target_path(t, id), &r);
		}
	}
	show_chains(t);
	show_qos(t);
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
		cli_scrape_free(&t->nodes[i].prev);
		cli_scrape_free(&t->nodes[i].cur);
	}
	stk_cluster_status_free(t->st);
	free(t);
	return rc;
}
