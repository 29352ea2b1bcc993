/*
 * Unit test of meta's lease table (src/meta/leases.h): a change waits until every
 * other holder with a lease on what changed has acknowledged it through its watch,
 * skips the holder that made it (whose lease stays), and does not wait for a
 * holder without a lease; a holder that stops watching holds a change up no longer
 * than its trust plus the margin, and is then reset (its next watch says so, under
 * a new id, and its old leases are gone); no lease is granted on an inode while a
 * change to it is being made; an ended session's holder is waited for no more; a
 * watch with nothing to deliver returns after its wait. Delegations: a folder is
 * delegated to one holder only, and no other gets a lease on it; a read or change
 * by anyone else recalls it (queued for the holder, waited for until it
 * acknowledges, even without a lease of the holder on it), every reader of it
 * waiting for the same record; the holder's own reads and changes keep it; reads
 * recall nothing but delegations; delegations go with their folder and with their
 * holder's session. Holder ids of a table made after a restart do not start where
 * the last one's did.
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
#include "check.h"

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

static int seen(struct watcher *w, uint64_t ino)
{
	int found = 0;

	pthread_mutex_lock(&w->mu);
	for (uint32_t i = 0; i < w->nseen; i++)
		found |= w->seen[i] == ino;
	pthread_mutex_unlock(&w->mu);
	return found;
}

/* A recall in a thread of its own: what it returned, and when it did. */
struct recaller {
	struct stk_meta_leases *l;
	uint32_t requester;
	uint64_t ino;
	int rc, done;
};

static void *recall_main(void *arg)
{
	struct recaller *r = arg;

	r->rc = stk_meta_leases_recall(r->l, r->requester, &r->ino, 1);
	__atomic_store_n(&r->done, 1, __ATOMIC_RELEASE);
	return NULL;
}

