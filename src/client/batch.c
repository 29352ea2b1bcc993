/*
 * Batched asynchronous I/O: stk_batch_submit queues many reads and writes in one
 * call, a few engine threads run them, stk_batch_reap hands back completions.
 *
 * Why engine threads and not the caller's: a data loader submits a batch, then
 * goes on decoding the previous one; the I/O must make progress meanwhile. Each
 * engine repeatedly fills a window of at most max_inflight / threads chunk pieces
 * from the queue (requests in submission order; a request larger than the window
 * is cut over several windows), runs the window with stk_io_run_multi (one pooled
 * connection per piece, so the pieces of one window are on the wire together,
 * spread over their chains and nodes), and posts the completions of the requests
 * it finished. With two engines one window is being sent while the other's
 * replies are read, so the wire is never idle between windows.
 *
 * Memory: the request slots, the two rings (pending, completed) and each engine's
 * window are allocated at create; submit and reap allocate nothing. The reply
 * buffers of a window are the engine's scratch, grown only when a larger chunk size
 * is first met.
 *
 * Locking: b->lock protects the slots' queue state, the rings, the free stack,
 * outstanding, stopping and the registered buffers. It is held only to move slot
 * indices between rings, never across I/O. A slot taken by an engine belongs to
 * that engine until it is pushed on the completed ring; reap returns it to the
 * free stack.
 *
 * The completion contract: a request accepted by submit reaches the completed ring
 * exactly once, with its result (bytes, or -errno). Requests invalid on their face
 * (unknown op, NULL buffer or file, a buffer outside the registered ones) are
 * accepted and complete with their error without touching storage.
 */
#include "client.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../common/layout.h"
#include "../common/log.h"
#include "../common/util.h"

#define BATCH_MAX_REGIONS 64
#define BATCH_MAX_INFLIGHT 1024
#define BATCH_MAX_THREADS 16
#define BATCH_MAX_DEPTH (1u << 20)

/* One submitted request. result: 0 while it is to run, or an error found at submit. */
struct slot {
	struct stk_batch_req req;
	int64_t result;
};

/* A FIFO of slot indices with room for every slot. */
struct ring {
	uint32_t *idx;
	unsigned head, count, cap;
};

static void ring_push(struct ring *r, uint32_t v)
{
	r->idx[(r->head + r->count) % r->cap] = v;
	r->count++;
}

static uint32_t ring_pop(struct ring *r)
{
	uint32_t v = r->idx[r->head];

	r->head = (r->head + 1) % r->cap;
	r->count--;
	return v;
}

/* A request with pieces in an engine's window. */
struct active {
	uint32_t slot;
	int op;		/* STK_IO_READ or STK_IO_WRITE */
	uint64_t start; /* the request's offset */
	uint64_t off;	/* next byte to cut into a piece */
	char *buf;	/* where that byte goes or comes from */
	size_t left;	/* bytes not yet cut */
	size_t total;	/* the request's length, clamped to the size for a read */
	int err;	/* first error of its pieces */
	struct stk_file_io io;
};

struct engine {
	struct stk_batch *b;
	pthread_t thread;
	int started;
	unsigned cap;		    /* pieces per window; also bounds the requests in one */
	struct stk_io_piece_ex *px; /* cap */
	uint32_t *owner;	    /* cap: index in act of each piece's request */
	struct active *act;	    /* cap */
	uint32_t *done;		    /* cap: finished slots, posted together */
	struct stk_io_scratch scratch;
};

struct stk_batch {
	stk_client *c;
	struct stk_batch_opts opts;
	pthread_mutex_t lock;
	pthread_cond_t work;  /* pending gained requests, or stopping was set */
	pthread_cond_t done;  /* completed gained entries */
	struct slot *slots;   /* queue_depth */
	uint32_t *free_stack; /* slots not in use */
	unsigned nfree;
	struct ring pending, completed;
	unsigned outstanding; /* accepted and not reaped */
	int stopping;
	struct {
		const char *base;
		size_t len;
	} regions[BATCH_MAX_REGIONS];
	unsigned nregions;
	unsigned nengines;
	struct engine *engines;
};

