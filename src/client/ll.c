/*
 * The public low-level API (include/stoker/stoker_ll.h) over the client's
 * internal inode, lease, session and write-behind modules.
 *
 * Why a layer of its own: the internal modules speak the wire's types
 * (struct stk_attr, stk_cred, stk_msg_dirent of src/proto/msg.h), which change
 * with the protocol; the public types are the library's ABI and change only with
 * it. Each call here copies its arguments into the wire's types, calls the
 * internal function and copies the results back: a few hundred bytes per
 * metadata call, next to a round trip to meta or a lookup in the lease cache.
 * The flag values are the wire's, checked at compile time below, so they pass
 * through unchanged.
 */
#include "stoker/stoker_ll.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "../proto/msg.h"
#include "../proto/wire.h"
#include "behind.h"
#include "client.h"
#include "inode.h"
#include "lcache.h"
#include "session.h"

_Static_assert(STK_LL_ROOT_INO == STK_ROOT_INO, "root inode");
_Static_assert(STK_LL_NAME_MAX == STK_NAME_MAX, "name length");
_Static_assert(STK_LL_PATH_MAX == STK_PATH_MAX, "path length");
_Static_assert(STK_LL_MAX_GROUPS == STK_MAX_GROUPS, "groups");
_Static_assert(STK_LL_XATTR_SIZE_MAX == STK_XATTR_SIZE_MAX, "xattr size");
_Static_assert(STK_LL_GETATTRS_MAX == STK_GETATTRS_MAX, "getattrs batch");
_Static_assert(STK_LL_LOOKUPS_MAX == STK_LOOKUPS_MAX, "lookups batch");
_Static_assert(STK_LL_SETATTR_MODE == STK_SETATTR_MODE && STK_LL_SETATTR_UID == STK_SETATTR_UID &&
		       STK_LL_SETATTR_GID == STK_SETATTR_GID &&
		       STK_LL_SETATTR_SIZE == STK_SETATTR_SIZE &&
		       STK_LL_SETATTR_ATIME == STK_SETATTR_ATIME &&
		       STK_LL_SETATTR_MTIME == STK_SETATTR_MTIME &&
		       STK_LL_SETATTR_ATIME_NOW == STK_SETATTR_ATIME_NOW &&
		       STK_LL_SETATTR_MTIME_NOW == STK_SETATTR_MTIME_NOW &&
		       STK_LL_SETATTR_ATIME_READ == STK_SETATTR_ATIME_READ,
	       "setattr bits");
_Static_assert(STK_LL_RENAME_NOREPLACE == STK_RENAME_NOREPLACE &&
		       STK_LL_RENAME_EXCHANGE == STK_RENAME_EXCHANGE,
	       "rename flags");
_Static_assert(STK_LL_XATTR_CREATE == STK_XATTR_CREATE && STK_LL_XATTR_REPLACE == STK_XATTR_REPLACE,
	       "xattr flags");

/* ---- conversions ---- */

static const struct stk_cred *cred_in(const struct stk_ll_cred *in, struct stk_cred *buf)
{
	if (!in)
		return NULL;
	buf->uid = in->uid;
	buf->gid = in->gid;
	buf->ngroups = in->ngroups > STK_MAX_GROUPS ? STK_MAX_GROUPS : in->ngroups;
	memcpy(buf->groups, in->groups, sizeof(buf->groups));
	return buf;
}

/* The fields stk_ll_attr shares with the wire's stk_attr, named once for both ways. */
#define LL_ATTR_FIELDS(X)                                                                          \
	X(ino) X(mode) X(nlink) X(uid) X(gid) X(size) X(atime_sec) X(atime_nsec) X(mtime_sec)    \
	X(mtime_nsec) X(ctime_sec) X(ctime_nsec) X(blocks) X(layout.chunk_size)                   \
	X(layout.stripe) X(layout.nchains) X(layout.start) X(layout.seed) X(rdev) X(qid)
#define LL_COPY(f) o->f = a->f;

static void attr_out(const struct stk_attr *a, struct stk_ll_attr *o)
{
	if (!o)
		return;
	LL_ATTR_FIELDS(LL_COPY)
}

