/* `stoker status`: the routing table as an operator reads it. */
#include "cli.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "stoker/stoker.h"

#include "../common/scrape.h"
#include "../common/util.h"
#include "prom.h"

/* A zero namespace identity as the refused line writes it (the snapshot gives ""). */
#define ZERO_NS "00000000000000000000000000000000"
/* Each shard's load (collect_load): the pause between two reads, and each read's limit. */
#define LOAD_WINDOW_MS 1000u
#define LOAD_SCRAPE_MS 500u
#define LOAD_SHARDS_MAX 16u /* the most shards a cluster has (docs/meta-shards.md) */

const char *cli_role_name(int r)
{
	switch (r) {
	case STK_CLUSTER_ROLE_MGMTD:
		return "mgmtd";
	case STK_CLUSTER_ROLE_META:
		return "meta";
	case STK_CLUSTER_ROLE_STORAGE:
		return "storage";
	default:
		return "?";
	}
}

static const char *target_state(int s)
{
	switch (s) {
	case STK_CLUSTER_TARGET_SERVING:
		return "serving";
	case STK_CLUSTER_TARGET_OFFLINE:
		return "offline";
	case STK_CLUSTER_TARGET_FULL:
		return "full";
	case STK_CLUSTER_TARGET_SYNCING:
		return "syncing";
	case STK_CLUSTER_TARGET_WIPING:
		return "wiping";
	default:
		return "?";
	}
}

static const struct stk_cluster_target *target_by_id(const stk_cluster_status *st, uint32_t id)
{
	const struct stk_cluster_target *t;

	for (uint32_t i = 0; (t = stk_cluster_status_target(st, i)); i++)
		if (t->id == id)
			return t;
	return NULL;
}

static const struct stk_cluster_node *node_by_id(const stk_cluster_status *st, uint32_t id)
{
	const struct stk_cluster_node *n;

	for (uint32_t i = 0; (n = stk_cluster_status_node(st, i)); i++)
		if (n->id == id)
			return n;
	return NULL;
}

static int is_follower(const struct stk_cluster_shard *sh, uint32_t id)
{
	for (uint32_t i = 0; i < sh->nfollowers; i++)
		if (sh->followers[i] == id)
			return 1;
	return 0;
}

/*
 * A replicated shard's meta nodes (docs/meta-replication.md): the leader, its
 * followers and the spares, each with the last change its store holds and, for a
 * follower, how many changes it is behind the leader as their heartbeats tell.
 */
static void print_replicas(const stk_cluster_status *st, const struct stk_cluster_shard *sh)
{
	const struct stk_cluster_node *lead = node_by_id(st, sh->node_id), *n;

	printf("    replicas %u, epoch %llu\n", sh->replicas, (unsigned long long)sh->epoch);
	printf("    %-6s %-9s %-8s %-22s %-10s %s\n", "NODE", "ROLE", "STATE", "ADDRESS", "CHANGE",
	       "BEHIND");
	for (uint32_t i = 0; (n = stk_cluster_status_node(st, i)); i++) {
		const char *role;
		char behind[24] = "";

		if (n->role != STK_CLUSTER_ROLE_META || (n->shard ? n->shard : 1) != sh->id)
			continue;
		role = n->id == sh->node_id	? "leader"
		       : is_follower(sh, n->id) ? "follower"
						: "spare";
		if (lead && n->id != sh->node_id)
			snprintf(behind, sizeof(behind), "%llu",
				 (unsigned long long)(lead->meta_seq > n->meta_seq
							  ? lead->meta_seq - n->meta_seq
							  : 0));
		printf("    %-6u %-9s %-8s %-22s %-10llu %s%s\n", n->id, role,
		       n->state == STK_CLUSTER_NODE_ONLINE ? "online" : "offline", n->addr,
		       (unsigned long long)n->meta_seq, behind,
		       !n->draining		  ? ""
		       : strcmp(role, "spare") == 0 ? "  drained: holds no copy, may be stopped"
						    : "  draining: leaves once others hold the shard");
	}
	if (sh->nfollowers + 1 < sh->replicas)
		printf("  ! shard %u has %u of its %u copies: losing its leader now may stop the "
		       "namespace until a meta node joins (start one more meta node)\n",
		       sh->id, sh->nfollowers + 1, sh->replicas);
}

