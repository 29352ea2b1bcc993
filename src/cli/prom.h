/*
 * What `stoker top` and `stoker doctor` read from the daemons' /metrics: whole
 * scrapes (the sample lines "name{labels} value", comments skipped) read with
 * src/common/scrape.h, with the sums, rates and quantiles both commands compute
 * from them; a label's value is stk_scrape_label's.
 *
 * Thread rules: no shared state; a cli_scrape is used by one thread at a time.
 */
#ifndef STK_CLI_PROM_H
#define STK_CLI_PROM_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "../common/scrape.h"

/* How long a connect, a send or a read of cli_http_get may wait. */
#define CLI_HTTP_TIMEOUT_MS 2000
/* The largest body cli_http_get takes. */
#define CLI_HTTP_MAX (16u << 20)

/*
 * GET http://addr/path (addr "HOST:PORT", "[V6]:PORT"). On a 200 reply *body is the
 * body, NUL-terminated, malloc'ed (the caller frees it), and, when date is not
 * NULL, *date the reply's Date header in seconds since the epoch (0 when it has
 * none). 0, or -errno: -EBADMSG (not a 200 reply), -EFBIG (over CLI_HTTP_MAX),
 * -ETIMEDOUT, or those of connect.
 */
int cli_http_get(const char *addr, const char *path, char **body, time_t *date);

/* One sample line; the strings point into the cli_scrape's text. */
struct cli_sample {
	const char *name;
	const char *labels; /* the text between { and }, "" without */
	double value;
};

/* One endpoint's samples at one moment. All zero is an empty one. */
struct cli_scrape {
	char *text; /* owns the strings samples point into */
	struct cli_sample *s;
	size_t n, cap;
	uint64_t at_ns; /* stk_now_ns() when it was taken; the caller sets it */
};

/* Frees what sc holds and zeroes it. */
void cli_scrape_free(struct cli_scrape *sc);
/*
 * Splits the sample lines of text in place into sc (which takes text: it frees it
 * in cli_scrape_free); comments and malformed lines are skipped. 0 or -ENOMEM.
 */
int cli_prom_parse(char *text, struct cli_scrape *sc);

/*
 * Which series of a family to add up: those whose labels k[i] equal v[i] (unset k:
 * any), and, when ops is set, whose op label is one of ops (NULL-terminated).
 */
struct cli_filt {
	const char *k[2];
	const char *v[2];
	const char *const *ops;
};

/* The sum of family name's series that f keeps (f NULL: all); 0 when none. */
double cli_prom_sum(const struct cli_scrape *sc, const char *name, const struct cli_filt *f);
/* 1 if sc has a series of family name. */
int cli_prom_has(const struct cli_scrape *sc, const char *name);
/* Per-second increase of a counter from a to b (a restart counts from zero). */
double cli_prom_rate(const struct cli_scrape *a, const struct cli_scrape *b, const char *name,
		     const struct cli_filt *f);
/*
 * The q-quantile of what histogram hname (without _bucket) observed between
 * scrapes a and b, by linear interpolation inside the bucket that holds it, as
 * Prometheus's histogram_quantile does; NAN when nothing was observed. An empty a
 * (all zero) gives the quantile of everything b counted since its process started.
 */
double cli_prom_quantile(const struct cli_scrape *a, const struct cli_scrape *b, const char *hname,
			 const struct cli_filt *f, double q);

/*
 * Where the daemon serving RPC at rpc_addr serves /metrics by the `stoker up`
 * convention (its port + STK_METRICS_PORT_OFFSET), into out. 0 or -EINVAL.
 */
int cli_metrics_addr(const char *rpc_addr, char *out, size_t len);

#endif
