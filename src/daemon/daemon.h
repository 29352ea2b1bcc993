/*
 * What every daemon shares: signal handling and the stop request, and the start-up
 * and teardown around its RPC server.
 *
 * stk_daemon_init() installs SIGINT/SIGTERM handlers (and ignores SIGPIPE); when
 * one arrives, the server registered with stk_daemon_set_server() is told to stop
 * (stk_server_stop is async-signal-safe) and stk_daemon_stopping() turns true, so
 * background threads (heartbeats, flushers) finish their loop and exit.
 *
 * stk_daemon_run() is the part of mgmtd's, meta's and storage's lives that is the
 * same in all three: it serves /metrics if asked, creates the RPC server from the
 * options the daemon built, lets the daemon start what needs the server's address
 * (joining the cluster, background threads), serves until a stop, and tears all of
 * it down in the reverse order. What is the daemon's own stays in its run function,
 * before and after:
 *
 *	stk_daemon_init("mgmtd");
 *	(check the options, open the daemon's state)
 *	rc = stk_daemon_run(&spec);
 *	(close the daemon's state)
 *	return rc;
 *
 * The daemon's part in between comes through the hooks of struct stk_daemon_spec,
 * each called on the thread that called stk_daemon_run(), in this order:
 *
 *	metrics        with metrics_listen only, once /metrics serves
 *	start          once the server listens, before it serves
 *	(the server serves until a stop)
 *	stop           if start was called
 *	metrics_stop   if metrics was called, once /metrics no longer serves
 *	(the server is destroyed: no handler runs after this)
 */
#ifndef STK_DAEMON_DAEMON_H
#define STK_DAEMON_DAEMON_H

#include <stddef.h>
#include <stdint.h>

struct stk_metrics_http;
struct stk_metrics_ops;
struct stk_server;
struct stk_server_opts;

/* Names the process in the log ("mgmtd") and installs the signal handlers. Call first. */
void stk_daemon_init(const char *role);
/*
 * The server a stop signal stops (NULL: none); stopped at once if a stop was already
 * requested. stk_daemon_run() registers its own; s must stay valid until replaced.
 */
void stk_daemon_set_server(struct stk_server *s);
/* 1 once a stop was requested (a signal or stk_daemon_request_stop()). Any thread. */
int stk_daemon_stopping(void);
/* Asks the daemon to stop, as a signal would. Async-signal-safe; any thread. */
void stk_daemon_request_stop(void);
/* Sleeps up to ms milliseconds, returning early (1) if a stop was requested. */
int stk_daemon_sleep_ms(unsigned ms);

/*
 * The cluster key (docs/security.md): with key_file, the key in it (common/auth.h's
 * rules: mode 0600, hex) is required of every connection to this daemon's server
 * and presented on every connection it opens (net.h, stk_net_auth_set). NULL: no
 * key, every peer that reaches the port is trusted (--auth off, or a daemon started
 * without either, which the caller warns of). Call before stk_daemon_run(). 0, or
 * -errno with err set to a line for a person (the file's error: missing, readable
 * by others, not a key).
 */
int stk_daemon_auth(const char *key_file, char *err, size_t errlen);
/*
 * The key stk_daemon_auth() loaded, copied into key (STK_AUTH_KEY_MAX bytes); its
 * length, 0 when the daemon has none. For what the daemon checks itself beside
 * its RPC server (mgmtd's signed job reports). Any thread after stk_daemon_auth().
 */
size_t stk_daemon_key(uint8_t *key);

/*
 * One run of stk_daemon_run(), handed to the hooks. It lives on stk_daemon_run()'s
 * stack: valid only during a hook, and only on that thread.
 */
struct stk_daemon;

