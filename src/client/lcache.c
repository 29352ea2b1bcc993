/*
 * The lookup cache and its watch thread (lcache.h says what it promises).
 *
 * Entries sit in a table of sets of LC_WAYS by hash of (folder, name); a new
 * answer takes its own slot, else a stale one, else a "no such name", else the
 * set's next victim. Names of LC_NAME bytes or more, "." and ".." are never
 * cached. A folder this client made (empty, leased) is *complete*: every name in
 * it is in the table, so a name not there does not exist, until anything about
 * the folder is revoked or forgotten. Its names that leave the table (a create in
 * it not kept, a name given up for another entry) go into a small Bloom filter of
 * the folder's: a lookup of a name that may be one of them goes to meta, and past
 * LC_LOST_MAX of them the folder is no longer complete. A name this client creates or
 * removes changes its folder's times and link count too: an attribute generation
 * (agen) of the folder's, bumped then, ends the folder's own entry and nothing else
 * (a bump of its generation would also end its names). One mutex guards the table, the
 * generations and the watch state: each section under it is a few loads and a
 * compare.
 */
#include "lcache.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../common/lease.h"
#include "../common/log.h"
#include "../common/util.h"
#include "../net/net.h"
#include "../proto/wire.h"
#include "behind.h"
#include "client.h"
#include "session.h"

#define LC_SLOTS (1u << 17) /* 28 MiB of entries: tens of thousands of names without overflow */
#define LC_NAME 48
#define LC_GENS (1u << 20) /* 4 MiB: few inodes share a generation */
#define LC_WAYS 8u	   /* entries per set */
#define LC_DIRS 4096u	   /* records of folders whose every name is known here */
#define LC_LOST_BITS 512u /* per complete folder: its names not in the table */
#define LC_LOST_MAX 64u	   /* ... at most (then 5% of other names would be asked of meta) */
#define LC_PEND 64u /* this client's own changes in flight, tracked by key */
#define LC_LOG 256u /* forgets remembered, so that a lookup in flight can tell if one hit it */
#define LC_AGENS (1u << 16) /* attribute generations: see agen below */
#define LC_REVOKED 64u /* names of revoked inodes reported per watch (stk_lcache_on_revoked) */
#define LOG_NAME 0x80000000u /* a log entry naming a slot (a name), not a generation */
#define LOG_ATTR 0x40000000u /* a log entry naming an attribute generation */
#define LOG_ALL 0xffffffffu
#define WATCH_WAIT_MS 500u
#define TRUST_NS ((STK_LEASE_VALID_MS - 100ull) * 1000000ull)
#define KEEP_NS ((STK_LEASE_GRANT_MS - 1000ull) * 1000000ull)
/* What is answered in a delegated folder reaches meta well within this (behind.c). */
#define BEHIND_MARGIN_NS (500ull * 1000000ull)

struct lc_ent {
	uint64_t parent;
	uint64_t epoch; /* the cache's epoch when kept: see live() */
	uint64_t expires_ns;
	uint32_t pgen, cgen, agen;
	uint8_t used, found;
	char name[LC_NAME];
	uint32_t dmode, duid, dgid; /* the folder's, for the search permission */
	struct stk_attr attr;
};

/* A folder whose every name is in the table (it was made empty here, and kept). */
struct lc_dir {
	uint64_t ino, epoch, expires_ns;
	uint32_t gen; /* its generation then: any revocation or forget of it ends this */
	uint32_t mode, uid, gid;
	/* Names of it not in the table any more (given up for other entries, or made
	 * and not kept): a Bloom filter of their hashes, two bits each; past
	 * LC_LOST_MAX of them the folder is no longer complete. */
	uint64_t lost[LC_LOST_BITS / 64];
	uint32_t nlost;
	/* Delegated to this client (behind.h): its creates and unlinks may be answered here. */
	uint8_t delegated;
	uint64_t qid; /* the quota it counts in (attr.qid): creates spend an allowance */
	/*
	 * More than LC_LOST_MAX names lost: no longer complete, but a delegated folder
	 * keeps its record, so that names still in the table may be unlinked here.
	 */
	uint8_t partial;
};

struct stk_lcache {
	pthread_mutex_t mu;
	/*
	 * Counts drops (a shard's watch broken or reset, or everything going): an entry,
	 * folder record and token carry its value when made. dropped[s] is its value at
	 * shard s's last drop, so what was kept at epoch E about shard s still holds
	 * while E >= dropped[s] (live()), and shard s was not dropped since a token
	 * while dropped[s] <= tok.epoch.
	 */
	uint64_t epoch;
	uint64_t dropped[STK_MAX_SHARDS + 1];
	uint64_t rev;	/* counts revocations and forgets; log[rev % LC_LOG] says what each hit */
	uint32_t log[LC_LOG];
	/*
	 * Per shard (index 1..STK_MAX_SHARDS), each shard's watch: until when its
	 * answers are trusted, and the holder id its meta knows this client by (0: no
	 * watch answered). A holder changes only with a drop of its shard
	 * (drop_shard), so a shard not dropped since a token has the holder it had
	 * then, or, re-registered with the same id after a drop, the one requests
	 * were sent with since.
	 */
	uint64_t trust_until_ns[STK_MAX_SHARDS + 1];
	uint32_t holder[STK_MAX_SHARDS + 1];
	int stop, off;
	/* The watch threads: shard 1's from the start, another's from its first use. */
	uint8_t have_thread[STK_MAX_SHARDS + 1];
	pthread_t thr[STK_MAX_SHARDS + 1];
	struct lc_watch_arg {
		stk_client *c;
		unsigned shard;
	} warg[STK_MAX_SHARDS + 1];
	struct stk_lcache_stats st;
	uint32_t gen[LC_GENS];
	/*
	 * Of an inode's attributes alone, by hash: bumped when this client changed a name
	 * in a folder (its times and link count change, but none of its names but that
	 * one), so that the folder's own entry goes without its names or completeness.
	 */
	uint32_t agen[LC_AGENS];
	uint32_t by_ino[LC_SLOTS]; /* a hint: the slot last filled with the inode's entry */
	unsigned victim;	   /* the way a full set gives up next */
	/* Keys (as in log[]) of this client's own changes in flight, and how many each. */
	struct {
		uint32_t key, count;
	} pend[LC_PEND];
	uint32_t pend_over; /* changes in flight that found pend[] full: nothing is used */
	/* stk_lcache_on_revoked: the callback, and the names of the last watch's
	 * revocations, reported just before the watch that acknowledges them. */
	stk_lcache_revoked_fn revoked_fn;
	void *revoked_ctx;
	uint32_t nrevoked;
	struct {
		uint64_t parent, ino;
		char name[LC_NAME];
	} revoked[LC_REVOKED];
	/* stk_lcache_on_revoked_ino: called without mu, under ino_mu (never the other way) */
	pthread_mutex_t ino_mu;
	stk_lcache_ino_fn ino_fn;
	void *ino_ctx;
	struct lc_ent e[LC_SLOTS];
	struct lc_dir d[LC_DIRS];
};

