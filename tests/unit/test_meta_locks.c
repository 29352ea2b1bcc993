/*
 * Unit test of meta's lock table (src/meta/locks.h): POSIX record locks split
 * and merged as POSIX says, conflicts between holders (read/read shares,
 * anything with a write conflicts, a holder never conflicts with itself),
 * flock locks independent of POSIX ones, ranges to the end of file, bad
 * requests, and dropping a session's locks. Also the store's orphan records
 * (src/meta/store.h): a file unlinked while the open hook says it is open keeps
 * its inode with nlink 0, is listed as an orphan across a reopen, and goes with
 * stk_meta_store_orphan_drop. And the sessions' open references
 * (src/meta/session.h): an unlinked file still held by one client opens again
 * for that client only, and for no one once closed.
 *
 * Exit status: 0 pass, 1 fail, 77 skip (no temporary folder).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "meta/locks.h"
#include "meta/session.h"
#include "meta/store.h"
#include "check.h"

#define INO 42

static struct stk_lock L(uint64_t session, uint64_t owner, int type, uint64_t start, uint64_t end)
{
	struct stk_lock l;

	memset(&l, 0, sizeof(l));
	l.session = session;
	l.owner = owner;
	l.kind = STK_LOCK_POSIX;
	l.type = (uint8_t)type;
	l.start = start;
	l.end = end;
	l.pid = (uint32_t)(session * 100 + owner);
	return l;
}

static struct stk_lock F(uint64_t session, uint64_t owner, int type)
{
	struct stk_lock l = L(session, owner, type, 0, STK_LOCK_EOF);

	l.kind = STK_LOCK_FLOCK;
	return l;
}

static int set(struct stk_lock_table *t, struct stk_lock l)
{
	return stk_locktab_set(t, INO, &l, NULL);
}

/* 1 if another holder could take l now. */
static int free_for(struct stk_lock_table *t, struct stk_lock l)
{
	struct stk_lock c;

	return stk_locktab_test(t, INO, &l, &c) == 0;
}

/* The held locks of ino in order of start must be exactly the n (type, start, end) triples. */
static void expect(struct stk_lock_table *t, uint64_t session, size_t n, const uint64_t *tse,
		   int line)
{
	struct stk_lock got[16];
	size_t total = stk_locktab_list(t, INO, got, 16), k = 0;

	for (size_t i = 0; i < total && i < 16; i++) {
		if (got[i].session != session)
			continue;
		int found = 0;
		for (size_t j = 0; j < n; j++)
			if (got[i].type == tse[3 * j] && got[i].start == tse[3 * j + 1] &&
			    got[i].end == tse[3 * j + 2])
				found = 1;
		if (!found) {
			check_fail_at(__FILE__, line, "unexpected lock type %u %llu..%llu",
				      got[i].type, (unsigned long long)got[i].start,
				      (unsigned long long)got[i].end);
		}
		k++;
	}
	if (k != n) {
		check_fail_at(__FILE__, line, "%zu locks of session %llu, want %zu", k,
			      (unsigned long long)session, n);
	}
}

#define EXPECT(t, s, ...)                                                                          \
	do {                                                                                       \
		static const uint64_t tse_[] = {__VA_ARGS__};                                      \
		expect(t, s, sizeof(tse_) / sizeof(tse_[0]) / 3, tse_, __LINE__);                  \
	} while (0)
#define EXPECT_NONE(t, s) expect(t, s, 0, NULL, __LINE__)

