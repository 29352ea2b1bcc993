/*
 * The client's striped I/O engine (src/client/io.c), through its entry points
 * stk_io_run and stk_io_run_multi, against storage nodes in this process.
 *
 * Each node is a real RPC server (src/net/server.c) whose handler serves
 * STOR_READ and STOR_WRITE over a real chunk store (src/storage/chunk.h) in a
 * folder of its own, as the storage daemon does: it checks the chain version the
 * client routed with, checks a write's block checksums, and answers a read with
 * the stored checksums of its bulk. A third server stands for mgmtd and answers
 * MGMT_GET_ROUTING with the cluster's table, which the tests change (a chain's
 * version bumped), so that the client's refresh after STALE_ROUTING is the real
 * one. The client handle is a real struct stk_client with its real pool and
 * routing table; only meta is missing, which io.c never calls.
 *
 * Faults are the nodes': a read reply with a byte flipped after its checksums
 * were taken, one with a checksum missing, a connection shut down in the middle
 * of a window, a node stopped and started again, a status answered once. What is
 * checked is what io.c promises: pieces land in order, in the caller's buffer;
 * transport failures and stale routing are retried until the retry window ends
 * (then -EIO); a checksum failure and any other status are final; a piece that
 * says it succeeded holds the stored bytes, and a failed one never the bad ones.
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../../src/client/client.h"
#include "../../src/common/layout.h"
#include "../../src/common/util.h"
#include "../../src/net/net.h"
#include "../../src/proto/msg.h"
#include "../../src/proto/status.h"
#include "../../src/chunk/servemap.h"
#include "../../src/storage/chunk.h"
#include "check.h"

#define CS STK_MIN_CHUNK_SIZE /* the chunk size of every file here: 64 KiB */
#define NCHAINS 4 /* chain c's head is node (c - 1) % NNODES + 1 */
#define NNODES 2
#define HOST_ID "io-test-host" /* the nodes' host id, for short-circuit reads */

/* Inodes: each test writes its own, so that one test's faults never meet another's. */
enum { INO_READ = 0x101, INO_WRITE, INO_HOLES, INO_LOCAL, INO_BIG };

struct node {
	uint32_t id; /* the node's id and that of its one target */
	char dir[PATH_MAX];
	struct stk_chunk_store *cs;
	struct stk_serve_map *map; /* what the node tells its host's readers (servemap.h) */
	struct stk_server *srv;
	pthread_t tid;
	char addr[STK_ADDR_MAX];
	atomic_uint reads, writes; /* requests seen */
	/* Faults: each applies to the next so many replies, or to the request numbered so. */
	atomic_int corrupt_reads; /* a byte of the bulk flipped after its checksums */
	atomic_int short_crcs; /* one block checksum left out */
	atomic_uint cut_at_read, cut_at_write; /* that request shuts its connection down */
	atomic_int read_errno, write_errno; /* the next one answered with this -errno */
	/* The gate: reads wait until gate_need of them run at once (or 5 s pass). */
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int gate_need, running, max_running;
	char first_peer[STK_ADDR_MAX]; /* the first connection a read came on */
	int other_peers; /* reads that came on another one */
};

static struct node g_nodes[NNODES];

/* The cluster's routing table, served by the mgmtd stand-in and obeyed by the nodes. */
static pthread_mutex_t g_rt_lock = PTHREAD_MUTEX_INITIALIZER;
static struct stk_rt_node g_rt_nodes[NNODES];
static struct stk_rt_target g_rt_targets[NNODES];
static struct stk_rt_chain g_rt_chains[NCHAINS];
static struct stk_routing g_rt = {.version = 1,
				  .nnodes = NNODES,
				  .ntargets = NNODES,
				  .nchains = NCHAINS,
				  .nodes = g_rt_nodes,
				  .targets = g_rt_targets,
				  .chains = g_rt_chains};
static struct stk_server *g_mgmtd;
static pthread_t g_mgmtd_tid;
static atomic_uint g_routing_calls;

/* ---- the data: byte i of file ino is pat(ino, i) ---- */

static uint8_t pat(uint64_t ino, uint64_t off)
{
	uint64_t x = ino * 0x9e3779b97f4a7c15ull + off;

	x ^= x >> 31;
	x *= 0xbf58476d1ce4e5b9ull;
	return (uint8_t)(x >> 56);
}

static void fill(char *buf, uint64_t ino, uint64_t off, size_t len)
{
	for (size_t i = 0; i < len; i++)
		buf[i] = (char)pat(ino, off + i);
}

/* The first byte of buf that is not file ino's from off, or -1. */
static long mismatch(const char *buf, uint64_t ino, uint64_t off, size_t len)
{
	for (size_t i = 0; i < len; i++)
		if ((uint8_t)buf[i] != pat(ino, off + i))
			return (long)i;
	return -1;
}

/* ---- the nodes ---- */

static int take(atomic_int *n)
{
	int v = atomic_load(n);

	while (v > 0)
		if (atomic_compare_exchange_weak(n, &v, v - 1))
			return 1;
	return 0;
}

/* The request numbered seq is the one to cut: once. */
static int cut_here(atomic_uint *at, unsigned seq)
{
	unsigned want = seq;

	return atomic_compare_exchange_strong(at, &want, 0);
}

/*
 * Shuts down both ways the server's socket whose peer is `peer` (the client's
 * "HOST:PORT"): the client sees its connection reset with requests in flight.
 */
static void cut_connection(const char *peer)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;

	if (!d) {
		CHECK_FAIL("opendir /proc/self/fd: %s", strerror(errno));
		return;
	}
	while ((e = readdir(d))) {
		struct sockaddr_in sa;
		socklen_t len = sizeof(sa);
		char host[INET_ADDRSTRLEN], name[STK_ADDR_MAX];
		char *end;
		long fd = strtol(e->d_name, &end, 10);

		if (*end || end == e->d_name || fd == dirfd(d))
			continue;
		if (getpeername((int)fd, (struct sockaddr *)&sa, &len) || sa.sin_family != AF_INET)
			continue;
		inet_ntop(AF_INET, &sa.sin_addr, host, sizeof(host));
		snprintf(name, sizeof(name), "%s:%u", host, ntohs(sa.sin_port));
		if (strcmp(name, peer) == 0)
			shutdown((int)fd, SHUT_RDWR);
	}
	closedir(d);
}

