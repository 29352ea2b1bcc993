/*
 * Unit test of the metrics registry (common/metrics.h): sums of many threads are
 * exact, including threads that exited; scrapes taken while threads count never
 * go backwards; histogram buckets, _sum and _count; gauges up and down; label
 * escaping; the per-operation sets; the HTTP endpoint; and that docs/metrics.md
 * holds the reference generated from the table.
 *
 * `test_metrics --doc` prints that reference (paste it between the markers in
 * docs/metrics.md).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/metrics.h"
#include "daemon/metrics_http.h"
#include "common/util.h"
#include "proto/wire.h"
#include "check.h"

#define DOC_BEGIN "<!-- BEGIN GENERATED: metrics table (tests/unit/test_metrics --doc) -->\n"
#define DOC_END "<!-- END GENERATED -->"

static char *scrape(void)
{
	char *out = NULL;
	size_t len = 0;

	CHECK(stk_metrics_render(&out, &len) == 0);
	CHECK(out && strlen(out) == len);
	return out;
}

/* The value of the sample line that starts with `series ` (name and labels), or -1. */
static double sample(const char *text, const char *series)
{
	size_t n = strlen(series);
	const char *p = text;

	while (p && *p) {
		if (strncmp(p, series, n) == 0 && p[n] == ' ')
			return strtod(p + n + 1, NULL);
		p = strchr(p, '\n');
		if (p)
			p++;
	}
	return -1;
}

#define THREADS 8
#define ADDS 200000

static stk_metric_t g_counter, g_gauge, g_hist;
static volatile int g_stop_scraper;

static void *adder(void *arg)
{
	(void)arg;
	for (int i = 0; i < ADDS; i++) {
		stk_metric_add(g_counter, 1);
		stk_metric_add(g_gauge, 1);
		stk_metric_observe_ns(g_hist, (uint64_t)(i % 7) * 1000000);
		stk_metric_add(g_gauge, -1);
	}
	return NULL;
}

/* Scrapes while the adders run: the counter and the histogram count never drop. */
static void *scraper(void *arg)
{
	double last = 0, last_count = 0;
	int *scrapes = arg;

	while (!g_stop_scraper) {
		char *t = scrape();
		double v = sample(t, "stoker_rpc_connections_opened_total");
		double c = sample(t, "stoker_rpc_duration_seconds_count{op=\"META_SYNC\"}");
		double inf =
		    sample(t, "stoker_rpc_duration_seconds_bucket{op=\"META_SYNC\",le=\"+Inf\"}");
		CHECK(v >= last);
		CHECK(c >= last_count);
		CHECK(c == inf);
		last = v;
		last_count = c;
		free(t);
		(*scrapes)++;
	}
	return NULL;
}

static void test_concurrent(void)
{
	pthread_t t[THREADS], s;
	int scrapes = 0;
	char *text;
	const char *op[1] = {"META_SYNC"};

	/* Borrow real families: the test registers series like any daemon would. */
	CHECK(stk_metric_series(STK_M_RPC_CONNECTIONS_OPENED, NULL, &g_counter) == 0);
	CHECK(stk_metric_series(STK_M_RPC_INFLIGHT, NULL, &g_gauge) == 0);
	CHECK(stk_metric_series(STK_M_RPC_DURATION, op, &g_hist) == 0);
	CHECK(g_counter && g_gauge && g_hist);

	pthread_create(&s, NULL, scraper, &scrapes);
	/* Two rounds: the second's threads start after the first's exited and retired. */
	for (int round = 0; round < 2; round++) {
		for (int i = 0; i < THREADS; i++)
			CHECK(pthread_create(&t[i], NULL, adder, NULL) == 0);
		for (int i = 0; i < THREADS; i++)
			pthread_join(t[i], NULL);
	}
	g_stop_scraper = 1;
	pthread_join(s, NULL);
	CHECK(scrapes > 0);

	text = scrape();
	CHECK(sample(text, "stoker_rpc_connections_opened_total") == 2.0 * THREADS * ADDS);
	CHECK(sample(text, "stoker_rpc_inflight_requests") == 0);
	CHECK(sample(text, "stoker_rpc_duration_seconds_count{op=\"META_SYNC\"}") ==
	      2.0 * THREADS * ADDS);
	free(text);
}

