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

/* The release of Stoker this header comes from (stoker.pc gives the same). */
#define STK_VERSION "0.1.0"

typedef struct stk_client stk_client;
typedef struct stk_file stk_file;
typedef struct stk_dir stk_dir;

/* Options for stk_connect. Set size = sizeof(struct stk_client_opts); zero means default. */
struct stk_client_opts {
	size_t size;
	/* Connections per node, each carrying many requests at once; default 2. */
	unsigned conns_per_node;
	size_t write_buffer; /* per open file; default 4 MiB; 0 < n < chunk writes through */
	uint32_t stripe; /* stripe count for new files; default: the directory's default */
	uint32_t chunk_size; /* chunk size for new files; default 1 MiB */
	int uid, gid; /* credentials sent with metadata calls; default: the process's */
	/*
	 * How long, in ms, a call retries an unreachable cluster (a daemon restarting,
	 * a reset connection) before it fails with -EIO; default $STOKER_RETRY_MS, else
	 * 30 s (a node that hangs is given up after mgmtd's heartbeat timeout, 10 s).
	 * STK_RETRY_FOREVER: never give up (calls block until the cluster is back).
	 */
	uint32_t retry_ms;
	/*
	 * The cluster key file (docs/security.md). NULL: $STOKER_KEY_FILE, else the key
	 * `stoker up` recorded for the cluster's address (/tmp/stoker-UID/keys/), else
	 * none. With a key, every connection proves it; a cluster that requires one
	 * refuses a client without it (-EKEYREJECTED). The file is read during
	 * stk_connect only (the string may go after it); the process keeps the key.
	 */
	const char *key_file;
	/*
	 * Nonzero (or $STOKER_AUTH=strict): check keys strictly, for the whole process
	 * from then on. A daemon that needs no handshake has proved nothing and is
	 * refused (-EKEYREJECTED), and stk_connect fails so when no key is found. By
	 * default such a daemon is trusted, so that one process can use old clusters.
	 */
	int auth_strict;
	/*
	 * 1: TLS on every connection (docs/security.md, "TLS"), for the whole process
	 * from then on; needs the cluster key (key_file above). 0: $STOKER_TLS (1 on,
	 * 0 off), else what `stoker up --tls` recorded for the cluster's address, else
	 * plaintext. A client asking for TLS refuses a daemon without it (-ECONNRESET or
	 * -EPROTO, logged); a daemon requiring TLS refuses a plaintext client
	 * (-EPROTONOSUPPORT, logged).
	 */
	int tls;
	/*
	 * The QoS class this client's chunk reads and writes are marked with
	 * (docs/qos.md): "default", "training-read" or "checkpoint". NULL:
	 * $STOKER_QOS_CLASS, else "default". Another name fails stk_connect (-EINVAL).
	 */
	const char *qos_class;
};

#define STK_RETRY_FOREVER 0xffffffffu

/*
 * Connects to the cluster whose mgmtd is at `cluster`: "stk://HOST:PORT" or
 * "HOST:PORT". NULL means the default cluster: $STOKER_CLUSTER, else the cluster
 * `stoker up` started on this machine (recorded in /tmp/stoker-UID/cluster).
 * opts may be NULL. On success *out is a client to release with stk_disconnect.
 * Errors: -EINVAL (malformed address), -ENOENT (no default cluster), -ECONNREFUSED,
 * -ETIMEDOUT, -EHOSTUNREACH, -ENOMEM, -EPROTO (not a Stoker mgmtd), -EKEYREJECTED
 * (the cluster refused this process's key, or requires one it does not hold),
 * -EPERM (the key file is readable by others than its owner: it is not used),
 * -EPROTONOSUPPORT (the cluster requires TLS and this process does not use it:
 * set opts->tls or $STOKER_TLS=1).
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
/*
 * Flushes buffered writes, makes them durable, records the size, frees f (always).
 * Returns -errno when any write of the handle failed (see stk_fsync).
 */
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
/*
 * Flushes and makes everything written so far durable. 0 or -errno.
 * A write that did not reach storage (a buffer whose send failed, a failed
 * write-through or sync) is never published: the size recorded in meta stops at
 * the lowest byte storage may lack (never below the size meta had), so readers get
 * the old bytes or the acknowledged new ones, never zeros nobody wrote. The error
 * is sticky, as Linux's errseq: this and every later stk_fsync and stk_close of the
 * handle return it, and reads through it stop at that size. To retry, open again.
 */
STK_API int stk_fsync(stk_file *f);
STK_API int stk_ftruncate(stk_file *f, off_t size);
/* fallocate modes, with the values of Linux's FALLOC_FL_* (linux/falloc.h). */
#define STK_FALLOC_KEEP_SIZE 0x01
#define STK_FALLOC_PUNCH_HOLE 0x02
#define STK_FALLOC_ZERO_RANGE 0x10
/*
 * fallocate(2) on [off, off + len) of a file open for writing:
 * - 0: the size grows to off + len if it was smaller (the chunks are not
 *   reserved: a later write may still get -ENOSPC); STK_FALLOC_KEEP_SIZE alone
 *   does nothing.
 * - STK_FALLOC_PUNCH_HOLE | STK_FALLOC_KEEP_SIZE: the range reads as zeros; the
 *   whole chunks in it are removed from storage (st_blocks drops by them), the
 *   partial ones at its edges get zeros written. The size stays.
 * - STK_FALLOC_ZERO_RANGE (with or without KEEP_SIZE): as the punch, and without
 *   KEEP_SIZE the size grows to off + len.
 * What the handle buffered is written first; the change is durable and recorded
 * in meta when the call returns, as after stk_fsync. Returns 0 or -errno: -EBADF
 * (read-only handle), -EISDIR, -EINVAL (off < 0, len <= 0), -EFBIG, -EOPNOTSUPP
 * (any other mode or combination: collapse and insert range are not supported),
 * -EIO, -ENOSPC.
 */
