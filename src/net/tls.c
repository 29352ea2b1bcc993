/*
 * TLS 1.3 with a PSK from the cluster key, over non-blocking sockets (tls.h).
 *
 * The SSL objects read and write the socket through a BIO of our own (a few lines
 * over recv and send): OpenSSL's socket BIO writes with write(), which raises
 * SIGPIPE when the peer has gone, and a client library must not kill the program
 * that uses it. Everything else is OpenSSL's: the handshake, the records, HKDF.
 *
 * Writes gather small pieces (a frame's header, a short payload) into one buffer
 * of at most one record, so a small request is one record and one send, not
 * three; a large piece (bulk data) goes to SSL_write as it is. SSL_write that
 * could not finish must be called again with the same bytes: the callers always
 * retry from where the last call stopped (its data is theirs until it has left),
 * and SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER lets that retry gather into another
 * buffer.
 */
#include "tls.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/ssl.h>

#include "../common/log.h"
#include "../common/util.h"

#define TLS_GATHER 16384 /* one record's worth of plaintext */

static const unsigned char aes128gcmsha256[2] = {0x13, 0x01};

struct stk_tls {
	SSL *ssl;
	int fd;
	int server;
	pthread_mutex_t lock; /* around every SSL call: reader and writer are two threads */
	/* Set by the BIO and the callbacks, during an SSL call (under lock): */
	int eof;     /* recv returned 0 */
	int sys_err; /* errno of a failed recv or send, but EAGAIN */
	int id_miss; /* server: the client offered no identity of ours */
	int revoked; /* server: it offered a removed client key's identity */
	char revoked_who[STK_CLIENT_NAME_MAX + 48]; /* "client NAME, generation N" */
	int bad_policy; /* server: a client identity that is no well-formed policy */
	int is_client;	/* client side: it offers a client key */
	int done;	/* the handshake completed on our PSK */
	enum stk_tls_fail fail;
	/* Server: the client key's policy the peer offered (proved once complete). */
	struct stk_auth_client *client;
	uint8_t psk[STK_TLS_PSK_LEN];
	char id[STK_TLS_CLIENT_ID_MAX]; /* the cluster key's, or a client key's */
	char why[200 + STK_CLIENT_NAME_MAX];
};

struct stk_tls_server {
	SSL_CTX *ctx;
	uint8_t psk[STK_TLS_PSK_LEN];
	char id[STK_TLS_ID_LEN];
	/* the cluster key itself: client keys' PSKs are derived from it */
	uint8_t key[STK_AUTH_KEY_MAX];
	size_t key_len;
	int (*revoked)(const char *name, uint64_t gen);
};

/* ---- the key ---- */

static int hkdf(const uint8_t *key, size_t len, const char *info, uint8_t *out, size_t outlen)
{
	EVP_PKEY_CTX *pc = EVP_PKEY_CTX_new_id(EVP_PKEY_HKDF, NULL);
	int ok;

	ok = pc && EVP_PKEY_derive_init(pc) > 0 && EVP_PKEY_CTX_set_hkdf_md(pc, EVP_sha256()) > 0 &&
	     EVP_PKEY_CTX_set1_hkdf_salt(pc, (const unsigned char *)"stoker", 6) > 0 &&
	     EVP_PKEY_CTX_set1_hkdf_key(pc, key, (int)len) > 0 &&
	     EVP_PKEY_CTX_add1_hkdf_info(pc, (const unsigned char *)info, (int)strlen(info)) > 0 &&
	     EVP_PKEY_derive(pc, out, &outlen) > 0;
	EVP_PKEY_CTX_free(pc);
	return ok ? 0 : -EIO;
}

int stk_tls_derive(const uint8_t *key, size_t len, uint8_t psk[STK_TLS_PSK_LEN],
		   char id[STK_TLS_ID_LEN])
{
	static const char hex[] = "0123456789abcdef";
	uint8_t raw[8];
	int rc;

	rc = hkdf(key, len, "stoker-tls-1 psk", psk, STK_TLS_PSK_LEN);
	if (rc == 0)
		rc = hkdf(key, len, "stoker-tls-1 identity", raw, sizeof(raw));
	if (rc)
		return rc;
	memcpy(id, "stoker-tls-1 ", 13);
	for (size_t i = 0; i < sizeof(raw); i++) {
		id[13 + 2 * i] = hex[raw[i] >> 4];
		id[13 + 2 * i + 1] = hex[raw[i] & 0xf];
	}
	id[13 + 2 * sizeof(raw)] = 0;
	return 0;
}

