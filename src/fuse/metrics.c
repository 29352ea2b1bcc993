/*
 * Metrics of the FUSE daemon. With `-o metrics=HOST:PORT` the daemon serves
 * /metrics and /healthz there (daemon/metrics_http.c) and every file-system call
 * is counted in the stoker_client_* families with frontend="fuse": calls, errors
 * by errno name, bytes read and written, and a latency histogram per call, on
 * the same 10 us..10 s buckets as the servers. Without the option nothing here
 * runs: the session gets ops.c's table itself.
 *
 * How: stk_fuse_metrics_start() copies ops.c's table and puts a wrapper in front
 * of each callback it has (a callback it lacks stays NULL, so the kernel's own
 * answer is unchanged). A wrapper takes the start time, clears two thread-local
 * slots, calls the real callback and then records the call. The callbacks reply
 * on the calling thread, and the place that replies with an error (ops.c's and
 * locks.c's reply_err) writes the error into the slot, read and write the bytes
 * they handed over; so the wrapper knows the outcome without any change to the
 * callbacks' flow. A reply made later on another thread (a blocking setlk that
 * is granted afterwards) is counted as a success when its wrapper returns, and
 * its time is the time until the callback returned.
 *
 * Counting goes through common/metrics.c's per-thread shards: no lock shared
 * between the request threads. The time spent is the span of the callback,
 * which ends with the reply written to /dev/fuse.
 */
#include "fs.h"
#include "metrics.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "../cli/cli.h"
#include "../common/log.h"
#include "../common/metrics.h"
#include "../daemon/metrics_http.h"
#include "../common/util.h"

/* X(name): every low-level call that takes a request and replies to it. */
#define FUSE_CALLS(X)                                                                              \
	X(lookup)                                                                                  \
	X(getattr)                                                                                 \
	X(setattr)                                                                                 \
	X(readlink)                                                                                \
	X(mknod)                                                                                   \
	X(mkdir)                                                                                   \
	X(unlink)                                                                                  \
	X(rmdir)                                                                                   \
	X(symlink)                                                                                 \
	X(rename)                                                                                  \
	X(link)                                                                                    \
	X(open)                                                                                    \
	X(read)                                                                                    \
	X(write)                                                                                   \
	X(flush)                                                                                   \
	X(release)                                                                                 \
	X(fsync)                                                                                   \
	X(opendir)                                                                                 \
	X(readdir)                                                                                 \
	X(readdirplus)                                                                             \
	X(releasedir)                                                                              \
	X(fsyncdir)                                                                                \
	X(statfs)                                                                                  \
	X(setxattr)                                                                                \
	X(getxattr)                                                                                \
	X(listxattr)                                                                               \
	X(removexattr)                                                                             \
	X(access)                                                                                  \
	X(create)                                                                                  \
	X(getlk)                                                                                   \
	X(setlk)                                                                                   \
	X(flock)                                                                                   \
	X(fallocate)                                                                               \
	X(copy_file_range)                                                                         \
	X(lseek)

enum fuse_call {
#define CALL_ENUM(n) FC_##n,
	FUSE_CALLS(CALL_ENUM)
#undef CALL_ENUM
	    FC__COUNT
};

static const char *const call_names[FC__COUNT] = {
#define CALL_NAME(n) #n,
	FUSE_CALLS(CALL_NAME)
#undef CALL_NAME
};

static char listen_addr[128];
static const struct fuse_lowlevel_ops *inner;
static struct fuse_lowlevel_ops wrapped;
static struct stk_metrics_ops *calls;
static struct stk_metrics_http *http;

/* The outcome of the call this thread is in: set at the reply. */
static __thread int tls_err;
static __thread uint64_t tls_bytes;

int stk_fuse_metrics_opt(const char *val)
{
	if (!val || !*val || stk_strlcpy(listen_addr, val, sizeof(listen_addr)))
		return -EINVAL;
	return 0;
}

void stk_fuse_metrics_error(int rc)
{
	tls_err = rc;
}

void stk_fuse_metrics_bytes(uint64_t n)
{
	tls_bytes = n;
}

static uint64_t call_begin(enum fuse_call c)
{
	tls_err = 0;
	tls_bytes = 0;
	return stk_metrics_ops_begin(calls, c);
}

