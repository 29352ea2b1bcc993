/*
 * stk_wcost: the CPU a chunk update's file steps cost with system calls and through
 * io_uring, to decide which of them the storage node's event loop should submit to
 * its ring (docs/BENCHMARKS.md, "Transport").
 *
 *	stk_wcost DIR SIZE_KIB ROUNDS OPS
 *
 * A chunk update is: create a temporary file, write SIZE_KIB KiB into it, close
 * it, rename it over the chunk (src/storage/chunk.c). Three ways, alternated
 * round by round, OPS updates each:
 *
 *   syscalls  openat, pwrite, close, renameat;
 *   chain     one linked io_uring chain of the four (a direct descriptor), waited
 *             for (what a worker submitting them would do);
 *   write     openat, the pwrite through io_uring, close, renameat (the one step a
 *             loop could hand its ring without a kernel worker: buffered writes
 *             complete inline).
 *
 * CPU is getrusage(RUSAGE_SELF), which counts io_uring's kernel workers (threads of
 * this process). Prints each round and the median CPU per update of each way.
 */
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "../../src/common/util.h"

static double cpu_us(void)
{
	struct rusage ru;

	getrusage(RUSAGE_SELF, &ru);
	return (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e6 + ru.ru_utime.tv_usec +
	       ru.ru_stime.tv_usec;
}

static int by_syscalls(int dfd, const void *buf, size_t len)
{
	int fd = openat(dfd, "c.tmp", O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644);

	if (fd < 0)
		return -errno;
	if (pwrite(fd, buf, len, 0) != (ssize_t)len) {
		close(fd);
		return -EIO;
	}
	if (close(fd) < 0 || renameat(dfd, "c.tmp", dfd, "c"))
		return -errno;
	return 0;
}

static int reap(struct io_uring *r, int n)
{
	int rc = 0;

	for (int i = 0; i < n; i++) {
		struct io_uring_cqe *cqe;
		int e = io_uring_wait_cqe(r, &cqe);

		if (e)
			return e;
		if (cqe->res < 0 && !rc)
			rc = cqe->res;
		io_uring_cqe_seen(r, cqe);
	}
	return rc;
}

static int by_chain(struct io_uring *r, int dfd, const void *buf, size_t len)
{
	struct io_uring_sqe *sqe;

	sqe = io_uring_get_sqe(r);
	io_uring_prep_openat_direct(sqe, dfd, "c.tmp", O_CREAT | O_TRUNC | O_WRONLY, 0644, 0);
	sqe->flags |= IOSQE_IO_LINK;
	sqe = io_uring_get_sqe(r);
	io_uring_prep_write(sqe, 0, buf, (unsigned)len, 0);
	sqe->flags |= IOSQE_FIXED_FILE | IOSQE_IO_LINK;
	sqe = io_uring_get_sqe(r);
	io_uring_prep_close_direct(sqe, 0);
	sqe->flags |= IOSQE_IO_LINK;
	sqe = io_uring_get_sqe(r);
	io_uring_prep_renameat(sqe, dfd, "c.tmp", dfd, "c", 0);
	io_uring_submit(r);
	return reap(r, 4);
}

static int by_ring_write(struct io_uring *r, int dfd, const void *buf, size_t len)
{
	struct io_uring_sqe *sqe;
	int fd = openat(dfd, "c.tmp", O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644), rc;

	if (fd < 0)
		return -errno;
	sqe = io_uring_get_sqe(r);
	io_uring_prep_write(sqe, fd, buf, (unsigned)len, 0);
	io_uring_submit(r);
	rc = reap(r, 1);
	if (close(fd) < 0 && !rc)
		rc = -errno;
	if (!rc && renameat(dfd, "c.tmp", dfd, "c"))
		rc = -errno;
	return rc;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
	static const char *names[3] = {"syscalls", "chain", "write"};
	uint64_t kib, rounds, ops;
	double res[3][64];
	struct io_uring r;
	void *buf;
	int dfd, fixed = -1;

	if (argc != 5 || stk_parse_u64(argv[2], &kib) || stk_parse_u64(argv[3], &rounds) ||
	    stk_parse_u64(argv[4], &ops) || !kib || kib > 65536 || !rounds || rounds > 64 || !ops) {
		fprintf(stderr, "usage: stk_wcost DIR SIZE_KIB ROUNDS(1-64) OPS\n");
		return 2;
	}
	dfd = open(argv[1], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0 || posix_memalign(&buf, 4096, kib << 10)) {
		perror(argv[1]);
		return 1;
	}
	memset(buf, 0x5a, kib << 10);
	if (io_uring_queue_init(8, &r, 0) || io_uring_register_files(&r, &fixed, 1)) {
		fprintf(stderr, "io_uring not available\n");
		return 77;
	}
	for (uint64_t k = 0; k < rounds; k++) {
		for (int w = 0; w < 3; w++) {
			double t0 = cpu_us();

			for (uint64_t i = 0; i < ops; i++) {
				int rc = w == 0   ? by_syscalls(dfd, buf, kib << 10)
					 : w == 1 ? by_chain(&r, dfd, buf, kib << 10)
						  : by_ring_write(&r, dfd, buf, kib << 10);

				if (rc) {
					fprintf(stderr, "%s: %s\n", names[w], strerror(-rc));
					return 1;
				}
			}
			res[w][k] = (cpu_us() - t0) / (double)ops;
			printf("round %llu %s: %.1f us CPU per update\n", (unsigned long long)k + 1,
			       names[w], res[w][k]);
		}
	}
	for (int w = 0; w < 3; w++) {
		qsort(res[w], rounds, sizeof(double), cmp);
		printf("%s %llu KiB: median %.1f us CPU per update\n", names[w],
		       (unsigned long long)kib, res[w][rounds / 2]);
	}
	unlinkat(dfd, "c", 0);
	io_uring_queue_exit(&r);
	free(buf);
	close(dfd);
	return 0;
}
