/*
 * Meta's vouch epoch and log of moves (moves.h): a ring of the last
 * STK_META_MOVES_LOG file moves, each with the epoch of its rename, under one
 * mutex. A rename costs one lock and at most two slots; a storage node's question
 * (once a second) a walk of the moves it has not seen.
 */
#include "moves.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "../proto/msg.h"

struct moved {
	uint64_t ino, at;
};

struct stk_meta_moves {
	pthread_mutex_t lock;
	_Atomic uint64_t epoch; /* written under lock, read without */
	/* under lock */
	uint64_t base, wide, lost;
	unsigned head, n; /* ring[head] is the oldest of n */
	struct moved ring[STK_META_MOVES_LOG];
};

int stk_meta_moves_create(uint64_t base, struct stk_meta_moves **out)
{
	struct stk_meta_moves *mv = calloc(1, sizeof(*mv));

	*out = NULL;
	if (!mv)
		return -ENOMEM;
	pthread_mutex_init(&mv->lock, NULL);
	stk_meta_moves_restart(mv, base);
	*out = mv;
	return 0;
}

void stk_meta_moves_destroy(struct stk_meta_moves *mv)
{
	if (!mv)
		return;
	pthread_mutex_destroy(&mv->lock);
	free(mv);
}

void stk_meta_moves_restart(struct stk_meta_moves *mv, uint64_t base)
{
	pthread_mutex_lock(&mv->lock);
	mv->base = mv->wide = mv->lost = base;
	mv->head = mv->n = 0;
	atomic_store(&mv->epoch, base);
	pthread_mutex_unlock(&mv->lock);
}

uint64_t stk_meta_moves_epoch(struct stk_meta_moves *mv)
{
	return atomic_load(&mv->epoch);
}

uint64_t stk_meta_moves_rename(struct stk_meta_moves *mv, int wide, const uint64_t *inos,
			       unsigned n)
{
	uint64_t at;

	pthread_mutex_lock(&mv->lock);
	at = atomic_load(&mv->epoch) + 1;
	if (wide) {
		mv->wide = at;
	} else {
		for (unsigned i = 0; i < n; i++) {
			if (mv->n == STK_META_MOVES_LOG) { /* the oldest goes: it ends its era */
				if (mv->ring[mv->head].at > mv->lost)
					mv->lost = mv->ring[mv->head].at;
				mv->head = (mv->head + 1) % STK_META_MOVES_LOG;
				mv->n--;
			}
			mv->ring[(mv->head + mv->n) % STK_META_MOVES_LOG] =
			    (struct moved){.ino = inos[i], .at = at};
			mv->n++;
		}
	}
	/* after the record: a reply that shows this epoch shows what it moved */
	atomic_store(&mv->epoch, at);
	pthread_mutex_unlock(&mv->lock);
	return at;
}

int stk_meta_moves_enc(struct stk_meta_moves *mv, uint64_t since, struct stk_wbuf *w)
{
	struct stk_msg_meta_epoch_resp e;
	struct stk_msg_meta_moves_resp r;
	unsigned first, k = 0;

	pthread_mutex_lock(&mv->lock);
	e.epoch = atomic_load(&mv->epoch);
	r.base = mv->base;
	r.wide = mv->wide;
	r.lost = mv->lost;
	/* the ring is in epoch order: the moves after since are its last k */
	while (k < mv->n && mv->ring[(mv->head + mv->n - 1 - k) % STK_META_MOVES_LOG].at > since)
		k++;
	if (k > STK_MOVED_MAX) {
		struct moved *skip =
		    &mv->ring[(mv->head + mv->n - 1 - STK_MOVED_MAX) % STK_META_MOVES_LOG];

		if (skip->at > r.lost)
			r.lost = skip->at;
		k = STK_MOVED_MAX;
	}
	r.n = k;
	first = mv->head + mv->n - k;
	stk_msg_meta_epoch_resp_enc(w, &e);
	stk_msg_meta_moves_resp_enc(w, &r);
	for (unsigned i = 0; i < k; i++) {
		struct moved *m = &mv->ring[(first + i) % STK_META_MOVES_LOG];
		struct stk_msg_moved_rec rec = {.ino = m->ino, .at = m->at};

		stk_msg_moved_rec_enc(w, &rec);
	}
	pthread_mutex_unlock(&mv->lock);
	return w->err ? -ENOSPC : 0;
}
