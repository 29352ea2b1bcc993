/*
 * The chunk store: one file per chunk, copy-on-write updates, a CRC32C per 4 KiB
 * block (format in src/chunk/chunkfile.h, reads in src/chunk/chunkfile.c).
 *
 * Why a file per chunk and copy-on-write: a rename is the one atomic update a
 * POSIX file system offers, so writing the whole new chunk beside the old one and
 * renaming it over makes every update all-or-nothing without a journal of our own.
 * The price is that a small write into a large chunk rewrites the chunk; clients
 * send whole or large pieces of chunks, and the write-back buffering of the client
 * library exists to keep it so. Blocks a write does not touch keep their stored
 * CRCs, so a corrupt block stays detectable instead of being re-checksummed, and a
 * block that a write only partly covers is verified before its old bytes are
 * merged.
 *
 * All paths are relative to a descriptor of the target folder (openat and
 * friends), which keeps them short and immune to the folder being renamed.
 *
 * Each thread owns two buffers, grown on demand and kept until it exits (a
 * pthread key frees them): one for a chunk being built (header + data), one for a
 * chunk header being read. Nothing is allocated per I/O once they are warm.
 *
 * A write that replaces a chunk whole skips that buffer: the new file is written
 * from the request's own bytes, large ones with O_DIRECT (see chunk_update).
 *
 * Not done yet: io_uring, and reflink copies of the unchanged part of a chunk.
 */
#include "chunk.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <liburing.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "../chunk/chunkfile_priv.h"
#include "../common/layout.h"
#include "../common/log.h"
#include "../common/util.h"
#include "../proto/codec.h"
#include "../proto/msg.h"

/* ---- small helpers ---- */

static unsigned stripe(uint64_t ino, uint32_t idx)
{
	uint64_t h = ino * 0x9E3779B97F4A7C15ull ^ ((uint64_t)idx * 0xBF58476D1CE4E5B9ull);

	h ^= h >> 29;
	return (unsigned)(h % LOCK_STRIPES);
}