static void test_histogram(void)
{
	stk_metric_t h;
	const char *op[1] = {"META_STATFS"};
	char *t;

	CHECK(stk_metric_series(STK_M_RPC_DURATION, op, &h) == 0);
	stk_metric_observe_ns(h, 5000);		  /* 5 us: first bucket */
	stk_metric_observe_ns(h, 10000);	  /* exactly 10 us: le="1e-05" includes it */
	stk_metric_observe_ns(h, 15000);	  /* 2e-05 */
	stk_metric_observe_ns(h, 3000000);	  /* 3 ms: 0.005 */
	stk_metric_observe_ns(h, 20000000000ull); /* 20 s: only +Inf */
	t = scrape();
#define B(le) "stoker_rpc_duration_seconds_bucket{op=\"META_STATFS\",le=\"" le "\"}"
	CHECK(sample(t, B("1e-05")) == 2);
	CHECK(sample(t, B("2e-05")) == 3);
	CHECK(sample(t, B("0.002")) == 3);
	CHECK(sample(t, B("0.005")) == 4);
	CHECK(sample(t, B("10")) == 4);
	CHECK(sample(t, B("+Inf")) == 5);
#undef B
	CHECK(sample(t, "stoker_rpc_duration_seconds_count{op=\"META_STATFS\"}") == 5);
	{
		double sum = sample(t, "stoker_rpc_duration_seconds_sum{op=\"META_STATFS\"}");
		CHECK(sum > 20.00303 - 1e-9 && sum < 20.00303 + 1e-9);
	}
	free(t);
}

static void test_values(void)
{
	stk_metric_t g, c, big, esc, again;
	const char *tv[1] = {"7"};
	const char *weird[2] = {"a\"b\\c\nd", "x"};
	char *t;

	CHECK(stk_metric_series(STK_M_TARGET_CAPACITY, tv, &g) == 0);
	CHECK(stk_metric_series(STK_M_TARGET_CAPACITY, tv, &again) == 0);
	CHECK(g == again); /* find-or-create */
	CHECK(stk_metric_series(STK_M_TARGET_CAPACITY, NULL, &again) == -EINVAL);
	CHECK(again == 0);
	stk_metric_set_int(g, 1000);
	CHECK(stk_metric_series(STK_M_PROCESS_CPU, NULL, &c) == 0);
	stk_metric_set(c, 1.25);
	CHECK(stk_metric_series(STK_M_CLUSTER_ROUTING_VERSION, NULL, &big) == 0);
	stk_metric_set_int(big, 117050000000000001ll); /* more than a double's 53 bits */
	CHECK(stk_metric_series(STK_M_TARGET_IO_ERRORS, weird, &esc) == 0);
	stk_metric_add(esc, 3);
	stk_metric_add(0, 5); /* the null handle counts nothing */
	stk_metric_observe_ns(0, 5);
	t = scrape();
	CHECK(sample(t, "stoker_target_capacity_bytes{target=\"7\"}") == 1000);
	CHECK(sample(t, "stoker_process_cpu_seconds_total") == 1.25);
	CHECK(strstr(t, "stoker_cluster_routing_version 117050000000000001\n") != NULL);
	CHECK(sample(t, "stoker_target_io_errors_total{target=\"a\\\"b\\\\c\\nd\",op=\"x\"}") == 3);
	/* HELP and TYPE once per family, before its samples */
	CHECK(strstr(t, "# HELP stoker_target_capacity_bytes Size of") != NULL);
	CHECK(strstr(t, "# TYPE stoker_target_capacity_bytes gauge\n") != NULL);
	CHECK(strstr(t, "# TYPE stoker_rpc_duration_seconds histogram\n") != NULL);
	CHECK(strstr(strstr(t, "# TYPE stoker_target_capacity_bytes") + 1,
		     "# TYPE stoker_target_capacity_bytes") == NULL);
	/* families nobody registered a series of are not shown */
	CHECK(strstr(t, "stoker_device_smart_healthy") == NULL);
	free(t);
}

