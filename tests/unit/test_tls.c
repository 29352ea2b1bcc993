/*
 * Unit test of net/tls.c over a socketpair, both ends non-blocking and stepped by
 * hand as the event loops step them: the handshake on one key completes both ways
 * and data of every shape (a small frame gathered from pieces, 4 MiB of bulk, many
 * small writes) arrives whole and in order; another key, a peer that speaks
 * plaintext, garbage and a truncated record fail with the errors tls.h promises,
 * never a crash; the derived identity is the same for one key and differs between
 * two. A client key's handshake proves exactly the policy its identity names: the
 * server hands that policy over; an edited one, another cluster's or a removed
 * generation is refused.
 */
#include <errno.h>
#include <stdio.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/util.h"
#include "net/tls.h"
#include "check.h"

static uint8_t key_a[32], key_b[32];

/* A set-up step the rest cannot do without: the program stops (exit 1). */
#define MUST(cond)                                                                                 \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			fprintf(stderr, "%s:%d: %s failed\n", __FILE__, __LINE__, #cond);          \
			exit(1);                                                                   \
		}                                                                                  \
	} while (0)

static void pair(int sv[2])
{
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv)) {
		perror("socketpair");
		exit(1);
	}
}

/* Steps both handshakes until neither waits; their results in *rs and *rc. */
static void handshake(struct stk_tls *srv, struct stk_tls *cli, int *rs, int *rc)
{
	int ww;

	*rs = *rc = -EAGAIN;
	for (int i = 0; i < 100 && (*rs == -EAGAIN || *rc == -EAGAIN); i++) {
		if (*rc == -EAGAIN)
			*rc = stk_tls_handshake(cli, &ww);
		if (*rs == -EAGAIN)
			*rs = stk_tls_handshake(srv, &ww);
	}
}

static void test_derive(void)
{
	uint8_t p1[STK_TLS_PSK_LEN], p2[STK_TLS_PSK_LEN];
	char i1[STK_TLS_ID_LEN], i2[STK_TLS_ID_LEN];

	CHECK_RC(stk_tls_derive(key_a, sizeof(key_a), p1, i1), 0);
	CHECK_RC(stk_tls_derive(key_a, sizeof(key_a), p2, i2), 0);
	CHECK(memcmp(p1, p2, sizeof(p1)) == 0 && strcmp(i1, i2) == 0);
	CHECK(strncmp(i1, "stoker-tls-1 ", 13) == 0 && strlen(i1) == 29);
	CHECK_RC(stk_tls_derive(key_b, sizeof(key_b), p2, i2), 0);
	CHECK(memcmp(p1, p2, sizeof(p1)) != 0 && strcmp(i1, i2) != 0);
	/* the identity is public: it must not be the PSK, nor the key */
	CHECK(memcmp(p1, key_a, sizeof(p1)) != 0);
}

/* Sends all of iov from a to b, reading b as it goes; the bytes b got. */
static size_t move(struct stk_tls *a, struct stk_tls *b, struct iovec *iov, int n, uint8_t *got,
		   size_t cap)
{
	size_t have = 0;

	for (int spins = 0; spins < 100000 && (n > 0 || have < cap); spins++) {
		ssize_t r;

		if (n > 0) {
			r = stk_tls_sendv(a, iov, n);
			if (r > 0) {
				while (r > 0 && n > 0) {
					size_t step =
					    (size_t)r < iov->iov_len ? (size_t)r : iov->iov_len;

					iov->iov_base = (char *)iov->iov_base + step;
					iov->iov_len -= step;
					r -= (ssize_t)step;
					if (!iov->iov_len) {
						iov++;
						n--;
					}
				}
			} else if (r != -EAGAIN) {
				CHECK_RC(r, -EAGAIN);
				break;
			}
		}
		r = stk_tls_recv(b, got + have, cap - have);
		if (r > 0)
			have += (size_t)r;
		else if (r != -EAGAIN)
			break;
	}
	return have;
}