STK_API int stk_fallocate(stk_file *f, int mode, off_t off, off_t len);
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
/*
 * mknod(2): a fifo (S_IFIFO), a Unix socket's inode (S_IFSOCK), a character or
 * block device (S_IFCHR, S_IFBLK: dev is its number, from makedev; root only,
 * else -EPERM), or an empty regular file (S_IFREG or no type: an exclusive
 * create), with permission bits mode & 07777. Such a special file is an inode
 * only: stat, chmod, chown, link, rename, unlink and extended attributes work on
 * it, while stk_open of it gives -EINVAL (fifos and devices are the kernel's to
 * open, through a mount). Errors: -EEXIST, -EINVAL (another type), -EPERM, and
 * those of stk_mkdir.
 */
STK_API int stk_mknod(stk_client *c, const char *path, mode_t mode, dev_t dev);
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
 * Quotas per folder (docs/quotas.md). A folder with a quota is a quota root:
 * its files' bytes (their sizes, logical) and its inodes (the folder itself
 * included) are counted, and limited where a limit is set. An inode counts in
 * the nearest quota above it and in every quota above that one. Writes past a
 * byte limit fail with -EDQUOT before any of their bytes reach storage; creates
 * past an inode limit with -EDQUOT. Nothing already written is touched.
 *
 * struct stk_quota is a quota as meta last counted it; the caller owns it.
 */
struct stk_quota {
	uint64_t ino;	       /* the quota root's inode number */
	uint64_t parent;       /* the quota root above it (inode number), 0: none */
	char path[4096];       /* the quota root's path, as meta finds it ("" if not) */
	uint64_t limit_bytes;  /* 0: none */
	uint64_t limit_inodes; /* 0: none */
	uint64_t used_bytes;
	uint64_t used_inodes;
	uint64_t reserved_bytes; /* reserved by writers now, not yet sizes */
	/* stk_quota_recount only: the usage was wrong (old_*) and is now fixed. */
	int fixed;
	uint64_t old_bytes;
	uint64_t old_inodes;
};

/* Which limits stk_quota_set sets; a limit not named keeps its value (none, for a new quota). */
#define STK_QUOTA_BYTES 0x1u
#define STK_QUOTA_INODES 0x2u

/*
 * Sets the limits named in `which` on folder `path` (a limit of 0 removes that
 * limit), making it a quota root if it is not one: meta then walks the tree below
 * it once, counting what it holds (other writers wait meanwhile; meta logs its
 * progress on big trees). Root only. *out (may be NULL) is the quota after.
 * Errors: -EPERM (not root), -ENOTDIR (not a folder), -ENOENT, -EINVAL (which is
 * 0 or has unknown bits), and those of path resolution.
 */
STK_API int stk_quota_set(stk_client *c, const char *path, uint64_t limit_bytes,
			  uint64_t limit_inodes, unsigned which, struct stk_quota *out);
/*
 * Removes folder path's quota: what it counted counts in the quota above it, if
 * any. Root only. -ENOENT: the folder has no quota of its own; -EPERM; -ENOTDIR.
 */
STK_API int stk_quota_rm(stk_client *c, const char *path);
/*
 * The quota path counts in (the nearest quota root at or above it) into *out (the
 * caller's; path is read during the call only). -ENOENT: none; those of path
 * resolution.
 */
STK_API int stk_quota_get(stk_client *c, const char *path, struct stk_quota *out);
/*
 * Every quota, by inode number: *out is a malloc'ed array of *n (the caller frees
 * it; NULL when *n is 0). -ENOMEM, -EIO.
 */
STK_API int stk_quota_list(stk_client *c, struct stk_quota **out, size_t *n);
/*
 * Counts folder path's quota (NULL: every quota) again from the tree and fixes
 * its usage, and that of the quotas inside it: *out (malloc'ed, *n of them, the
 * caller frees it) is each quota recounted, with fixed and old_* saying what
 * changed. Root only (-EPERM); -ENOENT when path has no quota of its own.
 */
STK_API int stk_quota_recount(stk_client *c, const char *path, struct stk_quota **out, size_t *n);

/*
 * fsck (`stoker fsck`, docs/fsck.md): the namespace and the data checked against
 * each other, on a live cluster, without stopping it. Root only.
 *
 * The namespace is checked by meta in one transaction, so operations in flight
 * never show as problems. The data is checked here, in two passes a second
 * apart: each lists meta's regular files and every chunk of every target that
 * serves, and only what both passes found alike is reported (a write, truncate
 * or unlink in flight does not stay the same).
 *
 * Problem kinds (struct stk_fsck_problem's kind), namespace first:
 *   STK_FSCK_DANGLING_ENTRY  entry (parent, name) names inode ino, which does not exist
 *   STK_FSCK_LOST_ENTRY      entry (parent, name) is in parent, which is no folder
 *   STK_FSCK_LINK_COUNT      inode ino's link count is found, its names say expect
 *   STK_FSCK_UNREACHED_INODE inode ino has no name and is not open (found: nlink,
 *                            expect: its parent pointer); repaired, it is entry
 *                            `name` ("#INO") in folder parent, /lost+found
 *   STK_FSCK_STALE_ORPHAN    an orphan record names inode ino, which does not exist
 *   STK_FSCK_PARENT_POINTER  folder ino points at found, its entry is in folder expect
 *   STK_FSCK_QUOTA_BYTES,    quota root ino counts found bytes (inodes), its
 *   STK_FSCK_QUOTA_INODES    tree holds expect
 *   STK_FSCK_CORRUPT_RECORD  a record of inode ino (or an entry) that does not decode
 *   STK_FSCK_NAME_OFF_HOME   entry `name` in folder parent names file ino of shard
 *                            `found`, another shard (docs/meta-shards.md), whose
 *                            records of that name are missing (expect: 1 the file's
 *                            home does not count it, 2 the entry's shard has no
 *                            record of where it lives, 3 both); repaired, they are
 *                            written again, before the namespace is checked (whose
 *                            link counts then count the name)
 *   STK_FSCK_STALE_NAME_RECORD file ino counts a name on shard `found` that shard
 *                            does not have (nor is releasing; expect 1: that shard
 *                            keeps a leftover record of it); repaired, the records
 *                            and that link go (the file freed or orphaned as an
 *                            unlink would). expect 2: a shard keeps a record of a
 *                            name of file ino (of shard `found`) that it does not
 *                            have and the home does not count; repaired, it goes
 *   STK_FSCK_FOLDER_CYCLE    folder ino, entry `name` in folder parent, is in a loop
 *                            of `found` folders, each named in the next, that the
 *                            root does not reach; repaired, that entry is dropped and
 *                            the folder reattached (an STK_FSCK_UNREACHED_INODE of it)
 * and data:
 *   STK_FSCK_GARBAGE         copies chunk copies (bytes bytes) of inode ino, which
 *                            meta neither knows nor purges, all older than the grace
 *   STK_FSCK_MISSING_CHUNK   chunk `chunk` of inode ino (on chain `chain`), written
 *                            and below its size, is on no working replica: data lost
 *   STK_FSCK_REPLICAS_DIFFER the working replicas of chain `chain` disagree on chunk
 *                            `chunk` of inode ino (copies: how many hold one)
 * With repair, meta repairs in one write transaction what is safe (entries that
 * lead nowhere or from nowhere dropped, link counts, parent pointers and quota
 * usage set from the tree, an unreached file freed as an unlink would, stale
 * orphan records dropped), and garbage is removed from every chain holding some
 * (fenced by the namespace's identity). An unreached folder, a corrupt record,
 * missing data and disagreeing replicas are only reported.
 */
