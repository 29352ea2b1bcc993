/*
 * Write-behind of names in delegated folders (behind.h says what it promises).
 *
 * The queues: one per metadata shard (docs/meta-shards.md), each with the records
 * answered in that shard's folders in the order they were answered, appended under
 * `mu`. A folder of shard K is delegated by K's meta to K's holder, its records go
 * to K's meta (META_NAMES with K's holder as origin) and its new files get numbers
 * K reserved (META_INOS to K), so each shard's queue, numbers and placement are its
 * own. One sender at a time (`send_mu`) takes what is queued and sends it in
 * batches of STK_NAMES_MAX, so each shard's records reach it in order; whoever must
 * see a queue at meta (a flush) takes `send_mu` after its records were queued,
 * which it gets only once a sender that took them is done. The thread sends what
 * gathered for GATHER_US after the first record, and keeps each shard's reserve of
 * inode numbers full once that shard was used.
 *
 * The gate: a create or unlink answered here holds it shared from its check of the
 * folder to its record; the watch holds it exclusive while it applies revocations.
 * So a revocation is either applied before a check (which then fails) or after
 * the record is queued (which the watch's flush then sends before it acknowledges).
 */
#include "behind.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../common/layout.h"
#include "../common/log.h"
#include "../common/util.h"
#include "../proto/status.h"
#include "../proto/wire.h"
#include "client.h"
#include "lcache.h"
#include "session.h"

#define GATHER_US 1000u	  /* how long the thread lets records gather before it sends */
#define QUEUE_MAX 2048u	  /* records queued for a shard past which answers here wait for
			     the thread: a watch's flush of them stays well within meta's wait */
#define INOS_GRAB 4096u	  /* inode numbers reserved at a time */
#define INOS_LOW 1024u	  /* the thread reserves more below this many */
#define RESP_CAP (256u << 10)
#define PLACEMENT_RETRY_NS (100ull * 1000000ull)
#define FAILED_KEEP 64u	  /* refused creates remembered for their files' first writes */
#define ALLOW_SLOTS 16u	  /* quotas this client holds inode allowances in at a time */
#define ALLOW_FIRST 64u	  /* inodes asked for at first, doubling with each refill */
#define ALLOW_MOST 4096u  /* ... up to this many */
#define ALLOW_DENIED_NS (100ull * 1000000ull) /* after a DQUOT, ask again only this late */
#define ALLOW_IDLE_NS (2000ull * 1000000ull)  /* an allowance unspent this long goes back */
#define BYTES_FIRST (1u << 20)		      /* bytes asked for at first, doubling ... */
#define BYTES_MOST (64u << 20)		      /* ... up to this many */

struct inos {
	uint64_t next, end; /* [next, end) reserved and unused */
};

/* A shard's queue: its records not yet taken by a sender, in order. */
struct bq {
	struct stk_msg_name_rec *q; /* QUEUE_MAX, allocated at the shard's first record */
	unsigned n;
	uint64_t nqueued, nsent; /* records ever queued, and ever taken off the queue */
};

/* A shard's inode numbers, and its meta's placement with the last reserve. */
struct bshard {
	struct inos cur, spare; /* numbers used now, and the next reserve */
	uint32_t chunk_size, stripe, nchains;
	uint64_t asked_ns; /* when numbers were last asked for because of no placement */
	uint8_t want_inos; /* the thread should reserve */
	uint8_t no_inos;   /* this shard's meta cannot (an older one): nothing answered there */
};

/* The holder id the meta of inode ino's shard knows this client by (lcache.h). */
static uint32_t holder_of(stk_client *c, uint64_t ino)
{
	return stk_lcache_holder(c, stk_ino_shard(ino));
}

/*
 * An inode allowance (META_ALLOW, docs/quotas.md): creates this client may answer
 * in folders counted in quota qid. Good only for the holder and the session (its
 * quota epoch) it was granted to: meta drops it when either goes.
 */
struct allow {
	uint64_t qid, left;
	uint32_t holder, qepoch;
	uint32_t step;	    /* what the next refill asks for */
	uint64_t denied_ns; /* the last DQUOT */
	uint64_t spent_ns;  /* the last spend or grant */
	uint64_t dir;	    /* the folder of the last grant: named to give it back */
	/*
	 * The byte allowance (META_ALLOW_BYTES) in the same quota: `bleft` may be
	 * taken by handles (stk_behind_bytes_take), `bout` was taken by handles and
	 * not yet reported to meta or given back to bleft. Meta holds bleft + bout
	 * aside (or more: a report may spend less than was taken).
	 */
	uint64_t bleft, bout;
	uint32_t bstep;
	uint64_t bdenied_ns, bspent_ns;
	uint64_t bdir; /* the inode of the last grant */
};

struct stk_behind {
	pthread_mutex_t mu;
	pthread_cond_t wake; /* the thread: records queued, numbers low, stop */
	pthread_cond_t room; /* answers waiting for the queue to shrink */
	pthread_rwlock_t gate;
	pthread_mutex_t send_mu; /* one sender at a time, in order */
	struct bq bq[STK_MAX_SHARDS + 1]; /* by shard, 1..STK_MAX_SHARDS */
	struct bshard sh[STK_MAX_SHARDS + 1];
	unsigned n;		 /* records queued, all shards */
	unsigned want_inos;	 /* shards (bit K-1) whose numbers the thread should reserve */
	_Atomic unsigned urgent; /* callers waiting for send_mu, whom the thread lets go first */
	_Atomic unsigned queued; /* n, read without mu */
	int no_bytes;  /* meta has no byte allowances (an older one): writes reserve */
	int err;	/* the first refusal not yet reported */
	uint64_t failed[FAILED_KEEP]; /* the last creates meta refused (stk_behind_settle) */
	unsigned nfailed;
	struct allow allow[ALLOW_SLOTS];
	int stop;
	pthread_t thr;
	int have_thread;
	struct stk_behind_stats st;
	/* The sender's buffers (under send_mu). */
	struct stk_msg_name_rec *batch;
	uint8_t *req, *resp;
	size_t req_cap;
};

