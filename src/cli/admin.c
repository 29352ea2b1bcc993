/*
 * `stoker admin`: cluster administration. `admin init --key FILE` makes a cluster
 * key (docs/security.md): 32 random bytes as hex, mode 0600, never over an existing
 * file. Give it to every daemon with --key-file FILE and to clients with
 * --key-file / $STOKER_KEY_FILE (`stoker up` makes DATA/cluster.key itself).
 * `admin remove-node ID` gives up on an offline storage node now: mgmtd replaces
 * each of its targets in its chain (docs/architecture.md, "Replication").
 * `admin drain-node ID` moves an online node's chain memberships to other nodes
 * in the background, every chain keeping its copies throughout; `undrain-node ID`
 * cancels it. Once `stoker status` shows it with no membership left, remove-node
 * drops it though it runs. `admin accept-loss CHAIN` lets a chain whose every
 * copy was lost, and whose newest copy is gone for good, serve again from the
 * member that is back (changes only the lost ones held are given up).
 */
#include "cli.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "../common/auth.h"
#include "../common/util.h"

static int remove_node(int argc, char **argv)
{
	const char *cluster = NULL;
	uint64_t id = 0;
	uint32_t replaced = 0, kept = 0;
	int rc, have = 0;

	for (int i = 2; i < argc; i++) {
		if (strcmp(argv[i], "--cluster") == 0 && i + 1 < argc) {
			cluster = argv[++i];
		} else if (!have && stk_parse_u64(argv[i], &id) == 0 && id && id <= UINT32_MAX) {
			have = 1;
		} else {
			cli_err("admin", "remove-node: unexpected argument '%s'", argv[i]);
			return cli_usage("admin");
		}
	}
	if (!have) {
		cli_err("admin", "remove-node needs a storage node's id (`stoker status`, Nodes)");
		return cli_usage("admin");
	}
	rc = stk_cluster_remove_node(cluster, (uint32_t)id, &replaced, &kept);
	if (rc == -ENOENT) {
		cli_err("admin", "remove-node: the cluster has no storage node %llu",
			(unsigned long long)id);
		return 1;
	}
	if (rc == -EBUSY) {
		cli_err("admin", "remove-node: node %llu is online: stop it first (its targets are "
				 "replaced only once it is gone), or drain it first (`stoker admin "
				 "drain-node %llu`) and wait until it holds no chain membership",
			(unsigned long long)id, (unsigned long long)id);
		return 1;
	}
	if (rc) {
		cli_err("admin", "remove-node: %s", stk_strerror(rc));
		return 1;
	}
	printf("node %llu: %u target(s) replaced in their chains (the new ones copy the chain's "
	       "chunks: `stoker status` shows them syncing)",
	       (unsigned long long)id, replaced);
	if (kept)
		printf("; %u kept: no free target of another failure domain, or no working "
		       "member to copy from",
		       kept);
	printf("\n");
	return kept ? 1 : 0;
}

/* `admin drain-node ID` (drain 1) and `admin undrain-node ID` (drain 0). */
static int drain_node(int argc, char **argv, int drain)
{
	const char *cluster = NULL, *what = drain ? "drain-node" : "undrain-node";
	uint64_t id = 0;
	uint32_t members = 0;
	int rc, have = 0;

	for (int i = 2; i < argc; i++) {
		if (strcmp(argv[i], "--cluster") == 0 && i + 1 < argc) {
			cluster = argv[++i];
		} else if (!have && stk_parse_u64(argv[i], &id) == 0 && id && id <= UINT32_MAX) {
			have = 1;
		} else {
			cli_err("admin", "%s: unexpected argument '%s'", what, argv[i]);
			return cli_usage("admin");
		}
	}
	if (!have) {
		cli_err("admin", "%s needs a storage node's id (`stoker status`, Nodes)", what);
		return cli_usage("admin");
	}
	rc = stk_cluster_drain_node(cluster, (uint32_t)id, drain, &members);
	if (rc == -ENOENT) {
		cli_err("admin", "%s: the cluster has no storage node %llu", what,
			(unsigned long long)id);
		return 1;
	}
	if (rc) {
		cli_err("admin", "%s: %s", what, stk_strerror(rc));
		return 1;
	}
	if (!drain)
		printf("node %llu: no longer draining (%u chain membership(s); moves in flight "
		       "were abandoned)\n",
		       (unsigned long long)id, members);
	else if (members)
		printf("node %llu: draining, %u chain membership(s) left to move (`stoker status` "
		       "shows them go; then `stoker admin remove-node %llu`)\n",
		       (unsigned long long)id, members, (unsigned long long)id);
	else
		printf("node %llu: drained, no chain membership left: `stoker admin remove-node "
		       "%llu`, then stop it\n",
		       (unsigned long long)id, (unsigned long long)id);
	return 0;
}

