/*
 * The S3 gateway's HTTP server, on libmicrohttpd.
 *
 * libmicrohttpd runs a pool of threads, each with its own epoll loop over its
 * connections; a request's handler runs on its connection's thread and calls
 * libstoker, which blocks that thread (and only its other connections) for the
 * length of a metadata round trip or one io_size read or write. Slow or stalled
 * clients cost nothing while they stall: sockets are non-blocking, and the
 * connection timeout closes them. The connection limit and per-connection memory
 * limit bound what thousands of clients can take; oversized headers are refused
 * by libmicrohttpd itself (431) before a handler runs.
 *
 * A request's life:
 *   uri_log    libmicrohttpd hands over the raw request target: the request
 *              struct is made here, so SigV4 sees the path and query exactly as
 *              sent (libmicrohttpd would decode them otherwise).
 *   first call headers are in: parse, authenticate (SigV4 header or presigned),
 *              route, and either run the operation whole (no body) or prepare it
 *              (stk_s3_op_begin). A response queued now refuses the body, which
 *              libmicrohttpd then discards and closes the connection after: an
 *              unauthenticated or doomed upload never reaches storage.
 *   body calls each piece of body goes through the payload hash (signed
 *              payloads), the aws-chunked decoder (streaming uploads, each chunk
 *              signature checked as it ends), the MD5 of the decoded bytes, and
 *              into memory (XML) or the temporary file (objects, parts). An error
 *              here is remembered and the rest of the body read and dropped,
 *              since libmicrohttpd cannot answer in the middle of a body.
 *   last call  the body is checked whole (SHA-256, Content-MD5, decoded length)
 *              and the operation finished (stk_s3_op_finish): only now is a PUT
 *              renamed into place.
 *   completed  always called, also when the client went away mid-body: a
 *              temporary file still there is removed, so a disconnect leaves no
 *              object and no garbage.
 * A GET streams its file from a content-reader callback, reading io_size bytes at
 * a time into libmicrohttpd's buffer: memory per GET is one buffer, whatever the
 * object's size.
 *
 * With --domain, a Host header "BUCKET.DOMAIN" names the bucket (virtual-hosted
 * style) and the whole path is the key; SigV4 signs path and Host as sent either way.
 * With --metrics, every request is counted when it ends (completed), in the
 * stoker_client_* families with frontend="s3": by operation ("Unknown" when refused
 * before it was routed), errors by S3 error code or by how the request ended
 * (RequestTimeout, ConnectionClosed, BadRequest), body bytes in and out, time from
 * the request line to the last byte sent, and connections from libmicrohttpd's
 * connection notifications.
 */
#include "s3.h"

#include <arpa/inet.h>
#include <errno.h>
#include <isa-l/crc.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>

#include "../common/log.h"
#include "../common/metrics.h"
#include "../common/util.h"

#define STK_S3_EMPTY_SHA256 "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
#define STK_S3_OUT_LIMIT (64u << 20)	/* largest XML response (a full upload listing) */
#define STK_S3_CONN_MEMORY (256u << 10) /* per connection: headers and read buffer */

enum { PAY_NONE, PAY_SIGNED, PAY_UNSIGNED, PAY_STREAM_SIGNED, PAY_STREAM_UNSIGNED };

/* The flexible checksums newer SDKs send, in a header or an aws-chunked trailer. */
enum { CK_NONE, CK_CRC32, CK_CRC32C, CK_SHA1, CK_SHA256, CK_COUNT };
static const char *const g_ck_names[CK_COUNT] = {NULL, "x-amz-checksum-crc32",
						 "x-amz-checksum-crc32c", "x-amz-checksum-sha1",
						 "x-amz-checksum-sha256"};
enum { PH_NEW, PH_BODY, PH_DONE };

/* What a request can end in besides an S3 error, for stoker_client_errors_total. */
enum { END_TIMEOUT = STK_S3_ERR__COUNT, END_CLOSED, END_REFUSED, END__COUNT };
static const char *const g_end_names[] = {"RequestTimeout", "ConnectionClosed", "BadRequest"};

struct stk_s3_server {
	struct MHD_Daemon *d;
	struct stk_s3_gw *gw;
	unsigned port;
	char *cert, *key; /* PEM, kept for the daemon's life */
	/* metrics (all 0 / NULL when off): requests, bytes, latency, connections */
	struct stk_metrics_ops *m;
	stk_metric_t read_bytes[STK_S3_OP__COUNT];	/* streamed GET bodies, as sent */
	stk_metric_t errs[STK_S3_OP__COUNT][END__COUNT]; /* atomic, registered on first use */
};

/* ---- request helpers for s3_ops.c ---- */

const char *stk_s3_req_header(struct stk_s3_req *r, const char *name)
{
	return MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, name);
}

struct each_ctx {
	void (*fn)(void *ctx, const char *name, const char *value);
	void *ctx;
};

static enum MHD_Result each_header(void *cls, enum MHD_ValueKind kind, const char *key,
				   const char *value)
{
	struct each_ctx *e = cls;

	(void)kind;
	if (key && value)
		e->fn(e->ctx, key, value);
	return MHD_YES;
}

void stk_s3_req_each_header(struct stk_s3_req *r,
			    void (*fn)(void *ctx, const char *name, const char *value), void *ctx)
{
	struct each_ctx e = {fn, ctx};

	MHD_get_connection_values(r->conn, MHD_HEADER_KIND, each_header, &e);
}

void stk_s3_resp_header(struct stk_s3_req *r, const char *name, const char *value)
{
	stk_s3_buf_add(&r->hdrs, name, strlen(name) + 1);
	stk_s3_buf_add(&r->hdrs, value, strlen(value) + 1);
}

static const char *canon_header(void *ctx, const char *lname)
{
	return stk_s3_req_header(ctx, lname);
}

/* ---- authentication ---- */

const struct stk_s3_key *stk_s3_key_find(const struct stk_s3_gw *gw, const char *id)
{
	for (unsigned i = 0; i < gw->nkeys; i++)
		if (strcmp(gw->keys[i].line.id, id) == 0)
			return &gw->keys[i];
	return NULL;
}