#define CLIENT_ID_PREFIX "stoker-tls-c1 "

static int client_id_render(const struct stk_auth_client *c, char *id, size_t cap)
{
	int n =
	    snprintf(id, cap, CLIENT_ID_PREFIX "%s %llu %u %u %u %s", c->name,
		     (unsigned long long)c->gen, c->flags, c->anon_uid, c->anon_gid, c->subtree);

	return n < 0 || (size_t)n >= cap ? -EINVAL : n;
}

int stk_tls_client_derive(const struct stk_auth_client *c, const uint8_t ckey[STK_AUTH_MAC],
			  uint8_t psk[STK_TLS_PSK_LEN], char id[STK_TLS_CLIENT_ID_MAX])
{
	char err[256];

	if (stk_auth_client_valid(c, err, sizeof(err)) ||
	    client_id_render(c, id, STK_TLS_CLIENT_ID_MAX) < 0)
		return -EINVAL;
	return hkdf(ckey, STK_AUTH_MAC, "stoker-tls-1 client psk", psk, STK_TLS_PSK_LEN);
}

/* A decimal number of at most max, up to the next space; advances *p past it. */
static int id_number(const char **p, const char *end, uint64_t max, uint64_t *out)
{
	uint64_t v = 0;
	const char *q = *p;

	if (q == end || *q < '0' || *q > '9')
		return -EINVAL;
	for (; q < end && *q >= '0' && *q <= '9'; q++) {
		if (v > (max - (uint64_t)(*q - '0')) / 10)
			return -EINVAL;
		v = v * 10 + (uint64_t)(*q - '0');
	}
	if (q == end || *q != ' ')
		return -EINVAL;
	*p = q + 1;
	*out = v;
	return 0;
}

int stk_tls_client_parse(const char *id, size_t len, struct stk_auth_client *c)
{
	const char *p = id, *end = id + len, *sp;
	char again[STK_TLS_CLIENT_ID_MAX], err[256];
	uint64_t v[4];
	int n;

	memset(c, 0, sizeof(*c));
	if (len >= STK_TLS_CLIENT_ID_MAX || memchr(id, 0, len) || len < strlen(CLIENT_ID_PREFIX) ||
	    memcmp(id, CLIENT_ID_PREFIX, strlen(CLIENT_ID_PREFIX)))
		return -EINVAL;
	p += strlen(CLIENT_ID_PREFIX);
	sp = memchr(p, ' ', (size_t)(end - p));
	if (!sp || sp == p || (size_t)(sp - p) > STK_CLIENT_NAME_MAX)
		return -EINVAL;
	memcpy(c->name, p, (size_t)(sp - p));
	p = sp + 1;
	if (id_number(&p, end, UINT64_MAX, &v[0]) || id_number(&p, end, UINT32_MAX, &v[1]) ||
	    id_number(&p, end, UINT32_MAX, &v[2]) || id_number(&p, end, UINT32_MAX, &v[3]))
		return -EINVAL;
	if ((size_t)(end - p) > STK_CLIENT_SUBTREE_MAX)
		return -EINVAL;
	memcpy(c->subtree, p, (size_t)(end - p));
	c->gen = v[0];
	c->flags = (uint32_t)v[1];
	c->anon_uid = (uint32_t)v[2];
	c->anon_gid = (uint32_t)v[3];
	if (stk_auth_client_valid(c, err, sizeof(err)))
		return -EINVAL;
	/* one identity per policy: "007" or "+7" would be another name for 7 */
	n = client_id_render(c, again, sizeof(again));
	if (n < 0 || (size_t)n != len || memcmp(again, id, len))
		return -EINVAL;
	return 0;
}

static SSL_SESSION *psk_session(SSL *ssl, const uint8_t *psk)
{
	const SSL_CIPHER *cipher = SSL_CIPHER_find(ssl, aes128gcmsha256);
	SSL_SESSION *sess = SSL_SESSION_new();

	if (!sess || !cipher || !SSL_SESSION_set1_master_key(sess, psk, STK_TLS_PSK_LEN) ||
	    !SSL_SESSION_set_cipher(sess, cipher) ||
	    !SSL_SESSION_set_protocol_version(sess, TLS1_3_VERSION)) {
		SSL_SESSION_free(sess);
		return NULL;
	}
	return sess;
}

