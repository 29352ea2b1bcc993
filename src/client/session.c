/*
 * The client's session with meta (session.h): the id, the renewal thread, and
 * the open references it registers.
 *
 * An open takes `reg` for reading around its META_OPEN (or META_CREATE with the
 * session) and its change to the list; the renewal thread takes it for writing
 * when meta did not know the session, so that it registers the list again (each
 * inode with META_OPEN set = 1, the exact count) while no open is in flight.
 *
 * A close does not wait for meta: it takes the inode off the list and queues the
 * reference, and the renewal thread, woken at once, lets closes gather for
 * CLOSES_GATHER_MS and sends them all in one META_CLOSES (same inodes merged).
 * Meta's count is therefore never below the real one, only above it for a
 * moment. Reads to record in atime (relatime) share the queue and the message. A
 * re-registration copies the list and empties the queue in one step under `mu`,
 * and the same thread sends both in order, so a queued close is neither lost nor
 * counted twice.
 *
 * An open of a file whose attributes the lookup cache holds under a lease is
 * registered here only (`unsent`), and sent after OPENS_GATHER_MS, unless its
 * close comes first: then neither goes. What could remove the file while meta
 * does not know of the open is a change to its names, and each such change
 * sends the opens not yet sent first: one of another client's is revoked here
 * before meta makes it (the watch sends them before it acknowledges), and this
 * client's own unlinks and renames send them before they go
 * (stk_session_sync_opens). `remove_seq` orders an open against those: an open
 * that checked the cache before a sync began and counts itself after it goes to
 * meta itself instead. One send of opens at a time (`flush_mu`), so that a
 * sync also waits for opens already on their way. A close of an inode whose
 * opens are on their way waits for them (`late`), so that it never reaches meta
 * before its open; closes never wait for `flush_mu` (a watch may, and a send of
 * closes may wait at meta for another client's watch).
 */
#include "lcache.h"
#include "session.h"

#include <errno.h>
#include <stdatomic.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "../common/log.h"
#include "../common/util.h"
#include "client.h"
#include "inode.h"

#define FIRST_RENEW_MS 1000u
#define MIN_RENEW_MS 100u
/* How long queued closes wait for company; more than this many go at once. */
#define CLOSES_GATHER_MS 2u
#define CLOSES_GATHER_MAX 256u
/* How long an open registered here only waits for its close before meta learns it. */
#define OPENS_GATHER_MS 10u

struct open_ent {
	uint64_t ino;
	uint32_t count;
	uint32_t unsent; /* opens only: of count, those meta does not know of yet */
	uint32_t sending; /* opens only: on their way to meta (the entry stays) */
	uint32_t late;	  /* opens only: closes held until those arrive */
	uint32_t seen;	 /* opens only: the renewal thread's look that first saw them unsent */
	uint8_t read;	 /* queued only: a read to record (STK_REF_READ) */
};

struct stk_session {
	pthread_rwlock_t reg;	  /* see above */
	pthread_mutex_t flush_mu; /* see above; before reg and mu */
	pthread_mutex_t mu;	  /* everything below */
	pthread_cond_t wake;
	uint64_t id;
	int off; /* meta answered ENOSYS */
	int running;
	int stop;
	pthread_t thr;
	uint32_t renew_ms;
	uint64_t next_renew_ns;
	struct open_ent *opens;
	size_t n, cap;
	size_t nunsent;		  /* entries of opens with unsent > 0 */
	uint64_t unsent_due_ns;	  /* when the oldest of them goes */
	uint64_t remove_seq;	  /* syncs begun (stk_session_sync_opens) */
	uint32_t look;		  /* the renewal thread's looks at unsent opens (send_opens) */
	struct open_ent *closing; /* queued META_CLOSEs */
	size_t nclosing, cap_closing;
	int no_closes; /* meta has no META_CLOSES: one META_CLOSE each (renewal thread only) */
};

static uint64_t new_id(void)
{
	uint64_t id = 0;

	while (id == 0)
		if (getrandom(&id, sizeof(id), 0) != (ssize_t)sizeof(id))
			id = stk_now_ns() ^ ((uint64_t)getpid() << 32);
	return id;
}

