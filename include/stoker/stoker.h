/*
 * libstoker: the Stoker client library.
 *
 * Every client-side program (the CLI, the FUSE daemon, the gateways, the Python
 * package) talks to a cluster through this API. A stk_client is a connection to
 * one cluster: it holds the routing table (fetched from mgmtd and refreshed when a
 * server says it is stale), a pool of connections to every node, and the caller's
 * credentials. Files are striped over chains in chunks; a large read or write goes
 * to all its chains in parallel.
 *
 * Conventions
 * - Every function that can fail returns 0 (or a non-negative count) on success
 *   and -errno on failure; errno itself is never set. stk_strerror() names an error.
 * - Paths are absolute within the cluster ("/data/a.bin"); "." and ".." components
 *   are resolved by the library; a trailing "/" is allowed on directories. Paths
 *   over 4095 bytes give -ENAMETOOLONG, names over 255 bytes likewise.
 * - Thread rules: a stk_client may be used from any number of threads at once.
 *   A stk_file may be used by several threads at once for pread/pwrite; read,
 *   write and lseek share the file position and should not be mixed across
 *   threads without the caller's own ordering.
 * - Consistency: close-to-open, as NFS. Writes are buffered in the handle and sent
 *   when the buffer fills, on stk_fsync and on stk_close; stk_fsync and stk_close
 *   return only when the data is on stable storage of every replica and the file
 *   size is recorded. Another client's stk_open after that sees the data.
 */
#ifndef STOKER_STOKER_H
#define STOKER_STOKER_H

#include <dirent.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/types.h>
#include <time.h>

