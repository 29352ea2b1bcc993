/*
 * Internals of libstoker shared by its files: the client handle, the RPC helpers
 * that add routing, retries and error translation on top of the transport, and
 * the striped I/O engine.
 *
 * client.c     connecting, the routing table, calls to mgmtd and meta
 * cluster.c    the public cluster status: mgmtd's routing table as a snapshot
 * namespace.c  path resolution and the path operations
 * file.c       open files: buffering, read, write, fsync, truncate
 * io.c         one striped read or write fanned out over chains in parallel
 * reaper.c     the chunks of removed files, removed in the background
 */
#ifndef STK_CLIENT_INTERNAL_H
#define STK_CLIENT_INTERNAL_H

#include <pthread.h>
#include <stdint.h>

#include "stoker/stoker.h"

#include "../net/mgmtaddr.h"
#include "../net/net.h"
#include "../proto/msg.h"
#include "../proto/wire.h"

/* A target of this machine the client reads directly (short-circuit reads). */
#define STK_MAX_LOCAL_TARGETS 64
struct stk_local_target {
	uint32_t id;
	struct stk_chunk_store *cs; /* NULL: tried, not readable from here */
	/*
	 * Atomic: the node's serve map of the target (chunk/servemap.h), without which
	 * nothing is read locally; NULL while none could be opened. Replaced, under
	 * local_lock, by one a new start of the node made; the one replaced stays
	 * mapped (gone_maps) until the client is freed, as a reader may still use it.
	 */
	struct stk_serve_map *map;
	uint64_t map_retry_ns; /* atomic: stk_now_ns() before which no new map is looked for */
};

/* A serve map replaced while readers may still hold it (stk_local_target). */
struct stk_gone_map {
	struct stk_gone_map *next;
	struct stk_serve_map *map;
};

/*
 * What became of the reads of chunks of a local target: read locally (and the
 * bytes), or sent over the network, and why (io.c, local_read).
 */
enum stk_sc_stat {
	STK_SC_READS,	    /* read from the chunk file */
	STK_SC_BYTES,	    /* their bytes */
	STK_SC_NO_MAP,	    /* the node's serve map is missing or unreadable */
	STK_SC_RETIRED,	    /* the node stopped, or restarted (a new map is looked for) */
	STK_SC_EXPIRED,	    /* the node's validity ran out: silent or fenced */
	STK_SC_NOT_SERVING, /* the node does not serve the target now */
	STK_SC_STALE,	    /* the chain's version differs from the node's */
	STK_SC_PENDING,	    /* a change of the chunk is on its way down */
	STK_SC_CHANGED,	    /* the node's state or the chunk changed during the read */
	STK_SC_FAILED,	    /* the local read failed (checksum, I/O) */
	STK_SC__COUNT
};

