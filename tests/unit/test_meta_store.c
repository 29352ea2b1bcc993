/*
 * Unit test of the namespace store (src/meta/store.h), driven directly with no
 * network: every operation and the errors store.h promises, directory link
 * counts, rename's POSIX cases, permission checks for non-root callers,
 * readdir over 20,000 entries with entries removed in the middle of the listing,
 * concurrent creates from several threads, reserved inode numbers and creates that
 * name one (a delegated folder's names), and a reopen that must find everything
 * again.
 *
 * Exit status: 0 pass, 1 fail, 77 skip (no temporary folder).
 */
#include <errno.h>
#include <lmdb.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h>

#include "common/layout.h"
#include "meta/store.h"
#include "check.h"

static struct stk_meta_store *st;
static char tmpdir[64];

static const struct stk_cred ROOT = {.uid = 0, .gid = 0};
static const struct stk_cred ALICE = {.uid = 1001, .gid = 1001, .ngroups = 1, .groups = {2001}};
static const struct stk_cred BOB = {.uid = 1002, .gid = 1002};
static const struct stk_meta_placement PL4 = {.chunk_size = 1u << 20, .stripe = 4, .nchains = 4};
static const struct stk_meta_placement PL0 = {0};
static const struct stk_layout ZERO_LAYOUT = {0};

/* ---- helpers: each checks that the setup step itself worked ---- */

static struct stk_attr attr_of(uint64_t ino)
{
	struct stk_attr a;

	memset(&a, 0, sizeof(a));
	CHECK_RC(stk_meta_store_getattr(st, &ROOT, ino, &a), 0);
	return a;
}

static struct stk_attr attr_of_in(struct stk_meta_store *s, uint64_t ino)
{
	struct stk_attr a;

	memset(&a, 0, sizeof(a));
	CHECK_RC(stk_meta_store_getattr(s, &ROOT, ino, &a), 0);
	return a;
}

static uint64_t mkdir_as(const struct stk_cred *c, uint64_t parent, const char *name, uint32_t mode)
{
	struct stk_attr a;

	memset(&a, 0, sizeof(a));
	CHECK_RC(stk_meta_store_mkdir(st, c, parent, name, mode, &a), 0);
	return a.ino;
}

static uint64_t create_as(const struct stk_cred *c, uint64_t parent, const char *name)
{
	struct stk_attr a;
	int created = 0;

	memset(&a, 0, sizeof(a));
	CHECK_RC(stk_meta_store_create(st, c, parent, name, 0644, STK_CREATE_EXCL, &ZERO_LAYOUT,
				       &PL4, &a, &created),
		 0);
	CHECK(created == 1);
	return a.ino;
}

static uint64_t ino_of(uint64_t parent, const char *name)
{
	struct stk_attr a;

	memset(&a, 0, sizeof(a));
	if (stk_meta_store_lookup(st, &ROOT, parent, name, &a))
		return 0;
	return a.ino;
}

static int setattr_as(const struct stk_cred *c, uint64_t ino, uint32_t valid,
		      struct stk_meta_sattr sa)
{
	struct stk_attr a;

	sa.valid = valid;
	return stk_meta_store_setattr(st, c, ino, &sa, &a);
}

static int rename_as(const struct stk_cred *c, uint64_t sp, const char *sn, uint64_t dp,
		     const char *dn, uint32_t flags)
{
	struct stk_attr a;
	int replaced;

	return stk_meta_store_rename(st, c, sp, sn, dp, dn, flags, &replaced, &a);
}

static int open_store(void)
{
	struct stk_meta_store_opts o = {.size = sizeof(o), .dir = tmpdir, .map_size = 1ull << 30};

	return stk_meta_store_open(&o, &st);
}

/* ---- the tests ---- */

static void test_root(void)
{
	struct stk_attr a = attr_of(STK_ROOT_INO), b;

	CHECK(S_ISDIR(a.mode) && (a.mode & 07777) == 0755);
	CHECK(a.uid == geteuid() && a.gid == getegid());
	CHECK(a.nlink == 2);
	CHECK_RC(stk_meta_store_lookup(st, &ROOT, STK_ROOT_INO, ".", &b), 0);
	CHECK(b.ino == STK_ROOT_INO);
	CHECK_RC(stk_meta_store_lookup(st, &ROOT, STK_ROOT_INO, "..", &b), 0);
	CHECK(b.ino == STK_ROOT_INO);
	CHECK_RC(stk_meta_store_getattr(st, &ROOT, 999999, &b), -ENOENT);
}

static void test_names(void)
{
	char longname[STK_NAME_MAX + 2];
	struct stk_attr a;

	memset(longname, 'x', sizeof(longname));
	longname[STK_NAME_MAX + 1] = 0;
	CHECK_RC(stk_meta_store_mkdir(st, &ROOT, STK_ROOT_INO, "", 0755, &a), -EINVAL);
	CHECK_RC(stk_meta_store_mkdir(st, &ROOT, STK_ROOT_INO, ".", 0755, &a), -EINVAL);
	CHECK_RC(stk_meta_store_mkdir(st, &ROOT, STK_ROOT_INO, "..", 0755, &a), -EINVAL);
	CHECK_RC(stk_meta_store_mkdir(st, &ROOT, STK_ROOT_INO, "a/b", 0755, &a), -EINVAL);
	CHECK_RC(stk_meta_store_mkdir(st, &ROOT, STK_ROOT_INO, longname, 0755, &a), -ENAMETOOLONG);
	CHECK_RC(stk_meta_store_lookup(st, &ROOT, STK_ROOT_INO, longname, &a), -ENAMETOOLONG);
	CHECK_RC(stk_meta_store_lookup(st, &ROOT, STK_ROOT_INO, "x/y", &a), -EINVAL);
	longname[STK_NAME_MAX] = 0; /* exactly 255 bytes is fine */
	CHECK_RC(stk_meta_store_mkdir(st, &ROOT, STK_ROOT_INO, longname, 0755, &a), 0);
	CHECK_RC(stk_meta_store_rmdir(st, &ROOT, STK_ROOT_INO, longname), 0);
	CHECK_RC(stk_meta_store_rmdir(st, &ROOT, STK_ROOT_INO, "."), -EINVAL);
}

static void test_create(void)
{
	struct stk_layout want = {
	    .chunk_size = 4u << 20, .stripe = 2, .nchains = 4, .start = 1, .seed = 12345};
	struct stk_layout bad = want;
	struct stk_meta_placement wide = {.chunk_size = 0, .stripe = 16, .nchains = 4};
	struct stk_meta_sattr sa = {0};
	struct stk_attr a, b;
	uint64_t d, f;
	int created;

	d = mkdir_as(&ROOT, STK_ROOT_INO, "cr", 0755);
	CHECK_RC(setattr_as(&ROOT, d, STK_SETATTR_MTIME, sa), 0); /* mtime 0 */
	CHECK_RC(stk_meta_store_create(st, &ROOT, d, "f", 0644, STK_CREATE_EXCL, &ZERO_LAYOUT, &PL4,
				       &a, &created),
		 0);
	CHECK(created == 1 && S_ISREG(a.mode) && (a.mode & 07777) == 0644 && a.nlink == 1);
	CHECK(a.size == 0 && a.uid == 0 && a.gid == 0);
	CHECK(a.layout.chunk_size == 1u << 20 && a.layout.stripe == 4 && a.layout.nchains == 4);
	CHECK(stk_layout_check(&a.layout) == 0);
	CHECK(attr_of(d).mtime_sec > 0);
	f = a.ino;
	/* chains 2 and 3 of 4 down (a node away): new files use only 1 and 4 */
	{
		struct stk_meta_placement half = PL4;
		char name[16];

		half.down[0] = (1u << 1) | (1u << 2);
		half.ndown = 2;
		for (int i = 0; i < 40; i++) {
			uint32_t chains[STK_MAX_STRIPE];

			snprintf(name, sizeof(name), "half%d", i);
			CHECK_RC(stk_meta_store_create(st, &ROOT, d, name, 0644, STK_CREATE_EXCL,
						       &ZERO_LAYOUT, &half, &b, &created),
				 0);
			CHECK(b.layout.stripe == 2 && b.layout.nchains == 4 &&
			      stk_layout_check(&b.layout) == 0);
			stk_layout_chains(&b.layout, chains);
			for (uint32_t k = 0; k < b.layout.stripe; k++)
				CHECK(chains[k] == 1 || chains[k] == 4);
		}
	}

	CHECK_RC(stk_meta_store_create(st, &ROOT, d, "f", 0644, STK_CREATE_EXCL, &ZERO_LAYOUT, &PL4,
				       &b, &created),
		 -EEXIST);
	CHECK_RC(
	    stk_meta_store_create(st, &ROOT, d, "f", 0600, 0, &ZERO_LAYOUT, &PL4, &b, &created), 0);
	CHECK(created == 0 && b.ino == f && (b.mode & 07777) == 0644);
	/* an existing file needs no storage, even when none exists */
	CHECK_RC(
	    stk_meta_store_create(st, &ROOT, d, "f", 0644, 0, &ZERO_LAYOUT, &PL0, &b, &created), 0);
	CHECK_RC(
	    stk_meta_store_create(st, &ROOT, d, "g", 0644, 0, &ZERO_LAYOUT, &PL0, &b, &created),
	    -ENOSPC);
	CHECK_RC(stk_meta_store_lookup(st, &ROOT, d, "g", &b), -ENOENT);

	mkdir_as(&ROOT, d, "sub", 0755);
	CHECK_RC(
	    stk_meta_store_create(st, &ROOT, d, "sub", 0644, 0, &ZERO_LAYOUT, &PL4, &b, &created),
	    -EISDIR);
	CHECK_RC(stk_meta_store_create(st, &ROOT, d, "sub", 0644, STK_CREATE_EXCL, &ZERO_LAYOUT,
				       &PL4, &b, &created),
		 -EEXIST);
	CHECK_RC(
	    stk_meta_store_create(st, &ROOT, f, "x", 0644, 0, &ZERO_LAYOUT, &PL4, &b, &created),
	    -ENOTDIR);
	CHECK_RC(stk_meta_store_create(st, &ROOT, 777777, "x", 0644, 0, &ZERO_LAYOUT, &PL4, &b,
				       &created),
		 -ENOENT);
	CHECK_RC(
	    stk_meta_store_create(st, &ROOT, d, "x", 0644, 0x10, &ZERO_LAYOUT, &PL4, &b, &created),
	    -EINVAL);

	/* a requested layout is checked, and stored as given */
	CHECK_RC(stk_meta_store_create(st, &ROOT, d, "lay", 0644, 0, &want, &PL4, &b, &created), 0);
	CHECK(memcmp(&b.layout, &want, sizeof(want)) == 0);
	a = attr_of(b.ino);
	CHECK(memcmp(&a.layout, &want, sizeof(want)) == 0);
	bad.chunk_size = 1000;
	CHECK_RC(stk_meta_store_create(st, &ROOT, d, "bad1", 0644, 0, &bad, &PL4, &b, &created),
		 -EINVAL);
	bad = want;
	bad.nchains = 8; /* more chains than exist */
	CHECK_RC(stk_meta_store_create(st, &ROOT, d, "bad2", 0644, 0, &bad, &PL4, &b, &created),
		 -EINVAL);
	bad = want;
	bad.start = 4;
	CHECK_RC(stk_meta_store_create(st, &ROOT, d, "bad3", 0644, 0, &bad, &PL4, &b, &created),
		 -EINVAL);

	/* defaults: chunk size 1 MiB, stripe clamped to the chains there are */
	CHECK_RC(stk_meta_store_create(st, &ROOT, d, "wide", 0644, 0, NULL, &wide, &b, &created),
		 0);
	CHECK(b.layout.chunk_size == STK_DEFAULT_CHUNK_SIZE && b.layout.stripe == 4);
	/* type bits in the requested mode are ignored: it is a regular file */
	CHECK_RC(stk_meta_store_create(st, &ROOT, d, "typed", S_IFDIR | 0640, 0, NULL, &PL4, &b,
				       &created),
		 0);
	CHECK(S_ISREG(b.mode) && (b.mode & 07777) == 0640);
}

static void test_mkdir_rmdir(void)
{
	uint32_t root_links = attr_of(STK_ROOT_INO).nlink;
	struct stk_attr a;
	uint64_t d, sub;

	d = mkdir_as(&ROOT, STK_ROOT_INO, "md", 0750);
	a = attr_of(d);
	CHECK(S_ISDIR(a.mode) && (a.mode & 07777) == 0750 && a.nlink == 2);
	CHECK(attr_of(STK_ROOT_INO).nlink == root_links + 1);
	CHECK_RC(stk_meta_store_mkdir(st, &ROOT, STK_ROOT_INO, "md", 0755, &a), -EEXIST);
	sub = mkdir_as(&ROOT, d, "sub", 0755);
	CHECK(attr_of(d).nlink == 3);
	CHECK_RC(stk_meta_store_lookup(st, &ROOT, sub, "..", &a), 0);
	CHECK(a.ino == d);
	create_as(&ROOT, d, "file");
	CHECK(attr_of(d).nlink == 3); /* files do not count */
	CHECK_RC(stk_meta_store_rmdir(st, &ROOT, STK_ROOT_INO, "md"), -ENOTEMPTY);
	CHECK_RC(stk_meta_store_rmdir(st, &ROOT, d, "file"), -ENOTDIR);
	CHECK_RC(stk_meta_store_rmdir(st, &ROOT, d, "nothing"), -ENOENT);
	CHECK_RC(stk_meta_store_rmdir(st, &ROOT, d, "sub"), 0);
	CHECK(attr_of(d).nlink == 2);
	CHECK_RC(stk_meta_store_getattr(st, &ROOT, sub, &a), -ENOENT);
	CHECK_RC(stk_meta_store_unlink(st, &ROOT, d, "file", &a), 0);
	CHECK_RC(stk_meta_store_rmdir(st, &ROOT, STK_ROOT_INO, "md"), 0);
	CHECK(attr_of(STK_ROOT_INO).nlink == root_links);
	CHECK_RC(stk_meta_store_lookup(st, &ROOT, STK_ROOT_INO, "md", &a), -ENOENT);
	/* the setuid/setgid bits of mkdir's mode are ignored, the sticky bit kept */
	d = mkdir_as(&ROOT, STK_ROOT_INO, "md2", 07777);
	CHECK((attr_of(d).mode & 07777) == 01777);
	CHECK_RC(stk_meta_store_rmdir(st, &ROOT, STK_ROOT_INO, "md2"), 0);
}

/*
 * rmdir and rename only of the inodes meta looked up and recalled: a name that
 * came to hold another inode in between is -EAGAIN and nothing changes.
 */
static void test_expect_ino(void)
{
	uint64_t d = mkdir_as(&ROOT, STK_ROOT_INO, "ei", 0755);
	uint64_t a = mkdir_as(&ROOT, d, "a", 0755), b = mkdir_as(&ROOT, d, "b", 0755);
	uint64_t f = create_as(&ROOT, d, "f");
	struct stk_attr at;
	int replaced;

	CHECK_RC(stk_meta_store_rmdir_ino(st, &ROOT, d, "a", b), -EAGAIN);
	CHECK_RC(stk_meta_store_rmdir_ino(st, &ROOT, d, "a", 0), -EAGAIN);
	CHECK(ino_of(d, "a") == a);
	CHECK_RC(stk_meta_store_rmdir_ino(st, &ROOT, d, "none", a), -EAGAIN);
	CHECK_RC(stk_meta_store_rmdir_ino(st, &ROOT, d, "none", 0), -ENOENT);
	CHECK_RC(stk_meta_store_rmdir_ino(st, &ROOT, d, "f", f), -ENOTDIR);
	/* renames: the source, then the target, each checked */
	CHECK_RC(stk_meta_store_rename_ino(st, &ROOT, d, "a", d, "b", 0, b, b, &replaced, &at),
		 -EAGAIN);
	CHECK_RC(stk_meta_store_rename_ino(st, &ROOT, d, "a", d, "b", 0, a, 0, &replaced, &at),
		 -EAGAIN);
	CHECK_RC(stk_meta_store_rename_ino(st, &ROOT, d, "a", d, "c", 0, a, b, &replaced, &at),
		 -EAGAIN);
	CHECK(ino_of(d, "a") == a && ino_of(d, "b") == b && ino_of(d, "c") == 0);
	/* what was looked up is what is there: as plain rename and rmdir */
	CHECK_RC(stk_meta_store_rename_ino(st, &ROOT, d, "a", d, "b", 0, a, b, &replaced, &at), 0);
	CHECK(ino_of(d, "a") == 0 && ino_of(d, "b") == a);
	CHECK_RC(stk_meta_store_rename_ino(st, &ROOT, d, "b", d, "c", 0, a, 0, &replaced, &at), 0);
	CHECK_RC(stk_meta_store_rename_ino(st, &ROOT, d, "c", d, "b", 0, STK_META_ANY_INO,
					   STK_META_ANY_INO, &replaced, &at),
		 0);
	CHECK_RC(stk_meta_store_rmdir_ino(st, &ROOT, d, "b", a), 0);
	CHECK_RC(stk_meta_store_unlink(st, &ROOT, d, "f", &at), 0);
	CHECK_RC(stk_meta_store_rmdir_ino(st, &ROOT, STK_ROOT_INO, "ei", STK_META_ANY_INO), 0);
}

static void test_link_unlink(void)
{
	uint64_t d = mkdir_as(&ROOT, STK_ROOT_INO, "ln", 0755);
	uint64_t f = create_as(&ROOT, d, "f"), sub = mkdir_as(&ROOT, d, "sub", 0755);
	struct stk_attr a;

	CHECK_RC(stk_meta_store_link(st, &ROOT, f, d, "g", &a), 0);
	CHECK(a.ino == f && a.nlink == 2);
	CHECK(ino_of(d, "g") == f);
	CHECK_RC(stk_meta_store_link(st, &ROOT, sub, d, "sub2", &a), -EPERM);
	CHECK_RC(stk_meta_store_link(st, &ROOT, f, d, "sub", &a), -EEXIST);
	CHECK_RC(stk_meta_store_link(st, &ROOT, 888888, d, "h", &a), -ENOENT);
	CHECK_RC(stk_meta_store_link(st, &ROOT, f, f, "h", &a), -ENOTDIR);
	CHECK_RC(stk_meta_store_unlink(st, &ROOT, d, "f", &a), 0);
	CHECK(a.ino == f && a.nlink == 1);
	CHECK(attr_of(f).nlink == 1);
	CHECK_RC(stk_meta_store_unlink(st, &ROOT, d, "g", &a), 0);
	CHECK(a.ino == f && a.nlink == 0);
	CHECK_RC(stk_meta_store_getattr(st, &ROOT, f, &a), -ENOENT);
	CHECK_RC(stk_meta_store_unlink(st, &ROOT, d, "g", &a), -ENOENT);
	CHECK_RC(stk_meta_store_unlink(st, &ROOT, d, "sub", &a), -EISDIR);
}

static void test_symlink(void)
{
	uint64_t d = mkdir_as(&ROOT, STK_ROOT_INO, "sl", 0755), f = create_as(&ROOT, d, "f");
	char buf[STK_PATH_MAX + 1], longt[STK_PATH_MAX + 2];
	struct stk_attr a;
	uint64_t files0, files1;

	CHECK_RC(stk_meta_store_statfs(st, &files0), 0);
	CHECK_RC(stk_meta_store_symlink(st, &ROOT, d, "s", "target/path", &a), 0);
	CHECK(S_ISLNK(a.mode) && (a.mode & 07777) == 0777 && a.size == 11 && a.nlink == 1);
	CHECK_RC(stk_meta_store_statfs(st, &files1), 0);
	CHECK(files1 == files0 + 1);
	CHECK_RC(stk_meta_store_readlink(st, &ROOT, a.ino, buf, sizeof(buf)), 0);
	CHECK(strcmp(buf, "target/path") == 0);
	CHECK_RC(stk_meta_store_readlink(st, &ROOT, a.ino, buf, 5), -ERANGE);
	CHECK_RC(stk_meta_store_readlink(st, &ROOT, f, buf, sizeof(buf)), -EINVAL);
	CHECK_RC(stk_meta_store_readlink(st, &ROOT, 777777, buf, sizeof(buf)), -ENOENT);
	CHECK_RC(stk_meta_store_symlink(st, &ROOT, d, "e", "", &a), -ENOENT);
	CHECK_RC(stk_meta_store_symlink(st, &ROOT, d, "s", "x", &a), -EEXIST);
	memset(longt, 'a', sizeof(longt));
	longt[STK_PATH_MAX + 1] = 0;
	CHECK_RC(stk_meta_store_symlink(st, &ROOT, d, "l", longt, &a), -ENAMETOOLONG);
	longt[STK_PATH_MAX] = 0;
	CHECK_RC(stk_meta_store_symlink(st, &ROOT, d, "l", longt, &a), 0);
	CHECK_RC(stk_meta_store_readlink(st, &ROOT, a.ino, buf, sizeof(buf)), 0);
	CHECK(strlen(buf) == STK_PATH_MAX);
	/* a hard link to a symlink keeps the target; the last unlink drops it */
	CHECK_RC(stk_meta_store_link(st, &ROOT, ino_of(d, "s"), d, "s2", &a), 0);
	CHECK_RC(stk_meta_store_unlink(st, &ROOT, d, "s", &a), 0);
	CHECK_RC(stk_meta_store_readlink(st, &ROOT, a.ino, buf, sizeof(buf)), 0);
	CHECK(strcmp(buf, "target/path") == 0);
	CHECK_RC(stk_meta_store_unlink(st, &ROOT, d, "s2", &a), 0);
	CHECK(a.nlink == 0);
	CHECK_RC(stk_meta_store_readlink(st, &ROOT, a.ino, buf, sizeof(buf)), -ENOENT);
}

/* A read's atime under relatime: moves once after a change, not again, never ctime. */
static void test_setattr_atime_read(void)
{
	uint64_t f = create_as(&ROOT, STK_ROOT_INO, "relatime");
	struct stk_meta_sattr sa = {0};
	struct stk_attr before, a;

	before = attr_of(f); /* just made: atime == mtime, so the first read is due */
	usleep(2000);
	CHECK_RC(setattr_as(&BOB, f, STK_SETATTR_ATIME_READ, sa), 0); /* anyone who read it */
	a = attr_of(f);
	CHECK(a.atime_sec > before.atime_sec ||
	      (a.atime_sec == before.atime_sec && a.atime_nsec > before.atime_nsec));
	CHECK(a.ctime_sec == before.ctime_sec && a.ctime_nsec == before.ctime_nsec);
	CHECK(a.mtime_sec == before.mtime_sec && a.mtime_nsec == before.mtime_nsec);
	/* read again before any change: not due, nothing moves */
	before = a;
	usleep(2000);
	CHECK_RC(setattr_as(&ROOT, f, STK_SETATTR_ATIME_READ, sa), 0);
	a = attr_of(f);
	CHECK(a.atime_sec == before.atime_sec && a.atime_nsec == before.atime_nsec);
	/* a change (here an mtime after atime) makes the next read due again */
	sa.mtime_sec = a.atime_sec + 10;
	CHECK_RC(setattr_as(&ROOT, f, STK_SETATTR_MTIME, sa), 0);
	before = attr_of(f);
	CHECK_RC(setattr_as(&ROOT, f, STK_SETATTR_ATIME_READ, sa), 0);
	a = attr_of(f);
	CHECK(a.atime_sec != before.atime_sec || a.atime_nsec != before.atime_nsec);
	CHECK(a.ctime_sec == before.ctime_sec && a.ctime_nsec == before.ctime_nsec);
	/* only alone */
	CHECK_RC(setattr_as(&ROOT, f, STK_SETATTR_ATIME_READ | STK_SETATTR_MODE, sa), -EINVAL);
	CHECK_RC(setattr_as(&ROOT, 999999, STK_SETATTR_ATIME_READ, sa), -ENOENT);
}