enum stk_fsck_problem_kind {
	STK_FSCK_DANGLING_ENTRY = 1,
	STK_FSCK_LOST_ENTRY,
	STK_FSCK_LINK_COUNT,
	STK_FSCK_UNREACHED_INODE,
	STK_FSCK_STALE_ORPHAN,
	STK_FSCK_PARENT_POINTER,
	STK_FSCK_QUOTA_BYTES,
	STK_FSCK_QUOTA_INODES,
	STK_FSCK_CORRUPT_RECORD,
	STK_FSCK_FOLDER_CYCLE,
	STK_FSCK_NAME_OFF_HOME,
	STK_FSCK_STALE_NAME_RECORD,
	STK_FSCK_GARBAGE = 32,
	STK_FSCK_MISSING_CHUNK,
	STK_FSCK_REPLICAS_DIFFER,
};

/* Options for stk_fsck. Set size = sizeof(struct stk_fsck_opts); zero means default. */
struct stk_fsck_opts {
	size_t size;
	int repair; /* nonzero: repair what is safe (above) */
	/*
	 * Chunks of an unknown inode younger than this many seconds are left alone
	 * (a file being created by a client that answers its creates itself): 0 is
	 * the default, 600; negative, none (every unknown chunk is garbage).
	 */
	int64_t grace_s;
	/*
	 * Called (if set) from the calling thread as the check goes, with a line
	 * saying where it is ("fsck: target 3 (2 of 8): bucket 17 of 256, ..."), valid
	 * during the call only; ctx is progress_ctx.
	 */
	void (*progress)(void *ctx, const char *line);
	void *progress_ctx;
};

/* One problem. Fields that do not apply to its kind are 0 (name ""). */
struct stk_fsck_problem {
	int kind; /* enum stk_fsck_problem_kind */
	int repaired;
	uint64_t ino;
	uint64_t parent;
	uint64_t expect, found;
	char name[256];
	uint32_t chunk, chain;
	uint64_t copies, bytes;
};

/* What stk_fsck found: the caller's, freed with stk_fsck_report_free. */
struct stk_fsck_report {
	/* The namespace's inodes, entries, folders and regular files. */
	uint64_t inodes, entries, dirs, files;
	/* Targets listed, and not listed as they do not serve (offline, syncing, wiping). */
	uint32_t targets, targets_skipped;
	/* Chunk copies listed (second pass). */
	uint64_t chunks;
	/* Inodes unknown to meta whose chunks are younger than the grace: left alone. */
	uint64_t young_unknown;
	/* Problems found, and those not repaired (0: the cluster is clean). */
	uint64_t problems, remaining;
	/* Namespace problems found past the first 2000: counted, not in list. */
	uint64_t unlisted;
	/* nlist problems: the namespace's, then the data's. */
	size_t nlist;
	struct stk_fsck_problem *list;
	/*
	 * Each metadata shard checked, by id (shard 1 first): its namespace's counts
	 * (the totals above are their sums) and its problems, the namespace's and the
	 * data's of its inodes (a problem's inode number names its shard). One entry
	 * for a cluster of one shard. At most 16 (the most shards a cluster has).
	 */
	uint32_t nshards;
	struct stk_fsck_shard {
		uint32_t id;
		uint64_t inodes, entries, dirs, files;
		uint64_t problems, remaining;
	} shards[16];
	/*
	 * With several shards: names and folders across shards that a cross-shard
	 * mkdir, rmdir, rename or link is at work on (an intent or a mark covers them),
	 * left alone, in fsck's last look: their protocol settles them.
	 */
	uint64_t in_progress;
};

/*
 * Runs fsck with opts (NULL: defaults) and, on success, sets *out to the report.
 * Blocks the calling thread for the whole check (a few seconds at least: the
 * second pass waits one when the first found something); it holds every regular
 * file's record and every chunk copy's (about 50 bytes each) at once. Errors
 * (*out is then NULL): -EPERM (not root), -EINVAL (c or out NULL, opts->size too
 * small), -ENOMEM, -EIO (a malformed reply), and those of reaching meta and the
 * storage nodes (a target that serves but cannot be listed fails the check).
 * Any thread; c may serve other calls meanwhile.
 */
