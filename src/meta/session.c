/*
 * Client sessions, open references, locks and orphan reaping on a meta node
 * (session.h).
 *
 * Three tables under one mutex: sessions (id -> last renewal), open references
 * ((ino, session) -> count, hashed by ino so that "is ino open?" walks one
 * chain), and the lock table of locks.h. Metadata calls are not the data path
 * and each holds the mutex for a few hash probes, so one mutex is enough; the
 * slow work (talking to storage) is done by the reaper thread without it.
 *
 * The reaper wakes twice a second, or when a reference of an unnamed file
 * drops to zero. It expires sessions past their lease and works through the
 * pending list: inodes that may be orphans without references. For each it
 * reads the inode: gone, nothing to do; named again (a hard link), only the
 * orphan record goes; still unnamed, the inode goes too, and the same
 * transaction records its chunks for meta's purger (purge.h), which removes
 * them from storage. Failures are retried after a second.
 */
#include "session.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "../common/layout.h"
#include "../common/log.h"
#include "../common/util.h"
#include "../net/net.h"
#include "../proto/msg.h"

#define SESS_BUCKETS 256
#define OREF_BUCKETS 4096
#define REAP_TICK_MS 500
#define REAP_RETRY_NS (1000ull * 1000000ull)
/* After a restart, orphans wait a lease and this much for their holders to come back. */
#define RESTART_MARGIN_NS (2000ull * 1000000ull)
#define MAX_ORPHANS_LOADED 65536

struct sess {
	uint64_t id;
	uint64_t last_ns;
	int renewed; /* META_SESSION has named it (see touch) */
	struct sess *next;
};

struct oref {
	uint64_t ino;
	uint64_t session;
	uint32_t count;
	struct oref *next;
};

struct reap {
	uint64_t ino;
	uint64_t not_before_ns;
};

struct stk_meta_sessions {
	struct stk_meta_store *store;
	struct stk_agent *agent;
	uint32_t lease_ms;
	pthread_mutex_t mu; /* everything below */
	pthread_cond_t wake;
	int stop;
	int started;
	pthread_t reaper;
	struct sess *sessions[SESS_BUCKETS];
	struct oref *orefs[OREF_BUCKETS];
	struct stk_lock_table *locks;
	struct reap *pending;
	size_t npending, cap_pending;
	int (*may_reap)(void *ctx); /* set before start; NULL: always */
	void *may_reap_ctx;
};

static const struct stk_cred root_cred;

static size_t hash64(uint64_t v, unsigned bits)
{
	return (size_t)((v * 0x9E3779B97F4A7C15ull) >> (64 - bits));
}

static struct sess **sess_slot(struct stk_meta_sessions *s, uint64_t id)
{
	struct sess **p = &s->sessions[hash64(id, 8)];

	while (*p && (*p)->id != id)
		p = &(*p)->next;
	return p;
}

static struct oref **oref_slot(struct stk_meta_sessions *s, uint64_t ino, uint64_t session)
{
	struct oref **p = &s->orefs[hash64(ino, 12)];

	while (*p && ((*p)->ino != ino || (*p)->session != session))
		p = &(*p)->next;
	return p;
}

int stk_meta_sessions_is_open(void *ctx, uint64_t ino)
{
	struct stk_meta_sessions *s = ctx;

	for (struct oref *r = s->orefs[hash64(ino, 12)]; r; r = r->next)
		if (r->ino == ino)
			return 1;
	return 0;
}

/*
 * With the mutex held: creates or renews session id. known is given by META_SESSION
 * only, and says 0 for a session it has not named before, also one that another
 * request (META_OPEN, META_CREATE, ...) created: after a meta restart, an open that
 * comes before the client's renewal must not hide the restart from it, or the
 * files it held before would never be registered again.
 */
static int touch(struct stk_meta_sessions *s, uint64_t id, int *known)
{
	struct sess **p, *n;

	if (id == 0)
		return -EINVAL;
	p = sess_slot(s, id);
	if (*p) {
		(*p)->last_ns = stk_now_ns();
		if (known) {
			*known = (*p)->renewed;
			(*p)->renewed = 1;
		}
		return 0;
	}
	n = calloc(1, sizeof(*n));
	if (!n)
		return -ENOMEM;
	n->id = id;
	n->last_ns = stk_now_ns();
	n->renewed = known != NULL;
	*p = n;
	if (known)
		*known = 0;
	return 0;
}

