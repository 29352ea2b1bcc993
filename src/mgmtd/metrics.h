/*
 * mgmtd's metrics: the cluster as mgmtd's state shows it (the stoker_cluster_*
 * families in common/metrics.h), set at scrape time from the state under
 * mgmtd's lock, so a scrape always sees one consistent version of it.
 *
 * Thread rules: create and destroy from mgmtd's main thread; the collector runs
 * on the scraping thread and takes *lock.
 */
#ifndef STK_MGMTD_METRICS_H
#define STK_MGMTD_METRICS_H

#include <pthread.h>

#include "state.h"

struct stk_mgmtd_metrics;

/*
 * Registers the collector over st, which *lock protects; both must outlive the
 * metrics. Takes *lock to note the routing version it starts from. 0 or -ENOMEM.
 */
int stk_mgmtd_metrics_create(pthread_mutex_t *lock, const struct stk_mgmt_state *st,
			     struct stk_mgmtd_metrics **out);
/* Removes the collector (waiting for a scrape in progress). NULL is fine. */
void stk_mgmtd_metrics_destroy(struct stk_mgmtd_metrics *mm);

#endif
