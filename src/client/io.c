/*
 * The striped I/O engine: one read or write of a file, cut into per-chunk pieces,
 * sent to the pieces' chains in parallel.
 *
 * Parallelism without threads: for a window of pieces, the engine takes one
 * pooled connection per piece (to the head of the piece's chain), sends every
 * request, then collects every reply. Storage serves each connection on its own
 * thread, so a 16 MiB read over 16 chains runs 16 chunk reads at once. Read
 * replies land straight in the caller's buffer (the transport's bulk), so data is
 * copied once, from the socket.
 *
 * Failures: a piece that meets a transport error, STALE_ROUTING or AGAIN (a
 * chain head that holds as many changes its successor has not taken as it can)
 * is retried after a routing refresh, with backoff, until the client's retry
 * window ends;
 * then the call returns -EIO. Any other status (ENOSPC, EIO from a checksum) is
 * final and returned as is.
 */
#include "client.h"
#include "vouch.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../common/layout.h"
#include "../common/log.h"
#include "../chunk/chunkfile.h"
#include "../chunk/servemap.h"
#include "../common/util.h"
#include "../proto/status.h"

#define STK_IO_WINDOW 32
/* a chunk request's fields, and a voucher after them (vouch.h) */
#define STK_IO_REQ_MAX (128 + STK_VOUCH_REC_LEN)

struct inflight {
	int local; /* read from a target of this machine, no request sent */
	struct stk_io_piece *p;
	struct stk_conn *conn;
	int watch; /* its slot in the client's call watch, or -1 */
	struct stk_rpc rpc;
	uint8_t *req; /* fixed fields + block checksums of a write */
	uint8_t *resp; /* fixed fields + block checksums of a read */
	size_t cap; /* of each of req and resp */
	int rc;
};

/* Request and reply room for a piece of len bytes: the fields and its checksums. */
static size_t piece_msg_cap(uint32_t len)
{
	return STK_IO_REQ_MAX + 4 * (size_t)stk_crc_blocks(len);
}

/* Appends the block checksums of buf to a request. */
static void put_crcs(struct stk_wbuf *w, const char *buf, uint32_t len)
{
	for (uint32_t off = 0; off < len; off += STK_CRC_BLOCK)
		stk_put_u32(w, stk_crc32c(0, buf + off, STK_MIN(STK_CRC_BLOCK, len - off)));
}

/*
 * Checks a read reply: its checksums must cover the bulk exactly, and each block
 * must match. Bytes that fail are never handed to the caller.
 */
static int check_read_reply(struct inflight *f)
{
	struct stk_msg_stor_read_resp m;
	const char *data = f->p->buf;
	size_t len = f->rpc.bulk_in_len;
	struct stk_rbuf r;

	stk_rbuf_init(&r, f->resp, f->rpc.resp_len);
	if (stk_msg_stor_read_resp_dec(&r, &m) || m.ncrcs != stk_crc_blocks(len))
		return -EBADMSG;
	for (size_t off = 0; off < len; off += STK_CRC_BLOCK) {
		uint32_t want = stk_get_u32(&r);
		if (r.err)
			return -EBADMSG;
		if (stk_crc32c(0, data + off, STK_MIN(STK_CRC_BLOCK, len - off)) != want) {
			stk_error("checksum mismatch in data from %s (chunk %u, block %zu): "
				  "refusing it",
				  stk_conn_addr(f->conn), f->p->chunk_idx, off / STK_CRC_BLOCK);
			return -EIO;
		}
	}
	return stk_rbuf_finish(&r) ? -EBADMSG : 0;
}

/*
 * The node to send a piece to, and the chain's version: a change goes to the
 * chain's head; a read to one of its serving replicas, spread by chunk (so that
 * the readers of a file use every copy), another one on each retry (after a
 * replica said its copy was damaged, too), or the tail when a replica said a
 * change of the chunk was on its way. -ESTALE if the table
 * lacks the chain.
 */
