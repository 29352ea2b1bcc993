/*
 * How S3 buckets and objects are files: the store half of the gateway.
 *
 * Everything here works by inode through the client's inode-level calls
 * (stoker_ll.h) rather than by path: a key is walked once, segment by
 * segment, from the bucket's directory, and the directory inodes found on the way
 * are reused (for the record in .stoker-meta, for renames, for pruning), which
 * saves a metadata round trip per segment per step compared with the path API.
 *
 * Atomicity comes from rename. An object is written to a temporary file in
 * BUCKET/.stoker-upload, closed (close is durable in libstoker), given its record
 * as an extended attribute, and renamed over its key: a reader opens the old file
 * with its record or the new one with its own, never a half-written one nor one
 * file with the other's record. A file replaced or deleted while a GET of this
 * gateway still reads it keeps its data until that GET ends (the open table);
 * rename_keep / unlink_keep leave the data to us for that reason.
 *
 * A record is trusted only while the inode, size and mtime it names match the
 * file; anything else (a file rewritten through the mount) gets the fallback
 * ETag. Objects written by older gateways have their record as a symlink target
 * at .stoker-meta/KEY instead; it is read when the file has no attribute.
 *
 * Deleting a bucket moves its hidden folders out of it and removes the bucket
 * folder before destroying them, so a PUT that lands meanwhile makes the delete
 * fail with everything intact instead of losing uploads in flight.
 *
 * Listing walks folders and sorts each one's entries the way S3 sorts keys: a
 * folder "a" sorts as "a/", which makes a depth-first walk produce keys in byte
 * order. Whole subtrees are skipped when they lie before the start key, outside
 * the prefix, or inside a common prefix already returned.
 */
#include "s3.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "../common/log.h"
#include "../common/util.h"

#define STK_S3_READDIR_BATCH 256
#define STK_S3_COMMIT_TRIES 4 /* a commit races a delete pruning the key's folders */

/* ---- small helpers ---- */

void stk_s3_random_hex(char *out, size_t nbytes)
{
	uint8_t b[64];

	if (nbytes > sizeof(b))
		nbytes = sizeof(b);
	if (RAND_bytes(b, (int)nbytes) != 1) {
		/* OpenSSL's generator does not fail once seeded; fall back to the clock
		 * only so that names stay distinct, never for secrets */
		uint64_t t = (uint64_t)time(NULL) ^ (uint64_t)clock();
		for (size_t i = 0; i < nbytes; i++)
			b[i] = (uint8_t)(t >> (8 * (i % 8))) ^ (uint8_t)i;
	}
	stk_s3_hex(b, nbytes, out);
}

/* Who this thread's namespace calls act as (s3.h, stk_s3_store_as): NULL, the gateway. */
static __thread const struct stk_ll_cred *as_cred;

void stk_s3_store_as(const struct stk_ll_cred *cred)
{
	as_cred = cred;
}

static int lookup(struct stk_s3_gw *gw, uint64_t parent, const char *name, struct stk_ll_attr *a)
{
	return stk_ll_lookup(gw->c, as_cred, parent, name, a);
}

/* Looks a directory up, making it when missing; -ENOTDIR if a non-folder is there. */
static int ensure_dir(struct stk_s3_gw *gw, uint64_t parent, const char *name, struct stk_ll_attr *out)
{
	int rc = lookup(gw, parent, name, out);

	if (rc == -ENOENT) {
		rc = stk_ll_mkdir(gw->c, as_cred, parent, name, 0755, out);
		if (rc == -EEXIST)
			rc = lookup(gw, parent, name, out);
	}
	if (!rc && !S_ISDIR(out->mode))
		rc = -ENOTDIR;
	return rc;
}

/* Copies segment [p, p+n) into name (STK_LL_NAME_MAX + 1); -EINVAL for "", ".", "..". */
static int segment(const char *p, size_t n, char *name)
{
	if (n == 0 || n > STK_LL_NAME_MAX || (n == 1 && p[0] == '.') ||
	    (n == 2 && p[0] == '.' && p[1] == '.'))
		return -EINVAL;
	memcpy(name, p, n);
	name[n] = 0;
	return 0;
}

/*
 * Walks the folders of key from dir: all segments but the last (or all of them
 * when the key ends in '/', leaving *last ""). With create, missing folders are
 * made. *parent is the last folder reached. Depth is bounded by the key length
 * (at most 512 segments).
 */
static int walk_parent(struct stk_s3_gw *gw, const struct stk_ll_attr *dir, const char *key,
		       int create, struct stk_ll_attr *parent, char *last)
{
	const char *p = key;
	struct stk_ll_attr cur = *dir;
	char name[STK_LL_NAME_MAX + 1];
	int rc;

	last[0] = 0;
	for (;;) {
		const char *slash = strchr(p, '/');
		size_t n = slash ? (size_t)(slash - p) : strlen(p);

		if (!slash) {
			if (n && segment(p, n, last))
				return -EINVAL;
			break;
		}
		if (segment(p, n, name))
			return -EINVAL;
		if (create) {
			rc = ensure_dir(gw, cur.ino, name, &cur);
		} else {
			struct stk_ll_attr next;
			rc = lookup(gw, cur.ino, name, &next);
			if (!rc && !S_ISDIR(next.mode))
				rc = -ENOTDIR;
			if (!rc)
				cur = next;
		}
		if (rc)
			return rc;
		p = slash + 1;
	}
	*parent = cur;
	return 0;
}

void stk_s3_fallback_etag(const struct stk_ll_attr *a, char *out, size_t len)
{
	char s[96];
	uint8_t md[EVP_MAX_MD_SIZE];
	unsigned mdlen = 0;
	char hex[2 * EVP_MAX_MD_SIZE + 1];
	int n = snprintf(s, sizeof(s), "%llu:%llu:%lld:%u", (unsigned long long)a->ino,
			 (unsigned long long)a->size, (long long)a->mtime_sec, a->mtime_nsec);

	EVP_Digest(s, (size_t)n, md, &mdlen, EVP_md5(), NULL);
	stk_s3_hex(md, mdlen, hex);
	snprintf(out, len, "\"%s-1\"", hex);
}

static int record_matches(const struct stk_s3_record *r, const struct stk_ll_attr *a)
{
	return r->ino == a->ino && r->size == a->size && r->mtime_sec == a->mtime_sec &&
	       r->mtime_nsec == a->mtime_nsec;
}

static int read_record_at(struct stk_s3_gw *gw, uint64_t dir, const char *name,
			  struct stk_s3_record *r)
{
	struct stk_ll_attr a;
	char buf[STK_S3_RECORD_MAX + 1];
	int rc;

	rc = lookup(gw, dir, name, &a);
	if (rc)
		return rc;
	if (!S_ISLNK(a.mode))
		return -ENOENT;
	rc = stk_ll_readlink(gw->c, as_cred, a.ino, buf, sizeof(buf));
	if (rc)
		return rc;
	return stk_s3_record_decode(buf, strlen(buf), r);
}

/*
 * The record kept in the file's own extended attribute STK_S3_XATTR. Set on the
 * temporary file before the rename that publishes it, so the bytes and their
 * record appear (and are replaced) together. -ENODATA when the file has none.
 */
