/*
 * `stoker sync SRC DST`: copies or mirrors a tree between a local folder, a Stoker
 * cluster (stk://HOST:PORT/dir, stk:///dir) and an S3 bucket (s3://bucket/prefix on
 * any endpoint), in any direction. docs/sync.md is the user's guide.
 *
 * A run has four steps, each parallel over a pool of worker threads:
 *
 *   list     both trees, one directory per task (local and Stoker: readdir and
 *            lstat), or ListObjectsV2 pages (S3, where folders are only implied);
 *   plan     both lists sorted by relative path and merged: what to copy (missing,
 *            another size or mtime, or other bytes with --checksum), to delete
 *            (--delete), to make (folders, links) and whose attributes to fix;
 *   copy     deletions first, then folders in path order (a parent before its
 *            children), then files and links; a file larger than --part-size is
 *            cut into parts that several workers copy at once, each with its own
 *            handle (or S3 multipart part), so that one big file uses them all;
 *   finish   folders' modes and times last, children before parents, since adding
 *            an entry changes its folder's mtime.
 *
 * Nothing half-copied is ever visible under its real name: a file is written to
 * a temporary name beside it (".stoker-sync-HASH.tmp", the hash of its path, so
 * that a rerun reuses the name), made durable, checked (its size always, its
 * bytes with --checksum), given its attributes, and renamed into place. S3 needs
 * no temporary name: an object appears whole when its PUT or Complete returns. A
 * killed run leaves at most temporary files, which the next run overwrites or
 * removes; as finished files then compare equal (size and mtime, which sync
 * copied), a rerun does only what is left.
 *
 * A source file that changes while it is copied is reported, never copied torn:
 * its size, mtime and ctime (S3: its ETag, which every ranged GET must still
 * match) are taken when it is opened and again after its last byte is read.
 *
 * Across machines, sync runs under an existing launcher (mpirun) rather than a
 * coordinator of its own: each rank lists both trees, and takes the files whose
 * path hash modulo the number of ranks is its rank; every rank makes the
 * folders (an existing one is fine), and each reports its own share.
 */
#include "cli.h"

#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <getopt.h>
#include <inttypes.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "../common/util.h"
#include "fsio.h"
#include "s3client.h"
#include "stoker/stoker_ll.h"

#define SYNC_BUF (4u << 20)		/* one read or write of a local or Stoker file */
#define SYNC_PART_DEFAULT (32ull << 20) /* files above this are split into parts */
#define SYNC_THREADS_DEFAULT 16
#define SYNC_TMP_PREFIX ".stoker-sync-"
#define SYNC_TMP_SUFFIX ".tmp"
#define SYNC_MAX_FILTERS 64
#define SYNC_MAX_FAILS_SHOWN 50

enum sync_kind { SYNC_LOCAL, SYNC_STK, SYNC_S3 };
enum ent_type { ENT_FILE, ENT_DIR, ENT_LINK };

/* One side of the copy. */
struct sync_ep {
	enum sync_kind kind;
	const char *arg;
	struct cli_fs fs;	 /* local and Stoker */
	char root[CLI_FS_PATH];	 /* local and Stoker: the folder, without a trailing '/' */
	struct cli_s3_conf *s3c; /* S3 */
	char bucket[64];
	char prefix[1024]; /* "" or "dir/" */
};

/* A file, folder or link of one tree. */
struct ent {
	char *rel; /* relative path, never "" (the root is not an entry) */
	uint8_t type;
	uint8_t empty; /* a folder with no entries (S3: a folder marker is made) */
	uint32_t mtime_ns;
	int64_t mtime;
	uint64_t size;
	mode_t mode;
	uid_t uid;
	gid_t gid;
	uint64_t ino;		/* Stoker: the inode (a destination folder's, for dirmap) */
	char *link;		/* ENT_LINK: the target */
	char etag[CLI_S3_ETAG]; /* S3 */
};

struct ents {
	struct ent *v;
	size_t n, cap;
	pthread_mutex_t lock;
};

struct filter {
	const char *pat;
	int include;
	int dir_only; /* the pattern ended in '/' */
	int anchored; /* the pattern has a '/' (else it matches a name at any depth) */
};

struct sync_opts {
	unsigned threads;
	uint64_t part_size;
	int del, dry_run, checksum, update, json, progress, no_perms;
	uint64_t bwlimit; /* bytes per second over all workers, 0: none */
	unsigned rank, ranks;
	unsigned nfilters;
	struct filter filters[SYNC_MAX_FILTERS];
};

/* A file larger than the part size, copied by several workers at once. */
struct big {
	struct ent *s;
	char tmp[CLI_FS_PATH]; /* local/Stoker destination: the temporary file */
	struct cli_file src;   /* local/Stoker source: shared for pread */
	struct stat before;
	unsigned nparts;
	atomic_uint next_part; /* the next part to hand out */
	atomic_uint parts_left;
	atomic_int failed; /* -errno of the first failure, reason in why */
	char why[256];
	pthread_mutex_t lock; /* why */
	uint32_t *crc;	      /* per part, of the bytes read */
	char (*etags)[CLI_S3_ETAG];
	char upload_id[256];
	uint8_t (*md5)[16];
	struct big *next_active; /* in sync.active: parts left to hand out */
};

enum job_kind { JOB_DEL, JOB_MKDIR, JOB_FILE, JOB_LINK, JOB_ATTR, JOB_MARKER };

struct job {
	uint8_t kind;
	uint8_t compare; /* --checksum: compare bytes first, copy only if they differ */
	uint8_t failed;	 /* MKDIR: the folder could not be made (no attributes then) */
	struct ent *s;	 /* source entry (all but DEL) */
	struct ent *d;	 /* destination entry, if any */
};

struct fail {
	char *rel;
	char *why;
};

/*
 * Stoker destinations: the inode of each destination folder by its relative path
 * ("" is the top), so that a file's create, attributes and rename are one call
 * each by (folder inode, name), rather than a walk of its whole path per call
 * (the client library has no cache of names: each component is a round trip).
 * Filled before the files are copied, read-only while they are.
 */
struct dirmap {
	uint64_t *hash;
	uint64_t *ino; /* 0: a free slot */
	const char **rel;
	size_t cap, n;
};

struct sync;

/* One worker: its own buffers and S3 connections. */
struct worker {
	struct sync *sy;
	pthread_t tid;
	char *buf, *buf2; /* SYNC_BUF, or the part size when S3 is a side */
	size_t buflen;
	struct cli_s3 *s3src, *s3dst;
};

struct sync {
	struct sync_opts o;
	struct sync_ep src, dst;
	struct ents sents, dents;
	char **stale; /* temporary files found in the destination */
	size_t nstale, capstale;
	struct job *jobs;
	size_t njobs, capjobs;
	atomic_size_t next_job;
	size_t job_end; /* the current phase's jobs: [next_job, job_end) */
	pthread_mutex_t active_lock;
	pthread_cond_t active_cond; /* signalled when a big file's parts are handed out */
	struct big *active;	    /* big files with parts to hand out; active_lock */
	atomic_uint running;	    /* workers inside a job */
	/* totals */
	atomic_uint_fast64_t bytes_done, files_done, files_same, dirs_made, links_made, deleted,
	    attrs_fixed, skipped;
	atomic_uint_fast64_t files_checked; /* planned, then found the same by --checksum */
	atomic_uint_fast64_t bytes_checked; /* their bytes (counted as done, not copied) */
	atomic_uint_fast64_t bw_bytes;	    /* bytes --bwlimit has let through */
	uint64_t bytes_total, files_total;
	uint64_t t0;
	struct dirmap dirs;
	pthread_mutex_t fail_lock;
	struct fail *fails;
	size_t nfails, capfails;
	int list_failed;
	int euid0;
};

/* The process's umask, read once at the start: modes of files made from S3 objects. */
static mode_t g_umask;

/* ---- small helpers ---- */

static int ents_add(struct ents *es, struct ent *e)
{
	pthread_mutex_lock(&es->lock);
	if (es->n == es->cap) {
		size_t cap = es->cap ? es->cap * 2 : 4096;
		struct ent *v = realloc(es->v, cap * sizeof(*v));
		if (!v) {
			pthread_mutex_unlock(&es->lock);
			return -ENOMEM;
		}
		es->v = v;
		es->cap = cap;
	}
	es->v[es->n++] = *e;
	pthread_mutex_unlock(&es->lock);
	return 0;
}

static void ents_free(struct ents *es)
{
	for (size_t i = 0; i < es->n; i++) {
		free(es->v[i].rel);
		free(es->v[i].link);
	}
	free(es->v);
	es->v = NULL;
	es->n = es->cap = 0;
}

static int cmp_ent(const void *a, const void *b)
{
	return strcmp(((const struct ent *)a)->rel, ((const struct ent *)b)->rel);
}

