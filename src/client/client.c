/*
 * The client handle: finding the cluster, keeping the routing table, and calling
 * meta with retries.
 *
 * Routing is fetched from mgmtd at connect time and again whenever a server
 * answers STALE_ROUTING or a node cannot be reached; readers take a read lock on
 * it only long enough to copy out an address. Transport failures (a daemon being
 * restarted, a reset connection) are retried with backoff for retry_ms
 * (STOKER_RETRY_MS, default 15 s) before the caller sees -EIO, so a cluster that
 * comes back within that window is invisible to the program using it.
 */
#include "client.h"
#include "behind.h"
#include "lcache.h"
#include "session.h"
#include "vouch.h"

#include <errno.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../common/host.h"
#include "../common/layout.h"
#include "../chunk/chunkfile.h"
#include "../chunk/servemap.h"
#include "../common/log.h"
#include "../common/util.h"
#include "../proto/status.h"

#define STK_RESP_SMALL 8192

/* The opts size a caller must have passed for field f to be there (opts grow at the end). */
#define STK_OPTS_HAVE(f)                                                                           \
	(offsetof(struct stk_client_opts, f) + sizeof(((struct stk_client_opts *)0)->f))

const char *stk_strerror(int err)
{
	const char *s;

	if (err < 0)
		err = -err;
	if (err == EKEYREJECTED)
		return "the cluster refused this process's key, or requires one it does not hold "
		       "(--key-file, $STOKER_KEY_FILE; docs/security.md)";
	s = strerrordesc_np(err);
	return s ? s : "Unknown error";
}

static int is_transport_error(int rc)
{
	switch (rc) {
	case -ECONNREFUSED:
	case -ECONNRESET:
	case -EPIPE:
	case -ETIMEDOUT:
	case -ENOTCONN:
	case -EHOSTUNREACH:
	case -ECONNABORTED:
	case -EBADMSG: /* a malformed reply: the connection was dropped */
		return 1;
	default:
		return 0;
	}
}

/* Parses "stk://HOST:PORT", "stk://HOST:PORT/..." or "HOST:PORT" into addr. */
int stk_client_parse_cluster(const char *s, char *addr, size_t len)
{
	const char *p = s, *end;
	struct stk_mgmt_addrs l;

	if (strncmp(p, "stk://", 6) == 0)
		p += 6;
	end = strchr(p, '/');
	if (!end)
		end = p + strlen(p);
	if ((size_t)(end - p) >= len)
		return -EINVAL;
	memcpy(addr, p, (size_t)(end - p));
	addr[end - p] = 0;
	return stk_mgmt_addrs_parse(&l, addr); /* one mgmtd, or several: "a,b,c" */
}

/* The default cluster: $STOKER_CLUSTER, else the one `stoker up` recorded. */
int stk_client_default_cluster(char *addr, size_t len)
{
	const char *env = getenv("STOKER_CLUSTER");
	char path[128], buf[STK_MGMT_LIST_MAX + 16];
	FILE *f;
	size_t n;

	if (env && *env)
		return stk_client_parse_cluster(env, addr, len);
	snprintf(path, sizeof(path), "/tmp/stoker-%u/cluster", (unsigned)getuid());
	f = fopen(path, "r");
	if (!f)
		return -ENOENT;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = 0;
	while (n && (buf[n - 1] == '\n' || buf[n - 1] == ' '))
		buf[--n] = 0;
	return stk_client_parse_cluster(buf, addr, len);
}

/*
 * For the call watch (net.h): whether the storage node at addr is no longer an
 * ONLINE node of the cluster, by the table fetched again (at most twice a second).
 * A read or write stuck on a node cut off by the network then fails as soon as
 * mgmtd has given up on the node, and is sent again on the chain that goes on
 * without it, instead of waiting out the RPC timeout.
 */