static void test_ops(void)
{
	struct stk_metrics_ops *rpc, *fs;
	const char *names[2] = {"getattr", "read"};
	uint64_t t0;
	char *t;

	CHECK(stk_metrics_rpc_create(64, 95, &rpc) == 0);
	t = scrape();
	/* this server's opcodes are there from the start, at zero */
	CHECK(sample(t, "stoker_rpc_requests_total{op=\"STOR_READ\"}") == 0);
	CHECK(sample(t, "stoker_rpc_requests_total{op=\"META_LOOKUP\"}") == -1);
	free(t);
	t0 = stk_metrics_ops_begin(rpc, STK_OP_STOR_READ);
	stk_metrics_ops_end(rpc, STK_OP_STOR_READ, t0, 0, 100, 4096);
	t0 = stk_metrics_ops_begin(rpc, STK_OP_STOR_READ);
	stk_metrics_ops_end(rpc, STK_OP_STOR_READ, t0, -ENOENT, 100, 40);
	t0 = stk_metrics_ops_begin(rpc, 9999); /* unknown opcode */
	stk_metrics_ops_end(rpc, 9999, t0, -ENOSYS, 40, 40);
	stk_metrics_ops_conn(rpc, 1);
	stk_metrics_ops_conn(rpc, 1);
	stk_metrics_ops_conn(rpc, -1);
	stk_metrics_ops_begin(NULL, 1); /* metrics off */
	stk_metrics_ops_end(NULL, 1, 0, 0, 0, 0);

	CHECK(stk_metrics_ops_create("fuse", names, 2, &fs) == 0);
	t0 = stk_metrics_ops_begin(fs, 1);
	stk_metrics_ops_end(fs, 1, t0, -EIO, 0, 65536);
	t0 = stk_metrics_ops_begin(fs, 7); /* out of range: dropped */
	stk_metrics_ops_end(fs, 7, t0, 0, 0, 1);

	t = scrape();
	CHECK(sample(t, "stoker_rpc_requests_total{op=\"STOR_READ\"}") == 2);
	CHECK(sample(t, "stoker_rpc_errors_total{op=\"STOR_READ\",status=\"NOENT\"}") == 1);
	CHECK(sample(t, "stoker_rpc_received_bytes_total{op=\"STOR_READ\"}") == 200);
	CHECK(sample(t, "stoker_rpc_sent_bytes_total{op=\"STOR_READ\"}") == 4136);
	CHECK(sample(t, "stoker_rpc_requests_total{op=\"UNKNOWN\"}") == 1);
	CHECK(sample(t, "stoker_rpc_errors_total{op=\"UNKNOWN\",status=\"NOSYS\"}") == 1);
	CHECK(sample(t, "stoker_rpc_connections") == 1);
	CHECK(sample(t, "stoker_rpc_inflight_requests") == 0);
	CHECK(sample(t, "stoker_client_ops_total{frontend=\"fuse\",op=\"read\"}") == 1);
	CHECK(sample(t, "stoker_client_ops_total{frontend=\"fuse\",op=\"getattr\"}") == 0);
	CHECK(
	    sample(t, "stoker_client_errors_total{frontend=\"fuse\",op=\"read\",error=\"EIO\"}") ==
	    1);
	CHECK(sample(t, "stoker_client_read_bytes_total{frontend=\"fuse\",op=\"read\"}") == 65536);
	CHECK(sample(t, "stoker_client_inflight_ops{frontend=\"fuse\"}") == 0);
	free(t);
	stk_metrics_ops_destroy(rpc);
	stk_metrics_ops_destroy(fs);
}

static int collected;
static void collector(void *ctx)
{
	stk_metric_set_int(*(stk_metric_t *)ctx, ++collected);
}

static void test_collectors(void)
{
	stk_metric_t s;
	char *t;

	CHECK(stk_metric_series(STK_M_CLUSTER_CHAINS, NULL, &s) == 0);
	CHECK(stk_metrics_collector_add(collector, &s) == 0);
	free(scrape());
	t = scrape();
	CHECK(sample(t, "stoker_cluster_chains") == 2);
	free(t);
	stk_metrics_collector_remove(collector, &s);
	free(scrape());
	CHECK(collected == 2);
}

