/*
 * Unit test of the chunk store (src/storage/chunk.c), driven directly without a
 * network: round trips at offsets straddling blocks, partial overwrites against a
 * model, holes, short reads, truncate, corruption detection, a full file system,
 * concurrent writers, the chunk lock's waiter queue, reopening a target, and the cache of open chunk files.
 *
 * The full-disk case mounts a 2 MiB tmpfs and so needs root; without it that case
 * is skipped and the rest still runs. Exit 0 pass, 1 fail, 77 skip.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/layout.h"
#include "common/util.h"
#include "proto/msg.h"
#include "storage/chunk.h"
#include "check.h"

#define CHUNK (256u << 10)

static char g_root[256];

static uint64_t g_rng = 42;

static uint32_t rnd(uint32_t n)
{
	return (uint32_t)(stk_splitmix64(&g_rng) % n);
}

static void fill(uint8_t *p, size_t n, uint8_t seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)(seed + i * 7 + (i >> 12));
}

static int file_path(struct stk_chunk_store *cs, uint64_t ino, uint32_t idx, char *out, size_t len)
{
	return snprintf(out, len, "%s/chunks/%02x/%llx/%u", stk_chunk_store_path(cs),
			(unsigned)(ino & 0xff), (unsigned long long)ino, idx) >= (int)len;
}

static int exists(const char *p)
{
	struct stat sb;
	return stat(p, &sb) == 0;
}

static uint64_t nchunks(struct stk_chunk_store *cs)
{
	uint64_t cap, used, n = 0;
	stk_chunk_store_stat(cs, &cap, &used, &n);
	return n;
}

static int test_round_trip(struct stk_chunk_store *cs)
{
	static uint8_t w[20000], r[CHUNK];
	uint32_t len = 0;

	fill(w, sizeof(w), 1);
	REQUIRE(stk_chunk_write(cs, 0x10, 0, CHUNK, 3000, w, 10000, NULL, 0, &len) == 0);
	REQUIRE(len == 13000);
	/* The whole chunk: a hole of zeros, then the data, then the end. */
	REQUIRE(stk_chunk_read(cs, 0x10, 0, 0, r, CHUNK, NULL) == 13000);
	for (int i = 0; i < 3000; i++)
		REQUIRE(r[i] == 0);
	REQUIRE(memcmp(r + 3000, w, 10000) == 0);
	/* Reads that start and end inside blocks, and one inside a single block. */
	REQUIRE(stk_chunk_read(cs, 0x10, 0, 4095, r, 2, NULL) == 2);
	REQUIRE(r[0] == w[1095] && r[1] == w[1096]);
	REQUIRE(stk_chunk_read(cs, 0x10, 0, 5000, r, 7000, NULL) == 7000);
	REQUIRE(memcmp(r, w + 2000, 7000) == 0);
	REQUIRE(stk_chunk_read(cs, 0x10, 0, 8192, r, 4096, NULL) == 4096);
	REQUIRE(memcmp(r, w + 5192, 4096) == 0);
	/* Short read at the end, nothing past it, missing chunks read as 0 bytes. */
	REQUIRE(stk_chunk_read(cs, 0x10, 0, 12900, r, 8192, NULL) == 100);
	REQUIRE(memcmp(r, w + 9900, 100) == 0);
	REQUIRE(stk_chunk_read(cs, 0x10, 0, 13000, r, 10, NULL) == 0);
	REQUIRE(stk_chunk_read(cs, 0x10, 0, 200000, r, 10, NULL) == 0);
	REQUIRE(stk_chunk_read(cs, 0x10, 1, 0, r, 10, NULL) == 0);
	REQUIRE(stk_chunk_read(cs, 0x11, 0, 0, r, 10, NULL) == 0);
	/* A write past the chunk size is refused. */
	REQUIRE(stk_chunk_write(cs, 0x10, 0, CHUNK, CHUNK - 10, w, 11, NULL, 0, &len) == -EINVAL);
	REQUIRE(stk_chunk_write(cs, 0x10, 0, 0, 0, w, 1, NULL, 0, &len) == -EINVAL);
	/* A hole in a new chunk. */
	REQUIRE(stk_chunk_write(cs, 0x12, 3, CHUNK, 100000, w, 50, NULL, STK_WRITE_SYNC, &len) == 0);
	REQUIRE(len == 100050);
	REQUIRE(stk_chunk_read(cs, 0x12, 3, 0, r, CHUNK, NULL) == 100050);
	for (int i = 0; i < 100000; i++)
		REQUIRE(r[i] == 0);
	REQUIRE(memcmp(r + 100000, w, 50) == 0);
	return 0;
}

/* What test_versions' callback saw. */
static int then_calls;
static uint64_t then_now;

static int count_then(void *ctx, const struct stk_chunk_wver *v)
{
	(void)ctx;
	then_calls++;
	then_now = v->now;
	return v->now == 99 ? -EPIPE : 0;
}

/*
 * Chunk versions (chunk.h): each change counts one up from 0 (missing), a base
 * that is not the chunk's refuses the change, a set version and a whole-chunk
 * replacement land as given, the callback runs under the lock after a landed
 * change and its error is the call's, a truncate's cut counts too.
 */
