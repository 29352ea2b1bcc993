/*
 * The RPC server: a few event-loop threads that own the connections, and a pool of
 * workers that run the handlers.
 *
 * Why this shape: a node serving many hosts holds thousands of connections, most of
 * them idle at any moment. A thread per connection costs a stack and a scheduler
 * entry each; here a connection costs one small struct (struct srv_conn) and its
 * socket, and a fixed number of loop threads (one per core by default) move every
 * byte. Handlers may block (an LMDB write transaction, a disk read, a meta long
 * poll), so they never run while a thread holds a loop: a loop reads whole frames
 * straight into buffers taken from the server's pool and, at the end of its round,
 * hands them to workers. A loop never blocks and never checksums bulk.
 *
 * The hand-over (loop_ready()): loops and workers are one pool of threads. When a
 * round has read requests and a thread of the pool is idle, the thread holding the
 * loop gives the loop to that idle thread and runs one of the requests itself (the
 * others go to workers), then waits as a worker. A lone request is so answered by
 * the thread that read it, with no wake-up between its arrival and its handler; the
 * wake-up of the thread taking the loop happens beside it. With no thread idle, every
 * request goes to the workers' queue and the loop goes on.
 *
 * A connection carries many requests at once (up to `window`): a loop keeps reading
 * frames while earlier ones are being served, and replies go out in the order they
 * are ready, each with its request's id (wire.h), so a client matches them.
 *
 * Back-pressure: a connection with `window` requests unanswered is not read until
 * one is answered; while the bytes held by requests of the whole server exceed
 * `max_inflight_bytes`, no loop admits a new frame (its connection waits, parked)
 * until replies have left. TCP then pushes back on the clients. A client that stops
 * reading its replies is cut off once a reply has waited `send_timeout_ms` without a
 * byte leaving; others are not held up, since nothing blocks on a socket.
 *
 * Threads and ownership: a connection belongs to one loop thread, which alone
 * reads from it, opens and closes it. A request goes loop -> worker queue -> worker.
 * The worker then sends the reply itself when nothing is queued before it on the
 * connection (send_direct(): the reply leaves at once, with no wait for the loop to
 * wake; the sending side is under the connection's olock); otherwise, or when the
 * socket is full, the reply goes to the loop (its completion list and an eventfd, or
 * a "kick" of the connection), which writes it when the socket takes it. A request
 * holds a reference on its connection (refs and inflight are atomic), so a
 * connection closed while a worker runs one of its requests stays allocated until
 * the last reference goes, and is then freed by its loop at the end of a round.
 *
 * Threads: `loops` + `workers` always; where a handler may wait for another request
 * (a meta change waits for a cache holder's acknowledgement, which arrives as a
 * request), the pool grows, up to `max_workers`, when a request finds no idle
 * worker, and threads above `workers` leave after a while idle.
 *
 * The cluster key (opts->auth_key, common/auth.h): a new connection is not yet
 * trusted. The loop itself answers its AUTH_HELLO and checks its AUTH_PROOF (two
 * HMACs: microseconds, so the loop does not stall on them), and hands its frames to
 * workers only once the proof passed. Anything else first, a wrong proof, a frame
 * too large for a handshake, or no proof within AUTH_TIMEOUT_NS closes the
 * connection, with a log line and stoker_auth_failures_total{reason}; a small
 * request is answered AUTH first, so a client without the key hears why.
 *
 * Memory: requests (struct srv_req) and their buffers come from free lists and are
 * returned there; buffers are kept by power-of-two size class from 64 bytes, those
 * of 4 KiB and more page-aligned (a handler may give a write's bulk to O_DIRECT),
 * up to a cap of cached bytes. An idle connection holds no buffer: its struct
 * srv_conn (about 450 bytes, 256 of them for reading ahead) and its socket are all
 * it costs.
 */
#include "net.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "../common/auth.h"
#include "../common/log.h"
#include "../common/metrics.h"
#include "../common/util.h"
#include "../proto/msg.h"
#include "../proto/status.h"
#include "netint.h"
#include "tls.h"

#define SRV_IOV_MAX 64
#define SRV_READ_AHEAD 256
#define SRV_ACCEPT_BATCH 64
#define SRV_TICK_MS 500
#define SRV_SLOW_LOOP_NS (200ull * 1000 * 1000)
#define SRV_WORKER_IDLE_NS (10ull * 1000 * 1000 * 1000)
#define AUTH_TIMEOUT_NS (5ull * 1000 * 1000 * 1000) /* to finish the key handshake */
#define AUTH_FRAME_MAX 4096u /* the largest request read from a peer not yet trusted */

/* Why a peer failed the key handshake: stoker_auth_failures_total{reason}. */
enum {
	AUTH_NO_HANDSHAKE,
	AUTH_BAD_PROOF,
	AUTH_MALFORMED,
	AUTH_TIMEOUT,
	AUTH_REVOKED,
	AUTH_TLS_PLAINTEXT,
	AUTH_TLS_HANDSHAKE,
	AUTH_NREASONS
};
static const char *const auth_reasons[AUTH_NREASONS] = {
	"no_handshake", "bad_proof", "malformed", "timeout", "revoked", "tls_plaintext", "tls_handshake"};

struct srv_conn;
struct srv_loop;

struct srv_req {
	struct srv_req *next; /* worker queue, completion list or reply queue */
	struct srv_conn *conn; /* holds a reference */
	struct stk_frame_hdr hdr;
	uint8_t *in; /* payload, pool buffer of in_cap bytes */
	size_t in_cap;
	uint8_t *bulk; /* request bulk, pool buffer */
	size_t bulk_cap;
	uint8_t *out; /* reply payload, pool buffer */
	size_t out_cap;
	void *rbulk; /* reply bulk buffer handed out by stk_rpc_resp_bulk_buf */
	size_t rbulk_cap;
	const void *reply_bulk; /* what the reply's bulk points at */
	struct stk_frame_hdr rh;
	uint8_t rhb[STK_FRAME_HDR_LEN];
	size_t sent; /* bytes of the reply frame written so far */
	size_t held; /* bytes counted in srv->inflight_bytes */
	uint64_t t0; /* when it was read whole (stk_metrics_ops_begin) */
	int begun; /* counted in flight, not yet taken out (stk_metrics_ops_sent) */
	int close; /* the frame was malformed: close the connection, no reply */
	int checked; /* frame_check passed (on the loop, before a worker got it) */
	int requeued; /* handed back to the workers (stk_rpc_pending_requeue) */
	stk_rpc_defer_fn defer_fn; /* on the worker queue to run this, not the handler */
	void *defer_arg;
};

struct srv_conn {
	struct srv_loop *lp;
	int fd;
	atomic_int refs; /* the loop's own while open, one per live request, one per kick */
	int closed;
	int parked; /* waits for the server's byte budget, on lp->parked */
	int eof; /* the peer sent all it will: answer what it asked, then close */
	uint32_t events; /* what epoll watches now */
	/*
	 * Bytes read ahead of the frame being parsed: a header is read together with
	 * what follows it (a small request's whole payload, often the next frames
	 * too), so a small request costs one recv, not two.
	 */
	uint8_t ib[SRV_READ_AHEAD];
	size_t ib_len;
	struct srv_req *rd; /* the request whose payload and bulk are being read */
	size_t rd_got;
	atomic_uint inflight; /* requests read and not yet answered in full */
	atomic_int eof_; /* eof, for workers */
	/*
	 * olock: the socket's sending side, shared by the loop and workers that send a
	 * reply themselves (send_direct()); protects out_head/out_tail, out_wait_ns and,
	 * for workers, closed and fd.
	 */
	pthread_mutex_t olock;
	struct srv_req *out_head, *out_tail; /* replies to write, in order */
	uint64_t out_wait_ns; /* when the head reply last saw progress */
	int kicked; /* on lp->kicks (under lp->lock) */
	struct srv_conn *kick_next;
	struct srv_conn *prev, *next; /* lp->conns */
	struct srv_conn *park_next;
	char peer[STK_ADDR_MAX];
	/*
	 * The key handshake, on the loop: AUTH_WANT_HELLO, then AUTH_WANT_PROOF, then
	 * AUTH_DONE (also from the start when the server has no key).
	 */
	uint8_t auth;
	uint8_t nc[STK_AUTH_NONCE], ns[STK_AUTH_NONCE];
	/*
	 * TLS (tls.h), or NULL: plain. Read by the loop, written under olock; freed by
	 * conn_close under olock (workers look at closed first).
	 */
	struct stk_tls *tls;
	uint8_t tls_started; /* its first byte said TLS */
	uint64_t auth_deadline_ns;
	/*
	 * A client key's connection (AUTH_HELLO_CLIENT): the policy it proves and the
	 * key the handshake runs with; NULL for the cluster key. Set on the loop
	 * during the handshake, read-only after it; freed with the connection.
	 */
	struct stk_auth_client *client;
	uint8_t ckey[STK_AUTH_MAC];
};

enum { AUTH_DONE = 0, AUTH_WANT_HELLO = 1, AUTH_WANT_PROOF = 2, AUTH_WANT_TLS = 3 };

struct srv_loop {
	struct stk_server *srv;
	int epfd;
	int evfd; /* workers' completions wake the loop */
	pthread_mutex_t lock; /* protects done_head/done_tail and kicks */
	struct srv_req *done_head, *done_tail;
	struct srv_conn *kicks; /* connections a worker asks the loop to look at */
	/* Owned by the loop thread: */
	struct srv_conn *conns;
	struct srv_conn *parked;
	struct srv_conn *dead; /* closed, unreferenced, freed after this round */
	struct srv_req *ready_head, *ready_tail; /* read whole this round, not yet run */
	unsigned nconns;
	void *lstate; /* the service's loop-side state (loop_ops), or NULL */
	uint8_t *scratch; /* STK_MAX_PAYLOAD bytes: loop-side replies are encoded here */
	struct stk_rpc_resp presp; /* stk_rpc_pending_resp's */
	uint64_t last_tick_ns;
	uint64_t revoked_seen; /* revoked_epoch when this loop last looked */
};

/*
 * An idle worker, on the server's stack of them. The request queued next wakes the
 * worker that went idle last: its stack, its caches and its thread-local buffers are
 * the warmest, and under a light load the same few workers do all the work instead
 * of each of the pool in turn touching its memory afresh.
 */
struct srv_idle {
	pthread_cond_t cond;
	struct srv_idle *next;
	int woken; /* popped by dispatch, a loop's hand-over, or the stop */
	struct srv_loop *loop; /* handed this loop to run */
};

struct bufclass {
	void *free; /* free buffers, linked through their first word */
	size_t n;
};

#define SRV_CLASSES 22 /* 64 B << 0..21 covers STK_MAX_BULK */

