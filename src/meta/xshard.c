/*
 * Cross-shard folders: the four-step mkdir and rmdir of xshard.h, their recovery
 * and the calls between shards' leaders that carry them.
 *
 * The records are the store's (stk_meta_store_x*); this file orders them. A
 * step's transaction is held by the shard's followers before the next step
 * begins (wait_held), so a failover of either shard's leader between two steps
 * finds the same records as a restart would. The other shard's leader is found
 * in the routing table and asked over a pool of connections; a call that finds
 * no leader, or one that no longer leads, is retried with a fresh table for a
 * few seconds, then given up (the request answers EIO; recovery settles it).
 *
 * Intents in flight (`busy`) are the ones a request of this process is working
 * on: recovery leaves them to that request. Everything else it finds is from a
 * crash, a failover or a call that failed, and it settles it.
 */
#include "xshard.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "../common/log.h"
#include "../common/util.h"
#include "../mgmtd/agent.h"
#include "../net/net.h"
#include "../proto/wire.h"
#include "leases.h"
#include "repl.h"
#include "store.h"

#define CALL_TRY_MS 5000u  /* a call to another shard is retried this long */
#define RECOVER_MS 1000u   /* recovery looks this often */
#define RECOVER_BATCH 256u /* records settled per look */
#define BUSY_MAX 1024u
#define COUNT_MAX 4096u /* counted at most (STK_XSHARD_COUNT) */
#define LOCK_TRY_MS 30000u /* the folder-move lock is waited for this long, then EBUSY */
#define WALK_MAX 4096u	   /* folders walked up to the root, at most */
#define LOCAL_LOCK_BIT (1ull << 62) /* a lock id of a move within one shard (no intent) */

struct stk_meta_xshard {
	struct stk_meta_store *st;
	struct stk_meta_repl *repl;
	struct stk_agent *agent; /* set once by start */
	struct stk_pool *pool;
	struct stk_meta_leases *leases; /* set once before start; NULL: none */
	unsigned shard;
	uint64_t spread_asked_ns; /* atomic: when "spread" last asked mgmtd for the table */
	uint64_t local_lock_next; /* atomic: the next lock id of a move within this shard */
	int sharded;		  /* atomic: a table with more than one shard was seen */
	pthread_mutex_t make_mu; /* an intent written and claimed, against its listing */
	pthread_mutex_t mu;	 /* busy, stop */
	pthread_cond_t wake;
	uint64_t busy[BUSY_MAX];
	unsigned nbusy;
	int stop;
	int kicked; /* a release to tell: look now */
	int running;
	pthread_t thr;
	/* the test hook (xshard.h) */
	char hook_op[8];
	unsigned hook_step;
	char hook_file[PATH_MAX];
	char hold_file[PATH_MAX]; /* STOKER_TEST_XSHARD_HOLD's: "" when not set */
	int hold_undo;		  /* rename-undo: a held rename is given up */
};

#define HOLD_MAX_MS 120000u /* a held rename goes on after this, file or not */

/* STOKER_TEST_XSHARD_HOLD=rename:FILE or rename-undo:FILE (xshard.h). */
static int hold_parse(struct stk_meta_xshard *x)
{
	const char *v = getenv("STOKER_TEST_XSHARD_HOLD");
	size_t skip = 0;

	if (!v || !*v)
		return 0;
	if (strncmp(v, "rename:", 7) == 0)
		skip = 7;
	else if (strncmp(v, "rename-undo:", 12) == 0)
		skip = 12;
	x->hold_undo = skip == 12;
	if (!skip || !v[skip] ||
	    (size_t)snprintf(x->hold_file, sizeof(x->hold_file), "%s", v + skip) >=
		sizeof(x->hold_file)) {
		x->hold_file[0] = 0;
		stk_error("STOKER_TEST_XSHARD_HOLD=%s: want rename:FILE or rename-undo:FILE", v);
		return -EINVAL;
	}
	return 0;
}

/*
 * The hold hook: a rename whose step 2 is done waits while the hold file is there.
 * 1: the rename is to be given up then (rename-undo), as if its step 3 failed.
 */
static int hold(struct stk_meta_xshard *x)
{
	struct timespec ts = {0, 20 * 1000000L};

	if (!x->hold_file[0] || access(x->hold_file, F_OK) != 0)
		return 0;
	stk_warn("STOKER_TEST_XSHARD_HOLD: a rename across shards held after its step 2 while "
		 "%s is there%s",
		 x->hold_file, x->hold_undo ? ", then given up" : "");
	for (unsigned ms = 0; ms < HOLD_MAX_MS && access(x->hold_file, F_OK) == 0; ms += 20)
		nanosleep(&ts, NULL);
	return x->hold_undo;
}

static int hook_parse(struct stk_meta_xshard *x, const char *dir)
{
	const char *v = getenv("STOKER_TEST_XSHARD_STOP");
	const char *file = NULL;
	char step[4] = "";
	uint64_t k = 0;
	size_t n;

	if (!v || !*v)
		return 0;
	/* OP:K or OP:K:FILE */
	const char *colon = strchr(v, ':');
	size_t oplen = colon ? (size_t)(colon - v) : 0;

	if (colon && colon[1]) {
		const char *end = strchr(colon + 1, ':');

		n = end ? (size_t)(end - (colon + 1)) : strlen(colon + 1);
		if (n < sizeof(step)) {
			memcpy(step, colon + 1, n);
			step[n] = 0;
		}
		file = end ? end + 1 : NULL;
	}
	if (!((oplen == 5 && (strncmp(v, "mkdir", 5) == 0 || strncmp(v, "rmdir", 5) == 0)) ||
	      (oplen == 6 && strncmp(v, "rename", 6) == 0) ||
	      (oplen == 5 && strncmp(v, "rmove", 5) == 0) ||
	      (oplen == 4 && strncmp(v, "link", 4) == 0)) ||
	    stk_parse_u64(step, &k) || k < 1 || k > 4 || (file && !*file)) {
		stk_error("STOKER_TEST_XSHARD_STOP=%s: want mkdir:K, rmdir:K, rename:K, rmove:K or "
			  "link:K (K from 1 to 4), then :FILE if the stop is once for all nodes",
			  v);
		return -EINVAL;
	}
	memcpy(x->hook_op, v, oplen);
	x->hook_op[oplen] = 0;
	x->hook_step = (unsigned)k;
	n = file ? (size_t)snprintf(x->hook_file, sizeof(x->hook_file), "%s", file)
		 : (size_t)snprintf(x->hook_file, sizeof(x->hook_file), "%s/xshard-stopped", dir);
	return n >= sizeof(x->hook_file) ? -ENAMETOOLONG : 0;
}

