/*
 * The metrics endpoint (GET /metrics, GET /healthz) and the collectors every
 * process has: CPU, memory, descriptors and threads of the process, and the
 * host's TCP retransmits and drops.
 *
 * Why libmicrohttpd with its own polling thread: a scrape is one small request a
 * second at most, and it must never wait behind, or delay, the daemon's request
 * threads; one thread of its own that renders on demand keeps it apart. Scrapes
 * are served one at a time (the registry serialises them anyway).
 *
 * We bind the socket ourselves and hand it to libmicrohttpd, so that the address
 * syntax and errors are those of every other Stoker listener ("HOST:PORT", port 0
 * for a free one, -EADDRINUSE) and the bound address can be reported.
 *
 * Another module may add one route (mgmtd's dashboard under /ui): its handler runs
 * on the same thread, so a page view waits behind a scrape and the other way round;
 * handlers answer from memory and never wait on the network. It may also take one
 * POST path (mgmtd's training-job reports): the body is gathered, up to a bound
 * set with the path, into a buffer per request before the handler sees it whole.
 *
 * The /proc readers are written for Linux, where Stoker runs; on a read error a
 * figure is simply not updated (a series never set is not shown).
 */
#include "metrics_http.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "stoker/stoker.h" /* STK_VERSION, for stoker_build_info */

#include "../common/metrics.h"
#include "../common/util.h"

struct stk_metrics_http {
	struct MHD_Daemon *mhd;
	char addr[80];
	pthread_mutex_t lock; /* protects the route: set from another thread than ours */
	char prefix[64];      /* "" while no route is set */
	size_t prefix_len;
	stk_metrics_http_fn fn;
	void *fn_ctx;
	char post_path[64]; /* "" while no POST is taken */
	size_t post_max;
	stk_metrics_http_post_fn post_fn;
	void *post_ctx;
};

/* A POST being received (the request's con_cls): its body so far. */
struct post_body {
	size_t len, max;
	int too_big; /* more than max arrived: the rest is dropped, the answer is 413 */
	char buf[];
};

static int g_started; /* under g_start_lock: one endpoint per process */
static pthread_mutex_t g_start_lock = PTHREAD_MUTEX_INITIALIZER;

/* ---- process ---- */

struct proc_series {
	stk_metric_t cpu, rss, fds, max_fds, threads, start;
	double boot_time;
	long ticks;
	long page_size;
};

static struct proc_series g_proc;

/* Reads a small /proc file whole into buf (NUL-terminated). Bytes read or -errno. */
static long read_small(const char *path, char *buf, size_t len)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	long n;

	if (fd < 0)
		return -errno;
	n = stk_read_full(fd, buf, len - 1);
	close(fd);
	if (n < 0)
		return n;
	buf[n] = 0;
	return n;
}

static double boot_time(void)
{
	char buf[8192];
	const char *p;

	if (read_small("/proc/stat", buf, sizeof(buf)) < 0)
		return 0;
	p = strstr(buf, "\nbtime ");
	return p ? strtod(p + 7, NULL) : 0;
}

