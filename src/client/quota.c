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
#include "stoker/stoker_ll.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

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

static void paths_up(stk_client *c, struct stk_quota *q, size_t n);

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
	rc = quota_call_one(c, &m, out);
	if (rc == 0 && out)
		paths_up(c, out, 1);
	return rc;
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
	if (rc == 0)
		rc = quota_call_one(c, &m, out);
	if (rc == 0)
		paths_up(c, out, 1);
	return rc;
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

/*
 * Each shard keeps the quotas of its own folders (docs/quotas.md, "Several
 * shards"): a list goes through shard 1's, then shard 2's from its first inode
 * number on, and so on until a shard the cluster does not have (ENOENT).
 */
static uint64_t shard_first_ino(unsigned shard)
{
	return (uint64_t)(shard - 1) << STK_INO_SHARD_SHIFT;
}

#define PATH_UP_DEPTH 256 /* folders above a quota root named from here, at most */
#define PATH_UP_PAGE 64

/*
 * The last folder listed by path_up, by inode number: the quota roots of a list
 * mostly share their parents (top-level folders spread over the shards), so each
 * parent is listed once per list, not once per quota.
 */
struct listed {
	uint64_t dir; /* 0: none */
	size_t n, cap;
	uint64_t *ino;
	char **name;
};

static void listed_clear(struct listed *l)
{
	for (size_t i = 0; i < l->n; i++)
		free(l->name[i]);
	free(l->ino);
	free(l->name);
	memset(l, 0, sizeof(*l));
}

static int listed_fill(stk_client *c, const struct stk_ll_cred *cred, uint64_t dir,
		       struct listed *l)
{
	struct stk_ll_dirent *ents = calloc(PATH_UP_PAGE, sizeof(*ents));
	uint64_t cookie = 0;
	int eof = 0, rc = ents ? 0 : -ENOMEM;

	listed_clear(l);
	while (rc == 0 && !eof) {
		uint32_t got = 0;

		rc = stk_ll_readdir(c, cred, dir, cookie, PATH_UP_PAGE, ents, &got, &eof);
		for (uint32_t i = 0; rc == 0 && i < got; i++) {
			if (!S_ISDIR(ents[i].mode))
				continue;
			if (l->n == l->cap) {
				size_t cap = l->cap ? 2 * l->cap : 64;
				uint64_t *ino = realloc(l->ino, cap * sizeof(*ino));
				char **name = ino ? realloc(l->name, cap * sizeof(*name)) : NULL;

				if (ino)
					l->ino = ino;
				if (name)
					l->name = name;
				if (!ino || !name) {
					rc = -ENOMEM;
					break;
				}
				l->cap = cap;
			}
			l->name[l->n] = strdup(ents[i].name);
			if (!l->name[l->n]) {
				rc = -ENOMEM;
				break;
			}
			l->ino[l->n++] = ents[i].ino;
		}
		if (got)
			cookie = ents[got - 1].next_cookie;
	}
	free(ents);
	if (rc)
		listed_clear(l);
	else
		l->dir = dir;
	return rc;
}

/*
 * The path of folder ino, found from here: the meta of a quota root on shard
 * k > 1 cannot name the folders above it that other shards hold, so its record
 * comes without one. Each folder's parent by "..", its name by the parent's
 * listing, up to the root, as the caller sees them. 0, or -errno (the record
 * keeps no path).
 */
