/*
 * libFuzzer target for the S3 gateway's request parsing (src/gateway/s3_parse.c):
 * request targets and the names in them, SigV4 Authorization headers and
 * presigned queries with the canonical request built from them, aws-chunked
 * bodies fed in pieces, the XML bodies, the stored metadata record, dates,
 * Range and entity-tag lists, and base64 tokens. The first input byte picks the
 * parser; the rest is what a client would send. Besides crashes, overreads
 * (ASan) and undefined behaviour (UBSan), it checks properties: a record that
 * decodes re-encodes to a record that decodes the same, base64 round-trips,
 * an accepted key has no "..", empty or over-long segment, a satisfiable range
 * (Range or x-amz-copy-source-range) lies inside the object, and a NUL is
 * reported as such only when the input has one.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gateway/s3_parse.h"

#define CHECK(c)                                                                                   \
	do {                                                                                       \
		if (!(c))                                                                          \
			abort();                                                                   \
	} while (0)

/* A NUL-terminated copy (parsers of header values take C strings). */
static char *cstr(const uint8_t *p, size_t n)
{
	char *s = malloc(n + 1);

	if (!s)
		return NULL;
	memcpy(s, p, n);
	s[n] = 0;
	return s;
}

/* Headers for the canonical request: the input's lines "name:value". */
struct hdrs {
	char *line[32];
	unsigned n;
};

static const char *hdr_lookup(void *ctx, const char *lname)
{
	struct hdrs *h = ctx;
	size_t ln = strlen(lname);

	for (unsigned i = 0; i < h->n; i++)
		if (strncmp(h->line[i], lname, ln) == 0 && h->line[i][ln] == ':')
			return h->line[i] + ln + 1;
	return NULL;
}

static void check_key(const char *key)
{
	size_t n = strlen(key);
	const char *p = key;

	if (stk_s3_key_check(key))
		return;
	CHECK(n >= 1 && n <= STK_S3_KEY_MAX);
	CHECK(key[0] != '/');
	CHECK(!strstr(key, "//"));
	while (*p) {
		const char *s = strchr(p, '/');
		size_t sl = s ? (size_t)(s - p) : strlen(p);
		CHECK(sl <= STK_S3_SEGMENT_MAX);
		CHECK(!(sl == 2 && p[0] == '.' && p[1] == '.'));
		CHECK(!(sl == 1 && p[0] == '.'));
		if (!s)
			break;
		p = s + 1;
	}
	CHECK(strncmp(key, STK_S3_RESERVED, strlen(STK_S3_RESERVED)) != 0);
}

static void fuzz_target(const uint8_t *p, size_t n)
{
	struct stk_s3_target *t = malloc(sizeof(*t));
	struct stk_s3_auth a;
	size_t split;

	if (!t || n < 2)
		goto out;
	/* the input: a 2-byte length, the target, then header lines */
	split = (size_t)p[0] | (size_t)p[1] << 8;
	p += 2;
	n -= 2;
	if (split > n)
		split = n;
	if (stk_s3_target_parse((const char *)p, split, t) == 0) {
		static const char *const domains[] = {"s3.example.com", "localhost"};
		char vb[STK_S3_BUCKET_MAX + 1];

		check_key(t->key);
		(void)stk_s3_bucket_check(t->bucket);
		/* the rest of the input as a Host header, virtual-hosted style */
		if (stk_s3_host_bucket((const char *)p + split, n - split, domains, 2, vb,
				       sizeof(vb)) == 1) {
			CHECK(strlen(vb) <= STK_S3_BUCKET_MAX && stk_s3_target_set_bucket(t, vb) == 0);
			check_key(t->key);
			(void)stk_s3_bucket_check(t->bucket);
		}
		for (unsigned i = 0; i < t->nparams; i++) {
			(void)stk_s3_param(t, t->params[i].name);
			(void)stk_s3_upload_id_check(t->params[i].value);
		}
		if (stk_s3_auth_parse_query(t, &a) == 0) {
			char *text = cstr(p + split, n - split);
			struct hdrs h = {{0}, 0};
			struct stk_s3_buf b;
			if (text) {
				for (char *c = text; c && h.n < 32;) {
					char *nl = strpbrk(c, "\r\n");
					h.line[h.n++] = c;
					if (nl)
						*nl++ = 0;
					c = nl;
				}
				stk_s3_buf_init(&b, 1 << 20);
				(void)stk_s3_canonical_request(&b, "GET", t, &a, hdr_lookup, &h,
							       "UNSIGNED-PAYLOAD");
				stk_s3_buf_free(&b);
			}
			free(text);
		}
	}
out:
	free(t);
}

