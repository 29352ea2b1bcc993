/*
 * Host and device identity (see host.h). The machine id is read once per process;
 * the network namespace is looked up on every call, since a process may move to
 * another (setns) between two.
 */
#include "host.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <xxhash.h>

#include "util.h"

#define MACHINE_MAX 32

static pthread_once_t machine_once = PTHREAD_ONCE_INIT;
static char machine[MACHINE_MAX + 1];

/* The first line of path, keeping only [0-9a-zA-Z] (a boot id's dashes go). */
static int read_id(const char *path, char *out, size_t len)
{
	char line[128];
	size_t k = 0;
	FILE *f = fopen(path, "r");

	if (!f)
		return -errno;
	if (!fgets(line, sizeof(line), f))
		line[0] = 0;
	fclose(f);
	for (const char *s = line; *s && k + 1 < len; s++)
		if ((*s >= '0' && *s <= '9') || (*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z'))
			out[k++] = *s;
	out[k] = 0;
	return k ? 0 : -ENOENT;
}

static void machine_init(void)
{
	if (read_id("/etc/machine-id", machine, sizeof(machine)) == 0 ||
	    read_id("/proc/sys/kernel/random/boot_id", machine, sizeof(machine)) == 0)
		return;
	/* Neither file: the host name is the best left. */
	if (gethostname(machine, sizeof(machine)) != 0 || !machine[0])
		stk_strlcpy(machine, "unknown", sizeof(machine));
	machine[MACHINE_MAX] = 0;
	for (char *s = machine; *s; s++)
		if (*s <= ' ' || *s > '~' || *s == ':')
			*s = '_';
}

int stk_host_id(const char *override, char *out, size_t len)
{
	struct stat st;
	unsigned long long ns = 0;

	if (len < STK_HOST_ID_MAX)
		return -EINVAL;
	if (override && *override) {
		for (const char *s = override; *s; s++)
			if (*s <= ' ' || *s > '~')
				return -EINVAL;
		if (strlen(override) >= STK_HOST_ID_MAX)
			return -EINVAL;
		stk_strlcpy(out, override, len);
		return 0;
	}
	pthread_once(&machine_once, machine_init);
	if (stat("/proc/self/ns/net", &st) == 0)
		ns = (unsigned long long)st.st_ino;
	snprintf(out, len, "%s:%llu", machine, ns);
	return 0;
}

int stk_host_fs_space(const char *path, uint64_t *capacity, uint64_t *used, uint64_t *avail,
		      uint64_t *dev)
{
	struct statvfs sv;
	struct stat st;
	struct {
		char machine[MACHINE_MAX + 1];
		uint64_t dev, fsid;
	} key;

	if (statvfs(path, &sv) < 0 || stat(path, &st) < 0)
		return -errno;
	*capacity = (uint64_t)sv.f_blocks * sv.f_frsize;
	*used = (uint64_t)(sv.f_blocks - sv.f_bfree) * sv.f_frsize;
	*avail = (uint64_t)sv.f_bavail * sv.f_frsize;
	pthread_once(&machine_once, machine_init);
	memset(&key, 0, sizeof(key));
	memcpy(key.machine, machine, sizeof(key.machine));
	key.dev = (uint64_t)st.st_dev;
	key.fsid = (uint64_t)sv.f_fsid;
	*dev = XXH64(&key, sizeof(key), 0);
	if (*dev == 0)
		*dev = 1; /* 0 means "unknown" */
	return 0;
}

static int by_dev(const void *a, const void *b)
{
	const struct stk_rt_target *x = *(const struct stk_rt_target *const *)a;
	const struct stk_rt_target *y = *(const struct stk_rt_target *const *)b;

	return x->dev < y->dev ? -1 : x->dev > y->dev;
}

int stk_host_space_sum(const struct stk_rt_target *t, uint32_t n, struct stk_space *out)
{
	const struct stk_rt_target **v;
	uint32_t i = 0;

	memset(out, 0, sizeof(*out));
	v = malloc((n ? n : 1) * sizeof(*v));
	if (!v)
		return -ENOMEM;
	for (uint32_t k = 0; k < n; k++)
		v[k] = &t[k];
	qsort(v, n, sizeof(*v), by_dev);
	while (i < n) {
		uint64_t cap = v[i]->capacity, used = v[i]->used, avail = v[i]->avail;
		uint32_t j = i + 1;

		if (v[i]->dev == 0)
			avail = cap > used ? cap - used : 0;
		else
			for (; j < n && v[j]->dev == v[i]->dev; j++) {
				cap = STK_MAX(cap, v[j]->capacity);
				used = STK_MAX(used, v[j]->used);
				avail = STK_MIN(avail, v[j]->avail);
			}
		out->capacity += cap;
		out->used += used;
		/*
		 * Every chain has one target today, so a byte written takes a byte of one
		 * device. With longer chains (replication) or erasure coding, what can be
		 * written is this sum divided by the replication factor (or scaled by the
		 * code's data/total ratio): apply it here, for every adder at once.
		 */
		out->avail += avail;
		out->devices++;
		i = j;
	}
	free(v);
	return 0;
}
