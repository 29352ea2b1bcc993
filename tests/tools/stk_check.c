/*
 * stk_check: the C test client the integration tests drive. Each subcommand does
 * one thing through libstoker (or a raw socket) and exits 0 when what it saw is
 * what it expected, 1 otherwise, printing why.
 *
 *   write   CLUSTER PATH SIZE SEED [BS]   write a deterministic pattern, close
 *   verify  CLUSTER PATH SIZE SEED        read it back whole and at random offsets
 *   verifymany CLUSTER                    the same for each "PATH SIZE SEED" line of stdin
 *   api     CLUSTER DIR                   every API call and its errors
 *   concurrent CLUSTER DIR THREADS SIZE   writers to different files at once, verified
 *   ackloop CLUSTER DIR [MAX]             write+fsync files (up to MAX bytes, 3M) forever,
 *                                         print "ACK name size seed"
 *   fill    CLUSTER PATH                  write until ENOSPC; prints the bytes acknowledged
 *   frames  HOST:PORT                     malformed frames on raw sockets; server survives
 *   truncates HOST:PORT INO               malformed STOR_TRUNCATES naming INO to a storage
 *                                         node: each refused (EBADMSG), nothing truncated
 *   fence   HOST:PORT INO CHAINS         STOR_TRUNCATE(S) of INO on chains 1..CHAINS with
 *                                         no and with a made-up namespace identity: each
 *                                         refused (PERM), nothing truncated
 *   batch   CLUSTER DIR                   batched reads and writes (stk_batch_*): every
 *                                         completion once, right bytes, right errors
 *   watch   HOST:PORT                     hostile META_WATCH / META_LOOKUP_CACHE /
 *                                         META_ALLOW (_BYTES) / META_EXTEND's ext to
 *                                         meta: refused or contained, meta still serves
 *   special CLUSTER DIR                   stk_mknod (as root) and stk_fallocate: types,
 *                                         rdev, errors, bytes and st_blocks after holes
 *   staleread CLUSTER PATH SECONDS     one client reads PATH whole again and again,
 *                                         printing "READ size fnv1a64 T0 T1 SC PEND"
 *                                         for each (see cmd_staleread)
 *   overwrite CLUSTER PATH SEED           writes a pattern over PATH in place (its
 *                                         size), printing "START T" and "ACKED T"
 *   repl    HOST:PORT EPOCH               hostile META_REPL to a meta follower of the
 *                                         shard's epoch EPOCH: malformed, a stale epoch,
 *                                         another leader, an epoch the routing table does
 *                                         not know; each refused, clients told NOT_LEADER,
 *                                         and it still answers
 *   cluster CLUSTER TARGETS PATH          the cluster status (stk_cluster_*) of a `stoker
 *                                         up` cluster of TARGETS targets; its chunk counts
 *                                         grow once PATH is written; the calls' errors
 *   truncloop CLUSTER DIR THREADS SECS [SIZE]  writes and truncates files whose inodes
 *                                         share a storage lock slot (see the function)
 *   shardgate HOST:PORT                   a meta node of shard 2 (docs/meta-shards.md)
 *   shardroute CLUSTER                    requests routed by inode over two shards
 *   xshard ADDR                           a meta node's inodes, intents, marks, releases
 *                                         refuses client requests (EXDEV) and still answers
 *   chunk HOST:PORT INO read|truncate|prefetch  one chunk request for INO straight to a
 *                                         storage node with $STOKER_KEY_FILE's key;
 *                                         prints the errno's name it answered
 *   handshake HOST:PORT                   connects to one daemon with the key of
 *                                         $STOKER_KEY_FILE (over TLS with STOKER_TLS=1);
 *                                         prints OK or the errno's name
 *   ino CLUSTER OP ARG...                 one request by inode number (stoker_ll.h), as
 *                                         a client key's holder may craft it; prints the
 *                                         errno's name (OK for 0) and exits 0. OP: getattr
 *                                         INO, getattrs INO, readdir INO, read INO (open by
 *                                         inode, read 1 byte), listread INO (readdir, one
 *                                         getattrs of what it lists, a byte of each file
 *                                         opened from those; prints "files N"), chmod INO,
 *                                         setxattr INO,
 *                                         lookup DIR NAME, create DIR NAME, mkdir DIR NAME,
 *                                         unlink DIR NAME, link INO DIR NAME, rename DIR
 *                                         NAME DIR NAME; raw INO read|write: chunks
 *                                         straight from storage, the layout taken with
 *                                         $STOKER_ADMIN_KEY_FILE (the cluster key)
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/fs.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "stoker/stoker.h"
#include "stoker/stoker_ll.h"

#include "client/client.h"
#include "common/layout.h"
#include "common/util.h"
#include "net/net.h"
#include "proto/codec.h"
#include "proto/msg.h"
#include "proto/wire.h"
#include "proto/status.h"

static int failures;
#define CHECK(cond)                                                                        \
	do {                                                                               \
		if (!(cond)) {                                                             \
			fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
			failures++;                                                        \
		}                                                                          \
	} while (0)
#define CHECK_RC(expr, want)                                                               \
	do {                                                                               \
		long _rc = (long)(expr);                                                   \
		if (_rc != (long)(want)) {                                                 \
			fprintf(stderr, "%s:%d: %s returned %ld (%s), wanted %ld\n", __FILE__, \
				__LINE__, #expr, _rc, _rc < 0 ? stk_strerror((int)_rc) : "",  \
				(long)(want));                                             \
			failures++;                                                        \
		}                                                                          \
	} while (0)

/* The byte pattern: 8 bytes at a time from splitmix64 of (seed, offset / 8). */
static void pattern(uint64_t seed, uint64_t off, char *buf, size_t len)
{
	while (len) {
		uint64_t word_idx = off / 8, st = (seed << 40) ^ word_idx ^ 0x5bd1e995ull;
		uint64_t v = stk_splitmix64(&st);
		size_t in = off % 8, take = STK_MIN(len, 8 - in);
		memcpy(buf, (char *)&v + in, take);
		buf += take;
		off += take;
		len -= take;
	}
}

static stk_client *connect_or_die(const char *cluster)
{
	stk_client *c;
	int rc = stk_connect(cluster, NULL, &c);
	if (rc) {
		fprintf(stderr, "connect %s: %s\n", cluster, stk_strerror(rc));
		exit(1);
	}
	return c;
}

static int write_file(stk_client *c, const char *path, uint64_t size, uint64_t seed, size_t bs)
{
	stk_file *f;
	char *buf = malloc(bs);
	uint64_t off = 0;
	int rc;

	if (!buf)
		return -ENOMEM;
	rc = stk_open(c, path, O_WRONLY | O_CREAT | O_TRUNC, 0644, &f);
	if (rc) {
		free(buf);
		return rc;
	}
	while (off < size) {
		size_t n = (size_t)STK_MIN((uint64_t)bs, size - off);
		pattern(seed, off, buf, n);
		ssize_t w = stk_write(f, buf, n);
		if (w < 0) {
			stk_close(f);
			free(buf);
			return (int)w;
		}
		off += n;
	}
	rc = stk_close(f);
	free(buf);
	return rc;
}

static int verify_file(stk_client *c, const char *path, uint64_t size, uint64_t seed)
{
	size_t bs = 4 << 20;
	char *buf = malloc(bs), *want = malloc(bs);
	struct stat st;
	stk_file *f;
	uint64_t off = 0, rs = seed;
	int rc, bad = 0;

	if (!buf || !want)
		return -ENOMEM;
	rc = stk_open(c, path, O_RDONLY, 0, &f);
	if (rc)
		goto out;
	rc = stk_fstat(f, &st);
	if (rc == 0 && (uint64_t)st.st_size != size) {
		fprintf(stderr, "%s: size %lld, expected %llu\n", path, (long long)st.st_size,
			(unsigned long long)size);
		bad = 1;
	}
	while (rc == 0 && off < size) {
		size_t n = (size_t)STK_MIN((uint64_t)bs, size - off);
		ssize_t r = stk_read(f, buf, n);
		if (r < 0) {
			rc = (int)r;
			break;
		}
		pattern(seed, off, want, n);
		if ((size_t)r != n || memcmp(buf, want, n) != 0) {
			fprintf(stderr, "%s: mismatch in [%llu, %llu) (read %zd)\n", path,
				(unsigned long long)off, (unsigned long long)(off + n), r);
			bad = 1;
			break;
		}
		off += n;
	}
	/* random reads straddling chunk boundaries */
	for (int i = 0; rc == 0 && !bad && size && i < 64; i++) {
		uint64_t o = stk_splitmix64(&rs) % size;
		uint64_t want_len = 1 + stk_splitmix64(&rs) % (3u << 20); /* STK_MIN evaluates twice */
		size_t n = (size_t)STK_MIN(size - o, want_len);
		ssize_t r = stk_pread(f, buf, n, (off_t)o);
		pattern(seed, o, want, n);
		if (r != (ssize_t)n || memcmp(buf, want, n) != 0) {
			fprintf(stderr, "%s: random read at %llu+%zu wrong (%zd)\n", path,
				(unsigned long long)o, n, r);
			bad = 1;
		}
	}
	if (rc == 0) {
		char one;
		CHECK_RC(stk_pread(f, &one, 1, (off_t)size), 0);
	}
	stk_close(f);
out:
	free(buf);
	free(want);
	if (rc)
		fprintf(stderr, "%s: %s\n", path, stk_strerror(rc));
	return rc ? rc : bad ? -EIO : 0;
}

static int cmd_write(int argc, char **argv)
{
	uint64_t size, seed, bs = 1 << 20;
	if (argc < 5 || stk_parse_size(argv[3], &size) || stk_parse_u64(argv[4], &seed) ||
	    (argc > 5 && stk_parse_size(argv[5], &bs)) || bs == 0)
		return 2;
	stk_client *c = connect_or_die(argv[1]);
	int rc = write_file(c, argv[2], size, seed, (size_t)bs);
	if (rc)
		fprintf(stderr, "write %s: %s\n", argv[2], stk_strerror(rc));
	stk_disconnect(c);
	return rc ? 1 : 0;
}

static int cmd_verify(int argc, char **argv)
{
	uint64_t size, seed;
	if (argc < 5 || stk_parse_size(argv[3], &size) || stk_parse_u64(argv[4], &seed))
		return 2;
	stk_client *c = connect_or_die(argv[1]);
	int rc = verify_file(c, argv[2], size, seed);
	stk_disconnect(c);
	return rc ? 1 : 0;
}

/* verifymany CLUSTER: "PATH SIZE SEED" lines on stdin, each verified as verify does. */
static int cmd_verifymany(int argc, char **argv)
{
	char line[4400], path[4200], size_s[32], seed_s[32];
	unsigned long n = 0, bad = 0;

	if (argc < 2)
		return 2;
	stk_client *c = connect_or_die(argv[1]);
	while (fgets(line, sizeof(line), stdin)) {
		uint64_t size, seed;

		if (sscanf(line, "%4199s %31s %31s", path, size_s, seed_s) != 3 ||
		    stk_parse_size(size_s, &size) || stk_parse_u64(seed_s, &seed)) {
			fprintf(stderr, "verifymany: bad line: %s", line);
			bad++;
			continue;
		}
		n++;
		if (verify_file(c, path, size, seed))
			bad++;
	}
	stk_disconnect(c);
	printf("verifymany: %lu files, %lu bad\n", n, bad);
	return bad ? 1 : 0;
}

static void join(char *out, size_t len, const char *dir, const char *name)
{
	snprintf(out, len, "%s/%s", dir, name);
}