static const struct stk_attr *attr_in(const struct stk_ll_attr *a, struct stk_attr *o)
{
	if (!a)
		return NULL;
	LL_ATTR_FIELDS(LL_COPY)
	return o;
}

/* Copies *a out when rc says the call filled it (0, or 1 for the "found" calls). */
static int done(int rc, const struct stk_attr *a, struct stk_ll_attr *o)
{
	if (rc >= 0)
		attr_out(a, o);
	return rc;
}

/* ---- helpers ---- */

void stk_ll_attr_to_stat(const struct stk_ll_attr *a, struct stat *st)
{
	struct stk_attr w;

	stk_attr_to_stat(attr_in(a, &w), st);
}

int stk_ll_cred_in_group(const struct stk_ll_cred *cr, uint32_t gid)
{
	struct stk_cred w;

	return stk_cred_in_group(cred_in(cr, &w), gid);
}

/* ---- inode calls ---- */

int stk_ll_lookup(stk_client *c, const struct stk_ll_cred *cred, uint64_t parent, const char *name,
		  struct stk_ll_attr *out)
{
	struct stk_cred cw;
	struct stk_attr a;

	return done(stk_ino_lookup(c, cred_in(cred, &cw), parent, name, &a), &a, out);
}

int stk_ll_lookup_parent(stk_client *c, const struct stk_ll_cred *cred, uint64_t dir,
			 struct stk_ll_attr *out)
{
	struct stk_cred cw;
	struct stk_attr a;

	return done(stk_ino_lookup_parent(c, cred_in(cred, &cw), dir, &a), &a, out);
}

int stk_ll_resolve(stk_client *c, const char *path, int follow, struct stk_ll_attr *out)
{
	struct stk_attr a;

	return done(stk_client_resolve(c, path, follow, &a), &a, out);
}

int stk_ll_getattr(stk_client *c, const struct stk_ll_cred *cred, uint64_t ino,
		   struct stk_ll_attr *out)
{
	struct stk_cred cw;
	struct stk_attr a;

	return done(stk_ino_getattr(c, cred_in(cred, &cw), ino, &a), &a, out);
}

int stk_ll_getattrs(stk_client *c, const struct stk_ll_cred *cred, const uint64_t *inos,
		    uint32_t n, struct stk_ll_attr *out, int *rcs)
{
	struct stk_cred cw;
	struct stk_attr *a;
	int rc;

	if (n > STK_GETATTRS_MAX)
		return -EINVAL;
	a = malloc((n ? n : 1) * sizeof(*a));
	if (!a)
		return -ENOMEM;
	rc = stk_ino_getattrs(c, cred_in(cred, &cw), inos, n, a, rcs);
	if (rc == 0)
		for (uint32_t i = 0; i < n; i++)
			if (rcs[i] == 0)
				attr_out(&a[i], &out[i]);
	free(a);
	return rc;
}

int stk_ll_lookups(stk_client *c, const struct stk_ll_cred *cred, uint64_t parent,
		   const char *const *names, uint32_t n, struct stk_ll_attr *out, int *rcs)
{
	struct stk_cred cw;
	struct stk_attr *a;
	int rc;

	if (n > STK_LOOKUPS_MAX || (n && (!names || !out || !rcs)))
		return -EINVAL;
	a = malloc((n ? n : 1) * sizeof(*a));
	if (!a)
		return -ENOMEM;
	rc = stk_ino_lookups(c, cred_in(cred, &cw), parent, names, n, a, rcs);
	if (rc == 0)
		for (uint32_t i = 0; i < n; i++)
			if (rcs[i] == 0)
				attr_out(&a[i], &out[i]);
	free(a);
	return rc;
}

int stk_ll_setattr(stk_client *c, const struct stk_ll_cred *cred, uint64_t ino, uint32_t valid,
		   const struct stk_ll_attr *v, struct stk_ll_attr *out)
{
	struct stk_cred cw;
	struct stk_attr vw, a;
	int rc;

	rc = stk_ino_setattr(c, cred_in(cred, &cw), ino, valid, attr_in(v, &vw), out ? &a : NULL);
	return out ? done(rc, &a, out) : rc;
}

