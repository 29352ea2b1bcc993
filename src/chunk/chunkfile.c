/*
 * Chunk files: their format (chunkfile.h) and reading them, shared by the storage
 * daemon's chunk store (src/storage/chunk.c, which writes them) and the client
 * library's short-circuit reads of chunks on its own host (src/client/io.c), so
 * that the client reads and checks chunk files exactly as storage does without
 * linking the storage daemon.
 *
 * Reads go through a cache of open chunk files with their checked headers (see
 * "the cache of open chunk files" below), so a read of a chunk read before costs
 * an fstat and the preadv of its bytes; a short-circuit reader's read of bytes in
 * the page cache costs an fstat, a cachestat and one pass that copies the bytes
 * out of a map of the file and checks their CRCs.
 *
 * All paths are relative to a descriptor of the target folder (openat and
 * friends), which keeps them short and immune to the folder being renamed.
 *
 * Each thread owns two buffers, grown on demand and kept until it exits (a
 * pthread key frees them): one for a chunk being built (the writer's), one for a
 * chunk header being read. Nothing is allocated per I/O once they are warm.
 */
#include "chunkfile.h"
#include "chunkfile_priv.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "../common/log.h"
#include "../common/util.h"
#include "../proto/codec.h"

/* ---- per-thread buffers ---- */

static pthread_key_t g_tls_key;
static pthread_once_t g_tls_once = PTHREAD_ONCE_INIT;
static int g_tls_ok;

static void tls_free(void *p)
{
	struct chunk_tls *t = p;

	free(t->buf);
	free(t->hdr);
	free(t);
}

static void tls_init(void)
{
	g_tls_ok = pthread_key_create(&g_tls_key, tls_free) == 0;
}

struct chunk_tls *stk_chunk_tls_get(void)
{
	struct chunk_tls *t;

	pthread_once(&g_tls_once, tls_init);
	if (!g_tls_ok)
		return NULL;
	t = pthread_getspecific(g_tls_key);
	if (!t) {
		t = calloc(1, sizeof(*t));
		if (!t || pthread_setspecific(g_tls_key, t)) {
			free(t);
			return NULL;
		}
	}
	return t;
}

/* Makes *buf hold at least want bytes (4 KiB aligned, ready for O_DIRECT later). */
int stk_chunk_tls_grow(uint8_t **buf, size_t *cap, size_t want)
{
	uint8_t *n;
	size_t ncap;

	if (want <= *cap)
		return 0;
	ncap = STK_MAX(want, (size_t)64 << 10);
	ncap = (ncap + 4095) & ~(size_t)4095;
	n = aligned_alloc(4096, ncap);
	if (!n)
		return -ENOMEM;
	free(*buf);
	*buf = n;
	*cap = ncap;
	return 0;
}

/* ---- headers ---- */

int stk_chunk_hdr_corrupt(struct stk_chunk_store *cs, const char *rel, uint64_t ino,
		       uint32_t idx, const char *why)
{
	__atomic_fetch_add(&cs->ncorrupt, 1, __ATOMIC_RELAXED);
	stk_error("corrupt chunk header: target %u ino 0x%llx chunk %u (%s/%s): %s", stk_chunk_target_id(cs),
		  (unsigned long long)ino, idx, cs->dir, rel, why);
	return -EIO;
}

/*
 * Checks the header at b (have bytes of the file's start, at least HDR_MIN) and
 * fills h; h->crcs points into b. 0, -EIO (corrupt, logged), or -ENOSPC when the
 * header is longer than have (the caller reads it whole and asks again).
 */
static int check_hdr(struct stk_chunk_store *cs, const uint8_t *b, size_t have, const char *rel,
		     uint64_t ino, uint32_t idx, struct chunk_hdr *h)
{
	struct stk_rbuf r;
	uint32_t magic, format, fixed, crc_off;
	uint64_t hino;
	uint32_t hidx;

	stk_rbuf_init(&r, b, HDR_FIXED);
	magic = stk_get_u32(&r);
	format = stk_get_u16(&r);
	stk_get_u16(&r);
	h->hdr_len = stk_get_u32(&r);
	h->data_len = stk_get_u32(&r);
	hino = stk_get_u64(&r);
	hidx = stk_get_u32(&r);
	h->nblocks = stk_get_u32(&r);
	h->version = stk_get_u64(&r);
	if (magic != CHUNK_MAGIC)
		return stk_chunk_hdr_corrupt(cs, rel, ino, idx, "bad magic");
	if (format != STK_CHUNK_FORMAT && format != 1)
		return stk_chunk_hdr_corrupt(cs, rel, ino, idx, "unknown format version");
	fixed = format == 1 ? HDR_FIXED_V1 : HDR_FIXED;
	if (format == 1)
		h->version = 1; /* written before chunks had versions: the first one */
	if (h->data_len > STK_MAX_CHUNK_SIZE ||
	    h->nblocks != STK_DIV_ROUND_UP(h->data_len, STK_CHUNK_BLOCK) ||
	    h->hdr_len != STK_DIV_ROUND_UP(fixed + 4 * h->nblocks + 4, HDR_MIN) * HDR_MIN ||
	    (format != 1 && h->version == 0))
		return stk_chunk_hdr_corrupt(cs, rel, ino, idx, "inconsistent lengths");
	if (h->hdr_len > have)
		return -ENOSPC;
	crc_off = fixed + 4 * h->nblocks;
	if (stk_chunk_le32(b + crc_off) != stk_crc32c(0, b, crc_off))
		return stk_chunk_hdr_corrupt(cs, rel, ino, idx, "header checksum mismatch");
	if (hino != ino || hidx != idx)
		return stk_chunk_hdr_corrupt(cs, rel, ino, idx, "header names another chunk");
	h->crcs = b + fixed;
	return 0;
}

/*
 * Reads and checks the header of an open chunk file into the thread's header
 * buffer. 0, -EIO (corrupt, logged), -ENOMEM or -errno.
 */
