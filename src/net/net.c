/*
 * TCP transport: connections, the RPC exchange, a connection pool and a
 * thread-per-connection server.
 *
 * Why threads per connection and blocking sockets: each connection's thread does
 * the whole request (read, handle, reply), so a handler may block on disk without
 * stalling any other connection, and the client library gets parallelism by
 * opening several connections to a node. The interface (stk_rpc_*, stk_server_*)
 * hides this, so an io_uring event loop can replace the internals later without
 * touching the services.
 */

#include "net.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdatomic.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "../common/log.h"
#include "../common/metrics.h"
#include "../common/util.h"
#include "../proto/msg.h"
#include "../proto/status.h"

struct stk_conn {
	int fd;
	int broken;
	uint64_t next_req_id;
	char addr[STK_ADDR_MAX];
	struct stk_conn *next; /* pool idle list */
};

static int rpc_timeout_ms(void)
{
	static int cached;
	if (!cached) {
		const char *e = getenv("STOKER_RPC_TIMEOUT_MS");
		uint64_t v;
		cached = (e && stk_parse_u64(e, &v) == 0 && v > 0 && v < 86400000) ? (int)v : 60000;
	}
	return cached;
}

static int resolve(const char *addr, struct sockaddr_storage *ss, socklen_t *sslen)
{
	char host[256], port[8];
	uint16_t p;
	struct addrinfo hints, *res = NULL;
	int rc;

	if (stk_parse_hostport(addr, host, sizeof(host), &p))
		return -EINVAL;
	snprintf(port, sizeof(port), "%u", p);
	memset(&hints, 0, sizeof(hints));
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_NUMERICSERV;
	rc = getaddrinfo(host, port, &hints, &res);
	if (rc != 0 || !res)
		return -EHOSTUNREACH;
	memcpy(ss, res->ai_addr, res->ai_addrlen);
	*sslen = res->ai_addrlen;
	freeaddrinfo(res);
	return 0;
}

static void set_sock_opts(int fd, int timeout_ms)
{
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	if (timeout_ms > 0) {
		struct timeval tv = {.tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000};
		setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
		setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	}
}

int stk_conn_connect(const char *addr, int timeout_ms, struct stk_conn **out)
{
	struct sockaddr_storage ss;
	socklen_t sslen;
	struct stk_conn *c;
	int fd = -1, rc, flags;

	rc = resolve(addr, &ss, &sslen);
	if (rc)
		return rc;
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	if (stk_strlcpy(c->addr, addr, sizeof(c->addr))) {
		rc = -EINVAL;
		goto out;
	}
	fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		rc = -errno;
		goto out;
	}
	flags = fcntl(fd, F_GETFL);
	fcntl(fd, F_SETFL, flags | O_NONBLOCK);
	if (connect(fd, (struct sockaddr *)&ss, sslen) < 0) {
		struct pollfd pfd = {.fd = fd, .events = POLLOUT};
		int err = 0;
		socklen_t elen = sizeof(err);
		if (errno != EINPROGRESS) {
			rc = -errno;
			goto out;
		}
		rc = poll(&pfd, 1, timeout_ms > 0 ? timeout_ms : 10000);
		if (rc == 0) {
			rc = -ETIMEDOUT;
			goto out;
		}
		if (rc < 0) {
			rc = -errno;
			goto out;
		}
		getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen);
		if (err) {
			rc = -err;
			goto out;
		}
	}
	fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
	set_sock_opts(fd, rpc_timeout_ms());
	c->fd = fd;
	c->next_req_id = 1;
	*out = c;
	return 0;
out:
	if (fd >= 0)
		close(fd);
	free(c);
	return rc;
}

void stk_conn_close(struct stk_conn *c)
{
	if (!c)
		return;
	close(c->fd);
	free(c);
}

int stk_conn_broken(const struct stk_conn *c)
{
	return c->broken;
}

const char *stk_conn_addr(const struct stk_conn *c)
{
	return c->addr;
}

