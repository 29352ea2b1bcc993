/*
 * Storage metrics: what a storage node reports about each of its targets (see
 * the stoker_target_* and stoker_device_* families in common/metrics.h).
 *
 * Counted on the request path: reads and writes, their bytes, failures, latency
 * and how many are in progress (the target's queue depth), through
 * stk_storage_metrics_begin()/_end() around each chunk operation. Read at scrape
 * time: capacity, used and free bytes, chunk count and checksum errors, from the
 * chunk store. Device health: a background thread asks `smartctl --json` about
 * each target's block device every few minutes when smartctl is installed and the
 * target sits on a real device; until an answer comes, and forever where none
 * can, the stoker_device_* series do not exist (absent, never a false zero), and
 * when a later round gets no answer they are hidden again (never a stale value).
 *
 * Thread rules: begin/end from any request thread; create and destroy from the
 * daemon's main thread, destroy only once no request can be counting.
 */
#ifndef STK_STORAGE_METRICS_H
#define STK_STORAGE_METRICS_H

#include <stdint.h>

struct stk_chunk_store;
struct stk_storage_metrics;

enum stk_target_op { STK_TARGET_READ = 0, STK_TARGET_WRITE = 1 };

/*
 * Registers the series of every store (whose target ids must be set by now) and
 * the scrape-time collector, and starts the SMART thread if smartctl exists. The
 * stores must outlive the metrics. 0 or -ENOMEM.
 */
int stk_storage_metrics_create(struct stk_chunk_store *const *stores, unsigned n,
			       struct stk_storage_metrics **out);
/*
 * Exports the short-circuit reads counted in the serve map of cs's target
 * (stoker_target_short_circuit_*), read at scrape time. map may be NULL (the
 * series stay 0); it must outlive the metrics. From the daemon's main thread,
 * before requests are counted.
 */
struct stk_serve_map;
void stk_storage_metrics_serve_map(struct stk_storage_metrics *m, const struct stk_chunk_store *cs,
				   const struct stk_serve_map *map);
/* Stops the SMART thread and the collector. NULL is fine. */
void stk_storage_metrics_destroy(struct stk_storage_metrics *m);

/* Counts a chunk operation on cs in flight; returns the start time for _end. m may be NULL. */
uint64_t stk_storage_metrics_begin(struct stk_storage_metrics *m, const struct stk_chunk_store *cs);
/*
 * Records it: rc is the operation's result (bytes or 0 on success, -errno on
 * failure; a full disk is not an I/O error), bytes the data moved on success.
 */
void stk_storage_metrics_end(struct stk_storage_metrics *m, const struct stk_chunk_store *cs,
			     enum stk_target_op op, uint64_t t0, long rc, uint64_t bytes);

/*
 * Counts a resync's work on cs's target since the last call (chunks compared,
 * chunks and bytes copied) and sets its progress (0..1; 0 once none runs). From
 * the resync thread. m may be NULL.
 */
void stk_storage_metrics_resync(struct stk_storage_metrics *m, const struct stk_chunk_store *cs,
				uint64_t checked, uint64_t copied, uint64_t bytes, double progress);
/* What smartctl --json said about a device; has_* say which figures it gave. */
struct stk_smart {
	int has_passed, passed;
	int has_temp;
	double temp_c;
	int has_wear;
	double wear; /* 0..1 (and above, past the rated endurance) */
	int has_media_errors;
	uint64_t media_errors;
};

/* Reads the figures above out of smartctl's JSON. 0, or -ENOENT if it holds none. */
int stk_smart_parse(const char *json, struct stk_smart *out);

/*
 * What the SMART checker does with one answer about target i (in the order the
 * stores were given to create) on device (kept the first time; NULL keeps the one
 * found at create): shows and sets the figures s has, hides those it lacks, and
 * with s NULL (smartctl failed or said nothing usable) hides every
 * stoker_device_* series of the target, so that a value once known never stands
 * in for "unknown". The checker thread calls it; tests call it on metrics created
 * with STOKER_SMARTCTL="" (no checker thread). 0, or -EINVAL (i out of range, no
 * device).
 */
int stk_storage_metrics_smart_apply(struct stk_storage_metrics *m, unsigned i, const char *device,
				    const struct stk_smart *s);

#endif