int stk_chunk_hdr_read(struct stk_chunk_store *cs, struct chunk_tls *t, int fd, const char *rel,
		    uint64_t ino, uint32_t idx, struct chunk_hdr *h)
{
	long got;
	int rc;

	rc = stk_chunk_tls_grow(&t->hdr, &t->hdr_cap, HDR_MIN);
	if (rc)
		return rc;
	got = stk_pread_full(fd, t->hdr, HDR_MIN, 0);
	if (got < 0)
		return (int)got;
	if (got < (long)HDR_MIN)
		return stk_chunk_hdr_corrupt(cs, rel, ino, idx, "file shorter than a header");
	rc = check_hdr(cs, t->hdr, HDR_MIN, rel, ino, idx, h);
	if (rc != -ENOSPC)
		return rc;
	rc = stk_chunk_tls_grow(&t->hdr, &t->hdr_cap, h->hdr_len);
	if (rc)
		return rc;
	/* stk_chunk_tls_grow does not keep the contents: read the whole header again. */
	got = stk_pread_full(fd, t->hdr, h->hdr_len, 0);
	if (got < 0)
		return (int)got;
	if (got < (long)h->hdr_len)
		return stk_chunk_hdr_corrupt(cs, rel, ino, idx, "file shorter than its header");
	return check_hdr(cs, t->hdr, h->hdr_len, rel, ino, idx, h);
}

/* ---- the cache of open chunk files ---- */

/*
 * A chunk file a reader opened, kept open with its checked header so that the
 * next read of the chunk costs an fstat instead of an openat, a header read and
 * a header CRC. Updates never change a chunk file in place (they rename a new one
 * over it, or unlink it), so an entry is valid while its file keeps a link and its
 * ctime and size are those seen when it was opened; a file changed in place by
 * something else (a tool, a damaged disk) changes its ctime and is opened again.
 * Data blocks are still checked against the CRCs on every read.
 *
 * A file whose ctime is younger than FDC_SETTLE_MS is read through an entry used
 * once and not cached (see settled()).
 *
 * The table is set-associative: a chunk hashes to a set of FDC_WAYS slots under
 * one lock, and a newcomer takes a free slot of its set or the one used least
 * recently. (A direct-mapped table evicted a third of a data set of half as many
 * chunks as slots, over and over, since two chunks of one slot alternate.)
 * Entries are reference-counted: the slot holds one reference, each reader one
 * while it reads, and the last one closes the descriptor, so a descriptor is
 * never closed (and its number reused) under a reader.
 *
 * A short-circuit reader's entries also map their file (read-only, shared), so
 * that a read copies the bytes out of the page cache itself and checks their
 * CRCs in the same pass (stk_crc32c_copy_blocks) instead of a preadv that copies
 * them and a second pass that hashes the copy. Only pages already in the page
 * cache are read through the map (mincore says so first): a page that would come
 * from the disk goes through preadv, which returns an I/O error as EIO where a
 * mapping would raise SIGBUS. The storage node itself keeps reading with preadv.
 */
#define FDC_WAYS 4u

struct fd_ent {
	uint64_t ino;
	uint32_t idx;
	int fd;
	unsigned refs;	  /* under the set's lock */
	uint64_t used;	  /* under the set's lock: its clock (fdc_tick) at the last use */
	/*
	 * The whole file, mapped by the first short-circuit read that finds its bytes
	 * in the page cache (fdc_map), or NULL: read with preadv. Set once, atomically.
	 */
	const uint8_t *map;
	size_t map_len; /* what map covers, or would */
	int mappable; /* cached (settled) in a reader's store: worth a map */
	int dfd; /* atomic: the same file opened O_DIRECT for streams, or -1; set once */
	uint32_t hdr_len, data_len, nblocks;
	struct timespec ctime;
	off_t size;
	uint8_t crcs[]; /* 4 * nblocks, little-endian as on disk */
};

static uint64_t fdc_hash(uint64_t ino, uint32_t idx)
{
	uint64_t h = ino * 0x9E3779B97F4A7C15ull ^ ((uint64_t)idx * 0xBF58476D1CE4E5B9ull);

	return h ^ (h >> 31);
}

/* The first slot of the set of chunk ino/idx. */
static unsigned fdc_set(const struct stk_chunk_store *cs, uint64_t ino, uint32_t idx)
{
	return (unsigned)(fdc_hash(ino, idx) % (cs->fdc_n / FDC_WAYS)) * FDC_WAYS;
}

static pthread_mutex_t *fdc_lock(struct stk_chunk_store *cs, unsigned set)
{
	return &cs->fdc_locks[(set / FDC_WAYS) % FDC_LOCKS];
}

/* The next tick of the clock of set's lock, which the caller holds. */
static uint64_t fdc_tick(struct stk_chunk_store *cs, unsigned set)
{
	return ++cs->fdc_ticks[(set / FDC_WAYS) % FDC_LOCKS];
}

/*
 * File times tick coarsely (a few ms), so a change in place within the tick of
 * the last one would leave ctime as it was. A file is cached only once its ctime
 * is FDC_SETTLE_MS old: any later change then gets a later ctime.
 */
static int settled(const struct timespec *ctime)
{
	struct timespec now;
	int64_t age_ns;

	clock_gettime(CLOCK_REALTIME, &now);
	age_ns = ((int64_t)now.tv_sec - (int64_t)ctime->tv_sec) * 1000000000 +
		 ((int64_t)now.tv_nsec - (int64_t)ctime->tv_nsec);
	return age_ns >= (int64_t)FDC_SETTLE_MS * 1000000;
}

/*
 * Sizes the cache: want entries, at most an eighth of the descriptors allowed (a
 * sixteenth for a reader's, whose entries may hold two each: fdc_direct).
 */
int stk_chunk_cache_init(struct stk_chunk_store *cs, unsigned want, unsigned share)
{
	struct rlimit rl;
	uint64_t max = 64;

	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
		max = STK_MAX((uint64_t)rl.rlim_cur / share, max);
	else
		max = want;
	cs->fdc_n = (unsigned)STK_MIN((uint64_t)want, max) / FDC_WAYS * FDC_WAYS;
	cs->fdc = calloc(cs->fdc_n, sizeof(*cs->fdc));
	if (!cs->fdc)
		return -ENOMEM;
	for (unsigned i = 0; i < FDC_LOCKS; i++)
		pthread_mutex_init(&cs->fdc_locks[i], NULL);
	cs->fdc_ok = 1;
	return 0;
}