/* Sends iov fully. 0 or -errno. */
static int send_iov(int fd, struct iovec *iov, int n)
{
	while (n > 0) {
		struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)n};
		ssize_t w = sendmsg(fd, &mh, MSG_NOSIGNAL);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			return errno == EAGAIN ? -ETIMEDOUT : -errno;
		}
		stk_iov_advance(&iov, &n, (size_t)w);
	}
	return 0;
}

/* Receives exactly len bytes. 0, -ECONNRESET on EOF, or -errno. */
static int recv_all(int fd, void *buf, size_t len)
{
	char *p = buf;

	while (len) {
		ssize_t r = recv(fd, p, len, MSG_WAITALL);
		if (r < 0) {
			if (errno == EINTR)
				continue;
			return errno == EAGAIN ? -ETIMEDOUT : -errno;
		}
		if (r == 0)
			return -ECONNRESET;
		p += r;
		len -= (size_t)r;
	}
	return 0;
}

static int send_frame(int fd, struct stk_frame_hdr *h, const void *payload, const void *bulk)
{
	uint8_t hb[STK_FRAME_HDR_LEN];
	struct iovec iov[3];
	int n = 1;
	uint32_t crc = 0;

	if (h->payload_len)
		crc = stk_crc32c(crc, payload, h->payload_len);
	if (h->bulk_len && !(h->flags & STK_FRAME_BULK_SELF))
		crc = stk_crc32c(crc, bulk, h->bulk_len);
	h->checksum = crc;
	h->magic = STK_WIRE_MAGIC;
	if (!h->version)
		h->version = STK_WIRE_VERSION;
	stk_hdr_encode(h, hb);
	iov[0].iov_base = hb;
	iov[0].iov_len = sizeof(hb);
	if (h->payload_len) {
		iov[n].iov_base = (void *)payload;
		iov[n++].iov_len = h->payload_len;
	}
	if (h->bulk_len) {
		iov[n].iov_base = (void *)bulk;
		iov[n++].iov_len = h->bulk_len;
	}
	return send_iov(fd, iov, n);
}

int stk_rpc_send(struct stk_conn *c, struct stk_rpc *rpc)
{
	struct stk_frame_hdr h;
	int rc;

	if (c->broken)
		return -ENOTCONN;
	if (rpc->req_len > STK_MAX_PAYLOAD || rpc->bulk_out_len > STK_MAX_BULK)
		return -EMSGSIZE;
	memset(&h, 0, sizeof(h));
	h.opcode = rpc->opcode;
	h.flags = rpc->frame_flags & STK_FRAME_BULK_SELF;
	h.req_id = rpc->req_id = c->next_req_id++;
	h.payload_len = (uint32_t)rpc->req_len;
	h.bulk_len = (uint32_t)rpc->bulk_out_len;
	h.origin = rpc->origin;
	rc = send_frame(c->fd, &h, rpc->req, rpc->bulk_out);
	if (rc)
		c->broken = 1;
	return rc;
}

int stk_rpc_recv(struct stk_conn *c, struct stk_rpc *rpc)
{
	uint8_t hb[STK_FRAME_HDR_LEN];
	struct stk_frame_hdr h;
	uint32_t crc = 0;
	int rc;

	rpc->resp_len = 0;
	rpc->bulk_in_len = 0;
	if (c->broken)
		return -ENOTCONN;
	rc = recv_all(c->fd, hb, sizeof(hb));
	if (rc)
		goto broken;
	rc = -EBADMSG;
	if (stk_hdr_decode(hb, &h) || !(h.flags & STK_FRAME_REPLY) || h.req_id != rpc->req_id ||
	    h.opcode != rpc->opcode)
		goto broken;
	if ((h.flags & STK_FRAME_BULK_SELF) && !(rpc->frame_flags & STK_FRAME_BULK_SELF))
		goto broken; /* nobody would check that bulk */
	rc = -EMSGSIZE;
	if (h.payload_len > rpc->resp_cap || h.bulk_len > rpc->bulk_in_cap)
		goto broken;
	if (h.payload_len && (rc = recv_all(c->fd, rpc->resp, h.payload_len)))
		goto broken;
	if (h.bulk_len && (rc = recv_all(c->fd, rpc->bulk_in, h.bulk_len)))
		goto broken;
	if (h.payload_len)
		crc = stk_crc32c(crc, rpc->resp, h.payload_len);
	if (h.bulk_len && !(h.flags & STK_FRAME_BULK_SELF))
		crc = stk_crc32c(crc, rpc->bulk_in, h.bulk_len);
	if (crc != h.checksum) {
		stk_warn("checksum mismatch in reply from %s (%s): dropping connection", c->addr,
			 stk_opcode_name(h.opcode));
		rc = -EBADMSG;
		goto broken;
	}
	rpc->resp_len = h.payload_len;
	rpc->bulk_in_len = h.bulk_len;
	rpc->status = h.status;
	return 0;
broken:
	c->broken = 1;
	return rc;
}