/* With the mutex held: queue ino for the reaper (a no-op for a file with names). */
static void pending_add(struct stk_meta_sessions *s, uint64_t ino, uint64_t not_before)
{
	for (size_t i = 0; i < s->npending; i++)
		if (s->pending[i].ino == ino)
			return;
	if (s->npending == s->cap_pending) {
		size_t cap = s->cap_pending ? 2 * s->cap_pending : 64;
		struct reap *p = realloc(s->pending, cap * sizeof(*p));
		if (!p) {
			stk_warn("out of memory: orphan %llu is reaped after a restart",
				 (unsigned long long)ino);
			return;
		}
		s->pending = p;
		s->cap_pending = cap;
	}
	s->pending[s->npending].ino = ino;
	s->pending[s->npending++].not_before_ns = not_before;
	pthread_cond_signal(&s->wake);
}

/* With the mutex held: ino lost its last reference; an orphan then goes. */
static void unreferenced(struct stk_meta_sessions *s, uint64_t ino)
{
	struct stk_attr a;

	if (stk_meta_sessions_is_open(s, ino))
		return;
	if (stk_meta_store_getattr(s->store, &root_cred, ino, &a) == 0 && a.nlink == 0)
		pending_add(s, ino, 0);
}

/* With the mutex held: drops everything of session id and the session itself. */
static void session_drop(struct stk_meta_sessions *s, uint64_t id)
{
	struct sess **sp = sess_slot(s, id), *victim = *sp;
	size_t nrefs = 0, nlocks;

	if (victim) {
		*sp = victim->next;
		free(victim);
	}
	for (size_t b = 0; b < OREF_BUCKETS; b++) {
		struct oref **p = &s->orefs[b];
		while (*p) {
			struct oref *r = *p;
			if (r->session != id) {
				p = &r->next;
				continue;
			}
			*p = r->next;
			nrefs++;
			unreferenced(s, r->ino);
			free(r);
		}
	}
	/* Room it reserved for writes it will never make (store.h, quotas). */
	stk_meta_store_quota_release_session(s->store, id);
	nlocks = stk_locktab_drop_session(s->locks, id);
	if (nrefs || nlocks)
		stk_info("session %016llx: dropped %zu open file(s) and %zu lock(s)",
			 (unsigned long long)id, nrefs, nlocks);
}

int stk_meta_sessions_create(struct stk_meta_store *st, uint32_t lease_ms,
			     struct stk_meta_sessions **out)
{
	struct stk_meta_sessions *s;
	const char *env = getenv("STOKER_SESSION_LEASE_MS");
	pthread_condattr_t ca;
	uint64_t v;
	int rc;

	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	rc = stk_locktab_create(&s->locks);
	if (rc) {
		free(s);
		return rc;
	}
	s->store = st;
	s->lease_ms = lease_ms ? lease_ms : STK_SESSION_LEASE_MS_DEFAULT;
	if (!lease_ms && env && *env) {
		if (stk_parse_u64(env, &v) == 0 && v >= 500 && v <= 3600000)
			s->lease_ms = (uint32_t)v;
		else
			stk_warn("ignoring STOKER_SESSION_LEASE_MS=%s (500 to 3600000)", env);
	}
	pthread_mutex_init(&s->mu, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&s->wake, &ca);
	pthread_condattr_destroy(&ca);
	stk_meta_store_set_open_hook(st, stk_meta_sessions_is_open, s);
	*out = s;
	return 0;
}

uint32_t stk_meta_sessions_lease_ms(const struct stk_meta_sessions *s)
{
	return s->lease_ms;
}

void stk_meta_sessions_hold(struct stk_meta_sessions *s)
{
	pthread_mutex_lock(&s->mu);
}

void stk_meta_sessions_release(struct stk_meta_sessions *s)
{
	pthread_mutex_unlock(&s->mu);
}

int stk_meta_sessions_renew(struct stk_meta_sessions *s, uint64_t session, int *known)
{
	int rc;

	pthread_mutex_lock(&s->mu);
	rc = touch(s, session, known);
	pthread_mutex_unlock(&s->mu);
	return rc;
}

void stk_meta_sessions_end(struct stk_meta_sessions *s, uint64_t session)
{
	pthread_mutex_lock(&s->mu);
	session_drop(s, session);
	pthread_mutex_unlock(&s->mu);
}

