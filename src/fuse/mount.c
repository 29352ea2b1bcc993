/*
 * `stoker mount` and `stoker umount`.
 *
 * mount checks everything it can before touching the kernel, so that a mistake
 * gives one clear line and a non-zero exit instead of a half-made mount: the
 * options, the mount point (exists, is a folder, is empty unless -o nonempty,
 * is not a dead mount), the cluster (reachable) and the folder to mount in it
 * (exists, is a folder). Then it forks: the child becomes the daemon (its own
 * session, cwd /), mounts, and runs the multi-threaded session loop; a helper
 * thread in the child waits until a stat of the mount point answers from the
 * new file system, and only then tells the parent "ok" through a pipe. So when
 * `stoker mount` returns 0 the mount serves, and scripts need no sleep. With -f
 * the same runs in the foreground with logs on stderr.
 *
 * The daemon records "PID STARTTIME" in /tmp/stoker-UID/mount-MAJ:MIN.pid, named
 * after the mount's device, which /proc/self/mountinfo gives without touching the
 * mount (a stat of a dead or hung FUSE mount fails or blocks). umount finds the
 * mount there, unmounts it (umount2 as root, fusermount3 -u otherwise), and
 * waits for the daemon to exit: by then every handle is closed and what it
 * buffered is durable. A mount whose daemon died (kill -9) is detached.
 */
#include "fs.h"
#include "metrics.h"

#include "../cli/cli.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <glob.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../common/log.h"
#include "../common/util.h"

#define STK_MOUNT_READY_S 60 /* how long mount waits for the new mount to answer */
#define STK_UMOUNT_WAIT_S 60 /* how long umount waits for the daemon to exit */

void stk_fuse_opts_default(struct stk_fuse_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->attr_timeout = 1.0;
	o->entry_timeout = 1.0;
	o->negative_timeout = 0.0;
	o->readahead = 16u << 20;
	o->uring = 1;
	o->writebehind = 1;
}

/* ---- options ---- */

static int parse_seconds(const char *v, double *out)
{
	char *end;
	double d;

	if (!v || !*v)
		return -EINVAL;
	errno = 0;
	d = strtod(v, &end);
	if (errno || *end || !(d >= 0 && d <= 86400))
		return -EINVAL;
	*out = d;
	return 0;
}

/* Applies one "key" or "key=value" of -o. 0, or -EINVAL after printing why. */
static int apply_opt(struct stk_fuse_opts *o, const char *key, const char *val)
{
	uint64_t v;

	if (strcmp(key, "attr_timeout") == 0 || strcmp(key, "entry_timeout") == 0 ||
	    strcmp(key, "negative_timeout") == 0) {
		double *d = key[0] == 'a' ? &o->attr_timeout
			    : key[0] == 'e' ? &o->entry_timeout
					    : &o->negative_timeout;
		if (parse_seconds(val, d) == 0)
			return 0;
		cli_err("mount", "-o %s needs seconds from 0 to 86400, e.g. %s=1.0", key, key);
		return -EINVAL;
	}
	if (strcmp(key, "leased_attr_timeout") == 0) {
		if (parse_seconds(val, &o->leased_attr_timeout) == 0 &&
		    o->leased_attr_timeout <= 60)
			return 0;
		cli_err("mount", "-o leased_attr_timeout needs seconds from 0 to 60, e.g. "
				 "leased_attr_timeout=1");
		return -EINVAL;
	}
	if (strcmp(key, "timeout") == 0) {
		double t;

		if (parse_seconds(val, &t) == 0) {
			/* 0: a hard mount, calls wait for the cluster however long it takes */
			o->timeout_ms = t == 0 ? STK_RETRY_FOREVER : (uint32_t)(t * 1000.0 + 0.5);
			if (o->timeout_ms == 0)
				o->timeout_ms = 1;
			return 0;
		}
		cli_err("mount", "-o timeout needs seconds from 0 (wait forever) to 86400, e.g. "
				 "timeout=60");
		return -EINVAL;
	}
	if (strcmp(key, "readahead") == 0) {
		if (val && stk_parse_size(val, &v) == 0 && v <= (1ull << 30)) {
			o->readahead = v;
			return 0;
		}
		cli_err("mount", "-o readahead needs a size up to 1G, e.g. readahead=16M");
		return -EINVAL;
	}
	if (strcmp(key, "max_threads") == 0) {
		if (val && stk_parse_u64(val, &v) == 0 && v >= 1 && v <= 1024) {
			o->max_threads = (unsigned)v;
			return 0;
		}
		cli_err("mount", "-o max_threads needs a number from 1 to 1024");
		return -EINVAL;
	}
	if (strcmp(key, "metrics") == 0) {
		if (stk_fuse_metrics_opt(val) == 0)
			return 0;
		cli_err("mount", "-o metrics needs HOST:PORT, e.g. metrics=127.0.0.1:9114");
		return -EINVAL;
	}
	if (strcmp(key, "key") == 0) {
		/* absolute: the daemon leaves the working folder behind */
		if (val && *val && realpath(val, o->key_file))
			return 0;
		cli_err("mount",
			"-o key needs a key file (a cluster key, or a client key from "
			"`stoker admin client add`)%s%s",
			val && *val ? ": " : "", val && *val ? strerror(errno) : "");
		return -EINVAL;
	}
	if (strcmp(key, "log") == 0) {
		if (val && *val && stk_strlcpy(o->log, val, sizeof(o->log)) == 0)
			return 0;
		cli_err("mount", "-o log needs a file name");
		return -EINVAL;
	}
	if (val) {
		cli_err("mount", "-o %s takes no value", key);
		return -EINVAL;
	}
	if (strcmp(key, "writeback") == 0)
		o->writeback = 1;
	else if (strcmp(key, "allow_other") == 0)
		o->allow_other = 1;
	else if (strcmp(key, "default_permissions") == 0)
		o->kernel_perms = 1;
	else if (strcmp(key, "uring") == 0)
		o->uring = 1;
	else if (strcmp(key, "nouring") == 0)
		o->uring = 0;
	else if (strcmp(key, "ro") == 0)
		o->ro = 1;
	else if (strcmp(key, "rw") == 0)
		o->ro = 0;
	else if (strcmp(key, "nonempty") == 0)
		o->nonempty = 1;
	else if (strcmp(key, "noatime") == 0)
		o->noatime = 1;
	else if (strcmp(key, "relatime") == 0)
		o->noatime = 0;
	else if (strcmp(key, "writebehind") == 0)
		o->writebehind = 1;
	else if (strcmp(key, "nowritebehind") == 0)
		o->writebehind = 0;
	else if (strcmp(key, "flush") == 0)
		o->flush = 1;
	else if (strcmp(key, "noflush") == 0)
		o->flush = 0;
	else if (strcmp(key, "debug") == 0)
		o->debug = 1;
	else {
		cli_err("mount", "unknown option -o %s (see docs/mount.md)", key);
		return -EINVAL;
	}
	return 0;
}

