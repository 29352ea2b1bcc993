/*
 * QoS at a storage node: token buckets per tenant and a timer for the requests
 * they hold (qos.h says the contract, docs/qos.md the rule).
 *
 * Buckets. Each limit (bytes read, bytes written, requests) is a bucket filled
 * at its rate and holding at most BURST_NS worth of it. A request takes its cost
 * out at once, even below zero; a negative level is a debt that the rate pays
 * back, and the request waits until it is paid: wait = -level / rate. Charging
 * on arrival keeps the order of a tenant's requests and needs no queue per
 * tenant: the wait is known when the request comes, so the request is simply
 * parked until then. The longest of the three waits wins.
 *
 * Timer. Parked requests sit in a binary heap ordered by their due time; one
 * thread sleeps on a condition variable until the earliest is due, then hands it
 * back to the workers (net.h, stk_rpc_pending_requeue). The heap grows as
 * needed; when it cannot, the request is served at once (a limit overshot, never
 * a request lost).
 *
 * Classes. A class's own limits are a record like a tenant's, named "@default"
 * or "@checkpoint", whose buckets every tenant's requests of that class share.
 * They are charged only while a request of a higher class arrived within
 * STK_QOS_BUSY_NS (seen[], a time per class): a checkpoint alone runs as fast as
 * its tenant's limits let it; next to training reads it gets the class's rate.
 *
 * One mutex guards the policy and the buckets, taken only to charge requests of
 * limited tenants (by the workers) and to change the policy; another guards the
 * heap.
 *
 * Lookups. Whether a tenant or class has limits is asked on the event loop for
 * every read of a client-key connection while any limit exists (the loop then
 * hands a limited one to the workers), so that question takes no lock: the
 * names with limits sit in one of two open-addressing tables of fixed size,
 * every field read and written with atomics. A policy change rewrites the table
 * readers are not using, inside an odd sequence number, then points readers at
 * it; a reader checks that the sequence of the table it read did not move
 * (a seqlock, C11 fences as in Boehm's "Can seqlocks get along with programming
 * language memory models?"), else reads again. Readers write nothing shared and
 * never wait for a writer: the table in use is never the one being written,
 * unless two changes pass during one lookup, and then it is read again.
 */
#include "qos.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <xxhash.h>

#include "../common/log.h"
#include "../common/metrics.h"
#include "../common/util.h"
#include "../net/net.h"

#define BURST_NS 100000000ull /* a bucket holds 100 ms of its rate */
/* A class's own record, by class: training-read, the highest, has none. */
static const char *const class_rec[] = {"@default", NULL, "@checkpoint"};
#define NDIM 3		      /* read bytes, write bytes, requests */

struct tenant {
	struct stk_msg_qos_rec rec;
	uint64_t rate[NDIM]; /* per second; 0: no limit */
	double level[NDIM];
	uint64_t last_ns;
	stk_metric_t held; /* QOS_THROTTLED{tenant} */
	stk_metric_t reqs; /* QOS_REQUESTS{tenant} */
};

static pthread_mutex_t pol_lock = PTHREAD_MUTEX_INITIALIZER;
static struct tenant tenants[STK_QOS_MAX]; /* under pol_lock */
static uint32_t ntenants;		   /* under pol_lock */
static uint32_t nlimited;		   /* atomic: ntenants, read without the lock */
static uint32_t nclasses;		   /* atomic: how many of them are a class's ("@...") */
static uint64_t seen[STK_QOS_CLASS_LOWEST + 1]; /* atomic: a class's last request */

/*
 * The lock-free lookup tables (above). A name of up to LK_NAME - 1 bytes (every
 * client name: STK_CLIENT_NAME_MAX is 63; a class record's "@..." name) is kept
 * as LK_WORDS words, NUL-padded; a longer tenant name can never be a client's,
 * and is left out. hash 0 marks an empty slot.
 */
#define LK_NAME 64
#define LK_WORDS (LK_NAME / 8)
#define LK_SLOTS 128 /* a power of two, at least twice STK_QOS_MAX */

struct lk_slot {
	uint64_t hash;
	uint64_t w[LK_WORDS];
};

struct lk_table {
	uint32_t seq;	  /* odd while a writer rewrites this table */
	uint32_t classes; /* bit c: class c's own record has limits */
	struct lk_slot slot[LK_SLOTS];
};

static struct lk_table lk[2]; /* every field through __atomic_*; written under pol_lock */
static uint32_t lk_cur;	      /* atomic: the table readers use */

