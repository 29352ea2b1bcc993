/*
 * The transport (src/net): a real server (event loops, workers) on loopback and
 * real clients, in one process. Pipelining and out-of-order replies, threads
 * sharing a connection, the per-connection window, the byte budget, a client that
 * stops reading, a malformed frame mid-stream, a flood on one connection, a broken
 * connection failing every waiting request, the pool's sharing, and loop-side
 * handlers (requests answered on the loop, at once or later), and the loop client
 * (calls made from an event loop: pipelined, out of order, a peer that dies, stops
 * reading or hangs, the deadline, the call watch, the key handshake).
 */
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../../src/common/util.h"
#include "../../src/net/net.h"
#include "../../src/net/netint.h"
#include "../../src/proto/status.h"
#include "check.h"

enum { OP_ECHO = 1001, OP_SLEEP, OP_BLOCK, OP_BIG, OP_LECHO, OP_LDEFER, OP_LDROP, OP_BULKSUM, OP_TAKE, OP_DEFER };

/* What the handler saw, for the tests to check. */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cond = PTHREAD_COND_INITIALIZER;
static int g_running, g_max_running, g_released;
static atomic_uint g_seq;

/* Requests a handler took (OP_TAKE), for a thread of the test to answer. */
#define TAKEN_MAX 16
static struct stk_rpc_pending *g_taken[TAKEN_MAX];
static uint32_t g_taken_val[TAKEN_MAX];
static int g_ntaken;

static void defer_step(struct stk_rpc_pending *p, void *arg, int rc)
{
	uint8_t out[8];
	struct stk_wbuf w;

	stk_wbuf_init(&w, out, sizeof(out));
	stk_put_u32(&w, (uint32_t)(uintptr_t)arg + 1);
	stk_put_u32(&w, (uint32_t)-rc);
	stk_rpc_pending_answer(p, 0, out, w.len);
}

static int handler(void *ctx, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	switch (req->hdr.opcode) {
	case OP_TAKE: { /* answered later by the test, from its own thread */
		uint32_t v = stk_get_u32(&req->payload);

		pthread_mutex_lock(&g_lock);
		g_taken_val[g_ntaken] = v;
		g_taken[g_ntaken++] = stk_rpc_pending_take(resp);
		pthread_cond_broadcast(&g_cond);
		pthread_mutex_unlock(&g_lock);
		return STK_RPC_PENDING;
	}
	case OP_DEFER: /* its next step on a worker, which answers it */
		stk_rpc_pending_defer(stk_rpc_pending_take(resp), defer_step,
				      (void *)(uintptr_t)stk_get_u32(&req->payload));
		return STK_RPC_PENDING;
	case OP_ECHO: {
		stk_put_bytes(&resp->payload, req->payload.p, req->payload.len);
		if (req->bulk_len) {
			void *b = stk_rpc_resp_bulk_buf(resp, req->bulk_len);
			if (!b)
				return -ENOMEM;
			memcpy(b, req->bulk, req->bulk_len);
			resp->bulk = b;
			resp->bulk_len = req->bulk_len;
		}
		return 0;
	}
	case OP_SLEEP: {
		uint32_t ms = stk_get_u32(&req->payload);
		usleep(ms * 1000);
		stk_put_u32(&resp->payload, ms);
		stk_put_u32(&resp->payload, atomic_fetch_add(&g_seq, 1));
		return 0;
	}
	case OP_BLOCK:
		pthread_mutex_lock(&g_lock);
		g_running++;
		if (g_running > g_max_running)
			g_max_running = g_running;
		pthread_cond_broadcast(&g_cond);
		while (!g_released)
			pthread_cond_wait(&g_cond, &g_lock);
		g_running--;
		pthread_mutex_unlock(&g_lock);
		return 0;
	case OP_BULKSUM: /* what a forward's successor does: take the bulk, answer small */
		stk_put_u32(&resp->payload, req->bulk_len);
		stk_put_u32(&resp->payload, stk_crc32c(0, req->bulk, req->bulk_len));
		return 0;
	case OP_BIG: {
		uint32_t n = stk_get_u32(&req->payload);
		void *b = stk_rpc_resp_bulk_buf(resp, n);
		if (!b)
			return -ENOMEM;
		memset(b, 0x5a, n);
		resp->bulk = b;
		resp->bulk_len = n;
		return 0;
	}
	}
	return -ENOSYS;
}

struct srv {
	struct stk_server *s;
	pthread_t tid;
};

static void *run_server(void *arg)
{
	stk_server_run(arg);
	return NULL;
}

static void srv_start(struct srv *v, struct stk_server_opts *o)
{
	o->size = sizeof(*o);
	o->listen = "127.0.0.1:0";
	o->handler = handler;
	CHECK_RC(stk_server_create(o, &v->s), 0);
	CHECK(pthread_create(&v->tid, NULL, run_server, v->s) == 0);
	g_running = g_max_running = g_released = 0;
}

static void srv_stop(struct srv *v)
{
	stk_server_stop(v->s);
	pthread_join(v->tid, NULL);
	stk_server_destroy(v->s);
}

static void release_blocked(void)
{
	pthread_mutex_lock(&g_lock);
	g_released = 1;
	pthread_cond_broadcast(&g_cond);
	pthread_mutex_unlock(&g_lock);
}

/* Waits until n handlers are blocked (or 5 s). */
static void wait_running(int n)
{
	uint64_t end = stk_now_ns() + 5000000000ull;

	pthread_mutex_lock(&g_lock);
	while (g_running < n && stk_now_ns() < end) {
		pthread_mutex_unlock(&g_lock);
		usleep(1000);
		pthread_mutex_lock(&g_lock);
	}
	pthread_mutex_unlock(&g_lock);
}

