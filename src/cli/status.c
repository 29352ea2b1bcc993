/* `stoker status`: the routing table as an operator reads it. */
#include "cli.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "../client/client.h"
#include "../common/host.h"
#include "../common/util.h"
#include "../mgmtd/agent.h"

static const char *role_name(uint8_t r)
{
	switch (r) {
	case STK_ROLE_MGMTD:
		return "mgmtd";
	case STK_ROLE_META:
		return "meta";
	case STK_ROLE_STORAGE:
		return "storage";
	default:
		return "?";
	}
}

static const char *target_state(uint8_t s)
{
	switch (s) {
	case STK_TARGET_SERVING:
		return "serving";
	case STK_TARGET_OFFLINE:
		return "offline";
	case STK_TARGET_FULL:
		return "full";
	default:
		return "?";
	}
}

/*
 * Each shard, its meta node and its namespace, and plainly when no one serves it:
 * a shard waits for the one store that holds it (docs/architecture.md).
 */
static void print_shards(const struct stk_routing *rt)
{
	char ns[STK_NS_ID_STR];

	/* The header stays as it was: scripts and tests look for it. */
	printf("\nMetadata shards\n  %-6s %s\n", "SHARD", "META NODE");
	for (uint32_t i = 0; i < rt->nshards; i++) {
		const struct stk_rt_shard *sh = &rt->shards[i];
		const struct stk_rt_node *n = stk_routing_node(rt, sh->node_id);

		if (sh->node_id)
			printf("  %-6u %-10u", sh->id, sh->node_id);
		else
			printf("  %-6u %-10s", sh->id, "none");
		printf(" namespace %s\n",
		       stk_ns_id_is_zero(&sh->ns) ? "(not known yet)" : stk_ns_id_str(&sh->ns, ns));
		if (!n)
			printf("  ! shard %u has no meta node: the namespace is unavailable until "
			       "the meta node with its store registers again\n",
			       sh->id);
		else if (n->state != STK_NODE_ONLINE)
			printf("  ! shard %u's meta node %u (%s) is offline: the namespace is "
			       "unavailable until it returns\n",
			       sh->id, n->id, n->addr);
	}
	if (rt->nshards == 0)
		printf("  ! no meta node has registered yet: the namespace is unavailable\n");
}

/* Meta nodes mgmtd refused, and why: each serves nothing. */
static void print_refused(const struct stk_routing *rt)
{
	char mine[STK_NS_ID_STR], want[STK_NS_ID_STR];
	const struct stk_ns_id *shard_ns = rt->nshards ? &rt->shards[0].ns : NULL;
	int header = 0;

	for (uint32_t i = 0; i < rt->nnodes; i++) {
		const struct stk_rt_node *n = &rt->nodes[i];

		if (!n->refused)
			continue;
		if (!header)
			printf("\nRefused meta nodes (they serve nothing)\n");
		header = 1;
		printf("  node %u (%s, %s): refused: its store is namespace %s, not shard 1's "
		       "namespace %s\n",
		       n->id, n->addr, n->state == STK_NODE_ONLINE ? "online" : "offline",
		       stk_ns_id_str(&n->ns, mine),
		       shard_ns ? stk_ns_id_str(shard_ns, want) : "(none)");
	}
}

int cmd_status(int argc, char **argv)
{
	char addr[STK_ADDR_MAX], cap[32], used[32];
	struct stk_routing rt;
	struct stk_space sp;
	const char *cluster = NULL;
	int rc;

	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--cluster") == 0 && i + 1 < argc)
			cluster = argv[++i];
		else
			return cli_usage("status");
	}
	rc = cluster ? stk_client_parse_cluster(cluster, addr, sizeof(addr))
		     : stk_client_default_cluster(addr, sizeof(addr));
	if (rc == -ENOENT) {
		cli_err("status", "no cluster given: use --cluster stk://HOST:PORT, set "
				  "STOKER_CLUSTER, or start one with `stoker up`");
		return 1;
	}
	if (rc) {
		cli_err("status", "malformed cluster address");
		return 1;
	}
	rc = stk_mgmt_fetch_routing(addr, &rt);
	if (rc) {
		cli_err("status", "cannot reach mgmtd at %s: %s", addr, stk_strerror(rc));
		return 1;
	}
	printf("Cluster stk://%s   routing version %llu\n\n", addr,
	       (unsigned long long)rt.version);
	printf("Nodes\n  %-4s %-8s %-8s %-22s %-14s %s\n", "ID", "ROLE", "STATE", "ADDRESS",
	       "LAST SEEN", "HOST");
	for (uint32_t i = 0; i < rt.nnodes; i++) {
		const struct stk_rt_node *n = &rt.nodes[i];
		char seen[32];

		snprintf(seen, sizeof(seen), "%.1f s ago", (double)n->last_seen_ms / 1000.0);
		printf("  %-4u %-8s %-8s %-22s %-14s %s\n", n->id, role_name(n->role),
		       n->state == STK_NODE_ONLINE ? "online" : "offline", n->addr, seen,
		       n->host_id[0] ? n->host_id : "-");
	}
	printf("\nTargets\n  %-4s %-5s %-8s %11s %11s %9s  %s\n", "ID", "NODE", "STATE", "CAPACITY",
	       "USED", "CHUNKS", "PATH");
	for (uint32_t i = 0; i < rt.ntargets; i++) {
		const struct stk_rt_target *t = &rt.targets[i];
		printf("  %-4u %-5u %-8s %11s %11s %9llu  %s\n", t->id, t->node_id,
		       target_state(t->state), stk_format_size(t->capacity, cap, sizeof(cap)),
		       stk_format_size(t->used, used, sizeof(used)), (unsigned long long)t->chunks,
		       t->path);
	}
	/*
	 * Targets that share a file system each show all of it; the total counts each
	 * device once, over the whole cluster, as a mount's df does.
	 */
	if (stk_host_space_sum(rt.targets, rt.ntargets, &sp) == 0) {
		char avail[32];

		printf("  total %23s %11s   %s available on %u device%s\n",
		       stk_format_size(sp.capacity, cap, sizeof(cap)),
		       stk_format_size(sp.used, used, sizeof(used)),
		       stk_format_size(sp.avail, avail, sizeof(avail)), sp.devices,
		       sp.devices == 1 ? "" : "s");
	}
	printf("\nChains\n  %-4s %-8s %s\n", "ID", "VERSION", "TARGETS (head first)");
	for (uint32_t i = 0; i < rt.nchains; i++) {
		const struct stk_rt_chain *c = &rt.chains[i];
		printf("  %-4u %-8u", c->id, c->version);
		for (uint8_t j = 0; j < c->ntargets; j++)
			printf(" %u", c->targets[j]);
		printf("\n");
	}
	print_shards(&rt);
	print_refused(&rt);
	stk_routing_free(&rt);
	return 0;
}
