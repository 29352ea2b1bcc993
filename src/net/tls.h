/*
 * TLS for Stoker's own transport (docs/security.md, "TLS"): one connection's I/O,
 * plain or encrypted, behind a few calls, so that the rest of src/net does not
 * care which.
 *
 * TLS here is TLS 1.3 from OpenSSL with an external pre-shared key derived from
 * the cluster key (common/auth.h): no certificates. Both sides derive, with HKDF
 * (OpenSSL's), a 32-byte PSK and a public identity from the key they hold; the
 * client offers the identity, the server accepts it only if it is its own key's,
 * and the handshake (PSK with an ECDHE exchange, so past traffic stays secret if
 * the key leaks later) completes only if both hold the same key. So a TLS
 * connection is authenticated both ways by the handshake itself, and the key
 * handshake of auth.h is not run on it. No session tickets, no early data: every
 * connection does a full handshake.
 *
 * A client key's holder (common/auth.h) offers instead an identity naming its
 * policy and a PSK derived from its client key (below); the server derives the
 * same from the identity and its cluster key, and hands the policy it proved to
 * the transport, which confines the connection as after AUTH_HELLO_CLIENT.
 *
 * An SSL object may not be used by two threads at once, but our connections are
 * read by one thread while another writes (net.c's reader and senders; server.c's
 * loop and the worker sending a reply). Every call below takes the connection's
 * own lock around the one OpenSSL call it makes, and never holds it while waiting:
 * the socket is non-blocking, and the blocking calls (stk_tls_*_all) wait in
 * poll() without the lock. The server disables session tickets, so no
 * post-handshake message ever makes a write need a read.
 *
 * Return convention (as the syscalls they replace, but -errno): bytes moved (> 0),
 * 0 at end of stream (the peer closed), -EAGAIN when the socket would block, or
 * -errno: -ECONNRESET, -EPROTO (a malformed or forged record: TLS failed),
 * -ETIMEDOUT (the blocking calls' deadline).
 *
 * Thread rules: per connection as above; the context calls from any thread.
 */
#ifndef STK_NET_TLS_H
#define STK_NET_TLS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "../common/auth.h"

struct stk_tls;
struct stk_tls_server;

#define STK_TLS_PSK_LEN 32
#define STK_TLS_ID_LEN 32 /* "stoker-tls-1 " and 16 hex digits, NUL-terminated */

/*
 * The PSK and its public identity for a cluster key (HKDF-SHA256, OpenSSL's, with
 * labels of ours). Two keys give different identities (but for a 1 in 2^64
 * chance), so a server tells "another cluster's key" from a forged handshake.
 * 0 or -EIO.
 */
int stk_tls_derive(const uint8_t *key, size_t len, uint8_t psk[STK_TLS_PSK_LEN],
		   char id[STK_TLS_ID_LEN]);

/*
 * Client keys (common/auth.h) under TLS. The PSK identity names the client's
 * policy in the clear, canonically:
 *
 *	"stoker-tls-c1 NAME GEN FLAGS ANON_UID ANON_GID SUBTREE"
 *
 * (decimal numbers, the subtree last since it may hold spaces) and the PSK is
 * HKDF(client key, "stoker-tls-1 client psk"), the client key being
 * HMAC(cluster key, policy). A server holding the cluster key recomputes the PSK
 * from the identity alone, with no lookup; an edited identity gives another PSK,
 * and the handshake fails on the binder. stk_tls_client_derive fills psk and id
 * (STK_TLS_CLIENT_ID_MAX bytes, NUL-terminated); 0, -EINVAL (a policy that is not
 * well-formed) or -EIO.
 */
#define STK_TLS_CLIENT_ID_MAX (14 + STK_CLIENT_NAME_MAX + 4 * 21 + STK_CLIENT_SUBTREE_MAX + 1)
int stk_tls_client_derive(const struct stk_auth_client *c, const uint8_t ckey[STK_AUTH_MAC],
			  uint8_t psk[STK_TLS_PSK_LEN], char id[STK_TLS_CLIENT_ID_MAX]);
/*
 * Parses a client identity (exactly as stk_tls_client_derive writes it, nothing
 * else: a non-canonical form is refused) into c. 0 or -EINVAL.
 */
int stk_tls_client_parse(const char *id, size_t len, struct stk_auth_client *c);