/* Three requests on one connection, the first the slowest: answered as they finish. */
static void test_pipeline_out_of_order(void)
{
	struct stk_server_opts o = {.workers = 4};
	struct srv v;
	struct stk_conn *c;
	uint32_t ms[3] = {400, 10, 150}, seq[3];
	uint8_t req[3][4], resp[3][16];
	struct stk_rpc rpc[3];

	srv_start(&v, &o);
	CHECK_RC(stk_conn_connect(stk_server_addr(v.s), 1000, &c), 0);
	for (int i = 0; i < 3; i++) {
		struct stk_wbuf w;

		stk_wbuf_init(&w, req[i], sizeof(req[i]));
		stk_put_u32(&w, ms[i]);
		rpc[i] = (struct stk_rpc){.opcode = OP_SLEEP, .req = req[i], .req_len = 4,
					  .resp = resp[i], .resp_cap = sizeof(resp[i])};
		CHECK_RC(stk_rpc_send(c, &rpc[i]), 0);
	}
	CHECK(rpc[0].req_id != rpc[1].req_id && rpc[1].req_id != rpc[2].req_id);
	for (int i = 0; i < 3; i++) {
		struct stk_rbuf r;

		CHECK_RC(stk_rpc_recv(c, &rpc[i]), 0);
		CHECK(rpc[i].status == STK_ST_OK && rpc[i].resp_len == 8);
		stk_rbuf_init(&r, resp[i], rpc[i].resp_len);
		CHECK(stk_get_u32(&r) == ms[i]);
		seq[i] = stk_get_u32(&r);
	}
	/* They ran at once: the 10 ms one finished first, the 400 ms one last. */
	CHECK(seq[1] < seq[2] && seq[2] < seq[0]);
	CHECK(stk_conn_pending(c) == 0);
	stk_conn_close(c);
	srv_stop(&v);
}

struct share_arg {
	struct stk_conn *c;
	unsigned seed;
	int bad;
};

static void *share_thread(void *arg)
{
	struct share_arg *a = arg;
	uint8_t *req = malloc(4096), *bulk = malloc(300000), *resp = malloc(4096),
		*bin = malloc(300000);

	for (int i = 0; i < 300 && !a->bad; i++) {
		size_t plen = 1 + rand_r(&a->seed) % 4000, blen = rand_r(&a->seed) % 300000;
		struct stk_rpc rpc = {.opcode = OP_ECHO, .req = req, .req_len = plen,
				      .bulk_out = bulk, .bulk_out_len = blen, .resp = resp,
				      .resp_cap = 4096, .bulk_in = bin, .bulk_in_cap = 300000};

		for (size_t k = 0; k < plen; k++)
			req[k] = (uint8_t)rand_r(&a->seed);
		for (size_t k = 0; k < blen; k += 97)
			bulk[k] = (uint8_t)rand_r(&a->seed);
		if (stk_rpc_call(a->c, &rpc) || rpc.resp_len != plen || rpc.bulk_in_len != blen ||
		    memcmp(req, resp, plen) || memcmp(bulk, bin, blen))
			a->bad = 1;
	}
	free(req);
	free(bulk);
	free(resp);
	free(bin);
	return NULL;
}

/* Eight threads on one connection: each gets its own reply, byte for byte. */
static void test_threads_share_a_connection(void)
{
	struct stk_server_opts o = {0};
	struct share_arg a[8];
	pthread_t t[8];
	struct srv v;
	struct stk_conn *c;

	srv_start(&v, &o);
	CHECK_RC(stk_conn_connect(stk_server_addr(v.s), 1000, &c), 0);
	for (int i = 0; i < 8; i++) {
		a[i] = (struct share_arg){.c = c, .seed = (unsigned)i * 7919u + 1};
		CHECK(pthread_create(&t[i], NULL, share_thread, &a[i]) == 0);
	}
	for (int i = 0; i < 8; i++) {
		pthread_join(t[i], NULL);
		CHECK(!a[i].bad);
	}
	CHECK(!stk_conn_broken(c));
	stk_conn_close(c);
	srv_stop(&v);
}

/* Sends n OP_BLOCK requests with blen bytes of bulk each on c. */
static void send_blocks(struct stk_conn *c, struct stk_rpc *rpc, int n, const void *bulk,
			size_t blen, uint8_t (*resp)[16])
{
	for (int i = 0; i < n; i++) {
		rpc[i] = (struct stk_rpc){.opcode = OP_BLOCK, .bulk_out = bulk, .bulk_out_len = blen,
					  .resp = resp[i], .resp_cap = 16};
		CHECK_RC(stk_rpc_send(c, &rpc[i]), 0);
	}
}

/* A connection with `window` requests unanswered is not read further. */
static void test_window(void)
{
	struct stk_server_opts o = {.workers = 16, .window = 4};
	struct stk_rpc rpc[20];
	uint8_t resp[20][16];
	struct srv v;
	struct stk_conn *c;

	srv_start(&v, &o);
	CHECK_RC(stk_conn_connect(stk_server_addr(v.s), 1000, &c), 0);
	send_blocks(c, rpc, 20, NULL, 0, resp);
	wait_running(4);
	usleep(200000);
	CHECK(g_max_running == 4);
	release_blocked();
	for (int i = 0; i < 20; i++) {
		CHECK_RC(stk_rpc_recv(c, &rpc[i]), 0);
		CHECK(rpc[i].status == STK_ST_OK);
	}
	stk_conn_close(c);
	srv_stop(&v);
}

/* Past the server's byte budget no frame is admitted until replies have left. */
static void test_byte_budget(void)
{
	struct stk_server_opts o = {.workers = 16, .max_inflight_bytes = 1u << 20};
	size_t blen = 400u << 10; /* held as a 512 KiB buffer */
	struct stk_rpc rpc[2][6];
	uint8_t resp[2][6][16];
	struct stk_conn *c[2];
	void *bulk = calloc(1, blen);
	struct srv v;

	srv_start(&v, &o);
	for (int k = 0; k < 2; k++) {
		CHECK_RC(stk_conn_connect(stk_server_addr(v.s), 1000, &c[k]), 0);
		send_blocks(c[k], rpc[k], 6, bulk, blen, resp[k]);
	}
	wait_running(2);
	usleep(200000);
	CHECK(g_max_running == 2);
	release_blocked();
	for (int k = 0; k < 2; k++)
		for (int i = 0; i < 6; i++) {
			CHECK_RC(stk_rpc_recv(c[k], &rpc[k][i]), 0);
			CHECK(rpc[k][i].status == STK_ST_OK);
		}
	for (int k = 0; k < 2; k++)
		stk_conn_close(c[k]);
	free(bulk);
	srv_stop(&v);
}