static uint32_t gen_of(uint64_t ino)
{
	return (uint32_t)((ino * 0x9e3779b97f4a7c15ull) >> 40) & (LC_GENS - 1);
}

/* The first slot of the set (parent, name) lives in. */
static uint64_t key_hash(uint64_t parent, const char *name)
{
	uint64_t h = parent * 0x100000001b3ull ^ 0xcbf29ce484222325ull;

	for (; *name; name++)
		h = (h ^ (uint8_t)*name) * 0x100000001b3ull;
	return h ^ (h >> 29);
}

static uint32_t set_of(uint64_t parent, const char *name)
{
	return (uint32_t)key_hash(parent, name) & (LC_SLOTS - LC_WAYS);
}

static uint32_t agen_of(uint64_t ino)
{
	return (uint32_t)((ino * 0xd6e8feb86659fd93ull) >> 40) & (LC_AGENS - 1);
}

static uint32_t ino_slot(uint64_t ino)
{
	return (uint32_t)((ino * 0xff51afd7ed558ccdull) >> 32) & (LC_SLOTS - 1);
}

static uint32_t dir_slot(uint64_t ino)
{
	return (uint32_t)((ino * 0xc4ceb9fe1a85ec53ull) >> 32) & (LC_DIRS - 1);
}

static int cacheable(const char *name)
{
	size_t n = strlen(name);

	return n > 0 && n < LC_NAME && strcmp(name, ".") != 0 && strcmp(name, "..") != 0;
}

/* The shard whose meta leases what is cached about a name in folder parent. */
static unsigned shard_of(uint64_t parent)
{
	unsigned s = stk_ino_shard(parent);

	return s >= 1 && s <= STK_MAX_SHARDS ? s : 1;
}

/* With the mutex: what was kept at epoch e about shard s's names or inodes holds. */
static int live(const struct stk_lcache *l, uint64_t e, unsigned s)
{
	return e >= l->dropped[s];
}

/*
 * With the mutex: what shard's leases vouch for goes (0: every shard's), and its
 * trust ends until its next answered watch; the other shards' entries, folder
 * records, holders and lookups in flight stay. What rests on shard s: the names of
 * folders of s (a lookup's answer, found or not; a complete folder's record) and
 * the attributes of inodes of s (a found entry, whatever its folder's shard).
 * Lookups in flight whose folder or inode is on s lose their answers (the token's
 * epoch is below dropped[s] from now). Shard 1 has nothing more on it than its own
 * folders and inodes: a token carries shard 1's holder only to say that a lease is
 * asked for (stk_lcache_begin), and the request to another shard goes with that
 * shard's holder, so its answer is leased, and recalled, by that shard alone.
 */
static void drop_shard(struct stk_lcache *l, unsigned shard)
{
	l->epoch++;
	for (unsigned s = 1; s <= STK_MAX_SHARDS; s++)
		if (!shard || s == shard) {
			l->dropped[s] = l->epoch;
			l->trust_until_ns[s] = 0;
			l->holder[s] = 0;
		}
	l->st.resets++;
}

static void drop_all(struct stk_lcache *l)
{
	drop_shard(l, 0);
}

/* Search (x) permission on a folder of that mode and owner, as meta checks it. */
static int may_search(const struct stk_cred *cr, uint32_t mode, uint32_t uid, uint32_t gid)
{
	unsigned bits;

	if (cr->uid == 0)
		return 1;
	if (cr->uid == uid)
		bits = mode >> 6;
	else if (stk_cred_in_group(cr, gid))
		bits = mode >> 3;
	else
		bits = mode;
	return bits & 1;
}

/* With the mutex: e may be answered from now. */
static int ent_valid(const struct stk_lcache *l, const struct lc_ent *e, uint64_t now)
{
	return e->used && live(l, e->epoch, shard_of(e->parent)) && now < e->expires_ns &&
	       e->pgen == l->gen[gen_of(e->parent)] &&
	       (!e->found || (live(l, e->epoch, shard_of(e->attr.ino)) &&
			      e->cgen == l->gen[gen_of(e->attr.ino)] &&
			      e->agen == l->agen[agen_of(e->attr.ino)]));
}

/* With the mutex: the entry of (parent, name), valid or not, or NULL. */
static struct lc_ent *ent_find(struct stk_lcache *l, uint64_t parent, const char *name)
{
	struct lc_ent *set = &l->e[set_of(parent, name)];

	for (unsigned w = 0; w < LC_WAYS; w++)
		if (set[w].used && set[w].parent == parent && strcmp(set[w].name, name) == 0)
			return &set[w];
	return NULL;
}

/* With the mutex: folder ino's record while it holds (complete or partial), or NULL. */
static struct lc_dir *dir_record(struct stk_lcache *l, uint64_t ino, uint64_t now)
{
	struct lc_dir *d = &l->d[dir_slot(ino)];

	return d->ino == ino && live(l, d->epoch, shard_of(ino)) && now < d->expires_ns &&
		       d->gen == l->gen[gen_of(ino)]
		   ? d
		   : NULL;
}