static int node_gone(void *ctx, const char *addr)
{
	struct stk_client *c = ctx;
	int online = 0;

	if (stk_now_ns() - c->watch_refreshed_ns > 500000000ull) {
		c->watch_refreshed_ns = stk_now_ns();
		(void)stk_client_refresh_routing(c);
	}
	pthread_rwlock_rdlock(&c->rt_lock);
	for (uint32_t i = 0; i < c->rt.nnodes && !online; i++)
		online = c->rt.nodes[i].state == STK_NODE_ONLINE &&
			 strcmp(c->rt.nodes[i].addr, addr) == 0;
	pthread_rwlock_unlock(&c->rt_lock);
	return !online;
}

/*
 * Whether `stoker up --tls` recorded TLS for one of list's addresses: its key
 * record (/tmp/stoker-UID/keys/ADDR) has a second line "tls".
 */
static int recorded_tls(const char *list)
{
	struct stk_mgmt_addrs l;
	char path[128], buf[4096];

	if (stk_mgmt_addrs_parse(&l, list))
		return 0;
	for (unsigned i = 0; i < l.n; i++) {
		FILE *f;
		size_t n;

		snprintf(path, sizeof(path), "/tmp/stoker-%u/keys/%s", (unsigned)getuid(),
			 l.addr[i]);
		f = fopen(path, "r");
		if (!f)
			continue;
		n = fread(buf, 1, sizeof(buf) - 1, f);
		fclose(f);
		buf[n] = 0;
		if (strstr(buf, "\ntls\n"))
			return 1;
	}
	return 0;
}

int stk_client_auth_find(const char *list, const char *key_file)
{
	char err[512], path[128], kpath[4096];
	struct stk_mgmt_addrs l;
	const char *strict = getenv("STOKER_AUTH"), *tls = getenv("STOKER_TLS");
	int rc;

	if (strict && strcmp(strict, "strict") == 0)
		stk_net_auth_strict();
	if (tls && *tls) {
		if (strcmp(tls, "1") && strcmp(tls, "0")) {
			stk_error("bad STOKER_TLS '%s': 1 (TLS) or 0 (plaintext)", tls);
			return -EINVAL;
		}
		stk_net_tls_set(strcmp(tls, "1") == 0);
	} else if (recorded_tls(list)) {
		stk_net_tls_set(1);
	}
	if (!key_file || !*key_file)
		key_file = getenv("STOKER_KEY_FILE");
	if (key_file && *key_file) {
		rc = stk_net_auth_load(key_file, err, sizeof(err));
		if (rc)
			stk_error("%s", err);
		return rc;
	}
	if (stk_mgmt_addrs_parse(&l, list))
		return 0;
	for (unsigned i = 0; i < l.n; i++) {
		FILE *f;
		size_t n;

		snprintf(path, sizeof(path), "/tmp/stoker-%u/keys/%s", (unsigned)getuid(),
			 l.addr[i]);
		f = fopen(path, "r");
		if (!f)
			continue;
		n = fread(kpath, 1, sizeof(kpath) - 1, f);
		fclose(f);
		kpath[n] = 0;
		kpath[strcspn(kpath, "\n")] = 0;
		if (kpath[0] && stk_net_auth_load(kpath, err, sizeof(err)) == 0)
			return 0;
	}
	return 0;
}

