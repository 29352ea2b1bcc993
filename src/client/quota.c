/*
 * Quotas, the client's side: administration (stk_quota_*, one META_QUOTA each)
 * and the room a writer reserves before its bytes go past the size meta knows
 * (stk_client_quota_room, called by file.c's write paths).
 *
 * Why reservations: file data goes straight to storage, so meta cannot refuse a
 * write it never sees. A handle on a file under a quota (attr.qid != 0) asks meta
 * for room up to a new size before it writes past the room it holds, in steps
 * that grow with the file (an eighth of its size, 1 to 64 MiB), so that most
 * writes cost no round trip. Meta refuses with EDQUOT when the quota has no room
 * for even the write itself; the write then fails before any byte of it leaves,
 * and nothing written before is touched. The sizes reported at fsync and close
 * replace the reservation, and meta drops it at the session's last close of the
 * file, or when the session ends or expires (a crashed writer leaks nothing).
 * A handle on a file without a quota when it was opened never asks.
 */
#include "client.h"
#include "inode.h"
#include "session.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/util.h"

#define STEP_MIN (1ull << 20)
#define STEP_MAX (64ull << 20)

static void quota_from(const struct stk_msg_quota_rec *r, struct stk_quota *q)
{
	memset(q, 0, sizeof(*q));
	q->ino = r->qid;
	q->parent = r->parent;
	snprintf(q->path, sizeof(q->path), "%s", r->path);
	q->limit_bytes = r->limit_bytes;
	q->limit_inodes = r->limit_inodes;
	q->used_bytes = r->used_bytes;
	q->used_inodes = r->used_inodes;
	q->reserved_bytes = r->reserved_bytes;
	q->fixed = r->fixed;
	q->old_bytes = r->old_bytes;
	q->old_inodes = r->old_inodes;
}

/*
 * One META_QUOTA: *resp_out is the decoded reply head, *recs (if not NULL) a
 * malloc'ed array of its records (the caller frees it).
 */
static int quota_call(stk_client *c, const struct stk_msg_meta_quota_req *m,
		      struct stk_msg_meta_quota_resp *head, struct stk_quota **recs)
{
	uint8_t req[512];
	size_t cap = recs ? STK_MAX_PAYLOAD : 256, len = 0;
	uint8_t *resp = malloc(cap);
	struct stk_quota *out = NULL;
	struct stk_rbuf r;
	struct stk_wbuf w;
	int rc;

	if (recs)
		*recs = NULL;
	if (!resp)
		return -ENOMEM;
	stk_wbuf_init(&w, req, sizeof(req));
	rc = stk_msg_meta_quota_req_enc(&w, m);
	if (rc == 0)
		rc = stk_client_meta_call(c, STK_OP_META_QUOTA, req, w.len, resp, cap, &len);
	if (rc)
		goto out;
	stk_rbuf_init(&r, resp, len);
	rc = stk_msg_meta_quota_resp_dec(&r, head) ? -EIO : 0;
	if (rc == 0 && head->n > STK_QUOTA_LIST_MAX)
		rc = -EIO;
	if (rc == 0 && recs && head->n) {
		out = calloc(head->n, sizeof(*out));
		rc = out ? 0 : -ENOMEM;
	}
	for (uint32_t i = 0; rc == 0 && i < head->n; i++) {
		struct stk_msg_quota_rec qr;

		rc = stk_msg_quota_rec_dec(&r, &qr) ? -EIO : 0;
		if (rc == 0 && out)
			quota_from(&qr, &out[i]);
	}
	if (rc == 0 && stk_rbuf_finish(&r))
		rc = -EIO;
	if (rc == 0 && recs) {
		*recs = out;
		out = NULL;
	}
out:
	free(out);
	free(resp);
	return rc;
}

/* The folder path names (symlinks followed), for the calls that name one. */
static int quota_req_path(stk_client *c, const char *path, uint8_t op,
			  struct stk_msg_meta_quota_req *m)
{
	struct stk_attr a;
	int rc;

	memset(m, 0, sizeof(*m));
	m->cred = c->cred;
	m->op = op;
	if (!path)
		return 0;
	rc = stk_client_resolve(c, path, 1, &a);
	if (rc)
		return rc;
	m->ino = a.ino;
	return 0;
}

/* One record's call, *out (may be NULL) its record. */
static int quota_call_one(stk_client *c, const struct stk_msg_meta_quota_req *m,
			  struct stk_quota *out)
{
	struct stk_msg_meta_quota_resp head;
	struct stk_quota *recs = NULL;
	int rc = quota_call(c, m, &head, &recs);

	if (rc == 0 && head.n != 1)
		rc = -EIO;
	if (rc == 0 && out)
		*out = recs[0];
	free(recs);
	return rc;
}

