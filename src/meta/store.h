/*
 * The namespace store: inodes, directory entries and symlink targets of one meta
 * shard, kept in an LMDB environment.
 *
 * Every operation below is one LMDB transaction (a write transaction for those
 * that change something), so each is atomic and, once it returns 0, visible to
 * every later call from any thread. The environment is opened with MDB_NOSYNC:
 * a commit reaches the page cache, which survives kill -9 of the daemon but not a
 * power cut; stk_meta_store_sync() flushes to stable storage, and the daemon calls
 * it on META_SYNC and once a second. The store knows nothing of the network, the
 * routing table or the agent, so its unit test drives it directly.
 *
 * Records (all keys big-endian so that LMDB's byte order is numeric order):
 *   inodes    u64 ino -> u8 format (3), attr (codec.h form, no qid), u64 parent
 *             (the parent of a directory, so that rename can refuse to move a
 *             directory into its own subtree; for other inodes the folder they
 *             were made in or last renamed into, for client confinement; filled
 *             once, on opening, in stores made before it), u16 n and n
 *             ranges of written chunks (u32 first, u32 end) for st_blocks;
 *             format 1 (older stores) ends at the parent and has no rdev
 *   dentries  u64 parent, u64 hash, name bytes -> u64 ino, u32 type (S_IFMT bits)
 *   links     u64 ino -> symlink target bytes
 *   xattrs    u64 ino, name bytes -> value bytes (extended attributes)
 *   quotas    u64 ino of a quota root -> its limits and usage (see "Quotas")
 *   purge     u64 ino of a freed regular file -> its layout and size, until its
 *             chunks are gone from storage (see "Purges")
 *   sys       "next_ino" -> u64, the next inode number to hand out (every
 *             number below it was given to an inode or reserved by a client);
 *             "orphan" + u64 ino -> empty, for each orphan (see below);
 *             "ns_id" -> u64 hi, u64 lo, the namespace's identity (msg.h),
 *             made when the store is created or first opened without one;
 *             "file_parents" -> empty, once every file records its folder
 *
 * Readdir order is dentry key order, that is by name hash within a directory.
 * The cookie that follows an entry is its hash + 1, and a listing resumes at the
 * first entry whose hash is at least the cookie, so cookies stay valid while
 * entries are added and removed. Known limit: two names of one directory with the
 * same 64-bit hash share a cookie, and a listing that stops between them skips
 * the second. Hashes are capped at 2^64 - 2 so that a cookie is never 0.
 *
 * Permissions follow POSIX from the caller's struct stk_cred; uid 0 bypasses the
 * rwx checks (but not the type checks). Search permission is needed on each
 * directory an operation looks through, write and search on a directory whose
 * entries change; a sticky directory lets only the owner of the entry or of the
 * directory (or root) remove or rename it. See each function for the rest.
 *
 * Errors: every function returns 0 or -errno. Besides those listed per function:
 * -EIO for a corrupt record or an LMDB failure (logged), -ENOSPC when the LMDB map
 * is full, -EAGAIN when every reader slot is taken, -ENOMEM.
 *
 * Threads: a store may be used from any number of threads at once; write
 * transactions are serialised by LMDB, readers never wait.
 */
#ifndef STK_META_STORE_H
#define STK_META_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "../proto/msg.h"

struct stk_meta_store;

struct stk_meta_store_opts {
	size_t size;	   /* sizeof(struct stk_meta_store_opts) */
	const char *dir;   /* the LMDB environment's folder, created if missing */
	uint64_t map_size; /* LMDB map size, 0 = 64 GiB */
	/*
	 * The metadata shard the store serves (docs/meta-shards.md; 0: 1). A new store
	 * of shard k hands out inode numbers from (k - 1) << STK_INO_SHARD_SHIFT; an
	 * existing store made for another shard is refused (-EXDEV).
	 */
	unsigned shard;
};

/*
 * Opens (creating on first use) the store in opts->dir. A new store gets the root
 * directory, inode STK_ROOT_INO, mode 0755, owned by the effective uid and gid of
 * the calling process, and a random namespace identity (as does an older store
 * that has none). 0, -EINVAL, or -errno from creating the folder or opening
 * the environment (-EBUSY / -EAGAIN when another process holds it incompatibly).
 */
int stk_meta_store_open(const struct stk_meta_store_opts *opts, struct stk_meta_store **out);
/* The metadata shard the store serves (1..STK_MAX_SHARDS); any thread. */
unsigned stk_meta_store_shard(const struct stk_meta_store *st);
/*
 * The namespace's identity (never zero, but while a follower applies a copy of
 * its leader's store): what the meta node registers with, so that mgmtd gives it
 * only the shard whose data this store holds. Any thread.
 */
void stk_meta_store_ns_id(const struct stk_meta_store *st, struct stk_ns_id *out);
/* Closes the store. Every other call on it must have returned. Does not sync. */
void stk_meta_store_close(struct stk_meta_store *st);
/* Everything committed so far is on stable storage when this returns. 0 or -EIO. */
int stk_meta_store_sync(struct stk_meta_store *st);

/*
 * Names in every call below are NUL-terminated: 1 to STK_NAME_MAX bytes, no '/',
 * neither "." nor ".." (-EINVAL, -ENAMETOOLONG). An inode or directory that does
 * not exist is -ENOENT; a parent that is not a directory is -ENOTDIR; a missing
 * permission is -EACCES (rwx bits) or -EPERM (ownership rules).
 */

/*
 * Attributes of `name` in directory `parent` (search permission on parent). Here
 * only, "." is the directory itself and ".." its parent (the root's is itself).
 */
int stk_meta_store_lookup(struct stk_meta_store *st, const struct stk_cred *cred, uint64_t parent,
			  const char *name, struct stk_attr *out);
/*
 * The rwx check of cred against attributes a (of an inode of another shard, say),
 * neither kept: 0 or -EACCES; mask is R_OK, W_OK and X_OK (unistd.h) or'ed; root
 * passes. Reads no store.
 */
int stk_meta_store_may(const struct stk_cred *cred, const struct stk_attr *a, unsigned mask);
/* Attributes of an inode. No permission is needed (the caller found it by lookup). */
int stk_meta_store_getattr(struct stk_meta_store *st, const struct stk_cred *cred, uint64_t ino,
			   struct stk_attr *out);
/*
 * Attributes of n inodes, as of one moment (one read transaction), into the
 * caller's arrays out and rcs of n each: rcs[i] is 0 with out[i] filled, or -ENOENT
 * (-EIO for a corrupt record) for that inode alone. Returns 0, or the -errno of
 * the transaction when none could be read.
 */
int stk_meta_store_getattrs(struct stk_meta_store *st, const struct stk_cred *cred,
			    const uint64_t *inos, uint32_t n, struct stk_attr *out, int *rcs);

/* What stk_meta_store_setattr changes: the fields named in `valid` (STK_SETATTR_*). */
struct stk_meta_sattr {
	uint32_t valid;
	uint32_t mode; /* permission bits (07777); the type bits are ignored */
	uint32_t uid;
	uint32_t gid;
	uint64_t size;
	int64_t atime_sec;
	uint32_t atime_nsec;
	int64_t mtime_sec;
	uint32_t mtime_nsec;
};

/*
 * Changes attributes and sets ctime; *out is the result. Rules:
 * - mode: the owner or root (-EPERM); a non-root caller outside the file's group
 *   loses S_ISGID.
 * - uid: root only (-EPERM), except that the owner may "change" it to itself.
 * - gid: root, or the owner to a group it is in (-EPERM).
 * - a change of uid or gid clears S_ISUID, and S_ISGID when group-executable, of
 *   a non-directory (as Linux's chown does).
 * - size: regular files only (-EISDIR for a directory, -EINVAL otherwise), write
 *   permission (-EACCES); a size change also sets mtime unless one is given.
 * - explicit atime / mtime: the owner or root (-EPERM); *_NOW: also anyone with
 *   write permission (-EACCES). Nanoseconds of 1e9 or more: -EINVAL.
 * Unknown bits in valid: -EINVAL. Nothing is changed unless every check passes.
 */
int stk_meta_store_setattr(struct stk_meta_store *st, const struct stk_cred *cred, uint64_t ino,
			   const struct stk_meta_sattr *sa, struct stk_attr *out);

/*
 * Records a read of each of the n inodes as STK_SETATTR_ATIME_READ does (atime to
 * now where relatime says it is due), all in one transaction: what META_CLOSES
 * carries. inos is only read. An inode that is gone is skipped. Any other error
 * (-ENOSPC: the store is full, -EIO) changes nothing.
 */
