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
	printf("\nMetadata shards\n  %-6s %s\n", "SHARD", "META NODE");
	for (uint32_t i = 0; i < rt.nshards; i++)
		printf("  %-6u %u\n", rt.shards[i].id, rt.shards[i].node_id);
	stk_routing_free(&rt);
	return 0;
}
