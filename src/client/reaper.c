/*
 * The reaper: removes the chunks of files that are gone (last unlink, replaced by
 * a rename, an orphan's last close) in the background, for a meta that does not
 * purge them itself.
 *
 * A meta of this release says in META_STATFS that it purges (STK_STATFS_PURGES):
 * it records the chunks of every file it frees in the transaction that frees it
 * and removes them itself (src/meta/purge.h), so a client killed right after an
 * unlink leaks nothing. Then stk_client_remove_data only closes this process's
 * short-circuit chunk files and queues nothing. The rest of this file is the
 * fallback for an older meta, kept so that a client upgraded before its cluster
 * does not leak what it unlinks:
 *
 * Why: removing a file's data is one STOR_TRUNCATE per chain of its layout, sent
 * one after the other; done inside unlink(2) it made an unlink through the mount
 * cost seven round trips where the namespace change costs one. Nothing waits on
 * the removal: meta has already forgotten the inode, inode numbers are never
 * reused, so no new file can meet the old chunks. The caller hands a copy of the
 * inode's attributes to stk_client_remove_data() and returns.
 *
 * One worker thread per client, started on the first removal, drains a bounded
 * queue in batches: it lets a burst gather for STK_REAPER_GATHER_US, then sends
 * one STOR_TRUNCATES per chain for up to STK_REAPER_BATCH files (W4's 20,000
 * unlinks through the mount went from 80,000 storage requests to 1,636).
 * When the queue is full the caller removes the data itself: a burst of
 * unlinks slows down instead of growing memory (except for the write-behind,
 * which may not wait on meta: its queue grows, stk_client_remove_data_nowait).
 * stk_disconnect() drains what is left before it closes the connections, so a
 * CLI command or a mount that exits cleanly leaves no chunks behind; a crash
 * loses the queue, and those chunks stay on the targets until an fsck collects
 * them (as a crash in the middle of a synchronous removal did before). At
 * disconnect a removal retries an unreachable cluster for at most 15 s, so a
 * hard mount (retry forever) whose cluster is gone still unmounts.
 *
 * After fork() the child has no worker; its copy of the queue belongs to the
 * parent, which removes those files, so the child starts with an empty one.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../common/log.h"
#include "client.h"

#define STK_REAPER_MAX 4096u /* queued removals at most */
#define STK_REAPER_CLOSE_RETRY_MS 15000u
#define STK_REAPER_BATCH 128u /* removals taken off the queue at once, at most */
#define STK_REAPER_GATHER_US 5000u /* how long a removal waits for others to join it */

struct stk_reaper {
	pthread_mutex_t lock;
	pthread_cond_t cond; /* work queued, or stopping */
	pthread_cond_t idle; /* the queue ran empty */
	struct stk_attr *q; /* ring of cap entries */
	unsigned head, count, cap;
	int busy; /* the worker is removing one it took off the queue */
	int stopping;
	int running; /* the worker thread exists */
	pthread_t thread;
};

/* Removes the data of n files: one STOR_TRUNCATES per chain for all of them. */
static int remove_now(struct stk_client *c, const struct stk_attr *a, unsigned n)
{
	int rc = stk_client_remove_data_many(c, a, n);

	if (rc)
		stk_warn("could not remove the data of %u file%s (ino %llx first): %s (space is "
			 "leaked until fsck)",
			 n, n == 1 ? "" : "s", (unsigned long long)a[0].ino, stk_strerror(rc));
	return rc;
}

static void *reaper_main(void *arg)
{
	struct stk_client *c = arg;
	struct stk_reaper *r = c->reaper;
	struct stk_attr one, *batch = malloc(STK_REAPER_BATCH * sizeof(*batch));
	unsigned max = batch ? STK_REAPER_BATCH : 1, n;

	if (!batch)
		batch = &one; /* no memory for a batch: one at a time */
	pthread_mutex_lock(&r->lock);
	for (;;) {
		while (!r->count && !r->stopping)
			pthread_cond_wait(&r->cond, &r->lock);
		if (!r->count)
			break; /* stopping, and nothing left */
		if (r->count < max && !r->stopping) {
			/* let a burst of unlinks gather: one request per chain for all of them */
			pthread_mutex_unlock(&r->lock);
			usleep(STK_REAPER_GATHER_US);
			pthread_mutex_lock(&r->lock);
		}
		for (n = 0; r->count && n < max; n++) {
			batch[n] = r->q[r->head];
			r->head = (r->head + 1) % r->cap;
			r->count--;
		}
		r->busy = 1;
		pthread_mutex_unlock(&r->lock);
		remove_now(c, batch, n);
		pthread_mutex_lock(&r->lock);
		r->busy = 0;
		if (!r->count)
			pthread_cond_broadcast(&r->idle);
	}
	pthread_cond_broadcast(&r->idle);
	pthread_mutex_unlock(&r->lock);
	if (batch != &one)
		free(batch);
	return NULL;
}