/* `admin accept-loss CHAIN`: the chain serves again from the copy that is back. */
static int accept_loss(int argc, char **argv)
{
	const char *cluster = NULL;
	uint64_t id = 0;
	uint32_t kept = 0, dropped = 0, added = 0;
	int rc, have = 0, sure = 0;

	for (int i = 2; i < argc; i++) {
		if (strcmp(argv[i], "--cluster") == 0 && i + 1 < argc) {
			cluster = argv[++i];
		} else if (strcmp(argv[i], "--yes-lose-data") == 0) {
			sure = 1;
		} else if (!have && stk_parse_u64(argv[i], &id) == 0 && id && id <= UINT32_MAX) {
			have = 1;
		} else {
			cli_err("admin", "accept-loss: unexpected argument '%s'", argv[i]);
			return cli_usage("admin");
		}
	}
	if (!have) {
		cli_err("admin", "accept-loss needs a chain's id (`stoker status`, Chains)");
		return cli_usage("admin");
	}
	if (!sure) {
		cli_err("admin",
			"accept-loss gives up chain %llu's newest copy for good: changes only it "
			"held are lost, and the chunks it alone had read back as holes (zeros) "
			"or as they were before. Bring its node back if you can; if not, say "
			"--yes-lose-data",
			(unsigned long long)id);
		return 2;
	}
	rc = stk_cluster_accept_loss(cluster, (uint32_t)id, &kept, &dropped, &added);
	switch (rc) {
	case 0:
		break;
	case -ENOENT:
		cli_err("admin", "accept-loss: the cluster has no chain %llu", (unsigned long long)id);
		return 1;
	case -EINVAL:
		cli_err("admin", "accept-loss: chain %llu has one target: no other copy to serve "
				 "from",
			(unsigned long long)id);
		return 1;
	case -EBUSY:
		cli_err("admin", "accept-loss: chain %llu has a working member: nothing is lost",
			(unsigned long long)id);
		return 1;
	case -EAGAIN:
		cli_err("admin", "accept-loss: no member of chain %llu is back: start one of its "
				 "nodes, then ask again",
			(unsigned long long)id);
		return 1;
	default:
		cli_err("admin", "accept-loss: %s", stk_strerror(rc));
		return 1;
	}
	printf("chain %llu: target %u serves what it holds; %u member(s) gave up their copies "
	       "(changes only they held are gone), %u spare(s) joined to copy it\n",
	       (unsigned long long)id, kept, dropped, added);
	return 0;
}

int cmd_admin(int argc, char **argv)
{
	const char *key = NULL;
	int rc;

	if (argc >= 2 && strcmp(argv[1], "remove-node") == 0)
		return remove_node(argc, argv);
	if (argc >= 2 && strcmp(argv[1], "drain-node") == 0)
		return drain_node(argc, argv, 1);
	if (argc >= 2 && strcmp(argv[1], "undrain-node") == 0)
		return drain_node(argc, argv, 0);
	if (argc >= 2 && strcmp(argv[1], "accept-loss") == 0)
		return accept_loss(argc, argv);
	if (argc < 2 || strcmp(argv[1], "init") != 0)
		return cli_usage("admin");
	for (int i = 2; i < argc; i++) {
		if (strcmp(argv[i], "--key") == 0 && i + 1 < argc) {
			key = argv[++i];
		} else {
			cli_err("admin", "unexpected argument '%s'", argv[i]);
			return cli_usage("admin");
		}
	}
	if (!key) {
		cli_err("admin", "init needs --key FILE");
		return cli_usage("admin");
	}
	rc = stk_auth_key_create(key);
	if (rc == -EEXIST) {
		cli_err("admin", "%s exists: a cluster's key is never overwritten (remove it first "
				 "if that is what you mean)",
			key);
		return 1;
	}
	if (rc) {
		cli_err("admin", "cannot create %s: %s", key, strerror(-rc));
		return 1;
	}
	printf("cluster key written to %s (mode 0600): give it to every daemon with --key-file "
	       "and to clients with --key-file or STOKER_KEY_FILE\n",
	       key);
	return 0;
}
