/*
 * Helpers every module uses. Nothing here allocates except stk_mkdir_p's path copy
 * on the stack.
 */
#include "util.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <isa-l/crc.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

uint64_t stk_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t stk_wall_ms(void)
{
	int64_t sec;
	uint32_t nsec;

	stk_wall_time(&sec, &nsec);
	return sec < 0 ? 0 : (uint64_t)sec * 1000ull + nsec / 1000000u;
}

void stk_wall_time(int64_t *sec, uint32_t *nsec)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	*sec = ts.tv_sec;
	*nsec = (uint32_t)ts.tv_nsec;
}

uint32_t stk_crc32c(uint32_t crc, const void *buf, size_t len)
{
	/* ISA-L's crc32_iscsi takes and returns the inverted form; hide that here. */
	return ~crc32_iscsi((unsigned char *)buf, (int)len, ~crc);
}

void stk_crc32c_blocks(const void *buf, size_t len, size_t block, uint32_t *out)
{
	const uint8_t *p = buf;

	for (size_t i = 0; len; i++) {
		size_t n = len < block ? len : block;
		out[i] = stk_crc32c(0, p, n);
		p += n;
		len -= n;
	}
}

#if defined(__x86_64__)
/*
 * Copies three blocks and hashes each as it goes. One crc32 chain is bound by the
 * instruction's latency (three cycles on current cores) while a core can start
 * one every cycle: three independent chains keep it busy, and the loads that feed
 * them are the copy's, so each byte is read once and the value hashed is the
 * value stored.
 */
__attribute__((target("sse4.2"))) static void copy_crc3(const struct stk_crc_copy *v,
							 size_t block, uint32_t *out)
{
	const uint8_t *s0 = v[0].src, *s1 = v[1].src, *s2 = v[2].src;
	uint8_t *d0 = v[0].dst, *d1 = v[1].dst, *d2 = v[2].dst;
	uint64_t a = 0xFFFFFFFFu, b = 0xFFFFFFFFu, c = 0xFFFFFFFFu;

	for (size_t i = 0; i < block; i += 8) {
		uint64_t x, y, z;

		memcpy(&x, s0 + i, 8);
		memcpy(&y, s1 + i, 8);
		memcpy(&z, s2 + i, 8);
		a = _mm_crc32_u64(a, x);
		b = _mm_crc32_u64(b, y);
		c = _mm_crc32_u64(c, z);
		memcpy(d0 + i, &x, 8);
		memcpy(d1 + i, &y, 8);
		memcpy(d2 + i, &z, 8);
	}
	out[0] = ~(uint32_t)a;
	out[1] = ~(uint32_t)b;
	out[2] = ~(uint32_t)c;
}
#endif

void stk_crc32c_copy_blocks(const struct stk_crc_copy *v, size_t n, size_t block, uint32_t *out)
{
	size_t i = 0;

#if defined(__x86_64__)
	if (block % 8 == 0 && __builtin_cpu_supports("sse4.2")) {
		for (; i + 3 <= n; i += 3)
			copy_crc3(v + i, block, out + i);
		if (i < n) {
			/*
			 * One or two blocks left: the last one fills the idle lanes (it is
			 * copied again onto itself, its loads then come from the cache).
			 */
			struct stk_crc_copy w[3] = {v[i], v[n - 1], v[n - 1]};
			uint32_t o[3];

			copy_crc3(w, block, o);
			out[i] = o[0];
			out[n - 1] = o[1];
			i = n;
		}
	}
#endif
	for (; i < n; i++) {
		memcpy(v[i].dst, v[i].src, block);
		out[i] = stk_crc32c(0, v[i].dst, block);
	}
}

long stk_crc32c_blocks_check(const void *buf, size_t len, size_t block, const uint32_t *crcs)
{
	const uint8_t *p = buf;

	for (size_t i = 0; len; i++) {
		size_t n = len < block ? len : block;
		if (stk_crc32c(0, p, n) != crcs[i])
			return (long)i;
		p += n;
		len -= n;
	}
	return -1;
}