struct stk_client {
	char mgmtd[STK_MGMT_LIST_MAX]; /* every mgmtd, "HOST:PORT[,HOST:PORT...]" */
	pthread_mutex_t mgmt_lock;     /* protects mgmt and mgmt_conn */
	struct stk_mgmt_addrs mgmt;    /* the list, following the leader (net/mgmtaddr.h) */
	struct stk_conn *mgmt_conn;    /* to the mgmtd last used */
	struct stk_pool *pool;
	/* calls to a storage node gone offline are aborted (io.c, stk_client_node_gone) */
	struct stk_callwatch *watch;
	uint64_t watch_refreshed_ns; /* the watch's last table refresh (its thread's) */
	struct stk_client_opts opts;
	struct stk_cred cred;
	/*
	 * Bumped when meta forgot this session (a restart): the room handles reserved
	 * before is gone, and each asks again before its next write past its size.
	 */
	_Atomic uint32_t quota_epoch;
	unsigned retry_ms; /* how long transport failures are retried before -EIO */
	pthread_rwlock_t rt_lock; /* protects rt */
	struct stk_routing rt;
	int short_circuit; /* STOKER_SHORT_CIRCUIT=0 turns local chunk reads off */
	uint32_t qos_flags; /* frame flags of its chunk requests: its QoS class */
	/*
	 * This client's host id (STOKER_HOST_ID, else this host's; common/host.h): it
	 * reads a target's chunk files itself only when the target's node is ONLINE
	 * with this same host id.
	 */
	char host_id[STK_HOST_ID_MAX];
	/*
	 * Sequential readers read local chunks past the page cache (STK_READ_STREAM).
	 * Set by the mount, whose kernel caches what it reads, before its first read;
	 * a library client reads through the page cache, its only cache.
	 */
	int direct_streams;
	/*
	 * The targets of this machine met so far. Entries are only added, under
	 * local_lock, each published by a release store of nlocals; readers scan the
	 * first nlocals (acquire load) without the lock. Past STK_MAX_LOCAL_TARGETS
	 * targets, the others are read over the network.
	 */
	pthread_mutex_t local_lock;
	struct stk_local_target locals[STK_MAX_LOCAL_TARGETS];
	unsigned nlocals;
	struct stk_gone_map *gone_maps; /* under local_lock */
	uint64_t sc_stats[STK_SC__COUNT]; /* atomic: enum stk_sc_stat */
	struct stk_session *sess; /* the session with meta (session.c) */
	/*
	 * Atomic: bit k - 1 set once a request went to shard k (client.c, meta_call):
	 * the shards the session is renewed on and ended at (docs/meta-shards.md).
	 * Shard 1 is always one of them.
	 */
	_Atomic uint32_t shards_used;
	struct stk_reaper *reaper; /* background removal of gone files' chunks (reaper.c) */
	/*
	 * The namespace identity of the meta at meta_ns_addr, which chunk removals carry
	 * (stk_client_meta_ns); both under rt_lock. Zero until first asked.
	 */
	struct stk_ns_id meta_ns;
	char meta_ns_addr[STK_ADDR_MAX];
	int meta_purges; /* that meta removes the chunks of files it frees (STK_STATFS_PURGES) */
	struct stk_lcache *lc; /* the lookup cache (lcache.c), NULL when off */
	struct stk_behind *behind; /* write-behind of names (behind.c), NULL when off */
	/* meta's vouchers (vouch.h), NULL unless the client holds a client key */
	struct stk_vouches *vouches;
};

/* "stk://HOST:PORT[/...]" or "HOST:PORT" to "HOST:PORT". 0 or -EINVAL. */
int stk_client_parse_cluster(const char *s, char *addr, size_t len);
/* $STOKER_CLUSTER, else the cluster `stoker up` recorded. 0, -ENOENT or -EINVAL. */
int stk_client_default_cluster(char *addr, size_t len);

/*
 * Finds the cluster key for the mgmtd list `list` ("HOST:PORT[,HOST:PORT...]") and
 * has this process hold it (net.h, stk_net_auth_load): key_file if not NULL, else
 * $STOKER_KEY_FILE, else the key file `stoker up` recorded for one of the list's
 * addresses (/tmp/stoker-UID/keys/HOST:PORT holds its path). 0 also when there is
 * none; -errno (logged, with what to do) when a key file named explicitly cannot
 * be used. A recorded key that cannot be read is skipped (a cluster gone since).
 * $STOKER_AUTH=strict makes the process strict first (net.h, stk_net_auth_strict).
 * TLS (net.h, stk_net_tls_set): $STOKER_TLS=1 or 0 sets it (anything else:
 * -EINVAL, logged), else a record of `stoker up --tls` for one of the addresses
 * turns it on.
 */
int stk_client_auth_find(const char *list, const char *key_file);

/* Fetches the routing table from mgmtd and installs it. 0 or -errno. */
int stk_client_refresh_routing(struct stk_client *c);

/*
 * A metadata call: encodes nothing itself; req/req_len is the encoded request,
 * the reply payload lands in resp (resp_cap bytes, *resp_len set). Transport
 * failures are retried (with a routing refresh) for up to retry_ms, then -EIO.
 * Returns 0 or the reply's status as -errno.
 */
int stk_client_meta_call(struct stk_client *c, uint16_t opcode, const void *req, size_t req_len,
			 void *resp, size_t resp_cap, size_t *resp_len);

/*
 * stk_client_meta_call with the frame's origin set: a change this client forgets
 * from its lookup cache itself (lcache.h), 0 for none.
 */
