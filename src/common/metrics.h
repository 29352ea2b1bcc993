/*
 * Metrics: counters, gauges and latency histograms, counted on the hot path
 * without a lock shared across threads, and served to Prometheus.
 *
 * Every metric family is declared once, in STK_METRICS_TABLE below: its name,
 * type, label names and help text. The exposition output, the reference in
 * docs/metrics.md (tests/unit/test_metrics --doc writes it, and the unit test
 * fails when the file disagrees) and the enum callers name families by all come
 * from that one table.
 *
 * A *series* is a family plus values for its labels (op="STOR_READ"). A caller
 * registers a series once, with stk_metric_series(), and keeps the handle it gets;
 * counting through a handle is then a few plain stores into memory that only the
 * calling thread writes:
 *
 *   - Each thread that counts gets a shard: a table of 64-bit slots, allocated in
 *     pages on first use and linked into a global list under the registry mutex,
 *     which is taken only then, when the thread exits and when a scrape reads.
 *   - stk_metric_add() adds to the calling thread's slot. Only that thread writes
 *     it; a scrape reads it with a relaxed atomic load, so the sum it sees is
 *     exact at some instant for each slot and never goes backwards.
 *   - When a thread exits, its slots are added into a "retired" table under the
 *     mutex and the shard unlinked in the same critical section, so a counter
 *     never drops across scrapes when connection threads come and go.
 *   - A scrape sums retired + every live shard, slot by slot.
 *
 * Gauges that are read rather than counted (capacity, the cluster's node count,
 * resident memory) are set at scrape time by *collectors*, callbacks registered
 * with stk_metrics_collector_add() that run just before the families are
 * written. A gauge may also be moved up and down with stk_metric_add() (requests
 * in flight): shards then hold signed deltas whose sum is the value.
 *
 * Histograms have fixed buckets in 1-2-5 steps from 10 us to 10 s (19 bounds and
 * +Inf), fine enough for p50/p95/p99 with histogram_quantile(); each bucket is a
 * slot, so an observation is one bucket search and two stores. `_count` is the
 * sum of the buckets of the same snapshot, so it always equals the +Inf bucket.
 *
 * Thread rules: every function here may be called from any thread. Handles stay
 * valid for the life of the process (series are never removed). A handle of 0 is
 * a series that counts nothing: callers with metrics off pass 0 or NULL and pay
 * one branch.
 *
 * For the FUSE daemon and the gateways: call stk_metrics_http_start()
 * (src/daemon/metrics_http.h) with the
 * address from your --metrics option, create a stk_metrics_ops set with
 * stk_metrics_ops_create("fuse", op_names, n, &ops), and bracket each operation
 * with stk_metrics_ops_begin()/stk_metrics_ops_end(). That gives the
 * stoker_client_* families below, process and host metrics, /metrics and /healthz.
 * See docs/metrics.md.
 */
#ifndef STK_METRICS_H
#define STK_METRICS_H

#include <stddef.h>
#include <stdint.h>

/*
 * The metric families: X(ID, TYPE, name, "label,names", "help").
 * TYPE is COUNTER, GAUGE or HISTOGRAM. Names follow Prometheus conventions:
 * stoker_ prefix, base units, _total on counters.
 */
