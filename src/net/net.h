/*
 * Transport: framed RPC over TCP.
 *
 * This is the one interface the services and the client library use to talk; an
 * RDMA transport would implement the same calls. Frames are those of
 * proto/wire.h.
 *
 * Client side (net.c): a connection carries many requests at once, from any number
 * of threads. stk_rpc_send() puts a request on the wire; stk_rpc_recv() waits for
 * its reply, which may come after replies to requests sent later (they are matched
 * by request id). The two are split so that a caller can send a window of requests
 * (to one node or several) first and collect the replies after, which is how the
 * client library fans one large read out over many chains without threads. Every
 * request sent must be received (or its connection broken) before its buffers are
 * reused. Any transport failure (reset, timeout, malformed reply) breaks the
 * connection and fails every request waiting on it; a broken connection is closed
 * by the pool (stk_pool_put) or by its owner (stk_conn_close).
 *
 * Server side (server.c): a few event-loop threads own the connections and read
 * whole frames, a pool of workers runs the handlers, the loops write the replies;
 * see the top of server.c. A malformed frame closes that connection only.
 *
 * Thread rules: a stk_conn, a stk_pool and a stk_server may be used from any thread;
 * one stk_rpc is used by one thread at a time. stk_conn_close() only once nobody
 * else uses the connection.
 */
#ifndef STK_NET_H
#define STK_NET_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "../proto/codec.h"
#include "../proto/msg.h"
#include "../proto/wire.h"

struct stk_conn;

/*
 * The cluster keys this process holds (common/auth.h, docs/security.md). While it
 * holds any, stk_conn_connect() opens every connection with the key handshake: the
 * server must prove one of them, then this side proves the same one; a server that
 * has no key (a daemon run with --auth off) answers so and the connection goes on
 * without. A process holds the 8 keys added last (it talks to a few clusters at
 * once; one that meets many one after the other, a test runner, talks to the last).
 *
 * stk_net_auth_set: adds key (STK_AUTH_KEY_MIN..MAX bytes; copied), dropping the
 * one added longest ago when 8 are held. 0 or -EINVAL (length). stk_net_auth_load: reads a key file
 * (stk_auth_key_load) and adds its key; 0 or -errno with err set for a person.
 * stk_net_auth_keys: how many are held (a client identity counts as one). Any thread.
 */
int stk_net_auth_set(const uint8_t *key, size_t len);
int stk_net_auth_load(const char *path, char *err, size_t errlen);
int stk_net_auth_keys(void);
/*
 * The cluster key held last (key: STK_AUTH_KEY_MAX bytes), to issue client keys
 * with. 0, -EKEYREJECTED (none held) or -EPERM (this process is a client key's).
 */
int stk_net_auth_cluster_key(uint8_t *key, size_t *len);
/*
 * Strict mode, for the whole process from then on: a server that says it needs no
 * handshake (run with --auth off, or with no key) is refused (-EKEYREJECTED, with
 * a log line) instead of trusted, since it has proved nothing; and with no key
 * held, every connection fails so. Daemons holding a key are strict; clients on
 * request (STOKER_AUTH=strict, stk_client_opts.auth_strict). Any thread.
 */
void stk_net_auth_strict(void);
/*
 * A client identity (common/auth.h: a client key and the policy it is for): while
 * one is held, every connection this process opens proves it (AUTH_HELLO_CLIENT)
 * instead of a cluster key, and the daemons confine what it may do. Set by
 * stk_net_auth_load on a client key file; c NULL drops it; adding a cluster key
 * (stk_net_auth_set) drops it too. 0 or -EINVAL (a malformed policy).
 * stk_net_auth_client: 1 and *out (may be NULL) when one is held, else 0. Any thread.
 */
struct stk_auth_client;
int stk_net_auth_client_set(const struct stk_auth_client *c, const uint8_t key[32]);
int stk_net_auth_client(struct stk_auth_client *out);
/*
 * Servers: the client identities revoked (removed with `stoker admin client rm`),
 * as this node last learned them from mgmtd (mgmtd/agent.c; mgmtd itself from its
 * state). A handshake for (name, gen) in the list is refused. Replaces the list;
 * n 0 empties it. 0 or -ENOMEM. stk_net_client_revoked: 1 if (name, gen) is in it.
 */
