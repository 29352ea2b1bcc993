/*
 * `stoker doctor`: the checks an engineer runs when "the GPUs are waiting on data",
 * one after the other, each ending in a verdict (OK, WARN, FAIL, SKIP), the figure
 * it measured and, when something is wrong, the fix in one sentence.
 *
 * Where each figure comes from, and so what it can and cannot see:
 *
 * - mgmtd's cluster status (the routing table, one call): nodes and their
 *   heartbeats, targets with their capacity, chains with their members' states.
 *   That is the cluster's own view: a node mgmtd hears is online even when this
 *   host cannot reach it.
 * - each daemon's /metrics, scraped twice --window seconds apart, at its RPC port
 *   + STK_METRICS_PORT_OFFSET as `stoker top` does: latency histograms per target
 *   (p99 over the window, or since the daemon started when the window saw no I/O),
 *   the host's TCP retransmit counters, SMART figures, the build version.
 * - what this host measures itself: an RPC round trip to every daemon, the Date
 *   header of every host's /healthz against this host's clock, and whether a
 *   datagram as large as this host's interface MTU reaches each node. These are
 *   paths from here, not between the nodes; the docs say so.
 * - this host alone: its Stoker mounts and their options, and PATH (sampled for
 *   small files, then read by `stoker bench loader` on a sample).
 *
 * Nothing here writes to the cluster or to PATH. The round trips are MGMT_LEADER
 * calls, which meta and storage answer with NOSYS (counted in their
 * stoker_rpc_errors_total): the cheapest call every daemon answers from its loop.
 *
 * The checks run one at a time on the calling thread; a check that cannot be made
 * (no cluster, metrics off, no PATH) says SKIP and why. Exit status: 0 without a
 * FAIL, 1 with one, 2 for a usage error.
 */
#include "cli.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "stoker/stoker.h"

#include "../common/util.h"
#include "fsio.h"
#include "prom.h"
#include "shard.h"

enum { DR_OK, DR_SKIP, DR_WARN, DR_FAIL }; /* in order of gravity */

static const char *const verdict_name[] = {"OK", "SKIP", "WARN", "FAIL"};

/* The checks, in the order they are printed. */
#define DR_CHECKS(X)                                                                               \
	X(MGMTD, "mgmtd")                                                                          \
	X(NODES, "nodes")                                                                          \
	X(NETWORK, "network")                                                                      \
	X(TCP, "tcp")                                                                              \
	X(CLOCK, "clock")                                                                          \
	X(MTU, "mtu")                                                                              \
	X(CAPACITY, "capacity")                                                                    \
	X(DISKS, "disks")                                                                          \
	X(LATENCY, "latency")                                                                      \
	X(CHAINS, "chains")                                                                        \
	X(VERSIONS, "versions")                                                                    \
	X(MOUNTS, "mounts")                                                                        \
	X(FILES, "files")                                                                          \
	X(LOADER, "loader")

enum {
#define DR_ENUM(id, name) C_##id,
	DR_CHECKS(DR_ENUM)
#undef DR_ENUM
	    C_N
};

static const char *const check_name[] = {
#define DR_NAME(id, name) name,
    DR_CHECKS(DR_NAME)
#undef DR_NAME
};

struct finding {
	int verdict;
	char *text;
	char *fix; /* NULL: none */
};

struct check {
	int verdict;
	char line[768]; /* the summary, or the gravest finding */
	char fix[512];
	struct finding *f;
	unsigned nf;
	unsigned main; /* the finding on the check's line */
};

/* Thresholds and switches; the defaults are documented in docs/doctor.md. */
struct dr_opts {
	const char *cluster;
	const char *path;
	int json, quick;
	double window_s;
	double full_warn, full_fail; /* percent */
	double p99_ms, rtt_ms, clock_ms, retrans_s;
	uint64_t small;
	uint64_t sample;
	uint64_t loader_files, loader_batch, gpus;
	double step_ms;
	uint64_t timeout_ms;
};

/* One daemon: a mgmtd of the address list, or a node of the routing table. */
struct ep {
	char rpc[STK_CLUSTER_ADDR_MAX];
	char maddr[STK_CLUSTER_ADDR_MAX + 8];
	char host[256]; /* its RPC address's host: endpoints on one host share a clock */
	uint32_t node;	/* 0: a mgmtd */
	int role;
	int online; /* mgmtd's view (a mgmtd: it answered) */
	struct cli_scrape a, b;
	int err; /* of the last scrape; -ENOENT until one was tried */
};

struct doctor {
	struct dr_opts o;
	struct check c[C_N];
	char cluster[STK_CLUSTER_ADDR_MAX]; /* "" when there is none to check */
	stk_cluster_status *st;
	int st_err;
	struct ep *ep;
	unsigned nep;
	double window; /* seconds between the two scrapes */
	/* from the files check, for the loader: the first folder under PATH with files */
	char loader_dir[CLI_FS_PATH + 64];
	uint64_t loader_dir_files;
};

/* ---- findings ---- */

static char *vfmt(const char *fmt, va_list ap)
{
	char *s = NULL;

	if (vasprintf(&s, fmt, ap) < 0)
		return NULL;
	return s;
}

/*
 * Records a finding of check c; its line and fix become the check's when it is
 * graver than what the check had.
 */
static void __attribute__((format(printf, 4, 5)))
find(struct check *c, int verdict, const char *fix, const char *fmt, ...)
{
	struct finding *nf = realloc(c->f, (c->nf + 1) * sizeof(*nf));
	va_list ap;
	char *text;

	va_start(ap, fmt);
	text = vfmt(fmt, ap);
	va_end(ap);
	if (!nf || !text) {
		free(text);
		if (nf)
			c->f = nf;
		return;
	}
	c->f = nf;
	nf[c->nf].verdict = verdict;
	nf[c->nf].text = text;
	nf[c->nf].fix = fix ? strdup(fix) : NULL;
	c->nf++;
	if (verdict > c->verdict || c->nf == 1) {
		c->verdict = STK_MAX(verdict, c->verdict);
		c->main = c->nf - 1;
		stk_strlcpy(c->line, text, sizeof(c->line));
		stk_strlcpy(c->fix, fix ? fix : "", sizeof(c->fix));
	}
}

/* The check's line when it found nothing wrong (or, with verdict SKIP, why not). */
static void __attribute__((format(printf, 3, 4)))
say(struct check *c, int verdict, const char *fmt, ...)
{
	va_list ap;

	if (c->nf)
		return;
	c->verdict = verdict;
	va_start(ap, fmt);
	vsnprintf(c->line, sizeof(c->line), fmt, ap);
	va_end(ap);
}

static double now_s(void)
{
	return (double)stk_now_ns() / 1e9;
}

static double wall_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void fmt_ms(char *out, size_t len, double s)
{
	if (s < 1e-3)
		snprintf(out, len, "%.0f us", s * 1e6);
	else if (s < 1)
		snprintf(out, len, "%.2f ms", s * 1e3);
	else
		snprintf(out, len, "%.2f s", s);
}

/* "node 3 (storage, 10.0.0.4:9500)" or "mgmtd 10.0.0.2:9500". */
static void ep_name(const struct ep *e, char *out, size_t len)
{
	if (e->node)
		snprintf(out, len, "node %u (%s, %s)", e->node, cli_role_name(e->role), e->rpc);
	else
		snprintf(out, len, "mgmtd %s", e->rpc);
}

/* ---- the cluster's endpoints and their /metrics ---- */

static int ep_add(struct doctor *d, const char *rpc, uint32_t node, int role, int online)
{
	struct ep *n = realloc(d->ep, (d->nep + 1) * sizeof(*n));
	struct ep *e;
	uint16_t port;

	if (!n)
		return -ENOMEM;
	d->ep = n;
	e = &n[d->nep];
	memset(e, 0, sizeof(*e));
	stk_strlcpy(e->rpc, rpc, sizeof(e->rpc));
	if (stk_parse_hostport(rpc, e->host, sizeof(e->host), &port))
		stk_strlcpy(e->host, rpc, sizeof(e->host));
	if (cli_metrics_addr(rpc, e->maddr, sizeof(e->maddr)))
		e->maddr[0] = 0;
	e->node = node;
	e->role = role;
	e->online = online;
	e->err = -ENOENT;
	d->nep++;
	return 0;
}

static int build_endpoints(struct doctor *d)
{
	const struct stk_cluster_node *n;
	const char *addr;
	int state, rc;

	for (unsigned i = 0; stk_cluster_status_mgmtd(d->st, i, &addr, &state) == 0; i++) {
		rc = ep_add(d, addr, 0, STK_CLUSTER_ROLE_MGMTD, state != STK_CLUSTER_MGMTD_DOWN);
		if (rc)
			return rc;
	}
	for (uint32_t i = 0; (n = stk_cluster_status_node(d->st, i)); i++) {
		rc = ep_add(d, n->addr, n->id, n->role, n->state == STK_CLUSTER_NODE_ONLINE);
		if (rc)
			return rc;
	}
	return 0;
}

