/*
 * The storage daemon: opens its target folders, registers them with mgmtd through
 * the node agent, and serves STOR_* requests on them.
 *
 * A request names a chain and the chain version the client routed with; the node
 * serves it on its own target in the chain. When the
 * client's table and ours disagree, the side that is behind must refresh: if the
 * client knows a chain we do not, or a newer version of it, or names a head we do
 * not hold, our table may be the stale one, so it is refreshed once and the
 * request looked up again; otherwise the client gets STALE_ROUTING and refreshes
 * its own.
 *
 * Each request runs on a worker (net.h), so a handler may block on disk; the chunk
 * store does the I/O with that thread's buffers. Reads of open chunks are served
 * on the event loops (below), and a change's forward waits for its successor on
 * the loop, not in its worker (write_on_loop, forward_on_loop).
 *
 * Chain replication (docs/architecture.md, "Replication"): a chain lists its
 * targets head first. A change (write, truncate, punch, sync) goes to the head,
 * which applies it and forwards it to its successor, which does the same; each
 * replies once its successor has replied, so the tail has every change the head
 * acknowledged, and every copy upstream of a replica holds what it holds and
 * maybe more. A write is forwarded with the chunk's lock held until the successor
 * answers (no other change of the chunk comes between) and with the version it applies to and the version it
 * makes (chunk.h); a replica whose copy is another version answers CHUNK_BEHIND
 * and is sent the whole chunk. Truncates and punches hold their inode's lock
 * exclusively while they are applied and forwarded, writes hold it shared, so
 * every replica sees an inode's changes in the head's order. A replica may read
 * from any serving replica; one that is not the tail answers CHUNK_PENDING while
 * a change of the chunk is on its way down, and the client reads from the tail.
 * A forward that fails (a successor gone, a chain changed) answers STALE_ROUTING:
 * the client refreshes its table and sends the change again, once mgmtd has
 * moved the lost target out of the chain. A write our copy took and our
 * successor did not stays pending here until the successor has our copy
 * (unsettled_note), whether or not its client sends it again.
 */
#include "storage.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stddef.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../daemon/daemon.h"
#include "../common/host.h"
#include "../common/layout.h"
#include "../common/auth.h"
#include "../common/log.h"
#include "../common/metrics.h"
#include "../common/util.h"
#include "../chunk/servemap.h"
#include "../mgmtd/agent.h"
#include "../net/net.h"
#include "../proto/msg.h"
#include "../proto/status.h"
#include "aio.h"
#include "chunk.h"
#include "metrics.h"
#include "qos.h"

#define INO_LOCKS 256u
#define PENDING_SLOTS 4096u
#define UNSETTLED_MAX 4096u

/*
 * The lock that keeps an inode's changes in the head's order (see the top): writes
 * share it, truncates and punches hold it alone. Not a pthread rwlock: a write
 * takes it on a worker and lets it go on the event loop that hears its
 * successor's answer, and a rwlock may only be unlocked by its owner. A write
 * waits only while a truncate holds it (not while one waits for it: writes are
 * not held up behind a truncate that waits for writes, as glibc's rwlock does).
 */
struct ino_lock {
	pthread_mutex_t m;
	pthread_cond_t cv; /* the lock was let go */
	unsigned shared; /* writes holding it */
	int alone; /* a truncate or punch holds it */
};

/* How far the resync in progress is (sync_target); target_id 0 while none runs. */
struct sync_prog {
	uint32_t target_id, chain_id;
	uint32_t permille; /* 0..1000: an estimate, see sync_note */
	uint64_t checked, copied, bytes;
};

/* One answer of meta's META_WITHIN, kept SUB_TTL_NS (see subtree_ok). */
struct sub_ent {
	uint64_t tree; /* hash of the subtree's path */
	uint64_t ino;
	uint64_t until_ns;
};
#define SUB_SLOTS 4096u
#define SUB_TTL_NS (5ull * 1000000000ull)

struct storage {
	struct stk_chunk_store **stores; /* one per target folder, in the order given */
	unsigned nstores;
	unsigned *tail_busy; /* per store: changes admitted as the chain's tail, not landed (tail_enter) */
	struct stk_pool *fwd; /* connections to successors in chains */
	struct stk_callwatch *watch; /* forwards to a node gone offline: aborted */
	int fenced; /* atomic: the last fenced() seen, for its log lines */
	/* see the top: changes of an inode in order; INO_LOCKS a target, in the
	 * order of stores (ino_locks_of) */
	struct ino_lock *ino_locks;
	int loop_writes; /* forwards sent from the event loops (STOKER_LOOP_WRITES) */
	uint32_t pending[PENDING_SLOTS]; /* atomic: changes on their way down, by chunk hash */
	struct stk_agent *agent;
	/* serve maps (serve_publish): one per store, NULL where none could be made */
	struct stk_serve_map **maps;
	pthread_mutex_t serve_lock; /* serialises serve_publish; protects serve_alive */
	uint64_t serve_alive; /* the fence deadline the agent last told */
	struct stk_storage_metrics *metrics; /* NULL without --metrics */
	pthread_t sync_thread; /* resyncs our SYNCING targets (sync_main) */
	int sync_started;
	int sync_stop; /* atomic */
	uint64_t resync_rate; /* bytes a second a resync fetches at most; 0: no limit */
	pthread_mutex_t prog_lock; /* protects prog */
	struct sync_prog prog; /* the resync in progress, for heartbeats (report_targets) */
	struct stk_metrics_ops *rpc_metrics; /* NULL without --metrics; for per-client counts */
	/* repair and scrub (repair_main): the queue of damaged chunks, under repair_lock */
	pthread_mutex_t repair_lock;
	pthread_cond_t repair_cv; /* a chunk queued, or stopping */
	struct repair_ent *repairq; /* REPAIR_QUEUE entries */
	unsigned repair_head, repair_n;
	pthread_t repair_thread;
	int repair_started;
	uint64_t scrub_rate; /* bytes/s; 0: no scrubbing */
	uint64_t scrub_interval_s; /* from one pass's start to the next */
	/* inodes meta said lie under a client key's subtree (subtree_ok), under sub_lock */
	pthread_mutex_t sub_lock;
	struct sub_ent *sub;
	/*
	 * Vouchers (vouch_check): the vouch key (vouching 0 without the cluster key),
	 * and what meta's epoch and moves said when last asked, at epoch_ns
	 * (monotonic; 0: never), under sub_lock: its base, the epoch it was then
	 * (known), the epoch a voucher must be at least (wide, floor), and per slot
	 * of inode numbers the epoch of the last move of one (moved_at,
	 * MOVED_SLOTS; NULL: no voucher is taken). old_ns: when a meta from before
	 * moves answered (plain META_EPOCH for a minute, every rename wide);
	 * epoch_only: always so (STOKER_TEST_VOUCH_EPOCH_ONLY=1, for tests of that
	 * path). Counts in vouch_m (enum vouch_result) and asks_m (within, epoch).
	 */
	int vouching, epoch_only;
	uint8_t vouch_key[STK_AUTH_MAC];
	uint64_t epoch_ns, mv_base, mv_known, mv_wide, mv_floor, mv_old_ns;
	uint64_t *moved_at;
	stk_metric_t vouch_m[4], asks_m[2];
	/* changes our successor never took (unsettled_note), and the thread that
	 * sends them again (settle_main); the table under settle_lock */
	pthread_mutex_t settle_lock;
	pthread_cond_t settle_cv;    /* stopping */
	struct unsettled *unsettled; /* UNSETTLED_MAX entries, nunsettled used */
	unsigned nunsettled;
	int unsettled_full_logged;
	/* entries the table may hold (at most UNSETTLED_MAX; STOKER_TEST_UNSETTLED_MAX
	 * lowers it for tests), and those held by changes on their way down
	 * (unsettled_reserve; atomic) */
	unsigned unsettled_max;
	unsigned test_tail_delay_ms; /* STOKER_TEST_TAIL_DELAY_MS: see handle_write */
	unsigned unsettled_held;
	uint64_t refused_log_ns; /* atomic: when unsettled_reserve last logged a refusal */
	int settle_metrics;	 /* settle_collect is a collector */
	/* stoker_node_unsettled_* and _settle_* (settle_collect); 0 without --metrics */
	stk_metric_t m_unsettled, m_oldest, m_capacity, m_resends, m_failures, m_refused;
	pthread_t settle_thread;
	int settle_started;
	/* write state kept for the next write (wjob_get), under wjob_lock */
	pthread_mutex_t wjob_lock;
	struct wjob *wjob_free;
	unsigned wjob_nfree;
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
		pthread_mutex_lock(&s->prog_lock);
		if (s->prog.target_id && s->prog.target_id == t->target_id) {
			t->sync_chain = s->prog.chain_id;
			t->sync_permille = s->prog.permille;
			t->sync_checked = s->prog.checked;
			t->sync_copied = s->prog.copied;
			t->sync_bytes = s->prog.bytes;
		}
		pthread_mutex_unlock(&s->prog_lock);
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

/* Where this node's target stands in a chain (route_look). */
struct hop {
	struct stk_chunk_store *cs;
	unsigned pos; /* 0: the head */
	uint32_t chain_ver; /* the chain's version in our table */
	int tail; /* no successor */
	int readable; /* the target is serving (not being synced, not offline) */
	int read_tail; /* no member after ours serves reads (ours holds only what is acked) */
	char next[STK_ADDR_MAX]; /* the successor's node address ("" at the tail) */
};

/*
 * Whether this node must serve no replicated chain now: mgmtd has not answered a
 * heartbeat for so long that it may have taken the node out of its chains and let
 * them go on without it (stk_agent_fenced). Then a client that still routes by an
 * old table, or a predecessor cut off with us, would read or change a copy the
 * rest of the chain no longer keeps. Logged when it starts and when it ends.
 */
static int fenced(struct storage *s)
{
	int now = stk_agent_fenced(s->agent), was = __atomic_load_n(&s->fenced, __ATOMIC_RELAXED);

	if (now != was && __atomic_compare_exchange_n(&s->fenced, &was, now, 0, __ATOMIC_RELAXED,
						      __ATOMIC_RELAXED)) {
		if (now)
			stk_warn("no heartbeat answered by mgmtd for most of its timeout: serving "
				 "no replicated chain until it answers");
		else
			stk_info("mgmtd answers again: serving replicated chains");
	}
	return now;
}

/*
 * One look at our routing table for our target in chain_id (with check_ver, the
 * client's chain version must match ours). 0, -ESTALE (the client is behind) or
 * -EAGAIN (our table may be the one behind: refresh and look again).
 */
static int route_look(struct storage *s, uint32_t chain_id, int check_ver, uint32_t chain_ver,
		      struct hop *h)
{
	struct stk_routing_ref *ref = stk_agent_routing_get(s->agent);
	const struct stk_rt_chain *c = stk_routing_chain(&ref->rt, chain_id);
	int ours_behind = 1;

	h->cs = NULL;
	if (c && c->ntargets > 1 && fenced(s)) {
		stk_agent_routing_put(s->agent, ref);
		return -ESTALE; /* the client asks mgmtd, and routes around this node */
	}
	if (c && c->ntargets && check_ver && c->version != chain_ver) {
		ours_behind = chain_ver > c->version;
	} else if (c) {
		/* The members changes reach (working ones, and a syncing one last), in
		 * order; ours among them. */
		const struct stk_rt_target *m[STK_MAX_REPLICAS];
		unsigned nm = 0, last_readable = 0;

		for (unsigned i = 0; i < c->ntargets; i++) {
			const struct stk_rt_target *t = stk_routing_target(&ref->rt, c->targets[i]);

			if (t && (t->state == STK_TARGET_SERVING || t->state == STK_TARGET_FULL))
				last_readable = nm;
			if (t && (t->state == STK_TARGET_SERVING || t->state == STK_TARGET_FULL ||
				  t->state == STK_TARGET_SYNCING))
				m[nm++] = t;
		}
		for (unsigned i = 0; i < nm && !h->cs; i++) {
			const struct stk_rt_node *nn;

			h->cs = local_target(s, m[i]->id);
			if (!h->cs)
				continue;
			h->pos = i;
			h->chain_ver = c->version;
			h->tail = i + 1 == nm;
			h->readable = m[i]->state != STK_TARGET_SYNCING;
			h->read_tail = i >= last_readable;
			h->next[0] = 0;
			if (h->tail)
				break;
			nn = stk_routing_node(&ref->rt, m[i + 1]->node_id);
			if (nn)
				memcpy(h->next, nn->addr, STK_ADDR_MAX);
			else
				h->cs = NULL; /* a successor we cannot name: our table is behind */
		}
		/* Not a working member here (offline or stale serves nothing): one of the
		 * two tables is behind; ours is fetched once more before the client is told. */
		ours_behind = !h->cs;
	}
	stk_agent_routing_put(s->agent, ref);
	if (h->cs)
		return 0;
	return ours_behind ? -EAGAIN : -ESTALE;
}

/* route_look, refreshing our table once where it may be behind (blocks). 0 or -ESTALE. */
static int route(struct storage *s, uint32_t chain_id, int check_ver, uint32_t chain_ver,
		 struct hop *h)
{
	int rc = route_look(s, chain_id, check_ver, chain_ver, h);

	if (rc != -EAGAIN)
		return rc;
	stk_agent_routing_refresh(s->agent);
	rc = route_look(s, chain_id, check_ver, chain_ver, h);
	return rc == -EAGAIN ? -ESTALE : rc;
}

/*
 * Changes admitted at a chain's tail. A member that joins the chain (SYNCING,
 * last) copies what its predecessor's chunk list and reads show (STOR_SYNC_LIST,
 * STOR_SYNC_READ, served once the predecessor knows it is there) and takes, as
 * changes, those the predecessor admits after that. A change the predecessor
 * admitted before, as the tail, is sent on to no one; should it land after the
 * list or read of its chunk (a new chunk is renamed into place at the end), the
 * new member would hold neither, and the chain would serve it one copy short.
 * So every change admitted as the tail is counted on its target until it has
 * landed, and a sync list waits until none admitted before it is left:
 *   - tail_enter counts it, then looks at our table again: a chain that moved
 *     since the change was routed refuses it (-ESTALE; its sender sends it again
 *     by the new table), so that every change counted was admitted under a table
 *     older than the list's, or is seen by the list's wait;
 *   - handle_sync_list waits (tail_drain) until the count is zero: the changes
 *     admitted since go on to the new member as changes.
 */
static unsigned *tail_count(struct storage *s, struct stk_chunk_store *cs)
{
	for (unsigned i = 0; i < s->nstores; i++)
		if (s->stores[i] == cs)
			return &s->tail_busy[i];
	return NULL;
}

/* A change routed by h (to chain_id) is about to be made here: 0 or -ESTALE. */
static int tail_enter(struct storage *s, uint32_t chain_id, const struct hop *h)
{
	unsigned *n = h->tail ? tail_count(s, h->cs) : NULL;
	struct hop now;

	if (!n)
		return 0;
	__atomic_add_fetch(n, 1, __ATOMIC_SEQ_CST);
	if (route_look(s, chain_id, 0, 0, &now) == 0 && now.cs == h->cs && now.tail &&
	    now.chain_ver == h->chain_ver)
		return 0;
	__atomic_sub_fetch(n, 1, __ATOMIC_SEQ_CST);
	return -ESTALE;
}

/* The change tail_enter admitted has landed here (or failed). */
static void tail_leave(struct storage *s, const struct hop *h)
{
	unsigned *n = h->tail ? tail_count(s, h->cs) : NULL;

	if (n)
		__atomic_sub_fetch(n, 1, __ATOMIC_SEQ_CST);
}

#define TAIL_DRAIN_MS 5000u

/*
 * Waits until no change admitted as the tail of cs's chain is on its way in
 * (on a worker; each is one disk write, so this is short): 0, or -EAGAIN after
 * TAIL_DRAIN_MS (the syncing member asks again).
 */
static int tail_drain(struct storage *s, struct stk_chunk_store *cs)
{
	unsigned *n = tail_count(s, cs);

	for (unsigned ms = 0; n && __atomic_load_n(n, __ATOMIC_SEQ_CST); ms++) {
		if (ms == TAIL_DRAIN_MS)
			return -EAGAIN;
		usleep(1000);
	}
	return 0;
}

/* ---- forwarding down the chain ---- */

/*
 * For the call watch (net.h): whether the node at addr is no longer an ONLINE
 * node of the cluster, by our table fetched again from mgmtd. A forward to a node
 * cut off by the network then fails once mgmtd has given up on the node (its
 * heartbeat timeout), not at the RPC timeout; the client sends the change again
 * on the chain that goes on without it.
 */
static int node_gone(void *ctx, const char *addr)
{
	struct storage *s = ctx;
	struct stk_routing_ref *ref;
	int online = 0;

	if (!s->agent)
		return 0;
	stk_agent_routing_refresh(s->agent);
	ref = stk_agent_routing_get(s->agent);
	for (uint32_t i = 0; i < ref->rt.nnodes && !online; i++)
		online = ref->rt.nodes[i].state == STK_NODE_ONLINE &&
			 strcmp(ref->rt.nodes[i].addr, addr) == 0;
	stk_agent_routing_put(s->agent, ref);
	return !online;
}

/* ---- serve maps: the node's state for short-circuit readers ---- */

/*
 * A client on this host reads our targets' chunk files itself only as this node
 * would serve the read (src/chunk/servemap.h): each target's map says the chain
 * the target is in, its version in our table, and until when we serve it, and
 * its buckets follow the changes on their way down (pending_begin/_end). The
 * maps are made before the server takes a request, retiring those a former run
 * left, and retired when the node stops.
 */
static void serve_maps_open(struct storage *s)
{
	s->maps = calloc(s->nstores, sizeof(*s->maps));
	for (unsigned i = 0; s->maps && i < s->nstores; i++) {
		const char *dir = stk_chunk_store_path(s->stores[i]);
		int rc = stk_serve_map_create(dir, &s->maps[i]);

		if (rc)
			stk_warn("target folder %s: cannot make its serve map (%s): clients of this "
				 "host read its chunks through the node",
				 dir, strerror(-rc));
	}
}

static void serve_maps_close(struct storage *s)
{
	for (unsigned i = 0; s->maps && i < s->nstores; i++)
		stk_serve_map_close(s->maps[i]);
	free(s->maps);
	s->maps = NULL;
}

/*
 * Publishes what route_look would decide of a local read of each target by table
 * rt (read_check's pending part is the buckets'): the chains the target is in,
 * with their versions, while the target is serving or full (not syncing, not
 * offline), until the fence deadline if one of them is replicated (fenced(): then
 * we serve none of them), for ever if all are of one target (served fenced or
 * not). The agent calls it before a new table becomes current and after each
 * answered heartbeat (stk_agent_state_fn); serve_start once the target ids are
 * known.
 */
static void serve_publish(void *ctx, const struct stk_routing *rt, uint64_t alive_until)
{
	struct storage *s = ctx;

	if (!s->maps)
		return;
	pthread_mutex_lock(&s->serve_lock);
	s->serve_alive = alive_until;
	for (unsigned i = 0; i < s->nstores; i++) {
		uint32_t tid = stk_chunk_store_id(s->stores[i]);
		const struct stk_rt_target *t = tid ? stk_routing_target(rt, tid) : NULL;
		struct stk_serve_chain ch[STK_SERVE_MAP_CHAINS];
		uint64_t valid = STK_SERVE_FOREVER;
		unsigned n = 0;

		if (!s->maps[i])
			continue;
		if (!t || (t->state != STK_TARGET_SERVING && t->state != STK_TARGET_FULL))
			valid = 0;
		for (uint32_t c = 0; valid && c < rt->nchains && n < STK_SERVE_MAP_CHAINS; c++) {
			const struct stk_rt_chain *rc = &rt->chains[c];

			for (unsigned k = 0; k < rc->ntargets; k++) {
				if (rc->targets[k] != tid)
					continue;
				ch[n++] = (struct stk_serve_chain){rc->id, rc->version};
				if (rc->ntargets > 1)
					valid = alive_until; /* may be 0: no heartbeat answered yet */
				break;
			}
		}
		stk_serve_map_set(s->maps[i], tid, ch, valid ? n : 0, valid);
	}
	pthread_mutex_unlock(&s->serve_lock);
}

/* serve_publish by the agent's current table, once our target ids are set. */
static void serve_start(struct storage *s)
{
	struct stk_routing_ref *ref = stk_agent_routing_get(s->agent);
	uint64_t alive;

	pthread_mutex_lock(&s->serve_lock);
	alive = s->serve_alive;
	pthread_mutex_unlock(&s->serve_lock);
	serve_publish(s, &ref->rt, alive);
	stk_agent_routing_put(s->agent, ref);
}

/*
 * A change of chunk ino/idx begins or ends its way down the chain. The chunk is
 * on one of our targets; the caller does not say which, so every map's bucket
 * says so (a few atomic adds: a node has a handful of targets).
 */
static void serve_pending(struct storage *s, uint64_t ino, uint32_t idx, int begin)
{
	for (unsigned i = 0; s->maps && i < s->nstores; i++) {
		if (!s->maps[i])
			continue;
		if (begin)
			stk_serve_map_pending_begin(s->maps[i], ino, idx);
		else
			stk_serve_map_pending_end(s->maps[i], ino, idx);
	}
}

static uint32_t *pending_slot(struct storage *s, uint64_t ino, uint32_t idx)
{
	uint64_t k = (ino * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)idx * 0xBF58476D1CE4E5B9ull);