struct stk_server {
	int lfd;
	int stop_pipe[2];
	char addr[STK_ADDR_MAX];
	stk_rpc_handler_fn handler;
	void *ctx;
	const struct stk_server_loop_ops *lops; /* NULL: none */
	unsigned max_conns;
	unsigned window;
	uint64_t max_inflight_bytes;
	unsigned send_timeout_ms;
	struct stk_metrics_ops *metrics; /* NULL: not counted */
	stk_metric_t loop_busy; /* stoker_process_loop_callback_seconds{loop="rpc"}; 0: off */
	stk_metric_t loop_served; /* stoker_process_loop_requests_total{loop="rpc"}; 0: off */
	atomic_uint nconns;
	atomic_uint_fast64_t inflight_bytes;
	atomic_int reserve_fd; /* see refuse_one() */
	uint8_t auth_key[STK_AUTH_KEY_MAX]; /* the cluster key; auth_len 0: none */
	size_t auth_len;
	stk_metric_t auth_fail[AUTH_NREASONS]; /* stoker_auth_failures_total{reason} */
	/* auth_fail's log lines, one per reason per AUTH_LOG_EVERY_NS (atomic) */
	uint64_t auth_logged_ns[AUTH_NREASONS];
	unsigned auth_unlogged[AUTH_NREASONS];
	stk_metric_t client_refused[STK_CLIENT_REFUSED_NREASONS]; /* stoker_client_refused_total */
	struct stk_tls_server *tls; /* opts->tls: every connection is TLS; else NULL */

	unsigned nloops;
	struct srv_loop *loops;
	unsigned loops_running; /* loops held by a thread (under wlock) */
	pthread_cond_t loops_done; /* loops_running dropped to 0 */

	pthread_mutex_t wlock; /* protects everything below */
	struct srv_idle *idle; /* idle workers, the one that went idle last on top */
	pthread_cond_t widle; /* a worker left */
	struct srv_req *q_head, *q_tail;
	unsigned nqueued;
	unsigned workers, max_workers, nworkers, nidle;
	unsigned max_waiting, nwaiting; /* see stk_server_wait_begin */
	int stopping;

	pthread_mutex_t plock; /* protects the pools below */
	struct srv_req *free_reqs;
	unsigned nfree_reqs;
	struct bufclass classes[SRV_CLASSES];
	uint64_t cached_bytes, max_cached_bytes;
};

/* ---- pools ---- */

/* Classes are 64 bytes << c; from 4 KiB up, page-aligned. */
#define SRV_CLASS_MIN 64u

static unsigned size_class(size_t len)
{
	unsigned c = 0;

	while (((size_t)SRV_CLASS_MIN << c) < len)
		c++;
	return c;
}

static void *buf_alloc(size_t sz)
{
	if (sz >= (256u << 10))
		return stk_huge_alloc(sz, 0);
	return sz >= 4096 ? aligned_alloc(4096, sz) : malloc(sz);
}

static void buf_release(void *p, size_t sz)
{
	if (sz >= (256u << 10))
		stk_huge_free(p, sz, 0);
	else
		free(p);
}

/* A page-aligned buffer of at least len bytes (its size in *cap). NULL: no memory. */
static void *buf_get(struct stk_server *s, size_t len, size_t *cap)
{
	unsigned c = size_class(len);
	size_t sz = (size_t)SRV_CLASS_MIN << c;
	void *p = NULL;

	if (c >= SRV_CLASSES)
		return NULL;
	pthread_mutex_lock(&s->plock);
	if (s->classes[c].free) {
		p = s->classes[c].free;
		s->classes[c].free = *(void **)p;
		s->classes[c].n--;
		s->cached_bytes -= sz;
	}
	pthread_mutex_unlock(&s->plock);
	if (!p)
		p = buf_alloc(sz);
	if (p)
		*cap = sz;
	return p;
}

static void buf_put(struct stk_server *s, void *p, size_t cap)
{
	unsigned c;

	if (!p)
		return;
	c = size_class(cap);
	pthread_mutex_lock(&s->plock);
	if (s->cached_bytes + cap <= s->max_cached_bytes) {
		*(void **)p = s->classes[c].free;
		s->classes[c].free = p;
		s->classes[c].n++;
		s->cached_bytes += cap;
		p = NULL;
	}
	pthread_mutex_unlock(&s->plock);
	if (p)
		buf_release(p, cap);
}

static struct srv_req *req_get(struct stk_server *s)
{
	struct srv_req *r;

	pthread_mutex_lock(&s->plock);
	r = s->free_reqs;
	if (r) {
		s->free_reqs = r->next;
		s->nfree_reqs--;
	}
	pthread_mutex_unlock(&s->plock);
	if (!r)
		r = malloc(sizeof(*r));
	if (r)
		memset(r, 0, sizeof(*r));
	return r;
}

/* Returns the request's buffers and the request itself to the pools. */
static void req_free(struct stk_server *s, struct srv_req *r)
{
	if (r->begun) /* dropped before its reply left: out of flight all the same */
		stk_metrics_ops_sent(s->metrics, r->hdr.opcode, r->t0);
	buf_put(s, r->in, r->in_cap);
	buf_put(s, r->bulk, r->bulk_cap);
	buf_put(s, r->out, r->out_cap);
	buf_put(s, r->rbulk, r->rbulk_cap);
	if (r->held)
		atomic_fetch_sub(&s->inflight_bytes, r->held);
	pthread_mutex_lock(&s->plock);
	if (s->nfree_reqs < 4096) {
		r->next = s->free_reqs;
		s->free_reqs = r;
		s->nfree_reqs++;
		r = NULL;
	}
	pthread_mutex_unlock(&s->plock);
	free(r);
}

void *stk_rpc_resp_bulk_buf(struct stk_rpc_resp *resp, size_t len)
{
	struct srv_req *r = resp->req_;

	if (len > STK_MAX_BULK)
		return NULL;
	if (len > r->rbulk_cap) {
		struct stk_server *s = r->conn->lp->srv;
		size_t cap = 0;
		void *nb = buf_get(s, len ? len : 1, &cap);

		if (!nb)
			return NULL;
		buf_put(s, r->rbulk, r->rbulk_cap);
		atomic_fetch_add(&s->inflight_bytes, cap - r->rbulk_cap);
		r->held += cap - r->rbulk_cap;
		r->rbulk = nb;
		r->rbulk_cap = cap;
	}
	return r->rbulk;
}

/* ---- connections (loop thread only) ---- */

static void conn_set_events(struct srv_conn *c, uint32_t ev)
{
	struct epoll_event e = {.events = ev, .data.ptr = c};

	if (c->closed || c->events == ev)
		return;
	if (epoll_ctl(c->lp->epfd, EPOLL_CTL_MOD, c->fd, &e) == 0)
		c->events = ev;
}

/*
 * The last reference gone: freed at the end of the loop's round, not now, since an
 * event for it may still wait in the round's batch (a completion can close a
 * connection whose socket event comes later in the same batch).
 */
static void conn_unref(struct srv_conn *c)
{
	if (atomic_fetch_sub(&c->refs, 1) > 1)
		return;
	c->next = c->lp->dead;
	c->lp->dead = c;
}

static void free_dead(struct srv_loop *lp)
{
	while (lp->dead) {
		struct srv_conn *c = lp->dead;

		lp->dead = c->next;
		pthread_mutex_destroy(&c->olock);
		free(c->client);
		free(c);
	}
}

static void unpark(struct srv_conn *c)
{
	struct srv_conn **pp;

	for (pp = &c->lp->parked; *pp; pp = &(*pp)->park_next)
		if (*pp == c) {
			*pp = c->park_next;
			break;
		}
	c->parked = 0;
	c->park_next = NULL;
}

/*
 * Closes the connection: the socket goes, the requests not yet handed to a worker
 * and the replies not yet written are dropped; requests with workers come back
 * later and are dropped then.
 */
static void conn_close(struct srv_conn *c)
{
	struct stk_server *s = c->lp->srv;
	struct srv_loop *lp = c->lp;

	if (c->closed)
		return;
	if (c->parked)
		unpark(c);
	epoll_ctl(lp->epfd, EPOLL_CTL_DEL, c->fd, NULL);
	pthread_mutex_lock(&c->olock);
	close(c->fd);
	c->closed = 1;
	stk_tls_free(c->tls);
	c->tls = NULL;
	while (c->out_head) {
		struct srv_req *r = c->out_head;

		c->out_head = r->next;
		req_free(s, r);
		atomic_fetch_sub(&c->refs, 1);
	}
	c->out_tail = NULL;
	pthread_mutex_unlock(&c->olock);
	if (c->rd) {
		req_free(s, c->rd);
		c->rd = NULL;
		atomic_fetch_sub(&c->refs, 1);
	}
	if (c->prev)
		c->prev->next = c->next;
	else
		lp->conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	lp->nconns--;
	atomic_fetch_sub(&s->nconns, 1);
	stk_metrics_ops_conn(s->metrics, -1);
	conn_unref(c);
}

static void worker_spawn_locked(struct stk_server *s);

/* Wakes the idle thread on top of the stack (there is one), handing it lp if not NULL. */
static void wake_idle_locked(struct stk_server *s, struct srv_loop *lp)
{
	struct srv_idle *w = s->idle;

	s->idle = w->next;
	s->nidle--;
	w->woken = 1;
	w->loop = lp;
	pthread_cond_signal(&w->cond);
}

static void dispatch_locked(struct stk_server *s, struct srv_req *r)
{
	r->next = NULL;
	if (s->q_tail)
		s->q_tail->next = r;
	else
		s->q_head = r;
	s->q_tail = r;
	s->nqueued++;
	if (s->idle) {
		wake_idle_locked(s, NULL);
	} else if (s->nworkers < s->max_workers + s->nloops) {
		worker_spawn_locked(s);
	} else if (s->nwaiting && s->nworkers - s->nwaiting < s->max_workers + s->nloops &&
		   s->nworkers < s->max_workers + s->max_waiting + s->nloops) {
		worker_spawn_locked(s); /* stand in for one that waits on another node */
	}
}

static void dispatch(struct stk_server *s, struct srv_req *r)
{
	pthread_mutex_lock(&s->wlock);
	dispatch_locked(s, r);
	pthread_mutex_unlock(&s->wlock);
}

/* The server whose pool runs this thread's handler (NULL elsewhere). */
static __thread struct stk_server *tls_server;

void stk_server_wait_begin(void)
{
	struct stk_server *s = tls_server;

	if (!s || !s->max_waiting)
		return;
	pthread_mutex_lock(&s->wlock);
	s->nwaiting++;
	/* requests queued behind this one would wait on it: one more thread takes them */
	if (s->q_head && !s->idle && s->nworkers < s->max_workers + s->max_waiting + s->nloops)
		worker_spawn_locked(s);
	pthread_mutex_unlock(&s->wlock);
}

void stk_server_wait_end(void)
{
	struct stk_server *s = tls_server;

	if (!s || !s->max_waiting)
		return;
	pthread_mutex_lock(&s->wlock);
	s->nwaiting--;
	pthread_mutex_unlock(&s->wlock);
}

/*
 * Takes need bytes of the server's budget, unless that would pass the limit while
 * other requests hold some (a request alone is always let in). Atomic: the loops
 * admit frames at the same time.
 */
static int reserve_bytes(struct stk_server *s, uint64_t need)
{
	uint_fast64_t cur = atomic_load(&s->inflight_bytes);

	do {
		if (cur > 0 && cur + need > s->max_inflight_bytes)
			return 0;
	} while (!atomic_compare_exchange_weak(&s->inflight_bytes, &cur, cur + need));
	return 1;
}

/*
 * Moves what was read ahead past r's header into r's payload and bulk (all of it
 * when the frame is longer; the start of the next frames is kept).
 */