/* As storage does: the chain must be known at this version, its head ours. */
static int route(struct node *n, uint32_t chain_id, uint32_t chain_ver)
{
	const struct stk_rt_chain *ch;
	int rc = -ESTALE;

	pthread_mutex_lock(&g_rt_lock);
	ch = stk_routing_chain(&g_rt, chain_id);
	if (ch && ch->ntargets && ch->version == chain_ver && ch->targets[0] == n->id)
		rc = 0;
	pthread_mutex_unlock(&g_rt_lock);
	return rc;
}

/* Waits until gate_need reads run at once, or 5 s; records how many did. */
static void gate(struct node *n, const char *peer)
{
	uint64_t end = stk_now_ns() + 5000000000ull;

	pthread_mutex_lock(&n->lock);
	if (!n->first_peer[0])
		snprintf(n->first_peer, sizeof(n->first_peer), "%s", peer);
	else if (strcmp(n->first_peer, peer) != 0)
		n->other_peers++;
	n->running++;
	if (n->running > n->max_running)
		n->max_running = n->running;
	pthread_cond_broadcast(&n->cond);
	while (n->max_running < n->gate_need && stk_now_ns() < end) {
		pthread_mutex_unlock(&n->lock);
		usleep(1000);
		pthread_mutex_lock(&n->lock);
	}
	n->running--;
	pthread_mutex_unlock(&n->lock);
}

static int serve_read(struct node *n, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	static __thread uint32_t crcs[CS / STK_CRC_BLOCK];
	unsigned seq = atomic_fetch_add(&n->reads, 1) + 1;
	struct stk_msg_stor_read_req rq;
	struct stk_msg_stor_read_resp rp;
	uint8_t *buf;
	long got;
	int rc;

	if (stk_msg_stor_read_req_dec(&req->payload, &rq) || stk_rbuf_finish(&req->payload))
		return -EBADMSG;
	if (rq.length > CS)
		return -EINVAL;
	gate(n, req->peer);
	if (cut_here(&n->cut_at_read, seq)) {
		cut_connection(req->peer);
		return -EIO; /* never reaches the client */
	}
	rc = atomic_exchange(&n->read_errno, 0);
	if (rc)
		return rc;
	rc = route(n, rq.chain_id, rq.chain_ver);
	if (rc)
		return rc;
	buf = stk_rpc_resp_bulk_buf(resp, rq.length ? rq.length : 1);
	if (!buf)
		return -ENOMEM;
	got = stk_chunk_read(n->cs, rq.ino, rq.chunk_idx, rq.offset, buf, rq.length, crcs);
	if (got < 0)
		return (int)got;
	rp.ncrcs = stk_crc_blocks((uint64_t)got);
	if (rp.ncrcs && take(&n->short_crcs))
		rp.ncrcs--;
	stk_msg_stor_read_resp_enc(&resp->payload, &rp);
	for (uint32_t i = 0; i < rp.ncrcs; i++)
		stk_put_u32(&resp->payload, crcs[i]);
	if (got && take(&n->corrupt_reads))
		buf[got / 2] ^= 0x40; /* as if a bit flipped on the way */
	resp->bulk = buf;
	resp->bulk_len = (uint32_t)got;
	resp->frame_flags = STK_FRAME_BULK_SELF;
	return resp->payload.err;
}

static int serve_write(struct node *n, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	static __thread uint32_t crcs[CS / STK_CRC_BLOCK];
	unsigned seq = atomic_fetch_add(&n->writes, 1) + 1;
	struct stk_msg_stor_write_req rq;
	struct stk_msg_stor_write_resp rp;
	int rc;

	if (stk_msg_stor_write_req_dec(&req->payload, &rq))
		return -EBADMSG;
	if (rq.length != req->bulk_len || rq.length > CS || rq.ncrcs != stk_crc_blocks(rq.length))
		return -EBADMSG;
	for (uint32_t i = 0; i < rq.ncrcs; i++)
		crcs[i] = stk_get_u32(&req->payload);
	if (stk_rbuf_finish(&req->payload))
		return -EBADMSG;
	if (stk_crc32c_blocks_check(req->bulk, rq.length, STK_CRC_BLOCK, crcs) >= 0)
		return -EBADMSG;
	if (cut_here(&n->cut_at_write, seq)) {
		cut_connection(req->peer);
		return -EIO;
	}
	rc = atomic_exchange(&n->write_errno, 0);
	if (rc)
		return rc;
	rc = route(n, rq.chain_id, rq.chain_ver);
	if (rc)
		return rc;
	rc = stk_chunk_write(n->cs, rq.ino, rq.chunk_idx, rq.chunk_size, rq.offset, req->bulk,
			     rq.length, crcs, rq.flags, &rp.chunk_len);
	if (rc)
		return rc;
	return stk_msg_stor_write_resp_enc(&resp->payload, &rp);
}

static int node_handle(void *ctx, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	switch (req->hdr.opcode) {
	case STK_OP_STOR_READ:
		return serve_read(ctx, req, resp);
	case STK_OP_STOR_WRITE:
		return serve_write(ctx, req, resp);
	}
	return -ENOSYS;
}

static int mgmtd_handle(void *ctx, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	struct stk_msg_mgmt_get_routing_req rq;
	int rc;

	if (req->hdr.opcode != STK_OP_MGMT_GET_ROUTING)
		return -ENOSYS;
	if (stk_msg_mgmt_get_routing_req_dec(&req->payload, &rq) || stk_rbuf_finish(&req->payload))
		return -EBADMSG;
	atomic_fetch_add(&g_routing_calls, 1);
	pthread_mutex_lock(&g_rt_lock);
	rc = stk_routing_encode(&resp->payload, &g_rt);
	pthread_mutex_unlock(&g_rt_lock);
	return rc;
}

static void *run_server(void *arg)
{
	stk_server_run(arg);
	return NULL;
}

static int server_start(stk_rpc_handler_fn fn, void *ctx, const char *listen,
			struct stk_server **s, pthread_t *tid)
{
	struct stk_server_opts o = {.size = sizeof(o), .listen = listen, .handler = fn,
				    .ctx = ctx, .loops = 1, .workers = 16};
	int rc = stk_server_create(&o, s);

	if (rc)
		return rc;
	if (pthread_create(tid, NULL, run_server, *s)) {
		stk_server_destroy(*s);
		return -EAGAIN;
	}
	return 0;
}