int stk_meta_store_record_reads(struct stk_meta_store *st, const uint64_t *inos, size_t n);

/*
 * Where a new file's data goes when the request names no layout: chunks of
 * chunk_size over `stripe` chains among the `nchains` chains of the current
 * routing table. nchains 0 means no storage target exists yet. down: the chains
 * (bit id-1, ids up to STK_PLACEMENT_DOWN_MAX) whose targets do not serve now; a new
 * file's layout avoids them where it can (fewer chains in its stripe, another
 * start and seed), so that files made while a node is away can be written.
 */
#define STK_PLACEMENT_DOWN_MAX 4096u
struct stk_meta_placement {
	uint32_t chunk_size;
	uint32_t stripe;
	uint32_t nchains;
	uint32_t ndown; /* bits set in down */
	uint64_t down[STK_PLACEMENT_DOWN_MAX / 64];
};

/*
 * Creates regular file `name` in `parent` with permission bits mode & 07777,
 * owned by the caller (the group of a setgid parent). layout is the requested
 * layout: all zero for one made from *pl, otherwise it must pass
 * stk_layout_check() and name no more than pl->nchains chains (-EINVAL). A zero
 * layout with pl->nchains == 0 is -ENOSPC.
 * If the name exists: with STK_CREATE_EXCL, -EEXIST; without it, *out is the
 * existing inode and *created 0, or -EISDIR if it is a directory, or -EREMOTE
 * with only out->ino and the type filled if it is a file of another shard (renamed
 * here across shards). Only search permission on parent is needed to find an
 * existing file; write too to create.
 */
int stk_meta_store_create(struct stk_meta_store *st, const struct stk_cred *cred, uint64_t parent,
			  const char *name, uint32_t mode, uint32_t flags,
			  const struct stk_layout *layout, const struct stk_meta_placement *pl,
			  struct stk_attr *out, int *created);

/*
 * What a client that answered a create itself (a delegated folder's holder,
 * META_NAMES) already told its callers about the file: its number and its times.
 */
struct stk_meta_create_as {
	uint64_t ino;	    /* 0: the next number, as stk_meta_store_create */
	int64_t time_sec;   /* atime, mtime and ctime of the file; 0 and 0: now */
	uint32_t time_nsec; /* below 1e9 (-EINVAL) */
	/*
	 * The session the create comes from (0: none): when it holds an inode
	 * allowance in the new file's quota (stk_meta_store_quota_allow), the create
	 * spends one and is not checked against the quota's inode limit again.
	 */
	uint64_t session;
};

/*
 * stk_meta_store_create, but a new file (not an existing one found without
 * STK_CREATE_EXCL) takes its number and times from *as (NULL: exactly
 * stk_meta_store_create). as->ino must be a number stk_meta_store_reserve_inos
 * handed out, else -EINVAL, that no inode has, else -EEXIST. With a time given,
 * the parent's mtime and ctime become that time too, unless they are later
 * already: a client's clock never moves a folder's times backwards. Every other
 * rule (permissions, EXCL, the group of a setgid parent, mode bits, the layout,
 * link counts) is stk_meta_store_create's.
 */
int stk_meta_store_create_as(struct stk_meta_store *st, const struct stk_cred *cred,
			     uint64_t parent, const char *name, uint32_t mode, uint32_t flags,
			     const struct stk_layout *layout, const struct stk_meta_placement *pl,
			     const struct stk_meta_create_as *as, struct stk_attr *out,
			     int *created);

/*
 * Reserves count (at least 1, else -EINVAL) inode numbers: *first is the first of
 * [first, first + count), which no create gives out any more (only
 * stk_meta_store_create_as, to a caller that names one). One write transaction;
 * -ENOSPC when the numbers run out.
 */
int stk_meta_store_reserve_inos(struct stk_meta_store *st, uint32_t count, uint64_t *first);
/*
 * Creates directory `name` with mode & 01777 (plus S_ISGID and the group of a
 * setgid parent). -EEXIST if the name exists; -EMLINK if parent has too many
 * subdirectories.
 */
int stk_meta_store_mkdir(struct stk_meta_store *st, const struct stk_cred *cred, uint64_t parent,
			 const char *name, uint32_t mode, struct stk_attr *out);
/*
 * Removes a non-directory name (-EISDIR for a directory). *out is the inode after:
 * when out->nlink is 0 its record is gone and the caller removes a regular
 * file's chunks. Sticky parent: only the owner of the file or of parent, or root
 * (-EPERM).
 */
int stk_meta_store_unlink(struct stk_meta_store *st, const struct stk_cred *cred, uint64_t parent,
			  const char *name, struct stk_attr *out);
/*
 * "Whatever inode the name holds", for the _ino calls below (unlink, rmdir,
 * rename): they act only if the name holds the inode given, which meta looked up
 * and recalled from other clients before the call. A name that changed in between
 * is checked in the same transaction, after the permissions that find it.
 */
#define STK_META_ANY_INO UINT64_MAX
/*
 * stk_meta_store_unlink, but only if `name` holds inode ino (STK_META_ANY_INO:
 * any): a name that holds another inode is -ENOENT and nothing changes.
 */
int stk_meta_store_unlink_ino(struct stk_meta_store *st, const struct stk_cred *cred,
			      uint64_t parent, const char *name, uint64_t ino,
			      struct stk_attr *out);
/* Removes an empty directory: -ENOTDIR, -ENOTEMPTY, sticky rule as unlink. */
int stk_meta_store_rmdir(struct stk_meta_store *st, const struct stk_cred *cred, uint64_t parent,
			 const char *name);
/*
 * stk_meta_store_rmdir, but only if `name` holds inode ino (0: the name must be
 * missing; STK_META_ANY_INO: any): else -EAGAIN (meta looks it up and recalls it
 * again) and nothing changes.
 */
int stk_meta_store_rmdir_ino(struct stk_meta_store *st, const struct stk_cred *cred,
			     uint64_t parent, const char *name, uint64_t ino);
/*
 * Atomically renames src_parent/src_name to dst_parent/dst_name. flags:
 * STK_RENAME_NOREPLACE (-EEXIST if the target exists) or STK_RENAME_EXCHANGE (swap
 * two existing names, -ENOENT if the target is missing); both, or others: -EINVAL.
 * Replacing an existing target follows POSIX: a non-directory over a directory
 * -EISDIR, a directory over a non-directory -ENOTDIR, a directory over a
 * non-empty one -ENOTEMPTY. Moving a directory into its own subtree: -EINVAL.
 * Two names of the same inode: nothing happens, 0. Needs write and search on both
 * parents, write on a directory that changes parent (its ".." changes), and the
 * sticky rule on both names.
 * When a non-directory target was replaced, *replaced is 1 and *out its inode
 * after losing the name (nlink 0: the caller removes a regular file's chunks);
 * otherwise *replaced is 0 and *out zeroed.
 */
int stk_meta_store_rename(struct stk_meta_store *st, const struct stk_cred *cred,
			  uint64_t src_parent, const char *src_name, uint64_t dst_parent,
			  const char *dst_name, uint32_t flags, int *replaced,
			  struct stk_attr *out);
/*
 * stk_meta_store_rename, but only if src_name holds inode src_ino and dst_name
 * inode dst_ino (0: missing; STK_META_ANY_INO: any, as plain rename): else -EAGAIN
 * and nothing changes (as stk_meta_store_rmdir_ino).
 */
int stk_meta_store_rename_ino(struct stk_meta_store *st, const struct stk_cred *cred,
			      uint64_t src_parent, const char *src_name, uint64_t dst_parent,
			      const char *dst_name, uint32_t flags, uint64_t src_ino,
			      uint64_t dst_ino, int *replaced, struct stk_attr *out);
/*
 * Adds name `name` in `parent` for inode ino: -EPERM for a directory, -EEXIST,
 * -EMLINK at 2^32 - 1 links. *out is the inode after (nlink incremented).
 */
int stk_meta_store_link(struct stk_meta_store *st, const struct stk_cred *cred, uint64_t ino,
			uint64_t parent, const char *name, struct stk_attr *out);
/*
 * Creates special file `name`: mode's type is S_IFIFO, S_IFSOCK, S_IFCHR or S_IFBLK
 * (else -EINVAL), its permission bits mode & 07777 (the setgid rules of create);
 * rdev is kept for a device (0 for the others). Device nodes need uid 0 (-EPERM),
 * as Linux's CAP_MKNOD. -EEXIST if the name exists. Size 0, no layout; such an
 * inode has no data (extend and a size change: -EINVAL).
 */
