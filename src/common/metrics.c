/*
 * The metrics registry: series, per-thread shards, the text exposition, and the
 * per-operation sets that servers and client daemons count through.
 *
 * Why shards and not atomic counters: a request touches five or six series
 * (count, bytes in, bytes out, a histogram bucket and its sum, in flight), and an
 * atomic add on a cache line that every connection thread writes makes each of
 * them a cross-core transfer; on a storage node serving many connections that is
 * measurable. A slot that one thread owns is a load and a store in its own cache.
 * The price is paid by the scrape, which sums one slot per live thread, once a
 * second at most.
 *
 * Slots are numbered globally: a series is given a run of slots when it is
 * registered (one for a counter or gauge, STK_METRIC_BUCKETS + 2 for a
 * histogram) and its handle is its first slot plus one, so counting needs no
 * lookup. Shards, the retired table and the set-value tables are arrays of page
 * pointers (PAGE_SLOTS slots each) of fixed length, so none is ever moved while a
 * scrape reads it. A thread allocates a page of its shard the first time it
 * counts into it; the retired and set-value pages are allocated when the series is
 * registered, so retiring a thread and setting a gauge never allocate.
 *
 * Lock order: scrape_lock (collectors, one scrape at a time), then lock
 * (series lists, slot count, shard list, retired table).
 */
#include "metrics.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../proto/status.h"
#include "../proto/wire.h"
#include "util.h"

#define PAGE_SLOTS 256u
#define MAX_PAGES 512u
#define MAX_SLOTS (PAGE_SLOTS * MAX_PAGES)
/* A histogram's slots: STK_METRIC_BUCKETS bounded buckets, +Inf, then the sum in ns. */
#define HIST_SLOTS (STK_METRIC_BUCKETS + 2)

struct family_def {
	const char *name;
	enum stk_metric_type type;
	const char *labels; /* comma-separated label names */
	const char *help;
};

static const struct family_def families[STK_M__COUNT] = {
#define STK_METRIC_DEF(id, type, name, labels, help) {name, STK_METRIC_##type, labels, help},
    STK_METRICS_TABLE(STK_METRIC_DEF)
#undef STK_METRIC_DEF
};

/* The bucket bounds, in ns and as the `le` label shows them. */
#define STK_METRIC_BOUNDS(X)                                                                       \
	X(10000ull, "1e-05")                                                                       \
	X(20000ull, "2e-05") X(50000ull, "5e-05") X(100000ull, "0.0001") X(200000ull, "0.0002")    \
	    X(500000ull, "0.0005") X(1000000ull, "0.001") X(2000000ull, "0.002")                   \
		X(5000000ull, "0.005") X(10000000ull, "0.01") X(20000000ull, "0.02")               \
		    X(50000000ull, "0.05") X(100000000ull, "0.1") X(200000000ull, "0.2")           \
			X(500000000ull, "0.5") X(1000000000ull, "1") X(2000000000ull, "2")         \
			    X(5000000000ull, "5") X(10000000000ull, "10")

static const uint64_t bound_ns[STK_METRIC_BUCKETS] = {
#define STK_BOUND_NS(ns, le) ns,
    STK_METRIC_BOUNDS(STK_BOUND_NS)
#undef STK_BOUND_NS
};
static const char *const bound_le[STK_METRIC_BUCKETS] = {
#define STK_BOUND_LE(ns, le) le,
    STK_METRIC_BOUNDS(STK_BOUND_LE)
#undef STK_BOUND_LE
};

struct series {
	uint32_t slot; /* first slot */
	char *labels;  /* name="value",... ready to print, "" without labels */
	struct series *next;
};

/* A thread's slots. pages[] is written by the owning thread only (release), read by scrapes. */
struct shard {
	uint64_t *pages[MAX_PAGES];
	struct shard *prev, *next; /* g.shards, under g.lock */
};

struct collector {
	stk_metrics_collect_fn fn;
	void *ctx;
	struct collector *next;
};

static struct {
	pthread_mutex_t lock;
	uint32_t nslots;
	struct series *head[STK_M__COUNT], *tail[STK_M__COUNT];
	struct shard *shards;
	uint64_t *retired[MAX_PAGES]; /* sums of exited threads, under lock */
	uint64_t *ivals[MAX_PAGES];   /* stk_metric_set_int values (atomic) */
	uint64_t *dvals[MAX_PAGES];   /* stk_metric_set values, double bits (atomic) */
	uint8_t *hidden[MAX_PAGES];   /* stk_metric_hide flags (atomic) */
	pthread_mutex_t scrape_lock;
	struct collector *collectors; /* under scrape_lock */
} g = {.lock = PTHREAD_MUTEX_INITIALIZER, .scrape_lock = PTHREAD_MUTEX_INITIALIZER};