static void fail_add(struct sync *sy, const char *rel, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Records a failure of rel; reported at the end. */
static void fail_add(struct sync *sy, const char *rel, const char *fmt, ...)
{
	char why[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	pthread_mutex_lock(&sy->fail_lock);
	if (sy->nfails == sy->capfails) {
		size_t cap = sy->capfails ? sy->capfails * 2 : 64;
		struct fail *v = realloc(sy->fails, cap * sizeof(*v));
		if (!v)
			goto out;
		sy->fails = v;
		sy->capfails = cap;
	}
	sy->fails[sy->nfails].rel = strdup(rel);
	sy->fails[sy->nfails].why = strdup(why);
	if (sy->fails[sy->nfails].rel && sy->fails[sy->nfails].why)
		sy->nfails++;
out:
	pthread_mutex_unlock(&sy->fail_lock);
}

/* Whether this rank copies rel: its hash modulo the ranks is ours. */
static uint64_t rel_hash(const char *rel)
{
	return XXH64(rel, strlen(rel), 0);
}

static int mine(const struct sync *sy, const char *rel)
{
	return sy->o.ranks <= 1 || rel_hash(rel) % sy->o.ranks == sy->o.rank;
}

/* The name of rel's temporary file: ".stoker-sync-HASH.tmp" beside it. */
static int tmp_path(const struct sync_ep *ep, const char *rel, char *out)
{
	const char *slash = strrchr(rel, '/');
	int dirlen = slash ? (int)(slash - rel) : 0;
	int n =
	    snprintf(out, CLI_FS_PATH, "%s/%.*s%s" SYNC_TMP_PREFIX "%016" PRIx64 SYNC_TMP_SUFFIX,
		     ep->root, dirlen, rel, slash ? "/" : "", rel_hash(rel));

	return n < 0 || n >= CLI_FS_PATH ? -ENAMETOOLONG : 0;
}

static int is_tmp_name(const char *name)
{
	size_t n = strlen(name), p = strlen(SYNC_TMP_PREFIX), s = strlen(SYNC_TMP_SUFFIX);

	return n == p + 16 + s && strncmp(name, SYNC_TMP_PREFIX, p) == 0 &&
	       strcmp(name + n - s, SYNC_TMP_SUFFIX) == 0;
}

static uint64_t dirmap_key(const char *rel, size_t len)
{
	return XXH64(rel, len, 1);
}

/* Records folder rel[0..len) (rel stays the caller's: an entry's) as inode ino. */
static int dirmap_put(struct dirmap *m, const char *rel, size_t len, uint64_t ino)
{
	if ((m->n + 1) * 2 > m->cap) {
		struct dirmap g = {.cap = m->cap ? m->cap * 2 : 1024};
		g.hash = calloc(g.cap, sizeof(*g.hash));
		g.ino = calloc(g.cap, sizeof(*g.ino));
		g.rel = calloc(g.cap, sizeof(*g.rel));
		if (!g.hash || !g.ino || !g.rel) {
			free(g.hash);
			free(g.ino);
			free(g.rel);
			return -ENOMEM;
		}
		for (size_t i = 0; i < m->cap; i++) {
			if (!m->ino[i])
				continue;
			size_t j = m->hash[i] & (g.cap - 1);
			while (g.ino[j])
				j = (j + 1) & (g.cap - 1);
			g.hash[j] = m->hash[i];
			g.ino[j] = m->ino[i];
			g.rel[j] = m->rel[i];
		}
		g.n = m->n;
		free(m->hash);
		free(m->ino);
		free(m->rel);
		*m = g;
	}
	uint64_t h = dirmap_key(rel, len);
	size_t j = h & (m->cap - 1);
	while (m->ino[j]) {
		if (m->hash[j] == h && strlen(m->rel[j]) == len &&
		    memcmp(m->rel[j], rel, len) == 0) {
			m->ino[j] = ino;
			return 0;
		}
		j = (j + 1) & (m->cap - 1);
	}
	m->hash[j] = h;
	m->ino[j] = ino;
	m->rel[j] = rel;
	m->n++;
	return 0;
}

/* The inode of folder rel[0..len), or 0 when it is not known. */
static uint64_t dirmap_get(const struct dirmap *m, const char *rel, size_t len)
{
	uint64_t h = dirmap_key(rel, len);

	if (!m->cap)
		return 0;
	for (size_t j = h & (m->cap - 1); m->ino[j]; j = (j + 1) & (m->cap - 1))
		if (m->hash[j] == h && strlen(m->rel[j]) == len && memcmp(m->rel[j], rel, len) == 0)
			return m->ino[j];
	return 0;
}

static void dirmap_free(struct dirmap *m)
{
	free(m->hash);
	free(m->ino);
	free(m->rel);
	memset(m, 0, sizeof(*m));
}

/* The inode of rel's folder on a Stoker destination, 0 when unknown. */
static uint64_t parent_ino(const struct sync *sy, const char *rel)
{
	const char *slash = strrchr(rel, '/');

	return dirmap_get(&sy->dirs, rel, slash ? (size_t)(slash - rel) : 0);
}

/* The full path (local, Stoker) or key (S3) of rel on a side. */
static int ep_path(const struct sync_ep *ep, const char *rel, char *out)
{
	int n;

	if (ep->kind == SYNC_S3)
		n = snprintf(out, CLI_FS_PATH, "%s%s", ep->prefix, rel);
	else
		n = snprintf(out, CLI_FS_PATH, "%s/%s", ep->root, rel);
	return n < 0 || n >= CLI_FS_PATH ? -ENAMETOOLONG : 0;
}

/*
 * Whether the filters keep rel (a folder when is_dir): the first pattern that
 * matches decides, and a path no pattern matches is kept. A pattern without '/'
 * matches the last name of a path; one ending in '/' matches folders (and only
 * those patterns do: a folder left out is not walked).
 */
static int kept(const struct sync_opts *o, const char *rel, int is_dir)
{
	const char *base = strrchr(rel, '/');

	base = base ? base + 1 : rel;
	for (unsigned i = 0; i < o->nfilters; i++) {
		const struct filter *f = &o->filters[i];
		/* Folders are always walked unless a folder pattern says otherwise. */
		if (f->dir_only != is_dir)
			continue;
		if (fnmatch(f->pat, f->anchored ? rel : base, f->anchored ? FNM_PATHNAME : 0) == 0)
			return f->include;
	}
	return 1;
}

static void ent_from_stat(struct ent *e, const struct stat *st)
{
	e->type = S_ISDIR(st->st_mode) ? ENT_DIR : S_ISLNK(st->st_mode) ? ENT_LINK : ENT_FILE;
	e->size = S_ISREG(st->st_mode) ? (uint64_t)st->st_size : 0;
	e->mtime = st->st_mtim.tv_sec;
	e->mtime_ns = (uint32_t)st->st_mtim.tv_nsec;
	e->mode = st->st_mode;
	e->uid = st->st_uid;
	e->gid = st->st_gid;
	e->ino = st->st_ino;
}

static double now_s(void)
{
	return (double)stk_now_ns() / 1e9;
}

/*
 * Counts n more bytes copied, first sleeping as long as the run would be ahead of
 * --bwlimit with them (so that the progress line shows the bytes when they are due).
 */
static void throttle(struct sync *sy, uint64_t n)
{
	if (sy->o.bwlimit) {
		uint64_t due = atomic_fetch_add(&sy->bw_bytes, n) + n;
		double want = (double)due / (double)sy->o.bwlimit;
		double el = (double)(stk_now_ns() - sy->t0) / 1e9;
		if (want > el) {
			double d = want - el;
			struct timespec ts = {(time_t)d, (long)((d - (double)(time_t)d) * 1e9)};
			nanosleep(&ts, NULL);
		}
	}
	atomic_fetch_add(&sy->bytes_done, n);
}

/* ---- listing local and Stoker trees ---- */

struct walk {
	struct sync *sy;
	struct sync_ep *ep;
	struct ents *out;
	int is_src;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	char **q; /* folders to list, relative ("" is the root) */
	size_t qn, qcap;
	unsigned busy;
	int err; /* listing the root failed */
};

struct walk_dir {
	struct walk *w;
	const char *rel; /* the folder being listed */
	unsigned count;	 /* entries kept */
};

static int walk_push(struct walk *w, const char *rel)
{
	char *p = strdup(rel);

	if (!p)
		return -ENOMEM;
	pthread_mutex_lock(&w->lock);
	if (w->qn == w->qcap) {
		size_t cap = w->qcap ? w->qcap * 2 : 256;
		char **q = realloc(w->q, cap * sizeof(*q));
		if (!q) {
			pthread_mutex_unlock(&w->lock);
			free(p);
			return -ENOMEM;
		}
		w->q = q;
		w->qcap = cap;
	}
	w->q[w->qn++] = p;
	pthread_cond_signal(&w->cond);
	pthread_mutex_unlock(&w->lock);
	return 0;
}

/*
 * A folder or entry that cannot be read: the root is fatal; anything under it
 * is a failure of the run, which goes on with the rest but deletes nothing
 * (an incomplete listing cannot tell what is extra).
 */
static void walk_fail(struct walk *w, const char *rel, int rc)
{
	if (rel[0]) {
		fail_add(w->sy, rel, "cannot list%s: %s", w->is_src ? "" : " at the destination",
			 stk_strerror(rc));
		w->sy->list_failed = 1;
		return;
	}
	pthread_mutex_lock(&w->lock);
	if (!w->err)
		w->err = rc;
	pthread_mutex_unlock(&w->lock);
}

/* A temporary file of an earlier run (destination only): removed at the end of this one. */
static void walk_stale(struct walk_dir *wd, const char *name)
{
	struct walk *w = wd->w;
	char path[CLI_FS_PATH];

	if (w->is_src)
		return;
	if (snprintf(path, sizeof(path), "%s/%s%s%s", w->ep->root, wd->rel, wd->rel[0] ? "/" : "",
		     name) >= (int)sizeof(path))
		return;
	pthread_mutex_lock(&w->lock);
	if (w->sy->nstale == w->sy->capstale) {
		size_t cap = w->sy->capstale ? w->sy->capstale * 2 : 64;
		char **v = realloc(w->sy->stale, cap * sizeof(*v));
		if (v) {
			w->sy->stale = v;
			w->sy->capstale = cap;
		}
	}
	if (w->sy->nstale < w->sy->capstale)
		w->sy->stale[w->sy->nstale++] = strdup(path);
	pthread_mutex_unlock(&w->lock);
}

/*
 * One entry of a folder being listed, with its attributes (and a link's target):
 * a folder goes to the queue, anything else kept to the list.
 */
static int walk_add(struct walk_dir *wd, const char *rel, const struct stat *st, const char *target)
{
	struct walk *w = wd->w;
	struct ent e = {0};
	int rc;

	if (!S_ISREG(st->st_mode) && !S_ISDIR(st->st_mode) && !S_ISLNK(st->st_mode))
		return 0; /* fifos, sockets, devices: not copied */
	ent_from_stat(&e, st);
	if (!kept(&w->sy->o, rel, e.type == ENT_DIR))
		return 0;
	wd->count++;
	if (e.type == ENT_DIR)
		return walk_push(w, rel); /* its entry is added once it is listed */
	e.rel = strdup(rel);
	e.link = target ? strdup(target) : NULL;
	if (!e.rel || (target && !e.link)) {
		rc = -ENOMEM;
		goto fail;
	}
	rc = ents_add(w->out, &e);
	if (!rc)
		return 0;
fail:
	free(e.rel);
	free(e.link);
	return rc;
}

static int walk_entry(void *ctx, const char *name, int is_dir)
{
	struct walk_dir *wd = ctx;
	struct walk *w = wd->w;
	char rel[CLI_FS_PATH], path[CLI_FS_PATH], target[CLI_FS_PATH];
	struct stat st;
	int rc;

	if (is_tmp_name(name)) {
		walk_stale(wd, name);
		return 0;
	}
	if (snprintf(rel, sizeof(rel), "%s%s%s", wd->rel, wd->rel[0] ? "/" : "", name) >=
	    (int)sizeof(rel))
		return -ENAMETOOLONG;
	if (ep_path(w->ep, rel, path))
		return -ENAMETOOLONG;
	rc = cli_fs_lstat(&w->ep->fs, path, &st);
	if (rc == -ENOENT)
		return 0; /* gone since the listing */
	if (!rc && S_ISLNK(st.st_mode))
		rc = cli_fs_readlink(&w->ep->fs, path, target, sizeof(target)) < 0 ? -EIO : 0;
	if (rc) {
		walk_fail(w, rel, rc);
		return 0;
	}
	return walk_add(wd, rel, &st, S_ISLNK(st.st_mode) ? target : NULL);
}

#define WALK_BATCH 256u

/*
 * Lists a Stoker folder by inode: its names a page at a time, their attributes in
 * one call per page (stk_ll_getattrs), where a path per entry would cost a lookup
 * per component and a stat.
 */
static int walk_list_stk(struct walk_dir *wd, uint64_t ino)
{
	struct walk *w = wd->w;
	stk_client *c = w->ep->fs.c;
	struct stk_ll_dirent *de = malloc(WALK_BATCH * sizeof(*de));
	struct stk_ll_attr *at = malloc(WALK_BATCH * sizeof(*at));
	uint64_t inos[WALK_BATCH], cookie = 0;
	int rcs[WALK_BATCH], eof = 0, rc = 0;
	char rel[CLI_FS_PATH], target[CLI_FS_PATH];

	if (!de || !at) {
		rc = -ENOMEM;
		goto out;
	}
	while (!rc && !eof) {
		uint32_t n = 0;
		rc = stk_ll_readdir(c, NULL, ino, cookie, WALK_BATCH, de, &n, &eof);
		if (rc || !n)
			break;
		cookie = de[n - 1].next_cookie;
		for (uint32_t i = 0; i < n; i++)
			inos[i] = de[i].ino;
		rc = stk_ll_getattrs(c, NULL, inos, n, at, rcs);
		if (rc == -ENOSYS) { /* an older meta: one by one */
			rc = 0;
			for (uint32_t i = 0; i < n; i++)
				rcs[i] = stk_ll_getattr(c, NULL, inos[i], &at[i]);
		}
		for (uint32_t i = 0; !rc && i < n; i++) {
			struct stat st;
			if (is_tmp_name(de[i].name)) {
				walk_stale(wd, de[i].name);
				continue;
			}
			if (snprintf(rel, sizeof(rel), "%s%s%s", wd->rel, wd->rel[0] ? "/" : "",
				     de[i].name) >= (int)sizeof(rel)) {
				rc = -ENAMETOOLONG;
				break;
			}
			if (rcs[i] == -ENOENT)
				continue; /* gone since the listing */
			if (!rcs[i] && S_ISLNK(at[i].mode))
				rcs[i] =
				    stk_ll_readlink(c, NULL, at[i].ino, target, sizeof(target));
			if (rcs[i]) {
				walk_fail(w, rel, rcs[i]);
				continue;
			}
			stk_ll_attr_to_stat(&at[i], &st);
			rc = walk_add(wd, rel, &st, S_ISLNK(st.st_mode) ? target : NULL);
		}
	}
out:
	free(de);
	free(at);
	return rc;
}

/* Lists one folder: its entries go to the list, its subfolders to the queue. */
static void walk_one(struct walk *w, const char *rel)
{
	struct walk_dir wd = {.w = w, .rel = rel};
	char path[CLI_FS_PATH];
	struct stat st;
	int rc;

	if (rel[0] ? ep_path(w->ep, rel, path)
		   : stk_strlcpy(path, w->ep->root[0] ? w->ep->root : "/", sizeof(path))) {
		walk_fail(w, rel, -ENAMETOOLONG);
		return;
	}
	rc = cli_fs_lstat(&w->ep->fs, path, &st);
	if (!rc && !S_ISDIR(st.st_mode))
		rc = -ENOTDIR; /* replaced since its folder was listed */
	if (!rc && w->ep->fs.c)
		rc = walk_list_stk(&wd, st.st_ino);
	else if (!rc)
		rc = cli_fs_list(&w->ep->fs, path, walk_entry, &wd);
	if (rc) {
		walk_fail(w, rel, rc);
		return;
	}
	if (!rel[0])
		return;
	struct ent e = {0};

	ent_from_stat(&e, &st);
	e.empty = wd.count == 0;
	e.rel = strdup(rel);
	if (!e.rel || ents_add(w->out, &e)) {
		free(e.rel);
		walk_fail(w, rel, -ENOMEM);
	}
}

static void *walk_thread(void *arg)
{
	struct walk *w = arg;

	pthread_mutex_lock(&w->lock);
	for (;;) {
		while (!w->qn && w->busy)
			pthread_cond_wait(&w->cond, &w->lock);
		if (!w->qn)
			break;
		char *rel = w->q[--w->qn];
		w->busy++;
		pthread_mutex_unlock(&w->lock);
		walk_one(w, rel);
		free(rel);
		pthread_mutex_lock(&w->lock);
		w->busy--;
		pthread_cond_broadcast(&w->cond);
	}
	pthread_cond_broadcast(&w->cond);
	pthread_mutex_unlock(&w->lock);
	return NULL;
}

/* Lists a local or Stoker tree into out with the run's threads. */
static int walk_tree(struct sync *sy, struct sync_ep *ep, struct ents *out, int is_src)
{
	struct walk w = {.sy = sy, .ep = ep, .out = out, .is_src = is_src};
	unsigned n = sy->o.threads;
	pthread_t *tids = calloc(n, sizeof(*tids));
	unsigned started = 0;
	int rc;

	if (!tids)
		return -ENOMEM;
	pthread_mutex_init(&w.lock, NULL);
	pthread_cond_init(&w.cond, NULL);
	rc = walk_push(&w, "");
	for (unsigned i = 0; !rc && i < n; i++) {
		if (pthread_create(&tids[i], NULL, walk_thread, &w))
			break;
		started++;
	}
	if (!started && !rc)
		walk_thread(&w);
	for (unsigned i = 0; i < started; i++)
		pthread_join(tids[i], NULL);
	free(tids);
	for (size_t i = 0; i < w.qn; i++)
		free(w.q[i]);
	free(w.q);
	pthread_cond_destroy(&w.cond);
	pthread_mutex_destroy(&w.lock);
	if (rc)
		return rc;
	if (w.err) {
		cli_err("sync", "cannot list %s: %s", ep->arg, stk_strerror(w.err));
		return w.err;
	}
	return 0;
}

/* ---- listing S3 ---- */

struct s3walk {
	struct sync *sy;
	struct sync_ep *ep;
	struct ents *out;
	int is_src;
};

/* Whether every segment of rel is a name: none empty, "." or "..". */
static int safe_rel(const char *rel)
{
	const char *p = rel;

	for (;;) {
		const char *slash = strchr(p, '/');
		size_t n = slash ? (size_t)(slash - p) : strlen(p);
		if (!n || (n == 1 && p[0] == '.') || (n == 2 && p[0] == '.' && p[1] == '.'))
			return 0;
		if (!slash)
			return 1;
		p = slash + 1;
	}
}

/* Whether some folder above rel is left out by a folder pattern. */
static int parents_kept(const struct sync_opts *o, const char *rel)
{
	char buf[CLI_FS_PATH];

	if (stk_strlcpy(buf, rel, sizeof(buf)))
		return 0;
	for (char *p = buf; (p = strchr(p, '/')); p++) {
		*p = 0;
		int k = kept(o, buf, 1);
		*p = '/';
		if (!k)
			return 0;
	}
	return 1;
}

static int s3_list_one(void *ctx, const struct cli_s3_obj *o)
{
	struct s3walk *w = ctx;
	size_t plen = strlen(w->ep->prefix);
	const char *rel = o->key + plen;
	size_t n = strlen(rel);
	struct ent e = {0};

	if (strncmp(o->key, w->ep->prefix, plen) != 0 || !n)
		return 0;
	e.type = rel[n - 1] == '/' ? ENT_DIR : ENT_FILE;
	e.rel = strndup(rel, e.type == ENT_DIR ? n - 1 : n);
	if (!e.rel)
		return -ENOMEM;
	if (!safe_rel(e.rel)) {
		/* S3 allows "a/../../b"; as a path it would leave the destination. */
		if (w->is_src)
			fail_add(w->sy, o->key,
				 "a key that is no safe path (empty, \".\" or \"..\" "
				 "segments): not copied");
		else
			w->sy->list_failed = 1; /* nothing is deleted beside what we cannot name */
		free(e.rel);
		return 0;
	}
	if (!e.rel[0] || !parents_kept(&w->sy->o, e.rel) ||
	    !kept(&w->sy->o, e.rel, e.type == ENT_DIR)) {
		free(e.rel);
		return 0;
	}
	e.size = e.type == ENT_FILE ? o->size : 0;
	e.mtime = o->mtime;
	e.mode = e.type == ENT_DIR ? S_IFDIR | 0755 : S_IFREG | 0644;
	e.uid = (uid_t)-1;
	e.gid = (gid_t)-1;
	memcpy(e.etag, o->etag, sizeof(e.etag));
	if (ents_add(w->out, &e)) {
		free(e.rel);
		return -ENOMEM;
	}
	return 0;
}

/*
 * Lists an S3 tree: objects are files, "a/b/" markers are (empty) folders, and
 * every folder a key implies becomes an entry too, so that a copy out of S3 makes
 * them and a --delete into S3 sees them.
 */
static int s3_list(struct sync *sy, struct sync_ep *ep, struct ents *out, int is_src)
{
	struct s3walk w = {.sy = sy, .ep = ep, .out = out, .is_src = is_src};
	struct cli_s3 *s3;
	size_t n0;
	int rc;

	rc = cli_s3_create(ep->s3c, &s3);
	if (rc)
		return rc;
	rc = cli_s3_head_bucket(s3, ep->bucket);
	if (!rc)
		rc = cli_s3_list(s3, ep->bucket, ep->prefix, s3_list_one, &w);
	if (rc) {
		cli_err("sync", "cannot list %s: %s", ep->arg, cli_s3_error(s3));
		goto out;
	}
	/* The folders keys imply: every parent of every entry, once. */
	n0 = out->n;
	for (size_t i = 0; i < n0; i++) {
		char *rel = out->v[i].rel;
		for (char *p = strchr(rel, '/'); p; p = strchr(p + 1, '/')) {
			struct ent e = {.type = ENT_DIR,
					.mode = S_IFDIR | 0755,
					.uid = (uid_t)-1,
					.gid = (gid_t)-1,
					.mtime = out->v[i].mtime};
			e.rel = strndup(rel, (size_t)(p - rel));
			if (!e.rel || ents_add(out, &e)) {
				free(e.rel);
				rc = -ENOMEM;
				goto out;
			}
		}
	}
	if (out->n > 1)
		qsort(out->v, out->n, sizeof(*out->v), cmp_ent);
	/* Drop repeated folders; a marker and an implied entry are one folder. */
	size_t k = 0;
	for (size_t i = 0; i < out->n; i++) {
		if (k && strcmp(out->v[k - 1].rel, out->v[i].rel) == 0 &&
		    out->v[i].type == ENT_DIR && out->v[k - 1].type == ENT_DIR) {
			free(out->v[i].rel);
			continue;
		}
		out->v[k++] = out->v[i];
	}
	out->n = k;
	/* A folder is empty when the next entry is not inside it. */
	for (size_t i = 0; i < out->n; i++) {
		size_t l = strlen(out->v[i].rel);
		if (out->v[i].type != ENT_DIR)
			continue;
		/* Entries inside rel sort after "rel" but maybe not right after it ("rel-x" <
		 * "rel/x"). */
		out->v[i].empty = 1;
		for (size_t j = i + 1; j < out->n && strncmp(out->v[j].rel, out->v[i].rel, l) == 0;
		     j++) {
			if (out->v[j].rel[l] == '/') {
				out->v[i].empty = 0;
				break;
			}
		}
	}
out:
	cli_s3_destroy(s3);
	return rc;
}

/* ---- the plan ---- */

static int job_add(struct sync *sy, enum job_kind kind, struct ent *s, struct ent *d, int compare)
{
	if (sy->njobs == sy->capjobs) {
		size_t cap = sy->capjobs ? sy->capjobs * 2 : 4096;
		struct job *v = realloc(sy->jobs, cap * sizeof(*v));
		if (!v)
			return -ENOMEM;
		sy->jobs = v;
		sy->capjobs = cap;
	}
	sy->jobs[sy->njobs++] = (struct job){.kind = kind, .s = s, .d = d, .compare = compare};
	return 0;
}

/* Whether a destination file is the source's, by size and mtime (S3: its age). */
static int same_file(const struct sync *sy, const struct ent *s, const struct ent *d)
{
	if (sy->o.update && d->mtime > s->mtime && sy->dst.kind != SYNC_S3)
		return 1; /* newer at the destination: left alone */
	if (s->size != d->size)
		return 0;
	if (sy->dst.kind == SYNC_S3)
		/* An object's time is when it was written, not the source's mtime. */
		return d->mtime >= s->mtime;
	return s->mtime == d->mtime;
}

/* Whether a destination's mode or owner differs where both sides keep them. */
static int attrs_differ(const struct sync *sy, const struct ent *s, const struct ent *d)
{
	if (sy->src.kind == SYNC_S3 || sy->dst.kind == SYNC_S3 || sy->o.no_perms)
		return 0;
	if ((s->mode & 07777) != (d->mode & 07777))
		return 1;
	return sy->euid0 && (s->uid != d->uid || s->gid != d->gid);
}

static int is_inside(const char *rel, const char *dir)
{
	size_t l = strlen(dir);

	return strncmp(rel, dir, l) == 0 && rel[l] == '/';
}

/*
 * Merges the sorted lists into jobs, in the order they run: deletions (the top
 * of each deleted subtree only), folders, files (big ones first, so that their
 * parts spread over the workers while small files fill the gaps), links, and
 * folder attributes.
 */
static int plan(struct sync *sy)
{
	struct ents *S = &sy->sents, *D = &sy->dents;
	size_t i = 0, j = 0;
	const char *deldir = NULL; /* the last folder deleted: its contents go with it */
	int rc = 0;

	if (S->n > 1)
		qsort(S->v, S->n, sizeof(*S->v), cmp_ent);
	if (D->n > 1)
		qsort(D->v, D->n, sizeof(*D->v), cmp_ent);
	while (!rc && (i < S->n || j < D->n)) {
		int c = i >= S->n ? 1 : j >= D->n ? -1 : strcmp(S->v[i].rel, D->v[j].rel);
		struct ent *s = c <= 0 ? &S->v[i] : NULL, *d = c >= 0 ? &D->v[j] : NULL;

		if (c <= 0)
			i++;
		if (c >= 0)
			j++;
		if (d && !s) {
			if (!sy->o.del || sy->list_failed || (deldir && is_inside(d->rel, deldir)))
				continue;
			if (!kept(&sy->o, d->rel, d->type == ENT_DIR))
				continue;
			if (d->type == ENT_DIR && sy->dst.kind != SYNC_S3)
				deldir = d->rel;
			if (mine(sy, d->rel))
				rc = job_add(sy, JOB_DEL, NULL, d, 0);
			continue;
		}
		if (d && s->type != d->type && !(sy->dst.kind == SYNC_S3 && s->type == ENT_DIR)) {
			if (!sy->o.del || sy->list_failed) {
				if (mine(sy, s->rel))
					fail_add(
					    sy, s->rel,
					    "is a %s at the destination (--delete replaces it)",
					    d->type == ENT_DIR	  ? "folder"
					    : d->type == ENT_LINK ? "link"
								  : "file");
				if (d->type == ENT_DIR)
					deldir = d->rel;
				continue;
			}
			if (d->type == ENT_DIR)
				deldir = d->rel;
			if (mine(sy, d->rel))
				rc = job_add(sy, JOB_DEL, NULL, d, 0);
			d = NULL;
			if (rc)
				break;
		}
		switch (s->type) {
		case ENT_DIR:
			if (sy->dst.kind == SYNC_S3) {
				if (s->empty && !d && mine(sy, s->rel))
					rc = job_add(sy, JOB_MARKER, s, NULL, 0);
			} else {
				rc = job_add(sy, JOB_MKDIR, s, d, 0);
			}
			break;
		case ENT_LINK:
			if (sy->dst.kind == SYNC_S3) {
				if (mine(sy, s->rel))
					atomic_fetch_add(&sy->skipped, 1);
				break;
			}
			if (d && d->link && strcmp(d->link, s->link) == 0)
				break;
			if (mine(sy, s->rel))
				rc = job_add(sy, JOB_LINK, s, d, 0);
			break;
		default:
			if (!mine(sy, s->rel))
				break;
			if (d && !sy->o.checksum && same_file(sy, s, d)) {
				if (attrs_differ(sy, s, d))
					rc = job_add(sy, JOB_ATTR, s, d, 0);
				else
					atomic_fetch_add(&sy->files_same, 1);
				break;
			}
			rc = job_add(sy, JOB_FILE, s, d, sy->o.checksum && d && d->size == s->size);
			sy->bytes_total += s->size;
			sy->files_total++;
			break;
		}
	}
	return rc;
}

static int job_order(const struct job *j, uint64_t part)
{
	switch (j->kind) {
	case JOB_DEL:
		return 0;
	case JOB_MKDIR:
		return 1;
	case JOB_FILE:
		return j->s->size > part ? 2 : 3;
	default:
		return 3;
	}
}

/*
 * Orders the jobs by class (deletions, folders, big files, the rest), keeping the
 * plan's path order inside each class: folders must come parents first. A
 * counting sort, stable by construction (qsort is not).
 */
static int order_jobs(struct sync *sy)
{
	size_t count[4] = {0}, at[4];
	struct job *v;

	if (sy->njobs < 2)
		return 0;
	v = malloc(sy->njobs * sizeof(*v));
	if (!v)
		return -ENOMEM;
	for (size_t i = 0; i < sy->njobs; i++)
		count[job_order(&sy->jobs[i], sy->o.part_size)]++;
	at[0] = 0;
	for (int c = 1; c < 4; c++)
		at[c] = at[c - 1] + count[c - 1];
	for (size_t i = 0; i < sy->njobs; i++)
		v[at[job_order(&sy->jobs[i], sy->o.part_size)]++] = sy->jobs[i];
	free(sy->jobs);
	sy->jobs = v;
	sy->capjobs = sy->njobs;
	return 0;
}

/* ---- copying ---- */

static int open_src(struct sync *sy, const struct ent *s, struct cli_file *f, struct stat *st)
{
	char path[CLI_FS_PATH];
	int rc = ep_path(&sy->src, s->rel, path);

	if (!rc)
		rc = cli_fs_open(&sy->src.fs, path, O_RDONLY, 0, f);
	if (!rc) {
		rc = cli_fs_fstat(f, st);
		if (rc)
			cli_fs_close(f);
	}
	return rc;
}

/* Whether a source file changed between two stats of it. */
static int changed(const struct stat *a, const struct stat *b)
{
	return a->st_size != b->st_size || a->st_mtim.tv_sec != b->st_mtim.tv_sec ||
	       a->st_mtim.tv_nsec != b->st_mtim.tv_nsec || a->st_ctim.tv_sec != b->st_ctim.tv_sec ||
	       a->st_ctim.tv_nsec != b->st_ctim.tv_nsec || a->st_ino != b->st_ino;
}

/*
 * Reads len bytes of the source at off into buf: a pread, or a ranged GET that
 * must still match the ETag the listing gave (else -EAGAIN: it changed).
 */
static int src_read(struct worker *wk, const struct ent *s, struct cli_file *f, void *buf,
		    size_t len, uint64_t off, char *why, size_t whylen)
{
	struct sync *sy = wk->sy;
	int rc;

	if (!len)
		return 0;
	if (sy->src.kind == SYNC_S3) {
		char key[CLI_FS_PATH];
		rc = ep_path(&sy->src, s->rel, key);
		if (!rc)
			rc = cli_s3_get(wk->s3src, sy->src.bucket, key, off, len,
					s->etag[0] ? s->etag : NULL, buf);
		if (rc)
			snprintf(why, whylen, "%s",
				 rc == -EAGAIN ? "changed while copied" : cli_s3_error(wk->s3src));
		return rc;
	}
	ssize_t n = cli_fs_pread(f, buf, len, off);
	if (n >= 0 && (size_t)n != len) {
		snprintf(why, whylen, "changed while copied (shorter than when listed)");
		return -EAGAIN;
	}
	if (n < 0)
		snprintf(why, whylen, "read: %s", stk_strerror((int)n));
	return n < 0 ? (int)n : 0;
}

/* The permissions a destination entry gets: the source's, or the defaults. */
static mode_t dst_mode(const struct sync *sy, const struct ent *s)
{
	if (sy->src.kind == SYNC_S3 || sy->o.no_perms)
		return (s->type == ENT_DIR ? 0777 : 0666) & ~g_umask;
	return s->mode & 07777;
}

/*
 * Gives a finished destination entry (path: a file's temporary name) the source's
 * attributes. have: what the entry has already (a stat of it), so that an owner
 * or mode already right costs no call; NULL when unknown.
 */
static int set_attrs(struct sync *sy, const char *path, const struct ent *s, int is_link,
		     const struct stat *have)
{
	struct timespec ts[2] = {{s->mtime, s->mtime_ns}, {s->mtime, s->mtime_ns}};
	int rc = 0;

	if (sy->euid0 && sy->src.kind != SYNC_S3 && !sy->o.no_perms &&
	    !(is_link && sy->dst.kind == SYNC_STK) &&
	    !(have && have->st_uid == s->uid && have->st_gid == s->gid))
		rc = cli_fs_lchown(&sy->dst.fs, path, s->uid, s->gid);
	if (!rc && !is_link) {
		mode_t m = dst_mode(sy, s);
		/* chown clears setuid and setgid: with those, the mode always follows it. */
		int same = have && (have->st_mode & 07777) == m && !(m & (S_ISUID | S_ISGID));
		if (!same)
			rc = cli_fs_chmod(&sy->dst.fs, path, m);
	}
	if (!rc && !(is_link && sy->dst.kind == SYNC_STK))
		rc = cli_fs_utimens(&sy->dst.fs, path, ts);
	return rc;
}

/* crc32c of a whole file on either side, for --checksum's comparison. */
static int file_crc(struct worker *wk, struct sync_ep *ep, struct cli_s3 *s3, const struct ent *e,
		    uint32_t *crc)
{
	char path[CLI_FS_PATH];
	struct cli_file f;
	uint64_t off = 0;
	int rc = ep_path(ep, e->rel, path);

	*crc = 0;
	if (rc)
		return rc;
	if (ep->kind != SYNC_S3) {
		rc = cli_fs_open(&ep->fs, path, O_RDONLY, 0, &f);
		if (rc)
			return rc;
	}
	while (!rc && off < e->size) {
		size_t n = e->size - off < SYNC_BUF ? (size_t)(e->size - off) : SYNC_BUF;
		if (ep->kind == SYNC_S3) {
			rc = cli_s3_get(s3, ep->bucket, path, off, n, NULL, wk->buf2);
		} else {
			ssize_t r = cli_fs_pread(&f, wk->buf2, n, off);
			rc = r < 0 ? (int)r : (size_t)r != n ? -EIO : 0;
		}
		if (!rc)
			*crc = stk_crc32c(*crc, wk->buf2, n);
		off += n;
	}
	if (ep->kind != SYNC_S3)
		cli_fs_close(&f);
	return rc;
}

/* Re-reads [off, off+len) of a written file (path) and compares its crc32c. */
static int verify_range(struct worker *wk, const char *path, uint64_t off, uint64_t len,
			uint32_t want)
{
	struct sync *sy = wk->sy;
	struct cli_file f;
	uint32_t crc = 0;
	int rc = cli_fs_open(&sy->dst.fs, path, O_RDONLY, 0, &f);

	while (!rc && len) {
		size_t n = len < SYNC_BUF ? (size_t)len : SYNC_BUF;
		ssize_t r = cli_fs_pread(&f, wk->buf2, n, off);
		rc = r < 0 ? (int)r : (size_t)r != n ? -EIO : 0;
		if (!rc)
			crc = stk_crc32c(crc, wk->buf2, n);
		off += n;
		len -= n;
	}
	if (f.sf || f.fd >= 0)
		cli_fs_close(&f);
	if (!rc && crc != want)
		rc = -EILSEQ;
	return rc;
}

static void md5(const void *p, size_t n, uint8_t out[16])
{
	unsigned len = 16;

	EVP_Digest(p, n, out, &len, EVP_md5(), NULL);
}

static void md5_hex_etag(const uint8_t d[16], char *out, const char *suffix)
{
	char hex[33];

	for (int i = 0; i < 16; i++)
		snprintf(hex + 2 * i, 3, "%02x", d[i]);
	snprintf(out, CLI_S3_ETAG, "\"%s%s\"", hex, suffix);
}

/*
 * copy_small into a Stoker folder whose inode is known (parent): the create, the
 * check of the size, the attributes and the rename are one call each by inode,
 * where paths would cost a lookup per component per call. Same contract.
 */
/*
 * After a copy of size bytes: -EAGAIN (why says so) if the source grew or changed
 * since before was taken, as its end or its middle was then not what was copied.
 */
static int src_unchanged(struct cli_file *in, uint64_t size, const struct stat *before, char *why,
			 size_t whylen)
{
	struct stat after;
	char extra;
	int rc;

	if (cli_fs_pread(in, &extra, 1, size) > 0) {
		snprintf(why, whylen, "changed while copied (grew)");
		return -EAGAIN;
	}
	rc = cli_fs_fstat(in, &after);
	if (!rc && changed(before, &after)) {
		snprintf(why, whylen, "changed while copied");
		rc = -EAGAIN;
	}
	return rc;
}

/* Where copy_body puts what it read: 0 or a negative errno. */
typedef int (*put_fn)(void *ctx, const void *buf, size_t n);

/*
 * Copies the source's bytes [0, size) through wk's buffer to put, adding them to
 * *crc and to the rate limit.
 */
static int copy_body(struct worker *wk, const struct ent *s, struct cli_file *in, uint64_t size,
		     put_fn put, void *ctx, uint32_t *crc, char *why, size_t whylen)
{
	for (uint64_t off = 0; off < size;) {
		size_t n = size - off < wk->buflen ? (size_t)(size - off) : wk->buflen;
		int rc = src_read(wk, s, in, wk->buf, n, off, why, whylen);

		if (rc)
			return rc;
		*crc = stk_crc32c(*crc, wk->buf, n);
		rc = put(ctx, wk->buf, n);
		if (rc) {
			snprintf(why, whylen, "write: %s", stk_strerror(rc));
			return rc;
		}
		throttle(wk->sy, n);
		off += n;
	}
	return 0;
}

static int put_stk(void *ctx, const void *buf, size_t n)
{
	ssize_t w = stk_write(ctx, buf, n);

	return w < 0 ? (int)w : 0;
}

static int put_local(void *ctx, const void *buf, size_t n)
{
	return cli_fs_write(ctx, buf, n);
}

static int copy_small_stk(struct worker *wk, const struct ent *s, uint64_t parent, char *why,
			  size_t whylen)
{
	struct sync *sy = wk->sy;
	stk_client *c = sy->dst.fs.c;
	const char *name = strrchr(s->rel, '/');
	char tmpname[64];
	struct cli_file in = {.fd = -1};
	struct stat before;
	struct stk_ll_attr a, v;
	stk_file *f = NULL;
	uint64_t size = s->size;
	uint32_t crc = 0, valid;
	int rc, created, have_in = 0, have_tmp = 0;

	name = name ? name + 1 : s->rel;
	snprintf(tmpname, sizeof(tmpname), SYNC_TMP_PREFIX "%016" PRIx64 SYNC_TMP_SUFFIX,
		 rel_hash(s->rel));
	if (sy->src.kind != SYNC_S3) {
		rc = open_src(sy, s, &in, &before);
		if (rc) {
			snprintf(why, whylen, "open: %s", stk_strerror(rc));
			return rc;
		}
		have_in = 1;
		size = (uint64_t)before.st_size;
	}
	/*
	 * Exclusive: a temporary file a killed run left is removed and made anew. An
	 * existing one is never opened, as opening by inode checks no permission (it
	 * could be another user's file, linked there).
	 */
	rc = stk_ll_create_open(c, NULL, parent, tmpname, (dst_mode(sy, s) & 0777) | S_IWUSR, 1, &a,
				&created, NULL);
	if (rc == -EEXIST) {
		rc = stk_ll_unlink(c, NULL, parent, tmpname);
		if (!rc)
			rc = stk_ll_create_open(c, NULL, parent, tmpname,
						(dst_mode(sy, s) & 0777) | S_IWUSR, 1, &a, &created,
						NULL);
	}
	if (!rc && !S_ISREG(a.mode)) {
		stk_ll_unregister(c, a.ino);
		rc = -EEXIST;
	}
	if (rc) {
		snprintf(why, whylen, "create: %s", stk_strerror(rc));
		goto out;
	}
	have_tmp = 1;
	rc = stk_ll_open_registered(c, NULL, &a, O_WRONLY | O_TRUNC, &f);
	if (rc) {
		f = NULL;
		snprintf(why, whylen, "open for writing: %s", stk_strerror(rc));
		goto out;
	}
	rc = copy_body(wk, s, &in, size, put_stk, f, &crc, why, whylen);
	if (!rc && have_in)
		rc = src_unchanged(&in, size, &before, why, whylen);
	if (rc)
		goto out;
	rc = stk_close(f);
	f = NULL;
	if (rc) {
		snprintf(why, whylen, "write: %s", stk_strerror(rc));
		goto out;
	}
	if (sy->o.checksum) {
		char tmp[CLI_FS_PATH];
		rc = tmp_path(&sy->dst, s->rel, tmp);
		if (!rc)
			rc = verify_range(wk, tmp, 0, size, crc);
		if (rc) {
			snprintf(why, whylen, "%s",
				 rc == -EILSEQ ? "checksum mismatch after copy" : stk_strerror(rc));
			goto out;
		}
	}
	/*
	 * The attributes in one call (two when a chown must come before setuid bits),
	 * compared with what the create gave; the call answers the attributes after
	 * it, from meta: the size is checked against those, not the handle's idea.
	 */
	memset(&v, 0, sizeof(v));
	v.mode = dst_mode(sy, s);
	v.uid = s->uid;
	v.gid = s->gid;
	v.mtime_sec = v.atime_sec = have_in ? before.st_mtim.tv_sec : s->mtime;
	v.mtime_nsec = v.atime_nsec = have_in ? (uint32_t)before.st_mtim.tv_nsec : s->mtime_ns;
	if (have_in && !sy->o.no_perms)
		v.mode = before.st_mode & 07777;
	valid = STK_LL_SETATTR_ATIME | STK_LL_SETATTR_MTIME;
	if ((a.mode & 07777) != v.mode)
		valid |= STK_LL_SETATTR_MODE;
	if (sy->euid0 && sy->src.kind != SYNC_S3 && !sy->o.no_perms &&
	    (a.uid != v.uid || a.gid != v.gid)) {
		rc = stk_ll_setattr(c, NULL, a.ino, STK_LL_SETATTR_UID | STK_LL_SETATTR_GID, &v,
				    NULL);
		if (v.mode & (S_ISUID | S_ISGID))
			valid |= STK_LL_SETATTR_MODE;
	}
	if (!rc)
		rc = stk_ll_setattr(c, NULL, a.ino, valid, &v, &a);
	if (rc) {
		snprintf(why, whylen, "attributes: %s", stk_strerror(rc));
		goto out;
	}
	if (a.size != size) {
		snprintf(why, whylen, "size mismatch after copy: %" PRIu64 " of %" PRIu64, a.size,
			 size);
		rc = -EIO;
		goto out;
	}
	rc = stk_ll_rename(c, NULL, parent, tmpname, parent, name, 0);
	if (rc)
		snprintf(why, whylen, "rename into place: %s", stk_strerror(rc));
	else
		have_tmp = 0;
out:
	if (f)
		stk_close(f);
	if (have_in)
		cli_fs_close(&in);
	if (rc && have_tmp)
		stk_ll_unlink(c, NULL, parent, tmpname);
	return rc;
}

/*
 * Creates a temporary file anew: one a killed run left is removed first, and the
 * create is exclusive, so that a link someone put under that name (to a file of
 * theirs, or a symbolic link anywhere) is never written through.
 */
static int create_tmp(struct sync *sy, const char *tmp, mode_t mode, struct cli_file *out)
{
	int rc = cli_fs_open(&sy->dst.fs, tmp, O_WRONLY | O_CREAT | O_EXCL, mode, out);

	if (rc == -EEXIST) {
		rc = cli_fs_unlink(&sy->dst.fs, tmp);
		if (!rc)
			rc = cli_fs_open(&sy->dst.fs, tmp, O_WRONLY | O_CREAT | O_EXCL, mode, out);
	}
	return rc;
}

/* Copies a file of at most one part: returns 0, or -errno with why filled. */
static int copy_small(struct worker *wk, const struct ent *s, char *why, size_t whylen)
{
	struct sync *sy = wk->sy;
	char tmp[CLI_FS_PATH] = "", key[CLI_FS_PATH];
	struct cli_file in = {.fd = -1}, out = {.fd = -1};
	struct stat before, after;
	uint64_t size = s->size;
	uint32_t crc = 0;
	int rc, have_in = 0, have_out = 0;

	if (sy->src.kind != SYNC_S3) {
		rc = open_src(sy, s, &in, &before);
		if (rc) {
			snprintf(why, whylen, "open: %s", stk_strerror(rc));
			return rc;
		}
		have_in = 1;
		size = (uint64_t)before.st_size;
		if (size > sy->o.part_size && sy->dst.kind == SYNC_S3) {
			snprintf(why, whylen, "changed while copied (grew past the part size)");
			rc = -EAGAIN;
			goto out;
		}
	}
	if (sy->dst.kind == SYNC_S3) {
		char etag[CLI_S3_ETAG], want[CLI_S3_ETAG];
		uint8_t d[16];

		rc = src_read(wk, s, &in, wk->buf, (size_t)size, 0, why, whylen);
		if (rc)
			goto out;
		if (have_in) {
			rc = cli_fs_fstat(&in, &after);
			if (!rc && changed(&before, &after)) {
				snprintf(why, whylen, "changed while copied");
				rc = -EAGAIN;
			}
			if (rc)
				goto out;
		}
		rc = ep_path(&sy->dst, s->rel, key);
		if (!rc)
			rc =
			    cli_s3_put(wk->s3dst, sy->dst.bucket, key, wk->buf, (size_t)size, etag);
		if (rc) {
			snprintf(why, whylen, "%s", cli_s3_error(wk->s3dst));
			goto out;
		}
		throttle(sy, size);
		if (sy->o.checksum) {
			md5(wk->buf, (size_t)size, d);
			md5_hex_etag(d, want, "");
			if (strcmp(want, etag) != 0) {
				snprintf(why, whylen,
					 "checksum mismatch: ETag %s, MD5 of the bytes sent %s",
					 etag, want);
				rc = -EILSEQ;
				goto out;
			}
		}
		struct cli_s3_obj o;
		rc = cli_s3_head(wk->s3dst, sy->dst.bucket, key, &o);
		if (!rc && o.size != size) {
			snprintf(why, whylen, "size mismatch after copy: %" PRIu64 " of %" PRIu64,
				 o.size, size);
			rc = -EIO;
		} else if (rc) {
			snprintf(why, whylen, "%s", cli_s3_error(wk->s3dst));
		}
		goto out;
	}
	rc = tmp_path(&sy->dst, s->rel, tmp);
	if (!rc)
		rc = create_tmp(sy, tmp, (dst_mode(sy, s) & 0777) | S_IWUSR, &out);
	if (rc) {
		snprintf(why, whylen, "create: %s", stk_strerror(rc));
		goto out;
	}
	have_out = 1;
	rc = copy_body(wk, s, &in, size, put_local, &out, &crc, why, whylen);
	if (!rc && have_in)
		rc = src_unchanged(&in, size, &before, why, whylen);
	if (rc)
		goto out;
	have_out = 0;
	rc = cli_fs_close(&out);
	if (rc) {
		snprintf(why, whylen, "write: %s", stk_strerror(rc));
		goto out;
	}
	struct stat dst;
	rc = cli_fs_lstat(&sy->dst.fs, tmp, &dst);
	if (!rc && (uint64_t)dst.st_size != size) {
		snprintf(why, whylen, "size mismatch after copy: %" PRIu64 " of %" PRIu64,
			 (uint64_t)dst.st_size, size);
		rc = -EIO;
		goto out;
	}
	if (!rc && sy->o.checksum) {
		rc = verify_range(wk, tmp, 0, size, crc);
		if (rc) {
			snprintf(why, whylen, "%s",
				 rc == -EILSEQ ? "checksum mismatch after copy" : stk_strerror(rc));
			goto out;
		}
	}
	struct ent t = *s;
	t.size = size;
	if (have_in) {
		/* The times of the bytes copied, which may be newer than the listing's. */
		t.mtime = before.st_mtim.tv_sec;
		t.mtime_ns = (uint32_t)before.st_mtim.tv_nsec;
		t.mode = before.st_mode;
	}
	if (!rc)
		rc = set_attrs(sy, tmp, &t, 0, &dst);
	if (rc) {
		snprintf(why, whylen, "attributes: %s", stk_strerror(rc));
		goto out;
	}
	rc = ep_path(&sy->dst, s->rel, key);
	if (!rc)
		rc = cli_fs_rename(&sy->dst.fs, tmp, key);
	if (rc)
		snprintf(why, whylen, "rename into place: %s", stk_strerror(rc));
out:
	if (have_out)
		cli_fs_close(&out);
	if (have_in)
		cli_fs_close(&in);
	if (rc && sy->dst.kind != SYNC_S3 && tmp[0])
		cli_fs_unlink(&sy->dst.fs, tmp);
	return rc;
}

static void big_fail(struct big *b, int rc, const char *why)
{
	pthread_mutex_lock(&b->lock);
	if (!atomic_load(&b->failed)) {
		snprintf(b->why, sizeof(b->why), "%s", why);
		atomic_store(&b->failed, rc ? rc : -EIO);
	}
	pthread_mutex_unlock(&b->lock);
}

/* Starts a big file: opens its source, makes its temporary file or upload. */
static int big_begin(struct worker *wk, struct big *b, char *why, size_t whylen)
{
	struct sync *sy = wk->sy;
	struct cli_file out;
	char key[CLI_FS_PATH];
	uint64_t size = b->s->size;
	int rc;

	if (sy->src.kind != SYNC_S3) {
		rc = open_src(sy, b->s, &b->src, &b->before);
		if (rc) {
			snprintf(why, whylen, "open: %s", stk_strerror(rc));
			return rc;
		}
		if ((uint64_t)b->before.st_size != size) {
			snprintf(why, whylen, "changed while copied (size changed since listed)");
			cli_fs_close(&b->src);
			return -EAGAIN;
		}
	}
	b->nparts = (unsigned)((size + sy->o.part_size - 1) / sy->o.part_size);
	b->crc = calloc(b->nparts, sizeof(*b->crc));
	if (!b->crc)
		goto nomem;
	if (sy->dst.kind == SYNC_S3) {
		b->etags = calloc(b->nparts, sizeof(*b->etags));
		b->md5 = calloc(b->nparts, sizeof(*b->md5));
		if (!b->etags || !b->md5)
			goto nomem;
		rc = ep_path(&sy->dst, b->s->rel, key);
		if (!rc)
			rc = cli_s3_mpu_create(wk->s3dst, sy->dst.bucket, key, b->upload_id,
					       sizeof(b->upload_id));
		if (rc) {
			snprintf(why, whylen, "%s", cli_s3_error(wk->s3dst));
			goto fail;
		}
	} else {
		rc = tmp_path(&sy->dst, b->s->rel, b->tmp);
		if (!rc)
			rc = create_tmp(sy, b->tmp, 0600, &out);
		if (rc) {
			snprintf(why, whylen, "create: %s", stk_strerror(rc));
			goto fail;
		}
		rc = cli_fs_close(&out);
		if (rc) {
			snprintf(why, whylen, "create: %s", stk_strerror(rc));
			goto fail;
		}
	}
	atomic_store(&b->parts_left, b->nparts);
	atomic_store(&b->next_part, 0);
	return 0;
nomem:
	rc = -ENOMEM;
	snprintf(why, whylen, "%s", stk_strerror(rc));
fail:
	if (sy->src.kind != SYNC_S3)
		cli_fs_close(&b->src);
	return rc;
}

/* Copies part p of a big file. Failures are recorded in b. */
static void big_part(struct worker *wk, struct big *b, unsigned p)
{
	struct sync *sy = wk->sy;
	uint64_t off = (uint64_t)p * sy->o.part_size;
	uint64_t len = b->s->size - off < sy->o.part_size ? b->s->size - off : sy->o.part_size;
	char why[256], key[CLI_FS_PATH];
	struct cli_file out;
	uint32_t crc = 0;
	int rc;

	if (atomic_load(&b->failed))
		return;
	if (sy->dst.kind == SYNC_S3) {
		rc = src_read(wk, b->s, &b->src, wk->buf, (size_t)len, off, why, sizeof(why));
		if (rc) {
			big_fail(b, rc, why);
			return;
		}
		md5(wk->buf, (size_t)len, b->md5[p]);
		rc = ep_path(&sy->dst, b->s->rel, key);
		if (!rc)
			rc = cli_s3_mpu_part(wk->s3dst, sy->dst.bucket, key, b->upload_id, p + 1,
					     wk->buf, (size_t)len, b->etags[p]);
		if (rc)
			big_fail(b, rc, cli_s3_error(wk->s3dst));
		else
			throttle(sy, len);
		return;
	}
	rc = cli_fs_open(&sy->dst.fs, b->tmp, O_WRONLY, 0, &out);
	if (rc) {
		snprintf(why, sizeof(why), "open for writing: %s", stk_strerror(rc));
		big_fail(b, rc, why);
		return;
	}
	while (len && !atomic_load(&b->failed)) {
		size_t n = len < wk->buflen ? (size_t)len : wk->buflen;
		rc = src_read(wk, b->s, &b->src, wk->buf, n, off, why, sizeof(why));
		if (rc)
			break;
		crc = stk_crc32c(crc, wk->buf, n);
		rc = cli_fs_pwrite(&out, wk->buf, n, off);
		if (rc) {
			snprintf(why, sizeof(why), "write: %s", stk_strerror(rc));
			break;
		}
		throttle(sy, n);
		off += n;
		len -= n;
	}
	int rc2 = cli_fs_close(&out);
	if (!rc && rc2) {
		rc = rc2;
		snprintf(why, sizeof(why), "write: %s", stk_strerror(rc));
	}
	if (rc)
		big_fail(b, rc, why);
	else
		b->crc[p] = crc;
}

/* The last part is done: check the source, verify, publish. */
static int big_finish(struct worker *wk, struct big *b, char *why, size_t whylen)
{
	struct sync *sy = wk->sy;
	char key[CLI_FS_PATH];
	int rc = atomic_load(&b->failed);

	if (rc)
		snprintf(why, whylen, "%s", b->why);
	if (!rc && sy->src.kind != SYNC_S3) {
		struct stat after;
		char extra;
		rc = cli_fs_fstat(&b->src, &after);
		if (!rc && (changed(&b->before, &after) ||
			    cli_fs_pread(&b->src, &extra, 1, b->s->size) > 0)) {
			snprintf(why, whylen, "changed while copied");
			rc = -EAGAIN;
		} else if (rc) {
			snprintf(why, whylen, "stat: %s", stk_strerror(rc));
		}
	}
	if (sy->src.kind != SYNC_S3)
		cli_fs_close(&b->src);
	rc = rc ? rc : ep_path(&sy->dst, b->s->rel, key);
	if (sy->dst.kind == SYNC_S3) {
		char etag[CLI_S3_ETAG];
		struct cli_s3_obj o;
		if (rc) {
			cli_s3_mpu_abort(wk->s3dst, sy->dst.bucket, key, b->upload_id);
			return rc;
		}
		rc = cli_s3_mpu_complete(wk->s3dst, sy->dst.bucket, key, b->upload_id, b->nparts,
					 b->etags, etag);
		if (rc) {
			snprintf(why, whylen, "%s", cli_s3_error(wk->s3dst));
			cli_s3_mpu_abort(wk->s3dst, sy->dst.bucket, key, b->upload_id);
			return rc;
		}
		if (sy->o.checksum) {
			/* S3's multipart ETag: the MD5 of the parts' MD5s, and their count. */
			uint8_t d[16];
			char want[CLI_S3_ETAG], suffix[16];
			md5(b->md5, (size_t)b->nparts * 16, d);
			snprintf(suffix, sizeof(suffix), "-%u", b->nparts);
			md5_hex_etag(d, want, suffix);
			if (strcmp(want, etag) != 0) {
				snprintf(why, whylen, "checksum mismatch: ETag %s, expected %s",
					 etag, want);
				return -EILSEQ;
			}
		}
		rc = cli_s3_head(wk->s3dst, sy->dst.bucket, key, &o);
		if (rc)
			snprintf(why, whylen, "%s", cli_s3_error(wk->s3dst));
		else if (o.size != b->s->size) {
			snprintf(why, whylen, "size mismatch after copy: %" PRIu64 " of %" PRIu64,
				 o.size, b->s->size);
			rc = -EIO;
		}
		return rc;
	}
	struct stat st;
	if (!rc) {
		rc = cli_fs_lstat(&sy->dst.fs, b->tmp, &st);
		if (rc)
			snprintf(why, whylen, "stat: %s", stk_strerror(rc));
		else if ((uint64_t)st.st_size != b->s->size) {
			snprintf(why, whylen, "size mismatch after copy: %" PRIu64 " of %" PRIu64,
				 (uint64_t)st.st_size, b->s->size);
			rc = -EIO;
		}
	}
	for (unsigned p = 0; !rc && sy->o.checksum && p < b->nparts; p++) {
		uint64_t off = (uint64_t)p * sy->o.part_size;
		uint64_t len =
		    b->s->size - off < sy->o.part_size ? b->s->size - off : sy->o.part_size;
		rc = verify_range(wk, b->tmp, off, len, b->crc[p]);
		if (rc)
			snprintf(why, whylen, "%s",
				 rc == -EILSEQ ? "checksum mismatch after copy" : stk_strerror(rc));
	}
	if (!rc) {
		struct ent t = *b->s;
		if (sy->src.kind != SYNC_S3) {
			t.mtime = b->before.st_mtim.tv_sec;
			t.mtime_ns = (uint32_t)b->before.st_mtim.tv_nsec;
			t.mode = b->before.st_mode;
		}
		rc = set_attrs(sy, b->tmp, &t, 0, &st);
		if (rc)
			snprintf(why, whylen, "attributes: %s", stk_strerror(rc));
	}
	if (!rc) {
		rc = cli_fs_rename(&sy->dst.fs, b->tmp, key);
		if (rc)
			snprintf(why, whylen, "rename into place: %s", stk_strerror(rc));
	}
	if (rc)
		cli_fs_unlink(&sy->dst.fs, b->tmp);
	return rc;
}

static void big_free(struct big *b)
{
	free(b->crc);
	free(b->etags);
	free(b->md5);
	pthread_mutex_destroy(&b->lock);
	free(b);
}

/* Runs a part of some big file if one is waiting: 1 if it did, 0 if none was. */
static int run_part(struct worker *wk)
{
	struct sync *sy = wk->sy;
	struct big *b;
	unsigned p;

	pthread_mutex_lock(&sy->active_lock);
	b = sy->active;
	if (!b) {
		pthread_mutex_unlock(&sy->active_lock);
		return 0;
	}
	p = atomic_fetch_add(&b->next_part, 1);
	if (p + 1 >= b->nparts)
		sy->active = b->next_active; /* handed out its last part */
	pthread_mutex_unlock(&sy->active_lock);
	big_part(wk, b, p);
	if (atomic_fetch_sub(&b->parts_left, 1) == 1) {
		char why[512];
		int rc = big_finish(wk, b, why, sizeof(why));
		if (rc)
			fail_add(sy, b->s->rel, "%s", why);
		else
			atomic_fetch_add(&sy->files_done, 1);
		big_free(b);
	}
	return 1;
}

/* A big file: begin it, then put its parts where every worker finds them. */
static void start_big(struct worker *wk, struct ent *s)
{
	struct sync *sy = wk->sy;
	struct big *b = calloc(1, sizeof(*b));
	char why[512];
	int rc;

	if (!b) {
		fail_add(sy, s->rel, "%s", stk_strerror(-ENOMEM));
		return;
	}
	b->s = s;
	pthread_mutex_init(&b->lock, NULL);
	rc = big_begin(wk, b, why, sizeof(why));
	if (rc) {
		fail_add(sy, s->rel, "%s", why);
		big_free(b);
		return;
	}
	pthread_mutex_lock(&sy->active_lock);
	b->next_active = sy->active;
	sy->active = b;
	pthread_cond_broadcast(&sy->active_cond);
	pthread_mutex_unlock(&sy->active_lock);
}

static void do_link(struct worker *wk, struct job *j)
{
	struct sync *sy = wk->sy;
	char path[CLI_FS_PATH], tmp[CLI_FS_PATH];
	int rc = ep_path(&sy->dst, j->s->rel, path);

	if (!rc)
		rc = tmp_path(&sy->dst, j->s->rel, tmp);
	if (!rc) {
		cli_fs_unlink(&sy->dst.fs, tmp);
		rc = cli_fs_symlink(&sy->dst.fs, j->s->link, tmp);
	}
	if (!rc)
		rc = set_attrs(sy, tmp, j->s, 1, NULL);
	if (!rc)
		rc = cli_fs_rename(&sy->dst.fs, tmp, path);
	if (rc) {
		fail_add(sy, j->s->rel, "link: %s", stk_strerror(rc));
		cli_fs_unlink(&sy->dst.fs, tmp);
	} else {
		atomic_fetch_add(&sy->links_made, 1);
	}
}

struct name_list {
	char **v;
	size_t n, cap;
	int err;
};

static int collect_name(void *ctx, const char *name, int is_dir)
{
	struct name_list *l = ctx;
	char *p;

	if (l->n == l->cap) {
		size_t cap = l->cap ? l->cap * 2 : 64;
		char **v = realloc(l->v, cap * sizeof(*v));
		if (!v)
			return -ENOMEM;
		l->v = v;
		l->cap = cap;
	}
	/* The first byte says whether it is a folder. */
	p = malloc(strlen(name) + 2);
	if (!p)
		return -ENOMEM;
	p[0] = is_dir ? 'd' : 'f';
	memcpy(p + 1, name, strlen(name) + 1);
	l->v[l->n++] = p;
	return 0;
}

/* Removes a destination entry, a folder with everything in it. */
static int remove_tree(struct sync *sy, const char *path, int is_dir)
{
	struct name_list l = {0};
	char sub[CLI_FS_PATH];
	int rc;

	if (!is_dir) {
		rc = cli_fs_unlink(&sy->dst.fs, path);
		return rc == -ENOENT ? 0 : rc;
	}
	/* The names first: removing while listing could skip entries. */
	rc = cli_fs_list(&sy->dst.fs, path, collect_name, &l);
	for (size_t i = 0; !rc && i < l.n; i++) {
		if (snprintf(sub, sizeof(sub), "%s/%s", path, l.v[i] + 1) >= (int)sizeof(sub))
			rc = -ENAMETOOLONG;
		else
			rc = remove_tree(sy, sub, l.v[i][0] == 'd');
	}
	for (size_t i = 0; i < l.n; i++)
		free(l.v[i]);
	free(l.v);
	if (!rc)
		rc = cli_fs_rmdir(&sy->dst.fs, path);
	return rc == -ENOENT ? 0 : rc;
}

static void do_delete(struct worker *wk, struct job *j)
{
	struct sync *sy = wk->sy;
	char path[CLI_FS_PATH];
	int rc = ep_path(&sy->dst, j->d->rel, path);

	if (rc)
		goto out;
	if (sy->dst.kind == SYNC_S3) {
		if (j->d->type == ENT_DIR) {
			/* Only a marker object is a folder of its own; a "/" ends its key. */
			if (!j->d->empty)
				return;
			if (stk_strlcpy(path + strlen(path), "/", sizeof(path) - strlen(path)))
				rc = -ENAMETOOLONG;
		}
		if (!rc) {
			rc = cli_s3_delete(wk->s3dst, sy->dst.bucket, path);
			if (rc == -ENOENT)
				rc = 0;
			if (rc) {
				fail_add(sy, j->d->rel, "delete: %s", cli_s3_error(wk->s3dst));
				return;
			}
		}
	} else {
		rc = remove_tree(sy, path, j->d->type == ENT_DIR);
	}
out:
	if (rc)
		fail_add(sy, j->d->rel, "delete: %s", stk_strerror(rc));
	else
		atomic_fetch_add(&sy->deleted, 1);
}

static void do_marker(struct worker *wk, struct job *j)
{
	struct sync *sy = wk->sy;
	char key[CLI_FS_PATH], etag[CLI_S3_ETAG];
	int n = snprintf(key, sizeof(key), "%s%s/", sy->dst.prefix, j->s->rel);

	if (n < 0 || n >= (int)sizeof(key)) {
		fail_add(sy, j->s->rel, "%s", stk_strerror(-ENAMETOOLONG));
		return;
	}
	if (cli_s3_put(wk->s3dst, sy->dst.bucket, key, "", 0, etag))
		fail_add(sy, j->s->rel, "folder marker: %s", cli_s3_error(wk->s3dst));
	else
		atomic_fetch_add(&sy->dirs_made, 1);
}

static void do_attr(struct worker *wk, struct job *j)
{
	struct sync *sy = wk->sy;
	char path[CLI_FS_PATH];
	int rc;

	if (sy->dst.kind == SYNC_S3)
		return; /* an object's time is its upload's */
	rc = ep_path(&sy->dst, j->s->rel, path);

	if (!rc)
		rc = set_attrs(sy, path, j->s, 0, NULL);
	if (rc)
		fail_add(sy, j->s->rel, "attributes: %s", stk_strerror(rc));
	else if (j->kind == JOB_ATTR)
		atomic_fetch_add(&sy->attrs_fixed, 1);
}

static void do_file(struct worker *wk, struct job *j)
{
	struct sync *sy = wk->sy;
	char why[512];
	int rc;

	if (j->compare) {
		uint32_t a, b;
		rc = file_crc(wk, &sy->src, wk->s3src, j->s, &a);
		if (!rc)
			rc = file_crc(wk, &sy->dst, wk->s3dst, j->d, &b);
		if (!rc && a == b) {
			if (attrs_differ(sy, j->s, j->d) || j->s->mtime != j->d->mtime)
				do_attr(wk, j);
			atomic_fetch_add(&sy->files_same, 1);
			atomic_fetch_add(&sy->files_checked, 1);
			atomic_fetch_add(&sy->bytes_checked, j->s->size);
			atomic_fetch_add(&sy->bytes_done, j->s->size);
			return;
		}
	}
	if (j->s->size > sy->o.part_size) {
		start_big(wk, j->s);
		return;
	}
	uint64_t parent = sy->dst.kind == SYNC_STK ? parent_ino(sy, j->s->rel) : 0;

	if (parent)
		rc = copy_small_stk(wk, j->s, parent, why, sizeof(why));
	else
		rc = copy_small(wk, j->s, why, sizeof(why));
	if (rc)
		fail_add(sy, j->s->rel, "%s", why);
	else
		atomic_fetch_add(&sy->files_done, 1);
}

static void run_job(struct worker *wk, struct job *j)
{
	switch (j->kind) {
	case JOB_DEL:
		do_delete(wk, j);
		break;
	case JOB_FILE:
		do_file(wk, j);
		break;
	case JOB_LINK:
		do_link(wk, j);
		break;
	case JOB_MARKER:
		do_marker(wk, j);
		break;
	case JOB_ATTR:
	case JOB_MKDIR:
		do_attr(wk, j);
		break;
	}
}

/*
 * A worker: parts of big files first (so that a started file finishes soon and
 * its memory goes), then the phase's next job, until neither is left.
 */
static void *worker_main(void *arg)
{
	struct worker *wk = arg;
	struct sync *sy = wk->sy;

	for (;;) {
		if (run_part(wk))
			continue;
		/* Counted before the fetch: a job taken is always seen as running. */
		atomic_fetch_add(&sy->running, 1);
		size_t i = atomic_fetch_add(&sy->next_job, 1);
		if (i < sy->job_end) {
			run_job(wk, &sy->jobs[i]);
			atomic_fetch_sub(&sy->running, 1);
			continue;
		}
		atomic_fetch_sub(&sy->running, 1);
		/*
		 * No job left. A job still running may be a big file about to hand out
		 * its parts (the last job may be the only file): wait for those rather
		 * than leave one worker to copy them all.
		 */
		pthread_mutex_lock(&sy->active_lock);
		while (!sy->active && atomic_load(&sy->running)) {
			struct timespec ts;
			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_nsec += 5000000;
			ts.tv_sec += ts.tv_nsec / 1000000000;
			ts.tv_nsec %= 1000000000;
			pthread_cond_timedwait(&sy->active_cond, &sy->active_lock, &ts);
		}
		int more = sy->active != NULL;
		pthread_mutex_unlock(&sy->active_lock);
		if (!more)
			break;
	}
	return NULL;
}

static int worker_init(struct sync *sy, struct worker *wk)
{
	int s3 = sy->src.kind == SYNC_S3 || sy->dst.kind == SYNC_S3;

	wk->sy = sy;
	wk->buflen = s3 && sy->o.part_size > SYNC_BUF ? (size_t)sy->o.part_size : SYNC_BUF;
	wk->buf = malloc(wk->buflen);
	wk->buf2 = malloc(SYNC_BUF);
	if (!wk->buf || !wk->buf2)
		return -ENOMEM;
	if (sy->src.kind == SYNC_S3 && cli_s3_create(sy->src.s3c, &wk->s3src))
		return -ENOMEM;
	if (sy->dst.kind == SYNC_S3 && cli_s3_create(sy->dst.s3c, &wk->s3dst))
		return -ENOMEM;
	return 0;
}

static void worker_fini(struct worker *wk)
{
	free(wk->buf);
	free(wk->buf2);
	if (wk->s3src)
		cli_s3_destroy(wk->s3src);
	if (wk->s3dst)
		cli_s3_destroy(wk->s3dst);
}

/* ---- progress and the summary ---- */

static void fmt_dur(double s, char *buf, size_t len)
{
	unsigned long t = s < 0 ? 0 : (unsigned long)(s + 0.5);

	snprintf(buf, len, "%lu:%02lu:%02lu", t / 3600, t / 60 % 60, t % 60);
}

/* One line of progress: files, bytes, rate and the time left. */
static void progress_line(struct sync *sy, int tty, int last)
{
	double el = (double)(stk_now_ns() - sy->t0) / 1e9;
	uint64_t done = atomic_load(&sy->bytes_done);
	uint64_t files = atomic_load(&sy->files_done) + atomic_load(&sy->files_checked);
	double rate = el > 0 ? (double)done / el : 0;
	char b1[32], b2[32], b3[32], eta[32];

	stk_format_size(done, b1, sizeof(b1));
	stk_format_size(sy->bytes_total, b2, sizeof(b2));
	stk_format_size((uint64_t)rate, b3, sizeof(b3));
	if (rate > 0 && sy->bytes_total > done)
		fmt_dur((double)(sy->bytes_total - done) / rate, eta, sizeof(eta));
	else
		snprintf(eta, sizeof(eta), "%s", last ? "0:00:00" : "-");
	char rank[32] = "";

	if (sy->o.ranks > 1)
		snprintf(rank, sizeof(rank), "rank %u: ", sy->o.rank);
	fprintf(stderr, "%s%s%" PRIu64 "/%" PRIu64 " files  %s/%s  %s/s  ETA %s  %zu failed%s",
		tty ? "\r\033[K" : "", rank, files, sy->files_total, b1, b2, b3, eta, sy->nfails,
		tty && !last ? "" : "\n");
	fflush(stderr);
}

struct progress {
	struct sync *sy;
	int tty;
	int stop;
	pthread_mutex_t lock;
	pthread_cond_t cond;
};

static void *progress_main(void *arg)
{
	struct progress *p = arg;
	double every = p->tty ? 0.5 : 5.0, next = now_s() + every;

	pthread_mutex_lock(&p->lock);
	while (!p->stop) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += (long)(every * 1e9);
		ts.tv_sec += ts.tv_nsec / 1000000000;
		ts.tv_nsec %= 1000000000;
		pthread_cond_timedwait(&p->cond, &p->lock, &ts);
		if (p->stop || now_s() < next)
			continue;
		next += every;
		progress_line(p->sy, p->tty, 0);
	}
	pthread_mutex_unlock(&p->lock);
	return NULL;
}

static void summary(struct sync *sy, double el)
{
	uint64_t bytes = atomic_load(&sy->bytes_done) - atomic_load(&sy->bytes_checked);
	char b[32], r[32], rank[32] = "";

	if (sy->o.ranks > 1)
		snprintf(rank, sizeof(rank), "rank %u/%u: ", sy->o.rank, sy->o.ranks);
	if (sy->o.json) {
		printf("{\"source\": ");
		cli_json_str(stdout, sy->src.arg);
		printf(", \"destination\": ");
		cli_json_str(stdout, sy->dst.arg);
		printf(", \"dry_run\": %s, \"rank\": %u, \"ranks\": %u, \"files_copied\": %" PRIu64
		       ", \"bytes_copied\": %" PRIu64 ", \"files_same\": %" PRIu64
		       ", \"dirs_made\": %" PRIu64 ", \"links_made\": %" PRIu64
		       ", \"deleted\": %" PRIu64 ", \"attrs_fixed\": %" PRIu64
		       ", \"skipped\": %" PRIu64 ", \"files_planned\": %" PRIu64
		       ", \"bytes_planned\": %" PRIu64 ", \"seconds\": %.3f, \"failed\": [",
		       sy->o.dry_run ? "true" : "false", sy->o.rank, sy->o.ranks,
		       (uint64_t)atomic_load(&sy->files_done), sy->o.dry_run ? 0 : bytes,
		       (uint64_t)atomic_load(&sy->files_same),
		       (uint64_t)atomic_load(&sy->dirs_made),
		       (uint64_t)atomic_load(&sy->links_made), (uint64_t)atomic_load(&sy->deleted),
		       (uint64_t)atomic_load(&sy->attrs_fixed), (uint64_t)atomic_load(&sy->skipped),
		       sy->files_total, sy->bytes_total, el);
		for (size_t i = 0; i < sy->nfails; i++) {
			printf("%s{\"path\": ", i ? ", " : "");
			cli_json_str(stdout, sy->fails[i].rel);
			printf(", \"error\": ");
			cli_json_str(stdout, sy->fails[i].why);
			printf("}");
		}
		printf("]}\n");
	} else if (sy->o.dry_run) {
		stk_format_size(sy->bytes_total, b, sizeof(b));
		printf("%sdry run: would copy %" PRIu64 " files (%s), delete %" PRIu64
		       ", fix attributes of %" PRIu64 "; %" PRIu64 " files already the same\n",
		       rank, sy->files_total, b, (uint64_t)atomic_load(&sy->deleted),
		       (uint64_t)atomic_load(&sy->attrs_fixed),
		       (uint64_t)atomic_load(&sy->files_same));
	} else {
		stk_format_size(bytes, b, sizeof(b));
		stk_format_size(el > 0 ? (uint64_t)((double)bytes / el) : 0, r, sizeof(r));
		printf("%scopied %" PRIu64 " files (%s) in %.1f s (%s/s); %" PRIu64
		       " already the same; %" PRIu64 " folders and %" PRIu64 " links made; %" PRIu64
		       " deleted; %" PRIu64 " attributes fixed; %" PRIu64 " skipped; %zu failed\n",
		       rank, (uint64_t)atomic_load(&sy->files_done), b, el, r,
		       (uint64_t)atomic_load(&sy->files_same),
		       (uint64_t)atomic_load(&sy->dirs_made),
		       (uint64_t)atomic_load(&sy->links_made), (uint64_t)atomic_load(&sy->deleted),
		       (uint64_t)atomic_load(&sy->attrs_fixed), (uint64_t)atomic_load(&sy->skipped),
		       sy->nfails);
	}
	fflush(stdout);
	if (sy->nfails) {
		fprintf(stderr, "stoker sync: %sfailed:\n", rank);
		for (size_t i = 0; i < sy->nfails; i++) {
			if (i == SYNC_MAX_FAILS_SHOWN && !sy->o.json) {
				fprintf(stderr, "  ... and %zu more\n", sy->nfails - i);
				break;
			}
			fprintf(stderr, "  %s: %s\n", sy->fails[i].rel, sy->fails[i].why);
		}
	}
}

/* Prints what a dry run would do, one line each, in the plan's order. */
static void dry_run(struct sync *sy)
{
	for (size_t i = 0; i < sy->njobs; i++) {
		struct job *j = &sy->jobs[i];
		switch (j->kind) {
		case JOB_DEL:
			printf("delete %s%s\n", j->d->rel, j->d->type == ENT_DIR ? "/" : "");
			atomic_fetch_add(&sy->deleted, 1);
			break;
		case JOB_MKDIR:
			if (!j->d)
				printf("mkdir %s/\n", j->s->rel);
			break;
		case JOB_MARKER:
			printf("mkdir %s/\n", j->s->rel);
			break;
		case JOB_FILE:
			printf("copy %s (%" PRIu64 " bytes)%s\n", j->s->rel, j->s->size,
			       j->compare ? " if its bytes differ" : "");
			break;
		case JOB_LINK:
			printf("link %s -> %s\n", j->s->rel, j->s->link);
			break;
		case JOB_ATTR:
			printf("attributes %s\n", j->s->rel);
			atomic_fetch_add(&sy->attrs_fixed, 1);
			break;
		}
	}
}

/* Runs jobs [from, to) on the workers; parts of big files they start run too. */
static void run_phase(struct sync *sy, struct worker *wks, size_t from, size_t to)
{
	unsigned started = 0;

	atomic_store(&sy->next_job, from);
	sy->job_end = to;
	for (unsigned i = 1; i < sy->o.threads; i++) {
		if (pthread_create(&wks[i].tid, NULL, worker_main, &wks[i]))
			break;
		started++;
	}
	worker_main(&wks[0]);
	for (unsigned i = 1; i <= started; i++)
		pthread_join(wks[i].tid, NULL);
}

/* Makes the folders, parents first (the jobs are in path order). */
static void make_dirs(struct sync *sy, size_t from, size_t to)
{
	stk_client *c = sy->dst.kind == SYNC_STK ? sy->dst.fs.c : NULL;
	char path[CLI_FS_PATH];
	struct stk_ll_attr a;

	/* Stoker: the top folder's inode, then each folder's as it is made or found. */
	if (c && stk_ll_resolve(c, sy->dst.root[0] ? sy->dst.root : "/", 1, &a) == 0 &&
	    S_ISDIR(a.mode))
		dirmap_put(&sy->dirs, "", 0, a.ino);
	for (size_t i = from; i < to; i++) {
		struct job *j = &sy->jobs[i];
		const char *rel = j->s->rel, *slash = strrchr(rel, '/');
		uint64_t parent = c ? parent_ino(sy, rel) : 0;
		int rc;

		if (j->d) {
			if (c && j->d->type == ENT_DIR && j->d->ino)
				dirmap_put(&sy->dirs, rel, strlen(rel), j->d->ino);
			continue;
		}
		if (parent) {
			const char *name = slash ? slash + 1 : rel;
			rc = stk_ll_mkdir(c, NULL, parent, name, 0700, &a);
			if (rc == -EEXIST && stk_ll_lookup(c, NULL, parent, name, &a) == 0 &&
			    S_ISDIR(a.mode))
				rc = -EEXIST; /* made by another rank: fine */
			else if (rc == -EEXIST)
				a.ino = 0;
			if ((!rc || rc == -EEXIST) && a.ino)
				dirmap_put(&sy->dirs, rel, strlen(rel), a.ino);
		} else {
			rc = ep_path(&sy->dst, rel, path);
			if (!rc)
				rc = cli_fs_mkdir(&sy->dst.fs, path, 0700);
		}
		if (rc && rc != -EEXIST) {
			fail_add(sy, rel, "mkdir: %s", stk_strerror(rc));
			j->failed = 1;
		} else if (mine(sy, rel)) {
			atomic_fetch_add(&sy->dirs_made, 1);
		}
	}
}

/* ---- the command ---- */

static int parse_ep(struct sync *sy, struct sync_ep *ep, const char *arg, struct cli_s3_conf *s3c,
		    int is_src)
{
	const struct stk_client_opts opts = {.size = sizeof(opts),
					     .conns_per_node = sy->o.threads > 8 ? 4 : 2};
	int rc;

	ep->arg = arg;
	if (strncmp(arg, "s3://", 5) == 0) {
		const char *b = arg + 5, *slash = strchr(b, '/');
		size_t bl = slash ? (size_t)(slash - b) : strlen(b);
		ep->kind = SYNC_S3;
		ep->s3c = s3c;
		if (!bl || bl >= sizeof(ep->bucket)) {
			cli_err("sync", "%s: malformed S3 address (s3://BUCKET[/PREFIX])", arg);
			return -EINVAL;
		}
		memcpy(ep->bucket, b, bl);
		ep->bucket[bl] = 0;
		const char *pre = slash ? slash + 1 : "";
		size_t pl = strlen(pre);
		while (pl && pre[pl - 1] == '/')
			pl--;
		if (pl + 2 > sizeof(ep->prefix)) {
			cli_err("sync", "%s: prefix too long", arg);
			return -ENAMETOOLONG;
		}
		memcpy(ep->prefix, pre, pl);
		if (pl)
			ep->prefix[pl++] = '/';
		ep->prefix[pl] = 0;
		return 0;
	}
	rc = cli_fs_resolve_opts("sync", arg, &opts, &ep->fs, ep->root);
	if (rc)
		return rc;
	ep->kind = ep->fs.c ? SYNC_STK : SYNC_LOCAL;
	size_t l = strlen(ep->root);
	while (l > 1 && ep->root[l - 1] == '/')
		ep->root[--l] = 0;
	if (!l)
		return -EINVAL;
	struct stat st;
	rc = cli_fs_stat(&ep->fs, ep->root, &st);
	if (rc == -ENOENT && !is_src)
		return 0; /* made before the copy */
	if (rc) {
		cli_err("sync", "%s: %s", arg, stk_strerror(rc));
		return rc;
	}
	if (!S_ISDIR(st.st_mode)) {
		cli_err("sync", "%s: %s", arg, stk_strerror(-ENOTDIR));
		return -ENOTDIR;
	}
	if (ep->root[0] == '/' && ep->root[1] == 0)
		ep->root[0] = 0; /* so that root + "/" + rel is "/rel" */
	return 0;
}

static const struct option sync_longopts[] = {
    {"threads", required_argument, NULL, 't'},
    {"part-size", required_argument, NULL, 'p'},
    {"delete", no_argument, NULL, 'D'},
    {"dry-run", no_argument, NULL, 'n'},
    {"checksum", no_argument, NULL, 'c'},
    {"update", no_argument, NULL, 'u'},
    {"include", required_argument, NULL, 'I'},
    {"exclude", required_argument, NULL, 'X'},
    {"endpoint", required_argument, NULL, 'e'},
    {"profile", required_argument, NULL, 'P'},
    {"json", no_argument, NULL, 'j'},
    {"no-progress", no_argument, NULL, 'q'},
    {"no-perms", no_argument, NULL, 'N'},
    {"bwlimit", required_argument, NULL, 'b'},
    {"mpi", no_argument, NULL, 'M'},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

/* The rank and size mpirun (Open MPI, or an MPICH/PMI launcher) gave this process. */
static int mpi_env(unsigned *rank, unsigned *ranks)
{
	static const char *const names[][2] = {
	    {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
	    {"PMI_RANK", "PMI_SIZE"},
	    {"PMIX_RANK", "OMPI_UNIVERSE_SIZE"},
	};

	for (size_t i = 0; i < STK_ARRAY_SIZE(names); i++) {
		const char *r = getenv(names[i][0]), *s = getenv(names[i][1]);
		uint64_t a, b;
		if (!r || !s || stk_parse_u64(r, &a) || stk_parse_u64(s, &b) || !b || a >= b ||
		    b > 65536)
			continue;
		*rank = (unsigned)a;
		*ranks = (unsigned)b;
		return 0;
	}
	return -ENOENT;
}

int cmd_sync(int argc, char **argv)
{
	struct sync *sy = calloc(1, sizeof(*sy));
	struct cli_s3_conf s3c;
	const char *endpoint = NULL, *profile = NULL;
	struct worker *wks = NULL;
	struct progress prog = {0};
	pthread_t ptid;
	int want_mpi = 0, have_s3 = 0, prog_started = 0, rc = 2, c;
	uint64_t v;

	if (!sy) {
		cli_err("sync", "%s", stk_strerror(-ENOMEM));
		return 1;
	}
	g_umask = umask(0);
	umask(g_umask);
	sy->o.threads = SYNC_THREADS_DEFAULT;
	sy->o.part_size = SYNC_PART_DEFAULT;
	sy->o.progress = 1;
	sy->o.ranks = 1;
	sy->euid0 = geteuid() == 0;
	pthread_mutex_init(&sy->sents.lock, NULL);
	pthread_mutex_init(&sy->dents.lock, NULL);
	pthread_mutex_init(&sy->fail_lock, NULL);
	pthread_mutex_init(&sy->active_lock, NULL);
	pthread_cond_init(&sy->active_cond, NULL);
	optind = 1;
	while ((c = getopt_long(argc, argv, "nuch", sync_longopts, NULL)) != -1) {
		switch (c) {
		case 't':
			if (stk_parse_u64(optarg, &v) || !v || v > 1024)
				goto usage;
			sy->o.threads = (unsigned)v;
			break;
		case 'p':
			if (stk_parse_size(optarg, &v) || v < (1u << 20) || v > (5ull << 30)) {
				cli_err("sync", "--part-size: 1M to 5G");
				goto usage;
			}
			sy->o.part_size = v;
			break;
		case 'b':
			if (stk_parse_size(optarg, &v) || !v)
				goto usage;
			sy->o.bwlimit = v;
			break;
		case 'D':
			sy->o.del = 1;
			break;
		case 'n':
			sy->o.dry_run = 1;
			break;
		case 'c':
			sy->o.checksum = 1;
			break;
		case 'u':
			sy->o.update = 1;
			break;
		case 'I':
		case 'X': {
			struct filter *f;
			size_t l = strlen(optarg);
			if (sy->o.nfilters == SYNC_MAX_FILTERS || !l) {
				cli_err("sync", "at most %d non-empty patterns", SYNC_MAX_FILTERS);
				goto usage;
			}
			f = &sy->o.filters[sy->o.nfilters++];
			f->include = c == 'I';
			f->dir_only = optarg[l - 1] == '/';
			if (f->dir_only)
				optarg[l - 1] = 0;
			f->anchored = strchr(optarg, '/') != NULL;
			f->pat = optarg;
			break;
		}
		case 'e':
			endpoint = optarg;
			break;
		case 'P':
			profile = optarg;
			break;
		case 'j':
			sy->o.json = 1;
			break;
		case 'q':
			sy->o.progress = 0;
			break;
		case 'N':
			sy->o.no_perms = 1;
			break;
		case 'M':
			want_mpi = 1;
			break;
		default:
			goto usage;
		}
	}
	if (argc - optind != 2)
		goto usage;
	rc = 1;
	if (mpi_env(&sy->o.rank, &sy->o.ranks) == 0) {
		want_mpi = 1;
	} else if (want_mpi) {
		cli_err("sync", "--mpi: no rank in the environment (run it under mpirun)");
		goto out;
	}
	have_s3 =
	    strncmp(argv[optind], "s3://", 5) == 0 || strncmp(argv[optind + 1], "s3://", 5) == 0;
	if (have_s3) {
		char err[256];
		if (cli_s3_conf_load(endpoint, profile, &s3c, err, sizeof(err))) {
			cli_err("sync", "%s", err);
			goto out;
		}
	}
	if (parse_ep(sy, &sy->src, argv[optind], &s3c, 1) ||
	    parse_ep(sy, &sy->dst, argv[optind + 1], &s3c, 0))
		goto out;
	/* S3 keeps no owners, modes or links: only sizes and times compare. */
	if (sy->src.kind == SYNC_S3 || sy->dst.kind == SYNC_S3)
		sy->o.no_perms = 1;

	/* list */
	rc = sy->src.kind == SYNC_S3 ? s3_list(sy, &sy->src, &sy->sents, 1)
				     : walk_tree(sy, &sy->src, &sy->sents, 1);
	if (!rc) {
		struct stat st;
		if (sy->dst.kind == SYNC_S3)
			rc = s3_list(sy, &sy->dst, &sy->dents, 0);
		else if (cli_fs_stat(&sy->dst.fs, sy->dst.root[0] ? sy->dst.root : "/", &st) == 0)
			rc = walk_tree(sy, &sy->dst, &sy->dents, 0);
	}
	if (rc) {
		rc = 1;
		goto out;
	}
	rc = 1; /* from here on, a failure unless the run ends well */
	if (sy->dst.kind == SYNC_S3) {
		/* S3 takes at most 10,000 parts: a bigger file gets bigger parts. */
		for (size_t i = 0; i < sy->sents.n; i++) {
			uint64_t need = (sy->sents.v[i].size + 9999) / 10000;
			if (need > sy->o.part_size)
				sy->o.part_size =
				    (need + (1u << 20) - 1) & ~(uint64_t)((1u << 20) - 1);
		}
	}

	/* plan */
	if (plan(sy)) {
		cli_err("sync", "%s", stk_strerror(-ENOMEM));
		goto out;
	}
	if (order_jobs(sy)) {
		cli_err("sync", "%s", stk_strerror(-ENOMEM));
		goto out;
	}
	sy->t0 = stk_now_ns();
	if (sy->o.dry_run) {
		if (!sy->o.json)
			dry_run(sy);
		else
			for (size_t i = 0; i < sy->njobs; i++)
				if (sy->jobs[i].kind == JOB_DEL)
					atomic_fetch_add(&sy->deleted, 1);
		summary(sy, 0);
		rc = sy->nfails ? 1 : 0;
		goto out;
	}

	/* copy */
	if (sy->dst.kind != SYNC_S3 && sy->dst.root[0]) {
		rc = cli_fs_mkdirs(&sy->dst.fs, sy->dst.root);
		if (rc) {
			cli_err("sync", "cannot make %s: %s", sy->dst.arg, stk_strerror(rc));
			rc = 1;
			goto out;
		}
	}
	wks = calloc(sy->o.threads, sizeof(*wks));
	if (!wks)
		goto nomem;
	for (unsigned i = 0; i < sy->o.threads; i++)
		if (worker_init(sy, &wks[i]))
			goto nomem;
	prog.sy = sy;
	prog.tty = isatty(2);
	pthread_mutex_init(&prog.lock, NULL);
	pthread_cond_init(&prog.cond, NULL);
	if (sy->o.progress && (prog.tty || !sy->o.json))
		prog_started = pthread_create(&ptid, NULL, progress_main, &prog) == 0;

	size_t a = 0, b;
	for (b = a; b < sy->njobs && sy->jobs[b].kind == JOB_DEL; b++)
		;
	run_phase(sy, wks, a, b);
	for (a = b; b < sy->njobs && sy->jobs[b].kind == JOB_MKDIR; b++)
		;
	make_dirs(sy, a, b);
	run_phase(sy, wks, b, sy->njobs);
	/* Folders' attributes last, children before parents (reverse path order). */
	int touched = atomic_load(&sy->files_done) || atomic_load(&sy->links_made) ||
		      atomic_load(&sy->deleted) || atomic_load(&sy->dirs_made);
	for (size_t i = b; i-- > a;) {
		struct job *j = &sy->jobs[i];
		if (mine(sy, j->s->rel) && !j->failed &&
		    (touched || !j->d || attrs_differ(sy, j->s, j->d) ||
		     j->s->mtime != j->d->mtime))
			do_attr(&wks[0], j);
	}
	/* Temporary files of earlier runs that this one did not reuse. */
	for (size_t i = 0; i < sy->nstale; i++) {
		const char *name = strrchr(sy->stale[i], '/');
		uint64_t h = strtoull(name + 1 + strlen(SYNC_TMP_PREFIX), NULL, 16);
		if (sy->o.ranks <= 1 || h % sy->o.ranks == sy->o.rank)
			cli_fs_unlink(&sy->dst.fs, sy->stale[i]);
	}
	if (prog_started) {
		pthread_mutex_lock(&prog.lock);
		prog.stop = 1;
		pthread_cond_signal(&prog.cond);
		pthread_mutex_unlock(&prog.lock);
		pthread_join(ptid, NULL);
		progress_line(sy, prog.tty, 1);
	}
	summary(sy, (double)(stk_now_ns() - sy->t0) / 1e9);
	rc = sy->nfails ? 1 : 0;
	goto out;
usage:
	rc = cli_usage("sync");
	goto out;
nomem:
	cli_err("sync", "%s", stk_strerror(-ENOMEM));
	rc = 1;
out:
	if (wks) {
		for (unsigned i = 0; i < sy->o.threads; i++)
			worker_fini(&wks[i]);
		free(wks);
	}
	ents_free(&sy->sents);
	ents_free(&sy->dents);
	for (size_t i = 0; i < sy->nstale; i++)
		free(sy->stale[i]);
	free(sy->stale);
	for (size_t i = 0; i < sy->nfails; i++) {
		free(sy->fails[i].rel);
		free(sy->fails[i].why);
	}
	free(sy->fails);
	free(sy->jobs);
	dirmap_free(&sy->dirs);
	if (sy->src.kind != SYNC_S3)
		cli_fs_release(&sy->src.fs);
	if (sy->dst.kind != SYNC_S3)
		cli_fs_release(&sy->dst.fs);
	free(sy);
	return rc;
}