struct stk_daemon_spec {
	size_t size; /* sizeof(struct stk_daemon_spec) */
	/* "mgmtd", "meta", "storage": for the log lines and stoker_build_info{role}. */
	const char *role;
	/*
	 * The RPC server's options (listen address, handler and its ctx, workers), built
	 * by the daemon and passed to stk_server_create() as they are, but for metrics:
	 * stk_daemon_run() sets it to its own RPC counts (NULL without metrics_listen).
	 * Read during the call only.
	 */
	const struct stk_server_opts *server;
	/* "HOST:PORT" to serve /metrics on (port 0 picks a free one); NULL: no metrics. */
	const char *metrics_listen;
	/* The opcodes this daemon serves, counted one by one (stk_metrics_rpc_create). */
	uint16_t rpc_lo, rpc_hi;
	/*
	 * 0: when the server returns, log "ROLE stopping", or "ROLE: serving failed:
	 * ERROR". 1: the daemon says it stopped itself.
	 */
	int quiet_stop;
	void *ctx; /* given to every hook; the server's handler has its own, in server */
	/*
	 * Optional. /metrics serves and the RPC counts exist (stk_daemon_rpc_metrics);
	 * the server does not yet. Adds the daemon's own series and collectors, and keeps
	 * the RPC counts if its handlers count per client. 0 or -errno, which is logged as
	 * "cannot serve metrics on LISTEN: ERROR" and ends the run.
	 */
	int (*metrics)(void *ctx, struct stk_daemon *d);
	/*
	 * Optional. Called once /metrics no longer serves if metrics was called, even if
	 * it failed part-way: removes what metrics added (no scrape runs now). The server
	 * may still be finishing handlers, so nothing they use may go yet.
	 */
	void (*metrics_stop)(void *ctx);
	/*
	 * Optional. The server listens on stk_daemon_addr() and a stop signal stops it;
	 * none of its handlers runs until start returns 0. Starts what needs the address
	 * or runs beside the server (the node agent, background threads) and logs that
	 * the daemon serves. 0, or -errno, logged by start itself, which ends the run:
	 * with 0 if it is -EINTR and a stop was requested (a signal while it waited for
	 * mgmtd), with the error otherwise.
	 */
	int (*start)(void *ctx, struct stk_daemon *d);
	/*
	 * Optional. Called after the server stopped serving if start was called, even if
	 * start failed part-way, and before metrics_stop: ends what start began (joins its
	 * threads). The server may still be finishing handlers.
	 */
	void (*stop)(void *ctx);
};

/*
 * Runs a daemon's RPC server from start-up to teardown, as described above, and
 * returns once it is torn down: after a stop signal or stk_daemon_request_stop(), or
 * at the first failure. Call stk_daemon_init() first; one at a time per process (a
 * stop signal reaches one server). What the hooks were given (the daemon's state)
 * is the caller's again when it returns.
 *
 * 0 after a stop (also a stop while start waited); -EINVAL (spec malformed, nothing
 * logged); or the -errno of the first failure, each logged: /metrics or the metrics
 * hook ("cannot serve metrics on LISTEN: ERROR"), stk_server_create() ("cannot
 * listen on ADDR: ERROR"), the start hook, or stk_server_run().
 */
int stk_daemon_run(const struct stk_daemon_spec *spec);

/* The server's bound "HOST:PORT". From the start hook on. */
const char *stk_daemon_addr(const struct stk_daemon *d);
/* The bound "HOST:PORT" of /metrics; NULL without metrics_listen. */
const char *stk_daemon_metrics_addr(const struct stk_daemon *d);
/*
 * The /metrics endpoint itself, for a daemon that adds a route to it
 * (stk_metrics_http_route); NULL without metrics_listen. From the metrics hook on,
 * until the metrics_stop hook.
 */
struct stk_metrics_http *stk_daemon_metrics_http(const struct stk_daemon *d);
/*
 * The RPC counts the server counts into, for per-client counts in handlers
 * (stk_metrics_ops_client); NULL without metrics_listen. From the metrics hook on;
 * freed after the server, before stk_daemon_run() returns.
 */
struct stk_metrics_ops *stk_daemon_rpc_metrics(const struct stk_daemon *d);

#endif