static int cmd_api(int argc, char **argv)
{
	char p[4200], q[4200], r[4200], buf[8192];
	struct stat st;
	stk_file *f, *g;
	stk_dir *d;
	struct dirent de;
	struct statvfs sv;
	stk_client *c;

	if (argc < 3)
		return 2;
	c = connect_or_die(argv[1]);
	const char *dir = argv[2];
	CHECK_RC(stk_mkdir(c, dir, 0755), 0);
	CHECK_RC(stk_mkdir(c, dir, 0755), -EEXIST);
	CHECK_RC(stk_stat(c, dir, &st), 0);
	CHECK(S_ISDIR(st.st_mode));

	/* open flags */
	join(p, sizeof(p), dir, "a");
	CHECK_RC(stk_open(c, p, O_RDONLY, 0, &f), -ENOENT);
	CHECK_RC(stk_open(c, p, O_RDWR | O_CREAT | O_EXCL, 0640, &f), 0);
	CHECK_RC(stk_open(c, p, O_RDWR | O_CREAT | O_EXCL, 0640, &g), -EEXIST);
	CHECK_RC(stk_write(f, "hello", 5), 5);
	CHECK_RC(stk_pwrite(f, "world", 5, 10), 5); /* hole at 5..10 */
	CHECK_RC(stk_pread(f, buf, sizeof(buf), 0), 15);
	CHECK(memcmp(buf, "hello\0\0\0\0\0world", 15) == 0);
	CHECK_RC(stk_fsync(f), 0);
	CHECK_RC(stk_fstat(f, &st), 0);
	CHECK(st.st_size == 15 && (st.st_mode & 0777) == 0640 && S_ISREG(st.st_mode));
	CHECK_RC(stk_lseek(f, 0, SEEK_END), 15);
	CHECK_RC(stk_lseek(f, -1, SEEK_SET), -EINVAL);
	CHECK_RC(stk_ftruncate(f, 3), 0);
	CHECK_RC(stk_pread(f, buf, sizeof(buf), 0), 3);
	CHECK_RC(stk_ftruncate(f, 100), 0);
	CHECK_RC(stk_pread(f, buf, sizeof(buf), 0), 100);
	CHECK(memcmp(buf, "hel", 3) == 0 && buf[3] == 0 && buf[50] == 0 && buf[99] == 0);
	CHECK_RC(stk_close(f), 0);
	CHECK_RC(stk_stat(c, p, &st), 0);
	CHECK(st.st_size == 100);

	CHECK_RC(stk_open(c, p, O_RDONLY, 0, &f), 0);
	CHECK_RC(stk_write(f, "x", 1), -EBADF);
	CHECK_RC(stk_close(f), 0);
	CHECK_RC(stk_open(c, p, O_WRONLY, 0, &f), 0);
	CHECK_RC(stk_read(f, buf, 1), -EBADF);
	CHECK_RC(stk_close(f), 0);

	/* O_TRUNC and O_APPEND */
	CHECK_RC(stk_open(c, p, O_WRONLY | O_TRUNC, 0, &f), 0);
	CHECK_RC(stk_write(f, "abc", 3), 3);
	CHECK_RC(stk_close(f), 0);
	CHECK_RC(stk_open(c, p, O_WRONLY | O_APPEND, 0, &f), 0);
	CHECK_RC(stk_write(f, "def", 3), 3);
	CHECK_RC(stk_close(f), 0);
	CHECK_RC(stk_open(c, p, O_RDONLY, 0, &f), 0);
	CHECK_RC(stk_read(f, buf, sizeof(buf)), 6);
	CHECK(memcmp(buf, "abcdef", 6) == 0);
	CHECK_RC(stk_read(f, buf, sizeof(buf)), 0);
	CHECK_RC(stk_close(f), 0);

	/* directories as files */
	CHECK_RC(stk_open(c, dir, O_WRONLY, 0, &f), -EISDIR);
	join(q, sizeof(q), p, "under-a-file");
	CHECK_RC(stk_open(c, q, O_RDWR | O_CREAT, 0644, &f), -ENOTDIR);
	CHECK_RC(stk_mkdir(c, q, 0755), -ENOTDIR);

	/* names */
	memset(buf, 'n', 255);
	buf[255] = 0;
	join(q, sizeof(q), dir, buf);
	CHECK_RC(stk_open(c, q, O_RDWR | O_CREAT, 0644, &f), 0);
	if (failures == 0)
		stk_close(f);
	CHECK_RC(stk_unlink(c, q), 0);
	memset(buf, 'n', 256);
	buf[256] = 0;
	join(q, sizeof(q), dir, buf);
	CHECK_RC(stk_open(c, q, O_RDWR | O_CREAT, 0644, &f), -ENAMETOOLONG);
	join(q, sizeof(q), dir, "sp ace\tand\xff\x01bytes");
	CHECK_RC(stk_mkdir(c, q, 0700), 0);
	CHECK_RC(stk_rmdir(c, q), 0);

	/* rename */
	join(q, sizeof(q), dir, "b");
	CHECK_RC(stk_rename(c, p, q, 0), 0);
	CHECK_RC(stk_stat(c, p, &st), -ENOENT);
	CHECK_RC(stk_stat(c, q, &st), 0);
	CHECK(st.st_size == 6);
	join(r, sizeof(r), dir, "c");
	CHECK_RC(write_file(c, r, 1000, 7, 4096), 0);
	CHECK_RC(stk_rename(c, r, q, RENAME_NOREPLACE), -EEXIST);
	CHECK_RC(stk_rename(c, r, q, 0), 0); /* replaces b; b's data is removed */
	CHECK_RC(verify_file(c, q, 1000, 7), 0);
	CHECK_RC(write_file(c, r, 2000, 8, 4096), 0);
	CHECK_RC(stk_rename(c, r, q, RENAME_EXCHANGE), 0);
	CHECK_RC(verify_file(c, q, 2000, 8), 0);
	CHECK_RC(verify_file(c, r, 1000, 7), 0);
	join(p, sizeof(p), dir, "sub");
	CHECK_RC(stk_mkdir(c, p, 0755), 0);
	join(r, sizeof(r), p, "inner");
	CHECK_RC(stk_mkdir(c, r, 0755), 0);
	CHECK_RC(stk_rename(c, p, r, 0), -EINVAL); /* into its own subtree */
	CHECK_RC(stk_rmdir(c, p), -ENOTEMPTY);
	CHECK_RC(stk_rmdir(c, r), 0);

	/* links */
	join(r, sizeof(r), dir, "hard");
	CHECK_RC(stk_link(c, q, r), 0);
	CHECK_RC(stk_stat(c, q, &st), 0);
	CHECK(st.st_nlink == 2);
	CHECK_RC(stk_unlink(c, q), 0);
	CHECK_RC(verify_file(c, r, 2000, 8), 0); /* the data lives while a link does */
	CHECK_RC(stk_link(c, p, q), -EPERM);
	join(q, sizeof(q), dir, "sym");
	CHECK_RC(stk_symlink(c, "hard", q), 0);
	CHECK_RC(stk_readlink(c, q, buf, sizeof(buf)), 4);
	CHECK(strcmp(buf, "hard") == 0);
	CHECK_RC(stk_stat(c, q, &st), 0);
	CHECK(S_ISLNK(st.st_mode));
	CHECK_RC(stk_open(c, q, O_RDONLY, 0, &f), 0); /* follows the link */
	if (failures == 0) {
		CHECK_RC(stk_read(f, buf, 10), 10);
		stk_close(f);
	}
	CHECK_RC(stk_readlink(c, r, buf, sizeof(buf)), -EINVAL);
	join(p, sizeof(p), dir, "loop");
	CHECK_RC(stk_symlink(c, "loop", p), 0);
	CHECK_RC(stk_open(c, p, O_RDONLY, 0, &f), -ELOOP);

	/* attributes */
	CHECK_RC(stk_chmod(c, r, 0600), 0);
	CHECK_RC(stk_stat(c, r, &st), 0);
	CHECK((st.st_mode & 07777) == 0600);
	struct timespec ts[2] = {{.tv_sec = 1000, .tv_nsec = 5}, {.tv_sec = 2000, .tv_nsec = 7}};
	CHECK_RC(stk_utimens(c, r, ts), 0);
	CHECK_RC(stk_stat(c, r, &st), 0);
	CHECK(st.st_atim.tv_sec == 1000 && st.st_mtim.tv_sec == 2000 && st.st_mtim.tv_nsec == 7);
	ts[0].tv_nsec = UTIME_OMIT;
	ts[1].tv_nsec = UTIME_NOW;
	CHECK_RC(stk_utimens(c, r, ts), 0);
	CHECK_RC(stk_stat(c, r, &st), 0);
	CHECK(st.st_atim.tv_sec == 1000 && st.st_mtim.tv_sec > 2000);
	CHECK_RC(stk_chown(c, r, 1234, 5678), 0); /* run as root */
	CHECK_RC(stk_stat(c, r, &st), 0);
	CHECK(st.st_uid == 1234 && st.st_gid == 5678);
	CHECK_RC(stk_truncate(c, r, 10), 0);
	CHECK_RC(verify_file(c, r, 10, 8), 0);

	/* listing */
	int n = 0, seen_hard = 0;
	CHECK_RC(stk_opendir(c, dir, &d), 0);
	if (d) {
		int rc;
		while ((rc = stk_readdir(d, &de)) == 1) {
			n++;
			if (strcmp(de.d_name, "hard") == 0)
				seen_hard = de.d_type == DT_REG;
		}
		CHECK_RC(rc, 0);
		stk_closedir(d);
	}
	CHECK(seen_hard);
	CHECK(n == 5); /* c, hard, sym, sub, loop */
	CHECK_RC(stk_opendir(c, r, &d), -ENOTDIR);
	CHECK_RC(stk_statfs(c, &sv), 0);
	CHECK(sv.f_blocks > 0 && sv.f_namemax == 255);

	/* paths */
	snprintf(p, sizeof(p), "%s/./sub/../hard", dir);
	CHECK_RC(stk_stat(c, p, &st), 0);
	CHECK_RC(stk_stat(c, "relative", &st), -EINVAL);
	CHECK_RC(stk_rmdir(c, "/"), -EBUSY);

	stk_disconnect(c);
	if (failures)
		fprintf(stderr, "api: %d failures\n", failures);
	else
		printf("api: ok\n");
	return failures ? 1 : 0;
}

struct conc_arg {
	stk_client *c;
	char path[4200];
	uint64_t size, seed;
	int rc;
};

static void *conc_writer(void *p)
{
	struct conc_arg *a = p;
	a->rc = write_file(a->c, a->path, a->size, a->seed, 256 << 10);
	return NULL;
}

static int cmd_concurrent(int argc, char **argv)
{
	uint64_t nt, size;
	if (argc < 5 || stk_parse_u64(argv[3], &nt) || nt < 1 || nt > 64 ||
	    stk_parse_size(argv[4], &size))
		return 2;
	stk_client *c = connect_or_die(argv[1]);
	struct conc_arg a[64];
	pthread_t t[64];
	stk_mkdir(c, argv[2], 0755);
	for (uint64_t i = 0; i < nt; i++) {
		a[i].c = c;
		snprintf(a[i].path, sizeof(a[i].path), "%s/w%llu", argv[2], (unsigned long long)i);
		a[i].size = size + i * 4097;
		a[i].seed = 100 + i;
		pthread_create(&t[i], NULL, conc_writer, &a[i]);
	}
	for (uint64_t i = 0; i < nt; i++) {
		pthread_join(t[i], NULL);
		CHECK_RC(a[i].rc, 0);
	}
	for (uint64_t i = 0; i < nt; i++)
		CHECK_RC(verify_file(c, a[i].path, a[i].size, a[i].seed), 0);
	stk_disconnect(c);
	if (!failures)
		printf("concurrent: %llu writers ok\n", (unsigned long long)nt);
	return failures ? 1 : 0;
}

static int cmd_ackloop(int argc, char **argv)
{
	if (argc < 3)
		return 2;
	uint64_t max = 3u << 20;

	if (argc > 3 && (stk_parse_size(argv[3], &max) || max == 0))
		return 2;
	stk_client *c = connect_or_die(argv[1]);
	stk_mkdir(c, argv[2], 0755);
	setvbuf(stdout, NULL, _IOLBF, 0);
	for (uint64_t i = 0;; i++) {
		char p[4200];
		uint64_t size = (i * 7919) % max + 1;
		snprintf(p, sizeof(p), "%s/f%llu", argv[2], (unsigned long long)i);
		int rc = write_file(c, p, size, i + 1, 256 << 10);
		if (rc) {
			fprintf(stderr, "ackloop: %s: %s\n", p, stk_strerror(rc));
			return 1;
		}
		printf("ACK %s %llu %llu\n", p, (unsigned long long)size,
		       (unsigned long long)(i + 1));
	}
}

/*
 * truncloop CLUSTER DIR THREADS SECONDS [SIZE]: THREADS threads, each on a file of
 * its own in DIR (files whose inodes share a storage node's inode lock slot),
 * write SIZE bytes (default 3 MiB: chunks on several chains),
 * fsync, and truncate the file to 4 KiB, again and again for SECONDS. Prints
 * "TRUNCLOOP ops N max_ms M" (the slowest write+fsync or truncate); exits 1 on
 * any error. Truncates and writes of different inodes on chains whose heads sit
 * on each other's nodes must never wait on each other.
 */
struct tl_arg {
	stk_client *c;
	char path[4200];
	uint64_t size, end, ops, max_ns;
	int rc;
};

static void *tl_main(void *arg)
{
	struct tl_arg *a = arg;
	char *buf = malloc(256 << 10);
	stk_file *f = NULL;

	if (!buf) {
		a->rc = -ENOMEM;
		return NULL;
	}
	a->rc = stk_open(a->c, a->path, O_RDWR | O_CREAT | O_TRUNC, 0644, &f);
	for (uint64_t i = 0; a->rc == 0 && stk_now_ns() < a->end; i++) {
		uint64_t t0 = stk_now_ns(), t1;

		for (uint64_t off = 0; a->rc == 0 && off < a->size; off += 256 << 10) {
			size_t n = (size_t)STK_MIN((uint64_t)(256 << 10), a->size - off);
			ssize_t w;

			pattern(i + 1, off, buf, n);
			w = stk_pwrite(f, buf, n, (off_t)off);
			if (w < 0)
				a->rc = (int)w;
		}
		if (a->rc == 0)
			a->rc = stk_fsync(f);
		t1 = stk_now_ns();
		a->max_ns = STK_MAX(a->max_ns, t1 - t0);
		if (a->rc == 0)
			a->rc = stk_ftruncate(f, 4096);
		a->max_ns = STK_MAX(a->max_ns, stk_now_ns() - t1);
		a->ops += 2;
	}
	if (f) {
		int rc = stk_close(f);

		if (a->rc == 0)
			a->rc = rc;
	}
	free(buf);
	return NULL;
}

static int cmd_truncloop(int argc, char **argv)
{
	uint64_t threads, secs, size = 3u << 20, ops = 0, max_ns = 0;
	struct tl_arg *a;
	pthread_t t[64];
	int bad = 0;

	if (argc < 5 || stk_parse_u64(argv[3], &threads) || threads == 0 || threads > 64 ||
	    stk_parse_u64(argv[4], &secs) || (argc > 5 && stk_parse_size(argv[5], &size)))
		return 2;
	stk_client *c = connect_or_die(argv[1]);
	stk_mkdir(c, argv[2], 0755);
	a = calloc(threads, sizeof(*a));
	if (!a)
		return 1;
	/* Files whose inodes share one of a storage node's inode lock slots (the hash
	 * of ino_lock in src/storage/service.c), so that their changes meet there: of
	 * files created in turn, those of the first one's slot. */
	uint64_t found = 0, slot = 0;

	for (uint64_t n = 0; found < threads && n < 64 * 1024; n++) {
		char p[4200];
		struct stat st;
		stk_file *f;
		uint64_t k;

		snprintf(p, sizeof(p), "%s/c%llu", argv[2], (unsigned long long)n);
		if (stk_open(c, p, O_WRONLY | O_CREAT, 0644, &f) || stk_close(f) ||
		    stk_stat(c, p, &st)) {
			fprintf(stderr, "truncloop: cannot create %s\n", p);
			return 1;
		}
		k = ((uint64_t)st.st_ino * 0x9E3779B97F4A7C15ull) >> 56;
		if (found == 0)
			slot = k;
		if (k == slot)
			stk_strlcpy(a[found++].path, p, sizeof(a[0].path));
		else
			stk_unlink(c, p);
	}
	if (found < threads) {
		fprintf(stderr, "truncloop: only %llu files share a lock slot\n",
			(unsigned long long)found);
		return 1;
	}
	for (uint64_t i = 0; i < threads; i++) {
		a[i].c = c;
		a[i].size = size;
		a[i].end = stk_now_ns() + secs * 1000000000ull;
		pthread_create(&t[i], NULL, tl_main, &a[i]);
	}
	for (uint64_t i = 0; i < threads; i++) {
		pthread_join(t[i], NULL);
		if (a[i].rc) {
			fprintf(stderr, "truncloop: %s: %s\n", a[i].path, stk_strerror(a[i].rc));
			bad = 1;
		}
		ops += a[i].ops;
		max_ns = STK_MAX(max_ns, a[i].max_ns);
	}
	printf("TRUNCLOOP ops %llu max_ms %llu\n", (unsigned long long)ops,
	       (unsigned long long)(max_ns / 1000000));
	free(a);
	return bad;
}

