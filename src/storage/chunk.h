/*
 * The chunk store of one storage target: a folder holding a file per chunk.
 *
 * The chunk files' format, and reading them, are src/chunk/chunkfile.h's (shared
 * with the client's short-circuit reads); this is the writing side.
 *
 * Writes are copy-on-write: the new chunk is written whole to a temporary file in
 * the same folder and renamed over the old one, so a crash or a full disk leaves
 * the old chunk or the new one, never a mix. Every block is checked against its
 * CRC when read, and when a partial write merges new bytes into it; a block that
 * fails is reported as -EIO and its bytes never leave the store.
 *
 * Thread rules: a store may be used from any number of threads. Writes and
 * truncates of one chunk are serialised by the chunk lock (below, striped over a
 * table); reads take no lock (a rename is atomic, so a reader sees the old file or
 * the new one).
 * Each thread keeps its own I/O buffers, so steady-state I/O allocates nothing.
 */
#ifndef STK_STORAGE_CHUNK_H
#define STK_STORAGE_CHUNK_H

#include <pthread.h>
#include <stdint.h>

#include "../chunk/chunkfile.h"

/*
 * Opens (creating if needed) the target folder dir: makes dir/chunks, reads
 * dir/target.id if present, removes temporary files a crash left behind and counts
 * the chunks. 0, -EBADMSG (target.id unreadable), -ENOMEM or -errno.
 */
int stk_chunk_store_open(const char *dir, struct stk_chunk_store **out);

/* Records the target id, writing target.id atomically and durably. 0 or -errno. */
int stk_chunk_store_set_id(struct stk_chunk_store *cs, uint32_t id);

/* Capacity and used bytes of the file system under the folder, and the chunk count. */
int stk_chunk_store_stat(struct stk_chunk_store *cs, uint64_t *capacity, uint64_t *used,
			 uint64_t *chunks);
/* Everything written so far is on stable storage (syncfs). 0 or -errno. */
int stk_chunk_store_sync(struct stk_chunk_store *cs);

/*
 * Writes len bytes at off into chunk idx of inode ino, growing it as needed (a gap
 * between the old end and off reads as zeros). off + len must not exceed
 * chunk_size (at most 64 MiB). With STK_WRITE_SYNC the chunk is durable when this
 * returns. *chunk_len is the chunk's length afterwards. crcs, if not NULL, holds
 * the CRC32C of each STK_CHUNK_BLOCK-byte piece of data (already verified by the
 * caller); where a piece is exactly one block of the chunk, its value is stored
 * without hashing the bytes again.
 * 0, -EINVAL, -ENOSPC (disk full or quota: the old chunk is intact), -EIO (the old
 * chunk is corrupt where this write would have kept its bytes) or -errno.
 */
int stk_chunk_write(struct stk_chunk_store *cs, uint64_t ino, uint32_t idx, uint32_t chunk_size,
		    uint32_t off, const void *data, uint32_t len, const uint32_t *crcs,
		    uint32_t flags, uint32_t *chunk_len);

/*
 * Chunk versions, for replicas (src/storage/service.c, chain replication): every
 * change of a chunk's bytes or length makes its version one more than it was (a
 * missing chunk is version 0; one written before versions existed, 1), unless the
 * caller sets it. stk_chunk_write_ver is stk_chunk_write with:
 *   base  the version the change applies to; when the chunk has another, nothing
 *         is written and the call returns -EUCLEAN (the sender then sends the whole
 *         chunk). STK_CHUNK_VER_ANY: any version.
 *   set   the new version (0: the old one plus 1), as a predecessor in the chain
 *         numbered it.
 *   full  the data replaces the whole chunk (off must be 0; the chunk's length
 *         becomes len), as a copy from another replica does.
 *   old, now (out) the version before and after.
 *   then  if not NULL, called once the change has landed (and not when it failed),
 *         with the chunk's lock still held, so that no other change of this chunk
 *         comes between: a replica forwards the change to its successor there. Its
 *         error is the call's. It must not change this chunk itself.
 */
#define STK_CHUNK_VER_ANY UINT64_MAX
struct stk_chunk_wver {
	uint64_t base;
	uint64_t set;
	int full;
	/* with set: write only if the chunk's version is below set (else 0, unchanged) */
	int newer_only;
	/* with set 0: the new version is at least floor (a head's chain version << 32,
	 * so that no two heads of a chain, one after the other, number two different
	 * changes alike: a change a dead head made and never passed on is not taken
	 * for the one its successor made next) */
	uint64_t floor;
	uint64_t old, now;
	int (*then)(void *ctx, const struct stk_chunk_wver *v);
	void *ctx;
};
int stk_chunk_write_ver(struct stk_chunk_store *cs, uint64_t ino, uint32_t idx,
			uint32_t chunk_size, uint32_t off, const void *data, uint32_t len,
			const uint32_t *crcs, uint32_t flags, struct stk_chunk_wver *v,
			uint32_t *chunk_len);