static int chain_node(struct stk_client *c, uint32_t chain_id, int op, uint64_t ino,
		      const struct stk_io_piece *p, char *addr, uint32_t *ver)
{
	const struct stk_rt_chain *ch;
	const struct stk_rt_target *t;
	const struct stk_rt_node *n;
	int rc = -ESTALE;

	pthread_rwlock_rdlock(&c->rt_lock);
	ch = stk_routing_chain(&c->rt, chain_id);
	if (ch && ch->ntargets) {
		unsigned pick = 0, ok[STK_MAX_REPLICAS], nok = 0, nwork = 0, work[STK_MAX_REPLICAS];

		/* The working members (serving or full), and those of them on nodes online. */
		for (unsigned i = 0; i < ch->ntargets; i++) {
			t = stk_routing_target(&c->rt, ch->targets[i]);
			n = t ? stk_routing_node(&c->rt, t->node_id) : NULL;
			if (!t || (t->state != STK_TARGET_SERVING && t->state != STK_TARGET_FULL))
				continue;
			work[nwork++] = i;
			if (n && n->state == STK_NODE_ONLINE)
				ok[nok++] = i;
		}
		if (nwork)
			pick = work[0]; /* changes: the head */
		if (op == STK_IO_READ && p->tail && nwork)
			pick = work[nwork - 1];
		else if (op == STK_IO_READ && nok)
			pick = ok[(unsigned)(((((ino ^ ((uint64_t)p->chunk_idx << 40)) *
						0x9E3779B97F4A7C15ull) >> 33) +
					      p->tries) %
					     nok)];
		t = stk_routing_target(&c->rt, ch->targets[pick]);
		n = t ? stk_routing_node(&c->rt, t->node_id) : NULL;
		if (n) {
			memcpy(addr, n->addr, STK_ADDR_MAX);
			*ver = ch->version;
			rc = 0;
		}
	}
	pthread_rwlock_unlock(&c->rt_lock);
	return rc;
}

/*
 * Short-circuit reads: when a serving member of a chain is a target on this host
 * whose folder this process can open (and whose target.id is the one the routing
 * table names), the client reads the chunk file itself, with the same checksum
 * checks the storage node makes, and no request crosses the network. Writes
 * always go to the storage node, which owns the chunk files; reads of a
 * copy-on-write chunk see the old version or the new one, never a mix.
 *
 * "On this host" is the node's host id (common/host.h) equal to the client's, never
 * its address: on one machine every 127.x address is local, also that of a node in
 * its own network namespace or one given a host id of its own to stand for another
 * machine. And the node must be ONLINE and its target SERVING (or FULL) in the
 * routing table: the files of a node known to be down are not read behind its
 * back (its chunks may be stale once it is moved out of its chains).
 *
 * And the node must serve the read as we would send it (local_read): its serve
 * map (chunk/servemap.h) says it serves the target's chain at the version our
 * table has (so a table of ours that is behind, or a node fenced, silent or
 * stopped, sends the read over the network, which refreshes what must be), and
 * that no change of the chunk was on its way down before or during the read:
 * else the copy may hold bytes the tail has not acknowledged, and the read goes
 * to the network, where a replica with a change pending sends it to the tail.
 */
static struct stk_local_target *local_member(struct stk_client *c, uint32_t chain_id, uint32_t *ver)
{
	const struct stk_rt_chain *ch;
	char path[STK_PATH_MAX + 1];
	struct stk_local_target *lt = NULL;
	uint32_t tid = 0;
	unsigned i, nl;

	if (!c->short_circuit)
		return NULL;
	pthread_rwlock_rdlock(&c->rt_lock);
	ch = stk_routing_chain(&c->rt, chain_id);
	for (i = 0; ch && i < ch->ntargets && !tid; i++) {
		const struct stk_rt_target *t = stk_routing_target(&c->rt, ch->targets[i]);
		const struct stk_rt_node *n = t ? stk_routing_node(&c->rt, t->node_id) : NULL;

		if (t && n && (t->state == STK_TARGET_SERVING || t->state == STK_TARGET_FULL) &&
		    n->state == STK_NODE_ONLINE && n->host_id[0] &&
		    strcmp(n->host_id, c->host_id) == 0) {
			tid = t->id;
			*ver = ch->version;
		}
	}
	pthread_rwlock_unlock(&c->rt_lock);
	if (!tid)
		return NULL;
	/* Targets met before: no lock (locals only grows; nlocals is published last). */
	nl = __atomic_load_n(&c->nlocals, __ATOMIC_ACQUIRE);
	for (i = 0; i < nl; i++)
		if (c->locals[i].id == tid)
			return c->locals[i].cs ? &c->locals[i] : NULL;
	/* A target met first: its folder from the routing table, opened once. */
	pthread_rwlock_rdlock(&c->rt_lock);
	{
		const struct stk_rt_target *t = stk_routing_target(&c->rt, tid);

		path[0] = 0;
		if (t)
			memcpy(path, t->path, sizeof(path));
	}
	pthread_rwlock_unlock(&c->rt_lock);
	if (!path[0])
		return NULL;
	pthread_mutex_lock(&c->local_lock);
	for (i = 0; i < c->nlocals; i++)
		if (c->locals[i].id == tid)
			break;
	if (i == c->nlocals && i < STK_MAX_LOCAL_TARGETS) {
		struct stk_local_target *n = &c->locals[i];

		n->id = tid;
		if (stk_chunk_store_open_reader(path, tid, &n->cs))
			n->cs = NULL;
		if (n->cs && stk_serve_map_open_reader(path, tid, &n->map))
			n->map = NULL;
		n->map_retry_ns = stk_now_ns() + 1000000000ull;
		__atomic_store_n(&c->nlocals, i + 1, __ATOMIC_RELEASE);
	}
	if (i < c->nlocals && c->locals[i].cs)
		lt = &c->locals[i];
	pthread_mutex_unlock(&c->local_lock);
	return lt;
}