static void collect_process(void *ctx)
{
	struct proc_series *ps = ctx;
	char buf[1024];
	const char *p;
	char *end;
	unsigned long long v[22];
	unsigned n = 0;
	struct rlimit rl;
	DIR *d;

	/* /proc/self/stat: fields after "(comm)"; comm may hold spaces and parentheses. */
	if (read_small("/proc/self/stat", buf, sizeof(buf)) > 0 && (p = strrchr(buf, ')')) &&
	    p[1] == ' ' && p[2]) {
		p += 3; /* past ") " and the state letter */
		while (n < STK_ARRAY_SIZE(v) && *p) {
			unsigned long long x = strtoull(p, &end, 10);
			if (end == p)
				break;
			v[n++] = x;
			p = end;
		}
		/* v[0] is field 4 (ppid): utime 14, stime 15, num_threads 20, starttime 22. */
		if (n >= 19 && ps->ticks > 0) {
			stk_metric_set(ps->cpu, (double)(v[10] + v[11]) / (double)ps->ticks);
			stk_metric_set_int(ps->threads, (int64_t)v[16]);
			if (ps->boot_time > 0)
				stk_metric_set(ps->start,
					       ps->boot_time + (double)v[18] / (double)ps->ticks);
		}
	}
	if (read_small("/proc/self/statm", buf, sizeof(buf)) > 0) {
		unsigned long long size = 0, resident = 0;
		if (sscanf(buf, "%llu %llu", &size, &resident) == 2)
			stk_metric_set_int(ps->rss,
					   (int64_t)(resident * (unsigned long long)ps->page_size));
	}
	d = opendir("/proc/self/fd");
	if (d) {
		int64_t count = 0;
		struct dirent *e;
		while ((e = readdir(d)))
			if (e->d_name[0] != '.')
				count++;
		closedir(d);
		stk_metric_set_int(ps->fds, count - 1); /* not the one reading the folder */
	}
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0)
		stk_metric_set_int(ps->max_fds,
				   rl.rlim_cur == RLIM_INFINITY ? -1 : (int64_t)rl.rlim_cur);
}

static int process_init(struct proc_series *ps)
{
	int rc = 0;

	ps->ticks = sysconf(_SC_CLK_TCK);
	ps->page_size = sysconf(_SC_PAGESIZE);
	ps->boot_time = boot_time();
	rc = rc ? rc : stk_metric_series(STK_M_PROCESS_CPU, NULL, &ps->cpu);
	rc = rc ? rc : stk_metric_series(STK_M_PROCESS_RSS, NULL, &ps->rss);
	rc = rc ? rc : stk_metric_series(STK_M_PROCESS_FDS, NULL, &ps->fds);
	rc = rc ? rc : stk_metric_series(STK_M_PROCESS_MAX_FDS, NULL, &ps->max_fds);
	rc = rc ? rc : stk_metric_series(STK_M_PROCESS_THREADS, NULL, &ps->threads);
	rc = rc ? rc : stk_metric_series(STK_M_PROCESS_START, NULL, &ps->start);
	return rc;
}

/* ---- host network ---- */

/* Kernel counters we export: the file, the line prefix and field name, and the series. */
struct net_field {
	const char *file;
	const char *prefix; /* "Tcp:" */
	const char *field;  /* "RetransSegs" */
	enum stk_metric_family family;
	const char *reason;  /* label value for stoker_host_tcp_drops_total */
	stk_metric_t series; /* registered the first time the field is found */
};

static struct net_field g_net[] = {
    {"/proc/net/snmp", "Tcp:", "OutSegs", STK_M_HOST_TCP_SENT, NULL, 0},
    {"/proc/net/snmp", "Tcp:", "RetransSegs", STK_M_HOST_TCP_RETRANS, NULL, 0},
    {"/proc/net/snmp", "Tcp:", "InErrs", STK_M_HOST_TCP_IN_ERRORS, NULL, 0},
    {"/proc/net/netstat", "TcpExt:", "ListenOverflows", STK_M_HOST_TCP_DROPS, "listen_overflow", 0},
    {"/proc/net/netstat", "TcpExt:", "ListenDrops", STK_M_HOST_TCP_DROPS, "listen_drop", 0},
    {"/proc/net/netstat", "TcpExt:", "TCPBacklogDrop", STK_M_HOST_TCP_DROPS, "backlog_drop", 0},
    {"/proc/net/netstat", "TcpExt:", "TCPRcvQDrop", STK_M_HOST_TCP_DROPS, "rcvq_drop", 0},
};

/*
 * Finds `field` in a /proc/net file: lines come in pairs, "Prefix: names..." then
 * "Prefix: values...". 0 or -ENOENT.
 */
