/*
 * Open files: write-back buffering, striped reads and writes, and the durability
 * points (fsync, close).
 *
 * A handle buffers one contiguous dirty range (write_buffer bytes, 4 MiB by
 * default); a write that does not extend it, or does not fit, flushes it first,
 * and a write as large as the buffer goes straight to storage. Reads flush the
 * buffer first so a handle always reads its own writes. The file size is known
 * to the handle and reported to meta (META_EXTEND) at fsync and close, which is
 * what gives close-to-open consistency: another client's open after our close
 * sees the size and the data.
 *
 * Durability: writes sent without STK_WRITE_SYNC leave their chains "unsynced";
 * fsync and close send the final buffer with STK_WRITE_SYNC, then STOR_SYNC to
 * every chain still unsynced, then META_EXTEND and META_SYNC, and only then
 * return.
 *
 * A failed write is never published as data. Sending the buffer, a write-through
 * or a STOR_SYNC that fails leaves bytes storage may not have (a buffer is dropped
 * when its send fails); the handle then remembers the lowest such offset
 * (fail_off: the write's start, or for a failed sync the lowest offset written
 * since the last sync) and its first error (err). The size it reports to meta is
 * capped at fail_off (never below the size meta had), so a reader sees the bytes
 * storage acknowledged, or the old ones, never zeros nobody wrote; when nothing
 * past meta's size was acknowledged no META_EXTEND goes at all (size and mtime
 * stay). The error is sticky, like Linux's errseq: every later fsync and the close
 * of the handle return it, whatever later writes do, and reads through the handle
 * stop at the capped size. A caller that wants to retry opens a new handle.
 *
 * Locking: f->lock protects the buffer, the position, the size and the unsynced
 * set. Reads hold it only to flush and read the size, so many threads can pread
 * one handle in parallel.
 */
#include "behind.h"
#include "client.h"
#include "inode.h"
#include "session.h"
#include "../chunk/chunkfile.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../common/layout.h"
#include "../common/util.h"

#define STK_FILE_RANGES 8

struct stk_file {
	struct stk_client *c;
	pthread_mutex_t lock;
	struct stk_attr attr; /* as of open; attr.size is not kept current, size is */
	uint32_t chains[STK_MAX_STRIPE];
	int accmode; /* O_RDONLY, O_WRONLY, O_RDWR */
	int append;
	int is_dir;
	uint64_t pos;
	uint64_t size;
	int size_dirty; /* size/mtime to report to meta */
	/*
	 * For st_blocks (META_EXTEND): the chunks written since the last report, as
	 * nalloc ranges [first, end) (sorted, apart; past STK_FILE_RANGES the two
	 * closest merge), and the whole chunks a fallocate removed since (first ==
	 * end: none).
	 */
	uint32_t alloc[STK_FILE_RANGES][2];
	unsigned nalloc;
	uint32_t punch_first, punch_end;
	char *wbuf;
	size_t wcap;
	uint64_t woff;
	size_t wlen;
	uint8_t unsynced[STK_MAX_STRIPE]; /* by stripe index */
	int any_unsynced;
	uint64_t unsynced_low; /* lowest offset written unsynced since the last sync; UINT64_MAX */
	uint64_t meta_size; /* the size meta has as far as this handle knows (open, truncate, extend) */
	uint64_t fail_off; /* lowest offset storage may not have (a write failed); UINT64_MAX */
	int err; /* first failure of a data write or sync: sticky, every fsync and close return it */
	uint64_t seq_next; /* where a sequential reader's next read starts */
	uint64_t ra_end; /* chunks below this offset have been prefetched */
	int registered; /* an open reference in the client's session (session.c) */
	/*
	 * Quotas (quota.c): bytes may be written below `granted` without asking meta;
	 * UINT64_MAX for a file opened without a quota. Valid while quota_epoch is
	 * the client's.
	 */
	uint64_t granted;
	uint32_t quota_epoch;
	/*
	 * Of that room, bytes taken from the client's byte allowance in the quota
	 * (behind.h), not yet reported: always [meta_size, meta_size + taken), the
	 * lowest room past meta's size, so a report of size s spends
	 * min(taken, s - meta_size) of them. `reserving`: the handle asked META_QUOTA
	 * (none was left) and takes no more.
	 */
	uint64_t taken;
	struct stk_bytes_tag btag;
	int reserving;
	_Atomic int locked; /* stk_lock was called with owner 0 */
};

/* Read-ahead for a sequential reader: twice the request, within these bounds. */
#define STK_RA_MIN (8ull << 20)
#define STK_RA_MAX (64ull << 20)

/*
 * Decides, under f->lock, whether a read of [off, off+len) continues a sequential
 * stream, and if so which range to prefetch past it. Returns 1 with the range set.
 */
static int readahead_range(struct stk_file *f, uint64_t off, uint64_t len, uint64_t size,
			   uint64_t *from, uint64_t *to)
{
	uint64_t ra, end = off + len;
	int seq = off == f->seq_next;

	f->seq_next = end;
	if (!seq)
		return 0;
	ra = STK_MIN(STK_MAX(2 * len, STK_RA_MIN), STK_RA_MAX);
	*from = STK_MAX(f->ra_end, end);
	*to = STK_MIN(end + ra, size);
	if (*from >= *to)
		return 0;
	/* Whole chunks only, and not the one this read already covers. */
	f->ra_end = *to;
	return 1;
}