#define STK_METRICS_TABLE(X)                                                                       \
	/* ---- every server: per RPC opcode (net/net.c counts around each handler) ---- */        \
	X(RPC_REQUESTS, COUNTER, "stoker_rpc_requests_total", "op",                                \
	  "RPC requests served, by opcode.")                                                       \
	X(RPC_ERRORS, COUNTER, "stoker_rpc_errors_total", "op,status",                             \
	  "RPC requests answered with an error, by opcode and wire status.")                       \
	X(RPC_RECEIVED_BYTES, COUNTER, "stoker_rpc_received_bytes_total", "op",                    \
	  "Bytes of RPC requests received: frame header, payload and bulk.")                       \
	X(RPC_SENT_BYTES, COUNTER, "stoker_rpc_sent_bytes_total", "op",                            \
	  "Bytes of RPC replies sent: frame header, payload and bulk.")                            \
	X(RPC_DURATION, HISTOGRAM, "stoker_rpc_duration_seconds", "op",                            \
	  "Time from a request fully received to its reply written to the socket.")                \
	X(RPC_INFLIGHT, GAUGE, "stoker_rpc_inflight_requests", "",                                 \
	  "RPC requests being handled now.")                                                       \
	X(RPC_CONNECTIONS, GAUGE, "stoker_rpc_connections", "", "Open client connections.")        \
	X(RPC_CONNECTIONS_OPENED, COUNTER, "stoker_rpc_connections_opened_total", "",              \
	  "Client connections accepted.")                                                          \
	X(AUTH_FAILURES, COUNTER, "stoker_auth_failures_total", "reason",                         \
	  "Connections closed for failing the cluster-key handshake, by reason: no_handshake "    \
	  "(a request before it), bad_proof (wrong key or replay, a forged client policy), "        \
	  "malformed, timeout, revoked (a removed client key); with TLS: tls_plaintext (a peer "   \
	  "without TLS), tls_handshake (wrong key, an edited client key, bad records).")             \
	X(CLIENT_REFUSED, COUNTER, "stoker_client_refused_total", "reason",                        \
	  "Requests of client-key connections refused by their policy (docs/security.md), by "    \
	  "reason: read_only, outside (outside the client's subtree), admin (an operator's "     \
	  "request).")                                                                              \
	X(STORAGE_VOUCHERS, COUNTER, "stoker_storage_vouchers_total", "result",                     \
	  "Chunk requests of subtree client keys by the voucher they carried (docs/security.md, "  \
	  "\"Vouchers\"): accepted (served without asking meta), none, stale (expired or of "      \
	  "another epoch: meta is asked), refused (forged, or not for the inode).")                \
	X(STORAGE_META_ASKS, COUNTER, "stoker_storage_meta_asks_total", "op",                      \
	  "Calls storage made to meta for subtree client keys, by op: within (META_WITHIN, "      \
	  "whether an inode is under a subtree), epoch (META_EPOCH, for vouchers: meta's epoch "   \
	  "and the files it moved since).")                                                        \
	/* ---- meta and storage: per client host (stk_metrics_ops_client) ---- */                 \
	X(RPC_CLIENT_REQUESTS, COUNTER, "stoker_rpc_client_requests_total", "client",              \
	  "RPC requests served, by client host (its IP address; the first 64 hosts seen, the "     \
	  "rest as \"other\").")                                                                   \
	X(RPC_CLIENT_RECEIVED_BYTES, COUNTER, "stoker_rpc_client_received_bytes_total", "client",  \
	  "Bytes of RPC requests received from each client host: frame header, payload, bulk.")    \
	X(RPC_CLIENT_SENT_BYTES, COUNTER, "stoker_rpc_client_sent_bytes_total", "client",          \
	  "Bytes of RPC replies sent to each client host (a storage node's reads show here).")     \
	/* ---- client-side daemons (mount, gateways): per file-system call or request ---- */     \
	X(CLIENT_OPS, COUNTER, "stoker_client_ops_total", "frontend,op",                           \
	  "Operations served by a client-side daemon, by frontend and operation.")                 \
	X(CLIENT_ERRORS, COUNTER, "stoker_client_errors_total", "frontend,op,error",               \
	  "Operations that failed, by frontend, operation and error (errno name).")                \
	X(CLIENT_READ_BYTES, COUNTER, "stoker_client_read_bytes_total", "frontend,op",             \
	  "Bytes handed back to callers (reads, downloads).")                                      \
	X(CLIENT_WRITE_BYTES, COUNTER, "stoker_client_write_bytes_total", "frontend,op",           \
	  "Bytes taken from callers (writes, uploads).")                                           \
	X(CLIENT_DURATION, HISTOGRAM, "stoker_client_op_duration_seconds", "frontend,op",          \
	  "Time each operation took, from its arrival to its reply.")                              \
	X(CLIENT_INFLIGHT, GAUGE, "stoker_client_inflight_ops", "frontend",                        \
	  "Operations being served now.")                                                          \
	X(CLIENT_CONNECTIONS, GAUGE, "stoker_client_connections", "frontend",                      \
	  "Open connections of a gateway's clients.")                                              \
	X(CLIENT_CONNECTIONS_OPENED, COUNTER, "stoker_client_connections_opened_total",            \
	  "frontend", "Connections a gateway accepted.")                                           \
	X(CLIENT_LOOKUP_CACHE, COUNTER, "stoker_client_lookup_cache_total", "frontend,result",      \
	  "The lookup cache: lookups it answered (result hit) or sent to meta (miss), the "        \
	  "folders and inodes meta revoked (revoked), and resets (reset: a watch broken or "       \
	  "reset, after which what that metadata shard leased goes).")                             \
	X(CLIENT_WRITE_BEHIND, COUNTER, "stoker_client_write_behind_total", "frontend,result",      \
	  "Write-behind of names in delegated folders: creates and unlinks answered by the "      \
	  "client (create, unlink), batches sent to meta (batch), and records meta refused "      \
	  "or that never reached it (failed).")                                                   \
	/* ---- meta: the leases of clients' lookup caches ---- */                                  \
	X(META_LEASE_HOLDERS, GAUGE, "stoker_meta_lease_holders", "",                              \
	  "Clients with a watch open for their lookup caches.")                                    \
	X(META_LEASES, GAUGE, "stoker_meta_leases", "",                                            \
	  "Leases on folders and inodes held by clients' lookup caches.")                          \
	X(META_LEASE_REVOCATIONS, COUNTER, "stoker_meta_lease_revocations_total", "",              \
	  "Leases revoked because their folder or inode changed.")                                 \
	X(META_LEASE_RESETS, COUNTER, "stoker_meta_lease_resets_total", "",                        \
	  "Clients whose leases all went at once: a revocation not acknowledged in time, or "      \
	  "too many waiting.")                                                                     \
	X(META_DELEGATIONS, GAUGE, "stoker_meta_delegations", "",                                  \
	  "Folders delegated to the client that made them, which answers creates and unlinks "     \
	  "in them itself.")                                                                       \
	X(META_DELEGATION_RECALLS, COUNTER, "stoker_meta_delegation_recalls_total", "",            \
	  "Delegated folders recalled because another client read or changed them.")               \
	/* ---- meta: replication of the shard (docs/meta-replication.md) ---- */                  \
	X(META_REPL_ROLE, GAUGE, "stoker_meta_repl_role", "",                                      \
	  "This meta node's part in the replicated shard: 0 no replication, 1 leader, "            \
	  "2 follower, 3 none yet (a spare, or its role not known yet).")                          \
	X(META_REPL_SEQ, GAUGE, "stoker_meta_repl_seq", "",                                        \
	  "Number of the last metadata change this meta node's store holds.")                      \
	X(META_REPL_LAG, GAUGE, "stoker_meta_repl_lag", "follower",                                \
	  "On the leader: changes a follower (its node id) has not acknowledged yet.")             \
	X(META_REPL_SNAPSHOTS, COUNTER, "stoker_meta_repl_snapshots_total", "",                    \
	  "Copies of the whole store this leader sent to followers that were new or too far "      \
	  "behind for the log it keeps.")                                                          \
	/* ---- meta: the purge of freed files' chunks ---- */                                   \
	X(META_PURGE_QUEUE, GAUGE, "stoker_meta_purge_queue", "",                                  \
	  "Freed files whose chunks meta has still to remove from storage.")                       \
	X(META_PURGED_FILES, COUNTER, "stoker_meta_purged_files_total", "",                        \
	  "Freed files whose chunks meta removed from every chain.")                               \
	X(META_PURGED_BYTES, COUNTER, "stoker_meta_purged_bytes_total", "",                        \
	  "The sizes of the files whose chunks meta removed.")                                     \
	X(META_INODES, GAUGE, "stoker_meta_inodes", "",                                            \
	  "Inodes in this meta node's store: its shard's files, folders and symbolic links "      \
	  "(on a follower, its copy's).")                                                          \
	/* ---- meta: quotas, per quota root (label: its path) ---- */                            \
	X(QUOTA_LIMIT_BYTES, GAUGE, "stoker_quota_limit_bytes", "quota",                           \
	  "The quota's limit on the bytes of its files (their sizes); 0: none.")                 \
	X(QUOTA_USED_BYTES, GAUGE, "stoker_quota_used_bytes", "quota",                             \
	  "Bytes the quota counts: the sizes of the files below its folder.")                    \
	X(QUOTA_RESERVED_BYTES, GAUGE, "stoker_quota_reserved_bytes", "quota",                     \
	  "Bytes reserved by writers in the quota and not yet reported as sizes.")               \
	X(QUOTA_LIMIT_INODES, GAUGE, "stoker_quota_limit_inodes", "quota",                         \
	  "The quota's limit on inodes; 0: none.")                                               \
	X(QUOTA_USED_INODES, GAUGE, "stoker_quota_used_inodes", "quota",                           \
	  "Inodes the quota counts, its folder included.")                                       \
	X(QUOTA_RESERVED_INODES, GAUGE, "stoker_quota_reserved_inodes", "quota",                   \
	  "Inodes set aside in the quota for mounts' own creates (allowances), not yet used.")   \
	/* ---- storage: per target ---- */                                                        \
	X(TARGET_CAPACITY, GAUGE, "stoker_target_capacity_bytes", "target",                        \
	  "Size of the file system under the target folder (targets sharing a file system "        \
	  "each report all of it: add up stoker_node_capacity_bytes instead).")                    \
	X(TARGET_USED, GAUGE, "stoker_target_used_bytes", "target",                                \
	  "Bytes used on the file system under the target folder.")                                \
	X(NODE_CAPACITY, GAUGE, "stoker_node_capacity_bytes", "",                                  \
	  "Size of the file systems under this storage node's targets, each file system "          \
	  "counted once however many targets it holds.")                                           \
	X(NODE_USED, GAUGE, "stoker_node_used_bytes", "",                                          \
	  "Bytes used on the file systems under this storage node's targets, each counted "        \
	  "once.")                                                                                 \
	X(TARGET_FREE, GAUGE, "stoker_target_free_bytes", "target",                                \
	  "Capacity minus used bytes of the target.")                                              \
	X(TARGET_CHUNKS, GAUGE, "stoker_target_chunks", "target", "Chunks stored on the target.")  \
	X(TARGET_READ_BYTES, COUNTER, "stoker_target_read_bytes_total", "target",                  \
	  "Bytes read from the target's chunks and sent to clients.")                              \
	X(TARGET_WRITE_BYTES, COUNTER, "stoker_target_write_bytes_total", "target",                \
	  "Bytes clients wrote into the target's chunks.")                                         \
	X(TARGET_READS, COUNTER, "stoker_target_reads_total", "target",                            \
	  "Chunk reads served by the target.")                                                     \
	X(TARGET_WRITES, COUNTER, "stoker_target_writes_total", "target",                          \
	  "Chunk writes served by the target.")                                                    \
	X(TARGET_IO_ERRORS, COUNTER, "stoker_target_io_errors_total", "target,op",                 \
	  "Chunk reads or writes that failed on the target (any error but a full disk).")          \
	X(TARGET_CHECKSUM_ERRORS, COUNTER, "stoker_target_checksum_errors_total", "target",        \
	  "Chunk blocks or headers found corrupt (checksum or consistency check failed).")         \
	X(TARGET_CHUNKS_REPAIRED, COUNTER, "stoker_target_chunks_repaired_total", "target",       \
	  "Damaged chunks rewritten from another replica of their chain.")                        \
	X(TARGET_SHORT_CIRCUIT_READS, COUNTER, "stoker_target_short_circuit_reads_total",        \
	  "target",                                                                                \
	  "Chunk reads that clients of this host made from the target's files themselves "        \
	  "(short-circuit reads), counted by them in the target's serve.count; not in "           \
	  "stoker_target_reads_total. Reset when the node restarts.")                             \
	X(TARGET_SHORT_CIRCUIT_BYTES, COUNTER, "stoker_target_short_circuit_read_bytes_total",   \
	  "target", "Bytes of the short-circuit reads of the target's chunks.")                    \
	X(TARGET_INFLIGHT, GAUGE, "stoker_target_inflight_requests", "target",                     \
	  "Chunk reads and writes in progress on the target (its queue depth).")                   \
	X(TARGET_IO_DURATION, HISTOGRAM, "stoker_target_io_duration_seconds", "target,op",         \
	  "Time a chunk read or write took on the target, disk and checksums included.")           \
	X(TARGET_RESYNC_CHECKED, COUNTER, "stoker_target_resync_checked_chunks_total", "target",   \
	  "Chunks of its predecessor's list a resyncing target compared with its own.")            \
	X(TARGET_RESYNC_CHUNKS, COUNTER, "stoker_target_resync_copied_chunks_total", "target",     \
	  "Chunks a resyncing target copied from its predecessor.")                                \
	X(TARGET_RESYNC_BYTES, COUNTER, "stoker_target_resync_copied_bytes_total", "target",       \
	  "Bytes a resyncing target copied from its predecessor (what --resync-rate limits).")     \
	X(TARGET_RESYNC_PROGRESS, GAUGE, "stoker_target_resync_progress_ratio", "target",          \
	  "How far the target's resync in progress is, 0 to 1 (an estimate); 0 when none runs.")   \
	X(DEVICE_SMART_HEALTHY, GAUGE, "stoker_device_smart_healthy", "target,device",             \
	  "1 if smartctl says the target's device passes its health check, else 0. Absent "        \
	  "when smartctl or the device's health is not available.")                                \
	X(DEVICE_TEMPERATURE, GAUGE, "stoker_device_temperature_celsius", "target,device",         \
	  "Temperature of the target's device, from smartctl. Absent when unknown.")               \
	X(DEVICE_WEAR, GAUGE, "stoker_device_wear_ratio", "target,device",                         \
	  "Share of the device's rated endurance used (NVMe percentage used / 100). Absent "       \
	  "when unknown.")                                                                         \
	X(DEVICE_MEDIA_ERRORS, COUNTER, "stoker_device_media_errors_total", "target,device",       \
	  "Media and data integrity errors the device reports (NVMe). Absent when unknown.")       \
	/* ---- storage: QoS, per tenant (docs/qos.md) ---- */                                     \
	X(QOS_THROTTLED, HISTOGRAM, "stoker_qos_throttled_seconds", "tenant",                      \
	  "How long the tenant's requests were held by its QoS limits at this node, one "          \
	  "observation per held request: _sum is the throttled time, _count the requests held.")   \
	X(QOS_REQUESTS, COUNTER, "stoker_qos_requests_total", "tenant",                            \
	  "Requests charged to a tenant's QoS limits at this node, held or not (tenant "           \
	  "\"@checkpoint\": to that class's limits, while a higher class is served).")             \
	X(QOS_HELD, GAUGE, "stoker_qos_held_requests", "",                                         \
	  "Requests held by QoS limits at this node now, waiting without a thread.")               \
	/* ---- storage: changes a successor has not taken (docs/architecture.md) ---- */          \
	X(NODE_UNSETTLED, GAUGE, "stoker_node_unsettled_changes", "",                              \
	  "Changes this node applied that its successor in their chain has not taken yet "         \
	  "(refused, or the forward failed): held pending, their reads sent to the tail, "         \
	  "and sent again with backoff until the successor takes them.")                           \
	X(NODE_UNSETTLED_OLDEST, GAUGE, "stoker_node_unsettled_oldest_seconds", "",                \
	  "Age of the oldest change in stoker_node_unsettled_changes; 0 when none is held.")       \
	X(NODE_UNSETTLED_CAPACITY, GAUGE, "stoker_node_unsettled_capacity", "",                    \
	  "How many unsettled changes the node can hold; at the limit, changes that would go "     \
	  "down a chain are refused (retryable) until some settle.")                               \
	X(NODE_SETTLE_RESENDS, COUNTER, "stoker_node_settle_resends_total", "",                    \
	  "Unsettled changes sent to a successor again by the node itself.")                       \
	X(NODE_SETTLE_FAILURES, COUNTER, "stoker_node_settle_failures_total", "",                  \
	  "Of stoker_node_settle_resends_total, those the successor did not take (each one "       \
	  "doubles that chain's wait before the next, up to 10 s).")                               \
	X(NODE_UNSETTLED_REFUSED, COUNTER, "stoker_node_unsettled_refused_total", "",              \
	  "Changes refused (EAGAIN, the client retries) because the node held as many "            \
	  "unsettled changes as it can.")                                                          \
	/* ---- mgmtd: the cluster ---- */                                                         \
	X(CLUSTER_NODES, GAUGE, "stoker_cluster_nodes", "role,state",                              \
	  "Nodes registered with mgmtd, by role and state.")                                       \
	X(CLUSTER_TARGETS, GAUGE, "stoker_cluster_targets", "state",                               \
	  "Storage targets registered with mgmtd, by state.")                                      \
	X(CLUSTER_CHAINS, GAUGE, "stoker_cluster_chains", "", "Chains in the chain table.")        \
	X(CLUSTER_ROUTING_VERSION, GAUGE, "stoker_cluster_routing_version", "",                    \
	  "Version of the routing table (chain table and shard map).")                             \
	X(CLUSTER_ROUTING_CHANGES, COUNTER, "stoker_cluster_routing_changes_total", "",            \
	  "Routing version bumps since this mgmtd started.")                                       \
	X(CLUSTER_CAPACITY, GAUGE, "stoker_cluster_capacity_bytes", "",                            \
	  "Capacity of all targets, as their nodes last reported it, each device counted once "    \
	  "however many targets of however many nodes share it.")                                  \
	X(CLUSTER_USED, GAUGE, "stoker_cluster_used_bytes", "",                                    \
	  "Used bytes of all targets, as their nodes last reported it, each device counted once.") \
	X(CLUSTER_AVAILABLE, GAUGE, "stoker_cluster_available_bytes", "",                          \
	  "Bytes that can still be written, each device counted once (what df on a mount shows).") \
	X(CLUSTER_NODE_ONLINE, GAUGE, "stoker_cluster_node_online", "node,role",                   \
	  "1 while the node heartbeats, 0 once mgmtd has marked it offline.")                      \
	X(CLUSTER_TARGET_SERVING, GAUGE, "stoker_cluster_target_serving", "target,node",           \
	  "1 while the target is serving, 0 when offline or full.")                                \
	X(CLUSTER_TARGET_STATE, GAUGE, "stoker_cluster_target_state", "target,node,state",         \
	  "1 for the state mgmtd has the target in (serving, offline, full, syncing or wiping), "   \
	  "0 for the others.")                                                                     \
	X(CLUSTER_TARGET_STATE_CHANGES, COUNTER, "stoker_cluster_target_state_changes_total",      \
	  "target,node", "Changes of the target's state since this mgmtd started (a target that "  \
	  "keeps going offline and coming back is flapping).")                                     \
	X(CLUSTER_TARGET_RESYNC_PROGRESS, GAUGE, "stoker_cluster_target_resync_progress_ratio",   \
	  "target,node", "How far a syncing target's copy is, 0 to 1, as its node last reported " \
	  "it; 0 when the target is not syncing.")                                                 \
	X(CLUSTER_TARGET_RESYNC_CHECKED, GAUGE, "stoker_cluster_target_resync_checked_chunks",    \
	  "target,node", "Chunks a syncing target's copy has compared so far, as its node last "  \
	  "reported it (a copy that starts over starts from 0); 0 when not syncing.")             \
	X(CLUSTER_CHAINS_BY_STATE, GAUGE, "stoker_cluster_chains_by_state", "state",               \
	  "Chains by health: healthy (every member serving), degraded (some member offline or "    \
	  "syncing, at least one serving) and unavailable (no member serving).")                   \
	X(CLUSTER_MOVES, COUNTER, "stoker_cluster_rebalance_moves_total", "event",                 \
	  "Chain memberships moved by the rebalancer and drains since this mgmtd leads: "          \
	  "started, finished (the new member serves, the old one left) and abandoned.")            \
	X(CLUSTER_MOVES_IN_FLIGHT, GAUGE, "stoker_cluster_rebalance_moves_in_flight", "",          \
	  "Chain memberships moving now (at most mgmtd's --rebalance-moves, or 1 for a drain).")   \
	X(CLUSTER_NODE_MEMBERS, GAUGE, "stoker_cluster_node_chain_members", "node",                \
	  "A storage node's targets that are a chain's member (the rebalancer evens out this "     \
	  "count over the node's targets).")                                                       \
	X(CLUSTER_NODE_DRAINING, GAUGE, "stoker_cluster_node_draining", "node",                    \
	  "1 while the storage node is draining (stoker admin drain-node), else 0.")               \
	X(CLUSTER_WIPED_CHUNKS, COUNTER, "stoker_cluster_wiped_chunks_total", "",                  \
	  "Stale chunks storage nodes removed from targets that left a chain, as they reported "   \
	  "it to this mgmtd.")                                                                     \
	X(CLUSTER_WIPED_BYTES, COUNTER, "stoker_cluster_wiped_bytes_total", "",                    \
	  "Bytes of the stale chunks storage nodes removed from targets that left a chain.")       \
	X(MGMTD_JOB_REPORTS, COUNTER, "stoker_mgmtd_job_reports_total", "result",                 \
	  "Training jobs' reports to the dashboard (POST /ui/api/jobs) by result: accepted, "      \
	  "malformed, too_many (one job more than mgmtd keeps), not_leader or unauthenticated "    \
	  "(not signed with the cluster key mgmtd holds).")                                        \
	X(MGMTD_JOBS, GAUGE, "stoker_mgmtd_jobs", "",                                              \
	  "Training jobs reporting to the dashboard now (those that missed three reports are "     \
	  "dropped).")                                                                             \
	/* ---- every process ---- */                                                              \
	X(BUILD_INFO, GAUGE, "stoker_build_info", "role,version",                                  \
	  "Always 1; the labels say which daemon and version this is.")                            \
	X(PROCESS_CPU, COUNTER, "stoker_process_cpu_seconds_total", "",                            \
	  "User and system CPU time the process used.")                                            \
	X(PROCESS_RSS, GAUGE, "stoker_process_resident_memory_bytes", "",                          \
	  "Resident memory of the process.")                                                       \
	X(PROCESS_FDS, GAUGE, "stoker_process_open_fds", "", "Open file descriptors.")             \
	X(PROCESS_MAX_FDS, GAUGE, "stoker_process_max_fds", "", "Limit on open file descriptors.") \
	X(PROCESS_THREADS, GAUGE, "stoker_process_threads", "", "Threads of the process.")         \
	X(PROCESS_START, GAUGE, "stoker_process_start_time_seconds", "",                           \
	  "When the process started, in seconds since the Unix epoch.")                            \
	X(PROCESS_LOOP_CALLBACK, HISTOGRAM, "stoker_process_loop_callback_seconds", "loop",        \
	  "Time one callback held an event-loop thread (what that loop's next iteration waited).") \
	X(PROCESS_LOOP_REQUESTS, COUNTER, "stoker_process_loop_requests_total", "loop",           \
	  "Requests an event loop answered itself, without a worker thread (storage: reads of "    \
	  "open chunks, through io_uring; meta: lookups and attributes).")                         \
	/* ---- the host's network (/proc/net/snmp, /proc/net/netstat) ---- */                     \
	X(HOST_TCP_SENT, COUNTER, "stoker_host_tcp_sent_segments_total", "",                       \
	  "TCP segments the host sent (Tcp OutSegs): over it, "                                    \
	  "stoker_host_tcp_retransmitted_segments_total is the share of segments lost.")           \
	X(HOST_TCP_RETRANS, COUNTER, "stoker_host_tcp_retransmitted_segments_total", "",           \
	  "TCP segments the host retransmitted (Tcp RetransSegs).")                                \
	X(HOST_TCP_IN_ERRORS, COUNTER, "stoker_host_tcp_in_errors_total", "",                      \
	  "TCP segments the host received in error (Tcp InErrs).")                                 \
	X(HOST_TCP_DROPS, COUNTER, "stoker_host_tcp_drops_total", "reason",                        \
	  "TCP connections or segments the host dropped: listen queue overflows and drops, "       \
	  "backlog drops (TcpExt).")

