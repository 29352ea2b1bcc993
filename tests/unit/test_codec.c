/*
 * Unit test of the wire codec: frame headers, bounds-checked put/get, every
 * generated message, the routing table, and hostile input (truncation at every
 * byte, oversized counts, embedded NULs). Exit 0 pass, 1 fail.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/codec.h"
#include "proto/msg.h"
#include "proto/status.h"
#include "proto/wire.h"
#include "check.h"

static void test_header(void)
{
	struct stk_frame_hdr h = {.magic = STK_WIRE_MAGIC,
				  .version = STK_WIRE_VERSION,
				  .opcode = STK_OP_STOR_READ,
				  .flags = STK_FRAME_REPLY,
				  .status = STK_ST_NOENT,
				  .req_id = 0x1122334455667788ull,
				  .payload_len = 100,
				  .bulk_len = 1 << 20,
				  .checksum = 0xdeadbeef};
	struct stk_frame_hdr g;
	uint8_t b[STK_FRAME_HDR_LEN];

	stk_hdr_encode(&h, b);
	CHECK(b[0] == 0x53 && b[1] == 0x54 && b[2] == 0x4b && b[3] == 0x31); /* "STK1" LE */
	CHECK(stk_hdr_decode(b, &g) == 0);
	CHECK(memcmp(&h, &g, sizeof(h)) == 0);
	b[0] ^= 1;
	CHECK(stk_hdr_decode(b, &g) == -EBADMSG);
	b[0] ^= 1;
	h.payload_len = STK_MAX_PAYLOAD + 1;
	stk_hdr_encode(&h, b);
	CHECK(stk_hdr_decode(b, &g) == -EBADMSG);
	h.payload_len = 0;
	h.bulk_len = STK_MAX_BULK + 1;
	stk_hdr_encode(&h, b);
	CHECK(stk_hdr_decode(b, &g) == -EBADMSG);
	h.bulk_len = 0;
	h.flags = 0x80;
	stk_hdr_encode(&h, b);
	CHECK(stk_hdr_decode(b, &g) == -EBADMSG);
	/* QoS class bits are this version's */
	h.flags = 2u << STK_FRAME_CLASS_SHIFT;
	stk_hdr_encode(&h, b);
	CHECK(stk_hdr_decode(b, &g) == 0 && g.flags == h.flags);
	/*
	 * Another version's flags are that version's: parsed, never refused, so that the
	 * receiver answers the version (NOTSUP) rather than closing on a flag
	 */
	h.flags = 0x80 | STK_FRAME_CLASS_MASK;
	h.version = STK_WIRE_VERSION + 1;
	stk_hdr_encode(&h, b);
	CHECK(stk_hdr_decode(b, &g) == 0 && g.flags == h.flags && g.version == h.version);
	h.version = STK_WIRE_VERSION - 1;
	stk_hdr_encode(&h, b);
	CHECK(stk_hdr_decode(b, &g) == 0 && g.flags == h.flags);
	h.version = 0; /* never a version */
	stk_hdr_encode(&h, b);
	CHECK(stk_hdr_decode(b, &g) == -EBADMSG);
	h.version = STK_WIRE_VERSION;
	h.flags = 0;
	CHECK(strcmp(stk_opcode_name(STK_OP_META_RENAME), "META_RENAME") == 0);
	CHECK(strcmp(stk_opcode_name(9999), "UNKNOWN") == 0);
}