/* Reads recorded in a batch (META_CLOSES): each as ATIME_READ, a gone inode skipped. */
static void test_record_reads(void)
{
	uint64_t f = create_as(&ROOT, STK_ROOT_INO, "rr1"), g = create_as(&ROOT, STK_ROOT_INO, "rr2");
	uint64_t inos[3] = {f, 999999, g};
	struct stk_attr bf = attr_of(f), bg = attr_of(g), a;

	usleep(2000);
	CHECK_RC(stk_meta_store_record_reads(st, inos, 3), 0);
	a = attr_of(f);
	CHECK(a.atime_sec > bf.atime_sec ||
	      (a.atime_sec == bf.atime_sec && a.atime_nsec > bf.atime_nsec));
	CHECK(a.ctime_sec == bf.ctime_sec && a.ctime_nsec == bf.ctime_nsec);
	a = attr_of(g);
	CHECK(a.atime_sec > bg.atime_sec ||
	      (a.atime_sec == bg.atime_sec && a.atime_nsec > bg.atime_nsec));
	/* again before any change: not due, nothing moves */
	bf = attr_of(f);
	usleep(2000);
	CHECK_RC(stk_meta_store_record_reads(st, inos, 1), 0);
	a = attr_of(f);
	CHECK(a.atime_sec == bf.atime_sec && a.atime_nsec == bf.atime_nsec);
	CHECK_RC(stk_meta_store_record_reads(st, inos, 0), 0);
}

static void test_getattrs(void)
{
	uint64_t f = create_as(&ROOT, STK_ROOT_INO, "ga1"), g = create_as(&ROOT, STK_ROOT_INO, "ga2");
	uint64_t inos[4] = {f, 999999, STK_ROOT_INO, g};
	struct stk_attr out[4], one;
	int rcs[4];

	memset(out, 0, sizeof(out));
	CHECK_RC(stk_meta_store_getattrs(st, &ROOT, inos, 4, out, rcs), 0);
	CHECK_RC(rcs[0], 0);
	CHECK_RC(rcs[1], -ENOENT);
	CHECK_RC(rcs[2], 0);
	CHECK_RC(rcs[3], 0);
	one = attr_of(f);
	CHECK(out[0].ino == f && out[0].mode == one.mode && out[0].nlink == one.nlink &&
	      out[0].size == one.size && out[0].mtime_sec == one.mtime_sec &&
	      out[0].mtime_nsec == one.mtime_nsec && out[0].layout.seed == one.layout.seed);
	CHECK(out[2].ino == STK_ROOT_INO && S_ISDIR(out[2].mode));
	CHECK(out[3].ino == g && S_ISREG(out[3].mode));
	CHECK_RC(stk_meta_store_getattrs(st, &ROOT, inos, 0, out, rcs), 0);
}

static void test_setattr_extend(void)
{
	uint64_t d = mkdir_as(&ROOT, STK_ROOT_INO, "sa", 0755), f = create_as(&ROOT, d, "f");
	uint64_t s;
	struct stk_meta_sattr sa = {0};
	struct stk_attr a, before;

	CHECK_RC(stk_meta_store_symlink(st, &ROOT, d, "s", "f", &a), 0);
	s = a.ino;
	sa.mode = 0600;
	CHECK_RC(setattr_as(&ROOT, f, STK_SETATTR_MODE, sa), 0);
	CHECK(attr_of(f).mode == (S_IFREG | 0600));
	sa.uid = 5;
	sa.gid = 6;
	CHECK_RC(setattr_as(&ROOT, f, STK_SETATTR_UID | STK_SETATTR_GID, sa), 0);
	a = attr_of(f);
	CHECK(a.uid == 5 && a.gid == 6);

	/* truncate: size, blocks, and mtime follow */
	sa.mtime_sec = 100;
	CHECK_RC(setattr_as(&ROOT, f, STK_SETATTR_MTIME, sa), 0);
	sa.size = 1000;
	CHECK_RC(setattr_as(&ROOT, f, STK_SETATTR_SIZE, sa), 0);
	a = attr_of(f);
	CHECK(a.size == 1000 && a.blocks == 0 && a.mtime_sec > 100); /* a hole: nothing stored */
	CHECK_RC(setattr_as(&ROOT, d, STK_SETATTR_SIZE, sa), -EISDIR);
	CHECK_RC(setattr_as(&ROOT, s, STK_SETATTR_SIZE, sa), -EINVAL);

	/* explicit times, then "now" */
	sa.atime_sec = 1000;
	sa.atime_nsec = 5;
	sa.mtime_sec = 2000;
	sa.mtime_nsec = 6;
	CHECK_RC(setattr_as(&ROOT, f, STK_SETATTR_ATIME | STK_SETATTR_MTIME, sa), 0);
	a = attr_of(f);
	CHECK(a.atime_sec == 1000 && a.atime_nsec == 5 && a.mtime_sec == 2000 && a.mtime_nsec == 6);
	CHECK(a.ctime_sec > 2000);
	CHECK_RC(setattr_as(&ROOT, f,
			    STK_SETATTR_ATIME | STK_SETATTR_MTIME | STK_SETATTR_ATIME_NOW |
				STK_SETATTR_MTIME_NOW,
			    sa),
		 0);
	a = attr_of(f);
	CHECK(a.atime_sec > 1000 && a.mtime_sec > 2000);
	sa.mtime_nsec = 1000000000;
	CHECK_RC(setattr_as(&ROOT, f, STK_SETATTR_MTIME, sa), -EINVAL);
	CHECK_RC(setattr_as(&ROOT, f, 0x1000, sa), -EINVAL);
	CHECK_RC(setattr_as(&ROOT, 999999, STK_SETATTR_MODE, sa), -ENOENT);

	/* chown of a non-directory drops setuid, and setgid when group-executable */
	sa.mode = 06755;
	CHECK_RC(setattr_as(&ROOT, f, STK_SETATTR_MODE, sa), 0);
	sa.uid = 7;
	CHECK_RC(setattr_as(&ROOT, f, STK_SETATTR_UID, sa), 0);
	CHECK((attr_of(f).mode & 07777) == 0755);
	sa.mode = 02745; /* setgid without group exec: mandatory-locking mark, kept */
	CHECK_RC(setattr_as(&ROOT, f, STK_SETATTR_MODE, sa), 0);
	CHECK_RC(setattr_as(&ROOT, f, STK_SETATTR_UID, sa), 0);
	CHECK((attr_of(f).mode & 07777) == 02745);

	/* extend: size only grows; mtime as given, or now */
	before = attr_of(f);
	CHECK_RC(stk_meta_store_extend(st, &ROOT, f, 5000, 3000, 7, &a), 0);
	CHECK(a.size == 5000 && a.blocks == 10 && a.mtime_sec == 3000 && a.mtime_nsec == 7);
	CHECK(a.ctime_sec >= before.ctime_sec);
	CHECK_RC(stk_meta_store_extend(st, &ROOT, f, 10, 0, 0, &a), 0);
	CHECK(a.size == 5000 && a.mtime_sec > 3000);
	CHECK(attr_of(f).size == 5000);
	CHECK_RC(stk_meta_store_extend(st, &ROOT, d, 10, 0, 0, &a), -EISDIR);
	CHECK_RC(stk_meta_store_extend(st, &ROOT, s, 10, 0, 0, &a), -EINVAL);
	CHECK_RC(stk_meta_store_extend(st, &ROOT, 999999, 10, 0, 0, &a), -ENOENT);
}

/* Fifos, sockets and device nodes: inodes with a type, and rdev for devices. */
static void test_mknod(void)
{
	uint64_t d = mkdir_as(&ROOT, STK_ROOT_INO, "mk", 0777);
	struct stk_meta_sattr sa = {0};
	struct stk_attr a, l;
	char big[8];

	CHECK_RC(stk_meta_store_mknod(st, &ALICE, d, "p", S_IFIFO | 0640, 77, &a), 0);
	CHECK(a.mode == (S_IFIFO | 0640) && a.rdev == 0 && a.uid == 1001 && a.size == 0);
	CHECK_RC(stk_meta_store_mknod(st, &ALICE, d, "s", S_IFSOCK | 0755, 0, &a), 0);
	CHECK(attr_of(a.ino).mode == (S_IFSOCK | 0755));
	/* devices: root only, with their number */
	CHECK_RC(stk_meta_store_mknod(st, &ALICE, d, "c", S_IFCHR | 0600, 0x0103, &a), -EPERM);
	CHECK_RC(stk_meta_store_mknod(st, &ROOT, d, "c", S_IFCHR | 0600, 0x0103, &a), 0);
	CHECK(attr_of(a.ino).mode == (S_IFCHR | 0600) && attr_of(a.ino).rdev == 0x0103);
	CHECK_RC(stk_meta_store_mknod(st, &ROOT, d, "b", S_IFBLK | 0660, 0x0801, &a), 0);
	CHECK(attr_of(a.ino).rdev == 0x0801);
	CHECK_RC(stk_meta_store_lookup(st, &ROOT, d, "b", &l), 0);
	CHECK(l.mode == (S_IFBLK | 0660) && l.rdev == 0x0801);
	/* other types, names taken */
	CHECK_RC(stk_meta_store_mknod(st, &ROOT, d, "r", S_IFREG | 0600, 0, &a), -EINVAL);
	CHECK_RC(stk_meta_store_mknod(st, &ROOT, d, "r", S_IFDIR | 0600, 0, &a), -EINVAL);
	CHECK_RC(stk_meta_store_mknod(st, &ROOT, d, "r", 0600, 0, &a), -EINVAL);
	CHECK_RC(stk_meta_store_mknod(st, &ROOT, d, "p", S_IFIFO | 0600, 0, &a), -EEXIST);
	CHECK_RC(stk_meta_store_mknod(st, &BOB, mkdir_as(&ROOT, d, "ro", 0755), "p", S_IFIFO, 0, &a),
		 -EACCES);
	/* chmod, chown, link, rename, xattrs, unlink */
	sa.mode = 0604;
	CHECK_RC(stk_meta_store_lookup(st, &ROOT, d, "p", &l), 0);
	CHECK_RC(setattr_as(&ROOT, l.ino, STK_SETATTR_MODE, sa), 0);
	CHECK(attr_of(l.ino).mode == (S_IFIFO | 0604));
	sa.uid = 9;
	CHECK_RC(setattr_as(&ROOT, l.ino, STK_SETATTR_UID, sa), 0);
	CHECK(attr_of(l.ino).uid == 9);
	sa.size = 10;
	CHECK_RC(setattr_as(&ROOT, l.ino, STK_SETATTR_SIZE, sa), -EINVAL);
	CHECK_RC(stk_meta_store_extend(st, &ROOT, l.ino, 10, 0, 0, &a), -EINVAL);
	CHECK_RC(stk_meta_store_link(st, &ROOT, l.ino, d, "p2", &a), 0);
	CHECK(a.nlink == 2);
	int replaced;
	CHECK_RC(stk_meta_store_rename(st, &ROOT, d, "p2", d, "p3", 0, &replaced, &a), 0);
	CHECK_RC(stk_meta_store_setxattr(st, &ROOT, l.ino, "trusted.x", "v", 1, 0), 0);
	size_t len = 0;
	CHECK_RC(stk_meta_store_getxattr(st, &ROOT, l.ino, "trusted.x", big, sizeof(big), &len), 0);
	CHECK(len == 1 && big[0] == 'v');
	CHECK_RC(stk_meta_store_unlink(st, &ROOT, d, "p", &a), 0);
	CHECK_RC(stk_meta_store_unlink(st, &ROOT, d, "p3", &a), 0);
	CHECK(a.nlink == 0);
	CHECK_RC(stk_meta_store_getattr(st, &ROOT, l.ino, &a), -ENOENT);
}

/* st_blocks: the written chunks below the size, not size / 512. */
static void test_blocks(void)
{
	uint64_t d = mkdir_as(&ROOT, STK_ROOT_INO, "blk", 0755), f = create_as(&ROOT, d, "f");
	const uint64_t MIB = 1u << 20, GIB = 1ull << 30; /* PL4: chunks of 1 MiB */
	struct stk_meta_extend x = {0};
	struct stk_meta_sattr sa = {0};
	struct stk_attr a;

	/* truncate -s 1G: a hole */
	sa.size = GIB;
	CHECK_RC(setattr_as(&ROOT, f, STK_SETATTR_SIZE, sa), 0);
	CHECK(attr_of(f).size == GIB && attr_of(f).blocks == 0);
	/* 1 MiB written at 100 MiB: one chunk */
	x.alloc_first = 100, x.alloc_end = 101;
	CHECK_RC(stk_meta_store_extend_alloc(st, &ROOT, f, &x, &a), 0);
	CHECK(a.size == GIB && a.blocks == MIB / 512);
	/* and the last chunk, and chunks 10-19 */
	x.alloc_first = 1023, x.alloc_end = 1024;
	CHECK_RC(stk_meta_store_extend_alloc(st, &ROOT, f, &x, &a), 0);
	x.alloc_first = 10, x.alloc_end = 20;
	CHECK_RC(stk_meta_store_extend_alloc(st, &ROOT, f, &x, &a), 0);
	CHECK(a.blocks == 12 * MIB / 512);
	/* touching ranges merge; the count stays */
	x.alloc_first = 20, x.alloc_end = 21;
	CHECK_RC(stk_meta_store_extend_alloc(st, &ROOT, f, &x, &a), 0);
	CHECK(a.blocks == 13 * MIB / 512);
	/* punch chunks 12-14 and 100: they count no more */
	x = (struct stk_meta_extend){.punch_first = 12, .punch_end = 15};
	CHECK_RC(stk_meta_store_extend_alloc(st, &ROOT, f, &x, &a), 0);
	CHECK(a.blocks == 10 * MIB / 512);
	x = (struct stk_meta_extend){.punch_first = 100, .punch_end = 101};
	CHECK_RC(stk_meta_store_extend_alloc(st, &ROOT, f, &x, &a), 0);
	CHECK(a.blocks == 9 * MIB / 512);
	/* written and punched in one report: the punch wins over the range that covers it */
	x = (struct stk_meta_extend){.alloc_first = 30, .alloc_end = 40, .punch_first = 31,
				     .punch_end = 39};
	CHECK_RC(stk_meta_store_extend_alloc(st, &ROOT, f, &x, &a), 0);
	CHECK(a.blocks == 11 * MIB / 512);
	/* kept across a reopen of the store: checked by getattr */
	CHECK(attr_of(f).blocks == 11 * MIB / 512);
	/* a truncate forgets the chunks past the new end; growing again adds nothing */
	sa.size = 15 * MIB + 100;
	CHECK_RC(setattr_as(&ROOT, f, STK_SETATTR_SIZE, sa), 0);
	CHECK(attr_of(f).blocks == 2 * MIB / 512 + 1); /* 10, 11, and 100 bytes of 15 */
	sa.size = GIB;
	CHECK_RC(setattr_as(&ROOT, f, STK_SETATTR_SIZE, sa), 0);
	CHECK(attr_of(f).blocks == 3 * MIB / 512);
	/* many scattered chunks: past 32 ranges the closest merge, never undercounting */
	for (uint32_t i = 0; i < 40; i++) {
		x = (struct stk_meta_extend){.alloc_first = 200 + 3 * i, .alloc_end = 201 + 3 * i};
		CHECK_RC(stk_meta_store_extend_alloc(st, &ROOT, f, &x, &a), 0);
	}
	CHECK(a.blocks >= (3 + 40) * MIB / 512 && a.blocks <= (6 + 120) * MIB / 512);
	/* a file written from start to end: size / 512 rounded up, as before */
	f = create_as(&ROOT, d, "g");
	x = (struct stk_meta_extend){.size = 5 * MIB + 1, .alloc_first = 0, .alloc_end = 6};
	CHECK_RC(stk_meta_store_extend_alloc(st, &ROOT, f, &x, &a), 0);
	CHECK(a.blocks == (5 * MIB + 1 + 511) / 512);
	/* a chunk past the size counts once the size reaches it */
	f = create_as(&ROOT, d, "h");
	x = (struct stk_meta_extend){.size = 0, .alloc_first = 3, .alloc_end = 4};
	CHECK_RC(stk_meta_store_extend_alloc(st, &ROOT, f, &x, &a), 0);
	CHECK(a.blocks == 0);
	x = (struct stk_meta_extend){.size = 3 * MIB + 512};
	CHECK_RC(stk_meta_store_extend_alloc(st, &ROOT, f, &x, &a), 0);
	CHECK(a.blocks == 1);
}

/* Rewrites inode ino's record in the closed store in tmpdir as format 1 (older stores). */
static void to_format1(uint64_t ino)
{
	MDB_env *env = NULL;
	MDB_txn *txn = NULL;
	MDB_dbi dbi;
	uint8_t k[8], rec[128];
	MDB_val key = {sizeof(k), k}, val;
	int rc;

	for (int i = 0; i < 8; i++)
		k[i] = (uint8_t)(ino >> (56 - 8 * i));
	rc = mdb_env_create(&env);
	if (rc == 0) {
		mdb_env_set_maxdbs(env, 5);
		mdb_env_set_mapsize(env, 1ull << 30);
		rc = mdb_env_open(env, tmpdir, 0, 0600);
	}
	if (rc == 0)
		rc = mdb_txn_begin(env, NULL, 0, &txn);
	if (rc == 0)
		rc = mdb_dbi_open(txn, "inodes", 0, &dbi);
	if (rc == 0)
		rc = mdb_get(txn, dbi, &key, &val);
	/* format 3: u8 3, attr (100 bytes, then u64 rdev), u64 parent, u16 n, ranges, qid */
	CHECK(rc == 0 && val.mv_size >= 1 + 108 + 8 + 2 + 8 && ((uint8_t *)val.mv_data)[0] == 3);
	if (rc == 0 && val.mv_size >= 1 + 108 + 8 + 2) {
		rec[0] = 1;
		memcpy(rec + 1, (uint8_t *)val.mv_data + 1, 100);
		memcpy(rec + 101, (uint8_t *)val.mv_data + 109, 8);
		val.mv_data = rec;
		val.mv_size = 109;
		rc = mdb_put(txn, dbi, &key, &val, 0);
	}
	if (txn)
		rc = rc ? (mdb_txn_abort(txn), rc) : mdb_txn_commit(txn);
	CHECK(rc == 0);
	if (env)
		mdb_env_close(env);
}

/*
 * As a store from before files recorded their folder: ino's parent zeroed and the
 * mark that the store filled them in removed.
 */
static void forget_file_parent(uint64_t ino)
{
	MDB_env *env = NULL;
	MDB_txn *txn = NULL;
	MDB_dbi dbi, sys;
	uint8_t k[8], rec[512];
	MDB_val key = {sizeof(k), k}, val, mark = {12, (void *)"file_parents"};
	int rc;

	for (int i = 0; i < 8; i++)
		k[i] = (uint8_t)(ino >> (56 - 8 * i));
	rc = mdb_env_create(&env);
	if (rc == 0) {
		mdb_env_set_maxdbs(env, 8);
		mdb_env_set_mapsize(env, 1ull << 30);
		rc = mdb_env_open(env, tmpdir, 0, 0600);
	}
	if (rc == 0)
		rc = mdb_txn_begin(env, NULL, 0, &txn);
	if (rc == 0)
		rc = mdb_dbi_open(txn, "inodes", 0, &dbi);
	if (rc == 0)
		rc = mdb_dbi_open(txn, "sys", 0, &sys);
	if (rc == 0)
		rc = mdb_get(txn, dbi, &key, &val);
	/* format 3: u8 3, attr (100 bytes, then u64 rdev), u64 parent, ... */
	CHECK(rc == 0 && val.mv_size <= sizeof(rec) && ((uint8_t *)val.mv_data)[0] == 3);
	if (rc == 0 && val.mv_size <= sizeof(rec)) {
		memcpy(rec, val.mv_data, val.mv_size);
		memset(rec + 109, 0, 8);
		val.mv_data = rec;
		rc = mdb_put(txn, dbi, &key, &val, 0);
	}
	if (rc == 0)
		rc = mdb_del(txn, sys, &mark, NULL);
	if (txn)
		rc = rc ? (mdb_txn_abort(txn), rc) : mdb_txn_commit(txn);
	CHECK(rc == 0);
	if (env)
		mdb_env_close(env);
}

/* A store whose files do not record their folder gets them on opening, once. */
static void test_file_parents_filled(void)
{
	uint64_t top = mkdir_as(&ROOT, STK_ROOT_INO, "fp", 0755),
		 d = mkdir_as(&ROOT, top, "d", 0755);
	uint64_t f = create_as(&ROOT, d, "f");

	CHECK(stk_meta_store_within(st, f, top) == 1);
	CHECK_RC(stk_meta_store_sync(st), 0);
	stk_meta_store_close(st);
	st = NULL;
	forget_file_parent(f);
	if (open_store()) {
		CHECK(!"reopen after forgetting a file's folder");
		return;
	}
	CHECK(stk_meta_store_within(st, f, top) == 1);
	CHECK(stk_meta_store_within(st, f, d) == 1);
}

/* A store written before inode format 2 keeps working: attributes, parents, blocks. */
static void test_format1_records(void)
{
	uint64_t top = mkdir_as(&ROOT, STK_ROOT_INO, "old", 0755), d = mkdir_as(&ROOT, top, "d", 0755);
	uint64_t f = create_as(&ROOT, d, "f");
	const uint64_t MIB = 1u << 20;
	struct stk_meta_sattr sa = {0};
	struct stk_attr a, fa, da;

	CHECK_RC(stk_meta_store_extend(st, &ROOT, f, 3 * MIB + 5, 0, 0, &a), 0);
	fa = attr_of(f);
	da = attr_of(d);
	CHECK_RC(stk_meta_store_sync(st), 0);
	stk_meta_store_close(st);
	st = NULL;
	to_format1(f);
	to_format1(d);
	if (open_store()) {
		CHECK(!"reopen after format 1 records");
		return;
	}
	a = attr_of(f);
	CHECK(a.ino == f && a.size == fa.size && a.mode == fa.mode && a.blocks == fa.blocks &&
	      a.rdev == 0 && a.layout.chunk_size == fa.layout.chunk_size);
	a = attr_of(d);
	CHECK(a.ino == d && a.nlink == da.nlink && S_ISDIR(a.mode));
	/* the folder's parent survived: it may not move into its own subtree */
	CHECK_RC(stk_meta_store_rename(st, &ROOT, STK_ROOT_INO, "old", d, "x", 0, &(int){0}, &a),
		 -EINVAL);
	/* the file counts every chunk below its size, and follows a truncate */
	sa.size = MIB;
	CHECK_RC(setattr_as(&ROOT, f, STK_SETATTR_SIZE, sa), 0);
	sa.size = 4 * MIB;
	CHECK_RC(setattr_as(&ROOT, f, STK_SETATTR_SIZE, sa), 0);
	CHECK(attr_of(f).blocks == MIB / 512);
}

/*
 * Client confinement: what lies under a folder. Folders by their chain of parents;
 * files, symlinks and special files by the folder they were made in or last renamed
 * into (a hard link does not move it); the subtree's folder is under itself;
 * resolve finds folders by path and refuses anything else.
 */
static void test_within(void)
{
	uint64_t top = mkdir_as(&ROOT, STK_ROOT_INO, "wt", 0755);
	uint64_t in = mkdir_as(&ROOT, top, "in", 0755),
		 out = mkdir_as(&ROOT, STK_ROOT_INO, "wo", 0755);
	uint64_t deep = mkdir_as(&ROOT, in, "deep", 0755);
	uint64_t f = create_as(&ROOT, deep, "f"), g = create_as(&ROOT, out, "g"), ino = 0;
	struct stk_attr at;

	CHECK(stk_meta_store_within(st, top, top) == 1);
	CHECK(stk_meta_store_within(st, deep, top) == 1);
	CHECK(stk_meta_store_within(st, f, top) == 1);
	CHECK(stk_meta_store_within(st, out, top) == 0);
	CHECK(stk_meta_store_within(st, g, top) == 0);
	CHECK(stk_meta_store_within(st, STK_ROOT_INO, top) == 0);
	CHECK(stk_meta_store_within(st, 987654321, top) == 0);
	CHECK(stk_meta_store_within(st, g, STK_ROOT_INO) == 1);
	/* a symlink and a special file, by their folder */
	CHECK_RC(stk_meta_store_symlink(st, &ROOT, in, "sl", "/wo/g", &at), 0);
	CHECK(stk_meta_store_within(st, at.ino, top) == 1);
	CHECK_RC(stk_meta_store_mknod(st, &ROOT, out, "fifo", S_IFIFO | 0644, 0, &at), 0);
	CHECK(stk_meta_store_within(st, at.ino, top) == 0);
	/* renamed out and back in: follows its folder */
	CHECK_RC(rename_as(&ROOT, deep, "f", out, "f", 0), 0);
	CHECK(stk_meta_store_within(st, f, top) == 0);
	CHECK_RC(rename_as(&ROOT, out, "g", in, "g", 0), 0);
	CHECK(stk_meta_store_within(st, g, top) == 1);
	/* a hard link elsewhere does not move it */
	CHECK_RC(stk_meta_store_link(st, &ROOT, g, out, "g2", &at), 0);
	CHECK(stk_meta_store_within(st, g, top) == 1);
	/* a folder moved out takes what is in it along */
	CHECK_RC(rename_as(&ROOT, in, "deep", out, "deep", 0), 0);
	CHECK(stk_meta_store_within(st, deep, top) == 0);
	CHECK_RC(stk_meta_store_resolve(st, "/wt/in", &ino), 0);
	CHECK(ino == in);
	CHECK_RC(stk_meta_store_resolve(st, "/", &ino), 0);
	CHECK(ino == STK_ROOT_INO);
	CHECK_RC(stk_meta_store_resolve(st, "/wt/nothing", &ino), -ENOENT);
	CHECK_RC(stk_meta_store_resolve(st, "/wt/in/g", &ino), -ENOTDIR);
	CHECK_RC(stk_meta_store_resolve(st, "wt", &ino), -EINVAL);
}