static void fdc_put(struct stk_chunk_store *cs, struct fd_ent *e)
{
	pthread_mutex_t *lk;
	int last;

	if (!e)
		return;
	lk = fdc_lock(cs, fdc_set(cs, e->ino, e->idx));
	pthread_mutex_lock(lk);
	last = --e->refs == 0;
	pthread_mutex_unlock(lk);
	if (last) {
		if (e->map)
			munmap((void *)e->map, e->map_len);
		if (e->dfd >= 0)
			close(e->dfd);
		close(e->fd);
		free(e);
	}
}

/* Takes the cached entry of chunk ino/idx out if it is e (or, e NULL, whichever it is). */
void stk_chunk_cache_drop(struct stk_chunk_store *cs, uint64_t ino, uint32_t idx, struct fd_ent *e)
{
	struct fd_ent *old = NULL;
	unsigned set;

	if (!cs->fdc_ok)
		return;
	set = fdc_set(cs, ino, idx);
	pthread_mutex_lock(fdc_lock(cs, set));
	for (unsigned w = set; w < set + FDC_WAYS; w++) {
		struct fd_ent *c = cs->fdc[w];

		if (c && (e ? c == e : c->ino == ino && c->idx == idx)) {
			old = c;
			cs->fdc[w] = NULL;
			break;
		}
	}
	pthread_mutex_unlock(fdc_lock(cs, set));
	fdc_put(cs, old);
}

/* Takes every cached entry of ino out of the set starting at slot set, and releases them. */
static void fdc_forget_set(struct stk_chunk_store *cs, unsigned set, uint64_t ino)
{
	struct fd_ent *gone[FDC_WAYS];
	unsigned n = 0;

	pthread_mutex_lock(fdc_lock(cs, set));
	for (unsigned w = set; w < set + FDC_WAYS; w++)
		if (cs->fdc[w] && cs->fdc[w]->ino == ino) {
			gone[n++] = cs->fdc[w];
			cs->fdc[w] = NULL;
		}
	pthread_mutex_unlock(fdc_lock(cs, set));
	while (n)
		fdc_put(cs, gone[--n]);
}

void stk_chunk_store_forget(struct stk_chunk_store *cs, uint64_t ino, uint64_t nchunks)
{
	if (!cs || !cs->fdc_ok || !nchunks)
		return;
	/* Few chunks: only their sets; many: every set once. */
	if (nchunks < cs->fdc_n / FDC_WAYS)
		for (uint64_t idx = 0; idx < nchunks; idx++)
			fdc_forget_set(cs, fdc_set(cs, ino, (uint32_t)idx), ino);
	else
		for (unsigned set = 0; set < cs->fdc_n; set += FDC_WAYS)
			fdc_forget_set(cs, set, ino);
}

/* Puts e (holding a reference for its slot) in its set; the entry it replaces is released. */
static void fdc_insert(struct stk_chunk_store *cs, struct fd_ent *e)
{
	unsigned set = fdc_set(cs, e->ino, e->idx), victim = set;
	struct fd_ent *old;

	pthread_mutex_lock(fdc_lock(cs, set));
	e->used = fdc_tick(cs, set);
	for (unsigned w = set; w < set + FDC_WAYS; w++) {
		struct fd_ent *c = cs->fdc[w];

		if (c && c->ino == e->ino && c->idx == e->idx) {
			victim = w; /* another thread's opening of the same chunk */
			break;
		}
		if (!c)
			victim = w;
		else if (cs->fdc[victim] && c->used < cs->fdc[victim]->used)
			victim = w;
	}
	old = cs->fdc[victim];
	cs->fdc[victim] = e;
	pthread_mutex_unlock(fdc_lock(cs, set));
	fdc_put(cs, old);
}

/*
 * e's map, made now if it has none: threads may race to it, one map stays. NULL
 * when e is not worth one (not cached, empty, a reader-less store) or mmap fails:
 * e is then read with preadv. A cold chunk read once is never mapped; the first
 * read that finds its bytes cached maps it (mmap and munmap per file cost more
 * than the preadv they would replace).
 */
static const uint8_t *fdc_map(struct fd_ent *e)
{
	const uint8_t *m = __atomic_load_n(&e->map, __ATOMIC_ACQUIRE), *none = NULL;
	void *p;

	if (m || !e->mappable)
		return m;
	p = mmap(NULL, e->map_len, PROT_READ, MAP_SHARED, e->fd, 0);
	if (p == MAP_FAILED)
		return NULL;
	if (__atomic_compare_exchange_n(&e->map, &none, (const uint8_t *)p, 0, __ATOMIC_ACQ_REL,
					__ATOMIC_ACQUIRE))
		return p;
	munmap(p, e->map_len); /* another thread's map won */
	return none;
}

/* The cached entry of chunk ino/idx if its file is still the one it was opened as, or NULL. */
static struct fd_ent *fdc_find(struct stk_chunk_store *cs, uint64_t ino, uint32_t idx)
{
	unsigned set = fdc_set(cs, ino, idx);
	struct fd_ent *e = NULL;
	struct stat st;

	pthread_mutex_lock(fdc_lock(cs, set));
	for (unsigned w = set; w < set + FDC_WAYS; w++) {
		struct fd_ent *c = cs->fdc[w];

		if (c && c->ino == ino && c->idx == idx) {
			e = c;
			e->refs++;
			e->used = fdc_tick(cs, set);
			break;
		}
	}
	pthread_mutex_unlock(fdc_lock(cs, set));
	if (!e)
		return NULL;
	if (fstat(e->fd, &st) == 0 && st.st_nlink > 0 && st.st_size == e->size &&
	    st.st_ctim.tv_sec == e->ctime.tv_sec && st.st_ctim.tv_nsec == e->ctime.tv_nsec)
		return e;
	stk_chunk_cache_drop(cs, ino, idx, e); /* replaced, removed or changed: open it again */
	fdc_put(cs, e);
	return NULL;
}

