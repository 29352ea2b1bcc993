/*
 * The storage daemon: opens its target folders, registers them with mgmtd through
 * the node agent, and serves STOR_* requests on them.
 *
 * A request names a chain and the chain version the client routed with; the node
 * serves it on the chain's head target, which must be one of its own. When the
 * client's table and ours disagree, the side that is behind must refresh: if the
 * client knows a chain we do not, or a newer version of it, or names a head we do
 * not hold, our table may be the stale one, so it is refreshed once and the
 * request looked up again; otherwise the client gets STALE_ROUTING and refreshes
 * its own.
 *
 * Each request runs on its connection's thread (net.h), so a handler may block on
 * disk; the chunk store does the I/O with that thread's buffers.
 */
#include "storage.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../daemon/daemon.h"
#include "../common/host.h"
#include "../common/layout.h"
#include "../common/log.h"
#include "../common/metrics.h"
#include "../common/util.h"
#include "../mgmtd/agent.h"
#include "../net/net.h"
#include "../proto/msg.h"
#include "aio.h"
#include "chunk.h"
#include "metrics.h"

struct storage {
	struct stk_chunk_store **stores; /* one per target folder, in the order given */
	unsigned nstores;
	struct stk_agent *agent;
	struct stk_storage_metrics *metrics; /* NULL without --metrics */
	struct stk_metrics_ops *rpc_metrics; /* NULL without --metrics; for per-client counts */
};

/*
 * The agent's view of our targets: ids, figures and paths, for register and
 * heartbeats. Each target reports the whole of its folder's file system, and that
 * file system's device id: targets that share one (the four of `stoker up`, several
 * per disk, or several storage nodes on one machine) are told apart from targets on
 * other devices by it, and whoever adds the figures up (a mount's statfs, `stoker
 * status`, mgmtd's cluster totals: stk_host_space_sum) counts each device once, over
 * the whole cluster. A folder that cannot be stat'ed reports zeros and device 0.
 */
static uint32_t report_targets(void *ctx, struct stk_msg_target_info *out, uint32_t max)
{
	struct storage *s = ctx;
	uint32_t n = STK_MIN(s->nstores, max);

	for (uint32_t i = 0; i < n; i++) {
		struct stk_chunk_store *cs = s->stores[i];
		struct stk_msg_target_info *t = &out[i];
		uint64_t cap, used;

		memset(t, 0, sizeof(*t));
		t->target_id = stk_chunk_store_id(cs);
		if (stk_chunk_store_stat(cs, &cap, &used, &t->chunks))
			t->chunks = 0;
		stk_strlcpy(t->path, stk_chunk_store_path(cs), sizeof(t->path));
		if (stk_host_fs_space(t->path, &t->capacity, &t->used, &t->avail, &t->dev))
			t->capacity = t->used = t->avail = t->dev = 0;
	}
	return n;
}

static struct stk_chunk_store *local_target(struct storage *s, uint32_t target_id)
{
	for (unsigned i = 0; i < s->nstores; i++)
		if (target_id && stk_chunk_store_id(s->stores[i]) == target_id)
			return s->stores[i];
	return NULL;
}

/*
 * One look at our routing table for the target that serves chain_id here (with
 * check_ver, the client's chain version must match ours). 0, -ESTALE (the client
 * is behind) or -EAGAIN (our table may be the one behind: refresh and look again).
 */
static int route_look(struct storage *s, uint32_t chain_id, int check_ver, uint32_t chain_ver,
		      struct stk_chunk_store **out)
{
	struct stk_routing_ref *ref = stk_agent_routing_get(s->agent);
	const struct stk_rt_chain *c = stk_routing_chain(&ref->rt, chain_id);
	struct stk_chunk_store *cs = NULL;
	int ours_behind;

	if (!c || c->ntargets == 0) {
		ours_behind = 1;
	} else if (check_ver && c->version != chain_ver) {
		ours_behind = chain_ver > c->version;
	} else {
		cs = local_target(s, c->targets[0]);
		ours_behind = !cs;
	}
	stk_agent_routing_put(s->agent, ref);
	if (cs) {
		*out = cs;
		return 0;
	}
	return ours_behind ? -EAGAIN : -ESTALE;
}

/* route_look, refreshing our table once where it may be behind (blocks). 0 or -ESTALE. */
static int route(struct storage *s, uint32_t chain_id, int check_ver, uint32_t chain_ver,
		 struct stk_chunk_store **out)
{
	int rc = route_look(s, chain_id, check_ver, chain_ver, out);

