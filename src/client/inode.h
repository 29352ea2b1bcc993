/*
 * The inode-level client API: metadata calls by inode number, as the FUSE daemon
 * and the gateways need them (the kernel hands FUSE inode numbers, not paths).
 * The path API of stoker.h is built on these.
 *
 * Each call takes the credentials to act with (NULL = the client's own), so that
 * a FUSE daemon serving many users sends each caller's uid, gid and groups and
 * meta enforces permissions for the right person.
 *
 * Returns 0 or -errno as the namesake POSIX call would; transport failures are
 * retried for the client's retry window, then -EIO. Safe from any thread.
 */
#ifndef STK_CLIENT_INODE_H
#define STK_CLIENT_INODE_H

#include <stdint.h>

#include "stoker/stoker.h"

#include "../proto/msg.h"

int stk_ino_lookup(stk_client *c, const struct stk_cred *cred, uint64_t parent, const char *name,
		   struct stk_attr *out);
/* The folder dir is in: a META_LOOKUP of "..", which only meta answers (stoker_ll.h). */
int stk_ino_lookup_parent(stk_client *c, const struct stk_cred *cred, uint64_t dir,
			  struct stk_attr *out);
int stk_ino_getattr(stk_client *c, const struct stk_cred *cred, uint64_t ino, struct stk_attr *out);
/*
 * Attributes of n inodes (at most STK_GETATTRS_MAX) in one call to meta, as of one
 * moment, into the caller's arrays out and rcs of n each (nothing is kept): rcs[i]
 * is 0 with out[i] filled, or -errno for that inode alone (-ENOENT: gone). Returns
 * 0; -EINVAL for n over the limit, -ENOMEM, -EIO for a malformed reply, the call's
 * -errno (-ENOSYS from a meta without META_GETATTRS: the caller asks one by one).
 */
int stk_ino_getattrs(stk_client *c, const struct stk_cred *cred, const uint64_t *inos, uint32_t n,
		     struct stk_attr *out, int *rcs);
/*
 * Looks up n names of folder parent in one META_LOOKUPS (1 to STK_LOOKUPS_MAX), into
 * the caller's arrays out and rcs of n each: rcs[i] is 0 with out[i] filled, or
 * -ENOENT (no such name). When meta leased the answers, the lookup cache keeps
 * them, as after n lookups. Returns 0; -EINVAL (n over the limit, a bad name),
 * -ENOMEM, -EIO (a malformed reply), or the call's -errno (-EACCES: no search
 * permission; -ENOSYS from a meta without META_LOOKUPS).
 */
int stk_ino_lookups(stk_client *c, const struct stk_cred *cred, uint64_t parent,
		    const char *const *names, uint32_t n, struct stk_attr *out, int *rcs);
/*
 * Changes what `valid` names (STK_SETATTR_*), taking values from `v` (mode, uid,
 * gid, size, atime, mtime). A size change also truncates the chunks on storage.
 */
int stk_ino_setattr(stk_client *c, const struct stk_cred *cred, uint64_t ino, uint32_t valid,
		    const struct stk_attr *v, struct stk_attr *out);
/*
 * Creates a regular file (excl: fail with -EEXIST if the name exists; else an
 * existing entry is returned with *created = 0). mode carries permission bits.
 */
int stk_ino_create(stk_client *c, const struct stk_cred *cred, uint64_t parent, const char *name,
		   uint32_t mode, int excl, struct stk_attr *out, int *created);
/*
 * As stk_ino_create, and when it returns 0 with a regular file in *out, the caller
 * holds one open reference of the client's session on it, registered by the same
 * META_CREATE (no unlink comes between), to hand to stk_ino_open_registered or
 * drop with stk_ino_unregister. Anything else (a directory or symlink met without
 * excl, an error) holds none. *dir (if not NULL) becomes the parent folder's
 * attributes just after the create, or has ino 0 when meta did not send them.
 */
int stk_ino_create_open(stk_client *c, const struct stk_cred *cred, uint64_t parent,
			const char *name, uint32_t mode, int excl, struct stk_attr *out,
			int *created, struct stk_attr *dir);
int stk_ino_mkdir(stk_client *c, const struct stk_cred *cred, uint64_t parent, const char *name,
		  uint32_t mode, struct stk_attr *out);
/* Removes a name; removes the file's chunks when it was the last link. */
int stk_ino_unlink(stk_client *c, const struct stk_cred *cred, uint64_t parent, const char *name);
/*
 * As stk_ino_unlink, but leaves the chunks in place: *after is the inode as the
 * unlink left it, and when its nlink is 0 (a regular file's last link) the caller
 * removes the data with stk_client_remove_data once it no longer needs it. The
 * FUSE daemon uses this to keep a file that is unlinked while open readable
 * until its last handle closes. When some client (this one included) has the
 * file open, meta keeps it as an orphan and removes its data itself at the last
 * close: *after then has ino 0, and there is nothing for the caller to do. *dir
 * (if not NULL) is as for stk_ino_create_open.
 */
