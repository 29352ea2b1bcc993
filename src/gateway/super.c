/*
 * The supervisor behind `stoker gateway nfs` and `stoker gateway smb` (super.h):
 * the state folder and its lock, the private mount, and the file server run in
 * the foreground as a child, restarted when it dies.
 *
 * The server runs in a process group of its own, so that a Ctrl-C on the
 * gateway's terminal reaches the gateway alone, which then stops the server
 * before it unmounts (the other order would leave the server on a dead mount).
 * It also gets SIGTERM if the gateway dies (PR_SET_PDEATHSIG): a killed gateway
 * leaves no server behind; its mount is cleared by the next gateway on the same
 * state folder.
 */
#include "super.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../cli/cli.h"
#include "../common/log.h"
#include "../common/util.h"
#include "../daemon/daemon.h"

extern char **environ;

#define GW_BACKOFF_MAX_MS 30000u
#define GW_HEALTHY_NS (60ull * 1000000000ull) /* running this long resets the backoff */

int stk_gw_conf_value_ok(const char *v, size_t max)
{
	size_t n = strlen(v);

	if (n > max)
		return 0;
	for (size_t i = 0; i < n; i++) {
		unsigned char ch = (unsigned char)v[i];

		if (ch < ' ' || ch >= 0x7f || strchr("\"'\\{};#", ch))
			return 0;
	}
	return 1;
}

int stk_gw_state_open(struct stk_gw_super *s, const char *cmd, const char *state)
{
	char path[PATH_MAX + 32];
	int rc;

	s->lock_fd = -1;
	rc = stk_mkdir_p(state, 0711);
	if (rc) {
		cli_err(cmd, "--state %s: %s", state, stk_strerror(rc));
		return rc;
	}
	if (!realpath(state, s->state)) {
		rc = -errno;
		cli_err(cmd, "--state %s: %s", state, stk_strerror(rc));
		return rc;
	}
	/* Searchable, not readable, by others: smbd enters the shares below STATE/mnt
	 * as each client's user; what is secret (Samba's passdb) sits in 0700 folders. */
	chmod(s->state, 0711);
	/* The mount point's path goes into the servers' configuration files. */
	if (!stk_gw_conf_value_ok(s->state, PATH_MAX - 64) || strchr(s->state, ' ')) {
		cli_err(cmd, "--state %s: use a folder whose path has no spaces or quotes", state);
		return -EINVAL;
	}
	snprintf(s->mnt, sizeof(s->mnt), "%s/mnt", s->state);
	snprintf(path, sizeof(path), "%s/gateway.lock", s->state);
	s->lock_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (s->lock_fd < 0) {
		rc = -errno;
		cli_err(cmd, "%s: %s", path, stk_strerror(rc));
		return rc;
	}
	if (flock(s->lock_fd, LOCK_EX | LOCK_NB) != 0) {
		cli_err(cmd, "state folder %s is in use by another running gateway", s->state);
		close(s->lock_fd);
		s->lock_fd = -1;
		return -EBUSY;
	}
	if (mkdir(s->mnt, 0755) != 0 && errno != EEXIST && errno != ENOTCONN) {
		rc = -errno;
		cli_err(cmd, "%s: %s", s->mnt, stk_strerror(rc));
		return rc;
	}
	return 0;
}

int stk_gw_port_free(const char *host, uint16_t port)
{
	struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
				 .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
	struct addrinfo *ai = NULL;
	char ps[8];
	int fd, rc, one = 1;

	snprintf(ps, sizeof(ps), "%u", port);
	if (getaddrinfo(host[0] ? host : NULL, ps, &hints, &ai) != 0 || !ai)
		return -EADDRNOTAVAIL;
	fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		rc = -errno;
		goto out;
	}
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	rc = bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 ? 0 : -errno;
	close(fd);
out:
	freeaddrinfo(ai);
	return rc;
}