/* Sends a prefetch hint for each chunk that [from, to) touches. */
static void prefetch(struct stk_file *f, uint64_t from, uint64_t to, uint32_t flags)
{
	uint64_t cs = f->attr.layout.chunk_size;
	uint64_t first = (from + cs - 1) / cs, last = (to - 1) / cs;
	struct stk_io_piece p[64];
	unsigned n = 0;

	for (uint64_t i = first; i <= last && n < STK_ARRAY_SIZE(p); i++, n++) {
		memset(&p[n], 0, sizeof(p[n]));
		p[n].chain_id = stk_layout_chunk_chain(&f->attr.layout, f->chains, i);
		p[n].chunk_idx = (uint32_t)i;
	}
	if (n)
		stk_io_run(f->c, STK_IO_PREFETCH, f->attr.ino, &f->attr.layout, p, n, flags);
}


#define STK_MAX_FILE_SIZE ((uint64_t)UINT32_MAX * STK_MIN_CHUNK_SIZE)

/* Records that bytes from off on may not be on storage. Called with f->lock held. */
static void note_failure(struct stk_file *f, uint64_t off, int rc)
{
	if (!f->err)
		f->err = rc;
	if (off < f->fail_off)
		f->fail_off = off;
}

/*
 * The size others may see: f->size, or when a write failed below it, the failed
 * offset (but never below what meta had: those bytes are old ones or holes).
 * Called with f->lock held.
 */
static uint64_t visible_size(const struct stk_file *f)
{
	if (f->fail_off >= f->size)
		return f->size;
	return STK_MAX(f->fail_off, STK_MIN(f->meta_size, f->size));
}

/* Builds per-chunk pieces for [off, off+len). Returns the count or -ENOMEM. */
static int make_pieces(struct stk_file *f, char *buf, size_t len, uint64_t off,
		       struct stk_io_piece **out, struct stk_io_piece *stackp, unsigned stackn)
{
	uint64_t cs = f->attr.layout.chunk_size;
	unsigned n = (unsigned)((off + len - 1) / cs - off / cs + 1);
	struct stk_io_piece *p = n <= stackn ? stackp : malloc(sizeof(*p) * n);
	unsigned i = 0;

	if (!p)
		return -ENOMEM;
	while (len) {
		uint64_t idx = off / cs;
		uint32_t in = (uint32_t)(off % cs);
		uint32_t take = (uint32_t)STK_MIN((uint64_t)len, cs - in);

		p[i].chain_id = stk_layout_chunk_chain(&f->attr.layout, f->chains, idx);
		p[i].chunk_idx = (uint32_t)idx;
		p[i].offset = in;
		p[i].length = take;
		p[i].buf = buf;
		p[i].done = 0;
		i++;
		buf += take;
		off += take;
		len -= take;
	}
	*out = p;
	return (int)i;
}

/* Chunks [first, end) hold data now: the range reported grows to cover them. */
static void written(struct stk_file *f, uint32_t first, uint32_t end)
{
	uint32_t out[STK_FILE_RANGES + 1][2];
	unsigned i = 0, k = 0;

	for (; i < f->nalloc && f->alloc[i][1] < first; i++)
		out[k][0] = f->alloc[i][0], out[k++][1] = f->alloc[i][1];
	for (; i < f->nalloc && f->alloc[i][0] <= end; i++) {
		first = STK_MIN(first, f->alloc[i][0]);
		end = STK_MAX(end, f->alloc[i][1]);
	}
	out[k][0] = first, out[k++][1] = end;
	for (; i < f->nalloc; i++)
		out[k][0] = f->alloc[i][0], out[k++][1] = f->alloc[i][1];
	if (k > STK_FILE_RANGES) {
		/* The two closest join: the hole between them is reported as written. */
		unsigned best = 0;

		for (unsigned j = 1; j + 1 < k; j++)
			if (out[j + 1][0] - out[j][1] < out[best + 1][0] - out[best][1])
				best = j;
		out[best][1] = out[best + 1][1];
		memmove(&out[best + 1], &out[best + 2], (k - best - 2) * sizeof(out[0]));
		k--;
	}
	memcpy(f->alloc, out, k * sizeof(out[0]));
	f->nalloc = k;
}

/*
 * One META_EXTEND: the size and mtime, chunks [first, end) written and, when
 * punch, the handle's punched chunks. Called with f->lock held.
 */
