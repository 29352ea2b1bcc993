/*
 * The purge: meta removes the chunks of the files it freed.
 *
 * Every transaction that frees a regular file's inode records the file's layout
 * in the store's purge table (store.h, "Purges"). The purger is one thread that
 * drains that table: it reads a page of records, sends one STOR_TRUNCATES (size
 * 0) per chain of their layouts to the chain's head, which passes it down the
 * chain, and drops the records of the files whose every chain acknowledged. A
 * record whose chain did not answer (a node down, a chain being reshaped, a
 * fenced head) stays and is sent again on the next pass, a second later at the
 * soonest; a crash or restart of meta loses nothing, since the table is in the
 * store. (On a full map a freeing keeps its purge in the store's memory instead,
 * store.h; each round begins with those, and a restart before they are sent
 * leaves their chunks to stoker fsck as garbage.) Removal is idempotent (a
 * chunk already gone is no error), so sending a record twice is harmless.
 *
 * With replicated metadata the table is replicated like any other, and only the
 * leader sends, each page once its followers hold it (the gate below): a new
 * leader picks up where the old one stopped.
 *
 * Why meta and not the client that unlinked: a client killed right after its
 * unlink returned would leak the chunks forever, since nobody else knew of them.
 *
 * Rate: at most STOKER_PURGE_RATE files a second (default 20000), so that a
 * removal of millions of files does not crowd out the storage nodes' other work;
 * pages of up to STK_TRUNCATES_MAX records, so a burst of unlinks costs one
 * request per chain per page. The thread polls the table every 200 ms: unlinks in
 * between gather into one page.
 *
 * Threads: create and destroy from the daemon's main thread; stats from any.
 */
#ifndef STK_META_PURGE_H
#define STK_META_PURGE_H

#include <stdint.h>

#include "../mgmtd/agent.h"
#include "store.h"

struct stk_meta_purger;

/*
 * The gate (NULL: none, always go): called on the purger's thread after it read
 * a page of purges and before it sends any of them; nonzero lets it send. With
 * replicated metadata only the leader purges, and only what its followers hold:
 * a freeing the next leader would not know of must not remove a live file's
 * chunks (service.c, may_purge). It may block (for the followers); a page it
 * refuses is read again on a later pass.
 */
typedef int (*stk_meta_purge_gate_fn)(void *ctx);

/*
 * Starts the purger on st, sending through the agent's routing table (the agent
 * must outlive it), each page past gate(gate_ctx). 0, -ENOMEM or -errno from
 * creating the thread.
 */
int stk_meta_purger_start(struct stk_meta_store *st, struct stk_agent *agent,
			  stk_meta_purge_gate_fn gate, void *gate_ctx,
			  struct stk_meta_purger **out);
/* Stops the thread (waiting for the request in flight) and frees p. NULL: no-op. */
void stk_meta_purger_destroy(struct stk_meta_purger *p);

struct stk_meta_purge_stats {
	uint64_t inodes; /* files whose chunks were removed since start */
	uint64_t bytes;	 /* their sizes */
	uint64_t errors; /* chain requests that failed (and are retried) */
};
/* What the purger did since it started. Any thread. */
void stk_meta_purger_stats(struct stk_meta_purger *p, struct stk_meta_purge_stats *out);

#endif
