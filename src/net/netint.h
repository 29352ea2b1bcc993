/*
 * What the transport's client side (net.c) and server side (server.c) share; not
 * for use outside src/net.
 */
#ifndef STK_NET_NETINT_H
#define STK_NET_NETINT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "../proto/wire.h"

/* "HOST:PORT" to a socket address. 0, -EINVAL (malformed), -EHOSTUNREACH. */
int stk_net_resolve(const char *addr, struct sockaddr_storage *ss, socklen_t *sslen);

/*
 * Completes a frame header for sending: magic, version (if unset) and the checksum
 * of payload and bulk (payload only with STK_FRAME_BULK_SELF), encoded into hb.
 */
void stk_frame_seal(struct stk_frame_hdr *h, const void *payload, const void *bulk,
		    uint8_t hb[STK_FRAME_HDR_LEN]);

/*
 * The client's proof in the key handshake (auth.h), for a handshake made a step
 * at a time (loopclient.c): checks the server's AUTH_HELLO reply (len bytes at
 * resp) against the keys this process holds, for the client nonce nc, and
 * computes the proof mac. 0, -EBADMSG (malformed), -EKEYREJECTED (the server
 * proved no key we hold: logged), -EIO.
 */
int stk_net_auth_proof(const uint8_t *nc, const void *resp, size_t len, uint8_t *mac,
		       const char *addr);

/*
 * The i-th cluster key held, newest first (for TLS, which offers one key per
 * handshake). 0, or -ENOENT past the last.
 */
int stk_net_tls_key(unsigned i, uint8_t *key, size_t *len);

#endif
