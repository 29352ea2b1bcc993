/*
 * The `stoker` command line: shared helpers for the subcommand files.
 *
 * main.c    the command table, dispatch and help
 * admin.c   `admin init` (the cluster key)
 * up.c      `up`, `down` and the role commands (mgmtd, meta, storage)
 * data.c    data commands over libstoker (ls, stat, put, get, cat, mkdir, rm, mv)
 * status.c  `status`
 * top.c     `top` (its /metrics reader: prom.c, shared with doctor.c)
 * doctor.c  `doctor`
 * bench.c   `bench`
 * pack.c    `pack` (shards: shard.c; local-or-Stoker files: fsio.c)
 * fsck.c    `fsck` (the namespace and the data checked against each other)
 * sync.c    `sync` (local, Stoker and S3 trees: fsio.c, s3client.c)
 * checkpoint.c `checkpoint resume` (runs the Python package's stoker.checkpoint)
 * bench_loader.c `bench loader` (dispatched from bench.c)
 * ../fuse/  `mount` and `umount` (the FUSE daemon)
 * ../gateway/  `gateway s3` (the S3 gateway), `gateway nfs` and `gateway smb`
 */
#ifndef STK_CLI_H
#define STK_CLI_H

#include <stdio.h>

#include "stoker/stoker.h"

