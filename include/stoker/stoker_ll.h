/*
 * libstoker's low-level API: the namespace by inode number, as a FUSE daemon or a
 * gateway needs it. stoker.h is the path API most programs want; this header is
 * for programs that are themselves file servers: the kernel hands a FUSE daemon
 * inode numbers, not paths, and a server acting for many users passes each
 * caller's credentials so that meta checks permissions for the right person.
 * `stoker mount` (src/fuse/) and `stoker gateway s3` (src/gateway/) use only this
 * header and stoker.h.
 *
 * Three groups of calls:
 *
 *   - Inode calls (stk_ll_lookup ... stk_ll_removexattr): one metadata operation
 *     each, as its POSIX namesake, on an inode or a (parent inode, name) pair.
 *   - Leases (stk_ll_leases_start, stk_ll_leased_attr, stk_ll_on_revoked, open
 *     references): a cache of lookups that meta keeps right by revoking its
 *     leases before any change is visible (docs/architecture.md, "The lookup
 *     cache and its leases"), and the open references meta keeps so that a file
 *     unlinked while open stays readable.
 *   - Batched names (stk_ll_names_*): creates and unlinks of regular files in
 *     folders meta delegated to this client, answered at once and sent to meta in
 *     batches (docs/mount.md, "Write-behind of names").
 *
 * Conventions, in addition to those of stoker.h:
 *
 * - Every call that can fail returns 0 (or a count) or -errno, never sets errno.
 *   Besides the errors listed with each call, any call that talks to meta may
 *   return -EIO (the cluster stayed unreachable for the client's retry window,
 *   stk_client_opts.retry_ms, or a reply was malformed) and -ENOMEM.
 * - cred: the credentials to act with; NULL means the client's own (those it was
 *   connected with). Meta checks permissions against them, as the kernel would.
 *   The library keeps no pointer to cred after the call.
 * - Inode numbers are 64-bit and never reused within a cluster. STK_LL_ROOT_INO
 *   is the root folder.
 * - Names are one path component: 1 to STK_LL_NAME_MAX bytes, no '/', not "."
 *   or ".." (-EINVAL, -ENAMETOOLONG).
 * - Output structs (out, attr, ...) are the caller's; they are written only when
 *   the call returns 0 unless a call says otherwise.
 * - Threads: every call may be made from any thread at once on one client, unless
 *   a call says otherwise. No call keeps a caller's buffer past its return.
 */
#ifndef STOKER_STOKER_LL_H
#define STOKER_STOKER_LL_H

#include <stdint.h>
#include <sys/stat.h>

#include "stoker/stoker.h"

