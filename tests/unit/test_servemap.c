/*
 * Unit test of serve maps (src/chunk/servemap.c): what a reader is told about the
 * node's state (serving, expired, chain and version, retired), the pending
 * buckets with overlapping changes and a change that begins and ends during a
 * read, refused files, the counts, and reader threads racing writer threads
 * through the same map a node and its clients share, where no read that the map
 * approves may see a change not yet committed or half of one.
 * Exit 0 pass, 1 fail, 77 skip.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "chunk/servemap.h"
#include "common/util.h"
#include "check.h"

static char g_dir[256];

/* One chain, for stk_serve_map_set. */
#define CH(id, ver) (&(struct stk_serve_chain){(id), (ver)})

/* REQUIRE for the void test functions CHECK_RUN takes: a failure ends the test. */
#define NEED(cond)                                                                                 \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			CHECK_FAIL("required check failed: %s", #cond);                            \
			return;                                                                    \
		}                                                                                  \
	} while (0)

static void test_state(void)
{
	struct stk_serve_map *w, *r;
	struct stk_serve_snap s;
	uint64_t now = stk_now_ns();

	NEED(stk_serve_map_create(g_dir, &w) == 0);
	NEED(stk_serve_map_open_reader(g_dir, 7, &r) == 0);
	CHECK_EQ(stk_serve_map_instance(r), stk_serve_map_instance(w));
	/* a new map serves nothing until the node says so */
	CHECK_RC(stk_serve_map_read_begin(r, 3, 5, 1, 0, &s), -EPERM);
	stk_serve_map_set(w, 7, CH(3, 5), 1, STK_SERVE_FOREVER);
	CHECK_RC(stk_serve_map_read_begin(r, 3, 5, 1, 0, &s), 0);
	CHECK_RC(stk_serve_map_read_end(r, &s), 0);
	CHECK_RC(stk_serve_map_read_begin(r, 3, 4, 1, 0, &s), -ESTALE);
	CHECK_RC(stk_serve_map_read_begin(r, 3, 6, 1, 0, &s), -ESTALE);
	CHECK_RC(stk_serve_map_read_begin(r, 2, 5, 1, 0, &s), -ESTALE);
	/* a target in two chains */
	struct stk_serve_chain two[2] = {{2, 9}, {3, 5}};
	stk_serve_map_set(w, 7, two, 2, STK_SERVE_FOREVER);
	CHECK_RC(stk_serve_map_read_begin(r, 3, 5, 1, 0, &s), 0);
	CHECK_RC(stk_serve_map_read_begin(r, 2, 9, 1, 0, &s), 0);
	CHECK_RC(stk_serve_map_read_begin(r, 2, 5, 1, 0, &s), -ESTALE);
	CHECK_RC(stk_serve_map_read_begin(r, 4, 5, 1, 0, &s), -ESTALE);
	/* another target than the routing table names */
	stk_serve_map_set(w, 8, CH(3, 5), 1, STK_SERVE_FOREVER);
	CHECK_RC(stk_serve_map_read_begin(r, 3, 5, 1, 0, &s), -EPERM);
	/* the fence deadline */
	stk_serve_map_set(w, 7, CH(3, 5), 1, now + 10000000000ull);
	CHECK_RC(stk_serve_map_read_begin(r, 3, 5, 1, 0, &s), 0);
	stk_serve_map_set(w, 7, CH(3, 5), 1, now - 1);
	CHECK_RC(stk_serve_map_read_begin(r, 3, 5, 1, 0, &s), -ETIMEDOUT);
	stk_serve_map_set(w, 7, CH(3, 5), 1, 0);
	CHECK_RC(stk_serve_map_read_begin(r, 3, 5, 1, 0, &s), -EPERM);
	/* a state change during a read drops it; setting the same state does not */
	stk_serve_map_set(w, 7, CH(3, 5), 1, STK_SERVE_FOREVER);
	CHECK_RC(stk_serve_map_read_begin(r, 3, 5, 1, 0, &s), 0);
	stk_serve_map_set(w, 7, CH(3, 5), 1, STK_SERVE_FOREVER);
	CHECK_RC(stk_serve_map_read_end(r, &s), 0);
	CHECK_RC(stk_serve_map_read_begin(r, 3, 5, 1, 0, &s), 0);
	stk_serve_map_set(w, 7, CH(3, 6), 1, STK_SERVE_FOREVER);
	CHECK_RC(stk_serve_map_read_end(r, &s), -EAGAIN);

	/* counts go to serve.count, which the node reads */
	uint64_t reads, bytes;
	stk_serve_map_count(r, 100);
	stk_serve_map_count(r, 28);
	stk_serve_map_counts(w, &reads, &bytes);
	CHECK_EQ(reads, 2);
	CHECK_EQ(bytes, 128);

	/* a node that stops retires its map: readers stop at once */
	stk_serve_map_close(w);
	CHECK_RC(stk_serve_map_read_begin(r, 3, 6, 1, 0, &s), -ENODEV);
	stk_serve_map_close(r);
}