static void test_primitives(void)
{
	uint8_t buf[64];
	struct stk_wbuf w;
	struct stk_rbuf r;
	char s[8];

	stk_wbuf_init(&w, buf, sizeof(buf));
	stk_put_u8(&w, 0xab);
	stk_put_u16(&w, 0xbeef);
	stk_put_u32(&w, 0x01020304);
	stk_put_u64(&w, 0xfffffffffffffffeull);
	stk_put_str(&w, "hello");
	CHECK(w.err == 0 && w.len == 1 + 2 + 4 + 8 + 2 + 5);
	stk_rbuf_init(&r, buf, w.len);
	CHECK(stk_get_u8(&r) == 0xab);
	CHECK(stk_get_u16(&r) == 0xbeef);
	CHECK(stk_get_u32(&r) == 0x01020304);
	CHECK(stk_get_u64(&r) == 0xfffffffffffffffeull);
	CHECK(stk_get_str(&r, s, sizeof(s)) == 5 && strcmp(s, "hello") == 0);
	CHECK(stk_rbuf_finish(&r) == 0);

	/* a string that does not fit the destination is an error, not a truncation */
	stk_rbuf_init(&r, buf + 15, 7);
	CHECK(stk_get_str(&r, s, 5) == 0 && r.err == -EBADMSG && s[0] == 0);

	/* an embedded NUL is refused */
	uint8_t nul[] = {3, 0, 'a', 0, 'b'};
	stk_rbuf_init(&r, nul, sizeof(nul));
	stk_get_str(&r, s, sizeof(s));
	CHECK(r.err == -EBADMSG);

	/* overrun latches and later gets return zero */
	stk_rbuf_init(&r, buf, 3);
	CHECK(stk_get_u32(&r) == 0 && r.err == -EBADMSG);
	CHECK(stk_get_u8(&r) == 0);

	/* trailing bytes fail finish */
	stk_rbuf_init(&r, buf, 2);
	stk_get_u8(&r);
	CHECK(stk_rbuf_finish(&r) == -EBADMSG);

	/* writer overflow latches */
	stk_wbuf_init(&w, buf, 3);
	stk_put_u32(&w, 1);
	CHECK(w.err == -EMSGSIZE);
	stk_put_u8(&w, 1);
	CHECK(w.len == 0);
}

static void test_messages(void)
{
	uint8_t buf[8192];
	struct stk_wbuf w;
	struct stk_rbuf r;
	struct stk_msg_meta_create_req a, b;
	struct stk_msg_meta_attr_resp ar, br;

	memset(&a, 0, sizeof(a));
	a.cred.uid = 1000;
	a.cred.gid = 100;
	a.cred.ngroups = 2;
	a.cred.groups[0] = 10;
	a.cred.groups[1] = 20;
	a.parent = 77;
	snprintf(a.name, sizeof(a.name), "file.bin");
	a.mode = 0100644;
	a.flags = STK_CREATE_EXCL;
	a.layout.chunk_size = 1 << 20;
	a.layout.stripe = 4;
	a.layout.nchains = 8;
	a.layout.start = 3;
	a.layout.seed = 42;
	stk_wbuf_init(&w, buf, sizeof(buf));
	CHECK(stk_msg_meta_create_req_enc(&w, &a) == 0);
	stk_rbuf_init(&r, buf, w.len);
	CHECK(stk_msg_meta_create_req_dec(&r, &b) == 0 && stk_rbuf_finish(&r) == 0);
	CHECK(b.cred.uid == 1000 && b.cred.ngroups == 2 && b.cred.groups[1] == 20);
	CHECK(b.parent == 77 && strcmp(b.name, "file.bin") == 0 && b.mode == 0100644);
	CHECK(b.layout.seed == 42 && b.layout.stripe == 4 && b.layout.start == 3);

	/* every truncation of the payload is a clean decode error */
	for (size_t n = 0; n < w.len; n++) {
		stk_rbuf_init(&r, buf, n);
		int rc = stk_msg_meta_create_req_dec(&r, &b);
		CHECK(rc == -EBADMSG || stk_rbuf_finish(&r) != 0);
	}

	/* a cred claiming more groups than allowed */
	buf[8] = STK_MAX_GROUPS + 1;
	stk_rbuf_init(&r, buf, w.len);
	CHECK(stk_msg_meta_create_req_dec(&r, &b) == -EBADMSG);

	memset(&ar, 0, sizeof(ar));
	ar.attr.ino = 5;
	ar.attr.mode = 040755;
	ar.attr.size = 1ull << 40;
	ar.attr.mtime_sec = -5;
	ar.attr.mtime_nsec = 999999999;
	stk_wbuf_init(&w, buf, sizeof(buf));
	CHECK(stk_msg_meta_attr_resp_enc(&w, &ar) == 0);
	stk_rbuf_init(&r, buf, w.len);
	CHECK(stk_msg_meta_attr_resp_dec(&r, &br) == 0 && stk_rbuf_finish(&r) == 0);
	CHECK(memcmp(&ar.attr, &br.attr, sizeof(ar.attr)) == 0);

	/* a name of 256 bytes does not decode into a 255-byte name field */
	{
		uint8_t big[600];
		stk_wbuf_init(&w, big, sizeof(big));
		stk_put_u32(&w, 0);
		stk_put_u32(&w, 0);
		stk_put_u8(&w, 0);
		stk_put_u64(&w, 1);
		char name[257];
		memset(name, 'x', 256);
		name[256] = 0;
		stk_put_str(&w, name);
		struct stk_msg_meta_lookup_req lk;
		stk_rbuf_init(&r, big, w.len);
		CHECK(stk_msg_meta_lookup_req_dec(&r, &lk) == -EBADMSG);
	}
}