static void test_split_merge(void)
{
	struct stk_lock_table *t;

	CHECK_RC(stk_locktab_create(&t), 0);
	/* Adjacent and overlapping locks of one type merge. */
	CHECK_RC(set(t, L(1, 1, STK_LOCK_WR, 0, 9)), 0);
	CHECK_RC(set(t, L(1, 1, STK_LOCK_WR, 10, 19)), 0);
	CHECK_RC(set(t, L(1, 1, STK_LOCK_WR, 15, 29)), 0);
	EXPECT(t, 1, STK_LOCK_WR, 0, 29);
	/* An unlock in the middle splits. */
	CHECK_RC(set(t, L(1, 1, STK_LOCK_UN, 10, 14)), 0);
	EXPECT(t, 1, STK_LOCK_WR, 0, 9, STK_LOCK_WR, 15, 29);
	/* A read lock over part of a write lock converts that part only. */
	CHECK_RC(set(t, L(1, 1, STK_LOCK_RD, 5, 20)), 0);
	EXPECT(t, 1, STK_LOCK_WR, 0, 4, STK_LOCK_RD, 5, 20, STK_LOCK_WR, 21, 29);
	/* Filling the gap with write merges all write parts it touches, not the read one. */
	CHECK_RC(set(t, L(1, 1, STK_LOCK_WR, 5, 20)), 0);
	EXPECT(t, 1, STK_LOCK_WR, 0, 29);
	/* A lock to the end of file, then an unlock from the middle to the end. */
	CHECK_RC(set(t, L(1, 1, STK_LOCK_WR, 100, STK_LOCK_EOF)), 0);
	EXPECT(t, 1, STK_LOCK_WR, 0, 29, STK_LOCK_WR, 100, STK_LOCK_EOF);
	CHECK_RC(set(t, L(1, 1, STK_LOCK_UN, 200, STK_LOCK_EOF)), 0);
	EXPECT(t, 1, STK_LOCK_WR, 0, 29, STK_LOCK_WR, 100, 199);
	/* Ranges touching at 0 and at the end of file do not overflow. */
	CHECK_RC(set(t, L(1, 1, STK_LOCK_UN, 0, STK_LOCK_EOF)), 0);
	EXPECT_NONE(t, 1);
	CHECK(stk_locktab_list(t, INO, NULL, 0) == 0);
	CHECK_RC(set(t, L(1, 1, STK_LOCK_RD, STK_LOCK_EOF, STK_LOCK_EOF)), 0);
	CHECK_RC(set(t, L(1, 1, STK_LOCK_RD, 0, 0)), 0);
	EXPECT(t, 1, STK_LOCK_RD, 0, 0, STK_LOCK_RD, STK_LOCK_EOF, STK_LOCK_EOF);
	/* Unlocking what is not locked is fine, on an inode without locks too. */
	CHECK_RC(stk_locktab_set(t, 7, &(struct stk_lock){.session = 1, .type = STK_LOCK_UN,
							  .end = 5}, NULL),
		 0);
	stk_locktab_destroy(t);
}

static void test_conflicts(void)
{
	struct stk_lock_table *t;
	struct stk_lock c;

	CHECK_RC(stk_locktab_create(&t), 0);
	CHECK_RC(set(t, L(1, 1, STK_LOCK_WR, 100, 109)), 0);
	/* Another owner of the same session is another holder, as another session is. */
	CHECK(!free_for(t, L(1, 2, STK_LOCK_RD, 105, 105)));
	CHECK(!free_for(t, L(2, 1, STK_LOCK_WR, 0, STK_LOCK_EOF)));
	CHECK(free_for(t, L(2, 1, STK_LOCK_WR, 0, 99)));
	CHECK(free_for(t, L(2, 1, STK_LOCK_WR, 110, 200)));
	CHECK(free_for(t, L(1, 1, STK_LOCK_WR, 100, 109))); /* itself */
	memset(&c, 0, sizeof(c));
	CHECK_RC(stk_locktab_set(t, INO, &(struct stk_lock){.session = 2, .owner = 1,
							  .type = STK_LOCK_RD, .start = 109,
							  .end = 120},
				 &c),
		 -EAGAIN);
	CHECK(c.session == 1 && c.start == 100 && c.end == 109 && c.type == STK_LOCK_WR &&
	      c.pid == 101);
	/* Nothing changed on a refusal. */
	EXPECT_NONE(t, 2);
	/* Readers share; a writer waits for every reader. */
	CHECK_RC(set(t, L(1, 1, STK_LOCK_UN, 0, STK_LOCK_EOF)), 0);
	CHECK_RC(set(t, L(1, 1, STK_LOCK_RD, 0, 49)), 0);
	CHECK_RC(set(t, L(2, 1, STK_LOCK_RD, 40, 99)), 0);
	CHECK_RC(set(t, L(3, 1, STK_LOCK_WR, 45, 45)), -EAGAIN);
	CHECK_RC(set(t, L(1, 1, STK_LOCK_UN, 0, 49)), 0);
	CHECK_RC(set(t, L(3, 1, STK_LOCK_WR, 45, 45)), -EAGAIN);
	CHECK_RC(set(t, L(3, 1, STK_LOCK_WR, 0, 39)), 0);
	/* Upgrading a shared lock is refused while another reader holds it. */
	CHECK_RC(set(t, L(2, 1, STK_LOCK_WR, 40, 99)), 0);
	CHECK_RC(set(t, L(3, 1, STK_LOCK_RD, 99, 99)), -EAGAIN);
	/* Dropping a session frees its locks everywhere. */
	CHECK(stk_locktab_drop_session(t, 2) == 1);
	CHECK_RC(set(t, L(3, 1, STK_LOCK_RD, 99, 99)), 0);
	CHECK(stk_locktab_drop_session(t, 3) == 2);
	CHECK(stk_locktab_list(t, INO, NULL, 0) == 0);
	stk_locktab_destroy(t);
}