static int send_extend(struct stk_file *f, uint64_t size, uint32_t first, uint32_t end,
		       int punch)
{
	struct stk_msg_meta_extend_req m;
	struct stk_msg_meta_extend_ext x = {0};
	uint8_t req[256];
	struct stk_wbuf w;
	size_t plain;
	int sent = 0, rc;

	memset(&m, 0, sizeof(m));
	m.cred = f->c->cred;
	m.ino = f->attr.ino;
	m.size = size;
	stk_wall_time(&m.mtime_sec, &m.mtime_nsec);
	m.alloc_first = first;
	m.alloc_end = end;
	if (punch) {
		m.punch_first = f->punch_first;
		m.punch_end = f->punch_end;
	}
	stk_wbuf_init(&w, req, sizeof(req));
	stk_msg_meta_extend_req_enc(&w, &m);
	/*
	 * The last report of a sync (punch) spends what it covers of the bytes taken
	 * from the allowance, while meta still holds them for this holder.
	 */
	plain = w.len;
	if (punch && f->taken && size > f->meta_size && stk_behind_bytes_valid(f->c, &f->btag)) {
		x.session = stk_session_id(f->c);
		x.spent = STK_MIN(f->taken, size - f->meta_size);
		stk_msg_meta_extend_ext_enc(&w, &x);
	}
	rc = stk_client_meta_attr_call_own_ext(f->c, m.ino, STK_OP_META_EXTEND, req, w.len, plain,
					       f->btag.holder, &sent);
	if (rc == 0 && x.spent) {
		/* Not sent (another holder now): meta dropped them; they count as any. */
		if (sent)
			stk_behind_bytes_done(f->c, &f->btag, x.spent, 0);
		f->taken -= x.spent;
	}
	return rc;
}

static int sync_locked(struct stk_file *f);

/* The handle's unreported bytes of the allowance go back to the client's. */
static void bytes_back(struct stk_file *f)
{
	if (f->taken)
		stk_behind_bytes_done(f->c, &f->btag, 0, f->taken);
	f->taken = 0;
}

/*
 * Before a write that ends at `end`: room in the file's quota, asked of meta when
 * it passes what this handle holds. -EDQUOT before any byte goes anywhere.
 * Called with f->lock held.
 */
static int quota_room(struct stk_file *f, uint64_t end)
{
	uint32_t epoch = atomic_load(&f->c->quota_epoch);
	uint64_t g;
	int rc;

	if (f->quota_epoch != epoch && f->granted != UINT64_MAX) {
		f->granted = f->meta_size; /* meta restarted: what was reserved is gone */
		f->quota_epoch = epoch;
		f->taken = 0; /* and so is the allowance taken from */
	}
	if (end <= f->granted || end <= f->meta_size)
		return 0;
	if (!f->reserving) {
		/* What was taken is [meta_size, granted); with none, from meta_size on. */
		uint64_t base = f->taken ? f->granted : f->meta_size;
		struct stk_bytes_tag t;

		/* Room from the client's byte allowance: no round trip (behind.h). */
		if (end > base &&
		    stk_behind_bytes_take(f->c, f->attr.ino, f->attr.qid, end - base, &t) == 0) {
			if (!f->taken || !memcmp(&t, &f->btag, sizeof(t))) {
				f->btag = t;
				f->taken += end - base;
				f->granted = end;
				return 0;
			}
			/* The first was taken under a holder meta reset since: reserve. */
			stk_behind_bytes_done(f->c, &t, 0, end - base);
		}
		/*
		 * None left: META_QUOTA decides (EDQUOT, or what room is left), exactly.
		 * So what this handle took is reported first (it becomes used, not
		 * counted twice), and what the client holds unspent goes back to meta.
		 */
		if (f->taken) {
			sync_locked(f); /* a failure is the handle's sticky error */
			bytes_back(f);
			f->granted = f->meta_size;
		}
		stk_behind_bytes_release(f->c, f->attr.qid);
		f->reserving = 1;
	}
	rc = stk_client_quota_room(f->c, f->attr.ino, end, &g);
	if (rc)
		return rc;
	f->granted = g;
	return 0;
}

static int write_through(struct stk_file *f, const char *buf, size_t len, uint64_t off,
			 uint32_t flags)
{
	struct stk_io_piece stackp[8], *p;
	int n, rc;

	if (len == 0)
		return 0;
	n = make_pieces(f, (char *)buf, len, off, &p, stackp, 8);
	if (n < 0)
		return n;
	rc = stk_io_run(f->c, STK_IO_WRITE, f->attr.ino, &f->attr.layout, p, (unsigned)n, flags);
	for (int i = 0; i < n; i++)
		if (p[i].rc == 0)
			written(f, p[i].chunk_idx, p[i].chunk_idx + 1);
	if (!(flags & STK_WRITE_SYNC)) {
		for (int i = 0; i < n; i++) {
			f->unsynced[p[i].chunk_idx % f->attr.layout.stripe] = 1;
			f->any_unsynced = 1;
		}
		if (off < f->unsynced_low)
			f->unsynced_low = off;
	}
	/* Some pieces may have landed, others not: none of it counts from off on. */
	if (rc)
		note_failure(f, off, rc);
	if (p != stackp)
		free(p);
	return rc;
}

/*
 * Sends the buffered range. Called with f->lock held. A send that fails drops the
 * buffer (write_through has recorded the failure, so its bytes are never published).
 */
static int flush_buffer(struct stk_file *f, uint32_t flags)
{
	int rc;

	if (!f->wlen)
		return 0;
	rc = write_through(f, f->wbuf, f->wlen, f->woff, flags);
	f->wlen = 0;
	return rc;
}

static int may_access(const struct stk_client *c, const struct stk_attr *a, int want)
{
	unsigned bits;

	if (c->cred.uid == 0)
		return 0;
	if (a->uid == c->cred.uid)
		bits = (a->mode >> 6) & 7;
	else if (stk_cred_in_group(&c->cred, a->gid))
		bits = (a->mode >> 3) & 7;
	else
		bits = a->mode & 7;
	return (bits & (unsigned)want) == (unsigned)want ? 0 : -EACCES;
}

