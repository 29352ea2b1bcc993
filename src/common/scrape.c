/*
 * The /metrics reader (see scrape.h).
 *
 * HTTP/1.0 with one request per connection, read to EOF: the daemons' endpoint
 * (libmicrohttpd) closes after answering a 1.0 request, so there is no chunked
 * encoding or keep-alive to handle. The connect is non-blocking with a poll, so
 * that a node that is gone (its address black-holed, as a cut network does) costs
 * the sampler timeout_ms and no more.
 */
#include "scrape.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "util.h"

/* Connects to addr within timeout_ms; the socket, blocking with that timeout, or -errno. */
static int dial(const char *addr, unsigned timeout_ms)
{
	char host[256], port[8];
	uint16_t p;
	struct addrinfo hints, *res = NULL;
	struct timeval tv = {.tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000};
	struct pollfd pfd;
	socklen_t elen = sizeof(int);
	int fd = -1, err = 0, rc;

	if (stk_parse_hostport(addr, host, sizeof(host), &p))
		return -EINVAL;
	snprintf(port, sizeof(port), "%u", p);
	memset(&hints, 0, sizeof(hints));
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_NUMERICSERV;
	if (getaddrinfo(host, port, &hints, &res) || !res)
		return -EHOSTUNREACH;
	fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0) {
		rc = -errno;
		goto out;
	}
	if (connect(fd, res->ai_addr, res->ai_addrlen) < 0) {
		rc = -errno;
		if (rc != -EINPROGRESS)
			goto out;
		pfd.fd = fd;
		pfd.events = POLLOUT;
		rc = poll(&pfd, 1, (int)timeout_ms);
		if (rc <= 0) {
			rc = rc ? -errno : -ETIMEDOUT;
			goto out;
		}
		if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen) < 0 || err) {
			rc = err ? -err : -errno;
			goto out;
		}
	}
	rc = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
	if (rc < 0) {
		rc = -errno;
		goto out;
	}
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	rc = fd;
	fd = -1;
out:
	if (fd >= 0)
		close(fd);
	freeaddrinfo(res);
	return rc;
}

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

int stk_scrape_get(const char *addr, const char *path, unsigned timeout_ms, size_t max, char **body)
{
	return stk_scrape_get_dated(addr, path, timeout_ms, max, body, NULL);
}

int stk_scrape_get_dated(const char *addr, const char *path, unsigned timeout_ms, size_t max,
			 char **body, time_t *date)
{
	char req[512], *buf = NULL, *b;
	size_t len = 0, cap = 0;
	int fd, n, rc;

	*body = NULL;
	if (date)
		*date = 0;
	fd = dial(addr, timeout_ms);
	if (fd < 0)
		return fd;
	n = snprintf(req, sizeof(req), "GET %s HTTP/1.0\r\nHost: %s\r\nAccept: text/plain\r\n\r\n",
		     path, addr);
	rc = -EINVAL;
	if (n < 0 || (size_t)n >= sizeof(req))
		goto out;
	rc = stk_write_all(fd, req, (size_t)n);
	if (rc)
		goto out;
	for (;;) {
		ssize_t r;

		if (cap - len < 16384) {
			char *nb;

			rc = -EFBIG;
			if (cap >= max + 4096)
				goto out;
			cap = cap ? cap * 2 : 65536;
			rc = -ENOMEM;
			nb = realloc(buf, cap + 1);
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
	if (len < 12 || strncmp(buf, "HTTP/1.", 7) != 0 || strncmp(buf + 9, "200", 3) != 0)
		goto out;
	b = strstr(buf, "\r\n\r\n");
	if (!b)
		goto out;
	if (date)
		*date = header_date(buf, b);
	b += 4;
	rc = -EFBIG;
	if ((size_t)(buf + len - b) > max)
		goto out;
	memmove(buf, b, (size_t)(buf + len - b) + 1);
	*body = buf;
	buf = NULL;
	rc = 0;
out:
	close(fd);
	free(buf);
	return rc;
}

void stk_scrape_parse(char *text,
		      void (*fn)(void *ctx, const char *name, const char *labels, double value),
		      void *ctx)
{
	char *line = text;

	while (line && *line) {
		char *nl = strchr(line, '\n'), *p, *v, *end;
		const char *labels = "";
		double value;

		if (nl)
			*nl = 0;
		if (*line == '#' || !*line)
			goto next;
		p = line + strcspn(line, "{ ");
		if (*p == '{') {
			char *q = p + 1;
			int inq = 0;

			*p = 0;
			labels = q;
			/* the closing brace outside a quoted value (values may hold braces) */
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
		value = strtod(v, &end);
		if (end != v)
			fn(ctx, line, labels, value);
	next:
		line = nl ? nl + 1 : NULL;
	}
}

int stk_scrape_label(const char *labels, const char *key, char *out, size_t len)
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
			if (len)
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