int stk_meta_store_mknod(struct stk_meta_store *st, const struct stk_cred *cred, uint64_t parent,
			 const char *name, uint32_t mode, uint64_t rdev, struct stk_attr *out);
/*
 * Creates symlink `name` -> target (1 to STK_PATH_MAX bytes; empty: -ENOENT,
 * longer: -ENAMETOOLONG). Mode 0777, size the target's length.
 */
int stk_meta_store_symlink(struct stk_meta_store *st, const struct stk_cred *cred, uint64_t parent,
			   const char *name, const char *target, struct stk_attr *out);
/*
 * Copies the target of symlink ino, NUL-terminated, into buf (len bytes; at least
 * STK_PATH_MAX + 1 always suffices; -ERANGE if it does not fit). -EINVAL if ino
 * is not a symlink.
 */
int stk_meta_store_readlink(struct stk_meta_store *st, const struct stk_cred *cred, uint64_t ino,
			    char *buf, size_t len);

/*
 * One directory entry handed to a readdir callback: ino, type bits in mode, the
 * cookie that resumes after it, and the name (valid during the call only).
 * Returns 0 to go on, 1 to stop before this entry (it is not consumed: the
 * listing is not at its end), or -errno to fail the readdir with that error.
 */
typedef int (*stk_meta_dirent_fn)(void *ctx, const struct stk_msg_dirent *d);

/*
 * Lists directory ino from `cookie` (0 = the start), calling fn for at most
 * max_entries entries (0 = no limit but the callback's). *eof is 1 when the
 * listing reached the directory's end. Needs read permission on ino. "." and ".."
 * are not stored and not listed.
 */
int stk_meta_store_readdir(struct stk_meta_store *st, const struct stk_cred *cred, uint64_t ino,
			   uint64_t cookie, uint32_t max_entries, stk_meta_dirent_fn fn, void *ctx,
			   int *eof);
/* The number of inodes in the store. */
int stk_meta_store_statfs(struct stk_meta_store *st, uint64_t *files);
/*
 * What a writer reports after writing: size = max(size, new_size), mtime set to
 * the given time (now if both fields are 0), ctime to now. Regular files only
 * (-EISDIR, -EINVAL). No permission check: write access was checked when the
 * writer opened the file, and a file may be written through a descriptor after
 * its mode stops allowing it.
 */
int stk_meta_store_extend(struct stk_meta_store *st, const struct stk_cred *cred, uint64_t ino,
			  uint64_t new_size, int64_t mtime_sec, uint32_t mtime_nsec,
			  struct stk_attr *out);

/*
 * Blocks: a regular file keeps the ranges of its chunks that hold data (written
 * and not punched or cut off since), and its st_blocks is the bytes of those
 * chunks below its size, in 512-byte blocks rounded up: a chunk that holds any
 * byte counts whole up to the file's end (a file written from start to end gives
 * size/512 exactly; a hole of whole chunks counts nothing). At most 32 ranges are
 * kept; beyond, the two closest merge and the hole between them counts. A
 * truncate forgets the chunks past the new end. A store written before this
 * (inode format 1) counts every chunk below the size.
 */
struct stk_meta_extend {
	uint64_t size;	   /* size = max(size, this) */
	int64_t mtime_sec; /* 0 and 0: now */
	uint32_t mtime_nsec;
	uint32_t alloc_first, alloc_end; /* chunks [first, end) now hold data */
	uint32_t punch_first, punch_end; /* then: chunks [first, end) were removed */
	/*
	 * The writer's session (0: none) and the bytes of its byte allowance in the
	 * file's quota (stk_meta_store_quota_allow_bytes) this report spends: once
	 * the size is committed they move from set aside to used.
	 */
	uint64_t allow_session, allow_spent;
};
/*
 * stk_meta_store_extend with the chunks written and punched (first == end: none);
 * stk_meta_store_extend itself counts every chunk as written (alloc 0 to 2^32-1).
 */
int stk_meta_store_extend_alloc(struct stk_meta_store *st, const struct stk_cred *cred,
				uint64_t ino, const struct stk_meta_extend *x,
				struct stk_attr *out);

/*
 * Extended attributes, kept per inode (records "xattrs": be64 ino + name -> value)
 * and removed with the inode. `name` is the full name with its namespace prefix,
 * 1 to STK_NAME_MAX bytes (-ERANGE otherwise, as Linux). Namespaces, with Linux's
 * rules:
 *   user.*      read permission on the inode to get, write to set or remove
 *               (-EACCES); only regular files and directories have them (others:
 *               -EPERM to set or remove, -ENODATA to get); in a sticky directory
 *               only its owner or root may set or remove them (-EPERM);
 *   trusted.*   root only: -EPERM to set or remove, -ENODATA to get, and left out
 *               of other callers' lists;
 *   security.*  anyone may get; root only may set or remove (-EPERM);
 *   system.* (POSIX ACLs) and any other prefix: -EOPNOTSUPP.
 * Setting or removing one sets the inode's ctime.
 */
/*
 * Sets `name` to size bytes of value (at most STK_XATTR_SIZE_MAX, -E2BIG). flags:
 * STK_XATTR_CREATE (-EEXIST if it exists) or STK_XATTR_REPLACE (-ENODATA if not);
 * other bits -EINVAL. A new name that would make the inode's name list longer
 * than STK_XATTR_SIZE_MAX bytes: -ENOSPC.
 */
int stk_meta_store_setxattr(struct stk_meta_store *st, const struct stk_cred *cred, uint64_t ino,
			    const char *name, const void *value, size_t size, uint32_t flags);
/*
 * *len is the value's length; with cap > 0 the value is copied into buf, or
 * -ERANGE when it is longer than cap. -ENODATA if the inode has no such attribute.
 */
int stk_meta_store_getxattr(struct stk_meta_store *st, const struct stk_cred *cred, uint64_t ino,
			    const char *name, void *buf, size_t cap, size_t *len);
/*
 * The names the caller may see, each NUL-terminated, in key order: *len is their
 * total length, copied into buf when cap > 0 (-ERANGE if it does not fit). As on
 * Linux, listing needs no permission on the inode.
 */
int stk_meta_store_listxattr(struct stk_meta_store *st, const struct stk_cred *cred, uint64_t ino,
			     char *buf, size_t cap, size_t *len);
/* Removes `name`: -ENODATA if absent. */
int stk_meta_store_removexattr(struct stk_meta_store *st, const struct stk_cred *cred, uint64_t ino,
			       const char *name);

/*
 * Orphans: a regular file whose last name goes (unlink, rename over it) while
 * the hook says it is open (returns 1) keeps its inode record, with nlink 0, and
 * an orphan record ("orphan" + be64 ino in sys), in the same transaction; its
 * attributes stay readable by getattr and writable by extend. The hook runs
 * inside the write transaction and must not call the store. Set it once, before
 * any other thread uses the store; NULL (the default) drops such files at once.
 */
typedef int (*stk_meta_open_fn)(void *ctx, uint64_t ino);
void stk_meta_store_set_open_hook(struct stk_meta_store *st, stk_meta_open_fn fn, void *ctx);
/* Up to max orphan inode numbers, in numeric order; *n is how many. */
int stk_meta_store_orphans(struct stk_meta_store *st, uint64_t *inos, size_t max, size_t *n);
/*
 * Forgets orphan ino: its record goes, and its inode too if it still has no name
 * (a hard link may have given it one back), which records its purge (below).
 * -ENOENT if ino is not an orphan.
 */
int stk_meta_store_orphan_drop(struct stk_meta_store *st, uint64_t ino);

/*
 * Purges: every transaction that frees a regular file's inode (the last unlink,
 * a rename over its last name, an orphan dropped, in a batch or not) records
 * the file's layout and size in the purge table, so that its chunks are removed
 * by meta (src/meta/purge.h) even if the client that unlinked it dies at once.
 * A record stays until stk_meta_store_purge_done, which the purge thread calls
 * once every chain of the layout has acknowledged the removal. Inode numbers are
 * never reused, so a record never meets a newer file of the same number.
 */
struct stk_meta_purge {
	uint64_t ino;
	struct stk_layout layout;
	uint64_t size; /* the file's size when it was freed (for the metrics) */
};
/*
 * Up to max records from inode `from` on, in inode order, into out; *n how many
 * (fewer than max: the table's end). A corrupt record is logged and skipped.
 */