int stk_rpc_call(struct stk_conn *c, struct stk_rpc *rpc)
{
	int rc = stk_rpc_send(c, rpc);
	if (rc)
		return rc;
	rc = stk_rpc_recv(c, rpc);
	if (rc)
		return rc;
	return stk_status_to_errno(rpc->status);
}

/* ---- pool ---- */

struct pool_entry {
	char addr[STK_ADDR_MAX];
	struct stk_conn *idle;
	unsigned nidle;
	struct pool_entry *next;
};

struct stk_pool {
	pthread_mutex_t lock; /* protects entries and their idle lists */
	struct pool_entry *entries;
	unsigned max_idle;
};

int stk_pool_create(unsigned max_idle, struct stk_pool **out)
{
	struct stk_pool *p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	pthread_mutex_init(&p->lock, NULL);
	p->max_idle = max_idle ? max_idle : 16;
	*out = p;
	return 0;
}

void stk_pool_flush(struct stk_pool *p)
{
	pthread_mutex_lock(&p->lock);
	for (struct pool_entry *e = p->entries; e; e = e->next) {
		while (e->idle) {
			struct stk_conn *c = e->idle;
			e->idle = c->next;
			stk_conn_close(c);
		}
		e->nidle = 0;
	}
	pthread_mutex_unlock(&p->lock);
}

void stk_pool_destroy(struct stk_pool *p)
{
	if (!p)
		return;
	stk_pool_flush(p);
	while (p->entries) {
		struct pool_entry *e = p->entries;
		p->entries = e->next;
		free(e);
	}
	pthread_mutex_destroy(&p->lock);
	free(p);
}

static struct pool_entry *pool_entry(struct stk_pool *p, const char *addr)
{
	struct pool_entry *e;

	for (e = p->entries; e; e = e->next)
		if (strcmp(e->addr, addr) == 0)
			return e;
	e = calloc(1, sizeof(*e));
	if (!e)
		return NULL;
	stk_strlcpy(e->addr, addr, sizeof(e->addr));
	e->next = p->entries;
	p->entries = e;
	return e;
}

int stk_pool_get(struct stk_pool *p, const char *addr, struct stk_conn **out)
{
	struct pool_entry *e;
	struct stk_conn *c = NULL;

	pthread_mutex_lock(&p->lock);
	e = pool_entry(p, addr);
	if (e && e->idle) {
		c = e->idle;
		e->idle = c->next;
		e->nidle--;
	}
	pthread_mutex_unlock(&p->lock);
	if (c) {
		c->next = NULL;
		*out = c;
		return 0;
	}
	return stk_conn_connect(addr, 5000, out);
}

void stk_pool_put(struct stk_pool *p, struct stk_conn *c)
{
	struct pool_entry *e;

	if (!c)
		return;
	if (c->broken) {
		stk_conn_close(c);
		return;
	}
	pthread_mutex_lock(&p->lock);
	e = pool_entry(p, c->addr);
	if (e && e->nidle < p->max_idle) {
		c->next = e->idle;
		e->idle = c;
		e->nidle++;
		c = NULL;
	}
	pthread_mutex_unlock(&p->lock);
	if (c)
		stk_conn_close(c);
}

