/*
 * Attributes the mount already holds, for the getattr the kernel sends right
 * after it dropped its own copy (fs.h says when).
 *
 * A small direct-mapped cache: an inode lands in the slot its number hashes to,
 * evicting whatever was there, and is answered from for attr_timeout seconds.
 * Folders (put after a create or an unlink in them): two creates in one folder
 * may reply in either order, and a create or unlink changes only a folder's
 * times, so of two entries for one folder the one with the later ctime stays.
 * Files (put_once at a read-only open): answered once, to the getattr of the
 * first read, and forgotten as soon as anything in this mount may change them.
 *
 * Every other change this mount makes empties the cache (mkdir, rmdir, rename,
 * link, symlink, mknod: they may change two folders or a link count), forgets the
 * files (unlink: a link count), or drops that inode (setattr, xattrs, a writable
 * open, flush, fsync). A put whose call began before such a change is dropped,
 * so that nothing from before it is ever answered after it.
 */
#include "fs.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>

#include "../common/util.h"

static size_t slot_of(uint64_t ino)
{
	return (size_t)((ino * 0x9e3779b97f4a7c15ull) >> 40) % STK_FUSE_ACACHE_SLOTS;
}

void stk_fuse_acache_init(struct stk_fuse_acache *d, double ttl_s)
{
	memset(d, 0, sizeof(*d));
	pthread_mutex_init(&d->lock, NULL);
	d->ttl_ns = ttl_s > 0 ? (uint64_t)(ttl_s * 1e9) : 0;
}

void stk_fuse_acache_destroy(struct stk_fuse_acache *d)
{
	pthread_mutex_destroy(&d->lock);
}

struct stk_fuse_acache_tok stk_fuse_acache_begin(struct stk_fuse_acache *d, uint64_t ino)
{
	struct stk_fuse_acache_tok t;

	pthread_mutex_lock(&d->lock);
	t.gen = d->slot[slot_of(ino)].gen;
	t.files_gen = d->files_gen;
	pthread_mutex_unlock(&d->lock);
	return t;
}

static int ctime_before(const struct stk_attr *a, const struct stk_attr *b)
{
	return a->ctime_sec < b->ctime_sec ||
	       (a->ctime_sec == b->ctime_sec && a->ctime_nsec < b->ctime_nsec);
}

/* Empties slot s, keeping its generation. */
static void slot_empty(struct stk_fuse_acache_slot *s)
{
	uint64_t gen = s->gen;

	memset(s, 0, sizeof(*s));
	s->gen = gen;
}

static void put(struct stk_fuse_acache *d, const struct stk_attr *a, struct stk_fuse_acache_tok t,
		int once)
{
	struct stk_fuse_acache_slot *s = &d->slot[slot_of(a->ino)];

	pthread_mutex_lock(&d->lock);
	if (t.gen == s->gen && !(once && t.files_gen != d->files_gen) &&
	    !(!once && s->a.ino == a->ino && ctime_before(a, &s->a))) {
		s->a = *a;
		s->until_ns = stk_now_ns() + d->ttl_ns;
		s->once = once;
		s->files_gen = d->files_gen;
	}
	pthread_mutex_unlock(&d->lock);
}

void stk_fuse_acache_put_dir(struct stk_fuse_acache *d, const struct stk_attr *a,
			     struct stk_fuse_acache_tok t)
{
	if (d->ttl_ns && a->ino && S_ISDIR(a->mode))
		put(d, a, t, 0);
}

void stk_fuse_acache_put_once(struct stk_fuse_acache *d, const struct stk_attr *a,
			      struct stk_fuse_acache_tok t)
{
	if (d->ttl_ns && a->ino && S_ISREG(a->mode))
		put(d, a, t, 1);
}

int stk_fuse_acache_get(struct stk_fuse_acache *d, uint64_t ino, struct stk_attr *a)
{
	struct stk_fuse_acache_slot *s = &d->slot[slot_of(ino)];
	int rc = -ENOENT;

	if (d->ttl_ns == 0)
		return rc;
	pthread_mutex_lock(&d->lock);
	if (s->a.ino == ino && stk_now_ns() < s->until_ns &&
	    !(s->once && s->files_gen != d->files_gen)) {
		*a = s->a;
		rc = 0;
		if (s->once)
			slot_empty(s);
	}
	pthread_mutex_unlock(&d->lock);
	return rc;
}

void stk_fuse_acache_drop(struct stk_fuse_acache *d, uint64_t ino)
{
	struct stk_fuse_acache_slot *s = &d->slot[slot_of(ino)];

	if (d->ttl_ns == 0)
		return;
	pthread_mutex_lock(&d->lock);
	if (s->a.ino == ino)
		slot_empty(s);
	s->gen++;
	pthread_mutex_unlock(&d->lock);
}

void stk_fuse_acache_forget_files(struct stk_fuse_acache *d)
{
	if (d->ttl_ns == 0)
		return;
	pthread_mutex_lock(&d->lock);
	d->files_gen++;
	pthread_mutex_unlock(&d->lock);
}

void stk_fuse_acache_clear(struct stk_fuse_acache *d)
{
	if (d->ttl_ns == 0)
		return;
	pthread_mutex_lock(&d->lock);
	for (size_t i = 0; i < STK_FUSE_ACACHE_SLOTS; i++) {
		slot_empty(&d->slot[i]);
		d->slot[i].gen++;
	}
	pthread_mutex_unlock(&d->lock);
}
