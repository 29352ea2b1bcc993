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

/* ---- client identities ---- */

#define CLIENT_FILE_MAX 4096
#define CLIENT_FILE_MAGIC "stoker-client-key 1\n"

int stk_auth_client_valid(const struct stk_auth_client *c, char *err, size_t errlen)
{
	size_t n = strnlen(c->name, sizeof(c->name)), sl = strnlen(c->subtree, sizeof(c->subtree));
	const char *p;

	if (n == 0 || n > STK_CLIENT_NAME_MAX) {
		snprintf(err, errlen, "a client name has 1 to %u characters", STK_CLIENT_NAME_MAX);
		return -EINVAL;
	}
	for (size_t i = 0; i < n; i++) {
		char ch = c->name[i];

		if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
		      (ch >= '0' && ch <= '9') || ch == '.' || ch == '_' || ch == '-')) {
			snprintf(err, errlen,
				 "client name '%s': only letters, digits, '.', '_' and '-'",
				 c->name);
			return -EINVAL;
		}
	}
	if (c->flags & ~STK_CLIENT_FLAGS) {
		snprintf(err, errlen, "client %s: unknown policy flags %#x", c->name, c->flags);
		return -EINVAL;
	}
	if ((c->flags & STK_CLIENT_SQUASH_ROOT) && (c->flags & STK_CLIENT_SQUASH_ALL)) {
		snprintf(err, errlen, "client %s: squash root or squash all, not both", c->name);
		return -EINVAL;
	}
	if (sl == 0 || sl > STK_CLIENT_SUBTREE_MAX || c->subtree[0] != '/') {
		snprintf(err, errlen,
			 "client %s: the subtree must be an absolute path of at most %u "
			 "bytes",
			 c->name, STK_CLIENT_SUBTREE_MAX);
		return -EINVAL;
	}
	for (p = c->subtree; *p;) {
		const char *e;
		size_t cl;

		p++; /* the '/' */
		e = strchr(p, '/');
		cl = e ? (size_t)(e - p) : strlen(p);
		if ((cl == 0 && (e || p != c->subtree + 1)) || (cl == 1 && p[0] == '.') ||
		    (cl == 2 && p[0] == '.' && p[1] == '.') || cl > 255) {
			snprintf(err, errlen,
				 "client %s: subtree '%s' is not a plain path (no '.', '..', '//' "
				 "or trailing '/')",
				 c->name, c->subtree);
			return -EINVAL;
		}
		for (size_t i = 0; i < cl; i++)
			if ((unsigned char)p[i] < 0x20) {
				snprintf(err, errlen, "client %s: subtree has a control character",
					 c->name);
				return -EINVAL;
			}
		if (!e)
			break;
		p = e;
	}
	return 0;
}

int stk_auth_client_key(const uint8_t *cluster_key, size_t key_len, const struct stk_auth_client *c,
			uint8_t out[STK_AUTH_MAC])
{
	char text[STK_CLIENT_NAME_MAX + STK_CLIENT_SUBTREE_MAX + 128];
	unsigned int mlen = 0;
	int n;

	pthread_once(&ssl_once, ssl_init);
	/* The subtree last: it is the only field that may hold any byte but NUL. */
	n = snprintf(text, sizeof(text),
		     "stoker-client-1\nname=%s\ngen=%llu\nflags=%u\nanon=%u:%u\nsubtree=%s",
		     c->name, (unsigned long long)c->gen, c->flags, c->anon_uid, c->anon_gid,
		     c->subtree);
	if (n < 0 || (size_t)n >= sizeof(text))
		return -EINVAL;
	if (!HMAC(EVP_sha256(), cluster_key, (int)key_len, (const uint8_t *)text, (size_t)n, out,
		  &mlen) ||
	    mlen != STK_AUTH_MAC)
		return -EIO;
	return 0;
}

int stk_auth_vouch_key(const uint8_t *cluster_key, size_t key_len, uint8_t out[STK_AUTH_MAC])
{
	static const char label[] = "stoker-vouch-1 key";
	unsigned int mlen = 0;

	pthread_once(&ssl_once, ssl_init);
	if (!HMAC(EVP_sha256(), cluster_key, (int)key_len, (const uint8_t *)label,
		  sizeof(label) - 1, out, &mlen) ||
	    mlen != STK_AUTH_MAC)
		return -EIO;
	return 0;
}