/* With the mutex: folder ino's record if every name in it is known here, or NULL. */
static struct lc_dir *dir_complete(struct stk_lcache *l, uint64_t ino, uint64_t now)
{
	struct lc_dir *d = dir_record(l, ino, now);

	return d && !d->partial ? d : NULL;
}

/* The two bits of a name in its folder's lost filter. */
static void lost_bits(uint64_t parent, const char *name, unsigned *a, unsigned *b)
{
	uint64_t h = key_hash(parent, name) * 0x9e3779b97f4a7c15ull;

	*a = (unsigned)(h >> 40) % LC_LOST_BITS;
	*b = (unsigned)(h >> 20) % LC_LOST_BITS;
}

/* With the mutex: parent's name may be one of its names no longer in the table. */
static int dir_maybe_lost(const struct lc_dir *d, uint64_t parent, const char *name)
{
	unsigned a, b;

	lost_bits(parent, name, &a, &b);
	return (d->lost[a / 64] >> (a % 64) & 1) && (d->lost[b / 64] >> (b % 64) & 1);
}

/*
 * With the mutex: folder ino's name is not in the table (given up, or its state
 * unknown here): lookups of it go to meta while the folder stays complete for
 * its other names, up to LC_LOST_MAX such names.
 */
static void dir_lose(struct stk_lcache *l, uint64_t ino, const char *name)
{
	struct lc_dir *d = &l->d[dir_slot(ino)];
	unsigned a, b;

	if (d->ino != ino)
		return;
	if (d->nlost >= LC_LOST_MAX) {
		if (d->delegated)
			d->partial = 1;
		else
			d->ino = 0; /* no longer complete */
		return;
	}
	lost_bits(ino, name, &a, &b);
	d->lost[a / 64] |= 1ull << (a % 64);
	d->lost[b / 64] |= 1ull << (b % 64);
	d->nlost++;
}

/* With the mutex: is a change of this client's to key in flight? */
static int pending(const struct stk_lcache *l, uint32_t key)
{
	if (l->pend_over)
		return 1;
	for (unsigned i = 0; i < LC_PEND; i++)
		if (l->pend[i].count && l->pend[i].key == key)
			return 1;
	return 0;
}

static void pend_add(struct stk_lcache *l, uint32_t key)
{
	unsigned i, free_slot = LC_PEND;

	for (i = 0; i < LC_PEND; i++) {
		if (l->pend[i].count && l->pend[i].key == key) {
			l->pend[i].count++;
			return;
		}
		if (!l->pend[i].count && free_slot == LC_PEND)
			free_slot = i;
	}
	if (free_slot == LC_PEND) {
		l->pend_over++;
		return;
	}
	l->pend[free_slot].key = key;
	l->pend[free_slot].count = 1;
}

static void pend_del(struct stk_lcache *l, uint32_t key)
{
	for (unsigned i = 0; i < LC_PEND; i++)
		if (l->pend[i].count && l->pend[i].key == key) {
			l->pend[i].count--;
			return;
		}
	if (l->pend_over)
		l->pend_over--;
}

/* With the mutex: the change tok was begun for is over; its keys are free again. */
static void pend_done(struct stk_lcache *l, struct stk_lcache_tok *tok)
{
	for (unsigned i = 0; i < 2; i++)
		if (tok->pend[i] != LOG_ALL)
			pend_del(l, tok->pend[i]);
	tok->pend[0] = tok->pend[1] = LOG_ALL;
}

int stk_lcache_get(stk_client *c, const struct stk_cred *cred, uint64_t parent, const char *name,
		   struct stk_attr *out, int *rc)
{
	struct stk_lcache *l = c->lc;
	const struct stk_cred *cr = cred ? cred : &c->cred;
	struct lc_ent *e;
	struct lc_dir *d;
	uint64_t now;
	int hit = 0;

	if (!l || l->off || !cacheable(name))
		return 0;
	now = stk_now_ns();
	pthread_mutex_lock(&l->mu);
	if (now >= l->trust_until_ns[shard_of(parent)])
		goto out;
	/* A change of this client's to the name or the inode is in flight: ask meta. */
	if (pending(l, LOG_NAME | set_of(parent, name)))
		goto out;
	e = ent_find(l, parent, name);
	if (e && e->found && pending(l, gen_of(e->attr.ino)))
		goto out;
	/* Its attributes are leased by the inode's shard: the folder's, or for a folder
	 * placed on another shard (or a file named off home), that shard's, asked by the
	 * folder's shard on this client's behalf (META_XSHARD ATTR). */
	if (e && ent_valid(l, e, now) &&
	    (!e->found || now < l->trust_until_ns[shard_of(e->attr.ino)])) {
		hit = 1;
		if (!may_search(cr, e->dmode, e->duid, e->dgid))
			*rc = -EACCES;
		else if (!e->found)
			*rc = -ENOENT;
		else {
			*rc = 0;
			*out = e->attr;
		}
	} else if (!e && (d = dir_complete(l, parent, now)) && !dir_maybe_lost(d, parent, name)) {
		/* Not among the folder's names, all of which are known here. */
		hit = 1;
		*rc = may_search(cr, d->mode, d->uid, d->gid) ? -ENOENT : -EACCES;
	}
out:
	if (hit)
		l->st.hits++;
	else
		l->st.misses++;
	pthread_mutex_unlock(&l->mu);
	return hit;
}

int stk_lcache_get_ino(stk_client *c, uint64_t ino, struct stk_attr *out)
{
	return stk_lcache_get_ino_until(c, ino, out, NULL);
}