static void init_locks(struct stk_session *s)
{
	pthread_condattr_t ca;

	pthread_rwlock_init(&s->reg, NULL);
	pthread_mutex_init(&s->flush_mu, NULL);
	pthread_mutex_init(&s->mu, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&s->wake, &ca);
	pthread_condattr_destroy(&ca);
}

int stk_session_create(stk_client *c)
{
	struct stk_session *s = calloc(1, sizeof(*s));

	if (!s)
		return -ENOMEM;
	init_locks(s);
	s->id = new_id();
	s->renew_ms = FIRST_RENEW_MS;
	c->sess = s;
	return 0;
}

/* META_SESSION or META_SESSION_END to the meta leading `shard`. */
static int call_session(stk_client *c, unsigned shard, uint16_t op, uint64_t id,
			uint32_t *lease_ms, int *known)
{
	struct stk_msg_meta_session_req m = {.session = id, .pid = (uint32_t)getpid()};
	struct stk_msg_meta_session_resp r;
	uint8_t req[32], resp[32];
	struct stk_wbuf w;
	struct stk_rbuf rb;
	size_t len = 0;
	int rc;

	stk_wbuf_init(&w, req, sizeof(req));
	stk_msg_meta_session_req_enc(&w, &m);
	rc = stk_client_meta_call_shard(c, shard, 0, op, req, w.len, resp, sizeof(resp), &len);
	if (rc || op != STK_OP_META_SESSION)
		return rc;
	stk_rbuf_init(&rb, resp, len);
	if (stk_msg_meta_session_resp_dec(&rb, &r) || stk_rbuf_finish(&rb))
		return -EIO;
	*lease_ms = r.lease_ms;
	*known = r.known;
	return 0;
}

/*
 * META_OPEN or META_CLOSE. For META_OPEN, *attr (if not NULL) becomes the attributes
 * meta read with the registration and *have_attr 1; 0 when the reply has none (a
 * meta from before they were added to it: the reference is registered all the same).
 */
static int call_open(stk_client *c, uint16_t op, uint64_t id, uint64_t ino, uint32_t count, int set,
		     struct stk_attr *attr, int *have_attr)
{
	struct stk_msg_meta_open_req m = {.session = id, .ino = ino, .count = count,
					  .set = (uint8_t)set};
	struct stk_msg_meta_attr_resp ar;
	uint8_t req[64], resp[256];
	struct stk_wbuf w;
	struct stk_rbuf r;
	size_t len = 0;
	int rc;

	if (have_attr)
		*have_attr = 0;
	stk_wbuf_init(&w, req, sizeof(req));
	stk_msg_meta_open_req_enc(&w, &m);
	rc = stk_client_meta_call(c, op, req, w.len, resp, sizeof(resp), &len);
	if (rc || !attr || len == 0)
		return rc;
	stk_rbuf_init(&r, resp, len);
	if (stk_msg_meta_attr_resp_dec(&r, &ar) || stk_rbuf_finish(&r))
		return 0; /* registered; the caller fetches the attributes itself */
	*attr = ar.attr;
	*have_attr = 1;
	return 0;
}

/* Takes a copy of a list under mu (NULL, 0 when empty or out of memory). */
static struct open_ent *copy_list(const struct open_ent *l, size_t n, size_t *out_n)
{
	struct open_ent *p = n ? malloc(n * sizeof(*p)) : NULL;

	*out_n = p ? n : 0;
	if (p)
		memcpy(p, l, n * sizeof(*p));
	return p;
}

/*
 * Under mu, before reregister sends the counts of s->opens: the queued closes of
 * files still open here are left out of those counts already and go; the closes
 * of files closed since stay queued, since "session unknown" does not always mean
 * that meta lost the references (a session an open made first is unknown to its
 * first renewal), and on a meta that did lose them the close is a no-op. Reads to
 * record stay too.
 */
static void keep_closes(struct stk_session *s, unsigned shard)
{
	size_t keep = 0;

	for (size_t j = 0; j < s->nclosing; j++) {
		struct open_ent e = s->closing[j];
		size_t i;

		for (i = 0; i < s->n && s->opens[i].ino != e.ino; i++)
			;
		/* only the shard registered again has its counts replaced */
		if (i < s->n && stk_ino_shard(e.ino) == shard)
			e.count = 0;
		if (e.count || e.read)
			s->closing[keep++] = e;
	}
	s->nclosing = keep;
}

