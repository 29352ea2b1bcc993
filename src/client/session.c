/*
 * The client's session with meta (session.h): the id, the renewal thread, and
 * the open references it registers.
 *
 * Opens and closes take `reg` for reading around their change to the list and
 * their request; the renewal thread takes it for writing when meta did not know
 * the session, so that it registers the list again (each inode with META_OPEN
 * set = 1, the exact count) while no open or close is in flight. A close
 * therefore never races a re-registration into a wrong count.
 */
#include "session.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "../common/log.h"
#include "../common/util.h"
#include "client.h"

#define FIRST_RENEW_MS 1000u
#define MIN_RENEW_MS 100u

struct open_ent {
	uint64_t ino;
	uint32_t count;
};

struct stk_session {
	pthread_rwlock_t reg; /* see above */
	pthread_mutex_t mu; /* everything below */
	pthread_cond_t wake;
	uint64_t id;
	int off; /* meta answered ENOSYS */
	int running;
	int stop;
	pthread_t thr;
	uint32_t renew_ms;
	struct open_ent *opens;
	size_t n, cap;
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

static int call_session(stk_client *c, uint16_t op, uint64_t id, uint32_t *lease_ms, int *known)
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
	rc = stk_client_meta_call(c, op, req, w.len, resp, sizeof(resp), &len);
	if (rc || op != STK_OP_META_SESSION)
		return rc;
	stk_rbuf_init(&rb, resp, len);
	if (stk_msg_meta_session_resp_dec(&rb, &r) || stk_rbuf_finish(&rb))
		return -EIO;
	*lease_ms = r.lease_ms;
	*known = r.known;
	return 0;
}

static int call_open(stk_client *c, uint16_t op, uint64_t id, uint64_t ino, uint32_t count, int set)
{
	struct stk_msg_meta_open_req m = {.session = id, .ino = ino, .count = count,
					  .set = (uint8_t)set};
	uint8_t req[64];
	struct stk_wbuf w;

	stk_wbuf_init(&w, req, sizeof(req));
	stk_msg_meta_open_req_enc(&w, &m);
	return stk_client_meta_call(c, op, req, w.len, NULL, 0, NULL);
}

/* After "session unknown": every open inode again, with its exact count. */
static void reregister(stk_client *c, struct stk_session *s)
{
	pthread_rwlock_wrlock(&s->reg);
	for (size_t i = 0; i < s->n; i++) {
		int rc = call_open(c, STK_OP_META_OPEN, s->id, s->opens[i].ino, s->opens[i].count, 1);
		if (rc && rc != -ENOENT)
			stk_warn("session: cannot register open inode %llu again: %s",
				 (unsigned long long)s->opens[i].ino, stk_strerror(rc));
	}
	pthread_rwlock_unlock(&s->reg);
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

		pthread_mutex_unlock(&s->mu);
		rc = call_session(c, STK_OP_META_SESSION, s->id, &lease, &known);
		if (rc == 0 && !known && s->n)
			reregister(c, s);
		pthread_mutex_lock(&s->mu);
		if (rc == 0 && lease)
			s->renew_ms = lease / 4 > MIN_RENEW_MS ? lease / 4 : MIN_RENEW_MS;
		else if (rc)
			stk_debug("session renewal: %s", stk_strerror(rc));
		clock_gettime(CLOCK_MONOTONIC, &ts);
		ts.tv_sec += s->renew_ms / 1000;
		ts.tv_nsec += (long)(s->renew_ms % 1000) * 1000000L;
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
		if (!s->stop)
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

int stk_session_open(stk_client *c, uint64_t ino)
{
	struct stk_session *s = c->sess;
	uint64_t id = stk_session_id(c);
	int rc;

	if (!id)
		return 0;
	pthread_rwlock_rdlock(&s->reg);
	rc = call_open(c, STK_OP_META_OPEN, id, ino, 1, 0);
	if (rc == -ENOSYS) {
		turn_off(s);
		rc = 0;
	} else if (rc == 0) {
		size_t i;
		pthread_mutex_lock(&s->mu);
		for (i = 0; i < s->n && s->opens[i].ino != ino; i++)
			;
		if (i < s->n) {
			s->opens[i].count++;
		} else {
			if (s->n == s->cap) {
				size_t cap = s->cap ? 2 * s->cap : 16;
				struct open_ent *p = realloc(s->opens, cap * sizeof(*p));
				if (!p)
					rc = -ENOMEM;
				else {
					s->opens = p;
					s->cap = cap;
				}
			}
			if (rc == 0) {
				s->opens[s->n].ino = ino;
				s->opens[s->n++].count = 1;
			}
		}
		pthread_mutex_unlock(&s->mu);
		if (rc)
			call_open(c, STK_OP_META_CLOSE, id, ino, 1, 0);
	}
	pthread_rwlock_unlock(&s->reg);
	return rc;
}

void stk_session_close(stk_client *c, uint64_t ino)
{
	struct stk_session *s = c->sess;
	size_t i;
	int held = 0, rc;

	pthread_rwlock_rdlock(&s->reg);
	pthread_mutex_lock(&s->mu);
	for (i = 0; i < s->n && s->opens[i].ino != ino; i++)
		;
	if (i < s->n) {
		held = 1;
		if (--s->opens[i].count == 0)
			s->opens[i] = s->opens[--s->n];
	}
	pthread_mutex_unlock(&s->mu);
	if (held) {
		rc = call_open(c, STK_OP_META_CLOSE, s->id, ino, 1, 0);
		if (rc)
			stk_debug("session: close of inode %llu: %s (meta drops it with the session)",
				  (unsigned long long)ino, stk_strerror(rc));
	}
	pthread_rwlock_unlock(&s->reg);
}

void stk_session_destroy(stk_client *c)
{
	struct stk_session *s = c->sess;
	uint32_t lease;
	int known;

	if (!s)
		return;
	pthread_mutex_lock(&s->mu);
	s->stop = 1;
	pthread_cond_signal(&s->wake);
	pthread_mutex_unlock(&s->mu);
	if (s->running) {
		pthread_join(s->thr, NULL);
		if (!s->off)
			call_session(c, STK_OP_META_SESSION_END, s->id, &lease, &known);
	}
	free(s->opens);
	pthread_cond_destroy(&s->wake);
	pthread_mutex_destroy(&s->mu);
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
	s->renew_ms = FIRST_RENEW_MS;
}
