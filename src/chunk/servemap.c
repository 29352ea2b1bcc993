/*
 * Serve maps (see servemap.h for the format and why a reader can trust what it
 * reads through one): made, published and retired by the storage node
 * (src/storage/service.c), read by short-circuit readers (src/client/io.c).
 *
 * The state block is a seqlock with one writer (the node serialises
 * stk_serve_map_set). The bucket words are updated with atomic adds from any
 * thread of the node: a begin adds one event and one pending change, an end one
 * event and minus one pending change, so one add does both and no lock is taken.
 * Readers never write to serve.map (they map it read-only); their counts go to
 * serve.count.
 */
#include "servemap.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../common/util.h"

#define MAP_NAME "serve.map"
#define COUNT_NAME "serve.count"

/* serve.map: header offsets (servemap.h) */
#define OFF_MAGIC 0
#define OFF_FORMAT 4
#define OFF_NBUCKETS 8
#define OFF_INSTANCE 16
#define OFF_BOOT 24
#define BOOT_LEN 40
#define OFF_SEQ 64
#define OFF_VALID 72
#define OFF_TARGET 80
#define OFF_RETIRED 84
#define OFF_NCHAINS 88
#define OFF_CHAINS 96 /* STK_SERVE_MAP_CHAINS pairs of u32 */
#define OFF_BUCKETS 128

/* serve.count */
#define CNT_OFF_INSTANCE 8
#define CNT_OFF_READS 64
#define CNT_OFF_BYTES 72
#define CNT_LEN 4096

#define BUCKETS_MIN 64u
#define BUCKETS_MAX (1u << 20)
#define PENDING_BITS 20
#define PENDING_MASK ((1ull << PENDING_BITS) - 1)
#define EVENT (1ull << PENDING_BITS)

struct stk_serve_map {
	uint8_t *base; /* serve.map, mapped: read-write for the node, read-only for readers */
	size_t len;
	uint8_t *cnt; /* serve.count, mapped read-write; NULL: this reader counts nothing */
	uint64_t *buckets;
	uint32_t mask;	    /* nbuckets - 1 */
	uint32_t expect_id; /* a reader's: the target the routing table names */
	int writer;
};

static uint64_t *u64_at(const struct stk_serve_map *m, size_t off)
{
	return (uint64_t *)(m->base + off);
}

static uint32_t *u32_at(const struct stk_serve_map *m, size_t off)
{
	return (uint32_t *)(m->base + off);
}

/*
 * This boot's id, read once per process; "" where /proc cannot tell it, which no
 * map carries as its own (a node that cannot read it writes zeros, refused too).
 */
static char boot_id[BOOT_LEN];
static pthread_once_t boot_once = PTHREAD_ONCE_INIT;

static void boot_read(void)
{
	char buf[BOOT_LEN];
	long n;
	int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return;
	n = stk_read_full(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return;
	while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == ' '))
		n--;
	memset(boot_id, 0, sizeof(boot_id));
	memcpy(boot_id, buf, (size_t)n);
}

static const char *this_boot(void)
{
	pthread_once(&boot_once, boot_read);
	return boot_id;
}

static int path_of(char *out, const char *dir, const char *name, const char *suffix)
{
	int n = snprintf(out, PATH_MAX, "%s/%s%s", dir, name, suffix);

	return n < 0 || n >= PATH_MAX ? -ENAMETOOLONG : 0;
}

