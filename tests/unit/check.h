/*
 * check.h: the helpers every unit test in tests/unit/ shares.
 *
 * A unit test is one small program (liburing's way): it exits 0 when every check
 * passed, 1 when one failed, 77 when it cannot run here (a skip). This header gives
 * it the checks, a way to run its test functions by name, the summary line and the
 * exit status, and a temporary folder, so that no test defines its own.
 *
 *	#include "check.h"
 *
 *	static void test_encode(void)
 *	{
 *		CHECK(stk_thing_encode(&t, buf) == 0);
 *		CHECK_EQ(t.len, 12);
 *		CHECK_RC(stk_thing_decode(buf, 3, &t), -EBADMSG);
 *	}
 *
 *	int main(void)
 *	{
 *		CHECK_RUN(test_encode);
 *		return check_done();
 *	}
 *
 * A failed check prints `file:line:` and what failed on stderr, counts one failure
 * and the test goes on, so that one run shows every failure; REQUIRE is the check
 * that also stops the function it is in, for the steps that depend on it.
 * check_done() prints one summary line and turns the count into the exit status.
 *
 * Everything here is static and only for test programs: include it from one .c
 * file, the test's own. Checks may be made from any thread (the counts are
 * atomic); CHECK_RUN and check_done() are for the main thread.
 */
#ifndef STK_TEST_CHECK_H
#define STK_TEST_CHECK_H

#include <errno.h>
#include <ftw.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Checks made and checks failed so far in this program. */
static int check_total;
static int check_failed;

static inline int check_count_(int ok)
{
	__atomic_fetch_add(&check_total, 1, __ATOMIC_RELAXED);
	if (!ok)
		__atomic_fetch_add(&check_failed, 1, __ATOMIC_RELAXED);
	return ok;
}

__attribute__((format(printf, 3, 0))) static inline void check_vreport_(const char *file, int line,
									const char *fmt, va_list ap)
{
	char msg[1024];

	vsnprintf(msg, sizeof(msg), fmt, ap);
	/* One write per failure, so that lines from several threads do not mix. */
	fprintf(stderr, "%s:%d: %s\n", file, line, msg);
}

__attribute__((format(printf, 3, 4))) static inline void check_report_(const char *file, int line,
								       const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	check_vreport_(file, line, fmt, ap);
	va_end(ap);
}

/* What a -errno code means: "ok" for 0, strerror's text for -errno, "not -errno" above 0. */
static inline const char *check_errstr_(long long rc)
{
	if (rc == 0)
		return "ok";
	if (rc > 0 || rc < -4095)
		return "not -errno";
	return strerror((int)-rc);
}

/*
 * CHECK(cond): counts a failure and prints `file:line: check failed: cond` when cond
 * is false; the test goes on.
 */