/*
 * The chunk lock: one change of a chunk at a time, from its first byte written
 * here until its successor in the chain has it too (service.c). It is a flag, not
 * a mutex, because the thread that releases it is often not the one that took it:
 * a write takes it on a worker and the event loop releases it when the successor
 * answers. Whoever waits for it waits in one queue, in order: a thread blocked in
 * stk_chunk_lock, or a callback queued by stk_chunk_lock_async, so that no event
 * loop ever blocks on it. Locks are striped (1024 per store): two chunks may share
 * one, which costs only some waiting.
 *
 * stk_chunk_lock: takes the lock of chunk (ino, idx), blocking until it is free.
 * stk_chunk_lock_async: takes it if free (returns 0; w is not used), else queues w
 * and returns 1: w->granted(w) runs exactly once, when the lock is w's, on the
 * thread that released it (it must not block: hand the work on). w must stay
 * valid until then. stk_chunk_unlock: releases it (any thread), handing it to the
 * first waiter. Any thread; none fails.
 */
struct stk_chunk_lockwait {
	void (*granted)(struct stk_chunk_lockwait *w);
	/* private: the queue's */
	struct stk_chunk_lockwait *next_;
	pthread_cond_t *cv_; /* a blocked thread's, or NULL for a callback */
	int done_;
};
void stk_chunk_lock(struct stk_chunk_store *cs, uint64_t ino, uint32_t idx);
int stk_chunk_lock_async(struct stk_chunk_store *cs, uint64_t ino, uint32_t idx,
			 struct stk_chunk_lockwait *w);
void stk_chunk_unlock(struct stk_chunk_store *cs, uint64_t ino, uint32_t idx);

/*
 * stk_chunk_write_ver with the chunk's lock already held by the caller (who
 * releases it when the change has gone where it must): v->then is not called.
 * The same arguments and errors.
 */
int stk_chunk_write_locked(struct stk_chunk_store *cs, uint64_t ino, uint32_t idx,
			   uint32_t chunk_size, uint32_t off, const void *data, uint32_t len,
			   const uint32_t *crcs, uint32_t flags, struct stk_chunk_wver *v,
			   uint32_t *chunk_len);

/* The version and length of chunk idx of ino (0 and 0 when missing). 0, -EIO or -errno. */
int stk_chunk_version(struct stk_chunk_store *cs, uint64_t ino, uint32_t idx, uint64_t *version,
		      uint32_t *len);

/* What fsck compares between the copies of a chunk (stk_chunk_stat). */
struct stk_chunk_info {
	uint64_t version;
	uint32_t len;
	uint32_t digest;   /* CRC32C of the chunk's block CRCs, seeded with its length */
	int64_t mtime_sec; /* when its file was last written */
};
/*
 * The version, length, digest and age of chunk idx of ino, from its header alone
 * (all zero when missing): equal bytes give equal digests, so two copies of one
 * version whose digests differ disagree. 0, -EIO (a corrupt header) or -errno.
 */
int stk_chunk_stat(struct stk_chunk_store *cs, uint64_t ino, uint32_t idx,
		   struct stk_chunk_info *out);

/*
 * Reads the whole of chunk idx of ino (at most cap bytes) from one version of its
 * file, its block CRCs checked: *len bytes into buf, their CRCs into crcs (room for
 * cap / STK_CHUNK_BLOCK + 1), and its version (0 and 0 when missing). A replica
 * being resynced copies chunks with this. 0, -EFBIG (over cap), -EIO or -errno.
 */
int stk_chunk_read_whole(struct stk_chunk_store *cs, uint64_t ino, uint32_t idx, void *buf,
			 uint32_t cap, uint32_t *len, uint64_t *version, uint32_t *crcs);

/* A chunk a target holds (stk_chunk_list_bucket). */
struct stk_chunk_ent {
	uint64_t ino;
	uint32_t idx;
};
/*
 * The chunks of one of the 256 folders chunks/<xx> (the inodes with ino % 256 ==
 * bucket), sorted by inode and index; *out is malloc'd (NULL when none). A resync
 * walks a target bucket by bucket with this. 0, -ENOMEM or -errno.
 */
int stk_chunk_list_bucket(struct stk_chunk_store *cs, unsigned bucket, struct stk_chunk_ent **out,
			  size_t *count);

/*
 * Cuts inode ino to size bytes, for a file laid out in chunks of chunk_size:
 * removes the chunks that start at or past size and shortens the one that
 * straddles it. Size 0 removes the inode's folder. Durable when it returns.
 * 0, -EINVAL, -EIO (the cut chunk is corrupt), -ENOSPC or -errno.
 */
int stk_chunk_truncate(struct stk_chunk_store *cs, uint64_t ino, uint64_t size,
		       uint32_t chunk_size);
/*
 * Removes the chunks [first, end) of inode ino that this store holds (fallocate's
 * punch-hole): they read as missing, that is as zeros, after. Durable when it
 * returns. 0 (also when none was there), -EINVAL (first > end) or -errno.
 */
int stk_chunk_punch(struct stk_chunk_store *cs, uint64_t ino, uint32_t first, uint32_t end);

#endif
