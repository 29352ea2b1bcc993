/*
 * The S3 client of `stoker sync` (s3client.h): one libcurl easy handle per
 * connection, reset between requests (libcurl keeps the connection open across a
 * reset), path-style URLs, SigV4 from the gateway's signing code so that Stoker
 * has one implementation of it, and listings parsed with Expat.
 *
 * A request is signed over host, x-amz-content-sha256 (the SHA-256 of the body:
 * plain HTTP endpoints then still get a body they can check) and x-amz-date, and
 * retried on a network error or a 500/503 answer, a few times with a growing
 * pause: every call here is idempotent (a repeated Complete answers with the
 * object or NoSuchUpload, which the caller reports).
 */
#include "s3client.h"

#include <curl/curl.h>
#include <errno.h>
#include <expat.h>
#include <inttypes.h>
#include <openssl/crypto.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "../common/util.h"
#include "../gateway/s3_parse.h"
#include "stoker/stoker.h"

#define S3C_TRIES 4
#define S3C_BODY_MAX (64u << 20) /* an XML answer (a listing page is about 300 KiB) */
#define S3C_EMPTY_SHA "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

struct cli_s3 {
	struct cli_s3_conf conf;
	CURL *curl;
	char err[768];
	/* the answer of the request in flight */
	long status;
	struct stk_s3_buf body; /* an XML answer, or an error's */
	char *dst;		/* a GET's bytes go here */
	size_t dstlen, got;
	char etag[CLI_S3_ETAG];
	char last_modified[64];
	uint64_t length;
	int have_length;
	/* the body being sent */
	const char *up;
	size_t uplen, upoff;
	/* signing */
	char amz_date[17];
	const char *payload_hash;
	struct stk_s3_target target; /* large: kept here rather than on the stack */
};

static pthread_once_t g_curl_once = PTHREAD_ONCE_INIT;

static void curl_init_once(void)
{
	curl_global_init(CURL_GLOBAL_DEFAULT);
}

/* ---- configuration ---- */

static void trim(char *s)
{
	size_t n = strlen(s);
	char *p = s;

	while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r' || s[n - 1] == '\n'))
		s[--n] = 0;
	while (*p == ' ' || *p == '\t')
		p++;
	memmove(s, p, strlen(p) + 1);
}

/* Reads aws_access_key_id and friends of [profile] from an AWS credentials file. */
static void creds_file(const char *file, const char *profile, struct cli_s3_conf *c)
{
	char line[8192], section[256] = "";
	FILE *f = fopen(file, "r");

	if (!f)
		return;
	while (fgets(line, sizeof(line), f)) {
		char *eq;
		trim(line);
		if (line[0] == '[') {
			char *end = strchr(line, ']');
			if (end) {
				*end = 0;
				snprintf(section, sizeof(section), "%s", line + 1);
				trim(section);
			}
			continue;
		}
		if (strcmp(section, profile) != 0 || line[0] == '#' || line[0] == ';')
			continue;
		eq = strchr(line, '=');
		if (!eq)
			continue;
		*eq = 0;
		trim(line);
		trim(eq + 1);
		if (strcmp(line, "aws_access_key_id") == 0)
			stk_strlcpy(c->access_key, eq + 1, sizeof(c->access_key));
		else if (strcmp(line, "aws_secret_access_key") == 0)
			stk_strlcpy(c->secret_key, eq + 1, sizeof(c->secret_key));
		else if (strcmp(line, "aws_session_token") == 0)
			stk_strlcpy(c->token, eq + 1, sizeof(c->token));
	}
	fclose(f);
}