static void server_stop(struct stk_server *s, pthread_t tid)
{
	stk_server_stop(s);
	pthread_join(tid, NULL);
	stk_server_destroy(s);
}

/* Node id's server, at listen (its old address when it comes back). */
static int node_serve(struct node *n, const char *listen)
{
	int rc = server_start(node_handle, n, listen, &n->srv, &n->tid);

	if (rc == 0)
		snprintf(n->addr, sizeof(n->addr), "%s", stk_server_addr(n->srv));
	return rc;
}

/* The nodes, their chunk stores, mgmtd and the table that ties them. */
/*
 * What each node tells the readers of its host (servemap.h), as a storage node
 * does from its table: it serves its chains (of one target, so for ever) at the
 * versions of the table now. Called again whenever a test changes the table.
 */
static void publish_maps(void)
{
	for (uint32_t i = 0; i < NNODES; i++) {
		struct stk_serve_chain ch[STK_SERVE_MAP_CHAINS];
		unsigned n = 0;

		pthread_mutex_lock(&g_rt_lock);
		for (uint32_t c = 0; c < NCHAINS && n < STK_SERVE_MAP_CHAINS; c++)
			if (g_rt_chains[c].targets[0] == g_nodes[i].id)
				ch[n++] = (struct stk_serve_chain){g_rt_chains[c].id,
								   g_rt_chains[c].version};
		pthread_mutex_unlock(&g_rt_lock);
		stk_serve_map_set(g_nodes[i].map, g_nodes[i].id, ch, n, STK_SERVE_FOREVER);
	}
}

static int cluster_start(void)
{
	int rc;

	rc = server_start(mgmtd_handle, NULL, "127.0.0.1:0", &g_mgmtd, &g_mgmtd_tid);
	if (rc)
		return rc;
	for (uint32_t i = 0; i < NNODES; i++) {
		struct node *n = &g_nodes[i];

		n->id = i + 1;
		pthread_mutex_init(&n->lock, NULL);
		pthread_cond_init(&n->cond, NULL);
		rc = check_tmpdir(n->dir, sizeof(n->dir), "io");
		if (rc == 0)
			rc = stk_chunk_store_open(n->dir, &n->cs);
		if (rc == 0)
			rc = stk_chunk_store_set_id(n->cs, n->id);
		if (rc == 0)
			rc = node_serve(n, "127.0.0.1:0");
		if (rc)
			return rc;
		g_rt_nodes[i] = (struct stk_rt_node){.id = n->id, .role = STK_ROLE_STORAGE,
						     .state = STK_NODE_ONLINE};
		snprintf(g_rt_nodes[i].addr, sizeof(g_rt_nodes[i].addr), "%s", n->addr);
		snprintf(g_rt_nodes[i].host_id, sizeof(g_rt_nodes[i].host_id), "%s", HOST_ID);
		g_rt_targets[i] = (struct stk_rt_target){.id = n->id, .node_id = n->id,
							 .state = STK_TARGET_SERVING};
		snprintf(g_rt_targets[i].path, sizeof(g_rt_targets[i].path), "%s",
			 stk_chunk_store_path(n->cs));
	}
	for (uint32_t c = 1; c <= NCHAINS; c++)
		g_rt_chains[c - 1] = (struct stk_rt_chain){
		    .id = c, .version = 1, .ntargets = 1, .targets = {(c - 1) % NNODES + 1}};
	for (uint32_t i = 0; i < NNODES; i++) {
		rc = stk_serve_map_create(g_nodes[i].dir, &g_nodes[i].map);
		if (rc)
			return rc;
	}
	publish_maps();
	return 0;
}

static void cluster_stop(void)
{
	for (unsigned i = 0; i < NNODES; i++) {
		struct node *n = &g_nodes[i];

		if (n->srv)
			server_stop(n->srv, n->tid);
		if (n->cs)
			stk_chunk_store_close(n->cs);
		stk_serve_map_close(n->map);
		if (n->dir[0])
			check_rm_rf(n->dir);
	}
	if (g_mgmtd)
		server_stop(g_mgmtd, g_mgmtd_tid);
}

/* The node holding chain_id's chunks. */
static struct node *chain_node(uint32_t chain_id)
{
	return &g_nodes[(chain_id - 1) % NNODES];
}

static unsigned total_reads(void)
{
	unsigned r = 0;

	for (unsigned i = 0; i < NNODES; i++)
		r += atomic_load(&g_nodes[i].reads);
	return r;
}

/* ---- the client ---- */

/*
 * A client handle as stk_connect makes one, less meta: its pool (conns
 * connections per node), retry window and the routing table fetched from mgmtd.
 */
static struct stk_client *client_new(unsigned conns, unsigned retry_ms)
{
	struct stk_client *c = calloc(1, sizeof(*c));

	if (!c)
		return NULL;
	snprintf(c->mgmtd, sizeof(c->mgmtd), "%s", stk_server_addr(g_mgmtd));
	stk_mgmt_addrs_parse(&c->mgmt, c->mgmtd);
	pthread_mutex_init(&c->mgmt_lock, NULL);
	c->retry_ms = retry_ms;
	pthread_rwlock_init(&c->rt_lock, NULL);
	pthread_mutex_init(&c->local_lock, NULL);
	if (stk_pool_create(conns, &c->pool) == 0 && stk_client_refresh_routing(c) == 0)
		return c;
	if (c->pool)
		stk_pool_destroy(c->pool);
	free(c);
	return NULL;
}

static void client_free(struct stk_client *c)
{
	if (!c)
		return;
	stk_pool_destroy(c->pool);
	for (unsigned i = 0; i < c->nlocals; i++) {
		if (c->locals[i].cs)
			stk_chunk_store_close(c->locals[i].cs);
		stk_serve_map_close(c->locals[i].map);
	}
	stk_routing_free(&c->rt);
	if (c->mgmt_conn)
		stk_conn_close(c->mgmt_conn);
	pthread_mutex_destroy(&c->mgmt_lock);
	pthread_rwlock_destroy(&c->rt_lock);
	pthread_mutex_destroy(&c->local_lock);
	free(c);
}

/* A file's layout: 64 KiB chunks striped over the four chains. */
static void file_layout(struct stk_layout *l, uint32_t *chains, uint64_t ino)
{
	stk_layout_make(l, CS, NCHAINS, NCHAINS, ino);
	stk_layout_chains(l, chains);
}

