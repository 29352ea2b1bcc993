/*
 * The S3 gateway's parsers and encoders (see s3_parse.h for the contract).
 *
 * Everything a client controls passes through here before the gateway acts on it,
 * so each function is written to be fuzzed: lengths are checked before bytes are
 * copied, numbers are parsed digit by digit with overflow checks (no atoi, no
 * strtol on unbounded input), and every output has a fixed or checked size. The
 * XML parsers refuse DTDs outright, which also closes the door on entity
 * expansion. Hashes and HMACs come from OpenSSL's one-shot calls.
 */
#include "s3_parse.h"

#include <ctype.h>
#include <errno.h>
#include <expat.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

/* ---- growable output buffer ---- */

void stk_s3_buf_init(struct stk_s3_buf *b, size_t limit)
{
	memset(b, 0, sizeof(*b));
	b->limit = limit;
}

void stk_s3_buf_free(struct stk_s3_buf *b)
{
	free(b->p);
	memset(b, 0, sizeof(*b));
}

static int buf_reserve(struct stk_s3_buf *b, size_t n)
{
	size_t want, cap;
	char *p;

	if (b->err)
		return b->err;
	if (n > b->limit || b->len > b->limit - n) {
		b->err = -E2BIG;
		return b->err;
	}
	want = b->len + n + 1;
	if (want <= b->cap)
		return 0;
	cap = b->cap ? b->cap : 256;
	while (cap < want)
		cap *= 2;
	p = realloc(b->p, cap);
	if (!p) {
		b->err = -ENOMEM;
		return b->err;
	}
	b->p = p;
	b->cap = cap;
	return 0;
}

void stk_s3_buf_add(struct stk_s3_buf *b, const void *p, size_t n)
{
	if (buf_reserve(b, n))
		return;
	if (n)
		memcpy(b->p + b->len, p, n);
	b->len += n;
	b->p[b->len] = 0;
}

void stk_s3_buf_str(struct stk_s3_buf *b, const char *s)
{
	stk_s3_buf_add(b, s, strlen(s));
}

void stk_s3_buf_fmt(struct stk_s3_buf *b, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (b->err)
		return;
	va_start(ap, fmt);
	n = vsnprintf(NULL, 0, fmt, ap);
	va_end(ap);
	if (n < 0) {
		b->err = -EINVAL;
		return;
	}
	if (buf_reserve(b, (size_t)n))
		return;
	va_start(ap, fmt);
	vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
	va_end(ap);
	b->len += (size_t)n;
}

void stk_s3_buf_xml(struct stk_s3_buf *b, const char *s)
{
	const char *run = s;

	for (; *s; s++) {
		unsigned char ch = (unsigned char)*s;
		const char *rep = NULL;
		char num[8];

		switch (ch) {
		case '&':
			rep = "&amp;";
			break;
		case '<':
			rep = "&lt;";
			break;
		case '>':
			rep = "&gt;";
			break;
		case '"':
			rep = "&quot;";
			break;
		case '\'':
			rep = "&apos;";
			break;
		default:
			/* XML 1.0 cannot carry most control characters even as references;
			 * S3 writes them as numeric references, and so do we. */
			if (ch < 0x20) {
				snprintf(num, sizeof(num), "&#x%X;", ch);
				rep = num;
			}
		}
		if (!rep)
			continue;
		stk_s3_buf_add(b, run, (size_t)(s - run));
		stk_s3_buf_str(b, rep);
		run = s + 1;
	}
	stk_s3_buf_add(b, run, (size_t)(s - run));
}

void stk_s3_buf_elem(struct stk_s3_buf *b, const char *tag, const char *text)
{
	stk_s3_buf_fmt(b, "<%s>", tag);
	stk_s3_buf_xml(b, text);
	stk_s3_buf_fmt(b, "</%s>", tag);
}