	return &s->pending[(k >> 32) % PENDING_SLOTS];
}

/* A change of chunk ino/idx starts on its way down: until pending_end, reads of
 * our copy go to the tail (read_check), and so do those of this host's
 * short-circuit readers (serve_pending: before the chunk file changes). */
static void pending_begin(struct storage *s, uint64_t ino, uint32_t idx)
{
	serve_pending(s, ino, idx, 1);
	__atomic_add_fetch(pending_slot(s, ino, idx), 1, __ATOMIC_RELAXED);
}

/* The change pending_begin announced is acknowledged by the tail, or failed. */
static void pending_end(struct storage *s, uint64_t ino, uint32_t idx)
{
	__atomic_sub_fetch(pending_slot(s, ino, idx), 1, __ATOMIC_RELAXED);
	serve_pending(s, ino, idx, 0);
}

/*
 * Unsettled changes. A member that applied a change its successor did not take
 * (the successor refused it: fenced, or its chain version moved; or the forward
 * failed: the successor gone, cut off, out of space) holds a copy the rest of the
 * chain may never get: the client that sent it was told to send it again, but
 * may not live to. So the change stays pending here (pending_begin: reads of our
 * copy go to the tail, whose copy is the committed one) until our successor has
 * our copy, or we are the tail ourselves, or out of the chain:
 *   - the next change of the chunk that reaches our successor settles it (it is
 *     forwarded even when it changes nothing here; a successor whose version is
 *     not the one it applies to is sent the whole chunk anyway);
 *   - else settle_main sends the whole chunk again, after SETTLE_MS and then
 *     with backoff up to SETTLE_MAX_MS, once the chain is mended (a successor
 *     that answers; a new one; none, when we became the tail).
 * So no replica serves as committed a change that the tail may not hold, and
 * copies that parted that way meet again without the writer. Each entry holds one
 * pending mark. Noted, cleared and looked at only with the chunk's lock held, so
 * that no write of the chunk comes between an entry and the copy it is about.
 */
struct unsettled {
	struct stk_chunk_store *cs;
	uint32_t chain_id;
	uint64_t ino;
	uint32_t idx; /* UNSETTLED_INODE: a truncate or punch of the inode */
	uint32_t chunk_size;
	/* UNSETTLED_INODE: the change, sent again as it was */
	uint16_t op; /* STK_OP_STOR_TRUNCATE (size, chunk_size, ns) or _PUNCH (first, end) */
	uint64_t size, ns_hi, ns_lo;
	uint32_t first, end;
	/* when it was noted; when settle_main may send it again; resends that failed */
	uint64_t since_ns, next_ns;
	uint32_t tries;
};

/*
 * A truncate or punch is unsettled by inode (its idx is UNSETTLED_INODE), as it
 * may have removed chunks here that our successor keeps. Until it is settled the
 * inode takes no other change here (inode_unsettled: the change is refused with
 * STALE_ROUTING, and its sender tries again), so that the change is sent again
 * as the last one made to the inode: a truncate sent after a later write would
 * cut what that write made. Its reads go to the tail (read_check). Noted,
 * cleared and looked at with the inode's lock held (alone to note or clear).
 */
#define UNSETTLED_INODE UINT32_MAX

/*
 * settle_main looks at the table every SETTLE_MS. A change its successor did not
 * take again waits SETTLE_MS, then twice as long after each failure, up to
 * SETTLE_MAX_MS (settle_delay_ns), and so do the other changes of its chain: a
 * successor whose disk is full, or that refuses for minutes, is asked every 10 s,
 * not four times a second per change. A write of the chunk that reaches the
 * successor settles it at once, whatever the wait.
 */
#define SETTLE_MS 250
#define SETTLE_MAX_MS 10000
#define SETTLE_FAILED_MAX 64u /* chains a settle round gives up on before it stops */

/* The entry of chunk ino/idx of cs, or -1; settle_lock held. */
static int unsettled_find(struct storage *s, struct stk_chunk_store *cs, uint64_t ino, uint32_t idx)
{
	for (unsigned i = 0; i < s->nunsettled; i++)
		if (s->unsettled[i].cs == cs && s->unsettled[i].ino == ino &&
		    s->unsettled[i].idx == idx)
			return (int)i;
	return -1;
}

/* Whether a change of chunk ino/idx of cs is unsettled here (its lock held). */
static int unsettled_has(struct storage *s, struct stk_chunk_store *cs, uint64_t ino, uint32_t idx)
{
	int i;

	if (!__atomic_load_n(&s->nunsettled, __ATOMIC_RELAXED))
		return 0; /* the common case: no lock taken */
	pthread_mutex_lock(&s->settle_lock);
	i = unsettled_find(s, cs, ino, idx);
	pthread_mutex_unlock(&s->settle_lock);
	return i >= 0;
}

/*
 * Our copy of chunk ino/idx of cs (in chain_id, chunks of chunk_size) changed and
 * our successor did not take it (rc, its error): pending until settled. With the
 * chunk's lock held; any thread, the loop's included (it does not block).
 */
static void unsettled_note(struct storage *s, struct stk_chunk_store *cs, uint32_t chain_id,
			   uint64_t ino, uint32_t idx, uint32_t chunk_size, int rc)
{
	int added = 0;

	pthread_mutex_lock(&s->settle_lock);
	if (unsettled_find(s, cs, ino, idx) < 0 && s->nunsettled < UNSETTLED_MAX) {
		s->unsettled[s->nunsettled] = (struct unsettled){.cs = cs,
								 .chain_id = chain_id,
								 .ino = ino,
								 .idx = idx,
								 .chunk_size = chunk_size,
								 .since_ns = stk_now_ns()};
		__atomic_store_n(&s->nunsettled, s->nunsettled + 1, __ATOMIC_RELAXED);
		pending_begin(s, ino, idx);
		/* settle_main looks within SETTLE_MS: its writer may send it again first */
		added = 1;
	} else if (s->nunsettled >= UNSETTLED_MAX && !s->unsettled_full_logged) {
		s->unsettled_full_logged = 1;
		stk_error("%u changes wait for their successors: chunk %llx/%u is not kept pending "
			  "until its successor has it",
			  UNSETTLED_MAX, (unsigned long long)ino, idx);
	}
	pthread_mutex_unlock(&s->settle_lock);
	if (added)
		stk_info("chunk %llx/%u of chain %u: our successor did not take a change (%s); it "
			 "stays pending until it does",
			 (unsigned long long)ino, idx, chain_id, strerror(-rc));
}

/* Our successor has our copy of chunk ino/idx of cs (or none needs it): settled. */
static void unsettled_clear(struct storage *s, struct stk_chunk_store *cs, uint64_t ino,
			    uint32_t idx, const char *how)
{
	int i;

	if (!__atomic_load_n(&s->nunsettled, __ATOMIC_RELAXED))
		return;
	pthread_mutex_lock(&s->settle_lock);
	i = unsettled_find(s, cs, ino, idx);
	if (i >= 0) {
		s->unsettled[i] = s->unsettled[s->nunsettled - 1];
		__atomic_store_n(&s->nunsettled, s->nunsettled - 1, __ATOMIC_RELAXED);
		if (s->nunsettled < UNSETTLED_MAX / 2)
			s->unsettled_full_logged = 0;
	}
	pthread_mutex_unlock(&s->settle_lock);
	if (i < 0)
		return;
	if (idx == UNSETTLED_INODE) {
		stk_info("inode %llx: settled (%s)", (unsigned long long)ino, how);
		return;
	}
	pending_end(s, ino, idx);
	stk_info("chunk %llx/%u: settled (%s)", (unsigned long long)ino, idx, how);
}

/* Whether a truncate or punch of inode ino of cs is unsettled here (its lock held). */
static int inode_unsettled(struct storage *s, struct stk_chunk_store *cs, uint64_t ino)
{
	return unsettled_has(s, cs, ino, UNSETTLED_INODE);
}

/*
 * Our copy of inode ino took truncate or punch u (op and arguments set), which our
 * successor did not (rc): unsettled until it does. With the inode's lock alone.
 */
static void inode_unsettled_note(struct storage *s, struct stk_chunk_store *cs,
				 const struct unsettled *u, int rc)
{
	int added = 0;

	pthread_mutex_lock(&s->settle_lock);
	if (unsettled_find(s, cs, u->ino, UNSETTLED_INODE) < 0 && s->nunsettled < UNSETTLED_MAX) {
		struct unsettled *e = &s->unsettled[s->nunsettled];

		*e = *u;
		e->cs = cs;
		e->idx = UNSETTLED_INODE;
		e->since_ns = stk_now_ns();
		e->next_ns = 0;
		e->tries = 0;
		__atomic_store_n(&s->nunsettled, s->nunsettled + 1, __ATOMIC_RELAXED);
		added = 1;
	} else if (s->nunsettled >= UNSETTLED_MAX && !s->unsettled_full_logged) {
		s->unsettled_full_logged = 1;
		stk_error("%u changes wait for their successors: a %s of inode %llx is not sent "
			  "again",
			  UNSETTLED_MAX, stk_opcode_name(u->op), (unsigned long long)u->ino);
	}
	pthread_mutex_unlock(&s->settle_lock);
	if (added)
		stk_info("inode %llx of chain %u: our successor did not take a %s (%s); the inode "
			 "takes no other change until it does",
			 (unsigned long long)u->ino, u->chain_id, stk_opcode_name(u->op),
			 strerror(-rc));
}

/*
 * The table has room for every change on its way down. A change that goes on to
 * a successor holds n slots (one per entry it may note: a write or a truncate 1,
 * a STOR_TRUNCATES its inodes) from before it is applied here until it is over,
 * so that, should the successor not take it, it can be noted and kept pending:
 * a change that could not be would be read from our copy as committed while the
 * tail may never get it. When the slots held and the entries noted would pass
 * unsettled_max, the change is refused before anything is applied, with -EAGAIN
 * (STK_ST_AGAIN: the client tries again with backoff), until changes settle.
 * Slots held and entries noted are counted apart (an entry noted by a change
 * still on its way counts twice), so an entry always fits when noted. Any thread.
 */
static int unsettled_reserve(struct storage *s, unsigned n)
{
	unsigned held = __atomic_add_fetch(&s->unsettled_held, n, __ATOMIC_RELAXED);
	uint64_t now, last;

	if ((uint64_t)held + __atomic_load_n(&s->nunsettled, __ATOMIC_RELAXED) <= s->unsettled_max)
		return 0;
	__atomic_sub_fetch(&s->unsettled_held, n, __ATOMIC_RELAXED);
	stk_metric_add(s->m_refused, 1);
	now = stk_now_ns();
	last = __atomic_load_n(&s->refused_log_ns, __ATOMIC_RELAXED);
	if (now - last > 10000000000ull &&
	    __atomic_compare_exchange_n(&s->refused_log_ns, &last, now, 0, __ATOMIC_RELAXED,
					__ATOMIC_RELAXED))
		stk_error(
		    "%u changes wait for their successors (the most this node holds): new "
		    "changes are refused (EAGAIN, retried by their clients) until some settle",
		    __atomic_load_n(&s->nunsettled, __ATOMIC_RELAXED));
	return -EAGAIN;
}

/* The change that held n slots (unsettled_reserve) is over. */
static void unsettled_release(struct storage *s, unsigned n)
{
	if (n)
		__atomic_sub_fetch(&s->unsettled_held, n, __ATOMIC_RELAXED);
}

/*
 * Target cs's INO_LOCKS inode locks. A target's own, never its node's: a target is
 * in one chain, and a change takes the locks of its chain's members in the
 * chain's order, so no two changes can each hold a lock the other waits for.
 * Locks of a node, shared by the chains through it, could: a truncate going from
 * node P to Q in one chain and a write of another inode of the same lock slot
 * going from Q to P in another did, until their forwards timed out (EIO after
 * minutes; test_chain_locks.py).
 */
static struct ino_lock *ino_locks_of(struct storage *s, struct stk_chunk_store *cs)
{
	unsigned i = 0;

	while (i + 1 < s->nstores && s->stores[i] != cs)
		i++;
	return &s->ino_locks[(size_t)i * INO_LOCKS];
}

/* The slot of inode ino (test_forward_on_loop.py computes it too: change both). */
static struct ino_lock *ino_lock(struct storage *s, struct stk_chunk_store *cs, uint64_t ino)
{
	return &ino_locks_of(s, cs)[(ino * 0x9E3779B97F4A7C15ull) >> 56];
}

/* A write's share of l, waiting (on a worker) while a truncate holds it. */
static void ino_share(struct ino_lock *l)
{
	pthread_mutex_lock(&l->m);
	if (l->alone) {
		stk_server_wait_begin(); /* the truncate waits on another node: stand in */
		while (l->alone)
			pthread_cond_wait(&l->cv, &l->m);
		stk_server_wait_end();
	}
	l->shared++;
	pthread_mutex_unlock(&l->m);
}

/* Lets a write's share go: any thread. */
static void ino_unshare(struct ino_lock *l)
{
	pthread_mutex_lock(&l->m);
	if (--l->shared == 0)
		pthread_cond_broadcast(&l->cv);
	pthread_mutex_unlock(&l->m);
}

/*
 * l alone, once no write shares it and no other truncate holds it. A write that
 * shares it may need a worker to finish (its chunk's lock handed to it, a whole
 * chunk to read): while this one waits, the pool stands in for it.
 */
static void ino_lock_alone(struct ino_lock *l)
{
	pthread_mutex_lock(&l->m);
	if (l->alone || l->shared) {
		stk_server_wait_begin();
		while (l->alone || l->shared)
			pthread_cond_wait(&l->cv, &l->m);
		stk_server_wait_end();
	}
	l->alone = 1;
	pthread_mutex_unlock(&l->m);
}

static void ino_unlock_alone(struct ino_lock *l)
{
	pthread_mutex_lock(&l->m);
	l->alone = 0;
	pthread_cond_broadcast(&l->cv);
	pthread_mutex_unlock(&l->m);
}

/*
 * Sends one request to the successor at addr and waits for its reply. A
 * transport failure, or a successor that says our table is stale, answers
 * -ESTALE (the sender refreshes and sends again once the chain is mended) and
 * refreshes our own table; any other status of the successor's is returned as is.
 */
static int forward(struct storage *s, const char *addr, uint16_t op, const void *msg, size_t len,
		   const void *bulk, size_t bulk_len, uint32_t frame_flags)
{
	uint8_t resp[64];
	struct stk_rpc rpc;
	struct stk_conn *c;
	int rc;

	memset(&rpc, 0, sizeof(rpc));
	rpc.opcode = op;
	rpc.req = msg;
	rpc.req_len = len;
	rpc.bulk_out = bulk;
	rpc.bulk_out_len = bulk_len;
	rpc.resp = resp;
	rpc.resp_cap = sizeof(resp);
	rpc.frame_flags = frame_flags;
	stk_server_wait_begin(); /* another thread serves in our place meanwhile */
	stk_callwatch_set_thread(s->watch); /* a new connection's handshake, too */
	rc = stk_pool_get(s->fwd, addr, &c);
	stk_callwatch_set_thread(NULL);
	if (rc == 0) {
		int slot = stk_callwatch_begin(s->watch, c, addr);

		rc = stk_rpc_call(c, &rpc);
		stk_callwatch_end(s->watch, slot);
		stk_pool_put(s->fwd, c);
	}
	stk_server_wait_end();
	if (rc == 0 || rc == -EUCLEAN || (rc < 0 && rpc.status && rc != -ESTALE))
		return rc;
	stk_warn("forwarding %s to %s failed: %s; the chain must change before it goes on",
		 stk_opcode_name(op), addr, strerror(-rc));
	stk_agent_routing_refresh(s->agent);
	return -ESTALE;
}

/* Block checksums of one request or reply: at most a 64 MiB chunk's worth. */
#define STK_MAX_CRCS (STK_MAX_CHUNK_SIZE / STK_CRC_BLOCK)
static __thread uint32_t tls_crcs[STK_MAX_CRCS];

/* A write on its way down: what the chunk store's callback forwards. */
struct fwd_write {
	struct storage *s;
	struct stk_msg_stor_write_req rq;
	const struct hop *h;
	const void *data;
};

/* The bytes a STOR_WRITE's payload takes at most, with ncrcs checksums. */
#define WRITE_MSG_MAX(ncrcs) (128 + 4 * (size_t)(ncrcs))

/* Encodes a STOR_WRITE of m (and its checksums crcs) into b (cap bytes). 0 or -EMSGSIZE. */
static int write_msg_enc(const struct stk_msg_stor_write_req *m, const uint32_t *crcs, uint8_t *b,
			 size_t cap, size_t *len)
{
	struct stk_wbuf w;

	stk_wbuf_init(&w, b, cap);
	stk_msg_stor_write_req_enc(&w, m);
	for (uint32_t i = 0; i < m->ncrcs; i++)
		stk_put_u32(&w, crcs[i]);
	*len = w.len;
	return w.err ? -EMSGSIZE : 0;
}

/* write_msg_enc into a new buffer (the caller frees it), or NULL. */
static uint8_t *write_msg(const struct stk_msg_stor_write_req *m, const uint32_t *crcs, size_t *len)
{
	size_t cap = WRITE_MSG_MAX(m->ncrcs);
	uint8_t *b = malloc(cap);

	if (b && write_msg_enc(m, crcs, b, cap, len)) {
		free(b);
		b = NULL;
	}
	return b;
}

/*
 * Whether a change of a chunk (versions old to now) goes on to our successor:
 * when it changed our copy, or when our copy holds a change our successor has
 * not taken (unsettled: its chunk's lock held).
 */
static int write_goes_on(struct storage *s, const struct hop *h, uint64_t ino, uint32_t idx,
			 uint64_t old, uint64_t now)
{
	return !h->tail && (now != old || unsettled_has(s, h->cs, ino, idx));
}

/*
 * What the change our successor was sent came to (its lock still held): taken
 * (rc 0), our copy and its are alike again; else, ours holds what its may never
 * get, which stays pending until it does (unsettled_note).
 */
static void write_went_on(struct storage *s, const struct hop *h,
			  const struct stk_msg_stor_write_req *rq, int rc)
{
	if (rc == 0)
		unsettled_clear(s, h->cs, rq->ino, rq->chunk_idx, "a later change reached it");
	else
		unsettled_note(s, h->cs, rq->chain_id, rq->ino, rq->chunk_idx, rq->chunk_size, rc);
}

/* forward_write's part: the change to the successor, and the whole chunk if it is behind. */
static int forward_write_to(struct fwd_write *f, const struct stk_chunk_wver *v)
{
	struct stk_msg_stor_write_req m = f->rq;
	uint8_t *msg, *whole = NULL;
	uint32_t *crcs = NULL;
	uint64_t ver;
	uint32_t clen;
	size_t len;
	long n;
	int rc;

	/* a whole chunk replaces any version: the successor takes it as it is */
	m.base_ver = (m.flags & STK_WRITE_FULL) ? UINT64_MAX : v->old;
	m.set_ver = v->now;
	msg = write_msg(&m, tls_crcs, &len);
	if (!msg)
		return -ENOMEM;
	rc = forward(f->s, f->h->next, STK_OP_STOR_WRITE, msg, len, f->data, m.length,
		     STK_FRAME_BULK_SELF);
	free(msg);
	if (rc != -EUCLEAN)
		return rc;
	/* The successor's copy is not the one we changed: it gets ours whole. */
	rc = stk_chunk_version(f->h->cs, m.ino, m.chunk_idx, &ver, &clen);
	if (rc)
		return rc;
	whole = malloc(clen ? clen : 1);
	crcs = malloc(4 * ((size_t)stk_crc_blocks(clen) + 1));
	n = whole && crcs ? stk_chunk_read(f->h->cs, m.ino, m.chunk_idx, 0, whole, clen, crcs)
			  : -ENOMEM;
	if (n >= 0 && (uint32_t)n != clen)
		n = -EIO;
	if (n >= 0) {
		m.offset = 0;
		m.length = clen;
		m.ncrcs = stk_crc_blocks(clen);
		m.flags |= STK_WRITE_FULL;
		m.base_ver = UINT64_MAX;
		m.set_ver = ver;
		msg = write_msg(&m, crcs, &len);
		n = msg ? forward(f->s, f->h->next, STK_OP_STOR_WRITE, msg, len, whole, clen,
				  STK_FRAME_BULK_SELF)
			: -ENOMEM;
		free(msg);
		if (n == -EUCLEAN)
			n = -ESTALE; /* cannot be: a whole chunk applies to any version */
		stk_debug("chunk %llx/%u: copied whole (version %llu) to %s: %s",
			  (unsigned long long)m.ino, m.chunk_idx, (unsigned long long)ver,
			  f->h->next, strerror(n < 0 ? (int)-n : 0));
	}
	free(whole);
	free(crcs);
	return (int)n;
}

/*
 * With the chunk's lock held: sends the change just made to the successor, and
 * when its copy is another version, the whole chunk as it is now here.
 */
static int forward_write(void *ctx, const struct stk_chunk_wver *v)
{
	struct fwd_write *f = ctx;
	int rc;

	if (!write_goes_on(f->s, f->h, f->rq.ino, f->rq.chunk_idx, v->old, v->now))
		return 0; /* nothing to forward, or nothing changed */
	rc = forward_write_to(f, v);
	write_went_on(f->s, f->h, &f->rq, rc);
	return rc;
}