static void test_rename(void)
{
	uint64_t d = mkdir_as(&ROOT, STK_ROOT_INO, "rn", 0755);
	uint64_t d1 = mkdir_as(&ROOT, d, "d1", 0755), d2 = mkdir_as(&ROOT, d, "d2", 0755);
	uint64_t a, x, y, sub, t, u, e;
	struct stk_attr at;
	int replaced;

	/* plain renames, in one directory and across two */
	a = create_as(&ROOT, d1, "a");
	CHECK_RC(rename_as(&ROOT, d1, "a", d1, "b", 0), 0);
	CHECK(ino_of(d1, "a") == 0 && ino_of(d1, "b") == a);
	CHECK_RC(rename_as(&ROOT, d1, "b", d2, "b", 0), 0);
	CHECK(ino_of(d1, "b") == 0 && ino_of(d2, "b") == a);
	CHECK_RC(rename_as(&ROOT, d1, "missing", d2, "c", 0), -ENOENT);
	CHECK_RC(rename_as(&ROOT, d1, "b", 123456, "c", 0), -ENOENT);

	/* over a file: replaced, and its attributes after */
	x = create_as(&ROOT, d1, "x");
	y = create_as(&ROOT, d1, "y");
	CHECK_RC(stk_meta_store_rename(st, &ROOT, d1, "x", d1, "y", 0, &replaced, &at), 0);
	CHECK(replaced == 1 && at.ino == y && at.nlink == 0);
	CHECK_RC(stk_meta_store_getattr(st, &ROOT, y, &at), -ENOENT);
	CHECK(ino_of(d1, "y") == x && ino_of(d1, "x") == 0);
	y = create_as(&ROOT, d1, "y2");
	CHECK_RC(stk_meta_store_link(st, &ROOT, y, d1, "y3", &at), 0);
	CHECK_RC(stk_meta_store_rename(st, &ROOT, d1, "y", d1, "y2", 0, &replaced, &at), 0);
	CHECK(replaced == 1 && at.ino == y && at.nlink == 1);
	CHECK(attr_of(y).nlink == 1);

	/* type rules */
	sub = mkdir_as(&ROOT, d1, "sub", 0755);
	mkdir_as(&ROOT, d1, "full", 0755);
	create_as(&ROOT, ino_of(d1, "full"), "inside");
	CHECK_RC(rename_as(&ROOT, d1, "y2", d1, "sub", 0), -EISDIR);
	CHECK_RC(rename_as(&ROOT, d1, "sub", d1, "y2", 0), -ENOTDIR);
	CHECK_RC(rename_as(&ROOT, d1, "sub", d1, "full", 0), -ENOTEMPTY);
	mkdir_as(&ROOT, d2, "empty", 0755);
	CHECK(attr_of(d1).nlink == 4 && attr_of(d2).nlink == 3);
	CHECK_RC(stk_meta_store_rename(st, &ROOT, d1, "sub", d2, "empty", 0, &replaced, &at), 0);
	CHECK(replaced == 0);
	CHECK(ino_of(d2, "empty") == sub && ino_of(d1, "sub") == 0);
	CHECK(attr_of(d1).nlink == 3 && attr_of(d2).nlink == 3);
	CHECK(ino_of(sub, "..") == d2);
	/* a directory over an empty one in the same parent */
	mkdir_as(&ROOT, d2, "e2", 0755);
	CHECK(attr_of(d2).nlink == 4);
	CHECK_RC(rename_as(&ROOT, d2, "empty", d2, "e2", 0), 0);
	CHECK(attr_of(d2).nlink == 3 && ino_of(d2, "e2") == sub);
	/* a directory to a new name in another parent */
	CHECK_RC(rename_as(&ROOT, d2, "e2", d1, "moved", 0), 0);
	CHECK(attr_of(d1).nlink == 4 && attr_of(d2).nlink == 2);
	CHECK(ino_of(sub, "..") == d1);

	/* NOREPLACE, EXCHANGE, bad flags */
	CHECK_RC(rename_as(&ROOT, d1, "y2", d1, "moved", STK_RENAME_NOREPLACE), -EEXIST);
	CHECK_RC(rename_as(&ROOT, d1, "y2", d1, "fresh", STK_RENAME_NOREPLACE), 0);
	CHECK_RC(rename_as(&ROOT, d1, "fresh", d2, "none", STK_RENAME_EXCHANGE), -ENOENT);
	CHECK_RC(
	    rename_as(&ROOT, d1, "fresh", d2, "none", STK_RENAME_EXCHANGE | STK_RENAME_NOREPLACE),
	    -EINVAL);
	CHECK_RC(rename_as(&ROOT, d1, "fresh", d2, "none", 0x8), -EINVAL);
	/* exchange a file in d2 with a directory in d1: link counts and ".." follow */
	e = create_as(&ROOT, d2, "efile");
	CHECK(attr_of(d1).nlink == 4 && attr_of(d2).nlink == 2);
	CHECK_RC(stk_meta_store_rename(st, &ROOT, d1, "moved", d2, "efile", STK_RENAME_EXCHANGE,
				       &replaced, &at),
		 0);
	CHECK(replaced == 0);
	CHECK(ino_of(d1, "moved") == e && ino_of(d2, "efile") == sub);
	CHECK(attr_of(d1).nlink == 3 && attr_of(d2).nlink == 3);
	CHECK(ino_of(sub, "..") == d2);

	/* a directory cannot move into its own subtree */
	t = mkdir_as(&ROOT, d, "t", 0755);
	u = mkdir_as(&ROOT, t, "u", 0755);
	create_as(&ROOT, u, "uf");
	CHECK_RC(rename_as(&ROOT, d, "t", u, "t", 0), -EINVAL);
	CHECK_RC(rename_as(&ROOT, d, "t", t, "t2", 0), -EINVAL);
	CHECK_RC(rename_as(&ROOT, d, "t", u, "uf", STK_RENAME_EXCHANGE), -EINVAL);
	CHECK_RC(rename_as(&ROOT, u, "uf", d, "t", STK_RENAME_EXCHANGE), -EINVAL);
	CHECK(ino_of(d, "t") == t && ino_of(t, "u") == u);
	/* onto its own ancestor: that ancestor is not empty */
	CHECK_RC(rename_as(&ROOT, t, "u", d, "t", 0), -ENOTEMPTY);

	/* two names of one inode, or one name onto itself: nothing happens */
	CHECK_RC(stk_meta_store_link(st, &ROOT, e, d1, "e2", &at), 0);
	CHECK_RC(stk_meta_store_rename(st, &ROOT, d1, "moved", d1, "e2", 0, &replaced, &at), 0);
	CHECK(replaced == 0 && ino_of(d1, "moved") == e && ino_of(d1, "e2") == e);
	CHECK(attr_of(e).nlink == 2);
	CHECK_RC(rename_as(&ROOT, d1, "moved", d1, "moved", 0), 0);
	CHECK(ino_of(d1, "moved") == e);
	CHECK_RC(rename_as(&ROOT, d1, "moved", d1, "moved", STK_RENAME_NOREPLACE), -EEXIST);
	CHECK_RC(rename_as(&ROOT, d1, ".", d1, "z", 0), -EINVAL);
}

static void test_permissions(void)
{
	uint64_t p, priv, f, tmp, af, bf, ast, sg, a1, a2, rd;
	struct stk_meta_sattr sa = {0};
	struct stk_attr a;
	int created, eof;

	p = mkdir_as(&ROOT, STK_ROOT_INO, "perm", 0755);
	CHECK_RC(stk_meta_store_create(st, &ALICE, p, "f", 0644, 0, NULL, &PL4, &a, &created),
		 -EACCES);
	CHECK_RC(stk_meta_store_mkdir(st, &ALICE, p, "d", 0755, &a), -EACCES);
	CHECK_RC(stk_meta_store_lookup(st, &ALICE, p, "nothing", &a), -ENOENT);
	sa.mode = 0777;
	CHECK_RC(setattr_as(&ALICE, p, STK_SETATTR_MODE, sa), -EPERM);
	CHECK_RC(setattr_as(&ROOT, p, STK_SETATTR_MODE, sa), 0);
	f = create_as(&ALICE, p, "f");
	a = attr_of(f);
	CHECK(a.uid == 1001 && a.gid == 1001);

	/* search and read permission on directories */
	priv = mkdir_as(&ROOT, p, "priv", 0700);
	create_as(&ROOT, priv, "secret");
	CHECK_RC(stk_meta_store_lookup(st, &ALICE, priv, "secret", &a), -EACCES);
	CHECK_RC(stk_meta_store_readdir(st, &ALICE, priv, 0, 0, NULL, NULL, &eof), -EACCES);
	CHECK_RC(stk_meta_store_mkdir(st, &ALICE, priv, "x", 0755, &a), -EACCES);
	CHECK_RC(stk_meta_store_link(st, &ALICE, f, priv, "x", &a), -EACCES);
	CHECK_RC(stk_meta_store_unlink(st, &ALICE, priv, "secret", &a), -EACCES);
	sa.mode = 0711; /* search but no read */
	CHECK_RC(setattr_as(&ROOT, priv, STK_SETATTR_MODE, sa), 0);
	CHECK_RC(stk_meta_store_lookup(st, &ALICE, priv, "secret", &a), 0);
	CHECK_RC(stk_meta_store_readdir(st, &ALICE, priv, 0, 0, NULL, NULL, &eof), -EACCES);
	CHECK_RC(stk_meta_store_unlink(st, &ALICE, priv, "secret", &a), -EACCES);

	/* chmod by the owner only; chown by root only; chgrp to one's own groups */
	sa.mode = 0640;
	CHECK_RC(setattr_as(&BOB, f, STK_SETATTR_MODE, sa), -EPERM);
	CHECK_RC(setattr_as(&ALICE, f, STK_SETATTR_MODE, sa), 0);
	sa.uid = 1002;
	CHECK_RC(setattr_as(&ALICE, f, STK_SETATTR_UID, sa), -EPERM);
	sa.uid = 1001;
	CHECK_RC(setattr_as(&ALICE, f, STK_SETATTR_UID, sa), 0);
	sa.gid = 2001;
	CHECK_RC(setattr_as(&ALICE, f, STK_SETATTR_GID, sa), 0);
	CHECK(attr_of(f).gid == 2001);
	sa.gid = 3000;
	CHECK_RC(setattr_as(&ALICE, f, STK_SETATTR_GID, sa), -EPERM);
	CHECK_RC(setattr_as(&BOB, f, STK_SETATTR_GID, sa), -EPERM);
	CHECK_RC(setattr_as(&ROOT, f, STK_SETATTR_GID, sa), 0);
	/* the owner outside the file's group cannot set setgid */
	sa.mode = 02755;
	CHECK_RC(setattr_as(&ALICE, f, STK_SETATTR_MODE, sa), 0);
	CHECK((attr_of(f).mode & 07777) == 0755);

	/* truncate needs write; explicit times need ownership; "now" needs write */
	sa.mode = 0644;
	CHECK_RC(setattr_as(&ALICE, f, STK_SETATTR_MODE, sa), 0);
	sa.size = 10;
	CHECK_RC(setattr_as(&BOB, f, STK_SETATTR_SIZE, sa), -EACCES);
	CHECK_RC(setattr_as(&ALICE, f, STK_SETATTR_SIZE, sa), 0);
	sa.mtime_sec = 5;
	CHECK_RC(setattr_as(&BOB, f, STK_SETATTR_MTIME, sa), -EPERM);
	CHECK_RC(setattr_as(&BOB, f, STK_SETATTR_MTIME | STK_SETATTR_MTIME_NOW, sa), -EACCES);
	sa.mode = 0666;
	CHECK_RC(setattr_as(&ALICE, f, STK_SETATTR_MODE, sa), 0);
	CHECK_RC(setattr_as(&BOB, f, STK_SETATTR_MTIME | STK_SETATTR_MTIME_NOW, sa), 0);
	CHECK_RC(setattr_as(&BOB, f, STK_SETATTR_ATIME_NOW, sa), 0);
	CHECK_RC(setattr_as(&BOB, f, STK_SETATTR_MTIME, sa), -EPERM);
	CHECK_RC(setattr_as(&ALICE, f, STK_SETATTR_MTIME, sa), 0);

	/* sticky directory: only the entry's owner, the directory's owner, or root */
	tmp = mkdir_as(&ROOT, p, "tmp", 01777);
	af = create_as(&ALICE, tmp, "af");
	bf = create_as(&BOB, tmp, "bf");
	CHECK_RC(stk_meta_store_unlink(st, &BOB, tmp, "af", &a), -EPERM);
	CHECK_RC(rename_as(&BOB, tmp, "af", tmp, "taken", 0), -EPERM);
	CHECK_RC(rename_as(&BOB, tmp, "bf", tmp, "af", 0), -EPERM);
	CHECK_RC(rename_as(&BOB, tmp, "bf", tmp, "bf2", 0), 0);
	CHECK_RC(stk_meta_store_unlink(st, &ALICE, tmp, "af", &a), 0);
	CHECK(a.ino == af && a.nlink == 0);
	CHECK_RC(stk_meta_store_unlink(st, &ROOT, tmp, "bf2", &a), 0);
	CHECK(a.ino == bf);
	ast = mkdir_as(&ALICE, p, "ast", 01777);
	create_as(&BOB, ast, "bobs");
	CHECK_RC(stk_meta_store_unlink(st, &ALICE, ast, "bobs", &a), 0);
	/* in a plain writable directory anyone with write may remove */
	create_as(&ALICE, p, "plain");
	CHECK_RC(stk_meta_store_unlink(st, &BOB, p, "plain", &a), 0);

	/* setgid directory: its group passes on, and its setgid bit to subdirectories */
	sg = mkdir_as(&ROOT, p, "sg", 0777);
	sa.mode = 02777;
	sa.gid = 4000;
	CHECK_RC(setattr_as(&ROOT, sg, STK_SETATTR_MODE | STK_SETATTR_GID, sa), 0);
	CHECK(attr_of(sg).mode == (S_IFDIR | 02777));
	a = attr_of(create_as(&ALICE, sg, "file"));
	CHECK(a.gid == 4000 && a.uid == 1001 && !(a.mode & S_ISGID));
	a = attr_of(mkdir_as(&ALICE, sg, "sub", 0755));
	CHECK(a.gid == 4000 && (a.mode & 07777) == 02755);
	CHECK_RC(stk_meta_store_symlink(st, &ALICE, sg, "ln", "file", &a), 0);
	CHECK(a.gid == 4000 && a.uid == 1001);
	/* a setgid file the caller's groups do not cover loses the bit */
	CHECK_RC(stk_meta_store_create(st, &ALICE, sg, "sgf", 02755, 0, NULL, &PL4, &a, &created),
		 0);
	CHECK((a.mode & 07777) == 0755);
	CHECK_RC(stk_meta_store_create(st, &ALICE, p, "sgf", 02755, 0, NULL, &PL4, &a, &created),
		 0);
	CHECK((a.mode & 07777) == 02755);

	/* moving a directory to another parent needs write on it (its ".." changes) */
	a1 = mkdir_as(&ALICE, p, "a1", 0755);
	a2 = mkdir_as(&ALICE, p, "a2", 0755);
	rd = mkdir_as(&ROOT, a1, "rd", 0755);
	CHECK_RC(rename_as(&ALICE, a1, "rd", a2, "rd", 0), -EACCES);
	CHECK_RC(rename_as(&ALICE, a1, "rd", a1, "rd2", 0), 0); /* same parent: fine */
	CHECK(ino_of(a1, "rd2") == rd);
	CHECK_RC(rename_as(&BOB, a1, "rd2", a1, "rd3", 0), -EACCES); /* no write on a1 */
	CHECK_RC(rename_as(&ROOT, a1, "rd2", a2, "rd", 0), 0);
	CHECK(ino_of(a2, "rd") == rd);
}

/* ---- readdir ---- */

#define BIG_N 20000
#define BIG_ADDED 300

struct listing {
	int seen[BIG_N];
	int added[BIG_ADDED];
	int bad;	     /* entries with an unexpected name or type */
	uint32_t n;	     /* entries in this call */
	uint32_t stop_after; /* the callback says "full" after this many (0: never) */
	uint64_t last_cookie;
	char last_name[STK_NAME_MAX + 1];
};

static int collect(void *ctx, const struct stk_msg_dirent *d)
{
	struct listing *l = ctx;
	unsigned idx;
	char tail;

	if (l->stop_after && l->n == l->stop_after)
		return 1;
	if (sscanf(d->name, "f%5u%c", &idx, &tail) == 1 && idx < BIG_N)
		l->seen[idx]++;
	else if (sscanf(d->name, "n%5u%c", &idx, &tail) == 1 && idx < BIG_ADDED)
		l->added[idx]++;
	else
		l->bad++;
	if (d->mode != S_IFREG || d->ino == 0 || d->next_cookie == 0)
		l->bad++;
	l->n++;
	l->last_cookie = d->next_cookie;
	snprintf(l->last_name, sizeof(l->last_name), "%s", d->name);
	return 0;
}

static void big_name(char *buf, size_t len, char prefix, unsigned i)
{
	snprintf(buf, len, "%c%05u", prefix, i);
}

static uint64_t big_fill(void)
{
	uint64_t d = mkdir_as(&ROOT, STK_ROOT_INO, "big", 0755);
	char name[16];

	for (unsigned i = 0; i < BIG_N; i++) {
		big_name(name, sizeof(name), 'f', i);
		create_as(&ROOT, d, name);
	}
	return d;
}

/* Lists d to the end from cookie, 1000 entries per call. Returns the number of calls. */
static int big_list_rest(uint64_t d, uint64_t cookie, struct listing *l)
{
	int calls = 0, eof = 0;

	while (!eof && calls < 1000) {
		l->n = 0;
		CHECK_RC(stk_meta_store_readdir(st, &ROOT, d, cookie, 1000, collect, l, &eof), 0);
		CHECK(l->n <= 1000);
		CHECK(eof || l->n == 1000);
		cookie = l->last_cookie;
		calls++;
	}
	CHECK(eof);
	return calls;
}

static void test_readdir_big(struct listing *l, uint64_t *dir_out)
{
	static char removed_unseen[BIG_N];
	uint64_t d = big_fill(), cookie;
	unsigned removed = 0, nrm_seen = 0;
	char name[16];
	struct stk_attr a;
	int eof;

	*dir_out = d;
	memset(l, 0, sizeof(*l));
	memset(removed_unseen, 0, sizeof(removed_unseen));
	CHECK_RC(stk_meta_store_readdir(st, &ROOT, d, 0, 1000, collect, l, &eof), 0);
	CHECK(l->n == 1000 && !eof);
	cookie = l->last_cookie;

	/* the entry the listing resumes after goes first, then more on both sides */
	CHECK_RC(stk_meta_store_unlink(st, &ROOT, d, l->last_name, &a), 0);
	for (unsigned i = 0; i < BIG_N && (removed < 500 || nrm_seen < 500); i++) {
		big_name(name, sizeof(name), 'f', i);
		if (l->seen[i] && nrm_seen < 500 && strcmp(name, l->last_name) != 0) {
			CHECK_RC(stk_meta_store_unlink(st, &ROOT, d, name, &a), 0);
			nrm_seen++;
		} else if (!l->seen[i] && removed < 500) {
			CHECK_RC(stk_meta_store_unlink(st, &ROOT, d, name, &a), 0);
			removed_unseen[i] = 1;
			removed++;
		}
	}
	for (unsigned i = 0; i < BIG_ADDED; i++) {
		big_name(name, sizeof(name), 'n', i);
		create_as(&ROOT, d, name);
	}
	CHECK(big_list_rest(d, cookie, l) >= 18);

	for (unsigned i = 0; i < BIG_N; i++) {
		if (removed_unseen[i])
			CHECK(l->seen[i] == 0);
		else
			CHECK(l->seen[i] == 1);
	}
	for (unsigned i = 0; i < BIG_ADDED; i++)
		CHECK(l->added[i] <= 1);
	CHECK(l->bad == 0);

	/* a full listing now sees exactly what is there */
	memset(l, 0, sizeof(*l));
	big_list_rest(d, 0, l);
	for (unsigned i = 0; i < BIG_N; i++) {
		big_name(name, sizeof(name), 'f', i);
		CHECK(l->seen[i] == (ino_of(d, name) != 0));
	}
	for (unsigned i = 0; i < BIG_ADDED; i++)
		CHECK(l->added[i] == 1);
	CHECK(l->bad == 0);
}

static void test_readdir_small(void)
{
	static struct listing l;
	uint64_t d = mkdir_as(&ROOT, STK_ROOT_INO, "rd", 0755), f;
	char name[16];
	int eof;

	memset(&l, 0, sizeof(l));
	CHECK_RC(stk_meta_store_readdir(st, &ROOT, d, 0, 10, collect, &l, &eof), 0);
	CHECK(eof && l.n == 0);
	for (unsigned i = 0; i < 25; i++) {
		big_name(name, sizeof(name), 'f', i);
		create_as(&ROOT, d, name);
	}
	/* the callback may stop the listing: that entry is not consumed */
	l.stop_after = 10;
	CHECK_RC(stk_meta_store_readdir(st, &ROOT, d, 0, 0, collect, &l, &eof), 0);
	CHECK(!eof && l.n == 10);
	l.stop_after = 0;
	l.n = 0;
	CHECK_RC(stk_meta_store_readdir(st, &ROOT, d, l.last_cookie, 0, collect, &l, &eof), 0);
	CHECK(eof && l.n == 15);
	for (unsigned i = 0; i < 25; i++)
		CHECK(l.seen[i] == 1);
	/* exactly max entries left: the listing cannot know it ended */
	memset(&l, 0, sizeof(l));
	CHECK_RC(stk_meta_store_readdir(st, &ROOT, d, 0, 25, collect, &l, &eof), 0);
	CHECK(l.n == 25);
	l.n = 0;
	CHECK_RC(stk_meta_store_readdir(st, &ROOT, d, l.last_cookie, 25, collect, &l, &eof), 0);
	CHECK(eof && l.n == 0);
	f = ino_of(d, "f00000");
	CHECK_RC(stk_meta_store_readdir(st, &ROOT, f, 0, 10, collect, &l, &eof), -ENOTDIR);
	CHECK_RC(stk_meta_store_readdir(st, &ROOT, 987654, 0, 10, collect, &l, &eof), -ENOENT);
}

/* ---- concurrency ---- */

#define THREADS 4
#define PER_THREAD 300

struct worker {
	pthread_t tid;
	unsigned id;
	uint64_t dir;
	int errors;
};

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	struct stk_attr a;
	char name[32];
	int created;

	for (unsigned i = 0; i < PER_THREAD; i++) {
		snprintf(name, sizeof(name), "t%u-%u", w->id, i);
		if (stk_meta_store_create(st, &ROOT, w->dir, name, 0644, STK_CREATE_EXCL, NULL,
					  &PL4, &a, &created) ||
		    stk_meta_store_lookup(st, &ROOT, w->dir, name, &a))
			w->errors++;
		snprintf(name, sizeof(name), "d%u-%u", w->id, i);
		if (i % 10 == 0 && stk_meta_store_mkdir(st, &ROOT, w->dir, name, 0755, &a))
			w->errors++;
	}
	return NULL;
}

