/*
 * The /metrics reader `stoker top` and `stoker doctor` share (prom.h): an HTTP/1.0
 * GET over a blocking socket with a timeout on every step, and the exposition
 * parser. Small on purpose: the daemons' endpoint (libmicrohttpd) answers a plain
 * GET with the whole body and closes, so reading to EOF is the whole protocol.
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

#include "../common/util.h"

/*
 * The Date header of the reply head [buf, end) in seconds since the epoch, 0 when
 * it has none or it does not parse (RFC 9110's IMF-fixdate, the form every server
 * sends: "Sun, 06 Nov 1994 08:49:37 GMT").
 */
static time_t header_date(const char *buf, const char *end)
{
	const char *p = buf;
	struct tm tm;

	while (p < end) {
		const char *nl = memchr(p, '\n', (size_t)(end - p));
		const char *next = nl ? nl + 1 : end;

		if (next - p > 6 && strncasecmp(p, "Date:", 5) == 0) {
			char v[64];
			size_t n = (size_t)(next - p) - 5;
			const char *s = p + 5;

			while (n && (*s == ' ' || *s == '\t')) {
				s++;
				n--;
			}
			if (n >= sizeof(v))
				return 0;
			memcpy(v, s, n);
			v[n] = 0;
			memset(&tm, 0, sizeof(tm));
			if (!strptime(v, "%a, %d %b %Y %H:%M:%S GMT", &tm))
				return 0;
			return timegm(&tm);
		}
		p = next;
	}
	return 0;
}

/* Connects to "HOST:PORT" within CLI_HTTP_TIMEOUT_MS. fd or -errno. */
static int dial(const char *addr)
{
	char host[256], port[8];
	uint16_t p;
	struct addrinfo hints, *res = NULL;
	struct timeval tv = {.tv_sec = CLI_HTTP_TIMEOUT_MS / 1000,
			     .tv_usec = (CLI_HTTP_TIMEOUT_MS % 1000) * 1000};
	int fd, rc;

	if (stk_parse_hostport(addr, host, sizeof(host), &p))
		return -EINVAL;
	snprintf(port, sizeof(port), "%u", p);
	memset(&hints, 0, sizeof(hints));
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_NUMERICSERV;
	if (getaddrinfo(host, port, &hints, &res) || !res)
		return -EHOSTUNREACH;
	fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		rc = -errno;
		goto out;
	}
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	if (connect(fd, res->ai_addr, res->ai_addrlen) < 0) {
		rc = -errno;
		close(fd);
		goto out;
	}
	rc = fd;
out:
	freeaddrinfo(res);
	return rc;
}

/* GET http://addr/path; the body (NUL-terminated, malloc'ed) if the status is 200. */
int cli_http_get(const char *addr, const char *path, char **body, time_t *date)
{
	char req[512], *buf = NULL, *b;
	size_t len = 0, cap = 0;
	int fd, n, rc;

	*body = NULL;
	if (date)
		*date = 0;
	fd = dial(addr);
	if (fd < 0)
		return fd;
	n = snprintf(req, sizeof(req), "GET %s HTTP/1.0\r\nHost: %s\r\nAccept: text/plain\r\n\r\n",
		     path, addr);
	rc = stk_write_all(fd, req, (size_t)n);
	if (rc)
		goto out;
	for (;;) {
		ssize_t r;
		if (cap - len < 65536) {
			char *nb;
			rc = -EFBIG;
			if (cap >= CLI_HTTP_MAX)
				goto out;
			cap = cap ? cap * 2 : 262144;
			nb = realloc(buf, cap + 1);
			rc = -ENOMEM;
			if (!nb)
				goto out;
			buf = nb;
		}
		r = read(fd, buf + len, cap - len);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			rc = errno == EAGAIN ? -ETIMEDOUT : -errno;
			goto out;
		}
		if (r == 0)
			break;
		len += (size_t)r;
	}
	rc = -EBADMSG;
	if (!buf)
		goto out;
	buf[len] = 0;
	if (strncmp(buf, "HTTP/1.", 7) != 0 || strlen(buf) < 12 || strncmp(buf + 9, "200", 3) != 0)
		goto out;
	b = strstr(buf, "\r\n\r\n");
	if (!b)
		goto out;
	if (date)
		*date = header_date(buf, b);
	b += 4;
	memmove(buf, b, strlen(b) + 1);
	*body = buf;
	buf = NULL;
	rc = 0;