/*
 * After "session unknown" from the meta leading `shard`: every open inode of
 * that shard again, with its exact count (each shard keeps the session's
 * references to its own inodes).
 */
static void reregister(stk_client *c, struct stk_session *s, unsigned shard)
{
	struct open_ent *l;
	size_t n;

	/* Meta lost the room this session reserved too (quota.c). */
	atomic_fetch_add(&c->quota_epoch, 1);
	pthread_rwlock_wrlock(&s->reg);
	pthread_mutex_lock(&s->mu);
	l = copy_list(s->opens, s->n, &n);
	if (l) { /* the exact counts go, those not sent yet with them */
		for (size_t i = 0; i < s->n; i++) {
			if (stk_ino_shard(s->opens[i].ino) != shard || !s->opens[i].unsent)
				continue;
			s->opens[i].unsent = 0;
			s->nunsent--;
		}
	}
	keep_closes(s, shard);
	pthread_mutex_unlock(&s->mu);
	for (size_t i = 0; i < n; i++) {
		int rc;

		if (stk_ino_shard(l[i].ino) != shard)
			continue;
		rc = call_open(c, STK_OP_META_OPEN, s->id, l[i].ino, l[i].count, 1, NULL, NULL);
		if (rc && rc != -ENOENT)
			stk_warn("session: cannot register open inode %llu again: %s",
				 (unsigned long long)l[i].ino, stk_strerror(rc));
	}
	pthread_rwlock_unlock(&s->reg);
	free(l);
}

/* One META_CLOSES of n (at most STK_CLOSES_MAX) references, all of one shard's inodes. */
static int call_closes(stk_client *c, uint64_t id, const struct open_ent *l, size_t n)
{
	struct stk_msg_meta_closes_req m = {.session = id, .n = (uint32_t)n};
	size_t cap = 16 + n * 16; /* the header is 12 bytes, a record 13 */
	size_t resp_cap = 64 + n * 160, len = 0, k = 0;
	struct stk_msg_meta_closes_resp rm = {0};
	struct stk_lcache_tok tok;
	uint8_t *req = malloc(cap), *resp = malloc(resp_cap);
	struct stk_wbuf w;
	struct stk_rbuf rb;
	int rc, bad = 0;

	if (!req || !resp) {
		free(req);
		free(resp);
		return -ENOMEM;
	}
	stk_wbuf_init(&w, req, cap);
	stk_msg_meta_closes_req_enc(&w, &m);
	for (size_t i = 0; i < n; i++) {
		struct stk_msg_open_ref r = {
		    .ino = l[i].ino,
		    .count = l[i].count,
		    .flags = l[i].read ? STK_REF_READ | STK_REF_ATTR : 0};
		stk_msg_open_ref_enc(&w, &r);
	}
	if (w.err) {
		free(req);
		free(resp);
		stk_error("session: cannot encode %zu closes: %s", n, stk_strerror(w.err));
		return w.err;
	}
	/*
	 * The reads change atimes: this client forgets those itself (lcache.h), and
	 * keeps what meta says each read left (a reply from an older meta says nothing:
	 * they are looked up again).
	 */
	tok = stk_lcache_begin_at(c, stk_ino_shard(l[0].ino));
	rc = stk_client_meta_call_shard(c, stk_ino_shard(l[0].ino), tok.holder,
					STK_OP_META_CLOSES, req, w.len, resp, resp_cap, &len);
	stk_rbuf_init(&rb, resp, rc == 0 ? len : 0);
	if (rc == 0 && len)
		stk_msg_meta_closes_resp_dec(&rb, &rm);
	for (size_t i = 0; i < n; i++) {
		struct stk_msg_attr_rec rec;
		int keep = 0;

		if (!l[i].read)
			continue;
		if (k++ < rm.n && !rb.err && !bad) {
			stk_msg_attr_rec_dec(&rb, &rec);
			/* An answer for another inode: trust none of it from there on. */
			bad = rb.err || (rec.status == 0 && rec.attr.ino != l[i].ino);
			keep = !bad && rec.status == 0;
		}
		stk_lcache_updated(c, tok, l[i].ino, keep ? &rec.attr : NULL);
	}
	free(req);
	free(resp);
	return rc;
}