/*
 * O_CREAT: creates or finds the file and, when it is a regular file, registers it
 * for this client's session in the same request. On 0 with *registered 1 the
 * caller owns that reference; on an error none is left registered.
 */
static int create_file(struct stk_client *c, const char *path, int flags, mode_t mode,
		       struct stk_attr *a, int *registered)
{
	char name[STK_NAME_MAX + 1];
	struct stk_attr parent;
	int created = 0, rc;

	*registered = 0;
	rc = stk_client_resolve_parent(c, path, &parent, name);
	if (rc)
		return rc == -EINVAL ? -EISDIR : rc;
	rc = stk_ino_create_open(c, NULL, parent.ino, name, mode, !!(flags & O_EXCL), a, &created,
				 NULL);
	if (rc)
		return rc;
	if (S_ISLNK(a->mode)) /* O_CREAT on a symlink opens its target */
		return stk_client_resolve(c, path, 1, a);
	*registered = S_ISREG(a->mode);
	if (!created) {
		int want = 0;
		if ((flags & O_ACCMODE) != O_WRONLY)
			want |= 4;
		if ((flags & O_ACCMODE) != O_RDONLY)
			want |= 2;
		if (S_ISDIR(a->mode) && (flags & O_ACCMODE) != O_RDONLY)
			rc = -EISDIR;
		else
			rc = may_access(c, a, want);
	}
	if (rc && *registered) {
		stk_ino_unregister(c, a->ino);
		*registered = 0;
	}
	return rc;
}

/*
 * Opens a handle on an inode whose attributes are known. registered: the caller
 * holds an open reference on it, which the handle takes over (and drops on
 * failure); otherwise a regular file is registered here.
 */
static int open_attr(struct stk_client *c, const struct stk_attr *a, int flags, int registered,
		     stk_file **out)
{
	struct stk_file *f;
	int acc = flags & O_ACCMODE, rc;

	if (!S_ISREG(a->mode) && !S_ISDIR(a->mode)) {
		rc = -EINVAL;
		goto fail;
	}
	if (S_ISREG(a->mode) && stk_layout_check(&a->layout)) {
		rc = -EIO;
		goto fail;
	}
	f = calloc(1, sizeof(*f));
	if (!f) {
		rc = -ENOMEM;
		goto fail;
	}
	f->c = c;
	f->attr = *a;
	f->accmode = acc;
	f->append = !!(flags & O_APPEND);
	f->is_dir = S_ISDIR(a->mode);
	f->size = a->size;
	f->meta_size = a->size;
	f->fail_off = UINT64_MAX;
	f->unsynced_low = UINT64_MAX;
	f->granted = a->qid ? a->size : UINT64_MAX;
	f->quota_epoch = atomic_load(&c->quota_epoch);
	pthread_mutex_init(&f->lock, NULL);
	if (!f->is_dir)
		stk_layout_chains(&a->layout, f->chains);
	if ((flags & O_TRUNC) && acc != O_RDONLY && !f->is_dir) {
		if (a->size) {
			struct stk_attr v = {.size = 0};
			rc = stk_ino_setattr(c, NULL, a->ino, STK_SETATTR_SIZE, &v, NULL);
			if (rc)
				goto out;
		}
		f->size = 0;
		f->meta_size = 0;
		f->size_dirty = 1;
		if (f->granted != UINT64_MAX)
			f->granted = 0;
	}
	if (acc != O_RDONLY && !f->is_dir) {
		f->wcap = c->opts.write_buffer;
		f->wbuf = malloc(f->wcap);
		if (!f->wbuf) {
			rc = -ENOMEM;
			goto out;
		}
	}
	if (!f->is_dir && !registered) {
		/* Meta keeps the file while it is open here, even when its last name goes. */
		rc = stk_session_open(c, a->ino, NULL);
		if (rc < 0) {
			free(f->wbuf);
			goto out;
		}
	}
	f->registered = !f->is_dir;
	if (f->is_dir && registered)
		stk_session_close(c, a->ino);
	*out = f;
	return 0;
out:
	pthread_mutex_destroy(&f->lock);
	free(f);
fail:
	if (registered)
		stk_session_close(c, a->ino);
	return rc;
}

static int ino_open(stk_client *c, const struct stk_attr *attr, int flags, int registered,
		    stk_file **out)
{
	int acc = flags & O_ACCMODE, rc = 0;

	if (acc != O_RDONLY && acc != O_WRONLY && acc != O_RDWR)
		rc = -EINVAL;
	else if (S_ISDIR(attr->mode) && acc != O_RDONLY)
		rc = -EISDIR;
	if (rc == 0)
		return open_attr(c, attr, flags, registered, out);
	if (registered)
		stk_session_close(c, attr->ino);
	return rc;
}

int stk_ino_open(stk_client *c, const struct stk_cred *cred, const struct stk_attr *attr,
		 int flags, stk_file **out)
{
	(void)cred;
	return ino_open(c, attr, flags, 0, out);
}