/* Client: offers the one PSK of this connection's key. */
static int use_session_cb(SSL *ssl, const EVP_MD *md, const unsigned char **id, size_t *idlen,
			  SSL_SESSION **sess)
{
	struct stk_tls *t = SSL_get_app_data(ssl);
	const SSL_CIPHER *cipher = SSL_CIPHER_find(ssl, aes128gcmsha256);

	*sess = NULL;
	*id = NULL;
	*idlen = 0;
	if (!cipher || (md && SSL_CIPHER_get_handshake_digest(cipher) != md))
		return 1; /* not usable with this hash: none offered */
	*sess = psk_session(ssl, t->psk);
	if (!*sess)
		return 0;
	*id = (const unsigned char *)t->id;
	*idlen = strlen(t->id);
	return 1;
}

/*
 * Server, a client key's identity: the PSK derived from the policy it names (the
 * handshake then proves the client holds the key for exactly that policy), unless
 * the policy is malformed or removed. 1, or 0 when OpenSSL failed.
 */
static int find_client_session(SSL *ssl, struct stk_tls *t, struct stk_tls_server *srv,
			       const unsigned char *identity, size_t identity_len,
			       SSL_SESSION **sess)
{
	struct stk_auth_client *c = calloc(1, sizeof(*c));
	uint8_t ckey[STK_AUTH_MAC], psk[STK_TLS_PSK_LEN];
	char id[STK_TLS_CLIENT_ID_MAX];
	int ok = 0;

	if (!c)
		return 0;
	if (stk_tls_client_parse((const char *)identity, identity_len, c)) {
		t->bad_policy = 1;
		free(c);
		return 1;
	}
	if (srv->revoked && srv->revoked(c->name, c->gen)) {
		t->revoked = 1;
		snprintf(t->revoked_who, sizeof(t->revoked_who), "client %s, generation %llu",
			 c->name, (unsigned long long)c->gen);
		free(c);
		return 1;
	}
	if (stk_auth_client_key(srv->key, srv->key_len, c, ckey) == 0 &&
	    stk_tls_client_derive(c, ckey, psk, id) == 0) {
		*sess = psk_session(ssl, psk);
		ok = *sess != NULL;
	}
	OPENSSL_cleanse(ckey, sizeof(ckey));
	OPENSSL_cleanse(psk, sizeof(psk));
	if (!ok) {
		free(c);
		return 0;
	}
	free(t->client); /* a second ClientHello (after a retry request) names it again */
	t->client = c;
	return 1;
}

/*
 * Server: the PSK of its key, or of the client key the identity names; else none
 * (and no handshake).
 */
static int find_session_cb(SSL *ssl, const unsigned char *identity, size_t identity_len,
			   SSL_SESSION **sess)
{
	struct stk_tls *t = SSL_get_app_data(ssl);
	struct stk_tls_server *srv = SSL_CTX_get_app_data(SSL_get_SSL_CTX(ssl));

	*sess = NULL;
	if (identity_len >= strlen(CLIENT_ID_PREFIX) &&
	    memcmp(identity, CLIENT_ID_PREFIX, strlen(CLIENT_ID_PREFIX)) == 0)
		return find_client_session(ssl, t, srv, identity, identity_len, sess);
	if (identity_len != strlen(srv->id) || CRYPTO_memcmp(identity, srv->id, identity_len)) {
		t->id_miss = 1;
		return 1;
	}
	*sess = psk_session(ssl, srv->psk);
	return *sess ? 1 : 0;
}

/* ---- the BIO: recv and send, never SIGPIPE ---- */

static BIO_METHOD *bio_meth;
static SSL_CTX *client_ctx;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static int bio_write(BIO *b, const char *buf, int len)
{
	struct stk_tls *t = BIO_get_data(b);
	ssize_t n = send(t->fd, buf, (size_t)len, MSG_NOSIGNAL | MSG_DONTWAIT);

	BIO_clear_retry_flags(b);
	if (n < 0) {
		if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
			BIO_set_retry_write(b);
		else
			t->sys_err = errno;
		return -1;
	}
	return (int)n;
}

