/*
 * Unit test of the store's replication (src/meta/store.h, "Replication"): a
 * leader's redo records, applied by a follower, make the follower's tables
 * byte for byte the leader's, for every table (inodes, entries, links, xattrs,
 * quotas, sys with orphans and the inode counter); a batch's failed child
 * leaves nothing in the record; a snapshot taken while the leader keeps
 * changing, plus the log from the position noted before it, is exact; a
 * follower refuses any other write; gaps, repeats and malformed logs.
 *
 * Exit status: 0 pass, 1 fail, 77 skip (no temporary folder).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "meta/store.h"
#include "proto/codec.h"
#include "check.h"

static char tmpdir[64];
static const struct stk_cred ROOT = {.uid = 0, .gid = 0};
static const struct stk_meta_placement PL4 = {.chunk_size = 1u << 20, .stripe = 4, .nchains = 4};

/* The leader's log, as the redo hook builds it (the format stk_meta_store_apply reads). */
static struct {
	uint8_t *buf;
	size_t len, cap;
	uint64_t last_seq;
	int out_of_order;
} lg;

static void hook(void *ctx, uint64_t epoch, uint64_t seq, const uint8_t *ops, size_t len)
{
	struct stk_wbuf w;
	size_t need = 20 + len;

	(void)ctx;
	if (seq != lg.last_seq + 1)
		lg.out_of_order = 1;
	lg.last_seq = seq;
	if (lg.len + need > lg.cap) {
		lg.cap = (lg.len + need) * 2;
		lg.buf = realloc(lg.buf, lg.cap);
	}
	stk_wbuf_init(&w, lg.buf + lg.len, need);
	stk_put_u64(&w, epoch);
	stk_put_u64(&w, seq);
	stk_put_u32(&w, (uint32_t)len);
	stk_put_bytes(&w, ops, len);
	lg.len += w.len;
}

static struct stk_meta_store *open_at(const char *name)
{
	struct stk_meta_store_opts o = {.size = sizeof(o)};
	struct stk_meta_store *st = NULL;
	char dir[128];

	snprintf(dir, sizeof(dir), "%s/%s", tmpdir, name);
	o.dir = dir;
	o.map_size = 64ull << 20;
	CHECK_RC(stk_meta_store_open(&o, &st), 0);
	return st;
}

/* Every record of every table, as one buffer (a whole snapshot). */
static uint8_t *dump(struct stk_meta_store *st, size_t *len)
{
	struct stk_meta_snap *s;
	size_t cap = 1 << 20, n = 0, part;
	uint8_t *buf = malloc(cap * 64);
	int done = 0;

	CHECK_RC(stk_meta_store_snap_begin(st, &s), 0);
	while (!done) {
		if (stk_meta_store_snap_next(s, buf + n, cap, &part, &done)) {
			CHECK_FAIL("snap_next failed");
			break;
		}
		n += part;
	}
	stk_meta_store_snap_end(s);
	*len = n;
	return buf;
}

static void check_same(struct stk_meta_store *a, struct stk_meta_store *b)
{
	size_t la, lb;
	uint8_t *da = dump(a, &la), *db = dump(b, &lb);

	CHECK(la > 0);
	CHECK_EQ(la, lb);
	CHECK(la == lb && memcmp(da, db, la) == 0);
	free(da);
	free(db);
}

/* Copies leader's store into follower by snapshot parts of `part` bytes. */
static void copy_snapshot(struct stk_meta_store *leader, struct stk_meta_store *f, size_t part,
			  void (*between)(void))
{
	struct stk_meta_snap *s;
	uint64_t epoch, seq;
	uint8_t *buf = malloc(part);
	size_t len;
	int done = 0, first = 1;

	stk_meta_store_repl_pos(leader, &epoch, &seq);
	CHECK_RC(stk_meta_store_snap_begin(leader, &s), 0);
	while (!done) {
		if (stk_meta_store_snap_next(s, buf, part, &len, &done)) {
			CHECK_FAIL("snap_next failed");
			break;
		}
		CHECK_RC(stk_meta_store_snap_apply(f, first, buf, len), 0);
		first = 0;
		if (!done) {
			struct stk_ns_id half;

			/* a half copy is no namespace: unfit to lead until it is whole */
			stk_meta_store_ns_id(f, &half);
			CHECK(stk_ns_id_is_zero(&half));
		}
		if (between)
			between();
	}
	stk_meta_store_snap_end(s);
	CHECK_RC(stk_meta_store_snap_done(f, epoch, seq), 0);
	free(buf);
}

