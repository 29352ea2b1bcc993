/*
 * `stoker up` / `stoker down` and the role commands.
 *
 * `up` is a small supervisor: it starts mgmtd, meta and storage as child processes
 * of this same binary (so every node talks to every other over TCP, as on real
 * hosts), waits until the cluster serves (a storage node with all its targets in
 * the chain table and a meta node owning the shard map), records the cluster's
 * address for the data commands, and then restarts any daemon that dies until it
 * is told to stop. With --daemon it detaches and reports readiness to the shell
 * that started it through a pipe.
 *
 * Layout of DIR: mgmtd/ (cluster state), meta/ (LMDB), storage/ (node id),
 * targets/0..N-1 (chunks), log/ROLE.log, up.pid, cluster (the mgmtd address),
 * cluster.key (the cluster key, made on the first start, mode 0600: every daemon is
 * given it with --key-file, and /tmp/stoker-UID/keys/ADDR names it for clients of
 * each mgmtd address; docs/security.md).
 */
#include "cli.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <arpa/inet.h>
#include <time.h>
#include <unistd.h>

#include "../common/host.h"
#include "../common/log.h"
#include "../common/util.h"
#include "../common/auth.h"
#include "../daemon/daemon.h"
#include "../meta/meta.h"
#include "../mgmtd/agent.h"
#include "../mgmtd/mgmtd.h"
#include "../storage/storage.h"

/* ---- role commands ---- */

/* Applies --config FILE (anywhere in argv) by splicing its settings in front. */
static int apply_config(const char *cmd, int *argc, char ***argv)
{
	for (int i = 1; i < *argc; i++) {
		if (strcmp((*argv)[i], "--config") == 0 && i + 1 < *argc) {
			const char *file = (*argv)[i + 1];
			int rc;
			/* remove the two words, then splice the file in */
			for (int j = i; j + 2 <= *argc; j++)
				(*argv)[j] = (*argv)[j + 2];
			*argc -= 2;
			rc = cli_config_args(file, argc, argv);
			if (rc) {
				cli_err(cmd, "cannot read config %s: %s", file, stk_strerror(rc));
				return rc;
			}
			return 0;
		}
	}
	return 0;
}

enum {
	OPT_LISTEN = 1000,
	OPT_MGMTD,
	OPT_DATA,
	OPT_TARGET,
	OPT_CHUNK,
	OPT_STRIPE,
	OPT_HBTO,
	OPT_METRICS,
	OPT_HOST_ID,
	OPT_REPLICAS,
	OPT_META_REPLICAS,
	OPT_ZONE,
	OPT_ETCD,
	OPT_ETCD_PREFIX,
	OPT_SCRUB_RATE,
	OPT_SCRUB_INTERVAL,
	OPT_RESYNC_RATE,
	OPT_REPLACE_AFTER,
	OPT_REBALANCE_MOVES,
	OPT_UI_INTERVAL,
	OPT_PROMETHEUS,
	OPT_KEY_FILE,
	OPT_AUTH,
	OPT_TLS,
	OPT_META_SHARDS,
	OPT_SHARD,
};

static const struct option role_opts[] = {
	{"listen", required_argument, NULL, OPT_LISTEN},
	{"mgmtd", required_argument, NULL, OPT_MGMTD},
	{"data", required_argument, NULL, OPT_DATA},
	{"target", required_argument, NULL, OPT_TARGET},
	{"chunk-size", required_argument, NULL, OPT_CHUNK},
	{"stripe", required_argument, NULL, OPT_STRIPE},
	{"heartbeat-timeout-ms", required_argument, NULL, OPT_HBTO},
	{"metrics", required_argument, NULL, OPT_METRICS},
	{"host-id", required_argument, NULL, OPT_HOST_ID},
	{"replicas", required_argument, NULL, OPT_REPLICAS},
	{"meta-replicas", required_argument, NULL, OPT_META_REPLICAS},
	{"meta_replicas", required_argument, NULL, OPT_META_REPLICAS}, /* a config file's */
	{"zone", required_argument, NULL, OPT_ZONE},
	{"etcd", required_argument, NULL, OPT_ETCD},
	{"etcd-prefix", required_argument, NULL, OPT_ETCD_PREFIX},
	{"scrub-rate", required_argument, NULL, OPT_SCRUB_RATE},
	{"scrub-interval", required_argument, NULL, OPT_SCRUB_INTERVAL},
	{"resync-rate", required_argument, NULL, OPT_RESYNC_RATE},
	{"replace-after", required_argument, NULL, OPT_REPLACE_AFTER},
	{"rebalance-moves", required_argument, NULL, OPT_REBALANCE_MOVES},
	{"ui-interval-ms", required_argument, NULL, OPT_UI_INTERVAL},
	{"prometheus", required_argument, NULL, OPT_PROMETHEUS},
	{"key-file", required_argument, NULL, OPT_KEY_FILE},
	{"key_file", required_argument, NULL, OPT_KEY_FILE}, /* as a config file spells it */
	{"auth", required_argument, NULL, OPT_AUTH},
	{"tls", required_argument, NULL, OPT_TLS},
	{"meta-shards", required_argument, NULL, OPT_META_SHARDS},
	{"meta_shards", required_argument, NULL, OPT_META_SHARDS}, /* a config file's */
	{"shard", required_argument, NULL, OPT_SHARD},
	{NULL, 0, NULL, 0},
};

struct role_args {
	const char *listen, *mgmtd, *data;
	const char *metrics; /* --metrics ADDR: serve /metrics there */
	const char *host_id; /* --host-id ID: the host this node says it is on */
	const char *zone; /* --zone Z: a storage node's failure domain (default: its host) */
	const char *etcd; /* mgmtd --etcd URL[,URL...]: cluster mode, state in etcd */
	const char *etcd_prefix; /* mgmtd --etcd-prefix P: its keys' prefix (/stoker) */
	const char *targets[64];
	unsigned ntargets;
	uint64_t chunk_size, stripe, hbto;
	uint64_t replicas; /* mgmtd --replicas R: targets per new chain */
	uint64_t meta_replicas; /* mgmtd --meta-replicas R: copies of the metadata shard */
	uint64_t meta_shards;	/* mgmtd --meta-shards S: metadata shards (meta-shards.md) */
	uint64_t shard;		/* meta --shard K: the metadata shard it serves (1..S) */
	/* storage --scrub-rate SIZE (a second; 0: off), --scrub-interval SECONDS */
	uint64_t scrub_rate, scrub_interval;
	int scrub_rate_set, scrub_interval_set;
	/* storage --resync-rate MB/s: as stk_storage_opts.resync_rate (0 default, <0 none) */
	int64_t resync_rate;
	/* mgmtd --replace-after SECONDS: as stk_mgmtd_opts.replace_after_s (0: never) */
	int64_t replace_after;
	/* mgmtd --rebalance-moves N: as stk_mgmtd_opts.rebalance_moves (0: off) */
	int rebalance_moves;
	/* mgmtd --ui-interval-ms MS: as stk_mgmtd_opts.ui_interval_ms (0: 10 s) */
	uint64_t ui_interval_ms;
	/* mgmtd --prometheus URL: the dashboard's charts from there (docs/dashboard.md) */
	const char *prometheus;
	const char *key_file; /* --key-file PATH: the cluster key (docs/security.md) */
	int auth_off; /* --auth off: no key, said so on purpose */
	int tls; /* --tls on: TLS on every connection (docs/security.md) */
};

/*
 * The cluster key of a role (docs/security.md): --key-file loads it, --auth off
 * runs without one on purpose; neither runs without one, and says what that means
 * (a daemon started by hand or from an old config keeps working as before; `stoker
 * up` always passes a key).
 */
static int role_auth(const char *cmd, const struct role_args *a)
{
	char err[512];
	int rc;

	if (a->key_file && a->auth_off) {
		cli_err(cmd, "--key-file and --auth off contradict each other: pick one");
		return 2;
	}
	if (!a->key_file && a->tls) {
		cli_err(cmd, "--tls on needs the cluster key: its handshake is keyed by it (pass "
			     "--key-file FILE)");
		return 2;
	}
	if (!a->key_file) {
		if (!a->auth_off)
			fprintf(stderr,
				"stoker %s: no --key-file: any process that reaches this daemon "
				"is trusted (pass --key-file FILE, made by `stoker admin init "
				"--key FILE`; --auth off says this is meant)\n",
				cmd);
		return 0;
	}
	rc = stk_daemon_auth(a->key_file, err, sizeof(err));
	if (rc == 0)
		rc = stk_daemon_tls(a->tls, err, sizeof(err));
	if (rc) {
		cli_err(cmd, "%s", err);
		return 2;
	}
	return 0;
}

/*
 * A rate option (--scrub-rate, --resync-rate): a size a second, "256M" (binary
 * units, as every size Stoker takes), 0 for none. A bare number is bytes, and one
 * under 1024 is refused: a byte rate that low is a unit left out (--resync-rate
 * once took MB/s), and would stall what it throttles. 0, or 2 after saying why.
 */
static int parse_rate(const char *cmd, const char *name, const char *val, uint64_t *out)
{
	if (stk_parse_size(val, out) == 0 && (*out == 0 || *out >= 1024))
		return 0;
	cli_err(cmd, "bad --%s '%s': a size a second with its unit (256M, 1G), 0 for none",
		name, val);
	return 2;
}