/*
 * staleread CLUSTER PATH SECONDS: one client reads PATH whole again and again for
 * SECONDS, printing "READ size fnv1a64 T0 T1 SC PEND" for each read, and never
 * asks mgmtd for a table unless a node tells it to: a node its table is out of
 * date about is what it reads from. T0 and T1: CLOCK_MONOTONIC ns when the read
 * began and ended; SC and PEND: the client's short-circuit reads so far, and its
 * local reads sent over the network because a change was pending (client.h).
 */
static int cmd_staleread(int argc, char **argv)
{
	uint64_t secs, end;
	uint8_t *buf = NULL;
	size_t cap = 0;

	if (argc < 4 || stk_parse_u64(argv[3], &secs))
		return 2;
	stk_client *c = connect_or_die(argv[1]);
	setvbuf(stdout, NULL, _IOLBF, 0);
	end = stk_now_ns() + secs * 1000000000ull;
	while (stk_now_ns() < end) {
		struct stat st;
		stk_file *f;
		uint64_t h = 0xcbf29ce484222325ull, t0 = stk_now_ns(), t1;
		ssize_t n;
		int rc = stk_stat(c, argv[2], &st);

		if (rc == 0 && (size_t)st.st_size > cap) {
			free(buf);
			cap = (size_t)st.st_size;
			buf = malloc(cap);
			if (!buf)
				return 1;
		}
		if (rc == 0)
			rc = stk_open(c, argv[2], O_RDONLY, 0, &f);
		if (rc) {
			fprintf(stderr, "staleread: %s: %s\n", argv[2], stk_strerror(rc));
			return 1;
		}
		n = stk_pread(f, buf, (size_t)st.st_size, 0);
		stk_close(f);
		t1 = stk_now_ns();
		if (n < 0) {
			fprintf(stderr, "staleread: read: %s\n", stk_strerror((int)n));
			return 1;
		}
		for (ssize_t i = 0; i < n; i++)
			h = (h ^ buf[i]) * 0x100000001b3ull;
		printf("READ %zd %016llx %llu %llu %llu %llu\n", n, (unsigned long long)h,
		       (unsigned long long)t0, (unsigned long long)t1,
		       (unsigned long long)__atomic_load_n(&c->sc_stats[STK_SC_READS],
							   __ATOMIC_RELAXED),
		       (unsigned long long)__atomic_load_n(&c->sc_stats[STK_SC_PENDING],
							   __ATOMIC_RELAXED));
		usleep(50000);
	}
	free(buf);
	stk_disconnect(c);
	return 0;
}

/*
 * overwrite CLUSTER PATH SEED: writes pattern SEED over PATH in place, its whole
 * size (no truncation: readers see the old bytes or the new), and closes it;
 * prints "START T" before the first write and "ACKED T" once close returned
 * (CLOCK_MONOTONIC ns).
 */
static int cmd_overwrite(int argc, char **argv)
{
	uint64_t seed;
	struct stat st;
	stk_file *f;
	char *buf;
	int rc;

	if (argc < 4 || stk_parse_u64(argv[3], &seed))
		return 2;
	stk_client *c = connect_or_die(argv[1]);
	setvbuf(stdout, NULL, _IOLBF, 0);
	rc = stk_stat(c, argv[2], &st);
	buf = rc ? NULL : malloc((size_t)st.st_size + 1);
	if (rc || !buf) {
		fprintf(stderr, "overwrite: %s: %s\n", argv[2], stk_strerror(rc ? rc : -ENOMEM));
		return 1;
	}
	pattern(seed, 0, buf, (size_t)st.st_size);
	rc = stk_open(c, argv[2], O_WRONLY, 0, &f);
	printf("START %llu\n", (unsigned long long)stk_now_ns());
	if (rc == 0) {
		ssize_t w = stk_pwrite(f, buf, (size_t)st.st_size, 0);

		int crc = stk_close(f); /* the durability point: its error counts too */

		rc = w < 0 ? (int)w : crc;
	}
	if (rc) {
		fprintf(stderr, "overwrite: %s: %s\n", argv[2], stk_strerror(rc));
		return 1;
	}
	printf("ACKED %llu\n", (unsigned long long)stk_now_ns());
	free(buf);
	stk_disconnect(c);
	return 0;
}

static int cmd_fill(int argc, char **argv)
{
	if (argc < 3)
		return 2;
	stk_client *c = connect_or_die(argv[1]);
	stk_file *f;
	char *buf = malloc(1 << 20);
	uint64_t acked = 0;
	int rc = stk_open(c, argv[2], O_WRONLY | O_CREAT | O_TRUNC, 0644, &f);
	if (rc || !buf) {
		fprintf(stderr, "fill: open: %s\n", stk_strerror(rc));
		return 1;
	}
	for (;;) {
		pattern(9, acked, buf, 1 << 20);
		ssize_t w = stk_write(f, buf, 1 << 20);
		if (w < 0) {
			rc = (int)w;
			break;
		}
		rc = stk_fsync(f);
		if (rc)
			break;
		acked += 1 << 20;
	}
	stk_close(f);
	printf("%s %llu\n", rc == -ENOSPC ? "ENOSPC" : stk_strerror(rc),
	       (unsigned long long)acked);
	stk_disconnect(c);
	free(buf);
	return rc == -ENOSPC ? 0 : 1;
}

/*
 * Sends raw bytes on a fresh connection, `step` at a time with a pause between,
 * then reads what comes back into out (up to cap bytes, MSG_WAITALL): the count
 * read, 0 when the server closed it (EOF or a reset: our bytes were unread), or
 * -errno.
 */
static int raw_exchange_paced(const char *addr, const uint8_t *bytes, size_t len, size_t step,
			      void *out, size_t cap)
{
	char host[64];
	uint16_t port;
	struct sockaddr_in sin = {.sin_family = AF_INET};
	int fd, rc, one = 1;

	if (stk_parse_hostport(addr, host, sizeof(host), &port))
		return -EINVAL;
	sin.sin_port = htons(port);
	sin.sin_addr.s_addr = htonl(0x7f000001);
	fd = socket(AF_INET, SOCK_STREAM, 0);
	if (connect(fd, (struct sockaddr *)&sin, sizeof(sin)) < 0) {
		close(fd);
		return -errno;
	}
	struct timeval tv = {.tv_sec = 5};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	rc = stk_net_auth_fd(fd, addr); /* the cluster's key first, as every client's */
	if (rc) {
		close(fd);
		return rc;
	}
	for (size_t off = 0; off < len; off += step) {
		stk_write_all(fd, bytes + off, STK_MIN(step, len - off));
		if (off + step < len)
			usleep(2000);
	}
	shutdown(fd, SHUT_WR);
	rc = (int)recv(fd, out, cap, MSG_WAITALL);
	if (rc < 0)
		rc = errno == ECONNRESET ? 0 : -errno;
	close(fd);
	return rc;
}

/* raw_exchange_paced, all the bytes at once. */
static int raw_exchange(const char *addr, const void *bytes, size_t len, void *out, size_t cap)
{
	return raw_exchange_paced(addr, bytes, len, len, out, cap);
}

/* Sends raw bytes on a fresh connection and checks the server closes it. */
static int raw_send_expect_close(const char *addr, const void *bytes, size_t len)
{
	char tmp[64];

	return raw_exchange(addr, bytes, len, tmp, sizeof(tmp));
}

static int server_answers(const char *addr)
{
	struct stk_conn *conn;
	uint8_t resp[1 << 16];
	struct stk_rpc rpc = {.opcode = 0xfff0, .resp = resp, .resp_cap = sizeof(resp)};
	int rc = stk_conn_connect(addr, 2000, &conn);
	if (rc)
		return rc;
	rc = stk_rpc_call(conn, &rpc); /* an unknown opcode gets a status, not a hang-up */
	stk_conn_close(conn);
	return rc;
}

static int cmd_frames(int argc, char **argv)
{
	uint8_t f[STK_FRAME_HDR_LEN + 64];
	struct stk_frame_hdr h = {.magic = STK_WIRE_MAGIC, .version = STK_WIRE_VERSION,
				  .opcode = STK_OP_META_GETATTR};

	if (argc < 2)
		return 2;
	CHECK_RC(server_answers(argv[1]), -ENOSYS);
	/* garbage */
	memset(f, 0xee, sizeof(f));
	CHECK_RC(raw_send_expect_close(argv[1], f, sizeof(f)), 0);
	/* a payload length beyond the limit */
	h.payload_len = 0x7fffffff;
	stk_hdr_encode(&h, f);
	CHECK_RC(raw_send_expect_close(argv[1], f, STK_FRAME_HDR_LEN), 0);
	/* a bad checksum */
	h.payload_len = 8;
	h.checksum = 1;
	stk_hdr_encode(&h, f);
	memset(f + STK_FRAME_HDR_LEN, 0, 8);
	CHECK_RC(raw_send_expect_close(argv[1], f, STK_FRAME_HDR_LEN + 8), 0);
	/* a truncated frame: the peer hangs up mid-payload */
	h.payload_len = 64;
	stk_hdr_encode(&h, f);
	CHECK_RC(raw_send_expect_close(argv[1], f, STK_FRAME_HDR_LEN + 10), 0);
	/*
	 * Another protocol version, one lower and one higher, with flags of its own (a
	 * version 8 build's QoS class bits, a later version's new bit): answered NOTSUP,
	 * not misread, and not closed for flags this version does not know.
	 */
	{
		static const uint32_t flags[4] = {0, 0, 2u << STK_FRAME_CLASS_SHIFT, 0x400};
		uint8_t four[4 * STK_FRAME_HDR_LEN], reply[STK_FRAME_HDR_LEN];
		struct stk_frame_hdr r;

		for (int i = 0; i < 4; i++) {
			memset(&h, 0, sizeof(h));
			h.magic = STK_WIRE_MAGIC;
			h.version = i % 2 ? STK_WIRE_VERSION + 1 : STK_WIRE_VERSION - 1;
			h.opcode = STK_OP_META_STATFS;
			h.flags = flags[i];
			stk_hdr_encode(&h, four + i * STK_FRAME_HDR_LEN);
		}
		for (int i = 0; i < 4; i++) {
			CHECK_RC(raw_exchange(argv[1], four + i * STK_FRAME_HDR_LEN,
					      STK_FRAME_HDR_LEN, reply, sizeof(reply)),
				 (int)sizeof(reply));
			CHECK_RC(stk_hdr_decode(reply, &r), 0);
			CHECK(r.status == STK_ST_NOTSUP && (r.flags & STK_FRAME_REPLY));
			CHECK(r.version == STK_WIRE_VERSION);
		}
		/* this version with a flag it does not know: malformed, closed */
		memset(&h, 0, sizeof(h));
		h.magic = STK_WIRE_MAGIC;
		h.version = STK_WIRE_VERSION;
		h.opcode = STK_OP_META_STATFS;
		h.flags = 0x400;
		stk_hdr_encode(&h, f);
		CHECK_RC(raw_send_expect_close(argv[1], f, STK_FRAME_HDR_LEN), 0);
	}
	/*
	 * Three frames in one write, then the same bytes a few at a time (a header
	 * split across reads): each is answered once (replies may come in any order).
	 */
	for (int pace = 0; pace < 2; pace++) {
		uint8_t three[3 * STK_FRAME_HDR_LEN + 8 + 100], reply[3 * STK_FRAME_HDR_LEN];
		size_t off = 0, len;
		struct stk_frame_hdr r;

		for (uint32_t i = 0; i < 3; i++) {
			uint32_t plen = i == 1 ? 8 : i == 2 ? 100 : 0;

			memset(&h, 0, sizeof(h));
			h.magic = STK_WIRE_MAGIC;
			h.version = STK_WIRE_VERSION;
			h.opcode = (uint16_t)(0xfff0 + i);
			h.req_id = 7 + i;
			h.payload_len = plen;
			memset(three + off + STK_FRAME_HDR_LEN, (int)i + 1, plen);
			h.checksum = stk_crc32c(0, three + off + STK_FRAME_HDR_LEN, plen);
			stk_hdr_encode(&h, three + off);
			off += STK_FRAME_HDR_LEN + plen;
		}
		len = off;
		CHECK_RC(raw_exchange_paced(argv[1], three, len, pace ? 7 : len, reply,
					    sizeof(reply)),
			 (int)sizeof(reply));
		{
			unsigned seen = 0;

			for (uint32_t i = 0; i < 3; i++) {
				CHECK_RC(stk_hdr_decode(reply + i * STK_FRAME_HDR_LEN, &r), 0);
				CHECK(r.req_id >= 7 && r.req_id < 10 &&
				      r.opcode == 0xfff0 + (r.req_id - 7) &&
				      (r.flags & STK_FRAME_REPLY) && r.status != STK_ST_OK);
				if (r.req_id >= 7 && r.req_id < 10)
					seen |= 1u << (r.req_id - 7);
			}
			CHECK(seen == 7);
		}
	}
	/* the server still serves */
	CHECK_RC(server_answers(argv[1]), -ENOSYS);
	if (!failures)
		printf("frames: ok\n");
	return failures ? 1 : 0;
}