static void test_threads(void)
{
	struct worker w[THREADS];
	uint64_t d = mkdir_as(&ROOT, STK_ROOT_INO, "thr", 0755), files0, files1;

	CHECK_RC(stk_meta_store_statfs(st, &files0), 0);
	for (unsigned i = 0; i < THREADS; i++) {
		w[i].id = i;
		w[i].dir = d;
		w[i].errors = 0;
		CHECK(pthread_create(&w[i].tid, NULL, worker_main, &w[i]) == 0);
	}
	for (unsigned i = 0; i < THREADS; i++) {
		pthread_join(w[i].tid, NULL);
		CHECK(w[i].errors == 0);
	}
	CHECK_RC(stk_meta_store_statfs(st, &files1), 0);
	CHECK(files1 == files0 + THREADS * (PER_THREAD + PER_THREAD / 10));
	CHECK(attr_of(d).nlink == 2 + THREADS * (PER_THREAD / 10));
}

/* ---- reopen ---- */

static int same_attr(const struct stk_attr *x, const struct stk_attr *y)
{
	return x->ino == y->ino && x->mode == y->mode && x->nlink == y->nlink && x->uid == y->uid &&
	       x->gid == y->gid && x->size == y->size && x->mtime_sec == y->mtime_sec &&
	       x->mtime_nsec == y->mtime_nsec && x->ctime_sec == y->ctime_sec &&
	       x->atime_sec == y->atime_sec && x->blocks == y->blocks &&
	       memcmp(&x->layout, &y->layout, sizeof(x->layout)) == 0;
}

static void test_reopen(uint64_t big, struct listing *l, uint64_t reserved)
{
	uint64_t files0, files1, max_ino = 0, n;
	struct stk_attr root0, big0, lay0, a;
	struct stk_ns_id ns0, ns1;
	char buf[STK_PATH_MAX + 1];
	uint64_t cr = ino_of(STK_ROOT_INO, "cr");

	stk_meta_store_ns_id(st, &ns0);
	CHECK(!stk_ns_id_is_zero(&ns0));
	root0 = attr_of(STK_ROOT_INO);
	big0 = attr_of(big);
	lay0 = attr_of(ino_of(cr, "lay"));
	CHECK_RC(stk_meta_store_symlink(st, &ROOT, cr, "keep", "/some/where", &a), 0);
	max_ino = a.ino;
	CHECK_RC(stk_meta_store_statfs(st, &files0), 0);
	CHECK_RC(stk_meta_store_sync(st), 0);
	stk_meta_store_close(st);
	st = NULL;

	CHECK_RC(open_store(), 0);
	if (!st)
		return;
	stk_meta_store_ns_id(st, &ns1);
	CHECK(stk_ns_id_eq(&ns0, &ns1)); /* a store's identity never changes */
	a = attr_of(STK_ROOT_INO);
	CHECK(same_attr(&a, &root0));
	a = attr_of(big);
	CHECK(same_attr(&a, &big0));
	a = attr_of(ino_of(cr, "lay"));
	CHECK(same_attr(&a, &lay0));
	CHECK_RC(stk_meta_store_readlink(st, &ROOT, ino_of(cr, "keep"), buf, sizeof(buf)), 0);
	CHECK(strcmp(buf, "/some/where") == 0);
	CHECK_RC(stk_meta_store_statfs(st, &files1), 0);
	CHECK(files1 == files0);
	n = create_as(&ROOT, cr, "after_reopen");
	CHECK(n > max_ino && n >= reserved); /* reservations are persisted */
	memset(l, 0, sizeof(*l));
	big_list_rest(big, 0, l);
	CHECK(l->bad == 0 && l->added[0] == 1 && l->added[BIG_ADDED - 1] == 1);
}

/*
 * A store made by a release without identities (here: this one's with the record
 * removed) keeps its namespace and gains an identity on open, which then stays.
 */
static void test_identity_upgrade(void)
{
	struct stk_ns_id before, after, again;
	struct stk_attr root0, a;
	MDB_env *env = NULL;
	MDB_txn *txn = NULL;
	MDB_dbi dbi;
	MDB_val key = {5, (void *)"ns_id"};

	stk_meta_store_ns_id(st, &before);
	root0 = attr_of(STK_ROOT_INO);
	stk_meta_store_close(st);
	st = NULL;
	CHECK(mdb_env_create(&env) == 0);
	mdb_env_set_maxdbs(env, 8);
	mdb_env_set_mapsize(env, 1ull << 30);
	CHECK(mdb_env_open(env, tmpdir, 0, 0600) == 0);
	CHECK(mdb_txn_begin(env, NULL, 0, &txn) == 0);
	CHECK(mdb_dbi_open(txn, "sys", 0, &dbi) == 0);
	CHECK(mdb_del(txn, dbi, &key, NULL) == 0);
	CHECK(mdb_txn_commit(txn) == 0);
	mdb_env_close(env);

	CHECK_RC(open_store(), 0);
	if (!st)
		return;
	stk_meta_store_ns_id(st, &after);
	CHECK(!stk_ns_id_is_zero(&after) && !stk_ns_id_eq(&before, &after));
	a = attr_of(STK_ROOT_INO);
	CHECK(same_attr(&a, &root0)); /* the namespace is the same one */
	stk_meta_store_close(st);
	st = NULL;
	CHECK_RC(open_store(), 0);
	if (!st)
		return;
	stk_meta_store_ns_id(st, &again);
	CHECK(stk_ns_id_eq(&after, &again));
}

/*
 * What a delegated folder's holder sends (META_INOS, META_NAMES): numbers reserved
 * are never allocated; a create names one of them and its times; an unlink names
 * the inode it expects. Returns the end of the last reservation, for test_reopen.
 */
static uint64_t test_reserved_inos(void)
{
	struct stk_meta_create_as as = {0};
	struct stk_attr a, dir0, dir1;
	uint64_t d, first = 0, second = 0, plain, sg;
	int created = 0;

	d = mkdir_as(&ROOT, STK_ROOT_INO, "deleg", 0777);
	CHECK_RC(stk_meta_store_reserve_inos(st, 0, &first), -EINVAL);
	CHECK_RC(stk_meta_store_reserve_inos(st, 10, &first), 0);
	CHECK(first > d);
	CHECK_RC(stk_meta_store_reserve_inos(st, 5, &second), 0);
	CHECK(second == first + 10);
	/* an ordinary create skips every reserved number */
	plain = create_as(&ROOT, d, "plain");
	CHECK(plain >= second + 5);

	/* a reserved number, with the client's times: older than the folder's */
	dir0 = attr_of(d);
	as.ino = first + 3;
	as.time_sec = 1000000;
	as.time_nsec = 5;
	memset(&a, 0, sizeof(a));
	CHECK_RC(stk_meta_store_create_as(st, &ALICE, d, "mine", 0640, STK_CREATE_EXCL, NULL, &PL4,
					  &as, &a, &created),
		 0);
	CHECK(created == 1 && a.ino == first + 3 && a.nlink == 1);
	CHECK(a.mode == (S_IFREG | 0640) && a.uid == ALICE.uid && a.gid == ALICE.gid);
	CHECK(a.atime_sec == 1000000 && a.atime_nsec == 5);
	CHECK(a.mtime_sec == 1000000 && a.mtime_nsec == 5);
	CHECK(a.ctime_sec == 1000000 && a.ctime_nsec == 5);
	CHECK(a.layout.nchains == 4 && a.layout.stripe == 4);
	CHECK(ino_of(d, "mine") == first + 3);
	a = attr_of(first + 3);
	CHECK(a.mtime_sec == 1000000 && a.ctime_sec == 1000000);
	/* the folder's times do not go back to the client's */
	dir1 = attr_of(d);
	CHECK(dir1.mtime_sec == dir0.mtime_sec && dir1.mtime_nsec == dir0.mtime_nsec);
	CHECK(dir1.ctime_sec == dir0.ctime_sec && dir1.ctime_nsec == dir0.ctime_nsec);
	CHECK(dir1.nlink == dir0.nlink);

	/* a later time than the folder's becomes the folder's too */
	as.ino = first + 4;
	as.time_sec = dir0.mtime_sec + 1000;
	as.time_nsec = 7;
	CHECK_RC(stk_meta_store_create_as(st, &ROOT, d, "later", 0644, STK_CREATE_EXCL, NULL, &PL4,
					  &as, &a, &created),
		 0);
	dir1 = attr_of(d);
	CHECK(dir1.mtime_sec == as.time_sec && dir1.mtime_nsec == 7);
	CHECK(dir1.ctime_sec == as.time_sec && dir1.ctime_nsec == 7);

	/* a number in use, one never reserved, the root's, a taken name, bad nanoseconds */
	{
		const struct {
			uint64_t ino;
			uint32_t nsec;
			const char *name;
			int rc;
		} bad[] = {
		    {first + 3, 0, "again", -EEXIST},		/* a number in use */
		    {plain, 0, "again", -EEXIST},		/* one meta gave out itself */
		    {plain + 1000, 0, "again", -EINVAL},	/* never reserved */
		    {STK_ROOT_INO, 0, "again", -EINVAL},	/* the root's */
		    {first + 5, 0, "mine", -EEXIST},		/* a taken name */
		    {first + 5, 1000000000u, "again", -EINVAL}, /* bad nanoseconds */
		};

		for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
			as.ino = bad[i].ino;
			as.time_sec = bad[i].nsec ? 1 : 0;
			as.time_nsec = bad[i].nsec;
			CHECK_RC(stk_meta_store_create_as(st, &ROOT, d, bad[i].name, 0644,
							  STK_CREATE_EXCL, NULL, &PL4, &as, &a,
							  &created),
				 bad[i].rc);
		}
	}
	CHECK(ino_of(d, "again") == 0);
	/* no time: now, as an ordinary create */
	as.time_sec = 0;
	as.time_nsec = 0;
	CHECK_RC(stk_meta_store_create_as(st, &ROOT, d, "now", 0644, STK_CREATE_EXCL, NULL, &PL4,
					  &as, &a, &created),
		 0);
	CHECK(a.ino == first + 5 && a.mtime_sec >= dir0.mtime_sec);
	/* the permission checks of a create: BOB may not write in a 0755 folder */
	sg = mkdir_as(&ROOT, d, "sg", 0755);
	as.ino = first + 6;
	CHECK_RC(stk_meta_store_create_as(st, &BOB, sg, "x", 0644, STK_CREATE_EXCL, NULL, &PL4, &as,
					  &a, &created),
		 -EACCES);
	/* and the group of a setgid folder */
	{
		struct stk_meta_sattr sa = {.mode = 02777, .gid = 4000};

		CHECK_RC(setattr_as(&ROOT, sg, STK_SETATTR_MODE | STK_SETATTR_GID, sa), 0);
	}
	CHECK_RC(stk_meta_store_create_as(st, &BOB, sg, "x", 02644, STK_CREATE_EXCL, NULL, &PL4,
					  &as, &a, &created),
		 0);
	CHECK(a.ino == first + 6 && a.gid == 4000 && a.uid == BOB.uid && !(a.mode & S_ISGID));
	/* the number went to one file only: asking again is EEXIST */
	CHECK_RC(stk_meta_store_create_as(st, &BOB, sg, "y", 0644, STK_CREATE_EXCL, NULL, &PL4, &as,
					  &a, &created),
		 -EEXIST);

	/* an unlink that names the inode it expects */
	CHECK_RC(stk_meta_store_unlink_ino(st, &ROOT, d, "mine", first + 4, &a), -ENOENT);
	CHECK(ino_of(d, "mine") == first + 3);
	CHECK_RC(stk_meta_store_unlink_ino(st, &ROOT, d, "mine", first + 3, &a), 0);
	CHECK(a.ino == first + 3 && a.nlink == 0);
	CHECK(ino_of(d, "mine") == 0);
	CHECK_RC(stk_meta_store_unlink_ino(st, &ROOT, d, "later", STK_META_ANY_INO, &a), 0);
	CHECK_RC(stk_meta_store_unlink_ino(st, &ROOT, d, "gone", first + 4, &a), -ENOENT);
	/* a number whose file is gone is still not handed out by an ordinary create */
	CHECK(create_as(&ROOT, d, "plain2") > plain);
	return second + 5;
}

/* Extended attributes: flags, sizes, namespaces and permissions, removal with the inode. */
static void test_xattrs(void)
{
	uint64_t d = mkdir_as(&ROOT, STK_ROOT_INO, "xd", 0777);
	uint64_t f = create_as(&ALICE, d, "xf");
	char buf[STK_XATTR_SIZE_MAX + 1], name[STK_NAME_MAX + 2];
	struct stk_attr a, b;
	size_t len = 0;
	uint64_t s;

	a = attr_of(f);
	CHECK_RC(stk_meta_store_setxattr(st, &ALICE, f, "user.k", "v1", 2, 0), 0);
	b = attr_of(f);
	CHECK(b.ctime_sec > a.ctime_sec || (b.ctime_sec == a.ctime_sec && b.ctime_nsec >= a.ctime_nsec));
	CHECK_RC(stk_meta_store_getxattr(st, &ALICE, f, "user.k", NULL, 0, &len), 0);
	CHECK(len == 2);
	CHECK_RC(stk_meta_store_getxattr(st, &ALICE, f, "user.k", buf, 1, &len), -ERANGE);
	CHECK_RC(stk_meta_store_getxattr(st, &ALICE, f, "user.k", buf, sizeof(buf), &len), 0);
	CHECK(len == 2 && memcmp(buf, "v1", 2) == 0);
	CHECK_RC(stk_meta_store_setxattr(st, &ALICE, f, "user.k", "x", 1, STK_XATTR_CREATE),
		 -EEXIST);
	CHECK_RC(stk_meta_store_setxattr(st, &ALICE, f, "user.n", "x", 1, STK_XATTR_REPLACE),
		 -ENODATA);
	CHECK_RC(stk_meta_store_setxattr(st, &ALICE, f, "user.k", "x", 1, 4), -EINVAL);
	CHECK_RC(stk_meta_store_setxattr(st, &ALICE, f, "user.e", NULL, 0, STK_XATTR_CREATE), 0);
	CHECK_RC(stk_meta_store_getxattr(st, &ALICE, f, "user.e", buf, 8, &len), 0);
	CHECK(len == 0);
	CHECK_RC(stk_meta_store_getxattr(st, &ALICE, f, "user.none", buf, 8, &len), -ENODATA);
	CHECK_RC(stk_meta_store_listxattr(st, &ALICE, f, NULL, 0, &len), 0);
	CHECK(len == sizeof("user.e") + sizeof("user.k"));
	CHECK_RC(stk_meta_store_listxattr(st, &ALICE, f, buf, 3, &len), -ERANGE);
	CHECK_RC(stk_meta_store_listxattr(st, &ALICE, f, buf, sizeof(buf), &len), 0);
	CHECK(len == 14 && memcmp(buf, "user.e\0user.k\0", 14) == 0);
	/* limits */
	memset(buf, 'v', sizeof(buf));
	CHECK_RC(stk_meta_store_setxattr(st, &ALICE, f, "user.big", buf, STK_XATTR_SIZE_MAX, 0), 0);
	CHECK_RC(stk_meta_store_setxattr(st, &ALICE, f, "user.big", buf, STK_XATTR_SIZE_MAX + 1, 0),
		 -E2BIG);
	memcpy(name, "user.", 5);
	memset(name + 5, 'n', sizeof(name) - 6);
	name[sizeof(name) - 1] = 0; /* 256 bytes */
	CHECK_RC(stk_meta_store_setxattr(st, &ALICE, f, name, "v", 1, 0), -ERANGE);
	name[sizeof(name) - 2] = 0; /* 255 bytes */
	CHECK_RC(stk_meta_store_setxattr(st, &ALICE, f, name, "v", 1, 0), 0);
	CHECK_RC(stk_meta_store_setxattr(st, &ALICE, f, "", "v", 1, 0), -ERANGE);
	/* namespaces */
	CHECK_RC(stk_meta_store_setxattr(st, &ROOT, f, "system.posix_acl_access", "v", 1, 0),
		 -EOPNOTSUPP);
	CHECK_RC(stk_meta_store_setxattr(st, &ROOT, f, "user.", "v", 1, 0), -EOPNOTSUPP);
	CHECK_RC(stk_meta_store_setxattr(st, &ALICE, f, "trusted.t", "v", 1, 0), -EPERM);
	CHECK_RC(stk_meta_store_setxattr(st, &ROOT, f, "trusted.t", "v", 1, 0), 0);
	CHECK_RC(stk_meta_store_getxattr(st, &ALICE, f, "trusted.t", buf, 8, &len), -ENODATA);
	CHECK_RC(stk_meta_store_getxattr(st, &ROOT, f, "trusted.t", buf, 8, &len), 0);
	CHECK_RC(stk_meta_store_listxattr(st, &ALICE, f, NULL, 0, &len), 0);
	CHECK_RC(stk_meta_store_listxattr(st, &ROOT, f, NULL, 0, &s), 0);
	CHECK(s == len + sizeof("trusted.t"));
	CHECK_RC(stk_meta_store_setxattr(st, &ALICE, f, "security.s", "v", 1, 0), -EPERM);
	CHECK_RC(stk_meta_store_setxattr(st, &ROOT, f, "security.s", "v", 1, 0), 0);
	CHECK_RC(stk_meta_store_getxattr(st, &BOB, f, "security.s", buf, 8, &len), 0);
	/* user.*: read permission to get, write to set (the file is 0644 Alice's) */
	CHECK_RC(stk_meta_store_getxattr(st, &BOB, f, "user.k", buf, 8, &len), 0);
	CHECK_RC(stk_meta_store_setxattr(st, &BOB, f, "user.k", "b", 1, 0), -EACCES);
	CHECK_RC(stk_meta_store_removexattr(st, &BOB, f, "user.k"), -EACCES);
	/* symlinks have no user.* attributes */
	CHECK_RC(stk_meta_store_symlink(st, &ROOT, d, "xl", "xf", &a), 0);
	CHECK_RC(stk_meta_store_setxattr(st, &ROOT, a.ino, "user.k", "v", 1, 0), -EPERM);
	CHECK_RC(stk_meta_store_getxattr(st, &ROOT, a.ino, "user.k", buf, 8, &len), -ENODATA);
	/* removal, and all of them go with the inode */
	CHECK_RC(stk_meta_store_removexattr(st, &ALICE, f, "user.k"), 0);
	CHECK_RC(stk_meta_store_removexattr(st, &ALICE, f, "user.k"), -ENODATA);
	CHECK_RC(stk_meta_store_unlink(st, &ROOT, d, "xf", &a), 0);
	CHECK(a.nlink == 0);
	CHECK_RC(stk_meta_store_listxattr(st, &ROOT, f, NULL, 0, &len), -ENOENT);
	f = create_as(&ROOT, d, "xf2");
	CHECK_RC(stk_meta_store_setxattr(st, &ROOT, f, "user.d", "v", 1, 0), 0);
	CHECK_RC(stk_meta_store_setxattr(st, &ROOT, d, "user.d", "v", 1, 0), 0);
	CHECK_RC(stk_meta_store_unlink(st, &ROOT, d, "xf2", &a), 0);
	CHECK_RC(stk_meta_store_unlink(st, &ROOT, d, "xl", &a), 0);
	CHECK_RC(stk_meta_store_rmdir(st, &ROOT, STK_ROOT_INO, "xd"), 0);
	CHECK_RC(stk_meta_store_getxattr(st, &ROOT, d, "user.d", buf, 8, &len), -ENOENT);
}

/*
 * A batch: its operations are children of one transaction; a failed one undoes
 * itself alone, the rest are committed together; a batch ended with an error
 * leaves nothing; reads in it see its own changes.
 */
static void test_batch(void)
{
	uint64_t d = mkdir_as(&ROOT, STK_ROOT_INO, "batch", 0755), f;
	struct stk_attr a;
	int created = 0;

	CHECK(create_as(&ROOT, d, "before") != 0);
	CHECK_RC(stk_meta_store_batch_begin(st), 0);
	CHECK_RC(stk_meta_store_batch_begin(st), -EBUSY);
	f = create_as(&ROOT, d, "one");
	CHECK(f != 0 && ino_of(d, "one") == f);
	CHECK_RC(stk_meta_store_create(st, &ROOT, d, "before", 0644, STK_CREATE_EXCL, NULL, &PL4, &a,
				       &created),
		 -EEXIST);
	CHECK_RC(stk_meta_store_unlink(st, &ROOT, d, "before", &a), 0);
	CHECK_RC(stk_meta_store_unlink(st, &ROOT, d, "nothere", &a), -ENOENT);
	CHECK_RC(stk_meta_store_batch_end(st, 0), 0);
	CHECK(ino_of(d, "one") == f && ino_of(d, "before") == 0);

	CHECK_RC(stk_meta_store_batch_begin(st), 0);
	CHECK(create_as(&ROOT, d, "two") != 0);
	CHECK_RC(stk_meta_store_batch_end(st, -EIO), -EIO);
	CHECK(ino_of(d, "two") == 0);
	CHECK_RC(stk_meta_store_batch_end(st, 0), -EINVAL);
}

/* ---- quotas ---- */

static struct stk_meta_quota quota_of(uint64_t ino)
{
	struct stk_meta_quota q;

	memset(&q, 0, sizeof(q));
	CHECK_RC(stk_meta_store_quota_get(st, ino, &q), 0);
	return q;
}

static uint64_t hook_open_ino; /* the file the open hook says a session holds */

static int hook_open(void *ctx, uint64_t ino)
{
	(void)ctx;
	return ino == hook_open_ino;
}

static int symlink_in(uint64_t parent, const char *name)
{
	struct stk_attr a;

	return stk_meta_store_symlink(st, &ROOT, parent, name, "target", &a);
}

static void grow(uint64_t ino, uint64_t size)
{
	struct stk_attr a;

	CHECK_RC(stk_meta_store_extend(st, &ROOT, ino, size, 0, 0, &a), 0);
}

/* Inodes: a limit refuses what passes it; what is freed comes back. */
static void test_quota_inodes(void)
{
	struct stk_meta_quota q;
	struct stk_attr a;
	uint64_t d, f, g;
	int created;

	d = mkdir_as(&ROOT, STK_ROOT_INO, "qi", 0777);
	f = create_as(&ROOT, d, "f");
	grow(f, 1000);
	/* Bad input: not root, not a folder, unknown flags. */
	CHECK_RC(stk_meta_store_quota_set(st, &ALICE, d, 0, 4, 0, &q), -EPERM);
	CHECK_RC(stk_meta_store_quota_set(st, &ROOT, f, 0, 4, 0, &q), -ENOTDIR);
	CHECK_RC(stk_meta_store_quota_set(st, &ROOT, d, 0, 4, 0x80, &q), -EINVAL);
	CHECK_RC(stk_meta_store_quota_get(st, f, &q), -ENOENT);
	/* Set on a folder that holds something: counted (the folder itself too). */
	CHECK_RC(stk_meta_store_quota_set(st, &ROOT, d, 0, 4, 0, &q), 0);
	CHECK_EQ(q.used_inodes, 2);
	CHECK_EQ(q.used_bytes, 1000);
	CHECK_EQ(attr_of(f).qid, d);
	CHECK_EQ(attr_of(d).qid, d);
	g = create_as(&ROOT, d, "g");
	CHECK_EQ(attr_of(g).qid, d);
	CHECK_EQ(mkdir_as(&ROOT, d, "sub", 0777) != 0, 1);
	CHECK_EQ(quota_of(d).used_inodes, 4);
	CHECK_RC(stk_meta_store_create(st, &ROOT, d, "h", 0644, STK_CREATE_EXCL, &ZERO_LAYOUT, &PL4,
				       &a, &created),
		 -EDQUOT);
	CHECK_RC(stk_meta_store_mkdir(st, &ROOT, d, "d2", 0777, &a), -EDQUOT);
	CHECK_RC(symlink_in(d, "l"), -EDQUOT);
	CHECK_EQ(ino_of(d, "h"), 0);
	/* An existing name is found without counting anything. */
	CHECK_RC(stk_meta_store_create(st, &ROOT, d, "g", 0644, 0, &ZERO_LAYOUT, &PL4, &a,
				       &created),
		 0);
	CHECK_EQ(quota_of(d).used_inodes, 4);
	CHECK_RC(stk_meta_store_unlink(st, &ROOT, d, "g", &a), 0);
	CHECK_EQ(quota_of(d).used_inodes, 3);
	CHECK_RC(symlink_in(d, "l"), 0);
	CHECK_EQ(quota_of(d).used_inodes, 4);
	/* Raising only the inode limit keeps the byte limit (none). */
	CHECK_RC(stk_meta_store_quota_set(st, &ROOT, d, 0, 100, STK_QUOTA_KEEP_BYTES, &q), 0);
	CHECK_EQ(q.limit_inodes, 100);
	CHECK_EQ(q.limit_bytes, 0);
	CHECK_EQ(q.used_inodes, 4);
	/* An unlinked file a session holds counts until it is dropped. */
	stk_meta_store_set_open_hook(st, hook_open, NULL);
	hook_open_ino = f;
	CHECK_RC(stk_meta_store_unlink(st, &ROOT, d, "f", &a), 0);
	CHECK_EQ(quota_of(d).used_inodes, 4);
	CHECK_EQ(quota_of(d).used_bytes, 1000);
	CHECK_RC(stk_meta_store_orphan_drop(st, f), 0);
	CHECK_EQ(quota_of(d).used_inodes, 3);
	CHECK_EQ(quota_of(d).used_bytes, 0);
	stk_meta_store_set_open_hook(st, NULL, NULL);
	hook_open_ino = 0;
}