/* The test hook: this node just completed step `step` of `op`. */
static void hook(struct stk_meta_xshard *x, const char *op, unsigned step)
{
	int fd;

	if (x->hook_step != step || strcmp(x->hook_op, op) != 0)
		return;
	fd = open(x->hook_file, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	if (fd < 0)
		return; /* stopped once already */
	fsync(fd);
	close(fd);
	stk_warn("STOKER_TEST_XSHARD_STOP: stopping after step %u of a cross-shard %s", step, op);
	stk_meta_store_sync(x->st);
	raise(SIGKILL);
}

/* What this thread committed is held by the shard's followers (repl.h). */
static int wait_held(struct stk_meta_xshard *x)
{
	uint64_t seq = stk_meta_store_thread_seq(0);

	return seq ? stk_meta_repl_wait(x->repl, seq) : 0;
}

/*
 * The mark of (from, intent) settled (stk_meta_store_xsettle), as every change here
 * is, between stk_meta_leases_begin and _end on what it changes: the folder of its
 * entry, the inode it names and the one it replaced. An undo puts back the entry's
 * old name, step 4 unlinks what it replaced: a client's cached answer from before
 * is recalled before either is seen, by a live request's settle and by recovery's.
 */
static int settle_here(struct stk_meta_xshard *x, uint32_t from, uint64_t intent, int done)
{
	struct stk_meta_xmark m;
	uint64_t inos[3];
	size_t n = 0;
	int rc;

	if (x->leases && stk_meta_store_xmark_find(x->st, from, intent, &m) == 0) {
		inos[n++] = m.parent;
		if (m.ino != m.parent)
			inos[n++] = m.ino;
		if (m.old_ino && m.old_ino != m.ino && m.old_ino != m.parent)
			inos[n++] = m.old_ino;
		stk_meta_leases_begin(x->leases, 0, inos, n);
	}
	rc = stk_meta_store_xsettle(x->st, from, intent, done);
	if (n)
		stk_meta_leases_end(x->leases, inos, n);
	return rc;
}

static int busy_add(struct stk_meta_xshard *x, uint64_t id)
{
	int rc = -EAGAIN;

	pthread_mutex_lock(&x->mu);
	if (x->nbusy < BUSY_MAX) {
		x->busy[x->nbusy++] = id;
		rc = 0;
	}
	pthread_mutex_unlock(&x->mu);
	return rc;
}

static void busy_del(struct stk_meta_xshard *x, uint64_t id)
{
	pthread_mutex_lock(&x->mu);
	for (unsigned i = 0; i < x->nbusy; i++)
		if (x->busy[i] == id) {
			x->busy[i] = x->busy[--x->nbusy];
			break;
		}
	pthread_mutex_unlock(&x->mu);
}

static int is_busy(struct stk_meta_xshard *x, uint64_t id)
{
	int found = 0;

	pthread_mutex_lock(&x->mu);
	for (unsigned i = 0; i < x->nbusy && !found; i++)
		found = x->busy[i] == id;
	pthread_mutex_unlock(&x->mu);
	return found;
}

/*
 * Recovery gives up each intent no request works on (recover_intents). A request
 * writes its intent and claims it (busy) as one step under make_mu, and recovery
 * lists the intents and sees which are claimed under it too: else it could list an
 * intent its request has not claimed yet and undo D's part while the request goes
 * on to commit, leaving the file with no name at all.
 */
static void intent_making(struct stk_meta_xshard *x)
{
	pthread_mutex_lock(&x->make_mu);
}

/* After intent_making: a written intent (rc 0) claimed, or dropped (-EAGAIN: too many). */
static int intent_made(struct stk_meta_xshard *x, int rc, uint64_t id)
{
	if (rc == 0 && busy_add(x, id)) {
		stk_meta_store_xintent_drop(x->st, id);
		rc = -EAGAIN;
	}
	pthread_mutex_unlock(&x->make_mu);
	return rc;
}

/* The leader of `shard` now: 0 with addr, -ENOTCONN (none now), -ENOENT (no such shard). */
static int leader_addr(struct stk_meta_xshard *x, unsigned shard, char *addr, unsigned *nshards)
{
	struct stk_routing_ref *ref;
	int rc = -ENOENT;

	if (!x->agent)
		return -ENOTCONN;
	ref = stk_agent_routing_get(x->agent);
	if (nshards)
		*nshards = ref->rt.nshards;
	for (uint32_t i = 0; i < ref->rt.nshards; i++) {
		const struct stk_rt_node *n;

		if (ref->rt.shards[i].id != shard)
			continue;
		n = stk_routing_node(&ref->rt, ref->rt.shards[i].node_id);
		rc = n ? 0 : -ENOTCONN;
		if (n)
			memcpy(addr, n->addr, STK_ADDR_MAX);
		break;
	}
	stk_agent_routing_put(x->agent, ref);
	return rc;
}

static int transient(int rc)
{
	return rc == -EREMCHG || rc == -ENOTCONN || rc == -ECONNREFUSED || rc == -ECONNRESET ||
	       rc == -EPIPE || rc == -ETIMEDOUT || rc == -EHOSTUNREACH || rc == -ECONNABORTED ||
	       rc == -EBADMSG || rc == -ESTALE;
}

/* One request to the leader of `shard`, retried while it is transient (CALL_TRY_MS). */
static int call(struct stk_meta_xshard *x, unsigned shard, uint16_t opcode, const void *req,
		size_t len, void *resp, size_t cap, size_t *rlen)
{
	uint64_t deadline = stk_now_ns() + CALL_TRY_MS * 1000000ull;
	unsigned backoff_ms = 20;
	char addr[STK_ADDR_MAX];
	int rc, asked = 0;

	for (;;) {
		struct stk_conn *c = NULL;
		struct stk_rpc rpc;
		struct stk_wbuf w = {.p = (void *)req, .len = len, .cap = len};

		rc = leader_addr(x, shard, addr, NULL);
		/* a table from before that shard's first meta node registered: ask again */
		if (rc == -ENOENT && !asked++ && x->agent &&
		    stk_agent_routing_refresh(x->agent) == 0)
			rc = leader_addr(x, shard, addr, NULL);
		if (rc == 0)
			rc = stk_pool_get(x->pool, addr, &c);
		if (rc == 0) {
			memset(&rpc, 0, sizeof(rpc));
			stk_rpc_prepare(&rpc, opcode, &w, resp, cap);
			rc = stk_rpc_call(c, &rpc);
			stk_pool_put(x->pool, c);
			if (rc == 0 && rlen)
				*rlen = rpc.resp_len;
		}
		if (!transient(rc) || stk_now_ns() > deadline)
			break;
		usleep(backoff_ms * 1000);
		if (backoff_ms < 400)
			backoff_ms *= 2;
		stk_pool_flush(x->pool);
		if (x->agent)
			stk_agent_routing_refresh(x->agent);
	}
	if (transient(rc)) {
		stk_warn("meta: %s to shard %u: %s", stk_opcode_name(opcode), shard, strerror(-rc));
		rc = -EIO;
	}
	return rc;
}

static int xcall(struct stk_meta_xshard *x, unsigned shard, const struct stk_msg_meta_xshard_req *q,
		 struct stk_msg_meta_xshard_resp *r)
{
	uint8_t req[512], resp[256];
	struct stk_wbuf w;
	struct stk_rbuf rb;
	size_t len = 0;
	int rc;

	stk_wbuf_init(&w, req, sizeof(req));
	if (stk_msg_meta_xshard_req_enc(&w, q))
		return -EINVAL;
	rc = call(x, shard, STK_OP_META_XSHARD, req, w.len, resp, sizeof(resp), &len);
	if (rc)
		return rc;
	stk_rbuf_init(&rb, resp, len);
	if (stk_msg_meta_xshard_resp_dec(&rb, r) || stk_rbuf_finish(&rb))
		return -EIO;
	return 0;
}

static const char *kind_name(unsigned kind)
{
	return kind == STK_XINTENT_MKDIR   ? "mkdir"
	       : kind == STK_XINTENT_RMDIR ? "rmdir"
	       : kind == STK_XINTENT_LINK  ? "link"
	       : kind == STK_XINTENT_FMOVE ? "rmove"
					   : "rename";
}

/* Tells B how (from this shard, intent) ended. */
static int settle(struct stk_meta_xshard *x, unsigned shard, uint64_t intent, unsigned kind,
		  int done)
{
	struct stk_msg_meta_xshard_req q = {.op = STK_XSHARD_SETTLE,
					    .from = x->shard,
					    .intent = intent,
					    .done = (uint8_t)done,
					    .kind = (uint8_t)kind};
	struct stk_msg_meta_xshard_resp r;

	return xcall(x, shard, &q, &r);
}

int stk_meta_xshard_getattr(struct stk_meta_xshard *x, uint64_t ino, struct stk_attr *out)
{
	struct stk_msg_meta_ino_req q = {.ino = ino}; /* as root: no permission is needed */
	struct stk_msg_meta_attr_resp a;
	uint8_t req[128], resp[256];
	struct stk_wbuf w;
	struct stk_rbuf r;
	size_t len = 0;
	int rc;

	stk_wbuf_init(&w, req, sizeof(req));
	stk_msg_meta_ino_req_enc(&w, &q);
	rc = call(x, stk_ino_shard(ino), STK_OP_META_GETATTR, req, w.len, resp, sizeof(resp), &len);
	if (rc)
		return rc == -EIO || rc == -ENOENT ? rc : -EIO;
	stk_rbuf_init(&r, resp, len);
	if (stk_msg_meta_attr_resp_dec(&r, &a) || stk_rbuf_finish(&r) || a.attr.ino != ino)
		return -EIO;
	*out = a.attr;
	return 0;
}

/* Whether the cluster has shard `shard`, asking mgmtd again before saying no. */
static int shard_known(struct stk_meta_xshard *x, unsigned shard)
{
	char addr[STK_ADDR_MAX];

	if (leader_addr(x, shard, addr, NULL) != -ENOENT)
		return 1;
	if (!x->agent || stk_agent_routing_refresh(x->agent))
		return 0;
	return leader_addr(x, shard, addr, NULL) != -ENOENT;
}

unsigned stk_meta_xshard_place(struct stk_meta_xshard *x, uint64_t parent, const char *name)
{
	static const struct stk_cred root_cred;
	char buf[16], addr[STK_ADDR_MAX];
	unsigned nshards = 0;
	size_t len = 0;
	uint64_t pin;

	if (stk_meta_store_getxattr(x->st, &root_cred, parent, STK_XSHARD_PIN_XATTR, buf,
				    sizeof(buf) - 1, &len))
		return x->shard; /* no setting: the parent's shard */
	buf[len] = 0;
	if (len == 6 && memcmp(buf, "spread", 6) == 0) {
		/* A table that shows one shard may predate the others (just started):
		 * asked again before all goes to this one. */
		if (leader_addr(x, x->shard, addr, &nshards) == -ENOENT || nshards <= 1) {
			uint64_t now = stk_now_ns();
			uint64_t last = __atomic_load_n(&x->spread_asked_ns, __ATOMIC_RELAXED);

			/* at most once a second: "spread" on a one-shard cluster is allowed */
			if (x->agent && (!last || now - last > 1000000000ull)) {
				__atomic_store_n(&x->spread_asked_ns, now, __ATOMIC_RELAXED);
				(void)stk_agent_routing_refresh(x->agent);
			}
			if (leader_addr(x, x->shard, addr, &nshards) == -ENOENT || nshards <= 1)
				return x->shard; /* one shard: nothing to choose */
		}
		return (unsigned)(XXH64(name, strlen(name), 0) % nshards) + 1;
	}
	if (stk_parse_u64(buf, &pin) == 0 && pin >= 1 && pin <= STK_MAX_SHARDS &&
	    shard_known(x, (unsigned)pin))
		return (unsigned)pin;
	stk_warn("meta: folder %llu is pinned to shard '%s', which the cluster does not have: "
		 "its new folder '%s' stays on shard %u",
		 (unsigned long long)parent, buf, name, x->shard);
	return x->shard;
}

int stk_meta_xshard_pin_check(struct stk_meta_xshard *x, const void *value, size_t len)
{
	char buf[16];
	uint64_t pin;

	if (len == 6 && memcmp(value, "spread", 6) == 0)
		return 0;
	if (len == 0 || len >= sizeof(buf))
		return -EINVAL;
	memcpy(buf, value, len);
	buf[len] = 0;
	if (stk_parse_u64(buf, &pin) || pin < 1 || pin > STK_MAX_SHARDS ||
	    !shard_known(x, (unsigned)pin))
		return -EINVAL;
	return 0;
}

int stk_meta_xshard_mkdir(struct stk_meta_xshard *x, const struct stk_cred *cred, uint64_t parent,
			  const char *name, uint32_t mode, unsigned shard, struct stk_attr *out)
{
	struct stk_msg_meta_xshard_req q = {.op = STK_XSHARD_MKDIR,
					    .from = x->shard,
					    .parent = parent,
					    .mode = mode & 07777,
					    .uid = cred->uid,
					    .gid = cred->gid};
	struct stk_msg_meta_xshard_resp r;
	struct stk_attr pa;
	uint64_t id = 0;
	int rc;

	intent_making(x);
	rc = stk_meta_store_xintent_mkdir(x->st, cred, parent, name, shard, &id);
	rc = intent_made(x, rc, id);
	if (rc)
		return rc;
	/* A setgid folder passes on its group and the bit, as a mkdir here does
	 * (inode_new in store.c): B knows nothing of the parent. */
	if (stk_meta_store_getattr(x->st, cred, parent, &pa) == 0 && (pa.mode & S_ISGID)) {
		q.gid = pa.gid;
		q.mode |= S_ISGID;
	}
	rc = wait_held(x);
	if (rc)
		goto out; /* not leading now: the intent is recovery's */
	hook(x, "mkdir", 1);
	q.intent = id;
	snprintf(q.name, sizeof(q.name), "%s", name);
	rc = xcall(x, shard, &q, &r);
	if (rc == 0 && (!S_ISDIR(r.attr.mode) || stk_ino_shard(r.attr.ino) != shard))
		rc = -EIO;
	if (rc == 0) {
		rc = stk_meta_store_xlink(x->st, cred, id, &r.attr);
		if (rc == 0) {
			/* named: never undone from here (recovery asks whoever leads) */
			rc = wait_held(x);
			if (rc)
				goto out;
			hook(x, "mkdir", 3);
			if (settle(x, shard, id, STK_XINTENT_MKDIR, 1))
				stk_info("meta: folder %llu made on shard %u: its mark is left to "
					 "recovery",
					 (unsigned long long)r.attr.ino, shard);
			*out = r.attr;
			goto out;
		}
	}
	/* Given up: B deletes what it made, then the intent goes (else recovery does it). */
	if (settle(x, shard, id, STK_XINTENT_MKDIR, 0) == 0)
		stk_meta_store_xintent_drop(x->st, id);
out:
	busy_del(x, id);
	return rc;
}

int stk_meta_xshard_rmdir(struct stk_meta_xshard *x, const struct stk_cred *cred, uint64_t parent,
			  const char *name, uint64_t ino)
{
	struct stk_msg_meta_xshard_req q = {
	    .op = STK_XSHARD_DYING, .from = x->shard, .ino = ino, .parent = parent};
	unsigned shard = stk_ino_shard(ino);
	struct stk_msg_meta_xshard_resp r;
	struct stk_attr victim;
	uint64_t id = 0;
	int rc;

	rc = stk_meta_xshard_getattr(x, ino, &victim);
	if (rc == -ENOENT)
		rc = -EIO; /* a name here, no folder there: fsck's to report */
	if (rc == 0) {
		intent_making(x);
		rc = stk_meta_store_xintent_rmdir(x->st, cred, parent, name, &victim, &id);
		rc = intent_made(x, rc, id);
	}
	if (rc)
		return rc;
	rc = wait_held(x);
	if (rc)
		goto out;
	hook(x, "rmdir", 1);
	q.intent = id;
	snprintf(q.name, sizeof(q.name), "%s", name);
	rc = xcall(x, shard, &q, &r);
	if (rc == 0) {
		rc = stk_meta_store_xunlink(x->st, id);
		if (rc == 0) {
			/* unnamed: never undone from here (recovery asks whoever leads) */
			rc = wait_held(x);
			if (rc)
				goto out;
			hook(x, "rmdir", 3);
			if (settle(x, shard, id, STK_XINTENT_RMDIR, 1))
				stk_info(
				    "meta: folder %llu of shard %u unnamed: its removal is left "
				    "to recovery",
				    (unsigned long long)ino, shard);
			goto out;
		}
	}
	/* NOTEMPTY, BUSY, or B out of reach: the folder stays, unmarked. */
	if (settle(x, shard, id, STK_XINTENT_RMDIR, 0) == 0)
		stk_meta_store_xintent_drop(x->st, id);
out:
	busy_del(x, id);
	return rc;
}

int stk_meta_xshard_rename(struct stk_meta_xshard *x, const struct stk_cred *cred,
			   uint64_t src_parent, const char *src_name, uint64_t dst_parent,
			   const char *dst_name, uint32_t flags)
{
	struct stk_msg_meta_xshard_req q = {.op = STK_XSHARD_RENAME,
					    .from = x->shard,
					    .parent = dst_parent,
					    .uid = cred->uid,
					    .gid = cred->gid,
					    .done = (uint8_t)((flags & STK_RENAME_NOREPLACE) != 0)};
	unsigned shard = stk_ino_shard(dst_parent);
	struct stk_msg_meta_xshard_resp r;
	struct stk_attr moved;
	uint64_t id = 0;
	int rc;

	if (strnlen(dst_name, STK_NAME_MAX + 1) > STK_NAME_MAX)
		return -ENAMETOOLONG;
	if (!shard_known(x, shard))
		return -ENOENT; /* a folder of a shard the cluster does not have */
	intent_making(x);
	rc = stk_meta_store_xintent_rename(x->st, cred, src_parent, src_name, shard, flags,
					   &moved, &id);
	rc = intent_made(x, rc, id);
	if (rc)
		return rc;
	rc = wait_held(x);
	if (rc)
		goto out; /* not leading now: the intent is recovery's */
	hook(x, "rename", 1);
	q.intent = id;
	q.ino = moved.ino;
	q.mode = moved.mode & S_IFMT;
	snprintf(q.name, sizeof(q.name), "%s", dst_name);
	rc = xcall(x, shard, &q, &r);
	if (rc == 0 && r.state == STK_XSTATE_NAMED) {
		/* both names are the file's already: nothing to do, nothing was made */
		stk_meta_store_xintent_drop(x->st, id);
		rc = 0;
		goto out;
	}
	if (rc == 0) {
		rc = hold(x) ? -EIO : stk_meta_store_xrename_commit(x->st, id, dst_parent);
		if (rc == 0) {
			/* committed: never undone from here (recovery asks whoever leads) */
			rc = wait_held(x);
			if (rc)
				goto out;
			hook(x, "rename", 3);
			if (settle(x, shard, id, STK_XINTENT_RENAME, 1))
				stk_info("meta: file %llu renamed to shard %u: its mark is left to "
					 "recovery",
					 (unsigned long long)moved.ino, shard);
			goto out;
		}
	}
	/* Given up: D puts back what its entry named, then the intent goes. */
	if (settle(x, shard, id, STK_XINTENT_RENAME, 0) == 0)
		stk_meta_store_xintent_drop(x->st, id);
out:
	busy_del(x, id);
	return rc;
}

int stk_meta_xshard_link(struct stk_meta_xshard *x, const struct stk_cred *cred, uint64_t ino,
			 uint64_t parent, const char *name, struct stk_attr *out)
{
	struct stk_msg_meta_xshard_req q = {
	    .op = STK_XSHARD_LINK, .from = x->shard, .ino = ino, .parent = parent};
	unsigned shard = stk_ino_shard(ino);
	struct stk_msg_meta_xshard_resp r;
	uint64_t id = 0;
	int rc;

	if (!shard_known(x, shard))
		return -ENOENT; /* a number of a shard the cluster does not have */
	intent_making(x);
	rc = stk_meta_store_xintent_link(x->st, cred, ino, parent, name, &id);
	rc = intent_made(x, rc, id);
	if (rc)
		return rc;
	rc = wait_held(x);
	if (rc)
		goto out;
	hook(x, "link", 1);
	q.intent = id;
	snprintf(q.name, sizeof(q.name), "%s", name);
	rc = xcall(x, shard, &q, &r);
	if (rc == 0 && (S_ISDIR(r.attr.mode) || r.attr.ino != ino))
		rc = -EIO;
	if (rc == 0) {
		rc = stk_meta_store_xlink_commit(x->st, id, r.attr.mode & S_IFMT);
		if (rc == 0) {
			rc = wait_held(x);
			if (rc)
				goto out;
			hook(x, "link", 3);
			if (settle(x, shard, id, STK_XINTENT_LINK, 1))
				stk_info("meta: file %llu of shard %u linked here: its mark is left "
					 "to recovery",
					 (unsigned long long)ino, shard);
			*out = r.attr;
			goto out;
		}
	}
	/* Given up: H drops the link it counted, then the intent goes. */
	if (settle(x, shard, id, STK_XINTENT_LINK, 0) == 0)
		stk_meta_store_xintent_drop(x->st, id);
out:
	busy_del(x, id);
	return rc;
}

/* ---- folders moved across shards, and the folder-move lock ---- */

/*
 * How many shards the cluster has, as the routing table says: every shard that
 * ever had a meta node is listed (mgmtd keeps its identity). A node of shard k >
 * 1 knows there are two at least, and once seen, more than one stays so (a shard
 * is never dropped), whatever an older table says.
 */
static unsigned nshards(struct stk_meta_xshard *x)
{
	struct stk_routing_ref *ref;
	unsigned n;

	if (x->shard > 1 || __atomic_load_n(&x->sharded, __ATOMIC_RELAXED))
		return 2;
	if (!x->agent)
		return 1;
	ref = stk_agent_routing_get(x->agent);
	n = ref->rt.nshards;
	stk_agent_routing_put(x->agent, ref);
	if (n > 1)
		__atomic_store_n(&x->sharded, 1, __ATOMIC_RELAXED);
	return n ? n : 1;
}

/* One try at shard 1's lock for (this shard, id): take 1 or release 0. */
static int lock_call(struct stk_meta_xshard *x, uint64_t id, int take)
{
	struct stk_msg_meta_xshard_req q = {
	    .op = STK_XSHARD_LOCK, .from = x->shard, .intent = id, .done = (uint8_t)take};
	struct stk_msg_meta_xshard_resp r;
	int rc;

	if (x->shard != 1)
		return xcall(x, 1, &q, &r);
	rc = stk_meta_store_xlock(x->st, x->shard, id, take);
	if (rc == 0 && take)
		rc = wait_held(x); /* held by shard 1's followers: it survives a failover */
	return rc;
}

/* The lock, waited for while another move holds it (LOCK_TRY_MS, then -EBUSY). */
static int lock_take(struct stk_meta_xshard *x, uint64_t id)
{
	uint64_t deadline = stk_now_ns() + LOCK_TRY_MS * 1000000ull;
	unsigned wait_ms = 5;
	int rc;

	for (;;) {
		rc = lock_call(x, id, 1);
		if (rc != -EBUSY || stk_now_ns() > deadline)
			return rc;
		usleep(wait_ms * 1000);
		if (wait_ms < 100)
			wait_ms *= 2;
	}
}

/* Released; one that fails is left to shard 1's recovery (it asks this shard). */
static void lock_release(struct stk_meta_xshard *x, uint64_t id)
{
	if (lock_call(x, id, 0))
		stk_info("meta: the folder-move lock (id %llu) is left to shard 1's recovery",
			 (unsigned long long)id);
}

/*
 * Under the lock: -EINVAL when folder `moved` is dst or one of its ancestors,
 * found by following parent pointers up to the root, each asked of its shard.
 */
static int walk_up(struct stk_meta_xshard *x, uint64_t moved, uint64_t dst)
{
	uint64_t cur = dst, parent;
	int rc;

	for (unsigned depth = 0; depth < WALK_MAX; depth++) {
		if (cur == moved)
			return -EINVAL;
		if (cur == STK_ROOT_INO)
			return 0;
		if (stk_ino_shard(cur) == x->shard) {
			rc = stk_meta_store_xparent(x->st, cur, &parent);
		} else {
			struct stk_msg_meta_xshard_req q = {
			    .op = STK_XSHARD_PARENT, .from = x->shard, .ino = cur};
			struct stk_msg_meta_xshard_resp r;

			rc = xcall(x, stk_ino_shard(cur), &q, &r);
			parent = r.attr.ino;
		}
		if (rc)
			return rc;
		cur = parent;
	}
	stk_error("meta: folder %llu: parent chain too deep or cyclic", (unsigned long long)dst);
	return -EIO;
}

int stk_meta_xshard_sharded(struct stk_meta_xshard *x)
{
	return nshards(x) > 1;
}

int stk_meta_xshard_dirmove_begin(struct stk_meta_xshard *x, uint64_t moved, uint64_t dst,
				  uint64_t moved2, uint64_t dst2, uint64_t *token)
{
	uint64_t id;
	int rc;

	*token = 0;
	if (nshards(x) < 2)
		return 0; /* one shard: the store's own check, as always */
	id = __atomic_fetch_add(&x->local_lock_next, 1, __ATOMIC_RELAXED) | LOCAL_LOCK_BIT;
	rc = busy_add(x, id);
	if (rc)
		return rc;
	rc = lock_take(x, id);
	if (rc == 0 && moved)
		rc = walk_up(x, moved, dst);
	if (rc == 0 && moved2)
		rc = walk_up(x, moved2, dst2);
	if (rc && rc != -EBUSY)
		lock_release(x, id);
	if (rc) {
		busy_del(x, id);
		return rc;
	}
	*token = id;
	return 0;
}

void stk_meta_xshard_dirmove_end(struct stk_meta_xshard *x, uint64_t token)
{
	if (!token)
		return;
	lock_release(x, token);
	busy_del(x, token);
}

/* The shards holding marks of a move of folder ino to a folder of shard b. */
static unsigned fmove_shards(struct stk_meta_xshard *x, unsigned b, uint64_t ino, unsigned out[2])
{
	unsigned c = stk_ino_shard(ino), n = 0;

	if (b != x->shard)
		out[n++] = b;
	if (c != x->shard && c != b)
		out[n++] = c;
	return n;
}

/* Every mark of (this shard, id) settled as `done`: 0 when all were. */
static int fmove_settle(struct stk_meta_xshard *x, unsigned b, uint64_t ino, uint64_t id,
			int done)
{
	unsigned sh[2], n = fmove_shards(x, b, ino, sh);
	int rc = 0;

	for (unsigned i = 0; i < n; i++)
		if (settle(x, sh[i], id, STK_XINTENT_FMOVE, done))
			rc = -EIO;
	return rc;
}

/*
 * A folder moved to another parent has its ".." changed: the caller needs write
 * permission on it, as within a shard (the store checks it there). A folder of
 * another shard named here has its attributes on its own shard: they are asked of
 * it. 0 as well when the name is no such folder (the intent's checks answer).
 */
static int moved_writable(struct stk_meta_xshard *x, const struct stk_cred *cred,
			  uint64_t src_parent, const char *src_name, uint64_t dst_parent)
{
	struct stk_attr e, f;
	int rc;

	if (src_parent == dst_parent || cred->uid == 0)
		return 0;
	rc = stk_meta_store_lookup(x->st, cred, src_parent, src_name, &e);
	if (rc != -EREMOTE || !S_ISDIR(e.mode))
		return 0;
	rc = stk_meta_xshard_getattr(x, e.ino, &f);
	if (rc == -ENOENT)
		return -EIO; /* a name here, no folder there: fsck's to report */
	return rc ? rc : stk_meta_store_may(cred, &f, W_OK);
}

int stk_meta_xshard_fmove(struct stk_meta_xshard *x, const struct stk_cred *cred,
			  uint64_t src_parent, const char *src_name, uint64_t dst_parent,
			  const char *dst_name, uint32_t flags)
{
	unsigned b = stk_ino_shard(dst_parent), c;
	int noreplace = (flags & STK_RENAME_NOREPLACE) != 0, rc, locked = 0, begun = 0;
	struct stk_msg_meta_xshard_resp r;
	struct stk_attr moved;
	uint64_t id = 0;

	if (strnlen(dst_name, STK_NAME_MAX + 1) > STK_NAME_MAX)
		return -ENAMETOOLONG;
	if (!shard_known(x, b))
		return -ENOENT; /* a folder of a shard the cluster does not have */
	rc = moved_writable(x, cred, src_parent, src_name, dst_parent);
	if (rc)
		return rc;
	intent_making(x);
	rc = stk_meta_store_xintent_fmove(x->st, cred, src_parent, src_name, dst_parent, dst_name,
					  flags, &moved, &id);
	if (rc == -EALREADY) {
		intent_made(x, rc, id);
		return 0; /* both names are the folder's: nothing to do */
	}
	rc = intent_made(x, rc, id);
	if (rc)
		return rc;
	c = stk_ino_shard(moved.ino);
	rc = wait_held(x);
	if (rc)
		goto out; /* not leading now: the intent is recovery's */
	hook(x, "rmove", 1);
	if (src_parent != dst_parent) {
		/* no cycle: the lock orders every folder's move to another parent */
		rc = lock_take(x, id);
		locked = rc == 0;
		if (rc == 0)
			rc = walk_up(x, moved.ino, dst_parent);
		if (rc)
			goto undo;
	}
	begun = 1;
	if (b != x->shard) {
		struct stk_msg_meta_xshard_req q = {.op = STK_XSHARD_FMOVE,
						    .from = x->shard,
						    .intent = id,
						    .ino = moved.ino,
						    .parent = dst_parent,
						    .uid = cred->uid,
						    .gid = cred->gid,
						    .done = (uint8_t)noreplace};

		snprintf(q.name, sizeof(q.name), "%s", dst_name);
		rc = xcall(x, b, &q, &r);
	}
	if (rc == 0 && c != x->shard && c != b) {
		struct stk_msg_meta_xshard_req q = {.op = STK_XSHARD_FPTR,
						    .from = x->shard,
						    .intent = id,
						    .ino = moved.ino,
						    .parent = dst_parent};

		rc = xcall(x, c, &q, &r);
	}
	if (rc == 0)
		rc = stk_meta_store_xfmove_commit(x->st, id, dst_parent, dst_name, noreplace);
	if (rc == 0) {
		/* committed: never undone from here (recovery asks whoever leads) */
		rc = wait_held(x);
		if (rc)
			goto out;
		hook(x, "rmove", 3);
		if (fmove_settle(x, b, moved.ino, id, 1) == 0 &&
		    stk_meta_store_xdone_drop(x->st, id) == 0) {
			if (locked)
				lock_release(x, id);
		} else {
			stk_info("meta: folder %llu moved to shard %u's folder %llu: its marks "
				 "are left to recovery",
				 (unsigned long long)moved.ino, b, (unsigned long long)dst_parent);
		}
		goto out;
	}
undo:
	/* Given up: B and C undo their part, then the intent goes, then the lock. */
	if ((!begun || fmove_settle(x, b, moved.ino, id, 0) == 0) &&
	    stk_meta_store_xintent_drop(x->st, id) == 0 && locked)
		lock_release(x, id);
out:
	busy_del(x, id);
	return rc;
}

void stk_meta_xshard_kick(struct stk_meta_xshard *x)
{
	pthread_mutex_lock(&x->mu);
	x->kicked = 1;
	pthread_cond_signal(&x->wake);
	pthread_mutex_unlock(&x->mu);
}

int stk_meta_xshard_getattr_for(struct stk_meta_xshard *x, uint64_t ino, uint64_t session,
				struct stk_attr *out, int *leased)
{
	struct stk_msg_meta_xshard_req q = {
	    .op = STK_XSHARD_ATTR, .from = x->shard, .intent = session, .ino = ino};
	struct stk_msg_meta_xshard_resp r;
	int rc;

	*leased = 0;
	if (!session)
		return stk_meta_xshard_getattr(x, ino, out);
	rc = xcall(x, stk_ino_shard(ino), &q, &r);
	if (rc == -EINVAL || rc == -EPROTO || rc == -ENOSYS)
		return stk_meta_xshard_getattr(x, ino, out); /* a leader from before ATTR */
	if (rc)
		return rc == -EIO || rc == -ENOENT ? rc : -EIO;
	if (r.attr.ino != ino)
		return -EIO;
	*out = r.attr;
	*leased = (r.state & STK_XATTR_LEASED) != 0;
	return 0;
}

int stk_meta_xshard_serve(struct stk_meta_xshard *x, const struct stk_msg_meta_xshard_req *q,
			  struct stk_msg_meta_xshard_resp *r)
{
	int rc, state = 0;

	memset(r, 0, sizeof(*r));
	switch (q->op) {
	case STK_XSHARD_MKDIR:
		rc = stk_meta_store_xmkdir(x->st, q->from, q->intent, q->parent, q->name, q->mode,
					   q->uid, q->gid, &r->attr);
		if (rc == 0 && wait_held(x) == 0)
			hook(x, "mkdir", 2);
		return rc;
	case STK_XSHARD_DYING:
		rc = stk_meta_store_xdying(x->st, q->from, q->intent, q->ino, q->name);
		if (rc == 0 && wait_held(x) == 0)
			hook(x, "rmdir", 2);
		return rc;
	case STK_XSHARD_SETTLE:
		if (q->kind < STK_XINTENT_MKDIR || q->kind > STK_XINTENT_FMOVE)
			return -EINVAL;
		rc = settle_here(x, q->from, q->intent, q->done != 0);
		/* a folder's move: A drops its done record on this answer, after which a
		 * mark found again here would be undone, so it must hold past a failover */
		if (rc == 0 && q->kind == STK_XINTENT_FMOVE)
			rc = wait_held(x);
		if (rc == 0 && q->done && wait_held(x) == 0)
			hook(x, kind_name(q->kind), 4);
		if (rc == 0 && q->kind == STK_XINTENT_RENAME)
			stk_meta_xshard_kick(x); /* what it replaced may be another shard's */
		return rc;
	case STK_XSHARD_RENAME:
		rc = stk_meta_store_xrename_in(x->st, q->from, q->intent, q->ino, q->mode,
					       q->parent, q->name, q->uid, q->gid, q->done != 0,
					       &r->attr);
		if (rc == -EALREADY) {
			r->state = STK_XSTATE_NAMED; /* named so already: nothing done */
			return 0;
		}
		if (rc == 0 && wait_held(x) == 0)
			hook(x, "rename", 2);
		return rc;
	case STK_XSHARD_LINK:
		rc = stk_meta_store_xlink_in(x->st, q->from, q->intent, q->ino, q->parent, q->name,
					     &r->attr);
		if (rc == 0 && wait_held(x) == 0)
			hook(x, "link", 2);
		return rc;
	case STK_XSHARD_RELEASE:
		rc = stk_meta_store_xrelease(x->st, q->from, q->ino, q->intent, &r->attr);
		if (rc == 0)
			rc = wait_held(x);
		return rc;
	case STK_XSHARD_COUNT: {
		struct stk_meta_xintent *vi = calloc(COUNT_MAX, sizeof(*vi));
		struct stk_meta_xmark *vm = calloc(COUNT_MAX, sizeof(*vm));
		size_t ni = 0, nm = 0;

		rc = vi && vm ? 0 : -ENOMEM;
		if (rc == 0)
			rc = stk_meta_store_xintents(x->st, vi, COUNT_MAX, &ni);
		if (rc == 0)
			rc = stk_meta_store_xmarks(x->st, vm, COUNT_MAX, &nm);
		if (rc == 0) { /* folder moves not settled yet, and the folder-move lock */
			struct stk_meta_xdone *vd = calloc(COUNT_MAX, sizeof(*vd));
			size_t nd = 0;
			uint32_t holder;
			uint64_t lid;

			rc = vd ? stk_meta_store_xdones(x->st, vd, COUNT_MAX, &nd) : -ENOMEM;
			ni += nd;
			if (stk_meta_store_xlock_get(x->st, &holder, &lid) == 0)
				ni++;
			free(vd);
		}
		r->intents = (uint32_t)ni;
		r->marks = (uint32_t)nm;
		free(vi);
		free(vm);
		return rc;
	}
	case STK_XSHARD_FMOVE:
		rc = stk_meta_store_xfmove_in(x->st, q->from, q->intent, q->ino, q->parent, q->name,
					      q->uid, q->gid, q->done != 0);
		/* A commits on this answer: it must hold here past a failover */
		if (rc == 0)
			rc = wait_held(x);
		if (rc == 0)
			hook(x, "rmove", 2);
		return rc;
	case STK_XSHARD_FPTR:
		rc = stk_meta_store_xfptr(x->st, q->from, q->intent, q->ino, q->parent);
		if (rc == 0)
			rc = wait_held(x);
		if (rc == 0)
			hook(x, "rmove", 2);
		return rc;
	case STK_XSHARD_LOCK:
		rc = stk_meta_store_xlock(x->st, q->from, q->intent, q->done != 0);
		if (rc == 0 && q->done)
			rc = wait_held(x);
		return rc;
	case STK_XSHARD_PARENT:
		rc = stk_meta_store_xparent(x->st, q->ino, &r->attr.ino);
		r->attr.mode = S_IFDIR;
		return rc;
	case STK_XSHARD_QUERY:
		if (q->kind == STK_XQUERY_LOCK) {
			r->state = is_busy(x, q->intent) || stk_meta_store_xheld(x->st, q->intent)
				       ? STK_XSTATE_INTENT
				       : STK_XSTATE_STAYED;
			return 0;
		}
		if (q->kind == STK_XINTENT_FMOVE)
			rc = stk_meta_store_xquery_fmove(x->st, q->intent, &state);
		else if (q->kind == STK_XINTENT_RENAME)
			rc = stk_meta_store_xquery_rename(x->st, q->intent, q->ino, &state);
		else if (q->kind == STK_XINTENT_LINK)
			rc = stk_meta_store_xquery_link(x->st, q->intent, q->ino, &state);
		else
			rc = stk_meta_store_xquery(x->st, q->intent, q->parent, q->name, q->ino,
						   &state);
		r->state = (uint8_t)state;
		/* an intent a request here is still working on: wait for it */
		if (rc == 0 && is_busy(x, q->intent))
			r->state = STK_XSTATE_INTENT;
		return rc;
	}
	return -EINVAL;
}

/* ---- recovery ---- */

/* A: every intent no request works on is given up (xshard.h). */
static void recover_intents(struct stk_meta_xshard *x)
{
	struct stk_meta_xintent *v = calloc(RECOVER_BATCH, sizeof(*v));
	size_t n = 0, left = 0;
	int rc = -ENOMEM;

	/* those claimed now are their requests'; no request claims one later */
	if (v) {
		intent_making(x);
		rc = stk_meta_store_xintents(x->st, v, RECOVER_BATCH, &n);
		for (size_t i = 0; rc == 0 && i < n; i++)
			if (!is_busy(x, v[i].id))
				v[left++] = v[i];
		pthread_mutex_unlock(&x->make_mu);
	}
	if (rc) {
		free(v);
		return;
	}
	for (size_t i = 0; i < left; i++) {
		if (v[i].kind == STK_XINTENT_FMOVE) {
			if (fmove_settle(x, v[i].shard, v[i].ino, v[i].id, 0) == 0 &&
			    stk_meta_store_xintent_drop(x->st, v[i].id) == 0) {
				lock_release(x, v[i].id);
				stk_info("meta: move of folder %llu from folder %llu (intent %llu) "
					 "given up",
					 (unsigned long long)v[i].ino,
					 (unsigned long long)v[i].parent,
					 (unsigned long long)v[i].id);
			}
			continue;
		}
		if (settle(x, v[i].shard, v[i].id, v[i].kind, 0) == 0) {
			stk_meta_store_xintent_drop(x->st, v[i].id);
			stk_info("meta: cross-shard %s of '%s' in folder %llu (intent %llu) given "
				 "up: shard %u undid its part",
				 kind_name(v[i].kind), v[i].name,
				 (unsigned long long)v[i].parent, (unsigned long long)v[i].id,
				 v[i].shard);
		}
	}
	free(v);
}

/* B: every mark is settled by what its folder's parent shard says. */
static void recover_marks(struct stk_meta_xshard *x)
{
	struct stk_meta_xmark *v = calloc(RECOVER_BATCH, sizeof(*v));
	size_t n = 0;

	if (!v || stk_meta_store_xmarks(x->st, v, RECOVER_BATCH, &n)) {
		free(v);
		return;
	}
	for (size_t i = 0; i < n; i++) {
		struct stk_msg_meta_xshard_req q = {.op = STK_XSHARD_QUERY,
						    .from = x->shard,
						    .intent = v[i].intent,
						    .ino = v[i].ino,
						    .parent = v[i].parent};
		struct stk_msg_meta_xshard_resp r;
		int done;

		snprintf(q.name, sizeof(q.name), "%s", v[i].name);
		if (v[i].kind == STK_XMARK_FVICTIM)
			continue; /* settled with its move's FMOVE mark */
		if (v[i].kind == STK_XMARK_FMOVE || v[i].kind == STK_XMARK_FPTR) {
			q.kind = STK_XINTENT_FMOVE;
			if (xcall(x, v[i].from, &q, &r) ||
			    (r.state != STK_XSTATE_MOVED && r.state != STK_XSTATE_STAYED))
				continue; /* out of reach, or still under way there */
			done = r.state == STK_XSTATE_MOVED;
			if (settle_here(x, v[i].from, v[i].intent, done) == 0)
				stk_info("meta: folder %llu, moved for shard %u's intent %llu: %s",
					 (unsigned long long)v[i].ino, v[i].from,
					 (unsigned long long)v[i].intent, done ? "kept" : "undone");
			continue;
		}
		if (v[i].kind == STK_XMARK_RENAME || v[i].kind == STK_XMARK_LINK) {
			int link = v[i].kind == STK_XMARK_LINK;

			q.kind = link ? STK_XINTENT_LINK : STK_XINTENT_RENAME;
			if (xcall(x, v[i].from, &q, &r) ||
			    (r.state != STK_XSTATE_MOVED && r.state != STK_XSTATE_STAYED))
				continue; /* out of reach, or still under way there */
			done = r.state == STK_XSTATE_MOVED;
			if (settle_here(x, v[i].from, v[i].intent, done) == 0)
				stk_info("meta: file %llu, %s for shard %u's intent %llu: %s",
					 (unsigned long long)v[i].ino,
					 link ? "linked there" : "renamed here", v[i].from,
					 (unsigned long long)v[i].intent,
					 done ? "kept" : "undone");
			continue;
		}
		if (xcall(x, v[i].from, &q, &r) || r.state == STK_XSTATE_INTENT)
			continue; /* out of reach, or still under way there */
		if (r.state != STK_XSTATE_NAMED && r.state != STK_XSTATE_UNNAMED)
			continue;
		/* named: a pending folder was made, a dying one was not removed */
		done = (v[i].kind == STK_XMARK_PENDING) == (r.state == STK_XSTATE_NAMED);
		if (settle_here(x, v[i].from, v[i].intent, done) == 0)
			stk_info("meta: folder %llu, %s for shard %u's intent %llu: %s",
				 (unsigned long long)v[i].ino,
				 v[i].kind == STK_XMARK_PENDING ? "pending" : "dying", v[i].from,
				 (unsigned long long)v[i].intent,
				 v[i].kind == STK_XMARK_PENDING ? (done ? "kept" : "deleted")
								: (done ? "deleted" : "kept"));
	}
	free(v);
}

/* D: each name of a file of another shard that went is told to the file's home. */
static void recover_releases(struct stk_meta_xshard *x)
{
	struct stk_meta_xrelease *v = calloc(RECOVER_BATCH, sizeof(*v));
	size_t n = 0;

	if (!v || stk_meta_store_xreleases(x->st, v, RECOVER_BATCH, &n)) {
		free(v);
		return;
	}
	for (size_t i = 0; i < n; i++) {
		struct stk_msg_meta_xshard_req q = {.op = STK_XSHARD_RELEASE,
						    .from = x->shard,
						    .intent = v[i].id,
						    .ino = v[i].ino};
		struct stk_msg_meta_xshard_resp r;

		if (xcall(x, v[i].home, &q, &r) == 0)
			stk_meta_store_xrelease_done(x->st, v[i].ino);
	}
	free(v);
}

/* A: each committed folder move's marks settled, then its record and its lock go. */
static void recover_dones(struct stk_meta_xshard *x)
{
	struct stk_meta_xdone *v = calloc(RECOVER_BATCH, sizeof(*v));
	size_t n = 0;

	if (!v || stk_meta_store_xdones(x->st, v, RECOVER_BATCH, &n)) {
		free(v);
		return;
	}
	for (size_t i = 0; i < n; i++) {
		if (is_busy(x, v[i].id))
			continue;
		if (fmove_settle(x, v[i].shard, v[i].ino, v[i].id, 1) == 0 &&
		    stk_meta_store_xdone_drop(x->st, v[i].id) == 0) {
			lock_release(x, v[i].id);
			stk_info("meta: move of folder %llu (intent %llu) finished by recovery",
				 (unsigned long long)v[i].ino, (unsigned long long)v[i].id);
		}
	}
	free(v);
}

/* Shard 1: the folder-move lock goes once its holder no longer works under it. */
static void recover_lock(struct stk_meta_xshard *x)
{
	uint32_t holder;
	uint64_t id;
	int held;

	if (x->shard != 1 || stk_meta_store_xlock_get(x->st, &holder, &id))
		return;
	if (holder == x->shard) {
		held = is_busy(x, id) || stk_meta_store_xheld(x->st, id);
	} else {
		struct stk_msg_meta_xshard_req q = {.op = STK_XSHARD_QUERY,
						    .from = x->shard,
						    .intent = id,
						    .kind = STK_XQUERY_LOCK};
		struct stk_msg_meta_xshard_resp r;

		if (xcall(x, holder, &q, &r))
			return; /* out of reach: asked again next time */
		held = r.state != STK_XSTATE_STAYED;
	}
	if (!held && stk_meta_store_xlock(x->st, holder, id, 0) == 0)
		stk_info("meta: the folder-move lock of shard %u (id %llu) released: its move "
			 "is over",
			 holder, (unsigned long long)id);
}

static void *recover_main(void *arg)
{
	struct stk_meta_xshard *x = arg;
	uint64_t due = 0;

	/*
	 * Every RECOVER_MS, all of it; woken by a kick (a release to tell) in between,
	 * the releases only: a kick comes with every rename over another shard's file,
	 * and asking about every mark in flight each time would only add round trips.
	 */
	pthread_mutex_lock(&x->mu);
	while (!x->stop) {
		int all = stk_now_ns() >= due;
		struct timespec ts;

		x->kicked = 0;
		pthread_mutex_unlock(&x->mu);
		if (stk_meta_repl_serving(x->repl)) {
			if (all) {
				recover_intents(x);
				recover_dones(x);
				recover_marks(x);
			}
			recover_releases(x);
			if (all)
				recover_lock(x);
		}
		pthread_mutex_lock(&x->mu);
		if (all)
			due = stk_now_ns() + RECOVER_MS * 1000000ull;
		ts.tv_sec = (time_t)(due / 1000000000ull);
		ts.tv_nsec = (long)(due % 1000000000ull);
		if (!x->stop && !x->kicked)
			pthread_cond_timedwait(&x->wake, &x->mu, &ts);
	}
	pthread_mutex_unlock(&x->mu);
	return NULL;
}

int stk_meta_xshard_create(struct stk_meta_store *st, struct stk_meta_repl *repl, const char *dir,
			   struct stk_meta_xshard **out)
{
	struct stk_meta_xshard *x = calloc(1, sizeof(*x));
	pthread_condattr_t ca;
	int rc;

	if (!x)
		return -ENOMEM;
	x->st = st;
	x->repl = repl;
	x->shard = stk_meta_store_shard(st);
	x->local_lock_next = LOCAL_LOCK_BIT | (stk_now_ns() & (LOCAL_LOCK_BIT - 1));
	rc = hook_parse(x, dir);
	if (rc == 0)
		rc = hold_parse(x);
	if (rc == 0)
		rc = stk_pool_create(2, &x->pool);
	if (rc) {
		free(x);
		return rc;
	}
	pthread_mutex_init(&x->make_mu, NULL);
	pthread_mutex_init(&x->mu, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&x->wake, &ca);
	pthread_condattr_destroy(&ca);
	*out = x;
	return 0;
}

void stk_meta_xshard_leases(struct stk_meta_xshard *x, struct stk_meta_leases *leases)
{
	x->leases = leases;
}

int stk_meta_xshard_start(struct stk_meta_xshard *x, struct stk_agent *agent)
{
	int rc;

	x->agent = agent;
	rc = -pthread_create(&x->thr, NULL, recover_main, x);
	if (rc == 0)
		x->running = 1;
	return rc;
}

void stk_meta_xshard_destroy(struct stk_meta_xshard *x)
{
	if (!x)
		return;
	pthread_mutex_lock(&x->mu);
	x->stop = 1;
	pthread_cond_signal(&x->wake);
	pthread_mutex_unlock(&x->mu);
	if (x->running)
		pthread_join(x->thr, NULL);
	stk_pool_destroy(x->pool);
	pthread_cond_destroy(&x->wake);
	pthread_mutex_destroy(&x->mu);
	pthread_mutex_destroy(&x->make_mu);
	free(x);
}

int stk_meta_xshard_ask(struct stk_meta_xshard *x, unsigned shard, uint16_t opcode, const void *req,
			size_t len, void *resp, size_t cap, size_t *rlen)
{
	return call(x, shard, opcode, req, len, resp, cap, rlen);
}

int stk_meta_xshard_call(struct stk_meta_xshard *x, unsigned shard,
			 const struct stk_msg_meta_xshard_req *q, struct stk_msg_meta_xshard_resp *r)
{
	return xcall(x, shard, q, r);
}
