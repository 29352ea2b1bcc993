/*
 * Disk reads through io_uring for one event loop of the storage node.
 *
 * Each loop of the RPC server (src/net/server.c) owns one stk_aio: a ring and an
 * eventfd that the ring signals when a read completes, which the loop watches. A
 * read is queued with stk_aio_readv, goes to the kernel with the next
 * stk_aio_submit (once per loop round, so a round's reads cost one system call),
 * and its callback runs from stk_aio_submit or stk_aio_reap, on the loop. Bytes in
 * the page cache are read inside the submit call itself (io_uring tries without
 * blocking first), so their callbacks run before stk_aio_submit returns; others
 * complete later, from the kernel's own workers, and wake the loop through the
 * eventfd. A short read is continued by this module; the callback sees the whole
 * read, its end of file, or an error.
 *
 * Contract: stk_aio_readv returning 0 means the callback runs exactly once (from
 * stk_aio_submit, stk_aio_reap or stk_aio_destroy); returning -errno means it
 * never runs. Nothing is allocated per read: a fixed set of read slots is made with
 * the ring.
 *
 * Thread rules: one thread at a time per stk_aio (the thread holding its loop).
 */
#ifndef STK_STORAGE_AIO_H
#define STK_STORAGE_AIO_H

#include <stdint.h>
#include <sys/uio.h>

struct stk_aio;

/* got: the bytes read (fewer only at the end of the file) or -errno. */
typedef void (*stk_aio_done_fn)(void *arg, long got);

/*
 * A ring with room for `depth` reads in flight (at most 4096). *fd is the eventfd
 * to watch for readable. 0, -ENOMEM, or the -errno of io_uring_queue_init (-ENOSYS
 * or -EPERM where io_uring is not allowed).
 */
int stk_aio_create(unsigned depth, struct stk_aio **out, int *fd);
/* Waits for every read in flight (their callbacks run) and frees the ring. */
void stk_aio_destroy(struct stk_aio *a);

/*
 * Queues a read of the n pieces of iov (at most 3; copied) from fd at off. 0, or
 * -EAGAIN when `depth` reads are in flight already.
 */
int stk_aio_readv(struct stk_aio *a, int fd, const struct iovec *iov, int n, uint64_t off,
		  stk_aio_done_fn done, void *arg);
/* Sends what was queued and runs the callbacks of the reads already done. */
void stk_aio_submit(struct stk_aio *a);
/* The eventfd was readable: runs the callbacks of the reads done since. */
void stk_aio_reap(struct stk_aio *a);
/* Reads queued or in flight. */
unsigned stk_aio_inflight(const struct stk_aio *a);

#endif