/* Takes the next pending slot. Waits for one only if `wait`. 0 if none (or stopping). */
static int take(struct stk_batch *b, uint32_t *slot, int wait)
{
	int got = 0;

	pthread_mutex_lock(&b->lock);
	while (wait && !b->pending.count && !b->stopping)
		pthread_cond_wait(&b->work, &b->lock);
	if (b->pending.count && !b->stopping) {
		*slot = ring_pop(&b->pending);
		got = 1;
	}
	pthread_mutex_unlock(&b->lock);
	return got;
}

static void post(struct stk_batch *b, const uint32_t *slots, unsigned n)
{
	if (!n)
		return;
	pthread_mutex_lock(&b->lock);
	for (unsigned i = 0; i < n; i++)
		ring_push(&b->completed, slots[i]);
	pthread_cond_broadcast(&b->done);
	pthread_mutex_unlock(&b->lock);
}

/*
 * Starts a request taken from the queue: checks it and asks its file for what the
 * pieces need. Returns 1 if it has bytes to move, 0 if it is already complete
 * (its slot's result set).
 */
static int begin(struct stk_batch *b, uint32_t s, struct active *a)
{
	struct slot *sl = &b->slots[s];
	const struct stk_batch_req *r = &sl->req;
	size_t len = r->len;
	int rc;

	if (sl->result < 0)
		return 0;
	a->slot = s;
	a->op = r->op == STK_BATCH_WRITE ? STK_IO_WRITE : STK_IO_READ;
	rc = stk_file_io_prep(r->file, a->op, r->offset, &len, &a->io);
	if (rc) {
		sl->result = rc;
		return 0;
	}
	if (len == 0) {
		sl->result = 0;
		return 0;
	}
	a->start = a->off = r->offset;
	a->buf = r->buf;
	a->left = a->total = len;
	a->err = 0;
	return 1;
}

/* Cuts pieces of a into the window from index *np, up to cap. */
static void cut(struct engine *e, struct active *a, uint32_t owner, unsigned *np)
{
	uint64_t cs = a->io.layout->chunk_size;

	while (a->left && *np < e->cap) {
		struct stk_io_piece_ex *x = &e->px[*np];
		uint64_t idx = a->off / cs;
		uint32_t in = (uint32_t)(a->off % cs);
		uint32_t take_len = (uint32_t)STK_MIN((uint64_t)a->left, cs - in);

		memset(x, 0, sizeof(*x));
		x->op = a->op;
		x->ino = a->io.ino;
		x->layout = a->io.layout;
		x->p.chain_id = stk_layout_chunk_chain(a->io.layout, a->io.chains, idx);
		x->p.chunk_idx = (uint32_t)idx;
		x->p.offset = in;
		x->p.length = take_len;
		x->p.buf = a->buf;
		e->owner[*np] = owner;
		(*np)++;
		a->buf += take_len;
		a->off += take_len;
		a->left -= take_len;
	}
}

static void *engine_main(void *arg)
{
	struct engine *e = arg;
	struct stk_batch *b = e->b;
	unsigned nact = 0; /* act[0] may be a request carried over, partly cut */

	for (;;) {
		unsigned np = 0, ndone = 0;

		if (nact)
			cut(e, &e->act[0], 0, &np);
		while (np < e->cap) {
			uint32_t s;

			if (!take(b, &s, np == 0 && nact == 0))
				break;
			if (!begin(b, s, &e->act[nact])) {
				post(b, &s, 1);
				continue;
			}
			cut(e, &e->act[nact], nact, &np);
			nact++;
		}
		if (np == 0 && nact == 0)
			break; /* stopping, and nothing of ours is left */
		stk_io_run_multi(b->c, e->px, np, e->cap, &e->scratch);
		for (unsigned i = 0; i < np; i++) {
			struct stk_io_piece *p = &e->px[i].p;
			struct active *a = &e->act[e->owner[i]];

			if (p->rc && !a->err)
				a->err = p->rc;
			else if (!p->rc && a->op == STK_IO_READ && p->done < p->length)
				memset(p->buf + p->done, 0, p->length - p->done); /* holes */
		}
		for (unsigned i = 0; i < nact; i++) {
			struct active *a = &e->act[i];

			if (a->left)
				continue; /* only the last one can be: it carries over */
			if (!a->err && a->op == STK_IO_WRITE)
				stk_file_io_wrote(b->slots[a->slot].req.file, a->start, a->total);
			else if (a->op == STK_IO_WRITE)
				stk_file_io_failed(b->slots[a->slot].req.file, a->start, a->err);
			b->slots[a->slot].result = a->err ? a->err : (int64_t)a->total;
			e->done[ndone++] = a->slot;
		}
		if (nact && e->act[nact - 1].left) {
			e->act[0] = e->act[nact - 1];
			nact = 1;
		} else {
			nact = 0;
		}
		post(b, e->done, ndone);
	}
	return NULL;
}