/*
 * Whether the kernel checks permissions too (default_permissions). Meta checks
 * every call with the caller's credentials either way, and the mount answers
 * access(2) itself (ops.c). The kernel's check costs a GETATTR of a folder after
 * every change in it (the kernel drops a folder's attributes when its entries
 * change), so a create is five requests instead of four. It is left out only
 * when nobody but root can enter: mounted by root without allow_other, where
 * every caller passes every rwx check and the kernel itself still refuses to
 * execute a file with no x bit. -o default_permissions keeps it regardless.
 */
static int kernel_perms(const struct stk_fuse_opts *o)
{
	return o->kernel_perms || o->allow_other || getuid() != 0 || geteuid() != 0;
}

/*
 * The kernel offers FUSE over io_uring (uring.c) only while this module setting
 * is on, and decides when it sends INIT, so before the mount. Root turns it on
 * (it only lets FUSE servers that ask for io_uring have it); anyone else uses it
 * if it is on. 1 if on.
 */
static int enable_uring(void)
{
	const char *p = "/sys/module/fuse/parameters/enable_uring";
	char v = 0;
	int fd = open(p, O_RDONLY | O_CLOEXEC), on;

	if (fd < 0) {
		stk_debug("io_uring: %s: %s (a kernel before 6.14)", p, strerror(errno));
		return 0;
	}
	on = read(fd, &v, 1) == 1 && v == 'Y';
	close(fd);
	if (on || geteuid() != 0)
		return on;
	fd = open(p, O_WRONLY | O_CLOEXEC);
	if (fd >= 0 && write(fd, "1", 1) == 1)
		on = 1;
	else
		stk_info("io_uring: cannot turn on %s: %s", p, strerror(errno));
	if (fd >= 0)
		close(fd);
	if (on)
		stk_info("io_uring: turned on %s", p);
	return on;
}

/* Parses "a,b=1,c". 0 or -EINVAL. */
static int parse_opts(struct stk_fuse_opts *o, const char *s)
{
	char item[PATH_MAX + 64];

	while (*s) {
		size_t n = strcspn(s, ",");
		char *eq;
		int rc;

		if (n >= sizeof(item)) {
			cli_err("mount", "option too long");
			return -EINVAL;
		}
		memcpy(item, s, n);
		item[n] = 0;
		s += n;
		if (*s == ',')
			s++;
		if (!item[0])
			continue;
		eq = strchr(item, '=');
		if (eq)
			*eq = 0;
		rc = apply_opt(o, item, eq ? eq + 1 : NULL);
		if (rc)
			return rc;
	}
	return 0;
}

/* ---- the daemon ---- */