/* ---- writes forwarded from the event loop ---- */

/*
 * A write whose forward waits on the loop (the default; STOKER_LOOP_WRITES=0 turns
 * it off): a worker applies it to our copy with the chunk's lock held, hands the
 * forward to the loop client of the loop that owns the client's connection (net.h,
 * stk_lclient) and is free; the successor's answer, on that loop, releases the
 * chunk's lock, the pending mark and the inode's share, and answers the client.
 * A write that finds the chunk's lock taken waits in its queue (chunk.h) and is
 * handed to a worker when its turn comes. Whatever blocks (the disk, a table
 * refresh after a failed forward, reading the whole chunk for a successor that
 * is behind) runs on a worker (stk_rpc_pending_defer); the loop only sends,
 * matches replies and answers. The replication rules are those of the blocking
 * path above, step for step: route and fence checks before, pending_begin/_end
 * around, the versions the head numbers, the whole chunk on -EUCLEAN, -ESTALE and
 * a refresh when the forward fails.
 */
struct storage_loop;
static struct stk_lclient *loop_client(struct storage_loop *sl);

struct wjob {
	struct storage *s;
	struct stk_rpc_pending *p;
	struct stk_msg_stor_write_req rq;
	struct hop h;
	const void *data; /* the request's bulk: valid until p is answered */
	const char *peer;
	uint64_t req_bytes;
	uint64_t t0;
	struct stk_chunk_wver v;
	uint32_t chunk_len;
	struct stk_chunk_lockwait wait;
	struct stk_lcall call;
	uint8_t *msg; /* the forward's payload: wjob_msgbuf, or malloc'd (msg_owned) */
	int msg_owned;
	void *whole; /* the whole chunk, for a successor that is behind */
	uint32_t *whole_crcs;
	int sent_whole;
	int went_on; /* our copy was applied and sent on: write_went_on when it ends */
	int reserved; /* the slot it holds in the unsettled table (unsettled_reserve) */
	int pooled;  /* from the pool (wjob_get): WJOB_CRCS checksums and a payload fit */
	struct wjob *next_free; /* in the pool */
	uint8_t resp[64];
	/* rq.ncrcs block checksums of data; pooled: WJOB_CRCS, then room for the
	 * forward's payload (wjob_msgbuf) */
	uint32_t crcs[];
};

/*
 * Write state comes from a pool (the design's rule: no allocation per I/O): jobs
 * of a write of at most WJOB_CRCS blocks (1 MiB, the default chunk), with room for
 * their forward's payload, are kept for the next write once done, up to
 * WJOB_POOL_MAX a node; a bigger write's job is allocated and freed. A job is taken
 * on a worker and let go on a loop or a worker: the pool is under a mutex, held
 * for a push or a pop.
 */
#define WJOB_CRCS 256u
#define WJOB_POOL_MAX 512u
#define WJOB_POOLED_SIZE (sizeof(struct wjob) + 4 * (size_t)WJOB_CRCS + WRITE_MSG_MAX(WJOB_CRCS))

/* The payload room of a pooled job: the bytes after its checksums. */
static uint8_t *wjob_msgbuf(struct wjob *j, size_t *cap)
{
	*cap = WRITE_MSG_MAX(WJOB_CRCS);
	return (uint8_t *)&j->crcs[WJOB_CRCS];
}

/* A zeroed job for a write of ncrcs blocks, or NULL. */
static struct wjob *wjob_get(struct storage *s, uint32_t ncrcs)
{
	struct wjob *j = NULL;

	if (ncrcs > WJOB_CRCS)
		return calloc(1, sizeof(*j) + 4 * (size_t)ncrcs);
	pthread_mutex_lock(&s->wjob_lock);
	j = s->wjob_free;
	if (j) {
		s->wjob_free = j->next_free;
		s->wjob_nfree--;
	}
	pthread_mutex_unlock(&s->wjob_lock);
	if (j)
		memset(j, 0, sizeof(*j));
	else
		j = calloc(1, WJOB_POOLED_SIZE);
	if (j)
		j->pooled = 1;
	return j;
}

static void wjob_put(struct storage *s, struct wjob *j)
{
	if (j->pooled) {
		pthread_mutex_lock(&s->wjob_lock);
		if (s->wjob_nfree < WJOB_POOL_MAX) {
			j->next_free = s->wjob_free;
			s->wjob_free = j;
			s->wjob_nfree++;
			j = NULL;
		}
		pthread_mutex_unlock(&s->wjob_lock);
	}
	free(j);
}

/* The write is over (rc): every lock let go, the client answered, job freed. */
static void wjob_finish(struct wjob *j, int rc)
{
	struct storage *s = j->s;
	struct stk_msg_stor_write_resp rp = {.chunk_len = j->chunk_len};
	uint8_t out[16];
	struct stk_wbuf w;

	stk_storage_metrics_end(s->metrics, j->h.cs, STK_TARGET_WRITE, j->t0, rc, j->rq.length);
	if (j->went_on)
		write_went_on(s, &j->h, &j->rq, rc);
	stk_chunk_unlock(j->h.cs, j->rq.ino, j->rq.chunk_idx);
	pending_end(s, j->rq.ino, j->rq.chunk_idx);
	ino_unshare(ino_lock(s, j->h.cs, j->rq.ino));
	unsettled_release(s, (unsigned)j->reserved);
	stk_wbuf_init(&w, out, sizeof(out));
	if (rc == 0)
		rc = stk_msg_stor_write_resp_enc(&w, &rp);
	stk_metrics_ops_client(s->rpc_metrics, j->peer, j->req_bytes,
			       STK_FRAME_HDR_LEN + (rc ? 0 : (uint64_t)w.len));
	stk_rpc_pending_answer(j->p, rc, out, rc ? 0 : w.len);
	if (j->msg_owned)
		free(j->msg);
	free(j->whole);
	free(j->whole_crcs);
	wjob_put(s, j);
}

static void wjob_forwarded(struct stk_lcall *call, int rc);

/* Sends m (its checksums crcs) and len bytes at data to the successor, from the loop. */
static void wjob_send(struct wjob *j, const struct stk_msg_stor_write_req *m, const uint32_t *crcs,
		      const void *data)
{
	struct storage_loop *sl = stk_rpc_pending_loop(j->p);
	size_t len;
	int rc;

	if (j->msg_owned)
		free(j->msg);
	j->msg = NULL;
	j->msg_owned = 0;
	if (j->pooled && m->ncrcs <= WJOB_CRCS) {
		size_t cap;
		uint8_t *b = wjob_msgbuf(j, &cap);

		if (write_msg_enc(m, crcs, b, cap, &len) == 0)
			j->msg = b;
	}
	if (!j->msg) {
		j->msg = write_msg(m, crcs, &len);
		j->msg_owned = 1;
	}
	if (!j->msg) {
		wjob_finish(j, -ENOMEM);
		return;
	}
	memset(&j->call, 0, sizeof(j->call));
	j->call.opcode = STK_OP_STOR_WRITE;
	j->call.frame_flags = STK_FRAME_BULK_SELF;
	j->call.req = j->msg;
	j->call.req_len = len;
	j->call.bulk = data;
	j->call.bulk_len = m->length;
	j->call.resp = j->resp;
	j->call.resp_cap = sizeof(j->resp);
	memcpy(j->call.addr, j->h.next, STK_ADDR_MAX);
	j->call.done = wjob_forwarded;
	j->call.ctx = j;
	rc = stk_lclient_call(loop_client(sl), &j->call);
	if (rc) {
		/* on a worker: the refresh a failed forward asks for may block here */
		stk_warn("forwarding %s to %s failed: %s; the chain must change before it goes on",
			 stk_opcode_name(STK_OP_STOR_WRITE), j->h.next, strerror(-rc));
		stk_agent_routing_refresh(j->s->agent);
		wjob_finish(j, -ESTALE);
	}
}

/* On a worker: the successor's copy is another version; it gets ours whole. */
static void wjob_whole(struct stk_rpc_pending *p, void *arg, int rc)
{
	struct wjob *j = arg;
	struct stk_msg_stor_write_req m = j->rq;
	uint64_t ver;
	uint32_t clen;
	long n;

	if (rc) {
		wjob_finish(j, rc);
		return;
	}
	rc = stk_chunk_version(j->h.cs, m.ino, m.chunk_idx, &ver, &clen);
	if (rc) {
		wjob_finish(j, rc);
		return;
	}
	j->whole = malloc(clen ? clen : 1);
	j->whole_crcs = malloc(4 * ((size_t)stk_crc_blocks(clen) + 1));
	n = j->whole && j->whole_crcs ? stk_chunk_read(j->h.cs, m.ino, m.chunk_idx, 0, j->whole,
						       clen, j->whole_crcs)
				      : -ENOMEM;
	if (n >= 0 && (uint32_t)n != clen)
		n = -EIO;
	if (n < 0) {
		wjob_finish(j, (int)n);
		return;
	}
	m.offset = 0;
	m.length = clen;
	m.ncrcs = stk_crc_blocks(clen);
	m.flags |= STK_WRITE_FULL;
	m.base_ver = UINT64_MAX;
	m.set_ver = ver;
	j->sent_whole = 1;
	stk_debug("chunk %llx/%u: copying whole (version %llu) to %s",
		  (unsigned long long)m.ino, m.chunk_idx, (unsigned long long)ver, j->h.next);
	wjob_send(j, &m, j->whole_crcs, j->whole);
}

/* On a worker: a forward failed; our table is fetched again before the client hears. */
static void wjob_failed(struct stk_rpc_pending *p, void *arg, int rc)
{
	struct wjob *j = arg;

	if (rc == 0)
		stk_agent_routing_refresh(j->s->agent);
	wjob_finish(j, -ESTALE);
}

/* On the loop: the successor answered (rc 0) or the call failed. */
static void wjob_forwarded(struct stk_lcall *call, int rc)
{
	struct wjob *j = call->ctx;

	if (rc == 0)
		rc = stk_status_to_errno(call->status);
	if (rc == -EUCLEAN && !j->sent_whole) {
		stk_rpc_pending_defer(j->p, wjob_whole, j);
		return;
	}
	if (rc == -EUCLEAN) {
		wjob_finish(j, -ESTALE); /* cannot be: a whole chunk applies to any version */
		return;
	}
	if (rc == 0 || (rc < 0 && call->status && rc != -ESTALE)) {
		wjob_finish(j, rc);
		return;
	}
	stk_warn("forwarding %s to %s failed: %s; the chain must change before it goes on",
		 stk_opcode_name(STK_OP_STOR_WRITE), j->h.next, strerror(-rc));
	stk_rpc_pending_defer(j->p, wjob_failed, j);
}

/* With the chunk's lock held, on a worker: our copy first, then the forward. */
static void wjob_apply(struct wjob *j)
{
	struct stk_msg_stor_write_req m = j->rq;
	int rc;

	rc = stk_chunk_write_locked(j->h.cs, m.ino, m.chunk_idx, m.chunk_size, m.offset, j->data,
				    m.length, j->crcs, m.flags & STK_WRITE_SYNC, &j->v,
				    &j->chunk_len);
	if (rc || !write_goes_on(j->s, &j->h, m.ino, m.chunk_idx, j->v.old, j->v.now)) {
		wjob_finish(j, rc); /* failed, or nothing changed: nothing to forward */
		return;
	}
	/* a whole chunk replaces any version: the successor takes it as it is */
	m.base_ver = (m.flags & STK_WRITE_FULL) ? UINT64_MAX : j->v.old;
	m.set_ver = j->v.now;
	j->went_on = 1;
	wjob_send(j, &m, j->crcs, j->data);
}

static void wjob_resume(struct stk_rpc_pending *p, void *arg, int rc)
{
	struct wjob *j = arg;

	if (rc)
		wjob_finish(j, rc); /* the server stops: the lock goes on to the next */
	else
		wjob_apply(j);
}

/* The chunk's lock is ours now (on the thread that let it go): to a worker. */
static void wjob_granted(struct stk_chunk_lockwait *w)
{
	struct wjob *j = (struct wjob *)((char *)w - offsetof(struct wjob, wait));

	stk_rpc_pending_defer(j->p, wjob_resume, j);
}

/*
 * handle_write's way for a write that goes on down the chain, once checked and
 * routed (crcs: its checksums), holding a slot of the unsettled table, which the
 * job takes: STK_RPC_PENDING (answered later), or -ENOMEM or -ESTALE (an unsettled
 * truncate or punch of the inode) before anything was taken, the slot let go.
 */
static int write_on_loop(struct storage *s, struct stk_rpc_req *req, struct stk_rpc_resp *resp,
			 const struct stk_msg_stor_write_req *rq, const struct hop *h,
			 const uint32_t *crcs)
{
	struct wjob *j = wjob_get(s, rq->ncrcs);

	if (!j) {
		unsettled_release(s, 1);
		return -ENOMEM;
	}
	j->s = s;
	j->reserved = 1;
	j->rq = *rq;
	j->h = *h;
	j->data = req->bulk;
	j->peer = req->peer;
	j->req_bytes = STK_FRAME_HDR_LEN + (uint64_t)req->hdr.payload_len + req->bulk_len;
	memcpy(j->crcs, crcs, 4 * (size_t)rq->ncrcs);
	/* The head numbers the change; a replica downstream takes its predecessor's. */
	j->v.base = h->pos == 0 ? STK_CHUNK_VER_ANY : rq->base_ver;
	j->v.set = h->pos == 0 ? 0 : rq->set_ver;
	j->v.floor = (uint64_t)rq->chain_ver << 32;
	j->v.full = (rq->flags & STK_WRITE_FULL) != 0;
	j->wait.granted = wjob_granted;
	ino_share(ino_lock(s, h->cs, rq->ino));
	if (inode_unsettled(s, h->cs, rq->ino)) {
		ino_unshare(ino_lock(s, h->cs, rq->ino));
		wjob_put(s, j);
		unsettled_release(s, 1);
		return -ESTALE; /* an earlier truncate or punch goes first: UNSETTLED_INODE */
	}
	j->p = stk_rpc_pending_take(resp);
	pending_begin(s, rq->ino, rq->chunk_idx);
	j->t0 = stk_storage_metrics_begin(s->metrics, h->cs);
	if (stk_chunk_lock_async(h->cs, rq->ino, rq->chunk_idx, &j->wait) == 0)
		wjob_apply(j);
	return STK_RPC_PENDING;
}

static int handle_write(struct storage *s, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	struct stk_msg_stor_write_req rq;
	struct stk_msg_stor_write_resp rp;
	struct stk_chunk_wver v = {0};
	struct stk_chunk_store *cs;
	struct fwd_write f;
	struct hop h;
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
	if (rq.flags & ~(STK_WRITE_SYNC | STK_WRITE_FULL))
		return -EINVAL;
	bad = stk_crc32c_blocks_check(req->bulk, rq.length, STK_CRC_BLOCK, tls_crcs);
	if (bad >= 0) {
		stk_warn("write from %s: data checksum mismatch (ino 0x%llx chunk %u block %ld): "
			 "refused",
			 req->peer, (unsigned long long)rq.ino, rq.chunk_idx, bad);
		return -EBADMSG;
	}
	if ((rq.flags & STK_WRITE_FULL) && rq.offset)
		return -EINVAL;
	rc = route(s, rq.chain_id, 1, rq.chain_ver, &h);
	if (rc)
		return rc;
	/* a client key writes through the chain's head, as the chain orders it */
	if (req->client && (h.pos != 0 || (rq.flags & STK_WRITE_FULL))) {
		stk_warn("%s: client %s: a replica's write (chain %u): refused", req->peer,
			 req->client->name, rq.chain_id);
		return stk_rpc_client_refused(resp, STK_CLIENT_REFUSED_ADMIN, -EPERM);
	}
	/* a change that goes on holds a slot to be kept pending in, should it not */
	if (!h.tail && (rc = unsettled_reserve(s, 1)))
		return rc;
	if ((rc = tail_enter(s, rq.chain_id, &h)))
		return rc;
	if (s->loop_writes && !h.tail && stk_rpc_resp_loop(resp))
		return write_on_loop(s, req, resp, &rq, &h, tls_crcs);
	cs = h.cs;
	f.s = s;
	f.rq = rq;
	f.h = &h;
	f.data = req->bulk;
	v.then = forward_write;
	v.ctx = &f;
	/* The head numbers the change; a replica downstream takes its predecessor's. */
	v.base = h.pos == 0 ? STK_CHUNK_VER_ANY : rq.base_ver;
	v.set = h.pos == 0 ? 0 : rq.set_ver;
	v.floor = (uint64_t)rq.chain_ver << 32;
	v.full = (rq.flags & STK_WRITE_FULL) != 0;
	ino_share(ino_lock(s, cs, rq.ino));
	if (!h.tail && inode_unsettled(s, cs, rq.ino)) {
		ino_unshare(ino_lock(s, cs, rq.ino));
		unsettled_release(s, 1);
		return -ESTALE; /* an earlier truncate or punch goes first: UNSETTLED_INODE */
	}
	/* tests only: a change admitted at the tail lands late (tail_enter's case) */
	if (h.tail && s->test_tail_delay_ms)
		usleep(s->test_tail_delay_ms * 1000u);
	pending_begin(s, rq.ino, rq.chunk_idx);
	t0 = stk_storage_metrics_begin(s->metrics, cs);
	rc = stk_chunk_write_ver(cs, rq.ino, rq.chunk_idx, rq.chunk_size, rq.offset, req->bulk,
				 rq.length, tls_crcs, rq.flags & STK_WRITE_SYNC, &v, &rp.chunk_len);
	stk_storage_metrics_end(s->metrics, cs, STK_TARGET_WRITE, t0, rc, rq.length);
	pending_end(s, rq.ino, rq.chunk_idx);
	tail_leave(s, &h);
	ino_unshare(ino_lock(s, cs, rq.ino));
	unsettled_release(s, h.tail ? 0 : 1);
	if (rc)
		return rc;
	return stk_msg_stor_write_resp_enc(&resp->payload, &rp);
}

/*
 * Whether our copy may answer a read: our target serves, and no change of the
 * chunk is on its way down from here (a replica that is not the tail then sends
 * the reader to the tail, whose copy is the committed one). 0, -ESTALE or
 * -EINPROGRESS.
 */
static int read_check(struct storage *s, const struct hop *h, uint64_t ino, uint32_t idx)
{
	if (!h->readable)
		return -ESTALE;
	if (!h->read_tail && __atomic_load_n(pending_slot(s, ino, idx), __ATOMIC_RELAXED))
		return -EINPROGRESS;
	if (!h->read_tail && inode_unsettled(s, h->cs, ino))
		return -EINPROGRESS;
	return 0;
}

static int read_error(struct storage *s, struct stk_chunk_store *cs, uint64_t ino, uint32_t idx,
		      int rc); /* repair, below */

