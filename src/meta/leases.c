/*
 * Cache leases (leases.h says what they promise).
 *
 * Two tables under one mutex. Holders: a fixed array of slots; a holder's id is
 * (round << 10) | slot, round counting up with every registration, so an id is
 * never reused and a stale one (a client that was reset) matches no slot. The
 * first round is random: a table made after a meta restart must not hand a new
 * holder the id some client's change still carries as its origin from before the
 * restart (that change would skip the new holder's revocations), and counting
 * from 1 again would give the first holders the very same ids. Each
 * holder has the queue of records it has not acknowledged: record seq k is
 * q[k - acked - 1]. Grants: a chained hash of (ino, holder, expiry); a grant whose
 * holder no longer has that id, or whose time is up, is dead and goes at the next
 * sweep (every few seconds) or when its inode changes.
 *
 * A change walks the grants of each inode it names, removes them all, queues the
 * inode for each live holder but the origin, and waits on one condition variable
 * (broadcast at every acknowledgement, reset and end) until every holder it queued
 * for has acknowledged, gone, or passed its deadline.
 *
 * Delegations: a third chained hash, ino -> holder, with a count read without the
 * mutex so that reads skip everything while there are none. A recall (by a change
 * or a read of someone else) does not remove the entry at once: it queues the
 * inode for the holder once, marks the entry recalling with the record's number,
 * and whoever comes next for the same inode waits for that same record; the entry
 * goes when the record is acknowledged (or the holder goes, taking all its
 * entries with it). So no reader slips in between the recall and the holder's
 * names reaching the store.
 */
#include "leases.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "../common/log.h"
#include "../common/util.h"

#define DELEG_GENS 256u /* counters of delegations made, by folder hash */
#define SLOT_BITS 10u
#define GRANT_BUCKETS (1u << 16)
#define BUSY_BUCKETS 1024u
#define DELEG_BUCKETS 4096u
#define QUEUE_MAX 65536u /* records a holder may lag behind before it is reset */
#define MARGIN_NS ((uint64_t)STK_LEASE_MARGIN_MS * 1000000ull)
#define FORGET_NS (60ull * 1000000000ull) /* a holder silent this long is forgotten */
#define SWEEP_NS (5ull * 1000000000ull)
#define MS 1000000ull

_Static_assert((1u << SLOT_BITS) == STK_LEASE_HOLDERS_MAX, "holder ids carry the slot");

struct grant {
	uint64_t ino;
	uint64_t expires_ns;
	uint32_t holder;
	struct grant *next;
};

/* An inode a change is being made to: no lease on it until the change ends. */
struct busy {
	uint64_t ino;
	uint32_t count; /* changes to it in progress */
	struct busy *next;
};

/* A delegated folder. */
struct deleg {
	uint64_t ino;
	uint32_t holder;
	int recalling; /* queued for the holder as record seq: goes once that is acked */
	uint64_t seq;
	struct deleg *next;
};

struct holder {
	uint32_t id;	  /* 0: free slot */
	uint32_t ndelegs; /* entries in the delegation table */
	uint64_t session;
	uint64_t acked; /* records up to here are done */
	uint64_t *q;	/* records acked + 1 .. acked + qlen */
	uint32_t qlen, qcap;
	uint64_t last_ns; /* when its last watch arrived */
	int reset;	  /* its next watch must say reset */
	int waiting;	  /* a watch is parked on wake */
	pthread_cond_t wake;
};

struct stk_meta_leases {
	pthread_mutex_t mu;
	pthread_cond_t acked; /* any acknowledgement, reset or end */
	uint32_t round;
	uint64_t ngrants, last_sweep_ns;
	struct stk_meta_leases_stats st;
	struct holder h[STK_LEASE_HOLDERS_MAX];
	struct grant *b[GRANT_BUCKETS];
	struct busy *busy[BUSY_BUCKETS];
	uint64_t busy_all; /* changes whose inodes could not be marked: no lease at all */
	struct deleg *d[DELEG_BUCKETS];
	uint32_t ndelegs; /* written under mu, read without it (atomic) */
	uint64_t grace_end_ns; /* set once before serving: changes wait for it */
	/* Delegations made, by bucket of their folder (stk_meta_leases_deleg_gen): atomic. */
	uint64_t deleg_gen[DELEG_GENS + 1]; /* the last one counts them all */
	stk_meta_leases_drop_fn on_drop;    /* a holder reset or gone (set before serving) */
	void *on_drop_ctx;
};