int stk_meta_store_purges(struct stk_meta_store *st, uint64_t from, struct stk_meta_purge *out,
			  size_t max, size_t *n);
/* Drops the records of the n inodes (those without one are skipped), in one transaction. */
int stk_meta_store_purge_done(struct stk_meta_store *st, const uint64_t *inos, size_t n);
/* How many purges wait: the table's records and those kept in memory (below). */
int stk_meta_store_purge_count(struct stk_meta_store *st, uint64_t *n);
/*
 * A full map (MDB_MAP_FULL) fails the transaction that frees a file, since its
 * purge record needs room. Such an operation is tried once more without the
 * record, and its purge is kept in memory instead, published when that
 * transaction commits (an unlink on a full metadata disk still frees space).
 * A meta stopped before the purger sent them leaves those chunks behind, logged;
 * they belong to no inode, and stoker fsck finds them as garbage. Past 2^20 such
 * purges waiting, a freeing fails with -ENOSPC as before.
 *
 * stk_meta_store_purges_unrecorded copies up to max of them, the oldest first,
 * into out and returns how many. stk_meta_store_unrecorded_done settles the first
 * `taken` of them (as the last call returned them): those with failed[i] stay,
 * the others are forgotten. One consumer (the purger) only; any thread.
 */
size_t stk_meta_store_purges_unrecorded(struct stk_meta_store *st, struct stk_meta_purge *out,
					size_t max);
void stk_meta_store_unrecorded_done(struct stk_meta_store *st, size_t taken, const uint8_t *failed);

/* Where fsck reattaches what no name reaches: a folder of the root, on shard 1. */
#define STK_LOSTFOUND_NAME "lost+found"

/*
 * fsck (docs/fsck.md): the namespace checked against itself, in one transaction,
 * so that operations in flight never show as problems. What is checked, by kind:
 *   DANGLING      an entry (parent, name) names inode ino, which does not exist
 *   LOST_ENTRY    an entry sits in parent, which is no folder (or does not exist)
 *   NLINK         inode ino's link count is found, its entries say expect
 *                 (a folder: 2 + its subfolders)
 *   UNREACHED     inode ino has no entry and is no open orphan (found: nlink)
 *   STALE_ORPHAN  an orphan record names inode ino, which does not exist
 *   PARENT        folder ino's parent pointer is found, its entry is in expect
 *   QUOTA_BYTES,  quota ino's stored usage is found, the inodes tagged into it
 *   QUOTA_INODES  (orphans too) add up to expect
 *   CORRUPT       a record that does not decode (inode ino, or an entry)
 *   CYCLE         folder ino, named `name` in parent, is in a loop of found folders
 *                 (each named in the next) that the root does not reach (expect:
 *                 its parent pointer); the folder of the loop's smallest number
 * With repair (one write transaction; other writers wait meanwhile) what is safe
 * is repaired: entries that lead nowhere or from nowhere are dropped, link counts
 * and parent pointers set from the entries, an unreached file, symlink or
 * special file reattached in lost+found as "#INO" (made on demand; the
 * problem's name and parent say where; on shard 1 only, and reported only when
 * the name is taken), stale orphan records dropped, quota usage set to the
 * count, a loop of folders cut (the entry of CYCLE's folder dropped, and its
 * parent's link: that folder is then reported UNREACHED). A corrupt record is
 * only reported, and so are an unreached folder and any unreached inode of
 * shard 2.. (expect: its parent pointer): stk_fsck reattaches those
 * (stk_meta_store_fsck_adopt, _gather), once it has seen that no entry of
 * another shard names them. fn (may be NULL) is called for each
 * problem inside the transaction; a non-zero return stops the check with that
 * error (and undoes the repairs).
 */
struct stk_meta_fsck_problem {
	uint32_t kind; /* enum stk_fsck_kind (proto/msg.h) */
	uint8_t repaired;
	uint64_t ino;
	uint64_t parent;
	uint64_t expect;
	uint64_t found;
	char name[STK_NAME_MAX + 1]; /* an entry's name ("" for others) */
};
struct stk_meta_fsck_stats {
	uint64_t inodes, entries, dirs, files;
	uint64_t problems, repaired;
	uint64_t next_ino; /* every inode number below it was handed out */
};
typedef int (*stk_meta_fsck_fn)(void *ctx, const struct stk_meta_fsck_problem *p);
int stk_meta_store_fsck(struct stk_meta_store *st, int repair, stk_meta_fsck_fn fn, void *ctx,
			struct stk_meta_fsck_stats *stats);

/*
 * A regular file as fsck's data check needs it: its attributes and the chunks
 * that hold data (ranges [first, end), see "Blocks"); exact 0 when merged ranges
 * may count holes as written, orphan 1 for a file without a name.
 */
struct stk_meta_file {
	struct stk_attr attr;
	uint8_t exact;
	uint8_t orphan;
	uint32_t nalloc;
	uint32_t alloc[32][2];
};
/* Up to max regular files from inode `from` on, in inode order; *n how many. */
int stk_meta_store_files(struct stk_meta_store *st, uint64_t from, struct stk_meta_file *out,
			 size_t max, size_t *n);

/*
 * Quotas (docs/quotas.md). A folder with a quota is a *quota root*; its quota
 * has limits on bytes (the sizes of regular files, logical) and inodes (every
 * inode, the folder itself included), 0 meaning none, and its usage. Each inode
 * carries the number of the quota root it counts in (attr.qid: the nearest one
 * above it, or itself for a quota root; 0: none), inherited from its folder at
 * create. An inode counts in that quota and in every quota above it.
 *
 * Creates, mkdir, symlink and mknod past an inode limit, and a truncate that
 * grows a file past a byte limit, are -EDQUOT and change nothing. Usage goes
 * down when an inode is really freed (an orphan: when it is dropped). Extend
 * counts bytes without a check: the writer reserved them first
 * (stk_meta_store_quota_reserve). Renaming a folder between folders that count
 * in different quotas is -EXDEV, as is a hard link across them or renaming a
 * file that has other names; a file renamed alone takes its usage along, or
 * -EDQUOT when a quota it enters has no room for it.
 */
struct stk_meta_quota {
	uint64_t qid;	       /* the quota root's inode number */
	uint64_t parent;       /* the quota above it, 0: none */
	uint64_t limit_bytes;  /* 0: none */
	uint64_t limit_inodes; /* 0: none */
	uint64_t used_bytes;
	uint64_t used_inodes;
	uint64_t reserved_bytes; /* held by writers now (memory only) */
	uint64_t reserved_inodes; /* held by sessions' allowances now (memory only) */
};

/*
 * Sets the limits of folder ino's quota (root only, -EPERM), making it a quota
 * root if it is not one yet: that walks the tree below it in the same
 * transaction, tagging and counting every inode (progress in the log every
 * 100,000 inodes; other writers wait meanwhile). flags STK_QUOTA_KEEP_BYTES /
 * _KEEP_INODES keep that limit as it is (none, for a new quota). A limit below
 * the usage is allowed: it refuses growth from then on. *out (may be NULL) is
 * the quota after. -ENOTDIR, -ENOENT, -EINVAL (unknown flags).
 */
int stk_meta_store_quota_set(struct stk_meta_store *st, const struct stk_cred *cred, uint64_t ino,
			     uint64_t limit_bytes, uint64_t limit_inodes, uint32_t flags,
			     struct stk_meta_quota *out);
/*
 * Removes folder ino's quota (root only): what it counted counts in the quota
 * above it, if any. -ENOENT if ino has no quota of its own, -ENOTDIR.
 */
int stk_meta_store_quota_rm(struct stk_meta_store *st, const struct stk_cred *cred, uint64_t ino);
/* The quota inode ino counts in (the nearest). -ENOENT: none, or no such inode. */
int stk_meta_store_quota_get(struct stk_meta_store *st, uint64_t ino, struct stk_meta_quota *out);
/*
 * Up to max quotas from quota root `from` on (0: the first), by inode number,
 * into out; *n how many, *more 1 when others follow.
 */
int stk_meta_store_quota_list(struct stk_meta_store *st, uint64_t from, struct stk_meta_quota *out,
			      size_t max, size_t *n, int *more);
/*
 * Recounts quota ino (0: every quota) from the tree, in one write transaction:
 * usage is set to what the tree holds (with the orphans that count in it) and
 * inodes tagged with another quota are tagged again (logged). fn, if not NULL,
 * is called inside the transaction for each quota recounted, with its record
 * before and after (valid during the call; the change stands only if the call
 * returns 0). Root only (-EPERM); -ENOENT if ino has no quota.
 */