static int has_body(struct stk_s3_req *r)
{
	const char *cl = stk_s3_req_header(r, "content-length");

	return (cl && strcmp(cl, "0") != 0) || stk_s3_req_header(r, "transfer-encoding");
}

static enum stk_s3_err fail(struct stk_s3_req *r, enum stk_s3_err e, const char *msg)
{
	snprintf(r->err_msg, sizeof(r->err_msg), "%s", msg);
	return e;
}

/*
 * Checks the request's SigV4 signature, in the Authorization header or in a
 * presigned URL, and sets how the body is signed. Keeps the signing key and the
 * signature for streaming chunk signatures.
 */
static enum stk_s3_err authenticate(struct stk_s3_req *r)
{
	const char *authz = stk_s3_req_header(r, "authorization"), *payload;
	const struct stk_s3_key *key;
	struct stk_s3_buf canon;
	int64_t now = time(NULL), t;
	char sig[65];
	int rc;

	if (authz) {
		const char *xd = stk_s3_req_header(r, "x-amz-date");
		rc = stk_s3_auth_parse_header(authz, &r->auth);
		if (rc == -ENOTSUP)
			return fail(
			    r, STK_S3_ERR_INVALID_REQUEST,
			    "Only AWS Signature Version 4 (AWS4-HMAC-SHA256) is supported.");
		if (rc)
			return STK_S3_ERR_AUTH_MALFORMED;
		if (xd) {
			if (stk_s3_amz_date_parse(xd, &t))
				return fail(
				    r, STK_S3_ERR_ACCESS_DENIED,
				    "AWS authentication requires a valid Date or x-amz-date "
				    "header");
			memcpy(r->amz_date, xd, 17);
		} else {
			const char *d = stk_s3_req_header(r, "date");
			struct tm tm;
			time_t tt;
			if (!d || stk_s3_http_date_parse(d, &t))
				return fail(
				    r, STK_S3_ERR_ACCESS_DENIED,
				    "AWS authentication requires a valid Date or x-amz-date "
				    "header");
			tt = (time_t)t;
			gmtime_r(&tt, &tm);
			strftime(r->amz_date, sizeof(r->amz_date), "%Y%m%dT%H%M%SZ", &tm);
		}
		if (t > now + r->gw->skew_s || t < now - r->gw->skew_s)
			return STK_S3_ERR_TIME_SKEWED;
		payload = stk_s3_req_header(r, "x-amz-content-sha256");
		if (!payload) {
			if (has_body(r))
				return STK_S3_ERR_MISSING_SECURITY_HEADER;
			payload = STK_S3_EMPTY_SHA256;
		}
	} else {
		rc = stk_s3_auth_parse_query(&r->t, &r->auth);
		/* anonymous: Stoker has no public buckets */
		if (rc == -ENOENT)
			return STK_S3_ERR_ACCESS_DENIED;
		if (rc == -ENOTSUP)
			return fail(
			    r, STK_S3_ERR_INVALID_REQUEST,
			    "Only AWS Signature Version 4 (AWS4-HMAC-SHA256) is supported.");
		if (rc || stk_s3_amz_date_parse(r->auth.amz_date, &t))
			return fail(
			    r, STK_S3_ERR_AUTH_MALFORMED,
			    "Error parsing the X-Amz-Credential, X-Amz-Date or X-Amz-Expires "
			    "parameter.");
		memcpy(r->amz_date, r->auth.amz_date, 17);
		if (now > t + (int64_t)r->auth.expires)
			return STK_S3_ERR_EXPIRED;
		if (t > now + r->gw->skew_s)
			return fail(r, STK_S3_ERR_ACCESS_DENIED, "Request is not valid yet.");
		payload = stk_s3_param(&r->t, "X-Amz-Content-Sha256");
		if (!payload)
			payload = "UNSIGNED-PAYLOAD";
	}
	if (strncmp(r->amz_date, r->auth.date, 8) != 0)
		return fail(r, STK_S3_ERR_SIGNATURE_MISMATCH,
			    "The credential scope's date does not match the request's date.");
	key = stk_s3_key_find(r->gw, r->auth.access_key);
	if (!key)
		return STK_S3_ERR_INVALID_ACCESS_KEY;

	stk_s3_buf_init(&canon, 6 * STK_S3_URI_MAX);
	rc = stk_s3_canonical_request(&canon, r->method, &r->t, &r->auth, canon_header, r, payload);
	if (rc) {
		stk_s3_buf_free(&canon);
		return rc == -EINVAL ? fail(r, STK_S3_ERR_SIGNATURE_MISMATCH,
					    "A signed header is missing, or host is not signed.")
				     : STK_S3_ERR_SLOW_DOWN;
	}
	stk_s3_signing_key(key->line.secret, &r->auth, r->skey);
	stk_s3_signature(r->skey, r->amz_date, &r->auth, canon.p, canon.len, sig);
	if (!stk_s3_secure_eq(sig, r->auth.signature)) {
		stk_debug("s3 %s: signature mismatch; canonical request:\n%s", r->reqid, canon.p);
		stk_s3_buf_free(&canon);
		return STK_S3_ERR_SIGNATURE_MISMATCH;
	}
	stk_s3_buf_free(&canon);
	r->key = key;
	stk_s3_store_as(key->line.has_ids ? &key->cred : NULL);
	memcpy(r->prev_sig, sig, sizeof(r->prev_sig));