int stk_lcache_get_ino_until(stk_client *c, uint64_t ino, struct stk_attr *out, uint64_t *until_ns)
{
	struct stk_lcache *l = c->lc;
	const struct lc_ent *e;
	uint64_t now;
	int hit = 0;

	if (!l || l->off || !ino)
		return 0;
	now = stk_now_ns();
	pthread_mutex_lock(&l->mu);
	e = &l->e[l->by_ino[ino_slot(ino)]];
	/* The hint may name a slot given to another entry since: it must be ino's. */
	if (e->used && e->found && e->attr.ino == ino &&
	    now < l->trust_until_ns[shard_of(e->parent)] &&
	    now < l->trust_until_ns[shard_of(ino)] && !pending(l, gen_of(ino)) &&
	    ent_valid(l, e, now)) {
		uint64_t trust = STK_MIN(l->trust_until_ns[shard_of(e->parent)],
					 l->trust_until_ns[shard_of(ino)]);

		*out = e->attr;
		if (until_ns)
			*until_ns = e->expires_ns < trust ? e->expires_ns : trust;
		hit = 1;
	}
	pthread_mutex_unlock(&l->mu);
	return hit;
}

struct stk_lcache_tok stk_lcache_begin_at(stk_client *c, unsigned shard)
{
	struct stk_lcache *l = c->lc;
	struct stk_lcache_tok t = {.pend = {LOG_ALL, LOG_ALL}};

	if (!l || l->off)
		return t;
	if (shard < 1 || shard > STK_MAX_SHARDS)
		shard = 1; /* an inode of no shard: its request is ENOENT anyway */
	t.t_ns = stk_now_ns();
	pthread_mutex_lock(&l->mu);
	t.epoch = l->epoch;
	t.rev = l->rev;
	/* The shard the request goes to leases its answer: its holder, while its watch is
	 * trusted, whatever the other shards' watches do. */
	t.holder = t.t_ns < l->trust_until_ns[shard] ? l->holder[shard] : 0;
	pthread_mutex_unlock(&l->mu);
	return t;
}

struct stk_lcache_tok stk_lcache_begin(stk_client *c)
{
	return stk_lcache_begin_at(c, 1);
}

struct stk_lcache_tok stk_lcache_begin_change(stk_client *c, uint64_t parent, const char *name,
					      uint64_t ino)
{
	struct stk_lcache *l = c->lc;
	unsigned shard = parent ? shard_of(parent) : ino ? shard_of(ino) : 1;
	struct stk_lcache_tok t = stk_lcache_begin_at(c, shard);

	if (!l)
		return t;
	pthread_mutex_lock(&l->mu);
	if (name) {
		t.pend[0] = LOG_NAME | set_of(parent, name);
		pend_add(l, t.pend[0]);
	}
	if (ino) {
		t.pend[1] = gen_of(ino);
		pend_add(l, t.pend[1]);
	}
	pthread_mutex_unlock(&l->mu);
	return t;
}

/* With the mutex. */
static void bump(struct stk_lcache *l, uint64_t ino)
{
	l->gen[gen_of(ino)]++;
	l->rev++;
	l->log[l->rev % LC_LOG] = gen_of(ino);
}

/* As bump, for inode ino's attributes alone (agen): its entry goes, not its names. */
static void bump_attrs(struct stk_lcache *l, uint64_t ino)
{
	l->agen[agen_of(ino)]++;
	l->rev++;
	l->log[l->rev % LC_LOG] = LOG_ATTR | agen_of(ino);
}

/*
 * With the mutex: did a forget or revocation since tok touch the folder's names,
 * this name, or the inode (ino 0: not known), or a drop their shards (parent 0:
 * none)? Too long ago to tell counts as yes.
 */
static int touched(const struct stk_lcache *l, struct stk_lcache_tok tok, uint64_t parent,
		   const char *name, uint64_t ino)
{
	uint32_t p = gen_of(parent), n = LOG_NAME | set_of(parent, name);
	uint32_t i = ino ? gen_of(ino) : LOG_ALL, a = ino ? LOG_ATTR | agen_of(ino) : LOG_ALL;

	if ((parent && !live(l, tok.epoch, shard_of(parent))) ||
	    (ino && !live(l, tok.epoch, shard_of(ino))) || l->rev - tok.rev >= LC_LOG)
		return 1;
	for (uint64_t r = tok.rev + 1; r <= l->rev; r++) {
		uint32_t v = l->log[r % LC_LOG];

		if (v == p || v == n || v == i || v == a)
			return 1;
	}
	return 0;
}

/*
 * With the mutex: this client changed what parent's name names; nothing else in the
 * folder changed. Lookups in flight lose their answers (the log). failed: the
 * change may not have happened, so the name's state is unknown here.
 */
static void forget_name(struct stk_lcache *l, uint64_t parent, const char *name, int failed)
{
	struct lc_ent *e = ent_find(l, parent, name);

	if (e)
		e->used = 0;
	if (failed)
		dir_lose(l, parent, name);
	l->rev++;
	l->log[l->rev % LC_LOG] = LOG_NAME | set_of(parent, name);
	/* The folder's times (and, for a folder made or removed, its link count) changed:
	 * its own entry goes, and lookups of it in flight lose their answers. */
	bump_attrs(l, parent);
}

/*
 * With the mutex: the slot for (parent, name): its own, else a free one, else a
 * stale one, else a "no such name", else the set's next victim. A name given up
 * is lost to its complete folder (dir_lose).
 */
static struct lc_ent *ent_slot(struct stk_lcache *l, uint64_t parent, const char *name,
			       uint64_t now)
{
	struct lc_ent *set = &l->e[set_of(parent, name)], *e = ent_find(l, parent, name);

	/* A free slot before a stale entry: a stale name of a complete folder is lost. */
	for (unsigned w = 0; !e && w < LC_WAYS; w++)
		if (!set[w].used)
			e = &set[w];
	for (unsigned w = 0; !e && w < LC_WAYS; w++)
		if (!ent_valid(l, &set[w], now))
			e = &set[w];
	for (unsigned w = 0; !e && w < LC_WAYS; w++)
		if (!set[w].found)
			e = &set[w];
	if (!e)
		e = &set[l->victim++ % LC_WAYS];
	/* A name given up may be one of a folder all of whose names were known here. */
	if (e->used && e->found && (e->parent != parent || strcmp(e->name, name) != 0))
		dir_lose(l, e->parent, e->name);
	return e;
}