static void batch_free(struct stk_batch *b)
{
	for (unsigned i = 0; i < b->nengines; i++) {
		struct engine *e = &b->engines[i];
		free(e->px);
		free(e->owner);
		free(e->act);
		free(e->done);
		stk_io_scratch_free(&e->scratch);
	}
	free(b->engines);
	free(b->slots);
	free(b->free_stack);
	free(b->pending.idx);
	free(b->completed.idx);
	pthread_cond_destroy(&b->work);
	pthread_cond_destroy(&b->done);
	pthread_mutex_destroy(&b->lock);
	free(b);
}

static void stop_engines(struct stk_batch *b)
{
	pthread_mutex_lock(&b->lock);
	b->stopping = 1;
	/* Queued requests are cancelled; they would never be reaped. */
	while (b->pending.count) {
		uint32_t s = ring_pop(&b->pending);
		b->free_stack[b->nfree++] = s;
		b->outstanding--;
	}
	pthread_cond_broadcast(&b->work);
	pthread_mutex_unlock(&b->lock);
	for (unsigned i = 0; i < b->nengines; i++)
		if (b->engines[i].started)
			pthread_join(b->engines[i].thread, NULL);
}

int stk_batch_create(stk_client *c, const struct stk_batch_opts *opts, stk_batch **out)
{
	struct stk_batch_opts o = {0};
	pthread_condattr_t ca;
	struct stk_batch *b;
	unsigned depth;
	int rc = -ENOMEM;

	if (!c || !out)
		return -EINVAL;
	if (opts) {
		size_t n = opts->size < sizeof(o) ? opts->size : sizeof(o);
		memcpy(&o, opts, n);
	}
	o.size = sizeof(o);
	if (!o.max_inflight)
		o.max_inflight = 64;
	if (!o.queue_depth)
		o.queue_depth = 4096;
	if (!o.threads)
		o.threads = 2;
	if (o.max_inflight > BATCH_MAX_INFLIGHT || o.threads > BATCH_MAX_THREADS ||
	    o.queue_depth > BATCH_MAX_DEPTH)
		return -EINVAL;
	if (o.threads > o.max_inflight)
		o.threads = o.max_inflight;
	depth = o.queue_depth;

	b = calloc(1, sizeof(*b));
	if (!b)
		return -ENOMEM;
	b->c = c;
	b->opts = o;
	pthread_mutex_init(&b->lock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&b->done, &ca);
	pthread_condattr_destroy(&ca);
	pthread_cond_init(&b->work, NULL);
	b->slots = calloc(depth, sizeof(*b->slots));
	b->free_stack = calloc(depth, sizeof(*b->free_stack));
	b->pending.idx = calloc(depth, sizeof(uint32_t));
	b->completed.idx = calloc(depth, sizeof(uint32_t));
	b->engines = calloc(o.threads, sizeof(*b->engines));
	if (!b->slots || !b->free_stack || !b->pending.idx || !b->completed.idx || !b->engines)
		goto out;
	b->pending.cap = b->completed.cap = depth;
	for (unsigned i = 0; i < depth; i++)
		b->free_stack[i] = depth - 1 - i;
	b->nfree = depth;
	b->nengines = o.threads;
	for (unsigned i = 0; i < o.threads; i++) {
		struct engine *e = &b->engines[i];
		e->b = b;
		e->cap = STK_MAX(1u, o.max_inflight / o.threads);
		e->px = calloc(e->cap, sizeof(*e->px));
		e->owner = calloc(e->cap, sizeof(*e->owner));
		e->act = calloc(e->cap, sizeof(*e->act));
		e->done = calloc(e->cap, sizeof(*e->done));
		if (!e->px || !e->owner || !e->act || !e->done)
			goto out;
	}
	for (unsigned i = 0; i < o.threads; i++) {
		struct engine *e = &b->engines[i];
		if (pthread_create(&e->thread, NULL, engine_main, e)) {
			rc = -EAGAIN;
			goto out;
		}
		e->started = 1;
	}
	*out = b;
	return 0;
out:
	stop_engines(b);
	batch_free(b);
	return rc;
}