	if (strcmp(payload, "UNSIGNED-PAYLOAD") == 0) {
		r->payload = PAY_UNSIGNED;
	} else if (strcmp(payload, "STREAMING-AWS4-HMAC-SHA256-PAYLOAD") == 0 &&
		   !r->auth.presigned) {
		r->payload = PAY_STREAM_SIGNED;
	} else if (strcmp(payload, "STREAMING-UNSIGNED-PAYLOAD-TRAILER") == 0) {
		r->payload = PAY_STREAM_UNSIGNED;
	} else if (strncmp(payload, "STREAMING-", 10) == 0) {
		return fail(r, STK_S3_ERR_NOT_IMPLEMENTED,
			    "This x-amz-content-sha256 is not supported.");
	} else if (strlen(payload) == 64) {
		for (int i = 0; i < 64; i++)
			if (!((payload[i] >= '0' && payload[i] <= '9') ||
			      (payload[i] >= 'a' && payload[i] <= 'f')))
				return fail(r, STK_S3_ERR_INVALID_ARGUMENT,
					    "x-amz-content-sha256 must be UNSIGNED-PAYLOAD, "
					    "STREAMING-..., or a valid sha256 value.");
		r->payload = PAY_SIGNED;
		memcpy(r->want_sha, payload, 65);
	} else {
		return fail(r, STK_S3_ERR_INVALID_ARGUMENT,
			    "x-amz-content-sha256 must be UNSIGNED-PAYLOAD, STREAMING-..., or a "
			    "valid sha256 value.");
	}
	return STK_S3_OK;
}

/* ---- bodies ---- */

static enum stk_s3_err sink(struct stk_s3_req *r, const char *p, size_t n)
{
	enum stk_s3_body body = stk_s3_op_body(r->op);
	int rc;

	r->body_len += n;
	EVP_DigestUpdate(r->md5, p, n);
	if (r->ck == CK_CRC32)
		r->ck_crc = crc32_gzip_refl(r->ck_crc, (const unsigned char *)p, n);
	else if (r->ck == CK_CRC32C)
		r->ck_crc = stk_crc32c(r->ck_crc, p, n);
	else if (r->ck_md)
		EVP_DigestUpdate(r->ck_md, p, n);
	if (body == STK_S3_BODY_XML) {
		stk_s3_buf_add(&r->xml, p, n);
		if (r->xml.err)
			return r->xml.err == -E2BIG ? STK_S3_ERR_MAX_MESSAGE_LENGTH
						    : STK_S3_ERR_SLOW_DOWN;
		return STK_S3_OK;
	}
	if (r->body_len > STK_S3_MAX_OBJECT_SIZE)
		return STK_S3_ERR_ENTITY_TOO_LARGE;
	rc = stk_s3_tmp_write(&r->tmp, p, n);
	if (rc) {
		stk_warn("s3 %s: write: %s", r->reqid, stk_strerror(rc));
		return stk_s3_err_from_errno(rc == -ENOENT ? -EIO : rc);
	}
	return STK_S3_OK;
}

static int chunk_start(void *ctx, uint64_t size, const char *sig)
{
	struct stk_s3_req *r = ctx;

	(void)size;
	snprintf(r->chunk_sig, sizeof(r->chunk_sig), "%s", sig);
	EVP_DigestInit_ex(r->chunk_sha, EVP_sha256(), NULL);
	return 0;
}

static int chunk_data(void *ctx, const char *p, size_t n)
{
	struct stk_s3_req *r = ctx;
	enum stk_s3_err e;

	if (r->payload == PAY_STREAM_SIGNED)
		EVP_DigestUpdate(r->chunk_sha, p, n);
	e = sink(r, p, n);
	if (e) {
		r->body_err = e;
		return -ECANCELED;
	}
	return 0;
}

static int chunk_end(void *ctx)
{
	struct stk_s3_req *r = ctx;
	uint8_t md[32];
	unsigned mdlen = 0;
	char hex[65], want[65];

	if (r->payload != PAY_STREAM_SIGNED)
		return 0;
	EVP_DigestFinal_ex(r->chunk_sha, md, &mdlen);
	stk_s3_hex(md, 32, hex);
	stk_s3_chunk_signature(r->skey, r->amz_date, &r->auth, r->prev_sig, hex, want);
	if (!stk_s3_secure_eq(want, r->chunk_sig)) {
		r->body_err = STK_S3_ERR_SIGNATURE_MISMATCH;
		snprintf(r->err_msg, sizeof(r->err_msg), "A chunk signature does not match.");
		return -EACCES;
	}
	memcpy(r->prev_sig, want, sizeof(r->prev_sig));
	return 0;
}

static int chunk_trailer(void *ctx, const char *line)
{
	struct stk_s3_req *r = ctx;
	const char *colon = strchr(line, ':'), *v;
	size_t nl;

	if (!r->ck || !colon)
		return 0;
	nl = (size_t)(colon - line);
	if (nl != strlen(g_ck_names[r->ck]) || strncasecmp(line, g_ck_names[r->ck], nl) != 0)
		return 0;
	v = colon + 1;
	while (*v == ' ')
		v++;
	snprintf(r->ck_want, sizeof(r->ck_want), "%s", v);
	return 0;
}

static const struct stk_s3_chunked_ops g_chunk_ops = {
    .start = chunk_start,
    .data = chunk_data,
    .end = chunk_end,
    .trailer = chunk_trailer,
};

static enum stk_s3_err feed(struct stk_s3_req *r, const char *p, size_t n)
{
	int rc;

	r->raw_len += n;
	if (r->payload == PAY_SIGNED)
		EVP_DigestUpdate(r->sha, p, n);
	if (r->payload != PAY_STREAM_SIGNED && r->payload != PAY_STREAM_UNSIGNED)
		return sink(r, p, n);
	rc = stk_s3_chunked_feed(&r->ch, p, n, &g_chunk_ops, r);
	if (!rc)
		return STK_S3_OK;
	if (r->body_err)
		return r->body_err;
	return fail(r, STK_S3_ERR_INCOMPLETE_BODY, "The aws-chunked body is malformed.");
}

static enum stk_s3_err prepare_body(struct stk_s3_req *r)
{
	const char *dl = stk_s3_req_header(r, "x-amz-decoded-content-length");