int stk_connect(const char *cluster, const struct stk_client_opts *opts, stk_client **out)
{
	struct stk_client *c;
	const char *e;
	uint64_t v;
	int rc;

	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	rc = cluster ? stk_client_parse_cluster(cluster, c->mgmtd, sizeof(c->mgmtd))
		     : stk_client_default_cluster(c->mgmtd, sizeof(c->mgmtd));
	if (rc == 0)
		rc = stk_mgmt_addrs_parse(&c->mgmt, c->mgmtd);
	if (rc)
		goto out_free;
	rc = stk_client_auth_find(c->mgmtd, opts && opts->size >= STK_OPTS_HAVE(key_file)
						     ? opts->key_file
						     : NULL);
	if (rc)
		goto out_free;
	if (opts && opts->size >= STK_OPTS_HAVE(auth_strict) && opts->auth_strict)
		stk_net_auth_strict();
	if (opts && opts->size >= STK_OPTS_HAVE(tls) && opts->tls)
		stk_net_tls_set(1);
	pthread_mutex_init(&c->mgmt_lock, NULL);
	if (opts) {
		size_t n = opts->size < sizeof(c->opts) ? opts->size : sizeof(c->opts);
		memcpy(&c->opts, opts, n);
	}
	c->opts.size = sizeof(c->opts);
	if (!c->opts.conns_per_node)
		c->opts.conns_per_node = STK_POOL_DEFAULT_CONNS;
	if (!c->opts.write_buffer)
		c->opts.write_buffer = 4u << 20;
	c->cred.uid = (opts && opts->size >= STK_OPTS_HAVE(gid) && (opts->uid || opts->gid))
			      ? (uint32_t)opts->uid
			      : (uint32_t)geteuid();
	c->cred.gid = (opts && opts->size >= STK_OPTS_HAVE(gid) && (opts->uid || opts->gid))
			      ? (uint32_t)opts->gid
			      : (uint32_t)getegid();
	if (c->cred.uid == (uint32_t)geteuid()) {
		gid_t groups[STK_MAX_GROUPS];
		int ng = getgroups(STK_MAX_GROUPS, groups);
		for (int i = 0; i < ng; i++)
			c->cred.groups[c->cred.ngroups++] = (uint32_t)groups[i];
	}
	/*
	 * Three times mgmtd's default heartbeat timeout (10 s): a storage node that
	 * hangs is taken out of its chains after that timeout, and the calls waiting on
	 * it, or on a new connection's handshake with it (5 s), are sent again; all that
	 * costs a pause, never EIO.
	 */
	c->retry_ms = 30000;
	e = getenv("STOKER_RETRY_MS");
	if (e && stk_parse_u64(e, &v) == 0 && v < 3600000)
		c->retry_ms = (unsigned)v;
	if (opts && opts->size >= STK_OPTS_HAVE(retry_ms) && opts->retry_ms)
		c->retry_ms = opts->retry_ms;
	pthread_rwlock_init(&c->rt_lock, NULL);
	pthread_mutex_init(&c->local_lock, NULL);
	e = opts && opts->size >= STK_OPTS_HAVE(qos_class) && opts->qos_class
		? opts->qos_class
		: getenv("STOKER_QOS_CLASS");
	if (e && *e) {
		int cls = stk_qos_class_parse(e);

		if (cls < 0) {
			stk_error("QoS class '%s' (STOKER_QOS_CLASS or qos_class): not a class; "
				  "the classes are training-read, default and checkpoint",
				  e);
			rc = -EINVAL;
			goto out_lock;
		}
		c->qos_flags = (uint32_t)cls << STK_FRAME_CLASS_SHIFT;
	}
	e = getenv("STOKER_SHORT_CIRCUIT");
	c->short_circuit = !(e && strcmp(e, "0") == 0);
	/* a client key's reads go through storage, which checks what it may read */
	if (stk_net_auth_client(NULL)) {
		c->short_circuit = 0;
		rc = stk_vouches_create(&c->vouches);
		if (rc)
			goto out_lock;
	}
	e = getenv("STOKER_HOST_ID");
	if (stk_host_id(e, c->host_id, sizeof(c->host_id))) {
		stk_error("STOKER_HOST_ID='%s' is not a host id: at most %d printable "
			  "characters, no spaces",
			  e, STK_HOST_ID_MAX - 1);
		rc = -EINVAL;
		goto out_lock;
	}
	rc = stk_reaper_create(c);
	if (rc)
		goto out_lock;
	rc = stk_pool_create(c->opts.conns_per_node, &c->pool);
	if (rc)
		goto out_reaper;
	rc = stk_callwatch_create(1000, node_gone, c, &c->watch);
	if (rc) {
		stk_pool_destroy(c->pool);
		goto out_reaper;
	}
	rc = stk_client_refresh_routing(c);
	if (rc == 0)
		rc = stk_session_create(c);
	if (rc)
		goto out_pool;
	*out = c;
	return 0;
out_pool:
	if (c->mgmt_conn)
		stk_conn_close(c->mgmt_conn);
	stk_callwatch_destroy(c->watch);
	stk_routing_free(&c->rt);
	stk_pool_destroy(c->pool);
out_reaper:
	stk_reaper_destroy(c);
out_lock:
	stk_vouches_destroy(c->vouches);
	pthread_rwlock_destroy(&c->rt_lock);
out_free:
	free(c);
	return rc;
}