static int fsync_at(int dirfd, const char *rel)
{
	int fd = openat(dirfd, rel, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	int rc = 0;

	if (fd < 0)
		return -errno;
	if (fsync(fd) < 0)
		rc = -errno;
	close(fd);
	return rc;
}

/* A full disk and an exhausted quota are the same thing to a writer. */
static int space_err(int rc)
{
	return rc == -EDQUOT ? -ENOSPC : rc;
}

static void build_hdr(uint8_t *buf, uint32_t hdr_len, uint64_t ino, uint32_t idx, uint32_t data_len,
		      uint32_t nblocks, uint64_t version)
{
	struct stk_wbuf w;
	uint32_t crc_off = HDR_FIXED + 4 * nblocks;

	stk_wbuf_init(&w, buf, HDR_FIXED);
	stk_put_u32(&w, CHUNK_MAGIC);
	stk_put_u16(&w, STK_CHUNK_FORMAT);
	stk_put_u16(&w, 0);
	stk_put_u32(&w, hdr_len);
	stk_put_u32(&w, data_len);
	stk_put_u64(&w, ino);
	stk_put_u32(&w, idx);
	stk_put_u32(&w, nblocks);
	stk_put_u64(&w, version);
	stk_wbuf_init(&w, buf + crc_off, hdr_len - crc_off);
	stk_put_u32(&w, stk_crc32c(0, buf, crc_off));
	memset(buf + crc_off + 4, 0, hdr_len - crc_off - 4);
}

static void put_crc(uint8_t *buf, uint32_t b, uint32_t crc)
{
	struct stk_wbuf w;

	stk_wbuf_init(&w, buf + HDR_FIXED + 4 * b, 4);
	stk_put_u32(&w, crc);
}

/* ---- the chunk lock (chunk.h) ---- */

/* Queues w on stripe st (its mutex held): FIFO, so that no waiter starves. */
static void lock_queue(struct chunk_stripe *st, struct stk_chunk_lockwait *w)
{
	w->next_ = NULL;
	w->done_ = 0;
	if (st->tail)
		st->tail->next_ = w;
	else
		st->head = w;
	st->tail = w;
}

void stk_chunk_lock(struct stk_chunk_store *cs, uint64_t ino, uint32_t idx)
{
	unsigned i = stripe(ino, idx);
	struct chunk_stripe *st = &cs->stripes[i];
	pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
	struct stk_chunk_lockwait w = {.cv_ = &cv};

	pthread_mutex_lock(&cs->locks[i]);
	if (!st->held) {
		st->held = 1;
	} else {
		lock_queue(st, &w);
		while (!w.done_)
			pthread_cond_wait(&cv, &cs->locks[i]);
	}
	pthread_mutex_unlock(&cs->locks[i]);
	pthread_cond_destroy(&cv);
}

int stk_chunk_lock_async(struct stk_chunk_store *cs, uint64_t ino, uint32_t idx,
			 struct stk_chunk_lockwait *w)
{
	unsigned i = stripe(ino, idx);
	struct chunk_stripe *st = &cs->stripes[i];
	int queued = 0;

	pthread_mutex_lock(&cs->locks[i]);
	if (!st->held) {
		st->held = 1;
	} else {
		w->cv_ = NULL;
		lock_queue(st, w);
		queued = 1;
	}
	pthread_mutex_unlock(&cs->locks[i]);
	return queued;
}

void stk_chunk_unlock(struct stk_chunk_store *cs, uint64_t ino, uint32_t idx)
{
	unsigned i = stripe(ino, idx);
	struct chunk_stripe *st = &cs->stripes[i];
	struct stk_chunk_lockwait *w, *call = NULL;

	pthread_mutex_lock(&cs->locks[i]);
	w = st->head;
	if (w) { /* handed on: the lock stays held, by w now */
		st->head = w->next_;
		if (!st->head)
			st->tail = NULL;
		w->done_ = 1;
		if (w->cv_)
			pthread_cond_signal(w->cv_); /* w may be gone once the mutex is let go */
		else
			call = w;
	} else {
		st->held = 0;
	}
	pthread_mutex_unlock(&cs->locks[i]);
	/* Outside the stripe's mutex: the callback may take this lock again. */
	if (call)
		call->granted(call);
}

/* ---- copy-on-write update ---- */

/*
 * What an update does to a chunk: overlay `len` bytes of `data` at `off` (a write),
 * or, when cut is set, shorten the chunk to cut_len bytes (a truncate).
 */
struct chunk_update {
	uint32_t off, len;
	const uint8_t *data;
	int cut;
	uint32_t cut_len;
	uint32_t flags;
	uint32_t chunk_size;
	const uint32_t *crcs; /* CRC32C of each STK_CHUNK_BLOCK piece of data, or NULL */
	struct stk_chunk_wver *v; /* versions (see stk_chunk_write_ver), or NULL */
};

/*
 * The caller's checksum for block [bs, be) of the new chunk, if the update's data
 * covers exactly that block from a block boundary: then no byte needs hashing again.
 */
static int given_crc(const struct chunk_update *u, uint32_t bs, uint32_t be, uint32_t *crc)
{
	uint32_t i, piece_end;

	if (!u->crcs || u->cut || u->off % STK_CHUNK_BLOCK || bs < u->off ||
	    (uint64_t)u->off + u->len <= bs)
		return 0;
	i = (bs - u->off) / STK_CHUNK_BLOCK;
	piece_end = STK_MIN(bs + STK_CHUNK_BLOCK, u->off + u->len);
	if (piece_end != be)
		return 0;
	*crc = u->crcs[i];
	return 1;
}

/* Does the update overlay bytes of [bs, be)? */
static int overlaps(const struct chunk_update *u, uint32_t bs, uint32_t be)
{
	return !u->cut && u->len && u->off < be && (uint64_t)u->off + u->len > bs;
}

/* Does the update overlay all of [bs, be)? */
static int covers(const struct chunk_update *u, uint32_t bs, uint32_t be)
{
	return !u->cut && u->off <= bs && (uint64_t)u->off + u->len >= be;
}

/* pwritev until every byte of iov is written. 0 or -errno. iov is consumed. */
static int pwritev_all(int fd, struct iovec *iov, int n, uint64_t off)
{
	while (n > 0) {
		ssize_t put = pwritev(fd, iov, n, (off_t)off);

		if (put < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (put == 0)
			return -EIO;
		off += (uint64_t)put;
		stk_iov_advance(&iov, &n, (size_t)put);
	}
	return 0;
}

/*
 * May a chunk's data (len bytes, after a header of whole pages) go to the disk
 * with O_DIRECT? Large writes of whole pages from a page-aligned buffer only.
 */
static int odirect_ok(const void *data, uint32_t len)
{
	return len >= LARGE_WRITE_MIN && len % 4096 == 0 && ((uintptr_t)data & 4095) == 0;
}

/* Creates the temporary file, making the inode's folders if they are missing. */
static int create_tmp(struct stk_chunk_store *cs, const char *tmp, uint64_t ino, int *made_dirs)
{
	char rel[REL_MAX];
	int fd, rc;

	fd = openat(cs->dirfd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd >= 0 || errno != ENOENT)
		return fd >= 0 ? fd : -errno;
	snprintf(rel, sizeof(rel), "chunks/%02x", (unsigned)(ino & 0xff));
	if (mkdirat(cs->dirfd, rel, 0755) == 0)
		*made_dirs = 2;
	else if (errno != EEXIST)
		return -errno;
	stk_chunk_rel_dir(rel, sizeof(rel), ino);
	if (mkdirat(cs->dirfd, rel, 0755) == 0) {
		if (!*made_dirs)
			*made_dirs = 1;
	} else if (errno != EEXIST) {
		return -errno;
	}
	fd = openat(cs->dirfd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	rc = fd >= 0 ? fd : -errno;
	return rc;
}

/* Makes the rename durable (the chunk's folder). */
static int sync_dir(struct stk_chunk_store *cs, uint64_t ino)
{
	char rel[REL_MAX];

	stk_chunk_rel_dir(rel, sizeof(rel), ino);
	return fsync_at(cs->dirfd, rel);
}

/*
 * Per thread: a ring of a few entries on which the fsyncs of sync_new wait
 * together. Made at a thread's first sync of a new chunk, freed when it exits;
 * NULL (and one fsync after another) where io_uring is not to be had.
 */
static pthread_key_t g_ring_key;
static pthread_once_t g_ring_once = PTHREAD_ONCE_INIT;
static int g_ring_ok;

static void ring_free(void *p)
{
	io_uring_queue_exit(p);
	free(p);
}

static void ring_init(void)
{
	g_ring_ok = pthread_key_create(&g_ring_key, ring_free) == 0;
}

static struct io_uring *thread_ring(void)
{
	struct io_uring *r;

	pthread_once(&g_ring_once, ring_init);
	if (!g_ring_ok)
		return NULL;
	r = pthread_getspecific(g_ring_key);
	if (r)
		return r;
	r = calloc(1, sizeof(*r));
	if (!r)
		return NULL;
	if (io_uring_queue_init(4, r, 0) < 0) {
		free(r);
		return NULL;
	}
	if (pthread_setspecific(g_ring_key, r)) {
		ring_free(r);
		return NULL;
	}
	return r;
}

/*
 * The sync of a chunk written to tfd (not yet renamed into place) whose folders
 * create_tmp just made (made_dirs 1: the inode's folder, 2: its parent too): the
 * data, and the new folders' entries in their parents, must all be on the disk
 * before the rename. One after another that is a wait on the disk each (a journal
 * commit and a cache flush on ext4 or XFS); sent together on io_uring they share
 * one (W3 create, docs/BENCHMARKS.md). The order that matters is kept: all of them
 * before the rename, the rename's own folder synced after it (sync_dir).
 */
static int sync_new(struct stk_chunk_store *cs, int tfd, uint64_t ino, int made_dirs)
{
	const char *rels[2] = {NULL, "chunks"};
	char xx[16];
	int fds[3] = {tfd, -1, -1}, n = 1, rc = 0;
	struct io_uring *r;

	snprintf(xx, sizeof(xx), "chunks/%02x", (unsigned)(ino & 0xff));
	rels[0] = xx;
	for (int i = 0; i < made_dirs && i < 2; i++) {
		fds[n] = openat(cs->dirfd, rels[i], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (fds[n] < 0) {
			rc = -errno;
			goto out;
		}
		n++;
	}
	r = n > 1 ? thread_ring() : NULL;
	if (r) {
		struct io_uring_cqe *cqe;
		int sent = 0, done = 0, got;

		for (int i = 0; i < n; i++) {
			struct io_uring_sqe *sqe = io_uring_get_sqe(r);

			if (!sqe)
				break;
			io_uring_prep_fsync(sqe, fds[i], i == 0 ? IORING_FSYNC_DATASYNC : 0);
			sent++;
		}
		got = io_uring_submit_and_wait(r, (unsigned)sent);
		for (int i = 0; i < got && io_uring_wait_cqe(r, &cqe) == 0; i++) {
			if (cqe->res < 0 && rc == 0)
				rc = cqe->res;
			io_uring_cqe_seen(r, cqe);
			done++;
		}
		if (done == n)
			goto out;
		/* Not all went (never seen): this thread's ring is given up, as entries
		 * left in it would name descriptors closed below; the plain way follows. */
		pthread_setspecific(g_ring_key, NULL);
		ring_free(r);
		rc = 0;
	}
	if (fdatasync(tfd) < 0)
		rc = -errno;
	for (int i = 1; rc == 0 && i < n; i++)
		if (fsync(fds[i]) < 0)
			rc = -errno;
out:
	for (int i = 1; i < n; i++)
		close(fds[i]);
	return rc;
}

/*
 * Applies u to chunk (ino, idx). Call with the chunk's lock held.
 * *new_len_out is the chunk's length afterwards.
 */
static int chunk_update(struct stk_chunk_store *cs, uint64_t ino, uint32_t idx,
			const struct chunk_update *u, uint32_t *new_len_out)
{
	struct chunk_tls *t = stk_chunk_tls_get();
	char rel[REL_MAX], tmp[REL_MAX + 32];
	struct chunk_hdr oh = {0};
	uint32_t old_len = 0, new_len, nblocks, hdr_len, have = 0;
	uint64_t old_ver = 0, new_ver = 0;
	const uint8_t *data;
	uint8_t *stage;
	int fd = -1, tfd = -1, exists = 0, need_old, direct, uncached = 0, made_dirs = 0, rc;

	if (!t)
		return -ENOMEM;
	stk_chunk_rel(rel, sizeof(rel), ino, idx);
	fd = openat(cs->dirfd, rel, O_RDONLY | O_CLOEXEC);
	if (fd < 0 && errno != ENOENT)
		return -errno;
	if (fd >= 0) {
		exists = 1;
		rc = stk_chunk_hdr_read(cs, t, fd, rel, ino, idx, &oh);
		if (rc == -EIO && !u->cut &&
		    ((u->off == 0 && u->len == u->chunk_size) || (u->v && u->v->full))) {
			/* The whole chunk is being replaced: nothing of the old one is needed. */
			stk_warn("rewriting chunk ino 0x%llx idx %u of target %u whole over a "
				 "corrupt one",
				 (unsigned long long)ino, idx, stk_chunk_target_id(cs));
			close(fd);
			fd = -1;
		} else if (rc) {
			goto out;
		} else {
			old_len = oh.data_len;
			old_ver = oh.version;
		}
	}
	if (u->v) {
		u->v->old = old_ver;
		u->v->now = old_ver;
		if (u->v->base != STK_CHUNK_VER_ANY && u->v->base != old_ver) {
			rc = -EUCLEAN; /* this copy is not the one the sender changed */
			goto out;
		}
		if (u->v->newer_only && old_ver >= u->v->set) {
			rc = 0; /* this copy is as new already: a resync's copy came late */
			new_len = old_len;
			goto out;
		}
		if (u->v->set)
			new_ver = u->v->set;
	}
	if (!new_ver)
		new_ver = u->v && u->v->floor > old_ver + 1 ? u->v->floor : old_ver + 1;

	if (u->cut)
		new_len = STK_MIN(u->cut_len, old_len);
	else if (u->v && u->v->full)
		new_len = u->len; /* the whole chunk is replaced */
	else
		new_len = STK_MAX(old_len, u->off + u->len);
	if (new_len == old_len && (u->cut || u->len == 0) && !(u->v && (u->v->set || u->v->full))) {
		rc = 0; /* nothing changes */
		goto out;
	}
	nblocks = STK_DIV_ROUND_UP(new_len, STK_CHUNK_BLOCK);
	hdr_len = stk_chunk_hdr_size(nblocks);
	/* The old bytes are needed unless this write replaces all of them. */
	need_old = fd >= 0 && old_len > 0 && !covers(u, 0, old_len) && !(u->v && u->v->full);
	/*
	 * A write that replaces every old byte from the chunk's first one (a new
	 * chunk written whole, as a checkpoint's are) is not staged: the file is
	 * written from the header and the caller's bytes with one pwritev, and when
	 * it is large and page-aligned, with O_DIRECT, past the page cache: a stream
	 * of large writes is read back later if at all, and copying it into the page
	 * cache (and flushing it from there at fsync) costs more CPU than the rest
	 * of its way through the node. Any other update builds the new chunk in the
	 * thread's buffer.
	 */
	direct = !need_old && !u->cut && u->off == 0;
	rc = stk_chunk_tls_grow(&t->buf, &t->buf_cap,
		      (size_t)hdr_len + (direct ? 0 : (size_t)nblocks * STK_CHUNK_BLOCK));
	if (rc)
		goto out;
	stage = t->buf + hdr_len;
	data = direct ? u->data : stage;

	if (need_old) {
		uint32_t want = STK_MIN(old_len, nblocks * STK_CHUNK_BLOCK);
		long got = stk_pread_full(fd, stage, want, oh.hdr_len);

		if (got < 0) {
			rc = (int)got;
			goto out;
		}
		if ((uint32_t)got != want) {
			rc = stk_chunk_hdr_corrupt(cs, rel, ino, idx, "file shorter than its header says");
			goto out;
		}
		have = want;
	}
	if (!direct)
		memset(stage + have, 0, (size_t)nblocks * STK_CHUNK_BLOCK - have);

	/*
	 * Blocks whose bytes and length do not change keep their stored CRC. Any other
	 * block that keeps some old bytes is verified before they are merged.
	 */
	for (uint32_t b = 0; b < nblocks; b++) {
		uint32_t bs = b * STK_CHUNK_BLOCK;
		uint32_t new_be = STK_MIN(bs + STK_CHUNK_BLOCK, new_len);
		uint32_t old_be = STK_MIN(bs + STK_CHUNK_BLOCK, old_len);

		if (!need_old || bs >= old_len)
			continue;
		if (!overlaps(u, bs, new_be) && new_be == old_be) {
			put_crc(t->buf, b, stk_chunk_le32(oh.crcs + 4 * b));
			continue;
		}
		if (covers(u, bs, STK_MIN(new_be, old_be)))
			continue; /* no old byte of this block survives */
		if (stk_crc32c(0, stage + bs, old_be - bs) != stk_chunk_le32(oh.crcs + 4 * b)) {
			stk_chunk_log_mismatch(cs, rel, ino, idx, b);
			rc = -EIO;
			goto out;
		}
	}
	if (!direct && !u->cut && u->len)
		memcpy(stage + u->off, u->data, u->len);
	for (uint32_t b = 0; b < nblocks; b++) {
		uint32_t bs = b * STK_CHUNK_BLOCK;
		uint32_t new_be = STK_MIN(bs + STK_CHUNK_BLOCK, new_len);
		uint32_t old_be = STK_MIN(bs + STK_CHUNK_BLOCK, old_len);

		uint32_t crc;

		if (need_old && bs < old_len && !overlaps(u, bs, new_be) && new_be == old_be)
			continue; /* kept above */
		if (!given_crc(u, bs, new_be, &crc))
			crc = stk_crc32c(0, data + bs, new_be - bs);
		put_crc(t->buf, b, crc);
	}
	build_hdr(t->buf, hdr_len, ino, idx, new_len, nblocks, new_ver);

	snprintf(tmp, sizeof(tmp), "%s.tmp.%d", rel, (int)gettid());
	tfd = create_tmp(cs, tmp, ino, &made_dirs);
	if (tfd < 0) {
		rc = space_err(tfd);
		tfd = -1;
		goto out;
	}
	if (direct) {
		struct iovec iov[2] = {{t->buf, hdr_len}, {(void *)data, new_len}};

		rc = -EINVAL;
		if (odirect_ok(data, new_len) && fcntl(tfd, F_SETFL, O_DIRECT) == 0) {
			rc = pwritev_all(tfd, iov, 2, 0);
			uncached = rc == 0;
			if (rc == -EINVAL) /* the file system or device wants another alignment */
				fcntl(tfd, F_SETFL, 0);
		}
		if (rc == -EINVAL) {
			iov[0] = (struct iovec){t->buf, hdr_len};
			iov[1] = (struct iovec){(void *)data, new_len};
			rc = pwritev_all(tfd, iov, 2, 0);
		}
	} else {
		rc = stk_pwrite_all(tfd, t->buf, (size_t)hdr_len + new_len, 0);
	}
	if (rc == 0 && (u->flags & STK_WRITE_SYNC)) {
		if (made_dirs)
			rc = sync_new(cs, tfd, ino, made_dirs);
		else if (fdatasync(tfd) < 0)
			rc = -errno;
	} else if (rc == 0 && !uncached && u->len >= LARGE_WRITE_MIN) {
		/*
		 * Write-behind: a large write that is not synced now starts its way to
		 * the disk at once (the kernel queues it and returns), so that a stream
		 * of them (a checkpoint) keeps the disk busy while the next ones arrive,
		 * and the fsync or close that ends the stream finds little left to
		 * write. Small writes stay in the page cache: a chunk rewritten many
		 * times in a row reaches the disk once. A hint: its failure changes
		 * nothing.
		 */
		sync_file_range(tfd, 0, 0, SYNC_FILE_RANGE_WRITE);
	}
	if (close(tfd) < 0 && rc == 0)
		rc = -errno;
	tfd = -1;
	if (rc == 0 && renameat(cs->dirfd, tmp, cs->dirfd, rel) < 0)
		rc = -errno;
	if (rc == 0)
		stk_chunk_cache_drop(cs, ino, idx, NULL); /* the old file's space goes now, not at eviction */
	if (rc) {
		unlinkat(cs->dirfd, tmp, 0);
		rc = space_err(rc);
		goto out;
	}
	if (!exists)
		__atomic_add_fetch(&cs->nchunks, 1, __ATOMIC_RELAXED);
	if (u->flags & STK_WRITE_SYNC)
		rc = sync_dir(cs, ino); /* the new folders are durable since sync_new */
	if (u->v)
		u->v->now = new_ver;
out:
	if (rc == 0)
		*new_len_out = new_len;
	if (fd >= 0)
		close(fd);
	return rc;
}

/* The arguments of a write, checked. 0 or -EINVAL. */
static int write_args(uint32_t chunk_size, uint32_t off, const void *data, uint32_t len,
		      const struct stk_chunk_wver *v)
{
	if (chunk_size == 0 || chunk_size > STK_MAX_CHUNK_SIZE ||
	    (uint64_t)off + len > chunk_size || (len && !data) || (v && v->full && off))
		return -EINVAL;
	return 0;
}

int stk_chunk_write_locked(struct stk_chunk_store *cs, uint64_t ino, uint32_t idx,
			   uint32_t chunk_size, uint32_t off, const void *data, uint32_t len,
			   const uint32_t *crcs, uint32_t flags, struct stk_chunk_wver *v,
			   uint32_t *chunk_len)
{
	struct chunk_update u = {.off = off,
				 .len = len,
				 .data = data,
				 .flags = flags,
				 .chunk_size = chunk_size,
				 .crcs = crcs,
				 .v = v};
	int rc = write_args(chunk_size, off, data, len, v);

	return rc ? rc : chunk_update(cs, ino, idx, &u, chunk_len);
}

int stk_chunk_write_ver(struct stk_chunk_store *cs, uint64_t ino, uint32_t idx,
			uint32_t chunk_size, uint32_t off, const void *data, uint32_t len,
			const uint32_t *crcs, uint32_t flags, struct stk_chunk_wver *v,
			uint32_t *chunk_len)
{
	int rc = write_args(chunk_size, off, data, len, v);

	if (rc)
		return rc;
	stk_chunk_lock(cs, ino, idx);
	rc = stk_chunk_write_locked(cs, ino, idx, chunk_size, off, data, len, crcs, flags, v,
				    chunk_len);
	if (rc == 0 && v && v->then)
		rc = v->then(v->ctx, v);
	stk_chunk_unlock(cs, ino, idx);
	return rc;
}

int stk_chunk_write(struct stk_chunk_store *cs, uint64_t ino, uint32_t idx, uint32_t chunk_size,
		    uint32_t off, const void *data, uint32_t len, const uint32_t *crcs,
		    uint32_t flags, uint32_t *chunk_len)
{
	return stk_chunk_write_ver(cs, ino, idx, chunk_size, off, data, len, crcs, flags, NULL,
				   chunk_len);
}

/*
 * Opens chunk idx of ino and reads its header: *fd open (the caller closes it), or
 * *fd -1 when the chunk is missing. rel receives its path. 0, -EIO or -errno.
 */
static int open_hdr(struct stk_chunk_store *cs, uint64_t ino, uint32_t idx, char *rel,
		    int *fd, struct chunk_hdr *h)
{
	struct chunk_tls *t = stk_chunk_tls_get();
	int rc;

	*fd = -1;
	if (!t)
		return -ENOMEM;
	stk_chunk_rel(rel, REL_MAX, ino, idx);
	*fd = openat(cs->dirfd, rel, O_RDONLY | O_CLOEXEC);
	if (*fd < 0)
		return errno == ENOENT ? 0 : -errno;
	rc = stk_chunk_hdr_read(cs, t, *fd, rel, ino, idx, h);
	if (rc) {
		close(*fd);
		*fd = -1;
	}
	return rc;
}

int stk_chunk_version(struct stk_chunk_store *cs, uint64_t ino, uint32_t idx, uint64_t *version,
		      uint32_t *len)
{
	struct chunk_hdr h;
	char rel[REL_MAX];
	int fd, rc = open_hdr(cs, ino, idx, rel, &fd, &h);

	*version = 0;
	*len = 0;
	if (rc || fd < 0)
		return rc;
	close(fd);
	*version = h.version;
	*len = h.data_len;
	return 0;
}

int stk_chunk_stat(struct stk_chunk_store *cs, uint64_t ino, uint32_t idx,
		   struct stk_chunk_info *out)
{
	struct chunk_hdr h;
	struct stat st;
	char rel[REL_MAX];
	int fd, rc = open_hdr(cs, ino, idx, rel, &fd, &h);

	memset(out, 0, sizeof(*out));
	if (rc || fd < 0)
		return rc;
	rc = fstat(fd, &st) ? -errno : 0;
	close(fd);
	if (rc)
		return rc;
	out->version = h.version;
	out->len = h.data_len;
	/* The block CRCs stand for the bytes: equal copies have equal digests. */
	out->digest = stk_crc32c(h.data_len, h.crcs, (size_t)h.nblocks * 4);
	out->mtime_sec = (int64_t)st.st_mtim.tv_sec;
	return 0;
}

int stk_chunk_read_whole(struct stk_chunk_store *cs, uint64_t ino, uint32_t idx, void *buf,
			 uint32_t cap, uint32_t *len, uint64_t *version, uint32_t *crcs)
{
	struct chunk_hdr h;
	char rel[REL_MAX];
	ssize_t n;
	long bad;
	int fd, rc;

	*len = 0;
	*version = 0;
	/* one descriptor: the header and the bytes are of one version of the chunk */
	rc = open_hdr(cs, ino, idx, rel, &fd, &h);
	if (rc || fd < 0)
		return rc;
	rc = -EFBIG;
	if (h.data_len > cap)
		goto out;
	n = h.data_len ? pread(fd, buf, h.data_len, h.hdr_len) : 0;
	rc = n < 0 ? -errno : -EIO;
	if (n != (ssize_t)h.data_len)
		goto out;
	for (uint32_t b = 0; b < h.nblocks; b++)
		crcs[b] = stk_chunk_le32(h.crcs + 4 * b);
	bad = stk_crc32c_blocks_check(buf, h.data_len, STK_CHUNK_BLOCK, crcs);
	if (bad >= 0) {
		stk_chunk_log_mismatch(cs, rel, ino, idx, (uint32_t)bad);
		rc = -EIO;
		goto out;
	}
	*len = h.data_len;
	*version = h.version;
	rc = 0;
out:
	close(fd);
	return rc;
}

static int ent_cmp(const void *a, const void *b)
{
	const struct stk_chunk_ent *x = a, *y = b;

	if (x->ino != y->ino)
		return x->ino < y->ino ? -1 : 1;
	return x->idx < y->idx ? -1 : x->idx > y->idx;
}

int stk_chunk_list_bucket(struct stk_chunk_store *cs, unsigned bucket, struct stk_chunk_ent **out,
			  size_t *count)
{
	struct stk_chunk_ent *v = NULL, *nv;
	size_t n = 0, cap = 0;
	char rel[32];
	DIR *mid, *leaf;
	struct dirent *b, *c;
	int fd, rc = 0;

	*out = NULL;
	*count = 0;
	snprintf(rel, sizeof(rel), "chunks/%02x", bucket & 0xffu);
	fd = openat(cs->dirfd, rel, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return errno == ENOENT ? 0 : -errno;
	if (!(mid = fdopendir(fd))) {
		close(fd);
		return -ENOMEM;
	}
	while ((b = readdir(mid)) && !rc) {
		char *end;
		uint64_t ino;

		if (b->d_name[0] == '.')
			continue;
		errno = 0;
		ino = strtoull(b->d_name, &end, 16);
		if (errno || *end)
			continue;
		fd = openat(dirfd(mid), b->d_name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (fd < 0)
			continue;
		if (!(leaf = fdopendir(fd))) {
			close(fd);
			continue;
		}
		while ((c = readdir(leaf))) {
			uint64_t idx;

			if (c->d_name[0] == '.' || strstr(c->d_name, ".tmp.") ||
			    stk_parse_u64(c->d_name, &idx) || idx > UINT32_MAX)
				continue;
			if (n == cap) {
				cap = cap ? 2 * cap : 64;
				nv = realloc(v, cap * sizeof(*v));
				if (!nv) {
					rc = -ENOMEM;
					break;
				}
				v = nv;
			}
			v[n].ino = ino;
			v[n].idx = (uint32_t)idx;
			n++;
		}
		closedir(leaf);
	}
	closedir(mid);
	if (rc) {
		free(v);
		return rc;
	}
	if (n)
		qsort(v, n, sizeof(*v), ent_cmp);
	*out = v;
	*count = n;
	return 0;
}

/* ---- truncate ---- */

/* Reads the chunk indexes present in the inode's folder. *out is malloc'd. */
static int list_chunks(int dfd, uint32_t **out, size_t *count)
{
	uint32_t *idx = NULL, *n;
	size_t cnt = 0, cap = 0;
	struct dirent *de;
	DIR *d;
	int fd, rc = 0;

	*out = NULL;
	*count = 0;
	fd = dup(dfd);
	if (fd < 0)
		return -errno;
	d = fdopendir(fd);
	if (!d) {
		close(fd);
		return -errno;
	}
	while ((de = readdir(d))) {
		uint64_t v;

		/* Names other than plain numbers are "." "..", and in-flight temp files. */
		if (stk_parse_u64(de->d_name, &v) || v > UINT32_MAX)
			continue;
		if (cnt == cap) {
			cap = cap ? cap * 2 : 64;
			n = realloc(idx, cap * sizeof(*idx));
			if (!n) {
				rc = -ENOMEM;
				goto out;
			}
			idx = n;
		}
		idx[cnt++] = (uint32_t)v;
	}
out:
	closedir(d);
	if (rc) {
		free(idx);
		return rc;
	}
	*out = idx;
	*count = cnt;
	return 0;
}

int stk_chunk_truncate(struct stk_chunk_store *cs, uint64_t ino, uint64_t size, uint32_t chunk_size)
{
	char dir[REL_MAX], rel[REL_MAX];
	uint32_t *idx = NULL;
	size_t cnt = 0;
	uint64_t last;
	int dfd, rc, changed = 0;

	if (chunk_size == 0 || chunk_size > STK_MAX_CHUNK_SIZE)
		return -EINVAL;
	last = size ? (size - 1) / chunk_size : 0;
	stk_chunk_rel_dir(dir, sizeof(dir), ino);
	dfd = openat(cs->dirfd, dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0)
		return errno == ENOENT ? 0 : -errno;
	rc = list_chunks(dfd, &idx, &cnt);
	if (rc)
		goto out;
	for (size_t i = 0; i < cnt && rc == 0; i++) {
		stk_chunk_lock(cs, ino, idx[i]);
		if ((uint64_t)idx[i] * chunk_size >= size) {
			stk_chunk_rel(rel, sizeof(rel), ino, idx[i]);
			if (unlinkat(cs->dirfd, rel, 0) == 0) {
				stk_chunk_cache_drop(cs, ino, idx[i], NULL);
				__atomic_sub_fetch(&cs->nchunks, 1, __ATOMIC_RELAXED);
				changed = 1;
			} else if (errno != ENOENT) {
				rc = -errno;
			}
		} else if (idx[i] == last) {
			struct chunk_update u = {.cut = 1,
						 .cut_len = (uint32_t)(size - last * chunk_size),
						 .chunk_size = chunk_size};
			uint32_t len;

			rc = chunk_update(cs, ino, idx[i], &u, &len);
			changed = 1;
		}
		stk_chunk_unlock(cs, ino, idx[i]);
	}
	if (rc)
		goto out;
	if (size == 0) {
		/* A write racing with this one may have put a chunk back: keep the folder then. */
		if (unlinkat(cs->dirfd, dir, AT_REMOVEDIR) == 0) {
			snprintf(rel, sizeof(rel), "chunks/%02x", (unsigned)(ino & 0xff));
			rc = fsync_at(cs->dirfd, rel);
			goto out;
		}
		if (errno != ENOTEMPTY && errno != EEXIST && errno != ENOENT) {
			rc = -errno;
			goto out;
		}
	}
	if (changed && fsync(dfd) < 0)
		rc = -errno;
out:
	free(idx);
	close(dfd);
	return rc;
}

int stk_chunk_punch(struct stk_chunk_store *cs, uint64_t ino, uint32_t first, uint32_t end)
{
	char dir[REL_MAX], rel[REL_MAX];
	uint32_t *idx = NULL;
	size_t cnt = 0;
	int dfd, rc, changed = 0;

	if (first > end)
		return -EINVAL;
	stk_chunk_rel_dir(dir, sizeof(dir), ino);
	dfd = openat(cs->dirfd, dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0)
		return errno == ENOENT ? 0 : -errno;
	/* The folder's listing, not the range: a punch of a huge hole costs its chunks. */
	rc = list_chunks(dfd, &idx, &cnt);
	for (size_t i = 0; rc == 0 && i < cnt; i++) {
		if (idx[i] < first || idx[i] >= end)
			continue;
		stk_chunk_lock(cs, ino, idx[i]);
		stk_chunk_rel(rel, sizeof(rel), ino, idx[i]);
		if (unlinkat(cs->dirfd, rel, 0) == 0) {
			stk_chunk_cache_drop(cs, ino, idx[i], NULL);
			__atomic_sub_fetch(&cs->nchunks, 1, __ATOMIC_RELAXED);
			changed = 1;
		} else if (errno != ENOENT) {
			rc = -errno;
		}
		stk_chunk_unlock(cs, ino, idx[i]);
	}
	if (changed && fsync(dfd) < 0 && rc == 0)
		rc = -errno;
	free(idx);
	close(dfd);
	return rc;
}

/* ---- the store ---- */

/*
 * Walks chunks/<xx>/<ino>/: counts chunk files and removes temporary files that a
 * crash left behind (an update that never reached its rename).
 */
static int scan(struct stk_chunk_store *cs)
{
	DIR *top = NULL, *mid = NULL, *leaf = NULL;
	struct dirent *a, *b, *c;
	uint64_t count = 0, removed = 0;
	int fd, rc = 0;

	fd = openat(cs->dirfd, "chunks", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0 || !(top = fdopendir(fd))) {
		rc = -errno;
		if (fd >= 0)
			close(fd);
		return rc;
	}
	while ((a = readdir(top))) {
		if (a->d_name[0] == '.')
			continue;
		fd = openat(dirfd(top), a->d_name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (fd < 0 || !(mid = fdopendir(fd))) {
			if (fd >= 0)
				close(fd);
			continue;
		}
		while ((b = readdir(mid))) {
			if (b->d_name[0] == '.')
				continue;
			fd = openat(dirfd(mid), b->d_name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
			if (fd < 0 || !(leaf = fdopendir(fd))) {
				if (fd >= 0)
					close(fd);
				continue;
			}
			while ((c = readdir(leaf))) {
				uint64_t v;

				if (c->d_name[0] == '.')
					continue;
				if (strstr(c->d_name, ".tmp.")) {
					if (unlinkat(dirfd(leaf), c->d_name, 0) == 0)
						removed++;
				} else if (stk_parse_u64(c->d_name, &v) == 0) {
					count++;
				}
			}
			closedir(leaf);
		}
		closedir(mid);
	}
	closedir(top);
	cs->nchunks = count;
	if (removed)
		stk_info("%s: removed %llu unfinished chunk updates", cs->dir,
			 (unsigned long long)removed);
	return 0;
}

int stk_chunk_store_open(const char *dir, struct stk_chunk_store **out)
{
	struct stk_chunk_store *cs;
	int rc;

	cs = calloc(1, sizeof(*cs));
	if (!cs)
		return -ENOMEM;
	cs->dirfd = -1;
	for (unsigned i = 0; i < LOCK_STRIPES; i++)
		pthread_mutex_init(&cs->locks[i], NULL);
	rc = stk_mkdir_p(dir, 0755);
	if (rc)
		goto out;
	if (!realpath(dir, cs->dir)) {
		rc = -errno;
		goto out;
	}
	cs->dirfd = open(cs->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (cs->dirfd < 0) {
		rc = -errno;
		goto out;
	}
	if (mkdirat(cs->dirfd, "chunks", 0755) < 0 && errno != EEXIST) {
		rc = -errno;
		goto out;
	}
	rc = stk_chunk_read_id(cs);
	if (rc == 0)
		rc = stk_chunk_cache_init(cs, FDC_SERVER, 8);
	if (rc)
		goto out;
	rc = scan(cs);
	if (rc)
		goto out;
	*out = cs;
	return 0;
out:
	stk_chunk_store_close(cs);
	return rc;
}

int stk_chunk_store_set_id(struct stk_chunk_store *cs, uint32_t id)
{
	char path[PATH_MAX], buf[16];
	int n, rc;

	if (id == 0)
		return -EINVAL;
	if ((size_t)snprintf(path, sizeof(path), "%s/target.id", cs->dir) >= sizeof(path))
		return -ENAMETOOLONG;
	n = snprintf(buf, sizeof(buf), "%u\n", id);
	rc = stk_write_file_atomic(path, buf, (size_t)n);
	if (rc == 0)
		__atomic_store_n(&cs->id, id, __ATOMIC_RELAXED);
	return rc;
}

int stk_chunk_store_stat(struct stk_chunk_store *cs, uint64_t *capacity, uint64_t *used,
			 uint64_t *chunks)
{
	struct statvfs sv;

	if (fstatvfs(cs->dirfd, &sv) < 0)
		return -errno;
	*capacity = (uint64_t)sv.f_blocks * sv.f_frsize;
	*used = (uint64_t)(sv.f_blocks - sv.f_bfree) * sv.f_frsize;
	*chunks = __atomic_load_n(&cs->nchunks, __ATOMIC_RELAXED);
	return 0;
}

int stk_chunk_store_sync(struct stk_chunk_store *cs)
{
	return syncfs(cs->dirfd) < 0 ? -errno : 0;
}