int cli_s3_conf_load(const char *endpoint, const char *profile, struct cli_s3_conf *c, char *err,
		     size_t errlen)
{
	const char *v, *ak = getenv("AWS_ACCESS_KEY_ID"), *sk = getenv("AWS_SECRET_ACCESS_KEY");
	const char *host;

	memset(c, 0, sizeof(*c));
	v = getenv("AWS_REGION");
	if (!v || !v[0])
		v = getenv("AWS_DEFAULT_REGION");
	if (stk_strlcpy(c->region, v && v[0] ? v : "us-east-1", sizeof(c->region))) {
		snprintf(err, errlen, "region too long");
		return -EINVAL;
	}
	if (!endpoint || !endpoint[0])
		endpoint = getenv("AWS_ENDPOINT_URL");
	if (endpoint && endpoint[0]) {
		if (stk_strlcpy(c->endpoint, endpoint, sizeof(c->endpoint))) {
			snprintf(err, errlen, "--endpoint too long");
			return -EINVAL;
		}
	} else {
		snprintf(c->endpoint, sizeof(c->endpoint), "https://s3.%s.amazonaws.com",
			 c->region);
	}
	size_t n = strlen(c->endpoint);
	while (n && c->endpoint[n - 1] == '/')
		c->endpoint[--n] = 0;
	if (strncmp(c->endpoint, "http://", 7) == 0)
		host = c->endpoint + 7;
	else if (strncmp(c->endpoint, "https://", 8) == 0)
		host = c->endpoint + 8;
	else
		host = NULL;
	if (!host || !host[0] || strchr(host, '/') || strchr(host, '?') ||
	    stk_strlcpy(c->host, host, sizeof(c->host))) {
		snprintf(err, errlen,
			 "endpoint %s: expected http://HOST[:PORT] or https://HOST[:PORT]",
			 c->endpoint);
		return -EINVAL;
	}
	if (!profile && ak && ak[0] && sk && sk[0]) {
		if (stk_strlcpy(c->access_key, ak, sizeof(c->access_key)) ||
		    stk_strlcpy(c->secret_key, sk, sizeof(c->secret_key))) {
			snprintf(err, errlen,
				 "AWS_ACCESS_KEY_ID or AWS_SECRET_ACCESS_KEY too long");
			return -EINVAL;
		}
		v = getenv("AWS_SESSION_TOKEN");
		if (v)
			stk_strlcpy(c->token, v, sizeof(c->token));
		return 0;
	}
	if (!profile)
		profile = getenv("AWS_PROFILE");
	if (!profile || !profile[0])
		profile = "default";
	char file[4096];
	v = getenv("AWS_SHARED_CREDENTIALS_FILE");
	if (v && v[0])
		snprintf(file, sizeof(file), "%s", v);
	else
		snprintf(file, sizeof(file), "%s/.aws/credentials",
			 getenv("HOME") ? getenv("HOME") : "");
	creds_file(file, profile, c);
	if (!c->access_key[0] || !c->secret_key[0]) {
		snprintf(err, errlen,
			 "no S3 keys: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or give "
			 "profile [%s] aws_access_key_id and aws_secret_access_key in %s",
			 profile, file);
		return -EINVAL;
	}
	return 0;
}

/* ---- connections ---- */

int cli_s3_create(const struct cli_s3_conf *conf, struct cli_s3 **out)
{
	struct cli_s3 *s;

	pthread_once(&g_curl_once, curl_init_once);
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->conf = *conf;
	s->curl = curl_easy_init();
	if (!s->curl) {
		free(s);
		return -ENOMEM;
	}
	stk_s3_buf_init(&s->body, S3C_BODY_MAX);
	*out = s;
	return 0;
}

void cli_s3_destroy(struct cli_s3 *s)
{
	if (!s)
		return;
	curl_easy_cleanup(s->curl);
	stk_s3_buf_free(&s->body);
	OPENSSL_cleanse(s->conf.secret_key, sizeof(s->conf.secret_key));
	free(s);
}

const char *cli_s3_error(const struct cli_s3 *s)
{
	return s->err[0] ? s->err : "unknown error";
}

/* ---- one request ---- */

static size_t on_write(char *p, size_t size, size_t nmemb, void *ctx)
{
	struct cli_s3 *s = ctx;
	size_t n = size * nmemb;
	long status = 0;

	curl_easy_getinfo(s->curl, CURLINFO_RESPONSE_CODE, &status);
	if (s->dst && status / 100 == 2) {
		if (n > s->dstlen - s->got)
			return 0; /* more than asked for: fail the transfer */
		memcpy(s->dst + s->got, p, n);
		s->got += n;
		return n;
	}
	stk_s3_buf_add(&s->body, p, n);
	return s->body.err ? 0 : n;
}

static size_t on_read(char *p, size_t size, size_t nmemb, void *ctx)
{
	struct cli_s3 *s = ctx;
	size_t n = size * nmemb;

	if (n > s->uplen - s->upoff)
		n = s->uplen - s->upoff;
	memcpy(p, s->up + s->upoff, n);
	s->upoff += n;
	return n;
}