static int unreserved(unsigned char ch)
{
	return (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') ||
	       ch == '-' || ch == '_' || ch == '.' || ch == '~';
}

void stk_s3_buf_uri(struct stk_s3_buf *b, const char *s, size_t n, int keep_slash)
{
	static const char hex[] = "0123456789ABCDEF";

	for (size_t i = 0; i < n; i++) {
		unsigned char ch = (unsigned char)s[i];
		if (unreserved(ch) || (keep_slash && ch == '/')) {
			stk_s3_buf_add(b, &s[i], 1);
		} else {
			char e[3] = {'%', hex[ch >> 4], hex[ch & 15]};
			stk_s3_buf_add(b, e, 3);
		}
	}
}

/* ---- request target ---- */

static int hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

int stk_s3_uri_decode(const char *in, size_t n, int plus, char *out, size_t outlen, size_t *outn)
{
	size_t o = 0;

	if (outlen == 0)
		return -E2BIG;
	for (size_t i = 0; i < n; i++) {
		unsigned char ch = (unsigned char)in[i];
		if (ch == '%') {
			int hi, lo;
			if (n - i < 3)
				return -EINVAL;
			hi = hexval(in[i + 1]);
			lo = hexval(in[i + 2]);
			if (hi < 0 || lo < 0)
				return -EINVAL;
			ch = (unsigned char)(hi << 4 | lo);
			i += 2;
		} else if (ch == '+' && plus) {
			ch = ' ';
		}
		if (ch == 0)
			return -EILSEQ; /* no name can hold it: refused as such, not as garbage */
		if (o + 1 >= outlen)
			return -E2BIG;
		out[o++] = (char)ch;
	}
	out[o] = 0;
	if (outn)
		*outn = o;
	return 0;
}

int stk_s3_target_parse(const char *raw, size_t len, struct stk_s3_target *t)
{
	const char *q, *end = raw + len, *p, *slash;
	size_t plen, n, used = 0;
	int rc;

	t->path[0] = 0;
	t->bucket[0] = 0;
	t->key = t->path;
	t->bucket_too_long = 0;
	t->nparams = 0;
	if (len == 0 || raw[0] != '/')
		return -EINVAL;
	if (len > STK_S3_URI_MAX)
		return -E2BIG;
	q = memchr(raw, '?', len);
	plen = q ? (size_t)(q - raw) : len;
	rc = stk_s3_uri_decode(raw, plen, 0, t->path, sizeof(t->path), &n);
	if (rc)
		return rc;

	/* "/bucket/key": the bucket is the first segment, the key all after its '/'. */
	p = t->path + 1;
	slash = strchr(p, '/');
	n = slash ? (size_t)(slash - p) : strlen(p);
	if (n > STK_S3_BUCKET_MAX) {
		t->bucket_too_long = 1;
		n = STK_S3_BUCKET_MAX + 1;
	}
	memcpy(t->bucket, p, n);
	t->bucket[n] = 0;
	t->key = slash ? slash + 1 : p + strlen(p);

	if (!q)
		return 0;
	for (p = q + 1; p < end;) {
		const char *amp = memchr(p, '&', (size_t)(end - p));
		const char *pe = amp ? amp : end;
		const char *eq = memchr(p, '=', (size_t)(pe - p));
		const char *ne = eq ? eq : pe;
		struct stk_s3_param *pp;
		size_t dn;

		if (pe == p) { /* "a&&b" or a trailing '&' */
			p = pe + 1;
			continue;
		}
		if (t->nparams == STK_S3_PARAMS_MAX)
			return -EINVAL;
		pp = &t->params[t->nparams];
		rc = stk_s3_uri_decode(p, (size_t)(ne - p), 1, t->store + used,
				       sizeof(t->store) - used, &dn);
		if (rc)
			return rc;
		pp->name = t->store + used;
		used += dn + 1;
		if (eq) {
			rc = stk_s3_uri_decode(eq + 1, (size_t)(pe - eq - 1), 1, t->store + used,
					       sizeof(t->store) - used, &dn);
			if (rc)
				return rc;
		} else {
			if (used >= sizeof(t->store))
				return -E2BIG;
			t->store[used] = 0;
			dn = 0;
		}
		pp->value = t->store + used;
		used += dn + 1;
		t->nparams++;
		p = pe + 1;
	}
	return 0;
}

int stk_s3_host_bucket(const char *host, size_t n, const char *const *domains,
		       unsigned ndomains, char *bucket, size_t bucket_len)
{
	size_t hn = n;

	if (n == 0 || host[0] == '[')
		return 0; /* no Host, or an IPv6 literal */
	/* the port: the digits after the last ':' */
	for (size_t i = n; i > 0; i--) {
		if (host[i - 1] == ':') {
			hn = i - 1;
			break;
		}
		if (host[i - 1] < '0' || host[i - 1] > '9')
			break;
	}
	if (hn && host[hn - 1] == '.')
		hn--; /* "bucket.example.com." is the same name, fully qualified */
	for (unsigned d = 0; d < ndomains; d++) {
		size_t dn = strlen(domains[d]), bn;

		if (dn == 0 || hn <= dn + 1 || host[hn - dn - 1] != '.' ||
		    strncasecmp(host + hn - dn, domains[d], dn) != 0)
			continue;
		bn = hn - dn - 1;
		for (size_t i = 0; i < bn; i++)
			if ((unsigned char)host[i] <= ' ' || (unsigned char)host[i] >= 0x7f ||
			    host[i] == '/' || host[i] == ':')
				return -EINVAL;
		if (bn > STK_S3_BUCKET_MAX)
			return -ENAMETOOLONG;
		if (bn + 1 > bucket_len)
			return -E2BIG;
		memcpy(bucket, host, bn);
		bucket[bn] = 0;
		return 1;
	}
	return 0;
}

int stk_s3_target_set_bucket(struct stk_s3_target *t, const char *bucket)
{
	size_t n = strlen(bucket);

	if (n > STK_S3_BUCKET_MAX)
		return -ENAMETOOLONG;
	memcpy(t->bucket, bucket, n + 1);
	t->bucket_too_long = 0;
	t->key = t->path[0] == '/' ? t->path + 1 : t->path;
	return 0;
}

const char *stk_s3_param(const struct stk_s3_target *t, const char *name)
{
	for (unsigned i = 0; i < t->nparams; i++)
		if (strcmp(t->params[i].name, name) == 0)
			return t->params[i].value;
	return NULL;
}

/* ---- names ---- */

int stk_s3_key_check(const char *key)
{
	size_t n = strnlen(key, STK_S3_KEY_MAX + 1), rl = strlen(STK_S3_RESERVED);
	const char *p = key, *end = key + n;
	int first = 1;

	if (n == 0)
		return -EINVAL;
	if (n > STK_S3_KEY_MAX)
		return -ENAMETOOLONG;
	while (p < end) {
		const char *s = memchr(p, '/', (size_t)(end - p));
		size_t sl = s ? (size_t)(s - p) : (size_t)(end - p);

		if (sl == 0)
			return -EINVAL;
		if (sl > STK_S3_SEGMENT_MAX)
			return -ENAMETOOLONG;
		if ((sl == 1 && p[0] == '.') || (sl == 2 && p[0] == '.' && p[1] == '.'))
			return -EINVAL;
		if (first && sl >= rl && memcmp(p, STK_S3_RESERVED, rl) == 0)
			return -EINVAL;
		first = 0;
		if (!s)
			break;
		p = s + 1;
	}
	return 0;
}

static int is_lower_alnum(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
}

int stk_s3_bucket_check(const char *name)
{
	size_t n = strnlen(name, STK_S3_BUCKET_MAX + 1);

	if (n < 3 || n > STK_S3_BUCKET_MAX)
		return -EINVAL;
	if (!is_lower_alnum(name[0]) || !is_lower_alnum(name[n - 1]))
		return -EINVAL;
	for (size_t i = 0; i < n; i++) {
		char c = name[i];
		if (!is_lower_alnum(c) && c != '.' && c != '-' && c != '_')
			return -EINVAL;
		if (c == '.' && name[i + 1] == '.')
			return -EINVAL;
	}
	return 0;
}

int stk_s3_upload_id_check(const char *id)
{
	size_t i;

	for (i = 0; i < STK_S3_UPLOAD_ID_LEN; i++)
		if (!((id[i] >= '0' && id[i] <= '9') || (id[i] >= 'a' && id[i] <= 'f')))
			return -EINVAL;
	return id[i] == 0 ? 0 : -EINVAL;
}

/* ---- SigV4 ---- */

/* Copies [p, p+n) into dst of size len with a NUL; -E2BIG if it does not fit. */
static int copy_span(char *dst, size_t len, const char *p, size_t n)
{
	if (n >= len)
		return -E2BIG;
	memcpy(dst, p, n);
	dst[n] = 0;
	return 0;
}

static int all_hex_lower(const char *s, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
			return 0;
	return 1;
}

static int all_digits(const char *s, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (s[i] < '0' || s[i] > '9')
			return 0;
	return n > 0;
}

/* "AK/YYYYMMDD/REGION/SERVICE/aws4_request" */
static int parse_credential(const char *p, size_t n, struct stk_s3_auth *a)
{
	const char *parts[5];
	size_t lens[5];
	const char *end = p + n, *s = p;

	for (int i = 0; i < 5; i++) {
		const char *slash = i < 4 ? memchr(s, '/', (size_t)(end - s)) : NULL;
		const char *e = slash ? slash : end;
		if (i < 4 && !slash)
			return -EINVAL;
		parts[i] = s;
		lens[i] = (size_t)(e - s);
		s = e + 1;
	}
	if (lens[0] == 0 || lens[1] != 8 || !all_digits(parts[1], 8) || lens[2] == 0 ||
	    lens[3] == 0 || lens[4] != 12 || memcmp(parts[4], "aws4_request", 12) != 0)
		return -EINVAL;
	if (copy_span(a->access_key, sizeof(a->access_key), parts[0], lens[0]) ||
	    copy_span(a->date, sizeof(a->date), parts[1], lens[1]) ||
	    copy_span(a->region, sizeof(a->region), parts[2], lens[2]) ||
	    copy_span(a->service, sizeof(a->service), parts[3], lens[3]))
		return -EINVAL;
	return 0;
}

static int parse_signed_headers(const char *p, size_t n, struct stk_s3_auth *a)
{
	if (n == 0 || p[0] == ';' || p[n - 1] == ';')
		return -EINVAL;
	for (size_t i = 0; i < n; i++) {
		char c = p[i];
		if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == ';' ||
		      c == '_' || c == '.'))
			return -EINVAL;
		if (c == ';' && p[i + 1] == ';')
			return -EINVAL;
	}
	return copy_span(a->signed_headers, sizeof(a->signed_headers), p, n) ? -EINVAL : 0;
}

static int parse_signature(const char *p, size_t n, struct stk_s3_auth *a)
{
	if (n != 64 || !all_hex_lower(p, 64))
		return -EINVAL;
	memcpy(a->signature, p, 64);
	a->signature[64] = 0;
	return 0;
}