static void call_end(enum fuse_call c, uint64_t t0)
{
	uint64_t in = c == FC_write ? tls_bytes : 0, out = c == FC_read ? tls_bytes : 0;

	stk_metrics_ops_end(calls, c, t0, tls_err, in, out);
}

/* One wrapper: W(call, (parameters), (arguments)). */
#define W(n, params, args)                                                                         \
	static void w_##n params                                                                   \
	{                                                                                          \
		uint64_t t0 = call_begin(FC_##n);                                                  \
		inner->n args;                                                                     \
		call_end(FC_##n, t0);                                                              \
	}

W(lookup, (fuse_req_t r, fuse_ino_t p, const char *nm), (r, p, nm))
W(getattr, (fuse_req_t r, fuse_ino_t i, struct fuse_file_info *fi), (r, i, fi))
W(setattr, (fuse_req_t r, fuse_ino_t i, struct stat *a, int s, struct fuse_file_info *fi),
  (r, i, a, s, fi))
W(readlink, (fuse_req_t r, fuse_ino_t i), (r, i))
W(mknod, (fuse_req_t r, fuse_ino_t p, const char *nm, mode_t m, dev_t d), (r, p, nm, m, d))
W(mkdir, (fuse_req_t r, fuse_ino_t p, const char *nm, mode_t m), (r, p, nm, m))
W(unlink, (fuse_req_t r, fuse_ino_t p, const char *nm), (r, p, nm))
W(rmdir, (fuse_req_t r, fuse_ino_t p, const char *nm), (r, p, nm))
W(symlink, (fuse_req_t r, const char *l, fuse_ino_t p, const char *nm), (r, l, p, nm))
W(rename, (fuse_req_t r, fuse_ino_t p, const char *nm, fuse_ino_t np, const char *nn, unsigned f),
  (r, p, nm, np, nn, f))
W(link, (fuse_req_t r, fuse_ino_t i, fuse_ino_t np, const char *nn), (r, i, np, nn))
W(open, (fuse_req_t r, fuse_ino_t i, struct fuse_file_info *fi), (r, i, fi))
W(read, (fuse_req_t r, fuse_ino_t i, size_t s, off_t o, struct fuse_file_info *fi),
  (r, i, s, o, fi))
W(write,
  (fuse_req_t r, fuse_ino_t i, const char *b, size_t s, off_t o, struct fuse_file_info *fi),
  (r, i, b, s, o, fi))
W(flush, (fuse_req_t r, fuse_ino_t i, struct fuse_file_info *fi), (r, i, fi))
W(release, (fuse_req_t r, fuse_ino_t i, struct fuse_file_info *fi), (r, i, fi))
W(fsync, (fuse_req_t r, fuse_ino_t i, int d, struct fuse_file_info *fi), (r, i, d, fi))
W(opendir, (fuse_req_t r, fuse_ino_t i, struct fuse_file_info *fi), (r, i, fi))
W(readdir, (fuse_req_t r, fuse_ino_t i, size_t s, off_t o, struct fuse_file_info *fi),
  (r, i, s, o, fi))
W(readdirplus, (fuse_req_t r, fuse_ino_t i, size_t s, off_t o, struct fuse_file_info *fi),
  (r, i, s, o, fi))
W(releasedir, (fuse_req_t r, fuse_ino_t i, struct fuse_file_info *fi), (r, i, fi))
W(fsyncdir, (fuse_req_t r, fuse_ino_t i, int d, struct fuse_file_info *fi), (r, i, d, fi))
W(statfs, (fuse_req_t r, fuse_ino_t i), (r, i))
W(setxattr, (fuse_req_t r, fuse_ino_t i, const char *nm, const char *v, size_t s, int f),
  (r, i, nm, v, s, f))
W(getxattr, (fuse_req_t r, fuse_ino_t i, const char *nm, size_t s), (r, i, nm, s))
W(listxattr, (fuse_req_t r, fuse_ino_t i, size_t s), (r, i, s))
W(removexattr, (fuse_req_t r, fuse_ino_t i, const char *nm), (r, i, nm))
W(access, (fuse_req_t r, fuse_ino_t i, int m), (r, i, m))
W(create, (fuse_req_t r, fuse_ino_t p, const char *nm, mode_t m, struct fuse_file_info *fi),
  (r, p, nm, m, fi))
W(getlk, (fuse_req_t r, fuse_ino_t i, struct fuse_file_info *fi, struct flock *l), (r, i, fi, l))
W(setlk, (fuse_req_t r, fuse_ino_t i, struct fuse_file_info *fi, struct flock *l, int s),
  (r, i, fi, l, s))
W(flock, (fuse_req_t r, fuse_ino_t i, struct fuse_file_info *fi, int op), (r, i, fi, op))
W(fallocate, (fuse_req_t r, fuse_ino_t i, int m, off_t o, off_t l, struct fuse_file_info *fi),
  (r, i, m, o, l, fi))
W(copy_file_range,
  (fuse_req_t r, fuse_ino_t a, off_t oa, struct fuse_file_info *fa, fuse_ino_t b, off_t ob,
   struct fuse_file_info *fb, size_t l, int f),
  (r, a, oa, fa, b, ob, fb, l, f))
W(lseek, (fuse_req_t r, fuse_ino_t i, off_t o, int w, struct fuse_file_info *fi),
  (r, i, o, w, fi))
#undef W

const struct fuse_lowlevel_ops *stk_fuse_metrics_start(const struct fuse_lowlevel_ops *ops)
{
	int rc;

	if (!listen_addr[0])
		return ops;
	rc = stk_metrics_ops_create("fuse", call_names, FC__COUNT, &calls);
	if (rc) {
		cli_err("mount", "metrics: %s", stk_strerror(rc));
		return NULL;
	}
	rc = stk_metrics_http_start(listen_addr, "mount", &http);
	if (rc) {
		cli_err("mount", "cannot serve metrics on %s: %s", listen_addr, stk_strerror(rc));
		stk_metrics_ops_destroy(calls);
		calls = NULL;
		return NULL;
	}
	stk_info("metrics on http://%s/metrics", stk_metrics_http_addr(http));
	inner = ops;
	wrapped = *ops;
#define CALL_WRAP(n)                                                                               \
	if (ops->n)                                                                                \
		wrapped.n = w_##n;
	FUSE_CALLS(CALL_WRAP)
#undef CALL_WRAP
	return &wrapped;
}

static stk_metric_t cache_series[8];
static stk_client *cache_client;

static void collect_cache(void *ctx)
{
	struct stk_ll_lease_stats st;
	struct stk_ll_names_stats bs;

	(void)ctx;
	stk_ll_leases_stats(cache_client, &st);
	stk_metric_set_int(cache_series[0], (int64_t)st.hits);
	stk_metric_set_int(cache_series[1], (int64_t)st.misses);
	stk_metric_set_int(cache_series[2], (int64_t)st.revoked);
	stk_metric_set_int(cache_series[3], (int64_t)st.resets);
	stk_ll_names_stats(cache_client, &bs);
	stk_metric_set_int(cache_series[4], (int64_t)bs.creates);
	stk_metric_set_int(cache_series[5], (int64_t)bs.unlinks);
	stk_metric_set_int(cache_series[6], (int64_t)bs.batches);
	stk_metric_set_int(cache_series[7], (int64_t)bs.failed);
}

void stk_fuse_metrics_cache(stk_client *c)
{
	static const char *const results[8] = {"hit",	 "miss",   "revoked", "reset",
					       "create", "unlink", "batch",   "failed"};
	int rc = 0;

	if (!http)
		return;
	for (int i = 0; i < 8 && !rc; i++) {
		const char *v[2] = {"fuse", results[i]};

		rc = stk_metric_series(i < 4 ? STK_M_CLIENT_LOOKUP_CACHE : STK_M_CLIENT_WRITE_BEHIND, v,
				       &cache_series[i]);
	}
	cache_client = c;
	if (rc || stk_metrics_collector_add(collect_cache, NULL))
		stk_warn("metrics: the lookup cache is not counted");
}

void stk_fuse_metrics_stop(void)
{
	if (cache_client) {
		stk_metrics_collector_remove(collect_cache, NULL);
		cache_client = NULL;
	}
	stk_metrics_http_stop(http);
	http = NULL;
	/* The ops set stays: a request thread of the finished loop may still hold it. */
}
