/*
 * Metrics of the FUSE daemon: `stoker mount -o metrics=HOST:PORT` serves
 * /metrics and /healthz, with the stoker_client_* families (frontend="fuse") per
 * file-system call, the process and host figures. See src/fuse/metrics.c.
 */
#ifndef STK_FUSE_METRICS_H
#define STK_FUSE_METRICS_H

#define FUSE_USE_VERSION 312

#include <fuse_lowlevel.h>
#include <stdint.h>

#include "stoker/stoker.h"

/* -o metrics=VAL: remembers the address. 0, or -EINVAL (empty or too long). */
int stk_fuse_metrics_opt(const char *val);

/*
 * In the daemon, before the session: starts the endpoint when -o metrics was
 * given and returns the table to hand to fuse_session_new, inner wrapped so that
 * every call is timed and counted; without -o metrics, inner itself. NULL after
 * printing why when the endpoint cannot start.
 */
const struct fuse_lowlevel_ops *stk_fuse_metrics_start(const struct fuse_lowlevel_ops *inner);
/*
 * With -o metrics, once connected: counts c's lookup cache (leases, stoker_ll.h) as
 * stoker_client_lookup_cache_total at every scrape. c must outlive the endpoint.
 */
void stk_fuse_metrics_cache(stk_client *c);
/* After the session loop: stops the endpoint. */
void stk_fuse_metrics_stop(void);

/*
 * Called where a reply is made, on the request's thread: the error replied
 * (0 or -errno) and the bytes a read handed back or a write took.
 */
void stk_fuse_metrics_error(int rc);
void stk_fuse_metrics_bytes(uint64_t n);

#endif