/* ---- inode allowances ---- */

/* With mu: quota qid's allowance slot, valid for holder now, or NULL. */
static struct allow *allow_slot(stk_client *c, struct stk_behind *b, uint64_t qid, uint32_t holder)
{
	uint32_t qepoch = atomic_load(&c->quota_epoch);

	for (unsigned i = 0; i < ALLOW_SLOTS; i++) {
		struct allow *a = &b->allow[i];

		if (a->qid != qid)
			continue;
		if (a->holder != holder || a->qepoch != qepoch) {
			/* meta dropped it with the holder or the session: start again */
			a->left = 0;
			a->holder = holder;
			a->qepoch = qepoch;
			a->step = ALLOW_FIRST;
			a->bleft = a->bout = 0;
			a->bstep = BYTES_FIRST;
		}
		return a;
	}
	return NULL;
}

/*
 * With mu: spends one of quota qid's allowance granted to holder (qid 0: no quota).
 * 1, or 0: none left.
 */
static int allow_spend(stk_client *c, struct stk_behind *b, uint64_t qid, uint32_t holder)
{
	struct allow *a;

	if (!qid)
		return 1;
	a = allow_slot(c, b, qid, holder);
	if (!a || !a->left)
		return 0;
	a->left--;
	a->spent_ns = stk_now_ns();
	return 1;
}

/*
 * The thread, without mu: gives n of quota qid's allowance back to meta, unspent
 * for ALLOW_IDLE_NS, so that other clients of the quota find the room. It names
 * the folder of the last grant (a client key may reach nothing above it), or the
 * quota root, which counts in itself, when that folder is gone. A holder reset
 * since has nothing to give (meta dropped it): AGAIN, ignored.
 */
static void allow_give_back(stk_client *c, uint64_t qid, uint64_t dir, uint32_t holder, uint64_t n,
			    int bytes)
{
	struct stk_msg_meta_allow_req q = {
	    .session = stk_session_id(c),
	    .dir = dir ? dir : qid,
	    .give = n == UINT64_MAX ? UINT32_MAX : (uint32_t)STK_MIN(n, (uint64_t)UINT32_MAX - 1)};
	uint16_t op = bytes ? STK_OP_META_ALLOW_BYTES : STK_OP_META_ALLOW;
	uint8_t req[64], resp[64];
	struct stk_wbuf w;
	size_t rlen = 0;
	int rc;

	for (int tries = 0; tries < 2; tries++) {
		stk_wbuf_init(&w, req, sizeof(req));
		stk_msg_meta_allow_req_enc(&w, &q);
		rc =
		    stk_client_meta_call_from(c, holder, op, req, w.len, resp, sizeof(resp), &rlen);
		if (rc != -ENOENT || q.dir == qid)
			break;
		q.dir = qid;
	}
	if (rc && rc != -EAGAIN)
		stk_debug("write-behind: giving back %llu %s of quota %llu: %s",
			  (unsigned long long)n, bytes ? "bytes" : "inodes",
			  (unsigned long long)qid, stk_strerror(rc));
}

/*
 * With mu, for the thread: takes an allowance unspent for ALLOW_IDLE_NS out of its
 * slot into *qid, *holder, *n (1), or 0 and *next_ns: when the next one falls idle
 * (0: none holds any).
 */
static int allow_idle(stk_client *c, struct stk_behind *b, uint64_t now, uint64_t *qid,
		      uint64_t *dir, uint32_t *holder, uint64_t *n, int *bytes, uint64_t *next_ns)
{
	uint32_t qepoch = atomic_load(&c->quota_epoch);

	*next_ns = 0;
	*bytes = 0;
	for (unsigned i = 0; i < ALLOW_SLOTS; i++) {
		struct allow *a = &b->allow[i];

		if (!a->qid || a->qepoch != qepoch)
			continue;
		if (a->bleft && now - a->bspent_ns >= ALLOW_IDLE_NS) {
			/* None out in handles: all of it, what reports spent less included. */
			*qid = a->qid;
			*dir = a->bdir;
			*holder = a->holder;
			*n = a->bout ? a->bleft : UINT64_MAX;
			*bytes = 1;
			a->bleft = 0;
			a->bstep = BYTES_FIRST;
			return 1;
		}
		if (a->bleft && (!*next_ns || a->bspent_ns + ALLOW_IDLE_NS < *next_ns))
			*next_ns = a->bspent_ns + ALLOW_IDLE_NS;
		if (!a->left)
			continue;
		if (now - a->spent_ns >= ALLOW_IDLE_NS) {
			*qid = a->qid;
			*dir = a->dir;
			*holder = a->holder;
			*n = a->left;
			a->left = 0;
			a->step = ALLOW_FIRST;
			return 1;
		}
		if (!*next_ns || a->spent_ns + ALLOW_IDLE_NS < *next_ns)
			*next_ns = a->spent_ns + ALLOW_IDLE_NS;
	}
	return 0;
}