static int xattr_record_get(struct stk_s3_gw *gw, uint64_t ino, struct stk_s3_record *r)
{
	char buf[STK_S3_RECORD_MAX + 1];
	long n = stk_ll_getxattr(gw->c, as_cred, ino, STK_S3_XATTR, buf, sizeof(buf) - 1);

	if (n == -ERANGE)
		return -EINVAL; /* longer than any record we write: not ours */
	if (n < 0)
		return (int)n;
	buf[n] = 0;
	return stk_s3_record_decode(buf, (size_t)n, r);
}

static int xattr_record_set(struct stk_s3_gw *gw, uint64_t ino, const struct stk_s3_record *r)
{
	char buf[STK_S3_RECORD_MAX + 1];
	int n = stk_s3_record_encode(r, buf, sizeof(buf));

	if (n < 0)
		return n;
	return stk_ll_setxattr(gw->c, as_cred, ino, STK_S3_XATTR, buf, (size_t)n, 0);
}

/* ---- the bucket cache ---- */

static unsigned bcache_slot(const char *name)
{
	unsigned h = 2166136261u;

	for (; *name; name++)
		h = (h ^ (unsigned char)*name) * 16777619u;
	return h % STK_S3_BCACHE_SLOTS;
}

static int bcache_get(struct stk_s3_gw *gw, const char *name, uint64_t *ino)
{
	struct stk_s3_bcache_ent *e = &gw->bcache.e[bcache_slot(name)];
	int hit;

	pthread_mutex_lock(&gw->bcache.lock);
	hit = e->ino && strcmp(e->name, name) == 0 && e->expires_ns > stk_now_ns();
	if (hit)
		*ino = e->ino;
	pthread_mutex_unlock(&gw->bcache.lock);
	return hit;
}

static void bcache_put(struct stk_s3_gw *gw, const char *name, uint64_t ino)
{
	struct stk_s3_bcache_ent *e = &gw->bcache.e[bcache_slot(name)];

	pthread_mutex_lock(&gw->bcache.lock);
	memset(e, 0, sizeof(*e));
	snprintf(e->name, sizeof(e->name), "%s", name);
	e->ino = ino;
	e->expires_ns = stk_now_ns() + STK_S3_BCACHE_TTL_MS * 1000000ull;
	pthread_mutex_unlock(&gw->bcache.lock);
}

static void bcache_forget(struct stk_s3_gw *gw, const char *name)
{
	struct stk_s3_bcache_ent *e = &gw->bcache.e[bcache_slot(name)];

	pthread_mutex_lock(&gw->bcache.lock);
	if (strcmp(e->name, name) == 0)
		memset(e, 0, sizeof(*e));
	pthread_mutex_unlock(&gw->bcache.lock);
}

/* A hidden folder's inode from the cache, by the bucket's inode; 0 if unknown. */
static uint64_t bcache_dir(struct stk_s3_gw *gw, uint64_t bucket, int which, uint64_t set)
{
	uint64_t now = stk_now_ns(), ino = 0;

	pthread_mutex_lock(&gw->bcache.lock);
	for (unsigned i = 0; i < STK_S3_BCACHE_SLOTS; i++) {
		struct stk_s3_bcache_ent *e = &gw->bcache.e[i];
		if (e->ino != bucket || e->expires_ns <= now)
			continue;
		if (set)
			e->dirs[which] = set;
		ino = e->dirs[which];
		break;
	}
	pthread_mutex_unlock(&gw->bcache.lock);
	return ino;
}

/*
 * The bucket's .stoker-upload or .stoker-meta folder: from the cache, else looked
 * up, and made when create is set. -ENOENT when missing and not to be made.
 */
static int hidden_dir(struct stk_s3_gw *gw, const struct stk_ll_attr *bucket, int which, int create,
		      struct stk_ll_attr *out)
{
	static const char *const names[STK_S3_DIR_COUNT] = {STK_S3_UPLOAD_DIR, STK_S3_META_DIR};
	uint64_t ino = bcache_dir(gw, bucket->ino, which, 0);
	int rc;

	if (ino) {
		memset(out, 0, sizeof(*out));
		out->ino = ino;
		out->mode = S_IFDIR | 0755;
		return 0;
	}
	if (create)
		rc = ensure_dir(gw, bucket->ino, names[which], out);
	else {
		rc = lookup(gw, bucket->ino, names[which], out);
		if (!rc && !S_ISDIR(out->mode))
			rc = -ENOENT;
	}
	if (!rc)
		bcache_dir(gw, bucket->ino, which, out->ino);
	return rc;
}

/* ---- buckets ---- */

int stk_s3_bucket_lookup(struct stk_s3_gw *gw, const char *bucket, struct stk_ll_attr *out)
{
	uint64_t ino;
	int rc;

	if (stk_s3_bucket_check(bucket))
		return -ENOENT;
	if (bcache_get(gw, bucket, &ino)) {
		/* callers use the inode and the type; the rest is not kept */
		memset(out, 0, sizeof(*out));
		out->ino = ino;
		out->mode = S_IFDIR | 0755;
		return 0;
	}
	rc = lookup(gw, gw->root_ino, bucket, out);
	if (!rc && !S_ISDIR(out->mode))
		rc = -ENOENT;
	if (!rc)
		bcache_put(gw, bucket, out->ino);
	return rc;
}

/*
 * A bucket is made in the gateway's root folder as the gateway, then given to the
 * user whose request made it (when its key names ids), so that what the user
 * stores in it is the user's and other users' requests meet its permissions.
 */
int stk_s3_bucket_create(struct stk_s3_gw *gw, const char *bucket)
{
	struct stk_ll_attr a, owner;
	int rc;

	if (stk_s3_bucket_check(bucket))
		return -EINVAL;
	rc = stk_ll_mkdir(gw->c, NULL, gw->root_ino, bucket, 0755, &a);
	if (rc || !as_cred)
		return rc;
	memset(&owner, 0, sizeof(owner));
	owner.uid = as_cred->uid;
	owner.gid = as_cred->gid;
	rc = stk_ll_setattr(gw->c, NULL, a.ino, STK_LL_SETATTR_UID | STK_LL_SETATTR_GID, &owner,
			    NULL);
	if (rc) {
		stk_warn("s3: bucket %s: cannot give it to uid %u gid %u (%s): removed; the "
			 "gateway must run as root to give buckets to users",
			 bucket, owner.uid, owner.gid, strerror(-rc));
		stk_ll_rmdir(gw->c, NULL, gw->root_ino, bucket);
	}
	return rc;
}

struct dent {
	char *name;
	size_t len;
	uint64_t ino;
	uint32_t mode;
	int dir;
};

static void dents_free(struct dent *d, unsigned n)
{
	for (unsigned i = 0; i < n; i++)
		free(d[i].name);
	free(d);
}

/* The byte at i of the entry's name as a key sorts it: folders end in '/'. */
static int sort_ch(const struct dent *d, size_t i)
{
	if (i < d->len)
		return (unsigned char)d->name[i];
	if (i == d->len && d->dir)
		return '/';
	return -1;
}

static int cmp_dent(const void *x, const void *y)
{
	const struct dent *a = x, *b = y;

	for (size_t i = 0;; i++) {
		int ca = sort_ch(a, i), cb = sort_ch(b, i);
		if (ca != cb)
			return ca < cb ? -1 : 1;
		if (ca < 0)
			return 0;
	}
}

static int reserved_name(const char *name)
{
	return strncmp(name, STK_S3_RESERVED, strlen(STK_S3_RESERVED)) == 0;
}

/*
 * Reads a whole directory. all: every entry; otherwise regular files and folders
 * only, and without the gateway's hidden folders when hide is set. Sorted as keys.
 */