static int by_shard(const void *a, const void *b)
{
	unsigned x = stk_ino_shard(((const struct open_ent *)a)->ino);
	unsigned y = stk_ino_shard(((const struct open_ent *)b)->ino);

	return x < y ? -1 : x > y;
}

/*
 * Sends the queued closes: in META_CLOSES, each to the shard of its inodes, or
 * one by one to a meta without it.
 */
static void send_closes(stk_client *c, struct stk_session *s)
{
	struct open_ent *l;
	size_t n;

	pthread_mutex_lock(&s->mu);
	l = copy_list(s->closing, s->nclosing, &n);
	if (l)
		s->nclosing = 0;
	pthread_mutex_unlock(&s->mu);
	for (size_t i = 1; i < n; i++)
		if (stk_ino_shard(l[i].ino) != stk_ino_shard(l[0].ino)) {
			qsort(l, n, sizeof(*l), by_shard); /* one META_CLOSES per shard */
			break;
		}
	for (size_t i = 0, k; i < n; i += k) {
		unsigned shard = stk_ino_shard(l[i].ino);
		int rc;

		for (k = 1; i + k < n && k < STK_CLOSES_MAX && stk_ino_shard(l[i + k].ino) == shard;
		     k++)
			;
		rc = s->no_closes ? -ENOSYS : call_closes(c, s->id, l + i, k);

		if (rc == -ENOSYS)
			s->no_closes = 1;
		else if (rc)
			stk_debug("session: closing %zu inodes: %s (meta drops them with the session)",
				  k, stk_strerror(rc));
		for (size_t j = i; rc == -ENOSYS && j < i + k; j++) {
			int r = 0;

			if (l[j].read)
				stk_ino_setattr(c, NULL, l[j].ino, STK_SETATTR_ATIME_READ, NULL, NULL);
			if (l[j].count)
				r = call_open(c, STK_OP_META_CLOSE, s->id, l[j].ino, l[j].count, 0,
					      NULL, NULL);
			if (r)
				stk_debug("session: close of inode %llu: %s (meta drops it with "
					  "the session)",
					  (unsigned long long)l[j].ino, stk_strerror(r));
		}
	}
	free(l);
}

/* Under mu: the entry of ino in opens, or NULL. */
static struct open_ent *open_find(struct stk_session *s, uint64_t ino)
{
	for (size_t i = 0; i < s->n; i++)
		if (s->opens[i].ino == ino)
			return &s->opens[i];
	return NULL;
}

static int queue(struct stk_session *s, uint64_t ino, uint32_t count, int read);

/* Under mu: e goes from the list when nothing holds it any more. */
static void open_drop_if_done(struct stk_session *s, struct open_ent *e)
{
	if (!e->count && !e->sending)
		*e = s->opens[--s->n];
}

/*
 * Under mu: k opens of e's inode were sent (rc: how meta answered). Their held
 * closes go now; if meta refused them (the client was cut off past its lease and
 * the file went), those closes are dropped and the handles still open are
 * counted no more.
 */
static void opens_sent(struct stk_session *s, struct open_ent *e, uint32_t k, int rc)
{
	uint32_t closed = e->late < k ? e->late : k;

	e->sending -= k;
	if (rc) {
		stk_warn("session: the open of inode %llu reached meta late (%s): reads of it fail",
			 (unsigned long long)e->ino, stk_strerror(rc));
		e->late -= closed;
		k -= closed;
		e->count -= k < e->count ? k : e->count;
		if (e->unsent > e->count) {
			e->unsent = e->count;
			if (!e->unsent)
				s->nunsent--;
		}
	} else if (e->late && !e->sending) {
		if (!queue(s, e->ino, e->late, 0))
			stk_warn("session: out of memory queueing the close of inode %llu",
				 (unsigned long long)e->ino);
		e->late = 0;
	}
	open_drop_if_done(s, e);
}

/*
 * Sends the opens registered here only (all: every one there is when this is
 * called, and maybe later ones; else those that an earlier such call saw, the
 * others marked seen), after any flush already under way: they are at meta (or
 * refused) when this returns.
 */
