/*
 * Paths and the operations on them.
 *
 * A path is resolved from the root one component at a time with META_LOOKUP (no
 * dentry cache yet: each component is one round trip to meta). "." and ".." are
 * handled here: ".." goes back to the previous directory of the walk, and at the
 * root stays there, as in the kernel. Symlinks met in the middle of a path are
 * followed, relative ones from the directory that holds them, at most 40 times
 * (-ELOOP after).
 */
#include "client.h"
#include "inode.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../common/host.h"
#include "../common/layout.h"
#include "../common/util.h"

#define STK_MAX_SYMLINKS 40
#define STK_MAX_DEPTH 256

struct walk {
	struct stk_attr stack[STK_MAX_DEPTH]; /* directories from the root down */
	unsigned depth; /* stack[depth - 1] is the current directory */
	unsigned links; /* symlinks followed so far */
	int root_synthetic; /* stack[0] holds only the root's ino and type */
};

/*
 * Starts a walk at the root. Its attributes are not fetched: lookups below it only
 * need its inode number and that it is a directory (meta checks permissions
 * itself), which saves a round trip per path. A walk that ends on the root
 * fetches the real attributes (see finish_root).
 */
static int walk_root(struct stk_client *c, struct walk *wk)
{
	(void)c;
	memset(&wk->stack[0], 0, sizeof(wk->stack[0]));
	wk->stack[0].ino = STK_ROOT_INO;
	wk->stack[0].mode = S_IFDIR | 0755;
	wk->root_synthetic = 1;
	wk->depth = 1;
	return 0;
}

static int finish_root(struct stk_client *c, struct walk *wk)
{
	if (wk->depth != 1 || !wk->root_synthetic)
		return 0;
	wk->root_synthetic = 0;
	return stk_ino_getattr(c, NULL, STK_ROOT_INO, &wk->stack[0]);
}

/*
 * Walks `path` from the walk's current directory. When `last` is not NULL the final
 * component is not looked up but copied there (for create-like operations), and
 * the walk ends at its parent. Otherwise the final inode is pushed on the stack
 * (a non-directory too), following a final symlink only if `follow`.
 */
static int walk_path(struct stk_client *c, struct walk *wk, const char *path, int follow,
		     char *last, int *pushed_final)
{
	const char *p = path;
	int rc;

	if (strlen(path) > STK_PATH_MAX)
		return -ENAMETOOLONG;
	if (*p == '/') {
		rc = walk_root(c, wk);
		if (rc)
			return rc;
	}
	if (last)
		last[0] = 0;
	*pushed_final = 0;
	while (*p) {
		char name[STK_NAME_MAX + 1];
		const char *end;
		size_t n;
		int final;
		struct stk_attr a;

		while (*p == '/')
			p++;
		if (!*p)
			break;
		end = strchr(p, '/');
		n = end ? (size_t)(end - p) : strlen(p);
		if (n > STK_NAME_MAX)
			return -ENAMETOOLONG;
		memcpy(name, p, n);
		name[n] = 0;
		p += n;
		final = 1;
		for (const char *q = p; *q; q++)
			if (*q != '/') {
				final = 0;
				break;
			}
		if (*pushed_final) {
			/* a previous component was a non-directory */
			return -ENOTDIR;
		}
		if (!S_ISDIR(wk->stack[wk->depth - 1].mode))
			return -ENOTDIR;
		if (final && last && strcmp(name, ".") != 0 && strcmp(name, "..") != 0) {
			memcpy(last, name, n + 1);
			return 0;
		}
		if (strcmp(name, ".") == 0)
			continue;
		if (strcmp(name, "..") == 0) {
			if (wk->depth > 1)
				wk->depth--;
			continue;
		}
		rc = stk_ino_lookup(c, NULL, wk->stack[wk->depth - 1].ino, name, &a);
		if (rc)
			return rc;
		if (S_ISLNK(a.mode) && (!final || follow)) {
			char *target;
			if (++wk->links > STK_MAX_SYMLINKS)
				return -ELOOP;
			target = malloc(STK_PATH_MAX + 1);
			if (!target)
				return -ENOMEM;
			rc = stk_ino_readlink(c, NULL, a.ino, target, STK_PATH_MAX + 1);
			if (rc == 0) {
				int inner_final = 0;
				/* The link's target is walked from the link's directory. */
				rc = walk_path(c, wk, target, 1, NULL, &inner_final);
				if (rc == 0 && inner_final && !final &&
				    !S_ISDIR(wk->stack[wk->depth - 1].mode))
					rc = -ENOTDIR;
				if (rc == 0 && inner_final && !final)
					*pushed_final = 0; /* a directory: keep walking from it */
				else if (rc == 0 && inner_final)
					*pushed_final = 1;
			}
			free(target);
			if (rc)
				return rc;
			continue;
		}
		if (wk->depth >= STK_MAX_DEPTH)
			return -ENAMETOOLONG;
		wk->stack[wk->depth++] = a;
		if (!S_ISDIR(a.mode))
			*pushed_final = 1;
	}
	return 0;
}