static int handle_read(struct storage *s, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	struct stk_msg_stor_read_req rq;
	struct stk_msg_stor_read_resp rp;
	struct stk_chunk_store *cs;
	struct hop h;
	uint64_t t0;
	void *buf;
	long n;
	int rc;

	if (stk_msg_stor_read_req_dec(&req->payload, &rq) || stk_rbuf_finish(&req->payload))
		return -EBADMSG;
	if (rq.length > STK_MAX_CHUNK_SIZE)
		return -EINVAL;
	rc = route(s, rq.chain_id, 1, rq.chain_ver, &h);
	if (rc == 0)
		rc = read_check(s, &h, rq.ino, rq.chunk_idx);
	if (rc)
		return rc;
	cs = h.cs;
	buf = stk_rpc_resp_bulk_buf(resp, rq.length ? rq.length : 1);
	if (!buf)
		return -ENOMEM;
	t0 = stk_storage_metrics_begin(s->metrics, cs);
	n = stk_chunk_read(cs, rq.ino, rq.chunk_idx, rq.offset, buf, rq.length, tls_crcs);
	stk_storage_metrics_end(s->metrics, cs, STK_TARGET_READ, t0, n, n > 0 ? (uint64_t)n : 0);
	if (n < 0)
		return read_error(s, cs, rq.ino, rq.chunk_idx, (int)n);
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
	struct hop h;

	if (stk_msg_stor_prefetch_req_dec(&req->payload, &rq) || stk_rbuf_finish(&req->payload))
		return -EBADMSG;
	if (route(s, rq.chain_id, 1, rq.chain_ver, &h))
		return 0; /* a hint for a chain we do not serve is simply dropped */
	stk_chunk_prefetch(h.cs, rq.ino, rq.chunk_idx);
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

		/* any shard's namespace: each purges the chunks of its own inodes */
		for (uint32_t i = 0; i < ref->rt.nshards; i++)
			if (ref->rt.shards[i].id == 1 || stk_ns_id_eq(&ref->rt.shards[i].ns, &got))
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

/* Sends a change request as it came (its payload, no bulk) to our successor. */
static int forward_same(struct storage *s, const struct hop *h, const struct stk_rpc_req *req)
{
	if (h->tail)
		return 0;
	return forward(s, h->next, req->hdr.opcode, req->payload.p, req->payload.len, NULL, 0, 0);
}

/*
 * A truncate, punch or sync whose forward waits on the loop, as a write's does
 * (write_on_loop; off with STOKER_LOOP_WRITES=0): applied here on its worker, with
 * the inode's lock held alone (every inode's for STOR_TRUNCATES), then sent as it
 * came to our successor by the loop client of the loop that owns the client's
 * connection, and the worker goes on. The successor's answer, on that loop, lets
 * the locks go and answers the client; a failed forward goes back to a worker for
 * the routing refresh (as forward() does) and answers STALE_ROUTING.
 */
enum { OJOB_NO_LOCK, OJOB_INO_LOCK, OJOB_ALL_LOCKS };

struct ojob {
	struct storage *s;
	struct stk_rpc_pending *p;
	int locks;    /* OJOB_*: what ojob_finish lets go */
	uint64_t ino; /* OJOB_INO_LOCK: whose */
	int first; /* STOR_TRUNCATES: the first inode's error here, answered if the forward works */
	const char *peer;
	uint64_t req_bytes;
	struct stk_lcall call;
	uint8_t resp[64];
	struct stk_chunk_store *cs;
	unsigned held; /* slots of the unsettled table it holds (unsettled_reserve) */
	unsigned nnotes;
	struct unsettled notes[]; /* the changes made here, unsettled if the forward fails */
};

/* Changes our copy took and our successor did not (rc): unsettled (inode_unsettled_note). */
static void notes_note(struct storage *s, struct stk_chunk_store *cs, const struct unsettled *u,
		       unsigned n, int rc)
{
	for (unsigned i = 0; i < n; i++)
		inode_unsettled_note(s, cs, &u[i], rc);
}

/* The change is over (rc): its locks let go, the client answered, job freed. */
static void ojob_finish(struct ojob *j, int rc)
{
	struct storage *s = j->s;

	if (rc)
		notes_note(s, j->cs, j->notes, j->nnotes, rc); /* before the locks go */
	unsettled_release(s, j->held);
	if (j->locks == OJOB_INO_LOCK)
		ino_unlock_alone(ino_lock(s, j->cs, j->ino));
	else if (j->locks == OJOB_ALL_LOCKS)
		for (unsigned i = INO_LOCKS; i-- > 0;)
			ino_unlock_alone(&ino_locks_of(s, j->cs)[i]);
	if (rc == 0)
		rc = j->first;
	stk_metrics_ops_client(s->rpc_metrics, j->peer, j->req_bytes, STK_FRAME_HDR_LEN);
	stk_rpc_pending_answer(j->p, rc, NULL, 0);
	free(j);
}

/* On a worker: the forward failed; our table is fetched again before the client hears. */
static void ojob_failed(struct stk_rpc_pending *p, void *arg, int rc)
{
	struct ojob *j = arg;

	if (rc == 0)
		stk_agent_routing_refresh(j->s->agent);
	ojob_finish(j, -ESTALE);
}

/* On the loop: the successor answered (rc 0) or the call failed. */
static void ojob_forwarded(struct stk_lcall *call, int rc)
{
	struct ojob *j = call->ctx;

	if (rc == 0)
		rc = stk_status_to_errno(call->status);
	if (rc == 0 || (rc < 0 && call->status && rc != -ESTALE)) {
		ojob_finish(j, rc);
		return;
	}
	stk_warn("forwarding %s to %s failed: %s; the chain must change before it goes on",
		 stk_opcode_name(call->opcode), call->addr, strerror(-rc));
	stk_rpc_pending_defer(j->p, ojob_failed, j);
}

/*
 * Whether a change applied here on a worker may wait for its successor on the
 * loop: not at the tail, and the request's connection is on a loop with a client.
 */
static int change_on_loop(struct storage *s, const struct hop *h, struct stk_rpc_resp *resp)
{
	return s->loop_writes && !h->tail && stk_rpc_resp_loop(resp);
}

/*
 * Sends req as it came to our successor from the loop, once applied here (first:
 * STOR_TRUNCATES' first error here; notes, nnotes: the changes it made, as
 * unsettled entries), with locks (OJOB_*, of inode ino) and held slots of the
 * unsettled table still held: STK_RPC_PENDING, the request answered later; or,
 * when no job can be made, the forward done here on the worker (locks and slots
 * let go) and its answer.
 */
static int forward_on_loop(struct storage *s, const struct hop *h, struct stk_rpc_req *req,
			   struct stk_rpc_resp *resp, int locks, uint64_t ino, int first,
			   const struct unsettled *notes, unsigned nnotes, unsigned held)
{
	struct ojob *j = calloc(1, sizeof(*j) + nnotes * sizeof(*notes));
	struct storage_loop *sl;
	int rc;

	if (!j) {
		rc = forward_same(s, h, req);
		if (rc)
			notes_note(s, h->cs, notes, nnotes, rc);
		unsettled_release(s, held);
		if (locks == OJOB_INO_LOCK)
			ino_unlock_alone(ino_lock(s, h->cs, ino));
		else if (locks == OJOB_ALL_LOCKS)
			for (unsigned i = INO_LOCKS; i-- > 0;)
				ino_unlock_alone(&ino_locks_of(s, h->cs)[i]);
		return rc ? rc : first;
	}
	j->s = s;
	j->locks = locks;
	j->ino = ino;
	j->first = first;
	j->cs = h->cs;
	j->held = held;
	j->nnotes = nnotes;
	if (nnotes)
		memcpy(j->notes, notes, nnotes * sizeof(*notes));
	j->peer = req->peer;
	j->req_bytes = STK_FRAME_HDR_LEN + (uint64_t)req->hdr.payload_len + req->bulk_len;
	j->call.opcode = req->hdr.opcode;
	/* the payload stays as it is until the request is answered (net.h) */
	j->call.req = req->payload.p;
	j->call.req_len = req->payload.len;
	j->call.resp = j->resp;
	j->call.resp_cap = sizeof(j->resp);
	memcpy(j->call.addr, h->next, STK_ADDR_MAX);
	j->call.done = ojob_forwarded;
	j->call.ctx = j;
	j->p = stk_rpc_pending_take(resp);
	sl = stk_rpc_pending_loop(j->p);
	rc = stk_lclient_call(loop_client(sl), &j->call);
	if (rc) {
		/* on the worker still: the refresh a failed forward asks for may block here */
		stk_warn("forwarding %s to %s failed: %s; the chain must change before it goes on",
			 stk_opcode_name(req->hdr.opcode), h->next, strerror(-rc));
		stk_agent_routing_refresh(s->agent);
		ojob_finish(j, -ESTALE);
	}
	return STK_RPC_PENDING;
}

static int handle_truncate(struct storage *s, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	struct stk_msg_stor_truncate_req rq;
	struct hop h;
	int rc;

	if (stk_msg_stor_truncate_req_dec(&req->payload, &rq) || stk_rbuf_finish(&req->payload))
		return -EBADMSG;
	rc = fence(s, rq.ns_hi, rq.ns_lo, rq.ino, req->peer);
	if (rc)
		return rc;
	rc = route(s, rq.chain_id, 1, rq.chain_ver, &h);
	if (rc == 0 && !h.tail)
		rc = unsettled_reserve(s, 1); /* as a write: see unsettled_reserve */
	if (rc)
		return rc;
	if ((rc = tail_enter(s, rq.chain_id, &h)))
		return rc;
	ino_lock_alone(ino_lock(s, h.cs, rq.ino));
	if (inode_unsettled(s, h.cs, rq.ino)) {
		ino_unlock_alone(ino_lock(s, h.cs, rq.ino));
		unsettled_release(s, h.tail ? 0 : 1);
		tail_leave(s, &h);
		return -ESTALE; /* an earlier change goes first: see UNSETTLED_INODE */
	}
	rc = stk_chunk_truncate(h.cs, rq.ino, rq.size, rq.chunk_size);
	tail_leave(s, &h);
	if (rc == 0 && !h.tail) {
		struct unsettled u = {.chain_id = rq.chain_id,
				      .ino = rq.ino,
				      .chunk_size = rq.chunk_size,
				      .op = STK_OP_STOR_TRUNCATE,
				      .size = rq.size,
				      .ns_hi = rq.ns_hi,
				      .ns_lo = rq.ns_lo};

		if (change_on_loop(s, &h, resp))
			return forward_on_loop(s, &h, req, resp, OJOB_INO_LOCK, rq.ino, 0, &u, 1,
					       1);
		rc = forward_same(s, &h, req);
		if (rc)
			inode_unsettled_note(s, h.cs, &u, rc);
	}
	unsettled_release(s, h.tail ? 0 : 1);
	ino_unlock_alone(ino_lock(s, h.cs, rq.ino));
	return rc;
}

static int handle_truncates(struct storage *s, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	struct stk_msg_stor_truncates_req rq;
	struct stk_msg_trunc_rec *recs = NULL;
	unsigned held = 0;
	struct hop h;
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
		rc = route(s, rq.chain_id, 1, rq.chain_ver, &h);
	if (rc == 0 && !h.tail)
		held = rq.n; /* a slot per inode: see unsettled_reserve */
	if (rc == 0 && held && (rc = unsettled_reserve(s, held)))
		held = 0;
	if (rc == 0)
		rc = tail_enter(s, rq.chain_id, &h);
	if (rc == 0) /* every inode's lock, always in one order */
		for (unsigned i = 0; i < INO_LOCKS; i++)
			ino_lock_alone(&ino_locks_of(s, h.cs)[i]);
	for (uint32_t i = 0; rc == 0 && i < rq.n; i++)
		if (inode_unsettled(s, h.cs, recs[i].ino)) {
			for (unsigned k = INO_LOCKS; k-- > 0;)
				ino_unlock_alone(&ino_locks_of(s, h.cs)[k]);
			unsettled_release(s, held);
			tail_leave(s, &h);
			free(recs);
			return -ESTALE; /* an earlier change goes first: see UNSETTLED_INODE */
		}
	for (uint32_t i = 0; rc == 0 && i < rq.n; i++) {
		int r = stk_chunk_truncate(h.cs, recs[i].ino, recs[i].size, recs[i].chunk_size);

		if (r && !first)
			first = r;
	}
	if (rc == 0)
		tail_leave(s, &h);
	if (rc == 0) {
		struct unsettled *notes = h.tail || !rq.n ? NULL : calloc(rq.n, sizeof(*notes));
		unsigned nnotes = notes ? rq.n : 0;
		int f;

		for (unsigned i = 0; i < nnotes; i++) {
			notes[i].chain_id = rq.chain_id;
			notes[i].ino = recs[i].ino;
			notes[i].chunk_size = recs[i].chunk_size;
			notes[i].op = STK_OP_STOR_TRUNCATE;
			notes[i].size = recs[i].size;
			notes[i].ns_hi = rq.ns_hi;
			notes[i].ns_lo = rq.ns_lo;
		}
		free(recs);
		if (!h.tail && change_on_loop(s, &h, resp)) {
			f = forward_on_loop(s, &h, req, resp, OJOB_ALL_LOCKS, 0, first, notes,
					    nnotes, held);
			free(notes);
			return f;
		}
		f = forward_same(s, &h, req);
		if (f) {
			first = f;
			notes_note(s, h.cs, notes, nnotes, f);
		}
		unsettled_release(s, held);
		free(notes);
		for (unsigned i = INO_LOCKS; i-- > 0;)
			ino_unlock_alone(&ino_locks_of(s, h.cs)[i]);
		return first;
	}
	free(recs);
	return rc;
}

static int handle_punch(struct storage *s, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	struct stk_msg_stor_punch_req rq;
	struct hop h;
	int rc;

	if (stk_msg_stor_punch_req_dec(&req->payload, &rq) || stk_rbuf_finish(&req->payload))
		return -EBADMSG;
	rc = route(s, rq.chain_id, 1, rq.chain_ver, &h);
	if (rc == 0 && !h.tail)
		rc = unsettled_reserve(s, 1); /* as a write: see unsettled_reserve */
	if (rc)
		return rc;
	if ((rc = tail_enter(s, rq.chain_id, &h)))
		return rc;
	ino_lock_alone(ino_lock(s, h.cs, rq.ino));
	if (inode_unsettled(s, h.cs, rq.ino)) {
		ino_unlock_alone(ino_lock(s, h.cs, rq.ino));
		unsettled_release(s, h.tail ? 0 : 1);
		tail_leave(s, &h);
		return -ESTALE; /* an earlier change goes first: see UNSETTLED_INODE */
	}
	rc = stk_chunk_punch(h.cs, rq.ino, rq.first, rq.end);
	tail_leave(s, &h);
	if (rc == 0 && !h.tail) {
		struct unsettled u = {.chain_id = rq.chain_id,
				      .ino = rq.ino,
				      .op = STK_OP_STOR_PUNCH,
				      .first = rq.first,
				      .end = rq.end};

		if (change_on_loop(s, &h, resp))
			return forward_on_loop(s, &h, req, resp, OJOB_INO_LOCK, rq.ino, 0, &u, 1,
					       1);
		rc = forward_same(s, &h, req);
		if (rc)
			inode_unsettled_note(s, h.cs, &u, rc);
	}
	unsettled_release(s, h.tail ? 0 : 1);
	ino_unlock_alone(ino_lock(s, h.cs, rq.ino));
	return rc;
}

static int handle_sync(struct storage *s, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	struct stk_msg_stor_sync_req rq;
	struct hop h;
	int rc;

	if (stk_msg_stor_sync_req_dec(&req->payload, &rq) || stk_rbuf_finish(&req->payload))
		return -EBADMSG;
	rc = route(s, rq.chain_id, 0, 0, &h);
	if (rc)
		return rc;
	rc = stk_chunk_store_sync(h.cs);
	if (rc == 0 && change_on_loop(s, &h, resp))
		return forward_on_loop(s, &h, req, resp, OJOB_NO_LOCK, 0, 0, NULL, 0, 0);
	return rc ? rc : forward_same(s, &h, req);
}

/* ---- resync: a source's side ---- */

/* (ino, idx) after (ino2, idx2) */
static int ent_after(uint64_t ino, uint32_t idx, uint64_t ino2, uint32_t idx2)
{
	return ino > ino2 || (ino == ino2 && idx > idx2);
}

/*
 * STOR_SYNC_LIST, asked of a readable member by the syncing one after it: a page
 * of the chunks our target of the chain holds, bucket by bucket, with versions.
 * Takes no lock: a chunk that changes after it was listed reaches the syncing
 * member as a forwarded change anyway.
 */
static int handle_sync_list(struct storage *s, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	struct stk_msg_stor_sync_list_req rq;
	struct stk_msg_stor_sync_list_resp rp;
	struct stk_msg_sync_rec *recs;
	struct hop h;
	uint32_t max;
	int rc;

	if (stk_msg_stor_sync_list_req_dec(&req->payload, &rq) || stk_rbuf_finish(&req->payload))
		return -EBADMSG;
	if (rq.bucket > 255 || rq.max == 0)
		return -EINVAL;
	rc = route(s, rq.chain_id, 1, rq.chain_ver, &h);
	if (rc)
		return rc;
	if (!h.readable)
		return -ESTALE;
	rc = tail_drain(s, h.cs); /* what we admitted as the tail lands first */
	if (rc)
		return rc;
	max = STK_MIN(rq.max, STK_SYNC_LIST_MAX);
	recs = malloc(max * sizeof(*recs));
	if (!recs)
		return -ENOMEM;
	memset(&rp, 0, sizeof(rp));
	rp.bucket = rq.bucket;
	rp.ino = rq.ino;
	rp.idx = rq.idx;
	rp.from_start = rq.from_start;
	while (rp.n < max && !rp.done) {
		struct stk_chunk_ent *e;
		size_t n, i;

		rc = stk_chunk_list_bucket(h.cs, rp.bucket, &e, &n);
		if (rc)
			break;
		for (i = 0; i < n && rp.n < max; i++) {
			uint32_t len;

			if (!rp.from_start && !ent_after(e[i].ino, e[i].idx, rp.ino, rp.idx))
				continue;
			recs[rp.n].ino = e[i].ino;
			recs[rp.n].idx = e[i].idx;
			if (stk_chunk_version(h.cs, e[i].ino, e[i].idx, &recs[rp.n].version, &len))
				recs[rp.n].version = 1; /* unreadable header: it gets copied over */
			rp.ino = e[i].ino;
			rp.idx = e[i].idx;
			rp.from_start = 0;
			rp.n++;
		}
		/* a page that ended inside the bucket goes on from its last chunk */
		if (rp.n == max && i < n) {
			free(e);
			break;
		}
		free(e);
		if (rp.bucket == 255) {
			rp.done = 1;
		} else {
			rp.bucket++;
			rp.from_start = 1;
		}
	}
	if (rc == 0) {
		stk_msg_stor_sync_list_resp_enc(&resp->payload, &rp);
		for (uint32_t i = 0; i < rp.n; i++)
			stk_msg_sync_rec_enc(&resp->payload, &recs[i]);
		rc = resp->payload.err;
	}
	free(recs);
	return rc;
}

/*
 * STOR_FSCK_LIST (stoker fsck): a page of the chunks one of our targets holds,
 * whatever its chains or state, with what fsck compares between copies. Like
 * STOR_SYNC_LIST it takes no lock: fsck looks twice before it reports anything.
 */
static int handle_fsck_list(struct storage *s, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	struct stk_msg_stor_fsck_list_req rq;
	struct stk_msg_stor_fsck_list_resp rp;
	struct stk_msg_fsck_chunk *recs;
	struct stk_chunk_store *cs;
	struct timespec now;
	uint32_t max;
	int rc = 0;

	if (stk_msg_stor_fsck_list_req_dec(&req->payload, &rq) || stk_rbuf_finish(&req->payload))
		return -EBADMSG;
	if (rq.bucket > 255 || rq.max == 0)
		return -EINVAL;
	cs = local_target(s, rq.target_id);
	if (!cs)
		return -ENOENT;
	max = STK_MIN(rq.max, STK_SYNC_LIST_MAX);
	recs = malloc(max * sizeof(*recs));
	if (!recs)
		return -ENOMEM;
	memset(&rp, 0, sizeof(rp));
	rp.bucket = rq.bucket;
	rp.ino = rq.ino;
	rp.idx = rq.idx;
	rp.from_start = rq.from_start;
	clock_gettime(CLOCK_REALTIME, &now);
	rp.now_sec = (int64_t)now.tv_sec;
	while (rp.n < max && !rp.done) {
		struct stk_chunk_ent *e;
		size_t n, i;

		rc = stk_chunk_list_bucket(cs, rp.bucket, &e, &n);
		if (rc)
			break;
		for (i = 0; i < n && rp.n < max; i++) {
			struct stk_chunk_info ci;

			if (!rp.from_start && !ent_after(e[i].ino, e[i].idx, rp.ino, rp.idx))
				continue;
			rp.ino = e[i].ino;
			rp.idx = e[i].idx;
			rp.from_start = 0;
			/* Gone since the listing (a removal in between): not there to report. */
			if (stk_chunk_stat(cs, e[i].ino, e[i].idx, &ci) == 0 && ci.version == 0)
				continue;
			recs[rp.n] = (struct stk_msg_fsck_chunk){.ino = e[i].ino, .idx = e[i].idx,
								 .version = ci.version,
								 .len = ci.len, .digest = ci.digest,
								 .mtime_sec = ci.mtime_sec};
			rp.n++;
		}
		if (rp.n == max && i < n) {
			free(e);
			break;
		}
		free(e);
		if (rp.bucket == 255) {
			rp.done = 1;
		} else {
			rp.bucket++;
			rp.from_start = 1;
		}
	}
	if (rc == 0) {
		stk_msg_stor_fsck_list_resp_enc(&resp->payload, &rp);
		for (uint32_t i = 0; i < rp.n; i++)
			stk_msg_fsck_chunk_enc(&resp->payload, &recs[i]);
		rc = resp->payload.err;
	}
	free(recs);
	return rc;
}

/* STOR_SYNC_READ: a whole chunk, with its version, for the syncing member. */
static int handle_sync_read(struct storage *s, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	struct stk_msg_stor_sync_read_req rq;
	struct stk_msg_stor_sync_read_resp rp;
	struct hop h;
	uint32_t len;
	void *buf;
	int rc;

	if (stk_msg_stor_sync_read_req_dec(&req->payload, &rq) || stk_rbuf_finish(&req->payload))
		return -EBADMSG;
	rc = route(s, rq.chain_id, 1, rq.chain_ver, &h);
	if (rc)
		return rc;
	if (!h.readable)
		return -ESTALE;
	buf = stk_rpc_resp_bulk_buf(resp, STK_MAX_CHUNK_SIZE);
	if (!buf)
		return -ENOMEM;
	rc = stk_chunk_read_whole(h.cs, rq.ino, rq.idx, buf, STK_MAX_CHUNK_SIZE, &len, &rp.version,
				  tls_crcs);
	if (rc)
		return rc;
	rp.ncrcs = stk_crc_blocks(len);
	stk_msg_stor_sync_read_resp_enc(&resp->payload, &rp);
	for (uint32_t i = 0; i < rp.ncrcs; i++)
		stk_put_u32(&resp->payload, tls_crcs[i]);
	resp->bulk = buf;
	resp->bulk_len = len;
	resp->frame_flags = STK_FRAME_BULK_SELF;
	return resp->payload.err;
}

/* ---- resync: the syncing member's side ---- */

/*
 * A target of ours that came back to a chain that went on without it is SYNCING,
 * last in the chain: every change reaches it from its predecessor (the chain's
 * last readable member), which is also where it copies from. The copy walks the
 * predecessor's chunk list (STOR_SYNC_LIST) and fetches each chunk whose version
 * differs (STOR_SYNC_READ), writing it only if ours is older (newer_only: a change
 * forwarded meanwhile may have brought a newer one). Chunks we hold that the
 * predecessor does not are removed once it confirms, under the inode's lock, that
 * it still has none. Every change the predecessor applied after it learned the
 * chain's version came to us as a change; everything before, the list holds. Then
 * mgmtd makes the target SERVING (MGMT_TARGET_SYNCED), unless the chain changed
 * meanwhile, in which case the next round starts over.
 */
struct sync_job {
	uint32_t chain_id, chain_ver, target_id;
	struct stk_chunk_store *cs;
	char src[STK_ADDR_MAX];
	void *buf; /* a whole chunk */
	uint32_t *crcs;
	uint64_t copied, bytes, removed, listed;
	uint64_t src_chunks; /* the source's chunk count when the copy began (its last report) */
	/* what sync_note last passed on to the metrics */
	uint64_t noted_listed, noted_copied, noted_bytes;
	/* the throttle (sync_throttle): tokens in bytes, may go below 0; refilled at last_ns */
	double tokens;
	uint64_t last_ns;
};

/*
 * Publishes the copy's progress for heartbeats and metrics; `bucket`: the first
 * bucket not yet done (256: all). The estimate is the share of the source's chunks
 * listed so far (its count from its last report; a chain that takes writes
 * meanwhile may list more, so it stops at 99.9% until the copy is done), or the
 * share of buckets done when the source reported no chunks.
 */
static void sync_note(struct storage *s, struct sync_job *j, unsigned bucket, int done)
{
	uint32_t pm;

	if (done)
		pm = 1000;
	else if (j->src_chunks)
		pm = (uint32_t)STK_MIN(j->listed * 1000 / j->src_chunks, 999u);
	else
		pm = (uint32_t)STK_MIN(bucket * 1000u / 256u, 999u);
	pthread_mutex_lock(&s->prog_lock);
	s->prog.target_id = j->target_id;
	s->prog.chain_id = j->chain_id;
	s->prog.permille = pm;
	s->prog.checked = j->listed;
	s->prog.copied = j->copied;
	s->prog.bytes = j->bytes;
	pthread_mutex_unlock(&s->prog_lock);
	stk_storage_metrics_resync(s->metrics, j->cs, j->listed - j->noted_listed,
				   j->copied - j->noted_copied, j->bytes - j->noted_bytes,
				   pm / 1000.0);
	j->noted_listed = j->listed;
	j->noted_copied = j->copied;
	j->noted_bytes = j->bytes;
}

/* No copy runs any more (done, failed or stopped): heartbeats report none. */
static void sync_note_idle(struct storage *s, struct sync_job *j)
{
	pthread_mutex_lock(&s->prog_lock);
	memset(&s->prog, 0, sizeof(s->prog));
	pthread_mutex_unlock(&s->prog_lock);
	stk_storage_metrics_resync(s->metrics, j->cs, 0, 0, 0, 0);
}

/*
 * The throttle (--resync-rate): a token bucket of s->resync_rate bytes a second
 * that holds at most a tenth of a second's worth, so that an idle moment is not
 * spent later as a burst. Each fetch is paid for after it arrived (a chunk's size
 * is known only then): the bucket may go below zero, and the thread sleeps until
 * it is back at zero. It runs on the resync thread with no lock held, so sleeping
 * holds up nothing but the copy. -ECANCELED when the node stops meanwhile.
 */
static int sync_throttle(struct storage *s, struct sync_job *j, uint64_t bytes)
{
	double rate = (double)s->resync_rate;
	uint64_t now;

	if (!s->resync_rate)
		return 0;
	now = stk_now_ns();
	if (!j->last_ns)
		j->last_ns = now;
	j->tokens = STK_MIN(j->tokens + (double)(now - j->last_ns) * rate / 1e9, rate / 10);
	j->last_ns = now;
	j->tokens -= (double)bytes;
	if (j->tokens >= 0)
		return 0;
	for (uint64_t end = now + (uint64_t)(-j->tokens / rate * 1e9); now < end;
	     now = stk_now_ns()) {
		if (__atomic_load_n(&s->sync_stop, __ATOMIC_RELAXED))
			return -ECANCELED;
		usleep((useconds_t)STK_MIN((end - now) / 1000 + 1, 50000u));
	}
	return 0;
}

/* The first chain where a target of ours is SYNCING behind a readable member. */
static int sync_find(struct storage *s, struct sync_job *j)
{
	struct stk_routing_ref *ref = stk_agent_routing_get(s->agent);
	int found = 0;

	for (uint32_t i = 0; i < ref->rt.nchains && !found; i++) {
		const struct stk_rt_chain *c = &ref->rt.chains[i];
		const struct stk_rt_target *prev = NULL;

		for (unsigned k = 0; k < c->ntargets && !found; k++) {
			const struct stk_rt_target *t = stk_routing_target(&ref->rt, c->targets[k]);
			const struct stk_rt_node *n;

			if (!t)
				continue;
			if (t->state == STK_TARGET_SYNCING && prev && local_target(s, t->id) &&
			    (n = stk_routing_node(&ref->rt, prev->node_id))) {
				j->chain_id = c->id;
				j->chain_ver = c->version;
				j->target_id = t->id;
				j->cs = local_target(s, t->id);
				j->src_chunks = prev->chunks;
				memcpy(j->src, n->addr, STK_ADDR_MAX);
				found = 1;
			}
			if (t->state == STK_TARGET_SERVING || t->state == STK_TARGET_FULL)
				prev = t;
		}
	}
	stk_agent_routing_put(s->agent, ref);
	return found;
}

/* One request of the encoded message in w (opcode op) to the source, its reply in resp. */
static int sync_call(struct storage *s, struct sync_job *j, struct stk_rpc *rpc, uint16_t op,
		     const struct stk_wbuf *w, void *resp, size_t cap)
{
	struct stk_conn *c;
	int rc, slot;

	rpc->opcode = op;
	rpc->req = w->p;
	rpc->req_len = w->len;
	rpc->resp = resp;
	rpc->resp_cap = cap;
	stk_callwatch_set_thread(s->watch);
	rc = stk_pool_get(s->fwd, j->src, &c);
	stk_callwatch_set_thread(NULL);
	if (rc)
		return rc;
	slot = stk_callwatch_begin(s->watch, c, j->src);
	rc = stk_rpc_call(c, rpc);
	stk_callwatch_end(s->watch, slot);
	stk_pool_put(s->fwd, c);
	return rc;
}

/*
 * Fetches the source's copy of chunk ino/idx into j->buf (*len bytes, their CRCs
 * checked, in j->crcs) and its version (0: the source has none).
 */
static int sync_fetch(struct storage *s, struct sync_job *j, uint64_t ino, uint32_t idx,
		      uint64_t *version, uint32_t *len)
{
	struct stk_msg_stor_sync_read_req rq = {
		.chain_id = j->chain_id, .chain_ver = j->chain_ver, .ino = ino, .idx = idx};
	struct stk_msg_stor_sync_read_resp rp;
	uint8_t msg[64], resp[STK_MAX_PAYLOAD / 8];
	struct stk_rpc rpc;
	struct stk_wbuf w;
	struct stk_rbuf r;
	int rc;

	stk_wbuf_init(&w, msg, sizeof(msg));
	stk_msg_stor_sync_read_req_enc(&w, &rq);
	memset(&rpc, 0, sizeof(rpc));
	rpc.bulk_in = j->buf;
	rpc.bulk_in_cap = STK_MAX_CHUNK_SIZE;
	rpc.frame_flags = STK_FRAME_BULK_SELF;
	rc = sync_call(s, j, &rpc, STK_OP_STOR_SYNC_READ, &w, resp, sizeof(resp));
	if (rc)
		return rc;
	stk_rbuf_init(&r, resp, rpc.resp_len);
	if (stk_msg_stor_sync_read_resp_dec(&r, &rp) || rp.ncrcs != stk_crc_blocks(rpc.bulk_in_len))
		return -EBADMSG;
	for (uint32_t i = 0; i < rp.ncrcs; i++)
		j->crcs[i] = stk_get_u32(&r);
	if (stk_rbuf_finish(&r) ||
	    stk_crc32c_blocks_check(j->buf, rpc.bulk_in_len, STK_CRC_BLOCK, j->crcs) >= 0)
		return -EBADMSG;
	*version = rp.version;
	*len = (uint32_t)rpc.bulk_in_len;
	return 0;
}

/* Copies chunk ino/idx from the source; with `gone`, removes ours if it has none. */
static int sync_chunk(struct storage *s, struct sync_job *j, uint64_t ino, uint32_t idx, int gone)
{
	struct stk_chunk_wver v = {0};
	uint64_t version;
	uint32_t len, got = 0;
	int rc;

	/* a removal holds the inode against changes until it is done; a copy, as a write */
	if (gone)
		ino_lock_alone(ino_lock(s, j->cs, ino));
	else
		ino_share(ino_lock(s, j->cs, ino));
	rc = sync_fetch(s, j, ino, idx, &version, &got);
	if (rc)
		goto out;
	if (version == 0) {
		rc = gone ? stk_chunk_punch(j->cs, ino, idx, idx + 1) : 0;
		j->removed += gone && rc == 0;
		goto out;
	}
	v.base = STK_CHUNK_VER_ANY;
	v.set = version;
	v.full = 1;
	v.newer_only = 1;
	rc = stk_chunk_write_ver(j->cs, ino, idx, STK_MAX_CHUNK_SIZE, 0, j->buf, got, j->crcs, 0,
				 &v, &len);
	if (rc == 0 && v.now != v.old) {
		j->copied++;
		j->bytes += got;
	}
out:
	if (gone)
		ino_unlock_alone(ino_lock(s, j->cs, ino));
	else
		ino_unshare(ino_lock(s, j->cs, ino));
	/* paid for with the inode's lock released: writers of the inode never wait on it */
	if (got) {
		int trc = sync_throttle(s, j, got);

		rc = rc ? rc : trc;
	}
	return rc;
}

/* Our chunks of bucket b that the source's list (src, n) does not hold: removed. */
static int sync_bucket_done(struct storage *s, struct sync_job *j, unsigned b,
			    const struct stk_chunk_ent *src, size_t n)
{
	struct stk_chunk_ent *mine;
	size_t m, k = 0;
	int rc = stk_chunk_list_bucket(j->cs, b, &mine, &m);

	for (size_t i = 0; i < m && rc == 0; i++) {
		while (k < n && ent_after(mine[i].ino, mine[i].idx, src[k].ino, src[k].idx))
			k++;
		if (k < n && src[k].ino == mine[i].ino && src[k].idx == mine[i].idx)
			continue;
		rc = sync_chunk(s, j, mine[i].ino, mine[i].idx, 1);
	}
	free(mine);
	return rc;
}

static int sync_target(struct storage *s, struct sync_job *j)
{
	struct stk_msg_stor_sync_list_req rq;
	struct stk_msg_stor_sync_list_resp rp;
	struct stk_chunk_ent *seen = NULL; /* the source's chunks of bucket `cur` */
	size_t nseen = 0, capseen = 0;
	uint8_t msg[128], *resp = malloc(STK_MAX_PAYLOAD);
	unsigned cur = 0;
	int rc = -ENOMEM;

	j->buf = malloc(STK_MAX_CHUNK_SIZE);
	j->crcs = malloc((STK_MAX_CHUNK_SIZE / STK_CRC_BLOCK + 1) * sizeof(uint32_t));
	if (!resp || !j->buf || !j->crcs)
		goto out;
	memset(&rq, 0, sizeof(rq));
	rq.chain_id = j->chain_id;
	rq.chain_ver = j->chain_ver;
	rq.from_start = 1;
	rq.max = 1024;
	sync_note(s, j, 0, 0);
	for (;;) {
		struct stk_rpc rpc;
		struct stk_wbuf w;
		struct stk_rbuf r;

		rc = -ECANCELED;
		if (__atomic_load_n(&s->sync_stop, __ATOMIC_RELAXED))
			goto out;
		stk_wbuf_init(&w, msg, sizeof(msg));
		stk_msg_stor_sync_list_req_enc(&w, &rq);
		memset(&rpc, 0, sizeof(rpc));
		rc = sync_call(s, j, &rpc, STK_OP_STOR_SYNC_LIST, &w, resp, STK_MAX_PAYLOAD);
		if (rc == 0)
			rc = sync_throttle(s, j, rpc.resp_len);
		if (rc)
			goto out;
		stk_rbuf_init(&r, resp, rpc.resp_len);
		rc = -EBADMSG;
		if (stk_msg_stor_sync_list_resp_dec(&r, &rp) || rp.n > rq.max || rp.bucket > 255)
			goto out;
		for (uint32_t i = 0; i < rp.n; i++) {
			struct stk_msg_sync_rec e;
			uint64_t mine;
			uint32_t len;

			rc = -EBADMSG;
			if (stk_msg_sync_rec_dec(&r, &e) || (e.ino & 0xff) < cur)
				goto out;
			while ((e.ino & 0xff) > cur) { /* the source is past bucket cur */
				rc = sync_bucket_done(s, j, cur++, seen, nseen);
				nseen = 0;
				if (rc)
					goto out;
			}
			if (nseen == capseen) {
				struct stk_chunk_ent *ns;

				capseen = capseen ? 2 * capseen : 1024;
				ns = realloc(seen, capseen * sizeof(*seen));
				rc = -ENOMEM;
				if (!ns)
					goto out;
				seen = ns;
			}
			seen[nseen].ino = e.ino;
			seen[nseen].idx = e.idx;
			nseen++;
			j->listed++;
			rc = stk_chunk_version(j->cs, e.ino, e.idx, &mine, &len);
			if (rc || mine != e.version)
				rc = sync_chunk(s, j, e.ino, e.idx, 0);
			if (rc)
				goto out;
			sync_note(s, j, cur, 0);
		}
		rc = -EBADMSG;
		if (stk_rbuf_finish(&r))
			goto out;
		while (cur < (rp.done ? 256u : rp.bucket)) {
			rc = sync_bucket_done(s, j, cur++, seen, nseen);
			nseen = 0;
			if (rc)
				goto out;
		}
		sync_note(s, j, cur, 0);
		if (rp.done)
			break;
		rq.bucket = rp.bucket;
		rq.ino = rp.ino;
		rq.idx = rp.idx;
		rq.from_start = rp.from_start;
	}
	rc = 0;
out:
	free(seen);
	free(resp);
	free(j->buf);
	free(j->crcs);
	j->buf = NULL;
	j->crcs = NULL;
	return rc;
}

/*
 * A background copier (resync, repair, scrub) runs at nice 10: where CPU is short,
 * the training reads and writes the node serves meanwhile get about ten times its
 * share, and it still gets a tenth, so it never stops. Its bytes are throttled
 * apart (--resync-rate, --scrub-rate). Linux applies a thread's nice to it alone.
 */
static void background_priority(const char *what)
{
	if (setpriority(PRIO_PROCESS, (id_t)gettid(), 10))
		stk_debug("%s thread keeps its priority: %s", what, strerror(errno));
}

/* ---- stale chunks: a target that left its chain ---- */

/*
 * mgmtd makes a target that leaves a chain WIPING (mgmtd/state.h): the chunks it
 * holds are old copies no chain keeps up to date, and must never reach a chain it
 * joins later. The resync thread, when it has nothing to copy, removes them one
 * by one, each under its inode's lock like a resync's removal, and tells mgmtd
 * (MGMT_TARGET_WIPED) once a pass over every bucket finds none left; only then may
 * the target join a chain. Nothing routes a request to a target in no chain, so a
 * second pass finds only what a change already under way when the chain dropped
 * it wrote meanwhile. Unlinking costs no bandwidth: no throttle, but one target
 * at a time and a stop checked between buckets.
 */

/* A target of ours that the table has WIPING and in no chain, or 0. */
static uint32_t wipe_find(struct storage *s)
{
	struct stk_routing_ref *ref = stk_agent_routing_get(s->agent);
	uint32_t found = 0;

	for (uint32_t i = 0; i < ref->rt.ntargets && !found; i++) {
		const struct stk_rt_target *t = &ref->rt.targets[i];
		int chained = 0;

		if (t->state != STK_TARGET_WIPING || !local_target(s, t->id))
			continue;
		for (uint32_t c = 0; c < ref->rt.nchains && !chained; c++)
			for (unsigned k = 0; k < ref->rt.chains[c].ntargets; k++)
				chained |= ref->rt.chains[c].targets[k] == t->id;
		if (!chained)
			found = t->id;
	}
	stk_agent_routing_put(s->agent, ref);
	return found;
}

/* One pass over cs: removes every chunk, counting them. 0, -ECANCELED or -errno. */
static int wipe_pass(struct storage *s, struct stk_chunk_store *cs, uint64_t *chunks,
		     uint64_t *bytes)
{
	int rc = 0;

	for (unsigned b = 0; b < 256 && rc == 0; b++) {
		struct stk_chunk_ent *e;
		size_t n;

		if (__atomic_load_n(&s->sync_stop, __ATOMIC_RELAXED))
			return -ECANCELED;
		rc = stk_chunk_list_bucket(cs, b, &e, &n);
		for (size_t i = 0; i < n && rc == 0; i++) {
			uint64_t version;
			uint32_t len = 0;

			ino_lock_alone(ino_lock(s, cs, e[i].ino));
			if (stk_chunk_version(cs, e[i].ino, e[i].idx, &version, &len))
				len = 0;
			rc = stk_chunk_punch(cs, e[i].ino, e[i].idx, e[i].idx + 1);
			ino_unlock_alone(ino_lock(s, cs, e[i].ino));
			*chunks += rc == 0;
			*bytes += rc == 0 ? len : 0;
		}
		free(e);
	}
	return rc;
}

/* Wipes target tid and tells mgmtd, logging what went. 0 or -errno. */
static int wipe_target(struct storage *s, uint32_t tid)
{
	struct stk_chunk_store *cs = local_target(s, tid);
	uint64_t chunks = 0, bytes = 0, cap, used, left = 1;
	char b[32];
	int rc = 0;

	for (int pass = 0; pass < 4 && rc == 0 && left; pass++) {
		uint64_t before = chunks;

		rc = wipe_pass(s, cs, &chunks, &bytes);
		if (rc == 0 && stk_chunk_store_stat(cs, &cap, &used, &left))
			left = 1;
		if (rc == 0 && left && chunks == before)
			rc = -EBUSY; /* chunks it cannot list: left for an operator */
	}
	if (rc == 0 && left)
		rc = -EAGAIN;
	if (rc == 0)
		rc = stk_agent_target_wiped(s->agent, tid, chunks, bytes);
	if (rc == 0)
		stk_info("target %u left its chain: %llu stale chunks removed (%s); free", tid,
			 (unsigned long long)chunks, stk_format_size(bytes, b, sizeof(b)));
	else if (rc != -ECANCELED)
		stk_warn("target %u left its chain: removing its stale chunks failed after %llu: "
			 "%s; trying again",
			 tid, (unsigned long long)chunks, strerror(-rc));
	return rc;
}

static void *sync_main(void *arg)
{
	struct storage *s = arg;
	unsigned wait_ms = 500;

	background_priority("resync");

	while (!__atomic_load_n(&s->sync_stop, __ATOMIC_RELAXED)) {
		struct sync_job j;
		uint64_t t0;
		int rc;

		for (unsigned t = 0; t < wait_ms && !__atomic_load_n(&s->sync_stop, __ATOMIC_RELAXED);
		     t += 50)
			usleep(50 * 1000);
		wait_ms = 500;
		memset(&j, 0, sizeof(j));
		if (!sync_find(s, &j)) {
			uint32_t tid = wipe_find(s);

			if (tid && wipe_target(s, tid))
				wait_ms = 5000; /* not every half second in the log */
			continue;
		}
		{
			char rb[32];

			if (s->resync_rate)
				stk_format_size(s->resync_rate, rb, sizeof(rb));
			stk_info("target %u: catching up with chain %u (version %u) from %s, "
				 "%s%s%s",
				 j.target_id, j.chain_id, j.chain_ver, j.src,
				 s->resync_rate ? "at most " : "with no rate limit",
				 s->resync_rate ? rb : "", s->resync_rate ? "/s" : "");
		}
		t0 = stk_now_ns();
		rc = sync_target(s, &j);
		if (rc == 0) {
			sync_note(s, &j, 256, 1);
			rc = stk_agent_target_synced(s->agent, j.target_id, j.chain_id, j.chain_ver);
		}
		sync_note_idle(s, &j);
		if (rc == 0) {
			char b[32];

			stk_info("target %u caught up with chain %u in %.1f s: %llu chunks listed, "
				 "%llu copied (%s), %llu removed; SERVING",
				 j.target_id, j.chain_id, (double)(stk_now_ns() - t0) / 1e9,
				 (unsigned long long)j.listed, (unsigned long long)j.copied,
				 stk_format_size(j.bytes, b, sizeof(b)), (unsigned long long)j.removed);
		} else if (rc != -ECANCELED) {
			stk_warn("target %u: catching up with chain %u from %s failed: %s; trying "
				 "again",
				 j.target_id, j.chain_id, j.src, strerror(-rc));
			stk_agent_routing_refresh(s->agent);
			wait_ms = 2000;
		}
	}
	return NULL;
}

/* ---- repair: a damaged copy rewritten from a good replica ---- */

/*
 * A read that finds our copy of a chunk damaged (a block or the header fails its
 * checksum, or the disk answers EIO) answers CHUNK_DAMAGED where another member of
 * the chain serves reads, so that the client reads that one instead and never
 * sees the error; the chunk is queued here (repair_note). The scrubber queues
 * what it finds the same way: it reads every chunk of every target, block CRCs
 * checked, at --scrub-rate bytes a second, a pass every --scrub-interval seconds.
 *
 * The repair thread copies the chunk from another serving member, the nearest one
 * downstream if there is one, with the inode's lock held exclusively: no change
 * of the inode passes this node meanwhile, so a downstream member holds exactly
 * the version we hold, committed. The copy is written only if its version is ours
 * (or our header is the damaged part and the source is downstream); any other
 * case (a change on its way from upstream) is left for the next read to queue
 * again. A chunk that reads whole again is left as it is.
 */
#define REPAIR_QUEUE 64u

struct repair_ent {
	uint32_t target_id, idx;
	uint64_t ino;
};

/*
 * Where chunks of our target target_id can be copied from: a serving member of its
 * chain other than ours (the first one after ours, else the last one before),
 * into j (chain, version, source). 1 if there is one, with *downstream set.
 */
static int repair_source(struct storage *s, uint32_t target_id, struct sync_job *j,
			 int *downstream)
{
	struct stk_routing_ref *ref = stk_agent_routing_get(s->agent);
	int found = 0;

	for (uint32_t i = 0; i < ref->rt.nchains && !found; i++) {
		const struct stk_rt_chain *c = &ref->rt.chains[i];
		const struct stk_rt_node *pick = NULL;
		int mine = -1;

		for (unsigned k = 0; k < c->ntargets; k++) {
			const struct stk_rt_target *t = stk_routing_target(&ref->rt, c->targets[k]);
			const struct stk_rt_node *n;

			if (!t)
				continue;
			if (t->id == target_id) {
				mine = (int)k;
				continue;
			}
			if (t->state != STK_TARGET_SERVING && t->state != STK_TARGET_FULL)
				continue;
			n = stk_routing_node(&ref->rt, t->node_id);
			if (!n || n->state != STK_NODE_ONLINE)
				continue;
			pick = n; /* the last one before ours, unless one comes after */
			*downstream = mine >= 0;
			if (mine >= 0)
				break;
		}
		if (mine >= 0 && pick) {
			j->chain_id = c->id;
			j->chain_ver = c->version;
			j->target_id = target_id;
			memcpy(j->src, pick->addr, STK_ADDR_MAX);
			found = 1;
		}
		if (mine >= 0)
			break;
	}
	stk_agent_routing_put(s->agent, ref);
	return found;
}

/*
 * Queues chunk ino/idx of target cs for repair; 1 if it was queued (or already
 * is), 0 if no other member of its chain can supply a copy (the caller then
 * answers EIO) or the queue is full. Never blocks on I/O: loops call it.
 */
static int repair_note(struct storage *s, struct stk_chunk_store *cs, uint64_t ino, uint32_t idx)
{
	struct repair_ent e = {.target_id = stk_chunk_store_id(cs), .idx = idx, .ino = ino};
	struct sync_job j;
	int down = 0, ok = 0;

	if (!repair_source(s, e.target_id, &j, &down))
		return 0;
	pthread_mutex_lock(&s->repair_lock);
	for (unsigned i = 0; i < s->repair_n && !ok; i++) {
		const struct repair_ent *q = &s->repairq[(s->repair_head + i) % REPAIR_QUEUE];

		ok = q->target_id == e.target_id && q->ino == ino && q->idx == idx;
	}
	if (!ok && s->repair_n < REPAIR_QUEUE) {
		s->repairq[(s->repair_head + s->repair_n++) % REPAIR_QUEUE] = e;
		pthread_cond_signal(&s->repair_cv);
		ok = 1;
	}
	pthread_mutex_unlock(&s->repair_lock);
	return ok;
}

/* A read's error, as the client should see it: CHUNK_DAMAGED if a repair is queued. */
static int read_error(struct storage *s, struct stk_chunk_store *cs, uint64_t ino, uint32_t idx,
		      int rc)
{
	if (rc == -EIO && repair_note(s, cs, ino, idx))
		return -EILSEQ;
	return rc;
}

/* Rewrites chunk e of ours from another member (see above). */
static void repair_chunk(struct storage *s, struct sync_job *j, const struct repair_ent *e)
{
	struct stk_chunk_wver v = {0};
	uint64_t mine = 0, theirs = 0, wver;
	uint32_t len, got, mlen;
	int down = 0, rc, hdr;

	j->cs = local_target(s, e->target_id);
	if (!j->cs || !repair_source(s, e->target_id, j, &down))
		return;
	ino_lock_alone(ino_lock(s, j->cs, e->ino));
	/* damaged still? (a change since may have rewritten it) */
	rc = stk_chunk_read_whole(j->cs, e->ino, e->idx, j->buf, STK_MAX_CHUNK_SIZE, &len, &wver,
				  j->crcs);
	if (rc != -EIO)
		goto out;
	hdr = stk_chunk_version(j->cs, e->ino, e->idx, &mine, &mlen);
	rc = sync_fetch(s, j, e->ino, e->idx, &theirs, &got);
	if (rc) {
		stk_warn("target %u: cannot fetch chunk %llx/%u from %s to repair it: %s",
			 e->target_id, (unsigned long long)e->ino, e->idx, j->src, strerror(-rc));
		goto out;
	}
	if (theirs == 0 || (hdr == 0 && theirs != mine) || (hdr != 0 && !down)) {
		stk_warn("target %u: chunk %llx/%u is damaged, but %s holds version %llu where "
			 "ours is %s%llu; left for a later repair",
			 e->target_id, (unsigned long long)e->ino, e->idx, j->src,
			 (unsigned long long)theirs, hdr ? "unreadable, " : "",
			 (unsigned long long)mine);
		goto out;
	}
	v.base = STK_CHUNK_VER_ANY;
	v.set = theirs;
	v.full = 1;
	rc = stk_chunk_write_ver(j->cs, e->ino, e->idx, STK_MAX_CHUNK_SIZE, 0, j->buf, got,
				 j->crcs, 0, &v, &len);
	if (rc) {
		stk_warn("target %u: cannot rewrite damaged chunk %llx/%u: %s", e->target_id,
			 (unsigned long long)e->ino, e->idx, strerror(-rc));
		goto out;
	}
	stk_chunk_store_note_repaired(j->cs);
	stk_warn("target %u: chunk %llx/%u was damaged; rewritten from %s (version %llu)",
		 e->target_id, (unsigned long long)e->ino, e->idx, j->src,
		 (unsigned long long)theirs);
out:
	ino_unlock_alone(ino_lock(s, j->cs, e->ino));
}

/* Sleeps up to ms, or until the daemon stops or a repair is queued. 1: stopping. */
static int repair_wait(struct storage *s, uint64_t ms)
{
	struct timespec ts;
	int stop;

	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += (time_t)(ms / 1000);
	ts.tv_nsec += (long)(ms % 1000) * 1000000;
	if (ts.tv_nsec >= 1000000000) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000;
	}
	pthread_mutex_lock(&s->repair_lock);
	if (!s->repair_n && !s->sync_stop)
		pthread_cond_timedwait(&s->repair_cv, &s->repair_lock, &ts);
	stop = s->sync_stop;
	pthread_mutex_unlock(&s->repair_lock);
	return stop;
}

