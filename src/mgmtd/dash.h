/*
 * mgmtd's web dashboard (docs/dashboard.md): a page at http://METRICS/ui and the
 * JSON it reads under /ui/api/, served from mgmtd's metrics endpoint.
 *
 * The page is plain HTML, CSS and JavaScript from src/mgmtd/ui/, embedded into the
 * binary at build time (ui_assets.h), so it loads with no network but mgmtd's. The
 * data: the cluster as mgmtd's state has it (nodes, targets, chains, capacity),
 * read under mgmtd's lock at each request, and what a sampler thread gathers
 * every interval from the meta and storage nodes' /metrics (at their RPC port + 10,
 * the convention `stoker up` and `stoker top` follow): throughput, IOPS, latency
 * percentiles, per-client traffic, disk health and TCP retransmits. The sampler
 * keeps a short history (STK_MGMTD_DASH_POINTS samples) from which the charts and
 * the fill forecast come, and evaluates the alerts.
 *
 * Read-only: nothing under /ui changes the cluster, and the endpoint serves only
 * GET and HEAD, but for POST /ui/api/jobs, the training jobs' reports (jobs.h),
 * which change only the jobs table in memory. Only the leading mgmtd samples and
 * takes reports; a follower answers that it follows and where the leader's
 * dashboard is.
 *
 * Thread rules: create, start and destroy from mgmtd's main thread (the daemon's
 * hooks); the route runs on the metrics endpoint's thread, the sampler on its own.
 */
#ifndef STK_MGMTD_DASH_H
#define STK_MGMTD_DASH_H

#include <pthread.h>

#include "state.h"

struct stk_metrics_http;
struct stk_mgmtd_dash;

/* Samples kept: an hour at the default interval. */
#define STK_MGMTD_DASH_POINTS 360
/* The default interval between samples (mgmtd --ui-interval-ms). */
#define STK_MGMTD_DASH_INTERVAL_MS 10000u

/* What the dashboard reads of mgmtd; every pointer is read under *lock. */
struct stk_mgmtd_dash_src {
	pthread_mutex_t *lock;
	const struct stk_mgmt_state *st;
	const int *leading; /* 1 while this mgmtd leads */
	const char *leader; /* the leader's RPC address, "" when not known */
	int cluster_mode;   /* 1 with etcd (several mgmtd), for the page */
};

/*
 * Serves /ui from http (stk_metrics_http_route) over src, which must outlive the
 * dashboard; interval_ms between samples (0: STK_MGMTD_DASH_INTERVAL_MS; at least
 * 100). Samples nothing until stk_mgmtd_dash_start(). 0, -ENOMEM, -EBUSY (the
 * endpoint has a route already) or -errno.
 */
int stk_mgmtd_dash_create(const struct stk_mgmtd_dash_src *src, unsigned interval_ms,
			  struct stk_metrics_http *http, struct stk_mgmtd_dash **out);

/*
 * Takes the dashboard's charts from the Prometheus server at url ("http://HOST:PORT",
 * copied) while it answers: each sampler round asks its query API for the last
 * STK_MGMTD_DASH_POINTS intervals of the same figures the ring holds. Before
 * stk_mgmtd_dash_start(). 0, -EINVAL (not an http(s) URL) or -ENOMEM.
 */
int stk_mgmtd_dash_prometheus(struct stk_mgmtd_dash *d, const char *url);

/*
 * Starts the sampler thread; self is this mgmtd's RPC address (copied). Must not
 * be called with *src->lock held. 0 or -errno (the thread could not start).
 */
int stk_mgmtd_dash_start(struct stk_mgmtd_dash *d, const char *self);

/*
 * Stops the sampler (waiting for a scrape in progress, at most a few seconds) and
 * frees the dashboard. The metrics endpoint must no longer serve (its route
 * points here). NULL is fine.
 */
void stk_mgmtd_dash_destroy(struct stk_mgmtd_dash *d);

#endif