enum stk_metric_type { STK_METRIC_COUNTER, STK_METRIC_GAUGE, STK_METRIC_HISTOGRAM };

enum stk_metric_family {
#define STK_METRIC_ENUM(id, type, name, labels, help) STK_M_##id,
	STK_METRICS_TABLE(STK_METRIC_ENUM)
#undef STK_METRIC_ENUM
	    STK_M__COUNT
};

/* Histogram bounds: 1-2-5 steps from 10 us to 10 s, then +Inf. */
#define STK_METRIC_BUCKETS 19

/* A series handle; 0 counts nothing. */
typedef uint32_t stk_metric_t;

/*
 * Finds or creates the series of family f whose labels have the given values, in
 * the order of the family's label names (values may be NULL for a family without
 * labels). Values are escaped as the text format requires. Takes the registry
 * mutex: call it at setup, not per request. 0, -EINVAL (a value is missing or f
 * out of range), -ENOSPC (too many series) or -ENOMEM; *out is then 0.
 */
int stk_metric_series(enum stk_metric_family f, const char *const *values, stk_metric_t *out);

/* Adds delta (negative only for gauges) to the calling thread's shard. */
void stk_metric_add(stk_metric_t s, int64_t delta);
/* Records one observation of ns nanoseconds in a histogram series. */
void stk_metric_observe_ns(stk_metric_t s, uint64_t ns);
/*
 * Sets a gauge (or a counter read from elsewhere, such as /proc) to v. The value
 * shown is the set value plus whatever stk_metric_add() added. set_int keeps all 64
 * bits of an integer (routing versions).
 */