/*
 * With mu: a slot for quota qid, taken from a quota that holds nothing in it
 * (neither inodes nor bytes, none out in handles), or NULL: all are busy.
 */
static struct allow *allow_new(stk_client *c, struct stk_behind *b, uint64_t qid, uint32_t holder)
{
	uint32_t qepoch = atomic_load(&c->quota_epoch);
	struct allow *a = NULL;

	for (unsigned i = 0; i < ALLOW_SLOTS && !a; i++) {
		struct allow *s = &b->allow[i];

		if (!s->qid || s->qepoch != qepoch || (!s->left && !s->bleft && !s->bout))
			a = s;
	}
	if (a) {
		memset(a, 0, sizeof(*a));
		a->qid = qid;
		a->holder = holder;
		a->qepoch = qepoch;
		a->step = ALLOW_FIRST;
		a->bstep = BYTES_FIRST;
	}
	return a;
}

/*
 * Asks meta for more of the allowance of the quota folder parent counts in (qid
 * here). Without the gate: the call sends the queue first. 0 when some was granted
 * (the caller tries again), else -EAGAIN (the caller asks meta to create).
 */
static int allow_refill(stk_client *c, struct stk_behind *b, uint64_t parent, uint64_t qid)
{
	struct stk_msg_meta_allow_req q = {.session = stk_session_id(c), .dir = parent};
	struct stk_msg_meta_allow_resp r;
	uint32_t holder;
	uint8_t req[64], resp[64];
	uint64_t now = stk_now_ns();
	struct stk_wbuf w;
	struct stk_rbuf rb;
	struct allow *a;
	size_t rlen = 0;
	int rc;

	holder = holder_of(c, qid);
	if (!holder || !q.session)
		return -EAGAIN;
	pthread_mutex_lock(&b->mu);
	a = allow_slot(c, b, qid, holder);
	if (!a) { /* a slot of a quota not used for longest... the first with none left */
		a = allow_new(c, b, qid, holder);
	}
	rc = !a || (a->denied_ns && now - a->denied_ns < ALLOW_DENIED_NS) ? -EAGAIN : 0;
	q.want = a ? a->step : 0;
	pthread_mutex_unlock(&b->mu);
	if (rc)
		return rc;
	stk_wbuf_init(&w, req, sizeof(req));
	stk_msg_meta_allow_req_enc(&w, &q);
	rc = stk_client_meta_call_from(c, holder, STK_OP_META_ALLOW, req, w.len, resp, sizeof(resp),
				       &rlen);
	if (rc == 0) {
		stk_rbuf_init(&rb, resp, rlen);
		if (stk_msg_meta_allow_resp_dec(&rb, &r) || stk_rbuf_finish(&rb))
			rc = -EIO;
	}
	pthread_mutex_lock(&b->mu);
	a = allow_slot(c, b, qid, holder);
	if (a && rc == -EDQUOT)
		a->denied_ns = stk_now_ns();
	if (a && rc == 0 && r.granted && (r.qid == qid || !r.qid)) {
		a->left += r.granted;
		a->dir = parent;
		a->denied_ns = 0;
		a->spent_ns = stk_now_ns();
		pthread_cond_signal(&b->wake); /* the thread gives it back once idle */
		a->step = STK_MIN(a->step * 2, ALLOW_MOST);
		b->st.allowed += r.granted;
	} else {
		rc = -EAGAIN; /* refused, or counted in another quota now: meta decides */
	}
	pthread_mutex_unlock(&b->mu);
	return rc;
}

/* ---- byte allowances ---- */

/*
 * Asks meta (META_ALLOW_BYTES) for at least n bytes more of quota qid's byte
 * allowance, naming ino (the file being written). 0 when some was granted, else
 * -EAGAIN (the caller reserves instead).
 */
static int bytes_refill(stk_client *c, struct stk_behind *b, uint64_t ino, uint64_t qid,
			uint32_t holder, uint64_t n)
{
	struct stk_msg_meta_allow_req q = {.session = stk_session_id(c), .dir = ino};
	struct stk_msg_meta_allow_resp r;
	uint8_t req[64], resp[64];
	uint64_t now = stk_now_ns();
	struct stk_wbuf w;
	struct stk_rbuf rb;
	struct allow *a;
	size_t rlen = 0;
	int rc;

	pthread_mutex_lock(&b->mu);
	a = allow_slot(c, b, qid, holder);
	if (!a)
		a = allow_new(c, b, qid, holder);
	rc = !a || b->no_bytes || (a->bdenied_ns && now - a->bdenied_ns < ALLOW_DENIED_NS) ? -EAGAIN
											   : 0;
	q.want =
	    a ? (uint32_t)STK_MIN(STK_MAX((uint64_t)a->bstep, n), (uint64_t)STK_ALLOW_BYTES_MAX)
	      : 0;
	pthread_mutex_unlock(&b->mu);
	if (rc)
		return rc;
	stk_wbuf_init(&w, req, sizeof(req));
	stk_msg_meta_allow_req_enc(&w, &q);
	rc = stk_client_meta_call_from(c, holder, STK_OP_META_ALLOW_BYTES, req, w.len, resp,
				       sizeof(resp), &rlen);
	if (rc == 0) {
		stk_rbuf_init(&rb, resp, rlen);
		if (stk_msg_meta_allow_resp_dec(&rb, &r) || stk_rbuf_finish(&rb))
			rc = -EIO;
	}
	pthread_mutex_lock(&b->mu);
	if (rc == -EOPNOTSUPP || rc == -ENOSYS || rc == -EPROTO)
		b->no_bytes = 1; /* an older meta: every write past a size reserves */
	a = allow_slot(c, b, qid, holder);
	if (a && rc == -EDQUOT)
		a->bdenied_ns = stk_now_ns();
	if (a && rc == 0 && r.granted && r.qid == qid) {
		a->bleft += r.granted;
		a->bdir = ino;
		a->bdenied_ns = 0;
		a->bspent_ns = stk_now_ns();
		a->bstep = (uint32_t)STK_MIN((uint64_t)a->bstep * 2, (uint64_t)BYTES_MOST);
		b->st.allowed_bytes += r.granted;
		pthread_cond_signal(&b->wake); /* the thread gives it back once idle */
	} else {
		rc = -EAGAIN; /* refused, or counted in another quota now: reserve */
	}
	pthread_mutex_unlock(&b->mu);
	return rc;
}