int stk_client_resolve(struct stk_client *c, const char *path, int follow, struct stk_attr *attr)
{
	struct walk *wk;
	int rc, fin = 0;

	if (!path || path[0] != '/')
		return -EINVAL;
	wk = malloc(sizeof(*wk));
	if (!wk)
		return -ENOMEM;
	wk->links = 0;
	rc = walk_path(c, wk, path, follow, NULL, &fin);
	if (rc == 0)
		rc = finish_root(c, wk);
	if (rc == 0) {
		/* "a/file/" names a directory: a trailing slash on a file is ENOTDIR */
		size_t n = strlen(path);
		if (n > 1 && path[n - 1] == '/' && !S_ISDIR(wk->stack[wk->depth - 1].mode))
			rc = -ENOTDIR;
		else
			*attr = wk->stack[wk->depth - 1];
	}
	free(wk);
	return rc;
}

int stk_client_resolve_parent(struct stk_client *c, const char *path, struct stk_attr *parent,
			      char *name)
{
	struct walk *wk;
	int rc, fin = 0;

	if (!path || path[0] != '/')
		return -EINVAL;
	wk = malloc(sizeof(*wk));
	if (!wk)
		return -ENOMEM;
	wk->links = 0;
	rc = walk_path(c, wk, path, 0, name, &fin);
	if (rc == 0 && name[0] == 0)
		rc = -EINVAL; /* "/" or a path ending in "." or ".." has no last name */
	if (rc == 0 && !S_ISDIR(wk->stack[wk->depth - 1].mode))
		rc = -ENOTDIR;
	if (rc == 0)
		*parent = wk->stack[wk->depth - 1];
	free(wk);
	return rc;
}

int stk_stat(stk_client *c, const char *path, struct stat *st)
{
	struct stk_attr a;
	int rc = stk_client_resolve(c, path, 0, &a);
	if (rc == 0)
		stk_attr_to_stat(&a, st);
	return rc;
}

int stk_mkdir(stk_client *c, const char *path, mode_t mode)
{
	char name[STK_NAME_MAX + 1];
	struct stk_attr parent;
	int rc = stk_client_resolve_parent(c, path, &parent, name);

	if (rc)
		return rc == -EINVAL ? -EEXIST : rc;
	return stk_ino_mkdir(c, NULL, parent.ino, name, mode, NULL);
}

int stk_rmdir(stk_client *c, const char *path)
{
	char name[STK_NAME_MAX + 1];
	struct stk_attr parent;
	int rc = stk_client_resolve_parent(c, path, &parent, name);

	if (rc)
		return rc == -EINVAL ? (strcmp(path, "/") == 0 ? -EBUSY : -EINVAL) : rc;
	return stk_ino_rmdir(c, NULL, parent.ino, name);
}

int stk_unlink(stk_client *c, const char *path)
{
	char name[STK_NAME_MAX + 1];
	struct stk_attr parent;
	int rc = stk_client_resolve_parent(c, path, &parent, name);

	if (rc)
		return rc == -EINVAL ? -EISDIR : rc;
	return stk_ino_unlink(c, NULL, parent.ino, name);
}

int stk_rename(stk_client *c, const char *from, const char *to, unsigned flags)
{
	char sname[STK_NAME_MAX + 1], dname[STK_NAME_MAX + 1];
	struct stk_attr sp, dp;
	int rc;

	if (flags & ~(unsigned)(RENAME_NOREPLACE | RENAME_EXCHANGE))
		return -EINVAL;
	rc = stk_client_resolve_parent(c, from, &sp, sname);
	if (rc)
		return rc == -EINVAL ? -EBUSY : rc;
	rc = stk_client_resolve_parent(c, to, &dp, dname);
	if (rc)
		return rc == -EINVAL ? -EBUSY : rc;
	return stk_ino_rename(c, NULL, sp.ino, sname, dp.ino, dname,
			      (flags & RENAME_NOREPLACE ? STK_RENAME_NOREPLACE : 0) |
				      (flags & RENAME_EXCHANGE ? STK_RENAME_EXCHANGE : 0));
}