/* A shard leader's figures, from its /metrics (collect_load). */
struct shard_load {
	double requests; /* stoker_rpc_requests_total, every opcode */
	double inodes;	 /* stoker_meta_inodes; < 0: not reported (an older meta) */
	int ok;
};

static void load_sample(void *ctx, const char *name, const char *labels, double v)
{
	struct shard_load *ld = ctx;

	(void)labels;
	if (strcmp(name, "stoker_rpc_requests_total") == 0)
		ld->requests += v;
	else if (strcmp(name, "stoker_meta_inodes") == 0)
		ld->inodes = v;
}

/* Reads the /metrics of meta node n (online) into *ld; ld->ok 0 if it did not answer. */
static void scrape_load(const struct stk_cluster_node *n, struct shard_load *ld)
{
	char maddr[STK_CLUSTER_ADDR_MAX + 8];
	char *body = NULL;

	memset(ld, 0, sizeof(*ld));
	ld->inodes = -1;
	if (!n || n->state != STK_CLUSTER_NODE_ONLINE ||
	    cli_metrics_addr(n->addr, maddr, sizeof(maddr)) ||
	    stk_scrape_get(maddr, "/metrics", LOAD_SCRAPE_MS, CLI_HTTP_MAX, &body))
		return;
	stk_scrape_parse(body, load_sample, ld);
	free(body);
	ld->ok = 1;
}

/*
 * With several shards, each shard's load as its leader serves it: requests a
 * second, every request counted (mounts' watches and other shards' calls too),
 * over LOAD_WINDOW_MS between two reads of every leader's /metrics (the `stoker up`
 * convention, cli_metrics_addr), and the inodes its store holds. One read of each
 * leader, a pause, one more: the whole costs LOAD_WINDOW_MS once, not per shard.
 * load[i] for the i-th shard of the snapshot; *secs the time between the reads.
 */
static void collect_load(const stk_cluster_status *st, struct shard_load *load, uint32_t max,
			 double *secs)
{
	struct shard_load first[LOAD_SHARDS_MAX];
	const struct stk_cluster_shard *sh;
	uint64_t t0, t1;
	uint32_t n = 0;

	t0 = stk_now_ns();
	for (; n < max && (sh = stk_cluster_status_shard(st, n)); n++)
		scrape_load(node_by_id(st, sh->node_id), &first[n]);
	usleep(LOAD_WINDOW_MS * 1000u);
	t1 = stk_now_ns();
	for (uint32_t i = 0; i < n; i++) {
		sh = stk_cluster_status_shard(st, i);
		scrape_load(node_by_id(st, sh->node_id), &load[i]);
		/* a counter that went back: the leader changed or restarted in between */
		if (!first[i].ok || load[i].requests < first[i].requests)
			load[i].ok = 0;
		else
			load[i].requests -= first[i].requests;
	}
	*secs = (double)(t1 - t0) / 1e9;
}

/* The load line under shard i's row (collect_load). */
static void print_load(const struct stk_cluster_shard *sh, const struct shard_load *ld,
		       double secs)
{
	char inodes[32] = "inodes not reported";

	if (!sh->node_id) {
		printf("    load: not known (no meta node serves it)\n");
		return;
	}
	if (!ld->ok) {
		printf("    load: not known (meta node %u's /metrics did not answer)\n",
		       sh->node_id);
		return;
	}
	if (ld->inodes >= 0)
		snprintf(inodes, sizeof(inodes), "%.0f inode%s", ld->inodes,
			 ld->inodes == 1 ? "" : "s");
	printf("    load: %.1f requests/s, %s\n", secs > 0 ? ld->requests / secs : 0.0, inodes);
}

/*
 * Each shard, its meta node and its namespace, and plainly when no one serves it:
 * a shard waits for the one store that holds it (docs/architecture.md). With
 * several shards, each one's load too.
 */