/* Cuts [off, off + len) of a file into its per-chunk pieces (as file.c does); their count. */
static unsigned make_pieces(const struct stk_layout *l, const uint32_t *chains, char *buf,
			    uint64_t off, size_t len, struct stk_io_piece *p)
{
	unsigned n = 0;

	while (len) {
		uint64_t idx = off / CS;
		uint32_t in = (uint32_t)(off % CS);
		uint32_t take_ = (uint32_t)STK_MIN((uint64_t)len, CS - in);

		p[n] = (struct stk_io_piece){.chain_id = stk_layout_chunk_chain(l, chains, idx),
					     .chunk_idx = (uint32_t)idx,
					     .offset = in,
					     .length = take_,
					     .buf = buf};
		n++;
		buf += take_;
		off += take_;
		len -= take_;
	}
	return n;
}

/* Stores [off, off + len) of file ino's pattern on its chains' nodes, past io.c. */
static int store_range(uint64_t ino, uint64_t off, size_t len)
{
	struct stk_layout l;
	uint32_t chains[NCHAINS];
	char *buf = malloc(CS);
	int rc = buf ? 0 : -ENOMEM;

	file_layout(&l, chains, ino);
	while (rc == 0 && len) {
		uint64_t idx = off / CS;
		uint32_t in = (uint32_t)(off % CS), clen;
		uint32_t n = (uint32_t)STK_MIN((uint64_t)len, CS - in);
		struct node *nd = chain_node(stk_layout_chunk_chain(&l, chains, idx));

		fill(buf, ino, off, n);
		rc = stk_chunk_write(nd->cs, ino, (uint32_t)idx, CS, in, buf, n, NULL, 0, &clen);
		off += n;
		len -= n;
	}
	free(buf);
	return rc;
}

/* Each piece: rc 0, every byte asked for, file ino's bytes from off on. */
static void check_pieces(const struct stk_io_piece *p, unsigned n, uint64_t ino, uint64_t off,
			 int line)
{
	for (unsigned i = 0; i < n; i++) {
		long bad = mismatch(p[i].buf, ino, off, p[i].length);

		if (p[i].rc != 0 || p[i].done != p[i].length || bad >= 0)
			check_fail_at(__FILE__, line,
				      "piece %u (chunk %u): rc %d, done %u of %u, first bad byte %ld",
				      i, p[i].chunk_idx, p[i].rc, p[i].done, p[i].length, bad);
		off += p[i].length;
	}
}

/* ---- the tests ---- */

/*
 * A read over several chunks and all four chains on both nodes lands in order; one
 * of 70 chunks, more than a window, too.
 */
static void test_read_across_chunks_and_chains(void)
{
	struct stk_client *c = client_new(2, 5000);
	struct stk_io_piece p[80];
	uint32_t chains[NCHAINS];
	unsigned r0[NNODES], n;
	struct stk_layout l;
	uint64_t off = CS / 2 + 123;
	size_t len = 7 * (size_t)CS;
	char *buf = malloc(70 * (size_t)CS);

	if (!c || !buf) {
		CHECK_FAIL("setup failed");
		goto out;
	}
	file_layout(&l, chains, INO_READ);
	CHECK_RC(store_range(INO_READ, 0, 70 * (size_t)CS), 0);
	for (unsigned i = 0; i < NNODES; i++)
		r0[i] = atomic_load(&g_nodes[i].reads);
	memset(buf, 0xee, len);
	n = make_pieces(&l, chains, buf, off, len, p);
	CHECK_EQ(n, 8);
	CHECK_RC(stk_io_run(c, STK_IO_READ, INO_READ, &l, p, n, 0), 0);
	check_pieces(p, n, INO_READ, off, __LINE__);
	/* one request per piece, and both nodes served some */
	for (unsigned i = 0; i < NNODES; i++)
		CHECK(atomic_load(&g_nodes[i].reads) > r0[i]);
	CHECK_EQ(total_reads() - r0[0] - r0[1], n);

	memset(buf, 0xee, 70 * (size_t)CS);
	n = make_pieces(&l, chains, buf, 0, 70 * (size_t)CS, p);
	CHECK_EQ(n, 70);
	CHECK_RC(stk_io_run(c, STK_IO_READ, INO_READ, &l, p, n, 0), 0);
	check_pieces(p, n, INO_READ, 0, __LINE__);
out:
	free(buf);
	client_free(c);
}

/*
 * A write lands in the right chunk of the right chain (read there by the chunk
 * store itself) and reads back byte for byte through io.c; an overwrite in the
 * middle merges; 40 chunks at once (the write's sliding window) too.
 */
static void test_write_then_read_back(void)
{
	struct stk_client *c = client_new(2, 5000);
	uint64_t off = 1000, ino2 = INO_WRITE + 1000;
	size_t len = 5 * (size_t)CS + 777;
	struct stk_io_piece p[48];
	uint32_t chains[NCHAINS];
	struct stk_layout l;
	char *w = malloc(40 * (size_t)CS), *r = malloc(40 * (size_t)CS);
	unsigned n;

	if (!c || !w || !r) {
		CHECK_FAIL("setup failed");
		goto out;
	}
	file_layout(&l, chains, INO_WRITE);
	fill(w, INO_WRITE, off, len);
	n = make_pieces(&l, chains, w, off, len, p);
	CHECK_RC(stk_io_run(c, STK_IO_WRITE, INO_WRITE, &l, p, n, 0), 0);
	for (unsigned i = 0; i < n; i++)
		CHECK(p[i].rc == 0 && p[i].done == p[i].length);
	/* on the nodes: chunk i on its chain's node, from the piece's offset */
	for (unsigned i = 0; i < n; i++) {
		struct node *nd = chain_node(p[i].chain_id);
		long got = stk_chunk_read(nd->cs, INO_WRITE, p[i].chunk_idx, p[i].offset, r,
					  p[i].length, NULL);

		CHECK_EQ(got, p[i].length);
		if (got == p[i].length)
			CHECK(memcmp(r, p[i].buf, p[i].length) == 0);
	}
	memset(r, 0xee, len);
	n = make_pieces(&l, chains, r, off, len, p);
	CHECK_RC(stk_io_run(c, STK_IO_READ, INO_WRITE, &l, p, n, 0), 0);
	check_pieces(p, n, INO_WRITE, off, __LINE__);

	/* 100 bytes over a chunk boundary, from another pattern */
	fill(w, ino2, 0, 100);
	n = make_pieces(&l, chains, w, 2 * (uint64_t)CS - 50, 100, p);
	CHECK_EQ(n, 2);
	CHECK_RC(stk_io_run(c, STK_IO_WRITE, INO_WRITE, &l, p, n, 0), 0);
	memset(r, 0xee, len);
	n = make_pieces(&l, chains, r, off, len, p);
	CHECK_RC(stk_io_run(c, STK_IO_READ, INO_WRITE, &l, p, n, 0), 0);
	{
		uint64_t at = 2 * (uint64_t)CS - 50 - off;

		CHECK_EQ(mismatch(r, INO_WRITE, off, at), -1);
		CHECK_EQ(mismatch(r + at, ino2, 0, 100), -1);
		CHECK_EQ(mismatch(r + at + 100, INO_WRITE, off + at + 100, len - at - 100), -1);
	}

	/* 40 chunks: more pieces than a window */
	fill(w, INO_BIG, 0, 40 * (size_t)CS);
	n = make_pieces(&l, chains, w, 0, 40 * (size_t)CS, p);
	CHECK_EQ(n, 40);
	CHECK_RC(stk_io_run(c, STK_IO_WRITE, INO_BIG, &l, p, n, STK_WRITE_SYNC), 0);
	memset(r, 0xee, 40 * (size_t)CS);
	n = make_pieces(&l, chains, r, 0, 40 * (size_t)CS, p);
	CHECK_RC(stk_io_run(c, STK_IO_READ, INO_BIG, &l, p, n, 0), 0);
	check_pieces(p, n, INO_BIG, 0, __LINE__);
out:
	free(w);
	free(r);
	client_free(c);
}

