/*
 * Storage metrics (see metrics.h): per-target series, the scrape-time collector
 * and the SMART checker.
 *
 * Per-target handles live in an array parallel to the daemon's stores; a request
 * finds its target's entry by comparing the store pointer, a few compares at
 * most (a node has a handful of targets), which keeps the chunk store itself
 * unaware of metrics.
 *
 * Why SMART runs on a thread of its own and rarely: smartctl is a fork and exec
 * that may take a second on a busy device and asks the device itself, so it must
 * never sit in a scrape or a request. Health changes over hours, so every
 * SMART_INTERVAL_S is plenty. Several targets on one device share one answer.
 */
#include "metrics.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../common/log.h"
#include "../common/metrics.h"
#include "../common/util.h"
#include "../chunk/servemap.h"
#include "chunk.h"

#define SMART_INTERVAL_S 300
#define SMART_TIMEOUT_MS 20000
#define SMART_OUT_MAX (256u << 10)

struct target_metrics {
	const struct stk_chunk_store *cs;
	char id[16];
	stk_metric_t capacity, used, free_bytes, chunks, csum, repaired;
	stk_metric_t bytes[2], ops[2], errors[2], dur[2], inflight;
	stk_metric_t resync_checked, resync_chunks, resync_bytes, resync_progress;
	const struct stk_serve_map *map; /* atomic: short-circuit reads' counts; NULL: none */
	stk_metric_t sc_reads, sc_bytes;
	/* SMART: the device, and series registered once smartctl answers */
	char device[64];
	stk_metric_t healthy, temp, wear, media;
};

struct stk_storage_metrics {
	struct target_metrics *t;
	unsigned n;
	stk_metric_t node_capacity, node_used;
	dev_t *seen; /* n entries: the collector's scratch for file systems already counted */
	const char *smartctl; /* NULL: not installed */
	pthread_t smart_thread;
	int smart_started;
	pthread_mutex_t lock; /* protects stop */
	pthread_cond_t wake;
	int stop;
};

static struct target_metrics *find(struct stk_storage_metrics *m, const struct stk_chunk_store *cs)
{
	for (unsigned i = 0; i < m->n; i++)
		if (m->t[i].cs == cs)
			return &m->t[i];
	return NULL;
}

uint64_t stk_storage_metrics_begin(struct stk_storage_metrics *m, const struct stk_chunk_store *cs)
{
	struct target_metrics *t;

	if (!m || !(t = find(m, cs)))
		return 0;
	stk_metric_add(t->inflight, 1);
	return stk_now_ns();
}

void stk_storage_metrics_end(struct stk_storage_metrics *m, const struct stk_chunk_store *cs,
			     enum stk_target_op op, uint64_t t0, long rc, uint64_t bytes)
{
	struct target_metrics *t;
	uint64_t now;

	if (!m || !(t = find(m, cs)))
		return;
	now = stk_now_ns();
	stk_metric_observe_ns(t->dur[op], now > t0 ? now - t0 : 0);
	stk_metric_add(t->ops[op], 1);
	if (rc >= 0)
		stk_metric_add(t->bytes[op], (int64_t)bytes);
	else if (rc != -ENOSPC)
		stk_metric_add(t->errors[op], 1);
	stk_metric_add(t->inflight, -1);
}

void stk_storage_metrics_serve_map(struct stk_storage_metrics *m, const struct stk_chunk_store *cs,
				   const struct stk_serve_map *map)
{
	struct target_metrics *t;

	if (m && (t = find(m, cs)))
		__atomic_store_n(&t->map, map, __ATOMIC_RELEASE); /* a scrape may be running */
}

void stk_storage_metrics_resync(struct stk_storage_metrics *m, const struct stk_chunk_store *cs,
				uint64_t checked, uint64_t copied, uint64_t bytes, double progress)
{
	struct target_metrics *t;

	if (!m || !(t = find(m, cs)))
		return;
	stk_metric_add(t->resync_checked, (int64_t)checked);
	stk_metric_add(t->resync_chunks, (int64_t)copied);
	stk_metric_add(t->resync_bytes, (int64_t)bytes);
	stk_metric_set(t->resync_progress, progress);
}

/* ---- scrape-time figures ---- */

/*
 * Per target, each figure is the statvfs of its folder, so targets that share a
 * file system (the folders of `stoker up`, or several per disk) each report the
 * whole of it. The node's totals count each file system once, told apart by the
 * st_dev of the target folders: a sum of the per-target figures would count one
 * disk N times. (A folder that cannot be stat'ed counts as a file system of its own.)
 */