/*
 * The open chunk file ino/idx, from the cache or opened now (and cached). *out is
 * NULL for a missing chunk. rel is formatted (the chunk's path) only when the
 * file is opened. Release with fdc_put. 0, -EIO (corrupt header) or -errno.
 */
static int fdc_get(struct stk_chunk_store *cs, struct chunk_tls *t, char *rel, uint64_t ino,
		   uint32_t idx, struct fd_ent **out)
{
	struct fd_ent *e = NULL;
	struct chunk_hdr h;
	struct stat st;
	int fd, rc;

	*out = fdc_find(cs, ino, idx);
	if (*out)
		return 0;
	stk_chunk_rel(rel, REL_MAX, ino, idx);
	fd = openat(cs->dirfd, rel, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return errno == ENOENT ? 0 : -errno;
	if (fstat(fd, &st) < 0) {
		rc = -errno;
		goto fail;
	}
	/*
	 * A small chunk (a small file's) is read whole right after: ask for all of it
	 * now, so that a cold one costs one disk read. Else the header's read brings
	 * 16 KiB (the kernel's first readahead) and the bytes after it a second read.
	 * Pages already cached cost no I/O; failure costs only that.
	 */
	if (st.st_size <= (off_t)SMALL_CHUNK)
		(void)posix_fadvise(fd, 0, st.st_size, POSIX_FADV_WILLNEED);
	rc = stk_chunk_hdr_read(cs, t, fd, rel, ino, idx, &h);
	if (rc)
		goto fail;
	e = malloc(sizeof(*e) + 4 * (size_t)h.nblocks);
	if (!e) {
		rc = -ENOMEM;
		goto fail;
	}
	e->ino = ino;
	e->idx = idx;
	e->fd = fd;
	e->refs = 2; /* the slot's and the caller's */
	e->map = NULL;
	e->map_len = (size_t)h.hdr_len + h.data_len;
	e->mappable = 0;
	e->dfd = -1;
	e->hdr_len = h.hdr_len;
	e->data_len = h.data_len;
	e->nblocks = h.nblocks;
	e->ctime = st.st_ctim;
	e->size = st.st_size;
	memcpy(e->crcs, h.crcs, 4 * (size_t)h.nblocks);
	if (!settled(&st.st_ctim)) {
		e->refs = 1; /* used once, not cached */
		*out = e;
		return 0;
	}
	/* A small chunk is not mapped: it is read whole with one preadv, where a map
	 * costs an mmap and, when its entry goes, an munmap that stops every CPU the
	 * reader's threads ran on (a TLB shootdown). */
	e->mappable = cs->reader && e->data_len > 0 && (uint64_t)e->size >= e->map_len &&
		      e->map_len > SMALL_CHUNK;
	fdc_insert(cs, e);
	*out = e;
	return 0;
fail:
	close(fd);
	return rc;
}

static void fdc_free(struct stk_chunk_store *cs)
{
	if (!cs->fdc_ok)
		return;
	for (unsigned i = 0; i < cs->fdc_n; i++)
		fdc_put(cs, cs->fdc[i]);
	for (unsigned i = 0; i < FDC_LOCKS; i++)
		pthread_mutex_destroy(&cs->fdc_locks[i]);
	free(cs->fdc);
}

void stk_chunk_log_mismatch(struct stk_chunk_store *cs, const char *rel, uint64_t ino,
			 uint32_t idx, uint32_t block)
{
	__atomic_fetch_add(&cs->ncorrupt, 1, __ATOMIC_RELAXED);
	stk_error("checksum mismatch: target %u ino 0x%llx chunk %u block %u (%s/%s): refusing to "
		  "return data",
		  stk_chunk_target_id(cs), (unsigned long long)ino, idx, block, cs->dir, rel);
}

/* ---- reads ---- */

/* preadv until every byte of iov arrived or EOF. Bytes read or -errno. */
static long preadv_full(int fd, struct iovec *iov, int n, uint64_t off)
{
	long total = 0;

	while (n > 0) {
		ssize_t r = preadv(fd, iov, n, (off_t)off);

		if (r < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (r == 0)
			break;
		total += r;
		off += (uint64_t)r;
		stk_iov_advance(&iov, &n, (size_t)r);
	}
	return total;
}

/*
 * The bytes [rs, re) of a chunk, read into three pieces: [rs, off) into head,
 * [off, end) into the caller's buffer, [end, re) into tail. This CRCs the part of
 * [lo, hi) that they hold, so blocks are checked without copying the caller's
 * bytes anywhere.
 */
struct read_span {
	uint32_t rs, off, end, re;
	const uint8_t *head, *mid, *tail;
};

static uint32_t span_crc(const struct read_span *s, uint32_t lo, uint32_t hi)
{
	uint32_t crc = 0, a, b;

	a = STK_MAX(lo, s->rs);
	b = STK_MIN(hi, s->off);
	if (a < b)
		crc = stk_crc32c(crc, s->head + (a - s->rs), b - a);
	a = STK_MAX(lo, s->off);
	b = STK_MIN(hi, s->end);
	if (a < b)
		crc = stk_crc32c(crc, s->mid + (a - s->off), b - a);
	a = STK_MAX(lo, s->end);
	b = STK_MIN(hi, s->re);
	if (a < b)
		crc = stk_crc32c(crc, s->tail + (a - s->end), b - a);
	return crc;
}

/*
 * Are the data bytes [off, off + len) of e all in the page cache? A read through
 * the map touches only such pages, so it never waits on the disk nor meets an
 * I/O error there (which would be SIGBUS). cachestat(2) (Linux 6.5) answers from
 * the file's page cache alone; mincore(2), its fallback, walks the process's page
 * tables under the lock that mmap and page faults take, and threads queue on it,
 * and needs e's map (without one the answer is no).
 */
#ifndef SYS_cachestat
#define SYS_cachestat 451 /* the same number on every architecture */
#endif
struct cachestat_range {
	uint64_t off, len;
};
struct cachestat {
	uint64_t nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted;
};
static int g_no_cachestat; /* atomic: the kernel has no cachestat */

static int resident(const struct fd_ent *e, const uint8_t *map, uint32_t off, uint32_t len)
{
	uint64_t psz = (uint64_t)sysconf(_SC_PAGESIZE);
	uint64_t start = (uint64_t)e->hdr_len + off, first = start / psz;
	uint64_t npages = (start + len - 1) / psz - first + 1;
	unsigned char vec[256];

	if (!__atomic_load_n(&g_no_cachestat, __ATOMIC_RELAXED)) {
		struct cachestat_range r = {.off = start, .len = len};
		struct cachestat st;

		if (syscall(SYS_cachestat, e->fd, &r, &st, 0) == 0)
			return st.nr_cache >= npages;
		if (errno != ENOSYS)
			return 0;
		__atomic_store_n(&g_no_cachestat, 1, __ATOMIC_RELAXED);
	}
	for (uint64_t p = first; p < first + npages;) {
		uint64_t n = STK_MIN(first + npages - p, sizeof(vec));

		if (!map || mincore((void *)(map + p * psz), n * psz, vec) < 0)
			return 0;
		for (uint64_t i = 0; i < n; i++)
			if (!(vec[i] & 1))
				return 0;
		p += n;
	}
	return 1;
}

#define MAP_RUN 48u /* blocks copied and hashed per call */

/* Copies the part of block [bs, be) that falls in [off, end) from its copy at part. */
static void copy_part(const struct read_span *s, uint32_t bs, uint32_t be, const uint8_t *part,
		      uint8_t *buf)
{
	uint32_t a = STK_MAX(bs, s->off), z = STK_MIN(be, s->end);

	memcpy(buf + (a - s->off), part + (a - bs), z - a);
}

/*
 * The read of s through e's map: every block of [rs, re) checked, the bytes of
 * [off, end) copied to buf. Every block is copied and hashed in one pass
 * (stk_crc32c_copy_blocks): a block wholly inside [off, end) straight into buf,
 * one the read covers in part (the first, the last) into a block of its own on
 * the stack, from which its part is copied once it checked out; so the bytes
 * checked are the bytes handed out. 0, or the index of the first bad block plus
 * one.
 */
static uint32_t read_mapped(const struct fd_ent *e, const uint8_t *map, const struct read_span *s,
			    uint8_t *buf)
{
	const uint8_t *data = map + e->hdr_len;
	uint8_t head[STK_CHUNK_BLOCK], tail[STK_CHUNK_BLOCK];
	struct stk_crc_copy v[MAP_RUN];
	uint32_t got[MAP_RUN];
	uint32_t bs = s->rs, head_be = 0, tail_bs = UINT32_MAX, end_full;

	/* The chunk's last block may be short: it is done alone, after the others. */
	end_full = s->re / STK_CHUNK_BLOCK * STK_CHUNK_BLOCK;
	while (bs < end_full) {
		uint32_t b0 = bs / STK_CHUNK_BLOCK, n = 0;

		for (; n < MAP_RUN && bs < end_full; n++, bs += STK_CHUNK_BLOCK) {
			uint32_t be = bs + STK_CHUNK_BLOCK;

			v[n].src = data + bs;
			if (bs < s->off || (be > s->end && bs == s->rs)) {
				v[n].dst = head;
				head_be = be;
			} else if (be > s->end) {
				v[n].dst = tail;
				tail_bs = bs;
			} else {
				v[n].dst = buf + (bs - s->off);
			}
		}
		stk_crc32c_copy_blocks(v, n, STK_CHUNK_BLOCK, got);
		for (uint32_t i = 0; i < n; i++)
			if (got[i] != stk_chunk_le32(e->crcs + 4 * (b0 + i)))
				return b0 + i + 1;
	}
	if (end_full < s->re) {
		uint32_t b = end_full / STK_CHUNK_BLOCK, len = s->re - end_full;

		memcpy(tail, data + end_full, len);
		if (stk_crc32c(0, tail, len) != stk_chunk_le32(e->crcs + 4 * b))
			return b + 1;
		tail_bs = end_full;
	}
	if (head_be)
		copy_part(s, s->rs, head_be, head, buf);
	if (tail_bs != UINT32_MAX && tail_bs >= head_be)
		copy_part(s, tail_bs, STK_MIN(tail_bs + STK_CHUNK_BLOCK, s->re), tail, buf);
	return 0;
}

/*
 * The span of a read of [off, off + len) from e (off < e->data_len): whole blocks
 * [rs, re), the caller's bytes [off, end) going to buf, the parts of the first and
 * last blocks outside them to head and tail. Fills iov with the pieces to read, in
 * order, from the data's byte rs; returns their count.
 */
static int span_plan(const struct fd_ent *e, uint32_t off, uint32_t len, uint8_t *buf,
		     uint8_t *head, uint8_t *tail, struct read_span *s, struct iovec *iov)
{
	int n = 0;

	s->off = off;
	s->end = (uint32_t)STK_MIN((uint64_t)off + len, e->data_len);
	s->rs = off / STK_CHUNK_BLOCK * STK_CHUNK_BLOCK;
	s->re = STK_MIN(STK_DIV_ROUND_UP(s->end, STK_CHUNK_BLOCK) * STK_CHUNK_BLOCK, e->data_len);
	s->head = head;
	s->mid = buf;
	s->tail = tail;
	if (s->off > s->rs) {
		iov[n].iov_base = head;
		iov[n++].iov_len = s->off - s->rs;
	}
	iov[n].iov_base = buf;
	iov[n++].iov_len = s->end - s->off;
	if (s->re > s->end) {
		iov[n].iov_base = tail;
		iov[n++].iov_len = s->re - s->end;
	}
	return n;
}

/*
 * Checks what a read of span s from e brought (got bytes from rs, or -errno) and
 * hands out the block checksums (see stk_chunk_read). Bytes of the caller's or
 * -errno; on failure buf is zeroed and e leaves the cache.
 */
static long span_check(struct stk_chunk_store *cs, struct fd_ent *e, const struct read_span *s,
		       long got, uint8_t *buf, uint32_t *crcs)
{
	char rel[REL_MAX];
	long rc;

	if (got < 0) {
		rc = got;
		goto fail;
	}
	stk_chunk_rel(rel, sizeof(rel), e->ino, e->idx); /* for the messages below */
	if ((uint32_t)got != s->re - s->rs) {
		rc = stk_chunk_hdr_corrupt(cs, rel, e->ino, e->idx,
					   "file shorter than its header says");
		goto fail;
	}
	for (uint32_t bs = s->rs; bs < s->re; bs += STK_CHUNK_BLOCK) {
		uint32_t b = bs / STK_CHUNK_BLOCK;
		uint32_t be = STK_MIN(bs + STK_CHUNK_BLOCK, e->data_len);

		if (span_crc(s, bs, be) != stk_chunk_le32(e->crcs + 4 * b)) {
			stk_chunk_log_mismatch(cs, rel, e->ino, e->idx, b);
			rc = -EIO;
			goto fail;
		}
		/* An aligned read hands out the verified block checksums as they are. */
		if (crcs && s->off == s->rs) {
			uint32_t piece_end = STK_MIN(bs + STK_CHUNK_BLOCK, s->end);
			crcs[(bs - s->rs) / STK_CHUNK_BLOCK] =
				piece_end == be ? stk_chunk_le32(e->crcs + 4 * b)
						: stk_crc32c(0, buf + (bs - s->off), piece_end - bs);
		}
	}
	if (crcs && s->off != s->rs)
		stk_crc32c_blocks(buf, s->end - s->off, STK_CHUNK_BLOCK, crcs);
	return s->end - s->off;
fail:
	memset(buf, 0, s->end - s->off);
	stk_chunk_cache_drop(cs, e->ino, e->idx, e); /* a bad file is opened afresh next time */
	return rc;
}

long stk_chunk_read(struct stk_chunk_store *cs, uint64_t ino, uint32_t idx, uint32_t off, void *buf,
		    uint32_t len, uint32_t *crcs)
{
	struct chunk_tls *t = stk_chunk_tls_get();
	uint8_t head[STK_CHUNK_BLOCK], tail[STK_CHUNK_BLOCK];
	char rel[REL_MAX];
	struct fd_ent *e = NULL;
	struct read_span s;
	struct iovec iov[3];
	const uint8_t *map;
	long rc;
	int n, hot = 0;

	if (!t)
		return -ENOMEM;
	if (len == 0)
		return 0;
	rc = fdc_get(cs, t, rel, ino, idx, &e);
	if (rc || !e)
		return rc;
	if (off >= e->data_len) {
		rc = 0;
		goto out;
	}
	n = span_plan(e, off, len, buf, head, tail, &s, iov);
	map = NULL;
	if (e->mappable && !crcs) {
		map = __atomic_load_n(&e->map, __ATOMIC_ACQUIRE);
		if (!map && __atomic_load_n(&g_no_cachestat, __ATOMIC_RELAXED))
			map = fdc_map(e); /* mincore asks about pages through the map */
		hot = resident(e, map, s.rs, s.re - s.rs);
		if (hot && !map)
			map = fdc_map(e); /* cached bytes: worth a map from now on */
	}
	if (hot && map) {
		uint32_t bad = read_mapped(e, map, &s, buf);

		rc = s.end - s.off;
		if (bad) {
			stk_chunk_rel(rel, sizeof(rel), ino, idx);
			stk_chunk_log_mismatch(cs, rel, ino, idx, bad - 1);
			memset(buf, 0, s.end - s.off);
			stk_chunk_cache_drop(cs, ino, idx, e);
			rc = -EIO;
		}
		goto out;
	}
	rc = span_check(cs, e, &s, preadv_full(e->fd, iov, n, (uint64_t)e->hdr_len + s.rs), buf,
			crcs);
out:
	fdc_put(cs, e);
	return rc;
}

/* ---- reads in two steps, for a caller that does the I/O itself ---- */

int stk_chunk_read_begin(struct stk_chunk_store *cs, uint64_t ino, uint32_t idx, uint32_t off,
			 void *buf, uint32_t len, struct stk_chunk_aread *a)
{
	struct fd_ent *e;
	struct read_span s;

	a->e_ = NULL;
	if (len == 0)
		return 0;
	if (!cs->fdc_ok)
		return -EAGAIN;
	e = fdc_find(cs, ino, idx);
	if (!e)
		return -EAGAIN; /* not open: opening it may wait on the disk */
	if (off >= e->data_len) {
		fdc_put(cs, e);
		return 0;
	}
	a->niov = span_plan(e, off, len, buf, a->head_, a->tail_, &s, a->iov);
	a->fd = e->fd;
	a->file_off = (uint64_t)e->hdr_len + s.rs;
	a->want = s.re - s.rs;
	a->rs_ = s.rs;
	a->off_ = s.off;
	a->end_ = s.end;
	a->re_ = s.re;
	a->buf_ = buf;
	a->e_ = e;
	return 1;
}

long stk_chunk_read_end(struct stk_chunk_store *cs, struct stk_chunk_aread *a, long got,
			uint32_t *crcs)
{
	struct fd_ent *e = a->e_;
	struct read_span s = {.rs = a->rs_, .off = a->off_, .end = a->end_, .re = a->re_,
			      .head = a->head_, .mid = a->buf_, .tail = a->tail_};
	long rc;

	if (!e)
		return -EINVAL;
	rc = span_check(cs, e, &s, got, a->buf_, crcs);
	a->e_ = NULL;
	fdc_put(cs, e);
	return rc;
}

void stk_chunk_read_cancel(struct stk_chunk_store *cs, struct stk_chunk_aread *a)
{
	fdc_put(cs, a->e_);
	a->e_ = NULL;
}

/*
 * e's file opened O_DIRECT (kept with e), or -1 when this store cannot (the file
 * system refuses O_DIRECT, or the name now holds another file: a buffered read
 * then opens it afresh).
 */
static int fdc_direct(struct stk_chunk_store *cs, struct fd_ent *e, const char *rel)
{
	int fd = __atomic_load_n(&e->dfd, __ATOMIC_ACQUIRE), none = -1;
	struct stat a, b;

	if (fd >= 0 || __atomic_load_n(&cs->no_direct, __ATOMIC_RELAXED))
		return fd;
	fd = openat(cs->dirfd, rel, O_RDONLY | O_DIRECT | O_CLOEXEC);
	if (fd < 0) {
		if (errno == EINVAL)
			__atomic_store_n(&cs->no_direct, 1, __ATOMIC_RELAXED);
		return -1;
	}
	if (fstat(fd, &a) < 0 || fstat(e->fd, &b) < 0 || a.st_ino != b.st_ino ||
	    a.st_dev != b.st_dev) {
		close(fd);
		return -1;
	}
	if (__atomic_compare_exchange_n(&e->dfd, &none, fd, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
		return fd;
	close(fd); /* another thread's won */
	return none;
}

/*
 * Blocks [off, end) of a chunk read into buf (which holds byte off first) checked
 * against crcs: 0, or -EIO with the mismatch logged and buf zeroed.
 */
static int check_blocks(struct stk_chunk_store *cs, const char *rel, uint64_t ino, uint32_t idx,
			const uint8_t *crcs, uint32_t data_len, void *buf, uint32_t off,
			uint32_t end)
{
	for (uint32_t bs = off; bs < end; bs += STK_CHUNK_BLOCK) {
		uint32_t b = bs / STK_CHUNK_BLOCK, be = STK_MIN(bs + STK_CHUNK_BLOCK, data_len);

		if (stk_crc32c(0, (uint8_t *)buf + (bs - off), be - bs) != stk_chunk_le32(crcs + 4 * b)) {
			stk_chunk_log_mismatch(cs, rel, ino, idx, b);
			memset(buf, 0, end - off);
			return -EIO;
		}
	}
	return 0;
}

/*
 * The start of a chunk that is not in the cache, for a stream: the header and the
 * data in one O_DIRECT read. A cold chunk then costs one disk request instead of
 * two in a row (the header's, then the data's), and one open instead of two.
 * The file is not kept open: a stream reads each chunk once. Bytes read, 0 for a
 * missing chunk, -EIO (corrupt, logged), or -EAGAIN: not this way (no O_DIRECT
 * here, a header longer than HDR_MIN, a file shorter than it says), the cached
 * way then reads it and says why.
 */
static long stream_cold(struct stk_chunk_store *cs, struct chunk_tls *t, char *rel, uint64_t ino,
			uint32_t idx, void *buf, uint32_t len)
{
	struct chunk_hdr h;
	struct stat st;
	struct iovec iov[2];
	uint32_t end;
	long got;
	int fd, rc;

	if (stk_chunk_tls_grow(&t->hdr, &t->hdr_cap, HDR_MIN))
		return -EAGAIN;
	stk_chunk_rel(rel, REL_MAX, ino, idx);
	fd = openat(cs->dirfd, rel, O_RDONLY | O_DIRECT | O_CLOEXEC);
	if (fd < 0) {
		if (errno == ENOENT)
			return 0;
		if (errno == EINVAL)
			__atomic_store_n(&cs->no_direct, 1, __ATOMIC_RELAXED);
		return -EAGAIN;
	}
	if (fstat(fd, &st) < 0 || st.st_size <= (off_t)HDR_MIN) {
		close(fd);
		return -EAGAIN;
	}
	iov[0] = (struct iovec){.iov_base = t->hdr, .iov_len = HDR_MIN};
	/* Whole blocks: the last one is padded on disk (chunk files are whole pages). */
	iov[1] = (struct iovec){.iov_base = buf,
				.iov_len = STK_MIN((uint64_t)len,
						   ((uint64_t)st.st_size - HDR_MIN + STK_CHUNK_BLOCK - 1) /
							   STK_CHUNK_BLOCK * STK_CHUNK_BLOCK)};
	/* One call: a direct read stops short only at the end of the file. */
	got = preadv(fd, iov, 2, 0);
	if (got < 0 && errno == EINVAL) /* alignment this file system refuses: not again */
		__atomic_store_n(&cs->no_direct, 1, __ATOMIC_RELAXED);
	close(fd);
	if (got < (long)HDR_MIN)
		return -EAGAIN;
	rc = check_hdr(cs, t->hdr, HDR_MIN, rel, ino, idx, &h);
	if (rc)
		return rc == -ENOSPC ? -EAGAIN : rc;
	end = STK_MIN(len, h.data_len);
	if (got - (long)HDR_MIN < (long)end)
		return -EAGAIN;
	rc = check_blocks(cs, rel, ino, idx, h.crcs, h.data_len, buf, 0, end);
	return rc ? rc : (long)end;
}

long stk_chunk_read_stream(struct stk_chunk_store *cs, uint64_t ino, uint32_t idx, uint32_t off,
			   void *buf, uint32_t len)
{
	struct chunk_tls *t = stk_chunk_tls_get();
	struct fd_ent *e = NULL;
	char rel[REL_MAX];
	uint32_t end, want;
	long got, rc;
	int dfd;

	if (!t)
		return -ENOMEM;
	if (!cs->reader || len < STK_STREAM_MIN || off % STK_CHUNK_BLOCK ||
	    len % STK_CHUNK_BLOCK || (uintptr_t)buf % STK_CHUNK_BLOCK ||
	    __atomic_load_n(&cs->no_direct, __ATOMIC_RELAXED))
		return stk_chunk_read(cs, ino, idx, off, buf, len, NULL);
	if (off == 0 && cs->fdc_ok) {
		e = fdc_find(cs, ino, idx);
		if (!e) {
			rc = stream_cold(cs, t, rel, ino, idx, buf, len);
			if (rc != -EAGAIN)
				return rc;
		}
	}
	if (!e) {
		rc = fdc_get(cs, t, rel, ino, idx, &e);
		if (rc || !e)
			return rc;
	}
	if (off >= e->data_len) {
		rc = 0;
		goto out;
	}
	end = (uint32_t)STK_MIN((uint64_t)off + len, e->data_len);
	want = STK_DIV_ROUND_UP(end - off, STK_CHUNK_BLOCK) * STK_CHUNK_BLOCK;
	stk_chunk_rel(rel, sizeof(rel), ino, idx);
	dfd = e->hdr_len % STK_CHUNK_BLOCK ? -1 : fdc_direct(cs, e, rel);
	got = -1;
	if (dfd >= 0) {
		struct iovec iov = {.iov_base = buf, .iov_len = want};

		got = preadv_full(dfd, &iov, 1, (uint64_t)e->hdr_len + off);
		if (got == -EINVAL) /* alignment this file system refuses: not again */
			__atomic_store_n(&cs->no_direct, 1, __ATOMIC_RELAXED);
	}
	if (got < (long)(end - off)) { /* no direct read: the buffered one says why */
		fdc_put(cs, e);
		return stk_chunk_read(cs, ino, idx, off, buf, len, NULL);
	}
	rc = check_blocks(cs, rel, ino, idx, e->crcs, e->data_len, buf, off, end);
	if (rc)
		stk_chunk_cache_drop(cs, ino, idx, e); /* a bad file is opened afresh next time */
	else
		rc = end - off;
out:
	fdc_put(cs, e);
	return rc;
}

int stk_chunk_prefetch(struct stk_chunk_store *cs, uint64_t ino, uint32_t idx)
{
	return stk_chunk_advise(cs, ino, idx, 0, 0);
}

int stk_chunk_advise(struct stk_chunk_store *cs, uint64_t ino, uint32_t idx, uint32_t off,
		     uint32_t len)
{
	struct chunk_tls *t = stk_chunk_tls_get();
	struct fd_ent *e = NULL;
	char rel[REL_MAX];
	int rc;

	if (!t)
		return -ENOMEM;
	/* Opening it through the cache leaves it open for the read that follows. */
	rc = fdc_get(cs, t, rel, ino, idx, &e);
	if (rc || !e)
		return rc == -EIO ? 0 : rc; /* a corrupt chunk is the read's to report */
	/* WILLNEED queues the readahead and returns; the read that follows finds it. */
	if (len == 0)
		rc = -posix_fadvise(e->fd, 0, 0, POSIX_FADV_WILLNEED);
	else if (off < e->data_len)
		rc = -posix_fadvise(e->fd, (off_t)e->hdr_len + off,
				    (off_t)STK_MIN(len, e->data_len - off), POSIX_FADV_WILLNEED);
	fdc_put(cs, e);
	return rc;
}

/* ---- the store, as a reader ---- */

int stk_chunk_read_id(struct stk_chunk_store *cs)
{
	char buf[32];
	uint64_t v;
	long got;
	int fd;

	fd = openat(cs->dirfd, "target.id", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return errno == ENOENT ? 0 : -errno;
	got = stk_read_full(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (got < 0)
		return (int)got;
	buf[got] = 0;
	while (got > 0 && (buf[got - 1] == '\n' || buf[got - 1] == ' '))
		buf[--got] = 0;
	if (stk_parse_u64(buf, &v) || v == 0 || v > UINT32_MAX) {
		stk_error("%s/target.id is unreadable: refusing to guess the target's id", cs->dir);
		return -EBADMSG;
	}
	cs->id = (uint32_t)v;
	return 0;
}

int stk_chunk_store_open_reader(const char *dir, uint32_t expect_id,
				struct stk_chunk_store **out)
{
	struct stk_chunk_store *cs;
	int rc;

	cs = calloc(1, sizeof(*cs));
	if (!cs)
		return -ENOMEM;
	for (unsigned i = 0; i < LOCK_STRIPES; i++)
		pthread_mutex_init(&cs->locks[i], NULL);
	cs->dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (cs->dirfd < 0 || stk_strlcpy(cs->dir, dir, sizeof(cs->dir))) {
		rc = cs->dirfd < 0 ? -errno : -ENAMETOOLONG;
		goto out;
	}
	rc = stk_chunk_read_id(cs);
	if (rc == 0 && cs->id != expect_id)
		rc = -ESTALE; /* same path, another target: not the one the routing names */
	if (rc == 0)
		rc = stk_chunk_cache_init(cs, FDC_READER, 16);
	cs->reader = 1;
	if (rc)
		goto out;
	*out = cs;
	return 0;
out:
	stk_chunk_store_close(cs);
	return rc;
}

void stk_chunk_store_close(struct stk_chunk_store *cs)
{
	if (!cs)
		return;
	fdc_free(cs);
	if (cs->dirfd >= 0)
		close(cs->dirfd);
	for (unsigned i = 0; i < LOCK_STRIPES; i++)
		pthread_mutex_destroy(&cs->locks[i]);
	free(cs);
}

void stk_chunk_store_after_fork(struct stk_chunk_store *cs)
{
	if (!cs || !cs->fdc_ok)
		return;
	for (unsigned i = 0; i < FDC_LOCKS; i++)
		pthread_mutex_init(&cs->fdc_locks[i], NULL);
}

const char *stk_chunk_store_path(const struct stk_chunk_store *cs)
{
	return cs->dir;
}

uint32_t stk_chunk_store_id(const struct stk_chunk_store *cs)
{
	return stk_chunk_target_id(cs);
}

uint64_t stk_chunk_store_corrupt_count(const struct stk_chunk_store *cs)
{
	return __atomic_load_n(&cs->ncorrupt, __ATOMIC_RELAXED);
}

void stk_chunk_store_note_repaired(struct stk_chunk_store *cs)
{
	__atomic_fetch_add(&cs->nrepaired, 1, __ATOMIC_RELAXED);
}

uint64_t stk_chunk_store_repaired_count(const struct stk_chunk_store *cs)
{
	return __atomic_load_n(&cs->nrepaired, __ATOMIC_RELAXED);
}
