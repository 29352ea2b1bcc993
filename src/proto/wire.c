/* Frame header encoding and validation, and opcode names from the opcode table. */
#include "wire.h"

#include <errno.h>

#include "codec.h"

void stk_hdr_encode(const struct stk_frame_hdr *h, uint8_t *out)
{
	struct stk_wbuf w;

	stk_wbuf_init(&w, out, STK_FRAME_HDR_LEN);
	stk_put_u32(&w, h->magic);
	stk_put_u16(&w, h->version);
	stk_put_u16(&w, h->opcode);
	stk_put_u32(&w, h->flags);
	stk_put_u32(&w, h->status);
	stk_put_u64(&w, h->req_id);
	stk_put_u32(&w, h->payload_len);
	stk_put_u32(&w, h->bulk_len);
	stk_put_u32(&w, h->checksum);
	stk_put_u32(&w, h->origin);
}

int stk_hdr_decode(const uint8_t *in, struct stk_frame_hdr *h)
{
	struct stk_rbuf r;

	stk_rbuf_init(&r, in, STK_FRAME_HDR_LEN);
	h->magic = stk_get_u32(&r);
	h->version = stk_get_u16(&r);
	h->opcode = stk_get_u16(&r);
	h->flags = stk_get_u32(&r);
	h->status = stk_get_u32(&r);
	h->req_id = stk_get_u64(&r);
	h->payload_len = stk_get_u32(&r);
	h->bulk_len = stk_get_u32(&r);
	h->checksum = stk_get_u32(&r);
	h->origin = stk_get_u32(&r);
	if (stk_rbuf_finish(&r))
		return -EBADMSG;
	if (h->magic != STK_WIRE_MAGIC || h->version == 0)
		return -EBADMSG;
	if (h->payload_len > STK_MAX_PAYLOAD || h->bulk_len > STK_MAX_BULK)
		return -EBADMSG;
	/* the flags of another version mean what that version says: its version is refused */
	if (h->version == STK_WIRE_VERSION &&
	    (h->flags & ~(STK_FRAME_REPLY | STK_FRAME_BULK_SELF | STK_FRAME_CLASS_MASK |
			   STK_FRAME_VOUCH)))
		return -EBADMSG;
	return 0;
}

const char *stk_opcode_name(uint16_t opcode)
{
	switch (opcode) {
#define STK_OPCODE_NAME(name, code, req, resp, what) \
	case code:                                   \
		return #name;
		STK_OPCODE_TABLE(STK_OPCODE_NAME)
#undef STK_OPCODE_NAME
	default:
		return "UNKNOWN";
	}
}