static void collect(void *ctx)
{
	struct stk_storage_metrics *m = ctx;
	uint64_t ncap = 0, nused = 0;
	unsigned nseen = 0;

	for (unsigned i = 0; i < m->n; i++) {
		struct target_metrics *t = &m->t[i];
		uint64_t cap, used, chunks;
		struct stat st;
		int first = 1;

		/* The store is only read here; the cast is for its statvfs. */
		if (stk_chunk_store_stat((struct stk_chunk_store *)t->cs, &cap, &used, &chunks) ==
		    0) {
			stk_metric_set_int(t->capacity, (int64_t)cap);
			stk_metric_set_int(t->used, (int64_t)used);
			stk_metric_set_int(t->free_bytes, (int64_t)(cap > used ? cap - used : 0));
			stk_metric_set_int(t->chunks, (int64_t)chunks);
			if (stat(stk_chunk_store_path(t->cs), &st) == 0) {
				for (unsigned j = 0; j < nseen && first; j++)
					first = m->seen[j] != st.st_dev;
				if (first)
					m->seen[nseen++] = st.st_dev;
			}
			if (first) {
				ncap += cap;
				nused += used;
			}
		}
		stk_metric_set_int(t->csum, (int64_t)stk_chunk_store_corrupt_count(t->cs));
		stk_metric_set_int(t->repaired, (int64_t)stk_chunk_store_repaired_count(t->cs));
		const struct stk_serve_map *map = __atomic_load_n(&t->map, __ATOMIC_ACQUIRE);

		if (map) {
			uint64_t reads, bytes;

			stk_serve_map_counts(map, &reads, &bytes);
			stk_metric_set_int(t->sc_reads, (int64_t)reads);
			stk_metric_set_int(t->sc_bytes, (int64_t)bytes);
		}
	}
	stk_metric_set_int(m->node_capacity, (int64_t)ncap);
	stk_metric_set_int(m->node_used, (int64_t)nused);
}

/* ---- SMART ---- */

/* The value after "key": (skipping blanks) within the next `window` bytes of from, or NULL. */
static const char *json_after(const char *from, const char *key, size_t window)
{
	const char *p = strstr(from, key);

	if (!p || (size_t)(p - from) > window)
		return NULL;
	p += strlen(key);
	while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
		p++;
	if (*p != ':')
		return NULL;
	p++;
	while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
		p++;
	return p;
}

static int json_number(const char *p, double *out)
{
	char *end;

	if (!p)
		return -ENOENT;
	*out = strtod(p, &end);
	return end == p ? -ENOENT : 0;
}

int stk_smart_parse(const char *json, struct stk_smart *s)
{
	const char *p;
	double v;

	memset(s, 0, sizeof(*s));
	/* "smart_status": {"passed": true} */
	p = strstr(json, "\"smart_status\"");
	if (p && (p = json_after(p, "\"passed\"", 64))) {
		if (strncmp(p, "true", 4) == 0) {
			s->has_passed = 1;
			s->passed = 1;
		} else if (strncmp(p, "false", 5) == 0) {
			s->has_passed = 1;
		}
	}
	/*
	 * "temperature": {"current": 35} (ATA and NVMe alike); the NVMe health log has a
	 * "temperature" of its own before it, a bare number, so look at each.
	 */
	for (p = strstr(json, "\"temperature\""); p; p = strstr(p + 1, "\"temperature\"")) {
		if (json_number(json_after(p, "\"current\"", 64), &v) == 0) {
			s->has_temp = 1;
			s->temp_c = v;
			break;
		}
	}
	/* NVMe health log: percentage_used and media_errors */
	p = strstr(json, "\"nvme_smart_health_information_log\"");
	if (p) {
		if (json_number(json_after(p, "\"percentage_used\"", 1024), &v) == 0 && v >= 0) {
			s->has_wear = 1;
			s->wear = v / 100.0;
		}
		if (json_number(json_after(p, "\"media_errors\"", 1024), &v) == 0 && v >= 0) {
			s->has_media_errors = 1;
			s->media_errors = (uint64_t)v;
		}
	}
	return s->has_passed || s->has_temp || s->has_wear || s->has_media_errors ? 0 : -ENOENT;
}