int stk_net_clients_revoked_set(const struct stk_auth_client *revoked, uint32_t n);
int stk_net_client_revoked(const char *name, uint64_t gen);
/*
 * The client's side of the handshake on a connected blocking socket of the
 * caller's (tests that then write raw frames): 0 at once when no key is held.
 * stk_conn_connect's handshake errors.
 */
int stk_net_auth_fd(int fd, const char *addr);
/*
 * TLS (docs/security.md, net/tls.h) on every connection this process opens from
 * then on (stk_conn_connect and the loop client): on = 1, off = 0. TLS needs a
 * cluster key or a client key held (stk_net_auth_set, stk_net_auth_client_set):
 * its handshake proves the key both ways, in place of the key handshake; a daemon
 * that does not speak TLS is refused (-ECONNRESET or -EPROTO, logged). Daemons run
 * with tls = on set it, clients with STOKER_TLS=1 or stk_client_opts.tls. Any
 * thread; connections already open keep what they had.
 */
void stk_net_tls_set(int on);
int stk_net_tls(void);

/*
 * Connects to "HOST:PORT". timeout_ms bounds the connect; replies are awaited for
 * STOKER_RPC_TIMEOUT_MS (default 60000) before the connection is called broken.
 * With a cluster key held (stk_net_auth_set), the key handshake is done before it
 * returns. 0, or -ECONNREFUSED, -ETIMEDOUT, -EHOSTUNREACH, -EINVAL (bad address),
 * -ENOMEM, -EKEYREJECTED (the handshake failed: a wrong key, or a server that
 * requires one and this process holds none is refused at its first request),
 * -EPROTONOSUPPORT (the server requires TLS and this process does not speak it).
 * With TLS (stk_net_tls_set) the TLS handshake replaces the key handshake:
 * -EKEYREJECTED (no key held, or the server holds another), -ECONNRESET or
 * -EPROTO (a server without TLS, or a broken handshake); each logged.
 */
int stk_conn_connect(const char *addr, int timeout_ms, struct stk_conn **out);
void stk_conn_close(struct stk_conn *c);
int stk_conn_broken(const struct stk_conn *c);
const char *stk_conn_addr(const struct stk_conn *c);
/*
 * Shuts the connection down from any thread: every call waiting on it fails at
 * once with a transport error, and it is broken from then on (close it as usual).
 */
void stk_conn_abort(struct stk_conn *c);

/*
 * Calls that must not outwait a node the cluster gave up on (callwatch.c): each
 * call to a storage node is registered between its send and its reply (begin
 * returns a slot, or -1 when the watch is full and the call goes unwatched). Four
 * times a second, for each node with calls older than after_ms, the watch asks
 * gone(ctx, addr) (on its own thread; it may block) whether the node at addr is
 * still one to wait for; if it says 1, every such call's connection is aborted.
 */
struct stk_callwatch;
int stk_callwatch_create(unsigned after_ms, int (*gone)(void *ctx, const char *addr), void *ctx,
			 struct stk_callwatch **out);
void stk_callwatch_destroy(struct stk_callwatch *w);
/* In a child after fork(): the watch's thread anew, no call registered. */
void stk_callwatch_after_fork(struct stk_callwatch *w);
int stk_callwatch_begin(struct stk_callwatch *w, struct stk_conn *c, const char *addr);
/*
 * The same for a call on a connection of another kind (the loop client's): the
 * watch calls abort(arg) on its thread, under its lock, to end it; arg must stay
 * valid until stk_callwatch_end of the slot.
 */
int stk_callwatch_begin_fn(struct stk_callwatch *w, void (*abort)(void *arg), void *arg,
			   const char *addr);