#ifdef __cplusplus
extern "C" {
#endif

#define STK_LL_ROOT_INO 1ull
#define STK_LL_NAME_MAX 255 /* bytes in one name */
#define STK_LL_PATH_MAX 4095 /* bytes in a symlink's target */
#define STK_LL_MAX_GROUPS 32 /* supplementary groups sent with a credential */
#define STK_LL_XATTR_SIZE_MAX 65536u /* an attribute's value, and one inode's name list */

/* Who a call acts for. Groups beyond STK_LL_MAX_GROUPS are not sent. */
struct stk_ll_cred {
	uint32_t uid;
	uint32_t gid;
	uint8_t ngroups;
	uint32_t groups[STK_LL_MAX_GROUPS];
};

/*
 * Where a regular file's chunks live: chunks of chunk_size bytes striped over
 * `stripe` chains. Opaque to callers: keep it as an attribute call returned it
 * (stk_ll_remove_data needs it). Zero for anything but a regular file.
 */
struct stk_ll_layout {
	uint32_t chunk_size;
	uint32_t stripe;
	uint32_t nchains;
	uint32_t start;
	uint64_t seed;
};

/* An inode's attributes, as meta read them at one moment. */
struct stk_ll_attr {
	uint64_t ino;
	uint32_t mode; /* S_IFMT type bits and permission bits */
	uint32_t nlink;
	uint32_t uid;
	uint32_t gid;
	uint64_t size;
	int64_t atime_sec;
	uint32_t atime_nsec;
	int64_t mtime_sec;
	uint32_t mtime_nsec;
	int64_t ctime_sec;
	uint32_t ctime_nsec;
	uint64_t blocks; /* 512-byte blocks stored (holes of whole chunks count nothing) */
	struct stk_ll_layout layout;
	uint64_t rdev; /* a character or block device's number (makedev), else 0 */
	/*
	 * The quota root the inode counts in (its inode number; 0: none), as meta
	 * tagged it (stoker.h, stk_quota_set). Pass attributes on as a call returned
	 * them: a file opened with qid 0 is written without asking meta for room.
	 */
	uint64_t qid;
};

/* One directory entry of stk_ll_readdir. mode carries only the type bits. */
struct stk_ll_dirent {
	uint64_t ino;
	uint32_t mode;
	uint64_t next_cookie; /* pass as cookie to list the entries after this one */
	char name[STK_LL_NAME_MAX + 1];
};

/*
 * Fills st from a: st_blksize is the file's chunk size (4 KiB for non-files),
 * st_dev one constant for every Stoker inode. Never fails.
 */
STK_API void stk_ll_attr_to_stat(const struct stk_ll_attr *a, struct stat *st);

/*
 * relatime, Linux's rule: would a read at now_sec (seconds since the epoch) move
 * a's atime? Only when atime is not after mtime or ctime, or is a day old.
 */
static inline int stk_ll_atime_due(const struct stk_ll_attr *a, int64_t now_sec)
{
	return a->atime_sec < a->mtime_sec ||
	       (a->atime_sec == a->mtime_sec && a->atime_nsec <= a->mtime_nsec) ||
	       a->atime_sec < a->ctime_sec ||
	       (a->atime_sec == a->ctime_sec && a->atime_nsec <= a->ctime_nsec) ||
	       now_sec - a->atime_sec >= 24 * 3600;
}

/* 1 if cr's primary group or one of its supplementary groups is gid, else 0. */
STK_API int stk_ll_cred_in_group(const struct stk_ll_cred *cr, uint32_t gid);

/* ---- inode calls ---- */

/*
 * Looks name up in folder parent: *out is the inode it names. Answered from the
 * lease cache when stk_ll_leases_start turned it on and a lease holds.
 * Errors: -ENOENT (no such name), -ENOTDIR (parent is not a folder), -EACCES (no
 * search permission on parent), -EINVAL, -ENAMETOOLONG.
 */
STK_API int stk_ll_lookup(stk_client *c, const struct stk_ll_cred *cred, uint64_t parent,
			  const char *name, struct stk_ll_attr *out);

/*
 * The folder that folder dir sits in, as ".." names it (the root's is the root):
 * for a server that must rebuild a path from an inode number alone, such as a
 * FUSE daemon asked by the kernel to connect an NFS file handle to the tree.
 * Always asks meta (never the lease cache).
 * Errors: -ENOENT (dir is gone), -ENOTDIR (dir is not a folder), -EACCES (no
 * search permission on dir).
 */
STK_API int stk_ll_lookup_parent(stk_client *c, const struct stk_ll_cred *cred, uint64_t dir,
				 struct stk_ll_attr *out);

/*
 * Resolves an absolute path from the root, one stk_ll_lookup per component,
 * following symlinks in every component but the last (and in the last too when
 * follow is 1): *out is the inode the path names, with cred NULL.
 * Errors: -ENOENT, -ENOTDIR, -ELOOP, -ENAMETOOLONG, -EACCES, -EINVAL (not absolute).
 */
STK_API int stk_ll_resolve(stk_client *c, const char *path, int follow, struct stk_ll_attr *out);

/*
 * The quota inode ino counts in (stoker.h, struct stk_quota): what a mount of a
 * folder under a quota reports as its size (statfs). -ENOENT: none.
 */
STK_API int stk_ll_quota_get(stk_client *c, uint64_t ino, struct stk_quota *out);

/* *out is inode ino's attributes. Errors: -ENOENT (no such inode). */
STK_API int stk_ll_getattr(stk_client *c, const struct stk_ll_cred *cred, uint64_t ino,
			   struct stk_ll_attr *out);

#define STK_LL_GETATTRS_MAX 1024u

/*
 * The attributes of n inodes in one call to meta, as of one moment. out and rcs
 * are the caller's arrays of n entries each: rcs[i] is 0 with out[i] filled, or
 * -errno for inode inos[i] alone (-ENOENT: gone). The array entries are written
 * only when the call returns 0.
 * Errors: -EINVAL (n > STK_LL_GETATTRS_MAX), -ENOSYS (a meta too old to batch:
 * ask one by one with stk_ll_getattr).
 */
STK_API int stk_ll_getattrs(stk_client *c, const struct stk_ll_cred *cred, const uint64_t *inos,
			    uint32_t n, struct stk_ll_attr *out, int *rcs);

#define STK_LL_LOOKUPS_MAX 256u

/*
 * Looks up n names of folder parent in one call to meta, as n stk_ll_lookup calls
 * would (and, like them, leaves the answers in the client's lookup cache when meta
 * leases them): what a readdirplus of a batch of names needs, so that opening the
 * files of a listed folder asks meta nothing more. out and rcs are the caller's
 * arrays of n entries each: rcs[i] is 0 with out[i] filled, or -ENOENT (no such
 * name); they are written only when the call returns 0.
 * Errors: -EINVAL (n > STK_LL_LOOKUPS_MAX, a name empty, too long or holding '/'),
 * -EACCES (no search permission on parent), -ENOSYS (a meta too old to batch: look
 * up one by one, or use stk_ll_getattrs).
 */
STK_API int stk_ll_lookups(stk_client *c, const struct stk_ll_cred *cred, uint64_t parent,
			   const char *const *names, uint32_t n, struct stk_ll_attr *out, int *rcs);

/* What stk_ll_setattr changes: any of these, or STK_LL_SETATTR_ATIME_READ alone. */
#define STK_LL_SETATTR_MODE 0x1u
#define STK_LL_SETATTR_UID 0x2u
#define STK_LL_SETATTR_GID 0x4u
#define STK_LL_SETATTR_SIZE 0x8u
#define STK_LL_SETATTR_ATIME 0x10u
#define STK_LL_SETATTR_MTIME 0x20u
#define STK_LL_SETATTR_ATIME_NOW 0x40u
#define STK_LL_SETATTR_MTIME_NOW 0x80u
/* The file was read: atime moves to now if stk_ll_atime_due; ctime stays. */
#define STK_LL_SETATTR_ATIME_READ 0x100u

/*
 * Changes what valid names (STK_LL_SETATTR_* bits) of inode ino, taking the new
 * values from v (mode, uid, gid, size, atime, mtime; v may be NULL when valid
 * needs no value). A size change also cuts or extends the file's chunks on
 * storage. out, if not NULL, receives the attributes after the change.
 * Errors: -ENOENT, -EPERM (not the owner, or chown without privilege), -EACCES,
 * -EISDIR (size of a folder), -EINVAL (a bad bit combination), -EFBIG, -EROFS.
 */
STK_API int stk_ll_setattr(stk_client *c, const struct stk_ll_cred *cred, uint64_t ino,
			   uint32_t valid, const struct stk_ll_attr *v, struct stk_ll_attr *out);

/*
 * Creates regular file name in parent with permission bits mode & 07777 (the
 * umask is the caller's to apply). excl 1: an existing name is -EEXIST; excl 0:
 * an existing entry is returned in *out with *created 0. *created is 1 when this
 * call made the file.
 * Errors: -EEXIST, -ENOENT (parent gone), -ENOTDIR, -EACCES (no write and search
 * permission on parent), -ENOSPC, -EINVAL, -ENAMETOOLONG.
 */
STK_API int stk_ll_create(stk_client *c, const struct stk_ll_cred *cred, uint64_t parent,
			  const char *name, uint32_t mode, int excl, struct stk_ll_attr *out,
			  int *created);

/*
 * As stk_ll_create, and when it returns 0 with a regular file in *out, the caller
 * holds one open reference on it, registered by the same request (no unlink can
 * come between): hand it to stk_ll_open_registered or drop it with
 * stk_ll_unregister. On any error, or a folder or symlink met with excl 0, no
 * reference is held. dir, if not NULL, receives parent's attributes just after
 * the create, or has ino 0 when meta did not send them. Errors: as stk_ll_create.
 */
STK_API int stk_ll_create_open(stk_client *c, const struct stk_ll_cred *cred, uint64_t parent,
			       const char *name, uint32_t mode, int excl, struct stk_ll_attr *out,
			       int *created, struct stk_ll_attr *dir);

/*
 * Makes folder name in parent (permission bits mode & 07777); *out is the new
 * folder. Errors: -EEXIST, -ENOENT, -ENOTDIR, -EACCES, -ENOSPC, -EINVAL,
 * -ENAMETOOLONG.
 */
STK_API int stk_ll_mkdir(stk_client *c, const struct stk_ll_cred *cred, uint64_t parent,
			 const char *name, uint32_t mode, struct stk_ll_attr *out);

/*
 * Removes name from parent; the file's chunks go with its last link.
 * Errors: -ENOENT, -EISDIR (a folder: stk_ll_rmdir), -ENOTDIR, -EACCES, -EPERM
 * (sticky folder, not the owner), -EINVAL, -ENAMETOOLONG.
 */
STK_API int stk_ll_unlink(stk_client *c, const struct stk_ll_cred *cred, uint64_t parent,
			  const char *name);

/*
 * As stk_ll_unlink, but the chunks stay: *after is the inode as the unlink left
 * it. When after->nlink is 0 and after->ino is not 0 (a regular file's last link,
 * open nowhere), the caller removes the chunks with stk_ll_remove_data once it no
 * longer reads them (a FUSE daemon keeps a file unlinked while open readable
 * until its last release). When some client holds the file open, meta keeps it
 * and removes the chunks itself at the last close: after->ino is then 0. dir, if
 * not NULL, is as for stk_ll_create_open. Errors: as stk_ll_unlink.
 */
STK_API int stk_ll_unlink_keep(stk_client *c, const struct stk_ll_cred *cred, uint64_t parent,
			       const char *name, struct stk_ll_attr *after,
			       struct stk_ll_attr *dir);

/* Removes empty folder name. Errors: -ENOENT, -ENOTDIR, -ENOTEMPTY, -EACCES, -EPERM, -EBUSY. */
STK_API int stk_ll_rmdir(stk_client *c, const struct stk_ll_cred *cred, uint64_t parent,
			 const char *name);

#define STK_LL_RENAME_NOREPLACE 0x1u /* the values of RENAME_NOREPLACE, RENAME_EXCHANGE */
#define STK_LL_RENAME_EXCHANGE 0x2u

/*
 * Renames src_parent's src_name to dst_parent's dst_name, atomically, replacing
 * dst_name unless flags say otherwise (STK_LL_RENAME_*). A file it replaces loses
 * its chunks as with stk_ll_unlink.
 * Errors: -ENOENT, -EEXIST (NOREPLACE), -ENOTDIR, -EISDIR, -ENOTEMPTY, -EINVAL (a
 * folder into itself, bad flags), -EACCES, -EPERM, -EXDEV (never across clusters).
 */
STK_API int stk_ll_rename(stk_client *c, const struct stk_ll_cred *cred, uint64_t src_parent,
			  const char *src_name, uint64_t dst_parent, const char *dst_name,
			  uint32_t flags);

/*
 * As stk_ll_rename, but a file the rename replaced keeps its chunks: *replaced is
 * that inode as the rename left it (ino 0 when nothing was replaced, or when meta
 * keeps it because it is open), to handle as after stk_ll_unlink_keep.
 */
STK_API int stk_ll_rename_keep(stk_client *c, const struct stk_ll_cred *cred,
			       uint64_t src_parent, const char *src_name, uint64_t dst_parent,
			       const char *dst_name, uint32_t flags, struct stk_ll_attr *replaced);

/*
 * Gives inode ino (not a folder) the new name name in parent; *out is ino after.
 * Errors: -ENOENT, -EEXIST, -EPERM (a folder), -EMLINK, -EACCES, -ENOTDIR.
 */
STK_API int stk_ll_link(stk_client *c, const struct stk_ll_cred *cred, uint64_t ino,
			uint64_t parent, const char *name, struct stk_ll_attr *out);

/*
 * Makes symlink name in parent pointing at target (1 to STK_LL_PATH_MAX bytes,
 * stored as given). Errors: -EEXIST, -ENOENT, -ENOTDIR, -EACCES, -ENAMETOOLONG.
 */
STK_API int stk_ll_symlink(stk_client *c, const struct stk_ll_cred *cred, uint64_t parent,
			   const char *name, const char *target, struct stk_ll_attr *out);

/*
 * Makes a fifo, socket or device node (mode's type S_IFIFO, S_IFSOCK, S_IFCHR or
 * S_IFBLK; rdev a device's number). A regular file is stk_ll_create's.
 * Errors: -EEXIST, -EINVAL (another type), -EPERM (a device, not root), and those
 * of stk_ll_mkdir.
 */
STK_API int stk_ll_mknod(stk_client *c, const struct stk_ll_cred *cred, uint64_t parent,
			 const char *name, uint32_t mode, uint64_t rdev, struct stk_ll_attr *out);

/*
 * Copies symlink ino's target, NUL-terminated, into buf of len bytes.
 * Errors: -ENOENT, -EINVAL (not a symlink), -ENAMETOOLONG (buf too short).
 */
STK_API int stk_ll_readlink(stk_client *c, const struct stk_ll_cred *cred, uint64_t ino, char *buf,
			    size_t len);

/*
 * Lists folder ino: up to max entries after cookie (0: from the start) into ents,
 * the caller's array of max. *n is the count filled, *eof 1 when the folder has
 * no more. "." and ".." are not listed. A listing is not a snapshot: names added
 * or removed meanwhile may or may not appear, others appear exactly once.
 * Errors: -ENOENT, -ENOTDIR, -EACCES (no read permission), -EINVAL (max 0).
 */
STK_API int stk_ll_readdir(stk_client *c, const struct stk_ll_cred *cred, uint64_t ino,
			   uint64_t cookie, uint32_t max, struct stk_ll_dirent *ents, uint32_t *n,
			   int *eof);

/*
 * Opens a handle on the regular file attr describes (from a lookup or create),
 * to use with stoker.h's file calls and release with stk_close. flags: O_RDONLY,
 * O_WRONLY or O_RDWR, with O_APPEND, O_TRUNC. No permission is checked here: the
 * caller (the kernel, for FUSE) has. Errors: -EISDIR, -EINVAL (not a regular
 * file), -ENOENT.
 */
STK_API int stk_ll_open(stk_client *c, const struct stk_ll_cred *cred,
			const struct stk_ll_attr *attr, int flags, stk_file **out);

/*
 * The first half of an open by inode, for a caller that needs fresh attributes
 * before it opens (close-to-open, a FUSE daemon's keep_cache): registers one open
 * reference on ino and fills *out with the attributes meta read with it, in one
 * request. On 0 the caller holds the reference: stk_ll_open_registered takes it
 * over, stk_ll_unregister drops it. Errors: -ENOENT (no such inode; nothing is
 * registered).
 */
STK_API int stk_ll_open_attr(stk_client *c, const struct stk_ll_cred *cred, uint64_t ino,
			     struct stk_ll_attr *out);

/*
 * As stk_ll_open, on a regular file whose open reference the caller holds
 * (stk_ll_open_attr, stk_ll_create_open, stk_ll_open_ref, stk_ll_open_ref_leased):
 * the handle takes the reference over, on failure too, and drops it at stk_close.
 */
STK_API int stk_ll_open_registered(stk_client *c, const struct stk_ll_cred *cred,
				   const struct stk_ll_attr *attr, int flags, stk_file **out);

/* Drops one open reference the caller holds on ino. Does not wait for meta. */
STK_API void stk_ll_unregister(stk_client *c, uint64_t ino);

/* The inode f is open on. Any thread while f is open. */
STK_API uint64_t stk_ll_file_ino(const stk_file *f);

/*
 * Sets the size a read-only handle reads up to, so that it sees what another
 * handle of this client wrote and has not made durable yet (a FUSE daemon's
 * handles of one inode). Errors: -EBADF (f writes: it keeps its own size).
 */
STK_API int stk_ll_file_set_read_size(stk_file *f, uint64_t size);

#define STK_LL_XATTR_CREATE 0x1u /* the values of XATTR_CREATE, XATTR_REPLACE */
#define STK_LL_XATTR_REPLACE 0x2u

/*
 * Extended attributes of inode ino. name is the full name with its namespace
 * ("user.", "trusted.", "security."), 1 to 255 bytes (-ERANGE otherwise);
 * "system." names (POSIX ACLs) give -EOPNOTSUPP.
 * setxattr: value of size bytes, at most STK_LL_XATTR_SIZE_MAX (-E2BIG); flags 0,
 * STK_LL_XATTR_CREATE (-EEXIST if present) or STK_LL_XATTR_REPLACE (-ENODATA if
 * absent). getxattr and listxattr return the length of the value (of the
 * NUL-separated list of names) and copy it into buf when size > 0 (-ERANGE when
 * it is longer than size); size 0 asks only the length. A missing attribute is
 * -ENODATA. Also -ENOENT, -EACCES, -EPERM (trusted.* and security.* need root).
 */
STK_API int stk_ll_setxattr(stk_client *c, const struct stk_ll_cred *cred, uint64_t ino,
			    const char *name, const void *value, size_t size, uint32_t flags);
STK_API long stk_ll_getxattr(stk_client *c, const struct stk_ll_cred *cred, uint64_t ino,
			     const char *name, void *buf, size_t size);
STK_API long stk_ll_listxattr(stk_client *c, const struct stk_ll_cred *cred, uint64_t ino,
			      char *buf, size_t size);
STK_API int stk_ll_removexattr(stk_client *c, const struct stk_ll_cred *cred, uint64_t ino,
			       const char *name);

/*
 * Removes the chunks of a file whose last link is gone (a's layout and size say
 * where they are), as stk_ll_unlink_keep and stk_ll_rename_keep leave it to the
 * caller. The work is queued for a background thread and this returns 0; when
 * the queue is full the caller's thread does it. A failure is logged (the space
 * is leaked until an fsck) and returned. Nothing is kept of a.
 */
STK_API int stk_ll_remove_data(stk_client *c, const struct stk_ll_attr *a);

/*
 * Makes every namespace change this client was answered so far durable on meta
 * (the batched names are sent first: see stk_ll_names_flush). 0 or -EIO.
 */
STK_API int stk_ll_sync(stk_client *c);

/*
 * Records that inode ino was read, for its atime (relatime): queued and sent to
 * meta within a few milliseconds with other session traffic. 0 when queued;
 * -ENOSYS when there is no queue (sessions off, or a meta without it) and -ENOMEM:
 * the caller then sends stk_ll_setattr with STK_LL_SETATTR_ATIME_READ itself.
 */
STK_API int stk_ll_note_read(stk_client *c, uint64_t ino);

/*
 * Advisory locks on inode ino, as stk_lock and stk_lock_test of stoker.h (same
 * kinds, ranges and owners: a FUSE daemon passes the kernel's lock owner ids),
 * but by inode. With wait 1 a conflict is retried with backoff (10 ms doubling
 * to 250 ms) until granted, until cancelled(ctx) returns nonzero (cancelled may
 * be NULL), or until a signal interrupts the sleep: -EINTR. Without wait a
 * conflict is -EAGAIN. stk_ll_lock_test sets *r to the first conflicting lock, or
 * r->type to STK_LOCK_UN. Errors: -EAGAIN, -EINTR, -EINVAL, -ENOSYS (meta serves
 * no sessions).
 */
STK_API int stk_ll_lock(stk_client *c, uint64_t ino, int kind, const struct stk_lock_range *r,
			uint64_t owner, int wait, int (*cancelled)(void *ctx), void *ctx);
STK_API int stk_ll_lock_test(stk_client *c, uint64_t ino, int kind, struct stk_lock_range *r,
			     uint64_t owner);

/*
 * Streamed reads, for a caller whose bytes the kernel's page cache keeps above
 * the library (a FUSE mount): on 1, reads of 256 KiB and more and sequential
 * reads of chunks stored on this host go from the disk straight into the
 * caller's buffer (O_DIRECT), so the chunk files' pages are neither filled nor
 * copied; on 0 (the default) every read goes through the page cache. Set it
 * before c is shared between threads. Never fails.
 */
STK_API void stk_ll_direct_streams(stk_client *c, int on);

/* ---- leases: the lookup cache and open references ---- */

/*
 * Turns the lease cache on: a background thread keeps a watch open on meta, and
 * from then on stk_ll_lookup answers from memory what meta leased to this client.
 * Call once, before the client is shared between threads. 0 also when
 * $STOKER_LOOKUP_CACHE=0 keeps it off or meta has no leases (the client then goes
 * without). Errors: -ENOMEM, -EAGAIN (no thread could start).
 */
STK_API int stk_ll_leases_start(stk_client *c);

/*
 * 1 when stk_ll_leases_start turned the cache on in this process, else 0 (not
 * started, kept off by $STOKER_LOOKUP_CACHE=0, or a child after fork). The cache
 * may still go without leases later, against a meta that grants none.
 */
STK_API int stk_ll_leases_on(stk_client *c);

/*
 * Inode ino's attributes as a lookup answered them, under a lease on the inode
 * that still holds: 1 with *out filled, 0 when there are none to trust (then
 * *out is untouched). No permission is checked. Never calls meta.
 */
STK_API int stk_ll_leased_attr(stk_client *c, uint64_t ino, struct stk_ll_attr *out);

/*
 * As stk_ll_leased_attr, and on a hit (1) *until_ns is when the attributes stop
 * being trusted unless a revocation (stk_ll_on_revoked_ino) ends them sooner: a
 * CLOCK_MONOTONIC time in nanoseconds, at most about 2 s ahead (the cache's trust
 * in its last watch) and never past the inode's lease. A cache above this one may
 * keep the attributes until then if it also forgets them at every revocation.
 */
STK_API int stk_ll_leased_attr_until(stk_client *c, uint64_t ino, struct stk_ll_attr *out,
				     uint64_t *until_ns);

/*
 * Names whose lease another client's change revoked. fn(ctx, parent, name, ino)
 * is called for each name the cache held for a revoked inode that is not a
 * folder, so that a cache above this one (the kernel's) can drop it too; at most
 * a few dozen per revocation, beyond which names go unreported (the cache above
 * must cope with a stale name anyway). fn runs on the watch thread, before meta
 * commits the change, with the cache's lock held: it must not block and must not
 * call into this client; name is valid only during the call. fn NULL: no more
 * calls; once this returns no call is in progress.
 */
typedef void (*stk_ll_revoked_fn)(void *ctx, uint64_t parent, const char *name, uint64_t ino);
STK_API void stk_ll_on_revoked(stk_client *c, stk_ll_revoked_fn fn, void *ctx);

/*
 * Every inode whose lease another client's change revoked, folders included:
 * fn(ctx, ino) once per inode, on the watch thread, without the cache's lock,
 * after the cache dropped it and before meta is told (so before the change is
 * committed and answered). This is what lets a cache above this one keep
 * attributes it got from stk_ll_leased_attr_until: it forgets them in fn, and the
 * change is visible to nobody until it has. fn may block briefly but must not call
 * into this client. fn NULL: no more calls; once this returns no call is in
 * progress.
 */
typedef void (*stk_ll_revoked_ino_fn)(void *ctx, uint64_t ino);
STK_API void stk_ll_on_revoked_ino(stk_client *c, stk_ll_revoked_ino_fn fn, void *ctx);

/* Counters since stk_ll_leases_start, for a program's metrics. */
struct stk_ll_lease_stats {
	uint64_t hits, misses, revoked, resets;
};
STK_API void stk_ll_leases_stats(stk_client *c, struct stk_ll_lease_stats *out);

/*
 * Registers one open reference on ino with meta, as stk_ll_open_attr does
 * without asking for the attributes the caller already has. attr, if not NULL,
 * receives the attributes meta read with the registration: the return is then 1;
 * 0 means there are none (sessions off, an old meta) and the caller fetches them.
 * The caller holds the reference on 0 and 1 (see stk_ll_open_registered).
 * Errors: -ENOENT (gone; nothing registered).
 */
STK_API int stk_ll_open_ref(stk_client *c, uint64_t ino, struct stk_ll_attr *attr);

/*
 * As stk_ll_open_ref without a round trip, when the lease cache holds ino's
 * attributes (*attr receives them): the reference is registered here and reaches
 * meta within milliseconds, and always before any change that could remove the
 * file. 1: registered (the caller holds it); 0: not (nothing cached, sessions
 * off): use stk_ll_open_ref.
 */
STK_API int stk_ll_open_ref_leased(stk_client *c, uint64_t ino, struct stk_ll_attr *attr);

/* ---- batched names (write-behind of creates and unlinks) ---- */

/*
 * Turns batched names on (needs stk_ll_leases_start first): creates and unlinks
 * of regular files in folders this client made and meta delegated to it are
 * answered at once and sent to meta in batches a millisecond or two later. Every
 * other call this client makes to meta sends the queue first, so meta never sees
 * this client's changes out of order. A client that dies with records queued
 * loses them, as a write-back cache loses data: stk_ll_names_flush (or
 * stk_ll_sync) makes them durable. Call once, before the client is shared.
 * Errors: -ENOMEM, -EAGAIN (no thread could start).
 */
STK_API int stk_ll_names_start(stk_client *c);

/*
 * Creates regular file name (permission bits mode & 07777) in parent if parent
 * is delegated here and name is known to be free: *out is the new file, already
 * in the lease cache. The caller holds no open reference (stk_ll_open_ref_leased).
 * Errors: -EAGAIN: not answered here, ask meta (stk_ll_create_open).
 */
STK_API int stk_ll_names_create(stk_client *c, const struct stk_ll_cred *cred, uint64_t parent,
				const char *name, uint32_t mode, struct stk_ll_attr *out);

/*
 * Removes name from parent if parent is delegated here and name is a regular
 * file with one link that busy(ctx, ino) says the caller has not open (busy runs
 * on this thread, under the queue's lock: it must not call into the client). On 0
 * *ino_out is the inode removed; its chunks are removed with the queue.
 * Errors: -EAGAIN: not answered here, ask meta (stk_ll_unlink_keep).
 */
STK_API int stk_ll_names_unlink(stk_client *c, const struct stk_ll_cred *cred, uint64_t parent,
				const char *name, int (*busy)(void *ctx, uint64_t ino), void *ctx,
				uint64_t *ino_out);

/*
 * Sends everything queued and waits for meta's answers. 0, or -EIO when a record
 * was refused or lost since the last call (each is logged when it happens).
 */
STK_API int stk_ll_names_flush(stk_client *c);

/*
 * Before the first write to inode ino, when ino may have been made by
 * stk_ll_names_create: sends the queue. 0, or -EIO when meta refused ino's create
 * (its bytes would belong to no file).
 */
STK_API int stk_ll_names_settle(stk_client *c, uint64_t ino);

/* 1 when anything is queued, else 0: a cheap look, for callers that must flush first. */
STK_API int stk_ll_names_queued(stk_client *c);

/* Counters since stk_ll_names_start, for a program's metrics. */
struct stk_ll_names_stats {
	uint64_t creates, unlinks, batches, failed;
};
STK_API void stk_ll_names_stats(stk_client *c, struct stk_ll_names_stats *out);

#ifdef __cplusplus
}
#endif
#endif
