/*
 * Data commands over libstoker, for scripts without a mount: ls, stat, put, get,
 * cat, mkdir, rm, mv. Each prints errors as "stoker CMD: PATH: reason" and exits
 * 1 if any argument failed, 2 on a usage error.
 */
#include "cli.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <grp.h>
#include <linux/fs.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include "../common/util.h"

#define CLI_IO_SIZE (16u << 20)
#define CLI_PATH 4097

struct target {
	stk_client *c;
	char path[CLI_PATH];
};

static int resolve_arg(const char *cmd, const char *arg, struct target *t)
{
	char cluster[128];
	int rc = cli_split(arg, cluster, sizeof(cluster), t->path, sizeof(t->path));

	if (rc) {
		cli_err(cmd, "%s: %s", arg, rc == -EINVAL ? "malformed stk:// address" : stk_strerror(rc));
		return rc;
	}
	t->c = cli_connect(cmd, cluster[0] ? cluster : NULL);
	return t->c ? 0 : -ENOTCONN;
}

static const char *base_name(const char *p)
{
	size_t n = strlen(p);
	while (n > 1 && p[n - 1] == '/')
		n--;
	while (n > 0 && p[n - 1] != '/')
		n--;
	return p + n;
}

/* The file type as ls(1) and stat(1) name it: its letter and its word. */
static char type_char(mode_t m)
{
	return S_ISDIR(m) ? 'd' : S_ISLNK(m) ? 'l' : S_ISFIFO(m) ? 'p' : S_ISSOCK(m) ? 's'
	       : S_ISCHR(m) ? 'c' : S_ISBLK(m) ? 'b' : '-';
}

static const char *type_name(mode_t m)
{
	return S_ISDIR(m) ? "directory" : S_ISLNK(m) ? "symlink" : S_ISFIFO(m) ? "fifo"
	       : S_ISSOCK(m) ? "socket" : S_ISCHR(m) ? "character device"
	       : S_ISBLK(m) ? "block device" : "file";
}

static void mode_string(mode_t m, char *s)
{
	s[0] = type_char(m);
	for (int i = 0; i < 9; i++)
		s[1 + i] = (m & (1u << (8 - i))) ? "rwxrwxrwx"[i] : '-';
	s[10] = 0;
}

static void print_long(const char *name, const struct stat *st, const char *link)
{
	char ms[11], tbuf[32];
	struct tm tm;

	mode_string(st->st_mode, ms);
	localtime_r(&st->st_mtim.tv_sec, &tm);
	strftime(tbuf, sizeof(tbuf), "%Y-%m-%d %H:%M", &tm);
	if (S_ISCHR(st->st_mode) || S_ISBLK(st->st_mode)) /* a device shows its number */
		printf("%s %3lu %5u %5u %7u, %4u %s %s\n", ms, (unsigned long)st->st_nlink,
		       (unsigned)st->st_uid, (unsigned)st->st_gid, major(st->st_rdev),
		       minor(st->st_rdev), tbuf, name);
	else
		printf("%s %3lu %5u %5u %12lld %s %s%s%s\n", ms, (unsigned long)st->st_nlink,
		       (unsigned)st->st_uid, (unsigned)st->st_gid, (long long)st->st_size, tbuf,
		       name, link ? " -> " : "", link ? link : "");
}

int cmd_ls(int argc, char **argv)
{
	int lng = 0, fails = 0, c;

	optind = 1;
	while ((c = getopt(argc, argv, "l")) != -1) {
		if (c == 'l')
			lng = 1;
		else
			return cli_usage("ls");
	}
	if (optind == argc)
		argv[--optind] = "/"; /* argv[0] is free to reuse */
	for (int i = optind; i < argc; i++) {
		struct target t;
		struct stat st;
		stk_dir *d;
		struct dirent de;
		int rc;

		if (resolve_arg("ls", argv[i], &t))
			return 1;
		rc = stk_stat(t.c, t.path, &st);
		if (rc == 0 && !S_ISDIR(st.st_mode)) {
			if (lng)
				print_long(t.path, &st, NULL);
			else
				printf("%s\n", t.path);
			continue;
		}
		if (rc == 0)
			rc = stk_opendir(t.c, t.path, &d);
		if (rc) {
			cli_err("ls", "%s: %s", argv[i], stk_strerror(rc));
			fails++;
			continue;
		}
		if (argc - optind > 1)
			printf("%s:\n", argv[i]);
		while ((rc = stk_readdir(d, &de)) == 1) {
			if (!lng) {
				printf("%s\n", de.d_name);
				continue;
			}
			char full[CLI_PATH + 256], link[CLI_PATH];
			struct stat est;
			snprintf(full, sizeof(full), "%s/%s", strcmp(t.path, "/") ? t.path : "",
				 de.d_name);
			if (stk_stat(t.c, full, &est))
				continue; /* removed while listing */
			if (S_ISLNK(est.st_mode) && stk_readlink(t.c, full, link, sizeof(link)) >= 0)
				print_long(de.d_name, &est, link);
			else
				print_long(de.d_name, &est, NULL);
		}
		stk_closedir(d);
		if (rc < 0) {
			cli_err("ls", "%s: %s", argv[i], stk_strerror(rc));
			fails++;
		}
	}
	return fails ? 1 : 0;
}