static int raw_connect(const char *addr)
{
	struct sockaddr_storage ss;
	socklen_t len;
	int fd;

	if (stk_net_resolve(addr, &ss, &len))
		return -1;
	fd = socket(ss.ss_family, SOCK_STREAM, 0);
	if (fd >= 0 && connect(fd, (struct sockaddr *)&ss, len) < 0) {
		close(fd);
		fd = -1;
	}
	return fd;
}

/* A frame with the given opcode and payload, sealed, into out; returns its length. */
static size_t frame(uint8_t *out, uint16_t op, uint64_t id, const void *p, uint32_t plen)
{
	struct stk_frame_hdr h = {.opcode = op, .req_id = id, .payload_len = plen};

	memcpy(out + STK_FRAME_HDR_LEN, p, plen);
	stk_frame_seal(&h, out + STK_FRAME_HDR_LEN, NULL, out);
	return STK_FRAME_HDR_LEN + plen;
}

/* Reads until EOF or error; returns the bytes read. */
static size_t drain(int fd)
{
	static uint8_t buf[1 << 16];
	size_t total = 0;
	ssize_t n;

	while ((n = recv(fd, buf, sizeof(buf), 0)) > 0)
		total += (size_t)n;
	return total;
}

/* A client that stops reading is cut off; another is served meanwhile. */
static void test_slow_reader(void)
{
	struct stk_server_opts o = {.send_timeout_ms = 300};
	uint8_t f[STK_FRAME_HDR_LEN + 4], pl[4] = {0, 0, 16, 0}; /* 1 MiB */
	struct srv v;
	struct stk_conn *c;
	uint64_t t0;
	int fd;
	size_t got;

	srv_start(&v, &o);
	fd = raw_connect(stk_server_addr(v.s));
	CHECK(fd >= 0);
	for (uint64_t i = 0; i < 64; i++) {
		size_t n = frame(f, OP_BIG, i + 1, pl, 4);
		CHECK(send(fd, f, n, MSG_NOSIGNAL) == (ssize_t)n);
	}
	CHECK_RC(stk_conn_connect(stk_server_addr(v.s), 1000, &c), 0);
	t0 = stk_now_ns();
	for (int i = 0; i < 200; i++) {
		uint8_t req[8] = {1, 2, 3}, resp[8];
		struct stk_rpc rpc = {.opcode = OP_ECHO, .req = req, .req_len = 8, .resp = resp,
				      .resp_cap = 8};
		CHECK_RC(stk_rpc_call(c, &rpc), 0);
	}
	CHECK(stk_now_ns() - t0 < 2000000000ull); /* not held up behind the stuck one */
	sleep(1);
	/* Cut off: what was in flight to it ends early, far short of 64 MiB. */
	got = drain(fd);
	CHECK(got < (64u << 20));
	close(fd);
	stk_conn_close(c);
	srv_stop(&v);
}

/* A valid frame then a malformed one: the first is answered, then the connection closes. */
static void test_malformed_mid_stream(void)
{
	struct stk_server_opts o = {0};
	uint8_t buf[2 * STK_FRAME_HDR_LEN + 8], reply[STK_FRAME_HDR_LEN + 8];
	struct stk_frame_hdr h;
	struct srv v;
	size_t n;
	int fd;

	srv_start(&v, &o);
	fd = raw_connect(stk_server_addr(v.s));
	CHECK(fd >= 0);
	n = frame(buf, OP_ECHO, 42, "abcdefgh", 8);
	memset(buf + n, 0xee, STK_FRAME_HDR_LEN);
	CHECK(send(fd, buf, n + STK_FRAME_HDR_LEN, MSG_NOSIGNAL) == (ssize_t)(n + STK_FRAME_HDR_LEN));
	/* The echo may or may not be out before the close; nothing else may come. */
	n = drain(fd);
	CHECK(n == 0 || n == sizeof(reply));
	close(fd);
	/* A frame whose checksum is wrong is not answered at all. */
	fd = raw_connect(stk_server_addr(v.s));
	n = frame(buf, OP_ECHO, 43, "abcdefgh", 8);
	buf[STK_FRAME_HDR_LEN] ^= 1;
	CHECK(send(fd, buf, n, MSG_NOSIGNAL) == (ssize_t)n);
	CHECK(drain(fd) == 0);
	close(fd);
	/* The server still serves. */
	fd = raw_connect(stk_server_addr(v.s));
	n = frame(buf, OP_ECHO, 44, "abcdefgh", 8);
	CHECK(send(fd, buf, n, MSG_NOSIGNAL) == (ssize_t)n);
	CHECK(recv(fd, reply, sizeof(reply), MSG_WAITALL) == (ssize_t)sizeof(reply));
	CHECK_RC(stk_hdr_decode(reply, &h), 0);
	CHECK(h.req_id == 44 && (h.flags & STK_FRAME_REPLY) && h.status == STK_ST_OK);
	close(fd);
	srv_stop(&v);
}

/* 50,000 requests on one connection, 256 on the wire at a time: every one answered. */
static void test_flood(void)
{
	enum { N = 50000, W = 256 };
	struct stk_server_opts o = {0};
	static struct stk_rpc rpc[W];
	static uint8_t req[W][8], resp[W][8];
	struct srv v;
	struct stk_conn *c;
	unsigned answered = 0;

	srv_start(&v, &o);
	CHECK_RC(stk_conn_connect(stk_server_addr(v.s), 1000, &c), 0);
	for (unsigned i = 0; i < N + W; i++) {
		unsigned k = i % W;

		if (i >= W) {
			CHECK_RC(stk_rpc_recv(c, &rpc[k]), 0);
			if (rpc[k].status == STK_ST_OK && rpc[k].resp_len == 8 &&
			    memcmp(req[k], resp[k], 8) == 0)
				answered++;
		}
		if (i < N) {
			memcpy(req[k], &i, sizeof(i));
			rpc[k] = (struct stk_rpc){.opcode = OP_ECHO, .req = req[k], .req_len = 8,
						  .resp = resp[k], .resp_cap = 8};
			CHECK_RC(stk_rpc_send(c, &rpc[k]), 0);
		}
	}
	CHECK(answered == N);
	stk_conn_close(c);
	srv_stop(&v);
}