/*
 * A reply whose bulk fails its checksum is refused: -EIO, final (no second request
 * for it), the other pieces whole, and the bad bytes not in the caller's buffer.
 * A reply with a checksum missing is malformed: retried, then read whole.
 */
static void test_bad_checksum_refused(void)
{
	struct stk_client *c = client_new(2, 5000);
	struct stk_io_piece_ex px[4];
	struct stk_io_piece p[4];
	uint32_t chains[NCHAINS];
	struct node *nd = &g_nodes[1];
	struct stk_layout l;
	char *buf = malloc(4 * (size_t)CS);
	unsigned n, r0, failed = 0;

	if (!c || !buf) {
		CHECK_FAIL("setup failed");
		goto out;
	}
	file_layout(&l, chains, INO_READ);
	CHECK_RC(store_range(INO_READ, 0, 4 * (size_t)CS), 0);
	memset(buf, 0xee, 4 * (size_t)CS);
	n = make_pieces(&l, chains, buf, 0, 4 * (size_t)CS, p);
	r0 = total_reads();
	atomic_store(&nd->corrupt_reads, 1);
	CHECK_RC(stk_io_run(c, STK_IO_READ, INO_READ, &l, p, n, 0), -EIO);
	CHECK_EQ(total_reads() - r0, n); /* not retried */
	CHECK_EQ(atomic_load(&nd->corrupt_reads), 0);
	for (unsigned i = 0; i < n; i++) {
		uint64_t at = (uint64_t)i * CS;

		if (p[i].rc == 0) {
			CHECK_EQ(mismatch(p[i].buf, INO_READ, at, CS), -1);
			continue;
		}
		failed++;
		CHECK_RC(p[i].rc, -EIO);
		CHECK(chain_node(p[i].chain_id) == nd);
		/* the flipped byte, or anything else it sent, is not in the buffer */
		CHECK((uint8_t)p[i].buf[CS / 2] != (uint8_t)(pat(INO_READ, at + CS / 2) ^ 0x40));
	}
	CHECK_EQ(failed, 1);

	/* the batch engine: that piece fails alone */
	memset(buf, 0xee, 4 * (size_t)CS);
	n = make_pieces(&l, chains, buf, 0, 4 * (size_t)CS, p);
	for (unsigned i = 0; i < n; i++)
		px[i] = (struct stk_io_piece_ex){.p = p[i], .op = STK_IO_READ, .ino = INO_READ,
						 .layout = &l};
	atomic_store(&nd->corrupt_reads, 1);
	CHECK_RC(stk_io_run_multi(c, px, n, 0, NULL), -EIO);
	failed = 0;
	for (unsigned i = 0; i < n; i++) {
		if (px[i].p.rc == 0) {
			CHECK(px[i].p.done == CS);
			CHECK_EQ(mismatch(px[i].p.buf, INO_READ, (uint64_t)i * CS, CS), -1);
		} else {
			CHECK_RC(px[i].p.rc, -EIO);
			failed++;
		}
	}
	CHECK_EQ(failed, 1);

	/* one checksum short: a malformed reply, sent again */
	memset(buf, 0xee, 4 * (size_t)CS);
	n = make_pieces(&l, chains, buf, 0, 4 * (size_t)CS, p);
	r0 = total_reads();
	atomic_store(&nd->short_crcs, 1);
	CHECK_RC(stk_io_run(c, STK_IO_READ, INO_READ, &l, p, n, 0), 0);
	check_pieces(p, n, INO_READ, 0, __LINE__);
	CHECK_EQ(total_reads() - r0, n + 1);
out:
	free(buf);
	client_free(c);
}

/*
 * A chunk shorter than the read, a missing chunk and a read past a chunk's end
 * succeed with done saying how much there was (0 for a missing chunk); io.c leaves
 * the rest of the buffer alone: zeros for a hole are its caller's, which knows the
 * file's size (file.c). The same over the network and read locally.
 */