int stk_s3_auth_parse_header(const char *v, struct stk_s3_auth *a)
{
	static const char alg[] = "AWS4-HMAC-SHA256";
	const char *p = v;
	int have = 0, rc;

	memset(a, 0, sizeof(*a));
	if (strncmp(v, "AWS ", 4) == 0)
		return -ENOTSUP;
	if (strncmp(p, alg, sizeof(alg) - 1) != 0 || (p[sizeof(alg) - 1] != ' '))
		return strncmp(p, "AWS4-", 5) == 0 ? -ENOTSUP : -EINVAL;
	p += sizeof(alg) - 1;
	while (*p) {
		const char *name, *eq, *val, *vend;
		size_t nn;

		while (*p == ' ' || *p == ',')
			p++;
		if (!*p)
			break;
		name = p;
		eq = strchr(p, '=');
		if (!eq)
			return -EINVAL;
		nn = (size_t)(eq - name);
		while (nn && name[nn - 1] == ' ')
			nn--;
		val = eq + 1;
		while (*val == ' ')
			val++;
		vend = val;
		while (*vend && *vend != ',')
			vend++;
		p = vend;
		while (vend > val && vend[-1] == ' ')
			vend--;
		if (nn == 10 && memcmp(name, "Credential", 10) == 0) {
			rc = parse_credential(val, (size_t)(vend - val), a);
			have |= 1;
		} else if (nn == 13 && memcmp(name, "SignedHeaders", 13) == 0) {
			rc = parse_signed_headers(val, (size_t)(vend - val), a);
			have |= 2;
		} else if (nn == 9 && memcmp(name, "Signature", 9) == 0) {
			rc = parse_signature(val, (size_t)(vend - val), a);
			have |= 4;
		} else {
			rc = -EINVAL;
		}
		if (rc)
			return rc;
	}
	return have == 7 ? 0 : -EINVAL;
}

int stk_s3_auth_parse_query(const struct stk_s3_target *t, struct stk_s3_auth *a)
{
	const char *alg, *cred, *date, *exp, *sh, *sig;
	uint64_t e = 0;
	int rc;

	memset(a, 0, sizeof(*a));
	sig = stk_s3_param(t, "X-Amz-Signature");
	if (!sig)
		return -ENOENT;
	alg = stk_s3_param(t, "X-Amz-Algorithm");
	cred = stk_s3_param(t, "X-Amz-Credential");
	date = stk_s3_param(t, "X-Amz-Date");
	exp = stk_s3_param(t, "X-Amz-Expires");
	sh = stk_s3_param(t, "X-Amz-SignedHeaders");
	if (!alg || !cred || !date || !exp || !sh)
		return -EINVAL;
	if (strcmp(alg, "AWS4-HMAC-SHA256") != 0)
		return -ENOTSUP;
	rc = parse_credential(cred, strlen(cred), a);
	if (!rc)
		rc = parse_signed_headers(sh, strlen(sh), a);
	if (!rc)
		rc = parse_signature(sig, strlen(sig), a);
	if (rc)
		return rc;
	if (strlen(date) != 16)
		return -EINVAL;
	memcpy(a->amz_date, date, 17);
	if (strlen(exp) > 7 || !all_digits(exp, strlen(exp)))
		return -EINVAL;
	for (const char *c = exp; *c; c++)
		e = e * 10 + (uint64_t)(*c - '0');
	if (e > 604800)
		return -EINVAL;
	a->expires = e;
	a->presigned = 1;
	return 0;
}

/* Appends a header value trimmed and with runs of spaces collapsed to one. */
static void add_trimmed(struct stk_s3_buf *b, const char *v)
{
	int space = 0;

	while (*v == ' ' || *v == '\t')
		v++;
	for (; *v; v++) {
		if (*v == ' ' || *v == '\t') {
			space = 1;
			continue;
		}
		if (space)
			stk_s3_buf_add(b, " ", 1);
		space = 0;
		stk_s3_buf_add(b, v, 1);
	}
}

struct qent {
	size_t name; /* offsets into the scratch buffer */
	size_t value;
};

static int cmp_qent_r(const void *x, const void *y, void *base)
{
	const struct qent *a = x, *b = y;
	const char *s = base;
	int c = strcmp(s + a->name, s + b->name);
	return c ? c : strcmp(s + a->value, s + b->value);
}

int stk_s3_canonical_request(struct stk_s3_buf *out, const char *method,
			     const struct stk_s3_target *t, const struct stk_s3_auth *a,
			     stk_s3_header_fn hdr, void *ctx, const char *payload_hash)
{
	struct stk_s3_buf scratch;
	struct qent ents[STK_S3_PARAMS_MAX];
	unsigned n = 0;
	const char *p;
	int host = 0, rc = 0;

	stk_s3_buf_init(&scratch, 4 * STK_S3_URI_MAX);
	stk_s3_buf_str(out, method);
	stk_s3_buf_add(out, "\n", 1);
	stk_s3_buf_uri(out, t->path, strlen(t->path), 1);
	stk_s3_buf_add(out, "\n", 1);

	/* Canonical query: every parameter encoded, sorted by name then value. */
	for (unsigned i = 0; i < t->nparams; i++) {
		if (a->presigned && strcmp(t->params[i].name, "X-Amz-Signature") == 0)
			continue;
		ents[n].name = scratch.len;
		stk_s3_buf_uri(&scratch, t->params[i].name, strlen(t->params[i].name), 0);
		stk_s3_buf_add(&scratch, "", 1);
		ents[n].value = scratch.len;
		stk_s3_buf_uri(&scratch, t->params[i].value, strlen(t->params[i].value), 0);
		stk_s3_buf_add(&scratch, "", 1);
		n++;
	}
	if (scratch.err) {
		rc = scratch.err;
		goto out;
	}
	if (n > 1)
		qsort_r(ents, n, sizeof(ents[0]), cmp_qent_r, scratch.p);
	for (unsigned i = 0; i < n; i++) {
		if (i)
			stk_s3_buf_add(out, "&", 1);
		stk_s3_buf_str(out, scratch.p + ents[i].name);
		stk_s3_buf_add(out, "=", 1);
		stk_s3_buf_str(out, scratch.p + ents[i].value);
	}
	stk_s3_buf_add(out, "\n", 1);

	/* Canonical headers, in the order SignedHeaders lists them. */
	p = a->signed_headers;
	while (*p) {
		const char *semi = strchr(p, ';');
		size_t nl = semi ? (size_t)(semi - p) : strlen(p);
		char name[128];
		const char *v;

		if (nl == 0 || nl >= sizeof(name)) {
			rc = -EINVAL;
			goto out;
		}
		memcpy(name, p, nl);
		name[nl] = 0;
		if (strcmp(name, "host") == 0)
			host = 1;
		v = hdr(ctx, name);
		if (!v) {
			rc = -EINVAL;
			goto out;
		}
		stk_s3_buf_str(out, name);
		stk_s3_buf_add(out, ":", 1);
		add_trimmed(out, v);
		stk_s3_buf_add(out, "\n", 1);
		p += nl;
		if (*p == ';')
			p++;
	}
	if (!host) {
		rc = -EINVAL;
		goto out;
	}
	stk_s3_buf_add(out, "\n", 1);
	stk_s3_buf_str(out, a->signed_headers);
	stk_s3_buf_add(out, "\n", 1);
	stk_s3_buf_str(out, payload_hash);
	rc = out->err;
out:
	stk_s3_buf_free(&scratch);
	return rc;
}

void stk_s3_hex(const uint8_t *p, size_t n, char *out)
{
	static const char hex[] = "0123456789abcdef";

	for (size_t i = 0; i < n; i++) {
		out[2 * i] = hex[p[i] >> 4];
		out[2 * i + 1] = hex[p[i] & 15];
	}
	out[2 * n] = 0;
}

void stk_s3_sha256_hex(const void *p, size_t n, char out[65])
{
	uint8_t md[SHA256_DIGEST_LENGTH];

	SHA256(p, n, md);
	stk_s3_hex(md, sizeof(md), out);
}

static void hmac(const void *key, size_t klen, const void *msg, size_t mlen, uint8_t out[32])
{
	unsigned int olen = 32;

	HMAC(EVP_sha256(), key, (int)klen, msg, mlen, out, &olen);
}