static int on_seek(void *ctx, curl_off_t off, int origin)
{
	struct cli_s3 *s = ctx;

	if (origin != SEEK_SET || off < 0 || (size_t)off > s->uplen)
		return CURL_SEEKFUNC_FAIL;
	s->upoff = (size_t)off;
	return CURL_SEEKFUNC_OK;
}

static void header_value(const char *p, size_t n, size_t namelen, char *out, size_t outlen)
{
	p += namelen;
	n -= namelen;
	while (n && (*p == ' ' || *p == '\t')) {
		p++;
		n--;
	}
	while (n && (p[n - 1] == '\r' || p[n - 1] == '\n' || p[n - 1] == ' '))
		n--;
	if (n >= outlen)
		n = outlen - 1;
	memcpy(out, p, n);
	out[n] = 0;
}

static size_t on_header(char *p, size_t size, size_t nmemb, void *ctx)
{
	struct cli_s3 *s = ctx;
	size_t n = size * nmemb;

	if (n > 5 && strncasecmp(p, "etag:", 5) == 0) {
		header_value(p, n, 5, s->etag, sizeof(s->etag));
	} else if (n > 14 && strncasecmp(p, "last-modified:", 14) == 0) {
		header_value(p, n, 14, s->last_modified, sizeof(s->last_modified));
	} else if (n > 15 && strncasecmp(p, "content-length:", 15) == 0) {
		char v[32];
		header_value(p, n, 15, v, sizeof(v));
		s->have_length = stk_parse_u64(v, &s->length) == 0;
	}
	return n;
}

static const char *sign_header(void *ctx, const char *name)
{
	struct cli_s3 *s = ctx;

	if (strcmp(name, "host") == 0)
		return s->conf.host;
	if (strcmp(name, "x-amz-date") == 0)
		return s->amz_date;
	if (strcmp(name, "x-amz-content-sha256") == 0)
		return s->payload_hash;
	if (strcmp(name, "x-amz-security-token") == 0)
		return s->conf.token;
	return NULL;
}

/* S3's <Code> and <Message> of an error answer, for the message. */
static void error_detail(const char *body, size_t len, const char *tag, char *out, size_t outlen)
{
	char open[32], close[32];
	const char *a, *b;

	out[0] = 0;
	if (!body || !len)
		return;
	snprintf(open, sizeof(open), "<%s>", tag);
	snprintf(close, sizeof(close), "</%s>", tag);
	a = strstr(body, open);
	if (!a)
		return;
	a += strlen(open);
	b = strstr(a, close);
	if (!b)
		return;
	snprintf(out, outlen, "%.*s", (int)(b - a), a);
}

static int status_errno(long status)
{
	switch (status) {
	case 401:
	case 403:
		return -EACCES;
	case 404:
		return -ENOENT;
	case 409:
		return -EEXIST;
	case 412:
		return -EAGAIN;
	case 416:
		return -EINVAL;
	default:
		return -EIO;
	}
}

static int curl_errno(CURLcode cc)
{
	switch (cc) {
	case CURLE_COULDNT_CONNECT:
		return -ECONNREFUSED;
	case CURLE_COULDNT_RESOLVE_HOST:
		return -EHOSTUNREACH;
	case CURLE_OPERATION_TIMEDOUT:
		return -ETIMEDOUT;
	default:
		return -EIO;
	}
}

/*
 * Sends one request: method on /bucket[/key][?query] (query: "name=value&..."
 * encoded, or ""), with body (PUT, POST) or into dst (GET), and extra headers.
 * Fills s->status, s->etag, s->body (answers other than a GET's 2xx bytes).
 * Returns 0 for a 2xx answer, else -errno with s->err set.
 */
