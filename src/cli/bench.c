/*
 * `stoker bench`: the numbers an operator checks first, measured through the
 * native client. Each phase runs on --threads threads, records the latency of
 * every operation, and prints throughput with p50 and p99:
 *
 *   big write      one --size file written sequentially, each thread its region
 *   big read       the same file read back (page cache dropped first, as root)
 *   4K rand read   --rand-ops random 4 KiB reads of that file
 *   small write    --files files of --small-size bytes (create, write, close)
 *   small read     the same files read whole, in random order
 *   small stat     stat of each
 *   create/stat/unlink   empty files, the metadata path alone
 *
 * Everything it writes goes under PATH (default /.stoker-bench-PID) and is
 * removed at the end. --json prints one JSON object instead of the table.
 */
#include "cli.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../common/layout.h"
#include "../common/util.h"

struct bench;

struct worker {
	struct bench *b;
	unsigned id;
	uint64_t *lat; /* ns per op */
	uint64_t nlat, cap;
	uint64_t seed;
	stk_file *f;
	char *buf;
	int rc;
};

typedef int (*op_fn)(struct worker *w, uint64_t i);

struct bench {
	stk_client *c;
	char dir[4097];
	unsigned threads;
	uint64_t size, block, files, small, rand_ops, meta_ops;
	int drop, json;
	uint32_t *perm; /* random order for the small-file read */
	struct worker *w;
	int nrows;
};

static uint64_t cmp_u64_helper;
static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	(void)cmp_u64_helper;
	return x < y ? -1 : x > y;
}

static void drop_caches(struct bench *b)
{
	int fd;

	if (!b->drop)
		return;
	sync();
	fd = open("/proc/sys/vm/drop_caches", O_WRONLY);
	if (fd < 0)
		return;
	if (write(fd, "3\n", 2) < 0) {
		/* not allowed here: the read is measured warm, and says so below */
	}
	close(fd);
}

static int record(struct worker *w, uint64_t ns)
{
	if (w->nlat == w->cap) {
		uint64_t ncap = w->cap ? w->cap * 2 : 4096;
		uint64_t *n = realloc(w->lat, ncap * sizeof(*n));
		if (!n)
			return -ENOMEM;
		w->lat = n;
		w->cap = ncap;
	}
	w->lat[w->nlat++] = ns;
	return 0;
}

struct phase {
	const char *name;
	op_fn op;
	uint64_t nops;
	int (*setup)(struct worker *w); /* per thread, before timing (may be NULL) */
	int (*teardown)(struct worker *w); /* per thread, timed (e.g. close = fsync) */
	uint64_t bytes_per_op;
	const char *unit;
};

struct run_arg {
	struct worker *w;
	const struct phase *p;
};

static void *run_thread(void *arg)
{
	struct run_arg *ra = arg;
	struct worker *w = ra->w;
	const struct phase *p = ra->p;

	for (uint64_t i = w->id; i < p->nops && !w->rc; i += w->b->threads) {
		uint64_t t0 = stk_now_ns();
		int rc = p->op(w, i);
		if (rc) {
			w->rc = rc;
			break;
		}
		record(w, stk_now_ns() - t0);
	}
	if (!w->rc && p->teardown)
		w->rc = p->teardown(w);
	return NULL;
}

static int run_phase(struct bench *b, const struct phase *p)
{
	pthread_t tids[256];
	struct run_arg ra[256];
	uint64_t t0, t1, n = 0, *all;
	double secs, rate, p50, p99;
	int rc = 0;

	for (unsigned t = 0; t < b->threads; t++) {
		b->w[t].nlat = 0;
		b->w[t].rc = 0;
		if (p->setup && (rc = p->setup(&b->w[t])))
			return rc;
	}
	t0 = stk_now_ns();
	for (unsigned t = 0; t < b->threads; t++) {
		ra[t].w = &b->w[t];
		ra[t].p = p;
		pthread_create(&tids[t], NULL, run_thread, &ra[t]);
	}
	for (unsigned t = 0; t < b->threads; t++)
		pthread_join(tids[t], NULL);
	t1 = stk_now_ns();
	for (unsigned t = 0; t < b->threads; t++) {
		if (b->w[t].rc && !rc)
			rc = b->w[t].rc;
		n += b->w[t].nlat;
	}
	if (rc) {
		cli_err("bench", "%s failed: %s", p->name, stk_strerror(rc));
		return rc;
	}
	all = malloc((n ? n : 1) * sizeof(*all));
	if (!all)
		return -ENOMEM;
	n = 0;
	for (unsigned t = 0; t < b->threads; t++) {
		memcpy(all + n, b->w[t].lat, b->w[t].nlat * sizeof(*all));
		n += b->w[t].nlat;
	}
	qsort(all, n, sizeof(*all), cmp_u64);
	secs = (double)(t1 - t0) / 1e9;
	p50 = n ? (double)all[n / 2] / 1e6 : 0;
	p99 = n ? (double)all[(n * 99) / 100 < n ? (n * 99) / 100 : n - 1] / 1e6 : 0;
	free(all);
	rate = p->bytes_per_op ? (double)(n * p->bytes_per_op) / secs / 1e6 : (double)n / secs;
	if (b->json) {
		printf("%s{\"name\":\"%s\",\"value\":%.1f,\"unit\":\"%s\",\"ops\":%llu,"
		       "\"seconds\":%.3f,\"p50_ms\":%.3f,\"p99_ms\":%.3f}",
		       b->nrows++ ? "," : "", p->name, rate, p->unit, (unsigned long long)n, secs,
		       p50, p99);
	} else {
		printf("| %-16s | %10.1f %-8s | %9.3f ms | %9.3f ms |\n", p->name, rate, p->unit,
		       p50, p99);
	}
	fflush(stdout);
	return 0;
}