/* Field 22 of /proc/PID/stat: the start time, which tells a reused pid apart. */
static int proc_start(pid_t pid, unsigned long long *start, char *state)
{
	char path[64], buf[1024], *p;
	int fd, i;
	ssize_t n;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return -EIO;
	buf[n] = 0;
	p = strrchr(buf, ')'); /* the command name may hold spaces */
	if (!p || p[1] != ' ')
		return -EIO;
	p += 2;
	if (state)
		*state = *p;
	for (i = 3; i < 22 && p; i++) {
		p = strchr(p, ' ');
		if (p)
			p++;
	}
	if (!p)
		return -EIO;
	*start = strtoull(p, NULL, 10);
	return 0;
}

static void pidfile_path(char *buf, size_t len, unsigned maj, unsigned min)
{
	char dir[64];

	cli_runtime_dir(dir, sizeof(dir));
	snprintf(buf, len, "%s/mount-%u:%u.pid", dir, maj, min);
}

struct ready {
	struct stk_fuse *fs;
	const char *mp;
	dev_t before;
	int fd; /* the pipe to the parent, or -1 in the foreground */
	dev_t dev; /* the mount's device, once it answered */
	int ok;
};

static void report(int fd, const char *msg)
{
	if (fd >= 0)
		stk_write_all(fd, msg, strlen(msg));
}

/* Sends the daemon's stdio to its log: the parent's must not outlive it in us. */
static void redirect_stdio(const struct stk_fuse *fs)
{
	char dir[64], logp[PATH_MAX];
	int nul = open("/dev/null", O_RDWR | O_CLOEXEC), lfd;

	if (fs->o.log[0]) {
		stk_strlcpy(logp, fs->o.log, sizeof(logp));
	} else {
		cli_runtime_dir(dir, sizeof(dir));
		snprintf(logp, sizeof(logp), "%s/mount.log", dir);
	}
	lfd = open(logp, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
	if (lfd < 0)
		lfd = nul;
	if (nul >= 0)
		dup2(nul, 0);
	if (lfd >= 0) {
		dup2(lfd, 1);
		dup2(lfd, 2);
	}
	if (lfd >= 0 && lfd != nul)
		close(lfd);
	if (nul >= 0)
		close(nul);
}

/* The kernel caps readahead at 128 KiB in INIT; root can raise it afterwards. */
static void set_readahead(const struct stk_fuse *fs, dev_t dev)
{
	char path[128], line[32];
	int fd;

	snprintf(path, sizeof(path), "/sys/class/bdi/%u:%u/read_ahead_kb", major(dev), minor(dev));
	snprintf(line, sizeof(line), "%llu\n", (unsigned long long)(fs->o.readahead / 1024));
	fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0 || stk_write_all(fd, line, strlen(line)))
		stk_warn("cannot set readahead in %s: %s (it stays at 128 KiB)", path,
			 strerror(errno));
	if (fd >= 0)
		close(fd);
}

/* Records "PID START\nMOUNTPOINT" for `stoker umount`. */
static void write_pidfile(const char *mp, dev_t dev)
{
	char dir[64], path[PATH_MAX], buf[PATH_MAX + 64];
	unsigned long long start = 0;

	cli_runtime_dir(dir, sizeof(dir));
	mkdir(dir, 0700);
	pidfile_path(path, sizeof(path), major(dev), minor(dev));
	proc_start(getpid(), &start, NULL);
	snprintf(buf, sizeof(buf), "%d %llu\n%s\n", (int)getpid(), start, mp);
	if (stk_write_file_atomic(path, buf, strlen(buf)))
		stk_warn("cannot write %s: `stoker umount` will not wait for this daemon", path);
}

/* Waits for the mount to answer, then records it and tells the parent. */
static void *ready_thread(void *arg)
{
	struct ready *r = arg;
	uint64_t deadline = stk_now_ns() + STK_MOUNT_READY_S * 1000000000ull;
	struct stat st;

	for (;;) {
		if (stat(r->mp, &st) == 0 && st.st_dev != r->before)
			break;
		if (stk_now_ns() > deadline) {
			stk_error("%s did not answer in %d s", r->mp, STK_MOUNT_READY_S);
			report(r->fd, "error\n");
			return NULL;
		}
		usleep(10000);
	}
	r->dev = st.st_dev;
	if (r->fd >= 0)
		redirect_stdio(r->fs);
	set_readahead(r->fs, st.st_dev);
	write_pidfile(r->mp, st.st_dev);
	r->ok = 1;
	if (r->fd >= 0) {
		report(r->fd, "ok\n");
		close(r->fd);
		r->fd = -1;
	}
	stk_info("mounted %s on %s (%s)", stk_cluster_addr(r->fs->c), r->mp,
		 r->fs->o.writeback ? "write-back cache" : "write-through");
	stk_fuse_uring_announce(r->fs);
	return NULL;
}

/* Appends s to d (of cap bytes) escaping ',' and '\' for libfuse's option parser. */
static int opt_escape(char *d, size_t cap, const char *s)
{
	size_t n = strlen(d);

	for (; *s; s++) {
		if (n + 3 >= cap)
			return -ENAMETOOLONG;
		if (*s == ',' || *s == '\\')
			d[n++] = '\\';
		d[n++] = *s;
	}
	d[n] = 0;
	return 0;
}