static void send_opens(stk_client *c, struct stk_session *s, int all)
{
	size_t passes;
	uint32_t look;

	pthread_mutex_lock(&s->flush_mu);
	pthread_rwlock_rdlock(&s->reg);
	pthread_mutex_lock(&s->mu);
	look = all ? 0 : ++s->look ? s->look : ++s->look; /* 0 is "all" */
	/* Entries move while the lock is let go: each pass looks from the start. */
	passes = s->nunsent / 32 + 1;
	while (s->nunsent && passes--) {
		struct open_ent b[32];
		size_t k = 0;

		for (size_t i = 0; i < s->n && k < STK_ARRAY_SIZE(b); i++) {
			struct open_ent *e = &s->opens[i];

			if (!e->unsent)
				continue;
			if (look && (!e->seen || e->seen == look)) {
				e->seen = look; /* sent by a later look */
				continue;
			}
			b[k] = *e;
			b[k++].count = e->unsent;
			e->sending += e->unsent;
			e->unsent = 0;
			s->nunsent--;
		}
		if (!k)
			break;
		pthread_mutex_unlock(&s->mu);
		for (size_t j = 0; j < k; j++) {
			int rc = call_open(c, STK_OP_META_OPEN, s->id, b[j].ino, b[j].count, 0,
					   NULL, NULL);
			struct open_ent *e;

			pthread_mutex_lock(&s->mu);
			e = open_find(s, b[j].ino); /* kept while sending */
			if (e)
				opens_sent(s, e, b[j].count, rc);
			pthread_mutex_unlock(&s->mu);
		}
		pthread_mutex_lock(&s->mu);
	}
	if (s->nunsent)
		s->unsent_due_ns = stk_now_ns() + OPENS_GATHER_MS * 1000000ull;
	pthread_mutex_unlock(&s->mu);
	pthread_rwlock_unlock(&s->reg);
	pthread_mutex_unlock(&s->flush_mu);
}

static void *renew_main(void *arg)
{
	stk_client *c = arg;
	struct stk_session *s = c->sess;

	pthread_mutex_lock(&s->mu);
	while (!s->stop) {
		struct timespec ts;
		uint32_t lease = 0;
		int known = 1, rc;
		uint64_t due;

		if (stk_now_ns() >= s->next_renew_ns) {
			uint32_t used = atomic_load(&c->shards_used) | 1u;

			pthread_mutex_unlock(&s->mu);
			/* every shard it was named to keeps it; shard 1's lease sets the pace */
			for (unsigned k = STK_MAX_SHARDS; k >= 2; k--) {
				uint32_t l2 = 0;
				int kn = 1;

				if (!(used & (1u << (k - 1))))
					continue;
				if (call_session(c, k, STK_OP_META_SESSION, s->id, &l2, &kn) == 0 &&
				    !kn)
					reregister(c, s, k);
			}
			rc = call_session(c, 1, STK_OP_META_SESSION, s->id, &lease, &known);
			if (rc == 0 && !known)
				reregister(c, s, 1);
			pthread_mutex_lock(&s->mu);
			if (rc == 0 && lease)
				s->renew_ms = lease / 4 > MIN_RENEW_MS ? lease / 4 : MIN_RENEW_MS;
			else if (rc)
				stk_debug("session renewal: %s", stk_strerror(rc));
			s->next_renew_ns = stk_now_ns() + (uint64_t)s->renew_ms * 1000000ull;
		}
		if (s->nunsent && stk_now_ns() >= s->unsent_due_ns) {
			pthread_mutex_unlock(&s->mu);
			send_opens(c, s, 0);
			pthread_mutex_lock(&s->mu);
			continue;
		}
		if (s->nclosing) {
			int gather = s->nclosing < CLOSES_GATHER_MAX && !s->stop;
			pthread_mutex_unlock(&s->mu);
			if (gather)
				usleep(CLOSES_GATHER_MS * 1000);
			send_closes(c, s);
			pthread_mutex_lock(&s->mu);
			continue;
		}
		if (s->stop)
			break;
		/* Both clocks are CLOCK_MONOTONIC: wait until the next renewal is due. */
		due = s->next_renew_ns;
		if (s->nunsent && s->unsent_due_ns < due)
			due = s->unsent_due_ns;
		ts.tv_sec = (time_t)(due / 1000000000ull);
		ts.tv_nsec = (long)(due % 1000000000ull);
		pthread_cond_timedwait(&s->wake, &s->mu, &ts);
	}
	pthread_mutex_unlock(&s->mu);
	return NULL;
}