/* Scrapes every endpoint that answered before into b (into a the first time). */
static void scrape_all(struct doctor *d, int second)
{
	for (unsigned i = 0; i < d->nep; i++) {
		struct ep *e = &d->ep[i];
		struct cli_scrape *sc = second ? &e->b : &e->a;
		char *body;

		/* a mgmtd that did not answer the status call is not waited for twice */
		if (!e->maddr[0] || (!e->node && !e->online) || (second && e->err)) {
			e->err = e->maddr[0] ? e->err : -EINVAL;
			continue;
		}
		e->err = cli_http_get(e->maddr, "/metrics", &body, NULL);
		if (e->err)
			continue;
		sc->at_ns = stk_now_ns();
		e->err = cli_prom_parse(body, sc);
	}
}

/* ---- mgmtd, nodes ---- */

static void check_mgmtd(struct doctor *d)
{
	struct check *c = &d->c[C_MGMTD];
	const char *addr, *leader = "?";
	unsigned followers = 0;
	int state;

	if (d->st_err) {
		find(c, DR_FAIL, "start mgmtd, or name the right address with --cluster",
		     "cannot reach mgmtd at %s: %s", d->cluster, stk_strerror(d->st_err));
		return;
	}
	for (unsigned i = 0; stk_cluster_status_mgmtd(d->st, i, &addr, &state) == 0; i++) {
		if (state == STK_CLUSTER_MGMTD_LEADER)
			leader = addr;
		else if (state == STK_CLUSTER_MGMTD_FOLLOWER)
			followers++;
		else
			find(c, DR_WARN, "start it again: until then one mgmtd fewer can fail over",
			     "mgmtd %s does not answer", addr);
	}
	say(c, DR_OK, "leader %s, %u follower%s, routing version %llu", leader, followers,
	    followers == 1 ? "" : "s", (unsigned long long)stk_cluster_status_version(d->st));
}

/* Whether meta node id serves a shard: always with one copy, only the leader when replicated. */
static int leads_shard(const stk_cluster_status *st, uint32_t id)
{
	const struct stk_cluster_shard *sh;

	for (uint32_t i = 0; (sh = stk_cluster_status_shard(st, i)); i++)
		if (sh->replicas <= 1 || sh->node_id == id)
			return 1;
	return 0;
}

static void check_nodes(struct doctor *d)
{
	struct check *c = &d->c[C_NODES];
	const struct stk_cluster_node *n;
	unsigned total = 0, meta = 0, storage = 0;

	for (uint32_t i = 0; (n = stk_cluster_status_node(d->st, i)); i++) {
		char fix[256];

		total++;
		meta += n->role == STK_CLUSTER_ROLE_META;
		storage += n->role == STK_CLUSTER_ROLE_STORAGE;
		if (n->refused && n->shard > 1) {
			find(c, DR_WARN,
			     "start it with the --shard of a shard the cluster has (mgmtd "
			     "--meta-shards), on that shard's store, or remove it",
			     "meta node %u (%s) was refused for shard %u: no such shard, or its "
			     "store is another namespace",
			     n->id, n->addr, n->shard);
			continue;
		}
		if (n->refused) {
			find(c, DR_WARN,
			     "start it on the store of shard 1's namespace, or remove it",
			     "meta node %u (%s) was refused: its store is another namespace", n->id,
			     n->addr);
			continue;
		}
		if (n->state == STK_CLUSTER_NODE_ONLINE)
			continue;
		if (n->role == STK_CLUSTER_ROLE_STORAGE)
			snprintf(fix, sizeof(fix),
				 "start it again; if it is gone for good, `stoker admin "
				 "remove-node %u` replaces its targets",
				 n->id);
		else if (!leads_shard(d->st, n->id)) {
			/* a replicated shard's follower or spare: the leader serves without it */
			find(c, DR_WARN,
			     "start it again: the metadata has one copy less until then "
			     "(docs/meta-replication.md)",
			     "meta node %u (%s) is offline: no heartbeat reached mgmtd for %.1f s",
			     n->id, n->addr, (double)n->last_seen_ms / 1000.0);
			continue;
		} else
			snprintf(
			    fix, sizeof(fix),
			    "start it again: the namespace it serves is unavailable until then");
		find(c, DR_FAIL, fix,
		     "node %u (%s, %s) is offline: no heartbeat reached mgmtd for %.1f s", n->id,
		     cli_role_name(n->role), n->addr, (double)n->last_seen_ms / 1000.0);
	}
	if (!total)
		find(c, DR_FAIL, "start meta and storage nodes with --mgmtd pointing at mgmtd",
		     "no node has registered with mgmtd");
	say(c, DR_OK, "%u nodes online (%u meta, %u storage), heartbeats reach mgmtd", total, meta,
	    storage);
}

/* ---- network: round trips, retransmits, clocks, MTU ---- */

#define PINGS 5

/*
 * Times PINGS calls to the daemon at addr (after one to warm the connection): a
 * MGMT_LEADER, answered by mgmtd and refused (NOSYS) by the others, either way a
 * full round trip through its RPC loop. The median and the largest, in seconds.
 */
static int ping(const char *addr, unsigned timeout_ms, double *med, double *max)
{
	double t[PINGS];
	int rc = stk_cluster_ping(addr, timeout_ms, PINGS, t);

	if (rc)
		return rc;
	for (int i = 1; i < PINGS; i++)
		for (int j = i; j > 0 && t[j - 1] > t[j]; j--) {
			double x = t[j];
			t[j] = t[j - 1];
			t[j - 1] = x;
		}
	*med = t[PINGS / 2];
	*max = t[PINGS - 1];
	return 0;
}

static void check_network(struct doctor *d)
{
	struct check *c = &d->c[C_NETWORK];
	double worst = -1, sum = 0;
	unsigned ok = 0;
	char wname[STK_CLUSTER_ADDR_MAX + 64] = "";

	for (unsigned i = 0; i < d->nep; i++) {
		struct ep *e = &d->ep[i];
		char name[STK_CLUSTER_ADDR_MAX + 64], a[32], b[32];
		double med, max;
		int rc;

		if (!e->node && !e->online)
			continue; /* the mgmtd check says so */
		ep_name(e, name, sizeof(name));
		rc = ping(e->rpc, (unsigned)d->o.timeout_ms, &med, &max);
		if (rc) {
			find(c, DR_FAIL,
			     "check that the daemon runs and that the network (routes, firewall) "
			     "lets this host reach it",
			     "%s does not answer from this host: %s", name, stk_strerror(rc));
			continue;
		}
		ok++;
		sum += med;
		fmt_ms(a, sizeof(a), med);
		fmt_ms(b, sizeof(b), max);
		if (med * 1e3 > d->o.rtt_ms)
			find(c, DR_WARN,
			     "look for a congested or long path, or a loaded host: nodes of one "
			     "cluster should be well under a millisecond apart",
			     "%s: round trip %s (median of %d, worst %s), above %.2f ms", name, a,
			     PINGS, b, d->o.rtt_ms);
		if (med > worst) {
			worst = med;
			snprintf(wname, sizeof(wname), "%s", name);
		}
	}
	if (!ok && !c->nf) {
		say(c, DR_SKIP, "no daemon to reach");
		return;
	}
	{
		char a[32], b[32];

		fmt_ms(a, sizeof(a), ok ? sum / ok : 0);
		fmt_ms(b, sizeof(b), worst);
		say(c, DR_OK,
		    "%u daemons answer from this host: RPC round trip %s on average, slowest %s at "
		    "%s",
		    ok, a, wname, b);
	}
}

/* The endpoint of each host whose second scrape worked, for host-wide figures. */
static int first_of_host(const struct doctor *d, unsigned i)
{
	for (unsigned j = 0; j < i; j++)
		if (!d->ep[j].err && strcmp(d->ep[j].host, d->ep[i].host) == 0)
			return 0;
	return !d->ep[i].err;
}

static void check_tcp(struct doctor *d)
{
	struct check *c = &d->c[C_TCP];
	unsigned hosts = 0;
	double worst = 0;

	for (unsigned i = 0; i < d->nep; i++) {
		struct ep *e = &d->ep[i];
		double r, in;

		if (!first_of_host(d, i) ||
		    !cli_prom_has(&e->b, "stoker_host_tcp_retransmitted_segments_total"))
			continue;
		hosts++;
		r = cli_prom_rate(&e->a, &e->b, "stoker_host_tcp_retransmitted_segments_total",
				  NULL);
		in = cli_prom_rate(&e->a, &e->b, "stoker_host_tcp_in_errors_total", NULL);
		worst = STK_MAX(worst, r);
		if (r > d->o.retrans_s || in > d->o.retrans_s)
			find(c, DR_WARN,
			     "look for a lossy link (cable, optics, a NIC's errors in `ethtool "
			     "-S`) or a congested switch port",
			     "host %s retransmitted %.1f TCP segments/s and received %.1f in "
			     "error/s over %.1f s",
			     e->host, r, in, d->window);
	}
	if (!hosts) {
		say(c, DR_SKIP, "no daemon's /metrics could be read (metrics off?)");
		return;
	}
	say(c, DR_OK, "%u host%s, at most %.1f TCP retransmits/s over %.1f s", hosts,
	    hosts == 1 ? "" : "s", worst, d->window);
}

