/*
 * The open-file table of a mount: a hash of inodes that are open, or were opened
 * recently, in this mount (see fs.h for why it exists).
 *
 * The table lock is taken by open, release, unlink, rename and by every reply
 * that carries attributes, never by read or write: those use the node the handle
 * points to (alive while the handle is) and update the node's atomic size and
 * generation, which the overlay reads. One mutex is enough: each holder does a
 * hash walk and a few stores, and the requests that take it wait for a round
 * trip to meta anyway.
 *
 * Nodes of closed files stay (they remember the attributes of the last open for
 * keep_cache) until the table holds STK_FUSE_NODES_MAX of them; then the closed
 * ones are dropped all at once, which costs only a page-cache refill later.
 */
#include "fs.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../common/log.h"

#define STK_FUSE_BUCKETS 4096u
#define STK_FUSE_NODES_MAX 65536u

static size_t bucket_of(const struct stk_fuse_table *t, uint64_t ino)
{
	return (size_t)((ino * 0x9e3779b97f4a7c15ull) >> 32) & (t->nbuckets - 1);
}

int stk_fuse_table_init(struct stk_fuse_table *t)
{
	memset(t, 0, sizeof(*t));
	t->nbuckets = STK_FUSE_BUCKETS;
	t->buckets = calloc(t->nbuckets, sizeof(*t->buckets));
	if (!t->buckets)
		return -ENOMEM;
	pthread_mutex_init(&t->lock, NULL);
	return 0;
}

static void node_free(struct stk_fuse_node *n)
{
	pthread_mutex_destroy(&n->lock);
	free(n);
}

void stk_fuse_table_destroy(struct stk_fuse_table *t)
{
	if (!t->buckets)
		return;
	for (size_t i = 0; i < t->nbuckets; i++) {
		struct stk_fuse_node *n = t->buckets[i], *next;
		for (; n; n = next) {
			next = n->next;
			node_free(n);
		}
	}
	free(t->buckets);
	t->buckets = NULL;
	pthread_mutex_destroy(&t->lock);
}

/* Called with the lock held. */
static struct stk_fuse_node *find(struct stk_fuse_table *t, uint64_t ino)
{
	struct stk_fuse_node *n = t->buckets[bucket_of(t, ino)];

	while (n && n->ino != ino)
		n = n->next;
	return n;
}

/* Drops every node with nothing open. Called with the lock held. */
static void sweep(struct stk_fuse_table *t)
{
	for (size_t i = 0; i < t->nbuckets; i++) {
		struct stk_fuse_node **pp = &t->buckets[i];
		while (*pp) {
			struct stk_fuse_node *n = *pp;
			if (n->nopen == 0) {
				*pp = n->next;
				node_free(n);
				t->count--;
			} else {
				pp = &n->next;
			}
		}
	}
}

static void unlink_node(struct stk_fuse_table *t, struct stk_fuse_node *n)
{
	struct stk_fuse_node **pp = &t->buckets[bucket_of(t, n->ino)];

	while (*pp && *pp != n)
		pp = &(*pp)->next;
	if (*pp) {
		*pp = n->next;
		t->count--;
	}
}

int stk_fuse_table_open(struct stk_fuse_table *t, struct stk_fuse_fh *fh, const struct stk_ll_attr *a,
			int trunc, int *keep_cache)
{
	struct stk_fuse_node *n;
	int keep, writing;

	pthread_mutex_lock(&t->lock);
	n = find(t, a->ino);
	if (!n) {
		if (t->count >= STK_FUSE_NODES_MAX)
			sweep(t);
		n = calloc(1, sizeof(*n));
		if (!n) {
			pthread_mutex_unlock(&t->lock);
			return -ENOMEM;
		}
		n->ino = a->ino;
		pthread_mutex_init(&n->lock, NULL);
		n->next = t->buckets[bucket_of(t, a->ino)];
		t->buckets[bucket_of(t, a->ino)] = n;
		t->count++;
	}
	pthread_mutex_lock(&n->lock);
	writing = n->wf != NULL;
	pthread_mutex_unlock(&n->lock);
	keep = !trunc && (writing || (n->seen && n->mtime_sec == a->mtime_sec &&
				       n->mtime_nsec == a->mtime_nsec && n->size == a->size));
	n->seen = 1;
	n->mtime_sec = a->mtime_sec;
	n->mtime_nsec = a->mtime_nsec;
	n->size = trunc ? 0 : a->size;
	n->nopen++;
	fh->node = n;
	fh->next = n->handles;
	n->handles = fh;
	pthread_mutex_unlock(&t->lock);
	*keep_cache = keep;
	return 0;
}