static int bio_read(BIO *b, char *buf, int len)
{
	struct stk_tls *t = BIO_get_data(b);
	ssize_t n = recv(t->fd, buf, (size_t)len, MSG_DONTWAIT);

	BIO_clear_retry_flags(b);
	if (n < 0) {
		if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
			BIO_set_retry_read(b);
		else
			t->sys_err = errno;
		return -1;
	}
	if (n == 0)
		t->eof = 1;
	return (int)n;
}

static long bio_ctrl(BIO *b, int cmd, long num, void *ptr)
{
	struct stk_tls *t = BIO_get_data(b);

	(void)num;
	(void)ptr;
	switch (cmd) {
	case BIO_CTRL_FLUSH:
		return 1;
	case BIO_CTRL_EOF:
		return t && t->eof;
	default:
		return 0;
	}
}

static int bio_create(BIO *b)
{
	BIO_set_init(b, 1);
	return 1;
}

static SSL_CTX *ctx_new(int server)
{
	SSL_CTX *ctx = SSL_CTX_new(server ? TLS_server_method() : TLS_client_method());

	if (!ctx)
		return NULL;
	if (!SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION) ||
	    !SSL_CTX_set_ciphersuites(ctx, "TLS_AES_128_GCM_SHA256")) {
		SSL_CTX_free(ctx);
		return NULL;
	}
	/* no tickets: nothing arrives after the handshake that a write would wait for */
	SSL_CTX_set_options(ctx, SSL_OP_IGNORE_UNEXPECTED_EOF | SSL_OP_NO_TICKET);
	SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
	SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
	/*
	 * Read what the socket holds in one recv, not a record's header and then its
	 * body: a small request is one syscall fewer. The bytes read ahead are what
	 * stk_tls_pending reports, for a loop that stopped reading at its window.
	 */
	SSL_CTX_set_read_ahead(ctx, 1);
	if (server) {
		SSL_CTX_set_num_tickets(ctx, 0);
		SSL_CTX_set_psk_find_session_callback(ctx, find_session_cb);
	} else {
		/* a server must prove the key: a certificate, of anyone, proves nothing */
		SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
		SSL_CTX_set_psk_use_session_callback(ctx, use_session_cb);
	}
	return ctx;
}

static void tls_init(void)
{
	OPENSSL_init_ssl(OPENSSL_INIT_NO_ATEXIT, NULL);
	bio_meth = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "stoker socket");
	if (bio_meth) {
		BIO_meth_set_write(bio_meth, bio_write);
		BIO_meth_set_read(bio_meth, bio_read);
		BIO_meth_set_ctrl(bio_meth, bio_ctrl);
		BIO_meth_set_create(bio_meth, bio_create);
	}
	client_ctx = ctx_new(0);
}

/* ---- sessions ---- */

int stk_tls_server_create(const uint8_t *key, size_t len, struct stk_tls_server **out)
{
	struct stk_tls_server *srv;

	pthread_once(&once, tls_init);
	if (!bio_meth)
		return -EIO;
	srv = calloc(1, sizeof(*srv));
	if (!srv)
		return -ENOMEM;
	if (len > sizeof(srv->key) || stk_tls_derive(key, len, srv->psk, srv->id) ||
	    !(srv->ctx = ctx_new(1))) {
		stk_error("TLS: OpenSSL could not set up a server context");
		OPENSSL_cleanse(srv->psk, sizeof(srv->psk));
		free(srv);
		return -EIO;
	}
	memcpy(srv->key, key, len);
	srv->key_len = len;
	SSL_CTX_set_app_data(srv->ctx, srv);
	*out = srv;
	return 0;
}

void stk_tls_server_set_revoked(struct stk_tls_server *srv,
				int (*revoked)(const char *name, uint64_t gen))
{
	srv->revoked = revoked;
}

void stk_tls_server_destroy(struct stk_tls_server *srv)
{
	if (!srv)
		return;
	SSL_CTX_free(srv->ctx);
	OPENSSL_cleanse(srv->psk, sizeof(srv->psk));
	OPENSSL_cleanse(srv->key, sizeof(srv->key));
	free(srv);
}