int cmd_stat(int argc, char **argv)
{
	int fails = 0;

	if (argc < 2)
		return cli_usage("stat");
	for (int i = 1; i < argc; i++) {
		struct target t;
		struct stat st;
		char ms[11], size[32];
		int rc;

		if (resolve_arg("stat", argv[i], &t))
			return 1;
		rc = stk_stat(t.c, t.path, &st);
		if (rc) {
			cli_err("stat", "%s: %s", argv[i], stk_strerror(rc));
			fails++;
			continue;
		}
		mode_string(st.st_mode, ms);
		printf("  File: %s\n  Size: %lld (%s)  Type: %s  Inode: %llu  Links: %lu\n"
		       "Access: (%04o/%s)  Uid: %u  Gid: %u\n"
		       "Modify: %lld.%09ld  Change: %lld.%09ld  Access: %lld.%09ld\n",
		       t.path, (long long)st.st_size,
		       stk_format_size((uint64_t)st.st_size, size, sizeof(size)),
		       type_name(st.st_mode),
		       (unsigned long long)st.st_ino, (unsigned long)st.st_nlink,
		       (unsigned)(st.st_mode & 07777), ms, (unsigned)st.st_uid, (unsigned)st.st_gid,
		       (long long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec, (long long)st.st_ctim.tv_sec,
		       st.st_ctim.tv_nsec, (long long)st.st_atim.tv_sec, st.st_atim.tv_nsec);
		if (S_ISREG(st.st_mode))
			printf(" Chunk: %ld bytes  Blocks: %lld\n", (long)st.st_blksize,
			       (long long)st.st_blocks);
		if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode))
			printf("Device: %u,%u\n", major(st.st_rdev), minor(st.st_rdev));
	}
	return fails ? 1 : 0;
}

/* Copies a local fd into a Stoker file. */
static int put_fd(const char *cmd, int fd, struct target *dst, const char *src_name)
{
	struct stat st;
	stk_file *f;
	char *buf;
	int rc;

	if (stk_stat(dst->c, dst->path, &st) == 0 && S_ISDIR(st.st_mode)) {
		size_t n = strlen(dst->path);
		const char *b = base_name(src_name);
		if (!*b || strcmp(b, "-") == 0) {
			cli_err(cmd, "%s is a directory; name the file", dst->path);
			return -EISDIR;
		}
		if (n + 1 + strlen(b) >= sizeof(dst->path))
			return -ENAMETOOLONG;
		snprintf(dst->path + n, sizeof(dst->path) - n, "%s%s",
			 dst->path[n - 1] == '/' ? "" : "/", b);
	}
	buf = malloc(CLI_IO_SIZE);
	if (!buf)
		return -ENOMEM;
	rc = stk_open(dst->c, dst->path, O_WRONLY | O_CREAT | O_TRUNC, 0644, &f);
	if (rc) {
		free(buf);
		cli_err(cmd, "%s: %s", dst->path, stk_strerror(rc));
		return rc;
	}
	for (;;) {
		long n = stk_read_full(fd, buf, CLI_IO_SIZE);
		if (n < 0) {
			rc = (int)n;
			cli_err(cmd, "reading %s: %s", src_name, stk_strerror(rc));
			break;
		}
		if (n == 0)
			break;
		ssize_t w = stk_write(f, buf, (size_t)n);
		if (w < 0) {
			rc = (int)w;
			cli_err(cmd, "%s: %s", dst->path, stk_strerror(rc));
			break;
		}
	}
	int crc = stk_close(f);
	if (!rc && crc) {
		rc = crc;
		cli_err(cmd, "%s: %s", dst->path, stk_strerror(rc));
	}
	free(buf);
	return rc;
}