/* Sends one STOR_TRUNCATES of n records, header saying hdr_n, and extra trailing bytes. */
static int send_truncates(const char *addr, uint32_t hdr_n, uint64_t ino, uint32_t n,
			  uint32_t extra)
{
	static uint8_t req[64 + 20 * (STK_TRUNCATES_MAX + 1)];
	struct stk_msg_stor_truncates_req m = {.chain_id = 1, .chain_ver = 1, .n = hdr_n};
	struct stk_msg_trunc_rec r = {.ino = ino, .size = 0, .chunk_size = 1u << 20};
	uint8_t resp[64];
	struct stk_rpc rpc = {.opcode = STK_OP_STOR_TRUNCATES, .req = req, .resp = resp,
			      .resp_cap = sizeof(resp)};
	struct stk_conn *conn;
	struct stk_wbuf w;
	int rc;

	stk_wbuf_init(&w, req, sizeof(req));
	stk_msg_stor_truncates_req_enc(&w, &m);
	for (uint32_t i = 0; i < n; i++)
		stk_msg_trunc_rec_enc(&w, &r);
	for (uint32_t i = 0; i < extra; i++)
		stk_put_u8(&w, 0x5a);
	if (w.err)
		return w.err;
	rpc.req_len = w.len;
	rc = stk_conn_connect(addr, 2000, &conn);
	if (rc)
		return rc;
	rc = stk_rpc_call(conn, &rpc);
	stk_conn_close(conn);
	return rc;
}

/* One STOR_TRUNCATE (records 0) or STOR_TRUNCATES of INO to size 0 naming namespace ns. */
static int send_fenced(const char *addr, uint32_t chain, uint64_t ino, uint32_t records,
		       const struct stk_ns_id *ns)
{
	struct stk_msg_stor_truncate_req one = {.chain_id = chain, .chain_ver = 1, .ino = ino,
						.chunk_size = 1u << 20, .ns_hi = ns->hi,
						.ns_lo = ns->lo};
	struct stk_msg_stor_truncates_req many = {.chain_id = chain, .chain_ver = 1, .n = records,
						  .ns_hi = ns->hi, .ns_lo = ns->lo};
	struct stk_msg_trunc_rec r = {.ino = ino, .size = 0, .chunk_size = 1u << 20};
	uint8_t req[256], resp[64];
	struct stk_rpc rpc = {.opcode = records ? STK_OP_STOR_TRUNCATES : STK_OP_STOR_TRUNCATE,
			      .req = req, .resp = resp, .resp_cap = sizeof(resp)};
	struct stk_conn *conn;
	struct stk_wbuf w;
	int rc;

	stk_wbuf_init(&w, req, sizeof(req));
	if (records) {
		stk_msg_stor_truncates_req_enc(&w, &many);
		for (uint32_t i = 0; i < records; i++)
			stk_msg_trunc_rec_enc(&w, &r);
	} else {
		stk_msg_stor_truncate_req_enc(&w, &one);
	}
	if (w.err)
		return w.err;
	rpc.req_len = w.len;
	rc = stk_conn_connect(addr, 2000, &conn);
	if (rc)
		return rc;
	rc = stk_rpc_call(conn, &rpc);
	stk_conn_close(conn);
	return rc;
}

/* The fence on chunk removal: a stranger's namespace (or none) removes nothing. */
static int cmd_fence(int argc, char **argv)
{
	struct stk_ns_id none = {0, 0}, other = {0x53544b, 0x5354524e47};
	uint64_t ino, chains;

	if (argc < 4 || stk_parse_u64(argv[2], &ino) || stk_parse_u64(argv[3], &chains) ||
	    chains == 0 || chains > 1024)
		return 2;
	for (uint32_t c = 1; c <= chains; c++) {
		CHECK_RC(send_fenced(argv[1], c, ino, 0, &none), -EPERM);
		CHECK_RC(send_fenced(argv[1], c, ino, 0, &other), -EPERM);
		CHECK_RC(send_fenced(argv[1], c, ino, 1, &none), -EPERM);
		CHECK_RC(send_fenced(argv[1], c, ino, 2, &other), -EPERM);
	}
	if (!failures)
		printf("fence: ok\n");
	return failures ? 1 : 0;
}

static int cmd_truncates(int argc, char **argv)
{
	uint64_t ino;

	if (argc < 3 || stk_parse_u64(argv[2], &ino))
		return 2;
	/* more records than allowed, all of them there */
	CHECK_RC(send_truncates(argv[1], STK_TRUNCATES_MAX + 1, ino, STK_TRUNCATES_MAX + 1, 0),
		 -EBADMSG);
	/* the header says two, one follows: the one there is not done either */
	CHECK_RC(send_truncates(argv[1], 2, ino, 1, 0), -EBADMSG);
	/* a record cut short */
	CHECK_RC(send_truncates(argv[1], 1, ino, 0, 7), -EBADMSG);
	/* bytes past the last record */
	CHECK_RC(send_truncates(argv[1], 1, ino, 1, 1), -EBADMSG);
	/* and the node still serves */
	CHECK_RC(server_answers(argv[1]), -ENOSYS);
	if (!failures)
		printf("truncates: ok\n");
	return failures ? 1 : 0;
}

/* ---- watch: hostile cache-lease requests to meta ---- */

/* One META_WATCH; the reply's holder, reset flag, seq and record count. */
static int send_watch(struct stk_conn *conn, uint64_t session, uint32_t holder, uint64_t acked,
		      uint32_t wait_ms, struct stk_msg_meta_watch_resp *out)
{
	struct stk_msg_meta_watch_req m = {
	    .session = session, .holder = holder, .acked = acked, .wait_ms = wait_ms};
	static uint8_t resp[64 + 8 * STK_WATCH_RECS_MAX];
	uint8_t req[64];
	struct stk_rpc rpc = {.opcode = STK_OP_META_WATCH, .req = req, .resp = resp,
			      .resp_cap = sizeof(resp)};
	struct stk_wbuf w;
	struct stk_rbuf r;
	int rc;

	stk_wbuf_init(&w, req, sizeof(req));
	stk_msg_meta_watch_req_enc(&w, &m);
	rpc.req_len = w.len;
	rc = stk_rpc_call(conn, &rpc);
	if (rc)
		return rc;
	stk_rbuf_init(&r, resp, rpc.resp_len);
	return stk_msg_meta_watch_resp_dec(&r, out) ? -EBADMSG : 0;
}

/* META_LOOKUP_CACHE of name in the root under origin; *leased as replied. */
static int send_lookup_cache(struct stk_conn *conn, uint32_t origin, const char *name,
			     int *found, int *leased)
{
	struct stk_msg_meta_lookup_req m = {.parent = STK_ROOT_INO};
	struct stk_msg_meta_lookup_cache_resp rm;
	uint8_t req[512], resp[1024];
	struct stk_rpc rpc = {.opcode = STK_OP_META_LOOKUP_CACHE, .req = req, .resp = resp,
			      .resp_cap = sizeof(resp), .origin = origin};
	struct stk_wbuf w;
	struct stk_rbuf r;
	int rc;

	snprintf(m.name, sizeof(m.name), "%s", name);
	stk_wbuf_init(&w, req, sizeof(req));
	stk_msg_meta_lookup_req_enc(&w, &m);
	rpc.req_len = w.len;
	rc = stk_rpc_call(conn, &rpc);
	if (rc)
		return rc;
	stk_rbuf_init(&r, resp, rpc.resp_len);
	if (stk_msg_meta_lookup_cache_resp_dec(&r, &rm))
		return -EBADMSG;
	*found = rm.found;
	*leased = rm.leased;
	return 0;
}

/* One META_ALLOW (or META_ALLOW_BYTES: op) under origin; *granted as replied. */
static int send_allow_op(struct stk_conn *conn, uint16_t op, uint32_t origin, uint64_t session,
			 uint64_t dir, uint32_t want, uint32_t give, uint64_t *granted)
{
	struct stk_msg_meta_allow_req m = {
	    .session = session, .dir = dir, .want = want, .give = give};
	struct stk_msg_meta_allow_resp rm;
	uint8_t req[64], resp[64];
	struct stk_rpc rpc = {
	    .opcode = op, .req = req, .resp = resp, .resp_cap = sizeof(resp), .origin = origin};
	struct stk_wbuf w;
	struct stk_rbuf r;
	int rc;

	stk_wbuf_init(&w, req, sizeof(req));
	stk_msg_meta_allow_req_enc(&w, &m);
	rpc.req_len = w.len;
	rc = stk_rpc_call(conn, &rpc);
	if (rc)
		return rc;
	stk_rbuf_init(&r, resp, rpc.resp_len);
	if (stk_msg_meta_allow_resp_dec(&r, &rm))
		return -EBADMSG;
	*granted = rm.granted;
	return 0;
}

static int send_allow(struct stk_conn *conn, uint32_t origin, uint64_t session, uint64_t dir,
		      uint32_t want, uint32_t give, uint64_t *granted)
{
	return send_allow_op(conn, STK_OP_META_ALLOW, origin, session, dir, want, give, granted);
}

/* META_EXTEND of the root (not a file) ending with `tail` bytes of a malformed ext. */
static int send_extend_tail(struct stk_conn *conn, size_t tail)
{
	struct stk_msg_meta_extend_req m = {.ino = STK_ROOT_INO};
	uint8_t req[256], resp[256];
	struct stk_rpc rpc = {
	    .opcode = STK_OP_META_EXTEND, .req = req, .resp = resp, .resp_cap = sizeof(resp)};
	struct stk_wbuf w;

	stk_wbuf_init(&w, req, sizeof(req));
	stk_msg_meta_extend_req_enc(&w, &m);
	for (size_t i = 0; i < tail; i++)
		stk_put_u8(&w, 0xee);
	rpc.req_len = w.len;
	return stk_rpc_call(conn, &rpc);
}

static int cmd_watch(int argc, char **argv)
{
	uint64_t granted = 0;
	struct stk_msg_meta_watch_resp a, b, x;
	struct stk_conn *conn, *conn2;
	uint64_t t0;
	int found = -1, leased = -1;

	if (argc < 2)
		return 2;
	CHECK_RC(stk_conn_connect(argv[1], 2000, &conn), 0);
	if (failures)
		return 1;
	/* session 0 is refused */
	CHECK_RC(send_watch(conn, 0, 0, 0, 0, &x), -EINVAL);
	/* two holders; claiming the other's id under another session gets a new one */
	CHECK_RC(send_watch(conn, 0x1111, 0, 0, 0, &a), 0);
	CHECK_RC(send_watch(conn, 0x2222, 0, 0, 0, &b), 0);
	CHECK(a.holder && b.holder && a.holder != b.holder && a.reset && b.reset);
	CHECK_RC(send_watch(conn, 0x3333, a.holder, 0, 0, &x), 0);
	CHECK(x.holder != a.holder && x.reset);
	/* an acknowledgement of records never sent, and a wait far too long: capped */
	t0 = stk_now_ns();
	CHECK_RC(send_watch(conn, 0x1111, a.holder, 1ull << 60, 0xffffffffu, &x), 0);
	CHECK(x.holder == a.holder && !x.reset && x.n == 0);
	CHECK(stk_now_ns() - t0 < 3000000000ull);
	/* a lookup leased to a holder that does not exist is answered, not leased */
	CHECK_RC(send_lookup_cache(conn, 0x7fffffff, "nothing-here", &found, &leased), 0);
	CHECK(found == 0 && leased == 0);
	CHECK_RC(send_lookup_cache(conn, a.holder, "nothing-here", &found, &leased), 0);
	CHECK(found == 0 && leased == 1);
	/* inode allowances: bad fields, no holder, another session's holder, no folder */
	CHECK_RC(send_allow(conn, a.holder, 0, STK_ROOT_INO, 4, 0, &granted), -EINVAL);
	CHECK_RC(send_allow(conn, a.holder, 0x1111, STK_ROOT_INO, STK_ALLOW_MAX + 1, 0, &granted),
		 -EINVAL);
	CHECK_RC(send_allow(conn, a.holder, 0x1111, STK_ROOT_INO, 0, 0, &granted), -EINVAL);
	CHECK_RC(send_allow(conn, 0, 0x1111, STK_ROOT_INO, 4, 0, &granted), -EAGAIN);
	CHECK_RC(send_allow(conn, a.holder, 0x2222, STK_ROOT_INO, 4, 0, &granted), -EAGAIN);
	CHECK_RC(send_allow(conn, a.holder, 0x1111, 0x7fffffffffffull, 4, 0, &granted), -ENOENT);
	CHECK_RC(send_allow(conn, a.holder, 0x1111, STK_ROOT_INO, 0, 5, &granted), -ENOENT);
	/* no quota above the root: what was asked for, with nothing set aside */
	CHECK_RC(send_allow(conn, a.holder, 0x1111, STK_ROOT_INO, 4, 0, &granted), 0);
	CHECK(granted == 4);
	/* byte allowances: the same refusals, and bytes over STK_ALLOW_BYTES_MAX */
	CHECK_RC(send_allow_op(conn, STK_OP_META_ALLOW_BYTES, a.holder, 0, STK_ROOT_INO, 4096, 0,
			       &granted),
		 -EINVAL);
	CHECK_RC(send_allow_op(conn, STK_OP_META_ALLOW_BYTES, a.holder, 0x1111, STK_ROOT_INO,
			       STK_ALLOW_BYTES_MAX + 1, 0, &granted),
		 -EINVAL);
	CHECK_RC(send_allow_op(conn, STK_OP_META_ALLOW_BYTES, 0, 0x1111, STK_ROOT_INO, 4096, 0,
			       &granted),
		 -EAGAIN);
	CHECK_RC(send_allow_op(conn, STK_OP_META_ALLOW_BYTES, a.holder, 0x1111, 0x7fffffffffffull,
			       4096, 0, &granted),
		 -ENOENT);
	CHECK_RC(send_allow_op(conn, STK_OP_META_ALLOW_BYTES, a.holder, 0x1111, STK_ROOT_INO, 4096,
			       0, &granted),
		 0);
	CHECK(granted == 4096);
	/* a size report with a cut ext is malformed; a whole one is parsed (root: EISDIR) */
	CHECK_RC(send_extend_tail(conn, 8), -EBADMSG);
	CHECK_RC(stk_conn_connect(argv[1], 2000, &conn2), 0);
	CHECK_RC(send_extend_tail(conn2, 16), -EISDIR);
	stk_conn_close(conn2);
	stk_conn_close(conn);
	/* and meta still serves */
	CHECK_RC(server_answers(argv[1]), -ENOSYS);
	if (!failures)
		printf("watch: ok\n");
	return failures ? 1 : 0;
}

