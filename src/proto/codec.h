/*
 * Bounds-checked encoding and decoding of message payloads.
 *
 * All integers are little-endian on the wire. A writer (stk_wbuf) appends into a
 * caller-owned buffer and latches -EMSGSIZE on the first put that does not fit; a
 * reader (stk_rbuf) consumes a received payload and latches -EBADMSG on the first
 * get that would run past its end. Callers do a whole sequence of puts or gets and
 * check ->err once at the end: after an error every further call is a no-op that
 * leaves outputs zeroed, so a truncated or hostile payload can never make a handler
 * read outside the frame.
 *
 * Strings are a u16 length followed by that many bytes, no NUL on the wire.
 * stk_get_str() copies into a caller buffer and NUL-terminates; a string that does
 * not fit, or that contains a NUL byte, is a decode error (-EBADMSG), never a
 * truncation.
 *
 * Nothing here allocates. Hot paths call these inline.
 */
#ifndef STK_PROTO_CODEC_H
#define STK_PROTO_CODEC_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

struct stk_wbuf {
	uint8_t *p;
	size_t len; /* bytes written */
	size_t cap;
	int err; /* 0 or -EMSGSIZE */
};

struct stk_rbuf {
	const uint8_t *p;
	size_t len;
	size_t off; /* bytes consumed */
	int err; /* 0 or -EBADMSG */
};

static inline void stk_wbuf_init(struct stk_wbuf *w, void *buf, size_t cap)
{
	w->p = buf;
	w->len = 0;
	w->cap = cap;
	w->err = 0;
}

static inline void stk_rbuf_init(struct stk_rbuf *r, const void *buf, size_t len)
{
	r->p = buf;
	r->len = len;
	r->off = 0;
	r->err = 0;
}

/* Reserves n bytes; NULL (and err latched) when they do not fit. */
static inline uint8_t *stk_wbuf_reserve(struct stk_wbuf *w, size_t n)
{
	uint8_t *q;

	if (w->err || n > w->cap - w->len) {
		w->err = -EMSGSIZE;
		return NULL;
	}
	q = w->p + w->len;
	w->len += n;
	return q;
}

static inline void stk_put_u8(struct stk_wbuf *w, uint8_t v)
{
	uint8_t *q = stk_wbuf_reserve(w, 1);
	if (q)
		q[0] = v;
}

static inline void stk_put_u16(struct stk_wbuf *w, uint16_t v)
{
	uint8_t *q = stk_wbuf_reserve(w, 2);
	if (q) {
		q[0] = (uint8_t)v;
		q[1] = (uint8_t)(v >> 8);
	}
}

static inline void stk_put_u32(struct stk_wbuf *w, uint32_t v)
{
	uint8_t *q = stk_wbuf_reserve(w, 4);
	if (q)
		for (int i = 0; i < 4; i++)
			q[i] = (uint8_t)(v >> (8 * i));
}

static inline void stk_put_u64(struct stk_wbuf *w, uint64_t v)
{
	uint8_t *q = stk_wbuf_reserve(w, 8);
	if (q)
		for (int i = 0; i < 8; i++)
			q[i] = (uint8_t)(v >> (8 * i));
}

static inline void stk_put_i64(struct stk_wbuf *w, int64_t v)
{
	stk_put_u64(w, (uint64_t)v);
}

static inline void stk_put_bytes(struct stk_wbuf *w, const void *src, size_t n)
{
	uint8_t *q = stk_wbuf_reserve(w, n);
	if (q && n)
		memcpy(q, src, n);
}

/* u16 length + bytes. A string longer than 65535 bytes latches -EMSGSIZE. */
static inline void stk_put_strn(struct stk_wbuf *w, const char *s, size_t n)
{
	if (n > 0xffff) {
		w->err = -EMSGSIZE;
		return;
	}
	stk_put_u16(w, (uint16_t)n);
	stk_put_bytes(w, s, n);
}

static inline void stk_put_str(struct stk_wbuf *w, const char *s)
{
	stk_put_strn(w, s, strlen(s));
}

/* Returns a pointer to n bytes of the payload, or NULL (err latched). */
static inline const uint8_t *stk_rbuf_take(struct stk_rbuf *r, size_t n)
{
	const uint8_t *q;

	if (r->err || n > r->len - r->off) {
		r->err = -EBADMSG;
		return NULL;
	}
	q = r->p + r->off;
	r->off += n;
	return q;
}

static inline uint8_t stk_get_u8(struct stk_rbuf *r)
{
	const uint8_t *q = stk_rbuf_take(r, 1);
	return q ? q[0] : 0;
}

static inline uint16_t stk_get_u16(struct stk_rbuf *r)
{
	const uint8_t *q = stk_rbuf_take(r, 2);
	return q ? (uint16_t)(q[0] | (q[1] << 8)) : 0;
}

static inline uint32_t stk_get_u32(struct stk_rbuf *r)
{
	const uint8_t *q = stk_rbuf_take(r, 4);
	uint32_t v = 0;
	if (q)
		for (int i = 0; i < 4; i++)
			v |= (uint32_t)q[i] << (8 * i);
	return v;
}

static inline uint64_t stk_get_u64(struct stk_rbuf *r)
{
	const uint8_t *q = stk_rbuf_take(r, 8);
	uint64_t v = 0;
	if (q)
		for (int i = 0; i < 8; i++)
			v |= (uint64_t)q[i] << (8 * i);
	return v;
}

static inline int64_t stk_get_i64(struct stk_rbuf *r)
{
	return (int64_t)stk_get_u64(r);
}

static inline void stk_get_bytes(struct stk_rbuf *r, void *dst, size_t n)
{
	const uint8_t *q = stk_rbuf_take(r, n);
	if (q)
		memcpy(dst, q, n);
	else if (n)
		memset(dst, 0, n);
}

/*
 * Reads a string into dst (size dstlen, NUL-terminated). A string of dstlen bytes
 * or more, or one holding a NUL, latches -EBADMSG. Returns the length.
 */
static inline size_t stk_get_str(struct stk_rbuf *r, char *dst, size_t dstlen)
{
	uint16_t n = stk_get_u16(r);
	const uint8_t *q;

	if (dstlen)
		dst[0] = 0;
	if (r->err)
		return 0;
	if ((size_t)n >= dstlen) {
		r->err = -EBADMSG;
		return 0;
	}
	q = stk_rbuf_take(r, n);
	if (!q)
		return 0;
	if (memchr(q, 0, n)) {
		r->err = -EBADMSG;
		return 0;
	}
	memcpy(dst, q, n);
	dst[n] = 0;
	return n;
}

/* Decoding must consume the whole payload: trailing bytes are an error too. */
static inline int stk_rbuf_finish(struct stk_rbuf *r)
{
	if (r->err)
		return r->err;
	if (r->off != r->len)
		return -EBADMSG;
	return 0;
}

#endif