	r->md5 = EVP_MD_CTX_new();
	if (!r->md5)
		return STK_S3_ERR_SLOW_DOWN;
	EVP_DigestInit_ex(r->md5, EVP_md5(), NULL);
	if (r->payload == PAY_SIGNED) {
		r->sha = EVP_MD_CTX_new();
		if (!r->sha)
			return STK_S3_ERR_SLOW_DOWN;
		EVP_DigestInit_ex(r->sha, EVP_sha256(), NULL);
	}
	for (int i = 1; i < CK_COUNT; i++) {
		const char *v = stk_s3_req_header(r, g_ck_names[i]);
		const char *tr = stk_s3_req_header(r, "x-amz-trailer");
		if (!v && !(tr && strcasecmp(tr, g_ck_names[i]) == 0))
			continue;
		if (v && strlen(v) >= sizeof(r->ck_want))
			return fail(r, STK_S3_ERR_INVALID_ARGUMENT,
				    "Invalid x-amz-checksum value.");
		snprintf(r->ck_want, sizeof(r->ck_want), "%s", v ? v : "");
		r->ck = i;
	}
	if (r->ck == CK_SHA1 || r->ck == CK_SHA256) {
		r->ck_md = EVP_MD_CTX_new();
		if (!r->ck_md)
			return STK_S3_ERR_SLOW_DOWN;
		EVP_DigestInit_ex(r->ck_md, r->ck == CK_SHA1 ? EVP_sha1() : EVP_sha256(), NULL);
	}
	r->decoded_len = UINT64_MAX;
	if (r->payload == PAY_STREAM_SIGNED || r->payload == PAY_STREAM_UNSIGNED) {
		uint64_t v;
		r->chunk_sha = EVP_MD_CTX_new();
		if (!r->chunk_sha)
			return STK_S3_ERR_SLOW_DOWN;
		stk_s3_chunked_init(&r->ch, r->payload == PAY_STREAM_SIGNED);
		if (dl) {
			if (stk_parse_u64(dl, &v))
				return fail(r, STK_S3_ERR_INVALID_ARGUMENT,
					    "Invalid x-amz-decoded-content-length.");
			if (v > STK_S3_MAX_OBJECT_SIZE)
				return STK_S3_ERR_ENTITY_TOO_LARGE;
			r->decoded_len = v;
		}
	}
	return STK_S3_OK;
}

static enum stk_s3_err finish_body(struct stk_s3_req *r)
{
	const char *cmd5 = stk_s3_req_header(r, "content-md5");
	uint8_t md[EVP_MAX_MD_SIZE];
	unsigned mdlen = 0;

	if (r->payload == PAY_STREAM_SIGNED || r->payload == PAY_STREAM_UNSIGNED) {
		if (!r->ch.done)
			return fail(r, STK_S3_ERR_INCOMPLETE_BODY,
				    "The aws-chunked body ended before its final chunk.");
		if (r->decoded_len != UINT64_MAX && r->body_len != r->decoded_len)
			return fail(r, STK_S3_ERR_INCOMPLETE_BODY,
				    "The body does not hold x-amz-decoded-content-length bytes.");
	}
	if (r->payload == PAY_SIGNED) {
		char hex[65];
		EVP_DigestFinal_ex(r->sha, md, &mdlen);
		stk_s3_hex(md, 32, hex);
		if (strcmp(hex, r->want_sha) != 0)
			return STK_S3_ERR_SHA256_MISMATCH;
	}
	if (r->ck) {
		uint8_t d[EVP_MAX_MD_SIZE];
		unsigned dl = 4;
		char got[100];
		if (r->ck_md) {
			EVP_DigestFinal_ex(r->ck_md, d, &dl);
		} else { /* CRCs travel as 4 big-endian bytes */
			d[0] = (uint8_t)(r->ck_crc >> 24);
			d[1] = (uint8_t)(r->ck_crc >> 16);
			d[2] = (uint8_t)(r->ck_crc >> 8);
			d[3] = (uint8_t)r->ck_crc;
		}
		if (stk_s3_base64_encode(d, dl, got, sizeof(got)) < 0 || strcmp(got, r->ck_want)) {
			snprintf(r->err_msg, sizeof(r->err_msg),
				 "The %s you specified did not match the calculated checksum.",
				 g_ck_names[r->ck]);
			return STK_S3_ERR_BAD_DIGEST;
		}
	}
	EVP_DigestFinal_ex(r->md5, md, &mdlen);
	stk_s3_hex(md, 16, r->body_md5);
	if (cmd5) {
		uint8_t want[20];
		int n = stk_s3_base64_decode(cmd5, want, sizeof(want));
		if (n != 16)
			return STK_S3_ERR_INVALID_DIGEST;
		if (memcmp(want, md, 16) != 0)
			return STK_S3_ERR_BAD_DIGEST;
	}
	return STK_S3_OK;
}

/* ---- responses ---- */

/*
 * A GET's body. One io_size piece is read per call of the content reader; for an
 * object of more than one piece a read-ahead thread reads the next piece into
 * `slot` while libmicrohttpd sends the last one, so storage and network work at
 * once. Memory per GET: libmicrohttpd's buffer and the slot, both io_size.
 */
struct fbody {
	struct stk_s3_gw *gw;
	stk_metric_t sent; /* counts the bytes handed to libmicrohttpd */
	stk_file *f;
	uint64_t off, len;
	size_t block;
	int ahead; /* the read-ahead thread runs */
	pthread_t th;
	pthread_mutex_t lock; /* protects the fields below */
	pthread_cond_t cv;
	char *slot;
	uint64_t slot_pos; /* where the slot's bytes are in the body */
	ssize_t slot_len;  /* bytes in the slot, or -errno */
	size_t slot_used;  /* taken by the content reader */
	int full;	   /* the slot holds bytes (or an error) not yet taken */
	int stop;
};

static void *read_ahead(void *arg)
{
	struct fbody *b = arg;
	uint64_t next = 0;

	pthread_mutex_lock(&b->lock);
	while (!b->stop && next < b->len) {
		size_t n = b->len - next < b->block ? (size_t)(b->len - next) : b->block;
		ssize_t r;

		while (b->full && !b->stop)
			pthread_cond_wait(&b->cv, &b->lock);
		if (b->stop)
			break;
		/* the slot is ours while it is not full: read without the lock */
		pthread_mutex_unlock(&b->lock);
		r = stk_pread(b->f, b->slot, n, (off_t)(b->off + next));
		pthread_mutex_lock(&b->lock);
		b->slot_pos = next;
		b->slot_len = r > 0 ? r : (r ? r : -EIO);
		b->slot_used = 0;
		b->full = 1;
		pthread_cond_broadcast(&b->cv);
		if (r <= 0)
			break;
		next += (uint64_t)r;
	}
	pthread_mutex_unlock(&b->lock);
	return NULL;
}

