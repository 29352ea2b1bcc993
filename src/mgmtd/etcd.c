/*
 * etcd's v3 JSON gateway over libcurl and Jansson (etcd.h).
 *
 * Each call is one POST with a JSON body; the reply is parsed for the few fields
 * wanted. proto3's JSON leaves out fields at their default (false, 0, empty), so
 * an absent "succeeded" is false and an absent "TTL" is 0. The curl handle is
 * reused (keep-alive) under the handle's lock.
 */
#include "etcd.h"

#include <curl/curl.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/log.h"
#include "../common/util.h"

#define ETCD_MAX_ENDPOINTS 8
#define ETCD_URL_MAX 128
#define ETCD_TIMEOUT_MS 2000L
#define ETCD_MAX_REPLY (512u << 20)

struct stk_etcd {
	pthread_mutex_t lock; /* protects everything below */
	CURL *curl;
	unsigned n, cur;
	char url[ETCD_MAX_ENDPOINTS][ETCD_URL_MAX];
};

struct reply {
	char *buf;
	size_t len, cap;
};

static size_t on_data(char *p, size_t size, size_t n, void *arg)
{
	struct reply *r = arg;
	size_t add = size * n;

	if (r->len + add + 1 > r->cap) {
		size_t cap = r->cap ? r->cap : 4096;
		char *nb;

		while (cap < r->len + add + 1)
			cap *= 2;
		if (cap > ETCD_MAX_REPLY)
			return 0;
		nb = realloc(r->buf, cap);
		if (!nb)
			return 0;
		r->buf = nb;
		r->cap = cap;
	}
	memcpy(r->buf + r->len, p, add);
	r->len += add;
	r->buf[r->len] = 0;
	return add;
}

static int curl_once;

int stk_etcd_create(const char *endpoints, struct stk_etcd **out)
{
	struct stk_etcd *e;
	const char *p = endpoints;

	if (!endpoints || !*endpoints)
		return -EINVAL;
	if (!__atomic_exchange_n(&curl_once, 1, __ATOMIC_SEQ_CST))
		curl_global_init(CURL_GLOBAL_DEFAULT);
	e = calloc(1, sizeof(*e));
	if (!e)
		return -ENOMEM;
	pthread_mutex_init(&e->lock, NULL);
	for (;;) {
		const char *end = strchr(p, ',');
		size_t len = end ? (size_t)(end - p) : strlen(p);
		int has_scheme = len > 7 && strncmp(p, "http://", 7) == 0;

		if (len == 0 || e->n == ETCD_MAX_ENDPOINTS || len + 8 >= ETCD_URL_MAX) {
			stk_etcd_destroy(e);
			return -EINVAL;
		}
		snprintf(e->url[e->n++], ETCD_URL_MAX, "%s%.*s", has_scheme ? "" : "http://",
			 (int)len, p);
		if (!end)
			break;
		p = end + 1;
	}
	e->curl = curl_easy_init();
	if (!e->curl) {
		stk_etcd_destroy(e);
		return -ENOMEM;
	}
	*out = e;
	return 0;
}

void stk_etcd_destroy(struct stk_etcd *e)
{
	if (!e)
		return;
	if (e->curl)
		curl_easy_cleanup(e->curl);
	pthread_mutex_destroy(&e->lock);
	free(e);
}

/* POSTs body to path on the endpoints in turn; *out is the parsed reply. */
static int post(struct stk_etcd *e, const char *path, json_t *body, json_t **out)
{
	char *text = json_dumps(body, JSON_COMPACT);
	int rc = -EIO;

	json_decref(body);
	if (!text)
		return -ENOMEM;
	pthread_mutex_lock(&e->lock);
	for (unsigned t = 0; t < e->n; t++) {
		struct reply r = {0};
		char url[ETCD_URL_MAX + 32];
		long code = 0;
		CURLcode cc;

		snprintf(url, sizeof(url), "%s%s", e->url[e->cur], path);
		curl_easy_reset(e->curl);
		curl_easy_setopt(e->curl, CURLOPT_URL, url);
		curl_easy_setopt(e->curl, CURLOPT_POSTFIELDS, text);
		curl_easy_setopt(e->curl, CURLOPT_TIMEOUT_MS, ETCD_TIMEOUT_MS);
		curl_easy_setopt(e->curl, CURLOPT_CONNECTTIMEOUT_MS, ETCD_TIMEOUT_MS);
		curl_easy_setopt(e->curl, CURLOPT_NOSIGNAL, 1L);
		curl_easy_setopt(e->curl, CURLOPT_WRITEFUNCTION, on_data);
		curl_easy_setopt(e->curl, CURLOPT_WRITEDATA, &r);
		cc = curl_easy_perform(e->curl);
		if (cc == CURLE_OK)
			curl_easy_getinfo(e->curl, CURLINFO_RESPONSE_CODE, &code);
		if (cc == CURLE_OK && code == 200 && r.buf) {
			json_error_t err;

			*out = json_loadb(r.buf, r.len, 0, &err);
			free(r.buf);
			rc = *out ? 0 : -EBADMSG;
			break;
		}
		if (cc == CURLE_OK)
			stk_warn("etcd %s%s: HTTP %ld: %.200s", e->url[e->cur], path, code,
				 r.buf ? r.buf : "");
		free(r.buf);
		e->cur = (e->cur + 1) % e->n;
	}
	pthread_mutex_unlock(&e->lock);
	free(text);
	return rc;
}

static char *b64(const void *p, size_t len)
{
	char *o = malloc(4 * ((len + 2) / 3) + 1);

	if (o)
		EVP_EncodeBlock((unsigned char *)o, p, (int)len);
	return o;
}