/* $STOKER_SMARTCTL names another program (tests use a fake one; empty turns SMART off). */
static const char *find_smartctl(void)
{
	static const char *const where[] = {"/usr/sbin/smartctl", "/sbin/smartctl",
					    "/usr/bin/smartctl", "/usr/local/sbin/smartctl"};
	const char *env = getenv("STOKER_SMARTCTL");

	if (env)
		return *env && access(env, X_OK) == 0 ? env : NULL;

	for (size_t i = 0; i < STK_ARRAY_SIZE(where); i++)
		if (access(where[i], X_OK) == 0)
			return where[i];
	return NULL;
}

/*
 * The whole block device under a folder ("/dev/nvme0n1" for a folder on
 * nvme0n1p2), or -ENODEV where there is none to ask (tmpfs, overlay, loop, ram).
 */
static int device_of(const char *dir, char *out, size_t len)
{
	char sys[64], real[PATH_MAX], part[PATH_MAX + 16];
	const char *name;
	struct stat st;

	if (stat(dir, &st) < 0)
		return -errno;
	if (major(st.st_dev) == 0)
		return -ENODEV;
	snprintf(sys, sizeof(sys), "/sys/dev/block/%u:%u", major(st.st_dev), minor(st.st_dev));
	if (!realpath(sys, real))
		return -ENODEV;
	snprintf(part, sizeof(part), "%s/partition", real);
	if (access(part, F_OK) == 0) {
		char *slash = strrchr(real, '/');
		if (!slash)
			return -ENODEV;
		*slash = 0; /* a partition's folder sits in its disk's */
	}
	name = strrchr(real, '/');
	name = name ? name + 1 : real;
	if (!strncmp(name, "loop", 4) || !strncmp(name, "ram", 3) || !strncmp(name, "zram", 4))
		return -ENODEV;
	if ((size_t)snprintf(out, len, "/dev/%s", name) >= len)
		return -ENAMETOOLONG;
	return access(out, F_OK) == 0 ? 0 : -ENODEV;
}