void stk_disconnect(stk_client *c)
{
	if (!c)
		return;
	stk_behind_destroy(c); /* first: what it answered goes to meta, and its unlinks' chunks */
	stk_reaper_destroy(c); /* then: it removes what is queued, over the pool */
	stk_lcache_stop(c);
	stk_session_end(c); /* then: it still talks to meta; wakes the parked watch */
	stk_lcache_destroy(c);
	stk_session_destroy(c); /* after the watch, which calls into it */
	stk_callwatch_destroy(c->watch); /* before the table it reads */
	stk_pool_destroy(c->pool);
	for (unsigned i = 0; i < c->nlocals; i++) {
		stk_chunk_store_close(c->locals[i].cs);
		stk_serve_map_close(c->locals[i].map);
	}
	while (c->gone_maps) {
		struct stk_gone_map *g = c->gone_maps;

		c->gone_maps = g->next;
		stk_serve_map_close(g->map);
		free(g);
	}
	stk_routing_free(&c->rt);
	pthread_rwlock_destroy(&c->rt_lock);
	if (c->mgmt_conn)
		stk_conn_close(c->mgmt_conn);
	pthread_mutex_destroy(&c->mgmt_lock);
	stk_vouches_destroy(c->vouches);
	free(c);
}

const char *stk_cluster_addr(const stk_client *c)
{
	return c->mgmtd;
}

void stk_after_fork(stk_client *c)
{
	/*
	 * The idle connections are shared with the parent: drop them, never use them.
	 * Locks another parent thread held at fork() would stay held in the child, so
	 * the pool's lock and the routing lock are made anew.
	 */
	stk_pool_after_fork(c->pool);
	pthread_rwlock_init(&c->rt_lock, NULL);
	pthread_mutex_init(&c->mgmt_lock, NULL);
	stk_callwatch_after_fork(c->watch);
	c->mgmt_conn = NULL; /* the parent's (its descriptor is left to the parent) */
	pthread_mutex_init(&c->local_lock, NULL);
	for (unsigned i = 0; i < c->nlocals; i++)
		stk_chunk_store_after_fork(c->locals[i].cs);
	stk_session_after_fork(c);
	stk_reaper_after_fork(c);
	stk_behind_after_fork(c);
	stk_lcache_after_fork(c);
}

int stk_client_refresh_routing(struct stk_client *c)
{
	struct stk_routing rt;
	int rc;

	/* From the leading mgmtd of the list, following it (net/mgmtaddr.h). */
	pthread_mutex_lock(&c->mgmt_lock);
	rc = stk_routing_fetch_leader(&c->mgmt, &c->mgmt_conn, 2000, &rt);
	pthread_mutex_unlock(&c->mgmt_lock);
	if (rc == -EBADMSG)
		rc = -EPROTO; /* what answered is no mgmtd (stoker.h, stk_connect) */
	if (rc)
		return rc;
	pthread_rwlock_wrlock(&c->rt_lock);
	stk_routing_free(&c->rt);
	c->rt = rt;
	pthread_rwlock_unlock(&c->rt_lock);
	return 0;
}