typedef void (*stk_meta_quota_fn)(void *ctx, const struct stk_meta_quota *before,
				  const struct stk_meta_quota *after);
int stk_meta_store_quota_recount(struct stk_meta_store *st, const struct stk_cred *cred,
				 uint64_t ino, stk_meta_quota_fn fn, void *ctx);
/*
 * Reserves room for session to write regular file ino up to size `need`, or up
 * to `want` (>= need) if every quota it counts in has room: *granted is what
 * was reserved, at least need, or UINT64_MAX when no quota of the file limits
 * bytes. The reservation (one per session and inode, replaced by each call)
 * counts granted - size bytes as used until released; sizes that reach it
 * shrink it. -EDQUOT: not even need fits. session 0: checked, not kept.
 * -EISDIR, -EINVAL (not a regular file), -ENOENT. Memory only.
 */
int stk_meta_store_quota_reserve(struct stk_meta_store *st, uint64_t session, uint64_t ino,
				 uint64_t need, uint64_t want, uint64_t *granted);
/*
 * The path of folder dir from the root ("/a/b"), NUL-terminated, into buf (len
 * bytes; -ERANGE if it does not fit), found by following parent pointers and
 * scanning each parent's names for its child: meant for the few folders that
 * carry quotas. -ENOTDIR, -ENOENT.
 */
int stk_meta_store_path_of(struct stk_meta_store *st, uint64_t dir, char *buf, size_t len);
/* Drops session's reservation on ino (its last open reference went). */
void stk_meta_store_quota_release(struct stk_meta_store *st, uint64_t session, uint64_t ino);
/* Drops every reservation and inode allowance of session (it ended or expired). */
void stk_meta_store_quota_release_session(struct stk_meta_store *st, uint64_t session);
/*
 * Inode allowances (docs/quotas.md, "Creates a mount answers itself"): sets aside
 * up to `want` (> 0) inodes for session in the quota folder dir counts in, so that
 * its creates there (stk_meta_store_create_as with as->session) need no check:
 * they spend it. The room is counted in every quota above as if used, so usage
 * never passes a limit. *granted is what was set aside: want, or less (at most
 * half of what the tightest quota has left, so that other sessions find room),
 * or want with nothing set aside when no quota of dir limits inodes. *qid the
 * quota root dir counts in (0: none). Added to what session holds there already.
 * Memory only: it goes with stk_meta_store_quota_release_session or
 * stk_meta_store_quota_disallow. -EDQUOT: nothing left; -EINVAL (session or
 * want 0), -ENOTDIR, -ENOENT, -ENOMEM.
 */
int stk_meta_store_quota_allow(struct stk_meta_store *st, uint64_t session, uint64_t dir,
			       uint64_t want, uint64_t *granted, uint64_t *qid);
/*
 * Takes count (UINT32_MAX: all) of session's inode allowance in quota qid (0: in
 * every quota) back; what is left of it stays.
 */
void stk_meta_store_quota_disallow(struct stk_meta_store *st, uint64_t session, uint64_t qid,
				   uint32_t count);
/*
 * Byte allowances (docs/quotas.md, "Bytes a mount writes"): as inode allowances,
 * up to `want` (> 0) bytes set aside for session in the quota inode ino (a file
 * or a folder) counts in, in every quota above it counted as reserved, at most
 * half of what the tightest byte limit has left; want with nothing set aside
 * when no quota of ino limits bytes. Spent by size reports
 * (stk_meta_extend.allow_spent); given back by stk_meta_store_quota_disallow_bytes
 * (count UINT64_MAX: all); gone with stk_meta_store_quota_release_session.
 * -EDQUOT: nothing left; -EINVAL, -ENOENT, -ENOMEM.
 */
int stk_meta_store_quota_allow_bytes(struct stk_meta_store *st, uint64_t session, uint64_t ino,
				     uint64_t want, uint64_t *granted, uint64_t *qid);
void stk_meta_store_quota_disallow_bytes(struct stk_meta_store *st, uint64_t session, uint64_t qid,
					 uint64_t count);

/*
 * A batch of changes in one write transaction: between begin and end, every call of
 * this thread into the store runs as a child transaction of the batch's (its own
 * failure undoes it alone) and nothing is visible to others or written out until
 * stk_meta_store_batch_end(st, 0) commits them all at once (rc != 0: none). Other
 * writers wait meanwhile: keep a batch short, and wait for nothing inside it.
 * The batch's transaction belongs to the calling thread, from begin to end. begin:
 * 0, -EBUSY (this thread has a batch open already) or the store's -errno (-ENOSPC,
 * -EIO). end: the commit's outcome (0, -ENOSPC, -EIO), rc itself when rc != 0, or
 * -EINVAL when this thread has no batch open on st.
 */
int stk_meta_store_batch_begin(struct stk_meta_store *st);
int stk_meta_store_batch_end(struct stk_meta_store *st, int rc);

/*
 * Replication. A leader's store records, in each write transaction, every put
 * and delete it makes to any table (a redo record, captured where this file's
 * code writes to LMDB, so that a table added later needs nothing of its own),
 * numbers each transaction that changed something with the next change number
 * (seq, from 1), stores (epoch, seq) in `sys` ("repl_pos") in that transaction,
 * and calls the redo hook after the commit, in commit order. A follower's store
 * takes changes only through stk_meta_store_apply and the snapshot calls; any
 * other write is -EROFS. Off (the default) records nothing and numbers nothing.
 *
 * The hook is called on the committing thread with the store's replication lock
 * held: it must copy what it keeps and return quickly, without calling into the
 * store. ops/len: the redo record (valid during the call only).
 *
 * Redo record: a sequence of u8 kind (1 put, 2 delete), u8 name length, the
 * table's name, u32 key length, key, u32 value length, value (none: 0 for a
 * delete). A log of them, as stk_meta_store_apply reads it: a sequence of
 * entries u64 epoch, u64 seq, u32 length, that many bytes of redo record.
 */
#define STK_META_REPL_OFF 0
#define STK_META_REPL_LEADER 1
#define STK_META_REPL_FOLLOWER 2
typedef void (*stk_meta_redo_fn)(void *ctx, uint64_t epoch, uint64_t seq, const uint8_t *ops,
				 size_t len);
/*
 * Sets the mode (STK_META_REPL_*), the epoch a leader's changes carry, and the
 * hook (NULL: none). Waits for a write transaction in progress to end; a change
 * committed after this returns follows the new mode. 0, -EINVAL, or -errno.
 */
int stk_meta_store_repl_set(struct stk_meta_store *st, int mode, uint64_t epoch,
			    stk_meta_redo_fn fn, void *ctx);
/* The last change this store holds: its epoch and number (0, 0: none). Any thread. */
void stk_meta_store_repl_pos(struct stk_meta_store *st, uint64_t *epoch, uint64_t *seq);
/*
 * The number of the last change this thread committed as a leader (0: none
 * since the last reset), and with reset, forgets it: what a request waits for
 * its followers to hold before it is answered.
 */
uint64_t stk_meta_store_thread_seq(int reset);
/*
 * A follower applies a log (the format above) in one transaction: entries it
 * holds already are skipped, the others must follow on from its position (else
 * -ESTALE, nothing applied). *epoch and *seq (either may be NULL): its position
 * after. -EBADMSG (malformed), -EPROTO (a table this store does not have), or the
 * store's -errno. Writes in any mode (a leader never calls it).
 */
int stk_meta_store_apply(struct stk_meta_store *st, const uint8_t *log, size_t len, uint64_t *epoch,
			 uint64_t *seq);
/*
 * A copy of the whole store for a follower that is new or too far behind. It is
 * made of many short read transactions, so it is not one moment's state: the
 * leader notes its position (stk_meta_store_repl_pos) before the first call, and
 * the follower, once it has every part (stk_meta_store_snap_done with that
 * position), applies the log from there, which makes it exact (every record of
 * the log replaces or deletes a whole key). snap_next fills buf (cap bytes) with
 * a redo record of puts; *done is 1 after the last part. -EMSGSIZE: one record is
 * larger than cap. One snapshot is used by one thread at a time.
 */
struct stk_meta_snap;
int stk_meta_store_snap_begin(struct stk_meta_store *st, struct stk_meta_snap **out);
int stk_meta_store_snap_next(struct stk_meta_snap *s, uint8_t *buf, size_t cap, size_t *len,
			     int *done);