void stk_callwatch_end(struct stk_callwatch *w, int slot);
/*
 * The watch of the connections this thread opens (NULL: none): stk_conn_connect
 * registers each one's key handshake with it, so that a handshake with a hung
 * node ends with the node, not at its 5 s deadline. Set it around a pool get.
 */
void stk_callwatch_set_thread(struct stk_callwatch *w);
struct stk_callwatch *stk_callwatch_thread(void);

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
	uint32_t resp_flags; /* the reply header's flags, set with resp_len */
	/* private: the connection's, between send and recv */
	struct stk_rpc *next_;
	int done_;
	int err_;
	int waiting_; /* its caller sleeps on cond_ */
	pthread_cond_t cond_;
};

/*
 * Sends the request; rpc->req_id is set. rpc, its request and its reply buffers
 * must stay as they are until stk_rpc_recv(c, rpc) returns. 0, or -errno: -ENOTCONN
 * (the connection is broken), -EMSGSIZE (too large to send), or a transport error
 * (the connection is then broken); on error there is nothing to receive.
 */
int stk_rpc_send(struct stk_conn *c, struct stk_rpc *rpc);
/*
 * Waits for the reply to rpc (sent on c) and has it in rpc->resp / rpc->bulk_in
 * (this thread or another may read it off the socket). Returns 0 when a
 * well-formed reply arrived (rpc->status says how the request went), or -errno for
 * a transport failure (the connection is then broken): -EPIPE/-ECONNRESET,
 * -ETIMEDOUT (no byte for STOKER_RPC_TIMEOUT_MS), -EBADMSG (malformed reply),
 * -EMSGSIZE (a reply larger than its request's buffers).
 */
int stk_rpc_recv(struct stk_conn *c, struct stk_rpc *rpc);
/* send + recv; returns the transport error, or the reply's status as -errno. */
int stk_rpc_call(struct stk_conn *c, struct stk_rpc *rpc);
/*
 * Sets rpc (all zero first) to send w's encoded message as opcode op, its reply's
 * payload landing in resp (cap bytes). rpc points at w's buffer and resp: both must
 * outlive the call. Bulk and frame flags, where wanted, are set after.
 */
void stk_rpc_prepare(struct stk_rpc *rpc, uint16_t op, const struct stk_wbuf *w, void *resp,
		     size_t cap);

/* Requests sent on c whose replies have not been received. */
unsigned stk_conn_pending(const struct stk_conn *c);

/*
 * Shared connections per address. stk_pool_get returns a reference to the
 * connection to addr with the fewest requests waiting, opening a new one when every
 * one has requests waiting and there are fewer than conns_per_addr (0: the
 * default, STK_POOL_DEFAULT_CONNS); 0, or stk_conn_connect's errors. stk_pool_put
 * drops the reference; a broken connection is closed once its last user has put
 * it. Callers send and receive on what they got, concurrently with others.
 */
#define STK_POOL_DEFAULT_CONNS 2
struct stk_pool;
int stk_pool_create(unsigned conns_per_addr, struct stk_pool **out);
void stk_pool_destroy(struct stk_pool *p);
int stk_pool_get(struct stk_pool *p, const char *addr, struct stk_conn **out);
void stk_pool_put(struct stk_pool *p, struct stk_conn *c);
/*
 * Retires every connection (when a peer is known to be gone or moved): later gets
 * open new ones; each retired one closes when its last user puts it.
 */
void stk_pool_flush(struct stk_pool *p);
/*
 * In a child after fork(): re-creates the pool's lock (which a parent thread may
 * have held) and forgets every connection (closing the child's descriptors), which
 * the parent keeps using. Only the forking thread exists then, so this is safe.
 */
void stk_pool_after_fork(struct stk_pool *p);

/* ---- calls from an event loop (loopclient.c) ---- */

