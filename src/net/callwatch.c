/*
 * Calls to storage nodes that must not outwait a node the cluster gave up on
 * (net.h, stk_callwatch). A node cut off by the network answers nothing and
 * resets nothing: a call to it would wait out the RPC timeout (a minute), long
 * after mgmtd marked the node offline and the chain went on without it. Callers
 * register each call between its send and its reply; a thread of the watch looks
 * four times a second and, for every call older than `after_ms`, asks the owner
 * whether the node it went to is still one to wait for. If not, the call's
 * connection is shut down: its waiter (and every other call on that connection,
 * all to the same node) fails at once with a transport error, which callers
 * already treat as "refresh the routing table and send again".
 */
#include "net.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/util.h"
#include "../proto/msg.h"

#define WATCH_SLOTS 1024u
#define WATCH_TICK_MS 250u

struct watch_slot {
	void (*abort)(void *arg); /* NULL: free */
	void *arg;
	uint64_t t0; /* stk_now_ns() at begin */
	char addr[STK_ADDR_MAX];
};

struct stk_callwatch {
	pthread_mutex_t lock;
	pthread_cond_t cv; /* stop */
	struct watch_slot slots[WATCH_SLOTS];
	unsigned hint; /* where begin looks first */
	unsigned after_ms;
	int (*gone)(void *ctx, const char *addr);
	void *ctx;
	int stop;
	pthread_t thread;
};

/* One look: the old calls' addresses asked about outside the lock, then aborted. */
static void watch_look(struct stk_callwatch *w)
{
	char old[16][STK_ADDR_MAX]; /* the nodes of old calls, one question each */
	uint64_t cut = stk_now_ns() - (uint64_t)w->after_ms * 1000000ull;
	unsigned n = 0;

	pthread_mutex_lock(&w->lock);
	for (unsigned i = 0; i < WATCH_SLOTS && n < STK_ARRAY_SIZE(old); i++) {
		const struct watch_slot *s = &w->slots[i];
		int seen = 0;

		if (!s->abort || s->t0 > cut)
			continue;
		for (unsigned k = 0; k < n && !seen; k++)
			seen = strcmp(old[k], s->addr) == 0;
		if (!seen)
			memcpy(old[n++], s->addr, STK_ADDR_MAX);
	}
	pthread_mutex_unlock(&w->lock);
	for (unsigned k = 0; k < n; k++) {
		if (!w->gone(w->ctx, old[k]))
			continue;
		pthread_mutex_lock(&w->lock);
		for (unsigned i = 0; i < WATCH_SLOTS; i++) {
			struct watch_slot *s = &w->slots[i];

			if (s->abort && s->t0 <= cut && strcmp(s->addr, old[k]) == 0)
				s->abort(s->arg);
		}
		pthread_mutex_unlock(&w->lock);
	}
}

static void *watch_main(void *arg)
{
	struct stk_callwatch *w = arg;

	pthread_mutex_lock(&w->lock);
	while (!w->stop) {
		struct timespec ts;

		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += WATCH_TICK_MS * 1000000l;
		if (ts.tv_nsec >= 1000000000l) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000l;
		}
		pthread_cond_timedwait(&w->cv, &w->lock, &ts);
		if (w->stop)
			break;
		pthread_mutex_unlock(&w->lock);
		watch_look(w);
		pthread_mutex_lock(&w->lock);
	}
	pthread_mutex_unlock(&w->lock);
	return NULL;
}

int stk_callwatch_create(unsigned after_ms, int (*gone)(void *ctx, const char *addr), void *ctx,
			 struct stk_callwatch **out)
{
	struct stk_callwatch *w = calloc(1, sizeof(*w));
	int rc;

	*out = NULL;
	if (!w)
		return -ENOMEM;
	pthread_mutex_init(&w->lock, NULL);
	pthread_cond_init(&w->cv, NULL);
	w->after_ms = after_ms;
	w->gone = gone;
	w->ctx = ctx;
	rc = pthread_create(&w->thread, NULL, watch_main, w);
	if (rc) {
		pthread_mutex_destroy(&w->lock);
		pthread_cond_destroy(&w->cv);
		free(w);
		return -rc;
	}
	*out = w;
	return 0;
}

void stk_callwatch_destroy(struct stk_callwatch *w)
{
	int stopped;

	if (!w)
		return;
	pthread_mutex_lock(&w->lock);
	stopped = w->stop;
	w->stop = 1;
	pthread_cond_signal(&w->cv);
	pthread_mutex_unlock(&w->lock);
	if (!stopped)
		pthread_join(w->thread, NULL);
	pthread_mutex_destroy(&w->lock);
	pthread_cond_destroy(&w->cv);
	free(w);
}

static __thread struct stk_callwatch *thread_watch;

void stk_callwatch_set_thread(struct stk_callwatch *w)
{
	thread_watch = w;
}

struct stk_callwatch *stk_callwatch_thread(void)
{
	return thread_watch;
}

void stk_callwatch_after_fork(struct stk_callwatch *w)
{
	if (!w)
		return;
	/* The thread is the parent's; its lock may have been held at fork(). */
	pthread_mutex_init(&w->lock, NULL);
	pthread_cond_init(&w->cv, NULL);
	memset(w->slots, 0, sizeof(w->slots));
	w->stop = 0;
	if (pthread_create(&w->thread, NULL, watch_main, w))
		w->stop = 1; /* no thread: calls go unwatched, and destroy joins none */
}

static void abort_conn(void *arg)
{
	stk_conn_abort(arg);
}

int stk_callwatch_begin(struct stk_callwatch *w, struct stk_conn *c, const char *addr)
{
	return c ? stk_callwatch_begin_fn(w, abort_conn, c, addr) : -1;
}

int stk_callwatch_begin_fn(struct stk_callwatch *w, void (*abort)(void *arg), void *arg,
			   const char *addr)
{
	int slot = -1;

	if (!w || !abort)
		return -1;
	pthread_mutex_lock(&w->lock);
	for (unsigned k = 0; k < WATCH_SLOTS; k++) {
		unsigned i = (w->hint + k) % WATCH_SLOTS;
		struct watch_slot *s = &w->slots[i];

		if (s->abort)
			continue;
		s->abort = abort;
		s->arg = arg;
		s->t0 = stk_now_ns();
		snprintf(s->addr, sizeof(s->addr), "%s", addr);
		w->hint = (i + 1) % WATCH_SLOTS;
		slot = (int)i;
		break;
	}
	pthread_mutex_unlock(&w->lock);
	return slot; /* -1: every slot taken; this call is not watched */
}

void stk_callwatch_end(struct stk_callwatch *w, int slot)
{
	if (!w || slot < 0 || (unsigned)slot >= WATCH_SLOTS)
		return;
	pthread_mutex_lock(&w->lock);
	w->slots[slot].abort = NULL;
	pthread_mutex_unlock(&w->lock);
}