int stk_ll_create(stk_client *c, const struct stk_ll_cred *cred, uint64_t parent,
		  const char *name, uint32_t mode, int excl, struct stk_ll_attr *out, int *created)
{
	struct stk_cred cw;
	struct stk_attr a;

	return done(stk_ino_create(c, cred_in(cred, &cw), parent, name, mode, excl, &a, created),
		    &a, out);
}

int stk_ll_create_open(stk_client *c, const struct stk_ll_cred *cred, uint64_t parent,
		       const char *name, uint32_t mode, int excl, struct stk_ll_attr *out,
		       int *created, struct stk_ll_attr *dir)
{
	struct stk_cred cw;
	struct stk_attr a, d;
	int rc;

	rc = stk_ino_create_open(c, cred_in(cred, &cw), parent, name, mode, excl, &a, created,
				 dir ? &d : NULL);
	if (rc == 0 && dir)
		attr_out(&d, dir);
	return done(rc, &a, out);
}

int stk_ll_mkdir(stk_client *c, const struct stk_ll_cred *cred, uint64_t parent, const char *name,
		 uint32_t mode, struct stk_ll_attr *out)
{
	struct stk_cred cw;
	struct stk_attr a;

	return done(stk_ino_mkdir(c, cred_in(cred, &cw), parent, name, mode, &a), &a, out);
}

int stk_ll_unlink(stk_client *c, const struct stk_ll_cred *cred, uint64_t parent, const char *name)
{
	struct stk_cred cw;

	return stk_ino_unlink(c, cred_in(cred, &cw), parent, name);
}

int stk_ll_unlink_keep(stk_client *c, const struct stk_ll_cred *cred, uint64_t parent,
		       const char *name, struct stk_ll_attr *after, struct stk_ll_attr *dir)
{
	struct stk_cred cw;
	struct stk_attr a, d;
	int rc;

	rc = stk_ino_unlink_keep(c, cred_in(cred, &cw), parent, name, &a, dir ? &d : NULL);
	if (rc == 0 && dir)
		attr_out(&d, dir);
	return done(rc, &a, after);
}

int stk_ll_rmdir(stk_client *c, const struct stk_ll_cred *cred, uint64_t parent, const char *name)
{
	struct stk_cred cw;

	return stk_ino_rmdir(c, cred_in(cred, &cw), parent, name);
}

int stk_ll_rename(stk_client *c, const struct stk_ll_cred *cred, uint64_t src_parent,
		  const char *src_name, uint64_t dst_parent, const char *dst_name, uint32_t flags)
{
	struct stk_cred cw;

	return stk_ino_rename(c, cred_in(cred, &cw), src_parent, src_name, dst_parent, dst_name,
			      flags);
}

int stk_ll_rename_keep(stk_client *c, const struct stk_ll_cred *cred, uint64_t src_parent,
		       const char *src_name, uint64_t dst_parent, const char *dst_name,
		       uint32_t flags, struct stk_ll_attr *replaced)
{
	struct stk_cred cw;
	struct stk_attr a;

	return done(stk_ino_rename_keep(c, cred_in(cred, &cw), src_parent, src_name, dst_parent,
					dst_name, flags, &a),
		    &a, replaced);
}

int stk_ll_link(stk_client *c, const struct stk_ll_cred *cred, uint64_t ino, uint64_t parent,
		const char *name, struct stk_ll_attr *out)
{
	struct stk_cred cw;
	struct stk_attr a;

	return done(stk_ino_link(c, cred_in(cred, &cw), ino, parent, name, &a), &a, out);
}

int stk_ll_symlink(stk_client *c, const struct stk_ll_cred *cred, uint64_t parent,
		   const char *name, const char *target, struct stk_ll_attr *out)
{
	struct stk_cred cw;
	struct stk_attr a;

	return done(stk_ino_symlink(c, cred_in(cred, &cw), parent, name, target, &a), &a, out);
}

int stk_ll_mknod(stk_client *c, const struct stk_ll_cred *cred, uint64_t parent, const char *name,
		 uint32_t mode, uint64_t rdev, struct stk_ll_attr *out)
{
	struct stk_cred cw;
	struct stk_attr a;

	return done(stk_ino_mknod(c, cred_in(cred, &cw), parent, name, mode, rdev, &a), &a, out);
}