static int net_value(const char *buf, const char *prefix, const char *field, uint64_t *out)
{
	size_t plen = strlen(prefix), flen = strlen(field);
	const char *line = buf;

	while (*line) {
		const char *next = strchr(line, '\n');
		const char *vline;
		unsigned idx = 0, i;
		int found = 0;

		if (!next)
			break;
		if (strncmp(line, prefix, plen) != 0 || strncmp(next + 1, prefix, plen) != 0) {
			line = next + 1;
			continue;
		}
		/* names line: find the field's position */
		for (const char *p = line + plen; p < next;) {
			while (p < next && *p == ' ')
				p++;
			const char *w = p;
			while (p < next && *p != ' ')
				p++;
			if (p == w)
				break;
			if ((size_t)(p - w) == flen && strncmp(w, field, flen) == 0) {
				found = 1;
				break;
			}
			idx++;
		}
		vline = next + 1;
		if (found) {
			const char *p = vline + plen;
			char *end;
			for (i = 0; i <= idx; i++) {
				unsigned long long v = strtoull(p, &end, 10);
				if (end == p)
					return -ENOENT;
				if (i == idx) {
					*out = v;
					return 0;
				}
				p = end;
			}
		}
		next = strchr(vline, '\n');
		if (!next)
			break;
		line = next + 1;
	}
	return -ENOENT;
}

static void collect_host(void *ctx)
{
	static char snmp[16384], netstat[16384]; /* scrapes are serialised */
	int have_snmp, have_netstat;

	(void)ctx;
	have_snmp = read_small("/proc/net/snmp", snmp, sizeof(snmp)) > 0;
	have_netstat = read_small("/proc/net/netstat", netstat, sizeof(netstat)) > 0;
	for (size_t i = 0; i < STK_ARRAY_SIZE(g_net); i++) {
		struct net_field *f = &g_net[i];
		int snmp_file = strcmp(f->file, "/proc/net/snmp") == 0;
		const char *buf = snmp_file ? snmp : netstat;
		uint64_t v;

		if (!(snmp_file ? have_snmp : have_netstat) ||
		    net_value(buf, f->prefix, f->field, &v))
			continue; /* absent on this kernel: no series rather than a false zero */
		if (!f->series) {
			const char *vals[1] = {f->reason};
			if (stk_metric_series(f->family, f->reason ? vals : NULL, &f->series))
				continue;
		}
		stk_metric_set_int(f->series, (int64_t)v);
	}
}

/* ---- HTTP ---- */

static enum MHD_Result reply(struct MHD_Connection *conn, unsigned status, const char *type,
			     char *body, size_t len, enum MHD_ResponseMemoryMode mode)
{
	struct MHD_Response *r = MHD_create_response_from_buffer(len, body, mode);
	enum MHD_Result ret;

	if (!r) {
		if (mode == MHD_RESPMEM_MUST_FREE)
			free(body);
		return MHD_NO;
	}
	MHD_add_response_header(r, "Content-Type", type);
	if (status == MHD_HTTP_METHOD_NOT_ALLOWED)
		MHD_add_response_header(r, "Allow", "GET, HEAD");
	MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
	ret = MHD_queue_response(conn, status, r);
	MHD_destroy_response(r);
	return ret;
}

/* Whether url is prefix itself or below it ("/ui", "/ui/x"; not "/uix"). */
static int under(const char *url, const char *prefix, size_t len)
{
	return len && strncmp(url, prefix, len) == 0 && (url[len] == 0 || url[len] == '/');
}

/* Sends what a handler answered; MHD_NO if the reply cannot be made. */
static enum MHD_Result answer_reply(struct MHD_Connection *conn, struct stk_metrics_http_answer a)
{
	struct MHD_Response *r;
	enum MHD_Result ret;

