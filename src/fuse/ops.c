/*
 * The FUSE low-level operations: each callback turns one kernel request into
 * libstoker calls and replies exactly once, with fuse_reply_err(req, -rc) for
 * every libstoker error. The reply is where the request ends; nothing touches
 * req after it.
 *
 * Credentials: metadata calls carry the caller's uid, gid and supplementary
 * groups, so meta enforces permissions for the right person. The kernel checks
 * them first too where the mount has default_permissions (mount.c says when it
 * has not: only root can enter); access(2) and chdir are answered here then
 * (op_access). Reading the groups
 * costs a read of /proc/PID/status, so it is skipped for root, whom meta never
 * refuses, and for calls meta does not check (getattr, readlink, and an open
 * that does not truncate).
 *
 * Data: read and write go straight to stk_pread / stk_pwrite; reads land in a
 * per-thread buffer of max_read bytes, so the data path allocates nothing. While
 * any descriptor writes an inode, all its descriptors share one read-write
 * libstoker handle (fs.h says why); a read-only open of a file nobody here
 * writes gets a handle of its own, opened on fresh attributes. libstoker buffers
 * writes; flush (every close(2)) and fsync make them durable and record the
 * size in meta, which gives close-to-open consistency: close returns only when
 * another client's open will see the data, and close reports a failed
 * write-back. Release only closes handles.
 *
 * atime (relatime, unless -o noatime): an open whose attributes say the next read
 * is due to move atime (atime not after mtime or ctime, or a day old) marks its
 * handle; the first read through it, after replying, queues the read for meta to
 * record (STK_REF_READ, sent with the session's queued closes in one META_CLOSES
 * within a few milliseconds; meta leaves ctime alone and rechecks the rule). So a
 * read costs meta no call of its own, and nothing for a file read again before it
 * changes. Reads the kernel answers from its page cache never reach us.
 *
 * Page cache: an open keeps the kernel's cached pages (keep_cache) when the
 * file's mtime and size are what they were at its last open in this mount, or
 * when this mount is writing the file (the cache then holds the newest bytes);
 * otherwise the pages and the cached attributes are dropped, so an open after
 * another client's close reads the new data even within attr_timeout.
 *
 * Stale names: a call by path on an inode meta no longer has (another client
 * renamed over the name or removed it while the kernel kept its entry) is
 * answered ESTALE, not ENOENT, so that the kernel looks the path up again
 * (by_name); notify.c expires such entries as soon as meta revokes our lease.
 *
 * Directories: the kernel's directory offsets are positions in this handle's
 * listing (0 ".", 1 "..", 2 + i the i-th entry); the handle keeps the meta
 * cookie each position resumes from, so a listing resumes and seeks exactly even
 * though meta's cookies are 64-bit hashes that do not fit a signed offset.
 * readdirplus asks meta for the attributes of a whole batch of names in one call
 * (META_GETATTRS), as `ls -l` needs them; the kernel asks for it at the start of a
 * listing and when the names are looked up after one.
 */
#include "fs.h"
#include "metrics.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../common/log.h"
#include "../common/util.h"

/* Directory entries fetched from meta per round trip. */
#define STK_FUSE_DIR_BATCH 256u
/* How long a batch's attributes serve readdirplus before they are asked for again. */
#define STK_FUSE_PLUS_FRESH_NS 100000000ull

/* One open directory (fi->fh of opendir). lock serializes its readdirs. */
struct stk_fuse_dh {
	pthread_mutex_t lock;
	uint64_t ino; /* Stoker inode */
	uint64_t *cookies; /* cookies[i]: meta cookie that lists from entry i */
	size_t ncookies, cookie_cap;
	struct stk_ll_dirent *ents; /* the batch last fetched */
	size_t start; /* its first entry's index */
	uint32_t n;
	int eof; /* the batch ends the directory */
	int have; /* a batch is loaded */
	/* readdirplus: the batch's attributes, fetched together (one META_GETATTRS) for
	 * entries attrs_from.. of the batch at attrs_ns; attr_rcs[k] 0 or -errno. */
	struct stk_ll_attr *attrs;
	int *attr_rcs;
	uint32_t attrs_from;
	int attrs_have;
	uint64_t attrs_ns;
	struct stk_fuse_acache_tok attrs_tok; /* taken before they were asked for */
};

static struct stk_fuse *fs_of(fuse_req_t req)
{
	return fuse_req_userdata(req);
}

static struct stk_fuse_fh *fh_of(const struct fuse_file_info *fi)
{
	return (struct stk_fuse_fh *)(uintptr_t)fi->fh;
}

/* Kernel node id <-> Stoker inode: the mounted directory and node 1 swap places. */
static uint64_t ino_swap(const struct stk_fuse *fs, uint64_t ino)
{
	if (ino == FUSE_ROOT_ID)
		return fs->root_ino;
	if (ino == fs->root_ino)
		return FUSE_ROOT_ID;
	return ino;
}

/*
 * -o leased_attr_timeout: how long the kernel may keep attributes this mount holds
 * under a lease whose trust ends at until_ns: the option, cut to the lease and
 * the trust (50 ms early, for the reply's way to the kernel), never below
 * attr_timeout. A revocation forgets them in the kernel first (revoked_attr).
 */
static double leased_ttl(const struct stk_fuse *fs, uint64_t until_ns)
{
	uint64_t now = stk_now_ns() + 50000000ull;
	double left = until_ns > now ? (double)(until_ns - now) / 1e9 : 0;

	if (left > fs->o.leased_attr_timeout)
		left = fs->o.leased_attr_timeout;
	return left > fs->o.attr_timeout ? left : fs->o.attr_timeout;
}

/*
 * On the lookup cache's watch thread, for every inode whose lease meta revokes,
 * before meta is told (so before the change is visible to anyone): the kernel
 * forgets the attributes it was given under the lease, and a getattr answer in
 * flight from before is discarded by the kernel (it bumps the inode's attribute
 * version). Attributes only (offset -1): the kernel takes no folder or page lock
 * for that, so this cannot wait on a request that waits on this revocation (which
 * is why notify.c expires names on a thread of its own instead).
 */
static void revoked_attr(void *ctx, uint64_t ino)
{
	struct stk_fuse *fs = ctx;

	fuse_lowlevel_notify_inval_inode(fs->se, ino_swap(fs, ino), -1, 0);
}

/* The kernel may keep these attributes for attr_timeout, or longer under a lease. */
static double attr_ttl(struct stk_fuse *fs, const struct stk_ll_attr *a)
{
	struct stk_ll_attr l;
	uint64_t until;

	if (fs->o.leased_attr_timeout > 0 && stk_ll_leased_attr_until(fs->c, a->ino, &l, &until) &&
	    l.size == a->size && l.mtime_sec == a->mtime_sec && l.mtime_nsec == a->mtime_nsec &&
	    l.ctime_sec == a->ctime_sec && l.ctime_nsec == a->ctime_nsec)
		return leased_ttl(fs, until);
	return fs->o.attr_timeout;
}

static void reply_err(fuse_req_t req, int rc)
{
	/* libstoker returns -errno; anything else would be a bug, reported as EIO. */
	stk_fuse_metrics_error(rc <= 0 && rc > -4096 ? rc : -EIO);
	fuse_reply_err(req, rc <= 0 && rc > -4096 ? -rc : EIO);
}

/*
 * The error of a call on node ino that the kernel reached through a name it cached
 * (a path walk: open, stat, access, chmod, readlink, xattrs by path), not through
 * an open file. Meta saying the inode is gone then means that the kernel's entry
 * is stale: another client renamed over the name or removed it while the kernel
 * trusted the entry (entry_timeout). ESTALE makes the kernel walk the path once
 * more with LOOKUP_REVAL, under which FUSE looks every name up again: the caller
 * gets the file that holds the name now, or ENOENT if none does. ENOENT here would
 * say that a name which never stopped existing is missing (write-then-rename on
 * another mount). The mounted folder has no name to look up again.
 */
static int by_name(fuse_ino_t ino, int rc)
{
	return rc == -ENOENT && ino != FUSE_ROOT_ID ? -ESTALE : rc;
}

/*
 * Whether attributes a, fetched for a call by path, are those of a file whose last
 * name went while another client still held it open (an orphan meta keeps for a
 * moment, or for as long as that client reads it): the kernel reached it through
 * a stale name, as above, so the call is answered as by_name answers a gone inode.
 * A file open in this mount is not concerned (reopened through /proc/PID/fd).
 */
static int stale_orphan(struct stk_fuse *fs, const struct stk_ll_attr *a)
{
	return a->nlink == 0 && S_ISREG(a->mode) && !stk_fuse_table_is_open(&fs->tab, a->ino);
}

