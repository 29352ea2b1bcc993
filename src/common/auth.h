/*
 * The cluster secret and the handshake that proves it (docs/security.md).
 *
 * A cluster has one secret key: STK_AUTH_KEY_MIN..STK_AUTH_KEY_MAX random bytes,
 * kept as hex digits on one line of a file that only its owner may read (mode 0600;
 * a file that its group or others can read is refused). Every connection to mgmtd,
 * meta and storage starts with a mutual challenge-response keyed by it:
 *
 *	client -> server  AUTH_HELLO  Nc (32 random bytes)
 *	server -> client  reply       Ns (32 random bytes), HMAC(K, "stoker-auth-1 server" Nc Ns)
 *	client -> server  AUTH_PROOF  HMAC(K, "stoker-auth-1 client" Nc Ns)
 *	server -> client  reply       OK (or AUTH, and the connection closes)
 *
 * HMAC is HMAC-SHA256 from OpenSSL. Each side checks the other's MAC with
 * CRYPTO_memcmp (constant time). Both nonces are fresh per connection, so a proof
 * recorded from one connection proves nothing on another (its Ns differs), and the
 * two MACs differ by their labels, so a server's answer is no client proof. Nothing
 * here is cryptography of our own: the nonces come from RAND_bytes, the MACs from
 * OpenSSL's HMAC.
 *
 * Thread rules: every function may be called from any thread; none keeps state.
 */
#ifndef STK_COMMON_AUTH_H
#define STK_COMMON_AUTH_H

#include <stddef.h>
#include <stdint.h>

#define STK_AUTH_KEY_MIN 32u
#define STK_AUTH_KEY_MAX 64u
#define STK_AUTH_NONCE 32u
#define STK_AUTH_MAC 32u /* SHA-256 */

/* Which side's MAC: the labels make them different. */
enum stk_auth_side { STK_AUTH_SERVER = 0, STK_AUTH_CLIENT = 1 };

/*
 * Reads a key file: hex digits (upper or lower case), optional whitespace and a
 * final newline; STK_AUTH_KEY_MIN to STK_AUTH_KEY_MAX bytes. Fills key and *len.
 * 0, or -errno with a line in err (at most errlen bytes, NUL-terminated) that says
 * what is wrong for a person: -ENOENT and the other open errors, -EPERM (the file
 * is readable by its group or others: "chmod 600 FILE"), -EINVAL (not a key).
 */
int stk_auth_key_load(const char *path, uint8_t key[STK_AUTH_KEY_MAX], size_t *len, char *err,
		      size_t errlen);

/*
 * Creates a key file at path with a fresh STK_AUTH_KEY_MIN-byte key, mode 0600,
 * failing with -EEXIST if the file is there (never overwrites a cluster's key).
 * The file is written whole under another name and renamed into place, so a
 * reader never sees half a key. 0 or -errno.
 */
int stk_auth_key_create(const char *path);

/* n cryptographically random bytes (RAND_bytes). 0 or -EIO. */
int stk_auth_random(void *buf, size_t n);

/*
 * mac = HMAC-SHA256(key, label(side) | nc | ns): the server's answer or the
 * client's proof. 0 or -EIO (OpenSSL failed).
 */
int stk_auth_mac(const uint8_t *key, size_t key_len, enum stk_auth_side side,
		 const uint8_t nc[STK_AUTH_NONCE], const uint8_t ns[STK_AUTH_NONCE],
		 uint8_t mac[STK_AUTH_MAC]);

/*
 * 1 when mac is side's MAC for (nc, ns) under key, else 0. Constant time in the
 * MAC's bytes (CRYPTO_memcmp).
 */
int stk_auth_verify(const uint8_t *key, size_t key_len, enum stk_auth_side side,
		    const uint8_t nc[STK_AUTH_NONCE], const uint8_t ns[STK_AUTH_NONCE],
		    const uint8_t mac[STK_AUTH_MAC]);

/*
 * Client identities (docs/security.md, "Client keys"). A client key is not a
 * secret of its own: it is HMAC-SHA256(cluster key, the client's canonical
 * policy), so any daemon holding the cluster key recomputes it from the policy
 * the client presents and needs no lookup, and a client that alters its policy
 * (another subtree, read-write for read-only) holds no key for it. The handshake
 * is the cluster key's, keyed by the client key, and opened by AUTH_HELLO_CLIENT,
 * which carries the policy. gen is mgmtd's number for this issue of the name:
 * removing a client revokes (name, gen); adding the name again issues a new gen.
 */
