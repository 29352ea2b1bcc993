/*
 * Serve maps: what a storage node tells the short-circuit readers of its own host
 * (src/client/io.c) about one of its targets, through shared memory, so that a
 * client reads a replica's chunk files itself only when the node would answer the
 * same read from them: the node serves the target's chain (not fenced, target
 * serving), at the chain version the client routes with, and no change of the
 * chunk is on its way down the chain (the copy is committed). No lock and no
 * system call is taken on the reader's path: it reads a few words of the map
 * before and after its read of the chunk file.
 *
 * Two files in the target folder, made afresh by each start of the node:
 *
 *   TARGET/serve.map     mode 0644: the node writes it, readers map it read-only
 *   TARGET/serve.count   mode 0666: short-circuit reads and bytes, which readers
 *                        add to and the node exports in /metrics
 *
 * serve.count is writable by every local user so that a reader of any uid is
 * counted; the worst a hostile one can do there is skew two counters. Nothing a
 * reader trusts is in it.
 *
 * Both are in the host's native byte order (only processes of this host read
 * them). serve.map holds:
 *
 *   offset size field
 *        0    4 magic        "STKS"
 *        4    2 format       STK_SERVE_MAP_FORMAT
 *        6    2 reserved     0
 *        8    4 nbuckets     power of two, 64 .. 2^20
 *       12    4 reserved     0
 *       16    8 instance     random: this map's life (serve.count carries it too)
 *       24   40 boot id      /proc/sys/kernel/random/boot_id of the boot that made
 *                            it, NUL-padded: a map left by an earlier boot (whose
 *                            CLOCK_MONOTONIC times mean nothing now) is refused
 *   -- the state, written by the node under the seqlock `seq` --
 *       64    8 seq          even: stable; odd: the node is changing the state
 *       72    8 valid_until  CLOCK_MONOTONIC ns until which the node serves the
 *                            target's chain (its fence deadline for a replicated
 *                            chain; ~0 for a chain of one target, which a node
 *                            serves fenced or not); 0: it does not serve it
 *       80    4 target id    as the node knows it (0 until mgmtd gave one)
 *       84    4 retired      1 once the node stopped or a new start replaced the map
 *       88    4 nchains      chains listed below, 0 .. STK_SERVE_MAP_CHAINS
 *       92    4 reserved     0
 *       96 8*4 chains       (chain id, its version in the node's table), 4 bytes
 *                            each: the chains the node serves the target in (mgmtd
 *                            puts a target in one chain; a reader asks for one)
 *   -- pending changes, by hash of (ino, chunk index) --
 *      128 8*nb buckets      low 20 bits: changes of the bucket's chunks on their
 *                            way down now; bits 20-63: how many times a change
 *                            began or ended in the bucket
 *
 * serve.count holds magic "STKR" (4), format (2), reserved (2), instance (8,
 * the map's), then at 64 the reads (8) and at 72 the bytes (8) read through the
 * short circuit; 4096 bytes in all.
 *
 * Why a reader never returns an uncommitted or a stale copy:
 *
 * - A bucket word changes whenever a change of one of its chunks begins and when
 *   it ends (acknowledged by the tail, or failed). The node bumps it before it
 *   writes the chunk file (and before it renames a new one in) and after the
 *   tail's answer. The reader loads it before its read, refuses a non-zero
 *   pending count, and loads it again after: if it changed, a change began or
 *   ended meanwhile and what was read may be a version not yet acknowledged, so
 *   the bytes are dropped. Several changes of one bucket may overlap: the count
 *   stays non-zero until the last ends, and the event count makes every begin
 *   and end visible (a plain counter would come back to the same value).
 * - The state is read under its seqlock before the read, and the same sequence
 *   must be seen after it: a change of the chain version, of the target's state
 *   or a retirement during the read drops its bytes.
 * - valid_until is never later than the node's fence deadline, after which it
 *   would refuse the read itself. A node that dies leaves a map that expires by
 *   itself; a node that starts retires the map it finds before it serves a
 *   request and makes a new one, so a reader of the old one stops at once (and
 *   opens the new one). A pending count left by a node killed in the middle of a
 *   change stays, so that bucket is never read from that map again.
 *
 * Thread rules: the writer's calls may be made from any thread, but
 * stk_serve_map_set by one thread at a time; readers from any number of
 * threads and processes at once.
 */