static int request(struct cli_s3 *s, const char *method, const char *bucket, const char *key,
		   const char *query, const void *body, size_t bodylen, void *dst, size_t dstlen,
		   const char *range, const char *if_match)
{
	struct stk_s3_buf raw, canon, hdr;
	struct stk_s3_auth a;
	struct curl_slist *hl = NULL;
	char url[STK_S3_URI_MAX + 600], sha[65], sig[65];
	uint8_t skey[32];
	CURLcode cc = CURLE_OK;
	int rc = 0;

	stk_s3_buf_init(&raw, STK_S3_URI_MAX);
	stk_s3_buf_init(&canon, 2 * STK_S3_URI_MAX + 8192);
	stk_s3_buf_init(&hdr, 8192);
	stk_s3_buf_add(&raw, "/", 1);
	stk_s3_buf_uri(&raw, bucket, strlen(bucket), 0);
	if (key) {
		stk_s3_buf_add(&raw, "/", 1);
		stk_s3_buf_uri(&raw, key, strlen(key), 1);
	}
	if (query && query[0]) {
		stk_s3_buf_add(&raw, "?", 1);
		stk_s3_buf_str(&raw, query);
	}
	if (raw.err || (raw.len && stk_s3_target_parse(raw.p, raw.len, &s->target))) {
		snprintf(s->err, sizeof(s->err), "key too long or malformed for a request");
		rc = -ENAMETOOLONG;
		goto out;
	}
	snprintf(url, sizeof(url), "%s%s", s->conf.endpoint, raw.p);
	if (body && bodylen)
		stk_s3_sha256_hex(body, bodylen, sha);
	else
		memcpy(sha, S3C_EMPTY_SHA, sizeof(sha));
	s->payload_hash = sha;

	for (int attempt = 0; attempt < S3C_TRIES; attempt++) {
		time_t now = time(NULL);
		struct tm tm;

		if (attempt) {
			/* 0.2, 0.8, 1.8 s: a restarting endpoint has time to come back. */
			usleep((useconds_t)(200000 * attempt * attempt));
		}
		gmtime_r(&now, &tm);
		strftime(s->amz_date, sizeof(s->amz_date), "%Y%m%dT%H%M%SZ", &tm);
		memset(&a, 0, sizeof(a));
		stk_strlcpy(a.access_key, s->conf.access_key, sizeof(a.access_key));
		memcpy(a.date, s->amz_date, 8);
		stk_strlcpy(a.region, s->conf.region, sizeof(a.region));
		stk_strlcpy(a.service, "s3", sizeof(a.service));
		stk_strlcpy(a.signed_headers,
			    s->conf.token[0]
				? "host;x-amz-content-sha256;x-amz-date;x-amz-security-token"
				: "host;x-amz-content-sha256;x-amz-date",
			    sizeof(a.signed_headers));
		canon.len = 0;
		canon.err = 0;
		rc = stk_s3_canonical_request(&canon, method, &s->target, &a, sign_header, s, sha);
		if (rc || canon.err) {
			snprintf(s->err, sizeof(s->err), "cannot sign the request");
			rc = rc ? rc : canon.err;
			goto out;
		}
		stk_s3_signing_key(s->conf.secret_key, &a, skey);
		stk_s3_signature(skey, s->amz_date, &a, canon.p, canon.len, sig);
		memset(skey, 0, sizeof(skey));

		curl_slist_free_all(hl);
		hl = NULL;
		hdr.len = 0;
		hdr.err = 0;
#define ADD_HEADER(...)                                                                            \
	do {                                                                                       \
		hdr.len = 0;                                                                       \
		stk_s3_buf_fmt(&hdr, __VA_ARGS__);                                                 \
		struct curl_slist *nl = hdr.err ? NULL : curl_slist_append(hl, hdr.p);             \
		if (!nl) {                                                                         \
			rc = -ENOMEM;                                                              \
			goto out;                                                                  \
		}                                                                                  \
		hl = nl;                                                                           \
	} while (0)
		ADD_HEADER("Authorization: AWS4-HMAC-SHA256 Credential=%s/%s/%s/s3/aws4_request, "
			   "SignedHeaders=%s, Signature=%s",
			   a.access_key, a.date, a.region, a.signed_headers, sig);
		ADD_HEADER("x-amz-date: %s", s->amz_date);
		ADD_HEADER("x-amz-content-sha256: %s", sha);
		if (s->conf.token[0])
			ADD_HEADER("x-amz-security-token: %s", s->conf.token);
		if (range)
			ADD_HEADER("Range: %s", range);
		if (if_match)
			ADD_HEADER("If-Match: %s", if_match);
		ADD_HEADER("Expect:"); /* no 100-continue round trip */
		if (body && strcmp(method, "POST") == 0)
			ADD_HEADER("Content-Type: application/xml");
#undef ADD_HEADER

		curl_easy_reset(s->curl);
		curl_easy_setopt(s->curl, CURLOPT_URL, url);
		curl_easy_setopt(s->curl, CURLOPT_HTTPHEADER, hl);
		curl_easy_setopt(s->curl, CURLOPT_NOSIGNAL, 1L);
		curl_easy_setopt(s->curl, CURLOPT_CONNECTTIMEOUT, 10L);
		/* A stalled transfer (less than 1 byte/s for 60 s) fails rather than hangs. */
		curl_easy_setopt(s->curl, CURLOPT_LOW_SPEED_LIMIT, 1L);
		curl_easy_setopt(s->curl, CURLOPT_LOW_SPEED_TIME, 60L);
		curl_easy_setopt(s->curl, CURLOPT_WRITEFUNCTION, on_write);
		curl_easy_setopt(s->curl, CURLOPT_WRITEDATA, s);
		curl_easy_setopt(s->curl, CURLOPT_HEADERFUNCTION, on_header);
		curl_easy_setopt(s->curl, CURLOPT_HEADERDATA, s);
		if (strcmp(method, "HEAD") == 0) {
			curl_easy_setopt(s->curl, CURLOPT_NOBODY, 1L);
		} else if (strcmp(method, "PUT") == 0) {
			curl_easy_setopt(s->curl, CURLOPT_UPLOAD, 1L);
			curl_easy_setopt(s->curl, CURLOPT_READFUNCTION, on_read);
			curl_easy_setopt(s->curl, CURLOPT_READDATA, s);
			curl_easy_setopt(s->curl, CURLOPT_SEEKFUNCTION, on_seek);
			curl_easy_setopt(s->curl, CURLOPT_SEEKDATA, s);
			curl_easy_setopt(s->curl, CURLOPT_INFILESIZE_LARGE, (curl_off_t)bodylen);
		} else if (strcmp(method, "POST") == 0) {
			curl_easy_setopt(s->curl, CURLOPT_POST, 1L);
			curl_easy_setopt(s->curl, CURLOPT_POSTFIELDS,
					 body ? (const char *)body : "");
			curl_easy_setopt(s->curl, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)bodylen);
		} else if (strcmp(method, "GET") != 0) {
			curl_easy_setopt(s->curl, CURLOPT_CUSTOMREQUEST, method);
		}
		s->up = body;
		s->uplen = bodylen;
		s->upoff = 0;
		s->dst = dst;
		s->dstlen = dstlen;
		s->got = 0;
		s->status = 0;
		s->etag[0] = 0;
		s->last_modified[0] = 0;
		s->have_length = 0;
		s->body.len = 0;
		s->body.err = 0;
		s->err[0] = 0;
		cc = curl_easy_perform(s->curl);
		if (cc == CURLE_OK)
			curl_easy_getinfo(s->curl, CURLINFO_RESPONSE_CODE, &s->status);
		if (cc == CURLE_OK && s->status != 500 && s->status != 503)
			break;
	}
	if (cc != CURLE_OK) {
		snprintf(s->err, sizeof(s->err), "%s %s: %s", method, s->conf.endpoint,
			 curl_easy_strerror(cc));
		rc = curl_errno(cc);
		goto out;
	}
	if (s->status / 100 != 2) {
		char code[128], msg[512];
		stk_s3_buf_add(&s->body, "", 1); /* NUL-terminated for error_detail */
		error_detail(s->body.p, s->body.len, "Code", code, sizeof(code));
		error_detail(s->body.p, s->body.len, "Message", msg, sizeof(msg));
		if (!code[0] && (s->status == 403 || s->status == 401))
			snprintf(code, sizeof(code), "AccessDenied (bad keys?)");
		else if (!code[0] && s->status == 404)
			snprintf(code, sizeof(code), "NotFound");
		snprintf(s->err, sizeof(s->err), "%s s3://%s%s%s: HTTP %ld %s%s%s", method, bucket,
			 key ? "/" : "", key ? key : "", s->status, code, msg[0] ? ": " : "", msg);
		rc = status_errno(s->status);
		goto out;
	}
	if (s->body.len)
		stk_s3_buf_add(&s->body, "", 1);
