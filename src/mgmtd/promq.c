/*
 * The dashboard's Prometheus client (see promq.h): libcurl for the request (mgmtd
 * links it already, for etcd), Jansson for the answer.
 *
 * Why a grid: the dashboard's history is columns that share one time axis. A
 * query_range answer holds only the times at which the expression had a value,
 * each exactly start + k * step (Prometheus evaluates on that grid), so each value
 * goes to its slot by its time, rounded, and a slot nobody fills stays NAN: a gap
 * in the chart, as in mgmtd's own ring.
 */
#include "promq.h"

#include <curl/curl.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct stk_promq {
	char url[512];
	CURL *curl;
};

struct body {
	char *buf;
	size_t len;
	int too_big;
};

static size_t on_data(char *p, size_t size, size_t n, void *ctx)
{
	struct body *b = ctx;
	size_t add = size * n;
	char *nb;

	if (b->len + add > STK_PROMQ_BODY_MAX) {
		b->too_big = 1;
		return 0; /* stops the transfer */
	}
	nb = realloc(b->buf, b->len + add + 1);
	if (!nb)
		return 0;
	b->buf = nb;
	memcpy(b->buf + b->len, p, add);
	b->len += add;
	b->buf[b->len] = 0;
	return add;
}

int stk_promq_create(const char *url, struct stk_promq **out)
{
	static int curl_once;
	struct stk_promq *q;
	size_t len;

	*out = NULL;
	if (!url || (strncmp(url, "http://", 7) != 0 && strncmp(url, "https://", 8) != 0))
		return -EINVAL;
	len = strlen(url);
	while (len && url[len - 1] == '/')
		len--;
	if (len > 400)
		return -EINVAL;
	if (!__atomic_exchange_n(&curl_once, 1, __ATOMIC_SEQ_CST))
		curl_global_init(CURL_GLOBAL_DEFAULT);
	q = calloc(1, sizeof(*q));
	if (!q)
		return -ENOMEM;
	memcpy(q->url, url, len);
	q->url[len] = 0;
	q->curl = curl_easy_init();
	if (!q->curl) {
		free(q);
		return -ENOMEM;
	}
	*out = q;
	return 0;
}

void stk_promq_destroy(struct stk_promq *q)
{
	if (!q)
		return;
	curl_easy_cleanup(q->curl);
	free(q);
}

static int bad(char *err, size_t errlen, const char *why)
{
	snprintf(err, errlen, "Prometheus answered something that is not a query result: %s", why);
	return -EBADMSG;
}

int stk_promq_parse(const char *body, size_t len, int64_t start_ms, int64_t step_ms, unsigned n,
		    double *out, char *err, size_t errlen)
{
	json_error_t je;
	json_t *o = json_loadb(body, len, 0, &je), *data, *res, *vals, *pt;
	const char *status;
	size_t i;
	int rc = 0;

	for (unsigned k = 0; k < n; k++)
		out[k] = NAN;
	if (!o)
		return bad(err, errlen, "not JSON");
	status = json_string_value(json_object_get(o, "status"));
	if (!status || strcmp(status, "success") != 0) {
		const char *e = json_string_value(json_object_get(o, "error"));

		snprintf(err, errlen, "Prometheus refused the query: %.200s",
			 e ? e : "no reason given");
		json_decref(o);
		return -EIO;
	}
	data = json_object_get(o, "data");
	res = json_object_get(data, "result");
	if (!json_is_array(res) || !json_is_string(json_object_get(data, "resultType")) ||
	    strcmp(json_string_value(json_object_get(data, "resultType")), "matrix") != 0) {
		rc = bad(err, errlen, "no matrix");
		goto out;
	}
	if (json_array_size(res) == 0)
		goto out; /* no data at all: every slot NAN */
	vals = json_object_get(json_array_get(res, 0), "values");
	if (!json_is_array(vals)) {
		rc = bad(err, errlen, "a series without values");
		goto out;
	}
	json_array_foreach(vals, i, pt)
	{
		json_t *t = json_array_get(pt, 0), *v = json_array_get(pt, 1);
		double ms, x, slot;
		char *end;

		if (!json_is_number(t) || !json_is_string(v)) {
			rc = bad(err, errlen, "a value that is not [time, \"number\"]");
			goto out;
		}
		ms = json_number_value(t) * 1000.0;
		slot = round((ms - (double)start_ms) / (double)step_ms);
		if (!(slot >= 0 && slot < n))
			continue;
		x = strtod(json_string_value(v), &end);
		if (end == json_string_value(v) || *end) {
			rc = bad(err, errlen, "a value that is not a number");
			goto out;
		}
		out[(unsigned)slot] = isfinite(x) ? x : NAN;
	}
out:
	json_decref(o);
	return rc;
}

int stk_promq_range(struct stk_promq *q, const char *query, int64_t start_ms, int64_t step_ms,
		    unsigned n, double *out, char *err, size_t errlen)
{
	struct body b = {0};
	char *esc, *url = NULL;
	long code = 0;
	CURLcode cc;
	int rc;

	if (!n || step_ms <= 0)
		return -EINVAL;
	esc = curl_easy_escape(q->curl, query, 0);
	if (!esc)
		return -ENOMEM;
	rc = -ENOMEM;
	if (asprintf(&url, "%s/api/v1/query_range?query=%s&start=%.3f&end=%.3f&step=%.3f", q->url,
		     esc, (double)start_ms / 1000.0,
		     (double)(start_ms + (int64_t)(n - 1) * step_ms) / 1000.0,
		     (double)step_ms / 1000.0) < 0) {
		url = NULL;
		goto out;
	}
	curl_easy_reset(q->curl);
	curl_easy_setopt(q->curl, CURLOPT_URL, url);
	curl_easy_setopt(q->curl, CURLOPT_TIMEOUT_MS, (long)STK_PROMQ_TIMEOUT_MS);
	curl_easy_setopt(q->curl, CURLOPT_CONNECTTIMEOUT_MS, (long)STK_PROMQ_TIMEOUT_MS);
	curl_easy_setopt(q->curl, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(q->curl, CURLOPT_WRITEFUNCTION, on_data);
	curl_easy_setopt(q->curl, CURLOPT_WRITEDATA, &b);
	cc = curl_easy_perform(q->curl);
	if (cc == CURLE_OK)
		curl_easy_getinfo(q->curl, CURLINFO_RESPONSE_CODE, &code);
	if (b.too_big) {
		snprintf(err, errlen, "%s: an answer over %u bytes", q->url, STK_PROMQ_BODY_MAX);
		rc = -E2BIG;
	} else if (cc != CURLE_OK) {
		snprintf(err, errlen, "%s: %s", q->url, curl_easy_strerror(cc));
		rc = cc == CURLE_OPERATION_TIMEDOUT ? -ETIMEDOUT
		     : cc == CURLE_COULDNT_CONNECT  ? -ECONNREFUSED
						    : -EIO;
	} else if (code != 200 && code != 400 && code != 422) {
		snprintf(err, errlen, "%s: HTTP %ld", q->url, code);
		rc = -EIO;
	} else {
		/* 400 and 422 carry Prometheus's reason in the same JSON */
		rc = stk_promq_parse(b.buf ? b.buf : "", b.len, start_ms, step_ms, n, out, err,
				     errlen);
	}
out:
	free(b.buf);
	free(url);
	curl_free(esc);
	return rc;
}
