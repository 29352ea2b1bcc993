/*
 * The namespace store on LMDB. store.h describes the records and the rules; this
 * file is organised bottom-up:
 *
 *   1. the LMDB plumbing: error mapping, one `struct op` per call wrapping its
 *      transaction, the caller's credentials and the time the call began (so
 *      that every timestamp one call sets is the same);
 *   2. record codecs: inode records go through the bounds-checked codec of
 *      proto/codec.h, like wire messages, so a corrupt record is an -EIO and
 *      never a read past the value LMDB handed us;
 *   3. permission checks;
 *   4. the operations, each a short function over those helpers; rename, the
 *      one with many cases, is split into its checks, a move and an exchange.
 *
 * The map is never larger than what fallocate allocated for the file: it starts
 * at the file's size and grows a RESERVE_STEP at a time (map_grow) when fewer
 * than RESERVE_MIN bytes are left past LMDB's last page. So a commit never writes
 * where the disk has no room: a write that ran out of room half-way is EIO to
 * LMDB, and a writable map (MDB_WRITEMAP) would die of SIGBUS there. When the
 * disk cannot give more, LMDB reuses the pages removals freed and, when none is
 * left, fails the write with MDB_MAP_FULL (ENOSPC); nothing committed is lost.
 * A RESERVE_FREEING more is allocated past the map and kept out of it, for the
 * unlink that must still run on a full map (see "purges").
 * Growing remaps, which no transaction may see: every transaction holds
 * map_lock for reading, a growth holds it for writing. A file system
 * without fallocate (env_open's first one fails) gets the plain 64 GiB map.
 *
 * Commits write their pages with pwrite, not through a writable map: that saved
 * a third of this daemon's CPU for a create of an empty file, but every sync then
 * write-protected the pages again (a TLB flush on every CPU) and the next commit
 * faulted on each, and a durable close syncs: 16 KiB files written by 8 threads,
 * 854-985 files/s with pwrite, 594-624 with the writable map.
 *
 * Every operation loads the records it needs into local structs, changes them
 * and writes them back before committing. LMDB invalidates pointers into the map
 * after a write in the same transaction, so nothing keeps an MDB_val across a put.
 */
#include "store.h"

#include <errno.h>
#include <fcntl.h>
#include <lmdb.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "../common/layout.h"
#include "../common/log.h"
#include "../common/util.h"
#include "../proto/codec.h"

/*
 * Inode record formats: 1 is the attributes of wire version 4 (no rdev) and the
 * parent; 2 the attributes with rdev, the parent, then u16 n and n ranges of
 * chunks holding data (u32 first, u32 end); 3 (written since) is 2 followed by
 * u64 qid, the quota root the inode counts in (0: none; 1 and 2 have none). A
 * format 1 record's file counts every chunk below its size as written.
 */
#define INODE_FORMAT_V1 1
#define INODE_FORMAT_V2 2
#define INODE_FORMAT 3
/*
 * Ranges of written chunks kept per file. Past this many, the two closest merge
 * (the hole between them counts as written): st_blocks may then overstate, never
 * understate, what a much-fragmented sparse file holds.
 */
#define ALLOC_RANGES_MAX 32
#define INODE_REC_MAX (1 + 108 + 8 + 2 + ALLOC_RANGES_MAX * 8 + 8)
#define DENTRY_KEY_MAX (16 + STK_NAME_MAX)
#define DEFAULT_MAP_SIZE (64ull << 30)
/*
 * The map grows when fewer than RESERVE_MIN bytes are left past LMDB's last page
 * (more than one transaction adds: a META_CLOSES of STK_CLOSES_MAX records
 * dirties a few thousand pages at most), by RESERVE_STEP at a time.
 */
#define RESERVE_MIN (16ull << 20)
#define RESERVE_STEP (32ull << 20)
/*
 * Allocated past the map and left out of it: room that only the retry of an
 * operation that frees files may take (reserve_open), when a full map failed it.
 * A freeing needs new pages too (LMDB copies what it changes), so on a map with
 * none left the unlink that would free space could not run. Taken, it comes
 * back with the next growth of the map.
 */
#define RESERVE_FREEING (2ull << 20)
/* Reader slots bound concurrent read transactions (one per server thread at most). */
#define MAX_READERS 1024
/* A parent chain deeper than this can only be a cycle in a corrupt store. */
#define MAX_DEPTH 65536
#define DIR_SIZE 4096
#define MAY_R 4u
#define MAY_W 2u
#define MAY_X 1u

/* Named tables a store may have, and the longest name one may have (redo records). */
#define TABLES_MAX 32
#define TABLE_NAME_MAX 31

static const char NEXT_INO_KEY[] = "next_ino";
static const char REPL_POS_KEY[] = "repl_pos";
static const char NS_ID_KEY[] = "ns_id";
/* The metadata shard the store was made for (docs/meta-shards.md); absent: shard 1. */
static const char SHARD_KEY[] = "shard";

struct stk_meta_store {
	MDB_env *env;
	MDB_dbi inodes;
	MDB_dbi dentries;
	MDB_dbi links;
	MDB_dbi sys;
	MDB_dbi xattrs;
	MDB_dbi quotas;
	MDB_dbi purge; /* chunks to remove: see "purges" below */
	MDB_dbi xshard; /* intents and marks of cross-shard folders (see there) */
	struct stk_ns_id ns_id; /* the namespace's identity, set once by store_init */
	unsigned shard;		/* the shard it serves (1..), set once by store_init */
	stk_meta_open_fn open_fn; /* set once before serving (sessions, orphans) */
	void *open_ctx;
	/*
	 * Group commit of stk_meta_store_sync: commits counts the committed write
	 * transactions (atomic); synced, under sync_mu, how many of them the last
	 * sync covered. A caller whose commits a sync begun since already covers
	 * returns without one of its own, so concurrent closes share a flush.
	 */
	uint64_t commits;
	pthread_mutex_t sync_mu;
	uint64_t synced;
	/*
	 * The allocated map: its file, LMDB's page size, the map's size (all of it
	 * allocated; changed under map_lock held for writing) and how far it may
	 * grow. map_lock is held for reading by every transaction.
	 */
	int allocated;
	int fd;
	uint64_t psize;
	uint64_t map_size;
	uint64_t file_size; /* allocated: the map, and RESERVE_FREEING past it if the disk had it */
	uint64_t map_max;
	pthread_rwlock_t map_lock;
	int grow_warned; /* atomic: "cannot grow" logged, and no growth since */
	/*
	 * Room reserved for writes to files under quotas (memory only; see "quotas"
	 * below): reservations by inode hash. qmu guards them; it is taken inside
	 * write transactions and under the sessions' mutex, never the other way.
	 */
	pthread_mutex_t qmu;
	struct resv *resv[256];
	struct allow *allows; /* inode allowances of sessions (quotas below), under qmu */
	struct allow *ballows; /* byte allowances of sessions (`left` in bytes), under qmu */
	/*
	 * Replication (store.h, "Replication"): the mode, the epoch a leader's
	 * changes carry and the hook that is told of each commit; all set under
	 * repl_mu, which a leader's commit holds from numbering a change to telling
	 * the hook, so that the hook sees changes in commit order. pos_epoch and
	 * pos_seq: the last change this store holds (also in `sys`), under repl_mu.
	 * tname: each table's name by its handle, for redo records.
	 */
	pthread_mutex_t repl_mu;
	int repl_mode;
	uint64_t repl_epoch;
	stk_meta_redo_fn redo_fn;
	void *redo_ctx;
	uint64_t pos_epoch;
	uint64_t pos_seq;
	char tname[TABLES_MAX][TABLE_NAME_MAX + 1];
	/*
	 * Purges left out of the purge table because the map was full (see
	 * "purges" below): kept here until the purger has sent them. umu guards them;
	 * it is taken after a commit, never around a transaction.
	 */
	pthread_mutex_t umu;
	struct stk_meta_purge *unrec;
	size_t nunrec, capunrec;
	uint64_t unrec_total; /* ever kept here, for the log */
};

/*
 * An inode as the operations see it: its attributes, for a directory its parent,
 * and for a regular file the chunks that hold data: nalloc ranges [first, end),
 * sorted, disjoint and not touching, from which a.blocks is computed.
 */
struct inode {
	struct stk_attr a;
	uint64_t parent;
	uint32_t nalloc;
	uint32_t alloc[ALLOC_RANGES_MAX][2];
};

struct dentry {
	uint64_t ino;
	uint32_t type;
};

/* One call: its transaction, who asks, and when. */
struct op {
	struct stk_meta_store *st;
	MDB_txn *txn;
	const struct stk_cred *cred;
	int rdonly;
	int64_t now_sec;
	uint32_t now_nsec;
	/*
	 * now is a time a client chose (stk_meta_store_create_as), not the clock: a
	 * directory's times only move forward to it, as a later change may have set
	 * them already.
	 */
	int chosen_time;
	/* A create that may spend this session's inode allowance (create_as). */
	uint64_t allow_session;
	int nested;	   /* a child of this thread's batch (stk_meta_store_batch_begin) */
	size_t redo_mark;  /* nested: where its changes begin in the thread's redo record */
	size_t unrec_mark; /* unrec_tl.n when it began: what it added lies past it */
};

/* Quotas (the end of this file): what the operations above them call. */
static void resv_resize(struct stk_meta_store *st, uint64_t ino, uint64_t size);
static void resv_free_all(struct stk_meta_store *st);
static int allow_take(struct stk_meta_store *st, uint64_t session, uint64_t qid);
static void ballow_spend(struct stk_meta_store *st, uint64_t session, uint64_t qid, uint64_t n);

/*
 * This thread's batch: every operation of the store in it is a child transaction
 * of one write transaction, committed once at the end (stk_meta_store_batch_end).
 */
static __thread struct {
	struct stk_meta_store *st;
	MDB_txn *txn;
} batch;

/*
 * This thread's redo record (store.h, "Replication"): every put and delete of
 * the current write transaction, of every table, as it is made. The wrappers
 * below replace mdb_put, mdb_del and mdb_cursor_del for the whole of this file,
 * so a table added later is replicated with no code of its own. Record format,
 * one after another: u8 kind (REDO_PUT, REDO_DEL), u8 name length, the table's
 * name, u32 key length, key, u32 value length, value (0 for a delete).
 */
#define REDO_PUT 1
#define REDO_DEL 2
static __thread struct {
	struct stk_meta_store *st; /* capturing for this store; NULL: not capturing */
	uint8_t *buf;
	size_t len, cap;
	int err; /* -ENOMEM: a record was lost, so the transaction must not commit */
} redo;
/* This thread's last change number (stk_meta_store_thread_seq). */
static __thread uint64_t thread_seq;
/* stk_meta_store_apply is writing on this thread: a follower's store lets it. */
static __thread int applying_now;

static void redo_add(MDB_txn *txn, MDB_dbi dbi, int kind, const MDB_val *k, const MDB_val *v);

static int redo_mdb_put(MDB_txn *txn, MDB_dbi dbi, MDB_val *k, MDB_val *v, unsigned flags)
{
	int rc = mdb_put(txn, dbi, k, v, flags);

	if (rc == 0 && redo.st)
		redo_add(txn, dbi, REDO_PUT, k, v);
	return rc;
}

static int redo_mdb_del(MDB_txn *txn, MDB_dbi dbi, MDB_val *k, MDB_val *v)
{
	int rc = mdb_del(txn, dbi, k, v);

	if (rc == 0 && redo.st)
		redo_add(txn, dbi, REDO_DEL, k, NULL);
	return rc;
}

static int redo_mdb_cursor_del(MDB_cursor *c, unsigned flags)
{
	MDB_val k, v;
	int rc;

	if (redo.st) {
		rc = mdb_cursor_get(c, &k, &v, MDB_GET_CURRENT);
		if (rc)
			return rc;
		/* recorded first: the key's bytes are the map's, gone after the delete */
		redo_add(mdb_cursor_txn(c), mdb_cursor_dbi(c), REDO_DEL, &k, NULL);
	}
	rc = mdb_cursor_del(c, flags);
	if (rc && redo.st)
		redo.err = -EIO; /* recorded but not made: this transaction fails */
	return rc;
}

/* Function-like, so that (mdb_put)(...) still reaches LMDB's own where a write must not be
 * recorded. */
#define mdb_put(t, d, k, v, f) redo_mdb_put(t, d, k, v, f)
#define mdb_del(t, d, k, v) redo_mdb_del(t, d, k, v)
#define mdb_cursor_del(c, f) redo_mdb_cursor_del(c, f)
/*
 * Writes the wrappers do not capture: a call would change a leader's store with
 * no record for its followers, so it does not compile (an undeclared function).
 * Write through mdb_put/mdb_del instead; (mdb_drop)(...) where a write must not
 * be recorded (a follower emptying its store for a copy).
 */
#define mdb_cursor_put(c, k, v, f) stk_meta_store_write_not_replicated(c, k, v, f)
#define mdb_drop(t, d, del) stk_meta_store_write_not_replicated(t, d, del)

/*
 * This thread's operation retried without purge records (unrec_retry): skip is
 * set meanwhile, and v holds the purges its transactions would have recorded,
 * until the outermost one commits (they go to the store's unrec list) or aborts
 * (they are forgotten with it). See "purges" below.
 */
static __thread struct {
	int skip;
	struct stk_meta_purge *v;
	size_t n, cap;
} unrec_tl;

static void unrec_settle(struct op *o, int committed);
static int unrec_retry(struct stk_meta_store *st, int rc);
static void unrec_retry_end(void);

/* ---- LMDB plumbing ---- */

static int lmdb_err(int rc, const char *what)
{
	switch (rc) {
	case MDB_SUCCESS:
		return 0;
	case MDB_NOTFOUND:
		return -ENOENT;
	case MDB_MAP_FULL:
	case MDB_TXN_FULL:
		stk_warn("meta store: %s: %s", what, mdb_strerror(rc));
		return -ENOSPC;
	case MDB_READERS_FULL:
		return -EAGAIN;
	}
	if (rc > 0) /* LMDB passes system errors through as positive errno values */
		return -rc;
	stk_error("meta store: %s: %s", what, mdb_strerror(rc));
	return -EIO;
}

/* With map_lock held: bytes of the map in use, LMDB's pages up to the last one committed. */
static uint64_t map_used(struct stk_meta_store *st)
{
	MDB_envinfo info;

	mdb_env_info(st->env, &info);
	return ((uint64_t)info.me_last_pgno + 1) * st->psize;
}

static uint64_t round_up_mib(uint64_t v)
{
	return (v + (1ull << 20) - 1) & ~((1ull << 20) - 1);
}

/* Allocates the file up to size bytes. 0 or -errno. */
static int allocate_to(struct stk_meta_store *st, uint64_t size)
{
	if (size <= st->file_size)
		return 0;
	if (fallocate(st->fd, 0, (off_t)st->file_size, (off_t)(size - st->file_size)) < 0)
		return -errno;
	st->file_size = size;
	return 0;
}

/*
 * Without map_lock: waits for every transaction to end, then allocates a
 * RESERVE_STEP more past the last page (RESERVE_MIN when the disk has no more)
 * and maps it. A disk that cannot give even that is logged once per episode;
 * the writes go on in the pages LMDB can reuse.
 */
static void map_grow(struct stk_meta_store *st)
{
	uint64_t used, want;
	int rc;

	pthread_rwlock_wrlock(&st->map_lock);
	used = map_used(st);
	if (used + RESERVE_MIN <= st->map_size || st->map_size >= st->map_max)
		goto out;
	want = STK_MIN(round_up_mib(used + RESERVE_STEP), st->map_max);
	rc = allocate_to(st, want + RESERVE_FREEING);
	if (rc == -ENOSPC || rc == -EDQUOT) {
		want = STK_MIN(round_up_mib(used + RESERVE_MIN), st->map_max);
		rc = allocate_to(st, want + RESERVE_FREEING);
	}
	if (rc == 0)
		rc = lmdb_err(mdb_env_set_mapsize(st->env, want), "grow the map");
	if (rc) {
		if (!__atomic_exchange_n(&st->grow_warned, 1, __ATOMIC_RELAXED))
			stk_warn("meta store: cannot grow the namespace to %llu MiB: %s",
				 (unsigned long long)(want >> 20), strerror(-rc));
		goto out;
	}
	__atomic_store_n(&st->grow_warned, 0, __ATOMIC_RELAXED);
	st->map_size = want;
out:
	pthread_rwlock_unlock(&st->map_lock);
}

/*
 * Without map_lock, outside any batch: puts the room allocated past the map
 * (RESERVE_FREEING) into it, for the retry of a freeing that a full map failed.
 * Returns 1 if there was some.
 */
static int reserve_open(struct stk_meta_store *st)
{
	int opened = 0;

	pthread_rwlock_wrlock(&st->map_lock);
	if (st->allocated && st->file_size > st->map_size &&
	    mdb_env_set_mapsize(st->env, st->file_size) == 0) {
		st->map_size = st->file_size;
		opened = 1;
	}
	pthread_rwlock_unlock(&st->map_lock);
	if (opened)
		stk_warn("meta store: the map is full: its reserve is opened to free files");
	return opened;
}

static int op_begin(struct op *o, struct stk_meta_store *st, const struct stk_cred *cred,
		    int rdonly)
{
	int rc;

	o->st = st;
	o->cred = cred;
	o->rdonly = rdonly;
	o->txn = NULL;
	o->chosen_time = 0;
	o->nested = batch.st == st && batch.txn;
	o->redo_mark = redo.len;
	o->unrec_mark = unrec_tl.n;
	stk_wall_time(&o->now_sec, &o->now_nsec);
	/* In a batch: a child of its transaction, which holds the map's lock already.
	 * A read is a child too: this thread may have no other transaction. */
	if (o->nested)
		return lmdb_err(mdb_txn_begin(st->env, batch.txn, 0, &o->txn), "begin transaction");
	/* A follower's store changes only by what its leader sends (stk_meta_store_apply). */
	if (!rdonly && !applying_now &&
	    __atomic_load_n(&st->repl_mode, __ATOMIC_ACQUIRE) == STK_META_REPL_FOLLOWER)
		return -EROFS;
	pthread_rwlock_rdlock(&st->map_lock);
	if (!rdonly && st->allocated && map_used(st) + RESERVE_MIN > st->map_size &&
	    st->map_size < st->map_max) {
		pthread_rwlock_unlock(&st->map_lock);
		map_grow(st);
		pthread_rwlock_rdlock(&st->map_lock);
	}
	rc = lmdb_err(mdb_txn_begin(st->env, NULL, rdonly ? MDB_RDONLY : 0, &o->txn),
		      "begin transaction");
	if (rc) {
		pthread_rwlock_unlock(&st->map_lock);
		return rc;
	}
	if (rdonly)
		return 0;
	/* The mode changes only under LMDB's writer lock (stk_meta_store_repl_set), which
	 * this transaction holds now: the check above may be stale, this one is not. */
	if (st->repl_mode == STK_META_REPL_FOLLOWER && !applying_now) {
		mdb_txn_abort(o->txn);
		pthread_rwlock_unlock(&st->map_lock);
		return -EROFS;
	}
	redo.st = st->repl_mode == STK_META_REPL_LEADER ? st : NULL;
	redo.len = 0;
	redo.err = 0;
	return 0;
}

/* Puts `sys` repl_pos = (epoch, seq) in txn, bypassing the redo record. */
static int pos_put(MDB_txn *txn, struct stk_meta_store *st, uint64_t epoch, uint64_t seq)
{
	MDB_val key = {sizeof(REPL_POS_KEY) - 1, (void *)REPL_POS_KEY}, val;
	uint8_t buf[16];
	struct stk_wbuf w;

	stk_wbuf_init(&w, buf, sizeof(buf));
	stk_put_u64(&w, epoch);
	stk_put_u64(&w, seq);
	val.mv_size = w.len;
	val.mv_data = buf;
	return lmdb_err((mdb_put)(txn, st->sys, &key, &val, 0), "write replication position");
}

/*
 * A leader's commit of a transaction that changed something: numbered, its
 * position written with it, and the hook told, all under repl_mu (commit order).
 */
static int leader_commit(struct op *o)
{
	struct stk_meta_store *st = o->st;
	uint64_t seq;
	int rc;

	pthread_mutex_lock(&st->repl_mu);
	seq = st->pos_seq + 1;
	rc = pos_put(o->txn, st, st->repl_epoch, seq);
	if (rc) {
		mdb_txn_abort(o->txn);
		goto out;
	}
	rc = lmdb_err(mdb_txn_commit(o->txn), "commit");
	if (rc)
		goto out;
	st->pos_epoch = st->repl_epoch;
	st->pos_seq = seq;
	thread_seq = seq;
	if (st->redo_fn)
		st->redo_fn(st->redo_ctx, st->repl_epoch, seq, redo.buf, redo.len);
out:
	pthread_mutex_unlock(&st->repl_mu);
	return rc;
}

/* Commits a write transaction that succeeded; aborts everything else. Returns the outcome. */
static int op_end(struct op *o, int rc)
{
	if (o->nested) {
		if (rc || o->rdonly) {
			mdb_txn_abort(o->txn);
			/* its changes are undone: so are their records */
			if (redo.st)
				redo.len = o->redo_mark;
			unrec_settle(o, 0);
			return rc;
		}
		rc = lmdb_err(mdb_txn_commit(o->txn), "commit");
		if (rc && redo.st)
			redo.len = o->redo_mark;
		unrec_settle(o, rc == 0);
		return rc;
	}
	if (rc == 0 && !o->rdonly && redo.st == o->st && redo.err)
		rc = redo.err;
	if (rc || o->rdonly) {
		mdb_txn_abort(o->txn);
		pthread_rwlock_unlock(&o->st->map_lock);
		if (!o->rdonly)
			redo.st = NULL;
		unrec_settle(o, 0);
		return rc;
	}
	if (redo.st == o->st && redo.len > 0)
		rc = leader_commit(o);
	else
		rc = lmdb_err(mdb_txn_commit(o->txn), "commit");
	redo.st = NULL;
	pthread_rwlock_unlock(&o->st->map_lock);
	if (rc == 0)
		__atomic_add_fetch(&o->st->commits, 1, __ATOMIC_RELEASE);
	unrec_settle(o, rc == 0);
	return rc;
}

int stk_meta_store_batch_begin(struct stk_meta_store *st)
{
	struct op o;
	int rc;

	if (batch.txn)
		return -EBUSY;
	rc = op_begin(&o, st, NULL, 0);
	if (rc)
		return rc;
	batch.st = st;
	batch.txn = o.txn;
	return 0;
}

int stk_meta_store_batch_end(struct stk_meta_store *st, int rc)
{
	struct op o = {.st = st, .txn = batch.txn};

	if (batch.st != st || !batch.txn)
		return -EINVAL;
	batch.st = NULL;
	batch.txn = NULL;
	return op_end(&o, rc);
}

static int is_root(const struct op *o)
{
	return o->cred->uid == 0;
}

/* ---- keys and records ---- */

static void be64_put(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (56 - 8 * i));
}

static uint64_t be64_get(const uint8_t *p)
{
	uint64_t v = 0;

	for (int i = 0; i < 8; i++)
		v = (v << 8) | p[i];
	return v;
}

/* Capped below 2^64 - 1 so that the cookie after an entry (hash + 1) is never 0. */
static uint64_t name_hash(const char *name, size_t len)
{
	uint64_t h = XXH64(name, len, 0);

	return h == UINT64_MAX ? h - 1 : h;
}

/* k must hold DENTRY_KEY_MAX bytes; name is a checked name. Returns the key length. */
static size_t dentry_key(uint8_t *k, uint64_t parent, const char *name)
{
	size_t len = strlen(name);

	be64_put(k, parent);
	be64_put(k + 8, name_hash(name, len));
	memcpy(k + 16, name, len);
	return 16 + len;
}

static void times_now(const struct op *o, int64_t *sec, uint32_t *nsec)
{
	*sec = o->now_sec;
	*nsec = o->now_nsec;
}

static void set_ctime(const struct op *o, struct stk_attr *a)
{
	times_now(o, &a->ctime_sec, &a->ctime_nsec);
}

static int time_before(int64_t sec, uint32_t nsec, int64_t than_sec, uint32_t than_nsec)
{
	return sec < than_sec || (sec == than_sec && nsec < than_nsec);
}

/* A directory whose entries changed. */
static void touch_dir(const struct op *o, struct inode *dir)
{
	struct stk_attr *a = &dir->a;

	if (!o->chosen_time || time_before(a->mtime_sec, a->mtime_nsec, o->now_sec, o->now_nsec))
		times_now(o, &a->mtime_sec, &a->mtime_nsec);
	if (!o->chosen_time || time_before(a->ctime_sec, a->ctime_nsec, o->now_sec, o->now_nsec))
		set_ctime(o, a);
}

static uint64_t blocks_of(uint64_t size)
{
	return size / 512 + (size % 512 != 0);
}

/* Chunks [0, n) hold the first `size` bytes of a file of chunks of cs bytes. */
static uint64_t chunks_of(uint64_t size, uint32_t cs)
{
	return cs ? size / cs + (size % cs != 0) : 0;
}

/*
 * st_blocks of a regular file: the bytes of its written chunks that lie below its
 * size, in 512-byte blocks rounded up. Other inodes keep theirs.
 */
static void alloc_blocks(struct inode *n)
{
	uint64_t cs = n->a.layout.chunk_size, bytes = 0;

	if (!S_ISREG(n->a.mode))
		return;
	for (uint32_t i = 0; i < n->nalloc; i++) {
		uint64_t lo = n->alloc[i][0] * cs, hi = STK_MIN(n->alloc[i][1] * cs, n->a.size);

		if (lo < hi)
			bytes += hi - lo;
	}
	n->a.blocks = blocks_of(bytes);
}

/* Forgets chunks [first, end) (punched, or cut off by a truncate). */
static void alloc_cut(struct inode *n, uint32_t first, uint32_t end)
{
	uint32_t out[ALLOC_RANGES_MAX + 1][2], k = 0;

	if (first >= end)
		return;
	for (uint32_t i = 0; i < n->nalloc; i++) {
		uint32_t lo = n->alloc[i][0], hi = n->alloc[i][1];

		if (hi <= first || lo >= end) {
			out[k][0] = lo, out[k++][1] = hi;
			continue;
		}
		if (lo < first)
			out[k][0] = lo, out[k++][1] = first;
		if (hi > end)
			out[k][0] = end, out[k++][1] = hi;
	}
	/* One range split in two can make one too many: merge the closest pair. */
	if (k > ALLOC_RANGES_MAX) {
		uint32_t best = 0;

		for (uint32_t i = 1; i + 1 < k; i++)
			if (out[i + 1][0] - out[i][1] < out[best + 1][0] - out[best][1])
				best = i;
		out[best][1] = out[best + 1][1];
		memmove(&out[best + 1], &out[best + 2], (k - best - 2) * sizeof(out[0]));
		k--;
	}
	memcpy(n->alloc, out, k * sizeof(out[0]));
	n->nalloc = k;
}

/* Counts chunks [first, end) as written. */
static void alloc_add(struct inode *n, uint32_t first, uint32_t end)
{
	uint32_t out[ALLOC_RANGES_MAX + 1][2], k = 0, i = 0;

	if (first >= end)
		return;
	for (; i < n->nalloc && n->alloc[i][1] < first; i++)
		out[k][0] = n->alloc[i][0], out[k++][1] = n->alloc[i][1];
	/* Every range that overlaps or touches [first, end) joins it. */
	for (; i < n->nalloc && n->alloc[i][0] <= end; i++) {
		first = STK_MIN(first, n->alloc[i][0]);
		end = STK_MAX(end, n->alloc[i][1]);
	}
	out[k][0] = first, out[k++][1] = end;
	for (; i < n->nalloc; i++)
		out[k][0] = n->alloc[i][0], out[k++][1] = n->alloc[i][1];
	if (k > ALLOC_RANGES_MAX) {
		uint32_t best = 0;

		for (uint32_t j = 1; j + 1 < k; j++)
			if (out[j + 1][0] - out[j][1] < out[best + 1][0] - out[best][1])
				best = j;
		out[best][1] = out[best + 1][1];
		memmove(&out[best + 1], &out[best + 2], (k - best - 2) * sizeof(out[0]));
		k--;
	}
	memcpy(n->alloc, out, k * sizeof(out[0]));
	n->nalloc = k;
}

static int inode_decode(uint64_t ino, const MDB_val *v, struct inode *n)
{
	struct stk_rbuf r;
	uint8_t fmt;
	int bad = 0;

	stk_rbuf_init(&r, v->mv_data, v->mv_size);
	fmt = stk_get_u8(&r);
	stk_attr_dec_base(&r, &n->a);
	n->nalloc = 0;
	if (fmt == INODE_FORMAT_V1) {
		/*
		 * Format 1's attributes end before rdev, so the decoder took the parent,
		 * the record's last field, for rdev. Its file was written up to its size.
		 */
		n->parent = n->a.rdev;
		n->a.rdev = 0;
		if (S_ISREG(n->a.mode)) {
			uint64_t c = chunks_of(n->a.size, n->a.layout.chunk_size);

			if (c)
				n->nalloc = 1, n->alloc[0][0] = 0, n->alloc[0][1] = (uint32_t)c;
		}
	} else {
		uint32_t cnt;

		n->parent = stk_get_u64(&r);
		cnt = stk_get_u16(&r);
		bad = (fmt != INODE_FORMAT && fmt != INODE_FORMAT_V2) || cnt > ALLOC_RANGES_MAX;
		for (uint32_t i = 0; !bad && i < cnt; i++) {
			n->alloc[i][0] = stk_get_u32(&r);
			n->alloc[i][1] = stk_get_u32(&r);
			bad = n->alloc[i][0] >= n->alloc[i][1] ||
			      (i && n->alloc[i][0] <= n->alloc[i - 1][1]);
		}
		if (!bad)
			n->nalloc = cnt;
		if (!bad && fmt == INODE_FORMAT)
			n->a.qid = stk_get_u64(&r);
	}
	if (stk_rbuf_finish(&r) || bad || n->a.ino != ino) {
		stk_error("meta store: inode %llu: corrupt record", (unsigned long long)ino);
		return -EIO;
	}
	return 0;
}

static int inode_get(struct op *o, uint64_t ino, struct inode *n)
{
	uint8_t k[8];
	MDB_val key = {sizeof(k), k}, val;
	int rc;

	be64_put(k, ino);
	rc = mdb_get(o->txn, o->st->inodes, &key, &val);
	if (rc)
		return lmdb_err(rc, "read inode");
	return inode_decode(ino, &val, n);
}

/* For an inode a directory entry names: its absence is corruption, not ENOENT. */
static int inode_get_named(struct op *o, uint64_t ino, struct inode *n)
{
	int rc = inode_get(o, ino, n);

	if (rc == -ENOENT) {
		stk_error("meta store: an entry names missing inode %llu", (unsigned long long)ino);
		rc = -EIO;
	}
	return rc;
}

static int inode_put(struct op *o, const struct inode *n)
{
	uint8_t k[8], buf[INODE_REC_MAX];
	MDB_val key = {sizeof(k), k}, val;
	struct stk_wbuf w;

	stk_wbuf_init(&w, buf, sizeof(buf));
	stk_put_u8(&w, INODE_FORMAT);
	stk_attr_enc_base(&w, &n->a);
	stk_put_u64(&w, n->parent);
	stk_put_u16(&w, (uint16_t)n->nalloc);
	for (uint32_t i = 0; i < n->nalloc; i++) {
		stk_put_u32(&w, n->alloc[i][0]);
		stk_put_u32(&w, n->alloc[i][1]);
	}
	stk_put_u64(&w, n->a.qid);
	if (w.err)
		return -EIO;
	be64_put(k, n->a.ino);
	val.mv_size = w.len;
	val.mv_data = buf;
	return lmdb_err(mdb_put(o->txn, o->st->inodes, &key, &val, 0), "write inode");
}

static int xattrs_del_all(struct op *o, uint64_t ino);
static int purge_put(struct op *o, const struct inode *n);
static int quota_charge(struct op *o, uint64_t qid, int64_t dinodes, int64_t dbytes, int check);
static int quota_del(struct op *o, uint64_t qid);

/* What an inode counts in its quota: itself, and a regular file's size. */
static int64_t quota_bytes_of(const struct inode *n)
{
	return S_ISREG(n->a.mode) ? (int64_t)n->a.size : 0;
}

/*
 * Drops an inode that lost its last name, with its symlink target and xattrs,
 * and what it counted in its quota (a folder that was a quota root takes its
 * quota with it). A regular file's chunks are recorded for the purge in the same
 * transaction: whoever frees an inode cannot forget its data.
 */
static int inode_del(struct op *o, const struct inode *n)
{
	uint8_t k[8];
	MDB_val key = {sizeof(k), k};
	int rc;

	be64_put(k, n->a.ino);
	rc = quota_charge(o, n->a.qid, -1, -quota_bytes_of(n), 0);
	if (rc == 0 && S_ISDIR(n->a.mode) && n->a.qid == n->a.ino)
		rc = quota_del(o, n->a.ino);
	if (rc == 0)
		rc = lmdb_err(mdb_del(o->txn, o->st->inodes, &key, NULL), "delete inode");
	if (rc == 0)
		rc = xattrs_del_all(o, n->a.ino);
	if (rc == 0 && S_ISREG(n->a.mode))
		rc = purge_put(o, n);
	if (rc == 0 && S_ISLNK(n->a.mode)) {
		rc = lmdb_err(mdb_del(o->txn, o->st->links, &key, NULL), "delete symlink");
		if (rc == -ENOENT)
			rc = 0;
	}
	return rc;
}

static int dentry_get(struct op *o, uint64_t parent, const char *name, struct dentry *d)
{
	uint8_t k[DENTRY_KEY_MAX];
	MDB_val key, val;
	struct stk_rbuf r;
	int rc;

	key.mv_data = k;
	key.mv_size = dentry_key(k, parent, name);
	rc = mdb_get(o->txn, o->st->dentries, &key, &val);
	if (rc)
		return lmdb_err(rc, "read entry");
	stk_rbuf_init(&r, val.mv_data, val.mv_size);
	d->ino = stk_get_u64(&r);
	d->type = stk_get_u32(&r);
	if (stk_rbuf_finish(&r)) {
		stk_error("meta store: entry '%s' in %llu: corrupt record", name,
			  (unsigned long long)parent);
		return -EIO;
	}
	return 0;
}

/* Adds or overwrites an entry. */
static int dentry_put(struct op *o, uint64_t parent, const char *name, uint64_t ino, uint32_t mode)
{
	uint8_t k[DENTRY_KEY_MAX], v[12];
	MDB_val key, val = {sizeof(v), v};
	struct stk_wbuf w;

	key.mv_data = k;
	key.mv_size = dentry_key(k, parent, name);
	stk_wbuf_init(&w, v, sizeof(v));
	stk_put_u64(&w, ino);
	stk_put_u32(&w, mode & S_IFMT);
	return lmdb_err(mdb_put(o->txn, o->st->dentries, &key, &val, 0), "write entry");
}

static int dentry_del(struct op *o, uint64_t parent, const char *name)
{
	uint8_t k[DENTRY_KEY_MAX];
	MDB_val key;

	key.mv_data = k;
	key.mv_size = dentry_key(k, parent, name);
	return lmdb_err(mdb_del(o->txn, o->st->dentries, &key, NULL), "delete entry");
}

/* 1 if directory ino has no entries, 0 if it has, or -errno. */
static int dir_is_empty(struct op *o, uint64_t ino)
{
	uint8_t k[8];
	MDB_val key = {sizeof(k), k}, val;
	MDB_cursor *c;
	int rc;

	be64_put(k, ino);
	rc = mdb_cursor_open(o->txn, o->st->dentries, &c);
	if (rc)
		return lmdb_err(rc, "open cursor");
	rc = mdb_cursor_get(c, &key, &val, MDB_SET_RANGE);
	if (rc == MDB_NOTFOUND)
		rc = 1;
	else if (rc == 0)
		rc = !(key.mv_size >= 8 && be64_get(key.mv_data) == ino);
	else
		rc = lmdb_err(rc, "read entry");
	mdb_cursor_close(c);
	return rc;
}

/* The inode counter in `sys`: the next number to hand out. */
static int ino_next_get(struct op *o, uint64_t *next)
{
	MDB_val key = {sizeof(NEXT_INO_KEY) - 1, (void *)NEXT_INO_KEY}, val;
	struct stk_rbuf r;
	int rc;

	rc = mdb_get(o->txn, o->st->sys, &key, &val);
	if (rc)
		return rc == MDB_NOTFOUND ? -EIO : lmdb_err(rc, "read inode counter");
	stk_rbuf_init(&r, val.mv_data, val.mv_size);
	*next = stk_get_u64(&r);
	if (stk_rbuf_finish(&r) || *next <= STK_ROOT_INO) {
		stk_error("meta store: corrupt inode counter");
		return -EIO;
	}
	return 0;
}

static int ino_next_put(struct op *o, uint64_t next)
{
	MDB_val key = {sizeof(NEXT_INO_KEY) - 1, (void *)NEXT_INO_KEY}, val;
	uint8_t buf[8];
	struct stk_wbuf w;

	stk_wbuf_init(&w, buf, sizeof(buf));
	stk_put_u64(&w, next);
	val.mv_size = w.len;
	val.mv_data = buf;
	return lmdb_err(mdb_put(o->txn, o->st->sys, &key, &val, 0), "write inode counter");
}

/* Hands out the next inode number, from the counter in `sys`. */
static int ino_alloc(struct op *o, uint64_t *ino)
{
	int rc = ino_next_get(o, ino);

	if (rc == 0 && *ino == UINT64_MAX)
		rc = -ENOSPC; /* out of numbers: cannot happen by creating files */
	return rc ? rc : ino_next_put(o, *ino + 1);
}

/*
 * Takes number ino, which a caller chose among those it reserved: -EINVAL if the
 * counter never handed it out (so inode_new could still give it to another file),
 * -EEXIST if an inode has it.
 */
static int ino_claim(struct op *o, uint64_t ino)
{
	struct inode old;
	uint64_t next;
	int rc;

	rc = ino_next_get(o, &next);
	if (rc)
		return rc;
	if (ino <= STK_ROOT_INO || ino >= next)
		return -EINVAL;
	rc = inode_get(o, ino, &old);
	if (rc == 0)
		return -EEXIST;
	return rc == -ENOENT ? 0 : rc;
}

/* ---- names and permissions ---- */

static int is_dot_or_dotdot(const char *name)
{
	return name[0] == '.' && (name[1] == 0 || (name[1] == '.' && name[2] == 0));
}

static int check_name(const char *name)
{
	size_t len = strnlen(name, STK_NAME_MAX + 1);

	if (len == 0 || is_dot_or_dotdot(name) || memchr(name, '/', len))
		return -EINVAL;
	if (len > STK_NAME_MAX)
		return -ENAMETOOLONG;
	return 0;
}

static int in_group(const struct stk_cred *c, uint32_t gid)
{
	unsigned n = STK_MIN(c->ngroups, STK_MAX_GROUPS);

	if (c->gid == gid)
		return 1;
	for (unsigned i = 0; i < n; i++)
		if (c->groups[i] == gid)
			return 1;
	return 0;
}

/* The rwx check: mask is a set of MAY_* bits. Root passes. */
static int may(const struct op *o, const struct stk_attr *a, unsigned mask)
{
	unsigned bits;

	if (is_root(o))
		return 0;
	if (o->cred->uid == a->uid)
		bits = (a->mode >> 6) & 7;
	else if (in_group(o->cred, a->gid))
		bits = (a->mode >> 3) & 7;
	else
		bits = a->mode & 7;
	return (bits & mask) == mask ? 0 : -EACCES;
}

int stk_meta_store_may(const struct stk_cred *cred, const struct stk_attr *a, unsigned mask)
{
	const struct op o = {.cred = cred};

	return may(&o, a, mask & (MAY_R | MAY_W | MAY_X));
}

static int is_owner(const struct op *o, const struct stk_attr *a)
{
	return is_root(o) || o->cred->uid == a->uid;
}

/* In a sticky directory only the entry's owner, the directory's owner or root may remove it. */
static int sticky_ok(const struct op *o, const struct inode *dir, const struct inode *victim)
{
	if (!(dir->a.mode & S_ISVTX) || is_owner(o, &victim->a) || is_owner(o, &dir->a))
		return 0;
	return -EPERM;
}

/* Loads directory ino and checks the caller may do `mask` in it. */
static int dir_get(struct op *o, uint64_t ino, unsigned mask, struct inode *dir)
{
	int rc = inode_get(o, ino, dir);

	if (rc)
		return rc;
	if (!S_ISDIR(dir->a.mode))
		return -ENOTDIR;
	return may(o, &dir->a, mask);
}

/*
 * A folder of another shard (docs/meta-shards.md), named by an entry here or by a
 * folder's parent pointer: -EREMOTE with only n->a.ino and the type in n->a.mode
 * filled, as this store holds nothing more of it.
 */
static int remote_get(struct op *o, uint64_t ino, uint32_t type, struct inode *n)
{
	if (stk_ino_shard(ino) == o->st->shard)
		return 0;
	memset(n, 0, sizeof(*n));
	n->a.ino = ino;
	n->a.mode = type & S_IFMT;
	return -EREMOTE;
}

/* Loads the inode that `name` in dir names (-EREMOTE: another shard's, remote_get). */
static int child_get(struct op *o, const struct inode *dir, const char *name, struct inode *n)
{
	struct dentry d;
	int rc = dentry_get(o, dir->a.ino, name, &d);

	if (rc == 0)
		rc = remote_get(o, d.ino, d.type, n);
	if (rc)
		return rc;
	return inode_get_named(o, d.ino, n);
}

static int xmark_dying(struct op *o, uint64_t ino);
static int xmark_busy(struct op *o, uint64_t ino);
static int xrelease_start(struct op *o, uint64_t ino);

/*
 * -EEXIST if dir already has `name`; -ENOENT if dir is being removed by its
 * parent's shard (a cross-shard rmdir's "dying" mark): nothing new goes in.
 */
static int name_free(struct op *o, const struct inode *dir, const char *name)
{
	struct dentry d;
	int rc = xmark_dying(o, dir->a.ino);

	if (rc)
		return rc;
	rc = dentry_get(o, dir->a.ino, name, &d);

	if (rc == 0)
		return -EEXIST;
	return rc == -ENOENT ? 0 : rc;
}

/* ---- new inodes and entries ---- */

/*
 * Fills a new inode owned by the caller, numbered ino (0: the next number; else
 * one ino_claim accepts). A setgid directory passes on its group, and its setgid
 * bit to subdirectories; a non-root caller outside the resulting group cannot make
 * a setgid file.
 */
static int inode_new(struct op *o, const struct inode *dir, uint32_t mode, uint64_t ino,
		     struct inode *n)
{
	int rc;

	memset(n, 0, sizeof(*n));
	if (ino) {
		rc = ino_claim(o, ino);
		n->a.ino = ino;
	} else {
		rc = ino_alloc(o, &n->a.ino);
	}
	if (rc)
		return rc;
	n->a.uid = o->cred->uid;
	n->a.gid = o->cred->gid;
	if (dir->a.mode & S_ISGID) {
		n->a.gid = dir->a.gid;
		if (S_ISDIR(mode))
			mode |= S_ISGID;
	}
	if (!S_ISDIR(mode) && (mode & S_ISGID) && !is_root(o) && !in_group(o->cred, n->a.gid))
		mode &= ~(uint32_t)S_ISGID;
	n->a.mode = mode;
	n->a.nlink = 1;
	/* a directory's is set by mkdir; any other's is where it was made (confinement) */
	n->parent = S_ISDIR(mode) ? 0 : dir->a.ino;
	n->a.qid = dir->a.qid; /* a quota root's own qid is itself */
	times_now(o, &n->a.atime_sec, &n->a.atime_nsec);
	times_now(o, &n->a.mtime_sec, &n->a.mtime_nsec);
	set_ctime(o, &n->a);
	return 0;
}

/* Writes new inode n and its entry `name` in dir, and updates dir. */
static int entry_add(struct op *o, struct inode *dir, const char *name, const struct inode *n)
{
	int rc;

	if (S_ISDIR(n->a.mode)) {
		if (dir->a.nlink == UINT32_MAX)
			return -EMLINK;
		dir->a.nlink++;
	}
	/* A create its session's allowance holds room for is counted unchecked. */
	rc = quota_charge(o, n->a.qid, 1, quota_bytes_of(n),
			  !(o->allow_session && allow_take(o->st, o->allow_session, n->a.qid)));
	if (rc == 0)
		rc = inode_put(o, n);
	if (rc == 0)
		rc = dentry_put(o, dir->a.ino, name, n->a.ino, n->a.mode);
	if (rc == 0) {
		touch_dir(o, dir);
		rc = inode_put(o, dir);
	}
	return rc;
}

static int orphan_put(struct op *o, uint64_t ino);

/*
 * One name of n is gone: nlink drops, and the record goes with the last name,
 * unless a client session has the file open: then it stays, with nlink 0, and is
 * recorded as an orphan (see stk_meta_store_set_open_hook).
 */
static int inode_unref(struct op *o, struct inode *n)
{
	int rc;

	if (n->a.nlink > 0)
		n->a.nlink--;
	set_ctime(o, &n->a);
	if (n->a.nlink)
		return inode_put(o, n);
	if (S_ISREG(n->a.mode) && o->st->open_fn && o->st->open_fn(o->st->open_ctx, n->a.ino)) {
		rc = inode_put(o, n);
		return rc ? rc : orphan_put(o, n->a.ino);
	}
	return inode_del(o, n);
}

/* ---- open, close, sync ---- */

static int root_create(struct op *o)
{
	struct inode root;
	int rc;

	memset(&root, 0, sizeof(root));
	root.a.ino = STK_ROOT_INO;
	root.a.mode = S_IFDIR | 0755;
	root.a.nlink = 2;
	root.a.uid = (uint32_t)geteuid();
	root.a.gid = (uint32_t)getegid();
	root.a.size = DIR_SIZE;
	root.a.blocks = blocks_of(DIR_SIZE);
	times_now(o, &root.a.atime_sec, &root.a.atime_nsec);
	times_now(o, &root.a.mtime_sec, &root.a.mtime_nsec);
	set_ctime(o, &root.a);
	root.parent = STK_ROOT_INO;
	rc = inode_put(o, &root);
	return rc ? rc : ino_next_put(o, STK_ROOT_INO + 1);
}

/*
 * The namespace's identity from `sys`, made now when the store has none: a new
 * store, or one a release without identities created (which keeps its namespace
 * and gains an identity, so that mgmtd can tell it from any other from now on).
 * `fresh`: the store was created in this transaction (only for the log line).
 */
static int ns_id_load(struct op *o, int fresh)
{
	MDB_val key = {sizeof(NS_ID_KEY) - 1, (void *)NS_ID_KEY}, val;
	struct stk_ns_id id;
	char s[STK_NS_ID_STR];
	struct stk_rbuf r;
	struct stk_wbuf w;
	uint8_t buf[16];
	int rc;

	rc = mdb_get(o->txn, o->st->sys, &key, &val);
	if (rc == 0) {
		stk_rbuf_init(&r, val.mv_data, val.mv_size);
		id.hi = stk_get_u64(&r);
		id.lo = stk_get_u64(&r);
		if (stk_rbuf_finish(&r) || stk_ns_id_is_zero(&id)) {
			stk_error("meta store: corrupt namespace identity");
			return -EIO;
		}
		o->st->ns_id = id;
		return 0;
	}
	if (rc != MDB_NOTFOUND)
		return lmdb_err(rc, "read namespace identity");
	do {
		if (getrandom(&id, sizeof(id), 0) != (ssize_t)sizeof(id))
			return -errno;
	} while (stk_ns_id_is_zero(&id));
	stk_wbuf_init(&w, buf, sizeof(buf));
	stk_put_u64(&w, id.hi);
	stk_put_u64(&w, id.lo);
	val.mv_size = w.len;
	val.mv_data = buf;
	rc = lmdb_err(mdb_put(o->txn, o->st->sys, &key, &val, 0), "write namespace identity");
	if (rc)
		return rc;
	o->st->ns_id = id;
	if (fresh)
		stk_info("new namespace %s", stk_ns_id_str(&id, s));
	else
		stk_info("the namespace had no identity (made by an older release): it is "
			 "namespace %s from now on",
			 stk_ns_id_str(&id, s));
	return 0;
}

/*
 * Each named table's name by its handle, from LMDB's main table (which lists
 * them all): called after every table is open, so that redo records name every
 * table, whoever added it. -EIO for a name too long to record.
 */
static int tables_named(struct op *o)
{
	MDB_cursor *c;
	MDB_val k, v;
	MDB_dbi main_dbi, dbi;
	char name[TABLE_NAME_MAX + 1];
	int rc;

	rc = lmdb_err(mdb_dbi_open(o->txn, NULL, 0, &main_dbi), "open the table of tables");
	if (rc == 0)
		rc = lmdb_err(mdb_cursor_open(o->txn, main_dbi, &c), "list tables");
	if (rc)
		return rc;
	for (rc = mdb_cursor_get(c, &k, &v, MDB_FIRST); rc == 0;
	     rc = mdb_cursor_get(c, &k, &v, MDB_NEXT)) {
		if (k.mv_size == 0 || k.mv_size > TABLE_NAME_MAX) {
			rc = -EIO;
			break;
		}
		memcpy(name, k.mv_data, k.mv_size);
		name[k.mv_size] = 0;
		rc = mdb_dbi_open(o->txn, name, 0, &dbi);
		if (rc || dbi >= TABLES_MAX) {
			stk_error("meta store: table %s: %s", name,
				  rc ? mdb_strerror(rc) : "too many tables");
			rc = -EIO;
			break;
		}
		memcpy(o->st->tname[dbi], name, k.mv_size + 1);
	}
	mdb_cursor_close(c);
	return rc == MDB_NOTFOUND ? 0 : rc < 0 ? rc : lmdb_err(rc, "list tables");
}

/* The replication position in `sys` (0, 0 when none: a store never replicated). */
static int pos_load(struct op *o)
{
	MDB_val key = {sizeof(REPL_POS_KEY) - 1, (void *)REPL_POS_KEY}, val;
	struct stk_rbuf r;
	int rc;

	o->st->pos_epoch = 0;
	o->st->pos_seq = 0;
	rc = mdb_get(o->txn, o->st->sys, &key, &val);
	if (rc == MDB_NOTFOUND)
		return 0;
	if (rc)
		return lmdb_err(rc, "read replication position");
	stk_rbuf_init(&r, val.mv_data, val.mv_size);
	o->st->pos_epoch = stk_get_u64(&r);
	o->st->pos_seq = stk_get_u64(&r);
	if (stk_rbuf_finish(&r)) {
		stk_error("meta store: corrupt replication position");
		return -EIO;
	}
	return 0;
}

static const char FILE_PARENTS_KEY[] = "file_parents";

/*
 * Stores made before files recorded the folder they live in (client confinement,
 * stk_meta_store_within) get it once, here: each file, symlink or special file
 * takes the folder of the first entry found naming it. `sys` then says it is done.
 */
static int file_parents_fill(struct op *o)
{
	MDB_val key = {sizeof(FILE_PARENTS_KEY) - 1, (void *)FILE_PARENTS_KEY}, k, v;
	uint64_t filled = 0;
	MDB_cursor *c;
	int rc;

	rc = mdb_get(o->txn, o->st->sys, &key, &v);
	if (rc == 0)
		return 0;
	if (rc != MDB_NOTFOUND)
		return lmdb_err(rc, "read file parents mark");
	rc = mdb_cursor_open(o->txn, o->st->dentries, &c);
	if (rc)
		return lmdb_err(rc, "open cursor");
	for (rc = mdb_cursor_get(c, &k, &v, MDB_FIRST); rc == 0;
	     rc = mdb_cursor_get(c, &k, &v, MDB_NEXT)) {
		struct stk_rbuf r;
		struct inode n;
		uint64_t ino;
		uint32_t type;

		stk_rbuf_init(&r, v.mv_data, v.mv_size);
		ino = stk_get_u64(&r);
		type = stk_get_u32(&r);
		if (r.err || k.mv_size < 8 || S_ISDIR(type))
			continue;
		if (inode_get(o, ino, &n) || S_ISDIR(n.a.mode) || n.parent)
			continue;
		n.parent = be64_get(k.mv_data);
		rc = inode_put(o, &n);
		if (rc)
			break;
		filled++;
	}
	mdb_cursor_close(c);
	if (rc != MDB_NOTFOUND && rc != 0)
		return rc < 0 ? rc : lmdb_err(rc, "read entries");
	v.mv_size = 0;
	v.mv_data = "";
	rc = lmdb_err(mdb_put(o->txn, o->st->sys, &key, &v, 0), "write file parents mark");
	if (rc == 0 && filled)
		stk_info("meta store: %llu files made by an older release now record their "
			 "folder (for client keys confined to a subtree)",
			 (unsigned long long)filled);
	return rc;
}

/*
 * The shard the store serves: a new store of shard k > 1 records k and hands out
 * inode numbers from (k - 1) << STK_INO_SHARD_SHIFT; shard 1's stores record
 * nothing (today's stores). An existing store of another shard: -EXDEV, logged.
 */
static int shard_load(struct op *o, int fresh)
{
	MDB_val key = {sizeof(SHARD_KEY) - 1, (void *)SHARD_KEY}, val;
	unsigned want = o->st->shard, have = 1;
	struct stk_rbuf r;
	struct stk_wbuf w;
	uint8_t buf[4];
	int rc;

	rc = mdb_get(o->txn, o->st->sys, &key, &val);
	if (rc == 0) {
		stk_rbuf_init(&r, val.mv_data, val.mv_size);
		have = stk_get_u32(&r);
		if (stk_rbuf_finish(&r) || have < 1 || have > STK_MAX_SHARDS) {
			stk_error("meta store: corrupt shard number");
			return -EIO;
		}
	} else if (rc != MDB_NOTFOUND) {
		return lmdb_err(rc, "read shard number");
	}
	if (fresh && want > 1) {
		stk_wbuf_init(&w, buf, sizeof(buf));
		stk_put_u32(&w, want);
		val.mv_size = w.len;
		val.mv_data = buf;
		rc = lmdb_err(mdb_put(o->txn, o->st->sys, &key, &val, 0), "write shard number");
		return rc ? rc : ino_next_put(o, (uint64_t)(want - 1) << STK_INO_SHARD_SHIFT);
	}
	if (have != want) {
		stk_error("meta store: this store holds metadata shard %u, not shard %u: start "
			  "meta with --shard %u on it, or give shard %u a folder of its own",
			  have, want, have, want);
		return -EXDEV;
	}
	return 0;
}

/* Opens the tables and makes the root directory of a new store, and its identity. */
static int store_init(struct stk_meta_store *st)
{
	static const struct stk_cred root_cred;
	struct inode root;
	struct op o;
	int fresh = 0, rc;

	rc = op_begin(&o, st, &root_cred, 0);
	if (rc)
		return rc;
	rc = mdb_dbi_open(o.txn, "inodes", MDB_CREATE, &st->inodes);
	if (rc == 0)
		rc = mdb_dbi_open(o.txn, "dentries", MDB_CREATE, &st->dentries);
	if (rc == 0)
		rc = mdb_dbi_open(o.txn, "links", MDB_CREATE, &st->links);
	if (rc == 0)
		rc = mdb_dbi_open(o.txn, "sys", MDB_CREATE, &st->sys);
	if (rc == 0)
		rc = mdb_dbi_open(o.txn, "xattrs", MDB_CREATE, &st->xattrs);
	if (rc == 0)
		rc = mdb_dbi_open(o.txn, "quotas", MDB_CREATE, &st->quotas);
	if (rc == 0)
		rc = mdb_dbi_open(o.txn, "purge", MDB_CREATE, &st->purge);
	if (rc == 0)
		rc = mdb_dbi_open(o.txn, "xshard", MDB_CREATE, &st->xshard);
	rc = lmdb_err(rc, "open tables");
	if (rc == 0)
		rc = tables_named(&o);
	if (rc == 0)
		rc = pos_load(&o);
	if (rc)
		goto out;
	rc = inode_get(&o, STK_ROOT_INO, &root);
	if (rc == -ENOENT) {
		fresh = 1;
		rc = root_create(&o);
	}
	if (rc == 0)
		rc = shard_load(&o, fresh);
	if (rc == 0)
		rc = ns_id_load(&o, fresh);
	if (rc == 0)
		rc = file_parents_fill(&o);
out:
	return op_end(&o, rc);
}

void stk_meta_store_ns_id(const struct stk_meta_store *st, struct stk_ns_id *out)
{
	*out = st->ns_id;
}

unsigned stk_meta_store_shard(const struct stk_meta_store *st)
{
	return st->shard;
}

/*
 * Opens the environment in dir; with allocated, maps only the allocated file:
 * its size (every byte of it allocated now) or RESERVE_STEP, whichever is more,
 * then grows it when the data is already close to its end. -errno on failure.
 */
static int env_open(struct stk_meta_store *st, const char *dir, int allocated)
{
	char path[4096];
	struct stat sb;
	uint64_t size = RESERVE_STEP;
	MDB_stat ms;
	int rc;

	rc = lmdb_err(mdb_env_create(&st->env), "create environment");
	if (rc)
		return rc;
	mdb_env_set_maxdbs(st->env, 8);
	mdb_env_set_maxreaders(st->env, MAX_READERS);
	if (allocated && snprintf(path, sizeof(path), "%s/data.mdb", dir) < (int)sizeof(path) &&
	    stat(path, &sb) == 0) {
		size = STK_MAX(size, round_up_mib((uint64_t)sb.st_size));
		/*
		 * The file's last RESERVE_FREEING is the freeings' reserve, not the map's
		 * (LMDB keeps the map at least as large as what it holds, if that reserve
		 * was taken), so that each open does not add a reserve to the map.
		 */
		if (size >= RESERVE_STEP + RESERVE_FREEING)
			size -= RESERVE_FREEING;
	}
	size = allocated ? STK_MIN(size, st->map_max) : st->map_max;
	rc = mdb_env_set_mapsize(st->env, size);
	if (rc == 0)
		rc = mdb_env_open(st->env, dir, MDB_NOSYNC | MDB_NOTLS, 0600);
	if (rc) {
		stk_error("cannot open the namespace in %s: %s", dir, mdb_strerror(rc));
		rc = rc > 0 ? -rc : -EIO;
		goto fail;
	}
	st->allocated = allocated;
	if (!allocated)
		return 0;
	rc = lmdb_err(mdb_env_get_fd(st->env, &st->fd), "file");
	if (rc == 0)
		rc = lmdb_err(mdb_env_stat(st->env, &ms), "stat");
	st->file_size = 0;
	if (rc == 0) {
		MDB_envinfo info;

		mdb_env_info(st->env, &info);
		size = STK_MAX(size, (uint64_t)info.me_mapsize); /* what LMDB holds, at least */
		rc = allocate_to(st, size); /* every byte, the file's own too */
	}
	if (rc)
		goto fail;
	/* The freeings' reserve past the map, if the disk has it (a full one may not). */
	allocate_to(st, size + RESERVE_FREEING);
	st->psize = ms.ms_psize;
	st->map_size = size;
	if (map_used(st) + RESERVE_MIN > st->map_size)
		map_grow(st);
	return 0;
fail:
	mdb_env_close(st->env);
	st->env = NULL;
	return rc;
}

int stk_meta_store_open(const struct stk_meta_store_opts *opts, struct stk_meta_store **out)
{
	pthread_rwlockattr_t ra;
	struct stk_meta_store *st;
	int rc;

	if (!opts || opts->size < sizeof(*opts) || !opts->dir || !out)
		return -EINVAL;
	rc = stk_mkdir_p(opts->dir, 0700);
	if (rc) {
		stk_error("cannot create %s: %s", opts->dir, strerror(-rc));
		return rc;
	}
	st = calloc(1, sizeof(*st));
	if (!st)
		return -ENOMEM;
	pthread_mutex_init(&st->sync_mu, NULL);
	pthread_mutex_init(&st->qmu, NULL);
	pthread_mutex_init(&st->repl_mu, NULL);
	pthread_mutex_init(&st->umu, NULL);
	/* a growth waiting for the map must not wait behind a stream of new readers */
	pthread_rwlockattr_init(&ra);
	pthread_rwlockattr_setkind_np(&ra, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
	pthread_rwlock_init(&st->map_lock, &ra);
	pthread_rwlockattr_destroy(&ra);
	st->map_max = opts->map_size ? opts->map_size : DEFAULT_MAP_SIZE;
	st->shard = opts->shard ? opts->shard : 1;
	rc = env_open(st, opts->dir, 1);
	if (rc == -ENOSPC || rc == -EDQUOT || rc == -EOPNOTSUPP) {
		stk_warn("meta store: cannot allocate the namespace's file in %s (%s); "
			 "a full disk there will fail writes with EIO",
			 opts->dir, strerror(-rc));
		rc = env_open(st, opts->dir, 0);
	}
	if (rc == 0)
		rc = store_init(st);
	if (rc)
		goto out;
	*out = st;
	return 0;
out:
	if (st->env)
		mdb_env_close(st->env);
	pthread_rwlock_destroy(&st->map_lock);
	pthread_mutex_destroy(&st->sync_mu);
	pthread_mutex_destroy(&st->qmu);
	pthread_mutex_destroy(&st->repl_mu);
	pthread_mutex_destroy(&st->umu);
	free(st);
	return rc;
}

void stk_meta_store_close(struct stk_meta_store *st)
{
	if (!st)
		return;
	mdb_env_close(st->env);
	pthread_rwlock_destroy(&st->map_lock);
	pthread_mutex_destroy(&st->sync_mu);
	resv_free_all(st);
	pthread_mutex_destroy(&st->qmu);
	if (st->nunrec)
		stk_warn("meta store: closed with the purges of %zu file(s) not done (the map "
			 "was full): stoker fsck finds their chunks as garbage",
			 st->nunrec);
	free(st->unrec);
	pthread_mutex_destroy(&st->umu);
	pthread_mutex_destroy(&st->repl_mu);
	free(st);
}

int stk_meta_store_sync(struct stk_meta_store *st)
{
	uint64_t want = __atomic_load_n(&st->commits, __ATOMIC_ACQUIRE), upto;
	int rc = 0;

	pthread_mutex_lock(&st->sync_mu);
	if (st->synced < want) {
		/* every commit counted here ended before the flush begins */
		upto = __atomic_load_n(&st->commits, __ATOMIC_ACQUIRE);
		rc = mdb_env_sync(st->env, 1); /* fdatasync: the map is not written */
		if (rc == 0)
			st->synced = upto;
	}
	pthread_mutex_unlock(&st->sync_mu);
	if (rc) {
		stk_error("meta store: sync: %s", mdb_strerror(rc));
		return -EIO;
	}
	return 0;
}

/* ---- reading ---- */

int stk_meta_store_lookup(struct stk_meta_store *st, const struct stk_cred *cred, uint64_t parent,
			  const char *name, struct stk_attr *out)
{
	struct inode dir, n;
	struct op o;
	int rc;

	if (!is_dot_or_dotdot(name)) {
		rc = check_name(name);
		if (rc)
			return rc;
	}
	rc = op_begin(&o, st, cred, 1);
	if (rc)
		return rc;
	rc = dir_get(&o, parent, MAY_X, &dir);
	if (rc)
		goto out;
	if (strcmp(name, ".") == 0)
		n = dir;
	else if (strcmp(name, "..") == 0)
		rc = remote_get(&o, dir.parent, S_IFDIR, &n) ?: inode_get_named(&o, dir.parent, &n);
	else
		rc = child_get(&o, &dir, name, &n);
	if (rc == 0 || rc == -EREMOTE)
		*out = n.a;
out:
	return op_end(&o, rc);
}

int stk_meta_store_getattr(struct stk_meta_store *st, const struct stk_cred *cred, uint64_t ino,
			   struct stk_attr *out)
{
	struct inode n;
	struct op o;
	int rc;

	rc = op_begin(&o, st, cred, 1);
	if (rc)
		return rc;
	rc = inode_get(&o, ino, &n);
	if (rc == 0)
		*out = n.a;
	return op_end(&o, rc);
}

int stk_meta_store_getattrs(struct stk_meta_store *st, const struct stk_cred *cred,
			    const uint64_t *inos, uint32_t n, struct stk_attr *out, int *rcs)
{
	struct inode node;
	struct op o;
	int rc;

	rc = op_begin(&o, st, cred, 1);
	if (rc)
		return rc;
	for (uint32_t i = 0; i < n; i++) {
		rcs[i] = inode_get(&o, inos[i], &node);
		if (rcs[i] == 0)
			out[i] = node.a;
	}
	return op_end(&o, 0);
}

int stk_meta_store_readlink(struct stk_meta_store *st, const struct stk_cred *cred, uint64_t ino,
			    char *buf, size_t len)
{
	uint8_t k[8];
	MDB_val key = {sizeof(k), k}, val;
	struct inode n;
	struct op o;
	int rc;

	rc = op_begin(&o, st, cred, 1);
	if (rc)
		return rc;
	rc = inode_get(&o, ino, &n);
	if (rc)
		goto out;
	if (!S_ISLNK(n.a.mode)) {
		rc = -EINVAL;
		goto out;
	}
	be64_put(k, ino);
	rc = mdb_get(o.txn, st->links, &key, &val);
	if (rc) {
		rc = rc == MDB_NOTFOUND ? -EIO : lmdb_err(rc, "read symlink");
		goto out;
	}
	if (val.mv_size >= len) {
		rc = -ERANGE;
		goto out;
	}
	memcpy(buf, val.mv_data, val.mv_size);
	buf[val.mv_size] = 0;
out:
	return op_end(&o, rc);
}

/* Fills d from one dentries record of directory ino. -EIO if the record is corrupt. */
static int dirent_decode(uint64_t ino, const MDB_val *key, const MDB_val *val,
			 struct stk_msg_dirent *d)
{
	const uint8_t *kp = key->mv_data;
	struct stk_rbuf r;

	if (key->mv_size <= 16 || key->mv_size > DENTRY_KEY_MAX)
		goto bad;
	stk_rbuf_init(&r, val->mv_data, val->mv_size);
	d->ino = stk_get_u64(&r);
	d->mode = stk_get_u32(&r);
	if (stk_rbuf_finish(&r))
		goto bad;
	d->next_cookie = be64_get(kp + 8) + 1;
	memcpy(d->name, kp + 16, key->mv_size - 16);
	d->name[key->mv_size - 16] = 0;
	return 0;
bad:
	stk_error("meta store: directory %llu: corrupt entry", (unsigned long long)ino);
	return -EIO;
}

/*
 * Walks the entries of directory ino from key (ino, cookie). Returns 0 with *eof
 * set when the directory's entries ran out, 0 with *eof clear when the limit or
 * the callback stopped it, or -errno.
 */
static int readdir_walk(struct op *o, uint64_t ino, uint64_t cookie, uint32_t max,
			stk_meta_dirent_fn fn, void *ctx, int *eof)
{
	uint8_t k[16];
	MDB_val key = {sizeof(k), k}, val;
	struct stk_msg_dirent d;
	MDB_cursor *c;
	uint32_t n = 0;
	int rc;

	*eof = 0;
	be64_put(k, ino);
	be64_put(k + 8, cookie);
	rc = mdb_cursor_open(o->txn, o->st->dentries, &c);
	if (rc)
		return lmdb_err(rc, "open cursor");
	memset(&d, 0, sizeof(d));
	for (rc = mdb_cursor_get(c, &key, &val, MDB_SET_RANGE); rc == 0;
	     rc = mdb_cursor_get(c, &key, &val, MDB_NEXT)) {
		if (key.mv_size < 8 || be64_get(key.mv_data) != ino)
			break; /* past the directory's last entry */
		if (max && n == max)
			goto out;
		rc = dirent_decode(ino, &key, &val, &d);
		if (rc == 0)
			rc = fn(ctx, &d);
		if (rc)
			goto out;
		n++;
	}
	if (rc == 0 || rc == MDB_NOTFOUND) {
		*eof = 1;
		rc = 0;
	} else {
		rc = lmdb_err(rc, "read entry");
	}
out:
	mdb_cursor_close(c);
	return rc > 0 ? 0 : rc; /* a callback's stop is not an error */
}

int stk_meta_store_readdir(struct stk_meta_store *st, const struct stk_cred *cred, uint64_t ino,
			   uint64_t cookie, uint32_t max_entries, stk_meta_dirent_fn fn, void *ctx,
			   int *eof)
{
	struct inode dir;
	struct op o;
	int rc;

	*eof = 0;
	rc = op_begin(&o, st, cred, 1);
	if (rc)
		return rc;
	rc = dir_get(&o, ino, MAY_R, &dir);
	if (rc == 0)
		rc = readdir_walk(&o, ino, cookie, max_entries, fn, ctx, eof);
	return op_end(&o, rc);
}

int stk_meta_store_statfs(struct stk_meta_store *st, uint64_t *files)
{
	static const struct stk_cred root_cred;
	MDB_stat ms;
	struct op o;
	int rc;

	rc = op_begin(&o, st, &root_cred, 1);
	if (rc)
		return rc;
	rc = lmdb_err(mdb_stat(o.txn, st->inodes, &ms), "stat");
	if (rc == 0)
		*files = ms.ms_entries;
	return op_end(&o, rc);
}

/* ---- attributes ---- */

static int setattr_check(const struct op *o, const struct inode *n, const struct stk_meta_sattr *sa)
{
	const uint32_t known = STK_SETATTR_MODE | STK_SETATTR_UID | STK_SETATTR_GID |
			       STK_SETATTR_SIZE | STK_SETATTR_ATIME | STK_SETATTR_MTIME |
			       STK_SETATTR_ATIME_NOW | STK_SETATTR_MTIME_NOW;
	const uint32_t v = sa->valid;
	int rc;

	/* A read needs no permission here: the client checked it at open, and a
	 * client's credentials are its own word anyway. */
	if (v == STK_SETATTR_ATIME_READ)
		return 0;
	if ((v & ~known) || ((v & STK_SETATTR_ATIME) && sa->atime_nsec >= 1000000000u) ||
	    ((v & STK_SETATTR_MTIME) && sa->mtime_nsec >= 1000000000u))
		return -EINVAL;
	if ((v & STK_SETATTR_MODE) && !is_owner(o, &n->a))
		return -EPERM;
	if ((v & STK_SETATTR_UID) && !is_root(o) && !(is_owner(o, &n->a) && sa->uid == n->a.uid))
		return -EPERM;
	if ((v & STK_SETATTR_GID) && !is_root(o) &&
	    !(is_owner(o, &n->a) && (sa->gid == n->a.gid || in_group(o->cred, sa->gid))))
		return -EPERM;
	if (v & STK_SETATTR_SIZE) {
		if (S_ISDIR(n->a.mode))
			return -EISDIR;
		if (!S_ISREG(n->a.mode))
			return -EINVAL;
		rc = may(o, &n->a, MAY_W);
		if (rc)
			return rc;
	}
	/* Explicit times need ownership; "now" is also allowed to anyone who may write. */
	if (((v & STK_SETATTR_ATIME) && !(v & STK_SETATTR_ATIME_NOW)) ||
	    ((v & STK_SETATTR_MTIME) && !(v & STK_SETATTR_MTIME_NOW)))
		if (!is_owner(o, &n->a))
			return -EPERM;
	if ((v & (STK_SETATTR_ATIME_NOW | STK_SETATTR_MTIME_NOW)) && !is_owner(o, &n->a))
		return may(o, &n->a, MAY_W);
	return 0;
}

static void setattr_apply(const struct op *o, struct inode *n, const struct stk_meta_sattr *sa)
{
	const uint32_t v = sa->valid;
	struct stk_attr *a = &n->a;

	if (v & STK_SETATTR_UID)
		a->uid = sa->uid;
	if (v & STK_SETATTR_GID)
		a->gid = sa->gid;
	if ((v & (STK_SETATTR_UID | STK_SETATTR_GID)) && !S_ISDIR(a->mode)) {
		a->mode &= ~(uint32_t)S_ISUID;
		if (a->mode & S_IXGRP)
			a->mode &= ~(uint32_t)S_ISGID;
	}
	if (v & STK_SETATTR_MODE) {
		uint32_t mode = sa->mode & 07777;

		if (!is_root(o) && !in_group(o->cred, a->gid))
			mode &= ~(uint32_t)S_ISGID;
		a->mode = (a->mode & S_IFMT) | mode;
	}
	if ((v & STK_SETATTR_SIZE) && sa->size != a->size) {
		/* A cut drops the chunks past the new end; growing writes nothing. */
		if (sa->size < a->size)
			alloc_cut(n, (uint32_t)chunks_of(sa->size, a->layout.chunk_size),
				  UINT32_MAX);
		a->size = sa->size;
		alloc_blocks(n);
		times_now(o, &a->mtime_sec, &a->mtime_nsec);
	}
	if (v & STK_SETATTR_ATIME_NOW) {
		times_now(o, &a->atime_sec, &a->atime_nsec);
	} else if (v & STK_SETATTR_ATIME) {
		a->atime_sec = sa->atime_sec;
		a->atime_nsec = sa->atime_nsec;
	}
	if (v & STK_SETATTR_MTIME_NOW) {
		times_now(o, &a->mtime_sec, &a->mtime_nsec);
	} else if (v & STK_SETATTR_MTIME) {
		a->mtime_sec = sa->mtime_sec;
		a->mtime_nsec = sa->mtime_nsec;
	}
	set_ctime(o, a);
}

/*
 * A read of n (relatime): atime to now where it is due. Not a change of the
 * inode's status: ctime stays, and nothing is written when atime is not due.
 */
static int record_read(struct op *o, struct inode *n)
{
	if (!stk_attr_atime_due(&n->a, o->now_sec))
		return 0;
	times_now(o, &n->a.atime_sec, &n->a.atime_nsec);
	return inode_put(o, n);
}

int stk_meta_store_setattr(struct stk_meta_store *st, const struct stk_cred *cred, uint64_t ino,
			   const struct stk_meta_sattr *sa, struct stk_attr *out)
{
	struct inode n;
	struct op o;
	int rc;

	rc = op_begin(&o, st, cred, 0);
	if (rc)
		return rc;
	rc = inode_get(&o, ino, &n);
	if (rc == 0)
		rc = setattr_check(&o, &n, sa);
	if (rc == 0 && sa->valid == STK_SETATTR_ATIME_READ) {
		rc = record_read(&o, &n);
	} else if (rc == 0) {
		int64_t old = quota_bytes_of(&n);

		setattr_apply(&o, &n, sa);
		/* Growing by truncate writes nothing, but the size is what a quota counts. */
		rc = quota_charge(&o, n.a.qid, 0, quota_bytes_of(&n) - old, 1);
		if (rc == 0)
			rc = inode_put(&o, &n);
		if (rc == 0 && n.a.qid && old != quota_bytes_of(&n))
			resv_resize(st, ino, n.a.size);
	}
	rc = op_end(&o, rc);
	if (rc == 0)
		*out = n.a;
	return rc;
}

int stk_meta_store_record_reads(struct stk_meta_store *st, const uint64_t *inos, size_t n)
{
	/* A read needs no permission here: the client checked it at open. */
	const struct stk_cred anyone = {0};
	struct inode nd;
	struct op o;
	int rc;

	rc = op_begin(&o, st, &anyone, 0);
	for (size_t i = 0; rc == 0 && i < n; i++) {
		rc = inode_get(&o, inos[i], &nd);
		if (rc == -ENOENT) {
			rc = 0; /* gone since: nothing to record */
			continue;
		}
		if (rc == 0)
			rc = record_read(&o, &nd);
	}
	return o.txn ? op_end(&o, rc) : rc;
}

int stk_meta_store_extend(struct stk_meta_store *st, const struct stk_cred *cred, uint64_t ino,
			  uint64_t new_size, int64_t mtime_sec, uint32_t mtime_nsec,
			  struct stk_attr *out)
{
	struct stk_meta_extend x = {.size = new_size,
				    .mtime_sec = mtime_sec,
				    .mtime_nsec = mtime_nsec,
				    .alloc_end = UINT32_MAX};

	return stk_meta_store_extend_alloc(st, cred, ino, &x, out);
}

int stk_meta_store_extend_alloc(struct stk_meta_store *st, const struct stk_cred *cred,
				uint64_t ino, const struct stk_meta_extend *x, struct stk_attr *out)
{
	uint64_t new_size = x->size;
	int64_t mtime_sec = x->mtime_sec;
	uint32_t mtime_nsec = x->mtime_nsec;
	struct inode n;
	struct op o;
	int rc;

	if (mtime_nsec >= 1000000000u)
		return -EINVAL;
	rc = op_begin(&o, st, cred, 0);
	if (rc)
		return rc;
	rc = inode_get(&o, ino, &n);
	if (rc)
		goto out;
	if (!S_ISREG(n.a.mode)) {
		rc = S_ISDIR(n.a.mode) ? -EISDIR : -EINVAL;
		goto out;
	}
	if (new_size > n.a.size) {
		/* The writer reserved this room before its bytes went (RESERVE): no check. */
		rc = quota_charge(&o, n.a.qid, 0, (int64_t)(new_size - n.a.size), 0);
		if (rc)
			goto out;
		n.a.size = new_size;
		if (n.a.qid) /* only files under a quota have reservations */
			resv_resize(st, ino, new_size);
	}
	/* Written chunks past the end count once the size covers them. */
	alloc_add(&n, x->alloc_first, x->alloc_end);
	alloc_cut(&n, x->punch_first, x->punch_end);
	alloc_blocks(&n);
	if (mtime_sec == 0 && mtime_nsec == 0) {
		times_now(&o, &n.a.mtime_sec, &n.a.mtime_nsec);
	} else {
		n.a.mtime_sec = mtime_sec;
		n.a.mtime_nsec = mtime_nsec;
	}
	set_ctime(&o, &n.a);
	rc = inode_put(&o, &n);
out:
	rc = op_end(&o, rc);
	/*
	 * Only once the size is committed: until then the bytes count as set aside,
	 * and twice for a moment (used too) rather than not at all.
	 */
	if (rc == 0 && x->allow_session && x->allow_spent && n.a.qid)
		ballow_spend(st, x->allow_session, n.a.qid, x->allow_spent);
	if (rc == 0)
		*out = n.a;
	return rc;
}

/* ---- creating ---- */

static int layout_is_zero(const struct stk_layout *l)
{
	return !l->chunk_size && !l->stripe && !l->nchains && !l->start && !l->seed;
}

static int chain_down(const struct stk_meta_placement *pl, uint32_t id)
{
	return id >= 1 && id <= STK_PLACEMENT_DOWN_MAX &&
	       (pl->down[(id - 1) / 64] >> ((id - 1) % 64) & 1);
}

/* Chains of layout l that do not serve now. */
static uint32_t layout_down(const struct stk_layout *l, const struct stk_meta_placement *pl)
{
	uint32_t chains[STK_MAX_STRIPE], n = 0;

	stk_layout_chains(l, chains);
	for (uint32_t i = 0; i < l->stripe; i++)
		n += chain_down(pl, chains[i]);
	return n;
}

/*
 * While some chains do not serve (a node away, with one copy of each chunk), a new
 * file is laid over serving chains only where a layout can do that: its stripe
 * shrinks to the serving count, and other starts and seeds are drawn (up to
 * LAYOUT_TRIES) until its chains all serve; else the layout with the fewest down
 * chains stands. Files that exist keep their layouts.
 */
#define LAYOUT_TRIES 64
static void layout_avoid_down(struct stk_layout *out, const struct stk_meta_placement *pl,
			      uint64_t entropy)
{
	struct stk_layout best = *out, l;
	uint32_t best_down = layout_down(out, pl);
	uint32_t stripe = STK_MIN(out->stripe, pl->nchains - pl->ndown);

	for (int i = 0; i < LAYOUT_TRIES && best_down; i++) {
		uint32_t d;

		stk_layout_make(&l, out->chunk_size, stripe, pl->nchains, stk_splitmix64(&entropy));
		d = layout_down(&l, pl);
		if (d < best_down) {
			best = l;
			best_down = d;
		}
	}
	*out = best;
}

/* The layout of new file ino: the requested one, or one made from the placement defaults. */
static int layout_choose(const struct op *o, uint64_t ino, const struct stk_layout *req,
			 const struct stk_meta_placement *pl, struct stk_layout *out)
{
	uint64_t entropy;

	if (req && !layout_is_zero(req)) {
		*out = *req;
		return 0; /* checked before the transaction began */
	}
	if (pl->nchains == 0)
		return -ENOSPC;
	/* Inode numbers are sequential; the clock makes two stores' files differ too. */
	entropy = (ino * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)o->now_sec << 32) ^ o->now_nsec;
	stk_layout_make(out, pl->chunk_size ? pl->chunk_size : STK_DEFAULT_CHUNK_SIZE, pl->stripe,
			pl->nchains, entropy);
	if (pl->ndown && pl->ndown < pl->nchains)
		layout_avoid_down(out, pl, entropy);
	return 0;
}

/* create without EXCL on an existing name: that inode, unless it is a directory. */
static int create_existing(struct op *o, const struct inode *dir, const char *name, uint32_t flags,
			   struct inode *n)
{
	int rc = child_get(o, dir, name, n);

	/* another shard's folder, or file (renamed here: -EREMOTE, opened at its home) */
	if (rc == -EREMOTE)
		return flags & STK_CREATE_EXCL ? -EEXIST : S_ISDIR(n->a.mode) ? -EISDIR : -EREMOTE;
	if (rc)
		return rc;
	if (flags & STK_CREATE_EXCL)
		return -EEXIST;
	return S_ISDIR(n->a.mode) ? -EISDIR : 0;
}

int stk_meta_store_create_as(struct stk_meta_store *st, const struct stk_cred *cred,
			     uint64_t parent, const char *name, uint32_t mode, uint32_t flags,
			     const struct stk_layout *layout, const struct stk_meta_placement *pl,
			     const struct stk_meta_create_as *as, struct stk_attr *out,
			     int *created)
{
	struct inode dir, n;
	int made = 0, rc;
	struct op o;

	*created = 0;
	rc = check_name(name);
	if (rc)
		return rc;
	if (flags & ~STK_CREATE_EXCL)
		return -EINVAL;
	if (layout && !layout_is_zero(layout) &&
	    (stk_layout_check(layout) || layout->nchains > pl->nchains))
		return -EINVAL;
	if (as && as->time_nsec >= 1000000000u)
		return -EINVAL;
	rc = op_begin(&o, st, cred, 0);
	if (rc)
		return rc;
	if (as && (as->time_sec || as->time_nsec)) {
		/* The file's times and its folder's (never backwards) are the client's. */
		o.now_sec = as->time_sec;
		o.now_nsec = as->time_nsec;
		o.chosen_time = 1;
	}
	o.allow_session = as ? as->session : 0;
	rc = dir_get(&o, parent, MAY_X, &dir);
	if (rc)
		goto out;
	rc = name_free(&o, &dir, name);
	if (rc == -EEXIST) {
		rc = create_existing(&o, &dir, name, flags, &n);
		goto out;
	}
	if (rc == 0)
		rc = may(&o, &dir.a, MAY_W | MAY_X);
	if (rc == 0)
		rc = inode_new(&o, &dir, S_IFREG | (mode & 07777), as ? as->ino : 0, &n);
	if (rc == 0)
		rc = layout_choose(&o, n.a.ino, layout, pl, &n.a.layout);
	if (rc == 0) {
		rc = entry_add(&o, &dir, name, &n);
		made = 1;
	}
out:
	rc = op_end(&o, rc);
	if (rc == 0 || rc == -EREMOTE) {
		*out = n.a;
		*created = made;
	}
	return rc;
}

int stk_meta_store_create(struct stk_meta_store *st, const struct stk_cred *cred, uint64_t parent,
			  const char *name, uint32_t mode, uint32_t flags,
			  const struct stk_layout *layout, const struct stk_meta_placement *pl,
			  struct stk_attr *out, int *created)
{
	return stk_meta_store_create_as(st, cred, parent, name, mode, flags, layout, pl, NULL, out,
					created);
}

int stk_meta_store_reserve_inos(struct stk_meta_store *st, uint32_t count, uint64_t *first)
{
	static const struct stk_cred root_cred;
	uint64_t next = 0;
	struct op o;
	int rc;

	if (count == 0)
		return -EINVAL;
	rc = op_begin(&o, st, &root_cred, 0);
	if (rc)
		return rc;
	rc = ino_next_get(&o, &next);
	if (rc == 0 && next > UINT64_MAX - count)
		rc = -ENOSPC;
	if (rc == 0)
		rc = ino_next_put(&o, next + count);
	rc = op_end(&o, rc);
	if (rc == 0)
		*first = next;
	return rc;
}

/*
 * The common start of mkdir and symlink: checks the name, begins a write
 * transaction and, in directory `parent` (search and write permission, the name
 * not taken), allocates the new inode *n of `mode`. Returns -errno when the
 * transaction could not begin (there is nothing to end); otherwise 0, with *step
 * the result of the steps after it, and the caller ends the transaction with
 * op_end().
 */
static int new_entry_begin(struct op *o, struct stk_meta_store *st, const struct stk_cred *cred,
			   uint64_t parent, const char *name, uint32_t mode, struct inode *dir,
			   struct inode *n, int *step)
{
	int rc = check_name(name);

	if (rc)
		return rc;
	rc = op_begin(o, st, cred, 0);
	if (rc)
		return rc;
	rc = dir_get(o, parent, MAY_X, dir);
	if (rc == 0)
		rc = name_free(o, dir, name);
	if (rc == 0)
		rc = may(o, &dir->a, MAY_W | MAY_X);
	if (rc == 0)
		rc = inode_new(o, dir, mode, 0, n);
	*step = rc;
	return 0;
}

int stk_meta_store_mkdir(struct stk_meta_store *st, const struct stk_cred *cred, uint64_t parent,
			 const char *name, uint32_t mode, struct stk_attr *out)
{
	struct inode dir, n;
	struct op o;
	int rc, step;

	rc = new_entry_begin(&o, st, cred, parent, name, S_IFDIR | (mode & 01777), &dir, &n, &step);
	if (rc)
		return rc;
	rc = step;
	if (rc == 0) {
		n.a.nlink = 2;
		n.a.size = DIR_SIZE;
		n.a.blocks = blocks_of(DIR_SIZE);
		n.parent = parent;
		rc = entry_add(&o, &dir, name, &n);
	}
	rc = op_end(&o, rc);
	if (rc == 0)
		*out = n.a;
	return rc;
}

int stk_meta_store_symlink(struct stk_meta_store *st, const struct stk_cred *cred, uint64_t parent,
			   const char *name, const char *target, struct stk_attr *out)
{
	size_t tlen = strnlen(target, STK_PATH_MAX + 1);
	uint8_t k[8];
	MDB_val key = {sizeof(k), k}, val = {tlen, (void *)target};
	struct inode dir, n;
	struct op o;
	int rc, step;

	if (tlen == 0)
		return -ENOENT;
	if (tlen > STK_PATH_MAX)
		return -ENAMETOOLONG;
	rc = new_entry_begin(&o, st, cred, parent, name, S_IFLNK | 0777, &dir, &n, &step);
	if (rc)
		return rc;
	rc = step;
	if (rc == 0) {
		n.a.size = tlen;
		be64_put(k, n.a.ino);
		rc = lmdb_err(mdb_put(o.txn, st->links, &key, &val, 0), "write symlink");
	}
	if (rc == 0)
		rc = entry_add(&o, &dir, name, &n);
	rc = op_end(&o, rc);
	if (rc == 0)
		*out = n.a;
	return rc;
}

int stk_meta_store_mknod(struct stk_meta_store *st, const struct stk_cred *cred, uint64_t parent,
			 const char *name, uint32_t mode, uint64_t rdev, struct stk_attr *out)
{
	uint32_t type = mode & S_IFMT;
	struct inode dir, n;
	struct op o;
	int rc, step;

	if (type != S_IFIFO && type != S_IFSOCK && type != S_IFCHR && type != S_IFBLK)
		return -EINVAL;
	/* Linux's rule (CAP_MKNOD): only root makes device nodes. */
	if ((type == S_IFCHR || type == S_IFBLK) && cred->uid != 0)
		return -EPERM;
	rc = new_entry_begin(&o, st, cred, parent, name, type | (mode & 07777), &dir, &n, &step);
	if (rc)
		return rc;
	rc = step;
	if (rc == 0) {
		n.a.rdev = type == S_IFCHR || type == S_IFBLK ? rdev : 0;
		rc = entry_add(&o, &dir, name, &n);
	}
	rc = op_end(&o, rc);
	if (rc == 0)
		*out = n.a;
	return rc;
}

int stk_meta_store_link(struct stk_meta_store *st, const struct stk_cred *cred, uint64_t ino,
			uint64_t parent, const char *name, struct stk_attr *out)
{
	struct inode dir, n;
	struct op o;
	int rc;

	rc = check_name(name);
	if (rc)
		return rc;
	rc = op_begin(&o, st, cred, 0);
	if (rc)
		return rc;
	rc = inode_get(&o, ino, &n);
	if (rc == 0 && S_ISDIR(n.a.mode))
		rc = -EPERM;
	if (rc == 0)
		rc = dir_get(&o, parent, MAY_X, &dir);
	if (rc == 0)
		rc = name_free(&o, &dir, name);
	if (rc == 0)
		rc = may(&o, &dir.a, MAY_W | MAY_X);
	if (rc == 0 && n.a.nlink == UINT32_MAX)
		rc = -EMLINK;
	/* An inode counts in one quota: no name of it in another (docs/quotas.md). */
	if (rc == 0 && dir.a.qid != n.a.qid)
		rc = -EXDEV;
	if (rc)
		goto out;
	n.a.nlink++;
	if (n.parent == 0)
		n.parent = parent; /* made by an older release: it has a home now */
	set_ctime(&o, &n.a);
	rc = inode_put(&o, &n);
	if (rc == 0)
		rc = dentry_put(&o, parent, name, ino, n.a.mode);
	if (rc == 0) {
		touch_dir(&o, &dir);
		rc = inode_put(&o, &dir);
	}
out:
	rc = op_end(&o, rc);
	if (rc == 0)
		*out = n.a;
	return rc;
}

/* ---- removing ---- */

/*
 * Loads the parent and the inode `name` names for a removal, in Linux's order of
 * checks: search to find it, then write on the parent, then the sticky rule.
 */
static int victim_get(struct op *o, uint64_t parent, const char *name, struct inode *dir,
		      struct inode *n)
{
	int rc = dir_get(o, parent, MAY_X, dir);

	if (rc == 0)
		rc = child_get(o, dir, name, n);
	if (rc == 0)
		rc = may(o, &dir->a, MAY_W | MAY_X);
	if (rc == 0)
		rc = sticky_ok(o, dir, n);
	return rc;
}

/*
 * A name of a file of another shard (renamed here across shards), for its removal:
 * victim_get stopped at it. Write on the folder; a sticky folder's rule needs the
 * file's owner, which its shard knows: only root and the folder's owner pass here.
 */
static int unlink_remote_check(struct op *o, const struct inode *dir, const struct inode *n)
{
	int rc = may(o, &dir->a, MAY_W | MAY_X);

	if (rc == 0 && (dir->a.mode & S_ISVTX) && !is_root(o) && !is_owner(o, &dir->a))
		rc = -EPERM;
	(void)n;
	return rc;
}

static int unlink_ino(struct stk_meta_store *st, const struct stk_cred *cred, uint64_t parent,
		      const char *name, uint64_t ino, struct stk_attr *out)
{
	struct inode dir, n;
	struct op o;
	int rc;

	rc = check_name(name);
	if (rc)
		return rc;
	rc = op_begin(&o, st, cred, 0);
	if (rc)
		return rc;
	rc = victim_get(&o, parent, name, &dir, &n);
	if (rc == -EREMOTE && !S_ISDIR(n.a.mode))
		rc = unlink_remote_check(&o, &dir, &n);
	else if (rc == -EREMOTE)
		rc = -EISDIR;
	else if (rc == 0)
		rc = xmark_busy(&o, n.a.ino);
	if (rc == 0 && ino != STK_META_ANY_INO && n.a.ino != ino)
		rc = -ENOENT;
	if (rc == 0 && S_ISDIR(n.a.mode))
		rc = -EISDIR;
	if (rc == 0)
		rc = dentry_del(&o, parent, name);
	if (rc == 0 && stk_ino_shard(n.a.ino) != st->shard)
		rc = xrelease_start(&o, n.a.ino); /* its home drops the link (xshard.c) */
	else if (rc == 0)
		rc = inode_unref(&o, &n);
	if (rc == 0) {
		touch_dir(&o, &dir);
		rc = inode_put(&o, &dir);
	}
	rc = op_end(&o, rc);
	if (rc == 0)
		*out = n.a;
	return rc;
}

int stk_meta_store_unlink_ino(struct stk_meta_store *st, const struct stk_cred *cred,
			      uint64_t parent, const char *name, uint64_t ino, struct stk_attr *out)
{
	int rc = unlink_ino(st, cred, parent, name, ino, out);

	/* A full map: once more, the purge kept in memory ("purges" below). */
	if (unrec_retry(st, rc)) {
		rc = unlink_ino(st, cred, parent, name, ino, out);
		unrec_retry_end();
	}
	return rc;
}

int stk_meta_store_unlink(struct stk_meta_store *st, const struct stk_cred *cred, uint64_t parent,
			  const char *name, struct stk_attr *out)
{
	return stk_meta_store_unlink_ino(st, cred, parent, name, STK_META_ANY_INO, out);
}

int stk_meta_store_rmdir(struct stk_meta_store *st, const struct stk_cred *cred, uint64_t parent,
			 const char *name)
{
	return stk_meta_store_rmdir_ino(st, cred, parent, name, STK_META_ANY_INO);
}

/* The inode `name` in parent holds now, 0 when none, for the _ino checks. */
static int ino_now(struct op *o, uint64_t parent, const char *name, uint64_t *ino)
{
	struct dentry d;
	int rc = dentry_get(o, parent, name, &d);

	*ino = rc == 0 ? d.ino : 0;
	return rc == -ENOENT ? 0 : rc;
}

int stk_meta_store_rmdir_ino(struct stk_meta_store *st, const struct stk_cred *cred,
			     uint64_t parent, const char *name, uint64_t ino)
{
	struct inode dir, n;
	uint64_t now;
	struct op o;
	int rc;

	rc = check_name(name);
	if (rc)
		return rc;
	rc = op_begin(&o, st, cred, 0);
	if (rc)
		return rc;
	if (ino != STK_META_ANY_INO) {
		rc = ino_now(&o, parent, name, &now);
		if (rc == 0 && now != ino)
			rc = -EAGAIN;
		if (rc)
			return op_end(&o, rc);
	}
	/* -EREMOTE: another shard's folder, removed with intents (meta/xshard.c) */
	rc = victim_get(&o, parent, name, &dir, &n);
	if (rc == 0 && !S_ISDIR(n.a.mode))
		rc = -ENOTDIR;
	if (rc == 0)
		rc = xmark_busy(&o, n.a.ino); /* in a move across shards */
	if (rc == 0) {
		rc = dir_is_empty(&o, n.a.ino);
		rc = rc == 1 ? 0 : rc == 0 ? -ENOTEMPTY : rc;
	}
	if (rc == 0)
		rc = dentry_del(&o, parent, name);
	if (rc == 0)
		rc = inode_del(&o, &n);
	if (rc == 0) {
		dir.a.nlink--;
		touch_dir(&o, &dir);
		rc = inode_put(&o, &dir);
	}
	return op_end(&o, rc);
}

/* ---- rename ---- */

/* Everything one rename works on. dp points at sp when both names share a directory. */
struct rename_ctx {
	struct inode sp, dp_buf, *dp;
	struct inode src, dst;
	int have_dst;
	int src_remote, dst_remote; /* a name of a file (or folder) of another shard */
	const char *src_name, *dst_name;
	uint32_t flags;
};

/* -EINVAL if `anc` is dir or one of its ancestors, found by following parent pointers. */
static int check_not_ancestor(struct op *o, uint64_t anc, uint64_t dir)
{
	struct inode n;
	uint64_t cur = dir;
	int rc;

	for (unsigned depth = 0; depth < MAX_DEPTH; depth++) {
		if (cur == anc)
			return -EINVAL;
		if (cur == STK_ROOT_INO)
			return 0;
		/* above, another shard's: meta/xshard.c walked the whole chain (the
		 * folder-move lock) before a folder moves on a cluster of shards */
		if (stk_ino_shard(cur) != o->st->shard)
			return 0;
		rc = inode_get_named(o, cur, &n);
		if (rc)
			return rc;
		cur = n.parent;
	}
	stk_error("meta store: directory %llu: parent chain too deep or cyclic",
		  (unsigned long long)dir);
	return -EIO;
}

/* A directory that changes parent needs write on itself (its ".." changes) and no loop. */
static int check_dir_move(struct op *o, const struct inode *d, uint64_t new_parent)
{
	int rc = may(o, &d->a, MAY_W);

	return rc ? rc : check_not_ancestor(o, d->a.ino, new_parent);
}

/* The POSIX rules for a rename that replaces an existing target. */
static int check_replace(struct op *o, const struct rename_ctx *r)
{
	int rc;

	if (S_ISDIR(r->src.a.mode) && !S_ISDIR(r->dst.a.mode))
		return -ENOTDIR;
	if (!S_ISDIR(r->src.a.mode) && S_ISDIR(r->dst.a.mode))
		return -EISDIR;
	if (S_ISDIR(r->dst.a.mode)) {
		rc = dir_is_empty(o, r->dst.a.ino);
		return rc == 1 ? 0 : rc == 0 ? -ENOTEMPTY : rc;
	}
	return 0;
}

/* Loads both parents and both names and runs every check; changes nothing. */
static int rename_prepare(struct op *o, struct rename_ctx *r, uint64_t src_parent,
			  uint64_t dst_parent)
{
	int moved = src_parent != dst_parent, rc;

	/* a name of another shard's inode: rename_remote_here's, or EXDEV */
	rc = victim_get(o, src_parent, r->src_name, &r->sp, &r->src);
	r->src_remote = rc == -EREMOTE;
	if (rc)
		return rc == -EREMOTE ? -EXDEV : rc;
	rc = xmark_busy(o, r->src.a.ino); /* a folder too: in a move across shards */
	if (rc)
		return rc;
	r->dp = &r->sp;
	if (moved) {
		r->dp = &r->dp_buf;
		rc = dir_get(o, dst_parent, MAY_W | MAY_X, r->dp);
		if (rc == 0)
			rc = xmark_dying(o, dst_parent);
		if (rc)
			return rc;
	}
	rc = child_get(o, r->dp, r->dst_name, &r->dst);
	if (rc == -EREMOTE) {
		/* a file of another shard named here is replaced by a release (xshard.c) */
		if (S_ISDIR(r->dst.a.mode) || (r->flags & STK_RENAME_EXCHANGE))
			return -EXDEV;
		r->dst_remote = 1;
		rc = 0;
	}
	if (rc == 0)
		rc = xmark_busy(o, r->dst.a.ino);
	if (rc && rc != -ENOENT)
		return rc;
	r->have_dst = rc == 0;
	if (!r->have_dst && (r->flags & STK_RENAME_EXCHANGE))
		return -ENOENT;
	if (r->have_dst && (r->flags & STK_RENAME_NOREPLACE))
		return -EEXIST;
	if (r->have_dst && r->dst.a.ino == r->src.a.ino)
		return 0; /* two names of one inode: rename does nothing */
	if (r->have_dst) {
		rc = sticky_ok(o, r->dp, &r->dst);
		if (rc)
			return rc;
	}
	if (moved && S_ISDIR(r->src.a.mode)) {
		rc = check_dir_move(o, &r->src, dst_parent);
		if (rc)
			return rc;
	}
	if (!r->have_dst)
		return 0;
	if (r->flags & STK_RENAME_EXCHANGE)
		return moved && S_ISDIR(r->dst.a.mode) ? check_dir_move(o, &r->dst, src_parent) : 0;
	return check_replace(o, r);
}

/* Moves a directory's subdirectory count from one parent to the other. */
static int move_subdir(struct inode *d, struct inode *from, struct inode *to)
{
	if (from == to)
		return 0;
	if (to->a.nlink == UINT32_MAX)
		return -EMLINK;
	from->a.nlink--;
	to->a.nlink++;
	d->parent = to->a.ino;
	return 0;
}

static int rename_write_parents(struct op *o, struct rename_ctx *r)
{
	int rc;

	touch_dir(o, &r->sp);
	rc = inode_put(o, &r->sp);
	if (rc == 0 && r->dp != &r->sp) {
		touch_dir(o, r->dp);
		rc = inode_put(o, r->dp);
	}
	return rc;
}

static int quota_move(struct op *o, struct inode *n, uint64_t from, uint64_t to);

/* src takes dst's name, replacing the target if there is one. */
static int rename_move(struct op *o, struct rename_ctx *r, int *replaced)
{
	int rc;

	rc = quota_move(o, &r->src, r->sp.a.qid, r->dp->a.qid);
	if (rc)
		return rc;
	if (S_ISDIR(r->src.a.mode)) {
		if (r->have_dst)
			r->dp->a.nlink--; /* the empty directory src replaces */
		rc = move_subdir(&r->src, &r->sp, r->dp);
		if (rc)
			return rc;
	} else {
		r->src.parent = r->dp->a.ino;
	}
	rc = dentry_del(o, r->sp.a.ino, r->src_name);
	if (rc == 0)
		rc = dentry_put(o, r->dp->a.ino, r->dst_name, r->src.a.ino, r->src.a.mode);
	if (rc == 0 && r->have_dst && S_ISDIR(r->dst.a.mode))
		rc = inode_del(o, &r->dst);
	if (rc == 0 && r->have_dst && r->dst_remote) {
		rc = xrelease_start(o, r->dst.a.ino); /* its home drops the link */
	} else if (rc == 0 && r->have_dst && !S_ISDIR(r->dst.a.mode)) {
		rc = inode_unref(o, &r->dst);
		*replaced = 1;
	}
	set_ctime(o, &r->src.a);
	if (rc == 0)
		rc = inode_put(o, &r->src);
	return rc ? rc : rename_write_parents(o, r);
}

/* The two names swap inodes. */
static int rename_exchange(struct op *o, struct rename_ctx *r)
{
	int rc;

	rc = quota_move(o, &r->src, r->sp.a.qid, r->dp->a.qid);
	if (rc == 0)
		rc = quota_move(o, &r->dst, r->dp->a.qid, r->sp.a.qid);
	if (rc == 0 && S_ISDIR(r->src.a.mode))
		rc = move_subdir(&r->src, &r->sp, r->dp);
	if (rc == 0 && S_ISDIR(r->dst.a.mode))
		rc = move_subdir(&r->dst, r->dp, &r->sp);
	if (!S_ISDIR(r->src.a.mode))
		r->src.parent = r->dp->a.ino;
	if (!S_ISDIR(r->dst.a.mode))
		r->dst.parent = r->sp.a.ino;
	if (rc == 0)
		rc = dentry_put(o, r->sp.a.ino, r->src_name, r->dst.a.ino, r->dst.a.mode);
	if (rc == 0)
		rc = dentry_put(o, r->dp->a.ino, r->dst_name, r->src.a.ino, r->src.a.mode);
	set_ctime(o, &r->src.a);
	set_ctime(o, &r->dst.a);
	if (rc == 0)
		rc = inode_put(o, &r->src);
	if (rc == 0)
		rc = inode_put(o, &r->dst);
	return rc ? rc : rename_write_parents(o, r);
}

int stk_meta_store_rename(struct stk_meta_store *st, const struct stk_cred *cred,
			  uint64_t src_parent, const char *src_name, uint64_t dst_parent,
			  const char *dst_name, uint32_t flags, int *replaced, struct stk_attr *out)
{
	return stk_meta_store_rename_ino(st, cred, src_parent, src_name, dst_parent, dst_name,
					 flags, STK_META_ANY_INO, STK_META_ANY_INO, replaced, out);
}

/*
 * A name of another shard's inode renamed within this shard (rename_prepare said
 * EXDEV): only the entry here changes, the inode is left alone. A folder's, within
 * its parent when it replaces nothing (its parent pointer stays right); a file's,
 * to any folder here (its home keeps only which shard names it), replacing a file
 * as a rename does (*replaced: a file of this shard lost that name; one of
 * another shard's is released). Anything else (a folder moved or replacing, a
 * sticky folder whose rule needs the inode's owner) stays EXDEV: the tool copies.
 */
static int rename_remote_here(struct op *o, struct rename_ctx *r, uint64_t src_parent,
			      uint64_t dst_parent, int *replaced)
{
	struct inode dst;
	int rc, moved = src_parent != dst_parent;

	rc = victim_get(o, src_parent, r->src_name, &r->sp, &r->src);
	if (rc != -EREMOTE)
		return -EXDEV; /* not another shard's: the first answer stands */
	if (moved && S_ISDIR(r->src.a.mode))
		return -EXDEV;
	rc = may(o, &r->sp.a, MAY_W | MAY_X);
	if (rc)
		return rc;
	if ((r->sp.a.mode & S_ISVTX) && !is_root(o) && !is_owner(o, &r->sp.a))
		return -EXDEV;
	r->dp = &r->sp;
	if (moved) {
		r->dp = &r->dp_buf;
		rc = dir_get(o, dst_parent, MAY_W | MAY_X, r->dp);
		if (rc == 0)
			rc = xmark_dying(o, dst_parent);
		/* it counts at its home: not into another quota (docs/quotas.md) */
		if (rc == 0 && r->dp->a.qid != r->sp.a.qid)
			rc = -EXDEV;
		if (rc)
			return rc;
	} else if (strcmp(r->src_name, r->dst_name) == 0) {
		return 0;
	}
	rc = xmark_busy(o, r->src.a.ino); /* a folder too: in a move across shards */
	if (rc)
		return rc;
	rc = child_get(o, r->dp, r->dst_name, &dst);
	if (rc == 0 || rc == -EREMOTE) {
		int remote = rc == -EREMOTE;

		if (r->flags & STK_RENAME_NOREPLACE)
			return -EEXIST;
		if (S_ISDIR(r->src.a.mode))
			return -EXDEV;
		if (dst.a.ino == r->src.a.ino)
			return 0; /* two names of one file: rename does nothing */
		if (S_ISDIR(dst.a.mode))
			return -EISDIR;
		if (remote)
			rc = (r->dp->a.mode & S_ISVTX) && !is_root(o) && !is_owner(o, &r->dp->a)
				 ? -EXDEV
				 : 0;
		else
			rc = sticky_ok(o, r->dp, &dst);
		if (rc == 0)
			rc = xmark_busy(o, dst.a.ino);
		if (rc)
			return rc;
		r->have_dst = 1;
		r->dst_remote = remote;
		r->dst = dst;
	} else if (rc != -ENOENT) {
		return rc;
	}
	rc = dentry_del(o, src_parent, r->src_name);
	if (rc == 0)
		rc = dentry_put(o, dst_parent, r->dst_name, r->src.a.ino, r->src.a.mode);
	if (rc == 0 && r->have_dst && r->dst_remote) {
		rc = xrelease_start(o, r->dst.a.ino);
	} else if (rc == 0 && r->have_dst) {
		rc = inode_unref(o, &r->dst);
		*replaced = 1;
	}
	return rc ? rc : rename_write_parents(o, r);
}

static int rename_ino(struct stk_meta_store *st, const struct stk_cred *cred, uint64_t src_parent,
		      const char *src_name, uint64_t dst_parent, const char *dst_name,
		      uint32_t flags, uint64_t src_ino, uint64_t dst_ino, int *replaced,
		      struct stk_attr *out)
{
	const uint32_t both = STK_RENAME_NOREPLACE | STK_RENAME_EXCHANGE;
	struct rename_ctx r;
	int rep = 0, rc;
	uint64_t now;
	struct op o;

	*replaced = 0;
	memset(out, 0, sizeof(*out));
	if ((flags & ~both) || flags == both)
		return -EINVAL;
	rc = check_name(src_name);
	if (rc == 0)
		rc = check_name(dst_name);
	if (rc)
		return rc;
	memset(&r, 0, sizeof(r));
	r.src_name = src_name;
	r.dst_name = dst_name;
	r.flags = flags;
	rc = op_begin(&o, st, cred, 0);
	if (rc)
		return rc;
	if (src_ino != STK_META_ANY_INO) {
		rc = ino_now(&o, src_parent, src_name, &now);
		if (rc == 0 && now != src_ino)
			rc = -EAGAIN;
	}
	if (rc == 0 && dst_ino != STK_META_ANY_INO) {
		rc = ino_now(&o, dst_parent, dst_name, &now);
		if (rc == 0 && now != dst_ino)
			rc = -EAGAIN;
	}
	if (rc)
		goto out;
	rc = rename_prepare(&o, &r, src_parent, dst_parent);
	if (rc == -EXDEV && r.src_remote && !(flags & STK_RENAME_EXCHANGE)) {
		rc = rename_remote_here(&o, &r, src_parent, dst_parent, &rep);
		goto out;
	}
	if (rc || (r.have_dst && r.dst.a.ino == r.src.a.ino))
		goto out;
	if (flags & STK_RENAME_EXCHANGE)
		rc = rename_exchange(&o, &r);
	else
		rc = rename_move(&o, &r, &rep);
out:
	rc = op_end(&o, rc);
	if (rc == 0 && rep) {
		*replaced = 1;
		*out = r.dst.a;
	}
	return rc;
}

int stk_meta_store_rename_ino(struct stk_meta_store *st, const struct stk_cred *cred,
			      uint64_t src_parent, const char *src_name, uint64_t dst_parent,
			      const char *dst_name, uint32_t flags, uint64_t src_ino,
			      uint64_t dst_ino, int *replaced, struct stk_attr *out)
{
	int rc = rename_ino(st, cred, src_parent, src_name, dst_parent, dst_name, flags, src_ino,
			    dst_ino, replaced, out);

	/* A full map: once more, the purge of a file it replaces kept in memory. */
	if (unrec_retry(st, rc)) {
		rc = rename_ino(st, cred, src_parent, src_name, dst_parent, dst_name, flags,
				src_ino, dst_ino, replaced, out);
		unrec_retry_end();
	}
	return rc;
}

/* ---- orphans: files without a name that a session still holds open ---- */

/* Orphans are keys "orphan" + be64 ino in the sys table, with an empty value. */
static const char ORPHAN_PREFIX[] = "orphan";
#define ORPHAN_KEY_LEN (sizeof(ORPHAN_PREFIX) - 1 + 8)

static void orphan_key(uint8_t *k, uint64_t ino)
{
	memcpy(k, ORPHAN_PREFIX, sizeof(ORPHAN_PREFIX) - 1);
	be64_put(k + sizeof(ORPHAN_PREFIX) - 1, ino);
}

static int orphan_put(struct op *o, uint64_t ino)
{
	uint8_t k[ORPHAN_KEY_LEN];
	MDB_val key = {sizeof(k), k}, val = {0, k};

	orphan_key(k, ino);
	return lmdb_err(mdb_put(o->txn, o->st->sys, &key, &val, 0), "write orphan");
}

void stk_meta_store_set_open_hook(struct stk_meta_store *st, stk_meta_open_fn fn, void *ctx)
{
	st->open_fn = fn;
	st->open_ctx = ctx;
}

int stk_meta_store_orphans(struct stk_meta_store *st, uint64_t *inos, size_t max, size_t *n)
{
	static const struct stk_cred root_cred;
	uint8_t k[ORPHAN_KEY_LEN];
	MDB_val key = {sizeof(k), k}, val;
	MDB_cursor *cur = NULL;
	struct op o;
	int rc, mrc;

	*n = 0;
	rc = op_begin(&o, st, &root_cred, 1);
	if (rc)
		return rc;
	orphan_key(k, 0);
	rc = lmdb_err(mdb_cursor_open(o.txn, st->sys, &cur), "open cursor");
	if (rc)
		goto out;
	for (mrc = mdb_cursor_get(cur, &key, &val, MDB_SET_RANGE); mrc == 0 && *n < max;
	     mrc = mdb_cursor_get(cur, &key, &val, MDB_NEXT)) {
		if (key.mv_size != ORPHAN_KEY_LEN ||
		    memcmp(key.mv_data, ORPHAN_PREFIX, sizeof(ORPHAN_PREFIX) - 1))
			break;
		inos[(*n)++] = be64_get((const uint8_t *)key.mv_data + sizeof(ORPHAN_PREFIX) - 1);
	}
	if (mrc && mrc != MDB_NOTFOUND)
		rc = lmdb_err(mrc, "list orphans");
out:
	if (cur)
		mdb_cursor_close(cur);
	return op_end(&o, rc);
}

static int orphan_drop(struct stk_meta_store *st, uint64_t ino)
{
	static const struct stk_cred root_cred;
	uint8_t k[ORPHAN_KEY_LEN];
	MDB_val key = {sizeof(k), k};
	struct inode n;
	struct op o;
	int rc;

	rc = op_begin(&o, st, &root_cred, 0);
	if (rc)
		return rc;
	orphan_key(k, ino);
	rc = lmdb_err(mdb_del(o.txn, st->sys, &key, NULL), "delete orphan");
	if (rc == 0) {
		rc = inode_get(&o, ino, &n);
		if (rc == 0 && n.a.nlink == 0)
			rc = inode_del(&o, &n);
		else if (rc == -ENOENT)
			rc = 0;
	}
	return op_end(&o, rc);
}

int stk_meta_store_orphan_drop(struct stk_meta_store *st, uint64_t ino)
{
	int rc = orphan_drop(st, ino);

	if (unrec_retry(st, rc)) {
		rc = orphan_drop(st, ino);
		unrec_retry_end();
	}
	return rc;
}

/* ---- purges: the chunks of freed files, until storage has removed them ---- */

/*
 * Table "purge": key be64 ino, value u8 format (PURGE_FORMAT), the layout (u32
 * chunk_size, stripe, nchains, start, u64 seed) and u64 size. inode_del writes one
 * in the transaction that frees a regular file; meta's purge thread removes it
 * once every chain of the layout has dropped the chunks (stk_meta_store_purge_done).
 */
#define PURGE_FORMAT 1
#define PURGE_REC_LEN (1 + 4 * 4 + 8 + 8)
/* Purges kept in memory at most (about 40 bytes each); past it a freeing fails ENOSPC. */
#define UNREC_MAX (1u << 20)

/*
 * A full map. Each freeing writes its purge record, so on a map with no page
 * left the unlink that would free space would fail with ENOSPC. Such an
 * operation (unlink, rename over a file, an orphan's drop) is tried once more
 * without the record and with the map's reserve opened (unrec_retry,
 * RESERVE_FREEING), since a freeing needs a few new pages of its own: the
 * purge is then kept in memory, in the store's unrec list, published there
 * only when the transaction that freed the inode commits, and the purger sends
 * it like a record (purge.h). A meta that stops before it is sent leaves those
 * chunks behind, logged here; they belong to no inode, and stoker fsck finds
 * and removes them as garbage.
 */
static int unrec_add(struct op *o, const struct inode *n)
{
	struct stk_meta_purge *v;
	size_t queued;

	pthread_mutex_lock(&o->st->umu);
	queued = o->st->nunrec;
	pthread_mutex_unlock(&o->st->umu);
	if (queued + unrec_tl.n >= UNREC_MAX)
		return -ENOSPC; /* storage has not kept up: fail as the record would */
	if (unrec_tl.n == unrec_tl.cap) {
		size_t cap = unrec_tl.cap ? 2 * unrec_tl.cap : 16;

		v = realloc(unrec_tl.v, cap * sizeof(*v));
		if (!v)
			return -ENOMEM;
		unrec_tl.v = v;
		unrec_tl.cap = cap;
	}
	unrec_tl.v[unrec_tl.n++] =
	    (struct stk_meta_purge){.ino = n->a.ino, .layout = n->a.layout, .size = n->a.size};
	return 0;
}

/* After o's transaction ended: what it kept in memory goes with it, or is published. */
static void unrec_settle(struct op *o, int committed)
{
	struct stk_meta_store *st = o->st;
	size_t from = o->unrec_mark, n = unrec_tl.n - from;

	if (!committed) {
		unrec_tl.n = from;
	} else if (!o->nested && n) {
		/* The outermost commit: the inodes are gone for good, their purges are due. */
		uint64_t total;

		pthread_mutex_lock(&st->umu);
		if (st->nunrec + n > st->capunrec) {
			size_t cap = STK_MAX(2 * st->capunrec, st->nunrec + n);
			struct stk_meta_purge *v = realloc(st->unrec, cap * sizeof(*v));

			if (v) {
				st->unrec = v;
				st->capunrec = cap;
			}
		}
		if (st->nunrec + n <= st->capunrec) {
			memcpy(&st->unrec[st->nunrec], &unrec_tl.v[from], n * sizeof(*st->unrec));
			st->nunrec += n;
		} else {
			stk_error("meta store: out of memory: the purges of %zu file(s) are lost; "
				  "stoker fsck finds their chunks as garbage",
				  n);
		}
		total = st->unrec_total += n;
		pthread_mutex_unlock(&st->umu);
		if (total == n || total / 1000 != (total - n) / 1000)
			stk_warn("meta store: the map is full: the purges of %llu freed file(s) "
				 "so far are kept in memory only (inode %llu the last); a restart "
				 "before they are done leaves their chunks to stoker fsck",
				 (unsigned long long)total,
				 (unsigned long long)unrec_tl.v[from + n - 1].ino);
		unrec_tl.n = from;
	}
	if (!o->nested && unrec_tl.n == 0 && unrec_tl.v) {
		free(unrec_tl.v);
		unrec_tl.v = NULL;
		unrec_tl.cap = 0;
	}
}

/*
 * Whether an operation that failed with rc should be tried again without purge
 * records: only ENOSPC, and not from inside such a retry. Sets skip: the caller
 * retries, then calls unrec_retry_end.
 */
static int unrec_retry(struct stk_meta_store *st, int rc)
{
	if (rc != -ENOSPC || unrec_tl.skip)
		return 0;
	unrec_tl.skip = 1;
	/* Room for it, if the map has a reserve left (a batch holds the map: none). */
	if (!(batch.st == st && batch.txn))
		reserve_open(st);
	return 1;
}

static void unrec_retry_end(void)
{
	unrec_tl.skip = 0;
}

static int purge_put(struct op *o, const struct inode *n)
{
	uint8_t k[8], buf[PURGE_REC_LEN];
	MDB_val key = {sizeof(k), k}, val = {sizeof(buf), buf};
	struct stk_wbuf w;

	/* No layout (a store's test files, a corrupt record): nothing was ever stored. */
	if (n->a.layout.stripe == 0 || n->a.layout.chunk_size == 0)
		return 0;
	if (unrec_tl.skip)
		return unrec_add(o, n);
	stk_wbuf_init(&w, buf, sizeof(buf));
	stk_put_u8(&w, PURGE_FORMAT);
	stk_put_u32(&w, n->a.layout.chunk_size);
	stk_put_u32(&w, n->a.layout.stripe);
	stk_put_u32(&w, n->a.layout.nchains);
	stk_put_u32(&w, n->a.layout.start);
	stk_put_u64(&w, n->a.layout.seed);
	stk_put_u64(&w, n->a.size);
	if (w.err)
		return -EIO;
	be64_put(k, n->a.ino);
	return lmdb_err(mdb_put(o->txn, o->st->purge, &key, &val, 0), "write purge");
}

static int purge_decode(const MDB_val *key, const MDB_val *val, struct stk_meta_purge *p)
{
	struct stk_rbuf r;
	uint8_t fmt;

	if (key->mv_size != 8)
		return -EIO;
	memset(p, 0, sizeof(*p));
	p->ino = be64_get(key->mv_data);
	stk_rbuf_init(&r, val->mv_data, val->mv_size);
	fmt = stk_get_u8(&r);
	p->layout.chunk_size = stk_get_u32(&r);
	p->layout.stripe = stk_get_u32(&r);
	p->layout.nchains = stk_get_u32(&r);
	p->layout.start = stk_get_u32(&r);
	p->layout.seed = stk_get_u64(&r);
	p->size = stk_get_u64(&r);
	if (stk_rbuf_finish(&r) || fmt != PURGE_FORMAT) {
		stk_error("meta store: purge record of inode %llu is corrupt",
			  (unsigned long long)p->ino);
		return -EIO;
	}
	return 0;
}

int stk_meta_store_purges(struct stk_meta_store *st, uint64_t from, struct stk_meta_purge *out,
			  size_t max, size_t *n)
{
	static const struct stk_cred root_cred;
	uint8_t k[8];
	MDB_val key = {sizeof(k), k}, val;
	MDB_cursor *cur = NULL;
	struct op o;
	int rc, mrc;

	*n = 0;
	rc = op_begin(&o, st, &root_cred, 1);
	if (rc)
		return rc;
	be64_put(k, from);
	rc = lmdb_err(mdb_cursor_open(o.txn, st->purge, &cur), "open cursor");
	if (rc)
		goto out;
	for (mrc = mdb_cursor_get(cur, &key, &val, MDB_SET_RANGE); mrc == 0 && *n < max;
	     mrc = mdb_cursor_get(cur, &key, &val, MDB_NEXT)) {
		/* A corrupt record is skipped (logged), so that it does not stop the rest. */
		if (purge_decode(&key, &val, &out[*n]) == 0)
			(*n)++;
	}
	if (mrc && mrc != MDB_NOTFOUND)
		rc = lmdb_err(mrc, "list purges");
out:
	if (cur)
		mdb_cursor_close(cur);
	return op_end(&o, rc);
}

int stk_meta_store_purge_done(struct stk_meta_store *st, const uint64_t *inos, size_t n)
{
	static const struct stk_cred root_cred;
	uint8_t k[8];
	MDB_val key = {sizeof(k), k};
	struct op o;
	int rc;

	rc = op_begin(&o, st, &root_cred, 0);
	if (rc)
		return rc;
	for (size_t i = 0; rc == 0 && i < n; i++) {
		be64_put(k, inos[i]);
		rc = lmdb_err(mdb_del(o.txn, st->purge, &key, NULL), "delete purge");
		if (rc == -ENOENT)
			rc = 0;
	}
	return op_end(&o, rc);
}

int stk_meta_store_purge_count(struct stk_meta_store *st, uint64_t *n)
{
	static const struct stk_cred root_cred;
	MDB_stat ms;
	struct op o;
	int rc;

	*n = 0;
	rc = op_begin(&o, st, &root_cred, 1);
	if (rc)
		return rc;
	rc = lmdb_err(mdb_stat(o.txn, st->purge, &ms), "count purges");
	if (rc == 0)
		*n = ms.ms_entries;
	rc = op_end(&o, rc);
	pthread_mutex_lock(&st->umu);
	*n += st->nunrec;
	pthread_mutex_unlock(&st->umu);
	return rc;
}

size_t stk_meta_store_purges_unrecorded(struct stk_meta_store *st, struct stk_meta_purge *out,
					size_t max)
{
	size_t n;

	pthread_mutex_lock(&st->umu);
	n = STK_MIN(max, st->nunrec);
	if (n) /* none kept: st->unrec is NULL */
		memcpy(out, st->unrec, n * sizeof(*out));
	pthread_mutex_unlock(&st->umu);
	return n;
}

void stk_meta_store_unrecorded_done(struct stk_meta_store *st, size_t taken, const uint8_t *failed)
{
	size_t kept = 0;

	pthread_mutex_lock(&st->umu);
	/* Only appends happened since they were taken: they are still the first. */
	taken = STK_MIN(taken, st->nunrec);
	if (taken == 0) {
		pthread_mutex_unlock(&st->umu);
		return;
	}
	for (size_t i = 0; i < taken; i++)
		if (failed[i])
			st->unrec[kept++] = st->unrec[i];
	memmove(&st->unrec[kept], &st->unrec[taken], (st->nunrec - taken) * sizeof(*st->unrec));
	st->nunrec -= taken - kept;
	if (st->nunrec == 0) {
		free(st->unrec);
		st->unrec = NULL;
		st->capunrec = 0;
	}
	pthread_mutex_unlock(&st->umu);
}

/* ---- extended attributes ---- */

/*
 * One record per attribute: key be64 ino + the full name (with its namespace
 * prefix), value the bytes. The checks follow Linux's xattr_permission() and the
 * capability rules for security.*: see store.h.
 */
#define XATTR_KEY_MAX (8 + STK_NAME_MAX)

enum xattr_ns { XNS_USER, XNS_TRUSTED, XNS_SECURITY };

static int xattr_ns_of(const char *name, enum xattr_ns *ns)
{
	size_t len = strnlen(name, STK_NAME_MAX + 1);

	if (len == 0 || len > STK_NAME_MAX)
		return -ERANGE;
	if (strncmp(name, "user.", 5) == 0 && len > 5)
		*ns = XNS_USER;
	else if (strncmp(name, "trusted.", 8) == 0 && len > 8)
		*ns = XNS_TRUSTED;
	else if (strncmp(name, "security.", 9) == 0 && len > 9)
		*ns = XNS_SECURITY;
	else
		return -EOPNOTSUPP; /* system.* (POSIX ACLs), unknown or bare prefixes */
	return 0;
}

static size_t xattr_key(uint8_t *k, uint64_t ino, const char *name)
{
	size_t len = strlen(name);

	be64_put(k, ino);
	memcpy(k + 8, name, len);
	return 8 + len;
}

/* Loads inode ino and checks that the caller may read (write = 0) or change `name`. */
static int xattr_access(struct op *o, uint64_t ino, const char *name, int write, struct inode *n)
{
	enum xattr_ns ns;
	int rc = xattr_ns_of(name, &ns);

	if (rc == 0)
		rc = inode_get(o, ino, n);
	if (rc)
		return rc;
	switch (ns) {
	case XNS_TRUSTED:
		if (!is_root(o))
			return write ? -EPERM : -ENODATA;
		return 0;
	case XNS_SECURITY:
		return write && !is_root(o) ? -EPERM : 0;
	case XNS_USER:
		break;
	}
	if (!S_ISREG(n->a.mode) && !S_ISDIR(n->a.mode))
		return write ? -EPERM : -ENODATA;
	if (write && S_ISDIR(n->a.mode) && (n->a.mode & S_ISVTX) && !is_owner(o, &n->a))
		return -EPERM;
	return may(o, &n->a, write ? MAY_W : MAY_R);
}

/*
 * Walks the xattrs of ino in key order: fn gets each name (key bytes after the
 * inode number, not NUL-terminated) and its value's length. fn returns 0 to go on,
 * or -errno to stop with it.
 */
typedef int (*xattr_fn)(struct op *o, MDB_cursor *c, const MDB_val *key, const MDB_val *val,
			void *ctx);

static int xattrs_walk(struct op *o, uint64_t ino, xattr_fn fn, void *ctx)
{
	uint8_t k[8];
	MDB_val key = {sizeof(k), k}, val;
	MDB_cursor *c;
	int rc, mrc;

	be64_put(k, ino);
	rc = lmdb_err(mdb_cursor_open(o->txn, o->st->xattrs, &c), "open cursor");
	if (rc)
		return rc;
	for (mrc = mdb_cursor_get(c, &key, &val, MDB_SET_RANGE); mrc == 0;
	     mrc = mdb_cursor_get(c, &key, &val, MDB_NEXT)) {
		if (key.mv_size <= 8 || be64_get(key.mv_data) != ino)
			break;
		rc = fn(o, c, &key, &val, ctx);
		if (rc)
			break;
	}
	if (rc == 0 && mrc && mrc != MDB_NOTFOUND)
		rc = lmdb_err(mrc, "read xattr");
	mdb_cursor_close(c);
	return rc;
}

static int xattr_del_one(struct op *o, MDB_cursor *c, const MDB_val *key, const MDB_val *val,
			 void *ctx)
{
	(void)key;
	(void)val;
	(void)ctx;
	(void)o;
	return lmdb_err(mdb_cursor_del(c, 0), "delete xattr");
}

static int xattrs_del_all(struct op *o, uint64_t ino)
{
	return xattrs_walk(o, ino, xattr_del_one, NULL);
}

/* Listing: names of the namespaces the caller may see, each NUL-terminated. */
struct xattr_list {
	char *buf;
	size_t cap;
	size_t len;
};

static int xattr_list_one(struct op *o, MDB_cursor *c, const MDB_val *key, const MDB_val *val,
			  void *ctx)
{
	struct xattr_list *l = ctx;
	const char *name = (const char *)key->mv_data + 8;
	size_t nlen = key->mv_size - 8;

	(void)c;
	(void)val;
	if (nlen > STK_NAME_MAX)
		return -EIO;
	if (!is_root(o) && nlen >= 8 && memcmp(name, "trusted.", 8) == 0)
		return 0;
	if (l->buf && l->len + nlen + 1 <= l->cap) {
		memcpy(l->buf + l->len, name, nlen);
		l->buf[l->len + nlen] = 0;
	}
	l->len += nlen + 1;
	return 0;
}

int stk_meta_store_setxattr(struct stk_meta_store *st, const struct stk_cred *cred, uint64_t ino,
			    const char *name, const void *value, size_t size, uint32_t flags)
{
	uint8_t k[XATTR_KEY_MAX];
	MDB_val key = {0, k}, val;
	struct xattr_list l = {NULL, 0, 0};
	struct inode n;
	struct op o;
	int rc, exists;

	if (flags & ~(STK_XATTR_CREATE | STK_XATTR_REPLACE))
		return -EINVAL;
	if (size > STK_XATTR_SIZE_MAX)
		return -E2BIG;
	if (size && !value)
		return -EINVAL;
	rc = op_begin(&o, st, cred, 0);
	if (rc)
		return rc;
	rc = xattr_access(&o, ino, name, 1, &n);
	if (rc)
		goto out;
	key.mv_size = xattr_key(k, ino, name);
	rc = mdb_get(o.txn, st->xattrs, &key, &val);
	exists = rc == 0;
	rc = rc == MDB_NOTFOUND ? 0 : lmdb_err(rc, "read xattr");
	if (rc == 0 && exists && (flags & STK_XATTR_CREATE))
		rc = -EEXIST;
	if (rc == 0 && !exists && (flags & STK_XATTR_REPLACE))
		rc = -ENODATA;
	/* listxattr must be able to return every name: the names' total is bounded. */
	if (rc == 0 && !exists) {
		rc = xattrs_walk(&o, ino, xattr_list_one, &l);
		if (rc == 0 && l.len + strlen(name) + 1 > STK_XATTR_SIZE_MAX)
			rc = -ENOSPC;
	}
	if (rc)
		goto out;
	val.mv_size = size;
	val.mv_data = size ? (void *)value : k; /* LMDB wants a pointer even for 0 bytes */
	rc = lmdb_err(mdb_put(o.txn, st->xattrs, &key, &val, 0), "write xattr");
	if (rc == 0) {
		set_ctime(&o, &n.a);
		rc = inode_put(&o, &n);
	}
out:
	return op_end(&o, rc);
}

int stk_meta_store_getxattr(struct stk_meta_store *st, const struct stk_cred *cred, uint64_t ino,
			    const char *name, void *buf, size_t cap, size_t *len)
{
	uint8_t k[XATTR_KEY_MAX];
	MDB_val key = {0, k}, val;
	struct inode n;
	struct op o;
	int rc;

	*len = 0;
	rc = op_begin(&o, st, cred, 1);
	if (rc)
		return rc;
	rc = xattr_access(&o, ino, name, 0, &n);
	if (rc)
		goto out;
	key.mv_size = xattr_key(k, ino, name);
	rc = mdb_get(o.txn, st->xattrs, &key, &val);
	if (rc) {
		rc = rc == MDB_NOTFOUND ? -ENODATA : lmdb_err(rc, "read xattr");
		goto out;
	}
	*len = val.mv_size;
	if (cap == 0)
		goto out;
	if (val.mv_size > cap)
		rc = -ERANGE;
	else if (val.mv_size)
		memcpy(buf, val.mv_data, val.mv_size);
out:
	return op_end(&o, rc);
}

int stk_meta_store_listxattr(struct stk_meta_store *st, const struct stk_cred *cred, uint64_t ino,
			     char *buf, size_t cap, size_t *len)
{
	struct xattr_list l = {cap ? buf : NULL, cap, 0};
	struct inode n;
	struct op o;
	int rc;

	*len = 0;
	rc = op_begin(&o, st, cred, 1);
	if (rc)
		return rc;
	rc = inode_get(&o, ino, &n);
	if (rc == 0)
		rc = xattrs_walk(&o, ino, xattr_list_one, &l);
	if (rc == 0) {
		*len = l.len;
		if (cap && l.len > cap)
			rc = -ERANGE;
	}
	return op_end(&o, rc);
}

int stk_meta_store_removexattr(struct stk_meta_store *st, const struct stk_cred *cred, uint64_t ino,
			       const char *name)
{
	uint8_t k[XATTR_KEY_MAX];
	MDB_val key = {0, k};
	struct inode n;
	struct op o;
	int rc;

	rc = op_begin(&o, st, cred, 0);
	if (rc)
		return rc;
	rc = xattr_access(&o, ino, name, 1, &n);
	if (rc)
		goto out;
	key.mv_size = xattr_key(k, ino, name);
	rc = mdb_del(o.txn, st->xattrs, &key, NULL);
	rc = rc == MDB_NOTFOUND ? -ENODATA : lmdb_err(rc, "delete xattr");
	if (rc == 0) {
		set_ctime(&o, &n.a);
		rc = inode_put(&o, &n);
	}
out:
	return op_end(&o, rc);
}

/* ---- quotas ---- */

/*
 * A quota root's record in the quotas table: key be64 qid (the folder's inode
 * number), value u8 format (1), u64 parent (the quota root of the folder's own
 * context, that is the nearest one above it; 0: none), u64 limit_bytes,
 * u64 limit_inodes (0: no limit of that kind), u64 used_bytes, u64 used_inodes.
 *
 * An inode counts in the quota its qid names and in every quota above that one
 * (parent, its parent, ...): nested quotas all apply, as a team's quota still
 * holds when one of its projects gets its own. Usage changes in the transaction
 * that changes the inode, so it is exact across any crash: a transaction that
 * did not commit changed neither. What is reserved for writes in flight is in
 * memory (struct resv) and dies with the sessions that hold it.
 */
#define QUOTA_FORMAT 1
#define QUOTA_REC_LEN (1 + 5 * 8)
/* Nested quotas deeper than this can only be a cycle in a corrupt store. */
#define QUOTA_DEPTH_MAX 16
/* A walk of a big tree logs how far it got every this many inodes. */
#define QUOTA_PROGRESS 100000u

struct quota {
	uint64_t qid, parent, limit_bytes, limit_inodes, used_bytes, used_inodes;
};

/*
 * Room a session holds to write a file past its size (stk_meta_store_quota_reserve):
 * the holder may write up to `granted`; what counts as reserved in each quota of
 * `chain` (the file's quota, then those above it) is granted - size, or 0 once
 * the size caught up, kept current by resv_resize. Guarded by st->qmu.
 */
struct resv {
	uint64_t session, ino;
	uint64_t granted;
	uint64_t charged;
	uint64_t chain[QUOTA_DEPTH_MAX];
	unsigned nchain;
	struct resv *next;
};

/*
 * Inodes a session may create in quota `qid` (its nearest quota root) without a
 * check at each create (stk_meta_store_quota_allow): the holder of a delegated
 * folder answers creates itself and sends them later (META_NAMES), so the room
 * is set aside when granted. `left` counts in each quota of `chain` as if used
 * until spent (allow_take, one per create) or released. Guarded by st->qmu.
 */
struct allow {
	uint64_t session, qid;
	uint64_t left;
	uint64_t chain[QUOTA_DEPTH_MAX];
	unsigned nchain;
	struct allow *next;
};

static struct resv **resv_bucket(struct stk_meta_store *st, uint64_t ino)
{
	return &st->resv[(ino * 0x9E3779B97F4A7C15ull) >> 56];
}

static int quota_get(struct op *o, uint64_t qid, struct quota *q)
{
	uint8_t k[8];
	MDB_val key = {sizeof(k), k}, val;
	struct stk_rbuf r;
	uint8_t fmt;
	int rc;

	be64_put(k, qid);
	rc = mdb_get(o->txn, o->st->quotas, &key, &val);
	if (rc)
		return lmdb_err(rc, "read quota");
	stk_rbuf_init(&r, val.mv_data, val.mv_size);
	fmt = stk_get_u8(&r);
	q->qid = qid;
	q->parent = stk_get_u64(&r);
	q->limit_bytes = stk_get_u64(&r);
	q->limit_inodes = stk_get_u64(&r);
	q->used_bytes = stk_get_u64(&r);
	q->used_inodes = stk_get_u64(&r);
	if (stk_rbuf_finish(&r) || fmt != QUOTA_FORMAT) {
		stk_error("meta store: quota %llu: corrupt record", (unsigned long long)qid);
		return -EIO;
	}
	return 0;
}

static int quota_put(struct op *o, const struct quota *q)
{
	uint8_t k[8], buf[QUOTA_REC_LEN];
	MDB_val key = {sizeof(k), k}, val = {sizeof(buf), buf};
	struct stk_wbuf w;

	stk_wbuf_init(&w, buf, sizeof(buf));
	stk_put_u8(&w, QUOTA_FORMAT);
	stk_put_u64(&w, q->parent);
	stk_put_u64(&w, q->limit_bytes);
	stk_put_u64(&w, q->limit_inodes);
	stk_put_u64(&w, q->used_bytes);
	stk_put_u64(&w, q->used_inodes);
	be64_put(k, q->qid);
	return lmdb_err(mdb_put(o->txn, o->st->quotas, &key, &val, 0), "write quota");
}

static int quota_del(struct op *o, uint64_t qid)
{
	uint8_t k[8];
	MDB_val key = {sizeof(k), k};
	int rc;

	be64_put(k, qid);
	rc = lmdb_err(mdb_del(o->txn, o->st->quotas, &key, NULL), "delete quota");
	return rc == -ENOENT ? 0 : rc;
}

/*
 * The quotas an inode tagged qid counts in, the nearest first, into q (up to
 * QUOTA_DEPTH_MAX). A tag naming a quota that is gone ends the chain there (a
 * recount retags such inodes); a chain deeper than the limit is corruption.
 */
static int quota_chain(struct op *o, uint64_t qid, struct quota *q, unsigned *n)
{
	int rc;

	*n = 0;
	while (qid) {
		if (*n == QUOTA_DEPTH_MAX) {
			stk_error("meta store: quota %llu: chain of quotas too deep or cyclic",
				  (unsigned long long)qid);
			return -EIO;
		}
		rc = quota_get(o, qid, &q[*n]);
		if (rc == -ENOENT) {
			stk_warn("meta store: an inode counts in quota %llu, which is gone "
				 "(stoker quota recount fixes it)",
				 (unsigned long long)qid);
			return 0;
		}
		if (rc)
			return rc;
		qid = q[(*n)++].parent;
	}
	return 0;
}

static uint64_t add_sat(uint64_t v, int64_t d)
{
	if (d < 0)
		return (uint64_t)-d > v ? 0 : v - (uint64_t)-d;
	return UINT64_MAX - v < (uint64_t)d ? UINT64_MAX : v + (uint64_t)d;
}

/* With qmu held: the bytes reserved in quota qid, byte allowances included. */
static uint64_t resv_sum_locked(struct stk_meta_store *st, uint64_t qid)
{
	uint64_t sum = 0;

	for (size_t b = 0; b < STK_ARRAY_SIZE(st->resv); b++)
		for (struct resv *r = st->resv[b]; r; r = r->next)
			for (unsigned i = 0; i < r->nchain; i++)
				if (r->chain[i] == qid)
					sum += r->charged;
	for (struct allow *a = st->ballows; a; a = a->next)
		for (unsigned i = 0; i < a->nchain; i++)
			if (a->chain[i] == qid)
				sum = add_sat(sum, (int64_t)STK_MIN(a->left, (uint64_t)INT64_MAX));
	return sum;
}

/* With qmu held: the inodes sessions' allowances hold in quota qid. */
static uint64_t allow_sum_locked(struct stk_meta_store *st, uint64_t qid)
{
	uint64_t sum = 0;

	for (struct allow *a = st->allows; a; a = a->next)
		for (unsigned i = 0; i < a->nchain; i++)
			if (a->chain[i] == qid)
				sum = add_sat(sum, (int64_t)STK_MIN(a->left, (uint64_t)INT64_MAX));
	return sum;
}

/* The inodes quota q has left: its limit less its usage and the allowances out. */
static uint64_t inodes_left(struct stk_meta_store *st, const struct quota *q)
{
	uint64_t held;

	pthread_mutex_lock(&st->qmu);
	held = st->allows ? allow_sum_locked(st, q->qid) : 0;
	pthread_mutex_unlock(&st->qmu);
	held = add_sat(held, (int64_t)STK_MIN(q->used_inodes, (uint64_t)INT64_MAX));
	return held >= q->limit_inodes ? 0 : q->limit_inodes - held;
}

/* -EDQUOT if q cannot take dinodes more inodes and dbytes more bytes. */
static int quota_room(struct stk_meta_store *st, const struct quota *q, int64_t dinodes,
		      int64_t dbytes)
{
	uint64_t res;

	if (dinodes > 0 && q->limit_inodes && inodes_left(st, q) < (uint64_t)dinodes)
		return -EDQUOT;
	if (dbytes <= 0 || !q->limit_bytes)
		return 0;
	pthread_mutex_lock(&st->qmu);
	res = resv_sum_locked(st, q->qid);
	pthread_mutex_unlock(&st->qmu);
	return add_sat(add_sat(q->used_bytes, (int64_t)STK_MIN(res, (uint64_t)INT64_MAX)), dbytes) >
		       q->limit_bytes
		   ? -EDQUOT
		   : 0;
}

/*
 * Counts dinodes inodes and dbytes bytes more (or fewer) in quota qid and every
 * quota above it. With check, growth past a limit is -EDQUOT and nothing changes
 * (the caller's transaction then aborts). Usage never goes below 0.
 */
static int quota_charge(struct op *o, uint64_t qid, int64_t dinodes, int64_t dbytes, int check)
{
	struct quota q[QUOTA_DEPTH_MAX];
	unsigned n;
	int rc;

	if (!qid || (!dinodes && !dbytes))
		return 0;
	rc = quota_chain(o, qid, q, &n);
	for (unsigned i = 0; rc == 0 && check && i < n; i++)
		rc = quota_room(o->st, &q[i], dinodes, dbytes);
	for (unsigned i = 0; rc == 0 && i < n; i++) {
		q[i].used_inodes = add_sat(q[i].used_inodes, dinodes);
		q[i].used_bytes = add_sat(q[i].used_bytes, dbytes);
		rc = quota_put(o, &q[i]);
	}
	return rc;
}

static int in_chain(const struct quota *q, unsigned n, uint64_t qid)
{
	for (unsigned i = 0; i < n; i++)
		if (q[i].qid == qid)
			return 1;
	return 0;
}

/*
 * Rename's rule (docs/quotas.md): n leaves a folder counted in quota `from` for
 * one counted in `to`. A folder, or a file with other names, cannot (-EXDEV: mv
 * copies instead); a file takes its inode and bytes along if every quota it
 * enters has room (-EDQUOT), and its reservations follow it.
 */
static int quota_move(struct op *o, struct inode *n, uint64_t from, uint64_t to)
{
	struct quota oq[QUOTA_DEPTH_MAX], nq[QUOTA_DEPTH_MAX];
	int64_t bytes = quota_bytes_of(n);
	unsigned on, nn;
	int rc;

	if (from == to)
		return 0;
	if (S_ISDIR(n->a.mode) || n->a.nlink > 1)
		return -EXDEV;
	rc = quota_chain(o, n->a.qid, oq, &on);
	if (rc == 0)
		rc = quota_chain(o, to, nq, &nn);
	for (unsigned i = 0; rc == 0 && i < nn; i++)
		if (!in_chain(oq, on, nq[i].qid))
			rc = quota_room(o->st, &nq[i], 1, bytes);
	for (unsigned i = 0; rc == 0 && i < nn; i++) {
		if (in_chain(oq, on, nq[i].qid))
			continue;
		nq[i].used_inodes++;
		nq[i].used_bytes = add_sat(nq[i].used_bytes, bytes);
		rc = quota_put(o, &nq[i]);
	}
	for (unsigned i = 0; rc == 0 && i < on; i++) {
		if (in_chain(nq, nn, oq[i].qid))
			continue;
		oq[i].used_inodes = add_sat(oq[i].used_inodes, -1);
		oq[i].used_bytes = add_sat(oq[i].used_bytes, -bytes);
		rc = quota_put(o, &oq[i]);
	}
	if (rc)
		return rc;
	n->a.qid = to;
	pthread_mutex_lock(&o->st->qmu);
	for (struct resv *r = *resv_bucket(o->st, n->a.ino); r; r = r->next) {
		if (r->ino != n->a.ino)
			continue;
		r->nchain = nn;
		for (unsigned i = 0; i < nn; i++)
			r->chain[i] = nq[i].qid;
	}
	pthread_mutex_unlock(&o->st->qmu);
	return 0;
}

static void resv_resize(struct stk_meta_store *st, uint64_t ino, uint64_t size)
{
	pthread_mutex_lock(&st->qmu);
	for (struct resv *r = *resv_bucket(st, ino); r; r = r->next)
		if (r->ino == ino)
			r->charged = r->granted > size ? r->granted - size : 0;
	pthread_mutex_unlock(&st->qmu);
}

/* With qmu held, inside a write transaction: every reservation's chain read again. */
static void resv_rechain_locked(struct op *o)
{
	struct quota q[QUOTA_DEPTH_MAX];
	struct inode n;
	unsigned nq;

	/* An allowance whose quota went holds nothing any more (nchain 0). */
	for (int bytes = 0; bytes < 2; bytes++) {
		for (struct allow *a = bytes ? o->st->ballows : o->st->allows; a; a = a->next) {
			if (quota_get(o, a->qid, &q[0]) || quota_chain(o, a->qid, q, &nq))
				nq = 0;
			a->nchain = nq;
			for (unsigned i = 0; i < nq; i++)
				a->chain[i] = q[i].qid;
		}
	}

	for (size_t b = 0; b < STK_ARRAY_SIZE(o->st->resv); b++) {
		for (struct resv *r = o->st->resv[b]; r; r = r->next) {
			if (inode_get(o, r->ino, &n) || quota_chain(o, n.a.qid, q, &nq))
				continue;
			r->nchain = nq;
			for (unsigned i = 0; i < nq; i++)
				r->chain[i] = q[i].qid;
		}
	}
}

static void resv_free_all(struct stk_meta_store *st)
{
	while (st->allows) {
		struct allow *a = st->allows;

		st->allows = a->next;
		free(a);
	}
	while (st->ballows) {
		struct allow *a = st->ballows;

		st->ballows = a->next;
		free(a);
	}
	for (size_t b = 0; b < STK_ARRAY_SIZE(st->resv); b++) {
		while (st->resv[b]) {
			struct resv *r = st->resv[b];

			st->resv[b] = r->next;
			free(r);
		}
	}
}

static void quota_out(struct stk_meta_store *st, const struct quota *q, struct stk_meta_quota *out)
{
	out->qid = q->qid;
	out->parent = q->parent;
	out->limit_bytes = q->limit_bytes;
	out->limit_inodes = q->limit_inodes;
	out->used_bytes = q->used_bytes;
	out->used_inodes = q->used_inodes;
	pthread_mutex_lock(&st->qmu);
	out->reserved_bytes = resv_sum_locked(st, q->qid);
	out->reserved_inodes = allow_sum_locked(st, q->qid);
	pthread_mutex_unlock(&st->qmu);
}

/* ---- walking a tree: setting, removing and recounting a quota ---- */

struct ino_vec {
	uint64_t *v;
	size_t n, cap;
};

static int vec_push(struct ino_vec *v, uint64_t x)
{
	if (v->n == v->cap) {
		size_t cap = v->cap ? 2 * v->cap : 256;
		uint64_t *p = realloc(v->v, cap * sizeof(*p));

		if (!p)
			return -ENOMEM;
		v->v = p;
		v->cap = cap;
	}
	v->v[v->n++] = x;
	return 0;
}

static int vec_has(const struct ino_vec *v, uint64_t x)
{
	for (size_t i = 0; i < v->n; i++)
		if (v->v[i] == x)
			return 1;
	return 0;
}

/* Appends the inode numbers of folder dir's entries to out. */
static int dir_children(struct op *o, uint64_t dir, struct ino_vec *out)
{
	uint8_t k[8];
	MDB_val key = {sizeof(k), k}, val;
	MDB_cursor *c;
	int mrc, rc = 0;

	be64_put(k, dir);
	rc = lmdb_err(mdb_cursor_open(o->txn, o->st->dentries, &c), "open cursor");
	if (rc)
		return rc;
	for (mrc = mdb_cursor_get(c, &key, &val, MDB_SET_RANGE); mrc == 0 && rc == 0;
	     mrc = mdb_cursor_get(c, &key, &val, MDB_NEXT)) {
		struct stk_rbuf r;
		uint64_t ino;

		if (key.mv_size < 8 || be64_get(key.mv_data) != dir)
			break;
		stk_rbuf_init(&r, val.mv_data, val.mv_size);
		ino = stk_get_u64(&r);
		rc = r.err ? -EIO : vec_push(out, ino);
	}
	if (mrc && mrc != MDB_NOTFOUND)
		rc = lmdb_err(mrc, "read entry");
	mdb_cursor_close(c);
	return rc;
}

/*
 * Calls fn for every inode below folder top (not top itself), once per name, in
 * no particular order. fn returns 1 to walk into a folder, 0 not to, or -errno
 * to stop the walk with that error. Logs its progress on big trees. A name of
 * another shard's inode (a folder placed there, a file renamed there) is not
 * this store's to walk: it is passed over, and the first such inode kept in
 * *remote (0: none). Quotas do not span shards (docs/quotas.md).
 */
typedef int (*walk_fn)(struct op *o, struct inode *n, void *ctx);

static int tree_walk_here(struct op *o, uint64_t top, walk_fn fn, void *ctx, uint64_t *remote)
{
	struct ino_vec stack = {0}, kids = {0};
	uint64_t seen = 0;
	int rc;

	*remote = 0;

	rc = vec_push(&stack, top);
	while (rc == 0 && stack.n) {
		uint64_t dir = stack.v[--stack.n];

		kids.n = 0;
		rc = dir_children(o, dir, &kids);
		for (size_t i = 0; rc == 0 && i < kids.n; i++) {
			struct inode n;

			if (stk_ino_shard(kids.v[i]) != o->st->shard) {
				if (!*remote)
					*remote = kids.v[i];
				continue;
			}
			rc = inode_get_named(o, kids.v[i], &n);
			if (rc == 0)
				rc = fn(o, &n, ctx);
			if (rc == 1)
				rc = S_ISDIR(n.a.mode) ? vec_push(&stack, n.a.ino) : 0;
			if (++seen % QUOTA_PROGRESS == 0)
				stk_info("quota on folder %llu: %llu inodes walked so far",
					 (unsigned long long)top, (unsigned long long)seen);
		}
	}
	free(stack.v);
	free(kids.v);
	return rc;
}

/* tree_walk_here, with a line in the log for what it passed over. */
static int tree_walk(struct op *o, uint64_t top, walk_fn fn, void *ctx)
{
	uint64_t remote;
	int rc = tree_walk_here(o, top, fn, ctx, &remote);

	if (rc == 0 && remote)
		stk_warn("quota on folder %llu: inode %llu below it lives on metadata shard %u "
			 "and counts in no quota of this one's (docs/quotas.md)",
			 (unsigned long long)top, (unsigned long long)remote,
			 stk_ino_shard(remote));
	return rc;
}

/* Calls fn for every orphan (a file open but without a name). */
static int orphans_each(struct op *o, walk_fn fn, void *ctx)
{
	struct ino_vec v = {0};
	uint8_t k[ORPHAN_KEY_LEN];
	MDB_val key = {sizeof(k), k}, val;
	MDB_cursor *cur;
	int mrc, rc;

	orphan_key(k, 0);
	rc = lmdb_err(mdb_cursor_open(o->txn, o->st->sys, &cur), "open cursor");
	if (rc)
		return rc;
	for (mrc = mdb_cursor_get(cur, &key, &val, MDB_SET_RANGE); mrc == 0 && rc == 0;
	     mrc = mdb_cursor_get(cur, &key, &val, MDB_NEXT)) {
		if (key.mv_size != ORPHAN_KEY_LEN ||
		    memcmp(key.mv_data, ORPHAN_PREFIX, sizeof(ORPHAN_PREFIX) - 1))
			break;
		rc = vec_push(&v, be64_get((const uint8_t *)key.mv_data + ORPHAN_KEY_LEN - 8));
	}
	mdb_cursor_close(cur);
	for (size_t i = 0; rc == 0 && i < v.n; i++) {
		struct inode n;

		rc = inode_get(o, v.v[i], &n);
		if (rc == -ENOENT)
			rc = 0;
		else if (rc == 0)
			rc = fn(o, &n, ctx) < 0 ? -EIO : 0;
	}
	free(v.v);
	return rc;
}

static int is_quota_root(const struct inode *n)
{
	return S_ISDIR(n->a.mode) && n->a.qid == n->a.ino;
}

/* Setting a new quota on folder qid: everything below is tagged and counted. */
struct tag_ctx {
	uint64_t qid;
	uint64_t bytes, inodes;
};

static int tag_one(struct op *o, struct inode *n, void *arg)
{
	struct tag_ctx *t = arg;
	struct quota q;
	int rc;

	if (is_quota_root(n)) {
		/* A quota below: it now sits inside this one, and counts in it. */
		rc = quota_get(o, n->a.ino, &q);
		if (rc)
			return rc;
		q.parent = t->qid;
		t->inodes += q.used_inodes;
		t->bytes += q.used_bytes;
		return quota_put(o, &q);
	}
	if (n->a.qid == t->qid)
		return 0; /* a file's other name: counted once */
	n->a.qid = t->qid;
	t->inodes++;
	t->bytes += (uint64_t)quota_bytes_of(n);
	rc = inode_put(o, n);
	return rc ? rc : 1;
}

/* Removing quota qid: what it tagged now counts in the quota above it (parent). */
struct untag_ctx {
	uint64_t qid, parent;
};

static int untag_one(struct op *o, struct inode *n, void *arg)
{
	struct untag_ctx *t = arg;
	struct quota q;
	int rc;

	if (is_quota_root(n)) {
		rc = quota_get(o, n->a.ino, &q);
		if (rc)
			return rc;
		q.parent = t->parent;
		return quota_put(o, &q);
	}
	if (n->a.qid != t->qid)
		return 1;
	n->a.qid = t->parent;
	rc = inode_put(o, n);
	return rc ? rc : 1;
}

int stk_meta_store_quota_set(struct stk_meta_store *st, const struct stk_cred *cred, uint64_t ino,
			     uint64_t limit_bytes, uint64_t limit_inodes, uint32_t flags,
			     struct stk_meta_quota *out)
{
	struct tag_ctx t = {.qid = ino};
	struct inode dir;
	struct quota q;
	struct op o;
	uint64_t remote = 0;
	int rc;

	if (flags & ~(STK_QUOTA_KEEP_BYTES | STK_QUOTA_KEEP_INODES))
		return -EINVAL;
	if (cred->uid != 0)
		return -EPERM;
	rc = op_begin(&o, st, cred, 0);
	if (rc)
		return rc;
	rc = inode_get(&o, ino, &dir);
	if (rc == 0 && !S_ISDIR(dir.a.mode))
		rc = -ENOTDIR;
	if (rc)
		goto out;
	if (is_quota_root(&dir)) {
		rc = quota_get(&o, ino, &q);
		if (rc)
			goto out;
	} else {
		/* A new quota: it counts what the folder holds already. */
		memset(&q, 0, sizeof(q));
		q.qid = ino;
		q.parent = dir.a.qid;
		dir.a.qid = ino;
		rc = inode_put(&o, &dir);
		if (rc == 0)
			rc = tree_walk_here(&o, ino, tag_one, &t, &remote);
		if (rc == 0 && remote) {
			/* it would not count there: refused, and nothing changed */
			stk_warn("quota on folder %llu: refused: inode %llu below it lives on "
				 "metadata shard %u, and quotas do not span shards",
				 (unsigned long long)ino, (unsigned long long)remote,
				 stk_ino_shard(remote));
			rc = -EXDEV;
		}
		if (rc)
			goto out;
		q.used_inodes = t.inodes + 1;
		q.used_bytes = t.bytes;
		if (t.inodes >= QUOTA_PROGRESS)
			stk_info("quota on folder %llu: %llu inodes counted",
				 (unsigned long long)ino, (unsigned long long)t.inodes + 1);
	}
	if (!(flags & STK_QUOTA_KEEP_BYTES))
		q.limit_bytes = limit_bytes;
	if (!(flags & STK_QUOTA_KEEP_INODES))
		q.limit_inodes = limit_inodes;
	rc = quota_put(&o, &q);
	if (rc == 0) {
		pthread_mutex_lock(&st->qmu);
		resv_rechain_locked(&o);
		pthread_mutex_unlock(&st->qmu);
	}
out:
	rc = op_end(&o, rc);
	if (rc == 0 && out)
		quota_out(st, &q, out);
	return rc;
}

int stk_meta_store_quota_rm(struct stk_meta_store *st, const struct stk_cred *cred, uint64_t ino)
{
	struct untag_ctx t = {.qid = ino};
	struct inode dir;
	struct quota q;
	struct op o;
	int rc;

	if (cred->uid != 0)
		return -EPERM;
	rc = op_begin(&o, st, cred, 0);
	if (rc)
		return rc;
	rc = inode_get(&o, ino, &dir);
	if (rc == 0 && !is_quota_root(&dir))
		rc = S_ISDIR(dir.a.mode) ? -ENOENT : -ENOTDIR;
	if (rc == 0)
		rc = quota_get(&o, ino, &q);
	if (rc)
		goto out;
	t.parent = q.parent;
	dir.a.qid = q.parent;
	rc = inode_put(&o, &dir);
	if (rc == 0)
		rc = tree_walk(&o, ino, untag_one, &t);
	if (rc == 0)
		rc = orphans_each(&o, untag_one, &t);
	if (rc == 0)
		rc = quota_del(&o, ino);
	if (rc == 0) {
		pthread_mutex_lock(&st->qmu);
		resv_rechain_locked(&o);
		pthread_mutex_unlock(&st->qmu);
	}
out:
	return op_end(&o, rc);
}

int stk_meta_store_quota_get(struct stk_meta_store *st, uint64_t ino, struct stk_meta_quota *out)
{
	static const struct stk_cred root_cred;
	struct inode n;
	struct quota q;
	struct op o;
	int rc;

	rc = op_begin(&o, st, &root_cred, 1);
	if (rc)
		return rc;
	rc = inode_get(&o, ino, &n);
	if (rc == 0)
		rc = n.a.qid ? quota_get(&o, n.a.qid, &q) : -ENOENT;
	rc = op_end(&o, rc);
	if (rc == 0)
		quota_out(st, &q, out);
	return rc;
}

int stk_meta_store_quota_list(struct stk_meta_store *st, uint64_t from, struct stk_meta_quota *out,
			      size_t max, size_t *n, int *more)
{
	static const struct stk_cred root_cred;
	uint8_t k[8];
	MDB_val key = {sizeof(k), k}, val;
	MDB_cursor *cur = NULL;
	struct quota q;
	struct op o;
	int mrc, rc;

	*n = 0;
	*more = 0;
	rc = op_begin(&o, st, &root_cred, 1);
	if (rc)
		return rc;
	be64_put(k, from);
	rc = lmdb_err(mdb_cursor_open(o.txn, st->quotas, &cur), "open cursor");
	for (mrc = rc ? MDB_NOTFOUND : mdb_cursor_get(cur, &key, &val, MDB_SET_RANGE);
	     mrc == 0 && rc == 0; mrc = mdb_cursor_get(cur, &key, &val, MDB_NEXT)) {
		if (*n == max) {
			*more = 1;
			break;
		}
		if (key.mv_size != 8) {
			rc = -EIO;
			break;
		}
		rc = quota_get(&o, be64_get(key.mv_data), &q);
		if (rc == 0)
			quota_out(st, &q, &out[(*n)++]);
	}
	if (rc == 0 && mrc && mrc != MDB_NOTFOUND)
		rc = lmdb_err(mrc, "list quotas");
	if (cur)
		mdb_cursor_close(cur);
	return op_end(&o, rc);
}

/* Recounting quota qid: what the tree holds, its tags fixed on the way. */
struct count_ctx {
	uint64_t qid;
	uint64_t bytes, inodes;
	uint64_t retagged;
	struct ino_vec linked; /* files with several names, counted once */
	unsigned depth;
	stk_meta_quota_fn fn;
	void *fn_ctx;
};

static int recount_one(struct op *o, uint64_t qid, unsigned depth, stk_meta_quota_fn fn,
		       void *fn_ctx, struct quota *now);

static int count_one(struct op *o, struct inode *n, void *arg)
{
	struct count_ctx *t = arg;
	struct quota q;
	int rc;

	if (is_quota_root(n)) {
		rc = recount_one(o, n->a.ino, t->depth + 1, t->fn, t->fn_ctx, &q);
		if (rc == 0 && q.parent != t->qid) {
			q.parent = t->qid;
			rc = quota_put(o, &q);
		}
		if (rc)
			return rc;
		t->inodes += q.used_inodes;
		t->bytes += q.used_bytes;
		return 0;
	}
	if (n->a.nlink > 1) {
		if (vec_has(&t->linked, n->a.ino))
			return 0;
		rc = vec_push(&t->linked, n->a.ino);
		if (rc)
			return rc;
	}
	if (n->a.qid != t->qid) {
		n->a.qid = t->qid;
		t->retagged++;
		rc = inode_put(o, n);
		if (rc)
			return rc;
	}
	t->inodes++;
	t->bytes += (uint64_t)quota_bytes_of(n);
	return 1;
}

/* Orphans are counted in the quota they were tagged with when they lost their name. */
static int count_orphan(struct op *o, struct inode *n, void *arg)
{
	struct count_ctx *t = arg;

	(void)o;
	if (n->a.qid == t->qid) {
		t->inodes++;
		t->bytes += (uint64_t)quota_bytes_of(n);
	}
	return 0;
}

static int recount_one(struct op *o, uint64_t qid, unsigned depth, stk_meta_quota_fn fn,
		       void *fn_ctx, struct quota *now)
{
	struct count_ctx t = {.qid = qid, .depth = depth, .fn = fn, .fn_ctx = fn_ctx};
	struct stk_meta_quota before, after;
	struct inode dir;
	struct quota q;
	int rc;

	if (depth >= QUOTA_DEPTH_MAX)
		return -EIO;
	rc = quota_get(o, qid, &q);
	if (rc == 0)
		rc = inode_get(o, qid, &dir);
	if (rc == 0 && dir.a.qid != qid) {
		dir.a.qid = qid;
		t.retagged++;
		rc = inode_put(o, &dir);
	}
	if (rc == 0)
		rc = tree_walk(o, qid, count_one, &t);
	if (rc == 0)
		rc = orphans_each(o, count_orphan, &t);
	free(t.linked.v);
	if (rc)
		return rc;
	t.inodes++; /* the folder itself */
	quota_out(o->st, &q, &before);
	q.used_bytes = t.bytes;
	q.used_inodes = t.inodes;
	if (before.used_bytes != q.used_bytes || before.used_inodes != q.used_inodes)
		rc = quota_put(o, &q);
	if (rc)
		return rc;
	if (t.retagged)
		stk_info("quota on folder %llu: %llu inodes were tagged with another quota",
			 (unsigned long long)qid, (unsigned long long)t.retagged);
	quota_out(o->st, &q, &after);
	if (fn)
		fn(fn_ctx, &before, &after);
	*now = q;
	return 0;
}

int stk_meta_store_quota_recount(struct stk_meta_store *st, const struct stk_cred *cred,
				 uint64_t ino, stk_meta_quota_fn fn, void *ctx)
{
	struct ino_vec tops = {0};
	uint8_t k[8];
	MDB_val key = {sizeof(k), k}, val;
	MDB_cursor *cur;
	struct quota q;
	struct op o;
	int mrc, rc;

	if (cred->uid != 0)
		return -EPERM;
	rc = op_begin(&o, st, cred, 0);
	if (rc)
		return rc;
	if (ino) {
		rc = quota_get(&o, ino, &q);
		if (rc == 0)
			rc = vec_push(&tops, ino);
		goto count;
	}
	/* All of them: each outermost quota, which recounts those inside it. */
	be64_put(k, 0);
	rc = lmdb_err(mdb_cursor_open(o.txn, st->quotas, &cur), "open cursor");
	if (rc)
		goto out;
	for (mrc = mdb_cursor_get(cur, &key, &val, MDB_SET_RANGE); mrc == 0 && rc == 0;
	     mrc = mdb_cursor_get(cur, &key, &val, MDB_NEXT)) {
		rc = key.mv_size == 8 ? quota_get(&o, be64_get(key.mv_data), &q) : -EIO;
		if (rc == 0 && q.parent == 0)
			rc = vec_push(&tops, q.qid);
	}
	mdb_cursor_close(cur);
count:
	for (size_t i = 0; rc == 0 && i < tops.n; i++)
		rc = recount_one(&o, tops.v[i], 0, fn, ctx, &q);
out:
	free(tops.v);
	return op_end(&o, rc);
}

int stk_meta_store_quota_reserve(struct stk_meta_store *st, uint64_t session, uint64_t ino,
				 uint64_t need, uint64_t want, uint64_t *granted)
{
	static const struct stk_cred root_cred;
	struct quota q[QUOTA_DEPTH_MAX];
	struct resv *r = NULL;
	uint64_t room = UINT64_MAX, base, g;
	struct inode n;
	unsigned nq = 0, limited = 0;
	struct op o;
	int rc;

	if (want < need)
		want = need;
	/*
	 * A write transaction, though it writes nothing: it waits for the writers
	 * before it, so the usage read here includes every size committed so far
	 * and the reservations those commits shrank.
	 */
	rc = op_begin(&o, st, &root_cred, 0);
	if (rc)
		return rc;
	rc = inode_get(&o, ino, &n);
	if (rc == 0 && !S_ISREG(n.a.mode))
		rc = S_ISDIR(n.a.mode) ? -EISDIR : -EINVAL;
	if (rc == 0)
		rc = quota_chain(&o, n.a.qid, q, &nq);
	if (rc)
		goto out;
	for (unsigned i = 0; i < nq; i++)
		limited += q[i].limit_bytes != 0;
	if (!limited) {
		*granted = UINT64_MAX; /* no byte limit: write freely */
		goto out;
	}
	pthread_mutex_lock(&st->qmu);
	for (r = *resv_bucket(st, ino); r; r = r->next)
		if (r->ino == ino && r->session == session)
			break;
	base = STK_MAX(r ? r->granted : 0, n.a.size);
	if (need <= base) {
		*granted = base;
		goto unlock;
	}
	for (unsigned i = 0; i < nq; i++) {
		uint64_t used;

		if (!q[i].limit_bytes)
			continue;
		used = add_sat(q[i].used_bytes, (int64_t)STK_MIN(resv_sum_locked(st, q[i].qid),
								 (uint64_t)INT64_MAX));
		room = STK_MIN(room, used >= q[i].limit_bytes ? 0 : q[i].limit_bytes - used);
	}
	/* This session's own reservation is in `used` and is given up for the new one. */
	g = add_sat(add_sat(n.a.size, (int64_t)(r ? r->charged : 0)), (int64_t)room);
	g = STK_MIN(g, want);
	if (g < need) {
		rc = -EDQUOT;
		goto unlock;
	}
	*granted = g;
	if (!session)
		goto unlock; /* nobody to hold it for: checked, not kept */
	if (!r) {
		r = calloc(1, sizeof(*r));
		if (!r) {
			rc = -ENOMEM;
			goto unlock;
		}
		r->session = session;
		r->ino = ino;
		r->next = *resv_bucket(st, ino);
		*resv_bucket(st, ino) = r;
	}
	r->granted = g;
	r->charged = g > n.a.size ? g - n.a.size : 0;
	r->nchain = nq;
	for (unsigned i = 0; i < nq; i++)
		r->chain[i] = q[i].qid;
unlock:
	pthread_mutex_unlock(&st->qmu);
out:
	op_end(&o, rc ? rc : 1); /* nothing to commit */
	return rc;
}

static void resv_drop(struct stk_meta_store *st, uint64_t session, uint64_t ino, int all)
{
	pthread_mutex_lock(&st->qmu);
	for (size_t b = 0; b < STK_ARRAY_SIZE(st->resv); b++) {
		struct resv **p = &st->resv[b];

		if (!all && p != resv_bucket(st, ino))
			continue;
		while (*p) {
			struct resv *r = *p;

			if (r->session != session || (!all && r->ino != ino)) {
				p = &r->next;
				continue;
			}
			*p = r->next;
			free(r);
		}
	}
	pthread_mutex_unlock(&st->qmu);
}

void stk_meta_store_quota_release(struct stk_meta_store *st, uint64_t session, uint64_t ino)
{
	resv_drop(st, session, ino, 0);
}

void stk_meta_store_quota_release_session(struct stk_meta_store *st, uint64_t session)
{
	resv_drop(st, session, 0, 1);
	stk_meta_store_quota_disallow(st, session, 0, UINT32_MAX);
	stk_meta_store_quota_disallow_bytes(st, session, 0, UINT64_MAX);
}

/* With qmu held: session's allowance in quota qid, or NULL. */
static struct allow **allow_find_locked(struct stk_meta_store *st, uint64_t session, uint64_t qid)
{
	struct allow **p = &st->allows;

	while (*p && ((*p)->session != session || (*p)->qid != qid))
		p = &(*p)->next;
	return p;
}

/* One create spends one of session's allowance in qid: 1, or 0 when it has none. */
static int allow_take(struct stk_meta_store *st, uint64_t session, uint64_t qid)
{
	struct allow *a;
	int took = 0;

	if (!qid || !st->allows)
		return 0;
	pthread_mutex_lock(&st->qmu);
	a = *allow_find_locked(st, session, qid);
	if (a && a->left && a->nchain) {
		a->left--;
		took = 1;
	}
	pthread_mutex_unlock(&st->qmu);
	return took;
}

int stk_meta_store_quota_allow(struct stk_meta_store *st, uint64_t session, uint64_t dir,
			       uint64_t want, uint64_t *granted, uint64_t *qid_out)
{
	static const struct stk_cred root_cred;
	struct quota q[QUOTA_DEPTH_MAX];
	uint64_t room = UINT64_MAX;
	struct allow *a;
	struct inode n;
	unsigned nq = 0;
	struct op o;
	int rc;

	*granted = 0;
	*qid_out = 0;
	if (!session || !want)
		return -EINVAL;
	/* A write transaction, as a reservation's: the usage read includes every commit. */
	rc = op_begin(&o, st, &root_cred, 0);
	if (rc)
		return rc;
	rc = inode_get(&o, dir, &n);
	if (rc == 0 && !S_ISDIR(n.a.mode))
		rc = -ENOTDIR;
	if (rc == 0)
		rc = quota_chain(&o, n.a.qid, q, &nq);
	if (rc)
		goto out;
	*qid_out = n.a.qid;
	for (unsigned i = 0; i < nq; i++)
		if (q[i].limit_inodes)
			room = STK_MIN(room, inodes_left(st, &q[i]));
	if (room == UINT64_MAX) {
		*granted = want; /* no inode limit: nothing to set aside */
		goto out;
	}
	/* Half of what is left at most, so that other holders still find room. */
	*granted = STK_MIN(want, room > 1 ? room / 2 : room);
	if (!*granted) {
		rc = -EDQUOT;
		goto out;
	}
	pthread_mutex_lock(&st->qmu);
	a = *allow_find_locked(st, session, n.a.qid);
	if (!a && (a = calloc(1, sizeof(*a))) != NULL) {
		a->session = session;
		a->qid = n.a.qid;
		a->next = st->allows;
		st->allows = a;
	}
	if (a) {
		a->left = add_sat(a->left, (int64_t)*granted);
		a->nchain = nq;
		for (unsigned i = 0; i < nq; i++)
			a->chain[i] = q[i].qid;
	} else {
		*granted = 0;
		rc = -ENOMEM;
	}
	pthread_mutex_unlock(&st->qmu);
out:
	op_end(&o, rc ? rc : 1); /* nothing to commit */
	return rc;
}

void stk_meta_store_quota_disallow(struct stk_meta_store *st, uint64_t session, uint64_t qid,
				   uint32_t count)
{
	struct allow **p;

	pthread_mutex_lock(&st->qmu);
	p = &st->allows;
	while (*p) {
		struct allow *a = *p;

		if (a->session != session || (qid && a->qid != qid)) {
			p = &a->next;
			continue;
		}
		if (count != UINT32_MAX && a->left > count) {
			a->left -= count;
			break;
		}
		*p = a->next;
		free(a);
	}
	pthread_mutex_unlock(&st->qmu);
}

/* With qmu held: session's byte allowance in quota qid (a place to link one). */
static struct allow **ballow_find_locked(struct stk_meta_store *st, uint64_t session, uint64_t qid)
{
	struct allow **p = &st->ballows;

	while (*p && ((*p)->session != session || (*p)->qid != qid))
		p = &(*p)->next;
	return p;
}

/*
 * A size report spent n bytes of session's byte allowance in qid: they are used
 * now. A writer whose allowance went (its holder was reset, meta restarted) has
 * none here: its bytes were charged as any report's are.
 */
static void ballow_spend(struct stk_meta_store *st, uint64_t session, uint64_t qid, uint64_t n)
{
	struct allow *a;

	pthread_mutex_lock(&st->qmu);
	a = *ballow_find_locked(st, session, qid);
	if (a)
		a->left = n >= a->left ? 0 : a->left - n;
	pthread_mutex_unlock(&st->qmu);
}

int stk_meta_store_quota_allow_bytes(struct stk_meta_store *st, uint64_t session, uint64_t ino,
				     uint64_t want, uint64_t *granted, uint64_t *qid_out)
{
	static const struct stk_cred root_cred;
	struct quota q[QUOTA_DEPTH_MAX];
	uint64_t room = UINT64_MAX;
	struct allow *a;
	struct inode n;
	unsigned nq = 0;
	struct op o;
	int rc;

	*granted = 0;
	*qid_out = 0;
	if (!session || !want)
		return -EINVAL;
	/* A write transaction, as a reservation's: the usage read includes every commit. */
	rc = op_begin(&o, st, &root_cred, 0);
	if (rc)
		return rc;
	rc = inode_get(&o, ino, &n);
	if (rc == 0)
		rc = quota_chain(&o, n.a.qid, q, &nq);
	if (rc)
		goto out;
	*qid_out = n.a.qid;
	pthread_mutex_lock(&st->qmu);
	for (unsigned i = 0; i < nq; i++) {
		uint64_t used;

		if (!q[i].limit_bytes)
			continue;
		used = add_sat(q[i].used_bytes, (int64_t)STK_MIN(resv_sum_locked(st, q[i].qid),
								 (uint64_t)INT64_MAX));
		room = STK_MIN(room, used >= q[i].limit_bytes ? 0 : q[i].limit_bytes - used);
	}
	if (room == UINT64_MAX) {
		*granted = want; /* no byte limit: nothing to set aside */
		goto unlock;
	}
	/* Half of what is left at most, so that other writers still find room. */
	*granted = STK_MIN(want, room > 1 ? room / 2 : room);
	if (!*granted) {
		rc = -EDQUOT;
		goto unlock;
	}
	a = *ballow_find_locked(st, session, n.a.qid);
	if (!a && (a = calloc(1, sizeof(*a))) != NULL) {
		a->session = session;
		a->qid = n.a.qid;
		a->next = st->ballows;
		st->ballows = a;
	}
	if (a) {
		a->left = add_sat(a->left, (int64_t)*granted);
		a->nchain = nq;
		for (unsigned i = 0; i < nq; i++)
			a->chain[i] = q[i].qid;
	} else {
		*granted = 0;
		rc = -ENOMEM;
	}
unlock:
	pthread_mutex_unlock(&st->qmu);
out:
	op_end(&o, rc ? rc : 1); /* nothing to commit */
	return rc;
}

void stk_meta_store_quota_disallow_bytes(struct stk_meta_store *st, uint64_t session, uint64_t qid,
					 uint64_t count)
{
	struct allow **p;

	pthread_mutex_lock(&st->qmu);
	p = &st->ballows;
	while (*p) {
		struct allow *a = *p;

		if (a->session != session || (qid && a->qid != qid)) {
			p = &a->next;
			continue;
		}
		if (count != UINT64_MAX && a->left > count) {
			a->left -= count;
			break;
		}
		*p = a->next;
		free(a);
	}
	pthread_mutex_unlock(&st->qmu);
}

/* The name folder dir has in its parent, into name[STK_NAME_MAX + 1]: a scan. */
static int dir_name_in(struct op *o, uint64_t parent, uint64_t dir, char *name)
{
	uint8_t k[8];
	MDB_val key = {sizeof(k), k}, val;
	MDB_cursor *c;
	int mrc, rc = -ENOENT;

	be64_put(k, parent);
	if (mdb_cursor_open(o->txn, o->st->dentries, &c))
		return -EIO;
	for (mrc = mdb_cursor_get(c, &key, &val, MDB_SET_RANGE); mrc == 0;
	     mrc = mdb_cursor_get(c, &key, &val, MDB_NEXT)) {
		struct stk_rbuf r;
		size_t len;

		if (key.mv_size < 16 || be64_get(key.mv_data) != parent)
			break;
		stk_rbuf_init(&r, val.mv_data, val.mv_size);
		if (stk_get_u64(&r) != dir || r.err)
			continue;
		len = STK_MIN(key.mv_size - 16, (size_t)STK_NAME_MAX);
		memcpy(name, (const uint8_t *)key.mv_data + 16, len);
		name[len] = 0;
		rc = 0;
		break;
	}
	mdb_cursor_close(c);
	return rc;
}

int stk_meta_store_path_of(struct stk_meta_store *st, uint64_t dir, char *buf, size_t len)
{
	static const struct stk_cred root_cred;
	char name[STK_NAME_MAX + 1], *end = buf + len, *p = end;
	struct inode n;
	struct op o;
	int rc;

	if (len < 2)
		return -ERANGE;
	rc = op_begin(&o, st, &root_cred, 1);
	if (rc)
		return rc;
	*--p = 0;
	for (unsigned depth = 0; rc == 0 && dir != STK_ROOT_INO; depth++) {
		size_t nl;

		rc = depth == MAX_DEPTH ? -EIO : inode_get(&o, dir, &n);
		if (rc == 0 && !S_ISDIR(n.a.mode))
			rc = -ENOTDIR;
		if (rc == 0)
			rc = dir_name_in(&o, n.parent, dir, name);
		if (rc)
			break;
		nl = strlen(name);
		if ((size_t)(p - buf) < nl + 2) {
			rc = -ERANGE;
			break;
		}
		p -= nl;
		memcpy(p, name, nl);
		*--p = '/';
		dir = n.parent;
	}
	op_end(&o, rc);
	if (rc)
		return rc;
	if (!*p)
		*--p = '/';
	memmove(buf, p, (size_t)(end - p));
	return 0;
}

/* ---- replication (store.h, "Replication") ---- */

/*
 * A store that turns follower forgets the purges a full map kept in memory
 * (store.h): they are of freeings it made as a leader, which the next leader may
 * never have got (not acknowledged). Sent later, were it to lead again, they
 * would remove the chunks of files that live on; left alone, they are garbage
 * for stoker fsck at worst. The purger settles no more of them (the count of
 * those it took is clamped to what is left, stk_meta_store_unrecorded_done).
 */
static void unrec_forget(struct stk_meta_store *st)
{
	size_t n;

	pthread_mutex_lock(&st->umu);
	n = st->nunrec;
	free(st->unrec);
	st->unrec = NULL;
	st->nunrec = 0;
	st->capunrec = 0;
	pthread_mutex_unlock(&st->umu);
	if (n)
		stk_warn("meta store: follows now: the purges of %zu freed file(s) kept in "
			 "memory (the map was full) are dropped; stoker fsck finds their chunks "
			 "as garbage",
			 n);
}

/* A thread's redo buffer goes with the thread (server workers come and go). */
static pthread_once_t redo_once = PTHREAD_ONCE_INIT;
static pthread_key_t redo_key;

static void redo_key_make(void)
{
	pthread_key_create(&redo_key, free);
}

static void redo_add(MDB_txn *txn, MDB_dbi dbi, int kind, const MDB_val *k, const MDB_val *v)
{
	struct stk_meta_store *st = redo.st;
	const char *name = dbi < TABLES_MAX ? st->tname[dbi] : "";
	size_t nl = strlen(name), vl = v ? v->mv_size : 0;
	size_t need = 2 + nl + 4 + k->mv_size + 4 + vl;
	struct stk_wbuf w;

	(void)txn;
	if (redo.err)
		return;
	if (nl == 0 || k->mv_size > UINT32_MAX || vl > UINT32_MAX) {
		stk_error("meta store: a change to table %u cannot be recorded", (unsigned)dbi);
		redo.err = -EIO;
		return;
	}
	if (redo.len + need > redo.cap) {
		size_t cap = STK_MAX(redo.cap * 2, redo.len + need + 4096);
		uint8_t *b;

		pthread_once(&redo_once, redo_key_make);
		b = realloc(redo.buf, cap);
		if (!b) {
			redo.err = -ENOMEM;
			return;
		}
		redo.buf = b;
		redo.cap = cap;
		pthread_setspecific(redo_key, b); /* freed when the thread exits */
	}
	stk_wbuf_init(&w, redo.buf + redo.len, need);
	stk_put_u8(&w, (uint8_t)kind);
	stk_put_u8(&w, (uint8_t)nl);
	stk_put_bytes(&w, name, nl);
	stk_put_u32(&w, (uint32_t)k->mv_size);
	stk_put_bytes(&w, k->mv_data, k->mv_size);
	stk_put_u32(&w, (uint32_t)vl);
	if (vl)
		stk_put_bytes(&w, v->mv_data, vl);
	redo.len += w.len;
}

int stk_meta_store_repl_set(struct stk_meta_store *st, int mode, uint64_t epoch,
			    stk_meta_redo_fn fn, void *ctx)
{
	MDB_txn *txn;
	int rc;

	if (mode != STK_META_REPL_OFF && mode != STK_META_REPL_LEADER &&
	    mode != STK_META_REPL_FOLLOWER)
		return -EINVAL;
	/* Under LMDB's writer lock: no write transaction is half-way through. */
	pthread_rwlock_rdlock(&st->map_lock);
	rc = lmdb_err(mdb_txn_begin(st->env, NULL, 0, &txn), "begin transaction");
	if (rc == 0) {
		pthread_mutex_lock(&st->repl_mu);
		__atomic_store_n(&st->repl_mode, mode, __ATOMIC_RELEASE);
		st->repl_epoch = epoch;
		st->redo_fn = fn;
		st->redo_ctx = ctx;
		pthread_mutex_unlock(&st->repl_mu);
		mdb_txn_abort(txn);
	}
	pthread_rwlock_unlock(&st->map_lock);
	if (rc == 0 && mode == STK_META_REPL_FOLLOWER)
		unrec_forget(st);
	return rc;
}

void stk_meta_store_repl_pos(struct stk_meta_store *st, uint64_t *epoch, uint64_t *seq)
{
	pthread_mutex_lock(&st->repl_mu);
	if (epoch)
		*epoch = st->pos_epoch;
	if (seq)
		*seq = st->pos_seq;
	pthread_mutex_unlock(&st->repl_mu);
}

uint64_t stk_meta_store_thread_seq(int reset)
{
	uint64_t v = thread_seq;

	if (reset)
		thread_seq = 0;
	return v;
}

static int table_of(struct stk_meta_store *st, const uint8_t *name, size_t nl, MDB_dbi *dbi)
{
	for (unsigned i = 0; i < TABLES_MAX; i++)
		if (strlen(st->tname[i]) == nl && memcmp(st->tname[i], name, nl) == 0) {
			*dbi = i;
			return 0;
		}
	stk_error("meta store: a replicated change names table \"%.*s\", which this store "
		  "does not have (a newer leader?)",
		  (int)nl, (const char *)name);
	return -EPROTO;
}

/* Makes the records of one redo record in o's transaction. */
static int ops_apply(struct op *o, const uint8_t *ops, size_t len)
{
	struct stk_rbuf r;
	int rc = 0;

	stk_rbuf_init(&r, ops, len);
	while (rc == 0 && r.off < r.len) {
		uint8_t kind = stk_get_u8(&r), nl = stk_get_u8(&r);
		const uint8_t *name = stk_rbuf_take(&r, nl);
		uint32_t kl = stk_get_u32(&r);
		const uint8_t *kb = stk_rbuf_take(&r, kl);
		uint32_t vl = stk_get_u32(&r);
		const uint8_t *vb = stk_rbuf_take(&r, vl);
		MDB_val k = {kl, (void *)kb}, v = {vl, (void *)vb};
		MDB_dbi dbi;

		if (r.err || (kind != REDO_PUT && kind != REDO_DEL) || kl == 0)
			return -EBADMSG;
		rc = table_of(o->st, name, nl, &dbi);
		if (rc)
			return rc;
		if (kind == REDO_PUT)
			rc = lmdb_err((mdb_put)(o->txn, dbi, &k, &v, 0), "apply a change");
		else if ((rc = (mdb_del)(o->txn, dbi, &k, NULL)) == MDB_NOTFOUND)
			rc = 0; /* a snapshot taken after the delete never had it */
		else
			rc = lmdb_err(rc, "apply a delete");
	}
	return rc;
}

static int apply_once(struct stk_meta_store *st, const uint8_t *buf, size_t len,
		      uint64_t *epoch_out, uint64_t *seq_out)
{
	uint64_t epoch, seq;
	struct stk_rbuf r;
	struct op o;
	int rc, changed = 0;

	stk_meta_store_repl_pos(st, &epoch, &seq);
	applying_now = 1;
	rc = op_begin(&o, st, NULL, 0);
	applying_now = 0;
	if (rc)
		return rc;
	stk_rbuf_init(&r, buf, len);
	while (rc == 0 && r.off < r.len) {
		uint64_t e = stk_get_u64(&r), s = stk_get_u64(&r);
		uint32_t n = stk_get_u32(&r);
		const uint8_t *ops = stk_rbuf_take(&r, n);

		if (r.err || s == 0) {
			rc = -EBADMSG;
			break;
		}
		if (s <= seq)
			continue; /* held already (sent again) */
		if (s != seq + 1) {
			rc = -ESTALE; /* a gap: the sender must go back to what this store holds */
			break;
		}
		rc = ops_apply(&o, ops, n);
		epoch = e;
		seq = s;
		changed = 1;
	}
	if (rc == 0 && changed)
		rc = pos_put(o.txn, st, epoch, seq);
	if (rc == 0 && !changed)
		rc = 1; /* nothing to commit */
	rc = op_end(&o, rc);
	if (rc == 1)
		rc = 0;
	else if (rc == 0) {
		pthread_mutex_lock(&st->repl_mu);
		st->pos_epoch = epoch;
		st->pos_seq = seq;
		pthread_mutex_unlock(&st->repl_mu);
	}
	if (rc == 0) {
		if (epoch_out)
			*epoch_out = epoch;
		if (seq_out)
			*seq_out = seq;
	}
	return rc;
}

/*
 * A leader whose map is full frees files through its reserve (reserve_open,
 * unrec_retry): the same changes need the same room here, so a full map opens
 * this store's reserve too and tries once more, rather than falling behind for
 * good (the leader's changes would wait for this follower).
 */
int stk_meta_store_apply(struct stk_meta_store *st, const uint8_t *buf, size_t len,
			 uint64_t *epoch_out, uint64_t *seq_out)
{
	int rc = apply_once(st, buf, len, epoch_out, seq_out);

	if (rc == -ENOSPC && reserve_open(st))
		rc = apply_once(st, buf, len, epoch_out, seq_out);
	return rc;
}

struct stk_meta_snap {
	struct stk_meta_store *st;
	unsigned table; /* the table being copied (its handle) */
	int resume;	/* key holds the last key sent of `table` */
	size_t klen;
	uint8_t key[512]; /* LMDB's largest key is 511 bytes */
};

int stk_meta_store_snap_begin(struct stk_meta_store *st, struct stk_meta_snap **out)
{
	struct stk_meta_snap *s = calloc(1, sizeof(*s));

	if (!s)
		return -ENOMEM;
	s->st = st;
	*out = s;
	return 0;
}

void stk_meta_store_snap_end(struct stk_meta_snap *s)
{
	free(s);
}

/* Appends one put record of table `name` to w; 0, or 1 when it does not fit. */
static int snap_put(struct stk_wbuf *w, const char *name, const MDB_val *k, const MDB_val *v)
{
	size_t nl = strlen(name), need = 2 + nl + 4 + k->mv_size + 4 + v->mv_size;

	if (w->cap - w->len < need)
		return 1;
	stk_put_u8(w, REDO_PUT);
	stk_put_u8(w, (uint8_t)nl);
	stk_put_bytes(w, name, nl);
	stk_put_u32(w, (uint32_t)k->mv_size);
	stk_put_bytes(w, k->mv_data, k->mv_size);
	stk_put_u32(w, (uint32_t)v->mv_size);
	stk_put_bytes(w, v->mv_data, v->mv_size);
	return 0;
}

int stk_meta_store_snap_next(struct stk_meta_snap *s, uint8_t *buf, size_t cap, size_t *len,
			     int *done)
{
	struct stk_meta_store *st = s->st;
	struct stk_wbuf w;
	struct op o;
	int rc, full = 0;

	*done = 0;
	stk_wbuf_init(&w, buf, cap);
	rc = op_begin(&o, st, NULL, 1);
	if (rc)
		return rc;
	for (; s->table < TABLES_MAX && !full; s->table++, s->resume = 0) {
		const char *name = st->tname[s->table];
		MDB_cursor *c;
		MDB_val k, v;
		int mrc;

		if (!name[0])
			continue;
		rc = lmdb_err(mdb_cursor_open(o.txn, s->table, &c), "copy a table");
		if (rc)
			break;
		if (s->resume) {
			k.mv_size = s->klen;
			k.mv_data = s->key;
			mrc = mdb_cursor_get(c, &k, &v, MDB_SET_RANGE);
			if (mrc == 0 && k.mv_size == s->klen &&
			    memcmp(k.mv_data, s->key, s->klen) == 0)
				mrc = mdb_cursor_get(c, &k, &v, MDB_NEXT);
		} else {
			mrc = mdb_cursor_get(c, &k, &v, MDB_FIRST);
		}
		for (; mrc == 0; mrc = mdb_cursor_get(c, &k, &v, MDB_NEXT)) {
			if (snap_put(&w, name, &k, &v)) {
				full = 1;
				break;
			}
			memcpy(s->key, k.mv_data, k.mv_size);
			s->klen = k.mv_size;
			s->resume = 1;
		}
		mdb_cursor_close(c);
		if (mrc && mrc != MDB_NOTFOUND) {
			rc = lmdb_err(mrc, "copy a table");
			break;
		}
		if (full)
			break; /* resume this table from its last key sent */
	}
	op_end(&o, 0);
	if (rc)
		return rc;
	if (full && w.len == 0)
		return -EMSGSIZE;
	*len = w.len;
	*done = !full;
	return 0;
}

static int snap_apply_once(struct stk_meta_store *st, int first, const uint8_t *ops, size_t len)
{
	struct op o;
	int rc;

	applying_now = 1;
	rc = op_begin(&o, st, NULL, 0);
	applying_now = 0;
	if (rc)
		return rc;
	if (first) {
		/* Holds nothing now: a crash before the end leaves it to copy again. */
		for (unsigned i = 0; i < TABLES_MAX && rc == 0; i++)
			if (st->tname[i][0])
				rc = lmdb_err((mdb_drop)(o.txn, i, 0), "empty a table");
		if (rc == 0)
			rc = pos_put(o.txn, st, 0, 0);
	}
	if (rc == 0)
		rc = ops_apply(&o, ops, len);
	rc = op_end(&o, rc);
	if (rc == 0 && first) {
		pthread_mutex_lock(&st->repl_mu);
		st->pos_epoch = 0;
		st->pos_seq = 0;
		pthread_mutex_unlock(&st->repl_mu);
		/* a half copy is no namespace: it says so until snap_done (and a restart
		 * before then makes itself a new identity, the copy's record being gone) */
		memset(&st->ns_id, 0, sizeof(st->ns_id));
	}
	return rc;
}

/* A full map: its reserve, as for a log (stk_meta_store_apply). */
int stk_meta_store_snap_apply(struct stk_meta_store *st, int first, const uint8_t *ops, size_t len)
{
	int rc = snap_apply_once(st, first, ops, len);

	if (rc == -ENOSPC && reserve_open(st))
		rc = snap_apply_once(st, first, ops, len);
	return rc;
}

int stk_meta_store_snap_done(struct stk_meta_store *st, uint64_t epoch, uint64_t seq)
{
	struct op o;
	int rc;

	applying_now = 1;
	rc = op_begin(&o, st, NULL, 0);
	applying_now = 0;
	if (rc)
		return rc;
	rc = pos_put(o.txn, st, epoch, seq);
	if (rc == 0)
		rc = ns_id_load(&o, 0);
	rc = op_end(&o, rc);
	if (rc == 0) {
		pthread_mutex_lock(&st->repl_mu);
		st->pos_epoch = epoch;
		st->pos_seq = seq;
		pthread_mutex_unlock(&st->repl_mu);
	}
	return rc;
}

/* ---- fsck: the namespace checked against itself ---- */

/* What the walks learn of one inode (fsck_ino_find looks it up by number). */
struct fsck_ino {
	uint64_t ino;
	uint64_t parent;   /* a directory's parent pointer */
	uint64_t named_in; /* a directory: the folder whose entry names it */
	uint32_t mode;
	uint32_t nlink;
	uint32_t refs;	  /* entries naming it */
	uint32_t subdirs; /* entries of directories in it */
	uint32_t walk;	  /* fsck_cycles: the walk that last went through it */
	uint8_t orphan;
	uint8_t rooted; /* fsck_cycles: its names lead to the root (or off this shard) */
};

struct fsck {
	struct op *o;
	int repair;
	stk_meta_fsck_fn fn;
	void *ctx;
	struct stk_meta_fsck_stats *stats;
	struct fsck_ino *v; /* by inode number, as the inodes table walks */
	size_t n, cap;
};

static struct fsck_ino *fsck_ino_find(const struct fsck *f, uint64_t ino)
{
	size_t lo = 0, hi = f->n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (f->v[mid].ino == ino)
			return &f->v[mid];
		if (f->v[mid].ino < ino)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

/* Tells the caller of one problem; rc is the repair's outcome (0: repaired). */
static int fsck_report(struct fsck *f, struct stk_meta_fsck_problem *p, int repaired)
{
	p->repaired = (uint8_t)repaired;
	f->stats->problems++;
	if (repaired)
		f->stats->repaired++;
	return f->fn ? f->fn(f->ctx, p) : 0;
}

static int fsck_load_inodes(struct fsck *f)
{
	MDB_cursor *cur = NULL;
	MDB_val key, val;
	int rc, mrc;

	rc = lmdb_err(mdb_cursor_open(f->o->txn, f->o->st->inodes, &cur), "open cursor");
	for (mrc = rc ? MDB_NOTFOUND : mdb_cursor_get(cur, &key, &val, MDB_FIRST); mrc == 0;
	     mrc = mdb_cursor_get(cur, &key, &val, MDB_NEXT)) {
		struct inode n;

		if (key.mv_size != 8 || inode_decode(be64_get(key.mv_data), &val, &n)) {
			struct stk_meta_fsck_problem p = {.kind = STK_FSCK_KIND_CORRUPT};

			p.ino = key.mv_size == 8 ? be64_get(key.mv_data) : 0;
			rc = fsck_report(f, &p, 0);
			if (rc)
				break;
			continue;
		}
		if (f->n == f->cap) {
			size_t cap = f->cap ? 2 * f->cap : 1024;
			struct fsck_ino *v = realloc(f->v, cap * sizeof(*v));

			if (!v) {
				rc = -ENOMEM;
				break;
			}
			f->v = v;
			f->cap = cap;
		}
		f->v[f->n++] = (struct fsck_ino){.ino = n.a.ino, .parent = n.parent,
						 .mode = n.a.mode, .nlink = n.a.nlink};
	}
	if (rc == 0 && mrc != MDB_NOTFOUND)
		rc = lmdb_err(mrc, "walk inodes");
	if (cur)
		mdb_cursor_close(cur);
	f->stats->inodes = f->n;
	return rc;
}

/*
 * Every entry: it must name an inode that exists, in a folder that exists. Counts
 * the names of each inode and the subfolders of each folder. Entries to drop are
 * collected first and dropped after the walk (no cursor changes under a walk).
 */
static int fsck_entries(struct fsck *f)
{
	struct stk_meta_fsck_problem *bad = NULL;
	size_t nbad = 0, capbad = 0;
	MDB_cursor *cur = NULL;
	MDB_val key, val;
	int rc, mrc;

	rc = lmdb_err(mdb_cursor_open(f->o->txn, f->o->st->dentries, &cur), "open cursor");
	for (mrc = rc ? MDB_NOTFOUND : mdb_cursor_get(cur, &key, &val, MDB_FIRST); mrc == 0;
	     mrc = mdb_cursor_get(cur, &key, &val, MDB_NEXT)) {
		struct stk_meta_fsck_problem p = {0};
		struct fsck_ino *dir, *n;
		struct stk_rbuf r;
		uint32_t type;
		size_t len;

		if (key.mv_size <= 16 || key.mv_size > DENTRY_KEY_MAX)
			continue;
		f->stats->entries++;
		p.parent = be64_get(key.mv_data);
		len = key.mv_size - 16;
		memcpy(p.name, (const uint8_t *)key.mv_data + 16, len);
		p.name[len] = 0;
		stk_rbuf_init(&r, val.mv_data, val.mv_size);
		p.ino = stk_get_u64(&r);
		type = stk_get_u32(&r);
		dir = fsck_ino_find(f, p.parent);
		n = fsck_ino_find(f, p.ino);
		if (!stk_rbuf_finish(&r) && dir && S_ISDIR(dir->mode) &&
		    stk_ino_shard(p.ino) != f->o->st->shard) {
			/*
			 * A folder of another shard (docs/meta-shards.md): that shard checks
			 * it. A file of another shard: its home counts this name
			 * (fsck_xfiles there).
			 */
			if (S_ISDIR(type))
				dir->subdirs++;
			continue;
		}
		if (stk_rbuf_finish(&r) || !dir || !S_ISDIR(dir->mode) || !n) {
			p.kind = !n ? STK_FSCK_KIND_DANGLING : STK_FSCK_KIND_LOST_ENTRY;
			if (stk_rbuf_finish(&r))
				p.kind = STK_FSCK_KIND_CORRUPT;
			if (nbad == capbad) {
				size_t cap = capbad ? 2 * capbad : 16;
				struct stk_meta_fsck_problem *b = realloc(bad, cap * sizeof(*b));

				if (!b) {
					rc = -ENOMEM;
					break;
				}
				bad = b;
				capbad = cap;
			}
			bad[nbad++] = p;
			continue;
		}
		n->refs++;
		if (S_ISDIR(n->mode)) {
			n->named_in = p.parent;
			dir->subdirs++;
		}
	}
	if (rc == 0 && mrc != MDB_NOTFOUND)
		rc = lmdb_err(mrc, "walk entries");
	if (cur)
		mdb_cursor_close(cur);
	for (size_t i = 0; rc == 0 && i < nbad; i++) {
		int fixed = 0;

		/* A name that leads nowhere, or from nowhere: dropping it loses nothing. */
		if (f->repair) {
			rc = dentry_del(f->o, bad[i].parent, bad[i].name);
			fixed = rc == 0;
		}
		if (rc == 0)
			rc = fsck_report(f, &bad[i], fixed);
	}
	free(bad);
	return rc;
}

/* Orphan records: each must name an inode that exists (one still open, without a name). */
static int fsck_orphans(struct fsck *f)
{
	uint8_t k[ORPHAN_KEY_LEN];
	MDB_val key = {sizeof(k), k}, val;
	MDB_cursor *cur = NULL;
	uint64_t *stale = NULL;
	size_t nstale = 0, cap = 0;
	int rc, mrc;

	orphan_key(k, 0);
	rc = lmdb_err(mdb_cursor_open(f->o->txn, f->o->st->sys, &cur), "open cursor");
	for (mrc = rc ? MDB_NOTFOUND : mdb_cursor_get(cur, &key, &val, MDB_SET_RANGE); mrc == 0;
	     mrc = mdb_cursor_get(cur, &key, &val, MDB_NEXT)) {
		uint64_t ino;
		struct fsck_ino *n;

		if (key.mv_size != ORPHAN_KEY_LEN ||
		    memcmp(key.mv_data, ORPHAN_PREFIX, sizeof(ORPHAN_PREFIX) - 1))
			break;
		ino = be64_get((const uint8_t *)key.mv_data + sizeof(ORPHAN_PREFIX) - 1);
		n = fsck_ino_find(f, ino);
		if (n) {
			n->orphan = 1;
			continue;
		}
		if (nstale == cap) {
			uint64_t *s = realloc(stale, (cap = cap ? 2 * cap : 16) * sizeof(*s));

			if (!s) {
				rc = -ENOMEM;
				break;
			}
			stale = s;
		}
		stale[nstale++] = ino;
	}
	if (rc == 0 && mrc != MDB_NOTFOUND)
		rc = lmdb_err(mrc, "walk orphans");
	if (cur)
		mdb_cursor_close(cur);
	for (size_t i = 0; rc == 0 && i < nstale; i++) {
		struct stk_meta_fsck_problem p = {.kind = STK_FSCK_KIND_STALE_ORPHAN, .ino = stale[i]};
		int fixed = 0;

		if (f->repair) {
			orphan_key(k, stale[i]);
			rc = lmdb_err(mdb_del(f->o->txn, f->o->st->sys, &key, NULL), "delete orphan");
			fixed = rc == 0;
		}
		if (rc == 0)
			rc = fsck_report(f, &p, fixed);
	}
	free(stale);
	return rc;
}

/*
 * fsck's lost+found (docs/fsck.md): the folder "lost+found" in the root, made on
 * demand (root's, mode 0700) when make is set. Only shard 1 holds the root's
 * entries, so only it has one: -EXDEV elsewhere, and when the name is a folder
 * of another shard; -ENOTDIR when it names no folder; -ENOENT when absent and
 * not to be made.
 */
static int lostfound_get(struct op *o, int make, struct inode *lf)
{
	struct inode root;
	struct dentry d;
	int rc;

	if (o->st->shard != 1)
		return -EXDEV;
	rc = inode_get(o, STK_ROOT_INO, &root);
	if (rc == 0)
		rc = dentry_get(o, STK_ROOT_INO, STK_LOSTFOUND_NAME, &d);
	if (rc == 0) {
		if (stk_ino_shard(d.ino) != o->st->shard)
			return -EXDEV;
		rc = inode_get(o, d.ino, lf);
		return rc ? rc : S_ISDIR(lf->a.mode) ? 0 : -ENOTDIR;
	}
	if (rc != -ENOENT || !make)
		return rc;
	rc = inode_new(o, &root, S_IFDIR | 0700, 0, lf);
	if (rc)
		return rc;
	lf->a.uid = 0;
	lf->a.gid = 0;
	lf->a.mode = S_IFDIR | 0700;
	lf->a.nlink = 2;
	lf->a.size = DIR_SIZE;
	lf->a.blocks = blocks_of(DIR_SIZE);
	lf->parent = STK_ROOT_INO;
	return entry_add(o, &root, STK_LOSTFOUND_NAME, lf);
}

/* The name an inode is reattached under in lost+found: "#INO", as e2fsck's. */
static void lostfound_name(uint64_t ino, char *name, size_t size)
{
	snprintf(name, size, "#%llu", (unsigned long long)ino);
}

/*
 * Reattaches inode n of this shard under lost+found (made if needed), as
 * "#INO": the entry, a folder's parent pointer and lost+found's link count, or a
 * file's link count (1: its one name now), all in the caller's transaction.
 * -EEXIST when that name is taken. *lf_ino says where it went.
 */
static int lostfound_adopt(struct op *o, struct inode *n, uint64_t *lf_ino, char *name)
{
	struct inode lf;
	int rc = lostfound_get(o, 1, &lf);

	if (rc)
		return rc;
	lostfound_name(n->a.ino, name, STK_NAME_MAX + 1);
	rc = name_free(o, &lf, name);
	if (rc == 0 && S_ISDIR(n->a.mode)) {
		if (lf.a.nlink == UINT32_MAX)
			return -EMLINK;
		lf.a.nlink++;
	} else if (rc == 0) {
		n->a.nlink = 1;
	}
	n->parent = lf.a.ino;
	if (rc == 0)
		rc = inode_put(o, n);
	if (rc == 0)
		rc = dentry_put(o, lf.a.ino, name, n->a.ino, n->a.mode);
	if (rc == 0) {
		touch_dir(o, &lf);
		rc = inode_put(o, &lf);
	}
	*lf_ino = lf.a.ino;
	return rc;
}

/*
 * fsck's repair of an unreached inode: reattached under lost+found, never freed.
 * lost+found's record in the walk's table (when it was there before) learns of
 * a new subfolder, so that its own link count is checked against it.
 */
static int fsck_reattach(struct fsck *f, const struct fsck_ino *e, struct stk_meta_fsck_problem *p)
{
	struct fsck_ino *lf;
	struct inode n;
	uint64_t lf_ino = 0;
	int rc = inode_get(f->o, e->ino, &n);

	if (rc == 0)
		rc = lostfound_adopt(f->o, &n, &lf_ino, p->name);
	if (rc)
		return rc;
	p->parent = lf_ino;
	lf = fsck_ino_find(f, lf_ino);
	if (lf && S_ISDIR(e->mode)) {
		lf->subdirs++;
		lf->nlink++;
	}
	return 0;
}

static int xwalk(struct op *o, char kind, int (*fn)(uint64_t, const MDB_val *, void *),
		 void *ctx);
static int xrec_decode(const MDB_val *v, uint32_t *shard, uint64_t *id);
static int xmark_decode(uint64_t ino, const MDB_val *v, struct stk_meta_xmark *m);

/* A file's name on another shard, recorded at its home ('X'): one of its links. */
static int fsck_xname_one(uint64_t ino, const MDB_val *val, void *ctx)
{
	struct fsck *f = ctx;
	struct fsck_ino *n = fsck_ino_find(f, ino);
	uint64_t id;
	uint32_t holder;

	if (n && xrec_decode(val, &holder, &id) == 0)
		n->refs++;
	return 0;
}

/*
 * A rename across shards between its steps 2 and 4 (a mark here): the entry it
 * wrote names the file before the file's books say so (not counted yet), and
 * what that entry replaced keeps its link until step 4 (counted still). So does
 * the empty folder a folder's move across shards replaced (FVICTIM).
 */
static int fsck_xmark_one(uint64_t ino, const MDB_val *val, void *ctx)
{
	struct fsck *f = ctx;
	struct stk_meta_xmark m;
	struct fsck_ino *n;

	if (xmark_decode(ino, val, &m))
		return 0;
	if (m.kind == STK_XMARK_FVICTIM) {
		/* the empty folder a folder's move replaced: named until step 4 */
		n = fsck_ino_find(f, m.ino);
		if (n && !n->refs) {
			n->refs = 1;
			n->named_in = m.parent;
		}
		return 0;
	}
	if (m.kind != STK_XMARK_RENAME)
		return 0;
	n = fsck_ino_find(f, m.ino);
	if (n && n->refs)
		n->refs--;
	n = m.old_ino ? fsck_ino_find(f, m.old_ino) : NULL;
	if (n)
		n->refs++;
	return 0;
}

/*
 * The link counts of files renamed across shards (docs/meta-shards.md): a name
 * on another shard counts at the file's home, through the home's record of it;
 * a rename in flight counts as before it (fsck_xmark_one).
 */
static int fsck_xfiles(struct fsck *f)
{
	int rc;

	if (!f->o->st->xshard)
		return 0;
	rc = xwalk(f->o, 'X', fsck_xname_one, f);
	return rc ? rc : xwalk(f->o, 'M', fsck_xmark_one, f);
}

/* The name in folder parent of inode ino, into name; -ENOENT when none names it. */
static int fsck_name_of(struct op *o, uint64_t parent, uint64_t ino, char *name)
{
	uint8_t k[16];
	MDB_val key = {sizeof(k), k}, val;
	MDB_cursor *cur = NULL;
	int rc, mrc;

	be64_put(k, parent);
	memset(k + 8, 0, 8);
	rc = lmdb_err(mdb_cursor_open(o->txn, o->st->dentries, &cur), "open cursor");
	for (mrc = rc ? MDB_NOTFOUND : mdb_cursor_get(cur, &key, &val, MDB_SET_RANGE); mrc == 0;
	     mrc = mdb_cursor_get(cur, &key, &val, MDB_NEXT)) {
		struct stk_rbuf r;
		size_t len;

		if (key.mv_size < 8 || be64_get(key.mv_data) != parent)
			break;
		if (key.mv_size <= 16 || key.mv_size > DENTRY_KEY_MAX)
			continue;
		stk_rbuf_init(&r, val.mv_data, val.mv_size);
		if (stk_get_u64(&r) != ino || r.err)
			continue;
		len = key.mv_size - 16;
		memcpy(name, (const uint8_t *)key.mv_data + 16, len);
		name[len] = 0;
		break;
	}
	if (rc == 0 && mrc == MDB_NOTFOUND)
		rc = -ENOENT;
	else if (rc == 0 && mrc)
		rc = lmdb_err(mrc, "walk entries");
	if (cur)
		mdb_cursor_close(cur);
	return rc;
}

/*
 * A loop of folders found by fsck_cycles, cut with repair: the entry naming its
 * folder of the smallest number goes (and its parent's link), so that it is a
 * folder no name reaches, which fsck_one reports and stk_fsck reattaches under
 * lost+found as any other (the rest of the loop is then reached through it).
 */
static int fsck_cut(struct fsck *f, struct fsck_ino *e, uint64_t nloop)
{
	struct stk_meta_fsck_problem p = {.kind = STK_FSCK_KIND_CYCLE,
					  .ino = e->ino,
					  .parent = e->named_in,
					  .expect = e->parent,
					  .found = nloop};
	struct fsck_ino *dir = fsck_ino_find(f, e->named_in);
	struct inode d;
	int rc = fsck_name_of(f->o, e->named_in, e->ino, p.name);

	if (rc || !f->repair || !dir)
		return rc ? rc : fsck_report(f, &p, 0);
	rc = dentry_del(f->o, e->named_in, p.name);
	if (rc == 0)
		rc = inode_get(f->o, e->named_in, &d);
	if (rc == 0) {
		if (d.a.nlink > 2)
			d.a.nlink--;
		touch_dir(f->o, &d);
		rc = inode_put(f->o, &d);
	}
	if (rc)
		return rc;
	if (dir->subdirs)
		dir->subdirs--;
	if (dir->nlink > 2)
		dir->nlink--;
	e->refs = 0;
	e->named_in = 0;
	return fsck_report(f, &p, 1);
}

/*
 * Folders whose names lead in a loop (each named in the next, the last in the
 * first) that never reaches the root: each has a name, so fsck_one would not
 * find them unreached. Each folder named once is followed up its names (the
 * folder whose entry names it) until the root, a folder of another shard's
 * parent (the cross-shard check's), a folder not named once (fsck_one's) or a
 * folder known to lead to the root; coming back to a folder of the same walk is
 * a loop. A loop across shards is not seen here (docs/fsck.md, "Not yet").
 */
static int fsck_cycles(struct fsck *f)
{
	uint32_t walk = 0;
	int rc = 0;

	for (size_t i = 0; rc == 0 && i < f->n; i++) {
		struct fsck_ino *e = &f->v[i], *c, *min;
		uint64_t nloop = 0;

		if (!S_ISDIR(e->mode) || e->rooted)
			continue;
		walk++;
		for (c = e; c; c = fsck_ino_find(f, c->named_in)) {
			if (!S_ISDIR(c->mode) || c->rooted || c->ino == STK_ROOT_INO ||
			    c->refs != 1 || stk_ino_shard(c->parent) != f->o->st->shard ||
			    c->walk == walk)
				break;
			c->walk = walk;
		}
		if (c && S_ISDIR(c->mode) && !c->rooted && c->walk == walk && c->refs == 1 &&
		    c->ino != STK_ROOT_INO && stk_ino_shard(c->parent) == f->o->st->shard) {
			/* back at c: the loop is c and the folders up its names to c again */
			min = c;
			for (struct fsck_ino *x = c;;) {
				nloop++;
				if (x->ino < min->ino)
					min = x;
				x = fsck_ino_find(f, x->named_in);
				if (!x || x == c)
					break;
			}
			rc = fsck_cut(f, min, nloop);
		}
		/* every folder of this walk is settled: reached, or in a loop now reported */
		for (c = e; c && c->walk == walk && !c->rooted; c = fsck_ino_find(f, c->named_in))
			c->rooted = 1;
	}
	return rc;
}

/* One inode against what the entries say of it. */
static int fsck_one(struct fsck *f, const struct fsck_ino *e)
{
	struct stk_meta_fsck_problem p = {.ino = e->ino};
	uint32_t want;
	struct inode n;
	int rc = 0, dir = S_ISDIR(e->mode), root = e->ino == STK_ROOT_INO;
	/* named on its parent's shard, which this one cannot see: fsck asks both */
	int foreign = dir && stk_ino_shard(e->parent) != f->o->st->shard;

	if (dir)
		f->stats->dirs++;
	else if (S_ISREG(e->mode))
		f->stats->files++;
	if (root && foreign)
		return 0; /* another shard's root record: shard 1 holds the root */
	if (!root && !foreign && e->refs == 0 && !(e->orphan && !dir)) {
		/*
		 * No name reaches it and no open file keeps it: reattached under
		 * lost+found, never freed (what it holds may matter). Only shard 1
		 * has the root: another shard's is reported here and stk_fsck
		 * reattaches it through shard 1. So is a folder of shard 1, which an
		 * entry of another shard may name (its pointer wrong): stk_fsck
		 * looks at those entries first.
		 */
		p.kind = STK_FSCK_KIND_UNREACHED;
		p.found = e->nlink;
		p.expect = e->parent; /* the parent pointer, for stk_fsck */
		if (!f->repair || f->o->st->shard != 1 || dir)
			return fsck_report(f, &p, 0);
		rc = fsck_reattach(f, e, &p);
		if (rc == -EEXIST || rc == -ENOTDIR || rc == -EXDEV || rc == -EMLINK) {
			stk_warn("fsck: inode %llu is reached by no name and cannot go in "
				 "lost+found: %s",
				 (unsigned long long)e->ino, strerror(-rc));
			p.name[0] = 0;
			p.parent = 0;
			return fsck_report(f, &p, 0);
		}
		return rc ? rc : fsck_report(f, &p, 1);
	}
	want = dir ? 2 + e->subdirs : e->refs;
	if (e->nlink != want && !(e->refs == 0 && e->orphan)) {
		p.kind = STK_FSCK_KIND_NLINK;
		p.expect = want;
		p.found = e->nlink;
		if (!f->repair)
			return fsck_report(f, &p, 0);
		rc = inode_get(f->o, e->ino, &n);
		if (rc == 0) {
			n.a.nlink = want;
			rc = inode_put(f->o, &n);
		}
		rc = rc ? rc : fsck_report(f, &p, 1);
	}
	if (rc == 0 && dir && !root && !foreign && e->refs == 1 && e->parent != e->named_in) {
		p.kind = STK_FSCK_KIND_PARENT;
		p.expect = e->named_in;
		p.found = e->parent;
		if (!f->repair)
			return fsck_report(f, &p, 0);
		rc = inode_get(f->o, e->ino, &n);
		if (rc == 0) {
			n.parent = e->named_in;
			rc = inode_put(f->o, &n);
		}
		rc = rc ? rc : fsck_report(f, &p, 1);
	}
	return rc;
}

/* Quota usage against a count of the inodes (orphans included) tagged into each. */
struct fsck_quota {
	struct quota q;
	uint64_t bytes, inodes; /* counted */
};

static int fsck_quotas(struct fsck *f)
{
	struct fsck_quota *qs = NULL;
	size_t nq = 0, cap = 0;
	MDB_cursor *cur = NULL;
	MDB_val key, val;
	int rc, mrc;

	rc = lmdb_err(mdb_cursor_open(f->o->txn, f->o->st->quotas, &cur), "open cursor");
	for (mrc = rc ? MDB_NOTFOUND : mdb_cursor_get(cur, &key, &val, MDB_FIRST); mrc == 0;
	     mrc = mdb_cursor_get(cur, &key, &val, MDB_NEXT)) {
		if (key.mv_size != 8)
			continue;
		if (nq == cap) {
			struct fsck_quota *v = realloc(qs, (cap = cap ? 2 * cap : 16) * sizeof(*v));

			if (!v) {
				rc = -ENOMEM;
				break;
			}
			qs = v;
		}
		memset(&qs[nq], 0, sizeof(qs[nq]));
		rc = quota_get(f->o, be64_get(key.mv_data), &qs[nq].q);
		if (rc)
			break;
		nq++;
	}
	if (rc == 0 && mrc != MDB_NOTFOUND)
		rc = lmdb_err(mrc, "walk quotas");
	if (cur)
		mdb_cursor_close(cur);
	cur = NULL;
	if (rc || nq == 0)
		goto out;
	/* Inodes after the repairs above: read the table again in this transaction. */
	rc = lmdb_err(mdb_cursor_open(f->o->txn, f->o->st->inodes, &cur), "open cursor");
	for (mrc = rc ? MDB_NOTFOUND : mdb_cursor_get(cur, &key, &val, MDB_FIRST); mrc == 0;
	     mrc = mdb_cursor_get(cur, &key, &val, MDB_NEXT)) {
		uint64_t qid;
		struct inode n;
		unsigned depth = 0;

		if (key.mv_size != 8 || inode_decode(be64_get(key.mv_data), &val, &n))
			continue;
		for (qid = n.a.qid; qid && depth < QUOTA_DEPTH_MAX; depth++) {
			struct fsck_quota *q = NULL;

			for (size_t i = 0; i < nq && !q; i++)
				if (qs[i].q.qid == qid)
					q = &qs[i];
			if (!q)
				break;
			q->inodes++;
			q->bytes += (uint64_t)quota_bytes_of(&n);
			qid = q->q.parent;
		}
	}
	if (rc == 0 && mrc != MDB_NOTFOUND)
		rc = lmdb_err(mrc, "walk inodes");
	for (size_t i = 0; rc == 0 && i < nq; i++) {
		struct fsck_quota *q = &qs[i];
		struct stk_meta_fsck_problem pb = {.kind = STK_FSCK_KIND_QUOTA_BYTES, .ino = q->q.qid,
						   .expect = q->bytes, .found = q->q.used_bytes};
		struct stk_meta_fsck_problem pi = {.kind = STK_FSCK_KIND_QUOTA_INODES,
						   .ino = q->q.qid, .expect = q->inodes,
						   .found = q->q.used_inodes};
		int bad_b = q->bytes != q->q.used_bytes, bad_i = q->inodes != q->q.used_inodes;

		if (!bad_b && !bad_i)
			continue;
		if (f->repair) {
			q->q.used_bytes = q->bytes;
			q->q.used_inodes = q->inodes;
			rc = quota_put(f->o, &q->q);
		}
		if (rc == 0 && bad_b)
			rc = fsck_report(f, &pb, f->repair);
		if (rc == 0 && bad_i)
			rc = fsck_report(f, &pi, f->repair);
	}
out:
	if (cur)
		mdb_cursor_close(cur);
	free(qs);
	return rc;
}

int stk_meta_store_fsck(struct stk_meta_store *st, int repair, stk_meta_fsck_fn fn, void *ctx,
			struct stk_meta_fsck_stats *stats)
{
	static const struct stk_cred root_cred;
	struct fsck f = {.repair = repair, .fn = fn, .ctx = ctx, .stats = stats};
	struct op o;
	int rc;

	memset(stats, 0, sizeof(*stats));
	rc = op_begin(&o, st, &root_cred, !repair);
	if (rc)
		return rc;
	f.o = &o;
	rc = fsck_load_inodes(&f);
	if (rc == 0)
		rc = fsck_entries(&f);
	if (rc == 0)
		rc = fsck_orphans(&f);
	if (rc == 0)
		rc = fsck_xfiles(&f);
	if (rc == 0)
		rc = fsck_cycles(&f);
	for (size_t i = 0; rc == 0 && i < f.n; i++)
		rc = fsck_one(&f, &f.v[i]);
	if (rc == 0)
		rc = fsck_quotas(&f);
	if (rc == 0) {
		uint64_t next = 0;

		rc = ino_next_get(&o, &next);
		stats->next_ino = next;
	}
	free(f.v);
	rc = op_end(&o, rc);
	if (rc == 0 && repair && stats->repaired)
		stk_warn("fsck: %llu problem(s) of the namespace repaired",
			 (unsigned long long)stats->repaired);
	return rc;
}

_Static_assert(sizeof(((struct stk_meta_file *)0)->alloc) == sizeof(((struct inode *)0)->alloc),
	       "stk_meta_file holds every range an inode keeps");

int stk_meta_store_files(struct stk_meta_store *st, uint64_t from, struct stk_meta_file *out,
			 size_t max, size_t *n)
{
	static const struct stk_cred root_cred;
	uint8_t k[8];
	MDB_val key = {sizeof(k), k}, val;
	MDB_cursor *cur = NULL;
	struct op o;
	int rc, mrc;

	*n = 0;
	rc = op_begin(&o, st, &root_cred, 1);
	if (rc)
		return rc;
	be64_put(k, from);
	rc = lmdb_err(mdb_cursor_open(o.txn, st->inodes, &cur), "open cursor");
	for (mrc = rc ? MDB_NOTFOUND : mdb_cursor_get(cur, &key, &val, MDB_SET_RANGE);
	     mrc == 0 && *n < max; mrc = mdb_cursor_get(cur, &key, &val, MDB_NEXT)) {
		struct stk_meta_file *fl = &out[*n];
		struct inode in;

		if (key.mv_size != 8 || inode_decode(be64_get(key.mv_data), &val, &in) ||
		    !S_ISREG(in.a.mode))
			continue;
		memset(fl, 0, sizeof(*fl));
		fl->attr = in.a;
		fl->orphan = in.a.nlink == 0;
		/* Past ALLOC_RANGES_MAX ranges merged: the holes between count as written. */
		fl->exact = in.nalloc < ALLOC_RANGES_MAX;
		fl->nalloc = in.nalloc;
		memcpy(fl->alloc, in.alloc, sizeof(fl->alloc));
		(*n)++;
	}
	if (rc == 0 && mrc && mrc != MDB_NOTFOUND)
		rc = lmdb_err(mrc, "list files");
	if (cur)
		mdb_cursor_close(cur);
	return op_end(&o, rc);
}

/* ---- client confinement (docs/security.md, "Client keys") ---- */

int stk_meta_store_climb(struct stk_meta_store *st, uint64_t ino, uint64_t top, uint64_t *left)
{
	static const struct stk_cred root_cred;
	struct inode n;
	struct op o;
	uint64_t cur = ino;
	int rc;

	*left = 0;
	if (ino == top || top == STK_ROOT_INO)
		return 1;
	if (stk_ino_shard(ino) != st->shard) {
		*left = ino;
		return 2;
	}
	rc = op_begin(&o, st, &root_cred, 1);
	if (rc)
		return rc;
	rc = inode_get(&o, cur, &n);
	if (rc == 0 && !S_ISDIR(n.a.mode))
		cur = n.parent; /* 0 when made by an older release: not known to be inside */
	for (unsigned depth = 0; rc == 0; depth++) {
		if (cur == top) {
			rc = 1;
			break;
		}
		if (cur == 0 || cur == STK_ROOT_INO)
			break;
		if (stk_ino_shard(cur) != st->shard) {
			/* a parent on another shard: the walk goes on there (meta/span.c) */
			*left = cur;
			rc = 2;
			break;
		}
		if (depth == MAX_DEPTH) {
			rc = -EIO;
			break;
		}
		rc = inode_get(&o, cur, &n);
		if (rc == 0)
			cur = n.parent;
	}
	op_end(&o, rc < 0 ? rc : 0);
	return rc == -ENOENT ? 0 : rc;
}

int stk_meta_store_within(struct stk_meta_store *st, uint64_t ino, uint64_t top)
{
	uint64_t left;
	int rc = stk_meta_store_climb(st, ino, top, &left);

	return rc == 2 ? 0 : rc;
}

int stk_meta_store_resolve(struct stk_meta_store *st, const char *path, uint64_t *ino)
{
	static const struct stk_cred root_cred;
	char name[STK_NAME_MAX + 1];
	struct inode dir, n;
	const char *p = path;
	struct op o;
	int rc;

	if (*p != '/')
		return -EINVAL;
	rc = op_begin(&o, st, &root_cred, 1);
	if (rc)
		return rc;
	rc = inode_get(&o, STK_ROOT_INO, &dir);
	while (rc == 0 && *p) {
		size_t len;

		while (*p == '/')
			p++;
		len = strcspn(p, "/");
		if (len == 0)
			break;
		if (len > STK_NAME_MAX) {
			rc = -ENAMETOOLONG;
			break;
		}
		memcpy(name, p, len);
		name[len] = 0;
		p += len;
		if (!S_ISDIR(dir.a.mode)) {
			rc = -ENOTDIR;
			break;
		}
		rc = child_get(&o, &dir, name, &n);
		if (rc == 0)
			dir = n;
	}
	if (rc == 0 && !S_ISDIR(dir.a.mode))
		rc = -ENOTDIR;
	if (rc == 0)
		*ino = dir.a.ino;
	return op_end(&o, rc);
}

/* ---- cross-shard folders (docs/meta-shards.md; the protocol is meta/xshard.c's) ---- */

/*
 * A folder whose entry lives on shard A and whose inode on shard B is made and
 * removed in four steps, each one transaction on one shard, recorded in the
 * `xshard` table so that a crash between any two is undone or finished on
 * restart: A's intents ('I' + intent id: kind, B, parent, name, the folder),
 * B's marks on the folder's inode ('M' + inode: pending or dying, for A's
 * intent, with the name at A). "N" holds the next intent id.
 */
#define XKEY_LEN 9
/* the marks that carry what their entry replaced (a file's rename, a folder's move) */
#define XMARK_HAS_OLD(k)                                                                   \
	((k) == STK_XMARK_RENAME || (k) == STK_XMARK_FMOVE || (k) == STK_XMARK_FPTR ||      \
	 (k) == STK_XMARK_FVICTIM)
static const char XNEXT_KEY[] = "N";

static void xkey(uint8_t *k, char kind, uint64_t v)
{
	k[0] = (uint8_t)kind;
	be64_put(k + 1, v);
}

static int xput(struct op *o, char kind, uint64_t v, const struct stk_wbuf *w)
{
	uint8_t k[XKEY_LEN];
	MDB_val key = {sizeof(k), k}, val = {w->len, w->p};

	if (w->err)
		return -EIO;
	xkey(k, kind, v);
	return lmdb_err(mdb_put(o->txn, o->st->xshard, &key, &val, 0), "write cross-shard record");
}

static int xdel(struct op *o, char kind, uint64_t v)
{
	uint8_t k[XKEY_LEN];
	MDB_val key = {sizeof(k), k};

	xkey(k, kind, v);
	return lmdb_err(mdb_del(o->txn, o->st->xshard, &key, NULL), "delete cross-shard record");
}

static void xname_put(struct stk_wbuf *w, const char *name)
{
	size_t len = strnlen(name, STK_NAME_MAX);

	stk_put_u16(w, (uint16_t)len);
	stk_put_bytes(w, name, len);
}

static void xname_get(struct stk_rbuf *r, char *name)
{
	uint16_t len = stk_get_u16(r);

	if (len > STK_NAME_MAX) {
		r->err = -EBADMSG;
		len = 0;
	}
	stk_get_bytes(r, name, len);
	name[r->err ? 0 : len] = 0;
}

static int xintent_decode(uint64_t id, const MDB_val *v, struct stk_meta_xintent *x)
{
	struct stk_rbuf r;

	memset(x, 0, sizeof(*x));
	stk_rbuf_init(&r, v->mv_data, v->mv_size);
	x->id = id;
	x->kind = stk_get_u8(&r);
	x->shard = stk_get_u32(&r);
	x->parent = stk_get_u64(&r);
	x->ino = stk_get_u64(&r);
	xname_get(&r, x->name);
	if (stk_rbuf_finish(&r)) {
		stk_error("meta store: cross-shard intent %llu: corrupt record",
			  (unsigned long long)id);
		return -EIO;
	}
	return 0;
}

static int xintent_get(struct op *o, uint64_t id, struct stk_meta_xintent *x)
{
	uint8_t k[XKEY_LEN];
	MDB_val key = {sizeof(k), k}, val;
	int rc;

	xkey(k, 'I', id);
	rc = mdb_get(o->txn, o->st->xshard, &key, &val);
	if (rc)
		return lmdb_err(rc, "read cross-shard intent");
	return xintent_decode(id, &val, x);
}

static int xintent_put(struct op *o, struct stk_meta_xintent *x)
{
	MDB_val key = {sizeof(XNEXT_KEY) - 1, (void *)XNEXT_KEY}, val;
	uint8_t buf[32 + STK_NAME_MAX], nb[8];
	uint64_t next = 1;
	struct stk_wbuf w;
	int rc;

	rc = mdb_get(o->txn, o->st->xshard, &key, &val);
	if (rc == 0 && val.mv_size == 8)
		next = be64_get(val.mv_data);
	else if (rc != MDB_NOTFOUND && rc != 0)
		return lmdb_err(rc, "read intent counter");
	x->id = next;
	be64_put(nb, next + 1);
	val.mv_size = sizeof(nb);
	val.mv_data = nb;
	rc = lmdb_err(mdb_put(o->txn, o->st->xshard, &key, &val, 0), "write intent counter");
	if (rc)
		return rc;
	stk_wbuf_init(&w, buf, sizeof(buf));
	stk_put_u8(&w, (uint8_t)x->kind);
	stk_put_u32(&w, x->shard);
	stk_put_u64(&w, x->parent);
	stk_put_u64(&w, x->ino);
	xname_put(&w, x->name);
	return xput(o, 'I', x->id, &w);
}

static int xmark_decode(uint64_t ino, const MDB_val *v, struct stk_meta_xmark *m)
{
	struct stk_rbuf r;

	memset(m, 0, sizeof(*m));
	stk_rbuf_init(&r, v->mv_data, v->mv_size);
	m->ino = ino;
	m->kind = stk_get_u8(&r);
	m->from = stk_get_u32(&r);
	m->intent = stk_get_u64(&r);
	m->parent = stk_get_u64(&r);
	xname_get(&r, m->name);
	if (XMARK_HAS_OLD(m->kind)) {
		m->old_ino = stk_get_u64(&r);
		m->old_type = stk_get_u32(&r);
	}
	if (stk_rbuf_finish(&r)) {
		stk_error("meta store: cross-shard mark of inode %llu: corrupt record",
			  (unsigned long long)ino);
		return -EIO;
	}
	return 0;
}

static int xmark_get(struct op *o, uint64_t ino, struct stk_meta_xmark *m)
{
	uint8_t k[XKEY_LEN];
	MDB_val key = {sizeof(k), k}, val;
	int rc;

	xkey(k, 'M', ino);
	rc = mdb_get(o->txn, o->st->xshard, &key, &val);
	if (rc)
		return lmdb_err(rc, "read cross-shard mark");
	return xmark_decode(ino, &val, m);
}

static int xmark_put(struct op *o, const struct stk_meta_xmark *m)
{
	uint8_t buf[48 + STK_NAME_MAX];
	struct stk_wbuf w;

	stk_wbuf_init(&w, buf, sizeof(buf));
	stk_put_u8(&w, (uint8_t)m->kind);
	stk_put_u32(&w, m->from);
	stk_put_u64(&w, m->intent);
	stk_put_u64(&w, m->parent);
	xname_put(&w, m->name);
	if (XMARK_HAS_OLD(m->kind)) {
		stk_put_u64(&w, m->old_ino);
		stk_put_u32(&w, m->old_type & S_IFMT);
	}
	return xput(o, 'M', m->ino, &w);
}

/* -ENOENT when folder ino is marked dying (its removal is under way), else 0. */
static int xmark_dying(struct op *o, uint64_t ino)
{
	struct stk_meta_xmark m;
	int rc;

	if (!o->st->xshard)
		return 0;
	rc = xmark_get(o, ino, &m);
	if (rc == -ENOENT)
		return 0;
	if (rc)
		return rc;
	/* a folder replaced by a folder moved across shards takes nothing new either */
	return m.kind == STK_XMARK_DYING || m.kind == STK_XMARK_FVICTIM ? -ENOENT : 0;
}

/*
 * -EBUSY when file ino is in a rename across shards: the source's shard holds an
 * intent about it ('B' + inode, from step 1 to the commit or the give-up) or the
 * destination's a mark on it (steps 2 to 4). Else 0.
 */
static int xmark_busy(struct op *o, uint64_t ino)
{
	uint8_t k[XKEY_LEN];
	MDB_val key = {sizeof(k), k}, val;
	struct stk_meta_xmark m;
	int rc;

	if (!o->st->xshard)
		return 0;
	xkey(k, 'B', ino);
	rc = mdb_get(o->txn, o->st->xshard, &key, &val);
	if (rc != MDB_NOTFOUND)
		return rc ? lmdb_err(rc, "read cross-shard record") : -EBUSY;
	rc = xmark_get(o, ino, &m);
	if (rc == -ENOENT)
		return 0;
	if (rc)
		return rc;
	/* a folder moved across shards is held from step 1 to its mark's settling */
	return m.kind == STK_XMARK_RENAME || m.kind == STK_XMARK_FMOVE ||
		       m.kind == STK_XMARK_FPTR || m.kind == STK_XMARK_FVICTIM
		   ? -EBUSY
		   : 0;
}

/*
 * The records of a file's name off its home shard ("Files renamed across shards"
 * in store.h): 'X' + inode on its home (the holder shard and the id), 'R' + inode
 * on the holder (the home and the id), 'L' + inode on the holder once that name
 * went (a release to tell the home).
 */
static int xrec_put(struct op *o, char kind, uint64_t ino, uint32_t shard, uint64_t id)
{
	uint8_t buf[12];
	struct stk_wbuf w;

	stk_wbuf_init(&w, buf, sizeof(buf));
	stk_put_u32(&w, shard);
	stk_put_u64(&w, id);
	return xput(o, kind, ino, &w);
}

static int xrec_decode(const MDB_val *v, uint32_t *shard, uint64_t *id)
{
	struct stk_rbuf r;

	stk_rbuf_init(&r, v->mv_data, v->mv_size);
	*shard = stk_get_u32(&r);
	*id = stk_get_u64(&r);
	if (stk_rbuf_finish(&r)) {
		stk_error("meta store: record of a file's name on another shard: corrupt");
		return -EIO;
	}
	return 0;
}

/* -ENOENT when there is none. */
static int xrec_get(struct op *o, char kind, uint64_t ino, uint32_t *shard, uint64_t *id)
{
	uint8_t k[XKEY_LEN];
	MDB_val key = {sizeof(k), k}, val;
	int rc;

	if (!o->st->xshard)
		return -ENOENT;
	xkey(k, kind, ino);
	rc = mdb_get(o->txn, o->st->xshard, &key, &val);
	if (rc)
		return lmdb_err(rc, "read cross-shard record");
	return xrec_decode(&val, shard, id);
}

/*
 * Holder: the name of remote file ino here went (unlinked or replaced): its
 * record becomes a release, for xshard.c to tell the home. -EBUSY while a rename
 * across shards is at work on it; -EIO when no record says where it lives.
 */
static int xrelease_start(struct op *o, uint64_t ino)
{
	uint32_t home;
	uint64_t id;
	int rc = xmark_busy(o, ino);

	if (rc == 0)
		rc = xrec_get(o, 'R', ino, &home, &id);
	if (rc == -ENOENT) {
		stk_error("meta store: a name of file %llu of shard %u, which no record here "
			  "knows",
			  (unsigned long long)ino, stk_ino_shard(ino));
		rc = -EIO;
	}
	if (rc == 0)
		rc = xdel(o, 'R', ino);
	return rc ? rc : xrec_put(o, 'L', ino, home, id);
}

/* Walks the records of one kind ('I' or 'M'), calling fn on each; stops on its non-zero. */
typedef int (*xwalk_fn)(uint64_t v, const MDB_val *val, void *ctx);

static int xwalk(struct op *o, char kind, xwalk_fn fn, void *ctx)
{
	uint8_t k[XKEY_LEN];
	MDB_val key = {sizeof(k), k}, val;
	MDB_cursor *c;
	int rc;

	xkey(k, kind, 0);
	rc = mdb_cursor_open(o->txn, o->st->xshard, &c);
	if (rc)
		return lmdb_err(rc, "open cursor");
	for (rc = mdb_cursor_get(c, &key, &val, MDB_SET_RANGE); rc == 0;
	     rc = mdb_cursor_get(c, &key, &val, MDB_NEXT)) {
		if (key.mv_size != XKEY_LEN || ((const uint8_t *)key.mv_data)[0] != (uint8_t)kind)
			break;
		rc = fn(be64_get((const uint8_t *)key.mv_data + 1), &val, ctx);
		if (rc)
			break;
	}
	mdb_cursor_close(c);
	if (rc == MDB_NOTFOUND || rc == 0)
		return 0;
	return rc == 1 ? 0 : rc < 0 ? rc : lmdb_err(rc, "walk cross-shard records");
}

int stk_meta_store_xintent_mkdir(struct stk_meta_store *st, const struct stk_cred *cred,
				 uint64_t parent, const char *name, uint32_t shard, uint64_t *id)
{
	struct stk_meta_xintent x = {.kind = STK_XINTENT_MKDIR, .shard = shard, .parent = parent};
	struct inode dir;
	struct op o;
	int rc = check_name(name);

	if (rc)
		return rc;
	if (shard < 1 || shard > STK_MAX_SHARDS || shard == st->shard)
		return -EINVAL;
	rc = op_begin(&o, st, cred, 0);
	if (rc)
		return rc;
	rc = dir_get(&o, parent, MAY_X, &dir);
	if (rc == 0)
		rc = name_free(&o, &dir, name);
	if (rc == 0)
		rc = may(&o, &dir.a, MAY_W | MAY_X);
	if (rc == 0 && dir.a.nlink == UINT32_MAX)
		rc = -EMLINK;
	if (rc == 0) {
		snprintf(x.name, sizeof(x.name), "%s", name);
		rc = xintent_put(&o, &x);
	}
	rc = op_end(&o, rc);
	if (rc == 0)
		*id = x.id;
	return rc;
}

int stk_meta_store_xintent_rmdir(struct stk_meta_store *st, const struct stk_cred *cred,
				 uint64_t parent, const char *name, const struct stk_attr *victim,
				 uint64_t *id)
{
	struct stk_meta_xintent x = {.kind = STK_XINTENT_RMDIR, .parent = parent};
	struct inode dir, n;
	struct op o;
	int rc = check_name(name);

	if (rc)
		return rc;
	rc = op_begin(&o, st, cred, 0);
	if (rc)
		return rc;
	rc = dir_get(&o, parent, MAY_X, &dir);
	if (rc == 0)
		rc = child_get(&o, &dir, name, &n);
	if (rc == -EREMOTE)
		rc = n.a.ino == victim->ino ? 0 : -EAGAIN; /* renamed over: look again */
	else if (rc == 0)
		rc = -EAGAIN; /* a folder of this shard now */
	if (rc == 0)
		rc = may(&o, &dir.a, MAY_W | MAY_X);
	if (rc == 0)
		rc = xmark_busy(&o, victim->ino); /* in a move across shards */
	if (rc == 0) {
		/* the sticky rule with the owner its shard told */
		n.a = *victim;
		rc = sticky_ok(&o, &dir, &n);
	}
	if (rc == 0) {
		x.shard = stk_ino_shard(victim->ino);
		x.ino = victim->ino;
		snprintf(x.name, sizeof(x.name), "%s", name);
		rc = xintent_put(&o, &x);
	}
	rc = op_end(&o, rc);
	if (rc == 0)
		*id = x.id;
	return rc;
}

/* An intent goes, and with a rename's the hold on its file (xmark_busy). */
static int xintent_del(struct op *o, const struct stk_meta_xintent *x)
{
	int rc = xdel(o, 'I', x->id);

	if (rc == 0 && (x->kind == STK_XINTENT_RENAME || x->kind == STK_XINTENT_FMOVE)) {
		rc = xdel(o, 'B', x->ino);
		if (rc == -ENOENT)
			rc = 0;
	}
	return rc;
}

int stk_meta_store_xintent_drop(struct stk_meta_store *st, uint64_t id)
{
	static const struct stk_cred root_cred;
	struct stk_meta_xintent x;
	struct op o;
	int rc = op_begin(&o, st, &root_cred, 0);

	if (rc)
		return rc;
	rc = xintent_get(&o, id, &x);
	if (rc == 0)
		rc = xintent_del(&o, &x);
	if (rc == -ENOENT)
		rc = 0;
	return op_end(&o, rc);
}

int stk_meta_store_xlink(struct stk_meta_store *st, const struct stk_cred *cred, uint64_t id,
			 const struct stk_attr *child)
{
	struct stk_meta_xintent x;
	struct inode dir;
	struct op o;
	int rc = op_begin(&o, st, cred, 0);

	if (rc)
		return rc;
	rc = xintent_get(&o, id, &x);
	if (rc == 0 && (x.kind != STK_XINTENT_MKDIR || !S_ISDIR(child->mode) ||
			stk_ino_shard(child->ino) != x.shard))
		rc = -EINVAL;
	if (rc == 0)
		rc = dir_get(&o, x.parent, MAY_X, &dir);
	if (rc == 0)
		rc = name_free(&o, &dir, x.name); /* a name made meanwhile wins */
	if (rc == 0 && dir.a.nlink == UINT32_MAX)
		rc = -EMLINK;
	if (rc == 0) {
		dir.a.nlink++;
		rc = dentry_put(&o, x.parent, x.name, child->ino, S_IFDIR);
	}
	if (rc == 0) {
		touch_dir(&o, &dir);
		rc = inode_put(&o, &dir);
	}
	if (rc == 0)
		rc = xdel(&o, 'I', id);
	return op_end(&o, rc);
}

int stk_meta_store_xunlink(struct stk_meta_store *st, uint64_t id)
{
	static const struct stk_cred root_cred;
	struct stk_meta_xintent x;
	struct inode dir;
	struct dentry d;
	struct op o;
	int rc = op_begin(&o, st, &root_cred, 0);

	if (rc)
		return rc;
	rc = xintent_get(&o, id, &x);
	if (rc == 0 && x.kind != STK_XINTENT_RMDIR)
		rc = -EINVAL;
	if (rc == 0)
		rc = dentry_get(&o, x.parent, x.name, &d);
	if (rc == 0 && d.ino != x.ino)
		rc = -EAGAIN;
	if (rc == 0)
		rc = inode_get(&o, x.parent, &dir);
	if (rc == 0)
		rc = dentry_del(&o, x.parent, x.name);
	if (rc == 0) {
		if (dir.a.nlink > 2)
			dir.a.nlink--;
		touch_dir(&o, &dir);
		rc = inode_put(&o, &dir);
	}
	if (rc == 0)
		rc = xdel(&o, 'I', id);
	return op_end(&o, rc);
}

struct xlist {
	void *v;
	size_t max, n;
	int marks;
};

static int xlist_one(uint64_t v, const MDB_val *val, void *ctx)
{
	struct xlist *l = ctx;
	int rc;

	if (l->n == l->max)
		return 1;
	if (l->marks)
		rc = xmark_decode(v, val, (struct stk_meta_xmark *)l->v + l->n);
	else
		rc = xintent_decode(v, val, (struct stk_meta_xintent *)l->v + l->n);
	if (rc == 0)
		l->n++;
	return rc;
}

int stk_meta_store_xintents(struct stk_meta_store *st, struct stk_meta_xintent *out, size_t max,
			    size_t *n)
{
	static const struct stk_cred root_cred;
	struct xlist l = {.v = out, .max = max};
	struct op o;
	int rc = op_begin(&o, st, &root_cred, 1);

	if (rc)
		return rc;
	rc = xwalk(&o, 'I', xlist_one, &l);
	*n = l.n;
	return op_end(&o, rc);
}

int stk_meta_store_xmarks(struct stk_meta_store *st, struct stk_meta_xmark *out, size_t max,
			  size_t *n)
{
	static const struct stk_cred root_cred;
	struct xlist l = {.v = out, .max = max, .marks = 1};
	struct op o;
	int rc = op_begin(&o, st, &root_cred, 1);

	if (rc)
		return rc;
	rc = xwalk(&o, 'M', xlist_one, &l);
	*n = l.n;
	return op_end(&o, rc);
}

/* ---- fsck: references between shards ---- */

/* The parents of this shard's intents, sorted (what fsck may not touch). */
struct xparents {
	uint64_t *v;
	size_t n, cap;
};

static int xparents_one(uint64_t id, const MDB_val *val, void *ctx)
{
	struct xparents *p = ctx;
	struct stk_meta_xintent x;

	if (xintent_decode(id, val, &x))
		return 0; /* a record that does not decode covers nothing */
	if (p->n == p->cap) {
		size_t cap = p->cap ? 2 * p->cap : 16;
		uint64_t *v = realloc(p->v, cap * sizeof(*v));

		if (!v)
			return -ENOMEM;
		p->v = v;
		p->cap = cap;
	}
	p->v[p->n++] = x.parent;
	return 0;
}

static int xparents_load(struct op *o, struct xparents *p)
{
	memset(p, 0, sizeof(*p));
	return o->st->xshard ? xwalk(o, 'I', xparents_one, p) : 0;
}

static int xparents_has(const struct xparents *p, uint64_t parent)
{
	for (size_t i = 0; i < p->n; i++)
		if (p->v[i] == parent)
			return 1;
	return 0;
}

/* The files this shard's intents and marks are about (fsck may not touch their names). */
static int xcovers_one(uint64_t v, const MDB_val *val, void *ctx, int mark)
{
	struct xparents *p = ctx;
	uint64_t add[2] = {0, 0};

	if (mark) {
		struct stk_meta_xmark m;

		if (xmark_decode(v, val, &m))
			return 0;
		add[0] = m.ino;
		add[1] = m.kind == STK_XMARK_RENAME ? m.old_ino : 0;
	} else {
		struct stk_meta_xintent x;

		if (xintent_decode(v, val, &x))
			return 0;
		add[0] = x.ino;
	}
	for (int i = 0; i < 2; i++) {
		if (!add[i])
			continue;
		if (p->n == p->cap) {
			size_t cap = p->cap ? 2 * p->cap : 16;
			uint64_t *nv = realloc(p->v, cap * sizeof(*nv));

			if (!nv)
				return -ENOMEM;
			p->v = nv;
			p->cap = cap;
		}
		p->v[p->n++] = add[i];
	}
	return 0;
}

static int xcovers_intent(uint64_t v, const MDB_val *val, void *ctx)
{
	return xcovers_one(v, val, ctx, 0);
}

static int xcovers_mark(uint64_t v, const MDB_val *val, void *ctx)
{
	return xcovers_one(v, val, ctx, 1);
}

static int xcovers_load(struct op *o, struct xparents *p)
{
	int rc;

	memset(p, 0, sizeof(*p));
	if (!o->st->xshard)
		return 0;
	rc = xwalk(o, 'I', xcovers_intent, p);
	return rc ? rc : xwalk(o, 'M', xcovers_mark, p);
}

/*
 * The entries of this shard naming a folder of another shard (files 0), or a
 * file of another shard (files 1: covered STK_FSCK_XCOVERED when an intent or a
 * mark of this shard is about the file, STK_FSCK_XHAS_R when this shard's 'R'
 * record of it names its home).
 */
static int fsck_xlist(struct stk_meta_store *st, const struct stk_meta_xref *after,
		      struct stk_meta_xref *out, size_t max, size_t *n, int *done, int files)
{
	static const struct stk_cred root_cred;
	uint8_t k[DENTRY_KEY_MAX] = {0};
	MDB_val key = {16, k}, val;
	MDB_cursor *cur = NULL;
	struct xparents xp = {0};
	struct op o;
	int rc, mrc;

	*n = 0;
	*done = 1;
	if (after) {
		size_t len = strnlen(after->name, STK_NAME_MAX);

		be64_put(k, after->parent);
		be64_put(k + 8, after->hash);
		memcpy(k + 16, after->name, len);
		key.mv_size = 16 + len;
	}
	rc = op_begin(&o, st, &root_cred, 1);
	if (rc)
		return rc;
	rc = files ? xcovers_load(&o, &xp) : xparents_load(&o, &xp);
	if (rc == 0)
		rc = lmdb_err(mdb_cursor_open(o.txn, st->dentries, &cur), "open cursor");
	mrc = rc ? MDB_NOTFOUND : mdb_cursor_get(cur, &key, &val, MDB_SET_RANGE);
	/* the page starts after the last entry of the one before */
	if (mrc == 0 && after && key.mv_size == 16 + strnlen(after->name, STK_NAME_MAX) &&
	    be64_get(key.mv_data) == after->parent &&
	    be64_get((const uint8_t *)key.mv_data + 8) == after->hash &&
	    memcmp((const uint8_t *)key.mv_data + 16, after->name, key.mv_size - 16) == 0)
		mrc = mdb_cursor_get(cur, &key, &val, MDB_NEXT);
	for (; mrc == 0; mrc = mdb_cursor_get(cur, &key, &val, MDB_NEXT)) {
		struct stk_meta_xref *x;
		struct stk_rbuf r;
		uint64_t ino;
		size_t len;

		if (key.mv_size <= 16 || key.mv_size > DENTRY_KEY_MAX)
			continue;
		stk_rbuf_init(&r, val.mv_data, val.mv_size);
		ino = stk_get_u64(&r);
		/* folders, or files (whose names here their home counts: fsck_xnames) */
		if (!S_ISDIR(stk_get_u32(&r)) != !!files || r.err ||
		    stk_ino_shard(ino) == st->shard)
			continue;
		if (*n == max) {
			*done = 0;
			break;
		}
		x = &out[(*n)++];
		memset(x, 0, sizeof(*x));
		x->ino = ino;
		x->parent = be64_get(key.mv_data);
		x->hash = be64_get((const uint8_t *)key.mv_data + 8);
		x->covered = (uint8_t)xparents_has(&xp, files ? ino : x->parent);
		if (files) {
			uint32_t home;
			uint64_t id;

			rc = xrec_get(&o, 'R', ino, &home, &id);
			if (rc == 0 && home == stk_ino_shard(ino))
				x->covered |= STK_FSCK_XHAS_R;
			if (rc == -ENOENT || rc == -EIO)
				rc = 0; /* none, or one that does not decode: no record */
			if (rc)
				break;
		} else if (!x->covered && st->xshard) {
			/* a folder moved here across shards, its move not settled yet */
			struct stk_meta_xmark m;
			int mrc2 = xmark_get(&o, x->ino, &m);

			x->covered = mrc2 == 0 && m.kind == STK_XMARK_FMOVE;
		}
		len = key.mv_size - 16;
		memcpy(x->name, (const uint8_t *)key.mv_data + 16, len);
		x->name[len] = 0;
	}
	if (rc == 0 && mrc && mrc != MDB_NOTFOUND)
		rc = lmdb_err(mrc, "walk entries");
	if (cur)
		mdb_cursor_close(cur);
	free(xp.v);
	return op_end(&o, rc);
}

int stk_meta_store_fsck_xentries(struct stk_meta_store *st, const struct stk_meta_xref *after,
				 struct stk_meta_xref *out, size_t max, size_t *n, int *done)
{
	return fsck_xlist(st, after, out, max, n, done, 0);
}

int stk_meta_store_fsck_xnames(struct stk_meta_store *st, const struct stk_meta_xref *after,
			       struct stk_meta_xref *out, size_t max, size_t *n, int *done)
{
	return fsck_xlist(st, after, out, max, n, done, 1);
}

int stk_meta_store_fsck_xrecs(struct stk_meta_store *st, uint64_t from, struct stk_meta_xrec *out,
			      size_t max, size_t *n, uint64_t *next, int *done)
{
	static const struct stk_cred root_cred;
	uint8_t k[XKEY_LEN];
	MDB_val key = {sizeof(k), k}, val;
	MDB_cursor *cur = NULL;
	struct xparents xc = {0};
	struct op o;
	int rc, mrc;

	*n = 0;
	*done = 1;
	*next = from;
	rc = op_begin(&o, st, &root_cred, 1);
	if (rc)
		return rc;
	if (!st->xshard)
		return op_end(&o, 0);
	rc = xcovers_load(&o, &xc);
	/* the cursor: the record's kind in the top byte, its inode below */
	xkey(k, (char)(from >> 56), from & ((1ull << 56) - 1));
	if (rc == 0)
		rc = lmdb_err(mdb_cursor_open(o.txn, st->xshard, &cur), "open cursor");
	for (mrc = rc ? MDB_NOTFOUND : mdb_cursor_get(cur, &key, &val, MDB_SET_RANGE); mrc == 0;
	     mrc = mdb_cursor_get(cur, &key, &val, MDB_NEXT)) {
		const uint8_t *kp = key.mv_data;
		struct stk_meta_xrec *x;
		uint64_t ino;

		if (key.mv_size != XKEY_LEN || (kp[0] != 'L' && kp[0] != 'R' && kp[0] != 'X'))
			continue;
		ino = be64_get(kp + 1);
		if (*n == max) {
			*done = 0;
			*next = (uint64_t)kp[0] << 56 | (ino & ((1ull << 56) - 1));
			break;
		}
		x = &out[*n];
		memset(x, 0, sizeof(*x));
		x->kind = (char)kp[0];
		x->ino = ino;
		if (xrec_decode(&val, &x->shard, &x->id))
			continue; /* logged; a record that does not decode says nothing */
		x->covered = (uint8_t)xparents_has(&xc, ino);
		(*n)++;
	}
	if (rc == 0 && mrc && mrc != MDB_NOTFOUND)
		rc = lmdb_err(mrc, "walk cross-shard records");
	if (cur)
		mdb_cursor_close(cur);
	free(xc.v);
	return op_end(&o, rc);
}

/* Whether an intent or a mark of this shard is about file ino: -EBUSY if so. */
static int fsck_xbusy(struct op *o, uint64_t ino)
{
	struct xparents xc;
	int rc = xcovers_load(o, &xc);

	if (rc == 0 && xparents_has(&xc, ino))
		rc = -EBUSY;
	free(xc.v);
	return rc;
}

static int fsck_named(struct op *o, const uint64_t *inos, size_t n, uint8_t *named);

int stk_meta_store_fsck_xunname(struct stk_meta_store *st, uint64_t ino, uint32_t other,
				uint64_t id, struct stk_attr *out)
{
	static const struct stk_cred root_cred;
	int rc, home = stk_ino_shard(ino) == st->shard;
	uint8_t named = 0;
	struct inode n;
	uint32_t h;
	uint64_t rid;
	struct op o;

	memset(out, 0, sizeof(*out));
	if (other == st->shard || other < 1 || other > STK_MAX_SHARDS ||
	    (!home && other != stk_ino_shard(ino)))
		return -EINVAL;
	rc = op_begin(&o, st, &root_cred, 0);
	if (rc)
		return rc;
	rc = fsck_xbusy(&o, ino);
	if (rc == 0)
		rc = xrec_get(&o, home ? 'X' : 'R', ino, &h, &rid);
	if (rc == 0 && (h != other || rid != id))
		rc = -ESTALE;
	else if (rc == -ENOENT)
		rc = -ESTALE;
	if (rc == 0 && !home) {
		/* the holder: a leftover 'R', which goes only while no entry here names it */
		rc = fsck_named(&o, &ino, 1, &named);
		if (rc == 0 && named)
			rc = -EEXIST;
		if (rc == 0)
			rc = xdel(&o, 'R', ino);
		return op_end(&o, rc);
	}
	if (rc == 0)
		rc = xdel(&o, 'X', ino);
	if (rc == 0)
		rc = inode_get(&o, ino, &n);
	if (rc == 0) {
		/* the link that name counted goes: freed or orphaned as an unlink would */
		rc = inode_unref(&o, &n);
		*out = n.a;
	} else if (rc == -ENOENT) {
		rc = 0; /* a record of a file that is gone: only the record goes */
	}
	return op_end(&o, rc);
}

int stk_meta_store_fsck_xrestore(struct stk_meta_store *st, uint64_t ino, uint32_t other,
				 uint64_t id)
{
	static const struct stk_cred root_cred;
	struct inode n;
	uint32_t s;
	uint64_t rid;
	struct op o;
	int rc, home = stk_ino_shard(ino) == st->shard;

	if (other == st->shard || other < 1 || other > STK_MAX_SHARDS ||
	    (!home && other != stk_ino_shard(ino)))
		return -EINVAL;
	rc = op_begin(&o, st, &root_cred, 0);
	if (rc)
		return rc;
	if (!st->xshard)
		rc = -EOPNOTSUPP;
	if (rc == 0)
		rc = fsck_xbusy(&o, ino);
	if (rc == 0 && home) {
		/*
		 * The home: the name on `other` recorded again. Its link count is the
		 * namespace check's, which counts the record as one link (stk_fsck
		 * restores before it checks).
		 */
		rc = xrec_get(&o, 'X', ino, &s, &rid);
		rc = rc == 0 ? -EEXIST : rc == -ENOENT ? 0 : rc;
		if (rc == 0)
			rc = inode_get(&o, ino, &n);
		if (rc == 0 && S_ISDIR(n.a.mode))
			rc = -EISDIR;
		if (rc == 0)
			rc = xrec_put(&o, 'X', ino, other, id);
	} else if (rc == 0) {
		/* the holder: its record of where the file lives */
		rc = xrec_get(&o, 'R', ino, &s, &rid);
		if (rc == -ENOENT)
			rc = xrec_get(&o, 'L', ino, &s, &rid);
		rc = rc == 0 ? -EEXIST : rc == -ENOENT ? 0 : rc;
		if (rc == 0)
			rc = xrec_put(&o, 'R', ino, other, id);
	}
	return op_end(&o, rc);
}

int stk_meta_store_fsck_xdirs(struct stk_meta_store *st, uint64_t from, struct stk_meta_xref *out,
			      size_t max, size_t *n, uint64_t *next, int *done)
{
	static const struct stk_cred root_cred;
	uint8_t k[8];
	MDB_val key = {sizeof(k), k}, val;
	MDB_cursor *cur = NULL;
	struct op o;
	int rc, mrc;

	*n = 0;
	*done = 1;
	*next = from;
	rc = op_begin(&o, st, &root_cred, 1);
	if (rc)
		return rc;
	be64_put(k, from);
	rc = lmdb_err(mdb_cursor_open(o.txn, st->inodes, &cur), "open cursor");
	for (mrc = rc ? MDB_NOTFOUND : mdb_cursor_get(cur, &key, &val, MDB_SET_RANGE); mrc == 0;
	     mrc = mdb_cursor_get(cur, &key, &val, MDB_NEXT)) {
		struct stk_meta_xref *x;
		struct stk_meta_xmark m;
		struct inode in;

		if (key.mv_size != 8 || inode_decode(be64_get(key.mv_data), &val, &in) ||
		    !S_ISDIR(in.a.mode) || in.a.ino == STK_ROOT_INO ||
		    stk_ino_shard(in.parent) == st->shard)
			continue;
		if (*n == max) {
			*done = 0;
			*next = in.a.ino;
			break;
		}
		x = &out[(*n)++];
		memset(x, 0, sizeof(*x));
		x->ino = in.a.ino;
		x->parent = in.parent;
		if (st->xshard) {
			rc = xmark_get(&o, in.a.ino, &m);
			x->covered = rc == 0;
			if (rc == -ENOENT)
				rc = 0;
			if (rc)
				break;
		}
	}
	if (rc == 0 && mrc && mrc != MDB_NOTFOUND)
		rc = lmdb_err(mrc, "walk inodes");
	if (cur)
		mdb_cursor_close(cur);
	return op_end(&o, rc);
}

int stk_meta_store_fsck_xdrop(struct stk_meta_store *st, uint64_t parent, uint64_t ino, char *name)
{
	static const struct stk_cred root_cred;
	uint8_t k[16];
	MDB_val key = {sizeof(k), k}, val;
	MDB_cursor *cur = NULL;
	struct xparents xp = {0};
	struct inode dir;
	struct op o;
	int rc, mrc, found = 0, isdir = 1;
	uint32_t home;
	uint64_t rid;

	name[0] = 0;
	if (stk_ino_shard(ino) == st->shard)
		return -EINVAL;
	rc = op_begin(&o, st, &root_cred, 0);
	if (rc)
		return rc;
	rc = xparents_load(&o, &xp);
	if (rc == 0 && xparents_has(&xp, parent))
		rc = -EBUSY;
	if (rc == 0)
		rc = fsck_xbusy(&o, ino); /* a file renamed or linked here just now */
	if (rc == 0)
		rc = lmdb_err(mdb_cursor_open(o.txn, st->dentries, &cur), "open cursor");
	be64_put(k, parent);
	memset(k + 8, 0, 8);
	for (mrc = rc ? MDB_NOTFOUND : mdb_cursor_get(cur, &key, &val, MDB_SET_RANGE); mrc == 0;
	     mrc = mdb_cursor_get(cur, &key, &val, MDB_NEXT)) {
		struct stk_rbuf r;
		size_t len;

		if (key.mv_size < 8 || be64_get(key.mv_data) != parent)
			break;
		if (key.mv_size <= 16 || key.mv_size > DENTRY_KEY_MAX)
			continue;
		stk_rbuf_init(&r, val.mv_data, val.mv_size);
		if (stk_get_u64(&r) != ino || r.err)
			continue;
		isdir = S_ISDIR(stk_get_u32(&r));
		len = key.mv_size - 16;
		memcpy(name, (const uint8_t *)key.mv_data + 16, len);
		name[len] = 0;
		found = 1;
		break;
	}
	if (cur)
		mdb_cursor_close(cur);
	if (rc == 0 && !found)
		rc = -ENOENT;
	if (rc == 0)
		rc = inode_get(&o, parent, &dir);
	if (rc == 0)
		rc = dentry_del(&o, parent, name);
	if (rc == 0 && !isdir) {
		/* a file of another shard: its record here goes with its name */
		rc = xrec_get(&o, 'R', ino, &home, &rid);
		rc = rc == 0 ? xdel(&o, 'R', ino) : rc == -ENOENT ? 0 : rc;
	}
	if (rc == 0) {
		if (dir.a.nlink > 2 && isdir)
			dir.a.nlink--;
		touch_dir(&o, &dir);
		rc = inode_put(&o, &dir);
	}
	free(xp.v);
	return op_end(&o, rc);
}

int stk_meta_store_fsck_xparent(struct stk_meta_store *st, uint64_t ino, uint64_t seen,
				uint64_t parent)
{
	static const struct stk_cred root_cred;
	struct stk_meta_xmark m;
	struct inode n;
	struct op o;
	int rc;

	if (stk_ino_shard(ino) != st->shard || ino == STK_ROOT_INO || !parent)
		return -EINVAL;
	rc = op_begin(&o, st, &root_cred, 0);
	if (rc)
		return rc;
	rc = inode_get(&o, ino, &n);
	if (rc == 0 && !S_ISDIR(n.a.mode))
		rc = -ENOTDIR;
	if (rc == 0 && st->xshard) {
		/* a mkdir, rmdir or move of it in flight: the protocol's, not fsck's */
		rc = xmark_get(&o, ino, &m);
		rc = rc == 0 ? -EBUSY : rc == -ENOENT ? xmark_busy(&o, ino) : rc;
	}
	if (rc == 0 && n.parent != seen)
		rc = -ESTALE;
	if (rc == 0 && n.parent != parent) {
		n.parent = parent;
		rc = inode_put(&o, &n);
	}
	return op_end(&o, rc);
}

int stk_meta_store_fsck_adopt(struct stk_meta_store *st, uint64_t ino, uint64_t seen,
			      uint64_t *lf_ino, char *name)
{
	static const struct stk_cred root_cred;
	struct stk_meta_xmark m;
	struct inode lf, n;
	struct dentry d;
	struct op o;
	int rc;

	name[0] = 0;
	*lf_ino = 0;
	if (st->shard != 1)
		return -EXDEV;
	rc = op_begin(&o, st, &root_cred, 0);
	if (rc)
		return rc;
	rc = lostfound_get(&o, 1, &lf);
	if (rc || ino == 0)
		goto out;
	*lf_ino = lf.a.ino;
	lostfound_name(ino, name, STK_NAME_MAX + 1);
	/* asked again after a reply was lost: done already */
	if (dentry_get(&o, lf.a.ino, name, &d) == 0 && d.ino == ino)
		goto out;
	if (stk_ino_shard(ino) == st->shard) {
		/* a folder here that no name reaches */
		rc = inode_get(&o, ino, &n);
		if (rc == 0 && ino == STK_ROOT_INO)
			rc = -EINVAL;
		if (rc == 0 && !S_ISDIR(n.a.mode))
			rc = -ENOTDIR;
		if (rc == 0 && st->xshard) {
			rc = xmark_get(&o, ino, &m);
			rc = rc == 0 ? -EBUSY : rc == -ENOENT ? 0 : rc;
		}
		if (rc == 0 && n.parent != seen)
			rc = -ESTALE;
		if (rc == 0)
			rc = lostfound_adopt(&o, &n, lf_ino, name);
		goto out;
	}
	/*
	 * A folder of another shard, whose parent pointer that shard has set to
	 * lost+found already (stk_meta_store_fsck_xparent): only the entry is here.
	 */
	rc = name_free(&o, &lf, name);
	if (rc == 0 && lf.a.nlink == UINT32_MAX)
		rc = -EMLINK;
	if (rc == 0) {
		lf.a.nlink++;
		rc = dentry_put(&o, lf.a.ino, name, ino, S_IFDIR);
	}
	if (rc == 0) {
		touch_dir(&o, &lf);
		rc = inode_put(&o, &lf);
	}
out:
	if (rc == 0 && !*lf_ino)
		*lf_ino = lf.a.ino;
	return op_end(&o, rc);
}

static int u64_cmp(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return (x > y) - (x < y);
}

/* Sets named[i] for each of inos (sorted, n) that an entry of this shard names. */
static int fsck_named(struct op *o, const uint64_t *inos, size_t n, uint8_t *named)
{
	MDB_cursor *cur = NULL;
	MDB_val key, val;
	int rc, mrc;

	rc = lmdb_err(mdb_cursor_open(o->txn, o->st->dentries, &cur), "open cursor");
	for (mrc = rc ? MDB_NOTFOUND : mdb_cursor_get(cur, &key, &val, MDB_FIRST); mrc == 0;
	     mrc = mdb_cursor_get(cur, &key, &val, MDB_NEXT)) {
		struct stk_rbuf r;
		uint64_t ino;
		const uint64_t *hit;

		if (key.mv_size <= 16 || key.mv_size > DENTRY_KEY_MAX)
			continue;
		stk_rbuf_init(&r, val.mv_data, val.mv_size);
		ino = stk_get_u64(&r);
		hit = r.err ? NULL : bsearch(&ino, inos, n, sizeof(*inos), u64_cmp);
		if (hit)
			named[hit - inos] = 1;
	}
	if (rc == 0 && mrc != MDB_NOTFOUND)
		rc = lmdb_err(mrc, "walk entries");
	if (cur)
		mdb_cursor_close(cur);
	return rc;
}

int stk_meta_store_fsck_gather(struct stk_meta_store *st, uint64_t lf, uint64_t *inos, size_t n,
			       uint8_t *done, uint64_t *holder)
{
	static const struct stk_cred root_cred;
	struct inode h = {0}, n0 = {0}, f;
	uint8_t *named = NULL;
	struct op o;
	int rc;

	*holder = 0;
	if (st->shard == 1 || stk_ino_shard(lf) == st->shard || !lf)
		return -EINVAL;
	if (n == 0)
		return 0;
	qsort(inos, n, sizeof(*inos), u64_cmp);
	memset(done, 0, n);
	named = calloc(n, 1);
	if (!named)
		return -ENOMEM;
	rc = op_begin(&o, st, &root_cred, 0);
	if (rc) {
		free(named);
		return rc;
	}
	/* only what is still unreached now, in this transaction */
	rc = fsck_named(&o, inos, n, named);
	for (size_t i = 0; rc == 0 && i < n; i++) {
		uint8_t k[ORPHAN_KEY_LEN];
		MDB_val key = {sizeof(k), k}, val;
		char name[STK_NAME_MAX + 1];
		int open;

		if (named[i] || (i && inos[i] == inos[i - 1]) ||
		    stk_ino_shard(inos[i]) != st->shard)
			continue;
		rc = inode_get(&o, inos[i], &f);
		if (rc == -ENOENT) {
			rc = 0;
			continue;
		}
		if (rc)
			break;
		orphan_key(k, inos[i]);
		open = mdb_get(o.txn, st->sys, &key, &val) == 0;
		if (S_ISDIR(f.a.mode) || open)
			continue; /* a folder goes alone (its parent pointer); an open file waits */
		if (!h.a.ino) {
			n0.a.ino = lf;
			rc = inode_new(&o, &n0, S_IFDIR | 0700, 0, &h);
			if (rc)
				break;
			h.a.nlink = 2;
			h.a.size = DIR_SIZE;
			h.a.blocks = blocks_of(DIR_SIZE);
			h.parent = lf;
		}
		lostfound_name(f.a.ino, name, sizeof(name));
		f.a.nlink = 1;
		f.parent = h.a.ino;
		rc = inode_put(&o, &f);
		if (rc == 0)
			rc = dentry_put(&o, h.a.ino, name, f.a.ino, f.a.mode);
		done[i] = rc == 0;
	}
	if (rc == 0 && h.a.ino) {
		touch_dir(&o, &h);
		rc = inode_put(&o, &h);
	}
	rc = op_end(&o, rc);
	if (rc == 0)
		*holder = h.a.ino;
	else
		memset(done, 0, n);
	free(named);
	return rc;
}

int stk_meta_store_xquery(struct stk_meta_store *st, uint64_t id, uint64_t parent,
			  const char *name, uint64_t ino, int *state)
{
	static const struct stk_cred root_cred;
	struct stk_meta_xintent x;
	struct dentry d;
	struct op o;
	int rc = op_begin(&o, st, &root_cred, 1);

	if (rc)
		return rc;
	rc = xintent_get(&o, id, &x);
	if (rc == 0) {
		*state = STK_XSTATE_INTENT;
	} else if (rc == -ENOENT) {
		rc = check_name(name) ?: dentry_get(&o, parent, name, &d);
		*state = rc == 0 && d.ino == ino ? STK_XSTATE_NAMED : STK_XSTATE_UNNAMED;
		if (rc == -ENOENT || rc == -EINVAL || rc == -ENAMETOOLONG)
			rc = 0;
		if (rc == 0 && *state == STK_XSTATE_UNNAMED) {
			/* renamed within its folder since (rename_remote_here): any name counts */
			struct ino_vec kids = {0};

			rc = dir_children(&o, parent, &kids);
			if (rc == 0 && vec_has(&kids, ino))
				*state = STK_XSTATE_NAMED;
			free(kids.v);
		}
	}
	return op_end(&o, rc);
}

struct xfind {
	uint32_t from;
	uint64_t intent;
	struct stk_meta_xmark m;
	int found;
};

static int xfind_one(uint64_t v, const MDB_val *val, void *ctx)
{
	struct xfind *f = ctx;
	int rc = xmark_decode(v, val, &f->m);

	if (rc)
		return rc;
	if (f->m.from == f->from && f->m.intent == f->intent) {
		f->found = 1;
		return 1;
	}
	return 0;
}

int stk_meta_store_xmark_find(struct stk_meta_store *st, uint32_t from, uint64_t intent,
			      struct stk_meta_xmark *out)
{
	static const struct stk_cred root_cred;
	struct xfind f = {.from = from, .intent = intent};
	struct op o;
	int rc = op_begin(&o, st, &root_cred, 1);

	if (rc)
		return rc;
	rc = st->xshard ? xwalk(&o, 'M', xfind_one, &f) : 0;
	if (rc == 0 && !f.found)
		rc = -ENOENT;
	if (rc == 0)
		*out = f.m;
	return op_end(&o, rc);
}

int stk_meta_store_xmkdir(struct stk_meta_store *st, uint32_t from, uint64_t intent,
			  uint64_t parent, const char *name, uint32_t mode, uint32_t uid,
			  uint32_t gid, struct stk_attr *out)
{
	static const struct stk_cred root_cred;
	struct xfind f = {.from = from, .intent = intent};
	struct stk_meta_xmark m = {.kind = STK_XMARK_PENDING, .from = from, .intent = intent,
				   .parent = parent};
	struct inode n;
	struct op o;
	int rc = check_name(name);

	if (rc)
		return rc;
	if (from < 1 || from > STK_MAX_SHARDS || from == st->shard || !intent ||
	    stk_ino_shard(parent) != from)
		return -EINVAL;
	rc = op_begin(&o, st, &root_cred, 0);
	if (rc)
		return rc;
	rc = xwalk(&o, 'M', xfind_one, &f);
	if (rc == 0 && f.found) { /* asked again (a retry): the folder made then */
		rc = inode_get(&o, f.m.ino, &n);
		goto out;
	}
	memset(&n, 0, sizeof(n));
	if (rc == 0)
		rc = ino_alloc(&o, &n.a.ino);
	if (rc == 0) {
		n.a.mode = S_IFDIR | (mode & 07777);
		n.a.uid = uid;
		n.a.gid = gid;
		n.a.nlink = 2;
		n.a.size = DIR_SIZE;
		n.a.blocks = blocks_of(DIR_SIZE);
		n.parent = parent;
		times_now(&o, &n.a.atime_sec, &n.a.atime_nsec);
		times_now(&o, &n.a.mtime_sec, &n.a.mtime_nsec);
		set_ctime(&o, &n.a);
		rc = inode_put(&o, &n);
	}
	if (rc == 0) {
		m.ino = n.a.ino;
		snprintf(m.name, sizeof(m.name), "%s", name);
		rc = xmark_put(&o, &m);
	}
out:
	rc = op_end(&o, rc);
	if (rc == 0)
		*out = n.a;
	return rc;
}

int stk_meta_store_xdying(struct stk_meta_store *st, uint32_t from, uint64_t intent,
			  uint64_t ino, const char *name)
{
	static const struct stk_cred root_cred;
	struct stk_meta_xmark m;
	struct inode n;
	struct op o;
	int rc = check_name(name);

	if (rc)
		return rc;
	if (from < 1 || from > STK_MAX_SHARDS || from == st->shard || !intent)
		return -EINVAL;
	rc = op_begin(&o, st, &root_cred, 0);
	if (rc)
		return rc;
	rc = inode_get(&o, ino, &n);
	if (rc == 0 && !S_ISDIR(n.a.mode))
		rc = -ENOTDIR;
	if (rc == 0 && stk_ino_shard(n.parent) != from)
		rc = -EINVAL;
	if (rc == 0) {
		rc = xmark_get(&o, ino, &m);
		if (rc == 0) /* the same removal asked again: done; anything else: busy */
			rc = m.kind == STK_XMARK_DYING && m.from == from && m.intent == intent
				 ? 1
				 : -EBUSY;
		else if (rc == -ENOENT)
			rc = 0;
	}
	if (rc == 0) {
		rc = dir_is_empty(&o, ino);
		rc = rc == 1 ? 0 : rc == 0 ? -ENOTEMPTY : rc;
	}
	if (rc == 0) {
		m = (struct stk_meta_xmark){.ino = ino, .kind = STK_XMARK_DYING, .from = from,
					    .intent = intent, .parent = n.parent};
		snprintf(m.name, sizeof(m.name), "%s", name);
		rc = xmark_put(&o, &m);
	}
	return op_end(&o, rc == 1 ? 0 : rc);
}

static int xsettle_rename(struct op *o, const struct stk_meta_xmark *m, int done);
static int xsettle_link(struct op *o, const struct stk_meta_xmark *m, int done);
static int xsettle_fmove(struct op *o, const struct stk_meta_xmark *m, int done);

int stk_meta_store_xsettle(struct stk_meta_store *st, uint32_t from, uint64_t intent, int done)
{
	static const struct stk_cred root_cred;
	struct xfind f = {.from = from, .intent = intent};
	struct inode n;
	struct op o;
	int rc, drop;

	rc = op_begin(&o, st, &root_cred, 0);
	if (rc)
		return rc;
	rc = xwalk(&o, 'M', xfind_one, &f);
	if (rc || !f.found)
		return op_end(&o, rc); /* settled already, or never made: nothing to do */
	if (f.m.kind == STK_XMARK_RENAME)
		return op_end(&o, xsettle_rename(&o, &f.m, done));
	if (f.m.kind == STK_XMARK_LINK)
		return op_end(&o, xsettle_link(&o, &f.m, done));
	if (f.m.kind == STK_XMARK_FMOVE || f.m.kind == STK_XMARK_FPTR)
		return op_end(&o, xsettle_fmove(&o, &f.m, done));
	/* made and not named, or named no more: the inode goes */
	drop = f.m.kind == STK_XMARK_PENDING ? !done : done;
	rc = xdel(&o, 'M', f.m.ino);
	if (rc == 0 && drop) {
		rc = inode_get(&o, f.m.ino, &n);
		if (rc == 0 && S_ISDIR(n.a.mode)) {
			rc = dir_is_empty(&o, n.a.ino);
			rc = rc == 1 ? inode_del(&o, &n) : rc == 0 ? -ENOTEMPTY : rc;
		}
		if (rc == -ENOENT)
			rc = 0;
	}
	return op_end(&o, rc);
}

/* ---- files renamed across shards (store.h; the protocol is meta/xshard.c's) ---- */

int stk_meta_store_xintent_rename(struct stk_meta_store *st, const struct stk_cred *cred,
				  uint64_t src_parent, const char *src_name, uint32_t shard,
				  uint32_t flags, struct stk_attr *moved, uint64_t *id)
{
	struct stk_meta_xintent x = {.kind = STK_XINTENT_RENAME, .shard = shard,
				     .parent = src_parent};
	struct inode dir, n;
	uint32_t other;
	uint64_t rid;
	struct op o;
	int rc = check_name(src_name);

	if (rc)
		return rc;
	if (shard < 1 || shard > STK_MAX_SHARDS || shard == st->shard)
		return -EINVAL;
	if (flags & STK_RENAME_EXCHANGE)
		return -EXDEV;
	rc = op_begin(&o, st, cred, 0);
	if (rc)
		return rc;
	rc = victim_get(&o, src_parent, src_name, &dir, &n);
	if (rc == -EREMOTE && !S_ISDIR(n.a.mode)) {
		/* a name here of a file of another shard: it may go back home only */
		rc = unlink_remote_check(&o, &dir, &n);
		if (rc == 0 && stk_ino_shard(n.a.ino) != shard)
			rc = -EXDEV;
		if (rc == 0)
			rc = xrec_get(&o, 'R', n.a.ino, &other, &rid);
		if (rc == -ENOENT)
			rc = -EIO; /* a name without its record: fsck's to report */
	} else if (rc == -EREMOTE || (rc == 0 && S_ISDIR(n.a.mode))) {
		rc = -EXDEV; /* folders across shards: not built */
	} else if (rc == 0) {
		rc = xrec_get(&o, 'X', n.a.ino, &other, &rid);
		/* one name off its home at most */
		rc = rc == 0 ? -EXDEV : rc == -ENOENT ? 0 : rc;
	}
	if (rc == 0)
		rc = xmark_busy(&o, n.a.ino);
	if (rc == 0) {
		x.ino = n.a.ino;
		snprintf(x.name, sizeof(x.name), "%s", src_name);
		rc = xintent_put(&o, &x);
	}
	if (rc == 0) /* nothing else moves, unlinks or replaces it until the intent goes */
		rc = xrec_put(&o, 'B', x.ino, shard, x.id);
	rc = op_end(&o, rc);
	if (rc == 0) {
		*moved = n.a;
		*id = x.id;
	}
	return rc;
}

int stk_meta_store_xrename_in(struct stk_meta_store *st, uint32_t from, uint64_t intent,
			      uint64_t ino, uint32_t type, uint64_t parent, const char *name,
			      uint32_t uid, uint32_t gid, int noreplace, struct stk_attr *old)
{
	const struct stk_cred cred = {.uid = uid, .gid = gid};
	struct stk_meta_xmark m = {.ino = ino, .kind = STK_XMARK_RENAME, .from = from,
				   .intent = intent, .parent = parent};
	unsigned home = stk_ino_shard(ino);
	struct inode dir, n, victim;
	uint32_t other;
	uint64_t rid;
	struct op o;
	int rc = check_name(name);

	memset(old, 0, sizeof(*old));
	if (rc)
		return rc;
	if (from < 1 || from > STK_MAX_SHARDS || from == st->shard || !intent || S_ISDIR(type) ||
	    !(type & S_IFMT) || (home != st->shard && home != from))
		return -EINVAL;
	rc = op_begin(&o, st, &cred, 0);
	if (rc)
		return rc;
	rc = xmark_get(&o, ino, &m);
	if (rc == 0) { /* asked again (a retry): done then; another's: busy */
		rc = m.kind == STK_XMARK_RENAME && m.from == from && m.intent == intent ? 1
											: -EBUSY;
		if (rc == 1) {
			old->ino = m.old_ino;
			old->mode = m.old_type;
		}
		goto out;
	}
	if (rc != -ENOENT)
		goto out;
	m = (struct stk_meta_xmark){.ino = ino, .kind = STK_XMARK_RENAME, .from = from,
				    .intent = intent, .parent = parent};
	if (home == st->shard) {
		/* back home: the file is here and no name of it is anywhere else but S's */
		rc = inode_get_named(&o, ino, &n);
		if (rc == 0 && S_ISDIR(n.a.mode))
			rc = -EINVAL;
		if (rc == 0) {
			rc = xrec_get(&o, 'X', ino, &other, &rid);
			rc = rc == 0 && other == from ? 0 : rc == 0 || rc == -ENOENT ? -EIO : rc;
		}
	} else {
		/* its one name off home is S's: none here (a record, a release) */
		rc = xrec_get(&o, 'R', ino, &other, &rid);
		if (rc == -ENOENT)
			rc = xrec_get(&o, 'L', ino, &other, &rid);
		rc = rc == 0 ? -EBUSY : rc == -ENOENT ? 0 : rc;
	}
	if (rc == 0)
		rc = dir_get(&o, parent, MAY_W | MAY_X, &dir);
	if (rc == 0)
		rc = xmark_dying(&o, parent);
	if (rc)
		goto out;
	rc = child_get(&o, &dir, name, &victim);
	if (rc == 0 || rc == -EREMOTE) {
		int remote = rc == -EREMOTE;

		if (noreplace)
			rc = -EEXIST;
		else if (S_ISDIR(victim.a.mode))
			rc = -EISDIR;
		else if (victim.a.ino == ino)
			rc = -EALREADY; /* two names of one file: rename does nothing */
		else if (remote)
			rc = (dir.a.mode & S_ISVTX) && uid && uid != dir.a.uid ? -EPERM : 0;
		else
			rc = sticky_ok(&o, &dir, &victim);
		if (rc == 0)
			rc = xmark_busy(&o, victim.a.ino);
		if (rc == 0 && remote) {
			rc = xrec_get(&o, 'R', victim.a.ino, &other, &rid);
			if (rc == -ENOENT)
				rc = -EIO;
		}
		if (rc == 0) {
			m.old_ino = victim.a.ino;
			m.old_type = victim.a.mode & S_IFMT;
		}
	} else if (rc == -ENOENT) {
		rc = 0;
	}
	if (rc == 0)
		rc = dentry_put(&o, parent, name, ino, type);
	if (rc == 0) {
		touch_dir(&o, &dir);
		rc = inode_put(&o, &dir);
	}
	if (rc == 0) {
		snprintf(m.name, sizeof(m.name), "%s", name);
		rc = xmark_put(&o, &m);
	}
	if (rc == 0) {
		old->ino = m.old_ino;
		old->mode = m.old_type;
	}
out:
	return op_end(&o, rc == 1 ? 0 : rc);
}

int stk_meta_store_xrename_commit(struct stk_meta_store *st, uint64_t id, uint64_t dst_parent)
{
	static const struct stk_cred root_cred;
	struct stk_meta_xintent x;
	struct inode dir, n;
	struct dentry d;
	struct op o;
	int rc = op_begin(&o, st, &root_cred, 0);

	if (rc)
		return rc;
	rc = xintent_get(&o, id, &x);
	if (rc == 0 && x.kind != STK_XINTENT_RENAME)
		rc = -EINVAL;
	if (rc == 0)
		rc = dentry_get(&o, x.parent, x.name, &d);
	if (rc == 0 && d.ino != x.ino)
		rc = -EAGAIN;
	if (rc == 0)
		rc = inode_get(&o, x.parent, &dir);
	if (rc == 0)
		rc = dentry_del(&o, x.parent, x.name);
	if (rc == 0 && stk_ino_shard(x.ino) == st->shard) {
		/* leaving home: shard x.shard holds its name now */
		rc = xrec_put(&o, 'X', x.ino, x.shard, id);
		if (rc == 0)
			rc = inode_get(&o, x.ino, &n);
		if (rc == 0) {
			n.parent = dst_parent;
			set_ctime(&o, &n.a);
			rc = inode_put(&o, &n);
		}
	} else if (rc == 0) {
		rc = xdel(&o, 'R', x.ino); /* going home: no name of it here now */
	}
	if (rc == 0) {
		touch_dir(&o, &dir);
		rc = inode_put(&o, &dir);
	}
	if (rc == 0)
		rc = xintent_del(&o, &x);
	return op_end(&o, rc);
}

int stk_meta_store_xquery_rename(struct stk_meta_store *st, uint64_t id, uint64_t ino, int *state)
{
	static const struct stk_cred root_cred;
	struct stk_meta_xintent x;
	uint32_t other;
	uint64_t rid;
	struct op o;
	int rc = op_begin(&o, st, &root_cred, 1);

	if (rc)
		return rc;
	rc = xintent_get(&o, id, &x);
	if (rc == 0) {
		*state = STK_XSTATE_INTENT;
	} else if (rc == -ENOENT && stk_ino_shard(ino) == st->shard) {
		/* left home: committed when this shard's record of its name is the intent's */
		rc = xrec_get(&o, 'X', ino, &other, &rid);
		*state = rc == 0 && rid == id ? STK_XSTATE_MOVED : STK_XSTATE_STAYED;
		rc = rc == -ENOENT ? 0 : rc;
	} else if (rc == -ENOENT) {
		/* went home: committed when this shard's record of it went (step 3) */
		rc = xrec_get(&o, 'R', ino, &other, &rid);
		*state = rc == -ENOENT ? STK_XSTATE_MOVED : STK_XSTATE_STAYED;
		rc = rc == -ENOENT ? 0 : rc;
	}
	return op_end(&o, rc);
}

/*
 * D, step 4 or an abort of a rename's mark m: done, the mark goes, the records
 * take the name's new place and what the entry replaced loses that name; not
 * done, the entry names what it named before, if it still names the file.
 */
static int xsettle_rename(struct op *o, const struct stk_meta_xmark *m, int done)
{
	struct inode dir, n;
	struct dentry d;
	uint32_t other;
	uint64_t rid;
	int rc = xdel(o, 'M', m->ino);

	if (rc == 0 && !done) {
		rc = dentry_get(o, m->parent, m->name, &d);
		if (rc == 0 && d.ino == m->ino) {
			rc = inode_get(o, m->parent, &dir);
			if (rc == 0)
				rc = m->old_ino ? dentry_put(o, m->parent, m->name, m->old_ino,
							     m->old_type)
						: dentry_del(o, m->parent, m->name);
			if (rc == 0) {
				touch_dir(o, &dir);
				rc = inode_put(o, &dir);
			}
			return rc;
		}
		/* renamed since (not possible while marked) or gone: what it replaced goes */
		if (rc && rc != -ENOENT)
			return rc;
		done = 1;
		stk_warn("meta store: file %llu in a rename across shards not named as "
			 "recorded any more",
			 (unsigned long long)m->ino);
	}
	if (rc)
		return rc;
	if (stk_ino_shard(m->ino) == o->st->shard) {
		/* home again: no name of it elsewhere */
		rc = xdel(o, 'X', m->ino);
		if (rc == -ENOENT)
			rc = 0;
		if (rc == 0)
			rc = inode_get(o, m->ino, &n);
		if (rc == 0) {
			n.parent = m->parent;
			set_ctime(o, &n.a);
			rc = inode_put(o, &n);
		}
		if (rc == -ENOENT)
			rc = 0;
	} else if (xrec_get(o, 'R', m->ino, &other, &rid) == -ENOENT) {
		rc = xrec_put(o, 'R', m->ino, m->from, m->intent);
	}
	if (rc || !m->old_ino)
		return rc;
	if (stk_ino_shard(m->old_ino) != o->st->shard)
		return xrelease_start(o, m->old_ino);
	rc = inode_get(o, m->old_ino, &n);
	if (rc == 0)
		rc = inode_unref(o, &n);
	return rc == -ENOENT ? 0 : rc;
}

/*
 * Records of one kind whose value is a shard and an id ('L', 'D'), listed into the
 * caller's array by put: the record's key v, its shard and id, as element i.
 */
typedef void (*xrec_put_fn)(void *out, size_t i, uint64_t v, uint32_t shard, uint64_t id);

struct xrec_list {
	void *out;
	xrec_put_fn put;
	size_t max, n;
};

static int xrec_list_one(uint64_t v, const MDB_val *val, void *ctx)
{
	struct xrec_list *l = ctx;
	uint32_t shard;
	uint64_t id;

	if (l->n == l->max)
		return 1;
	if (xrec_decode(val, &shard, &id))
		return 0; /* reported; skipped */
	l->put(l->out, l->n++, v, shard, id);
	return 0;
}

/* Up to max records of kind into out (put), how many into *n. */
static int xrec_list(struct stk_meta_store *st, char kind, void *out, xrec_put_fn put,
		     size_t max, size_t *n)
{
	static const struct stk_cred root_cred;
	struct xrec_list l = {.out = out, .put = put, .max = max};
	struct op o;
	int rc;

	*n = 0;
	if (!st->xshard)
		return 0;
	rc = op_begin(&o, st, &root_cred, 1);
	if (rc)
		return rc;
	rc = xwalk(&o, kind, xrec_list_one, &l);
	*n = l.n;
	return op_end(&o, rc);
}

/* The record of kind for v goes, if it is there. */
static int xrec_drop(struct stk_meta_store *st, char kind, uint64_t v)
{
	static const struct stk_cred root_cred;
	struct op o;
	int rc = op_begin(&o, st, &root_cred, 0);

	if (rc)
		return rc;
	rc = xdel(&o, kind, v);
	return op_end(&o, rc == -ENOENT ? 0 : rc);
}

static void xrelease_into(void *out, size_t i, uint64_t v, uint32_t shard, uint64_t id)
{
	((struct stk_meta_xrelease *)out)[i] = (struct stk_meta_xrelease){
	    .ino = v, .id = id, .home = shard};
}

int stk_meta_store_xreleases(struct stk_meta_store *st, struct stk_meta_xrelease *out, size_t max,
			     size_t *n)
{
	return xrec_list(st, 'L', out, xrelease_into, max, n);
}

int stk_meta_store_xrelease_done(struct stk_meta_store *st, uint64_t ino)
{
	return xrec_drop(st, 'L', ino);
}

int stk_meta_store_xrelease(struct stk_meta_store *st, uint32_t from, uint64_t ino, uint64_t id,
			    struct stk_attr *out)
{
	static const struct stk_cred root_cred;
	struct inode n;
	uint32_t holder;
	uint64_t rid;
	struct op o;
	int rc;

	memset(out, 0, sizeof(*out));
	if (stk_ino_shard(ino) != st->shard || from == st->shard)
		return -EINVAL;
	rc = op_begin(&o, st, &root_cred, 0);
	if (rc)
		return rc;
	rc = xrec_get(&o, 'X', ino, &holder, &rid);
	if (rc == -ENOENT || (rc == 0 && (holder != from || rid != id))) {
		rc = 1; /* told already */
		goto out;
	}
	if (rc == 0)
		rc = xdel(&o, 'X', ino);
	if (rc == 0)
		rc = inode_get(&o, ino, &n);
	if (rc == 0) {
		rc = inode_unref(&o, &n);
		*out = n.a;
	} else if (rc == -ENOENT) {
		rc = 0;
	}
out:
	return op_end(&o, rc == 1 ? 0 : rc);
}

/* ---- hard links across shards (store.h) ---- */

int stk_meta_store_xintent_link(struct stk_meta_store *st, const struct stk_cred *cred,
				uint64_t ino, uint64_t parent, const char *name, uint64_t *id)
{
	struct stk_meta_xintent x = {.kind = STK_XINTENT_LINK, .shard = stk_ino_shard(ino),
				     .parent = parent, .ino = ino};
	struct inode dir;
	uint32_t other;
	uint64_t rid;
	struct op o;
	int rc = check_name(name);

	if (rc)
		return rc;
	if (x.shard == st->shard || x.shard < 1 || x.shard > STK_MAX_SHARDS)
		return -EINVAL;
	rc = op_begin(&o, st, cred, 0);
	if (rc)
		return rc;
	rc = dir_get(&o, parent, MAY_X, &dir);
	if (rc == 0)
		rc = name_free(&o, &dir, name);
	if (rc == 0)
		rc = may(&o, &dir.a, MAY_W | MAY_X);
	if (rc == 0) {
		/* one name off home at most: none here already, nor one going */
		rc = xrec_get(&o, 'R', ino, &other, &rid);
		if (rc == -ENOENT)
			rc = xrec_get(&o, 'L', ino, &other, &rid);
		rc = rc == 0 ? -EXDEV : rc == -ENOENT ? 0 : rc;
	}
	if (rc == 0) {
		snprintf(x.name, sizeof(x.name), "%s", name);
		rc = xintent_put(&o, &x);
	}
	rc = op_end(&o, rc);
	if (rc == 0)
		*id = x.id;
	return rc;
}

int stk_meta_store_xlink_in(struct stk_meta_store *st, uint32_t from, uint64_t intent,
			    uint64_t ino, uint64_t parent, const char *name, struct stk_attr *out)
{
	static const struct stk_cred root_cred;
	struct stk_meta_xmark m;
	struct inode n;
	uint32_t other;
	uint64_t rid;
	struct op o;
	int rc = check_name(name);

	if (rc)
		return rc;
	if (from < 1 || from > STK_MAX_SHARDS || from == st->shard || !intent ||
	    stk_ino_shard(ino) != st->shard || stk_ino_shard(parent) != from)
		return -EINVAL;
	rc = op_begin(&o, st, &root_cred, 0);
	if (rc)
		return rc;
	rc = xmark_get(&o, ino, &m);
	if (rc == 0) /* asked again (a retry): done then; another's: busy */
		rc = m.kind == STK_XMARK_LINK && m.from == from && m.intent == intent ? 1 : -EBUSY;
	else if (rc == -ENOENT)
		rc = 0;
	if (rc == 0 || rc == 1) {
		int again = rc == 1;

		rc = inode_get(&o, ino, &n);
		if (rc == 0 && again)
			rc = 1;
	}
	if (rc == 0 && S_ISDIR(n.a.mode))
		rc = -EPERM;
	if (rc == 0) {
		rc = xrec_get(&o, 'X', ino, &other, &rid);
		rc = rc == 0 ? -EXDEV : rc == -ENOENT ? 0 : rc;
	}
	if (rc == 0)
		rc = xmark_busy(&o, ino);
	if (rc == 0 && n.a.nlink == UINT32_MAX)
		rc = -EMLINK;
	if (rc == 0) {
		n.a.nlink++;
		set_ctime(&o, &n.a);
		rc = inode_put(&o, &n);
	}
	if (rc == 0)
		rc = xrec_put(&o, 'X', ino, from, intent);
	if (rc == 0) {
		m = (struct stk_meta_xmark){.ino = ino, .kind = STK_XMARK_LINK, .from = from,
					    .intent = intent, .parent = parent};
		snprintf(m.name, sizeof(m.name), "%s", name);
		rc = xmark_put(&o, &m);
	}
	rc = op_end(&o, rc == 1 ? 0 : rc);
	if (rc == 0)
		*out = n.a;
	return rc;
}

int stk_meta_store_xlink_commit(struct stk_meta_store *st, uint64_t id, uint32_t type)
{
	static const struct stk_cred root_cred;
	struct stk_meta_xintent x;
	struct inode dir;
	struct op o;
	int rc = op_begin(&o, st, &root_cred, 0);

	if (rc)
		return rc;
	rc = xintent_get(&o, id, &x);
	if (rc == 0 && (x.kind != STK_XINTENT_LINK || S_ISDIR(type) || !(type & S_IFMT)))
		rc = -EINVAL;
	if (rc == 0)
		rc = inode_get(&o, x.parent, &dir);
	if (rc == 0)
		rc = name_free(&o, &dir, x.name); /* a name made meanwhile wins */
	if (rc == 0)
		rc = dentry_put(&o, x.parent, x.name, x.ino, type);
	if (rc == 0)
		rc = xrec_put(&o, 'R', x.ino, x.shard, id);
	if (rc == 0) {
		touch_dir(&o, &dir);
		rc = inode_put(&o, &dir);
	}
	if (rc == 0)
		rc = xintent_del(&o, &x);
	return op_end(&o, rc);
}

int stk_meta_store_xquery_link(struct stk_meta_store *st, uint64_t id, uint64_t ino, int *state)
{
	static const struct stk_cred root_cred;
	struct stk_meta_xintent x;
	uint32_t other;
	uint64_t rid;
	struct op o;
	int rc = op_begin(&o, st, &root_cred, 1);

	if (rc)
		return rc;
	rc = xintent_get(&o, id, &x);
	if (rc == 0) {
		*state = STK_XSTATE_INTENT;
	} else if (rc == -ENOENT) {
		/* committed: this shard's record of the name is the intent's (or a release
		 * of it, the name unlinked since) */
		rc = xrec_get(&o, 'R', ino, &other, &rid);
		if (rc == -ENOENT)
			rc = xrec_get(&o, 'L', ino, &other, &rid);
		*state = rc == 0 && rid == id ? STK_XSTATE_MOVED : STK_XSTATE_STAYED;
		rc = rc == -ENOENT ? 0 : rc;
	}
	return op_end(&o, rc);
}

/* H, step 4 or an undo of a link's mark: not done, the link and its record go. */
static int xsettle_link(struct op *o, const struct stk_meta_xmark *m, int done)
{
	struct inode n;
	uint32_t holder;
	uint64_t rid;
	int rc = xdel(o, 'M', m->ino);

	if (rc || done)
		return rc;
	rc = xrec_get(o, 'X', m->ino, &holder, &rid);
	if (rc == -ENOENT || (rc == 0 && (holder != m->from || rid != m->intent)))
		return 0; /* released already */
	if (rc == 0)
		rc = xdel(o, 'X', m->ino);
	if (rc == 0)
		rc = inode_get(o, m->ino, &n);
	if (rc == 0)
		rc = inode_unref(o, &n);
	return rc == -ENOENT ? 0 : rc;
}

/* ---- folders moved across shards (store.h; the protocol is meta/xshard.c's) ---- */

/*
 * What dst_name in qd names, for folder F moved there: *victim 0 (nothing), or an
 * empty folder of this shard that F replaces. -EALREADY: it names F already.
 */
static int fmove_victim(struct op *o, const struct inode *qd, const char *name, uint64_t ino,
			int noreplace, uint64_t *victim)
{
	struct stk_meta_xmark m;
	struct inode v;
	int rc = child_get(o, qd, name, &v);

	*victim = 0;
	if (rc == -ENOENT)
		return 0;
	if (rc == 0 || rc == -EREMOTE) {
		if (v.a.ino == ino)
			return -EALREADY;
		if (noreplace)
			return -EEXIST;
		if (!S_ISDIR(v.a.mode))
			return -ENOTDIR;
		if (rc == -EREMOTE)
			return -EXDEV; /* a folder of another shard replaced: not built */
	}
	if (rc)
		return rc;
	rc = dir_is_empty(o, v.a.ino);
	rc = rc == 1 ? 0 : rc == 0 ? -ENOTEMPTY : rc;
	if (rc == 0)
		rc = sticky_ok(o, qd, &v);
	if (rc == 0)
		rc = xmark_busy(o, v.a.ino);
	if (rc == 0 && o->st->xshard) {
		rc = xmark_get(o, v.a.ino, &m);
		rc = rc == 0 ? -EBUSY : rc == -ENOENT ? 0 : rc;
	}
	if (rc == 0)
		*victim = v.a.ino;
	return rc;
}

int stk_meta_store_xintent_fmove(struct stk_meta_store *st, const struct stk_cred *cred,
				 uint64_t src_parent, const char *src_name, uint64_t dst_parent,
				 const char *dst_name, uint32_t flags, struct stk_attr *moved,
				 uint64_t *id)
{
	struct stk_meta_xintent x = {.kind = STK_XINTENT_FMOVE,
				     .shard = stk_ino_shard(dst_parent),
				     .parent = src_parent};
	struct inode dir, n, qd;
	uint64_t victim;
	struct op o;
	int rc = check_name(src_name) ?: check_name(dst_name);

	if (rc)
		return rc;
	if (flags & STK_RENAME_EXCHANGE)
		return -EXDEV;
	if (x.shard < 1 || x.shard > STK_MAX_SHARDS || !st->xshard)
		return -EINVAL;
	rc = op_begin(&o, st, cred, 0);
	if (rc)
		return rc;
	rc = victim_get(&o, src_parent, src_name, &dir, &n);
	if (rc == -EREMOTE)
		rc = S_ISDIR(n.a.mode) ? unlink_remote_check(&o, &dir, &n) : -EXDEV;
	else if (rc == 0 && !S_ISDIR(n.a.mode))
		rc = -EXDEV; /* a file: its own path */
	else if (rc == 0 && src_parent != dst_parent)
		rc = may(&o, &n.a, MAY_W); /* its ".." changes */
	if (rc == 0)
		rc = xmark_busy(&o, n.a.ino);
	if (rc == 0 && n.a.ino == dst_parent)
		rc = -EINVAL;
	/* quotas do not follow a folder across shards: out of one, EXDEV (mv copies,
	 * and the copy counts) */
	if (rc == 0 && dir.a.qid && src_parent != dst_parent)
		rc = -EXDEV;
	if (rc == 0 && x.shard == st->shard) {
		rc = dir_get(&o, dst_parent, MAY_W | MAY_X, &qd);
		if (rc == 0 && qd.a.qid && src_parent != dst_parent)
			rc = -EXDEV; /* nor into one */
		if (rc == 0)
			rc = xmark_dying(&o, dst_parent);
		if (rc == 0)
			rc = fmove_victim(&o, &qd, dst_name, n.a.ino, flags & STK_RENAME_NOREPLACE,
					  &victim);
	}
	if (rc == 0) {
		x.ino = n.a.ino;
		snprintf(x.name, sizeof(x.name), "%s", src_name);
		rc = xintent_put(&o, &x);
	}
	if (rc == 0) /* nothing else moves or removes it until the intent goes */
		rc = xrec_put(&o, 'B', x.ino, x.shard, x.id);
	rc = op_end(&o, rc);
	if (rc == 0) {
		*moved = n.a;
		*id = x.id;
	}
	return rc;
}

int stk_meta_store_xfmove_in(struct stk_meta_store *st, uint32_t from, uint64_t intent,
			     uint64_t ino, uint64_t parent, const char *name, uint32_t uid,
			     uint32_t gid, int noreplace)
{
	const struct stk_cred cred = {.uid = uid, .gid = gid};
	struct stk_meta_xmark m;
	struct inode qd, n;
	uint64_t victim = 0;
	struct op o;
	int rc = check_name(name);

	if (rc)
		return rc;
	if (from < 1 || from > STK_MAX_SHARDS || from == st->shard || !intent ||
	    (intent & STK_XMARK_VICTIM_BIT) || !st->xshard)
		return -EINVAL;
	rc = op_begin(&o, st, &cred, 0);
	if (rc)
		return rc;
	rc = xmark_get(&o, ino, &m);
	if (rc == 0) { /* asked again (a retry): done then; another's: busy */
		rc = m.kind == STK_XMARK_FMOVE && m.from == from && m.intent == intent ? 1 : -EBUSY;
		goto out;
	}
	if (rc != -ENOENT)
		goto out;
	rc = 0;
	if (stk_ino_shard(ino) == st->shard) {
		rc = inode_get_named(&o, ino, &n);
		if (rc == 0 && !S_ISDIR(n.a.mode))
			rc = -EINVAL;
		if (rc == 0)
			rc = xmark_busy(&o, ino);
	}
	if (rc == 0)
		rc = dir_get(&o, parent, MAY_W | MAY_X, &qd);
	if (rc == 0 && qd.a.qid)
		rc = -EXDEV; /* quotas do not follow a folder across shards */
	if (rc == 0)
		rc = xmark_dying(&o, parent);
	if (rc == 0)
		rc = fmove_victim(&o, &qd, name, ino, noreplace, &victim);
	if (rc == -EALREADY)
		rc = -EIO; /* F named here and at A: fsck's to report */
	if (rc)
		goto out;
	rc = dentry_put(&o, parent, name, ino, S_IFDIR);
	if (rc == 0 && victim) {
		/* replaced: its link in Q becomes F's; it takes nothing new until settled */
		m = (struct stk_meta_xmark){.ino = victim, .kind = STK_XMARK_FVICTIM, .from = from,
					    .intent = intent | STK_XMARK_VICTIM_BIT,
					    .parent = parent};
		snprintf(m.name, sizeof(m.name), "%s", name);
		rc = xmark_put(&o, &m);
	} else if (rc == 0) {
		if (qd.a.nlink == UINT32_MAX)
			rc = -EMLINK;
		qd.a.nlink++;
	}
	if (rc == 0) {
		touch_dir(&o, &qd);
		rc = inode_put(&o, &qd);
	}
	if (rc == 0) {
		m = (struct stk_meta_xmark){.ino = ino, .kind = STK_XMARK_FMOVE, .from = from,
					    .intent = intent, .parent = parent, .old_ino = victim,
					    .old_type = victim ? S_IFDIR : 0};
		snprintf(m.name, sizeof(m.name), "%s", name);
		rc = xmark_put(&o, &m);
	}
out:
	return op_end(&o, rc == 1 ? 0 : rc);
}

int stk_meta_store_xfptr(struct stk_meta_store *st, uint32_t from, uint64_t intent, uint64_t ino,
			 uint64_t parent)
{
	static const struct stk_cred root_cred;
	struct stk_meta_xmark m;
	struct inode n;
	struct op o;
	int rc;

	if (from < 1 || from > STK_MAX_SHARDS || from == st->shard || !intent ||
	    (intent & STK_XMARK_VICTIM_BIT) || stk_ino_shard(ino) != st->shard || !st->xshard)
		return -EINVAL;
	rc = op_begin(&o, st, &root_cred, 0);
	if (rc)
		return rc;
	rc = inode_get(&o, ino, &n);
	if (rc == 0 && !S_ISDIR(n.a.mode))
		rc = -ENOTDIR;
	if (rc == 0) {
		rc = xmark_get(&o, ino, &m);
		if (rc == 0) /* asked again (a retry): done then; another's: busy */
			rc = m.kind == STK_XMARK_FPTR && m.from == from && m.intent == intent
				 ? 1
				 : -EBUSY;
		else if (rc == -ENOENT)
			rc = xmark_busy(&o, ino);
	}
	if (rc == 0) {
		m = (struct stk_meta_xmark){.ino = ino, .kind = STK_XMARK_FPTR, .from = from,
					    .intent = intent, .parent = parent};
		rc = xmark_put(&o, &m);
	}
	return op_end(&o, rc == 1 ? 0 : rc);
}

static int xdone_put(struct op *o, uint64_t id, uint32_t shard, uint64_t ino)
{
	return xrec_put(o, 'D', id, shard, ino);
}

int stk_meta_store_xfmove_commit(struct stk_meta_store *st, uint64_t id, uint64_t dst_parent,
				 const char *dst_name, int noreplace)
{
	static const struct stk_cred root_cred;
	struct stk_meta_xintent x;
	struct inode dir, qbuf, *qd = &dir, n, v;
	uint64_t victim = 0;
	struct dentry d;
	struct op o;
	int rc = check_name(dst_name);

	if (rc)
		return rc;
	rc = op_begin(&o, st, &root_cred, 0);
	if (rc)
		return rc;
	rc = xintent_get(&o, id, &x);
	if (rc == 0 && x.kind != STK_XINTENT_FMOVE)
		rc = -EINVAL;
	if (rc == 0)
		rc = dentry_get(&o, x.parent, x.name, &d);
	if (rc == 0 && d.ino != x.ino)
		rc = -EAGAIN;
	if (rc == 0)
		rc = inode_get(&o, x.parent, &dir);
	if (rc == 0 && x.shard == st->shard) {
		/* both names here: the new one written now, replacing as at step 1 */
		if (dst_parent != x.parent) {
			qd = &qbuf;
			rc = inode_get(&o, dst_parent, qd);
		}
		if (rc == 0)
			rc = fmove_victim(&o, qd, dst_name, x.ino, noreplace, &victim);
		if (rc == 0 && victim) {
			rc = inode_get(&o, victim, &v);
			if (rc == 0)
				rc = inode_del(&o, &v);
			if (rc == 0 && qd->a.nlink > 2)
				qd->a.nlink--; /* its ".." */
		}
		if (rc == 0)
			rc = dentry_del(&o, x.parent, x.name);
		if (rc == 0)
			rc = dentry_put(&o, dst_parent, dst_name, x.ino, S_IFDIR);
		if (rc == 0) {
			if (dir.a.nlink > 2)
				dir.a.nlink--;
			if (qd->a.nlink == UINT32_MAX)
				rc = -EMLINK;
			qd->a.nlink++;
		}
	} else if (rc == 0) {
		rc = dentry_del(&o, x.parent, x.name);
		if (rc == 0 && dir.a.nlink > 2)
			dir.a.nlink--;
	}
	if (rc == 0 && stk_ino_shard(x.ino) == st->shard) {
		rc = inode_get(&o, x.ino, &n);
		if (rc == 0) {
			n.parent = dst_parent;
			set_ctime(&o, &n.a);
			rc = inode_put(&o, &n);
		}
	}
	if (rc == 0) {
		touch_dir(&o, &dir);
		rc = inode_put(&o, &dir);
	}
	if (rc == 0 && qd != &dir) {
		touch_dir(&o, qd);
		rc = inode_put(&o, qd);
	}
	if (rc == 0) /* the marks elsewhere are settled from it (xshard.c) */
		rc = xdone_put(&o, id, x.shard, x.ino);
	if (rc == 0)
		rc = xintent_del(&o, &x);
	return op_end(&o, rc);
}

int stk_meta_store_xquery_fmove(struct stk_meta_store *st, uint64_t id, int *state)
{
	static const struct stk_cred root_cred;
	struct stk_meta_xintent x;
	uint32_t shard;
	uint64_t ino;
	struct op o;
	int rc = op_begin(&o, st, &root_cred, 1);

	if (rc)
		return rc;
	rc = xintent_get(&o, id, &x);
	if (rc == 0) {
		*state = STK_XSTATE_INTENT;
	} else if (rc == -ENOENT) {
		/* committed while the done record is there; given up (or settled) else */
		rc = xrec_get(&o, 'D', id, &shard, &ino);
		*state = rc == 0 ? STK_XSTATE_MOVED : STK_XSTATE_STAYED;
		rc = rc == -ENOENT ? 0 : rc;
	}
	return op_end(&o, rc);
}

int stk_meta_store_xheld(struct stk_meta_store *st, uint64_t id)
{
	static const struct stk_cred root_cred;
	struct stk_meta_xintent x;
	uint32_t shard;
	uint64_t ino;
	struct op o;
	int rc = op_begin(&o, st, &root_cred, 1), held;

	if (rc)
		return 1; /* not known: held, to be safe */
	rc = xintent_get(&o, id, &x);
	if (rc == -ENOENT)
		rc = xrec_get(&o, 'D', id, &shard, &ino);
	held = rc != -ENOENT;
	op_end(&o, 0);
	return held;
}

static void xdone_into(void *out, size_t i, uint64_t v, uint32_t shard, uint64_t id)
{
	((struct stk_meta_xdone *)out)[i] = (struct stk_meta_xdone){
	    .id = v, .ino = id, .shard = shard};
}

int stk_meta_store_xdones(struct stk_meta_store *st, struct stk_meta_xdone *out, size_t max,
			  size_t *n)
{
	return xrec_list(st, 'D', out, xdone_into, max, n);
}

int stk_meta_store_xdone_drop(struct stk_meta_store *st, uint64_t id)
{
	return xrec_drop(st, 'D', id);
}

int stk_meta_store_xlock(struct stk_meta_store *st, uint32_t holder, uint64_t id, int take)
{
	static const struct stk_cred root_cred;
	uint32_t h;
	uint64_t hid;
	struct op o;
	int rc;

	if (st->shard != 1 || !st->xshard || holder < 1 || holder > STK_MAX_SHARDS)
		return -EINVAL;
	rc = op_begin(&o, st, &root_cred, 0);
	if (rc)
		return rc;
	rc = xrec_get(&o, 'K', 0, &h, &hid);
	if (rc == 0 && (h != holder || hid != id))
		rc = take ? -EBUSY : 0; /* another's: busy, or not ours to release */
	else if (rc == 0)
		rc = take ? 0 : xdel(&o, 'K', 0);
	else if (rc == -ENOENT)
		rc = take ? xrec_put(&o, 'K', 0, holder, id) : 0;
	return op_end(&o, rc);
}

int stk_meta_store_xlock_get(struct stk_meta_store *st, uint32_t *holder, uint64_t *id)
{
	static const struct stk_cred root_cred;
	struct op o;
	int rc;

	if (!st->xshard)
		return -ENOENT;
	rc = op_begin(&o, st, &root_cred, 1);
	if (rc)
		return rc;
	rc = xrec_get(&o, 'K', 0, holder, id);
	return op_end(&o, rc);
}

int stk_meta_store_xparent(struct stk_meta_store *st, uint64_t ino, uint64_t *parent)
{
	static const struct stk_cred root_cred;
	struct inode n;
	struct op o;
	int rc = op_begin(&o, st, &root_cred, 1);

	if (rc)
		return rc;
	rc = inode_get(&o, ino, &n);
	if (rc == 0 && !S_ISDIR(n.a.mode))
		rc = -ENOTDIR;
	if (rc == 0)
		*parent = n.parent;
	return op_end(&o, rc);
}

/*
 * B's FMOVE or C's FPTR mark settled. Done: F's pointer becomes the mark's parent
 * where F is this shard's, the folder replaced goes. Not done: the new entry goes
 * (what it replaced named again), the link count it took with it.
 */
static int xsettle_fmove(struct op *o, const struct stk_meta_xmark *m, int done)
{
	struct inode dir, n;
	struct dentry d;
	int rc = xdel(o, 'M', m->ino);

	if (rc == 0 && m->old_ino) {
		rc = xdel(o, 'M', m->old_ino);
		if (rc == -ENOENT)
			rc = 0;
	}
	if (rc)
		return rc;
	if (done) {
		if (m->old_ino) {
			rc = inode_get(o, m->old_ino, &n);
			if (rc == 0)
				rc = inode_del(o, &n);
			if (rc == -ENOENT)
				rc = 0;
		}
		if (rc == 0 && stk_ino_shard(m->ino) == o->st->shard) {
			rc = inode_get(o, m->ino, &n);
			if (rc == 0) {
				n.parent = m->parent;
				set_ctime(o, &n.a);
				rc = inode_put(o, &n);
			}
			if (rc == -ENOENT)
				rc = 0;
		}
		return rc;
	}
	if (m->kind != STK_XMARK_FMOVE)
		return 0; /* C's pointer never changed */
	rc = dentry_get(o, m->parent, m->name, &d);
	if (rc == -ENOENT || (rc == 0 && d.ino != m->ino))
		return 0; /* not possible while marked */
	if (rc == 0)
		rc = inode_get(o, m->parent, &dir);
	if (rc)
		return rc;
	if (m->old_ino) {
		rc = dentry_put(o, m->parent, m->name, m->old_ino, S_IFDIR);
	} else {
		rc = dentry_del(o, m->parent, m->name);
		if (dir.a.nlink > 2)
			dir.a.nlink--;
	}
	if (rc == 0) {
		touch_dir(o, &dir);
		rc = inode_put(o, &dir);
	}
	return rc;
}
