/*
 * The /metrics endpoint of a Stoker process: the daemons, the mount and the
 * gateways serve what common/metrics.h counts over HTTP (libmicrohttpd). It lives
 * here, beside the daemon skeleton, and not in common/, so that libstoker, which
 * counts but never serves, links no HTTP server.
 */
#ifndef STK_DAEMON_METRICS_HTTP_H
#define STK_DAEMON_METRICS_HTTP_H

struct stk_metrics_http;

/*
 * Serves GET /metrics (the exposition above) and GET /healthz ("ok") on listen,
 * "HOST:PORT" (port 0 picks a free one), from a thread of its own; also registers
 * the process and host collectors and stoker_build_info{role}. One per process.
 * 0, -EINVAL (malformed address), -EADDRINUSE, -EALREADY (already started), -ENOMEM
 * or -errno.
 */
int stk_metrics_http_start(const char *listen, const char *role, struct stk_metrics_http **out);
/* The bound "HOST:PORT". Valid until stop. */
const char *stk_metrics_http_addr(const struct stk_metrics_http *h);
/* Stops serving and waits for a scrape in progress. NULL is fine. */
void stk_metrics_http_stop(struct stk_metrics_http *h);

#endif