int stk_ino_unlink_keep(stk_client *c, const struct stk_cred *cred, uint64_t parent,
			const char *name, struct stk_attr *after, struct stk_attr *dir);
int stk_ino_rmdir(stk_client *c, const struct stk_cred *cred, uint64_t parent, const char *name);
/* flags: STK_RENAME_NOREPLACE / STK_RENAME_EXCHANGE. */
int stk_ino_rename(stk_client *c, const struct stk_cred *cred, uint64_t src_parent,
		   const char *src_name, uint64_t dst_parent, const char *dst_name, uint32_t flags);
/*
 * As stk_ino_rename, but a file the rename replaced keeps its chunks: *replaced is
 * its inode (ino 0 when nothing was replaced), to be handled as after
 * stk_ino_unlink_keep.
 */
int stk_ino_rename_keep(stk_client *c, const struct stk_cred *cred, uint64_t src_parent,
			const char *src_name, uint64_t dst_parent, const char *dst_name,
			uint32_t flags, struct stk_attr *replaced);
int stk_ino_link(stk_client *c, const struct stk_cred *cred, uint64_t ino, uint64_t parent,
		 const char *name, struct stk_attr *out);
int stk_ino_symlink(stk_client *c, const struct stk_cred *cred, uint64_t parent, const char *name,
		    const char *target, struct stk_attr *out);
/* A fifo, socket or device node (META_MKNOD; S_IFREG is the caller's to create). */
int stk_ino_mknod(stk_client *c, const struct stk_cred *cred, uint64_t parent, const char *name,
		  uint32_t mode, uint64_t rdev, struct stk_attr *out);
/* Copies the target (NUL-terminated) into buf of len bytes; -ENAMETOOLONG if short. */
int stk_ino_readlink(stk_client *c, const struct stk_cred *cred, uint64_t ino, char *buf,
		     size_t len);
/*
 * Lists up to max entries after `cookie` into ents (which holds max). Sets *n and
 * *eof. Each entry's next_cookie resumes after it.
 */
int stk_ino_readdir(stk_client *c, const struct stk_cred *cred, uint64_t ino, uint64_t cookie,
		    uint32_t max, struct stk_msg_dirent *ents, uint32_t *n, int *eof);
/*
 * Opens a handle on a regular file whose attributes the caller has (from lookup or
 * create). flags: O_RDONLY / O_WRONLY / O_RDWR, O_APPEND, O_TRUNC. No permission
 * check is made here: the caller (the kernel, for FUSE) has done it.
 */
int stk_ino_open(stk_client *c, const struct stk_cred *cred, const struct stk_attr *attr,
		 int flags, stk_file **out);
/*
 * The first half of an open by inode, for a caller that needs fresh attributes
 * before it opens (the FUSE daemon: close-to-open, keep_cache): registers one open
 * reference of the client's session on ino and fills *out with the attributes meta
 * read with it, in one META_OPEN (a META_GETATTR with cred follows only when
 * sessions are off or meta sends no attributes). On 0 the caller holds the
 * reference: stk_ino_open_registered takes it over, stk_ino_unregister drops it.
 * -ENOENT: no such inode (or an orphan no one holds); nothing is then registered.
 */
int stk_ino_open_attr(stk_client *c, const struct stk_cred *cred, uint64_t ino,
		      struct stk_attr *out);
/*
 * As stk_ino_open, on a regular file whose reference the caller holds
 * (stk_ino_open_attr, stk_ino_create_open): the handle takes it over and drops it
 * at stk_close. It is taken over on failure too (and dropped then).
 */
int stk_ino_open_registered(stk_client *c, const struct stk_cred *cred, const struct stk_attr *attr,
			    int flags, stk_file **out);
/* Drops a reference held from stk_ino_open_attr or stk_ino_create_open. Does not wait. */
void stk_ino_unregister(stk_client *c, uint64_t ino);
/*
 * Extended attributes (meta's rules: src/meta/store.h). name: the full name, 1 to
 * 255 bytes (-ERANGE otherwise). setxattr: size at most STK_XATTR_SIZE_MAX (-E2BIG),
 * flags STK_XATTR_CREATE / STK_XATTR_REPLACE. getxattr and listxattr return the
 * length of the value (of the NUL-separated name list) and copy it into buf when
 * size > 0 (-ERANGE if it is longer than size); size 0 only asks the length.
 */
int stk_ino_setxattr(stk_client *c, const struct stk_cred *cred, uint64_t ino, const char *name,
		     const void *value, size_t size, uint32_t flags);
long stk_ino_getxattr(stk_client *c, const struct stk_cred *cred, uint64_t ino, const char *name,
		      void *buf, size_t size);
long stk_ino_listxattr(stk_client *c, const struct stk_cred *cred, uint64_t ino, char *buf,
		       size_t size);
int stk_ino_removexattr(stk_client *c, const struct stk_cred *cred, uint64_t ino,
			const char *name);
/* The inode a handle is open on. */
uint64_t stk_file_ino(const stk_file *f);

#endif
