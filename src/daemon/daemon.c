/*
 * What the daemons share. Signal handling: a stop flag and a pipe to wake sleepers.
 * stk_daemon_run(): the start-up and teardown around a daemon's RPC server, in one
 * order for all of them (daemon.h): /metrics, the server, the daemon's start hook,
 * serving; then the same steps undone backwards.
 */
#include "daemon.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "../common/auth.h"
#include "../common/log.h"
#include "../common/metrics.h"
#include "../net/net.h"
#include "metrics_http.h"

static volatile sig_atomic_t g_stopping;
static struct stk_server *volatile g_server;
static int g_wake[2] = {-1, -1};

static void on_signal(int sig)
{
	(void)sig;
	stk_daemon_request_stop();
}

void stk_daemon_request_stop(void)
{
	int saved = errno;
	char c = 1;

	g_stopping = 1;
	if (g_server)
		stk_server_stop(g_server);
	if (g_wake[1] >= 0 && write(g_wake[1], &c, 1) < 0) {
		/* already woken */
	}
	errno = saved;
}

void stk_daemon_init(const char *role)
{
	struct sigaction sa;

	stk_log_set_role(role);
	if (g_wake[0] < 0 && pipe2(g_wake, O_CLOEXEC | O_NONBLOCK) < 0)
		stk_warn("pipe: %s", strerror(errno));
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);
}

void stk_daemon_set_server(struct stk_server *s)
{
	g_server = s;
	if (g_stopping && s)
		stk_server_stop(s);
}

int stk_daemon_stopping(void)
{
	return g_stopping;
}

int stk_daemon_sleep_ms(unsigned ms)
{
	struct pollfd pfd = {.fd = g_wake[0], .events = POLLIN};

	if (g_stopping)
		return 1;
	if (g_wake[0] < 0) {
		usleep(ms * 1000);
		return g_stopping;
	}
	poll(&pfd, 1, (int)ms);
	return g_stopping;
}

/* ---- the start-up skeleton ---- */

struct stk_daemon {
	struct stk_server *server;     /* NULL until created */
	struct stk_metrics_http *http; /* NULL without metrics */
	struct stk_metrics_ops *rpc;   /* NULL without metrics */
};

const char *stk_daemon_addr(const struct stk_daemon *d)
{
	return stk_server_addr(d->server);
}

const char *stk_daemon_metrics_addr(const struct stk_daemon *d)
{
	return d->http ? stk_metrics_http_addr(d->http) : NULL;
}

struct stk_metrics_http *stk_daemon_metrics_http(const struct stk_daemon *d)
{
	return d->http;
}

struct stk_metrics_ops *stk_daemon_rpc_metrics(const struct stk_daemon *d)
{
	return d->rpc;
}

/* /metrics, the RPC counts, then the daemon's own series; *hooked once its hook ran. */
static int metrics_start(const struct stk_daemon_spec *sp, struct stk_daemon *d, int *hooked)
{
	int rc;

	rc = stk_metrics_http_start(sp->metrics_listen, sp->role, &d->http);
	if (!rc)
		rc = stk_metrics_rpc_create(sp->rpc_lo, sp->rpc_hi, &d->rpc);
	if (!rc && sp->metrics) {
		*hooked = 1;
		rc = sp->metrics(sp->ctx, d);
	}
	if (rc)
		stk_error("cannot serve metrics on %s: %s", sp->metrics_listen, strerror(-rc));
	return rc;
}

static void log_listen_error(const char *addr, int rc)
{
	if (rc == -EADDRINUSE)
		stk_error("cannot listen on %s: address already in use", addr);
	else
		stk_error("cannot listen on %s: %s", addr, strerror(-rc));
}

static uint8_t daemon_key[STK_AUTH_KEY_MAX];
static size_t daemon_key_len;

int stk_daemon_auth(const char *key_file, char *err, size_t errlen)
{
	uint8_t key[STK_AUTH_KEY_MAX];
	size_t len = 0;
	int rc;

	if (!key_file) {
		daemon_key_len = 0;
		return 0;
	}
	rc = stk_auth_key_load(key_file, key, &len, err, errlen);
	if (rc)
		return rc;
	rc = stk_net_auth_set(key, len);
	if (rc) {
		snprintf(err, errlen, "cannot hold the key of %s: %s", key_file, strerror(-rc));
		return rc;
	}
	memcpy(daemon_key, key, len);
	daemon_key_len = len;
	memset(key, 0, sizeof(key));
	/* a daemon with a key talks only to peers that prove it: no keyless impostor */
	stk_net_auth_strict();
	return 0;
}

size_t stk_daemon_key(uint8_t *key)
{
	memcpy(key, daemon_key, daemon_key_len);
	return daemon_key_len;
}

int stk_daemon_run(const struct stk_daemon_spec *spec)
{
	struct stk_daemon d = {0};
	struct stk_server_opts so;
	int metrics_hooked = 0, started = 0, rc;

	if (!spec || spec->size < sizeof(*spec) || !spec->role || !spec->server)
		return -EINVAL;
	if (spec->metrics_listen) {
		rc = metrics_start(spec, &d, &metrics_hooked);
		if (rc)
			goto out;
	}
	so = *spec->server;
	so.metrics = d.rpc;
	if (daemon_key_len) {
		so.auth_key = daemon_key;
		so.auth_key_len = daemon_key_len;
	}
	rc = stk_server_create(&so, &d.server);
	if (rc) {
		log_listen_error(so.listen, rc);
		d.server = NULL;
		goto out;
	}
	/* From here a stop signal stops the server too, also one that comes while start runs. */
	stk_daemon_set_server(d.server);
	if (spec->start) {
		started = 1;
		rc = spec->start(spec->ctx, &d);
		if (rc) {
			if (rc == -EINTR && stk_daemon_stopping())
				rc = 0; /* stopped before serving */
			goto out;
		}
	}
	rc = stk_server_run(d.server);
	if (rc && !spec->quiet_stop)
		stk_error("%s: serving failed: %s", spec->role, strerror(-rc));
	else if (!spec->quiet_stop)
		stk_info("%s stopping", spec->role);
out:
	stk_daemon_set_server(NULL);
	if (started && spec->stop)
		spec->stop(spec->ctx);
	stk_metrics_http_stop(d.http); /* no scrape reads the daemon's state after this */
	if (metrics_hooked && spec->metrics_stop)
		spec->metrics_stop(spec->ctx);
	/* Handlers use the daemon's state and the RPC counts until the server is gone. */
	stk_server_destroy(d.server);
	stk_metrics_ops_destroy(d.rpc);
	return rc;
}