/* With the mutex held: count more references of session on ino (exactly count with set). */
static int oref_add(struct stk_meta_sessions *s, uint64_t session, uint64_t ino, uint32_t count,
		    int set)
{
	struct oref **p = oref_slot(s, ino, session), *r;

	if (*p) {
		if (set)
			(*p)->count = count;
		else if ((*p)->count + count < (*p)->count)
			(*p)->count = UINT32_MAX;
		else
			(*p)->count += count;
		return 0;
	}
	r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	r->ino = ino;
	r->session = session;
	r->count = count;
	*p = r;
	return 0;
}

int stk_meta_sessions_open(struct stk_meta_sessions *s, uint64_t session, uint64_t ino,
			   uint32_t count, int set, struct stk_attr *out)
{
	struct stk_attr a;
	int rc;

	if (count == 0)
		return -EINVAL;
	pthread_mutex_lock(&s->mu);
	rc = touch(s, session, NULL);
	if (rc)
		goto out;
	rc = stk_meta_store_getattr(s->store, &root_cred, ino, &a);
	if (rc)
		goto out;
	/*
	 * A file without a name opens again only for a session that still holds it
	 * (a reopen through /proc/self/fd), or for a client registering what it held
	 * before a restart (set), which the reaper's grace period waits for. Another
	 * session that still caches the name gets ENOENT, as a path open would, even
	 * while the unlinking client's close is still on its way (a mount's release
	 * comes after close() has returned).
	 */
	if (a.nlink == 0 && !set && !*oref_slot(s, ino, session)) {
		rc = -ENOENT;
		goto out;
	}
	rc = oref_add(s, session, ino, count, set);
	/* Read under the mutex, as the reference was added: no unlink came in between. */
	if (rc == 0 && out)
		*out = a;
out:
	pthread_mutex_unlock(&s->mu);
	return rc;
}

int stk_meta_sessions_open_held(struct stk_meta_sessions *s, uint64_t session, uint64_t ino)
{
	int rc = touch(s, session, NULL);

	return rc ? rc : oref_add(s, session, ino, 1, 0);
}

int stk_meta_sessions_close(struct stk_meta_sessions *s, uint64_t session, uint64_t ino,
			    uint32_t count)
{
	struct oref **p, *r;
	int rc;

	pthread_mutex_lock(&s->mu);
	rc = touch(s, session, NULL);
	if (rc)
		goto out;
	p = oref_slot(s, ino, session);
	r = *p;
	if (!r)
		goto out; /* already gone (expired, or meta restarted): nothing to drop */
	if (r->count > count) {
		r->count -= count;
		goto out;
	}
	*p = r->next;
	free(r);
	/* Its last close: the size it reported replaced the room it reserved. */
	stk_meta_store_quota_release(s->store, session, ino);
	unreferenced(s, ino);
out:
	pthread_mutex_unlock(&s->mu);
	return rc;
}

int stk_meta_sessions_lock(struct stk_meta_sessions *s, uint64_t ino, const struct stk_lock *want,
			   int test, struct stk_lock *conflict)
{
	int rc;

	pthread_mutex_lock(&s->mu);
	rc = touch(s, want->session, NULL);
	if (rc == 0) {
		if (test)
			rc = stk_locktab_test(s->locks, ino, want, conflict);
		else
			rc = stk_locktab_set(s->locks, ino, want, conflict);
	}
	pthread_mutex_unlock(&s->mu);
	return rc;
}

/* ---- the reaper ---- */

/* Without the mutex. 0 when ino is done with, -errno to retry later. */
static int reap_one(struct stk_meta_sessions *s, uint64_t ino)
{
	int rc;

	/*
	 * Only a serving meta reaps: a follower's sessions are not the leader's, and
	 * its store takes the leader's changes only (the leader's drop reaches it).
	 */
	if (s->may_reap && !s->may_reap(s->may_reap_ctx))
		return -EAGAIN;
	/* Dropping it records its chunks for the purge (purge.h), in the same transaction. */
	rc = stk_meta_store_orphan_drop(s->store, ino);
	if (rc == 0)
		stk_debug("orphan %llu reaped", (unsigned long long)ino);
	return rc == -ENOENT ? 0 : rc;
}