int stk_behind_bytes_take(stk_client *c, uint64_t ino, uint64_t qid, uint64_t n,
			  struct stk_bytes_tag *tag)
{
	struct stk_behind *b = c->behind;
	uint32_t holder;
	int refilled = 0;

	if (!b || !qid || !n || n > STK_ALLOW_BYTES_MAX)
		return -EAGAIN;
	holder = holder_of(c, qid); /* the quota's shard's: its meta sets the bytes aside */
	if (!holder || !stk_session_id(c))
		return -EAGAIN;
	for (;;) {
		struct allow *a;

		pthread_mutex_lock(&b->mu);
		a = allow_slot(c, b, qid, holder);
		if (a && a->bleft >= n) {
			a->bleft -= n;
			a->bout += n;
			a->bspent_ns = stk_now_ns();
			tag->qid = qid;
			tag->holder = holder;
			tag->qepoch = a->qepoch;
			pthread_mutex_unlock(&b->mu);
			return 0;
		}
		pthread_mutex_unlock(&b->mu);
		if (refilled++ || bytes_refill(c, b, ino, qid, holder, n))
			return -EAGAIN;
	}
}

/* With mu: the slot tag's bytes were taken from, if meta still holds them. */
static struct allow *bytes_slot(stk_client *c, struct stk_behind *b,
				const struct stk_bytes_tag *tag)
{
	for (unsigned i = 0; i < ALLOW_SLOTS; i++) {
		struct allow *a = &b->allow[i];

		if (a->qid == tag->qid && a->holder == tag->holder && a->qepoch == tag->qepoch &&
		    a->qepoch == atomic_load(&c->quota_epoch))
			return a;
	}
	return NULL;
}

int stk_behind_bytes_valid(stk_client *c, const struct stk_bytes_tag *tag)
{
	struct stk_behind *b = c->behind;
	int ok;

	if (!b || !tag->qid || holder_of(c, tag->qid) != tag->holder)
		return 0;
	pthread_mutex_lock(&b->mu);
	ok = bytes_slot(c, b, tag) != NULL;
	pthread_mutex_unlock(&b->mu);
	return ok;
}

void stk_behind_bytes_release(stk_client *c, uint64_t qid)
{
	struct stk_behind *b = c->behind;
	uint32_t holder = qid ? holder_of(c, qid) : 0;
	uint64_t n = 0, dir = 0;
	struct allow *a;

	if (!b || !qid || !holder)
		return;
	pthread_mutex_lock(&b->mu);
	a = allow_slot(c, b, qid, holder);
	if (a && a->bleft) {
		/* None out in handles: all of it, what reports spent less included. */
		n = a->bout ? a->bleft : UINT64_MAX;
		dir = a->bdir;
		a->bleft = 0;
		a->bstep = BYTES_FIRST;
	}
	pthread_mutex_unlock(&b->mu);
	if (n)
		allow_give_back(c, qid, dir, holder, n, 1);
}

void stk_behind_bytes_done(stk_client *c, const struct stk_bytes_tag *tag, uint64_t spent,
			   uint64_t back)
{
	struct stk_behind *b = c->behind;
	struct allow *a;

	if (!b || !tag->qid || (!spent && !back))
		return;
	pthread_mutex_lock(&b->mu);
	a = bytes_slot(c, b, tag);
	if (a) {
		a->bout -= STK_MIN(a->bout, spent + back);
		a->bleft += back;
		if (back) {
			a->bspent_ns = stk_now_ns();
			pthread_cond_signal(&b->wake);
		}
	}
	pthread_mutex_unlock(&b->mu);
}

/* ---- sending ---- */

/* Meta's answer to one record, with send_mu. */
static void settle(stk_client *c, struct stk_behind *b, const struct stk_msg_name_rec *m,
		   const struct stk_msg_name_res *r)
{
	int rc = r->status ? stk_status_to_errno(r->status) : 0;

	if (rc) {
		stk_error("write-behind: meta refused the %s of '%s' in folder 0x%llx (inode 0x%llx): "
			  "%s; the %s it was told about is undone",
			  m->op == STK_NAME_CREATE ? "create" : "unlink", m->name,
			  (unsigned long long)m->parent, (unsigned long long)m->ino, stk_strerror(rc),
			  m->op == STK_NAME_CREATE ? "file the application" : "removal the application");
		pthread_mutex_lock(&b->mu);
		b->st.failed++;
		if (!b->err)
			b->err = -EIO;
		if (m->op == STK_NAME_CREATE)
			b->failed[b->nfailed++ % FAILED_KEEP] = m->ino;
		pthread_mutex_unlock(&b->mu);
		return;
	}
	/*
	 * A removed file nobody holds open: its chunks go, as after META_UNLINK, but
	 * without a call to meta: this thread holds send_mu, which such a call takes.
	 */
	if (m->op == STK_NAME_UNLINK && r->attr.nlink == 0 && !r->orphaned && S_ISREG(r->attr.mode))
		stk_client_remove_data_nowait(c, &r->attr);
}

