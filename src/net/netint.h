/*
 * What the transport's client side (net.c) and server side (server.c) share; not
 * for use outside src/net.
 */
#ifndef STK_NET_NETINT_H
#define STK_NET_NETINT_H

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

#endif
