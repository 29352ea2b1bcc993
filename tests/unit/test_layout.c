/*
 * Unit test of placement: layouts are deterministic, valid, spread chunks evenly
 * over their stripe, use distinct chains, and stay put when chains are added.
 * Also the small helpers of common/util.c the CLI and the data path use.
 */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/layout.h"
#include "common/util.h"
#include "check.h"

int main(void)
{
	struct stk_layout l;
	uint32_t chains[STK_MAX_STRIPE], again[STK_MAX_STRIPE];
	unsigned hits[1025];

	/* known answer: the shuffle must never change between releases */
	l = (struct stk_layout){.chunk_size = 1 << 20, .stripe = 4, .nchains = 16, .start = 0, .seed = 1};
	CHECK(stk_layout_check(&l) == 0);
	stk_layout_chains(&l, chains);
	uint64_t s = 1;
	CHECK(stk_splitmix64(&s) == 0x910a2dec89025cc1ull);
	CHECK(chains[0] == 2 && chains[1] == 6 && chains[2] == 11 && chains[3] == 7);

	/* determinism, range and distinctness over many layouts */
	for (uint64_t e = 0; e < 2000; e++) {
		uint32_t n = 1 + (uint32_t)(e % 1024);
		stk_layout_make(&l, 1 << 20, 16, n, e * 7919);
		CHECK(stk_layout_check(&l) == 0);
		CHECK(l.stripe == (n < 16 ? n : 16));
		stk_layout_chains(&l, chains);
		stk_layout_chains(&l, again);
		CHECK(memcmp(chains, again, l.stripe * sizeof(uint32_t)) == 0);
		memset(hits, 0, sizeof(hits));
		for (uint32_t i = 0; i < l.stripe; i++) {
			CHECK(chains[i] >= 1 && chains[i] <= n);
			CHECK(hits[chains[i]]++ == 0);
		}
	}

	/* chunks go round-robin over the stripe */
	stk_layout_make(&l, 1 << 20, 8, 8, 99);
	stk_layout_chains(&l, chains);
	for (uint64_t i = 0; i < 64; i++)
		CHECK(stk_layout_chunk_chain(&l, chains, i) == chains[i % 8]);

	/* many files spread over all chains roughly evenly */
	memset(hits, 0, sizeof(hits));
	for (uint64_t e = 0; e < 64000; e++) {
		stk_layout_make(&l, 1 << 20, 1, 64, e);
		stk_layout_chains(&l, chains);
		hits[chains[0]]++;
	}
	for (uint32_t c = 1; c <= 64; c++)
		CHECK(hits[c] > 800 && hits[c] < 1200);

	/* the layout names its chain count: more chains later leave it unchanged */
	stk_layout_make(&l, 1 << 20, 4, 8, 5);
	stk_layout_chains(&l, chains);
	struct stk_layout copy = l;
	stk_layout_chains(&copy, again);
	CHECK(memcmp(chains, again, 4 * sizeof(uint32_t)) == 0);

	/* invalid layouts */
	l = (struct stk_layout){.chunk_size = 3 << 20, .stripe = 1, .nchains = 1};
	CHECK(stk_layout_check(&l) != 0);
	l = (struct stk_layout){.chunk_size = 1 << 20, .stripe = 2, .nchains = 1};
	CHECK(stk_layout_check(&l) != 0);
	l = (struct stk_layout){.chunk_size = 1 << 20, .stripe = 1, .nchains = 4, .start = 4};
	CHECK(stk_layout_check(&l) != 0);
	l = (struct stk_layout){.chunk_size = 1 << 10, .stripe = 1, .nchains = 4};
	CHECK(stk_layout_check(&l) != 0);
	l = (struct stk_layout){.chunk_size = 1 << 20, .stripe = 0, .nchains = 4};
	CHECK(stk_layout_check(&l) != 0);

	/* size parsing used by the CLI */
	uint64_t v;
	CHECK(stk_parse_size("4k", &v) == 0 && v == 4096);
	CHECK(stk_parse_size("1MiB", &v) == 0 && v == 1 << 20);
	CHECK(stk_parse_size("2G", &v) == 0 && v == 2ull << 30);
	CHECK(stk_parse_size("12x", &v) != 0);
	CHECK(stk_parse_size("", &v) != 0);
	CHECK(stk_parse_size("99999999999999999999", &v) != 0);
	char host[64];
	uint16_t port;
	CHECK(stk_parse_hostport("127.0.0.1:9400", host, sizeof(host), &port) == 0 && port == 9400);
	CHECK(stk_parse_hostport("[::1]:80", host, sizeof(host), &port) == 0 && strcmp(host, "::1") == 0);
	CHECK(stk_parse_hostport("host:0", host, sizeof(host), &port) != 0);
	CHECK(stk_parse_hostport("host", host, sizeof(host), &port) != 0);
	CHECK(stk_parse_hostport("host:70000", host, sizeof(host), &port) != 0);
	CHECK(stk_crc32c(0, "123456789", 9) == 0xe3069283u); /* the CRC32C check value */

	/*
	 * Buffers for direct reads: every byte usable, the byte at lead on a 2 MiB
	 * boundary for large ones, and a direct read into one lands whole.
	 */
	struct {
		size_t len, lead;
	} hb[] = {{1 << 20, 0}, {(1 << 20) + (64 << 10) + 168, 168}, {16 << 10, 0}, {5 << 20, 4096}};
	for (size_t i = 0; i < sizeof(hb) / sizeof(hb[0]); i++) {
		uint8_t *b = stk_huge_alloc(hb[i].len, hb[i].lead);

		CHECK(b != NULL);
		if (!b)
			continue;
		if (hb[i].len - hb[i].lead >= (256 << 10))
			CHECK((uintptr_t)(b + hb[i].lead) % (2 << 20) == 0);
		memset(b, 0xa5, hb[i].len);
		CHECK(b[0] == 0xa5 && b[hb[i].len - 1] == 0xa5);
		stk_huge_free(b, hb[i].len, hb[i].lead);
	}
	char tmpl[] = "/var/tmp/test_layout.XXXXXX";
	int fd = mkstemp(tmpl);
	uint8_t *hbuf = stk_huge_alloc(1 << 20, 0), *want = malloc(1 << 20);
	CHECK(fd >= 0 && hbuf && want);
	if (fd >= 0 && hbuf && want) {
		int dfd;

		for (size_t i = 0; i < (1 << 20); i++)
			want[i] = (uint8_t)(i * 2654435761u >> 13);
		CHECK(stk_pwrite_all(fd, want, 1 << 20, 0) == 0 && fsync(fd) == 0);
		dfd = open(tmpl, O_RDONLY | O_DIRECT);
		/* Some file systems (tmpfs) refuse O_DIRECT: the buffered read says the same. */
		if (dfd < 0)
			dfd = open(tmpl, O_RDONLY);
		CHECK(dfd >= 0 && pread(dfd, hbuf, 1 << 20, 0) == (1 << 20));
		CHECK(memcmp(hbuf, want, 1 << 20) == 0);
		if (dfd >= 0)
			close(dfd);
	}
	if (fd >= 0) {
		close(fd);
		unlink(tmpl);
	}
	stk_huge_free(hbuf, 1 << 20, 0);
	free(want);

	return check_done();
}
