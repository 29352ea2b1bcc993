/*
 * The purger (purge.h): one thread that removes the chunks of freed files,
 * driven by the store's purge table.
 *
 * A pass reads up to STK_TRUNCATES_MAX records from a cursor, lists every (chain,
 * record) pair of their layouts, sorts them by chain and sends each chain's run as
 * one STOR_TRUNCATES to the chain's head (its first working member; the head
 * passes it down, so the acknowledgement means every member dropped the chunks).
 * Records whose chains all acknowledged are dropped from the table in one
 * transaction; the others stay for a later pass. The cursor then moves past the
 * page; at the table's end it starts again from the first record, after
 * PURGE_RETRY_MS when something failed on the way, so a chain that is down costs
 * one request a second, not a busy loop.
 *
 * The namespace's identity goes with every removal (the fence of
 * docs/architecture.md, "Namespace identity and the chunk fence"): a meta that
 * serves another store than shard 1's is refused, and its records simply wait.
 */
#include "purge.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../common/layout.h"
#include "../common/log.h"
#include "../common/util.h"
#include "../net/net.h"
#include "../proto/msg.h"
#include "../proto/wire.h"

#define PURGE_TICK_MS 200
#define PURGE_RETRY_MS 1000
#define PURGE_RATE_DEFAULT 20000u
#define PURGE_PAGE STK_TRUNCATES_MAX

struct stk_meta_purger {
	struct stk_meta_store *store;
	struct stk_agent *agent;
	stk_meta_purge_gate_fn gate; /* whether this node may send now (purge.h) */
	void *gate_ctx;
	struct stk_pool *pool; /* connections to the storage nodes */
	uint32_t rate;	       /* files a second at most */
	pthread_t thread;
	pthread_mutex_t mu; /* stop and wake */
	pthread_cond_t wake;
	int stop;
	/* Counters, read by stats from any thread (atomic). */
	uint64_t inodes, bytes, errors;
	/* The thread's own. */
	struct stk_meta_purge recs[PURGE_PAGE];
	struct pair {
		uint32_t chain_id;
		uint32_t rec; /* index in recs */
	} pairs[PURGE_PAGE * STK_MAX_STRIPE];
	uint8_t failed[PURGE_PAGE];
};

static int pair_cmp(const void *a, const void *b)
{
	const struct pair *x = a, *y = b;

	if (x->chain_id != y->chain_id)
		return x->chain_id < y->chain_id ? -1 : 1;
	return (x->rec > y->rec) - (x->rec < y->rec);
}

/* The node address of chain's head: its first member that changes reach. */
static int head_of(const struct stk_routing *rt, uint32_t chain_id, uint32_t *ver, char *addr)
{
	const struct stk_rt_chain *ch = stk_routing_chain(rt, chain_id);

	for (unsigned i = 0; ch && i < ch->ntargets; i++) {
		const struct stk_rt_target *t = stk_routing_target(rt, ch->targets[i]);
		const struct stk_rt_node *n;

		if (!t || (t->state != STK_TARGET_SERVING && t->state != STK_TARGET_FULL &&
			   t->state != STK_TARGET_SYNCING))
			continue;
		n = stk_routing_node(rt, t->node_id);
		if (!n)
			return -EAGAIN;
		*ver = ch->version;
		memcpy(addr, n->addr, STK_ADDR_MAX);
		return 0;
	}
	return -EAGAIN; /* no member serves: the records wait for one */
}

/* One STOR_TRUNCATES of n pairs (one chain) to the chain's head. 0 or -errno. */
static int send_chain(struct stk_meta_purger *p, const struct stk_routing *rt,
		      const struct stk_ns_id *ns, const struct pair *pr, uint32_t n)
{
	struct stk_msg_stor_truncates_req m = {.chain_id = pr[0].chain_id, .n = n,
					       .ns_hi = ns->hi, .ns_lo = ns->lo};
	size_t cap = 64 + (size_t)n * 24;
	uint8_t *req = malloc(cap), resp[64];
	char addr[STK_ADDR_MAX];
	struct stk_conn *c = NULL;
	struct stk_rpc rpc;
	struct stk_wbuf w;
	int rc;

	if (!req)
		return -ENOMEM;
	rc = head_of(rt, m.chain_id, &m.chain_ver, addr);
	if (rc)
		goto out;
	stk_wbuf_init(&w, req, cap);
	stk_msg_stor_truncates_req_enc(&w, &m);
	for (uint32_t i = 0; i < n; i++) {
		const struct stk_meta_purge *r = &p->recs[pr[i].rec];
		struct stk_msg_trunc_rec t = {.ino = r->ino, .size = 0,
					      .chunk_size = r->layout.chunk_size};

		stk_msg_trunc_rec_enc(&w, &t);
	}
	rc = w.err;
	if (rc)
		goto out;
	rc = stk_pool_get(p->pool, addr, &c);
	if (rc)
		goto out;
	memset(&rpc, 0, sizeof(rpc));
	stk_rpc_prepare(&rpc, STK_OP_STOR_TRUNCATES, &w, resp, sizeof(resp));
	rc = stk_rpc_call(c, &rpc);
	stk_pool_put(p->pool, c);
out:
	free(req);
	return rc;
}