static void test_short_and_missing_chunks(void)
{
	struct stk_client *c = client_new(2, 5000);
	const uint32_t want[5] = {CS, 10000, 0, CS, 5000};
	struct stk_io_piece p[5];
	uint32_t chains[NCHAINS];
	struct stk_layout l;
	char *buf = malloc(5 * (size_t)CS);
	unsigned n, r0;

	if (!c || !buf) {
		CHECK_FAIL("setup failed");
		goto out;
	}
	file_layout(&l, chains, INO_HOLES);
	CHECK_RC(store_range(INO_HOLES, 0, CS), 0);
	CHECK_RC(store_range(INO_HOLES, CS, 10000), 0);
	CHECK_RC(store_range(INO_HOLES, 3 * (uint64_t)CS, CS + 5000), 0);
	for (int local = 0; local < 2; local++) {
		c->short_circuit = local;
		snprintf(c->host_id, sizeof(c->host_id), "%s", local ? HOST_ID : "");
		r0 = total_reads();
		memset(buf, 0xee, 5 * (size_t)CS);
		n = make_pieces(&l, chains, buf, 0, 5 * (size_t)CS, p);
		CHECK_RC(stk_io_run(c, STK_IO_READ, INO_HOLES, &l, p, n, 0), 0);
		for (unsigned i = 0; i < n; i++) {
			CHECK_RC(p[i].rc, 0);
			CHECK_EQ(p[i].done, want[i]);
			CHECK_EQ(mismatch(p[i].buf, INO_HOLES, (uint64_t)i * CS, want[i]), -1);
			for (uint32_t k = want[i]; k < CS; k++)
				if ((uint8_t)p[i].buf[k] != 0xee) {
					CHECK_FAIL("local %d: chunk %u byte %u past done changed",
						   local, i, k);
					break;
				}
		}
		CHECK_EQ(total_reads() - r0, local ? 0 : n);

		/* inside the short chunk, over its end; and wholly past it */
		memset(buf, 0xee, 2 * (size_t)CS);
		n = make_pieces(&l, chains, buf, CS + 5000, 10000, p);
		n += make_pieces(&l, chains, buf + 10000, CS + 20000, 3000, p + n);
		CHECK_EQ(n, 2);
		CHECK_RC(stk_io_run(c, STK_IO_READ, INO_HOLES, &l, p, n, 0), 0);
		CHECK(p[0].rc == 0 && p[0].done == 5000 && p[1].rc == 0 && p[1].done == 0);
		CHECK_EQ(mismatch(buf, INO_HOLES, CS + 5000, 5000), -1);
	}
out:
	free(buf);
	client_free(c);
}

/*
 * A connection reset with a window of reads (or writes) in flight on it: the
 * pieces on it are sent again and the call succeeds with the right bytes. With no
 * retry window left, the call fails with -EIO, and each piece that says it
 * succeeded holds the right bytes.
 */
static void test_transport_failure_mid_window(void)
{
	struct stk_client *c = client_new(1, 5000), *c0 = client_new(1, 0);
	struct stk_io_piece p[12];
	uint32_t chains[NCHAINS];
	struct node *nd = &g_nodes[0];
	struct stk_layout l;
	char *buf = malloc(12 * (size_t)CS);
	unsigned n, r0, w0, rt0, failed = 0;

	if (!c || !c0 || !buf) {
		CHECK_FAIL("setup failed");
		goto out;
	}
	file_layout(&l, chains, INO_READ);
	CHECK_RC(store_range(INO_READ, 0, 12 * (size_t)CS), 0);
	memset(buf, 0xee, 12 * (size_t)CS);
	n = make_pieces(&l, chains, buf, 0, 12 * (size_t)CS, p);
	r0 = atomic_load(&nd->reads);
	rt0 = atomic_load(&g_routing_calls);
	atomic_store(&nd->cut_at_read, r0 + 3);
	CHECK_RC(stk_io_run(c, STK_IO_READ, INO_READ, &l, p, n, 0), 0);
	check_pieces(p, n, INO_READ, 0, __LINE__);
	CHECK_EQ(atomic_load(&nd->cut_at_read), 0);
	CHECK(atomic_load(&nd->reads) - r0 > 6); /* its six, and again those cut */
	CHECK(atomic_load(&g_routing_calls) > rt0); /* refreshed before retrying */

	/* no retry window: -EIO, and no piece that says it is whole holds other bytes */
	memset(buf, 0xee, 12 * (size_t)CS);
	n = make_pieces(&l, chains, buf, 0, 12 * (size_t)CS, p);
	atomic_store(&nd->cut_at_read, atomic_load(&nd->reads) + 3);
	CHECK_RC(stk_io_run(c0, STK_IO_READ, INO_READ, &l, p, n, 0), -EIO);
	for (unsigned i = 0; i < n; i++) {
		if (p[i].rc != 0) {
			failed++;
			continue;
		}
		CHECK(p[i].done == CS);
		CHECK_EQ(mismatch(p[i].buf, INO_READ, (uint64_t)i * CS, CS), -1);
	}
	CHECK(failed >= 1);

	/* writes: the connection cut on the third, the file whole after */
	fill(buf, INO_WRITE + 7, 0, 12 * (size_t)CS);
	n = make_pieces(&l, chains, buf, 0, 12 * (size_t)CS, p);
	w0 = atomic_load(&nd->writes);
	atomic_store(&nd->cut_at_write, w0 + 3);
	CHECK_RC(stk_io_run(c, STK_IO_WRITE, INO_WRITE + 7, &l, p, n, 0), 0);
	CHECK_EQ(atomic_load(&nd->cut_at_write), 0);
	CHECK(atomic_load(&nd->writes) - w0 > 6);
	memset(buf, 0xee, 12 * (size_t)CS);
	n = make_pieces(&l, chains, buf, 0, 12 * (size_t)CS, p);
	CHECK_RC(stk_io_run(c, STK_IO_READ, INO_WRITE + 7, &l, p, n, 0), 0);
	check_pieces(p, n, INO_WRITE + 7, 0, __LINE__);
out:
	free(buf);
	client_free(c);
	client_free(c0);
}

/* Starts node n's server again at its old address after delay_ms. */
struct restart {
	struct node *n;
	unsigned delay_ms;
	int rc;
};

static void *restart_thread(void *arg)
{
	struct restart *r = arg;
	char addr[STK_ADDR_MAX];

	usleep(r->delay_ms * 1000);
	snprintf(addr, sizeof(addr), "%s", r->n->addr);
	r->rc = node_serve(r->n, addr);
	return NULL;
}

/*
 * STALE_ROUTING: the client refreshes its table and sends again with the chain's
 * new version. A node down for a moment: its pieces are retried until it is back.
 * A status other than those (ENOSPC) is final and returned as is, not retried.
 */