static void test_flock(void)
{
	struct stk_lock_table *t;

	CHECK_RC(stk_locktab_create(&t), 0);
	CHECK_RC(set(t, F(1, 1, STK_LOCK_RD)), 0);
	CHECK_RC(set(t, F(2, 1, STK_LOCK_RD)), 0);
	CHECK_RC(set(t, F(2, 2, STK_LOCK_WR)), -EAGAIN);
	/* POSIX locks do not see flock locks. */
	CHECK_RC(set(t, L(2, 2, STK_LOCK_WR, 0, STK_LOCK_EOF)), 0);
	/* Conversion: the only other reader gone, a shared lock becomes exclusive. */
	CHECK_RC(set(t, F(2, 1, STK_LOCK_UN)), 0);
	CHECK_RC(set(t, F(1, 1, STK_LOCK_WR)), 0);
	CHECK(stk_locktab_list(t, INO, NULL, 0) == 2);
	CHECK_RC(set(t, F(2, 1, STK_LOCK_RD)), -EAGAIN);
	stk_locktab_destroy(t);
}

static void test_bad_requests(void)
{
	struct stk_lock_table *t;
	struct stk_lock l = L(1, 1, STK_LOCK_WR, 10, 9);

	CHECK_RC(stk_locktab_create(&t), 0);
	CHECK_RC(stk_locktab_set(t, INO, &l, NULL), -EINVAL);
	l = L(1, 1, 0, 0, 9);
	CHECK_RC(stk_locktab_set(t, INO, &l, NULL), -EINVAL);
	l = L(1, 1, STK_LOCK_WR, 0, 9);
	l.kind = 9;
	CHECK_RC(stk_locktab_set(t, INO, &l, NULL), -EINVAL);
	CHECK(stk_locktab_list(t, INO, NULL, 0) == 0);
	stk_locktab_destroy(t);
}

/* ---- orphans in the store ---- */

static char tmpdir[64];
static uint64_t open_ino;

static int is_open(void *ctx, uint64_t ino)
{
	(void)ctx;
	return ino == open_ino;
}

static int store_open(struct stk_meta_store **st)
{
	struct stk_meta_store_opts o = {.size = sizeof(o), .dir = tmpdir, .map_size = 64ull << 20};

	return stk_meta_store_open(&o, st);
}

static void test_orphans(void)
{
	static const struct stk_cred root = {0};
	static const struct stk_meta_placement pl = {.chunk_size = 1u << 20, .stripe = 1,
						     .nchains = 1};
	static const struct stk_layout zero = {0};
	struct stk_meta_store *st = NULL;
	struct stk_attr a, b, after;
	uint64_t inos[8];
	size_t n = 9;
	int created, replaced;

	if (store_open(&st)) {
		CHECK_FAIL("cannot open a store in %s", tmpdir);
		return;
	}
	stk_meta_store_set_open_hook(st, is_open, NULL);
	CHECK_RC(stk_meta_store_create(st, &root, 1, "a", 0644, 0, &zero, &pl, &a, &created), 0);
	CHECK_RC(stk_meta_store_create(st, &root, 1, "b", 0644, 0, &zero, &pl, &b, &created), 0);
	/* Not open: gone at once. */
	CHECK_RC(stk_meta_store_unlink(st, &root, 1, "b", &after), 0);
	CHECK(after.nlink == 0);
	CHECK_RC(stk_meta_store_getattr(st, &root, b.ino, &after), -ENOENT);
	/* Open: kept with nlink 0, its attributes still served and extended. */
	open_ino = a.ino;
	CHECK_RC(stk_meta_store_unlink(st, &root, 1, "a", &after), 0);
	CHECK_RC(stk_meta_store_lookup(st, &root, 1, "a", &after), -ENOENT);
	CHECK_RC(stk_meta_store_getattr(st, &root, a.ino, &after), 0);
	CHECK(after.nlink == 0);
	CHECK_RC(stk_meta_store_extend(st, &root, a.ino, 5000, 0, 0, &after), 0);
	CHECK(after.size == 5000);
	/* Renamed over while open: the same. */
	CHECK_RC(stk_meta_store_create(st, &root, 1, "c", 0644, 0, &zero, &pl, &b, &created), 0);
	CHECK_RC(stk_meta_store_create(st, &root, 1, "d", 0644, 0, &zero, &pl, &a, &created), 0);
	open_ino = b.ino;
	CHECK_RC(stk_meta_store_rename(st, &root, 1, "d", 1, "c", 0, &replaced, &after), 0);
	CHECK(replaced && after.ino == b.ino && after.nlink == 0);
	CHECK_RC(stk_meta_store_orphans(st, inos, 8, &n), 0);
	CHECK(n == 2);
	/* They survive a reopen. */
	stk_meta_store_close(st);
	st = NULL;
	CHECK_RC(store_open(&st), 0);
	if (!st)
		return;
	n = 9;
	CHECK_RC(stk_meta_store_orphans(st, inos, 8, &n), 0);
	CHECK(n == 2 && inos[1] == b.ino);
	CHECK_RC(stk_meta_store_getattr(st, &root, b.ino, &after), 0);
	/* Dropping one removes its inode; dropping it again is ENOENT. */
	CHECK_RC(stk_meta_store_orphan_drop(st, b.ino), 0);
	CHECK_RC(stk_meta_store_getattr(st, &root, b.ino, &after), -ENOENT);
	CHECK_RC(stk_meta_store_orphan_drop(st, b.ino), -ENOENT);
	/* An orphan given a name again by a hard link keeps its inode when dropped. */
	CHECK_RC(stk_meta_store_link(st, &root, inos[0], 1, "back", &after), 0);
	CHECK(after.nlink == 1);
	CHECK_RC(stk_meta_store_orphan_drop(st, inos[0]), 0);
	CHECK_RC(stk_meta_store_lookup(st, &root, 1, "back", &after), 0);
	n = 9;
	CHECK_RC(stk_meta_store_orphans(st, inos, 8, &n), 0);
	CHECK(n == 0);
	stk_meta_store_close(st);
}