static int test_versions(struct stk_chunk_store *cs)
{
	static uint8_t w[20000], r[CHUNK];
	struct stk_chunk_wver v = {.base = STK_CHUNK_VER_ANY, .then = count_then};
	uint64_t ver;
	uint32_t len = 0, clen;

	fill(w, sizeof(w), 9);
	REQUIRE(stk_chunk_version(cs, 0x70, 0, &ver, &clen) == 0 && ver == 0 && clen == 0);
	REQUIRE(stk_chunk_write_ver(cs, 0x70, 0, CHUNK, 0, w, 5000, NULL, 0, &v, &len) == 0);
	REQUIRE(v.old == 0 && v.now == 1 && then_calls == 1 && then_now == 1);
	REQUIRE(stk_chunk_write(cs, 0x70, 0, CHUNK, 100, w, 10, NULL, 0, &len) == 0);
	REQUIRE(stk_chunk_version(cs, 0x70, 0, &ver, &clen) == 0 && ver == 2 && clen == 5000);
	/* A base that is not the chunk's: nothing written, no callback. */
	v.base = 1;
	REQUIRE(stk_chunk_write_ver(cs, 0x70, 0, CHUNK, 0, w + 1, 10, NULL, 0, &v, &len) ==
		-EUCLEAN);
	REQUIRE(v.old == 2 && then_calls == 1);
	REQUIRE(stk_chunk_read(cs, 0x70, 0, 0, r, 20, NULL) == 20 && memcmp(r, w, 20) == 0);
	/* The right base and a set version, as a predecessor numbered it. */
	v.base = 2;
	v.set = 7;
	REQUIRE(stk_chunk_write_ver(cs, 0x70, 0, CHUNK, 6000, w, 100, NULL, 0, &v, &len) == 0);
	REQUIRE(v.now == 7 && len == 6100 && then_now == 7);
	/* A whole-chunk replacement shortens it to exactly what was sent. */
	v.base = STK_CHUNK_VER_ANY;
	v.set = 12;
	v.full = 1;
	REQUIRE(stk_chunk_write_ver(cs, 0x70, 0, CHUNK, 0, w + 7, 3000, NULL, 0, &v, &len) == 0);
	REQUIRE(len == 3000 && v.now == 12);
	REQUIRE(stk_chunk_read(cs, 0x70, 0, 0, r, CHUNK, NULL) == 3000 &&
		memcmp(r, w + 7, 3000) == 0);
	REQUIRE(stk_chunk_write_ver(cs, 0x70, 0, CHUNK, 5, w, 10, NULL, 0, &v, &len) == -EINVAL);
	/* The callback's error is the call's; the change itself has landed. */
	v.full = 0;
	v.set = 99;
	REQUIRE(stk_chunk_write_ver(cs, 0x70, 0, CHUNK, 0, w, 10, NULL, 0, &v, &len) == -EPIPE);
	REQUIRE(stk_chunk_version(cs, 0x70, 0, &ver, &clen) == 0 && ver == 99);
	/* A cut counts one up; a removed chunk is version 0 again. */
	REQUIRE(stk_chunk_truncate(cs, 0x70, 1000, CHUNK) == 0);
	REQUIRE(stk_chunk_version(cs, 0x70, 0, &ver, &clen) == 0 && ver == 100 && clen == 1000);
	REQUIRE(stk_chunk_truncate(cs, 0x70, 0, CHUNK) == 0);
	REQUIRE(stk_chunk_version(cs, 0x70, 0, &ver, &clen) == 0 && ver == 0);

	/* A head's floor: its first change of a chunk jumps to the chain's epoch. */
	memset(&v, 0, sizeof(v));
	v.base = STK_CHUNK_VER_ANY;
	v.floor = 5ull << 32;
	REQUIRE(stk_chunk_write_ver(cs, 0x171, 3, CHUNK, 0, w, 4096, NULL, 0, &v, &len) == 0);
	REQUIRE(v.now == (5ull << 32));
	REQUIRE(stk_chunk_write_ver(cs, 0x171, 3, CHUNK, 10, w, 10, NULL, 0, &v, &len) == 0);
	REQUIRE(v.now == (5ull << 32) + 1);
	/* A resync's copy lands only over an older version. */
	memset(&v, 0, sizeof(v));
	v.base = STK_CHUNK_VER_ANY;
	v.full = 1;
	v.newer_only = 1;
	v.set = 5ull << 32;
	REQUIRE(stk_chunk_write_ver(cs, 0x171, 3, CHUNK, 0, w + 1, 100, NULL, 0, &v, &len) == 0);
	REQUIRE(v.now == v.old && len == 4096);
	v.set = (5ull << 32) + 2;
	REQUIRE(stk_chunk_write_ver(cs, 0x171, 3, CHUNK, 0, w + 1, 100, NULL, 0, &v, &len) == 0);
	REQUIRE(v.now == (5ull << 32) + 2 && len == 100);
	{
		/* The whole chunk and its version at once, CRCs checked; missing: 0. */
		static uint32_t crcs[CHUNK / 4096 + 1];
		struct stk_chunk_ent *e;
		size_t n;

		REQUIRE(stk_chunk_read_whole(cs, 0x171, 3, r, CHUNK, &clen, &ver, crcs) == 0);
		REQUIRE(clen == 100 && ver == (5ull << 32) + 2 && memcmp(r, w + 1, 100) == 0);
		REQUIRE(stk_chunk_read_whole(cs, 0x171, 4, r, CHUNK, &clen, &ver, crcs) == 0);
		REQUIRE(clen == 0 && ver == 0);
		REQUIRE(stk_chunk_read_whole(cs, 0x171, 3, r, 50, &clen, &ver, crcs) == -EFBIG);
		/* Bucket 0x71 lists inode 0x171's chunk, in order with inode 0x71's. */
		REQUIRE(stk_chunk_write(cs, 0x71, 9, CHUNK, 0, w, 10, NULL, 0, &len) == 0);
		REQUIRE(stk_chunk_write(cs, 0x71, 2, CHUNK, 0, w, 10, NULL, 0, &len) == 0);
		REQUIRE(stk_chunk_list_bucket(cs, 0x71, &e, &n) == 0);
		REQUIRE(n == 3 && e[0].ino == 0x71 && e[0].idx == 2 && e[1].idx == 9 &&
			e[2].ino == 0x171 && e[2].idx == 3);
		free(e);
		REQUIRE(stk_chunk_list_bucket(cs, 0x72, &e, &n) == 0 && n == 0 && !e);
		REQUIRE(stk_chunk_truncate(cs, 0x71, 0, CHUNK) == 0);
		REQUIRE(stk_chunk_truncate(cs, 0x171, 0, CHUNK) == 0);
	}
	return 0;
}

/* Random partial overwrites and extensions, compared with a model after each. */
/*
 * Whole-chunk writes, the checkpoint case: page-aligned large ones go to the disk
 * uncached (O_DIRECT), others through the page cache; any of them is read back
 * whole, replaced whole, and merged with a later partial write.
 */
static int test_whole_chunks(struct stk_chunk_store *cs)
{
	const uint32_t big = 1u << 20;
	uint8_t *w = aligned_alloc(4096, big + 8192), *r = malloc(big);
	uint32_t *crcs = malloc(sizeof(*crcs) * (big / STK_CHUNK_BLOCK));
	uint32_t len = 0;
	char path[512];
	struct stat st;
	int rc = 1;

	if (!w || !r || !crcs) {
		CHECK_FAIL("out of memory");
		goto out;
	}
	/* aligned, with the caller's CRCs, then replaced whole */
	for (uint8_t seed = 20; seed < 22; seed++) {
		fill(w, big, seed);
		stk_crc32c_blocks(w, big, STK_CHUNK_BLOCK, crcs);
		REQUIRE(stk_chunk_write(cs, 0x70, 0, big, 0, w, big, crcs, 0, &len) == 0);
		REQUIRE(len == big);
		REQUIRE(stk_chunk_read(cs, 0x70, 0, 0, r, big, NULL) == (long)big);
		REQUIRE(memcmp(r, w, big) == 0);
	}
	REQUIRE(file_path(cs, 0x70, 0, path, sizeof(path)) == 0 && stat(path, &st) == 0);
	REQUIRE(st.st_size == 4096 + (off_t)big);
	/* a partial write keeps the rest of the uncached chunk */
	fill(w + big, 5000, 22);
	REQUIRE(stk_chunk_write(cs, 0x70, 0, big, 7000, w + big, 5000, NULL, 0, &len) == 0);
	memcpy(w + 7000, w + big, 5000);
	REQUIRE(stk_chunk_read(cs, 0x70, 0, 0, r, big, NULL) == (long)big);
	REQUIRE(memcmp(r, w, big) == 0);
	/* unaligned, and not whole pages: through the page cache, no CRCs given */
	fill(w, big, 23);
	REQUIRE(stk_chunk_write(cs, 0x71, 0, big, 0, w + 16, big - 16, NULL, 0, &len) == 0);
	REQUIRE(len == big - 16);
	REQUIRE(stk_chunk_read(cs, 0x71, 0, 0, r, big, NULL) == (long)(big - 16));
	REQUIRE(memcmp(r, w + 16, big - 16) == 0);
	REQUIRE(stk_chunk_write(cs, 0x71, 1, big, 0, w, big - 100, NULL, STK_WRITE_SYNC, &len) == 0);
	REQUIRE(stk_chunk_read(cs, 0x71, 1, 0, r, big, NULL) == (long)(big - 100));
	REQUIRE(memcmp(r, w, big - 100) == 0);
	rc = 0;
out:
	free(w);
	free(r);
	free(crcs);
	return rc;
}