/* With the mutex: e becomes parent's `name`, found as attr (NULL: no such name). */
static void ent_fill(struct stk_lcache *l, struct lc_ent *e, uint64_t parent, const char *name,
		     uint64_t epoch, uint64_t expires_ns, const struct stk_attr *attr, uint32_t dmode,
		     uint32_t duid, uint32_t dgid)
{
	e->used = 1;
	e->parent = parent;
	e->epoch = epoch;
	e->expires_ns = expires_ns;
	e->pgen = l->gen[gen_of(parent)];
	e->found = attr != NULL;
	if (attr) {
		e->attr = *attr;
		e->cgen = l->gen[gen_of(attr->ino)];
		e->agen = l->agen[agen_of(attr->ino)];
		l->by_ino[ino_slot(attr->ino)] = (uint32_t)(e - l->e);
	}
	e->dmode = dmode;
	e->duid = duid;
	e->dgid = dgid;
	memcpy(e->name, name, strlen(name) + 1);
}

/* With the mutex: keeps the answer if ok (nothing touched it since tok); 1 if kept. */
static int put_locked(struct stk_lcache *l, struct stk_lcache_tok tok, uint64_t parent,
		      const char *name, int found, const struct stk_attr *attr,
		      const struct stk_attr *dir, int ok)
{
	uint64_t now = stk_now_ns();
	unsigned ps = shard_of(parent);
	struct lc_dir *d;
	struct lc_ent *e;

	/* The request went with its folder's shard's holder (the token's: it was taken
	 * for that shard, stk_lcache_begin_at), which is the one now as long as that
	 * shard was not dropped since tok. Other shards' drops do not matter. */
	if (!ok || !tok.holder || !cacheable(name) || !live(l, tok.epoch, ps) ||
	    (found && !live(l, tok.epoch, shard_of(attr->ino))) || !l->holder[ps] ||
	    tok.holder != l->holder[ps] ||
	    pending(l, LOG_NAME | set_of(parent, name)) ||
	    (found && pending(l, gen_of(attr->ino))))
		return 0;
	e = ent_slot(l, parent, name, now);
	ent_fill(l, e, parent, name, tok.epoch, tok.t_ns + KEEP_NS, found ? attr : NULL, dir->mode,
		 dir->uid, dir->gid);
	/* The folder's lease was renewed with this answer. */
	d = dir_record(l, parent, now);
	if (d && d->expires_ns < e->expires_ns)
		d->expires_ns = e->expires_ns;
	return 1;
}

void stk_lcache_put(stk_client *c, struct stk_lcache_tok tok, uint64_t parent, const char *name,
		    int found, const struct stk_attr *attr, const struct stk_attr *dir)
{
	struct stk_lcache *l = c->lc;

	if (!l || l->off)
		return;
	pthread_mutex_lock(&l->mu);
	put_locked(l, tok, parent, name, found, attr, dir,
		   !touched(l, tok, parent, name, found ? attr->ino : 0));
	pthread_mutex_unlock(&l->mu);
}

void stk_lcache_changed(stk_client *c, struct stk_lcache_tok tok, uint64_t parent, const char *name,
			int leased, const struct stk_attr *attr, const struct stk_attr *dir)
{
	struct stk_lcache *l = c->lc;
	int ok;

	if (!l)
		return;
	pthread_mutex_lock(&l->mu);
	/* Before this client's own forget, which the entry then comes after. */
	ok = leased && !l->off && !touched(l, tok, parent, name, attr->ino);
	forget_name(l, parent, name, 0);
	pend_done(l, &tok);
	/* A name made and not kept here: the folder's names are not all known any more. */
	if (!put_locked(l, tok, parent, name, 1, attr, dir, ok))
		dir_lose(l, parent, name);
	pthread_mutex_unlock(&l->mu);
}

void stk_lcache_complete(stk_client *c, struct stk_lcache_tok tok, const struct stk_attr *dir,
			 int delegated)
{
	struct stk_lcache *l = c->lc;
	unsigned ds = shard_of(dir->ino);
	struct lc_dir *d;

	if (!l)
		return;
	pthread_mutex_lock(&l->mu);
	/* Its names are leased, and it is delegated, by its own shard, to the holder
	 * the token was taken with (stk_lcache_begin_at that shard). */
	if (!l->off && tok.holder && l->holder[ds] && tok.holder == l->holder[ds] &&
	    !touched(l, tok, dir->ino, "", dir->ino)) {
		d = &l->d[dir_slot(dir->ino)];
		d->ino = dir->ino;
		d->epoch = tok.epoch;
		d->gen = l->gen[gen_of(dir->ino)];
		d->expires_ns = tok.t_ns + KEEP_NS;
		d->mode = dir->mode;
		d->uid = dir->uid;
		d->gid = dir->gid;
		memset(d->lost, 0, sizeof(d->lost));
		d->nlost = 0;
		d->delegated = (uint8_t)(delegated != 0);
		d->qid = dir->qid;
		d->partial = 0;
	}
	pthread_mutex_unlock(&l->mu);
}

/*
 * With the mutex: parent's record if it is complete and delegated here, trusted for
 * long enough that what is answered now reaches meta before the trust ends, and no
 * change of this client's to its `name` is in flight.
 */
static struct lc_dir *dir_delegated(struct stk_lcache *l, uint64_t parent, const char *name,
				    uint64_t now)
{
	struct lc_dir *d;

	if (l->off || now + BEHIND_MARGIN_NS >= l->trust_until_ns[shard_of(parent)] ||
	    pending(l, LOG_NAME | set_of(parent, name)))
		return NULL;
	d = dir_record(l, parent, now);
	return d && d->delegated && now + BEHIND_MARGIN_NS < d->expires_ns ? d : NULL;
}

/* Takes the mutex (the caller lets it go): parent's record if delegated (dir_delegated). */
static struct lc_dir *behind_lock(struct stk_lcache *l, uint64_t parent, const char *name,
				  uint64_t *now)
{
	*now = stk_now_ns();
	pthread_mutex_lock(&l->mu);
	return dir_delegated(l, parent, name, *now);
}

