/*
 * The chunk store of one storage target: a folder holding a file per chunk.
 *
 * Layout of a target folder:
 *
 *   TARGET/target.id                       the target's id, once mgmtd gave it one
 *   TARGET/chunks/<ino % 256, 2 hex digits>/<ino, hex>/<chunk index, decimal>
 *
 * A chunk file is a header of hdr_len bytes (4 KiB, growing in 4 KiB steps for
 * chunks of more than about 1000 blocks) followed by the chunk's data_len bytes.
 * The header (little-endian) holds:
 *
 *   offset size field
 *        0    4 magic         "STKC"
 *        4    2 format        STK_CHUNK_FORMAT
 *        6    2 reserved      0
 *        8    4 hdr_len       multiple of 4096: where the data starts
 *       12    4 data_len      bytes of data
 *       16    8 ino
 *       24    4 chunk index
 *       28    4 nblocks       ceil(data_len / 4096)
 *       32 4*nb block CRCs    CRC32C of each 4 KiB data block (the last one short)
 *  32+4*nb    4 header CRC    CRC32C of the bytes before it
 *
 * Writes are copy-on-write: the new chunk is written whole to a temporary file in
 * the same folder and renamed over the old one, so a crash or a full disk leaves
 * the old chunk or the new one, never a mix. Every block is checked against its
 * CRC when read, and when a partial write merges new bytes into it; a block that
 * fails is reported as -EIO and its bytes never leave this module.
 *
 * Thread rules: a store may be used from any number of threads. Writes and
 * truncates of one chunk are serialised by a striped lock table; reads take no
 * lock (a rename is atomic, so a reader sees the old file or the new one).
 * Each thread keeps its own I/O buffers, so steady-state I/O allocates nothing.
 */
#ifndef STK_STORAGE_CHUNK_H
#define STK_STORAGE_CHUNK_H

#include <stdint.h>

#define STK_CHUNK_FORMAT 1
#define STK_CHUNK_BLOCK 4096u

struct stk_chunk_store;

/*
 * Opens (creating if needed) the target folder dir: makes dir/chunks, reads
 * dir/target.id if present, removes temporary files a crash left behind and counts
 * the chunks. 0, -EBADMSG (target.id unreadable), -ENOMEM or -errno.
 */
int stk_chunk_store_open(const char *dir, struct stk_chunk_store **out);
/* Closes the store; no call on it may be in progress. */
void stk_chunk_store_close(struct stk_chunk_store *cs);

/* The folder's absolute path. Valid until close. */
const char *stk_chunk_store_path(const struct stk_chunk_store *cs);
/* The target id (0 until one is set or read from target.id). Any thread. */
uint32_t stk_chunk_store_id(const struct stk_chunk_store *cs);
/* Records the target id, writing target.id atomically and durably. 0 or -errno. */
int stk_chunk_store_set_id(struct stk_chunk_store *cs, uint32_t id);

/* Capacity and used bytes of the file system under the folder, and the chunk count. */
int stk_chunk_store_stat(struct stk_chunk_store *cs, uint64_t *capacity, uint64_t *used,
			 uint64_t *chunks);
/*
 * Corrupt blocks and chunk headers found (checksum or consistency check failed)
 * since the store was opened. Any thread.
 */
uint64_t stk_chunk_store_corrupt_count(const struct stk_chunk_store *cs);
/* Everything written so far is on stable storage (syncfs). 0 or -errno. */
int stk_chunk_store_sync(struct stk_chunk_store *cs);

/*
 * Opens an existing target folder for reading only, as a client on the storage
 * node does for short-circuit reads: no folder is made, nothing is scanned, and
 * the folder's target.id must be expect_id (-ESTALE otherwise). Only
 * stk_chunk_read and stk_chunk_store_close may be used on the result. Such a
 * store maps the chunk files it keeps open (read-only, shared) and reads bytes
 * already in the page cache through the map, checking each block as it copies
 * it; other reads use preadv. It holds up to 1024 files open (fewer when
 * RLIMIT_NOFILE is under 8192: an eighth of it) and their maps until closed.
 */
int stk_chunk_store_open_reader(const char *dir, uint32_t expect_id,
				struct stk_chunk_store **out);

/*
 * As stk_chunk_read (no crcs), for a sequential reader whose bytes the kernel
 * caches above it (the mount): an aligned read of STK_STREAM_MIN bytes or more
 * goes from the disk straight into buf (O_DIRECT, through a second descriptor
 * kept with the cached file), so the chunk file's pages are neither filled nor
 * copied; each block is checked against its CRC as stk_chunk_read does. Any other
 * read, a file system without O_DIRECT, or a short read goes the buffered way.
 */
#define STK_STREAM_MIN (256u << 10)
long stk_chunk_read_stream(struct stk_chunk_store *cs, uint64_t ino, uint32_t idx, uint32_t off,
			   void *buf, uint32_t len);

/*
 * Closes (and unmaps) the chunk files of inode ino this store keeps open, so that
 * the space of a removed file goes at once and its maps stop weighing on the
 * process (a reader keeps up to 1024, each mapped, until they are evicted).
 * nchunks: how many chunks the file had (its size over its chunk size, rounded
 * up); only those are looked for. A reader still in one closes it when done.
 */
void stk_chunk_store_forget(struct stk_chunk_store *cs, uint64_t ino, uint64_t nchunks);

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
 * Reads up to len bytes at off from chunk idx of inode ino into buf. Returns the
 * number of bytes read: 0 for a missing chunk or at or past its end, fewer than len
 * where the chunk ends. -EIO if a checksum fails (logged; buf is zeroed, never
 * filled with the bad bytes), or -errno. crcs, if not NULL (room for
 * stk_crc_blocks(len) values), receives the CRC32C of each STK_CHUNK_BLOCK-byte
 * piece of what was read, from buf's first byte: for a block-aligned read these
 * are the stored checksums, which cost nothing more.
 */
long stk_chunk_read(struct stk_chunk_store *cs, uint64_t ino, uint32_t idx, uint32_t off, void *buf,
		    uint32_t len, uint32_t *crcs);

/*
 * Asks the kernel to start reading chunk idx of inode ino into the page cache and
 * returns without waiting for it. A missing chunk is not an error. 0 or -errno.
 */
int stk_chunk_prefetch(struct stk_chunk_store *cs, uint64_t ino, uint32_t idx);
/* As stk_chunk_prefetch, for the bytes [off, off + len) of the chunk's data only. */
int stk_chunk_advise(struct stk_chunk_store *cs, uint64_t ino, uint32_t idx, uint32_t off,
		     uint32_t len);

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