void stk_s3_signing_key(const char *secret, const struct stk_s3_auth *a, uint8_t key[32])
{
	char k0[256];
	uint8_t k1[32], k2[32], k3[32];
	int n = snprintf(k0, sizeof(k0), "AWS4%s", secret);

	if (n < 0 || (size_t)n >= sizeof(k0))
		n = (int)sizeof(k0) - 1; /* secrets are checked to be short when loaded */
	hmac(k0, (size_t)n, a->date, strlen(a->date), k1);
	hmac(k1, 32, a->region, strlen(a->region), k2);
	hmac(k2, 32, a->service, strlen(a->service), k3);
	hmac(k3, 32, "aws4_request", 12, key);
	OPENSSL_cleanse(k0, sizeof(k0));
}

static void sign_string(const uint8_t key[32], const char *s, size_t n, char out[65])
{
	uint8_t md[32];

	hmac(key, 32, s, n, md);
	stk_s3_hex(md, 32, out);
}

void stk_s3_signature(const uint8_t key[32], const char *amz_date, const struct stk_s3_auth *a,
		      const char *canonical, size_t len, char out[65])
{
	char hash[65], sts[512];
	int n;

	stk_s3_sha256_hex(canonical, len, hash);
	n = snprintf(sts, sizeof(sts), "AWS4-HMAC-SHA256\n%s\n%s/%s/%s/aws4_request\n%s", amz_date,
		     a->date, a->region, a->service, hash);
	if (n < 0 || (size_t)n >= sizeof(sts))
		n = 0; /* cannot happen: every field has a bounded size */
	sign_string(key, sts, (size_t)n, out);
}

void stk_s3_chunk_signature(const uint8_t key[32], const char *amz_date,
			    const struct stk_s3_auth *a, const char *prev,
			    const char *chunk_hash_hex, char out[65])
{
	static const char empty[] =
	    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
	char sts[640];
	int n;

	n = snprintf(sts, sizeof(sts),
		     "AWS4-HMAC-SHA256-PAYLOAD\n%s\n%s/%s/%s/aws4_request\n%s\n%s\n%s", amz_date,
		     a->date, a->region, a->service, prev, empty, chunk_hash_hex);
	if (n < 0 || (size_t)n >= sizeof(sts))
		n = 0;
	sign_string(key, sts, (size_t)n, out);
}

int stk_s3_secure_eq(const char *a, const char *b)
{
	size_t n = strlen(a);

	if (n != strlen(b))
		return 0;
	return CRYPTO_memcmp(a, b, n) == 0;
}

/* ---- aws-chunked bodies ---- */

enum { CH_HDR, CH_DATA, CH_CR, CH_LF, CH_TRAILER, CH_DONE };

void stk_s3_chunked_init(struct stk_s3_chunked *c, int signed_chunks)
{
	memset(c, 0, sizeof(*c));
	c->signed_chunks = signed_chunks;
}

/*
 * Collects one CRLF-terminated line. Returns 1 when c->line holds a whole line (CR
 * and LF removed), 0 when more bytes are needed, -EINVAL for an overlong line, a
 * NUL, or a LF without CR.
 */
static int take_line(struct stk_s3_chunked *c, const char **p, const char *end)
{
	while (*p < end) {
		char ch = *(*p)++;
		if (ch == '\n') {
			if (c->llen == 0 || c->line[c->llen - 1] != '\r')
				return -EINVAL;
			c->line[--c->llen] = 0;
			return 1;
		}
		if (ch == 0 || c->llen >= STK_S3_CHUNK_LINE_MAX)
			return -EINVAL;
		c->line[c->llen++] = ch;
	}
	return 0;
}

static int chunk_header(struct stk_s3_chunked *c, const struct stk_s3_chunked_ops *ops, void *ctx)
{
	static const char ext[] = ";chunk-signature=";
	const char *p = c->line, *sig = "";
	uint64_t size = 0;
	int digits = 0, rc;

	for (; hexval(*p) >= 0; p++) {
		if (++digits > 11) /* 2^44 bytes: far more than one chunk can be */
			return -EINVAL;
		size = size * 16 + (uint64_t)hexval(*p);
	}
	if (!digits)
		return -EINVAL;
	if (strncmp(p, ext, sizeof(ext) - 1) == 0) {
		sig = p + sizeof(ext) - 1;
		if (strlen(sig) != 64 || !all_hex_lower(sig, 64))
			return -EINVAL;
	} else if (*p) {
		return -EINVAL;
	}
	if (c->signed_chunks && !*sig)
		return -EINVAL;
	rc = ops->start(ctx, size, sig);
	if (rc)
		return rc;
	c->left = size;
	c->state = size ? CH_DATA : CH_TRAILER;
	return 0;
}

int stk_s3_chunked_feed(struct stk_s3_chunked *c, const char *p, size_t n,
			const struct stk_s3_chunked_ops *ops, void *ctx)
{
	const char *end = p + n;
	int rc;

	while (p < end) {
		switch (c->state) {
		case CH_HDR:
			rc = take_line(c, &p, end);
			if (rc <= 0)
				return rc;
			c->llen = 0;
			rc = chunk_header(c, ops, ctx);
			if (rc)
				return rc;
			break;
		case CH_DATA: {
			size_t k =
			    c->left < (uint64_t)(end - p) ? (size_t)c->left : (size_t)(end - p);
			rc = ops->data(ctx, p, k);
			if (rc)
				return rc;
			p += k;
			c->left -= k;
			c->total += k;
			if (!c->left)
				c->state = CH_CR;
			break;
		}
		case CH_CR:
			if (*p++ != '\r')
				return -EINVAL;
			c->state = CH_LF;
			break;
		case CH_LF:
			if (*p++ != '\n')
				return -EINVAL;
			rc = ops->end(ctx);
			if (rc)
				return rc;
			c->state = CH_HDR;
			break;
		case CH_TRAILER:
			rc = take_line(c, &p, end);
			if (rc <= 0)
				return rc;
			c->llen = 0;
			if (!c->line[0]) {
				rc = ops->end(ctx);
				if (rc)
					return rc;
				c->state = CH_DONE;
				c->done = 1;
				break;
			}
			if (++c->trailers > 16 || !strchr(c->line, ':'))
				return -EINVAL;
			if (ops->trailer) {
				rc = ops->trailer(ctx, c->line);
				if (rc)
					return rc;
			}
			break;
		default:
			return -EINVAL; /* bytes after the end */
		}
	}
	return 0;
}

/* ---- dates ---- */

