/*
 * The loop client: calls to other servers made from an event loop (net.h,
 * stk_lclient). A storage node forwards each change down its chain; a worker
 * that sent it with stk_rpc_call would sleep for the successor's round trip
 * (holding the chunk's lock), and a node forwarding many writes at once would
 * need as many threads. Here the loop that owns the client's connection sends
 * the forward on a socket it owns too and goes on; the reply, matched by request
 * id, calls the caller back on that loop.
 *
 * Every descriptor (one eventfd for calls posted from other threads, one timerfd
 * for deadlines, one socket per peer) is registered in the epoll set the owner
 * gives; the owner's loop passes what epoll reports for them to
 * stk_lclient_event. Everything except stk_lclient_call runs on that loop, so
 * the client's state needs no lock but the inbox's.
 *
 * A connection per peer address, opened on first use without blocking (connect
 * in progress, then the key handshake of common/auth.h as two calls of its own
 * before any other), carries every call to that peer, pipelined: requests are
 * written in order with writev as the socket takes them, replies come in any
 * order and are matched by id. A failure of the connection (reset, a malformed
 * or unmatched reply, no byte moved for the deadline while calls wait, the
 * handshake refused, an abort by the call watch) fails every call on it with the
 * transport error and closes it; the next call to that peer opens a new one.
 *
 * The call watch (callwatch.c) sees each call from its send to its reply, and
 * the connection's set-up; when mgmtd gave the peer up it shuts the socket down
 * from its own thread, which the loop then sees as a reset. A connection stays
 * allocated (and its descriptor open) until every watch slot naming it has ended,
 * so the watch never touches a socket that was closed and reused.
 *
 * Replies carry a payload of at most LC_RBUF - STK_FRAME_HDR_LEN bytes and no
 * bulk (what a forwarded change's reply is); anything else breaks the connection.
 */
#include "net.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <sys/uio.h>
#include <unistd.h>

#include "../common/auth.h"
#include "../common/log.h"
#include "../common/util.h"
#include "../proto/msg.h"
#include "../proto/status.h"
#include "netint.h"
#include "tls.h"

#define LC_TICK_MS 250u
#define LC_SETUP_MS 5000u /* connect and key handshake */
#define LC_RBUF 4096u
#define LC_IOV 64

enum { LC_CONNECTING, LC_AUTH, LC_READY, LC_TLS };

struct lc_conn {
	struct stk_lclient *lc;
	int fd;
	int state;
	struct stk_tls *tls; /* TLS (tls.h; stk_net_tls), or NULL: plain */
	uint32_t events; /* what epoll watches now */
	char addr[STK_ADDR_MAX];
	struct stk_lcall *wait_head, *wait_tail; /* until the connection is ready */
	struct stk_lcall *out_head, *out_tail; /* to write, in order; the head partly */
	struct stk_lcall *sent; /* written whole or in part, awaiting replies */
	size_t out_off; /* bytes of out_head written */
	uint64_t next_id;
	uint64_t io_ns; /* when a byte last moved, or the set-up began */
	int setup_slot; /* the watch's slot for connect and handshake, or -1 */
	uint8_t rb[LC_RBUF]; /* replies read ahead */
	size_t rb_len;
	/* The key handshake's own calls, and the client's nonce. */
	struct stk_lcall auth;
	uint8_t auth_req[64], auth_resp[128];
	uint8_t nc[STK_AUTH_NONCE];
	struct lc_conn *next;
};

struct stk_lclient {
	int epfd, evfd, tfd;
	int timer_on;
	unsigned timeout_ms;
	struct stk_callwatch *watch;
	pthread_mutex_t lock; /* protects inbox and closing */
	struct stk_lcall *inbox_head, *inbox_tail;
	int closing;
	struct lc_conn *conns; /* the loop's */
	/*
	 * Closed this batch, freed by stk_lclient_batch_end: an event of the batch may
	 * still name one, and a new connection must not take its address meanwhile.
	 */
	struct lc_conn *dead;
	char tag_wake, tag_timer; /* epoll data of evfd and tfd */
};

static void conn_break(struct lc_conn *c, int err);
static void conn_flush(struct lc_conn *c);

static void lc_epoll(struct lc_conn *c, uint32_t ev)
{
	struct epoll_event e = {.events = ev, .data.ptr = c};

	if (c->events == ev)
		return;
	if (epoll_ctl(c->lc->epfd, c->events ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, c->fd, &e) == 0)
		c->events = ev;
}

