/*
 * The CLI tools' file interface (fsio.h): each call switches on whether the file
 * system is Stoker (fs->c set) or local, and does the same thing on both. Local
 * files written are fsynced at close, as Stoker's are, so that tools (pack) give
 * the same durability whatever the destination.
 */
#include "fsio.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../common/util.h"
#include "cli.h"

int cli_fs_resolve(const char *cmd, const char *arg, struct cli_fs *fs, char *path)
{
	return cli_fs_resolve_opts(cmd, arg, NULL, fs, path);
}

void cli_fs_release(struct cli_fs *fs)
{
	if (fs->own)
		stk_disconnect(fs->c);
	fs->c = NULL;
	fs->own = 0;
}

int cli_fs_resolve_opts(const char *cmd, const char *arg, const struct stk_client_opts *opts,
			struct cli_fs *fs, char *path)
{
	char cluster[128];
	int rc;

	fs->c = NULL;
	fs->own = 0;
	if (strncmp(arg, "stk://", 6) != 0) {
		if (stk_strlcpy(path, arg, CLI_FS_PATH)) {
			cli_err(cmd, "%s: %s", arg, stk_strerror(-ENAMETOOLONG));
			return -ENAMETOOLONG;
		}
		return 0;
	}
	if (strncmp(arg, "stk:///", 7) == 0) { /* the default cluster */
		cluster[0] = 0;
		rc = stk_strlcpy(path, arg + 6, CLI_FS_PATH) ? -ENAMETOOLONG : 0;
	} else {
		rc = cli_split(arg, cluster, sizeof(cluster), path, CLI_FS_PATH);
	}
	if (rc) {
		cli_err(cmd, "%s: %s", arg,
			rc == -EINVAL ? "malformed stk:// address" : stk_strerror(rc));
		return rc;
	}
	if (!opts) {
		fs->c = cli_connect(cmd, cluster[0] ? cluster : NULL);
		return fs->c ? 0 : -ENOTCONN;
	}
	rc = stk_connect(cluster[0] ? cluster : NULL, opts, &fs->c);
	if (rc) {
		cli_err(cmd, "cannot reach the cluster at %s: %s",
			cluster[0] ? cluster : "(default)", stk_strerror(rc));
		fs->c = NULL;
		return rc;
	}
	fs->own = 1;
	return 0;
}

const char *cli_fs_name(const struct cli_fs *fs)
{
	return fs->c ? "stoker" : "local";
}

int cli_fs_open(struct cli_fs *fs, const char *path, int flags, mode_t mode, struct cli_file *f)
{
	memset(f, 0, sizeof(*f));
	f->fs = fs;
	f->fd = -1;
	f->writing = (flags & O_ACCMODE) != O_RDONLY;
	if (fs->c)
		return stk_open(fs->c, path, flags, mode, &f->sf);
	f->fd = open(path, flags | O_CLOEXEC, mode);
	return f->fd < 0 ? -errno : 0;
}

ssize_t cli_fs_pread(struct cli_file *f, void *buf, size_t len, uint64_t off)
{
	if (f->sf)
		return stk_pread(f->sf, buf, len, (off_t)off);
	return stk_pread_full(f->fd, buf, len, off);
}

int cli_fs_write(struct cli_file *f, const void *buf, size_t len)
{
	if (f->sf) {
		ssize_t n = stk_write(f->sf, buf, len);
		return n < 0 ? (int)n : 0;
	}
	return stk_write_all(f->fd, buf, len);
}

int cli_fs_pwrite(struct cli_file *f, const void *buf, size_t len, uint64_t off)
{
	if (f->sf) {
		ssize_t n = stk_pwrite(f->sf, buf, len, (off_t)off);
		return n < 0 ? (int)n : 0;
	}
	return stk_pwrite_all(f->fd, buf, len, off);
}

int cli_fs_close(struct cli_file *f)
{
	int rc = 0;

	if (f->sf) {
		rc = stk_close(f->sf);
		f->sf = NULL;
	} else if (f->fd >= 0) {
		if (f->writing && fsync(f->fd) < 0)
			rc = -errno;
		if (close(f->fd) < 0 && !rc)
			rc = -errno;
		f->fd = -1;
	}
	return rc;
}

int cli_fs_size(struct cli_file *f, uint64_t *size)
{
	struct stat st;

	if (f->sf) {
		*size = stk_file_size(f->sf);
		return 0;
	}
	if (fstat(f->fd, &st) < 0)
		return -errno;
	*size = (uint64_t)st.st_size;
	return 0;
}

int cli_fs_fstat(struct cli_file *f, struct stat *st)
{
	if (f->sf)
		return stk_fstat(f->sf, st);
	return fstat(f->fd, st) < 0 ? -errno : 0;
}

int cli_fs_stat(struct cli_fs *fs, const char *path, struct stat *st)
{
	if (fs->c)
		return stk_stat(fs->c, path, st);
	return stat(path, st) < 0 ? -errno : 0;
}