int stk_ll_readlink(stk_client *c, const struct stk_ll_cred *cred, uint64_t ino, char *buf,
		    size_t len)
{
	struct stk_cred cw;

	return stk_ino_readlink(c, cred_in(cred, &cw), ino, buf, len);
}

int stk_ll_readdir(stk_client *c, const struct stk_ll_cred *cred, uint64_t ino, uint64_t cookie,
		   uint32_t max, struct stk_ll_dirent *ents, uint32_t *n, int *eof)
{
	struct stk_msg_dirent *w;
	struct stk_cred cw;
	int rc;

	if (max == 0)
		return -EINVAL;
	w = malloc((size_t)max * sizeof(*w));
	if (!w)
		return -ENOMEM;
	rc = stk_ino_readdir(c, cred_in(cred, &cw), ino, cookie, max, w, n, eof);
	if (rc == 0)
		for (uint32_t i = 0; i < *n; i++) {
			ents[i].ino = w[i].ino;
			ents[i].mode = w[i].mode;
			ents[i].next_cookie = w[i].next_cookie;
			memcpy(ents[i].name, w[i].name, sizeof(ents[i].name));
		}
	free(w);
	return rc;
}

int stk_ll_open(stk_client *c, const struct stk_ll_cred *cred, const struct stk_ll_attr *attr,
		int flags, stk_file **out)
{
	struct stk_cred cw;
	struct stk_attr a;

	return stk_ino_open(c, cred_in(cred, &cw), attr_in(attr, &a), flags, out);
}

int stk_ll_open_attr(stk_client *c, const struct stk_ll_cred *cred, uint64_t ino,
		     struct stk_ll_attr *out)
{
	struct stk_cred cw;
	struct stk_attr a;

	return done(stk_ino_open_attr(c, cred_in(cred, &cw), ino, &a), &a, out);
}

int stk_ll_open_registered(stk_client *c, const struct stk_ll_cred *cred,
			   const struct stk_ll_attr *attr, int flags, stk_file **out)
{
	struct stk_cred cw;
	struct stk_attr a;

	return stk_ino_open_registered(c, cred_in(cred, &cw), attr_in(attr, &a), flags, out);
}

void stk_ll_unregister(stk_client *c, uint64_t ino)
{
	stk_ino_unregister(c, ino);
}

uint64_t stk_ll_file_ino(const stk_file *f)
{
	return stk_file_ino(f);
}

int stk_ll_file_set_read_size(stk_file *f, uint64_t size)
{
	return stk_file_set_read_size(f, size);
}

int stk_ll_setxattr(stk_client *c, const struct stk_ll_cred *cred, uint64_t ino, const char *name,
		    const void *value, size_t size, uint32_t flags)
{
	struct stk_cred cw;

	return stk_ino_setxattr(c, cred_in(cred, &cw), ino, name, value, size, flags);
}

long stk_ll_getxattr(stk_client *c, const struct stk_ll_cred *cred, uint64_t ino, const char *name,
		     void *buf, size_t size)
{
	struct stk_cred cw;

	return stk_ino_getxattr(c, cred_in(cred, &cw), ino, name, buf, size);
}

long stk_ll_listxattr(stk_client *c, const struct stk_ll_cred *cred, uint64_t ino, char *buf,
		      size_t size)
{
	struct stk_cred cw;

	return stk_ino_listxattr(c, cred_in(cred, &cw), ino, buf, size);
}

int stk_ll_removexattr(stk_client *c, const struct stk_ll_cred *cred, uint64_t ino,
		       const char *name)
{
	struct stk_cred cw;

	return stk_ino_removexattr(c, cred_in(cred, &cw), ino, name);
}

int stk_ll_remove_data(stk_client *c, const struct stk_ll_attr *a)
{
	struct stk_attr w;

	return stk_client_remove_data(c, attr_in(a, &w));
}

int stk_ll_sync(stk_client *c)
{
	return stk_client_meta_call(c, STK_OP_META_SYNC, NULL, 0, NULL, 0, NULL);
}

int stk_ll_note_read(stk_client *c, uint64_t ino)
{
	return stk_session_note_read(c, ino);
}

