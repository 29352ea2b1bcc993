/*
 * A client of a Prometheus server's query API, for the dashboard's charts
 * (docs/dashboard.md, "History"): `GET /api/v1/query_range`, whose matrix answer is
 * laid onto a fixed grid of times, one value per step, NAN where Prometheus has
 * none. Only what the dashboard needs: one series per query (the queries sum).
 *
 * Thread rules: one stk_promq is used by one thread at a time (the sampler's);
 * create and destroy from the thread that uses it, or before it starts.
 */
#ifndef STK_MGMTD_PROMQ_H
#define STK_MGMTD_PROMQ_H

#include <stddef.h>
#include <stdint.h>

struct stk_promq;

/* The longest answer read (a grid of a few thousand points is far less). */
#define STK_PROMQ_BODY_MAX (8u << 20)
/* Each request: connect and answer within this. */
#define STK_PROMQ_TIMEOUT_MS 2000

/*
 * A client of the server at url ("http://HOST:PORT" or with a path prefix; https
 * too), copied. 0, -EINVAL (not an http(s) URL, or over 400 bytes) or -ENOMEM.
 */
int stk_promq_create(const char *url, struct stk_promq **out);
/* NULL is fine. */
void stk_promq_destroy(struct stk_promq *q);

/*
 * Evaluates query (PromQL) at start_ms + k * step_ms for k in 0..n-1 (Unix time in
 * milliseconds) into out[n]: the first series' value at each time, NAN where it
 * has none (or Prometheus says NaN or an infinity). 0; or -ECONNREFUSED,
 * -ETIMEDOUT, -EIO (an HTTP error), -EBADMSG (an answer that is not a query
 * result), -E2BIG, -ENOMEM, with err saying what in a sentence.
 */
int stk_promq_range(struct stk_promq *q, const char *query, int64_t start_ms, int64_t step_ms,
		    unsigned n, double *out, char *err, size_t errlen);

/*
 * Lays a query_range answer (body, len bytes) onto the grid as above. 0 or
 * -EBADMSG with err set. For tests, and stk_promq_range's own use.
 */
int stk_promq_parse(const char *body, size_t len, int64_t start_ms, int64_t step_ms, unsigned n,
		    double *out, char *err, size_t errlen);

#endif