int cli_fs_mkdirs(struct cli_fs *fs, const char *path)
{
	char buf[CLI_FS_PATH];
	int rc;

	if (!fs->c)
		return stk_mkdir_p(path, 0755);
	if (stk_strlcpy(buf, path, sizeof(buf)))
		return -ENAMETOOLONG;
	for (char *p = buf + 1;; p++) {
		if (*p == '/' || *p == 0) {
			char saved = *p;
			*p = 0;
			rc = stk_mkdir(fs->c, buf, 0755);
			if (rc && rc != -EEXIST)
				return rc;
			*p = saved;
			if (!saved)
				break;
		}
	}
	return 0;
}

int cli_fs_rename(struct cli_fs *fs, const char *from, const char *to)
{
	if (fs->c)
		return stk_rename(fs->c, from, to, 0);
	if (rename(from, to) < 0)
		return -errno;
	return stk_fsync_parent(to);
}

int cli_fs_unlink(struct cli_fs *fs, const char *path)
{
	if (fs->c)
		return stk_unlink(fs->c, path);
	return unlink(path) < 0 ? -errno : 0;
}

int cli_fs_lstat(struct cli_fs *fs, const char *path, struct stat *st)
{
	if (fs->c)
		return stk_stat(fs->c, path, st);
	return lstat(path, st) < 0 ? -errno : 0;
}

int cli_fs_readlink(struct cli_fs *fs, const char *path, char *buf, size_t size)
{
	ssize_t n;

	if (fs->c) {
		n = stk_readlink(fs->c, path, buf, size);
		if (n < 0)
			return (int)n;
	} else {
		n = readlink(path, buf, size);
		if (n < 0)
			return -errno;
		if ((size_t)n == size)
			return -ENAMETOOLONG; /* readlink(2) cuts silently */
		buf[n] = 0;
	}
	return (size_t)n >= size ? -ENAMETOOLONG : (int)n;
}

int cli_fs_symlink(struct cli_fs *fs, const char *target, const char *path)
{
	if (fs->c)
		return stk_symlink(fs->c, target, path);
	return symlink(target, path) < 0 ? -errno : 0;
}

int cli_fs_mkdir(struct cli_fs *fs, const char *path, mode_t mode)
{
	if (fs->c)
		return stk_mkdir(fs->c, path, mode);
	return mkdir(path, mode) < 0 ? -errno : 0;
}

int cli_fs_rmdir(struct cli_fs *fs, const char *path)
{
	if (fs->c)
		return stk_rmdir(fs->c, path);
	return rmdir(path) < 0 ? -errno : 0;
}

int cli_fs_chmod(struct cli_fs *fs, const char *path, mode_t mode)
{
	if (fs->c)
		return stk_chmod(fs->c, path, mode);
	return chmod(path, mode) < 0 ? -errno : 0;
}

int cli_fs_lchown(struct cli_fs *fs, const char *path, uid_t uid, gid_t gid)
{
	if (fs->c)
		return stk_chown(fs->c, path, uid, gid);
	return lchown(path, uid, gid) < 0 ? -errno : 0;
}

int cli_fs_utimens(struct cli_fs *fs, const char *path, const struct timespec ts[2])
{
	if (fs->c)
		return stk_utimens(fs->c, path, ts);
	return utimensat(AT_FDCWD, path, ts, AT_SYMLINK_NOFOLLOW) < 0 ? -errno : 0;
}

int cli_fs_list(struct cli_fs *fs, const char *dir, cli_fs_list_fn fn, void *ctx)
{
	int rc = 0;

	if (fs->c) {
		struct dirent ent;
		stk_dir *d;

		rc = stk_opendir(fs->c, dir, &d);
		if (rc)
			return rc;
		int more;

		while ((more = stk_readdir(d, &ent)) == 1) {
			int is_dir = ent.d_type == DT_DIR;
			if (ent.d_type == DT_UNKNOWN) {
				char p[CLI_FS_PATH];
				struct stat st;
				snprintf(p, sizeof(p), "%s/%s", dir, ent.d_name);
				is_dir = stk_stat(fs->c, p, &st) == 0 && S_ISDIR(st.st_mode);
			}
			rc = fn(ctx, ent.d_name, is_dir);
			if (rc)
				break;
		}
		stk_closedir(d);
		return rc ? rc : more < 0 ? more : 0;
	} else {
		DIR *d = opendir(dir);
		struct dirent *e;

		if (!d)
			return -errno;
		while ((e = readdir(d))) {
			int is_dir;
			if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
				continue;
			/* Symbolic links are never descended into (a loop would never end). */
			is_dir = e->d_type == DT_DIR;
			if (e->d_type == DT_UNKNOWN) {
				char p[CLI_FS_PATH];
				struct stat st;
				snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
				is_dir = lstat(p, &st) == 0 && S_ISDIR(st.st_mode);
			}
			rc = fn(ctx, e->d_name, is_dir);
			if (rc)
				break;
		}
		closedir(d);
		return rc;
	}
}

void cli_fs_drop_cache(struct cli_fs *fs, const char *path)
{
	int fd;

	if (fs->c)
		return;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return;
	posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
	close(fd);
}