/* Runs the queued repairs; 1 if the daemon is stopping. */
static int repair_run(struct storage *s, struct sync_job *j)
{
	for (;;) {
		struct repair_ent e;
		int stop;

		pthread_mutex_lock(&s->repair_lock);
		stop = s->sync_stop;
		if (stop || !s->repair_n) {
			pthread_mutex_unlock(&s->repair_lock);
			return stop;
		}
		e = s->repairq[s->repair_head];
		s->repair_head = (s->repair_head + 1) % REPAIR_QUEUE;
		s->repair_n--;
		pthread_mutex_unlock(&s->repair_lock);
		repair_chunk(s, j, &e);
	}
}

/*
 * One scrub pass over every chunk of every target, at most scrub_rate bytes a
 * second, repairs run as they come. 1 if the daemon is stopping.
 */
static int scrub_pass(struct storage *s, struct sync_job *j)
{
	uint64_t t0 = stk_now_ns(), bytes = 0, chunks = 0, damaged = 0;

	stk_info("scrub: checking every chunk at up to %llu bytes/s",
		 (unsigned long long)s->scrub_rate);
	for (unsigned t = 0; t < s->nstores; t++) {
		for (unsigned b = 0; b < 256; b++) {
			struct stk_chunk_ent *ents;
			size_t n;

			if (stk_chunk_list_bucket(s->stores[t], b, &ents, &n))
				continue;
			for (size_t i = 0; i < n; i++) {
				uint64_t ver, due;
				uint32_t len;
				int rc;

				if (repair_run(s, j)) {
					free(ents);
					return 1;
				}
				rc = stk_chunk_read_whole(s->stores[t], ents[i].ino, ents[i].idx,
							  j->buf, STK_MAX_CHUNK_SIZE, &len, &ver,
							  j->crcs);
				chunks++;
				bytes += len;
				if (rc == -EIO) {
					damaged++;
					if (!repair_note(s, s->stores[t], ents[i].ino, ents[i].idx))
						stk_error("scrub: target %u chunk %llx/%u is damaged "
							  "and no other replica can repair it",
							  stk_chunk_store_id(s->stores[t]),
							  (unsigned long long)ents[i].ino,
							  ents[i].idx);
				}
				/* the pace: bytes so far at scrub_rate, from t0 */
				due = t0 + bytes * 1000000000ull / s->scrub_rate;
				while (stk_now_ns() < due) {
					uint64_t ms = (due - stk_now_ns()) / 1000000 + 1;

					if (repair_wait(s, ms > 200 ? 200 : ms) || repair_run(s, j)) {
						free(ents);
						return 1;
					}
				}
			}
			free(ents);
		}
	}
	stk_info("scrub: %llu chunks (%llu bytes) checked in %.1f s, %llu damaged",
		 (unsigned long long)chunks, (unsigned long long)bytes,
		 (double)(stk_now_ns() - t0) / 1e9, (unsigned long long)damaged);
	return 0;
}

