/*
 * The lock table (locks.h): for each inode with locks, an array of the locks
 * held on it, found through a small chained hash on the inode number.
 *
 * An inode has few locks at once (a handful of holders, each with a few ranges),
 * so every operation scans that inode's array: a set builds the new array in one
 * pass (keep what the request does not touch, cut what it covers partly, absorb
 * the holder's same-type neighbours into the new range), then swaps it in. At
 * most one old lock is cut in two, so the new array needs at most two more slots
 * than the old one. An inode whose last lock goes leaves the hash.
 */
#include "locks.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define NBUCKETS 1024

struct lnode {
	uint64_t ino;
	struct lnode *next;
	struct stk_lock *locks;
	size_t n;
};

struct stk_lock_table {
	struct lnode *buckets[NBUCKETS];
};

int stk_locktab_create(struct stk_lock_table **out)
{
	struct stk_lock_table *t = calloc(1, sizeof(*t));

	if (!t)
		return -ENOMEM;
	*out = t;
	return 0;
}

void stk_locktab_destroy(struct stk_lock_table *t)
{
	if (!t)
		return;
	for (size_t b = 0; b < NBUCKETS; b++) {
		struct lnode *n = t->buckets[b], *next;
		for (; n; n = next) {
			next = n->next;
			free(n->locks);
			free(n);
		}
	}
	free(t);
}

static struct lnode **slot_of(struct stk_lock_table *t, uint64_t ino)
{
	struct lnode **p = &t->buckets[(ino * 0x9E3779B97F4A7C15ull) >> 54];

	while (*p && (*p)->ino != ino)
		p = &(*p)->next;
	return p;
}

static int same_holder(const struct stk_lock *a, const struct stk_lock *b)
{
	return a->session == b->session && a->owner == b->owner && a->kind == b->kind;
}

static int overlap(const struct stk_lock *a, uint64_t s, uint64_t e)
{
	return a->start <= e && s <= a->end;
}

static int conflicts(const struct stk_lock *held, const struct stk_lock *want, uint64_t s,
		     uint64_t e)
{
	return held->kind == want->kind && !same_holder(held, want) && overlap(held, s, e) &&
	       (held->type == STK_LOCK_WR || want->type == STK_LOCK_WR);
}

/* The range a request covers: flock locks are always whole-file. */
static int want_range(const struct stk_lock *w, uint64_t *s, uint64_t *e)
{
	if (w->kind != STK_LOCK_POSIX && w->kind != STK_LOCK_FLOCK)
		return -EINVAL;
	if (w->kind == STK_LOCK_FLOCK) {
		*s = 0;
		*e = STK_LOCK_EOF;
		return 0;
	}
	if (w->start > w->end)
		return -EINVAL;
	*s = w->start;
	*e = w->end;
	return 0;
}

static const struct stk_lock *find_conflict(const struct lnode *n, const struct stk_lock *w,
					    uint64_t s, uint64_t e)
{
	for (size_t i = 0; n && i < n->n; i++)
		if (conflicts(&n->locks[i], w, s, e))
			return &n->locks[i];
	return NULL;
}

int stk_locktab_test(struct stk_lock_table *t, uint64_t ino, const struct stk_lock *want,
		  struct stk_lock *conflict)
{
	const struct stk_lock *c;
	uint64_t s, e;

	if (want_range(want, &s, &e) || (want->type != STK_LOCK_RD && want->type != STK_LOCK_WR))
		return 0;
	c = find_conflict(*slot_of(t, ino), want, s, e);
	if (!c)
		return 0;
	if (conflict)
		*conflict = *c;
	return 1;
}

/* Two ranges that touch end to start, without overflow at either end of the file. */
static int adjacent(const struct stk_lock *a, uint64_t s, uint64_t e)
{
	return (a->end != STK_LOCK_EOF && a->end + 1 == s) || (e != STK_LOCK_EOF && e + 1 == a->start);
}

int stk_locktab_set(struct stk_lock_table *t, uint64_t ino, const struct stk_lock *want,
		 struct stk_lock *conflict)
{
	struct lnode **slot = slot_of(t, ino), *n = *slot;
	const struct stk_lock *c;
	struct stk_lock *out;
	size_t k = 0, old_n = n ? n->n : 0;
	uint64_t s, e;
	int rc;

	rc = want_range(want, &s, &e);
	if (rc)
		return rc;
	if (want->type != STK_LOCK_RD && want->type != STK_LOCK_WR && want->type != STK_LOCK_UN)
		return -EINVAL;
	if (want->type != STK_LOCK_UN) {
		c = find_conflict(n, want, s, e);
		if (c) {
			if (conflict)
				*conflict = *c;
			return -EAGAIN;
		}
	}
	if (!n && want->type == STK_LOCK_UN)
		return 0;
	out = malloc((old_n + 2) * sizeof(*out));
	if (!out)
		return -ENOMEM;
	for (size_t i = 0; i < old_n; i++) {
		const struct stk_lock *l = &n->locks[i];

		if (!same_holder(l, want)) {
			out[k++] = *l;
			continue;
		}
		if (want->type != STK_LOCK_UN && l->type == want->type &&
		    (overlap(l, s, e) || adjacent(l, s, e))) {
			/* Absorbed: the new lock grows to cover it. */
			s = l->start < s ? l->start : s;
			e = l->end > e ? l->end : e;
			continue;
		}
		if (!overlap(l, s, e)) {
			out[k++] = *l;
			continue;
		}
		if (l->start < s) {
			out[k] = *l;
			out[k++].end = s - 1;
		}
		if (l->end > e) {
			out[k] = *l;
			out[k++].start = e + 1;
		}
	}
	if (want->type != STK_LOCK_UN) {
		out[k] = *want;
		out[k].start = s;
		out[k++].end = e;
	}
	if (k == 0) {
		free(out);
		if (n) {
			*slot = n->next;
			free(n->locks);
			free(n);
		}
		return 0;
	}
	if (!n) {
		n = calloc(1, sizeof(*n));
		if (!n) {
			free(out);
			return -ENOMEM;
		}
		n->ino = ino;
		*slot = n;
	}
	free(n->locks);
	n->locks = out;
	n->n = k;
	return 0;
}

size_t stk_locktab_drop_session(struct stk_lock_table *t, uint64_t session)
{
	size_t dropped = 0;

	for (size_t b = 0; b < NBUCKETS; b++) {
		struct lnode **p = &t->buckets[b];
		while (*p) {
			struct lnode *n = *p;
			size_t k = 0;
			for (size_t i = 0; i < n->n; i++) {
				if (n->locks[i].session == session)
					dropped++;
				else
					n->locks[k++] = n->locks[i];
			}
			n->n = k;
			if (k == 0) {
				*p = n->next;
				free(n->locks);
				free(n);
			} else {
				p = &n->next;
			}
		}
	}
	return dropped;
}

size_t stk_locktab_list(struct stk_lock_table *t, uint64_t ino, struct stk_lock *out, size_t max)
{
	struct lnode *n = *slot_of(t, ino);

	if (!n)
		return 0;
	for (size_t i = 0; i < n->n && i < max; i++)
		out[i] = n->locks[i];
	return n->n;
}