static int read_dir(struct stk_s3_gw *gw, uint64_t ino, int all, int hide, struct dent **out,
		    unsigned *nout)
{
	struct stk_ll_dirent *ents;
	struct dent *d = NULL;
	unsigned n = 0, cap = 0;
	uint64_t cookie = 0;
	int eof = 0, rc = 0;

	ents = calloc(STK_S3_READDIR_BATCH, sizeof(*ents));
	if (!ents)
		return -ENOMEM;
	while (!eof) {
		uint32_t k = 0;
		rc =
		    stk_ll_readdir(gw->c, as_cred, ino, cookie, STK_S3_READDIR_BATCH, ents, &k, &eof);
		if (rc)
			goto out;
		for (uint32_t i = 0; i < k; i++) {
			const struct stk_ll_dirent *e = &ents[i];
			if (!all && !S_ISREG(e->mode) && !S_ISDIR(e->mode))
				continue;
			if (hide && reserved_name(e->name))
				continue;
			if (n == cap) {
				unsigned nc = cap ? cap * 2 : 64;
				struct dent *nd = realloc(d, nc * sizeof(*nd));
				if (!nd) {
					rc = -ENOMEM;
					goto out;
				}
				d = nd;
				cap = nc;
			}
			d[n].name = strdup(e->name);
			if (!d[n].name) {
				rc = -ENOMEM;
				goto out;
			}
			d[n].len = strlen(e->name);
			d[n].ino = e->ino;
			d[n].mode = e->mode;
			d[n].dir = S_ISDIR(e->mode);
			n++;
		}
		if (k)
			cookie = ents[k - 1].next_cookie;
		else
			break;
	}
	if (n > 1)
		qsort(d, n, sizeof(*d), cmp_dent);
out:
	free(ents);
	if (rc) {
		dents_free(d, n);
		return rc;
	}
	*out = d;
	*nout = n;
	return 0;
}

/* rm -r of parent/name, which the gateway owns (a hidden folder, an upload). */
static int rm_rf(struct stk_s3_gw *gw, uint64_t parent, const char *name, int depth)
{
	struct stk_ll_attr a;
	struct dent *d;
	unsigned n;
	int rc;

	rc = lookup(gw, parent, name, &a);
	if (rc)
		return rc == -ENOENT ? 0 : rc;
	if (!S_ISDIR(a.mode))
		return stk_ll_unlink(gw->c, as_cred, parent, name);
	if (depth > 600)
		return -ELOOP;
	rc = read_dir(gw, a.ino, 1, 0, &d, &n);
	if (rc)
		return rc;
	for (unsigned i = 0; i < n && !rc; i++)
		rc = rm_rf(gw, a.ino, d[i].name, depth + 1);
	dents_free(d, n);
	if (!rc)
		rc = stk_ll_rmdir(gw->c, as_cred, parent, name);
	return rc == -ENOENT ? 0 : rc;
}

/*
 * Moves every entry of folder src into folder dst (by name); used to put a
 * bucket's hidden folders back when its delete fails. Nothing in dst is replaced:
 * what is there was made meanwhile (a PUT that landed remade .stoker-meta and
 * wrote its record) and is newer. A folder whose name dst already has is merged
 * into it the same way, one level down, and removed once emptied; what still
 * collides stays in src.
 */
static void move_entries(struct stk_s3_gw *gw, uint64_t src, uint64_t dst, int depth)
{
	struct dent *d;
	unsigned n;

	if (read_dir(gw, src, 1, 0, &d, &n))
		return;
	for (unsigned i = 0; i < n; i++) {
		struct stk_ll_attr there;
		int rc = stk_ll_rename(gw->c, as_cred, src, d[i].name, dst, d[i].name,
				       STK_LL_RENAME_NOREPLACE);
		if ((rc == -ENOTEMPTY || rc == -EEXIST) && d[i].dir && depth < 2 &&
		    lookup(gw, dst, d[i].name, &there) == 0 && S_ISDIR(there.mode)) {
			move_entries(gw, d[i].ino, there.ino, depth + 1);
			(void)stk_ll_rmdir(gw->c, as_cred, src, d[i].name);
		}
	}
	dents_free(d, n);
}

/*
 * The bucket's hidden folders (temporary files of PUTs in flight, multipart
 * uploads, old records) go with it, but nothing may be destroyed before the
 * bucket is known to be empty: a PUT can land between any check and the rmdir.
 * So they are first moved out, into a folder STK_S3_TRASH_PREFIX + random in the
 * root; then the bucket folder is removed, which succeeds only if it is truly
 * empty; only then is the moved folder destroyed. If the rmdir fails (an object
 * or folder appeared), everything is moved back and the answer is -ENOTEMPTY with
 * nothing lost. A PUT whose temporary file was moved meanwhile still commits by
 * inode into the bucket (making the rmdir fail) or, once the bucket is gone,
 * fails; it never reports success for an object that was removed.
 */
static int bucket_delete(struct stk_s3_gw *gw, const char *bucket);

/* As the gateway: the bucket's folder and the trash are in its root folder. */
int stk_s3_bucket_delete(struct stk_s3_gw *gw, const char *bucket)
{
	const struct stk_ll_cred *user = as_cred;
	int rc;

	as_cred = NULL;
	rc = bucket_delete(gw, bucket);
	as_cred = user;
	return rc;
}

static int bucket_delete(struct stk_s3_gw *gw, const char *bucket)
{
	char tname[sizeof(STK_S3_TRASH_PREFIX) + 32];
	struct stk_ll_attr b, trash = {0};
	struct dent *d = NULL;
	unsigned n = 0;
	size_t tl = strlen(STK_S3_TRASH_PREFIX);
	int rc, have_trash = 0;

	bcache_forget(gw, bucket);
	rc = stk_s3_bucket_lookup(gw, bucket, &b);
	if (rc)
		return rc;
	bcache_forget(gw, bucket);
	rc = read_dir(gw, b.ino, 1, 0, &d, &n);
	if (rc)
		return rc;
	for (unsigned i = 0; i < n; i++)
		if (!reserved_name(d[i].name)) {
			rc = -ENOTEMPTY;
			goto out;
		}
	if (n) {
		memcpy(tname, STK_S3_TRASH_PREFIX, tl);
		stk_s3_random_hex(tname + tl, 8);
		rc = stk_ll_mkdir(gw->c, as_cred, gw->root_ino, tname, 0700, &trash);
		if (rc)
			goto out;
		have_trash = 1;
	}
	for (unsigned i = 0; i < n; i++) {
		rc = stk_ll_rename(gw->c, as_cred, b.ino, d[i].name, trash.ino, d[i].name, 0);
		if (rc == -ENOENT)
			rc = 0; /* removed meanwhile (a sweep, an abort) */
		if (rc)
			break;
	}
	if (!rc)
		rc = stk_ll_rmdir(gw->c, as_cred, gw->root_ino, bucket);
	if (rc && have_trash) {
		/* not empty after all (or a move failed): put everything back */
		move_entries(gw, trash.ino, b.ino, 0);
		if (stk_ll_rmdir(gw->c, as_cred, gw->root_ino, tname))
			stk_warn("s3: bucket %s: could not put back all of %s", bucket, tname);
		have_trash = 0;
	}
	bcache_forget(gw, bucket);
out:
	if (have_trash && rm_rf(gw, gw->root_ino, tname, 0))
		stk_warn("s3: bucket %s deleted, but %s remains (removed by the sweep)", bucket,
			 tname);
	dents_free(d, n);
	return rc;
}

