/*
 * Advisory locks through meta (stoker.h's stk_lock, session.h's stk_ino_lock).
 *
 * Meta answers a lock request at once, granted or not; a blocking lock is this
 * client retrying with backoff, so no meta thread ever waits on a lock and a
 * waiter is interrupted simply by not asking again. Backoff starts at 10 ms and
 * doubles to 250 ms: a freed lock is picked up within a quarter second.
 */
#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "../common/log.h"
#include "client.h"
#include "session.h"

#define BACKOFF_MIN_MS 10
#define BACKOFF_MAX_MS 250

static int lock_call(stk_client *c, uint64_t ino, int kind, struct stk_lock_range *r,
		     uint64_t owner, int test)
{
	struct stk_msg_meta_lock_req m;
	struct stk_msg_meta_lock_resp rm;
	uint8_t req[128], resp[64];
	struct stk_wbuf w;
	struct stk_rbuf rb;
	size_t len = 0;
	int rc;

	if ((kind != STK_LOCK_POSIX && kind != STK_LOCK_FLOCK) ||
	    (r->type != STK_LOCK_RD && r->type != STK_LOCK_WR && r->type != STK_LOCK_UN) ||
	    (kind == STK_LOCK_POSIX && r->start > r->end))
		return -EINVAL;
	memset(&m, 0, sizeof(m));
	m.session = stk_session_id(c);
	if (!m.session)
		return -ENOSYS;
	m.ino = ino;
	m.owner = owner;
	m.kind = (uint8_t)kind;
	m.type = (uint8_t)r->type;
	m.test = (uint8_t)test;
	m.start = kind == STK_LOCK_FLOCK ? 0 : r->start;
	m.end = kind == STK_LOCK_FLOCK ? STK_LOCK_EOF : r->end;
	m.pid = r->pid;
	stk_wbuf_init(&w, req, sizeof(req));
	stk_msg_meta_lock_req_enc(&w, &m);
	rc = stk_client_meta_call(c, STK_OP_META_LOCK, req, w.len, resp, sizeof(resp), &len);
	if (rc)
		return rc;
	stk_rbuf_init(&rb, resp, len);
	if (stk_msg_meta_lock_resp_dec(&rb, &rm) || stk_rbuf_finish(&rb))
		return -EIO;
	if (test) {
		r->type = rm.type;
		r->start = rm.start;
		r->end = rm.end;
		r->pid = rm.pid;
	}
	return 0;
}

int stk_ino_lock(stk_client *c, uint64_t ino, int kind, const struct stk_lock_range *r,
		 uint64_t owner, int wait, int (*cancelled)(void *), void *ctx)
{
	struct stk_lock_range want = *r;
	unsigned backoff = BACKOFF_MIN_MS;
	int rc;

	for (;;) {
		rc = lock_call(c, ino, kind, &want, owner, 0);
		if (rc != -EAGAIN || !wait || r->type == STK_LOCK_UN)
			return rc;
		if (cancelled && cancelled(ctx))
			return -EINTR;
		struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)backoff * 1000000L};
		if (nanosleep(&ts, NULL) != 0 && errno == EINTR)
			return -EINTR;
		if (cancelled && cancelled(ctx))
			return -EINTR;
		backoff = backoff * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : backoff * 2;
	}
}

int stk_ino_lock_test(stk_client *c, uint64_t ino, int kind, struct stk_lock_range *r,
		      uint64_t owner)
{
	if (r->type == STK_LOCK_UN)
		return -EINVAL;
	return lock_call(c, ino, kind, r, owner, 1);
}