void stk_meta_store_snap_end(struct stk_meta_snap *s);
/*
 * A follower: applies one part of a snapshot; `first` empties every table (and
 * the position, so that a crash before snap_done copies again) first, and the
 * namespace identity reads as zero from then until snap_done. snap_done:
 * the copy is complete as of (epoch, seq), and the namespace identity is the
 * copy's. 0, -EBADMSG, -EPROTO or the store's -errno.
 */
int stk_meta_store_snap_apply(struct stk_meta_store *st, int first, const uint8_t *ops, size_t len);
int stk_meta_store_snap_done(struct stk_meta_store *st, uint64_t epoch, uint64_t seq);

/*
 * Client confinement (service.c, docs/security.md). stk_meta_store_within: 1 when
 * ino is top or lies under it, 0 when not (or ino does not exist), -errno. A
 * directory lies under top when top is on its chain of parents; any other inode
 * by the directory it was made in or last renamed into (its recorded parent),
 * which hard links do not change; one made by a release that recorded none is not
 * under any top but the root until it is linked again. stk_meta_store_resolve: the
 * directory an absolute path names, looked up as root without following symlinks;
 * -ENOENT, -ENOTDIR, -EINVAL (not absolute).
 */
int stk_meta_store_within(struct stk_meta_store *st, uint64_t ino, uint64_t top);
/*
 * stk_meta_store_climb: the walk of stk_meta_store_within on this shard's inodes,
 * which stops where a parent pointer (or ino itself) names another shard's inode:
 * 2 with that inode in *left; else 1 or 0 as stk_meta_store_within, or -errno
 * (meta/span.c goes on with *left on its shard).
 */
int stk_meta_store_climb(struct stk_meta_store *st, uint64_t ino, uint64_t top, uint64_t *left);
int stk_meta_store_resolve(struct stk_meta_store *st, const char *path, uint64_t *ino);


/*
 * Cross-shard folders (docs/meta-shards.md): a folder whose entry lives on its
 * parent's shard A and whose inode on another shard B, made and removed in four
 * steps (meta/xshard.c drives them), each one transaction here, recorded so that
 * a crash between any two is undone or finished by itself.
 *
 * On A, an intent: what A is doing (kind), with which shard, where and to which
 * folder. On B, a mark on the folder's inode: made for A's intent and not named
 * yet (pending), or being removed by it (dying: nothing new goes in).
 */
enum {
	STK_XINTENT_MKDIR = 1,
	STK_XINTENT_RMDIR = 2,
	STK_XINTENT_RENAME = 3,
	STK_XINTENT_LINK = 4,
	STK_XINTENT_FMOVE = 5, /* a folder moved across shards */
	STK_XQUERY_LOCK = 6    /* QUERY only: is the folder-move lock's id still held */
};
/*
 * FMOVE: B's, on the moved folder: its new entry (parent, name), what it replaced
 * (old_ino), and, when the folder is B's own, its parent pointer to change at
 * step 4. FPTR: C's (the folder's shard, neither A nor B), its parent pointer to
 * change to parent at step 4. FVICTIM: B's, on the empty folder the new entry
 * replaced (nothing new goes in; settled with the FMOVE mark, intent | 1 << 63).
 */
enum {
	STK_XMARK_PENDING = 1,
	STK_XMARK_DYING = 2,
	STK_XMARK_RENAME = 3,
	STK_XMARK_LINK = 4,
	STK_XMARK_FMOVE = 5,
	STK_XMARK_FPTR = 6,
	STK_XMARK_FVICTIM = 7
};
#define STK_XMARK_VICTIM_BIT (1ull << 63)
/*
 * What A answers about an intent of its (stk_meta_store_xquery): held, or the
 * name's state (mkdir, rmdir); for a rename (stk_meta_store_xquery_rename),
 * whether its step 3 committed (MOVED) or not (STAYED).
 */
enum {
	STK_XSTATE_INTENT = 1,
	STK_XSTATE_NAMED = 2,
	STK_XSTATE_UNNAMED = 3,
	STK_XSTATE_MOVED = 4,
	STK_XSTATE_STAYED = 5
};

struct stk_meta_xintent {
	uint64_t id;
	uint32_t kind;	/* STK_XINTENT_* */
	uint32_t shard; /* B */
	uint64_t parent;
	uint64_t ino; /* rmdir: the folder (mkdir: 0) */
	char name[STK_NAME_MAX + 1];
};

struct stk_meta_xmark {
	uint64_t ino;
	uint32_t kind; /* STK_XMARK_* */
	uint32_t from; /* A */
	uint64_t intent;
	uint64_t parent; /* on A; a rename's: the folder here that its new entry is in */
	char name[STK_NAME_MAX + 1];
	/* a rename's: what the new entry replaced (0: nothing), kept until step 4 */
	uint64_t old_ino;
	uint32_t old_type;
};

/*
 * A, step 1 of a mkdir: the checks of a mkdir of `name` in parent (EEXIST, EACCES,
 * ENOTDIR, ...) and an intent to make it on `shard`, in one transaction. *id: the
 * intent's. -EINVAL for this store's own shard or none.
 */
int stk_meta_store_xintent_mkdir(struct stk_meta_store *st, const struct stk_cred *cred,
				 uint64_t parent, const char *name, uint32_t shard, uint64_t *id);
/*
 * A, step 1 of a rmdir of `name` in parent, which names victim, a folder of
 * another shard (victim: its attributes as its shard told them, for the sticky
 * rule): the checks and the intent. -EAGAIN when the name names something else
 * now.
 */
int stk_meta_store_xintent_rmdir(struct stk_meta_store *st, const struct stk_cred *cred,
				 uint64_t parent, const char *name, const struct stk_attr *victim,
				 uint64_t *id);
/* A: drops an intent (an abort; none: 0). */
int stk_meta_store_xintent_drop(struct stk_meta_store *st, uint64_t id);
/*
 * A, step 3 of a mkdir: the entry of the intent's name naming child (B's new
 * folder) and the intent's removal, in one transaction. -EEXIST when the name was
 * taken meanwhile, -ENOENT when the intent is gone (aborted): nothing changes.
 */
int stk_meta_store_xlink(struct stk_meta_store *st, const struct stk_cred *cred, uint64_t id,
			 const struct stk_attr *child);
/* A, step 3 of a rmdir: the entry's and the intent's removal, in one transaction. */
int stk_meta_store_xunlink(struct stk_meta_store *st, uint64_t id);
/* A: up to max intents held (recovery). */
int stk_meta_store_xintents(struct stk_meta_store *st, struct stk_meta_xintent *out, size_t max,
			    size_t *n);
/*
 * A, for B's recovery: whether intent id is still held (STK_XSTATE_INTENT: wait),
 * else whether `name` in parent names ino (NAMED: the folder lives) or not
 * (UNNAMED: it goes).
 */
int stk_meta_store_xquery(struct stk_meta_store *st, uint64_t id, uint64_t parent,
			  const char *name, uint64_t ino, int *state);
/*
 * B, step 2 of a mkdir: a new folder whose parent is A's `parent`, marked pending
 * for (from, intent). Asked again for the same intent, the folder made then.
 */
int stk_meta_store_xmkdir(struct stk_meta_store *st, uint32_t from, uint64_t intent,
			  uint64_t parent, const char *name, uint32_t mode, uint32_t uid,
			  uint32_t gid, struct stk_attr *out);
/*
 * B, step 2 of a rmdir: folder ino, empty, marked dying for (from, intent); from
 * then on nothing new is made in it. -ENOTEMPTY, -EBUSY (another mark), -ENOENT.
 */
int stk_meta_store_xdying(struct stk_meta_store *st, uint32_t from, uint64_t intent,
			  uint64_t ino, const char *name);
/*
 * B, step 4 or an abort: the mark of (from, intent) settled. done (A named the
 * folder, or removed its name): a pending folder is kept, a dying one deleted;
 * not done (A gave up): a pending folder is deleted, a dying one kept. No mark:
 * 0 (settled already).
 */
int stk_meta_store_xsettle(struct stk_meta_store *st, uint32_t from, uint64_t intent, int done);
/*
 * The mark of (from, intent) copied into the caller's out: 0, -ENOENT (none:
 * settled, or never made), or -EIO (the store).
 */
int stk_meta_store_xmark_find(struct stk_meta_store *st, uint32_t from, uint64_t intent,
			      struct stk_meta_xmark *out);
/* B: up to max marks held (recovery). */
int stk_meta_store_xmarks(struct stk_meta_store *st, struct stk_meta_xmark *out, size_t max,
			  size_t *n);