/* Whom a change or recall waits for, and for which record of each. */
struct waits {
	uint32_t n;
	struct {
		uint32_t slot, id;
		uint64_t seq;
	} w[STK_LEASE_HOLDERS_MAX];
};

static uint32_t gen_of(uint64_t ino)
{
	return (uint32_t)((ino * 0x9e3779b97f4a7c15ull) >> 40) & (DELEG_GENS - 1);
}

static uint32_t bucket_of(uint64_t ino)
{
	return (uint32_t)((ino * 0x9e3779b97f4a7c15ull) >> 48) & (GRANT_BUCKETS - 1);
}

static struct holder *holder_get(struct stk_meta_leases *l, uint32_t id)
{
	struct holder *h;

	if (id == 0)
		return NULL;
	h = &l->h[id & (STK_LEASE_HOLDERS_MAX - 1)];
	return h->id == id ? h : NULL;
}

static void abstime_in(struct timespec *ts, uint64_t ns)
{
	clock_gettime(CLOCK_MONOTONIC, ts);
	ts->tv_sec += (time_t)(ns / 1000000000ull);
	ts->tv_nsec += (long)(ns % 1000000000ull);
	if (ts->tv_nsec >= 1000000000L) {
		ts->tv_sec++;
		ts->tv_nsec -= 1000000000L;
	}
}

static uint32_t new_id(struct stk_meta_leases *l, uint32_t slot)
{
	if (++l->round >= (1u << (32 - SLOT_BITS)))
		l->round = 1;
	return (l->round << SLOT_BITS) | slot;
}

static struct deleg **deleg_slot(struct stk_meta_leases *l, uint64_t ino)
{
	struct deleg **pp = &l->d[bucket_of(ino) & (DELEG_BUCKETS - 1)];

	while (*pp && (*pp)->ino != ino)
		pp = &(*pp)->next;
	return pp;
}

/* Removes the entry *pp points at. */
static void deleg_remove(struct stk_meta_leases *l, struct deleg **pp)
{
	struct deleg *d = *pp;
	struct holder *h = &l->h[d->holder & (STK_LEASE_HOLDERS_MAX - 1)];

	*pp = d->next;
	if (h->id == d->holder && h->ndelegs)
		h->ndelegs--;
	__atomic_store_n(&l->ndelegs, l->ndelegs - 1, __ATOMIC_RELEASE);
	free(d);
}

/* Before h's id changes or goes: its delegations go with it. */
static void delegs_drop(struct stk_meta_leases *l, struct holder *h)
{
	for (uint32_t i = 0; h->ndelegs && i < DELEG_BUCKETS; i++) {
		struct deleg **pp = &l->d[i];

		while (*pp) {
			if ((*pp)->holder == h->id)
				deleg_remove(l, pp);
			else
				pp = &(*pp)->next;
		}
	}
	h->ndelegs = 0;
}

/* Drops the holder's queue and gives it a new id: its grants die, its waiters stop. */
static void holder_reset(struct stk_meta_leases *l, struct holder *h)
{
	delegs_drop(l, h);
	if (l->on_drop)
		l->on_drop(l->on_drop_ctx, h->session);
	h->id = new_id(l, (uint32_t)(h - l->h));
	h->acked = 0;
	h->qlen = 0;
	h->reset = 1;
	l->st.resets++;
	pthread_cond_broadcast(&l->acked);
	pthread_cond_signal(&h->wake);
}

static void holder_free(struct stk_meta_leases *l, struct holder *h)
{
	delegs_drop(l, h);
	if (l->on_drop)
		l->on_drop(l->on_drop_ctx, h->session);
	h->id = 0;
	h->session = 0;
	h->qlen = 0;
	h->acked = 0;
	l->st.holders--;
	pthread_cond_broadcast(&l->acked);
	pthread_cond_signal(&h->wake);
}

static int grant_live(struct stk_meta_leases *l, const struct grant *g, uint64_t now)
{
	struct holder *h = holder_get(l, g->holder);

	return h && !h->reset && g->expires_ns > now;
}

