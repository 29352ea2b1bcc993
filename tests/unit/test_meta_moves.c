/*
 * Meta's log of moves (src/meta/moves.h, docs/security.md "How long one is good
 * for"): the epoch each rename gets, what the reply to a storage node's META_EPOCH
 * lists since the epoch it knows, and what it says was lost when the ring drops
 * moves or a reply cannot hold them all.
 */
#include <errno.h>
#include <stdlib.h>

#include "../../src/meta/moves.h"
#include "../../src/proto/msg.h"
#include "check.h"

struct reply {
	struct stk_msg_meta_epoch_resp e;
	struct stk_msg_meta_moves_resp r;
	struct stk_msg_moved_rec rec[STK_MOVED_MAX];
};

/* META_EPOCH's reply to since, decoded into *out; 0 or -EBADMSG. */
static int ask(struct stk_meta_moves *mv, uint64_t since, struct reply *out)
{
	size_t cap = 64 + STK_MOVED_MAX * 16;
	uint8_t *buf = malloc(cap);
	struct stk_wbuf w;
	struct stk_rbuf r;
	int rc = -EBADMSG;

	if (!buf)
		return -ENOMEM;
	stk_wbuf_init(&w, buf, cap);
	if (stk_meta_moves_enc(mv, since, &w))
		goto out;
	stk_rbuf_init(&r, buf, w.len);
	if (stk_msg_meta_epoch_resp_dec(&r, &out->e) || stk_msg_meta_moves_resp_dec(&r, &out->r) ||
	    out->r.n > STK_MOVED_MAX)
		goto out;
	for (uint32_t i = 0; i < out->r.n; i++)
		stk_msg_moved_rec_dec(&r, &out->rec[i]);
	rc = stk_rbuf_finish(&r) ? -EBADMSG : 0;
out:
	free(buf);
	return rc;
}

static int renames(void)
{
	struct stk_meta_moves *mv;
	static struct reply rp;
	uint64_t two[2] = {7, 8}, one = 5, at;

	REQUIRE(stk_meta_moves_create(1000, &mv) == 0);
	CHECK_EQ(stk_meta_moves_epoch(mv), 1000);
	REQUIRE(ask(mv, 0, &rp) == 0);
	CHECK_EQ(rp.e.epoch, 1000);
	CHECK_EQ(rp.r.base, 1000);
	CHECK_EQ(rp.r.wide, 1000);
	CHECK_EQ(rp.r.lost, 1000);
	CHECK_EQ(rp.r.n, 0);

	at = stk_meta_moves_rename(mv, 0, &one, 1); /* a file */
	CHECK_EQ(at, 1001);
	CHECK_EQ(stk_meta_moves_rename(mv, 0, two, 2), 1002);  /* an exchange */
	CHECK_EQ(stk_meta_moves_rename(mv, 1, NULL, 0), 1003); /* a folder */
	CHECK_EQ(stk_meta_moves_epoch(mv), 1003);
	REQUIRE(ask(mv, 0, &rp) == 0);
	CHECK_EQ(rp.e.epoch, 1003);
	CHECK_EQ(rp.r.wide, 1003);
	CHECK_EQ(rp.r.lost, 1000);
	REQUIRE(rp.r.n == 3);
	CHECK_EQ(rp.rec[0].ino, 5);
	CHECK_EQ(rp.rec[0].at, 1001);
	CHECK_EQ(rp.rec[1].ino, 7);
	CHECK_EQ(rp.rec[2].ino, 8);
	CHECK_EQ(rp.rec[2].at, 1002);
	/* only what came after since */
	REQUIRE(ask(mv, 1001, &rp) == 0);
	CHECK_EQ(rp.r.n, 2);
	REQUIRE(ask(mv, 1003, &rp) == 0);
	CHECK_EQ(rp.r.n, 0);

	/* a new leader, or a start: all forgotten, a new base */
	stk_meta_moves_restart(mv, 5000);
	REQUIRE(ask(mv, 1003, &rp) == 0);
	CHECK_EQ(rp.e.epoch, 5000);
	CHECK_EQ(rp.r.base, 5000);
	CHECK_EQ(rp.r.wide, 5000);
	CHECK_EQ(rp.r.n, 0);
	stk_meta_moves_destroy(mv);
	stk_meta_moves_destroy(NULL);
	return 0;
}

static int lost(void)
{
	struct stk_meta_moves *mv;
	static struct reply rp;

	REQUIRE(stk_meta_moves_create(0, &mv) == 0);
	/* more than a reply holds: the oldest not listed are lost */
	for (uint64_t i = 1; i <= STK_MOVED_MAX + 10; i++)
		stk_meta_moves_rename(mv, 0, &i, 1);
	REQUIRE(ask(mv, 0, &rp) == 0);
	CHECK_EQ(rp.r.n, STK_MOVED_MAX);
	CHECK_EQ(rp.r.lost, 10);
	CHECK_EQ(rp.rec[0].ino, 11);
	CHECK_EQ(rp.rec[STK_MOVED_MAX - 1].at, STK_MOVED_MAX + 10);
	/* asked from where the last reply ended: none lost */
	REQUIRE(ask(mv, 10, &rp) == 0);
	CHECK_EQ(rp.r.n, STK_MOVED_MAX);
	CHECK_EQ(rp.r.lost, 0);
	/* past the ring: what it dropped is lost to everyone */
	for (uint64_t i = STK_MOVED_MAX + 11; i <= STK_META_MOVES_LOG + 5; i++)
		stk_meta_moves_rename(mv, 0, &i, 1);
	REQUIRE(ask(mv, STK_META_MOVES_LOG, &rp) == 0);
	CHECK_EQ(rp.r.n, 5);
	CHECK_EQ(rp.r.lost, 5);
	CHECK_EQ(rp.rec[0].ino, STK_META_MOVES_LOG + 1);
	stk_meta_moves_destroy(mv);
	return 0;
}

static void test_renames(void)
{
	(void)renames();
}

static void test_lost(void)
{
	(void)lost();
}

int main(void)
{
	CHECK_RUN(test_renames);
	CHECK_RUN(test_lost);
	return check_done();
}