	if (rc != -EAGAIN)
		return rc;
	stk_agent_routing_refresh(s->agent);
	rc = route_look(s, chain_id, check_ver, chain_ver, out);
	return rc == -EAGAIN ? -ESTALE : rc;
}

/* Block checksums of one request or reply: at most a 64 MiB chunk's worth. */
#define STK_MAX_CRCS (STK_MAX_CHUNK_SIZE / STK_CRC_BLOCK)
static __thread uint32_t tls_crcs[STK_MAX_CRCS];

static int handle_write(struct storage *s, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	struct stk_msg_stor_write_req rq;
	struct stk_msg_stor_write_resp rp;
	struct stk_chunk_store *cs;
	uint64_t t0;
	long bad;
	int rc;

	if (stk_msg_stor_write_req_dec(&req->payload, &rq))
		return -EBADMSG;
	if (rq.length != req->bulk_len || rq.length > STK_MAX_CHUNK_SIZE ||
	    rq.ncrcs != stk_crc_blocks(rq.length))
		return -EBADMSG;
	for (uint32_t i = 0; i < rq.ncrcs; i++)
		tls_crcs[i] = stk_get_u32(&req->payload);
	if (stk_rbuf_finish(&req->payload))
		return -EBADMSG;
	if (rq.flags & ~STK_WRITE_SYNC)
		return -EINVAL;
	bad = stk_crc32c_blocks_check(req->bulk, rq.length, STK_CRC_BLOCK, tls_crcs);
	if (bad >= 0) {
		stk_warn("write from %s: data checksum mismatch (ino 0x%llx chunk %u block %ld): "
			 "refused",
			 req->peer, (unsigned long long)rq.ino, rq.chunk_idx, bad);
		return -EBADMSG;
	}
	rc = route(s, rq.chain_id, 1, rq.chain_ver, &cs);
	if (rc)
		return rc;
	t0 = stk_storage_metrics_begin(s->metrics, cs);
	rc = stk_chunk_write(cs, rq.ino, rq.chunk_idx, rq.chunk_size, rq.offset, req->bulk,
			     rq.length, tls_crcs, rq.flags, &rp.chunk_len);
	stk_storage_metrics_end(s->metrics, cs, STK_TARGET_WRITE, t0, rc, rq.length);
	if (rc)
		return rc;
	return stk_msg_stor_write_resp_enc(&resp->payload, &rp);
}

static int handle_read(struct storage *s, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	struct stk_msg_stor_read_req rq;
	struct stk_msg_stor_read_resp rp;
	struct stk_chunk_store *cs;
	uint64_t t0;
	void *buf;
	long n;
	int rc;

	if (stk_msg_stor_read_req_dec(&req->payload, &rq) || stk_rbuf_finish(&req->payload))
		return -EBADMSG;
	if (rq.length > STK_MAX_CHUNK_SIZE)
		return -EINVAL;
	rc = route(s, rq.chain_id, 1, rq.chain_ver, &cs);
	if (rc)
		return rc;
	buf = stk_rpc_resp_bulk_buf(resp, rq.length ? rq.length : 1);
	if (!buf)
		return -ENOMEM;
	t0 = stk_storage_metrics_begin(s->metrics, cs);
	n = stk_chunk_read(cs, rq.ino, rq.chunk_idx, rq.offset, buf, rq.length, tls_crcs);
	stk_storage_metrics_end(s->metrics, cs, STK_TARGET_READ, t0, n, n > 0 ? (uint64_t)n : 0);
	if (n < 0)
		return (int)n;
	rp.ncrcs = stk_crc_blocks((uint64_t)n);
	stk_msg_stor_read_resp_enc(&resp->payload, &rp);
	for (uint32_t i = 0; i < rp.ncrcs; i++)
		stk_put_u32(&resp->payload, tls_crcs[i]);
	resp->bulk = buf;
	resp->bulk_len = (uint32_t)n;
	resp->frame_flags = STK_FRAME_BULK_SELF;
	return resp->payload.err;
}

static int handle_prefetch(struct storage *s, struct stk_rpc_req *req)
{
	struct stk_msg_stor_prefetch_req rq;
	struct stk_chunk_store *cs;

	if (stk_msg_stor_prefetch_req_dec(&req->payload, &rq) || stk_rbuf_finish(&req->payload))
		return -EBADMSG;
	if (route(s, rq.chain_id, 1, rq.chain_ver, &cs))
		return 0; /* a hint for a chain we do not serve is simply dropped */
	stk_chunk_prefetch(cs, rq.ino, rq.chunk_idx);
	return 0;
}