/*
 * Sends the removals of recs[0..n) and drops the records of those done (from the
 * table, or with unrecorded from the store's memory: store.h). Returns how many
 * failed (they stay).
 */
static uint32_t purge_page(struct stk_meta_purger *p, size_t n, int unrecorded)
{
	uint32_t chains[STK_MAX_STRIPE], npairs = 0, nfailed = 0, ndone = 0;
	uint64_t done[PURGE_PAGE], bytes = 0;
	struct stk_routing_ref *ref;
	struct stk_ns_id ns;
	int stale = 0;

	memset(p->failed, 0, n);
	for (size_t i = 0; i < n; i++) {
		if (stk_layout_check(&p->recs[i].layout)) {
			/* Nothing can be sent for it; fsck reports its chunks as garbage. */
			stk_warn("purge of inode %llu: corrupt layout, its chunks are left to fsck",
				 (unsigned long long)p->recs[i].ino);
			continue;
		}
		stk_layout_chains(&p->recs[i].layout, chains);
		for (uint32_t k = 0; k < p->recs[i].layout.stripe; k++)
			p->pairs[npairs++] = (struct pair){.chain_id = chains[k], .rec = (uint32_t)i};
	}
	qsort(p->pairs, npairs, sizeof(p->pairs[0]), pair_cmp);
	stk_meta_store_ns_id(p->store, &ns);
	ref = stk_agent_routing_get(p->agent);
	for (uint32_t i = 0, j; i < npairs; i = j) {
		int rc;

		for (j = i + 1; j < npairs && p->pairs[j].chain_id == p->pairs[i].chain_id; j++)
			;
		rc = send_chain(p, &ref->rt, &ns, &p->pairs[i], j - i);
		if (rc == 0)
			continue;
		stk_debug("purge: chain %u: %s; retried later", p->pairs[i].chain_id,
			  strerror(-rc));
		__atomic_add_fetch(&p->errors, 1, __ATOMIC_RELAXED);
		stale |= rc == -ESTALE || rc == -EAGAIN;
		for (uint32_t k = i; k < j; k++)
			p->failed[p->pairs[k].rec] = 1;
	}
	stk_agent_routing_put(p->agent, ref);
	if (stale)
		stk_agent_routing_refresh(p->agent);
	for (size_t i = 0; i < n; i++) {
		if (p->failed[i]) {
			nfailed++;
			continue;
		}
		done[ndone++] = p->recs[i].ino;
		bytes += p->recs[i].size;
	}
	if (unrecorded) {
		stk_meta_store_unrecorded_done(p->store, n, p->failed);
		__atomic_add_fetch(&p->inodes, ndone, __ATOMIC_RELAXED);
		__atomic_add_fetch(&p->bytes, bytes, __ATOMIC_RELAXED);
	} else if (ndone && stk_meta_store_purge_done(p->store, done, ndone) == 0) {
		__atomic_add_fetch(&p->inodes, ndone, __ATOMIC_RELAXED);
		__atomic_add_fetch(&p->bytes, bytes, __ATOMIC_RELAXED);
		stk_debug("purge: the chunks of %u file(s) removed", ndone);
	}
	return nfailed;
}

/* Waits ms, or less when stopped. With p->mu held. */
static void wait_ms(struct stk_meta_purger *p, uint64_t ms)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	ts.tv_sec += (time_t)(ms / 1000);
	ts.tv_nsec += (long)(ms % 1000) * 1000000L;
	if (ts.tv_nsec >= 1000000000L) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000L;
	}
	if (!p->stop)
		pthread_cond_timedwait(&p->wake, &p->mu, &ts);
}