static const char *const g_wday[] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
static const char *const g_mon[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
				    "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};

/* Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm). */
static int64_t days_from_civil(int64_t y, unsigned m, unsigned d)
{
	int64_t era;
	unsigned yoe, doy, doe;

	y -= m <= 2;
	era = (y >= 0 ? y : y - 399) / 400;
	yoe = (unsigned)(y - era * 400);
	doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;
	doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
	return era * 146097 + (int64_t)doe - 719468;
}

static int make_time(int64_t y, int mon, int d, int h, int mi, int s, int64_t *t)
{
	static const int mdays[] = {31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};

	if (y < 1970 || y > 9999 || mon < 1 || mon > 12 || d < 1 || d > mdays[mon - 1] || h > 23 ||
	    mi > 59 || s > 60 || h < 0 || mi < 0 || s < 0)
		return -EINVAL;
	*t = days_from_civil(y, (unsigned)mon, (unsigned)d) * 86400 + h * 3600 + mi * 60 + s;
	return 0;
}

/* Reads exactly n digits at *p. */
static int num(const char **p, int n, int *out)
{
	int v = 0;

	for (int i = 0; i < n; i++) {
		char c = (*p)[i];
		if (c < '0' || c > '9')
			return -EINVAL;
		v = v * 10 + (c - '0');
	}
	*p += n;
	*out = v;
	return 0;
}

static int lit(const char **p, const char *s)
{
	size_t n = strlen(s);

	if (strncmp(*p, s, n) != 0)
		return -EINVAL;
	*p += n;
	return 0;
}

static int month(const char **p, int *m)
{
	for (int i = 0; i < 12; i++)
		if (strncmp(*p, g_mon[i], 3) == 0) {
			*p += 3;
			*m = i + 1;
			return 0;
		}
	return -EINVAL;
}

int stk_s3_amz_date_parse(const char *s, int64_t *t)
{
	int y, mo, d, h, mi, se;
	const char *p = s;

	if (strnlen(s, 17) != 16)
		return -EINVAL;
	if (num(&p, 4, &y) || num(&p, 2, &mo) || num(&p, 2, &d) || lit(&p, "T") || num(&p, 2, &h) ||
	    num(&p, 2, &mi) || num(&p, 2, &se) || lit(&p, "Z"))
		return -EINVAL;
	return make_time(y, mo, d, h, mi, se, t);
}

static int clock_part(const char **p, int *h, int *mi, int *s)
{
	if (num(p, 2, h) || lit(p, ":") || num(p, 2, mi) || lit(p, ":") || num(p, 2, s))
		return -EINVAL;
	return 0;
}

int stk_s3_http_date_parse(const char *s, int64_t *t)
{
	const char *p = s;
	int y, mo, d, h, mi, se, wd = -1;

	if (strnlen(s, 64) >= 64)
		return -EINVAL;
	for (int i = 0; i < 7; i++)
		if (strncmp(p, g_wday[i], 3) == 0)
			wd = i;
	if (wd < 0)
		return -EINVAL;
	p += 3;
	if (*p == ',') { /* IMF-fixdate: "Sun, 06 Nov 1994 08:49:37 GMT" */
		p++;
		if (lit(&p, " ") || num(&p, 2, &d) || lit(&p, " ") || month(&p, &mo) ||
		    lit(&p, " ") || num(&p, 4, &y) || lit(&p, " ") ||
		    clock_part(&p, &h, &mi, &se) || lit(&p, " GMT") || *p)
			return -EINVAL;
		return make_time(y, mo, d, h, mi, se, t);
	}
	if (*p == ' ') { /* asctime: "Sun Nov  6 08:49:37 1994" */
		p++;
		if (month(&p, &mo) || lit(&p, " "))
			return -EINVAL;
		if (*p == ' ') {
			p++;
			if (num(&p, 1, &d))
				return -EINVAL;
		} else if (num(&p, 2, &d)) {
			return -EINVAL;
		}
		if (lit(&p, " ") || clock_part(&p, &h, &mi, &se) || lit(&p, " ") ||
		    num(&p, 4, &y) || *p)
			return -EINVAL;
		return make_time(y, mo, d, h, mi, se, t);
	}
	/* RFC 850: "Sunday, 06-Nov-94 08:49:37 GMT" */
	while ((*p >= 'a' && *p <= 'z'))
		p++;
	if (lit(&p, ", ") || num(&p, 2, &d) || lit(&p, "-") || month(&p, &mo) || lit(&p, "-") ||
	    num(&p, 2, &y) || lit(&p, " ") || clock_part(&p, &h, &mi, &se) || lit(&p, " GMT") || *p)
		return -EINVAL;
	y += y < 70 ? 2000 : 1900;
	return make_time(y, mo, d, h, mi, se, t);
}

void stk_s3_http_date(int64_t t, char *out, size_t len)
{
	time_t tt = (time_t)t;
	struct tm tm;

	gmtime_r(&tt, &tm);
	snprintf(out, len, "%s, %02d %s %04d %02d:%02d:%02d GMT", g_wday[tm.tm_wday % 7],
		 tm.tm_mday, g_mon[tm.tm_mon % 12], tm.tm_year + 1900, tm.tm_hour, tm.tm_min,
		 tm.tm_sec);
}

void stk_s3_iso_date(int64_t t, char *out, size_t len)
{
	time_t tt = (time_t)t;
	struct tm tm;

	gmtime_r(&tt, &tm);
	snprintf(out, len, "%04d-%02d-%02dT%02d:%02d:%02d.000Z", tm.tm_year + 1900, tm.tm_mon + 1,
		 tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec);
}

/* ---- conditions ---- */

/* Up to 19 digits at *p into *out; 0 or -EINVAL (no digit, too many). */
static int u64_digits(const char **p, uint64_t *out)
{
	uint64_t v = 0;
	int n = 0;

	while (**p >= '0' && **p <= '9') {
		if (++n > 19)
			return -EINVAL;
		v = v * 10 + (uint64_t)(**p - '0');
		(*p)++;
	}
	*out = v;
	return n ? 0 : -EINVAL;
}

int stk_s3_copy_range_parse(const char *v, uint64_t size, uint64_t *off, uint64_t *len)
{
	uint64_t n[2] = {0, 0};
	const char *p = v;

	if (strncmp(p, "bytes=", 6) != 0)
		return -EINVAL;
	p += 6;
	for (int i = 0; i < 2; i++) {
		const char *start = p;
		for (; *p >= '0' && *p <= '9'; p++) {
			if (p - start >= 19)
				return -EINVAL; /* past any object's size, and uint64_t's */
			n[i] = n[i] * 10 + (uint64_t)(*p - '0');
		}
		if (p == start || *p != (i == 0 ? '-' : '\0'))
			return -EINVAL;
		p++;
	}
	if (n[0] > n[1])
		return -EINVAL;
	if (n[1] >= size)
		return -ERANGE;
	*off = n[0];
	*len = n[1] - n[0] + 1;
	return 0;
}

int stk_s3_range_parse(const char *v, uint64_t size, uint64_t *off, uint64_t *len)
{
	const char *p = v;
	uint64_t a, b;

	if (strncasecmp(p, "bytes=", 6) != 0)
		return 1;
	p += 6;
	while (*p == ' ')
		p++;
	if (*p == '-') { /* the last N bytes */
		p++;
		if (u64_digits(&p, &b))
			return 1;
		while (*p == ' ')
			p++;
		if (*p)
			return 1;
		if (b == 0 || size == 0)
			return -ERANGE;
		*len = b < size ? b : size;
		*off = size - *len;
		return 0;
	}
	if (u64_digits(&p, &a) || *p++ != '-')
		return 1;
	if (*p >= '0' && *p <= '9') {
		if (u64_digits(&p, &b) || b < a)
			return 1;
	} else {
		b = UINT64_MAX;
	}
	while (*p == ' ')
		p++;
	if (*p)
		return 1; /* several ranges, or garbage: serve the whole object */
	if (a >= size)
		return -ERANGE;
	if (b >= size)
		b = size - 1;
	*off = a;
	*len = b - a + 1;
	return 0;
}

int stk_s3_etag_match(const char *v, const char *etag)
{
	const char *want = etag;
	size_t wn = strlen(etag);

	if (wn >= 2 && want[0] == '"' && want[wn - 1] == '"') {
		want++;
		wn -= 2;
	}
	while (*v) {
		const char *s, *e;

		while (*v == ' ' || *v == ',' || *v == '\t')
			v++;
		if (!*v)
			break;
		if (*v == '*')
			return 1;
		if (v[0] == 'W' && v[1] == '/')
			v += 2;
		if (*v == '"') {
			s = ++v;
			e = strchr(v, '"');
			if (!e)
				return 0;
			v = e + 1;
		} else {
			s = v;
			while (*v && *v != ',' && *v != ' ')
				v++;
			e = v;
		}
		if ((size_t)(e - s) == wn && memcmp(s, want, wn) == 0)
			return 1;
	}
	return 0;
}

/* ---- XML request bodies ---- */

#define XML_DEPTH_MAX 8
#define XML_NAME_MAX 64
#define XML_TEXT_MAX (STK_S3_KEY_MAX * 4 + 64)

/*
 * A small frame over Expat: it keeps the element path and the text of the
 * innermost element, refuses DTDs, bounds depth and text, and hands each closed
 * element to `close`. The root element's name is checked against `root`.
 */
struct xml_walk {
	XML_Parser parser;
	const char *root;
	int depth;
	char path[XML_DEPTH_MAX + 1][XML_NAME_MAX + 1];
	struct stk_s3_buf text;
	int err;
	int (*close)(struct xml_walk *w, void *user);
	void *user;
};

static void xml_fail(struct xml_walk *w, int err)
{
	if (!w->err)
		w->err = err;
	XML_StopParser(w->parser, XML_FALSE);
}

static void XMLCALL xml_start(void *ud, const XML_Char *name, const XML_Char **attrs)
{
	struct xml_walk *w = ud;

	(void)attrs;
	if (w->err)
		return;
	if (w->depth >= XML_DEPTH_MAX || strlen(name) > XML_NAME_MAX) {
		xml_fail(w, -EINVAL);
		return;
	}
	if (w->depth == 0 && strcmp(name, w->root) != 0) {
		xml_fail(w, -EINVAL);
		return;
	}
	w->depth++;
	snprintf(w->path[w->depth], sizeof(w->path[0]), "%s", name);
	w->text.len = 0;
	if (w->text.p)
		w->text.p[0] = 0;
}

static void XMLCALL xml_text(void *ud, const XML_Char *s, int len)
{
	struct xml_walk *w = ud;

	if (w->err || w->depth == 0 || len <= 0)
		return;
	stk_s3_buf_add(&w->text, s, (size_t)len);
	if (w->text.err)
		xml_fail(w, -EINVAL);
}

static void XMLCALL xml_end(void *ud, const XML_Char *name)
{
	struct xml_walk *w = ud;
	int rc;

	(void)name;
	if (w->err)
		return;
	if (!w->text.p)
		stk_s3_buf_add(&w->text, "", 0);
	if (w->text.err) {
		xml_fail(w, w->text.err);
		return;
	}
	rc = w->close(w, w->user);
	if (rc) {
		xml_fail(w, rc);
		return;
	}
	w->depth--;
	w->text.len = 0;
	w->text.p[0] = 0;
}

static void XMLCALL xml_doctype(void *ud, const XML_Char *name, const XML_Char *sysid,
				const XML_Char *pubid, int has_internal_subset)
{
	(void)name;
	(void)sysid;
	(void)pubid;
	(void)has_internal_subset;
	xml_fail(ud, -EINVAL);
}

/* Parses p[0..n) with w; -EINVAL for anything not well-formed or rejected. */
static int xml_run(struct xml_walk *w, const char *p, size_t n)
{
	int rc = 0;

	if (n > (size_t)INT32_MAX)
		return -E2BIG;
	w->parser = XML_ParserCreate("UTF-8");
	if (!w->parser)
		return -ENOMEM;
	stk_s3_buf_init(&w->text, XML_TEXT_MAX);
	XML_SetUserData(w->parser, w);
	XML_SetElementHandler(w->parser, xml_start, xml_end);
	XML_SetCharacterDataHandler(w->parser, xml_text);
	XML_SetStartDoctypeDeclHandler(w->parser, xml_doctype);
	if (XML_Parse(w->parser, p, (int)n, XML_TRUE) != XML_STATUS_OK)
		rc = w->err ? w->err : -EINVAL;
	else if (w->err)
		rc = w->err;
	XML_ParserFree(w->parser);
	stk_s3_buf_free(&w->text);
	return rc;
}

/* Copies text trimmed of XML whitespace into dst (len bytes); -EINVAL if too long. */
static int trimmed(const char *s, char *dst, size_t len)
{
	size_t n;

	while (*s == ' ' || *s == '\t' || *s == '\r' || *s == '\n')
		s++;
	n = strlen(s);
	while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r' || s[n - 1] == '\n'))
		n--;
	return copy_span(dst, len, s, n) ? -EINVAL : 0;
}

struct complete_state {
	struct stk_s3_part_ref *parts;
	unsigned n, cap;
	struct stk_s3_part_ref cur;
	int have_num, have_etag;
};

static int complete_close(struct xml_walk *w, void *user)
{
	struct complete_state *st = user;
	char buf[STK_S3_ETAG_MAX + 3];

	if (w->depth == 3 && strcmp(w->path[2], "Part") == 0) {
		if (strcmp(w->path[3], "PartNumber") == 0) {
			const char *p;
			uint64_t v;
			if (trimmed(w->text.p, buf, sizeof(buf)))
				return -EINVAL;
			p = buf;
			if (u64_digits(&p, &v) || *p || v < 1 || v > STK_S3_MAX_PARTS)
				return -EINVAL;
			st->cur.number = (uint32_t)v;
			st->have_num = 1;
		} else if (strcmp(w->path[3], "ETag") == 0) {
			size_t n;
			const char *s = buf;
			if (trimmed(w->text.p, buf, sizeof(buf)))
				return -EINVAL;
			n = strlen(buf);
			if (n >= 2 && buf[0] == '"' && buf[n - 1] == '"') {
				s = buf + 1;
				n -= 2;
			}
			if (n == 0 || copy_span(st->cur.etag, sizeof(st->cur.etag), s, n))
				return -EINVAL;
			st->have_etag = 1;
		}
	} else if (w->depth == 2 && strcmp(w->path[2], "Part") == 0) {
		if (!st->have_num || !st->have_etag)
			return -EINVAL;
		if (st->n == STK_S3_MAX_PARTS)
			return -E2BIG;
		if (st->n == st->cap) {
			unsigned cap = st->cap ? st->cap * 2 : 16;
			struct stk_s3_part_ref *np = realloc(st->parts, cap * sizeof(*np));
			if (!np)
				return -ENOMEM;
			st->parts = np;
			st->cap = cap;
		}
		st->parts[st->n++] = st->cur;
		memset(&st->cur, 0, sizeof(st->cur));
		st->have_num = st->have_etag = 0;
	}
	return 0;
}

int stk_s3_xml_complete(const char *p, size_t n, struct stk_s3_part_ref **parts, unsigned *nparts)
{
	struct complete_state st;
	struct xml_walk w;
	int rc;

	memset(&st, 0, sizeof(st));
	memset(&w, 0, sizeof(w));
	w.root = "CompleteMultipartUpload";
	w.close = complete_close;
	w.user = &st;
	rc = xml_run(&w, p, n);
	if (!rc && st.n == 0)
		rc = -EINVAL;
	if (rc) {
		free(st.parts);
		return rc;
	}
	*parts = st.parts;
	*nparts = st.n;
	return 0;
}

struct delete_state {
	struct stk_s3_delete_req *d;
	unsigned cap;
	char *cur;
};

static int delete_close(struct xml_walk *w, void *user)
{
	struct delete_state *st = user;
	struct stk_s3_delete_req *d = st->d;

	if (w->depth == 2 && strcmp(w->path[2], "Quiet") == 0) {
		char b[8];
		if (trimmed(w->text.p, b, sizeof(b)))
			return -EINVAL;
		if (strcmp(b, "true") == 0)
			d->quiet = 1;
		else if (strcmp(b, "false") == 0)
			d->quiet = 0;
		else
			return -EINVAL;
	} else if (w->depth == 3 && strcmp(w->path[2], "Object") == 0 &&
		   strcmp(w->path[3], "Key") == 0) {
		/* Keys are taken as written: whitespace is part of an S3 key. */
		if (st->cur || w->text.len > STK_S3_KEY_MAX)
			return -EINVAL;
		st->cur = strdup(w->text.p);
		if (!st->cur)
			return -ENOMEM;
	} else if (w->depth == 2 && strcmp(w->path[2], "Object") == 0) {
		if (!st->cur)
			return -EINVAL;
		if (d->n == STK_S3_MAX_DELETE)
			return -E2BIG;
		if (d->n == st->cap) {
			unsigned cap = st->cap ? st->cap * 2 : 16;
			char **nk = realloc(d->keys, cap * sizeof(*nk));
			if (!nk)
				return -ENOMEM;
			d->keys = nk;
			st->cap = cap;
		}
		d->keys[d->n++] = st->cur;
		st->cur = NULL;
	}
	return 0;
}

int stk_s3_xml_delete(const char *p, size_t n, struct stk_s3_delete_req *out)
{
	struct delete_state st;
	struct xml_walk w;
	int rc;

	memset(out, 0, sizeof(*out));
	memset(&st, 0, sizeof(st));
	memset(&w, 0, sizeof(w));
	st.d = out;
	w.root = "Delete";
	w.close = delete_close;
	w.user = &st;
	rc = xml_run(&w, p, n);
	free(st.cur);
	if (!rc && out->n == 0)
		rc = -EINVAL;
	if (rc)
		stk_s3_delete_req_free(out);
	return rc;
}

void stk_s3_delete_req_free(struct stk_s3_delete_req *d)
{
	for (unsigned i = 0; i < d->n; i++)
		free(d->keys[i]);
	free(d->keys);
	memset(d, 0, sizeof(*d));
}

struct bucket_state {
	char *region;
	size_t len;
};

static int bucket_close(struct xml_walk *w, void *user)
{
	struct bucket_state *st = user;

	if (w->depth == 2 && strcmp(w->path[2], "LocationConstraint") == 0)
		return trimmed(w->text.p, st->region, st->len);
	return 0;
}

int stk_s3_xml_create_bucket(const char *p, size_t n, char *region, size_t len)
{
	struct bucket_state st = {region, len};
	struct xml_walk w;
	size_t i;

	region[0] = 0;
	for (i = 0; i < n; i++)
		if (!isspace((unsigned char)p[i]))
			break;
	if (i == n)
		return 0;
	memset(&w, 0, sizeof(w));
	w.root = "CreateBucketConfiguration";
	w.close = bucket_close;
	w.user = &st;
	return xml_run(&w, p, n);
}

/* ---- the stored metadata record ---- */

static int line_ok(const char *s)
{
	for (; *s; s++)
		if (*s == '\n' || *s == '\r')
			return 0;
	return 1;
}

int stk_s3_record_add_header(struct stk_s3_record *r, const char *name, const char *value)
{
	size_t nn = strlen(name), vn = strlen(value);

	if (nn == 0)
		return -EINVAL;
	for (const char *c = name; *c; c++)
		if ((unsigned char)*c <= ' ' || *c == ':' || (unsigned char)*c >= 0x7f)
			return -EINVAL;
	if (!line_ok(value))
		return -EINVAL;
	if (r->headers_len + nn + vn + 3 >= sizeof(r->headers))
		return -E2BIG;
	memcpy(r->headers + r->headers_len, name, nn);
	r->headers_len += nn;
	memcpy(r->headers + r->headers_len, ": ", 2);
	r->headers_len += 2;
	memcpy(r->headers + r->headers_len, value, vn);
	r->headers_len += vn;
	r->headers[r->headers_len++] = '\n';
	r->headers[r->headers_len] = 0;
	return 0;
}

int stk_s3_record_encode(const struct stk_s3_record *r, char *out, size_t len)
{
	struct stk_s3_buf b;
	int rc;

	if (!line_ok(r->etag) || !line_ok(r->content_type) || r->headers_len >= sizeof(r->headers))
		return -EINVAL;
	stk_s3_buf_init(&b, len - 1);
	stk_s3_buf_fmt(&b, "s3m1 %llu %llu %lld %u\n%s\n%s\n", (unsigned long long)r->ino,
		       (unsigned long long)r->size, (long long)r->mtime_sec, r->mtime_nsec, r->etag,
		       r->content_type);
	for (const char *k = r->key; *k; k++) {
		unsigned char ch = (unsigned char)*k;
		if (ch < 0x20 || ch == '%' || ch == 0x7f)
			stk_s3_buf_fmt(&b, "%%%02X", ch);
		else
			stk_s3_buf_add(&b, k, 1);
	}
	stk_s3_buf_add(&b, "\n", 1);
	stk_s3_buf_add(&b, r->headers, r->headers_len);
	rc = b.err;
	if (!rc) {
		memcpy(out, b.p, b.len + 1);
		rc = (int)b.len;
	}
	stk_s3_buf_free(&b);
	return rc;
}

/* The next '\n'-terminated line of [*p, end) as [s, s+n); -EINVAL if none. */
static int next_line(const char **p, const char *end, const char **s, size_t *n)
{
	const char *nl = memchr(*p, '\n', (size_t)(end - *p));

	if (!nl)
		return -EINVAL;
	*s = *p;
	*n = (size_t)(nl - *p);
	*p = nl + 1;
	return 0;
}

int stk_s3_record_decode(const char *in, size_t n, struct stk_s3_record *r)
{
	const char *p = in, *end = in + n, *s, *q;
	size_t sl, kn;
	uint64_t v[4];
	int64_t sec;

	memset(r, 0, sizeof(*r));
	if (next_line(&p, end, &s, &sl) || sl < 5 || memcmp(s, "s3m1 ", 5) != 0)
		return -EINVAL;
	q = s + 5;
	for (int i = 0; i < 4; i++) {
		if (u64_digits(&q, &v[i]))
			return -EINVAL;
		if (q < s + sl && *q == ' ')
			q++;
		else if (i < 3)
			return -EINVAL;
	}
	if (q != s + sl || v[2] > INT64_MAX || v[3] > 999999999)
		return -EINVAL;
	sec = (int64_t)v[2];
	r->ino = v[0];
	r->size = v[1];
	r->mtime_sec = sec;
	r->mtime_nsec = (uint32_t)v[3];
	if (next_line(&p, end, &s, &sl) || copy_span(r->etag, sizeof(r->etag), s, sl))
		return -EINVAL;
	if (next_line(&p, end, &s, &sl) ||
	    copy_span(r->content_type, sizeof(r->content_type), s, sl))
		return -EINVAL;
	if (next_line(&p, end, &s, &sl) || stk_s3_uri_decode(s, sl, 0, r->key, sizeof(r->key), &kn))
		return -EINVAL;
	while (p < end) {
		const char *colon;
		if (next_line(&p, end, &s, &sl))
			return -EINVAL;
		colon = memchr(s, ':', sl);
		if (!colon || colon == s || memchr(s, '\r', sl) || memchr(s, 0, sl))
			return -EINVAL;
		if (r->headers_len + sl + 1 >= sizeof(r->headers))
			return -EINVAL;
		memcpy(r->headers + r->headers_len, s, sl);
		r->headers_len += sl;
		r->headers[r->headers_len++] = '\n';
		r->headers[r->headers_len] = 0;
	}
	return 0;
}

/* ---- tokens ---- */

static const char g_b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

int stk_s3_base64_encode(const void *in, size_t n, char *out, size_t outlen)
{
	const uint8_t *p = in;
	size_t need = (n + 2) / 3 * 4, o = 0;

	if (need + 1 > outlen)
		return -E2BIG;
	for (size_t i = 0; i < n; i += 3) {
		uint32_t v = (uint32_t)p[i] << 16;
		if (i + 1 < n)
			v |= (uint32_t)p[i + 1] << 8;
		if (i + 2 < n)
			v |= p[i + 2];
		out[o++] = g_b64[(v >> 18) & 63];
		out[o++] = g_b64[(v >> 12) & 63];
		out[o++] = i + 1 < n ? g_b64[(v >> 6) & 63] : '=';
		out[o++] = i + 2 < n ? g_b64[v & 63] : '=';
	}
	out[o] = 0;
	return (int)o;
}

static int b64val(char c)
{
	const char *p = c ? strchr(g_b64, c) : NULL;
	return p ? (int)(p - g_b64) : -1;
}

int stk_s3_base64_decode(const char *in, void *out, size_t outlen)
{
	size_t n = strlen(in), o = 0;
	uint8_t *q = out;

	if (n % 4)
		return -EINVAL;
	for (size_t i = 0; i < n; i += 4) {
		int v[4], pad = 0;
		uint32_t w;
		for (int j = 0; j < 4; j++) {
			if (in[i + j] == '=' && i + 4 == n && j >= 2) {
				v[j] = 0;
				pad++;
				continue;
			}
			if (pad)
				return -EINVAL;
			v[j] = b64val(in[i + j]);
			if (v[j] < 0)
				return -EINVAL;
		}
		w = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 |
		    (uint32_t)v[3];
		if (o + (size_t)(3 - pad) > outlen)
			return -E2BIG;
		q[o++] = (uint8_t)(w >> 16);
		if (pad < 2)
			q[o++] = (uint8_t)(w >> 8);
		if (pad < 1)
			q[o++] = (uint8_t)w;
	}
	return (int)o;
}

/* ---- access keys and users ---- */

static int keyfield_ok(const char *s, size_t n, size_t max)
{
	if (n == 0 || n > max)
		return 0;
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)s[i] <= ' ' || (unsigned char)s[i] >= 0x7f)
			return 0;
	return 1;
}

