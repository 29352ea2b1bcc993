/*
 * flock and POSIX record locks through the mount, held in meta so that they
 * hold across every mount and client of the cluster (client/session.h).
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

#include "../client/session.h"
#include "../common/log.h"

static struct stk_fuse *fs_of(fuse_req_t req)
{
	return fuse_req_userdata(req);
}

/* The file's table node: alive while fi is open. */
static struct stk_fuse_node *node_of(struct fuse_file_info *fi)
{
	return ((struct stk_fuse_fh *)(uintptr_t)fi->fh)->node;
}

static uint64_t ino_of(struct fuse_file_info *fi)
{
	return node_of(fi)->ino;
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
	stk_ino_lock(fs->c, sino, kind, &un, owner, 0, NULL, NULL);
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
		rc = stk_ino_lock_test(fs_of(req)->c, ino_of(fi), STK_LOCK_POSIX, &r, fi->lock_owner);
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
	if (rc == 0 && r.type != STK_LOCK_UN)
		atomic_store(&node_of(fi)->posix_locked, 1);
	if (rc == 0)
		rc = stk_ino_lock(fs_of(req)->c, sino, STK_LOCK_POSIX, &r, fi->lock_owner, sleep,
				  interrupted, req);
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
	rc = stk_ino_lock(fs_of(req)->c, ino_of(fi), STK_LOCK_FLOCK, &r, flock_owner_of(fi),
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
	rc = stk_ino_lock(fs->c, sino, STK_LOCK_POSIX, &r, fi->lock_owner, 0, NULL, NULL);
	if (rc)
		stk_warn("releasing POSIX locks on inode %llu at close: %s",
			 (unsigned long long)sino, stk_strerror(rc));
}

void stk_fuse_locks_release(struct stk_fuse *fs, struct fuse_file_info *fi)
{
	struct stk_lock_range r = {.type = STK_LOCK_UN, .end = STK_LOCK_EOF};
	uint64_t sino;
	int rc;

	if (!fi->flock_release)
		return;
	sino = ino_of(fi);
	rc = stk_ino_lock(fs->c, sino, STK_LOCK_FLOCK, &r, flock_owner_of(fi), 0, NULL, NULL);
	if (rc)
		stk_warn("releasing the flock lock on inode %llu: %s", (unsigned long long)sino,
			 stk_strerror(rc));
}