/*
 * Takes one option c of a role (role_opts) with its value val into a. 0, or 2
 * after saying what is wrong with it; -1 for an option that is not a role's.
 * `stoker up` checks with it the options it passes on to its roles.
 */
static int role_opt(const char *cmd, int c, char *val, struct role_args *a)
{
	switch (c) {
	case OPT_LISTEN:
		a->listen = val;
		break;
	case OPT_MGMTD:
		a->mgmtd = val;
		break;
	case OPT_DATA:
		a->data = val;
		break;
	case OPT_TARGET:
		if (a->ntargets >= STK_ARRAY_SIZE(a->targets)) {
			cli_err(cmd, "at most %zu targets", STK_ARRAY_SIZE(a->targets));
			return 2;
		}
		a->targets[a->ntargets++] = val;
		break;
	case OPT_CHUNK:
		if (stk_parse_size(val, &a->chunk_size)) {
			cli_err(cmd, "bad --chunk-size '%s'", val);
			return 2;
		}
		break;
	case OPT_STRIPE:
		if (stk_parse_u64(val, &a->stripe) || a->stripe > 256) {
			cli_err(cmd, "bad --stripe '%s'", val);
			return 2;
		}
		break;
	case OPT_METRICS:
		a->metrics = val;
		break;
	case OPT_HOST_ID: {
		char id[STK_HOST_ID_MAX];

		if (!*val || stk_host_id(val, id, sizeof(id))) {
			cli_err(cmd,
				"bad --host-id '%s': 1 to %d printable characters, no spaces",
				val, STK_HOST_ID_MAX - 1);
			return 2;
		}
		a->host_id = val;
		break;
	}
	case OPT_REPLICAS:
		if (stk_parse_u64(val, &a->replicas) || a->replicas < 1 ||
		    a->replicas > STK_MAX_REPLICAS) {
			cli_err(cmd, "bad --replicas '%s': 1 to %d", val, STK_MAX_REPLICAS);
			return 2;
		}
		break;
	case OPT_META_REPLICAS:
		if (stk_parse_u64(val, &a->meta_replicas) || a->meta_replicas < 1 ||
		    a->meta_replicas > STK_MAX_REPLICAS) {
			cli_err(cmd, "bad --meta-replicas '%s': 1 to %d", val, STK_MAX_REPLICAS);
			return 2;
		}
		break;
	case OPT_META_SHARDS:
		if (stk_parse_u64(val, &a->meta_shards) || a->meta_shards < 1 ||
		    a->meta_shards > STK_MAX_SHARDS) {
			cli_err(cmd, "bad --meta-shards '%s': 1 to %d", val, STK_MAX_SHARDS);
			return 2;
		}
		break;
	case OPT_SHARD:
		if (stk_parse_u64(val, &a->shard) || a->shard < 1 || a->shard > STK_MAX_SHARDS) {
			cli_err(cmd, "bad --shard '%s': 1 to %d", val, STK_MAX_SHARDS);
			return 2;
		}
		break;
	case OPT_ZONE: {
		char id[STK_HOST_ID_MAX];

		if (!*val || stk_host_id(val, id, sizeof(id))) {
			cli_err(cmd, "bad --zone '%s': 1 to %d printable characters, no spaces",
				val, STK_HOST_ID_MAX - 1);
			return 2;
		}
		a->zone = val;
		break;
	}
	case OPT_ETCD:
		a->etcd = val;
		break;
	case OPT_ETCD_PREFIX:
		a->etcd_prefix = val;
		break;
	case OPT_SCRUB_RATE:
		if (parse_rate(cmd, "scrub-rate", val, &a->scrub_rate))
			return 2;
		a->scrub_rate_set = 1;
		break;
	case OPT_SCRUB_INTERVAL:
		if (stk_parse_u64(val, &a->scrub_interval) || a->scrub_interval == 0 ||
		    a->scrub_interval > 10u * 365 * 86400) {
			cli_err(cmd, "bad --scrub-interval '%s': seconds, at least 1", val);
			return 2;
		}
		a->scrub_interval_set = 1;
		break;
	case OPT_REPLACE_AFTER: {
		uint64_t secs;

		if (stk_parse_u64(val, &secs) || secs > 10u * 365 * 86400) {
			cli_err(cmd, "bad --replace-after '%s': seconds, 0 for never", val);
			return 2;
		}
		a->replace_after = secs ? (int64_t)secs : -1;
		break;
	}
	case OPT_REBALANCE_MOVES: {
		uint64_t n;

		if (stk_parse_u64(val, &n) || n > 1024) {
			cli_err(cmd, "bad --rebalance-moves '%s': 0 (off) to 1024", val);
			return 2;
		}
		a->rebalance_moves = n ? (int)n : -1;
		break;
	}
	case OPT_RESYNC_RATE: {
		uint64_t rate;

		if (parse_rate(cmd, "resync-rate", val, &rate))
			return 2;
		a->resync_rate = rate ? (int64_t)rate : -1;
		break;
	}
	case OPT_KEY_FILE:
		a->key_file = val;
		break;
	case OPT_AUTH:
		if (strcmp(val, "off") == 0) {
			a->auth_off = 1;
		} else if (strcmp(val, "on") == 0) {
			a->auth_off = 0;
		} else {
			cli_err(cmd, "bad --auth '%s': on or off", val);
			return 2;
		}
		break;
	case OPT_TLS:
		if (strcmp(val, "on") == 0) {
			a->tls = 1;
		} else if (strcmp(val, "off") == 0) {
			a->tls = 0;
		} else {
			cli_err(cmd, "bad --tls '%s': on or off", val);
			return 2;
		}
		break;
	case OPT_UI_INTERVAL:
		if (stk_parse_u64(val, &a->ui_interval_ms) || a->ui_interval_ms < 100 ||
		    a->ui_interval_ms > 3600000) {
			cli_err(cmd, "bad --ui-interval-ms '%s': 100 to 3600000", val);
			return 2;
		}
		break;
	case OPT_PROMETHEUS: {
		size_t n = strlen(val);

		if ((strncmp(val, "http://", 7) != 0 && strncmp(val, "https://", 8) != 0) ||
		    n < 9 || n > 400 || strpbrk(val, " \t\r\n?#")) {
			cli_err(cmd,
				"bad --prometheus '%s': the URL of a Prometheus server, "
				"http://HOST:PORT[/PATH], without a query",
				val);
			return 2;
		}
		a->prometheus = val;
		break;
	}
	case OPT_HBTO:
		if (stk_parse_u64(val, &a->hbto) || a->hbto > 3600000) {
			cli_err(cmd, "bad --heartbeat-timeout-ms '%s'", val);
			return 2;
		}
		break;
	default:
		return -1;
	}
	return 0;
}

static int parse_role(const char *cmd, int argc, char **argv, struct role_args *a)
{
	int c, rc;

	if (apply_config(cmd, &argc, &argv))
		return 2;
	optind = 1;
	while ((c = getopt_long(argc, argv, "", role_opts, NULL)) != -1) {
		rc = role_opt(cmd, c, optarg, a);
		if (rc < 0)
			return cli_usage(cmd);
		if (rc)
			return rc;
	}
	if (optind < argc) {
		cli_err(cmd, "unexpected argument '%s'", argv[optind]);
		return cli_usage(cmd);
	}
	if (!a->data) {
		cli_err(cmd, "--data DIR is required");
		return cli_usage(cmd);
	}
	if (!a->mgmtd)
		a->mgmtd = "127.0.0.1:9400";
	return role_auth(cmd, a);
}

int cmd_mgmtd(int argc, char **argv)
{
	struct role_args a = {0};
	struct stk_mgmtd_opts o = {.size = sizeof(o)};
	int rc = parse_role("mgmtd", argc, argv, &a);

	if (rc)
		return rc;
	o.listen = a.listen ? a.listen : "127.0.0.1:9400";
	o.data_dir = a.data;
	o.heartbeat_timeout_ms = (unsigned)a.hbto;
	o.metrics_listen = a.metrics;
	o.replicas = (unsigned)a.replicas;
	o.meta_replicas = (unsigned)a.meta_replicas;
	o.meta_shards = (unsigned)a.meta_shards;
	o.etcd = a.etcd;
	o.etcd_prefix = a.etcd_prefix;
	o.replace_after_s = a.replace_after;
	o.rebalance_moves = a.rebalance_moves;
	o.ui_interval_ms = (unsigned)a.ui_interval_ms;
	o.prometheus = a.prometheus;
	return stk_mgmtd_run(&o) ? 1 : 0;
}

int cmd_meta(int argc, char **argv)
{
	struct role_args a = {0};
	struct stk_meta_opts o = {.size = sizeof(o)};
	int rc = parse_role("meta", argc, argv, &a);

	if (rc)
		return rc;
	o.listen = a.listen ? a.listen : "127.0.0.1:9401";
	o.mgmtd = a.mgmtd;
	o.data_dir = a.data;
	o.default_chunk_size = (uint32_t)a.chunk_size;
	o.default_stripe = (uint32_t)a.stripe;
	o.metrics_listen = a.metrics;
	o.host_id = a.host_id;
	o.shard = (unsigned)a.shard;
	return stk_meta_run(&o) ? 1 : 0;
}

