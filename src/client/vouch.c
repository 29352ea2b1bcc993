/*
 * The client's vouchers (vouch.h): a fixed table of per-inode vouchers, indexed by
 * a hash of the inode number, and a short ring of ranges (META_INOS). Nothing here
 * is checked: the client cannot tell a good voucher from a bad one (it does not
 * hold the vouch key), and storage checks each as it comes.
 */
#include "vouch.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "../common/util.h"
#include "../proto/wire.h"

#define VOUCH_SLOTS 16384u
#define VOUCH_RANGES 8u
/* A voucher with less left than this is not sent: it could expire on its way. */
#define VOUCH_MARGIN_MS 1000u

struct stk_vouches {
	pthread_mutex_t mu;			    /* everything below */
	struct stk_msg_vouch_rec slot[VOUCH_SLOTS]; /* count 0: empty */
	struct stk_msg_vouch_rec range[VOUCH_RANGES];
	unsigned next_range;
};

int stk_vouches_create(struct stk_vouches **out)
{
	struct stk_vouches *v = calloc(1, sizeof(*v));

	*out = v;
	if (!v)
		return -ENOMEM;
	pthread_mutex_init(&v->mu, NULL);
	return 0;
}

void stk_vouches_destroy(struct stk_vouches *v)
{
	if (!v)
		return;
	pthread_mutex_destroy(&v->mu);
	free(v);
}

static unsigned slot_of(uint64_t ino)
{
	return (unsigned)((ino * 0x9E3779B97F4A7C15ull) >> 40) % VOUCH_SLOTS;
}

int stk_vouch_take(struct stk_vouches *v, uint32_t flags, const void *resp, size_t *len)
{
	const uint8_t *p = resp;
	struct stk_msg_vouch_rec rec;
	struct stk_rbuf r;
	size_t n, at;

	if (!(flags & STK_FRAME_VOUCH))
		return 0;
	if (*len < 2)
		return -EIO;
	n = (size_t)p[*len - 2] | (size_t)p[*len - 1] << 8;
	if (n < 1 || n > STK_VOUCH_MAX || *len - 2 < n * STK_VOUCH_REC_LEN)
		return -EIO;
	at = *len - 2 - n * STK_VOUCH_REC_LEN;
	stk_rbuf_init(&r, p + at, n * STK_VOUCH_REC_LEN);
	for (size_t i = 0; i < n; i++) {
		if (stk_msg_vouch_rec_dec(&r, &rec) || !rec.count)
			return -EIO;
		if (!v)
			continue;
		pthread_mutex_lock(&v->mu);
		if (rec.count == 1) {
			v->slot[slot_of(rec.ino)] = rec;
		} else {
			v->range[v->next_range] = rec;
			v->next_range = (v->next_range + 1) % VOUCH_RANGES;
		}
		pthread_mutex_unlock(&v->mu);
	}
	*len = at;
	return 0;
}

int stk_vouch_find(struct stk_vouches *v, uint64_t ino, struct stk_msg_vouch_rec *out)
{
	uint64_t due = stk_wall_ms() + VOUCH_MARGIN_MS;
	const struct stk_msg_vouch_rec *e;
	int found = 0;

	if (!v)
		return 0;
	pthread_mutex_lock(&v->mu);
	e = &v->slot[slot_of(ino)];
	if (e->count && e->ino == ino && e->expires_ms > due) {
		*out = *e;
		found = 1;
	}
	for (unsigned i = 0; !found && i < VOUCH_RANGES; i++) {
		e = &v->range[i];
		if (e->count && ino >= e->ino && ino - e->ino < e->count && e->expires_ms > due) {
			*out = *e;
			found = 1;
		}
	}
	pthread_mutex_unlock(&v->mu);
	return found;
}