static void test_pending(void)
{
	struct stk_serve_map *w, *r;
	struct stk_serve_snap s;

	NEED(stk_serve_map_create(g_dir, &w) == 0);
	NEED(stk_serve_map_open_reader(g_dir, 7, &r) == 0);
	stk_serve_map_set(w, 7, CH(1, 1), 1, STK_SERVE_FOREVER);
	/* overlapping changes of one chunk: pending until the last ends */
	stk_serve_map_pending_begin(w, 42, 3);
	stk_serve_map_pending_begin(w, 42, 3);
	CHECK_RC(stk_serve_map_read_begin(r, 1, 1, 42, 3, &s), -EINPROGRESS);
	stk_serve_map_pending_end(w, 42, 3);
	CHECK_RC(stk_serve_map_read_begin(r, 1, 1, 42, 3, &s), -EINPROGRESS);
	stk_serve_map_pending_end(w, 42, 3);
	CHECK_RC(stk_serve_map_read_begin(r, 1, 1, 42, 3, &s), 0);
	CHECK_RC(stk_serve_map_read_end(r, &s), 0);
	/* a change that begins during a read, and one that begins and ends in it */
	CHECK_RC(stk_serve_map_read_begin(r, 1, 1, 42, 3, &s), 0);
	stk_serve_map_pending_begin(w, 42, 3);
	CHECK_RC(stk_serve_map_read_end(r, &s), -EAGAIN);
	stk_serve_map_pending_end(w, 42, 3);
	CHECK_RC(stk_serve_map_read_begin(r, 1, 1, 42, 3, &s), 0);
	stk_serve_map_pending_begin(w, 42, 3);
	stk_serve_map_pending_end(w, 42, 3);
	CHECK_RC(stk_serve_map_read_end(r, &s), -EAGAIN);
	/* other chunks are not held up (most land in other buckets) */
	unsigned free_ = 0;
	stk_serve_map_pending_begin(w, 42, 3);
	for (uint32_t i = 100; i < 200; i++)
		free_ += stk_serve_map_read_begin(r, 1, 1, 42, i, &s) == 0;
	CHECK(free_ >= 95);
	stk_serve_map_pending_end(w, 42, 3);

	/* a new start of the node retires the map its readers hold */
	struct stk_serve_map *w2, *r2;
	NEED(stk_serve_map_create(g_dir, &w2) == 0);
	CHECK_RC(stk_serve_map_read_begin(r, 1, 1, 42, 3, &s), -ENODEV);
	NEED(stk_serve_map_open_reader(g_dir, 7, &r2) == 0);
	CHECK(stk_serve_map_instance(r2) != stk_serve_map_instance(r));
	CHECK_RC(stk_serve_map_read_begin(r2, 1, 1, 42, 3, &s), -EPERM);
	stk_serve_map_close(r2);
	stk_serve_map_close(r);
	stk_serve_map_close(w2);
	stk_serve_map_close(w);
}

static void test_refused(void)
{
	char dir[256], path[300];
	struct stk_serve_map *w, *r;
	int fd;

	NEED(check_tmpdir(dir, sizeof(dir), "servemap-bad") == 0);
	CHECK_RC(stk_serve_map_open_reader(dir, 1, &r), -ENOENT);
	NEED(stk_serve_map_create(dir, &w) == 0);
	snprintf(path, sizeof(path), "%s/serve.map", dir);
	fd = open(path, O_RDWR);
	NEED(fd >= 0);
	/* made by another boot: its clock times mean nothing here */
	CHECK(pwrite(fd, "not-this-boot", 13, 24) == 13);
	CHECK_RC(stk_serve_map_open_reader(dir, 1, &r), -ESTALE);
	CHECK(pwrite(fd, "XXXX", 4, 0) == 4);
	CHECK_RC(stk_serve_map_open_reader(dir, 1, &r), -EBADMSG);
	CHECK(pwrite(fd, "STKS", 4, 0) == 4 && ftruncate(fd, 1000) == 0);
	CHECK_RC(stk_serve_map_open_reader(dir, 1, &r), -EBADMSG);
	CHECK(ftruncate(fd, 64) == 0);
	CHECK_RC(stk_serve_map_open_reader(dir, 1, &r), -EBADMSG);
	close(fd);
	stk_serve_map_close(w);
}