/* ---- shardgate: each shard serves its own inodes, and only those ---- */

static int send_meta(struct stk_conn *conn, uint16_t opcode, const uint8_t *req, size_t len)
{
	uint8_t resp[4096];
	struct stk_rpc rpc = {.opcode = opcode,
			      .req = req,
			      .req_len = len,
			      .resp = resp,
			      .resp_cap = sizeof(resp)};

	return stk_rpc_call(conn, &rpc);
}

/*
 * shardgate HOST:PORT: a meta node of shard 2. Requests naming shard 1's inodes
 * (the root) are NOT_LEADER there, a rename from one of its folders into shard
 * 1's and a hard link of one of shard 1's inodes into one of its folders are its
 * own to do (no such folder yet: NOENT), and one naming its own inode numbers is
 * served (NOENT).
 */
static int cmd_shardgate(int argc, char **argv)
{
	uint64_t own = 1ull << STK_INO_SHARD_SHIFT; /* shard 2's first number */
	struct stk_msg_meta_rename_req rn;
	struct stk_msg_meta_link_req ln;
	struct stk_msg_meta_ino_req g;
	struct stk_msg_meta_mkdir_req m;
	struct stk_conn *conn;
	struct stk_wbuf w;
	uint8_t req[1024];

	if (argc < 2)
		return 2;
	CHECK_RC(stk_conn_connect(argv[1], 2000, &conn), 0);
	if (failures)
		return 1;
	memset(&g, 0, sizeof(g));
	g.ino = STK_ROOT_INO;
	stk_wbuf_init(&w, req, sizeof(req));
	stk_msg_meta_ino_req_enc(&w, &g);
	CHECK_RC(send_meta(conn, STK_OP_META_GETATTR, req, w.len), -EREMCHG);
	memset(&m, 0, sizeof(m));
	m.parent = STK_ROOT_INO;
	m.mode = 0755;
	snprintf(m.name, sizeof(m.name), "made-on-shard-2");
	stk_wbuf_init(&w, req, sizeof(req));
	stk_msg_meta_mkdir_req_enc(&w, &m);
	CHECK_RC(send_meta(conn, STK_OP_META_MKDIR, req, w.len), -EREMCHG);
	memset(&rn, 0, sizeof(rn));
	rn.src_parent = own;
	rn.dst_parent = STK_ROOT_INO;
	snprintf(rn.src_name, sizeof(rn.src_name), "a");
	snprintf(rn.dst_name, sizeof(rn.dst_name), "b");
	stk_wbuf_init(&w, req, sizeof(req));
	stk_msg_meta_rename_req_enc(&w, &rn);
	CHECK_RC(send_meta(conn, STK_OP_META_RENAME, req, w.len), -ENOENT);
	memset(&ln, 0, sizeof(ln));
	ln.ino = 2; /* a number of shard 1's, linked into a folder of shard 2's */
	ln.parent = own;
	snprintf(ln.name, sizeof(ln.name), "l");
	stk_wbuf_init(&w, req, sizeof(req));
	stk_msg_meta_link_req_enc(&w, &ln);
	CHECK_RC(send_meta(conn, STK_OP_META_LINK, req, w.len), -ENOENT);
	g.ino = own;
	stk_wbuf_init(&w, req, sizeof(req));
	stk_msg_meta_ino_req_enc(&w, &g);
	CHECK_RC(send_meta(conn, STK_OP_META_GETATTR, req, w.len), -ENOENT);
	stk_conn_close(conn);
	/* and it still answers */
	CHECK_RC(server_answers(argv[1]), -ENOSYS);
	if (!failures)
		printf("shardgate: ok\n");
	return failures ? 1 : 0;
}

/*
 * shardroute CLUSTER: a native client on a two-shard cluster sends each request to
 * the shard its inode names. A batch of attributes naming both shards' inodes is
 * answered for each by its own shard (shard 1's meta alone would answer NOT_LEADER
 * for shard 2's, shard 2's for the root); an inode of shard 2 is answered by shard
 * 2 (NOENT, none made there yet), one of a shard the cluster lacks is NOENT at
 * once, and a rename or hard link between two shards goes to the shard of the
 * folder named first, which asks the other (no such name or inode: NOENT).
 */
static int cmd_shardroute(int argc, char **argv)
{
	struct stk_ll_cred cred = {.uid = getuid(), .gid = getgid()};
	uint64_t own = 1ull << STK_INO_SHARD_SHIFT, none = 7ull << STK_INO_SHARD_SHIFT;
	uint64_t inos[2] = {own, STK_ROOT_INO};
	struct stk_ll_attr a[2];
	int rcs[2] = {1, 1};
	uint64_t t0;
	stk_client *c;

	if (argc < 2)
		return 2;
	c = connect_or_die(argv[1]);
	CHECK_RC(stk_ll_getattr(c, &cred, STK_ROOT_INO, &a[0]), 0);
	CHECK_RC(stk_ll_getattrs(c, &cred, inos, 2, a, rcs), 0);
	CHECK_RC(rcs[0], -ENOENT);
	CHECK_RC(rcs[1], 0);
	if (rcs[1] == 0 && a[1].ino != STK_ROOT_INO) {
		fprintf(stderr, "shardroute: the root's record names inode %llu\n",
			(unsigned long long)a[1].ino);
		failures++;
	}
	inos[0] = STK_ROOT_INO;
	inos[1] = own;
	CHECK_RC(stk_ll_getattrs(c, &cred, inos, 2, a, rcs), 0);
	CHECK_RC(rcs[0], 0);
	CHECK_RC(rcs[1], -ENOENT);
	CHECK_RC(stk_ll_getattr(c, &cred, own, &a[0]), -ENOENT);
	t0 = stk_now_ns();
	CHECK_RC(stk_ll_getattr(c, &cred, none, &a[0]), -ENOENT);
	if (stk_now_ns() - t0 > 5000000000ull) {
		fprintf(stderr, "shardroute: an inode of no shard took %llu ms\n",
			(unsigned long long)((stk_now_ns() - t0) / 1000000));
		failures++;
	}
	CHECK_RC(stk_ll_rename(c, &cred, STK_ROOT_INO, "x", own, "y", 0), -ENOENT);
	CHECK_RC(stk_ll_rename(c, &cred, own, "x", STK_ROOT_INO, "y", 0), -ENOENT);
	CHECK_RC(stk_ll_link(c, &cred, own, STK_ROOT_INO, "y", &a[0]), -ENOENT);
	stk_disconnect(c);
	if (!failures)
		printf("shardroute: ok\n");
	return failures ? 1 : 0;
}

/*
 * xshard ADDR: what the meta node at ADDR holds, as "files N intents I marks M releases
 * L": its inodes (META_STATFS), its cross-shard intents and marks and the releases of
 * names of other shards' files it has still to tell (META_XSHARD COUNT).
 */
static int cmd_xshard(int argc, char **argv)
{
	struct stk_msg_meta_xshard_req q = {.op = STK_XSHARD_COUNT};
	struct stk_msg_meta_xshard_resp x;
	struct stk_msg_meta_statfs_resp f;
	uint32_t releases = 0;
	uint8_t req[512], resp[512];
	struct stk_rpc rpc;
	struct stk_conn *conn;
	struct stk_wbuf w;
	struct stk_rbuf r;
	int rc;

	if (argc < 2)
		return 2;
	rc = stk_conn_connect(argv[1], 2000, &conn);
	if (rc) {
		fprintf(stderr, "xshard: %s: %s\n", argv[1], stk_strerror(rc));
		return 1;
	}
	memset(&rpc, 0, sizeof(rpc));
	rpc.opcode = STK_OP_META_STATFS;
	rpc.resp = resp;
	rpc.resp_cap = sizeof(resp);
	rc = stk_rpc_call(conn, &rpc);
	stk_rbuf_init(&r, resp, rc ? 0 : rpc.resp_len);
	if (rc == 0 && stk_msg_meta_statfs_resp_dec(&r, &f))
		rc = -EBADMSG;
	if (rc == 0) {
		stk_wbuf_init(&w, req, sizeof(req));
		stk_msg_meta_xshard_req_enc(&w, &q);
		memset(&rpc, 0, sizeof(rpc));
		stk_rpc_prepare(&rpc, STK_OP_META_XSHARD, &w, resp, sizeof(resp));
		rc = stk_rpc_call(conn, &rpc);
		stk_rbuf_init(&r, resp, rc ? 0 : rpc.resp_len);
		if (rc == 0 && stk_msg_meta_xshard_resp_dec(&r, &x))
			rc = -EBADMSG;
		if (rc == 0)
			releases = stk_get_u32(&r);
		if (rc == 0 && stk_rbuf_finish(&r))
			rc = -EBADMSG;
	}
	stk_conn_close(conn);
	if (rc) {
		fprintf(stderr, "xshard: %s: %s\n", argv[1], stk_strerror(rc));
		return 1;
	}
	printf("files %llu intents %u marks %u releases %u\n", (unsigned long long)f.files,
	       x.intents, x.marks, releases);
	return 0;
}

/* ---- repl: hostile META_REPL ---- */

/* One META_REPL with `bulk` (len bytes; claimed: what the request says it carries). */
static int send_repl(struct stk_conn *conn, const struct stk_msg_meta_repl_req *q, const void *bulk,
		     size_t len, struct stk_msg_meta_repl_resp *out)
{
	uint8_t req[128], resp[128];
	struct stk_rpc rpc = {.opcode = STK_OP_META_REPL,
			      .req = req,
			      .resp = resp,
			      .resp_cap = sizeof(resp),
			      .bulk_out = bulk,
			      .bulk_out_len = len};
	struct stk_wbuf w;
	struct stk_rbuf r;
	int rc;

	stk_wbuf_init(&w, req, sizeof(req));
	stk_msg_meta_repl_req_enc(&w, q);
	rpc.req_len = w.len;
	rc = stk_rpc_call(conn, &rpc);
	if (rc)
		return rc;
	stk_rbuf_init(&r, resp, rpc.resp_len);
	return stk_msg_meta_repl_resp_dec(&r, out) ? -EBADMSG : 0;
}

static int cmd_repl(int argc, char **argv)
{
	struct stk_msg_meta_repl_req q;
	struct stk_msg_meta_repl_resp p;
	uint8_t log[64], junk[8] = {1, 2, 3};
	struct stk_conn *conn;
	struct stk_wbuf w;
	struct stk_rpc rpc;
	uint8_t resp[64];

	uint64_t epoch;

	if (argc < 3 || stk_parse_u64(argv[2], &epoch))
		return 2;
	CHECK_RC(stk_conn_connect(argv[1], 2000, &conn), 0);
	if (failures)
		return 1;
	/* a client request to a node that does not lead: NOT_LEADER */
	memset(&rpc, 0, sizeof(rpc));
	rpc.opcode = STK_OP_META_STATFS;
	rpc.resp = resp;
	rpc.resp_cap = sizeof(resp);
	CHECK_RC(stk_rpc_call(conn, &rpc), -EREMCHG);
	/* a length that is not the bulk's, an unknown kind: malformed */
	memset(&q, 0, sizeof(q));
	q.epoch = UINT64_MAX;
	q.kind = STK_REPL_PROBE;
	q.len = 5;
	CHECK_RC(send_repl(conn, &q, junk, 3, &p), -EBADMSG);
	q.kind = 77;
	q.len = 0;
	CHECK_RC(send_repl(conn, &q, NULL, 0, &p), -EBADMSG);
	/* an old epoch (an old leader's): refused before anything is read */
	q.epoch = 1;
	q.kind = STK_REPL_SNAP;
	q.first = 1;
	q.len = sizeof(junk);
	CHECK_RC(send_repl(conn, &q, junk, sizeof(junk), &p), -ESTALE);
	/* the current epoch from a node that is not its leader: refused too */
	q.kind = STK_REPL_SNAP;
	q.first = 1;
	q.epoch = epoch;
	q.leader = 0x7fffffff;
	CHECK_RC(send_repl(conn, &q, junk, sizeof(junk), &p), -ESTALE);
	/*
	 * An epoch newer than the routing table's, from anyone: not taken on its word
	 * (AGAIN), and the real leader's epoch stays good (a later test sees it work).
	 */
	stk_wbuf_init(&w, log, sizeof(log));
	stk_put_u64(&w, UINT64_MAX - 1);
	stk_put_u64(&w, 1u << 30);
	stk_put_u32(&w, 0);
	q.epoch = UINT64_MAX - 1;
	q.kind = STK_REPL_LOG;
	q.first = 0;
	q.len = (uint32_t)w.len;
	CHECK_RC(send_repl(conn, &q, log, w.len, &p), -EAGAIN);
	stk_conn_close(conn);
	/* and it still answers */
	CHECK_RC(server_answers(argv[1]), -ENOSYS);
	if (!failures)
		printf("repl: ok\n");
	return failures ? 1 : 0;
}

/* ---- batch: the batched asynchronous API ---- */

#define BATCH_FILES 12

static const uint64_t batch_sizes[BATCH_FILES] = {
	0, 1, 4095, 16384, 65536, (1u << 20) - 1, (1u << 20) + 3, 3u << 20 | 12345,
	100000, 2u << 20, 777, (5u << 20) + 1};

/*
 * Random reads of the files through one batch: each completes exactly once, with
 * the bytes the pattern says, and the buffer past the result untouched.
 */