int stk_lcache_behind_free(stk_client *c, uint64_t parent, const char *name, uint32_t *dmode,
			   uint32_t *dgid, uint64_t *dqid)
{
	struct stk_lcache *l = c->lc;
	struct lc_dir *d;
	struct lc_ent *e;
	uint64_t now;
	int ok = 0;

	if (!l || !cacheable(name))
		return 0;
	d = behind_lock(l, parent, name, &now);
	/* A name is free only where every name is known. */
	if (d && !d->partial && !dir_maybe_lost(d, parent, name)) {
		e = ent_find(l, parent, name);
		ok = !e || (!e->found && ent_valid(l, e, now));
		*dmode = d->mode;
		*dgid = d->gid;
		*dqid = d->qid;
	}
	pthread_mutex_unlock(&l->mu);
	return ok;
}

void stk_lcache_behind_made(stk_client *c, uint64_t parent, const char *name,
			    const struct stk_attr *attr)
{
	struct stk_lcache *l = c->lc;
	uint64_t now = stk_now_ns();
	struct lc_dir *d;
	struct lc_ent *e;

	pthread_mutex_lock(&l->mu);
	/* Lookups of the name in flight lose their answers; the folder's times changed. */
	forget_name(l, parent, name, 0);
	d = dir_record(l, parent, now);
	if (d) {
		e = ent_slot(l, parent, name, now);
		ent_fill(l, e, parent, name, l->epoch, d->expires_ns, attr, d->mode, d->uid, d->gid);
	}
	pthread_mutex_unlock(&l->mu);
}

int stk_lcache_behind_victim(stk_client *c, uint64_t parent, const char *name,
			     struct stk_attr *out)
{
	struct stk_lcache *l = c->lc;
	struct lc_ent *e;
	uint64_t now;
	int ok = 0;

	if (!l || !cacheable(name))
		return 0;
	if (behind_lock(l, parent, name, &now)) {
		e = ent_find(l, parent, name);
		ok = e && e->found && ent_valid(l, e, now) && S_ISREG(e->attr.mode) &&
		     e->attr.nlink == 1 && !pending(l, gen_of(e->attr.ino));
		if (ok)
			*out = e->attr;
	}
	pthread_mutex_unlock(&l->mu);
	return ok;
}

void stk_lcache_behind_gone(stk_client *c, uint64_t parent, const char *name, uint64_t ino)
{
	struct stk_lcache *l = c->lc;

	pthread_mutex_lock(&l->mu);
	/* Out of the table but not lost: the folder's names are all known still. */
	forget_name(l, parent, name, 0);
	bump(l, ino);
	pthread_mutex_unlock(&l->mu);
}

void stk_lcache_forget_name(stk_client *c, struct stk_lcache_tok tok, uint64_t parent,
			    const char *name, uint64_t ino, int failed)
{
	struct stk_lcache *l = c->lc;

	if (!l)
		return;
	pthread_mutex_lock(&l->mu);
	forget_name(l, parent, name, failed);
	if (ino)
		bump(l, ino);
	pend_done(l, &tok);
	pthread_mutex_unlock(&l->mu);
}

void stk_lcache_updated(stk_client *c, struct stk_lcache_tok tok, uint64_t ino,
			const struct stk_attr *attr)
{
	struct stk_lcache *l = c->lc;
	struct lc_ent *e;
	uint32_t was;
	int ok;

	if (!l)
		return;
	pthread_mutex_lock(&l->mu);
	ok = attr && attr->ino == ino && !l->off && !touched(l, tok, 0, "", ino);
	was = l->gen[gen_of(ino)];
	bump(l, ino);
	pend_done(l, &tok);
	e = &l->e[l->by_ino[ino_slot(ino)]];
	if (ok && e->used && e->found && e->attr.ino == ino &&
	    live(l, e->epoch, shard_of(e->parent)) && live(l, e->epoch, shard_of(ino)) &&
	    e->cgen == was && e->pgen == l->gen[gen_of(e->parent)]) {
		e->attr = *attr;
		e->cgen = l->gen[gen_of(ino)];
	}
	pthread_mutex_unlock(&l->mu);
}

void stk_lcache_on_revoked(stk_client *c, stk_lcache_revoked_fn fn, void *ctx)
{
	struct stk_lcache *l = c->lc;

	if (!l)
		return;
	pthread_mutex_lock(&l->mu);
	l->revoked_fn = fn;
	l->revoked_ctx = ctx;
	l->nrevoked = 0;
	pthread_mutex_unlock(&l->mu);
}

void stk_lcache_on_revoked_ino(stk_client *c, stk_lcache_ino_fn fn, void *ctx)
{
	struct stk_lcache *l = c->lc;

	if (!l)
		return;
	pthread_mutex_lock(&l->ino_mu);
	l->ino_fn = fn;
	l->ino_ctx = ctx;
	pthread_mutex_unlock(&l->ino_mu);
}

/* Without the mutex: tells stk_lcache_on_revoked_ino's fn of each record of rb. */
static void report_revoked_inos(struct stk_lcache *l, struct stk_rbuf *rb, uint32_t n)
{
	pthread_mutex_lock(&l->ino_mu);
	for (uint32_t i = 0; l->ino_fn && i < n; i++) {
		struct stk_msg_watch_rec rec;

		if (stk_msg_watch_rec_dec(rb, &rec))
			break; /* decoded once already: cannot happen */
		l->ino_fn(l->ino_ctx, rec.ino);
	}
	pthread_mutex_unlock(&l->ino_mu);
}