/*
 * Sends batch[0..n), records of shard's folders, as one META_NAMES to that shard's
 * meta with its holder as origin, with send_mu. 0 or -errno (all unsent).
 */
static int send_batch(stk_client *c, struct stk_behind *b, unsigned shard, unsigned n)
{
	struct stk_msg_meta_names_req q = {.n = n};
	struct stk_msg_meta_names_resp rr;
	struct stk_wbuf w;
	struct stk_rbuf r;
	size_t rlen = 0;
	int rc;

	stk_wbuf_init(&w, b->req, b->req_cap);
	stk_msg_meta_names_req_enc(&w, &q);
	for (unsigned i = 0; i < n; i++)
		stk_msg_name_rec_enc(&w, &b->batch[i]);
	if (w.err)
		return -EMSGSIZE;
	rc = stk_client_meta_call_shard(c, shard, stk_lcache_holder(c, shard), STK_OP_META_NAMES,
					b->req, w.len, b->resp, RESP_CAP, &rlen);
	if (rc)
		return rc;
	stk_rbuf_init(&r, b->resp, rlen);
	if (stk_msg_meta_names_resp_dec(&r, &rr) || rr.n != n)
		return -EPROTO;
	for (unsigned i = 0; i < n; i++) {
		struct stk_msg_name_res res;

		if (stk_msg_name_res_dec(&r, &res))
			return -EPROTO;
		settle(c, b, &b->batch[i], &res);
	}
	pthread_mutex_lock(&b->mu);
	b->st.batches++;
	pthread_mutex_unlock(&b->mu);
	return 0;
}

/*
 * Sends what is queued for shard, in order, with send_mu, until every record
 * queued there before its `upto`th has gone (so that a flush ends even while
 * others keep queueing). A batch meta did not take (it is down) is tried again
 * until the client's retries give up (a shard's leader lost: its promoted follower
 * takes it); then its records are lost, and said so.
 */
static void send_upto(stk_client *c, struct stk_behind *b, unsigned shard, uint64_t upto)
{
	struct bq *bq = &b->bq[shard];

	for (;;) {
		unsigned n;
		int rc;

		pthread_mutex_lock(&b->mu);
		n = bq->nsent < upto ? STK_MIN(bq->n, STK_NAMES_MAX) : 0;
		if (n)
			memcpy(b->batch, bq->q, n * sizeof(*bq->q));
		pthread_mutex_unlock(&b->mu);
		if (!n)
			return;
		rc = send_batch(c, b, shard, n);
		if (rc == -EIO || rc == -ENOTCONN) /* meta away past the retries: once more */
			rc = send_batch(c, b, shard, n);
		if (rc) {
			stk_error("write-behind: %u creates and unlinks could not reach meta of "
				  "shard %u: %s; they are lost",
				  n, shard, stk_strerror(rc));
		}
		pthread_mutex_lock(&b->mu);
		if (rc) {
			b->st.failed += n;
			if (!b->err)
				b->err = -EIO;
			for (unsigned i = 0; i < n; i++)
				if (b->batch[i].op == STK_NAME_CREATE)
					b->failed[b->nfailed++ % FAILED_KEEP] = b->batch[i].ino;
		}
		memmove(bq->q, bq->q + n, (bq->n - n) * sizeof(*bq->q));
		bq->n -= n;
		bq->nsent += n;
		b->n -= n;
		atomic_store(&b->queued, b->n);
		pthread_cond_broadcast(&b->room);
		pthread_mutex_unlock(&b->mu);
	}
}

/*
 * Sends what is queued now for shard (0: for every shard); `urgent`: a caller that
 * waits for it (not the thread).
 */
static void send_now(stk_client *c, struct stk_behind *b, int urgent, unsigned shard)
{
	uint64_t upto[STK_MAX_SHARDS + 1] = {0};

	pthread_mutex_lock(&b->mu);
	for (unsigned s = 1; s <= STK_MAX_SHARDS; s++)
		if (!shard || s == shard)
			upto[s] = b->bq[s].nqueued;
	pthread_mutex_unlock(&b->mu);
	if (urgent)
		atomic_fetch_add(&b->urgent, 1);
	pthread_mutex_lock(&b->send_mu);
	for (unsigned s = 1; s <= STK_MAX_SHARDS; s++)
		if (upto[s])
			send_upto(c, b, s, upto[s]);
	pthread_mutex_unlock(&b->send_mu);
	if (urgent)
		atomic_fetch_sub(&b->urgent, 1);
}