/*
 * The loop client: a server's event loop calling other servers without blocking
 * (storage forwards changes down a chain with it). It owns one multiplexed
 * connection per peer address, opened on first use (connect and key handshake
 * without blocking), and calls the caller back, on the loop, when the reply
 * comes. See the top of loopclient.c.
 *
 * stk_lclient_create: registers its descriptors in epfd (level-triggered; the
 * caller's loop passes every event whose data.ptr it does not know to
 * stk_lclient_event). timeout_ms: a connection whose calls wait with no byte
 * moved for so long is dropped (0: STOKER_RPC_TIMEOUT_MS, default 60000). watch:
 * the call watch, or NULL. 0, -ENOMEM or -errno.
 *
 * stk_lclient_call: from any thread. Sends call; 0: call->done(call, rc) runs
 * exactly once, on the loop: rc 0 when a reply came (call->status says how the
 * request went, call->resp holds call->resp_len bytes of its payload), else a
 * transport error (-ECONNREFUSED, -ECONNRESET, -ETIMEDOUT, -EBADMSG, -EMSGSIZE,
 * -EKEYREJECTED, -ECANCELED when the client is destroyed). -errno: done never
 * runs: -EMSGSIZE (too large to send), -EINVAL (no address or done), -ESHUTDOWN
 * (being destroyed). call, its request and bulk and its resp buffer stay as they
 * are until done runs. Replies carry no bulk and at most 4 KiB of payload.
 *
 * stk_lclient_event: on the loop, an epoll event of epfd: 1 if it was the
 * client's (handled), 0 if not. stk_lclient_batch_end: on the loop, after the
 * events of one epoll_wait: frees the connections closed meanwhile (until then an
 * event of the batch may name one). stk_lclient_destroy: on the loop, or once it
 * stopped: every call not done is done with -ECANCELED, then it is freed.
 */
struct stk_lclient;
struct stk_lcall {
	uint16_t opcode;
	uint32_t frame_flags; /* STK_FRAME_BULK_SELF: the payload checksums the bulk */
	const void *req;
	size_t req_len;
	const void *bulk;
	size_t bulk_len;
	void *resp;
	size_t resp_cap;
	char addr[STK_ADDR_MAX]; /* the peer, "HOST:PORT" */
	void (*done)(struct stk_lcall *call, int rc);
	void *ctx; /* the caller's */
	size_t resp_len; /* out */
	uint32_t status; /* out: the reply's wire status */
	/* private: the client's */
	struct stk_lcall *next_;
	uint64_t req_id_;
	int slot_;
	uint8_t hb_[STK_FRAME_HDR_LEN];
};
int stk_lclient_create(int epfd, unsigned timeout_ms, struct stk_callwatch *watch,
		       struct stk_lclient **out);
int stk_lclient_call(struct stk_lclient *lc, struct stk_lcall *call);
int stk_lclient_event(struct stk_lclient *lc, void *tag, uint32_t events);
void stk_lclient_batch_end(struct stk_lclient *lc);
void stk_lclient_destroy(struct stk_lclient *lc);

/* ---- the routing table ---- */

struct stk_routing;

/*
 * Asks mgmtd for the routing table (MGMT_GET_ROUTING) over c, into *rt (free it with
 * stk_routing_free). The first call any client or node makes, so it lives with the
 * transport. 0, a transport error (net.h's), the reply's status as -errno, -EBADMSG
 * (the reply is no routing table: not a mgmtd) or -ENOMEM. src/net/routing.c.
 */
int stk_routing_fetch(struct stk_conn *c, struct stk_routing *rt);
/* The same over a connection of its own to addr, opened within timeout_ms, then closed. */
int stk_routing_fetch_from(const char *addr, int timeout_ms, struct stk_routing *rt);
/*
 * stk_routing_fetch from the leading mgmtd of list l, following it as
 * stk_mgmt_call does (net/mgmtaddr.h; *conn is that call's connection). Also
 * -EREMCHG: no mgmtd leads just now.
 */
struct stk_mgmt_addrs;
int stk_routing_fetch_leader(struct stk_mgmt_addrs *l, struct stk_conn **conn, int timeout_ms,
			     struct stk_routing *rt);

/* ---- server ---- */