static void take_read_ahead(struct srv_conn *c, struct srv_req *r)
{
	size_t plen = r->hdr.payload_len, blen = r->hdr.bulk_len;
	size_t have = c->ib_len - STK_FRAME_HDR_LEN, take = STK_MIN(have, plen + blen);
	const uint8_t *p = c->ib + STK_FRAME_HDR_LEN;
	size_t to_payload = STK_MIN(take, plen);

	if (to_payload)
		memcpy(r->in, p, to_payload);
	if (take > to_payload)
		memcpy(r->bulk, p + to_payload, take - to_payload);
	c->rd_got = take;
	c->ib_len = have - take;
	memmove(c->ib, p + take, c->ib_len);
}

static void auth_frame(struct srv_conn *c, struct srv_req *r);

/*
 * A refused peer that keeps coming back (a mount whose key was removed, a script
 * with the wrong key) would log a line per try: one line per reason in this
 * long, the others counted in the next (and all in stoker_auth_failures_total).
 */
#define AUTH_LOG_EVERY_NS (10ull * 1000000000ull)

/* Logs and counts a peer that failed the key handshake; the caller closes it. */
static void auth_fail(struct srv_conn *c, int reason, const char *what)
{
	struct stk_server *s = c->lp->srv;
	uint64_t now = stk_now_ns();
	uint64_t last = __atomic_load_n(&s->auth_logged_ns[reason], __ATOMIC_RELAXED);
	unsigned unlogged;
	char more[96] = "";

	stk_metric_add(s->auth_fail[reason], 1);
	if (last && now - last < AUTH_LOG_EVERY_NS) {
		__atomic_add_fetch(&s->auth_unlogged[reason], 1, __ATOMIC_RELAXED);
		return;
	}
	__atomic_store_n(&s->auth_logged_ns[reason], now, __ATOMIC_RELAXED);
	unlogged = __atomic_exchange_n(&s->auth_unlogged[reason], 0, __ATOMIC_RELAXED);
	if (unlogged)
		snprintf(more, sizeof(more), " (%u more refused so since the last line)",
			 unlogged);
	stk_warn("%s refused: %s (%s): closing connection%s", c->peer,
		 reason == AUTH_BAD_PROOF       ? "it did not prove the cluster key"
		 : reason == AUTH_TIMEOUT       ? "no key handshake within 5 s"
		 : reason == AUTH_MALFORMED     ? "a malformed key handshake"
		 : reason == AUTH_REVOKED       ? "a removed client key"
		 : reason == AUTH_TLS_PLAINTEXT ? "this daemon requires TLS and the peer spoke plaintext"
		 : reason == AUTH_TLS_HANDSHAKE ? "the TLS handshake failed"
						: "a request before the key handshake",
		 what, more);
}

static int conn_read(struct srv_conn *c);

/*
 * A peer that spoke plaintext to a TLS server: a frame of ours is answered
 * TLS_REQUIRED (its header only), so that a client without TLS hears why, and the
 * connection closes. The frame is read first: closing on unread bytes would reset
 * the connection and lose the answer.
 */
static void tls_refuse_plain(struct srv_conn *c, const uint8_t *hb, size_t n)
{
	struct stk_frame_hdr h;
	const char *what = "bytes that are no TLS handshake";

	if (n == STK_FRAME_HDR_LEN && stk_hdr_decode(hb, &h) == 0 && !(h.flags & STK_FRAME_REPLY) &&
	    !h.bulk_len && h.payload_len <= AUTH_FRAME_MAX) {
		uint8_t drain[STK_FRAME_HDR_LEN + AUTH_FRAME_MAX], rb[STK_FRAME_HDR_LEN];
		struct stk_frame_hdr rh;

		what = stk_opcode_name(h.opcode);
		if (recv(c->fd, drain, STK_FRAME_HDR_LEN + h.payload_len, MSG_DONTWAIT) < 0) {
			/* whatever is left makes the close a reset: nothing more to do */
		}
		memset(&rh, 0, sizeof(rh));
		rh.opcode = h.opcode;
		rh.req_id = h.req_id;
		rh.flags = STK_FRAME_REPLY;
		rh.status = STK_ST_TLS_REQUIRED;
		stk_frame_seal(&rh, NULL, NULL, rb);
		if (send(c->fd, rb, sizeof(rb), MSG_NOSIGNAL | MSG_DONTWAIT) < 0) {
			/* the peer went: it hears nothing */
		}
	}
	auth_fail(c, AUTH_TLS_PLAINTEXT, what);
	conn_close(c);
}

/*
 * The TLS handshake of a new connection, a step at a time on the loop, driven by
 * the events its steps ask for. Returns -1 if the connection was closed.
 */
static int conn_tls(struct srv_conn *c)
{
	int ww = 0, rc;

	if (!c->tls_started) {
		uint8_t hb[STK_FRAME_HDR_LEN];
		ssize_t n = recv(c->fd, hb, sizeof(hb), MSG_PEEK | MSG_DONTWAIT);

		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
			return 0;
		if (n <= 0) {
			conn_close(c); /* gone before a word */
			return -1;
		}
		/* a TLS record of type handshake starts 0x16 */
		if (hb[0] != 0x16) {
			tls_refuse_plain(c, hb, (size_t)n);
			return -1;
		}
		c->tls_started = 1;
	}
	rc = stk_tls_handshake(c->tls, &ww);
	if (rc == -EAGAIN) {
		conn_set_events(c, EPOLLIN | (ww ? EPOLLOUT : 0u));
		return 0;
	}
	if (rc) {
		auth_fail(c,
			  stk_tls_fail_reason(c->tls) == STK_TLS_FAIL_REVOKED ? AUTH_REVOKED
									      : AUTH_TLS_HANDSHAKE,
			  stk_tls_why(c->tls));
		conn_close(c);
		return -1;
	}
	/* a client key's connection is confined as after AUTH_HELLO_CLIENT */
	c->client = stk_tls_client_take(c->tls);
	if (c->client)
		stk_debug("%s: client %s (generation %llu) connected over TLS", c->peer,
			  c->client->name, (unsigned long long)c->client->gen);
	c->auth = AUTH_DONE;
	conn_set_events(c, EPOLLIN);
	return conn_read(c); /* the first request may be in already */
}

/*
 * Reads a frame's header, then its payload and bulk into the request, handing each
 * whole frame to the workers; until EAGAIN, EOF, the window or the byte budget.
 * Returns -1 if the connection was closed.
 */
static int conn_read(struct srv_conn *c)
{
	struct stk_server *s = c->lp->srv;
	ssize_t n = 0;

	if (c->auth == AUTH_WANT_TLS)
		return conn_tls(c);
	while (!c->closed) {
		if (!c->rd) {
			struct stk_frame_hdr h;
			struct srv_req *r;
			uint64_t need;

			if (atomic_load(&c->inflight) >= s->window) {
				conn_set_events(c, c->events & ~(uint32_t)EPOLLIN);
				return 0;
			}
			if (c->ib_len < STK_FRAME_HDR_LEN) { /* else read ahead, or kept when parked */
				n = stk_io_recv(c->fd, c->tls, c->ib + c->ib_len,
						sizeof(c->ib) - c->ib_len);
				if (n <= 0)
					goto gone;
				c->ib_len += (size_t)n;
				if (c->ib_len < STK_FRAME_HDR_LEN)
					continue;
			}
			if (stk_hdr_decode(c->ib, &h) || (h.flags & STK_FRAME_REPLY)) {
				if (c->ib[0] == 0x16 && c->ib[1] == 0x03)
					auth_fail(c, AUTH_MALFORMED,
						  "a TLS handshake: this daemon runs without TLS");
				else if (c->auth)
					auth_fail(c, AUTH_MALFORMED, "a malformed frame header");
				else
					stk_warn("malformed frame header from %s: closing connection",
						 c->peer);
				conn_close(c);
				return -1;
			}
			if (c->auth && (h.bulk_len || h.payload_len > AUTH_FRAME_MAX)) {
				auth_fail(c, AUTH_NO_HANDSHAKE, stk_opcode_name(h.opcode));
				conn_close(c);
				return -1;
			}
			need = (uint64_t)h.payload_len + h.bulk_len;
			if (need && !reserve_bytes(s, need)) {
				/* Read the frame once the budget has room (the header is kept). */
				if (!c->parked) {
					c->parked = 1;
					c->park_next = c->lp->parked;
					c->lp->parked = c;
				}
				conn_set_events(c, c->events & ~(uint32_t)EPOLLIN);
				return 0;
			}
			r = req_get(s);
			if (!r) {
				atomic_fetch_sub(&s->inflight_bytes, need);
				goto nomem;
			}
			r->hdr = h;
			r->conn = c;
			r->held = need; /* given back by req_free, whatever happens next */
			atomic_fetch_add(&c->refs, 1);
			c->rd = r;
			c->rd_got = 0;
			if (h.payload_len && !(r->in = buf_get(s, h.payload_len, &r->in_cap)))
				goto nomem;
			if (h.bulk_len && !(r->bulk = buf_get(s, h.bulk_len, &r->bulk_cap)))
				goto nomem;
			/* need was reserved; what the pool's classes round up comes on top */
			atomic_fetch_add(&s->inflight_bytes, r->in_cap + r->bulk_cap - need);
			r->held = r->in_cap + r->bulk_cap;
			take_read_ahead(c, r);
		}
		{
			struct srv_req *r = c->rd;
			size_t plen = r->hdr.payload_len, blen = r->hdr.bulk_len;

			if (c->rd_got < plen + blen) {
				struct iovec iov[2];
				int niov = 0;

				if (c->rd_got < plen) {
					iov[niov].iov_base = r->in + c->rd_got;
					iov[niov++].iov_len = plen - c->rd_got;
					if (blen) {
						iov[niov].iov_base = r->bulk;
						iov[niov++].iov_len = blen;
					}
				} else {
					iov[niov].iov_base = r->bulk + (c->rd_got - plen);
					iov[niov++].iov_len = plen + blen - c->rd_got;
				}
				n = stk_io_readv(c->fd, c->tls, iov, niov);
				if (n <= 0)
					goto gone;
				c->rd_got += (size_t)n;
				if (c->rd_got < plen + blen)
					continue;
			}
			c->rd = NULL;
			atomic_fetch_add(&c->inflight, 1);
			r->t0 = stk_metrics_ops_begin(s->metrics, r->hdr.opcode);
			r->begun = 1;
			if (c->auth) {
				auth_frame(c, r);
				if (c->closed || c->eof)
					return c->closed ? -1 : 0;
				continue;
			}
			r->next = NULL;
			if (c->lp->ready_tail)
				c->lp->ready_tail->next = r;
			else
				c->lp->ready_head = r;
			c->lp->ready_tail = r;
		}
	}
	return -1;
gone:
	if (n == -EAGAIN || n == -EWOULDBLOCK || n == -EINTR)
		return 0;
	if (n == 0 && atomic_load(&c->inflight)) {
		/*
		 * The peer has shut its sending side: what it asked before is still
		 * answered, then the connection closes (a half-read frame is dropped).
		 */
		if (c->rd) {
			req_free(s, c->rd);
			c->rd = NULL;
			atomic_fetch_sub(&c->refs, 1);
		}
		c->eof = 1;
		atomic_store(&c->eof_, 1);
		conn_set_events(c, c->events & ~(uint32_t)EPOLLIN);
		if (atomic_load(&c->inflight) == 0) { /* a worker answered the last meanwhile */
			conn_close(c);
			return -1;
		}
		return 0;
	}
	/* EOF or reset: the peer went away (a half-read frame is dropped). */
	conn_close(c);
	return -1;
nomem:
	stk_warn("out of memory reading a request from %s: closing connection", c->peer);
	conn_close(c);
	return -1;
}