out:
	close(fd);
	free(buf);
	return rc;
}

/* ---- exposition ---- */

void cli_scrape_free(struct cli_scrape *sc)
{
	free(sc->text);
	free(sc->s);
	memset(sc, 0, sizeof(*sc));
}

/* Splits sample lines in place; comments and malformed lines are skipped. */
int cli_prom_parse(char *text, struct cli_scrape *sc)
{
	char *line = text;

	sc->text = text; /* sc owns it from now, whatever happens */
	while (line && *line) {
		char *nl = strchr(line, '\n'), *p = line, *v, *end;
		struct cli_sample smp = {.labels = ""};

		if (nl)
			*nl = 0;
		if (*line == '#' || !*line)
			goto next;
		smp.name = line;
		p = line + strcspn(line, "{ ");
		if (*p == '{') {
			char *q = p + 1;
			int inq = 0;
			*p = 0;
			smp.labels = q;
			/* the closing brace outside a quoted value */
			for (; *q && (inq || *q != '}'); q++) {
				if (inq && *q == '\\' && q[1])
					q++;
				else if (*q == '"')
					inq = !inq;
			}
			if (*q != '}')
				goto next;
			*q = 0;
			v = q + 1;
		} else if (*p == ' ') {
			*p = 0;
			v = p + 1;
		} else {
			goto next;
		}
		while (*v == ' ')
			v++;
		smp.value = strtod(v, &end);
		if (end == v)
			goto next;
		if (sc->n == sc->cap) {
			size_t nc = sc->cap ? sc->cap * 2 : 1024;
			struct cli_sample *ns = realloc(sc->s, nc * sizeof(*ns));
			if (!ns)
				return -ENOMEM;
			sc->s = ns;
			sc->cap = nc;
		}
		sc->s[sc->n++] = smp;
	next:
		line = nl ? nl + 1 : NULL;
	}
	return 0;
}

/* The value of label key in labels, unescaped into out. 0 or -ENOENT. */
int cli_prom_label(const char *labels, const char *key, char *out, size_t len)
{
	size_t klen = strlen(key);
	const char *p = labels;

	while (*p) {
		const char *eq = strchr(p, '=');
		size_t o = 0;
		int match;

		if (!eq || eq[1] != '"')
			return -ENOENT;
		match = (size_t)(eq - p) == klen && strncmp(p, key, klen) == 0;
		for (p = eq + 2; *p && *p != '"'; p++) {
			char c = *p;
			if (c == '\\' && p[1]) {
				p++;
				c = *p == 'n' ? '\n' : *p;
			}
			if (match && o + 1 < len)
				out[o++] = c;
		}
		if (match) {
			out[o] = 0;
			return 0;
		}
		if (*p == '"')
			p++;
		if (*p == ',')
			p++;
	}
	return -ENOENT;
}

static int matches(const struct cli_sample *s, const char *name, const struct cli_filt *f)
{
	char buf[128];

	if (strcmp(s->name, name) != 0)
		return 0;
	for (int i = 0; f && i < 2; i++)
		if (f->k[i] && (cli_prom_label(s->labels, f->k[i], buf, sizeof(buf)) ||
				strcmp(buf, f->v[i]) != 0))
			return 0;
	if (f && f->ops) {
		const char *const *op;

		if (cli_prom_label(s->labels, "op", buf, sizeof(buf)))
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
			    cli_prom_label(s->labels, "le", le, sizeof(le)))
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
