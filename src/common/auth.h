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

#endif