static int gate_open(struct stk_meta_purger *p)
{
	return !p->gate || p->gate(p->gate_ctx);
}

static void *purger_main(void *arg)
{
	struct stk_meta_purger *p = arg;
	uint64_t from = 0;
	uint32_t failed = 0; /* in this round over the table */

	pthread_mutex_lock(&p->mu);
	while (!p->stop) {
		uint64_t t0 = stk_now_ns(), spent_ms, due_ms;
		size_t n = 0;

		pthread_mutex_unlock(&p->mu);
		/* A round begins with the purges a full map kept in memory (store.h). */
		if (from == 0) {
			n = stk_meta_store_purges_unrecorded(p->store, p->recs, PURGE_PAGE);
			if (n && !gate_open(p))
				goto closed;
			if (n)
				failed += purge_page(p, n, 1);
		}
		if (stk_meta_store_purges(p->store, from, p->recs, PURGE_PAGE, &n))
			n = 0;
		/* read first, then the gate: it vouches for what was read */
		if (n && !gate_open(p))
			goto closed;
		if (n)
			failed += purge_page(p, n, 0);
		pthread_mutex_lock(&p->mu);
		if (n == PURGE_PAGE) {
			/* More follow: go on at once, within the rate. */
			from = p->recs[n - 1].ino + 1;
			spent_ms = (stk_now_ns() - t0) / 1000000ull;
			due_ms = (uint64_t)n * 1000u / p->rate;
			if (due_ms > spent_ms)
				wait_ms(p, due_ms - spent_ms);
			continue;
		}
		/* The table's end: from its start again, after a pause. */
		wait_ms(p, from == 0 && !failed ? PURGE_TICK_MS
						: (failed ? PURGE_RETRY_MS : 0));
		from = 0;
		failed = 0;
		continue;
closed:
		/* Not to send now (a follower): from the start again, later. */
		pthread_mutex_lock(&p->mu);
		wait_ms(p, PURGE_RETRY_MS);
		from = 0;
		failed = 0;
	}
	pthread_mutex_unlock(&p->mu);
	return NULL;
}

int stk_meta_purger_start(struct stk_meta_store *st, struct stk_agent *agent,
			  stk_meta_purge_gate_fn gate, void *gate_ctx,
			  struct stk_meta_purger **out)
{
	const char *env = getenv("STOKER_PURGE_RATE");
	struct stk_meta_purger *p;
	pthread_condattr_t ca;
	uint64_t v;
	int rc;

	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->store = st;
	p->agent = agent;
	p->gate = gate;
	p->gate_ctx = gate_ctx;
	p->rate = PURGE_RATE_DEFAULT;
	if (env) {
		if (stk_parse_u64(env, &v) == 0 && v >= 1 && v <= 10000000)
			p->rate = (uint32_t)v;
		else
			stk_warn("ignoring STOKER_PURGE_RATE=%s (1 to 10000000 files a second)",
				 env);
	}
	rc = stk_pool_create(1, &p->pool);
	if (rc) {
		free(p);
		return rc;
	}
	pthread_mutex_init(&p->mu, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&p->wake, &ca);
	pthread_condattr_destroy(&ca);
	rc = -pthread_create(&p->thread, NULL, purger_main, p);
	if (rc) {
		pthread_cond_destroy(&p->wake);
		pthread_mutex_destroy(&p->mu);
		stk_pool_destroy(p->pool);
		free(p);
		return rc;
	}
	*out = p;
	return 0;
}

void stk_meta_purger_destroy(struct stk_meta_purger *p)
{
	if (!p)
		return;
	pthread_mutex_lock(&p->mu);
	p->stop = 1;
	pthread_cond_signal(&p->wake);
	pthread_mutex_unlock(&p->mu);
	pthread_join(p->thread, NULL);
	pthread_cond_destroy(&p->wake);
	pthread_mutex_destroy(&p->mu);
	stk_pool_destroy(p->pool);
	free(p);
}

void stk_meta_purger_stats(struct stk_meta_purger *p, struct stk_meta_purge_stats *out)
{
	out->inodes = __atomic_load_n(&p->inodes, __ATOMIC_RELAXED);
	out->bytes = __atomic_load_n(&p->bytes, __ATOMIC_RELAXED);
	out->errors = __atomic_load_n(&p->errors, __ATOMIC_RELAXED);
}