static void batch_random_reads(stk_client *c, stk_file **files, const struct stk_batch_opts *o,
			       unsigned nreq, uint64_t seed)
{
	const size_t maxlen = 3u << 20, slot_len = maxlen + 64;
	unsigned nslots = 64, submitted = 0, reaped = 0;
	char *arena = malloc(slot_len * nslots), *want = malloc(maxlen);
	struct {
		unsigned file;
		uint64_t off;
		size_t len;
		int busy;
	} *meta = calloc(nslots, sizeof(*meta));
	uint8_t *seen = calloc(nreq, 1);
	unsigned *slot_of = calloc(nreq, sizeof(unsigned));
	struct stk_completion comp[32];
	stk_batch *b;
	uint64_t rs = seed;

	CHECK_RC(stk_batch_create(c, o, &b), 0);
	if (failures || !arena || !want || !meta || !seen || !slot_of)
		return;
	CHECK(stk_batch_register(b, arena, slot_len * nslots) == 0);
	while (reaped < nreq) {
		/* Fill free slots with new requests, then reap what is ready. */
		for (unsigned s = 0; s < nslots && submitted < nreq; s++) {
			struct stk_batch_req r;
			uint64_t size;

			if (meta[s].busy)
				continue;
			meta[s].file = (unsigned)(stk_splitmix64(&rs) % BATCH_FILES);
			size = batch_sizes[meta[s].file];
			meta[s].off = stk_splitmix64(&rs) % (size + 8192);
			meta[s].len = (size_t)(stk_splitmix64(&rs) % 5 == 0
						       ? stk_splitmix64(&rs) % maxlen
						       : stk_splitmix64(&rs) % 40000);
			meta[s].busy = 1;
			memset(arena + s * slot_len, 0xa5, slot_len);
			r = (struct stk_batch_req){.op = STK_BATCH_READ,
						   .file = files[meta[s].file],
						   .offset = meta[s].off,
						   .buf = arena + s * slot_len,
						   .len = meta[s].len,
						   .user_data = submitted};
			slot_of[submitted] = s;
			int k = stk_batch_submit(b, &r, 1);
			if (k == -EAGAIN) { /* queue_depth reached: reap first */
				meta[s].busy = 0;
				break;
			}
			CHECK_RC(k, 1);
			submitted++;
		}
		int n = stk_batch_reap(b, comp, 32, 1, 30000);
		CHECK(n > 0);
		if (n <= 0)
			break;
		for (int i = 0; i < n; i++) {
			uint64_t id = comp[i].user_data;
			unsigned s;
			uint64_t size, expect;
			char *got;

			CHECK(id < submitted);
			if (id >= submitted)
				continue;
			CHECK(!seen[id]);
			seen[id] = 1;
			reaped++;
			s = slot_of[id];
			size = batch_sizes[meta[s].file];
			expect = meta[s].off >= size ? 0 : STK_MIN((uint64_t)meta[s].len, size - meta[s].off);
			got = arena + s * slot_len;
			if (comp[i].result != (int64_t)expect) {
				fprintf(stderr, "batch read file %u at %llu+%zu: %lld, wanted %llu\n",
					meta[s].file, (unsigned long long)meta[s].off, meta[s].len,
					(long long)comp[i].result, (unsigned long long)expect);
				failures++;
			} else {
				pattern(100 + meta[s].file, meta[s].off, want, expect);
				CHECK(memcmp(got, want, expect) == 0);
				for (size_t k = expect; k < meta[s].len + 64 && k < slot_len; k++)
					if ((uint8_t)got[k] != 0xa5) {
						fprintf(stderr, "batch read wrote past its result\n");
						failures++;
						break;
					}
			}
			meta[s].busy = 0;
		}
	}
	CHECK_RC(stk_batch_outstanding(b), 0);
	CHECK_RC(stk_batch_reap(b, comp, 32, 1, 0), 0);
	stk_batch_destroy(b);
	free(arena);
	free(want);
	free(meta);
	free(seen);
	free(slot_of);
}

static int cmd_batch(int argc, char **argv)
{
	char path[512];
	stk_file *files[BATCH_FILES], *wf = NULL, *rf = NULL;
	struct stk_completion comp[64];
	stk_batch *b = NULL;
	char buf[4096], other[64];
	int n;

	if (argc < 3)
		return 2;
	stk_client *c = connect_or_die(argv[1]);
	CHECK_RC(stk_mkdir(c, argv[2], 0755), 0);
	for (unsigned i = 0; i < BATCH_FILES; i++) {
		snprintf(path, sizeof(path), "%s/f%u", argv[2], i);
		CHECK_RC(write_file(c, path, batch_sizes[i], 100 + i, 1 << 20), 0);
		CHECK_RC(stk_open(c, path, O_RDONLY, 0, &files[i]), 0);
	}
	if (failures)
		return 1;

	/* Wide and narrow windows: large reads are cut over many windows in the latter. */
	struct stk_batch_opts wide = {.size = sizeof(wide)};
	struct stk_batch_opts narrow = {.size = sizeof(narrow), .max_inflight = 2, .threads = 2,
					.queue_depth = 8};
	struct stk_batch_opts one = {.size = sizeof(one), .max_inflight = 1, .threads = 1};
	batch_random_reads(c, files, &wide, 3000, 1);
	batch_random_reads(c, files, &narrow, 400, 2);
	batch_random_reads(c, files, &one, 200, 3);

	/* Errors of one request are its own; submit and reap check their arguments. */
	CHECK_RC(stk_batch_create(c, NULL, &b), 0);
	snprintf(path, sizeof(path), "%s/w", argv[2]);
	CHECK_RC(stk_open(c, path, O_WRONLY | O_CREAT | O_TRUNC, 0644, &wf), 0);
	CHECK_RC(stk_open(c, argv[2], O_RDONLY, 0, &rf), 0); /* a directory */
	struct stk_batch_req bad[] = {
		{.op = STK_BATCH_READ, .file = wf, .offset = 0, .buf = buf, .len = 10, .user_data = 1},
		{.op = STK_BATCH_READ, .file = NULL, .buf = buf, .len = 10, .user_data = 2},
		{.op = 7, .file = files[3], .buf = buf, .len = 10, .user_data = 3},
		{.op = STK_BATCH_READ, .file = files[3], .buf = NULL, .len = 10, .user_data = 4},
		{.op = STK_BATCH_READ, .file = files[3], .offset = 1u << 30, .buf = buf, .len = 10,
		 .user_data = 5},
		{.op = STK_BATCH_READ, .file = files[3], .offset = 16380, .buf = buf, .len = 100,
		 .user_data = 6},
		{.op = STK_BATCH_WRITE, .file = files[3], .buf = buf, .len = 10, .user_data = 7},
		{.op = STK_BATCH_READ, .file = rf, .buf = buf, .len = 10, .user_data = 8},
		{.op = STK_BATCH_READ, .file = files[3], .buf = buf, .len = 0, .user_data = 9},
	};
	const int64_t bad_want[] = {-EBADF, -EBADF, -EINVAL, -EINVAL, 0, 4, -EBADF, -EISDIR, 0};
	CHECK_RC(stk_batch_submit(b, bad, STK_ARRAY_SIZE(bad)), STK_ARRAY_SIZE(bad));
	n = stk_batch_reap(b, comp, 64, UINT_MAX, 30000);
	CHECK_RC(n, STK_ARRAY_SIZE(bad));
	for (int i = 0; i < n; i++) {
		uint64_t id = comp[i].user_data;
		CHECK(id >= 1 && id <= STK_ARRAY_SIZE(bad));
		if (id >= 1 && id <= STK_ARRAY_SIZE(bad) && comp[i].result != bad_want[id - 1]) {
			fprintf(stderr, "batch error case %llu: %lld, wanted %lld\n",
				(unsigned long long)id, (long long)comp[i].result,
				(long long)bad_want[id - 1]);
			failures++;
		}
	}
	CHECK_RC(stk_batch_submit(b, NULL, 3), -EINVAL);
	CHECK_RC(stk_batch_submit(b, bad, 0), 0);
	CHECK_RC(stk_batch_reap(b, NULL, 3, 1, 0), -EINVAL);
	CHECK_RC(stk_batch_reap(b, comp, 64, 1, 0), 0); /* nothing outstanding: no wait */
	CHECK_RC(stk_batch_reap(b, comp, 64, UINT_MAX, -1), 0);
	/* Once a buffer is registered, others are refused. */
	CHECK_RC(stk_batch_register(b, NULL, 10), -EINVAL);
	CHECK_RC(stk_batch_register(b, buf, sizeof(buf)), 0);
	CHECK_RC(stk_batch_read(b, files[3], 0, 64, other, 11), 0);
	CHECK_RC(stk_batch_read(b, files[3], 0, sizeof(buf) + 1, buf, 12), 0);
	CHECK_RC(stk_batch_read(b, files[3], 0, sizeof(buf), buf, 13), 0);
	n = stk_batch_reap(b, comp, 64, 3, 30000);
	CHECK_RC(n, 3);
	for (int i = 0; i < n; i++)
		CHECK_RC(comp[i].result, comp[i].user_data == 13 ? (int64_t)sizeof(buf) : -EFAULT);
	stk_batch_destroy(b);

	/* Batched writes: scattered pieces, then read back whole. */
	{
		const uint64_t size = (4u << 20) + 777;
		const size_t piece = 300000;
		unsigned np = (unsigned)((size + piece - 1) / piece), got = 0;
		char *data = malloc(size);
		struct stk_batch_opts wo = {.size = sizeof(wo), .queue_depth = 4};

		CHECK_RC(stk_batch_create(c, &wo, &b), 0);
		pattern(555, 0, data, size);
		for (unsigned i = 0; i < np;) {
			/* Submit back to front, a few at a time as the queue allows. */
			unsigned j = np - 1 - i;
			uint64_t off = (uint64_t)j * piece;
			struct stk_batch_req r = {.op = STK_BATCH_WRITE,
						  .file = wf,
						  .offset = off,
						  .buf = data + off,
						  .len = (size_t)STK_MIN((uint64_t)piece, size - off),
						  .user_data = j};
			n = stk_batch_submit(b, &r, 1);
			if (n == -EAGAIN) {
				int k = stk_batch_reap(b, comp, 64, 1, 30000);
				CHECK(k > 0);
				for (int q = 0; q < k; q++)
					CHECK_RC(comp[q].result,
						 STK_MIN((uint64_t)piece, size - comp[q].user_data * piece));
				got += (unsigned)(k > 0 ? k : 0);
				if (k <= 0)
					break;
				continue;
			}
			CHECK_RC(n, 1);
			i++;
		}
		while (got < np) {
			int k = stk_batch_reap(b, comp, 64, UINT_MAX, 30000);
			CHECK(k > 0);
			if (k <= 0)
				break;
			for (int q = 0; q < k; q++)
				CHECK_RC(comp[q].result,
					 STK_MIN((uint64_t)piece, size - comp[q].user_data * piece));
			got += (unsigned)k;
		}
		CHECK_RC(got, np);
		stk_batch_destroy(b);
		CHECK_RC(stk_close(wf), 0);
		wf = NULL;
		CHECK_RC(verify_file(c, path, size, 555), 0);
		free(data);
	}

	/* Destroying a batch with requests queued and on the wire. */
	{
		char *big = malloc(64u << 20);
		CHECK_RC(stk_batch_create(c, NULL, &b), 0);
		for (unsigned i = 0; i < 64; i++)
			stk_batch_read(b, files[11], 0, 1u << 20, big + ((size_t)i << 20), i);
		stk_batch_destroy(b);
		free(big);
	}

	for (unsigned i = 0; i < BATCH_FILES; i++)
		stk_close(files[i]);
	stk_close(rf);
	stk_disconnect(c);
	if (!failures)
		printf("batch: ok\n");
	return failures ? 1 : 0;
}