static int cmp_bucket(const void *x, const void *y)
{
	const struct stk_s3_bucket_ent *a = x, *b = y;
	return strcmp(a->name, b->name);
}

int stk_s3_bucket_list(struct stk_s3_gw *gw, struct stk_s3_bucket_ent **out, unsigned *nout)
{
	struct stk_s3_bucket_ent *b = NULL;
	struct dent *d;
	unsigned n, k = 0;
	int rc;

	rc = read_dir(gw, gw->root_ino, 0, 0, &d, &n);
	if (rc)
		return rc;
	if (n) {
		b = calloc(n, sizeof(*b));
		if (!b) {
			dents_free(d, n);
			return -ENOMEM;
		}
	}
	for (unsigned i = 0; i < n; i++) {
		struct stk_ll_attr a;
		if (!d[i].dir || stk_s3_bucket_check(d[i].name))
			continue;
		if (stk_ll_getattr(gw->c, as_cred, d[i].ino, &a))
			continue; /* removed while listing */
		snprintf(b[k].name, sizeof(b[k].name), "%s", d[i].name);
		b[k].ctime = a.ctime_sec;
		k++;
	}
	dents_free(d, n);
	if (k > 1)
		qsort(b, k, sizeof(*b), cmp_bucket);
	*out = b;
	*nout = k;
	return 0;
}

/* ---- the open table ---- */

static struct stk_s3_open_ent **open_slot(struct stk_s3_open_table *t, uint64_t ino)
{
	struct stk_s3_open_ent **pp = &t->slots[(ino * 0x9E3779B97F4A7C15ull) >> 56];

	while (*pp && (*pp)->ino != ino)
		pp = &(*pp)->next;
	return pp;
}

/* After an unlink or a rename left `a` without links: remove its data now, or
 * when the last GET reading it ends. */
static void drop_data(struct stk_s3_gw *gw, const struct stk_ll_attr *a)
{
	struct stk_s3_open_ent **pp;
	int later = 0;

	if (a->ino == 0 || a->nlink != 0 || !S_ISREG(a->mode))
		return;
	pthread_mutex_lock(&gw->open.lock);
	pp = open_slot(&gw->open, a->ino);
	if (*pp) {
		(*pp)->doomed = 1;
		(*pp)->attr = *a;
		later = 1;
	}
	pthread_mutex_unlock(&gw->open.lock);
	if (!later)
		stk_ll_remove_data(gw->c, a);
}

int stk_s3_obj_open(struct stk_s3_gw *gw, const struct stk_s3_obj *o, stk_file **out)
{
	struct stk_s3_open_ent **pp, *e;
	int rc;

	pthread_mutex_lock(&gw->open.lock);
	pp = open_slot(&gw->open, o->attr.ino);
	e = *pp;
	if (!e) {
		e = calloc(1, sizeof(*e));
		if (!e) {
			pthread_mutex_unlock(&gw->open.lock);
			return -ENOMEM;
		}
		e->ino = o->attr.ino;
		*pp = e;
	}
	e->refs++;
	pthread_mutex_unlock(&gw->open.lock);
	rc = stk_ll_open(gw->c, as_cred, &o->attr, O_RDONLY, out);
	if (rc == -ENOENT && o->parent_ino)
		rc = -ESTALE; /* the file was replaced or deleted since the lookup: look again */
	if (!rc && o->parent_ino) {
		/* A replace that ran between the caller's lookup and our registration
		 * may have removed the data already: the file we hold must still be the
		 * one the key names, now that any later replace will find it registered. */
		struct stk_ll_attr now;
		int lrc = lookup(gw, o->parent_ino, o->name, &now);
		if (lrc || now.ino != o->attr.ino) {
			stk_close(*out);
			*out = NULL;
			rc = -ESTALE;
		}
	}
	if (rc) {
		/* undo the registration as a release would, without a file */
		struct stk_ll_attr doomed;
		int drop = 0;
		pthread_mutex_lock(&gw->open.lock);
		pp = open_slot(&gw->open, o->attr.ino);
		e = *pp;
		if (e && --e->refs == 0) {
			*pp = e->next;
			drop = e->doomed;
			doomed = e->attr;
			free(e);
		}
		pthread_mutex_unlock(&gw->open.lock);
		if (drop)
			stk_ll_remove_data(gw->c, &doomed);
	}
	return rc;
}

void stk_s3_obj_release(struct stk_s3_gw *gw, stk_file *f)
{
	uint64_t ino;
	struct stk_s3_open_ent **pp, *e;
	struct stk_ll_attr doomed;
	int drop = 0;

	if (!f)
		return;
	ino = stk_ll_file_ino(f);
	stk_close(f);
	pthread_mutex_lock(&gw->open.lock);
	pp = open_slot(&gw->open, ino);
	e = *pp;
	if (e && --e->refs == 0) {
		*pp = e->next;
		drop = e->doomed;
		doomed = e->attr;
		free(e);
	}
	pthread_mutex_unlock(&gw->open.lock);
	if (drop)
		stk_ll_remove_data(gw->c, &doomed);
}

/* ---- objects ---- */

/* The key's record, or -ENOENT. */
static int read_record(struct stk_s3_gw *gw, const struct stk_ll_attr *bucket, const char *key,
		       struct stk_s3_record *r)
{
	struct stk_ll_attr meta, parent;
	char last[STK_LL_NAME_MAX + 1];
	int rc;

	rc = hidden_dir(gw, bucket, STK_S3_DIR_META, 0, &meta);
	if (rc)
		return rc;
	rc = walk_parent(gw, &meta, key, 0, &parent, last);
	if (rc)
		return rc == -ENOTDIR ? -ENOENT : rc;
	return read_record_at(gw, parent.ino, last, r);
}

/*
 * The record of the object file a at key: its extended attribute, else (only for a
 * file that has none: written by an older gateway, or natively) the old record in
 * .stoker-meta. The caller checks that it matches a.
 */
static int object_record(struct stk_s3_gw *gw, const struct stk_ll_attr *bucket, const char *key,
			 const struct stk_ll_attr *a, struct stk_s3_record *r)
{
	int rc = xattr_record_get(gw, a->ino, r);

	if (rc == -ENODATA) {
		rc = read_record(gw, bucket, key, r);
		if (rc == -ENOENT)
			rc = -ENODATA; /* no record at all; -ENOENT means the file is gone */
	}
	return rc;
}

int stk_s3_obj_stat(struct stk_s3_gw *gw, const struct stk_ll_attr *bucket, const char *key,
		    struct stk_s3_obj *o)
{
	struct stk_ll_attr parent;
	char last[STK_LL_NAME_MAX + 1];
	int rc;