out:
	curl_slist_free_all(hl);
	stk_s3_buf_free(&raw);
	stk_s3_buf_free(&canon);
	stk_s3_buf_free(&hdr);
	return rc;
}

/* ---- listing ---- */

struct list_parse {
	int depth;
	int in_contents;
	char field[32];
	struct stk_s3_buf text;
	struct cli_s3_obj obj;
	struct stk_s3_buf key;
	int truncated;
	struct stk_s3_buf next;
	cli_s3_list_fn fn;
	void *ctx;
	int rc;
	XML_Parser xp;
};

static void on_start(void *ud, const XML_Char *name, const XML_Char **attrs)
{
	struct list_parse *lp = ud;

	lp->depth++;
	lp->text.len = 0;
	if (lp->depth == 2 && strcmp(name, "Contents") == 0) {
		lp->in_contents = 1;
		memset(&lp->obj, 0, sizeof(lp->obj));
		lp->key.len = 0;
	}
}

static int64_t iso_time(const char *s)
{
	struct tm tm = {0};
	int y, mo, d, h, mi, se;

	if (sscanf(s, "%d-%d-%dT%d:%d:%d", &y, &mo, &d, &h, &mi, &se) != 6)
		return 0;
	tm.tm_year = y - 1900;
	tm.tm_mon = mo - 1;
	tm.tm_mday = d;
	tm.tm_hour = h;
	tm.tm_min = mi;
	tm.tm_sec = se;
	return (int64_t)timegm(&tm);
}