static int keyline_u32(const char *v, size_t n, uint32_t *out)
{
	uint64_t x = 0;

	if (n == 0 || n > 10)
		return -EINVAL;
	for (size_t i = 0; i < n; i++) {
		if (v[i] < '0' || v[i] > '9')
			return -EINVAL;
		x = x * 10 + (uint64_t)(v[i] - '0');
	}
	if (x > UINT32_MAX)
		return -EINVAL;
	*out = (uint32_t)x;
	return 0;
}

/* "B1:rw,B2:ro,*:ro" into k's buckets. */
static int keyline_buckets(const char *v, size_t n, struct stk_s3_keyline *k)
{
	size_t i = 0;

	while (i < n) {
		size_t j = i, colon;
		struct stk_s3_user_bucket *b;

		while (j < n && v[j] != ',')
			j++;
		colon = i;
		while (colon < j && v[colon] != ':')
			colon++;
		if (colon == i || colon >= j || colon - i > STK_S3_BUCKET_MAX)
			return -EINVAL;
		if (k->nbuckets == STK_S3_USER_BUCKETS)
			return -E2BIG;
		b = &k->buckets[k->nbuckets];
		memcpy(b->name, v + i, colon - i);
		b->name[colon - i] = 0;
		if (strcmp(b->name, "*") != 0 && stk_s3_bucket_check(b->name))
			return -EINVAL;
		if (j - colon - 1 == 2 && memcmp(v + colon + 1, "rw", 2) == 0)
			b->rw = 1;
		else if (j - colon - 1 == 2 && memcmp(v + colon + 1, "ro", 2) == 0)
			b->rw = 0;
		else
			return -EINVAL;
		k->nbuckets++;
		i = j + 1;
		if (j < n && i == n)
			return -EINVAL; /* a trailing comma */
	}
	return 0;
}