struct stk_rpc_req {
	struct stk_frame_hdr hdr; /* hdr.flags & STK_FRAME_BULK_SELF: bulk not yet verified */
	struct stk_rbuf payload; /* decode the request from here */
	const uint8_t *bulk; /* valid until the handler returns */
	uint32_t bulk_len;
	const char *peer; /* "HOST:PORT" of the client */
	/*
	 * The client identity the connection proved (common/auth.h), or NULL for one
	 * that proved the cluster key or needed no handshake: services confine what
	 * such a client may do by it. Valid until the handler returns.
	 */
	const struct stk_auth_client *client;
	/* 1 when the handler took this request before and handed it back (requeue). */
	int requeued;
	/*
	 * With STK_FRAME_VOUCH in hdr.flags: the voucher record (STK_VOUCH_REC_LEN
	 * bytes, wire.h) that ended the payload, already taken off `payload`; NULL when
	 * the payload was too short to hold one (the handler refuses the request).
	 * Valid until the handler returns.
	 */
	const uint8_t *vouch;
};

struct stk_rpc_resp {
	struct stk_wbuf payload; /* encode the reply here (STK_MAX_PAYLOAD bytes) */
	/*
	 * Reply bulk: the reply is written after the handler returns, so this points into
	 * stk_rpc_resp_bulk_buf() or at memory that outlives the server.
	 */
	const void *bulk;
	uint32_t bulk_len;
	uint32_t frame_flags; /* STK_FRAME_BULK_SELF if the payload checksums the bulk */
	void *req_; /* private: the server's request */
};

/*
 * Counts a request of a client-key connection (req->client) that its policy
 * refused, in stoker_client_refused_total{reason}, and returns rc (the handler's
 * answer). Any thread, while the handler holds resp.
 */
enum {
	STK_CLIENT_REFUSED_RO,
	STK_CLIENT_REFUSED_OUTSIDE,
	STK_CLIENT_REFUSED_ADMIN,
	STK_CLIENT_REFUSED_NREASONS
};
int stk_rpc_client_refused(const struct stk_rpc_resp *resp, unsigned reason, int rc);

/*
 * A page-aligned buffer of at least len bytes (len <= STK_MAX_BULK) that lives until
 * the reply has been written, for a handler to read data into and point resp->bulk
 * at. A second call replaces the first buffer. NULL if out of memory.
 */
void *stk_rpc_resp_bulk_buf(struct stk_rpc_resp *resp, size_t len);

/*
 * Serves one request. Returns 0 to send the encoded reply with status OK, or
 * -errno to send that status with an empty payload and no bulk. A handler that
 * finds the payload malformed returns -EBADMSG: the client gets BADMSG and the
 * connection stays open, since the frame itself was sound.
 */
typedef int (*stk_rpc_handler_fn)(void *ctx, struct stk_rpc_req *req, struct stk_rpc_resp *resp);

/*
 * Loop-side handlers (optional): a service whose requests can often be answered
 * without blocking (a read whose file is open, served through io_uring) serves them
 * on the event loop that read them, and so spares them the hand-off to a worker.
 * Every call below runs on the thread that holds the loop at the time (threads may
 * take turns holding one loop, never two at once), so a loop's state needs no lock
 * of its own. None of them may block.
 */
#define STK_RPC_TO_WORKER 1 /* handle: this request needs a worker */
#define STK_RPC_PENDING 2 /* handle: the request was taken; answered by stk_rpc_pending_done */

/* A request a loop-side handler took (STK_RPC_PENDING), until stk_rpc_pending_done. */
struct stk_rpc_pending;