/*
 * The address of the meta node leading `shard`: 0, -ENOTCONN (none leads it now,
 * or no table yet), or -ENOENT when a table with a shard map has no such shard
 * (an inode number of a shard the cluster never had).
 */
int stk_client_meta_addr_shard(struct stk_client *c, unsigned shard, char *addr)
{
	int rc = -ENOTCONN;

	pthread_rwlock_rdlock(&c->rt_lock);
	if (shard > 1 && c->rt.nshards)
		rc = -ENOENT;
	for (uint32_t i = 0; i < c->rt.nshards; i++) {
		const struct stk_rt_node *n;

		if (c->rt.shards[i].id != shard)
			continue;
		rc = -ENOTCONN;
		n = stk_routing_node(&c->rt, c->rt.shards[i].node_id);
		if (n) {
			memcpy(addr, n->addr, STK_ADDR_MAX);
			rc = 0;
		}
		break;
	}
	pthread_rwlock_unlock(&c->rt_lock);
	return rc;
}

/* The address of the meta node serving shard 1, which holds the root. */
int stk_client_meta_addr(struct stk_client *c, char *addr)
{
	return stk_client_meta_addr_shard(c, 1, addr);
}

int stk_client_meta_ns(struct stk_client *c, struct stk_ns_id *out)
{
	struct stk_msg_meta_statfs_ext x = {0};
	struct stk_msg_meta_statfs_resp m;
	char addr[STK_ADDR_MAX] = "";
	uint8_t resp[64];
	struct stk_rbuf r;
	size_t len = 0;
	int rc, hit = 0;

	if (stk_client_meta_addr(c, addr) == 0) {
		pthread_rwlock_rdlock(&c->rt_lock);
		hit = !stk_ns_id_is_zero(&c->meta_ns) && strcmp(c->meta_ns_addr, addr) == 0;
		if (hit)
			*out = c->meta_ns;
		pthread_rwlock_unlock(&c->rt_lock);
		if (hit)
			return 0;
	}
	rc = stk_client_meta_call(c, STK_OP_META_STATFS, NULL, 0, resp, sizeof(resp), &len);
	if (rc)
		return rc;
	stk_rbuf_init(&r, resp, len);
	if (stk_msg_meta_statfs_resp_dec(&r, &m) || (m.ns_hi == 0 && m.ns_lo == 0))
		return -EIO;
	if (r.off < r.len && (stk_msg_meta_statfs_ext_dec(&r, &x) || stk_rbuf_finish(&r)))
		return -EIO;
	out->hi = m.ns_hi;
	out->lo = m.ns_lo;
	pthread_rwlock_wrlock(&c->rt_lock);
	c->meta_ns = *out;
	c->meta_purges = (x.flags & STK_STATFS_PURGES) != 0;
	stk_strlcpy(c->meta_ns_addr, addr, sizeof(c->meta_ns_addr));
	pthread_rwlock_unlock(&c->rt_lock);
	return 0;
}

int stk_client_meta_purges(struct stk_client *c)
{
	char addr[STK_ADDR_MAX] = "";
	int rc = -EAGAIN;

	/*
	 * Only what stk_client_meta_ns last learned: no call to meta here, since the
	 * write-behind path asks this holding its own lock, which a meta call takes
	 * first (to send what is behind), and would wait on itself.
	 */
	if (stk_client_meta_addr(c, addr))
		return -EAGAIN;
	pthread_rwlock_rdlock(&c->rt_lock);
	if (!stk_ns_id_is_zero(&c->meta_ns) && strcmp(c->meta_ns_addr, addr) == 0)
		rc = c->meta_purges;
	pthread_rwlock_unlock(&c->rt_lock);
	return rc;
}

int stk_client_meta_call(struct stk_client *c, uint16_t opcode, const void *req, size_t req_len,
			 void *resp, size_t resp_cap, size_t *resp_len)
{
	return stk_client_meta_call_from(c, 0, opcode, req, req_len, resp, resp_cap, resp_len);
}