static void *stop_later(void *arg)
{
	usleep(100000);
	srv_stop(arg);
	return NULL;
}

/* The server goes away with requests waiting: each fails, none hangs. */
static void test_broken_fails_every_waiting_request(void)
{
	struct stk_server_opts o = {.workers = 4};
	struct stk_rpc rpc[3];
	uint8_t req[3][4], resp[3][16];
	struct srv v;
	struct stk_conn *c;
	pthread_t t;

	srv_start(&v, &o);
	CHECK_RC(stk_conn_connect(stk_server_addr(v.s), 1000, &c), 0);
	for (int i = 0; i < 3; i++) {
		struct stk_wbuf w;

		stk_wbuf_init(&w, req[i], sizeof(req[i]));
		stk_put_u32(&w, 2000);
		rpc[i] = (struct stk_rpc){.opcode = OP_SLEEP, .req = req[i], .req_len = 4,
					  .resp = resp[i], .resp_cap = sizeof(resp[i])};
		CHECK_RC(stk_rpc_send(c, &rpc[i]), 0);
	}
	CHECK(pthread_create(&t, NULL, stop_later, &v) == 0);
	for (int i = 0; i < 3; i++)
		CHECK(stk_rpc_recv(c, &rpc[i]) < 0);
	CHECK(stk_conn_broken(c));
	CHECK(stk_rpc_send(c, &rpc[0]) == -ENOTCONN);
	pthread_join(t, NULL);
	stk_conn_close(c);
}

/* The pool shares a connection while it is idle and opens more while all are busy. */
static void test_pool_shares(void)
{
	struct stk_server_opts o = {.workers = 4};
	struct stk_conn *a, *b, *c2, *d;
	struct stk_rpc rpc[2];
	uint8_t resp[2][16];
	struct stk_pool *p;
	struct srv v;

	srv_start(&v, &o);
	CHECK_RC(stk_pool_create(2, &p), 0);
	CHECK_RC(stk_pool_get(p, stk_server_addr(v.s), &a), 0);
	CHECK_RC(stk_pool_get(p, stk_server_addr(v.s), &b), 0);
	CHECK(a == b); /* nothing waiting on it: shared */
	send_blocks(a, &rpc[0], 1, NULL, 0, &resp[0]);
	CHECK_RC(stk_pool_get(p, stk_server_addr(v.s), &c2), 0);
	CHECK(c2 != a); /* busy: a second one */
	send_blocks(c2, &rpc[1], 1, NULL, 0, &resp[1]);
	CHECK_RC(stk_pool_get(p, stk_server_addr(v.s), &d), 0);
	CHECK(d == a || d == c2); /* at the limit: the least busy */
	release_blocked();
	CHECK_RC(stk_rpc_recv(a, &rpc[0]), 0);
	CHECK_RC(stk_rpc_recv(c2, &rpc[1]), 0);
	stk_pool_put(p, a);
	stk_pool_put(p, b);
	stk_pool_put(p, c2);
	stk_pool_put(p, d);
	stk_pool_flush(p);
	stk_pool_destroy(p);
	srv_stop(&v);
}


/* ---- loop-side handlers ---- */

/*
 * A service that answers OP_LECHO on the loop at once, takes OP_LDEFER and OP_LDROP
 * (pending), and leaves the rest to the workers. Its flush writes a byte into a
 * pipe the loop watches; the event then answers every OP_LDEFER, last taken first
 * (out of order), and value 13 with ENOENT. OP_LDROP is answered by detach alone.
 */
#define TL_MAX 256
struct tloop {
	int pipe[2];
	struct stk_rpc_pending *pend[TL_MAX];
	uint32_t val[TL_MAX];
	int npend;
	struct stk_rpc_pending *drop[TL_MAX];
	int ndrop;
};
static atomic_int g_attached, g_detached, g_flushes, g_loop_handled;

static int tl_attach(void *ctx, unsigned loop, void **state, int *fd)
{
	struct tloop *t = calloc(1, sizeof(*t));

	if (!t || pipe2(t->pipe, O_CLOEXEC | O_NONBLOCK) < 0) {
		free(t);
		return -ENOMEM;
	}
	*state = t;
	*fd = t->pipe[0];
	atomic_fetch_add(&g_attached, 1);
	return 0;
}

static void tl_event(void *ctx, void *state)
{
	struct tloop *t = state;
	char b[64];

	while (read(t->pipe[0], b, sizeof(b)) > 0)
		;
	while (t->npend) {
		int i = --t->npend;
		struct stk_rpc_resp *resp;

		if (t->val[i] == 13) {
			stk_rpc_pending_done(t->pend[i], -ENOENT);
			continue;
		}
		resp = stk_rpc_pending_resp(t->pend[i]);
		stk_put_u32(&resp->payload, t->val[i] * 2);
		stk_rpc_pending_done(t->pend[i], 0);
	}
}

static int tl_handle(void *ctx, void *state, struct stk_rpc_req *req, struct stk_rpc_resp *resp,
		     struct stk_rpc_pending *p)
{
	struct tloop *t = state;

	atomic_fetch_add(&g_loop_handled, 1);
	switch (req->hdr.opcode) {
	case OP_LECHO:
		stk_put_bytes(&resp->payload, req->payload.p, req->payload.len);
		return 0;
	case OP_LDEFER:
		if (t->npend == TL_MAX)
			return STK_RPC_TO_WORKER;
		t->val[t->npend] = stk_get_u32(&req->payload);
		t->pend[t->npend++] = p;
		return STK_RPC_PENDING;
	case OP_LDROP:
		if (t->ndrop == TL_MAX)
			return STK_RPC_TO_WORKER;
		t->drop[t->ndrop++] = p;
		return STK_RPC_PENDING;
	}
	return STK_RPC_TO_WORKER;
}

