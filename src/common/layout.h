/*
 * Placement maths: which chain holds chunk i of a file.
 *
 * A file's layout (struct stk_layout, stored in its inode) names chunk_size, a
 * stripe count, the number of chains nchains that the chain table had when the
 * file was created, a start index and a seed. The seed drives a deterministic
 * shuffle of chain ids 1..nchains (a Fisher-Yates shuffle over our own splitmix64
 * generator, so it is the same on every client, architecture and release); the
 * file's chains are `stripe` consecutive entries of that permutation from `start`,
 * wrapping. Chunk i lives on chain number (i mod stripe) of that list.
 *
 * Because a layout only names chains by id among the first nchains, adding chains
 * to the table never moves an existing file's chunks, and meta is never asked
 * where data lives.
 */
#ifndef STK_LAYOUT_H
#define STK_LAYOUT_H

#include <stdint.h>

#include "../proto/msg.h"

#define STK_DEFAULT_CHUNK_SIZE (1u << 20)
#define STK_MIN_CHUNK_SIZE (64u << 10)
#define STK_MAX_CHUNK_SIZE (64u << 20)
#define STK_MAX_STRIPE 256

/* splitmix64 step: advances *state and returns the next value. */
uint64_t stk_splitmix64(uint64_t *state);

/*
 * Checks a layout: chunk size a power of two in [64 KiB, 64 MiB], stripe in
 * [1, min(nchains, STK_MAX_STRIPE)], start < nchains. 0 or -EINVAL.
 */
int stk_layout_check(const struct stk_layout *l);

/*
 * Makes a layout for a new file: stripe clamped to nchains, start and seed drawn
 * from `entropy` (any per-file value, e.g. the inode number mixed with time).
 */
void stk_layout_make(struct stk_layout *l, uint32_t chunk_size, uint32_t stripe,
		     uint32_t nchains, uint64_t entropy);

/*
 * Fills chains[0..stripe-1] with the chain ids of the layout, in stripe order.
 * chains must hold l->stripe entries. The layout must have passed stk_layout_check.
 */
void stk_layout_chains(const struct stk_layout *l, uint32_t *chains);

/* The chain id of chunk `chunk_idx`, given the list from stk_layout_chains. */
static inline uint32_t stk_layout_chunk_chain(const struct stk_layout *l, const uint32_t *chains,
					      uint64_t chunk_idx)
{
	return chains[chunk_idx % l->stripe];
}

#endif