#define STK_CLIENT_NAME_MAX 63u
#define STK_CLIENT_SUBTREE_MAX 1023u
#define STK_CLIENT_RO 1u	  /* every change refused: EROFS */
#define STK_CLIENT_SQUASH_ROOT 2u /* uid 0 (and gid 0) act as anon_uid, anon_gid */
#define STK_CLIENT_SQUASH_ALL 4u  /* every uid and gid acts as anon_uid, anon_gid */
#define STK_CLIENT_FLAGS 7u
#define STK_CLIENT_ANON_DEFAULT 65534u /* nobody, nogroup */

struct stk_auth_client {
	char name[STK_CLIENT_NAME_MAX + 1];
	uint64_t gen;
	uint32_t flags; /* STK_CLIENT_* */
	uint32_t anon_uid, anon_gid;
	/* "/" for the whole namespace, else an absolute path without ".", ".." or "//" */
	char subtree[STK_CLIENT_SUBTREE_MAX + 1];
};

/*
 * 0 when c is a well-formed policy: a name of 1 to STK_CLIENT_NAME_MAX bytes of
 * [A-Za-z0-9._-], known flags, at most one squash, a normalised absolute subtree.
 * -EINVAL with a line for a person in err otherwise.
 */
int stk_auth_client_valid(const struct stk_auth_client *c, char *err, size_t errlen);
/* out = HMAC-SHA256(cluster key, canonical text of c). 0 or -EIO. */
int stk_auth_client_key(const uint8_t *cluster_key, size_t key_len, const struct stk_auth_client *c,
			uint8_t out[STK_AUTH_MAC]);
/*
 * Writes a client key file (mode 0600; -EEXIST if path exists: never overwrites):
 * the policy as "field value" lines and the key as hex. 0 or -errno.
 */
int stk_auth_client_save(const char *path, const struct stk_auth_client *c,
			 const uint8_t key[STK_AUTH_MAC]);
/*
 * 1 when the file at path is a client key file (it starts "stoker-client-key"),
 * 0 when not, -errno when it cannot be read.
 */
int stk_auth_client_file(const char *path);
/* Reads a client key file: the same rules and errors as stk_auth_key_load. */
int stk_auth_client_load(const char *path, struct stk_auth_client *c, uint8_t key[STK_AUTH_MAC],
			 char *err, size_t errlen);
/*
 * Vouchers (docs/security.md, "Vouchers"): meta's word to storage that inodes
 * [ino, ino + count) lie under a subtree client's root, so that storage serves
 * their chunks without asking meta (META_WITHIN). A voucher is good for one client
 * key (name, generation, policy), until expires_ms (Unix time, ms), and while
 * meta's epoch is still `epoch` (meta moves it on every rename that could take
 * something out of a subtree). Its MAC is HMAC-SHA256 under the vouch key, which
 * meta and storage derive from the cluster key and no client holds:
 *
 *	vouch key = HMAC(K, "stoker-vouch-1 key")
 *	mac       = HMAC(vouch key, "stoker-vouch-1" policy ino count expires epoch)
 */
struct stk_auth_vouch {
	uint64_t ino, count;
	uint64_t expires_ms;
	uint64_t epoch;
	uint8_t mac[STK_AUTH_MAC];
};
/* out = the vouch key of cluster key K. 0 or -EIO. */
int stk_auth_vouch_key(const uint8_t *cluster_key, size_t key_len, uint8_t out[STK_AUTH_MAC]);
/* v->mac = the MAC of v's other fields for client c. 0, -EINVAL or -EIO. */
int stk_auth_vouch_sign(const uint8_t vkey[STK_AUTH_MAC], const struct stk_auth_client *c,
			struct stk_auth_vouch *v);
/* 1 when v->mac is the MAC of v for client c under vkey (CRYPTO_memcmp), else 0. */
int stk_auth_vouch_check(const uint8_t vkey[STK_AUTH_MAC], const struct stk_auth_client *c,
			 const struct stk_auth_vouch *v);

/* "read-only,squash-root" or "rw", into buf. Returns buf. */
const char *stk_auth_client_flags_str(uint32_t flags, char *buf, size_t len);

#endif
