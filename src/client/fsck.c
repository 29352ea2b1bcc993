/*
 * stk_fsck (stoker.h): the namespace and the data checked against each other,
 * on a live cluster (docs/fsck.md). `stoker fsck` parses its options and prints
 * the report; the check is here, since it speaks the protocol of meta and of the
 * storage nodes and needs the routing table and the placement of chunks.
 *
 * The namespace half is meta's (META_FSCK's check: one LMDB transaction, so
 * nothing in flight shows as a problem, and with repair one write transaction
 * that repairs what is safe), asked of each metadata shard's leader in turn:
 * each checks its own namespace. The data half is done here, in two passes: each
 * pass lists every shard's regular files and the files waiting for its purge,
 * then every chunk of every target that serves (STOR_FSCK_LIST), and finds
 *   garbage   chunks of an inode no shard knows nor purges (the shard its number
 *             names was listed and has no such inode), all of
 *             them older than the grace period (a file being created now, by a
 *             client that answers creates itself, has young chunks);
 *   missing   a chunk meta counts as written, below the file's size, that no
 *             working member of its chain holds: data lost;
 *   replicas  working members of a chain that disagree on a chunk (one lacks it,
 *             or versions or digests differ).
 * Writes, truncates and unlinks in flight make a pass see things that are not
 * problems; they do not stay the same for a second pass, so only what both
 * passes found alike is reported. Repair then removes the garbage (a
 * STOR_TRUNCATE to 0 through the head of each chain that holds it, fenced by the
 * namespace's identity). Missing data is reported, never invented; disagreeing
 * copies are reported for the storage nodes' repair (their resync and scrubber).
 *
 * With several shards a folder may be named on its parent's shard A and live on
 * another shard B. Each shard's check leaves such pairs alone (it sees one half);
 * here every shard lists its entries naming folders of other shards and its
 * folders whose parent is on another shard (META_FSCK XENTRIES, XDIRS), and finds
 *   an entry on A naming a folder B does not have (dangling-entry), and
 *   a folder on B that no entry on A names (unreached-inode, reported only),
 * leaving alone what an intent on A (in the entry's folder) or a mark on B's
 * folder covers: a cross-shard mkdir or rmdir in flight, or one its recovery
 * will settle. The entries are listed before and after the folders, so that a
 * finished mkdir or rmdir is seen from the right side; what is found is looked
 * at again a second later and counts only if alike. Repair drops a dangling
 * entry on A (XDROP), which refuses while an intent is about that folder.
 *
 * Files renamed or linked across shards keep their inode at home (H) and are
 * named on another shard (D), with a record on each ('X' on H, counted as a
 * link; 'R' on D). Before the namespace checks (so that H's check sees the
 * records it counts), every shard lists its records and its entries naming
 * other shards' files (XRECS, XNAMES) and finds a name missing a record
 * (name-off-home; repair writes them again, D's first) and an 'X' whose name D
 * no longer has nor releases (stale-name-record; repair drops it and its link
 * on H), again leaving what an intent or a mark covers to the protocol.
 *
 * Memory: one pass holds every regular file's record and every chunk copy's
 * (about 48 bytes each) at once.
 */
#include "client.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../common/layout.h"
#include "inode.h"
#include "../common/log.h"
#include "../common/util.h"

#define GRACE_DEFAULT_S 600
#define PASS_PAUSE_US 1000000
#define STOR_CONNECT_MS 5000

/* ---- what one pass sees ---- */

struct file {
	struct stk_attr a;
	uint8_t exact;
	uint32_t nalloc;
	uint32_t (*alloc)[2];
};

struct copy {
	uint64_t ino;
	uint32_t idx;
	uint32_t target;
	uint64_t version;
	uint32_t len, digest;
	int64_t age;
};

struct pass {
	struct file *files;
	size_t nfiles, capfiles;
	uint64_t *purging;
	size_t npurging, cappurging;
	struct copy *copies;
	size_t ncopies, capcopies;
	uint32_t targets_listed, targets_skipped;
	struct stk_routing rt; /* a copy, taken once per pass */
};

enum { P_GARBAGE = 1, P_MISSING, P_REPLICAS };

/* A data problem and what must be alike in both passes for it to count. */
struct dprob {
	int kind;
	uint64_t ino;
	uint32_t idx;	 /* missing, replicas */
	uint32_t chain;	 /* missing, replicas */
	uint64_t chunks; /* garbage: how many; replicas: copies seen */
	uint64_t bytes;	 /* garbage */
	uint64_t sig;	 /* what both passes must agree on */
	int repaired;
	int confirmed;
};

/* A reference between shards: an entry naming a folder of another, or such a folder. */
struct xref {
	uint64_t ino, parent;
	unsigned shard; /* the shard that listed it */
	uint8_t covered;
	char name[STK_NAME_MAX + 1];
};

struct xset {
	struct xref *v;
	size_t n, cap;
};

/* A cross-shard problem: kind (public), the shard it is counted on, confirmed. */
struct xprob {
	int kind;
	unsigned shard;
	uint64_t ino, parent;
	uint64_t expect, found; /* parent-pointer: the entry's folder, the pointer */
	uint64_t id;		/* a name off home's: the id its records carry */
	uint64_t rid;		/* a stale name record's: the leftover 'R''s id */
	uint64_t seen;		/* a folder's: its ctime when found (0: none such) */
	char name[STK_NAME_MAX + 1];
	int confirmed, repaired;
};

/* A record of a name off home (XRECS), and the shard that listed it. */
struct xrec {
	uint64_t ino, id;
	unsigned lister, shard;
	char kind;
	uint8_t covered;
};

struct rset {
	struct xrec *v;
	size_t n, cap;
};

/* One shard's namespace check. */
struct shard {
	unsigned id;
	struct stk_msg_meta_fsck_resp ns; /* its counts */
	uint32_t nnsp;			  /* its problems listed in fsck's nsp */
};

struct fsck {
	stk_client *c;
	const struct stk_fsck_opts *o;
	int repair;
	int64_t grace;
	struct shard sh[STK_MAX_SHARDS]; /* by id, ascending */
	unsigned nsh;
	struct stk_msg_meta_fsck_resp ns; /* the namespace checks' counts, summed */
	struct stk_msg_fsck_problem *nsp; /* their problems, shard by shard */
	uint32_t nnsp;
	struct dprob *dp;
	size_t ndp, capdp;
	struct xprob *xp; /* cross-shard problems, found by the first look */
	size_t nxp, capxp;
	uint64_t young; /* garbage candidates within the grace period */
	uint64_t busy;	/* cross-shard names and folders left to their protocol (last look) */
	int xnames_old; /* a shard's meta does not list names off home */
	uint8_t *resp;	/* STK_MAX_PAYLOAD */
};