static int test_model(struct stk_chunk_store *cs)
{
	static uint8_t model[CHUNK], w[CHUNK], r[CHUNK];
	uint32_t mlen = 0, len = 0;

	memset(model, 0, sizeof(model));
	for (int it = 0; it < 300; it++) {
		uint32_t off = rnd(CHUNK), n = rnd(it % 10 == 0 ? CHUNK : 20000) + 1;
		uint32_t ro, rl;
		long got;

		if (it % 50 == 0)
			off = 0, n = CHUNK; /* an occasional whole-chunk write */
		if (off + n > CHUNK)
			n = CHUNK - off;
		fill(w, n, (uint8_t)it);
		REQUIRE(stk_chunk_write(cs, 0x20, 5, CHUNK, off, w, n, NULL, 0, &len) == 0);
		memcpy(model + off, w, n);
		if (off + n > mlen)
			mlen = off + n;
		REQUIRE(len == mlen);
		REQUIRE(stk_chunk_read(cs, 0x20, 5, 0, r, CHUNK, NULL) == (long)mlen);
		REQUIRE(memcmp(r, model, mlen) == 0);
		ro = rnd(mlen + 100);
		rl = rnd(30000) + 1;
		got = stk_chunk_read(cs, 0x20, 5, ro, r, rl, NULL);
		if (ro >= mlen)
			REQUIRE(got == 0);
		else
			REQUIRE(got == (long)STK_MIN(rl, mlen - ro));
		if (got > 0)
			REQUIRE(memcmp(r, model + ro, (size_t)got) == 0);
	}
	return 0;
}

static int test_truncate(struct stk_chunk_store *cs)
{
	static uint8_t w[CHUNK], r[CHUNK];
	const uint32_t cs64 = 64u << 10;
	char p[512];
	uint64_t before;
	uint32_t len;

	fill(w, sizeof(w), 9);
	before = nchunks(cs);
	for (uint32_t i = 0; i < 4; i++)
		REQUIRE(stk_chunk_write(cs, 0x130, i, cs64, 0, w + i * 100, cs64, NULL, 0, &len) == 0);
	REQUIRE(nchunks(cs) == before + 4);
	/* Cut inside chunk 1 (not on a block boundary): chunks 2 and 3 go. */
	REQUIRE(stk_chunk_truncate(cs, 0x130, cs64 + 5000, cs64) == 0);
	REQUIRE(nchunks(cs) == before + 2);
	REQUIRE(stk_chunk_read(cs, 0x130, 0, 0, r, cs64, NULL) == cs64);
	REQUIRE(memcmp(r, w, cs64) == 0);
	REQUIRE(stk_chunk_read(cs, 0x130, 1, 0, r, cs64, NULL) == 5000);
	REQUIRE(memcmp(r, w + 100, 5000) == 0);
	REQUIRE(stk_chunk_read(cs, 0x130, 2, 0, r, cs64, NULL) == 0);
	REQUIRE(stk_chunk_read(cs, 0x130, 3, 0, r, cs64, NULL) == 0);
	/* Growing after a cut reads zeros where the old bytes were. */
	REQUIRE(stk_chunk_write(cs, 0x130, 1, cs64, 9000, w, 10, NULL, 0, &len) == 0);
	REQUIRE(len == 9010);
	REQUIRE(stk_chunk_read(cs, 0x130, 1, 4990, r, 4020, NULL) == 4020);
	REQUIRE(memcmp(r, w + 100 + 4990, 10) == 0);
	for (int i = 10; i < 4010; i++)
		REQUIRE(r[i] == 0);
	/* Cut on a chunk boundary, then a no-op larger size, then everything. */
	REQUIRE(stk_chunk_truncate(cs, 0x130, cs64, cs64) == 0);
	REQUIRE(nchunks(cs) == before + 1);
	REQUIRE(stk_chunk_truncate(cs, 0x130, 10 * (uint64_t)cs64, cs64) == 0);
	REQUIRE(stk_chunk_read(cs, 0x130, 0, 0, r, cs64, NULL) == cs64);
	REQUIRE(stk_chunk_truncate(cs, 0x130, 0, cs64) == 0);
	REQUIRE(nchunks(cs) == before);
	REQUIRE(stk_chunk_read(cs, 0x130, 0, 0, r, cs64, NULL) == 0);
	file_path(cs, 0x130, 0, p, sizeof(p));
	*strrchr(p, '/') = 0;
	REQUIRE(!exists(p)); /* the inode's folder is gone */
	REQUIRE(stk_chunk_truncate(cs, 0x130, 0, cs64) == 0);
	REQUIRE(stk_chunk_truncate(cs, 0x130, 0, 0) == -EINVAL);
	return 0;
}

/* Punch: the chunks of a range go, the others stay; missing ones are no error. */
static int test_punch(struct stk_chunk_store *cs)
{
	static uint8_t w[CHUNK], r[CHUNK];
	const uint32_t cs64 = 64u << 10;
	uint64_t before;
	uint32_t len;

	fill(w, sizeof(w), 11);
	before = nchunks(cs);
	for (uint32_t i = 0; i < 6; i++)
		REQUIRE(stk_chunk_write(cs, 0x140, i, cs64, 0, w + i * 100, cs64, NULL, 0, &len) == 0);
	REQUIRE(stk_chunk_punch(cs, 0x140, 1, 3) == 0);
	REQUIRE(nchunks(cs) == before + 4);
	REQUIRE(stk_chunk_read(cs, 0x140, 1, 0, r, cs64, NULL) == 0);
	REQUIRE(stk_chunk_read(cs, 0x140, 2, 0, r, cs64, NULL) == 0);
	REQUIRE(stk_chunk_read(cs, 0x140, 3, 0, r, cs64, NULL) == cs64);
	REQUIRE(memcmp(r, w + 300, cs64) == 0);
	REQUIRE(stk_chunk_read(cs, 0x140, 0, 0, r, cs64, NULL) == cs64);
	REQUIRE(memcmp(r, w, cs64) == 0);
	REQUIRE(stk_chunk_punch(cs, 0x140, 1, 3) == 0); /* again: nothing there, no error */
	REQUIRE(stk_chunk_punch(cs, 0x140, 5, 5) == 0); /* empty range */
	REQUIRE(stk_chunk_read(cs, 0x140, 5, 0, r, cs64, NULL) == cs64);
	REQUIRE(stk_chunk_punch(cs, 0x140, 4, 3) == -EINVAL);
	REQUIRE(stk_chunk_punch(cs, 0x999, 0, 10) == 0); /* no such inode */
	/* a punched chunk written again holds only the new bytes */
	REQUIRE(stk_chunk_write(cs, 0x140, 2, cs64, 100, w, 10, NULL, 0, &len) == 0);
	REQUIRE(len == 110);
	REQUIRE(stk_chunk_punch(cs, 0x140, 0, UINT32_MAX) == 0);
	REQUIRE(nchunks(cs) == before);
	REQUIRE(stk_chunk_truncate(cs, 0x140, 0, cs64) == 0);
	return 0;
}

