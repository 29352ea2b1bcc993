/*
 * Vouchers (common/auth.h, client/vouch.h, docs/security.md "Vouchers"): a MAC
 * that checks only for the fields and the client it was made for, under the vouch
 * key it was made with; and the client's reading of the trailer meta appends to a
 * reply, against hostile trailers (short, a count out of range, random bytes), which
 * must be refused without reading past the reply.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "../../src/client/vouch.h"
#include "../../src/common/auth.h"
#include "../../src/common/util.h"
#include "../../src/proto/wire.h"
#include "check.h"

static const struct stk_auth_client alice = {
    .name = "alice", .gen = 1, .anon_uid = 65534, .anon_gid = 65534, .subtree = "/teamA"};

static int mac(void)
{
	uint8_t k1[STK_AUTH_KEY_MIN], k2[STK_AUTH_KEY_MIN], v1[STK_AUTH_MAC], v2[STK_AUTH_MAC];
	struct stk_auth_vouch v = {.ino = 42, .count = 1, .expires_ms = 1000, .epoch = 7}, w;
	struct stk_auth_client other = alice;

	memset(k1, 1, sizeof(k1));
	memset(k2, 2, sizeof(k2));
	REQUIRE(stk_auth_vouch_key(k1, sizeof(k1), v1) == 0);
	REQUIRE(stk_auth_vouch_key(k2, sizeof(k2), v2) == 0);
	CHECK(memcmp(v1, v2, sizeof(v1)) != 0);
	/* not the client key of any policy: that is HMAC(K, "stoker-client-1" ...) */
	{
		uint8_t ck[STK_AUTH_MAC];

		REQUIRE(stk_auth_client_key(k1, sizeof(k1), &alice, ck) == 0);
		CHECK(memcmp(ck, v1, sizeof(ck)) != 0);
	}
	REQUIRE(stk_auth_vouch_sign(v1, &alice, &v) == 0);
	CHECK(stk_auth_vouch_check(v1, &alice, &v) == 1);
	CHECK(stk_auth_vouch_check(v2, &alice, &v) == 0);
	/* every field counts */
	w = v, w.ino++;
	CHECK(stk_auth_vouch_check(v1, &alice, &w) == 0);
	w = v, w.count++;
	CHECK(stk_auth_vouch_check(v1, &alice, &w) == 0);
	w = v, w.expires_ms++;
	CHECK(stk_auth_vouch_check(v1, &alice, &w) == 0);
	w = v, w.epoch++;
	CHECK(stk_auth_vouch_check(v1, &alice, &w) == 0);
	w = v, w.mac[31] ^= 0x80;
	CHECK(stk_auth_vouch_check(v1, &alice, &w) == 0);
	/* and the whole policy */
	other.gen = 2;
	CHECK(stk_auth_vouch_check(v1, &other, &v) == 0);
	other = alice, other.flags = STK_CLIENT_RO;
	CHECK(stk_auth_vouch_check(v1, &other, &v) == 0);
	other = alice;
	stk_strlcpy(other.subtree, "/teamA/sub", sizeof(other.subtree));
	CHECK(stk_auth_vouch_check(v1, &other, &v) == 0);
	other = alice;
	stk_strlcpy(other.name, "bob", sizeof(other.name));
	CHECK(stk_auth_vouch_check(v1, &other, &v) == 0);
	return 0;
}

static void test_mac(void)
{
	(void)mac();
}

/* A reply of `fields` bytes of message, then n records, then the u16 count. */
static size_t reply(uint8_t *buf, size_t fields, const struct stk_msg_vouch_rec *recs, unsigned n,
		    unsigned count)
{
	struct stk_wbuf w;

	stk_wbuf_init(&w, buf, 65536);
	for (size_t i = 0; i < fields; i++)
		stk_put_u8(&w, (uint8_t)i);
	for (unsigned i = 0; i < n; i++)
		stk_msg_vouch_rec_enc(&w, &recs[i]);
	stk_put_u16(&w, (uint16_t)count);
	return w.len;
}