uint64_t stk_session_id(stk_client *c)
{
	struct stk_session *s = c->sess;
	uint64_t id;

	pthread_mutex_lock(&s->mu);
	if (!s->running && !s->off) {
		if (pthread_create(&s->thr, NULL, renew_main, c) == 0)
			s->running = 1;
		else
			stk_warn("session: cannot start the renewal thread");
	}
	id = s->off ? 0 : s->id;
	pthread_mutex_unlock(&s->mu);
	return id;
}

static void turn_off(struct stk_session *s)
{
	pthread_mutex_lock(&s->mu);
	if (!s->off)
		stk_debug("meta serves no sessions: open files and locks stay local");
	s->off = 1;
	pthread_mutex_unlock(&s->mu);
}

/* Under mu: one more open of ino (unsent: meta does not know of it yet). 0 or -ENOMEM. */
static int open_add(struct stk_session *s, uint64_t ino, int unsent)
{
	struct open_ent *e = open_find(s, ino);

	if (!e) {
		if (s->n == s->cap) {
			size_t cap = s->cap ? 2 * s->cap : 16;
			struct open_ent *p = realloc(s->opens, cap * sizeof(*p));

			if (!p)
				return -ENOMEM;
			s->opens = p;
			s->cap = cap;
		}
		e = &s->opens[s->n++];
		memset(e, 0, sizeof(*e));
		e->ino = ino;
	}
	e->count++;
	if (unsent && e->unsent == 0)
		e->seen = 0; /* not seen yet */
	if (unsent && e->unsent++ == 0 && s->nunsent++ == 0) {
		s->unsent_due_ns = stk_now_ns() + OPENS_GATHER_MS * 1000000ull;
		pthread_cond_signal(&s->wake);
	}
	return 0;
}

uint64_t stk_session_reg_begin(stk_client *c)
{
	uint64_t id = stk_session_id(c);

	pthread_rwlock_rdlock(&c->sess->reg);
	return id;
}

int stk_session_reg_end(stk_client *c, uint64_t id, uint64_t ino)
{
	struct stk_session *s = c->sess;
	int rc = 0;

	if (!id || !ino)
		goto out;
	pthread_mutex_lock(&s->mu);
	rc = open_add(s, ino, 0);
	pthread_mutex_unlock(&s->mu);
	if (rc)
		call_open(c, STK_OP_META_CLOSE, id, ino, 1, 0, NULL, NULL);
out:
	pthread_rwlock_unlock(&s->reg);
	return rc;
}

int stk_session_open(stk_client *c, uint64_t ino, struct stk_attr *attr)
{
	uint64_t id = stk_session_reg_begin(c);
	int have = 0, rc = 0;

	if (id) {
		rc = call_open(c, STK_OP_META_OPEN, id, ino, 1, 0, attr, &have);
		if (rc == -ENOSYS) {
			turn_off(c->sess);
			id = 0;
			rc = 0;
		}
	}
	if (rc) {
		stk_session_reg_end(c, 0, ino); /* nothing was registered */
		return rc;
	}
	rc = stk_session_reg_end(c, id, ino);
	return rc ? rc : have;
}

int stk_session_open_cached(stk_client *c, uint64_t ino, struct stk_attr *attr)
{
	struct stk_session *s = c->sess;
	uint64_t seq;
	int rc;

	if (!stk_session_id(c))
		return 0;
	pthread_mutex_lock(&s->mu);
	seq = s->remove_seq;
	pthread_mutex_unlock(&s->mu);
	if (!stk_lcache_get_ino(c, ino, attr))
		return 0;
	pthread_mutex_lock(&s->mu);
	/* A sync began since the cache answered: it may have missed this open. */
	rc = s->remove_seq == seq && !s->stop ? open_add(s, ino, 1) : -EAGAIN;
	pthread_mutex_unlock(&s->mu);
	return rc == 0;
}