static void fuzz_auth_header(const uint8_t *p, size_t n)
{
	char *s = cstr(p, n);
	struct stk_s3_auth a;

	if (!s)
		return;
	if (stk_s3_auth_parse_header(s, &a) == 0) {
		uint8_t key[32];
		char sig[65];
		CHECK(strlen(a.signature) == 64);
		CHECK(strlen(a.date) == 8);
		stk_s3_signing_key("secret", &a, key);
		stk_s3_signature(key, "20260101T000000Z", &a, s, strlen(s), sig);
		stk_s3_chunk_signature(key, "20260101T000000Z", &a, sig, sig, sig);
	}
	free(s);
}

struct chunk_state {
	uint64_t declared, seen, total;
	int in_chunk;
};

static int c_start(void *ctx, uint64_t size, const char *sig)
{
	struct chunk_state *st = ctx;

	CHECK(!st->in_chunk);
	CHECK(!*sig || strlen(sig) == 64);
	st->declared = size;
	st->seen = 0;
	st->in_chunk = 1;
	return 0;
}

static int c_data(void *ctx, const char *p, size_t n)
{
	struct chunk_state *st = ctx;

	(void)p;
	CHECK(st->in_chunk);
	st->seen += n;
	st->total += n;
	CHECK(st->seen <= st->declared);
	return 0;
}

static int c_end(void *ctx)
{
	struct chunk_state *st = ctx;

	CHECK(st->in_chunk && st->seen == st->declared);
	st->in_chunk = 0;
	return 0;
}

static void fuzz_chunked(const uint8_t *p, size_t n)
{
	static const struct stk_s3_chunked_ops ops = {c_start, c_data, c_end, NULL};
	struct stk_s3_chunked c;
	struct chunk_state st = {0, 0, 0, 0};
	size_t step;

	if (n < 2)
		return;
	stk_s3_chunked_init(&c, p[0] & 1);
	step = (size_t)(p[1] % 17) + 1; /* the body arrives in pieces of any size */
	p += 2;
	n -= 2;
	for (size_t off = 0; off < n; off += step) {
		size_t k = n - off < step ? n - off : step;
		if (stk_s3_chunked_feed(&c, (const char *)p + off, k, &ops, &st))
			return;
	}
	CHECK(c.total == st.total);
}

static void fuzz_xml(const uint8_t *p, size_t n, int which)
{
	if (which == 0) {
		struct stk_s3_part_ref *parts;
		unsigned np;
		if (stk_s3_xml_complete((const char *)p, n, &parts, &np) == 0) {
			CHECK(np >= 1 && np <= STK_S3_MAX_PARTS);
			for (unsigned i = 0; i < np; i++)
				CHECK(parts[i].number >= 1 && parts[i].number <= STK_S3_MAX_PARTS);
			free(parts);
		}
	} else if (which == 1) {
		struct stk_s3_delete_req d;
		if (stk_s3_xml_delete((const char *)p, n, &d) == 0) {
			CHECK(d.n >= 1 && d.n <= STK_S3_MAX_DELETE);
			for (unsigned i = 0; i < d.n; i++)
				check_key(d.keys[i]);
			stk_s3_delete_req_free(&d);
		}
	} else {
		char region[64];
		(void)stk_s3_xml_create_bucket((const char *)p, n, region, sizeof(region));
	}
}

static void fuzz_record(const uint8_t *p, size_t n)
{
	struct stk_s3_record *r = malloc(sizeof(*r)), *r2 = malloc(sizeof(*r2));
	char *buf = malloc(STK_S3_RECORD_MAX + 1);
	int len;

	if (!r || !r2 || !buf)
		goto out;
	if (stk_s3_record_decode((const char *)p, n, r))
		goto out;
	len = stk_s3_record_encode(r, buf, STK_S3_RECORD_MAX + 1);
	if (len < 0)
		goto out; /* decodable but too long to store: fine */
	CHECK(stk_s3_record_decode(buf, (size_t)len, r2) == 0);
	CHECK(r->ino == r2->ino && r->size == r2->size && r->mtime_sec == r2->mtime_sec &&
	      r->mtime_nsec == r2->mtime_nsec);
	CHECK(!strcmp(r->etag, r2->etag) && !strcmp(r->content_type, r2->content_type));
	CHECK(!strcmp(r->key, r2->key));
	CHECK(r->headers_len == r2->headers_len &&
	      !memcmp(r->headers, r2->headers, r->headers_len));
out:
	free(r);
	free(r2);
	free(buf);
}