void stk_ll_direct_streams(stk_client *c, int on)
{
	c->direct_streams = on ? 1 : 0;
}

int stk_ll_lock(stk_client *c, uint64_t ino, int kind, const struct stk_lock_range *r,
		uint64_t owner, int wait, int (*cancelled)(void *ctx), void *ctx)
{
	return stk_ino_lock(c, ino, kind, r, owner, wait, cancelled, ctx);
}

int stk_ll_lock_test(stk_client *c, uint64_t ino, int kind, struct stk_lock_range *r,
		     uint64_t owner)
{
	return stk_ino_lock_test(c, ino, kind, r, owner);
}

/* ---- leases ---- */

int stk_ll_leases_start(stk_client *c)
{
	return stk_lcache_start(c);
}

int stk_ll_leases_on(stk_client *c)
{
	return c->lc != NULL;
}

int stk_ll_leased_attr(stk_client *c, uint64_t ino, struct stk_ll_attr *out)
{
	struct stk_attr a;
	int rc = stk_lcache_get_ino(c, ino, &a);

	if (rc == 1)
		attr_out(&a, out);
	return rc;
}

int stk_ll_leased_attr_until(stk_client *c, uint64_t ino, struct stk_ll_attr *out,
			     uint64_t *until_ns)
{
	struct stk_attr a;
	int rc = stk_lcache_get_ino_until(c, ino, &a, until_ns);

	if (rc == 1)
		attr_out(&a, out);
	return rc;
}

void stk_ll_on_revoked(stk_client *c, stk_ll_revoked_fn fn, void *ctx)
{
	stk_lcache_on_revoked(c, fn, ctx);
}

void stk_ll_on_revoked_ino(stk_client *c, stk_ll_revoked_ino_fn fn, void *ctx)
{
	stk_lcache_on_revoked_ino(c, fn, ctx);
}

void stk_ll_leases_stats(stk_client *c, struct stk_ll_lease_stats *out)
{
	struct stk_lcache_stats s;

	stk_lcache_stats(c, &s);
	out->hits = s.hits;
	out->misses = s.misses;
	out->revoked = s.revoked;
	out->resets = s.resets;
}

int stk_ll_open_ref(stk_client *c, uint64_t ino, struct stk_ll_attr *attr)
{
	struct stk_attr a;
	int rc = stk_session_open(c, ino, attr ? &a : NULL);

	if (rc == 1)
		attr_out(&a, attr);
	return rc;
}

int stk_ll_open_ref_leased(stk_client *c, uint64_t ino, struct stk_ll_attr *attr)
{
	struct stk_attr a;
	int rc = stk_session_open_cached(c, ino, &a);

	if (rc == 1)
		attr_out(&a, attr);
	return rc;
}

/* ---- batched names ---- */

int stk_ll_names_start(stk_client *c)
{
	return stk_behind_start(c);
}

int stk_ll_names_create(stk_client *c, const struct stk_ll_cred *cred, uint64_t parent,
			const char *name, uint32_t mode, struct stk_ll_attr *out)
{
	struct stk_cred cw;
	struct stk_attr a;

	return done(stk_behind_create(c, cred_in(cred, &cw), parent, name, mode, &a), &a, out);
}

int stk_ll_names_unlink(stk_client *c, const struct stk_ll_cred *cred, uint64_t parent,
			const char *name, int (*busy)(void *ctx, uint64_t ino), void *ctx,
			uint64_t *ino_out)
{
	struct stk_cred cw;

	return stk_behind_unlink(c, cred_in(cred, &cw), parent, name, busy, ctx, ino_out);
}

int stk_ll_names_flush(stk_client *c)
{
	return stk_behind_flush(c);
}

int stk_ll_names_settle(stk_client *c, uint64_t ino)
{
	return stk_behind_settle(c, ino);
}

int stk_ll_names_queued(stk_client *c)
{
	return stk_behind_queued(c) ? 1 : 0;
}

void stk_ll_names_stats(stk_client *c, struct stk_ll_names_stats *out)
{
	struct stk_behind_stats s;

	stk_behind_stats(c, &s);
	out->creates = s.creates;
	out->unlinks = s.unlinks;
	out->batches = s.batches;
	out->failed = s.failed;
}