	r = MHD_create_response_from_buffer(
	    a.len, (void *)a.body, a.owned ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
	if (!r) {
		if (a.owned)
			free((void *)a.body);
		return MHD_NO;
	}
	MHD_add_response_header(r, "Content-Type", a.type ? a.type : "text/plain; charset=utf-8");
	MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
	/* the page must work with no network but this endpoint, so nothing else may load */
	MHD_add_response_header(r, "Content-Security-Policy",
				"default-src 'self'; img-src 'self' data:; frame-ancestors 'none'");
	if (a.cache)
		MHD_add_response_header(r, "Cache-Control", a.cache);
	if (a.location[0])
		MHD_add_response_header(r, "Location", a.location);
	ret = MHD_queue_response(conn, a.status ? a.status : MHD_HTTP_OK, r);
	MHD_destroy_response(r);
	return ret;
}

/* Answers url from the route's handler; MHD_NO if the reply cannot be made. */
static enum MHD_Result route_reply(struct MHD_Connection *conn, stk_metrics_http_fn fn, void *ctx,
				   const char *url)
{
	struct stk_metrics_http_answer a;

	memset(&a, 0, sizeof(a));
	fn(ctx, url, &a);
	return answer_reply(conn, a);
}

/*
 * A POST, called as libmicrohttpd delivers it: first with no body (*con_cls is
 * NULL: the Content-Length is judged and the buffer made), then with each piece,
 * then once more with none, when the handler answers. A body over the bound is
 * refused at once when its length is announced, else dropped as it comes.
 */
static enum MHD_Result on_post(struct stk_metrics_http *h, struct MHD_Connection *conn,
			       const char *url, const char *upload, size_t *upload_len,
			       void **con_cls)
{
	static char toobig[] = "request body too large\n", nomem[] = "out of memory\n",
		    notallowed[] = "POST only to the dashboard's job reports\n";
	const char *text = "text/plain; charset=utf-8";
	struct post_body *pb = *con_cls;
	stk_metrics_http_post_fn fn = NULL;
	void *ctx = NULL;
	size_t max = 0;

	pthread_mutex_lock(&h->lock);
	if (h->post_fn && strcmp(url, h->post_path) == 0) {
		fn = h->post_fn;
		ctx = h->post_ctx;
		max = h->post_max;
	}
	pthread_mutex_unlock(&h->lock);
	if (!fn)
		return reply(conn, MHD_HTTP_METHOD_NOT_ALLOWED, text, notallowed,
			     sizeof(notallowed) - 1, MHD_RESPMEM_PERSISTENT);
	if (!pb) {
		const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
							     MHD_HTTP_HEADER_CONTENT_LENGTH);
		uint64_t n;

		if (cl && (stk_parse_u64(cl, &n) || n > max))
			return reply(conn, MHD_HTTP_CONTENT_TOO_LARGE, text, toobig,
				     sizeof(toobig) - 1, MHD_RESPMEM_PERSISTENT);
		pb = malloc(sizeof(*pb) + max);
		if (!pb)
			return reply(conn, MHD_HTTP_SERVICE_UNAVAILABLE, text, nomem,
				     sizeof(nomem) - 1, MHD_RESPMEM_PERSISTENT);
		pb->len = 0;
		pb->max = max;
		pb->too_big = 0;
		*con_cls = pb;
		return MHD_YES;
	}
	if (*upload_len) {
		if (!pb->too_big && *upload_len <= pb->max - pb->len) {
			memcpy(pb->buf + pb->len, upload, *upload_len);
			pb->len += *upload_len;
		} else {
			pb->too_big = 1;
		}
		*upload_len = 0;
		return MHD_YES;
	}
	if (pb->too_big)
		return reply(conn, MHD_HTTP_CONTENT_TOO_LARGE, text, toobig, sizeof(toobig) - 1,
			     MHD_RESPMEM_PERSISTENT);
	{
		struct stk_metrics_http_answer a;

		memset(&a, 0, sizeof(a));
		fn(ctx, url, pb->buf, pb->len,
		   MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "X-Stoker-Signature"), &a);
		return answer_reply(conn, a);
	}
}

