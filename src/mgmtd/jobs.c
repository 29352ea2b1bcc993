/*
 * The training jobs' table (see jobs.h).
 *
 * A report is parsed with Jansson and checked in full into a struct job on the
 * stack before the table is touched, so that a refused report changes nothing.
 * The table is a plain array of at most `max` entries found by a linear search on
 * the job's id: reports come every few seconds from a few hundred processes at
 * most, which a scan of a few hundred short strings serves in microseconds.
 *
 * What the job reports is what the dashboard shows: mgmtd does not recompute its
 * rates (a job measures its own wall time, which mgmtd cannot see), but it checks
 * every figure is a finite number in its range and every string is short and free
 * of control characters, since the page and `/ui/api/overview` hand them on.
 * Ages are kept on mgmtd's own monotonic clock, never the job's: a job's clock may
 * be off, so the job says how long ago its last checkpoint ended, not when.
 */
#include "jobs.h"

#include <errno.h>
#include <math.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/auth.h"
#include "../common/metrics.h"
#include "../common/util.h"

/* Counts and bytes: below 2^60, far beyond any job, and exact in a double. */
#define INT_LIMIT (1ll << 60)
/* Seconds: up to about 30 years. */
#define SECONDS_LIMIT 1e9
/* Rates: samples or bytes per second. */
#define RATE_LIMIT 1e15

struct job {
	char id[STK_MGMTD_JOBS_ID_MAX + 1];
	char name[STK_MGMTD_JOBS_NAME_MAX + 1];
	char host[STK_MGMTD_JOBS_HOST_MAX + 1];
	int64_t pid, rank;
	double interval_s, running_s;
	int64_t steps, samples, bytes;
	double wait_s, window_s, ratio, sps, bps;
	/* checkpoints: [0] saves, [1] loads */
	int64_t ck_n[2], ck_bytes[2];
	double ck_s[2], ck_ago[2]; /* ck_ago < 0: none yet */
	int64_t seen_ms;	   /* mgmtd's monotonic clock at the report */
};

struct stk_mgmtd_jobs {
	pthread_mutex_t lock; /* protects everything below */
	struct job *jobs;
	unsigned n, max;
	stk_metric_t accepted, malformed, too_many, not_leader, unauthenticated, gauge;
	uint8_t key[STK_AUTH_KEY_MAX]; /* set once at create */
	size_t key_len;
};

int stk_mgmtd_jobs_create(unsigned max, const uint8_t *key, size_t key_len,
			  struct stk_mgmtd_jobs **out)
{
	struct stk_mgmtd_jobs *j;
	static const char *const results[5] = {"accepted", "malformed", "too_many", "not_leader",
					       "unauthenticated"};
	stk_metric_t *series[5];
	int rc = 0;

	*out = NULL;
	if (key && key_len && (key_len < STK_AUTH_KEY_MIN || key_len > STK_AUTH_KEY_MAX))
		return -EINVAL;
	j = calloc(1, sizeof(*j));
	if (!j)
		return -ENOMEM;
	if (key && key_len) {
		memcpy(j->key, key, key_len);
		j->key_len = key_len;
	}
	j->max = max ? max : STK_MGMTD_JOBS_MAX;
	j->jobs = calloc(j->max, sizeof(*j->jobs));
	if (!j->jobs) {
		free(j);
		return -ENOMEM;
	}
	series[0] = &j->accepted;
	series[1] = &j->malformed;
	series[2] = &j->too_many;
	series[3] = &j->not_leader;
	series[4] = &j->unauthenticated;
	for (int i = 0; i < 5 && !rc; i++) {
		const char *v[1] = {results[i]};

		rc = stk_metric_series(STK_M_MGMTD_JOB_REPORTS, v, series[i]);
	}
	rc = rc ? rc : stk_metric_series(STK_M_MGMTD_JOBS, NULL, &j->gauge);
	if (rc) {
		free(j->jobs);
		free(j);
		return rc;
	}
	pthread_mutex_init(&j->lock, NULL);
	*out = j;
	return 0;
}