static int path_up(stk_client *c, struct listed *l, uint64_t ino, char *buf, size_t len)
{
	struct stk_ll_cred cred = {.uid = c->cred.uid, .gid = c->cred.gid};
	char *end = buf + len, *p = end;
	int rc = 0;

	if (len < 2)
		return -ERANGE;
	*--p = 0;
	for (unsigned depth = 0; rc == 0 && ino != STK_ROOT_INO; depth++) {
		struct stk_ll_attr up;
		const char *name = NULL;
		size_t nl;

		if (depth == PATH_UP_DEPTH)
			return -ELOOP;
		rc = stk_ll_lookup_parent(c, &cred, ino, &up);
		if (rc == 0 && l->dir != up.ino)
			rc = listed_fill(c, &cred, up.ino, l);
		for (size_t i = 0; rc == 0 && i < l->n && !name; i++)
			if (l->ino[i] == ino)
				name = l->name[i];
		if (rc == 0 && !name)
			rc = -ENOENT; /* moved meanwhile */
		if (rc)
			break;
		nl = strlen(name);
		if ((size_t)(p - buf) < nl + 2)
			return -ERANGE;
		p -= nl;
		memcpy(p, name, nl);
		*--p = '/';
		ino = up.ino;
	}
	if (rc)
		return rc;
	if (!*p)
		*--p = '/';
	memmove(buf, p, (size_t)(end - p));
	return 0;
}

/* Records of other shards' quota roots get their paths from here (path_up). */
static void paths_up(stk_client *c, struct stk_quota *q, size_t n)
{
	struct listed l = {0};

	for (size_t i = 0; i < n; i++)
		if (!q[i].path[0] && stk_ino_shard(q[i].ino) > 1 &&
		    path_up(c, &l, q[i].ino, q[i].path, sizeof(q[i].path)))
			q[i].path[0] = 0;
	listed_clear(&l);
}

int stk_quota_list(stk_client *c, struct stk_quota **out, size_t *n)
{
	struct stk_msg_meta_quota_resp head;
	struct stk_msg_meta_quota_req m;
	struct stk_quota *all = NULL, *page;
	unsigned shard = 1;
	size_t k = 0;
	int rc;

	if (!c || !out || !n)
		return -EINVAL;
	memset(&m, 0, sizeof(m));
	m.cred = c->cred;
	m.op = STK_QUOTA_LIST;
	for (;;) {
		struct stk_quota *grown;

		rc = quota_call(c, &m, &head, &page);
		if (rc == -ENOENT && shard > 1) { /* no such shard: all were listed */
			rc = 0;
			break;
		}
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
		if (head.more && head.n) {
			m.ino = all[k - 1].ino + 1;
			continue;
		}
		if (++shard > STK_MAX_SHARDS)
			break;
		m.ino = shard_first_ino(shard);
	}
	if (rc) {
		free(all);
		return rc;
	}
	paths_up(c, all, k);
	*out = all;
	*n = k;
	return 0;
}

int stk_quota_recount(stk_client *c, const char *path, struct stk_quota **out, size_t *n)
{
	struct stk_msg_meta_quota_resp head;
	struct stk_msg_meta_quota_req m;
	struct stk_quota *all = NULL, *list = NULL;
	size_t k = 0, nlist = 0;
	int rc;

	if (!c || !out || !n)
		return -EINVAL;
	rc = quota_req_path(c, path, STK_QUOTA_RECOUNT, &m);
	if (rc == 0)
		rc = quota_call(c, &m, &head, &all);
	if (rc)
		return rc;
	k = head.n;
	/*
	 * All of them: shard 1 recounts its own at once (inode 0); the outermost
	 * quotas of the other shards are recounted one by one at their shards.
	 */
	if (!path)
		rc = stk_quota_list(c, &list, &nlist);
	for (size_t i = 0; rc == 0 && i < nlist; i++) {
		struct stk_quota *page = NULL, *grown;

		if (stk_ino_shard(list[i].ino) == 1 || list[i].parent)
			continue;
		m.ino = list[i].ino;
		rc = quota_call(c, &m, &head, &page);
		if (rc == -ENOENT) { /* removed since the list */
			rc = 0;
			continue;
		}
		grown = rc == 0 && head.n ? realloc(all, (k + head.n) * sizeof(*all)) : all;
		if (rc == 0 && head.n && !grown)
			rc = -ENOMEM;
		if (rc == 0 && head.n) {
			all = grown;
			memcpy(all + k, page, head.n * sizeof(*all));
			k += head.n;
		}
		free(page);
	}
	free(list);
	if (rc) {
		free(all);
		return rc;
	}
	paths_up(c, all, k);
	*out = all;
	*n = k;
	return 0;
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