static void *repair_main(void *arg)
{
	struct storage *s = arg;
	struct sync_job j;
	/* the first pass a while after start (not on every restart at once), at most
	 * an interval */
	uint64_t next = stk_now_ns() +
			(s->scrub_interval_s < 600 ? s->scrub_interval_s : 600) * 1000000000ull;

	background_priority("repair");
	memset(&j, 0, sizeof(j));
	j.buf = malloc(STK_MAX_CHUNK_SIZE);
	j.crcs = malloc((STK_MAX_CHUNK_SIZE / STK_CRC_BLOCK + 1) * sizeof(uint32_t));
	if (!j.buf || !j.crcs) {
		stk_error("repair: out of memory; damaged chunks are not repaired");
		goto out;
	}
	for (;;) {
		if (repair_run(s, &j))
			break;
		if (s->scrub_rate && s->scrub_interval_s && stk_now_ns() >= next) {
			if (scrub_pass(s, &j))
				break;
			next = stk_now_ns() + s->scrub_interval_s * 1000000000ull;
		}
		if (repair_wait(s, 1000))
			break;
	}
out:
	free(j.buf);
	free(j.crcs);
	return NULL;
}

/* FNV-1a of a subtree's path: which client tree an answer is for. */
static uint64_t tree_hash(const char *path)
{
	uint64_t h = 1469598103934665603ull;

	for (; *path; path++)
		h = (h ^ (uint8_t)*path) * 1099511628211ull;
	return h;
}

static struct sub_ent *sub_slot(struct storage *s, uint64_t tree, uint64_t ino)
{
	return &s->sub[((tree ^ ino) * 0x9E3779B97F4A7C15ull >> 32) % SUB_SLOTS];
}

/* 1 when meta said lately that ino lies under the client's subtree. Never blocks. */
static int subtree_known(struct storage *s, const struct stk_auth_client *c, uint64_t ino)
{
	uint64_t tree = tree_hash(c->subtree), now = stk_now_ns();
	struct sub_ent *e;
	int yes;

	if (strcmp(c->subtree, "/") == 0)
		return 1;
	if (!s->sub)
		return 0;
	pthread_mutex_lock(&s->sub_lock);
	e = sub_slot(s, tree, ino);
	yes = e->tree == tree && e->ino == ino && e->until_ns > now;
	pthread_mutex_unlock(&s->sub_lock);
	return yes;
}

/*
 * Whether a subtree client may have ino's chunks: asked of meta (META_WITHIN, on
 * the worker, which may wait) unless it answered yes in the last SUB_TTL_NS. 0,
 * -EACCES (outside), or the call's error. A file renamed out of the subtree stays
 * reachable on storage for up to SUB_TTL_NS.
 */
static int within_ask(struct storage *s, const struct stk_auth_client *c, uint64_t ino, int call,
		      char *addr, size_t addr_len, struct stk_msg_meta_within_resp *r);

static int subtree_ok(struct storage *s, const struct stk_auth_client *c, uint64_t ino,
		      struct stk_rpc_resp *resp)
{
	struct stk_msg_meta_within_resp r;
	char addr[STK_ADDR_MAX] = "";
	int rc;

	if (subtree_known(s, c, ino))
		return 0;
	if (!s->sub)
		return -ENOMEM;
	/*
	 * Asked of the shard's leader; a meta that no longer leads answers NOT_LEADER
	 * (-EREMCHG) and a dead one not at all (docs/meta-replication.md): the table
	 * is fetched again and the leader it names asked once more.
	 */
	for (int call = 0;; call++) {
		rc = within_ask(s, c, ino, call, addr, sizeof(addr), &r);
		if (rc == 0 || rc == -EBADMSG || rc == -ENXIO || call == 1)
			break;
		stk_agent_routing_refresh(s->agent);
	}
	if (rc == -ENXIO) {
		stk_warn("client %s: no meta serves the namespace just now: cannot tell whether "
			 "inode %llx is under its subtree",
			 c->name, (unsigned long long)ino);
		return -EAGAIN;
	}
	if (rc) {
		stk_warn("cannot ask meta at %s whether inode %llx is client %s's: %s", addr,
			 (unsigned long long)ino, c->name, strerror(-rc));
		return rc == -EBADMSG ? -EIO : -EAGAIN;
	}
	if (!r.within) {
		stk_info("client %s: inode %llx is outside its subtree %s: refused", c->name,
			 (unsigned long long)ino, c->subtree);
		return stk_rpc_client_refused(resp, STK_CLIENT_REFUSED_OUTSIDE, -EACCES);
	}
	pthread_mutex_lock(&s->sub_lock);
	*sub_slot(s, tree_hash(c->subtree), ino) = (struct sub_ent){
	    .tree = tree_hash(c->subtree), .ino = ino, .until_ns = stk_now_ns() + SUB_TTL_NS};
	pthread_mutex_unlock(&s->sub_lock);
	return 0;
}

/*
 * One call of op (META_WITHIN, META_EPOCH) with the request in req[0..len) to the
 * meta the routing table names for shard 1 (its address into addr); the reply's
 * payload into out (cap bytes), its length into *out_len. 0, -ENXIO (none
 * serves) or the call's error.
 */
static int meta_ask(struct storage *s, uint16_t op, const void *req, size_t len, int call,
		    char *addr, size_t addr_len, void *out, size_t cap, size_t *out_len)
{
	struct stk_routing_ref *ref;
	struct stk_rpc rpc;
	struct stk_conn *conn;
	int rc;

	addr[0] = 0;
	for (int attempt = call; attempt < 2 && !addr[0]; attempt++) {
		/* a table from before meta registered: fetch it again once */
		if (attempt && !call)
			stk_agent_routing_refresh(s->agent);
		ref = stk_agent_routing_get(s->agent);
		for (uint32_t i = 0; i < ref->rt.nshards; i++) {
			const struct stk_rt_node *n =
			    ref->rt.shards[i].id == 1
				? stk_routing_node(&ref->rt, ref->rt.shards[i].node_id)
				: NULL;

			if (n)
				stk_strlcpy(addr, n->addr, addr_len);
		}
		stk_agent_routing_put(s->agent, ref);
	}
	if (!addr[0])
		return -ENXIO;
	memset(&rpc, 0, sizeof(rpc));
	rpc.opcode = op;
	rpc.req = req;
	rpc.req_len = len;
	rpc.resp = out;
	rpc.resp_cap = cap;
	stk_metric_add(s->asks_m[op != STK_OP_META_WITHIN], 1);
	stk_server_wait_begin();
	rc = stk_pool_get(s->fwd, addr, &conn);
	if (rc == 0) {
		rc = stk_rpc_call(conn, &rpc);
		stk_pool_put(s->fwd, conn);
	}
	stk_server_wait_end();
	if (rc == 0)
		*out_len = rpc.resp_len;
	return rc;
}

/* One META_WITHIN (meta_ask). 0 with *r filled, -ENXIO, -EBADMSG or the call's error. */
static int within_ask(struct storage *s, const struct stk_auth_client *c, uint64_t ino, int call,
		      char *addr, size_t addr_len, struct stk_msg_meta_within_resp *r)
{
	struct stk_msg_meta_within_req q;
	uint8_t req[STK_PATH_MAX + 64], out[64];
	struct stk_wbuf w;
	struct stk_rbuf rb;
	size_t len = 0;
	int rc;

	memset(&q, 0, sizeof(q));
	q.ino = ino;
	stk_strlcpy(q.subtree, c->subtree, sizeof(q.subtree));
	stk_wbuf_init(&w, req, sizeof(req));
	stk_msg_meta_within_req_enc(&w, &q);
	rc = meta_ask(s, STK_OP_META_WITHIN, req, w.len, call, addr, addr_len, out, sizeof(out),
		      &len);
	if (rc == 0) {
		stk_rbuf_init(&rb, out, len);
		if (stk_msg_meta_within_resp_dec(&rb, r) || stk_rbuf_finish(&rb))
			rc = -EBADMSG;
	}
	return rc;
}

/*
 * Vouchers (wire.h STK_FRAME_VOUCH, docs/security.md "Vouchers"): meta's word,
 * MACed under the vouch key, that the inodes [ino, ino + count) lie under the
 * client's subtree as of its epoch. Storage takes it for META_WITHIN's yes while
 * it has not expired and no rename meta made after it can have moved its inode
 * out (meta/moves.h): its epoch is at least the last folder rename's, the last
 * move of a file in its inode's slot and what meta's log lost. Meta is asked at
 * most once every EPOCH_FRESH_NS while vouchers come (a worker asks; the loop
 * serves only while what it knows is fresh), so a rename at meta ends the
 * vouchers it concerns within EPOCH_FRESH_NS and a call. Only shard 1's meta is
 * asked, and only its vouchers are taken.
 */
#define EPOCH_FRESH_NS (1000ull * 1000000ull)
/* A voucher that says it lasts longer than meta gives (a clock ahead): not taken. */
#define VOUCH_LONGEST_MS (60000ull + 5000ull)
/* Slots of moved_at: inodes that share one are ended by each other's moves. */
#define MOVED_SLOTS 8192u
/* How long a meta that does not know moves is asked the plain META_EPOCH. */
#define MOVES_OLD_NS (60000ull * 1000000ull)

static unsigned moved_slot(uint64_t ino)
{
	return (unsigned)((ino * 0x9E3779B97F4A7C15ull) >> 32) % MOVED_SLOTS;
}

enum vouch_result { VOUCH_ACCEPTED = 0, VOUCH_NONE, VOUCH_STALE, VOUCH_REFUSED };

/*
 * A META_EPOCH reply with moves (meta/moves.h) into s, asked with since at t0.
 * Everything only ever rises (max), so answers that cross do no harm. 0 or
 * -EBADMSG.
 */
static int moves_apply(struct storage *s, const uint8_t *p, size_t len, uint64_t since,
		       uint64_t t0)
{
	struct stk_msg_meta_epoch_resp e;
	struct stk_msg_meta_moves_resp r;
	struct stk_msg_moved_rec rec;
	struct stk_rbuf rb;

	stk_rbuf_init(&rb, p, len);
	if (stk_msg_meta_epoch_resp_dec(&rb, &e) || stk_msg_meta_moves_resp_dec(&rb, &r) ||
	    r.n > STK_MOVED_MAX)
		return -EBADMSG;
	pthread_mutex_lock(&s->sub_lock);
	if (r.base != s->mv_base) {
		/* a restarted meta (or another leader): its moves up to since are unknown */
		if (since && e.epoch > s->mv_floor)
			s->mv_floor = e.epoch;
		s->mv_base = r.base;
	}
	s->mv_wide = r.wide > s->mv_wide ? r.wide : s->mv_wide;
	s->mv_floor = r.lost > s->mv_floor ? r.lost : s->mv_floor;
	for (uint32_t i = 0; i < r.n; i++) {
		uint64_t *at;

		if (stk_msg_moved_rec_dec(&rb, &rec))
			break;
		at = &s->moved_at[moved_slot(rec.ino)];
		*at = rec.at > *at ? rec.at : *at;
	}
	if (rb.err || stk_rbuf_finish(&rb)) {
		/* half read: trust nothing before now */
		s->mv_floor = e.epoch > s->mv_floor ? e.epoch : s->mv_floor;
		pthread_mutex_unlock(&s->sub_lock);
		return -EBADMSG;
	}
	if (t0 > s->epoch_ns) { /* not over a newer answer of another worker's */
		s->mv_known = e.epoch;
		s->epoch_ns = t0;
	}
	pthread_mutex_unlock(&s->sub_lock);
	return 0;
}