STK_API int stk_fsck(stk_client *c, const struct stk_fsck_opts *opts, struct stk_fsck_report **out);
/* Frees a report of stk_fsck. NULL is a no-op. */
STK_API void stk_fsck_report_free(struct stk_fsck_report *r);
/*
 * Extended attributes of the file at path (symlinks followed), as setxattr(2) and
 * its siblings: name with its namespace ("user.", "trusted." and "security."
 * for root; "system.", POSIX ACLs, gives -EOPNOTSUPP), 1 to 255 bytes (-ERANGE);
 * values up to 64 KiB (-E2BIG). flags: 0, XATTR_CREATE (-EEXIST if present) or
 * XATTR_REPLACE (-ENODATA if absent). get and list return the length of the value
 * (of the NUL-separated list of names) and copy it when size > 0 (-ERANGE if it is
 * longer); size 0 asks only the length. A missing attribute is -ENODATA. user.*
 * needs read permission to get, write to set or remove. Any thread.
 */
STK_API int stk_setxattr(stk_client *c, const char *path, const char *name, const void *value,
			 size_t size, int flags);
STK_API ssize_t stk_getxattr(stk_client *c, const char *path, const char *name, void *value,
			     size_t size);
STK_API ssize_t stk_listxattr(stk_client *c, const char *path, char *list, size_t size);
STK_API int stk_removexattr(stk_client *c, const char *path, const char *name);

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

/*
 * The file's size as this handle knows it: the size at open, grown or cut by the
 * handle's own writes and truncates. Makes no call to the cluster (stk_fstat does).
 * Safe from any thread while f is open.
 */
STK_API uint64_t stk_file_size(stk_file *f);

/*
 * Batched asynchronous I/O: submit many reads (and writes) in one call, reap their
 * completions later. This is the data loader's path: a batch of 400 samples is one
 * submit and a few reaps, and the library keeps a bounded number of chunk requests
 * on the wire at once, spread over the files' chains and over one pooled
 * connection per request in flight.
 *
 * A stk_batch owns a fixed table of request slots (queue_depth) and a few engine
 * threads that take submitted requests in order, cut them into per-chunk pieces and
 * run at most max_inflight pieces at once. Nothing is allocated per request.
 *
 * The contract, as SPDK's: every request stk_batch_submit accepts completes exactly
 * once, through stk_batch_reap, with its user_data and its result (the bytes read or
 * written, or -errno); a request it does not accept never completes. Errors of one
 * request (a file not open for reading, a checksum failure) are its own and never
 * affect the others.
 *
 * Ownership and lifetime: the caller owns every buffer and every stk_file named in
 * a request; both must stay valid, and the buffer untouched, from submit until the
 * request's completion is reaped (or stk_batch_destroy returns). The library keeps
 * no pointer to a request array after stk_batch_submit returns.
 *
 * Threads: submit, reap and register may be called from any threads at once; in
 * the usual use one thread submits and reaps. A batch does not survive fork(): its
 * engine threads are the parent's; a child must create its own (after
 * stk_after_fork on the client), and must not call stk_batch_destroy on the
 * parent's batch.
 */
typedef struct stk_batch stk_batch;

/* Options for stk_batch_create. Set size = sizeof(struct stk_batch_opts); zero means default. */
struct stk_batch_opts {
	size_t size;
	unsigned max_inflight; /* chunk requests on the wire at once; default 64, at most 1024 */
	unsigned queue_depth; /* requests submitted and not yet reaped; default 4096 */
	unsigned threads; /* engine threads; default 2, at most 16 */
};

#define STK_BATCH_READ 0
#define STK_BATCH_WRITE 1

/*
 * One request. Reads and writes may be mixed in one submit. A request first sends
 * its file's write buffer, so it sees (or follows) the handle's own earlier writes.
 * A read is clamped to the size the handle knows (stk_file_size). A write goes to
 * storage directly at `offset` (O_APPEND handles are refused) and, like any write,
 * is durable once stk_fsync or stk_close of its file returns. Requests on one file
 * may run in any order and at once: do not overlap a write with another request.
 */
struct stk_batch_req {
	int op; /* STK_BATCH_READ or STK_BATCH_WRITE */
	stk_file *file; /* open for reading (reads) or writing (writes) */
	uint64_t offset;
	void *buf; /* len bytes: filled by a read, sent by a write */
	size_t len;
	uint64_t user_data; /* handed back in the completion, never looked at */
};

/* The completion of one request. */
struct stk_completion {
	uint64_t user_data;
	/*
	 * Reads: the bytes read, short only at the end of the file (0 at or past it;
	 * holes read as zeros). Writes: len. Or -errno: -EBADF (file NULL or not open
	 * for that), -EISDIR, -EINVAL (op unknown, buf NULL with len > 0, a write to an
	 * O_APPEND handle), -EFAULT (buf outside every registered buffer, when any are
	 * registered), -EFBIG, -EIO (checksum failure, storage unreachable), -ENOSPC,
	 * -ECANCELED (still queued when the batch was destroyed; never reaped).
	 */
	int64_t result;
};

/*
 * Creates a batch on client c; opts may be NULL. On success *out is a batch to
 * release with stk_batch_destroy, before stk_disconnect(c). The requests in flight
 * share the client's connections (each carries many at once).
 * Errors: -EINVAL (opts out of range), -ENOMEM, -EAGAIN (no thread could start).
 */
STK_API int stk_batch_create(stk_client *c, const struct stk_batch_opts *opts, stk_batch **out);
/*
 * Registers [buf, buf+len) as a buffer requests will read into or write from, once,
 * before the I/O (a transport with memory registration, such as RDMA, pins it
 * here). Once any buffer is registered, a request whose buffer is not inside a
 * registered one completes with -EFAULT. Registrations last until destroy.
 * Returns the buffer's index (0, 1, ...) or -EINVAL (NULL or empty), -ENOSPC (64
 * buffers already registered).
 */
STK_API int stk_batch_register(stk_batch *b, void *buf, size_t len);
/*
 * Submits n requests (copied; reqs may be reused on return). Returns how many were
 * accepted, from the front: fewer than n only when queue_depth requests are
 * outstanding (submitted, not reaped); those not accepted never complete. Returns
 * -EAGAIN when n > 0 and none fit, -EINVAL for reqs NULL with n > 0, -ESHUTDOWN
 * once stk_batch_destroy has begun. Never blocks on I/O.
 */
