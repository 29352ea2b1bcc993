/*
 * Chunk files, the inside view: what the chunk store's writer (src/storage/chunk.c)
 * shares with the reading side (chunkfile.c). Nothing else includes this header
 * (scripts/check-layers.sh): the client sees only chunkfile.h.
 */
#ifndef STK_CHUNK_CHUNKFILE_PRIV_H
#define STK_CHUNK_CHUNKFILE_PRIV_H

#include <limits.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "../common/layout.h"
#include "chunkfile.h"

struct stk_chunk_lockwait;

#define CHUNK_MAGIC 0x434B5453u /* "STKC" */
#define HDR_FIXED 40u		/* header bytes before the block CRCs (format 2) */
#define HDR_FIXED_V1 32u	/* the same in format 1, which had no version */
#define HDR_MIN 4096u
#define MAX_BLOCKS (STK_MAX_CHUNK_SIZE / STK_CHUNK_BLOCK)
#define LOCK_STRIPES 1024u
#define FDC_LOCKS 64u
#define FDC_SETTLE_MS 100
#define FDC_SERVER 4096u /* cached chunk files of a storage node's target */
#define FDC_READER 1024u /* of a short-circuit reader's target */
#define REL_MAX 96 /* "chunks/ff/<16 hex>/<10 digits>.tmp.<10 digits>" and then some */
#define LARGE_WRITE_MIN (512u << 10) /* uncached or written behind: see chunk_update */
#define SMALL_CHUNK (132u << 10) /* a chunk file read whole when first opened: see fdc_get */

struct stk_chunk_store {
	char dir[PATH_MAX]; /* absolute path of the target folder */
	int dirfd;
	uint32_t id;			     /* atomic: set once registration is done */
	uint64_t nchunks;		     /* atomic */
	uint64_t ncorrupt;		     /* atomic: corrupt blocks and headers found */
	uint64_t nrepaired;		     /* atomic: damaged chunks rewritten from a replica */
	pthread_mutex_t locks[LOCK_STRIPES]; /* each protects its stripes[] entry */
	struct chunk_stripe {
		int held; /* a change of a chunk of this stripe is under way */
		struct stk_chunk_lockwait *head, *tail; /* who waits for it, in order */
	} stripes[LOCK_STRIPES]; /* the chunk lock (storage/chunk.h): writer side only */
	struct fd_ent **fdc;		     /* the cache of open chunk files: fdc_n slots */
	unsigned fdc_n;
	int fdc_ok;
	int reader;	     /* opened by stk_chunk_store_open_reader: map cached files */
	int no_direct;	     /* atomic: O_DIRECT failed here, streams read through the cache */
	pthread_mutex_t fdc_locks[FDC_LOCKS];
	uint64_t fdc_ticks[FDC_LOCKS]; /* each under its lock: a clock for the sets' LRU */
};

/* A parsed chunk header. crcs points into the buffer the header was read into. */
struct chunk_hdr {
	uint64_t version; /* the chunk's version (format 1 chunks: 1) */
	uint32_t hdr_len;
	uint32_t data_len;
	uint32_t nblocks;
	const uint8_t *crcs;
};

struct chunk_tls {
	uint8_t *buf; /* a chunk being built: header then data */
	size_t buf_cap;
	uint8_t *hdr; /* a chunk header being read */
	size_t hdr_cap;
};

static inline uint32_t stk_chunk_le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* The header length of a chunk of nblocks blocks, in the format written now. */
static inline uint32_t stk_chunk_hdr_size(uint32_t nblocks)
{
	uint32_t need = HDR_FIXED + 4 * nblocks + 4;

	return (need + HDR_MIN - 1) / HDR_MIN * HDR_MIN;
}

static inline uint32_t stk_chunk_target_id(const struct stk_chunk_store *cs)
{
	return __atomic_load_n(&cs->id, __ATOMIC_RELAXED);
}

static inline void stk_chunk_rel_dir(char *out, size_t len, uint64_t ino)
{
	snprintf(out, len, "chunks/%02x/%llx", (unsigned)(ino & 0xff), (unsigned long long)ino);
}

static inline void stk_chunk_rel(char *out, size_t len, uint64_t ino, uint32_t idx)
{
	snprintf(out, len, "chunks/%02x/%llx/%u", (unsigned)(ino & 0xff), (unsigned long long)ino,
		 idx);
}

/* The calling thread's buffers (allocated on first use; NULL: out of memory). */
struct chunk_tls *stk_chunk_tls_get(void);
/* Makes *buf hold at least want bytes (4 KiB aligned); the contents are not kept. */
int stk_chunk_tls_grow(uint8_t **buf, size_t *cap, size_t want);
/* Counts and logs a corrupt header of chunk ino/idx (file rel). Returns -EIO. */
int stk_chunk_hdr_corrupt(struct stk_chunk_store *cs, const char *rel, uint64_t ino, uint32_t idx,
			  const char *why);
/*
 * Reads and checks the header of open chunk file fd into t's header buffer; h->crcs
 * points into it until the thread's next header read. 0, -EIO (corrupt, logged),
 * -ENOMEM or -errno.
 */
int stk_chunk_hdr_read(struct stk_chunk_store *cs, struct chunk_tls *t, int fd, const char *rel,
		       uint64_t ino, uint32_t idx, struct chunk_hdr *h);
/* Counts and logs a block whose CRC does not match. */
void stk_chunk_log_mismatch(struct stk_chunk_store *cs, const char *rel, uint64_t ino,
			    uint32_t idx, uint32_t block);
/* Sizes and sets up the cache of open chunk files (want entries, 1/share of RLIMIT_NOFILE). */
int stk_chunk_cache_init(struct stk_chunk_store *cs, unsigned want, unsigned share);
/* Takes chunk ino/idx out of the cache (it was replaced or removed). */
void stk_chunk_cache_drop(struct stk_chunk_store *cs, uint64_t ino, uint32_t idx, struct fd_ent *e);
/* Reads dir/target.id into cs->id (0 when absent). 0, -EBADMSG or -errno. */
int stk_chunk_read_id(struct stk_chunk_store *cs);

#endif