int stk_client_meta_call_from(struct stk_client *c, uint32_t origin, uint16_t opcode,
			      const void *req, size_t req_len, void *resp, size_t resp_cap,
			      size_t *resp_len);
/*
 * stk_client_meta_call_from sent to `shard` (0: 1) whatever the request names:
 * for what belongs to no inode but to each shard apart (a session's renewal, its
 * end, its closes of that shard's files).
 */
int stk_client_meta_call_shard(struct stk_client *c, unsigned shard, uint32_t origin,
			       uint16_t opcode, const void *req, size_t req_len, void *resp,
			       size_t resp_cap, size_t *resp_len);
/* The address of shard 1's meta from the routing table. 0 or -ENOTCONN (none known). */
int stk_client_meta_addr(struct stk_client *c, char *addr);
/* The same for `shard`: 0, -ENOTCONN, or -ENOENT (the cluster has no such shard). */
int stk_client_meta_addr_shard(struct stk_client *c, unsigned shard, char *addr);
/*
 * The namespace identity of the meta serving shard 1, as that meta tells it
 * (META_STATFS, asked again whenever shard 1's address changes): what this
 * client's chunk removals carry, so that storage refuses them if this client's
 * meta is not the one holding the namespace. 0 or -errno of the call (-EIO for a
 * reply without an identity).
 */
int stk_client_meta_ns(struct stk_client *c, struct stk_ns_id *out);
/*
 * Whether that meta removes the chunks of the files it frees itself (its purge,
 * meta/purge.h), as stk_client_meta_ns last learned it: 1, 0 (an older meta: the
 * client removes them), or -EAGAIN when it has not asked this meta yet (the
 * caller removes them; meta's purge of the same chunks is harmless). Never calls
 * meta: the write-behind path asks under its lock.
 */
int stk_client_meta_purges(struct stk_client *c);

/* Encode-and-call helpers for the common reply shape (an stk_attr). */
int stk_client_meta_attr_call(struct stk_client *c, uint16_t opcode, const void *req,
			      size_t req_len, struct stk_attr *attr);
/*
 * A read (META_GETATTR, META_GETATTRS, META_READDIR) sent with this client's origin
 * (stk_lcache_origin; 0 while the lookup cache is off): meta then leaves a folder
 * delegated to this very client delegated instead of recalling it, which would
 * also make the lookup cache forget every name it knows in the folder
 * (docs/leases.md, "A delegated folder"). Safe because every call to meta sends what
 * write-behind queued first, so meta reads the folder as this client answered it.
 */
int stk_client_meta_read_call(struct stk_client *c, uint16_t opcode, const void *req,
			      size_t req_len, void *resp, size_t resp_cap, size_t *resp_len);
int stk_client_meta_attr_read_call(struct stk_client *c, uint16_t opcode, const void *req,
				   size_t req_len, struct stk_attr *attr);
/*
 * The same for a change of inode ino's attributes (META_SETATTR, META_EXTEND) sent
 * with this client's origin: the lookup cache forgets ino itself, before and after.
 */
int stk_client_meta_attr_call_own(struct stk_client *c, uint64_t ino, uint16_t opcode,
				  const void *req, size_t req_len, struct stk_attr *attr);
/*
 * The same, for a request whose last req_len - plain_len bytes hold only for a
 * frame from lease holder ext_holder (a size report spending a byte allowance of
 * that holder's session): sent whole from that holder (*ext_sent 1), else its
 * first plain_len bytes only.
 */
int stk_client_meta_attr_call_own_ext(struct stk_client *c, uint64_t ino, uint16_t opcode,
				      const void *req, size_t req_len, size_t plain_len,
				      uint32_t ext_holder, int *ext_sent);

/*
 * A file's last name went (meta answered nlink 0, not orphaned): its chunks go.
 * A meta that purges (stk_client_meta_purges) removes them itself, and this only
 * closes this process's short-circuit chunk files of it. Otherwise (an older
 * meta) this removes the chunks from every chain of its layout in the background
 * (reaper.c): returns 0 once queued, or the result of removing them itself when
 * the queue is full. A failure is logged: the space is leaked.
 */