static int flip_byte(const char *path, off_t off)
{
	uint8_t b;
	int fd = open(path, O_RDWR);

	if (fd < 0 || pread(fd, &b, 1, off) != 1)
		return -1;
	b ^= 0x40;
	if (pwrite(fd, &b, 1, off) != 1)
		return -1;
	return close(fd);
}

/* Runs a read with stderr captured into log (to check the error line). */
static long read_capturing(struct stk_chunk_store *cs, uint64_t ino, uint32_t idx, uint32_t off,
			   void *buf, uint32_t len, char *log, size_t loglen)
{
	char tmpl[] = "/tmp/stk-test-log-XXXXXX";
	int fd = mkstemp(tmpl), saved = dup(2);
	long rc, n;

	fflush(stderr);
	dup2(fd, 2);
	rc = stk_chunk_read(cs, ino, idx, off, buf, len, NULL);
	dup2(saved, 2);
	close(saved);
	n = pread(fd, log, loglen - 1, 0);
	log[n > 0 ? n : 0] = 0;
	close(fd);
	unlink(tmpl);
	return rc;
}

static int test_corruption(struct stk_chunk_store *cs)
{
	static uint8_t w[CHUNK], r[CHUNK];
	char p[512], log[2048], want[256];
	uint32_t len;
	long rc;

	fill(w, sizeof(w), 3);
	REQUIRE(stk_chunk_write(cs, 0x1a, 7, CHUNK, 0, w, 20000, NULL, 0, &len) == 0);
	file_path(cs, 0x1a, 7, p, sizeof(p));
	/* Flip one byte in data block 2 (header is 4 KiB). */
	REQUIRE(flip_byte(p, 4096 + 2 * 4096 + 123) == 0);
	memset(r, 0xee, sizeof(r));
	rc = read_capturing(cs, 0x1a, 7, 0, r, CHUNK, log, sizeof(log));
	REQUIRE(rc == -EIO);
	for (int i = 0; i < 20000; i++)
		REQUIRE(r[i] == 0); /* the bytes never reach the caller */
	snprintf(want, sizeof(want), "checksum mismatch: target %u ino 0x1a chunk 7 block 2 (",
		 stk_chunk_store_id(cs));
	REQUIRE(strstr(log, want) != NULL);
	REQUIRE(strstr(log, "refusing to return data") != NULL);
	/* Blocks around it still read. */
	REQUIRE(stk_chunk_read(cs, 0x1a, 7, 0, r, 8192, NULL) == 8192);
	REQUIRE(memcmp(r, w, 8192) == 0);
	REQUIRE(stk_chunk_read(cs, 0x1a, 7, 12288, r, 4096, NULL) == 4096);
	REQUIRE(stk_chunk_read(cs, 0x1a, 7, 8192 + 4000, r, 200, NULL) == -EIO);
	/* A write that keeps bytes of the bad block refuses to launder them. */
	REQUIRE(stk_chunk_write(cs, 0x1a, 7, CHUNK, 8200, w, 10, NULL, 0, &len) == -EIO);
	/* A write elsewhere keeps the bad block's stored CRC: still detected after. */
	REQUIRE(stk_chunk_write(cs, 0x1a, 7, CHUNK, 0, w, 100, NULL, 0, &len) == 0);
	REQUIRE(stk_chunk_read(cs, 0x1a, 7, 8192, r, 4096, NULL) == -EIO);
	/* Overwriting the whole bad block repairs it. */
	REQUIRE(stk_chunk_write(cs, 0x1a, 7, CHUNK, 8192, w + 8192, 4096, NULL, 0, &len) == 0);
	REQUIRE(stk_chunk_read(cs, 0x1a, 7, 0, r, CHUNK, NULL) == 20000);
	REQUIRE(memcmp(r, w, 20000) == 0);

	/* A damaged header: -EIO for reads and partial writes; a whole-chunk write repairs. */
	REQUIRE(flip_byte(p, 14) == 0);
	REQUIRE(stk_chunk_read(cs, 0x1a, 7, 0, r, 100, NULL) == -EIO);
	REQUIRE(stk_chunk_write(cs, 0x1a, 7, CHUNK, 0, w, 10, NULL, 0, &len) == -EIO);
	REQUIRE(stk_chunk_write(cs, 0x1a, 7, CHUNK, 0, w, CHUNK, NULL, 0, &len) == 0);
	REQUIRE(stk_chunk_read(cs, 0x1a, 7, 0, r, CHUNK, NULL) == CHUNK);
	REQUIRE(memcmp(r, w, CHUNK) == 0);
	/* A file cut short. */
	REQUIRE(truncate(p, 4096 + 1000) == 0);
	REQUIRE(stk_chunk_read(cs, 0x1a, 7, 0, r, 100, NULL) == -EIO);
	REQUIRE(stk_chunk_truncate(cs, 0x1a, 0, CHUNK) == 0);
	return 0;
}

/* Writes until the file system is full; returns how many writes succeeded. */
static int fill_up(struct stk_chunk_store *cs, const uint8_t *w)
{
	static const uint32_t sizes[] = {CHUNK, 64u << 10, 4u << 10, 1};
	uint32_t idx = 100, len;
	int rc;

	for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
		for (;;) {
			rc = stk_chunk_write(cs, 0x77, idx, CHUNK, 0, w, sizes[s], NULL, 0, &len);
			if (rc == -ENOSPC)
				break;
			if (rc)
				return rc;
			idx++;
		}
	}
	return 0;
}

static int count_tmp_files(const char *dir)
{
	char cmd[600];
	FILE *f;
	int n = -1;

	snprintf(cmd, sizeof(cmd), "find '%s' -name '*.tmp.*' | wc -l", dir);
	f = popen(cmd, "r");
	if (!f)
		return -1;
	if (fscanf(f, "%d", &n) != 1)
		n = -1;
	pclose(f);
	return n;
}