/* name as words and its hash (never 0); -1 for a name no table holds. */
static int lk_key(const char *name, uint64_t w[LK_WORDS], uint64_t *hash)
{
	size_t n = strnlen(name, LK_NAME);

	if (n == LK_NAME)
		return -1;
	memset(w, 0, LK_NAME);
	memcpy(w, name, n);
	*hash = XXH64(w, LK_NAME, 0) | 1;
	return 0;
}

/* 1 when t holds the name w (hash h). Reads only, with atomics. */
static int lk_find(const struct lk_table *t, const uint64_t w[LK_WORDS], uint64_t h)
{
	unsigned i = (unsigned)h & (LK_SLOTS - 1);

	for (unsigned n = 0; n < LK_SLOTS; n++, i = (i + 1) & (LK_SLOTS - 1)) {
		uint64_t sh = __atomic_load_n(&t->slot[i].hash, __ATOMIC_RELAXED);
		unsigned k = 0;

		if (!sh)
			return 0;
		if (sh != h)
			continue;
		while (k < LK_WORDS && __atomic_load_n(&t->slot[i].w[k], __ATOMIC_RELAXED) == w[k])
			k++;
		if (k == LK_WORDS)
			return 1;
	}
	return 0;
}

/* Writes list into the table readers do not use, then hands it to them. Under pol_lock. */
static void lk_publish(const struct stk_msg_qos_rec *list, uint32_t n)
{
	uint32_t cur = __atomic_load_n(&lk_cur, __ATOMIC_RELAXED);
	struct lk_table *t = &lk[cur ^ 1];
	uint32_t seq = __atomic_load_n(&t->seq, __ATOMIC_RELAXED), classes = 0;

	__atomic_store_n(&t->seq, seq + 1, __ATOMIC_RELAXED);
	__atomic_thread_fence(__ATOMIC_RELEASE);
	for (unsigned i = 0; i < LK_SLOTS; i++) {
		__atomic_store_n(&t->slot[i].hash, 0, __ATOMIC_RELAXED);
		for (unsigned k = 0; k < LK_WORDS; k++)
			__atomic_store_n(&t->slot[i].w[k], 0, __ATOMIC_RELAXED);
	}
	for (uint32_t j = 0; j < n; j++) {
		uint64_t w[LK_WORDS], h;
		unsigned i;

		for (unsigned c = 0; c <= STK_QOS_CLASS_LOWEST; c++)
			if (class_rec[c] && strcmp(list[j].tenant, class_rec[c]) == 0)
				classes |= 1u << c;
		if (lk_key(list[j].tenant, w, &h))
			continue;
		/* n <= STK_QOS_MAX < LK_SLOTS: a free slot is always found */
		for (i = (unsigned)h & (LK_SLOTS - 1);
		     __atomic_load_n(&t->slot[i].hash, __ATOMIC_RELAXED);
		     i = (i + 1) & (LK_SLOTS - 1))
			;
		for (unsigned k = 0; k < LK_WORDS; k++)
			__atomic_store_n(&t->slot[i].w[k], w[k], __ATOMIC_RELAXED);
		__atomic_store_n(&t->slot[i].hash, h, __ATOMIC_RELAXED);
	}
	__atomic_store_n(&t->classes, classes, __ATOMIC_RELAXED);
	__atomic_store_n(&t->seq, seq + 2, __ATOMIC_RELEASE);
	__atomic_store_n(&lk_cur, cur ^ 1, __ATOMIC_RELEASE);
}

/* A class's rank: 0 the highest (training-read), then default, then checkpoint. */
static unsigned rank(unsigned cls)
{
	return cls == 1 ? 0 : cls == 0 ? 1 : 2;
}

struct parked {
	uint64_t due_ns;
	struct stk_rpc_pending *p;
};

static pthread_mutex_t heap_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t heap_cv;
static struct parked *heap; /* under heap_lock */
static size_t nheap, cap_heap;
static int running, stopping;
static pthread_t timer_thread;
static stk_metric_t held_now; /* QOS_HELD */

static struct tenant *find(const char *name)
{
	for (uint32_t i = 0; i < ntenants; i++)
		if (strcmp(tenants[i].rec.tenant, name) == 0)
			return &tenants[i];
	return NULL;
}