static void test_data(void)
{
	struct stk_tls_server *ts;
	struct stk_tls *srv, *cli;
	int sv[2], rs, rc;
	size_t big = 4u << 20, got;
	uint8_t *bulk = malloc(big), *in = malloc(big + 256), hdr[40], pl[100];
	struct iovec iov[3];

	if (!bulk || !in)
		exit(1);
	for (size_t i = 0; i < big; i++)
		bulk[i] = (uint8_t)(i * 7 + (i >> 12));
	memset(hdr, 0x11, sizeof(hdr));
	memset(pl, 0x22, sizeof(pl));
	pair(sv);
	MUST(stk_tls_server_create(key_a, sizeof(key_a), &ts) == 0);
	MUST(stk_tls_accept_new(ts, sv[0], &srv) == 0);
	MUST(stk_tls_connect_new(sv[1], key_a, sizeof(key_a), &cli) == 0);
	handshake(srv, cli, &rs, &rc);
	CHECK_RC(rs, 0);
	CHECK_RC(rc, 0);
	/* a frame: three pieces, the last far larger than the socket's buffer */
	iov[0] = (struct iovec){hdr, sizeof(hdr)};
	iov[1] = (struct iovec){pl, sizeof(pl)};
	iov[2] = (struct iovec){bulk, big};
	got = move(cli, srv, iov, 3, in, sizeof(hdr) + sizeof(pl) + big);
	CHECK_EQ(got, sizeof(hdr) + sizeof(pl) + big);
	CHECK(memcmp(in, hdr, sizeof(hdr)) == 0);
	CHECK(memcmp(in + sizeof(hdr), pl, sizeof(pl)) == 0);
	CHECK(memcmp(in + sizeof(hdr) + sizeof(pl), bulk, big) == 0);
	/* and back, in many small writes */
	for (int i = 0; i < 1000; i++) {
		iov[0] = (struct iovec){bulk + i * 13, 13};
		CHECK_EQ(move(srv, cli, iov, 1, in, 13), 13);
		CHECK(memcmp(in, bulk + i * 13, 13) == 0);
	}
	CHECK(!stk_tls_pending(cli));
	/* the peer closes: end of stream, then a write fails */
	stk_tls_free(srv);
	close(sv[0]);
	CHECK_RC(stk_tls_recv(cli, in, 10), 0);
	iov[0] = (struct iovec){pl, sizeof(pl)};
	for (int i = 0; i < 10; i++) {
		ssize_t r = stk_tls_sendv(cli, iov, 1);

		if (r < 0) {
			CHECK(r == -EPIPE || r == -ECONNRESET);
			break;
		}
	}
	stk_tls_free(cli);
	close(sv[1]);
	stk_tls_server_destroy(ts);
	free(bulk);
	free(in);
}

static void test_wrong_key(void)
{
	struct stk_tls_server *ts;
	struct stk_tls *srv, *cli;
	int sv[2], rs, rc;

	pair(sv);
	MUST(stk_tls_server_create(key_a, sizeof(key_a), &ts) == 0);
	MUST(stk_tls_accept_new(ts, sv[0], &srv) == 0);
	MUST(stk_tls_connect_new(sv[1], key_b, sizeof(key_b), &cli) == 0);
	handshake(srv, cli, &rs, &rc);
	CHECK_RC(rs, -EKEYREJECTED);
	CHECK_EQ(stk_tls_fail_reason(srv), STK_TLS_FAIL_WRONG_KEY);
	CHECK_RC(rc, -EKEYREJECTED);
	CHECK(strstr(stk_tls_why(cli), "another cluster key") != NULL);
	stk_tls_free(srv);
	stk_tls_free(cli);
	close(sv[0]);
	close(sv[1]);
	stk_tls_server_destroy(ts);
}

/* What the server makes of bytes that are no handshake of ours. */
static int server_meets(const void *bytes, size_t len, int close_after)
{
	struct stk_tls_server *ts;
	struct stk_tls *srv;
	int sv[2], ww, rc = -EAGAIN;

	pair(sv);
	MUST(stk_tls_server_create(key_a, sizeof(key_a), &ts) == 0);
	MUST(stk_tls_accept_new(ts, sv[0], &srv) == 0);
	CHECK_EQ(write(sv[1], bytes, len), (ssize_t)len);
	if (close_after)
		close(sv[1]);
	for (int i = 0; i < 10 && rc == -EAGAIN; i++)
		rc = stk_tls_handshake(srv, &ww);
	CHECK(stk_tls_why(srv)[0] != 0 || rc == -EAGAIN);
	stk_tls_free(srv);
	close(sv[0]);
	if (!close_after)
		close(sv[1]);
	stk_tls_server_destroy(ts);
	return rc;
}