/* Every few seconds: dead grants go, and holders silent for a minute. */
static void sweep(struct stk_meta_leases *l, uint64_t now)
{
	if (now - l->last_sweep_ns < SWEEP_NS)
		return;
	l->last_sweep_ns = now;
	for (uint32_t i = 0; i < STK_LEASE_HOLDERS_MAX; i++) {
		struct holder *h = &l->h[i];

		if (h->id && !h->waiting && now > h->last_ns + FORGET_NS)
			holder_free(l, h);
	}
	for (uint32_t i = 0; i < GRANT_BUCKETS; i++) {
		struct grant **pp = &l->b[i];

		while (*pp) {
			struct grant *g = *pp;

			if (grant_live(l, g, now)) {
				pp = &g->next;
				continue;
			}
			*pp = g->next;
			free(g);
			l->ngrants--;
		}
	}
	l->st.grants = l->ngrants;
}

int stk_meta_leases_create(struct stk_meta_leases **out)
{
	struct stk_meta_leases *l = calloc(1, sizeof(*l));
	pthread_condattr_t ca;

	if (!l)
		return -ENOMEM;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_mutex_init(&l->mu, NULL);
	pthread_cond_init(&l->acked, &ca);
	for (uint32_t i = 0; i < STK_LEASE_HOLDERS_MAX; i++)
		pthread_cond_init(&l->h[i].wake, &ca);
	pthread_condattr_destroy(&ca);
	l->last_sweep_ns = stk_now_ns();
	/* Any first round (new_id wraps past the top): see the top of this file. */
	if (getrandom(&l->round, sizeof(l->round), GRND_NONBLOCK) != (ssize_t)sizeof(l->round))
		l->round = (uint32_t)(stk_now_ns() >> 10);
	l->round &= (1u << (32 - SLOT_BITS)) - 1;
	*out = l;
	return 0;
}

void stk_meta_leases_destroy(struct stk_meta_leases *l)
{
	if (!l)
		return;
	for (uint32_t i = 0; i < GRANT_BUCKETS; i++) {
		while (l->b[i]) {
			struct grant *g = l->b[i];

			l->b[i] = g->next;
			free(g);
		}
	}
	for (uint32_t i = 0; i < BUSY_BUCKETS; i++) {
		while (l->busy[i]) {
			struct busy *b = l->busy[i];

			l->busy[i] = b->next;
			free(b);
		}
	}
	for (uint32_t i = 0; i < DELEG_BUCKETS; i++) {
		while (l->d[i]) {
			struct deleg *d = l->d[i];

			l->d[i] = d->next;
			free(d);
		}
	}
	for (uint32_t i = 0; i < STK_LEASE_HOLDERS_MAX; i++) {
		free(l->h[i].q);
		pthread_cond_destroy(&l->h[i].wake);
	}
	pthread_cond_destroy(&l->acked);
	pthread_mutex_destroy(&l->mu);
	free(l);
}

/* A new holder for session in a free slot, or NULL. */
static struct holder *holder_new(struct stk_meta_leases *l, uint64_t session)
{
	for (uint32_t i = 0; i < STK_LEASE_HOLDERS_MAX; i++) {
		struct holder *h = &l->h[i];

		if (h->id)
			continue;
		h->id = new_id(l, i);
		h->session = session;
		h->acked = 0;
		h->qlen = 0;
		h->reset = 0;
		h->ndelegs = 0;
		l->st.holders++;
		return h;
	}
	return NULL;
}