static void print_shards(const stk_cluster_status *st)
{
	struct shard_load load[LOAD_SHARDS_MAX];
	const struct stk_cluster_shard *sh;
	int several = stk_cluster_status_shard(st, 1) != NULL;
	double secs = 0;

	if (several)
		collect_load(st, load, LOAD_SHARDS_MAX, &secs);
	/* The header stays as it was: scripts and tests look for it. */
	printf("\nMetadata shards\n  %-6s %s\n", "SHARD", "META NODE");
	for (uint32_t i = 0; (sh = stk_cluster_status_shard(st, i)); i++) {
		const struct stk_cluster_node *n = node_by_id(st, sh->node_id);

		if (sh->node_id)
			printf("  %-6u %-10u", sh->id, sh->node_id);
		else
			printf("  %-6u %-10s", sh->id, "none");
		printf(" namespace %s\n", sh->ns[0] ? sh->ns : "(not known yet)");
		if (several && i < LOAD_SHARDS_MAX)
			print_load(sh, &load[i], secs);
		if (sh->replicas > 1)
			print_replicas(st, sh);
		if (!n)
			printf("  ! shard %u has no meta node: the namespace is unavailable until "
			       "the meta node with its store registers again\n",
			       sh->id);
		else if (n->state != STK_CLUSTER_NODE_ONLINE)
			printf("  ! shard %u's meta node %u (%s) is offline: the namespace is "
			       "unavailable until it returns\n",
			       sh->id, n->id, n->addr);
	}
	if (!stk_cluster_status_shard(st, 0))
		printf("  ! no meta node has registered yet: the namespace is unavailable\n");
}

/*
 * With several shards, where new folders go (docs/meta-shards.md, "Placement"): the
 * root's setting, which places the top-level folders; `stoker shard show PATH`
 * tells any other folder's.
 */
static void print_placement(const stk_cluster_status *st, const char *addr)
{
	char val[32], url[160];
	stk_client *c;
	ssize_t n;

	if (!stk_cluster_status_shard(st, 1))
		return; /* one shard: nothing to place */
	snprintf(url, sizeof(url), "stk://%s", addr);
	c = cli_connect("status", url);
	if (!c)
		return;
	n = stk_getxattr(c, "/", "trusted.stoker.shard", val, sizeof(val) - 1);
	if (n > 0) {
		val[n] = 0;
		printf("  placement: folders made in / go %s%s (stoker shard show PATH for others)\n",
		       strcmp(val, "spread") == 0 ? "spread over the shards" : "to shard ",
		       strcmp(val, "spread") == 0 ? "" : val);
	} else if (n == -ENODATA) {
		printf("  placement: folders stay on their parent's shard unless it is pinned "
		       "(stoker shard pin PATH N|spread)\n");
	}
}

static int working(const struct stk_cluster_target *m)
{
	return m && (m->state == STK_CLUSTER_TARGET_SERVING || m->state == STK_CLUSTER_TARGET_FULL);
}

/* The move in flight on chain id, or NULL. */
static const struct stk_cluster_move *chain_move(const stk_cluster_status *st, uint32_t id)
{
	const struct stk_cluster_move *mv;

	for (uint32_t i = 0; (mv = stk_cluster_status_move(st, i)); i++)
		if (mv->chain_id == id)
			return mv;
	return NULL;
}

/*
 * How many of chain c's members work (serving or full), and how many it needs:
 * all of them, but a move's new member, which copies beside the members it is
 * to relieve (mgmtd judges chains alike).
 */
static uint32_t chain_working(const stk_cluster_status *st, const struct stk_cluster_chain *c,
			      uint32_t *need)
{
	const struct stk_cluster_move *mv = chain_move(st, c->id);
	uint32_t n = 0;

	*need = c->ntargets;
	for (uint32_t j = 0; j < c->ntargets; j++) {
		const struct stk_cluster_target *m = target_by_id(st, c->targets[j]);

		if (mv && c->targets[j] == mv->to_target && !working(m))
			(*need)--;
		else
			n += working(m);
	}
	return n;
}

/*
 * A member as the chain table writes it: its id, and for one that serves nothing
 * now, why, with a syncing one's progress ("7(syncing:43%)": one word, so that
 * whoever splits the line on spaces gets one word per member).
 */
static void member_word(const stk_cluster_status *st, uint32_t id, char *out, size_t len)
{
	const struct stk_cluster_target *m = target_by_id(st, id);

	if (working(m))
		snprintf(out, len, "%u", id);
	else if (m && m->state == STK_CLUSTER_TARGET_SYNCING)
		snprintf(out, len, "%u(syncing:%u%%)", id, m->sync_permille / 10);
	else
		snprintf(out, len, "%u(%s)", id, m ? target_state(m->state) : "?");
}