static ssize_t read_error(struct fbody *b, uint64_t pos, ssize_t r)
{
	/* The status line is gone: closing early is all that is left, and the client
	 * sees fewer bytes than Content-Length, never wrong ones. */
	stk_warn("s3: read at %llu: %s", (unsigned long long)(b->off + pos),
		 r ? stk_strerror((int)r) : "file shrank");
	return MHD_CONTENT_READER_END_WITH_ERROR;
}

/*
 * stoker_process_loop_callback_seconds{loop="s3-http"}: how long each callback of
 * ours held a libmicrohttpd loop thread (docs/metrics.md, "Event-loop latency").
 * One gateway per process; 0 (metrics off) costs a test and no clock read.
 */
static stk_metric_t loop_busy;

static uint64_t loop_enter(void)
{
	return loop_busy ? stk_now_ns() : 0;
}

static void loop_leave(uint64_t t0)
{
	if (t0)
		stk_metric_observe_ns(loop_busy, stk_now_ns() - t0);
}

static ssize_t file_reader_in_loop(void *cls, uint64_t pos, char *buf, size_t max);

static ssize_t file_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
	uint64_t t0 = loop_enter();
	ssize_t r = file_reader_in_loop(cls, pos, buf, max);

	loop_leave(t0);
	return r;
}

static ssize_t file_reader_in_loop(void *cls, uint64_t pos, char *buf, size_t max)
{
	struct fbody *b = cls;
	size_t n;
	ssize_t r;

	if (pos >= b->len)
		return MHD_CONTENT_READER_END_OF_STREAM;
	if (!b->ahead) {
		n = b->len - pos < max ? (size_t)(b->len - pos) : max;
		r = stk_pread(b->f, buf, n, (off_t)(b->off + pos));
		if (r > 0)
			stk_metric_add(b->sent, r);
		return r > 0 ? r : read_error(b, pos, r);
	}
	pthread_mutex_lock(&b->lock);
	while (!b->full)
		pthread_cond_wait(&b->cv, &b->lock);
	if (b->slot_len <= 0 || b->slot_pos + b->slot_used != pos) {
		r = b->slot_len <= 0 ? b->slot_len : -EIO;
		pthread_mutex_unlock(&b->lock);
		return read_error(b, pos, r);
	}
	n = (size_t)b->slot_len - b->slot_used;
	if (n > max)
		n = max;
	memcpy(buf, b->slot + b->slot_used, n);
	b->slot_used += n;
	if (b->slot_used == (size_t)b->slot_len) {
		b->full = 0;
		pthread_cond_broadcast(&b->cv);
	}
	pthread_mutex_unlock(&b->lock);
	stk_metric_add(b->sent, (int64_t)n);
	return (ssize_t)n;
}

static void file_free(void *cls)
{
	struct fbody *b = cls;

	if (b->ahead) {
		pthread_mutex_lock(&b->lock);
		b->stop = 1;
		pthread_cond_broadcast(&b->cv);
		pthread_mutex_unlock(&b->lock);
		pthread_join(b->th, NULL);
		pthread_cond_destroy(&b->cv);
		pthread_mutex_destroy(&b->lock);
	}
	free(b->slot);
	stk_s3_obj_release(b->gw, b->f);
	free(b);
}

/* Takes r->file over into a body; NULL when out of memory (the file is released). */
static struct fbody *fbody_create(struct stk_s3_req *r, stk_metric_t sent)
{
	struct fbody *b = calloc(1, sizeof(*b));

	if (!b) {
		stk_s3_obj_release(r->gw, r->file);
		r->file = NULL;
		return NULL;
	}
	b->gw = r->gw;
	b->sent = sent;
	b->f = r->file;
	b->off = r->file_off;
	b->len = r->file_len;
	b->block = r->gw->io_size;
	r->file = NULL;
	if (b->len <= b->block)
		return b; /* one piece: nothing to overlap */
	b->slot = malloc(b->block);
	if (!b->slot)
		return b; /* read-ahead is an optimisation: go without */
	pthread_mutex_init(&b->lock, NULL);
	pthread_cond_init(&b->cv, NULL);
	if (pthread_create(&b->th, NULL, read_ahead, b) == 0) {
		b->ahead = 1;
	} else {
		pthread_cond_destroy(&b->cv);
		pthread_mutex_destroy(&b->lock);
		free(b->slot);
		b->slot = NULL;
	}
	return b;
}

static ssize_t no_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
	(void)cls;
	(void)pos;
	(void)buf;
	(void)max;
	return MHD_CONTENT_READER_END_WITH_ERROR;
}