int stk_meta_leases_watch(struct stk_meta_leases *l, uint64_t session, uint32_t *holder,
			  uint64_t acked, uint32_t wait_ms, uint64_t *inos, uint32_t max,
			  uint32_t *n, uint64_t *seq, int *reset)
{
	uint64_t now = stk_now_ns();
	struct holder *h;
	struct timespec ts;

	*n = 0;
	*reset = 0;
	if (session == 0)
		return -EINVAL;
	if (wait_ms > STK_LEASE_WAIT_MAX_MS)
		wait_ms = STK_LEASE_WAIT_MAX_MS;
	pthread_mutex_lock(&l->mu);
	sweep(l, now);
	h = holder_get(l, *holder);
	if (!h && *holder) {
		/* Reset since its last watch: the slot carries a new id for it. */
		h = &l->h[*holder & (STK_LEASE_HOLDERS_MAX - 1)];
		h = h->id && h->reset && h->session == session ? h : NULL;
	}
	if (!h || h->session != session) {
		h = holder_new(l, session);
		if (!h) {
			pthread_mutex_unlock(&l->mu);
			return -EAGAIN;
		}
		*reset = 1;
	} else if (h->reset) {
		*reset = 1;
	} else if (acked > h->acked && acked <= h->acked + h->qlen) {
		uint32_t done = (uint32_t)(acked - h->acked);

		memmove(h->q, h->q + done, (h->qlen - done) * sizeof(*h->q));
		h->qlen -= done;
		h->acked = acked;
		pthread_cond_broadcast(&l->acked);
	}
	h->reset = 0;
	h->last_ns = now;
	*holder = h->id;
	if (!*reset && h->qlen == 0 && wait_ms) {
		uint32_t id = h->id;

		abstime_in(&ts, (uint64_t)wait_ms * MS);
		h->waiting = 1;
		while (h->id == id && !h->reset && h->qlen == 0)
			if (pthread_cond_timedwait(&h->wake, &l->mu, &ts) == ETIMEDOUT)
				break;
		h->waiting = 0;
		if (h->id != id || h->reset) {
			/* Reset or ended while parked: say so at once. */
			*reset = h->id != 0;
			*holder = h->id;
			if (h->id)
				h->reset = 0;
			pthread_mutex_unlock(&l->mu);
			return h->id ? 0 : -EAGAIN;
		}
	}
	*n = h->qlen < max ? h->qlen : max;
	if (*n)
		memcpy(inos, h->q, *n * sizeof(*inos));
	*seq = h->acked + *n;
	pthread_mutex_unlock(&l->mu);
	return 0;
}

static struct busy **busy_slot(struct stk_meta_leases *l, uint64_t ino)
{
	struct busy **pp = &l->busy[bucket_of(ino) & (BUSY_BUCKETS - 1)];

	while (*pp && (*pp)->ino != ino)
		pp = &(*pp)->next;
	return pp;
}

static int busy_find(struct stk_meta_leases *l, uint64_t ino)
{
	return *busy_slot(l, ino) != NULL;
}

/* Whether ino is delegated to a holder other than `holder` (recalled or not). */
static int delegated_elsewhere(struct stk_meta_leases *l, uint32_t holder, uint64_t ino)
{
	struct deleg *d;

	if (l->ndelegs == 0)
		return 0;
	d = *deleg_slot(l, ino);
	return d && d->holder != holder;
}

int stk_meta_leases_grant(struct stk_meta_leases *l, uint32_t holder, uint64_t ino)
{
	uint64_t now = stk_now_ns();
	struct holder *h;
	struct grant *g;
	uint32_t b = bucket_of(ino);
	int rc = 0;

	pthread_mutex_lock(&l->mu);
	h = holder_get(l, holder);
	/* A delegated folder is its holder's alone: another's lease would go stale unseen. */
	if (!h || h->reset || l->busy_all || busy_find(l, ino) ||
	    delegated_elsewhere(l, holder, ino))
		goto out;
	for (g = l->b[b]; g; g = g->next)
		if (g->ino == ino && g->holder == holder)
			break;
	if (!g) {
		if (l->ngrants >= STK_LEASE_GRANTS_MAX || !(g = malloc(sizeof(*g))))
			goto out;
		g->ino = ino;
		g->holder = holder;
		g->next = l->b[b];
		l->b[b] = g;
		l->ngrants++;
		l->st.grants = l->ngrants;
	}
	g->expires_ns = now + STK_LEASE_GRANT_MS * MS;
	rc = 1;
out:
	pthread_mutex_unlock(&l->mu);
	return rc;
}

/* Queues ino for h; a holder too far behind is reset instead. */
static void enqueue(struct stk_meta_leases *l, struct holder *h, uint64_t ino)
{
	if (h->qlen == h->qcap) {
		uint32_t cap = h->qcap ? h->qcap * 2 : 64;
		uint64_t *q = cap <= QUEUE_MAX ? realloc(h->q, cap * sizeof(*q)) : NULL;

		if (!q) {
			holder_reset(l, h);
			return;
		}
		h->q = q;
		h->qcap = cap;
	}
	h->q[h->qlen++] = ino;
	l->st.revokes++;
	pthread_cond_signal(&h->wake);
}