/* The store of chain_id's local member, for hints (advice, prefetch); or NULL. */
static struct stk_chunk_store *local_store(struct stk_client *c, uint32_t chain_id)
{
	uint32_t ver;
	struct stk_local_target *lt = local_member(c, chain_id, &ver);

	return lt ? lt->cs : NULL;
}

static void sc_count(struct stk_client *c, enum stk_sc_stat what, uint64_t n)
{
	__atomic_add_fetch(&c->sc_stats[what], n, __ATOMIC_RELAXED);
}

/*
 * Looks for a newer serve map of lt's target, at most once a second (a
 * missing, retired or expired one: the node may have started again since). One
 * thread looks; readers keep the map they loaded, which stays mapped.
 */
static void local_map_retry(struct stk_client *c, struct stk_local_target *lt)
{
	uint64_t now = stk_now_ns(), at = __atomic_load_n(&lt->map_retry_ns, __ATOMIC_RELAXED);
	struct stk_serve_map *m, *old;
	struct stk_gone_map *g;

	if (now < at || !__atomic_compare_exchange_n(&lt->map_retry_ns, &at, now + 1000000000ull, 0,
						     __ATOMIC_RELAXED, __ATOMIC_RELAXED))
		return;
	if (stk_serve_map_open_reader(stk_chunk_store_path(lt->cs), lt->id, &m))
		return;
	pthread_mutex_lock(&c->local_lock);
	old = lt->map;
	g = old ? malloc(sizeof(*g)) : NULL;
	if ((old && stk_serve_map_instance(old) == stk_serve_map_instance(m)) || (old && !g)) {
		pthread_mutex_unlock(&c->local_lock);
		stk_serve_map_close(m); /* the same map, or no room to keep the old one */
		return;
	}
	if (g) {
		g->map = old;
		g->next = c->gone_maps;
		c->gone_maps = g;
	}
	__atomic_store_n(&lt->map, m, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&c->local_lock);
}

/*
 * Reads piece p of inode ino from a local member of its chain, if this client may
 * (see above): 1 and the piece is done (p->done set), or 0 and nothing was
 * returned (the buffer may hold bytes read and dropped), and the read goes over
 * the network. Any failure, a checksum mismatch too, goes the network way: the
 * storage node then sees it, logs and counts it, and answers EIO itself.
 */
static int local_read(struct stk_client *c, struct stk_io_piece *p, uint64_t ino, uint32_t flags)
{
	struct stk_local_target *lt;
	struct stk_serve_snap snap;
	struct stk_serve_map *m;
	uint32_t ver = 0;
	long got;
	int rc;

	lt = local_member(c, p->chain_id, &ver);
	if (!lt)
		return 0;
	m = __atomic_load_n(&lt->map, __ATOMIC_ACQUIRE);
	if (!m) {
		sc_count(c, STK_SC_NO_MAP, 1);
		local_map_retry(c, lt);
		return 0;
	}
	rc = stk_serve_map_read_begin(m, p->chain_id, ver, ino, p->chunk_idx, &snap);
	if (rc) {
		sc_count(c,
			 rc == -ENODEV	      ? STK_SC_RETIRED
			 : rc == -ETIMEDOUT   ? STK_SC_EXPIRED
			 : rc == -EPERM	      ? STK_SC_NOT_SERVING
			 : rc == -ESTALE      ? STK_SC_STALE
			 : rc == -EINPROGRESS ? STK_SC_PENDING
					      : STK_SC_CHANGED,
			 1);
		if (rc == -ENODEV || rc == -ETIMEDOUT)
			local_map_retry(c, lt);
		return 0;
	}
	got = flags & STK_READ_STREAM
		  ? stk_chunk_read_stream(lt->cs, ino, p->chunk_idx, p->offset, p->buf, p->length)
		  : stk_chunk_read(lt->cs, ino, p->chunk_idx, p->offset, p->buf, p->length, NULL);
	if (got < 0) {
		sc_count(c, STK_SC_FAILED, 1);
		return 0;
	}
	if (stk_serve_map_read_end(m, &snap)) {
		/* Maybe a version not yet acknowledged: never handed on, not even in part. */
		memset(p->buf, 0, (size_t)got);
		sc_count(c, STK_SC_CHANGED, 1);
		return 0;
	}
	stk_serve_map_count(m, (uint64_t)got);
	sc_count(c, STK_SC_READS, 1);
	sc_count(c, STK_SC_BYTES, (uint64_t)got);
	p->done = (uint32_t)got;
	return 1;
}

/*
 * The local reads of a window run one after the other in this thread; so that a
 * cold read still keeps the disk busy with all of them at once, the window's
 * large local pieces are first handed to the kernel's read-ahead
 * (POSIX_FADV_WILLNEED, which queues the reads and returns), and each read then
 * finds its pages arriving or arrived. Small pieces (a data loader's samples) skip
 * it: for them the extra call costs more than it saves.
 */