int stk_quota_set(stk_client *c, const char *path, uint64_t limit_bytes, uint64_t limit_inodes,
		  unsigned which, struct stk_quota *out)
{
	struct stk_msg_meta_quota_req m;
	int rc;

	if (!c || !path || !which || (which & ~(STK_QUOTA_BYTES | STK_QUOTA_INODES)))
		return -EINVAL;
	rc = quota_req_path(c, path, STK_QUOTA_SET, &m);
	if (rc)
		return rc;
	m.limit_bytes = limit_bytes;
	m.limit_inodes = limit_inodes;
	if (!(which & STK_QUOTA_BYTES))
		m.flags |= STK_QUOTA_KEEP_BYTES;
	if (!(which & STK_QUOTA_INODES))
		m.flags |= STK_QUOTA_KEEP_INODES;
	return quota_call_one(c, &m, out);
}

int stk_quota_rm(stk_client *c, const char *path)
{
	struct stk_msg_meta_quota_resp head;
	struct stk_msg_meta_quota_req m;
	int rc;

	if (!c || !path)
		return -EINVAL;
	rc = quota_req_path(c, path, STK_QUOTA_RM, &m);
	return rc ? rc : quota_call(c, &m, &head, NULL);
}

int stk_quota_get(stk_client *c, const char *path, struct stk_quota *out)
{
	struct stk_msg_meta_quota_req m;
	int rc;

	if (!c || !path || !out)
		return -EINVAL;
	rc = quota_req_path(c, path, STK_QUOTA_GET, &m);
	return rc ? rc : quota_call_one(c, &m, out);
}

int stk_ll_quota_get(stk_client *c, uint64_t ino, struct stk_quota *out)
{
	struct stk_msg_meta_quota_req m;

	if (!c || !out)
		return -EINVAL;
	memset(&m, 0, sizeof(m));
	m.cred = c->cred;
	m.op = STK_QUOTA_GET;
	m.ino = ino;
	return quota_call_one(c, &m, out);
}

int stk_quota_list(stk_client *c, struct stk_quota **out, size_t *n)
{
	struct stk_msg_meta_quota_resp head;
	struct stk_msg_meta_quota_req m;
	struct stk_quota *all = NULL, *page;
	size_t k = 0;
	int rc;

	if (!c || !out || !n)
		return -EINVAL;
	memset(&m, 0, sizeof(m));
	m.cred = c->cred;
	m.op = STK_QUOTA_LIST;
	do {
		struct stk_quota *grown;

		rc = quota_call(c, &m, &head, &page);
		if (rc)
			break;
		grown = head.n ? realloc(all, (k + head.n) * sizeof(*all)) : all;
		if (head.n && !grown) {
			free(page);
			rc = -ENOMEM;
			break;
		}
		all = grown;
		if (head.n)
			memcpy(all + k, page, head.n * sizeof(*all));
		k += head.n;
		free(page);
		/* The next page starts after the last quota root of this one. */
		m.ino = k ? all[k - 1].ino + 1 : 0;
	} while (head.more && head.n);
	if (rc) {
		free(all);
		return rc;
	}
	*out = all;
	*n = k;
	return 0;
}

int stk_quota_recount(stk_client *c, const char *path, struct stk_quota **out, size_t *n)
{
	struct stk_msg_meta_quota_resp head;
	struct stk_msg_meta_quota_req m;
	int rc;

	if (!c || !out || !n)
		return -EINVAL;
	rc = quota_req_path(c, path, STK_QUOTA_RECOUNT, &m);
	if (rc == 0)
		rc = quota_call(c, &m, &head, out);
	if (rc == 0)
		*n = head.n;
	return rc;
}

int stk_client_quota_room(stk_client *c, uint64_t ino, uint64_t need, uint64_t *granted)
{
	struct stk_msg_meta_quota_resp head;
	struct stk_msg_meta_quota_req m;
	uint64_t step = STK_MIN(STK_MAX(need / 8, STEP_MIN), STEP_MAX);
	int rc;

	/*
	 * Meta drops a reservation at the session's last close of the file: the
	 * open it drops it for must have reached meta first (an open on a lease may
	 * not have yet).
	 */
	stk_session_sync_opens(c);
	memset(&m, 0, sizeof(m));
	m.cred = c->cred;
	m.op = STK_QUOTA_RESERVE;
	m.session = stk_session_id(c);
	m.ino = ino;
	m.size = need;
	m.want = need > UINT64_MAX - step ? UINT64_MAX : need + step;
	rc = quota_call(c, &m, &head, NULL);
	if (rc == 0)
		*granted = head.granted;
	return rc;
}
