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
 * Told (fs.h): what the kernel was last told of a file, so that an open that finds
 * the same attributes at meta need not drop the kernel's. A note is refused when
 * any change by this mount came after its call began (the kernel may then hold
 * that change's answer instead), and forgotten when two answers differ (the
 * kernel may hold either), at a drop of its inode, at a clear and after an
 * unlink elsewhere (forget_files).
 *
 * Every other change this mount makes empties the cache (mkdir, rmdir, rename,
 * link, symlink, mknod: they may change two folders or a link count), forgets the
 * files (unlink: a link count), or drops that inode (setattr, xattrs, a writable
 * open, flush, fsync). A put whose call began before such a change is dropped,
 * so that nothing from before it is ever answered after it.
 */
#include "fs.h"

#include <errno.h>
#include <stdlib.h>
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
	if (d->ttl_ns)
		d->told = calloc(STK_FUSE_TOLD_SLOTS, sizeof(*d->told)); /* NULL: none kept */
}

void stk_fuse_acache_destroy(struct stk_fuse_acache *d)
{
	pthread_mutex_destroy(&d->lock);
	free(d->told);
	d->told = NULL;
}

static struct stk_fuse_told *told_slot(struct stk_fuse_acache *d, uint64_t ino)
{
	return &d->told[(size_t)((ino * 0x9e3779b97f4a7c15ull) >> 32) % STK_FUSE_TOLD_SLOTS];
}

static int told_is(const struct stk_fuse_told *s, const struct stk_ll_attr *a)
{
	return s->size == a->size && s->mtime_sec == a->mtime_sec &&
	       s->mtime_nsec == a->mtime_nsec && s->ctime_sec == a->ctime_sec &&
	       s->ctime_nsec == a->ctime_nsec;
}

void stk_fuse_acache_told(struct stk_fuse_acache *d, const struct stk_ll_attr *a,
			  struct stk_fuse_acache_tok t)
{
	struct stk_fuse_told *s;

	if (!d->told || !a->ino || !S_ISREG(a->mode))
		return;
	pthread_mutex_lock(&d->lock);
	s = told_slot(d, a->ino);
	if (t.any_gen != d->any_gen ||
	    (s->ino == a->ino && s->files_gen == d->files_gen && !told_is(s, a))) {
		if (s->ino == a->ino)
			memset(s, 0, sizeof(*s));
	} else {
		*s = (struct stk_fuse_told){.ino = a->ino,
					    .size = a->size,
					    .files_gen = d->files_gen,
					    .mtime_sec = a->mtime_sec,
					    .ctime_sec = a->ctime_sec,
					    .mtime_nsec = a->mtime_nsec,
					    .ctime_nsec = a->ctime_nsec};
	}
	pthread_mutex_unlock(&d->lock);
}

int stk_fuse_acache_told_same(struct stk_fuse_acache *d, const struct stk_ll_attr *a)
{
	struct stk_fuse_told *s;
	int same;

	if (!d->told || !a->ino)
		return 0;
	pthread_mutex_lock(&d->lock);
	s = told_slot(d, a->ino);
	same = s->ino == a->ino && s->files_gen == d->files_gen && told_is(s, a);
	pthread_mutex_unlock(&d->lock);
	return same;
}

struct stk_fuse_acache_tok stk_fuse_acache_begin(struct stk_fuse_acache *d, uint64_t ino)
{
	struct stk_fuse_acache_tok t;

	pthread_mutex_lock(&d->lock);
	t.gen = d->slot[slot_of(ino)].gen;
	t.files_gen = d->files_gen;
	t.any_gen = d->any_gen;
	pthread_mutex_unlock(&d->lock);
	return t;
}

static int ctime_before(const struct stk_ll_attr *a, const struct stk_ll_attr *b)
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

static void put(struct stk_fuse_acache *d, const struct stk_ll_attr *a, struct stk_fuse_acache_tok t,
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

void stk_fuse_acache_put_dir(struct stk_fuse_acache *d, const struct stk_ll_attr *a,
			     struct stk_fuse_acache_tok t)
{
	if (d->ttl_ns && a->ino && S_ISDIR(a->mode))
		put(d, a, t, 0);
}

void stk_fuse_acache_put_once(struct stk_fuse_acache *d, const struct stk_ll_attr *a,
			      struct stk_fuse_acache_tok t)
{
	if (d->ttl_ns && a->ino && S_ISREG(a->mode))
		put(d, a, t, 1);
}

int stk_fuse_acache_get(struct stk_fuse_acache *d, uint64_t ino, struct stk_ll_attr *a)
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
	d->any_gen++;
	if (d->told && told_slot(d, ino)->ino == ino)
		memset(told_slot(d, ino), 0, sizeof(struct stk_fuse_told));
	pthread_mutex_unlock(&d->lock);
}

void stk_fuse_acache_forget_files(struct stk_fuse_acache *d)
{
	if (d->ttl_ns == 0)
		return;
	pthread_mutex_lock(&d->lock);
	d->files_gen++;
	d->any_gen++;
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
	d->any_gen++;
	if (d->told)
		memset(d->told, 0, STK_FUSE_TOLD_SLOTS * sizeof(*d->told));
	pthread_mutex_unlock(&d->lock);
}