static void test_delegations(struct stk_meta_leases *l)
{
	struct watcher c = {.l = l, .session = 0xc}, d = {.l = l, .session = 0xd};
	struct stk_meta_leases_stats st0, st;
	struct recaller r1, r2;
	pthread_t tc, t1, t2;
	uint64_t t0;

	pthread_mutex_init(&c.mu, NULL);
	pthread_mutex_init(&d.mu, NULL);
	CHECK(watch(&c, 0) == 0 && watch(&d, 0) == 0);
	stk_meta_leases_stats(l, &st0);
	CHECK(st0.delegations == 0);

	/* nothing delegated: a recall returns at once */
	t0 = stk_now_ns();
	CHECK(stk_meta_leases_recall(l, 0, &(uint64_t){100}, 1) == 0);
	CHECK(since(t0) < 0.05);

	/* one holder per folder; no holder, no delegation; each one made moves the
	 * counters a read checks after its read (its folder's and the total) */
	uint64_t g100 = stk_meta_leases_deleg_gen(l, 100), gall = stk_meta_leases_deleg_gen(l, 0);
	CHECK(stk_meta_leases_grant(l, c.holder, 100) == 1);
	CHECK(stk_meta_leases_deleg_gen(l, 100) == g100);
	CHECK(stk_meta_leases_delegate(l, c.holder, 100) == 1);
	CHECK(stk_meta_leases_deleg_gen(l, 100) == g100 + 1);
	CHECK(stk_meta_leases_deleg_gen(l, 0) == gall + 1);
	CHECK(stk_meta_leases_delegate(l, c.holder, 100) == 1); /* again: still its */
	CHECK(stk_meta_leases_delegate(l, d.holder, 100) == 0);
	CHECK(stk_meta_leases_delegate(l, 12345, 101) == 0);
	CHECK(stk_meta_leases_deleg_gen(l, 100) == g100 + 1); /* refused or again: not made */
	CHECK(stk_meta_leases_deleg_gen(l, 0) == gall + 1);
	stk_meta_leases_stats(l, &st);
	CHECK(st.delegations == 1);
	/* which reads would wait for a recall (an event loop asks before it reads) */
	CHECK(stk_meta_leases_delegated_elsewhere(l, d.holder, &(uint64_t){100}, 1) == 1);
	CHECK(stk_meta_leases_delegated_elsewhere(l, 0, (uint64_t[]){7, 100}, 2) == 1);
	CHECK(stk_meta_leases_delegated_elsewhere(l, c.holder, &(uint64_t){100}, 1) == 0);
	CHECK(stk_meta_leases_delegated_elsewhere(l, d.holder, &(uint64_t){101}, 1) == 0);
	/* no one else gets a lease on it; its holder does */
	CHECK(stk_meta_leases_grant(l, d.holder, 100) == 0);
	CHECK(stk_meta_leases_grant(l, c.holder, 100) == 1);
	/* not delegated where another holder has a lease, nor while a change is made */
	CHECK(stk_meta_leases_grant(l, d.holder, 102) == 1);
	CHECK(stk_meta_leases_delegate(l, c.holder, 102) == 0);
	stk_meta_leases_begin(l, 0, &(uint64_t){103}, 1);
	CHECK(stk_meta_leases_delegate(l, c.holder, 103) == 0);
	stk_meta_leases_end(l, &(uint64_t){103}, 1);

	/* the holder's own reads and changes keep it, and queue nothing */
	t0 = stk_now_ns();
	CHECK(stk_meta_leases_recall(l, c.holder, &(uint64_t){100}, 1) == 0);
	stk_meta_leases_begin(l, c.holder, &(uint64_t){100}, 1);
	stk_meta_leases_end(l, &(uint64_t){100}, 1);
	CHECK(since(t0) < 0.05);
	stk_meta_leases_stats(l, &st);
	CHECK(st.delegations == 1 && st.recalls == st0.recalls);
	CHECK(watch(&c, 0) == 0 && c.nseen == 0);

	/* a read by someone else recalls it: c is told, and acknowledges, before it returns */
	pthread_create(&tc, NULL, watch_loop, &c);
	t0 = stk_now_ns();
	CHECK(stk_meta_leases_recall(l, d.holder, &(uint64_t){100}, 1) == 1);
	CHECK(seen(&c, 100));
	CHECK(since(t0) < 1.0);
	stk_meta_leases_stats(l, &st);
	CHECK(st.delegations == 0 && st.recalls == st0.recalls + 1);
	/* gone: the next read does not wait, and d may lease it now */
	CHECK(stk_meta_leases_recall(l, d.holder, &(uint64_t){100}, 1) == 0);
	CHECK(stk_meta_leases_grant(l, d.holder, 100) == 1);

	/* a read recalls delegations only: c's lease on 104 stays, unrevoked */
	CHECK(stk_meta_leases_grant(l, c.holder, 104) == 1);
	CHECK(stk_meta_leases_recall(l, 0, (uint64_t[]){104, 105}, 2) == 0);
	CHECK(!seen(&c, 104));

	/* a change by another origin recalls a delegation with no lease of its holder on it */
	CHECK(stk_meta_leases_delegate(l, c.holder, 200) == 1);
	t0 = stk_now_ns();
	stk_meta_leases_begin(l, d.holder, &(uint64_t){200}, 1);
	CHECK(seen(&c, 200));
	CHECK(since(t0) < 1.0);
	stk_meta_leases_end(l, &(uint64_t){200}, 1);
	stk_meta_leases_stats(l, &st);
	CHECK(st.delegations == 0 && st.recalls == st0.recalls + 2);
	__atomic_store_n(&c.stop, 1, __ATOMIC_RELEASE);
	pthread_join(tc, NULL);
	c.stop = 0;

	/*
	 * While c has not acknowledged a recall, every other reader waits for the same
	 * record: a second recall finds the folder being recalled, and returns with
	 * the first once c acknowledges.
	 */
	CHECK(stk_meta_leases_delegate(l, c.holder, 300) == 1);
	r1 = (struct recaller){.l = l, .requester = d.holder, .ino = 300};
	r2 = (struct recaller){.l = l, .requester = 0, .ino = 300};
	pthread_create(&t1, NULL, recall_main, &r1);
	usleep(100 * 1000);
	pthread_create(&t2, NULL, recall_main, &r2);
	usleep(100 * 1000);
	CHECK(!__atomic_load_n(&r1.done, __ATOMIC_ACQUIRE));
	CHECK(!__atomic_load_n(&r2.done, __ATOMIC_ACQUIRE));
	c.nseen = 0;
	CHECK(watch(&c, 0) == 0 && c.nseen == 1 && c.seen[0] == 300); /* delivered, not acked */
	usleep(50 * 1000);
	CHECK(!__atomic_load_n(&r1.done, __ATOMIC_ACQUIRE));
	CHECK(watch(&c, 0) == 0); /* acknowledged */
	pthread_join(t1, NULL);
	pthread_join(t2, NULL);
	CHECK(r1.rc == 1 && r2.rc == 1);
	stk_meta_leases_stats(l, &st);
	CHECK(st.delegations == 0 && st.recalls == st0.recalls + 3); /* one recall, two readers */

	/*
	 * A holder still sending its names (stk_meta_leases_alive, as META_NAMES does) is
	 * waited for past its last watch's deadline (2.5 s), and not reset.
	 */
	CHECK(stk_meta_leases_delegate(l, c.holder, 320) == 1);
	r1 = (struct recaller){.l = l, .requester = d.holder, .ino = 320};
	t0 = stk_now_ns();
	pthread_create(&t1, NULL, recall_main, &r1);
	while (since(t0) < 3.5) {
		stk_meta_leases_alive(l, c.holder);
		usleep(100 * 1000);
	}
	CHECK(!__atomic_load_n(&r1.done, __ATOMIC_ACQUIRE));
	CHECK(watch(&c, 0) == 0 && watch(&c, 0) == 0); /* delivered, then acknowledged */
	pthread_join(t1, NULL);
	CHECK(r1.rc == 1);

	/* a folder gone takes its delegation with it, nothing recalled */
	CHECK(stk_meta_leases_delegate(l, c.holder, 310) == 1);
	stk_meta_leases_undelegate(l, 310);
	stk_meta_leases_undelegate(l, 311); /* never delegated: nothing */
	stk_meta_leases_stats(l, &st);
	CHECK(st.delegations == 0 && st.recalls == st0.recalls + 4);
	CHECK(stk_meta_leases_recall(l, d.holder, &(uint64_t){310}, 1) == 0);

	/* a holder's delegations end with its session */
	CHECK(stk_meta_leases_delegate(l, c.holder, 400) == 1);
	CHECK(stk_meta_leases_delegate(l, c.holder, 401) == 1);
	stk_meta_leases_stats(l, &st);
	CHECK(st.delegations == 2);
	stk_meta_leases_end_session(l, c.session);
	stk_meta_leases_stats(l, &st);
	CHECK(st.delegations == 0);
	t0 = stk_now_ns();
	CHECK(stk_meta_leases_recall(l, d.holder, (uint64_t[]){400, 401}, 2) == 0);
	stk_meta_leases_begin(l, d.holder, &(uint64_t){401}, 1);
	stk_meta_leases_end(l, &(uint64_t){401}, 1);
	CHECK(since(t0) < 0.05);
	CHECK(stk_meta_leases_delegate(l, c.holder, 402) == 0); /* its holder is gone */
	stk_meta_leases_end_session(l, d.session);
}