STK_API int stk_batch_submit(stk_batch *b, const struct stk_batch_req *reqs, unsigned n);
/* One read, as stk_batch_submit of one request. 0, -EAGAIN, -ESHUTDOWN. */
STK_API int stk_batch_read(stk_batch *b, stk_file *f, uint64_t off, size_t len, void *buf,
			   uint64_t user_data);
/*
 * Reaps up to max completions into out, oldest first, waiting until at least
 * min_wait are ready (min_wait is capped at the number outstanding, so UINT_MAX
 * waits for everything submitted) or timeout_ms pass (-1: no limit, 0: do not
 * wait). Returns the number reaped (0 when none were ready in time) or -EINVAL
 * (out NULL with max > 0). Each completion is reaped exactly once.
 */
STK_API int stk_batch_reap(stk_batch *b, struct stk_completion *out, unsigned max,
			   unsigned min_wait, int timeout_ms);
/* Requests submitted and not yet reaped. */
STK_API unsigned stk_batch_outstanding(stk_batch *b);
/*
 * Destroys the batch: requests still queued are cancelled, those on the wire are
 * waited for; unreaped completions are dropped. When it returns, no buffer or file
 * named in a request is used any more. NULL is a no-op.
 */
STK_API void stk_batch_destroy(stk_batch *b);

/*
 * Advisory locks, held across every client of the cluster (they live in meta):
 * flock-style whole-file locks and POSIX record locks over byte ranges, as
 * flock(2) and fcntl(2) F_SETLK define them. flock and POSIX locks do not
 * conflict with each other. A lock belongs to (this client, owner): owner 0
 * means the handle f itself; a caller mapping processes or file descriptions
 * onto one client (the FUSE daemon) passes its own ids. Setting over an owner's
 * own locks replaces them, splitting and merging ranges as POSIX says. Locks go
 * when unlocked, when stk_close closes the handle they were taken through with
 * owner 0, when the client disconnects, and when the client dies and its session
 * lease (10 s by default) runs out. They do not survive a restart of meta.
 */
#define STK_LOCK_POSIX 0
#define STK_LOCK_FLOCK 1
#define STK_LOCK_RD 1
#define STK_LOCK_WR 2
#define STK_LOCK_UN 3
#define STK_LOCK_EOF UINT64_MAX

struct stk_lock_range {
	int type; /* STK_LOCK_RD (shared), STK_LOCK_WR (exclusive), STK_LOCK_UN */
	uint64_t start; /* first byte; ignored for STK_LOCK_FLOCK (always the whole file) */
	uint64_t end; /* last byte, inclusive; STK_LOCK_EOF: to the end of file */
	uint32_t pid; /* the holder's pid, reported to stk_lock_test callers (0: unknown) */
};

/*
 * Sets or removes a lock on f's file. kind: STK_LOCK_POSIX or STK_LOCK_FLOCK.
 * wait 0: a conflicting lock of another owner gives -EAGAIN at once; wait 1:
 * retries (polling meta with backoff) until granted, or -EINTR when a signal
 * handler interrupts the wait. No deadlock detection: two owners waiting on each
 * other wait until one is interrupted. Errors: -EAGAIN, -EINTR, -EINVAL (bad
 * kind, type, or start > end), -EBADF (a directory), -ENOSYS (meta too old), -EIO.
 * Safe from any thread.
 */
STK_API int stk_lock(stk_file *f, int kind, const struct stk_lock_range *r, uint64_t owner,
		     int wait);
/*
 * F_GETLK: would r (type RD or WR) be granted to owner now? On return *r is the
 * first conflicting lock (its type, range and holder's pid), or r->type is
 * STK_LOCK_UN when there is none. 0 or the errors of stk_lock.
 */
STK_API int stk_lock_test(stk_file *f, int kind, struct stk_lock_range *r, uint64_t owner);

/*
 * Cluster status: what mgmtd knows of the cluster at one moment, as `stoker status`
 * and `stoker top` show it. Its nodes (role, state, address, host), the storage
 * targets with their capacity and use, the replication chains, and the metadata
 * shards with the namespace each holds. A snapshot takes one call to mgmtd and
 * needs no stk_client: it works while meta or storage nodes are down (they show
 * as offline), which is when an operator asks.
 *
 * Ownership and lifetime: stk_cluster_status_fetch allocates the snapshot. Every
 * pointer an accessor returns (a struct, its strings, a chain's target list)
 * points into it and stays valid until stk_cluster_status_free. The structs are
 * the library's: reach them one index at a time through the accessors, never as
 * arrays, so that later releases may add fields at their end.
 *
 * Threads: a snapshot never changes after the fetch; any number of threads may
 * read one at once, and stk_cluster_status_free must not race with them. Every
 * call here may be made from any thread.
 */
typedef struct stk_cluster_status stk_cluster_status;

/* Bytes of a "HOST:PORT" address with its NUL, as the cluster's nodes have them. */
#define STK_CLUSTER_ADDR_MAX 512 /* a list of up to 8 mgmtd addresses */

/* A node's role; 0: one this library does not know (a newer mgmtd's). */
#define STK_CLUSTER_ROLE_MGMTD 1
#define STK_CLUSTER_ROLE_META 2
#define STK_CLUSTER_ROLE_STORAGE 3

/* A node's state; 0: one this library does not know. */
#define STK_CLUSTER_NODE_ONLINE 1
#define STK_CLUSTER_NODE_OFFLINE 2 /* no heartbeat within mgmtd's timeout */

/* A target's state; 0: one this library does not know. */
#define STK_CLUSTER_TARGET_SERVING 1
#define STK_CLUSTER_TARGET_OFFLINE 2 /* its node is offline or no longer reports it */
#define STK_CLUSTER_TARGET_FULL 3 /* out of space */
#define STK_CLUSTER_TARGET_SYNCING 4 /* back after its chain went on: copying what it missed */
/* it left its chain (a move, a replacement): its node removes the chunks it holds */
#define STK_CLUSTER_TARGET_WIPING 5