int stk_qos_policy_set(const struct stk_msg_qos_rec *list, uint32_t n)
{
	struct tenant fresh[STK_QOS_MAX];
	uint64_t now = stk_now_ns();

	if (n > STK_QOS_MAX)
		return -EINVAL;
	pthread_mutex_lock(&pol_lock);
	for (uint32_t i = 0; i < n; i++) {
		struct tenant *t = &fresh[i], *old = find(list[i].tenant);
		const char *lv[1] = {list[i].tenant};

		memset(t, 0, sizeof(*t));
		t->rec = list[i];
		t->rate[0] = list[i].read_bw;
		t->rate[1] = list[i].write_bw;
		t->rate[2] = list[i].iops;
		t->last_ns = now;
		/* A tenant kept keeps its debt: changing a limit is no way out of one. */
		if (old) {
			for (int d = 0; d < NDIM; d++)
				t->level[d] = old->level[d] < 0 ? old->level[d] : 0;
			t->last_ns = old->last_ns;
			t->held = old->held;
			t->reqs = old->reqs;
		} else {
			/* registered once per tenant seen: series are never removed */
			stk_metric_series(STK_M_QOS_THROTTLED, lv, &t->held);
			stk_metric_series(STK_M_QOS_REQUESTS, lv, &t->reqs);
		}
	}
	memcpy(tenants, fresh, (size_t)n * sizeof(fresh[0]));
	ntenants = n;
	lk_publish(list, n);
	{
		uint32_t k = 0;

		for (uint32_t i = 0; i < n; i++)
			k += list[i].tenant[0] == '@';
		__atomic_store_n(&nclasses, k, __ATOMIC_RELEASE);
	}
	__atomic_store_n(&nlimited, n, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&pol_lock);
	return 0;
}

void stk_qos_seen(unsigned cls)
{
	if (cls <= STK_QOS_CLASS_LOWEST && __atomic_load_n(&nclasses, __ATOMIC_RELAXED))
		__atomic_store_n(&seen[cls], stk_now_ns(), __ATOMIC_RELAXED);
}

int stk_qos_limited(const char *tenant, unsigned cls)
{
	uint64_t w[LK_WORDS], h;
	int named;

	if (!tenant || __atomic_load_n(&nlimited, __ATOMIC_ACQUIRE) == 0)
		return 0;
	named = lk_key(tenant, w, &h) == 0;
	for (;;) {
		const struct lk_table *t = &lk[__atomic_load_n(&lk_cur, __ATOMIC_ACQUIRE)];
		uint32_t seq = __atomic_load_n(&t->seq, __ATOMIC_ACQUIRE);
		int r;

		if (seq & 1)
			continue; /* being rewritten: lk_cur has moved on since we read it */
		r = (named && lk_find(t, w, h)) ||
		    (cls <= STK_QOS_CLASS_LOWEST &&
		     (__atomic_load_n(&t->classes, __ATOMIC_RELAXED) >> cls & 1));
		__atomic_thread_fence(__ATOMIC_ACQUIRE);
		if (__atomic_load_n(&t->seq, __ATOMIC_RELAXED) == seq)
			return r;
	}
}

/* 1 when a class above cls had a request within STK_QOS_BUSY_NS of now. */
static int higher_busy(unsigned cls, uint64_t now)
{
	for (unsigned c = 0; c <= STK_QOS_CLASS_LOWEST; c++) {
		uint64_t t = __atomic_load_n(&seen[c], __ATOMIC_RELAXED);

		if (rank(c) < rank(cls) && t && t + STK_QOS_BUSY_NS > now) /* t may be past now */
			return 1;
	}
	return 0;
}

/* Takes cost out of t's buckets: the wait it leaves (ns). Call with pol_lock held. */
static uint64_t take(struct tenant *t, const double cost[NDIM], uint64_t now)
{
	uint64_t wait = 0;

	for (int d = 0; d < NDIM; d++) {
		double rate = (double)t->rate[d], burst, w;

		if (!t->rate[d])
			continue;
		burst = rate * (double)BURST_NS / 1e9;
		if (burst < 1)
			burst = 1;
		if (now > t->last_ns)
			t->level[d] += rate * (double)(now - t->last_ns) / 1e9;
		if (t->level[d] > burst)
			t->level[d] = burst;
		t->level[d] -= cost[d];
		w = t->level[d] < 0 ? -t->level[d] / rate * 1e9 : 0;
		if ((uint64_t)w > wait)
			wait = (uint64_t)w;
	}
	if (now > t->last_ns)
		t->last_ns = now;
	stk_metric_add(t->reqs, 1);
	if (wait)
		stk_metric_observe_ns(t->held, wait);
	return wait;
}