/* Whether ino has a purge record, and its record in *p. */
static int purge_of(uint64_t ino, struct stk_meta_purge *p)
{
	size_t n = 0;

	CHECK_RC(stk_meta_store_purges(st, ino, p, 1, &n), 0);
	return n == 1 && p->ino == ino;
}

/* Every way a regular file's inode goes records its chunks for the purge, and only then. */
static void test_purge(void)
{
	struct stk_meta_purge p;
	struct stk_attr a, fa;
	uint64_t d, f, g, h, k, before, after, done[2];
	int replaced = 0;

	d = mkdir_as(&ROOT, STK_ROOT_INO, "pg", 0777);
	f = create_as(&ROOT, d, "f");
	g = create_as(&ROOT, d, "g");
	h = create_as(&ROOT, d, "h");
	k = create_as(&ROOT, d, "k");
	grow(f, 5000);
	fa = attr_of(f);
	CHECK_RC(stk_meta_store_purge_count(st, &before), 0);
	/* A name that is not the last one: nothing to purge. */
	CHECK_RC(stk_meta_store_link(st, &ROOT, f, d, "f2", &a), 0);
	CHECK_RC(stk_meta_store_unlink(st, &ROOT, d, "f2", &a), 0);
	CHECK_EQ(purge_of(f, &p), 0);
	/* The last unlink: the layout and size, in the same transaction. */
	CHECK_RC(stk_meta_store_unlink(st, &ROOT, d, "f", &a), 0);
	CHECK_EQ(a.nlink, 0);
	CHECK_EQ(purge_of(f, &p), 1);
	CHECK_EQ(p.size, 5000);
	CHECK_EQ(p.layout.chunk_size, fa.layout.chunk_size);
	CHECK_EQ(p.layout.stripe, fa.layout.stripe);
	CHECK_EQ(p.layout.seed, fa.layout.seed);
	CHECK_EQ(p.layout.start, fa.layout.start);
	/* Renamed over: the replaced file goes. */
	CHECK_RC(stk_meta_store_rename(st, &ROOT, d, "h", d, "g", 0, &replaced, &a), 0);
	CHECK_EQ(replaced, 1);
	CHECK_EQ(purge_of(g, &p), 1);
	CHECK_EQ(purge_of(h, &p), 0);
	/* An orphan: only when it is dropped. */
	stk_meta_store_set_open_hook(st, hook_open, NULL);
	hook_open_ino = k;
	CHECK_RC(stk_meta_store_unlink(st, &ROOT, d, "k", &a), 0);
	CHECK_EQ(purge_of(k, &p), 0);
	CHECK_RC(stk_meta_store_orphan_drop(st, k), 0);
	CHECK_EQ(purge_of(k, &p), 1);
	stk_meta_store_set_open_hook(st, NULL, NULL);
	hook_open_ino = 0;
	CHECK_RC(stk_meta_store_purge_count(st, &after), 0);
	CHECK_EQ(after, before + 3);
	/* Done: the records go; one without a record is skipped. */
	done[0] = f;
	done[1] = h;
	CHECK_RC(stk_meta_store_purge_done(st, done, 2), 0);
	CHECK_EQ(purge_of(f, &p), 0);
	CHECK_EQ(purge_of(g, &p), 1);
	CHECK_RC(stk_meta_store_purge_count(st, &after), 0);
	CHECK_EQ(after, before + 2);
	/* Directories, symlinks and special files have no chunks. */
	CHECK_RC(symlink_in(d, "l"), 0);
	CHECK_RC(stk_meta_store_unlink(st, &ROOT, d, "l", &a), 0);
	CHECK_EQ(purge_of(a.ino, &p), 0);
}

/* Bytes: reservations, the sizes that replace them, truncates. */
/*
 * A full map: a freeing that finds no room for its purge record still runs (in
 * the reserve), its purge kept in memory until the purger takes it.
 */
static void test_full_map(void)
{
	static char dir[64];
	static uint8_t pad[16000];
	struct stk_meta_store_opts o = {.size = sizeof(o), .dir = dir, .map_size = 4ull << 20};
	struct stk_meta_store *full = NULL;
	struct stk_meta_purge p[8];
	uint8_t failed[8] = {1};
	uint64_t inos[1000], count = 0, left = 0;
	unsigned n;
	size_t got;
	char name[32];
	int rc = 0;

	if (check_tmpdir(dir, sizeof(dir), "meta-full"))
		return;
	CHECK_RC(stk_meta_store_open(&o, &full), 0);
	if (!full)
		goto out;
	for (n = 0; n < 1000; n++) {
		struct stk_attr a;
		int created = 0;

		snprintf(name, sizeof(name), "f%u", n);
		rc = stk_meta_store_create(full, &ROOT, STK_ROOT_INO, name, 0644, STK_CREATE_EXCL,
					   &ZERO_LAYOUT, &PL4, &a, &created);
		if (rc == 0)
			rc = stk_meta_store_setxattr(full, &ROOT, a.ino, "user.pad", pad,
						     sizeof(pad), 0);
		if (rc)
			break;
		inos[n] = a.ino;
	}
	CHECK_RC(rc, -ENOSPC);
	CHECK(n > 10);
	/* The last pages too, with smaller values, so that no freeing finds room. */
	for (size_t size = 4000; size >= 100; size /= 4)
		for (unsigned i = 0; i < n; i++)
			if (stk_meta_store_setxattr(full, &ROOT, inos[i], "user.top", pad, size, 0))
				break;
	for (unsigned i = 0; i < n; i++) {
		struct stk_attr a;

		snprintf(name, sizeof(name), "f%u", i);
		CHECK_RC(stk_meta_store_unlink(full, &ROOT, STK_ROOT_INO, name, &a), 0);
	}
	/* Each freed file's purge waits: in the table, or in memory for the first ones. */
	CHECK_RC(stk_meta_store_purge_count(full, &count), 0);
	CHECK_EQ(count, n);
	got = stk_meta_store_purges_unrecorded(full, p, 8);
	CHECK(got >= 1);
	CHECK_EQ(p[0].ino, inos[0]);
	CHECK_EQ(p[0].layout.stripe, 4);
	/* The purger settles them: the failed first stays, the others go. */
	stk_meta_store_unrecorded_done(full, got, failed);
	CHECK_RC(stk_meta_store_purge_count(full, &left), 0);
	CHECK_EQ(left, count - (got - 1));
	CHECK_EQ(stk_meta_store_purges_unrecorded(full, p, 8) >= 1, 1);
	CHECK_EQ(p[0].ino, inos[0]);
	/* And the map takes new files again. */
	CHECK_EQ(stk_meta_store_create(full, &ROOT, STK_ROOT_INO, "after", 0644, STK_CREATE_EXCL,
				       &ZERO_LAYOUT, &PL4, &(struct stk_attr){0}, &(int){0}),
		 0);
	stk_meta_store_close(full);
	full = NULL;
out:
	check_rm_rf(dir);
}

/*
 * Opened again and again, a store's file keeps its size (after the first open,
 * which may round it to LMDB's pages): the freeings' reserve past the map is not
 * taken into the map at each open, with a new one allocated past it.
 */
static void test_reopen_keeps_size(void)
{
	static char dir[64];
	struct stk_meta_store_opts o = {.size = sizeof(o), .dir = dir, .map_size = 1ull << 30};
	struct stk_meta_store *s = NULL;
	off_t size_before = 0;
	char path[128];

	if (check_tmpdir(dir, sizeof(dir), "meta-reopen"))
		return;
	snprintf(path, sizeof(path), "%s/data.mdb", dir);
	for (int i = 0; i < 4; i++) {
		struct stat sb0, sb1;

		CHECK_RC(stk_meta_store_open(&o, &s), 0);
		if (!s)
			break;
		CHECK_EQ(stat(path, &sb0), 0);
		stk_meta_store_close(s);
		s = NULL;
		CHECK_EQ(stat(path, &sb1), 0);
		CHECK_EQ(sb1.st_size, sb0.st_size);
		if (i > 1)
			CHECK_EQ(sb0.st_size, size_before);
		size_before = sb0.st_size;
	}
	check_rm_rf(dir);
}

static void test_quota_bytes(void)
{
	struct stk_meta_quota q;
	struct stk_meta_sattr sa;
	uint64_t d, a, b, granted = 0;

	d = mkdir_as(&ROOT, STK_ROOT_INO, "qb", 0777);
	CHECK_RC(stk_meta_store_quota_set(st, &ROOT, d, 4096, 0, 0, &q), 0);
	a = create_as(&ROOT, d, "a");
	b = create_as(&ROOT, d, "b");
	grow(a, 1000);
	CHECK_EQ(quota_of(d).used_bytes, 1000);
	/* Asked for 10000, granted what fits: 4096 in all. */
	CHECK_RC(stk_meta_store_quota_reserve(st, 7, a, 2000, 10000, &granted), 0);
	CHECK_EQ(granted, 4096);
	CHECK_EQ(quota_of(d).reserved_bytes, 3096);
	/* Nothing is left for b. */
	CHECK_RC(stk_meta_store_quota_reserve(st, 8, b, 100, 100, &granted), -EDQUOT);
	/* Within what a holds already: no change. */
	CHECK_RC(stk_meta_store_quota_reserve(st, 7, a, 3000, 3000, &granted), 0);
	CHECK_EQ(granted, 4096);
	/* The size replaces the reservation as it grows. */
	grow(a, 3000);
	q = quota_of(d);
	CHECK_EQ(q.used_bytes, 3000);
	CHECK_EQ(q.reserved_bytes, 1096);
	stk_meta_store_quota_release(st, 7, a);
	CHECK_EQ(quota_of(d).reserved_bytes, 0);
	CHECK_RC(stk_meta_store_quota_reserve(st, 8, b, 100, 200, &granted), 0);
	CHECK_EQ(granted, 200);
	CHECK_EQ(quota_of(d).reserved_bytes, 200);
	stk_meta_store_quota_release_session(st, 8);
	CHECK_EQ(quota_of(d).reserved_bytes, 0);
	/* Truncate gives bytes back; growing by truncate past the limit is refused. */
	memset(&sa, 0, sizeof(sa));
	sa.size = 500;
	CHECK_RC(setattr_as(&ROOT, a, STK_SETATTR_SIZE, sa), 0);
	CHECK_EQ(quota_of(d).used_bytes, 500);
	sa.size = 5000;
	CHECK_RC(setattr_as(&ROOT, a, STK_SETATTR_SIZE, sa), -EDQUOT);
	CHECK_EQ(attr_of(a).size, 500);
	sa.size = 4096;
	CHECK_RC(setattr_as(&ROOT, a, STK_SETATTR_SIZE, sa), 0);
	CHECK_EQ(quota_of(d).used_bytes, 4096);
	/* A file without a byte limit writes freely. */
	CHECK_RC(stk_meta_store_quota_reserve(st, 7, create_as(&ROOT, STK_ROOT_INO, "free"), 1,
					      1, &granted),
		 0);
	CHECK_EQ(granted, UINT64_MAX);
	CHECK_RC(stk_meta_store_quota_reserve(st, 7, d, 1, 1, &granted), -EISDIR);
}

/* One create under a quota by session 7 with a number of its own (write-behind). */
static int create_by(uint64_t session, uint64_t parent, const char *name)
{
	struct stk_meta_create_as as = {.session = session};
	struct stk_attr a;
	int created = 0;

	CHECK_RC(stk_meta_store_reserve_inos(st, 1, &as.ino), 0);
	return stk_meta_store_create_as(st, &ROOT, parent, name, 0644, STK_CREATE_EXCL, NULL, &PL4,
					&as, &a, &created);
}

/*
 * Inode allowances: set aside in every quota of the chain, never past a limit, at
 * most half of what is left; spent by the session's creates unchecked; checked
 * creates see them as used; given back in part, by session, or all at once.
 */
static void test_quota_allowances(void)
{
	struct stk_meta_quota q;
	uint64_t top, sub, d, bytes_only, granted = 0, qid = 0;
	char name[32];

	top = mkdir_as(&ROOT, STK_ROOT_INO, "qa_top", 0777);
	sub = mkdir_as(&ROOT, top, "sub", 0777);
	d = mkdir_as(&ROOT, sub, "d", 0777);
	CHECK_RC(stk_meta_store_quota_set(st, &ROOT, top, 0, 20, 0, &q), 0);  /* 3 used */
	CHECK_RC(stk_meta_store_quota_set(st, &ROOT, sub, 0, 100, 0, &q), 0); /* 2 used */
	/* bad input */
	CHECK_RC(stk_meta_store_quota_allow(st, 0, d, 4, &granted, &qid), -EINVAL);
	CHECK_RC(stk_meta_store_quota_allow(st, 7, d, 0, &granted, &qid), -EINVAL);
	CHECK_RC(stk_meta_store_quota_allow(st, 7, 999999, 4, &granted, &qid), -ENOENT);
	/* the tightest quota (top: 17 left) limits it to half of what is left */
	CHECK_RC(stk_meta_store_quota_allow(st, 7, d, 64, &granted, &qid), 0);
	CHECK(granted == 8 && qid == sub);
	CHECK_EQ(quota_of(top).reserved_inodes, 8);
	CHECK_EQ(quota_of(sub).reserved_inodes, 8);
	CHECK_RC(stk_meta_store_quota_allow(st, 8, d, 64, &granted, &qid), 0);
	CHECK(granted == 4); /* 17 - 8 = 9 left: 4 */
	/* session 7 spends its 8 unchecked; a checked create finds 17 - 12 = 5 left */
	for (int i = 0; i < 8; i++) {
		snprintf(name, sizeof(name), "s7_%d", i);
		CHECK_RC(create_by(7, d, name), 0);
	}
	CHECK_EQ(quota_of(top).used_inodes, 3 + 8);
	CHECK_EQ(quota_of(top).reserved_inodes, 4);
	for (int i = 0; i < 5; i++) {
		snprintf(name, sizeof(name), "plain%d", i);
		create_as(&ROOT, d, name);
	}
	/* 16 used, 4 held by session 8: nothing left for anyone else */
	CHECK_RC(create_by(9, d, "none_left"), -EDQUOT);
	CHECK_RC(create_by(7, d, "spent"), -EDQUOT);
	CHECK_RC(stk_meta_store_quota_allow(st, 7, d, 1, &granted, &qid), -EDQUOT);
	/* session 8 gives 3 back: 3 left, and 1 can be had */
	stk_meta_store_quota_disallow(st, 8, sub, 3);
	CHECK_EQ(quota_of(top).reserved_inodes, 1);
	CHECK_RC(stk_meta_store_quota_allow(st, 7, d, 64, &granted, &qid), 0);
	CHECK(granted == 1);
	/* its session ends: the rest of session 8's goes */
	stk_meta_store_quota_release_session(st, 8);
	CHECK_EQ(quota_of(top).reserved_inodes, 1);
	CHECK_RC(create_by(7, d, "last"), 0);
	CHECK_EQ(quota_of(top).used_inodes, 17);
	CHECK_EQ(quota_of(top).reserved_inodes, 0);
	/* never past the limit: 3 left, 1 granted each time at most */
	CHECK_RC(create_by(9, d, "a"), 0);
	CHECK_RC(create_by(9, d, "b"), 0);
	CHECK_RC(create_by(9, d, "c"), 0);
	CHECK_RC(create_by(9, d, "d"), -EDQUOT);
	CHECK_EQ(quota_of(top).used_inodes, 20);
	CHECK_EQ(quota_of(sub).used_inodes, 2 + 8 + 5 + 1 + 3);
	/* a quota without an inode limit sets nothing aside */
	bytes_only = mkdir_as(&ROOT, STK_ROOT_INO, "qa_bytes", 0777);
	CHECK_RC(stk_meta_store_quota_set(st, &ROOT, bytes_only, 1 << 20, 0, 0, &q), 0);
	CHECK_RC(stk_meta_store_quota_allow(st, 7, bytes_only, 64, &granted, &qid), 0);
	CHECK(granted == 64 && qid == bytes_only);
	CHECK_EQ(quota_of(bytes_only).reserved_inodes, 0);
	/* removing the quota leaves an allowance holding nothing */
	CHECK_RC(stk_meta_store_quota_allow(st, 7, d, 64, &granted, &qid), -EDQUOT);
	CHECK_RC(stk_meta_store_quota_rm(st, &ROOT, top), 0);
	CHECK_RC(stk_meta_store_quota_allow(st, 7, d, 64, &granted, &qid), 0);
	CHECK(granted == 40); /* sub: 100 - 19 = 81 left: 40 */
	CHECK_RC(stk_meta_store_quota_rm(st, &ROOT, sub), 0);
	stk_meta_store_quota_release_session(st, 7);
}

/*
 * Byte allowances: counted as reserved in every quota of the chain, at most half
 * of what the tightest limit has left; reservations see them as used; spent by
 * the size reports that name them, never below 0; given back in part or with
 * the session.
 */
static void test_quota_byte_allowances(void)
{
	struct stk_meta_extend x = {.alloc_end = UINT32_MAX};
	struct stk_meta_quota q;
	struct stk_attr a;
	uint64_t top, d, f, g, granted = 0, qid = 0;

	top = mkdir_as(&ROOT, STK_ROOT_INO, "qbytes_top", 0777);
	d = mkdir_as(&ROOT, top, "d", 0777);
	f = create_as(&ROOT, d, "f");
	g = create_as(&ROOT, d, "g");
	CHECK_RC(stk_meta_store_quota_set(st, &ROOT, top, 1000, 0, 0, &q), 0);
	/* bad input */
	CHECK_RC(stk_meta_store_quota_allow_bytes(st, 0, f, 4, &granted, &qid), -EINVAL);
	CHECK_RC(stk_meta_store_quota_allow_bytes(st, 7, f, 0, &granted, &qid), -EINVAL);
	CHECK_RC(stk_meta_store_quota_allow_bytes(st, 7, 999999, 4, &granted, &qid), -ENOENT);
	/* half of the 1000 left, named by a file */
	CHECK_RC(stk_meta_store_quota_allow_bytes(st, 7, f, 4096, &granted, &qid), 0);
	CHECK(granted == 500 && qid == top);
	CHECK_EQ(quota_of(top).reserved_bytes, 500);
	/* a reservation finds 500 left, not more */
	CHECK_RC(stk_meta_store_quota_reserve(st, 9, g, 501, 501, &granted), -EDQUOT);
	/* session 7 reports 300 bytes of f, spending 300 of its 500 */
	x.size = 300;
	x.allow_session = 7;
	x.allow_spent = 300;
	CHECK_RC(stk_meta_store_extend_alloc(st, &ROOT, f, &x, &a), 0);
	CHECK_EQ(quota_of(top).used_bytes, 300);
	CHECK_EQ(quota_of(top).reserved_bytes, 200);
	/* session 8, named by the folder: half of the 500 left */
	CHECK_RC(stk_meta_store_quota_allow_bytes(st, 8, d, 4096, &granted, &qid), 0);
	CHECK(granted == 250);
	stk_meta_store_quota_disallow_bytes(st, 8, top, 50);
	CHECK_EQ(quota_of(top).reserved_bytes, 400);
	stk_meta_store_quota_release_session(st, 8);
	CHECK_EQ(quota_of(top).reserved_bytes, 200);
	/* a report spending more than is held takes what is held */
	x.size = 600;
	x.allow_spent = 1000;
	CHECK_RC(stk_meta_store_extend_alloc(st, &ROOT, f, &x, &a), 0);
	CHECK_EQ(quota_of(top).used_bytes, 600);
	CHECK_EQ(quota_of(top).reserved_bytes, 0);
	/* one without a session spends nothing: session 7's next grant stays */
	CHECK_RC(stk_meta_store_quota_allow_bytes(st, 7, f, 100, &granted, &qid), 0);
	CHECK(granted == 100);
	x.size = 650;
	x.allow_session = 0;
	CHECK_RC(stk_meta_store_extend_alloc(st, &ROOT, f, &x, &a), 0);
	CHECK_EQ(quota_of(top).reserved_bytes, 100);
	stk_meta_store_quota_release_session(st, 7);
	CHECK_EQ(quota_of(top).reserved_bytes, 0);
	CHECK_RC(stk_meta_store_quota_rm(st, &ROOT, top), 0);
}

/* Nested quotas all apply; renames and links across quotas follow the rule. */
static void test_quota_nested_rename(void)
{
	struct stk_meta_quota q[8];
	struct stk_attr a;
	uint64_t top, sub, f, g, out;
	size_t n = 0;
	int more = 0, replaced;

	top = mkdir_as(&ROOT, STK_ROOT_INO, "qn", 0777);
	sub = mkdir_as(&ROOT, top, "sub", 0777);
	f = create_as(&ROOT, sub, "f");
	grow(f, 100);
	CHECK_RC(stk_meta_store_quota_set(st, &ROOT, sub, 0, 0, 0, NULL), 0);
	CHECK_RC(stk_meta_store_quota_set(st, &ROOT, top, 0, 4, 0, q), 0);
	/* top holds itself, sub and f: sub's usage counts in it. */
	CHECK_EQ(q[0].used_inodes, 3);
	CHECK_EQ(q[0].used_bytes, 100);
	CHECK_EQ(quota_of(sub).parent, top);
	g = create_as(&ROOT, sub, "g");
	CHECK_EQ(quota_of(top).used_inodes, 4);
	CHECK_EQ(quota_of(sub).used_inodes, 3);
	/* top is full: a create in sub is refused by it. */
	CHECK_RC(stk_meta_store_create(st, &ROOT, sub, "h", 0644, STK_CREATE_EXCL, &ZERO_LAYOUT,
				       &PL4, &a, &replaced),
		 -EDQUOT);
	/* A file moves out of sub into top: sub gives it up, top keeps it. */
	CHECK_RC(rename_as(&ROOT, sub, "g", top, "g", 0), 0);
	CHECK_EQ(attr_of(g).qid, top);
	CHECK_EQ(quota_of(sub).used_inodes, 2);
	CHECK_EQ(quota_of(top).used_inodes, 4);
	/* Out of every quota. */
	CHECK_RC(rename_as(&ROOT, top, "g", STK_ROOT_INO, "g", 0), 0);
	CHECK_EQ(attr_of(g).qid, 0);
	CHECK_EQ(quota_of(top).used_inodes, 3);
	/* A folder cannot move between quotas (mv copies); within one it can. */
	out = mkdir_as(&ROOT, STK_ROOT_INO, "qn_out", 0777);
	CHECK_RC(rename_as(&ROOT, top, "sub", STK_ROOT_INO, "sub", 0), -EXDEV);
	CHECK_RC(rename_as(&ROOT, STK_ROOT_INO, "qn_out", top, "out", 0), -EXDEV);
	CHECK_RC(rename_as(&ROOT, sub, "f", sub, "f2", 0), 0);
	/* Hard links stay in one quota; a file with two names does not move. */
	CHECK_RC(stk_meta_store_link(st, &ROOT, f, STK_ROOT_INO, "f_link", &a), -EXDEV);
	CHECK_RC(stk_meta_store_link(st, &ROOT, f, sub, "f3", &a), 0);
	CHECK_RC(rename_as(&ROOT, sub, "f3", STK_ROOT_INO, "f3", 0), -EXDEV);
	CHECK_EQ(quota_of(sub).used_inodes, 2);
	/* No room: a file coming in is refused and stays where it was. */
	CHECK_RC(stk_meta_store_quota_set(st, &ROOT, top, 0, 3, 0, NULL), 0);
	CHECK_RC(rename_as(&ROOT, STK_ROOT_INO, "g", sub, "g", 0), -EDQUOT);
	CHECK_EQ(ino_of(STK_ROOT_INO, "g"), g);
	/* Removing top: sub stands alone, top's own files count nowhere. */
	g = create_as(&ROOT, out, "x");
	CHECK_RC(stk_meta_store_quota_rm(st, &ROOT, top), 0);
	CHECK_RC(stk_meta_store_quota_rm(st, &ROOT, top), -ENOENT);
	CHECK_EQ(attr_of(top).qid, 0);
	CHECK_EQ(quota_of(sub).parent, 0);
	CHECK_RC(stk_meta_store_quota_list(st, 0, q, 8, &n, &more), 0);
	for (size_t i = 0; i < n; i++)
		CHECK(q[i].qid != top);
	/* Recount finds nothing to fix where nothing drifted. */
	CHECK_RC(stk_meta_store_quota_recount(st, &ROOT, sub, NULL, NULL), 0);
	CHECK_EQ(quota_of(sub).used_inodes, 2);
	CHECK_EQ(quota_of(sub).used_bytes, 100);
	CHECK_RC(stk_meta_store_quota_recount(st, &ALICE, sub, NULL, NULL), -EPERM);
	CHECK_RC(stk_meta_store_quota_recount(st, &ROOT, top, NULL, NULL), -ENOENT);
	/* rmdir of an empty quota root takes its quota along. */
	CHECK_RC(stk_meta_store_quota_set(st, &ROOT, out, 0, 0, 0, NULL), 0);
	CHECK_RC(stk_meta_store_unlink(st, &ROOT, out, "x", &a), 0);
	CHECK_RC(stk_meta_store_rmdir(st, &ROOT, STK_ROOT_INO, "qn_out"), 0);
	CHECK_RC(stk_meta_store_quota_list(st, 0, q, 8, &n, &more), 0);
	for (size_t i = 0; i < n; i++)
		CHECK(q[i].qid != out);
}