static void req_cred(fuse_req_t req, struct stk_ll_cred *cr, int groups)
{
	const struct fuse_ctx *ctx = fuse_req_ctx(req);
	gid_t g[STK_LL_MAX_GROUPS];
	int n;

	memset(cr, 0, sizeof(*cr));
	cr->uid = (uint32_t)ctx->uid;
	cr->gid = (uint32_t)ctx->gid;
	if (!groups || ctx->uid == 0)
		return;
	n = fuse_req_getgroups(req, STK_LL_MAX_GROUPS, g);
	if (n > (int)STK_LL_MAX_GROUPS)
		n = STK_LL_MAX_GROUPS; /* the first 32 were filled; meta takes no more */
	for (int i = 0; i < n; i++)
		cr->groups[i] = (uint32_t)g[i];
	cr->ngroups = (uint8_t)(n > 0 ? n : 0);
}

static void rbuf_free(void *b)
{
	stk_huge_free(b, STK_FUSE_IO_MAX, 0);
}

static char *thread_buf(struct stk_fuse *fs)
{
	char *b = pthread_getspecific(fs->rbuf_key);

	if (!b) {
		b = stk_huge_alloc(STK_FUSE_IO_MAX, 0); /* for O_DIRECT reads of streams */
		if (b && pthread_setspecific(fs->rbuf_key, b)) {
			rbuf_free(b);
			b = NULL;
		}
	}
	return b;
}

static void attr_stat(struct stk_fuse *fs, struct stk_ll_attr *a, struct stat *st)
{
	stk_fuse_table_overlay(&fs->tab, a);
	stk_ll_attr_to_stat(a, st);
}

static void fill_entry(struct stk_fuse *fs, struct stk_ll_attr *a, struct fuse_entry_param *e)
{
	memset(e, 0, sizeof(*e));
	e->ino = ino_swap(fs, a->ino);
	e->attr_timeout = attr_ttl(fs, a);
	e->entry_timeout = fs->o.entry_timeout;
	attr_stat(fs, a, &e->attr);
}

static void reply_entry(fuse_req_t req, struct stk_fuse *fs, struct stk_ll_attr *a)
{
	struct fuse_entry_param e;

	fill_entry(fs, a, &e);
	fuse_reply_entry(req, &e);
}

/* A file's last link went: its data goes now, or at its last close in this mount. */
static void drop_data(struct stk_fuse *fs, const struct stk_ll_attr *a)
{
	if (a->ino == 0 || a->nlink != 0 || !S_ISREG(a->mode))
		return;
	if (stk_fuse_table_orphan(&fs->tab, a) == 0)
		return;
	stk_ll_remove_data(fs->c, a);
}

/* Records a change made through n->wf: the new end of file (or the size, if set). */
static void note_change(struct stk_fuse_node *n, uint64_t end, int set)
{
	uint64_t cur = atomic_load(&n->wsize);

	if (set)
		atomic_store(&n->wsize, end);
	else
		while (end > cur && !atomic_compare_exchange_weak(&n->wsize, &cur, end))
			;
	/* After the size, so an overlay that sees the change sees the size too. */
	atomic_fetch_add(&n->wgen, 1);
}

/*
 * The libstoker handle a read through fh uses, with a reference when it is the
 * shared one and fh holds none (put it back with wf_put).
 */
static stk_file *read_handle(struct stk_fuse_fh *fh, int *ref)
{
	struct stk_fuse_node *n = fh->node;
	stk_file *f;

	*ref = 0;
	if (fh->uses_wf)
		return n->wf; /* ours holds it open */
	pthread_mutex_lock(&n->lock);
	if (n->wf) {
		f = n->wf;
		n->wf_refs++;
		*ref = 1;
	} else {
		uint64_t g = atomic_load(&n->wgen);
		f = fh->priv;
		/* Written through this mount since it opened: read what the writes left,
		 * as a local file system would (wsize is final once wf is gone). */
		if (g != fh->seen_wgen && stk_ll_file_set_read_size(f, atomic_load(&n->wsize)) == 0)
			fh->seen_wgen = g;
	}
	pthread_mutex_unlock(&n->lock);
	return f;
}

/*
 * Drops a reference on the shared handle; the last one closes it, under the
 * node's lock so that no open sees meta before the close recorded the size.
 */
static void wf_put(struct stk_fuse *fs, struct stk_fuse_node *n)
{
	struct stk_ll_attr a;
	uint64_t g;
	int rc = 0;

	pthread_mutex_lock(&n->lock);
	if (--n->wf_refs == 0) {
		g = atomic_load(&n->wgen);
		rc = stk_close(n->wf);
		n->wf = NULL;
		/* Whatever the outcome, meta now has all it will get. */
		atomic_store(&n->synced, g);
	}
	pthread_mutex_unlock(&n->lock);
	/* After the node lock: the table lock is never taken inside it. */
	if (rc && !(rc == -ENOENT && stk_fuse_table_orphan_attr(&fs->tab, n->ino, &a) == 0)) {
		stk_error("closing inode %llu: %s (data written since the last flush may be lost)",
			  (unsigned long long)n->ino, stk_strerror(rc));
		/* Read-only handles here read up to wsize: not over bytes never stored. */
		if (stk_ll_getattr(fs->c, NULL, n->ino, &a) == 0)
			atomic_store(&n->wsize, a.size); /* wf is gone: no new generation */
	}
}

/* Makes what was written to fh's inode durable and its size known to meta. */
static int sync_fh(struct stk_fuse *fs, struct stk_fuse_fh *fh)
{
	struct stk_fuse_node *n = fh->node;
	struct stk_ll_attr a;
	uint64_t g;
	int rc;

	if (!fh->writable)
		return 0;
	stk_fuse_acache_drop(&fs->acache, n->ino); /* meta's size and mtime may move */
	g = atomic_load(&n->wgen);
	if (g == atomic_load(&n->synced))
		return 0;
	rc = stk_fsync(n->wf);
	/* A failed write is not published (stk_fsync): nor is it read here. */
	if (rc)
		note_change(n, stk_file_size(n->wf), 1);
	/* An orphan's data is durable; only its size has no inode left to go to. */
	if (rc == -ENOENT && stk_fuse_table_orphan_attr(&fs->tab, n->ino, &a) == 0)
		rc = 0;
	if (rc == 0) {
		/* Only forward: a concurrent fsync may have covered a later generation. */
		uint64_t cur = atomic_load(&n->synced);
		while (cur < g && !atomic_compare_exchange_weak(&n->synced, &cur, g))
			;
	}
	return rc;
}

/* ---- the session ---- */

static void op_init(void *userdata, struct fuse_conn_info *conn)
{
	struct stk_fuse *fs = userdata;
	/* EXPORT_SUPPORT: the kernel may then ask "." and ".." (op_lookup_dots), which is
	 * what lets an NFS server on this mount turn its file handles back into files. */
	unsigned want = FUSE_CAP_ASYNC_READ | FUSE_CAP_ATOMIC_O_TRUNC | FUSE_CAP_AUTO_INVAL_DATA |
			FUSE_CAP_PARALLEL_DIROPS | FUSE_CAP_READDIRPLUS | FUSE_CAP_READDIRPLUS_AUTO |
			FUSE_CAP_EXPORT_SUPPORT;

	conn->want |= want & conn->capable;
	/* Here, in the process that serves the mount (not before it went to the background). */
	if (stk_ll_leases_start(fs->c)) {
		stk_warn("no lookup cache: every lookup goes to meta");
	} else {
		/* Its leases are what tell us that another client changed a name. */
		if (stk_ll_leases_on(fs->c) && stk_fuse_notify_start(fs))
			stk_warn("names others change stay in the kernel up to entry_timeout");
		if (stk_ll_leases_on(fs->c) && fs->o.leased_attr_timeout > 0)
			stk_ll_on_revoked_ino(fs->c, revoked_attr, fs);
		if (fs->o.writebehind && !fs->o.ro && stk_ll_names_start(fs->c))
			stk_warn("no write-behind: every create and unlink waits for meta");
	}
	if (fs->o.writeback && (conn->capable & FUSE_CAP_WRITEBACK_CACHE))
		conn->want |= FUSE_CAP_WRITEBACK_CACHE;
	else
		conn->want &= ~(unsigned)FUSE_CAP_WRITEBACK_CACHE;
	if (fs->o.writeback && !(conn->capable & FUSE_CAP_WRITEBACK_CACHE))
		stk_warn("the kernel offers no write-back cache; writing through");
	conn->max_write = STK_FUSE_IO_MAX;
	conn->max_read = STK_FUSE_IO_MAX;
	/* The kernel only lets us lower it here; mount.c raises it through sysfs. */
	if (fs->o.readahead < conn->max_readahead)
		conn->max_readahead = (unsigned)fs->o.readahead;
	/* Room for a whole readahead window of 1 MiB reads in flight. */
	conn->max_background = 64;
	conn->congestion_threshold = 48;
	conn->time_gran = 1;
	stk_fuse_uring_start(fs);
}

/* ---- names and attributes ---- */

/* Inode sino's attributes from meta, or from this mount's table when it is
 * unlinked and still open here. */
static int fresh_attr(struct stk_fuse *fs, const struct stk_ll_cred *cr, uint64_t sino,
		      struct stk_ll_attr *a)
{
	int rc = stk_ll_getattr(fs->c, cr, sino, a);