/* Mounts and serves until unmounted or signalled. Returns the exit status. */
static int run_daemon(struct stk_fuse *fs, const char *mp, const char *fsname, int ready_fd)
{
	struct fuse_args args = FUSE_ARGS_INIT(0, NULL);
	struct fuse_loop_config *cfg = NULL;
	struct ready r = {.fs = fs, .mp = mp, .fd = ready_fd};
	char opts[PATH_MAX + 256] = "fsname=";
	char pidf[PATH_MAX];
	pthread_t tid;
	int tid_ok = 0, mounted = 0, status = 1, rc;
	struct stat st;
	unsigned threads;
	const struct fuse_lowlevel_ops *ops;

	stk_log_set_role("mount");
	if (opt_escape(opts, sizeof(opts), fsname)) {
		cli_err("mount", "cluster address too long");
		goto out;
	}
	snprintf(opts + strlen(opts), sizeof(opts) - strlen(opts),
		 ",subtype=stoker%s,max_read=%u%s%s",
		 kernel_perms(&fs->o) ? ",default_permissions" : "", STK_FUSE_IO_MAX,
		 fs->o.allow_other ? ",allow_other" : "", fs->o.ro ? ",ro" : "");
	if (fuse_opt_add_arg(&args, "stoker") || fuse_opt_add_arg(&args, "-o") ||
	    fuse_opt_add_arg(&args, opts) || (fs->o.debug && fuse_opt_add_arg(&args, "-d"))) {
		cli_err("mount", "out of memory");
		goto out;
	}
	rc = stk_fuse_fs_init(fs);
	if (rc) {
		cli_err("mount", "%s", stk_strerror(rc));
		goto out;
	}
	ops = stk_fuse_metrics_start(stk_fuse_ops());
	if (!ops)
		goto out_fs;
	stk_fuse_metrics_cache(fs->c);
	fs->se = fuse_session_new(&args, ops, sizeof(struct fuse_lowlevel_ops), fs);
	if (!fs->se) {
		cli_err("mount", "cannot start a FUSE session (see above)");
		goto out_fs;
	}
	if (fuse_set_signal_handlers(fs->se)) {
		cli_err("mount", "cannot install signal handlers");
		goto out_session;
	}
	if (stat(mp, &st) < 0) {
		cli_err("mount", "%s: %s", mp, strerror(errno));
		goto out_signals;
	}
	r.before = st.st_dev;
	if (fs->o.uring && !enable_uring())
		fs->o.uring = 0; /* before the mount: the kernel offers it in INIT or not */
	if (fuse_session_mount(fs->se, mp)) {
		cli_err("mount", "cannot mount on %s (see above; a user other than root needs "
			       "read-write access to /dev/fuse)",
			mp);
		goto out_signals;
	}
	mounted = 1;
	if (fs->o.uring) {
		rc = stk_fuse_uring_setup(fs);
		if (rc)
			stk_warn("io_uring: cannot set up (%s); serving through /dev/fuse",
				 stk_strerror(rc));
	}
	if (pthread_create(&tid, NULL, ready_thread, &r)) {
		cli_err("mount", "cannot start a thread");
		goto out_unmount;
	}
	tid_ok = 1;
	cfg = fuse_loop_cfg_create();
	if (!cfg) {
		stk_error("out of memory");
		goto out_unmount;
	}
	threads = fs->o.max_threads;
	if (!threads) {
		long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
		/* Enough to keep a 16 MiB readahead window of 1 MiB reads in flight. */
		threads = (unsigned)STK_MIN(STK_MAX(16, 4 * (ncpu > 0 ? ncpu : 1)), 64);
	}
	fuse_loop_cfg_set_max_threads(cfg, threads);
	fuse_loop_cfg_set_idle_threads(cfg, threads);
	fuse_loop_cfg_set_clone_fd(cfg, 1);
	rc = fuse_session_loop_mt(fs->se, cfg);
	status = rc < 0 ? 1 : 0;
	if (rc < 0)
		stk_error("session loop: %s", stk_strerror(rc));
out_unmount:
	stk_fuse_uring_stop(fs); /* before the session goes: its threads use it */
	if (tid_ok) {
		pthread_join(tid, NULL);
		if (!r.ok)
			status = 1;
	}
	fuse_session_unmount(fs->se);
out_signals:
	fuse_remove_signal_handlers(fs->se);
out_session:
	/* Every handle the kernel left is closed before the session and client go. */
	stk_fuse_fs_fini(fs);
	fuse_session_destroy(fs->se);
	fs->se = NULL;
	if (r.dev) {
		pidfile_path(pidf, sizeof(pidf), major(r.dev), minor(r.dev));
		unlink(pidf);
	}
	if (mounted && r.ok)
		stk_info("unmounted %s", mp);
	goto out;
out_fs:
	stk_fuse_fs_fini(fs);
out:
	stk_fuse_metrics_stop();
	if (!r.ok)
		report(ready_fd, "error\n"); /* ready_fd is closed only once ok was sent */
	if (cfg)
		fuse_loop_cfg_destroy(cfg);
	fuse_opt_free_args(&args);
	return status;
}