static void fuzz_conditions(const uint8_t *p, size_t n)
{
	char *s = cstr(p, n);
	int64_t t;
	uint64_t off, len, size = n * 977;

	if (!s)
		return;
	(void)stk_s3_amz_date_parse(s, &t);
	if (stk_s3_http_date_parse(s, &t) == 0) {
		char out[40];
		int64_t t2;
		stk_s3_http_date(t, out, sizeof(out));
		CHECK(stk_s3_http_date_parse(out, &t2) == 0 && t2 == t);
	}
	if (stk_s3_range_parse(s, size, &off, &len) == 0)
		CHECK(len >= 1 && off < size && off + len <= size);
	if (stk_s3_copy_range_parse(s, size, &off, &len) == 0)
		CHECK(len >= 1 && off < size && off + len <= size && strncmp(s, "bytes=", 6) == 0);
	(void)stk_s3_etag_match(s, "\"d41d8cd98f00b204e9800998ecf8427e\"");
	free(s);
}

static void fuzz_base64(const uint8_t *p, size_t n)
{
	char *s = cstr(p, n), enc[4096];
	uint8_t dec[2048], dec2[2048];
	int k, k2;

	if (!s)
		return;
	k = stk_s3_base64_decode(s, dec, sizeof(dec));
	if (k >= 0) {
		CHECK(stk_s3_base64_encode(dec, (size_t)k, enc, sizeof(enc)) >= 0);
		k2 = stk_s3_base64_decode(enc, dec2, sizeof(dec2));
		CHECK(k2 == k && !memcmp(dec, dec2, (size_t)k));
	}
	free(s);
}

static void fuzz_decode_key(const uint8_t *p, size_t n)
{
	char out[STK_S3_URI_MAX + 1];
	size_t on;

	int rc = stk_s3_uri_decode((const char *)p, n, p && n && (p[0] & 1), out, sizeof(out), &on);

	if (rc == 0) {
		CHECK(on == strlen(out));
		check_key(out);
	}
	/* a NUL is refused as such only when the input holds one, raw or as %00 */
	if (rc == -EILSEQ)
		CHECK(memchr(p, 0, n) || memmem(p, n, "%00", 3));
}

/* A keys-file line: parsed, formatted and parsed again to the same key. */
static void fuzz_keyline(const uint8_t *data, size_t size)
{
	struct stk_s3_keyline k, k2;
	char out[8192], again[8192];
	int n, n2;

	if (stk_s3_keyline_parse((const char *)data, size, &k) != 0)
		return;
	(void)stk_s3_keyline_access(&k, "bucket");
	n = stk_s3_keyline_format(&k, out, sizeof(out));
	if (n < 0)
		return;
	if (stk_s3_keyline_parse(out, (size_t)n, &k2) != 0)
		abort();
	n2 = stk_s3_keyline_format(&k2, again, sizeof(again));
	if (n2 != n || memcmp(out, again, (size_t)n) != 0 ||
	    stk_s3_keyline_access(&k, "bucket") != stk_s3_keyline_access(&k2, "bucket"))
		abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size == 0)
		return 0;
	switch (data[0] % 11) {
	case 0:
		fuzz_target(data + 1, size - 1);
		break;
	case 1:
		fuzz_auth_header(data + 1, size - 1);
		break;
	case 2:
		fuzz_chunked(data + 1, size - 1);
		break;
	case 3:
	case 4:
	case 5:
		fuzz_xml(data + 1, size - 1, data[0] % 10 - 3);
		break;
	case 6:
		fuzz_record(data + 1, size - 1);
		break;
	case 7:
		fuzz_conditions(data + 1, size - 1);
		break;
	case 8:
		fuzz_base64(data + 1, size - 1);
		break;
	case 9:
		fuzz_keyline(data + 1, size - 1);
		break;
	default:
		fuzz_decode_key(data + 1, size - 1);
		break;
	}
	return 0;
}