	memset(o, 0, sizeof(*o));
	rc = stk_s3_key_check(key);
	if (rc)
		return rc;
	rc = walk_parent(gw, bucket, key, 0, &parent, last);
	if (rc)
		return rc == -ENOTDIR ? -ENOENT : rc;
	if (!last[0]) { /* "a/b/": the folder itself */
		o->attr = parent;
		o->dir_marker = 1;
		snprintf(o->etag, sizeof(o->etag), "\"%s\"", STK_S3_EMPTY_MD5);
		return 0;
	}
	for (int tries = 0;; tries++) {
		rc = lookup(gw, parent.ino, last, &o->attr);
		if (rc)
			return rc;
		if (!S_ISREG(o->attr.mode))
			return -ENOENT;
		rc = object_record(gw, bucket, key, &o->attr, &o->rec);
		/* -ENOENT: the file was replaced (or deleted) after the lookup, so its
		 * record went with it; the key's current file has its own: look again,
		 * rather than answer the old file with no record (a fallback ETag) */
		if (rc != -ENOENT || tries == STK_S3_COMMIT_TRIES)
			break;
	}
	o->parent_ino = parent.ino;
	snprintf(o->name, sizeof(o->name), "%s", last);
	if (rc == 0 && record_matches(&o->rec, &o->attr))
		o->have_rec = 1;
	if (o->have_rec)
		snprintf(o->etag, sizeof(o->etag), "%s", o->rec.etag);
	else
		stk_s3_fallback_etag(&o->attr, o->etag, sizeof(o->etag));
	return 0;
}

/*
 * Removes the folders of key (under top) that are empty, deepest first, stopping
 * at the first that is not. S3 has no folders: one that held only the deleted
 * object should not linger as a common prefix.
 */
static void prune(struct stk_s3_gw *gw, const struct stk_ll_attr *top, const char *key)
{
	uint64_t inos[64];
	char names[64][STK_LL_NAME_MAX + 1];
	unsigned depth = 0;
	const char *p = key;
	uint64_t cur = top->ino;

	for (;;) {
		const char *slash = strchr(p, '/');
		struct stk_ll_attr a;
		if (!slash || depth == 64)
			break;
		if (segment(p, (size_t)(slash - p), names[depth]))
			return;
		if (lookup(gw, cur, names[depth], &a) || !S_ISDIR(a.mode))
			return;
		inos[depth] = cur; /* the folder's parent */
		cur = a.ino;
		depth++;
		p = slash + 1;
	}
	while (depth > 0) {
		depth--;
		if (stk_ll_rmdir(gw->c, as_cred, inos[depth], names[depth]))
			break;
	}
}

static void remove_record(struct stk_s3_gw *gw, const struct stk_ll_attr *bucket, const char *key)
{
	struct stk_ll_attr meta, parent;
	char last[STK_LL_NAME_MAX + 1];

	if (hidden_dir(gw, bucket, STK_S3_DIR_META, 0, &meta))
		return;
	if (walk_parent(gw, &meta, key, 0, &parent, last) || !last[0])
		return;
	if (stk_ll_unlink(gw->c, as_cred, parent.ino, last) == 0)
		prune(gw, &meta, key);
}

int stk_s3_obj_delete(struct stk_s3_gw *gw, const struct stk_ll_attr *bucket, const char *key)
{
	struct stk_ll_attr parent, a, after;
	char last[STK_LL_NAME_MAX + 1];
	int rc;

	rc = stk_s3_key_check(key);
	if (rc)
		return rc;
	rc = walk_parent(gw, bucket, key, 0, &parent, last);
	if (rc == -ENOENT || rc == -ENOTDIR)
		return 0;
	if (rc)
		return rc;
	if (!last[0]) { /* a folder marker: the folder goes if it is empty */
		prune(gw, bucket, key);
		return 0;
	}
	rc = lookup(gw, parent.ino, last, &a);
	if (rc == -ENOENT || (!rc && !S_ISREG(a.mode))) {
		remove_record(gw, bucket, key);
		return 0;
	}
	if (rc)
		return rc;
	rc = stk_ll_unlink_keep(gw->c, as_cred, parent.ino, last, &after, NULL);
	if (rc == -ENOENT)
		return 0;
	if (rc)
		return rc;
	drop_data(gw, &after);
	remove_record(gw, bucket, key);
	prune(gw, bucket, key);
	return 0;
}

int stk_s3_mkdir_marker(struct stk_s3_gw *gw, const struct stk_ll_attr *bucket, const char *key)
{
	struct stk_ll_attr parent;
	char last[STK_LL_NAME_MAX + 1];
	int rc = stk_s3_key_check(key);

	if (rc)
		return rc;
	return walk_parent(gw, bucket, key, 1, &parent, last);
}

/* ---- temporary files and commits ---- */

int stk_s3_tmp_create(struct stk_s3_gw *gw, const struct stk_ll_attr *bucket, uint64_t dir_ino,
		      struct stk_s3_tmp *t)
{
	struct stk_ll_attr dir, a;
	int created = 0, rc;

	memset(t, 0, sizeof(*t));
	if (!dir_ino) {
		rc = hidden_dir(gw, bucket, STK_S3_DIR_UPLOAD, 1, &dir);
		if (rc)
			return rc;
		dir_ino = dir.ino;
	}
	t->name[0] = 'u';
	stk_s3_random_hex(t->name + 1, 16);
	rc = stk_ll_create(gw->c, as_cred, dir_ino, t->name, S_IFREG | 0644, 1, &a, &created);
	if (rc) {
		t->name[0] = 0;
		return rc;
	}
	t->dir_ino = dir_ino;
	t->attr = a;
	rc = stk_ll_open(gw->c, as_cred, &a, O_WRONLY, &t->f);
	if (rc) {
		stk_ll_unlink(gw->c, as_cred, dir_ino, t->name);
		t->name[0] = 0;
		t->f = NULL;
	}
	return rc;
}

int stk_s3_tmp_write(struct stk_s3_tmp *t, const void *p, size_t n)
{
	const char *q = p;

	while (n) {
		ssize_t w = stk_write(t->f, q, n);
		if (w < 0)
			return (int)w;
		if (w == 0)
			return -EIO;
		q += w;
		n -= (size_t)w;
		t->written += (uint64_t)w;
	}
	return 0;
}

int stk_s3_tmp_finish(struct stk_s3_gw *gw, struct stk_s3_tmp *t)
{
	int rc;

	rc = stk_close(t->f);
	t->f = NULL;
	if (rc)
		return rc;
	return stk_ll_getattr(gw->c, as_cred, t->attr.ino, &t->attr);
}

void stk_s3_tmp_discard(struct stk_s3_gw *gw, struct stk_s3_tmp *t)
{
	if (t->f) {
		/* the file is about to go: what close flushes is wasted, but close is
		 * the only way to free a handle */
		stk_close(t->f);
		t->f = NULL;
	}
	if (t->name[0]) {
		stk_ll_unlink(gw->c, as_cred, t->dir_ino, t->name);
		t->name[0] = 0;
	}
}

int stk_s3_obj_put_record(struct stk_s3_gw *gw, const struct stk_ll_attr *bucket, const char *key,
			  const struct stk_ll_attr *a, struct stk_s3_record *rec)
{
	(void)bucket;
	(void)key;
	rec->ino = a->ino;
	rec->size = a->size;
	rec->mtime_sec = a->mtime_sec;
	rec->mtime_nsec = a->mtime_nsec;
	/* Setting an attribute changes the ctime only, so the record still matches;
	 * if the key was replaced meanwhile, this lands on the old file, harmlessly. */
	return xattr_record_set(gw, a->ino, rec);
}