int cmd_storage(int argc, char **argv)
{
	struct role_args a = {0};
	struct stk_storage_opts o = {.size = sizeof(o)};
	int rc = parse_role("storage", argc, argv, &a);

	if (rc)
		return rc;
	if (!a.ntargets) {
		cli_err("storage", "at least one --target DIR is required");
		return 2;
	}
	o.listen = a.listen ? a.listen : "127.0.0.1:9402";
	o.mgmtd = a.mgmtd;
	o.data_dir = a.data;
	o.targets = a.targets;
	o.ntargets = a.ntargets;
	o.metrics_listen = a.metrics;
	o.host_id = a.host_id;
	o.zone = a.zone;
	/*
	 * The scrubber by default reads 32 MiB a second, a pass a week: a few percent
	 * of one NVMe drive's bandwidth, and a 4 TB target checked in about a day and a
	 * half, so that a chunk gone bad on a replica nobody reads is found while its
	 * other copies are still there to repair it.
	 */
	o.scrub_rate = a.scrub_rate_set ? a.scrub_rate : 32ull << 20;
	o.scrub_interval_s = a.scrub_interval_set ? a.scrub_interval : 7 * 86400;
	o.resync_rate = a.resync_rate;
	return stk_storage_run(&o) ? 1 : 0;
}

/* ---- up ---- */

/*
 * The processes of `stoker up`: mgmtd, meta and the storage nodes, by index (0 is
 * mgmtd, 1 meta, 2.. the storage nodes). One storage node is "storage", on the
 * cluster's host; with --nodes N (2 to UP_NODES_MAX) they are "storage0".. on
 * loopback addresses of their own (127.0.0.2.., the same ports: a node's metrics stay
 * at its RPC port + 10, where `stoker top` looks), each with a host id of its own, so
 * that each stands for a host and no client reads its chunk files from its disk.
 */
#define NROLES 3 /* mgmtd, meta, storage: the ports BASE..BASE+2 */
#define UP_NODES_MAX 8
/*
 * Cluster mode (--nodes or --mgmtd): one etcd on BASE+30 (clients) and BASE+31
 * (peers), data in DATA/etcd, and M mgmtd (--mgmtd M, 3 by default, at most
 * UP_MGMTD_MAX): the first on BASE as always, the others ("mgmtd1"..) on
 * BASE+16.. with their metrics 10 ports up (BASE+26.., where `stoker top` looks
 * for a mgmtd's), after the storage nodes in the
 * process table. Everything is given the list of all of them.
 */
#define UP_MGMTD_MAX 4
#define UP_ETCD_PORT 30
#define UP_MGMTD_PORT 15 /* + k for the k-th extra mgmtd */
#define UP_MGMTD_METRICS_PORT (UP_MGMTD_PORT + STK_METRICS_PORT_OFFSET)
/*
 * --meta M (1 to --nodes; docs/meta-replication.md): M meta processes, "meta"
 * then "meta1".. after the mgmtd in the process table, meta k on storage node
 * k's loopback address (127.0.0.2.., the meta port BASE+1), and mgmtd keeps M
 * copies of the metadata (--meta-replicas M). With M = 1, meta stays on the
 * cluster's host, as before.
 */
/*
 * --meta-shards S (1 to UP_SHARDS_MAX; docs/meta-shards.md): S metadata shards,
 * each of M meta processes (--meta M), so S x M meta processes: meta index i
 * ("meta" for 0, "metaI") serves shard i / M + 1 as its replica i % M; shard 1's
 * keep the places above, shard k > 1's listen on BASE+UP_SHARD_PORT+k-2 with
 * their metrics 10 up, as every daemon's (where `stoker top`, doctor and the
 * dashboard look), on replica j's address as above.
 */
#define UP_SHARDS_MAX 4
#define UP_SHARD_PORT 40
#define UP_PROCS (2 + UP_NODES_MAX + UP_MGMTD_MAX - 1 + UP_NODES_MAX * UP_SHARDS_MAX - 1)
static const char *role_names[NROLES] = {"mgmtd", "meta", "storage"};

/*
 * Options `up` takes and hands on, as given, to every process of the role they
 * are for (0 mgmtd, 2 storage), after checking them as that role would.
 */
static const struct up_pass {
	int opt;
	const char *name;
	int role;
} up_pass[] = {
	{OPT_HBTO, "--heartbeat-timeout-ms", 0},
	{OPT_REPLACE_AFTER, "--replace-after", 0},
	{OPT_REBALANCE_MOVES, "--rebalance-moves", 0},
	{OPT_UI_INTERVAL, "--ui-interval-ms", 0},
	{OPT_PROMETHEUS, "--prometheus", 0},
	{OPT_RESYNC_RATE, "--resync-rate", 2},
	{OPT_SCRUB_RATE, "--scrub-rate", 2},
	{OPT_SCRUB_INTERVAL, "--scrub-interval", 2},
};
#define UP_NPASS STK_ARRAY_SIZE(up_pass)

struct up {
	char data[PATH_MAX];
	char host[64];
	unsigned port;
	unsigned ntargets;
	char chunk_size[32], stripe[32]; /* passed to meta as its defaults when set */
	char mount[PATH_MAX]; /* --mount: where to mount the cluster once it serves */
	unsigned s3_port; /* --s3: serve the S3 gateway on this port once it serves */
	pid_t s3_pid;
	char s3_metrics[80]; /* the gateway's metrics on BASE+13; "" with --no-metrics */
	unsigned gw_port[2]; /* --nfs, --smb: serve NFS, SMB on these ports once it serves */
	pid_t gw_pid[2];
	unsigned nodes; /* storage nodes */
	unsigned replicas; /* copies of each chunk: --replicas, default 3 from 3 nodes on */
	char replicas_arg[8];
	unsigned nprocs; /* 2 + nodes + nmgmtd - 1 + nmeta * nshards - 1 */
	unsigned nmgmtd; /* mgmtd processes: 1 embedded, M in cluster mode */
	unsigned nmeta;	 /* meta processes (--meta) per shard, the first at index 1 */
	unsigned nshards; /* --meta-shards: metadata shards, nmeta meta processes each */
	char meta_replicas_arg[8];
	char meta_shards_arg[8];
	char shard_arg[UP_PROCS][8]; /* a meta process's --shard */
	int cluster;	 /* cluster mode: etcd and M mgmtd */
	char mgmtd_list[STK_CLUSTER_ADDR_MAX]; /* every mgmtd's address, comma-separated */
	char etcd_url[80], etcd_peer[80];
	pid_t etcd_pid;
	char name[UP_PROCS][16]; /* "mgmtd", "meta", "storage" or "storage0".. */
	char addr[UP_PROCS][80];
	char metrics[UP_PROCS][80]; /* "" with --no-metrics */
	pid_t pid[UP_PROCS];
	unsigned restarts[UP_PROCS];
	time_t last_start[UP_PROCS];
	char exe[PATH_MAX];
	char key_file[PATH_MAX + 16]; /* DATA/cluster.key */
	int tls; /* --tls: every daemon and client of the cluster speaks TLS */
	char *pass[UP_NPASS]; /* the values of up_pass's options given, or NULL */
};

static volatile sig_atomic_t up_stop;

static void up_on_signal(int sig)
{
	(void)sig;
	up_stop = 1;
}

/* What process r runs: 0 mgmtd, 1 meta, 2 storage (indexes into role_names). */
static int role_of(const struct up *u, int r)
{
	if (r == 1 || r >= 1 + (int)u->nodes + (int)u->nmgmtd)
		return 1; /* meta, and the extra metas after the mgmtd */
	if (r == 0 || r >= 2 + (int)u->nodes)
		return 0;
	return 2;
}

/* The k-th extra mgmtd (k >= 1) at index r, or 0 for any other process. */
static unsigned extra_mgmtd(const struct up *u, int r)
{
	return r >= 2 + (int)u->nodes && role_of(u, r) == 0 ? (unsigned)r - 1 - u->nodes : 0;
}

/* Which meta process r is (0 for "meta", k for "metaK"); only for role_of(u, r) == 1. */
static unsigned meta_index(const struct up *u, int r)
{
	return r == 1 ? 0 : (unsigned)r - u->nodes - u->nmgmtd;
}

static int port_free(const char *host, unsigned port)
{
	struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	int fd, one = 1, rc = 0;

	if (inet_pton(AF_INET, host, &sin.sin_addr) != 1)
		return 0; /* not an IPv4 literal: let the daemon report */
	fd = socket(AF_INET, SOCK_STREAM, 0);
	if (fd < 0)
		return 0;
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(fd, (struct sockaddr *)&sin, sizeof(sin)) < 0)
		rc = -errno;
	close(fd);
	return rc;
}

/* Target folder i of process r (a storage node): DATA/targets/I for the only node,
 * DATA/targets/NODE/I with several. */
static void up_target_dir(const struct up *u, int r, unsigned i, char *out, size_t len)
{
	if (u->nodes > 1)
		snprintf(out, len, "%s/targets/%d/%u", u->data, r - 2, i);
	else
		snprintf(out, len, "%s/targets/%u", u->data, i);
}