static void tl_flush(void *ctx, void *state)
{
	struct tloop *t = state;

	atomic_fetch_add(&g_flushes, 1);
	if (t->npend && write(t->pipe[1], "x", 1) < 0) {
		/* full: the loop will look anyway */
	}
}

static void tl_detach(void *ctx, void *state)
{
	struct tloop *t = state;

	while (t->npend)
		stk_rpc_pending_done(t->pend[--t->npend], -ECANCELED);
	while (t->ndrop)
		stk_rpc_pending_done(t->drop[--t->ndrop], -ECANCELED);
	close(t->pipe[0]);
	close(t->pipe[1]);
	free(t);
	atomic_fetch_add(&g_detached, 1);
}

static const struct stk_server_loop_ops tl_ops = {
	.attach = tl_attach,
	.event = tl_event,
	.handle = tl_handle,
	.flush = tl_flush,
	.detach = tl_detach,
};

/*
 * Requests answered on the loop at once, later from the loop's own event (out of
 * order, one with an error), and by workers, interleaved on one connection; one
 * with bulk never offered to the loop; pending requests answered by detach when
 * the server goes, with no leak and no hang.
 */
static void test_loop_handlers(void)
{
	struct stk_server_opts o = {.workers = 2, .loops = 2, .loop_ops = &tl_ops};
	enum { N = 60 };
	struct srv v;
	struct stk_conn *c;
	struct stk_rpc rpc[N], bulk_rpc, drop;
	uint8_t req[N][4], resp[N][16], bresp[16], bulk[8] = "12345678";
	uint16_t ops[3] = {OP_LDEFER, OP_LECHO, OP_ECHO};

	atomic_store(&g_attached, 0);
	atomic_store(&g_detached, 0);
	atomic_store(&g_loop_handled, 0);
	srv_start(&v, &o);
	CHECK(atomic_load(&g_attached) == 2);
	CHECK_RC(stk_conn_connect(stk_server_addr(v.s), 1000, &c), 0);
	for (int round = 0; round < 3; round++) {
		for (int i = 0; i < N; i++) {
			struct stk_wbuf w;

			stk_wbuf_init(&w, req[i], sizeof(req[i]));
			stk_put_u32(&w, (uint32_t)i);
			rpc[i] = (struct stk_rpc){.opcode = ops[i % 3], .req = req[i], .req_len = 4,
						  .resp = resp[i], .resp_cap = sizeof(resp[i])};
			CHECK_RC(stk_rpc_send(c, &rpc[i]), 0);
		}
		for (int i = N - 1; i >= 0; i--) {
			struct stk_rbuf r;

			CHECK_RC(stk_rpc_recv(c, &rpc[i]), 0);
			if (rpc[i].opcode == OP_LDEFER && i == 13) {
				CHECK(rpc[i].status == STK_ST_NOENT && rpc[i].resp_len == 0);
				continue;
			}
			CHECK(rpc[i].status == STK_ST_OK && rpc[i].resp_len == 4);
			stk_rbuf_init(&r, resp[i], rpc[i].resp_len);
			CHECK(stk_get_u32(&r) == (rpc[i].opcode == OP_LDEFER ? 2u * i : (uint32_t)i));
		}
	}
	/* every OP_LDEFER and OP_LECHO was offered, and each OP_ECHO too (then left) */
	CHECK(atomic_load(&g_loop_handled) == 3 * N);
	CHECK(atomic_load(&g_flushes) > 0);
	/* a request with bulk goes straight to a worker (which knows no OP_LECHO) */
	bulk_rpc = (struct stk_rpc){.opcode = OP_LECHO, .req = req[0], .req_len = 4,
				    .bulk_out = bulk, .bulk_out_len = sizeof(bulk), .resp = bresp,
				    .resp_cap = sizeof(bresp)};
	CHECK_RC(stk_rpc_call(c, &bulk_rpc), -ENOSYS);
	CHECK(atomic_load(&g_loop_handled) == 3 * N);
	/* a frame with a bad checksum, offered to the loop: no answer, that connection closes */
	{
		uint8_t buf[STK_FRAME_HDR_LEN + 4];
		size_t n = frame(buf, OP_LECHO, 77, "abcd", 4);
		int fd = raw_connect(stk_server_addr(v.s));

		CHECK(fd >= 0);
		buf[STK_FRAME_HDR_LEN] ^= 1;
		CHECK(send(fd, buf, n, MSG_NOSIGNAL) == (ssize_t)n);
		CHECK(drain(fd) == 0);
		close(fd);
		CHECK(atomic_load(&g_loop_handled) == 3 * N);
	}
	/* pending when the server goes: detach answers it */
	drop = (struct stk_rpc){.opcode = OP_LDROP, .req = req[0], .req_len = 4, .resp = bresp,
				.resp_cap = sizeof(bresp)};
	CHECK_RC(stk_rpc_send(c, &drop), 0);
	while (atomic_load(&g_loop_handled) == 3 * N)
		usleep(1000);
	srv_stop(&v);
	CHECK(atomic_load(&g_detached) == 2);
	CHECK(stk_rpc_recv(c, &drop) != 0 || drop.status == stk_status_from_errno(-ECANCELED));
	stk_conn_close(c);
}

/*
 * A worker's handler takes its request and it is answered later from another
 * thread (in another order than it came), or its next step runs on a worker
 * (stk_rpc_pending_defer), while the connection serves other requests.
 */