/* ---- big file ---- */

static void big_path(struct bench *b, char *out, size_t len)
{
	snprintf(out, len, "%s/big.bin", b->dir);
}

static uint64_t region(struct bench *b)
{
	uint64_t blocks = b->size / b->block;
	return (blocks / b->threads) * b->block;
}

static int open_big(struct worker *w, int flags)
{
	char p[4200];
	big_path(w->b, p, sizeof(p));
	return stk_open(w->b->c, p, flags, 0644, &w->f);
}

static int setup_big_write(struct worker *w)
{
	return open_big(w, O_WRONLY | O_CREAT);
}

static int setup_big_read(struct worker *w)
{
	return open_big(w, O_RDONLY);
}

static int close_big(struct worker *w)
{
	int rc = stk_close(w->f);
	w->f = NULL;
	return rc;
}

static int op_big_write(struct worker *w, uint64_t i)
{
	struct bench *b = w->b;
	uint64_t k = i / b->threads;
	uint64_t off = w->id * region(b) + k * b->block;
	ssize_t n = stk_pwrite(w->f, w->buf, b->block, (off_t)off);
	return n < 0 ? (int)n : 0;
}

static int op_big_read(struct worker *w, uint64_t i)
{
	struct bench *b = w->b;
	uint64_t k = i / b->threads;
	uint64_t off = w->id * region(b) + k * b->block;
	ssize_t n = stk_pread(w->f, w->buf, b->block, (off_t)off);
	if (n < 0)
		return (int)n;
	return (uint64_t)n == b->block ? 0 : -EIO;
}

static int op_rand_read(struct worker *w, uint64_t i)
{
	struct bench *b = w->b;
	uint64_t blocks = (region(b) * b->threads) / 4096;
	uint64_t off = (stk_splitmix64(&w->seed) % blocks) * 4096;
	ssize_t n = stk_pread(w->f, w->buf, 4096, (off_t)off);
	if (n < 0)
		return (int)n;
	return n == 4096 ? 0 : -EIO;
}

/* ---- small files ---- */

static void small_path(struct bench *b, const char *kind, uint64_t i, char *out, size_t len)
{
	snprintf(out, len, "%s/%s/%llu", b->dir, kind, (unsigned long long)i);
}

static int op_small_write(struct worker *w, uint64_t i)
{
	char p[4200];
	stk_file *f;
	ssize_t n;
	int rc;

	small_path(w->b, "small", i, p, sizeof(p));
	rc = stk_open(w->b->c, p, O_WRONLY | O_CREAT | O_TRUNC, 0644, &f);
	if (rc)
		return rc;
	n = stk_write(f, w->buf, w->b->small);
	rc = stk_close(f);
	return n < 0 ? (int)n : rc;
}

static int op_small_read(struct worker *w, uint64_t i)
{
	char p[4200];
	stk_file *f;
	ssize_t n;
	int rc;

	small_path(w->b, "small", w->b->perm[i], p, sizeof(p));
	rc = stk_open(w->b->c, p, O_RDONLY, 0, &f);
	if (rc)
		return rc;
	n = stk_read(f, w->buf, w->b->small);
	stk_close(f);
	if (n < 0)
		return (int)n;
	return (uint64_t)n == w->b->small ? 0 : -EIO;
}