/* Each command: int fn(int argc, char **argv), argv[0] is the command name. */
#define STK_CLI_COMMANDS(X)                                                                     \
	X(up, cmd_up, "up --data DIR [--daemon] [--port BASE] [--nodes N] [--replicas R] [--mgmtd M] [--meta M] [--meta-shards S] [--targets N] [--chunk-size SIZE] [--stripe N] [--no-metrics] [--mount DIR] [--s3 PORT] [--nfs PORT] [--smb PORT] [--heartbeat-timeout-ms MS] [--replace-after S] [--rebalance-moves N] [--ui-interval-ms MS] [--prometheus URL] [--resync-rate RATE] [--scrub-rate RATE] [--scrub-interval S] [--tls]", \
	  "start a one-machine cluster (mgmtd, meta, N storage nodes; with --nodes, etcd and M mgmtd) with its data in DIR")     \
	X(down, cmd_down, "down --data DIR", "stop the cluster `stoker up --daemon` started")     \
	X(mgmtd, cmd_mgmtd, "mgmtd --listen ADDR --data DIR [--replicas R] [--meta-replicas R] [--meta-shards S] [--replace-after S] [--rebalance-moves N] [--ui-interval-ms MS] [--prometheus URL] [--etcd URL[,URL...]] [--etcd-prefix P] [--metrics ADDR] [--key-file F [--tls on] | --auth off] [--config FILE]",  \
	  "run the cluster manager")                                                            \
	X(meta, cmd_meta, "meta --listen ADDR --mgmtd ADDR[,ADDR...] --data DIR [--shard K] [--metrics ADDR] [--host-id ID] [--key-file F [--tls on] | --auth off] [--config FILE]", \
	  "run a metadata server")                                                              \
	X(storage, cmd_storage,                                                                 \
	  "storage --listen ADDR --mgmtd ADDR[,ADDR...] --data DIR --target DIR... [--zone Z] [--resync-rate RATE] [--metrics ADDR] [--host-id ID] [--scrub-rate RATE] [--scrub-interval S] [--key-file F [--tls on] | --auth off] [--config FILE]", \
	  "run a storage server with one or more targets")                                      \
	X(admin, cmd_admin, "admin init --key FILE | admin remove-node ID | admin drain-node ID | admin undrain-node ID | admin accept-loss CHAIN --yes-lose-data [--cluster ADDR] | admin s3-user add NAME [--uid U --gid G] [--bucket B[:ro]]... | rm NAME | ls --keys FILE | admin client add NAME [--subtree PATH] [--read-only] [--squash-root | --squash-all] [--anon-uid U --anon-gid G] --key-out FILE | client rm NAME | client ls [--json]", \
	  "make a cluster key file (mode 0600); replace an offline (or drained) storage node's targets now; move a node's chain memberships to other nodes, or cancel that; serve a chain whose newest copy is gone from the copy that is back; the S3 gateway's users") \
	X(status, cmd_status, "status [--cluster ADDR]",                                        \
	  "mgmtd leader and followers, nodes, targets, chains and the metadata shard map")                                  \
	X(doctor, cmd_doctor, "doctor [--cluster ADDR] [--json] [--quick] [--window S] [--rtt-ms MS] [--clock-ms MS] [--retrans N] [--full-warn PCT] [--full-fail PCT] [--p99-ms MS] [--small-file SIZE] [--sample N] [--gpus N] [--loader-files N] [--loader-batch N] [--loader-step-ms MS] [--timeout-ms MS] [PATH]", \
	  "check the cluster, this host's mounts and a data set for what starves GPUs, each with a verdict and a fix (docs/doctor.md)") \
	X(top, cmd_top, "top [--cluster stk://HOST:PORT] [--metrics ADDR,...] [--mount ADDR,...] [--interval S] [--once]", \
	  "live bandwidth, IOPS, p99 latency and capacity per node and target")                \
	X(ls, cmd_ls, "ls [-l] PATH...", "list directories")                                    \
	X(stat, cmd_stat, "stat PATH...", "show a file's attributes and layout")                \
	X(put, cmd_put, "put SRC DST", "copy a local file (or - for stdin) into Stoker")         \
	X(get, cmd_get, "get SRC DST", "copy a file out of Stoker (DST - for stdout)")           \
	X(cat, cmd_cat, "cat PATH...", "print files")                                           \
	X(mkdir, cmd_mkdir, "mkdir [-p] PATH...", "make directories")                           \
	X(rm, cmd_rm, "rm [-r] [-f] PATH...", "remove files (and directories with -r)")         \
	X(mv, cmd_mv, "mv SRC DST", "rename or move")                                           \
	X(mount, cmd_mount, "mount stk://HOST:PORT[/DIR] MOUNTPOINT [-f] [-o OPT,...]",           \
	  "mount the cluster (or DIR in it) with FUSE; options in docs/mount.md")                \
	X(umount, cmd_umount, "umount [-l] MOUNTPOINT",                                         \
	  "unmount and wait for the mount daemon to flush and exit (-l: detach now)")            \
	X(gateway, cmd_gateway,                                                                 \
	  "gateway s3 --cluster stk://HOST:PORT --listen ADDR:PORT [--tls-cert F --tls-key F] "  \
	  "[--keys FILE] [--root /DIR] [--region R] [--threads N] [--domain D] [--metrics A:P] "    \
	  "[--key-file F] | gateway nfs --cluster stk://HOST:PORT [--export /DIR] "                \
	  "[--listen ADDR:PORT] [--mount-port P] [--protocols 3,4] [--clients LIST] [--ro] "      \
	  "[--no-root-squash | --all-squash] [--anon-uid N] [--anon-gid N] [--grace S] [--state DIR] "        \
	  "[--metrics A:P] | gateway smb --cluster stk://HOST:PORT [--share NAME=/DIR[:ro]]... "  \
	  "[--listen ADDR:PORT] [--users FILE] [--encrypt off|desired|required] [--state DIR] "   \
	  "[--metrics A:P]", \
	  "serve the namespace over S3 (docs/s3.md), NFS or SMB (docs/nfs-smb.md)")               \
	X(bench, cmd_bench, "bench [--threads N] [--size SIZE] [--files N] [PATH] | bench loader [--preset image|segmentation] PATH", \
	  "measure throughput, IOPS and latency; `bench loader`: accelerators kept busy (MLPerf Storage)") \
	X(plan, cmd_plan, "plan [--dataset SIZE] [--expand F] [--no-raw] [--growth PCT --years N] [--checkpoint SIZE] [--keep N] [--scratch SIZE] [--overhead F] [--replicas R | --ec K+M] [--gpus N] [--sample SIZE] [--rate N] [--save-within S] [--node-capacity SIZE] [--node-read SIZE] [--node-write SIZE] [--node-iops N] [--fill F] [--json]", \
	  "capacity, bandwidth and nodes a training workload needs, with the arithmetic (docs/plan.md)") \
	X(pack, cmd_pack, "pack SRC DST [--shard-size SIZE]",                                   \
	  "pack the files under SRC into shards in DST (stk://HOST:PORT/dir, stk:///dir or local)") \
	X(quota, cmd_quota,                                                                     \
	  "quota set PATH [--bytes SIZE] [--inodes N] | quota ls [PATH] [--json] | quota rm PATH | quota recount [PATH]", \
	  "quotas per folder on bytes and inodes; recount fixes usage (docs/quotas.md)")        \
	X(qos, cmd_qos,                                                                            \
	  "qos set TENANT|@CLASS [--read-bw SIZE/s] [--write-bw SIZE/s] [--iops N] [--class C] | qos ls [--json] | "  \
	  "qos rm TENANT [--cluster ADDR]",                                                        \
	  "QoS limits per tenant (client key), enforced by each storage node (docs/qos.md)")       \
	X(shard, cmd_shard, "shard pin PATH N|spread | shard unpin PATH | shard show PATH...",    \
	  "where folders made in PATH go among the metadata shards (docs/meta-shards.md)")      \
	X(fsck, cmd_fsck, "fsck [--repair] [--json] [--grace S] [--cluster ADDR]",               \
	  "check the namespace and the data against each other; --repair fixes what is safe "  \
	  "(docs/fsck.md); exit 1 when problems remain")                                          \
	X(sync, cmd_sync, "sync SRC DST [--delete] [--dry-run] [--checksum] [--update] [--include PAT]... [--exclude PAT]... [--threads N] [--part-size SIZE] [--bwlimit RATE] [--endpoint URL] [--profile P] [--no-perms] [--json] [--no-progress] [--mpi]", \
	  "copy or mirror a tree between local folders, Stoker (stk://) and S3 (s3://BUCKET/PREFIX), resumably (docs/sync.md)") \
	X(checkpoint, cmd_checkpoint, "checkpoint resume LOCAL_DIR",                             \
	  "finish the uploads of local-first checkpoints a crash interrupted (docs/python.md)")  \
	X(version, cmd_version, "version", "print the version")

