/*
 * Files for the CLI tools that work on either side of the fence (`stoker pack`,
 * `stoker bench loader`): one small interface over Stoker (libstoker) and the local
 * file system, so that the same code packs a local folder into Stoker, or runs the
 * same benchmark on Stoker and on a local disk for comparison.
 *
 * Addresses: "stk://HOST:PORT/path" names a path in that cluster, "stk:///path" a
 * path in the default cluster ($STOKER_CLUSTER, else the one `stoker up` started);
 * anything else is a local path.
 *
 * Every call returns 0 (or a count) or -errno. A cli_fs and its files may be used
 * from several threads at once (pread only on a shared file).
 */
#ifndef STK_CLI_FSIO_H
#define STK_CLI_FSIO_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "stoker/stoker.h"

#define CLI_FS_PATH 4097

struct cli_fs {
	stk_client *c; /* NULL: the local file system */
	int own;       /* c was connected by cli_fs_resolve_opts: cli_fs_release disconnects it */
};

struct cli_file {
	struct cli_fs *fs;
	stk_file *sf; /* Stoker */
	int fd;	      /* local */
	int writing;
};

/*
 * Splits an argument into the file system it names and the path there (path holds
 * CLI_FS_PATH bytes). Connects (through cli_connect) for a Stoker address; prints
 * the error and returns -errno on failure.
 */
int cli_fs_resolve(const char *cmd, const char *arg, struct cli_fs *fs, char *path);
/* As cli_fs_resolve, with a client of its own connected with opts (release it after). */
int cli_fs_resolve_opts(const char *cmd, const char *arg, const struct stk_client_opts *opts,
			struct cli_fs *fs, char *path);
void cli_fs_release(struct cli_fs *fs);
/* "stoker" or "local". */
const char *cli_fs_name(const struct cli_fs *fs);

int cli_fs_open(struct cli_fs *fs, const char *path, int flags, mode_t mode, struct cli_file *f);
/* All of len bytes at off unless the end comes first: the bytes read, or -errno. */
ssize_t cli_fs_pread(struct cli_file *f, void *buf, size_t len, uint64_t off);
/* All of len bytes at the position: 0 or -errno. */
int cli_fs_write(struct cli_file *f, const void *buf, size_t len);
/*
 * All of len bytes at off: 0 or -errno. Several handles of one file may write
 * their own ranges from several threads at once (`stoker sync`'s parts).
 */
int cli_fs_pwrite(struct cli_file *f, const void *buf, size_t len, uint64_t off);
/* Closes; a file written to is made durable first (fsync). 0 or -errno. */
int cli_fs_close(struct cli_file *f);
int cli_fs_size(struct cli_file *f, uint64_t *size);
/* The open file's attributes, asked of the cluster for Stoker (not a cached size). */
int cli_fs_fstat(struct cli_file *f, struct stat *st);

int cli_fs_stat(struct cli_fs *fs, const char *path, struct stat *st);
int cli_fs_mkdirs(struct cli_fs *fs, const char *path);
int cli_fs_rename(struct cli_fs *fs, const char *from, const char *to);
int cli_fs_unlink(struct cli_fs *fs, const char *path);

/*
 * What `stoker sync` needs to copy a tree with its attributes. None follows a
 * symbolic link at the end of path on the local file system: lstat and readlink
 * describe the link itself, lchown and utimens change the link itself. On Stoker
 * lchown and utimens follow a final link (the client library has no l-variant):
 * callers leave links' owners and times alone there. readlink copies at most
 * size-1 bytes and a NUL and returns the target's length, or -ENAMETOOLONG when
 * it does not fit.
 */
int cli_fs_lstat(struct cli_fs *fs, const char *path, struct stat *st);
int cli_fs_readlink(struct cli_fs *fs, const char *path, char *buf, size_t size);
int cli_fs_symlink(struct cli_fs *fs, const char *target, const char *path);
int cli_fs_mkdir(struct cli_fs *fs, const char *path, mode_t mode);
int cli_fs_rmdir(struct cli_fs *fs, const char *path);
int cli_fs_chmod(struct cli_fs *fs, const char *path, mode_t mode);
int cli_fs_lchown(struct cli_fs *fs, const char *path, uid_t uid, gid_t gid);
int cli_fs_utimens(struct cli_fs *fs, const char *path, const struct timespec ts[2]);

/*
 * Calls fn for each entry of a directory ("." and ".." left out) with its name and
 * whether it is a directory (a symbolic link never is); fn returning non-zero stops
 * the listing with that value.
 */
typedef int (*cli_fs_list_fn)(void *ctx, const char *name, int is_dir);
int cli_fs_list(struct cli_fs *fs, const char *dir, cli_fs_list_fn fn, void *ctx);

/*
 * Drops the local page cache of a file (posix_fadvise DONTNEED), so that a
 * benchmark reads from the disk; a no-op for Stoker paths. Best effort.
 */
void cli_fs_drop_cache(struct cli_fs *fs, const char *path);

#endif