/* One meta or storage node that registered with mgmtd. */
struct stk_cluster_node {
	uint32_t id;
	int role; /* STK_CLUSTER_ROLE_* */
	int state; /* STK_CLUSTER_NODE_* */
	const char *addr; /* "HOST:PORT" it serves RPC on */
	uint64_t last_seen_ms; /* milliseconds since its last heartbeat reached mgmtd */
	const char *host_id; /* the machine it runs on (docs/architecture.md); "" until known */
	/*
	 * 1: a meta node mgmtd refused because its store is not the namespace of
	 * its shard, or the cluster has no such shard; it is registered but serves
	 * nothing. 0 otherwise.
	 */
	int refused;
	const char *ns; /* a meta node's store identity, 32 hex digits; "" for storage */
	/*
	 * A storage node's share of the chains, from mgmtd's rebalancer (all 0 for a
	 * mgmtd without one, and for meta nodes): draining 1 while `stoker admin
	 * drain-node` moves its memberships away; members, its targets that are a
	 * chain's member; targets, its targets not offline. mgmtd spreads members so
	 * that members / targets is even over the nodes (docs/architecture.md).
	 */
	int draining;
	uint32_t members;
	uint32_t targets;
	/*
	 * A meta node's store: the number of the last metadata change it holds and
	 * the epoch of that change, as its last heartbeat reported them
	 * (docs/meta-replication.md); 0 for storage and before the first report.
	 */
	uint64_t meta_seq;
	uint64_t meta_epoch;
	/*
	 * A meta node's metadata shard (docs/meta-shards.md), 1 to the cluster's
	 * count; 0 for storage.
	 */
	uint32_t shard;
};

/* One storage target (a folder of chunk files on a storage node). */
struct stk_cluster_target {
	uint32_t id;
	uint32_t node_id; /* the storage node serving it */
	int state; /* STK_CLUSTER_TARGET_* */
	/*
	 * The figures of the file system holding it, at its node's last heartbeat:
	 * bytes in all, used, and still usable by an unprivileged writer. Targets
	 * that share a file system each report all of it (see stk_cluster_status_space).
	 */
	uint64_t capacity;
	uint64_t used;
	uint64_t avail;
	uint64_t chunks; /* chunk files it holds */
	const char *path; /* its folder on its node */
	uint64_t dev; /* its file system's id, equal for targets sharing one; 0 not known yet */
	/*
	 * While it is STK_CLUSTER_TARGET_SYNCING, how far its copy from its
	 * predecessor is, as its node last reported it (each second): sync_permille
	 * 0..1000 (an estimate), chunks compared, chunks and bytes copied; a copy that
	 * starts over starts from 0. All 0 in any other state, and until the node's
	 * first report of the copy.
	 */
	uint32_t sync_permille;
	uint64_t sync_checked;
	uint64_t sync_copied;
	uint64_t sync_bytes;
};

/* One replication chain: the targets that hold the same chunks, head first. */
struct stk_cluster_chain {
	uint32_t id; /* chains are numbered from 1 */
	uint32_t version; /* bumped whenever its target list changes */
	uint32_t ntargets;
	const uint32_t *targets; /* ntargets target ids, the head first */
};

/*
 * A chain membership moving (a rebalance, or a drain): to_target joined chain
 * chain_id last and copies its chunks (its target's sync_permille says how far);
 * once it serves, from_target leaves the chain. drain: 1 if a drain started it.
 */
struct stk_cluster_move {
	uint32_t chain_id;
	uint32_t from_target;
	uint32_t to_target;
	int drain;
};

/* The rebalancer's figures (all 0, known 0, from a mgmtd without one). */
struct stk_cluster_rebalance {
	int known;
	uint32_t max_moves; /* mgmtd's --rebalance-moves: 0 when balancing is off */
	uint64_t started, finished, abandoned; /* moves, since this mgmtd leads */
};

/* One metadata shard and the meta node serving it. */
struct stk_cluster_shard {
	uint32_t id;
	uint32_t node_id; /* its meta node (the leader when replicated); 0: none may serve it now */
	const char *ns; /* the namespace it holds, 32 hex digits; "" not known yet */
	/*
	 * Replication (docs/meta-replication.md): replicas, the copies mgmtd keeps (0
	 * or 1: the leader's alone); the nfollowers meta nodes (ids in followers, valid
	 * as long as the status) that hold every change the leader acknowledges; epoch,
	 * taken anew whenever the leader or the followers change.
	 */
	uint32_t replicas;
	uint32_t nfollowers;
	const uint32_t *followers;
	uint64_t epoch;
};

/* Space summed over every target, each file system (dev) counted once, as df does. */
struct stk_cluster_space {
	uint64_t capacity; /* the largest any of a file system's targets reported */
	uint64_t used; /* likewise */
	uint64_t avail; /* the smallest any of its targets reported */
	uint32_t devices; /* file systems counted; a target of unknown dev counts as one */
};

/*
 * The "HOST:PORT" of the cluster's mgmtd into addr (len bytes; STK_CLUSTER_ADDR_MAX
 * is enough): `cluster` as stk_connect takes it ("stk://HOST:PORT", with or
 * without a path after it, or "HOST:PORT"), or NULL for the default cluster
 * ($STOKER_CLUSTER, else the one `stoker up` recorded on this machine). Makes no
 * call to the cluster. Errors: -EINVAL (malformed, or longer than len - 1),
 * -ENOENT (NULL and no default cluster).
 */
STK_API int stk_cluster_resolve(const char *cluster, char *addr, size_t len);

/*
 * Gives up on an offline storage node (`stoker admin remove-node`): mgmtd replaces
 * each of its targets in its chain now, by a free target of a failure domain the
 * chain lacks, which then copies the chain's chunks (as after mgmtd's
 * --replace-after). *replaced: how many were; *kept: how many are still in a chain
 * (no such free target, or no working member left to copy from). Errors: -ENOENT
 * (no storage node of that id), -EBUSY (it is online: stop it first), as
 * stk_connect for reaching the cluster. cluster is as stk_cluster_resolve takes it
 * (NULL: the default) and read during the call only; *replaced and *kept are set
 * only when it returns 0.
 */