int stk_s3_tmp_commit(struct stk_s3_gw *gw, const struct stk_ll_attr *bucket, struct stk_s3_tmp *t,
		      const char *key, struct stk_s3_record *rec)
{
	struct stk_ll_attr parent, replaced;
	char last[STK_LL_NAME_MAX + 1];
	int rc;

	rec->ino = t->attr.ino;
	rec->size = t->attr.size;
	rec->mtime_sec = t->attr.mtime_sec;
	rec->mtime_nsec = t->attr.mtime_nsec;
	/* The record goes on the temporary file first: the rename below then publishes
	 * the bytes and their record in one step, and a rename that fails leaves the
	 * old object and its record untouched. */
	rc = xattr_record_set(gw, t->attr.ino, rec);
	if (rc)
		return rc;
	for (int tries = 0; tries < STK_S3_COMMIT_TRIES; tries++) {
		rc = walk_parent(gw, bucket, key, 1, &parent, last);
		if (rc)
			return rc; /* -ENOTDIR: a folder of the key is an object */
		if (!last[0])
			return -EINVAL;
		/* a folder at the key fails the rename with -EISDIR, replacing nothing */
		rc = stk_ll_rename_keep(gw->c, as_cred, t->dir_ino, t->name, parent.ino, last, 0,
					 &replaced);
		if (rc == -ENOENT)
			continue; /* a folder went away under us (a delete pruned it): walk again */
		if (rc)
			return rc;
		t->name[0] = 0;
		drop_data(gw, &replaced);
		return 0;
	}
	return rc;
}

int stk_s3_copy_data(struct stk_s3_gw *gw, stk_file *src, uint64_t off, uint64_t len,
		     struct stk_s3_tmp *t, void *md5, char *buf)
{
	while (len) {
		size_t n = len < gw->io_size ? (size_t)len : gw->io_size;
		ssize_t r = stk_pread(src, buf, n, (off_t)off);
		int rc;

		if (r < 0)
			return (int)r;
		if (r == 0)
			return -EIO; /* the source shrank under us */
		if (md5)
			EVP_DigestUpdate(md5, buf, (size_t)r);
		rc = stk_s3_tmp_write(t, buf, (size_t)r);
		if (rc)
			return rc;
		off += (uint64_t)r;
		len -= (uint64_t)r;
	}
	return 0;
}

int stk_s3_sweep(struct stk_s3_gw *gw, int64_t max_age_s)
{
	struct dent *buckets, *d;
	unsigned nb, n;
	int64_t cutoff = (int64_t)time(NULL) - max_age_s;
	int removed = 0, rc;

	rc = read_dir(gw, gw->root_ino, 0, 0, &buckets, &nb);
	if (rc)
		return rc;
	for (unsigned i = 0; i < nb; i++) {
		struct stk_ll_attr up;

		if (buckets[i].dir && strncmp(buckets[i].name, STK_S3_TRASH_PREFIX,
					      strlen(STK_S3_TRASH_PREFIX)) == 0) {
			/* the folders of a bucket whose delete a dead gateway left half done */
			if (stk_ll_getattr(gw->c, as_cred, buckets[i].ino, &up) == 0 &&
			    up.mtime_sec < cutoff &&
			    rm_rf(gw, gw->root_ino, buckets[i].name, 0) == 0)
				removed++;
			continue;
		}
		if (!buckets[i].dir || stk_s3_bucket_check(buckets[i].name) ||
		    lookup(gw, buckets[i].ino, STK_S3_UPLOAD_DIR, &up) || !S_ISDIR(up.mode) ||
		    read_dir(gw, up.ino, 1, 0, &d, &n))
			continue;
		for (unsigned j = 0; j < n; j++) {
			struct stk_ll_attr a;
			if (stk_ll_getattr(gw->c, as_cred, d[j].ino, &a) || a.mtime_sec >= cutoff)
				continue;
			if (rm_rf(gw, up.ino, d[j].name, 0) == 0)
				removed++;
		}
		dents_free(d, n);
	}
	dents_free(buckets, nb);
	return removed;
}

/* ---- listing ---- */

struct lw {
	struct stk_s3_gw *gw;
	const struct stk_s3_list_opts *o;
	struct stk_s3_list *out;
	size_t plen, dlen;
	int done;
	int rc;
	char last_cp[STK_S3_KEY_MAX + 1];
	char key[STK_S3_KEY_MAX + STK_LL_NAME_MAX + 2];
};

/* Compares k[0..kl) with the NUL-terminated s as byte strings. */
static int cmp_n(const char *k, size_t kl, const char *s)
{
	size_t sl = strlen(s);
	int c = memcmp(k, s, kl < sl ? kl : sl);

	if (c)
		return c;
	return kl < sl ? -1 : kl > sl ? 1 : 0;
}

/* Adds key k[0..kl): a common prefix, or an object of attributes a and record rec
 * (NULL: none that matches, so the fallback ETag). */
static int push(struct lw *w, const char *k, size_t kl, int is_prefix, const struct stk_ll_attr *a,
		const struct stk_s3_record *rec)
{
	struct stk_s3_list *l = w->out;
	struct stk_s3_list_item *it;

	if (l->n >= w->o->max) {
		l->truncated = 1;
		w->done = 1;
		return 0;
	}
	if (l->n == l->cap) {
		unsigned nc = l->cap ? l->cap * 2 : 64;
		struct stk_s3_list_item *ni = realloc(l->items, nc * sizeof(*ni));
		if (!ni)
			return -ENOMEM;
		l->items = ni;
		l->cap = nc;
	}
	it = &l->items[l->n];
	memset(it, 0, sizeof(*it));
	it->key = strndup(k, kl);
	if (!it->key)
		return -ENOMEM;
	it->is_prefix = is_prefix;
	if (a) {
		it->size = S_ISREG(a->mode) ? a->size : 0;
		it->mtime = a->mtime_sec;
		if (!S_ISREG(a->mode)) {
			snprintf(it->etag, sizeof(it->etag), "\"%s\"", STK_S3_EMPTY_MD5);
		} else if (rec) {
			snprintf(it->etag, sizeof(it->etag), "%s", rec->etag);
		} else {
			stk_s3_fallback_etag(a, it->etag, sizeof(it->etag));
		}
	}
	l->n++;
	return 0;
}

/*
 * Adds the file entry e of folder dir as key k[0..kl), with its record. The entry
 * comes from readdir: if the file was replaced since, its record went with it
 * (getxattr -ENOENT), so the name is looked up again rather than listing the old
 * file with a fallback ETag. Not inlined: the record is large and walk_dir recurses.
 */
__attribute__((noinline)) static int push_file(struct lw *w, const char *k, size_t kl, uint64_t dir,
					       const struct dent *e, uint64_t meta_ino)
{
	struct stk_s3_record r;
	struct stk_ll_attr a;
	int have = 0;

	if (stk_ll_getattr(w->gw->c, as_cred, e->ino, &a))
		return 0; /* removed while listing */
	for (int tries = 0; S_ISREG(a.mode) && w->o->want_etag; tries++) {
		int rc = xattr_record_get(w->gw, a.ino, &r);
		if (rc == -ENODATA && meta_ino && /* an older gateway's record */
		    read_record_at(w->gw, meta_ino, e->name, &r) == 0)
			rc = 0;
		if (rc != -ENOENT || tries == 2) {
			have = rc == 0 && record_matches(&r, &a);
			break;
		}
		if (lookup(w->gw, dir, e->name, &a))
			return 0; /* deleted since */
	}
	if (!S_ISREG(a.mode))
		return 0; /* replaced by a folder while listing */
	return push(w, k, kl, 0, &a, have ? &r : NULL);
}