/* 1 once something accepts a TCP connection on host:port. */
static int answers(const char *host, uint16_t port)
{
	struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
				 .ai_flags = AI_NUMERICSERV};
	struct addrinfo *ai = NULL;
	const char *h = host[0] && strcmp(host, "0.0.0.0") && strcmp(host, "::") ? host
										     : "127.0.0.1";
	char ps[8];
	int fd, ok = 0;

	snprintf(ps, sizeof(ps), "%u", port);
	if (getaddrinfo(h, ps, &hints, &ai) != 0 || !ai)
		return 0;
	fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd >= 0) {
		ok = connect(fd, ai->ai_addr, ai->ai_addrlen) == 0;
		close(fd);
	}
	freeaddrinfo(ai);
	return ok;
}

/* Runs `stoker ARGS...` (this binary) and waits: its exit status, or -1. */
static int run_self(const struct stk_gw_super *s, char *const args[])
{
	pid_t pid = fork();
	int st;

	if (pid < 0)
		return -1;
	if (pid == 0) {
		signal(SIGINT, SIG_DFL);
		signal(SIGTERM, SIG_DFL);
		execv(s->exe, args);
		_exit(127);
	}
	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR)
			return -1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int stk_gw_mount(struct stk_gw_super *s, const char *addr, const char *dir, const char *extra)
{
	char url[STK_CLUSTER_ADDR_MAX + PATH_MAX + 16], opt[PATH_MAX + 256];
	char *mnt_args[] = {"stoker", "mount", url, s->mnt, "-o", opt, NULL};
	char *umnt_args[] = {"stoker", "umount", "-l", s->mnt, NULL};
	struct stat st, up;

	/*
	 * We hold the state folder's lock, so a mount there is a leftover of a gateway
	 * that was killed: dead (ENOTCONN), or alive with nobody serving it. Clear it.
	 */
	if ((stat(s->mnt, &st) != 0 && errno == ENOTCONN) ||
	    (stat(s->state, &up) == 0 && stat(s->mnt, &st) == 0 && st.st_dev != up.st_dev)) {
		stk_warn("%s gateway: clearing the mount a killed gateway left on %s", s->name,
			 s->mnt);
		run_self(s, umnt_args);
	}
	snprintf(url, sizeof(url), "stk://%s%s", addr, strcmp(dir, "/") ? dir : "");
	/* attr_timeout=0, entry_timeout=0: a server keeps files open and stats them to
	 * decide what its clients see; the kernel must not answer from a cache that
	 * another client's change has not reached. Except under a lease
	 * (leased_attr_timeout): the mount makes the kernel forget those attributes
	 * before meta lets anyone change them, which spares the round trip through
	 * FUSE of the several stats Ganesha makes per NFS READ. */
	snprintf(opt, sizeof(opt),
		 "allow_other,default_permissions,attr_timeout=0,entry_timeout=0,"
		 "leased_attr_timeout=1,log=%s/mount.log%s%s",
		 s->state, extra && extra[0] ? "," : "", extra ? extra : "");
	if (run_self(s, mnt_args) != 0)
		return -EIO;
	s->mounted = 1;
	return 0;
}