void stk_metric_set(stk_metric_t s, double v);
void stk_metric_set_int(stk_metric_t s, int64_t v);

/*
 * Hides a series from the exposition (hidden 1) or shows it again (0); a family
 * with every series hidden is left out. For figures that can become unknown after
 * being known (a device's health once smartctl stops answering): series are never
 * removed, and a stale value must not stand in for "unknown". Counting and setting
 * go on while hidden; show the series again only after setting a fresh value.
 */
void stk_metric_hide(stk_metric_t s, int hidden);

/*
 * Collectors: fn(ctx) runs at every scrape, before the families are written, on
 * the scraping thread, one scrape at a time. It sets gauges and may register
 * series. _add: 0 or -ENOMEM. _remove waits for a scrape in progress to finish, so
 * that ctx may be freed when it returns.
 */
typedef void (*stk_metrics_collect_fn)(void *ctx);
int stk_metrics_collector_add(stk_metrics_collect_fn fn, void *ctx);
void stk_metrics_collector_remove(stk_metrics_collect_fn fn, void *ctx);

/*
 * The Prometheus text exposition (format 0.0.4) of every family that has series,
 * after running the collectors. *out is malloc'ed, NUL-terminated, owned by the
 * caller. 0 or -ENOMEM.
 */
int stk_metrics_render(char **out, size_t *len);