/* Why a server-side handshake failed, for the log and the counter. */
enum stk_tls_fail {
	STK_TLS_FAIL_NONE = 0,
	STK_TLS_FAIL_WRONG_KEY, /* the client offered another key's identity, or none */
	STK_TLS_FAIL_PROTOCOL,	/* anything else: malformed records, bad binder, EOF */
	STK_TLS_FAIL_REVOKED,	/* a removed client key's identity */
};

/*
 * A server's TLS context for the cluster key (copied). 0, -ENOMEM, -EIO (OpenSSL
 * could not make one: logged).
 */
int stk_tls_server_create(const uint8_t *key, size_t len, struct stk_tls_server **out);
void stk_tls_server_destroy(struct stk_tls_server *srv);
/*
 * How the server learns that a client key was removed: revoked(name, gen) returns
 * 1 for a removed one (server.c's stk_net_client_revoked), called on the loop
 * during the handshake. Without it no client key is refused as removed. Set it
 * before the first stk_tls_accept_new.
 */
void stk_tls_server_set_revoked(struct stk_tls_server *srv,
				int (*revoked)(const char *name, uint64_t gen));

/*
 * A TLS session on a connected, non-blocking socket fd (not owned: the caller
 * closes it after stk_tls_free). Server side: accepts with srv's key. Client side:
 * offers key. 0, -ENOMEM or -EIO.
 */
int stk_tls_accept_new(struct stk_tls_server *srv, int fd, struct stk_tls **out);
int stk_tls_connect_new(int fd, const uint8_t *key, size_t len, struct stk_tls **out);
/* Client side, offering a client key's identity and PSK (above). As connect_new. */
int stk_tls_connect_client_new(int fd, const struct stk_auth_client *c,
			       const uint8_t ckey[STK_AUTH_MAC], struct stk_tls **out);
void stk_tls_free(struct stk_tls *t);
/*
 * Server side, once the handshake is complete: the client key's policy the peer
 * proved, handed to the caller (free() it), or NULL when the peer proved the
 * cluster key. Only the first call returns it.
 */
struct stk_auth_client *stk_tls_client_take(struct stk_tls *t);

/*
 * One step of the handshake: 0 once complete, -EAGAIN with *want_write set to 1
 * when it waits for the socket to take bytes (else for bytes to arrive), or a
 * failure: -EKEYREJECTED (keys differ: the peer refused ours, or offered another),
 * -ECONNRESET (the peer closed: often a daemon that runs without TLS), -EPROTO.
 * stk_tls_why() then says what happened for a person.
 */
int stk_tls_handshake(struct stk_tls *t, int *want_write);
/* The last failure, for a log line; "" when none. Valid until the next call on t. */
const char *stk_tls_why(const struct stk_tls *t);
/* A server's handshake failure, classified. */
enum stk_tls_fail stk_tls_fail_reason(const struct stk_tls *t);

/* Non-blocking I/O, by the convention at the top. */
ssize_t stk_tls_recv(struct stk_tls *t, void *buf, size_t len);
ssize_t stk_tls_readv(struct stk_tls *t, const struct iovec *iov, int n);
ssize_t stk_tls_sendv(struct stk_tls *t, const struct iovec *iov, int n);
/*
 * 1 when decrypted bytes wait inside the session: the socket may be empty (so
 * epoll says nothing) while a read would still return data.
 */
int stk_tls_pending(struct stk_tls *t);

/*
 * Blocking forms for net.c's threads: the whole buffer, waiting in poll() (never
 * under the lock) at most timeout_ms for each step (0: forever). 0 or -errno:
 * -ECONNRESET at end of stream, -ETIMEDOUT.
 */
int stk_tls_send_all(struct stk_tls *t, struct iovec *iov, int n, int timeout_ms);
int stk_tls_recv_all(struct stk_tls *t, void *buf, size_t len, int timeout_ms);
/* The handshake to its end, within timeout_ms. As stk_tls_handshake, never -EAGAIN. */
int stk_tls_handshake_wait(struct stk_tls *t, int timeout_ms);

/*
 * The plain forms the event loops use when a connection has no TLS (t NULL), so a
 * caller writes one call for both: recv, readv and sendmsg (MSG_NOSIGNAL |
 * MSG_DONTWAIT) with -errno returns.
 */
ssize_t stk_io_recv(int fd, struct stk_tls *t, void *buf, size_t len);
ssize_t stk_io_readv(int fd, struct stk_tls *t, const struct iovec *iov, int n);
ssize_t stk_io_sendv(int fd, struct stk_tls *t, const struct iovec *iov, int n);

#endif