static void error_body(struct stk_s3_req *r, enum stk_s3_err e)
{
	struct stk_s3_buf *b = &r->out;
	const char *msg = r->err_msg[0] ? r->err_msg : stk_s3_err_message(e);

	b->len = 0;
	stk_s3_buf_str(b, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error>");
	stk_s3_buf_elem(b, "Code", stk_s3_err_code(e));
	stk_s3_buf_elem(b, "Message", msg);
	if (r->t.bucket[0] && !r->t.bucket_too_long)
		stk_s3_buf_elem(b, "BucketName", r->t.bucket);
	if (*r->t.key && strlen(r->t.key) <= STK_S3_KEY_MAX)
		stk_s3_buf_elem(b, "Key", r->t.key);
	if (stk_s3_param(&r->t, "uploadId"))
		stk_s3_buf_elem(b, "UploadId", stk_s3_param(&r->t, "uploadId"));
	if (strlen(r->t.path) <= STK_S3_KEY_MAX + STK_S3_BUCKET_MAX + 2)
		stk_s3_buf_elem(b, "Resource", r->t.path);
	stk_s3_buf_elem(b, "RequestId", r->reqid);
	stk_s3_buf_str(b, "<HostId>stoker</HostId></Error>");
}

static enum MHD_Result respond(struct stk_s3_server *s, struct stk_s3_req *r, enum stk_s3_err e)
{
	struct MHD_Connection *conn = r->conn;
	struct MHD_Response *resp;
	int head = strcmp(r->method, "HEAD") == 0, xml = 0;
	unsigned status;
	enum MHD_Result ret;

	r->phase = PH_DONE;
	r->resp_err = e;
	if (e) {
		status = stk_s3_err_status(e);
		if (e != STK_S3_ERR_NOT_MODIFIED && !head) {
			error_body(r, e);
			xml = 1;
		} else {
			r->out.len = 0;
		}
		if (r->file) {
			stk_s3_obj_release(r->gw, r->file);
			r->file = NULL;
		}
	} else {
		status = r->status ? r->status : 200;
		xml = r->out.len > 0;
	}
	if (r->out.err) {
		stk_warn("s3 %s: response too large or out of memory", r->reqid);
		status = 500;
		r->out.len = 0;
		xml = 0;
	}
	if (!e && r->file) {
		size_t block = r->file_len < r->gw->io_size ? (size_t)r->file_len : r->gw->io_size;
		struct fbody *fb = fbody_create(r, s->read_bytes[r->op]);
		if (!fb)
			return MHD_NO;
		resp = MHD_create_response_from_callback(fb->len, block < 4096 ? 4096 : block,
							 file_reader, fb, file_free);
		if (!resp) {
			file_free(fb);
			return MHD_NO;
		}
	} else if (!e && head && r->head_len) {
		/* HEAD announces the object's length; the reader never runs */
		resp = MHD_create_response_from_callback(r->head_len, 4096, no_reader, NULL, NULL);
	} else {
		r->sent_len = r->out.len;
		resp = MHD_create_response_from_buffer(r->out.len, r->out.p ? r->out.p : (void *)"",
						       r->out.p ? MHD_RESPMEM_MUST_FREE
								: MHD_RESPMEM_PERSISTENT);
		if (resp)
			r->out.p = NULL;
		r->out.len = r->out.cap = 0;
	}
	if (!resp)
		return MHD_NO;
	/* a half-added pair would send the walk past the end: all or none */
	for (size_t i = 0; !r->hdrs.err && i < r->hdrs.len;) {
		const char *name = r->hdrs.p + i, *value = name + strlen(name) + 1;
		MHD_add_response_header(resp, name, value);
		i += strlen(name) + strlen(value) + 2;
	}
	if (xml)
		MHD_add_response_header(resp, "Content-Type", "application/xml");
	MHD_add_response_header(resp, "x-amz-request-id", r->reqid);
	MHD_add_response_header(resp, "Server", "Stoker");
	ret = MHD_queue_response(conn, status, resp);
	MHD_destroy_response(resp);
	if (status >= 500)
		stk_warn("s3 %s %s %s -> %u %s%s%s", r->reqid, r->method, r->t.path, status,
			 e ? stk_s3_err_code(e) : "", r->err_msg[0] ? ": " : "", r->err_msg);
	else
		stk_debug("s3 %s %s %s %s -> %u %s (%.1f ms)", r->reqid, r->method, r->t.path,
			  stk_s3_op_name(r->op), status, e ? stk_s3_err_code(e) : "",
			  (double)(stk_now_ns() - r->started_ns) / 1e6);
	return ret;
}

/* ---- libmicrohttpd callbacks ---- */

static void *uri_log(void *cls, const char *uri, struct MHD_Connection *conn)
{
	struct stk_s3_server *s = cls;
	struct stk_s3_req *r = calloc(1, sizeof(*r));

	(void)conn;
	if (!r)
		return NULL;
	r->gw = s->gw;
	r->started_ns = stk_now_ns();
	stk_metrics_ops_begin(s->m, STK_S3_OP_NONE); /* in flight until completed() */
	stk_s3_random_hex(r->reqid, 8);
	stk_s3_buf_init(&r->out, STK_S3_OUT_LIMIT);
	stk_s3_buf_init(&r->hdrs, 64u << 10);
	stk_s3_buf_init(&r->xml, 0);
	r->target_rc = stk_s3_target_parse(uri, strlen(uri), &r->t);
	return r;
}

static enum stk_s3_err start(struct stk_s3_req *r)
{
	enum stk_s3_err e;

	/* Refused before authentication, as S3 refuses a URI it cannot parse: the
	 * answer says nothing about the keys or the data. */
	if (r->target_rc == -E2BIG)
		return fail(r, STK_S3_ERR_INVALID_URI, "The URI is too long.");
	if (r->target_rc == -EILSEQ)
		return STK_S3_ERR_NUL_IN_NAME;
	if (r->target_rc)
		return STK_S3_ERR_INVALID_URI;
	if (r->gw->ndomains) {
		/* virtual-hosted style: the bucket is in the Host header, the key is the
		 * whole path; SigV4 still signs the path and Host as sent */
		const char *host = stk_s3_req_header(r, "host");
		char bucket[STK_S3_BUCKET_MAX + 1];
		int rc = host ? stk_s3_host_bucket(host, strlen(host), r->gw->domains,
						   r->gw->ndomains, bucket, sizeof(bucket))
			      : 0;

		if (rc == 1 && stk_s3_bucket_check(bucket))
			rc = -EINVAL; /* a name no bucket can have: say so, not NoSuchBucket */
		if (rc < 0)
			return fail(r, STK_S3_ERR_INVALID_BUCKET_NAME,
				    "The bucket named in the Host header is not valid.");
		if (rc == 1)
			stk_s3_target_set_bucket(&r->t, bucket);
	}
	e = authenticate(r);
	if (e)
		return e;
	e = stk_s3_op_route(r);
	if (e)
		return e;
	if (stk_s3_op_body(r->op) != STK_S3_BODY_NONE) {
		e = prepare_body(r);
		if (e)
			return e;
	}
	return stk_s3_op_begin(r);
}

static enum MHD_Result handler_in_loop(void *cls, struct MHD_Connection *conn, const char *url,
				       const char *method, const char *version,
				       const char *upload_data, size_t *upload_data_size,
				       void **con_cls);

static enum MHD_Result handler(void *cls, struct MHD_Connection *conn, const char *url,
			       const char *method, const char *version, const char *upload_data,
			       size_t *upload_data_size, void **con_cls)
{
	struct stk_s3_req *r = *con_cls;
	uint64_t t0 = loop_enter();
	enum MHD_Result ret;

	/* this request's user, for every namespace call it makes (authenticate sets it
	 * on the first call) */
	stk_s3_store_as(r && r->key && r->key->line.has_ids ? &r->key->cred : NULL);
	ret = handler_in_loop(cls, conn, url, method, version, upload_data, upload_data_size,
			      con_cls);
	stk_s3_store_as(NULL);
	loop_leave(t0);
	return ret;
}

static enum MHD_Result handler_in_loop(void *cls, struct MHD_Connection *conn, const char *url,
				       const char *method, const char *version,
				       const char *upload_data, size_t *upload_data_size,
				       void **con_cls)
{
	struct stk_s3_server *s = cls;
	struct stk_s3_req *r = *con_cls;
	enum stk_s3_err e;

	(void)url;
	(void)version;
	if (!r)
		return MHD_NO; /* uri_log could not allocate: drop the connection */
	if (r->phase == PH_NEW) {
		r->conn = conn;
		r->method = method;
		r->phase = PH_BODY;
		e = start(r);
		if (e || stk_s3_op_body(r->op) == STK_S3_BODY_NONE)
			return respond(s, r, e);
		return MHD_YES;
	}
	if (r->phase == PH_DONE)
		return MHD_YES;
	if (*upload_data_size) {
		if (!r->body_err)
			r->body_err = feed(r, upload_data, *upload_data_size);
		*upload_data_size = 0;
		return MHD_YES;
	}
	e = r->body_err;
	if (!e)
		e = finish_body(r);
	if (!e)
		e = stk_s3_op_finish(r);
	return respond(s, r, e);
}

/* The error series of op, registered the first time it is needed. */
static stk_metric_t err_series(struct stk_s3_server *s, enum stk_s3_op op, unsigned end)
{
	stk_metric_t *slot = &s->errs[op][end], h = __atomic_load_n(slot, __ATOMIC_RELAXED);
	const char *v[3];

	if (h || !s->m)
		return h;
	v[0] = "s3";
	v[1] = op == STK_S3_OP_NONE ? "Unknown" : stk_s3_op_name(op);
	v[2] = end < STK_S3_ERR__COUNT ? stk_s3_err_code((enum stk_s3_err)end)
				       : g_end_names[end - STK_S3_ERR__COUNT];
	if (stk_metric_series(STK_M_CLIENT_ERRORS, v, &h))
		return 0;
	__atomic_store_n(slot, h, __ATOMIC_RELAXED);
	return h;
}

/* Counts a request that ended: its operation, S3 error or how it ended, bytes, time. */
static void count_request(struct stk_s3_server *s, struct stk_s3_req *r,
			  enum MHD_RequestTerminationCode toe)
{
	unsigned end = 0;

	if (!s->m)
		return;
	if (r->phase == PH_DONE && toe == MHD_REQUEST_TERMINATED_COMPLETED_OK)
		end = r->resp_err;
	else if (toe == MHD_REQUEST_TERMINATED_TIMEOUT_REACHED)
		end = END_TIMEOUT;
	else if (r->phase == PH_NEW && toe == MHD_REQUEST_TERMINATED_COMPLETED_OK)
		end = END_REFUSED; /* answered by libmicrohttpd itself (431, 400) */
	else if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK)
		end = END_CLOSED;
	/* the operation's own ops_begin was counted as op NONE: in flight is per frontend */
	stk_metrics_ops_end(s->m, r->op, r->started_ns, 0, r->raw_len, r->sent_len);
	if (end)
		stk_metric_add(err_series(s, r->op, end), 1);
}