	if (rc == -ENOENT && stk_fuse_table_orphan_attr(&fs->tab, sino, a) == 0)
		rc = 0;
	return rc;
}

/*
 * Lookups of "." and "..", which the kernel sends only to a mount that exports
 * (FUSE_CAP_EXPORT_SUPPORT), for a file handle an NFS server (Ganesha's VFS FSAL
 * through open_by_handle_at) gives back: "." on a node id whose inode it no longer
 * caches (the node id is the Stoker inode number, stable across mounts, so a
 * handle made by an earlier mount still names the same file), ".." to connect a
 * folder to the tree. The mounted folder is its own parent, and a folder outside
 * it (only reachable through a handle made by another mount) is ESTALE.
 */
static void op_lookup_dots(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct stk_fuse *fs = fs_of(req);
	uint64_t sino = ino_swap(fs, parent);
	struct fuse_entry_param e;
	struct stk_ll_cred cr;
	struct stk_ll_attr a;
	int rc;

	req_cred(req, &cr, 1);
	if (name[1] == 0 || parent == FUSE_ROOT_ID) {
		rc = fresh_attr(fs, &cr, sino, &a);
	} else {
		rc = stk_ll_lookup_parent(fs->c, &cr, sino, &a);
		if (rc == 0 && a.ino == STK_LL_ROOT_INO && fs->root_ino != STK_LL_ROOT_INO)
			rc = -ESTALE;
	}
	if (rc) {
		reply_err(req, rc);
		return;
	}
	fill_entry(fs, &a, &e);
	fuse_reply_entry(req, &e);
}

static void op_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct stk_fuse *fs = fs_of(req);
	struct stk_fuse_acache_tok tok;
	struct fuse_entry_param e;
	struct stk_ll_cred cr;
	struct stk_ll_attr a;
	int rc;

	if (name[0] == '.' && (name[1] == 0 || (name[1] == '.' && name[2] == 0))) {
		op_lookup_dots(req, parent, name);
		return;
	}
	tok = stk_fuse_acache_begin(&fs->acache, 0);
	req_cred(req, &cr, 1);
	rc = stk_ll_lookup(fs->c, &cr, ino_swap(fs, parent), name, &a);
	if (rc == -ENOENT && fs->o.negative_timeout > 0) {
		memset(&e, 0, sizeof(e));
		e.entry_timeout = fs->o.negative_timeout;
		fuse_reply_entry(req, &e);
		return;
	}
	if (rc) {
		reply_err(req, rc);
		return;
	}
	fill_entry(fs, &a, &e);
	if (fuse_reply_entry(req, &e) == 0)
		stk_fuse_acache_told(&fs->acache, &a, tok);
}

static void op_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct stk_fuse *fs = fs_of(req);
	uint64_t sino = ino_swap(fs, ino);
	struct stk_fuse_acache_tok tok = stk_fuse_acache_begin(&fs->acache, sino);
	struct stk_ll_cred cr;
	struct stk_ll_attr a;
	double ttl = fs->o.attr_timeout;
	uint64_t until;
	struct stat st;
	int rc;

	req_cred(req, &cr, 0);
	/* A folder this mount just created or removed a name in: meta sent its attributes. */
	rc = stk_fuse_acache_get(&fs->acache, sino, &a);
	/* Else the lookup cache's, under a lease on the inode, as a lookup would answer
	 * (a change anyone makes to them is revoked here before it is visible). */
	if (rc && stk_ll_leased_attr_until(fs->c, sino, &a, &until)) {
		rc = 0;
		if (fs->o.leased_attr_timeout > 0)
			ttl = leased_ttl(fs, until);
	}
	if (rc) {
		rc = fresh_attr(fs, &cr, sino, &a);
		if (rc == 0 && !fi && stale_orphan(fs, &a))
			rc = -ENOENT;
	}
	if (rc) {
		/* fi: fstat of an open file, which meta keeps while it is open */
		reply_err(req, fi ? rc : by_name(ino, rc));
		return;
	}
	attr_stat(fs, &a, &st);
	if (fuse_reply_attr(req, &st, ttl) == 0)
		stk_fuse_acache_told(&fs->acache, &a, tok);
}

/*
 * access(2) and chdir. The kernel asks only when the mount has no
 * default_permissions (otherwise it decides from its cached attributes): the
 * caller's rights on fresh attributes, as POSIX and meta rule them. Root passes
 * everything but execute of a non-folder with no x bit at all.
 */
static void op_access(fuse_req_t req, fuse_ino_t ino, int mask)
{
	struct stk_fuse *fs = fs_of(req);
	uint64_t sino = ino_swap(fs, ino);
	unsigned want = (unsigned)mask & (R_OK | W_OK | X_OK), bits;
	struct stk_ll_cred cr;
	struct stk_ll_attr a;
	int rc;

	req_cred(req, &cr, 1);
	rc = fresh_attr(fs, &cr, sino, &a);
	if (rc) {
		reply_err(req, by_name(ino, rc));
		return;
	}
	if (cr.uid == 0)
		bits = S_ISDIR(a.mode) || (a.mode & 0111) ? 7 : 6;
	else if (cr.uid == a.uid)
		bits = (a.mode >> 6) & 7;
	else if (stk_ll_cred_in_group(&cr, a.gid))
		bits = (a.mode >> 3) & 7;
	else
		bits = a.mode & 7;
	reply_err(req, (bits & want) == want ? 0 : -EACCES);
}

/* Truncates through the open handle when there is one, so its buffer and size agree. */
static int set_size(struct stk_fuse *fs, const struct stk_ll_cred *cr, uint64_t ino,
		    struct stk_fuse_fh *fh, uint64_t size)
{
	struct stk_fuse_node *n = NULL;
	stk_file *wf = NULL;
	struct stk_ll_attr v;
	int rc;

	if (fh && fh->writable) {
		rc = stk_ftruncate(fh->node->wf, (off_t)size);
		if (rc == 0)
			note_change(fh->node, size, 1);
		return rc;
	}
	/* By name, while a descriptor here writes it: its buffer must be cut too. */
	n = stk_fuse_table_pin(&fs->tab, ino);
	if (n) {
		pthread_mutex_lock(&n->lock);
		if (n->wf)
			n->wf_refs++;
		wf = n->wf;
		pthread_mutex_unlock(&n->lock);
	}
	if (wf) {
		/* The kernel checked write permission on the file; the handle acts as us. */
		rc = stk_ftruncate(wf, (off_t)size);
		if (rc == 0)
			note_change(n, size, 1);
		wf_put(fs, n);
	} else {
		memset(&v, 0, sizeof(v));
		v.size = size;
		rc = stk_ll_setattr(fs->c, cr, ino, STK_LL_SETATTR_SIZE, &v, NULL);
	}
	if (n)
		stk_fuse_table_unpin(&fs->tab, n, fs->c);
	return rc;
}

/* 1 if mode is ino's mode with only set-uid and set-gid taken away. */
static int kills_privs(struct stk_fuse *fs, const struct stk_ll_cred *cr, uint64_t ino,
		       uint32_t mode)
{
	struct stk_ll_attr a;

	if (stk_ll_getattr(fs->c, cr, ino, &a))
		return 0;
	return (a.mode & 07777) != mode && ((a.mode & 07777) & ~(uint32_t)(S_ISUID | S_ISGID)) ==
						       (mode & ~(uint32_t)(S_ISUID | S_ISGID)) &&
	       !(mode & ~a.mode & 07777);
}

static void op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set,
		       struct fuse_file_info *fi)
{
	struct stk_fuse *fs = fs_of(req);
	struct stk_fuse_fh *fh = fi ? fh_of(fi) : NULL;
	uint64_t sino = ino_swap(fs, ino);
	struct stk_ll_attr v, out;
	struct stk_ll_cred cr;
	struct stat st;
	uint32_t valid = 0;
	int rc;

