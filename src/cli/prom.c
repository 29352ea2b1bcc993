/*
 * The /metrics reader `stoker top` and `stoker doctor` share (prom.h): whole
 * scrapes kept for sums, rates and quantiles, over the GET and the exposition
 * walker of src/common/scrape.h (which mgmtd's dashboard uses too).
 */
#include "prom.h"

#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "cli.h"

#include "../common/scrape.h"
#include "../common/util.h"

int cli_http_get(const char *addr, const char *path, char **body, time_t *date)
{
	return stk_scrape_get_dated(addr, path, CLI_HTTP_TIMEOUT_MS, CLI_HTTP_MAX, body, date);
}

/* ---- exposition ---- */

void cli_scrape_free(struct cli_scrape *sc)
{
	free(sc->text);
	free(sc->s);
	memset(sc, 0, sizeof(*sc));
}

struct parse {
	struct cli_scrape *sc;
	int err;
};

static void add_sample(void *ctx, const char *name, const char *labels, double value)
{
	struct parse *p = ctx;
	struct cli_scrape *sc = p->sc;

	if (p->err)
		return;
	if (sc->n == sc->cap) {
		size_t nc = sc->cap ? sc->cap * 2 : 1024;
		struct cli_sample *ns = realloc(sc->s, nc * sizeof(*ns));

		if (!ns) {
			p->err = -ENOMEM;
			return;
		}
		sc->s = ns;
		sc->cap = nc;
	}
	sc->s[sc->n++] = (struct cli_sample){.name = name, .labels = labels, .value = value};
}

/* Splits sample lines in place (stk_scrape_parse): the names point into text. */
int cli_prom_parse(char *text, struct cli_scrape *sc)
{
	struct parse p = {.sc = sc};

	sc->text = text; /* sc owns it from now, whatever happens */
	stk_scrape_parse(text, add_sample, &p);
	return p.err;
}

static int matches(const struct cli_sample *s, const char *name, const struct cli_filt *f)
{
	char buf[128];

	if (strcmp(s->name, name) != 0)
		return 0;
	for (int i = 0; f && i < 2; i++)
		if (f->k[i] && (stk_scrape_label(s->labels, f->k[i], buf, sizeof(buf)) ||
				strcmp(buf, f->v[i]) != 0))
			return 0;
	if (f && f->ops) {
		const char *const *op;

		if (stk_scrape_label(s->labels, "op", buf, sizeof(buf)))
			return 0;
		for (op = f->ops; *op && strcmp(*op, buf) != 0; op++)
			;
		if (!*op)
			return 0;
	}
	return 1;
}

double cli_prom_sum(const struct cli_scrape *sc, const char *name, const struct cli_filt *f)
{
	double v = 0;

	for (size_t i = 0; i < sc->n; i++)
		if (matches(&sc->s[i], name, f))
			v += sc->s[i].value;
	return v;
}

int cli_prom_has(const struct cli_scrape *sc, const char *name)
{
	for (size_t i = 0; i < sc->n; i++)
		if (strcmp(sc->s[i].name, name) == 0)
			return 1;
	return 0;
}

/* Per-second increase of a counter between two scrapes (a restart counts from zero). */
double cli_prom_rate(const struct cli_scrape *a, const struct cli_scrape *b, const char *name,
		     const struct cli_filt *f)
{
	double va = cli_prom_sum(a, name, f), vb = cli_prom_sum(b, name, f);
	double dt = (double)(b->at_ns - a->at_ns) / 1e9;

	if (dt <= 0)
		return 0;
	return (vb >= va ? vb - va : vb) / dt;
}

#define NBOUNDS 24

/* Bucket increments of histogram `name` (summed over series) between two scrapes. */
struct hist {
	double le[NBOUNDS];
	double cum[NBOUNDS];
	int n;
};

static void hist_add(struct hist *h, double le, double v)
{
	int i;

	for (i = 0; i < h->n; i++)
		if (h->le[i] == le)
			break;
	if (i == h->n) {
		if (h->n == NBOUNDS)
			return;
		h->le[h->n] = le;
		h->cum[h->n++] = 0;
	}
	h->cum[i] += v;
}

/*
 * The q-quantile of what histogram `name` observed between scrapes a and b, by
 * linear interpolation inside the bucket that holds it; NAN when nothing was
 * observed.
 */
double cli_prom_quantile(const struct cli_scrape *a, const struct cli_scrape *b, const char *hname,
			 const struct cli_filt *f, double q)
{
	char bucket[160], le[32];
	struct hist h = {.n = 0};
	double total, rank, prev_le = 0, prev_cum = 0;

	snprintf(bucket, sizeof(bucket), "%s_bucket", hname);
	for (int pass = 0; pass < 2; pass++) {
		const struct cli_scrape *sc = pass ? b : a;
		for (size_t i = 0; i < sc->n; i++) {
			const struct cli_sample *s = &sc->s[i];
			if (!matches(s, bucket, f) ||
			    stk_scrape_label(s->labels, "le", le, sizeof(le)))
				continue;
			hist_add(&h, strcmp(le, "+Inf") == 0 ? INFINITY : strtod(le, NULL),
				 pass ? s->value : -s->value);
		}
	}
	/* sort by bound (a handful of entries) */
	for (int i = 1; i < h.n; i++)
		for (int j = i; j > 0 && h.le[j - 1] > h.le[j]; j--) {
			double t = h.le[j];
			h.le[j] = h.le[j - 1];
			h.le[j - 1] = t;
			t = h.cum[j];
			h.cum[j] = h.cum[j - 1];
			h.cum[j - 1] = t;
		}
	if (h.n == 0 || !isinf(h.le[h.n - 1]))
		return NAN;
	total = h.cum[h.n - 1];
	if (total <= 0)
		return NAN;
	rank = q * total;
	for (int i = 0; i < h.n; i++) {
		if (h.cum[i] >= rank) {
			if (isinf(h.le[i]))
				return prev_le; /* beyond the last bound: say the last bound */
			if (h.cum[i] == prev_cum)
				return h.le[i];
			return prev_le +
			       (h.le[i] - prev_le) * (rank - prev_cum) / (h.cum[i] - prev_cum);
		}
		prev_le = h.le[i];
		prev_cum = h.cum[i];
	}
	return NAN;
}

int cli_metrics_addr(const char *rpc_addr, char *out, size_t len)
{
	char host[256];
	uint16_t port;

	if (stk_parse_hostport(rpc_addr, host, sizeof(host), &port) ||
	    port + STK_METRICS_PORT_OFFSET > 65535)
		return -EINVAL;
	snprintf(out, len, strchr(host, ':') ? "[%s]:%u" : "%s:%u", host,
		 (unsigned)(port + STK_METRICS_PORT_OFFSET));
	return 0;
}