int stk_client_remove_data(struct stk_client *c, const struct stk_attr *a);
/*
 * The same for a caller holding the write-behind's lock (behind.c): never calls
 * meta (which would first send what is behind, and wait on that lock), so a full
 * queue grows rather than removing the chunks in the caller; -EAGAIN (logged)
 * when neither can be done: the chunks are then left to meta's purge or to fsck.
 */
int stk_client_remove_data_nowait(struct stk_client *c, const struct stk_attr *a);
/* The reaper's life: created by stk_connect, drained and freed by stk_disconnect. */
int stk_reaper_create(struct stk_client *c);
void stk_reaper_destroy(struct stk_client *c);
void stk_reaper_after_fork(struct stk_client *c);
/* Waits until every removal queued so far is done (tests, tools). */
void stk_reaper_wait(struct stk_client *c);
/*
 * Removes the chunks of n files at once: one STOR_TRUNCATES per chain for all of
 * them (the reaper's batches). a is only read. 0, or the first error after every
 * file was tried: -EIO (a bad layout, or the cluster unreachable past the retry
 * time), -ENOMEM, or what storage answered.
 */
int stk_client_remove_data_many(struct stk_client *c, const struct stk_attr *a, size_t n);
/* Closes this process's short-circuit chunk files of n files that are gone. */
void stk_client_forget_local(struct stk_client *c, const struct stk_attr *a, size_t n);
/* Truncates a file's chunks on every chain of its layout to size. */
int stk_client_truncate_data(struct stk_client *c, const struct stk_attr *a, uint64_t size);
/* Removes chunks [first, end) of a file from every chain of its layout (STOR_PUNCH). */
int stk_client_punch_data(struct stk_client *c, const struct stk_attr *a, uint32_t first,
			  uint32_t end);

/*
 * Copies a file name into dst (STK_NAME_MAX + 1 bytes): -ENAMETOOLONG past 255
 * bytes, -EINVAL for "", "." , ".." or a name holding '/'.
 */
int stk_strlcpy_name(char *dst, const char *name);
/* 1 if cr's primary or a supplementary group is gid. */
int stk_cred_in_group(const struct stk_cred *cr, uint32_t gid);

/*
 * The layout a new file in directory `parent` asks for: zero (the directory's
 * default, chosen by meta) unless the client was connected with a chunk size or
 * stripe of its own.
 */
void stk_client_new_layout(struct stk_client *c, uint64_t parent, struct stk_layout *l);

/* Fills st from an attr. */
void stk_attr_to_stat(const struct stk_attr *a, struct stat *st);

/*
 * Path resolution. Walks path from the root with META_LOOKUP, following symlinks
 * in intermediate components (and in the last one if follow is set). On success
 * *attr is the inode the path names. -ENOENT, -ENOTDIR, -ELOOP, -ENAMETOOLONG,
 * -EACCES.
 */
int stk_client_resolve(struct stk_client *c, const char *path, int follow, struct stk_attr *attr);

/*
 * Reserves room to write file ino up to size need (quota.c): *granted is the size
 * up to which this session may write without asking again (UINT64_MAX: the file
 * has no byte limit). -EDQUOT: the quota has no room for need. Sends this
 * client's unsent opens first, so that meta can drop the reservation at close.
 */
int stk_client_quota_room(struct stk_client *c, uint64_t ino, uint64_t need, uint64_t *granted);
/*
 * Resolves all but the last component: *parent is the directory, name its last
 * component (a buffer of STK_NAME_MAX + 1). Of *parent only ino and the type bits
 * are certain (the root's other attributes are not fetched). The path "/" has no
 * last component:
 * -EINVAL (-EBUSY for rename/rmdir of the root is the caller's call).
 */
int stk_client_resolve_parent(struct stk_client *c, const char *path, struct stk_attr *parent,
			      char *name);

/* ---- the striped I/O engine ---- */

