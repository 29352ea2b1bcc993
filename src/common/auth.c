/*
 * The cluster key and the handshake's MACs (auth.h): key files in, key files out,
 * and thin wrappers over OpenSSL's RAND_bytes, HMAC and CRYPTO_memcmp. The wire
 * side of the handshake is in net/net.c (client) and net/server.c (server).
 */
#include "auth.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#define KEY_FILE_MAX 1024 /* hex digits and whitespace: far more than a key needs */

static int hexval(int ch)
{
	if (ch >= '0' && ch <= '9')
		return ch - '0';
	if (ch >= 'a' && ch <= 'f')
		return ch - 'a' + 10;
	if (ch >= 'A' && ch <= 'F')
		return ch - 'A' + 10;
	return -1;
}

/*
 * OpenSSL, told not to tear itself down at exit: a daemon's exit() runs the atexit
 * handlers while a loop thread may still be in a handshake's HMAC or RAND_bytes,
 * and OpenSSL's cleanup then frees what that thread uses (ASan saw a double free
 * in mgmtd as it stopped). The process is ending anyway.
 */
static pthread_once_t ssl_once = PTHREAD_ONCE_INIT;

static void ssl_init(void)
{
	OPENSSL_init_crypto(OPENSSL_INIT_NO_ATEXIT, NULL);
}

int stk_auth_key_load(const char *path, uint8_t key[STK_AUTH_KEY_MAX], size_t *len, char *err,
		      size_t errlen)
{
	char buf[KEY_FILE_MAX + 1];
	struct stat st;
	size_t n = 0, got = 0;
	int fd, rc = 0, hi = -1;

	pthread_once(&ssl_once, ssl_init); /* before anything else of OpenSSL's */
	ssize_t r;

	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		rc = -errno;
		snprintf(err, errlen, "cannot open key file %s: %s", path, strerror(-rc));
		return rc;
	}
	if (fstat(fd, &st) < 0) {
		rc = -errno;
		snprintf(err, errlen, "cannot stat key file %s: %s", path, strerror(-rc));
		goto out;
	}
	if (st.st_mode & (S_IRWXG | S_IRWXO)) {
		rc = -EPERM;
		snprintf(err, errlen,
			 "key file %s has mode %04o: its group or others may read it; the key "
			 "must be its owner's alone (chmod 600 %s)",
			 path, (unsigned)(st.st_mode & 07777), path);
		goto out;
	}
	while (n < sizeof(buf) && (r = read(fd, buf + n, sizeof(buf) - n)) != 0) {
		if (r < 0) {
			if (errno == EINTR)
				continue;
			rc = -errno;
			snprintf(err, errlen, "cannot read key file %s: %s", path, strerror(-rc));
			goto out;
		}
		n += (size_t)r;
	}
	if (n > KEY_FILE_MAX)
		goto bad;
	for (size_t i = 0; i < n; i++) {
		int v = hexval((unsigned char)buf[i]);

		if (v < 0) {
			if (buf[i] == ' ' || buf[i] == '\t' || buf[i] == '\n' || buf[i] == '\r')
				continue;
			goto bad;
		}
		if (hi < 0) {
			hi = v;
			continue;
		}
		if (got == STK_AUTH_KEY_MAX)
			goto bad;
		key[got++] = (uint8_t)(hi << 4 | v);
		hi = -1;
	}
	if (hi >= 0 || got < STK_AUTH_KEY_MIN)
		goto bad;
	*len = got;
	goto out;
bad:
	rc = -EINVAL;
	snprintf(err, errlen,
		 "key file %s is not a key: it must hold %u to %u bytes as hex digits "
		 "(`stoker admin init --key FILE` makes one)",
		 path, STK_AUTH_KEY_MIN, STK_AUTH_KEY_MAX);
out:
	OPENSSL_cleanse(buf, sizeof(buf));
	close(fd);
	return rc;
}

int stk_auth_key_create(const char *path)
{
	static const char hex[] = "0123456789abcdef";
	uint8_t key[STK_AUTH_KEY_MIN];
	char text[2 * STK_AUTH_KEY_MIN + 1], tmp[4096];
	int fd, rc = 0;

	if (access(path, F_OK) == 0)
		return -EEXIST;
	if ((size_t)snprintf(tmp, sizeof(tmp), "%s.tmp%d", path, (int)getpid()) >= sizeof(tmp))
		return -ENAMETOOLONG;
	rc = stk_auth_random(key, sizeof(key));
	if (rc)
		return rc;
	for (size_t i = 0; i < sizeof(key); i++) {
		text[2 * i] = hex[key[i] >> 4];
		text[2 * i + 1] = hex[key[i] & 0xf];
	}
	text[2 * sizeof(key)] = '\n';
	fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd < 0) {
		rc = -errno;
		goto out;
	}
	if (fchmod(fd, 0600) < 0 || write(fd, text, sizeof(text)) != (ssize_t)sizeof(text) ||
	    fsync(fd) < 0) {
		rc = errno ? -errno : -EIO;
		close(fd);
		unlink(tmp);
		goto out;
	}
	close(fd);
	/* link(), not rename(): a key made meanwhile by another is never replaced. */
	if (link(tmp, path) < 0)
		rc = -errno;
	unlink(tmp);
out:
	OPENSSL_cleanse(key, sizeof(key));
	OPENSSL_cleanse(text, sizeof(text));
	return rc;
}

int stk_auth_random(void *buf, size_t n)
{
	pthread_once(&ssl_once, ssl_init);
	return RAND_bytes(buf, (int)n) == 1 ? 0 : -EIO;
}

static const char *const labels[2] = {"stoker-auth-1 server", "stoker-auth-1 client"};

int stk_auth_mac(const uint8_t *key, size_t key_len, enum stk_auth_side side,
		 const uint8_t nc[STK_AUTH_NONCE], const uint8_t ns[STK_AUTH_NONCE],
		 uint8_t mac[STK_AUTH_MAC])
{
	uint8_t msg[32 + 2 * STK_AUTH_NONCE];
	size_t ll = strlen(labels[side]);
	unsigned int mlen = 0;

	pthread_once(&ssl_once, ssl_init);
	memcpy(msg, labels[side], ll);
	memcpy(msg + ll, nc, STK_AUTH_NONCE);
	memcpy(msg + ll + STK_AUTH_NONCE, ns, STK_AUTH_NONCE);
	if (!HMAC(EVP_sha256(), key, (int)key_len, msg, ll + 2 * STK_AUTH_NONCE, mac, &mlen) ||
	    mlen != STK_AUTH_MAC)
		return -EIO;
	return 0;
}

int stk_auth_verify(const uint8_t *key, size_t key_len, enum stk_auth_side side,
		    const uint8_t nc[STK_AUTH_NONCE], const uint8_t ns[STK_AUTH_NONCE],
		    const uint8_t mac[STK_AUTH_MAC])
{
	uint8_t want[STK_AUTH_MAC];
	int ok;

	if (stk_auth_mac(key, key_len, side, nc, ns, want))
		return 0;
	ok = CRYPTO_memcmp(want, mac, STK_AUTH_MAC) == 0;
	OPENSSL_cleanse(want, sizeof(want));
	return ok;
}