	req_cred(req, &cr, 1);
	memset(&v, 0, sizeof(v));
	if (to_set & FUSE_SET_ATTR_MODE) {
		valid |= STK_LL_SETATTR_MODE;
		v.mode = attr->st_mode & 07777;
	}
	if (to_set & FUSE_SET_ATTR_UID) {
		valid |= STK_LL_SETATTR_UID;
		v.uid = (uint32_t)attr->st_uid;
	}
	if (to_set & FUSE_SET_ATTR_GID) {
		valid |= STK_LL_SETATTR_GID;
		v.gid = (uint32_t)attr->st_gid;
	}
	if (to_set & FUSE_SET_ATTR_ATIME_NOW) {
		valid |= STK_LL_SETATTR_ATIME_NOW;
	} else if (to_set & FUSE_SET_ATTR_ATIME) {
		valid |= STK_LL_SETATTR_ATIME;
		v.atime_sec = attr->st_atim.tv_sec;
		v.atime_nsec = (uint32_t)attr->st_atim.tv_nsec;
	}
	if (to_set & FUSE_SET_ATTR_MTIME_NOW) {
		valid |= STK_LL_SETATTR_MTIME_NOW;
	} else if (to_set & FUSE_SET_ATTR_MTIME) {
		valid |= STK_LL_SETATTR_MTIME;
		v.mtime_sec = attr->st_mtim.tv_sec;
		v.mtime_nsec = (uint32_t)attr->st_mtim.tv_nsec;
	}
	if (to_set & FUSE_SET_ATTR_SIZE) {
		if (attr->st_size < 0) {
			reply_err(req, -EINVAL);
			return;
		}
		rc = set_size(fs, &cr, sino, fh, (uint64_t)attr->st_size);
		if (rc) {
			reply_err(req, fi ? rc : by_name(ino, rc));
			return;
		}
	}
	/* FUSE_SET_ATTR_CTIME needs nothing: meta sets ctime on every change. */
	if (valid)
		rc = stk_ll_setattr(fs->c, &cr, sino, valid, &v, &out);
	else
		rc = stk_ll_getattr(fs->c, &cr, sino, &out);
	if (rc == -EPERM && valid == STK_LL_SETATTR_MODE && kills_privs(fs, &cr, sino, v.mode))
		/* A write by someone else clears set-uid/set-gid: the kernel asks it of us in
		 * their name, and Linux allows it to anyone who may write. */
		rc = stk_ll_setattr(fs->c, NULL, sino, valid, &v, &out);
	stk_fuse_acache_drop(&fs->acache, sino);
	if (rc) {
		reply_err(req, fi ? rc : by_name(ino, rc));
		return;
	}
	attr_stat(fs, &out, &st);
	fuse_reply_attr(req, &st, fs->o.attr_timeout);
}

static void op_readlink(fuse_req_t req, fuse_ino_t ino)
{
	struct stk_fuse *fs = fs_of(req);
	char buf[STK_LL_PATH_MAX + 1];
	struct stk_ll_cred cr;
	int rc;

	req_cred(req, &cr, 0);
	rc = stk_ll_readlink(fs->c, &cr, ino_swap(fs, ino), buf, sizeof(buf));
	if (rc) {
		reply_err(req, by_name(ino, rc));
		return;
	}
	fuse_reply_readlink(req, buf);
}

static void op_mknod(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode, dev_t rdev)
{
	struct stk_fuse *fs = fs_of(req);
	struct stk_ll_cred cr;
	struct stk_ll_attr a;
	int rc;

	/*
	 * A regular file is a create; fifos, sockets (bind(2)) and device nodes are
	 * inodes only, kept by meta (the kernel checked CAP_MKNOD for devices). The
	 * kernel opens fifos and devices itself, and a nodev mount refuses devices.
	 */
	req_cred(req, &cr, 1);
	if (S_ISREG(mode))
		rc = stk_ll_create(fs->c, &cr, ino_swap(fs, parent), name, mode & 07777, 1, &a,
				    NULL);
	else
		rc = stk_ll_mknod(fs->c, &cr, ino_swap(fs, parent), name,
				   (mode & S_IFMT) | (mode & 07777), (uint64_t)rdev, &a);
	stk_fuse_acache_clear(&fs->acache);
	if (rc) {
		reply_err(req, rc);
		return;
	}
	reply_entry(req, fs, &a);
}

static void op_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode)
{
	struct stk_fuse *fs = fs_of(req);
	struct stk_ll_cred cr;
	struct stk_ll_attr a;
	int rc;

	req_cred(req, &cr, 1);
	rc = stk_ll_mkdir(fs->c, &cr, ino_swap(fs, parent), name, mode & 07777, &a);
	stk_fuse_acache_clear(&fs->acache);
	if (rc) {
		reply_err(req, rc);
		return;
	}
	reply_entry(req, fs, &a);
}

/* Whether this mount has Stoker inode ino open (then an unlink goes through meta). */
static int open_here(void *ctx, uint64_t ino)
{
	struct stk_fuse *fs = ctx;

	return stk_fuse_table_is_open(&fs->tab, ino);
}

static void op_unlink(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct stk_fuse *fs = fs_of(req);
	struct stk_fuse_acache_tok tok = stk_fuse_acache_begin(&fs->acache, ino_swap(fs, parent));
	struct stk_ll_attr after, dir;
	struct stk_ll_cred cr;
	uint64_t gone;
	int rc;

	req_cred(req, &cr, 1);
	/* In a folder delegated here, a file nobody here has open: answered here. */
	if (stk_ll_names_unlink(fs->c, &cr, ino_swap(fs, parent), name, open_here, fs, &gone) == 0) {
		stk_fuse_acache_drop(&fs->acache, ino_swap(fs, parent));
		stk_fuse_acache_drop(&fs->acache, gone);
		reply_err(req, 0);
		return;
	}
	rc = stk_ll_unlink_keep(fs->c, &cr, ino_swap(fs, parent), name, &after, &dir);
	stk_fuse_acache_forget_files(&fs->acache); /* a link count went down */
	if (rc == 0) {
		drop_data(fs, &after);
		stk_fuse_acache_put_dir(&fs->acache, &dir, tok);
	}
	reply_err(req, rc);
}

static void op_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct stk_fuse *fs = fs_of(req);
	struct stk_ll_cred cr;
	int rc;

	req_cred(req, &cr, 1);
	rc = stk_ll_rmdir(fs->c, &cr, ino_swap(fs, parent), name);
	stk_fuse_acache_clear(&fs->acache);
	reply_err(req, rc);
}

static void op_symlink(fuse_req_t req, const char *link, fuse_ino_t parent, const char *name)
{
	struct stk_fuse *fs = fs_of(req);
	struct stk_ll_cred cr;
	struct stk_ll_attr a;
	int rc;

	req_cred(req, &cr, 1);
	rc = stk_ll_symlink(fs->c, &cr, ino_swap(fs, parent), name, link, &a);
	stk_fuse_acache_clear(&fs->acache);
	if (rc) {
		reply_err(req, rc);
		return;
	}
	reply_entry(req, fs, &a);
}

static void op_rename(fuse_req_t req, fuse_ino_t parent, const char *name, fuse_ino_t newparent,
		      const char *newname, unsigned int flags)
{
	struct stk_fuse *fs = fs_of(req);
	struct stk_ll_attr replaced;
	struct stk_ll_cred cr;
	int rc;

	/* NOREPLACE and EXCHANGE have Stoker's values; WHITEOUT is overlayfs's business. */
	if (flags & ~(STK_LL_RENAME_NOREPLACE | STK_LL_RENAME_EXCHANGE)) {
		reply_err(req, -EINVAL);
		return;
	}
	req_cred(req, &cr, 1);
	rc = stk_ll_rename_keep(fs->c, &cr, ino_swap(fs, parent), name, ino_swap(fs, newparent),
				 newname, flags, &replaced);
	stk_fuse_acache_clear(&fs->acache);
	if (rc == 0)
		drop_data(fs, &replaced);
	reply_err(req, rc);
}

static void op_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent, const char *newname)
{
	struct stk_fuse *fs = fs_of(req);
	struct stk_ll_cred cr;
	struct stk_ll_attr a;
	int rc;

	req_cred(req, &cr, 1);
	rc = stk_ll_link(fs->c, &cr, ino_swap(fs, ino), ino_swap(fs, newparent), newname, &a);
	stk_fuse_acache_clear(&fs->acache);
	if (rc) {
		reply_err(req, rc);
		return;
	}
	reply_entry(req, fs, &a);
}

/*
 * A folder under a quota shows the quota as the file system: its byte limit as
 * the size, what is left of it as free (never more than the cluster has free), its
 * inode limit as the inode count (docs/quotas.md). A limit of 0 (none) leaves the
 * cluster's figure. The kernel sends statfs with the inode of the path asked
 * about, so `df` of a quota folder inside a mount of the cluster root shows that
 * folder's quota too, as a mount of the folder itself does: the CSI driver bind-
 * mounts volume folders of one shared mount into pods (docs/csi.md), and a pod's
 * `df` must show its volume, as XFS project quotas and CephFS show theirs.
 */
static void quota_statfs(struct stk_fuse *fs, uint64_t ino, struct statvfs *st)
{
	struct stk_quota q;
	uint64_t bs = st->f_frsize ? st->f_frsize : 4096, used;

	if (stk_ll_quota_get(fs->c, ino, &q))
		return;
	if (q.limit_bytes) {
		used = q.used_bytes + q.reserved_bytes;
		st->f_blocks = q.limit_bytes / bs;
		st->f_bfree = used >= q.limit_bytes ? 0 : (q.limit_bytes - used) / bs;
		st->f_bavail = st->f_bavail < st->f_bfree ? st->f_bavail : st->f_bfree;
		st->f_bfree = st->f_bavail;
	}
	if (q.limit_inodes) {
		st->f_files = q.limit_inodes;
		st->f_ffree = q.used_inodes >= q.limit_inodes ? 0 : q.limit_inodes - q.used_inodes;
		st->f_favail = st->f_ffree;
	}
}

static void op_statfs(fuse_req_t req, fuse_ino_t ino)
{
	struct stk_fuse *fs = fs_of(req);
	struct statvfs st;
	int rc = stk_statfs(fs->c, &st);

	if (rc) {
		reply_err(req, rc);
		return;
	}
	quota_statfs(fs, ino_swap(fs, ino), &st);
	fuse_reply_statfs(req, &st);
}