/* Waits for h's record seq (and for those before it). */
static void wait_add(struct stk_meta_leases *l, struct waits *ws, struct holder *h, uint64_t seq)
{
	uint32_t k, slot = (uint32_t)(h - l->h);

	for (k = 0; k < ws->n && ws->w[k].slot != slot; k++)
		;
	if (k == ws->n) {
		ws->w[k].slot = slot;
		ws->w[k].id = h->id;
		ws->w[k].seq = 0;
		ws->n++;
	}
	if (seq > ws->w[k].seq)
		ws->w[k].seq = seq;
}

/*
 * With mu held: until each holder in ws has acknowledged its record, gone, or
 * passed its deadline (then it is reset).
 */
static void wait_all(struct stk_meta_leases *l, struct waits *ws)
{
	struct timespec ts;

	while (ws->n) {
		uint64_t next = UINT64_MAX, now = stk_now_ns();

		for (uint32_t k = 0; k < ws->n;) {
			struct holder *h = &l->h[ws->w[k].slot];
			uint64_t deadline = h->last_ns + STK_LEASE_VALID_MS * MS + MARGIN_NS;

			if (h->id != ws->w[k].id || h->reset || h->acked >= ws->w[k].seq) {
				ws->w[k] = ws->w[--ws->n];
				continue;
			}
			if (now >= deadline) {
				stk_warn("cache holder %u (session %016llx) did not acknowledge a "
					 "change in time; its cache is reset",
					 h->id, (unsigned long long)h->session);
				holder_reset(l, h);
				ws->w[k] = ws->w[--ws->n];
				continue;
			}
			next = deadline < next ? deadline : next;
			k++;
		}
		if (!ws->n)
			break;
		abstime_in(&ts, next - now);
		pthread_cond_timedwait(&l->acked, &l->mu, &ts);
	}
}

/*
 * Recalls ino's delegation, if it has one that is not `keep`'s: queues the inode
 * for its holder (once for all recallers) and adds the wait for that record. The
 * holder's id, or 0 if nothing is to be waited for.
 */
static uint32_t deleg_recall(struct stk_meta_leases *l, uint32_t keep, uint64_t ino,
			     struct waits *ws)
{
	struct deleg **pp = deleg_slot(l, ino), *d = *pp;
	struct holder *h;

	if (!d || d->holder == keep)
		return 0;
	h = holder_get(l, d->holder);
	if (!h || h->reset) {
		deleg_remove(l, pp); /* cannot be: a holder's entries go with it */
		return 0;
	}
	if (!d->recalling) {
		enqueue(l, h, ino);
		if (h->reset)
			return 0; /* too far behind: reset, its entries gone with it */
		d->recalling = 1;
		d->seq = h->acked + h->qlen;
		l->st.recalls++;
	}
	wait_add(l, ws, h, d->seq);
	return d->holder;
}

/* After the wait: the entries of inos whose recall was acknowledged go. */
static void deleg_settle(struct stk_meta_leases *l, const uint64_t *inos, size_t n)
{
	for (size_t i = 0; l->ndelegs && i < n; i++) {
		struct deleg **pp = deleg_slot(l, inos[i]), *d = *pp;
		struct holder *h;

		if (!d || !d->recalling)
			continue;
		h = holder_get(l, d->holder);
		if (!h || h->reset || h->acked >= d->seq)
			deleg_remove(l, pp);
	}
}

/*
 * Marks inos busy (busy 1: no lease granted until stk_meta_leases_end), revokes
 * the others' leases and delegations on them and waits for the acknowledgements.
 */
static void revoke(struct stk_meta_leases *l, uint32_t origin, const uint64_t *inos, size_t n,
		   int busy)
{
	struct waits ws; /* whom to wait for, and for which record */
	uint64_t now = stk_now_ns();

	pthread_mutex_lock(&l->mu);
	ws.n = 0;
	for (size_t i = 0; busy && i < n; i++) {
		struct busy **bp = busy_slot(l, inos[i]);

		if (!*bp && (*bp = calloc(1, sizeof(**bp))))
			(*bp)->ino = inos[i];
		if (*bp)
			(*bp)->count++;
		else
			l->busy_all++; /* out of memory: no lease at all until the end */
	}
	for (size_t i = 0; i < n; i++) {
		struct grant **pp = &l->b[bucket_of(inos[i])];
		/* The holder whose recall of inos[i] is queued: its lease goes with it. */
		uint32_t recalled = l->ndelegs ? deleg_recall(l, origin, inos[i], &ws) : 0;

		while (*pp) {
			struct grant *g = *pp;
			struct holder *h = NULL;

			if (g->ino != inos[i] || g->holder == origin) {
				/* The origin's lease stays: it forgot its copies itself. */
				pp = &g->next;
				continue;
			}
			*pp = g->next;
			l->ngrants--;
			if (grant_live(l, g, now) && g->holder != recalled)
				h = holder_get(l, g->holder);
			free(g);
			if (!h)
				continue;
			enqueue(l, h, inos[i]);
			if (!h->reset) /* else too far behind: reset, nothing to wait for */
				wait_add(l, &ws, h, h->acked + h->qlen);
		}
	}
	l->st.grants = l->ngrants;
	wait_all(l, &ws);
	deleg_settle(l, inos, n);
	pthread_mutex_unlock(&l->mu);
}