/* Runs smartctl on dev; its JSON in out. 0, or -errno when it gave nothing usable. */
static int run_smartctl(const char *exe, const char *dev, char *out, size_t cap)
{
	uint64_t deadline = stk_now_ns() + (uint64_t)SMART_TIMEOUT_MS * 1000000ull;
	size_t len = 0;
	int p[2], st = 0, rc = 0;
	pid_t pid;

	if (pipe2(p, O_CLOEXEC) < 0)
		return -errno;
	pid = fork();
	if (pid < 0) {
		rc = -errno;
		close(p[0]);
		close(p[1]);
		return rc;
	}
	if (pid == 0) {
		/* Only async-signal-safe calls between fork and exec: we are multi-threaded. */
		int null = open("/dev/null", O_RDWR);
		dup2(p[1], 1);
		if (null >= 0) {
			dup2(null, 0);
			dup2(null, 2);
		}
		execl(exe, "smartctl", "--json", "-H", "-A", dev, (char *)NULL);
		_exit(127);
	}
	close(p[1]);
	while (len < cap - 1) {
		struct pollfd pfd = {.fd = p[0], .events = POLLIN};
		uint64_t now = stk_now_ns();
		ssize_t n;

		if (now >= deadline) {
			kill(pid, SIGKILL);
			rc = -ETIMEDOUT;
			break;
		}
		if (poll(&pfd, 1, (int)((deadline - now) / 1000000) + 1) <= 0)
			continue;
		n = read(p[0], out + len, cap - 1 - len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		len += (size_t)n;
	}
	close(p[0]);
	out[len] = 0;
	while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
		;
	if (rc)
		return rc;
	/* Exit bits 0 and 1: bad command line or device not opened; nothing to trust. */
	if (!WIFEXITED(st) || WEXITSTATUS(st) == 127 || (WEXITSTATUS(st) & 3))
		return -ENODEV;
	return 0;
}

/* One figure: set and shown when smartctl gave it this round, hidden when not. */
static void smart_figure(enum stk_metric_family f, const char *const *labels, stk_metric_t *h,
			 int has, int64_t ival, double dval, int is_int)
{
	if (!has) {
		stk_metric_hide(*h, 1); /* a handle of 0 (never known) is a no-op */
		return;
	}
	if (!*h && stk_metric_series(f, labels, h))
		return;
	if (is_int)
		stk_metric_set_int(*h, ival);
	else
		stk_metric_set(*h, dval);
	stk_metric_hide(*h, 0);
}

/*
 * Publishes this round's answer about t's device; s NULL when smartctl gave none.
 * A figure missing from this answer is hidden rather than left at its last value:
 * a device that stopped answering must read as unknown, not as healthy at the
 * temperature it had an hour ago.
 */
static void smart_publish(struct target_metrics *t, const struct stk_smart *s)
{
	static const struct stk_smart none;
	const char *v[2] = {t->id, t->device};

	if (!s)
		s = &none;
	smart_figure(STK_M_DEVICE_SMART_HEALTHY, v, &t->healthy, s->has_passed, s->passed, 0, 1);
	smart_figure(STK_M_DEVICE_TEMPERATURE, v, &t->temp, s->has_temp, 0, s->temp_c, 0);
	smart_figure(STK_M_DEVICE_WEAR, v, &t->wear, s->has_wear, 0, s->wear, 0);
	smart_figure(STK_M_DEVICE_MEDIA_ERRORS, v, &t->media, s->has_media_errors,
		     (int64_t)s->media_errors, 0, 1);
}

int stk_storage_metrics_smart_apply(struct stk_storage_metrics *m, unsigned i, const char *device,
				    const struct stk_smart *s)
{
	struct target_metrics *t;

	if (!m || i >= m->n)
		return -EINVAL;
	t = &m->t[i];
	if (device && !t->device[0])
		stk_strlcpy(t->device, device, sizeof(t->device));
	if (!t->device[0])
		return -EINVAL;
	smart_publish(t, s);
	return 0;
}

static void smart_round(struct stk_storage_metrics *m, char *buf, struct stk_smart *res, int *ok)
{
	for (unsigned i = 0; i < m->n; i++) {
		struct target_metrics *t = &m->t[i];
		unsigned j;

		ok[i] = 0;
		if (!t->device[0])
			continue;
		/* Targets on one device share the answer it gave this round. */
		for (j = 0; j < i; j++)
			if (strcmp(m->t[j].device, t->device) == 0)
				break;
		if (j < i) {
			res[i] = res[j];
			ok[i] = ok[j];
		} else {
			ok[i] = run_smartctl(m->smartctl, t->device, buf, SMART_OUT_MAX) == 0 &&
				stk_smart_parse(buf, &res[i]) == 0;
			if (!ok[i])
				stk_debug("smartctl gave no health figures for %s", t->device);
		}
		smart_publish(t, ok[i] ? &res[i] : NULL);
	}
}

static void *smart_main(void *arg)
{
	struct stk_storage_metrics *m = arg;
	char *buf = malloc(SMART_OUT_MAX);
	struct stk_smart *res = calloc(m->n, sizeof(*res));
	int *ok = calloc(m->n, sizeof(*ok));
	struct timespec ts;

	if (!buf || !res || !ok)
		goto out;
	pthread_mutex_lock(&m->lock);
	while (!m->stop) {
		pthread_mutex_unlock(&m->lock);
		smart_round(m, buf, res, ok);
		pthread_mutex_lock(&m->lock);
		clock_gettime(CLOCK_MONOTONIC, &ts);
		ts.tv_sec += SMART_INTERVAL_S;
		while (!m->stop && pthread_cond_timedwait(&m->wake, &m->lock, &ts) == 0)
			;
	}
	pthread_mutex_unlock(&m->lock);
out:
	free(buf);
	free(res);
	free(ok);
	return NULL;
}

/* ---- setup ---- */

static int register_target(struct target_metrics *t)
{
	const char *v[1] = {t->id};
	const char *rd[2] = {t->id, "read"}, *wr[2] = {t->id, "write"};
	int rc = 0;

	rc = rc ? rc : stk_metric_series(STK_M_TARGET_CAPACITY, v, &t->capacity);
	rc = rc ? rc : stk_metric_series(STK_M_TARGET_USED, v, &t->used);
	rc = rc ? rc : stk_metric_series(STK_M_TARGET_FREE, v, &t->free_bytes);
	rc = rc ? rc : stk_metric_series(STK_M_TARGET_CHUNKS, v, &t->chunks);
	rc = rc ? rc : stk_metric_series(STK_M_TARGET_READ_BYTES, v, &t->bytes[STK_TARGET_READ]);
	rc = rc ? rc : stk_metric_series(STK_M_TARGET_WRITE_BYTES, v, &t->bytes[STK_TARGET_WRITE]);
	rc = rc ? rc : stk_metric_series(STK_M_TARGET_READS, v, &t->ops[STK_TARGET_READ]);
	rc = rc ? rc : stk_metric_series(STK_M_TARGET_WRITES, v, &t->ops[STK_TARGET_WRITE]);
	rc = rc ? rc : stk_metric_series(STK_M_TARGET_IO_ERRORS, rd, &t->errors[STK_TARGET_READ]);
	rc = rc ? rc : stk_metric_series(STK_M_TARGET_IO_ERRORS, wr, &t->errors[STK_TARGET_WRITE]);
	rc = rc ? rc : stk_metric_series(STK_M_TARGET_CHECKSUM_ERRORS, v, &t->csum);
	rc = rc ? rc : stk_metric_series(STK_M_TARGET_CHUNKS_REPAIRED, v, &t->repaired);
	rc = rc ? rc : stk_metric_series(STK_M_TARGET_INFLIGHT, v, &t->inflight);
	rc = rc ? rc : stk_metric_series(STK_M_TARGET_SHORT_CIRCUIT_READS, v, &t->sc_reads);
	rc = rc ? rc : stk_metric_series(STK_M_TARGET_SHORT_CIRCUIT_BYTES, v, &t->sc_bytes);
	rc = rc ? rc : stk_metric_series(STK_M_TARGET_IO_DURATION, rd, &t->dur[STK_TARGET_READ]);
	rc = rc ? rc : stk_metric_series(STK_M_TARGET_IO_DURATION, wr, &t->dur[STK_TARGET_WRITE]);
	rc = rc ? rc : stk_metric_series(STK_M_TARGET_RESYNC_CHECKED, v, &t->resync_checked);
	rc = rc ? rc : stk_metric_series(STK_M_TARGET_RESYNC_CHUNKS, v, &t->resync_chunks);
	rc = rc ? rc : stk_metric_series(STK_M_TARGET_RESYNC_BYTES, v, &t->resync_bytes);
	rc = rc ? rc : stk_metric_series(STK_M_TARGET_RESYNC_PROGRESS, v, &t->resync_progress);
	return rc;
}

int stk_storage_metrics_create(struct stk_chunk_store *const *stores, unsigned n,
			       struct stk_storage_metrics **out)
{
	struct stk_storage_metrics *m;
	pthread_condattr_t ca;
	int rc = -ENOMEM, ndev = 0;

	*out = NULL;
	m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	pthread_mutex_init(&m->lock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&m->wake, &ca);
	pthread_condattr_destroy(&ca);
	m->t = calloc(n ? n : 1, sizeof(*m->t));
	m->seen = calloc(n ? n : 1, sizeof(*m->seen));
	if (!m->t || !m->seen)
		goto out;
	m->n = n;
	rc = stk_metric_series(STK_M_NODE_CAPACITY, NULL, &m->node_capacity);
	rc = rc ? rc : stk_metric_series(STK_M_NODE_USED, NULL, &m->node_used);
	if (rc)
		goto out;
	m->smartctl = find_smartctl();
	for (unsigned i = 0; i < n; i++) {
		struct target_metrics *t = &m->t[i];

		t->cs = stores[i];
		snprintf(t->id, sizeof(t->id), "%u", stk_chunk_store_id(stores[i]));
		rc = register_target(t);
		if (rc)
			goto out;
		if (m->smartctl &&
		    device_of(stk_chunk_store_path(stores[i]), t->device, sizeof(t->device)) == 0)
			ndev++;
		else
			t->device[0] = 0;
	}
	rc = stk_metrics_collector_add(collect, m);
	if (rc)
		goto out;
	if (ndev) {
		if (pthread_create(&m->smart_thread, NULL, smart_main, m) == 0)
			m->smart_started = 1;
		else
			stk_warn("cannot start the SMART checker: device health will be absent");
	}
	*out = m;
	return 0;
out:
	free(m->t);
	free(m->seen);
	pthread_cond_destroy(&m->wake);
	pthread_mutex_destroy(&m->lock);
	free(m);
	return rc;
}

void stk_storage_metrics_destroy(struct stk_storage_metrics *m)
{
	if (!m)
		return;
	stk_metrics_collector_remove(collect, m);
	if (m->smart_started) {
		pthread_mutex_lock(&m->lock);
		m->stop = 1;
		pthread_cond_signal(&m->wake);
		pthread_mutex_unlock(&m->lock);
		pthread_join(m->smart_thread, NULL);
	}
	pthread_cond_destroy(&m->wake);
	pthread_mutex_destroy(&m->lock);
	free(m->t);
	free(m->seen);
	free(m);
}