#define STK_CLI_DECL(name, fn, usage, what) int fn(int argc, char **argv);
STK_CLI_COMMANDS(STK_CLI_DECL)
#undef STK_CLI_DECL

/* `stoker bench loader ...` (bench_loader.c), dispatched from cmd_bench. */
int cmd_bench_loader(int argc, char **argv);

#define STOKER_VERSION STK_VERSION

/* Prints "stoker CMD: message" to stderr. */
void cli_err(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* s as a JSON string to f: quoted, with quotes, backslashes and control bytes
 * escaped (NULL as ""). */
void cli_json_str(FILE *f, const char *s);
/* Prints the usage line of a command to stderr and returns 2. */
int cli_usage(const char *cmd);
/* "mgmtd", "meta", "storage" for a STK_CLUSTER_ROLE_* value, "?" for another. */
const char *cli_role_name(int role);

/*
 * Splits a user path into a cluster address and a path inside it:
 * "stk://HOST:PORT/a/b" gives cluster "HOST:PORT" and "/a/b"; a plain "/a/b" or
 * "a/b" gives cluster NULL (the default) and "/a/b". path must hold 4097 bytes.
 */
int cli_split(const char *arg, char *cluster, size_t clen, char *path, size_t plen);

/*
 * Connects to the cluster an argument names (or the default). Keeps one client per
 * address for the life of the command: never stk_disconnect it (main's
 * cli_disconnect_all does, and a client disconnected twice hangs). Prints a clear
 * error and returns NULL on failure.
 */
stk_client *cli_connect(const char *cmd, const char *cluster);
void cli_disconnect_all(void);

/* Reads "key = value" lines from a config file and turns them into --key value args. */
int cli_config_args(const char *file, int *argc, char ***argv);

/*
 * Where a daemon serves /metrics by convention: its RPC port plus this (`stoker up`
 * gives mgmtd, meta and storage BASE+10, +11, +12); `stoker top` assumes it.
 */
#define STK_METRICS_PORT_OFFSET 10u

/* The folder `stoker up` records the local cluster in: /tmp/stoker-UID. */
void cli_runtime_dir(char *buf, size_t len);

#endif