/* Marks an old map at path retired, if there is one we can write to. */
static void retire_old(const char *path)
{
	uint8_t hdr[OFF_BUCKETS];
	struct stk_serve_map old = {0};
	int fd = open(path, O_RDWR | O_CLOEXEC);

	if (fd < 0)
		return;
	if (pread(fd, hdr, sizeof(hdr), 0) != (ssize_t)sizeof(hdr) || memcmp(hdr, "STKS", 4))
		goto out;
	old.base = mmap(NULL, OFF_BUCKETS, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (old.base == MAP_FAILED)
		goto out;
	__atomic_store_n(u32_at(&old, OFF_RETIRED), 1, __ATOMIC_SEQ_CST);
	__atomic_store_n(u64_at(&old, OFF_VALID), 0, __ATOMIC_SEQ_CST);
	__atomic_fetch_or(u64_at(&old, OFF_SEQ), 1, __ATOMIC_SEQ_CST);
	munmap(old.base, OFF_BUCKETS);
out:
	close(fd);
}

/*
 * Makes dir/name afresh, len bytes of zeros with mode `mode` whatever the umask,
 * through a temporary file renamed into place once init (may be NULL) has filled
 * its map. The map stays mapped in *base.
 */
static int make_file(const char *dir, const char *name, size_t len, mode_t mode,
		     void (*init)(uint8_t *base, void *arg), void *arg, uint8_t **base)
{
	char tmp[PATH_MAX], path[PATH_MAX], sfx[32];
	int fd, rc;

	snprintf(sfx, sizeof(sfx), ".tmp.%d", (int)getpid());
	rc = path_of(tmp, dir, name, sfx);
	rc = rc ? rc : path_of(path, dir, name, "");
	if (rc)
		return rc;
	fd = open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
	if (fd < 0)
		return -errno;
	if (fchmod(fd, mode) < 0 || ftruncate(fd, (off_t)len) < 0) {
		rc = -errno;
		goto fail;
	}
	*base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (*base == MAP_FAILED) {
		rc = -errno;
		goto fail;
	}
	if (init)
		init(*base, arg);
	if (rename(tmp, path) < 0) {
		rc = -errno;
		munmap(*base, len);
		goto fail;
	}
	close(fd);
	return 0;
fail:
	close(fd);
	unlink(tmp);
	return rc;
}

struct init_arg {
	uint64_t instance;
	uint32_t nbuckets;
};

static void init_map(uint8_t *b, void *arg)
{
	const struct init_arg *a = arg;
	uint16_t format = STK_SERVE_MAP_FORMAT;

	memcpy(b + OFF_MAGIC, "STKS", 4);
	memcpy(b + OFF_FORMAT, &format, 2);
	memcpy(b + OFF_NBUCKETS, &a->nbuckets, 4);
	memcpy(b + OFF_INSTANCE, &a->instance, 8);
	memcpy(b + OFF_BOOT, this_boot(), BOOT_LEN);
}

static void init_count(uint8_t *b, void *arg)
{
	const struct init_arg *a = arg;
	uint16_t format = STK_SERVE_MAP_FORMAT;

	memcpy(b, "STKR", 4);
	memcpy(b + 4, &format, 2);
	memcpy(b + CNT_OFF_INSTANCE, &a->instance, 8);
}

int stk_serve_map_create(const char *dir, struct stk_serve_map **out)
{
	struct init_arg a = {.nbuckets = STK_SERVE_MAP_BUCKETS};
	char path[PATH_MAX];
	struct stk_serve_map *m;
	int rc;

	*out = NULL;
	rc = path_of(path, dir, MAP_NAME, "");
	if (rc)
		return rc;
	if (getrandom(&a.instance, sizeof(a.instance), 0) != (ssize_t)sizeof(a.instance))
		a.instance = stk_now_ns() ^ ((uint64_t)getpid() << 40);
	m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	m->writer = 1;
	m->len = OFF_BUCKETS + (size_t)a.nbuckets * 8;
	m->mask = a.nbuckets - 1;
	/* Before anything new is made: whoever reads the old map stops now. */
	retire_old(path);
	rc = make_file(dir, COUNT_NAME, CNT_LEN, 0666, init_count, &a, &m->cnt);
	if (rc)
		goto fail;
	rc = make_file(dir, MAP_NAME, m->len, 0644, init_map, &a, &m->base);
	if (rc)
		goto fail;
	m->buckets = u64_at(m, OFF_BUCKETS);
	*out = m;
	return 0;
fail:
	if (m->cnt)
		munmap(m->cnt, CNT_LEN);
	free(m);
	return rc;
}

void stk_serve_map_set(struct stk_serve_map *m, uint32_t target_id,
		       const struct stk_serve_chain *chains, unsigned n, uint64_t valid_until)
{
	uint64_t *seq = u64_at(m, OFF_SEQ);
	uint64_t s = __atomic_load_n(seq, __ATOMIC_RELAXED);
	uint32_t *cw = u32_at(m, OFF_CHAINS);
	int same;

	n = n < STK_SERVE_MAP_CHAINS ? n : STK_SERVE_MAP_CHAINS;
	/* Unchanged (a heartbeat that does not move the deadline): a read in flight stays. */
	same = __atomic_load_n(u64_at(m, OFF_VALID), __ATOMIC_RELAXED) == valid_until &&
	       __atomic_load_n(u32_at(m, OFF_TARGET), __ATOMIC_RELAXED) == target_id &&
	       __atomic_load_n(u32_at(m, OFF_NCHAINS), __ATOMIC_RELAXED) == n;
	for (unsigned i = 0; same && i < n; i++)
		same = __atomic_load_n(&cw[2 * i], __ATOMIC_RELAXED) == chains[i].id &&
		       __atomic_load_n(&cw[2 * i + 1], __ATOMIC_RELAXED) == chains[i].version;
	if (same)
		return;
	__atomic_store_n(seq, s + 1, __ATOMIC_RELAXED);
	__atomic_thread_fence(__ATOMIC_RELEASE);
	__atomic_store_n(u64_at(m, OFF_VALID), valid_until, __ATOMIC_RELAXED);
	__atomic_store_n(u32_at(m, OFF_TARGET), target_id, __ATOMIC_RELAXED);
	__atomic_store_n(u32_at(m, OFF_NCHAINS), n, __ATOMIC_RELAXED);
	for (unsigned i = 0; i < n; i++) {
		__atomic_store_n(&cw[2 * i], chains[i].id, __ATOMIC_RELAXED);
		__atomic_store_n(&cw[2 * i + 1], chains[i].version, __ATOMIC_RELAXED);
	}
	__atomic_store_n(seq, s + 2, __ATOMIC_RELEASE);
}

static uint64_t *bucket(const struct stk_serve_map *m, uint64_t ino, uint32_t idx)
{
	uint64_t k = (ino * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)idx * 0xBF58476D1CE4E5B9ull);

	return &m->buckets[(k >> 32) & m->mask];
}