/*
 * The fence on chunk removal: a truncation must carry the identity of the namespace
 * shard 1 holds (msg.h, STOR_TRUNCATE). Why here and not only in mgmtd: chunks are
 * named by inode number, and a meta serving another store (an empty one, say) hands
 * out the same numbers; whoever removes the chunks of "its" inode 3 would remove
 * those of the real inode 3. A mismatch may be this node's table being behind (a
 * shard that got its identity just now), so the table is fetched once more first.
 */
static int fence(struct storage *s, uint64_t ns_hi, uint64_t ns_lo, uint64_t ino,
		 const char *peer)
{
	struct stk_ns_id got = {.hi = ns_hi, .lo = ns_lo}, want = {0, 0};
	char a[STK_NS_ID_STR], b[STK_NS_ID_STR];

	for (int attempt = 0; attempt < 2; attempt++) {
		struct stk_routing_ref *ref = stk_agent_routing_get(s->agent);

		for (uint32_t i = 0; i < ref->rt.nshards; i++)
			if (ref->rt.shards[i].id == 1)
				want = ref->rt.shards[i].ns;
		stk_agent_routing_put(s->agent, ref);
		if (!stk_ns_id_is_zero(&want) && stk_ns_id_eq(&want, &got))
			return 0;
		if (attempt == 0)
			stk_agent_routing_refresh(s->agent);
	}
	stk_warn("chunk removal of inode %llx from %s refused: it names namespace %s, but shard "
		 "1 is namespace %s",
		 (unsigned long long)ino, peer, stk_ns_id_str(&got, a),
		 stk_ns_id_is_zero(&want) ? "(not known yet)" : stk_ns_id_str(&want, b));
	return -EPERM;
}

static int handle_truncate(struct storage *s, struct stk_rpc_req *req)
{
	struct stk_msg_stor_truncate_req rq;
	struct stk_chunk_store *cs;
	int rc;

	if (stk_msg_stor_truncate_req_dec(&req->payload, &rq) || stk_rbuf_finish(&req->payload))
		return -EBADMSG;
	rc = fence(s, rq.ns_hi, rq.ns_lo, rq.ino, req->peer);
	if (rc)
		return rc;
	rc = route(s, rq.chain_id, 1, rq.chain_ver, &cs);
	if (rc)
		return rc;
	return stk_chunk_truncate(cs, rq.ino, rq.size, rq.chunk_size);
}

static int handle_truncates(struct storage *s, struct stk_rpc_req *req)
{
	struct stk_msg_stor_truncates_req rq;
	struct stk_msg_trunc_rec *recs = NULL;
	struct stk_chunk_store *cs;
	int first = 0, rc;

	rc = stk_msg_stor_truncates_req_dec(&req->payload, &rq);
	if (rc == 0 && rq.n > STK_TRUNCATES_MAX)
		rc = -EBADMSG;
	if (rc == 0 && rq.n) {
		recs = calloc(rq.n, sizeof(*recs));
		if (!recs)
			return -ENOMEM;
	}
	for (uint32_t i = 0; rc == 0 && i < rq.n; i++)
		rc = stk_msg_trunc_rec_dec(&req->payload, &recs[i]);
	/* All of it decoded before anything goes: a malformed request truncates nothing. */
	if (rc || stk_rbuf_finish(&req->payload)) {
		free(recs);
		return -EBADMSG;
	}
	rc = fence(s, rq.ns_hi, rq.ns_lo, rq.n ? recs[0].ino : 0, req->peer);
	if (rc == 0)
		rc = route(s, rq.chain_id, 1, rq.chain_ver, &cs);
	for (uint32_t i = 0; rc == 0 && i < rq.n; i++) {
		int r = stk_chunk_truncate(cs, recs[i].ino, recs[i].size, recs[i].chunk_size);

		if (r && !first)
			first = r;
	}
	free(recs);
	return rc ? rc : first;
}