static void timer_set(struct stk_lclient *lc, int on)
{
	struct itimerspec its = {0};

	if (lc->timer_on == on)
		return;
	if (on) {
		its.it_interval.tv_nsec = LC_TICK_MS * 1000000l;
		its.it_value = its.it_interval;
	}
	if (timerfd_settime(lc->tfd, 0, &its, NULL) == 0)
		lc->timer_on = on;
}

/* For the call watch, on its thread: the peer is gone; the loop sees a reset. */
static void conn_abort(void *arg)
{
	struct lc_conn *c = arg;

	shutdown(c->fd, SHUT_RDWR);
}

static void list_add(struct stk_lcall **head, struct stk_lcall **tail, struct stk_lcall *call)
{
	call->next_ = NULL;
	if (*tail)
		(*tail)->next_ = call;
	else
		*head = call;
	*tail = call;
}

/* Puts call on c's queue to write: numbered, its header sealed, watched. */
static void conn_queue(struct lc_conn *c, struct stk_lcall *call)
{
	struct stk_frame_hdr h;

	memset(&h, 0, sizeof(h));
	h.opcode = call->opcode;
	h.flags = call->frame_flags & STK_FRAME_BULK_SELF;
	h.payload_len = (uint32_t)call->req_len;
	h.bulk_len = (uint32_t)call->bulk_len;
	h.req_id = call->req_id_ = c->next_id++;
	stk_frame_seal(&h, call->req, call->bulk, call->hb_);
	call->slot_ = call == &c->auth ? -1 : stk_callwatch_begin_fn(c->lc->watch, conn_abort, c,
								     c->addr);
	if (!c->out_head)
		c->io_ns = stk_now_ns(); /* the deadline counts from now, not from idle */
	list_add(&c->out_head, &c->out_tail, call);
	timer_set(c->lc, 1);
}

/* The handshake is done (or there is none): the calls that waited go out. */
static void conn_ready(struct lc_conn *c)
{
	struct stk_lcall *call = c->wait_head;

	c->state = LC_READY;
	stk_callwatch_end(c->lc->watch, c->setup_slot);
	c->setup_slot = -1;
	c->wait_head = c->wait_tail = NULL;
	while (call) {
		struct stk_lcall *next = call->next_;

		conn_queue(c, call);
		call = next;
	}
}

static void auth_send(struct lc_conn *c, uint16_t op, size_t len);

/* A reply of the handshake (or its failure): the next step. */
static void auth_done(struct stk_lcall *call, int rc)
{
	struct lc_conn *c = call->ctx;
	struct stk_msg_auth_proof_req proof;
	struct stk_wbuf w;

	if (rc)
		goto fail;
	if (call->opcode == STK_OP_AUTH_HELLO) {
		if (call->status == STK_ST_NOSYS || call->status == STK_ST_NOTSUP) {
			conn_ready(c); /* a daemon run without a key (--auth off) */
			return;
		}
		rc = stk_status_to_errno(call->status);
		if (rc == 0)
			rc = stk_net_auth_proof(c->nc, c->auth_resp, call->resp_len, proof.mac,
						c->addr);
		if (rc)
			goto fail;
		stk_wbuf_init(&w, c->auth_req, sizeof(c->auth_req));
		stk_msg_auth_proof_req_enc(&w, &proof);
		auth_send(c, STK_OP_AUTH_PROOF, w.len);
		return;
	}
	rc = stk_status_to_errno(call->status);
	if (rc)
		goto fail;
	conn_ready(c);
	return;
fail:
	if (rc != -EKEYREJECTED)
		stk_warn("key handshake with %s failed: %s", c->addr, strerror(-rc));
	conn_break(c, rc == -EACCES || rc == -EPERM ? -EKEYREJECTED : rc);
}

static void auth_send(struct lc_conn *c, uint16_t op, size_t len)
{
	memset(&c->auth, 0, sizeof(c->auth));
	c->auth.opcode = op;
	c->auth.req = c->auth_req;
	c->auth.req_len = len;
	c->auth.resp = c->auth_resp;
	c->auth.resp_cap = sizeof(c->auth_resp);
	c->auth.done = auth_done;
	c->auth.ctx = c;
	conn_queue(c, &c->auth);
}