struct stk_server_loop_ops {
	/*
	 * Sets up loop number `loop` (from 0): *state is the service's state for it,
	 * *fd a descriptor the loop watches, calling event() when it is readable (-1:
	 * none). Called by stk_server_create. 0, or -errno: that loop then sends every
	 * request to the workers (the server still starts).
	 */
	int (*attach)(void *ctx, unsigned loop, void **state, int *fd);
	/* fd is readable. */
	void (*event)(void *ctx, void *state);
	/*
	 * Offered each request read whole that carries no bulk, before a worker sees it.
	 * Returns STK_RPC_TO_WORKER (nothing done: a worker runs the handler), 0 or
	 * -errno (answered now, as a handler's return), or STK_RPC_PENDING: the service
	 * keeps p and, on this loop and later, answers it with stk_rpc_pending_done
	 * exactly once. req is valid until then (req->payload's position as handle left
	 * it); resp only during this call, but a buffer from stk_rpc_resp_bulk_buf(resp)
	 * lives until the reply is written.
	 */
	int (*handle)(void *ctx, void *state, struct stk_rpc_req *req, struct stk_rpc_resp *resp,
		      struct stk_rpc_pending *p);
	/* Called once at the end of a round in which handle took requests (submit them). */
	void (*flush)(void *ctx, void *state);
	/*
	 * stk_server_destroy, after the loops stopped: answer every pending request
	 * (stk_rpc_pending_done; they are dropped, not sent) and free the state.
	 */
	void (*detach)(void *ctx, void *state);
};

/*
 * On the loop that took p: a reply to encode p's answer into (payload over a buffer
 * of the loop's; bulk unset: point it at stk_rpc_resp_bulk_buf's buffer or memory
 * that outlives the server). Valid until stk_rpc_pending_done(p).
 */
struct stk_rpc_resp *stk_rpc_pending_resp(struct stk_rpc_pending *p);
/*
 * Answers p: with rc 0, what was encoded into stk_rpc_pending_resp(p) (or an empty
 * payload if it was never asked for), else status rc. p is gone after.
 */
void stk_rpc_pending_done(struct stk_rpc_pending *p, int rc);

/*
 * Requests a worker's handler hands on (storage: a write that waits for its
 * successor in the chain on the event loop, not in the worker). In a handler run
 * by a worker, stk_rpc_pending_take(resp) takes the request out of the handler's
 * hands: the handler must then return STK_RPC_PENDING (and touch req and resp no
 * more: another thread may answer the request at once), and the request (req->payload
 * as it stands, req->bulk, req->peer) stays valid until it is answered, from any
 * thread, with stk_rpc_pending_answer exactly once. A loop-side handler's p may be
 * answered so too (from any thread, unlike stk_rpc_pending_done).
 *
 * stk_rpc_pending_answer: answers p with status rc, or with rc 0 with the len
 * bytes at payload (copied; at most STK_MAX_PAYLOAD) as the reply's payload and no
 * bulk. p is gone after.
 *
 * stk_rpc_pending_defer: from any thread, runs fn(p, arg, 0) on a worker of p's
 * server (queued behind the requests that wait for one), which then answers p or
 * passes it on. While the server stops, fn(p, arg, -ESHUTDOWN) runs instead, on
 * the calling thread: fn must then release what arg holds without blocking and
 * answer p (the answer is dropped). fn runs exactly once either way.
 *
 * stk_rpc_pending_loop: the service's loop-side state (loop_ops attach) of the
 * loop that owns p's connection, or NULL when that loop has none. Any thread.
 * stk_rpc_resp_loop: the same for the request of a handler's resp, before any
 * take (a handler that needs its loop to go on may first look whether it has one).
 */
struct stk_rpc_pending *stk_rpc_pending_take(struct stk_rpc_resp *resp);
void stk_rpc_pending_answer(struct stk_rpc_pending *p, int rc, const void *payload, size_t len);
typedef void (*stk_rpc_defer_fn)(struct stk_rpc_pending *p, void *arg, int rc);
void stk_rpc_pending_defer(struct stk_rpc_pending *p, stk_rpc_defer_fn fn, void *arg);
/*
 * stk_rpc_pending_requeue: from any thread, hands a taken p back to the workers,
 * whose handler then serves it again from the start, as it came, with
 * req->requeued set (storage/qos.c: a throttled request, once its wait is over).
 * While the server stops, p is answered ESHUTDOWN instead.
 */