/* Reserves inode numbers of shard's into its spare (the thread, without mu). */
static void reserve(stk_client *c, struct stk_behind *b, unsigned shard)
{
	struct stk_msg_meta_inos_req q = {.count = INOS_GRAB};
	struct stk_msg_meta_inos_resp r;
	uint8_t req[32], resp[64 + STK_VOUCH_REC_LEN + 2]; /* and meta's voucher */
	struct bshard *sh = &b->sh[shard];
	struct stk_wbuf w;
	struct stk_rbuf rb;
	size_t rlen = 0;
	int rc;

	stk_wbuf_init(&w, req, sizeof(req));
	stk_msg_meta_inos_req_enc(&w, &q);
	/* Shard K hands out numbers that name K (msg.h, stk_ino_shard). */
	rc = stk_client_meta_call_shard(c, shard, 0, STK_OP_META_INOS, req, w.len, resp,
					sizeof(resp), &rlen);
	if (rc == 0) {
		stk_rbuf_init(&rb, resp, rlen);
		if (stk_msg_meta_inos_resp_dec(&rb, &r) || stk_rbuf_finish(&rb) || !r.count ||
		    r.first + r.count < r.first || stk_ino_shard(r.first) != shard ||
		    stk_ino_shard(r.first + r.count - 1) != shard)
			rc = -EPROTO;
	}
	pthread_mutex_lock(&b->mu);
	b->want_inos &= ~(1u << (shard - 1));
	if (rc == 0) {
		sh->spare.next = r.first;
		sh->spare.end = r.first + r.count;
		sh->chunk_size = r.chunk_size;
		sh->stripe = r.stripe;
		sh->nchains = r.nchains;
	} else if (rc == -EOPNOTSUPP || rc == -ENOSYS || rc == -EPROTO) {
		sh->no_inos = 1;
		stk_warn("write-behind: meta of shard %u cannot reserve inode numbers (%s): off "
			 "there",
			 shard, stk_strerror(rc));
	} else {
		stk_debug("write-behind: no inode numbers from meta of shard %u: %s", shard,
			  stk_strerror(rc));
	}
	pthread_mutex_unlock(&b->mu);
}

static void *behind_main(void *arg)
{
	stk_client *c = arg;
	struct stk_behind *b = c->behind;

	pthread_mutex_lock(&b->mu);
	while (!b->stop) {
		if (!b->n && !b->want_inos) {
			uint64_t qid, dir, n, next_ns;
			uint32_t holder;
			int bytes;

			if (allow_idle(c, b, stk_now_ns(), &qid, &dir, &holder, &n, &bytes,
				       &next_ns)) {
				pthread_mutex_unlock(&b->mu);
				allow_give_back(c, qid, dir, holder, n, bytes);
				pthread_mutex_lock(&b->mu);
				continue;
			}
			if (next_ns) {
				struct timespec ts = {.tv_sec = (time_t)(next_ns / 1000000000ull),
						      .tv_nsec = (long)(next_ns % 1000000000ull)};

				pthread_cond_timedwait(&b->wake, &b->mu, &ts);
			} else {
				pthread_cond_wait(&b->wake, &b->mu);
			}
			continue;
		}
		if (b->want_inos) {
			unsigned shard = (unsigned)__builtin_ctz(b->want_inos) + 1;

			pthread_mutex_unlock(&b->mu);
			reserve(c, b, shard);
			pthread_mutex_lock(&b->mu);
			continue; /* failed: the next use asks again */
		}
		/* Let the others of a burst join the first record. */
		if (b->n < STK_NAMES_MAX) {
			pthread_mutex_unlock(&b->mu);
			usleep(GATHER_US);
			pthread_mutex_lock(&b->mu);
		}
		pthread_mutex_unlock(&b->mu);
		/* A caller waiting to send (the watch, above all) goes first: the thread
		 * would take send_mu back before it, batch after batch. */
		while (atomic_load(&b->urgent))
			usleep(GATHER_US);
		send_now(c, b, 0, 0);
		pthread_mutex_lock(&b->mu);
	}
	pthread_mutex_unlock(&b->mu);
	return NULL;
}

/* ---- the API ---- */

/* Frees b (its locks too once made: inited). */
static void behind_free(struct stk_behind *b, int inited)
{
	if (inited) {
		pthread_mutex_destroy(&b->mu);
		pthread_cond_destroy(&b->wake);
		pthread_cond_destroy(&b->room);
		pthread_rwlock_destroy(&b->gate);
		pthread_mutex_destroy(&b->send_mu);
	}
	for (unsigned s = 0; s <= STK_MAX_SHARDS; s++)
		free(b->bq[s].q);
	free(b->batch);
	free(b->req);
	free(b->resp);
	free(b);
}

int stk_behind_start(stk_client *c)
{
	pthread_rwlockattr_t ga;
	pthread_condattr_t ca;
	struct stk_behind *b;
	const char *env = getenv("STOKER_WRITE_BEHIND");

	if ((env && strcmp(env, "0") == 0) || !c->lc || c->behind)
		return 0;
	b = calloc(1, sizeof(*b));
	if (!b)
		return -ENOMEM;
	/* Shard 1's queue now; another shard's at its first record (queue_room). */
	b->bq[1].q = calloc(QUEUE_MAX, sizeof(*b->bq[1].q));
	b->batch = calloc(STK_NAMES_MAX, sizeof(*b->batch));
	b->req_cap = (size_t)STK_NAMES_MAX * sizeof(struct stk_msg_name_rec) + 64;
	b->req = malloc(b->req_cap);
	b->resp = malloc(RESP_CAP);
	if (!b->bq[1].q || !b->batch || !b->req || !b->resp)
		goto fail;
	pthread_mutex_init(&b->mu, NULL);
	/* stk_now_ns's clock: the thread's wait for an allowance to fall idle */
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&b->wake, &ca);
	pthread_condattr_destroy(&ca);
	pthread_cond_init(&b->room, NULL);
	/* Writer first: the watch must not wait behind a stream of creates. */
	pthread_rwlockattr_init(&ga);
	pthread_rwlockattr_setkind_np(&ga, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
	pthread_rwlock_init(&b->gate, &ga);
	pthread_rwlockattr_destroy(&ga);
	pthread_mutex_init(&b->send_mu, NULL);
	b->want_inos = 1u; /* shard 1's; another's at its first create */
	c->behind = b;
	if (pthread_create(&b->thr, NULL, behind_main, c)) {
		c->behind = NULL;
		behind_free(b, 1);
		return -EAGAIN;
	}
	b->have_thread = 1;
	return 0;
fail:
	behind_free(b, 0);
	return -ENOMEM;
}

