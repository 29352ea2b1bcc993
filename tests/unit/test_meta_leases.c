/*
 * Unit test of meta's lease table (src/meta/leases.h): a change waits until every
 * other holder with a lease on what changed has acknowledged it through its watch,
 * skips the holder that made it (whose lease stays), and does not wait for a
 * holder without a lease; a holder that stops watching holds a change up no longer
 * than its trust plus the margin, and is then reset (its next watch says so, under
 * a new id, and its old leases are gone); no lease is granted on an inode while a
 * change to it is being made; an ended session's holder is waited for no more; a
 * watch with nothing to deliver returns after its wait.
 *
 * Exit status: 0 pass, 1 fail.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/util.h"
#include "meta/leases.h"

static int failures;

#define CHECK(cond)                                                                                \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);   \
			failures++;                                                                \
		}                                                                                  \
	} while (0)

struct watcher {
	struct stk_meta_leases *l;
	uint64_t session;
	uint32_t holder;
	uint64_t acked;
	uint64_t seen[64];
	uint32_t nseen;
	int stop, resets;
	pthread_mutex_t mu;
};

/* One watch: registers or acknowledges, records what it got. */
static int watch(struct watcher *w, uint32_t wait_ms)
{
	uint64_t inos[16], seq = 0;
	uint32_t n = 0;
	int reset = 0, rc;

	rc = stk_meta_leases_watch(w->l, w->session, &w->holder, w->acked, wait_ms, inos, 16, &n,
				   &seq, &reset);
	if (rc)
		return rc;
	pthread_mutex_lock(&w->mu);
	for (uint32_t i = 0; i < n && w->nseen < 64; i++)
		w->seen[w->nseen++] = inos[i];
	w->resets += reset;
	pthread_mutex_unlock(&w->mu);
	w->acked = seq;
	return 0;
}

static void *watch_loop(void *arg)
{
	struct watcher *w = arg;

	while (!__atomic_load_n(&w->stop, __ATOMIC_ACQUIRE))
		watch(w, 100);
	return NULL;
}

static double since(uint64_t t0)
{
	return (double)(stk_now_ns() - t0) / 1e9;
}

int main(void)
{
	struct stk_meta_leases *l;
	struct watcher a = {.session = 0xa}, b = {.session = 0xb};
	struct stk_meta_leases_stats st;
	pthread_t ta;
	uint64_t t0, ino;

	if (stk_meta_leases_create(&l)) {
		fprintf(stderr, "cannot create the table\n");
		return 1;
	}
	a.l = b.l = l;
	pthread_mutex_init(&a.mu, NULL);
	pthread_mutex_init(&b.mu, NULL);

	/* registering: a new id, and "reset" (nothing cached may be trusted yet) */
	CHECK(watch(&a, 0) == 0 && a.holder != 0 && a.resets == 1);
	CHECK(watch(&b, 0) == 0 && b.holder != 0 && b.holder != a.holder);
	CHECK(stk_meta_leases_watch(l, 0, &a.holder, 0, 0, &ino, 1, &(uint32_t){0}, &t0,
				    &(int){0}) == -EINVAL);

	/* a watch with nothing to deliver returns after its wait */
	t0 = stk_now_ns();
	CHECK(watch(&a, 200) == 0 && a.nseen == 0);
	CHECK(since(t0) >= 0.15 && since(t0) < 1.0);

	/* a change no one holds a lease on does not wait */
	t0 = stk_now_ns();
	stk_meta_leases_changed(l, 0, &(uint64_t){7}, 1);
	CHECK(since(t0) < 0.05);

	/* a holds leases on 10 and 11; b changes 10: b is not told, a is, and b waits for a */
	CHECK(stk_meta_leases_grant(l, a.holder, 10) == 1);
	CHECK(stk_meta_leases_grant(l, a.holder, 11) == 1);
	CHECK(stk_meta_leases_grant(l, b.holder, 10) == 1);
	CHECK(stk_meta_leases_grant(l, 12345, 10) == 0); /* no such holder */
	pthread_create(&ta, NULL, watch_loop, &a);
	t0 = stk_now_ns();
	stk_meta_leases_changed(l, b.holder, &(uint64_t){10}, 1);
	pthread_mutex_lock(&a.mu);
	CHECK(a.nseen == 1 && a.seen[0] == 10); /* a had it before the change returned */
	pthread_mutex_unlock(&a.mu);
	CHECK(since(t0) < 1.0);
	/* b's own lease on 10 stayed; a's went: a change by a now waits for b */
	__atomic_store_n(&a.stop, 1, __ATOMIC_RELEASE);
	pthread_join(ta, NULL);
	a.stop = 0;
	pthread_create(&ta, NULL, watch_loop, &b); /* b watching for this part */
	t0 = stk_now_ns();
	stk_meta_leases_changed(l, a.holder, &(uint64_t){10}, 1);
	CHECK(since(t0) < 1.0);
	pthread_mutex_lock(&b.mu);
	CHECK(b.nseen == 1 && b.seen[0] == 10);
	pthread_mutex_unlock(&b.mu);
	__atomic_store_n(&b.stop, 1, __ATOMIC_RELEASE);
	pthread_join(ta, NULL);
	b.stop = 0;

	/* a stops watching while it holds 11: a change waits out its trust, then resets a */
	t0 = stk_now_ns();
	stk_meta_leases_changed(l, 0, &(uint64_t){11}, 1);
	CHECK(since(t0) >= (STK_LEASE_VALID_MS - 500) / 1000.0);
	CHECK(since(t0) < (STK_LEASE_VALID_MS + 1500) / 1000.0);
	stk_meta_leases_stats(l, &st);
	CHECK(st.resets == 1);
	{
		uint32_t old = a.holder;

		a.resets = 0;
		CHECK(watch(&a, 0) == 0 && a.resets == 1 && a.holder != old);
		/* the old id grants nothing any more */
		CHECK(stk_meta_leases_grant(l, old, 11) == 0);
	}
	/* a reset holder's old leases are gone: a change does not wait for it */
	t0 = stk_now_ns();
	stk_meta_leases_changed(l, 0, &(uint64_t){11}, 1);
	CHECK(since(t0) < 0.05);

	/* while a change is being made, no lease is granted on what it changes */
	stk_meta_leases_begin(l, 0, &(uint64_t){30}, 1);
	CHECK(stk_meta_leases_grant(l, a.holder, 30) == 0);
	CHECK(stk_meta_leases_grant(l, a.holder, 31) == 1);
	stk_meta_leases_begin(l, 0, &(uint64_t){30}, 1); /* two at once */
	stk_meta_leases_end(l, &(uint64_t){30}, 1);
	CHECK(stk_meta_leases_grant(l, a.holder, 30) == 0);
	stk_meta_leases_end(l, &(uint64_t){30}, 1);
	CHECK(stk_meta_leases_grant(l, a.holder, 30) == 1);

	/* an ended session is waited for no more */
	CHECK(stk_meta_leases_grant(l, b.holder, 20) == 1);
	stk_meta_leases_end_session(l, b.session);
	t0 = stk_now_ns();
	stk_meta_leases_changed(l, 0, &(uint64_t){20}, 1);
	CHECK(since(t0) < 0.05);
	stk_meta_leases_stats(l, &st);
	CHECK(st.holders == 1);

	stk_meta_leases_destroy(l);
	if (failures) {
		fprintf(stderr, "test_meta_leases: %d failure(s)\n", failures);
		return 1;
	}
	printf("test_meta_leases: ok\n");
	return 0;
}