int stk_parse_u64(const char *s, uint64_t *out)
{
	char *end;
	unsigned long long v;

	if (!s || !*s || !isdigit((unsigned char)*s))
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno == ERANGE)
		return -ERANGE;
	if (*end)
		return -EINVAL;
	*out = v;
	return 0;
}

int stk_parse_size(const char *s, uint64_t *out)
{
	char *end;
	unsigned long long v;
	uint64_t mul = 1;

	if (!s || !*s || !isdigit((unsigned char)*s))
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno == ERANGE)
		return -ERANGE;
	switch (tolower((unsigned char)*end)) {
	case 0:
		break;
	case 'k':
		mul = 1ull << 10;
		break;
	case 'm':
		mul = 1ull << 20;
		break;
	case 'g':
		mul = 1ull << 30;
		break;
	case 't':
		mul = 1ull << 40;
		break;
	default:
		return -EINVAL;
	}
	if (*end) {
		end++;
		if (*end == 'i' || *end == 'I')
			end++;
		if (*end == 'b' || *end == 'B')
			end++;
		if (*end)
			return -EINVAL;
	}
	if (v > UINT64_MAX / mul)
		return -ERANGE;
	*out = v * mul;
	return 0;
}

char *stk_format_size(uint64_t bytes, char *buf, size_t len)
{
	static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
	double v = (double)bytes;
	size_t u = 0;

	while (v >= 1024 && u + 1 < STK_ARRAY_SIZE(units)) {
		v /= 1024;
		u++;
	}
	if (u == 0)
		snprintf(buf, len, "%llu B", (unsigned long long)bytes);
	else
		snprintf(buf, len, "%.1f %s", v, units[u]);
	return buf;
}

int stk_parse_hostport(const char *addr, char *host, size_t hostlen, uint16_t *port)
{
	const char *colon, *hstart = addr;
	size_t hlen;
	uint64_t p;

	if (!addr)
		return -EINVAL;
	if (addr[0] == '[') {
		const char *rb = strchr(addr, ']');
		if (!rb || rb[1] != ':')
			return -EINVAL;
		hstart = addr + 1;
		hlen = (size_t)(rb - hstart);
		colon = rb + 1;
	} else {
		colon = strrchr(addr, ':');
		if (!colon)
			return -EINVAL;
		hlen = (size_t)(colon - addr);
	}
	if (hlen == 0 || hlen >= hostlen)
		return -EINVAL;
	if (stk_parse_u64(colon + 1, &p) || p == 0 || p > 65535)
		return -EINVAL;
	memcpy(host, hstart, hlen);
	host[hlen] = 0;
	*port = (uint16_t)p;
	return 0;
}

int stk_strlcpy(char *dst, const char *src, size_t size)
{
	size_t n = strlen(src);

	if (size == 0)
		return -ENAMETOOLONG;
	if (n >= size) {
		memcpy(dst, src, size - 1);
		dst[size - 1] = 0;
		return -ENAMETOOLONG;
	}
	memcpy(dst, src, n + 1);
	return 0;
}