static int vouch_mac(const uint8_t vkey[STK_AUTH_MAC], const struct stk_auth_client *c,
		     const struct stk_auth_vouch *v, uint8_t out[STK_AUTH_MAC])
{
	char text[STK_CLIENT_NAME_MAX + STK_CLIENT_SUBTREE_MAX + 256];
	unsigned int mlen = 0;
	int n;

	pthread_once(&ssl_once, ssl_init);
	/* the subtree last, as in the client key's text: it may hold any byte but NUL */
	n = snprintf(text, sizeof(text),
		     "stoker-vouch-1\nino=%llu\ncount=%llu\nexpires=%llu\nepoch=%llu\nname=%s\n"
		     "gen=%llu\nflags=%u\nanon=%u:%u\nsubtree=%s",
		     (unsigned long long)v->ino, (unsigned long long)v->count,
		     (unsigned long long)v->expires_ms, (unsigned long long)v->epoch, c->name,
		     (unsigned long long)c->gen, c->flags, c->anon_uid, c->anon_gid, c->subtree);
	if (n < 0 || (size_t)n >= sizeof(text))
		return -EINVAL;
	if (!HMAC(EVP_sha256(), vkey, STK_AUTH_MAC, (const uint8_t *)text, (size_t)n, out, &mlen) ||
	    mlen != STK_AUTH_MAC)
		return -EIO;
	return 0;
}

int stk_auth_vouch_sign(const uint8_t vkey[STK_AUTH_MAC], const struct stk_auth_client *c,
			struct stk_auth_vouch *v)
{
	return vouch_mac(vkey, c, v, v->mac);
}

int stk_auth_vouch_check(const uint8_t vkey[STK_AUTH_MAC], const struct stk_auth_client *c,
			 const struct stk_auth_vouch *v)
{
	uint8_t want[STK_AUTH_MAC];

	if (vouch_mac(vkey, c, v, want))
		return 0;
	return CRYPTO_memcmp(want, v->mac, STK_AUTH_MAC) == 0;
}

const char *stk_auth_client_flags_str(uint32_t flags, char *buf, size_t len)
{
	snprintf(buf, len, "%s%s%s", flags & STK_CLIENT_RO ? "read-only" : "read-write",
		 flags & STK_CLIENT_SQUASH_ROOT ? ",squash-root" : "",
		 flags & STK_CLIENT_SQUASH_ALL ? ",squash-all" : "");
	return buf;
}

int stk_auth_client_save(const char *path, const struct stk_auth_client *c,
			 const uint8_t key[STK_AUTH_MAC])
{
	static const char hex[] = "0123456789abcdef";
	char text[CLIENT_FILE_MAX], khex[2 * STK_AUTH_MAC + 1], fl[64];
	int fd, n, rc = 0;

	for (size_t i = 0; i < STK_AUTH_MAC; i++) {
		khex[2 * i] = hex[key[i] >> 4];
		khex[2 * i + 1] = hex[key[i] & 0xf];
	}
	khex[2 * STK_AUTH_MAC] = 0;
	n = snprintf(
	    text, sizeof(text),
	    CLIENT_FILE_MAGIC "# %s (stoker admin client add; docs/security.md)\n"
			      "name %s\ngen %llu\nflags %u\nanon %u %u\nsubtree %s\nkey %s\n",
	    stk_auth_client_flags_str(c->flags, fl, sizeof(fl)), c->name,
	    (unsigned long long)c->gen, c->flags, c->anon_uid, c->anon_gid, c->subtree, khex);
	OPENSSL_cleanse(khex, sizeof(khex));
	if (n < 0 || (size_t)n >= sizeof(text))
		return -EINVAL;
	fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd < 0) {
		rc = -errno;
		goto out;
	}
	if (fchmod(fd, 0600) < 0 || write(fd, text, (size_t)n) != n || fsync(fd) < 0) {
		rc = errno ? -errno : -EIO;
		close(fd);
		unlink(path);
		goto out;
	}
	close(fd);
out:
	OPENSSL_cleanse(text, sizeof(text));
	return rc;
}

static int read_small(const char *path, char *buf, size_t cap, size_t *len, struct stat *st)
{
	size_t n = 0;
	ssize_t r;
	int fd = open(path, O_RDONLY | O_CLOEXEC), rc = 0;

	if (fd < 0)
		return -errno;
	if (fstat(fd, st) < 0) {
		rc = -errno;
		goto out;
	}
	while (n < cap && (r = read(fd, buf + n, cap - n)) != 0) {
		if (r < 0) {
			if (errno == EINTR)
				continue;
			rc = -errno;
			goto out;
		}
		n += (size_t)r;
	}
	*len = n;
out:
	close(fd);
	return rc;
}

int stk_auth_client_file(const char *path)
{
	char buf[sizeof(CLIENT_FILE_MAGIC)];
	struct stat st;
	size_t n = 0;
	int rc = read_small(path, buf, sizeof(buf) - 1, &n, &st);

	if (rc)
		return rc;
	return n >= strlen("stoker-client-key") && memcmp(buf, "stoker-client-key", 17) == 0;
}