void stk_session_sync_opens(stk_client *c)
{
	struct stk_session *s = c->sess;
	int ended;

	if (!s)
		return;
	pthread_mutex_lock(&s->mu);
	s->remove_seq++;
	ended = s->stop;
	pthread_mutex_unlock(&s->mu);
	/* Ended: META_SESSION_END dropped every reference (and an open now would start
	 * the session again at meta). */
	if (ended)
		return;
	/* Also waits for a flush under way: what it took is then at meta. */
	send_opens(c, s, 1);
}

/* Queues `count` closes of ino and, if read, a read to record; under mu. 0 if out of memory. */
static int queue(struct stk_session *s, uint64_t ino, uint32_t count, int read)
{
	size_t j;

	for (j = 0; j < s->nclosing && s->closing[j].ino != ino; j++)
		;
	if (j == s->nclosing) {
		if (s->nclosing == s->cap_closing) {
			size_t cap = s->cap_closing ? 2 * s->cap_closing : 16;
			struct open_ent *p = realloc(s->closing, cap * sizeof(*p));
			if (!p)
				return 0;
			s->closing = p;
			s->cap_closing = cap;
		}
		memset(&s->closing[j], 0, sizeof(s->closing[j]));
		s->closing[j].ino = ino;
		s->nclosing++;
	}
	s->closing[j].count += count;
	s->closing[j].read |= (uint8_t)read;
	pthread_cond_signal(&s->wake);
	return 1;
}

void stk_session_close(stk_client *c, uint64_t ino)
{
	struct stk_session *s = c->sess;
	struct open_ent *e;

	pthread_mutex_lock(&s->mu);
	e = open_find(s, ino);
	if (!e || !e->count)
		goto out; /* not registered (sessions off, or opened before a fork) */
	e->count--;
	if (e->unsent) {
		/* Meta never heard of one of them: neither goes. */
		if (--e->unsent == 0)
			s->nunsent--;
		open_drop_if_done(s, e);
		goto out;
	}
	if (e->sending) {
		e->late++; /* after its open (opens_sent) */
		goto out;
	}
	open_drop_if_done(s, e);
	/* Out of memory, meta keeps the reference until the session ends: only late. */
	if (!queue(s, ino, 1, 0))
		stk_warn("session: out of memory queueing the close of inode %llu",
			 (unsigned long long)ino);
out:
	pthread_mutex_unlock(&s->mu);
}

int stk_session_note_read(stk_client *c, uint64_t ino)
{
	struct stk_session *s = c->sess;
	int rc = -ENOSYS;

	pthread_mutex_lock(&s->mu);
	if (s->running && !s->off && !s->no_closes)
		rc = queue(s, ino, 0, 1) ? 0 : -ENOMEM;
	pthread_mutex_unlock(&s->mu);
	return rc;
}

void stk_session_end(stk_client *c)
{
	struct stk_session *s = c->sess;
	uint32_t lease;
	int known, ending;

	if (!s)
		return;
	pthread_mutex_lock(&s->mu);
	ending = !s->stop;
	s->stop = 1;
	pthread_cond_signal(&s->wake);
	pthread_mutex_unlock(&s->mu);
	if (ending && s->running) {
		uint32_t used = atomic_load(&c->shards_used) | 1u;

		pthread_join(s->thr, NULL);
		for (unsigned k = 1; k <= STK_MAX_SHARDS && !s->off; k++)
			if (used & (1u << (k - 1)))
				call_session(c, k, STK_OP_META_SESSION_END, s->id, &lease, &known);
	}
}

void stk_session_destroy(stk_client *c)
{
	struct stk_session *s = c->sess;

	if (!s)
		return;
	stk_session_end(c);
	free(s->opens);
	free(s->closing); /* META_SESSION_END dropped them */
	pthread_cond_destroy(&s->wake);
	pthread_mutex_destroy(&s->mu);
	pthread_mutex_destroy(&s->flush_mu);
	pthread_rwlock_destroy(&s->reg);
	free(s);
	c->sess = NULL;
}

void stk_session_after_fork(stk_client *c)
{
	struct stk_session *s = c->sess;

	/* The parent's thread, references and locks stay the parent's. */
	init_locks(s);
	s->id = new_id();
	s->running = 0;
	s->stop = 0;
	s->n = 0;
	s->nunsent = 0;
	s->nclosing = 0;
	s->renew_ms = FIRST_RENEW_MS;
	s->next_renew_ns = 0;
}