#define STK_IO_ADVISE_MIN (128u << 10)

static void advise_local(struct stk_client *c, uint64_t ino, const struct stk_io_piece *p)
{
	struct stk_chunk_store *cs;

	if (p->length < STK_IO_ADVISE_MIN)
		return;
	cs = local_store(c, p->chain_id);
	if (cs)
		stk_chunk_advise(cs, ino, p->chunk_idx, p->offset, p->length);
}

static int retryable(int rc)
{
	switch (rc) {
	case -ESTALE:
	case -ECONNREFUSED:
	case -ECONNRESET:
	case -EPIPE:
	case -ETIMEDOUT:
	case -ENOTCONN:
	case -EHOSTUNREACH:
	case -ECONNABORTED:
	case -EBADMSG:
	case -EINPROGRESS: /* a replica with a change pending: read from the tail */
	case -EILSEQ: /* a replica's copy is damaged (and being repaired): another one */
	case -EAGAIN: /* a head holding all the changes it can until they settle: later */
		return 1;
	default:
		return 0;
	}
}

/* A piece to send again: to another replica, or to the tail (see chain_node). */
static void retry_mark(struct stk_io_piece *p, int rc)
{
	p->rc = 1;
	p->tries++;
	if (rc == -EINPROGRESS)
		p->tail = 1;
	if (rc == -EILSEQ)
		p->tail = 0;
}

static void start_piece(struct stk_client *c, struct inflight *f, int op, uint64_t ino,
			const struct stk_layout *l, uint32_t flags)
{
	struct stk_io_piece *p = f->p;
	char addr[STK_ADDR_MAX];
	struct stk_wbuf w;
	uint32_t ver = 0;

	f->conn = NULL;
	f->local = 0;
	f->watch = -1;
	if (op == STK_IO_READ && local_read(c, p, ino, flags)) {
		f->local = 1;
		f->rc = 0;
		return;
	}
	if (op == STK_IO_PREFETCH) {
		/* A chunk this client reads itself is advised here: no request, and the
		 * file it opens stays in the cache for the read that follows. */
		struct stk_chunk_store *cs = local_store(c, p->chain_id);

		if (cs) {
			/* A stream reads it past the page cache: nothing to advise. */
			if (!(flags & STK_READ_STREAM))
				(void)stk_chunk_prefetch(cs, ino, p->chunk_idx);
			f->local = 1;
			f->rc = 0;
			return;
		}
	}
	f->rc = chain_node(c, p->chain_id, op, ino, p, addr, &ver);
	if (f->rc)
		return;
	stk_wbuf_init(&w, f->req, f->cap);
	memset(&f->rpc, 0, sizeof(f->rpc));
	f->rpc.frame_flags = STK_FRAME_BULK_SELF | c->qos_flags;
	if (op == STK_IO_WRITE) {
		struct stk_msg_stor_write_req m = {.chain_id = p->chain_id,
						   .chain_ver = ver,
						   .ino = ino,
						   .chunk_idx = p->chunk_idx,
						   .chunk_size = l->chunk_size,
						   .offset = p->offset,
						   .length = p->length,
						   .flags = flags,
						   .ncrcs = stk_crc_blocks(p->length)};
		stk_msg_stor_write_req_enc(&w, &m);
		put_crcs(&w, p->buf, p->length);
		f->rpc.opcode = STK_OP_STOR_WRITE;
		f->rpc.bulk_out = p->buf;
		f->rpc.bulk_out_len = p->length;
	} else if (op == STK_IO_PREFETCH) {
		struct stk_msg_stor_prefetch_req m = {.chain_id = p->chain_id,
						      .chain_ver = ver,
						      .ino = ino,
						      .chunk_idx = p->chunk_idx};
		stk_msg_stor_prefetch_req_enc(&w, &m);
		f->rpc.opcode = STK_OP_STOR_PREFETCH;
		f->rpc.frame_flags = c->qos_flags;
	} else {
		struct stk_msg_stor_read_req m = {.chain_id = p->chain_id,
						  .chain_ver = ver,
						  .ino = ino,
						  .chunk_idx = p->chunk_idx,
						  .offset = p->offset,
						  .length = p->length};
		stk_msg_stor_read_req_enc(&w, &m);
		f->rpc.opcode = STK_OP_STOR_READ;
		f->rpc.bulk_in = p->buf;
		f->rpc.bulk_in_cap = p->length;
	}
	{
		struct stk_msg_vouch_rec v;

		/* meta's word that ino is under our subtree: storage need not ask it */
		if (stk_vouch_find(c->vouches, ino, &v)) {
			stk_msg_vouch_rec_enc(&w, &v);
			f->rpc.frame_flags |= STK_FRAME_VOUCH;
		}
	}
	f->rpc.req = f->req;
	f->rpc.req_len = w.len;
	f->rpc.resp = f->resp;
	f->rpc.resp_cap = f->cap;
	stk_callwatch_set_thread(c->watch); /* a new connection's handshake, too */
	f->rc = stk_pool_get(c->pool, addr, &f->conn);
	stk_callwatch_set_thread(NULL);
	if (f->rc)
		return;
	f->rc = stk_rpc_send(f->conn, &f->rpc);
	if (f->rc == 0)
		f->watch = stk_callwatch_begin(c->watch, f->conn, addr);
}