static pthread_key_t g_key;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static int g_key_ok;
static __thread struct shard *tls_shard;

/* ---- shards ---- */

/* Thread exit: fold the shard into the retired sums and unlink it, atomically for scrapes. */
static void shard_retire(void *arg)
{
	struct shard *sh = arg;

	pthread_mutex_lock(&g.lock);
	for (uint32_t p = 0; p < MAX_PAGES; p++) {
		if (!sh->pages[p])
			continue;
		/* Registration allocated the retired page for every slot in use. */
		if (g.retired[p])
			for (uint32_t i = 0; i < PAGE_SLOTS; i++)
				g.retired[p][i] += sh->pages[p][i];
	}
	if (sh->prev)
		sh->prev->next = sh->next;
	else
		g.shards = sh->next;
	if (sh->next)
		sh->next->prev = sh->prev;
	pthread_mutex_unlock(&g.lock);
	for (uint32_t p = 0; p < MAX_PAGES; p++)
		free(sh->pages[p]);
	free(sh);
	tls_shard = NULL;
}

static void key_init(void)
{
	g_key_ok = pthread_key_create(&g_key, shard_retire) == 0;
}

static struct shard *shard_new(void)
{
	struct shard *sh;

	pthread_once(&g_once, key_init);
	if (!g_key_ok)
		return NULL;
	sh = calloc(1, sizeof(*sh));
	if (!sh)
		return NULL;
	if (pthread_setspecific(g_key, sh)) {
		free(sh);
		return NULL;
	}
	pthread_mutex_lock(&g.lock);
	sh->next = g.shards;
	if (g.shards)
		g.shards->prev = sh;
	g.shards = sh;
	pthread_mutex_unlock(&g.lock);
	tls_shard = sh;
	return sh;
}

/* The calling thread's slot idx, or NULL when out of memory (the count is dropped). */
static inline uint64_t *slot_ptr(uint32_t idx)
{
	struct shard *sh = tls_shard;
	uint64_t *page;

	if (__builtin_expect(!sh, 0)) {
		sh = shard_new();
		if (!sh)
			return NULL;
	}
	page = sh->pages[idx / PAGE_SLOTS];
	if (__builtin_expect(!page, 0)) {
		/* Cache-line aligned: no line is shared with another thread's page. */
		if (posix_memalign((void **)&page, 64, PAGE_SLOTS * sizeof(*page)))
			return NULL;
		memset(page, 0, PAGE_SLOTS * sizeof(*page));
		__atomic_store_n(&sh->pages[idx / PAGE_SLOTS], page, __ATOMIC_RELEASE);
	}
	return &page[idx % PAGE_SLOTS];
}

/* Only the owning thread writes a slot: a load and a store, no read-modify-write. */
static inline void slot_add(uint64_t *p, uint64_t v)
{
	__atomic_store_n(p, __atomic_load_n(p, __ATOMIC_RELAXED) + v, __ATOMIC_RELAXED);
}

void stk_metric_add(stk_metric_t s, int64_t delta)
{
	uint64_t *p;

	if (!s || s > MAX_SLOTS)
		return;
	p = slot_ptr(s - 1);
	if (p)
		slot_add(p, (uint64_t)delta);
}

void stk_metric_observe_ns(stk_metric_t s, uint64_t ns)
{
	uint32_t b = 0;
	uint64_t *p, *sum;

	if (!s || s + HIST_SLOTS - 1 > MAX_SLOTS)
		return;
	while (b < STK_METRIC_BUCKETS && ns > bound_ns[b])
		b++;
	p = slot_ptr(s - 1 + b);
	sum = slot_ptr(s - 1 + STK_METRIC_BUCKETS + 1);
	if (p && sum) {
		slot_add(p, 1);
		slot_add(sum, ns);
	}
}

void stk_metric_set(stk_metric_t s, double v)
{
	uint64_t bits;

	if (!s || s > MAX_SLOTS)
		return;
	memcpy(&bits, &v, sizeof(bits));
	__atomic_store_n(&g.dvals[(s - 1) / PAGE_SLOTS][(s - 1) % PAGE_SLOTS], bits,
			 __ATOMIC_RELAXED);
}