int stk_batch_register(stk_batch *b, void *buf, size_t len)
{
	int rc;

	if (!b || !buf || !len)
		return -EINVAL;
	pthread_mutex_lock(&b->lock);
	if (b->nregions == BATCH_MAX_REGIONS) {
		rc = -ENOSPC;
	} else {
		b->regions[b->nregions].base = buf;
		b->regions[b->nregions].len = len;
		rc = (int)b->nregions++;
	}
	pthread_mutex_unlock(&b->lock);
	return rc;
}

/* The error a request has on its face, or 0. Called with b->lock held. */
static int64_t check_req(const struct stk_batch *b, const struct stk_batch_req *r)
{
	const char *p = r->buf;
	int inside = b->nregions == 0;

	if (r->op != STK_BATCH_READ && r->op != STK_BATCH_WRITE)
		return -EINVAL;
	if (!r->file)
		return -EBADF;
	if (r->len == 0)
		return 0;
	if (!r->buf)
		return -EINVAL;
	for (unsigned i = 0; i < b->nregions && !inside; i++)
		inside = p >= b->regions[i].base && r->len <= b->regions[i].len &&
			 (size_t)(p - b->regions[i].base) <= b->regions[i].len - r->len;
	return inside ? 0 : -EFAULT;
}

int stk_batch_submit(stk_batch *b, const struct stk_batch_req *reqs, unsigned n)
{
	unsigned k = 0;

	if (!b || (!reqs && n))
		return -EINVAL;
	if (n == 0)
		return 0;
	pthread_mutex_lock(&b->lock);
	if (b->stopping) {
		pthread_mutex_unlock(&b->lock);
		return -ESHUTDOWN;
	}
	for (; k < n && b->nfree; k++) {
		uint32_t s = b->free_stack[--b->nfree];

		b->slots[s].req = reqs[k];
		b->slots[s].result = check_req(b, &reqs[k]);
		ring_push(&b->pending, s);
		b->outstanding++;
	}
	if (k > 1)
		pthread_cond_broadcast(&b->work);
	else if (k == 1)
		pthread_cond_signal(&b->work);
	pthread_mutex_unlock(&b->lock);
	return k ? (int)k : -EAGAIN;
}

int stk_batch_read(stk_batch *b, stk_file *f, uint64_t off, size_t len, void *buf,
		   uint64_t user_data)
{
	struct stk_batch_req r = {.op = STK_BATCH_READ,
				  .file = f,
				  .offset = off,
				  .buf = buf,
				  .len = len,
				  .user_data = user_data};
	int rc = stk_batch_submit(b, &r, 1);

	return rc < 0 ? rc : 0;
}

int stk_batch_reap(stk_batch *b, struct stk_completion *out, unsigned max, unsigned min_wait,
		   int timeout_ms)
{
	struct timespec until;
	unsigned n = 0;

	if (!b || (!out && max))
		return -EINVAL;
	if (timeout_ms > 0) {
		clock_gettime(CLOCK_MONOTONIC, &until);
		until.tv_sec += timeout_ms / 1000;
		until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
		if (until.tv_nsec >= 1000000000L) {
			until.tv_sec++;
			until.tv_nsec -= 1000000000L;
		}
	}
	pthread_mutex_lock(&b->lock);
	for (;;) {
		unsigned want = STK_MIN(STK_MIN(min_wait, max), b->outstanding);

		if (b->completed.count >= want || timeout_ms == 0)
			break;
		if (timeout_ms < 0) {
			pthread_cond_wait(&b->done, &b->lock);
		} else if (pthread_cond_timedwait(&b->done, &b->lock, &until) == ETIMEDOUT) {
			break;
		}
	}
	while (n < max && b->completed.count) {
		uint32_t s = ring_pop(&b->completed);

		out[n].user_data = b->slots[s].req.user_data;
		out[n].result = b->slots[s].result;
		n++;
		b->free_stack[b->nfree++] = s;
		b->outstanding--;
	}
	pthread_mutex_unlock(&b->lock);
	return (int)n;
}

unsigned stk_batch_outstanding(stk_batch *b)
{
	unsigned n;

	pthread_mutex_lock(&b->lock);
	n = b->outstanding;
	pthread_mutex_unlock(&b->lock);
	return n;
}

void stk_batch_destroy(stk_batch *b)
{
	if (!b)
		return;
	stop_engines(b);
	batch_free(b);
}
