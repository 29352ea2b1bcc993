/*
 * Reading a daemon's /metrics (or /healthz): a small HTTP/1.0 GET over a blocking
 * socket with a deadline, and a walker over the Prometheus text format that hands
 * each sample line to a callback without copying the text.
 *
 * mgmtd's dashboard sampler (src/mgmtd/dash.c) and the CLI's `stoker top` and
 * `stoker doctor` (src/cli/prom.c, which keeps whole scrapes for sums, rates and
 * quantiles) use it. A GET blocks for up to its timeout: in a daemon, never on a
 * request thread or on the metrics endpoint's thread.
 */
#ifndef STK_COMMON_SCRAPE_H
#define STK_COMMON_SCRAPE_H

#include <stddef.h>
#include <time.h>

/*
 * GET http://addr/path ("HOST:PORT", "[v6]:PORT"), waiting at most timeout_ms for
 * the connection and for each read; the body, NUL-terminated, in *body (free()),
 * if the status is 200 and the body is at most max bytes. 0, -EINVAL (malformed
 * address), -EHOSTUNREACH (name not resolved), -ETIMEDOUT, -EFBIG, -EBADMSG (not
 * an HTTP 200 answer), -ENOMEM or -errno of the socket. Blocks; any thread.
 */
int stk_scrape_get(const char *addr, const char *path, unsigned timeout_ms, size_t max,
		   char **body);
/*
 * stk_scrape_get, and, when date is not NULL, *date the reply's Date header in
 * seconds since the epoch (0 when it has none or it does not parse).
 */
int stk_scrape_get_dated(const char *addr, const char *path, unsigned timeout_ms, size_t max,
			 char **body, time_t *date);

/*
 * Calls fn(ctx, name, labels, value) for each sample line of the exposition text
 * `text` ("name{labels} value [timestamp]"), skipping comments and malformed lines.
 * name and labels (the text between the braces, "" without) are NUL-terminated in
 * place: text is modified, and the pointers are valid only during the call.
 */
void stk_scrape_parse(char *text,
		      void (*fn)(void *ctx, const char *name, const char *labels, double value),
		      void *ctx);

/*
 * The value of label `key` in labels (as stk_scrape_parse hands them), unescaped
 * into out (truncated to len - 1 bytes). 0 or -ENOENT.
 */
int stk_scrape_label(const char *labels, const char *key, char *out, size_t len);

#endif