static int tls_new(SSL_CTX *ctx, int fd, int server, struct stk_tls **out)
{
	struct stk_tls *t;
	BIO *bio;

	if (!ctx || !bio_meth)
		return -EIO;
	t = calloc(1, sizeof(*t));
	if (!t)
		return -ENOMEM;
	t->fd = fd;
	t->server = server;
	pthread_mutex_init(&t->lock, NULL);
	t->ssl = SSL_new(ctx);
	bio = BIO_new(bio_meth);
	if (!t->ssl || !bio) {
		BIO_free(bio);
		stk_tls_free(t);
		return -ENOMEM;
	}
	BIO_set_data(bio, t);
	SSL_set_bio(t->ssl, bio, bio);
	SSL_set_app_data(t->ssl, t);
	if (server)
		SSL_set_accept_state(t->ssl);
	else
		SSL_set_connect_state(t->ssl);
	*out = t;
	return 0;
}

int stk_tls_accept_new(struct stk_tls_server *srv, int fd, struct stk_tls **out)
{
	return tls_new(srv->ctx, fd, 1, out);
}

int stk_tls_connect_new(int fd, const uint8_t *key, size_t len, struct stk_tls **out)
{
	struct stk_tls *t;
	int rc;

	pthread_once(&once, tls_init);
	rc = tls_new(client_ctx, fd, 0, &t);
	if (rc)
		return rc;
	if (stk_tls_derive(key, len, t->psk, t->id)) {
		stk_tls_free(t);
		return -EIO;
	}
	*out = t;
	return 0;
}

int stk_tls_connect_client_new(int fd, const struct stk_auth_client *c,
			       const uint8_t ckey[STK_AUTH_MAC], struct stk_tls **out)
{
	struct stk_tls *t;
	int rc;

	pthread_once(&once, tls_init);
	rc = tls_new(client_ctx, fd, 0, &t);
	if (rc)
		return rc;
	rc = stk_tls_client_derive(c, ckey, t->psk, t->id);
	if (rc) {
		stk_tls_free(t);
		return rc;
	}
	t->is_client = 1;
	*out = t;
	return 0;
}

struct stk_auth_client *stk_tls_client_take(struct stk_tls *t)
{
	struct stk_auth_client *c = t->done ? t->client : NULL;

	if (c)
		t->client = NULL;
	return c;
}

void stk_tls_free(struct stk_tls *t)
{
	if (!t)
		return;
	free(t->client);
	SSL_free(t->ssl);
	pthread_mutex_destroy(&t->lock);
	OPENSSL_cleanse(t->psk, sizeof(t->psk));
	free(t);
}

/*
 * What an SSL call's result means, by tls.h's convention; under t->lock. Sets
 * *want_write for -EAGAIN, and t->why for a failure.
 */
static ssize_t tls_result(struct stk_tls *t, int ret, int *want_write)
{
	int err = SSL_get_error(t->ssl, ret);
	unsigned long e;

	*want_write = 0;
	switch (err) {
	case SSL_ERROR_WANT_READ:
		return -EAGAIN;
	case SSL_ERROR_WANT_WRITE:
		*want_write = 1;
		return -EAGAIN;
	case SSL_ERROR_ZERO_RETURN:
		return 0;
	case SSL_ERROR_SYSCALL:
		ERR_clear_error();
		if (t->sys_err) {
			snprintf(t->why, sizeof(t->why), "%s", strerror(t->sys_err));
			return -t->sys_err;
		}
		snprintf(t->why, sizeof(t->why), "the peer closed the connection");
		return 0;
	default:
		e = ERR_peek_last_error();
		if (e)
			ERR_error_string_n(e, t->why, sizeof(t->why));
		else
			snprintf(t->why, sizeof(t->why), "TLS failed (SSL error %d)", err);
		ERR_clear_error();
		return -EPROTO;
	}
}