static int test_enospc(void)
{
	static uint8_t w[CHUNK], w2[CHUNK], r[CHUNK];
	struct stk_chunk_store *cs = NULL;
	char mnt[300];
	uint32_t len;
	int rc = 1;

	if (geteuid() != 0) {
		fprintf(stderr, "SKIP full-disk case: not root\n");
		return 0;
	}
	snprintf(mnt, sizeof(mnt), "%s/small", g_root);
	if (mkdir(mnt, 0755) || mount("tmpfs", mnt, "tmpfs", 0, "size=2m")) {
		fprintf(stderr, "SKIP full-disk case: cannot mount tmpfs: %s\n", strerror(errno));
		return 0;
	}
	fill(w, sizeof(w), 5);
	fill(w2, sizeof(w2), 6);
	if (stk_chunk_store_open(mnt, &cs)) {
		CHECK_FAIL("cannot open store on tmpfs");
		goto out;
	}
	rc = stk_chunk_write(cs, 0x55, 0, CHUNK, 0, w, 200000, NULL, STK_WRITE_SYNC, &len);
	if (rc == 0)
		rc = fill_up(cs, w);
	if (rc) {
		CHECK_FAIL("filling the file system failed: %s", strerror(-rc));
		rc = 1;
		goto out;
	}
	rc = 1;
	/* The overwrite needs room for a new copy: it must fail and leave the old one. */
	if (stk_chunk_write(cs, 0x55, 0, CHUNK, 0, w2, 200000, NULL, STK_WRITE_SYNC, &len) != -ENOSPC ||
	    stk_chunk_write(cs, 0x55, 0, CHUNK, 100, w2, 10, NULL, 0, &len) != -ENOSPC ||
	    stk_chunk_write(cs, 0x56, 0, CHUNK, 0, w2, 100000, NULL, 0, &len) != -ENOSPC) {
		CHECK_FAIL("writes on a full file system did not give ENOSPC");
		goto out;
	}
	if (stk_chunk_read(cs, 0x55, 0, 0, r, CHUNK, NULL) != 200000 || memcmp(r, w, 200000) != 0) {
		CHECK_FAIL("old chunk not intact after ENOSPC");
		goto out;
	}
	if (count_tmp_files(mnt) != 0) {
		CHECK_FAIL("temporary files left behind after ENOSPC");
		goto out;
	}
	/* Space freed: writes work again. */
	if (stk_chunk_truncate(cs, 0x77, 0, CHUNK) ||
	    stk_chunk_write(cs, 0x55, 0, CHUNK, 0, w2, 200000, NULL, 0, &len) ||
	    stk_chunk_read(cs, 0x55, 0, 0, r, CHUNK, NULL) != 200000 || memcmp(r, w2, 200000) != 0) {
		CHECK_FAIL("writes after freeing space failed");
		goto out;
	}
	rc = 0;
out:
	stk_chunk_store_close(cs);
	umount2(mnt, MNT_DETACH);
	return rc;
}

struct writer_arg {
	struct stk_chunk_store *cs;
	const uint8_t *w;
	int id;
	int rc;
};

/* Each writer owns every 4th 4 KiB piece of one chunk and writes its pieces in turn. */
static void *writer(void *p)
{
	struct writer_arg *a = p;
	uint32_t len;

	for (uint32_t off = (uint32_t)a->id * 4096; off < CHUNK; off += 4 * 4096) {
		a->rc = stk_chunk_write(a->cs, 0x99, 1, CHUNK, off, a->w + off, 4096, NULL, 0, &len);
		if (a->rc)
			break;
	}
	return NULL;
}

static int test_concurrent(struct stk_chunk_store *cs)
{
	static uint8_t w[CHUNK], r[CHUNK];
	struct writer_arg args[4];
	pthread_t th[4];

	fill(w, sizeof(w), 11);
	for (int i = 0; i < 4; i++) {
		args[i] = (struct writer_arg){.cs = cs, .w = w, .id = i};
		REQUIRE(pthread_create(&th[i], NULL, writer, &args[i]) == 0);
	}
	for (int i = 0; i < 4; i++) {
		pthread_join(th[i], NULL);
		REQUIRE(args[i].rc == 0);
	}
	REQUIRE(stk_chunk_read(cs, 0x99, 1, 0, r, CHUNK, NULL) == CHUNK);
	REQUIRE(memcmp(r, w, CHUNK) == 0);
	return 0;
}

/*
 * Synced writes of new files from several threads at once: each makes its inode's
 * folder (and for some its parent) and syncs them with the data on the thread's
 * ring (sync_new); every chunk reads back whole and no temporary file is left.
 */
struct sync_arg {
	struct stk_chunk_store *cs;
	const uint8_t *w;
	int id, rc;
};

static void *sync_writer(void *p)
{
	struct sync_arg *a = p;
	uint32_t len;

	for (uint64_t k = 0; k < 40 && a->rc == 0; k++) {
		uint64_t ino = 0x5e0000 + (k * 4 + (uint64_t)a->id) * 0x101;

		a->rc = stk_chunk_write(a->cs, ino, 0, CHUNK, 0, a->w, 16384 + a->id, NULL,
					STK_WRITE_SYNC, &len);
		if (a->rc == 0 && len != 16384u + (uint32_t)a->id)
			a->rc = -EBADMSG;
	}
	return NULL;
}

static int count_entries(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int n = 0;

	if (!d)
		return -1;
	while ((e = readdir(d)))
		n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
	closedir(d);
	return n;
}

static int test_sync_new(struct stk_chunk_store *cs)
{
	static uint8_t w[20000], r[20000];
	struct sync_arg args[4];
	pthread_t th[4];
	char p[512], tmp[600];
	struct stat sb;

	fill(w, sizeof(w), 17);
	for (int i = 0; i < 4; i++) {
		args[i] = (struct sync_arg){.cs = cs, .w = w, .id = i};
		REQUIRE(pthread_create(&th[i], NULL, sync_writer, &args[i]) == 0);
	}
	for (int i = 0; i < 4; i++) {
		pthread_join(th[i], NULL);
		REQUIRE(args[i].rc == 0);
	}
	for (uint64_t k = 0; k < 160; k++) {
		uint64_t ino = 0x5e0000 + k * 0x101;
		long want = 16384 + (long)(k % 4);

		CHECK_EQ(stk_chunk_read(cs, ino, 0, 0, r, sizeof(r), NULL), want);
		CHECK(memcmp(r, w, (size_t)want) == 0);
		file_path(cs, ino, 0, p, sizeof(p));
		CHECK(stat(p, &sb) == 0 && sb.st_size == 4096 + want);
		/* the folder holds the chunk alone: no temporary file left */
		snprintf(tmp, sizeof(tmp), "%s", p);
		*strrchr(tmp, '/') = 0;
		CHECK_EQ(count_entries(tmp), 1);
	}
	return check_failures() ? 1 : 0;
}