/* Appends the iovecs of r's reply frame past its first skip bytes; the count added. */
static int reply_iov(const struct srv_req *r, size_t skip, struct iovec *iov)
{
	const void *part[3] = {r->rhb, r->out, r->reply_bulk};
	size_t len[3] = {STK_FRAME_HDR_LEN, r->rh.payload_len, r->rh.bulk_len};
	int n = 0;

	for (int i = 0; i < 3; i++) {
		if (skip >= len[i]) {
			skip -= len[i];
			continue;
		}
		iov[n].iov_base = (char *)part[i] + skip;
		iov[n++].iov_len = len[i] - skip;
		skip = 0;
	}
	return n;
}

static size_t reply_len(const struct srv_req *r)
{
	return STK_FRAME_HDR_LEN + (size_t)r->rh.payload_len + r->rh.bulk_len;
}

/* sendmsg, not writev: a peer gone must not raise SIGPIPE. Under c->olock. */
static ssize_t send_iov_once(struct srv_conn *c, struct iovec *iov, int n)
{
	return stk_io_sendv(c->fd, c->tls, iov, n);
}

/* Writes queued replies until EAGAIN or none is left. Returns -1 if closed. */
static int conn_write(struct srv_conn *c)
{
	struct stk_server *s = c->lp->srv;
	unsigned inflight;

	if (c->auth == AUTH_WANT_TLS)
		return conn_tls(c);
	pthread_mutex_lock(&c->olock);
	while (c->out_head) {
		struct iovec iov[SRV_IOV_MAX];
		struct srv_req *r;
		size_t skip = c->out_head->sent;
		int niov = 0;
		ssize_t n;

		for (r = c->out_head; r && niov + 3 <= SRV_IOV_MAX; r = r->next) {
			niov += reply_iov(r, skip, iov + niov);
			skip = 0;
		}
		n = send_iov_once(c, iov, niov);
		if (n < 0) {
			pthread_mutex_unlock(&c->olock);
			if (n == -EAGAIN || n == -EWOULDBLOCK || n == -EINTR) {
				conn_set_events(c, c->events | EPOLLOUT);
				return 0;
			}
			conn_close(c); /* reset: the peer went away */
			return -1;
		}
		c->out_wait_ns = stk_now_ns();
		while (n > 0 && c->out_head) {
			size_t total;

			r = c->out_head;
			total = reply_len(r);
			if (r->sent + (size_t)n < total) {
				r->sent += (size_t)n;
				n = 0;
				break;
			}
			n -= (ssize_t)(total - r->sent);
			c->out_head = r->next;
			if (!c->out_head)
				c->out_tail = NULL;
			stk_metrics_ops_sent(s->metrics, r->hdr.opcode, r->t0);
			r->begun = 0;
			req_free(s, r);
			atomic_fetch_sub(&c->refs, 1); /* the loop's own keeps it */
			atomic_fetch_sub(&c->inflight, 1);
		}
	}
	pthread_mutex_unlock(&c->olock);
	inflight = atomic_load(&c->inflight);
	if (c->eof && !inflight) {
		conn_close(c);
		return -1;
	}
	conn_set_events(c, (c->events & ~(uint32_t)EPOLLOUT) |
				   (inflight < s->window && !c->parked && !c->eof ? EPOLLIN : 0));
	if (inflight < s->window && !c->parked && !c->eof &&
	    (c->ib_len >= STK_FRAME_HDR_LEN || (c->tls && stk_tls_pending(c->tls))))
		return conn_read(c); /* frames read ahead (or in TLS) while the window was full */
	return 0;
}

static void conn_accept(struct srv_loop *lp, int fd, const struct sockaddr_storage *ss);
static void format_peer(const struct sockaddr_storage *ss, char *out, size_t len);

/* ---- workers ---- */

/*
 * The frame's checksum and wire version: 0, -EBADMSG (a checksum mismatch: the
 * connection closes, no reply) or -EOPNOTSUPP (answered so).
 */
static int frame_check(struct srv_req *r)
{
	struct stk_frame_hdr *h = &r->hdr;
	uint32_t crc = 0;

	if (h->payload_len)
		crc = stk_crc32c(crc, r->in, h->payload_len);
	if (h->bulk_len && !(h->flags & STK_FRAME_BULK_SELF))
		crc = stk_crc32c(crc, r->bulk, h->bulk_len);
	if (crc != h->checksum) {
		stk_warn("frame checksum mismatch from %s (%s): closing connection", r->conn->peer,
			 stk_opcode_name(h->opcode));
		return -EBADMSG;
	}
	if (h->version != STK_WIRE_VERSION) {
		static atomic_int told;
		if (!atomic_exchange(&told, 1))
			stk_warn("%s speaks wire protocol version %u, this daemon %u: its "
				 "requests are refused (run one Stoker version across the "
				 "cluster and its clients)",
				 r->conn->peer, h->version, STK_WIRE_VERSION);
		return -EOPNOTSUPP;
	}
	return 0;
}

/* What a handler sees of r, and an empty reply encoded into out. */
static void req_view(struct srv_req *r, struct stk_rpc_req *req, struct stk_rpc_resp *resp,
		     uint8_t *out)
{
	req->hdr = r->hdr;
	stk_rbuf_init(&req->payload, r->in, r->hdr.payload_len);
	req->vouch = NULL;
	if ((r->hdr.flags & STK_FRAME_VOUCH) && r->hdr.payload_len >= STK_VOUCH_REC_LEN) {
		req->payload.len -= STK_VOUCH_REC_LEN;
		req->vouch = r->in + req->payload.len;
	}
	req->bulk = r->bulk;
	req->bulk_len = r->hdr.bulk_len;
	req->peer = r->conn->peer;
	req->client = r->conn->client;
	req->requeued = r->requeued;
	memset(resp, 0, sizeof(*resp));
	resp->req_ = r;
	stk_wbuf_init(&resp->payload, out, STK_MAX_PAYLOAD);
}

/* Encodes r's reply frame: status rc, or with rc 0 resp's payload (in out) and bulk. */
static void seal(struct stk_server *s, struct srv_req *r, int rc, const struct stk_rpc_resp *resp,
		 const uint8_t *out)
{
	struct stk_frame_hdr *h = &r->hdr;

	if (rc == 0 && resp->payload.err)
		rc = resp->payload.err;
	memset(&r->rh, 0, sizeof(r->rh));
	r->rh.opcode = h->opcode;
	r->rh.req_id = h->req_id;
	r->rh.flags = STK_FRAME_REPLY;
	if (rc == 0 && resp->payload.len &&
	    !(r->out = buf_get(s, resp->payload.len, &r->out_cap)))
		rc = -ENOMEM;
	if (rc) {
		r->rh.status = stk_status_from_errno(rc);
		r->reply_bulk = NULL;
	} else {
		r->rh.payload_len = (uint32_t)resp->payload.len;
		r->rh.bulk_len = resp->bulk_len;
		r->rh.flags |= resp->frame_flags & (STK_FRAME_BULK_SELF | STK_FRAME_VOUCH);
		r->reply_bulk = resp->bulk;
		if (resp->payload.len)
			memcpy(r->out, out, resp->payload.len);
	}
	stk_frame_seal(&r->rh, r->out, r->reply_bulk, r->rhb);
	/* Counted before the reply leaves: whoever got the reply and scrapes the metrics
	 * next finds the request in them. */
	stk_metrics_ops_answered(s->metrics, h->opcode, stk_status_to_errno(r->rh.status),
				 STK_FRAME_HDR_LEN + (uint64_t)h->payload_len + h->bulk_len,
				 STK_FRAME_HDR_LEN + (uint64_t)r->rh.payload_len + r->rh.bulk_len);
}

/* The request this thread's handler took (stk_rpc_pending_take), while serve() runs it. */
static __thread struct srv_req *tls_taken;

/*
 * Runs one request: checks the frame, calls the handler, encodes the reply. 1 when
 * the handler took the request (stk_rpc_pending_take): nothing to send now.
 */
static int serve(struct stk_server *s, struct srv_req *r, uint8_t *out)
{
	struct stk_rpc_req req;
	struct stk_rpc_resp resp;
	int rc = r->checked ? 0 : frame_check(r);

	if (rc == -EBADMSG) {
		r->close = 1;
		return 0;
	}
	req_view(r, &req, &resp, out);
	tls_taken = NULL;
	if (rc == 0)
		rc = s->handler(s->ctx, &req, &resp);
	/*
	 * Taken: r is the handler's now and may be answered, freed and reused by
	 * another thread already, so nothing of it is read here (hence a flag of this
	 * thread's, not of r's).
	 */
	if (tls_taken == r) {
		tls_taken = NULL;
		if (rc != STK_RPC_PENDING)
			stk_error("a handler took its request and returned %d: it must answer it "
				  "itself", rc);
		return 1;
	}
	if (rc == STK_RPC_PENDING) {
		stk_error("handler of %s returned STK_RPC_PENDING without taking its request",
			  stk_opcode_name(r->hdr.opcode));
		rc = -EIO;
	}
	seal(s, r, rc, &resp, out);
	return 0;
}

static void complete(struct srv_loop *lp, struct srv_req *r)
{
	uint64_t one = 1;
	int wake;

	r->next = NULL;
	pthread_mutex_lock(&lp->lock);
	wake = !lp->done_head;
	if (lp->done_tail)
		lp->done_tail->next = r;
	else
		lp->done_head = r;
	lp->done_tail = r;
	pthread_mutex_unlock(&lp->lock);
	if (wake && write(lp->evfd, &one, sizeof(one)) < 0) {
		/* the counter is already non-zero: the loop will look */
	}
}

static void wake_loop(struct srv_loop *lp)
{
	uint64_t one = 1;

	if (write(lp->evfd, &one, sizeof(one)) < 0) {
		/* the counter is already non-zero: the loop will look */
	}
}

/* How kick treats c's references (see kick). */
enum { KICK_LAST = 0, KICK_TAKE = 1, KICK_HELD = 2 };

/*
 * Asks c's loop to look at c (write what is queued, read again, close). KICK_TAKE:
 * takes a reference for the kick unless c is on the list already. KICK_HELD: the
 * caller took one for it (when nothing else of its own holds c), given back if c
 * is on the list already, whose reference keeps c. KICK_LAST: a worker dropped
 * c's last reference; c goes on the list to be freed by the loop.
 */
static void kick(struct srv_conn *c, int take_ref)
{
	struct srv_loop *lp = c->lp;
	int wake;

	pthread_mutex_lock(&lp->lock);
	if (c->kicked) {
		pthread_mutex_unlock(&lp->lock);
		if (take_ref == KICK_HELD)
			atomic_fetch_sub(&c->refs, 1); /* never the last: the list holds one */
		return;
	}
	if (take_ref == KICK_TAKE)
		atomic_fetch_add(&c->refs, 1);
	c->kicked = 1;
	c->kick_next = lp->kicks;
	lp->kicks = c;
	wake = !lp->done_head && !c->kick_next;
	pthread_mutex_unlock(&lp->lock);
	if (wake)
		wake_loop(lp);
}

