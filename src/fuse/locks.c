/*
 * flock and POSIX record locks through the mount, held in meta so that they
 * hold across every mount and client of the cluster (stk_ll_lock, stoker_ll.h).
 *
 * The kernel hands every lock request of a file to us once the daemon offers
 * getlk/setlk/flock (libfuse then asks for FUSE_CAP_POSIX_LOCKS and
 * FUSE_CAP_FLOCK_LOCKS). The owner of a POSIX lock is the kernel's lock owner
 * id (one per process's file table), that of an flock lock the id of the open
 * file description; both are only unique within this mount, which is what the
 * session part of meta's owner key takes care of.
 *
 * flock locks are not keyed by the kernel's id, though: that id is the address
 * of the kernel's struct file, and the release that drops a closed file's flock
 * locks travels in the background, so it may reach us after the same address
 * was handed to a new open that took the lock again; the late release would
 * then drop the new holder's lock and let a third process in. Each open handle
 * carries an owner number of its own instead (fh->flock_owner), never reused.
 *
 * A blocking request (F_SETLKW, flock without LOCK_NB) is retried with backoff
 * in the FUSE thread that received it, and ends with EINTR once the kernel
 * interrupts it (the waiter got a signal): libfuse marks the request and the
 * next retry sees it. Locks are released by the kernel's own requests: unlock,
 * the flush that comes with every close (POSIX locks of that lock owner; we
 * send it to meta only for files this mount has POSIX-locked since their table
 * node was made, node->posix_locked), and the release of
 * the last descriptor of a file description (flock). A killed mount releases
 * them through its session's lease.
 *
 * A read-only open while this mount has never seen a POSIX lock asks the kernel
 * for no flush at its closes (ops.c, open_fh; fs->posix_seen). POSIX locks taken
 * through such a handle are then released at its release instead: its owners
 * are recorded here (fh->nf_owner). The release comes with the last close of
 * the file description, so a process that dup()ed or forked it keeps such locks
 * until the last copy closes, and closing another descriptor of the file does
 * not drop them; every open after the mount's first POSIX lock flushes as usual
 * (docs/mount.md, "Locks").
 */
#include "fs.h"
#include "metrics.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>

#include "../common/log.h"

static struct stk_fuse *fs_of(fuse_req_t req)
{
	return fuse_req_userdata(req);
}

static struct stk_fuse_fh *fh_of(struct fuse_file_info *fi)
{
	return (struct stk_fuse_fh *)(uintptr_t)fi->fh;
}

/* The file's table node: alive while fi is open. */
static struct stk_fuse_node *node_of(struct fuse_file_info *fi)
{
	return fh_of(fi)->node;
}

static uint64_t ino_of(struct fuse_file_info *fi)
{
	return node_of(fi)->ino;
}

/* Guards every handle's nf_owner and nf_n. */
static pthread_mutex_t nf_mu = PTHREAD_MUTEX_INITIALIZER;

/* Records owner as holding POSIX locks through fh, a handle that sends no flush. */
static void noflush_owner(struct stk_fuse_fh *fh, uint64_t owner)
{
	static int warned;
	unsigned i;

	pthread_mutex_lock(&nf_mu);
	for (i = 0; i < fh->nf_n && fh->nf_owner[i] != owner; i++)
		;
	if (i == fh->nf_n && fh->nf_n < STK_FUSE_NOFLUSH_OWNERS)
		fh->nf_owner[fh->nf_n++] = owner;
	else if (i == fh->nf_n && !warned) {
		warned = 1;
		stk_warn("more than %d processes lock inode %llu through one read-only "
			 "descriptor; the others' locks outlive its close (mount with -o flush)",
			 STK_FUSE_NOFLUSH_OWNERS, (unsigned long long)fh->node->ino);
	}
	pthread_mutex_unlock(&nf_mu);
}

static uint64_t flock_owner_of(struct fuse_file_info *fi)
{
	return ((struct stk_fuse_fh *)(uintptr_t)fi->fh)->flock_owner;
}

static void reply_err(fuse_req_t req, int rc)
{
	stk_fuse_metrics_error(rc <= 0 && rc > -4096 ? rc : -EIO);
	fuse_reply_err(req, rc <= 0 && rc > -4096 ? -rc : EIO);
}

static int interrupted(void *req)
{
	return fuse_req_interrupted(req);
}

/* struct flock (l_whence is SEEK_SET from libfuse) to an inclusive range. */
static int range_of(const struct flock *l, struct stk_lock_range *r)
{
	memset(r, 0, sizeof(*r));
	r->type = l->l_type == F_RDLCK ? STK_LOCK_RD : l->l_type == F_WRLCK ? STK_LOCK_WR
									  : STK_LOCK_UN;
	if (l->l_start < 0)
		return -EINVAL;
	r->start = (uint64_t)l->l_start;
	if (l->l_len == 0) {
		r->end = STK_LOCK_EOF;
	} else if (l->l_len > 0) {
		if ((uint64_t)l->l_len - 1 > STK_LOCK_EOF - r->start)
			return -EINVAL;
		r->end = r->start + (uint64_t)l->l_len - 1;
	} else {
		if ((uint64_t)-l->l_len > r->start)
			return -EINVAL;
		r->end = r->start - 1;
		r->start -= (uint64_t)-l->l_len;
	}
	r->pid = l->l_pid > 0 ? (uint32_t)l->l_pid : 0;
	return 0;
}

/*
 * Replies to a granted lock. When the kernel no longer waits for the answer (the
 * waiter died while we polled), nobody would ever unlock it: give it back.
 */