/* A chunk larger than 1 MiB has a header of more than one 4 KiB block. */
static int test_big_chunk(struct stk_chunk_store *cs)
{
	const uint32_t big = 8u << 20;
	uint8_t *w = malloc(big), *r = malloc(big);
	char p[512];
	struct stat sb;
	uint32_t len;
	int ok;

	REQUIRE(w && r);
	fill(w, big, 13);
	ok = stk_chunk_write(cs, 0xb16, 0, big, 0, w, big, NULL, 0, &len) == 0 && len == big &&
	     stk_chunk_read(cs, 0xb16, 0, 0, r, big, NULL) == (long)big && memcmp(r, w, big) == 0 &&
	     stk_chunk_write(cs, 0xb16, 0, big, big - 5000, w, 100, NULL, 0, &len) == 0 &&
	     stk_chunk_read(cs, 0xb16, 0, big - 5000, r, 100, NULL) == 100 && memcmp(r, w, 100) == 0;
	file_path(cs, 0xb16, 0, p, sizeof(p));
	ok = ok && stat(p, &sb) == 0 && sb.st_size == (off_t)(3 * 4096 + big);
	ok = ok && stk_chunk_truncate(cs, 0xb16, 0, big) == 0;
	free(w);
	free(r);
	REQUIRE(ok);
	return 0;
}

static int test_reopen(const char *dir, struct stk_chunk_store **csp)
{
	struct stk_chunk_store *cs = *csp;
	uint64_t n = nchunks(cs);
	char p[512], tmp[600];
	uint8_t r[16];
	int fd;

	REQUIRE(n > 0);
	REQUIRE(stk_chunk_store_set_id(cs, 3) == 0);
	/* A temporary file a crash left behind. */
	file_path(cs, 0x10, 0, p, sizeof(p));
	snprintf(tmp, sizeof(tmp), "%s.tmp.12345", p);
	fd = open(tmp, O_CREAT | O_WRONLY, 0644);
	REQUIRE(fd >= 0);
	close(fd);
	stk_chunk_store_close(cs);
	*csp = NULL;
	REQUIRE(stk_chunk_store_open(dir, csp) == 0);
	cs = *csp;
	REQUIRE(nchunks(cs) == n);
	REQUIRE(stk_chunk_store_id(cs) == 3);
	REQUIRE(!exists(tmp));
	REQUIRE(stk_chunk_read(cs, 0x10, 0, 3000, r, 16, NULL) == 16);
	return 0;
}

/*
 * The cache of open chunk files: a second store opened as a short-circuit reader
 * (as a client on the node does) and the store itself must both see every change
 * made after they cached a chunk: a copy-on-write overwrite, a truncate, an unlink
 * and recreate, a change in place; and more chunks than the cache holds.
 */
static int read_all(struct stk_chunk_store *cs, struct stk_chunk_store *rd, uint64_t ino,
		    uint32_t idx, const uint8_t *want, long len)
{
	static uint8_t r[CHUNK];

	REQUIRE(stk_chunk_read(cs, ino, idx, 0, r, CHUNK, NULL) == len);
	REQUIRE(memcmp(r, want, (size_t)len) == 0);
	REQUIRE(stk_chunk_read(rd, ino, idx, 0, r, CHUNK, NULL) == len);
	REQUIRE(memcmp(r, want, (size_t)len) == 0);
	return 0;
}

/* Past the window in which a fresh file is not cached (FDC_SETTLE_MS in chunk.c). */
static void settle(void)
{
	usleep(150 * 1000);
}

static int test_fd_cache(const char *dir, struct stk_chunk_store *cs)
{
	static uint8_t a[CHUNK], b[CHUNK], c[CHUNK], r[CHUNK];
	struct stk_chunk_store *rd = NULL;
	uint64_t ino = 0x2b;
	char p[512];
	uint32_t len;

	fill(a, sizeof(a), 11);
	fill(b, sizeof(b), 12);
	fill(c, sizeof(c), 13);
	REQUIRE(stk_chunk_store_open_reader(dir, stk_chunk_store_id(cs) + 1, &rd) == -ESTALE);
	REQUIRE(stk_chunk_store_open_reader(dir, stk_chunk_store_id(cs), &rd) == 0);
	REQUIRE(stk_chunk_write(cs, ino, 3, CHUNK, 0, a, CHUNK, NULL, 0, &len) == 0);
	settle();
	REQUIRE(read_all(cs, rd, ino, 3, a, CHUNK) == 0); /* cached now */
	REQUIRE(read_all(cs, rd, ino, 3, a, CHUNK) == 0);
	/* Overwritten (copy-on-write: a new file renamed over the cached one). */
	REQUIRE(stk_chunk_write(cs, ino, 3, CHUNK, 0, b, CHUNK, NULL, 0, &len) == 0);
	REQUIRE(read_all(cs, rd, ino, 3, b, CHUNK) == 0);
	settle();
	REQUIRE(read_all(cs, rd, ino, 3, b, CHUNK) == 0);
	/* A partial overwrite. */
	REQUIRE(stk_chunk_write(cs, ino, 3, CHUNK, 5000, c, 100, NULL, 0, &len) == 0);
	memcpy(b + 5000, c, 100);
	REQUIRE(read_all(cs, rd, ino, 3, b, CHUNK) == 0);
	settle();
	REQUIRE(read_all(cs, rd, ino, 3, b, CHUNK) == 0);
	/* Truncated: the chunk is cut, then removed. */
	REQUIRE(stk_chunk_truncate(cs, ino, 3ull * CHUNK + 7000, CHUNK) == 0);
	REQUIRE(read_all(cs, rd, ino, 3, b, 7000) == 0);
	settle();
	REQUIRE(read_all(cs, rd, ino, 3, b, 7000) == 0);
	REQUIRE(stk_chunk_truncate(cs, ino, 0, CHUNK) == 0);
	REQUIRE(stk_chunk_read(cs, ino, 3, 0, r, CHUNK, NULL) == 0);
	REQUIRE(stk_chunk_read(rd, ino, 3, 0, r, CHUNK, NULL) == 0);
	/* Unlinked and made again: the new bytes. */
	REQUIRE(stk_chunk_write(cs, ino, 3, CHUNK, 0, a, CHUNK, NULL, 0, &len) == 0);
	settle();
	REQUIRE(read_all(cs, rd, ino, 3, a, CHUNK) == 0);
	REQUIRE(file_path(cs, ino, 3, p, sizeof(p)) == 0);
	REQUIRE(unlink(p) == 0);
	REQUIRE(stk_chunk_write(cs, ino, 3, CHUNK, 0, c, 9000, NULL, 0, &len) == 0);
	REQUIRE(read_all(cs, rd, ino, 3, c, 9000) == 0);
	settle();
	REQUIRE(read_all(cs, rd, ino, 3, c, 9000) == 0);
	/* Changed in place behind the store's back: the damaged header is seen. */
	REQUIRE(flip_byte(p, 14) == 0);
	REQUIRE(stk_chunk_read(rd, ino, 3, 0, r, 100, NULL) == -EIO);
	REQUIRE(stk_chunk_read(cs, ino, 3, 0, r, 100, NULL) == -EIO);
	REQUIRE(flip_byte(p, 14) == 0);
	REQUIRE(stk_chunk_read(rd, ino, 3, 0, r, 9000, NULL) == 9000);
	REQUIRE(memcmp(r, c, 9000) == 0);
	/* More chunks than a reader caches, read twice: every one its own bytes. */
	for (uint32_t i = 0; i < 600; i++) {
		fill(r, 4096, (uint8_t)i);
		REQUIRE(stk_chunk_write(cs, ino + 1, i, CHUNK, 0, r, 4096, NULL, 0, &len) == 0);
	}
	settle();
	for (int pass = 0; pass < 2; pass++)
		for (uint32_t i = 0; i < 600; i++) {
			fill(a, 4096, (uint8_t)i);
			REQUIRE(read_all(cs, rd, ino + 1, i, a, 4096) == 0);
		}
	REQUIRE(stk_chunk_truncate(cs, ino, 0, CHUNK) == 0);
	REQUIRE(stk_chunk_truncate(cs, ino + 1, 0, CHUNK) == 0);
	stk_chunk_store_close(rd);
	return 0;
}