void stk_pool_after_fork(struct stk_pool *p)
{
	/*
	 * Another thread of the parent may have held the lock at fork(): the child's copy
	 * would stay locked forever, so it is made anew. The idle connections' sockets
	 * are shared with the parent; closing the child's descriptors leaves the
	 * parent's connections intact. Connections other threads had checked out are
	 * simply forgotten (their threads do not exist in the child).
	 */
	pthread_mutex_init(&p->lock, NULL);
	stk_pool_flush(p);
}

/* ---- server ---- */

struct srv_conn {
	struct stk_server *srv;
	int fd;
	char peer[STK_ADDR_MAX];
	struct srv_conn *prev, *next; /* srv->conns, under srv->lock */
};

struct stk_server {
	int lfd;
	int stop_pipe[2];
	char addr[STK_ADDR_MAX];
	stk_rpc_handler_fn handler;
	void *ctx;
	unsigned max_conns;
	struct stk_metrics_ops *metrics; /* NULL: not counted */
	pthread_mutex_t lock; /* protects conns, nconns */
	pthread_cond_t idle; /* signalled when nconns drops to 0 */
	struct srv_conn *conns;
	unsigned nconns;
};

void *stk_rpc_resp_bulk_buf(struct stk_rpc_resp *resp, size_t len)
{
	if (len > STK_MAX_BULK)
		return NULL;
	if (len > resp->bulk_cap_) {
		void *nb = realloc(resp->bulk_buf_, len);
		if (!nb)
			return NULL;
		resp->bulk_buf_ = nb;
		resp->bulk_cap_ = len;
	}
	return resp->bulk_buf_;
}

static void format_peer(const struct sockaddr_storage *ss, char *out, size_t len)
{
	char host[INET6_ADDRSTRLEN] = "?";
	unsigned port = 0;

	if (ss->ss_family == AF_INET) {
		const struct sockaddr_in *a = (const void *)ss;
		inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
		port = ntohs(a->sin_port);
		snprintf(out, len, "%s:%u", host, port);
	} else if (ss->ss_family == AF_INET6) {
		const struct sockaddr_in6 *a = (const void *)ss;
		inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
		port = ntohs(a->sin6_port);
		snprintf(out, len, "[%s]:%u", host, port);
	} else {
		snprintf(out, len, "unknown");
	}
}