/*
 * The race: chunks whose "file" is NCHUNK words that a writer changes in place,
 * word by word (worse than the node's rename of a new file), between its
 * pending_begin and pending_end, publishing the version as committed just before
 * the end (the tail's answer). Readers copy a chunk between read_begin and
 * read_end; an approved copy must be one version throughout, and one that was
 * committed: never newer than the committed version read after it.
 */
#define NCHUNKS 4
#define NWORDS 512

struct race {
	struct stk_serve_map *w, *r;
	uint64_t data[NCHUNKS][NWORDS];
	uint64_t committed[NCHUNKS];
	int stop;
	uint64_t approved, refused, bad;
};

struct race_wr {
	struct race *g;
	uint32_t id;
};

/* Writer id changes chunks id and id + 2: one change of a chunk at a time, as a node. */
static void *race_writer(void *arg)
{
	struct race_wr *a = arg;
	struct race *g = a->g;
	uint64_t v = 0;

	while (!__atomic_load_n(&g->stop, __ATOMIC_RELAXED)) {
		uint32_t c = a->id + 2 * (uint32_t)(v % 2);
		uint64_t nv = __atomic_load_n(&g->committed[c], __ATOMIC_RELAXED) + 1;

		/* chunks 0 and 1 stand for two chunks of one bucket: changes that overlap */
		stk_serve_map_pending_begin(g->w, c < 2 ? 9 : c, c < 2 ? 0 : c);
		for (unsigned i = 0; i < NWORDS; i++)
			__atomic_store_n(&g->data[c][i], nv, __ATOMIC_RELAXED);
		__atomic_store_n(&g->committed[c], nv, __ATOMIC_RELEASE);
		stk_serve_map_pending_end(g->w, c < 2 ? 9 : c, c < 2 ? 0 : c);
		v++;
	}
	return NULL;
}

static void *race_reader(void *arg)
{
	struct race *g = arg;
	uint64_t copy[NWORDS], n = 0;

	while (!__atomic_load_n(&g->stop, __ATOMIC_RELAXED)) {
		uint32_t c = (uint32_t)(n++ % NCHUNKS);
		struct stk_serve_snap s;
		uint64_t after;
		int ok = 1;

		if (stk_serve_map_read_begin(g->r, 1, 1, c < 2 ? 9 : c, c < 2 ? 0 : c, &s)) {
			__atomic_add_fetch(&g->refused, 1, __ATOMIC_RELAXED);
			continue;
		}
		for (unsigned i = 0; i < NWORDS; i++)
			copy[i] = __atomic_load_n(&g->data[c][i], __ATOMIC_RELAXED);
		if (stk_serve_map_read_end(g->r, &s)) {
			__atomic_add_fetch(&g->refused, 1, __ATOMIC_RELAXED);
			continue;
		}
		after = __atomic_load_n(&g->committed[c], __ATOMIC_ACQUIRE);
		for (unsigned i = 1; i < NWORDS; i++)
			ok &= copy[i] == copy[0];
		ok &= copy[0] <= after;
		__atomic_add_fetch(ok ? &g->approved : &g->bad, 1, __ATOMIC_RELAXED);
	}
	return NULL;
}

static void test_race(void)
{
	static struct race g;
	struct race_wr wa[2] = {{&g, 0}, {&g, 1}};
	pthread_t wt[2], rt[2];

	memset(&g, 0, sizeof(g));
	NEED(stk_serve_map_create(g_dir, &g.w) == 0);
	NEED(stk_serve_map_open_reader(g_dir, 3, &g.r) == 0);
	stk_serve_map_set(g.w, 3, CH(1, 1), 1, STK_SERVE_FOREVER);
	for (int i = 0; i < 2; i++) {
		NEED(pthread_create(&wt[i], NULL, race_writer, &wa[i]) == 0);
		NEED(pthread_create(&rt[i], NULL, race_reader, &g) == 0);
	}
	usleep(400000);
	__atomic_store_n(&g.stop, 1, __ATOMIC_RELAXED);
	for (int i = 0; i < 2; i++) {
		pthread_join(wt[i], NULL);
		pthread_join(rt[i], NULL);
	}
	printf("race: %llu approved, %llu refused, %llu bad\n", (unsigned long long)g.approved,
	       (unsigned long long)g.refused, (unsigned long long)g.bad);
	CHECK_EQ(g.bad, 0);
	CHECK(g.approved > 0);
	CHECK(g.refused > 0);
	stk_serve_map_close(g.r);
	stk_serve_map_close(g.w);
}

int main(void)
{
	if (check_tmpdir(g_dir, sizeof(g_dir), "servemap"))
		return 1;
	CHECK_RUN(test_state);
	CHECK_RUN(test_pending);
	CHECK_RUN(test_refused);
	CHECK_RUN(test_race);
	return check_done();
}