/* The parent: waits for the child's word, and for the mount to serve. */
static int wait_ready(pid_t pid, int fd, const char *mp)
{
	struct pollfd p = {.fd = fd, .events = POLLIN};
	char buf[64];
	size_t got = 0;
	int st, rc;

	for (;;) {
		ssize_t n;
		rc = poll(&p, 1, (STK_MOUNT_READY_S + 5) * 1000);
		if (rc < 0 && errno == EINTR)
			continue;
		if (rc <= 0) {
			cli_err("mount", "%s did not answer in %d s; giving up", mp,
				STK_MOUNT_READY_S + 5);
			kill(pid, SIGKILL);
			waitpid(pid, NULL, 0);
			umount2(mp, MNT_DETACH);
			return 1;
		}
		n = read(fd, buf + got, sizeof(buf) - 1 - got);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		got += (size_t)n;
		if (got >= sizeof(buf) - 1 || memchr(buf, '\n', got))
			break;
	}
	buf[got] = 0;
	if (strncmp(buf, "ok\n", 3) == 0)
		return 0;
	/* The child printed why on our stderr; reap it. */
	if (waitpid(pid, &st, 0) == pid && !strncmp(buf, "error", 5))
		return 1;
	if (WIFSIGNALED(st))
		cli_err("mount", "the mount daemon died during start-up (signal %d)", WTERMSIG(st));
	else
		cli_err("mount", "the mount daemon exited during start-up");
	return 1;
}

/* 1 if the folder holds anything but "." and "..", 0 if not, -errno. */
static int dir_nonempty(const char *path)
{
	struct dirent *d;
	DIR *dir = opendir(path);
	int found = 0;

	if (!dir)
		return -errno;
	while ((d = readdir(dir)))
		if (strcmp(d->d_name, ".") && strcmp(d->d_name, "..")) {
			found = 1;
			break;
		}
	closedir(dir);
	return found;
}