/* Drops one open count. Returns 1 with *orphan filled if the orphan's last went. */
static int put_locked(struct stk_fuse_table *t, struct stk_fuse_node *n, struct stk_ll_attr *orphan)
{
	n->nopen--;
	if (n->nopen == 0 && n->orphan) {
		*orphan = n->attr;
		unlink_node(t, n);
		node_free(n);
		return 1;
	}
	return 0;
}

int stk_fuse_table_release(struct stk_fuse_table *t, struct stk_fuse_fh *fh,
			   struct stk_ll_attr *orphan)
{
	struct stk_fuse_node *n = fh->node;
	struct stk_fuse_fh **pp;
	int last_orphan;

	pthread_mutex_lock(&t->lock);
	for (pp = &n->handles; *pp && *pp != fh; pp = &(*pp)->next)
		;
	if (*pp)
		*pp = fh->next;
	if (fh->writable)
		n->seen = 0; /* a write changes mtime: the next open re-reads */
	last_orphan = put_locked(t, n, orphan);
	pthread_mutex_unlock(&t->lock);
	return last_orphan;
}

int stk_fuse_table_is_open(struct stk_fuse_table *t, uint64_t ino)
{
	struct stk_fuse_node *n;
	int open;

	pthread_mutex_lock(&t->lock);
	n = find(t, ino);
	open = n && n->nopen > 0;
	pthread_mutex_unlock(&t->lock);
	return open;
}

struct stk_fuse_node *stk_fuse_table_pin(struct stk_fuse_table *t, uint64_t ino)
{
	struct stk_fuse_node *n;

	pthread_mutex_lock(&t->lock);
	n = find(t, ino);
	if (n && n->nopen)
		n->nopen++;
	else
		n = NULL;
	pthread_mutex_unlock(&t->lock);
	return n;
}

void stk_fuse_table_unpin(struct stk_fuse_table *t, struct stk_fuse_node *n, stk_client *c)
{
	struct stk_ll_attr orphan;
	int last;

	pthread_mutex_lock(&t->lock);
	last = put_locked(t, n, &orphan);
	pthread_mutex_unlock(&t->lock);
	/* The handles closed while we held the pin: the orphan's data is ours to remove. */
	if (last)
		stk_ll_remove_data(c, &orphan);
}

void stk_fuse_table_overlay(struct stk_fuse_table *t, struct stk_ll_attr *a)
{
	struct stk_fuse_node *n;
	uint64_t size = 0;
	int dirty = 0;

	if (!S_ISREG(a->mode))
		return;
	pthread_mutex_lock(&t->lock);
	n = find(t, a->ino);
	if (n && atomic_load(&n->wgen) != atomic_load(&n->synced)) {
		size = atomic_load(&n->wsize);
		dirty = 1;
	}
	pthread_mutex_unlock(&t->lock);
	if (dirty) {
		/* Bytes written past meta's end count; meta's figure stands for the rest. */
		if (size > a->size)
			a->blocks += (size - a->size + 511) / 512;
		a->size = size;
	}
}

int stk_fuse_table_orphan(struct stk_fuse_table *t, const struct stk_ll_attr *a)
{
	struct stk_fuse_node *n;
	int rc = -ENOENT;

	pthread_mutex_lock(&t->lock);
	n = find(t, a->ino);
	if (n && n->nopen > 0) {
		n->orphan = 1;
		n->attr = *a;
		rc = 0;
	}
	pthread_mutex_unlock(&t->lock);
	return rc;
}

int stk_fuse_table_orphan_attr(struct stk_fuse_table *t, uint64_t ino, struct stk_ll_attr *a)
{
	struct stk_fuse_node *n;
	int rc = -ENOENT;

	pthread_mutex_lock(&t->lock);
	n = find(t, ino);
	if (n && n->orphan) {
		*a = n->attr;
		rc = 0;
	}
	pthread_mutex_unlock(&t->lock);
	return rc;
}

unsigned stk_fuse_table_drain(struct stk_fuse_table *t, stk_client *c)
{
	unsigned closed = 0;

	pthread_mutex_lock(&t->lock);
	for (size_t i = 0; i < t->nbuckets; i++) {
		for (struct stk_fuse_node *n = t->buckets[i]; n; n = n->next) {
			struct stk_fuse_fh *fh, *next;
			int rc;
			if (n->wf) {
				rc = stk_close(n->wf);
				if (rc && !n->orphan)
					stk_error("closing inode %llu at unmount: %s",
						  (unsigned long long)n->ino, stk_strerror(rc));
				n->wf = NULL;
				n->wf_refs = 0;
			}
			for (fh = n->handles; fh; fh = next) {
				next = fh->next;
				if (fh->priv)
					stk_close(fh->priv);
				free(fh);
				closed++;
			}
			n->handles = NULL;
			n->nopen = 0;
			if (n->orphan) {
				stk_ll_remove_data(c, &n->attr);
				n->orphan = 0;
			}
		}
	}
	pthread_mutex_unlock(&t->lock);
	return closed;
}