#ifdef __cplusplus
extern "C" {
#endif

#define STK_API __attribute__((visibility("default")))

typedef struct stk_client stk_client;
typedef struct stk_file stk_file;
typedef struct stk_dir stk_dir;

/* Options for stk_connect. Set size = sizeof(struct stk_client_opts); zero means default. */
struct stk_client_opts {
	size_t size;
	unsigned conns_per_node; /* idle connections kept per node; default 16 */
	size_t write_buffer; /* per open file; default 4 MiB; 0 < n < chunk writes through */
	uint32_t stripe; /* stripe count for new files; default: the directory's default */
	uint32_t chunk_size; /* chunk size for new files; default 1 MiB */
	int uid, gid; /* credentials sent with metadata calls; default: the process's */
};

/*
 * Connects to the cluster whose mgmtd is at `cluster`: "stk://HOST:PORT" or
 * "HOST:PORT". NULL means the default cluster: $STOKER_CLUSTER, else the cluster
 * `stoker up` started on this machine (recorded in /tmp/stoker-UID/cluster).
 * opts may be NULL. On success *out is a client to release with stk_disconnect.
 * Errors: -EINVAL (malformed address), -ENOENT (no default cluster), -ECONNREFUSED,
 * -ETIMEDOUT, -EHOSTUNREACH, -ENOMEM, -EPROTO (not a Stoker mgmtd).
 */
STK_API int stk_connect(const char *cluster, const struct stk_client_opts *opts, stk_client **out);
/* Closes every connection. Open files must be closed first; their buffers are lost. */
STK_API void stk_disconnect(stk_client *c);
/* The "HOST:PORT" of the cluster's mgmtd. Valid until stk_disconnect. */
STK_API const char *stk_cluster_addr(const stk_client *c);
/* Re-opens connections after fork(): call in the child before using c. */
STK_API void stk_after_fork(stk_client *c);

/*
 * Opens a file. flags: O_RDONLY, O_WRONLY or O_RDWR, with O_CREAT, O_EXCL, O_TRUNC,
 * O_APPEND; mode is used with O_CREAT (the umask is not applied: that is the
 * caller's job, as with the kernel's open for FUSE). On success *out is a handle
 * to release with stk_close.
 * Errors: -ENOENT, -EEXIST (O_CREAT|O_EXCL), -EISDIR (a directory opened for
 * writing), -ENOTDIR, -EACCES, -ENAMETOOLONG, -EINVAL, -ENOSPC, -EIO.
 */
STK_API int stk_open(stk_client *c, const char *path, int flags, mode_t mode, stk_file **out);
/* Flushes buffered writes, makes them durable, records the size, frees f (always). */
STK_API int stk_close(stk_file *f);
/*
 * Reads up to len bytes at the file position (pread: at off) into buf. Returns the
 * bytes read (0 at end of file) or -errno: -EBADF (not open for reading), -EIO (a
 * checksum failed or a storage node is unreachable), -EINVAL.
 */
STK_API ssize_t stk_read(stk_file *f, void *buf, size_t len);
STK_API ssize_t stk_pread(stk_file *f, void *buf, size_t len, off_t off);
/*
 * Writes len bytes at the file position (O_APPEND: at the end; pwrite: at off).
 * Returns len or -errno: -EBADF, -ENOSPC (a target is full; nothing already stored
 * is harmed), -EFBIG, -EIO.
 */
STK_API ssize_t stk_write(stk_file *f, const void *buf, size_t len);
STK_API ssize_t stk_pwrite(stk_file *f, const void *buf, size_t len, off_t off);
/* SEEK_SET, SEEK_CUR, SEEK_END. Returns the new position or -EINVAL. */
STK_API off_t stk_lseek(stk_file *f, off_t off, int whence);
/* Flushes and makes everything written so far durable. 0 or -errno. */
STK_API int stk_fsync(stk_file *f);
STK_API int stk_ftruncate(stk_file *f, off_t size);
STK_API int stk_fstat(stk_file *f, struct stat *st);

/* Path operations. Errors as their POSIX namesakes. */
STK_API int stk_stat(stk_client *c, const char *path, struct stat *st); /* follows no symlink */
STK_API int stk_truncate(stk_client *c, const char *path, off_t size);
STK_API int stk_mkdir(stk_client *c, const char *path, mode_t mode);
STK_API int stk_rmdir(stk_client *c, const char *path);
STK_API int stk_unlink(stk_client *c, const char *path);
/* flags: 0, or RENAME_NOREPLACE / RENAME_EXCHANGE (linux/fs.h values). */
STK_API int stk_rename(stk_client *c, const char *from, const char *to, unsigned flags);
STK_API int stk_symlink(stk_client *c, const char *target, const char *linkpath);
/* Copies at most size-1 bytes and a NUL. Returns the target's full length or -errno. */
STK_API ssize_t stk_readlink(stk_client *c, const char *path, char *buf, size_t size);
STK_API int stk_link(stk_client *c, const char *oldpath, const char *newpath);
STK_API int stk_chmod(stk_client *c, const char *path, mode_t mode);
STK_API int stk_chown(stk_client *c, const char *path, uid_t uid, gid_t gid); /* -1 keeps */
/* times[0] atime, times[1] mtime; tv_nsec may be UTIME_NOW or UTIME_OMIT; NULL = now. */
STK_API int stk_utimens(stk_client *c, const char *path, const struct timespec times[2]);
/* Capacity from the storage targets, file count from meta. */
STK_API int stk_statfs(stk_client *c, struct statvfs *st);

/*
 * Directory listing. stk_readdir returns 1 with *ent filled (d_name, d_ino,
 * d_type), 0 at the end, or -errno. Entries are fetched in batches; "." and ".."
 * are not returned. A stk_dir is used by one thread at a time.
 */
STK_API int stk_opendir(stk_client *c, const char *path, stk_dir **out);
STK_API int stk_readdir(stk_dir *d, struct dirent *ent);
STK_API void stk_closedir(stk_dir *d);

/* "No such file or directory", ...: strerror for -errno values, thread-safe. */
STK_API const char *stk_strerror(int err);

#ifdef __cplusplus
}
#endif
#endif