static struct stk_meta_store *L;
static unsigned churn_n;

/* Changes on the leader between snapshot parts: the snapshot is not one moment's. */
static void churn(void)
{
	char name[32];
	struct stk_attr a;
	int created;

	snprintf(name, sizeof(name), "churn%u", churn_n++);
	stk_meta_store_create(L, &ROOT, STK_ROOT_INO, name, 0644, 0, NULL, &PL4, &a, &created);
	if (churn_n % 3 == 0) {
		snprintf(name, sizeof(name), "churn%u", churn_n - 2);
		stk_meta_store_unlink(L, &ROOT, STK_ROOT_INO, name, &a);
	}
}

static void workload(struct stk_meta_store *st)
{
	struct stk_attr a, d, f;
	int created;
	char name[32];

	CHECK_RC(stk_meta_store_mkdir(st, &ROOT, STK_ROOT_INO, "dir", 0755, &d), 0);
	for (int i = 0; i < 50; i++) {
		snprintf(name, sizeof(name), "f%d", i);
		CHECK_RC(stk_meta_store_create(st, &ROOT, d.ino, name, 0644, 0, NULL, &PL4, &f,
					       &created),
			 0);
	}
	CHECK_RC(stk_meta_store_symlink(st, &ROOT, d.ino, "ln", "target/of/link", &a), 0);
	CHECK_RC(stk_meta_store_setxattr(st, &ROOT, f.ino, "user.k", (const uint8_t *)"v", 1, 0),
		 0);
	CHECK_RC(stk_meta_store_setxattr(st, &ROOT, f.ino, "user.gone", (const uint8_t *)"x", 1, 0),
		 0);
	CHECK_RC(stk_meta_store_removexattr(st, &ROOT, f.ino, "user.gone"), 0);
	CHECK_RC(
	    stk_meta_store_rename(st, &ROOT, d.ino, "f1", STK_ROOT_INO, "moved", 0, &created, &a),
	    0);
	CHECK_RC(stk_meta_store_unlink(st, &ROOT, d.ino, "f2", &a), 0);
	CHECK_RC(stk_meta_store_link(st, &ROOT, f.ino, STK_ROOT_INO, "hard", &a), 0);
	CHECK_RC(stk_meta_store_quota_set(st, &ROOT, d.ino, 1 << 30, 1000, 0, NULL), 0);
	/* A batch whose middle child fails: that child's records must not be shipped. */
	CHECK_RC(stk_meta_store_batch_begin(st), 0);
	CHECK_RC(
	    stk_meta_store_create(st, &ROOT, d.ino, "inbatch", 0644, 0, NULL, &PL4, &a, &created),
	    0);
	CHECK_RC(stk_meta_store_create(st, &ROOT, d.ino, "inbatch", 0644, STK_CREATE_EXCL, NULL,
				       &PL4, &a, &created),
		 -EEXIST);
	CHECK_RC(stk_meta_store_batch_end(st, 0), 0);
}