/* Many threads creating and growing files under one quota: usage stays exact. */
struct qthread {
	uint64_t dir;
	int id;
	uint64_t bytes;
	unsigned refused;
};

static void *quota_worker(void *arg)
{
	struct qthread *t = arg;
	char name[32];

	for (int i = 0; i < 200; i++) {
		struct stk_attr a;
		uint64_t granted;
		int created;

		snprintf(name, sizeof(name), "t%d-%d", t->id, i);
		if (stk_meta_store_create(st, &ROOT, t->dir, name, 0644, STK_CREATE_EXCL,
					  &ZERO_LAYOUT, &PL4, &a, &created)) {
			t->refused++;
			continue;
		}
		if (stk_meta_store_quota_reserve(st, (uint64_t)t->id + 100, a.ino, 1000, 1000,
						 &granted) == 0) {
			stk_meta_store_extend(st, &ROOT, a.ino, 1000, 0, 0, &a);
			t->bytes += 1000;
		}
		stk_meta_store_quota_release(st, (uint64_t)t->id + 100, a.ino);
	}
	return NULL;
}

static void test_quota_threads(void)
{
	struct qthread t[4];
	pthread_t th[4];
	uint64_t d, bytes = 0;
	struct stk_meta_quota q;
	unsigned refused = 0;

	d = mkdir_as(&ROOT, STK_ROOT_INO, "qt", 0777);
	CHECK_RC(stk_meta_store_quota_set(st, &ROOT, d, 300000, 701, 0, NULL), 0);
	for (int i = 0; i < 4; i++) {
		t[i] = (struct qthread){.dir = d, .id = i};
		pthread_create(&th[i], NULL, quota_worker, &t[i]);
	}
	for (int i = 0; i < 4; i++) {
		pthread_join(th[i], NULL);
		bytes += t[i].bytes;
		refused += t[i].refused;
	}
	q = quota_of(d);
	CHECK_EQ(q.used_inodes, 701);
	CHECK_EQ(refused, 100);
	CHECK_EQ(q.used_bytes, bytes);
	CHECK_EQ(bytes, 300000);
	CHECK_EQ(q.reserved_bytes, 0);
	CHECK_RC(stk_meta_store_quota_recount(st, &ROOT, d, NULL, NULL), 0);
	q = quota_of(d);
	CHECK_EQ(q.used_inodes, 701);
	CHECK_EQ(q.used_bytes, bytes);
}

/* Every test before left a consistent namespace: fsck finds nothing, and sees it all. */
static void test_fsck_clean(void)
{
	struct stk_meta_fsck_stats fs, fs2;
	struct stk_meta_file fl[4];
	uint64_t files;
	size_t n = 0;

	CHECK_RC(stk_meta_store_fsck(st, 0, NULL, NULL, &fs), 0);
	CHECK_EQ(fs.problems, 0);
	CHECK_RC(stk_meta_store_statfs(st, &files), 0);
	CHECK_EQ(fs.inodes, files);
	CHECK(fs.dirs > 1 && fs.files > 1 && fs.entries >= fs.inodes - 1);
	CHECK(fs.next_ino > fs.inodes);
	/* A repair of a clean namespace changes nothing. */
	CHECK_RC(stk_meta_store_fsck(st, 1, NULL, NULL, &fs2), 0);
	CHECK_EQ(fs2.problems, 0);
	CHECK_EQ(fs2.inodes, fs.inodes);
	CHECK_RC(stk_meta_store_files(st, 0, fl, 4, &n), 0);
	CHECK_EQ(n, 4);
	for (size_t i = 0; i < n; i++)
		CHECK(S_ISREG(fl[i].attr.mode) && (i == 0 || fl[i].attr.ino > fl[i - 1].attr.ino));
}

/*
 * A store made for shard 2 (docs/meta-shards.md): its inode numbers carry the
 * shard in their top bits, it stays shard 2's across a reopen, and a store is
 * never opened for another shard than its own (-EXDEV), shard 1's included.
 */
static void test_shard_numbers(void)
{
	char dir[sizeof(tmpdir) + 16];
	struct stk_meta_store_opts o = {.size = sizeof(o), .map_size = 1ull << 30, .shard = 2};
	struct stk_meta_store *s2 = NULL, *keep = st;
	struct stk_attr a;
	int created = 0;

	snprintf(dir, sizeof(dir), "%s/shard2", tmpdir);
	o.dir = dir;
	CHECK_RC(stk_meta_store_open(&o, &s2), 0);
	if (!s2)
		return;
	CHECK(stk_meta_store_shard(s2) == 2);
	st = s2;
	memset(&a, 0, sizeof(a));
	CHECK_RC(stk_meta_store_create(s2, &ROOT, STK_ROOT_INO, "f", 0644, STK_CREATE_EXCL,
				       &ZERO_LAYOUT, &PL4, &a, &created),
		 0);
	CHECK(stk_ino_shard(a.ino) == 2 && a.ino == (1ull << STK_INO_SHARD_SHIFT));
	CHECK(stk_ino_shard(mkdir_as(&ROOT, STK_ROOT_INO, "d", 0755)) == 2);
	stk_meta_store_close(s2);
	s2 = NULL;
	o.shard = 1;
	CHECK_RC(stk_meta_store_open(&o, &s2), -EXDEV);
	o.shard = 3;
	CHECK_RC(stk_meta_store_open(&o, &s2), -EXDEV);
	o.shard = 2;
	CHECK_RC(stk_meta_store_open(&o, &s2), 0);
	if (s2) {
		st = s2;
		CHECK(ino_of(STK_ROOT_INO, "f") == (1ull << STK_INO_SHARD_SHIFT));
		CHECK(create_as(&ROOT, STK_ROOT_INO, "g") > (1ull << STK_INO_SHARD_SHIFT) + 1);
		stk_meta_store_close(s2);
	}
	st = keep;
	/* the other tests' store is shard 1's, as every store made before shards */
	CHECK(stk_meta_store_shard(st) == 1);
}

/*
 * Client confinement across shards (meta/span.h): the walk up a shard's store
 * stops where a parent pointer (or the inode itself) names another shard's
 * inode, and says which; stk_meta_store_within answers no there, as before.
 */
static void test_climb_stops_at_another_shard(void)
{
	char dir[sizeof(tmpdir) + 16];
	struct stk_meta_store_opts o = {.size = sizeof(o), .map_size = 1ull << 30, .shard = 2};
	struct stk_meta_store *s2 = NULL, *keep = st;
	const uint64_t p1 = 5, other1 = 9; /* folders of shard 1 */
	struct stk_attr d;
	uint64_t f, g, left = 77;

	snprintf(dir, sizeof(dir), "%s/climb2", tmpdir);
	o.dir = dir;
	CHECK_RC(stk_meta_store_open(&o, &s2), 0);
	if (!s2)
		return;
	st = s2;
	/* folder d of shard 2 whose parent is p1 of shard 1, a file in it */
	memset(&d, 0, sizeof(d));
	CHECK_RC(stk_meta_store_xmkdir(s2, 1, 7, p1, "d", 0755, 0, 0, &d), 0);
	CHECK_RC(stk_meta_store_xsettle(s2, 1, 7, 1), 0);
	f = create_as(&ROOT, d.ino, "f");
	g = create_as(&ROOT, mkdir_as(&ROOT, STK_ROOT_INO, "local", 0755), "g");
	CHECK_RC(stk_meta_store_climb(s2, f, p1, &left), 1);
	CHECK(left == 0);
	CHECK_RC(stk_meta_store_climb(s2, f, d.ino, &left), 1);
	CHECK_RC(stk_meta_store_climb(s2, f, other1, &left), 2);
	CHECK(left == p1);
	CHECK_RC(stk_meta_store_climb(s2, d.ino, other1, &left), 2);
	CHECK(left == p1);
	CHECK_RC(stk_meta_store_climb(s2, p1, other1, &left), 2); /* itself another's */
	CHECK(left == p1);
	CHECK_RC(stk_meta_store_within(s2, f, other1), 0);
	CHECK_RC(stk_meta_store_within(s2, f, p1), 1);
	/* up to the root (shard 1's inode 1): outside, not another shard's walk */
	CHECK_RC(stk_meta_store_climb(s2, g, other1, &left), 0);
	CHECK(left == 0);
	CHECK_RC(stk_meta_store_climb(s2, (1ull << STK_INO_SHARD_SHIFT) + 999, other1, &left), 0);
	CHECK_RC(stk_meta_store_climb(s2, f, STK_ROOT_INO, &left), 1);
	stk_meta_store_close(s2);
	st = keep;
}

/*
 * Cross-shard folders (meta/xshard.h): the records of each step on a parent's
 * store (shard 1, st) and a folder's (shard 2), in the order the protocol writes
 * them, and what each answers between steps.
 */
static void test_cross_shard_folders(void)
{
	char dir[sizeof(tmpdir) + 16];
	struct stk_meta_store_opts o = {.size = sizeof(o), .map_size = 1ull << 30, .shard = 2};
	struct stk_meta_store *s2 = NULL;
	struct stk_meta_xintent xi[4];
	struct stk_meta_xmark xm[4];
	struct stk_attr a, b, got;
	uint64_t top, id, id2, id3;
	size_t n = 9;
	int state = 0, created = 0;

	snprintf(dir, sizeof(dir), "%s/xshard2", tmpdir);
	o.dir = dir;
	CHECK_RC(stk_meta_store_open(&o, &s2), 0);
	if (!s2)
		return;
	top = mkdir_as(&ROOT, STK_ROOT_INO, "xs", 0777);
	/* mkdir, step 1: the checks of a mkdir, then the intent */
	CHECK_RC(stk_meta_store_xintent_mkdir(st, &ROOT, top, "x", 1, &id), -EINVAL);
	CHECK_RC(stk_meta_store_xintent_mkdir(st, &BOB, STK_ROOT_INO, "x", 2, &id), -EACCES);
	CHECK_RC(stk_meta_store_xintent_mkdir(st, &ALICE, top, "x", 2, &id), 0);
	CHECK_RC(stk_meta_store_xintents(st, xi, 4, &n), 0);
	CHECK(n == 1 && xi[0].id == id && xi[0].shard == 2 && strcmp(xi[0].name, "x") == 0);
	/* step 2: the folder on shard 2, pending; asked again, the same one */
	memset(&a, 0, sizeof(a));
	CHECK_RC(stk_meta_store_xmkdir(s2, 1, id, top, "x", 0750, ALICE.uid, ALICE.gid, &a), 0);
	CHECK(stk_ino_shard(a.ino) == 2 && S_ISDIR(a.mode) && a.uid == ALICE.uid);
	CHECK_RC(stk_meta_store_xmkdir(s2, 1, id, top, "x", 0750, ALICE.uid, ALICE.gid, &b), 0);
	CHECK(b.ino == a.ino);
	CHECK_RC(stk_meta_store_xmarks(s2, xm, 4, &n), 0);
	CHECK(n == 1 && xm[0].ino == a.ino && xm[0].kind == STK_XMARK_PENDING && xm[0].intent == id);
	CHECK_RC(stk_meta_store_xquery(st, id, top, "x", a.ino, &state), 0);
	CHECK(state == STK_XSTATE_INTENT);
	/* step 3: the entry, and the intent gone, in one transaction */
	CHECK_RC(stk_meta_store_xlink(st, &ALICE, id, &a), 0);
	CHECK_RC(stk_meta_store_xlink(st, &ALICE, id, &a), -ENOENT);
	CHECK_RC(stk_meta_store_xintents(st, xi, 4, &n), 0);
	CHECK(n == 0);
	CHECK_RC(stk_meta_store_lookup(st, &ROOT, top, "x", &got), -EREMOTE);
	CHECK(got.ino == a.ino && S_ISDIR(got.mode));
	CHECK(attr_of(top).nlink == 3);
	CHECK_RC(stk_meta_store_xquery(st, id, top, "x", a.ino, &state), 0);
	CHECK(state == STK_XSTATE_NAMED);
	/* what cannot be done to it here: an unlink, a move, a replace */
	CHECK_RC(stk_meta_store_unlink(st, &ROOT, top, "x", &got), -EISDIR);
	CHECK_RC(rename_as(&ROOT, top, "x", STK_ROOT_INO, "x-moved", 0), -EXDEV);
	create_as(&ROOT, top, "file");
	CHECK_RC(rename_as(&ROOT, top, "file", top, "x", 0), -EXDEV);
	CHECK_RC(rename_as(&ROOT, top, "x", top, "file", 0), -EXDEV);
	/* but a rename within its folder: its entry alone, and it is still known there */
	CHECK_RC(rename_as(&ROOT, top, "x", top, "y", 0), 0);
	CHECK_RC(stk_meta_store_xquery(st, id, top, "x", a.ino, &state), 0);
	CHECK(state == STK_XSTATE_NAMED);
	/* step 4: the mark cleared; the folder is shard 2's for good */
	CHECK_RC(stk_meta_store_xsettle(s2, 1, id, 1), 0);
	CHECK_RC(stk_meta_store_xmarks(s2, xm, 4, &n), 0);
	CHECK(n == 0);
	CHECK_RC(stk_meta_store_getattr(s2, &ROOT, a.ino, &got), 0);
	CHECK_RC(stk_meta_store_create(s2, &ALICE, a.ino, "in", 0644, STK_CREATE_EXCL,
				       &ZERO_LAYOUT, &PL4, &b, &created),
		 0);
	/* rmdir: not empty, then empty; dying takes nothing new; then gone on both */
	CHECK_RC(stk_meta_store_xintent_rmdir(st, &ROOT, top, "y", &a, &id2), 0);
	CHECK_RC(stk_meta_store_xdying(s2, 1, id2, a.ino, "y"), -ENOTEMPTY);
	CHECK_RC(stk_meta_store_unlink(s2, &ROOT, a.ino, "in", &got), 0);
	CHECK_RC(stk_meta_store_xdying(s2, 1, id2, a.ino, "y"), 0);
	CHECK_RC(stk_meta_store_xdying(s2, 1, id2 + 1, a.ino, "y"), -EBUSY);
	CHECK_RC(stk_meta_store_create(s2, &ALICE, a.ino, "late", 0644, STK_CREATE_EXCL,
				       &ZERO_LAYOUT, &PL4, &b, &created),
		 -ENOENT);
	CHECK_RC(stk_meta_store_xunlink(st, id2), 0);
	CHECK_RC(stk_meta_store_lookup(st, &ROOT, top, "y", &got), -ENOENT);
	CHECK(attr_of(top).nlink == 2);
	CHECK_RC(stk_meta_store_xquery(st, id2, top, "y", a.ino, &state), 0);
	CHECK(state == STK_XSTATE_UNNAMED);
	CHECK_RC(stk_meta_store_xsettle(s2, 1, id2, 1), 0);
	CHECK_RC(stk_meta_store_getattr(s2, &ROOT, a.ino, &got), -ENOENT);
	/* given up after step 2: the pending folder goes, the intent with it */
	CHECK_RC(stk_meta_store_xintent_mkdir(st, &ROOT, top, "z", 2, &id3), 0);
	CHECK_RC(stk_meta_store_xmkdir(s2, 1, id3, top, "z", 0755, 0, 0, &b), 0);
	CHECK_RC(stk_meta_store_xsettle(s2, 1, id3, 0), 0);
	CHECK_RC(stk_meta_store_getattr(s2, &ROOT, b.ino, &got), -ENOENT);
	CHECK_RC(stk_meta_store_xintent_drop(st, id3), 0);
	CHECK_RC(stk_meta_store_xintents(st, xi, 4, &n), 0);
	CHECK(n == 0);
	/* hostile steps: a parent of the wrong shard, a bad name */
	CHECK_RC(stk_meta_store_xmkdir(s2, 1, 99, 1ull << STK_INO_SHARD_SHIFT, "w", 0755, 0, 0,
				       &b),
		 -EINVAL);
	CHECK_RC(stk_meta_store_xmkdir(s2, 1, 99, top, "a/b", 0755, 0, 0, &b), -EINVAL);
	/* one entry of a folder of shard 2 left in shard 1's store: fsck leaves it alone */
	CHECK_RC(stk_meta_store_xintent_mkdir(st, &ROOT, top, "kept", 2, &id3), 0);
	CHECK_RC(stk_meta_store_xmkdir(s2, 1, id3, top, "kept", 0755, 0, 0, &b), 0);
	CHECK_RC(stk_meta_store_xlink(st, &ROOT, id3, &b), 0);
	CHECK_RC(stk_meta_store_xsettle(s2, 1, id3, 1), 0);
	stk_meta_store_close(s2);
}

/* fsck of one store: its problem count (-1: it failed). */
static long fsck_problems(struct stk_meta_store *s)
{
	struct stk_meta_fsck_stats fs;

	return stk_meta_store_fsck(s, 0, NULL, NULL, &fs) ? -1 : (long)fs.problems;
}

/*
 * Files renamed across shards (store.h): a file of shard 1 renamed into a folder
 * of shard 2 over a file there, step by step, with fsck clean on both stores
 * between any two steps; its name there unlinked and released at home; a rename
 * given up after step 2 undone; and back home again.
 */