int stk_ino_open_registered(stk_client *c, const struct stk_cred *cred, const struct stk_attr *attr,
			    int flags, stk_file **out)
{
	(void)cred;
	return ino_open(c, attr, flags, 1, out);
}

int stk_ino_open_attr(stk_client *c, const struct stk_cred *cred, uint64_t ino,
		      struct stk_attr *out)
{
	int rc;

	/* The cache's leased attributes are as fresh as meta's: no round trip. */
	if (stk_session_open_cached(c, ino, out))
		return 0;
	rc = stk_session_open(c, ino, out);
	if (rc != 0)
		return rc < 0 ? rc : 0;
	/* No attributes came with it (sessions off, an older meta): ask for them. */
	rc = stk_ino_getattr(c, cred, ino, out);
	if (rc)
		stk_session_close(c, ino);
	return rc;
}

void stk_ino_unregister(stk_client *c, uint64_t ino)
{
	stk_session_close(c, ino);
}

uint64_t stk_file_ino(const stk_file *f)
{
	return f->attr.ino;
}

int stk_open(stk_client *c, const char *path, int flags, mode_t mode, stk_file **out)
{
	struct stk_attr a;
	int acc = flags & O_ACCMODE, registered = 0, rc;

	if (acc != O_RDONLY && acc != O_WRONLY && acc != O_RDWR)
		return -EINVAL;
	if (flags & O_CREAT) {
		/* One round trip creates (or finds) and registers the file. */
		rc = create_file(c, path, flags, mode, &a, &registered);
		if (rc)
			return rc;
	} else {
		int want = (acc == O_RDONLY ? 4 : acc == O_WRONLY ? 2 : 6);
		rc = stk_client_resolve(c, path, 1, &a);
		if (rc)
			return rc;
		if (S_ISDIR(a.mode) && acc != O_RDONLY)
			return -EISDIR;
		rc = may_access(c, &a, want);
		if (rc)
			return rc;
	}
	return open_attr(c, &a, flags, registered, out);
}

/*
 * Makes everything written durable and records the size, only as far as storage
 * acknowledged the bytes (the file's top comment). Returns the handle's sticky
 * error first, else the first error of this call. Called with f->lock held.
 */
static int sync_locked(struct stk_file *f)
{
	struct stk_client *c = f->c;
	int rc, first = 0;

	flush_buffer(f, STK_WRITE_SYNC); /* a failure is in f->err */
	if (f->any_unsynced) {
		for (uint32_t i = 0; i < f->attr.layout.stripe; i++) {
			if (!f->unsynced[i])
				continue;
			rc = stk_io_sync_chain(c, f->chains[i]);
			/* What the chain holds since its last sync may be lost: from the
			 * lowest offset written since, nothing is known to be durable. */
			if (rc)
				note_failure(f, f->unsynced_low, rc);
			f->unsynced[i] = 0;
		}
		f->any_unsynced = 0;
		f->unsynced_low = UINT64_MAX;
	}
	if (f->size_dirty) {
		unsigned n = f->nalloc;
		uint64_t size = visible_size(f);

		/* A range per request; the last carries the punch, which meta applies after.
		 * After a failure, only a size that grows over acknowledged bytes is news;
		 * otherwise meta keeps the old size and mtime. */
		rc = 0;
		if (!f->err || size > f->meta_size) {
			for (unsigned i = 0; rc == 0 && i + 1 < n; i++)
				rc = send_extend(f, size, f->alloc[i][0], f->alloc[i][1], 0);
			if (rc == 0)
				rc = send_extend(f, size, n ? f->alloc[n - 1][0] : 0,
						 n ? f->alloc[n - 1][1] : 0, 1);
		}
		if (rc && !first)
			first = rc;
		if (!rc) {
			if (size > f->meta_size)
				f->meta_size = size;
			f->size_dirty = 0;
			f->nalloc = 0;
			f->punch_first = f->punch_end = 0;
		}
	}
	rc = stk_client_meta_call(c, STK_OP_META_SYNC, NULL, 0, NULL, 0, NULL);
	if (rc && !first)
		first = rc;
	return f->err ? f->err : first;
}

int stk_fsync(stk_file *f)
{
	int rc;

	if (f->is_dir || f->accmode == O_RDONLY)
		return 0;
	pthread_mutex_lock(&f->lock);
	rc = sync_locked(f);
	pthread_mutex_unlock(&f->lock);
	return rc;
}

int stk_close(stk_file *f)
{
	int rc = 0;

	if (!f)
		return -EBADF;
	if (!f->is_dir && f->accmode != O_RDONLY &&
	    (f->wlen || f->any_unsynced || f->size_dirty || f->err)) {
		pthread_mutex_lock(&f->lock);
		rc = sync_locked(f);
		pthread_mutex_unlock(&f->lock);
	}
	if (atomic_load(&f->locked)) {
		struct stk_lock_range un = {.type = STK_LOCK_UN, .end = STK_LOCK_EOF};
		stk_ino_lock(f->c, f->attr.ino, STK_LOCK_POSIX, &un, (uint64_t)(uintptr_t)f, 0, NULL,
			     NULL);
		stk_ino_lock(f->c, f->attr.ino, STK_LOCK_FLOCK, &un, (uint64_t)(uintptr_t)f, 0, NULL,
			     NULL);
	}
	bytes_back(f); /* what the size reports above did not spend */
	/* Last: the data and size above are in place before meta may drop an orphan. */
	if (f->registered)
		stk_session_close(f->c, f->attr.ino);
	pthread_mutex_destroy(&f->lock);
	free(f->wbuf);
	free(f);
	return rc;
}