/* The reference table of every family, in Markdown (for docs/metrics.md). 0 or -ENOMEM. */
int stk_metrics_doc(char **out, size_t *len);

/* ---- per-operation counting ---- */

/*
 * A set of operations counted together: requests, errors by kind, bytes in and
 * out, a latency histogram per operation, requests in flight and connections.
 * Series are registered when the set is created, so they show from the start.
 */
struct stk_metrics_ops;

/*
 * For an RPC server: operations are wire opcodes (stoker_rpc_* families), named
 * by the opcode table, errors by wire status. Opcodes of the table in [lo, hi] are
 * registered now, any other on first use. 0 or -ENOMEM.
 */
int stk_metrics_rpc_create(uint16_t lo, uint16_t hi, struct stk_metrics_ops **out);

/*
 * For a client-side daemon (stoker_client_* families, label frontend="fuse"):
 * operations are 0..nops-1, named ops[i] (copied). Errors are named by errno
 * ("ENOENT"). 0, -EINVAL or -ENOMEM.
 */
int stk_metrics_ops_create(const char *frontend, const char *const *ops, unsigned nops,
			   struct stk_metrics_ops **out);

/* Frees the set; nothing may be counting through it any more. NULL is fine. */
void stk_metrics_ops_destroy(struct stk_metrics_ops *m);