int stk_symlink(stk_client *c, const char *target, const char *linkpath)
{
	char name[STK_NAME_MAX + 1];
	struct stk_attr parent;
	int rc = stk_client_resolve_parent(c, linkpath, &parent, name);

	if (rc)
		return rc == -EINVAL ? -EEXIST : rc;
	return stk_ino_symlink(c, NULL, parent.ino, name, target, NULL);
}

int stk_mknod(stk_client *c, const char *path, mode_t mode, dev_t dev)
{
	char name[STK_NAME_MAX + 1];
	struct stk_attr parent;
	int rc;

	/* As mknod(2): a regular file is an exclusive create. */
	if ((mode & S_IFMT) == S_IFREG || (mode & S_IFMT) == 0) {
		stk_file *f;

		rc = stk_open(c, path, O_WRONLY | O_CREAT | O_EXCL, mode & 07777, &f);
		return rc ? rc : stk_close(f);
	}
	rc = stk_client_resolve_parent(c, path, &parent, name);
	if (rc)
		return rc == -EINVAL ? -EEXIST : rc;
	return stk_ino_mknod(c, NULL, parent.ino, name, (uint32_t)mode, (uint64_t)dev, NULL);
}

ssize_t stk_readlink(stk_client *c, const char *path, char *buf, size_t size)
{
	char *target;
	struct stk_attr a;
	size_t n;
	int rc;

	rc = stk_client_resolve(c, path, 0, &a);
	if (rc)
		return rc;
	if (!S_ISLNK(a.mode))
		return -EINVAL;
	target = malloc(STK_PATH_MAX + 1);
	if (!target)
		return -ENOMEM;
	rc = stk_ino_readlink(c, NULL, a.ino, target, STK_PATH_MAX + 1);
	if (rc) {
		free(target);
		return rc;
	}
	n = strlen(target);
	if (size) {
		size_t k = n < size - 1 ? n : size - 1;
		memcpy(buf, target, k);
		buf[k] = 0;
	}
	free(target);
	return (ssize_t)n;
}

int stk_link(stk_client *c, const char *oldpath, const char *newpath)
{
	char name[STK_NAME_MAX + 1];
	struct stk_attr src, parent;
	int rc;

	rc = stk_client_resolve(c, oldpath, 0, &src);
	if (rc)
		return rc;
	rc = stk_client_resolve_parent(c, newpath, &parent, name);
	if (rc)
		return rc == -EINVAL ? -EEXIST : rc;
	return stk_ino_link(c, NULL, src.ino, parent.ino, name, NULL);
}

/* Resolves path (following a final symlink) and changes what valid names. */
static int setattr_path(stk_client *c, const char *path, uint32_t valid, const struct stk_attr *v)
{
	struct stk_attr a;
	int rc = stk_client_resolve(c, path, 1, &a);

	if (rc)
		return rc;
	if (!valid)
		return 0;
	return stk_ino_setattr(c, NULL, a.ino, valid, v, NULL);
}

int stk_chmod(stk_client *c, const char *path, mode_t mode)
{
	struct stk_attr v = {.mode = mode & 07777};
	return setattr_path(c, path, STK_SETATTR_MODE, &v);
}

int stk_chown(stk_client *c, const char *path, uid_t uid, gid_t gid)
{
	struct stk_attr v = {.uid = uid, .gid = gid};
	uint32_t valid = (uid != (uid_t)-1 ? STK_SETATTR_UID : 0) |
			 (gid != (gid_t)-1 ? STK_SETATTR_GID : 0);
	return setattr_path(c, path, valid, &v);
}

/* One of utimens' two times into valid bits and v. -EINVAL for a bad nsec. */
static int time_arg(const struct timespec *t, uint32_t set, uint32_t now, uint32_t *valid,
		    int64_t *sec, uint32_t *nsec)
{
	if (t->tv_nsec == UTIME_NOW) {
		*valid |= now;
	} else if (t->tv_nsec != UTIME_OMIT) {
		if (t->tv_nsec < 0 || t->tv_nsec >= 1000000000)
			return -EINVAL;
		*valid |= set;
		*sec = t->tv_sec;
		*nsec = (uint32_t)t->tv_nsec;
	}
	return 0;
}

