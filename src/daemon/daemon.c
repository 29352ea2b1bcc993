/* Signal handling for daemons: a stop flag and a pipe to wake sleepers. */
#include "daemon.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "../net/net.h"
#include "../common/log.h"

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