static int handle_punch(struct storage *s, struct stk_rpc_req *req)
{
	struct stk_msg_stor_punch_req rq;
	struct stk_chunk_store *cs;
	int rc;

	if (stk_msg_stor_punch_req_dec(&req->payload, &rq) || stk_rbuf_finish(&req->payload))
		return -EBADMSG;
	rc = route(s, rq.chain_id, 1, rq.chain_ver, &cs);
	if (rc)
		return rc;
	return stk_chunk_punch(cs, rq.ino, rq.first, rq.end);
}

static int handle_sync(struct storage *s, struct stk_rpc_req *req)
{
	struct stk_msg_stor_sync_req rq;
	struct stk_chunk_store *cs;
	int rc;

	if (stk_msg_stor_sync_req_dec(&req->payload, &rq) || stk_rbuf_finish(&req->payload))
		return -EBADMSG;
	rc = route(s, rq.chain_id, 0, 0, &cs);
	if (rc)
		return rc;
	return stk_chunk_store_sync(cs);
}

static int storage_dispatch(struct storage *s, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	switch (req->hdr.opcode) {
	case STK_OP_STOR_WRITE:
		return handle_write(s, req, resp);
	case STK_OP_STOR_READ:
		return handle_read(s, req, resp);
	case STK_OP_STOR_TRUNCATE:
		return handle_truncate(s, req);
	case STK_OP_STOR_TRUNCATES:
		return handle_truncates(s, req);
	case STK_OP_STOR_PUNCH:
		return handle_punch(s, req);
	case STK_OP_STOR_SYNC:
		return handle_sync(s, req);
	case STK_OP_STOR_PREFETCH:
		return handle_prefetch(s, req);
	default:
		return -ENOSYS;
	}
}

static int storage_handle(void *ctx, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	struct storage *s = ctx;
	int rc = storage_dispatch(s, req, resp);

	/* Sizes as net.c counts them: a failed request is answered with a bare header. */
	stk_metrics_ops_client(s->rpc_metrics, req->peer,
			       STK_FRAME_HDR_LEN + (uint64_t)req->hdr.payload_len + req->bulk_len,
			       STK_FRAME_HDR_LEN +
				   (rc ? 0 : (uint64_t)resp->payload.len + resp->bulk_len));
	return rc;
}

/* ---- reads on the event loops ---- */

/*
 * A read of a chunk whose file is open (stk_chunk_read_begin) is served on the
 * event loop that read the request: its bytes are read through the loop's io_uring
 * (aio.h) straight into the reply's buffer, checked when they arrive, and the reply
 * leaves from the loop, so the request never waits for a worker. Anything that
 * might block goes to the workers as before (net.h, STK_RPC_TO_WORKER): a chunk
 * not open yet (opening it reads the disk), a routing table that may need
 * fetching, reads over LOOP_READ_MAX (their checksums would hold the loop long),
 * and all writes, truncates and syncs. STOKER_LOOP_READS=0 turns it off.
 *
 * Memory: LOOP_READS slots per loop of about 9 KiB each (the partial first and
 * last blocks of a read are read into the slot), made when the loop starts.
 */
#define LOOP_READS 256u
#define LOOP_READ_MAX (256u << 10)

struct loop_read {
	struct loop_read *next; /* free list */
	struct storage_loop *sl;
	struct stk_rpc_pending *p;
	struct stk_chunk_store *cs;
	const char *peer;
	uint32_t req_bytes;
	uint64_t t0;
	void *buf;
	struct stk_chunk_aread ar;
	uint32_t crcs[LOOP_READ_MAX / STK_CRC_BLOCK];
};

struct storage_loop {
	struct storage *s;
	struct stk_aio *aio;
	struct loop_read *free;
	struct loop_read reads[LOOP_READS];
};

/* Counts a request answered on a loop per client, as storage_handle does. */
static void loop_count(struct storage *s, const char *peer, uint32_t req_bytes, int rc,
		       const struct stk_rpc_resp *resp)
{
	stk_metrics_ops_client(s->rpc_metrics, peer, req_bytes,
			       STK_FRAME_HDR_LEN +
				   (rc || !resp ? 0 : (uint64_t)resp->payload.len + resp->bulk_len));
}

/* Encodes a read's reply: n bytes at buf, their block checksums crcs. */
static int read_reply(struct stk_rpc_resp *resp, void *buf, long n, const uint32_t *crcs)
{
	struct stk_msg_stor_read_resp rp;

	rp.ncrcs = stk_crc_blocks((uint64_t)n);
	stk_msg_stor_read_resp_enc(&resp->payload, &rp);
	for (uint32_t i = 0; i < rp.ncrcs; i++)
		stk_put_u32(&resp->payload, crcs[i]);
	resp->bulk = buf;
	resp->bulk_len = (uint32_t)n;
	resp->frame_flags = STK_FRAME_BULK_SELF;
	return resp->payload.err;
}