static void test_hostile(void)
{
	uint8_t junk[600];
	/* a handshake record header announcing 16 KiB, then the end */
	static const uint8_t trunc[] = {0x16, 0x03, 0x01, 0x40, 0x00, 0x01, 0x00};
	/* an application-data record before any handshake */
	static const uint8_t early[] = {0x17, 0x03, 0x03, 0x00, 0x05, 1, 2, 3, 4, 5};
	int rc;

	for (size_t i = 0; i < sizeof(junk); i++)
		junk[i] = (uint8_t)(i * 31 + 7);
	CHECK_RC(server_meets(junk, sizeof(junk), 0), -EPROTO);
	CHECK_RC(server_meets(early, sizeof(early), 0), -EPROTO);
	rc = server_meets(trunc, sizeof(trunc), 1);
	CHECK(rc == -ECONNRESET || rc == -EPROTO);
	CHECK_RC(server_meets(trunc, sizeof(trunc), 0), -EAGAIN); /* waits for the rest */
	CHECK_RC(server_meets("", 0, 1), -ECONNRESET);
}

/* A client whose server speaks plaintext and closes: a clear -ECONNRESET. */
static void test_plain_server(void)
{
	struct stk_tls *cli;
	int sv[2], ww, rc = -EAGAIN;
	char buf[512];

	pair(sv);
	MUST(stk_tls_connect_new(sv[1], key_a, sizeof(key_a), &cli) == 0);
	CHECK_RC(stk_tls_handshake(cli, &ww), -EAGAIN);
	CHECK(read(sv[0], buf, sizeof(buf)) > 0); /* the ClientHello, taken for a frame */
	close(sv[0]);
	for (int i = 0; i < 10 && rc == -EAGAIN; i++)
		rc = stk_tls_handshake(cli, &ww);
	CHECK_RC(rc, -ECONNRESET);
	CHECK(strstr(stk_tls_why(cli), "without TLS") != NULL);
	stk_tls_free(cli);
	close(sv[1]);
}

static int revoked_bob2(const char *name, uint64_t gen)
{
	return strcmp(name, "bob") == 0 && gen == 2;
}

/*
 * A client key's handshake with a server holding key: the server's result, and
 * the policy it proved (*out, or NULL); the client's result in *rcli.
 */
static enum stk_tls_fail last_fail;

static int client_meets(const uint8_t *key, const struct stk_auth_client *claimed,
			const struct stk_auth_client *keyed, struct stk_auth_client **out,
			int *rcli)
{
	struct stk_tls_server *ts;
	struct stk_tls *srv, *cli;
	uint8_t ckey[STK_AUTH_MAC];
	int sv[2], rs;

	pair(sv);
	MUST(stk_tls_server_create(key, 32, &ts) == 0);
	stk_tls_server_set_revoked(ts, revoked_bob2);
	MUST(stk_tls_accept_new(ts, sv[0], &srv) == 0);
	/* the key of one policy, offered under (maybe) another */
	MUST(stk_auth_client_key(key_a, sizeof(key_a), keyed, ckey) == 0);
	MUST(stk_tls_connect_client_new(sv[1], claimed, ckey, &cli) == 0);
	handshake(srv, cli, &rs, rcli);
	*out = stk_tls_client_take(srv);
	last_fail = stk_tls_fail_reason(srv);
	if (rs == -EKEYREJECTED && last_fail == STK_TLS_FAIL_REVOKED)
		CHECK(strcmp(stk_tls_why(srv), "client bob, generation 2") == 0);
	if (rs)
		CHECK(*out == NULL);
	CHECK(stk_tls_client_take(srv) == NULL); /* handed over once */
	stk_tls_free(srv);
	stk_tls_free(cli);
	close(sv[0]);
	close(sv[1]);
	stk_tls_server_destroy(ts);
	return rs;
}