static void test_log(void)
{
	struct stk_meta_store *F, *G;
	uint64_t e, s, seq_before;
	struct stk_attr a;
	size_t half;
	int created;

	L = open_at("leader");
	F = open_at("follower");
	G = open_at("late");
	if (!L || !F || !G)
		return;
	CHECK_RC(stk_meta_store_repl_set(L, STK_META_REPL_LEADER, 7, hook, NULL), 0);
	CHECK_RC(stk_meta_store_repl_set(F, STK_META_REPL_FOLLOWER, 0, NULL, NULL), 0);
	CHECK_RC(stk_meta_store_repl_set(G, STK_META_REPL_FOLLOWER, 0, NULL, NULL), 0);
	CHECK_RC(stk_meta_store_repl_set(L, 99, 7, hook, NULL), -EINVAL);

	/* A follower takes no write but what its leader sends. */
	CHECK_RC(stk_meta_store_mkdir(F, &ROOT, STK_ROOT_INO, "x", 0755, &a), -EROFS);

	/* F starts as a copy of L (another namespace identity before). */
	copy_snapshot(L, F, 1 << 20, NULL);
	workload(L);
	CHECK(!lg.out_of_order);
	stk_meta_store_repl_pos(L, &e, &s);
	CHECK_EQ(e, 7);
	CHECK_EQ(s, lg.last_seq);
	CHECK(s > 50);
	CHECK_EQ(stk_meta_store_thread_seq(1), s);
	CHECK_EQ(stk_meta_store_thread_seq(0), 0);

	/* Applied in two parts; the first part again is skipped; then the rest. */
	half = 0;
	{
		struct stk_rbuf r;

		stk_rbuf_init(&r, lg.buf, lg.len);
		for (int i = 0; i < 20; i++) {
			stk_get_u64(&r);
			stk_get_u64(&r);
			stk_rbuf_take(&r, stk_get_u32(&r));
		}
		half = r.off;
	}
	/* A gap is refused: the rest before the first part. */
	CHECK_RC(stk_meta_store_apply(F, lg.buf + half, lg.len - half, NULL, NULL), -ESTALE);
	CHECK_RC(stk_meta_store_apply(F, lg.buf, half, &e, &s), 0);
	CHECK_EQ(s, 20);
	CHECK_RC(stk_meta_store_apply(F, lg.buf, half, &e, &s), 0);
	CHECK_EQ(s, 20);
	CHECK_RC(stk_meta_store_apply(F, lg.buf, lg.len, &e, &s), 0);
	CHECK_EQ(s, lg.last_seq);
	CHECK_EQ(e, 7);
	check_same(L, F);
	{
		struct stk_ns_id a1, a2;

		stk_meta_store_ns_id(L, &a1);
		stk_meta_store_ns_id(F, &a2);
		CHECK(stk_ns_id_eq(&a1, &a2));
	}

	/* Malformed logs change nothing. */
	{
		uint8_t bad[40] = {0};
		struct stk_wbuf w;

		stk_wbuf_init(&w, bad, sizeof(bad));
		stk_put_u64(&w, 7);
		stk_put_u64(&w, s + 1);
		stk_put_u32(&w, 100); /* longer than what follows */
		CHECK_RC(stk_meta_store_apply(F, bad, w.len + 4, NULL, NULL), -EBADMSG);
		stk_wbuf_init(&w, bad, sizeof(bad));
		stk_put_u64(&w, 7);
		stk_put_u64(&w, s + 1);
		stk_put_u32(&w, 16);
		stk_put_u8(&w, 1);
		stk_put_u8(&w, 5);
		stk_put_bytes(&w, "nosuch", 5); /* a table F does not have */
		stk_put_u32(&w, 1);
		stk_put_u8(&w, 0);
		stk_put_u32(&w, 0);
		CHECK_RC(stk_meta_store_apply(F, bad, w.len, NULL, NULL), -EPROTO);
		stk_meta_store_repl_pos(F, NULL, &e);
		CHECK_EQ(e, s);
	}

	/* A late follower: a snapshot taken while L changes, then the log from before it. */
	seq_before = lg.last_seq;
	{
		size_t from = lg.len;
		struct stk_rbuf r;
		uint64_t pe, ps;

		stk_meta_store_repl_pos(L, &pe, &ps);
		CHECK_EQ(ps, seq_before);
		copy_snapshot(L, G, 4096, churn);
		CHECK(lg.last_seq > seq_before);
		stk_rbuf_init(&r, lg.buf + from, lg.len - from);
		CHECK_RC(stk_meta_store_apply(G, lg.buf + from, lg.len - from, &e, &s), 0);
		CHECK_EQ(s, lg.last_seq);
		(void)r;
	}
	check_same(L, G);
	/* And F, from where it was. */
	CHECK_RC(stk_meta_store_apply(F, lg.buf, lg.len, &e, &s), 0);
	check_same(L, F);

	/* A follower promoted: it numbers on from what it holds, in its own epoch. */
	CHECK_RC(stk_meta_store_repl_set(F, STK_META_REPL_LEADER, 8, NULL, NULL), 0);
	CHECK_RC(stk_meta_store_create(F, &ROOT, STK_ROOT_INO, "after", 0644, 0, NULL, &PL4, &a,
				       &created),
		 0);
	stk_meta_store_repl_pos(F, &e, &s);
	CHECK_EQ(e, 8);
	CHECK_EQ(s, lg.last_seq + 1);

	/* Reopened, a store knows its position. */
	stk_meta_store_close(F);
	F = open_at("follower");
	if (F) {
		stk_meta_store_repl_pos(F, &e, &s);
		CHECK_EQ(e, 8);
		CHECK_EQ(s, lg.last_seq + 1);
		stk_meta_store_close(F);
	}
	stk_meta_store_close(G);
	stk_meta_store_close(L);
}

int main(void)
{
	int rc = check_tmpdir(tmpdir, sizeof(tmpdir), "meta-repl");

	if (rc) {
		fprintf(stderr, "no temporary folder: %s\n", strerror(-rc));
		return 77;
	}
	CHECK_RUN(test_log);
	free(lg.buf);
	check_rm_rf(tmpdir);
	return check_done();
}