/* The read's bytes arrived (got), or its error: checked, answered, slot freed. */
static void loop_read_done(void *arg, long got)
{
	struct loop_read *lr = arg;
	struct storage_loop *sl = lr->sl;
	struct stk_rpc_resp *resp = NULL;
	long n = stk_chunk_read_end(lr->cs, &lr->ar, got, lr->crcs);
	int rc = n < 0 ? (int)n : 0;

	stk_storage_metrics_end(sl->s->metrics, lr->cs, STK_TARGET_READ, lr->t0, n,
				n > 0 ? (uint64_t)n : 0);
	if (rc == 0) {
		resp = stk_rpc_pending_resp(lr->p);
		rc = read_reply(resp, lr->buf, n, lr->crcs);
	}
	loop_count(sl->s, lr->peer, lr->req_bytes, rc, resp);
	stk_rpc_pending_done(lr->p, rc);
	lr->next = sl->free;
	sl->free = lr;
}

static int loop_read(struct storage_loop *sl, struct stk_rpc_req *req, struct stk_rpc_resp *resp,
		     struct stk_rpc_pending *p)
{
	struct storage *s = sl->s;
	struct stk_msg_stor_read_req rq;
	struct loop_read *lr = sl->free;
	struct stk_chunk_store *cs;
	void *buf;
	int rc;

	if (stk_msg_stor_read_req_dec(&req->payload, &rq) || stk_rbuf_finish(&req->payload))
		return STK_RPC_TO_WORKER; /* the worker answers it as it would any other */
	if (!lr || rq.length > LOOP_READ_MAX || rq.length == 0)
		return STK_RPC_TO_WORKER;
	if (route_look(s, rq.chain_id, 1, rq.chain_ver, &cs))
		return STK_RPC_TO_WORKER; /* a refresh, or the reply that says the client must */
	buf = stk_rpc_resp_bulk_buf(resp, rq.length);
	if (!buf)
		return STK_RPC_TO_WORKER;
	rc = stk_chunk_read_begin(cs, rq.ino, rq.chunk_idx, rq.offset, buf, rq.length, &lr->ar);
	if (rc < 0)
		return STK_RPC_TO_WORKER; /* not open here, or an error the worker reports */
	lr->t0 = stk_storage_metrics_begin(s->metrics, cs);
	if (rc == 0) { /* at or past the chunk's end */
		stk_storage_metrics_end(s->metrics, cs, STK_TARGET_READ, lr->t0, 0, 0);
		rc = read_reply(resp, buf, 0, NULL);
		loop_count(s, req->peer, STK_FRAME_HDR_LEN + req->hdr.payload_len, rc, resp);
		return rc;
	}
	lr->p = p;
	lr->cs = cs;
	lr->buf = buf;
	lr->peer = req->peer;
	lr->req_bytes = STK_FRAME_HDR_LEN + req->hdr.payload_len;
	if (stk_aio_readv(sl->aio, lr->ar.fd, lr->ar.iov, lr->ar.niov, lr->ar.file_off,
			  loop_read_done, lr)) {
		stk_chunk_read_cancel(cs, &lr->ar);
		stk_storage_metrics_end(s->metrics, cs, STK_TARGET_READ, lr->t0, -EAGAIN, 0);
		return STK_RPC_TO_WORKER;
	}
	sl->free = lr->next;
	return STK_RPC_PENDING;
}

static int loop_handle(void *ctx, void *state, struct stk_rpc_req *req, struct stk_rpc_resp *resp,
		       struct stk_rpc_pending *p)
{
	if (req->hdr.opcode == STK_OP_STOR_READ)
		return loop_read(state, req, resp, p);
	return STK_RPC_TO_WORKER;
}

static int loop_attach(void *ctx, unsigned loop, void **state, int *fd)
{
	struct storage_loop *sl = calloc(1, sizeof(*sl));
	int rc;

	if (!sl)
		return -ENOMEM;
	sl->s = ctx;
	rc = stk_aio_create(LOOP_READS, &sl->aio, fd);
	if (rc) {
		static int told;
		if (!told++)
			stk_warn("io_uring is not available (%s): reads are served by the "
				 "worker threads",
				 strerror(-rc));
		free(sl);
		return rc;
	}
	for (unsigned i = 0; i < LOOP_READS; i++) {
		sl->reads[i].sl = sl;
		sl->reads[i].next = sl->free;
		sl->free = &sl->reads[i];
	}
	*state = sl;
	return 0;
}