static void finish_piece(struct stk_client *c, struct inflight *f, int op)
{
	struct stk_io_piece *p = f->p;

	if (f->local) {
		p->rc = f->rc;
		return;
	}

	if (f->rc == 0)
		f->rc = stk_rpc_recv(f->conn, &f->rpc);
	if (f->rc == 0)
		f->rc = stk_status_to_errno(f->rpc.status);
	if (f->rc == 0 && op == STK_IO_READ)
		f->rc = check_read_reply(f);
	stk_callwatch_end(c->watch, f->watch);
	f->watch = -1;
	if (f->conn)
		stk_pool_put(c->pool, f->conn);
	f->conn = NULL;
	/*
	 * A read's bulk lands in the caller's buffer before it is checked: when the
	 * piece failed (a checksum, a reply cut short), whatever landed is wiped, as
	 * the chunk files' own reader does, so the bad bytes never reach the caller.
	 */
	if (f->rc && op == STK_IO_READ && p->length)
		memset(p->buf, 0, p->length);
	if (f->rc == 0 && op == STK_IO_READ)
		p->done = (uint32_t)f->rpc.bulk_in_len;
	else if (f->rc == 0)
		p->done = p->length;
	p->rc = f->rc;
}

int stk_io_run(struct stk_client *c, int op, uint64_t ino, const struct stk_layout *l,
	       struct stk_io_piece *pieces, unsigned n, uint32_t flags)
{
	uint64_t deadline = stk_now_ns() + (uint64_t)c->retry_ms * 1000000ull;
	unsigned backoff_ms = 20, left = n;
	struct inflight *fl;
	int first_err = 0;

	unsigned nfl = n < STK_IO_WINDOW ? n : STK_IO_WINDOW;
	uint32_t maxlen = 0;
	uint8_t *arena;
	size_t cap;

	for (unsigned i = 0; i < n; i++)
		maxlen = STK_MAX(maxlen, pieces[i].length);
	cap = piece_msg_cap(maxlen);
	fl = malloc(sizeof(*fl) * nfl + 2 * cap * nfl);
	if (!fl)
		return -ENOMEM;
	arena = (uint8_t *)(fl + nfl);
	for (unsigned i = 0; i < nfl; i++) {
		fl[i].req = arena + 2 * cap * i;
		fl[i].resp = fl[i].req + cap;
		fl[i].cap = cap;
	}
	for (unsigned i = 0; i < n; i++) {
		pieces[i].rc = 1; /* pending */
		pieces[i].tries = pieces[i].tail = 0;
	}
	while (left) {
		unsigned k = 0, retry = 0, next = 0, busy;

		if (op == STK_IO_READ && !(flags & STK_READ_STREAM)) /* a stream skips the cache */
			for (unsigned i = 0, m = 0; i < n && m < STK_IO_WINDOW; i++)
				if (pieces[i].rc == 1 && m++ > 0)
					advise_local(c, ino, &pieces[i]); /* not the first: read now */
		for (; next < n && k < STK_IO_WINDOW; next++) {
			if (pieces[next].rc != 1)
				continue;
			fl[k].p = &pieces[next];
			start_piece(c, &fl[k], op, ino, l, flags);
			k++;
		}
		/*
		 * Slots are finished in the order their pieces were sent. A write's slot
		 * takes the next piece as soon as it is free (a sliding window): the
		 * storage nodes store the window's last pieces while this thread already
		 * hashes and sends the next ones, instead of both waiting for each other
		 * at the end of every window. A piece to retry waits for the next pass.
		 */
		busy = k;
		for (unsigned j = 0; busy; j = (j + 1) % k) {
			if (!fl[j].p)
				continue;
			finish_piece(c, &fl[j], op);
			if (op == STK_IO_PREFETCH)
				fl[j].rc = 0; /* a hint: never retried, never an error */
			if (fl[j].rc && retryable(fl[j].rc) && stk_now_ns() < deadline) {
				retry_mark(fl[j].p, fl[j].rc);
				retry++;
			} else {
				left--;
				if (fl[j].rc && !first_err) {
					first_err = retryable(fl[j].rc) ? -EIO : fl[j].rc;
					stk_debug("%s of ino %llx chunk %u on chain %u failed: %s",
						  op == STK_IO_WRITE ? "write" : "read",
						  (unsigned long long)ino, fl[j].p->chunk_idx,
						  fl[j].p->chain_id, stk_strerror(fl[j].rc));
				}
			}
			fl[j].p = NULL;
			busy--;
			if (op != STK_IO_WRITE || first_err)
				continue;
			while (next < n && pieces[next].rc != 1)
				next++;
			if (next < n) {
				fl[j].p = &pieces[next++];
				start_piece(c, &fl[j], op, ino, l, flags);
				busy++;
			}
		}
		if (first_err)
			break;
		if (retry) {
			usleep(backoff_ms * 1000);
			if (backoff_ms < 500)
				backoff_ms *= 2;
			stk_pool_flush(c->pool);
			stk_client_refresh_routing(c);
		}
	}
	free(fl);
	return first_err;
}