static void on_end(void *ud, const XML_Char *name)
{
	struct list_parse *lp = ud;

	stk_s3_buf_add(&lp->text, "", 1);
	if (lp->text.err) {
		lp->rc = -ENOMEM;
		XML_StopParser(lp->xp, XML_FALSE);
		return;
	}
	if (lp->in_contents && lp->depth == 3) {
		if (strcmp(name, "Key") == 0) {
			lp->key.len = 0;
			stk_s3_buf_str(&lp->key, lp->text.p);
			stk_s3_buf_add(&lp->key, "", 1);
		} else if (strcmp(name, "Size") == 0) {
			stk_parse_u64(lp->text.p, &lp->obj.size);
		} else if (strcmp(name, "LastModified") == 0) {
			lp->obj.mtime = iso_time(lp->text.p);
		} else if (strcmp(name, "ETag") == 0) {
			stk_strlcpy(lp->obj.etag, lp->text.p, sizeof(lp->obj.etag));
		}
	} else if (lp->depth == 2 && strcmp(name, "Contents") == 0) {
		lp->in_contents = 0;
		if (lp->key.len && !lp->key.err) {
			lp->obj.key = lp->key.p;
			lp->rc = lp->fn(lp->ctx, &lp->obj);
			if (lp->rc)
				XML_StopParser(lp->xp, XML_FALSE);
		}
	} else if (lp->depth == 2 && strcmp(name, "IsTruncated") == 0) {
		lp->truncated = strcmp(lp->text.p, "true") == 0;
	} else if (lp->depth == 2 && strcmp(name, "NextContinuationToken") == 0) {
		lp->next.len = 0;
		stk_s3_buf_str(&lp->next, lp->text.p);
		stk_s3_buf_add(&lp->next, "", 1);
	}
	lp->text.len = 0;
	lp->depth--;
}

static void on_text(void *ud, const XML_Char *p, int n)
{
	struct list_parse *lp = ud;

	if (n > 0)
		stk_s3_buf_add(&lp->text, p, (size_t)n);
}