void stk_serve_map_pending_begin(struct stk_serve_map *m, uint64_t ino, uint32_t idx)
{
	/* Sequentially consistent: seen by any reader that sees the chunk file change. */
	__atomic_add_fetch(bucket(m, ino, idx), EVENT + 1, __ATOMIC_SEQ_CST);
}

void stk_serve_map_pending_end(struct stk_serve_map *m, uint64_t ino, uint32_t idx)
{
	__atomic_add_fetch(bucket(m, ino, idx), EVENT - 1, __ATOMIC_SEQ_CST);
}

void stk_serve_map_counts(const struct stk_serve_map *m, uint64_t *reads, uint64_t *bytes)
{
	*reads =
	    m->cnt ? __atomic_load_n((uint64_t *)(m->cnt + CNT_OFF_READS), __ATOMIC_RELAXED) : 0;
	*bytes =
	    m->cnt ? __atomic_load_n((uint64_t *)(m->cnt + CNT_OFF_BYTES), __ATOMIC_RELAXED) : 0;
}

/* Maps dir/serve.count read-write if this process may and it belongs to instance. */
static uint8_t *open_count(const char *dir, uint64_t instance)
{
	char path[PATH_MAX];
	uint8_t hdr[16];
	uint8_t *p = NULL;
	struct stat st;
	uint64_t inst;
	int fd;

	if (path_of(path, dir, COUNT_NAME, ""))
		return NULL;
	fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0)
		return NULL;
	if (fstat(fd, &st) == 0 && st.st_size >= CNT_LEN &&
	    pread(fd, hdr, sizeof(hdr), 0) == (ssize_t)sizeof(hdr) && memcmp(hdr, "STKR", 4) == 0) {
		memcpy(&inst, hdr + CNT_OFF_INSTANCE, 8);
		if (inst == instance) {
			p = mmap(NULL, CNT_LEN, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
			if (p == MAP_FAILED)
				p = NULL;
		}
	}
	close(fd);
	return p;
}

int stk_serve_map_open_reader(const char *dir, uint32_t expect_id, struct stk_serve_map **out)
{
	uint8_t hdr[OFF_BUCKETS];
	char path[PATH_MAX];
	struct stk_serve_map *m = NULL;
	uint32_t nb;
	uint16_t format;
	uint64_t instance;
	struct stat st;
	int fd, rc;

	*out = NULL;
	rc = path_of(path, dir, MAP_NAME, "");
	if (rc)
		return rc;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (fstat(fd, &st) < 0) {
		rc = -errno;
		goto out;
	}
	rc = -EBADMSG;
	if (pread(fd, hdr, sizeof(hdr), 0) != (ssize_t)sizeof(hdr) || memcmp(hdr, "STKS", 4))
		goto out;
	memcpy(&format, hdr + OFF_FORMAT, 2);
	memcpy(&nb, hdr + OFF_NBUCKETS, 4);
	memcpy(&instance, hdr + OFF_INSTANCE, 8);
	if (format != STK_SERVE_MAP_FORMAT || nb < BUCKETS_MIN || nb > BUCKETS_MAX ||
	    (nb & (nb - 1)) || (uint64_t)st.st_size < OFF_BUCKETS + (uint64_t)nb * 8)
		goto out;
	rc = -ESTALE;
	if (!this_boot()[0] || memcmp(hdr + OFF_BOOT, this_boot(), BOOT_LEN))
		goto out;
	rc = -ENOMEM;
	m = calloc(1, sizeof(*m));
	if (!m)
		goto out;
	m->len = OFF_BUCKETS + (size_t)nb * 8;
	m->mask = nb - 1;
	m->expect_id = expect_id;
	m->base = mmap(NULL, m->len, PROT_READ, MAP_SHARED, fd, 0);
	if (m->base == MAP_FAILED) {
		rc = -errno;
		free(m);
		m = NULL;
		goto out;
	}
	m->buckets = u64_at(m, OFF_BUCKETS);
	m->cnt = open_count(dir, instance);
	*out = m;
	rc = 0;
out:
	close(fd);
	return rc;
}