/*
 * A short-circuit reader reads a settled, cached chunk through its map: reads at
 * every kind of offset and length (block-aligned or not, a short last block,
 * past the end) return the chunk's bytes; the same reads with the file's pages
 * dropped from the page cache go through preadv and return the same; a data
 * byte changed in place is caught on both paths (-EIO, the buffer zeroed) while
 * reads of the other blocks go on. Also stk_crc32c_copy_blocks against
 * stk_crc32c_blocks.
 */
static int drop_cache(const char *path)
{
	int fd = open(path, O_RDONLY), rc;

	if (fd < 0)
		return -1;
	rc = fsync(fd) || posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
	close(fd);
	return rc;
}

static int mapped_reads(struct stk_chunk_store *rd, uint64_t ino, const uint8_t *want, uint32_t len)
{
	static uint8_t r[CHUNK + 8192];
	static const uint32_t offs[] = {0, 1, 4095, 4096, 4097, 8191, 12288, 20000};
	static const uint32_t lens[] = {1, 100, 4095, 4096, 4097, 12288, 12289, 65536, CHUNK};

	for (size_t i = 0; i < STK_ARRAY_SIZE(offs); i++)
		for (size_t j = 0; j < STK_ARRAY_SIZE(lens); j++) {
			uint32_t o = offs[i], l = lens[j];
			long exp = o >= len ? 0 : (long)STK_MIN(l, len - o);

			memset(r, 0xee, l + 1);
			REQUIRE(stk_chunk_read(rd, ino, 0, o, r, l, NULL) == exp);
			REQUIRE(exp == 0 || memcmp(r, want + o, (size_t)exp) == 0);
			REQUIRE(r[exp] == 0xee || (uint32_t)exp == l);
		}
	for (int k = 0; k < 200; k++) {
		uint32_t o = rnd(len), l = 1 + rnd(len - o);

		REQUIRE(stk_chunk_read(rd, ino, 0, o, r, l, NULL) == (long)l);
		REQUIRE(memcmp(r, want + o, l) == 0);
	}
	/* the chunk's last (short) block, alone and with the one before */
	REQUIRE(stk_chunk_read(rd, ino, 0, len - 10, r, 100, NULL) == 10);
	REQUIRE(memcmp(r, want + len - 10, 10) == 0);
	REQUIRE(stk_chunk_read(rd, ino, 0, len / 4096 * 4096 - 4096, r, CHUNK, NULL) ==
	      (long)(len - (len / 4096 * 4096 - 4096)));
	REQUIRE(memcmp(r, want + len / 4096 * 4096 - 4096, len - (len / 4096 * 4096 - 4096)) == 0);
	return 0;
}

static int test_mapped(const char *dir, struct stk_chunk_store *cs)
{
	static uint8_t a[CHUNK], r[CHUNK], x[CHUNK];
	static uint32_t c1[CHUNK / 4096 + 1], c2[CHUNK / 4096 + 1];
	const uint32_t len = CHUNK - 3000; /* a short last block */
	struct stk_chunk_store *rd = NULL;
	uint64_t ino = 0x3c;
	char log[4096], p[512];
	uint32_t got;
	long hdr;

	for (uint32_t n = 0; n <= 40; n++) {
		struct stk_crc_copy v[40];

		fill(a, n * 4096, (uint8_t)n);
		stk_crc32c_blocks(a, n * 4096, 4096, c1);
		memset(x, 0, sizeof(x));
		for (uint32_t i = 0; i < n; i++) /* blocks in reverse order */
			v[i] = (struct stk_crc_copy){.dst = x + (n - 1 - i) * 4096, .src = a + i * 4096};
		stk_crc32c_copy_blocks(v, n, 4096, c2);
		for (uint32_t i = 0; i < n; i++) {
			REQUIRE(c2[i] == c1[i]);
			REQUIRE(memcmp(x + (n - 1 - i) * 4096, a + i * 4096, 4096) == 0);
		}
		REQUIRE(x[n * 4096] == 0);
	}
	fill(a, sizeof(a), 21);
	REQUIRE(stk_chunk_store_open_reader(dir, stk_chunk_store_id(cs), &rd) == 0);
	REQUIRE(stk_chunk_write(cs, ino, 0, CHUNK, 0, a, len, NULL, 0, &got) == 0);
	REQUIRE(file_path(cs, ino, 0, p, sizeof(p)) == 0);
	settle();
	REQUIRE(mapped_reads(rd, ino, a, len) == 0); /* opened, mapped and cached */
	REQUIRE(mapped_reads(rd, ino, a, len) == 0);
	/*
	 * Out of the page cache (a mapped page is not dropped: the reader is closed
	 * first): the first read finds the pages missing and takes preadv, which
	 * brings them back for the reads after it.
	 */
	stk_chunk_store_close(rd);
	REQUIRE(drop_cache(p) == 0);
	REQUIRE(stk_chunk_store_open_reader(dir, stk_chunk_store_id(cs), &rd) == 0);
	REQUIRE(mapped_reads(rd, ino, a, len) == 0);
	/* A data byte of block 5 changed in place; the header is 4 KiB here. */
	hdr = 4096;
	REQUIRE(flip_byte(p, hdr + 5 * 4096 + 7) == 0);
	settle(); /* so that the reopened file is cached and mapped again */
	for (int pass = 0; pass < 2; pass++) {
		memset(r, 0x55, sizeof(r));
		REQUIRE(read_capturing(rd, ino, 0, 5 * 4096 - 10, r, 30, log, sizeof(log)) == -EIO);
		REQUIRE(strstr(log, "block 5") != NULL);
		for (int i = 0; i < 30; i++)
			REQUIRE(r[i] == 0);
		REQUIRE(read_capturing(rd, ino, 0, 1000, r, 3 * 4096, log, sizeof(log)) == 3 * 4096);
		REQUIRE(memcmp(r, a + 1000, 3 * 4096) == 0);
		REQUIRE(read_capturing(rd, ino, 0, 0, r, CHUNK, log, sizeof(log)) == -EIO);
		REQUIRE(stk_chunk_read(rd, ino, 0, 6 * 4096, r, 8192, NULL) == 8192);
		REQUIRE(memcmp(r, a + 6 * 4096, 8192) == 0);
		/* the second pass, out of the page cache, reads with preadv */
		stk_chunk_store_close(rd);
		REQUIRE(drop_cache(p) == 0);
		REQUIRE(stk_chunk_store_open_reader(dir, stk_chunk_store_id(cs), &rd) == 0);
	}
	REQUIRE(flip_byte(p, hdr + 5 * 4096 + 7) == 0);
	settle();
	REQUIRE(mapped_reads(rd, ino, a, len) == 0);
	REQUIRE(stk_chunk_truncate(cs, ino, 0, CHUNK) == 0);
	REQUIRE(stk_chunk_read(rd, ino, 0, 0, r, CHUNK, NULL) == 0);
	stk_chunk_store_close(rd);
	return 0;
}

