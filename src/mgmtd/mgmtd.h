/*
 * mgmtd, the cluster manager: registry of nodes and targets, heartbeats, the
 * target state machine, and the versioned routing table (chain table and metadata
 * shard map). In embedded mode its state is a file under data_dir, replaced
 * atomically (write, fsync, rename) on every change; in cluster mode (--etcd) it
 * is a key in etcd, and one of several mgmtd leads (elected through an etcd lease).
 *
 * Chains: each new storage target gets a new chain whose only target it is (chain
 * length 1, the replication factor on one machine). Chains are numbered from 1 and
 * never renumbered. A node that misses heartbeats for heartbeat_timeout_ms is
 * OFFLINE and its targets OFFLINE; the routing version is bumped on every change
 * a client or server must see.
 */
#ifndef STK_MGMTD_H
#define STK_MGMTD_H

#include <stddef.h>
#include <stdint.h>

struct stk_mgmtd_opts {
	size_t size; /* sizeof(struct stk_mgmtd_opts) */
	const char *listen; /* "HOST:PORT" */
	const char *data_dir; /* state lives in data_dir/mgmtd.state */
	unsigned heartbeat_timeout_ms; /* 0 = 10000 */
	const char *ready_file; /* if set, written with the bound address once serving */
	const char *metrics_listen; /* "HOST:PORT" for GET /metrics, or NULL for none */
	/*
	 * Targets per chain made from now on (--replicas; 0: what the state says, 1 for
	 * a new cluster). Chains already made keep their members.
	 */
	unsigned replicas;
	/*
	 * Cluster mode: etcd's endpoints ("URL[,URL...]"), or NULL for embedded mode.
	 * The state then lives in etcd under etcd_prefix (NULL: "/stoker"), not in
	 * data_dir, and several mgmtd run at once, one leading (see mgmtd.c).
	 */
	const char *etcd;
	const char *etcd_prefix;
	/*
	 * --replace-after: seconds a storage node may stay OFFLINE before each of its
	 * targets is replaced in its chain by a free one (stk_mgmt_state_replace).
	 * 0: STK_MGMTD_REPLACE_AFTER_S; below 0: never.
	 */
	int64_t replace_after_s;
	/*
	 * --rebalance-moves: chain memberships moved at once at most to even out the
	 * nodes' loads (stk_mgmt_state_rebalance). 0: STK_MGMTD_REBALANCE_MOVES; below
	 * 0: no balancing (a drain still moves one at a time).
	 */
	int rebalance_moves;
	/*
	 * --ui-interval-ms: milliseconds between the dashboard's samples of the nodes'
	 * /metrics (dash.h; it keeps STK_MGMTD_DASH_POINTS of them). 0: 10 s. The
	 * dashboard is served with the metrics, under /ui, only with metrics_listen.
	 */
	unsigned ui_interval_ms;
	/*
	 * --meta-replicas: copies of the metadata shard, its leader's included
	 * (docs/meta-replication.md; 0: what the state says, 1 for a new cluster; at
	 * most STK_MAX_REPLICAS). Taken whenever this mgmtd starts to lead.
	 */
	unsigned meta_replicas;
	/*
	 * --prometheus URL: a Prometheus server that scrapes the cluster; the
	 * dashboard's charts come from its query API (the last hour) while it answers,
	 * from mgmtd's own samples otherwise. NULL: none. Copied.
	 */
	const char *prometheus;
	/*
	 * --meta-shards: metadata shards (docs/meta-shards.md; 0: what the state says,
	 * 1 for a new cluster; at most STK_MGMT_MAX_SHARDS, 16). The count only grows:
	 * a smaller one than the state's is refused. Taken whenever this mgmtd starts
	 * to lead.
	 */
	unsigned meta_shards;
};

/*
 * By default a node is replaced after 10 minutes: long enough for a reboot or a
 * daemon upgrade to come back and catch up (a resync copies only what changed),
 * short enough that a chain does not run one copy short for long on a dead disk.
 */
#define STK_MGMTD_REPLACE_AFTER_S 600

/*
 * One move at a time by default: each copies a whole chain's chunks, at the
 * storage node's --resync-rate, beside the cluster's own traffic.
 */
#define STK_MGMTD_REBALANCE_MOVES 1

/* Serves until SIGINT/SIGTERM (see daemon/daemon.h). 0 or -errno (logged). */
int stk_mgmtd_run(const struct stk_mgmtd_opts *opts);

#endif