/* ---- what the mount knows of a file's xattrs ---- */

/* The ttl of what this mount learnt of a file's xattrs: attr_timeout. */
static uint64_t xattr_ttl_ns(const struct stk_fuse *fs)
{
	return fs->o.attr_timeout > 0 ? (uint64_t)(fs->o.attr_timeout * 1e9) : 0;
}

/* Notes that file n has no security.capability, as of xattr generation gen. */
static void note_nocap(struct stk_fuse *fs, struct stk_fuse_node *n, uint64_t gen)
{
	pthread_mutex_lock(&n->lock);
	if (n->xattr_gen == gen)
		n->nocap_until = stk_now_ns() + xattr_ttl_ns(fs);
	pthread_mutex_unlock(&n->lock);
}

/* This mount changes an xattr of ino: forget what it knew of them. */
static void xattrs_changed(struct stk_fuse *fs, uint64_t ino)
{
	struct stk_fuse_node *n = stk_fuse_table_pin(&fs->tab, ino);

	if (!n)
		return;
	pthread_mutex_lock(&n->lock);
	n->xattr_gen++;
	n->nocap_until = 0;
	pthread_mutex_unlock(&n->lock);
	stk_fuse_table_unpin(&fs->tab, n, fs->c);
}

/* ---- files ---- */

/*
 * A libstoker handle on a, taking over the open reference the caller registered
 * (stk_ll_open_attr, stk_ll_create_open) if *registered, which is then cleared.
 */
static int ino_open(struct stk_fuse *fs, const struct stk_ll_cred *cr, const struct stk_ll_attr *a,
		    int flags, int *registered, stk_file **f)
{
	if (!*registered)
		return stk_ll_open(fs->c, cr, a, flags, f);
	*registered = 0;
	return stk_ll_open_registered(fs->c, cr, a, flags, f);
}

/*
 * Gives fh its libstoker handle: the shared one, or one of its own. A new handle
 * takes over the caller's reference (*registered); the shared one has its own.
 */
static int fh_attach(struct stk_fuse *fs, const struct stk_ll_cred *cr, const struct stk_ll_attr *a,
		     struct stk_fuse_fh *fh, int trunc, int *registered)
{
	struct stk_fuse_node *n = fh->node;
	int rc = 0;

	pthread_mutex_lock(&n->lock);
	if (fh->writable || n->wf) {
		if (!n->wf) {
			rc =
			    ino_open(fs, cr, a, O_RDWR | (trunc ? O_TRUNC : 0), registered, &n->wf);
			if (rc == 0) {
				atomic_store(&n->wsize, trunc ? 0 : a->size);
				atomic_store(&n->synced, atomic_load(&n->wgen));
				if (trunc)
					note_change(n, 0, 1); /* a change to record at close */
			}
		} else if (trunc) {
			rc = stk_ftruncate(n->wf, 0);
			if (rc == 0)
				note_change(n, 0, 1);
		}
		if (rc == 0) {
			n->wf_refs++;
			fh->uses_wf = 1;
		}
	} else {
		fh->seen_wgen = atomic_load(&n->wgen); /* a's size is as of this */
	}
	pthread_mutex_unlock(&n->lock);
	if (rc == 0 && !fh->uses_wf)
		rc = ino_open(fs, cr, a, O_RDONLY, registered, &fh->priv);
	return rc;
}

static void release_fh(struct stk_fuse *fs, struct stk_fuse_fh *fh)
{
	struct stk_ll_attr orphan;

	if (fh->uses_wf) {
		wf_put(fs, fh->node);
		stk_fuse_acache_drop(&fs->acache, fh->node->ino);
	}
	if (fh->priv)
		stk_close(fh->priv); /* read-only: nothing to lose */
	if (stk_fuse_table_release(&fs->tab, fh, &orphan))
		stk_ll_remove_data(fs->c, &orphan);
	free(fh);
}

/* The last flock owner handed out (fs.h, locks.c). */
static uint64_t next_flock_owner;

/* Would a read now move a's atime (relatime, msg.h)? Meta decides again. */
static int atime_due(const struct stk_fuse *fs, const struct stk_ll_attr *a)
{
	int64_t now;
	uint32_t nsec;

	if (fs->o.noatime || fs->o.ro)
		return 0;
	stk_wall_time(&now, &nsec);
	return stk_ll_atime_due(a, now);
}

/*
 * The first read through a handle since its open (of Stoker inode ino): queued for
 * meta with the session's closes (stat shows it once the kernel's attributes
 * expire), or, without that queue, recorded now and the kernel's attributes
 * dropped so stat shows the new atime. Errors only cost an atime.
 */
static void note_read(struct stk_fuse *fs, uint64_t ino)
{
	int rc;

	if (stk_ll_note_read(fs->c, ino) == 0)
		return;
	rc = stk_ll_setattr(fs->c, NULL, ino, STK_LL_SETATTR_ATIME_READ, NULL, NULL);
	if (rc == 0)
		fuse_lowlevel_notify_inval_inode(fs->se, ino_swap(fs, ino), -1, 0);
	else if (rc != -ENOENT)
		stk_debug("atime of inode %llu: %s", (unsigned long long)ino, stk_strerror(rc));
}

/*
 * Opens a regular file whose attributes a were just fetched with the registration
 * of an open reference, which this takes over (a handle of its own keeps it; else,
 * and on failure, it is dropped); sets fi. created: the file was made by this very
 * request, so the kernel holds nothing of it yet.
 */
static int open_fh(struct stk_fuse *fs, const struct stk_ll_cred *cr, const struct stk_ll_attr *a,
		   struct fuse_file_info *fi, int created)
{
	int acc = fi->flags & O_ACCMODE;
	int trunc = (fi->flags & O_TRUNC) && acc != O_RDONLY;
	struct stk_fuse_fh *fh = NULL;
	int keep = 0, registered = 1, rc;

	/* O_APPEND needs nothing: the kernel places appends itself, under the inode lock. */
	if (!S_ISREG(a->mode)) {
		rc = S_ISDIR(a->mode) ? -EISDIR : -EINVAL;
		goto out;
	}
	rc = -EINVAL;
	if (acc != O_RDONLY && acc != O_WRONLY && acc != O_RDWR)
		goto out;
	rc = -ENOMEM;
	fh = calloc(1, sizeof(*fh));
	if (!fh)
		goto out;
	fh->writable = acc != O_RDONLY;
	if (fh->writable)
		stk_fuse_acache_drop(&fs->acache, a->ino); /* writes may come */
	fh->flock_owner = __atomic_add_fetch(&next_flock_owner, 1, __ATOMIC_RELAXED);
	atomic_init(&fh->atime_due, acc != O_WRONLY && atime_due(fs, a));
	if ((fi->flags & O_TRUNC) && acc == O_RDONLY && a->size) {
		/* Linux truncates then too; the kernel has checked write permission. */
		rc = set_size(fs, cr, a->ino, NULL, 0);
		if (rc)
			goto out;
		trunc = 1;
	}
	rc = stk_fuse_table_open(&fs->tab, fh, a, trunc, &keep);
	if (rc)
		goto out;
	rc = fh_attach(fs, cr, a, fh, trunc, &registered);
	if (rc) {
		release_fh(fs, fh);
		fh = NULL;
	}
out:
	/* Not taken over (the shared handle holds its own, or a failure): drop it. */
	if (registered)
		stk_ll_unregister(fs->c, a->ino);
	if (rc) {
		free(fh);
		return rc;
	}
	fi->fh = (uintptr_t)fh;
	fi->keep_cache = keep;
	/*
	 * A read-only close has nothing to flush; its FLUSH only carries the POSIX
	 * locks of the closing process to release, and costs every small file read a
	 * round trip (a third more files/s without, W3). So none is asked for while
	 * this mount has never seen a POSIX lock; the locks taken through such a
	 * handle go at its release (locks.c). The kernel ignores the flag under its
	 * write-back cache.
	 */
	if (acc == O_RDONLY && !fs->o.flush && !fs->o.writeback &&
	    !atomic_load(&fs->posix_seen)) {
		fi->noflush = 1;
		fh->noflush = 1;
	}
	/* Kept when the kernel was told these very attributes (attrcache.c, told), and
	 * nothing to drop for a file just made (the kernel would answer ENOENT). */
	if (!keep && !created && !stk_fuse_acache_told_same(&fs->acache, a))
		/* The kernel's attributes may predate another client's close: drop them, so
		 * the first read fetches the size this open saw. */
		fuse_lowlevel_notify_inval_inode(fs->se, ino_swap(fs, a->ino), -1, 0);
	return 0;
}