/* A step of the TLS handshake, which stands for the key handshake (tls.h). */
static void conn_tls_step(struct lc_conn *c)
{
	int ww = 0, rc = stk_tls_handshake(c->tls, &ww);

	if (rc == -EAGAIN) {
		lc_epoll(c, EPOLLIN | (ww ? EPOLLOUT : 0u));
		return;
	}
	if (rc) {
		stk_warn("TLS handshake with %s failed: %s", c->addr, stk_tls_why(c->tls));
		conn_break(c, rc);
		return;
	}
	conn_ready(c);
	conn_flush(c);
}

/* The socket is connected: the handshake first, when this process holds a key. */
static void conn_connected(struct lc_conn *c)
{
	struct stk_msg_auth_hello_req hello;
	struct stk_wbuf w;
	uint8_t key[STK_AUTH_KEY_MAX];
	size_t len = 0;
	int rc;

	if (stk_net_tls()) {
		/* a daemon holds one key: its cluster's, the newest */
		rc = stk_net_tls_key(0, key, &len);
		if (rc == 0)
			rc = stk_tls_connect_new(c->fd, key, len, &c->tls);
		memset(key, 0, sizeof(key));
		if (rc) {
			conn_break(c, rc == -ENOENT ? -EKEYREJECTED : rc);
			return;
		}
		c->state = LC_TLS;
		conn_tls_step(c);
		return;
	}
	if (!stk_net_auth_keys()) {
		conn_ready(c);
		return;
	}
	c->state = LC_AUTH;
	memset(&hello, 0, sizeof(hello));
	rc = stk_auth_random(hello.nonce, sizeof(hello.nonce));
	if (rc) {
		conn_break(c, rc);
		return;
	}
	memcpy(c->nc, hello.nonce, STK_AUTH_NONCE);
	stk_wbuf_init(&w, c->auth_req, sizeof(c->auth_req));
	stk_msg_auth_hello_req_enc(&w, &hello);
	auth_send(c, STK_OP_AUTH_HELLO, w.len);
}

/* Opens a connection to addr, its connect under way. NULL, with *err, on failure. */
static struct lc_conn *conn_open(struct stk_lclient *lc, const char *addr, int *err)
{
	struct sockaddr_storage ss;
	socklen_t sslen;
	struct lc_conn *c;
	int one = 1, rc;

	rc = stk_net_resolve(addr, &ss, &sslen);
	if (rc) {
		*err = rc;
		return NULL;
	}
	c = calloc(1, sizeof(*c));
	if (!c) {
		*err = -ENOMEM;
		return NULL;
	}
	c->lc = lc;
	c->next_id = 1;
	c->setup_slot = -1;
	stk_strlcpy(c->addr, addr, sizeof(c->addr));
	c->fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (c->fd < 0) {
		*err = -errno;
		free(c);
		return NULL;
	}
	setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	c->io_ns = stk_now_ns();
	if (connect(c->fd, (struct sockaddr *)&ss, sslen) < 0 && errno != EINPROGRESS) {
		*err = -errno;
		close(c->fd);
		free(c);
		return NULL;
	}
	c->state = LC_CONNECTING;
	lc_epoll(c, EPOLLOUT);
	if (!c->events) {
		*err = -errno;
		close(c->fd);
		free(c);
		return NULL;
	}
	c->setup_slot = stk_callwatch_begin_fn(lc->watch, conn_abort, c, addr);
	c->next = lc->conns;
	lc->conns = c;
	timer_set(lc, 1);
	return c;
}

/* Takes one call from the inbox on the loop: to its peer's connection. */
static void call_start(struct stk_lclient *lc, struct stk_lcall *call)
{
	struct lc_conn *c;
	int err = 0;

	for (c = lc->conns; c; c = c->next)
		if (strcmp(c->addr, call->addr) == 0)
			break;
	if (!c)
		c = conn_open(lc, call->addr, &err);
	if (!c) {
		call->done(call, err);
		return;
	}
	if (c->state == LC_READY) {
		conn_queue(c, call);
		conn_flush(c);
	} else {
		list_add(&c->wait_head, &c->wait_tail, call);
	}
}

/*
 * Fails every call of c with err, then closes and frees c. The watch's slots end
 * first: after that no abort of the watch can touch c.
 */
