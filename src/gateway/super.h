/*
 * What `stoker gateway nfs` and `stoker gateway smb` share: a private Stoker
 * mount in the gateway's state folder, and a file server (ganesha.nfsd, smbd)
 * run in the foreground over it, supervised, restarted when it dies, and
 * stopped, with the mount, when the gateway stops.
 *
 * Stoker implements neither protocol: NFS-Ganesha and Samba do the protocol
 * work over a FUSE mount made for them (docs/nfs-smb.md says why this route).
 * The state folder holds everything the gateway writes: the server's
 * configuration, its logs, its runtime files, the mount point and a lock that
 * keeps a second gateway out of it.
 *
 * Threads: everything here runs on the gateway's main thread.
 */
#ifndef STK_GATEWAY_SUPER_H
#define STK_GATEWAY_SUPER_H

#include <limits.h>
#include <stdint.h>
#include <sys/types.h>

#include "stoker/stoker.h"

/* At most this many arguments and environment entries for a server. */
#define STK_GW_ARGS_MAX 24

struct stk_gw_super {
	const char *name; /* "nfs" or "smb", for messages and the log's name */
	char exe[PATH_MAX]; /* this stoker binary: runs `stoker mount` and `umount` */
	char state[PATH_MAX]; /* the state folder, absolute */
	char mnt[PATH_MAX]; /* STATE/mnt, the private mount */
	char server_log[PATH_MAX]; /* where the server's stdout and stderr go */
	char *argv[STK_GW_ARGS_MAX]; /* the server's command line, NULL-terminated */
	char *envp[STK_GW_ARGS_MAX]; /* "NAME=VALUE" added to its environment */
	char host[256]; /* where the server listens, to see it answer */
	uint16_t port;
	pid_t pid; /* the server, 0 when not running */
	unsigned restarts; /* times the server was restarted after dying */
	int lock_fd; /* STATE/gateway.lock, held while the gateway runs */
	int mounted; /* mnt is our mount */
};

/*
 * Makes the state folder (mode 0711) and takes its lock. Errors: -EBUSY (another
 * gateway runs on this folder), or the -errno of mkdir or open. On error the
 * reason is printed (prefix cmd).
 */
int stk_gw_state_open(struct stk_gw_super *s, const char *cmd, const char *state);

/*
 * 0 if a TCP server could bind host:port now, else -errno (-EADDRINUSE). The
 * check is made before anything starts so that a port in use gets one clear line.
 */
int stk_gw_port_free(const char *host, uint16_t port);

/*
 * Mounts folder `dir` of the cluster at address `addr` on s->mnt with `stoker
 * mount`, with the options a file server on it needs (allow_other, the kernel's
 * permission checks, no attribute caching in the kernel) plus `extra` (may be
 * NULL or ""). A dead mount left there by a gateway that was killed is cleared
 * first. Returns 0 or -EIO (`stoker mount` said why, on stderr).
 */
int stk_gw_mount(struct stk_gw_super *s, const char *addr, const char *dir, const char *extra);

/*
 * Starts the server (s->argv) and waits up to timeout_ms for it to accept on
 * s->host:s->port. Returns 0; -ECHILD if it exited first, -ETIMEDOUT if it never
 * answered (it is then stopped), or a fork error. The server's output goes to
 * s->server_log.
 */
int stk_gw_start(struct stk_gw_super *s, unsigned timeout_ms);

/*
 * Supervises until the gateway is asked to stop (SIGINT, SIGTERM): a server that
 * dies is logged and started again, after 1 s at first and up to 30 s when it
 * keeps dying. Returns 0 when asked to stop.
 */
int stk_gw_supervise(struct stk_gw_super *s);

/*
 * Stops the server (SIGTERM, then SIGKILL after 10 s) and unmounts s->mnt with
 * `stoker umount` (lazily if it is busy), then releases the lock. Safe on a
 * partly started gateway; idempotent.
 */
void stk_gw_stop(struct stk_gw_super *s);

/*
 * Validates a value written into a server's configuration file: printable, no
 * quote, backslash, brace, semicolon, '#' or newline, at most max bytes. 1 if ok.
 */
int stk_gw_conf_value_ok(const char *v, size_t max);

/* `stoker gateway nfs ...` (nfs.c); argv[0] is "nfs". Returns the exit status. */
int stk_gateway_nfs(int argc, char **argv);
/* `stoker gateway smb ...` (smb.c); argv[0] is "smb". Returns the exit status. */
int stk_gateway_smb(int argc, char **argv);

#endif