/* A common prefix k[0..cl): returned once, and only after the start key. */
static int push_prefix(struct lw *w, const char *k, size_t cl)
{
	const char *after = w->o->after;

	if (after && *after && cmp_n(k, cl, after) <= 0)
		return 0;
	if (w->last_cp[0] && cmp_n(k, cl, w->last_cp) == 0)
		return 0;
	memcpy(w->last_cp, k, cl);
	w->last_cp[cl] = 0;
	return push(w, k, cl, 1, NULL, NULL);
}

/* Where the delimiter first occurs in k after the prefix: the common prefix's
 * length, or 0 when it does not occur within k[0..kl). */
static size_t rollup(const struct lw *w, const char *k, size_t kl)
{
	const char *d = w->o->delimiter;

	if (!w->dlen || kl < w->plen)
		return 0;
	for (size_t i = w->plen; i + w->dlen <= kl; i++)
		if (memcmp(k + i, d, w->dlen) == 0)
			return i + w->dlen;
	return 0;
}

static int walk_dir(struct lw *w, const struct stk_ll_attr *dir, uint64_t meta_ino, size_t klen)
{
	const char *prefix = w->o->prefix, *after = w->o->after;
	struct dent *d;
	unsigned n;
	int rc;

	rc = read_dir(w->gw, dir->ino, 0, klen == 0, &d, &n);
	if (rc)
		return rc == -ENOENT || rc == -ENOTDIR ? 0 : rc;
	if (n == 0 && klen > 0) {
		/* An empty folder is the folder marker "a/b/" S3 tools make. */
		char *k = w->key;
		size_t cl;
		if (klen >= w->plen && memcmp(k, prefix, w->plen) == 0) {
			cl = rollup(w, k, klen);
			if (cl && cl < klen)
				rc = push_prefix(w, k, cl);
			else if (!(after && *after && cmp_n(k, klen, after) <= 0)) {
				struct stk_ll_attr a = *dir;
				if (!a.mtime_sec)
					stk_ll_getattr(w->gw->c, as_cred, dir->ino, &a);
				rc = push(w, k, klen, 0, &a, NULL);
			}
		}
	}
	for (unsigned i = 0; i < n && !rc && !w->done; i++) {
		struct dent *e = &d[i];
		char *k = w->key;
		size_t kl = klen + e->len + (e->dir ? 1 : 0), cl;

		if (kl > STK_S3_KEY_MAX)
			continue; /* no key can name it */
		memcpy(k + klen, e->name, e->len);
		if (e->dir)
			k[klen + e->len] = '/';
		k[kl] = 0;
		if (e->dir) {
			struct stk_ll_attr a;
			uint64_t sub_meta = 0;

			if (kl >= w->plen ? memcmp(k, prefix, w->plen) != 0
					  : memcmp(k, prefix, kl) != 0)
				continue; /* outside the prefix */
			cl = rollup(w, k, kl);
			if (cl) { /* the whole folder is one common prefix */
				rc = push_prefix(w, k, cl);
				continue;
			}
			if (after && *after && cmp_n(k, kl, after) < 0 &&
			    strncmp(after, k, kl) != 0)
				continue; /* every key in it sorts before the start */
			/* readdir gave the inode and type, all a walk needs; the empty
			 * folder marker fetches its mtime itself */
			memset(&a, 0, sizeof(a));
			a.ino = e->ino;
			a.mode = e->mode;
			if (meta_ino) {
				struct stk_ll_attr m;
				if (lookup(w->gw, meta_ino, e->name, &m) == 0 && S_ISDIR(m.mode))
					sub_meta = m.ino;
			}
			rc = walk_dir(w, &a, sub_meta, kl);
		} else {
			if (kl < w->plen || memcmp(k, prefix, w->plen) != 0)
				continue;
			cl = rollup(w, k, kl);
			if (cl) {
				rc = push_prefix(w, k, cl);
				continue;
			}
			if (after && *after && strcmp(k, after) <= 0)
				continue;
			rc = push_file(w, k, kl, dir->ino, e, meta_ino);
		}
	}
	dents_free(d, n);
	return rc;
}

int stk_s3_list(struct stk_s3_gw *gw, const struct stk_ll_attr *bucket,
		const struct stk_s3_list_opts *o, struct stk_s3_list *out)
{
	struct lw *w;
	struct stk_ll_attr dir = *bucket, meta;
	uint64_t meta_ino = 0;
	const char *p, *slash;
	size_t klen = 0;
	int rc = 0;

	memset(out, 0, sizeof(*out));
	if (o->max == 0)
		return 0;
	w = calloc(1, sizeof(*w));
	if (!w)
		return -ENOMEM;
	w->gw = gw;
	w->o = o;
	w->out = out;
	w->plen = strlen(o->prefix);
	w->dlen = o->delimiter ? strlen(o->delimiter) : 0;
	if (hidden_dir(gw, bucket, STK_S3_DIR_META, 0, &meta) == 0)
		meta_ino = meta.ino;

	/* Start in the deepest folder the prefix names: "a/b/c" lists inside "a/b/". */
	p = o->prefix;
	while ((slash = strchr(p, '/')) != NULL) {
		char name[STK_LL_NAME_MAX + 1];
		struct stk_ll_attr a;
		size_t n = (size_t)(slash - p);

		if (segment(p, n, name) || (klen == 0 && reserved_name(name)))
			goto out; /* no key lies under such a prefix */
		rc = lookup(gw, dir.ino, name, &a);
		if (rc == -ENOENT || (!rc && !S_ISDIR(a.mode))) {
			rc = 0;
			goto out;
		}
		if (rc)
			goto out;
		if (meta_ino) {
			struct stk_ll_attr m;
			meta_ino =
			    lookup(gw, meta_ino, name, &m) == 0 && S_ISDIR(m.mode) ? m.ino : 0;
		}
		dir = a;
		memcpy(w->key + klen, p, n + 1);
		klen += n + 1;
		p = slash + 1;
	}
	w->key[klen] = 0;
	rc = walk_dir(w, &dir, meta_ino, klen);
out:
	free(w);
	if (rc)
		stk_s3_list_free(out);
	return rc;
}

void stk_s3_list_free(struct stk_s3_list *l)
{
	for (unsigned i = 0; i < l->n; i++)
		free(l->items[i].key);
	free(l->items);
	memset(l, 0, sizeof(*l));
}

/* ---- multipart uploads ---- */

int stk_s3_mpu_create(struct stk_s3_gw *gw, const struct stk_ll_attr *bucket, const char *key,
		      const struct stk_s3_record *info, char *id)
{
	struct stk_ll_attr root, dir, a;
	struct stk_s3_record r = *info;
	char buf[STK_S3_RECORD_MAX + 1];
	int rc;

	rc = ensure_dir(gw, bucket->ino, STK_S3_MPU_DIR, &root);
	if (rc)
		return rc;
	stk_s3_random_hex(id, STK_S3_UPLOAD_ID_LEN / 2);
	rc = stk_ll_mkdir(gw->c, as_cred, root.ino, id, 0755, &dir);
	if (rc)
		return rc;
	snprintf(r.key, sizeof(r.key), "%s", key);
	r.mtime_sec = time(NULL);
	rc = stk_s3_record_encode(&r, buf, sizeof(buf));
	if (rc >= 0)
		rc = stk_ll_symlink(gw->c, as_cred, dir.ino, "info", buf, &a);
	if (rc < 0) {
		rm_rf(gw, root.ino, id, 0);
		return rc;
	}
	return 0;
}