/*
 * A host's clock against this one's, from the Date header of its /healthz (whole
 * seconds): this host asks again and again until the second the header gives
 * moves on. The tick happened between the send of the request before and the
 * reply to this one, so the offset is known to within half that span (a few
 * milliseconds on a LAN), not to a second.
 */
struct clk {
	struct ep *e;
	time_t last;
	double last_send;
	int done, err;
	double offset, within;
};

#define CLOCK_POLL_S 1.5

static void check_clock(struct doctor *d)
{
	struct check *c = &d->c[C_CLOCK];
	struct clk *k = calloc(d->nep ? d->nep : 1, sizeof(*k));
	unsigned n = 0, pending, measured = 0;
	double end = now_s() + CLOCK_POLL_S, worst = 0;

	if (!k) {
		say(c, DR_SKIP, "out of memory");
		return;
	}
	for (unsigned i = 0; i < d->nep; i++)
		if (first_of_host(d, i))
			k[n++].e = &d->ep[i];
	pending = n;
	while (pending && now_s() < end) {
		for (unsigned i = 0; i < n; i++) {
			struct clk *h = &k[i];
			double s, r;
			char *body;
			time_t date;

			if (h->done)
				continue;
			s = wall_s();
			h->err = cli_http_get(h->e->maddr, "/healthz", &body, &date);
			r = wall_s();
			free(body);
			if (!h->err && !date)
				h->err = -ENOMSG;
			if (h->err) {
				h->done = 1;
				pending--;
				continue;
			}
			if (h->last && date > h->last) {
				h->offset = (double)date - (h->last_send + r) / 2;
				h->within = (r - h->last_send) / 2;
				h->done = 1;
				pending--;
				continue;
			}
			h->last = date;
			h->last_send = s;
		}
		/* a few hundred requests a second at most: enough to split a second finely */
		poll(NULL, 0, 2);
	}
	for (unsigned i = 0; i < n; i++) {
		struct clk *h = &k[i];
		char a[32], b[32];

		if (!h->done || h->err)
			continue;
		measured++;
		worst = STK_MAX(worst, fabs(h->offset));
		fmt_ms(a, sizeof(a), fabs(h->offset));
		fmt_ms(b, sizeof(b), h->within);
		if ((fabs(h->offset) - h->within) * 1e3 > d->o.clock_ms)
			find(c, DR_WARN,
			     "run chrony or ntpd on every host and check it is in sync (`chronyc "
			     "tracking`)",
			     "host %s's clock is %s %s this host's (within %s)", h->e->host, a,
			     h->offset > 0 ? "ahead of" : "behind", b);
	}
	if (!measured) {
		say(c, DR_SKIP, "no host's /healthz gave a Date header to compare (metrics off?)");
	} else {
		char a[32];

		fmt_ms(a, sizeof(a), worst);
		say(c, DR_OK, "%u host%s within %s of this host's clock (limit %.0f ms)", measured,
		    measured == 1 ? "" : "s", a, d->o.clock_ms);
	}
	free(k);
}

/*
 * Sends a datagram of size bytes, never fragmented, to the node's RPC port,
 * where no UDP socket listens, up to three times: the node's "port unreachable"
 * (ECONNREFUSED on this socket) proves it arrived. *arrived 1 or 0; -EMSGSIZE
 * when it does not fit this host's own path; -errno.
 */
static int probe(int fd, size_t size, int *arrived)
{
	static char buf[65536];

	*arrived = 0;
	for (int i = 0; i < 3; i++) {
		struct pollfd p = {.fd = fd, .events = POLLIN};
		char b;

		if (send(fd, buf, size, 0) < 0)
			return errno == ECONNREFUSED ? (*arrived = 1, 0) : -errno;
		if (poll(&p, 1, 300) > 0 && recv(fd, &b, 1, MSG_DONTWAIT) < 0 &&
		    errno == ECONNREFUSED) {
			*arrived = 1;
			return 0;
		}
	}
	return 0;
}

struct mtu_host {
	char host[256];
	int mtu;	/* this host's path MTU towards it */
	int big, small; /* arrived: a datagram filling that MTU; a small one */
	int err;
};

/*
 * This host's MTU towards each node (the kernel's route MTU: its interface's, or
 * a lower one learnt), and whether a frame of that size reaches the node: a
 * node whose interface (or a switch between) takes less drops full frames
 * silently; TCP then stalls on any path whose MSS was not clamped.
 */