/* Special files and holes through libstoker (no mount); runs as root. */
static int cmd_special(int argc, char **argv)
{
	const uint64_t MIB = 1u << 20;
	char p[4200], q[4200], *buf, *want;
	struct stat st;
	stk_file *f;
	stk_client *c;

	if (argc < 3)
		return 2;
	c = connect_or_die(argv[1]);
	buf = malloc(8 * MIB);
	want = malloc(8 * MIB);
	if (!buf || !want)
		return 1;
	CHECK_RC(stk_mkdir(c, argv[2], 0755), 0);

	/* fifo, socket, devices, and a regular file through mknod */
	join(p, sizeof(p), argv[2], "fifo");
	CHECK_RC(stk_mknod(c, p, S_IFIFO | 0640, 0), 0);
	CHECK_RC(stk_stat(c, p, &st), 0);
	CHECK(S_ISFIFO(st.st_mode) && (st.st_mode & 07777) == 0640 && st.st_size == 0);
	CHECK_RC(stk_mknod(c, p, S_IFIFO | 0640, 0), -EEXIST);
	CHECK_RC(stk_open(c, p, O_RDONLY, 0, &f), -EINVAL); /* no data to read */
	CHECK_RC(stk_open(c, p, O_WRONLY, 0, &f), -EINVAL);
	CHECK_RC(stk_chmod(c, p, 0600), 0);
	CHECK_RC(stk_chown(c, p, 42, 43), 0);
	CHECK_RC(stk_stat(c, p, &st), 0);
	CHECK((st.st_mode & 07777) == 0600 && st.st_uid == 42 && st.st_gid == 43);
	join(q, sizeof(q), argv[2], "fifo2");
	CHECK_RC(stk_link(c, p, q), 0);
	CHECK_RC(stk_rename(c, q, p, 0), 0); /* two names of one inode: nothing happens */
	CHECK_RC(stk_unlink(c, q), 0);
	CHECK_RC(stk_stat(c, p, &st), 0);
	CHECK(st.st_nlink == 1);
	join(p, sizeof(p), argv[2], "sock");
	CHECK_RC(stk_mknod(c, p, S_IFSOCK | 0755, 0), 0);
	CHECK_RC(stk_stat(c, p, &st), 0);
	CHECK(S_ISSOCK(st.st_mode));
	join(p, sizeof(p), argv[2], "tty");
	CHECK_RC(stk_mknod(c, p, S_IFCHR | 0620, makedev(4, 1)), 0);
	CHECK_RC(stk_stat(c, p, &st), 0);
	CHECK(S_ISCHR(st.st_mode) && major(st.st_rdev) == 4 && minor(st.st_rdev) == 1);
	join(p, sizeof(p), argv[2], "disk");
	CHECK_RC(stk_mknod(c, p, S_IFBLK | 0660, makedev(259, 7)), 0);
	CHECK_RC(stk_stat(c, p, &st), 0);
	CHECK(S_ISBLK(st.st_mode) && major(st.st_rdev) == 259 && minor(st.st_rdev) == 7);
	join(p, sizeof(p), argv[2], "plain");
	CHECK_RC(stk_mknod(c, p, S_IFREG | 0644, 0), 0);
	CHECK_RC(stk_stat(c, p, &st), 0);
	CHECK(S_ISREG(st.st_mode) && st.st_size == 0);
	join(p, sizeof(p), argv[2], "dir");
	CHECK_RC(stk_mknod(c, p, S_IFDIR | 0755, 0), -EINVAL);

	/* a sparse file: 1 GiB, 1 MiB written in the middle */
	join(p, sizeof(p), argv[2], "sparse");
	CHECK_RC(stk_open(c, p, O_RDWR | O_CREAT, 0644, &f), 0);
	CHECK_RC(stk_ftruncate(f, 1ll << 30), 0);
	pattern(7, 0, want, MIB);
	CHECK_RC(stk_pwrite(f, want, MIB, 512 * MIB), (long)MIB);
	CHECK_RC(stk_close(f), 0);
	CHECK_RC(stk_stat(c, p, &st), 0);
	CHECK(st.st_size == 1ll << 30 && (uint64_t)st.st_blocks * 512 == MIB);
	/* batched writes count too: two chunks far apart */
	{
		struct stk_batch_req rq[2] = {
			{.op = STK_BATCH_WRITE, .offset = 100 * MIB, .buf = want, .len = MIB,
			 .user_data = 1},
			{.op = STK_BATCH_WRITE, .offset = 900 * MIB + 10, .buf = want, .len = 100,
			 .user_data = 2}};
		struct stk_completion comp[2];
		stk_batch *b = NULL;
		int got = 0;

		CHECK_RC(stk_open(c, p, O_RDWR, 0, &f), 0);
		rq[0].file = rq[1].file = f;
		CHECK_RC(stk_batch_create(c, NULL, &b), 0);
		CHECK_RC(stk_batch_submit(b, rq, 2), 2);
		while (b && got < 2) {
			int n = stk_batch_reap(b, comp, 2, 1, 30000);
			CHECK(n > 0);
			if (n <= 0)
				break;
			for (int i = 0; i < n; i++)
				CHECK(comp[i].result > 0);
			got += n;
		}
		if (b)
			stk_batch_destroy(b);
		CHECK_RC(stk_close(f), 0);
		CHECK_RC(stk_stat(c, p, &st), 0);
		/* chunks 100, 512 and 900: the hole between two writes is not counted */
		CHECK((uint64_t)st.st_blocks * 512 == 3 * MIB);
	}

	/* punch-hole and zero-range over 4 MiB of data */
	join(p, sizeof(p), argv[2], "holes");
	CHECK_RC(stk_open(c, p, O_RDWR | O_CREAT, 0644, &f), 0);
	pattern(9, 0, want, 4 * MIB);
	CHECK_RC(stk_pwrite(f, want, 4 * MIB, 0), (long)(4 * MIB));
	CHECK_RC(stk_fallocate(f, STK_FALLOC_PUNCH_HOLE, 0, 10), -EOPNOTSUPP);
	CHECK_RC(stk_fallocate(f, 0x08 /* COLLAPSE_RANGE */, 0, MIB), -EOPNOTSUPP);
	CHECK_RC(stk_fallocate(f, STK_FALLOC_PUNCH_HOLE | STK_FALLOC_ZERO_RANGE |
					  STK_FALLOC_KEEP_SIZE, 0, 10),
		 -EOPNOTSUPP);
	CHECK_RC(stk_fallocate(f, 0, -1, 10), -EINVAL);
	CHECK_RC(stk_fallocate(f, 0, 0, 0), -EINVAL);
	/* buffered bytes land first, then [1 MiB + 100, 3 MiB + 100) reads zeros */
	CHECK_RC(stk_pwrite(f, "late", 4, 2 * MIB), 4);
	CHECK_RC(stk_fallocate(f, STK_FALLOC_PUNCH_HOLE | STK_FALLOC_KEEP_SIZE, MIB + 100,
			       2 * MIB),
		 0);
	memset(want + MIB + 100, 0, 2 * MIB);
	CHECK_RC(stk_fallocate(f, STK_FALLOC_ZERO_RANGE, 4 * MIB - 10, MIB), 0);
	memset(want + 4 * MIB - 10, 0, 10);
	memset(want + 4 * MIB, 0, MIB);
	CHECK_RC(stk_fstat(f, &st), 0);
	CHECK(st.st_size == (off_t)(5 * MIB - 10));
	/* chunk 2 is gone and [4 MiB, 5 MiB - 10) is a hole: chunks 0, 1 and 3 count */
	CHECK((uint64_t)st.st_blocks * 512 == 3 * MIB);
	CHECK_RC(stk_pread(f, buf, 8 * MIB, 0), (long)(5 * MIB - 10));
	CHECK(memcmp(buf, want, 5 * MIB - 10) == 0);
	CHECK_RC(stk_close(f), 0);
	CHECK_RC(stk_open(c, p, O_RDONLY, 0, &f), 0);
	CHECK_RC(stk_fallocate(f, STK_FALLOC_PUNCH_HOLE | STK_FALLOC_KEEP_SIZE, 0, 10), -EBADF);
	CHECK_RC(stk_pread(f, buf, 8 * MIB, 0), (long)(5 * MIB - 10));
	CHECK(memcmp(buf, want, 5 * MIB - 10) == 0);
	CHECK_RC(stk_close(f), 0);

	free(buf);
	free(want);
	stk_disconnect(c);
	if (!failures)
		printf("special: ok\n");
	return failures ? 1 : 0;
}

/* 1 if s is 32 lowercase hex digits, a namespace identity as the status gives it. */
static int is_ns(const char *s)
{
	return strlen(s) == 32 && strspn(s, "0123456789abcdef") == 32;
}

/* The chunk files every target of s reports, summed. */
static uint64_t status_chunks(const stk_cluster_status *s)
{
	const struct stk_cluster_target *t;
	uint64_t n = 0;

	for (uint32_t i = 0; (t = stk_cluster_status_target(s, i)); i++)
		n += t->chunks;
	return n;
}

/*
 * The public cluster status against what `stoker up` starts: one meta node serving
 * shard 1 under its store's namespace, one storage node serving every target,
 * chains over those targets, the space counted once per file system. Then the
 * figures move (the chunk counts follow a write, through the heartbeats), and the
 * errors of stk_cluster_resolve and stk_cluster_status_fetch.
 */
static int cmd_cluster(int argc, char **argv)
{
	const struct stk_cluster_node *n, *meta = NULL, *stor = NULL;
	const struct stk_cluster_target *t;
	const struct stk_cluster_chain *ch;
	const struct stk_cluster_shard *sh;
	const struct stk_cluster_space *sp;
	char addr[STK_CLUSTER_ADDR_MAX], buf[STK_CLUSTER_ADDR_MAX], small[8];
	stk_cluster_status *s = NULL, *bad;
	uint64_t want_targets, before, after = 0, maxcap = 0;
	uint32_t i, nt = 0, nn = 0;
	stk_client *c;

	if (argc != 4 || stk_parse_u64(argv[2], &want_targets))
		return 2;

	/* resolve: the forms stk_connect takes, the default, and what it refuses */
	CHECK_RC(stk_cluster_resolve(argv[1], addr, sizeof(addr)), 0);
	CHECK_RC(stk_cluster_resolve("stk://127.0.0.1:7000/a/b", buf, sizeof(buf)), 0);
	CHECK(strcmp(buf, "127.0.0.1:7000") == 0);
	CHECK_RC(stk_cluster_resolve("127.0.0.1:7000", buf, sizeof(buf)), 0);
	CHECK(strcmp(buf, "127.0.0.1:7000") == 0);
	CHECK_RC(stk_cluster_resolve("stk://nope", buf, sizeof(buf)), -EINVAL);
	CHECK_RC(stk_cluster_resolve("127.0.0.1:7000", small, sizeof(small)), -EINVAL);
	setenv("STOKER_CLUSTER", argv[1], 1);
	CHECK_RC(stk_cluster_resolve(NULL, buf, sizeof(buf)), 0);
	CHECK(strcmp(buf, addr) == 0);

	/* the default cluster (STOKER_CLUSTER now) is the one named */
	CHECK_RC(stk_cluster_status_fetch(NULL, &s), 0);
	if (!s)
		return 1;
	CHECK(strcmp(stk_cluster_status_addr(s), addr) == 0);
	CHECK(stk_cluster_status_version(s) != 0);

	for (i = 0; (n = stk_cluster_status_node(s, i)); i++) {
		nn++;
		CHECK(n->id != 0);
		CHECK(n->state == STK_CLUSTER_NODE_ONLINE);
		CHECK(n->addr && n->addr[0] && strlen(n->addr) < STK_CLUSTER_ADDR_MAX);
		CHECK(n->host_id && n->host_id[0]);
		CHECK(n->last_seen_ms < 10000);
		CHECK(!n->refused);
		if (n->role == STK_CLUSTER_ROLE_META) {
			CHECK(!meta);
			meta = n;
			CHECK(is_ns(n->ns));
		} else if (n->role == STK_CLUSTER_ROLE_STORAGE) {
			CHECK(!stor);
			stor = n;
			CHECK(n->ns && n->ns[0] == 0);
		} else {
			fprintf(stderr, "node %u has role %d\n", n->id, n->role);
			failures++;
		}
	}
	CHECK(nn == 2 && meta && stor);
	if (!meta || !stor) {
		stk_cluster_status_free(s);
		return 1;
	}

	for (i = 0; (t = stk_cluster_status_target(s, i)); i++) {
		nt++;
		CHECK(t->node_id == stor->id);
		CHECK(t->state == STK_CLUSTER_TARGET_SERVING);
		CHECK(t->capacity > 0 && t->used <= t->capacity && t->avail <= t->capacity);
		CHECK(t->path && t->path[0] == '/');
		for (uint32_t j = 0; j < i; j++)
			CHECK(stk_cluster_status_target(s, j)->id != t->id);
		maxcap = STK_MAX(maxcap, t->capacity);
	}
	CHECK(nt == want_targets);

	for (i = 0; (ch = stk_cluster_status_chain(s, i)); i++) {
		CHECK(ch->id == i + 1);
		CHECK(ch->ntargets >= 1 && ch->targets);
		for (uint32_t j = 0; j < ch->ntargets; j++) {
			int found = 0;
			for (uint32_t k = 0; (t = stk_cluster_status_target(s, k)); k++)
				found |= t->id == ch->targets[j];
			CHECK(found);
		}
	}
	CHECK(i >= 1);

	sh = stk_cluster_status_shard(s, 0);
	CHECK(sh && sh->id == 1 && sh->node_id == meta->id && strcmp(sh->ns, meta->ns) == 0);
	CHECK(!stk_cluster_status_shard(s, 1));

	/* `stoker up` puts every target on one file system: counted once */
	sp = stk_cluster_status_space(s);
	CHECK(sp && sp->devices >= 1 && sp->devices <= nt);
	CHECK(sp->capacity >= maxcap && sp->used <= sp->capacity && sp->avail <= sp->capacity);
	CHECK(!stk_cluster_status_node(s, UINT32_MAX) && !stk_cluster_status_target(s, nt));

	/* the figures are the live ones: a write shows in the chunk counts */
	before = status_chunks(s);
	c = connect_or_die(argv[1]);
	CHECK_RC(write_file(c, argv[3], 4u << 20, 7, 1u << 20), 0);
	stk_disconnect(c);
	for (int tries = 0; tries < 100 && after <= before; tries++) {
		stk_cluster_status *s2;

		usleep(100000);
		CHECK_RC(stk_cluster_status_fetch(argv[1], &s2), 0);
		if (!s2)
			break;
		after = status_chunks(s2);
		stk_cluster_status_free(s2);
	}
	CHECK(after > before);

	/* errors: *out is NULL after each; a meta node is not mgmtd */
	bad = (stk_cluster_status *)&bad;
	CHECK_RC(stk_cluster_status_fetch("stk://nope", &bad), -EINVAL);
	CHECK(!bad);
	bad = (stk_cluster_status *)&bad;
	CHECK_RC(stk_cluster_status_fetch("127.0.0.1:1", &bad), -ECONNREFUSED);
	CHECK(!bad);
	bad = (stk_cluster_status *)&bad;
	CHECK_RC(stk_cluster_status_fetch(meta->addr, &bad), -ENOSYS);
	CHECK(!bad);
	stk_cluster_status_free(s);
	stk_cluster_status_free(NULL);
	if (!failures)
		printf("cluster: ok\n");
	return failures ? 1 : 0;
}

static const char *errname(int rc)
{
	switch (-rc) {
	case 0:
		return "OK";
	case EACCES:
		return "EACCES";
	case EPERM:
		return "EPERM";
	case EROFS:
		return "EROFS";
	case ENOENT:
		return "ENOENT";
	case EEXIST:
		return "EEXIST";
	case ENOTDIR:
		return "ENOTDIR";
	case EXDEV:
		return "EXDEV";
	case EKEYREJECTED:
		return "EKEYREJECTED";
	default:
		return strerror(-rc);
	}
}

static int cmd_handshake(int argc, char **argv)
{
	const char *key = getenv("STOKER_KEY_FILE");
	struct stk_conn *conn = NULL;
	char err[512];
	int rc;

	if (argc != 2 || !key)
		return 2;
	rc = stk_net_auth_load(key, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "%s\n", err);
		return 1;
	}
	if (getenv("STOKER_TLS") && strcmp(getenv("STOKER_TLS"), "1") == 0)
		stk_net_tls_set(1);
	rc = stk_conn_connect(argv[1], 2000, &conn);
	if (rc == 0) {
		/* a refused key may only show at the first request */
		struct stk_rpc rpc;
		struct stk_wbuf w;
		uint8_t resp[256];

		stk_wbuf_init(&w, NULL, 0);
		stk_rpc_prepare(&rpc, STK_OP_MGMT_LEADER, &w, resp, sizeof(resp));
		rc = stk_rpc_call(conn, &rpc);
		if (rc == -ENOSYS || rc == -EPERM)
			rc = 0; /* served: meta and storage know no MGMT_LEADER */
		stk_conn_close(conn);
	}
	printf("%s\n", errname(rc));
	return 0;
}

/* Hex of n bytes into out (2n + 1). */
static void to_hex(const uint8_t *p, size_t n, char *out)
{
	for (size_t i = 0; i < n; i++)
		snprintf(out + 2 * i, 3, "%02x", p[i]);
}