/*
 * The worker sends r's reply itself when nothing is queued before it on the
 * connection: the reply leaves without waiting for the loop to wake. Returns 1 when
 * r was taken care of (sent, or queued with the loop asked to finish it), 0 when
 * the loop must have it (the connection is closed or busy, or the send failed).
 */
static int send_direct(struct stk_server *s, struct srv_req *r)
{
	struct srv_conn *c = r->conn;
	struct iovec iov[3];
	size_t total = reply_len(r);
	unsigned left;
	ssize_t n;

	pthread_mutex_lock(&c->olock);
	if (c->closed || c->out_head) {
		pthread_mutex_unlock(&c->olock);
		return 0;
	}
	n = send_iov_once(c, iov, reply_iov(r, 0, iov));
	if (n < 0 && n != -EAGAIN && n != -EWOULDBLOCK && n != -EINTR) {
		pthread_mutex_unlock(&c->olock);
		return 0; /* the loop meets the error and closes */
	}
	if (n < 0 || (size_t)n < total) {
		/* The rest when the socket takes it: queued first, so nothing overtakes it. */
		r->sent = n > 0 ? (size_t)n : 0;
		r->next = NULL;
		c->out_head = c->out_tail = r;
		c->out_wait_ns = stk_now_ns();
		/*
		 * r's reference is the queue's now: the loop may write r, or close c, and
		 * let c go as soon as olock does. The kick's is taken while c is sure.
		 */
		atomic_fetch_add(&c->refs, 1);
		pthread_mutex_unlock(&c->olock);
		kick(c, KICK_HELD);
		return 1;
	}
	pthread_mutex_unlock(&c->olock);
	stk_metrics_ops_sent(s->metrics, r->hdr.opcode, r->t0);
	r->begun = 0;
	req_free(s, r);
	left = atomic_fetch_sub(&c->inflight, 1) - 1;
	if (left + 1 >= s->window || (left == 0 && atomic_load(&c->eof_))) {
		/* The loop stopped reading at the window, or closes once all is answered. */
		kick(c, KICK_TAKE);
	}
	if (atomic_fetch_sub(&c->refs, 1) == 1)
		kick(c, KICK_LAST); /* closed meanwhile and this was the last: the loop frees it */
	return 1;
}

/* Runs one request on this thread and sends its reply (or hands it to the loop). */
static void run_request(struct stk_server *s, struct srv_req *r, uint8_t *out)
{
	if (r->defer_fn) { /* work handed on by stk_rpc_pending_defer */
		stk_rpc_defer_fn fn = r->defer_fn;

		r->defer_fn = NULL;
		fn((struct stk_rpc_pending *)r, r->defer_arg, 0);
		return;
	}
	if (!out || s->stopping) {
		r->rh.status = stk_status_from_errno(-ENOMEM);
		r->close = 1;
	} else if (serve(s, r, out)) {
		return;
	}
	if (r->close || !send_direct(s, r))
		complete(r->conn->lp, r);
}

static struct srv_req *loop_run(struct srv_loop *lp);

/*
 * The body of every thread of the pool: it runs requests, and now and then a loop.
 * A thread that holds a loop and has read a request hands the loop to an idle
 * thread and runs the request itself (see loop_run()), then waits as a worker; a
 * worker woken with a loop runs it. lp: the loop to start with, or NULL.
 */
static void pool_thread(struct stk_server *s, struct srv_loop *lp)
{
	uint8_t *out = malloc(STK_MAX_PAYLOAD);
	struct srv_idle self;

	pthread_cond_init(&self.cond, NULL);
	self.loop = NULL;
	tls_server = s;
	for (;;) {
		struct srv_req *r;

		if (lp) {
			r = loop_run(lp);
			if (!r) { /* stopped: the loop is nobody's now */
				pthread_mutex_lock(&s->wlock);
				if (--s->loops_running == 0)
					pthread_cond_broadcast(&s->loops_done);
				goto leave;
			}
			lp = NULL;
			run_request(s, r, out);
		}
		pthread_mutex_lock(&s->wlock);
		while (!s->q_head && !s->stopping && !self.loop) {
			struct timespec ts;
			int rc;

			self.woken = 0;
			self.next = s->idle;
			s->idle = &self;
			s->nidle++;
			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_sec += SRV_WORKER_IDLE_NS / 1000000000ull;
			rc = 0;
			while (!self.woken && rc != ETIMEDOUT)
				rc = pthread_cond_timedwait(&self.cond, &s->wlock, &ts);
			if (!self.woken) { /* timed out: still on the stack */
				for (struct srv_idle **pp = &s->idle; *pp; pp = &(*pp)->next)
					if (*pp == &self) {
						*pp = self.next;
						break;
					}
				s->nidle--;
				if (!s->q_head && s->nworkers > s->workers + s->nloops)
					goto leave;
			}
		}
		if (self.loop) {
			lp = self.loop;
			self.loop = NULL;
			pthread_mutex_unlock(&s->wlock);
			continue;
		}
		if (!s->q_head)
			goto leave; /* stopping, nothing left */
		r = s->q_head;
		s->q_head = r->next;
		if (!s->q_head)
			s->q_tail = NULL;
		s->nqueued--;
		pthread_mutex_unlock(&s->wlock);
		run_request(s, r, out);
	}
leave:
	s->nworkers--;
	pthread_cond_broadcast(&s->widle);
	pthread_mutex_unlock(&s->wlock);
	pthread_cond_destroy(&self.cond);
	free(out);
}

static void *worker_main(void *arg)
{
	pool_thread(arg, NULL);
	return NULL;
}

static void *loop_main(void *arg);

/* Starts a thread of the pool, holding loop lp (or a worker: NULL). 0 or -EAGAIN. */
static int pool_spawn_locked(struct stk_server *s, struct srv_loop *lp)
{
	pthread_attr_t attr;
	pthread_t tid;
	int rc;

	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	pthread_attr_setstacksize(&attr, 512 << 10);
	rc = lp ? pthread_create(&tid, &attr, loop_main, lp)
		: pthread_create(&tid, &attr, worker_main, s);
	pthread_attr_destroy(&attr);
	if (rc)
		return -EAGAIN;
	s->nworkers++;
	return 0;
}

static void worker_spawn_locked(struct stk_server *s)
{
	if (pool_spawn_locked(s, NULL) && s->nworkers == 0)
		stk_error("cannot start a worker thread: requests wait");
}

/* ---- loops ---- */

/* A reply sealed (or a request to drop): onto its connection's queue, and out. */
static void loop_deliver(struct srv_loop *lp, struct srv_req *r)
{
	struct stk_server *s = lp->srv;
	struct srv_conn *c = r->conn;

	if (c->closed) {
		req_free(s, r);
		conn_unref(c);
	} else if (r->close) {
		req_free(s, r);
		atomic_fetch_sub(&c->refs, 1); /* the loop's own keeps it */
		atomic_fetch_sub(&c->inflight, 1);
		conn_close(c);
	} else {
		pthread_mutex_lock(&c->olock);
		r->next = NULL;
		if (c->out_tail)
			c->out_tail->next = r;
		else
			c->out_head = r;
		if (!c->out_tail)
			c->out_wait_ns = stk_now_ns();
		c->out_tail = r;
		pthread_mutex_unlock(&c->olock);
		conn_write(c);
	}
}

/* ---- client identities (common/auth.h) ---- */

static const char *const client_refused_reasons[STK_CLIENT_REFUSED_NREASONS] = {"read_only",
										"outside", "admin"};

int stk_rpc_client_refused(const struct stk_rpc_resp *resp, unsigned reason, int rc)
{
	const struct srv_req *r = resp->req_;

	if (r && reason < STK_CLIENT_REFUSED_NREASONS)
		stk_metric_add(r->conn->lp->srv->client_refused[reason], 1);
	return rc;
}

static pthread_mutex_t revoked_lock = PTHREAD_MUTEX_INITIALIZER;
static struct stk_auth_client *revoked; /* under revoked_lock */
static uint32_t nrevoked;
static uint64_t revoked_epoch; /* atomic: bumped by each new list */

int stk_net_clients_revoked_set(const struct stk_auth_client *list, uint32_t n)
{
	struct stk_auth_client *copy = NULL, *old;

	if (n) {
		copy = malloc((size_t)n * sizeof(*copy));
		if (!copy)
			return -ENOMEM;
		memcpy(copy, list, (size_t)n * sizeof(*copy));
	}
	pthread_mutex_lock(&revoked_lock);
	old = revoked;
	revoked = copy;
	nrevoked = n;
	pthread_mutex_unlock(&revoked_lock);
	__atomic_add_fetch(&revoked_epoch, 1, __ATOMIC_RELEASE);
	free(old);
	return 0;
}

int stk_net_client_revoked(const char *name, uint64_t gen)
{
	int found = 0;

	pthread_mutex_lock(&revoked_lock);
	for (uint32_t i = 0; i < nrevoked && !found; i++)
		found = revoked[i].gen == gen && strcmp(revoked[i].name, name) == 0;
	pthread_mutex_unlock(&revoked_lock);
	return found;
}

/*
 * AUTH_HELLO_CLIENT, on the loop: the policy decoded and checked, and the key the
 * rest of the handshake runs with derived from it (the client must hold the same
 * or its proof fails). 0; -EBADMSG (malformed frame); -EKEYREJECTED (a malformed
 * or revoked policy, logged and counted here).
 */
static int client_hello(struct srv_conn *c, struct stk_rpc_req *req)
{
	struct stk_server *s = c->lp->srv;
	struct stk_msg_auth_hello_client_req h;
	struct stk_auth_client *id;
	char err[256];

	if (stk_msg_auth_hello_client_req_dec(&req->payload, &h) || stk_rbuf_finish(&req->payload))
		return -EBADMSG;
	id = calloc(1, sizeof(*id));
	if (!id)
		return -EKEYREJECTED;
	if (strlen(h.client) > STK_CLIENT_NAME_MAX || strlen(h.subtree) > STK_CLIENT_SUBTREE_MAX) {
		free(id);
		auth_fail(c, AUTH_BAD_PROOF, "a client policy too long");
		return -EKEYREJECTED;
	}
	stk_strlcpy(id->name, h.client, sizeof(id->name));
	id->gen = h.gen;
	id->flags = h.flags;
	id->anon_uid = h.anon_uid;
	id->anon_gid = h.anon_gid;
	stk_strlcpy(id->subtree, h.subtree, sizeof(id->subtree));
	if (stk_auth_client_valid(id, err, sizeof(err))) {
		free(id);
		auth_fail(c, AUTH_BAD_PROOF, "a malformed client policy");
		return -EKEYREJECTED;
	}
	if (stk_net_client_revoked(id->name, id->gen)) {
		char what[STK_CLIENT_NAME_MAX + 48];

		snprintf(what, sizeof(what), "client %s, generation %llu", id->name,
			 (unsigned long long)id->gen);
		free(id);
		auth_fail(c, AUTH_REVOKED, what);
		return -EKEYREJECTED;
	}
	if (stk_auth_client_key(s->auth_key, s->auth_len, id, c->ckey)) {
		free(id);
		auth_fail(c, AUTH_BAD_PROOF, "no client key (OpenSSL failed)");
		return -EKEYREJECTED;
	}
	memcpy(c->nc, h.nonce, STK_AUTH_NONCE);
	free(c->client);
	c->client = id;
	return 0;
}