int stk_tls_handshake(struct stk_tls *t, int *want_write)
{
	ssize_t r;
	int ret;

	pthread_mutex_lock(&t->lock);
	ERR_clear_error();
	ret = SSL_do_handshake(t->ssl);
	if (ret == 1) {
		/* only a handshake on our PSK proves the key (never a certificate) */
		r = SSL_session_reused(t->ssl) ? 0 : -EKEYREJECTED;
		t->done = r == 0;
		if (r)
			snprintf(t->why, sizeof(t->why), "the peer did not use the cluster key");
	} else {
		r = tls_result(t, ret, want_write);
		if (r == 0) {
			r = -ECONNRESET;
			snprintf(t->why, sizeof(t->why),
				 "the peer closed the connection during the TLS handshake%s",
				 t->server ? "" : " (does it run without TLS?)");
		} else if (r != -EAGAIN && t->server && t->revoked) {
			/* server.c says "a removed client key" itself */
			r = -EKEYREJECTED;
			stk_strlcpy(t->why, t->revoked_who, sizeof(t->why));
		} else if (r != -EAGAIN && t->server && t->bad_policy) {
			r = -EKEYREJECTED;
			snprintf(t->why, sizeof(t->why),
				 "the client offered a malformed client key identity");
		} else if (r != -EAGAIN && t->server && t->client) {
			r = -EKEYREJECTED;
			snprintf(t->why, sizeof(t->why),
				 "client %s (generation %llu) did not prove its client key (an "
				 "edited key file, or another cluster's)",
				 t->client->name, (unsigned long long)t->client->gen);
		} else if (r != -EAGAIN && t->server && t->id_miss) {
			r = -EKEYREJECTED;
			snprintf(
			    t->why, sizeof(t->why),
			    "the client offered no key of this cluster (another cluster key?)");
		}
		/* an alert from the daemon during the handshake: it did not accept our PSK */
		if (r == -EPROTO && !t->server && strstr(t->why, "alert")) {
			r = -EKEYREJECTED;
			snprintf(t->why + strlen(t->why), sizeof(t->why) - strlen(t->why), "%s",
				 t->is_client ? " (the daemon refused this client key: removed, "
						"edited, or another cluster's)"
					      : " (the daemon refused our key: does it hold "
						"another cluster key?)");
		}
	}
	if (r && r != -EAGAIN)
		t->fail = t->server && t->revoked ? STK_TLS_FAIL_REVOKED
			  : r == -EKEYREJECTED	  ? STK_TLS_FAIL_WRONG_KEY
						  : STK_TLS_FAIL_PROTOCOL;
	pthread_mutex_unlock(&t->lock);
	return (int)r;
}

const char *stk_tls_why(const struct stk_tls *t)
{
	return t->why;
}

enum stk_tls_fail stk_tls_fail_reason(const struct stk_tls *t)
{
	return t->fail;
}

static ssize_t tls_readv(struct stk_tls *t, const struct iovec *iov, int n, int *want_write)
{
	ssize_t total = 0, r = 0;

	*want_write = 0;
	pthread_mutex_lock(&t->lock);
	for (int i = 0; i < n; i++) {
		size_t off = 0;

		while (off < iov[i].iov_len) {
			size_t got = 0;
			int ret;

			ERR_clear_error();
			ret = SSL_read_ex(t->ssl, (char *)iov[i].iov_base + off,
					  iov[i].iov_len - off, &got);
			if (ret <= 0) {
				r = tls_result(t, ret, want_write);
				goto out;
			}
			off += got;
			total += (ssize_t)got;
		}
	}
out:
	pthread_mutex_unlock(&t->lock);
	return total ? total : r;
}

ssize_t stk_tls_readv(struct stk_tls *t, const struct iovec *iov, int n)
{
	int ww;

	return tls_readv(t, iov, n, &ww);
}

ssize_t stk_tls_recv(struct stk_tls *t, void *buf, size_t len)
{
	struct iovec iov = {.iov_base = buf, .iov_len = len};
	int ww;

	return tls_readv(t, &iov, 1, &ww);
}

static ssize_t tls_sendv(struct stk_tls *t, const struct iovec *iov, int n, int *want_write)
{
	uint8_t stage[TLS_GATHER];
	ssize_t total = 0, r = 0;
	size_t off = 0;
	int i = 0;

	*want_write = 0;
	while (i < n && off == iov[i].iov_len) {
		i++;
		off = 0;
	}
	while (i < n) {
		const void *p;
		size_t len, w = 0;
		int ret;

		if (iov[i].iov_len - off >= TLS_GATHER) {
			p = (const char *)iov[i].iov_base + off;
			len = iov[i].iov_len - off;
		} else {
			/* small pieces: into one record, split where the buffer ends */
			size_t o = off;

			len = 0;
			for (int j = i; j < n && len < TLS_GATHER; j++, o = 0) {
				size_t take = STK_MIN(iov[j].iov_len - o, TLS_GATHER - len);

				memcpy(stage + len, (const char *)iov[j].iov_base + o, take);
				len += take;
			}
			p = stage;
		}
		pthread_mutex_lock(&t->lock);
		ERR_clear_error();
		ret = SSL_write_ex(t->ssl, p, len, &w);
		if (ret <= 0)
			r = tls_result(t, ret, want_write);
		pthread_mutex_unlock(&t->lock);
		if (ret <= 0)
			break;
		total += (ssize_t)w;
		while (w && i < n) {
			size_t step = STK_MIN(w, iov[i].iov_len - off);

			off += step;
			w -= step;
			if (off == iov[i].iov_len) {
				i++;
				off = 0;
			}
		}
	}
	if (total)
		return total;
	return r == 0 ? -ECONNRESET : r; /* a write that meets the end is a reset */
}