/*
 * Files renamed across shards (docs/meta-shards.md, "Files renamed across
 * shards"): a file keeps its inode on its home shard H; an entry on another
 * shard D names it. H keeps, per such inode, one record of that name (holder D
 * and an id), counted in the link count; D keeps one record of the inode it
 * names (home H and the same id), turned into a release when the name goes,
 * until H has dropped its record and the link with it. A file has at most one
 * name off its home shard.
 *
 * The rename from a folder on shard S to one on shard D (S or D the file's home):
 * (1) S: the intent; (2) D: the new entry, replacing the old one, marked for
 * (S, X) with what it replaced; (3) S: the old entry goes, H's or S's record
 * changes, the intent goes, in one transaction (the commit); (4) D: the mark
 * goes, D's records change, what was replaced loses its name.
 */

/*
 * S, step 1: the checks of a rename of src_name in src_parent to a folder of
 * shard `shard` (this one's: -EINVAL) and the intent. Not built (-EXDEV): a
 * folder, a file of a third shard, a file with a name off its home already,
 * RENAME_EXCHANGE. -EBUSY: the file is in another rename across shards. *moved:
 * the inode (a remote one's: only its number and type). *id: the intent's.
 */
int stk_meta_store_xintent_rename(struct stk_meta_store *st, const struct stk_cred *cred,
				  uint64_t src_parent, const char *src_name, uint32_t shard,
				  uint32_t flags, struct stk_attr *moved, uint64_t *id);
/*
 * D, step 2: `name` in parent (of this shard) names ino (type: its S_IFMT), of
 * shard `from`'s intent: the old entry replaced (a folder: -EISDIR; noreplace:
 * -EEXIST), both kept in a mark. uid and gid: the caller's, for the permission
 * on parent (its other groups are not known here). Asked again: 0. -EALREADY:
 * the name names the file already (POSIX: the rename does nothing). *old: what
 * was replaced (ino 0: nothing).
 */
int stk_meta_store_xrename_in(struct stk_meta_store *st, uint32_t from, uint64_t intent,
			      uint64_t ino, uint32_t type, uint64_t parent, const char *name,
			      uint32_t uid, uint32_t gid, int noreplace, struct stk_attr *old);
/*
 * S, step 3: the intent's entry goes, the name's records change (H's: D now holds
 * the name; S's own record of a remote inode goes) and the intent goes, in one
 * transaction; dst_parent: the folder on D (the file's parent pointer, at home).
 * -ENOENT: the intent is gone; -EAGAIN: the name names something else now.
 */
int stk_meta_store_xrename_commit(struct stk_meta_store *st, uint64_t id, uint64_t dst_parent);
/* S, for D's recovery: a rename intent's state (INTENT, MOVED or STAYED). */
int stk_meta_store_xquery_rename(struct stk_meta_store *st, uint64_t id, uint64_t ino, int *state);

/*
 * A hard link across shards: file ino of home H linked into parent on D. (1) D:
 * the intent; (2) H: the link counted and its record, marked for (D, X); (3) D:
 * the entry, its record, the intent gone (the commit); (4) H: the mark goes.
 *
 * D, step 1: the checks of a link of ino (of another shard) as `name` in parent,
 * and the intent. -EXDEV: a name of it here already (one name off home at most).
 */
int stk_meta_store_xintent_link(struct stk_meta_store *st, const struct stk_cred *cred,
				uint64_t ino, uint64_t parent, const char *name, uint64_t *id);
/*
 * H, step 2: file ino's link count up by one and its record of a name on shard
 * `from`, marked for (from, intent). -EPERM for a folder, -EXDEV when it has a
 * name off home already, -EBUSY in a rename across shards, -EMLINK. Asked again:
 * 0. *out: the file after.
 */
int stk_meta_store_xlink_in(struct stk_meta_store *st, uint32_t from, uint64_t intent, uint64_t ino,
			    uint64_t parent, const char *name, struct stk_attr *out);
/*
 * D, step 3: the entry naming the file (type: its S_IFMT), D's record of it, and
 * the intent's removal, in one transaction. -EEXIST: the name was taken meanwhile;
 * -ENOENT: the intent is gone.
 */
int stk_meta_store_xlink_commit(struct stk_meta_store *st, uint64_t id, uint32_t type);
/* D, for H's recovery: a link intent's state (INTENT, MOVED: committed, STAYED). */
int stk_meta_store_xquery_link(struct stk_meta_store *st, uint64_t id, uint64_t ino, int *state);

/*
 * Folders moved across shards (docs/meta-shards.md, "Folders moved across
 * shards"): folder F (inode on shard C) moved from parent P on A to parent Q on B.
 * (1) A: the intent, F held; (2) B (B != A): Q's new entry naming F, replacing an
 * empty folder of B, marked FMOVE; C (C not A nor B): F marked FPTR; (3) A: the
 * commit: P's entry goes (A == B: Q's is written, replacing), P's link count,
 * F's parent pointer when C == A, and a done record ('D') in place of the intent;
 * (4) B and C settle their marks (F's pointer to Q where F is theirs, the folder
 * replaced deleted), then A drops the done record.
 *
 * A, step 1: the checks of a rename of the folder src_name in src_parent to
 * dst_name in dst_parent (when dst_parent is A's, its checks too), the intent
 * and F's hold. -EXDEV: RENAME_EXCHANGE, a file (not this path), a folder of
 * another shard replaced, src_parent (or dst_parent, when A's) in a quota and
 * the parent changing; -EALREADY: both names name F already (nothing to do);
 * -EBUSY: F held. *moved: F (another shard's: only its number and type).
 */
int stk_meta_store_xintent_fmove(struct stk_meta_store *st, const struct stk_cred *cred,
				 uint64_t src_parent, const char *src_name, uint64_t dst_parent,
				 const char *dst_name, uint32_t flags, struct stk_attr *moved,
				 uint64_t *id);
/*
 * B, step 2: `name` in parent (B's) names folder ino for (from, intent), replacing
 * an empty folder of B (-ENOTEMPTY; a file: -ENOTDIR; another shard's folder:
 * -EXDEV; noreplace: -EEXIST), marked. parent in a quota: -EXDEV. uid, gid: the
 * caller's. Asked again: 0.
 */
int stk_meta_store_xfmove_in(struct stk_meta_store *st, uint32_t from, uint64_t intent,
			     uint64_t ino, uint64_t parent, const char *name, uint32_t uid,
			     uint32_t gid, int noreplace);
/* C, step 2: folder ino marked FPTR for (from, intent), its pointer to be parent. */
int stk_meta_store_xfptr(struct stk_meta_store *st, uint32_t from, uint64_t intent,
			 uint64_t ino, uint64_t parent);
/*
 * A, step 3: the commit (above), dst_parent and dst_name the new name (written
 * here when dst_parent is A's; noreplace as at step 1). -ENOENT: the intent is
 * gone; -EAGAIN: the old name names something else now.
 */
int stk_meta_store_xfmove_commit(struct stk_meta_store *st, uint64_t id, uint64_t dst_parent,
				 const char *dst_name, int noreplace);
/* A, for B's and C's recovery: INTENT (wait), MOVED (committed) or STAYED. */
int stk_meta_store_xquery_fmove(struct stk_meta_store *st, uint64_t id, int *state);
/* A: a committed move whose marks are not all settled yet. */
struct stk_meta_xdone {
	uint64_t id;
	uint64_t ino;	/* F */
	uint32_t shard; /* B */
};
int stk_meta_store_xdones(struct stk_meta_store *st, struct stk_meta_xdone *out, size_t max,
			  size_t *n);
/* A: every mark of done move id settled: its record goes. */
int stk_meta_store_xdone_drop(struct stk_meta_store *st, uint64_t id);
/* Whether id is an intent or a done move of this shard's (1) or not (0). */
int stk_meta_store_xheld(struct stk_meta_store *st, uint64_t id);
/*
 * Shard 1: the cluster's folder-move lock, held by (holder shard, id). take 1:
 * 0 when taken (or held by the same already), -EBUSY when another holds it;
 * take 0: released when (holder, id) holds it, else nothing (0).
 */
int stk_meta_store_xlock(struct stk_meta_store *st, uint32_t holder, uint64_t id, int take);
/* Shard 1: who holds the lock (-ENOENT: nobody). */
int stk_meta_store_xlock_get(struct stk_meta_store *st, uint32_t *holder, uint64_t *id);
/* Folder ino's parent pointer (-ENOENT, -ENOTDIR), for the walk up to the root. */
int stk_meta_store_xparent(struct stk_meta_store *st, uint64_t ino, uint64_t *parent);