/*
 * A frame of a connection not yet trusted, read whole (counted in flight), on the
 * loop: the next step of the handshake answered, or the peer refused. A refused
 * peer's small request is answered AUTH and the connection closes once that reply
 * is out (c->eof); a malformed one closes at once.
 */
static void auth_frame(struct srv_conn *c, struct srv_req *r)
{
	struct stk_server *s = c->lp->srv;
	struct srv_loop *lp = c->lp;
	uint16_t want = c->auth == AUTH_WANT_HELLO ? STK_OP_AUTH_HELLO : STK_OP_AUTH_PROOF;
	struct stk_rpc_req req;
	struct stk_rpc_resp resp;
	uint8_t out[128]; /* the largest handshake reply, and room */
	int rc = frame_check(r), reason = -1;

	if (rc) {
		auth_fail(c, AUTH_MALFORMED, rc == -EBADMSG ? "checksum" : "wire version");
		r->close = 1;
		loop_deliver(lp, r);
		return;
	}
	r->checked = 1;
	req_view(r, &req, &resp, out);
	stk_wbuf_init(&resp.payload, out, sizeof(out));
	if (r->hdr.opcode == STK_OP_AUTH_HELLO_CLIENT && want == STK_OP_AUTH_HELLO) {
		rc = client_hello(c, &req);
		if (rc == -EBADMSG) {
			auth_fail(c, AUTH_MALFORMED, "AUTH_HELLO_CLIENT");
			r->close = 1;
			loop_deliver(lp, r);
			return;
		}
		if (rc)
			reason = AUTH_BAD_PROOF; /* counted and logged by client_hello */
	}
	if (reason >= 0) {
		/* refused below */
	} else if (r->hdr.opcode != want && !(c->client && want == STK_OP_AUTH_HELLO)) {
		reason = AUTH_NO_HANDSHAKE;
		auth_fail(c, reason, stk_opcode_name(r->hdr.opcode));
	} else if (c->auth == AUTH_WANT_HELLO) {
		struct stk_msg_auth_hello_req hello;
		struct stk_msg_auth_hello_resp hr;
		const uint8_t *key = c->client ? c->ckey : s->auth_key;
		size_t klen = c->client ? STK_AUTH_MAC : s->auth_len;

		if (c->client) {
			memcpy(hello.nonce, c->nc, STK_AUTH_NONCE);
		} else if (stk_msg_auth_hello_req_dec(&req.payload, &hello) ||
			   stk_rbuf_finish(&req.payload)) {
			auth_fail(c, AUTH_MALFORMED, "AUTH_HELLO");
			r->close = 1;
			loop_deliver(lp, r);
			return;
		}
		memset(&hr, 0, sizeof(hr));
		memcpy(c->nc, hello.nonce, STK_AUTH_NONCE);
		if (stk_auth_random(c->ns, STK_AUTH_NONCE) ||
		    stk_auth_mac(key, klen, STK_AUTH_SERVER, c->nc, c->ns, hr.mac)) {
			stk_error("the key handshake with %s failed: OpenSSL gave no random bytes "
				  "or no MAC",
				  c->peer);
			seal(s, r, -EIO, &resp, out);
			c->eof = 1;
			atomic_store(&c->eof_, 1);
			conn_set_events(c, c->events & ~(uint32_t)EPOLLIN);
			loop_deliver(lp, r);
			return;
		}
		memcpy(hr.nonce, c->ns, STK_AUTH_NONCE);
		stk_msg_auth_hello_resp_enc(&resp.payload, &hr);
		c->auth = AUTH_WANT_PROOF;
		seal(s, r, 0, &resp, out);
		loop_deliver(lp, r);
		return;
	} else {
		struct stk_msg_auth_proof_req proof;

		if (stk_msg_auth_proof_req_dec(&req.payload, &proof) ||
		    stk_rbuf_finish(&req.payload)) {
			auth_fail(c, AUTH_MALFORMED, "AUTH_PROOF");
			r->close = 1;
			loop_deliver(lp, r);
			return;
		}
		if (stk_auth_verify(c->client ? c->ckey : s->auth_key,
				    c->client ? STK_AUTH_MAC : s->auth_len, STK_AUTH_CLIENT, c->nc,
				    c->ns, proof.mac)) {
			c->auth = AUTH_DONE;
			if (c->client)
				stk_debug("%s: client %s (generation %llu) connected", c->peer,
					  c->client->name, (unsigned long long)c->client->gen);
			seal(s, r, 0, &resp, out);
			loop_deliver(lp, r);
			return;
		}
		reason = AUTH_BAD_PROOF;
		auth_fail(c, reason, "AUTH_PROOF");
	}
	/* Refused: answered AUTH, then closed once the reply is out. */
	seal(s, r, -EKEYREJECTED, &resp, out);
	c->eof = 1;
	atomic_store(&c->eof_, 1);
	conn_set_events(c, c->events & ~(uint32_t)EPOLLIN);
	loop_deliver(lp, r);
}

/*
 * Offers r to the service's loop-side handler. 1: taken (answered, pending, or
 * its connection closed for a checksum mismatch); 0: it goes to a worker.
 */
static int loop_try(struct srv_loop *lp, struct srv_req *r)
{
	struct stk_server *s = lp->srv;
	struct stk_rpc_req req;
	struct stk_rpc_resp resp;
	int rc;

	if (r->close || r->hdr.bulk_len || r->conn->closed)
		return 0;
	rc = frame_check(r);
	if (rc == -EBADMSG) { /* said so: the connection closes, as a worker would close it */
		r->close = 1;
		loop_deliver(lp, r);
		return 1;
	}
	if (rc)
		return 0; /* another wire version: a worker answers it so */
	r->checked = 1;
	req_view(r, &req, &resp, lp->scratch);
	rc = s->lops->handle(s->ctx, lp->lstate, &req, &resp, (struct stk_rpc_pending *)r);
	if (rc == STK_RPC_TO_WORKER)
		return 0;
	stk_metric_add(s->loop_served, 1);
	if (rc != STK_RPC_PENDING) {
		seal(s, r, rc, &resp, lp->scratch);
		loop_deliver(lp, r);
	}
	return 1;
}

/*
 * The round's requests, offered to the loop-side handler first; those it leaves
 * stay on the ready list for the workers. Answering one may read more frames
 * (its connection's window reopens): they are offered too.
 */
static void loop_serve(struct srv_loop *lp)
{
	struct stk_server *s = lp->srv;
	struct srv_req *todo, *keep_head = NULL, *keep_tail = NULL;
	int took = 0;

	while ((todo = lp->ready_head)) {
		lp->ready_head = lp->ready_tail = NULL;
		while (todo) {
			struct srv_req *next = todo->next;

			if (loop_try(lp, todo)) {
				took = 1;
			} else {
				todo->next = NULL;
				if (keep_tail)
					keep_tail->next = todo;
				else
					keep_head = todo;
				keep_tail = todo;
			}
			todo = next;
		}
	}
	lp->ready_head = keep_head;
	lp->ready_tail = keep_tail;
	if (took && s->lops->flush)
		s->lops->flush(s->ctx, lp->lstate);
}

struct stk_rpc_resp *stk_rpc_pending_resp(struct stk_rpc_pending *p)
{
	struct srv_req *r = (struct srv_req *)p;
	struct srv_loop *lp = r->conn->lp;

	memset(&lp->presp, 0, sizeof(lp->presp));
	lp->presp.req_ = r;
	stk_wbuf_init(&lp->presp.payload, lp->scratch, STK_MAX_PAYLOAD);
	return &lp->presp;
}

void stk_rpc_pending_done(struct stk_rpc_pending *p, int rc)
{
	struct srv_req *r = (struct srv_req *)p;
	struct srv_loop *lp = r->conn->lp;
	struct stk_rpc_resp empty;

	if (lp->presp.req_ != r) {
		memset(&empty, 0, sizeof(empty));
		seal(lp->srv, r, rc, &empty, lp->scratch);
	} else {
		seal(lp->srv, r, rc, &lp->presp, lp->scratch);
	}
	lp->presp.req_ = NULL;
	loop_deliver(lp, r);
}

struct stk_rpc_pending *stk_rpc_pending_take(struct stk_rpc_resp *resp)
{
	struct srv_req *r = resp->req_;

	tls_taken = r;
	return (struct stk_rpc_pending *)r;
}

void stk_rpc_pending_answer(struct stk_rpc_pending *p, int rc, const void *payload, size_t len)
{
	struct srv_req *r = (struct srv_req *)p;
	struct stk_server *s = r->conn->lp->srv;
	struct stk_rpc_resp resp;

	memset(&resp, 0, sizeof(resp));
	if (len > STK_MAX_PAYLOAD)
		rc = rc ? rc : -EMSGSIZE;
	else
		stk_wbuf_init(&resp.payload, (uint8_t *)payload, len);
	resp.payload.len = rc ? 0 : len;
	seal(s, r, rc, &resp, payload);
	/* As a worker's reply: sent from this thread when nothing is queued before it. */
	if (!send_direct(s, r))
		complete(r->conn->lp, r);
}

void stk_rpc_pending_defer(struct stk_rpc_pending *p, stk_rpc_defer_fn fn, void *arg)
{
	struct srv_req *r = (struct srv_req *)p;
	struct stk_server *s = r->conn->lp->srv;

	pthread_mutex_lock(&s->wlock);
	if (!s->stopping) {
		r->defer_fn = fn;
		r->defer_arg = arg;
		dispatch_locked(s, r);
		pthread_mutex_unlock(&s->wlock);
		return;
	}
	pthread_mutex_unlock(&s->wlock);
	fn(p, arg, -ESHUTDOWN); /* no worker may take it: its owner cleans up here */
}

void stk_rpc_pending_requeue(struct stk_rpc_pending *p)
{
	struct srv_req *r = (struct srv_req *)p;
	struct stk_server *s = r->conn->lp->srv;

	pthread_mutex_lock(&s->wlock);
	if (!s->stopping) {
		r->requeued = 1;
		dispatch_locked(s, r);
		pthread_mutex_unlock(&s->wlock);
		return;
	}
	pthread_mutex_unlock(&s->wlock);
	stk_rpc_pending_answer(p, -ESHUTDOWN, NULL, 0);
}

void *stk_rpc_pending_loop(struct stk_rpc_pending *p)
{
	return ((struct srv_req *)p)->conn->lp->lstate;
}

void *stk_rpc_resp_loop(const struct stk_rpc_resp *resp)
{
	const struct srv_req *r = resp->req_;

	return r ? r->conn->lp->lstate : NULL;
}

/* Replies from the workers: onto their connections' queues, and out. */
static void loop_completions(struct srv_loop *lp)
{
	struct srv_conn *kicks;
	struct srv_req *r;
	uint64_t v;

	if (read(lp->evfd, &v, sizeof(v)) < 0) {
		/* nothing pending */
	}
	pthread_mutex_lock(&lp->lock);
	r = lp->done_head;
	lp->done_head = lp->done_tail = NULL;
	kicks = lp->kicks;
	lp->kicks = NULL;
	pthread_mutex_unlock(&lp->lock);
	while (kicks) {
		struct srv_conn *c = kicks;

		/*
		 * kicked is cleared only once kick_next is read: a worker may kick c again
		 * as soon as it is clear, and that rewrites kick_next.
		 */
		pthread_mutex_lock(&lp->lock);
		kicks = c->kick_next;
		c->kicked = 0;
		pthread_mutex_unlock(&lp->lock);
		if (atomic_load(&c->refs) == 0) {
			c->next = lp->dead; /* a worker dropped the last reference */
			lp->dead = c;
			continue;
		}
		if (!c->closed)
			conn_write(c);
		conn_unref(c);
	}
	while (r) {
		struct srv_req *next = r->next;

		loop_deliver(lp, r);
		r = next;
	}
}