uint64_t stk_qos_charge(const char *tenant, unsigned cls, int write, uint64_t bytes)
{
	uint64_t now, wait = 0, w;
	struct tenant *t, *k = NULL;
	double cost[NDIM];

	if (__atomic_load_n(&nlimited, __ATOMIC_ACQUIRE) == 0)
		return 0;
	if (!tenant)
		return 0;
	cost[0] = write ? 0 : (double)bytes;
	cost[1] = write ? (double)bytes : 0;
	cost[2] = 1;
	pthread_mutex_lock(&pol_lock);
	now = stk_now_ns(); /* under the lock: a bucket's last_ns never passes it */
	t = find(tenant);
	/* the tenant's cap: its requests count as no higher than its max_class */
	if (t && t->rec.max_class <= STK_QOS_CLASS_LOWEST && rank(t->rec.max_class) > rank(cls))
		cls = t->rec.max_class;
	if (cls <= STK_QOS_CLASS_LOWEST && __atomic_load_n(&nclasses, __ATOMIC_RELAXED))
		__atomic_store_n(&seen[cls], now, __ATOMIC_RELAXED);
	/* a class's own limits, only while a higher class is served here */
	if (cls <= STK_QOS_CLASS_LOWEST && class_rec[cls] && higher_busy(cls, now))
		k = find(class_rec[cls]);
	if (t)
		wait = take(t, cost, now);
	if (k && (w = take(k, cost, now)) > wait)
		wait = w;
	pthread_mutex_unlock(&pol_lock);
	return wait;
}

/* ---- the timer ---- */

static void heap_swap(size_t a, size_t b)
{
	struct parked x = heap[a];

	heap[a] = heap[b];
	heap[b] = x;
}

static void heap_push(struct parked e)
{
	size_t i = nheap++;

	heap[i] = e;
	while (i && heap[(i - 1) / 2].due_ns > heap[i].due_ns) {
		heap_swap(i, (i - 1) / 2);
		i = (i - 1) / 2;
	}
}

static struct parked heap_pop(void)
{
	struct parked top = heap[0];
	size_t i = 0;

	heap[0] = heap[--nheap];
	for (;;) {
		size_t l = 2 * i + 1, r = l + 1, m = i;

		if (l < nheap && heap[l].due_ns < heap[m].due_ns)
			m = l;
		if (r < nheap && heap[r].due_ns < heap[m].due_ns)
			m = r;
		if (m == i)
			break;
		heap_swap(i, m);
		i = m;
	}
	return top;
}

static void *timer_main(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&heap_lock);
	for (;;) {
		uint64_t now = stk_now_ns();

		while (nheap && (stopping || heap[0].due_ns <= now)) {
			struct parked e = heap_pop();

			stk_metric_add(held_now, -1);

			/* requeued without the lock: a stopping server answers at once */
			pthread_mutex_unlock(&heap_lock);
			stk_rpc_pending_requeue(e.p);
			pthread_mutex_lock(&heap_lock);
		}
		if (stopping)
			break;
		if (nheap) {
			struct timespec ts;
			uint64_t due = heap[0].due_ns;

			/* stk_now_ns is CLOCK_MONOTONIC, as the condition variable's clock */
			ts.tv_sec = (time_t)(due / 1000000000ull);
			ts.tv_nsec = (long)(due % 1000000000ull);
			pthread_cond_timedwait(&heap_cv, &heap_lock, &ts);
		} else {
			pthread_cond_wait(&heap_cv, &heap_lock);
		}
	}
	pthread_mutex_unlock(&heap_lock);
	return NULL;
}

int stk_qos_start(void)
{
	pthread_condattr_t ca;
	int rc;

	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&heap_cv, &ca);
	pthread_condattr_destroy(&ca);
	stopping = 0;
	stk_metric_series(STK_M_QOS_HELD, NULL, &held_now);
	rc = -pthread_create(&timer_thread, NULL, timer_main, NULL);
	if (rc == 0)
		running = 1;
	return rc;
}

void stk_qos_stop(void)
{
	if (!running)
		return;
	pthread_mutex_lock(&heap_lock);
	stopping = 1;
	pthread_cond_signal(&heap_cv);
	pthread_mutex_unlock(&heap_lock);
	pthread_join(timer_thread, NULL);
	running = 0;
	free(heap);
	heap = NULL;
	nheap = cap_heap = 0;
}

int stk_qos_park(struct stk_rpc_pending *p, uint64_t wait_ns)
{
	struct parked e = {.due_ns = stk_now_ns() + wait_ns, .p = p};
	int wake;

	pthread_mutex_lock(&heap_lock);
	if (!running || stopping) {
		pthread_mutex_unlock(&heap_lock);
		return -ESHUTDOWN;
	}
	if (nheap == cap_heap) {
		size_t cap = cap_heap ? cap_heap * 2 : 256;
		struct parked *h = realloc(heap, cap * sizeof(*h));

		if (!h) {
			pthread_mutex_unlock(&heap_lock);
			return -ENOMEM;
		}
		heap = h;
		cap_heap = cap;
	}
	heap_push(e);
	stk_metric_add(held_now, 1);
	wake = heap[0].p == p; /* the new earliest: the timer sleeps too long otherwise */
	if (wake)
		pthread_cond_signal(&heap_cv);
	pthread_mutex_unlock(&heap_lock);
	return 0;
}