static void conn_break(struct lc_conn *c, int err)
{
	struct stk_lclient *lc = c->lc;
	struct stk_lcall *lists[3] = {c->sent, c->out_head, c->wait_head};

	for (struct lc_conn **pp = &lc->conns; *pp; pp = &(*pp)->next)
		if (*pp == c) {
			*pp = c->next;
			break;
		}
	stk_callwatch_end(lc->watch, c->setup_slot);
	for (int k = 0; k < 3; k++)
		for (struct stk_lcall *call = lists[k]; call; call = call->next_)
			if (call != &c->auth)
				stk_callwatch_end(lc->watch, call->slot_);
	epoll_ctl(lc->epfd, EPOLL_CTL_DEL, c->fd, NULL);
	stk_tls_free(c->tls);
	c->tls = NULL;
	close(c->fd);
	for (int k = 0; k < 3; k++) {
		struct stk_lcall *call = lists[k];

		while (call) {
			struct stk_lcall *next = call->next_;

			if (call != &c->auth) {
				call->resp_len = 0;
				call->done(call, err);
			}
			call = next;
		}
	}
	c->next = lc->dead;
	lc->dead = c;
	if (!lc->conns)
		timer_set(lc, 0);
}

/* Writes what c has queued, as far as the socket takes it. */
static void conn_flush(struct lc_conn *c)
{
	while (c->out_head) {
		struct iovec iov[LC_IOV];
		struct stk_lcall *call = c->out_head;
		struct iovec *v = iov;
		size_t skip = c->out_off;
		int n = 0, left;
		ssize_t w;

		/* Whole frames, several at once, the first from where it stopped. */
		for (; call && n + 3 <= LC_IOV; call = call->next_) {
			iov[n++] = (struct iovec){call->hb_, STK_FRAME_HDR_LEN};
			if (call->req_len)
				iov[n++] = (struct iovec){(void *)call->req, call->req_len};
			if (call->bulk_len)
				iov[n++] = (struct iovec){(void *)call->bulk, call->bulk_len};
		}
		left = n;
		stk_iov_advance(&v, &left, skip);
		w = stk_io_sendv(c->fd, c->tls, v, left);
		if (w < 0) {
			if (w == -EINTR)
				continue;
			if (w == -EAGAIN || w == -EWOULDBLOCK)
				break;
			conn_break(c, (int)w);
			return;
		}
		c->io_ns = stk_now_ns();
		c->out_off += (size_t)w;
		/* Calls written whole move to the sent list; the rest wait for EPOLLOUT. */
		while (c->out_head) {
			struct stk_lcall *h = c->out_head;
			size_t len = STK_FRAME_HDR_LEN + h->req_len + h->bulk_len;

			if (c->out_off < len)
				break;
			c->out_off -= len;
			c->out_head = h->next_;
			if (!c->out_head)
				c->out_tail = NULL;
			h->next_ = c->sent;
			c->sent = h;
		}
	}
	if (c->state != LC_TLS) /* the handshake asks for its own events */
		lc_epoll(c, c->state == LC_CONNECTING ? EPOLLOUT
						      : EPOLLIN | (c->out_head ? EPOLLOUT : 0u));
}

/* The sent call a reply answers, taken off the sent list; NULL if none. */
static struct stk_lcall *take_sent(struct lc_conn *c, uint64_t id)
{
	for (struct stk_lcall **pp = &c->sent; *pp; pp = &(*pp)->next_)
		if ((*pp)->req_id_ == id) {
			struct stk_lcall *call = *pp;

			*pp = call->next_;
			return call;
		}
	return NULL;
}

/* Whether c is still open (a failed handshake step breaks it from its callback). */
static int conn_alive(struct stk_lclient *lc, const struct lc_conn *c)
{
	for (const struct lc_conn *k = lc->conns; k; k = k->next)
		if (k == c)
			return 1;
	return 0;
}

/*
 * Reads replies and hands each to its call. 0, or -errno: c is broken (and gone).
 * A reply to a call not yet written whole matches nothing (a peer answers only
 * what it read) and breaks the connection.
 */