static void expire_sessions(struct stk_meta_sessions *s, uint64_t now)
{
	uint64_t lease_ns = (uint64_t)s->lease_ms * 1000000ull;

	for (size_t b = 0; b < SESS_BUCKETS; b++) {
		struct sess *n = s->sessions[b];
		while (n) {
			struct sess *next = n->next;
			if (now - n->last_ns > lease_ns) {
				stk_info("session %016llx expired (no renewal for %u ms)",
					 (unsigned long long)n->id, s->lease_ms);
				session_drop(s, n->id); /* frees n; next is still valid */
			}
			n = next;
		}
	}
}

static void wait_ms(struct stk_meta_sessions *s, unsigned ms)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	ts.tv_sec += ms / 1000;
	ts.tv_nsec += (long)(ms % 1000) * 1000000L;
	if (ts.tv_nsec >= 1000000000L) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000L;
	}
	pthread_cond_timedwait(&s->wake, &s->mu, &ts);
}

static void *reaper_main(void *arg)
{
	struct stk_meta_sessions *s = arg;

	pthread_mutex_lock(&s->mu);
	while (!s->stop) {
		uint64_t now = stk_now_ns();
		size_t i = 0;

		expire_sessions(s, now);
		while (i < s->npending && !s->stop) {
			struct reap r = s->pending[i];
			int rc;

			if (r.not_before_ns > now) {
				i++;
				continue;
			}
			/* Claimed again since it was queued (after a restart): its close requeues it. */
			s->pending[i] = s->pending[--s->npending];
			if (stk_meta_sessions_is_open(s, r.ino))
				continue;
			pthread_mutex_unlock(&s->mu);
			rc = reap_one(s, r.ino);
			pthread_mutex_lock(&s->mu);
			if (rc) {
				stk_debug("orphan %llu: %s; retrying", (unsigned long long)r.ino,
					  strerror(-rc));
				pending_add(s, r.ino, stk_now_ns() + REAP_RETRY_NS);
			}
			/* The list changed while unlocked: scan it again (retries wait a second). */
			now = stk_now_ns();
			i = 0;
		}
		wait_ms(s, REAP_TICK_MS);
	}
	pthread_mutex_unlock(&s->mu);
	return NULL;
}

void stk_meta_sessions_set_gate(struct stk_meta_sessions *s, int (*may_reap)(void *ctx), void *ctx)
{
	s->may_reap = may_reap;
	s->may_reap_ctx = ctx;
}

int stk_meta_sessions_start(struct stk_meta_sessions *s, struct stk_agent *agent)
{
	uint64_t *inos, grace;
	size_t n = 0;
	int rc;

	s->agent = agent;
	inos = malloc(MAX_ORPHANS_LOADED * sizeof(*inos));
	if (!inos)
		return -ENOMEM;
	rc = stk_meta_store_orphans(s->store, inos, MAX_ORPHANS_LOADED, &n);
	if (rc == 0) {
		grace = stk_now_ns() + (uint64_t)s->lease_ms * 1000000ull + RESTART_MARGIN_NS;
		pthread_mutex_lock(&s->mu);
		for (size_t i = 0; i < n; i++)
			pending_add(s, inos[i], grace);
		pthread_mutex_unlock(&s->mu);
		if (n)
			stk_info("%zu orphan(s) from before the restart: reaped unless reclaimed "
				 "within %u ms", n, s->lease_ms);
	}
	free(inos);
	if (rc)
		return rc;
	rc = -pthread_create(&s->reaper, NULL, reaper_main, s);
	if (rc == 0)
		s->started = 1;
	return rc;
}

void stk_meta_sessions_destroy(struct stk_meta_sessions *s)
{
	if (!s)
		return;
	if (s->started) {
		pthread_mutex_lock(&s->mu);
		s->stop = 1;
		pthread_cond_signal(&s->wake);
		pthread_mutex_unlock(&s->mu);
		pthread_join(s->reaper, NULL);
	}
	stk_meta_store_set_open_hook(s->store, NULL, NULL);
	for (size_t b = 0; b < SESS_BUCKETS; b++)
		for (struct sess *n = s->sessions[b], *next; n; n = next) {
			next = n->next;
			free(n);
		}
	for (size_t b = 0; b < OREF_BUCKETS; b++)
		for (struct oref *r = s->orefs[b], *next; r; r = next) {
			next = r->next;
			free(r);
		}
	stk_locktab_destroy(s->locks);
	free(s->pending);
	pthread_cond_destroy(&s->wake);
	pthread_mutex_destroy(&s->mu);
	free(s);
}