/* One contiguous piece of a request that falls in one chunk. */
struct stk_io_piece {
	uint32_t chain_id;
	uint32_t chunk_idx;
	uint32_t offset; /* within the chunk */
	uint32_t length;
	char *buf; /* where the bytes come from or go to */
	uint32_t done; /* bytes actually read (short at the end of a chunk) */
	int rc;
	uint8_t tries; /* sent before and failed: a read goes to another replica */
	uint8_t tail;  /* a read to the chain's tail (a replica had a change pending) */
};

#define STK_IO_WRITE 1
#define STK_IO_READ 2
#define STK_IO_PREFETCH 3 /* a hint per piece (chunk_idx); failures are ignored */
/*
 * Reads and prefetches of a sequential stream of a client with direct_streams:
 * local chunks are read with stk_chunk_read_stream and not advised. Never sent.
 */
#define STK_READ_STREAM 0x100u

/*
 * Runs pieces of one file's I/O in parallel over their chains, at most `window`
 * in flight, retrying transport failures and stale routing. flags: STK_WRITE_SYNC
 * for writes. Returns 0 if every piece succeeded, else the first error (-errno).
 */
int stk_io_run(struct stk_client *c, int op, uint64_t ino, const struct stk_layout *l,
	       struct stk_io_piece *pieces, unsigned n, uint32_t flags);

/*
 * A piece of some file's I/O, carrying its own operation, inode and layout, for
 * stk_io_run_multi (the batch engine runs pieces of many files at once).
 */
struct stk_io_piece_ex {
	struct stk_io_piece p;
	int op; /* STK_IO_READ or STK_IO_WRITE */
	uint64_t ino;
	const struct stk_layout *layout; /* must stay valid during the call */
	uint32_t flags; /* STK_WRITE_SYNC for writes */
};

/* Reusable memory for stk_io_run_multi; zero-initialise, free with stk_io_scratch_free. */
struct stk_io_scratch {
	void *mem;
	size_t cap;
};
void stk_io_scratch_free(struct stk_io_scratch *s);

/*
 * Runs pieces of many files in parallel over their chains, at most `window` (0:
 * the default of stk_io_run) in flight, with the retries of stk_io_run. Unlike
 * stk_io_run a failed piece does not stop the others: every piece ends with its
 * own p.rc (0 or -errno, -EIO once retries ran out) and p.done. scratch may be
 * NULL (memory is then allocated per call). Returns 0 if every piece succeeded,
 * else the first error; -ENOMEM (then no piece ran and each p.rc is -ENOMEM).
 */
int stk_io_run_multi(struct stk_client *c, struct stk_io_piece_ex *pieces, unsigned n,
		     unsigned window, struct stk_io_scratch *scratch);

/* ---- what the batch engine (batch.c) needs of an open file (file.c) ---- */

/* What a batched request needs to cut itself into pieces; valid while f is open. */
struct stk_file_io {
	uint64_t ino;
	const struct stk_layout *layout;
	const uint32_t *chains;
};

/*
 * Prepares a batched request of f: checks f may do `op` (STK_IO_READ or
 * STK_IO_WRITE), sends f's write buffer (so the request sees, or follows, the
 * handle's own writes), and for a read clamps *len to the file size. 0, or
 * -EBADF, -EISDIR, -EINVAL (write to an O_APPEND handle), -EFBIG, or the flush's
 * error.
 */
int stk_file_io_prep(stk_file *f, int op, uint64_t off, size_t *len, struct stk_file_io *io);
/*
 * Records a batched write of [off, off+len) that reached storage: the size grows,
 * the chains it touched are synced at the next fsync or close.
 */
void stk_file_io_wrote(stk_file *f, uint64_t off, size_t len);
/*
 * Records a batched write from off on that failed (err): as a failed write of the
 * handle, it is never published and every later fsync and close return err.
 */
void stk_file_io_failed(stk_file *f, uint64_t off, int err);
/*
 * Sets the size a read-only handle reads up to: the FUSE daemon's read-only
 * handles learn what writes through the same mount made of the file since they
 * opened. A handle that writes keeps its own (-EBADF).
 */
int stk_file_set_read_size(stk_file *f, uint64_t size);

/* Sends STOR_SYNC to the given chain. 0 or -errno. */
int stk_io_sync_chain(struct stk_client *c, uint32_t chain_id);

#endif