/*
 * The chains that lack a member, first thing after the cluster's address: how
 * many, and for each the members it lacks and how far a syncing one has got. A
 * chain is degraded while some member is offline or syncing, unavailable when no
 * member works.
 */
static void print_health(const stk_cluster_status *st)
{
	const struct stk_cluster_chain *c;
	uint32_t nchains = 0, degraded = 0, unavailable = 0;

	for (uint32_t i = 0; (c = stk_cluster_status_chain(st, i)); i++) {
		uint32_t need, w = chain_working(st, c, &need);

		if (!c->ntargets)
			continue;
		nchains++;
		degraded += w > 0 && w < need;
		unavailable += w == 0;
	}
	printf("degraded chains: %u of %u, unavailable: %u\n", degraded, nchains, unavailable);
	for (uint32_t i = 0; (c = stk_cluster_status_chain(st, i)); i++) {
		uint32_t need, w = chain_working(st, c, &need);

		if (!c->ntargets || w >= need)
			continue;
		printf("  chain %u: %u of %u members working%s\n", c->id, w, need,
		       w ? "" : ": UNAVAILABLE, its files cannot be read or written");
		for (uint32_t j = 0; j < c->ntargets; j++) {
			const struct stk_cluster_target *m = target_by_id(st, c->targets[j]);
			char b[32];

			if (working(m))
				continue;
			if (!m) {
				printf("    target %u: not known\n", c->targets[j]);
			} else if (m->state == STK_CLUSTER_TARGET_SYNCING) {
				printf("    target %u (node %u) syncing: %u.%u%%, %llu chunks "
				       "compared, %llu copied (%s)\n",
				       m->id, m->node_id, m->sync_permille / 10, m->sync_permille % 10,
				       (unsigned long long)m->sync_checked,
				       (unsigned long long)m->sync_copied,
				       stk_format_size(m->sync_bytes, b, sizeof(b)));
			} else {
				printf("    target %u (node %u) %s\n", m->id, m->node_id,
				       target_state(m->state));
			}
		}
	}
}

/* How long status waits for a storage node's /metrics (unsettled changes). */
#define UNSETTLED_SCRAPE_MS 500

/* What print_unsettled reads of one node's /metrics. */
struct unsettled_seen {
	double n, oldest_s, cap;
};

static void unsettled_sample(void *ctx, const char *name, const char *labels, double v)
{
	struct unsettled_seen *u = ctx;

	(void)labels;
	if (strcmp(name, "stoker_node_unsettled_changes") == 0)
		u->n = v;
	else if (strcmp(name, "stoker_node_unsettled_oldest_seconds") == 0)
		u->oldest_s = v;
	else if (strcmp(name, "stoker_node_unsettled_capacity") == 0)
		u->cap = v;
}

/*
 * Changes storage nodes applied and their successors have not taken (a full disk,
 * a successor that refuses): read from each online storage node's /metrics (the
 * `stoker up` convention, cli_metrics_addr), printed only when a node holds some.
 * Such changes are pending (their reads go to the tail) and sent again by their
 * node until taken; a node that holds as many as it can refuses new changes.
 */
static void print_unsettled(const stk_cluster_status *st)
{
	const struct stk_cluster_node *n;

	for (uint32_t i = 0; (n = stk_cluster_status_node(st, i)); i++) {
		struct unsettled_seen u = {0};
		char maddr[STK_CLUSTER_ADDR_MAX + 8];
		char *body = NULL;

		if (n->role != STK_CLUSTER_ROLE_STORAGE || n->state != STK_CLUSTER_NODE_ONLINE ||
		    cli_metrics_addr(n->addr, maddr, sizeof(maddr)) ||
		    stk_scrape_get(maddr, "/metrics", UNSETTLED_SCRAPE_MS, CLI_HTTP_MAX, &body))
			continue;
		stk_scrape_parse(body, unsettled_sample, &u);
		free(body);
		if (u.n < 1)
			continue;
		printf("  node %u: %.0f change%s its successors have not taken, the oldest %.0f s "
		       "(pending: read from the tails, sent again until taken)%s\n",
		       n->id, u.n, u.n == 1 ? "" : "s", u.oldest_s,
		       u.cap > 0 && u.n >= u.cap ? "; FULL: new changes refused" : "");
	}
}