int cmd_put(int argc, char **argv)
{
	struct target dst;
	int fd, rc;

	if (argc != 3)
		return cli_usage("put");
	if (resolve_arg("put", argv[2], &dst))
		return 1;
	if (strcmp(argv[1], "-") == 0) {
		fd = 0;
	} else {
		struct stat st;
		fd = open(argv[1], O_RDONLY | O_CLOEXEC);
		if (fd < 0) {
			cli_err("put", "%s: %s", argv[1], strerror(errno));
			return 1;
		}
		if (fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
			cli_err("put", "%s: is a directory", argv[1]);
			close(fd);
			return 1;
		}
	}
	rc = put_fd("put", fd, &dst, argv[1]);
	if (fd)
		close(fd);
	return rc ? 1 : 0;
}

/* Copies a Stoker file to a local fd. */
static int get_fd(const char *cmd, struct target *src, int fd, const char *dst_name)
{
	stk_file *f;
	char *buf;
	int rc = 0;

	rc = stk_open(src->c, src->path, O_RDONLY, 0, &f);
	if (rc) {
		cli_err(cmd, "%s: %s", src->path, stk_strerror(rc));
		return rc;
	}
	buf = malloc(CLI_IO_SIZE);
	if (!buf) {
		stk_close(f);
		return -ENOMEM;
	}
	for (;;) {
		ssize_t n = stk_read(f, buf, CLI_IO_SIZE);
		if (n < 0) {
			rc = (int)n;
			cli_err(cmd, "%s: %s", src->path, stk_strerror(rc));
			break;
		}
		if (n == 0)
			break;
		rc = stk_write_all(fd, buf, (size_t)n);
		if (rc) {
			cli_err(cmd, "writing %s: %s", dst_name, stk_strerror(rc));
			break;
		}
	}
	stk_close(f);
	free(buf);
	return rc;
}

int cmd_get(int argc, char **argv)
{
	struct target src;
	char dpath[CLI_PATH + 256];
	struct stat st;
	int fd, rc;

	if (argc != 3)
		return cli_usage("get");
	if (resolve_arg("get", argv[1], &src))
		return 1;
	if (strcmp(argv[2], "-") == 0)
		return get_fd("get", &src, 1, "stdout") ? 1 : 0;
	snprintf(dpath, sizeof(dpath), "%s", argv[2]);
	if (stat(dpath, &st) == 0 && S_ISDIR(st.st_mode))
		snprintf(dpath, sizeof(dpath), "%s/%s", argv[2], base_name(src.path));
	/* Write beside the destination and rename: a failed get leaves no partial file. */
	char tmp[CLI_PATH + 300];
	snprintf(tmp, sizeof(tmp), "%s.stoker-get.%d", dpath, (int)getpid());
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0) {
		cli_err("get", "%s: %s", dpath, strerror(errno));
		return 1;
	}
	rc = get_fd("get", &src, fd, dpath);
	if (close(fd) < 0 && !rc) {
		rc = -errno;
		cli_err("get", "%s: %s", dpath, strerror(errno));
	}
	if (!rc && rename(tmp, dpath) < 0) {
		rc = -errno;
		cli_err("get", "%s: %s", dpath, strerror(errno));
	}
	if (rc)
		unlink(tmp);
	return rc ? 1 : 0;
}

int cmd_cat(int argc, char **argv)
{
	int fails = 0;

	if (argc < 2)
		return cli_usage("cat");
	for (int i = 1; i < argc; i++) {
		struct target t;
		if (resolve_arg("cat", argv[i], &t))
			return 1;
		if (get_fd("cat", &t, 1, "stdout"))
			fails++;
	}
	return fails ? 1 : 0;
}

static int mkdir_p(stk_client *c, char *path)
{
	struct stat st;
	int rc;

	for (char *p = path + 1;; p++) {
		if (*p != '/' && *p)
			continue;
		char save = *p;
		*p = 0;
		rc = stk_mkdir(c, path, 0755);
		if (rc == -EEXIST) {
			rc = stk_stat(c, path, &st);
			if (rc == 0 && !S_ISDIR(st.st_mode))
				rc = -ENOTDIR;
		}
		*p = save;
		if (rc)
			return rc;
		if (!save)
			return 0;
		while (p[1] == '/')
			p++;
		if (!p[1])
			return 0;
	}
}