/*
 * META_EPOCH, on a worker: what meta moved since last asked, into s. A meta from
 * before moves (it refuses the request with since) is asked its bare epoch, each
 * rename of which ends every voucher. 0 or -errno.
 */
static int epoch_refresh(struct storage *s)
{
	struct stk_msg_meta_epoch_req q;
	struct stk_msg_meta_epoch_resp r;
	char addr[STK_ADDR_MAX];
	size_t cap = 64 + (size_t)STK_MOVED_MAX * 16, len = 0;
	uint8_t req[16], *out = malloc(cap);
	struct stk_wbuf w;
	struct stk_rbuf rb;
	/* fresh from before the ask: a rename while it travels is not missed */
	uint64_t t0 = stk_now_ns(), old_ns;
	int rc;

	if (!out)
		return -ENOMEM;
	pthread_mutex_lock(&s->sub_lock);
	q.since = s->mv_base ? s->mv_known : 0;
	old_ns = s->mv_old_ns;
	pthread_mutex_unlock(&s->sub_lock);
	if (!s->epoch_only && (!old_ns || t0 - old_ns > MOVES_OLD_NS)) {
		stk_wbuf_init(&w, req, sizeof(req));
		stk_msg_meta_epoch_req_enc(&w, &q);
		rc = meta_ask(s, STK_OP_META_EPOCH, req, w.len, 0, addr, sizeof(addr), out, cap,
			      &len);
		if (rc == 0)
			rc = moves_apply(s, out, len, q.since, t0);
		if (rc != -EBADMSG)
			goto out;
		/* a meta from before moves: every rename is wide (at most 1 s late) */
		pthread_mutex_lock(&s->sub_lock);
		if (!s->mv_old_ns)
			stk_info("meta at %s does not tell moves: any rename there ends every "
				 "voucher",
				 addr);
		s->mv_old_ns = t0;
		pthread_mutex_unlock(&s->sub_lock);
	}
	rc = meta_ask(s, STK_OP_META_EPOCH, NULL, 0, 0, addr, sizeof(addr), out, cap, &len);
	if (rc == 0) {
		stk_rbuf_init(&rb, out, len);
		if (stk_msg_meta_epoch_resp_dec(&rb, &r) || stk_rbuf_finish(&rb))
			rc = -EBADMSG;
	}
	if (rc == 0) {
		pthread_mutex_lock(&s->sub_lock);
		s->mv_wide = r.epoch > s->mv_wide ? r.epoch : s->mv_wide;
		if (t0 > s->epoch_ns) {
			s->mv_known = r.epoch;
			s->epoch_ns = t0;
		}
		pthread_mutex_unlock(&s->sub_lock);
	}
out:
	if (rc)
		stk_warn("cannot ask meta at %s for its vouch epoch: %s (vouchers are not taken)",
			 addr[0] ? addr : "(none)", strerror(-rc));
	free(out);
	return rc;
}

/* Whether a voucher of epoch e for ino outlived no rename that concerns it; under sub_lock. */
static int vouch_current(const struct storage *s, uint64_t e, uint64_t ino)
{
	return s->moved_at && stk_ino_shard(ino) == 1 && e >= s->mv_wide && e >= s->mv_floor &&
	       e >= s->moved_at[moved_slot(ino)];
}

/*
 * The verdict on req's voucher for ino (a subtree client's request): VOUCH_ACCEPTED
 * (served without asking meta), VOUCH_NONE or VOUCH_STALE (meta is asked, as
 * without one), VOUCH_REFUSED (forged or for another inode: the request is
 * refused). may_ask: this thread may wait for meta (a worker); on a loop a
 * voucher whose epoch is not known fresh is VOUCH_STALE and the request goes to a
 * worker. Counted (stoker_storage_vouchers_total) only when count is set.
 */
static enum vouch_result vouch_check(struct storage *s, const struct stk_rpc_req *req,
				     uint64_t ino, int may_ask, int count)
{
	const struct stk_auth_client *c = req->client;
	struct stk_msg_vouch_rec rec;
	struct stk_auth_vouch v;
	struct stk_rbuf rb;
	enum vouch_result res = VOUCH_NONE;
	uint64_t now_ms, at;
	int current;

	if (!(req->hdr.flags & STK_FRAME_VOUCH) || !s->vouching)
		goto out;
	res = VOUCH_REFUSED;
	if (!req->vouch) {
		if (count)
			stk_warn("%s: client %s: a voucher too short: refused", req->peer, c->name);
		goto out;
	}
	stk_rbuf_init(&rb, req->vouch, STK_VOUCH_REC_LEN);
	if (stk_msg_vouch_rec_dec(&rb, &rec) || stk_rbuf_finish(&rb))
		goto out;
	v.ino = rec.ino;
	v.count = rec.count;
	v.expires_ms = rec.expires_ms;
	v.epoch = rec.epoch;
	memcpy(v.mac, rec.mac, sizeof(v.mac));
	if (ino < v.ino || ino - v.ino >= v.count) {
		if (count)
			stk_warn("%s: client %s: a voucher for inodes %llx+%llu shown for inode "
				 "%llx: refused",
				 req->peer, c->name, (unsigned long long)v.ino,
				 (unsigned long long)v.count, (unsigned long long)ino);
		goto out;
	}
	if (!stk_auth_vouch_check(s->vouch_key, c, &v)) {
		if (count)
			stk_warn("%s: client %s: a voucher for inode %llx that meta did not make "
				 "(forged, or another cluster's): refused",
				 req->peer, c->name, (unsigned long long)ino);
		goto out;
	}
	res = VOUCH_STALE;
	now_ms = stk_wall_ms();
	if (v.expires_ms <= now_ms || v.expires_ms > now_ms + VOUCH_LONGEST_MS)
		goto out;
	pthread_mutex_lock(&s->sub_lock);
	at = s->epoch_ns;
	current = vouch_current(s, v.epoch, ino);
	pthread_mutex_unlock(&s->sub_lock);
	if (!at || stk_now_ns() - at > EPOCH_FRESH_NS) {
		if (!may_ask || epoch_refresh(s))
			goto out;
		pthread_mutex_lock(&s->sub_lock);
		current = vouch_current(s, v.epoch, ino);
		pthread_mutex_unlock(&s->sub_lock);
	}
	if (current)
		res = VOUCH_ACCEPTED;
out:
	if (count)
		stk_metric_add(s->vouch_m[res], 1);
	return res;
}

/* The inode of a request that names one (READ, WRITE, TRUNCATE, PUNCH, PREFETCH). */
static int req_ino(const struct stk_rpc_req *req, uint64_t *ino)
{
	struct stk_rbuf r = req->payload;

	switch (req->hdr.opcode) {
	case STK_OP_STOR_READ: {
		struct stk_msg_stor_read_req q;

		if (stk_msg_stor_read_req_dec(&r, &q))
			return -EBADMSG;
		*ino = q.ino;
		return 0;
	}
	case STK_OP_STOR_WRITE: {
		struct stk_msg_stor_write_req q;

		if (stk_msg_stor_write_req_dec(&r, &q))
			return -EBADMSG;
		*ino = q.ino;
		return 0;
	}
	case STK_OP_STOR_TRUNCATE: {
		struct stk_msg_stor_truncate_req q;

		if (stk_msg_stor_truncate_req_dec(&r, &q))
			return -EBADMSG;
		*ino = q.ino;
		return 0;
	}
	case STK_OP_STOR_PUNCH: {
		struct stk_msg_stor_punch_req q;

		if (stk_msg_stor_punch_req_dec(&r, &q))
			return -EBADMSG;
		*ino = q.ino;
		return 0;
	}
	case STK_OP_STOR_PREFETCH: {
		struct stk_msg_stor_prefetch_req q;

		if (stk_msg_stor_prefetch_req_dec(&r, &q))
			return -EBADMSG;
		*ino = q.ino;
		return 0;
	}
	}
	return -ENOENT;
}

/* A subtree client's request: every inode it names must be under its subtree. */
static int subtree_gate(struct storage *s, const struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	const struct stk_auth_client *c = req->client;
	uint64_t ino = 0;
	int rc;

	if (strcmp(c->subtree, "/") == 0)
		return 0;
	if (req->hdr.opcode == STK_OP_STOR_TRUNCATES) {
		struct stk_msg_stor_truncates_req q;
		struct stk_rbuf r = req->payload;

		if (stk_msg_stor_truncates_req_dec(&r, &q) || q.n > STK_TRUNCATES_MAX)
			return -EBADMSG;
		for (uint32_t i = 0; i < q.n; i++) {
			struct stk_msg_trunc_rec t;

			if (stk_msg_trunc_rec_dec(&r, &t))
				return -EBADMSG;
			rc = subtree_ok(s, c, t.ino, resp);
			if (rc)
				return rc;
		}
		return 0;
	}
	rc = req_ino(req, &ino);
	if (rc == -ENOENT)
		return 0; /* names no inode (SYNC) */
	if (rc)
		return rc;
	switch (vouch_check(s, req, ino, 1, 1)) {
	case VOUCH_ACCEPTED:
		return 0;
	case VOUCH_REFUSED:
		return stk_rpc_client_refused(resp, STK_CLIENT_REFUSED_OUTSIDE, -EACCES);
	default:
		return subtree_ok(s, c, ino, resp);
	}
}

/*
 * What a client key may ask of storage (docs/security.md, "Client keys"): a
 * read-only one no write, truncate or punch (EROFS), none the copies between
 * nodes (EPERM), and a subtree one no chunk of an inode outside its subtree
 * (EACCES; asked of meta, subtree_ok). 0 to serve.
 */
static int client_gate(struct storage *s, const struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	const struct stk_auth_client *c = req->client;

	switch (req->hdr.opcode) {
	case STK_OP_STOR_READ:
	case STK_OP_STOR_SYNC:
	case STK_OP_STOR_PREFETCH:
		return subtree_gate(s, req, resp);
	case STK_OP_STOR_WRITE:
	case STK_OP_STOR_TRUNCATE:
	case STK_OP_STOR_TRUNCATES:
	case STK_OP_STOR_PUNCH:
		if (!(c->flags & STK_CLIENT_RO))
			return subtree_gate(s, req, resp);
		stk_info("%s: client %s is read-only: %s refused", req->peer, c->name,
			 stk_opcode_name(req->hdr.opcode));
		return stk_rpc_client_refused(resp, STK_CLIENT_REFUSED_RO, -EROFS);
	default:
		stk_warn("%s: client %s may not %s: refused", req->peer, c->name,
			 stk_opcode_name(req->hdr.opcode));
		return stk_rpc_client_refused(resp, STK_CLIENT_REFUSED_ADMIN, -EPERM);
	}
}

/* ---- settling changes a successor did not take (see unsettled_note) ---- */

/*
 * Sends our copy of unsettled chunk u whole to our successor in its chain as it
 * is now, with the inode's lock shared and the chunk's lock held (as a write
 * does), or finds that no successor needs it. Our copy is kept as it is: it is
 * never undone, since a member upstream of ours may hold it too, and a client
 * that sent the change again would make it anyway. 0 (settled, or nothing to
 * do), or -EAGAIN: try again later.
 */
static int settle_one(struct storage *s, const struct unsettled *u)
{
	struct stk_msg_stor_write_req m;
	struct hop h;
	uint8_t *msg = NULL, *data = NULL;
	uint32_t *crcs = NULL, clen;
	uint64_t ver;
	size_t len;
	long n;
	int rc, ret = 0;

	ino_share(ino_lock(s, u->cs, u->ino));
	stk_chunk_lock(u->cs, u->ino, u->idx);
	if (!unsettled_has(s, u->cs, u->ino, u->idx))
		goto out; /* a write settled it meanwhile */
	if (fenced(s)) {
		ret = -EAGAIN; /* we may be out of the chain: mgmtd says when it answers */
		goto out;
	}
	rc = route(s, u->chain_id, 0, 0, &h);
	if (rc || h.cs != u->cs) {
		/* no longer a member changes reach: nobody reads our copy as committed, and
		 * a resync makes it the chain's when we are one again */
		unsettled_clear(s, u->cs, u->ino, u->idx, "no longer in its chain");
		goto out;
	}
	if (h.tail) {
		unsettled_clear(s, u->cs, u->ino, u->idx, "we are its chain's tail now");
		goto out;
	}
	rc = stk_chunk_version(u->cs, u->ino, u->idx, &ver, &clen);
	if (rc == 0 && ver == 0) {
		/* removed since (a truncate or a punch, which went down the chain itself) */
		unsettled_clear(s, u->cs, u->ino, u->idx, "the chunk is gone");
		goto out;
	}
	n = rc;
	if (rc == 0) {
		data = malloc(clen ? clen : 1);
		crcs = malloc(4 * ((size_t)stk_crc_blocks(clen) + 1));
		n = data && crcs ? stk_chunk_read(u->cs, u->ino, u->idx, 0, data, clen, crcs)
				 : -ENOMEM;
		if (n >= 0 && (uint32_t)n != clen)
			n = -EIO;
	}
	if (n >= 0) {
		memset(&m, 0, sizeof(m));
		m.chain_id = u->chain_id;
		m.chain_ver = h.chain_ver;
		m.ino = u->ino;
		m.chunk_idx = u->idx;
		m.chunk_size = u->chunk_size;
		m.length = clen;
		m.ncrcs = stk_crc_blocks(clen);
		m.flags = STK_WRITE_FULL;
		m.base_ver = UINT64_MAX;
		m.set_ver = ver;
		msg = write_msg(&m, crcs, &len);
		stk_metric_add(s->m_resends, 1);
		n = msg ? forward(s, h.next, STK_OP_STOR_WRITE, msg, len, data, clen,
				  STK_FRAME_BULK_SELF)
			: -ENOMEM;
		if (n)
			stk_metric_add(s->m_failures, 1);
	}
	if (n == 0) {
		unsettled_clear(s, u->cs, u->ino, u->idx, "sent whole to its successor again");
	} else {
		stk_debug("chunk %llx/%u: not settled yet: %s", (unsigned long long)u->ino, u->idx,
			  strerror((int)-n));
		ret = -EAGAIN;
	}
out:
	stk_chunk_unlock(u->cs, u->ino, u->idx);
	ino_unshare(ino_lock(s, u->cs, u->ino));
	free(msg);
	free(data);
	free(crcs);
	return ret;
}

/*
 * Sends unsettled truncate or punch u of an inode again, as it was, to our
 * successor, with the inode's lock held alone, or finds that no successor needs
 * it (as settle_one does for a chunk). 0, or -EAGAIN: try again later.
 */
static int settle_inode(struct storage *s, const struct unsettled *u)
{
	uint8_t msg[128];
	struct stk_wbuf w;
	struct hop h;
	int rc, ret = 0;

	ino_lock_alone(ino_lock(s, u->cs, u->ino));
	if (!inode_unsettled(s, u->cs, u->ino))
		goto out;
	if (fenced(s)) {
		ret = -EAGAIN;
		goto out;
	}
	rc = route(s, u->chain_id, 0, 0, &h);
	if (rc || h.cs != u->cs) {
		unsettled_clear(s, u->cs, u->ino, UNSETTLED_INODE, "no longer in its chain");
		goto out;
	}
	if (h.tail) {
		unsettled_clear(s, u->cs, u->ino, UNSETTLED_INODE, "we are its chain's tail now");
		goto out;
	}
	stk_wbuf_init(&w, msg, sizeof(msg));
	if (u->op == STK_OP_STOR_TRUNCATE) {
		struct stk_msg_stor_truncate_req m = {.chain_id = u->chain_id,
						      .chain_ver = h.chain_ver,
						      .ino = u->ino,
						      .size = u->size,
						      .chunk_size = u->chunk_size,
						      .ns_hi = u->ns_hi,
						      .ns_lo = u->ns_lo};

		rc = stk_msg_stor_truncate_req_enc(&w, &m);
	} else {
		struct stk_msg_stor_punch_req m = {.chain_id = u->chain_id,
						   .chain_ver = h.chain_ver,
						   .ino = u->ino,
						   .first = u->first,
						   .end = u->end};

		rc = stk_msg_stor_punch_req_enc(&w, &m);
	}
	if (rc == 0) {
		stk_metric_add(s->m_resends, 1);
		rc = forward(s, h.next, u->op, msg, w.len, NULL, 0, 0);
		if (rc)
			stk_metric_add(s->m_failures, 1);
	}
	if (rc == 0) {
		unsettled_clear(s, u->cs, u->ino, UNSETTLED_INODE, "sent to its successor again");
	} else {
		stk_debug("inode %llx: not settled yet: %s", (unsigned long long)u->ino,
			  strerror(-rc));
		ret = -EAGAIN;
	}
out:
	ino_unlock_alone(ino_lock(s, u->cs, u->ino));
	return ret;
}

/* The wait after an unsettled change's tries-th failed resend (see SETTLE_MS). */
static uint64_t settle_delay_ns(uint32_t tries)
{
	uint64_t ms = SETTLE_MS;

	while (tries-- > 1 && ms < SETTLE_MAX_MS)
		ms *= 2;
	return STK_MIN(ms, (uint64_t)SETTLE_MAX_MS) * 1000000ull;
}

/*
 * u (a copy taken at now) was not settled: it waits longer before its next
 * resend, and the other changes of its chain at least as long (they would fail
 * the same way, and each failed forward asks mgmtd for the routing table).
 */
static void settle_failed(struct storage *s, const struct unsettled *u, uint64_t now)
{
	uint32_t tries = u->tries + 1;
	uint64_t next = now + settle_delay_ns(tries);
	int i, warn = 0;

	pthread_mutex_lock(&s->settle_lock);
	i = unsettled_find(s, u->cs, u->ino, u->idx);
	if (i >= 0) {
		tries = s->unsettled[i].tries + 1;
		next = now + settle_delay_ns(tries);
		s->unsettled[i].tries = tries;
		/* once, when the wait reaches its cap: the successor has refused a while */
		warn = settle_delay_ns(tries) == SETTLE_MAX_MS * 1000000ull &&
		       settle_delay_ns(tries - 1) < SETTLE_MAX_MS * 1000000ull;
	}
	for (unsigned k = 0; k < s->nunsettled; k++) {
		struct unsettled *e = &s->unsettled[k];

		if (e->cs == u->cs && e->chain_id == u->chain_id && e->next_ns < next)
			e->next_ns = next;
	}
	pthread_mutex_unlock(&s->settle_lock);
	if (warn)
		stk_warn("chain %u: our successor has not taken a change of inode %llx for %llu s "
			 "(%u resends); it is sent again every %u s until it does",
			 u->chain_id, (unsigned long long)u->ino,
			 (unsigned long long)((now - u->since_ns) / 1000000000ull), tries,
			 SETTLE_MAX_MS / 1000);
}

/* At each scrape: the changes held, the age of the oldest, and the table's size. */
static void settle_collect(void *ctx)
{
	struct storage *s = ctx;
	uint64_t now = stk_now_ns(), oldest = now;
	unsigned n;

	pthread_mutex_lock(&s->settle_lock);
	n = s->nunsettled;
	for (unsigned i = 0; i < n; i++)
		oldest = STK_MIN(oldest, s->unsettled[i].since_ns);
	pthread_mutex_unlock(&s->settle_lock);
	stk_metric_set_int(s->m_unsettled, n);
	stk_metric_set(s->m_oldest, (double)(now - oldest) / 1e9);
	stk_metric_set_int(s->m_capacity, s->unsettled_max);
}

/* The stoker_node_unsettled_* and _settle_* series, with --metrics. 0 or -errno. */
static int settle_metrics_start(struct storage *s)
{
	int rc = stk_metric_series(STK_M_NODE_UNSETTLED, NULL, &s->m_unsettled);

	rc = rc ? rc : stk_metric_series(STK_M_NODE_UNSETTLED_OLDEST, NULL, &s->m_oldest);
	rc = rc ? rc : stk_metric_series(STK_M_NODE_UNSETTLED_CAPACITY, NULL, &s->m_capacity);
	rc = rc ? rc : stk_metric_series(STK_M_NODE_SETTLE_RESENDS, NULL, &s->m_resends);
	rc = rc ? rc : stk_metric_series(STK_M_NODE_SETTLE_FAILURES, NULL, &s->m_failures);
	rc = rc ? rc : stk_metric_series(STK_M_NODE_UNSETTLED_REFUSED, NULL, &s->m_refused);
	return rc ? rc : stk_metrics_collector_add(settle_collect, s);
}