void stk_io_scratch_free(struct stk_io_scratch *s)
{
	free(s->mem);
	s->mem = NULL;
	s->cap = 0;
}

/*
 * The batch engine's runner: as stk_io_run, but each piece names its own file and
 * operation, and a piece's failure is its own (the others carry on), since the
 * pieces belong to requests that complete independently.
 */
int stk_io_run_multi(struct stk_client *c, struct stk_io_piece_ex *px, unsigned n,
		     unsigned window, struct stk_io_scratch *scratch)
{
	uint64_t deadline = stk_now_ns() + (uint64_t)c->retry_ms * 1000000ull;
	unsigned backoff_ms = 20, left = n, nfl;
	struct inflight *fl;
	uint32_t maxlen = 0;
	int first_err = 0;
	uint8_t *arena;
	size_t cap, need;
	void *mem;

	if (n == 0)
		return 0;
	if (window == 0)
		window = STK_IO_WINDOW;
	nfl = STK_MIN(n, window);
	for (unsigned i = 0; i < n; i++)
		maxlen = STK_MAX(maxlen, px[i].p.length);
	cap = piece_msg_cap(maxlen);
	need = sizeof(*fl) * nfl + 2 * cap * nfl;
	if (scratch && scratch->cap >= need) {
		mem = scratch->mem;
	} else {
		mem = malloc(need);
		if (!mem) {
			for (unsigned i = 0; i < n; i++)
				px[i].p.rc = -ENOMEM;
			return -ENOMEM;
		}
		if (scratch) {
			free(scratch->mem);
			scratch->mem = mem;
			scratch->cap = need;
		}
	}
	fl = mem;
	arena = (uint8_t *)(fl + nfl);
	for (unsigned i = 0; i < nfl; i++) {
		fl[i].req = arena + 2 * cap * i;
		fl[i].resp = fl[i].req + cap;
		fl[i].cap = cap;
	}
	for (unsigned i = 0; i < n; i++) {
		px[i].p.rc = 1; /* pending */
		px[i].p.done = 0;
		px[i].p.tries = px[i].p.tail = 0;
	}
	while (left) {
		unsigned k = 0, retry = 0;

		for (unsigned i = 0, m = 0; i < n && m < nfl; i++)
			if (px[i].p.rc == 1 && px[i].op == STK_IO_READ && m++ > 0)
				advise_local(c, px[i].ino, &px[i].p);
		for (unsigned i = 0; i < n && k < nfl; i++) {
			if (px[i].p.rc != 1)
				continue;
			fl[k].p = &px[i].p;
			start_piece(c, &fl[k], px[i].op, px[i].ino, px[i].layout, px[i].flags);
			k++;
		}
		for (unsigned j = 0; j < k; j++) {
			/* p is the first member of its stk_io_piece_ex */
			const struct stk_io_piece_ex *x = (const struct stk_io_piece_ex *)fl[j].p;

			finish_piece(c, &fl[j], x->op);
			if (fl[j].rc && retryable(fl[j].rc) && stk_now_ns() < deadline) {
				retry_mark(fl[j].p, fl[j].rc);
				retry++;
				continue;
			}
			left--;
			if (fl[j].rc) {
				fl[j].p->rc = retryable(fl[j].rc) ? -EIO : fl[j].rc;
				if (!first_err)
					first_err = fl[j].p->rc;
				stk_debug("batched %s of ino %llx chunk %u on chain %u failed: %s",
					  x->op == STK_IO_WRITE ? "write" : "read",
					  (unsigned long long)x->ino, fl[j].p->chunk_idx,
					  fl[j].p->chain_id, stk_strerror(fl[j].rc));
			}
		}
		if (retry) {
			usleep(backoff_ms * 1000);
			if (backoff_ms < 500)
				backoff_ms *= 2;
			stk_pool_flush(c->pool);
			stk_client_refresh_routing(c);
		}
	}
	if (!scratch)
		free(mem);
	return first_err;
}

/* Encodes a chain request for the chain's current version into w. */
typedef void (*chain_enc_fn)(const void *msg, uint32_t chain_ver, struct stk_wbuf *w);