static int mtu_probe(const char *addr, struct mtu_host *m)
{
	struct addrinfo hints = {.ai_socktype = SOCK_DGRAM, .ai_flags = AI_NUMERICSERV};
	struct sockaddr_storage ss;
	struct addrinfo *res = NULL;
	char host[256], port[8];
	socklen_t len;
	uint16_t pt;
	int fd, rc, v6, pm, hdr;

	if (stk_parse_hostport(addr, host, sizeof(host), &pt))
		return -EINVAL;
	snprintf(port, sizeof(port), "%u", pt);
	if (getaddrinfo(host, port, &hints, &res) || !res)
		return -EHOSTUNREACH;
	memcpy(&ss, res->ai_addr, res->ai_addrlen);
	len = res->ai_addrlen;
	freeaddrinfo(res);
	v6 = ss.ss_family == AF_INET6;
	fd = socket(ss.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	pm = v6 ? IPV6_PMTUDISC_PROBE : IP_PMTUDISC_PROBE;
	rc = -errno;
	if (setsockopt(fd, v6 ? IPPROTO_IPV6 : IPPROTO_IP, v6 ? IPV6_MTU_DISCOVER : IP_MTU_DISCOVER,
		       &pm, sizeof(pm)) < 0 ||
	    connect(fd, (struct sockaddr *)&ss, len) < 0)
		goto out;
	len = sizeof(m->mtu);
	if (getsockopt(fd, v6 ? IPPROTO_IPV6 : IPPROTO_IP, v6 ? IPV6_MTU : IP_MTU, &m->mtu, &len) <
	    0)
		goto out;
	hdr = v6 ? 48 : 28;
	rc = m->mtu > hdr && m->mtu <= 65535 ? probe(fd, (size_t)(m->mtu - hdr), &m->big) : -EINVAL;
	if (rc == 0 && !m->big)
		rc = probe(fd, 64, &m->small);
out:
	close(fd);
	return rc;
}

static int loopback(const char *host)
{
	struct in_addr a4;
	struct in6_addr a6;

	if (inet_pton(AF_INET, host, &a4) == 1)
		return (ntohl(a4.s_addr) >> 24) == 127;
	if (inet_pton(AF_INET6, host, &a6) == 1)
		return IN6_IS_ADDR_LOOPBACK(&a6);
	return strcmp(host, "localhost") == 0;
}

static void check_mtu(struct doctor *d)
{
	struct check *c = &d->c[C_MTU];
	struct mtu_host *m = calloc(d->nep ? d->nep : 1, sizeof(*m));
	unsigned n = 0, probed = 0;
	int lo = 0, hi = 0;

	if (!m) {
		say(c, DR_SKIP, "out of memory");
		return;
	}
	for (unsigned i = 0; i < d->nep; i++) {
		struct ep *e = &d->ep[i];
		struct mtu_host *h;
		unsigned j;

		if (loopback(e->host))
			continue;
		for (j = 0; j < n && strcmp(m[j].host, e->host); j++)
			;
		if (j < n)
			continue;
		h = &m[n++];
		stk_strlcpy(h->host, e->host, sizeof(h->host));
		h->err = mtu_probe(e->rpc, h);
		if (h->err)
			continue;
		probed++;
		lo = lo ? STK_MIN(lo, h->mtu) : h->mtu;
		hi = STK_MAX(hi, h->mtu);
		if (!h->big && h->small)
			find(
			    c, DR_WARN,
			    "set one MTU on every interface and switch port of the storage network",
			    "frames of %d bytes (this host's MTU towards it) do not reach %s, "
			    "small ones do: an interface or switch on the way has a smaller MTU",
			    h->mtu, h->host);
		else if (!h->big)
			find(c, DR_WARN,
			     "let UDP and ICMP through between the hosts to check the MTU",
			     "%s answered no probe (ICMP or UDP filtered?): MTU not checked",
			     h->host);
	}
	if (probed && lo != hi)
		find(c, DR_WARN, "set one MTU on every interface of the storage network",
		     "this host reaches the nodes through interfaces of different MTUs (%d to %d)",
		     lo, hi);
	if (!n)
		say(c, DR_SKIP,
		    "every daemon is on this host (loopback): no network path to check");
	else if (!probed)
		say(c, DR_SKIP, "no path could be probed");
	else
		say(c, DR_OK, "MTU %d towards %u host%s; full-size frames reach each", hi, probed,
		    probed == 1 ? "" : "s");
	free(m);
}

/* ---- capacity, disks, latency, chains, versions ---- */

static void check_capacity(struct doctor *d)
{
	struct check *c = &d->c[C_CAPACITY];
	const struct stk_cluster_target *t, *u;
	const struct stk_cluster_space *sp = stk_cluster_status_space(d->st);
	double fullest = -1;
	uint32_t fid = 0, fnode = 0, known = 0;

	for (uint32_t i = 0; (t = stk_cluster_status_target(d->st, i)); i++) {
		char ids[128], fix[256], fr[32], cap[32];
		double pct;
		size_t o = 0;
		int dup = 0;

		if (!t->capacity)
			continue;
		/* targets of one node on one file system: reported once, by the first */
		for (uint32_t j = 0; j < i && (u = stk_cluster_status_target(d->st, j)); j++)
			dup |=
			    t->dev && u->dev == t->dev && u->node_id == t->node_id && u->capacity;
		if (dup)
			continue;
		known++;
		pct = 100.0 * (double)t->used / (double)t->capacity;
		if (pct > fullest) {
			fullest = pct;
			fid = t->id;
			fnode = t->node_id;
		}
		for (uint32_t j = i; (u = stk_cluster_status_target(d->st, j)); j++)
			if (j == i || (t->dev && u->dev == t->dev && u->node_id == t->node_id))
				o +=
				    (size_t)snprintf(ids + o, o < sizeof(ids) ? sizeof(ids) - o : 0,
						     "%s%u", o ? "," : "", u->id);
		snprintf(fix, sizeof(fix),
			 "add capacity (a target or a node), delete data, or move its chains to "
			 "other nodes with `stoker admin drain-node %u`",
			 t->node_id);
		stk_format_size(t->avail, fr, sizeof(fr));
		stk_format_size(t->capacity, cap, sizeof(cap));
		if (t->state == STK_CLUSTER_TARGET_FULL || pct >= d->o.full_fail)
			find(c, DR_FAIL, fix,
			     "target%s %s on node %u %s %.0f%% full (%s free of %s)%s",
			     strchr(ids, ',') ? "s" : "", ids, t->node_id,
			     strchr(ids, ',') ? "are" : "is", pct, fr, cap,
			     t->state == STK_CLUSTER_TARGET_FULL ? ": refusing writes (ENOSPC)"
								 : "");
		else if (pct >= d->o.full_warn)
			find(c, DR_WARN, fix,
			     "target%s %s on node %u %s %.0f%% full (%s free of %s)",
			     strchr(ids, ',') ? "s" : "", ids, t->node_id,
			     strchr(ids, ',') ? "are" : "is", pct, fr, cap);
	}
	if (!known) {
		say(c, DR_SKIP, "no target has reported its capacity yet");
		return;
	}
	{
		char a[32];

		say(c, DR_OK, "fullest target %u on node %u at %.0f%%; cluster %.0f%% of %s used",
		    fid, fnode, fullest,
		    sp->capacity ? 100.0 * (double)sp->used / (double)sp->capacity : 0.0,
		    stk_format_size(sp->capacity, a, sizeof(a)));
	}
}

static void check_disks(struct doctor *d)
{
	struct check *c = &d->c[C_DISKS];
	unsigned devices = 0;
	double wear = 0, temp = 0;

	for (unsigned i = 0; i < d->nep; i++) {
		const struct ep *e = &d->ep[i];
		const struct cli_scrape *b = &e->b;

		if (e->role != STK_CLUSTER_ROLE_STORAGE || e->err)
			continue;
		for (size_t k = 0; k < b->n; k++) {
			char dev[128], tg[16], seen[128], fix[256];
			const struct cli_sample *s = &b->s[k];
			/* one target's series: a device under several has one each */
			struct cli_filt f = {{"device", "target"}, {dev, tg}, NULL};
			int dup = 0;
			double w, tc, me;

			if (strcmp(s->name, "stoker_device_smart_healthy") ||
			    stk_scrape_label(s->labels, "device", dev, sizeof(dev)) ||
			    stk_scrape_label(s->labels, "target", tg, sizeof(tg)))
				continue;
			/* a device under several targets: once */
			for (size_t j = 0; j < k && !dup; j++)
				dup = !strcmp(b->s[j].name, s->name) &&
				      !stk_scrape_label(b->s[j].labels, "device", seen,
							sizeof(seen)) &&
				      !strcmp(seen, dev);
			if (dup)
				continue;
			devices++;
			w = cli_prom_sum(b, "stoker_device_wear_ratio", &f);
			tc = cli_prom_sum(b, "stoker_device_temperature_celsius", &f);
			me = cli_prom_sum(b, "stoker_device_media_errors_total", &f);
			wear = STK_MAX(wear, w);
			temp = STK_MAX(temp, tc);
			snprintf(fix, sizeof(fix),
				 "replace the device; first `stoker admin drain-node %u` so that "
				 "its chains keep every copy",
				 e->node);
			if (s->value < 0.5)
				find(c, DR_FAIL, fix,
				     "device %s (target %s, node %u) fails its SMART health check",
				     dev, tg, e->node);
			else if (me > 0)
				find(c, DR_WARN, fix,
				     "device %s (target %s, node %u) reports %.0f media errors",
				     dev, tg, e->node, me);
			else if (w >= 0.9)
				find(c, DR_WARN, fix,
				     "device %s (target %s, node %u) has used %.0f%% of its rated "
				     "endurance",
				     dev, tg, e->node, 100 * w);
			else if (tc >= 70)
				find(c, DR_WARN, "check the server's airflow and fans",
				     "device %s (target %s, node %u) runs at %.0f C", dev, tg,
				     e->node, tc);
		}
	}
	if (!devices) {
		say(c, DR_SKIP,
		    "no SMART figures: smartctl missing on the storage nodes, or their targets not "
		    "on block devices");
		return;
	}
	say(c, DR_OK, "%u device%s pass SMART; most worn %.0f%%, hottest %.0f C", devices,
	    devices == 1 ? "" : "s", 100 * wear, temp);
}

/* Observations of histogram series f between a and b. */
static double hist_count(const struct cli_scrape *a, const struct cli_scrape *b, const char *h,
			 const struct cli_filt *f)
{
	char name[160];

	snprintf(name, sizeof(name), "%s_count", h);
	return cli_prom_sum(b, name, f) - (a ? cli_prom_sum(a, name, f) : 0);
}

/*
 * Fewer operations in the window: the p99 since the node started; fewer since
 * then too: no verdict on that target.
 */
#define LAT_MIN_OPS 20

static void check_latency(struct doctor *d)
{
	static const char *const hname = "stoker_target_io_duration_seconds";
	static const char *const ops[] = {"read", "write"};
	struct check *c = &d->c[C_LATENCY];
	const struct cli_scrape none = {0};
	double worst[2] = {-1, -1};
	char wt[2][16] = {"", ""};
	unsigned targets = 0;

	for (unsigned i = 0; i < d->nep; i++) {
		const struct ep *e = &d->ep[i];

		if (e->role != STK_CLUSTER_ROLE_STORAGE || e->err)
			continue;
		for (size_t k = 0; k < e->b.n; k++) {
			char tg[16];

			if (strcmp(e->b.s[k].name, "stoker_target_capacity_bytes") ||
			    stk_scrape_label(e->b.s[k].labels, "target", tg, sizeof(tg)))
				continue;
			targets++;
			for (int op = 0; op < 2; op++) {
				struct cli_filt f = {{"target", "op"}, {tg, ops[op]}, NULL};
				const struct cli_scrape *a = &e->a;
				const char *when = "in the last";
				double n = hist_count(a, &e->b, hname, &f), q;
				char fix[256], ms[32], since[64];

				if (n < LAT_MIN_OPS) {
					a = &none;
					n = hist_count(NULL, &e->b, hname, &f);
					when = "since node start (idle now),";
				}
				/* one slow fsync is not a slow target */
				if (n < LAT_MIN_OPS)
					continue;
				q = cli_prom_quantile(a, &e->b, hname, &f, 0.99);
				if (isnan(q))
					continue;
				if (q > worst[op]) {
					worst[op] = q;
					snprintf(wt[op], sizeof(wt[op]), "%s", tg);
				}
				if (q * 1e3 <= d->o.p99_ms)
					continue;
				fmt_ms(ms, sizeof(ms), q);
				if (a == &none)
					snprintf(since, sizeof(since), "%s", when);
				else
					snprintf(since, sizeof(since), "%s %.1f s,", when,
						 d->window);
				snprintf(fix, sizeof(fix),
					 "check node %u's device (`iostat -x`, SMART) and its "
					 "load; `stoker top` shows it live",
					 e->node);
				find(c, q * 1e3 > 10 * d->o.p99_ms ? DR_FAIL : DR_WARN, fix,
				     "target %s on node %u: %s p99 %s %s %.0f %ss, above %.1f ms",
				     tg, e->node, ops[op], ms, since, n, ops[op], d->o.p99_ms);
			}
		}
	}
	if (!targets) {
		say(c, DR_SKIP,
		    "no storage node's /metrics could be read (metrics off, or nodes down?)");
		return;
	}
	if (worst[0] < 0 && worst[1] < 0) {
		say(c, DR_SKIP, "no target has served %d reads or writes yet", LAT_MIN_OPS);
		return;
	}
	{
		char a[32] = "-", b[32] = "-";

		if (worst[0] >= 0)
			fmt_ms(a, sizeof(a), worst[0]);
		if (worst[1] >= 0)
			fmt_ms(b, sizeof(b), worst[1]);
		say(c, DR_OK,
		    "%u targets; worst read p99 %s (target %s), worst write p99 %s (target %s); "
		    "limit %.1f ms",
		    targets, a, wt[0][0] ? wt[0] : "-", b, wt[1][0] ? wt[1] : "-", d->o.p99_ms);
	}
}

static const struct stk_cluster_target *target_by_id(const stk_cluster_status *st, uint32_t id)
{
	const struct stk_cluster_target *t;

	for (uint32_t i = 0; (t = stk_cluster_status_target(st, i)); i++)
		if (t->id == id)
			return t;
	return NULL;
}

/* Unsettled changes held this long are worth a warning; a failover settles sooner. */
#define UNSETTLED_WARN_S 10.0
#define UNSETTLED_FAIL_S 300.0

/*
 * Changes a storage node applied that its successor has not taken (its
 * stoker_node_unsettled_* series): their copies differ until it does. A warning
 * once the oldest is UNSETTLED_WARN_S old, a failure after UNSETTLED_FAIL_S or
 * when the node holds as many as it can (it refuses new changes then).
 */
static void check_unsettled(struct doctor *d, struct check *c)
{
	for (unsigned i = 0; i < d->nep; i++) {
		const struct ep *e = &d->ep[i];
		double n, age, cap;
		int full;

		if (e->role != STK_CLUSTER_ROLE_STORAGE || e->err ||
		    !cli_prom_has(&e->b, "stoker_node_unsettled_changes"))
			continue;
		n = cli_prom_sum(&e->b, "stoker_node_unsettled_changes", NULL);
		age = cli_prom_sum(&e->b, "stoker_node_unsettled_oldest_seconds", NULL);
		cap = cli_prom_sum(&e->b, "stoker_node_unsettled_capacity", NULL);
		full = cap > 0 && n >= cap;
		if (n < 1 || (age < UNSETTLED_WARN_S && !full))
			continue;
		find(c, full || age >= UNSETTLED_FAIL_S ? DR_FAIL : DR_WARN,
		     "see the node's log for the chain and why its successor does not take them "
		     "(a full disk: free space there); they settle by themselves once it does",
		     "node %u holds %.0f change%s its successors have not taken, the oldest %.0f "
		     "s%s",
		     e->node, n, n == 1 ? "" : "s", age,
		     full ? ": as many as it can, new changes are refused" : "");
	}
}

static void check_chains(struct doctor *d)
{
	struct check *c = &d->c[C_CHAINS];
	const struct stk_cluster_chain *ch;
	unsigned nchains = 0, minlen = ~0u, maxlen = 0;

	for (uint32_t i = 0; (ch = stk_cluster_status_chain(d->st, i)); i++) {
		const struct stk_cluster_move *mv = NULL;
		uint32_t w = 0, need = ch->ntargets;
		char lack[256] = "", fix[384] = "";
		size_t o = 0;

		if (!ch->ntargets)
			continue;
		nchains++;
		minlen = STK_MIN(minlen, ch->ntargets);
		maxlen = STK_MAX(maxlen, ch->ntargets);
		for (uint32_t m = 0; (mv = stk_cluster_status_move(d->st, m)); m++)
			if (mv->chain_id == ch->id)
				break;
		for (uint32_t j = 0; j < ch->ntargets; j++) {
			const struct stk_cluster_target *t = target_by_id(d->st, ch->targets[j]);
			int working = t && (t->state == STK_CLUSTER_TARGET_SERVING ||
					    t->state == STK_CLUSTER_TARGET_FULL);

			if (working) {
				w++;
				continue;
			}
			/* a move's new member copies beside those it relieves: not missed */
			if (mv && ch->targets[j] == mv->to_target) {
				need--;
				continue;
			}
			if (!t)
				continue;
			if (t->state == STK_CLUSTER_TARGET_SYNCING)
				o += (size_t)snprintf(
				    lack + o, o < sizeof(lack) ? sizeof(lack) - o : 0,
				    "%starget %u on node %u syncing (%u%%)", o ? ", " : "", t->id,
				    t->node_id, t->sync_permille / 10);
			else
				o += (size_t)snprintf(lack + o,
						      o < sizeof(lack) ? sizeof(lack) - o : 0,
						      "%starget %u on node %u offline",
						      o ? ", " : "", t->id, t->node_id);
		}
		if (w >= need)
			continue;
		if (!w) {
			/* one copy: no loss to accept, the chain waits for its node */
			if (ch->ntargets == 1)
				snprintf(fix, sizeof(fix),
					 "bring its node back: with one copy per chain its files "
					 "wait for it");
			else
				snprintf(fix, sizeof(fix),
					 "bring back a node of its targets; if their data is gone "
					 "for good, `stoker admin accept-loss %u --yes-lose-data`",
					 ch->id);
			find(c, DR_FAIL, fix,
			     "chain %u has no working member (%s): its files can be neither read "
			     "nor written",
			     ch->id, lack);
		} else {
			find(c, DR_WARN,
			     "start the offline node again (its targets resync by themselves) or "
			     "`stoker admin remove-node ID` to replace its targets",
			     "chain %u: %u of %u members working (%s)", ch->id, w, need, lack);
		}
	}
	check_unsettled(d, c);
	if (!nchains) {
		say(c, DR_SKIP, "no chains yet");
		return;
	}
	if (maxlen <= 1)
		say(c, DR_OK, "%u chain%s of one target each (no replicas), all serving", nchains,
		    nchains == 1 ? "" : "s");
	else if (minlen == maxlen)
		say(c, DR_OK, "%u chain%s of %u replicas, all complete", nchains,
		    nchains == 1 ? "" : "s", maxlen);
	else
		say(c, DR_OK, "%u chains of %u to %u replicas, all complete", nchains, minlen,
		    maxlen);
}

static void check_versions(struct doctor *d)
{
	struct check *c = &d->c[C_VERSIONS];
	unsigned n = 0;

	for (unsigned i = 0; i < d->nep; i++) {
		const struct ep *e = &d->ep[i];
		char v[64], name[STK_CLUSTER_ADDR_MAX + 64];

		if (e->err)
			continue;
		for (size_t k = 0; k < e->b.n; k++) {
			if (strcmp(e->b.s[k].name, "stoker_build_info") ||
			    stk_scrape_label(e->b.s[k].labels, "version", v, sizeof(v)))
				continue;
			n++;
			if (strcmp(v, STOKER_VERSION) == 0)
				break;
			ep_name(e, name, sizeof(name));
			find(c, DR_WARN,
			     "run one version everywhere: upgrade one node at a time, clients last",
			     "%s runs %s, this client %s", name, v, STOKER_VERSION);
			break;
		}
	}
	if (!n) {
		say(c, DR_SKIP, "no daemon's /metrics could be read (metrics off?)");
		return;
	}
	say(c, DR_OK, "%u daemon%s run %s, as this client", n, n == 1 ? "" : "s", STOKER_VERSION);
}

/* ---- this host: mounts ---- */

/* The value of -o option key in a comma list, into out; 1 if present. */
static int mount_opt(const char *list, const char *key, char *out, size_t len)
{
	size_t kl = strlen(key);
	const char *p = list;

	while (p && *p) {
		size_t l = strcspn(p, ",");

		if (l >= kl && strncmp(p, key, kl) == 0 && (l == kl || p[kl] == '=')) {
			size_t vl = l > kl ? l - kl - 1 : 0;

			if (out && len) {
				vl = STK_MIN(vl, len - 1);
				memcpy(out, p + kl + 1, l > kl ? vl : 0);
				out[l > kl ? vl : 0] = 0;
			}
			return 1;
		}
		p += l;
		if (*p == ',')
			p++;
	}
	return 0;
}

/* The -o options of the mount daemon serving the file system of device dev. */
static int daemon_opts(dev_t dev, char *out, size_t len)
{
	char rt[128], pf[256], buf[8192];
	long pid;
	ssize_t n;
	int fd;

	out[0] = 0;
	cli_runtime_dir(rt, sizeof(rt));
	snprintf(pf, sizeof(pf), "%s/mount-%u:%u.pid", rt, major(dev), minor(dev));
	fd = open(pf, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return -ENOENT;
	buf[n] = 0;
	pid = strtol(buf, NULL, 10);
	if (pid <= 0)
		return -ENOENT;
	snprintf(pf, sizeof(pf), "/proc/%ld/cmdline", pid);
	fd = open(pf, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return -ENOENT;
	buf[n] = 0;
	/* argv: "stoker" "mount" ... "-o" "a,b" ...; several -o lists join with commas */
	for (char *a = buf; a < buf + n; a += strlen(a) + 1) {
		char *next = a + strlen(a) + 1;

		if (strcmp(a, "-o") == 0 && next < buf + n) {
			size_t o = strlen(out);

			snprintf(out + o, len - o, "%s%s", o ? "," : "", next);
		} else if (strncmp(a, "-o", 2) == 0 && a[2]) {
			size_t o = strlen(out);

			snprintf(out + o, len - o, "%s%s", o ? "," : "", a + 2);
		}
	}
	return 0;
}

/* Undoes /proc/mounts' octal escapes (\040 for a space) in place. */
static void unescape(char *s)
{
	char *o = s;

	for (; *s; s++) {
		if (s[0] == '\\' && s[1] >= '0' && s[1] <= '7' && s[2] >= '0' && s[2] <= '7' &&
		    s[3] >= '0' && s[3] <= '7') {
			*o++ = (char)((s[1] - '0') * 64 + (s[2] - '0') * 8 + (s[3] - '0'));
			s += 3;
		} else {
			*o++ = *s;
		}
	}
	*o = 0;
}

static void check_mounts(struct doctor *d)
{
	struct check *c = &d->c[C_MOUNTS];
	FILE *f = fopen("/proc/self/mounts", "re");
	char line[8192];
	unsigned n = 0, other = 0;
	size_t cl = strlen(d->cluster);

	if (!f) {
		say(c, DR_SKIP, "cannot read /proc/self/mounts: %s", stk_strerror(-errno));
		return;
	}
	while (fgets(line, sizeof(line), f)) {
		char src[4096], mp[4096], type[64], kopts[2048], o[4096], v[64], ra[32];
		struct stat st;
		int ro;

		if (sscanf(line, "%4095s %4095s %63s %2047s", src, mp, type, kopts) != 4 ||
		    strcmp(type, "fuse.stoker") != 0)
			continue;
		unescape(mp);
		unescape(src);
		/* the cluster checked is the one whose mounts count: "stk://ADDR[/SUB]" */
		if (cl &&
		    (strncmp(src, "stk://", 6) != 0 || strncmp(src + 6, d->cluster, cl) != 0 ||
		     (src[6 + cl] && src[6 + cl] != '/'))) {
			other++;
			continue;
		}
		n++;
		if (stat(mp, &st) < 0) {
			char fix[4200];

			snprintf(fix, sizeof(fix), "`stoker umount %s`, then mount it again", mp);
			find(c, DR_FAIL, fix, "mount %s: %s (its daemon is gone)", mp,
			     stk_strerror(-errno));
			continue;
		}
		ro = mount_opt(kopts, "ro", NULL, 0);
		if (daemon_opts(st.st_dev, o, sizeof(o)))
			o[0] = 0;
		if ((mount_opt(o, "attr_timeout", v, sizeof(v)) && strtod(v, NULL) < 1) ||
		    (mount_opt(o, "entry_timeout", v, sizeof(v)) && strtod(v, NULL) < 1))
			find(c, DR_WARN,
			     ro ? "a read-only data set can be cached for long: -o "
				  "attr_timeout=60,entry_timeout=60"
				: "keep the default 1 s (or more for data that does not change)",
			     "mount %s: -o %s=%s: every stat and open asks meta again", mp,
			     strstr(o, "attr_timeout") ? "attr_timeout" : "entry_timeout", v);
		if (mount_opt(o, "flush", NULL, 0))
			find(
			    c, DR_WARN, "drop -o flush unless programs on it use POSIX locks",
			    "mount %s: -o flush: every close waits for a round trip to the cluster",
			    mp);
		if (mount_opt(o, "nouring", NULL, 0))
			find(c, DR_WARN, "drop -o nouring",
			     "mount %s: -o nouring: requests go through /dev/fuse, not io_uring "
			     "queues",
			     mp);
		if (mount_opt(o, "max_threads", v, sizeof(v)) && strtoul(v, NULL, 10) < 8)
			find(c, DR_WARN, "drop -o max_threads (the default fits the cores)",
			     "mount %s: -o max_threads=%s: too few to keep a read-ahead window in "
			     "flight",
			     mp, v);
		{
			char p[128];
			int fd;
			ssize_t r;

			snprintf(p, sizeof(p), "/sys/class/bdi/%u:%u/read_ahead_kb",
				 major(st.st_dev), minor(st.st_dev));
			fd = open(p, O_RDONLY | O_CLOEXEC);
			r = fd >= 0 ? read(fd, ra, sizeof(ra) - 1) : -1;
			if (fd >= 0)
				close(fd);
			if (r > 0) {
				char fix[256];

				ra[r] = 0;
				snprintf(fix, sizeof(fix),
					 "mount as root (which sets -o readahead, 16M by default) "
					 "or `echo 16384 > %s`",
					 p);
				if (strtoul(ra, NULL, 10) < 1024)
					find(c, DR_WARN, fix,
					     "mount %s: kernel readahead %lu KiB: large files are "
					     "read in small requests",
					     mp, strtoul(ra, NULL, 10));
			}
		}
	}
	fclose(f);
	if (!n)
		say(c, DR_SKIP, "no Stoker mount of %s on this host%s",
		    cl ? d->cluster : "a cluster",
		    other ? " (mounts of other clusters not checked)" : "");
	else
		say(c, DR_OK, "%u Stoker mount%s, no option that slows reading%s", n,
		    n == 1 ? "" : "s", other ? " (mounts of other clusters not checked)" : "");
}

/* ---- PATH: small files, then the loader on a sample ---- */

struct walk {
	struct cli_fs *fs;
	char **queue; /* folders still to list, breadth first; [qhead, qlen) malloc'ed */
	size_t qhead, qlen, qcap;
	const char *dir; /* the folder being listed */
	uint64_t files, small, shards, bytes, limit, threshold;
	uint64_t *sizes;
	uint64_t dir_files; /* in the folder being listed */
	int more;	    /* the walk stopped before the end of the tree */
};

#define WALK_MAX_DIRS 100000 /* folders queued at most: plenty to sample from */

static int walk_entry(void *ctx, const char *name, int is_dir)
{
	struct walk *w = ctx;
	char p[CLI_FS_PATH];
	struct stat st;

	if ((size_t)snprintf(p, sizeof(p), "%s/%s", strcmp(w->dir, "/") ? w->dir : "", name) >=
	    sizeof(p))
		return 0;
	if (is_dir) {
		if (w->qlen == w->qcap) {
			size_t cap = w->qcap ? w->qcap * 2 : 64;
			char **q;

			if (cap > WALK_MAX_DIRS) {
				w->more = 1;
				return 0;
			}
			q = realloc(w->queue, cap * sizeof(*w->queue));
			if (!q)
				return -ENOMEM;
			w->queue = q;
			w->qcap = cap;
		}
		w->queue[w->qlen] = strdup(p);
		return w->queue[w->qlen++] ? 0 : -ENOMEM;
	}
	if (w->files >= w->limit) {
		w->more = 1;
		return 1;
	}
	if (cli_fs_stat(w->fs, p, &st) || !S_ISREG(st.st_mode))
		return 0;
	w->sizes[w->files++] = (uint64_t)st.st_size;
	w->bytes += (uint64_t)st.st_size;
	w->small += (uint64_t)st.st_size < w->threshold;
	w->shards += strncmp(name, CLI_SHARD_PREFIX, strlen(CLI_SHARD_PREFIX)) == 0;
	w->dir_files++;
	return 0;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

#define FILES_MIN 1000 /* fewer files than this: per-file costs do not matter */

static void check_files(struct doctor *d)
{
	struct check *c = &d->c[C_FILES];
	struct cli_fs fs = {0};
	struct walk w = {0};
	char path[CLI_FS_PATH], a[32], b[32], th[32];
	struct stat st;
	int rc;

	if (!d->o.path) {
		say(c, DR_SKIP, "no PATH given");
		return;
	}
	if (cli_fs_resolve("doctor", d->o.path, &fs, path)) {
		find(c, DR_FAIL, "name a folder of the data set", "%s: cannot be reached",
		     d->o.path);
		return;
	}
	rc = cli_fs_stat(&fs, path, &st);
	if (rc || !S_ISDIR(st.st_mode)) {
		find(c, DR_FAIL, "name a folder of the data set", "%s: %s", d->o.path,
		     rc ? stk_strerror(rc) : "not a folder");
		goto out;
	}
	w.fs = &fs;
	w.limit = d->o.sample;
	w.threshold = d->o.small;
	w.sizes = calloc(w.limit, sizeof(*w.sizes));
	w.queue = malloc(64 * sizeof(*w.queue));
	if (!w.sizes || !w.queue || !(w.queue[0] = strdup(path))) {
		say(c, DR_SKIP, "out of memory");
		goto out;
	}
	w.qcap = 64;
	w.qlen = 1;
	while (w.qhead < w.qlen && w.files < w.limit) {
		/* the queue may move while its folder is listed: this one is ours now */
		char *dir = w.queue[w.qhead++];

		w.dir = dir;
		w.dir_files = 0;
		rc = cli_fs_list(&fs, w.dir, walk_entry, &w);
		if (rc < 0) {
			find(c, DR_WARN, "check the permissions of the data set",
			     "cannot list %s: %s", w.dir, stk_strerror(rc));
			free(dir);
			continue;
		}
		/* the loader reads one folder's files: the first that holds a few */
		if (!d->loader_dir[0] && w.dir_files >= 2) {
			/* "stk://HOST:PORT" or "stk://" before a path in a cluster */
			int pre = 0;

			if (strncmp(d->o.path, "stk://", 6) == 0) {
				const char *slash = strchr(d->o.path + 6, '/');

				pre = slash ? (int)(slash - d->o.path) : (int)strlen(d->o.path);
			}
			snprintf(d->loader_dir, sizeof(d->loader_dir), "%.*s%s", pre, d->o.path,
				 w.dir);
			d->loader_dir_files = w.dir_files;
		}
		free(dir);
	}
	w.more |= w.qhead < w.qlen;
	if (!w.files) {
		say(c, DR_SKIP, "%s holds no files", d->o.path);
		goto out;
	}
	qsort(w.sizes, w.files, sizeof(*w.sizes), cmp_u64);
	stk_format_size(w.sizes[w.files / 2], a, sizeof(a));
	stk_format_size(w.bytes / w.files, b, sizeof(b));
	stk_format_size(w.threshold, th, sizeof(th));
	if (w.shards * 2 >= w.files) {
		say(c, DR_OK, "%llu files sampled, packed in shards already (median %s)",
		    (unsigned long long)w.files, a);
	} else if (w.files >= FILES_MIN && w.small * 2 >= w.files) {
		char fix[CLI_FS_PATH + 256];

		snprintf(fix, sizeof(fix),
			 "pack them into shards (`stoker pack %s DST`) and read the shards "
			 "(docs/python.md)",
			 d->o.path);
		find(c, DR_WARN, fix,
		     "%llu of %llu%s files sampled are under %s (median %s, mean %s): each one "
		     "read costs metadata round trips of its own",
		     (unsigned long long)w.small, (unsigned long long)w.files, w.more ? "+" : "",
		     th, a, b);
	} else {
		say(c, DR_OK, "%llu%s files sampled, %llu under %s (median %s, mean %s)",
		    (unsigned long long)w.files, w.more ? "+" : "", (unsigned long long)w.small, th,
		    a, b);
	}
out:
	free(w.sizes);
	while (w.queue && w.qhead < w.qlen)
		free(w.queue[w.qhead++]);
	free(w.queue);
	cli_fs_release(&fs);
}

/* The most accelerators the loader search tries (bench loader's default). */
#define LOADER_MAX "64"

/* The number after "key": in a line of JSON, or NAN. */
static double json_num(const char *json, const char *key)
{
	char k[64];
	const char *p;

	snprintf(k, sizeof(k), "\"%s\":", key);
	p = strstr(json, k);
	return p ? strtod(p + strlen(k), NULL) : NAN;
}

/*
 * Runs `stoker bench loader` (this binary) on the folder the files check chose,
 * reading at most --loader-files of its files, never writing there, and reads
 * its one line of JSON.
 */
static int run_loader(struct doctor *d, char *out, size_t len)
{
	char files[24], steps[] = "4", batch[24], step[32], accel[24];
	const char *argv[24];
	int p[2], st, n = 0;
	size_t got = 0;
	pid_t pid;

	snprintf(files, sizeof(files), "%llu", (unsigned long long)d->o.loader_files);
	snprintf(batch, sizeof(batch), "%llu", (unsigned long long)d->o.loader_batch);
	snprintf(step, sizeof(step), "%g", d->o.step_ms);
	snprintf(accel, sizeof(accel), "%llu", (unsigned long long)d->o.gpus);
	argv[n++] = "stoker";
	argv[n++] = "bench";
	argv[n++] = "loader";
	argv[n++] = "--json";
	argv[n++] = "--no-generate";
	argv[n++] = "--max-files";
	argv[n++] = files;
	argv[n++] = "--steps";
	argv[n++] = steps;
	argv[n++] = "--batch";
	argv[n++] = batch;
	argv[n++] = "--compute-ms";
	argv[n++] = step;
	argv[n++] = "--max-accelerators";
	argv[n++] = LOADER_MAX;
	if (d->o.gpus) {
		argv[n++] = "--accelerators";
		argv[n++] = accel;
	}
	argv[n++] = d->loader_dir;
	argv[n] = NULL;
	if (pipe2(p, O_CLOEXEC) < 0)
		return -errno;
	fflush(NULL);
	pid = fork();
	if (pid < 0) {
		close(p[0]);
		close(p[1]);
		return -errno;
	}
	if (pid == 0) {
		dup2(p[1], 1);
		execv("/proc/self/exe", (char *const *)argv);
		_exit(127);
	}
	close(p[1]);
	while (got + 1 < len) {
		ssize_t r = read(p[0], out + got, len - 1 - got);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		got += (size_t)r;
	}
	out[got] = 0;
	close(p[0]);
	while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
		;
	return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -EIO;
}

static void check_loader(struct doctor *d)
{
	struct check *c = &d->c[C_LOADER];
	char out[4096];
	double n, sps, mbs, au;

	if (!d->o.path) {
		say(c, DR_SKIP, "no PATH given");
		return;
	}
	if (d->o.quick) {
		say(c, DR_SKIP, "--quick");
		return;
	}
	if (!d->loader_dir[0]) {
		say(c, DR_SKIP, "no folder under %s holds files to read", d->o.path);
		return;
	}
	if (run_loader(d, out, sizeof(out)) || isnan(n = json_num(out, "au90_accelerators"))) {
		find(c, DR_FAIL, "run `stoker bench loader --no-generate PATH` to see the error",
		     "the loader benchmark on %s failed", d->loader_dir);
		return;
	}
	sps = json_num(out, "samples_per_s");
	mbs = json_num(out, "mb_per_s");
	au = json_num(out, "au_min");
	if (d->o.gpus && n < 1) {
		char fix[256];

		snprintf(fix, sizeof(fix),
			 "storage or this client is the bottleneck: see the latency and network "
			 "lines above, pack small files, or add nodes");
		find(c, DR_WARN, fix,
		     "%llu accelerators reading %s (%llu files, batch %llu, %g ms steps) were "
		     "%.0f%% busy at worst, under 90%% (%.0f samples/s, %.1f MB/s)",
		     (unsigned long long)d->o.gpus, d->loader_dir,
		     (unsigned long long)STK_MIN(d->o.loader_files, d->loader_dir_files),
		     (unsigned long long)d->o.loader_batch, d->o.step_ms, 100 * au, sps, mbs);
		return;
	}
	say(c, DR_OK,
	    "%.0f%s accelerator%s kept 90%% busy reading %s (%llu files, batch %llu, %g ms steps): "
	    "%.0f samples/s, %.1f MB/s",
	    n, !d->o.gpus && n >= strtod(LOADER_MAX, NULL) ? " (the most tried)" : "",
	    n == 1 ? "" : "s", d->loader_dir,
	    (unsigned long long)STK_MIN(d->o.loader_files, d->loader_dir_files),
	    (unsigned long long)d->o.loader_batch, d->o.step_ms, sps, mbs);
}

/* ---- output ---- */

static void print_text(const struct doctor *d)
{
	for (int i = 0; i < C_N; i++) {
		const struct check *c = &d->c[i];

		printf("%-4s  %-8s  %s", verdict_name[c->verdict], check_name[i], c->line);
		if (c->verdict >= DR_WARN && c->fix[0])
			printf(": %s", c->fix);
		printf("\n");
		/* the other findings under the gravest, one a line */
		for (unsigned k = 0; k < c->nf; k++)
			if (k != c->main)
				printf("                %s %s%s%s\n", verdict_name[c->f[k].verdict],
				       c->f[k].text, c->f[k].fix ? ": " : "",
				       c->f[k].fix ? c->f[k].fix : "");
	}
}

static void print_json(const struct doctor *d, unsigned count[4])
{
	printf("{\"cluster\": ");
	cli_json_str(stdout, d->cluster);
	printf(", \"version\": ");
	cli_json_str(stdout, STOKER_VERSION);
	printf(", \"checks\": [");
	for (int i = 0; i < C_N; i++) {
		const struct check *c = &d->c[i];

		printf("%s\n  {\"check\": ", i ? "," : "");
		cli_json_str(stdout, check_name[i]);
		printf(", \"verdict\": ");
		cli_json_str(stdout, verdict_name[c->verdict]);
		printf(", \"text\": ");
		cli_json_str(stdout, c->line);
		printf(", \"fix\": ");
		cli_json_str(stdout, c->verdict >= DR_WARN ? c->fix : "");
		printf(", \"findings\": [");
		for (unsigned k = 0; k < c->nf; k++) {
			printf("%s{\"verdict\": ", k ? ", " : "");
			cli_json_str(stdout, verdict_name[c->f[k].verdict]);
			printf(", \"text\": ");
			cli_json_str(stdout, c->f[k].text);
			printf(", \"fix\": ");
			cli_json_str(stdout, c->f[k].fix ? c->f[k].fix : "");
			printf("}");
		}
		printf("]}");
	}
	printf("\n], \"ok\": %u, \"skip\": %u, \"warn\": %u, \"fail\": %u}\n", count[DR_OK],
	       count[DR_SKIP], count[DR_WARN], count[DR_FAIL]);
}

/* ---- the command ---- */

static int parse_num(const char *s, double lo, double hi, double *out)
{
	char *end;
	double v = strtod(s, &end);

	if (end == s || *end || !(v >= lo && v <= hi))
		return -EINVAL;
	*out = v;
	return 0;
}

static int parse_args(int argc, char **argv, struct dr_opts *o)
{
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		int rc = 0;

		if (strcmp(a, "--json") == 0) {
			o->json = 1;
			continue;
		}
		if (strcmp(a, "--quick") == 0) {
			o->quick = 1;
			continue;
		}
		if (a[0] != '-' && !o->path) {
			o->path = a;
			continue;
		}
		if (!v)
			return -EINVAL;
		i++;
		if (strcmp(a, "--cluster") == 0)
			o->cluster = v;
		else if (strcmp(a, "--window") == 0)
			rc = parse_num(v, 0.1, 600, &o->window_s);
		else if (strcmp(a, "--full-warn") == 0)
			rc = parse_num(v, 1, 100, &o->full_warn);
		else if (strcmp(a, "--full-fail") == 0)
			rc = parse_num(v, 1, 100, &o->full_fail);
		else if (strcmp(a, "--p99-ms") == 0)
			rc = parse_num(v, 0.01, 1e6, &o->p99_ms);
		else if (strcmp(a, "--rtt-ms") == 0)
			rc = parse_num(v, 0.001, 1e6, &o->rtt_ms);
		else if (strcmp(a, "--clock-ms") == 0)
			rc = parse_num(v, 1, 1e7, &o->clock_ms);
		else if (strcmp(a, "--retrans") == 0)
			rc = parse_num(v, 0, 1e9, &o->retrans_s);
		else if (strcmp(a, "--small-file") == 0)
			rc = stk_parse_size(v, &o->small);
		else if (strcmp(a, "--sample") == 0)
			rc = stk_parse_u64(v, &o->sample) || !o->sample || o->sample > 10000000
				 ? -EINVAL
				 : 0;
		else if (strcmp(a, "--gpus") == 0)
			rc = stk_parse_u64(v, &o->gpus) || !o->gpus || o->gpus > 256 ? -EINVAL : 0;
		else if (strcmp(a, "--loader-files") == 0)
			rc = stk_parse_u64(v, &o->loader_files) || !o->loader_files ? -EINVAL : 0;
		else if (strcmp(a, "--loader-batch") == 0)
			rc = stk_parse_u64(v, &o->loader_batch) || !o->loader_batch ||
				     o->loader_batch > 100000
				 ? -EINVAL
				 : 0;
		else if (strcmp(a, "--loader-step-ms") == 0)
			rc = parse_num(v, 0, 600000, &o->step_ms);
		else if (strcmp(a, "--timeout-ms") == 0)
			rc = stk_parse_u64(v, &o->timeout_ms) || o->timeout_ms < 100 ||
				     o->timeout_ms > 600000
				 ? -EINVAL
				 : 0;
		else
			return -EINVAL;
		if (rc)
			return -EINVAL;
	}
	return o->full_warn <= o->full_fail ? 0 : -EINVAL;
}

int cmd_doctor(int argc, char **argv)
{
	struct doctor *d = calloc(1, sizeof(*d));
	unsigned count[4] = {0};
	const char *cluster;
	char tmo[24];
	int rc;

	if (!d)
		return 1;
	d->o = (struct dr_opts){.window_s = 2,
				.full_warn = 80,
				.full_fail = 95,
				.p99_ms = 5,
				.rtt_ms = 1,
				.clock_ms = 100,
				.retrans_s = 10,
				.small = 256 << 10,
				.sample = 10000,
				.loader_files = 256,
				.loader_batch = 32,
				.step_ms = 224,
				.timeout_ms = 3000};
	if (parse_args(argc, argv, &d->o)) {
		free(d);
		return cli_usage("doctor");
	}
	/* a node that accepts connections and never answers must cost seconds, not minutes */
	snprintf(tmo, sizeof(tmo), "%llu", (unsigned long long)d->o.timeout_ms);
	setenv("STOKER_RPC_TIMEOUT_MS", tmo, 0);

	/* the cluster: --cluster, else PATH's when it names one, else the default */
	cluster = d->o.cluster;
	if (!cluster && d->o.path && strncmp(d->o.path, "stk://", 6) == 0 && d->o.path[6] != '/')
		cluster = d->o.path;
	rc = stk_cluster_resolve(cluster, d->cluster, sizeof(d->cluster));
	if (rc) {
		d->cluster[0] = 0;
		if (cluster) {
			cli_err("doctor", "malformed cluster address '%s'", cluster);
			free(d);
			return 2;
		}
	}
	if (d->cluster[0]) {
		double t0;

		d->st_err = stk_cluster_status_fetch(d->cluster, &d->st);
		if (!d->st_err)
			d->st_err = build_endpoints(d);
		check_mgmtd(d);
		if (!d->st_err) {
			scrape_all(d, 0);
			t0 = now_s();
			/* what this host measures fills the window between the two scrapes */
			check_network(d);
			check_mtu(d);
			check_clock(d);
			while (now_s() < t0 + d->o.window_s)
				poll(NULL, 0,
				     (int)STK_MAX(1, (t0 + d->o.window_s - now_s()) * 1e3));
			scrape_all(d, 1);
			d->window = now_s() - t0;
			check_nodes(d);
			check_tcp(d);
			check_capacity(d);
			check_disks(d);
			check_latency(d);
			check_chains(d);
			check_versions(d);
		}
	}
	for (int i = C_NODES; i <= C_VERSIONS; i++)
		if (!d->c[i].line[0])
			say(&d->c[i], DR_SKIP, "%s",
			    d->cluster[0]
				? "mgmtd cannot be reached"
				: "no cluster given (--cluster, $STOKER_CLUSTER or `stoker up`)");
	if (!d->cluster[0])
		say(&d->c[C_MGMTD], DR_SKIP,
		    "no cluster given (--cluster, $STOKER_CLUSTER or `stoker up`)");
	check_mounts(d);
	check_files(d);
	check_loader(d);

	for (int i = 0; i < C_N; i++)
		count[d->c[i].verdict]++;
	if (d->o.json) {
		print_json(d, count);
	} else {
		printf("stoker doctor %s: %s\n\n", STOKER_VERSION,
		       d->cluster[0] ? d->cluster : "no cluster");
		print_text(d);
		printf("\n%u OK, %u WARN, %u FAIL, %u SKIP\n", count[DR_OK], count[DR_WARN],
		       count[DR_FAIL], count[DR_SKIP]);
	}
	rc = count[DR_FAIL] ? 1 : 0;
	for (int i = 0; i < C_N; i++) {
		for (unsigned k = 0; k < d->c[i].nf; k++) {
			free(d->c[i].f[k].text);
			free(d->c[i].f[k].fix);
		}
		free(d->c[i].f);
	}
	for (unsigned i = 0; i < d->nep; i++) {
		cli_scrape_free(&d->ep[i].a);
		cli_scrape_free(&d->ep[i].b);
	}
	free(d->ep);
	stk_cluster_status_free(d->st);
	free(d);
	return rc;
}