void stk_metric_set_int(stk_metric_t s, int64_t v)
{
	if (!s || s > MAX_SLOTS)
		return;
	__atomic_store_n(&g.ivals[(s - 1) / PAGE_SLOTS][(s - 1) % PAGE_SLOTS], (uint64_t)v,
			 __ATOMIC_RELAXED);
}

void stk_metric_hide(stk_metric_t s, int hidden)
{
	if (!s || s > MAX_SLOTS)
		return;
	__atomic_store_n(&g.hidden[(s - 1) / PAGE_SLOTS][(s - 1) % PAGE_SLOTS], hidden ? 1 : 0,
			 __ATOMIC_RELAXED);
}

/* ---- registration ---- */

/* A growable text buffer; err latches the first allocation failure. */
struct tbuf {
	char *p;
	size_t len, cap;
	int err;
};

static void tb_printf(struct tbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void tb_printf(struct tbuf *b, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (b->err)
		return;
	for (;;) {
		size_t room = b->cap - b->len;
		va_start(ap, fmt);
		n = vsnprintf(b->p ? b->p + b->len : NULL, room, fmt, ap);
		va_end(ap);
		if (n < 0) {
			b->err = -EINVAL;
			return;
		}
		if ((size_t)n < room) {
			b->len += (size_t)n;
			return;
		}
		size_t ncap = b->cap ? b->cap * 2 : 4096;
		while (ncap < b->len + (size_t)n + 1)
			ncap *= 2;
		char *np = realloc(b->p, ncap);
		if (!np) {
			b->err = -ENOMEM;
			return;
		}
		b->p = np;
		b->cap = ncap;
	}
}

/* Appends a label value escaped as the text format wants: \\, \" and \n. */
static void tb_escaped(struct tbuf *b, const char *v)
{
	for (; *v; v++) {
		if (*v == '\\')
			tb_printf(b, "\\\\");
		else if (*v == '"')
			tb_printf(b, "\\\"");
		else if (*v == '\n')
			tb_printf(b, "\\n");
		else
			tb_printf(b, "%c", *v);
	}
}

/* Builds name="value",... from a family's label names and the values given. */
static int format_labels(const struct family_def *fd, const char *const *values, char **out)
{
	struct tbuf b = {0};
	const char *n = fd->labels;
	unsigned i = 0;

	tb_printf(&b, "%s", "");
	while (*n) {
		size_t len = strcspn(n, ",");
		if (!values || !values[i]) {
			free(b.p);
			return -EINVAL;
		}
		tb_printf(&b, "%s%.*s=\"", i ? "," : "", (int)len, n);
		tb_escaped(&b, values[i]);
		tb_printf(&b, "\"");
		i++;
		n += len;
		if (*n == ',')
			n++;
	}
	if (b.err) {
		free(b.p);
		return b.err;
	}
	*out = b.p;
	return 0;
}

/* Makes sure the retired and set-value pages cover slots below end. Under g.lock. */
static int pages_cover(uint32_t end)
{
	for (uint32_t p = 0; p <= (end - 1) / PAGE_SLOTS; p++) {
		if (!g.retired[p])
			g.retired[p] = calloc(PAGE_SLOTS, sizeof(uint64_t));
		if (!g.ivals[p])
			g.ivals[p] = calloc(PAGE_SLOTS, sizeof(uint64_t));
		if (!g.dvals[p])
			g.dvals[p] = calloc(PAGE_SLOTS, sizeof(uint64_t));
		if (!g.hidden[p])
			g.hidden[p] = calloc(PAGE_SLOTS, sizeof(uint8_t));
		if (!g.retired[p] || !g.ivals[p] || !g.dvals[p] || !g.hidden[p])
			return -ENOMEM;
	}
	return 0;
}

int stk_metric_series(enum stk_metric_family f, const char *const *values, stk_metric_t *out)
{
	struct series *s;
	uint32_t n;
	char *labels = NULL;
	int rc;

	*out = 0;
	if ((unsigned)f >= STK_M__COUNT)
		return -EINVAL;
	rc = format_labels(&families[f], values, &labels);
	if (rc)
		return rc;
	n = families[f].type == STK_METRIC_HISTOGRAM ? HIST_SLOTS : 1;
	pthread_mutex_lock(&g.lock);
	for (s = g.head[f]; s; s = s->next) {
		if (strcmp(s->labels, labels) == 0) {
			*out = s->slot + 1;
			rc = 0;
			goto out;
		}
	}
	rc = -ENOSPC;
	if (g.nslots + n > MAX_SLOTS)
		goto out;
	rc = pages_cover(g.nslots + n);
	if (rc)
		goto out;
	rc = -ENOMEM;
	s = calloc(1, sizeof(*s));
	if (!s)
		goto out;
	s->slot = g.nslots;
	s->labels = labels;
	labels = NULL;
	g.nslots += n;
	if (g.tail[f])
		g.tail[f]->next = s;
	else
		g.head[f] = s;
	g.tail[f] = s;
	*out = s->slot + 1;
	rc = 0;
out:
	pthread_mutex_unlock(&g.lock);
	free(labels);
	return rc;
}

/* ---- collectors ---- */

int stk_metrics_collector_add(stk_metrics_collect_fn fn, void *ctx)
{
	struct collector *c = calloc(1, sizeof(*c)), **pp;

	if (!c)
		return -ENOMEM;
	c->fn = fn;
	c->ctx = ctx;
	pthread_mutex_lock(&g.scrape_lock);
	/* Appended: collectors run in the order they were added. */
	for (pp = &g.collectors; *pp; pp = &(*pp)->next)
		;
	*pp = c;
	pthread_mutex_unlock(&g.scrape_lock);
	return 0;
}

void stk_metrics_collector_remove(stk_metrics_collect_fn fn, void *ctx)
{
	struct collector **pp, *c;

	pthread_mutex_lock(&g.scrape_lock);
	for (pp = &g.collectors; *pp; pp = &(*pp)->next) {
		if ((*pp)->fn == fn && (*pp)->ctx == ctx) {
			c = *pp;
			*pp = c->next;
			free(c);
			break;
		}
	}
	pthread_mutex_unlock(&g.scrape_lock);
}

/* ---- exposition ---- */

/* Sum of slot idx over retired and live shards. Under g.lock. */
static uint64_t slot_sum(uint32_t idx)
{
	uint32_t p = idx / PAGE_SLOTS, i = idx % PAGE_SLOTS;
	uint64_t v = g.retired[p] ? g.retired[p][i] : 0;

	for (struct shard *sh = g.shards; sh; sh = sh->next) {
		uint64_t *page = __atomic_load_n(&sh->pages[p], __ATOMIC_ACQUIRE);
		if (page)
			v += __atomic_load_n(&page[i], __ATOMIC_RELAXED);
	}
	return v;
}

static int series_hidden(const struct series *s)
{
	return __atomic_load_n(&g.hidden[s->slot / PAGE_SLOTS][s->slot % PAGE_SLOTS],
			       __ATOMIC_RELAXED);
}

static const char *type_name(enum stk_metric_type t)
{
	return t == STK_METRIC_COUNTER ? "counter" : t == STK_METRIC_GAUGE ? "gauge" : "histogram";
}

static void render_value(struct tbuf *b, const struct family_def *fd, const struct series *s)
{
	uint32_t p = s->slot / PAGE_SLOTS, i = s->slot % PAGE_SLOTS;
	uint64_t sum = slot_sum(s->slot) + __atomic_load_n(&g.ivals[p][i], __ATOMIC_RELAXED);
	uint64_t dbits = __atomic_load_n(&g.dvals[p][i], __ATOMIC_RELAXED);
	double d;

	memcpy(&d, &dbits, sizeof(d));
	tb_printf(b, "%s%s%s%s ", fd->name, *s->labels ? "{" : "", s->labels,
		  *s->labels ? "}" : "");
	/* Integers print exactly: byte counters pass 2^53 long before they wrap. */
	if (d != 0.0)
		tb_printf(b, "%.15g\n",
			  (fd->type == STK_METRIC_GAUGE ? (double)(int64_t)sum : (double)sum) + d);
	else if (fd->type == STK_METRIC_GAUGE)
		tb_printf(b, "%lld\n", (long long)(int64_t)sum);
	else
		tb_printf(b, "%llu\n", (unsigned long long)sum);
}

static void render_histogram(struct tbuf *b, const struct family_def *fd, const struct series *s)
{
	const char *sep = *s->labels ? "," : "";
	uint64_t cum = 0, sum_ns;

	for (uint32_t k = 0; k <= STK_METRIC_BUCKETS; k++) {
		cum += slot_sum(s->slot + k);
		tb_printf(b, "%s_bucket{%s%sle=\"%s\"} %llu\n", fd->name, s->labels, sep,
			  k < STK_METRIC_BUCKETS ? bound_le[k] : "+Inf", (unsigned long long)cum);
	}
	sum_ns = slot_sum(s->slot + STK_METRIC_BUCKETS + 1);
	tb_printf(b, "%s_sum%s%s%s %.9f\n", fd->name, *s->labels ? "{" : "", s->labels,
		  *s->labels ? "}" : "", (double)sum_ns / 1e9);
	/* _count is the +Inf bucket of the same snapshot, by construction. */
	tb_printf(b, "%s_count%s%s%s %llu\n", fd->name, *s->labels ? "{" : "", s->labels,
		  *s->labels ? "}" : "", (unsigned long long)cum);
}

int stk_metrics_render(char **out, size_t *len)
{
	struct tbuf b = {0};

	pthread_mutex_lock(&g.scrape_lock);
	for (struct collector *c = g.collectors; c; c = c->next)
		c->fn(c->ctx);
	pthread_mutex_lock(&g.lock);
	tb_printf(&b, "%s", "");
	for (unsigned f = 0; f < STK_M__COUNT; f++) {
		const struct family_def *fd = &families[f];
		struct series *s;

		/* A family whose series are all hidden is left out whole, header and all. */
		for (s = g.head[f]; s && series_hidden(s); s = s->next)
			;
		if (!s)
			continue;
		tb_printf(&b, "# HELP %s %s\n# TYPE %s %s\n", fd->name, fd->help, fd->name,
			  type_name(fd->type));
		for (; s; s = s->next) {
			if (series_hidden(s))
				continue;
			if (fd->type == STK_METRIC_HISTOGRAM)
				render_histogram(&b, fd, s);
			else
				render_value(&b, fd, s);
		}
	}
	pthread_mutex_unlock(&g.lock);
	pthread_mutex_unlock(&g.scrape_lock);
	if (b.err) {
		free(b.p);
		return b.err;
	}
	*out = b.p;
	*len = b.len;
	return 0;
}

int stk_metrics_doc(char **out, size_t *len)
{
	struct tbuf b = {0};

	tb_printf(&b, "| Metric | Type | Labels | Meaning |\n|---|---|---|---|\n");
	for (unsigned f = 0; f < STK_M__COUNT; f++) {
		const struct family_def *fd = &families[f];
		const char *n = fd->labels;

		tb_printf(&b, "| `%s` | %s | ", fd->name, type_name(fd->type));
		if (!*n)
			tb_printf(&b, "-");
		while (*n) {
			size_t l = strcspn(n, ",");
			tb_printf(&b, "%s`%.*s`", n == fd->labels ? "" : ", ", (int)l, n);
			n += l;
			if (*n == ',')
				n++;
		}
		tb_printf(&b, " | %s |\n", fd->help);
	}
	if (b.err) {
		free(b.p);
		return b.err;
	}
	*out = b.p;
	*len = b.len;
	return 0;
}

/* ---- per-operation sets ---- */

/* Errors are cached per (op, kind): wire statuses for RPC, errno values for clients. */
#define RPC_OPS 128u
#define RPC_ERRS 32u
#define CLIENT_ERRS 160u

struct op_series {
	stk_metric_t req, in, out, dur;
	int ready; /* atomic: the handles above are set */
};

/* A client host's series (stk_metrics_ops_client). */
struct client_series {
	char host[48]; /* an IPv6 address in text is at most 45 characters */
	stk_metric_t req, in, out;
};

/*
 * The hosts of an RPC set. Entries below n are complete and never change: n is
 * published with a release store after the entry is written, under lock, so that
 * readers scan without it. `other` is registered when the table first overflows.
 */
struct client_table {
	pthread_mutex_t lock; /* adding an entry or `other` */
	unsigned n;	      /* atomic */
	int other_ready;      /* atomic */
	struct client_series other;
	struct client_series ent[STK_METRICS_MAX_CLIENTS];
};

struct stk_metrics_ops {
	int rpc;
	struct client_table *clients; /* RPC sets only */
	char *frontend;
	char **names; /* client sets: the op names */
	unsigned nops, nerrs;
	enum stk_metric_family f_req, f_err, f_in, f_out, f_dur;
	stk_metric_t inflight, conns, opened;
	struct op_series *ops;
	stk_metric_t *errs; /* nops * nerrs, atomic, 0 until the first such error */
};

static const char *op_name(const struct stk_metrics_ops *m, unsigned op)
{
	return m->rpc ? stk_opcode_name((uint16_t)op) : m->names[op];
}

/* Registers op's series; racing threads register the same ones and store equal handles. */
static void op_register(struct stk_metrics_ops *m, unsigned op, struct op_series *o)
{
	const char *v[2];
	const char *const *vals = v;
	stk_metric_t h;

	if (m->rpc) {
		v[0] = op_name(m, op);
	} else {
		v[0] = m->frontend;
		v[1] = op_name(m, op);
	}
	if (stk_metric_series(m->f_req, vals, &h) == 0)
		__atomic_store_n(&o->req, h, __ATOMIC_RELAXED);
	if (stk_metric_series(m->f_in, vals, &h) == 0)
		__atomic_store_n(&o->in, h, __ATOMIC_RELAXED);
	if (stk_metric_series(m->f_out, vals, &h) == 0)
		__atomic_store_n(&o->out, h, __ATOMIC_RELAXED);
	if (stk_metric_series(m->f_dur, vals, &h) == 0)
		__atomic_store_n(&o->dur, h, __ATOMIC_RELAXED);
	__atomic_store_n(&o->ready, 1, __ATOMIC_RELEASE);
}

static struct op_series *op_get(struct stk_metrics_ops *m, unsigned *op)
{
	struct op_series *o;

	if (*op >= m->nops) {
		if (!m->rpc)
			return NULL;
		*op = 0; /* "UNKNOWN" */
	}
	o = &m->ops[*op];
	if (!__atomic_load_n(&o->ready, __ATOMIC_ACQUIRE))
		op_register(m, *op, o);
	return o;
}

static int ops_alloc(struct stk_metrics_ops *m, const char *label0)
{
	const char *v[1] = {label0};
	int rc;

	m->ops = calloc(m->nops, sizeof(*m->ops));
	m->errs = calloc((size_t)m->nops * m->nerrs, sizeof(*m->errs));
	if (!m->ops || !m->errs)
		return -ENOMEM;
	rc =
	    stk_metric_series(m->rpc ? STK_M_RPC_INFLIGHT : STK_M_CLIENT_INFLIGHT, v, &m->inflight);
	if (!rc)
		rc = stk_metric_series(m->rpc ? STK_M_RPC_CONNECTIONS : STK_M_CLIENT_CONNECTIONS, v,
				       &m->conns);
	if (!rc)
		rc = stk_metric_series(m->rpc ? STK_M_RPC_CONNECTIONS_OPENED
					      : STK_M_CLIENT_CONNECTIONS_OPENED,
				       v, &m->opened);
	return rc;
}

int stk_metrics_rpc_create(uint16_t lo, uint16_t hi, struct stk_metrics_ops **out)
{
	struct stk_metrics_ops *m = calloc(1, sizeof(*m));
	int rc;

	*out = NULL;
	if (!m)
		return -ENOMEM;
	m->rpc = 1;
	m->nops = RPC_OPS;
	m->nerrs = RPC_ERRS;
	m->f_req = STK_M_RPC_REQUESTS;
	m->f_err = STK_M_RPC_ERRORS;
	m->f_in = STK_M_RPC_RECEIVED_BYTES;
	m->f_out = STK_M_RPC_SENT_BYTES;
	m->f_dur = STK_M_RPC_DURATION;
	rc = ops_alloc(m, NULL);
	if (rc)
		goto out;
	rc = -ENOMEM;
	m->clients = calloc(1, sizeof(*m->clients));
	if (!m->clients)
		goto out;
	pthread_mutex_init(&m->clients->lock, NULL);
		/* This server's opcodes show from the start, at zero, so rate() has a first sample.
		 */
#define STK_RPC_PREREGISTER(name, code, req, resp, what)                                           \
	if ((code) >= lo && (code) <= hi) {                                                        \
		unsigned op = (code);                                                              \
		op_get(m, &op);                                                                    \
	}
	STK_OPCODE_TABLE(STK_RPC_PREREGISTER)
#undef STK_RPC_PREREGISTER
	*out = m;
	return 0;
out:
	stk_metrics_ops_destroy(m);
	return rc;
}

int stk_metrics_ops_create(const char *frontend, const char *const *ops, unsigned nops,
			   struct stk_metrics_ops **out)
{
	struct stk_metrics_ops *m;
	int rc = -EINVAL;

	*out = NULL;
	if (!frontend || !ops || nops == 0 || nops > 4096)
		return -EINVAL;
	m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	m->nops = nops;
	m->nerrs = CLIENT_ERRS;
	m->f_req = STK_M_CLIENT_OPS;
	m->f_err = STK_M_CLIENT_ERRORS;
	m->f_in = STK_M_CLIENT_WRITE_BYTES;
	m->f_out = STK_M_CLIENT_READ_BYTES;
	m->f_dur = STK_M_CLIENT_DURATION;
	m->frontend = strdup(frontend);
	m->names = calloc(nops, sizeof(*m->names));
	if (!m->frontend || !m->names) {
		rc = -ENOMEM;
		goto out;
	}
	for (unsigned i = 0; i < nops; i++) {
		rc = -EINVAL;
		if (!ops[i])
			goto out;
		rc = -ENOMEM;
		m->names[i] = strdup(ops[i]);
		if (!m->names[i])
			goto out;
	}
	rc = ops_alloc(m, frontend);
	if (rc)
		goto out;
	for (unsigned i = 0; i < nops; i++) {
		unsigned op = i;
		op_get(m, &op);
	}
	*out = m;
	return 0;
out:
	stk_metrics_ops_destroy(m);
	return rc;
}

void stk_metrics_ops_destroy(struct stk_metrics_ops *m)
{
	if (!m)
		return;
	if (m->names)
		for (unsigned i = 0; i < m->nops; i++)
			free(m->names[i]);
	free(m->names);
	free(m->frontend);
	free(m->ops);
	free(m->errs);
	if (m->clients)
		pthread_mutex_destroy(&m->clients->lock);
	free(m->clients);
	free(m);
}

uint64_t stk_metrics_ops_begin(struct stk_metrics_ops *m, unsigned op)
{
	if (!m || (!m->rpc && op >= m->nops))
		return 0;
	stk_metric_add(m->inflight, 1);
	return stk_now_ns();
}

/* The error's series for op, registered the first time this error is seen. */
static stk_metric_t err_series(struct stk_metrics_ops *m, unsigned op, int err)
{
	unsigned e;
	stk_metric_t *slot, h;
	char ebuf[16];
	const char *v[3], *name;

	if (m->rpc) {
		e = stk_status_from_errno(err);
		name = stk_status_name(e);
	} else {
		e = (unsigned)-err;
		name = strerrorname_np((int)e);
		if (!name) {
			snprintf(ebuf, sizeof(ebuf), "E%u", e);
			name = ebuf;
		}
	}
	if (e >= m->nerrs)
		e = 0; /* uncached: found under the registry lock each time */
	slot = &m->errs[(size_t)op * m->nerrs + e];
	h = e ? __atomic_load_n(slot, __ATOMIC_RELAXED) : 0;
	if (h)
		return h;
	if (m->rpc) {
		v[0] = op_name(m, op);
		v[1] = name;
	} else {
		v[0] = m->frontend;
		v[1] = op_name(m, op);
		v[2] = name;
	}
	if (stk_metric_series(m->f_err, v, &h))
		return 0;
	if (e)
		__atomic_store_n(slot, h, __ATOMIC_RELAXED);
	return h;
}

void stk_metrics_ops_answered(struct stk_metrics_ops *m, unsigned op, int err,
			      uint64_t in_bytes, uint64_t out_bytes)
{
	struct op_series *o;

	if (!m)
		return;
	o = op_get(m, &op);
	if (!o)
		return;
	stk_metric_add(o->req, 1);
	if (in_bytes)
		stk_metric_add(o->in, (int64_t)in_bytes);
	if (out_bytes)
		stk_metric_add(o->out, (int64_t)out_bytes);
	if (err)
		stk_metric_add(err_series(m, op, err < 0 ? err : -err), 1);
}

void stk_metrics_ops_sent(struct stk_metrics_ops *m, unsigned op, uint64_t t0)
{
	struct op_series *o;
	uint64_t now;

	if (!m)
		return;
	o = op_get(m, &op);
	if (!o)
		return;
	now = stk_now_ns();
	stk_metric_observe_ns(o->dur, now > t0 ? now - t0 : 0);
	stk_metric_add(m->inflight, -1);
}

void stk_metrics_ops_end(struct stk_metrics_ops *m, unsigned op, uint64_t t0, int err,
			 uint64_t in_bytes, uint64_t out_bytes)
{
	stk_metrics_ops_answered(m, op, err, in_bytes, out_bytes);
	stk_metrics_ops_sent(m, op, t0);
}

void stk_metrics_ops_conn(struct stk_metrics_ops *m, int delta)
{
	if (!m)
		return;
	stk_metric_add(m->conns, delta);
	if (delta > 0)
		stk_metric_add(m->opened, delta);
}

/* ---- per client host ---- */

/* Registers the three series of host into cs. 0 or -errno (cs is then unusable). */
static int client_register(struct client_series *cs, const char *host)
{
	const char *v[1] = {host};
	int rc;

	stk_strlcpy(cs->host, host, sizeof(cs->host));
	rc = stk_metric_series(STK_M_RPC_CLIENT_REQUESTS, v, &cs->req);
	rc = rc ? rc : stk_metric_series(STK_M_RPC_CLIENT_RECEIVED_BYTES, v, &cs->in);
	rc = rc ? rc : stk_metric_series(STK_M_RPC_CLIENT_SENT_BYTES, v, &cs->out);
	return rc;
}

/* host's entry, added if there is room, else `other`; NULL if registration failed. */
static const struct client_series *client_find(struct client_table *ct, const char *host)
{
	const struct client_series *e = NULL;
	unsigned n = __atomic_load_n(&ct->n, __ATOMIC_ACQUIRE), i;

	for (i = 0; i < n; i++)
		if (strcmp(ct->ent[i].host, host) == 0)
			return &ct->ent[i];
	if (n == STK_METRICS_MAX_CLIENTS && __atomic_load_n(&ct->other_ready, __ATOMIC_ACQUIRE))
		return &ct->other;
	pthread_mutex_lock(&ct->lock);
	/* Another thread may have added it, or filled the table, since the scan. */
	for (; i < ct->n; i++)
		if (strcmp(ct->ent[i].host, host) == 0) {
			e = &ct->ent[i];
			goto out;
		}
	if (ct->n < STK_METRICS_MAX_CLIENTS) {
		if (client_register(&ct->ent[ct->n], host) == 0) {
			e = &ct->ent[ct->n];
			__atomic_store_n(&ct->n, ct->n + 1, __ATOMIC_RELEASE);
		}
		goto out;
	}
	if (!ct->other_ready) {
		if (client_register(&ct->other, "other"))
			goto out;
		__atomic_store_n(&ct->other_ready, 1, __ATOMIC_RELEASE);
	}
	e = &ct->other;
out:
	pthread_mutex_unlock(&ct->lock);
	return e;
}

/*
 * The calling thread's last peer and its series. net.c serves a connection on one
 * thread, so this hits on every request after a connection's first.
 */
static __thread struct {
	const struct client_table *ct;
	char peer[64];
	const struct client_series *e;
} tls_client;

void stk_metrics_ops_client(struct stk_metrics_ops *m, const char *peer, uint64_t in_bytes,
			    uint64_t out_bytes)
{
	const struct client_series *e;

	if (!m || !m->clients || !peer)
		return;
	if (tls_client.ct == m->clients && strcmp(tls_client.peer, peer) == 0) {
		e = tls_client.e;
	} else {
		char host[48];
		const char *h = peer, *end;

		/* "[V6]:PORT" or "V4:PORT": the address without the port (and brackets) */
		if (*h == '[') {
			h++;
			end = strchr(h, ']');
		} else {
			end = strrchr(h, ':');
		}
		if (!end)
			end = h + strlen(h);
		if ((size_t)(end - h) >= sizeof(host) || end == h)
			snprintf(host, sizeof(host), "unknown");
		else
			snprintf(host, sizeof(host), "%.*s", (int)(end - h), h);
		e = client_find(m->clients, host);
		if (!e)
			return;
		tls_client.ct = m->clients;
		stk_strlcpy(tls_client.peer, peer, sizeof(tls_client.peer));
		tls_client.e = e;
	}
	stk_metric_add(e->req, 1);
	stk_metric_add(e->in, (int64_t)in_bytes);
	stk_metric_add(e->out, (int64_t)out_bytes);
}