/* D: a name of a file of another shard that went, to tell its home. */
struct stk_meta_xrelease {
	uint64_t ino;
	uint64_t id;
	uint32_t home;
};
/* D: up to max releases waiting. */
int stk_meta_store_xreleases(struct stk_meta_store *st, struct stk_meta_xrelease *out, size_t max,
			     size_t *n);
/* D: a release told (H answered): it goes. */
int stk_meta_store_xrelease_done(struct stk_meta_store *st, uint64_t ino);
/*
 * H: shard `from` dropped its name (id) of ino: the record goes and the link with
 * it (the file freed or orphaned as an unlink would). Told already: 0. *out: the
 * inode after (nlink 0 when it went).
 */
int stk_meta_store_xrelease(struct stk_meta_store *st, uint32_t from, uint64_t ino, uint64_t id,
			    struct stk_attr *out);

/*
 * fsck's cross-shard check (docs/fsck.md): the references between this shard and
 * the others, a page at a time, each page one read transaction.
 *
 * stk_meta_store_fsck_xentries: the entries of this shard that name a folder of
 * another shard, in the order of their keys, after `after` (NULL: from the
 * first), up to max: ino, parent, name and hash (the key's, for the next page's
 * `after`); covered 1 when an intent of this shard is about a name in that
 * parent (a cross-shard mkdir or rmdir in flight there: the protocol's, not
 * fsck's). *done 1 at the end.
 *
 * stk_meta_store_fsck_xdirs: the folders of this shard whose parent is on
 * another shard, from inode `from`, up to max: ino, parent (its parent pointer),
 * covered 1 when a pending or dying mark is on it; *next and *done as above.
 */
struct stk_meta_xref {
	uint64_t ino, parent;
	uint64_t hash; /* an entry's: its key's name hash */
	uint8_t covered;
	char name[STK_NAME_MAX + 1];
};
int stk_meta_store_fsck_xentries(struct stk_meta_store *st, const struct stk_meta_xref *after,
				 struct stk_meta_xref *out, size_t max, size_t *n, int *done);
int stk_meta_store_fsck_xdirs(struct stk_meta_store *st, uint64_t from, struct stk_meta_xref *out,
			      size_t max, size_t *n, uint64_t *next, int *done);

/*
 * Names of files off their home (docs/meta-shards.md, "Files renamed and linked
 * across shards"), for fsck's check of each name against its home's record.
 *
 * stk_meta_store_fsck_xnames: as _xentries, the entries of this shard naming a
 * file (anything but a folder) of another shard; covered has STK_FSCK_XCOVERED
 * when an intent or a mark of this shard is about that file (a rename or link
 * in flight: the protocol's) and STK_FSCK_XHAS_R when this shard's 'R' record of
 * it names its home.
 *
 * stk_meta_store_fsck_xrecs: this shard's records of such names, from cursor
 * `from` (the kind in the top byte, the inode below; 0: the first), up to max:
 * 'X' (a file of this shard named on shard `shard`), 'R' (a file of `shard`
 * named here) and 'L' (a name here that went, its release still to tell
 * `shard`), each with its id and covered as above. *next and *done as _xdirs'.
 */
struct stk_meta_xrec {
	char kind;
	uint8_t covered;
	uint64_t ino;
	uint32_t shard;
	uint64_t id;
};
int stk_meta_store_fsck_xnames(struct stk_meta_store *st, const struct stk_meta_xref *after,
			       struct stk_meta_xref *out, size_t max, size_t *n, int *done);
int stk_meta_store_fsck_xrecs(struct stk_meta_store *st, uint64_t from, struct stk_meta_xrec *out,
			      size_t max, size_t *n, uint64_t *next, int *done);
/*
 * fsck's repair of an 'X' record of file ino (this shard's) for a name on shard
 * holder (id) that holder no longer has, nor releases: the record goes and the
 * link it counted, the file freed or orphaned as an unlink would (*out: the file
 * after; ino 0 when it was gone already). -ESTALE when the record is not that one
 * (any more), -EBUSY while an intent or a mark here is about the file, -EINVAL
 * for a file of another shard.
 */
int stk_meta_store_fsck_xunname(struct stk_meta_store *st, uint64_t ino, uint32_t holder,
				uint64_t id, struct stk_attr *out);
/*
 * On the holder (ino of shard `holder` here is its home): its leftover 'R'
 * record of ino (home `holder`, id) goes, when no entry of this shard names the
 * file (-EEXIST), nothing else; -ESTALE, -EBUSY as above.
 */
/*
 * fsck's repair of a name off home whose records are missing. At the file's home
 * (ino of this shard): its 'X' record for the name on shard `other` (id), which
 * the namespace check counts as one link (-EEXIST when it has one, -EISDIR,
 * -ENOENT). At the
 * name's shard: its 'R' record, the file's home `other` (-EEXIST when it has one
 * or a release waiting). -EBUSY while an intent or a mark here is about the file.
 */
int stk_meta_store_fsck_xrestore(struct stk_meta_store *st, uint64_t ino, uint32_t other,
				 uint64_t id);
/*
 * fsck's repair of an entry in `parent` naming folder `ino` of another shard that
 * has no such inode: the entry goes and the parent's link count with it, in one
 * write transaction, unless an intent of this shard is about a name in parent
 * (-EBUSY: a cross-shard operation is in flight there) or no entry of parent
 * names ino any more (-ENOENT). -EINVAL for an inode of this shard. The name
 * dropped is copied to name (STK_NAME_MAX + 1 bytes).
 */
int stk_meta_store_fsck_xdrop(struct stk_meta_store *st, uint64_t parent, uint64_t ino, char *name);

/*
 * fsck's repair of a folder's parent pointer (a folder of this shard whose entry
 * is on another, docs/fsck.md): folder ino's pointer becomes parent, if it is
 * still `seen` (what fsck found; else -ESTALE) and no mark of a cross-shard mkdir
 * or rmdir is on it (-EBUSY). -EINVAL for an inode of another shard or the root,
 * -ENOTDIR for no folder, -ENOENT. One write transaction.
 */
int stk_meta_store_fsck_xparent(struct stk_meta_store *st, uint64_t ino, uint64_t seen,
				uint64_t parent);
/*
 * fsck's lost+found, shard 1 only (-EXDEV elsewhere): the folder STK_LOSTFOUND_NAME
 * in the root, made on demand (root's, mode 0700; -ENOTDIR when the name is no
 * folder, -EXDEV when it is another shard's), and ino reattached in it as "#INO",
 * in one write transaction; *lf_ino is lost+found's number and name (STK_NAME_MAX
 * + 1 bytes) the entry's. ino 0: lost+found only. ino a folder of this shard
 * (no other kind, -ENOTDIR: a file of this shard is reattached by
 * stk_meta_store_fsck's repair; not the root, -EINVAL): its parent pointer must
 * still be `seen` (-ESTALE) and no mark on it (-EBUSY); the entry, the pointer
 * and lost+found's link count change together. The caller has seen that no
 * entry names it. ino of another shard: a folder, whose parent pointer its shard has set to
 * lost+found first (stk_meta_store_fsck_xparent), so that a crash between leaves
 * a folder no name reaches, never a name pointing at nothing; only the entry and
 * the link count change here. The entry there already, naming ino: 0, nothing
 * changes; naming another: -EEXIST.
 */
int stk_meta_store_fsck_adopt(struct stk_meta_store *st, uint64_t ino, uint64_t seen,
			      uint64_t *lf_ino, char *name);
/*
 * fsck's repair of the files of a shard k > 1 that no name reaches (shard 1's
 * lost+found names no file of another shard): in one write transaction, those of
 * inos[0..n) (sorted here) that are still files of this shard that no entry here
 * names and no client holds open go into a new folder of this shard, root's,
 * mode 0700, as "#INO" (link count 1), and done[i] is set for each (as inos is
 * now ordered). The folder is named by no entry; its parent pointer is lf,
 * shard 1's lost+found, whose entry for it stk_meta_store_fsck_adopt writes
 * next (a crash between leaves an unreached folder of this shard, which the next
 * fsck reattaches). *holder is its number, 0 when nothing went in. -EINVAL on
 * shard 1 or for an lf of this shard.
 */
int stk_meta_store_fsck_gather(struct stk_meta_store *st, uint64_t lf, uint64_t *inos, size_t n,
			       uint8_t *done, uint64_t *holder);

#endif