/*
 * Two clients: one holds a file open, the other unlinks it. The name is gone for
 * both; the holder may open the inode again (a reopen through /proc/self/fd),
 * the other may not, though it still holds the inode number (a mount that
 * caches the name). After the holder's close, no one may.
 */
static void test_sessions_orphan_open(void)
{
	static const struct stk_cred root = {0};
	static const struct stk_meta_placement pl = {.chunk_size = 1u << 20, .stripe = 1,
						     .nchains = 1};
	static const struct stk_layout zero = {0};
	struct stk_meta_store *st = NULL;
	struct stk_meta_sessions *ss = NULL;
	struct stk_attr a, after;
	int created, known;

	if (store_open(&st)) {
		CHECK_FAIL("cannot open a store in %s", tmpdir);
		return;
	}
	CHECK_RC(stk_meta_sessions_create(st, 60000, &ss), 0);
	if (!ss) {
		stk_meta_store_close(st);
		return;
	}
	CHECK_RC(stk_meta_sessions_renew(ss, 7, &known), 0);
	CHECK_RC(stk_meta_sessions_renew(ss, 8, &known), 0);
	CHECK_RC(stk_meta_store_create(st, &root, 1, "held", 0644, 0, &zero, &pl, &a, &created),
		 0);
	CHECK_RC(stk_meta_sessions_open(ss, 7, a.ino, 1, 0, NULL), 0);
	CHECK_RC(stk_meta_sessions_open(ss, 8, a.ino, 1, 0, NULL), 0);
	CHECK_RC(stk_meta_sessions_close(ss, 8, a.ino, 1), 0);
	CHECK_RC(stk_meta_store_unlink(st, &root, 1, "held", &after), 0);
	CHECK(after.nlink == 0);
	CHECK_RC(stk_meta_sessions_open(ss, 8, a.ino, 1, 0, NULL), -ENOENT);
	CHECK_RC(stk_meta_sessions_open(ss, 9, a.ino, 1, 0, NULL), -ENOENT);
	CHECK_RC(stk_meta_sessions_open(ss, 7, a.ino, 1, 0, &after), 0);
	CHECK(after.ino == a.ino && after.nlink == 0);
	/* Registering again after a meta restart (set) is allowed to anyone it names. */
	CHECK_RC(stk_meta_sessions_open(ss, 8, a.ino, 1, 1, NULL), 0);
	CHECK_RC(stk_meta_sessions_close(ss, 8, a.ino, 1), 0);
	CHECK_RC(stk_meta_sessions_close(ss, 7, a.ino, 2), 0);
	/* After the last close no one opens it again (the reaper takes it). */
	CHECK_RC(stk_meta_sessions_open(ss, 7, a.ino, 1, 0, NULL), -ENOENT);
	stk_meta_sessions_destroy(ss);
	stk_meta_store_close(st);
}

int main(void)
{
	int rc;

	CHECK_RUN(test_split_merge);
	CHECK_RUN(test_conflicts);
	CHECK_RUN(test_flock);
	CHECK_RUN(test_bad_requests);
	rc = check_tmpdir(tmpdir, sizeof(tmpdir), "meta-locks");
	if (rc) {
		/* skip the store's part; a failure before it still fails the test */
		fprintf(stderr, "no temporary folder: %s\n", strerror(-rc));
		return check_failures() ? check_done() : 77;
	}
	CHECK_RUN(test_orphans);
	check_rm_rf(tmpdir);
	CHECK_RC(check_tmpdir(tmpdir, sizeof(tmpdir), "meta-sessions"), 0);
	CHECK_RUN(test_sessions_orphan_open);
	check_rm_rf(tmpdir);
	return check_done();
}
