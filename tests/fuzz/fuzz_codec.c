/*
 * libFuzzer target for everything that parses bytes from the wire: the frame
 * header, every message decoder generated from msg.h, the routing table, and the
 * inode a metadata request is routed by.
 * The first input byte picks the decoder; the rest is the payload. Any crash,
 * overread (ASan) or undefined behaviour (UBSan) is a bug.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto/codec.h"
#include "proto/msg.h"
#include "proto/wire.h"

typedef void (*decode_fn)(const uint8_t *p, size_t n);

#define FUZZ_DECODER(sname, LIST)                                              \
	static void fuzz_##sname(const uint8_t *p, size_t n)                   \
	{                                                                      \
		struct stk_msg_##sname *m = malloc(sizeof(*m));                \
		struct stk_rbuf r;                                             \
		if (!m)                                                        \
			return;                                                \
		stk_rbuf_init(&r, p, n);                                       \
		if (stk_msg_##sname##_dec(&r, m) == 0)                         \
			(void)stk_rbuf_finish(&r);                             \
		free(m);                                                       \
	}
STK_MSG_LIST(FUZZ_DECODER)
#undef FUZZ_DECODER

static void fuzz_routing(const uint8_t *p, size_t n)
{
	struct stk_routing rt;
	struct stk_rbuf r;

	stk_rbuf_init(&r, p, n);
	if (stk_routing_decode(&r, &rt) == 0) {
		for (uint32_t i = 0; i < rt.nchains; i++)
			(void)stk_routing_chain(&rt, rt.chains[i].id);
		stk_routing_free(&rt);
	}
}

static void fuzz_header(const uint8_t *p, size_t n)
{
	struct stk_frame_hdr h;
	uint8_t b[STK_FRAME_HDR_LEN];

	if (n < STK_FRAME_HDR_LEN)
		return;
	if (stk_hdr_decode(p, &h) == 0) {
		stk_hdr_encode(&h, b);
		if (memcmp(b, p, sizeof(b)) != 0)
			abort(); /* a header that decodes must re-encode to the same bytes */
		(void)stk_opcode_name(h.opcode);
	}
}

/* Which inode (and shard) a metadata request names (stk_msg_meta_route): 2 bytes of opcode. */
static void fuzz_meta_route(const uint8_t *p, size_t n)
{
	uint64_t ino, other;
	int rc;

	if (n < 2)
		return;
	rc = stk_msg_meta_route((uint16_t)(p[0] | p[1] << 8), p + 2, n - 2, &ino, &other);
	if ((rc == 1 && ino == 0) || (rc != 1 && rc != 0 && rc != -EBADMSG))
		abort(); /* "names an inode" is never inode 0, and nothing else is answered */
}

static const decode_fn decoders[] = {
#define FUZZ_ENTRY(sname, LIST) fuzz_##sname,
	STK_MSG_LIST(FUZZ_ENTRY)
#undef FUZZ_ENTRY
	fuzz_routing,
	fuzz_header,
	fuzz_meta_route,
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	decoders[data[0] % (sizeof(decoders) / sizeof(decoders[0]))](data + 1, size - 1);
	return 0;
}