static void completed(void *cls, struct MHD_Connection *conn, void **con_cls,
		      enum MHD_RequestTerminationCode toe)
{
	struct stk_s3_server *s = cls;
	struct stk_s3_req *r = *con_cls;

	(void)conn;
	if (!r)
		return;
	count_request(s, r, toe);
	if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK && r->phase == PH_BODY)
		stk_info("s3 %s %s %s: client went away after %llu body bytes; nothing stored",
			 r->reqid, r->method ? r->method : "-", r->t.path,
			 (unsigned long long)r->raw_len);
	stk_s3_store_as(r->key && r->key->line.has_ids ? &r->key->cred : NULL);
	stk_s3_tmp_discard(r->gw, &r->tmp);
	if (r->file)
		stk_s3_obj_release(r->gw, r->file);
	stk_s3_store_as(NULL);
	EVP_MD_CTX_free(r->sha);
	EVP_MD_CTX_free(r->chunk_sha);
	EVP_MD_CTX_free(r->md5);
	EVP_MD_CTX_free(r->ck_md);
	stk_s3_buf_free(&r->xml);
	stk_s3_buf_free(&r->out);
	stk_s3_buf_free(&r->hdrs);
	OPENSSL_cleanse(r->skey, sizeof(r->skey));
	free(r);
	*con_cls = NULL;
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
	char line[512];
	size_t n;

	(void)cls;
	vsnprintf(line, sizeof(line), fmt, ap);
	n = strlen(line);
	while (n && line[n - 1] == '\n')
		line[--n] = 0;
	stk_debug("s3 http: %s", line);
}

static void conn_notify(void *cls, struct MHD_Connection *conn, void **socket_context,
			enum MHD_ConnectionNotificationCode toe)
{
	struct stk_s3_server *s = cls;

	(void)conn;
	(void)socket_context;
	stk_metrics_ops_conn(s->m, toe == MHD_CONNECTION_NOTIFY_STARTED ? 1 : -1);
}