uint64_t stk_serve_map_instance(const struct stk_serve_map *m)
{
	uint64_t v;

	memcpy(&v, m->base + OFF_INSTANCE, 8);
	return v;
}

int stk_serve_map_read_begin(const struct stk_serve_map *m, uint32_t chain_id, uint32_t chain_ver,
			     uint64_t ino, uint32_t idx, struct stk_serve_snap *s)
{
	uint64_t *seq = u64_at(m, OFF_SEQ);
	const uint32_t *cw = u32_at(m, OFF_CHAINS);
	uint64_t s1, s2, valid;
	uint32_t tid, n, ver = 0;
	int listed = 0;

	s1 = __atomic_load_n(seq, __ATOMIC_ACQUIRE);
	if (__atomic_load_n(u32_at(m, OFF_RETIRED), __ATOMIC_RELAXED))
		return -ENODEV;
	if (s1 & 1)
		return -EAGAIN;
	valid = __atomic_load_n(u64_at(m, OFF_VALID), __ATOMIC_RELAXED);
	tid = __atomic_load_n(u32_at(m, OFF_TARGET), __ATOMIC_RELAXED);
	n = __atomic_load_n(u32_at(m, OFF_NCHAINS), __ATOMIC_RELAXED);
	for (uint32_t i = 0; i < n && i < STK_SERVE_MAP_CHAINS && !listed; i++) {
		listed = __atomic_load_n(&cw[2 * i], __ATOMIC_RELAXED) == chain_id;
		ver = __atomic_load_n(&cw[2 * i + 1], __ATOMIC_RELAXED);
	}
	__atomic_thread_fence(__ATOMIC_ACQUIRE);
	s2 = __atomic_load_n(seq, __ATOMIC_RELAXED);
	if (s1 != s2)
		return -EAGAIN;
	if (!valid || tid != m->expect_id)
		return -EPERM;
	if (!listed || ver != chain_ver)
		return -ESTALE;
	if (valid != STK_SERVE_FOREVER && stk_now_ns() >= valid) /* a vDSO call, no syscall */
		return -ETIMEDOUT;
	s->seq = s1;
	s->word = bucket(m, ino, idx);
	s->bucket = __atomic_load_n(s->word, __ATOMIC_ACQUIRE);
	if (s->bucket & PENDING_MASK)
		return -EINPROGRESS;
	return 0;
}

int stk_serve_map_read_end(const struct stk_serve_map *m, const struct stk_serve_snap *s)
{
	/* The read's loads (of the chunk file or its map) come before these. */
	__atomic_thread_fence(__ATOMIC_ACQUIRE);
	if (__atomic_load_n(s->word, __ATOMIC_RELAXED) != s->bucket ||
	    __atomic_load_n(u64_at(m, OFF_SEQ), __ATOMIC_RELAXED) != s->seq)
		return -EAGAIN;
	return 0;
}

void stk_serve_map_count(struct stk_serve_map *m, uint64_t bytes)
{
	if (!m->cnt)
		return;
	__atomic_add_fetch((uint64_t *)(m->cnt + CNT_OFF_READS), 1, __ATOMIC_RELAXED);
	__atomic_add_fetch((uint64_t *)(m->cnt + CNT_OFF_BYTES), bytes, __ATOMIC_RELAXED);
}

void stk_serve_map_close(struct stk_serve_map *m)
{
	if (!m)
		return;
	if (m->writer) {
		__atomic_store_n(u32_at(m, OFF_RETIRED), 1, __ATOMIC_SEQ_CST);
		__atomic_store_n(u64_at(m, OFF_VALID), 0, __ATOMIC_SEQ_CST);
		__atomic_fetch_or(u64_at(m, OFF_SEQ), 1, __ATOMIC_SEQ_CST);
	}
	munmap(m->base, m->len);
	if (m->cnt)
		munmap(m->cnt, CNT_LEN);
	free(m);
}
