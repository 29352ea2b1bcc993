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

/*
 * Client keys: HMAC-SHA256(cluster key, the canonical policy), against Python's
 * hmac; any change of the policy changes the key; policies that are not well
 * formed refused; a key file written and read back whole, refused when edited
 * into nonsense or readable by others.
 */
static void test_client_keys(void)
{
	struct stk_auth_client c, back;
	uint8_t key[32], ck[32], want[32], other[32], ck2[32];
	char dir[256], path[512], err[512];
	struct stat st;

	for (int i = 0; i < 32; i++)
		key[i] = (uint8_t)i;
	memset(&c, 0, sizeof(c));
	snprintf(c.name, sizeof(c.name), "alice");
	c.gen = 7;
	c.flags = STK_CLIENT_RO | STK_CLIENT_SQUASH_ROOT;
	c.anon_uid = 65534;
	c.anon_gid = 65533;
	snprintf(c.subtree, sizeof(c.subtree), "/team A");
	CHECK_RC(stk_auth_client_valid(&c, err, sizeof(err)), 0);
	CHECK_RC(stk_auth_client_key(key, sizeof(key), &c, ck), 0);
	unhex("d4448b12eced6de28e1bb5e4eaa69d9a5b256305ed0c821fb2e209a1dce17f1f", want);
	CHECK(memcmp(ck, want, 32) == 0);
	/* every field is in it */
	back = c;
	back.flags = STK_CLIENT_SQUASH_ROOT; /* read-write */
	CHECK_RC(stk_auth_client_key(key, sizeof(key), &back, other), 0);
	CHECK(memcmp(other, ck, 32) != 0);
	back = c;
	snprintf(back.subtree, sizeof(back.subtree), "/");
	CHECK_RC(stk_auth_client_key(key, sizeof(key), &back, other), 0);
	CHECK(memcmp(other, ck, 32) != 0);
	back = c;
	back.gen = 8;
	CHECK_RC(stk_auth_client_key(key, sizeof(key), &back, other), 0);
	CHECK(memcmp(other, ck, 32) != 0);

	/* malformed policies */
	static const char *const bad_subtrees[] = {"", "a", "/a/", "//a", "/a//b", "/./a",
						   "/a/..", "/a\nb"};
	for (size_t i = 0; i < sizeof(bad_subtrees) / sizeof(bad_subtrees[0]); i++) {
		back = c;
		snprintf(back.subtree, sizeof(back.subtree), "%s", bad_subtrees[i]);
		CHECK_RC(stk_auth_client_valid(&back, err, sizeof(err)), -EINVAL);
	}
	back = c;
	snprintf(back.name, sizeof(back.name), "a/b");
	CHECK_RC(stk_auth_client_valid(&back, err, sizeof(err)), -EINVAL);
	back.name[0] = 0;
	CHECK_RC(stk_auth_client_valid(&back, err, sizeof(err)), -EINVAL);
	back = c;
	back.flags = STK_CLIENT_SQUASH_ROOT | STK_CLIENT_SQUASH_ALL;
	CHECK_RC(stk_auth_client_valid(&back, err, sizeof(err)), -EINVAL);
	back.flags = 64;
	CHECK_RC(stk_auth_client_valid(&back, err, sizeof(err)), -EINVAL);

	/* the key file */
	if (check_tmpdir(dir, sizeof(dir), "authc")) {
		CHECK(0);
		return;
	}
	snprintf(path, sizeof(path), "%s/alice.key", dir);
	unlink(path);
	CHECK_RC(stk_auth_client_save(path, &c, ck), 0);
	CHECK(stat(path, &st) == 0 && (st.st_mode & 0777) == 0600);
	CHECK_RC(stk_auth_client_save(path, &c, ck), -EEXIST);
	CHECK(stk_auth_client_file(path) == 1);
	CHECK_RC(stk_auth_client_load(path, &back, ck2, err, sizeof(err)), 0);
	CHECK(memcmp(&back, &c, sizeof(c)) == 0 && memcmp(ck2, ck, 32) == 0);
	CHECK(chmod(path, 0644) == 0);
	CHECK_RC(stk_auth_client_load(path, &back, ck2, err, sizeof(err)), -EPERM);
	CHECK(write_text(path, "stoker-client-key 1\nname alice\n", 0600) == 0);
	CHECK_RC(stk_auth_client_load(path, &back, ck2, err, sizeof(err)), -EINVAL);
	CHECK(strstr(err, "missing") != NULL);
	CHECK(write_text(path,
			 "stoker-client-key 1\nname alice\ngen 1\nflags 0\nanon 1 1\nsubtree "
			 "/a/../b\nkey 00\n",
			 0600) == 0);
	CHECK_RC(stk_auth_client_load(path, &back, ck2, err, sizeof(err)), -EINVAL);
	/* a cluster key file is not a client key file */
	CHECK(write_text(path, "00112233445566778899001122334455667788990011223344556677889900\n",
			 0600) == 0);
	CHECK(stk_auth_client_file(path) == 0);
	unlink(path);
	rmdir(dir);
}

int main(void)
{
	CHECK_RUN(test_mac);
	CHECK_RUN(test_key_files);
	CHECK_RUN(test_process_keys);
	CHECK_RUN(test_client_keys);
	return check_done();
}