static void loop_event(void *ctx, void *state)
{
	struct storage_loop *sl = state;

	stk_aio_reap(sl->aio);
}

static void loop_flush(void *ctx, void *state)
{
	struct storage_loop *sl = state;

	stk_aio_submit(sl->aio);
}

static void loop_detach(void *ctx, void *state)
{
	struct storage_loop *sl = state;

	stk_aio_destroy(sl->aio); /* every read in flight is answered */
	free(sl);
}

static const struct stk_server_loop_ops storage_loop_ops = {
	.attach = loop_attach,
	.event = loop_event,
	.handle = loop_handle,
	.flush = loop_flush,
	.detach = loop_detach,
};

/* ---- startup ---- */

/* Reads data_dir/node.id; *id stays 0 if there is none. */
static int read_node_id(const char *path, uint32_t *id)
{
	char buf[32];
	uint64_t v;
	long got;
	int fd;

	*id = 0;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return errno == ENOENT ? 0 : -errno;
	got = stk_read_full(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (got < 0)
		return (int)got;
	buf[got] = 0;
	while (got > 0 && (buf[got - 1] == '\n' || buf[got - 1] == ' '))
		buf[--got] = 0;
	if (stk_parse_u64(buf, &v) || v == 0 || v > UINT32_MAX)
		return -EBADMSG;
	*id = (uint32_t)v;
	return 0;
}

static int write_node_id(const char *path, uint32_t id)
{
	char buf[16];
	int n = snprintf(buf, sizeof(buf), "%u\n", id);

	return stk_write_file_atomic(path, buf, (size_t)n);
}

/* Opens every target folder; refuses the same folder or target id twice. */
static int open_targets(struct storage *s, const struct stk_storage_opts *opts)
{
	int rc;

	s->stores = calloc(opts->ntargets, sizeof(*s->stores));
	if (!s->stores)
		return -ENOMEM;
	for (unsigned i = 0; i < opts->ntargets; i++) {
		struct stk_chunk_store *cs;

		rc = stk_chunk_store_open(opts->targets[i], &cs);
		if (rc) {
			stk_error("cannot open target folder %s: %s", opts->targets[i],
				  strerror(-rc));
			return rc;
		}
		s->stores[s->nstores++] = cs;
		for (unsigned j = 0; j < i; j++) {
			struct stk_chunk_store *o = s->stores[j];
			uint32_t id = stk_chunk_store_id(cs);

			if (strcmp(stk_chunk_store_path(o), stk_chunk_store_path(cs)) == 0 ||
			    (id && stk_chunk_store_id(o) == id)) {
				stk_error("target folders %s and %s are the same target",
					  stk_chunk_store_path(o), stk_chunk_store_path(cs));
				return -EINVAL;
			}
		}
	}
	return 0;
}

/* What start-up carries from stk_storage_run to its hooks. */
struct storage_boot {
	struct storage *s;
	const struct stk_storage_opts *opts;
	char node_path[PATH_MAX]; /* data_dir/node.id */
	uint32_t node_id;	  /* 0 until mgmtd gave one */
	uint32_t *ids;		  /* the target ids mgmtd gave, in the order of opts->targets */
};

static int storage_metrics(void *ctx, struct stk_daemon *d)
{
	struct storage_boot *b = ctx;

	b->s->rpc_metrics = stk_daemon_rpc_metrics(d);
	return 0;
}

/* Registers with mgmtd, keeps the ids it gave, and says what the node serves. */
static int storage_start(void *ctx, struct stk_daemon *d)
{
	struct storage_boot *b = ctx;
	struct storage *s = b->s;
	const char *maddr = stk_daemon_metrics_addr(d);
	struct stk_agent_opts ao;
	int rc;

	memset(&ao, 0, sizeof(ao));
	ao.size = sizeof(ao);
	ao.mgmtd = b->opts->mgmtd;
	ao.role = STK_ROLE_STORAGE;
	ao.addr = stk_daemon_addr(d);
	ao.node_id = b->node_id;
	ao.targets = report_targets;
	ao.ctx = s;
	ao.host_id = b->opts->host_id;
	rc = stk_agent_start(&ao, &s->agent, &b->node_id, b->ids, b->opts->ntargets);
	if (rc) {
		s->agent = NULL;
		return rc; /* -EINTR: stopped before serving */
	}
	rc = write_node_id(b->node_path, b->node_id);
	if (rc) {
		stk_error("cannot write %s: %s", b->node_path, strerror(-rc));
		return rc;
	}
	for (unsigned i = 0; i < s->nstores; i++) {
		if (b->ids[i] == stk_chunk_store_id(s->stores[i]))
			continue;
		rc = stk_chunk_store_set_id(s->stores[i], b->ids[i]);
		if (rc) {
			stk_error("cannot write %s/target.id: %s",
				  stk_chunk_store_path(s->stores[i]), strerror(-rc));
			return rc;
		}
	}
	/* Per-target series are named by target id, known from here on. */
	if (maddr && (rc = stk_storage_metrics_create(s->stores, s->nstores, &s->metrics))) {
		stk_error("cannot set up target metrics: %s", strerror(-rc));
		return rc;
	}
	for (unsigned i = 0; i < s->nstores; i++) {
		uint64_t cap = 0, used = 0, chunks = 0;
		char cb[32];

		stk_chunk_store_stat(s->stores[i], &cap, &used, &chunks);
		stk_info("target %u: %s (%llu chunks, %s)", stk_chunk_store_id(s->stores[i]),
			 stk_chunk_store_path(s->stores[i]), (unsigned long long)chunks,
			 stk_format_size(cap, cb, sizeof(cb)));
	}
	stk_info("storage node %u serving on %s%s%s", b->node_id, stk_daemon_addr(d),
		 maddr ? ", metrics on " : "", maddr ? maddr : "");
	return 0;
}

int stk_storage_run(const struct stk_storage_opts *opts)
{
	struct stk_daemon_spec spec;
	struct stk_server_opts so;
	struct storage_boot b;
	struct storage *s;
	int rc;

	stk_daemon_init("storage");
	if (!opts || opts->size < sizeof(*opts) || !opts->listen || !opts->mgmtd ||
	    !opts->data_dir || !opts->targets || opts->ntargets == 0) {
		stk_error("storage: missing options (listen and mgmtd addresses, a data folder "
			  "and at least one target folder are required)");
		return -EINVAL;
	}
	memset(&b, 0, sizeof(b));
	b.opts = opts;
	b.s = s = calloc(1, sizeof(*s));
	b.ids = calloc(opts->ntargets, sizeof(*b.ids));
	if (!s || !b.ids) {
		rc = -ENOMEM;
		goto out;
	}
	rc = stk_mkdir_p(opts->data_dir, 0755);
	if (rc) {
		stk_error("cannot create %s: %s", opts->data_dir, strerror(-rc));
		goto out;
	}
	if ((size_t)snprintf(b.node_path, sizeof(b.node_path), "%s/node.id", opts->data_dir) >=
	    sizeof(b.node_path)) {
		rc = -ENAMETOOLONG;
		goto out;
	}
	rc = read_node_id(b.node_path, &b.node_id);
	if (rc) {
		stk_error("cannot read %s: %s", b.node_path, strerror(-rc));
		goto out;
	}
	rc = open_targets(s, opts);
	if (rc)
		goto out;

	memset(&so, 0, sizeof(so));
	so.size = sizeof(so);
	so.listen = opts->listen;
	so.handler = storage_handle;
	so.loop_ops = &storage_loop_ops;
	so.ctx = s;
	/* Chunk reads and writes block on the disk: this many run at once. */
	so.workers = 32;
	memset(&spec, 0, sizeof(spec));
	spec.size = sizeof(spec);
	spec.role = "storage";
	spec.server = &so;
	spec.metrics_listen = opts->metrics_listen;
	spec.rpc_lo = 64;
	spec.rpc_hi = 95;
	spec.ctx = &b;
	spec.metrics = storage_metrics;
	spec.start = storage_start;
	rc = stk_daemon_run(&spec);
out:
	/* stk_daemon_run destroyed the server: no request uses the agent or the stores. */
	if (s) {
		stk_storage_metrics_destroy(s->metrics);
		stk_agent_stop(s->agent);
		for (unsigned i = 0; i < s->nstores; i++)
			stk_chunk_store_close(s->stores[i]);
		free(s->stores);
	}
	free(s);
	free(b.ids);
	return rc;
}