ssize_t stk_tls_sendv(struct stk_tls *t, const struct iovec *iov, int n)
{
	int ww;

	return tls_sendv(t, iov, n, &ww);
}

int stk_tls_pending(struct stk_tls *t)
{
	int p;

	pthread_mutex_lock(&t->lock);
	p = SSL_has_pending(t->ssl);
	pthread_mutex_unlock(&t->lock);
	return p;
}

/* Waits for the socket; 0, or -ETIMEDOUT. */
static int tls_wait(struct stk_tls *t, int want_write, int timeout_ms)
{
	struct pollfd pfd = {.fd = t->fd, .events = want_write ? POLLOUT : POLLIN};
	int rc;

	do
		rc = poll(&pfd, 1, timeout_ms > 0 ? timeout_ms : -1);
	while (rc < 0 && errno == EINTR);
	return rc == 0 ? -ETIMEDOUT : 0;
}

int stk_tls_send_all(struct stk_tls *t, struct iovec *iov, int n, int timeout_ms)
{
	while (n > 0) {
		int ww;
		ssize_t r = tls_sendv(t, iov, n, &ww);

		if (r > 0) {
			stk_iov_advance(&iov, &n, (size_t)r);
			continue;
		}
		if (r != -EAGAIN)
			return (int)r;
		r = tls_wait(t, ww, timeout_ms);
		if (r)
			return (int)r;
	}
	return 0;
}

int stk_tls_recv_all(struct stk_tls *t, void *buf, size_t len, int timeout_ms)
{
	char *p = buf;

	while (len) {
		struct iovec iov = {.iov_base = p, .iov_len = len};
		int ww;
		ssize_t r = tls_readv(t, &iov, 1, &ww);

		if (r > 0) {
			p += r;
			len -= (size_t)r;
			continue;
		}
		if (r == 0)
			return -ECONNRESET;
		if (r != -EAGAIN)
			return (int)r;
		r = tls_wait(t, ww, timeout_ms);
		if (r)
			return (int)r;
	}
	return 0;
}

int stk_tls_handshake_wait(struct stk_tls *t, int timeout_ms)
{
	uint64_t deadline = stk_now_ns() + (uint64_t)timeout_ms * 1000000ull;

	for (;;) {
		int ww, rc = stk_tls_handshake(t, &ww);
		uint64_t now = stk_now_ns();

		if (rc != -EAGAIN)
			return rc;
		if (now >= deadline)
			return -ETIMEDOUT;
		rc = tls_wait(t, ww, (int)((deadline - now) / 1000000ull) + 1);
		if (rc)
			return rc;
	}
}

/* ---- plain or TLS ---- */

ssize_t stk_io_recv(int fd, struct stk_tls *t, void *buf, size_t len)
{
	ssize_t n;

	if (t)
		return stk_tls_recv(t, buf, len);
	n = recv(fd, buf, len, 0);
	return n < 0 ? -errno : n;
}

ssize_t stk_io_readv(int fd, struct stk_tls *t, const struct iovec *iov, int n)
{
	ssize_t r;

	if (t)
		return stk_tls_readv(t, iov, n);
	r = readv(fd, iov, n);
	return r < 0 ? -errno : r;
}

ssize_t stk_io_sendv(int fd, struct stk_tls *t, const struct iovec *iov, int n)
{
	struct msghdr mh = {.msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)n};
	ssize_t r;

	if (t)
		return stk_tls_sendv(t, iov, n);
	r = sendmsg(fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
	return r < 0 ? -errno : r;
}