#define CHECK(cond)                                                                                \
	do {                                                                                       \
		if (!check_count_(!!(cond)))                                                       \
			check_report_(__FILE__, __LINE__, "check failed: %s", #cond);              \
	} while (0)

/*
 * CHECK_EQ(a, b): a and b, integers, must be equal; a failure prints both values.
 * Both are converted to intmax_t first, so the comparison is of their values (an
 * unsigned -1 is not -1) and each side is evaluated once.
 */
#define CHECK_EQ(a, b)                                                                             \
	do {                                                                                       \
		intmax_t a_ = (intmax_t)(a), b_ = (intmax_t)(b);                                   \
		if (!check_count_(a_ == b_))                                                       \
			check_report_(__FILE__, __LINE__, "check failed: %s == %s (%jd != %jd)",   \
				      #a, #b, a_, b_);                                             \
	} while (0)

/*
 * CHECK_RC(expr, want): expr, a call returning 0 or -errno (or a count), must return
 * want; a failure prints both codes and what each means:
 * `file:line: expr = -2 (No such file or directory), want 0 (ok)`.
 */
#define CHECK_RC(expr, want)                                                                       \
	do {                                                                                       \
		long long rc_ = (long long)(expr), want_ = (long long)(want);                      \
		if (!check_count_(rc_ == want_))                                                   \
			check_report_(__FILE__, __LINE__, "%s = %lld (%s), want %lld (%s)", #expr, \
				      rc_, check_errstr_(rc_), want_, check_errstr_(want_));       \
	} while (0)

/*
 * REQUIRE(cond): CHECK(cond), and when it fails the function it is in returns 1. For
 * a check that what follows depends on (a handle that must have opened, a step the
 * next ones build on), in a test function that returns int, 0 when it passed.
 */
#define REQUIRE(cond)                                                                              \
	do {                                                                                       \
		if (!check_count_(!!(cond))) {                                                     \
			check_report_(__FILE__, __LINE__, "required check failed: %s", #cond);     \
			return 1;                                                                  \
		}                                                                                  \
	} while (0)

/*
 * CHECK_FAIL(fmt, ...): a failure found another way (a loop that compares lists, a
 * step without a single expression to check): counts it and prints the message,
 * printf-style, after `file:line:`.
 *
 * check_fail_at(file, line, fmt, ...): the same for a helper that checks on its
 * caller's behalf, given the caller's __FILE__ and __LINE__ so that the failure
 * points at the call.
 */
__attribute__((format(printf, 3, 4))) static inline void check_fail_at(const char *file, int line,
								       const char *fmt, ...)
{
	va_list ap;

	check_count_(0);
	va_start(ap, fmt);
	check_vreport_(file, line, fmt, ap);
	va_end(ap);
}

#define CHECK_FAIL(...) check_fail_at(__FILE__, __LINE__, __VA_ARGS__)

/* The failures so far; a test may look at it to stop before a step that would crash. */
static inline int check_failures(void)
{
	return __atomic_load_n(&check_failed, __ATOMIC_RELAXED);
}

/*
 * CHECK_RUN(fn): runs `void fn(void)`, one test; when checks in it failed, prints
 * `fn: N failed check(s)` so the summary says which tests to look at.
 */
#define CHECK_RUN(fn) check_run_(#fn, fn)

static inline void check_run_(const char *name, void (*fn)(void))
{
	int before = check_failures();

	fn();
	if (check_failures() > before)
		fprintf(stderr, "%s: %d failed check(s)\n", name, check_failures() - before);
}

/*
 * check_done(): the end of main. Prints one line, `test_x: ok (N checks)` on stdout or
 * `test_x: F of N checks failed` on stderr, and returns the exit status: 0 or 1.
 */
static inline int check_done(void)
{
	int total = __atomic_load_n(&check_total, __ATOMIC_RELAXED), failed = check_failures();

	if (failed) {
		fprintf(stderr, "%s: %d of %d checks failed\n", program_invocation_short_name,
			failed, total);
		return 1;
	}
	printf("%s: ok (%d checks)\n", program_invocation_short_name, total);
	return 0;
}

/*
 * check_tmpdir(buf, size, name): makes a new, empty folder /tmp/stk-test-<name>-XXXXXX
 * and writes its path into buf (size bytes). Returns 0; or -ENAMETOOLONG when buf is
 * too small, or mkdtemp's -errno, and buf is left as it was. A test that cannot have
 * one skips (exit 77) or fails, its choice. check_rm_rf() removes it.
 */
static inline int check_tmpdir(char *buf, size_t size, const char *name)
{
	char path[PATH_MAX];
	int n = snprintf(path, sizeof(path), "/tmp/stk-test-%s-XXXXXX", name);

	/* buf is left alone on failure: a caller's cleanup may still look at it */
	if (n < 0 || (size_t)n >= sizeof(path) || (size_t)n >= size)
		return -ENAMETOOLONG;
	if (!mkdtemp(path))
		return -errno;
	memcpy(buf, path, (size_t)n + 1);
	return 0;
}

static inline int check_rm_entry_(const char *path, const struct stat *sb, int flag,
				  struct FTW *ftw)
{
	(void)sb;
	(void)flag;
	(void)ftw;
	remove(path); /* best effort: go on with the rest */
	return 0;
}

/*
 * check_rm_rf(path): removes path and everything under it, as far as it can, without
 * following symbolic links or entering another file system mounted below it.
 */
static inline void check_rm_rf(const char *path)
{
	nftw(path, check_rm_entry_, 16, FTW_DEPTH | FTW_PHYS | FTW_MOUNT);
}

#endif