/* Up to cap bytes from hex digits; their count, or -1 for a bad digit or an odd length. */
static long from_hex(const char *s, uint8_t *out, size_t cap)
{
	size_t n = strlen(s);

	if (n % 2 || n / 2 > cap)
		return -1;
	for (size_t i = 0; i < n / 2; i++) {
		unsigned v;

		if (sscanf(s + 2 * i, "%2x", &v) != 1)
			return -1;
		out[i] = (uint8_t)v;
	}
	return (long)(n / 2);
}

/*
 * vouch META_HOST:PORT PARENT NAME: one META_LOOKUP of NAME in folder PARENT straight
 * to meta, with the key of $STOKER_KEY_FILE; prints "INO HEX", HEX the voucher
 * record meta sent with it (wire.h STK_FRAME_VOUCH), or "INO none", or the errno's
 * name. The reply's trailer is checked as the client library checks it.
 */
static int cmd_vouch(int argc, char **argv)
{
	const char *key = getenv("STOKER_KEY_FILE");
	struct stk_msg_meta_lookup_req q = {.cred = {.uid = getuid(), .gid = getgid()}};
	struct stk_msg_meta_attr_resp a;
	uint8_t req[512], resp[1024];
	char hex[2 * STK_VOUCH_REC_LEN + 1], err[512];
	struct stk_conn *conn;
	struct stk_rpc rpc;
	struct stk_wbuf w;
	struct stk_rbuf r;
	size_t len, at;
	int rc;

	if (argc != 4 || !key || stk_parse_u64(argv[2], &q.parent) ||
	    strlen(argv[3]) > STK_NAME_MAX)
		return 2;
	rc = stk_net_auth_load(key, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "%s\n", err);
		return 1;
	}
	stk_strlcpy(q.name, argv[3], sizeof(q.name));
	stk_wbuf_init(&w, req, sizeof(req));
	stk_msg_meta_lookup_req_enc(&w, &q);
	stk_rpc_prepare(&rpc, STK_OP_META_LOOKUP, &w, resp, sizeof(resp));
	rc = stk_conn_connect(argv[1], 2000, &conn);
	if (rc == 0) {
		rc = stk_rpc_call(conn, &rpc);
		stk_conn_close(conn);
	}
	if (rc) {
		printf("%s\n", errname(rc));
		return 0;
	}
	len = rpc.resp_len;
	if (!(rpc.resp_flags & STK_FRAME_VOUCH)) {
		stk_rbuf_init(&r, resp, len);
		CHECK(stk_msg_meta_attr_resp_dec(&r, &a) == 0 && stk_rbuf_finish(&r) == 0);
		printf("%llu none\n", (unsigned long long)a.attr.ino);
		return 0;
	}
	/* one voucher, then its count */
	CHECK(len > STK_VOUCH_REC_LEN + 2 && resp[len - 2] == 1 && resp[len - 1] == 0);
	at = len - 2 - STK_VOUCH_REC_LEN;
	stk_rbuf_init(&r, resp, at);
	CHECK(stk_msg_meta_attr_resp_dec(&r, &a) == 0 && stk_rbuf_finish(&r) == 0);
	to_hex(resp + at, STK_VOUCH_REC_LEN, hex);
	printf("%llu %s\n", (unsigned long long)a.attr.ino, hex);
	return 0;
}

/*
 * chunk HOST:PORT INO read|truncate|prefetch [HEX]: one chunk request for INO
 * (chunk 0 of chain 1) straight to a storage node, with the key of
 * $STOKER_KEY_FILE, carrying the voucher HEX (any bytes: a forged or short one
 * too) when given; prints the errno's name the node answered.
 */
static int cmd_chunk(int argc, char **argv)
{
	const char *key = getenv("STOKER_KEY_FILE");
	static uint8_t bulk[1 << 20];
	uint8_t req[256], resp[256];
	struct stk_conn *conn;
	struct stk_rpc rpc;
	struct stk_wbuf w;
	char err[512];
	uint64_t ino;
	int rc;

	uint8_t vouch[128];
	long vlen = -1;

	if ((argc != 4 && argc != 5) || !key || stk_parse_u64(argv[2], &ino))
		return 2;
	if (argc == 5 && (vlen = from_hex(argv[4], vouch, sizeof(vouch))) < 0)
		return 2;
	rc = stk_net_auth_load(key, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "%s\n", err);
		return 1;
	}
	stk_wbuf_init(&w, req, sizeof(req));
	if (strcmp(argv[3], "read") == 0) {
		struct stk_msg_stor_read_req m = {
		    .chain_id = 1, .chain_ver = 1, .ino = ino, .length = 3};

		stk_msg_stor_read_req_enc(&w, &m);
		stk_rpc_prepare(&rpc, STK_OP_STOR_READ, &w, resp, sizeof(resp));
		rpc.bulk_in = bulk;
		rpc.bulk_in_cap = sizeof(bulk);
	} else if (strcmp(argv[3], "truncate") == 0) {
		struct stk_msg_stor_truncate_req m = {
		    .chain_id = 1, .chain_ver = 1, .ino = ino, .chunk_size = 1u << 20};

		stk_msg_stor_truncate_req_enc(&w, &m);
		stk_rpc_prepare(&rpc, STK_OP_STOR_TRUNCATE, &w, resp, sizeof(resp));
	} else if (strcmp(argv[3], "prefetch") == 0) {
		struct stk_msg_stor_prefetch_req m = {.chain_id = 1, .chain_ver = 1, .ino = ino};

		stk_msg_stor_prefetch_req_enc(&w, &m);
		stk_rpc_prepare(&rpc, STK_OP_STOR_PREFETCH, &w, resp, sizeof(resp));
	} else {
		return 2;
	}
	if (vlen >= 0) {
		/* the voucher ends the payload (wire.h) */
		stk_put_bytes(&w, vouch, (size_t)vlen);
		rpc.req_len = w.len;
		rpc.frame_flags |= STK_FRAME_VOUCH;
	}
	rc = stk_conn_connect(argv[1], 2000, &conn);
	if (rc == 0) {
		rc = stk_rpc_call(conn, &rpc);
		stk_conn_close(conn);
	}
	printf("%s\n", errname(rc));
	return 0;
}

static int cmd_ino(int argc, char **argv)
{
	struct stk_ll_cred cred = {.uid = getuid(), .gid = getgid()};
	struct stk_ll_attr a, b;
	const char *op;
	stk_client *c;
	uint64_t x = 0, y = 0;
	int rc, created;

	if (argc < 4)
		return 2;
	op = argv[2];
	if (argc == 5 && strcmp(op, "raw") == 0) {
		/* the file's attributes as the administrator sees them (its layout), then
		 * chunk requests straight to storage with the client key */
		struct stk_client_opts o = {.size = sizeof(o),
					    .key_file = getenv("STOKER_ADMIN_KEY_FILE")};
		stk_file *f;
		char buf[4] = "abc";
		long n;

		if (!o.key_file || stk_parse_u64(argv[3], &x))
			return 2;
		rc = stk_connect(argv[1], &o, &c);
		if (rc == 0) {
			rc = stk_ll_getattr(c, &cred, x, &a);
			stk_disconnect(c);
		}
		if (rc) {
			fprintf(stderr, "raw: the administrator's getattr: %s\n", stk_strerror(rc));
			return 1;
		}
		c = connect_or_die(argv[1]);
		rc = stk_ll_open(c, &cred, &a, strcmp(argv[4], "write") == 0 ? O_WRONLY : O_RDONLY,
				 &f);
		if (rc == 0) {
			n = strcmp(argv[4], "write") == 0 ? stk_pwrite(f, buf, 3, 0)
							  : stk_pread(f, buf, 3, 0);
			rc = n < 0 ? (int)n : 0;
			if (rc == 0 && strcmp(argv[4], "write") == 0)
				rc = stk_fsync(f);
			n = stk_close(f);
			if (rc == 0)
				rc = (int)n;
		}
		printf("%s\n", errname(rc));
		stk_disconnect(c);
		return 0;
	}
	c = connect_or_die(argv[1]);
	if (stk_parse_u64(argv[3], &x))
		return 2;
	if (argc == 6 && stk_parse_u64(argv[4], &y))
		return 2;
	if (strcmp(op, "getattr") == 0) {
		rc = stk_ll_getattr(c, &cred, x, &a);
	} else if (strcmp(op, "getattrs") == 0) {
		int rcs[1] = {0};

		rc = stk_ll_getattrs(c, &cred, &x, 1, &a, rcs);
		if (rc == 0)
			rc = rcs[0];
	} else if (strcmp(op, "listread") == 0) {
		/* a listing with attributes by inode (readdir, then getattrs), then a
		 * byte of each regular file it found, opened from those attributes (the
		 * open registers it at meta, META_OPEN) */
		struct stk_ll_dirent ents[64];
		struct stk_ll_attr at[64];
		uint64_t inos[64];
		int rcs[64], eof = 0, files = 0;
		uint32_t n = 0;

		rc = stk_ll_readdir(c, &cred, x, 0, 64, ents, &n, &eof);
		rc = rc < 0 ? rc : 0;
		for (uint32_t i = 0; i < n; i++)
			inos[i] = ents[i].ino;
		if (rc == 0 && n)
			rc = stk_ll_getattrs(c, &cred, inos, n, at, rcs);
		for (uint32_t i = 0; rc == 0 && i < n; i++) {
			stk_file *f;
			char ch;
			long got;

			if (rcs[i] || !S_ISREG(at[i].mode))
				continue;
			rc = stk_ll_open(c, &cred, &at[i], O_RDONLY, &f);
			if (rc)
				break;
			got = stk_pread(f, &ch, 1, 0);
			rc = got < 0 ? (int)got : 0;
			stk_close(f);
			files++;
		}
		if (rc == 0)
			printf("files %d\n", files);
	} else if (strcmp(op, "readdir") == 0) {
		struct stk_ll_dirent ents[4];
		uint32_t n = 0;
		int eof = 0;

		rc = stk_ll_readdir(c, &cred, x, 0, 4, ents, &n, &eof);
		rc = rc < 0 ? rc : 0;
	} else if (strcmp(op, "read") == 0) {
		stk_file *f;
		char ch;

		rc = stk_ll_open_attr(c, &cred, x, &a);
		if (rc == 0)
			rc = stk_ll_open_registered(c, &cred, &a, O_RDONLY, &f);
		if (rc == 0) {
			long n = stk_pread(f, &ch, 1, 0);

			rc = n < 0 ? (int)n : 0;
			stk_close(f);
		}
	} else if (strcmp(op, "chmod") == 0) {
		memset(&b, 0, sizeof(b));
		b.mode = 0777;
		rc = stk_ll_setattr(c, &cred, x, STK_LL_SETATTR_MODE, &b, &a);
	} else if (strcmp(op, "setxattr") == 0) {
		rc = stk_ll_setxattr(c, &cred, x, "user.stk", "1", 1, 0);
	} else if (strcmp(op, "parent") == 0) {
		rc = stk_ll_lookup_parent(c, &cred, x, &a);
		if (rc == 0)
			printf("ino %llu\n", (unsigned long long)a.ino);
	} else if (argc == 5 && strcmp(op, "lookup") == 0) {
		rc = stk_ll_lookup(c, &cred, x, argv[4], &a);
		if (rc == 0)
			printf("ino %llu\n", (unsigned long long)a.ino);
	} else if (argc == 5 && strcmp(op, "create") == 0) {
		rc = stk_ll_create(c, &cred, x, argv[4], 0644, 1, &a, &created);
	} else if (argc == 5 && strcmp(op, "mkdir") == 0) {
		rc = stk_ll_mkdir(c, &cred, x, argv[4], 0755, &a);
	} else if (argc == 5 && strcmp(op, "unlink") == 0) {
		rc = stk_ll_unlink(c, &cred, x, argv[4]);
	} else if (argc == 6 && strcmp(op, "link") == 0) {
		rc = stk_ll_link(c, &cred, x, y, argv[5], &a);
	} else if (argc == 7 && strcmp(op, "rename") == 0) {
		if (stk_parse_u64(argv[5], &y))
			return 2;
		rc = stk_ll_rename(c, &cred, x, argv[4], y, argv[6], 0);
	} else {
		fprintf(stderr, "ino: unknown operation or arguments: %s\n", op);
		stk_disconnect(c);
		return 2;
	}
	printf("%s\n", errname(rc));
	stk_disconnect(c);
	return 0;
}

int main(int argc, char **argv)
{
	static const struct {
		const char *name;
		int (*fn)(int, char **);
	} cmds[] = {{"write", cmd_write},
		    {"verify", cmd_verify},
		    {"api", cmd_api},
		    {"concurrent", cmd_concurrent},
		    {"ackloop", cmd_ackloop},
		    {"fill", cmd_fill},
		    {"frames", cmd_frames},
		    {"truncates", cmd_truncates},
		    {"fence", cmd_fence},
		    {"batch", cmd_batch},
		    {"watch", cmd_watch},
		    {"special", cmd_special},
		    {"repl", cmd_repl},
		    {"cluster", cmd_cluster},
		    {"staleread", cmd_staleread},
		    {"overwrite", cmd_overwrite},
		    {"verifymany", cmd_verifymany},
		    {"ino", cmd_ino},
		    {"handshake", cmd_handshake},
		    {"chunk", cmd_chunk},
		    {"vouch", cmd_vouch},
		    {"truncloop", cmd_truncloop},
		    {"shardgate", cmd_shardgate},
		    {"shardroute", cmd_shardroute},
		    {"xshard", cmd_xshard}};

	if (argc < 2) {
		fprintf(stderr, "usage: stk_check CMD ARGS (see the source)\n");
		return 2;
	}
	/* The cluster's key, as libstoker finds it for a client (stk_client_auth_find). */
	if (argc > 2) {
		char list[512];

		if (stk_cluster_resolve(argv[2], list, sizeof(list)) == 0 &&
		    stk_client_auth_find(list, NULL))
			return 1;
	}
	for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++)
		if (strcmp(argv[1], cmds[i].name) == 0) {
			int rc = cmds[i].fn(argc - 1, argv + 1);
			if (rc == 2)
				fprintf(stderr, "stk_check %s: bad arguments\n", argv[1]);
			return rc;
		}
	fprintf(stderr, "stk_check: unknown command %s\n", argv[1]);
	return 2;
}