static void test_routing(void)
{
	struct stk_rt_node nodes[2] = {{.id = 1, .role = STK_ROLE_META, .state = 1, .addr = "127.0.0.1:9401"},
				       {.id = 2, .role = STK_ROLE_STORAGE, .state = 1, .addr = "127.0.0.1:9402",
					.host_id = "m1:4026531840"}};
	struct stk_rt_target targets[2] = {{.id = 1, .node_id = 2, .state = 1, .capacity = 100, .path = "/t0"},
					   {.id = 2, .node_id = 2, .state = 1, .capacity = 100, .path = "/t1",
					    .avail = 60, .dev = 0xfeedull << 40}};
	struct stk_rt_chain chains[2] = {{.id = 1, .version = 3, .ntargets = 1, .targets = {1}},
					 {.id = 2, .version = 1, .ntargets = 1, .targets = {2}}};
	struct stk_rt_shard shards[1] = {{.id = 1, .node_id = 1}};
	struct stk_routing rt = {.version = 9, .nnodes = 2, .ntargets = 2, .nchains = 2, .nshards = 1,
				 .nodes = nodes, .targets = targets, .chains = chains, .shards = shards};
	struct stk_routing back;
	uint8_t buf[65536];
	struct stk_wbuf w;
	struct stk_rbuf r;

	stk_wbuf_init(&w, buf, sizeof(buf));
	CHECK(stk_routing_encode(&w, &rt) == 0);
	stk_rbuf_init(&r, buf, w.len);
	CHECK(stk_routing_decode(&r, &back) == 0 && stk_rbuf_finish(&r) == 0);
	CHECK(back.version == 9 && back.nchains == 2 && back.chains[0].version == 3);
	CHECK(strcmp(back.targets[1].path, "/t1") == 0);
	CHECK(stk_routing_chain(&back, 2)->targets[0] == 2);
	CHECK(stk_routing_node(&back, 2) && strcmp(stk_routing_node(&back, 2)->addr, "127.0.0.1:9402") == 0);
	CHECK(strcmp(back.nodes[1].host_id, "m1:4026531840") == 0 && back.nodes[0].host_id[0] == 0);
	CHECK(back.targets[1].avail == 60 && back.targets[1].dev == 0xfeedull << 40);
	CHECK(back.targets[0].avail == 0 && back.targets[0].dev == 0);
	CHECK(stk_routing_chain(&back, 3) == NULL);
	stk_routing_free(&back);

	for (size_t n = 0; n < w.len; n++) {
		stk_rbuf_init(&r, buf, n);
		CHECK(stk_routing_decode(&r, &back) == -EBADMSG);
	}
	/* a hostile count must not allocate gigabytes */
	buf[8] = 0xff;
	buf[9] = 0xff;
	buf[10] = 0xff;
	buf[11] = 0x7f;
	stk_rbuf_init(&r, buf, w.len);
	CHECK(stk_routing_decode(&r, &back) == -EBADMSG);
}

static void test_status(void)
{
	CHECK(stk_status_from_errno(0) == STK_ST_OK);
	CHECK(stk_status_from_errno(-ENOENT) == STK_ST_NOENT);
	CHECK(stk_status_to_errno(STK_ST_NOSPC) == -ENOSPC);
	CHECK(stk_status_to_errno(STK_ST_STALE_ROUTING) == -ESTALE);
	CHECK(stk_status_to_errno(12345) == -EIO);
	CHECK(stk_status_from_errno(-EHWPOISON) == STK_ST_IO);
	for (uint32_t s = 0; s <= STK_ST_BADF; s++)
		CHECK(stk_status_from_errno(stk_status_to_errno(s)) == s);
}

int main(void)
{
	CHECK_RUN(test_header);
	CHECK_RUN(test_primitives);
	CHECK_RUN(test_messages);
	CHECK_RUN(test_routing);
	CHECK_RUN(test_status);
	return check_done();
}
