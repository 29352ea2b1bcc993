/*
 * A small client of etcd's v3 JSON gateway (etcd 3.4: POST /v3/kv/range, /v3/kv/txn,
 * /v3/lease/grant, /v3/lease/keepalive, /v3/lease/revoke; keys and values in
 * base64, 64-bit integers as decimal strings), over libcurl with Jansson.
 *
 * mgmtd in cluster mode uses it for two things only: its state, one key whose value
 * is the state's bytes (state.h), and leader election, one key put with a lease if
 * absent (a txn on create_revision == 0). Writes of the state are txns guarded by
 * the leader key's create_revision, so a deposed leader's write fails instead of
 * overwriting its successor's. Consensus is etcd's; nothing here is more than the
 * requests.
 *
 * Every call blocks for at most about 2 s per endpoint and tries the endpoints in
 * turn, starting with the last one that answered. A handle may be used from any
 * thread; calls are serialised on its own lock.
 */
#ifndef STK_MGMTD_ETCD_H
#define STK_MGMTD_ETCD_H

#include <stddef.h>
#include <stdint.h>

struct stk_etcd;

/*
 * endpoints: "URL[,URL...]", each "http://HOST:PORT" or "HOST:PORT". 0, -EINVAL
 * (empty, too many, too long) or -ENOMEM.
 */
int stk_etcd_create(const char *endpoints, struct stk_etcd **out);
void stk_etcd_destroy(struct stk_etcd *e);

/* A new lease of ttl_s seconds into *id. 0 or -errno (-EIO: no endpoint answered). */
int stk_etcd_lease_grant(struct stk_etcd *e, unsigned ttl_s, int64_t *id);
/* Renews lease id: *ttl_s is what it has left, 0 when it is gone. 0 or -errno. */
int stk_etcd_lease_keepalive(struct stk_etcd *e, int64_t id, unsigned *ttl_s);
/* Ends lease id and deletes its keys. 0 or -errno. */
int stk_etcd_lease_revoke(struct stk_etcd *e, int64_t id);

/*
 * Reads key: *val (a new buffer, NUL-terminated beyond *len, free()) and its
 * *create_rev (may be NULL). 0, -ENOENT or -errno.
 */
int stk_etcd_get(struct stk_etcd *e, const char *key, uint8_t **val, size_t *len,
		 int64_t *create_rev);

/*
 * Puts key = value with lease if key does not exist. *won 1 and *create_rev the
 * key's create revision when it was put; *won 0 otherwise. 0 or -errno.
 */
int stk_etcd_put_if_absent(struct stk_etcd *e, const char *key, const void *value, size_t len,
			   int64_t lease, int *won, int64_t *create_rev);

/*
 * Puts key = value only while guard_key's create_revision is guard_rev (the
 * holder of guard_key has not changed). 0, -ESTALE (the guard failed: nothing
 * written) or -errno.
 */
int stk_etcd_put_guarded(struct stk_etcd *e, const char *key, const void *value, size_t len,
			 const char *guard_key, int64_t guard_rev);

#endif