/*
 * A meta restart makes a new table, and a client's change sent before the restart
 * may reach the new one with its old holder id as origin: that id must not name
 * another client's new holder, whose leases the change would then leave alone.
 * The first holders of four tables (four restarts): not all the same id.
 */
static void test_ids_across_restarts(void)
{
	uint32_t ids[4];
	int same = 1;

	for (int i = 0; i < 4; i++) {
		struct stk_meta_leases *t;
		struct watcher w = {.session = 0xc};

		ids[i] = 0;
		if (stk_meta_leases_create(&t)) {
			CHECK(!"cannot create a table");
			return;
		}
		w.l = t;
		pthread_mutex_init(&w.mu, NULL);
		CHECK(watch(&w, 0) == 0 && w.holder != 0);
		ids[i] = w.holder;
		pthread_mutex_destroy(&w.mu);
		stk_meta_leases_destroy(t);
	}
	for (int i = 1; i < 4; i++)
		same = same && ids[i] == ids[0];
	CHECK(!same);
}

/* A restarted meta's grace: its first change waits 2.5 s, reads and grants do not. */
static void test_grace(void)
{
	struct stk_meta_leases *g;
	uint64_t t0;

	if (stk_meta_leases_create(&g)) {
		CHECK(0);
		return;
	}
	stk_meta_leases_grace(g);
	t0 = stk_now_ns();
	CHECK(stk_meta_leases_grant(g, 0, 5) == 0); /* no such holder; answered at once */
	CHECK(stk_meta_leases_delegated_elsewhere(g, 0, &(uint64_t){5}, 1) == 0);
	CHECK(since(t0) < 0.1);
	stk_meta_leases_begin(g, 0, &(uint64_t){5}, 1);
	CHECK(since(t0) >= (STK_LEASE_VALID_MS + STK_LEASE_MARGIN_MS) / 1000.0 - 0.05);
	stk_meta_leases_end(g, &(uint64_t){5}, 1);
	t0 = stk_now_ns();
	stk_meta_leases_begin(g, 0, &(uint64_t){5}, 1); /* over: no wait any more */
	CHECK(since(t0) < 0.1);
	stk_meta_leases_end(g, &(uint64_t){5}, 1);
	stk_meta_leases_destroy(g);
}