static int op_small_stat(struct worker *w, uint64_t i)
{
	char p[4200];
	struct stat st;

	small_path(w->b, "small", w->b->perm[i], p, sizeof(p));
	return stk_stat(w->b->c, p, &st);
}

static int op_meta_create(struct worker *w, uint64_t i)
{
	char p[4200];
	stk_file *f;
	int rc;

	small_path(w->b, "meta", i, p, sizeof(p));
	rc = stk_open(w->b->c, p, O_WRONLY | O_CREAT | O_EXCL, 0644, &f);
	if (rc)
		return rc;
	return stk_close(f);
}

static int op_meta_stat(struct worker *w, uint64_t i)
{
	char p[4200];
	struct stat st;

	small_path(w->b, "meta", i, p, sizeof(p));
	return stk_stat(w->b->c, p, &st);
}

static int op_meta_unlink(struct worker *w, uint64_t i)
{
	char p[4200];

	small_path(w->b, "meta", i, p, sizeof(p));
	return stk_unlink(w->b->c, p);
}

static void cleanup(struct bench *b)
{
	char p[4200];

	for (uint64_t i = 0; i < b->files; i++) {
		small_path(b, "small", i, p, sizeof(p));
		stk_unlink(b->c, p);
	}
	for (uint64_t i = 0; i < b->meta_ops; i++) {
		small_path(b, "meta", i, p, sizeof(p));
		stk_unlink(b->c, p);
	}
	snprintf(p, sizeof(p), "%s/small", b->dir);
	stk_rmdir(b->c, p);
	snprintf(p, sizeof(p), "%s/meta", b->dir);
	stk_rmdir(b->c, p);
	big_path(b, p, sizeof(p));
	stk_unlink(b->c, p);
	stk_rmdir(b->c, b->dir);
}

static const struct option bench_opts[] = {
	{"threads", required_argument, NULL, 't'}, {"size", required_argument, NULL, 's'},
	{"block", required_argument, NULL, 'b'},   {"files", required_argument, NULL, 'f'},
	{"small-size", required_argument, NULL, 'S'}, {"rand-ops", required_argument, NULL, 'r'},
	{"meta-ops", required_argument, NULL, 'm'}, {"no-drop-caches", no_argument, NULL, 'n'},
	{"json", no_argument, NULL, 'j'},          {NULL, 0, NULL, 0},
};