/* Forks the server with its output in s->server_log. */
static int spawn(struct stk_gw_super *s)
{
	size_t nenv = 0, nadd = 0;
	char **env;
	pid_t pid;
	int fd;

	while (environ[nenv])
		nenv++;
	while (s->envp[nadd])
		nadd++;
	/* Built before fork: the gateway has threads, and the child may only exec. */
	env = calloc(nenv + nadd + 1, sizeof(*env));
	if (!env)
		return -ENOMEM;
	for (size_t i = 0; i < nadd; i++)
		env[i] = s->envp[i];
	memcpy(env + nadd, environ, nenv * sizeof(*env));
	fd = open(s->server_log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
	if (fd < 0) {
		free(env);
		return -errno;
	}
	pid = fork();
	if (pid < 0) {
		close(fd);
		free(env);
		return -errno;
	}
	if (pid == 0) {
		setpgid(0, 0);
		prctl(PR_SET_PDEATHSIG, SIGTERM);
		signal(SIGINT, SIG_DFL);
		signal(SIGTERM, SIG_DFL);
		signal(SIGPIPE, SIG_DFL);
		dup2(fd, 1);
		dup2(fd, 2);
		execve(s->argv[0], s->argv, env);
		_exit(127);
	}
	close(fd);
	free(env);
	s->pid = pid;
	return 0;
}

/* Reaps the server if it exited: 1 (and s->pid = 0), else 0. */
static int reaped(struct stk_gw_super *s, int *status)
{
	if (s->pid <= 0)
		return 1;
	if (waitpid(s->pid, status, WNOHANG) != s->pid)
		return 0;
	s->pid = 0;
	return 1;
}

static void kill_server(struct stk_gw_super *s)
{
	int st;

	if (s->pid <= 0)
		return;
	kill(s->pid, SIGTERM);
	for (int i = 0; i < 200 && !reaped(s, &st); i++)
		usleep(50000);
	if (s->pid > 0) {
		stk_warn("%s gateway: %s did not stop in 10 s; killing it", s->name, s->argv[0]);
		kill(-s->pid, SIGKILL);
		kill(s->pid, SIGKILL);
		waitpid(s->pid, &st, 0);
		s->pid = 0;
	}
}

int stk_gw_start(struct stk_gw_super *s, unsigned timeout_ms)
{
	uint64_t end = stk_now_ns() + (uint64_t)timeout_ms * 1000000ull;
	int rc, st = 0;

	rc = spawn(s);
	if (rc)
		return rc;
	while (stk_now_ns() < end && !stk_daemon_stopping()) {
		if (reaped(s, &st)) {
			if (WIFEXITED(st) && WEXITSTATUS(st) == 127)
				stk_error("%s gateway: could not run %s", s->name, s->argv[0]);
			return -ECHILD;
		}
		if (answers(s->host, s->port))
			return 0;
		usleep(50000);
	}
	kill_server(s);
	return -ETIMEDOUT;
}

int stk_gw_supervise(struct stk_gw_super *s)
{
	unsigned backoff = 1000;
	uint64_t started = stk_now_ns();
	int st = 0, rc;

	while (!stk_daemon_stopping()) {
		if (!reaped(s, &st)) {
			stk_daemon_sleep_ms(200);
			continue;
		}
		if (WIFSIGNALED(st))
			stk_warn("%s gateway: %s was killed by signal %d; restarting it (log: %s)",
				 s->name, s->argv[0], WTERMSIG(st), s->server_log);
		else
			stk_warn("%s gateway: %s exited with status %d; restarting it (log: %s)",
				 s->name, s->argv[0], WEXITSTATUS(st), s->server_log);
		if (stk_now_ns() - started > GW_HEALTHY_NS)
			backoff = 1000;
		if (stk_daemon_sleep_ms(backoff))
			break;
		backoff = backoff * 2 > GW_BACKOFF_MAX_MS ? GW_BACKOFF_MAX_MS : backoff * 2;
		s->restarts++;
		started = stk_now_ns();
		rc = stk_gw_start(s, 30000);
		if (rc)
			stk_warn("%s gateway: restart failed (%s); trying again", s->name,
				 stk_strerror(rc));
		else
			stk_info("%s gateway: %s serves again (restart %u)", s->name, s->argv[0],
				 s->restarts);
	}
	return 0;
}

void stk_gw_stop(struct stk_gw_super *s)
{
	char *umnt[] = {"stoker", "umount", s->mnt, NULL};
	char *lazy[] = {"stoker", "umount", "-l", s->mnt, NULL};

	kill_server(s);
	if (s->mounted) {
		/* A client's open file may hold it a moment after the server went. */
		int rc = run_self(s, umnt);

		for (int i = 0; rc != 0 && i < 20; i++) {
			usleep(100000);
			rc = run_self(s, umnt);
		}
		if (rc != 0)
			run_self(s, lazy);
		s->mounted = 0;
	}
	if (s->lock_fd >= 0) {
		close(s->lock_fd);
		s->lock_fd = -1;
	}
}