void stk_behind_destroy(stk_client *c)
{
	struct stk_behind *b = c->behind;

	if (!b)
		return;
	if (b->have_thread) {
		(void)stk_behind_flush(c);
		pthread_mutex_lock(&b->mu);
		b->stop = 1;
		pthread_cond_broadcast(&b->wake);
		pthread_mutex_unlock(&b->mu);
		pthread_join(b->thr, NULL);
	}
	c->behind = NULL;
	behind_free(b, 1);
}

void stk_behind_after_fork(stk_client *c)
{
	/* The parent's thread and queue are the parent's: the child answers nothing here. */
	c->behind = NULL;
}

int stk_behind_queued(stk_client *c)
{
	return c->behind && atomic_load(&c->behind->queued) != 0;
}

void stk_behind_send(stk_client *c)
{
	if (c->behind)
		send_now(c, c->behind, 1, 0);
}

int stk_behind_settle(stk_client *c, uint64_t ino)
{
	struct stk_behind *b = c->behind;
	int rc = 0;

	if (!b)
		return 0;
	stk_behind_send(c);
	pthread_mutex_lock(&b->mu);
	for (unsigned i = 0; i < FAILED_KEEP && i < b->nfailed; i++)
		if (b->failed[i] == ino)
			rc = -EIO;
	pthread_mutex_unlock(&b->mu);
	return rc;
}

/* As stk_behind_flush, for shard's records alone (0: every shard's). */
static int flush_shard(stk_client *c, unsigned shard)
{
	struct stk_behind *b = c->behind;
	int err;

	if (!b)
		return 0;
	send_now(c, b, 1, shard);
	pthread_mutex_lock(&b->mu);
	err = b->err;
	b->err = 0;
	pthread_mutex_unlock(&b->mu);
	return err;
}

int stk_behind_flush(stk_client *c)
{
	return flush_shard(c, 0);
}

int stk_behind_flush_shard(stk_client *c, unsigned shard)
{
	if (shard < 1 || shard > STK_MAX_SHARDS)
		return 0;
	return flush_shard(c, shard);
}

void stk_behind_gate_close(stk_client *c)
{
	if (c->behind)
		pthread_rwlock_wrlock(&c->behind->gate);
}

void stk_behind_gate_open(stk_client *c)
{
	if (c->behind)
		pthread_rwlock_unlock(&c->behind->gate);
}

/*
 * With mu: room for one more record of shard's (waits for the thread when its
 * queue is full); its queue is made at its first record. 0 or -EAGAIN.
 */
static int make_room(struct stk_behind *b, unsigned shard)
{
	struct bq *bq = &b->bq[shard];

	if (!bq->q && !(bq->q = calloc(QUEUE_MAX, sizeof(*bq->q))))
		return -EAGAIN; /* no memory: meta answers instead */
	while (bq->n >= QUEUE_MAX && !b->stop) {
		pthread_cond_signal(&b->wake);
		pthread_cond_wait(&b->room, &b->mu);
	}
	return b->stop ? -EAGAIN : 0;
}

/*
 * With mu: the next inode number of shard's, or 0 when none is reserved (the
 * thread is asked).
 */
static uint64_t take_ino(struct stk_behind *b, unsigned shard)
{
	struct bshard *sh = &b->sh[shard];
	unsigned bit = 1u << (shard - 1);

	if (sh->cur.next == sh->cur.end) {
		sh->cur = sh->spare;
		memset(&sh->spare, 0, sizeof(sh->spare));
	}
	if (!sh->spare.next && !(b->want_inos & bit) && !sh->no_inos &&
	    (sh->cur.next == sh->cur.end || sh->cur.end - sh->cur.next < INOS_LOW)) {
		b->want_inos |= bit;
		pthread_cond_signal(&b->wake);
	}
	return sh->cur.next < sh->cur.end ? sh->cur.next++ : 0;
}

/* With mu and make_room's 0: queues m, a record of shard's folder. */
static void queue(struct stk_behind *b, unsigned shard, const struct stk_msg_name_rec *m)
{
	struct bq *bq = &b->bq[shard];

	bq->q[bq->n++] = *m;
	bq->nqueued++;
	b->n++;
	atomic_store(&b->queued, b->n);
	if (b->n == 1 || bq->n == STK_NAMES_MAX)
		pthread_cond_signal(&b->wake);
}

void stk_behind_prepare(stk_client *c, unsigned shard)
{
	struct stk_behind *b = c->behind;
	int want;

	if (!b || shard < 1 || shard > STK_MAX_SHARDS)
		return;
	pthread_mutex_lock(&b->mu);
	want = !b->sh[shard].nchains && !b->sh[shard].no_inos && !b->sh[shard].spare.next &&
	       b->sh[shard].cur.next == b->sh[shard].cur.end;
	pthread_mutex_unlock(&b->mu);
	if (want)
		reserve(c, b, shard);
}

