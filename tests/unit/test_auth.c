/*
 * Unit test of common/auth.c: the handshake's MACs against values computed
 * independently (Python's hmac module: HMAC-SHA256 of label | Nc | Ns), the two
 * sides' labels kept apart, a MAC that differs in any byte or under another key or
 * nonce refused, and the key file rules (made 0600, never overwritten, refused when
 * others may read it or when it is not hex of 32..64 bytes).
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/auth.h"
#include "net/net.h"
#include "check.h"

static void unhex(const char *h, uint8_t *out)
{
	for (size_t i = 0; h[2 * i]; i++) {
		unsigned v;

		sscanf(h + 2 * i, "%2x", &v);
		out[i] = (uint8_t)v;
	}
}

static void test_mac(void)
{
	uint8_t key[32], nc[32], ns[32], mac[32], want[32], other[32];

	for (int i = 0; i < 32; i++)
		key[i] = (uint8_t)i;
	memset(nc, 0xaa, sizeof(nc));
	memset(ns, 0x55, sizeof(ns));
	CHECK_RC(stk_auth_mac(key, sizeof(key), STK_AUTH_SERVER, nc, ns, mac), 0);
	unhex("e829faacb5914cec89e380bb2f2f52a711525cb3ef3e3e0946d8f3097084e527", want);
	CHECK(memcmp(mac, want, 32) == 0);
	CHECK(stk_auth_verify(key, sizeof(key), STK_AUTH_SERVER, nc, ns, mac));
	/* The server's answer is no client proof. */
	CHECK(!stk_auth_verify(key, sizeof(key), STK_AUTH_CLIENT, nc, ns, mac));
	CHECK_RC(stk_auth_mac(key, sizeof(key), STK_AUTH_CLIENT, nc, ns, mac), 0);
	unhex("6610777bf4398859849da0adca69d4cad861182fd9bf8ffa91776750bba84b6f", want);
	CHECK(memcmp(mac, want, 32) == 0);
	/* Any byte changed, another nonce (a replay), another key: refused. */
	for (int i = 0; i < 32; i++) {
		mac[i] ^= 1;
		CHECK(!stk_auth_verify(key, sizeof(key), STK_AUTH_CLIENT, nc, ns, mac));
		mac[i] ^= 1;
	}
	CHECK(stk_auth_verify(key, sizeof(key), STK_AUTH_CLIENT, nc, ns, mac));
	memcpy(other, ns, sizeof(other));
	other[31] ^= 0x80;
	CHECK(!stk_auth_verify(key, sizeof(key), STK_AUTH_CLIENT, nc, other, mac));
	key[0] ^= 1;
	CHECK(!stk_auth_verify(key, sizeof(key), STK_AUTH_CLIENT, nc, ns, mac));
	/* Random nonces differ. */
	CHECK_RC(stk_auth_random(nc, sizeof(nc)), 0);
	CHECK_RC(stk_auth_random(ns, sizeof(ns)), 0);
	CHECK(memcmp(nc, ns, sizeof(nc)) != 0);
}

static int write_text(const char *path, const char *text, mode_t mode)
{
	FILE *f;

	unlink(path);
	f = fopen(path, "w");
	if (!f)
		return -1;
	fputs(text, f);
	fclose(f);
	return chmod(path, mode);
}

static void test_key_files(void)
{
	char dir[256], path[512], err[512];
	uint8_t key[STK_AUTH_KEY_MAX], key2[STK_AUTH_KEY_MAX];
	size_t len = 0, len2 = 0;
	struct stat st;

	if (check_tmpdir(dir, sizeof(dir), "auth")) {
		CHECK(0);
		return;
	}
	snprintf(path, sizeof(path), "%s/cluster.key", dir);
	CHECK_RC(stk_auth_key_create(path), 0);
	CHECK(stat(path, &st) == 0 && (st.st_mode & 0777) == 0600);
	CHECK_RC(stk_auth_key_load(path, key, &len, err, sizeof(err)), 0);
	CHECK(len == STK_AUTH_KEY_MIN);
	/* Never over an existing key. */
	CHECK_RC(stk_auth_key_create(path), -EEXIST);
	CHECK_RC(stk_auth_key_load(path, key2, &len2, err, sizeof(err)), 0);
	CHECK(len2 == len && memcmp(key, key2, len) == 0);
	/* Readable by its group or others: refused, and said why. */
	CHECK(chmod(path, 0644) == 0);
	CHECK_RC(stk_auth_key_load(path, key2, &len2, err, sizeof(err)), -EPERM);
	CHECK(strstr(err, "chmod 600") != NULL);
	CHECK(chmod(path, 0640) == 0);
	CHECK_RC(stk_auth_key_load(path, key2, &len2, err, sizeof(err)), -EPERM);
	/* Not a key: too short, odd digits, not hex, too long. */
	CHECK(write_text(path, "00112233\n", 0600) == 0);
	CHECK_RC(stk_auth_key_load(path, key2, &len2, err, sizeof(err)), -EINVAL);
	CHECK(write_text(path, "0011223344556677889900112233445566778899001122334455667788990011f\n",
			 0600) == 0);
	CHECK_RC(stk_auth_key_load(path, key2, &len2, err, sizeof(err)), -EINVAL);
	CHECK(write_text(path, "zz11223344556677889900112233445566778899001122334455667788990011\n",
			 0600) == 0);
	CHECK_RC(stk_auth_key_load(path, key2, &len2, err, sizeof(err)), -EINVAL);
	{
		char big[2 * STK_AUTH_KEY_MAX + 4];

		memset(big, 'a', 2 * STK_AUTH_KEY_MAX + 2);
		big[2 * STK_AUTH_KEY_MAX + 2] = 0;
		CHECK(write_text(path, big, 0600) == 0);
		CHECK_RC(stk_auth_key_load(path, key2, &len2, err, sizeof(err)), -EINVAL);
	}
	/* Upper case and spaces are fine. */
	CHECK(write_text(path,
			 "00112233 44556677 8899AABB CCDDEEFF 00112233 44556677 8899aabb ccddeeff\n",
			 0600) == 0);
	CHECK_RC(stk_auth_key_load(path, key2, &len2, err, sizeof(err)), 0);
	CHECK(len2 == 32 && key2[10] == 0xaa && key2[31] == 0xff);
	snprintf(path, sizeof(path), "%s/none.key", dir);
	CHECK_RC(stk_auth_key_load(path, key2, &len2, err, sizeof(err)), -ENOENT);
	check_rm_rf(dir);
}

/* A process holds the 8 keys it added last: a ninth drops the oldest, never fails. */
static void test_process_keys(void)
{
	uint8_t key[32];

	for (int i = 0; i < 9; i++) {
		memset(key, 'a' + i, sizeof(key));
		CHECK_RC(stk_net_auth_set(key, sizeof(key)), 0);
	}
	CHECK(stk_net_auth_keys() == 8);
	memset(key, 'a', sizeof(key)); /* the one dropped, back */
	CHECK_RC(stk_net_auth_set(key, sizeof(key)), 0);
	memset(key, 'i', sizeof(key)); /* held: moved, not added */
	CHECK_RC(stk_net_auth_set(key, sizeof(key)), 0);
	CHECK(stk_net_auth_keys() == 8);
	CHECK_RC(stk_net_auth_set(key, 8), -EINVAL);
}

int main(void)
{
	CHECK_RUN(test_mac);
	CHECK_RUN(test_key_files);
	CHECK_RUN(test_process_keys);
	return check_done();
}