/*
 * The shard a request goes to: the one its inode's number names (parent for a
 * name's requests; stk_msg_meta_route), shard 1 for a request about no inode. A
 * rename or hard link between two shards goes to the shard of the folder named
 * first (the source's; the new name's), which does it with the other
 * (docs/meta-shards.md). Any other request naming two shards: -EXDEV.
 */
static int route_shard(uint16_t opcode, const void *req, size_t req_len, unsigned *shard)
{
	uint64_t ino, other;
	int rc = stk_msg_meta_route(opcode, req, req_len, &ino, &other);

	*shard = 1;
	if (rc <= 0)
		return 0; /* a malformed request goes to shard 1, which answers it */
	*shard = stk_ino_shard(ino);
	if (opcode != STK_OP_META_RENAME && opcode != STK_OP_META_LINK && other &&
	    stk_ino_shard(other) != *shard)
		return -EXDEV;
	return 0;
}

static int meta_call(struct stk_client *c, unsigned shard, uint32_t origin, uint16_t opcode,
		     const void *req, size_t req_len, void *resp, size_t resp_cap,
		     size_t *resp_len)
{
	uint64_t deadline = stk_now_ns() + (uint64_t)c->retry_ms * 1000000ull;
	unsigned backoff_ms = 20;
	char addr[STK_ADDR_MAX];
	int rc, asked = 0;

	/* Meta sees this client's calls in order: what was answered here goes first. */
	if (opcode != STK_OP_META_NAMES && opcode != STK_OP_META_INOS &&
	    opcode != STK_OP_META_WATCH && opcode != STK_OP_META_SESSION &&
	    opcode != STK_OP_META_SESSION_END && stk_behind_queued(c))
		stk_behind_send(c);
	if (!shard) {
		rc = route_shard(opcode, req, req_len, &shard);
		if (rc)
			return rc;
	}
	if (shard != 1) {
		/*
		 * The origin a caller passes may be shard 1's holder id (stk_lcache_origin):
		 * another shard knows this client by the holder of its own watch, started
		 * at the first request to it, so a request with an origin goes with that
		 * one (the same value when the caller took it from that shard: a token of
		 * the shard, write-behind, allowances). The session's renewal goes to
		 * every shard it was named to.
		 */
		if (shard <= STK_MAX_SHARDS &&
		    !(atomic_fetch_or(&c->shards_used, 1u << (shard - 1)) & (1u << (shard - 1))))
			stk_lcache_use_shard(c, shard);
		if (origin)
			origin = stk_lcache_holder(c, shard);
	}

	for (;;) {
		struct stk_conn *conn = NULL;
		struct stk_rpc rpc = {.opcode = opcode,
				      .req = req,
				      .req_len = req_len,
				      .resp = resp,
				      .resp_cap = resp_cap,
				      .origin = origin};

		rc = stk_client_meta_addr_shard(c, shard, addr);
		/* a table from before that shard's first meta node registered: ask again */
		if (rc == -ENOENT && !asked++ && stk_client_refresh_routing(c) == 0)
			rc = stk_client_meta_addr_shard(c, shard, addr);
		if (rc == 0) {
			stk_callwatch_set_thread(c->watch); /* a new connection's handshake, too */
			rc = stk_pool_get(c->pool, addr, &conn);
			stk_callwatch_set_thread(NULL);
		}
		if (rc == 0) {
			rc = stk_rpc_send(conn, &rpc);
			if (rc == 0) {
				/* a meta node mgmtd gave up on (a hung leader, replaced) is not
				 * waited for: its connection is aborted and the call goes on to
				 * the one the routing table names now */
				int slot = stk_callwatch_begin(c->watch, conn, addr);

				rc = stk_rpc_recv(conn, &rpc);
				stk_callwatch_end(c->watch, slot);
			}
			stk_pool_put(c->pool, conn);
			if (rc == 0) {
				rc = stk_status_to_errno(rpc.status);
				/* meta's vouchers end the payload: kept, and taken off */
				if (rc == 0 && stk_vouch_take(c->vouches, rpc.resp_flags, resp,
							      &rpc.resp_len)) {
					stk_warn("meta at %s: a malformed voucher in its %s reply",
						 addr, stk_opcode_name(opcode));
					rc = -EIO;
				}
				/* NOT_LEADER: a replica that does not lead the shard (now), or a
				 * node of another shard: the routing table names the one that does */
				if (rc != -EREMCHG) {
					if (resp_len)
						*resp_len = rpc.resp_len;
					return rc;
				}
			}
		}
		if (rc == -ENOENT)
			return rc; /* no such shard: no such inode */
		if ((!is_transport_error(rc) && rc != -EREMCHG) || stk_now_ns() > deadline)
			break;
		usleep(backoff_ms * 1000);
		if (backoff_ms < 500)
			backoff_ms *= 2;
		stk_pool_flush(c->pool);
		stk_client_refresh_routing(c);
	}
	if (is_transport_error(rc) || rc == -EREMCHG) {
		stk_debug("meta call %s to shard %u failed: %s", stk_opcode_name(opcode), shard,
			  stk_strerror(rc));
		return -EIO;
	}
	return rc;
}