int cli_s3_list(struct cli_s3 *s, const char *bucket, const char *prefix, cli_s3_list_fn fn,
		void *ctx)
{
	struct list_parse lp = {.fn = fn, .ctx = ctx};
	struct stk_s3_buf q;
	int rc = 0;

	stk_s3_buf_init(&lp.text, STK_S3_URI_MAX);
	stk_s3_buf_init(&lp.key, STK_S3_URI_MAX);
	stk_s3_buf_init(&lp.next, STK_S3_URI_MAX);
	stk_s3_buf_init(&q, 3 * STK_S3_URI_MAX);
	for (;;) {
		/* The parameters in the canonical (sorted) order: c < l < p. */
		q.len = 0;
		if (lp.next.len) {
			stk_s3_buf_str(&q, "continuation-token=");
			stk_s3_buf_uri(&q, lp.next.p, strlen(lp.next.p), 0);
			stk_s3_buf_str(&q, "&");
		}
		stk_s3_buf_str(&q, "list-type=2&prefix=");
		stk_s3_buf_uri(&q, prefix, strlen(prefix), 0);
		stk_s3_buf_add(&q, "", 1);
		if (q.err) {
			snprintf(s->err, sizeof(s->err), "listing: prefix too long");
			rc = -ENAMETOOLONG;
			break;
		}
		rc = request(s, "GET", bucket, NULL, q.p, NULL, 0, NULL, 0, NULL, NULL);
		if (rc)
			break;
		lp.xp = XML_ParserCreate(NULL);
		if (!lp.xp) {
			rc = -ENOMEM;
			break;
		}
		XML_SetUserData(lp.xp, &lp);
		XML_SetElementHandler(lp.xp, on_start, on_end);
		XML_SetCharacterDataHandler(lp.xp, on_text);
		lp.truncated = 0;
		lp.next.len = 0;
		lp.depth = 0;
		lp.rc = 0;
		size_t len = s->body.len ? s->body.len - 1 : 0; /* without the NUL added */
		if (XML_Parse(lp.xp, s->body.p ? s->body.p : "", (int)len, XML_TRUE) ==
			XML_STATUS_ERROR &&
		    !lp.rc) {
			snprintf(s->err, sizeof(s->err), "listing s3://%s: malformed answer: %s",
				 bucket, XML_ErrorString(XML_GetErrorCode(lp.xp)));
			rc = -EPROTO;
		}
		XML_ParserFree(lp.xp);
		if (lp.rc) {
			rc = lp.rc;
			snprintf(s->err, sizeof(s->err), "listing s3://%s: %s", bucket,
				 stk_strerror(rc));
		}
		if (rc || !lp.truncated)
			break;
		if (!lp.next.len) {
			snprintf(s->err, sizeof(s->err),
				 "listing s3://%s: truncated page without a continuation token",
				 bucket);
			rc = -EPROTO;
			break;
		}
	}
	stk_s3_buf_free(&lp.text);
	stk_s3_buf_free(&lp.key);
	stk_s3_buf_free(&lp.next);
	stk_s3_buf_free(&q);
	return rc;
}

/* ---- objects ---- */

int cli_s3_head_bucket(struct cli_s3 *s, const char *bucket)
{
	return request(s, "HEAD", bucket, NULL, NULL, NULL, 0, NULL, 0, NULL, NULL);
}

int cli_s3_head(struct cli_s3 *s, const char *bucket, const char *key, struct cli_s3_obj *o)
{
	int rc = request(s, "HEAD", bucket, key, NULL, NULL, 0, NULL, 0, NULL, NULL);

	if (rc)
		return rc;
	memset(o, 0, sizeof(*o));
	o->size = s->have_length ? s->length : 0;
	stk_strlcpy(o->etag, s->etag, sizeof(o->etag));
	if (s->last_modified[0])
		stk_s3_http_date_parse(s->last_modified, &o->mtime);
	return 0;
}

int cli_s3_get(struct cli_s3 *s, const char *bucket, const char *key, uint64_t off, size_t len,
	       const char *if_match, void *buf)
{
	char range[64];
	int rc;

	if (!len)
		return 0;
	snprintf(range, sizeof(range), "bytes=%" PRIu64 "-%" PRIu64, off, off + len - 1);
	rc = request(s, "GET", bucket, key, NULL, NULL, 0, buf, len, range, if_match);
	if (!rc && s->got != len) {
		snprintf(s->err, sizeof(s->err),
			 "GET s3://%s/%s: %zu bytes of %zu at %" PRIu64 " (the object is shorter)",
			 bucket, key, s->got, len, off);
		rc = -EIO;
	}
	if (rc == -EAGAIN)
		snprintf(s->err, sizeof(s->err), "changed while copied (its ETag is no longer %s)",
			 if_match ? if_match : "");
	return rc;
}

int cli_s3_put(struct cli_s3 *s, const char *bucket, const char *key, const void *buf, size_t len,
	       char etag[CLI_S3_ETAG])
{
	int rc = request(s, "PUT", bucket, key, NULL, buf, len, NULL, 0, NULL, NULL);

	if (!rc)
		stk_strlcpy(etag, s->etag, CLI_S3_ETAG);
	return rc;
}

int cli_s3_delete(struct cli_s3 *s, const char *bucket, const char *key)
{
	return request(s, "DELETE", bucket, key, NULL, NULL, 0, NULL, 0, NULL, NULL);
}

