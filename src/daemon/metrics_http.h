/*
 * The /metrics endpoint of a Stoker process: the daemons, the mount and the
 * gateways serve what common/metrics.h counts over HTTP (libmicrohttpd). It lives
 * here, beside the daemon skeleton, and not in common/, so that libstoker, which
 * counts but never serves, links no HTTP server.
 */
#ifndef STK_DAEMON_METRICS_HTTP_H
#define STK_DAEMON_METRICS_HTTP_H

#include <stddef.h>

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
/*
 * What a route's handler answers (stk_metrics_http_route). The handler fills it;
 * the endpoint sends it and then frees body if owned.
 */
struct stk_metrics_http_answer {
	unsigned status;  /* HTTP status; 200 when left 0 */
	const char *type; /* Content-Type, a static string */
	const char *body; /* len bytes; static unless owned */
	size_t len;
	int owned;	    /* body was malloc'ed: the endpoint frees it once sent */
	const char *cache;  /* Cache-Control, static, or NULL for none */
	char location[256]; /* Location header for a redirect, "" for none */
};

/*
 * Handles a GET or HEAD of a path the endpoint does not serve itself, on the
 * endpoint's thread: it must answer quickly (it delays scrapes) and must not block
 * on the network. url is the path without the query string.
 */
typedef void (*stk_metrics_http_fn)(void *ctx, const char *url, struct stk_metrics_http_answer *a);

/*
 * Sends every GET or HEAD of a path under prefix ("/ui": "/ui" and "/ui/...") to
 * fn(ctx, ...). One route per endpoint, set once; fn and ctx must stay valid until
 * stk_metrics_http_stop(). Every answer carries X-Content-Type-Options: nosniff, and
 * a Content-Security-Policy that allows nothing but the endpoint's own scripts,
 * styles and images: a route serves a page that must load nothing from elsewhere.
 * 0, -EINVAL (prefix not "/..." or too long) or -EBUSY (a route is set already).
 * Any thread.
 */
int stk_metrics_http_route(struct stk_metrics_http *h, const char *prefix, stk_metrics_http_fn fn,
			   void *ctx);
/*
 * Handles a POST of path, on the endpoint's thread, once its whole body (len
 * bytes, not NUL-terminated, valid during the call only) has arrived; the same
 * rules as a route's handler. url is the path without the query string; signature
 * the request's X-Stoker-Signature header (NULL without one), for the handler to
 * check.
 */
typedef void (*stk_metrics_http_post_fn)(void *ctx, const char *url, const char *body, size_t len,
					 const char *signature, struct stk_metrics_http_answer *a);

/*
 * Accepts POST of exactly path (which must lie under the route's prefix, or
 * anywhere else but /metrics and /healthz) with a body of at most max_body bytes
 * (1 to 1 MiB); a longer one is answered 413 without reaching fn, a POST of any
 * other path 405. One per endpoint, set once; fn and ctx must stay valid until
 * stk_metrics_http_stop(). 0, -EINVAL or -EBUSY. Any thread.
 */
int stk_metrics_http_post(struct stk_metrics_http *h, const char *path, size_t max_body,
			  stk_metrics_http_post_fn fn, void *ctx);
/* Stops serving and waits for a scrape in progress. NULL is fine. */
void stk_metrics_http_stop(struct stk_metrics_http *h);

#endif
