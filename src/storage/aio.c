/*
 * Disk reads through io_uring for one event loop (aio.h).
 *
 * A read slot carries its own copy of the iovecs, so a short read is continued
 * from where it stopped without the caller's help; its user_data is the slot.
 *
 * The ring's eventfd wakes the loop for completions that come from the kernel's
 * workers. Around a submit it is switched off (io_uring_cq_eventfd_toggle): the
 * reads the submit itself completes (page cache hits) are reaped right after it,
 * and waking the loop for them once more would cost a round of epoll for nothing.
 * After switching it back on the completion queue is looked at once more, since a
 * read that completed in between signalled nobody.
 */
#include "aio.h"

#include <errno.h>
#include <liburing.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "../common/log.h"
#include "../common/util.h"

#define AIO_MAX_DEPTH 4096u

struct aio_op {
	struct aio_op *next; /* free list */
	struct iovec iov[3];
	int niov;
	int fd;
	uint64_t off; /* where iov[0] starts */
	long got;     /* bytes read so far */
	size_t left;  /* bytes still wanted */
	stk_aio_done_fn done;
	void *arg;
};

struct stk_aio {
	struct io_uring ring;
	int efd;
	int toggle_ok; /* the kernel lets the eventfd be switched off */
	unsigned inflight; /* slots taken */
	unsigned queued;   /* prepared since the last submit */
	struct aio_op *free;
	struct aio_op *ops;
};

int stk_aio_create(unsigned depth, struct stk_aio **out, int *fd)
{
	struct stk_aio *a;
	int rc;

	if (depth == 0 || depth > AIO_MAX_DEPTH)
		return -EINVAL;
	a = calloc(1, sizeof(*a));
	if (!a)
		return -ENOMEM;
	a->efd = -1;
	a->ops = calloc(depth, sizeof(*a->ops));
	if (!a->ops) {
		free(a);
		return -ENOMEM;
	}
	for (unsigned i = 0; i < depth; i++) {
		a->ops[i].next = a->free;
		a->free = &a->ops[i];
	}
	rc = io_uring_queue_init(depth, &a->ring, 0);
	if (rc) {
		free(a->ops);
		free(a);
		return rc;
	}
	a->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (a->efd < 0 || (rc = io_uring_register_eventfd(&a->ring, a->efd)) < 0) {
		rc = a->efd < 0 ? -errno : rc;
		if (a->efd >= 0)
			close(a->efd);
		io_uring_queue_exit(&a->ring);
		free(a->ops);
		free(a);
		return rc;
	}
	a->toggle_ok = io_uring_cq_eventfd_toggle(&a->ring, true) == 0;
	*fd = a->efd;
	*out = a;
	return 0;
}

/* Puts op's (remaining) read on the ring; the ring has room for every slot. */
static void aio_prep(struct stk_aio *a, struct aio_op *op)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&a->ring);

	if (!sqe) { /* the queue holds what was prepared since the last submit */
		io_uring_submit(&a->ring);
		a->queued = 0;
		sqe = io_uring_get_sqe(&a->ring);
	}
	io_uring_prep_readv(sqe, op->fd, op->iov, (unsigned)op->niov, op->off + (uint64_t)op->got);
	io_uring_sqe_set_data(sqe, op);
	a->queued++;
}

int stk_aio_readv(struct stk_aio *a, int fd, const struct iovec *iov, int n, uint64_t off,
		  stk_aio_done_fn done, void *arg)
{
	struct aio_op *op = a->free;

	if (!op)
		return -EAGAIN;
	if (n < 1 || n > 3)
		return -EINVAL;
	a->free = op->next;
	memcpy(op->iov, iov, sizeof(*iov) * (size_t)n);
	op->niov = n;
	op->fd = fd;
	op->off = off;
	op->got = 0;
	op->left = 0;
	for (int i = 0; i < n; i++)
		op->left += iov[i].iov_len;
	op->done = done;
	op->arg = arg;
	a->inflight++;
	aio_prep(a, op);
	return 0;
}

/* A completion: the read is done (callback, slot freed) or continued. */
static void aio_complete(struct stk_aio *a, struct aio_op *op, int res)
{
	if (res == -EAGAIN || res == -EINTR) {
		aio_prep(a, op);
		return;
	}
	if (res > 0 && (size_t)res < op->left) {
		struct iovec *iov = op->iov;
		int n = op->niov;

		op->got += res;
		op->left -= (size_t)res;
		stk_iov_advance(&iov, &n, (size_t)res);
		memmove(op->iov, iov, sizeof(*iov) * (size_t)n);
		op->niov = n;
		aio_prep(a, op);
		return;
	}
	if (res > 0)
		op->got += res;
	a->inflight--;
	op->next = a->free;
	a->free = op;
	op->done(op->arg, res < 0 ? (long)res : op->got);
}

/* Runs the callbacks of every completion waiting; callbacks may queue reads. */
static void aio_drain(struct stk_aio *a)
{
	struct io_uring_cqe *cqe;

	while (io_uring_peek_cqe(&a->ring, &cqe) == 0) {
		struct aio_op *op = io_uring_cqe_get_data(cqe);
		int res = cqe->res;

		io_uring_cqe_seen(&a->ring, cqe);
		aio_complete(a, op, res);
	}
}

void stk_aio_submit(struct stk_aio *a)
{
	while (a->queued) {
		int rc;

		if (a->toggle_ok)
			io_uring_cq_eventfd_toggle(&a->ring, false);
		a->queued = 0;
		rc = io_uring_submit(&a->ring);
		if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
			static int told;
			if (!told++)
				stk_error("io_uring submit: %s", strerror(-rc));
		}
		aio_drain(a);
		if (a->toggle_ok)
			io_uring_cq_eventfd_toggle(&a->ring, true);
		aio_drain(a); /* done between the drain and the switch: nobody was told */
	}
}

void stk_aio_reap(struct stk_aio *a)
{
	uint64_t v;

	if (read(a->efd, &v, sizeof(v)) < 0) {
		/* nothing was signalled: a look costs nothing */
	}
	aio_drain(a);
	stk_aio_submit(a); /* short reads continued */
}

unsigned stk_aio_inflight(const struct stk_aio *a)
{
	return a->inflight;
}

void stk_aio_destroy(struct stk_aio *a)
{
	if (!a)
		return;
	stk_aio_submit(a);
	while (a->inflight) {
		struct io_uring_cqe *cqe;
		int rc = io_uring_wait_cqe(&a->ring, &cqe);

		if (rc < 0 && rc != -EINTR && rc != -EAGAIN) {
			stk_error("io_uring wait: %s: %u reads left behind", strerror(-rc),
				  a->inflight);
			break;
		}
		aio_drain(a);
		stk_aio_submit(a);
	}
	io_uring_queue_exit(&a->ring);
	close(a->efd);
	free(a->ops);
	free(a);
}