static void reply_granted(struct stk_fuse *fs, fuse_req_t req, uint64_t sino, int kind,
			  const struct stk_lock_range *r, uint64_t owner)
{
	struct stk_lock_range un = *r;

	if (fuse_reply_err(req, 0) == 0)
		return;
	un.type = STK_LOCK_UN;
	stk_ll_lock(fs->c, sino, kind, &un, owner, 0, NULL, NULL);
}

void stk_fuse_getlk(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi, struct flock *lock)
{
	struct stk_lock_range r;
	int rc;

	(void)ino;
	rc = range_of(lock, &r);
	if (rc == 0 && r.type == STK_LOCK_UN)
		rc = -EINVAL;
	if (rc == 0)
		rc = stk_ll_lock_test(fs_of(req)->c, ino_of(fi), STK_LOCK_POSIX, &r, fi->lock_owner);
	if (rc) {
		reply_err(req, rc);
		return;
	}
	if (r.type == STK_LOCK_UN) {
		lock->l_type = F_UNLCK;
	} else {
		lock->l_type = r.type == STK_LOCK_RD ? F_RDLCK : F_WRLCK;
		lock->l_whence = SEEK_SET;
		lock->l_start = (off_t)r.start;
		lock->l_len = r.end == STK_LOCK_EOF ? 0 : (off_t)(r.end - r.start + 1);
		lock->l_pid = (pid_t)r.pid;
	}
	fuse_reply_lock(req, lock);
}

void stk_fuse_setlk(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi, struct flock *lock,
		    int sleep)
{
	struct stk_lock_range r;
	uint64_t sino = ino_of(fi);
	int rc;

	(void)ino;
	rc = range_of(lock, &r);
	if (rc == 0 && r.type != STK_LOCK_UN) {
		atomic_store(&node_of(fi)->posix_locked, 1);
		atomic_store(&fs_of(req)->posix_seen, 1); /* later opens flush */
	}
	if (rc == 0)
		rc = stk_ll_lock(fs_of(req)->c, sino, STK_LOCK_POSIX, &r, fi->lock_owner, sleep,
				  interrupted, req);
	if (rc == 0 && r.type != STK_LOCK_UN && fh_of(fi)->noflush)
		noflush_owner(fh_of(fi), fi->lock_owner);
	if (rc == 0 && r.type != STK_LOCK_UN)
		reply_granted(fs_of(req), req, sino, STK_LOCK_POSIX, &r, fi->lock_owner);
	else
		reply_err(req, rc);
}

void stk_fuse_flock(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi, int op)
{
	struct stk_lock_range r = {.end = STK_LOCK_EOF};
	int rc;

	(void)ino;
	switch (op & ~LOCK_NB) {
	case LOCK_SH:
		r.type = STK_LOCK_RD;
		break;
	case LOCK_EX:
		r.type = STK_LOCK_WR;
		break;
	case LOCK_UN:
		r.type = STK_LOCK_UN;
		break;
	default:
		reply_err(req, -EINVAL);
		return;
	}
	r.pid = (uint32_t)fuse_req_ctx(req)->pid;
	rc = stk_ll_lock(fs_of(req)->c, ino_of(fi), STK_LOCK_FLOCK, &r, flock_owner_of(fi),
			  !(op & LOCK_NB), interrupted, req);
	/* flock(2) says EWOULDBLOCK, which is EAGAIN on Linux. */
	if (rc == 0 && r.type != STK_LOCK_UN)
		reply_granted(fs_of(req), req, ino_of(fi), STK_LOCK_FLOCK, &r, flock_owner_of(fi));
	else
		reply_err(req, rc);
}

void stk_fuse_locks_flush(struct stk_fuse *fs, struct fuse_file_info *fi)
{
	struct stk_lock_range r = {.type = STK_LOCK_UN, .end = STK_LOCK_EOF};
	uint64_t sino = ino_of(fi);
	int rc;

	if (!atomic_load(&node_of(fi)->posix_locked))
		return;
	rc = stk_ll_lock(fs->c, sino, STK_LOCK_POSIX, &r, fi->lock_owner, 0, NULL, NULL);
	if (rc)
		stk_warn("releasing POSIX locks on inode %llu at close: %s",
			 (unsigned long long)sino, stk_strerror(rc));
}

void stk_fuse_locks_release(struct stk_fuse *fs, struct fuse_file_info *fi)
{
	struct stk_lock_range r = {.type = STK_LOCK_UN, .end = STK_LOCK_EOF};
	struct stk_fuse_fh *fh = fh_of(fi);
	uint64_t sino = ino_of(fi), owners[STK_FUSE_NOFLUSH_OWNERS];
	unsigned n;
	int rc;

	/* A handle that sent no flush: the POSIX locks taken through it go now. */
	pthread_mutex_lock(&nf_mu);
	n = fh->nf_n;
	memcpy(owners, fh->nf_owner, sizeof(owners[0]) * n);
	fh->nf_n = 0;
	pthread_mutex_unlock(&nf_mu);
	for (unsigned i = 0; i < n; i++) {
		rc = stk_ll_lock(fs->c, sino, STK_LOCK_POSIX, &r, owners[i], 0, NULL, NULL);
		if (rc)
			stk_warn("releasing POSIX locks on inode %llu at release: %s",
				 (unsigned long long)sino, stk_strerror(rc));
	}
	if (!fi->flock_release)
		return;
	rc = stk_ll_lock(fs->c, sino, STK_LOCK_FLOCK, &r, flock_owner_of(fi), 0, NULL, NULL);
	if (rc)
		stk_warn("releasing the flock lock on inode %llu: %s", (unsigned long long)sino,
			 stk_strerror(rc));
}