static void test_taken_requests(void)
{
	struct stk_server_opts o = {.workers = 2};
	struct stk_rpc t[3], d, e;
	uint8_t treq[3][4], tresp[3][16], dreq[4], dresp[16], ereq[4], eresp[16];
	struct stk_conn *c;
	struct stk_wbuf w;
	struct stk_rbuf rb;
	struct srv v;

	srv_start(&v, &o);
	g_ntaken = 0;
	if (stk_conn_connect(stk_server_addr(v.s), 2000, &c)) {
		CHECK_FAIL("connect");
		srv_stop(&v);
		return;
	}
	for (int i = 0; i < 3; i++) {
		stk_wbuf_init(&w, treq[i], sizeof(treq[i]));
		stk_put_u32(&w, 100 + i);
		stk_rpc_prepare(&t[i], OP_TAKE, &w, tresp[i], sizeof(tresp[i]));
		CHECK_RC(stk_rpc_send(c, &t[i]), 0);
	}
	for (uint64_t end = stk_now_ns() + 5000000000ull; stk_now_ns() < end;) {
		int n;

		pthread_mutex_lock(&g_lock);
		n = g_ntaken;
		pthread_mutex_unlock(&g_lock);
		if (n == 3)
			break;
		usleep(1000);
	}
	if (g_ntaken != 3) {
		CHECK_FAIL("the handler took %d requests, not 3", g_ntaken);
		return; /* a server holding taken requests cannot be stopped cleanly */
	}
	/* Taken, not answered: the connection serves others meanwhile, on a worker. */
	stk_wbuf_init(&w, dreq, sizeof(dreq));
	stk_put_u32(&w, 41);
	stk_rpc_prepare(&d, OP_DEFER, &w, dresp, sizeof(dresp));
	CHECK_RC(stk_rpc_call(c, &d), 0);
	stk_rbuf_init(&rb, dresp, d.resp_len);
	CHECK_EQ(stk_get_u32(&rb), 42);
	CHECK_EQ(stk_get_u32(&rb), 0); /* ran on a worker, not cancelled */
	/* The taken ones, answered from this thread, the last first; one with an error. */
	for (int i = 2; i >= 0; i--) {
		uint8_t out[4];

		stk_wbuf_init(&w, out, sizeof(out));
		stk_put_u32(&w, g_taken_val[i] * 2);
		stk_rpc_pending_answer(g_taken[i], g_taken_val[i] == 101 ? -ENOENT : 0, out, w.len);
	}
	for (int i = 0; i < 3; i++) {
		CHECK_RC(stk_rpc_recv(c, &t[i]), 0);
		if (i == 1) {
			CHECK_EQ(stk_status_to_errno(t[i].status), -ENOENT);
			CHECK_EQ(t[i].resp_len, 0);
			continue;
		}
		CHECK_EQ(t[i].status, 0);
		stk_rbuf_init(&rb, tresp[i], t[i].resp_len);
		CHECK_EQ(stk_get_u32(&rb), (100 + i) * 2);
	}
	/* Still sound after. */
	stk_wbuf_init(&w, ereq, sizeof(ereq));
	stk_put_u32(&w, 7);
	stk_rpc_prepare(&e, OP_DEFER, &w, eresp, sizeof(eresp));
	CHECK_RC(stk_rpc_call(c, &e), 0);
	stk_conn_close(c);
	srv_stop(&v);
}

/* ---- the loop client ---- */

/* An event loop of the test's own that drives a loop client. */
struct lloop {
	int epfd;
	struct stk_lclient *lc;
	pthread_t tid;
	atomic_int stop;
};

static void *lloop_main(void *arg)
{
	struct lloop *l = arg;

	while (!atomic_load(&l->stop)) {
		struct epoll_event ev[16];
		int n = epoll_wait(l->epfd, ev, 16, 20);

		/* every descriptor here is the client's; an event of a connection closed
		 * earlier in the batch is ignored (0) */
		for (int i = 0; i < n; i++)
			stk_lclient_event(l->lc, ev[i].data.ptr, ev[i].events);
		stk_lclient_batch_end(l->lc);
	}
	return NULL;
}

static int lloop_start(struct lloop *l, unsigned timeout_ms, struct stk_callwatch *w)
{
	memset(l, 0, sizeof(*l));
	l->epfd = epoll_create1(EPOLL_CLOEXEC);
	REQUIRE(l->epfd >= 0);
	REQUIRE(stk_lclient_create(l->epfd, timeout_ms, w, &l->lc) == 0);
	REQUIRE(pthread_create(&l->tid, NULL, lloop_main, l) == 0);
	return 0;
}

/* Stops the loop, then destroys the client (its calls not done fail -ECANCELED). */
static void lloop_stop(struct lloop *l)
{
	atomic_store(&l->stop, 1);
	pthread_join(l->tid, NULL);
	stk_lclient_destroy(l->lc);
	close(l->epfd);
}

struct lres {
	struct stk_lcall call;
	uint8_t req[16];
	uint8_t resp[64];
	int rc, ndone, order;
};

static pthread_mutex_t g_lmu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_lcv = PTHREAD_COND_INITIALIZER;
static int g_lseq;

static void lres_done(struct stk_lcall *call, int rc)
{
	struct lres *r = call->ctx;

	pthread_mutex_lock(&g_lmu);
	r->ndone++;
	r->rc = rc;
	r->order = ++g_lseq;
	pthread_cond_broadcast(&g_lcv);
	pthread_mutex_unlock(&g_lmu);
}

static void lres_init(struct lres *r, const char *addr, uint16_t op, const void *bulk,
		      size_t bulk_len)
{
	memset(r, 0, sizeof(*r));
	r->call.opcode = op;
	r->call.req = r->req;
	r->call.bulk = bulk;
	r->call.bulk_len = bulk_len;
	r->call.resp = r->resp;
	r->call.resp_cap = sizeof(r->resp);
	snprintf(r->call.addr, sizeof(r->call.addr), "%s", addr);
	r->call.done = lres_done;
	r->call.ctx = r;
}

/* A sleep of ms on the server. */
static void lres_sleep(struct lres *r, const char *addr, uint32_t ms)
{
	struct stk_wbuf w;

	lres_init(r, addr, OP_SLEEP, NULL, 0);
	stk_wbuf_init(&w, r->req, sizeof(r->req));
	stk_put_u32(&w, ms);
	r->call.req_len = w.len;
}