static int conn_read(struct lc_conn *c)
{
	struct stk_lclient *lc = c->lc; /* c may be gone after a handshake step */

	for (;;) {
		ssize_t n =
		    stk_io_recv(c->fd, c->tls, c->rb + c->rb_len, sizeof(c->rb) - c->rb_len);
		size_t off = 0;
		int rc = 0;

		if (n == 0)
			rc = -ECONNRESET;
		else if (n == -EINTR)
			continue;
		else if (n == -EAGAIN || n == -EWOULDBLOCK)
			return 0;
		else if (n < 0)
			rc = (int)n;
		if (rc) {
			conn_break(c, rc);
			return rc;
		}
		c->io_ns = stk_now_ns();
		c->rb_len += (size_t)n;
		while (c->rb_len - off >= STK_FRAME_HDR_LEN) {
			struct stk_frame_hdr h;
			struct stk_lcall *call;
			size_t whole;

			if (stk_hdr_decode(c->rb + off, &h) || !(h.flags & STK_FRAME_REPLY) ||
			    h.bulk_len || h.payload_len > LC_RBUF - STK_FRAME_HDR_LEN) {
				rc = -EBADMSG;
				break;
			}
			whole = STK_FRAME_HDR_LEN + h.payload_len;
			if (c->rb_len - off < whole)
				break;
			call = take_sent(c, h.req_id);
			if (!call || call->opcode != h.opcode ||
			    stk_crc32c(0, c->rb + off + STK_FRAME_HDR_LEN, h.payload_len) !=
				    h.checksum) {
				if (call) /* back: conn_break fails it with the rest */
					call->next_ = c->sent, c->sent = call;
				stk_warn("reply from %s to a call it was not sent, or malformed "
					 "(%s, id %llu): dropping connection",
					 c->addr, stk_opcode_name(h.opcode),
					 (unsigned long long)h.req_id);
				rc = -EBADMSG;
				break;
			}
			if (h.payload_len > call->resp_cap) {
				call->next_ = c->sent, c->sent = call;
				rc = -EMSGSIZE;
				break;
			}
			memcpy(call->resp, c->rb + off + STK_FRAME_HDR_LEN, h.payload_len);
			call->resp_len = h.payload_len;
			call->status = h.status;
			off += whole;
			if (call != &c->auth)
				stk_callwatch_end(lc->watch, call->slot_);
			call->done(call, 0);
			if (call == &c->auth && !conn_alive(lc, c))
				return -ECONNRESET; /* the handshake failed: c is gone */
		}
		if (rc) {
			conn_break(c, rc);
			return rc;
		}
		memmove(c->rb, c->rb + off, c->rb_len - off);
		c->rb_len -= off;
	}
}

/* Deadlines, four times a second while calls wait or a connection is set up. */
static void lc_tick(struct stk_lclient *lc)
{
	uint64_t now = stk_now_ns(), v;
	struct lc_conn *c, *next;
	int any = 0;

	if (read(lc->tfd, &v, sizeof(v)) < 0) {
		/* not expired yet */
	}
	for (c = lc->conns; c; c = next) {
		uint64_t limit = c->state == LC_READY ? lc->timeout_ms : STK_MIN(lc->timeout_ms,
										   LC_SETUP_MS);
		int busy = c->state != LC_READY || c->sent || c->out_head;

		next = c->next;
		if (busy && now - c->io_ns > limit * 1000000ull) {
			stk_warn("%s: no byte moved for %llu ms with calls waiting: dropping "
				 "connection",
				 c->addr, (unsigned long long)limit);
			conn_break(c, -ETIMEDOUT);
		} else if (busy) {
			any = 1;
		}
	}
	if (!any)
		timer_set(lc, 0); /* idle connections need no deadline: no wake-ups */
}

int stk_lclient_create(int epfd, unsigned timeout_ms, struct stk_callwatch *watch,
		       struct stk_lclient **out)
{
	struct stk_lclient *lc = calloc(1, sizeof(*lc));
	struct epoll_event e = {.events = EPOLLIN};
	int rc = 0;

	*out = NULL;
	if (!lc)
		return -ENOMEM;
	lc->epfd = epfd;
	lc->watch = watch;
	lc->timeout_ms = timeout_ms;
	if (!lc->timeout_ms) {
		const char *env = getenv("STOKER_RPC_TIMEOUT_MS");
		uint64_t ms;

		lc->timeout_ms = env && stk_parse_u64(env, &ms) == 0 && ms > 0 && ms < 86400000
					 ? (unsigned)ms
					 : 60000;
	}
	pthread_mutex_init(&lc->lock, NULL);
	lc->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	lc->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
	if (lc->evfd < 0 || lc->tfd < 0) {
		rc = -errno;
		goto out;
	}
	e.data.ptr = &lc->tag_wake;
	if (epoll_ctl(epfd, EPOLL_CTL_ADD, lc->evfd, &e) < 0) {
		rc = -errno;
		goto out;
	}
	e.data.ptr = &lc->tag_timer;
	if (epoll_ctl(epfd, EPOLL_CTL_ADD, lc->tfd, &e) < 0) {
		rc = -errno;
		epoll_ctl(epfd, EPOLL_CTL_DEL, lc->evfd, NULL);
		goto out;
	}
	*out = lc;
	return 0;
out:
	if (lc->evfd >= 0)
		close(lc->evfd);
	if (lc->tfd >= 0)
		close(lc->tfd);
	pthread_mutex_destroy(&lc->lock);
	free(lc);
	return rc;
}