/* The end of a request, answered or not: a POST's buffer goes. */
static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
			 enum MHD_RequestTerminationCode why)
{
	(void)cls;
	(void)conn;
	(void)why;
	free(*con_cls);
	*con_cls = NULL;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
				  const char *method, const char *version, const char *upload,
				  size_t *upload_len, void **con_cls)
{
	static char ok[] = "ok\n", notfound[] = "not found: try /metrics or /healthz\n",
		    notallowed[] = "only GET and HEAD\n",
		    index[] = "Stoker metrics: /metrics (Prometheus text format), /healthz\n";
	const char *text = "text/plain; charset=utf-8";
	struct stk_metrics_http *h = cls;
	stk_metrics_http_fn fn = NULL;
	void *fn_ctx = NULL;

	(void)version;
	if (strcmp(method, "POST") == 0)
		return on_post(h, conn, url, upload, upload_len, con_cls);
	if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
		return reply(conn, MHD_HTTP_METHOD_NOT_ALLOWED, text, notallowed,
			     sizeof(notallowed) - 1, MHD_RESPMEM_PERSISTENT);
	if (strcmp(url, "/metrics") == 0) {
		char *body;
		size_t len;
		if (stk_metrics_render(&body, &len))
			return MHD_NO;
		return reply(conn, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8", body,
			     len, MHD_RESPMEM_MUST_FREE);
	}
	if (strcmp(url, "/healthz") == 0)
		return reply(conn, MHD_HTTP_OK, text, ok, sizeof(ok) - 1, MHD_RESPMEM_PERSISTENT);
	pthread_mutex_lock(&h->lock);
	if (under(url, h->prefix, h->prefix_len)) {
		fn = h->fn;
		fn_ctx = h->fn_ctx;
	}
	pthread_mutex_unlock(&h->lock);
	if (fn)
		return route_reply(conn, fn, fn_ctx, url);
	if (strcmp(url, "/") == 0)
		return reply(conn, MHD_HTTP_OK, text, index, sizeof(index) - 1,
			     MHD_RESPMEM_PERSISTENT);
	return reply(conn, MHD_HTTP_NOT_FOUND, text, notfound, sizeof(notfound) - 1,
		     MHD_RESPMEM_PERSISTENT);
}

/* Binds "HOST:PORT" (HOST may be "[v6]" or empty for every address; port 0 allowed). */
static int bind_listen(const char *spec, int *fd_out, char *addr, size_t addrlen)
{
	char host[256], port[8];
	const char *colon = strrchr(spec, ':');
	struct addrinfo hints, *res = NULL;
	struct sockaddr_storage ss;
	socklen_t sslen = sizeof(ss);
	size_t hlen;
	uint64_t pnum;
	int fd = -1, one = 1, rc;

	if (!colon || stk_parse_u64(colon + 1, &pnum) || pnum > 65535)
		return -EINVAL;
	hlen = (size_t)(colon - spec);
	if (hlen >= 2 && spec[0] == '[' && spec[hlen - 1] == ']') {
		spec++;
		hlen -= 2;
	}
	if (hlen >= sizeof(host))
		return -EINVAL;
	memcpy(host, spec, hlen);
	host[hlen] = 0;
	snprintf(port, sizeof(port), "%u", (unsigned)pnum);
	memset(&hints, 0, sizeof(hints));
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
	if (getaddrinfo(hlen ? host : NULL, port, &hints, &res) || !res)
		return -EADDRNOTAVAIL;
	fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		rc = -errno;
		goto out;
	}
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(fd, res->ai_addr, res->ai_addrlen) < 0 || listen(fd, 64) < 0 ||
	    getsockname(fd, (struct sockaddr *)&ss, &sslen) < 0) {
		rc = -errno;
		goto out;
	}
	{
		char h[INET6_ADDRSTRLEN] = "?";
		if (ss.ss_family == AF_INET6) {
			struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
			inet_ntop(AF_INET6, &a->sin6_addr, h, sizeof(h));
			snprintf(addr, addrlen, "[%s]:%u", h, ntohs(a->sin6_port));
		} else {
			struct sockaddr_in *a = (struct sockaddr_in *)&ss;
			inet_ntop(AF_INET, &a->sin_addr, h, sizeof(h));
			snprintf(addr, addrlen, "%s:%u", h, ntohs(a->sin_port));
		}
	}
	*fd_out = fd;
	fd = -1;
	rc = 0;
out:
	if (fd >= 0)
		close(fd);
	freeaddrinfo(res);
	return rc;
}