int stk_lock(stk_file *f, int kind, const struct stk_lock_range *r, uint64_t owner, int wait)
{
	if (!f || !r)
		return -EINVAL;
	if (f->is_dir)
		return -EBADF;
	if (owner == 0) {
		owner = (uint64_t)(uintptr_t)f;
		atomic_store(&f->locked, 1);
	}
	return stk_ino_lock(f->c, f->attr.ino, kind, r, owner, wait, NULL, NULL);
}

int stk_lock_test(stk_file *f, int kind, struct stk_lock_range *r, uint64_t owner)
{
	if (!f || !r)
		return -EINVAL;
	if (f->is_dir)
		return -EBADF;
	if (owner == 0)
		owner = (uint64_t)(uintptr_t)f;
	return stk_ino_lock_test(f->c, f->attr.ino, kind, r, owner);
}

static ssize_t pwrite_locked(struct stk_file *f, const void *buf, size_t len, uint64_t off)
{
	int rc;

	if (off + len < off || off + len > STK_MAX_FILE_SIZE)
		return -EFBIG;
	if (len == 0)
		return 0;
	rc = quota_room(f, off + len);
	if (rc)
		return rc;
	if (f->wlen && (off != f->woff + f->wlen || f->wlen + len > f->wcap)) {
		rc = flush_buffer(f, 0);
		if (rc)
			return rc;
	}
	if (len >= f->wcap) {
		rc = write_through(f, buf, len, off, 0);
		if (rc)
			return rc;
	} else {
		if (!f->wlen)
			f->woff = off;
		memcpy(f->wbuf + f->wlen, buf, len);
		f->wlen += len;
	}
	if (off + len > f->size)
		f->size = off + len;
	f->size_dirty = 1;
	return (ssize_t)len;
}

ssize_t stk_pwrite(stk_file *f, const void *buf, size_t len, off_t off)
{
	ssize_t rc;

	if (f->is_dir)
		return -EISDIR;
	if (f->accmode == O_RDONLY)
		return -EBADF;
	if (off < 0)
		return -EINVAL;
	pthread_mutex_lock(&f->lock);
	/* POSIX leaves pwrite on O_APPEND to the OS; Linux appends, and so do we. */
	rc = pwrite_locked(f, buf, len, f->append ? f->size : (uint64_t)off);
	pthread_mutex_unlock(&f->lock);
	return rc;
}

ssize_t stk_write(stk_file *f, const void *buf, size_t len)
{
	ssize_t rc;

	if (f->is_dir)
		return -EISDIR;
	if (f->accmode == O_RDONLY)
		return -EBADF;
	pthread_mutex_lock(&f->lock);
	if (f->append)
		f->pos = f->size;
	rc = pwrite_locked(f, buf, len, f->pos);
	if (rc > 0)
		f->pos += (uint64_t)rc;
	pthread_mutex_unlock(&f->lock);
	return rc;
}

ssize_t stk_pread(stk_file *f, void *buf, size_t len, off_t off)
{
	struct stk_io_piece stackp[16], *p;
	uint64_t size;
	int n, rc;

	if (f->is_dir)
		return -EISDIR;
	if (f->accmode == O_WRONLY)
		return -EBADF;
	if (off < 0)
		return -EINVAL;
	uint64_t ra_from = 0, ra_to = 0;
	uint32_t flags;
	int ra, seq;

	pthread_mutex_lock(&f->lock);
	rc = flush_buffer(f, 0);
	size = visible_size(f); /* never the bytes of a failed write */
	if (rc == 0 && (uint64_t)off < size && len > size - (uint64_t)off)
		len = (size_t)(size - (uint64_t)off);
	seq = rc == 0 && (uint64_t)off < size && len && (uint64_t)off == f->seq_next;
	ra = rc == 0 && (uint64_t)off < size && len &&
	     readahead_range(f, (uint64_t)off, len, size, &ra_from, &ra_to);
	pthread_mutex_unlock(&f->lock);
	if (rc)
		return rc;
	if ((uint64_t)off >= size || len == 0)
		return 0;
	/*
	 * A stream of a mount: its kernel caches what it reads (client.h). A large
	 * read there is the kernel's read-ahead, so a stream, even when the requests
	 * of several threads reach us out of order.
	 */
	flags = f->c->direct_streams && (seq || len >= STK_STREAM_MIN) ? STK_READ_STREAM : 0;
	if (ra)
		prefetch(f, ra_from, ra_to, flags);
	n = make_pieces(f, buf, len, (uint64_t)off, &p, stackp, 16);
	if (n < 0)
		return n;
	rc = stk_io_run(f->c, STK_IO_READ, f->attr.ino, &f->attr.layout, p, (unsigned)n, flags);
	if (rc == 0) {
		/* Holes and the unwritten tail of a chunk read as zeros. */
		for (int i = 0; i < n; i++)
			if (p[i].done < p[i].length)
				memset(p[i].buf + p[i].done, 0, p[i].length - p[i].done);
	}
	if (p != stackp)
		free(p);
	return rc ? rc : (ssize_t)len;
}