static pid_t spawn_role(struct up *u, int r)
{
	char logpath[PATH_MAX + 32], datadir[PATH_MAX + 32], mgmtd[STK_CLUSTER_ADDR_MAX], host_id[80];
	char *args[24 + 2 * UP_NPASS + 2 * 64];
	char tdirs[64][PATH_MAX + 32];
	int n = 0, fd, role = role_of(u, r);
	pid_t pid;

	snprintf(logpath, sizeof(logpath), "%s/log/%s.log", u->data, u->name[r]);
	snprintf(datadir, sizeof(datadir), "%s/%s", u->data, u->name[r]);
	snprintf(mgmtd, sizeof(mgmtd), "%s", u->mgmtd_list);
	args[n++] = "stoker";
	args[n++] = (char *)role_names[role];
	args[n++] = "--listen";
	args[n++] = u->addr[r];
	args[n++] = "--data";
	args[n++] = datadir;
	args[n++] = "--key-file";
	args[n++] = u->key_file;
	if (u->tls) {
		args[n++] = "--tls";
		args[n++] = "on";
	}
	if (role > 0) {
		args[n++] = "--mgmtd";
		args[n++] = mgmtd;
	} else if (u->cluster) {
		args[n++] = "--etcd";
		args[n++] = u->etcd_url;
	}
	if (u->metrics[r][0]) {
		args[n++] = "--metrics";
		args[n++] = u->metrics[r];
	}
	if (role == 2 && u->nodes > 1) {
		snprintf(host_id, sizeof(host_id), "up-%s", u->name[r]);
		args[n++] = "--host-id";
		args[n++] = host_id;
	}
	if (role == 0 && u->replicas > 1) {
		snprintf(u->replicas_arg, sizeof(u->replicas_arg), "%u", u->replicas);
		args[n++] = "--replicas";
		args[n++] = u->replicas_arg;
	}
	if (role == 0 && u->nmeta > 1) {
		snprintf(u->meta_replicas_arg, sizeof(u->meta_replicas_arg), "%u", u->nmeta);
		args[n++] = "--meta-replicas";
		args[n++] = u->meta_replicas_arg;
	}
	if (role == 0 && u->nshards > 1) {
		snprintf(u->meta_shards_arg, sizeof(u->meta_shards_arg), "%u", u->nshards);
		args[n++] = "--meta-shards";
		args[n++] = u->meta_shards_arg;
	}
	if (role == 1 && u->nshards > 1) {
		snprintf(u->shard_arg[r], sizeof(u->shard_arg[r]), "%u",
			 meta_index(u, r) / u->nmeta + 1);
		args[n++] = "--shard";
		args[n++] = u->shard_arg[r];
	}
	if (role == 1 && u->chunk_size[0]) {
		args[n++] = "--chunk-size";
		args[n++] = u->chunk_size;
	}
	if (role == 1 && u->stripe[0]) {
		args[n++] = "--stripe";
		args[n++] = u->stripe;
	}
	for (unsigned i = 0; i < UP_NPASS; i++) {
		if (u->pass[i] && up_pass[i].role == role) {
			args[n++] = (char *)up_pass[i].name;
			args[n++] = u->pass[i];
		}
	}
	if (role == 2) {
		for (unsigned i = 0; i < u->ntargets && i < 64; i++) {
			up_target_dir(u, r, i, tdirs[i], sizeof(tdirs[i]));
			args[n++] = "--target";
			args[n++] = tdirs[i];
		}
	}
	args[n] = NULL;
	pid = fork();
	if (pid != 0)
		return pid;
	fd = open(logpath, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
	if (fd >= 0) {
		dup2(fd, 1);
		dup2(fd, 2);
	}
	fd = open("/dev/null", O_RDONLY);
	if (fd >= 0)
		dup2(fd, 0);
	signal(SIGINT, SIG_DFL);
	signal(SIGTERM, SIG_DFL);
	/* A daemon of its own process group: a Ctrl-C reaches `up`, which stops it in order. */
	setpgid(0, 0);
	execv(u->exe, args);
	_exit(127);
}

/*
 * etcd for cluster mode: one member on loopback, data in DATA/etcd, log in
 * DATA/log/etcd.log. $STOKER_ETCD names the binary (default: etcd on PATH).
 */
static pid_t spawn_etcd(struct up *u)
{
	char datadir[PATH_MAX + 32], logpath[PATH_MAX + 32], cluster[128];
	const char *exe = getenv("STOKER_ETCD");
	char *args[] = {"etcd", "--name", "stoker", "--data-dir", datadir,
			"--listen-client-urls", u->etcd_url, "--advertise-client-urls", u->etcd_url,
			"--listen-peer-urls", u->etcd_peer, "--initial-advertise-peer-urls",
			u->etcd_peer, "--initial-cluster", cluster, NULL};
	pid_t pid;
	int fd;

	snprintf(datadir, sizeof(datadir), "%s/etcd", u->data);
	snprintf(logpath, sizeof(logpath), "%s/log/etcd.log", u->data);
	snprintf(cluster, sizeof(cluster), "stoker=%s", u->etcd_peer);
	pid = fork();
	if (pid != 0)
		return pid;
	fd = open(logpath, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
	if (fd >= 0) {
		dup2(fd, 1);
		dup2(fd, 2);
	}
	fd = open("/dev/null", O_RDONLY);
	if (fd >= 0)
		dup2(fd, 0);
	signal(SIGINT, SIG_DFL);
	signal(SIGTERM, SIG_DFL);
	setpgid(0, 0);
	if (exe && *exe)
		execv(exe, args);
	else
		execvp("etcd", args);
	_exit(127);
}

/* Stops etcd, after every daemon that uses it. */
static void stop_etcd(struct up *u)
{
	if (u->etcd_pid <= 0)
		return;
	kill(u->etcd_pid, SIGTERM);
	for (int i = 0; i < 100; i++) {
		if (waitpid(u->etcd_pid, NULL, WNOHANG) == u->etcd_pid) {
			u->etcd_pid = 0;
			return;
		}
		usleep(100000);
	}
	kill(u->etcd_pid, SIGKILL);
	waitpid(u->etcd_pid, NULL, 0);
	u->etcd_pid = 0;
}

static void print_log_tail(const struct up *u, int r)
{
	char path[PATH_MAX + 32], line[1024];
	long pos;
	FILE *f;

	snprintf(path, sizeof(path), "%s/log/%s.log", u->data, u->name[r]);
	f = fopen(path, "r");
	if (!f)
		return;
	fseek(f, 0, SEEK_END);
	pos = ftell(f);
	fseek(f, pos > 2000 ? pos - 2000 : 0, SEEK_SET);
	fprintf(stderr, "--- last lines of %s ---\n", path);
	if (pos > 2000 && !fgets(line, sizeof(line), f)) /* skip a partial line */
		line[0] = 0;
	while (fgets(line, sizeof(line), f))
		fputs(line, stderr);
	fclose(f);
}

/* 1 when the routing table shows the whole cluster serving. */
static int cluster_ready(const struct up *u)
{
	struct stk_routing rt;
	unsigned serving = 0;
	int meta_ok = 0, ok;

	if (stk_mgmt_fetch_routing(u->mgmtd_list, &rt))
		return 0;
	for (uint32_t i = 0; i < rt.ntargets; i++)
		if (rt.targets[i].state == STK_TARGET_SERVING)
			serving++;
	for (uint32_t i = 0; i < rt.nshards; i++) {
		const struct stk_rt_node *n = stk_routing_node(&rt, rt.shards[i].node_id);
		/* with --meta M, every meta in the shard: the leader and M - 1 followers */
		if (n && n->state == STK_NODE_ONLINE && rt.shards[i].nfollowers + 1u >= u->nmeta)
			meta_ok++;
	}
	/* every shard served (--meta-shards S) */
	meta_ok = meta_ok >= (int)u->nshards;
	/* every target serving, and in a chain of R (a remainder of fewer than R stays out) */
	ok = meta_ok && serving >= u->ntargets * u->nodes &&
	     rt.nchains >= u->ntargets * u->nodes / u->replicas;
	stk_routing_free(&rt);
	return ok;
}

/*
 * Stops the daemons by role: every storage node at once, then meta, then every
 * mgmtd, each role given 10 s in all to flush and exit before it is killed. mgmtd
 * goes last so that no daemon's last call waits out an election, and a role
 * stops in parallel so that N nodes take no longer than one.
 */
static void stop_children(struct up *u)
{
	static const int order[] = {2, 1, 0}; /* storage, meta, mgmtd */

	for (size_t o = 0; o < sizeof(order) / sizeof(order[0]); o++) {
		int left = 0;

		for (int r = 0; r < (int)u->nprocs; r++)
			if (u->pid[r] > 0 && role_of(u, r) == order[o]) {
				kill(u->pid[r], SIGTERM);
				left++;
			}
		for (int i = 0; i < 100 && left > 0; i++) {
			usleep(100000);
			for (int r = 0; r < (int)u->nprocs; r++)
				if (u->pid[r] > 0 && role_of(u, r) == order[o] &&
				    waitpid(u->pid[r], NULL, WNOHANG) == u->pid[r]) {
					u->pid[r] = 0;
					left--;
				}
		}
		for (int r = 0; r < (int)u->nprocs; r++) {
			if (u->pid[r] <= 0 || role_of(u, r) != order[o])
				continue;
			fprintf(stderr, "stoker up: %s did not stop in 10 s; killing it\n",
				u->name[r]);
			kill(u->pid[r], SIGKILL);
			waitpid(u->pid[r], NULL, 0);
			u->pid[r] = 0;
		}
	}
}

static void write_file(const char *path, const char *content)
{
	char tmp[PATH_MAX + 16];
	FILE *f;

	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	f = fopen(tmp, "w");
	if (!f)
		return;
	fputs(content, f);
	fclose(f);
	rename(tmp, path);
}

/*
 * /tmp/stoker-UID/keys/ADDR for each daemon's address: the path of the cluster's key,
 * where clients given that address find it (client.h, stk_client_auth_find). Removed
 * only while it still names this cluster's key.
 */
static void record_keys(const struct up *u, int on)
{
	char dir[64], path[192], buf[PATH_MAX + 32], line[PATH_MAX + 32], content[PATH_MAX + 40];
	char list[STK_CLUSTER_ADDR_MAX + UP_PROCS * 81];
	char *a, *next;
	size_t n;

	cli_runtime_dir(dir, sizeof(dir));
	snprintf(line, sizeof(line), "%s\n", u->key_file);
	/* a second line "tls": its clients speak TLS (client.c, recorded_tls) */
	snprintf(content, sizeof(content), "%s%s", line, u->tls ? "tls\n" : "");
	/* every daemon's address: tools given a meta or storage address find it too */
	n = (size_t)snprintf(list, sizeof(list), "%s", u->mgmtd_list);
	for (unsigned r = 1; r < u->nprocs && n < sizeof(list); r++)
		n += (size_t)snprintf(list + n, sizeof(list) - n, ",%s", u->addr[r]);
	if (on) {
		mkdir(dir, 0700);
		snprintf(path, sizeof(path), "%s/keys", dir);
		mkdir(path, 0700);
	}
	for (a = list; a; a = next) {
		FILE *f;

		next = strchr(a, ',');
		if (next)
			*next++ = 0;

		snprintf(path, sizeof(path), "%s/keys/%s", dir, a);
		if (on) {
			write_file(path, content);
			continue;
		}
		f = fopen(path, "r");
		if (!f)
			continue;
		if (fgets(buf, sizeof(buf), f) && strcmp(buf, line) == 0)
			unlink(path);
		fclose(f);
	}
}

static void record_cluster(const struct up *u, int on)
{
	char dir[64], path[128], buf[STK_CLUSTER_ADDR_MAX + 16], line[STK_CLUSTER_ADDR_MAX + 16];
	FILE *f;

	record_keys(u, on);
	cli_runtime_dir(dir, sizeof(dir));
	snprintf(path, sizeof(path), "%s/cluster", dir);
	snprintf(line, sizeof(line), "stk://%s\n", u->mgmtd_list);
	if (on) {
		mkdir(dir, 0700);
		write_file(path, line);
		return;
	}
	/* Remove the record only if it still names this cluster. */
	f = fopen(path, "r");
	if (!f)
		return;
	if (fgets(buf, sizeof(buf), f) && strcmp(buf, line) == 0)
		unlink(path);
	fclose(f);
}

/*
 * Runs `stoker ARGS...` (this binary) and waits for it: used for `mount`, which
 * returns once the mount answers and leaves its daemon running, and `umount`.
 * Returns its exit status, or -1 if it could not run.
 */
static int run_self(const struct up *u, char *const args[])
{
	int st;
	pid_t pid = fork();

	if (pid < 0)
		return -1;
	if (pid == 0) {
		signal(SIGINT, SIG_DFL);
		signal(SIGTERM, SIG_DFL);
		execv(u->exe, args);
		_exit(127);
	}
	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR)
			return -1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int mount_cluster(const struct up *u)
{
	char url[STK_CLUSTER_ADDR_MAX + 16], opt[128];
	char *args[] = {"stoker", "mount", url, (char *)u->mount, "-o", opt, NULL};

	snprintf(url, sizeof(url), "stk://%s", u->mgmtd_list);
	/* the mount's metrics follow the gateway's: BASE+14 (docs/metrics.md) */
	snprintf(opt, sizeof(opt), "metrics=%s:%u", u->host,
		 u->port + STK_METRICS_PORT_OFFSET + NROLES + 1);
	if (!u->metrics[0][0])
		args[4] = NULL;
	return run_self(u, args);
}

static void umount_cluster(const struct up *u)
{
	char *args[] = {"stoker", "umount", (char *)u->mount, NULL};

	if (u->mount[0] && run_self(u, args) != 0)
		fprintf(stderr, "stoker up: could not unmount %s; `stoker umount -l %s` clears it\n",
			u->mount, u->mount);
}

/*
 * The S3 gateway's keys: $STOKER_S3_ACCESS_KEY/SECRET when set (the gateway reads
 * them itself), else DIR/s3.keys, made once with a random key pair.
 */
static int s3_keys(const struct up *u, char *path, size_t len)
{
	unsigned char rnd[30];
	char line[128];
	FILE *f;
	int fd;

	snprintf(path, len, "%s/s3.keys", u->data);
	if (access(path, R_OK) == 0)
		return 0;
	fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
	if (fd < 0 || stk_read_full(fd, rnd, sizeof(rnd)) != (long)sizeof(rnd)) {
		if (fd >= 0)
			close(fd);
		return -EIO;
	}
	close(fd);
	char *q = line;
	q += snprintf(q, 8, "STK");
	for (int i = 0; i < 10; i++)
		q += snprintf(q, 3, "%02X", rnd[i]);
	*q++ = ' ';
	for (int i = 10; i < 30; i++)
		q += snprintf(q, 3, "%02x", rnd[i]);
	*q++ = '\n';
	*q = 0;
	fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	f = fdopen(fd, "w");
	if (!f) {
		close(fd);
		return -EIO;
	}
	fputs(line, f);
	return fclose(f) ? -EIO : 0;
}

static pid_t spawn_s3(struct up *u)
{
	char url[STK_CLUSTER_ADDR_MAX + 16], listen[96], keys[PATH_MAX + 16], logpath[PATH_MAX + 32];
	char *args[] = {"stoker", "gateway", "s3", "--cluster", url, "--listen", listen,
			"--metrics", u->s3_metrics, "--keys", keys, NULL};
	pid_t pid;
	int fd;

	snprintf(url, sizeof(url), "stk://%s", u->mgmtd_list);
	snprintf(listen, sizeof(listen), "%s:%u", u->host, u->s3_port);
	if (!u->s3_metrics[0]) { /* --no-metrics: drop the pair, keep the keys */
		args[7] = args[9];
		args[8] = args[10];
		args[9] = NULL;
	}
	if (getenv("STOKER_S3_ACCESS_KEY") && getenv("STOKER_S3_SECRET_KEY"))
		args[u->s3_metrics[0] ? 9 : 7] = NULL; /* the gateway takes the environment's keys */
	else if (s3_keys(u, keys, sizeof(keys)))
		return -1;
	snprintf(logpath, sizeof(logpath), "%s/log/s3.log", u->data);
	pid = fork();
	if (pid != 0)
		return pid;
	fd = open(logpath, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
	if (fd >= 0) {
		dup2(fd, 1);
		dup2(fd, 2);
	}
	signal(SIGINT, SIG_DFL);
	signal(SIGTERM, SIG_DFL);
	setpgid(0, 0);
	execv(u->exe, args);
	_exit(127);
}

/*
 * `stoker gateway nfs` (which 0) or `smb` (1) over the whole cluster, with its
 * state in DATA/nfs or DATA/smb and its metrics (the mount it serves) on BASE+15
 * or BASE+19 (docs/nfs-smb.md); restarted by supervise() like the S3 gateway.
 */
static pid_t spawn_gw(struct up *u, int which)
{
	static const char *const kind[2] = {"nfs", "smb"};
	static const unsigned moff[2] = {15, 19};
	char url[STK_CLUSTER_ADDR_MAX + 16], listen[96], state[PATH_MAX + 8], metrics[96];
	char logpath[PATH_MAX + 32];
	char *args[] = {"stoker", "gateway", (char *)kind[which], "--cluster", url, "--listen",
			listen, "--state", state, "--metrics", metrics, NULL};
	pid_t pid;
	int fd;

	snprintf(url, sizeof(url), "stk://%s", u->mgmtd_list);
	snprintf(listen, sizeof(listen), "%s:%u", u->host, u->gw_port[which]);
	snprintf(state, sizeof(state), "%s/%s", u->data, kind[which]);
	snprintf(metrics, sizeof(metrics), "%s:%u", u->host, u->port + moff[which]);
	if (!u->metrics[0][0])
		args[9] = NULL;
	snprintf(logpath, sizeof(logpath), "%s/log/%s.log", u->data, kind[which]);
	pid = fork();
	if (pid != 0)
		return pid;
	fd = open(logpath, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
	if (fd >= 0) {
		dup2(fd, 1);
		dup2(fd, 2);
	}
	signal(SIGINT, SIG_DFL);
	signal(SIGTERM, SIG_DFL);
	setpgid(0, 0);
	execv(u->exe, args);
	_exit(127);
}

static void stop_gws(struct up *u)
{
	/* in parallel: each stops its server and unmounts, which takes a moment */
	for (int w = 0; w < 2; w++)
		if (u->gw_pid[w] > 0)
			kill(u->gw_pid[w], SIGTERM);
	for (int w = 0; w < 2; w++) {
		if (u->gw_pid[w] <= 0)
			continue;
		for (int i = 0; i < 300 && waitpid(u->gw_pid[w], NULL, WNOHANG) != u->gw_pid[w]; i++)
			usleep(100000);
		kill(u->gw_pid[w], SIGKILL);
		waitpid(u->gw_pid[w], NULL, WNOHANG);
		u->gw_pid[w] = 0;
	}
}

static void stop_s3(struct up *u)
{
	if (u->s3_pid <= 0)
		return;
	kill(u->s3_pid, SIGTERM);
	for (int i = 0; i < 100 && waitpid(u->s3_pid, NULL, WNOHANG) != u->s3_pid; i++)
		usleep(100000);
	kill(u->s3_pid, SIGKILL);
	waitpid(u->s3_pid, NULL, WNOHANG);
	u->s3_pid = 0;
}

static int supervise(struct up *u, int ready_fd)
{
	uint64_t deadline = stk_now_ns() + 60ull * 1000000000ull;
	char msg[1024];
	int ready = 0;

	if (u->cluster) {
		u->etcd_pid = spawn_etcd(u);
		if (u->etcd_pid < 0) {
			snprintf(msg, sizeof(msg), "cannot start etcd: %s\n", strerror(errno));
			goto fail;
		}
	}
	for (int r = 0; r < (int)u->nprocs; r++) {
		u->pid[r] = spawn_role(u, r);
		u->last_start[r] = time(NULL);
		if (u->pid[r] < 0) {
			snprintf(msg, sizeof(msg), "cannot start %s: %s\n", u->name[r],
				 strerror(errno));
			goto fail;
		}
	}
	while (!up_stop) {
		for (int r = 0; r < (int)u->nprocs; r++) {
			int st;
			if (u->pid[r] <= 0 || waitpid(u->pid[r], &st, WNOHANG) != u->pid[r])
				continue;
			u->pid[r] = 0;
			if (!ready) {
				snprintf(msg, sizeof(msg), "%s exited during start-up (%s %d); see %s/log/%s.log\n",
					 u->name[r], WIFEXITED(st) ? "status" : "signal",
					 WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st), u->data,
					 u->name[r]);
				print_log_tail(u, r);
				goto fail;
			}
			fprintf(stderr, "%s exited (%s %d); restarting it\n", u->name[r],
				WIFEXITED(st) ? "status" : "signal",
				WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
			if (time(NULL) - u->last_start[r] < 2)
				sleep(1); /* don't spin on a daemon that dies at once */
			u->pid[r] = spawn_role(u, r);
			u->last_start[r] = time(NULL);
			u->restarts[r]++;
		}
		if (u->etcd_pid > 0) {
			int st;
			if (waitpid(u->etcd_pid, &st, WNOHANG) == u->etcd_pid) {
				if (!ready) {
					snprintf(msg, sizeof(msg),
						 "etcd exited during start-up; see %s/log/etcd.log\n",
						 u->data);
					u->etcd_pid = 0;
					goto fail;
				}
				fprintf(stderr, "etcd exited; restarting it (see log/etcd.log)\n");
				sleep(1);
				u->etcd_pid = spawn_etcd(u);
			}
		}
		if (u->s3_pid > 0) {
			int st;
			if (waitpid(u->s3_pid, &st, WNOHANG) == u->s3_pid) {
				fprintf(stderr, "the S3 gateway exited; restarting it (see log/s3.log)\n");
				sleep(1);
				u->s3_pid = spawn_s3(u);
			}
		}
		for (int w = 0; w < 2; w++) {
			if (u->gw_pid[w] > 0 && waitpid(u->gw_pid[w], NULL, WNOHANG) == u->gw_pid[w]) {
				fprintf(stderr, "the %s gateway exited; restarting it (see log/%s.log)\n",
					w ? "SMB" : "NFS", w ? "smb" : "nfs");
				sleep(1);
				u->gw_pid[w] = spawn_gw(u, w);
			}
		}
		if (!ready) {
			if (cluster_ready(u)) {
				char line[STK_CLUSTER_ADDR_MAX + 16];
				ready = 1;
				record_cluster(u, 1);
				snprintf(line, sizeof(line), "stk://%s\n", u->mgmtd_list);
				{
					char p[PATH_MAX + 16];
					snprintf(p, sizeof(p), "%s/cluster", u->data);
					write_file(p, line);
				}
				if (u->mount[0] && mount_cluster(u) != 0) {
					snprintf(msg, sizeof(msg),
						 "the cluster serves, but mounting it on %s failed "
						 "(`stoker mount` said why, above or in %s/log/up.log)\n",
						 u->mount, u->data);
					goto fail;
				}
				if (u->s3_port) {
					u->s3_pid = spawn_s3(u);
					if (u->s3_pid < 0) {
						snprintf(msg, sizeof(msg),
							 "cannot start the S3 gateway: no keys\n");
						goto fail;
					}
				}
				for (int w = 0; w < 2; w++)
					if (u->gw_port[w])
						u->gw_pid[w] = spawn_gw(u, w);
				char mline[300] = "", s3line[PATH_MAX + 96] = "", nline[200];
				if (u->s3_port)
					snprintf(s3line, sizeof(s3line),
						 ", S3 on http://%s:%u (keys: %s%s%s)", u->host,
						 u->s3_port,
						 getenv("STOKER_S3_ACCESS_KEY")
							 ? "$STOKER_S3_ACCESS_KEY"
							 : "DATA/s3.keys",
						 u->s3_metrics[0] ? ", metrics on " : "",
						 u->s3_metrics);
				for (int w = 0; w < 2; w++)
					if (u->gw_port[w])
						snprintf(s3line + strlen(s3line),
							 sizeof(s3line) - strlen(s3line),
							 ", %s on %s:%u (state in DATA/%s)",
							 w ? "SMB" : "NFS", u->host, u->gw_port[w],
							 w ? "smb" : "nfs");
				if (u->metrics[0][0])
					snprintf(mline, sizeof(mline), ", metrics on %s %s %s%s",
						 u->metrics[0], u->metrics[1], u->metrics[2],
						 u->nodes > 1 ? " ..." : "");
				if (u->nodes > 1)
					snprintf(nline, sizeof(nline), "%u storage nodes %s..%s",
						 u->nodes, u->addr[2], u->addr[1 + u->nodes]);
				else
					snprintf(nline, sizeof(nline), "storage %s", u->addr[2]);
				snprintf(msg, sizeof(msg),
					 "ok Stoker is up: cluster stk://%s (mgmtd %s%s, meta %s, %s, "
					 "%u targets%s), data in %s%s%s%s\n",
					 u->mgmtd_list, u->mgmtd_list, u->cluster ? " over etcd" : "",
					 u->addr[1], nline,
					 u->ntargets * u->nodes, mline, u->data,
					 u->mount[0] ? ", mounted on " : "", u->mount, s3line);
				if (ready_fd >= 0) {
					stk_write_all(ready_fd, msg, strlen(msg));
					close(ready_fd);
					ready_fd = -1;
				} else {
					fputs(msg + 3, stdout);
					printf("Ctrl-C stops it.\n");
					fflush(stdout);
				}
			} else if (stk_now_ns() > deadline) {
				snprintf(msg, sizeof(msg),
					 "the cluster did not become ready in 60 s; see %s/log/\n",
					 u->data);
				for (int r = 0; r < (int)u->nprocs; r++)
					print_log_tail(u, r);
				goto fail;
			}
		}
		usleep(ready ? 200000 : 50000);
	}
	stop_s3(u);
	stop_gws(u);
	if (ready)
		umount_cluster(u); /* flush what the mount buffers while the cluster still serves */
	stop_children(u);
	stop_etcd(u);
	record_cluster(u, 0);
	return 0;
fail:
	stop_s3(u);
	stop_gws(u);
	stop_children(u);
	stop_etcd(u);
	if (ready_fd >= 0) {
		char err[1100];
		snprintf(err, sizeof(err), "error %s", msg);
		stk_write_all(ready_fd, err, strlen(err));
		close(ready_fd);
	} else {
		fprintf(stderr, "stoker up: %s", msg);
	}
	return 1;
}

static const struct option up_opts[] = {
	{"data", required_argument, NULL, 'd'},  {"daemon", no_argument, NULL, 'D'},
	{"port", required_argument, NULL, 'p'},  {"host", required_argument, NULL, 'H'},
	{"targets", required_argument, NULL, 't'}, {"chunk-size", required_argument, NULL, 'c'},
	{"stripe", required_argument, NULL, 's'},  {"no-metrics", no_argument, NULL, 'M'},
	{"mount", required_argument, NULL, 'm'},   {"s3", required_argument, NULL, '3'},
	{"nfs", required_argument, NULL, 'N'},     {"smb", required_argument, NULL, 'B'},
	{"nodes", required_argument, NULL, 'n'},   {"replicas", required_argument, NULL, 'r'},
	{"mgmtd", required_argument, NULL, 'g'},   {"meta", required_argument, NULL, 'E'},
	{"meta-shards", required_argument, NULL, 'S'},
	{"heartbeat-timeout-ms", required_argument, NULL, OPT_HBTO},
	{"replace-after", required_argument, NULL, OPT_REPLACE_AFTER},
	{"rebalance-moves", required_argument, NULL, OPT_REBALANCE_MOVES},
	{"ui-interval-ms", required_argument, NULL, OPT_UI_INTERVAL},
	{"prometheus", required_argument, NULL, OPT_PROMETHEUS},
	{"resync-rate", required_argument, NULL, OPT_RESYNC_RATE},
	{"scrub-rate", required_argument, NULL, OPT_SCRUB_RATE},
	{"scrub-interval", required_argument, NULL, OPT_SCRUB_INTERVAL},
	{"tls", no_argument, NULL, OPT_TLS},
	{NULL, 0, NULL, 0},
};

/* An option of up_pass: checked as its role checks it, kept for spawn_role. 0 or 2. */
static int up_pass_opt(struct up *u, int c, char *val)
{
	struct role_args scratch = {0};

	for (unsigned i = 0; i < UP_NPASS; i++) {
		if (up_pass[i].opt != c)
			continue;
		if (role_opt("up", c, val, &scratch))
			return 2;
		u->pass[i] = val;
		return 0;
	}
	return cli_usage("up");
}

int cmd_up(int argc, char **argv)
{
	struct up *u = calloc(1, sizeof(*u));
	const char *data = NULL;
	int daemon_mode = 0, no_metrics = 0, c, lockfd = -1, locked = 0, rc = 1;
	uint64_t v;
	char path[PATH_MAX + 32];
	struct sigaction sa;

	if (!u)
		return 1;
	stk_strlcpy(u->host, "127.0.0.1", sizeof(u->host));
	u->port = 9400;
	u->ntargets = 4;
	u->nodes = 1;
	optind = 1;
	while ((c = getopt_long(argc, argv, "", up_opts, NULL)) != -1) {
		switch (c) {
		case 'd':
			data = optarg;
			break;
		case 'D':
			daemon_mode = 1;
			break;
		case 'M':
			no_metrics = 1;
			break;
		case OPT_TLS:
			u->tls = 1;
			break;
		case 'p':
			if (stk_parse_u64(optarg, &v) || v < 1 || v > 65533) {
				cli_err("up", "bad --port '%s'", optarg);
				goto out;
			}
			u->port = (unsigned)v;
			break;
		case 'H':
			if (stk_strlcpy(u->host, optarg, sizeof(u->host))) {
				cli_err("up", "--host too long");
				goto out;
			}
			break;
		case 't':
			if (stk_parse_u64(optarg, &v) || v < 1 || v > 64) {
				cli_err("up", "--targets must be 1..64");
				goto out;
			}
			u->ntargets = (unsigned)v;
			break;
		case 'c':
			if (stk_parse_size(optarg, &v) || v < (64u << 10) || v > (64u << 20) ||
			    (v & (v - 1))) {
				cli_err("up", "--chunk-size must be a power of two from 64K to 64M");
				goto out;
			}
			snprintf(u->chunk_size, sizeof(u->chunk_size), "%llu", (unsigned long long)v);
			break;
		case '3':
			if (stk_parse_u64(optarg, &v) || v < 1 || v > 65535) {
				cli_err("up", "bad --s3 port '%s'", optarg);
				goto out;
			}
			u->s3_port = (unsigned)v;
			break;
		case 'N':
		case 'B':
			if (stk_parse_u64(optarg, &v) || v < 1 || v > 65535) {
				cli_err("up", "bad --%s port '%s'", c == 'N' ? "nfs" : "smb", optarg);
				goto out;
			}
			u->gw_port[c == 'B'] = (unsigned)v;
			/* the NFS gateway serves MOUNT (NFSv3) on its port + 1 */
			if (u->gw_port[0] && u->gw_port[1] &&
			    (u->gw_port[1] == u->gw_port[0] || u->gw_port[1] == u->gw_port[0] + 1)) {
				cli_err("up", "--smb %u: the NFS gateway uses ports %u and %u",
					u->gw_port[1], u->gw_port[0], u->gw_port[0] + 1);
				goto out;
			}
			break;
		case 'm':
			if (!realpath(optarg, u->mount)) {
				cli_err("up", "--mount %s: %s", optarg, strerror(errno));
				goto out;
			}
			break;
		case 'n':
			if (stk_parse_u64(optarg, &v) || v < 1 || v > UP_NODES_MAX) {
				cli_err("up", "--nodes must be 1..%u", UP_NODES_MAX);
				goto out;
			}
			u->nodes = (unsigned)v;
			u->cluster = 1;
			break;
		case 'S':
			if (stk_parse_u64(optarg, &v) || v < 1 || v > UP_SHARDS_MAX) {
				cli_err("up", "--meta-shards must be 1..%u", UP_SHARDS_MAX);
				goto out;
			}
			u->nshards = (unsigned)v;
			break;
		case 'E':
			if (stk_parse_u64(optarg, &v) || v < 1 || v > UP_NODES_MAX) {
				cli_err("up", "--meta must be 1..%u (and at most --nodes)",
					UP_NODES_MAX);
				goto out;
			}
			u->nmeta = (unsigned)v;
			break;
		case 'g':
			if (stk_parse_u64(optarg, &v) || v < 1 || v > UP_MGMTD_MAX) {
				cli_err("up", "--mgmtd must be 1..%u", UP_MGMTD_MAX);
				goto out;
			}
			u->nmgmtd = (unsigned)v;
			u->cluster = 1;
			break;
		case 'r':
			if (stk_parse_u64(optarg, &v) || v < 1 || v > STK_MAX_REPLICAS) {
				cli_err("up", "--replicas must be 1..%d", STK_MAX_REPLICAS);
				goto out;
			}
			u->replicas = (unsigned)v;
			break;
		case 's':
			if (stk_parse_u64(optarg, &v) || v < 1 || v > 256) {
				cli_err("up", "--stripe must be 1..256");
				goto out;
			}
			snprintf(u->stripe, sizeof(u->stripe), "%llu", (unsigned long long)v);
			break;
		case OPT_HBTO:
		case OPT_REPLACE_AFTER:
		case OPT_REBALANCE_MOVES:
		case OPT_UI_INTERVAL:
		case OPT_PROMETHEUS:
		case OPT_RESYNC_RATE:
		case OPT_SCRUB_RATE:
		case OPT_SCRUB_INTERVAL:
			rc = up_pass_opt(u, c, optarg);
			if (rc)
				goto out;
			rc = 1;
			break;
		default:
			rc = cli_usage("up");
			goto out;
		}
	}
	if (!no_metrics && u->port + STK_METRICS_PORT_OFFSET + NROLES - 1 > 65535) {
		cli_err("up", "--port too high for the metrics ports (BASE+%u..BASE+%u)",
			STK_METRICS_PORT_OFFSET, STK_METRICS_PORT_OFFSET + NROLES - 1);
		goto out;
	}
	if (u->nodes > 1 && strcmp(u->host, "127.0.0.1") != 0) {
		cli_err("up", "--nodes puts its storage nodes on 127.0.0.2.. of this machine; it "
			      "does not go with --host (run each node with `stoker storage` on "
			      "real hosts)");
		goto out;
	}
	if (!u->replicas)
		u->replicas = u->nodes >= 3 ? 3 : 1;
	if (u->replicas > u->nodes) {
		cli_err("up", "--replicas %u needs at least %u storage nodes (--nodes %u): no "
			      "chain holds two targets of one node",
			u->replicas, u->replicas, u->nodes);
		goto out;
	}
	if (u->cluster && !u->nmgmtd)
		u->nmgmtd = 3;
	if (!u->cluster)
		u->nmgmtd = 1;
	if (!u->nmeta)
		u->nmeta = 1;
	if (u->nmeta > u->nodes) {
		cli_err("up", "--meta %u needs at least %u nodes (--nodes %u): meta k runs on "
			      "node k's address",
			u->nmeta, u->nmeta, u->nodes);
		goto out;
	}
	if (!u->nshards)
		u->nshards = 1;
	u->nprocs = 2 + u->nodes + u->nmgmtd - 1 + u->nmeta * u->nshards - 1;
	for (unsigned r = 0; r < u->nprocs; r++) {
		if (role_of(u, (int)r) == 1 && r != 1)
			snprintf(u->name[r], sizeof(u->name[r]), "meta%u", meta_index(u, (int)r));
		else if (r >= 2 + u->nodes)
			snprintf(u->name[r], sizeof(u->name[r]), "mgmtd%u", r - 1 - u->nodes);
		else if (r < 2 || u->nodes == 1)
			snprintf(u->name[r], sizeof(u->name[r]), "%s", role_names[r < 2 ? r : 2]);
		else
			snprintf(u->name[r], sizeof(u->name[r]), "storage%u", r - 2);
	}
	if (!data || optind < argc) {
		cli_err("up", "--data DIR is required");
		rc = cli_usage("up");
		goto out;
	}
	if (stk_mkdir_p(data, 0755) || !realpath(data, u->data)) {
		cli_err("up", "cannot create %s: %s", data, strerror(errno));
		goto out;
	}
	if (readlink("/proc/self/exe", u->exe, sizeof(u->exe) - 1) < 0) {
		cli_err("up", "cannot find my own executable: %s", strerror(errno));
		goto out;
	}
	snprintf(path, sizeof(path), "%s/log", u->data);
	stk_mkdir_p(path, 0755);
	for (unsigned i = 0; i < u->ntargets * u->nodes; i++) {
		up_target_dir(u, 2 + (int)(i / u->ntargets), i % u->ntargets, path, sizeof(path));
		if (stk_mkdir_p(path, 0755)) {
			cli_err("up", "cannot create %s: %s", path, strerror(errno));
			goto out;
		}
	}
	snprintf(path, sizeof(path), "%s/up.pid", u->data);
	lockfd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
	if (lockfd < 0 || flock(lockfd, LOCK_EX | LOCK_NB) < 0) {
		char buf[32] = "?";
		if (lockfd >= 0 && pread(lockfd, buf, sizeof(buf) - 1, 0) > 0)
			buf[strcspn(buf, "\n")] = 0;
		cli_err("up", "a cluster is already running on %s (pid %s); stop it with "
			      "`stoker down --data %s`",
			u->data, buf, u->data);
		goto out;
	}
	locked = 1; /* from here on up.pid is ours to remove */
	/* The cluster key: made once, then every daemon and client of `up` is given it. */
	snprintf(u->key_file, sizeof(u->key_file), "%s/cluster.key", u->data);
	{
		char err[512];
		int e = stk_auth_key_create(u->key_file);

		if (e && e != -EEXIST) {
			cli_err("up", "cannot create the cluster key %s: %s", u->key_file,
				strerror(-e));
			goto out;
		}
		/* held by this process too: `up` asks the cluster whether it serves */
		e = stk_daemon_auth(u->key_file, err, sizeof(err));
		if (e) {
			cli_err("up", "%s", err);
			goto out;
		}
		/* the mount and the S3 gateway `up` starts are clients: they find it here */
		setenv("STOKER_KEY_FILE", u->key_file, 1);
		if (u->tls) {
			/* `up` itself asks the cluster whether it serves: by TLS too */
			e = stk_daemon_tls(1, err, sizeof(err));
			if (e) {
				cli_err("up", "%s", err);
				goto out;
			}
			setenv("STOKER_TLS", "1", 1);
		}
	}
	if (u->cluster) {
		unsigned ep = u->port + UP_ETCD_PORT;
		int e = ep + 1 > 65535 ? -ERANGE : port_free(u->host, ep);

		if (e == 0)
			e = port_free(u->host, ep + 1);
		if (e) {
			cli_err("up", "cannot use ports %u and %u on %s for etcd: %s; choose other "
				      "ports with --port BASE (etcd uses BASE+%u, BASE+%u)",
				ep, ep + 1, u->host, strerror(-e), UP_ETCD_PORT, UP_ETCD_PORT + 1);
			goto out;
		}
		snprintf(u->etcd_url, sizeof(u->etcd_url), "http://%s:%u", u->host, ep);
		snprintf(u->etcd_peer, sizeof(u->etcd_peer), "http://%s:%u", u->host, ep + 1);
	}
	for (int r = 0; r < (int)u->nprocs; r++) {
		unsigned k = extra_mgmtd(u, r); /* the k-th extra mgmtd, k >= 1 */
		int extra = k > 0, meta = role_of(u, r) == 1;
		unsigned shard = meta ? meta_index(u, r) / u->nmeta + 1 : 0;
		unsigned port = extra		    ? u->port + UP_MGMTD_PORT + k
				: meta && shard > 1 ? u->port + UP_SHARD_PORT + shard - 2
				: meta		    ? u->port + 1
						    : u->port + (unsigned)(r < 2 ? r : 2);
		unsigned mport = extra ? u->port + UP_MGMTD_METRICS_PORT + k
				       : port + STK_METRICS_PORT_OFFSET;
		char host[64];
		int e;

		if (port > 65535 || mport > 65535) {
			cli_err("up", "--port too high");
			goto out;
		}
		/* several storage nodes: one loopback address each, the same ports; with
		 * --meta M > 1, meta k on node k's */
		if (meta && u->nmeta > 1)
			snprintf(host, sizeof(host), "127.0.0.%u", 2 + meta_index(u, r) % u->nmeta);
		else if (!extra && !meta && r >= 2 && u->nodes > 1)
			snprintf(host, sizeof(host), "127.0.0.%d", r);
		else
			snprintf(host, sizeof(host), "%s", u->host);
		snprintf(u->addr[r], sizeof(u->addr[r]), "%s:%u", host, port);
		e = port_free(host, port);
		if (e) {
			cli_err("up", "cannot use port %u on %s for %s: %s; free it or choose other "
				      "ports with --port BASE (uses BASE..BASE+2)",
				port, host, u->name[r], strerror(-e));
			goto out;
		}
		/* Metrics on BASE+10.., the convention `stoker top` relies on. */
		if (no_metrics)
			continue;
		snprintf(u->metrics[r], sizeof(u->metrics[r]), "%s:%u", host, mport);
		e = port_free(host, mport);
		if (e) {
			cli_err("up", "cannot use port %u on %s for the metrics of %s: %s; free it, "
				      "choose other ports with --port BASE (metrics use BASE+%u..) or "
				      "pass --no-metrics",
				mport, host, u->name[r], strerror(-e),
				STK_METRICS_PORT_OFFSET);
			goto out;
		}
	}
	snprintf(u->mgmtd_list, sizeof(u->mgmtd_list), "%s", u->addr[0]);
	for (unsigned k = 1; k < u->nmgmtd; k++) {
		size_t l = strlen(u->mgmtd_list);

		snprintf(u->mgmtd_list + l, sizeof(u->mgmtd_list) - l, ",%s", u->addr[1 + u->nodes + k]);
	}
	if (u->s3_port) {
		int e = port_free(u->host, u->s3_port);
		if (e) {
			cli_err("up", "cannot use port %u on %s for the S3 gateway: %s", u->s3_port,
				u->host, strerror(-e));
			goto out;
		}
		/* the gateway's metrics follow the daemons': BASE+13 */
		if (!no_metrics) {
			unsigned mp = u->port + STK_METRICS_PORT_OFFSET + NROLES;
			e = mp > 65535 ? -ERANGE : port_free(u->host, mp);
			if (e) {
				cli_err("up", "cannot use port %u on %s for the S3 gateway's metrics: "
					      "%s; choose other ports with --port BASE or pass "
					      "--no-metrics",
					mp, u->host, strerror(-e));
				goto out;
			}
			snprintf(u->s3_metrics, sizeof(u->s3_metrics), "%s:%u", u->host, mp);
		}
	}
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = up_on_signal;
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);
	if (daemon_mode) {
		int pfd[2];
		char buf[1200];
		long n;
		pid_t pid;

		if (pipe2(pfd, O_CLOEXEC) < 0)
			goto out;
		fflush(NULL);
		pid = fork();
		if (pid < 0)
			goto out;
		if (pid > 0) {
			close(pfd[1]);
			n = stk_read_full(pfd[0], buf, sizeof(buf) - 1);
			buf[n > 0 ? n : 0] = 0;
			if (strncmp(buf, "ok ", 3) == 0) {
				fputs(buf + 3, stdout);
				printf("Stop it with: stoker down --data %s\n", u->data);
				rc = 0;
			} else {
				fprintf(stderr, "stoker up: %s", n > 6 ? buf + 6 : "failed to start\n");
				rc = 1;
			}
			goto out_parent;
		}
		close(pfd[0]);
		setsid();
		{
			int fd = open("/dev/null", O_RDWR);
			snprintf(path, sizeof(path), "%s/log/up.log", u->data);
			int lfd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
			if (fd >= 0)
				dup2(fd, 0);
			if (lfd >= 0) {
				dup2(lfd, 1);
				dup2(lfd, 2);
				close(lfd);
			}
			if (fd > 2)
				close(fd);
		}
		snprintf(buf, sizeof(buf), "%d\n", (int)getpid());
		if (ftruncate(lockfd, 0) == 0)
			pwrite(lockfd, buf, strlen(buf), 0);
		rc = supervise(u, pfd[1]);
		goto out;
	}
	{
		char buf[32];
		snprintf(buf, sizeof(buf), "%d\n", (int)getpid());
		if (ftruncate(lockfd, 0) == 0 && pwrite(lockfd, buf, strlen(buf), 0) < 0)
			stk_warn("cannot write %s/up.pid", u->data);
	}
	rc = supervise(u, -1);
out:
	if (locked) {
		snprintf(path, sizeof(path), "%s/up.pid", u->data);
		unlink(path);
	}
out_parent:
	if (lockfd >= 0)
		close(lockfd);
	free(u);
	return rc;
}

int cmd_down(int argc, char **argv)
{
	const char *data = NULL;
	char path[PATH_MAX + 32], buf[32];
	uint64_t pid;
	int fd;
	long n;

	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--data") == 0 && i + 1 < argc)
			data = argv[++i];
		else
			return cli_usage("down");
	}
	if (!data) {
		cli_err("down", "--data DIR is required");
		return cli_usage("down");
	}
	snprintf(path, sizeof(path), "%s/up.pid", data);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		cli_err("down", "no cluster is running on %s", data);
		return 1;
	}
	/* If nobody holds the lock, the supervisor is gone. */
	if (flock(fd, LOCK_EX | LOCK_NB) == 0) {
		close(fd);
		unlink(path);
		cli_err("down", "no cluster is running on %s", data);
		return 1;
	}
	n = pread(fd, buf, sizeof(buf) - 1, 0);
	close(fd);
	buf[n > 0 ? n : 0] = 0;
	buf[strcspn(buf, "\n")] = 0;
	if (stk_parse_u64(buf, &pid) || pid < 2) {
		cli_err("down", "%s holds no pid", path);
		return 1;
	}
	if (kill((pid_t)pid, SIGTERM) < 0) {
		cli_err("down", "cannot signal pid %llu: %s", (unsigned long long)pid,
			strerror(errno));
		return 1;
	}
	/* The supervisor gives each role 10 s, etcd and the gateway 10 s more each. */
	for (int i = 0; i < 1200; i++) {
		fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			break;
		if (flock(fd, LOCK_EX | LOCK_NB) == 0) {
			close(fd);
			fd = -1;
			break;
		}
		close(fd);
		usleep(100000);
	}
	if (fd >= 0) {
		cli_err("down", "Stoker on %s is still stopping after 120 s (supervisor pid %llu); "
			"see %s/log/up.log", data, (unsigned long long)pid, data);
		return 1;
	}
	printf("Stoker on %s is down.\n", data);
	return 0;
}