static void op_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct stk_fuse *fs = fs_of(req);
	struct stk_fuse_acache_tok tok = stk_fuse_acache_begin(&fs->acache, ino_swap(fs, ino));
	struct stk_ll_cred cr;
	struct stk_ll_attr a;
	int rc;

	/* O_TRUNC of a read-only open truncates through meta in the caller's name, and
	 * the caller may hold write permission only through a supplementary group. */
	req_cred(req, &cr, !!(fi->flags & O_TRUNC));
	/*
	 * Fresh attributes, the size and layout this handle works with (close-to-open),
	 * come with the registration of the open reference, in one round trip.
	 */
	rc = stk_ll_open_attr(fs->c, &cr, ino_swap(fs, ino), &a);
	if (rc == 0 && stale_orphan(fs, &a)) {
		stk_ll_unregister(fs->c, a.ino); /* the reference the call registered */
		rc = -ENOENT;
	}
	if (rc) {
		/* Renamed over or removed by another client since the kernel's lookup. */
		reply_err(req, by_name(ino, rc));
		return;
	}
	rc = open_fh(fs, &cr, &a, fi, 0);
	if (rc) {
		reply_err(req, rc);
		return;
	}
	/* The kernel's attributes were dropped (open_fh) and the first read asks again:
	 * these are the ones to answer, unless this mount writes the file. */
	if (!fi->keep_cache && fh_of(fi)->priv)
		stk_fuse_acache_put_once(&fs->acache, &a, tok);
	if (fuse_reply_open(req, fi))
		release_fh(fs, fh_of(fi)); /* interrupted: the kernel will not release it */
}

static void op_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
		      struct fuse_file_info *fi)
{
	struct stk_fuse *fs = fs_of(req);
	struct stk_fuse_acache_tok tok = stk_fuse_acache_begin(&fs->acache, ino_swap(fs, parent));
	struct fuse_entry_param e;
	struct stk_ll_attr a, dir;
	struct stk_ll_cred cr;
	int created = 0, rc;

	req_cred(req, &cr, 1);
	/* In a folder delegated here: answered here, meta told a moment later. */
	if (stk_ll_names_create(fs->c, &cr, ino_swap(fs, parent), name, mode, &a) == 0) {
		stk_fuse_acache_drop(&fs->acache, ino_swap(fs, parent));
		/* The open reference as a leased open's: meta learns it after the create. */
		if (!stk_ll_open_ref_leased(fs->c, a.ino, &dir))
			rc = stk_ll_open_ref(fs->c, a.ino, NULL);
		else
			rc = 0;
		created = 1;
		if (rc >= 0 && open_fh(fs, &cr, &a, fi, created) == 0) {
			atomic_store(&fh_of(fi)->node->behind, 1);
			note_nocap(fs, fh_of(fi)->node, fh_of(fi)->node->xattr_gen);
			fill_entry(fs, &a, &e);
			if (fuse_reply_create(req, &e, fi))
				release_fh(fs, fh_of(fi));
			return;
		}
		/* The file exists here now: say so rather than make it again. */
		reply_err(req, rc < 0 ? rc : -EIO);
		return;
	}
	/* Registers the open reference of a regular file it returns, in the same call. */
	rc = stk_ll_create_open(fs->c, &cr, ino_swap(fs, parent), name, mode & 07777,
				 !!(fi->flags & O_EXCL), &a, &created, &dir);
	if (rc == 0 && created)
		stk_fuse_acache_put_dir(&fs->acache, &dir, tok);
	/* A name that appeared since the kernel's lookup: only a file may be opened
	 * (and only a file was registered). */
	if (rc == 0 && !created && !S_ISREG(a.mode))
		rc = S_ISDIR(a.mode) ? -EISDIR : -EEXIST;
	if (rc == 0)
		rc = open_fh(fs, &cr, &a, fi, created);
	if (rc) {
		reply_err(req, rc);
		return;
	}
	if (created) /* a new file has no xattrs: its writes need not ask */
		note_nocap(fs, fh_of(fi)->node, fh_of(fi)->node->xattr_gen);
	fill_entry(fs, &a, &e);
	if (fuse_reply_create(req, &e, fi))
		release_fh(fs, fh_of(fi));
}

/* A read into buf (NULL: a buffer of this thread's), replied to. */
static void do_read(fuse_req_t req, struct stk_fuse_fh *fh, size_t size, off_t off, char *buf)
{
	struct stk_fuse *fs = fs_of(req);
	char *own = NULL;
	uint64_t atime_ino = 0;
	stk_file *f;
	ssize_t n;
	int ref;

	if (!buf && size <= STK_FUSE_IO_MAX)
		buf = thread_buf(fs);
	if (!buf)
		buf = own = malloc(size ? size : 1);
	if (!buf) {
		reply_err(req, -ENOMEM);
		return;
	}
	f = read_handle(fh, &ref);
	n = stk_pread(f, buf, size, off);
	if (ref)
		wf_put(fs, fh->node);
	/* Decided now: once we reply, the kernel may release fh and its node. */
	if (n > 0 && atomic_load_explicit(&fh->atime_due, memory_order_relaxed) &&
	    atomic_exchange(&fh->atime_due, 0))
		atime_ino = fh->node->ino;
	if (n < 0)
		reply_err(req, (int)n);
	else {
		stk_fuse_metrics_bytes((uint64_t)n);
		fuse_reply_buf(req, buf, (size_t)n);
	}
	free(own);
	/* After the reply, so that the reader does not wait for it. */
	if (atime_ino)
		note_read(fs, atime_ino);
}

#define BIG_READ (256u << 10)

static void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		    struct fuse_file_info *fi)
{
	/* On a ring thread: the ring's own buffer, so the reply is not copied again. */
	char *buf = stk_fuse_uring_buf(size);
	/* A ring thread runs on its caller's CPU; a stream of large reads would keep all
	 * the work of one reader there, so it may run anywhere while it reads. */
	int roam = buf && size >= BIG_READ;

	if (roam)
		stk_fuse_uring_roam(1);
	do_read(req, fh_of(fi), size, off, buf);
	if (roam)
		stk_fuse_uring_roam(0);
}

static void op_write(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size, off_t off,
		     struct fuse_file_info *fi)
{
	struct stk_fuse_fh *fh = fh_of(fi);
	ssize_t n;

	if (!fh->writable) {
		reply_err(req, -EBADF);
		return;
	}
	/* A file created here: meta has it before any of its bytes reach storage. */
	if (atomic_load(&fh->node->behind)) {
		int rc = stk_ll_names_settle(fs_of(req)->c, fh->node->ino);

		if (rc) {
			reply_err(req, rc);
			return;
		}
		atomic_store(&fh->node->behind, 0);
	}
	n = stk_pwrite(fh->node->wf, buf, size, off);
	if (n < 0) {
		reply_err(req, (int)n);
		return;
	}
	note_change(fh->node, (uint64_t)off + (uint64_t)n, 0);
	stk_fuse_metrics_bytes((uint64_t)n);
	fuse_reply_write(req, (size_t)n);
}

static void op_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	stk_fuse_locks_flush(fs_of(req), fi);
	reply_err(req, sync_fh(fs_of(req), fh_of(fi)));
}

static void op_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	stk_fuse_locks_release(fs_of(req), fi);
	release_fh(fs_of(req), fh_of(fi));
	fuse_reply_err(req, 0);
}

static void op_fsync(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi)
{
	struct stk_fuse *fs = fs_of(req);
	struct stk_fuse_fh *fh = fh_of(fi);
	int rc, behind = 0;

	/* A file created here (batched names, stoker_ll.h): its create is durable too. */
	if (atomic_load(&fh->node->behind) || stk_ll_names_queued(fs->c)) {
		behind = stk_ll_names_flush(fs->c);
		if (!behind)
			behind = stk_ll_sync(fs->c);
	}
	rc = sync_fh(fs, fh);
	reply_err(req, rc ? rc : behind);
}

static void op_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t off, off_t len,
			 struct fuse_file_info *fi)
{
	struct stk_fuse *fs = fs_of(req);
	struct stk_fuse_fh *fh = fh_of(fi);
	uint64_t sino = ino_swap(fs, ino);
	struct stk_ll_cred cr;
	struct stk_ll_attr a;
	int rc;

	/* Punch and zero go through the writable handle: it writes zeros and drops chunks. */
	if (mode & (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE)) {
		if (!fh->writable) {
			reply_err(req, -EBADF);
			return;
		}
		if (atomic_load(&fh->node->behind)) {
			rc = stk_ll_names_settle(fs->c, fh->node->ino);
			if (rc) {
				reply_err(req, rc);
				return;
			}
			atomic_store(&fh->node->behind, 0);
		}
		stk_fuse_acache_drop(&fs->acache, fh->node->ino); /* mtime and blocks move */
		rc = stk_fallocate(fh->node->wf, mode, off, len);
		if (rc == 0 && !(mode & FALLOC_FL_KEEP_SIZE))
			note_change(fh->node, (uint64_t)off + (uint64_t)len, 0);
		reply_err(req, rc);
		return;
	}
	/* Storage allocates chunks as they are written: only growing the size means anything. */
	if (mode & ~FALLOC_FL_KEEP_SIZE) {
		reply_err(req, -EOPNOTSUPP);
		return;
	}
	if (off < 0 || len <= 0) {
		reply_err(req, -EINVAL);
		return;
	}
	if (off > INT64_MAX - len) {
		reply_err(req, -EFBIG);
		return;
	}
	if (mode & FALLOC_FL_KEEP_SIZE) {
		reply_err(req, 0);
		return;
	}
	req_cred(req, &cr, 1);
	rc = stk_ll_getattr(fs->c, &cr, sino, &a);
	if (rc) {
		reply_err(req, rc);
		return;
	}
	stk_fuse_table_overlay(&fs->tab, &a);
	if ((uint64_t)(off + len) <= a.size) {
		reply_err(req, 0);
		return;
	}
	reply_err(req, set_size(fs, &cr, sino, fh, (uint64_t)(off + len)));
}

