/*
 * Names the kernel must look up again: when meta revokes this mount's lease on an
 * inode (another client renamed over it, removed it, or changed it), the lookup
 * cache reports the name it knew the inode by (stk_ll_on_revoked),
 * and a thread of ours tells the kernel that its entry for that name has expired,
 * so that the next path walk through it asks us (and we ask meta) instead of
 * going on with the inode the name held before, for up to entry_timeout.
 *
 * Why a thread: the kernel takes the folder's lock to expire one of its entries,
 * and a request of the same folder (a lookup, a create) may hold that lock while
 * it waits, through us, for meta, which may be waiting for this very revocation
 * to be acknowledged. So the watch thread only queues the name and goes on to
 * acknowledge; this thread waits for the folder instead. Nothing waits for it.
 *
 * Expire, not invalidate: an expired entry stays until the kernel looks the name
 * up again, so a folder with something mounted on it is not detached. Kernels
 * without it (before 6.2) get the entry invalidated instead.
 *
 * This is the prompt half; the sure half is in ops.c (by_name): an entry that is
 * still stale when used (no lease was held, the queue was full, the kernel walked
 * the name before the entry expired) reaches meta with an inode that is gone,
 * and is answered ESTALE, which makes the kernel look the name up again.
 */
#include "fs.h"

#include <errno.h>
#include <string.h>

#include "../common/log.h"

/* Called by the watch thread with the lookup cache's mutex held: queue only. */
static void revoked(void *ctx, uint64_t parent, const char *name, uint64_t ino)
{
	struct stk_fuse *fs = ctx;
	struct stk_fuse_notify *n = &fs->notify;
	size_t len = strlen(name);

	(void)ino;
	if (len == 0 || len >= sizeof(n->q[0].name))
		return;
	pthread_mutex_lock(&n->mu);
	/* Full: dropped; a stale name is answered ESTALE when used (ops.c). */
	if (!n->stop && n->count < STK_FUSE_NOTIFY_Q) {
		unsigned at = (n->head + n->count) % STK_FUSE_NOTIFY_Q;

		n->q[at].parent = parent;
		memcpy(n->q[at].name, name, len + 1);
		n->count++;
		pthread_cond_signal(&n->cv);
	}
	pthread_mutex_unlock(&n->mu);
}

static void *notify_main(void *arg)
{
	struct stk_fuse *fs = arg;
	struct stk_fuse_notify *n = &fs->notify;
	int expire = 1;

	pthread_mutex_lock(&n->mu);
	for (;;) {
		uint64_t parent;
		char name[sizeof(n->q[0].name)];
		int rc;

		while (!n->stop && n->count == 0)
			pthread_cond_wait(&n->cv, &n->mu);
		if (n->stop)
			break;
		parent = n->q[n->head].parent;
		memcpy(name, n->q[n->head].name, sizeof(name));
		n->head = (n->head + 1) % STK_FUSE_NOTIFY_Q;
		n->count--;
		pthread_mutex_unlock(&n->mu);
		/* The kernel's node id of the folder: the mounted one and node 1 swap. */
		if (parent == fs->root_ino)
			parent = FUSE_ROOT_ID;
		else if (parent == FUSE_ROOT_ID)
			parent = fs->root_ino;
		rc = -ENOSYS;
		if (expire)
			rc = fuse_lowlevel_notify_expire_entry(fs->se, parent, name, strlen(name),
							       FUSE_LL_EXPIRE_ONLY);
		if (rc == -ENOSYS) {
			expire = 0;
			rc = fuse_lowlevel_notify_inval_entry(fs->se, parent, name, strlen(name));
		}
		/* ENOENT: the kernel holds no such entry (never looked up, or dropped). */
		if (rc && rc != -ENOENT)
			stk_debug("expiring the kernel's entry of %s in %llu: %s", name,
				  (unsigned long long)parent, stk_strerror(rc));
		pthread_mutex_lock(&n->mu);
	}
	pthread_mutex_unlock(&n->mu);
	return NULL;
}

int stk_fuse_notify_start(struct stk_fuse *fs)
{
	struct stk_fuse_notify *n = &fs->notify;

	if (n->running)
		return 0;
	pthread_mutex_init(&n->mu, NULL);
	pthread_cond_init(&n->cv, NULL);
	n->head = n->count = 0;
	n->stop = 0;
	if (pthread_create(&n->thr, NULL, notify_main, fs)) {
		pthread_cond_destroy(&n->cv);
		pthread_mutex_destroy(&n->mu);
		return -EAGAIN;
	}
	n->running = 1;
	stk_ll_on_revoked(fs->c, revoked, fs);
	return 0;
}

void stk_fuse_notify_stop(struct stk_fuse *fs)
{
	struct stk_fuse_notify *n = &fs->notify;

	if (!n->running)
		return;
	stk_ll_on_revoked(fs->c, NULL, NULL); /* no call in progress once it returns */
	pthread_mutex_lock(&n->mu);
	n->stop = 1;
	pthread_cond_signal(&n->cv);
	pthread_mutex_unlock(&n->mu);
	pthread_join(n->thr, NULL);
	pthread_cond_destroy(&n->cv);
	pthread_mutex_destroy(&n->mu);
	n->running = 0;
}
