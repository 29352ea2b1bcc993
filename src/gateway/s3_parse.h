/*
 * The S3 gateway's parsers and encoders: everything that turns bytes a client sent
 * into checked values, and values into bytes a client reads, with no I/O.
 *
 * This file depends on OpenSSL (hashes, HMAC), Expat (XML) and libc only, so the
 * fuzz target tests/fuzz/fuzz_s3.c links it without the client library. Every
 * parser takes a length or a NUL-terminated string whose size the caller has
 * bounded, checks each length before it copies, and answers 0 or -errno:
 * -EINVAL for malformed input, -ENAMETOOLONG / -E2BIG when a field is longer
 * than its limit. Nothing here keeps state between calls or allocates except
 * where a function says so; all of it is safe from any thread.
 *
 * What is here, in the order of a request's life:
 *   request target   the raw "/path?query" split, percent-decoded, bucket and key;
 *                    the bucket of a virtual-hosted-style Host header
 *   names            bucket names, object keys (no "..", no empty segment, no NUL,
 *                    no reserved ".stoker-" first segment), multipart upload ids
 *   SigV4            Authorization header and presigned-query parsing, canonical
 *                    request, signing key, request and chunk signatures
 *   aws-chunked      the streaming upload body (signed or unsigned chunks, trailers)
 *   dates            x-amz-date, HTTP dates (three forms), ISO 8601 for listings
 *   conditions       Range, If-Match / If-None-Match entity-tag lists
 *   XML              CompleteMultipartUpload, Delete, CreateBucketConfiguration
 *   records          the per-object metadata record the gateway stores beside a file
 *   output           a growable buffer with XML escaping, base64 for list tokens
 */
#ifndef STK_GATEWAY_S3_PARSE_H
#define STK_GATEWAY_S3_PARSE_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#define STK_S3_KEY_MAX 1024    /* S3's limit on a key, in bytes */
#define STK_S3_SEGMENT_MAX 255 /* one key segment becomes one file name */
#define STK_S3_BUCKET_MAX 63
#define STK_S3_URI_MAX 8192	  /* the raw request target */
#define STK_S3_PARAMS_MAX 32	  /* query parameters in one request */
#define STK_S3_USER_META_MAX 2048 /* x-amz-meta-* names and values, S3's limit */
#define STK_S3_RECORD_MAX 4095	  /* a stored metadata record (xattr value or symlink) */
#define STK_S3_ETAG_MAX 80	  /* with quotes: "32 hex" or "32 hex-N" */
#define STK_S3_UPLOAD_ID_LEN 32	  /* hex characters */
#define STK_S3_CHUNK_LINE_MAX 512 /* one aws-chunked header or trailer line */
#define STK_S3_MAX_PARTS 10000
#define STK_S3_MAX_DELETE 1000
#define STK_S3_RESERVED ".stoker-" /* first segment reserved for the gateway's files */

/* ---- growable output buffer ---- */

/*
 * A byte buffer that grows up to `limit`. Errors are sticky: after an allocation
 * failure or a write past the limit, err is -ENOMEM / -E2BIG and later writes do
 * nothing, so a caller builds a whole document and checks err once. p is always
 * NUL-terminated when len > 0.
 */
struct stk_s3_buf {
	char *p;
	size_t len;
	size_t cap;
	size_t limit;
	int err;
};