/* ---- directories ---- */

static void op_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct stk_fuse *fs = fs_of(req);
	struct stk_fuse_dh *dh = calloc(1, sizeof(*dh));

	if (!dh) {
		reply_err(req, -ENOMEM);
		return;
	}
	dh->ino = ino_swap(fs, ino);
	dh->cookie_cap = 64;
	dh->cookies = malloc(dh->cookie_cap * sizeof(*dh->cookies));
	if (!dh->cookies) {
		free(dh);
		reply_err(req, -ENOMEM);
		return;
	}
	dh->cookies[0] = 0; /* entry 0 lists from the start */
	dh->ncookies = 1;
	pthread_mutex_init(&dh->lock, NULL);
	fi->fh = (uintptr_t)dh;
	if (fuse_reply_open(req, fi)) {
		pthread_mutex_destroy(&dh->lock);
		free(dh->cookies);
		free(dh);
	}
}

static void op_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct stk_fuse_dh *dh = (struct stk_fuse_dh *)(uintptr_t)fi->fh;

	pthread_mutex_destroy(&dh->lock);
	free(dh->cookies);
	free(dh->ents);
	free(dh->attrs);
	free(dh->attr_rcs);
	free(dh);
	fuse_reply_err(req, 0);
}

/*
 * Makes entry idx of the listing available in dh->ents. 1 if it is, 0 past the
 * end, or -errno. Called with dh->lock held.
 */
static int dir_fill(struct stk_fuse *fs, const struct stk_ll_cred *cr, struct stk_fuse_dh *dh,
		    size_t idx)
{
	uint32_t n = 0;
	int eof = 0, rc;

	if (dh->have && idx >= dh->start && idx < dh->start + dh->n)
		return 1;
	if (dh->have && idx == dh->start + dh->n && dh->eof)
		return 0;
	/*
	 * An offset this handle never gave out: another handle of the folder did. A
	 * file server on the mount (Ganesha) opens the folder again for each chunk of
	 * a listing and seeks to where the last one stopped, so walk there from the
	 * last position this handle knows. Positions count entries in meta's order, so
	 * they hold across handles while the folder does not change.
	 */
	while (idx >= dh->ncookies) {
		rc = dir_fill(fs, cr, dh, dh->ncookies - 1);
		if (rc <= 0)
			return rc;
		if (dh->eof && idx >= dh->ncookies)
			return 0;
	}
	if (!dh->ents) {
		dh->ents = malloc(STK_FUSE_DIR_BATCH * sizeof(*dh->ents));
		if (!dh->ents)
			return -ENOMEM;
	}
	dh->have = 0;
	dh->attrs_have = 0;
	rc = stk_ll_readdir(fs->c, cr, dh->ino, dh->cookies[idx], STK_FUSE_DIR_BATCH, dh->ents, &n,
			     &eof);
	if (rc)
		return rc;
	if (dh->ncookies + n > dh->cookie_cap) {
		size_t cap = dh->cookie_cap;
		uint64_t *c;
		while (cap < dh->ncookies + n)
			cap *= 2;
		c = realloc(dh->cookies, cap * sizeof(*c));
		if (!c)
			return -ENOMEM;
		dh->cookies = c;
		dh->cookie_cap = cap;
	}
	for (uint32_t k = 0; k < n; k++)
		if (idx + k + 1 == dh->ncookies)
			dh->cookies[dh->ncookies++] = dh->ents[k].next_cookie;
	dh->start = idx;
	dh->n = n;
	dh->eof = eof;
	dh->have = 1;
	return n ? 1 : 0;
}

/*
 * Attributes of entry k of the loaded batch, for readdirplus: 0 with *a, or -errno.
 * The batch's entries from k on are looked up by name in one META_LOOKUPS, then
 * reused while they are fresh (a listing is read a page at a time). Its answers
 * are leased like single lookups and land in the lookup cache, so the files of a
 * folder listed and then read one by one (ImageFolder, a data loader) are opened
 * with no call to meta each once the kernel's entries expire or are dropped. A
 * meta without it is asked META_GETATTRS by inode (not leased), and one without
 * that one by one. Called with dh->lock held.
 */
static int dir_attr(struct stk_fuse *fs, const struct stk_ll_cred *cr, struct stk_fuse_dh *dh,
		    uint32_t k, struct stk_ll_attr *a, struct stk_fuse_acache_tok *tok)
{
	uint64_t now = stk_now_ns(), inos[STK_FUSE_DIR_BATCH];
	uint32_t n = dh->n - k;
	int rc;

	if (dh->attrs_have && k >= dh->attrs_from && now - dh->attrs_ns < STK_FUSE_PLUS_FRESH_NS) {
		*a = dh->attrs[k];
		*tok = dh->attrs_tok;
		return dh->attr_rcs[k];
	}
	*tok = stk_fuse_acache_begin(&fs->acache, 0);
	if (!dh->attrs) {
		dh->attrs = malloc(STK_FUSE_DIR_BATCH * sizeof(*dh->attrs));
		dh->attr_rcs = malloc(STK_FUSE_DIR_BATCH * sizeof(*dh->attr_rcs));
	}
	if (!dh->attrs || !dh->attr_rcs || n == 0 ||
	    __atomic_load_n(&fs->no_getattrs, __ATOMIC_RELAXED))
		return stk_ll_getattr(fs->c, cr, dh->ents[k].ino, a);
	rc = -ENOSYS;
	if (!__atomic_load_n(&fs->no_lookups, __ATOMIC_RELAXED)) {
		const char *names[STK_FUSE_DIR_BATCH];
		uint32_t m = STK_MIN(n, STK_LL_LOOKUPS_MAX);

		for (uint32_t i = 0; i < m; i++)
			names[i] = dh->ents[k + i].name;
		rc = stk_ll_lookups(fs->c, cr, dh->ino, names, m, dh->attrs + k, dh->attr_rcs + k);
		if (rc == -ENOSYS)
			__atomic_store_n(&fs->no_lookups, 1, __ATOMIC_RELAXED);
		if (rc == 0)
			n = m;
	}
	/* Or by inode: also for a caller who may list the folder but not search it. */
	if (rc) {
		for (uint32_t i = 0; i < n; i++)
			inos[i] = dh->ents[k + i].ino;
		rc = stk_ll_getattrs(fs->c, cr, inos, n, dh->attrs + k, dh->attr_rcs + k);
		if (rc == -ENOSYS) /* an older meta: one by one from now on */
			__atomic_store_n(&fs->no_getattrs, 1, __ATOMIC_RELAXED);
	}
	if (rc)
		return stk_ll_getattr(fs->c, cr, dh->ents[k].ino, a);
	dh->attrs_have = 1;
	dh->attrs_from = k;
	dh->attrs_ns = now;
	dh->attrs_tok = *tok;
	*a = dh->attrs[k];
	return dh->attr_rcs[k];
}