int stk_reaper_create(struct stk_client *c)
{
	struct stk_reaper *r = calloc(1, sizeof(*r));

	if (!r)
		return -ENOMEM;
	pthread_mutex_init(&r->lock, NULL);
	pthread_cond_init(&r->cond, NULL);
	pthread_cond_init(&r->idle, NULL);
	c->reaper = r;
	return 0;
}

/* The ring twice as long, its entries in order from 0. With r->lock. 0 or -ENOMEM. */
static int ring_grow(struct stk_reaper *r)
{
	struct stk_attr *q = malloc(2 * (size_t)r->cap * sizeof(*q));

	if (!q)
		return -ENOMEM;
	for (unsigned i = 0; i < r->count; i++)
		q[i] = r->q[(r->head + i) % r->cap];
	free(r->q);
	r->q = q;
	r->head = 0;
	r->cap *= 2;
	return 0;
}

/*
 * may_block 0: the caller holds the write-behind's lock (behind.c), so this must
 * not call meta, which would first send what is behind and wait on that lock:
 * a full queue grows instead of removing the data here, and where it cannot
 * (no memory, no worker) the chunks are left, logged, to meta's purge (a meta
 * of this release removes them anyway) or to fsck.
 */
static int remove_data(struct stk_client *c, const struct stk_attr *a, int may_block)
{
	struct stk_reaper *r = c->reaper;

	/* meta has recorded the purge in the transaction that freed the inode. */
	if (stk_client_meta_purges(c) == 1) {
		stk_client_forget_local(c, a, 1);
		return 0;
	}
	pthread_mutex_lock(&r->lock);
	if (r->stopping)
		goto sync;
	if (!r->q) {
		r->q = malloc(STK_REAPER_MAX * sizeof(*r->q));
		if (!r->q)
			goto sync;
		r->cap = STK_REAPER_MAX;
	}
	if (r->count == r->cap && (may_block || ring_grow(r)))
		goto sync;
	if (!r->running) {
		if (pthread_create(&r->thread, NULL, reaper_main, c) != 0)
			goto sync;
		r->running = 1;
	}
	r->q[(r->head + r->count) % r->cap] = *a;
	r->count++;
	pthread_cond_signal(&r->cond);
	pthread_mutex_unlock(&r->lock);
	return 0;
sync:
	pthread_mutex_unlock(&r->lock);
	if (!may_block) {
		stk_warn("the chunks of removed inode %llu are left to meta's purge or to fsck",
			 (unsigned long long)a->ino);
		return -EAGAIN;
	}
	return remove_now(c, a, 1);
}

int stk_client_remove_data(struct stk_client *c, const struct stk_attr *a)
{
	return remove_data(c, a, 1);
}

int stk_client_remove_data_nowait(struct stk_client *c, const struct stk_attr *a)
{
	return remove_data(c, a, 0);
}

void stk_reaper_wait(struct stk_client *c)
{
	struct stk_reaper *r = c->reaper;

	pthread_mutex_lock(&r->lock);
	while (r->running && (r->count || r->busy))
		pthread_cond_wait(&r->idle, &r->lock);
	pthread_mutex_unlock(&r->lock);
}

void stk_reaper_destroy(struct stk_client *c)
{
	struct stk_reaper *r = c->reaper;

	if (!r)
		return;
	if (c->retry_ms > STK_REAPER_CLOSE_RETRY_MS)
		c->retry_ms = STK_REAPER_CLOSE_RETRY_MS; /* nobody else calls out any more */
	pthread_mutex_lock(&r->lock);
	r->stopping = 1;
	pthread_cond_signal(&r->cond);
	pthread_mutex_unlock(&r->lock);
	if (r->running)
		pthread_join(r->thread, NULL);
	pthread_cond_destroy(&r->idle);
	pthread_cond_destroy(&r->cond);
	pthread_mutex_destroy(&r->lock);
	free(r->q);
	free(r);
	c->reaper = NULL;
}

void stk_reaper_after_fork(struct stk_client *c)
{
	struct stk_reaper *r = c->reaper;

	pthread_mutex_init(&r->lock, NULL);
	pthread_cond_init(&r->cond, NULL);
	pthread_cond_init(&r->idle, NULL);
	r->head = r->count = 0;
	r->busy = r->stopping = r->running = 0;
}
