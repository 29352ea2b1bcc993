/*
 * storage, the data service: serves chunks on its targets (one folder per NVMe
 * device). Requests name a chain; the node serves the chains whose head target it
 * holds (chain replication beyond length 1 comes later behind the same opcodes).
 */
#ifndef STK_STORAGE_H
#define STK_STORAGE_H

#include <stddef.h>
#include <stdint.h>

struct stk_storage_opts {
	size_t size; /* sizeof(struct stk_storage_opts) */
	const char *listen; /* "HOST:PORT" */
	const char *mgmtd; /* "HOST:PORT" of mgmtd */
	const char *data_dir; /* node state (node id) lives here */
	const char **targets; /* target folders; created if missing */
	unsigned ntargets;
	const char *metrics_listen; /* "HOST:PORT" for GET /metrics, or NULL for none */
	const char *host_id; /* --host-id: the host id to report, NULL for this host's */
	const char *zone; /* --zone: its failure domain, NULL for its host id */
	uint64_t scrub_rate; /* --scrub-rate: bytes/s the scrubber reads; 0: no scrubbing */
	uint64_t scrub_interval_s; /* --scrub-interval: seconds from one pass to the next */
};

/* Serves until SIGINT/SIGTERM. 0 or -errno (logged). */
int stk_storage_run(const struct stk_storage_opts *opts);

#endif