/*
 * The chunk lock's waiter queue: a lock taken on one thread and let go on another,
 * callbacks and blocked threads served in the order they queued, each exactly
 * once, and a truncate (which takes the lock itself) held back until the write
 * that holds it lets go. Writes under the held lock land.
 */
struct lk_waiter {
	struct stk_chunk_lockwait w;
	int order; /* when granted: 1, 2, ... (0: not yet) */
};

static int g_lk_seq;
static pthread_mutex_t g_lk_mu = PTHREAD_MUTEX_INITIALIZER;

static void lk_granted(struct stk_chunk_lockwait *w)
{
	struct lk_waiter *x = (struct lk_waiter *)w;

	pthread_mutex_lock(&g_lk_mu);
	CHECK(x->order == 0); /* exactly once */
	x->order = ++g_lk_seq;
	pthread_mutex_unlock(&g_lk_mu);
}

struct lk_thread {
	struct stk_chunk_store *cs;
	int truncate; /* else: stk_chunk_lock, then unlock */
	int order;
	int done;
};

static void *lk_main(void *arg)
{
	struct lk_thread *t = arg;

	if (t->truncate) {
		CHECK_RC(stk_chunk_truncate(t->cs, 0x77, 0, CHUNK), 0);
	} else {
		stk_chunk_lock(t->cs, 0x77, 1);
		pthread_mutex_lock(&g_lk_mu);
		t->order = ++g_lk_seq;
		pthread_mutex_unlock(&g_lk_mu);
		stk_chunk_unlock(t->cs, 0x77, 1);
	}
	__atomic_store_n(&t->done, 1, __ATOMIC_RELEASE);
	return NULL;
}

static int lk_order(struct lk_waiter *x)
{
	int o;

	pthread_mutex_lock(&g_lk_mu);
	o = x->order;
	pthread_mutex_unlock(&g_lk_mu);
	return o;
}

static int test_chunk_lock(struct stk_chunk_store *cs)
{
	static uint8_t d[8192];
	struct lk_waiter a = {.w.granted = lk_granted}, b = {.w.granted = lk_granted};
	struct lk_thread t1 = {.cs = cs}, tr = {.cs = cs, .truncate = 1};
	pthread_t th1, thr;
	uint32_t len;

	fill(d, sizeof(d), 9);
	g_lk_seq = 0;
	REQUIRE(stk_chunk_write(cs, 0x77, 1, CHUNK, 0, d, 4096, NULL, 0, &len) == 0);
	/* Free: taken at once, the waiter untouched. */
	REQUIRE(stk_chunk_lock_async(cs, 0x77, 1, &a.w) == 0);
	REQUIRE(stk_chunk_write_locked(cs, 0x77, 1, CHUNK, 4096, d, 4096, NULL, 0, NULL, &len) ==
		0);
	CHECK_EQ(len, 8192);
	/* Held: a callback queues, then a blocked thread, then another callback. */
	a.order = 0;
	REQUIRE(stk_chunk_lock_async(cs, 0x77, 1, &a.w) == 1);
	REQUIRE(pthread_create(&th1, NULL, lk_main, &t1) == 0);
	usleep(50000); /* t1 queued behind a (it cannot get in while the lock is held) */
	REQUIRE(stk_chunk_lock_async(cs, 0x77, 1, &b.w) == 1);
	CHECK(!__atomic_load_n(&t1.done, __ATOMIC_ACQUIRE));
	/* A truncate of the inode waits for the lock too. */
	REQUIRE(pthread_create(&thr, NULL, lk_main, &tr) == 0);
	usleep(50000);
	CHECK(!__atomic_load_n(&tr.done, __ATOMIC_ACQUIRE));
	CHECK_EQ(lk_order(&a), 0);
	/* Let go from another thread than the one that took it (a's callback runs here). */
	stk_chunk_unlock(cs, 0x77, 1);
	CHECK_EQ(lk_order(&a), 1);
	CHECK(!__atomic_load_n(&t1.done, __ATOMIC_ACQUIRE)); /* a holds it now */
	stk_chunk_unlock(cs, 0x77, 1); /* a's turn ends: t1 gets it, then hands it to b */
	pthread_join(th1, NULL);
	CHECK_EQ(t1.order, 2);
	CHECK_EQ(lk_order(&b), 3);
	CHECK(!__atomic_load_n(&tr.done, __ATOMIC_ACQUIRE)); /* b holds it */
	CHECK_EQ(stk_chunk_read(cs, 0x77, 1, 0, d, 8192, NULL), 8192);
	stk_chunk_unlock(cs, 0x77, 1);
	pthread_join(thr, NULL);
	CHECK(tr.done);
	CHECK_EQ(stk_chunk_read(cs, 0x77, 1, 0, d, 8192, NULL), 0);
	/* Free again: taken at once. */
	REQUIRE(stk_chunk_lock_async(cs, 0x77, 1, &a.w) == 0);
	stk_chunk_unlock(cs, 0x77, 1);
	return 0;
}

int main(void)
{
	struct stk_chunk_store *cs = NULL;
	char dir[300];
	int rc;

	rc = check_tmpdir(g_root, sizeof(g_root), "chunk");
	if (rc) {
		fprintf(stderr, "no temporary folder: %s\n", strerror(-rc));
		return 1;
	}
	snprintf(dir, sizeof(dir), "%s/target", g_root);
	rc = stk_chunk_store_open(dir, &cs);
	if (rc) {
		CHECK_FAIL("cannot open store: %s", strerror(-rc));
		goto out;
	}
	/* The tests share one store (test_reopen reopens it): the first that fails stops the run. */
	if ((test_round_trip(cs) || test_versions(cs) || test_whole_chunks(cs) || test_model(cs) || test_truncate(cs) ||
	     test_punch(cs) || test_corruption(cs) || test_concurrent(cs) || test_sync_new(cs) || test_chunk_lock(cs) || test_big_chunk(cs) ||
	     test_reopen(dir, &cs) || test_fd_cache(dir, cs) || test_mapped(dir, cs) ||
	     test_enospc()) &&
	    !check_failures())
		CHECK_FAIL("a test failed without a failed check");
out:
	stk_chunk_store_close(cs);
	check_rm_rf(g_root);
	return check_done();
}
