/*
 * Unit test of common/host.c: the host id (its override and its checks), the device
 * id of a folder's file system, and the adder that counts each device once over
 * the targets of a whole cluster (what df on a mount, `stoker status` totals and
 * mgmtd's cluster metrics report).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/host.h"
#include "common/util.h"
#include "check.h"

static struct stk_rt_target tgt(uint32_t id, uint32_t node, uint64_t dev, uint64_t cap,
				uint64_t used, uint64_t avail)
{
	struct stk_rt_target t;

	memset(&t, 0, sizeof(t));
	t.id = id;
	t.node_id = node;
	t.state = STK_TARGET_SERVING;
	t.dev = dev;
	t.capacity = cap;
	t.used = used;
	t.avail = avail;
	return t;
}

static void test_space_sum(void)
{
	struct stk_rt_target t[8];
	struct stk_space sp;

	/* Nothing: zeros. */
	CHECK(stk_host_space_sum(NULL, 0, &sp) == 0);
	CHECK(sp.capacity == 0 && sp.used == 0 && sp.avail == 0 && sp.devices == 0);

	/*
	 * Three nodes with two targets each on one disk (device 7), reported at three
	 * instants: the disk counts once, with the largest use and the smallest avail.
	 */
	t[0] = tgt(1, 1, 7, 1000, 400, 550);
	t[1] = tgt(2, 1, 7, 1000, 400, 550);
	t[2] = tgt(3, 2, 7, 1000, 410, 540);
	t[3] = tgt(4, 2, 7, 1000, 410, 540);
	t[4] = tgt(5, 3, 7, 1000, 405, 545);
	t[5] = tgt(6, 3, 7, 1000, 405, 545);
	CHECK(stk_host_space_sum(t, 6, &sp) == 0);
	CHECK(sp.capacity == 1000 && sp.used == 410 && sp.avail == 540 && sp.devices == 1);

	/* Another disk (device 9) adds its own; a target of unknown device (0) too. */
	t[6] = tgt(7, 4, 9, 200, 50, 140);
	t[7] = tgt(8, 5, 0, 100, 30, 0);
	CHECK(stk_host_space_sum(t, 8, &sp) == 0);
	CHECK(sp.capacity == 1300 && sp.used == 490 && sp.avail == 540 + 140 + 70);
	CHECK(sp.devices == 3);

	/* Two targets of unknown device are two devices, not one. */
	t[0] = tgt(1, 1, 0, 100, 10, 0);
	t[1] = tgt(2, 2, 0, 100, 20, 0);
	CHECK(stk_host_space_sum(t, 2, &sp) == 0);
	CHECK(sp.capacity == 200 && sp.used == 30 && sp.avail == 170 && sp.devices == 2);

	/* The order of the targets does not matter, and the input is left alone. */
	t[0] = tgt(1, 1, 5, 100, 10, 80);
	t[1] = tgt(2, 2, 3, 300, 30, 250);
	t[2] = tgt(3, 3, 5, 100, 12, 79);
	CHECK(stk_host_space_sum(t, 3, &sp) == 0);
	CHECK(sp.capacity == 400 && sp.used == 42 && sp.avail == 329 && sp.devices == 2);
	CHECK(t[0].id == 1 && t[1].id == 2 && t[2].id == 3);
}

static void test_host_id(void)
{
	char a[STK_HOST_ID_MAX], b[STK_HOST_ID_MAX], small[8], ns[32];
	char longid[STK_HOST_ID_MAX + 1];
	struct stat st;

	/* The default: MACHINE:NETNS, the same on every call. */
	CHECK(stk_host_id(NULL, a, sizeof(a)) == 0);
	CHECK(stk_host_id("", b, sizeof(b)) == 0);
	CHECK(strcmp(a, b) == 0);
	CHECK(strchr(a, ':') != NULL && a[0] != ':');
	if (stat("/proc/self/ns/net", &st) == 0) {
		snprintf(ns, sizeof(ns), ":%llu", (unsigned long long)st.st_ino);
		CHECK(strlen(a) > strlen(ns) && strcmp(a + strlen(a) - strlen(ns), ns) == 0);
	}
	/* An override is taken as is. */
	CHECK(stk_host_id("rack1-node7", b, sizeof(b)) == 0 && strcmp(b, "rack1-node7") == 0);
	/* Bad overrides, and a buffer too small, are refused. */
	CHECK(stk_host_id("two words", b, sizeof(b)) == -EINVAL);
	CHECK(stk_host_id("tab\there", b, sizeof(b)) == -EINVAL);
	CHECK(stk_host_id("\xc3\xa9t\xc3\xa9", b, sizeof(b)) == -EINVAL);
	memset(longid, 'x', STK_HOST_ID_MAX);
	longid[STK_HOST_ID_MAX] = 0;
	CHECK(stk_host_id(longid, b, sizeof(b)) == -EINVAL);
	longid[STK_HOST_ID_MAX - 1] = 0; /* 63 bytes: the longest */
	CHECK(stk_host_id(longid, b, sizeof(b)) == 0 && strcmp(b, longid) == 0);
	CHECK(stk_host_id(NULL, small, sizeof(small)) == -EINVAL);
}

static void test_fs_space(void)
{
	char dir[64] = "", sub[96];
	uint64_t cap, used, avail, dev, cap2, used2, avail2, dev2;

	CHECK_RC(check_tmpdir(dir, sizeof(dir), "host"), 0);
	if (!dir[0])
		return;
	snprintf(sub, sizeof(sub), "%s/t1", dir);
	CHECK(mkdir(sub, 0755) == 0);
	/* Two folders of one file system: one device id. */
	CHECK(stk_host_fs_space(dir, &cap, &used, &avail, &dev) == 0);
	CHECK(stk_host_fs_space(sub, &cap2, &used2, &avail2, &dev2) == 0);
	CHECK(dev != 0 && dev == dev2 && cap == cap2);
	CHECK(cap > 0 && used <= cap && avail <= cap - used);
	/* Another file system (/proc): another device id. */
	CHECK(stk_host_fs_space("/proc", &cap2, &used2, &avail2, &dev2) == 0);
	CHECK(dev2 != 0 && dev2 != dev);
	CHECK(stk_host_fs_space("/nonexistent/stk", &cap2, &used2, &avail2, &dev2) == -ENOENT);
	check_rm_rf(dir);
}

int main(void)
{
	CHECK_RUN(test_space_sum);
	CHECK_RUN(test_host_id);
	CHECK_RUN(test_fs_space);
	return check_done();
}