int stk_behind_create(stk_client *c, const struct stk_cred *cred, uint64_t parent,
		      const char *name, uint32_t mode, struct stk_attr *out)
{
	struct stk_behind *b = c->behind;
	unsigned shard = stk_ino_shard(parent);
	struct stk_msg_name_rec m;
	uint32_t dmode = 0, dgid = 0;
	uint64_t entropy, qid = 0;
	struct bshard *sh;
	uint32_t holder;
	int rc = -EAGAIN, refilled = 0;

	if (!b || strlen(name) > STK_NAME_MAX || shard < 1 || shard > STK_MAX_SHARDS)
		return -EAGAIN;
	sh = &b->sh[shard];
again:
	pthread_rwlock_rdlock(&b->gate);
	if (!stk_lcache_behind_free(c, parent, name, &dmode, &dgid, &qid))
		goto out;
	/* not under mu: the cache's lock is apart */
	holder = qid ? holder_of(c, qid) : 0;
	memset(&m, 0, sizeof(m));
	memset(out, 0, sizeof(*out));
	pthread_mutex_lock(&b->mu);
	if (!allow_spend(c, b, qid, holder)) {
		/* Under a quota with none of its allowance left: ask for more, once. */
		pthread_mutex_unlock(&b->mu);
		pthread_rwlock_unlock(&b->gate);
		if (refilled++ || allow_refill(c, b, parent, qid))
			return -EAGAIN;
		goto again;
	}
	if (!sh->nchains && !(b->want_inos & (1u << (shard - 1))) && !sh->no_inos &&
	    stk_now_ns() - sh->asked_ns > PLACEMENT_RETRY_NS) {
		/* No storage when numbers were last reserved (or none yet from this
		 * shard): ask again, now and then. */
		b->want_inos |= 1u << (shard - 1);
		sh->asked_ns = stk_now_ns();
		pthread_cond_signal(&b->wake);
	}
	if (make_room(b, shard) || !sh->nchains || !(out->ino = take_ino(b, shard))) {
		struct allow *a = qid ? allow_slot(c, b, qid, holder) : NULL;

		if (a)
			a->left++; /* not spent after all */
		pthread_mutex_unlock(&b->mu);
		goto out;
	}
	if (getrandom(&entropy, sizeof(entropy), GRND_NONBLOCK) != (ssize_t)sizeof(entropy))
		entropy = out->ino * 0x9E3779B97F4A7C15ull ^ stk_now_ns();
	stk_layout_make(&out->layout, sh->chunk_size ? sh->chunk_size : STK_DEFAULT_CHUNK_SIZE,
			sh->stripe, sh->nchains, entropy);
	/* As meta makes it (store.c inode_new): the owner, a setgid folder's group. */
	out->uid = cred->uid;
	out->gid = (dmode & S_ISGID) ? dgid : cred->gid;
	mode &= 07777;
	if ((mode & S_ISGID) && cred->uid != 0 && !stk_cred_in_group(cred, out->gid))
		mode &= ~(uint32_t)S_ISGID;
	out->mode = S_IFREG | mode;
	out->nlink = 1;
	/* Its folder's quota, as meta tags it: its writes reserve room there. */
	out->qid = qid;
	stk_wall_time(&out->mtime_sec, &out->mtime_nsec);
	out->atime_sec = out->ctime_sec = out->mtime_sec;
	out->atime_nsec = out->ctime_nsec = out->mtime_nsec;
	m.op = STK_NAME_CREATE;
	m.cred = *cred;
	m.parent = parent;
	memcpy(m.name, name, strlen(name) + 1);
	m.ino = out->ino;
	m.mode = mode;
	m.time_sec = out->mtime_sec;
	m.time_nsec = out->mtime_nsec;
	m.layout = out->layout;
	queue(b, shard, &m);
	b->st.creates++;
	pthread_mutex_unlock(&b->mu);
	stk_lcache_behind_made(c, parent, name, out);
	rc = 0;
out:
	pthread_rwlock_unlock(&b->gate);
	return rc;
}

int stk_behind_unlink(stk_client *c, const struct stk_cred *cred, uint64_t parent,
		      const char *name, int (*busy)(void *ctx, uint64_t ino), void *ctx,
		      uint64_t *ino_out)
{
	struct stk_behind *b = c->behind;
	unsigned shard = stk_ino_shard(parent);
	struct stk_msg_name_rec m;
	struct stk_attr a;
	int rc = -EAGAIN;

	if (!b || strlen(name) > STK_NAME_MAX || shard < 1 || shard > STK_MAX_SHARDS)
		return -EAGAIN;
	pthread_rwlock_rdlock(&b->gate);
	if (!stk_lcache_behind_victim(c, parent, name, &a) || (busy && busy(ctx, a.ino)))
		goto out;
	memset(&m, 0, sizeof(m));
	m.op = STK_NAME_UNLINK;
	m.cred = *cred;
	m.parent = parent;
	memcpy(m.name, name, strlen(name) + 1);
	m.ino = a.ino;
	pthread_mutex_lock(&b->mu);
	if (make_room(b, shard)) {
		pthread_mutex_unlock(&b->mu);
		goto out;
	}
	queue(b, shard, &m);
	b->st.unlinks++;
	pthread_mutex_unlock(&b->mu);
	stk_lcache_behind_gone(c, parent, name, a.ino);
	*ino_out = a.ino;
	rc = 0;
out:
	pthread_rwlock_unlock(&b->gate);
	return rc;
}

void stk_behind_stats(stk_client *c, struct stk_behind_stats *out)
{
	struct stk_behind *b = c->behind;

	memset(out, 0, sizeof(*out));
	if (!b)
		return;
	pthread_mutex_lock(&b->mu);
	*out = b->st;
	pthread_mutex_unlock(&b->mu);
}
