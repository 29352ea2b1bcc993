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
 * One mutex guards the policy and the buckets, taken only for requests of
 * client-key connections while some tenant has limits (nlimited != 0); another
 * guards the heap.
 */
#include "qos.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../common/log.h"
#include "../common/metrics.h"
#include "../common/util.h"
#include "../net/net.h"

#define BURST_NS 100000000ull /* a bucket holds 100 ms of its rate */
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
	__atomic_store_n(&nlimited, n, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&pol_lock);
	return 0;
}

int stk_qos_limited(const char *tenant)
{
	int r;

	if (!tenant || __atomic_load_n(&nlimited, __ATOMIC_ACQUIRE) == 0)
		return 0;
	pthread_mutex_lock(&pol_lock);
	r = find(tenant) != NULL;
	pthread_mutex_unlock(&pol_lock);
	return r;
}

uint64_t stk_qos_charge(const char *tenant, int write, uint64_t bytes)
{
	uint64_t now, wait = 0;
	struct tenant *t;
	double cost[NDIM];

	if (!tenant || __atomic_load_n(&nlimited, __ATOMIC_ACQUIRE) == 0)
		return 0;
	cost[0] = write ? 0 : (double)bytes;
	cost[1] = write ? (double)bytes : 0;
	cost[2] = 1;
	now = stk_now_ns();
	pthread_mutex_lock(&pol_lock);
	t = find(tenant);
	if (!t) {
		pthread_mutex_unlock(&pol_lock);
		return 0;
	}
	for (int d = 0; d < NDIM; d++) {
		double rate = (double)t->rate[d], burst, w;

		if (!t->rate[d])
			continue;
		burst = rate * (double)BURST_NS / 1e9;
		if (burst < 1)
			burst = 1;
		t->level[d] += rate * (double)(now - t->last_ns) / 1e9;
		if (t->level[d] > burst)
			t->level[d] = burst;
		t->level[d] -= cost[d];
		w = t->level[d] < 0 ? -t->level[d] / rate * 1e9 : 0;
		if ((uint64_t)w > wait)
			wait = (uint64_t)w;
	}
	t->last_ns = now;
	stk_metric_add(t->reqs, 1);
	if (wait)
		stk_metric_observe_ns(t->held, wait);
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