void stk_meta_leases_grace(struct stk_meta_leases *l)
{
	stk_meta_leases_grace_ms(l, STK_LEASE_VALID_MS + STK_LEASE_MARGIN_MS);
}

void stk_meta_leases_grace_ms(struct stk_meta_leases *l, unsigned ms)
{
	l->grace_end_ns = ms ? stk_now_ns() + (uint64_t)ms * MS : 0;
}

unsigned stk_meta_leases_failover_ms(unsigned hb_timeout_ms)
{
	unsigned full = STK_LEASE_VALID_MS + STK_LEASE_MARGIN_MS;

	/* the old leader's last watch was sent at least T/4 before the promotion */
	return hb_timeout_ms / 4 >= full ? 0 : full - hb_timeout_ms / 4;
}

void stk_meta_leases_begin(struct stk_meta_leases *l, uint32_t origin, const uint64_t *inos,
			   size_t n)
{
	uint64_t now = stk_now_ns();

	if (now < l->grace_end_ns) {
		struct timespec ts = {.tv_sec = (time_t)((l->grace_end_ns - now) / 1000000000ull),
				      .tv_nsec = (long)((l->grace_end_ns - now) % 1000000000ull)};

		while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
			;
	}
	revoke(l, origin, inos, n, 1);
}

void stk_meta_leases_end(struct stk_meta_leases *l, const uint64_t *inos, size_t n)
{
	pthread_mutex_lock(&l->mu);
	for (size_t i = 0; i < n; i++) {
		struct busy **bp = busy_slot(l, inos[i]), *b = *bp;

		if (!b) {
			if (l->busy_all) /* its begin ran out of memory */
				l->busy_all--;
		} else if (--b->count == 0) {
			*bp = b->next;
			free(b);
		}
	}
	pthread_mutex_unlock(&l->mu);
}

void stk_meta_leases_changed(struct stk_meta_leases *l, uint32_t origin, const uint64_t *inos,
			     size_t n)
{
	revoke(l, origin, inos, n, 0);
}

int stk_meta_leases_delegate(struct stk_meta_leases *l, uint32_t holder, uint64_t ino)
{
	uint64_t now = stk_now_ns();
	struct deleg **pp, *d;
	struct holder *h;
	struct grant *g;
	int rc = 0;

	pthread_mutex_lock(&l->mu);
	h = holder_get(l, holder);
	if (!h || h->reset || l->busy_all || busy_find(l, ino))
		goto out;
	pp = deleg_slot(l, ino);
	if (*pp) {
		rc = (*pp)->holder == holder && !(*pp)->recalling;
		goto out;
	}
	if (l->ndelegs >= STK_LEASE_DELEGATIONS_MAX)
		goto out;
	/* Another holder's lease on it could not be kept true without asking meta. */
	for (g = l->b[bucket_of(ino)]; g; g = g->next)
		if (g->ino == ino && g->holder != holder && grant_live(l, g, now))
			goto out;
	d = calloc(1, sizeof(*d));
	if (!d)
		goto out;
	d->ino = ino;
	d->holder = holder;
	*pp = d;
	h->ndelegs++;
	__atomic_store_n(&l->ndelegs, l->ndelegs + 1, __ATOMIC_SEQ_CST);
	__atomic_add_fetch(&l->deleg_gen[gen_of(ino)], 1, __ATOMIC_SEQ_CST);
	__atomic_add_fetch(&l->deleg_gen[DELEG_GENS], 1, __ATOMIC_SEQ_CST);
	rc = 1;
out:
	pthread_mutex_unlock(&l->mu);
	return rc;
}