int cmd_mount(int argc, char **argv)
{
	struct stk_fuse_opts o;
	struct stk_client_opts copts;
	struct stk_client_ident ident;
	struct stk_fuse *fs = NULL;
	char cluster[128], sub[4097], mp[PATH_MAX], fsname[4400];
	struct stk_ll_attr root;
	struct stat st;
	stk_client *c = NULL;
	const char *url, *mparg, *direct;
	int pfd[2] = {-1, -1}, rc, status = 1;
	pid_t pid;

	stk_fuse_opts_default(&o);
	/* Options may come before, between or after the two arguments. */
	url = mparg = NULL;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "-f") == 0) {
			o.foreground = 1;
		} else if (strcmp(argv[i], "-o") == 0) {
			if (i + 1 == argc)
				return cli_usage("mount");
			if (parse_opts(&o, argv[++i]))
				return 2;
		} else if (strncmp(argv[i], "-o", 2) == 0) {
			if (parse_opts(&o, argv[i] + 2))
				return 2;
		} else if (argv[i][0] == '-' && argv[i][1]) {
			cli_err("mount", "unknown option %s", argv[i]);
			return cli_usage("mount");
		} else if (!url) {
			url = argv[i];
		} else if (!mparg) {
			mparg = argv[i];
		} else {
			cli_err("mount", "unexpected argument '%s'", argv[i]);
			return cli_usage("mount");
		}
	}
	if (!url || !mparg)
		return cli_usage("mount");
	if (o.log[0] && o.log[0] != '/') {
		/* The daemon works from /: make the log's name absolute now. */
		char cwd[PATH_MAX], abs[PATH_MAX];
		if (!getcwd(cwd, sizeof(cwd)) ||
		    (size_t)snprintf(abs, sizeof(abs), "%s/%s", cwd, o.log) >= sizeof(abs)) {
			cli_err("mount", "-o log: path too long");
			return 2;
		}
		memcpy(o.log, abs, sizeof(o.log));
	}
	if (o.debug && !o.foreground) {
		cli_err("mount", "-o debug prints every request: use it with -f");
		return 2;
	}

	/* The mount point: checked before the cluster, it is the likelier mistake. */
	if (stat(mparg, &st) < 0) {
		if (errno == ENOTCONN)
			cli_err("mount",
				"mount point %s: %s: a Stoker mount whose daemon died is still "
				"there; clear it with `stoker umount %s`",
				mparg, strerror(errno), mparg);
		else
			cli_err("mount", "mount point %s: %s", mparg, strerror(errno));
		return 1;
	}
	if (!S_ISDIR(st.st_mode)) {
		cli_err("mount", "mount point %s: Not a directory", mparg);
		return 1;
	}
	rc = dir_nonempty(mparg);
	if (rc < 0) {
		cli_err("mount", "mount point %s: %s", mparg, stk_strerror(rc));
		return 1;
	}
	if (rc && !o.nonempty) {
		cli_err("mount", "mount point %s is not empty (-o nonempty mounts over it anyway)",
			mparg);
		return 1;
	}
	if (!realpath(mparg, mp)) {
		cli_err("mount", "mount point %s: %s", mparg, strerror(errno));
		return 1;
	}

	/* The cluster and the folder to mount. */
	rc = cli_split(url, cluster, sizeof(cluster), sub, sizeof(sub));
	if (rc) {
		cli_err("mount", "%s: %s", url,
			rc == -EINVAL ? "not a cluster address (expected stk://HOST:PORT[/dir])"
				      : stk_strerror(rc));
		return 2;
	}
	memset(&copts, 0, sizeof(copts));
	copts.size = sizeof(copts);
	copts.conns_per_node = 4; /* request threads share them, many requests on each */
	copts.retry_ms = o.timeout_ms; /* 0: the library's default */
	copts.key_file = o.key_file[0] ? o.key_file : NULL;
	rc = stk_connect(cluster[0] ? cluster : NULL, &copts, &c);
	if (rc == -ENOENT && !cluster[0]) {
		cli_err("mount", "no cluster given: use stk://HOST:PORT[/dir], set STOKER_CLUSTER, "
				 "or start one with `stoker up --data DIR --daemon`");
		return 1;
	}
	if (rc) {
		cli_err("mount", "cannot reach the cluster at %s: %s",
			cluster[0] ? cluster : "(default)", stk_strerror(rc));
		return 1;
	}
	/* A read-only client key: the kernel refuses every change at once (EROFS), as
	 * meta and storage would, instead of a write-back that fails after close. */
	if (!o.ro && stk_client_identity(c, &ident) && (ident.flags & STK_IDENT_READ_ONLY)) {
		o.ro = 1;
		fprintf(stderr, "stoker mount: client key %s is read-only: mounting read-only\n",
			ident.name);
	}
	/* The kernel's page cache keeps what is read; STOKER_DIRECT_STREAMS=0: not. */
	direct = getenv("STOKER_DIRECT_STREAMS");
	stk_ll_direct_streams(c, !(direct && strcmp(direct, "0") == 0));
	rc = stk_ll_resolve(c, sub, 1, &root);
	if (rc == 0 && !S_ISDIR(root.mode))
		rc = -ENOTDIR;
	if (rc) {
		cli_err("mount", "%s: %s in the cluster at %s", sub, stk_strerror(rc),
			stk_cluster_addr(c));
		goto out;
	}
	snprintf(fsname, sizeof(fsname), "stk://%s%s", stk_cluster_addr(c),
		 strcmp(sub, "/") ? sub : "");

	fs = calloc(1, sizeof(*fs));
	if (!fs) {
		cli_err("mount", "out of memory");
		goto out;
	}
	fs->c = c;
	fs->root_ino = root.ino;
	fs->o = o;
	if (o.foreground) {
		status = run_daemon(fs, mp, fsname, -1);
		goto out;
	}
	if (pipe2(pfd, O_CLOEXEC) < 0) {
		cli_err("mount", "pipe: %s", strerror(errno));
		goto out;
	}
	fflush(NULL);
	pid = fork();
	if (pid < 0) {
		cli_err("mount", "fork: %s", strerror(errno));
		goto out;
	}
	if (pid == 0) {
		/* The daemon: never returns into the caller's code. */
		close(pfd[0]);
		setsid();
		if (chdir("/"))
			stk_warn("chdir /: %s", strerror(errno));
		signal(SIGPIPE, SIG_IGN);
		stk_after_fork(c);
		/* Keep nothing of the caller's (`stoker up` holds a lock file, for one). */
		if (pfd[1] > 3)
			close_range(3, (unsigned)pfd[1] - 1, 0);
		close_range((unsigned)pfd[1] + 1, ~0u, 0);
		status = run_daemon(fs, mp, fsname, pfd[1]);
		stk_disconnect(c);
		free(fs);
		_exit(status);
	}
	close(pfd[1]);
	pfd[1] = -1;
	status = wait_ready(pid, pfd[0], mp);
out:
	if (pfd[0] >= 0)
		close(pfd[0]);
	if (pfd[1] >= 0)
		close(pfd[1]);
	free(fs);
	stk_disconnect(c);
	return status;
}

/* ---- umount ---- */

struct mnt {
	char point[PATH_MAX];
	char fstype[64];
	unsigned maj, min;
};