/* GET path from addr; returns the whole response (headers and body) or NULL. */
static char *http_get(const char *addr, const char *path)
{
	char host[64], req[256];
	uint16_t port;
	struct sockaddr_in sin = {.sin_family = AF_INET};
	size_t cap = 1 << 20, len = 0;
	char *buf = malloc(cap);
	int fd;
	long n;

	if (!buf || stk_parse_hostport(addr, host, sizeof(host), &port))
		goto fail;
	sin.sin_port = htons(port);
	inet_pton(AF_INET, host, &sin.sin_addr);
	fd = socket(AF_INET, SOCK_STREAM, 0);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sin, sizeof(sin)) < 0) {
		if (fd >= 0)
			close(fd);
		goto fail;
	}
	n = snprintf(req, sizeof(req), "GET %s HTTP/1.0\r\nHost: %s\r\n\r\n", path, addr);
	stk_write_all(fd, req, (size_t)n);
	while (len < cap - 1 && (n = read(fd, buf + len, cap - 1 - len)) > 0)
		len += (size_t)n;
	close(fd);
	buf[len] = 0;
	return buf;
fail:
	free(buf);
	return NULL;
}

static void test_http(void)
{
	struct stk_metrics_http *h, *h2;
	char *r;

	CHECK(stk_metrics_http_start("127.0.0.1:0", "test", &h) == 0);
	if (!h)
		return;
	CHECK(stk_metrics_http_start("127.0.0.1:0", "test", &h2) == -EALREADY);
	CHECK(stk_metrics_http_start("nonsense", "test", &h2) == -EALREADY);
	r = http_get(stk_metrics_http_addr(h), "/metrics");
	CHECK(r && strstr(r, "200 OK"));
	CHECK(r && strstr(r, "text/plain; version=0.0.4"));
	CHECK(r && strstr(r, "stoker_build_info{role=\"test\",version=\""));
	CHECK(r && strstr(r, "\nstoker_process_resident_memory_bytes "));
	CHECK(r && strstr(r, "\nstoker_process_open_fds "));
	CHECK(r && strstr(r, "\nstoker_process_cpu_seconds_total "));
	free(r);
	r = http_get(stk_metrics_http_addr(h), "/healthz");
	CHECK(r && strstr(r, "200 OK") && strstr(r, "\r\n\r\nok\n"));
	free(r);
	r = http_get(stk_metrics_http_addr(h), "/nope");
	CHECK(r && strstr(r, "404"));
	free(r);
	stk_metrics_http_stop(h);
	/* stopped: another may start; a bad address is refused */
	CHECK(stk_metrics_http_start("nonsense", "test", &h2) == -EINVAL);
	CHECK(stk_metrics_http_start("127.0.0.1:0", "test", &h2) == 0);
	stk_metrics_http_stop(h2);
}

/* docs/metrics.md must hold exactly the generated table (when run from the repository). */
static void test_doc(void)
{
	char *doc, *file = NULL;
	size_t len, flen = 0;
	FILE *f = fopen("docs/metrics.md", "r");
	const char *b, *e;

	CHECK(stk_metrics_doc(&doc, &len) == 0);
	CHECK(strstr(doc, "| `stoker_rpc_requests_total` | counter | `op` |") != NULL);
	if (!f) {
		fprintf(stderr, "docs/metrics.md not found from here: not compared\n");
		free(doc);
		return;
	}
	file = calloc(1, 1 << 20);
	if (file)
		flen = fread(file, 1, (1 << 20) - 1, f);
	fclose(f);
	b = file ? strstr(file, DOC_BEGIN) : NULL;
	e = b ? strstr(b, DOC_END) : NULL;
	CHECK(flen > 0 && b && e);
	if (b && e) {
		b += strlen(DOC_BEGIN);
		if ((size_t)(e - b) != len || memcmp(b, doc, len) != 0) {
			CHECK_FAIL("docs/metrics.md is out of date with STK_METRICS_TABLE: "
				   "regenerate it with build/tests/test_metrics --doc");
		}
	}
	free(file);
	free(doc);
}