/* Waits until r is done (or ms pass); its done count. */
static int lres_wait(struct lres *r, unsigned ms)
{
	uint64_t end = stk_now_ns() + (uint64_t)ms * 1000000ull;
	int n;

	pthread_mutex_lock(&g_lmu);
	while (!r->ndone && stk_now_ns() < end) {
		pthread_mutex_unlock(&g_lmu);
		usleep(2000);
		pthread_mutex_lock(&g_lmu);
	}
	n = r->ndone;
	pthread_mutex_unlock(&g_lmu);
	return n;
}

/*
 * Calls pipelined on one connection, answered out of order (the slow one last),
 * and many more with bulk, each reply matched to its own call.
 */
static int test_lclient_pipeline_(void)
{
	enum { N = 200 };
	struct stk_server_opts o = {.workers = 8};
	static struct lres r[3], b[N];
	static uint8_t bulk[N][3000];
	struct lloop l;
	struct srv v;
	const char *addr;

	srv_start(&v, &o);
	addr = stk_server_addr(v.s);
	REQUIRE(lloop_start(&l, 0, NULL) == 0);
	g_lseq = 0;
	lres_sleep(&r[0], addr, 300);
	lres_sleep(&r[1], addr, 10);
	lres_sleep(&r[2], addr, 100);
	for (int i = 0; i < 3; i++)
		CHECK_RC(stk_lclient_call(l.lc, &r[i].call), 0);
	CHECK_EQ(lres_wait(&r[0], 5000), 1);
	CHECK_EQ(lres_wait(&r[1], 100), 1);
	CHECK_EQ(lres_wait(&r[2], 100), 1);
	for (int i = 0; i < 3; i++) {
		CHECK_RC(r[i].rc, 0);
		CHECK_EQ(r[i].call.status, 0);
		CHECK_EQ(r[i].call.resp_len, 8);
	}
	CHECK(r[1].order < r[2].order && r[2].order < r[0].order);
	for (int i = 0; i < N; i++) {
		size_t len = 1 + (size_t)i * 13 % sizeof(bulk[i]);

		memset(bulk[i], i, len);
		lres_init(&b[i], addr, OP_BULKSUM, bulk[i], len);
		b[i].call.frame_flags = 0;
		CHECK_RC(stk_lclient_call(l.lc, &b[i].call), 0);
	}
	for (int i = 0; i < N; i++) {
		size_t len = 1 + (size_t)i * 13 % sizeof(bulk[i]);
		struct stk_rbuf rb;

		REQUIRE(lres_wait(&b[i], 5000) == 1);
		CHECK_RC(b[i].rc, 0);
		stk_rbuf_init(&rb, b[i].resp, b[i].call.resp_len);
		CHECK_EQ(stk_get_u32(&rb), len);
		CHECK_EQ(stk_get_u32(&rb), stk_crc32c(0, bulk[i], len));
	}
	/* A call the server does not know: a reply with its status, not a failure. */
	lres_init(&r[0], addr, 999, NULL, 0);
	CHECK_RC(stk_lclient_call(l.lc, &r[0].call), 0);
	CHECK_EQ(lres_wait(&r[0], 5000), 1);
	CHECK_RC(r[0].rc, 0);
	CHECK_EQ(stk_status_to_errno(r[0].call.status), -ENOSYS);
	/* Refused at once: nothing to send, no callback. */
	lres_init(&r[1], "", OP_SLEEP, NULL, 0);
	CHECK_RC(stk_lclient_call(l.lc, &r[1].call), -EINVAL);
	lres_init(&r[1], addr, OP_BULKSUM, bulk, (size_t)STK_MAX_BULK + 1);
	CHECK_RC(stk_lclient_call(l.lc, &r[1].call), -EMSGSIZE);
	lloop_stop(&l);
	srv_stop(&v);
	CHECK_EQ(r[1].ndone, 0);
	for (int i = 0; i < N; i++)
		CHECK_EQ(b[i].ndone, 1);
	return 0;
}

static void test_lclient_pipeline(void)
{
	test_lclient_pipeline_();
}

/* A listener of the test's own: "127.0.0.1:PORT" into addr; its descriptor. */
static int raw_listen(char *addr, size_t len)
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000001)};
	socklen_t sl = sizeof(sa);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof(sa)) || listen(fd, 8) ||
	    getsockname(fd, (struct sockaddr *)&sa, &sl)) {
		if (fd >= 0)
			close(fd);
		return -1;
	}
	snprintf(addr, len, "127.0.0.1:%u", ntohs(sa.sin_port));
	return fd;
}

/*
 * Peers that fail: one that reads a little and dies mid-call, one that stops
 * reading (the deadline ends it), one that refuses; each call fails exactly once
 * with a transport error, and calls to a sound server on the same client go on.
 */