/* Connections that waited for the byte budget, and replies stuck on slow readers. */
static void loop_tick(struct srv_loop *lp, uint64_t now)
{
	struct stk_server *s = lp->srv;
	uint64_t revoked_now;
	int check_revoked;

	if (lp->parked && atomic_load(&s->inflight_bytes) < s->max_inflight_bytes) {
		/* Each gets one try now; those that find the budget spent again re-park. */
		struct srv_conn *c = lp->parked;

		lp->parked = NULL;
		while (c) {
			struct srv_conn *next = c->park_next;

			c->parked = 0;
			c->park_next = NULL;
			atomic_fetch_add(&c->refs, 1);
			conn_set_events(c, c->events | EPOLLIN);
			conn_read(c);
			conn_unref(c);
			c = next;
		}
	}
	if (now - lp->last_tick_ns < SRV_TICK_MS * 1000000ull)
		return;
	lp->last_tick_ns = now;
	/* the revoked list changed: this loop's connections of removed keys go */
	revoked_now = __atomic_load_n(&revoked_epoch, __ATOMIC_ACQUIRE);
	check_revoked = revoked_now != lp->revoked_seen;
	lp->revoked_seen = revoked_now;
	for (struct srv_conn *c = lp->conns, *next; c; c = next) {
		int stuck;

		next = c->next;
		if (c->auth && !c->eof && now > c->auth_deadline_ns) {
			auth_fail(c, AUTH_TIMEOUT,
				  c->auth == AUTH_WANT_HELLO   ? "no AUTH_HELLO"
				  : c->auth == AUTH_WANT_PROOF ? "no AUTH_PROOF"
							       : "no TLS handshake");
			conn_close(c);
			continue;
		}
		if (check_revoked && c->client && !c->auth &&
		    stk_net_client_revoked(c->client->name, c->client->gen)) {
			stk_warn("%s: client %s (generation %llu) was removed: closing its "
				 "connection",
				 c->peer, c->client->name, (unsigned long long)c->client->gen);
			conn_close(c);
			continue;
		}
		pthread_mutex_lock(&c->olock);
		stuck = c->out_head &&
			now - c->out_wait_ns > (uint64_t)s->send_timeout_ms * 1000000ull;
		pthread_mutex_unlock(&c->olock);
		if (stuck) {
			stk_warn("%s has not read its replies for %u ms: closing connection", c->peer,
				 s->send_timeout_ms);
			conn_close(c);
		}
	}
}

/*
 * Out of descriptors: a pending connection would keep the listener readable and
 * the loop spinning, so one descriptor is kept in reserve to accept and close it.
 */
static void refuse_one(struct stk_server *s)
{
	int fd = atomic_exchange(&s->reserve_fd, -1);

	if (fd < 0)
		return;
	close(fd);
	fd = accept4(s->lfd, NULL, NULL, SOCK_CLOEXEC);
	if (fd >= 0)
		close(fd);
	atomic_store(&s->reserve_fd, open("/dev/null", O_RDONLY | O_CLOEXEC));
}

static void loop_accept(struct srv_loop *lp)
{
	struct stk_server *s = lp->srv;

	for (int i = 0; i < SRV_ACCEPT_BATCH; i++) {
		struct sockaddr_storage ss;
		socklen_t sslen = sizeof(ss);
		int fd = accept4(s->lfd, (struct sockaddr *)&ss, &sslen, SOCK_CLOEXEC | SOCK_NONBLOCK);

		if (fd < 0) {
			if (errno == EMFILE || errno == ENFILE) {
				static atomic_int told;
				if (!atomic_exchange(&told, 1))
					stk_warn("accept: %s: refusing connections (raise the open "
						 "files limit)", strerror(errno));
				refuse_one(s);
			}
			return; /* EAGAIN: none left (another loop may have taken it) */
		}
		if (atomic_load(&s->nconns) >= s->max_conns) {
			static atomic_int told;
			if (!atomic_exchange(&told, 1))
				stk_warn("connection limit (%u) reached: refusing connections", s->max_conns);
			close(fd);
			continue;
		}
		conn_accept(lp, fd, &ss);
	}
}

static void conn_accept(struct srv_loop *lp, int fd, const struct sockaddr_storage *ss)
{
	struct stk_server *s = lp->srv;
	struct srv_conn *c = calloc(1, sizeof(*c));
	struct epoll_event e;
	int one = 1;

	if (!c) {
		close(fd);
		return;
	}
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	c->lp = lp;
	c->fd = fd;
	atomic_init(&c->refs, 1);
	pthread_mutex_init(&c->olock, NULL);
	c->events = EPOLLIN;
	format_peer(ss, c->peer, sizeof(c->peer));
	if (s->auth_len) {
		c->auth = AUTH_WANT_HELLO;
		c->auth_deadline_ns = stk_now_ns() + AUTH_TIMEOUT_NS;
	}
	if (s->tls) {
		c->auth = AUTH_WANT_TLS;
		if (stk_tls_accept_new(s->tls, fd, &c->tls)) {
			stk_warn("no memory for a TLS session with %s: closing connection",
				 c->peer);
			pthread_mutex_destroy(&c->olock);
			close(fd);
			free(c);
			return;
		}
	}
	e.events = c->events;
	e.data.ptr = c;
	if (epoll_ctl(lp->epfd, EPOLL_CTL_ADD, fd, &e) < 0) {
		stk_tls_free(c->tls);
		close(fd);
		free(c);
		return;
	}
	c->next = lp->conns;
	if (lp->conns)
		lp->conns->prev = c;
	lp->conns = c;
	lp->nconns++;
	atomic_fetch_add(&s->nconns, 1);
	stk_metrics_ops_conn(s->metrics, 1);
}

/* Tags of the loop's own descriptors in epoll_event.data. */
static char tag_listen, tag_stop, tag_wake, tag_ext;

/*
 * The end of a round: the requests read whole in it go to the workers, but one.
 * When a thread is idle, the loop is handed to it and this thread runs that one
 * request itself (returned), so a lone request is answered by the thread that read
 * it, with no wake-up on its way; otherwise it goes to the workers too (NULL).
 */
static struct srv_req *loop_ready(struct srv_loop *lp)
{
	struct stk_server *s = lp->srv;
	struct srv_req *mine, *r;

	if (lp->lstate && lp->ready_head)
		loop_serve(lp);
	mine = lp->ready_head;
	if (!mine)
		return NULL;
	r = mine->next;
	lp->ready_head = lp->ready_tail = NULL;
	while (r) {
		struct srv_req *next = r->next;

		dispatch(s, r);
		r = next;
	}
	pthread_mutex_lock(&s->wlock);
	if (s->idle && !s->stopping) {
		wake_idle_locked(s, lp);
		pthread_mutex_unlock(&s->wlock);
		return mine;
	}
	pthread_mutex_unlock(&s->wlock);
	dispatch(s, mine);
	return NULL;
}

/* Runs the loop until it is handed over (the request to run) or stopped (NULL). */
static struct srv_req *loop_run(struct srv_loop *lp)
{
	struct stk_server *s = lp->srv;
	struct epoll_event ev[128];

	/*
	 * last_tick_ns is not reset here: a loop handed over more often than each
	 * SRV_TICK_MS (a steady trickle of requests) would otherwise never tick, and
	 * removed client keys' connections, handshake deadlines and stuck replies
	 * would never be looked at.
	 */
	for (;;) {
		int n = epoll_wait(lp->epfd, ev, 128, SRV_TICK_MS);
		uint64_t t0 = stk_now_ns(), t1;
		struct srv_req *mine;

		if (n < 0 && errno != EINTR) {
			stk_error("epoll_wait: %s", strerror(errno));
			n = 0;
			poll(NULL, 0, 10);
		}
		for (int i = 0; i < n; i++) {
			void *p = ev[i].data.ptr;
			struct srv_conn *c;

			if (p == &tag_stop) {
				mine = lp->ready_head;
				lp->ready_head = lp->ready_tail = NULL;
				while (mine) { /* read this round: the workers still run them */
					struct srv_req *next = mine->next;

					dispatch(s, mine);
					mine = next;
				}
				return NULL;
			}
			if (p == &tag_listen) {
				loop_accept(lp);
				continue;
			}
			if (p == &tag_wake) {
				loop_completions(lp);
				continue;
			}
			if (p == &tag_ext) {
				s->lops->event(s->ctx, lp->lstate);
				continue;
			}
			c = p;
			if (c->closed)
				continue; /* closed earlier in this round (still allocated) */
			atomic_fetch_add(&c->refs, 1); /* valid through this event even if closed */
			if (ev[i].events & (EPOLLERR | EPOLLHUP)) {
				/* Reset, or shut both ways: no reply can reach the peer. */
				conn_close(c);
			} else {
				if (ev[i].events & EPOLLOUT)
					conn_write(c);
				if (!c->closed && (ev[i].events & EPOLLIN))
					conn_read(c);
			}
			conn_unref(c);
		}
		t1 = stk_now_ns();
		loop_tick(lp, t1);
		free_dead(lp);
		if (n > 0)
			stk_metric_observe_ns(s->loop_busy, t1 - t0);
		mine = loop_ready(lp);
		if (t1 - t0 > SRV_SLOW_LOOP_NS) {
			static atomic_uint_fast64_t last;
			if (t1 - atomic_load(&last) > 10ull * 1000000000ull) {
				atomic_store(&last, t1);
				stk_warn("event loop of %s took %llu ms for one round (%d events)", s->addr,
					 (unsigned long long)((t1 - t0) / 1000000), n);
			}
		}
		if (mine)
			return mine;
	}
}

static void *loop_main(void *arg)
{
	struct srv_loop *lp = arg;

	pool_thread(lp->srv, lp);
	return NULL;
}

/* ---- set-up ---- */

static void format_peer(const struct sockaddr_storage *ss, char *out, size_t len)
{
	char host[INET6_ADDRSTRLEN] = "?";

	if (ss->ss_family == AF_INET) {
		const struct sockaddr_in *a = (const void *)ss;
		inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
		snprintf(out, len, "%s:%u", host, ntohs(a->sin_port));
	} else if (ss->ss_family == AF_INET6) {
		const struct sockaddr_in6 *a = (const void *)ss;
		inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
		snprintf(out, len, "[%s]:%u", host, ntohs(a->sin6_port));
	} else {
		snprintf(out, len, "unknown");
	}
}

/* A setting from the environment, or def: STOKER_<name> overrides every server's. */
static uint64_t env_setting(const char *name, uint64_t def, uint64_t max)
{
	const char *e = getenv(name);
	uint64_t v;

	if (e && stk_parse_u64(e, &v) == 0 && v > 0 && v <= max)
		return v;
	return def;
}

/* Lets the process hold as many descriptors as the hard limit allows. */
static void raise_nofile(void)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
}