void stk_s3_buf_init(struct stk_s3_buf *b, size_t limit);
void stk_s3_buf_free(struct stk_s3_buf *b);
void stk_s3_buf_add(struct stk_s3_buf *b, const void *p, size_t n);
void stk_s3_buf_str(struct stk_s3_buf *b, const char *s);
void stk_s3_buf_fmt(struct stk_s3_buf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Appends s with &, <, >, ", ' and control characters escaped for XML text. */
void stk_s3_buf_xml(struct stk_s3_buf *b, const char *s);
/* Appends <tag>escaped text</tag>. */
void stk_s3_buf_elem(struct stk_s3_buf *b, const char *tag, const char *text);
/*
 * Appends n bytes of s URI-encoded as SigV4 wants: A-Z a-z 0-9 - _ . ~ as they are,
 * '/' as it is when keep_slash, every other byte as %XX (upper-case hex).
 */
void stk_s3_buf_uri(struct stk_s3_buf *b, const char *s, size_t n, int keep_slash);

/* ---- request target ---- */

struct stk_s3_param {
	const char *name;  /* decoded, NUL-terminated, inside the target's store */
	const char *value; /* decoded; "" for "?uploads" */
};

/*
 * A request target split and decoded. path is the decoded path ("/b/k"); bucket is
 * its first segment ("" for "/"); key points into path after "/bucket/" ("" when
 * there is none). A target is large (about 25 KiB): allocate it with the request.
 */
struct stk_s3_target {
	char path[STK_S3_URI_MAX + 1];
	char bucket[STK_S3_BUCKET_MAX + 2]; /* one more to tell "too long" from "63" */
	const char *key;
	int bucket_too_long;
	unsigned nparams;
	struct stk_s3_param params[STK_S3_PARAMS_MAX];
	char store[STK_S3_URI_MAX + 2 * STK_S3_PARAMS_MAX];
};

/*
 * Parses an origin-form target "/path[?query]" of len bytes. Percent escapes are
 * decoded in the path and in parameter names and values ('+' in the query means a
 * space, as clients encode it). -EINVAL: not starting with '/', a bad escape,
 * too many parameters; -EILSEQ: a %00 (in the path or a parameter); -E2BIG:
 * longer than STK_S3_URI_MAX.
 */
int stk_s3_target_parse(const char *raw, size_t len, struct stk_s3_target *t);
/* The decoded value of the first parameter named name, or NULL. */
const char *stk_s3_param(const struct stk_s3_target *t, const char *name);

/*
 * Virtual-hosted-style addressing: when the Host header (host[0..n), with or
 * without ":port") is "BUCKET.DOMAIN" for one of the ndomains configured
 * domains (compared without case), copies BUCKET into bucket (bucket_len bytes
 * with the NUL) and returns 1. 0 when the host is not under any domain, is a
 * domain itself or an IP literal: the request is path-style. -EINVAL for an
 * empty or malformed host part, -ENAMETOOLONG for a BUCKET over 63 bytes.
 * BUCKET is returned as sent (lower case is for stk_s3_bucket_check to demand).
 */
int stk_s3_host_bucket(const char *host, size_t n, const char *const *domains,
		       unsigned ndomains, char *bucket, size_t bucket_len);
/*
 * Makes a parsed path-style target virtual-hosted: the bucket is the given one
 * and the key the whole path after its leading '/'. path is left as sent, which
 * is what SigV4 signs. -ENAMETOOLONG for a bucket over 63 bytes.
 */
int stk_s3_target_set_bucket(struct stk_s3_target *t, const char *bucket);

/* Decodes %XX escapes of in[0..n) into out (outlen bytes with the NUL). plus: '+'
 * is a space. -EINVAL for a bad escape, -EILSEQ for a NUL byte (%00), -E2BIG when
 * out is short. */
int stk_s3_uri_decode(const char *in, size_t n, int plus, char *out, size_t outlen, size_t *outn);

/* ---- names ---- */

/*
 * An object key usable as a path under the bucket: 1..1024 bytes; segments split
 * on '/', none empty (no leading '/', no "//"), none "." or "..", none over 255
 * bytes; a trailing '/' is allowed (a folder marker). The first segment may not
 * start with ".stoker-" (the gateway's own files). -EINVAL or -ENAMETOOLONG.
 */
int stk_s3_key_check(const char *key);
/* 3..63 of a-z 0-9 . - _, starting and ending with a letter or digit. -EINVAL. */
int stk_s3_bucket_check(const char *name);
/* Exactly 32 lower-case hex digits. -EINVAL. */
int stk_s3_upload_id_check(const char *id);

/* ---- SigV4 ---- */

struct stk_s3_auth {
	int presigned;
	char access_key[129];
	char date[9]; /* YYYYMMDD of the credential scope */
	char region[65];
	char service[17];
	char signed_headers[1025]; /* "host;x-amz-date", lower case, as sent */
	char signature[65];
	char amz_date[17]; /* presigned: X-Amz-Date (YYYYMMDDTHHMMSSZ) */
	uint64_t expires;  /* presigned: X-Amz-Expires seconds */
};

/*
 * Parses "AWS4-HMAC-SHA256 Credential=AK/DATE/REGION/SERVICE/aws4_request,
 * SignedHeaders=a;b, Signature=HEX". -ENOTSUP for another scheme (SigV2's "AWS
 * AK:SIG"), -EINVAL for a malformed one.
 */
int stk_s3_auth_parse_header(const char *v, struct stk_s3_auth *a);
/*
 * Parses the X-Amz-* parameters of a presigned URL. -ENOENT when the target has no
 * X-Amz-Signature (not presigned), -EINVAL when malformed or X-Amz-Expires is
 * over 604800, -ENOTSUP for another algorithm.
 */
int stk_s3_auth_parse_query(const struct stk_s3_target *t, struct stk_s3_auth *a);

/* Returns a header's value by lower-case name, or NULL when absent. */
typedef const char *(*stk_s3_header_fn)(void *ctx, const char *lname);

/*
 * Builds the canonical request of SigV4 into out: method, canonical URI (the
 * decoded path encoded once), canonical query (X-Amz-Signature left out when
 * presigned), the signed headers' trimmed values, the signed header list and
 * payload_hash. -EINVAL when a signed header is missing or "host" is not signed.
 */
int stk_s3_canonical_request(struct stk_s3_buf *out, const char *method,
			     const struct stk_s3_target *t, const struct stk_s3_auth *a,
			     stk_s3_header_fn hdr, void *ctx, const char *payload_hash);
/* The signing key: HMAC chain over date, region, service and "aws4_request". */
void stk_s3_signing_key(const char *secret, const struct stk_s3_auth *a, uint8_t key[32]);
/* The request signature (64 hex and a NUL) of a canonical request. */
void stk_s3_signature(const uint8_t key[32], const char *amz_date, const struct stk_s3_auth *a,
		      const char *canonical, size_t len, char out[65]);
/* A streaming chunk's signature: over the previous signature and the chunk's hash. */
void stk_s3_chunk_signature(const uint8_t key[32], const char *amz_date,
			    const struct stk_s3_auth *a, const char *prev,
			    const char *chunk_hash_hex, char out[65]);
void stk_s3_hex(const uint8_t *p, size_t n, char *out); /* 2n hex digits and a NUL */
void stk_s3_sha256_hex(const void *p, size_t n, char out[65]);
/* Constant-time comparison of two NUL-terminated strings of equal expected length. */
int stk_s3_secure_eq(const char *a, const char *b);

/* ---- aws-chunked bodies ---- */

/*
 * The streaming body of STREAMING-AWS4-HMAC-SHA256-PAYLOAD and
 * STREAMING-UNSIGNED-PAYLOAD-TRAILER: "HEX[;chunk-signature=SIG]\r\nDATA\r\n"
 * repeated, a zero-size chunk, optional trailer lines and an empty line. The
 * callbacks see each chunk's header, its data (in pieces), and its end; any
 * non-zero return from a callback stops the parse with that value.
 */
struct stk_s3_chunked_ops {
	int (*start)(void *ctx, uint64_t size, const char *sig); /* sig "" when unsigned */
	int (*data)(void *ctx, const char *p, size_t n);
	int (*end)(void *ctx); /* after a chunk's data; for the last one, after trailers */
	int (*trailer)(void *ctx, const char *line); /* "name:value", may be NULL */
};

struct stk_s3_chunked {
	int state;
	int signed_chunks; /* a chunk-signature is required on every chunk */
	int done;	   /* the final chunk and its trailers are in */
	uint64_t left;	   /* data bytes left in the current chunk */
	uint64_t total;	   /* data bytes so far */
	unsigned trailers;
	size_t llen;
	char line[STK_S3_CHUNK_LINE_MAX + 1];
};

void stk_s3_chunked_init(struct stk_s3_chunked *c, int signed_chunks);
/*
 * Feeds n body bytes. 0, -EINVAL (malformed framing, bytes after the end), or a
 * callback's error.
 */
int stk_s3_chunked_feed(struct stk_s3_chunked *c, const char *p, size_t n,
			const struct stk_s3_chunked_ops *ops, void *ctx);

/* ---- dates ---- */

/* "YYYYMMDDTHHMMSSZ" to seconds since the epoch. -EINVAL. */
int stk_s3_amz_date_parse(const char *s, int64_t *t);
/* IMF-fixdate, RFC 850 or asctime (RFC 9110 5.6.7) to seconds. -EINVAL. */
int stk_s3_http_date_parse(const char *s, int64_t *t);
/* "Sun, 06 Nov 1994 08:49:37 GMT" into out (at least 30 bytes). */
void stk_s3_http_date(int64_t t, char *out, size_t len);
/* "2006-02-03T16:45:09.000Z" into out (at least 25 bytes). */
void stk_s3_iso_date(int64_t t, char *out, size_t len);

/* ---- conditions ---- */

/*
 * A Range header against an object of size bytes. 0 with *off and *len set for
 * one satisfiable byte range; 1 when the header is to be ignored (not "bytes=",
 * several ranges, malformed: RFC 9110 says serve the whole object); -ERANGE when
 * unsatisfiable (416).
 */
int stk_s3_range_parse(const char *v, uint64_t size, uint64_t *off, uint64_t *len);
/*
 * x-amz-copy-source-range (UploadPartCopy), read as strictly as S3 does: exactly
 * "bytes=FIRST-LAST" with FIRST <= LAST, else -EINVAL; -ERANGE when LAST is not
 * inside the source of size bytes (never clamped, unlike a GET's Range). 0 with
 * *off and *len set otherwise.
 */
int stk_s3_copy_range_parse(const char *v, uint64_t size, uint64_t *off, uint64_t *len);
/* 1 when the entity-tag list v ("*", or quoted tags, W/ allowed) holds etag. */
int stk_s3_etag_match(const char *v, const char *etag);

/* ---- XML request bodies ---- */

struct stk_s3_part_ref {
	uint32_t number;
	char etag[STK_S3_ETAG_MAX + 1]; /* as the client sent it, quotes removed */
};

/*
 * <CompleteMultipartUpload><Part><PartNumber>N</PartNumber><ETag>E</ETag></Part>...
 * *parts is malloc'ed (free() it) with *n entries in document order. Unknown
 * elements (checksums) are ignored. -EINVAL malformed (no parts, a part without a
 * number or an ETag, a number outside 1..10000), -E2BIG over 10000 parts.
 */
int stk_s3_xml_complete(const char *p, size_t n, struct stk_s3_part_ref **parts, unsigned *nparts);

struct stk_s3_delete_req {
	int quiet;
	unsigned n;
	char **keys; /* n malloc'ed strings, decoded from XML, not yet checked as keys */
};
/* <Delete><Quiet>true</Quiet><Object><Key>K</Key></Object>...</Delete>. -EINVAL, -E2BIG. */
int stk_s3_xml_delete(const char *p, size_t n, struct stk_s3_delete_req *out);
void stk_s3_delete_req_free(struct stk_s3_delete_req *d);
/* <CreateBucketConfiguration><LocationConstraint>R</...>; an empty body is fine. */
int stk_s3_xml_create_bucket(const char *p, size_t n, char *region, size_t len);

/* ---- the stored metadata record ---- */

/*
 * What the gateway keeps beside an object (and beside a multipart upload): the
 * identity of the file it describes (inode, size, mtime: a record that no longer
 * matches its file is stale and ignored), the ETag, Content-Type, the key (for
 * uploads) and the other stored headers as "name: value\n" lines. Encoded as
 * text: "s3m1 INO SIZE SEC NSEC\nETAG\nCONTENT-TYPE\nKEY\nHEADERS", the key with
 * '%', CR, LF and control bytes as %XX.
 */
struct stk_s3_record {
	uint64_t ino;
	uint64_t size;
	int64_t mtime_sec;
	uint32_t mtime_nsec;
	char etag[STK_S3_ETAG_MAX + 1];
	char content_type[257];
	char key[STK_S3_KEY_MAX + 1];
	char headers[STK_S3_USER_META_MAX + 1024];
	size_t headers_len;
};

/* Returns the encoded length (< len, NUL-terminated), -E2BIG or -EINVAL. */
int stk_s3_record_encode(const struct stk_s3_record *r, char *out, size_t len);
int stk_s3_record_decode(const char *in, size_t n, struct stk_s3_record *r);
/*
 * Appends "name: value\n" to r->headers after checking both (name a token, value
 * without CR, LF or NUL). -EINVAL, -E2BIG.
 */
int stk_s3_record_add_header(struct stk_s3_record *r, const char *name, const char *value);

/* ---- access keys and users (docs/s3.md, "Users") ---- */

#define STK_S3_USER_MAX 32	/* a user's name */
#define STK_S3_USER_BUCKETS 32	/* buckets a user is given */

/* A bucket a user may use: rw 1 to read and write, 0 to read; name "*": any bucket. */
struct stk_s3_user_bucket {
	char name[STK_S3_BUCKET_MAX + 1];
	uint8_t rw;
};

/*
 * One line of a keys file: "ACCESS_KEY SECRET", the gateway's own key (any bucket,
 * acting as the gateway), or a user's, with options after the secret:
 *   user=NAME uid=U gid=G buckets=B1:rw,B2:ro,...
 * user= makes the key a user's, confined to its buckets (none given: none), acting
 * as uid/gid when given (else as the gateway). Fields are printable, no spaces;
 * keys and secrets at most 128 bytes.
 */
struct stk_s3_keyline {
	char id[129];
	char secret[129];
	char user[STK_S3_USER_MAX + 1]; /* "": the gateway's own key */
	int has_ids;
	uint32_t uid, gid;
	unsigned nbuckets;
	struct stk_s3_user_bucket buckets[STK_S3_USER_BUCKETS];
};

/*
 * Parses one line (n bytes, no newline needed) into *out: 0, 1 for a blank or '#'
 * line (out untouched), -EINVAL (malformed: a field, an unknown option, a bad
 * bucket name or access), -E2BIG (too many buckets).
 */
int stk_s3_keyline_parse(const char *line, size_t n, struct stk_s3_keyline *out);
/* Writes k as a keys-file line (no newline) into out: its length, or -E2BIG. */
int stk_s3_keyline_format(const struct stk_s3_keyline *k, char *out, size_t len);
/*
 * What key k may do with bucket: 2 read and write, 1 read, 0 nothing. The
 * gateway's own key (no user) may do anything; a user's key what its most
 * specific entry says (the bucket's own, else "*").
 */
int stk_s3_keyline_access(const struct stk_s3_keyline *k, const char *bucket);

/* ---- tokens ---- */

/* Standard base64 with padding. Returns the length written (NUL added) or -E2BIG. */
int stk_s3_base64_encode(const void *in, size_t n, char *out, size_t outlen);
/* Returns the decoded length or -EINVAL / -E2BIG. */
int stk_s3_base64_decode(const char *in, void *out, size_t outlen);

#endif
