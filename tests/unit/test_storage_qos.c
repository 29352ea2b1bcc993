/*
 * Unit test of the storage node's QoS lookups (src/storage/qos.c): which tenants
 * and classes have limits, as the event loops ask on every read
 * (stk_qos_limited), and what charging one costs. The answers follow each new
 * policy; readers that ask while other threads replace the policy over and over
 * always get an answer of one policy or the next, never a torn one, and never
 * crash.
 *
 * `test_storage_qos --bench [SECONDS]` times stk_qos_limited with STK_QOS_MAX
 * tenants limited, for a limited and an unlimited name, on 1 and 2 threads, and
 * prints nanoseconds per lookup (docs/BENCHMARKS.md, "QoS lookups").
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "proto/msg.h"
#include "storage/qos.h"
#include "check.h"

static struct stk_msg_qos_rec recs[STK_QOS_MAX];

/* n tenants "team-0".."team-(n-1)" with a write limit, plus "@checkpoint" if cls. */
static uint32_t policy(uint32_t n, int cls, const char *prefix)
{
	uint32_t k = 0;

	memset(recs, 0, sizeof(recs));
	for (uint32_t i = 0; i < n && k < STK_QOS_MAX; i++, k++) {
		snprintf(recs[k].tenant, sizeof(recs[k].tenant), "%s-%u", prefix, i);
		recs[k].write_bw = 1ull << 40; /* never waits in these tests */
		recs[k].max_class = (uint8_t)STK_QOS_CLASS_ANY;
	}
	if (cls && k < STK_QOS_MAX) {
		stk_strlcpy(recs[k].tenant, "@checkpoint", sizeof(recs[k].tenant));
		recs[k].write_bw = 1ull << 40;
		recs[k++].max_class = (uint8_t)STK_QOS_CLASS_ANY;
	}
	return k;
}

static void test_lookup(void)
{
	char name[64];

	CHECK_EQ(stk_qos_limited("team-1", 0), 0); /* no policy: nobody */
	CHECK_RC(stk_qos_policy_set(recs, policy(3, 0, "team")), 0);
	CHECK_EQ(stk_qos_limited("team-0", 0), 1);
	CHECK_EQ(stk_qos_limited("team-2", 2), 1);
	CHECK_EQ(stk_qos_limited("team-3", 0), 0);
	CHECK_EQ(stk_qos_limited("team-", 0), 0);
	CHECK_EQ(stk_qos_limited("team-00", 0), 0);
	CHECK_EQ(stk_qos_limited("", 0), 0);
	CHECK_EQ(stk_qos_limited(NULL, 0), 0); /* the cluster key: never limited */
	/* a class's own record limits every tenant's requests of that class */
	CHECK_EQ(stk_qos_limited("other", 2), 0);
	CHECK_RC(stk_qos_policy_set(recs, policy(3, 1, "team")), 0);
	CHECK_EQ(stk_qos_limited("other", 2), 1);
	CHECK_EQ(stk_qos_limited("other", 0), 0);
	CHECK_EQ(stk_qos_limited("other", 1), 0);
	CHECK_EQ(stk_qos_limited("other", 3), 0); /* no such class */
	CHECK_EQ(stk_qos_limited("@checkpoint", 0), 1);
	/* the whole table: every name found, none other */
	CHECK_RC(stk_qos_policy_set(recs, policy(STK_QOS_MAX, 0, "t")), 0);
	for (uint32_t i = 0; i < STK_QOS_MAX; i++) {
		snprintf(name, sizeof(name), "t-%u", i);
		CHECK_EQ(stk_qos_limited(name, 0), 1);
		snprintf(name, sizeof(name), "u-%u", i);
		CHECK_EQ(stk_qos_limited(name, 0), 0);
	}
	/* a name of the longest kind, and one that differs only in its last byte */
	memset(name, 'x', 63);
	name[63] = 0;
	memset(recs, 0, sizeof(recs));
	stk_strlcpy(recs[0].tenant, name, sizeof(recs[0].tenant));
	recs[0].iops = 1u << 30;
	recs[0].max_class = (uint8_t)STK_QOS_CLASS_ANY;
	CHECK_RC(stk_qos_policy_set(recs, 1), 0);
	CHECK_EQ(stk_qos_limited(name, 0), 1);
	name[62] = 'y';
	CHECK_EQ(stk_qos_limited(name, 0), 0);
	CHECK_EQ(stk_qos_charge(name, 0, 0, 4096), 0u); /* not limited: no wait */
	name[62] = 'x';
	CHECK_EQ(stk_qos_charge(name, 0, 0, 4096), 0u); /* limited, within its rate */
	CHECK_RC(stk_qos_policy_set(recs, STK_QOS_MAX + 1), -EINVAL);
	CHECK_EQ(stk_qos_limited(name, 0), 1); /* a refused policy changes nothing */
	CHECK_RC(stk_qos_policy_set(NULL, 0), 0);
	CHECK_EQ(stk_qos_limited(name, 0), 0);
}