int stk_write_all(int fd, const void *buf, size_t len)
{
	const char *p = buf;

	while (len) {
		ssize_t n = write(fd, p, len);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

long stk_read_full(int fd, void *buf, size_t len)
{
	char *p = buf;
	size_t got = 0;

	while (got < len) {
		ssize_t n = read(fd, p + got, len - got);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (n == 0)
			break;
		got += (size_t)n;
	}
	return (long)got;
}

long stk_pread_full(int fd, void *buf, size_t len, uint64_t off)
{
	char *p = buf;
	size_t got = 0;

	while (got < len) {
		ssize_t n = pread(fd, p + got, len - got, (off_t)(off + got));
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (n == 0)
			break;
		got += (size_t)n;
	}
	return (long)got;
}

int stk_pwrite_all(int fd, const void *buf, size_t len, uint64_t off)
{
	const char *p = buf;

	while (len) {
		ssize_t n = pwrite(fd, p, len, (off_t)off);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p += n;
		off += (uint64_t)n;
		len -= (size_t)n;
	}
	return 0;
}

int stk_mkdir_p(const char *path, unsigned mode)
{
	char buf[PATH_MAX];
	size_t i, n = strlen(path);

	if (n == 0 || n >= sizeof(buf))
		return -ENAMETOOLONG;
	memcpy(buf, path, n + 1);
	for (i = 1; i <= n; i++) {
		if (buf[i] != '/' && buf[i] != 0)
			continue;
		char c = buf[i];
		buf[i] = 0;
		if (mkdir(buf, mode) < 0 && errno != EEXIST)
			return -errno;
		buf[i] = c;
	}
	return 0;
}

int stk_fsync_parent(const char *path)
{
	char dir[PATH_MAX];
	const char *slash = strrchr(path, '/');
	size_t n;
	int fd, rc = 0;

	if (!slash) {
		dir[0] = '.';
		dir[1] = 0;
	} else {
		n = slash == path ? 1 : (size_t)(slash - path);
		if (n >= sizeof(dir))
			return -ENAMETOOLONG;
		memcpy(dir, path, n);
		dir[n] = 0;
	}
	fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (fsync(fd) < 0)
		rc = -errno;
	close(fd);
	return rc;
}

int stk_write_file_atomic(const char *path, const void *buf, size_t len)
{
	char tmp[PATH_MAX];
	int fd, rc;

	if ((size_t)snprintf(tmp, sizeof(tmp), "%s.tmp", path) >= sizeof(tmp))
		return -ENAMETOOLONG;
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		return -errno;
	rc = stk_write_all(fd, buf, len);
	if (rc == 0 && fsync(fd) < 0)
		rc = -errno;
	if (close(fd) < 0 && rc == 0)
		rc = -errno;
	if (rc == 0 && rename(tmp, path) < 0)
		rc = -errno;
	if (rc) {
		unlink(tmp);
		return rc;
	}
	return stk_fsync_parent(path);
}

void stk_iov_advance(struct iovec **iov, int *n, size_t done)
{
	while (*n > 0 && done >= (*iov)->iov_len) {
		done -= (*iov)->iov_len;
		(*iov)++;
		(*n)--;
	}
	if (*n > 0) {
		(*iov)->iov_base = (char *)(*iov)->iov_base + done;
		(*iov)->iov_len -= done;
	}
}

/* ---- buffers for direct reads ---- */

#define HUGE_SZ ((size_t)2 << 20)
#define HUGE_MIN ((size_t)256 << 10) /* smaller buffers are ordinary pages */

/*
 * The mapping stk_huge_alloc keeps: before bytes (lead in whole pages) ending at
 * the boundary, then after bytes: whole huge pages, or whole pages for a small one.
 */
static void huge_span(size_t len, size_t lead, size_t *before, size_t *after)
{
	size_t pg = (size_t)sysconf(_SC_PAGESIZE);
	size_t rest = len > lead ? len - lead : 1;
	size_t unit = rest >= HUGE_MIN ? HUGE_SZ : pg;

	*before = (lead + pg - 1) / pg * pg;
	*after = (rest + unit - 1) / unit * unit;
}

void *stk_huge_alloc(size_t len, size_t lead)
{
	size_t before, after, slack, map;
	uint8_t *m, *at;

	huge_span(len, lead, &before, &after);
	slack = after % HUGE_SZ ? 0 : HUGE_SZ; /* room to find the boundary in */
	map = before + after + slack;
	m = mmap(NULL, map, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED)
		return NULL;
	at = m + before;
	if (slack) {
		at += HUGE_SZ - 1;
		at -= (uintptr_t)at % HUGE_SZ; /* before bytes or more past m */
		/* Only [at - before, at + after) is kept. */
		if (at - before > m)
			munmap(m, (size_t)(at - before - m));
		if (at + after < m + map)
			munmap(at + after, (size_t)(m + map - (at + after)));
		(void)madvise(at, after, MADV_HUGEPAGE); /* a hint: no huge pages is fine */
	}
	return at - lead;
}

void stk_huge_free(void *p, size_t len, size_t lead)
{
	size_t before, after;
	uint8_t *at = (uint8_t *)p + lead;

	if (!p)
		return;
	huge_span(len, lead, &before, &after);
	munmap(at - before, before + after);
}