int stk_lclient_call(struct stk_lclient *lc, struct stk_lcall *call)
{
	uint64_t one = 1;
	int wake;

	if (call->req_len > STK_MAX_PAYLOAD || call->bulk_len > STK_MAX_BULK)
		return -EMSGSIZE;
	if (!call->addr[0] || !call->done)
		return -EINVAL;
	call->resp_len = 0;
	call->status = 0;
	pthread_mutex_lock(&lc->lock);
	if (lc->closing) {
		pthread_mutex_unlock(&lc->lock);
		return -ESHUTDOWN;
	}
	wake = !lc->inbox_head;
	list_add(&lc->inbox_head, &lc->inbox_tail, call);
	pthread_mutex_unlock(&lc->lock);
	if (wake && write(lc->evfd, &one, sizeof(one)) < 0) {
		/* the counter is non-zero already: the loop will look */
	}
	return 0;
}

int stk_lclient_event(struct stk_lclient *lc, void *tag, uint32_t events)
{
	struct lc_conn *c;

	if (tag == &lc->tag_wake) {
		struct stk_lcall *call;
		uint64_t v;

		if (read(lc->evfd, &v, sizeof(v)) < 0) {
			/* nothing posted */
		}
		pthread_mutex_lock(&lc->lock);
		call = lc->inbox_head;
		lc->inbox_head = lc->inbox_tail = NULL;
		pthread_mutex_unlock(&lc->lock);
		while (call) {
			struct stk_lcall *next = call->next_;

			call_start(lc, call);
			call = next;
		}
		return 1;
	}
	if (tag == &lc->tag_timer) {
		lc_tick(lc);
		return 1;
	}
	for (c = lc->conns; c && c != tag; c = c->next)
		;
	if (!c)
		return 0;
	if (c->state == LC_CONNECTING) {
		int err = 0;
		socklen_t elen = sizeof(err);

		if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &elen) < 0)
			err = errno;
		if (!err && (events & (EPOLLERR | EPOLLHUP)))
			err = ECONNRESET; /* shut down by the call watch while connecting */
		if (err) {
			conn_break(c, -err);
			return 1;
		}
		if (!(events & EPOLLOUT))
			return 1;
		c->io_ns = stk_now_ns();
		conn_connected(c);
		conn_flush(c);
		return 1;
	}
	if (c->state == LC_TLS) {
		conn_tls_step(c);
		return 1;
	}
	if (events & (EPOLLIN | EPOLLERR | EPOLLHUP)) {
		if (conn_read(c))
			return 1; /* broken, and gone */
	}
	if (conn_alive(lc, c))
		conn_flush(c);
	return 1;
}

void stk_lclient_batch_end(struct stk_lclient *lc)
{
	while (lc->dead) {
		struct lc_conn *c = lc->dead;

		lc->dead = c->next;
		free(c);
	}
}

void stk_lclient_destroy(struct stk_lclient *lc)
{
	struct stk_lcall *call;

	if (!lc)
		return;
	pthread_mutex_lock(&lc->lock);
	lc->closing = 1;
	call = lc->inbox_head;
	lc->inbox_head = lc->inbox_tail = NULL;
	pthread_mutex_unlock(&lc->lock);
	while (call) {
		struct stk_lcall *next = call->next_;

		call->done(call, -ECANCELED);
		call = next;
	}
	while (lc->conns)
		conn_break(lc->conns, -ECANCELED);
	stk_lclient_batch_end(lc);
	epoll_ctl(lc->epfd, EPOLL_CTL_DEL, lc->evfd, NULL);
	epoll_ctl(lc->epfd, EPOLL_CTL_DEL, lc->tfd, NULL);
	close(lc->evfd);
	close(lc->tfd);
	pthread_mutex_destroy(&lc->lock);
	free(lc);
}