static void progress(struct fsck *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void progress(struct fsck *f, const char *fmt, ...)
{
	char line[256];
	va_list ap;

	if (!f->o->progress)
		return;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	f->o->progress(f->o->progress_ctx, line);
}

static int grow(void **v, size_t *cap, size_t n, size_t size)
{
	void *p;
	size_t c;

	if (n < *cap)
		return 0;
	c = *cap ? 2 * *cap : 256;
	p = realloc(*v, c * size);
	if (!p)
		return -ENOMEM;
	*v = p;
	*cap = c;
	return 0;
}

static void pass_free(struct pass *p)
{
	for (size_t i = 0; i < p->nfiles; i++)
		free(p->files[i].alloc);
	free(p->files);
	free(p->purging);
	free(p->copies);
	stk_routing_free(&p->rt);
	memset(p, 0, sizeof(*p));
}

/* One META_FSCK to shard's leader; the reply's head in *r, the reader after it. */
static int meta_fsck(struct fsck *f, unsigned shard, uint32_t op, uint32_t flags, uint64_t from,
		     uint32_t max, struct stk_msg_meta_fsck_resp *r, struct stk_rbuf *rb)
{
	struct stk_msg_meta_fsck_req q = {
	    .cred = f->c->cred, .op = op, .flags = flags, .from = from, .max = max};
	uint8_t req[256];
	struct stk_wbuf w;
	size_t len = 0;
	int rc;

	stk_wbuf_init(&w, req, sizeof(req));
	if (stk_msg_meta_fsck_req_enc(&w, &q))
		return -EINVAL;
	rc = stk_client_meta_call_shard(f->c, shard, 0, STK_OP_META_FSCK, req, w.len, f->resp,
					STK_MAX_PAYLOAD, &len);
	if (rc)
		return rc;
	stk_rbuf_init(rb, f->resp, len);
	return stk_msg_meta_fsck_resp_dec(rb, r) ? -EIO : 0;
}

static int load_files(struct fsck *f, unsigned shard, struct pass *p)
{
	struct stk_msg_meta_fsck_resp r = {.next = 0};
	struct stk_rbuf rb;
	int rc;

	do {
		rc = meta_fsck(f, shard, STK_FSCK_FILES, 0, r.next, STK_FSCK_FILES_MAX, &r, &rb);
		for (uint32_t i = 0; rc == 0 && i < r.n; i++) {
			struct stk_msg_fsck_file m;
			struct file *fl;

			rc = grow((void **)&p->files, &p->capfiles, p->nfiles, sizeof(*p->files));
			if (rc)
				break;
			if (stk_msg_fsck_file_dec(&rb, &m) || m.nalloc > 64) {
				rc = -EIO;
				break;
			}
			fl = &p->files[p->nfiles++];
			fl->a = m.attr;
			fl->exact = m.exact;
			fl->nalloc = m.nalloc;
			fl->alloc = calloc(m.nalloc ? m.nalloc : 1, sizeof(*fl->alloc));
			if (!fl->alloc) {
				rc = -ENOMEM;
				break;
			}
			for (uint32_t k = 0; k < m.nalloc; k++) {
				struct stk_msg_fsck_range g;

				if (stk_msg_fsck_range_dec(&rb, &g)) {
					rc = -EIO;
					break;
				}
				fl->alloc[k][0] = g.first;
				fl->alloc[k][1] = g.end;
			}
		}
		progress(f, "fsck: %zu files listed", p->nfiles);
	} while (rc == 0 && !r.done);
	return rc;
}

static int load_purging(struct fsck *f, unsigned shard, struct pass *p)
{
	struct stk_msg_meta_fsck_resp r = {.next = 0};
	struct stk_rbuf rb;
	int rc;

	do {
		rc = meta_fsck(f, shard, STK_FSCK_PURGES, 0, r.next, STK_SYNC_LIST_MAX, &r, &rb);
		for (uint32_t i = 0; rc == 0 && i < r.n; i++) {
			rc = grow((void **)&p->purging, &p->cappurging, p->npurging,
				  sizeof(*p->purging));
			if (rc == 0)
				p->purging[p->npurging++] = stk_get_u64(&rb);
		}
		if (rc == 0 && rb.err)
			rc = -EIO;
	} while (rc == 0 && !r.done);
	return rc;
}

/* Every chunk of target t (on the node at addr), into p->copies. */
static int list_target(struct fsck *f, struct pass *p, uint32_t t, const char *addr, uint32_t nth,
		       uint32_t of)
{
	struct stk_msg_stor_fsck_list_resp r = {.from_start = 1};
	size_t cap = 64 + (size_t)STK_SYNC_LIST_MAX * 48;
	uint8_t req[128], *resp = malloc(cap);
	struct stk_conn *conn = NULL;
	int rc;

	if (!resp)
		return -ENOMEM;
	rc = stk_conn_connect(addr, STOR_CONNECT_MS, &conn);
	while (rc == 0) {
		struct stk_msg_stor_fsck_list_req q = {.target_id = t,
						       .bucket = r.bucket,
						       .ino = r.ino,
						       .idx = r.idx,
						       .from_start = r.from_start,
						       .max = STK_SYNC_LIST_MAX};
		struct stk_rpc rpc;
		struct stk_wbuf w;
		struct stk_rbuf rb;

		stk_wbuf_init(&w, req, sizeof(req));
		stk_msg_stor_fsck_list_req_enc(&w, &q);
		memset(&rpc, 0, sizeof(rpc));
		stk_rpc_prepare(&rpc, STK_OP_STOR_FSCK_LIST, &w, resp, cap);
		rc = stk_rpc_call(conn, &rpc);
		if (rc)
			break;
		stk_rbuf_init(&rb, resp, rpc.resp_len);
		if (stk_msg_stor_fsck_list_resp_dec(&rb, &r)) {
			rc = -EIO;
			break;
		}
		for (uint32_t i = 0; rc == 0 && i < r.n; i++) {
			struct stk_msg_fsck_chunk m;

			rc = grow((void **)&p->copies, &p->capcopies, p->ncopies,
				  sizeof(*p->copies));
			if (rc)
				break;
			if (stk_msg_fsck_chunk_dec(&rb, &m)) {
				rc = -EIO;
				break;
			}
			p->copies[p->ncopies++] = (struct copy){.ino = m.ino,
								.idx = m.idx,
								.target = t,
								.version = m.version,
								.len = m.len,
								.digest = m.digest,
								.age = r.now_sec - m.mtime_sec};
		}
		progress(f, "fsck: target %u (%u of %u): bucket %u of 256, %zu chunks", t, nth, of,
			 r.done ? 256 : r.bucket, p->ncopies);
		if (r.done)
			break;
	}
	if (conn)
		stk_conn_close(conn);
	free(resp);
	return rc;
}

static int copy_cmp(const void *a, const void *b)
{
	const struct copy *x = a, *y = b;

	if (x->ino != y->ino)
		return x->ino < y->ino ? -1 : 1;
	if (x->idx != y->idx)
		return x->idx < y->idx ? -1 : 1;
	return (x->target > y->target) - (x->target < y->target);
}

static int serves(const struct stk_rt_target *t)
{
	return t && (t->state == STK_TARGET_SERVING || t->state == STK_TARGET_FULL);
}

static int file_cmp(const void *a, const void *b)
{
	uint64_t x = ((const struct file *)a)->a.ino, y = ((const struct file *)b)->a.ino;

	return (x > y) - (x < y);
}

/* Lists what every shard and every serving target hold now. */
static int pass_load(struct fsck *f, struct pass *p)
{
	int rc = 0;

	memset(p, 0, sizeof(*p));
	for (unsigned i = 0; rc == 0 && i < f->nsh; i++) {
		rc = load_files(f, f->sh[i].id, p);
		if (rc == 0)
			rc = load_purging(f, f->sh[i].id, p);
	}
	/* Each shard lists in inode order; their numbers' ranges are apart, but sort. */
	if (rc == 0 && p->nfiles)
		qsort(p->files, p->nfiles, sizeof(*p->files), file_cmp);
	if (rc == 0)
		rc = stk_client_refresh_routing(f->c);
	if (rc)
		return rc;
	/* A copy of the table: the client's may change under us. */
	{
		uint8_t *buf = malloc(STK_MAX_PAYLOAD);
		struct stk_wbuf w;
		struct stk_rbuf r;

		if (!buf)
			return -ENOMEM;
		stk_wbuf_init(&w, buf, STK_MAX_PAYLOAD);
		pthread_rwlock_rdlock(&f->c->rt_lock);
		rc = stk_routing_encode(&w, &f->c->rt);
		pthread_rwlock_unlock(&f->c->rt_lock);
		stk_rbuf_init(&r, buf, w.len);
		if (rc == 0)
			rc = stk_routing_decode(&r, &p->rt);
		free(buf);
		if (rc)
			return rc;
	}
	for (uint32_t i = 0; rc == 0 && i < p->rt.ntargets; i++) {
		const struct stk_rt_target *t = &p->rt.targets[i];
		const struct stk_rt_node *n = stk_routing_node(&p->rt, t->node_id);

		/* Offline: unreachable; wiping: its chunks go anyway; syncing: catching up. */
		if (!serves(t) || !n) {
			p->targets_skipped++;
			continue;
		}
		rc = list_target(f, p, t->id, n->addr, i + 1, p->rt.ntargets);
		if (rc)
			stk_error("fsck: listing target %u on %s: %s", t->id, n->addr,
				  stk_strerror(rc));
		else
			p->targets_listed++;
	}
	if (rc == 0 && p->ncopies) /* qsort wants an array, even of none */
		qsort(p->copies, p->ncopies, sizeof(*p->copies), copy_cmp);
	return rc;
}

/* ---- comparing ---- */

static const struct file *file_find(const struct pass *p, uint64_t ino)
{
	size_t lo = 0, hi = p->nfiles;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (p->files[mid].a.ino == ino)
			return &p->files[mid];
		if (p->files[mid].a.ino < ino)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

static int u64_in(const uint64_t *v, size_t n, uint64_t x)
{
	size_t lo = 0, hi = n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (v[mid] == x)
			return 1;
		if (v[mid] < x)
			lo = mid + 1;
		else
			hi = mid;
	}
	return 0;
}

static int u64_cmp(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return (x > y) - (x < y);
}

/* The first copy of (ino, idx), or p->ncopies. */
static size_t copies_of(const struct pass *p, uint64_t ino, uint32_t idx)
{
	size_t lo = 0, hi = p->ncopies;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		const struct copy *c = &p->copies[mid];

		if (c->ino < ino || (c->ino == ino && c->idx < idx))
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

static uint64_t mix(uint64_t h, uint64_t v)
{
	h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
	return h;
}

static int add(struct fsck *f, const struct dprob *d, int first)
{
	if (!first) {
		/* The second pass confirms a first-pass problem that it sees alike. */
		for (size_t i = 0; i < f->ndp; i++)
			if (f->dp[i].kind == d->kind && f->dp[i].ino == d->ino &&
			    f->dp[i].idx == d->idx && f->dp[i].sig == d->sig) {
				f->dp[i].confirmed = 1;
				return 0;
			}
		return 0;
	}
	if (grow((void **)&f->dp, &f->capdp, f->ndp, sizeof(*f->dp)))
		return -ENOMEM;
	f->dp[f->ndp++] = *d;
	return 0;
}

static int shard_listed(const struct fsck *f, unsigned id)
{
	for (unsigned i = 0; i < f->nsh; i++)
		if (f->sh[i].id == id)
			return 1;
	return 0;
}

/* The chunks of inodes no shard knows (nor purges). */
static int find_garbage(struct fsck *f, const struct pass *p, int first)
{
	int rc = 0;

	for (size_t i = 0, j; rc == 0 && i < p->ncopies; i = j) {
		struct dprob d = {.kind = P_GARBAGE, .ino = p->copies[i].ino};
		int64_t youngest = INT64_MAX;

		for (j = i; j < p->ncopies && p->copies[j].ino == d.ino; j++) {
			d.chunks++;
			d.bytes += p->copies[j].len;
			d.sig =
			    mix(d.sig, ((uint64_t)p->copies[j].idx << 32) | p->copies[j].target);
			if (p->copies[j].age < youngest)
				youngest = p->copies[j].age;
		}
		if (file_find(p, d.ino) || u64_in(p->purging, p->npurging, d.ino))
			continue;
		/*
		 * The shard the inode's number names was listed above and holds no such
		 * inode. A number of a shard the cluster does not have (yet) is left
		 * alone: no shard could be asked about it.
		 */
		if (!shard_listed(f, stk_ino_shard(d.ino)))
			continue;
		if (youngest < f->grace) {
			if (first)
				f->young++;
			continue;
		}
		rc = add(f, &d, first);
	}
	return rc;
}

/* A file's written chunks against the copies of its chain's working members. */
static int check_file(struct fsck *f, const struct pass *p, const struct file *fl, int first)
{
	uint32_t chains[STK_MAX_STRIPE];
	uint64_t cs = fl->a.layout.chunk_size, nchunks;
	int rc = 0;

	if (stk_layout_check(&fl->a.layout) || fl->a.size == 0)
		return 0;
	stk_layout_chains(&fl->a.layout, chains);
	nchunks = (fl->a.size + cs - 1) / cs;
	for (uint32_t r = 0; rc == 0 && r < fl->nalloc; r++) {
		uint64_t end = STK_MIN((uint64_t)fl->alloc[r][1], nchunks);

		for (uint64_t idx = fl->alloc[r][0]; rc == 0 && idx < end; idx++) {
			uint32_t chain =
			    stk_layout_chunk_chain(&fl->a.layout, chains, (uint32_t)idx);
			const struct stk_rt_chain *ch = stk_routing_chain(&p->rt, chain);
			struct dprob d = {.ino = fl->a.ino, .idx = (uint32_t)idx, .chain = chain};
			size_t k0 = copies_of(p, fl->a.ino, (uint32_t)idx), k;
			unsigned working = 0, have = 0, differ = 0;
			const struct copy *ref = NULL;

			if (!ch)
				continue;
			d.sig = mix(fl->a.size,
				    (uint64_t)fl->a.mtime_sec * 1000000000ull + fl->a.mtime_nsec);
			for (unsigned m = 0; m < ch->ntargets; m++) {
				const struct copy *c = NULL;

				if (!serves(stk_routing_target(&p->rt, ch->targets[m])))
					continue;
				working++;
				for (k = k0; k < p->ncopies && p->copies[k].ino == fl->a.ino &&
					     p->copies[k].idx == idx;
				     k++)
					if (p->copies[k].target == ch->targets[m])
						c = &p->copies[k];
				d.sig = mix(d.sig, c ? (c->version << 32) ^ c->digest : 0);
				if (!c)
					continue;
				have++;
				if (ref && (ref->version != c->version ||
					    ref->digest != c->digest || ref->len != c->len))
					differ = 1;
				ref = ref ? ref : c;
			}
			if (working == 0)
				continue; /* nothing to compare with: the chain does not serve */
			d.chunks = have;
			if (have == 0 && fl->exact)
				d.kind = P_MISSING;
			else if (have && (have < working || differ))
				d.kind = P_REPLICAS;
			else
				continue;
			rc = add(f, &d, first);
		}
	}
	return rc;
}

static int pass_compare(struct fsck *f, struct pass *p, int first)
{
	int rc;

	if (p->npurging)
		qsort(p->purging, p->npurging, sizeof(*p->purging), u64_cmp);
	rc = find_garbage(f, p, first);
	for (size_t i = 0; rc == 0 && i < p->nfiles; i++)
		rc = check_file(f, p, &p->files[i], first);
	return rc;
}

/* ---- repairing garbage ---- */

static int truncate_on(struct fsck *f, const struct stk_routing *rt, const struct stk_rt_chain *ch,
		       uint64_t ino)
{
	struct stk_msg_stor_truncate_req m = {.chain_id = ch->id,
					      .chain_ver = ch->version,
					      .ino = ino,
					      .size = 0,
					      .chunk_size = 1u << 20};
	uint8_t req[128], resp[64];
	struct stk_conn *conn = NULL;
	const struct stk_rt_node *n = NULL;
	struct stk_ns_id ns;
	struct stk_rpc rpc;
	struct stk_wbuf w;
	int rc;

	/* The head: the first member that changes reach (it passes them down). */
	for (unsigned i = 0; i < ch->ntargets && !n; i++) {
		const struct stk_rt_target *t = stk_routing_target(rt, ch->targets[i]);

		if (t && (serves(t) || t->state == STK_TARGET_SYNCING))
			n = stk_routing_node(rt, t->node_id);
	}
	if (!n)
		return -EAGAIN;
	rc = stk_client_meta_ns(f->c, &ns);
	if (rc)
		return rc;
	m.ns_hi = ns.hi;
	m.ns_lo = ns.lo;
	stk_wbuf_init(&w, req, sizeof(req));
	stk_msg_stor_truncate_req_enc(&w, &m);
	rc = stk_conn_connect(n->addr, STOR_CONNECT_MS, &conn);
	if (rc)
		return rc;
	memset(&rpc, 0, sizeof(rpc));
	stk_rpc_prepare(&rpc, STK_OP_STOR_TRUNCATE, &w, resp, sizeof(resp));
	rc = stk_rpc_call(conn, &rpc);
	stk_conn_close(conn);
	return rc;
}

/* Removes garbage inode ino from every chain one of whose members holds some of it. */
static int remove_garbage(struct fsck *f, const struct pass *p, uint64_t ino)
{
	int rc = 0;

	for (uint32_t c = 0; c < p->rt.nchains; c++) {
		const struct stk_rt_chain *ch = &p->rt.chains[c];
		int holds = 0;

		for (size_t k = copies_of(p, ino, 0); k < p->ncopies && p->copies[k].ino == ino;
		     k++)
			for (unsigned m = 0; m < ch->ntargets; m++)
				holds |= p->copies[k].target == ch->targets[m];
		if (!holds)
			continue;
		int r = truncate_on(f, &p->rt, ch, ino);

		if (r && !rc)
			rc = r;
	}
	return rc;
}

/* ---- references between shards ---- */

/* One page of XENTRIES (after the entry `after`) or XDIRS (from inode `from`). */
static int xrefs_page(struct fsck *f, unsigned shard, uint32_t op, uint64_t from,
		      const struct stk_msg_fsck_xref *after, struct stk_msg_meta_fsck_resp *r,
		      struct stk_rbuf *rb)
{
	struct stk_msg_meta_fsck_req q = {
	    .cred = f->c->cred, .op = op, .from = from, .max = 1024};
	uint8_t req[512];
	struct stk_wbuf w;
	size_t len = 0;
	int rc;

	stk_wbuf_init(&w, req, sizeof(req));
	stk_msg_meta_fsck_req_enc(&w, &q);
	if (op == STK_FSCK_XENTRIES || op == STK_FSCK_XNAMES)
		stk_msg_fsck_xref_enc(&w, after);
	if (w.err)
		return -EINVAL;
	rc = stk_client_meta_call_shard(f->c, shard, 0, STK_OP_META_FSCK, req, w.len, f->resp,
					STK_MAX_PAYLOAD, &len);
	if (rc)
		return rc;
	stk_rbuf_init(rb, f->resp, len);
	return stk_msg_meta_fsck_resp_dec(rb, r) ? -EIO : 0;
}

/* Every shard's XENTRIES or XDIRS into s. */
static int xrefs_load(struct fsck *f, uint32_t op, struct xset *s)
{
	int rc = 0;

	s->n = 0;
	for (unsigned i = 0; rc == 0 && i < f->nsh; i++) {
		struct stk_msg_meta_fsck_resp r = {.next = 0};
		struct stk_msg_fsck_xref m = {0};
		struct stk_rbuf rb;

		do {
			rc = xrefs_page(f, f->sh[i].id, op, r.next, &m, &r, &rb);
			for (uint32_t k = 0; rc == 0 && k < r.n; k++) {
				struct xref *x;

				rc = grow((void **)&s->v, &s->cap, s->n, sizeof(*s->v));
				if (rc)
					break;
				if (stk_msg_fsck_xref_dec(&rb, &m)) {
					rc = -EIO;
					break;
				}
				x = &s->v[s->n++];
				x->ino = m.ino;
				x->parent = m.parent;
				x->shard = f->sh[i].id;
				x->covered = m.covered;
				memcpy(x->name, m.name, sizeof(x->name));
			}
		} while (rc == 0 && !r.done);
	}
	return rc;
}

static int xref_cmp(const void *a, const void *b)
{
	uint64_t x = ((const struct xref *)a)->ino, y = ((const struct xref *)b)->ino;

	return (x > y) - (x < y);
}

/* A reference to ino in s, sorted by xref_cmp. */
static const struct xref *xref_of(const struct xset *s, uint64_t ino)
{
	size_t lo = 0, hi = s->n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (s->v[mid].ino == ino)
			return &s->v[mid];
		if (s->v[mid].ino < ino)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

static int xadd(struct fsck *f, const struct xprob *p, int first)
{
	if (!first) {
		for (size_t i = 0; i < f->nxp; i++)
			if (f->xp[i].kind == p->kind && f->xp[i].ino == p->ino &&
			    f->xp[i].parent == p->parent && f->xp[i].found == p->found &&
			    f->xp[i].id == p->id && f->xp[i].seen == p->seen)
				f->xp[i].confirmed = 1;
		return 0;
	}
	if (grow((void **)&f->xp, &f->capxp, f->nxp, sizeof(*f->xp)))
		return -ENOMEM;
	f->xp[f->nxp++] = *p;
	return 0;
}

/*
 * Whether ino's shard found it unreached in its own check (it exists, no name on
 * its shard reaches it), and its parent pointer then.
 */
static int unreached_pointer(const struct fsck *f, uint64_t ino, uint64_t *pointer)
{
	for (uint32_t i = 0; i < f->nnsp; i++)
		if (f->nsp[i].kind == STK_FSCK_KIND_UNREACHED && f->nsp[i].ino == ino) {
			*pointer = f->nsp[i].expect;
			return 1;
		}
	return 0;
}

/*
 * Parent pointers across shards: a folder (of d, sorted) whose entry on another
 * shard (in e, sorted) is in another folder than its pointer says. Neither side
 * covered by an intent or a mark; what a second look finds alike counts.
 */
static uint64_t folder_seen(struct fsck *f, uint64_t ino);

static int xparents_look(struct fsck *f, const struct xset *d, const struct xset *e, int first)
{
	int rc = 0;

	for (size_t i = 0; rc == 0 && i < d->n; i++) {
		const struct xref *x = &d->v[i], *y = xref_of(e, x->ino);
		struct xprob p = {
		    .kind = STK_FSCK_PARENT_POINTER, .shard = x->shard, .ino = x->ino};

		if (x->covered || !y || y->covered || y->parent == x->parent)
			continue;
		p.parent = p.expect = y->parent;
		p.found = x->parent;
		p.seen = folder_seen(f, x->ino);
		rc = xadd(f, &p, first);
	}
	return rc;
}

/*
 * Folder ino's ctime now (0 when it does not exist), which every move of it
 * changes (its parent pointer set): a problem of a folder counts only if both
 * looks found it so with the same ctime. A folder moved twice between one look's
 * listings (to the other shard and back, say) can look unreached or its entry
 * dangling in that look; moved again before the next, it is not the same.
 */
static uint64_t folder_seen(struct fsck *f, uint64_t ino)
{
	struct stk_attr a;

	if (stk_ino_getattr(f->c, &f->c->cred, ino, &a))
		return 0;
	return (uint64_t)a.ctime_sec * 1000000000ull + a.ctime_nsec;
}

/* One look: entries, folders, entries again; what does not match, into f->xp. */
static int xshard_look(struct fsck *f, int first)
{
	struct xset e1 = {0}, d = {0}, e2 = {0};
	int rc;

	rc = xrefs_load(f, STK_FSCK_XENTRIES, &e1);
	if (rc == 0)
		rc = xrefs_load(f, STK_FSCK_XDIRS, &d);
	if (rc == 0)
		rc = xrefs_load(f, STK_FSCK_XENTRIES, &e2);
	if (rc == 0 && d.n)
		qsort(d.v, d.n, sizeof(*d.v), xref_cmp);
	if (rc == 0 && e2.n)
		qsort(e2.v, e2.n, sizeof(*e2.v), xref_cmp);
	/* An entry listed before the folders: its folder was there when they were listed. */
	for (size_t i = 0; rc == 0 && i < e1.n; i++) {
		const struct xref *x = &e1.v[i];
		struct xprob p = {.kind = STK_FSCK_DANGLING_ENTRY,
				  .shard = x->shard,
				  .ino = x->ino,
				  .parent = x->parent};

		f->busy += x->covered != 0;
		if (x->covered || xref_of(&d, x->ino))
			continue;
		p.seen = folder_seen(f, x->ino);
		if (unreached_pointer(f, x->ino, &p.found)) {
			/* the folder is there, its pointer at a folder of its own shard */
			p.kind = STK_FSCK_PARENT_POINTER;
			p.shard = stk_ino_shard(x->ino);
			p.expect = x->parent;
			rc = xadd(f, &p, first);
			continue;
		}
		memcpy(p.name, x->name, sizeof(p.name));
		rc = xadd(f, &p, first);
	}
	/* A folder listed before the entries: its entry was there when they were listed. */
	for (size_t i = 0; rc == 0 && i < d.n; i++) {
		const struct xref *x = &d.v[i];
		struct xprob p = {.kind = STK_FSCK_UNREACHED_INODE,
				  .shard = x->shard,
				  .ino = x->ino,
				  .parent = x->parent};

		f->busy += x->covered != 0;
		if (x->covered || xref_of(&e2, x->ino))
			continue;
		p.seen = folder_seen(f, x->ino);
		rc = xadd(f, &p, first);
	}
	if (rc == 0)
		rc = xparents_look(f, &d, &e2, first);
	free(e1.v);
	free(d.v);
	free(e2.v);
	return rc;
}

/*
 * A META_FSCK XPARENT or ADOPT (msg.h) to shard's leader: `from`, then the n
 * u64 of args; ADOPT's fsck_xref into *x.
 */
static int meta_fsck_fix(struct fsck *f, unsigned shard, uint32_t op, uint64_t from,
			 const uint64_t *args, unsigned n, struct stk_msg_fsck_xref *x)
{
	struct stk_msg_meta_fsck_req q = {.cred = f->c->cred, .op = op, .from = from, .max = 1};
	struct stk_msg_meta_fsck_resp r;
	uint8_t req[256];
	struct stk_wbuf w;
	struct stk_rbuf rb;
	size_t len = 0;
	int rc;

	stk_wbuf_init(&w, req, sizeof(req));
	stk_msg_meta_fsck_req_enc(&w, &q);
	for (unsigned i = 0; i < n; i++)
		stk_put_u64(&w, args[i]);
	if (w.err)
		return -EINVAL;
	rc = stk_client_meta_call_shard(f->c, shard, 0, STK_OP_META_FSCK, req, w.len, f->resp,
					STK_MAX_PAYLOAD, &len);
	if (rc)
		return rc;
	stk_rbuf_init(&rb, f->resp, len);
	if (stk_msg_meta_fsck_resp_dec(&rb, &r))
		return -EIO;
	if (x && (r.n != 1 || stk_msg_fsck_xref_dec(&rb, x)))
		return -EIO;
	return 0;
}

/*
 * Reattaches folder ino of `shard`, whose parent pointer is seen and that no name
 * reaches, under shard 1's lost+found (docs/fsck.md). A folder of shard 1: one
 * step there. Another shard's: its pointer is set to lost+found first (fenced by
 * seen and its marks), then shard 1 writes the entry, so that a crash between
 * leaves a folder still unreached (the next fsck's), never a name pointing at
 * nothing. -ENOTDIR: not a folder (shard 1's lost+found names no file of
 * another shard).
 */
static int xreattach(struct fsck *f, unsigned shard, uint64_t ino, uint64_t seen, uint64_t *lf,
		     char *name)
{
	struct stk_msg_fsck_xref x = {0};
	uint64_t args[2];
	int rc;

	if (shard != 1) {
		rc = meta_fsck_fix(f, 1, STK_FSCK_ADOPT, 0, &seen, 1, &x);
		args[0] = seen;
		args[1] = x.parent;
		if (rc == 0)
			rc = meta_fsck_fix(f, shard, STK_FSCK_XPARENT, ino, args, 2, NULL);
		seen = x.parent;
		if (rc)
			return rc;
	}
	rc = meta_fsck_fix(f, 1, STK_FSCK_ADOPT, ino, &seen, 1, &x);
	if (rc == 0) {
		*lf = x.parent;
		snprintf(name, STK_NAME_MAX + 1, "%s", x.name);
	}
	return rc;
}

/*
 * A folder its own shard found unreached, since its pointer was at a folder of
 * that shard, is reached now that its pointer is at the folder of another shard
 * whose entry names it: that problem is repaired too.
 */
static void reached_after_all(struct fsck *f, uint64_t ino)
{
	for (uint32_t i = 0; i < f->nnsp; i++) {
		struct stk_msg_fsck_problem *q = &f->nsp[i];

		if (q->kind != STK_FSCK_KIND_UNREACHED || q->ino != ino || q->repaired)
			continue;
		q->repaired = 1;
		f->ns.repaired++;
		for (unsigned k = 0; k < f->nsh; k++)
			if (f->sh[k].id == stk_ino_shard(ino))
				f->sh[k].ns.repaired++;
	}
}

/* The repair of a parent pointer or an unreached folder found across shards. */
static void xrepair_link(struct fsck *f, struct xprob *p)
{
	uint64_t args[2] = {p->found, p->expect}, lf = 0;
	int r;

	if (p->kind == STK_FSCK_PARENT_POINTER) {
		r = meta_fsck_fix(f, p->shard, STK_FSCK_XPARENT, p->ino, args, 2, NULL);
		if (r)
			stk_warn("fsck: setting the parent pointer of folder %llu: %s",
				 (unsigned long long)p->ino, stk_strerror(r));
		p->repaired = r == 0;
		if (r == 0)
			reached_after_all(f, p->ino);
		return;
	}
	r = xreattach(f, p->shard, p->ino, p->parent, &lf, p->name);
	if (r)
		stk_warn("fsck: reattaching folder %llu under lost+found: %s",
			 (unsigned long long)p->ino, stk_strerror(r));
	else
		p->parent = lf;
	p->repaired = r == 0;
}

/* Namespace problem q (of shard's check) repaired by stk_fsck itself. */
static void ns_repaired(struct fsck *f, struct stk_msg_fsck_problem *q, uint64_t parent)
{
	unsigned shard = stk_ino_shard(q->ino);

	q->repaired = 1;
	q->parent = parent;
	f->ns.repaired++;
	for (unsigned k = 0; k < f->nsh; k++)
		if (f->sh[k].id == shard)
			f->sh[k].ns.repaired++;
}

/*
 * The unreached files of shard (n of them, indexes into f->nsp): gathered on
 * their shard into a new folder whose pointer is at lost+found (GATHER), which
 * shard 1 then names "#FOLDER" in lost+found (ADOPT). Each file's problem then
 * names it "#FOLDER/#INO", under lost+found.
 */
static void gather_files(struct fsck *f, unsigned shard, const uint32_t *idx, size_t n)
{
	struct stk_msg_meta_fsck_req q = {.cred = f->c->cred, .op = STK_FSCK_GATHER};
	struct stk_msg_fsck_xref x = {0};
	struct stk_msg_meta_fsck_resp r;
	size_t cap = 64 + 8 * (size_t)n, len = 0;
	uint8_t *req = malloc(cap);
	uint64_t *got = NULL, lf, holder;
	struct stk_wbuf w;
	struct stk_rbuf rb;
	int rc;

	if (!req)
		return;
	rc = meta_fsck_fix(f, 1, STK_FSCK_ADOPT, 0, &(uint64_t){0}, 1, &x);
	lf = x.parent;
	q.from = lf;
	q.max = (uint32_t)n;
	stk_wbuf_init(&w, req, cap);
	stk_msg_meta_fsck_req_enc(&w, &q);
	for (size_t i = 0; i < n; i++)
		stk_put_u64(&w, f->nsp[idx[i]].ino);
	if (rc == 0 && w.err)
		rc = -EINVAL;
	if (rc == 0)
		rc = stk_client_meta_call_shard(f->c, shard, 0, STK_OP_META_FSCK, req, w.len,
						f->resp, STK_MAX_PAYLOAD, &len);
	stk_rbuf_init(&rb, f->resp, len);
	if (rc == 0 && (stk_msg_meta_fsck_resp_dec(&rb, &r) || r.n > n))
		rc = -EIO;
	holder = rc == 0 ? r.next : 0;
	if (rc == 0 && r.n && (got = calloc(r.n, sizeof(*got))) == NULL)
		rc = -ENOMEM;
	for (uint32_t i = 0; rc == 0 && i < r.n; i++)
		got[i] = stk_get_u64(&rb);
	if (rc == 0 && rb.err)
		rc = -EIO;
	/* the folder unnamed till now: the next fsck reattaches it, should this fail */
	if (rc == 0 && holder)
		rc = meta_fsck_fix(f, 1, STK_FSCK_ADOPT, holder, &lf, 1, &x);
	if (rc)
		stk_warn("fsck: gathering the unreached files of shard %u for lost+found: %s",
			 shard, stk_strerror(rc));
	for (uint32_t i = 0; rc == 0 && i < r.n; i++)
		for (size_t k = 0; k < n; k++) {
			struct stk_msg_fsck_problem *p = &f->nsp[idx[k]];

			if (p->ino != got[i] || p->repaired)
				continue;
			ns_repaired(f, p, holder);
			snprintf(p->name, sizeof(p->name), "%s/#%llu", x.name,
				 (unsigned long long)p->ino);
		}
	free(got);
	free(req);
}

/*
 * The unreached inodes each shard's own check found and left: every one of
 * shards 2.. (shard 1 holds lost+found) and the folders of shard 1 (an entry of
 * another shard may name one whose pointer is wrong). Those no entry of another
 * shard names are reattached: a folder as one found across shards is, the files
 * of a shard 2.. gathered (gather_files).
 */
static int fsck_reattach_shards(struct fsck *f)
{
	struct xset e = {0};
	uint32_t *files = NULL;
	size_t nfiles = 0, capfiles = 0;
	int rc = 0, loaded = 0;

	for (uint32_t i = 0; rc == 0 && f->repair && i < f->nnsp; i++) {
		struct stk_msg_fsck_problem *q = &f->nsp[i];
		unsigned shard = stk_ino_shard(q->ino);
		uint64_t lf = 0;
		int r;

		/* shard 1 reattached its own but folders (named on another shard?) */
		if (q->kind != STK_FSCK_KIND_UNREACHED || q->repaired)
			continue;
		/* named on another shard after all (its pointer was wrong): not lost */
		if (!loaded++) {
			rc = xrefs_load(f, STK_FSCK_XENTRIES, &e);
			if (rc)
				break;
			if (e.n)
				qsort(e.v, e.n, sizeof(*e.v), xref_cmp);
		}
		if (xref_of(&e, q->ino))
			continue;
		r = xreattach(f, shard, q->ino, q->expect, &lf, q->name);
		if (r == -ENOTDIR && shard == 1)
			continue; /* a file its check could not reattach: it said why */
		if (r == -ENOTDIR) {
			/* a file: gathered below, all of its shard's at once */
			q->name[0] = 0;
			rc = grow((void **)&files, &capfiles, nfiles, sizeof(*files));
			if (rc == 0)
				files[nfiles++] = i;
			continue;
		}
		if (r) {
			stk_warn("fsck: reattaching folder %llu under lost+found: %s",
				 (unsigned long long)q->ino, stk_strerror(r));
			q->name[0] = 0;
			continue;
		}
		ns_repaired(f, q, lf);
	}
	/* f->nsp lists shard by shard: each shard's files are one run of files */
	for (size_t i = 0, j; rc == 0 && i < nfiles; i = j) {
		unsigned shard = stk_ino_shard(f->nsp[files[i]].ino);

		for (j = i; j < nfiles && stk_ino_shard(f->nsp[files[j]].ino) == shard; j++)
			;
		gather_files(f, shard, files + i, j - i);
	}
	free(files);
	free(e.v);
	return rc;
}

/* Every shard's XRECS into s. */
static int xrecs_load(struct fsck *f, struct rset *s)
{
	int rc = 0;

	s->n = 0;
	for (unsigned i = 0; rc == 0 && i < f->nsh; i++) {
		struct stk_msg_meta_fsck_resp r = {.next = 0};
		struct stk_rbuf rb;

		do {
			rc = meta_fsck(f, f->sh[i].id, STK_FSCK_XRECS, 0, r.next, 1024, &r, &rb);
			for (uint32_t k = 0; rc == 0 && k < r.n; k++) {
				struct stk_msg_fsck_xrec m;

				rc = grow((void **)&s->v, &s->cap, s->n, sizeof(*s->v));
				if (rc == 0 && stk_msg_fsck_xrec_dec(&rb, &m))
					rc = -EIO;
				if (rc)
					break;
				s->v[s->n++] = (struct xrec){.ino = m.ino,
							     .id = m.id,
							     .lister = f->sh[i].id,
							     .shard = m.shard,
							     .kind = (char)m.kind,
							     .covered = m.covered};
			}
		} while (rc == 0 && !r.done);
	}
	return rc;
}

static int xrec_cmp(const void *a, const void *b)
{
	const struct xrec *x = a, *y = b;

	if (x->ino != y->ino)
		return (x->ino > y->ino) - (x->ino < y->ino);
	if (x->lister != y->lister)
		return (x->lister > y->lister) - (x->lister < y->lister);
	return (x->kind > y->kind) - (x->kind < y->kind);
}

/* The record `kind` of file ino that shard `lister` holds, in s (sorted by xrec_cmp). */
static const struct xrec *xrec_of(const struct rset *s, unsigned lister, char kind, uint64_t ino)
{
	struct xrec key = {.ino = ino, .lister = lister, .kind = kind};
	const struct xrec *x = s->n ? bsearch(&key, s->v, s->n, sizeof(*s->v), xrec_cmp) : NULL;

	return x;
}

/* Whether shard `lister` names file ino (n sorted by xref_cmp). */
static int xnamed_on(const struct xset *n, unsigned lister, uint64_t ino)
{
	const struct xref *x = xref_of(n, ino);

	if (!x)
		return 0;
	while (x > n->v && x[-1].ino == ino)
		x--;
	for (; x < n->v + n->n && x->ino == ino; x++)
		if (x->shard == lister)
			return 1;
	return 0;
}

/*
 * Which of the n files named off their home their home lacks (lack[i] 1: it
 * answered -ENOENT), asked STK_GETATTRS_MAX at a time, one by one of a meta
 * without META_GETATTRS. Any other answer counts as there: nothing is reported.
 */
static int homes_lack(struct fsck *f, const struct xset *names, uint8_t *lack)
{
	enum { B = STK_GETATTRS_MAX };
	struct stk_attr *a = malloc(B * sizeof(*a));
	uint64_t *inos = malloc(B * sizeof(*inos));
	int *rcs = malloc(B * sizeof(*rcs));
	int rc = a && inos && rcs ? 0 : -ENOMEM;

	for (size_t i = 0; rc == 0 && i < names->n; i += B) {
		uint32_t k = (uint32_t)STK_MIN((size_t)B, names->n - i);
		int r;

		for (uint32_t j = 0; j < k; j++)
			inos[j] = names->v[i + j].ino;
		r = stk_ino_getattrs(f->c, &f->c->cred, inos, k, a, rcs);
		for (uint32_t j = 0; r && j < k; j++)
			rcs[j] = r == -ENOSYS ? stk_ino_getattr(f->c, &f->c->cred, inos[j], &a[j])
					      : 0; /* not known: none is reported gone */
		for (uint32_t j = 0; j < k; j++)
			lack[i + j] = rcs[j] == -ENOENT;
	}
	free(a);
	free(inos);
	free(rcs);
	return rc;
}

/*
 * One look at the names of files off their home (docs/meta-shards.md): every
 * shard's records, its entries naming other shards' files, its records again.
 * An entry on D naming file F of H needs H's 'X' record of it (holder D: F's
 * link count counts it) and D's 'R' record; it is listed before the records it
 * is looked up in, so that a name that existed then has its records now unless
 * it went meanwhile (a second look tells). An 'X' record on H needs D's name of
 * the file, or D's release of it ('L') or its 'R' (what a rename over the name
 * replaces keeps its 'R' until its step 4); it is listed before the names.
 * Anything an intent or a mark is about is the protocol's and left alone.
 */
static int xnames_look(struct fsck *f, int first)
{
	struct rset r1 = {0}, r2 = {0};
	struct xset names = {0};
	uint64_t *gone = NULL; /* files named off home, 'X' and all, their home lacks */
	uint8_t *lack = NULL;  /* names[i]'s file: its home lacks it */
	size_t ngone = 0, capgone = 0;
	int rc;

	f->busy = 0;
	rc = xrecs_load(f, &r1);
	if (rc == 0)
		rc = xrefs_load(f, STK_FSCK_XNAMES, &names);
	if (rc == 0)
		rc = xrecs_load(f, &r2);
	if (rc == -EINVAL) {
		/* a meta from before XNAMES: the check cannot be made */
		if (!f->xnames_old++)
			stk_warn("fsck: a shard's meta node does not list the names of files off "
				 "their home (an older version): they are not checked");
		rc = 0;
		goto out;
	}
	if (rc)
		goto out;
	if (r1.n)
		qsort(r1.v, r1.n, sizeof(*r1.v), xrec_cmp);
	if (r2.n)
		qsort(r2.v, r2.n, sizeof(*r2.v), xrec_cmp);
	lack = calloc(names.n ? names.n : 1, 1);
	rc = lack ? homes_lack(f, &names, lack) : -ENOMEM;
	for (size_t i = 0; rc == 0 && i < names.n; i++) {
		const struct xref *e = &names.v[i];
		unsigned home = stk_ino_shard(e->ino);
		const struct xrec *x = xrec_of(&r2, home, 'X', e->ino);
		const struct xrec *x1 = xrec_of(&r1, home, 'X', e->ino);
		const struct xrec *r = xrec_of(&r2, e->shard, 'R', e->ino);
		struct xprob p = {.kind = STK_FSCK_NAME_OFF_HOME,
				  .shard = e->shard,
				  .ino = e->ino,
				  .parent = e->parent,
				  .found = home};

		if ((e->covered & STK_FSCK_XCOVERED) || (x && x->covered) || (x1 && x1->covered)) {
			f->busy++;
			continue;
		}
		if (!x || x->shard != e->shard) {
			/*
			 * Counted before the names were listed, not after: the name went
			 * meanwhile (renamed home, released), its 'X' with it.
			 */
			if (x1 && x1->shard == e->shard) {
				f->busy++;
				continue;
			}
			p.expect |= 1; /* its home does not count it */
		}
		if (!(e->covered & STK_FSCK_XHAS_R))
			p.expect |= 2; /* this shard does not know where it lives */
		if (!p.expect || ((p.expect & 1) && !x)) {
			/* no such file at home at all, records or not: the name dangles */
			if (lack[i]) {
				p.kind = STK_FSCK_DANGLING_ENTRY;
				p.expect = p.found = 0;
				if (x && x->shard == e->shard &&
				    grow((void **)&gone, &capgone, ngone, sizeof(*gone)) == 0)
					gone[ngone++] = e->ino;
			} else if (!p.expect) {
				continue;
			}
		}
		/* the records' id: the one either has, else one of fsck's own */
		p.id = r && r->shard == home	   ? r->id
		       : x && x->shard == e->shard ? x->id
						   : (1ull << 63) | e->ino;
		memcpy(p.name, e->name, sizeof(p.name));
		rc = xadd(f, &p, first);
	}
	if (names.n)
		qsort(names.v, names.n, sizeof(*names.v), xref_cmp);
	for (size_t i = 0; rc == 0 && i < r1.n; i++) {
		const struct xrec *x = &r1.v[i];
		struct xprob p = {.kind = STK_FSCK_STALE_NAME_RECORD,
				  .shard = x->lister,
				  .ino = x->ino,
				  .found = x->shard,
				  .id = x->id};
		const struct xrec *ra, *rb, *x2;
		int listed = 0;

		if (x->kind != 'X')
			continue;
		/*
		 * The same record listed after the names too, else the name it counted
		 * went meanwhile with it (renamed home, released) and nothing is stale.
		 */
		x2 = xrec_of(&r2, x->lister, 'X', x->ino);
		if (!x2 || x2->id != x->id || x2->shard != x->shard)
			continue;
		if (x->covered || x2->covered) {
			f->busy++;
			continue;
		}
		for (unsigned k = 0; k < f->nsh; k++)
			listed |= f->sh[k].id == x->shard;
		if (xnamed_on(&names, x->shard, x->ino)) {
			/* named, of a file its home lacks: the name dangles (above), and this
			 * record of it goes too, alone (the name's 'R' goes with the name) */
			for (size_t k = 0; k < ngone && rc == 0; k++)
				if (gone[k] == x->ino)
					rc = xadd(f, &p, first);
			continue;
		}
		if (!listed || xrec_of(&r1, x->shard, 'L', x->ino) ||
		    xrec_of(&r2, x->shard, 'L', x->ino))
			continue;
		/*
		 * An 'R' without its name: what a rename over the name (a mark there)
		 * keeps till its step 4, else left over, to go with the 'X'.
		 */
		ra = xrec_of(&r1, x->shard, 'R', x->ino);
		rb = xrec_of(&r2, x->shard, 'R', x->ino);
		if ((ra && ra->covered) || (rb && rb->covered)) {
			f->busy++;
			continue;
		}
		if (rb || ra) {
			p.expect = 1; /* a leftover 'R' there too */
			p.rid = (rb ? rb : ra)->id;
		}
		rc = xadd(f, &p, first);
	}
	/*
	 * An 'R' on D (listed before the names and after) whose name D no longer
	 * has, nor releases, that no rename over the name covers, and of which H has
	 * no 'X' (an 'X' is the loop above's): a leftover record, counted nowhere.
	 */
	for (size_t i = 0; rc == 0 && i < r1.n; i++) {
		const struct xrec *x = &r1.v[i], *rb;
		struct xprob p = {.kind = STK_FSCK_STALE_NAME_RECORD,
				  .shard = x->lister,
				  .ino = x->ino,
				  .expect = 2,
				  .found = x->shard,
				  .id = x->id};

		if (x->kind != 'R' || x->covered)
			continue;
		rb = xrec_of(&r2, x->lister, 'R', x->ino);
		if (!rb || rb->covered || rb->id != x->id || xnamed_on(&names, x->lister, x->ino) ||
		    xrec_of(&r2, x->lister, 'L', x->ino) || xrec_of(&r1, x->shard, 'X', x->ino) ||
		    xrec_of(&r2, x->shard, 'X', x->ino))
			continue;
		rc = xadd(f, &p, first);
	}
out:
	free(r1.v);
	free(r2.v);
	free(names.v);
	free(gone);
	free(lack);
	return rc;
}

/* A META_FSCK XDROP (msg.h): the entry in folder parent of shard naming ino goes. */
static int xdrop(struct fsck *f, unsigned shard, uint64_t parent, uint64_t ino)
{
	struct stk_msg_meta_fsck_req q = {
	    .cred = f->c->cred, .op = STK_FSCK_XDROP, .from = parent, .max = 1};
	uint8_t req[256];
	struct stk_wbuf w;
	size_t len = 0;
	int r;

	stk_wbuf_init(&w, req, sizeof(req));
	stk_msg_meta_fsck_req_enc(&w, &q);
	stk_put_u64(&w, ino);
	if (w.err)
		return -EINVAL;
	r = stk_client_meta_call_shard(f->c, shard, 0, STK_OP_META_FSCK, req, w.len, f->resp,
				       STK_MAX_PAYLOAD, &len);
	if (r)
		stk_warn("fsck: removing the entry of inode %llu in folder %llu: %s",
			 (unsigned long long)ino, (unsigned long long)parent, stk_strerror(r));
	return r;
}

/* A META_FSCK XUNNAME or XRESTORE (msg.h) of file ino to shard's leader. */
static int xname_fix(struct fsck *f, unsigned shard, uint32_t op, uint64_t ino, unsigned other,
		     uint64_t id)
{
	uint64_t args[2] = {other, id};

	return meta_fsck_fix(f, shard, op, ino, args, 2, NULL);
}

/*
 * The repair of a name off home found without its records: D's 'R' written
 * first, then H's 'X' and link (a crash between leaves the name still without
 * H's record: the next fsck's); or of an 'X' record whose name is gone: dropped
 * with its link at H, the file freed or orphaned as an unlink would.
 */
static void xrepair_name(struct fsck *f, struct xprob *p)
{
	unsigned home = stk_ino_shard(p->ino);
	int r = 0;

	if (p->kind == STK_FSCK_DANGLING_ENTRY) {
		/* a name of a file its home does not have: it goes, with its record */
		p->repaired = xdrop(f, p->shard, p->parent, p->ino) == 0;
		return;
	}
	if (p->kind == STK_FSCK_STALE_NAME_RECORD && (p->expect & 2)) {
		/* a leftover 'R' alone, on the name's shard */
		r = xname_fix(f, p->shard, STK_FSCK_XUNNAME, p->ino, (unsigned)p->found, p->id);
		if (r)
			stk_warn("fsck: dropping shard %u's record of a name of file %llu: %s",
				 p->shard, (unsigned long long)p->ino, stk_strerror(r));
		p->repaired = r == 0;
		return;
	}
	if (p->kind == STK_FSCK_STALE_NAME_RECORD) {
		/* the leftover 'R' first: a crash between leaves an 'X' the next fsck finds */
		if (p->expect & 1)
			r = xname_fix(f, (unsigned)p->found, STK_FSCK_XUNNAME, p->ino, p->shard,
				      p->rid);
		if (r == 0)
			r = xname_fix(f, p->shard, STK_FSCK_XUNNAME, p->ino, (unsigned)p->found,
				      p->id);
		if (r)
			stk_warn("fsck: dropping file %llu's record of a name on shard %llu: %s",
				 (unsigned long long)p->ino, (unsigned long long)p->found,
				 stk_strerror(r));
		p->repaired = r == 0;
		return;
	}
	if (p->expect & 2)
		r = xname_fix(f, p->shard, STK_FSCK_XRESTORE, p->ino, home, p->id);
	if (r == 0 && (p->expect & 1))
		r = xname_fix(f, home, STK_FSCK_XRESTORE, p->ino, p->shard, p->id);
	if (r)
		stk_warn("fsck: restoring the records of '%s' in folder %llu, a name of file %llu "
			 "of shard %u: %s",
			 p->name, (unsigned long long)p->parent, (unsigned long long)p->ino, home,
			 r == -ENOENT ? "the file does not exist there" : stk_strerror(r));
	p->repaired = r == 0;
}

/*
 * The names of files off their home, looked at twice and repaired when asked,
 * before the namespace checks: a file whose home lost its record of a name off
 * home would look unreached there (and be reattached), and the link a stale
 * record counted goes with it, so that each home's check then finds its link
 * counts right.
 */
static int fsck_xnames(struct fsck *f)
{
	size_t before = f->nxp;
	int rc;

	if (f->nsh < 2)
		return 0;
	progress(f, "fsck: checking the names of files off their home shard");
	rc = xnames_look(f, 1);
	if (rc || f->nxp == before)
		return rc;
	usleep(PASS_PAUSE_US);
	rc = xnames_look(f, 0);
	for (size_t i = before; rc == 0 && f->repair && i < f->nxp; i++)
		if (f->xp[i].confirmed)
			xrepair_name(f, &f->xp[i]);
	return rc;
}

/*
 * A file its home's check found unreached that a name off home reaches after all
 * (its home lost its record of that name, found as a name-off-home problem and
 * not repaired): not unreached, and not to be reattached.
 */
static void reached_off_home(struct fsck *f)
{
	for (size_t i = 0; i < f->nxp; i++) {
		const struct xprob *p = &f->xp[i];

		if (p->kind != STK_FSCK_NAME_OFF_HOME || !p->confirmed || p->repaired)
			continue;
		for (uint32_t k = 0; k < f->nnsp; k++) {
			struct stk_msg_fsck_problem *q = &f->nsp[k];

			if (q->kind != STK_FSCK_KIND_UNREACHED || q->ino != p->ino || q->repaired)
				continue;
			memmove(q, q + 1, (f->nnsp - k - 1) * sizeof(*q));
			f->nnsp--;
			f->ns.total--;
			for (unsigned s = 0; s < f->nsh; s++)
				if (f->sh[s].id == stk_ino_shard(p->ino) && f->sh[s].ns.total) {
					f->sh[s].ns.total--;
					f->sh[s].nnsp -= f->sh[s].nnsp > 0;
				}
			break;
		}
	}
}

/* The references between shards, looked at twice; repaired when asked and safe. */
static int fsck_xshard(struct fsck *f)
{
	size_t before = f->nxp;
	uint64_t busy = f->busy;
	int rc;

	if (f->nsh < 2)
		return 0;
	reached_off_home(f);
	progress(f, "fsck: checking the folders named across shards");
	rc = xshard_look(f, 1);
	if (rc || f->nxp == before)
		return rc;
	usleep(PASS_PAUSE_US);
	f->busy = busy;
	rc = xshard_look(f, 0);
	for (size_t i = before; rc == 0 && f->repair && i < f->nxp; i++) {
		struct xprob *p = &f->xp[i];

		if (p->confirmed &&
		    (p->kind == STK_FSCK_PARENT_POINTER || p->kind == STK_FSCK_UNREACHED_INODE)) {
			xrepair_link(f, p);
			continue;
		}
		if (!p->confirmed || p->kind != STK_FSCK_DANGLING_ENTRY)
			continue;
		p->repaired = xdrop(f, p->shard, p->parent, p->ino) == 0;
	}
	return rc;
}

/* ---- the check ---- */

/* The shards of the routing table's shard map, ascending; shard 1 alone without one. */
static int shards_find(struct fsck *f)
{
	int rc = stk_client_refresh_routing(f->c);

	if (rc)
		return rc;
	f->nsh = 0;
	pthread_rwlock_rdlock(&f->c->rt_lock);
	for (uint32_t i = 0; i < f->c->rt.nshards && f->nsh < STK_MAX_SHARDS; i++) {
		unsigned id = f->c->rt.shards[i].id, k = f->nsh++;

		while (k > 0 && f->sh[k - 1].id > id) {
			f->sh[k] = f->sh[k - 1];
			k--;
		}
		f->sh[k] = (struct shard){.id = id};
	}
	pthread_rwlock_unlock(&f->c->rt_lock);
	if (f->nsh == 0)
		f->sh[f->nsh++] = (struct shard){.id = 1};
	return 0;
}

/* Each shard's namespace, checked (and repaired) by its leader. */
static int fsck_namespace(struct fsck *f)
{
	int rc = 0;

	for (unsigned i = 0; rc == 0 && i < f->nsh; i++) {
		struct shard *s = &f->sh[i];
		struct stk_msg_fsck_problem *v;
		struct stk_rbuf rb;

		if (f->nsh == 1)
			progress(f, "fsck: checking the namespace");
		else
			progress(f, "fsck: checking the namespace of shard %u", s->id);
		rc = meta_fsck(f, s->id, STK_FSCK_CHECK, f->repair ? STK_FSCK_REPAIR : 0, 0,
			       STK_FSCK_PROBLEMS_MAX, &s->ns, &rb);
		if (rc)
			break;
		v = realloc(f->nsp, ((size_t)f->nnsp + s->ns.n + 1) * sizeof(*v));
		if (!v)
			return -ENOMEM;
		f->nsp = v;
		for (s->nnsp = 0; s->nnsp < s->ns.n; s->nnsp++)
			if (stk_msg_fsck_problem_dec(&rb, &f->nsp[f->nnsp++]))
				return -EIO;
		f->ns.inodes += s->ns.inodes;
		f->ns.entries += s->ns.entries;
		f->ns.dirs += s->ns.dirs;
		f->ns.files += s->ns.files;
		f->ns.total += s->ns.total;
		f->ns.repaired += s->ns.repaired;
	}
	return rc;
}

static int fsck_data(struct fsck *f, struct pass *last)
{
	struct pass p1;
	int rc;

	rc = pass_load(f, &p1);
	if (rc == 0)
		rc = pass_compare(f, &p1, 1);
	pass_free(&p1);
	if (rc)
		return rc;
	/* Something in flight looks alike a second later only if it is not in flight. */
	if (f->ndp) {
		progress(f, "fsck: %zu possible problem(s): looking again", f->ndp);
		usleep(PASS_PAUSE_US);
	}
	rc = pass_load(f, last);
	if (rc == 0 && f->ndp)
		rc = pass_compare(f, last, 0);
	for (size_t i = 0; rc == 0 && f->repair && i < f->ndp; i++) {
		struct dprob *d = &f->dp[i];
		int r;

		if (!d->confirmed || d->kind != P_GARBAGE)
			continue;
		progress(f, "fsck: removing the chunks of inode %llu", (unsigned long long)d->ino);
		r = remove_garbage(f, last, d->ino);
		if (r)
			stk_warn("fsck: removing the chunks of inode %llu: %s",
				 (unsigned long long)d->ino, stk_strerror(r));
		d->repaired = r == 0;
	}
	return rc;
}

/* The wire's namespace kinds (proto/msg.h) as the public ones. */
static int ns_kind(uint32_t k)
{
	switch (k) {
	case STK_FSCK_KIND_DANGLING:
		return STK_FSCK_DANGLING_ENTRY;
	case STK_FSCK_KIND_LOST_ENTRY:
		return STK_FSCK_LOST_ENTRY;
	case STK_FSCK_KIND_NLINK:
		return STK_FSCK_LINK_COUNT;
	case STK_FSCK_KIND_UNREACHED:
		return STK_FSCK_UNREACHED_INODE;
	case STK_FSCK_KIND_STALE_ORPHAN:
		return STK_FSCK_STALE_ORPHAN;
	case STK_FSCK_KIND_PARENT:
		return STK_FSCK_PARENT_POINTER;
	case STK_FSCK_KIND_QUOTA_BYTES:
		return STK_FSCK_QUOTA_BYTES;
	case STK_FSCK_KIND_QUOTA_INODES:
		return STK_FSCK_QUOTA_INODES;
	case STK_FSCK_KIND_CYCLE:
		return STK_FSCK_FOLDER_CYCLE;
	}
	return STK_FSCK_CORRUPT_RECORD;
}

static int data_kind(int k)
{
	return k == P_GARBAGE	? STK_FSCK_GARBAGE
	       : k == P_MISSING ? STK_FSCK_MISSING_CHUNK
				: STK_FSCK_REPLICAS_DIFFER;
}

_Static_assert(sizeof(((struct stk_fsck_report *)0)->shards) / sizeof(struct stk_fsck_shard) >=
		   STK_MAX_SHARDS,
	       "a report holds every shard a cluster may have");

static int report_make(const struct fsck *f, const struct pass *p, struct stk_fsck_report **out)
{
	struct stk_fsck_report *r = calloc(1, sizeof(*r));
	size_t n = f->nnsp;

	if (!r)
		return -ENOMEM;
	for (size_t i = 0; i < f->ndp; i++)
		n += f->dp[i].confirmed;
	for (size_t i = 0; i < f->nxp; i++)
		n += f->xp[i].confirmed;
	r->list = calloc(n ? n : 1, sizeof(*r->list));
	if (!r->list) {
		free(r);
		return -ENOMEM;
	}
	r->inodes = f->ns.inodes;
	r->entries = f->ns.entries;
	r->dirs = f->ns.dirs;
	r->files = f->ns.files;
	r->targets = p->targets_listed;
	r->targets_skipped = p->targets_skipped;
	r->chunks = p->ncopies;
	r->young_unknown = f->young;
	r->in_progress = f->busy;
	r->problems = f->ns.total;
	r->remaining = f->ns.total - f->ns.repaired;
	r->unlisted = f->ns.total > f->nnsp ? f->ns.total - f->nnsp : 0;
	for (unsigned i = 0; i < f->nsh; i++) {
		const struct shard *s = &f->sh[i];

		r->shards[r->nshards++] =
		    (struct stk_fsck_shard){.id = s->id,
					    .inodes = s->ns.inodes,
					    .entries = s->ns.entries,
					    .dirs = s->ns.dirs,
					    .files = s->ns.files,
					    .problems = s->ns.total,
					    .remaining = s->ns.total - s->ns.repaired};
	}
	for (uint32_t i = 0; i < f->nnsp; i++) {
		const struct stk_msg_fsck_problem *q = &f->nsp[i];
		struct stk_fsck_problem *e = &r->list[r->nlist++];

		e->kind = ns_kind(q->kind);
		e->repaired = q->repaired != 0;
		e->ino = q->ino;
		e->parent = q->parent;
		e->expect = q->expect;
		e->found = q->found;
		snprintf(e->name, sizeof(e->name), "%s", q->name);
	}
	for (size_t i = 0; i < f->nxp; i++) {
		const struct xprob *x = &f->xp[i];
		struct stk_fsck_problem *e;

		if (!x->confirmed)
			continue;
		e = &r->list[r->nlist++];
		e->kind = x->kind;
		e->repaired = x->repaired;
		e->ino = x->ino;
		e->parent = x->parent;
		e->expect = x->expect;
		e->found = x->found;
		snprintf(e->name, sizeof(e->name), "%s", x->name);
		r->problems++;
		r->remaining += !x->repaired;
		for (uint32_t k = 0; k < r->nshards; k++)
			if (r->shards[k].id == x->shard) {
				r->shards[k].problems++;
				r->shards[k].remaining += !x->repaired;
			}
	}
	for (size_t i = 0; i < f->ndp; i++) {
		const struct dprob *d = &f->dp[i];
		struct stk_fsck_problem *e;

		if (!d->confirmed)
			continue;
		e = &r->list[r->nlist++];
		e->kind = data_kind(d->kind);
		e->repaired = d->repaired;
		e->ino = d->ino;
		e->chunk = d->idx;
		e->chain = d->chain;
		e->copies = d->chunks;
		e->bytes = d->bytes;
		r->problems++;
		r->remaining += !d->repaired;
		for (uint32_t k = 0; k < r->nshards; k++)
			if (r->shards[k].id == stk_ino_shard(d->ino)) {
				r->shards[k].problems++;
				r->shards[k].remaining += !d->repaired;
			}
	}
	*out = r;
	return 0;
}

int stk_fsck(stk_client *c, const struct stk_fsck_opts *opts, struct stk_fsck_report **out)
{
	static const struct stk_fsck_opts none = {.size = sizeof(none)};
	struct fsck f = {.c = c, .o = opts ? opts : &none};
	struct pass last = {0};
	int rc;

	if (out)
		*out = NULL;
	if (!c || !out || (opts && opts->size < sizeof(*opts)))
		return -EINVAL;
	f.repair = f.o->repair != 0;
	f.grace = f.o->grace_s > 0 ? f.o->grace_s : f.o->grace_s < 0 ? 0 : GRACE_DEFAULT_S;
	f.resp = malloc(STK_MAX_PAYLOAD);
	if (!f.resp)
		return -ENOMEM;
	rc = shards_find(&f);
	if (rc == 0)
		rc = fsck_xnames(&f);
	if (rc == 0)
		rc = fsck_namespace(&f);
	if (rc == 0)
		rc = fsck_xshard(&f);
	if (rc == 0)
		rc = fsck_reattach_shards(&f);
	if (rc == 0)
		rc = fsck_data(&f, &last);
	if (rc == 0)
		rc = report_make(&f, &last, out);
	pass_free(&last);
	free(f.nsp);
	free(f.dp);
	free(f.xp);
	free(f.resp);
	return rc;
}

void stk_fsck_report_free(struct stk_fsck_report *r)
{
	if (!r)
		return;
	free(r->list);
	free(r);
}