static void do_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		       struct fuse_file_info *fi, int plus)
{
	struct stk_fuse *fs = fs_of(req);
	struct stk_fuse_dh *dh = (struct stk_fuse_dh *)(uintptr_t)fi->fh;
	char *buf = thread_buf(fs);
	struct {
		struct stk_ll_attr a;
		struct stk_fuse_acache_tok tok;
	} tolds[128];
	size_t used = 0, ntold = 0;
	struct stk_ll_cred cr;
	int rc = 0;

	if (!buf) {
		reply_err(req, -ENOMEM);
		return;
	}
	if (off < 0) {
		reply_err(req, -EINVAL);
		return;
	}
	if (size > STK_FUSE_IO_MAX)
		size = STK_FUSE_IO_MAX;
	req_cred(req, &cr, 1);
	pthread_mutex_lock(&dh->lock);
	if (off == 0) {
		/* The start of a listing, or rewinddir: POSIX wants the directory as it is
		 * now, not the batch fetched before, and earlier offsets need not survive
		 * a rewind, so the positions are counted afresh. */
		dh->have = 0;
		dh->ncookies = 1;
	}
	for (uint64_t pos = (uint64_t)off;; pos++) {
		struct fuse_entry_param e;
		struct stk_fuse_acache_tok tok;
		struct stk_ll_attr a;
		const char *name;
		size_t need;
		int told = 0;

		memset(&e, 0, sizeof(e));
		if (pos < 2) {
			/* ".." gets the folder's own number: the kernel answers ".." itself. */
			name = pos ? ".." : ".";
			e.attr.st_ino = dh->ino;
			e.attr.st_mode = S_IFDIR;
		} else {
			const struct stk_ll_dirent *d;
			rc = dir_fill(fs, &cr, dh, pos - 2);
			if (rc <= 0)
				break;
			d = &dh->ents[pos - 2 - dh->start];
			name = d->name;
			e.attr.st_ino = d->ino;
			e.attr.st_mode = d->mode & S_IFMT;
			if (plus) {
				int grc = dir_attr(fs, &cr, dh, (uint32_t)(pos - 2 - dh->start), &a,
						   &tok);
				if (grc == -ENOENT)
					continue; /* removed since it was listed */
				if (grc == 0) {
					fill_entry(fs, &a, &e);
					told = 1;
				}
				/* else e.ino stays 0: the name is listed, looked up later */
			}
		}
		if (plus)
			need = fuse_add_direntry_plus(req, buf + used, size - used, name, &e,
						      (off_t)(pos + 1));
		else
			need = fuse_add_direntry(req, buf + used, size - used, name, &e.attr,
						 (off_t)(pos + 1));
		if (need > size - used)
			break;
		used += need;
		if (told && ntold < STK_ARRAY_SIZE(tolds)) {
			tolds[ntold].a = a;
			tolds[ntold++].tok = tok;
		}
	}
	pthread_mutex_unlock(&dh->lock);
	if (rc < 0 && used == 0) {
		reply_err(req, rc);
		return;
	}
	/* What the kernel was told, once it was (attrcache.c); the rest are not noted. */
	if (fuse_reply_buf(req, buf, used) == 0)
		for (size_t i = 0; i < ntold; i++)
			stk_fuse_acache_told(&fs->acache, &tolds[i].a, tolds[i].tok);
}

static void op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		       struct fuse_file_info *fi)
{
	do_readdir(req, ino, size, off, fi, 0);
}

static void op_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
			   struct fuse_file_info *fi)
{
	do_readdir(req, ino, size, off, fi, 1);
}

static void op_fsyncdir(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi)
{
	struct stk_fuse *fs = fs_of(req);

	/* Namespace changes are committed when they return (those answered here once
	 * sent: batched names in stoker_ll.h); stk_ll_sync forces them to disk. */
	int behind = stk_ll_names_flush(fs->c);
	int rc = stk_ll_sync(fs->c);

	reply_err(req, rc ? rc : behind);
}

/* ---- extended attributes (kept in meta, which checks the namespace rules) ---- */

static void op_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name, const char *value,
			size_t size, int flags)
{
	struct stk_fuse *fs = fs_of(req);
	struct stk_ll_cred cr;
	int rc;

	req_cred(req, &cr, 1);
	rc = stk_ll_setxattr(fs->c, &cr, ino_swap(fs, ino), name, value, size, (uint32_t)flags);
	xattrs_changed(fs, ino_swap(fs, ino)); /* after: a getxattr meanwhile notes nothing */
	stk_fuse_acache_drop(&fs->acache, ino_swap(fs, ino)); /* its ctime moved */
	reply_err(req, by_name(ino, rc));
}

/* getxattr and listxattr: size 0 asks the length; otherwise the bytes, or ERANGE. */
static void reply_xattr(fuse_req_t req, long rc, const char *buf, size_t size)
{
	if (rc < 0)
		reply_err(req, (int)rc);
	else if (size == 0)
		fuse_reply_xattr(req, (size_t)rc);
	else
		fuse_reply_buf(req, buf, (size_t)rc);
}

static void op_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name, size_t size)
{
	struct stk_fuse *fs = fs_of(req);
	struct stk_fuse_node *n = NULL;
	uint64_t gen = 0;
	struct stk_ll_cred cr;
	char *buf = NULL;
	long rc;

	/* Asked before every write of an open file: answered here while known. */
	if (strcmp(name, "security.capability") == 0 &&
	    (n = stk_fuse_table_pin(&fs->tab, ino_swap(fs, ino)))) {
		int none;

		pthread_mutex_lock(&n->lock);
		none = stk_now_ns() < n->nocap_until;
		gen = n->xattr_gen;
		pthread_mutex_unlock(&n->lock);
		if (none) {
			stk_fuse_table_unpin(&fs->tab, n, fs->c);
			reply_err(req, -ENODATA);
			return;
		}
	}
	if (size > STK_LL_XATTR_SIZE_MAX)
		size = STK_LL_XATTR_SIZE_MAX;
	if (size && !(buf = malloc(size))) {
		rc = -ENOMEM;
		goto out;
	}
	req_cred(req, &cr, 1);
	rc = stk_ll_getxattr(fs->c, &cr, ino_swap(fs, ino), name, buf, size);
	if (rc == -ENODATA && n)
		note_nocap(fs, n, gen);
	if (rc == -ENOENT)
		rc = by_name(ino, -ENOENT);
out:
	if (n)
		stk_fuse_table_unpin(&fs->tab, n, fs->c);
	reply_xattr(req, rc, buf, size);
	free(buf);
}

static void op_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size)
{
	struct stk_fuse *fs = fs_of(req);
	struct stk_ll_cred cr;
	char *buf = NULL;
	long rc;

	if (size > STK_LL_XATTR_SIZE_MAX)
		size = STK_LL_XATTR_SIZE_MAX;
	if (size && !(buf = malloc(size))) {
		reply_err(req, -ENOMEM);
		return;
	}
	req_cred(req, &cr, 1);
	rc = stk_ll_listxattr(fs->c, &cr, ino_swap(fs, ino), buf, size);
	if (rc == -ENOENT)
		rc = by_name(ino, -ENOENT);
	reply_xattr(req, rc, buf, size);
	free(buf);
}

static void op_removexattr(fuse_req_t req, fuse_ino_t ino, const char *name)
{
	struct stk_fuse *fs = fs_of(req);
	struct stk_ll_cred cr;
	int rc;

	req_cred(req, &cr, 1);
	rc = stk_ll_removexattr(fs->c, &cr, ino_swap(fs, ino), name);
	xattrs_changed(fs, ino_swap(fs, ino)); /* after: a getxattr meanwhile notes nothing */
	stk_fuse_acache_drop(&fs->acache, ino_swap(fs, ino)); /* its ctime moved */
	reply_err(req, by_name(ino, rc));
}

/*
 * Not here, so the kernel answers by itself: forget (nothing to forget), ioctl,
 * poll, bmap,
 * lseek (SEEK_DATA/SEEK_HOLE as generic),
 * copy_file_range (read and write).
 */
static const struct fuse_lowlevel_ops ops = {
	.init = op_init,
	.lookup = op_lookup,
	.getattr = op_getattr,
	.access = op_access,
	.setattr = op_setattr,
	.readlink = op_readlink,
	.mknod = op_mknod,
	.mkdir = op_mkdir,
	.unlink = op_unlink,
	.rmdir = op_rmdir,
	.symlink = op_symlink,
	.rename = op_rename,
	.link = op_link,
	.open = op_open,
	.read = op_read,
	.write = op_write,
	.flush = op_flush,
	.release = op_release,
	.fsync = op_fsync,
	.opendir = op_opendir,
	.readdir = op_readdir,
	.readdirplus = op_readdirplus,
	.releasedir = op_releasedir,
	.fsyncdir = op_fsyncdir,
	.statfs = op_statfs,
	.create = op_create,
	.fallocate = op_fallocate,
	.setxattr = op_setxattr,
	.getxattr = op_getxattr,
	.listxattr = op_listxattr,
	.removexattr = op_removexattr,
	.getlk = stk_fuse_getlk, /* locks.c: across every client, held in meta */
	.setlk = stk_fuse_setlk,
	.flock = stk_fuse_flock,
};

const struct fuse_lowlevel_ops *stk_fuse_ops(void)
{
	return &ops;
}

int stk_fuse_fs_init(struct stk_fuse *fs)
{
	int rc = stk_fuse_table_init(&fs->tab);

	if (rc)
		return rc;
	rc = -pthread_key_create(&fs->rbuf_key, rbuf_free);
	if (rc) {
		stk_fuse_table_destroy(&fs->tab);
		return rc;
	}
	stk_fuse_acache_init(&fs->acache, fs->o.attr_timeout);
	fs->rbuf_key_ok = 1;
	return 0;
}

void stk_fuse_fs_fini(struct stk_fuse *fs)
{
	unsigned n;

	stk_ll_on_revoked_ino(fs->c, NULL, NULL); /* no call in progress once it returns */
	stk_fuse_notify_stop(fs);
	n = stk_fuse_table_drain(&fs->tab, fs->c);

	if (n)
		stk_info("closed %u file(s) the kernel left open at unmount", n);
	stk_fuse_table_destroy(&fs->tab);
	stk_fuse_acache_destroy(&fs->acache);
	if (fs->rbuf_key_ok) {
		rbuf_free(pthread_getspecific(fs->rbuf_key));
		pthread_setspecific(fs->rbuf_key, NULL);
		pthread_key_delete(fs->rbuf_key);
		fs->rbuf_key_ok = 0;
	}
}
