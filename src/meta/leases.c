/*
 * Cache leases (leases.h says what they promise).
 *
 * Two tables under one mutex. Holders: a fixed array of slots; a holder's id is
 * (round << 10) | slot, round counting up with every registration, so an id is
 * never reused and a stale one (a client that was reset) matches no slot. Each
 * holder has the queue of records it has not acknowledged: record seq k is
 * q[k - acked - 1]. Grants: a chained hash of (ino, holder, expiry); a grant whose
 * holder no longer has that id, or whose time is up, is dead and goes at the next
 * sweep (every few seconds) or when its inode changes.
 *
 * A change walks the grants of each inode it names, removes them all, queues the
 * inode for each live holder but the origin, and waits on one condition variable
 * (broadcast at every acknowledgement, reset and end) until every holder it queued
 * for has acknowledged, gone, or passed its deadline.
 */
#include "leases.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../common/log.h"
#include "../common/util.h"

#define SLOT_BITS 10u
#define GRANT_BUCKETS (1u << 16)
#define BUSY_BUCKETS 1024u
#define QUEUE_MAX 65536u /* records a holder may lag behind before it is reset */
#define MARGIN_NS (500ull * 1000000ull)
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

struct holder {
	uint32_t id; /* 0: free slot */
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
};

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

/* Drops the holder's queue and gives it a new id: its grants die, its waiters stop. */
static void holder_reset(struct stk_meta_leases *l, struct holder *h)
{
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

int stk_meta_leases_grant(struct stk_meta_leases *l, uint32_t holder, uint64_t ino)
{
	uint64_t now = stk_now_ns();
	struct holder *h;
	struct grant *g;
	uint32_t b = bucket_of(ino);
	int rc = 0;

	pthread_mutex_lock(&l->mu);
	h = holder_get(l, holder);
	if (!h || h->reset || l->busy_all || busy_find(l, ino))
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

/*
 * Marks inos busy (busy 1: no lease granted until stk_meta_leases_end), revokes
 * the others' leases on them and waits for the acknowledgements.
 */
static void revoke(struct stk_meta_leases *l, uint32_t origin, const uint64_t *inos, size_t n,
		   int busy)
{
	struct {
		uint32_t slot, id;
		uint64_t seq;
	} w[STK_LEASE_HOLDERS_MAX]; /* whom to wait for, and for which record */
	uint32_t nw = 0;
	uint64_t now = stk_now_ns();
	struct timespec ts;

	pthread_mutex_lock(&l->mu);
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

		while (*pp) {
			struct grant *g = *pp;
			struct holder *h = NULL;
			uint32_t k, s;

			if (g->ino != inos[i] || g->holder == origin) {
				/* The origin's lease stays: it forgot its copies itself. */
				pp = &g->next;
				continue;
			}
			*pp = g->next;
			l->ngrants--;
			if (grant_live(l, g, now))
				h = holder_get(l, g->holder);
			free(g);
			if (!h)
				continue;
			enqueue(l, h, inos[i]);
			if (h->reset)
				continue; /* too far behind: reset, nothing to wait for */
			s = (uint32_t)(h - l->h);
			for (k = 0; k < nw && w[k].slot != s; k++)
				;
			if (k == nw) {
				w[nw].slot = s;
				w[nw].id = h->id;
				nw++;
			}
			w[k].seq = h->acked + h->qlen;
		}
	}
	l->st.grants = l->ngrants;
	while (nw) {
		uint64_t next = UINT64_MAX;

		now = stk_now_ns();
		for (uint32_t k = 0; k < nw;) {
			struct holder *h = &l->h[w[k].slot];
			uint64_t deadline = h->last_ns + STK_LEASE_VALID_MS * MS + MARGIN_NS;

			if (h->id != w[k].id || h->reset || h->acked >= w[k].seq) {
				w[k] = w[--nw];
				continue;
			}
			if (now >= deadline) {
				stk_warn("cache holder %u (session %016llx) did not acknowledge a "
					 "change in time; its cache is reset",
					 h->id, (unsigned long long)h->session);
				holder_reset(l, h);
				w[k] = w[--nw];
				continue;
			}
			next = deadline < next ? deadline : next;
			k++;
		}
		if (!nw)
			break;
		abstime_in(&ts, next - now);
		pthread_cond_timedwait(&l->acked, &l->mu, &ts);
	}
	pthread_mutex_unlock(&l->mu);
}

void stk_meta_leases_begin(struct stk_meta_leases *l, uint32_t origin, const uint64_t *inos,
			   size_t n)
{
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
	pthread_mutex_unlock(&l->mu);
}