int stk_s3_keyline_parse(const char *line, size_t n, struct stk_s3_keyline *out)
{
	struct stk_s3_keyline k;
	const char *f[8];
	size_t fl[8], i = 0;
	unsigned nf = 0;
	int rc;

	while (i < n) {
		while (i < n && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r'))
			i++;
		if (i == n || line[i] == '#')
			break;
		if (nf == 8)
			return -EINVAL;
		f[nf] = line + i;
		while (i < n && line[i] != ' ' && line[i] != '\t' && line[i] != '\r')
			i++;
		fl[nf] = (size_t)(line + i - f[nf]);
		nf++;
	}
	if (nf == 0)
		return 1;
	if (nf < 2 || !keyfield_ok(f[0], fl[0], 128) || !keyfield_ok(f[1], fl[1], 128))
		return -EINVAL;
	memset(&k, 0, sizeof(k));
	memcpy(k.id, f[0], fl[0]);
	memcpy(k.secret, f[1], fl[1]);
	for (unsigned j = 2; j < nf; j++) {
		const char *eq = memchr(f[j], '=', fl[j]);
		size_t kl, vl;
		const char *v;

		if (!eq)
			return -EINVAL;
		kl = (size_t)(eq - f[j]);
		v = eq + 1;
		vl = fl[j] - kl - 1;
		if (kl == 4 && memcmp(f[j], "user", 4) == 0 && keyfield_ok(v, vl, STK_S3_USER_MAX)) {
			memcpy(k.user, v, vl);
			k.user[vl] = 0;
		} else if (kl == 3 && memcmp(f[j], "uid", 3) == 0) {
			if (keyline_u32(v, vl, &k.uid))
				return -EINVAL;
			k.has_ids |= 1;
		} else if (kl == 3 && memcmp(f[j], "gid", 3) == 0) {
			if (keyline_u32(v, vl, &k.gid))
				return -EINVAL;
			k.has_ids |= 2;
		} else if (kl == 7 && memcmp(f[j], "buckets", 7) == 0) {
			rc = keyline_buckets(v, vl, &k);
			if (rc)
				return rc;
		} else {
			return -EINVAL;
		}
	}
	/* options make a user's key: it needs a name; ids come in pairs */
	if ((nf > 2 && !k.user[0]) || (k.has_ids && k.has_ids != 3))
		return -EINVAL;
	*out = k;
	return 0;
}

int stk_s3_keyline_format(const struct stk_s3_keyline *k, char *out, size_t len)
{
	size_t n;
	int w = snprintf(out, len, "%s %s", k->id, k->secret);

	if (w < 0 || (size_t)w >= len)
		return -E2BIG;
	n = (size_t)w;
	if (k->user[0]) {
		w = snprintf(out + n, len - n, " user=%s", k->user);
		if (w < 0 || (size_t)w >= len - n)
			return -E2BIG;
		n += (size_t)w;
	}
	if (k->has_ids) {
		w = snprintf(out + n, len - n, " uid=%u gid=%u", k->uid, k->gid);
		if (w < 0 || (size_t)w >= len - n)
			return -E2BIG;
		n += (size_t)w;
	}
	for (unsigned i = 0; i < k->nbuckets; i++) {
		w = snprintf(out + n, len - n, "%s%s:%s", i ? "," : " buckets=", k->buckets[i].name,
			     k->buckets[i].rw ? "rw" : "ro");
		if (w < 0 || (size_t)w >= len - n)
			return -E2BIG;
		n += (size_t)w;
	}
	return (int)n;
}

int stk_s3_keyline_access(const struct stk_s3_keyline *k, const char *bucket)
{
	int any = 0;

	if (!k->user[0])
		return 2;
	for (unsigned i = 0; i < k->nbuckets; i++) {
		if (strcmp(k->buckets[i].name, bucket) == 0)
			return k->buckets[i].rw ? 2 : 1;
		if (strcmp(k->buckets[i].name, "*") == 0)
			any = k->buckets[i].rw ? 2 : 1;
	}
	return any;
}
