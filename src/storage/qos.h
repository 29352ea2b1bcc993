/*
 * QoS at a storage node (docs/qos.md): limits of bytes read, bytes written and
 * requests per second for each tenant (a client key's name), enforced by token
 * buckets, and a timer that holds a throttled request without a thread.
 *
 * A request of a limited tenant is charged when it arrives (stk_qos_charge): its
 * cost comes out of the tenant's buckets, which may go into debt; the debt over
 * the rate is how long the request must wait. A request that must wait is taken
 * from its worker (net.h, stk_rpc_pending_take) and parked here
 * (stk_qos_park); the timer thread hands it back to the workers when its time
 * comes (stk_rpc_pending_requeue), and the worker serves it then, uncharged
 * (req->requeued). So a throttled tenant holds no event loop and no worker while it
 * waits, and the node's thread count does not move with the number waiting.
 *
 * The policy is process-wide, set by the routing agent whenever mgmtd's list
 * changes (stk_qos_policy_set); a change applies to the next request of every
 * live connection. Limits are per storage node: a tenant reading from N nodes
 * may get up to N times its limit in all.
 *
 * Thread rules: every function may be called from any thread.
 */
#ifndef STK_STORAGE_QOS_H
#define STK_STORAGE_QOS_H

#include <stdint.h>

#include "../proto/msg.h"

struct stk_rpc_pending;

/* Replaces the policy (n records; n 0: no limits). 0 or -EINVAL (n too big). */
int stk_qos_policy_set(const struct stk_msg_qos_rec *list, uint32_t n);

/*
 * Priority classes (wire.h STK_FRAME_CLASS_*): cls is a request's class as
 * marked, 0 default, 1 training-read, 2 checkpoint (rank, highest first:
 * training-read, default, checkpoint). stk_qos_seen: a request of class cls
 * arrives on a client key's connection (the cluster key's, daemons' forwards
 * included, take no part in QoS): a class's own limits hold while a higher class
 * was seen in the last STK_QOS_BUSY_NS. Cheap when no class has limits.
 */
#define STK_QOS_BUSY_NS 100000000ull
void stk_qos_seen(unsigned cls);

/*
 * 1 when a request of tenant (NULL: a connection with the cluster key, never
 * limited) of class cls may be held at this node, so it must go to the workers.
 */
int stk_qos_limited(const char *tenant, unsigned cls);

/*
 * Charges one request of tenant (NULL: none, never held) marked class cls (above
 * STK_QOS_CLASS_LOWEST: none, for requests other than reads and writes), seen
 * as its class after the tenant's cap (stk_qos_seen): bytes
 * read (write 0) or written (write 1), and one request, to the tenant's buckets
 * and, while a higher class is busy, to those of its class (capped by the
 * tenant's max_class). Returns the nanoseconds it must wait before it is served
 * (0: now).
 */
uint64_t stk_qos_charge(const char *tenant, unsigned cls, int write, uint64_t bytes);

/*
 * Starts the timer thread (0 or -errno), and stops it: every request parked is
 * handed back to the workers at once (a stopping server answers it ESHUTDOWN).
 */
int stk_qos_start(void);
void stk_qos_stop(void);

/*
 * Parks p (a request taken with stk_rpc_pending_take) for wait_ns, then hands it
 * back to the workers. 0, or -ENOMEM / -ESHUTDOWN (not parked: serve it now).
 */
int stk_qos_park(struct stk_rpc_pending *p, uint64_t wait_ns);

#endif