static void test_cross_shard_rename(void)
{
	char dir[sizeof(tmpdir) + 16];
	struct stk_meta_store_opts o = {.size = sizeof(o), .map_size = 1ull << 30, .shard = 2};
	struct stk_meta_store *s2 = NULL;
	struct stk_meta_xrelease rel[4];
	struct stk_meta_xmark xm[4];
	struct stk_meta_xref xr[4];
	struct stk_meta_xrec rr[4];
	struct stk_attr d, moved, old, got, victim;
	uint64_t top, f, g, h, id, id2, id3, sub, next;
	size_t n = 9;
	int state = 0, created = 0, done = 0;

	snprintf(dir, sizeof(dir), "%s/xrename2", tmpdir);
	o.dir = dir;
	CHECK_RC(stk_meta_store_open(&o, &s2), 0);
	if (!s2)
		return;
	top = mkdir_as(&ROOT, STK_ROOT_INO, "xr", 0777);
	sub = mkdir_as(&ROOT, top, "sub", 0777);
	/* d: a folder of shard 2 named in top */
	CHECK_RC(stk_meta_store_xintent_mkdir(st, &ROOT, top, "d", 2, &id), 0);
	CHECK_RC(stk_meta_store_xmkdir(s2, 1, id, top, "d", 0777, 0, 0, &d), 0);
	CHECK_RC(stk_meta_store_xlink(st, &ROOT, id, &d), 0);
	CHECK_RC(stk_meta_store_xsettle(s2, 1, id, 1), 0);
	f = create_as(&ALICE, top, "f");
	CHECK_RC(stk_meta_store_create(s2, &ALICE, d.ino, "f", 0644, STK_CREATE_EXCL, &ZERO_LAYOUT,
				       &PL4, &victim, &created),
		 0);
	/* step 1: what is not built is EXDEV; a file's intent */
	CHECK_RC(stk_meta_store_xintent_rename(st, &ALICE, top, "f", 1, 0, &moved, &id), -EINVAL);
	CHECK_RC(stk_meta_store_xintent_rename(st, &ALICE, top, "f", 2, STK_RENAME_EXCHANGE, &moved,
					       &id),
		 -EXDEV);
	CHECK_RC(stk_meta_store_xintent_rename(st, &ALICE, top, "sub", 2, 0, &moved, &id), -EXDEV);
	CHECK_RC(stk_meta_store_xintent_rename(st, &BOB, top, "nope", 2, 0, &moved, &id), -ENOENT);
	CHECK_RC(stk_meta_store_xintent_rename(st, &ALICE, top, "f", 2, 0, &moved, &id), 0);
	CHECK(moved.ino == f && S_ISREG(moved.mode));
	CHECK_RC(stk_meta_store_xquery_rename(st, id, f, &state), 0);
	CHECK(state == STK_XSTATE_INTENT);
	/* held until the commit: no other move, unlink or replace of it */
	CHECK_RC(stk_meta_store_xintent_rename(st, &ALICE, top, "f", 2, 0, &moved, &id2), -EBUSY);
	CHECK_RC(stk_meta_store_unlink(st, &ALICE, top, "f", &got), -EBUSY);
	CHECK_RC(rename_as(&ALICE, top, "f", top, "f3", 0), -EBUSY);
	/* step 2: the entry on shard 2 names f, the old file kept by the mark */
	CHECK_RC(stk_meta_store_xrename_in(s2, 1, id, f, S_IFREG, d.ino, "f", ALICE.uid, ALICE.gid, 1,
					   &old),
		 -EEXIST);
	CHECK_RC(stk_meta_store_xrename_in(s2, 1, id, f, S_IFDIR, d.ino, "f", 0, 0, 0, &old),
		 -EINVAL);
	CHECK_RC(stk_meta_store_xrename_in(s2, 1, id, f, S_IFREG, d.ino, "f", ALICE.uid, ALICE.gid, 0,
					   &old),
		 0);
	CHECK(old.ino == victim.ino);
	CHECK_RC(stk_meta_store_xrename_in(s2, 1, id, f, S_IFREG, d.ino, "f", ALICE.uid, ALICE.gid, 0,
					   &old),
		 0); /* asked again */
	CHECK_RC(stk_meta_store_xrename_in(s2, 1, id + 50, f, S_IFREG, d.ino, "g", 0, 0, 0, &old),
		 -EBUSY);
	CHECK_RC(stk_meta_store_lookup(s2, &ROOT, d.ino, "f", &got), -EREMOTE);
	CHECK(got.ino == f && S_ISREG(got.mode));
	CHECK_RC(stk_meta_store_unlink(s2, &ROOT, d.ino, "f", &got), -EBUSY);
	CHECK_RC(stk_meta_store_xmarks(s2, xm, 4, &n), 0);
	CHECK(n == 1 && xm[0].kind == STK_XMARK_RENAME && xm[0].ino == f &&
	      xm[0].old_ino == victim.ino && xm[0].parent == d.ino);
	CHECK_EQ(fsck_problems(st), 0);
	CHECK_EQ(fsck_problems(s2), 0);
	/* fsck's lists: the new name, covered by the mark, no record of it yet */
	CHECK_RC(stk_meta_store_fsck_xnames(s2, NULL, xr, 4, &n, &done), 0);
	CHECK(n == 1 && done && xr[0].ino == f && xr[0].parent == d.ino &&
	      strcmp(xr[0].name, "f") == 0 && xr[0].covered == STK_FSCK_XCOVERED);
	CHECK_RC(stk_meta_store_fsck_xentries(s2, NULL, xr, 4, &n, &done), 0);
	CHECK(n == 0); /* folders only */
	CHECK_RC(stk_meta_store_fsck_xrecs(st, 0, rr, 4, &n, &next, &done), 0);
	CHECK(n == 0 && done);
	CHECK_RC(stk_meta_store_fsck_xrestore(s2, f, 1, id), -EBUSY); /* the protocol's */
	/* step 3: the commit; the name off home counts in f's link count */
	CHECK_RC(stk_meta_store_xrename_commit(st, id, d.ino), 0);
	CHECK_RC(stk_meta_store_xrename_commit(st, id, d.ino), -ENOENT);
	CHECK_RC(stk_meta_store_link(st, &ROOT, f, top, "f4", &got), 0); /* not held now */
	CHECK_RC(stk_meta_store_unlink(st, &ROOT, top, "f4", &got), 0);
	CHECK_RC(stk_meta_store_lookup(st, &ROOT, top, "f", &got), -ENOENT);
	CHECK(attr_of(f).nlink == 1);
	CHECK_RC(stk_meta_store_xquery_rename(st, id, f, &state), 0);
	CHECK(state == STK_XSTATE_MOVED);
	CHECK_EQ(fsck_problems(st), 0);
	CHECK_EQ(fsck_problems(s2), 0);
	/* step 4: the old file goes; f is shard 2's to name */
	CHECK_RC(stk_meta_store_xsettle(s2, 1, id, 1), 0);
	CHECK_RC(stk_meta_store_getattr(s2, &ROOT, victim.ino, &got), -ENOENT);
	CHECK_RC(stk_meta_store_xmarks(s2, xm, 4, &n), 0);
	CHECK(n == 0);
	CHECK_EQ(fsck_problems(st), 0);
	CHECK_EQ(fsck_problems(s2), 0);
	/* fsck's lists: the name with its 'R', the home's 'X', both the rename's id */
	CHECK_RC(stk_meta_store_fsck_xnames(s2, NULL, xr, 4, &n, &done), 0);
	CHECK(n == 1 && xr[0].ino == f && xr[0].covered == STK_FSCK_XHAS_R);
	CHECK_RC(stk_meta_store_fsck_xrecs(st, 0, rr, 4, &n, &next, &done), 0);
	CHECK(n == 1 && done && rr[0].kind == 'X' && rr[0].ino == f && rr[0].shard == 2 &&
	      rr[0].id == id && !rr[0].covered);
	CHECK_RC(stk_meta_store_fsck_xrecs(s2, 0, rr, 4, &n, &next, &done), 0);
	CHECK(n == 1 && rr[0].kind == 'R' && rr[0].ino == f && rr[0].shard == 1 && rr[0].id == id);
	CHECK_RC(stk_meta_store_fsck_xrecs(s2, 0, rr, 0, &n, &next, &done), 0);
	CHECK(n == 0 && !done && next == ((uint64_t)'R' << 56 | f)); /* a page of none */
	/* their repairs refuse what is there, or not theirs */
	CHECK_RC(stk_meta_store_fsck_xrestore(st, f, 2, id), -EEXIST);
	CHECK_RC(stk_meta_store_fsck_xrestore(s2, f, 1, id), -EEXIST);
	CHECK_RC(stk_meta_store_fsck_xrestore(s2, f, 2, id), -EINVAL);
	CHECK_RC(stk_meta_store_fsck_xunname(st, f, 2, id + 1, &got), -ESTALE);
	CHECK_RC(stk_meta_store_fsck_xunname(st, f, 3, id, &got), -ESTALE);
	CHECK_RC(stk_meta_store_fsck_xunname(st, f, 1, id, &got), -EINVAL);
	CHECK_RC(stk_meta_store_fsck_xunname(s2, f, 2, id, &got), -EINVAL);
	CHECK_RC(stk_meta_store_fsck_xunname(s2, f, 1, id + 1, &got), -ESTALE);
	CHECK_RC(stk_meta_store_fsck_xunname(s2, f, 1, id, &got), -EEXIST); /* named here */
	CHECK(attr_of(f).nlink == 1);
	/* a second name off home is refused (one at most) */
	CHECK_RC(stk_meta_store_link(st, &ROOT, f, top, "f2", &got), 0);
	CHECK(got.nlink == 2);
	CHECK_RC(stk_meta_store_xintent_rename(st, &ROOT, top, "f2", 2, 0, &moved, &id2), -EXDEV);
	CHECK_RC(stk_meta_store_unlink(st, &ROOT, top, "f2", &got), 0);
	/* renamed within shard 2 (to another folder there), then opened by name there */
	CHECK_RC(stk_meta_store_mkdir(s2, &ROOT, d.ino, "in", 0777, &got), 0);
	CHECK_RC(stk_meta_store_rename(s2, &ROOT, d.ino, "f", got.ino, "f", 0, &created, &old), 0);
	CHECK_RC(stk_meta_store_rename(s2, &ROOT, got.ino, "f", d.ino, "f", 0, &created, &old), 0);
	/* and over a file of shard 2 there, which loses that name */
	CHECK_RC(stk_meta_store_create(s2, &ROOT, d.ino, "over", 0644, STK_CREATE_EXCL,
				       &ZERO_LAYOUT, &PL4, &victim, &created),
		 0);
	CHECK_RC(stk_meta_store_rename(s2, &ROOT, d.ino, "f", d.ino, "over", STK_RENAME_NOREPLACE,
				       &created, &old),
		 -EEXIST);
	CHECK_RC(stk_meta_store_rename(s2, &ROOT, d.ino, "f", d.ino, "over", 0, &created, &old), 0);
	CHECK(created == 1 && old.ino == victim.ino);
	CHECK_RC(stk_meta_store_getattr(s2, &ROOT, victim.ino, &got), -ENOENT);
	CHECK_EQ(fsck_problems(s2), 0);
	CHECK_RC(stk_meta_store_rename(s2, &ROOT, d.ino, "over", d.ino, "f", 0, &created, &old), 0);
	CHECK_RC(stk_meta_store_create(s2, &ROOT, d.ino, "f", 0644, 0, &ZERO_LAYOUT, &PL4, &old,
				       &created),
		 -EREMOTE);
	CHECK(old.ino == f && !created);
	/* unlinked there: a release, told to shard 1, which frees f */
	CHECK_RC(stk_meta_store_unlink(s2, &ROOT, d.ino, "f", &got), 0);
	CHECK(got.ino == f);
	CHECK_RC(stk_meta_store_xreleases(s2, rel, 4, &n), 0);
	CHECK(n == 1 && rel[0].ino == f && rel[0].home == 1 && rel[0].id == id);
	CHECK_EQ(fsck_problems(st), 0);
	CHECK_EQ(fsck_problems(s2), 0);
	CHECK_RC(stk_meta_store_xrelease(st, 2, f, id + 1, &got), 0); /* not its id: nothing */
	CHECK(attr_of(f).nlink == 1);
	CHECK_RC(stk_meta_store_xrelease(st, 2, f, id, &got), 0);
	CHECK(got.nlink == 0);
	CHECK_RC(stk_meta_store_getattr(st, &ROOT, f, &got), -ENOENT);
	CHECK_RC(stk_meta_store_xrelease(st, 2, f, id, &got), 0); /* told again */
	CHECK_RC(stk_meta_store_xrelease_done(s2, f), 0);
	CHECK_RC(stk_meta_store_xreleases(s2, rel, 4, &n), 0);
	CHECK(n == 0);
	/* given up after step 2: the old entry is back, the intent goes */
	g = create_as(&ROOT, top, "g");
	CHECK_RC(stk_meta_store_create(s2, &ROOT, d.ino, "g", 0644, STK_CREATE_EXCL, &ZERO_LAYOUT,
				       &PL4, &victim, &created),
		 0);
	CHECK_RC(stk_meta_store_xintent_rename(st, &ROOT, top, "g", 2, 0, &moved, &id2), 0);
	CHECK_RC(stk_meta_store_xrename_in(s2, 1, id2, g, S_IFREG, d.ino, "g", 0, 0, 0, &old), 0);
	CHECK_RC(stk_meta_store_xsettle(s2, 1, id2, 0), 0);
	CHECK_RC(stk_meta_store_lookup(s2, &ROOT, d.ino, "g", &got), 0);
	CHECK(got.ino == victim.ino);
	CHECK_RC(stk_meta_store_xintent_drop(st, id2), 0);
	CHECK_RC(stk_meta_store_xquery_rename(st, id2, g, &state), 0);
	CHECK(state == STK_XSTATE_STAYED);
	CHECK_RC(rename_as(&ROOT, top, "g", top, "g", 0), 0); /* the hold went with the intent */
	CHECK(ino_of(top, "g") == g && attr_of(g).nlink == 1);
	/* to shard 2 (replacing nothing) and back home over a file of shard 1 */
	CHECK_RC(stk_meta_store_xintent_rename(st, &ROOT, top, "g", 2, 0, &moved, &id2), 0);
	CHECK_RC(stk_meta_store_xrename_in(s2, 1, id2, g, S_IFREG, d.ino, "g2", 0, 0, 0, &old), 0);
	CHECK(old.ino == 0);
	CHECK_RC(stk_meta_store_xrename_commit(st, id2, d.ino), 0);
	CHECK_RC(stk_meta_store_xsettle(s2, 1, id2, 1), 0);
	h = create_as(&ROOT, sub, "h");
	CHECK_RC(stk_meta_store_xintent_rename(s2, &ROOT, d.ino, "g2", 1, 0, &moved, &id3), 0);
	CHECK(moved.ino == g);
	CHECK_RC(stk_meta_store_link(st, &ROOT, g, top, "g-too", &got), 0);
	CHECK_RC(stk_meta_store_xrename_in(st, 2, id3, g, S_IFREG, top, "g-too", 0, 0, 0, &old),
		 -EALREADY); /* two names of one file: nothing to do */
	CHECK_RC(stk_meta_store_unlink(st, &ROOT, top, "g-too", &got), 0);
	CHECK_RC(stk_meta_store_xrename_in(st, 2, id3, g, S_IFREG, sub, "h", 0, 0, 0, &old), 0);
	CHECK(old.ino == h);
	CHECK_EQ(fsck_problems(st), 0);
	CHECK_EQ(fsck_problems(s2), 0);
	CHECK_RC(stk_meta_store_xquery_rename(s2, id3, g, &state), 0);
	CHECK(state == STK_XSTATE_INTENT);
	CHECK_RC(stk_meta_store_xrename_commit(s2, id3, sub), 0);
	CHECK_RC(stk_meta_store_xquery_rename(s2, id3, g, &state), 0);
	CHECK(state == STK_XSTATE_MOVED);
	CHECK_RC(stk_meta_store_xsettle(st, 2, id3, 1), 0);
	CHECK(ino_of(sub, "h") == g && attr_of(g).nlink == 1);
	CHECK_RC(stk_meta_store_getattr(st, &ROOT, h, &got), -ENOENT);
	CHECK_RC(stk_meta_store_lookup(s2, &ROOT, d.ino, "g2", &got), -ENOENT);
	CHECK_EQ(fsck_problems(st), 0);
	CHECK_EQ(fsck_problems(s2), 0);
	CHECK_RC(stk_meta_store_unlink(st, &ROOT, sub, "h", &got), 0);
	CHECK_RC(stk_meta_store_unlink(s2, &ROOT, d.ino, "g", &got), 0);
	stk_meta_store_close(s2);
}

/*
 * Hard links across shards (store.h): a file of shard 1 linked into a folder of
 * shard 2, step by step, fsck clean on both between any two; an undo after step
 * 2; a second name off home refused.
 */
static void test_cross_shard_link(void)
{
	char dir[sizeof(tmpdir) + 16];
	struct stk_meta_store_opts o = {.size = sizeof(o), .map_size = 1ull << 30, .shard = 2};
	struct stk_meta_store *s2 = NULL;
	struct stk_meta_xrelease rel[4];
	struct stk_attr d, got;
	uint64_t top, f, id, id2;
	size_t n = 9;
	int state = 0;

	snprintf(dir, sizeof(dir), "%s/xlink2", tmpdir);
	o.dir = dir;
	CHECK_RC(stk_meta_store_open(&o, &s2), 0);
	if (!s2)
		return;
	top = mkdir_as(&ROOT, STK_ROOT_INO, "xl", 0777);
	CHECK_RC(stk_meta_store_xintent_mkdir(st, &ROOT, top, "d", 2, &id), 0);
	CHECK_RC(stk_meta_store_xmkdir(s2, 1, id, top, "d", 0777, 0, 0, &d), 0);
	CHECK_RC(stk_meta_store_xlink(st, &ROOT, id, &d), 0);
	CHECK_RC(stk_meta_store_xsettle(s2, 1, id, 1), 0);
	f = create_as(&ROOT, top, "f");
	/* step 1 on shard 2: the checks of a link, the intent */
	CHECK_RC(stk_meta_store_xintent_link(s2, &ROOT, d.ino, d.ino, "l", &id), -EINVAL);
	CHECK_RC(stk_meta_store_xintent_link(s2, &BOB, f, d.ino, "a/b", &id), -EINVAL);
	CHECK_RC(stk_meta_store_xintent_link(s2, &ROOT, f, d.ino, "l", &id), 0);
	/* step 2 on shard 1: counted, and its record */
	CHECK_RC(stk_meta_store_xlink_in(st, 2, id, top, d.ino, "l", &got), -EPERM);
	CHECK_RC(stk_meta_store_xlink_in(st, 2, id, f, d.ino, "l", &got), 0);
	CHECK(got.ino == f && got.nlink == 2);
	CHECK_RC(stk_meta_store_xlink_in(st, 2, id, f, d.ino, "l", &got), 0); /* asked again */
	CHECK(attr_of(f).nlink == 2);
	CHECK_RC(stk_meta_store_xlink_in(st, 2, id + 9, f, d.ino, "m", &got), -EBUSY);
	CHECK_RC(stk_meta_store_xquery_link(s2, id, f, &state), 0);
	CHECK(state == STK_XSTATE_INTENT);
	CHECK_EQ(fsck_problems(st), 0);
	CHECK_EQ(fsck_problems(s2), 0);
	/* step 3 on shard 2: the entry, the intent gone */
	CHECK_RC(stk_meta_store_xlink_commit(s2, id, S_IFREG), 0);
	CHECK_RC(stk_meta_store_xlink_commit(s2, id, S_IFREG), -ENOENT);
	CHECK_RC(stk_meta_store_lookup(s2, &ROOT, d.ino, "l", &got), -EREMOTE);
	CHECK(got.ino == f);
	CHECK_RC(stk_meta_store_xquery_link(s2, id, f, &state), 0);
	CHECK(state == STK_XSTATE_MOVED);
	CHECK_RC(stk_meta_store_xsettle(st, 2, id, 1), 0);
	CHECK(attr_of(f).nlink == 2);
	CHECK_EQ(fsck_problems(st), 0);
	CHECK_EQ(fsck_problems(s2), 0);
	/* one name off home at most */
	CHECK_RC(stk_meta_store_xintent_link(s2, &ROOT, f, d.ino, "l2", &id2), -EXDEV);
	CHECK_RC(stk_meta_store_xintent_rename(st, &ROOT, top, "f", 2, 0, &got, &id2), -EXDEV);
	/* the name off home unlinked: released, one link left */
	CHECK_RC(stk_meta_store_unlink(s2, &ROOT, d.ino, "l", &got), 0);
	CHECK_RC(stk_meta_store_xreleases(s2, rel, 4, &n), 0);
	CHECK(n == 1 && rel[0].ino == f && rel[0].id == id);
	CHECK_RC(stk_meta_store_xrelease(st, 2, f, id, &got), 0);
	CHECK(got.nlink == 1 && attr_of(f).nlink == 1);
	CHECK_RC(stk_meta_store_xrelease_done(s2, f), 0);
	/* given up after step 2: the link and its record go */
	CHECK_RC(stk_meta_store_xintent_link(s2, &ROOT, f, d.ino, "l3", &id2), 0);
	CHECK_RC(stk_meta_store_xlink_in(st, 2, id2, f, d.ino, "l3", &got), 0);
	CHECK(attr_of(f).nlink == 2);
	CHECK_RC(stk_meta_store_xsettle(st, 2, id2, 0), 0);
	CHECK(attr_of(f).nlink == 1);
	CHECK_RC(stk_meta_store_xintent_drop(s2, id2), 0);
	CHECK_RC(stk_meta_store_xquery_link(s2, id2, f, &state), 0);
	CHECK(state == STK_XSTATE_STAYED);
	CHECK_EQ(fsck_problems(st), 0);
	CHECK_EQ(fsck_problems(s2), 0);
	CHECK_RC(stk_meta_store_unlink(st, &ROOT, top, "f", &got), 0);
	stk_meta_store_close(s2);
}

/* The refs of xs[0..n) whose parent is `parent`: their count, and ino's one in *x. */
static size_t xrefs_in(const struct stk_meta_xref *xs, size_t n, uint64_t parent, uint64_t ino,
		       const struct stk_meta_xref **x)
{
	size_t k = 0;

	*x = NULL;
	for (size_t i = 0; i < n; i++)
		if (xs[i].parent == parent) {
			k++;
			if (xs[i].ino == ino)
				*x = &xs[i];
		}
	return k;
}

/* fsck's view of folders named across shards: what intents and marks cover, its repair. */
static void test_fsck_cross_shard(void)
{
	char dir[sizeof(tmpdir) + 16];
	struct stk_meta_store_opts o = {.size = sizeof(o), .map_size = 1ull << 30, .shard = 2};
	struct stk_meta_store *s2 = NULL;
	struct stk_meta_xref xs[16];
	const struct stk_meta_xref *x;
	struct stk_attr a, b, got;
	char name[STK_NAME_MAX + 1];
	uint64_t top, idp, idq, next = 0;
	size_t n = 0;
	int done = 0;

	snprintf(dir, sizeof(dir), "%s/xfsck2", tmpdir);
	o.dir = dir;
	CHECK_RC(stk_meta_store_open(&o, &s2), 0);
	if (!s2)
		return;
	top = mkdir_as(&ROOT, STK_ROOT_INO, "xf", 0777);
	/* q: made and settled; p: made on shard 2, pending, its intent held on shard 1 */
	CHECK_RC(stk_meta_store_xintent_mkdir(st, &ROOT, top, "q", 2, &idq), 0);
	CHECK_RC(stk_meta_store_xmkdir(s2, 1, idq, top, "q", 0755, 0, 0, &b), 0);
	CHECK_RC(stk_meta_store_xlink(st, &ROOT, idq, &b), 0);
	CHECK_RC(stk_meta_store_xsettle(s2, 1, idq, 1), 0);
	CHECK_RC(stk_meta_store_xintent_mkdir(st, &ROOT, top, "p", 2, &idp), 0);
	CHECK_RC(stk_meta_store_xmkdir(s2, 1, idp, top, "p", 0755, 0, 0, &a), 0);
	CHECK_RC(stk_meta_store_fsck_xentries(st, NULL, xs, 16, &n, &done), 0);
	CHECK(done && xrefs_in(xs, n, top, b.ino, &x) == 1 && x && x->covered &&
	      strcmp(x->name, "q") == 0);
	CHECK_RC(stk_meta_store_fsck_xdirs(s2, 0, xs, 16, &n, &next, &done), 0);
	CHECK(done && xrefs_in(xs, n, top, a.ino, &x) == 2 && x && x->covered);
	CHECK(xrefs_in(xs, n, top, b.ino, &x) == 2 && x && !x->covered);
	/* an intent in the folder: fsck's repair keeps off it */
	CHECK_RC(stk_meta_store_fsck_xdrop(st, top, b.ino, name), -EBUSY);
	CHECK_RC(stk_meta_store_xlink(st, &ROOT, idp, &a), 0);
	CHECK_RC(stk_meta_store_xsettle(s2, 1, idp, 1), 0);
	CHECK_RC(stk_meta_store_fsck_xentries(st, NULL, xs, 16, &n, &done), 0);
	CHECK(xrefs_in(xs, n, top, a.ino, &x) == 2 && x && !x->covered);
	CHECK_RC(stk_meta_store_fsck_xdirs(s2, 0, xs, 16, &n, &next, &done), 0);
	CHECK(xrefs_in(xs, n, top, a.ino, &x) == 2 && x && !x->covered);
	/* a page at a time: max 1, then after the last one */
	CHECK_RC(stk_meta_store_fsck_xentries(st, NULL, xs, 1, &n, &done), 0);
	CHECK(n == 1 && !done);
	{
		struct stk_meta_xref after = xs[0];
		size_t total = 1;

		while (!done) {
			CHECK_RC(stk_meta_store_fsck_xentries(st, &after, xs, 1, &n, &done), 0);
			if (n == 0)
				break;
			CHECK(xs[0].hash != after.hash || strcmp(xs[0].name, after.name) != 0);
			after = xs[0];
			total++;
		}
		CHECK_RC(stk_meta_store_fsck_xentries(st, NULL, xs, 16, &n, &done), 0);
		CHECK(done && total == n);
	}
	/* the repair: q's entry and its link go; again, nothing is left to drop */
	CHECK(attr_of(top).nlink == 4);
	CHECK_RC(stk_meta_store_fsck_xdrop(st, top, b.ino, name), 0);
	CHECK(strcmp(name, "q") == 0);
	CHECK_RC(stk_meta_store_lookup(st, &ROOT, top, "q", &got), -ENOENT);
	CHECK(attr_of(top).nlink == 3);
	CHECK_RC(stk_meta_store_fsck_xdrop(st, top, b.ino, name), -ENOENT);
	CHECK_RC(stk_meta_store_fsck_xdrop(st, top, top, name), -EINVAL);
	CHECK_RC(stk_meta_store_lookup(st, &ROOT, top, "p", &got), -EREMOTE);
	stk_meta_store_close(s2);
}

/* Drops entry `name` of folder parent from the closed store in dir, as a bug might. */
static void drop_entry(const char *dir, uint64_t parent, const char *name)
{
	MDB_env *env = NULL;
	MDB_txn *txn = NULL;
	MDB_dbi dbi;
	uint8_t k[16 + STK_NAME_MAX];
	size_t len = strlen(name);
	uint64_t h = XXH64(name, len, 0);
	MDB_val key = {16 + len, k};
	int rc;

	h = h == UINT64_MAX ? h - 1 : h;
	for (int i = 0; i < 8; i++) {
		k[i] = (uint8_t)(parent >> (56 - 8 * i));
		k[8 + i] = (uint8_t)(h >> (56 - 8 * i));
	}
	memcpy(k + 16, name, len);
	rc = mdb_env_create(&env);
	if (rc == 0) {
		mdb_env_set_maxdbs(env, 16);
		mdb_env_set_mapsize(env, 1ull << 30);
		rc = mdb_env_open(env, dir, 0, 0600);
	}
	if (rc == 0)
		rc = mdb_txn_begin(env, NULL, 0, &txn);
	if (rc == 0)
		rc = mdb_dbi_open(txn, "dentries", 0, &dbi);
	if (rc == 0)
		rc = mdb_del(txn, dbi, &key, NULL);
	if (txn)
		rc = rc ? (mdb_txn_abort(txn), rc) : mdb_txn_commit(txn);
	CHECK(rc == 0);
	if (env)
		mdb_env_close(env);
}

struct lf_seen {
	uint64_t ino[8];
	uint64_t parent[8];
	uint64_t expect[8];
	char name[8][STK_NAME_MAX + 1];
	int n, kind_ok;
};

static int lf_keep(void *ctx, const struct stk_meta_fsck_problem *p)
{
	struct lf_seen *s = ctx;

	/* the folder that lost a subfolder's entry has a link count too many */
	if (p->kind != STK_FSCK_KIND_UNREACHED)
		s->kind_ok &= p->kind == STK_FSCK_KIND_NLINK;
	else if (s->n < 8) {
		s->ino[s->n] = p->ino;
		s->parent[s->n] = p->parent;
		s->expect[s->n] = p->expect;
		snprintf(s->name[s->n], sizeof(s->name[0]), "%s", p->name);
		s->n++;
	}
	return 0;
}