int cli_s3_mpu_create(struct cli_s3 *s, const char *bucket, const char *key, char *id, size_t idlen)
{
	char v[256];
	int rc = request(s, "POST", bucket, key, "uploads=", "", 0, NULL, 0, NULL, NULL);

	if (rc)
		return rc;
	error_detail(s->body.p, s->body.len, "UploadId", v, sizeof(v));
	if (!v[0] || stk_strlcpy(id, v, idlen)) {
		snprintf(s->err, sizeof(s->err),
			 "POST s3://%s/%s?uploads: no UploadId in the answer", bucket, key);
		return -EPROTO;
	}
	return 0;
}

/* Appends a query value encoded (upload ids are hex on the gateway, anything on AWS). */
static int part_query(char *out, size_t len, unsigned part, const char *id)
{
	struct stk_s3_buf b;
	int rc;

	stk_s3_buf_init(&b, len);
	if (part)
		stk_s3_buf_fmt(&b, "partNumber=%u&", part);
	stk_s3_buf_str(&b, "uploadId=");
	stk_s3_buf_uri(&b, id, strlen(id), 0);
	stk_s3_buf_add(&b, "", 1);
	rc = b.err ? -ENAMETOOLONG : stk_strlcpy(out, b.p, len);
	stk_s3_buf_free(&b);
	return rc;
}

int cli_s3_mpu_part(struct cli_s3 *s, const char *bucket, const char *key, const char *id,
		    unsigned part, const void *buf, size_t len, char etag[CLI_S3_ETAG])
{
	char q[1024];
	int rc = part_query(q, sizeof(q), part, id);

	if (rc)
		return rc;
	rc = request(s, "PUT", bucket, key, q, buf, len, NULL, 0, NULL, NULL);
	if (!rc)
		stk_strlcpy(etag, s->etag, CLI_S3_ETAG);
	return rc;
}

int cli_s3_mpu_complete(struct cli_s3 *s, const char *bucket, const char *key, const char *id,
			unsigned nparts, char (*etags)[CLI_S3_ETAG], char etag[CLI_S3_ETAG])
{
	struct stk_s3_buf b;
	char q[1024], v[CLI_S3_ETAG * 2];
	int rc = part_query(q, sizeof(q), 0, id);

	if (rc)
		return rc;
	stk_s3_buf_init(&b, (size_t)nparts * 200 + 128);
	stk_s3_buf_str(&b, "<CompleteMultipartUpload>");
	for (unsigned i = 0; i < nparts; i++) {
		stk_s3_buf_fmt(&b, "<Part><PartNumber>%u</PartNumber>", i + 1);
		stk_s3_buf_elem(&b, "ETag", etags[i]);
		stk_s3_buf_str(&b, "</Part>");
	}
	stk_s3_buf_str(&b, "</CompleteMultipartUpload>");
	if (b.err) {
		stk_s3_buf_free(&b);
		return -ENOMEM;
	}
	rc = request(s, "POST", bucket, key, q, b.p, b.len, NULL, 0, NULL, NULL);
	stk_s3_buf_free(&b);
	if (rc)
		return rc;
	/* S3 may answer 200 with an error in the body after a long Complete. */
	error_detail(s->body.p, s->body.len, "Code", v, sizeof(v));
	if (v[0] && strstr(s->body.p, "<Error>")) {
		snprintf(s->err, sizeof(s->err), "complete s3://%s/%s: %s", bucket, key, v);
		return -EIO;
	}
	error_detail(s->body.p, s->body.len, "ETag", v, sizeof(v));
	/* The ETag comes XML-escaped: &quot;HEX-N&quot; or "HEX-N". */
	if (strncmp(v, "&quot;", 6) == 0) {
		char *end = strstr(v + 6, "&quot;");
		if (end)
			*end = 0;
		snprintf(etag, CLI_S3_ETAG, "\"%s\"", v + 6);
	} else {
		stk_strlcpy(etag, v, CLI_S3_ETAG);
	}
	return 0;
}

int cli_s3_mpu_abort(struct cli_s3 *s, const char *bucket, const char *key, const char *id)
{
	char q[1024];
	int rc = part_query(q, sizeof(q), 0, id);

	if (rc)
		return rc;
	return request(s, "DELETE", bucket, key, q, NULL, 0, NULL, 0, NULL, NULL);
}
