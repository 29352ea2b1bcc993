/*
 * Host and device identity, and the cluster's free space counted once per device.
 *
 * A *host id* says which machine (and which network namespace on it) a process runs
 * on. Every meta and storage node reports its own at registration and with each
 * heartbeat; mgmtd carries it in the routing table's node entries; a client reads a
 * storage node's chunk files itself (short-circuit reads) only when that node's
 * host id equals its own. Addresses cannot tell this: on one machine every
 * 127.0.0.0/8 address is "here", although each such node may be down while the
 * client's read goes on from its files. The default is the machine id
 * (/etc/machine-id, or the boot id where there is none) and the inode of the
 * network namespace, "MACHINE:NETNS", so that nodes in separate namespaces count
 * as separate hosts. A setting overrides it (`--host-id` or config `host-id` for
 * daemons, STOKER_HOST_ID for clients): tests give nodes on one machine distinct
 * hosts that way.
 *
 * A *device id* names the file system a target folder lives on, the same from every
 * node of one machine: a hash of the machine id (not the overridable host id, nor
 * the namespace: nodes made distinct hosts on one machine still share its disks),
 * the folder's st_dev and its file system's fsid. Figures summed over targets
 * (statfs on a mount, `stoker status` totals, mgmtd's cluster metrics) count each
 * device once, through stk_host_space_sum().
 *
 * All functions are thread-safe.
 */
#ifndef STK_HOST_H
#define STK_HOST_H

#include <stddef.h>
#include <stdint.h>

#include "../proto/msg.h"

/*
 * This process's host id into out (len >= STK_HOST_ID_MAX): `override` when it is
 * not NULL or empty, else the default above. 0, or -EINVAL when the override is
 * longer than STK_HOST_ID_MAX - 1 bytes or holds a byte that is not printable
 * ASCII or is a space.
 */
int stk_host_id(const char *override, char *out, size_t len);

/*
 * The figures of the file system holding `path`, as statvfs gives them: capacity
 * (f_blocks), used (f_blocks - f_bfree), avail (f_bavail, what an unprivileged
 * writer can still use), and its device id (never 0). 0 or -errno.
 */
int stk_host_fs_space(const char *path, uint64_t *capacity, uint64_t *used, uint64_t *avail,
		      uint64_t *dev);

/* Space summed over targets, each device once. */
struct stk_space {
	uint64_t capacity;
	uint64_t used;
	uint64_t avail; /* what can still be written */
	uint32_t devices; /* distinct devices counted */
};

/*
 * Sums the figures of n targets into *out, counting each device (rt_target.dev)
 * once: a device's capacity and used are the largest that any of its targets
 * reported, its avail the smallest (targets report at different instants). A
 * target of unknown device (dev 0: not yet heartbeated since mgmtd restarted)
 * counts as a device of its own, with avail = capacity - used. Every target
 * counts, whatever its state. 0 or -ENOMEM (*out then zero).
 */
int stk_host_space_sum(const struct stk_rt_target *t, uint32_t n, struct stk_space *out);

#endif