ssize_t stk_read(stk_file *f, void *buf, size_t len)
{
	ssize_t rc;
	uint64_t pos;

	/* The position is read and advanced under the lock; the I/O runs outside it. */
	pthread_mutex_lock(&f->lock);
	pos = f->pos;
	pthread_mutex_unlock(&f->lock);
	rc = stk_pread(f, buf, len, (off_t)pos);
	if (rc > 0) {
		pthread_mutex_lock(&f->lock);
		f->pos = pos + (uint64_t)rc;
		pthread_mutex_unlock(&f->lock);
	}
	return rc;
}

off_t stk_lseek(stk_file *f, off_t off, int whence)
{
	int64_t base;
	off_t rc;

	pthread_mutex_lock(&f->lock);
	switch (whence) {
	case SEEK_SET:
		base = 0;
		break;
	case SEEK_CUR:
		base = (int64_t)f->pos;
		break;
	case SEEK_END:
		base = (int64_t)f->size;
		break;
	default:
		pthread_mutex_unlock(&f->lock);
		return -EINVAL;
	}
	if (base + off < 0) {
		rc = -EINVAL;
	} else {
		f->pos = (uint64_t)(base + off);
		rc = (off_t)f->pos;
	}
	pthread_mutex_unlock(&f->lock);
	return rc;
}

int stk_ftruncate(stk_file *f, off_t size)
{
	int rc;

	if (f->is_dir)
		return -EISDIR;
	if (f->accmode == O_RDONLY)
		return -EBADF;
	if (size < 0)
		return -EINVAL;
	pthread_mutex_lock(&f->lock);
	rc = flush_buffer(f, 0);
	if (rc == 0) {
		struct stk_attr v = {.size = (uint64_t)size};
		rc = stk_ino_setattr(f->c, NULL, f->attr.ino, STK_SETATTR_SIZE, &v, NULL);
	}
	if (rc == 0) {
		f->meta_size = (uint64_t)size;
		/* meta has the size: room taken past the old one is not needed now */
		bytes_back(f);
		if (!f->reserving && f->granted != UINT64_MAX)
			f->granted = f->meta_size;
	}
	/* Chunks this handle wrote past meta's idea of the size are cut here too. */
	if (rc == 0 && (uint64_t)size < f->size) {
		rc = stk_client_truncate_data(f->c, &f->attr, (uint64_t)size);
		/* Bytes past size may still be there: this handle never publishes them
		 * (a write there later would leave them readable in its holes). */
		if (rc)
			note_failure(f, (uint64_t)size, rc);
	}
	if (rc == 0) {
		uint64_t cs = f->attr.layout.chunk_size;
		uint32_t keep = (uint32_t)(((uint64_t)size + cs - 1) / cs);

		f->size = (uint64_t)size;
		f->size_dirty = 1;
		/* Chunks cut off are no longer ours to report as written. */
		unsigned k = 0;

		for (unsigned i = 0; i < f->nalloc; i++) {
			uint32_t end = STK_MIN(f->alloc[i][1], keep);

			if (f->alloc[i][0] < end)
				f->alloc[k][0] = f->alloc[i][0], f->alloc[k++][1] = end;
		}
		f->nalloc = k;
	}
	pthread_mutex_unlock(&f->lock);
	return rc;
}

/* Writes zeros over [from, to) of f, a chunk at most at a time. Called with f->lock held. */
static int write_zeros(struct stk_file *f, uint64_t from, uint64_t to)
{
	uint64_t cs = f->attr.layout.chunk_size;
	char *z;
	int rc = 0;

	if (from >= to)
		return 0;
	z = calloc(1, (size_t)STK_MIN(cs, to - from));
	if (!z)
		return -ENOMEM;
	while (rc == 0 && from < to) {
		size_t n = (size_t)STK_MIN(to - from, cs - from % cs);

		rc = write_through(f, z, n, from, 0);
		from += n;
	}
	free(z);
	return rc;
}