static int take(void)
{
	static uint8_t buf[65536];
	struct stk_vouches *t;
	struct stk_msg_vouch_rec recs[3], got;
	uint64_t later = stk_wall_ms() + 60000;
	size_t len;

	REQUIRE(stk_vouches_create(&t) == 0);
	memset(recs, 0, sizeof(recs));
	recs[0] =
	    (struct stk_msg_vouch_rec){.ino = 10, .count = 1, .expires_ms = later, .epoch = 1};
	recs[1] = (struct stk_msg_vouch_rec){.ino = 11, .count = 1, .expires_ms = 5, .epoch = 1};
	recs[2] = (struct stk_msg_vouch_rec){.ino = 1000, .count = 64, .expires_ms = later};
	recs[0].mac[0] = 0xab;
	len = reply(buf, 100, recs, 3, 3);
	/* no flag: nothing taken, the reply as it is */
	CHECK(stk_vouch_take(t, 0, buf, &len) == 0 && len == 100 + 3 * STK_VOUCH_REC_LEN + 2);
	CHECK(stk_vouch_find(t, 10, &got) == 0);
	CHECK(stk_vouch_take(t, STK_FRAME_VOUCH, buf, &len) == 0 && len == 100);
	CHECK(stk_vouch_find(t, 10, &got) == 1 && got.mac[0] == 0xab && got.epoch == 1);
	CHECK(stk_vouch_find(t, 11, &got) == 0); /* expired */
	CHECK(stk_vouch_find(t, 12, &got) == 0);
	CHECK(stk_vouch_find(t, 1000, &got) == 1 && got.count == 64);
	CHECK(stk_vouch_find(t, 1063, &got) == 1 && stk_vouch_find(t, 1064, &got) == 0);
	CHECK(stk_vouch_find(t, 999, &got) == 0);
	/* a client without a table reads the reply the same and keeps nothing */
	len = reply(buf, 7, recs, 1, 1);
	CHECK(stk_vouch_take(NULL, STK_FRAME_VOUCH, buf, &len) == 0 && len == 7);

	/* hostile trailers: refused, and the length left alone */
	len = 0;
	CHECK_RC(stk_vouch_take(t, STK_FRAME_VOUCH, buf, &len), -EIO);
	len = 1;
	CHECK_RC(stk_vouch_take(t, STK_FRAME_VOUCH, buf, &len), -EIO);
	len = reply(buf, 0, recs, 0, 0); /* a count of none */
	CHECK_RC(stk_vouch_take(t, STK_FRAME_VOUCH, buf, &len), -EIO);
	len = reply(buf, 10, recs, 1, 2); /* a count past the records */
	CHECK_RC(stk_vouch_take(t, STK_FRAME_VOUCH, buf, &len), -EIO);
	len = reply(buf, 0, recs, 0, STK_VOUCH_MAX + 1);
	CHECK_RC(stk_vouch_take(t, STK_FRAME_VOUCH, buf, &len), -EIO);
	len = reply(buf, 0, recs, 0, 0xffff);
	CHECK_RC(stk_vouch_take(t, STK_FRAME_VOUCH, buf, &len), -EIO);
	CHECK(len == 2);
	{
		struct stk_msg_vouch_rec zero = {.ino = 5, .count = 0};

		len = reply(buf, 0, &zero, 1, 1); /* a voucher for no inode */
		CHECK_RC(stk_vouch_take(t, STK_FRAME_VOUCH, buf, &len), -EIO);
	}
	/* random bytes: 0 or -EIO, never a length past the reply */
	srand(7);
	for (int i = 0; i < 20000; i++) {
		size_t n = (size_t)rand() % 400, was;
		uint8_t *p = malloc(n ? n : 1); /* exactly n: ASan sees a read past it */

		REQUIRE(p);
		for (size_t j = 0; j < n; j++)
			p[j] = (uint8_t)rand();
		if (n >= 2 && i % 2)
			p[n - 1] = 0, p[n - 2] = (uint8_t)(rand() % 8);
		was = len = n;
		if (stk_vouch_take(t, STK_FRAME_VOUCH, p, &len) == 0)
			CHECK(len < was && (was - len - 2) % STK_VOUCH_REC_LEN == 0);
		else
			CHECK(len == was);
		free(p);
	}
	stk_vouches_destroy(t);
	return 0;
}

static void test_take(void)
{
	(void)take();
}

int main(void)
{
	CHECK_RUN(test_mac);
	CHECK_RUN(test_take);
	return check_done();
}