/* Decodes mountinfo's octal escapes (\040 for a space) in place. */
static void unescape(char *s)
{
	char *d = s;

	for (; *s; s++) {
		if (s[0] == '\\' && s[1] >= '0' && s[1] <= '3' && s[2] >= '0' && s[2] <= '7' &&
		    s[3] >= '0' && s[3] <= '7') {
			*d++ = (char)((s[1] - '0') * 64 + (s[2] - '0') * 8 + (s[3] - '0'));
			s += 3;
		} else {
			*d++ = *s;
		}
	}
	*d = 0;
}

/* The topmost mount on path, from /proc/self/mountinfo. 0 or -ENOENT. */
static int find_mount(const char *path, struct mnt *m)
{
	FILE *f = fopen("/proc/self/mountinfo", "re");
	char *line = NULL;
	size_t cap = 0;
	int rc = -ENOENT;

	if (!f)
		return -errno;
	while (getline(&line, &cap, f) > 0) {
		/* id parent maj:min root point opts [tags] - fstype source superopts */
		char *field[6], *p = line, *sep;
		unsigned maj, min;
		int i;

		for (i = 0; i < 6 && p; i++) {
			field[i] = p;
			p = strchr(p, ' ');
			if (p)
				*p++ = 0;
		}
		if (i < 6 || !p)
			continue;
		sep = strstr(p, " - ");
		if (sep == NULL && strncmp(p, "- ", 2) == 0)
			sep = p - 1;
		if (!sep || sscanf(field[2], "%u:%u", &maj, &min) != 2)
			continue;
		unescape(field[4]);
		if (strcmp(field[4], path) != 0)
			continue;
		sep += 3;
		m->maj = maj;
		m->min = min;
		stk_strlcpy(m->point, field[4], sizeof(m->point));
		stk_strlcpy(m->fstype, sep, sizeof(m->fstype));
		m->fstype[strcspn(m->fstype, " ")] = 0;
		rc = 0; /* keep going: a later line is mounted on top */
	}
	free(line);
	fclose(f);
	return rc;
}

/* Makes path absolute and removes ".", ".." and repeated slashes, without stat. */
static int lexical_abs(const char *path, char *out, size_t len)
{
	char buf[2 * PATH_MAX];
	size_t n = 0;
	const char *p;

	if (path[0] == '/') {
		if (stk_strlcpy(buf, path, sizeof(buf)))
			return -ENAMETOOLONG;
	} else {
		char cwd[PATH_MAX];
		if (!getcwd(cwd, sizeof(cwd)))
			return -errno;
		if ((size_t)snprintf(buf, sizeof(buf), "%s/%s", cwd, path) >= sizeof(buf))
			return -ENAMETOOLONG;
	}
	out[0] = 0;
	for (p = buf; *p;) {
		size_t l;
		while (*p == '/')
			p++;
		l = strcspn(p, "/");
		if (l == 0)
			break;
		if (l == 1 && p[0] == '.') {
			/* nothing */
		} else if (l == 2 && p[0] == '.' && p[1] == '.') {
			while (n > 0 && out[n - 1] != '/')
				n--;
			if (n > 0)
				n--;
			out[n] = 0;
		} else {
			if (n + 1 + l + 1 > len)
				return -ENAMETOOLONG;
			out[n++] = '/';
			memcpy(out + n, p, l);
			n += l;
			out[n] = 0;
		}
		p += l;
	}
	if (n == 0) {
		if (len < 2)
			return -ENAMETOOLONG;
		out[0] = '/';
		out[1] = 0;
	}
	return 0;
}

/* Reads "PID START" from a pid file. 0 or -errno. */
static int read_pidfile(const char *path, int *pid, unsigned long long *start)
{
	char buf[PATH_MAX + 64];
	ssize_t n;
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return -errno;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return -EIO;
	buf[n] = 0;
	if (sscanf(buf, "%d %llu", pid, start) != 2 || *pid < 2)
		return -EIO;
	return 0;
}

/*
 * The daemon recorded for a mount: 1 if it runs (*pidp, *startp set), 0 if its
 * record names a process that is gone, -ENOENT if there is no record (*path is
 * the record's file when there is one).
 */
static int daemon_of(const struct mnt *m, pid_t *pidp, unsigned long long *startp, char *path,
		     size_t len)
{
	unsigned long long start = 0, now = 0;
	char state = 0;
	int pid = 0, rc;

	pidfile_path(path, len, m->maj, m->min);
	rc = read_pidfile(path, &pid, &start);
	if (rc == -ENOENT && geteuid() == 0) {
		/* root unmounting a user's mount: the record is in that user's folder */
		char pattern[96];
		glob_t g;
		snprintf(pattern, sizeof(pattern), "/tmp/stoker-*/mount-%u:%u.pid", m->maj, m->min);
		if (glob(pattern, 0, NULL, &g) == 0) {
			if (g.gl_pathc > 0) {
				stk_strlcpy(path, g.gl_pathv[0], len);
				rc = read_pidfile(path, &pid, &start);
			}
			globfree(&g);
		}
	}
	if (rc)
		return -ENOENT;
	if (proc_start(pid, &now, &state) || now != start || state == 'Z' || state == 'X')
		return 0;
	*pidp = pid;
	*startp = start;
	return 1;
}

