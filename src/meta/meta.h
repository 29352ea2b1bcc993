/*
 * meta, the namespace service: inodes, directory entries, layouts, symlinks, hard
 * links, persisted in LMDB under data_dir. One shard per meta node here; the shard
 * map in the routing table says which node serves which shard.
 */
#ifndef STK_META_H
#define STK_META_H

#include <stddef.h>
#include <stdint.h>

struct stk_meta_opts {
	size_t size; /* sizeof(struct stk_meta_opts) */
	const char *listen; /* "HOST:PORT" */
	const char *mgmtd; /* "HOST:PORT" of mgmtd */
	const char *data_dir; /* LMDB environment in data_dir/meta/ */
	uint32_t default_chunk_size; /* 0 = 1 MiB */
	uint32_t default_stripe; /* 0 = all chains, at most 16 */
	uint64_t map_size; /* LMDB map size, 0 = 64 GiB */
	const char *metrics_listen; /* "HOST:PORT" for GET /metrics, or NULL for none */
	const char *host_id; /* --host-id: the host id to report, NULL for this host's */
	/*
	 * --shard K: the metadata shard this node serves (docs/meta-shards.md; 0: 1).
	 * A store remembers the shard it was made for and refuses another.
	 */
	unsigned shard;
};

/* Serves until SIGINT/SIGTERM. 0 or -errno (logged). */
int stk_meta_run(const struct stk_meta_opts *opts);

#endif