STK_API int stk_cluster_remove_node(const char *cluster, uint32_t node_id, uint32_t *replaced,
				    uint32_t *kept);

/*
 * Drains a storage node (drain 1, `stoker admin drain-node`): mgmtd moves each of
 * its chain memberships to a free target of another node, in the background and
 * a few at a time, each chain keeping all its copies throughout (the new member
 * copies the chain's chunks before the old one leaves); none of its targets joins
 * a chain from then on. drain 0 (`undrain-node`) cancels it: moves in flight are
 * abandoned, memberships already moved stay moved. *members: how many of its
 * targets are still a chain's member (stk_cluster_status shows the count fall;
 * at 0 the node may be removed, stk_cluster_remove_node, and stopped). Errors:
 * -ENOENT (no storage node of that id), as stk_connect for reaching the cluster.
 * cluster is as stk_cluster_resolve takes it (NULL: the default) and read during
 * the call only; *members is set only when it returns 0.
 */
STK_API int stk_cluster_drain_node(const char *cluster, uint32_t node_id, int drain,
				   uint32_t *members);

/*
 * `stoker admin accept-loss CHAIN`: a chain whose every copy was lost, and whose
 * newest copy will not come back (the chain waits for it, serving nothing), serves
 * again from the first of its members that is back, giving up the changes only
 * the others held. Those others leave the chain (when they come back their chunks
 * are removed, never served) and free targets of other failure domains join it,
 * copying the kept member's chunks. *kept is the target kept, *dropped the members
 * that left, *added the targets that joined. Errors: -ENOENT (no such chain),
 * -EINVAL (a chain of one target), -EBUSY (a member works: nothing is lost),
 * -EAGAIN (no member is back yet: start one of its nodes first), as stk_connect
 * for reaching the cluster. cluster is as stk_cluster_resolve takes it (NULL: the
 * default) and read during the call only; the outputs are set only on success.
 */
STK_API int stk_cluster_accept_loss(const char *cluster, uint32_t chain_id, uint32_t *kept,
				    uint32_t *dropped, uint32_t *added);

/*
 * Client identities (`stoker admin client`, docs/security.md): keys that confine
 * the mount, libstoker, Python or a gateway using them to a subtree, read-only,
 * or with root (or every user) squashed to an anonymous uid and gid, enforced by
 * meta and storage. A client key is HMAC-SHA256(cluster key, its policy), so only
 * a holder of the cluster key issues one, and a key file whose policy was edited
 * proves nothing.
 */
#define STK_IDENT_READ_ONLY 1u	 /* every change refused with EROFS */
#define STK_IDENT_SQUASH_ROOT 2u /* uid 0 acts as anon_uid (gid 0 as anon_gid) */
#define STK_IDENT_SQUASH_ALL 4u	 /* every uid and gid act as anon_uid, anon_gid */
#define STK_IDENT_NAME_MAX 63
#define STK_IDENT_SUBTREE_MAX 1023

struct stk_client_ident {
	char name[STK_IDENT_NAME_MAX + 1];	 /* [A-Za-z0-9._-], 1 to 63 bytes */
	uint64_t gen;				 /* mgmtd's generation for this issue of the name */
	uint32_t flags;				 /* STK_IDENT_* */
	uint32_t anon_uid, anon_gid;		 /* what squashed users act as */
	char subtree[STK_IDENT_SUBTREE_MAX + 1]; /* "/" or "/a/b": the client's root */
	int removed;				 /* revoked (`client rm`) */
};

/*
 * Issues client identity *c (name, flags, anon ids, subtree; gen is set) and
 * writes its key file to key_out (mode 0600; never over an existing file). The
 * calling process must hold the cluster key (not a client key). Errors: -EINVAL
 * (a malformed policy), -EEXIST (key_out exists, or the name is held: remove it
 * first), -EKEYREJECTED (this process holds no cluster key), -EPERM (it holds a
 * client key), as stk_connect for reaching the cluster, or the key file's -errno
 * (the identity is then removed again). cluster as stk_cluster_resolve takes it.
 */
STK_API int stk_cluster_client_add(const char *cluster, struct stk_client_ident *c,
				   const char *key_out);
/*
 * The client identity c's process connects as (a client key file found as the
 * cluster key is: stk_client_opts.key_file, $STOKER_KEY_FILE): 1 and *out (may
 * be NULL; gen and policy as in the key file, removed 0), or 0 when it holds the
 * cluster key or none. The mount uses it to mount a read-only key's tree
 * read-only. Any thread.
 */
STK_API int stk_client_identity(stk_client *c, struct stk_client_ident *out);
/*
 * Revokes the identity held under name: every daemon refuses its key at
 * connection set-up once it learned the change (a second or two). *gen: its
 * generation. Errors: -ENOENT (no such client), -EPERM, as stk_connect.
 */
STK_API int stk_cluster_client_rm(const char *cluster, const char *name, uint64_t *gen);
/*
 * Every client identity mgmtd knows, removed ones too, in a new array *out of *n
 * (free it with free(); NULL when none). Errors: -EPERM, -ENOMEM, as stk_connect.
 */
STK_API int stk_cluster_client_list(const char *cluster, struct stk_client_ident **out,
				    uint32_t *n);

/*
 * QoS limits per tenant (`stoker qos`, docs/qos.md). A tenant is a client key's
 * name (struct stk_client_ident); its limits hold at each storage node, for the
 * requests of every connection made with a key of that name: bytes read and
 * written per second and requests per second, 0 for no limit. Connections with
 * the cluster key or none are never limited.
 */
#define STK_QOS_TENANTS_MAX 64

/*
 * Priority classes, highest first: training-read, default, checkpoint. A class's
 * own limits (tenant "@default" or "@checkpoint") hold at a node only while it
 * serves requests of a higher class.
 */
#define STK_QOS_CLASS_DEFAULT 0
#define STK_QOS_CLASS_TRAINING_READ 1
#define STK_QOS_CLASS_CHECKPOINT 2
#define STK_QOS_CLASS_NONE 255 /* stk_qos_limits.max_class: no cap */