int stk_metrics_http_start(const char *listen, const char *role, struct stk_metrics_http **out)
{
	struct stk_metrics_http *h = NULL;
	const char *info[2] = {role ? role : "unknown", STK_VERSION};
	stk_metric_t bi;
	int fd = -1, rc, collectors = 0;

	*out = NULL;
	if (!listen)
		return -EINVAL;
	pthread_mutex_lock(&g_start_lock);
	rc = -EALREADY;
	if (g_started)
		goto out;
	rc = -ENOMEM;
	h = calloc(1, sizeof(*h));
	if (!h)
		goto out;
	pthread_mutex_init(&h->lock, NULL);
	rc = bind_listen(listen, &fd, h->addr, sizeof(h->addr));
	if (rc)
		goto out;
	rc = stk_metric_series(STK_M_BUILD_INFO, info, &bi);
	if (!rc)
		rc = process_init(&g_proc);
	if (rc)
		goto out;
	stk_metric_set_int(bi, 1);
	rc = stk_metrics_collector_add(collect_process, &g_proc);
	if (!rc) {
		collectors = 1;
		rc = stk_metrics_collector_add(collect_host, NULL);
	}
	if (rc)
		goto out;
	collectors = 2;
	h->mhd = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO, 0, NULL, NULL,
				  on_request, h, MHD_OPTION_LISTEN_SOCKET, fd,
				  MHD_OPTION_CONNECTION_LIMIT, (unsigned)64,
				  MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)10,
				  MHD_OPTION_NOTIFY_COMPLETED, on_completed, NULL, MHD_OPTION_END);
	rc = -ENOMEM;
	if (!h->mhd)
		goto out;
	fd = -1; /* libmicrohttpd owns it now */
	g_started = 1;
	*out = h;
	h = NULL;
	rc = 0;
out:
	if (rc && collectors >= 1)
		stk_metrics_collector_remove(collect_process, &g_proc);
	if (rc && collectors >= 2)
		stk_metrics_collector_remove(collect_host, NULL);
	pthread_mutex_unlock(&g_start_lock);
	if (fd >= 0)
		close(fd);
	if (h)
		pthread_mutex_destroy(&h->lock);
	free(h);
	return rc;
}

int stk_metrics_http_route(struct stk_metrics_http *h, const char *prefix, stk_metrics_http_fn fn,
			   void *ctx)
{
	size_t len = strlen(prefix);
	int rc = 0;

	if (prefix[0] != '/' || len >= sizeof(h->prefix) || !fn)
		return -EINVAL;
	pthread_mutex_lock(&h->lock);
	if (h->fn) {
		rc = -EBUSY;
	} else {
		memcpy(h->prefix, prefix, len + 1);
		h->prefix_len = len;
		h->fn = fn;
		h->fn_ctx = ctx;
	}
	pthread_mutex_unlock(&h->lock);
	return rc;
}

int stk_metrics_http_post(struct stk_metrics_http *h, const char *path, size_t max_body,
			  stk_metrics_http_post_fn fn, void *ctx)
{
	size_t len = strlen(path);
	int rc = 0;

	if (path[0] != '/' || len >= sizeof(h->post_path) || !fn || !max_body ||
	    max_body > (1u << 20) || strcmp(path, "/metrics") == 0 || strcmp(path, "/healthz") == 0)
		return -EINVAL;
	pthread_mutex_lock(&h->lock);
	if (h->post_fn) {
		rc = -EBUSY;
	} else {
		memcpy(h->post_path, path, len + 1);
		h->post_max = max_body;
		h->post_fn = fn;
		h->post_ctx = ctx;
	}
	pthread_mutex_unlock(&h->lock);
	return rc;
}

const char *stk_metrics_http_addr(const struct stk_metrics_http *h)
{
	return h->addr;
}

void stk_metrics_http_stop(struct stk_metrics_http *h)
{
	if (!h)
		return;
	MHD_stop_daemon(h->mhd); /* joins its thread, so no scrape is running after this */
	stk_metrics_collector_remove(collect_process, &g_proc);
	stk_metrics_collector_remove(collect_host, NULL);
	pthread_mutex_lock(&g_start_lock);
	g_started = 0;
	pthread_mutex_unlock(&g_start_lock);
	pthread_mutex_destroy(&h->lock);
	free(h);
}