int stk_client_meta_call_from(struct stk_client *c, uint32_t origin, uint16_t opcode,
			      const void *req, size_t req_len, void *resp, size_t resp_cap,
			      size_t *resp_len)
{
	return meta_call(c, 0, origin, opcode, req, req_len, resp, resp_cap, resp_len);
}

int stk_client_meta_call_shard(struct stk_client *c, unsigned shard, uint32_t origin,
			       uint16_t opcode, const void *req, size_t req_len, void *resp,
			       size_t resp_cap, size_t *resp_len)
{
	return meta_call(c, shard ? shard : 1, origin, opcode, req, req_len, resp, resp_cap,
			 resp_len);
}

static int attr_call(struct stk_client *c, uint32_t origin, uint16_t opcode, const void *req,
		     size_t req_len, struct stk_attr *attr)
{
	uint8_t resp[STK_RESP_SMALL];
	struct stk_msg_meta_attr_resp m;
	struct stk_rbuf r;
	size_t len = 0;
	int rc;

	rc = stk_client_meta_call_from(c, origin, opcode, req, req_len, resp, sizeof(resp), &len);
	if (rc)
		return rc;
	stk_rbuf_init(&r, resp, len);
	if (stk_msg_meta_attr_resp_dec(&r, &m) || stk_rbuf_finish(&r))
		return -EIO;
	if (attr)
		*attr = m.attr;
	return 0;
}

int stk_client_meta_attr_call(struct stk_client *c, uint16_t opcode, const void *req,
			      size_t req_len, struct stk_attr *attr)
{
	return attr_call(c, 0, opcode, req, req_len, attr);
}

/*
 * The origin of a read of this client's own: its holder at the shard the request
 * goes to, so that a read of a folder that shard delegated here keeps the
 * delegation whatever another shard's watch does.
 */
static uint32_t read_origin(struct stk_client *c, uint16_t opcode, const void *req,
			    size_t req_len)
{
	unsigned shard = 1;

	if (route_shard(opcode, req, req_len, &shard))
		shard = 1; /* EXDEV: meta_call answers it */
	return stk_lcache_holder(c, shard);
}

int stk_client_meta_read_call(struct stk_client *c, uint16_t opcode, const void *req,
			      size_t req_len, void *resp, size_t resp_cap, size_t *resp_len)
{
	return stk_client_meta_call_from(c, read_origin(c, opcode, req, req_len), opcode, req,
					 req_len, resp, resp_cap, resp_len);
}