struct stk_qos_limits {
	/* a client key's name ([A-Za-z0-9._-], 1 to 63 bytes), or "@default" or
	 * "@checkpoint": the limits of that class, shared by every tenant */
	char tenant[STK_IDENT_NAME_MAX + 1];
	uint64_t read_bw;  /* bytes per second read; 0: no limit */
	uint64_t write_bw; /* bytes per second written; 0: no limit */
	uint32_t iops;	   /* requests per second; 0: no limit */
	/* the highest class the tenant's requests count as (a lower one marked stays
	 * lower); STK_QOS_CLASS_NONE: as marked. NONE for a class's own record. */
	uint8_t max_class;
};

/* The class's name ("checkpoint"), or NULL for another number. */
STK_API const char *stk_qos_class_name(int qos_class);
/* The class named name: STK_QOS_CLASS_*, or -EINVAL. */
STK_API int stk_qos_class_parse(const char *name);

/*
 * Sets (or replaces) l->tenant's limits; storage nodes apply them to live
 * connections within a second or two. Errors: -EINVAL (a malformed tenant name),
 * -ENOSPC (STK_QOS_TENANTS_MAX tenants have limits), -EPERM (this process holds
 * a client key), as stk_connect for reaching the cluster.
 */
STK_API int stk_cluster_qos_set(const char *cluster, const struct stk_qos_limits *l);
/* Drops tenant's limits. Errors: -ENOENT (none set), -EPERM, as stk_connect. */
STK_API int stk_cluster_qos_rm(const char *cluster, const char *tenant);
/*
 * Every tenant's limits, in a new array *out of *n (free it with free(); NULL when
 * none). Errors: -EPERM, -ENOMEM, -EBADMSG, as stk_connect.
 */
STK_API int stk_cluster_qos_list(const char *cluster, struct stk_qos_limits **out, uint32_t *n);

/*
 * Times `count` (1 to 64) round trips to the Stoker daemon at addr ("HOST:PORT",
 * read during the call only), for `stoker doctor`: after one call that opens and
 * warms a connection of its own (the key handshake included, with the key this
 * process holds), each is a MGMT_LEADER request, which mgmtd answers and any
 * other daemon refuses, either way a full trip through its RPC loop; each costs
 * other daemons one count of stoker_rpc_errors_total. seconds[i] is the i-th.
 * timeout_ms bounds the connect. Errors: -EINVAL (count, addr), as stk_connect
 * for reaching the daemon. Any thread.
 */
STK_API int stk_cluster_ping(const char *addr, unsigned timeout_ms, unsigned count,
			     double *seconds);

/*
 * Fetches the status of the cluster whose mgmtd `cluster` names (as
 * stk_cluster_resolve takes it; NULL: the default cluster): one connection, one
 * request, no retry, so that a cluster that cannot be reached says so at once: a
 * connect gives up after 2 s, a reply after $STOKER_RPC_TIMEOUT_MS (60 s by
 * default). Blocks the calling thread meanwhile. On success *out is a snapshot
 * to release with stk_cluster_status_free; on failure *out is NULL.
 * Errors: -EINVAL (malformed address), -ENOENT (no default cluster),
 * -ECONNREFUSED, -ETIMEDOUT, -EHOSTUNREACH (mgmtd cannot be reached),
 * -ECONNRESET (the connection broke: mgmtd went away, or what listens there is
 * not a Stoker daemon), -ENOSYS (a Stoker daemon that is not mgmtd answered: a
 * meta or storage node's address), -EBADMSG (the reply is not a routing table),
 * -ENOMEM.
 */
STK_API int stk_cluster_status_fetch(const char *cluster, stk_cluster_status **out);
/* Frees s and everything its accessors returned. NULL is a no-op. */
STK_API void stk_cluster_status_free(stk_cluster_status *s);
/* The "HOST:PORT" of the mgmtd that answered (the leader, in cluster mode). */
STK_API const char *stk_cluster_status_addr(const stk_cluster_status *s);

#define STK_CLUSTER_MGMTD_LEADER 1   /* it leads (an embedded mgmtd always does) */
#define STK_CLUSTER_MGMTD_FOLLOWER 2 /* it runs and follows the leader */
#define STK_CLUSTER_MGMTD_DOWN 3     /* it did not answer */
/*
 * The i-th mgmtd of the cluster's address list (from 0) as it answered when the
 * snapshot was taken: *addr (valid until stk_cluster_status_free) and *state, one
 * of STK_CLUSTER_MGMTD_*. 0, or -ENOENT past the last.
 */
STK_API int stk_cluster_status_mgmtd(const stk_cluster_status *s, unsigned i, const char **addr,
				     int *state);
/* The routing table's version: it grows with every change mgmtd makes to it. */
STK_API uint64_t stk_cluster_status_version(const stk_cluster_status *s);
/*
 * The i-th node, target, chain or shard (from 0, in the order mgmtd lists them), or
 * NULL when i is past the last, so `for (i = 0; (n = ...(s, i)); i++)` visits all.
 */
STK_API const struct stk_cluster_node *stk_cluster_status_node(const stk_cluster_status *s,
							       uint32_t i);
STK_API const struct stk_cluster_target *stk_cluster_status_target(const stk_cluster_status *s,
								   uint32_t i);
STK_API const struct stk_cluster_chain *stk_cluster_status_chain(const stk_cluster_status *s,
								 uint32_t i);
STK_API const struct stk_cluster_shard *stk_cluster_status_shard(const stk_cluster_status *s,
								 uint32_t i);
/* The cluster's space over all targets, whatever their state (never NULL). */
STK_API const struct stk_cluster_space *stk_cluster_status_space(const stk_cluster_status *s);
/* The i-th chain membership moving (from 0), or NULL past the last. */
STK_API const struct stk_cluster_move *stk_cluster_status_move(const stk_cluster_status *s,
							       uint32_t i);
/* The rebalancer's figures; never NULL. */
STK_API const struct stk_cluster_rebalance *
stk_cluster_status_rebalance(const stk_cluster_status *s);

#ifdef __cplusplus
}
#endif
#endif