int stk_server_create(const struct stk_server_opts *opts, struct stk_server **out)
{
	struct sockaddr_storage ss;
	socklen_t sslen = sizeof(ss);
	struct stk_server *s;
	int one = 1, rc;

	if (!opts || opts->size < sizeof(*opts) || !opts->handler || !opts->listen)
		return -EINVAL;
	/* Port 0 is allowed here (stk_parse_hostport refuses it), so parse by hand. */
	{
		char host[256];
		const char *colon = strrchr(opts->listen, ':');
		uint64_t port;
		if (!colon || (size_t)(colon - opts->listen) >= sizeof(host) ||
		    stk_parse_u64(colon + 1, &port) || port > 65535)
			return -EINVAL;
		char tmp[STK_ADDR_MAX];
		snprintf(tmp, sizeof(tmp), "%.*s:%u", (int)(colon - opts->listen), opts->listen,
			 port ? (unsigned)port : 1u);
		rc = resolve(tmp, &ss, &sslen);
		if (rc)
			return rc;
		if (ss.ss_family == AF_INET)
			((struct sockaddr_in *)&ss)->sin_port = htons((uint16_t)port);
		else
			((struct sockaddr_in6 *)&ss)->sin6_port = htons((uint16_t)port);
		(void)host;
	}
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->lfd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (s->lfd < 0) {
		rc = -errno;
		goto out;
	}
	setsockopt(s->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(s->lfd, (struct sockaddr *)&ss, sslen) < 0 || listen(s->lfd, 512) < 0) {
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
	s->handler = opts->handler;
	s->ctx = opts->ctx;
	s->max_conns = opts->max_conns ? opts->max_conns : 1024;
	s->metrics = opts->metrics;
	pthread_mutex_init(&s->lock, NULL);
	pthread_cond_init(&s->idle, NULL);
	*out = s;
	return 0;
out:
	if (s->lfd >= 0)
		close(s->lfd);
	free(s);
	return rc;
}

const char *stk_server_addr(const struct stk_server *s)
{
	return s->addr;
}

/* Serves one connection until EOF, error or a malformed frame. */
static void serve_conn(struct srv_conn *sc)
{
	struct stk_server *s = sc->srv;
	uint8_t hb[STK_FRAME_HDR_LEN];
	uint8_t *in = NULL, *inbulk = NULL, *out = NULL;
	size_t in_cap = 0, inbulk_cap = 0;
	struct stk_rpc_resp resp = {0};
	struct stk_frame_hdr h, rh;
	int rc;

	stk_metrics_ops_conn(s->metrics, 1);
	out = malloc(STK_MAX_PAYLOAD);
	if (!out)
		goto done;
	for (;;) {
		uint32_t crc = 0;
		struct stk_rpc_req req;
		uint64_t t0;

		rc = recv_all(sc->fd, hb, sizeof(hb));
		if (rc)
			break; /* EOF or reset: the peer went away */
		if (stk_hdr_decode(hb, &h) || (h.flags & STK_FRAME_REPLY)) {
			stk_warn("malformed frame header from %s: closing connection", sc->peer);
			break;
		}
		if (h.payload_len > in_cap) {
			uint8_t *n = realloc(in, h.payload_len);
			if (!n)
				break;
			in = n;
			in_cap = h.payload_len;
		}
		if (h.bulk_len > inbulk_cap) {
			/*
			 * Page-aligned, whole pages, on huge pages where there are any: a
			 * handler may hand the bulk to the disk as it is (the chunk store
			 * writes whole chunks with O_DIRECT), one segment a huge page.
			 */
			size_t cap = ((size_t)h.bulk_len + 4095) & ~(size_t)4095;
			uint8_t *n = stk_huge_alloc(cap, 0);
			if (!n)
				break;
			stk_huge_free(inbulk, inbulk_cap, 0);
			inbulk = n;
			inbulk_cap = cap;
		}
		if (h.payload_len && recv_all(sc->fd, in, h.payload_len))
			break;
		if (h.bulk_len && recv_all(sc->fd, inbulk, h.bulk_len))
			break;
		if (h.payload_len)
			crc = stk_crc32c(crc, in, h.payload_len);
		if (h.bulk_len && !(h.flags & STK_FRAME_BULK_SELF))
			crc = stk_crc32c(crc, inbulk, h.bulk_len);
		if (crc != h.checksum) {
			stk_warn("frame checksum mismatch from %s (%s): closing connection", sc->peer,
				 stk_opcode_name(h.opcode));
			break;
		}
		memset(&rh, 0, sizeof(rh));
		rh.opcode = h.opcode;
		rh.req_id = h.req_id;
		rh.flags = STK_FRAME_REPLY;
		stk_wbuf_init(&resp.payload, out, STK_MAX_PAYLOAD);
		resp.bulk = NULL;
		resp.bulk_len = 0;
		resp.frame_flags = 0;
		t0 = stk_metrics_ops_begin(s->metrics, h.opcode);
		if (h.version != STK_WIRE_VERSION) {
			static atomic_int told;
			if (!atomic_exchange(&told, 1))
				stk_warn("%s speaks wire protocol version %u, this daemon %u: its "
					 "requests are refused (run one Stoker version across the "
					 "cluster and its clients)",
					 sc->peer, h.version, STK_WIRE_VERSION);
			rc = -EOPNOTSUPP;
		} else {
			req.hdr = h;
			stk_rbuf_init(&req.payload, in, h.payload_len);
			req.bulk = inbulk;
			req.bulk_len = h.bulk_len;
			req.peer = sc->peer;
			rc = s->handler(s->ctx, &req, &resp);
			if (rc == 0 && resp.payload.err)
				rc = resp.payload.err;
		}
		if (rc) {
			rh.status = stk_status_from_errno(rc);
			rh.payload_len = 0;
			rh.bulk_len = 0;
		} else {
			rh.payload_len = (uint32_t)resp.payload.len;
			rh.bulk_len = resp.bulk_len;
			rh.flags |= resp.frame_flags & STK_FRAME_BULK_SELF;
		}
		/* Counted before the reply leaves: whoever got the reply and scrapes the
		 * metrics next finds the request in them. */
		stk_metrics_ops_answered(s->metrics, h.opcode, stk_status_to_errno(rh.status),
					 STK_FRAME_HDR_LEN + (uint64_t)h.payload_len + h.bulk_len,
					 STK_FRAME_HDR_LEN + (uint64_t)rh.payload_len + rh.bulk_len);
		rc = send_frame(sc->fd, &rh, out, resp.bulk);
		stk_metrics_ops_sent(s->metrics, h.opcode, t0);
		if (rc)
			break;
	}
done:
	stk_metrics_ops_conn(s->metrics, -1);
	free(in);
	stk_huge_free(inbulk, inbulk_cap, 0);
	free(out);
	free(resp.bulk_buf_);
}

static void *conn_thread(void *arg)
{
	struct srv_conn *sc = arg;
	struct stk_server *s = sc->srv;

	serve_conn(sc);
	pthread_mutex_lock(&s->lock);
	if (sc->prev)
		sc->prev->next = sc->next;
	else
		s->conns = sc->next;
	if (sc->next)
		sc->next->prev = sc->prev;
	close(sc->fd);
	if (--s->nconns == 0)
		pthread_cond_broadcast(&s->idle);
	pthread_mutex_unlock(&s->lock);
	free(sc);
	return NULL;
}

int stk_server_run(struct stk_server *s)
{
	for (;;) {
		struct pollfd pfd[2] = {{.fd = s->lfd, .events = POLLIN},
					{.fd = s->stop_pipe[0], .events = POLLIN}};
		struct sockaddr_storage ss;
		socklen_t sslen = sizeof(ss);
		struct srv_conn *sc;
		pthread_attr_t attr;
		pthread_t tid;
		int fd;

		if (poll(pfd, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (pfd[1].revents)
			return 0;
		if (!(pfd[0].revents & POLLIN))
			continue;
		fd = accept4(s->lfd, (struct sockaddr *)&ss, &sslen, SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED || errno == EAGAIN)
				continue;
			if (errno == EMFILE || errno == ENFILE) {
				stk_warn("accept: %s; backing off", strerror(errno));
				poll(NULL, 0, 100);
				continue;
			}
			return -errno;
		}
		pthread_mutex_lock(&s->lock);
		if (s->nconns >= s->max_conns) {
			pthread_mutex_unlock(&s->lock);
			stk_warn("connection limit (%u) reached: refusing a connection", s->max_conns);
			close(fd);
			continue;
		}
		pthread_mutex_unlock(&s->lock);
		set_sock_opts(fd, 0);
		sc = calloc(1, sizeof(*sc));
		if (!sc) {
			close(fd);
			continue;
		}
		sc->srv = s;
		sc->fd = fd;
		format_peer(&ss, sc->peer, sizeof(sc->peer));
		pthread_mutex_lock(&s->lock);
		sc->next = s->conns;
		if (s->conns)
			s->conns->prev = sc;
		s->conns = sc;
		s->nconns++;
		pthread_mutex_unlock(&s->lock);
		pthread_attr_init(&attr);
		pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
		pthread_attr_setstacksize(&attr, 256 << 10);
		if (pthread_create(&tid, &attr, conn_thread, sc) != 0) {
			pthread_mutex_lock(&s->lock);
			if (sc->next)
				sc->next->prev = NULL;
			s->conns = sc->next;
			s->nconns--;
			pthread_mutex_unlock(&s->lock);
			close(fd);
			free(sc);
		}
		pthread_attr_destroy(&attr);
	}
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
	close(s->lfd);
	pthread_mutex_lock(&s->lock);
	for (struct srv_conn *sc = s->conns; sc; sc = sc->next)
		shutdown(sc->fd, SHUT_RDWR);
	while (s->nconns)
		pthread_cond_wait(&s->idle, &s->lock);
	pthread_mutex_unlock(&s->lock);
	close(s->stop_pipe[0]);
	close(s->stop_pipe[1]);
	pthread_mutex_destroy(&s->lock);
	pthread_cond_destroy(&s->idle);
	free(s);
}