int stk_fallocate(stk_file *f, int mode, off_t off, off_t len)
{
	const int known = STK_FALLOC_KEEP_SIZE | STK_FALLOC_PUNCH_HOLE | STK_FALLOC_ZERO_RANGE;
	uint64_t start = (uint64_t)off, end = (uint64_t)off + (uint64_t)len, cs, old, zend;
	uint64_t first, pend;
	int rc;

	if (!f)
		return -EBADF;
	if (f->is_dir)
		return -EISDIR;
	if (f->accmode == O_RDONLY)
		return -EBADF;
	if (off < 0 || len <= 0)
		return -EINVAL;
	/* Linux's rules: punch needs KEEP_SIZE, and excludes ZERO_RANGE. */
	if ((mode & ~known) ||
	    ((mode & STK_FALLOC_PUNCH_HOLE) &&
	     (!(mode & STK_FALLOC_KEEP_SIZE) || (mode & STK_FALLOC_ZERO_RANGE))))
		return -EOPNOTSUPP;
	if (end < start || end > STK_MAX_FILE_SIZE)
		return -EFBIG;
	cs = f->attr.layout.chunk_size;
	pthread_mutex_lock(&f->lock);
	/* What this handle buffered lands first, so that it is punched or zeroed too. */
	rc = flush_buffer(f, 0);
	if (rc)
		goto out;
	old = f->size;
	if (!(mode & STK_FALLOC_KEEP_SIZE) && end > old) {
		rc = quota_room(f, end);
		if (rc)
			goto out;
	}
	if (!(mode & (STK_FALLOC_PUNCH_HOLE | STK_FALLOC_ZERO_RANGE)))
		goto size; /* mode 0: the size grows, the chunks come with the writes */
	/* Past the end everything reads as zeros already; keep the end of the file. */
	zend = STK_MIN(end, old);
	if (start >= zend)
		goto size;
	/*
	 * Whole chunks go (they read as zeros, and count no blocks); so does the chunk
	 * at the end of the file when the range reaches it. Partial chunks at the
	 * edges get zeros written.
	 */
	first = (start + cs - 1) / cs;
	pend = zend == old ? (zend + cs - 1) / cs : zend / cs;
	if (first < pend) {
		rc = stk_client_punch_data(f->c, &f->attr, (uint32_t)first, (uint32_t)pend);
		if (rc == 0)
			rc = write_zeros(f, start, first * cs);
		if (rc == 0)
			rc = write_zeros(f, STK_MIN(pend * cs, zend), zend);
		if (rc == 0) {
			f->punch_first = (uint32_t)first;
			f->punch_end = (uint32_t)pend;
		}
	} else {
		rc = write_zeros(f, start, zend);
	}
	if (rc)
		goto out;
size:
	if (!(mode & STK_FALLOC_KEEP_SIZE) && end > f->size)
		f->size = end;
	f->size_dirty = 1;
	rc = sync_locked(f);
out:
	pthread_mutex_unlock(&f->lock);
	return rc;
}

int stk_fstat(stk_file *f, struct stat *st)
{
	struct stk_msg_meta_ino_req m;
	struct stk_attr a;
	uint8_t req[256];
	struct stk_wbuf w;
	int rc;

	memset(&m, 0, sizeof(m));
	m.cred = f->c->cred;
	m.ino = f->attr.ino;
	stk_wbuf_init(&w, req, sizeof(req));
	stk_msg_meta_ino_req_enc(&w, &m);
	rc = stk_client_meta_attr_read_call(f->c, STK_OP_META_GETATTR, req, w.len, &a);
	if (rc)
		return rc;
	pthread_mutex_lock(&f->lock);
	if (f->size_dirty && visible_size(f) > a.size)
		a.size = visible_size(f);
	pthread_mutex_unlock(&f->lock);
	stk_attr_to_stat(&a, st);
	return 0;
}

/* ---- for the batch engine (batch.c) ---- */

int stk_file_io_prep(stk_file *f, int op, uint64_t off, size_t *len, struct stk_file_io *io)
{
	int rc;

	if (f->is_dir)
		return -EISDIR;
	if (op == STK_IO_READ ? f->accmode == O_WRONLY : f->accmode == O_RDONLY)
		return -EBADF;
	if (op == STK_IO_WRITE && f->append)
		return -EINVAL;
	if (op == STK_IO_WRITE && (off + *len < off || off + *len > STK_MAX_FILE_SIZE))
		return -EFBIG;
	pthread_mutex_lock(&f->lock);
	rc = flush_buffer(f, 0);
	if (rc == 0 && op == STK_IO_WRITE)
		rc = quota_room(f, off + *len);
	if (rc == 0 && op == STK_IO_READ)
		*len = off >= f->size ? 0 : (size_t)STK_MIN((uint64_t)*len, f->size - off);
	pthread_mutex_unlock(&f->lock);
	io->ino = f->attr.ino;
	io->layout = &f->attr.layout;
	io->chains = f->chains;
	return rc;
}

void stk_file_io_wrote(stk_file *f, uint64_t off, size_t len)
{
	uint64_t cs = f->attr.layout.chunk_size;

	if (len == 0)
		return;
	pthread_mutex_lock(&f->lock);
	for (uint64_t i = off / cs; i <= (off + len - 1) / cs && i < off / cs + f->attr.layout.stripe;
	     i++)
		f->unsynced[i % f->attr.layout.stripe] = 1;
	f->any_unsynced = 1;
	written(f, (uint32_t)(off / cs), (uint32_t)((off + len - 1) / cs + 1));
	if (off < f->unsynced_low)
		f->unsynced_low = off;
	if (off + len > f->size)
		f->size = off + len;
	f->size_dirty = 1;
	pthread_mutex_unlock(&f->lock);
}

void stk_file_io_failed(stk_file *f, uint64_t off, int err)
{
	pthread_mutex_lock(&f->lock);
	note_failure(f, off, err);
	pthread_mutex_unlock(&f->lock);
}

int stk_file_set_read_size(stk_file *f, uint64_t size)
{
	if (f->accmode != O_RDONLY)
		return -EBADF;
	pthread_mutex_lock(&f->lock);
	f->size = size;
	pthread_mutex_unlock(&f->lock);
	return 0;
}

uint64_t stk_file_size(stk_file *f)
{
	uint64_t size;

	pthread_mutex_lock(&f->lock);
	size = visible_size(f);
	pthread_mutex_unlock(&f->lock);
	return size;
}