/*
 * 1 if the mount's daemon is gone (a stat gives ENOTCONN), 0 if it answers or
 * hangs. The stat runs in a child, so a hung daemon cannot hang us.
 */
static int mount_dead(const char *point)
{
	struct stat st;
	int status;
	pid_t pid = fork();

	if (pid < 0)
		return 0;
	if (pid == 0)
		_exit(stat(point, &st) < 0 && errno == ENOTCONN ? 0 : 1);
	for (int i = 0; i < 300; i++) {
		pid_t w = waitpid(pid, &status, WNOHANG);
		if (w == pid)
			return WIFEXITED(status) && WEXITSTATUS(status) == 0;
		if (w < 0)
			return 0;
		usleep(10000);
	}
	kill(pid, SIGKILL); /* FUSE waits are killable */
	waitpid(pid, NULL, 0);
	return 0;
}

static int run_fusermount(const char *point, int lazy)
{
	char *args[5] = {"fusermount3", "-u", NULL, NULL, NULL};
	int n = 2, st;
	pid_t pid;

	if (lazy)
		args[n++] = "-z";
	args[n] = (char *)point;
	pid = fork();
	if (pid < 0)
		return -errno;
	if (pid == 0) {
		execvp("fusermount3", args);
		fprintf(stderr, "stoker umount: fusermount3: %s\n", strerror(errno));
		_exit(127);
	}
	if (waitpid(pid, &st, 0) < 0)
		return -errno;
	/* fusermount3 said why on stderr */
	return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -ECANCELED;
}

static int do_umount(const char *point, int lazy)
{
	if (geteuid() != 0)
		return run_fusermount(point, lazy);
	if (umount2(point, UMOUNT_NOFOLLOW | (lazy ? MNT_DETACH : 0)) < 0)
		return -errno;
	return 0;
}

int cmd_umount(int argc, char **argv)
{
	char path[PATH_MAX], pidf[PATH_MAX];
	unsigned long long start = 0;
	struct mnt m;
	int lazy = 0, alive, ch, rc;
	pid_t pid = 0;

	optind = 1;
	while ((ch = getopt(argc, argv, "l")) != -1) {
		if (ch == 'l')
			lazy = 1;
		else
			return cli_usage("umount");
	}
	if (argc - optind != 1)
		return cli_usage("umount");
	rc = lexical_abs(argv[optind], path, sizeof(path));
	if (rc == 0)
		rc = find_mount(path, &m);
	if (rc == -ENOENT) {
		/* Through a symlinked folder: resolve the parent, never the mount itself. */
		char parent[PATH_MAX], real[PATH_MAX];
		char *slash = strrchr(path, '/');
		if (slash && slash != path) {
			memcpy(parent, path, (size_t)(slash - path));
			parent[slash - path] = 0;
			if (realpath(parent, real) &&
			    (size_t)snprintf(parent, sizeof(parent), "%s%s",
					     strcmp(real, "/") ? real : "", slash) < sizeof(parent))
				rc = find_mount(parent, &m);
		}
	}
	if (rc) {
		cli_err("umount", "%s: %s", argv[optind],
			rc == -ENOENT ? "not mounted" : stk_strerror(rc));
		return 1;
	}
	if (strcmp(m.fstype, "fuse.stoker") != 0) {
		cli_err("umount", "%s: not a Stoker mount (it is %s)", m.point, m.fstype);
		return 1;
	}
	alive = daemon_of(&m, &pid, &start, pidf, sizeof(pidf));
	rc = do_umount(m.point, lazy);
	if (rc && !lazy && alive != 1 && mount_dead(m.point))
		rc = do_umount(m.point, 1); /* the daemon is gone: nothing to flush, detach */
	if (rc == -EBUSY)
		cli_err("umount", "%s: busy: files or folders are open on it (close them, or use "
				  "`stoker umount -l` to detach it now and finish when they close)",
			m.point);
	else if (rc == -ECANCELED)
		cli_err("umount", "%s: fusermount3 could not unmount it", m.point);
	else if (rc)
		cli_err("umount", "%s: %s", m.point, stk_strerror(rc));
	if (rc)
		return 1;
	if (alive != 1) {
		if (alive == 0)
			unlink(pidf); /* the daemon died without removing it */
		return 0;
	}
	if (lazy)
		return 0; /* the daemon exits when the last open file closes */
	/* The daemon closes what is left open, flushing it, then exits. */
	for (int i = 0; i < STK_UMOUNT_WAIT_S * 100; i++) {
		unsigned long long now;
		char state;
		if (proc_start(pid, &now, &state) || now != start || state == 'Z' || state == 'X')
			return 0;
		usleep(10000);
	}
	cli_err("umount", "%s is unmounted but its daemon (pid %d) has not exited after %d s",
		m.point, (int)pid, STK_UMOUNT_WAIT_S);
	return 1;
}