int stk_client_meta_attr_read_call(struct stk_client *c, uint16_t opcode, const void *req,
				   size_t req_len, struct stk_attr *attr)
{
	return attr_call(c, read_origin(c, opcode, req, req_len), opcode, req, req_len, attr);
}

int stk_client_meta_attr_call_own(struct stk_client *c, uint64_t ino, uint16_t opcode,
				  const void *req, size_t req_len, struct stk_attr *attr)
{
	struct stk_lcache_tok tok;
	struct stk_attr a;
	int rc;

	tok = stk_lcache_begin_change(c, 0, NULL, ino);
	rc = attr_call(c, tok.holder, opcode, req, req_len, &a);
	/* Forgets ino (lookups that raced with the change lose); keeps its entry up to date. */
	stk_lcache_updated(c, tok, ino, rc == 0 ? &a : NULL);
	if (rc == 0 && attr)
		*attr = a;
	return rc;
}

int stk_client_meta_attr_call_own_ext(struct stk_client *c, uint64_t ino, uint16_t opcode,
				      const void *req, size_t req_len, size_t plain_len,
				      uint32_t ext_holder, int *ext_sent)
{
	struct stk_lcache_tok tok;
	struct stk_attr a;
	int rc;

	tok = stk_lcache_begin_change(c, 0, NULL, ino);
	*ext_sent = tok.holder == ext_holder && req_len > plain_len;
	rc = attr_call(c, tok.holder, opcode, req, *ext_sent ? req_len : plain_len, &a);
	stk_lcache_updated(c, tok, ino, rc == 0 ? &a : NULL);
	return rc;
}

int stk_strlcpy_name(char *dst, const char *name)
{
	size_t n = strlen(name);

	if (n == 0 || strchr(name, '/') || strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
		return -EINVAL;
	if (n > STK_NAME_MAX)
		return -ENAMETOOLONG;
	memcpy(dst, name, n + 1);
	return 0;
}

int stk_cred_in_group(const struct stk_cred *cr, uint32_t gid)
{
	if (cr->gid == gid)
		return 1;
	for (unsigned i = 0; i < cr->ngroups && i < STK_MAX_GROUPS; i++)
		if (cr->groups[i] == gid)
			return 1;
	return 0;
}

void stk_client_new_layout(struct stk_client *c, uint64_t parent, struct stk_layout *l)
{
	uint32_t nchains;

	memset(l, 0, sizeof(*l));
	if (!c->opts.chunk_size && !c->opts.stripe)
		return;
	pthread_rwlock_rdlock(&c->rt_lock);
	nchains = c->rt.nchains;
	pthread_rwlock_unlock(&c->rt_lock);
	if (nchains)
		stk_layout_make(l, c->opts.chunk_size ? c->opts.chunk_size : STK_DEFAULT_CHUNK_SIZE,
				c->opts.stripe ? c->opts.stripe : STK_MIN(nchains, 16u), nchains,
				stk_now_ns() ^ parent);
}

void stk_attr_to_stat(const struct stk_attr *a, struct stat *st)
{
	memset(st, 0, sizeof(*st));
	st->st_ino = a->ino;
	st->st_mode = a->mode;
	st->st_nlink = a->nlink;
	st->st_uid = a->uid;
	st->st_gid = a->gid;
	st->st_size = (off_t)a->size;
	st->st_blksize = a->layout.chunk_size ? a->layout.chunk_size : 4096;
	st->st_blocks = (blkcnt_t)a->blocks; /* what is stored: a hole counts nothing */
	st->st_rdev = (dev_t)a->rdev;
	st->st_atim.tv_sec = a->atime_sec;
	st->st_atim.tv_nsec = a->atime_nsec;
	st->st_mtim.tv_sec = a->mtime_sec;
	st->st_mtim.tv_nsec = a->mtime_nsec;
	st->st_ctim.tv_sec = a->ctime_sec;
	st->st_ctim.tv_nsec = a->ctime_nsec;
	st->st_dev = 0x57c0;
}
