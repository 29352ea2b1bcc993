/*
 * Transport: framed RPC over TCP.
 *
 * This is the one interface the services and the client library use to talk; an
 * RDMA transport would implement the same calls. Frames are those of
 * proto/wire.h.
 *
 * Client side: a connection carries one request at a time. stk_rpc_send() and
 * stk_rpc_recv() are split so that a caller can put requests on several
 * connections first and collect the replies after, which is how the client
 * library fans one large read out over many chains without threads. Any
 * transport failure (reset, timeout, malformed reply) marks the connection broken;
 * a broken connection must be closed (stk_pool_put does that).
 *
 * Server side: stk_server accepts connections and serves each on its own thread,
 * reading a frame, calling the handler and writing the reply. Every buffer a
 * connection needs is allocated once per connection and reused, so serving a
 * request allocates nothing. A malformed frame closes that connection only.
 *
 * Thread rules: a stk_conn is used by one thread at a time. A stk_pool and a
 * stk_server may be used from any thread.
 */
#ifndef STK_NET_H
#define STK_NET_H

#include <stddef.h>
#include <stdint.h>

#include "../proto/codec.h"
#include "../proto/wire.h"

struct stk_conn;

/*
 * Connects to "HOST:PORT". timeout_ms bounds the connect; replies are awaited for
 * STOKER_RPC_TIMEOUT_MS (default 60000) before the connection is called broken.
 * 0, or -ECONNREFUSED, -ETIMEDOUT, -EHOSTUNREACH, -EINVAL (bad address), -ENOMEM.
 */
int stk_conn_connect(const char *addr, int timeout_ms, struct stk_conn **out);
void stk_conn_close(struct stk_conn *c);
int stk_conn_broken(const struct stk_conn *c);
const char *stk_conn_addr(const struct stk_conn *c);

/* One request and, once received, its reply. The caller owns every buffer. */
struct stk_rpc {
	uint16_t opcode;
	const void *req;
	size_t req_len;
	const void *bulk_out; /* data sent after the payload (writes) */
	size_t bulk_out_len;
	void *resp; /* reply payload lands here */
	size_t resp_cap;
	size_t resp_len;
	void *bulk_in; /* reply bulk lands here (reads) */
	size_t bulk_in_cap;
	size_t bulk_in_len;
	uint32_t status; /* wire status of the reply */
	uint64_t req_id;
	/*
	 * STK_FRAME_BULK_SELF: set by the caller to send a request whose message carries
	 * its own bulk checksums, and to accept a reply that does (the caller must then
	 * verify the reply's bulk itself; any other reply with the flag is malformed).
	 */
	uint32_t frame_flags;
	uint32_t origin; /* the header's origin (wire.h): a meta request's cache holder id */
};

/* Sends the request. 0, or -errno (the connection is then broken). */
int stk_rpc_send(struct stk_conn *c, struct stk_rpc *rpc);
/*
 * Receives the reply into rpc->resp / rpc->bulk_in. Returns 0 when a well-formed
 * reply arrived (rpc->status says how the request went), or -errno for a transport
 * failure (the connection is then broken): -EPIPE/-ECONNRESET, -ETIMEDOUT,
 * -EBADMSG (malformed reply), -EMSGSIZE (reply larger than the caller's buffers).
 */
int stk_rpc_recv(struct stk_conn *c, struct stk_rpc *rpc);
/* send + recv; returns the transport error, or the reply's status as -errno. */
int stk_rpc_call(struct stk_conn *c, struct stk_rpc *rpc);

/*
 * A pool of idle connections per address. stk_pool_get returns an idle connection
 * to addr or opens a new one; stk_pool_put returns it (or closes it if broken, or
 * if more than max_idle are already idle for that address).
 */
struct stk_pool;
int stk_pool_create(unsigned max_idle, struct stk_pool **out);
void stk_pool_destroy(struct stk_pool *p);
int stk_pool_get(struct stk_pool *p, const char *addr, struct stk_conn **out);
void stk_pool_put(struct stk_pool *p, struct stk_conn *c);
/* Closes every idle connection (after fork, or when a peer is known to be gone). */
void stk_pool_flush(struct stk_pool *p);
/*
 * In a child after fork(): re-creates the pool's lock (which a parent thread may
 * have held) and drops the idle connections, which the parent keeps using. Only
 * the forking thread exists then, so this is safe without the lock.
 */
void stk_pool_after_fork(struct stk_pool *p);

/* ---- server ---- */

struct stk_rpc_req {
	struct stk_frame_hdr hdr; /* hdr.flags & STK_FRAME_BULK_SELF: bulk not yet verified */
	struct stk_rbuf payload; /* decode the request from here */
	const uint8_t *bulk; /* valid until the handler returns */
	uint32_t bulk_len;
	const char *peer; /* "HOST:PORT" of the client */
};

struct stk_rpc_resp {
	struct stk_wbuf payload; /* encode the reply here (STK_MAX_PAYLOAD bytes) */
	const void *bulk; /* reply bulk, must stay valid until the handler returns */
	uint32_t bulk_len;
	uint32_t frame_flags; /* STK_FRAME_BULK_SELF if the payload checksums the bulk */
	/* private: per-connection bulk buffer */
	void *bulk_buf_;
	size_t bulk_cap_;
};

/*
 * A buffer of at least len bytes (len <= STK_MAX_BULK) owned by the connection,
 * for a handler to read data into and point resp->bulk at. NULL if out of memory.
 */
void *stk_rpc_resp_bulk_buf(struct stk_rpc_resp *resp, size_t len);

/*
 * Serves one request. Returns 0 to send the encoded reply with status OK, or
 * -errno to send that status with an empty payload and no bulk. A handler that
 * finds the payload malformed returns -EBADMSG: the client gets BADMSG and the
 * connection stays open, since the frame itself was sound.
 */
typedef int (*stk_rpc_handler_fn)(void *ctx, struct stk_rpc_req *req, struct stk_rpc_resp *resp);

struct stk_metrics_ops;

struct stk_server_opts {
	size_t size; /* sizeof(struct stk_server_opts) */
	const char *listen; /* "HOST:PORT"; port 0 picks a free port */
	stk_rpc_handler_fn handler;
	void *ctx;
	unsigned max_conns; /* 0 = 1024 */
	/*
	 * Optional: counts every request (opcode, status, bytes, latency) and connection
	 * into this set (common/metrics.h, stk_metrics_rpc_create). Must outlive the server.
	 */
	struct stk_metrics_ops *metrics;
};

struct stk_server;
/*
 * Binds and listens. 0, or -EADDRINUSE ("port in use"), -EADDRNOTAVAIL, -EINVAL
 * (malformed address), -EACCES.
 */
int stk_server_create(const struct stk_server_opts *opts, struct stk_server **out);
/* The bound "HOST:PORT" (useful with port 0). Valid until destroy. */
const char *stk_server_addr(const struct stk_server *s);
/* Accepts and serves until stk_server_stop(). 0 or -errno. */
int stk_server_run(struct stk_server *s);
/* Makes stk_server_run return. Async-signal-safe. */
void stk_server_stop(struct stk_server *s);
/* Closes the listener and every connection, waits for their threads. */
void stk_server_destroy(struct stk_server *s);

#endif
