/*
 * Chunk files: the on-disk format of a storage target's chunks, and reading them.
 * The storage daemon's chunk store (src/storage/chunk.h) writes them and reads
 * them through this module; the client library reads the chunks of its own host
 * through it too (short-circuit reads, src/client/io.c), with the same checks,
 * without linking the storage daemon.
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
 *       32    8 version       the chunk's version, 1 or more (chain replication:
 *                             src/storage/chunk.h, stk_chunk_write_ver)
 *       40 4*nb block CRCs    CRC32C of each 4 KiB data block (the last one short)
 *  40+4*nb    4 header CRC    CRC32C of the bytes before it
 *
 * Format 1 (still read) had no version field: its CRCs start at 32, and its
 * chunks count as version 1.
 *
 * Every block is checked against its CRC when read; a block that fails is
 * reported as -EIO and its bytes never leave this module. Updates never change a
 * chunk file in place (the writer renames a new file over it), so a reader sees
 * the old file or the new one.
 *
 * Thread rules: a store may be read from any number of threads at once. Each
 * thread keeps its own I/O buffers, so steady-state reads allocate nothing.
 */
#ifndef STK_CHUNK_CHUNKFILE_H
#define STK_CHUNK_CHUNKFILE_H

#include <stdint.h>
#include <sys/uio.h>

#define STK_CHUNK_FORMAT 2
#define STK_CHUNK_BLOCK 4096u

/* A target folder's chunk files: opened by the storage daemon (read-write,
 * src/storage/chunk.h) or by a client for reading (stk_chunk_store_open_reader). */
struct stk_chunk_store;

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

/* Closes the store; no call on it may be in progress. */
void stk_chunk_store_close(struct stk_chunk_store *cs);
/*
 * In a child after fork(), before any other call on cs there: the cache's locks are
 * made anew (a parent thread may have held one at the fork, and would never release
 * it here). Entries a parent thread was reading stay referenced (never freed in the
 * child). Only the forking thread exists then, so this is safe.
 */
void stk_chunk_store_after_fork(struct stk_chunk_store *cs);

/* The folder's absolute path. Valid until close. */
const char *stk_chunk_store_path(const struct stk_chunk_store *cs);
/* The target id (0 until one is set or read from target.id). Any thread. */
uint32_t stk_chunk_store_id(const struct stk_chunk_store *cs);
/*
 * Corrupt blocks and chunk headers found (checksum or consistency check failed)
 * since the store was opened. Any thread.
 */
uint64_t stk_chunk_store_corrupt_count(const struct stk_chunk_store *cs);
/* Damaged chunks rewritten from another replica (the storage node's repair). */
void stk_chunk_store_note_repaired(struct stk_chunk_store *cs);
uint64_t stk_chunk_store_repaired_count(const struct stk_chunk_store *cs);

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
 * A read in two steps, for a caller that does the I/O itself without blocking (the
 * storage node's event loops, which read through io_uring):
 *
 *   stk_chunk_read_begin() finds the chunk's file among those kept open, without
 *   waiting on the disk, and says what to read: a->niov pieces a->iov, a->want bytes
 *   in all, from descriptor a->fd at offset a->file_off;
 *   the caller reads them (short reads are the caller's to continue);
 *   stk_chunk_read_end() checks what arrived and returns what stk_chunk_read would.
 *
 * begin returns 1 (read, then call end or, to give up, stk_chunk_read_cancel: the
 * file stays open until then), 0 (nothing to read: len is 0, or off is at or past
 * the chunk's end; nothing to end), -EAGAIN (the file is not open here: opening it
 * may wait on the disk, so call stk_chunk_read on a thread that may block; a
 * missing chunk answers so too) or another -errno. buf must stay valid, and a
 * unmoved, until end or cancel; a holds the pieces of the first and last blocks
 * that fall outside buf. got: the bytes read, or the -errno of the read. end
 * returns the bytes of the caller's (fewer than len where the chunk ends), -EIO if
 * a checksum fails or the file is short (buf zeroed) or got's -errno; crcs as
 * stk_chunk_read's. Any thread, one thread at a time per a.
 */
struct stk_chunk_aread {
	int fd;
	uint64_t file_off;
	struct iovec iov[3];
	int niov;
	uint32_t want;
	/* private */
	struct fd_ent *e_;
	uint8_t *buf_;
	uint32_t rs_, off_, end_, re_;
	uint8_t head_[STK_CHUNK_BLOCK], tail_[STK_CHUNK_BLOCK];
};
int stk_chunk_read_begin(struct stk_chunk_store *cs, uint64_t ino, uint32_t idx, uint32_t off,
			 void *buf, uint32_t len, struct stk_chunk_aread *a);
long stk_chunk_read_end(struct stk_chunk_store *cs, struct stk_chunk_aread *a, long got,
			uint32_t *crcs);
void stk_chunk_read_cancel(struct stk_chunk_store *cs, struct stk_chunk_aread *a);

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
 * Asks the kernel to start reading chunk idx of inode ino into the page cache and
 * returns without waiting for it. A missing chunk is not an error. 0 or -errno.
 */
int stk_chunk_prefetch(struct stk_chunk_store *cs, uint64_t ino, uint32_t idx);
/* As stk_chunk_prefetch, for the bytes [off, off + len) of the chunk's data only. */
int stk_chunk_advise(struct stk_chunk_store *cs, uint64_t ino, uint32_t idx, uint32_t off,
		     uint32_t len);

/*
 * Closes (and unmaps) the chunk files of inode ino this store keeps open, so that
 * the space of a removed file goes at once and its maps stop weighing on the
 * process (a reader keeps up to 1024, each mapped, until they are evicted).
 * nchunks: how many chunks the file had (its size over its chunk size, rounded
 * up); only those are looked for. A reader still in one closes it when done.
 */
void stk_chunk_store_forget(struct stk_chunk_store *cs, uint64_t ino, uint64_t nchunks);

#endif