static void test_stale_routing_and_restart(void)
{
	struct stk_client *c = client_new(2, 5000);
	struct restart rs = {.n = &g_nodes[1], .delay_ms = 300};
	struct stk_io_piece p[8];
	uint32_t chains[NCHAINS];
	struct stk_layout l;
	char *buf = malloc(8 * (size_t)CS);
	unsigned n, rt0, r0, w0;
	pthread_t t;

	if (!c || !buf) {
		CHECK_FAIL("setup failed");
		goto out;
	}
	file_layout(&l, chains, INO_READ);
	CHECK_RC(store_range(INO_READ, 0, 8 * (size_t)CS), 0);

	/* chain 2 moves on to version 2 behind the client's back */
	pthread_mutex_lock(&g_rt_lock);
	g_rt_chains[1].version++;
	g_rt.version++;
	pthread_mutex_unlock(&g_rt_lock);
	publish_maps();
	rt0 = atomic_load(&g_routing_calls);
	r0 = total_reads();
	memset(buf, 0xee, 8 * (size_t)CS);
	n = make_pieces(&l, chains, buf, 0, 8 * (size_t)CS, p);
	CHECK_RC(stk_io_run(c, STK_IO_READ, INO_READ, &l, p, n, 0), 0);
	check_pieces(p, n, INO_READ, 0, __LINE__);
	CHECK(atomic_load(&g_routing_calls) > rt0);
	CHECK_EQ(total_reads() - r0, n + 2); /* chain 2's two pieces, twice */

	/* node 2 stopped, and back 300 ms later at the same address */
	server_stop(g_nodes[1].srv, g_nodes[1].tid);
	g_nodes[1].srv = NULL;
	CHECK(pthread_create(&t, NULL, restart_thread, &rs) == 0);
	memset(buf, 0xee, 8 * (size_t)CS);
	n = make_pieces(&l, chains, buf, 0, 8 * (size_t)CS, p);
	CHECK_RC(stk_io_run(c, STK_IO_READ, INO_READ, &l, p, n, 0), 0);
	pthread_join(t, NULL);
	CHECK_RC(rs.rc, 0);
	check_pieces(p, n, INO_READ, 0, __LINE__);

	/* ENOSPC: final, and the call stops sending */
	fill(buf, INO_WRITE + 9, 0, 8 * (size_t)CS);
	n = make_pieces(&l, chains, buf, 0, 8 * (size_t)CS, p);
	w0 = atomic_load(&g_nodes[0].writes) + atomic_load(&g_nodes[1].writes);
	atomic_store(&g_nodes[0].write_errno, -ENOSPC);
	CHECK_RC(stk_io_run(c, STK_IO_WRITE, INO_WRITE + 9, &l, p, n, 0), -ENOSPC);
	CHECK(atomic_load(&g_nodes[0].writes) + atomic_load(&g_nodes[1].writes) - w0 <= n);
	/* a read's EIO from storage (a corrupt chunk there): final too */
	r0 = total_reads();
	atomic_store(&g_nodes[0].read_errno, -EIO);
	n = make_pieces(&l, chains, buf, 0, 8 * (size_t)CS, p);
	CHECK_RC(stk_io_run(c, STK_IO_READ, INO_READ, &l, p, n, 0), -EIO);
	CHECK_EQ(total_reads() - r0, n);
out:
	free(buf);
	client_free(c);
}

/*
 * One connection per node and 32 pieces on each, the most stk_io_run sends at
 * once: the nodes see at least eight of them at a time on that one connection (a
 * gate holds each until eight run, 5 s at most); the batch engine with a window
 * of 64 too.
 */
static void test_window_wider_than_pool(void)
{
	struct stk_client *c = client_new(1, 5000);
	struct stk_io_piece_ex px[64];
	struct stk_io_piece p[64];
	struct stk_io_scratch scratch = {0};
	uint32_t chains[NCHAINS];
	struct stk_layout l;
	char *buf = malloc(64 * (size_t)CS);
	uint64_t t0;
	unsigned n;

	if (!c || !buf) {
		CHECK_FAIL("setup failed");
		goto out;
	}
	file_layout(&l, chains, INO_READ);
	CHECK_RC(store_range(INO_READ, 0, 64 * (size_t)CS), 0);
	for (int multi = 0; multi < 2; multi++) {
		for (unsigned i = 0; i < NNODES; i++) {
			struct node *nd = &g_nodes[i];

			pthread_mutex_lock(&nd->lock);
			nd->gate_need = 8;
			nd->max_running = 0;
			nd->first_peer[0] = 0;
			nd->other_peers = 0;
			pthread_mutex_unlock(&nd->lock);
		}
		memset(buf, 0xee, 64 * (size_t)CS);
		n = make_pieces(&l, chains, buf, 0, 64 * (size_t)CS, p);
		t0 = stk_now_ns();
		if (!multi) {
			CHECK_RC(stk_io_run(c, STK_IO_READ, INO_READ, &l, p, n, 0), 0);
			check_pieces(p, n, INO_READ, 0, __LINE__);
		} else {
			for (unsigned i = 0; i < n; i++)
				px[i] = (struct stk_io_piece_ex){
				    .p = p[i], .op = STK_IO_READ, .ino = INO_READ, .layout = &l};
			CHECK_RC(stk_io_run_multi(c, px, n, 64, &scratch), 0);
			for (unsigned i = 0; i < n; i++)
				p[i] = px[i].p;
			check_pieces(p, n, INO_READ, 0, __LINE__);
		}
		/* no gate waited its 5 s out */
		CHECK(stk_now_ns() - t0 < 4000000000ull);
		for (unsigned i = 0; i < NNODES; i++) {
			struct node *nd = &g_nodes[i];

			pthread_mutex_lock(&nd->lock);
			CHECK(nd->max_running >= 8);
			CHECK_EQ(nd->other_peers, 0);
			nd->gate_need = 0;
			pthread_mutex_unlock(&nd->lock);
		}
	}
out:
	stk_io_scratch_free(&scratch);
	free(buf);
	client_free(c);
}

/*
 * Short-circuit reads: a client on the nodes' host reads their chunk files itself,
 * no request sent. A chunk corrupt on disk fails that read; it then goes to the
 * node, which finds it corrupt too: -EIO, and zeros, not the bad bytes, in its
 * piece of the buffer.
 */