/*
 * Shard 2's files that no name reaches, gathered into a new folder of shard 2
 * pointing at shard 1's lost+found (lf): only those still unreached, unopened
 * files; nothing eligible, no folder.
 */
static void test_fsck_gather(const struct stk_meta_store_opts *o2, struct stk_meta_store **s2,
			     uint64_t dir, uint64_t lf)
{
	struct stk_meta_store *main_st = st;
	struct stk_meta_xref xs[16];
	const struct stk_meta_xref *x;
	struct stk_attr got;
	uint64_t loose, kept, inos[5], h = 9, next = 0;
	uint8_t done[5];
	char name[STK_NAME_MAX + 1];
	size_t n = 0;
	int ndone = 0, dn = 0;

	st = *s2;
	loose = create_as(&ROOT, dir, "loose");
	kept = create_as(&ROOT, dir, "kept");
	st = main_st;
	CHECK_RC(stk_meta_store_sync(*s2), 0);
	stk_meta_store_close(*s2);
	*s2 = NULL;
	drop_entry(o2->dir, dir, "loose");
	CHECK_RC(stk_meta_store_open(o2, s2), 0);
	if (!*s2)
		return;
	inos[0] = kept;
	inos[1] = loose;
	inos[2] = dir;			/* a folder: not this one's */
	inos[3] = (1ull << 48) + 99999; /* none */
	inos[4] = loose;
	CHECK_RC(stk_meta_store_fsck_gather(st, lf, inos, 5, done, &h), -EINVAL);
	CHECK_RC(stk_meta_store_fsck_gather(*s2, dir, inos, 5, done, &h), -EINVAL);
	CHECK_RC(stk_meta_store_fsck_gather(*s2, lf, inos, 5, done, &h), 0);
	for (int i = 0; i < 5; i++)
		if (done[i]) {
			ndone++;
			CHECK(inos[i] == loose);
		}
	CHECK(ndone == 1 && h && stk_ino_shard(h) == 2);
	snprintf(name, sizeof(name), "#%llu", (unsigned long long)loose);
	CHECK_RC(stk_meta_store_lookup(*s2, &ROOT, h, name, &got), 0);
	CHECK(got.ino == loose && got.nlink == 1);
	CHECK_RC(stk_meta_store_lookup(*s2, &ROOT, dir, "kept", &got), 0);
	/* the folder points at lost+found and waits for its entry there */
	CHECK_RC(stk_meta_store_fsck_xdirs(*s2, 0, xs, 16, &n, &next, &dn), 0);
	CHECK(xrefs_in(xs, n, lf, h, &x) >= 1 && x && !x->covered);
	/* asked again: nothing is unreached any more, no folder */
	inos[0] = loose;
	CHECK_RC(stk_meta_store_fsck_gather(*s2, lf, inos, 1, done, &h), 0);
	CHECK(h == 0 && !done[0]);
}

/*
 * fsck's lost+found: an unreached file and an unreached folder with contents are
 * reported, then reattached as "#INO" under a lost+found made for them, and the
 * namespace is clean after; folders across shards reattached and their parent
 * pointers set, never under a mark, never from a pointer that moved.
 */
static void test_fsck_lostfound(void)
{
	char dir1[sizeof(tmpdir) + 16], dir2[sizeof(tmpdir) + 16], name[STK_NAME_MAX + 1];
	struct stk_meta_store_opts o1 = {.size = sizeof(o1), .map_size = 1ull << 30};
	struct stk_meta_store_opts o2 = {.size = sizeof(o2), .map_size = 1ull << 30, .shard = 2};
	struct stk_meta_store *main_st = st, *s2 = NULL;
	struct stk_meta_fsck_stats fs;
	struct lf_seen seen = {.kind_ok = 1};
	struct stk_attr got, x, y, z;
	uint64_t d, sub, f, f2, lf = 0, lf2 = 0, id;

	snprintf(dir1, sizeof(dir1), "%s/lf1", tmpdir);
	snprintf(dir2, sizeof(dir2), "%s/lf2", tmpdir);
	o1.dir = dir1;
	o2.dir = dir2;
	st = NULL;
	CHECK_RC(stk_meta_store_open(&o1, &st), 0);
	if (!st)
		goto out;
	d = mkdir_as(&ROOT, STK_ROOT_INO, "d", 0755);
	sub = mkdir_as(&ROOT, d, "sub", 0750);
	f = create_as(&ROOT, sub, "in-sub");
	f2 = create_as(&ROOT, d, "f2");
	CHECK_RC(stk_meta_store_sync(st), 0);
	stk_meta_store_close(st);
	st = NULL;
	drop_entry(dir1, d, "sub");
	drop_entry(dir1, d, "f2");
	CHECK_RC(stk_meta_store_open(&o1, &st), 0);
	if (!st)
		goto out;
	/* reported, nothing changed */
	CHECK_RC(stk_meta_store_fsck(st, 0, lf_keep, &seen, &fs), 0);
	CHECK(seen.kind_ok && seen.n == 2 && seen.parent[0] == 0 && seen.parent[1] == 0);
	CHECK_RC(stk_meta_store_lookup(st, &ROOT, STK_ROOT_INO, "lost+found", &got), -ENOENT);
	/*
	 * The file reattached: "#INO" in lost+found, root's, 0700. The folder only
	 * reported (stk_fsck first sees that no entry of another shard names it),
	 * then reattached with what it holds, from the pointer the check saw.
	 */
	memset(&seen, 0, sizeof(seen));
	seen.kind_ok = 1;
	CHECK_RC(stk_meta_store_fsck(st, 1, lf_keep, &seen, &fs), 0);
	CHECK(seen.kind_ok && seen.n == 2 && fs.repaired == 2);
	CHECK_RC(stk_meta_store_lookup(st, &ROOT, STK_ROOT_INO, "lost+found", &got), 0);
	lf = got.ino;
	CHECK(S_ISDIR(got.mode) && (got.mode & 07777) == 0700 && got.uid == 0 && got.gid == 0);
	CHECK(attr_of(lf).nlink == 2);
	for (int i = 0; i < seen.n; i++)
		CHECK(seen.ino[i] == sub ? seen.parent[i] == 0 && seen.expect[i] == d
					 : seen.parent[i] == lf && seen.name[i][0] == '#');
	snprintf(name, sizeof(name), "#%llu", (unsigned long long)f2);
	CHECK_RC(stk_meta_store_lookup(st, &ROOT, lf, name, &got), 0);
	CHECK(got.ino == f2 && got.nlink == 1);
	CHECK_RC(stk_meta_store_fsck_adopt(st, sub, lf, &lf2, name), -ESTALE);
	CHECK_RC(stk_meta_store_fsck_adopt(st, sub, d, &lf2, name), 0);
	CHECK(lf2 == lf && attr_of(lf).nlink == 3);
	CHECK_RC(stk_meta_store_lookup(st, &ROOT, lf, name, &got), 0);
	CHECK(got.ino == sub);
	CHECK(ino_of(sub, "in-sub") == f);
	/* a second look: clean (link counts and parent pointers agree) */
	CHECK_RC(stk_meta_store_fsck(st, 0, NULL, NULL, &fs), 0);
	CHECK_EQ(fs.problems, 0);

	/* across shards: x on shard 2, its parent d on shard 1, named by none */
	CHECK_RC(stk_meta_store_open(&o2, &s2), 0);
	if (!s2)
		goto out;
	CHECK_RC(stk_meta_store_xintent_mkdir(st, &ROOT, d, "x", 2, &id), 0);
	CHECK_RC(stk_meta_store_xmkdir(s2, 1, id, d, "x", 0755, 0, 0, &x), 0);
	CHECK_RC(stk_meta_store_xsettle(s2, 1, id, 1), 0);
	CHECK_RC(stk_meta_store_xintent_mkdir(st, &ROOT, d, "y", 2, &id), 0);
	CHECK_RC(stk_meta_store_xmkdir(s2, 1, id, d, "y", 0755, 0, 0, &y), 0);
	/* y is pending (a mkdir in flight): left alone */
	CHECK_RC(stk_meta_store_fsck_xparent(s2, y.ino, d, lf), -EBUSY);
	CHECK_RC(stk_meta_store_fsck_adopt(s2, 0, 0, &lf2, name), -EXDEV);
	CHECK_RC(stk_meta_store_fsck_adopt(st, 0, 0, &lf2, name), 0);
	CHECK(lf2 == lf && name[0] == 0);
	/* B first: the pointer (only from what fsck saw), then A's entry */
	CHECK_RC(stk_meta_store_fsck_xparent(s2, x.ino, STK_ROOT_INO, lf), -ESTALE);
	CHECK_RC(stk_meta_store_fsck_xparent(s2, x.ino, d, lf), 0);
	CHECK_RC(stk_meta_store_fsck_adopt(st, x.ino, d, &lf2, name), 0);
	CHECK(lf2 == lf && strncmp(name, "#", 1) == 0);
	CHECK_RC(stk_meta_store_lookup(st, &ROOT, lf, name, &got), -EREMOTE);
	CHECK(attr_of(lf).nlink == 4);
	/* asked again (a reply lost): nothing more */
	CHECK_RC(stk_meta_store_fsck_adopt(st, x.ino, d, &lf2, name), 0);
	CHECK(attr_of(lf).nlink == 4);
	CHECK_RC(stk_meta_store_fsck_xparent(s2, f, 0, lf), -EINVAL);
	CHECK_RC(stk_meta_store_fsck_xparent(s2, STK_ROOT_INO, 0, lf), -EINVAL);
	/* z on shard 1, its parent x on shard 2, named by none: reattached in one step */
	CHECK_RC(stk_meta_store_xintent_mkdir(s2, &ROOT, x.ino, "z", 1, &id), 0);
	CHECK_RC(stk_meta_store_xmkdir(st, 2, id, x.ino, "z", 0755, 0, 0, &z), 0);
	CHECK_RC(stk_meta_store_fsck_adopt(st, z.ino, x.ino, &lf2, name), -EBUSY);
	CHECK_RC(stk_meta_store_xsettle(st, 2, id, 1), 0);
	CHECK_RC(stk_meta_store_fsck_adopt(st, z.ino, lf, &lf2, name), -ESTALE);
	CHECK_RC(stk_meta_store_fsck_adopt(st, z.ino, x.ino, &lf2, name), 0);
	CHECK_RC(stk_meta_store_lookup(st, &ROOT, lf, name, &got), 0);
	CHECK(got.ino == z.ino && attr_of(lf).nlink == 5);
	CHECK_RC(stk_meta_store_fsck(st, 0, NULL, NULL, &fs), 0);
	CHECK_EQ(fs.problems, 0);
	/* a file of shard 1 is fsck's own repair's, not this one's */
	CHECK_RC(stk_meta_store_fsck_adopt(st, f, 0, &lf2, name), -ENOTDIR);
	CHECK_RC(stk_meta_store_fsck_adopt(st, STK_ROOT_INO, STK_ROOT_INO, &lf2, name), -EINVAL);
	test_fsck_gather(&o2, &s2, x.ino, lf);
out:
	if (s2)
		stk_meta_store_close(s2);
	if (st)
		stk_meta_store_close(st);
	st = main_st;
}

/*
 * Folders moved across shards (store.h): a folder of shard 1 moved into a folder
 * of shard 2 step by step (held from step 1, its parent pointer at the commit,
 * the done record until step 4), then back over an empty folder of shard 1: once
 * undone after step 2 (the folder replaced named again and usable), once done
 * (it goes). The folder-move lock, and the parent pointers the walk reads.
 */
static void test_cross_shard_fmove(void)
{
	char dir[sizeof(tmpdir) + 16];
	struct stk_meta_store_opts o = {.size = sizeof(o), .map_size = 1ull << 30, .shard = 2};
	struct stk_meta_store *s2 = NULL;
	struct stk_meta_xdone dn[4];
	struct stk_meta_xmark xm[4];
	struct stk_meta_xref xs[4];
	int done = 0;
	struct stk_attr d, moved, got;
	uint64_t top, f, e, id, id2, lid, parent;
	uint32_t holder;
	size_t n = 9;
	int state = 0;

	snprintf(dir, sizeof(dir), "%s/xfmove2", tmpdir);
	o.dir = dir;
	CHECK_RC(stk_meta_store_open(&o, &s2), 0);
	if (!s2)
		return;
	top = mkdir_as(&ROOT, STK_ROOT_INO, "xfmove", 0777);
	f = mkdir_as(&ROOT, top, "f", 0777);
	mkdir_as(&ROOT, f, "s", 0777);
	create_as(&ROOT, top, "file");
	/* d: a folder of shard 2 named in top */
	CHECK_RC(stk_meta_store_xintent_mkdir(st, &ROOT, top, "d", 2, &id), 0);
	CHECK_RC(stk_meta_store_xmkdir(s2, 1, id, top, "d", 0777, 0, 0, &d), 0);
	CHECK_RC(stk_meta_store_xlink(st, &ROOT, id, &d), 0);
	CHECK_RC(stk_meta_store_xsettle(s2, 1, id, 1), 0);
	CHECK(attr_of(top).nlink == 4);
	/* step 1: what is not this path, then the intent; the folder held */
	CHECK_RC(stk_meta_store_xintent_fmove(st, &ROOT, top, "f", d.ino, "m", STK_RENAME_EXCHANGE,
					      &moved, &id),
		 -EXDEV);
	CHECK_RC(stk_meta_store_xintent_fmove(st, &ROOT, top, "file", d.ino, "m", 0, &moved, &id),
		 -EXDEV);
	CHECK_RC(stk_meta_store_xintent_fmove(st, &ROOT, top, "f", top, "file", 0, &moved, &id),
		 -ENOTDIR);
	CHECK_RC(stk_meta_store_xintent_fmove(st, &ROOT, top, "f", d.ino, "m", 0, &moved, &id), 0);
	CHECK(moved.ino == f && S_ISDIR(moved.mode));
	CHECK_RC(stk_meta_store_xintent_fmove(st, &ROOT, top, "f", d.ino, "m", 0, &moved, &id2),
		 -EBUSY);
	CHECK_RC(rename_as(&ROOT, top, "f", top, "f2", 0), -EBUSY);
	CHECK_RC(stk_meta_store_rmdir(st, &ROOT, f, "s"), 0); /* inside: as before */
	CHECK_RC(stk_meta_store_rmdir(st, &ROOT, top, "f"), -EBUSY);
	CHECK_RC(stk_meta_store_xquery_fmove(st, id, &state), 0);
	CHECK(state == STK_XSTATE_INTENT);
	/* step 2: the entry on shard 2, its link count, the mark; asked again: 0 */
	CHECK_RC(stk_meta_store_xfmove_in(s2, 1, id, f, d.ino, "m", 0, 0, 0), 0);
	CHECK_RC(stk_meta_store_xfmove_in(s2, 1, id, f, d.ino, "m", 0, 0, 0), 0);
	CHECK_RC(stk_meta_store_xfmove_in(s2, 1, id + 7, f, d.ino, "m2", 0, 0, 0), -EBUSY);
	CHECK(attr_of_in(s2, d.ino).nlink == 3);
	CHECK_RC(stk_meta_store_xmarks(s2, xm, 4, &n), 0);
	CHECK(n == 1 && xm[0].kind == STK_XMARK_FMOVE && xm[0].ino == f && xm[0].old_ino == 0);
	/* fsck leaves it to the protocol: the new entry covered, the pointer not set */
	CHECK_RC(stk_meta_store_fsck_xentries(s2, NULL, xs, 4, &n, &done), 0);
	CHECK(n == 1 && xs[0].ino == f && xs[0].covered == 1);
	CHECK_RC(stk_meta_store_fsck_xparent(st, f, top, d.ino), -EBUSY);
	/* step 3: the old entry goes, the pointer (its shard's) changes, a done record */
	CHECK_RC(stk_meta_store_xfmove_commit(st, id, d.ino, "m", 0), 0);
	CHECK_RC(stk_meta_store_lookup(st, &ROOT, top, "f", &got), -ENOENT);
	CHECK(attr_of(top).nlink == 3);
	CHECK_RC(stk_meta_store_xparent(st, f, &parent), 0);
	CHECK(parent == d.ino);
	CHECK_RC(stk_meta_store_xquery_fmove(st, id, &state), 0);
	CHECK(state == STK_XSTATE_MOVED);
	CHECK(stk_meta_store_xheld(st, id) == 1);
	CHECK_RC(stk_meta_store_xdones(st, dn, 4, &n), 0);
	CHECK(n == 1 && dn[0].id == id && dn[0].ino == f && dn[0].shard == 2);
	/* step 4: the mark goes; then the done record */
	CHECK_RC(stk_meta_store_xsettle(s2, 1, id, 1), 0);
	CHECK_RC(stk_meta_store_xmarks(s2, xm, 4, &n), 0);
	CHECK(n == 0);
	CHECK_RC(stk_meta_store_xdone_drop(st, id), 0);
	CHECK_RC(stk_meta_store_xquery_fmove(st, id, &state), 0);
	CHECK(state == STK_XSTATE_STAYED);
	CHECK(stk_meta_store_xheld(st, id) == 0);
	CHECK_RC(stk_meta_store_lookup(s2, &ROOT, d.ino, "m", &got), -EREMOTE);
	CHECK(got.ino == f);
	/* back over an empty folder of shard 1 (A = 2, B = C = 1), undone after step 2 */
	e = mkdir_as(&ROOT, top, "e", 0777);
	CHECK_RC(stk_meta_store_xintent_fmove(s2, &ROOT, d.ino, "m", top, "e", 0, &moved, &id2), 0);
	CHECK_RC(stk_meta_store_xfmove_in(st, 2, id2, f, top, "e", 0, 0, 1), -EEXIST);
	CHECK_RC(stk_meta_store_xfmove_in(st, 2, id2, f, top, "file", 0, 0, 0), -ENOTDIR);
	CHECK_RC(stk_meta_store_xfmove_in(st, 2, id2, f, top, "e", 0, 0, 0), 0);
	CHECK(ino_of(top, "e") == f && attr_of(top).nlink == 4);
	CHECK_RC(stk_meta_store_mkdir(st, &ROOT, e, "no", 0777, &got), -ENOENT); /* replaced */
	CHECK_RC(stk_meta_store_xmarks(st, xm, 4, &n), 0);
	CHECK(n == 2); /* the move's, and the folder replaced's */
	CHECK_EQ(fsck_problems(st), 0); /* the folder replaced counts as named until settled */
	CHECK_RC(stk_meta_store_xsettle(st, 2, id2, 0), 0);
	CHECK_RC(stk_meta_store_xmarks(st, xm, 4, &n), 0);
	CHECK(n == 0);
	CHECK_RC(stk_meta_store_xintent_drop(s2, id2), 0);
	CHECK(ino_of(top, "e") == e && attr_of(top).nlink == 4);
	CHECK_RC(stk_meta_store_xparent(st, f, &parent), 0);
	CHECK(parent == d.ino);
	mkdir_as(&ROOT, e, "yes", 0777);
	CHECK_RC(stk_meta_store_xintent_fmove(s2, &ROOT, d.ino, "m", top, "e", 0, &moved, &id2), 0);
	CHECK_RC(stk_meta_store_xfmove_in(st, 2, id2, f, top, "e", 0, 0, 0), -ENOTEMPTY);
	CHECK_RC(stk_meta_store_xintent_drop(s2, id2), 0);
	CHECK_RC(stk_meta_store_rmdir(st, &ROOT, e, "yes"), 0);
	/* and done: the folder replaced goes, the pointer changes at step 4 (its shard B) */
	CHECK_RC(stk_meta_store_xintent_fmove(s2, &ROOT, d.ino, "m", top, "e", 0, &moved, &id2), 0);
	CHECK_RC(stk_meta_store_xfmove_in(st, 2, id2, f, top, "e", 0, 0, 0), 0);
	CHECK_RC(stk_meta_store_xfmove_commit(s2, id2, top, "e", 0), 0);
	CHECK(attr_of_in(s2, d.ino).nlink == 2);
	CHECK_RC(stk_meta_store_xsettle(st, 2, id2, 1), 0);
	CHECK_RC(stk_meta_store_xdone_drop(s2, id2), 0);
	CHECK_RC(stk_meta_store_getattr(st, &ROOT, e, &got), -ENOENT);
	CHECK(ino_of(top, "e") == f && attr_of(top).nlink == 4);
	CHECK_RC(stk_meta_store_xparent(st, f, &parent), 0);
	CHECK(parent == top);
	CHECK_EQ(fsck_problems(st), 0);
	CHECK_EQ(fsck_problems(s2), 0);
	/* the folder-move lock: shard 1's, one holder at a time */
	CHECK_RC(stk_meta_store_xlock(s2, 1, 5, 1), -EINVAL);
	CHECK_RC(stk_meta_store_xlock_get(st, &holder, &lid), -ENOENT);
	CHECK_RC(stk_meta_store_xlock(st, 2, 5, 1), 0);
	CHECK_RC(stk_meta_store_xlock(st, 2, 5, 1), 0);
	CHECK_RC(stk_meta_store_xlock(st, 1, 6, 1), -EBUSY);
	CHECK_RC(stk_meta_store_xlock(st, 1, 6, 0), 0); /* not its: still held */
	CHECK_RC(stk_meta_store_xlock_get(st, &holder, &lid), 0);
	CHECK(holder == 2 && lid == 5);
	CHECK_RC(stk_meta_store_xlock(st, 2, 5, 0), 0);
	CHECK_RC(stk_meta_store_xlock_get(st, &holder, &lid), -ENOENT);
	CHECK_RC(stk_meta_store_xparent(st, ino_of(top, "file"), &parent), -ENOTDIR);
	stk_meta_store_close(s2);
}

int main(void)
{
	static struct listing listing;
	uint64_t big = 0, reserved;

	int rc = check_tmpdir(tmpdir, sizeof(tmpdir), "meta-store");

	if (rc) {
		fprintf(stderr, "no temporary folder: %s\n", strerror(-rc));
		return 77;
	}
	rc = open_store();
	if (rc) {
		fprintf(stderr, "cannot open a store in %s: %s\n", tmpdir, strerror(-rc));
		check_rm_rf(tmpdir);
		return 1;
	}
	CHECK_RUN(test_root);
	CHECK_RUN(test_names);
	CHECK_RUN(test_create);
	CHECK_RUN(test_shard_numbers);
	CHECK_RUN(test_climb_stops_at_another_shard);
	CHECK_RUN(test_mkdir_rmdir);
	CHECK_RUN(test_expect_ino);
	CHECK_RUN(test_link_unlink);
	CHECK_RUN(test_symlink);
	CHECK_RUN(test_setattr_extend);
	CHECK_RUN(test_mknod);
	CHECK_RUN(test_blocks);
	CHECK_RUN(test_setattr_atime_read);
	CHECK_RUN(test_record_reads);
	CHECK_RUN(test_getattrs);
	CHECK_RUN(test_rename);
	CHECK_RUN(test_within);
	CHECK_RUN(test_file_parents_filled);
	CHECK_RUN(test_permissions);
	CHECK_RUN(test_readdir_small);
	CHECK_RUN(test_xattrs);
	CHECK_RUN(test_purge);
	CHECK_RUN(test_full_map);
	CHECK_RUN(test_reopen_keeps_size);
	CHECK_RUN(test_quota_inodes);
	CHECK_RUN(test_quota_bytes);
	CHECK_RUN(test_quota_allowances);
	CHECK_RUN(test_quota_byte_allowances);
	CHECK_RUN(test_quota_nested_rename);
	CHECK_RUN(test_quota_threads);
	CHECK_RUN(test_cross_shard_folders);
	CHECK_RUN(test_fsck_cross_shard);
	CHECK_RUN(test_fsck_lostfound);
	CHECK_RUN(test_cross_shard_rename);
	CHECK_RUN(test_cross_shard_link);
	CHECK_RUN(test_cross_shard_fmove);
	CHECK_RUN(test_fsck_clean);
	reserved = test_reserved_inos();
	CHECK_RUN(test_batch);
	test_readdir_big(&listing, &big);
	CHECK_RUN(test_threads);
	test_reopen(big, &listing, reserved);
	CHECK_RUN(test_format1_records);
	if (st)
		CHECK_RUN(test_identity_upgrade);
	if (st)
		stk_meta_store_close(st);
	check_rm_rf(tmpdir);
	return check_done();
}