/*
 * Brackets one operation: _begin counts it in flight and returns the start time
 * to give to _end. _end records it: err is 0 or -errno, in_bytes what the caller
 * sent (request bytes, data written), out_bytes what it got back. m may be NULL
 * (then both do nothing). An op out of range is counted as op 0 for RPC
 * ("UNKNOWN") and dropped otherwise.
 */
uint64_t stk_metrics_ops_begin(struct stk_metrics_ops *m, unsigned op);
void stk_metrics_ops_end(struct stk_metrics_ops *m, unsigned op, uint64_t t0, int err,
			 uint64_t in_bytes, uint64_t out_bytes);
/*
 * _end in two steps, for a server: _answered counts the request, its bytes and its
 * error before the reply goes (so whoever got the reply and scrapes next sees it),
 * _sent records its duration and takes it out of flight once the reply is written.
 */
void stk_metrics_ops_answered(struct stk_metrics_ops *m, unsigned op, int err,
			      uint64_t in_bytes, uint64_t out_bytes);
void stk_metrics_ops_sent(struct stk_metrics_ops *m, unsigned op, uint64_t t0);

/* A connection opened (+1) or closed (-1). m may be NULL. */
void stk_metrics_ops_conn(struct stk_metrics_ops *m, int delta);

/* Client hosts an RPC set names in the stoker_rpc_client_* families; the rest are "other". */
#define STK_METRICS_MAX_CLIENTS 64

/*
 * Counts one request of an RPC set by client host: peer is the "HOST:PORT" (or
 * "[V6]:PORT") of the connection, as net.h gives it to handlers, and the series
 * are labelled with HOST. The first STK_METRICS_MAX_CLIENTS hosts seen get series
 * of their own, kept for the life of the process; later ones are added into
 * client="other", so a port scan cannot grow the exposition without bound.
 * in_bytes and out_bytes are the request's and the reply's sizes as net.c counts
 * them. Hot path: a compare with the calling thread's last peer and stores into
 * its own slots; the first request of a new host takes a mutex once (never
 * after the table is full). m NULL or a client-side set: nothing.
 */
void stk_metrics_ops_client(struct stk_metrics_ops *m, const char *peer, uint64_t in_bytes,
			    uint64_t out_bytes);

#endif