/*
 * Readers against a writer that swaps between policy A (the "both-*" tenants and
 * "a-*") and policy B ("both-*", "b-*" and the checkpoint class) as fast as it
 * can: a "both-*" name is limited whichever policy a lookup meets, a "c-*" name
 * never; a torn table would break one or the other. Every lookup ends.
 */
static volatile int stop_swaps;
static unsigned long bad_answers, lookups;

static void *reader(void *arg)
{
	unsigned long bad = 0, n = 0;
	char both[16], c[16];

	(void)arg;
	for (unsigned i = 0; !stop_swaps; i++, n += 3) {
		snprintf(both, sizeof(both), "both-%u", i % 16);
		snprintf(c, sizeof(c), "c-%u", i % 16);
		bad += stk_qos_limited(both, 0) != 1;
		bad += stk_qos_limited(c, 0) != 0;
		bad += stk_qos_limited(both, 2) != 1; /* limited as a tenant, whatever the class */
	}
	__atomic_add_fetch(&bad_answers, bad, __ATOMIC_RELAXED);
	__atomic_add_fetch(&lookups, n, __ATOMIC_RELAXED);
	return NULL;
}

static uint32_t two_kinds(struct stk_msg_qos_rec *out, const char *kind, int cls)
{
	uint32_t n = policy(16, 0, "both");

	memcpy(out, recs, n * sizeof(recs[0]));
	n += policy(16, cls, kind);
	memcpy(out + 16, recs, (n - 16) * sizeof(recs[0]));
	return n;
}

static void test_swaps(void)
{
	static struct stk_msg_qos_rec pa[STK_QOS_MAX], pb[STK_QOS_MAX];
	pthread_t th[2];
	uint32_t na = two_kinds(pa, "a", 0), nb = two_kinds(pb, "b", 1);

	CHECK_EQ(na, 32u);
	CHECK_EQ(nb, 33u);
	CHECK_RC(stk_qos_policy_set(pa, na), 0);
	stop_swaps = 0;
	for (int i = 0; i < 2; i++)
		if (pthread_create(&th[i], NULL, reader, NULL)) {
			perror("pthread_create");
			exit(1);
		}
	for (int i = 0; i < 20000; i++)
		CHECK_RC(stk_qos_policy_set(i % 2 ? pa : pb, i % 2 ? na : nb), 0);
	stop_swaps = 1;
	for (int i = 0; i < 2; i++)
		pthread_join(th[i], NULL);
	CHECK_EQ(bad_answers, 0ul);
	CHECK(lookups > 0);
	CHECK_RC(stk_qos_policy_set(NULL, 0), 0);
}

/* ---- --bench ---- */

struct bench_arg {
	const char *name;
	uint64_t until_ns, n;
};

static void *bench_thread(void *p)
{
	struct bench_arg *a = p;
	uint64_t n = 0;
	int hit = 0;

	while (stk_now_ns() < a->until_ns) {
		for (int i = 0; i < 1000; i++)
			hit += stk_qos_limited(a->name, 0);
		n += 1000;
	}
	a->n = n + (uint64_t)(hit < 0);
	return NULL;
}

static int bench(double seconds)
{
	const char *names[2] = {"t-63", "nobody"};

	stk_qos_policy_set(recs, policy(STK_QOS_MAX, 0, "t"));
	for (int threads = 1; threads <= 2; threads++)
		for (int k = 0; k < 2; k++) {
			struct bench_arg a[2];
			pthread_t th[2];
			uint64_t t0 = stk_now_ns(), total = 0;

			for (int i = 0; i < threads; i++) {
				a[i].name = names[k];
				a[i].until_ns = t0 + (uint64_t)(seconds * 1e9);
				pthread_create(&th[i], NULL, bench_thread, &a[i]);
			}
			for (int i = 0; i < threads; i++) {
				pthread_join(th[i], NULL);
				total += a[i].n;
			}
			/* per lookup, as each thread sees it */
			printf("threads=%d name=%s ns_per_lookup=%.1f\n", threads,
			       k ? "unlimited" : "limited",
			       (double)(stk_now_ns() - t0) * threads / (double)total);
		}
	return 0;
}

int main(int argc, char **argv)
{
	if (argc >= 2 && strcmp(argv[1], "--bench") == 0)
		return bench(argc >= 3 ? strtod(argv[2], NULL) : 1.0);
	CHECK_RUN(test_lookup);
	CHECK_RUN(test_swaps);
	return check_done();
}