int stk_auth_client_load(const char *path, struct stk_auth_client *c, uint8_t key[STK_AUTH_MAC],
			 char *err, size_t errlen)
{
	char buf[CLIENT_FILE_MAX + 1], why[256];
	struct stat st;
	size_t n = 0;
	unsigned have = 0;
	int rc;
	char *line, *next;

	memset(c, 0, sizeof(*c));
	rc = read_small(path, buf, CLIENT_FILE_MAX + 1, &n, &st);
	if (rc) {
		snprintf(err, errlen, "cannot read client key file %s: %s", path, strerror(-rc));
		return rc;
	}
	if (st.st_mode & (S_IRWXG | S_IRWXO)) {
		snprintf(err, errlen,
			 "key file %s has mode %04o: its group or others may read it; the key "
			 "must be its owner's alone (chmod 600 %s)",
			 path, (unsigned)(st.st_mode & 07777), path);
		rc = -EPERM;
		goto out;
	}
	rc = -EINVAL;
	if (n > CLIENT_FILE_MAX || n < strlen(CLIENT_FILE_MAGIC) ||
	    memcmp(buf, CLIENT_FILE_MAGIC, strlen(CLIENT_FILE_MAGIC)) != 0) {
		snprintf(why, sizeof(why), "not a version 1 client key file");
		goto bad;
	}
	buf[n] = 0;
	for (line = buf + strlen(CLIENT_FILE_MAGIC); *line; line = next) {
		char *sp, *val, *end;
		unsigned long long v;

		next = strchr(line, '\n');
		if (!next) {
			snprintf(why, sizeof(why), "the last line has no newline");
			goto bad;
		}
		*next++ = 0;
		if (line[0] == '#' || line[0] == 0)
			continue;
		sp = strchr(line, ' ');
		if (!sp) {
			snprintf(why, sizeof(why), "line '%.40s' has no value", line);
			goto bad;
		}
		*sp = 0;
		val = sp + 1;
		if (strcmp(line, "name") == 0 && !(have & 1)) {
			if (strlen(val) > STK_CLIENT_NAME_MAX)
				goto badval;
			memcpy(c->name, val, strlen(val) + 1);
			have |= 1;
		} else if (strcmp(line, "gen") == 0 && !(have & 2)) {
			errno = 0;
			v = strtoull(val, &end, 10);
			if (errno || *end || end == val)
				goto badval;
			c->gen = v;
			have |= 2;
		} else if (strcmp(line, "flags") == 0 && !(have & 4)) {
			errno = 0;
			v = strtoull(val, &end, 10);
			if (errno || *end || end == val || v > STK_CLIENT_FLAGS)
				goto badval;
			c->flags = (uint32_t)v;
			have |= 4;
		} else if (strcmp(line, "anon") == 0 && !(have & 8)) {
			unsigned long long g;

			errno = 0;
			v = strtoull(val, &end, 10);
			if (errno || *end != ' ' || end == val || v > UINT32_MAX)
				goto badval;
			g = strtoull(end + 1, &end, 10);
			if (errno || *end || g > UINT32_MAX)
				goto badval;
			c->anon_uid = (uint32_t)v;
			c->anon_gid = (uint32_t)g;
			have |= 8;
		} else if (strcmp(line, "subtree") == 0 && !(have & 16)) {
			if (strlen(val) > STK_CLIENT_SUBTREE_MAX)
				goto badval;
			memcpy(c->subtree, val, strlen(val) + 1);
			have |= 16;
		} else if (strcmp(line, "key") == 0 && !(have & 32)) {
			if (strlen(val) != 2 * STK_AUTH_MAC)
				goto badval;
			for (size_t i = 0; i < STK_AUTH_MAC; i++) {
				int hi = hexval((unsigned char)val[2 * i]);
				int lo = hexval((unsigned char)val[2 * i + 1]);

				if (hi < 0 || lo < 0)
					goto badval;
				key[i] = (uint8_t)(hi << 4 | lo);
			}
			have |= 32;
		} else {
			snprintf(why, sizeof(why), "unknown or repeated field '%.40s'", line);
			goto bad;
		}
		continue;
	badval:
		snprintf(why, sizeof(why), "bad value for '%s'", line);
		goto bad;
	}
	if (have != 63) {
		snprintf(why, sizeof(why),
			 "a field is missing (name, gen, flags, anon, subtree, key)");
		goto bad;
	}
	rc = stk_auth_client_valid(c, why, sizeof(why));
	if (rc == 0)
		goto out;
bad:
	rc = -EINVAL;
	snprintf(err, errlen, "client key file %s: %s (`stoker admin client add` makes one)", path,
		 why);
	OPENSSL_cleanse(key, STK_AUTH_MAC);
out:
	OPENSSL_cleanse(buf, sizeof(buf));
	return rc;
}