/* With the mutex: remembers the name the cache last learnt for revoked inode ino. */
static void note_revoked(struct stk_lcache *l, uint64_t ino)
{
	const struct lc_ent *e = &l->e[l->by_ino[ino_slot(ino)]];

	/* The hint may name a slot given to another entry since: it must be ino's. */
	if (!l->revoked_fn || l->nrevoked >= LC_REVOKED || !e->used || !e->found ||
	    e->attr.ino != ino)
		return;
	/* A folder is revoked at every change of its names, which leaves its own be. */
	if (S_ISDIR(e->attr.mode))
		return;
	l->revoked[l->nrevoked].parent = e->parent;
	l->revoked[l->nrevoked].ino = ino;
	memcpy(l->revoked[l->nrevoked].name, e->name, sizeof(e->name));
	l->nrevoked++;
}

/* With the mutex: reports the names noted, once their revocations are being acknowledged. */
static void report_revoked(struct stk_lcache *l)
{
	for (uint32_t i = 0; i < l->nrevoked; i++)
		if (l->revoked_fn)
			l->revoked_fn(l->revoked_ctx, l->revoked[i].parent, l->revoked[i].name,
				      l->revoked[i].ino);
	l->nrevoked = 0;
}

uint32_t stk_lcache_origin(stk_client *c)
{
	struct stk_lcache *l = c->lc;
	uint32_t h;

	if (!l || l->off)
		return 0;
	pthread_mutex_lock(&l->mu);
	h = l->holder[1];
	pthread_mutex_unlock(&l->mu);
	return h;
}

uint32_t stk_lcache_holder(stk_client *c, unsigned shard)
{
	struct stk_lcache *l = c->lc;
	uint32_t h;

	if (!l || l->off || shard < 1 || shard > STK_MAX_SHARDS)
		return 0;
	pthread_mutex_lock(&l->mu);
	h = l->holder[shard];
	pthread_mutex_unlock(&l->mu);
	return h;
}

uint32_t stk_lcache_wait_holder(stk_client *c, unsigned shard, unsigned ms)
{
	struct stk_lcache *l = c->lc;
	uint32_t h = 0;

	if (!l || shard < 1 || shard > STK_MAX_SHARDS)
		return 0;
	stk_lcache_use_shard(c, shard);
	for (unsigned t = 0;; t += 5) {
		int off;

		pthread_mutex_lock(&l->mu);
		off = l->off || l->stop;
		if (!off && stk_now_ns() < l->trust_until_ns[shard])
			h = l->holder[shard];
		pthread_mutex_unlock(&l->mu);
		if (h || off || t >= ms)
			return h;
		usleep(5000);
	}
}

void stk_lcache_stats(stk_client *c, struct stk_lcache_stats *out)
{
	struct stk_lcache *l = c->lc;

	memset(out, 0, sizeof(*out));
	if (!l)
		return;
	pthread_mutex_lock(&l->mu);
	*out = l->st;
	pthread_mutex_unlock(&l->mu);
}

/* ---- the watch ---- */

static int stopping(struct stk_lcache *l)
{
	int s;

	pthread_mutex_lock(&l->mu);
	s = l->stop;
	pthread_mutex_unlock(&l->mu);
	return s;
}

/* Sleeps ms in short steps, waking early when the client goes. */
static void nap(struct stk_lcache *l, unsigned ms)
{
	for (unsigned t = 0; t < ms && !stopping(l); t += 50)
		usleep(50000);
}

/*
 * One watch of shard's: sends it on conn, applies the reply. 0, -ENOSYS (meta has
 * no leases), or another -errno (the connection is then to be dropped).
 */
static int watch_once(stk_client *c, unsigned shard, struct stk_conn *conn, uint64_t session,
		      uint32_t *holder, uint64_t *acked, uint8_t *resp, size_t cap)
{
	struct stk_lcache *l = c->lc;
	struct stk_msg_meta_watch_req q = {
	    .session = session, .holder = *holder, .acked = *acked, .wait_ms = WATCH_WAIT_MS};
	struct stk_msg_meta_watch_resp r;
	uint8_t req[64];
	struct stk_wbuf w;
	struct stk_rbuf rb, recs;
	uint64_t sent;
	int rc;

	stk_wbuf_init(&w, req, sizeof(req));
	stk_msg_meta_watch_req_enc(&w, &q);
	/* This watch acknowledges the last one's revocations: meta commits those changes
	 * once it has it, so a name dropped above from now is looked up anew soon after. */
	pthread_mutex_lock(&l->mu);
	report_revoked(l);
	pthread_mutex_unlock(&l->mu);
	struct stk_rpc rpc = {.opcode = STK_OP_META_WATCH,
			      .req = req,
			      .req_len = w.len,
			      .resp = resp,
			      .resp_cap = cap};
	sent = stk_now_ns();
	rc = stk_rpc_call(conn, &rpc);
	if (rc)
		return rc;
	stk_rbuf_init(&rb, resp, rpc.resp_len);
	if (stk_msg_meta_watch_resp_dec(&rb, &r) || r.n > STK_WATCH_RECS_MAX)
		return -EBADMSG;
	recs = rb; /* the records again, for report_revoked_inos */
	/* No create or unlink is answered in a folder while its revocation lands. */
	stk_behind_gate_close(c);
	pthread_mutex_lock(&l->mu);
	if (r.reset || r.holder != *holder)
		drop_shard(l, shard);
	for (uint32_t i = 0; i < r.n; i++) {
		struct stk_msg_watch_rec rec;

		if (stk_msg_watch_rec_dec(&rb, &rec)) {
			drop_shard(l, shard); /* cut short: trust nothing of it */
			pthread_mutex_unlock(&l->mu);
			stk_behind_gate_open(c);
			return -EBADMSG;
		}
		note_revoked(l, rec.ino); /* before bump: the entry is still ino's */
		bump(l, rec.ino);
		l->st.revoked++;
	}
	if (stk_rbuf_finish(&rb)) {
		drop_shard(l, shard);
		pthread_mutex_unlock(&l->mu);
		stk_behind_gate_open(c);
		return -EBADMSG;
	}
	*acked = r.seq;
	*holder = r.holder;
	l->holder[shard] = r.holder;
	l->trust_until_ns[shard] = sent + TRUST_NS;
	pthread_mutex_unlock(&l->mu);
	stk_behind_gate_open(c);
	/* Before the next watch acknowledges them: a cache above this one that was
	 * told these attributes under the lease forgets them first. */
	if (r.n)
		report_revoked_inos(l, &recs, r.n);
	/* Before the next watch acknowledges these: what was answered here in a
	 * delegated folder goes to meta first (behind.h), and a change meta waits to
	 * make may remove a file opened here on a lease, so meta must know of that open. */
	if (r.n || r.reset) {
		(void)stk_behind_flush_shard(c, shard);
		stk_session_sync_opens(c);
	}
	return 0;
}

