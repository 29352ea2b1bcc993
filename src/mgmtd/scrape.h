/*
 * Reading another daemon's /metrics from mgmtd: a small HTTP/1.0 GET over a
 * blocking socket with a deadline, and a walker over the Prometheus text format
 * that hands each sample line to a callback without copying the text.
 *
 * Only mgmtd's dashboard sampler (dash.c) uses it, from its own thread: a scrape
 * blocks for up to its timeout, so it must never run on a request thread or on
 * the metrics endpoint's thread. `stoker top` has its own reader in the CLI
 * (src/cli/top.c), which keeps whole scrapes for its table.
 */
#ifndef STK_MGMTD_SCRAPE_H
#define STK_MGMTD_SCRAPE_H

#include <stddef.h>

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
