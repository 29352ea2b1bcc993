/*
 * The training jobs mgmtd's dashboard shows (docs/dashboard.md, "Training jobs").
 *
 * A training process that uses the Python package's job monitor
 * (stoker.jobs.JobMonitor, docs/python.md) reports to the leading mgmtd every few
 * seconds: how long it waited for its data loader, samples and bytes per second,
 * and its checkpoints. Each report is one small JSON object POSTed to the metrics
 * endpoint at /ui/api/jobs; this module checks it field by field and keeps the
 * newest report of each job (by the id the process chose) in a bounded table.
 *
 * Nothing here is durable: the table lives in memory, and a job that stops
 * reporting (it ended, or was killed) is dropped once it has missed three reports
 * (STK_MGMTD_JOBS_MISSED times the interval it announced, at least
 * STK_MGMTD_JOBS_MIN_TIMEOUT_MS); a job that ends cleanly says so in its last
 * report and goes at once. What is refused (malformed JSON, a missing or mistyped
 * field, a value out of range, an oversized string, one job too many) leaves the
 * table as it was and gets a sentence saying why.
 *
 * Signed reports: when mgmtd holds the cluster key, a report must carry
 * X-Stoker-Signature: the lowercase hex of HMAC-SHA256(key, STK_MGMTD_JOBS_SIGN_LABEL
 * followed by the body), so that only a holder of the key (a client of the
 * cluster) can put a job on the page. The label keeps such a MAC from meaning
 * anything elsewhere. A recorded report can be sent again, which shows only what
 * the job once said, for three of its intervals.
 *
 * Thread rules: every function may be called from any thread (an internal mutex);
 * create and destroy excepted, which must not race the others.
 */
#ifndef STK_MGMTD_JOBS_H
#define STK_MGMTD_JOBS_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

struct stk_mgmtd_jobs;

/* Jobs kept at most: a report of one more is refused (-ENOSPC) until one goes. */
#define STK_MGMTD_JOBS_MAX 256
/* A report's body, at most (the metrics endpoint refuses a longer one). */
#define STK_MGMTD_JOBS_BODY_MAX 4096
#define STK_MGMTD_JOBS_NAME_MAX 128
#define STK_MGMTD_JOBS_HOST_MAX 64
#define STK_MGMTD_JOBS_ID_MAX 64
/* A job is forgotten after missing this many reports in a row... */
#define STK_MGMTD_JOBS_MISSED 3
/* ...and never sooner than this. */
#define STK_MGMTD_JOBS_MIN_TIMEOUT_MS 1000
/* The interval a job may announce, in seconds. */
#define STK_MGMTD_JOBS_INTERVAL_MIN 0.1
#define STK_MGMTD_JOBS_INTERVAL_MAX 600.0
/*
 * A job that waited on its data loader for at least this share of its wall time is
 * data-bound: its accelerators sit idle for storage (or for the loader's CPU work),
 * the MLPerf Storage rule's 90% utilisation turned around.
 */
#define STK_MGMTD_JOBS_DATA_BOUND 0.10

#define STK_MGMTD_JOBS_SIGN_LABEL "stoker-job-report-1\n"

/*
 * An empty table holding at most max jobs (0: STK_MGMTD_JOBS_MAX); with a key (len
 * STK_AUTH_KEY_MIN..MAX bytes, copied; NULL or 0: none), reports must be signed
 * with it. 0, -EINVAL (key length) or -ENOMEM.
 */
int stk_mgmtd_jobs_create(unsigned max, const uint8_t *key, size_t key_len,
			  struct stk_mgmtd_jobs **out);
/* Frees the table. NULL is fine. */
void stk_mgmtd_jobs_destroy(struct stk_mgmtd_jobs *j);

/*
 * Takes one report: body is len bytes of JSON (not NUL-terminated); signature its
 * X-Stoker-Signature (NULL: none); now_ms a monotonic clock in milliseconds (ages
 * and timeouts are measured on it). 0: the job's entry is new or updated, or
 * removed when the report says "final"; -EACCES: the table has a key and the
 * signature is missing or wrong; -EINVAL: the report is malformed; -E2BIG: longer
 * than STK_MGMTD_JOBS_BODY_MAX; -ENOSPC: a new job while the table is full;
 * -ENOMEM. On an error, err (errlen bytes) says why in one sentence and the table
 * is unchanged.
 */
int stk_mgmtd_jobs_report(struct stk_mgmtd_jobs *j, const char *body, size_t len,
			  const char *signature, int64_t now_ms, char *err, size_t errlen);

/*
 * Drops the jobs that missed their reports by now_ms, then returns them as a new
 * JSON array (the caller owns the reference), by name, then rank, then host and
 * pid; NULL on no memory. Each element: id, name, host, pid, rank (-1: none),
 * interval_s, age_s (since its last report), running_s, steps, samples, bytes,
 * data_wait_s, data_wait_ratio, samples_per_s, bytes_per_s, window_s,
 * data_bound, and the checkpoint figures: checkpoint_saves,
 * checkpoint_save_s, checkpoint_save_bytes, checkpoint_age_s (since the last
 * save ended; null before the first), and the same four for loads.
 */
json_t *stk_mgmtd_jobs_json(struct stk_mgmtd_jobs *j, int64_t now_ms);

/* Counts a report refused because this mgmtd does not lead (the caller's verdict). */
void stk_mgmtd_jobs_not_leader(struct stk_mgmtd_jobs *j);

/* The jobs held after dropping those that missed their reports by now_ms. */
unsigned stk_mgmtd_jobs_count(struct stk_mgmtd_jobs *j, int64_t now_ms);

#endif
