/*
 * Client keys' subtrees across metadata shards (span.h): the path of a subtree
 * resolved, and an inode's chain of parents walked, over every shard they
 * cross, with the other shards' answers kept for a second.
 *
 * Both caches are small open tables of fixed slots under one mutex, indexed by a
 * hash: a collision evicts, which costs a question to another shard, nothing
 * worse. A hop to another shard is one request to its leader; the walk makes
 * every hop itself (UP never calls out), so a chain of folders alternating
 * between two shards costs a request per crossing and never ties a worker of
 * one shard to a worker of the other waiting on each other.
 */
#include "span.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <xxhash.h>

#include "../common/log.h"
#include "../common/util.h"
#include "../proto/wire.h"
#include "store.h"
#include "xshard.h"

#define SPAN_TTL_NS 1000000000ull /* another shard's answer is kept this long */
#define UP_SLOTS 1024u
#define TOP_SLOTS 64u
#define TOP_PATH_MAX 256u /* longer subtree paths are resolved every time */
#define HOPS_MAX 64u	  /* crossings of a walk, at most */

struct up_ent {
	uint64_t ino, top, left, until_ns;
	uint8_t state; /* STK_XUP_INSIDE or STK_XUP_LEFT (outside is never kept) */
};

struct top_ent {
	uint64_t ino, until_ns;
	char path[TOP_PATH_MAX];
};

struct stk_meta_span {
	struct stk_meta_store *st;
	struct stk_meta_xshard *x;
	unsigned shard;
	pthread_mutex_t lock;
	/* under lock */
	struct up_ent up[UP_SLOTS];
	struct top_ent tops[TOP_SLOTS];
};

int stk_meta_span_create(struct stk_meta_store *st, struct stk_meta_xshard *x,
			 struct stk_meta_span **out)
{
	struct stk_meta_span *sp = calloc(1, sizeof(*sp));

	*out = NULL;
	if (!sp)
		return -ENOMEM;
	sp->st = st;
	sp->x = x;
	sp->shard = stk_meta_store_shard(st);
	pthread_mutex_init(&sp->lock, NULL);
	*out = sp;
	return 0;
}

void stk_meta_span_destroy(struct stk_meta_span *sp)
{
	if (!sp)
		return;
	pthread_mutex_destroy(&sp->lock);
	free(sp);
}

static struct up_ent *up_slot(struct stk_meta_span *sp, uint64_t ino, uint64_t top)
{
	uint64_t k[2] = {ino, top};

	return &sp->up[XXH64(k, sizeof(k), 0) % UP_SLOTS];
}

static int up_cached(struct stk_meta_span *sp, uint64_t ino, uint64_t top, uint8_t *state,
		     uint64_t *left)
{
	struct up_ent *e;
	int hit;

	pthread_mutex_lock(&sp->lock);
	e = up_slot(sp, ino, top);
	hit = e->ino == ino && e->top == top && e->until_ns > stk_now_ns();
	if (hit) {
		*state = e->state;
		*left = e->left;
	}
	pthread_mutex_unlock(&sp->lock);
	return hit;
}

static void up_keep(struct stk_meta_span *sp, uint64_t ino, uint64_t top, uint8_t state,
		    uint64_t left)
{
	pthread_mutex_lock(&sp->lock);
	*up_slot(sp, ino, top) = (struct up_ent){.ino = ino,
						 .top = top,
						 .left = left,
						 .state = state,
						 .until_ns = stk_now_ns() + SPAN_TTL_NS};
	pthread_mutex_unlock(&sp->lock);
}

static struct top_ent *top_slot(struct stk_meta_span *sp, const char *path)
{
	return &sp->tops[XXH64(path, strlen(path), 0) % TOP_SLOTS];
}

static int top_cached(struct stk_meta_span *sp, const char *path, uint64_t *ino)
{
	struct top_ent *e;
	int hit = 0;

	if (strlen(path) >= TOP_PATH_MAX)
		return 0;
	pthread_mutex_lock(&sp->lock);
	e = top_slot(sp, path);
	if (e->until_ns > stk_now_ns() && strcmp(e->path, path) == 0) {
		*ino = e->ino;
		hit = 1;
	}
	pthread_mutex_unlock(&sp->lock);
	return hit;
}

static void top_keep(struct stk_meta_span *sp, const char *path, uint64_t ino)
{
	struct top_ent *e;

	if (strlen(path) >= TOP_PATH_MAX)
		return;
	pthread_mutex_lock(&sp->lock);
	e = top_slot(sp, path);
	e->ino = ino;
	e->until_ns = stk_now_ns() + SPAN_TTL_NS;
	stk_strlcpy(e->path, path, sizeof(e->path));
	pthread_mutex_unlock(&sp->lock);
}

/* name in folder dir of another shard, as root: 0 with *a, or -errno. */
static int lookup_remote(struct stk_meta_span *sp, uint64_t dir, const char *name,
			 struct stk_attr *a)
{
	struct stk_msg_meta_lookup_req q = {.parent = dir}; /* as root: this node sees all */
	struct stk_msg_meta_attr_resp r;
	uint8_t req[512], resp[256];
	struct stk_wbuf w;
	struct stk_rbuf rb;
	size_t len = 0;
	int rc;