int stk_s3_mpu_open(struct stk_s3_gw *gw, const struct stk_ll_attr *bucket, const char *id,
		    struct stk_ll_attr *dir, struct stk_s3_record *info)
{
	struct stk_ll_attr root;
	int rc;

	if (stk_s3_upload_id_check(id))
		return -ENOENT;
	rc = lookup(gw, bucket->ino, STK_S3_MPU_DIR, &root);
	if (!rc)
		rc = lookup(gw, root.ino, id, dir);
	if (!rc && !S_ISDIR(dir->mode))
		rc = -ENOENT;
	if (!rc && info)
		rc = read_record_at(gw, dir->ino, "info", info);
	return rc == -EINVAL ? -ENOENT : rc;
}

int stk_s3_mpu_put_part(struct stk_s3_gw *gw, const struct stk_ll_attr *dir, struct stk_s3_tmp *t,
			unsigned number, const char *md5_hex)
{
	struct stk_s3_record r;
	struct stk_ll_attr old;
	char pname[16];
	int rc;

	memset(&r, 0, sizeof(r));
	r.ino = t->attr.ino;
	r.size = t->attr.size;
	r.mtime_sec = t->attr.mtime_sec;
	r.mtime_nsec = t->attr.mtime_nsec;
	snprintf(r.etag, sizeof(r.etag), "\"%s\"", md5_hex);
	snprintf(pname, sizeof(pname), "p%05u", number);
	/* on the part's file before the rename, as for objects: two uploads of one
	 * part number cannot leave one's bytes with the other's ETag */
	rc = xattr_record_set(gw, t->attr.ino, &r);
	if (rc)
		return rc;
	rc = stk_ll_rename_keep(gw->c, as_cred, t->dir_ino, t->name, dir->ino, pname, 0, &old);
	if (!rc) {
		t->name[0] = 0;
		drop_data(gw, &old);
	}
	return rc;
}

int stk_s3_mpu_part(struct stk_s3_gw *gw, const struct stk_ll_attr *dir, unsigned number,
		    struct stk_s3_part *out)
{
	struct stk_s3_record r;
	char pname[16], rname[24];
	int rc;

	memset(out, 0, sizeof(*out));
	snprintf(pname, sizeof(pname), "p%05u", number);
	snprintf(rname, sizeof(rname), "p%05u.m", number);
	rc = lookup(gw, dir->ino, pname, &out->attr);
	if (rc)
		return rc;
	rc = xattr_record_get(gw, out->attr.ino, &r);
	if (rc == -ENODATA) /* a part staged by an older gateway */
		rc = read_record_at(gw, dir->ino, rname, &r);
	if (rc || !record_matches(&r, &out->attr))
		return -ENOENT; /* being replaced right now, or a leftover */
	out->number = number;
	out->dir_ino = dir->ino;
	out->size = out->attr.size;
	out->mtime = out->attr.mtime_sec;
	snprintf(out->etag, sizeof(out->etag), "%s", r.etag);
	return 0;
}

static int cmp_uint(const void *x, const void *y)
{
	unsigned a = *(const unsigned *)x, b = *(const unsigned *)y;
	return a < b ? -1 : a > b;
}

int stk_s3_mpu_parts(struct stk_s3_gw *gw, const struct stk_ll_attr *dir, unsigned after, unsigned max,
		     struct stk_s3_part **out, unsigned *nout, int *truncated)
{
	struct dent *d;
	unsigned n, *nums = NULL, k = 0, got = 0;
	struct stk_s3_part *parts = NULL;
	int rc;

	*truncated = 0;
	rc = read_dir(gw, dir->ino, 1, 0, &d, &n);
	if (rc)
		return rc;
	if (n) {
		nums = calloc(n, sizeof(*nums));
		parts = calloc(n, sizeof(*parts));
		if (!nums || !parts) {
			rc = -ENOMEM;
			goto out;
		}
	}
	for (unsigned i = 0; i < n; i++) {
		unsigned v = 0;
		if (d[i].len != 6 || d[i].name[0] != 'p')
			continue;
		for (int j = 1; j < 6; j++) {
			char c = d[i].name[j];
			if (c < '0' || c > '9') {
				v = 0;
				break;
			}
			v = v * 10 + (unsigned)(c - '0');
		}
		if (v >= 1 && v > after)
			nums[k++] = v;
	}
	if (k > 1)
		qsort(nums, k, sizeof(*nums), cmp_uint);
	for (unsigned i = 0; i < k; i++) {
		if (got == max) {
			*truncated = 1;
			break;
		}
		if (stk_s3_mpu_part(gw, dir, nums[i], &parts[got]) == 0)
			got++;
	}
out:
	dents_free(d, n);
	free(nums);
	if (rc) {
		free(parts);
		return rc;
	}
	*out = parts;
	*nout = got;
	return 0;
}

int stk_s3_mpu_remove(struct stk_s3_gw *gw, const struct stk_ll_attr *bucket, const char *id)
{
	struct stk_ll_attr root;
	int rc;

	if (stk_s3_upload_id_check(id))
		return -ENOENT;
	rc = lookup(gw, bucket->ino, STK_S3_MPU_DIR, &root);
	if (rc)
		return rc;
	return rm_rf(gw, root.ino, id, 0);
}

static int cmp_upload(const void *x, const void *y)
{
	const struct stk_s3_upload_ent *a = x, *b = y;
	int c = strcmp(a->key, b->key);

	if (c)
		return c;
	if (a->initiated != b->initiated)
		return a->initiated < b->initiated ? -1 : 1;
	return strcmp(a->id, b->id);
}

int stk_s3_mpu_list(struct stk_s3_gw *gw, const struct stk_ll_attr *bucket,
		    struct stk_s3_upload_ent **out, unsigned *nout)
{
	struct stk_ll_attr root;
	struct stk_s3_upload_ent *u = NULL;
	struct stk_s3_record *r = NULL;
	struct dent *d = NULL;
	unsigned n = 0, k = 0;
	int rc;

	*out = NULL;
	*nout = 0;
	rc = lookup(gw, bucket->ino, STK_S3_MPU_DIR, &root);
	if (rc)
		return rc == -ENOENT ? 0 : rc;
	rc = read_dir(gw, root.ino, 0, 0, &d, &n);
	if (rc)
		return rc;
	r = malloc(sizeof(*r));
	if (n)
		u = calloc(n, sizeof(*u));
	if (!r || (n && !u)) {
		rc = -ENOMEM;
		goto out;
	}
	for (unsigned i = 0; i < n; i++) {
		if (!d[i].dir || stk_s3_upload_id_check(d[i].name))
			continue;
		if (read_record_at(gw, d[i].ino, "info", r))
			continue; /* being created or removed */
		u[k].key = strdup(r->key);
		if (!u[k].key) {
			rc = -ENOMEM;
			goto out;
		}
		memcpy(u[k].id, d[i].name, STK_S3_UPLOAD_ID_LEN + 1);
		u[k].initiated = r->mtime_sec;
		k++;
	}
	if (k > 1)
		qsort(u, k, sizeof(*u), cmp_upload);
out:
	dents_free(d, n);
	free(r);
	if (rc) {
		stk_s3_mpu_list_free(u, k);
		return rc;
	}
	*out = u;
	*nout = k;
	return 0;
}

void stk_s3_mpu_list_free(struct stk_s3_upload_ent *u, unsigned n)
{
	for (unsigned i = 0; u && i < n; i++)
		free(u[i].key);
	free(u);
}