static void test_short_circuit(void)
{
	struct stk_client *c = client_new(2, 5000);
	struct stk_io_piece p[8];
	uint32_t chains[NCHAINS];
	struct stk_layout l;
	char *buf = malloc(8 * (size_t)CS);
	char path[PATH_MAX + 64];
	unsigned n, r0;
	struct node *nd;
	uint8_t b;
	int fd;

	if (!c || !buf) {
		CHECK_FAIL("setup failed");
		goto out;
	}
	c->short_circuit = 1;
	snprintf(c->host_id, sizeof(c->host_id), "%s", HOST_ID);
	file_layout(&l, chains, INO_LOCAL);
	CHECK_RC(store_range(INO_LOCAL, 0, 8 * (size_t)CS), 0);
	r0 = total_reads();
	memset(buf, 0xee, 8 * (size_t)CS);
	n = make_pieces(&l, chains, buf, 100, 8 * (size_t)CS - 200, p);
	CHECK_RC(stk_io_run(c, STK_IO_READ, INO_LOCAL, &l, p, n, 0), 0);
	check_pieces(p, n, INO_LOCAL, 100, __LINE__);
	CHECK_EQ(total_reads(), r0);
	CHECK_EQ(c->nlocals, NNODES);
	CHECK_EQ(c->sc_stats[STK_SC_READS], n);

	/*
	 * Only as the node would serve it (its serve map): a chunk with a change on its
	 * way down, and every chunk of a node that says it serves nothing, are read
	 * through the node; a chain whose version moved on behind the client's back
	 * once through the node (which answers STALE_ROUTING), then locally again.
	 */
	{
		uint64_t pend0 = c->sc_stats[STK_SC_PENDING], off0 = c->sc_stats[STK_SC_NOT_SERVING];
		uint64_t stale0 = c->sc_stats[STK_SC_STALE];
		struct node *n3 = chain_node(stk_layout_chunk_chain(&l, chains, 3));
		unsigned on_n3 = 0, on_c1 = 0;

		for (unsigned i = 0; i < n; i++) {
			on_n3 += chain_node(p[i].chain_id) == n3;
			on_c1 += p[i].chain_id == 1;
		}
		stk_serve_map_pending_begin(n3->map, INO_LOCAL, 3);
		r0 = total_reads();
		memset(buf, 0xee, 8 * (size_t)CS);
		n = make_pieces(&l, chains, buf, 0, 8 * (size_t)CS, p);
		CHECK_RC(stk_io_run(c, STK_IO_READ, INO_LOCAL, &l, p, n, 0), 0);
		check_pieces(p, n, INO_LOCAL, 0, __LINE__);
		CHECK_EQ(total_reads() - r0, 1);
		CHECK_EQ(c->sc_stats[STK_SC_PENDING] - pend0, 1);
		stk_serve_map_pending_end(n3->map, INO_LOCAL, 3);

		stk_serve_map_set(n3->map, n3->id, NULL, 0, 0);
		r0 = total_reads();
		CHECK_RC(stk_io_run(c, STK_IO_READ, INO_LOCAL, &l, p, n, 0), 0);
		check_pieces(p, n, INO_LOCAL, 0, __LINE__);
		CHECK_EQ(total_reads() - r0, on_n3);
		CHECK_EQ(c->sc_stats[STK_SC_NOT_SERVING] - off0, on_n3);
		publish_maps();

		pthread_mutex_lock(&g_rt_lock);
		g_rt_chains[0].version++;
		g_rt.version++;
		pthread_mutex_unlock(&g_rt_lock);
		publish_maps();
		r0 = total_reads();
		CHECK_RC(stk_io_run(c, STK_IO_READ, INO_LOCAL, &l, p, n, 0), 0);
		check_pieces(p, n, INO_LOCAL, 0, __LINE__);
		CHECK_EQ(total_reads() - r0, on_c1);
		CHECK(c->sc_stats[STK_SC_STALE] - stale0 >= on_c1);
		r0 = total_reads();
		CHECK_RC(stk_io_run(c, STK_IO_READ, INO_LOCAL, &l, p, n, 0), 0);
		CHECK_EQ(total_reads(), r0);
	}

	/* chunk 5's data, byte 3000 of it, flipped on disk (its header is 4 KiB) */
	nd = chain_node(stk_layout_chunk_chain(&l, chains, 5));
	snprintf(path, sizeof(path), "%s/chunks/%02x/%llx/%u", stk_chunk_store_path(nd->cs),
		 (unsigned)(INO_LOCAL % 256), (unsigned long long)INO_LOCAL, 5u);
	fd = open(path, O_RDWR);
	CHECK(fd >= 0);
	if (fd >= 0) {
		CHECK_EQ(pread(fd, &b, 1, 4096 + 3000), 1);
		b ^= 0x10;
		CHECK_EQ(pwrite(fd, &b, 1, 4096 + 3000), 1);
		close(fd);
	}
	r0 = total_reads();
	memset(buf, 0xee, 8 * (size_t)CS);
	n = make_pieces(&l, chains, buf, 0, 8 * (size_t)CS, p);
	CHECK_RC(stk_io_run(c, STK_IO_READ, INO_LOCAL, &l, p, n, 0), -EIO);
	CHECK_EQ(total_reads() - r0, 1); /* that piece, asked of its node once */
	for (unsigned i = 0; i < n; i++) {
		if (i != 5) {
			CHECK(p[i].rc == 0 || p[i].rc == 1); /* done, or never started */
			if (p[i].rc == 0)
				CHECK_EQ(mismatch(p[i].buf, INO_LOCAL, (uint64_t)i * CS, CS), -1);
			continue;
		}
		CHECK_RC(p[i].rc, -EIO);
		CHECK((uint8_t)p[i].buf[3000] != (uint8_t)(pat(INO_LOCAL, 5 * (uint64_t)CS + 3000) ^
							   0x10));
	}
out:
	free(buf);
	client_free(c);
}

int main(void)
{
	int rc;

	/* a reset connection is what some tests are about: no SIGPIPE */
	signal(SIGPIPE, SIG_IGN);
	rc = cluster_start();
	if (rc) {
		fprintf(stderr, "test_io: cannot start the nodes: %s\n", strerror(-rc));
		cluster_stop();
		return 77;
	}
	CHECK_RUN(test_read_across_chunks_and_chains);
	CHECK_RUN(test_write_then_read_back);
	CHECK_RUN(test_bad_checksum_refused);
	CHECK_RUN(test_short_and_missing_chunks);
	CHECK_RUN(test_transport_failure_mid_window);
	CHECK_RUN(test_stale_routing_and_restart);
	CHECK_RUN(test_window_wider_than_pool);
	CHECK_RUN(test_short_circuit);
	cluster_stop();
	return check_done();
}