/*
 * A shard's watch thread. Shard 1's turns the cache off for good against a meta
 * without leases or sessions; another shard's just ends then (its folders are not
 * cached, as before there were watches per shard).
 */
static void *watch_main(void *arg)
{
	struct lc_watch_arg *a = arg;
	stk_client *c = a->c;
	unsigned shard = a->shard;
	struct stk_lcache *l = c->lc;
	size_t cap = 64 + (size_t)STK_WATCH_RECS_MAX * 8;
	uint8_t *resp = malloc(cap);
	struct stk_conn *conn = NULL;
	uint64_t acked = 0;
	uint32_t holder = 0; /* kept across reconnects: meta may still know it */
	unsigned refused_ms = 0; /* the wait after meta refused our key, doubling */

	while (resp && !stopping(l)) {
		uint64_t session = stk_session_id(c);
		char addr[STK_ADDR_MAX];
		int rc;

		if (!session) {
			rc = -ENOSYS; /* sessions off: no leases either */
		} else if (!conn) {
			rc = stk_client_meta_addr_shard(c, shard, addr);
			if (rc == 0)
				rc = stk_conn_connect(addr, 1000, &conn);
			if (rc == -EKEYREJECTED) {
				/* a removed key is refused for good: ask less and less often
				 * (each try is a line in meta's log), up to 30 s */
				if (!refused_ms && shard == 1)
					stk_warn("meta refuses this client's key (removed?): lookups "
						 "are not cached; trying again less and less often");
				refused_ms = refused_ms ? STK_MIN(refused_ms * 2, 30000u) : 1000;
			}
			if (rc) {
				conn = NULL;
				nap(l, rc == -EKEYREJECTED ? refused_ms : 200);
				continue;
			}
			refused_ms = 0;
			rc = watch_once(c, shard, conn, session, &holder, &acked, resp, cap);
		} else {
			rc = watch_once(c, shard, conn, session, &holder, &acked, resp, cap);
		}
		if (rc == -ENOSYS) {
			stk_debug("meta of shard %u keeps no leases: its lookups are not cached",
				  shard);
			pthread_mutex_lock(&l->mu);
			drop_shard(l, shard == 1 ? 0 : shard);
			if (shard == 1)
				l->off = 1;
			pthread_mutex_unlock(&l->mu);
			break;
		}
		if (rc) {
			pthread_mutex_lock(&l->mu);
			drop_shard(l, shard);
			pthread_mutex_unlock(&l->mu);
			stk_session_sync_opens(c); /* no lease protects them now */
			if (conn && stk_conn_broken(conn)) {
				stk_conn_close(conn);
				conn = NULL;
			}
			nap(l, rc == -EAGAIN ? 1000 : 100);
		}
	}
	if (conn)
		stk_conn_close(conn);
	free(resp);
	return NULL;
}

int stk_lcache_start(stk_client *c)
{
	struct stk_lcache *l;
	const char *e = getenv("STOKER_LOOKUP_CACHE");

	if (c->lc || (e && strcmp(e, "0") == 0))
		return 0;
	l = calloc(1, sizeof(*l));
	if (!l)
		return -ENOMEM;
	pthread_mutex_init(&l->mu, NULL);
	pthread_mutex_init(&l->ino_mu, NULL);
	c->lc = l;
	l->warg[1] = (struct lc_watch_arg){.c = c, .shard = 1};
	if (pthread_create(&l->thr[1], NULL, watch_main, &l->warg[1])) {
		c->lc = NULL;
		pthread_mutex_destroy(&l->mu);
		pthread_mutex_destroy(&l->ino_mu);
		free(l);
		return -EAGAIN;
	}
	l->have_thread[1] = 1;
	return 0;
}

void stk_lcache_use_shard(stk_client *c, unsigned shard)
{
	struct stk_lcache *l = c->lc;

	if (!l || shard < 2 || shard > STK_MAX_SHARDS)
		return;
	pthread_mutex_lock(&l->mu);
	if (!l->off && !l->stop && !l->have_thread[shard]) {
		l->warg[shard] = (struct lc_watch_arg){.c = c, .shard = shard};
		/* without a thread the shard's folders are just not cached */
		if (pthread_create(&l->thr[shard], NULL, watch_main, &l->warg[shard]) == 0)
			l->have_thread[shard] = 1;
	}
	pthread_mutex_unlock(&l->mu);
}

void stk_lcache_stop(stk_client *c)
{
	struct stk_lcache *l = c->lc;

	if (!l)
		return;
	pthread_mutex_lock(&l->mu);
	l->stop = 1;
	drop_all(l);
	pthread_mutex_unlock(&l->mu);
}

void stk_lcache_destroy(stk_client *c)
{
	struct stk_lcache *l = c->lc;

	if (!l)
		return;
	for (unsigned s = 1; s <= STK_MAX_SHARDS; s++)
		if (l->have_thread[s])
			pthread_join(l->thr[s], NULL);
	c->lc = NULL;
	pthread_mutex_destroy(&l->mu);
	pthread_mutex_destroy(&l->ino_mu);
	free(l);
}

void stk_lcache_after_fork(stk_client *c)
{
	struct stk_lcache *l = c->lc;

	if (!l)
		return;
	pthread_mutex_init(&l->mu, NULL);
	pthread_mutex_init(&l->ino_mu, NULL);
	l->ino_fn = NULL;
	memset(l->have_thread, 0, sizeof(l->have_thread));
	l->off = 1;
	drop_all(l);
}