/* ---- the server ---- */

/* stoker_client_* series for every operation, so that they show from the start. */
static int metrics_create(struct stk_s3_server *s)
{
	const char *names[STK_S3_OP__COUNT];
	int rc;

	for (unsigned i = 0; i < STK_S3_OP__COUNT; i++)
		names[i] = i == STK_S3_OP_NONE ? "Unknown" : stk_s3_op_name((enum stk_s3_op)i);
	rc = stk_metrics_ops_create("s3", names, STK_S3_OP__COUNT, &s->m);
	for (unsigned i = 0; !rc && i < STK_S3_OP__COUNT; i++) {
		const char *v[2] = {"s3", names[i]};
		rc = stk_metric_series(STK_M_CLIENT_READ_BYTES, v, &s->read_bytes[i]);
	}
	if (rc == 0) {
		const char *v[1] = {"s3-http"};
		rc = stk_metric_series(STK_M_PROCESS_LOOP_CALLBACK, v, &loop_busy);
	}
	return rc;
}

static int resolve_listen(const char *listen, struct sockaddr_storage *ss, int *v6)
{
	char host[256];
	uint16_t port;
	struct addrinfo hints, *res = NULL;
	int rc;

	rc = stk_parse_hostport(listen, host, sizeof(host), &port);
	if (rc)
		return rc;
	memset(ss, 0, sizeof(*ss));
	*v6 = 0;
	if (!host[0] || strcmp(host, "*") == 0) {
		struct sockaddr_in *sin = (struct sockaddr_in *)ss;
		sin->sin_family = AF_INET;
		sin->sin_port = htons(port);
		sin->sin_addr.s_addr = htonl(INADDR_ANY);
		return 0;
	}
	memset(&hints, 0, sizeof(hints));
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_PASSIVE;
	if (getaddrinfo(host, NULL, &hints, &res) || !res)
		return -EINVAL;
	memcpy(ss, res->ai_addr, res->ai_addrlen);
	if (res->ai_family == AF_INET6) {
		((struct sockaddr_in6 *)ss)->sin6_port = htons(port);
		*v6 = 1;
	} else {
		((struct sockaddr_in *)ss)->sin_port = htons(port);
	}
	freeaddrinfo(res);
	return 0;
}

int stk_s3_server_start(struct stk_s3_gw *gw, const struct stk_s3_server_opts *o,
			struct stk_s3_server **out)
{
	struct stk_s3_server *s;
	struct sockaddr_storage ss;
	struct MHD_OptionItem opts[16];
	unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_USE_ERROR_LOG;
	const union MHD_DaemonInfo *info;
	int v6 = 0, n = 0, rc;

	rc = resolve_listen(o->listen, &ss, &v6);
	if (rc)
		return rc;
	if ((o->tls_cert_pem != NULL) != (o->tls_key_pem != NULL))
		return -EINVAL;
	if (o->tls_cert_pem && MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES)
		return -ENOTSUP;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->gw = gw;
	if (o->metrics) {
		rc = metrics_create(s);
		if (rc)
			goto fail;
	}
	if (v6)
		flags |= MHD_USE_IPv6;
	/* the logger first, so that libmicrohttpd's own messages about later options
	 * go through it too */
	opts[n++] = (struct MHD_OptionItem){MHD_OPTION_EXTERNAL_LOGGER, (intptr_t)mhd_log, s};
	opts[n++] = (struct MHD_OptionItem){MHD_OPTION_SOCK_ADDR, 0, &ss};
	opts[n++] =
	    (struct MHD_OptionItem){MHD_OPTION_THREAD_POOL_SIZE, (intptr_t)o->threads, NULL};
	opts[n++] =
	    (struct MHD_OptionItem){MHD_OPTION_CONNECTION_LIMIT, (intptr_t)o->max_conns, NULL};
	opts[n++] =
	    (struct MHD_OptionItem){MHD_OPTION_CONNECTION_TIMEOUT, (intptr_t)o->timeout_s, NULL};
	opts[n++] =
	    (struct MHD_OptionItem){MHD_OPTION_CONNECTION_MEMORY_LIMIT, STK_S3_CONN_MEMORY, NULL};
	opts[n++] = (struct MHD_OptionItem){MHD_OPTION_URI_LOG_CALLBACK, (intptr_t)uri_log, s};
	opts[n++] = (struct MHD_OptionItem){MHD_OPTION_NOTIFY_COMPLETED, (intptr_t)completed, s};
	opts[n++] = (struct MHD_OptionItem){MHD_OPTION_NOTIFY_CONNECTION, (intptr_t)conn_notify, s};
	if (o->tls_cert_pem) {
		s->cert = strdup(o->tls_cert_pem);
		s->key = strdup(o->tls_key_pem);
		if (!s->cert || !s->key) {
			rc = -ENOMEM;
			goto fail;
		}
		flags |= MHD_USE_TLS;
		opts[n++] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_CERT, 0, s->cert};
		opts[n++] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_KEY, 0, s->key};
	}
	opts[n++] = (struct MHD_OptionItem){MHD_OPTION_END, 0, NULL};
	s->d = MHD_start_daemon(flags, 0, NULL, NULL, handler, s, MHD_OPTION_ARRAY, opts,
				MHD_OPTION_END);
	if (!s->d) {
		rc = -EADDRINUSE; /* or a bad certificate: libmicrohttpd does not say which */
		goto fail;
	}
	info = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
	s->port = info ? info->port : 0;
	*out = s;
	return 0;
fail:
	stk_metrics_ops_destroy(s->m);
	free(s->cert);
	free(s->key);
	free(s);
	return rc;
}

unsigned stk_s3_server_port(const struct stk_s3_server *s)
{
	return s->port;
}

void stk_s3_server_stop(struct stk_s3_server *s)
{
	if (!s)
		return;
	MHD_stop_daemon(s->d);
	stk_metrics_ops_destroy(s->m);
	if (s->key)
		OPENSSL_cleanse(s->key, strlen(s->key));
	free(s->cert);
	free(s->key);
	free(s);
}