	stk_strlcpy(q.name, name, sizeof(q.name));
	stk_wbuf_init(&w, req, sizeof(req));
	stk_msg_meta_lookup_req_enc(&w, &q);
	if (w.err)
		return -EINVAL;
	rc = stk_meta_xshard_ask(sp->x, stk_ino_shard(dir), STK_OP_META_LOOKUP, req, w.len, resp,
				 sizeof(resp), &len);
	if (rc)
		return rc;
	stk_rbuf_init(&rb, resp, len);
	if (stk_msg_meta_attr_resp_dec(&rb, &r) || rb.err || !r.attr.ino)
		return -EIO;
	*a = r.attr;
	return 0;
}

int stk_meta_span_resolve(struct stk_meta_span *sp, const char *path, uint64_t *ino, int may_wait)
{
	static const struct stk_cred root_cred;
	char name[STK_NAME_MAX + 1];
	const char *p = path;
	uint64_t dir = STK_ROOT_INO;
	int rc, asked = 0;

	/* the whole path on this shard (always so with one shard): as before */
	if (sp->shard == 1) {
		rc = stk_meta_store_resolve(sp->st, path, ino);
		if (rc != -ENOENT && rc != -EREMOTE)
			return rc;
	}
	if (*p != '/')
		return -EINVAL;
	if (top_cached(sp, path, ino))
		return 0;
	while (*p) {
		struct stk_attr a;
		size_t len;

		while (*p == '/')
			p++;
		len = strcspn(p, "/");
		if (len == 0)
			break;
		if (len > STK_NAME_MAX)
			return -ENAMETOOLONG;
		memcpy(name, p, len);
		name[len] = 0;
		p += len;
		if (stk_ino_shard(dir) == sp->shard) {
			rc = stk_meta_store_lookup(sp->st, &root_cred, dir, name, &a);
			if (rc == -EREMOTE)
				rc = 0; /* another shard's folder: its number and type are here */
		} else if (!may_wait) {
			return -EWOULDBLOCK;
		} else {
			rc = lookup_remote(sp, dir, name, &a);
			asked = 1;
		}
		if (rc)
			return rc;
		if (!S_ISDIR(a.mode))
			return -ENOTDIR;
		dir = a.ino;
	}
	*ino = dir;
	if (asked)
		top_keep(sp, path, dir);
	return 0;
}

/* META_XSHARD UP to ino's shard: 0 with *state and *left, or -errno. */
static int ask_up(struct stk_meta_span *sp, uint64_t ino, uint64_t top, uint8_t *state,
		  uint64_t *left)
{
	struct stk_msg_meta_xshard_req q = {
	    .op = STK_XSHARD_UP, .from = sp->shard, .ino = ino, .parent = top};
	struct stk_msg_meta_xshard_resp r;
	int rc = stk_meta_xshard_call(sp->x, stk_ino_shard(ino), &q, &r);

	if (rc)
		return rc;
	if (r.state > STK_XUP_LEFT)
		return -EIO;
	/* where it left must be another shard's, or the walk would go round */
	if (r.state == STK_XUP_LEFT &&
	    (!r.attr.ino || stk_ino_shard(r.attr.ino) == stk_ino_shard(ino)))
		return -EIO;
	*state = r.state;
	*left = r.attr.ino;
	return 0;
}

int stk_meta_span_within(struct stk_meta_span *sp, uint64_t ino, uint64_t top, int may_wait)
{
	uint64_t cur = ino;

	for (unsigned hop = 0; hop < HOPS_MAX; hop++) {
		uint64_t left = 0;
		uint8_t state;
		int rc;

		if (cur == top || top == STK_ROOT_INO)
			return 1;
		if (cur == 0 || cur == STK_ROOT_INO)
			return 0;
		if (stk_ino_shard(cur) == sp->shard) {
			rc = stk_meta_store_climb(sp->st, cur, top, &left);
			if (rc != 2)
				return rc;
			cur = left;
			continue;
		}
		if (!up_cached(sp, cur, top, &state, &left)) {
			if (!may_wait)
				return -EWOULDBLOCK;
			rc = ask_up(sp, cur, top, &state, &left);
			if (rc == -ENOENT) /* a shard the cluster does not have */
				return 0;
			if (rc)
				return rc == -EIO ? rc : -EIO;
			if (state != STK_XUP_OUTSIDE)
				up_keep(sp, cur, top, state, left);
		}
		if (state != STK_XUP_LEFT)
			return state == STK_XUP_INSIDE;
		cur = left;
	}
	stk_warn("meta: inode %llx: its parents cross shards more than %u times: refused",
		 (unsigned long long)ino, HOPS_MAX);
	return -EIO;
}

int stk_meta_span_up(struct stk_meta_span *sp, uint64_t ino, uint64_t top,
		     struct stk_msg_meta_xshard_resp *r)
{
	uint64_t left = 0;
	int rc = stk_meta_store_climb(sp->st, ino, top, &left);

	if (rc < 0)
		return rc;
	memset(r, 0, sizeof(*r));
	r->state = rc == 1 ? STK_XUP_INSIDE : rc == 2 ? STK_XUP_LEFT : STK_XUP_OUTSIDE;
	r->attr.ino = left;
	return 0;
}