/* Counted from several threads at once, each a connection from its own host. */
static void *client_counter(void *arg)
{
	struct stk_metrics_ops *m = arg;

	for (int i = 0; i < 1000; i++) {
		stk_metrics_ops_client(m, "10.9.9.9:4000", 100, 10);
		stk_metrics_ops_client(m, "[fd00::9]:4001", 1, 2);
	}
	return NULL;
}

/*
 * Per-client counts: by host (port dropped, IPv6 unbracketed), across threads,
 * and bounded: hosts past STK_METRICS_MAX_CLIENTS go into client="other".
 */
static void test_clients(void)
{
	struct stk_metrics_ops *m, *fuse;
	static const char *const ops[] = {"read"};
	pthread_t th[4];
	char peer[64], *t;
	int named = 0;

	CHECK(stk_metrics_rpc_create(64, 95, &m) == 0);
	CHECK(stk_metrics_ops_create("fuse", ops, 1, &fuse) == 0);
	stk_metrics_ops_client(fuse, "10.1.1.1:1", 1, 1); /* not an RPC set: nothing */
	stk_metrics_ops_client(NULL, "10.1.1.1:1", 1, 1);
	stk_metrics_ops_client(m, "192.0.2.7:5000", 60, 4140);
	stk_metrics_ops_client(m, "192.0.2.7:5001", 40, 40); /* another connection, same host */
	for (int i = 0; i < 4; i++)
		CHECK(pthread_create(&th[i], NULL, client_counter, m) == 0);
	for (int i = 0; i < 4; i++)
		pthread_join(th[i], NULL);
	t = scrape();
	CHECK(sample(t, "stoker_rpc_client_requests_total{client=\"192.0.2.7\"}") == 2);
	CHECK(sample(t, "stoker_rpc_client_received_bytes_total{client=\"192.0.2.7\"}") == 100);
	CHECK(sample(t, "stoker_rpc_client_sent_bytes_total{client=\"192.0.2.7\"}") == 4180);
	CHECK(sample(t, "stoker_rpc_client_requests_total{client=\"10.9.9.9\"}") == 4000);
	CHECK(sample(t, "stoker_rpc_client_received_bytes_total{client=\"10.9.9.9\"}") == 400000);
	CHECK(sample(t, "stoker_rpc_client_sent_bytes_total{client=\"fd00::9\"}") == 8000);
	CHECK(sample(t, "stoker_rpc_client_requests_total{client=\"10.1.1.1\"}") == -1);
	CHECK(sample(t, "stoker_rpc_client_requests_total{client=\"other\"}") == -1);
	free(t);

	/* fill the table: 3 hosts so far, so 61 more get names and the rest are "other" */
	for (int i = 0; i < STK_METRICS_MAX_CLIENTS + 10; i++) {
		snprintf(peer, sizeof(peer), "198.51.100.%d:9", i);
		stk_metrics_ops_client(m, peer, 1, 1);
	}
	t = scrape();
	for (int i = 0; i < STK_METRICS_MAX_CLIENTS + 10; i++) {
		char series[96];
		snprintf(series, sizeof(series),
			 "stoker_rpc_client_requests_total{client=\"198.51.100.%d\"}", i);
		named += sample(t, series) == 1;
	}
	CHECK(named == STK_METRICS_MAX_CLIENTS - 3);
	CHECK(sample(t, "stoker_rpc_client_requests_total{client=\"other\"}") == 13);
	free(t);
	stk_metrics_ops_destroy(fuse);
	stk_metrics_ops_destroy(m);
}

int main(int argc, char **argv)
{
	if (argc > 1 && strcmp(argv[1], "--doc") == 0) {
		char *doc;
		size_t len;
		if (stk_metrics_doc(&doc, &len))
			return 1;
		printf("%s%s%s\n", DOC_BEGIN, doc, DOC_END);
		free(doc);
		return 0;
	}
	CHECK_RUN(test_concurrent);
	CHECK_RUN(test_histogram);
	CHECK_RUN(test_values);
	CHECK_RUN(test_ops);
	CHECK_RUN(test_clients);
	CHECK_RUN(test_collectors);
	CHECK_RUN(test_http);
	CHECK_RUN(test_doc);
	return check_done();
}
