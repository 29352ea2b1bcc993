/*
 * mgmtd's /metrics reader (src/mgmtd/scrape.c): the exposition walker and its label
 * reader on tricky text, and the HTTP GET against a one-shot server in a thread of
 * this test (200, 404, an oversized body, nobody listening).
 */
#include "check.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/scrape.h"

struct seen {
	char names[8][64];
	char labels[8][128];
	double values[8];
	int n;
};

static void on_sample(void *ctx, const char *name, const char *labels, double value)
{
	struct seen *s = ctx;

	if (s->n == 8)
		return;
	snprintf(s->names[s->n], sizeof(s->names[0]), "%s", name);
	snprintf(s->labels[s->n], sizeof(s->labels[0]), "%s", labels);
	s->values[s->n++] = value;
}

static void test_parse(void)
{
	char text[] = "# HELP x a counter\n"
		      "# TYPE x counter\n"
		      "x 3\n"
		      "y{target=\"1\",op=\"read\",le=\"0.005\"} 7 1700000000\n"
		      "z{path=\"/a}b\\\"c\",client=\"10.0.0.1\"} 1.5e3\n"
		      "broken{unterminated=\"x 1\n"
		      "novalue\n"
		      "\n"
		      "last{} +Inf";
	struct seen s = {.n = 0};
	char v[32];

	stk_scrape_parse(text, on_sample, &s);
	CHECK_EQ(s.n, 4);
	if (s.n != 4)
		return;
	CHECK(strcmp(s.names[0], "x") == 0 && s.labels[0][0] == 0 && s.values[0] == 3);
	CHECK(strcmp(s.names[1], "y") == 0 && s.values[1] == 7);
	CHECK(strcmp(s.names[2], "z") == 0 && s.values[2] == 1500);
	CHECK(strcmp(s.names[3], "last") == 0 && s.values[3] > 1e308);
	CHECK_EQ(stk_scrape_label(s.labels[1], "op", v, sizeof(v)), 0);
	CHECK(strcmp(v, "read") == 0);
	CHECK_EQ(stk_scrape_label(s.labels[1], "le", v, sizeof(v)), 0);
	CHECK(strcmp(v, "0.005") == 0);
	/* a brace and an escaped quote inside a value neither end the labels nor the value */
	CHECK_EQ(stk_scrape_label(s.labels[2], "path", v, sizeof(v)), 0);
	CHECK(strcmp(v, "/a}b\"c") == 0);
	CHECK_EQ(stk_scrape_label(s.labels[2], "client", v, sizeof(v)), 0);
	CHECK(strcmp(v, "10.0.0.1") == 0);
	CHECK_RC(stk_scrape_label(s.labels[2], "target", v, sizeof(v)), -ENOENT);
	/* truncated to the buffer, still terminated */
	CHECK_EQ(stk_scrape_label(s.labels[2], "client", v, 4), 0);
	CHECK(strcmp(v, "10.") == 0);
}

struct server {
	int fd;
	const char *answer;
	size_t len;
};

/* Accepts one connection, reads the request's head, answers, closes. */
static void *serve_one(void *arg)
{
	struct server *sv = arg;
	char buf[1024];
	size_t got = 0;
	int c = accept(sv->fd, NULL, NULL);

	if (c < 0)
		return NULL;
	while (got < sizeof(buf) - 1) {
		ssize_t r = read(c, buf + got, sizeof(buf) - 1 - got);

		if (r <= 0)
			break;
		got += (size_t)r;
		buf[got] = 0;
		if (strstr(buf, "\r\n\r\n"))
			break;
	}
	for (size_t off = 0; off < sv->len;) {
		ssize_t w = write(c, sv->answer + off, sv->len - off);

		if (w <= 0)
			break;
		off += (size_t)w;
	}
	close(c);
	return NULL;
}

/* Serves answer once on a loopback port; the port in addr. */
static int get_once(const char *answer, size_t len, size_t max, char **body, time_t *date)
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t sl = sizeof(sa);
	struct server sv = {.answer = answer, .len = len};
	char addr[32];
	pthread_t t;
	int rc;

	sv.fd = socket(AF_INET, SOCK_STREAM, 0);
	if (sv.fd < 0 || bind(sv.fd, (struct sockaddr *)&sa, sizeof(sa)) || listen(sv.fd, 1) ||
	    getsockname(sv.fd, (struct sockaddr *)&sa, &sl))
		return -errno;
	snprintf(addr, sizeof(addr), "127.0.0.1:%u", ntohs(sa.sin_port));
	pthread_create(&t, NULL, serve_one, &sv);
	rc = stk_scrape_get_dated(addr, "/metrics", 2000, max, body, date);
	pthread_join(t, NULL);
	close(sv.fd);
	return rc;
}

static void test_get(void)
{
	static const char ok[] = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nx 1\n";
	static const char dated[] = "HTTP/1.1 200 OK\r\ndate: Sun, 06 Nov 1994 08:49:37 GMT\r\n"
				    "Content-Type: text/plain\r\n\r\ny 2\n";
	static const char nf[] = "HTTP/1.1 404 Not Found\r\n\r\nnot found\n";
	char *body = NULL, *big;
	size_t blen = 200000;
	time_t date = -1;
	int rc;

	CHECK_EQ(get_once(ok, sizeof(ok) - 1, 1 << 20, &body, &date), 0);
	CHECK(body && strcmp(body, "x 1\n") == 0);
	CHECK_EQ(date, 0); /* no Date header */
	free(body);
	CHECK_EQ(get_once(dated, sizeof(dated) - 1, 1 << 20, &body, &date), 0);
	CHECK(body && strcmp(body, "y 2\n") == 0);
	CHECK_EQ(date, 784111777); /* RFC 9110's example date */
	free(body);
	CHECK_RC(get_once(nf, sizeof(nf) - 1, 1 << 20, &body, NULL), -EBADMSG);
	CHECK(body == NULL);
	big = malloc(blen);
	CHECK(big != NULL);
	if (!big)
		return;
	memcpy(big, ok, sizeof(ok) - 1);
	memset(big + sizeof(ok) - 1, 'a', blen - (sizeof(ok) - 1));
	CHECK_RC(get_once(big, blen, 1000, &body, NULL), -EFBIG);
	free(big);
	/* nobody listens: refused at once, no wait */
	{
		int fd = socket(AF_INET, SOCK_STREAM, 0);
		struct sockaddr_in sa = {.sin_family = AF_INET,
					 .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
		socklen_t sl = sizeof(sa);
		char addr[32];

		CHECK(fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
		      getsockname(fd, (struct sockaddr *)&sa, &sl) == 0);
		snprintf(addr, sizeof(addr), "127.0.0.1:%u", ntohs(sa.sin_port));
		close(fd); /* bound, never listened: the port is free again */
		rc = stk_scrape_get(addr, "/metrics", 2000, 1 << 20, &body);
		CHECK(rc == -ECONNREFUSED);
	}
	CHECK_RC(stk_scrape_get("no port", "/metrics", 100, 1 << 20, &body), -EINVAL);
}

int main(void)
{
	CHECK_RUN(test_parse);
	CHECK_RUN(test_get);
	return check_done();
}