int cmd_mkdir(int argc, char **argv)
{
	int parents = 0, fails = 0, c;

	optind = 1;
	while ((c = getopt(argc, argv, "p")) != -1) {
		if (c == 'p')
			parents = 1;
		else
			return cli_usage("mkdir");
	}
	if (optind == argc)
		return cli_usage("mkdir");
	for (int i = optind; i < argc; i++) {
		struct target t;
		int rc;
		if (resolve_arg("mkdir", argv[i], &t))
			return 1;
		rc = parents ? (strcmp(t.path, "/") ? mkdir_p(t.c, t.path) : 0)
			     : stk_mkdir(t.c, t.path, 0755);
		if (rc) {
			cli_err("mkdir", "%s: %s", argv[i], stk_strerror(rc));
			fails++;
		}
	}
	return fails ? 1 : 0;
}

static int rm_tree(stk_client *c, const char *path)
{
	struct stat st;
	stk_dir *d;
	struct dirent de;
	int rc;

	rc = stk_stat(c, path, &st);
	if (rc)
		return rc;
	if (!S_ISDIR(st.st_mode))
		return stk_unlink(c, path);
	/* List in batches and remove: each pass restarts the listing, since removing
	 * entries while iterating is fine but simplest to reason about this way. */
	for (;;) {
		int removed = 0;
		rc = stk_opendir(c, path, &d);
		if (rc)
			return rc;
		while ((rc = stk_readdir(d, &de)) == 1) {
			size_t n = strlen(path) + strlen(de.d_name) + 2;
			char *child = malloc(n);
			if (!child) {
				rc = -ENOMEM;
				break;
			}
			snprintf(child, n, "%s/%s", strcmp(path, "/") ? path : "", de.d_name);
			rc = rm_tree(c, child);
			free(child);
			if (rc && rc != -ENOENT)
				break;
			removed++;
			rc = 0;
		}
		stk_closedir(d);
		if (rc < 0)
			return rc;
		if (!removed)
			break;
	}
	if (strcmp(path, "/") == 0)
		return 0;
	return stk_rmdir(c, path);
}

int cmd_rm(int argc, char **argv)
{
	int rec = 0, force = 0, fails = 0, c;

	optind = 1;
	while ((c = getopt(argc, argv, "rRf")) != -1) {
		if (c == 'r' || c == 'R')
			rec = 1;
		else if (c == 'f')
			force = 1;
		else
			return cli_usage("rm");
	}
	if (optind == argc)
		return force ? 0 : cli_usage("rm");
	for (int i = optind; i < argc; i++) {
		struct target t;
		struct stat st;
		int rc;
		if (resolve_arg("rm", argv[i], &t))
			return 1;
		rc = stk_stat(t.c, t.path, &st);
		if (rc == 0 && S_ISDIR(st.st_mode) && !rec)
			rc = -EISDIR;
		else if (rc == 0)
			rc = rec ? rm_tree(t.c, t.path) : stk_unlink(t.c, t.path);
		if (rc == -ENOENT && force)
			continue;
		if (rc) {
			cli_err("rm", "%s: %s%s", argv[i], stk_strerror(rc),
				rc == -EISDIR ? " (use -r)" : "");
			fails++;
		}
	}
	return fails ? 1 : 0;
}

int cmd_mv(int argc, char **argv)
{
	struct target a, b;
	struct stat st;
	int rc;

	if (argc != 3)
		return cli_usage("mv");
	if (resolve_arg("mv", argv[1], &a) || resolve_arg("mv", argv[2], &b))
		return 1;
	if (a.c != b.c) {
		cli_err("mv", "cannot move between clusters");
		return 1;
	}
	if (stk_stat(b.c, b.path, &st) == 0 && S_ISDIR(st.st_mode)) {
		struct stat sst;
		/* Moving into an existing directory, unless renaming a dir over an empty dir
		 * was meant: like mv(1), "mv a dir" means "dir/a". */
		if (stk_stat(a.c, a.path, &sst) == 0) {
			size_t n = strlen(b.path);
			const char *bn = base_name(a.path);
			if (n + strlen(bn) + 2 >= sizeof(b.path)) {
				cli_err("mv", "%s: %s", argv[2], stk_strerror(-ENAMETOOLONG));
				return 1;
			}
			snprintf(b.path + n, sizeof(b.path) - n, "%s%s",
				 b.path[n - 1] == '/' ? "" : "/", bn);
		}
	}
	rc = stk_rename(a.c, a.path, b.path, 0);
	if (rc) {
		cli_err("mv", "%s -> %s: %s", argv[1], argv[2], stk_strerror(rc));
		return 1;
	}
	return 0;
}