static void enc_sync(const void *msg, uint32_t ver, struct stk_wbuf *w)
{
	(void)ver;
	stk_msg_stor_sync_req_enc(w, msg);
}

static void enc_truncate(const void *msg, uint32_t ver, struct stk_wbuf *w)
{
	struct stk_msg_stor_truncate_req m = *(const struct stk_msg_stor_truncate_req *)msg;
	m.chain_ver = ver;
	stk_msg_stor_truncate_req_enc(w, &m);
}

/*
 * One request to a chain's head, retried like the pieces of stk_io_run; its
 * encoding takes at most req_max bytes.
 */
static int chain_op_sized(struct stk_client *c, uint16_t opcode, chain_enc_fn enc,
			  const void *msg, uint32_t chain_id, size_t req_max)
{
	uint64_t deadline = stk_now_ns() + (uint64_t)c->retry_ms * 1000000ull;
	unsigned backoff_ms = 20;
	char addr[STK_ADDR_MAX];
	uint8_t small[STK_IO_REQ_MAX], resp[64];
	uint8_t *req = req_max > sizeof(small) ? malloc(req_max) : small;
	uint32_t ver = 0;
	int rc;

	if (!req)
		return -ENOMEM;
	if (req == small)
		req_max = sizeof(small);
	for (;;) {
		struct stk_conn *conn = NULL;
		struct stk_wbuf w;
		struct stk_rpc rpc = {.opcode = opcode,
				      .req = req,
				      .resp = resp,
				      .resp_cap = sizeof(resp),
				      .frame_flags = c->qos_flags};

		rc = chain_node(c, chain_id, STK_IO_WRITE, 0, NULL, addr, &ver);
		if (rc == 0) {
			stk_wbuf_init(&w, req, req_max);
			enc(msg, ver, &w);
			rpc.req_len = w.len;
			rc = w.err ? w.err : stk_pool_get(c->pool, addr, &conn);
		}
		if (rc == 0) {
			rc = stk_rpc_call(conn, &rpc);
			stk_pool_put(c->pool, conn);
		}
		if (!retryable(rc) || stk_now_ns() > deadline)
			break;
		usleep(backoff_ms * 1000);
		if (backoff_ms < 500)
			backoff_ms *= 2;
		stk_pool_flush(c->pool);
		stk_client_refresh_routing(c);
	}
	if (req != small)
		free(req);
	return retryable(rc) ? -EIO : rc;
}

/* One small request to a chain's head. */
static int chain_op(struct stk_client *c, uint16_t opcode, chain_enc_fn enc, const void *msg,
		    uint32_t chain_id)
{
	return chain_op_sized(c, opcode, enc, msg, chain_id, STK_IO_REQ_MAX);
}

int stk_io_sync_chain(struct stk_client *c, uint32_t chain_id)
{
	struct stk_msg_stor_sync_req m = {.chain_id = chain_id};

	return chain_op(c, STK_OP_STOR_SYNC, enc_sync, &m, chain_id);
}

int stk_client_truncate_data(struct stk_client *c, const struct stk_attr *a, uint64_t size)
{
	uint32_t chains[STK_MAX_STRIPE];
	struct stk_ns_id ns;
	int first = 0;

	if (stk_layout_check(&a->layout))
		return -EIO;
	first = stk_client_meta_ns(c, &ns);
	if (first)
		return first;
	stk_layout_chains(&a->layout, chains);
	for (uint32_t i = 0; i < a->layout.stripe; i++) {
		struct stk_msg_stor_truncate_req m = {.chain_id = chains[i],
						      .ino = a->ino,
						      .size = size,
						      .chunk_size = a->layout.chunk_size,
						      .ns_hi = ns.hi,
						      .ns_lo = ns.lo};
		int rc = chain_op(c, STK_OP_STOR_TRUNCATE, enc_truncate, &m, chains[i]);
		if (rc && !first)
			first = rc;
	}
	return first;
}

static void enc_punch(const void *msg, uint32_t ver, struct stk_wbuf *w)
{
	struct stk_msg_stor_punch_req m = *(const struct stk_msg_stor_punch_req *)msg;
	m.chain_ver = ver;
	stk_msg_stor_punch_req_enc(w, &m);
}

int stk_client_punch_data(struct stk_client *c, const struct stk_attr *a, uint32_t first,
			  uint32_t end)
{
	uint32_t chains[STK_MAX_STRIPE];
	int first_err = 0;

	if (stk_layout_check(&a->layout))
		return -EIO;
	stk_layout_chains(&a->layout, chains);
	/* Each chain drops the chunks of the range it holds (the others are not there). */
	for (uint32_t i = 0; i < a->layout.stripe; i++) {
		struct stk_msg_stor_punch_req m = {.chain_id = chains[i],
						   .ino = a->ino,
						   .first = first,
						   .end = end};
		int rc = chain_op(c, STK_OP_STOR_PUNCH, enc_punch, &m, chains[i]);
		if (rc && !first_err)
			first_err = rc;
	}
	return first_err;
}