uint64_t stk_meta_leases_deleg_gen(struct stk_meta_leases *l, uint64_t ino)
{
	return __atomic_load_n(&l->deleg_gen[ino ? gen_of(ino) : DELEG_GENS], __ATOMIC_SEQ_CST);
}

int stk_meta_leases_delegated_elsewhere(struct stk_meta_leases *l, uint32_t requester,
					const uint64_t *inos, size_t n)
{
	int found = 0;

	if (__atomic_load_n(&l->ndelegs, __ATOMIC_ACQUIRE) == 0)
		return 0;
	pthread_mutex_lock(&l->mu);
	for (size_t i = 0; !found && l->ndelegs && i < n; i++) {
		struct deleg *d = *deleg_slot(l, inos[i]);

		found = d && d->holder != requester;
	}
	pthread_mutex_unlock(&l->mu);
	return found;
}

int stk_meta_leases_recall(struct stk_meta_leases *l, uint32_t requester, const uint64_t *inos,
			   size_t n)
{
	struct waits ws;
	int recalled = 0;

	/* The common case, no folder delegated anywhere: no lock. */
	if (__atomic_load_n(&l->ndelegs, __ATOMIC_ACQUIRE) == 0)
		return 0;
	pthread_mutex_lock(&l->mu);
	ws.n = 0;
	for (size_t i = 0; l->ndelegs && i < n; i++) {
		struct deleg *d = *deleg_slot(l, inos[i]);

		if (!d || d->holder == requester)
			continue;
		recalled++;
		deleg_recall(l, requester, inos[i], &ws);
	}
	wait_all(l, &ws);
	if (recalled)
		deleg_settle(l, inos, n);
	pthread_mutex_unlock(&l->mu);
	return recalled;
}

void stk_meta_leases_undelegate(struct stk_meta_leases *l, uint64_t ino)
{
	struct deleg **pp;

	if (__atomic_load_n(&l->ndelegs, __ATOMIC_ACQUIRE) == 0)
		return;
	pthread_mutex_lock(&l->mu);
	pp = deleg_slot(l, ino);
	if (*pp)
		deleg_remove(l, pp);
	pthread_mutex_unlock(&l->mu);
}

void stk_meta_leases_alive(struct stk_meta_leases *l, uint32_t holder)
{
	struct holder *h;

	if (!holder)
		return;
	pthread_mutex_lock(&l->mu);
	h = holder_get(l, holder);
	if (h && !h->reset)
		h->last_ns = stk_now_ns();
	pthread_mutex_unlock(&l->mu);
}

void stk_meta_leases_on_drop(struct stk_meta_leases *l, stk_meta_leases_drop_fn fn, void *ctx)
{
	pthread_mutex_lock(&l->mu);
	l->on_drop = fn;
	l->on_drop_ctx = ctx;
	pthread_mutex_unlock(&l->mu);
}

uint64_t stk_meta_leases_session_of(struct stk_meta_leases *l, uint32_t holder)
{
	struct holder *h;
	uint64_t session = 0;

	if (!holder)
		return 0;
	pthread_mutex_lock(&l->mu);
	h = holder_get(l, holder);
	if (h && !h->reset)
		session = h->session;
	pthread_mutex_unlock(&l->mu);
	return session;
}

uint32_t stk_meta_leases_holder_of(struct stk_meta_leases *l, uint64_t session)
{
	uint32_t id = 0;

	if (!session)
		return 0;
	pthread_mutex_lock(&l->mu);
	for (uint32_t i = 0; !id && i < STK_LEASE_HOLDERS_MAX; i++)
		if (l->h[i].id && !l->h[i].reset && l->h[i].session == session)
			id = l->h[i].id;
	pthread_mutex_unlock(&l->mu);
	return id;
}

void stk_meta_leases_end_session(struct stk_meta_leases *l, uint64_t session)
{
	pthread_mutex_lock(&l->mu);
	for (uint32_t i = 0; i < STK_LEASE_HOLDERS_MAX; i++)
		if (l->h[i].id && l->h[i].session == session)
			holder_free(l, &l->h[i]);
	pthread_mutex_unlock(&l->mu);
}

void stk_meta_leases_stats(struct stk_meta_leases *l, struct stk_meta_leases_stats *out)
{
	pthread_mutex_lock(&l->mu);
	*out = l->st;
	out->grants = l->ngrants;
	out->delegations = l->ndelegs;
	pthread_mutex_unlock(&l->mu);
}