void stk_mgmtd_jobs_destroy(struct stk_mgmtd_jobs *j)
{
	if (!j)
		return;
	pthread_mutex_destroy(&j->lock);
	free(j->jobs);
	free(j);
}

static int refuse(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
	return -EINVAL;
}

/* A string field: 1 to max bytes, no control characters; id: letters, digits, - and _. */
static int get_str(json_t *o, const char *key, char *out, size_t max, int id, char *err,
		   size_t errlen)
{
	json_t *v = json_object_get(o, key);
	const char *s;
	size_t len;

	if (!v)
		return refuse(err, errlen, "\"%s\" is missing", key);
	if (!json_is_string(v))
		return refuse(err, errlen, "\"%s\" must be a string", key);
	s = json_string_value(v);
	len = json_string_length(v);
	if (len == 0 || len > max)
		return refuse(err, errlen, "\"%s\" must be 1 to %zu bytes long, not %zu", key, max,
			      len);
	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)s[i];

		if (c < 0x20 || c == 0x7f ||
		    (id && !((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') ||
			     (c >= 'A' && c <= 'Z') || c == '-' || c == '_')))
			return refuse(err, errlen, "\"%s\" holds a character it may not (byte %zu)",
				      key, i);
	}
	memcpy(out, s, len);
	out[len] = 0;
	return 0;
}

/* An integer field in [lo, hi]; absent: def when optional (def_ok), else an error. */
static int get_int(json_t *o, const char *key, int64_t lo, int64_t hi, int def_ok, int64_t def,
		   int64_t *out, char *err, size_t errlen)
{
	json_t *v = json_object_get(o, key);
	json_int_t x;

	if (!v && def_ok) {
		*out = def;
		return 0;
	}
	if (!v)
		return refuse(err, errlen, "\"%s\" is missing", key);
	if (!json_is_integer(v))
		return refuse(err, errlen, "\"%s\" must be an integer", key);
	x = json_integer_value(v);
	if (x < lo || x > hi)
		return refuse(err, errlen, "\"%s\" is %lld, outside %lld to %lld", key,
			      (long long)x, (long long)lo, (long long)hi);
	*out = x;
	return 0;
}

/* A number field (integer or real) in [lo, hi]; null is none (-1) where null_ok. */
static int get_num(json_t *o, const char *key, double lo, double hi, int null_ok, double *out,
		   char *err, size_t errlen)
{
	json_t *v = json_object_get(o, key);
	double x;

	if (null_ok && (!v || json_is_null(v))) {
		*out = -1;
		return 0;
	}
	if (!v)
		return refuse(err, errlen, "\"%s\" is missing", key);
	if (!json_is_number(v))
		return refuse(err, errlen, "\"%s\" must be a number", key);
	x = json_number_value(v);
	if (!isfinite(x) || x < lo || x > hi)
		return refuse(err, errlen, "\"%s\" is %g, outside %g to %g", key, x, lo, hi);
	*out = x;
	return 0;
}