int stk_utimens(stk_client *c, const char *path, const struct timespec times[2])
{
	struct stk_attr v = {0};
	uint32_t valid = 0;

	if (!times) {
		valid = STK_SETATTR_ATIME_NOW | STK_SETATTR_MTIME_NOW;
	} else if (time_arg(&times[0], STK_SETATTR_ATIME, STK_SETATTR_ATIME_NOW, &valid,
			    &v.atime_sec, &v.atime_nsec) ||
		   time_arg(&times[1], STK_SETATTR_MTIME, STK_SETATTR_MTIME_NOW, &valid,
			    &v.mtime_sec, &v.mtime_nsec)) {
		return -EINVAL;
	}
	return setattr_path(c, path, valid, &v);
}

int stk_truncate(stk_client *c, const char *path, off_t size)
{
	struct stk_attr v = {.size = (uint64_t)size};

	if (size < 0)
		return -EINVAL;
	return setattr_path(c, path, STK_SETATTR_SIZE, &v);
}

int stk_statfs(stk_client *c, struct statvfs *st)
{
	uint8_t resp[64];
	struct stk_msg_meta_statfs_resp m;
	struct stk_rbuf r;
	struct stk_space sp;
	size_t len = 0;
	int rc;

	rc = stk_client_refresh_routing(c);
	if (rc)
		return rc == -EPROTO ? -EIO : rc;
	rc = stk_client_meta_call(c, STK_OP_META_STATFS, NULL, 0, resp, sizeof(resp), &len);
	if (rc)
		return rc;
	stk_rbuf_init(&r, resp, len);
	if (stk_msg_meta_statfs_resp_dec(&r, &m))
		return -EIO;
	/* Each device once, however many targets (of however many nodes) share it. */
	pthread_rwlock_rdlock(&c->rt_lock);
	rc = stk_host_space_sum(c->rt.targets, c->rt.ntargets, &sp);
	pthread_rwlock_unlock(&c->rt_lock);
	if (rc)
		return rc;
	memset(st, 0, sizeof(*st));
	st->f_bsize = 4096;
	st->f_frsize = 4096;
	st->f_blocks = sp.capacity / 4096;
	st->f_bfree = (sp.capacity > sp.used ? sp.capacity - sp.used : 0) / 4096;
	st->f_bavail = STK_MIN(sp.avail / 4096, st->f_bfree);
	st->f_files = m.files + st->f_bfree; /* inodes are not a fixed pool */
	st->f_ffree = st->f_bfree;
	st->f_favail = st->f_bfree;
	st->f_namemax = STK_NAME_MAX;
	return 0;
}

/* ---- directories ---- */

#define STK_READDIR_BATCH 512

struct stk_dir {
	struct stk_client *c;
	uint64_t ino;
	uint64_t cookie;
	int eof;
	unsigned n, pos;
	struct stk_msg_dirent *ents; /* the current batch */
};

int stk_opendir(stk_client *c, const char *path, stk_dir **out)
{
	struct stk_attr a;
	struct stk_dir *d;
	int rc;

	rc = stk_client_resolve(c, path, 1, &a);
	if (rc)
		return rc;
	if (!S_ISDIR(a.mode))
		return -ENOTDIR;
	d = calloc(1, sizeof(*d));
	if (!d)
		return -ENOMEM;
	d->ents = calloc(STK_READDIR_BATCH, sizeof(*d->ents));
	if (!d->ents) {
		free(d);
		return -ENOMEM;
	}
	d->c = c;
	d->ino = a.ino;
	*out = d;
	return 0;
}

static int fetch_batch(struct stk_dir *d)
{
	uint32_t n = 0;
	int eof = 0, rc;

	rc = stk_ino_readdir(d->c, NULL, d->ino, d->cookie, STK_READDIR_BATCH, d->ents, &n, &eof);
	if (rc)
		return rc;
	d->n = n;
	d->pos = 0;
	d->eof = eof;
	if (n)
		d->cookie = d->ents[n - 1].next_cookie;
	return 0;
}

int stk_readdir(stk_dir *d, struct dirent *ent)
{
	const struct stk_msg_dirent *e;
	int rc;

	while (d->pos >= d->n) {
		if (d->eof)
			return 0;
		rc = fetch_batch(d);
		if (rc)
			return rc;
	}
	e = &d->ents[d->pos++];
	memset(ent, 0, sizeof(*ent));
	ent->d_ino = e->ino;
	ent->d_off = (off_t)e->next_cookie;
	ent->d_type = (unsigned char)IFTODT(e->mode);
	ent->d_reclen = sizeof(*ent);
	memcpy(ent->d_name, e->name, strlen(e->name) + 1);
	return 1;
}

void stk_closedir(stk_dir *d)
{
	if (!d)
		return;
	free(d->ents);
	free(d);
}