/*
 * The service's loop-side state for lp. Without it (the service refused, or no
 * memory) the loop hands every request to the workers, which serve them all.
 */
static void loop_attach(struct stk_server *s, struct srv_loop *lp, unsigned idx)
{
	struct epoll_event e = {.events = EPOLLIN, .data.ptr = &tag_ext};
	void *state = NULL;
	int fd = -1, rc;

	lp->scratch = malloc(STK_MAX_PAYLOAD);
	if (!lp->scratch)
		return;
	rc = s->lops->attach(s->ctx, idx, &state, &fd);
	if (rc == 0 && fd >= 0 && epoll_ctl(lp->epfd, EPOLL_CTL_ADD, fd, &e) < 0)
		rc = -errno;
	if (rc) {
		if (state)
			s->lops->detach(s->ctx, state);
		free(lp->scratch);
		lp->scratch = NULL;
		return;
	}
	lp->lstate = state;
}

static int loop_init(struct stk_server *s, struct srv_loop *lp)
{
	struct epoll_event e;

	lp->srv = s;
	lp->last_tick_ns = stk_now_ns();
	pthread_mutex_init(&lp->lock, NULL);
	lp->epfd = epoll_create1(EPOLL_CLOEXEC);
	lp->evfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (lp->epfd < 0 || lp->evfd < 0)
		return -errno;
	e.events = EPOLLIN | EPOLLEXCLUSIVE;
	e.data.ptr = &tag_listen;
	if (epoll_ctl(lp->epfd, EPOLL_CTL_ADD, s->lfd, &e) < 0)
		return -errno;
	e.events = EPOLLIN;
	e.data.ptr = &tag_stop;
	if (epoll_ctl(lp->epfd, EPOLL_CTL_ADD, s->stop_pipe[0], &e) < 0)
		return -errno;
	e.data.ptr = &tag_wake;
	if (epoll_ctl(lp->epfd, EPOLL_CTL_ADD, lp->evfd, &e) < 0)
		return -errno;
	if (s->lops)
		loop_attach(s, lp, (unsigned)(lp - s->loops));
	return 0;
}

static int parse_listen(const char *listen, struct sockaddr_storage *ss, socklen_t *sslen)
{
	/* Port 0 is allowed here (stk_parse_hostport refuses it), so parse by hand. */
	const char *colon = strrchr(listen, ':');
	char tmp[STK_ADDR_MAX];
	uint64_t port;
	int rc;

	if (!colon || (size_t)(colon - listen) >= 256 || stk_parse_u64(colon + 1, &port) ||
	    port > 65535)
		return -EINVAL;
	snprintf(tmp, sizeof(tmp), "%.*s:%u", (int)(colon - listen), listen,
		 port ? (unsigned)port : 1u);
	rc = stk_net_resolve(tmp, ss, sslen);
	if (rc)
		return rc;
	if (ss->ss_family == AF_INET)
		((struct sockaddr_in *)ss)->sin_port = htons((uint16_t)port);
	else
		((struct sockaddr_in6 *)ss)->sin6_port = htons((uint16_t)port);
	return 0;
}

int stk_server_create(const struct stk_server_opts *opts, struct stk_server **out)
{
	struct sockaddr_storage ss;
	socklen_t sslen = sizeof(ss);
	struct stk_server *s;
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	int one = 1, rc;

	if (!opts || opts->size < sizeof(*opts) || !opts->handler || !opts->listen)
		return -EINVAL;
	if (opts->auth_key_len &&
	    (!opts->auth_key || opts->auth_key_len < STK_AUTH_KEY_MIN ||
	     opts->auth_key_len > STK_AUTH_KEY_MAX))
		return -EINVAL;
	if (opts->tls && !opts->auth_key_len)
		return -EINVAL; /* the PSK comes from the cluster key */
	rc = parse_listen(opts->listen, &ss, &sslen);
	if (rc)
		return rc;
	raise_nofile();
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->stop_pipe[0] = s->stop_pipe[1] = -1;
	s->lfd = -1;
	s->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	s->handler = opts->handler;
	s->ctx = opts->ctx;
	/* STOKER_LOOP_READS=0: every request to the workers, whatever the service offers */
	s->lops = getenv("STOKER_LOOP_READS") && strcmp(getenv("STOKER_LOOP_READS"), "0") == 0
			  ? NULL
			  : opts->loop_ops;
	s->metrics = opts->metrics;
	s->max_conns = opts->max_conns ? opts->max_conns : 65536;
	s->nloops = (unsigned)env_setting("STOKER_NET_LOOPS",
					  opts->loops ? opts->loops : (ncpu > 0 ? (uint64_t)ncpu : 1), 256);
	s->workers = (unsigned)env_setting("STOKER_NET_WORKERS", opts->workers ? opts->workers : 16,
					   4096);
	s->max_workers = opts->max_workers > s->workers ? opts->max_workers : s->workers;
	s->max_waiting = opts->max_waiting;
	s->window = opts->window ? opts->window : 128;
	s->max_inflight_bytes = opts->max_inflight_bytes ? opts->max_inflight_bytes : (1ull << 30);
	s->send_timeout_ms = (unsigned)env_setting(
		"STOKER_NET_SEND_TIMEOUT_MS", opts->send_timeout_ms ? opts->send_timeout_ms : 30000,
		86400000);
	s->max_cached_bytes = 256ull << 20;
	if (opts->auth_key_len) {
		memcpy(s->auth_key, opts->auth_key, opts->auth_key_len);
		s->auth_len = opts->auth_key_len;
		for (int i = 0; i < AUTH_NREASONS; i++) {
			const char *v[1] = {auth_reasons[i]};

			stk_metric_series(STK_M_AUTH_FAILURES, v, &s->auth_fail[i]);
		}
		for (int i = 0; i < STK_CLIENT_REFUSED_NREASONS; i++) {
			const char *v[1] = {client_refused_reasons[i]};

			stk_metric_series(STK_M_CLIENT_REFUSED, v, &s->client_refused[i]);
		}
	}
	if (s->metrics) {
		const char *v[1] = {"rpc"};

		stk_metric_series(STK_M_PROCESS_LOOP_CALLBACK, v, &s->loop_busy);
		stk_metric_series(STK_M_PROCESS_LOOP_REQUESTS, v, &s->loop_served);
	}
	pthread_mutex_init(&s->wlock, NULL);
	pthread_cond_init(&s->widle, NULL);
	pthread_cond_init(&s->loops_done, NULL);
	pthread_mutex_init(&s->plock, NULL);
	if (opts->tls) {
		rc = stk_tls_server_create(opts->auth_key, opts->auth_key_len, &s->tls);
		if (rc)
			goto out;
		/* removed client keys are refused in the TLS handshake itself */
		stk_tls_server_set_revoked(s->tls, stk_net_client_revoked);
	}
	s->lfd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (s->lfd < 0) {
		rc = -errno;
		goto out;
	}
	setsockopt(s->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(s->lfd, (struct sockaddr *)&ss, sslen) < 0 || listen(s->lfd, 4096) < 0) {
		rc = -errno;
		goto out;
	}
	sslen = sizeof(ss);
	getsockname(s->lfd, (struct sockaddr *)&ss, &sslen);
	format_peer(&ss, s->addr, sizeof(s->addr));
	if (pipe2(s->stop_pipe, O_CLOEXEC | O_NONBLOCK) < 0) {
		rc = -errno;
		goto out;
	}
	s->loops = calloc(s->nloops, sizeof(*s->loops));
	if (!s->loops) {
		rc = -ENOMEM;
		goto out;
	}
	for (unsigned i = 0; i < s->nloops; i++)
		s->loops[i].epfd = s->loops[i].evfd = -1;
	for (unsigned i = 0; i < s->nloops; i++)
		if ((rc = loop_init(s, &s->loops[i])))
			goto out;
	*out = s;
	return 0;
out:
	stk_server_destroy(s);
	return rc;
}

const char *stk_server_addr(const struct stk_server *s)
{
	return s->addr;
}

int stk_server_run(struct stk_server *s)
{
	int rc = 0;

	pthread_mutex_lock(&s->wlock);
	for (unsigned i = 0; i < s->nloops; i++) {
		if (pool_spawn_locked(s, &s->loops[i])) {
			rc = -EAGAIN;
			stk_error("cannot start a thread for event loop %u", i);
			break;
		}
		s->loops_running++;
	}
	while (s->nworkers < s->workers + s->nloops && pool_spawn_locked(s, NULL) == 0)
		;
	while (s->loops_running)
		pthread_cond_wait(&s->loops_done, &s->wlock);
	pthread_mutex_unlock(&s->wlock);
	return rc;
}

void stk_server_stop(struct stk_server *s)
{
	char c = 1;
	if (write(s->stop_pipe[1], &c, 1) < 0) {
		/* the pipe is full: a stop is already pending */
	}
}

void stk_server_destroy(struct stk_server *s)
{
	if (!s)
		return;
	if (s->lfd >= 0)
		close(s->lfd);
	s->lfd = -1;
	/* Workers finish what they run; what is still queued is dropped. */
	pthread_mutex_lock(&s->wlock);
	s->stopping = 1;
	while (s->idle)
		wake_idle_locked(s, NULL);
	for (unsigned i = 0; s->loops && i < s->nloops; i++)
		for (struct srv_conn *c = s->loops[i].conns; c; c = c->next)
			shutdown(c->fd, SHUT_RDWR);
	while (s->nworkers)
		pthread_cond_wait(&s->widle, &s->wlock);
	pthread_mutex_unlock(&s->wlock);
	for (unsigned i = 0; s->loops && i < s->nloops; i++) {
		struct srv_loop *lp = &s->loops[i];

		if (lp->lstate) /* its pending requests are answered (into the queues below) */
			s->lops->detach(s->ctx, lp->lstate);
		lp->lstate = NULL;
		if (lp->epfd >= 0) {
			loop_completions(lp);
			while (lp->conns)
				conn_close(lp->conns);
			while (lp->ready_head) { /* read ahead by that last round of writes */
				struct srv_req *r = lp->ready_head;

				lp->ready_head = r->next;
				conn_unref(r->conn);
				req_free(s, r);
			}
			lp->ready_tail = NULL;
			free_dead(lp);
			close(lp->epfd);
		}
		if (lp->evfd >= 0)
			close(lp->evfd);
		free(lp->scratch);
		pthread_mutex_destroy(&lp->lock);
	}
	free(s->loops);
	stk_tls_server_destroy(s->tls);
	if (s->reserve_fd >= 0)
		close(s->reserve_fd);
	if (s->stop_pipe[0] >= 0) {
		close(s->stop_pipe[0]);
		close(s->stop_pipe[1]);
	}
	while (s->free_reqs) {
		struct srv_req *r = s->free_reqs;
		s->free_reqs = r->next;
		free(r);
	}
	for (unsigned c = 0; c < SRV_CLASSES; c++)
		while (s->classes[c].free) {
			void *p = s->classes[c].free;

			s->classes[c].free = *(void **)p;
			buf_release(p, (size_t)SRV_CLASS_MIN << c);
		}
	pthread_mutex_destroy(&s->wlock);
	pthread_cond_destroy(&s->widle);
	pthread_cond_destroy(&s->loops_done);
	pthread_mutex_destroy(&s->plock);
	free(s);
}