/* Checks the report o into *jb; *final set when the job says it ended. 0 or -EINVAL. */
static int parse(json_t *o, struct job *jb, int *final, char *err, size_t errlen)
{
	static const char *const ck[2] = {"save", "load"};
	json_t *f;
	int64_t ver;
	int rc;

	if (!json_is_object(o))
		return refuse(err, errlen, "a report is a JSON object");
	rc = get_int(o, "v", 0, INT_LIMIT, 0, 0, &ver, err, errlen);
	if (rc)
		return rc;
	if (ver != 1)
		return refuse(err, errlen, "report version %lld is not one this mgmtd reads (1)",
			      (long long)ver);
	f = json_object_get(o, "final");
	if (f && !json_is_boolean(f))
		return refuse(err, errlen, "\"final\" must be true or false");
	*final = f && json_is_true(f);
	memset(jb, 0, sizeof(*jb));
	rc = get_str(o, "id", jb->id, STK_MGMTD_JOBS_ID_MAX, 1, err, errlen);
	rc = rc ? rc : get_str(o, "name", jb->name, STK_MGMTD_JOBS_NAME_MAX, 0, err, errlen);
	rc = rc ? rc : get_str(o, "host", jb->host, STK_MGMTD_JOBS_HOST_MAX, 0, err, errlen);
	rc = rc ? rc : get_int(o, "pid", 1, INT32_MAX, 0, 0, &jb->pid, err, errlen);
	rc = rc ? rc : get_int(o, "rank", -1, 1 << 24, 1, -1, &jb->rank, err, errlen);
	rc = rc ? rc
		: get_num(o, "interval_s", STK_MGMTD_JOBS_INTERVAL_MIN, STK_MGMTD_JOBS_INTERVAL_MAX,
			  0, &jb->interval_s, err, errlen);
	rc = rc ? rc : get_num(o, "running_s", 0, SECONDS_LIMIT, 0, &jb->running_s, err, errlen);
	rc = rc ? rc : get_int(o, "steps", 0, INT_LIMIT, 0, 0, &jb->steps, err, errlen);
	rc = rc ? rc : get_int(o, "samples", 0, INT_LIMIT, 0, 0, &jb->samples, err, errlen);
	rc = rc ? rc : get_int(o, "bytes", 0, INT_LIMIT, 0, 0, &jb->bytes, err, errlen);
	rc = rc ? rc : get_num(o, "data_wait_s", 0, SECONDS_LIMIT, 0, &jb->wait_s, err, errlen);
	rc = rc ? rc : get_num(o, "window_s", 0, SECONDS_LIMIT, 0, &jb->window_s, err, errlen);
	rc = rc ? rc : get_num(o, "data_wait_ratio", 0, 1, 0, &jb->ratio, err, errlen);
	rc = rc ? rc : get_num(o, "samples_per_s", 0, RATE_LIMIT, 0, &jb->sps, err, errlen);
	rc = rc ? rc : get_num(o, "bytes_per_s", 0, RATE_LIMIT, 0, &jb->bps, err, errlen);
	for (int k = 0; k < 2 && !rc; k++) {
		char key[40];
		double b = -1;

		snprintf(key, sizeof(key), "checkpoint_%ss", ck[k]);
		rc = get_int(o, key, 0, INT_LIMIT, 1, 0, &jb->ck_n[k], err, errlen);
		snprintf(key, sizeof(key), "checkpoint_%s_s", ck[k]);
		rc = rc ? rc : get_num(o, key, 0, SECONDS_LIMIT, 1, &jb->ck_s[k], err, errlen);
		snprintf(key, sizeof(key), "checkpoint_%s_bytes", ck[k]);
		rc = rc ? rc : get_num(o, key, 0, (double)INT_LIMIT, 1, &b, err, errlen);
		jb->ck_bytes[k] = b < 0 ? -1 : (int64_t)b;
		snprintf(key, sizeof(key), "checkpoint_%s_ago_s", ck[k]);
		rc = rc ? rc : get_num(o, key, 0, SECONDS_LIMIT, 1, &jb->ck_ago[k], err, errlen);
	}
	return rc;
}

static int64_t timeout_ms(const struct job *jb)
{
	int64_t t = (int64_t)(jb->interval_s * 1000 * STK_MGMTD_JOBS_MISSED);

	return t < STK_MGMTD_JOBS_MIN_TIMEOUT_MS ? STK_MGMTD_JOBS_MIN_TIMEOUT_MS : t;
}

/* Drops the jobs that missed their reports. Called with j->lock held. */
static void expire(struct stk_mgmtd_jobs *j, int64_t now_ms)
{
	for (unsigned i = 0; i < j->n;)
		if (now_ms - j->jobs[i].seen_ms > timeout_ms(&j->jobs[i]))
			j->jobs[i] = j->jobs[--j->n];
		else
			i++;
	stk_metric_set_int(j->gauge, j->n);
}

/*
 * Whether signature is the hex HMAC of the label and body (len at most
 * STK_MGMTD_JOBS_BODY_MAX) under j's key.
 */