/*
 * A follower promoted in a failover waits less the longer mgmtd's heartbeat
 * timeout: the old leader answered its last watch at least T/4 before the
 * promotion (leases.h); nothing from T = 10 s, the whole grace if T is unknown.
 */
static void test_failover_grace(void)
{
	struct stk_meta_leases *g;
	unsigned full = STK_LEASE_VALID_MS + STK_LEASE_MARGIN_MS;
	uint64_t t0;

	CHECK(stk_meta_leases_failover_ms(0) == full);
	CHECK(stk_meta_leases_failover_ms(2000) == full - 500);
	CHECK(stk_meta_leases_failover_ms(10000) == 0);
	CHECK(stk_meta_leases_failover_ms(4 * full) == 0);
	CHECK(stk_meta_leases_failover_ms(4 * full - 4) == 1);
	CHECK(stk_meta_leases_failover_ms(UINT32_MAX) == 0);
	if (stk_meta_leases_create(&g)) {
		CHECK(0);
		return;
	}
	stk_meta_leases_grace_ms(g, 300);
	t0 = stk_now_ns();
	stk_meta_leases_begin(g, 0, &(uint64_t){5}, 1);
	CHECK(since(t0) >= 0.25 && since(t0) < 1.0);
	stk_meta_leases_end(g, &(uint64_t){5}, 1);
	stk_meta_leases_grace_ms(g, 0); /* none */
	t0 = stk_now_ns();
	stk_meta_leases_begin(g, 0, &(uint64_t){5}, 1);
	CHECK(since(t0) < 0.1);
	stk_meta_leases_end(g, &(uint64_t){5}, 1);
	stk_meta_leases_destroy(g);
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
	test_grace();
	test_failover_grace();
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

	test_delegations(l);

	stk_meta_leases_destroy(l);
	test_ids_across_restarts();
	return check_done();
}