/* A file's truncation on one chain; sorted by chain, a run of them is one STOR_TRUNCATES. */
struct chain_rec {
	uint32_t chain_id;
	struct stk_msg_trunc_rec rec;
};

/* The truncations of one chain for STOR_TRUNCATES. */
struct trunc_batch {
	uint32_t chain_id;
	uint32_t n;
	const struct chain_rec *l;
	struct stk_ns_id ns;
};

static void enc_truncates(const void *msg, uint32_t ver, struct stk_wbuf *w)
{
	const struct trunc_batch *b = msg;
	struct stk_msg_stor_truncates_req m = {.chain_id = b->chain_id, .chain_ver = ver,
					       .n = b->n, .ns_hi = b->ns.hi, .ns_lo = b->ns.lo};

	stk_msg_stor_truncates_req_enc(w, &m);
	for (uint32_t i = 0; i < b->n; i++)
		stk_msg_trunc_rec_enc(w, &b->l[i].rec);
}

static int chain_rec_cmp(const void *a, const void *b)
{
	const struct chain_rec *x = a, *y = b;

	return (x->chain_id > y->chain_id) - (x->chain_id < y->chain_id);
}

/* One chain's records: STOR_TRUNCATES, or one STOR_TRUNCATE each for a storage without it. */
static int truncate_on_chain(struct stk_client *c, const struct stk_ns_id *ns,
			     const struct chain_rec *l, uint32_t n)
{
	struct trunc_batch b = {.chain_id = l[0].chain_id, .n = n, .l = l, .ns = *ns};
	/* 28 bytes of header, 20 a record, and slack */
	int rc = chain_op_sized(c, STK_OP_STOR_TRUNCATES, enc_truncates, &b, b.chain_id,
				32 + (size_t)n * 20);

	if (rc != -ENOSYS)
		return rc;
	rc = 0;
	for (uint32_t i = 0; i < n; i++) {
		struct stk_msg_stor_truncate_req m = {.chain_id = b.chain_id,
						      .ino = l[i].rec.ino,
						      .size = l[i].rec.size,
						      .chunk_size = l[i].rec.chunk_size,
						      .ns_hi = ns->hi,
						      .ns_lo = ns->lo};
		int r = chain_op(c, STK_OP_STOR_TRUNCATE, enc_truncate, &m, b.chain_id);

		if (r && !rc)
			rc = r;
	}
	return rc;
}

/*
 * The short-circuit reader's open chunk files of gone files go first: held open
 * (and mapped) they would keep the space and slow every later read of this process.
 */
void stk_client_forget_local(struct stk_client *c, const struct stk_attr *a, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		uint32_t nl = __atomic_load_n(&c->nlocals, __ATOMIC_ACQUIRE);
		uint64_t cs = a[i].layout.chunk_size;
		uint64_t nchunks = cs ? (a[i].size + cs - 1) / cs : 0;

		for (uint32_t j = 0; nchunks && j < nl; j++)
			stk_chunk_store_forget(c->locals[j].cs, a[i].ino, nchunks);
	}
}

int stk_client_remove_data_many(struct stk_client *c, const struct stk_attr *a, size_t n)
{
	uint32_t chains[STK_MAX_STRIPE];
	struct chain_rec *l;
	struct stk_ns_id ns;
	size_t cnt = 0;
	int first = 0, rc0;

	for (size_t i = 0; i < n; i++)
		cnt += stk_layout_check(&a[i].layout) ? 0 : a[i].layout.stripe;
	l = malloc((cnt ? cnt : 1) * sizeof(*l));
	if (!l)
		return -ENOMEM;
	cnt = 0;
	for (size_t i = 0; i < n; i++) {
		if (stk_layout_check(&a[i].layout)) {
			first = first ? first : -EIO;
			continue;
		}
		stk_layout_chains(&a[i].layout, chains);
		for (uint32_t k = 0; k < a[i].layout.stripe; k++)
			l[cnt++] = (struct chain_rec){
			    .chain_id = chains[k],
			    .rec = {.ino = a[i].ino, .chunk_size = a[i].layout.chunk_size}};
	}
	stk_client_forget_local(c, a, n);
	qsort(l, cnt, sizeof(*l), chain_rec_cmp);
	/* Without the namespace's identity storage removes nothing: none is sent. */
	rc0 = cnt ? stk_client_meta_ns(c, &ns) : 0;
	if (rc0) {
		free(l);
		return rc0;
	}
	for (size_t i = 0; i < cnt;) {
		uint32_t m = 0;
		int rc;

		while (i + m < cnt && m < STK_TRUNCATES_MAX && l[i + m].chain_id == l[i].chain_id)
			m++;
		rc = truncate_on_chain(c, &ns, &l[i], m);
		if (rc && !first)
			first = rc;
		i += m;
	}
	free(l);
	return first;
}