/* Sends unsettled changes again, each when its wait is over (settle_delay_ns). */
static void *settle_main(void *arg)
{
	struct storage *s = arg;
	struct unsettled *batch = calloc(UNSETTLED_MAX, sizeof(*batch));
	uint32_t failed[SETTLE_FAILED_MAX];
	unsigned nfailed;

	if (!batch) {
		stk_error("settle: out of memory; changes a successor refused wait for their "
			  "writers");
		return NULL;
	}
	for (;;) {
		struct timespec ts;
		uint64_t now;
		unsigned n;

		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += SETTLE_MS * 1000000L;
		if (ts.tv_nsec >= 1000000000) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000;
		}
		pthread_mutex_lock(&s->settle_lock);
		if (!s->sync_stop)
			pthread_cond_timedwait(&s->settle_cv, &s->settle_lock, &ts);
		if (s->sync_stop) {
			pthread_mutex_unlock(&s->settle_lock);
			break;
		}
		n = s->nunsettled;
		memcpy(batch, s->unsettled, n * sizeof(*batch));
		pthread_mutex_unlock(&s->settle_lock);
		now = stk_now_ns();
		/* A chain whose successor refused one change is not sent the others this
		 * round: each failed forward fetches the routing table from mgmtd. */
		nfailed = 0;
		for (unsigned i = 0; i < n && !__atomic_load_n(&s->sync_stop, __ATOMIC_RELAXED);
		     i++) {
			unsigned k = 0;

			while (k < nfailed && failed[k] != batch[i].chain_id)
				k++;
			if (k < nfailed || batch[i].next_ns > now)
				continue;
			if ((batch[i].idx == UNSETTLED_INODE ? settle_inode(s, &batch[i])
							     : settle_one(s, &batch[i])) == 0)
				continue;
			settle_failed(s, &batch[i], now);
			if (nfailed == SETTLE_FAILED_MAX)
				break; /* the rest next round */
			failed[nfailed++] = batch[i].chain_id;
		}
	}
	free(batch);
	return NULL;
}

static int storage_dispatch(struct storage *s, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	int rc = req->client ? client_gate(s, req, resp) : 0;

	if (rc)
		return rc;
	switch (req->hdr.opcode) {
	case STK_OP_STOR_WRITE:
		return handle_write(s, req, resp);
	case STK_OP_STOR_READ:
		return handle_read(s, req, resp);
	case STK_OP_STOR_TRUNCATE:
		return handle_truncate(s, req, resp);
	case STK_OP_STOR_TRUNCATES:
		return handle_truncates(s, req, resp);
	case STK_OP_STOR_PUNCH:
		return handle_punch(s, req, resp);
	case STK_OP_STOR_SYNC:
		return handle_sync(s, req, resp);
	case STK_OP_STOR_PREFETCH:
		return handle_prefetch(s, req);
	case STK_OP_STOR_SYNC_LIST:
		return handle_sync_list(s, req, resp);
	case STK_OP_STOR_SYNC_READ:
		return handle_sync_read(s, req, resp);
	case STK_OP_STOR_FSCK_LIST:
		return handle_fsck_list(s, req, resp);
	default:
		return -ENOSYS;
	}
}

/*
 * QoS (qos.h, docs/qos.md): a client key's request of class cls is charged to
 * its tenant's buckets (and its class's, while a higher one is busy) once; one
 * that must wait is taken and parked until its time, then served from the start
 * (req->requeued). STK_RPC_PENDING when parked, else 0.
 */
static int qos_hold(struct stk_rpc_req *req, struct stk_rpc_resp *resp, unsigned cls)
{
	struct stk_msg_stor_read_req rq;
	struct stk_rbuf peek = req->payload;
	struct stk_rpc_pending *p;
	uint64_t bytes = req->bulk_len, wait;
	int write = req->hdr.opcode != STK_OP_STOR_READ;

	if (!write)
		bytes = stk_msg_stor_read_req_dec(&peek, &rq) ? 0 : rq.length;
	/* only reads and writes take part in classes; the rest count on the tenant's */
	if (req->hdr.opcode != STK_OP_STOR_READ && req->hdr.opcode != STK_OP_STOR_WRITE)
		cls = STK_QOS_CLASS_LOWEST + 1;
	wait = stk_qos_charge(req->client->name, cls, write, bytes);
	if (wait < 20000) /* 20 us: less than parking costs */
		return 0;
	p = stk_rpc_pending_take(resp);
	if (stk_qos_park(p, wait))
		stk_rpc_pending_requeue(p); /* no room to park it: served now, over its limit */
	return STK_RPC_PENDING;
}

static int storage_handle(void *ctx, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	struct storage *s = ctx;
	unsigned cls = (req->hdr.flags & STK_FRAME_CLASS_MASK) >> STK_FRAME_CLASS_SHIFT;
	int rc;

	if (cls > STK_QOS_CLASS_LOWEST)
		rc = -EINVAL; /* no such class */
	else if (req->client && !req->requeued && qos_hold(req, resp, cls) == STK_RPC_PENDING)
		return STK_RPC_PENDING; /* counted when it is answered */
	else
		rc = storage_dispatch(s, req, resp);

	if (rc == STK_RPC_PENDING)
		return rc; /* counted when it is answered */
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
 * and all writes, truncates, punches and syncs (whose forwards come back here:
 * write_on_loop, forward_on_loop). STOKER_LOOP_READS=0 turns it off.
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
	uint64_t ino; /* the chunk read, for a repair */
	uint32_t idx;
	void *buf;
	struct stk_chunk_aread ar;
	uint32_t crcs[LOOP_READ_MAX / STK_CRC_BLOCK];
};

struct storage_loop {
	struct storage *s;
	int epfd; /* what the server's loop watches: the ring's eventfd and the client's */
	char aio_tag; /* epoll data of the ring's eventfd */
	struct stk_lclient *lc; /* forwards down chains (write_on_loop) */
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
	} else {
		rc = read_error(sl->s, lr->cs, lr->ino, lr->idx, rc);
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
	struct hop h;
	void *buf;
	int rc;

	if (stk_msg_stor_read_req_dec(&req->payload, &rq) || stk_rbuf_finish(&req->payload))
		return STK_RPC_TO_WORKER; /* the worker answers it as it would any other */
	if (!lr || rq.length > LOOP_READ_MAX || rq.length == 0)
		return STK_RPC_TO_WORKER;
	if (route_look(s, rq.chain_id, 1, rq.chain_ver, &h) ||
	    read_check(s, &h, rq.ino, rq.chunk_idx))
		return STK_RPC_TO_WORKER; /* a refresh, or the reply that says the client must */
	cs = h.cs;
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
	lr->ino = rq.ino;
	lr->idx = rq.chunk_idx;
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
	struct storage_loop *sl = state;
	enum vouch_result v = VOUCH_NONE;
	int counted = 0, rc;
	uint64_t ino;
	unsigned cls;

	if (req->hdr.opcode != STK_OP_STOR_READ)
		return STK_RPC_TO_WORKER;
	/* a tenant or class with QoS limits is charged, and held if need be, by the workers */
	cls = (req->hdr.flags & STK_FRAME_CLASS_MASK) >> STK_FRAME_CLASS_SHIFT;
	if (cls > STK_QOS_CLASS_LOWEST || (req->client && stk_qos_limited(req->client->name, cls)))
		return STK_RPC_TO_WORKER;
	if (req->client)
		stk_qos_seen(cls);
	/* a subtree client's read of an inode not known to be its own: a worker asks meta */
	if (req->client && strcmp(req->client->subtree, "/") != 0) {
		if (req_ino(req, &ino))
			return STK_RPC_TO_WORKER;
		/* a voucher, or meta's yes of late; else a worker asks meta (or refuses) */
		v = vouch_check(sl->s, req, ino, 0, 0);
		if (v != VOUCH_ACCEPTED &&
		    (v == VOUCH_REFUSED || !subtree_known(sl->s, req->client, ino)))
			return STK_RPC_TO_WORKER;
		counted = 1;
	}
	rc = loop_read(state, req, resp, p);
	/* one handed on to a worker is counted there (client_gate) */
	if (counted && rc != STK_RPC_TO_WORKER)
		stk_metric_add(sl->s->vouch_m[v], 1);
	return rc;
}

static struct stk_lclient *loop_client(struct storage_loop *sl)
{
	return sl->lc;
}

static int loop_attach(void *ctx, unsigned loop, void **state, int *fd)
{
	struct storage_loop *sl = calloc(1, sizeof(*sl));
	struct storage *s = ctx;
	struct epoll_event e = {.events = EPOLLIN};
	int rc, afd = -1;

	if (!sl)
		return -ENOMEM;
	sl->s = s;
	sl->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (sl->epfd < 0) {
		rc = -errno;
		free(sl);
		return rc;
	}
	rc = stk_aio_create(LOOP_READS, &sl->aio, &afd);
	if (rc) {
		static int told;
		if (!told++)
			stk_warn("io_uring is not available (%s): reads are served by the "
				 "worker threads",
				 strerror(-rc));
		goto fail;
	}
	e.data.ptr = &sl->aio_tag;
	if (epoll_ctl(sl->epfd, EPOLL_CTL_ADD, afd, &e) < 0) {
		rc = -errno;
		goto fail;
	}
	rc = stk_lclient_create(sl->epfd, 0, s->watch, &sl->lc);
	if (rc)
		goto fail;
	for (unsigned i = 0; i < LOOP_READS; i++) {
		sl->reads[i].sl = sl;
		sl->reads[i].next = sl->free;
		sl->free = &sl->reads[i];
	}
	*state = sl;
	*fd = sl->epfd;
	return 0;
fail:
	if (sl->aio)
		stk_aio_destroy(sl->aio);
	close(sl->epfd);
	free(sl);
	return rc;
}

static void loop_event(void *ctx, void *state)
{
	struct storage_loop *sl = state;
	struct epoll_event ev[64];
	int n = epoll_wait(sl->epfd, ev, 64, 0);

	for (int i = 0; i < n; i++) {
		if (ev[i].data.ptr == &sl->aio_tag)
			stk_aio_reap(sl->aio);
		else
			stk_lclient_event(sl->lc, ev[i].data.ptr, ev[i].events);
	}
	stk_lclient_batch_end(sl->lc);
}

static void loop_flush(void *ctx, void *state)
{
	struct storage_loop *sl = state;

	stk_aio_submit(sl->aio);
}

static void loop_detach(void *ctx, void *state)
{
	struct storage_loop *sl = state;

	stk_lclient_destroy(sl->lc); /* every forward in flight is failed, its write answered */
	stk_aio_destroy(sl->aio); /* every read in flight is answered */
	close(sl->epfd);
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
	s->tail_busy = calloc(STK_MAX(opts->ntargets, 1), sizeof(*s->tail_busy));
	s->ino_locks =
	    calloc((size_t)STK_MAX(opts->ntargets, 1) * INO_LOCKS, sizeof(*s->ino_locks));
	if (!s->stores || !s->tail_busy || !s->ino_locks)
		return -ENOMEM;
	for (size_t i = 0; i < (size_t)STK_MAX(opts->ntargets, 1) * INO_LOCKS; i++) {
		pthread_mutex_init(&s->ino_locks[i].m, NULL);
		pthread_cond_init(&s->ino_locks[i].cv, NULL);
	}
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

	rc = stk_qos_start();
	if (rc) {
		stk_error("cannot start the QoS timer: %s", strerror(-rc));
		return rc;
	}
	memset(&ao, 0, sizeof(ao));
	ao.size = sizeof(ao);
	ao.mgmtd = b->opts->mgmtd;
	ao.role = STK_ROLE_STORAGE;
	ao.qos = stk_qos_policy_set;
	ao.addr = stk_daemon_addr(d);
	ao.node_id = b->node_id;
	ao.targets = report_targets;
	ao.ctx = s;
	ao.host_id = b->opts->host_id;
	ao.zone = b->opts->zone;
	ao.state = serve_publish;
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
	serve_start(s); /* the maps name the targets from here on */
	/* Per-target series are named by target id, known from here on. */
	if (maddr && (rc = stk_storage_metrics_create(s->stores, s->nstores, &s->metrics))) {
		stk_error("cannot set up target metrics: %s", strerror(-rc));
		return rc;
	}
	for (unsigned i = 0; s->metrics && s->maps && i < s->nstores; i++)
		stk_storage_metrics_serve_map(s->metrics, s->stores[i], s->maps[i]);
	if (s->metrics && (rc = settle_metrics_start(s))) {
		stk_error("cannot set up the unsettled changes' metrics: %s", strerror(-rc));
		return rc;
	}
	s->settle_metrics = s->metrics != NULL;
	for (unsigned i = 0; i < s->nstores; i++) {
		uint64_t cap = 0, used = 0, chunks = 0;
		char cb[32];

		stk_chunk_store_stat(s->stores[i], &cap, &used, &chunks);
		stk_info("target %u: %s (%llu chunks, %s)", stk_chunk_store_id(s->stores[i]),
			 stk_chunk_store_path(s->stores[i]), (unsigned long long)chunks,
			 stk_format_size(cap, cb, sizeof(cb)));
	}
	rc = pthread_create(&s->sync_thread, NULL, sync_main, s);
	if (rc) {
		stk_error("cannot start the resync thread: %s", strerror(rc));
		return -rc;
	}
	s->sync_started = 1;
	rc = pthread_create(&s->repair_thread, NULL, repair_main, s);
	if (rc) {
		stk_error("cannot start the repair thread: %s", strerror(rc));
		return -rc;
	}
	s->repair_started = 1;
	rc = pthread_create(&s->settle_thread, NULL, settle_main, s);
	if (rc) {
		stk_error("cannot start the settle thread: %s", strerror(rc));
		return -rc;
	}
	s->settle_started = 1;
	stk_info("storage node %u serving on %s%s%s", b->node_id, stk_daemon_addr(d),
		 maddr ? ", metrics on " : "", maddr ? maddr : "");
	return 0;
}

/*
 * The resync and repair threads stop before the server is destroyed: a chunk lock
 * either lets go may hand the chunk to a write waiting for it (write_on_loop),
 * which goes on through the server.
 */
static void storage_threads_stop(struct storage *s)
{
	pthread_mutex_lock(&s->repair_lock);
	__atomic_store_n(&s->sync_stop, 1, __ATOMIC_RELAXED);
	pthread_cond_broadcast(&s->repair_cv);
	pthread_mutex_unlock(&s->repair_lock);
	pthread_mutex_lock(&s->settle_lock);
	pthread_cond_broadcast(&s->settle_cv);
	pthread_mutex_unlock(&s->settle_lock);
	if (s->settle_started)
		pthread_join(s->settle_thread, NULL);
	if (s->sync_started)
		pthread_join(s->sync_thread, NULL);
	if (s->repair_started)
		pthread_join(s->repair_thread, NULL);
	s->sync_started = s->repair_started = s->settle_started = 0;
}

static void storage_stop(void *ctx)
{
	struct storage_boot *b = ctx;

	stk_qos_stop(); /* the server stopped: what was held is answered ESHUTDOWN */
	storage_threads_stop(b->s);
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
	pthread_mutex_init(&s->repair_lock, NULL);
	pthread_cond_init(&s->repair_cv, NULL);
	pthread_mutex_init(&s->settle_lock, NULL);
	pthread_cond_init(&s->settle_cv, NULL);
	pthread_mutex_init(&s->wjob_lock, NULL);
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
	pthread_mutex_init(&s->prog_lock, NULL);
	pthread_mutex_init(&s->serve_lock, NULL);
	s->resync_rate = opts->resync_rate < 0	  ? 0
			 : opts->resync_rate == 0 ? STK_STORAGE_RESYNC_RATE
						  : (uint64_t)opts->resync_rate;
	s->scrub_rate = opts->scrub_rate;
	s->scrub_interval_s = opts->scrub_interval_s;
	s->repairq = calloc(REPAIR_QUEUE, sizeof(*s->repairq));
	s->unsettled = calloc(UNSETTLED_MAX, sizeof(*s->unsettled));
	s->unsettled_max = UNSETTLED_MAX;
	if (getenv("STOKER_TEST_UNSETTLED_MAX")) {
		/* tests only: a table that fills with a few refused changes */
		uint64_t v;

		if (stk_parse_u64(getenv("STOKER_TEST_UNSETTLED_MAX"), &v) || v == 0 ||
		    v > UNSETTLED_MAX) {
			stk_error("STOKER_TEST_UNSETTLED_MAX must be 1 to %u", UNSETTLED_MAX);
			rc = -EINVAL;
			goto out;
		}
		s->unsettled_max = (unsigned)v;
		stk_warn("STOKER_TEST_UNSETTLED_MAX: at most %u unsettled changes",
			 s->unsettled_max);
	}
	if (getenv("STOKER_TEST_TAIL_DELAY_MS")) {
		/* tests only: writes admitted as a chain's tail land late (handle_write) */
		uint64_t v;

		if (stk_parse_u64(getenv("STOKER_TEST_TAIL_DELAY_MS"), &v) || v > 10000) {
			stk_error("STOKER_TEST_TAIL_DELAY_MS must be 0 to 10000");
			rc = -EINVAL;
			goto out;
		}
		s->test_tail_delay_ms = (unsigned)v;
		stk_warn("STOKER_TEST_TAIL_DELAY_MS: writes wait %u ms at a chain's tail",
			 s->test_tail_delay_ms);
	}
	if (!s->repairq || !s->unsettled) {
		rc = -ENOMEM;
		goto out;
	}
	rc = stk_pool_create(4, &s->fwd);
	if (rc)
		goto out;
	pthread_mutex_init(&s->sub_lock, NULL);
	s->sub = calloc(SUB_SLOTS, sizeof(*s->sub)); /* NULL: subtree clients get ENOMEM */
	s->moved_at = calloc(MOVED_SLOTS, sizeof(*s->moved_at)); /* NULL: meta is asked */
	s->epoch_only = getenv("STOKER_TEST_VOUCH_EPOCH_ONLY") &&
			strcmp(getenv("STOKER_TEST_VOUCH_EPOCH_ONLY"), "1") == 0;
	{
		static const char *const results[4] = {"accepted", "none", "stale", "refused"};
		static const char *const ops[2] = {"within", "epoch"};
		uint8_t key[STK_AUTH_KEY_MAX];
		size_t klen = stk_daemon_key(key);

		s->vouching = klen && stk_auth_vouch_key(key, klen, s->vouch_key) == 0;
		memset(key, 0, sizeof(key));
		for (int i = 0; i < 4; i++)
			stk_metric_series(STK_M_STORAGE_VOUCHERS, &results[i], &s->vouch_m[i]);
		for (int i = 0; i < 2; i++)
			stk_metric_series(STK_M_STORAGE_META_ASKS, &ops[i], &s->asks_m[i]);
	}
	/*
	 * Forwards wait on the event loops (write_on_loop) unless STOKER_LOOP_WRITES=0,
	 * which sends them from the workers as before (to compare, or to rule the
	 * loop path out).
	 */
	s->loop_writes =
	    !(getenv("STOKER_LOOP_WRITES") && strcmp(getenv("STOKER_LOOP_WRITES"), "0") == 0);
	rc = stk_callwatch_create(1000, node_gone, s, &s->watch);
	if (rc)
		goto out;
	rc = open_targets(s, opts);
	if (rc)
		goto out;
	serve_maps_open(s); /* before any request: see serve_maps_open */

	memset(&so, 0, sizeof(so));
	so.size = sizeof(so);
	so.listen = opts->listen;
	so.handler = storage_handle;
	so.loop_ops = &storage_loop_ops;
	so.ctx = s;
	/*
	 * Chunk reads and writes block on the disk: this many run at once. A write's
	 * forward waits on the loop (write_on_loop); a truncate's, punch's or sync's
	 * (and a write's with STOKER_LOOP_WRITES=0) waits for its successor's reply on
	 * its worker, and the successor's needs a worker of its own: were both nodes'
	 * pools all waiting on each other (each the head of chains the other ends),
	 * neither would go on. So the pool grows while workers wait
	 * (stk_server_wait_begin around each such forward), up to a bound; load alone
	 * never grows it.
	 */
	so.workers = 32;
	so.max_waiting = 256;
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
	spec.stop = storage_stop;
	rc = stk_daemon_run(&spec);
out:
	/* stk_daemon_run destroyed the server: no request uses the agent or the stores. */
	if (s) {
		storage_threads_stop(s);
		if (s->settle_metrics)
			stk_metrics_collector_remove(settle_collect, s);
		pthread_mutex_destroy(&s->repair_lock);
		pthread_cond_destroy(&s->repair_cv);
		pthread_mutex_destroy(&s->settle_lock);
		pthread_cond_destroy(&s->settle_cv);
		free(s->unsettled);
		while (s->wjob_free) {
			struct wjob *j = s->wjob_free;

			s->wjob_free = j->next_free;
			free(j);
		}
		pthread_mutex_destroy(&s->wjob_lock);
		free(s->repairq);
		stk_callwatch_destroy(s->watch); /* before the agent it asks */
		stk_storage_metrics_destroy(s->metrics);
		stk_agent_stop(s->agent);
		serve_maps_close(s); /* after the agent: nothing publishes any more */
		for (unsigned i = 0; i < s->nstores; i++)
			stk_chunk_store_close(s->stores[i]);
		free(s->stores);
		free(s->tail_busy);
		free(s->ino_locks);
		if (s->fwd)
			stk_pool_destroy(s->fwd);
		free(s->sub);
		free(s->moved_at);
	}
	free(s);
	free(b.ids);
	return rc;
}