static int test_lclient_failures_(void)
{
	static uint8_t big[8u << 20];
	struct stk_server_opts o = {.workers = 4};
	struct lres a, b, c, d, ok;
	char dead[64], deaf[64], nobody[64];
	int ldead = raw_listen(dead, sizeof(dead)), ldeaf = raw_listen(deaf, sizeof(deaf));
	int lnone = raw_listen(nobody, sizeof(nobody)), fd;
	uint8_t buf[100];
	struct lloop l;
	struct srv v;
	uint64_t t0;

	REQUIRE(ldead >= 0 && ldeaf >= 0 && lnone >= 0);
	close(lnone); /* nobody listens there now */
	srv_start(&v, &o);
	REQUIRE(lloop_start(&l, 600, NULL) == 0);
	/* Dies mid-call: reads part of the frame, then closes. */
	lres_init(&a, dead, OP_BULKSUM, big, 1u << 20);
	CHECK_RC(stk_lclient_call(l.lc, &a.call), 0);
	fd = accept(ldead, NULL, NULL);
	REQUIRE(fd >= 0);
	CHECK(recv(fd, buf, sizeof(buf), MSG_WAITALL) == (ssize_t)sizeof(buf));
	close(fd);
	CHECK_EQ(lres_wait(&a, 5000), 1);
	CHECK(a.rc == -ECONNRESET || a.rc == -EPIPE);
	/* Stops reading: 8 MiB fill its socket; no byte moves for the deadline. */
	t0 = stk_now_ns();
	lres_init(&b, deaf, OP_BULKSUM, big, sizeof(big));
	CHECK_RC(stk_lclient_call(l.lc, &b.call), 0);
	fd = accept(ldeaf, NULL, NULL);
	REQUIRE(fd >= 0);
	/* Meanwhile a sound server answers on the same loop. */
	lres_sleep(&ok, stk_server_addr(v.s), 1);
	CHECK_RC(stk_lclient_call(l.lc, &ok.call), 0);
	CHECK_EQ(lres_wait(&ok, 5000), 1);
	CHECK_RC(ok.rc, 0);
	CHECK_EQ(lres_wait(&b, 5000), 1);
	CHECK_RC(b.rc, -ETIMEDOUT);
	CHECK(stk_now_ns() - t0 >= 500000000ull);
	close(fd);
	/* Refused. */
	lres_sleep(&c, nobody, 1);
	CHECK_RC(stk_lclient_call(l.lc, &c.call), 0);
	CHECK_EQ(lres_wait(&c, 5000), 1);
	CHECK_RC(c.rc, -ECONNREFUSED);
	/* In flight when the client is destroyed: -ECANCELED, once. */
	lres_sleep(&d, stk_server_addr(v.s), 2000);
	CHECK_RC(stk_lclient_call(l.lc, &d.call), 0);
	usleep(100000);
	lloop_stop(&l);
	CHECK_EQ(d.ndone, 1);
	CHECK_RC(d.rc, -ECANCELED);
	CHECK_EQ(a.ndone + b.ndone + c.ndone + ok.ndone, 4);
	srv_stop(&v);
	close(ldead);
	close(ldeaf);
	return 0;
}

static void test_lclient_failures(void)
{
	test_lclient_failures_();
}

static atomic_int g_gone_asked;

static int all_gone(void *ctx, const char *addr)
{
	atomic_fetch_add(&g_gone_asked, 1);
	return 1;
}

/* A peer that hangs (reads, never answers): the call watch ends the call early. */
static int test_lclient_watch_(void)
{
	struct stk_callwatch *w;
	struct lres a;
	char hung[64];
	int lfd = raw_listen(hung, sizeof(hung)), fd;
	struct lloop l;
	uint64_t t0 = stk_now_ns();

	REQUIRE(lfd >= 0);
	REQUIRE(stk_callwatch_create(200, all_gone, NULL, &w) == 0);
	REQUIRE(lloop_start(&l, 60000, w) == 0);
	lres_sleep(&a, hung, 1);
	CHECK_RC(stk_lclient_call(l.lc, &a.call), 0);
	fd = accept(lfd, NULL, NULL);
	REQUIRE(fd >= 0);
	CHECK_EQ(lres_wait(&a, 5000), 1);
	CHECK(a.rc == -ECONNRESET || a.rc == -EPIPE);
	CHECK(atomic_load(&g_gone_asked) > 0);
	CHECK(stk_now_ns() - t0 < 5000000000ull); /* not the 60 s deadline */
	lloop_stop(&l);
	stk_callwatch_destroy(w);
	close(fd);
	close(lfd);
	return 0;
}

static void test_lclient_watch(void)
{
	test_lclient_watch_();
}

/*
 * The key handshake, a step at a time on the loop: a server with the key this
 * process holds is called; one with another key is refused (-EKEYREJECTED).
 * Last: it leaves a key held by the process.
 */
static int test_lclient_auth_(void)
{
	uint8_t key[32], other[32];
	struct stk_server_opts o = {.workers = 4, .auth_key = key, .auth_key_len = sizeof(key)};
	struct stk_server_opts o2 = {.workers = 4, .auth_key = other, .auth_key_len = sizeof(other)};
	struct lres a, b;
	struct lloop l;
	struct srv v, v2;

	memset(key, 0x11, sizeof(key));
	memset(other, 0x22, sizeof(other));
	REQUIRE(stk_net_auth_set(key, sizeof(key)) == 0);
	srv_start(&v, &o);
	srv_start(&v2, &o2);
	REQUIRE(lloop_start(&l, 0, NULL) == 0);
	lres_sleep(&a, stk_server_addr(v.s), 1);
	CHECK_RC(stk_lclient_call(l.lc, &a.call), 0);
	lres_sleep(&b, stk_server_addr(v2.s), 1);
	CHECK_RC(stk_lclient_call(l.lc, &b.call), 0);
	CHECK_EQ(lres_wait(&a, 5000), 1);
	CHECK_RC(a.rc, 0);
	CHECK_EQ(a.call.status, 0);
	CHECK_EQ(lres_wait(&b, 5000), 1);
	CHECK_RC(b.rc, -EKEYREJECTED);
	lloop_stop(&l);
	srv_stop(&v);
	srv_stop(&v2);
	return 0;
}

static void test_lclient_auth(void)
{
	test_lclient_auth_();
}

int main(void)
{
	CHECK_RUN(test_pipeline_out_of_order);
	CHECK_RUN(test_threads_share_a_connection);
	CHECK_RUN(test_window);
	CHECK_RUN(test_byte_budget);
	CHECK_RUN(test_slow_reader);
	CHECK_RUN(test_malformed_mid_stream);
	CHECK_RUN(test_flood);
	CHECK_RUN(test_broken_fails_every_waiting_request);
	CHECK_RUN(test_pool_shares);
	CHECK_RUN(test_loop_handlers);
	CHECK_RUN(test_taken_requests);
	CHECK_RUN(test_lclient_pipeline);
	CHECK_RUN(test_lclient_failures);
	CHECK_RUN(test_lclient_watch);
	CHECK_RUN(test_lclient_auth); /* last: leaves a key held */
	return check_done();
}