#ifndef STK_CHUNK_SERVEMAP_H
#define STK_CHUNK_SERVEMAP_H

#include <stdint.h>

#define STK_SERVE_MAP_FORMAT 1
#define STK_SERVE_MAP_BUCKETS 8192u
#define STK_SERVE_MAP_CHAINS 4
/* valid_until of a target the node serves whether fenced or not */
#define STK_SERVE_FOREVER UINT64_MAX

struct stk_serve_map;

/* What a reader saw before its read, to be checked after it (stk_serve_map_read_end). */
struct stk_serve_snap {
	uint64_t seq;
	uint64_t bucket;
	const uint64_t *word;
};

/*
 * The node's side. Creates dir/serve.map and dir/serve.count anew (through a
 * temporary file renamed into place), first retiring a map found there (a
 * former run's): its readers stop reading through it before this process
 * serves anything. The new map serves nothing until stk_serve_map_set says so.
 * 0 or -errno.
 */
int stk_serve_map_create(const char *dir, struct stk_serve_map **out);

/* A chain the node serves a target in, at the version of the node's table. */
struct stk_serve_chain {
	uint32_t id, version;
};

/*
 * Publishes the node's view of the target: its id, the n chains it serves it in
 * (past STK_SERVE_MAP_CHAINS, the others are read through the node), and until
 * when it serves them (0: it does not). One thread at a time (the node holds a
 * lock around it).
 */
void stk_serve_map_set(struct stk_serve_map *m, uint32_t target_id,
		       const struct stk_serve_chain *chains, unsigned n, uint64_t valid_until);

/*
 * A change of chunk idx of inode ino begins its way down the chain (before its
 * bytes reach the chunk file), and ends (acknowledged, or failed). Any thread;
 * one end for each begin.
 */
void stk_serve_map_pending_begin(struct stk_serve_map *m, uint64_t ino, uint32_t idx);
void stk_serve_map_pending_end(struct stk_serve_map *m, uint64_t ino, uint32_t idx);

/* Reads and bytes readers counted in the map's serve.count. Any thread. */
void stk_serve_map_counts(const struct stk_serve_map *m, uint64_t *reads, uint64_t *bytes);

/*
 * The reader's side. Maps dir/serve.map read-only (and serve.count to count in,
 * where this process may write it; else it counts nothing). -ENOENT (no map: the
 * node predates them or never started), -EBADMSG (not a map of this format),
 * -ESTALE (made by another boot of this host, or for another target than
 * expect_id), or -errno.
 */
int stk_serve_map_open_reader(const char *dir, uint32_t expect_id, struct stk_serve_map **out);

/* The map's instance: a reader tells a map made since from the one it holds. */
uint64_t stk_serve_map_instance(const struct stk_serve_map *m);

/*
 * Before a short-circuit read of chunk idx of inode ino on chain chain_id, which
 * the reader's table has at version chain_ver: 0 if the read may go ahead, then
 * stk_serve_map_read_end must approve it after. Else why not: -ENODEV (the map
 * is retired: a newer one may be there), -ETIMEDOUT (its validity ran out: the
 * node is silent or fenced), -EPERM (the node does not serve the target now),
 * -ESTALE (the node does not list the chain, or has another version of it), -EINPROGRESS
 * (a change of the chunk's bucket is pending), -EAGAIN (the node is changing the
 * state). No system call. Any thread.
 */
int stk_serve_map_read_begin(const struct stk_serve_map *m, uint32_t chain_id, uint32_t chain_ver,
			     uint64_t ino, uint32_t idx, struct stk_serve_snap *s);
/*
 * After the read: 0 if nothing changed since stk_serve_map_read_begin (the bytes
 * read are a committed copy of the chain's version), -EAGAIN if they must be
 * dropped.
 */
int stk_serve_map_read_end(const struct stk_serve_map *m, const struct stk_serve_snap *s);

/* Counts one short-circuit read of bytes in serve.count (if this process may). */
void stk_serve_map_count(struct stk_serve_map *m, uint64_t bytes);

/*
 * The writer retires the map (readers stop using it at once) and unmaps it; a
 * reader unmaps it. No call on m may be in progress. NULL is fine.
 */
void stk_serve_map_close(struct stk_serve_map *m);

#endif