static void test_client_keys(void)
{
	struct stk_auth_client bob = {.name = "bob",
				      .gen = 1,
				      .flags = STK_CLIENT_RO,
				      .anon_uid = 65534,
				      .anon_gid = 65534,
				      .subtree = "/team A"},
			       c, *got;
	uint8_t psk[STK_TLS_PSK_LEN], ckey[STK_AUTH_MAC] = {1};
	char id[STK_TLS_CLIENT_ID_MAX];
	int rc;

	/* the identity: canonical, parsed back exactly, nothing else accepted */
	CHECK_RC(stk_tls_client_derive(&bob, ckey, psk, id), 0);
	CHECK(strcmp(id, "stoker-tls-c1 bob 1 1 65534 65534 /team A") == 0);
	CHECK_RC(stk_tls_client_parse(id, strlen(id), &c), 0);
	CHECK(memcmp(&c, &bob, sizeof(c)) == 0);
	static const char *const bad[] = {
	    "stoker-tls-c1 bob 01 1 65534 65534 /t",
	    "stoker-tls-c1 bob +1 1 65534 65534 /t",
	    "stoker-tls-c1 bob 1 8 65534 65534 /t",
	    "stoker-tls-c1 bob 1 6 65534 65534 /t",
	    "stoker-tls-c1 bob 1 1 4294967296 1 /t",
	    "stoker-tls-c1 b/b 1 1 1 1 /t",
	    "stoker-tls-c1 bob 1 1 1 1 /t/../x",
	    "stoker-tls-c1 bob 1 1 1 1 t",
	    "stoker-tls-c1 bob 1 1 1 1 /t/",
	    "stoker-tls-c1  1 1 1 1 /t",
	    "stoker-tls-c1 bob 1 1 1 1",
	    "stoker-tls-c1 bob 18446744073709551616 0 1 1 /",
	    "stoker-tls-1 bob 1 1 1 1 /t",
	    "",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		CHECK_RC(stk_tls_client_parse(bad[i], strlen(bad[i]), &c), -EINVAL);
	CHECK_RC(stk_tls_client_parse("stoker-tls-c1 bob 1 1 1 1 /\0x", 31, &c), -EINVAL);
	/* a different key gives a different PSK */
	{
		uint8_t psk2[STK_TLS_PSK_LEN], ckey2[STK_AUTH_MAC] = {2};

		CHECK_RC(stk_tls_client_derive(&bob, ckey2, psk2, id), 0);
		CHECK(memcmp(psk, psk2, sizeof(psk)) != 0);
	}

	/* the right key for its policy: in, and the server holds that policy */
	CHECK_RC(client_meets(key_a, &bob, &bob, &got, &rc), 0);
	CHECK_RC(rc, 0);
	CHECK(got && memcmp(got, &bob, sizeof(*got)) == 0);
	free(got);
	/* an edited policy (wider subtree, read-write, another name): refused */
	c = bob;
	stk_strlcpy(c.subtree, "/", sizeof(c.subtree));
	CHECK_RC(client_meets(key_a, &c, &bob, &got, &rc), -EKEYREJECTED);
	CHECK_RC(rc, -EKEYREJECTED);
	CHECK_EQ(last_fail, STK_TLS_FAIL_WRONG_KEY);
	c = bob;
	c.flags = 0;
	CHECK_RC(client_meets(key_a, &c, &bob, &got, &rc), -EKEYREJECTED);
	c = bob;
	stk_strlcpy(c.name, "bobby", sizeof(c.name));
	CHECK_RC(client_meets(key_a, &c, &bob, &got, &rc), -EKEYREJECTED);
	/* another cluster's server: refused */
	CHECK_RC(client_meets(key_b, &bob, &bob, &got, &rc), -EKEYREJECTED);
	CHECK_RC(rc, -EKEYREJECTED);
	/* a removed generation: refused as removed, before any PSK is derived */
	c = bob;
	c.gen = 2;
	CHECK_RC(client_meets(key_a, &c, &c, &got, &rc), -EKEYREJECTED);
	CHECK_RC(rc, -EKEYREJECTED);
	CHECK_EQ(last_fail, STK_TLS_FAIL_REVOKED);
}

int main(void)
{
	for (size_t i = 0; i < sizeof(key_a); i++) {
		key_a[i] = (uint8_t)i;
		key_b[i] = (uint8_t)(0xff - i);
	}
	CHECK_RUN(test_derive);
	CHECK_RUN(test_data);
	CHECK_RUN(test_wrong_key);
	CHECK_RUN(test_hostile);
	CHECK_RUN(test_plain_server);
	CHECK_RUN(test_client_keys);
	return check_done();
}