void stk_rpc_pending_requeue(struct stk_rpc_pending *p);
void *stk_rpc_pending_loop(struct stk_rpc_pending *p);
void *stk_rpc_resp_loop(const struct stk_rpc_resp *resp);
struct stk_metrics_ops;

struct stk_server_opts {
	size_t size; /* sizeof(struct stk_server_opts) */
	const char *listen; /* "HOST:PORT"; port 0 picks a free port */
	stk_rpc_handler_fn handler;
	void *ctx;
	unsigned max_conns; /* 0 = 65536; more are accepted and closed at once */
	/*
	 * Optional: counts every request (opcode, status, bytes, latency) and connection
	 * into this set (common/metrics.h, stk_metrics_rpc_create). Must outlive the server.
	 */
	struct stk_metrics_ops *metrics;
	/* Event-loop threads; 0 = one per core. STOKER_NET_LOOPS overrides. */
	unsigned loops;
	/*
	 * Handler threads always running (0 = 16; STOKER_NET_WORKERS overrides), and how
	 * many there may be while requests wait for one (0 = workers: a fixed pool). A
	 * service whose handlers wait for other requests (meta: a change waits for a
	 * holder's acknowledgement) needs max_workers above what may wait at once.
	 */
	unsigned workers;
	unsigned max_workers;
	/*
	 * Threads more, while handlers wait on other servers between
	 * stk_server_wait_begin() and _end() (storage: a change forwarded down a chain,
	 * whose successor may be waiting on this node's workers in turn). The pool grows
	 * past max_workers only to stand in for waiting workers, never for load alone.
	 */
	unsigned max_waiting;
	/* Requests read and not yet answered per connection before it is read again; 0 = 128. */
	unsigned window;
	/* Bytes held by all requests before no new frame is read; 0 = 1 GiB. */
	uint64_t max_inflight_bytes;
	/*
	 * A connection whose reply has waited this long with no byte taken by the peer is
	 * closed; 0 = 30000. STOKER_NET_SEND_TIMEOUT_MS overrides.
	 */
	unsigned send_timeout_ms;
	/*
	 * Loop-side handlers, or NULL: every request goes to a worker (as with
	 * STOKER_LOOP_READS=0, which overrides). Must outlive the server.
	 */
	const struct stk_server_loop_ops *loop_ops;
	/*
	 * The cluster key (common/auth.h), or NULL and 0: every connection must pass the
	 * key handshake before any other request is served (see the top of server.c).
	 * Copied: need not outlive the call.
	 */
	const uint8_t *auth_key;
	size_t auth_key_len;
	/*
	 * 1: every connection must open with a TLS handshake on the cluster key (which
	 * auth_key must then hold; docs/security.md): a peer that speaks plaintext is
	 * answered TLS_REQUIRED and closed. 0: plaintext, as without this field.
	 */
	int tls;
};

struct stk_server;
/*
 * Binds and listens. 0, or -EADDRINUSE ("port in use"), -EADDRNOTAVAIL, -EINVAL
 * (malformed address), -EACCES.
 */
int stk_server_create(const struct stk_server_opts *opts, struct stk_server **out);
/* The bound "HOST:PORT" (useful with port 0). Valid until destroy. */
const char *stk_server_addr(const struct stk_server *s);
/*
 * Starts the workers and the loops, runs the first loop on the calling thread and
 * returns once stk_server_stop() was called and every loop has stopped (replies in
 * flight are not waited for). 0 or -errno.
 */
int stk_server_run(struct stk_server *s);
/*
 * Called by a handler around a wait on another server (see max_waiting): while it
 * waits, another thread may take requests in its place. No-op outside a handler.
 */
void stk_server_wait_begin(void);
void stk_server_wait_end(void);
/* Makes stk_server_run return. Async-signal-safe. */
void stk_server_stop(struct stk_server *s);
/*
 * Closes the listener, lets the workers finish the handlers they run (requests not
 * yet started are dropped), closes every connection and frees the server. After
 * stk_server_run() returned, or if it never ran.
 */
void stk_server_destroy(struct stk_server *s);

#endif
