/*
 * TCP transport, client side: multiplexed connections and a pool of them.
 *
 * A connection carries many requests at once. Any thread may send on it (one frame
 * at a time, under send_lock); each request waits for its own reply, matched by the
 * request id the reply echoes. There is no reader thread: whichever waiting caller
 * finds nobody reading becomes the reader, reads the next reply straight into the
 * buffers of the request it answers (the caller's, so bulk data is copied once,
 * from the socket), wakes that request's caller alone (each request has its own
 * condition variable, so a reply wakes one thread, not every waiter) and reads on
 * until its own reply has come; then it wakes one waiter to read next. Replies may
 * come in any order.
 *
 * A transport failure (reset, timeout, malformed reply) breaks the connection: every
 * request waiting on it fails with that error, and nothing is sent on it again.
 *
 * The pool keeps, per address, up to `conns_per_addr` connections shared by every
 * caller: stk_pool_get hands out the one with the fewest requests waiting, opening
 * another while all are busy and there are fewer than that.
 */

#include "net.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "../common/auth.h"
#include "../common/log.h"
#include "../common/util.h"
#include "../proto/msg.h"
#include "../proto/status.h"
#include "netint.h"
#include "tls.h"

struct stk_conn {
	int fd;
	struct stk_tls *tls; /* TLS on this connection (tls.h), or NULL: plain */
	char addr[STK_ADDR_MAX];
	pthread_mutex_t send_lock; /* one frame at a time onto the socket */
	pthread_mutex_t lock; /* protects everything below */
	int broken; /* -errno of the failure that broke it; 0 while sound */
	int reading; /* a caller is reading replies */
	uint64_t next_req_id;
	struct stk_rpc *pending; /* sent, reply not yet read (through rpc->next_) */
	unsigned npending;
	/* The pool's (under the pool's lock): */
	unsigned refs;
	int retired; /* no longer handed out; closed when the last user puts it */
	struct stk_conn *next;
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

int stk_net_resolve(const char *addr, struct sockaddr_storage *ss, socklen_t *sslen)
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

/* ---- the cluster keys this process holds (common/auth.h) ---- */

#define AUTH_KEYS_MAX 8
#define AUTH_TIMEOUT_MS 5000 /* a server closes a handshake not done in 5 s */

struct auth_key {
	uint8_t key[STK_AUTH_KEY_MAX];
	size_t len;
};

static pthread_mutex_t auth_lock = PTHREAD_MUTEX_INITIALIZER;
static struct auth_key auth_keys[AUTH_KEYS_MAX]; /* under auth_lock */
static unsigned auth_nkeys;
static int auth_strict; /* atomic: stk_net_auth_strict was called */
/* The client identity this process connects as (under auth_lock); see net.h. */
static struct stk_auth_client auth_client;
static uint8_t auth_client_key[STK_AUTH_MAC];
static int auth_has_client;

int stk_net_auth_client_set(const struct stk_auth_client *c, const uint8_t key[STK_AUTH_MAC])
{
	char err[256];

	if (c && stk_auth_client_valid(c, err, sizeof(err)))
		return -EINVAL;
	pthread_mutex_lock(&auth_lock);
	if (c) {
		auth_client = *c;
		memcpy(auth_client_key, key, STK_AUTH_MAC);
		auth_has_client = 1;
	} else {
		memset(&auth_client, 0, sizeof(auth_client));
		memset(auth_client_key, 0, sizeof(auth_client_key));
		auth_has_client = 0;
	}
	pthread_mutex_unlock(&auth_lock);
	return 0;
}

int stk_net_auth_client(struct stk_auth_client *out)
{
	int has;

	pthread_mutex_lock(&auth_lock);
	has = auth_has_client;
	if (has && out)
		*out = auth_client;
	pthread_mutex_unlock(&auth_lock);
	return has;
}

static int tls_on; /* atomic: stk_net_tls_set(1) */

void stk_net_tls_set(int on)
{
	__atomic_store_n(&tls_on, on ? 1 : 0, __ATOMIC_RELAXED);
}

int stk_net_tls(void)
{
	return __atomic_load_n(&tls_on, __ATOMIC_RELAXED);
}

int stk_net_tls_key(unsigned i, uint8_t *key, size_t *len)
{
	int rc = -ENOENT;

	pthread_mutex_lock(&auth_lock);
	if (i < auth_nkeys) {
		/* newest first */
		memcpy(key, auth_keys[auth_nkeys - 1 - i].key, auth_keys[auth_nkeys - 1 - i].len);
		*len = auth_keys[auth_nkeys - 1 - i].len;
		rc = 0;
	}
	pthread_mutex_unlock(&auth_lock);
	return rc;
}

void stk_net_auth_strict(void)
{
	__atomic_store_n(&auth_strict, 1, __ATOMIC_RELAXED);
}

int stk_net_auth_set(const uint8_t *key, size_t len)
{
	int rc = 0;

	if (len < STK_AUTH_KEY_MIN || len > STK_AUTH_KEY_MAX)
		return -EINVAL;
	pthread_mutex_lock(&auth_lock);
	for (unsigned i = 0; i < auth_nkeys; i++)
		if (auth_keys[i].len == len && memcmp(auth_keys[i].key, key, len) == 0) {
			/* held already: it becomes the newest */
			struct auth_key k = auth_keys[i];

			memmove(&auth_keys[i], &auth_keys[i + 1],
				(auth_nkeys - i - 1) * sizeof(auth_keys[0]));
			auth_keys[auth_nkeys - 1] = k;
			goto out;
		}
	if (auth_nkeys == AUTH_KEYS_MAX) {
		/* full: the key added longest ago goes (a process that met many clusters
		 * one after the other, such as a test runner, talks to the last ones) */
		memset(&auth_keys[0], 0, sizeof(auth_keys[0]));
		memmove(&auth_keys[0], &auth_keys[1], (AUTH_KEYS_MAX - 1) * sizeof(auth_keys[0]));
		auth_nkeys--;
	}
	memcpy(auth_keys[auth_nkeys].key, key, len);
	auth_keys[auth_nkeys++].len = len;
out:
	/* a cluster key held anew: this process is no longer a confined client */
	memset(&auth_client, 0, sizeof(auth_client));
	memset(auth_client_key, 0, sizeof(auth_client_key));
	auth_has_client = 0;
	pthread_mutex_unlock(&auth_lock);
	return rc;
}

int stk_net_auth_load(const char *path, char *err, size_t errlen)
{
	uint8_t key[STK_AUTH_KEY_MAX];
	size_t len = 0;
	int rc = stk_auth_client_file(path);

	if (rc == 1) {
		struct stk_auth_client c;

		rc = stk_auth_client_load(path, &c, key, err, errlen);
		if (rc == 0)
			rc = stk_net_auth_client_set(&c, key);
		memset(key, 0, sizeof(key));
		return rc;
	}
	rc = stk_auth_key_load(path, key, &len, err, errlen);
	if (rc == 0 && (rc = stk_net_auth_set(key, len)))
		snprintf(err, errlen, "cannot hold the key of %s: %s", path, strerror(-rc));
	memset(key, 0, sizeof(key));
	return rc;
}

int stk_net_auth_cluster_key(uint8_t *key, size_t *len)
{
	int rc = 0;

	pthread_mutex_lock(&auth_lock);
	if (auth_has_client)
		rc = -EPERM;
	else if (!auth_nkeys)
		rc = -EKEYREJECTED;
	else {
		memcpy(key, auth_keys[auth_nkeys - 1].key, auth_keys[auth_nkeys - 1].len);
		*len = auth_keys[auth_nkeys - 1].len;
	}
	pthread_mutex_unlock(&auth_lock);
	return rc;
}

int stk_net_auth_keys(void)
{
	unsigned n;

	pthread_mutex_lock(&auth_lock);
	n = auth_nkeys + (unsigned)auth_has_client;
	pthread_mutex_unlock(&auth_lock);
	return (int)n;
}

/*
 * The client's side of the handshake (auth.h), on a new connection, before anyone
 * else uses it. The server must prove one of the keys this process holds (the one
 * its MAC verifies with is the cluster's), then this side proves the same key. A
 * server without a key answers NOSYS: nothing to prove either way. 0, -EKEYREJECTED
 * (the server refused our proof, or proved no key we hold), or a transport error.
 */
static int conn_auth(struct stk_conn *c)
{
	struct auth_key keys[AUTH_KEYS_MAX];
	struct stk_msg_auth_hello_req hello;
	struct stk_msg_auth_hello_resp hr;
	struct stk_msg_auth_proof_req proof;
	struct stk_msg_auth_hello_client_req ch;
	uint8_t req[2048], resp[128];
	struct stk_wbuf w;
	struct stk_rbuf r;
	struct stk_rpc rpc;
	unsigned n, k;
	int rc, client;

	pthread_mutex_lock(&auth_lock);
	client = auth_has_client;
	if (client) {
		/* a client key: the only key proved, opened with the policy it is for */
		memset(&ch, 0, sizeof(ch));
		stk_strlcpy(ch.client, auth_client.name, sizeof(ch.client));
		ch.gen = auth_client.gen;
		ch.flags = auth_client.flags;
		ch.anon_uid = auth_client.anon_uid;
		ch.anon_gid = auth_client.anon_gid;
		stk_strlcpy(ch.subtree, auth_client.subtree, sizeof(ch.subtree));
		memcpy(keys[0].key, auth_client_key, STK_AUTH_MAC);
		keys[0].len = STK_AUTH_MAC;
		n = 1;
	} else {
		n = auth_nkeys;
		memcpy(keys, auth_keys, n * sizeof(keys[0]));
	}
	pthread_mutex_unlock(&auth_lock);
	if (!n && __atomic_load_n(&auth_strict, __ATOMIC_RELAXED)) {
		stk_warn("not connecting to %s: strict key checks, and this process holds no "
			 "cluster key", c->addr);
		return -EKEYREJECTED;
	}
	if (!n)
		return 0;
	memset(&hello, 0, sizeof(hello));
	rc = stk_auth_random(hello.nonce, sizeof(hello.nonce));
	if (rc)
		goto out;
	stk_wbuf_init(&w, req, sizeof(req));
	if (client) {
		memcpy(ch.nonce, hello.nonce, sizeof(ch.nonce));
		stk_msg_auth_hello_client_req_enc(&w, &ch);
		stk_rpc_prepare(&rpc, STK_OP_AUTH_HELLO_CLIENT, &w, resp, sizeof(resp));
	} else {
		stk_msg_auth_hello_req_enc(&w, &hello);
		stk_rpc_prepare(&rpc, STK_OP_AUTH_HELLO, &w, resp, sizeof(resp));
	}
	rc = stk_rpc_send(c, &rpc);
	if (rc == 0)
		rc = stk_rpc_recv(c, &rpc);
	if (rc)
		goto out;
	if (rpc.status == STK_ST_TLS_REQUIRED) {
		stk_warn("%s requires TLS and this process connects without it: refused (set "
			 "STOKER_TLS=1, or stk_client_opts.tls)",
			 c->addr);
		rc = -EPROTONOSUPPORT;
		goto out;
	}
	if (rpc.status == STK_ST_NOSYS || rpc.status == STK_ST_NOTSUP) {
		/* a daemon run without a key (--auth off): it has proved nothing */
		rc = 0;
		if (__atomic_load_n(&auth_strict, __ATOMIC_RELAXED)) {
			stk_warn("%s runs without a cluster key, and this process checks keys "
				 "strictly: refused", c->addr);
			rc = -EKEYREJECTED;
		}
		goto out;
	}
	rc = stk_status_to_errno(rpc.status);
	if (rc)
		goto out;
	stk_rbuf_init(&r, resp, rpc.resp_len);
	if (stk_msg_auth_hello_resp_dec(&r, &hr)) {
		rc = -EBADMSG;
		goto out;
	}
	for (k = 0; k < n; k++)
		if (stk_auth_verify(keys[k].key, keys[k].len, STK_AUTH_SERVER, hello.nonce,
				    hr.nonce, hr.mac))
			break;
	if (k == n && client) {
		stk_warn("%s does not accept this client key (%s): its file was changed, or it "
			 "belongs to another cluster",
			 c->addr, ch.client);
		rc = -EKEYREJECTED;
		goto out;
	}
	if (k == n) {
		stk_warn("%s did not prove the cluster key this process holds: not using it",
			 c->addr);
		rc = -EKEYREJECTED;
		goto out;
	}
	memset(&proof, 0, sizeof(proof));
	rc = stk_auth_mac(keys[k].key, keys[k].len, STK_AUTH_CLIENT, hello.nonce, hr.nonce,
			  proof.mac);
	if (rc)
		goto out;
	stk_wbuf_init(&w, req, sizeof(req));
	stk_msg_auth_proof_req_enc(&w, &proof);
	stk_rpc_prepare(&rpc, STK_OP_AUTH_PROOF, &w, resp, sizeof(resp));
	rc = stk_rpc_call(c, &rpc);
out:
	memset(keys, 0, sizeof(keys));
	return rc;
}

int stk_net_auth_proof(const uint8_t *nc, const void *resp, size_t len, uint8_t *mac,
		       const char *addr)
{
	struct auth_key keys[AUTH_KEYS_MAX];
	struct stk_msg_auth_hello_resp hr;
	struct stk_rbuf r;
	unsigned n, k;
	int rc;

	stk_rbuf_init(&r, resp, len);
	if (stk_msg_auth_hello_resp_dec(&r, &hr))
		return -EBADMSG;
	pthread_mutex_lock(&auth_lock);
	n = auth_nkeys;
	memcpy(keys, auth_keys, n * sizeof(keys[0]));
	pthread_mutex_unlock(&auth_lock);
	for (k = 0; k < n; k++)
		if (stk_auth_verify(keys[k].key, keys[k].len, STK_AUTH_SERVER, nc, hr.nonce,
				    hr.mac))
			break;
	if (k == n) {
		stk_warn("%s did not prove the cluster key this process holds: not using it",
			 addr);
		rc = -EKEYREJECTED;
	} else {
		rc = stk_auth_mac(keys[k].key, keys[k].len, STK_AUTH_CLIENT, nc, hr.nonce, mac);
	}
	memset(keys, 0, sizeof(keys));
	return rc;
}

int stk_net_auth_fd(int fd, const char *addr)
{
	struct stk_conn c;
	int rc;

	memset(&c, 0, sizeof(c));
	c.fd = fd;
	c.next_req_id = 1;
	stk_strlcpy(c.addr, addr, sizeof(c.addr));
	pthread_mutex_init(&c.send_lock, NULL);
	pthread_mutex_init(&c.lock, NULL);
	rc = conn_auth(&c);
	pthread_mutex_destroy(&c.send_lock);
	pthread_mutex_destroy(&c.lock);
	return rc;
}

/* A connected socket to ss, left non-blocking. 0 or -errno. */
static int open_socket(const struct sockaddr_storage *ss, socklen_t sslen, int timeout_ms,
		       int *out)
{
	int fd, rc;

	fd = socket(ss->ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return -errno;
	if (connect(fd, (const struct sockaddr *)ss, sslen) < 0) {
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
	set_sock_opts(fd, 0);
	*out = fd;
	return 0;
out:
	close(fd);
	return rc;
}

/*
 * TLS on c (tls.h): the handshake with each key held, newest first, on a new
 * socket each time (a process that met several clusters holds several keys, and
 * TLS offers one); a process holding a client key offers that key alone, with
 * its policy in the identity. 0, or the last handshake's error, logged.
 */
static int conn_tls(struct stk_conn *c, const struct sockaddr_storage *ss, socklen_t sslen,
		    int timeout_ms)
{
	uint8_t key[STK_AUTH_KEY_MAX];
	struct stk_auth_client client;
	size_t len = 0;
	int rc = -EKEYREJECTED, has_client;

	/* a client key is the only key offered: its identity names its policy (tls.h) */
	pthread_mutex_lock(&auth_lock);
	has_client = auth_has_client;
	if (has_client) {
		client = auth_client;
		memcpy(key, auth_client_key, STK_AUTH_MAC);
		len = STK_AUTH_MAC;
	}
	pthread_mutex_unlock(&auth_lock);
	for (unsigned i = 0; has_client ? i == 0 : stk_net_tls_key(i, key, &len) == 0; i++) {
		int slot;

		if (c->fd < 0 && (rc = open_socket(ss, sslen, timeout_ms, &c->fd)))
			break;
		rc = has_client ? stk_tls_connect_client_new(c->fd, &client, key, &c->tls)
				: stk_tls_connect_new(c->fd, key, len, &c->tls);
		if (rc)
			break;
		/* a hung peer takes the handshake's deadline: the thread's watch may end it */
		slot = stk_callwatch_begin(stk_callwatch_thread(), c, c->addr);
		rc = stk_tls_handshake_wait(c->tls, STK_MIN(rpc_timeout_ms(), AUTH_TIMEOUT_MS));
		stk_callwatch_end(stk_callwatch_thread(), slot);
		if (rc == 0)
			break;
		stk_warn("TLS handshake with %s failed: %s", c->addr,
			 rc == -ETIMEDOUT ? "no answer within 5 s" : stk_tls_why(c->tls));
		stk_tls_free(c->tls);
		c->tls = NULL;
		close(c->fd);
		c->fd = -1;
		if (rc != -EKEYREJECTED)
			break;
	}
	if (!len)
		stk_warn("not connecting to %s: TLS needs the cluster key, and this process holds "
			 "none",
			 c->addr);
	memset(key, 0, sizeof(key));
	return rc;
}

int stk_conn_connect(const char *addr, int timeout_ms, struct stk_conn **out)
{
	struct sockaddr_storage ss;
	socklen_t sslen;
	struct stk_conn *c;
	int rc;

	rc = stk_net_resolve(addr, &ss, &sslen);
	if (rc)
		return rc;
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->fd = -1;
	if (stk_strlcpy(c->addr, addr, sizeof(c->addr))) {
		rc = -EINVAL;
		goto out;
	}
	c->next_req_id = 1;
	pthread_mutex_init(&c->send_lock, NULL);
	pthread_mutex_init(&c->lock, NULL);
	if (stk_net_tls()) {
		/* TLS proves the key both ways: no key handshake on top (tls.h) */
		rc = conn_tls(c, &ss, sslen, timeout_ms);
		if (rc)
			goto out_close;
		*out = c;
		return 0;
	}
	rc = open_socket(&ss, sslen, timeout_ms, &c->fd);
	if (rc)
		goto out_close;
	fcntl(c->fd, F_SETFL, fcntl(c->fd, F_GETFL) & ~O_NONBLOCK);
	if (stk_net_auth_keys() || __atomic_load_n(&auth_strict, __ATOMIC_RELAXED)) {
		/* a hung peer takes the handshake's deadline: the thread's watch may end it */
		int slot = stk_callwatch_begin(stk_callwatch_thread(), c, addr);

		set_sock_opts(c->fd, STK_MIN(rpc_timeout_ms(), AUTH_TIMEOUT_MS));
		rc = conn_auth(c);
		stk_callwatch_end(stk_callwatch_thread(), slot);
		if (rc)
			goto out_close;
	}
	set_sock_opts(c->fd, rpc_timeout_ms());
	*out = c;
	return 0;
out_close:
	stk_conn_close(c);
	return rc;
out:
	free(c);
	return rc;
}

void stk_rpc_prepare(struct stk_rpc *rpc, uint16_t op, const struct stk_wbuf *w, void *resp,
		     size_t cap)
{
	memset(rpc, 0, sizeof(*rpc));
	rpc->opcode = op;
	rpc->req = w->p;
	rpc->req_len = w->len;
	rpc->resp = resp;
	rpc->resp_cap = cap;
}

void stk_conn_abort(struct stk_conn *c)
{
	shutdown(c->fd, SHUT_RDWR);
}

void stk_conn_close(struct stk_conn *c)
{
	if (!c)
		return;
	stk_tls_free(c->tls);
	if (c->fd >= 0)
		close(c->fd);
	pthread_mutex_destroy(&c->send_lock);
	pthread_mutex_destroy(&c->lock);
	free(c);
}

int stk_conn_broken(const struct stk_conn *c)
{
	int b;

	pthread_mutex_lock((pthread_mutex_t *)&c->lock);
	b = c->broken != 0;
	pthread_mutex_unlock((pthread_mutex_t *)&c->lock);
	return b;
}

const char *stk_conn_addr(const struct stk_conn *c)
{
	return c->addr;
}

unsigned stk_conn_pending(const struct stk_conn *c)
{
	unsigned n;

	pthread_mutex_lock((pthread_mutex_t *)&c->lock);
	n = c->npending;
	pthread_mutex_unlock((pthread_mutex_t *)&c->lock);
	return n;
}

/* Fails every waiting request with err; the socket is shut so a blocked peer call wakes. */
static void break_locked(struct stk_conn *c, int err)
{
	if (!c->broken) {
		c->broken = err;
		shutdown(c->fd, SHUT_RDWR);
	}
	for (struct stk_rpc *r = c->pending; r; r = r->next_) {
		r->done_ = 1;
		r->err_ = err;
		if (r->waiting_)
			pthread_cond_signal(&r->cond_);
	}
	c->pending = NULL;
	c->npending = 0;
}

/* The reader leaves: one waiting caller reads next. */
static void hand_over_locked(struct stk_conn *c)
{
	for (struct stk_rpc *r = c->pending; r; r = r->next_)
		if (r->waiting_) {
			pthread_cond_signal(&r->cond_);
			return;
		}
}

static void unlink_locked(struct stk_conn *c, struct stk_rpc *rpc)
{
	for (struct stk_rpc **pp = &c->pending; *pp; pp = &(*pp)->next_)
		if (*pp == rpc) {
			*pp = rpc->next_;
			c->npending--;
			return;
		}
}

/* Sends iov fully. 0 or -errno. */
static int send_iov(struct stk_conn *c, struct iovec *iov, int n)
{
	int fd = c->fd;

	if (c->tls)
		return stk_tls_send_all(c->tls, iov, n, rpc_timeout_ms());
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
static int recv_all(struct stk_conn *c, void *buf, size_t len)
{
	char *p = buf;
	int fd = c->fd;

	if (c->tls)
		return stk_tls_recv_all(c->tls, buf, len, rpc_timeout_ms());

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

void stk_frame_seal(struct stk_frame_hdr *h, const void *payload, const void *bulk,
		    uint8_t hb[STK_FRAME_HDR_LEN])
{
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
}

int stk_rpc_send(struct stk_conn *c, struct stk_rpc *rpc)
{
	uint8_t hb[STK_FRAME_HDR_LEN];
	struct stk_frame_hdr h;
	struct iovec iov[3];
	int n = 1, rc;

	if (rpc->req_len > STK_MAX_PAYLOAD || rpc->bulk_out_len > STK_MAX_BULK)
		return -EMSGSIZE;
	memset(&h, 0, sizeof(h));
	h.opcode = rpc->opcode;
	h.flags = rpc->frame_flags & (STK_FRAME_BULK_SELF | STK_FRAME_CLASS_MASK | STK_FRAME_VOUCH);
	h.payload_len = (uint32_t)rpc->req_len;
	h.bulk_len = (uint32_t)rpc->bulk_out_len;
	h.origin = rpc->origin;
	/* The checksums are computed outside every lock. */
	stk_frame_seal(&h, rpc->req, rpc->bulk_out, hb);
	iov[0].iov_base = hb;
	iov[0].iov_len = sizeof(hb);
	if (h.payload_len) {
		iov[n].iov_base = (void *)rpc->req;
		iov[n++].iov_len = h.payload_len;
	}
	if (h.bulk_len) {
		iov[n].iov_base = (void *)rpc->bulk_out;
		iov[n++].iov_len = h.bulk_len;
	}
	rpc->resp_len = 0;
	rpc->bulk_in_len = 0;
	rpc->done_ = 0;
	rpc->err_ = 0;
	rpc->waiting_ = 0;
	pthread_cond_init(&rpc->cond_, NULL);
	pthread_mutex_lock(&c->send_lock);
	pthread_mutex_lock(&c->lock);
	if (c->broken) {
		pthread_mutex_unlock(&c->lock);
		pthread_mutex_unlock(&c->send_lock);
		return -ENOTCONN;
	}
	/* Waiting before it is on the wire, so its reply always finds it. */
	rpc->req_id = c->next_req_id++;
	rpc->next_ = c->pending;
	c->pending = rpc;
	c->npending++;
	pthread_mutex_unlock(&c->lock);
	/* The id is in the header, which is not covered by the checksum. */
	h.req_id = rpc->req_id;
	stk_hdr_encode(&h, hb);
	rc = send_iov(c, iov, n);
	pthread_mutex_unlock(&c->send_lock);
	if (rc) {
		pthread_mutex_lock(&c->lock);
		unlink_locked(c, rpc);
		break_locked(c, rc);
		pthread_mutex_unlock(&c->lock);
	}
	return rc;
}

static struct stk_rpc *find_locked(struct stk_conn *c, uint64_t req_id)
{
	for (struct stk_rpc *r = c->pending; r; r = r->next_)
		if (r->req_id == req_id)
			return r;
	return NULL;
}

/*
 * Reads one reply into the buffers of the request it answers and hands it over.
 * 0, or -errno for a transport failure (the caller breaks the connection). Called
 * by the one reader, without c->lock.
 */
static int read_reply(struct stk_conn *c)
{
	uint8_t hb[STK_FRAME_HDR_LEN];
	struct stk_frame_hdr h;
	struct stk_rpc *rpc;
	uint32_t crc = 0;
	int rc;

	rc = recv_all(c, hb, sizeof(hb));
	if (rc)
		return rc;
	if (stk_hdr_decode(hb, &h) || !(h.flags & STK_FRAME_REPLY))
		return -EBADMSG;
	if (h.version != STK_WIRE_VERSION) {
		static int told; /* atomic */

		/* its NOTSUP is passed on as any status; this says why, once */
		if (!__atomic_exchange_n(&told, 1, __ATOMIC_RELAXED))
			stk_warn("%s speaks wire protocol version %u, this process %u: it refuses "
				 "our requests (run one Stoker version across the cluster and its "
				 "clients)",
				 c->addr, h.version, STK_WIRE_VERSION);
		if (h.status == STK_ST_OK)
			return -EBADMSG; /* nothing of another version is read as ours */
	}
	pthread_mutex_lock(&c->lock);
	rpc = find_locked(c, h.req_id);
	pthread_mutex_unlock(&c->lock);
	/* Until it is marked done only the reader touches a waiting request. */
	if (!rpc || h.opcode != rpc->opcode) {
		stk_warn("reply from %s to a request it was not sent (%s, id %llu): dropping "
			 "connection",
			 c->addr, stk_opcode_name(h.opcode), (unsigned long long)h.req_id);
		return -EBADMSG;
	}
	if ((h.flags & STK_FRAME_BULK_SELF) && !(rpc->frame_flags & STK_FRAME_BULK_SELF))
		return -EBADMSG; /* nobody would check that bulk */
	if (h.payload_len > rpc->resp_cap || h.bulk_len > rpc->bulk_in_cap)
		return -EMSGSIZE;
	if (h.payload_len && (rc = recv_all(c, rpc->resp, h.payload_len)))
		return rc;
	if (h.bulk_len && (rc = recv_all(c, rpc->bulk_in, h.bulk_len)))
		return rc;
	if (h.payload_len)
		crc = stk_crc32c(crc, rpc->resp, h.payload_len);
	if (h.bulk_len && !(h.flags & STK_FRAME_BULK_SELF))
		crc = stk_crc32c(crc, rpc->bulk_in, h.bulk_len);
	if (crc != h.checksum) {
		stk_warn("checksum mismatch in reply from %s (%s): dropping connection", c->addr,
			 stk_opcode_name(h.opcode));
		return -EBADMSG;
	}
	pthread_mutex_lock(&c->lock);
	rpc->resp_len = h.payload_len;
	rpc->resp_flags = h.flags;
	rpc->bulk_in_len = h.bulk_len;
	rpc->status = h.status;
	unlink_locked(c, rpc);
	rpc->done_ = 1;
	rpc->err_ = 0;
	if (rpc->waiting_)
		pthread_cond_signal(&rpc->cond_);
	pthread_mutex_unlock(&c->lock);
	return 0;
}

int stk_rpc_recv(struct stk_conn *c, struct stk_rpc *rpc)
{
	int rc;

	pthread_mutex_lock(&c->lock);
	for (;;) {
		if (rpc->done_) {
			rc = rpc->err_;
			break;
		}
		if (c->broken) {
			/* Never sent on this connection, or failed before it broke. */
			rc = c->broken;
			break;
		}
		if (c->reading) {
			rpc->waiting_ = 1;
			pthread_cond_wait(&rpc->cond_, &c->lock);
			rpc->waiting_ = 0;
			continue;
		}
		/* The reader, until this request's reply has come. */
		c->reading = 1;
		do {
			pthread_mutex_unlock(&c->lock);
			rc = read_reply(c);
			pthread_mutex_lock(&c->lock);
			if (rc)
				break_locked(c, rc);
		} while (!rpc->done_);
		c->reading = 0;
		hand_over_locked(c);
	}
	pthread_mutex_unlock(&c->lock);
	if (rc) {
		rpc->resp_len = 0;
		rpc->bulk_in_len = 0;
	}
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
	struct stk_conn *conns; /* live, shared (through conn->next) */
	unsigned n;
	struct pool_entry *next;
};

struct stk_pool {
	pthread_mutex_t lock; /* protects entries, their lists and conns' refs/retired */
	struct pool_entry *entries;
	unsigned per_addr;
};

int stk_pool_create(unsigned conns_per_addr, struct stk_pool **out)
{
	struct stk_pool *p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	pthread_mutex_init(&p->lock, NULL);
	p->per_addr = conns_per_addr ? conns_per_addr : STK_POOL_DEFAULT_CONNS;
	*out = p;
	return 0;
}

/* Takes c out of e's list; closes it at once if nobody uses it. Under p->lock. */
static void retire_locked(struct pool_entry *e, struct stk_conn *c)
{
	for (struct stk_conn **pp = &e->conns; *pp; pp = &(*pp)->next)
		if (*pp == c) {
			*pp = c->next;
			e->n--;
			break;
		}
	c->next = NULL;
	c->retired = 1;
	if (c->refs == 0)
		stk_conn_close(c);
}

void stk_pool_flush(struct stk_pool *p)
{
	pthread_mutex_lock(&p->lock);
	for (struct pool_entry *e = p->entries; e; e = e->next)
		while (e->conns)
			retire_locked(e, e->conns);
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
	struct stk_conn *best = NULL, *c, *next;
	unsigned best_n = 0;
	int rc;

	pthread_mutex_lock(&p->lock);
	e = pool_entry(p, addr);
	if (!e) {
		pthread_mutex_unlock(&p->lock);
		return -ENOMEM;
	}
	for (c = e->conns; c; c = next) {
		unsigned n;

		next = c->next;
		if (stk_conn_broken(c)) {
			retire_locked(e, c);
			continue;
		}
		n = stk_conn_pending(c);
		if (!best || n < best_n) {
			best = c;
			best_n = n;
		}
	}
	if (best && (best_n == 0 || e->n >= p->per_addr)) {
		best->refs++;
		pthread_mutex_unlock(&p->lock);
		*out = best;
		return 0;
	}
	pthread_mutex_unlock(&p->lock);
	rc = stk_conn_connect(addr, 5000, &c);
	if (rc)
		return rc;
	pthread_mutex_lock(&p->lock);
	e = pool_entry(p, addr);
	c->refs = 1;
	if (e && e->n < p->per_addr) {
		c->next = e->conns;
		e->conns = c;
		e->n++;
	} else {
		c->retired = 1; /* others opened theirs meanwhile: this one serves once */
	}
	pthread_mutex_unlock(&p->lock);
	*out = c;
	return 0;
}

void stk_pool_put(struct stk_pool *p, struct stk_conn *c)
{
	if (!c)
		return;
	pthread_mutex_lock(&p->lock);
	c->refs--;
	if (!c->retired && stk_conn_broken(c)) {
		struct pool_entry *e = pool_entry(p, c->addr);

		if (e)
			retire_locked(e, c);
		c = NULL; /* closed there, or by its last user */
	}
	if (c && c->retired && c->refs == 0)
		stk_conn_close(c);
	pthread_mutex_unlock(&p->lock);
}

void stk_pool_after_fork(struct stk_pool *p)
{
	/*
	 * Another thread of the parent may have held a lock at fork(): the child's copy
	 * would stay locked forever, so the pool's is made anew and the connections'
	 * are never touched. The sockets are shared with the parent, which keeps using
	 * them: the child closes its descriptors (leaving the parent's connections
	 * intact) and forgets the connections; their memory is the parent's image and
	 * is not freed (a few hundred bytes each).
	 */
	pthread_mutex_init(&p->lock, NULL);
	for (struct pool_entry *e = p->entries; e; e = e->next) {
		for (struct stk_conn *c = e->conns; c; c = c->next)
			close(c->fd);
		e->conns = NULL;
		e->n = 0;
	}
}