static int signed_ok(const struct stk_mgmtd_jobs *j, const char *body, size_t len,
		     const char *signature)
{
	static const char label[] = STK_MGMTD_JOBS_SIGN_LABEL;
	char msg[sizeof(label) + STK_MGMTD_JOBS_BODY_MAX];
	uint8_t mac[EVP_MAX_MD_SIZE], given[32];
	unsigned int mlen = 0;

	if (!signature || strlen(signature) != 2 * sizeof(given) || len > STK_MGMTD_JOBS_BODY_MAX)
		return 0;
	for (size_t i = 0; i < sizeof(given); i++) {
		char c = signature[2 * i], d = signature[2 * i + 1];
		int hi = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
		int lo = d >= '0' && d <= '9' ? d - '0' : d >= 'a' && d <= 'f' ? d - 'a' + 10 : -1;

		if (hi < 0 || lo < 0)
			return 0;
		given[i] = (uint8_t)(hi << 4 | lo);
	}
	memcpy(msg, label, sizeof(label) - 1);
	memcpy(msg + sizeof(label) - 1, body, len);
	if (!HMAC(EVP_sha256(), j->key, (int)j->key_len, (const unsigned char *)msg,
		  sizeof(label) - 1 + len, mac, &mlen) ||
	    mlen != sizeof(given))
		return 0;
	return CRYPTO_memcmp(mac, given, sizeof(given)) == 0;
}

int stk_mgmtd_jobs_report(struct stk_mgmtd_jobs *j, const char *body, size_t len,
			  const char *signature, int64_t now_ms, char *err, size_t errlen)
{
	json_error_t je;
	json_t *o;
	struct job jb;
	unsigned i;
	int final = 0, rc;

	if (len > STK_MGMTD_JOBS_BODY_MAX) {
		snprintf(err, errlen, "a report is at most %d bytes", STK_MGMTD_JOBS_BODY_MAX);
		stk_metric_add(j->malformed, 1);
		return -E2BIG;
	}
	if (j->key_len && !signed_ok(j, body, len, signature)) {
		snprintf(err, errlen,
			 signature ? "the report's X-Stoker-Signature is not the cluster key's"
				   : "this cluster takes job reports signed with its key "
				     "(X-Stoker-Signature) only: give the job the key "
				     "($STOKER_KEY_FILE)");
		stk_metric_add(j->unauthenticated, 1);
		return -EACCES;
	}
	o = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
	if (!o) {
		snprintf(err, errlen, "not JSON: %s (at byte %d)", je.text, je.position);
		stk_metric_add(j->malformed, 1);
		return -EINVAL;
	}
	rc = parse(o, &jb, &final, err, errlen);
	json_decref(o);
	if (rc) {
		stk_metric_add(j->malformed, 1);
		return rc;
	}
	jb.seen_ms = now_ms;
	pthread_mutex_lock(&j->lock);
	expire(j, now_ms);
	for (i = 0; i < j->n; i++)
		if (strcmp(j->jobs[i].id, jb.id) == 0)
			break;
	if (final) {
		if (i < j->n)
			j->jobs[i] = j->jobs[--j->n];
	} else if (i < j->n) {
		j->jobs[i] = jb;
	} else if (j->n == j->max) {
		rc = -ENOSPC;
	} else {
		j->jobs[j->n++] = jb;
	}
	stk_metric_set_int(j->gauge, j->n);
	pthread_mutex_unlock(&j->lock);
	if (rc == -ENOSPC) {
		snprintf(err, errlen,
			 "mgmtd shows %u jobs at most and has that many: this one is not shown "
			 "until another ends",
			 j->max);
		stk_metric_add(j->too_many, 1);
		return rc;
	}
	stk_metric_add(j->accepted, 1);
	return 0;
}

void stk_mgmtd_jobs_not_leader(struct stk_mgmtd_jobs *j)
{
	stk_metric_add(j->not_leader, 1);
}

