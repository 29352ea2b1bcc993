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
	/*
	 * --resync-rate: bytes a second that a resync (a returning target catching up
	 * with its chain) fetches at most; 0: STK_STORAGE_RESYNC_RATE; below 0: no limit.
	 */
	int64_t resync_rate;
};

/*
 * The default resync rate, 256 MiB/s: a tenth or so of what one data-centre NVMe
 * drive reads (2-7 GB/s) and a fifth of a 10 Gb/s link, so that the reads of a
 * training job on the source keep most of both, while a resync still moves about
 * 900 GiB an hour (docs/architecture.md, "Replication").
 */
#define STK_STORAGE_RESYNC_RATE (256ull << 20)

/* Serves until SIGINT/SIGTERM. 0 or -errno (logged). */
int stk_storage_run(const struct stk_storage_opts *opts);

#endif
