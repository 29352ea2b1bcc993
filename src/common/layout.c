/*
 * Deterministic placement. The shuffle is computed lazily for only the entries a
 * layout needs: a partial Fisher-Yates over a virtual identity array, using a
 * small open-addressed swap map, so a layout over 100,000 chains costs
 * O(start + stripe), not O(nchains).
 */
#include "layout.h"

#include <errno.h>
#include <string.h>

uint64_t stk_splitmix64(uint64_t *state)
{
	uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

int stk_layout_check(const struct stk_layout *l)
{
	if (l->chunk_size < STK_MIN_CHUNK_SIZE || l->chunk_size > STK_MAX_CHUNK_SIZE ||
	    (l->chunk_size & (l->chunk_size - 1)))
		return -EINVAL;
	if (l->nchains == 0 || l->stripe == 0 || l->stripe > l->nchains ||
	    l->stripe > STK_MAX_STRIPE || l->start >= l->nchains)
		return -EINVAL;
	return 0;
}

void stk_layout_make(struct stk_layout *l, uint32_t chunk_size, uint32_t stripe,
		     uint32_t nchains, uint64_t entropy)
{
	uint64_t s = entropy;

	if (stripe == 0)
		stripe = 1;
	if (stripe > nchains)
		stripe = nchains;
	if (stripe > STK_MAX_STRIPE)
		stripe = STK_MAX_STRIPE;
	l->chunk_size = chunk_size;
	l->stripe = stripe;
	l->nchains = nchains;
	l->seed = stk_splitmix64(&s);
	l->start = nchains ? (uint32_t)(stk_splitmix64(&s) % nchains) : 0;
}

/* Sparse swap map: position -> value, for positions the shuffle has touched. */
/* The shuffle touches at most 2 * STK_MAX_STRIPE positions; keep the map under 1/4 full. */
#define STK_SWAP_SLOTS 2048
struct swap_map {
	uint32_t key[STK_SWAP_SLOTS];
	uint32_t val[STK_SWAP_SLOTS];
	uint8_t used[STK_SWAP_SLOTS];
};

static uint32_t *swap_slot(struct swap_map *m, uint32_t pos, uint32_t *dflt_out)
{
	uint32_t h = (pos * 2654435761u) & (STK_SWAP_SLOTS - 1);

	while (m->used[h] && m->key[h] != pos)
		h = (h + 1) & (STK_SWAP_SLOTS - 1);
	if (!m->used[h]) {
		m->used[h] = 1;
		m->key[h] = pos;
		m->val[h] = pos;
	}
	if (dflt_out)
		*dflt_out = m->val[h];
	return &m->val[h];
}

void stk_layout_chains(const struct stk_layout *l, uint32_t *chains)
{
	static __thread struct swap_map map;
	uint64_t state = l->seed;
	uint32_t n = l->nchains, need = l->stripe;
	uint32_t i;

	/*
	 * The permutation's first `stripe` entries are the file's chains; `start`
	 * rotates which chain takes chunk 0, so that files sharing a seed still spread
	 * their first chunks. Only `stripe` (<= 256) shuffle steps are taken.
	 */
	memset(map.used, 0, sizeof(map.used));
	for (i = 0; i < need; i++) {
		uint32_t j = i + (uint32_t)(stk_splitmix64(&state) % (n - i));
		uint32_t vi, vj;
		uint32_t *pi = swap_slot(&map, i, &vi);
		uint32_t *pj = swap_slot(&map, j, &vj);
		*pi = vj;
		*pj = vi;
	}
	for (i = 0; i < need; i++) {
		uint32_t v;
		swap_slot(&map, (i + l->start) % need, &v);
		chains[i] = v + 1;
	}
}