/*
 * The rebalancer, for a replicated cluster: the moves in flight, each with the
 * copy's progress ("chain 3: target 2 -> 9 (syncing 43.0%)"), then each storage
 * node's share of the chains, and how much a draining node has left. No line
 * starts with a number, so that whoever reads the tables above by their rows
 * reads nothing of this.
 */
static void print_rebalance(const stk_cluster_status *st)
{
	const struct stk_cluster_rebalance *rb = stk_cluster_status_rebalance(st);
	const struct stk_cluster_chain *c;
	const struct stk_cluster_move *mv;
	const struct stk_cluster_node *n;
	uint32_t nmoves = 0;
	int replicated = 0;

	for (uint32_t i = 0; (c = stk_cluster_status_chain(st, i)); i++)
		replicated |= c->ntargets > 1;
	for (uint32_t i = 0; (n = stk_cluster_status_node(st, i)); i++)
		replicated |= n->draining;
	while (stk_cluster_status_move(st, nmoves))
		nmoves++;
	if (!rb->known || (!replicated && !nmoves))
		return;
	printf("\nRebalance: %u move(s) in flight, at most %u%s; %llu finished, %llu "
	       "abandoned\n",
	       nmoves, rb->max_moves, rb->max_moves ? "" : " (balancing off; drains go on)",
	       (unsigned long long)rb->finished, (unsigned long long)rb->abandoned);
	for (uint32_t i = 0; (mv = stk_cluster_status_move(st, i)); i++) {
		const struct stk_cluster_target *t = target_by_id(st, mv->to_target);
		int syncing = t && t->state == STK_CLUSTER_TARGET_SYNCING;

		printf("  chain %u: target %u -> %u (%s %u.%u%%)%s\n", mv->chain_id,
		       mv->from_target, mv->to_target, syncing ? "syncing" : "done",
		       syncing ? t->sync_permille / 10 : 100, syncing ? t->sync_permille % 10 : 0,
		       mv->drain ? ", draining" : "");
	}
	for (uint32_t i = 0; (n = stk_cluster_status_node(st, i)); i++) {
		if (n->role != STK_CLUSTER_ROLE_STORAGE)
			continue;
		printf("  node %u: %u of %u targets in chains", n->id, n->members, n->targets);
		if (n->draining && n->members)
			printf(", draining: %u membership(s) left", n->members);
		else if (n->draining)
			printf(", drained: no membership left, may be removed");
		printf("\n");
	}
}

/* Meta nodes mgmtd refused, and why: each serves nothing. */
static void print_refused(const stk_cluster_status *st)
{
	const struct stk_cluster_shard *shard1 = stk_cluster_status_shard(st, 0);
	const struct stk_cluster_node *n;
	int header = 0;

	for (uint32_t i = 0; (n = stk_cluster_status_node(st, i)); i++) {
		if (!n->refused)
			continue;
		if (!header)
			printf("\nRefused meta nodes (they serve nothing)\n");
		header = 1;
		if (n->shard > 1) {
			printf("  node %u (%s, %s): refused for shard %u: the cluster has no "
			       "such shard, or its store (namespace %s) is not the shard's\n",
			       n->id, n->addr,
			       n->state == STK_CLUSTER_NODE_ONLINE ? "online" : "offline", n->shard,
			       n->ns[0] ? n->ns : ZERO_NS);
			continue;
		}
		printf("  node %u (%s, %s): refused: its store is namespace %s, not shard 1's "
		       "namespace %s\n",
		       n->id, n->addr, n->state == STK_CLUSTER_NODE_ONLINE ? "online" : "offline",
		       n->ns[0] ? n->ns : ZERO_NS,
		       shard1 ? (shard1->ns[0] ? shard1->ns : ZERO_NS) : "(none)");
	}
}