int cmd_bench(int argc, char **argv)
{
	struct bench b;
	char cluster[128];
	uint64_t v;
	int c, rc = 0;

	if (argc > 1 && strcmp(argv[1], "loader") == 0)
		return cmd_bench_loader(argc - 1, argv + 1); /* bench_loader.c */
	memset(&b, 0, sizeof(b));
	b.threads = 4;
	b.size = 1ull << 30;
	b.block = 1 << 20;
	b.files = 2000;
	b.small = 16 << 10;
	b.rand_ops = 20000;
	b.meta_ops = 4000;
	b.drop = geteuid() == 0;
	optind = 1;
	while ((c = getopt_long(argc, argv, "", bench_opts, NULL)) != -1) {
		switch (c) {
		case 't':
			if (stk_parse_u64(optarg, &v) || v < 1 || v > 256)
				goto bad;
			b.threads = (unsigned)v;
			break;
		case 's':
			if (stk_parse_size(optarg, &b.size) || b.size < (1 << 20))
				goto bad;
			break;
		case 'b':
			if (stk_parse_size(optarg, &b.block) || b.block < 4096 || b.block > (64u << 20))
				goto bad;
			break;
		case 'f':
			if (stk_parse_u64(optarg, &b.files) || b.files < 1)
				goto bad;
			break;
		case 'S':
			if (stk_parse_size(optarg, &b.small) || b.small < 1 || b.small > (64u << 20))
				goto bad;
			break;
		case 'r':
			if (stk_parse_u64(optarg, &b.rand_ops))
				goto bad;
			break;
		case 'm':
			if (stk_parse_u64(optarg, &b.meta_ops))
				goto bad;
			break;
		case 'n':
			b.drop = 0;
			break;
		case 'j':
			b.json = 1;
			break;
		default:
			return cli_usage("bench");
		}
	}
	{
		char def[64];
		snprintf(def, sizeof(def), "/.stoker-bench-%d", (int)getpid());
		if (cli_split(optind < argc ? argv[optind] : def, cluster, sizeof(cluster), b.dir,
			      sizeof(b.dir)))
			goto bad;
	}
	if (b.size / b.block < b.threads) {
		cli_err("bench", "--size must hold at least one --block per thread");
		return 2;
	}
	b.c = cli_connect("bench", cluster[0] ? cluster : NULL);
	if (!b.c)
		return 1;
	b.w = calloc(b.threads, sizeof(*b.w));
	b.perm = malloc(b.files * sizeof(*b.perm));
	if (!b.w || !b.perm)
		return 1;
	for (unsigned t = 0; t < b.threads; t++) {
		b.w[t].b = &b;
		b.w[t].id = t;
		b.w[t].seed = stk_now_ns() + t;
		b.w[t].buf = malloc(STK_MAX(b.block, b.small));
		if (!b.w[t].buf)
			return 1;
		memset(b.w[t].buf, 'a' + (int)t, STK_MAX(b.block, b.small));
	}
	{
		uint64_t s = stk_now_ns();
		for (uint64_t i = 0; i < b.files; i++)
			b.perm[i] = (uint32_t)i;
		for (uint64_t i = b.files; i > 1; i--) {
			uint64_t j = stk_splitmix64(&s) % i;
			uint32_t tmp = b.perm[i - 1];
			b.perm[i - 1] = b.perm[j];
			b.perm[j] = tmp;
		}
	}
	{
		char p[4200];
		rc = stk_mkdir(b.c, b.dir, 0755);
		if (rc && rc != -EEXIST) {
			cli_err("bench", "%s: %s", b.dir, stk_strerror(rc));
			return 1;
		}
		snprintf(p, sizeof(p), "%s/small", b.dir);
		stk_mkdir(b.c, p, 0755);
		snprintf(p, sizeof(p), "%s/meta", b.dir);
		stk_mkdir(b.c, p, 0755);
	}
	uint64_t big_ops = region(&b) / b.block * b.threads;
	const struct phase phases[] = {
		{"big write", op_big_write, big_ops, setup_big_write, close_big, b.block, "MB/s"},
		{"big read", op_big_read, big_ops, setup_big_read, close_big, b.block, "MB/s"},
		{"4K rand read", op_rand_read, b.rand_ops, setup_big_read, close_big, 0, "IOPS"},
		{"small write", op_small_write, b.files, NULL, NULL, 0, "files/s"},
		{"small read", op_small_read, b.files, NULL, NULL, 0, "files/s"},
		{"small stat", op_small_stat, b.files, NULL, NULL, 0, "files/s"},
		{"create", op_meta_create, b.meta_ops, NULL, NULL, 0, "ops/s"},
		{"stat", op_meta_stat, b.meta_ops, NULL, NULL, 0, "ops/s"},
		{"unlink", op_meta_unlink, b.meta_ops, NULL, NULL, 0, "ops/s"},
	};
	if (b.json) {
		printf("{\"threads\":%u,\"size\":%llu,\"block\":%llu,\"files\":%llu,"
		       "\"small_size\":%llu,\"cold\":%s,\"results\":[",
		       b.threads, (unsigned long long)b.size, (unsigned long long)b.block,
		       (unsigned long long)b.files, (unsigned long long)b.small,
		       b.drop ? "true" : "false");
	} else {
		char s1[32], s2[32], s3[32];
		printf("stoker bench: %u threads, big file %s in %s blocks, %llu small files of %s, "
		       "cache %s\n",
		       b.threads, stk_format_size(b.size, s1, sizeof(s1)),
		       stk_format_size(b.block, s2, sizeof(s2)), (unsigned long long)b.files,
		       stk_format_size(b.small, s3, sizeof(s3)),
		       b.drop ? "dropped before reads" : "warm (not root, or --no-drop-caches)");
		printf("+------------------+---------------------+--------------+--------------+\n"
		       "| %-16s | %-19s | %-12s | %-12s |\n"
		       "+------------------+---------------------+--------------+--------------+\n",
		       "ITEM", "VALUE", "P50", "P99");
	}
	for (size_t i = 0; i < STK_ARRAY_SIZE(phases) && !rc; i++) {
		if (phases[i].nops == 0)
			continue;
		if (i == 1 || i == 4)
			drop_caches(&b);
		rc = run_phase(&b, &phases[i]);
	}
	if (b.json)
		printf("]}\n");
	else
		printf("+------------------+---------------------+--------------+--------------+\n");
	cleanup(&b);
	for (unsigned t = 0; t < b.threads; t++) {
		free(b.w[t].buf);
		free(b.w[t].lat);
	}
	free(b.w);
	free(b.perm);
	return rc ? 1 : 0;
bad:
	cli_err("bench", "bad value for an option");
	return cli_usage("bench");
}