/* Decodes base64 text into a new buffer (NUL-terminated past *len). */
static int unb64(const char *s, uint8_t **out, size_t *len)
{
	size_t sl = strlen(s);
	uint8_t *o = malloc(sl / 4 * 3 + 4);
	int n;

	if (!o)
		return -ENOMEM;
	n = sl ? EVP_DecodeBlock(o, (const unsigned char *)s, (int)sl) : 0;
	if (n < 0) {
		free(o);
		return -EBADMSG;
	}
	if (sl >= 1 && s[sl - 1] == '=')
		n--;
	if (sl >= 2 && s[sl - 2] == '=')
		n--;
	o[n] = 0;
	*out = o;
	*len = (size_t)n;
	return 0;
}

static int64_t int_field(json_t *o, const char *name)
{
	json_t *v = json_object_get(o, name);

	if (json_is_string(v))
		return strtoll(json_string_value(v), NULL, 10);
	if (json_is_integer(v))
		return json_integer_value(v);
	return 0;
}

static json_t *i64(int64_t v)
{
	char s[32];

	snprintf(s, sizeof(s), "%" PRId64, v);
	return json_string(s);
}

int stk_etcd_lease_grant(struct stk_etcd *e, unsigned ttl_s, int64_t *id)
{
	json_t *r;
	int rc = post(e, "/v3/lease/grant", json_pack("{s:o}", "TTL", i64(ttl_s)), &r);

	if (rc)
		return rc;
	*id = int_field(r, "ID");
	json_decref(r);
	return *id ? 0 : -EIO;
}

int stk_etcd_lease_keepalive(struct stk_etcd *e, int64_t id, unsigned *ttl_s)
{
	json_t *r;
	int rc = post(e, "/v3/lease/keepalive", json_pack("{s:o}", "ID", i64(id)), &r);
	int64_t ttl;

	if (rc)
		return rc;
	ttl = int_field(json_object_get(r, "result"), "TTL");
	json_decref(r);
	*ttl_s = ttl > 0 ? (unsigned)ttl : 0;
	return 0;
}

int stk_etcd_lease_revoke(struct stk_etcd *e, int64_t id)
{
	json_t *r;
	int rc = post(e, "/v3/lease/revoke", json_pack("{s:o}", "ID", i64(id)), &r);

	if (rc == 0)
		json_decref(r);
	return rc;
}

/* The first kv of a range reply (or of a txn's response_range), or NULL. */
static json_t *first_kv(json_t *range)
{
	return json_array_get(json_object_get(range, "kvs"), 0);
}

static int kv_value(json_t *kv, uint8_t **val, size_t *len, int64_t *create_rev)
{
	json_t *v = json_object_get(kv, "value");

	if (create_rev)
		*create_rev = int_field(kv, "create_revision");
	return unb64(json_is_string(v) ? json_string_value(v) : "", val, len);
}

int stk_etcd_get(struct stk_etcd *e, const char *key, uint8_t **val, size_t *len,
		 int64_t *create_rev)
{
	char *k = b64(key, strlen(key));
	json_t *r, *kv;
	int rc;

	if (!k)
		return -ENOMEM;
	rc = post(e, "/v3/kv/range", json_pack("{s:s}", "key", k), &r);
	free(k);
	if (rc)
		return rc;
	kv = first_kv(r);
	rc = kv ? kv_value(kv, val, len, create_rev) : -ENOENT;
	json_decref(r);
	return rc;
}

int stk_etcd_put_if_absent(struct stk_etcd *e, const char *key, const void *value, size_t len,
			   int64_t lease, int *won, int64_t *create_rev)
{
	char *k = b64(key, strlen(key)), *v = b64(value, len);
	json_t *r;
	int rc = -ENOMEM;

	*won = 0;
	if (!k || !v)
		goto out;
	rc = post(e, "/v3/kv/txn",
		  json_pack("{s:[{s:s,s:s,s:s,s:s}],s:[{s:{s:s,s:s,s:o}}],s:[]}", "compare", "key",
			    k, "result", "EQUAL", "target", "CREATE", "create_revision", "0",
			    "success", "request_put", "key", k, "value", v, "lease", i64(lease),
			    "failure"),
		  &r);
	if (rc)
		goto out;
	if (json_is_true(json_object_get(r, "succeeded"))) {
		*won = 1;
		/* The put's revision is the key's create revision. */
		*create_rev = int_field(json_object_get(r, "header"), "revision");
	}
	json_decref(r);
out:
	free(k);
	free(v);
	return rc;
}

int stk_etcd_put_guarded(struct stk_etcd *e, const char *key, const void *value, size_t len,
			 const char *guard_key, int64_t guard_rev)
{
	char *k = b64(key, strlen(key)), *v = b64(value, len), *g = b64(guard_key, strlen(guard_key));
	json_t *r;
	int rc = -ENOMEM;

	if (!k || !v || !g)
		goto out;
	rc = post(e, "/v3/kv/txn",
		  json_pack("{s:[{s:s,s:s,s:s,s:o}],s:[{s:{s:s,s:s}}],s:[]}", "compare", "key", g,
			    "result", "EQUAL", "target", "CREATE", "create_revision",
			    i64(guard_rev), "success", "request_put", "key", k, "value", v,
			    "failure"),
		  &r);
	if (rc)
		goto out;
	rc = json_is_true(json_object_get(r, "succeeded")) ? 0 : -ESTALE;
	json_decref(r);
out:
	free(k);
	free(v);
	free(g);
	return rc;
}