int cmd_status(int argc, char **argv)
{
	char addr[STK_CLUSTER_ADDR_MAX], cap[32], used[32], avail[32];
	const struct stk_cluster_space *sp;
	const struct stk_cluster_target *t;
	const struct stk_cluster_chain *c;
	const struct stk_cluster_node *n;
	stk_cluster_status *st;
	const char *cluster = NULL;
	int rc;

	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--cluster") == 0 && i + 1 < argc)
			cluster = argv[++i];
		else
			return cli_usage("status");
	}
	rc = stk_cluster_resolve(cluster, addr, sizeof(addr));
	if (rc == -ENOENT) {
		cli_err("status", "no cluster given: use --cluster stk://HOST:PORT, set "
				  "STOKER_CLUSTER, or start one with `stoker up`");
		return 1;
	}
	if (rc) {
		cli_err("status", "malformed cluster address");
		return 1;
	}
	rc = stk_cluster_status_fetch(addr, &st);
	if (rc) {
		cli_err("status", "cannot reach mgmtd at %s: %s", addr, stk_strerror(rc));
		return 1;
	}
	printf("Cluster stk://%s   routing version %llu\n", addr,
	       (unsigned long long)stk_cluster_status_version(st));
	print_health(st);
	print_unsettled(st);
	printf("\n");
	{
		const char *ma;
		int ms;

		printf("Mgmtd\n  %-22s %s\n", "ADDRESS", "STATE");
		for (unsigned i = 0; stk_cluster_status_mgmtd(st, i, &ma, &ms) == 0; i++)
			printf("  %-22s %s\n", ma,
			       ms == STK_CLUSTER_MGMTD_LEADER	  ? "leader"
			       : ms == STK_CLUSTER_MGMTD_FOLLOWER ? "follower"
								  : "down");
		printf("\n");
	}
	printf("Nodes\n  %-4s %-8s %-8s %-22s %-14s %s\n", "ID", "ROLE", "STATE", "ADDRESS",
	       "LAST SEEN", "HOST");
	for (uint32_t i = 0; (n = stk_cluster_status_node(st, i)); i++) {
		char seen[32];

		snprintf(seen, sizeof(seen), "%.1f s ago", (double)n->last_seen_ms / 1000.0);
		printf("  %-4u %-8s %-8s %-22s %-14s %s\n", n->id, cli_role_name(n->role),
		       n->state == STK_CLUSTER_NODE_ONLINE ? "online" : "offline", n->addr, seen,
		       n->host_id[0] ? n->host_id : "-");
	}
	printf("\nTargets\n  %-4s %-5s %-8s %11s %11s %9s  %s\n", "ID", "NODE", "STATE", "CAPACITY",
	       "USED", "CHUNKS", "PATH");
	for (uint32_t i = 0; (t = stk_cluster_status_target(st, i)); i++)
		printf("  %-4u %-5u %-8s %11s %11s %9llu  %s\n", t->id, t->node_id,
		       target_state(t->state), stk_format_size(t->capacity, cap, sizeof(cap)),
		       stk_format_size(t->used, used, sizeof(used)), (unsigned long long)t->chunks,
		       t->path);
	/*
	 * Targets that share a file system each show all of it; the total counts each
	 * device once, over the whole cluster, as a mount's df does.
	 */
	sp = stk_cluster_status_space(st);
	printf("  total %23s %11s   %s available on %u device%s\n",
	       stk_format_size(sp->capacity, cap, sizeof(cap)),
	       stk_format_size(sp->used, used, sizeof(used)),
	       stk_format_size(sp->avail, avail, sizeof(avail)), sp->devices,
	       sp->devices == 1 ? "" : "s");
	printf("\nChains\n  %-4s %-8s %s\n", "ID", "VERSION", "TARGETS (head first)");
	for (uint32_t i = 0; (c = stk_cluster_status_chain(st, i)); i++) {
		uint32_t need, w = chain_working(st, c, &need);

		printf("  %-4u %-8u", c->id, c->version);
		for (uint32_t j = 0; j < c->ntargets; j++) {
			char word[64];

			/* a member that serves nothing now says why */
			member_word(st, c->targets[j], word, sizeof(word));
			printf(" %s", word);
		}
		/* a healthy chain's line is only its members, as it always was */
		if (c->ntargets && w < need)
			printf("   ! %s", w ? "degraded" : "unavailable");
		printf("\n");
	}
	print_shards(st);
	print_placement(st, addr);
	print_refused(st);
	/* last: scripts that read the tables above stop at the shards */
	print_rebalance(st);
	stk_cluster_status_free(st);
	return 0;
}