static int cmp_job(const void *a, const void *b)
{
	const struct job *x = a, *y = b;
	int c = strcmp(x->name, y->name);

	if (c)
		return c;
	if (x->rank != y->rank)
		return x->rank < y->rank ? -1 : 1;
	c = strcmp(x->host, y->host);
	if (c)
		return c;
	return x->pid < y->pid ? -1 : x->pid > y->pid;
}

unsigned stk_mgmtd_jobs_count(struct stk_mgmtd_jobs *j, int64_t now_ms)
{
	unsigned n;

	pthread_mutex_lock(&j->lock);
	expire(j, now_ms);
	n = j->n;
	pthread_mutex_unlock(&j->lock);
	return n;
}

json_t *stk_mgmtd_jobs_json(struct stk_mgmtd_jobs *j, int64_t now_ms)
{
	static const char *const ck[2] = {"save", "load"};
	json_t *arr = json_array();
	struct job *copy = NULL;
	unsigned n;

	if (!arr)
		return NULL;
	pthread_mutex_lock(&j->lock);
	expire(j, now_ms);
	n = j->n;
	if (n && (copy = malloc(n * sizeof(*copy))))
		memcpy(copy, j->jobs, n * sizeof(*copy));
	pthread_mutex_unlock(&j->lock);
	if (n && !copy) {
		json_decref(arr);
		return NULL;
	}
	if (n)
		qsort(copy, n, sizeof(*copy), cmp_job);
	for (unsigned i = 0; i < n; i++) {
		const struct job *jb = &copy[i];
		double age = (double)(now_ms - jb->seen_ms) / 1000.0;
		json_t *e = json_object();

		if (!e || json_array_append_new(arr, e)) {
			json_decref(arr);
			free(copy);
			return NULL;
		}
		json_object_set_new(e, "id", json_string(jb->id));
		json_object_set_new(e, "name", json_string(jb->name));
		json_object_set_new(e, "host", json_string(jb->host));
		json_object_set_new(e, "pid", json_integer(jb->pid));
		json_object_set_new(e, "rank", json_integer(jb->rank));
		json_object_set_new(e, "interval_s", json_real(jb->interval_s));
		json_object_set_new(e, "age_s", json_real(age));
		json_object_set_new(e, "running_s", json_real(jb->running_s + age));
		json_object_set_new(e, "steps", json_integer(jb->steps));
		json_object_set_new(e, "samples", json_integer(jb->samples));
		json_object_set_new(e, "bytes", json_integer(jb->bytes));
		json_object_set_new(e, "data_wait_s", json_real(jb->wait_s));
		json_object_set_new(e, "window_s", json_real(jb->window_s));
		json_object_set_new(e, "data_wait_ratio", json_real(jb->ratio));
		json_object_set_new(e, "samples_per_s", json_real(jb->sps));
		json_object_set_new(e, "bytes_per_s", json_real(jb->bps));
		json_object_set_new(
		    e, "data_bound",
		    json_boolean(jb->window_s > 0 && jb->ratio >= STK_MGMTD_JOBS_DATA_BOUND));
		for (int k = 0; k < 2; k++) {
			char key[40];

			snprintf(key, sizeof(key), "checkpoint_%ss", ck[k]);
			json_object_set_new(e, key, json_integer(jb->ck_n[k]));
			snprintf(key, sizeof(key), "checkpoint_%s_s", ck[k]);
			json_object_set_new(e, key,
					    jb->ck_s[k] < 0 ? json_null() : json_real(jb->ck_s[k]));
			snprintf(key, sizeof(key), "checkpoint_%s_bytes", ck[k]);
			json_object_set_new(e, key,
					    jb->ck_bytes[k] < 0 ? json_null()
								: json_integer(jb->ck_bytes[k]));
			snprintf(key, sizeof(key), "checkpoint_%s_age_s", ck[k]);
			json_object_set_new(e, key,
					    jb->ck_ago[k] < 0 ? json_null()
							      : json_real(jb->ck_ago[k] + age));
		}
	}
	free(copy);
	return arr;
}
