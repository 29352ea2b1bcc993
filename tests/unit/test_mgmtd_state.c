/*
 * Unit test of mgmtd's cluster state (src/mgmtd/state.c): registration of nodes
 * and targets, chain creation, the shard map, heartbeats, OFFLINE transitions and
 * the routing version, the routing reply, and the state file's round trip and
 * corruption checks. Time is passed in, so nothing here sleeps.
 * Exit 0 pass, 1 fail.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/util.h"
#include "mgmtd/state.h"
#include "proto/msg.h"
#include "check.h"

#define SEC 1000000000ull
#define TIMEOUT (10 * SEC)

static struct stk_msg_mgmt_register_req req(uint32_t node_id, uint8_t role, const char *addr,
					    uint32_t ntargets)
{
	struct stk_msg_mgmt_register_req r;

	memset(&r, 0, sizeof(r));
	r.node_id = node_id;
	r.role = role;
	stk_strlcpy(r.addr, addr, sizeof(r.addr));
	r.ntargets = ntargets;
	return r;
}

/* A meta node's registration with store identity {0, ns} (0: none, refused as malformed). */
static struct stk_msg_mgmt_register_req meta_req(uint32_t node_id, const char *addr, uint64_t ns)
{
	struct stk_msg_mgmt_register_req r = req(node_id, STK_ROLE_META, addr, 0);

	r.ns_lo = ns;
	return r;
}

static void tinfo(struct stk_msg_target_info *t, uint32_t id, const char *path, uint64_t used)
{
	memset(t, 0, sizeof(*t));
	t->target_id = id;
	t->capacity = 1000;
	t->used = used;
	t->chunks = used / 10;
	stk_strlcpy(t->path, path, sizeof(t->path));
}

/* Encodes the routing reply and decodes it as a client would. */
static int routing(struct stk_mgmt_state *st, uint64_t known, uint64_t now, struct stk_routing *rt)
{
	static uint8_t buf[1 << 16];
	struct stk_wbuf w;
	struct stk_rbuf r;
	int rc;

	stk_wbuf_init(&w, buf, sizeof(buf));
	rc = stk_mgmt_state_encode_routing(st, known, now, &w);
	if (rc)
		return rc;
	stk_rbuf_init(&r, buf, w.len);
	rc = stk_routing_decode(&r, rt);
	if (rc == 0 && stk_rbuf_finish(&r)) {
		stk_routing_free(rt);
		return -EBADMSG;
	}
	return rc;
}

static int test_registration(struct stk_mgmt_state *st)
{
	struct stk_msg_mgmt_register_req rq;
	struct stk_msg_target_info t[3];
	uint32_t node, ids[3];
	uint64_t v;

	/* A new storage node with two new targets: ids, a chain each. */
	rq = req(0, STK_ROLE_STORAGE, "127.0.0.1:9500", 2);
	tinfo(&t[0], 0, "/data/t0", 100);
	tinfo(&t[1], 0, "/data/t1", 200);
	v = st->version;
	REQUIRE(stk_mgmt_state_register(st, &rq, t, 2, 1 * SEC, &node, ids) == 0);
	REQUIRE(node == 1 && ids[0] == 1 && ids[1] == 2);
	REQUIRE(st->version > v && st->dirty);
	REQUIRE(st->nchains == 2);
	REQUIRE(st->chains[0].id == 1 && st->chains[0].ntargets == 1 &&
	      st->chains[0].targets[0] == 1 && st->chains[0].version == 1);
	REQUIRE(st->chains[1].id == 2 && st->chains[1].targets[0] == 2);
	REQUIRE(stk_mgmt_state_target(st, 2)->used == 200);
	REQUIRE(stk_mgmt_state_target(st, 2)->state == STK_TARGET_SERVING);

	/* Re-registering with the same ids changes nothing visible. */
	rq.node_id = node;
	tinfo(&t[0], 1, "/data/t0", 150);
	tinfo(&t[1], 2, "/data/t1", 250);
	v = st->version;
	REQUIRE(stk_mgmt_state_register(st, &rq, t, 2, 2 * SEC, &node, ids) == 0);
	REQUIRE(node == 1 && ids[0] == 1 && ids[1] == 2);
	REQUIRE(st->version == v);
	REQUIRE(st->nchains == 2 && st->ntargets == 2);
	REQUIRE(stk_mgmt_state_target(st, 1)->used == 150);

	/*
	 * A meta node takes shard 1, which takes its store's identity; a second one with
	 * another store is registered but refused.
	 */
	rq = meta_req(0, "127.0.0.1:9600", 0xA);
	REQUIRE(stk_mgmt_state_register(st, &rq, NULL, 0, 2 * SEC, &node, ids) == 0);
	REQUIRE(node == 2 && st->shards[0].node == 2 && st->shards[0].ns.lo == 0xA);
	REQUIRE(!stk_mgmt_state_node(st, 2)->refused);
	rq = meta_req(0, "127.0.0.1:9601", 0xB);
	REQUIRE(stk_mgmt_state_register(st, &rq, NULL, 0, 2 * SEC, &node, ids) == 0);
	REQUIRE(node == 3 && st->shards[0].node == 2 && st->shards[0].ns.lo == 0xA);
	REQUIRE(stk_mgmt_state_node(st, 3)->refused && stk_mgmt_state_node(st, 3)->ns.lo == 0xB);

	/*
	 * An unknown node id (mgmtd lost its state) is taken as is, and new ids continue
	 * after it; a known id under another role gets a new one.
	 */
	rq = req(77, STK_ROLE_STORAGE, "127.0.0.1:9501", 0);
	REQUIRE(stk_mgmt_state_register(st, &rq, NULL, 0, 2 * SEC, &node, ids) == 0);
	REQUIRE(node == 77 && st->next_node_id == 78);
	rq = req(2, STK_ROLE_STORAGE, "127.0.0.1:9502", 0);
	REQUIRE(stk_mgmt_state_register(st, &rq, NULL, 0, 2 * SEC, &node, ids) == 0);
	REQUIRE(node == 78);

	/*
	 * A target id mgmtd does not know (lost state) is taken as is, on chain number
	 * 7 as it was created; chains 3 to 6 wait empty for their targets.
	 */
	rq = req(77, STK_ROLE_STORAGE, "127.0.0.1:9501", 1);
	tinfo(&t[0], 7, "/data/t7", 10);
	REQUIRE(stk_mgmt_state_register(st, &rq, t, 1, 2 * SEC, &node, ids) == 0);
	REQUIRE(node == 77 && ids[0] == 7);
	REQUIRE(st->nchains == 7 && st->chains[6].id == 7 && st->chains[6].targets[0] == 7);
	REQUIRE(st->chains[2].id == 3 && st->chains[2].ntargets == 0);
	REQUIRE(st->next_target_id == 8);
	/* ... and the next new target does not collide with it. */
	tinfo(&t[1], 0, "/data/t8", 10);
	rq.ntargets = 2;
	REQUIRE(stk_mgmt_state_register(st, &rq, t, 2, 2 * SEC, &node, ids) == 0);
	REQUIRE(ids[0] == 7 && ids[1] == 8 && st->nchains == 8 && st->chains[7].targets[0] == 8);

	/* A node that stops reporting a target: that target goes OFFLINE. */
	rq.ntargets = 1;
	v = st->version;
	REQUIRE(stk_mgmt_state_register(st, &rq, t, 1, 2 * SEC, &node, ids) == 0);
	REQUIRE(stk_mgmt_state_target(st, 8)->state == STK_TARGET_OFFLINE);
	REQUIRE(st->version > v);

	/* Refused: bad role, empty address, targets on meta, a target id twice. */
	v = st->version;
	rq = req(0, STK_ROLE_CLIENT, "x:1", 0);
	REQUIRE(stk_mgmt_state_register(st, &rq, NULL, 0, 2 * SEC, &node, ids) == -EINVAL);
	rq = req(0, STK_ROLE_STORAGE, "", 0);
	REQUIRE(stk_mgmt_state_register(st, &rq, NULL, 0, 2 * SEC, &node, ids) == -EINVAL);
	rq = req(0, STK_ROLE_META, "x:1", 1);
	REQUIRE(stk_mgmt_state_register(st, &rq, t, 1, 2 * SEC, &node, ids) == -EINVAL);
	rq = req(1, STK_ROLE_STORAGE, "127.0.0.1:9500", 2);
	tinfo(&t[0], 1, "/data/t0", 1);
	tinfo(&t[1], 1, "/data/t1", 1);
	REQUIRE(stk_mgmt_state_register(st, &rq, t, 2, 2 * SEC, &node, ids) == -EINVAL);
	REQUIRE(st->version == v && st->nnodes == 5);
	return 0;
}

static int test_liveness(struct stk_mgmt_state *st)
{
	struct stk_msg_mgmt_register_req rq;
	struct stk_msg_target_info t[2];
	uint32_t node, ids[2];
	uint64_t v;

	/* Nodes 3, 77, 78 heartbeat at 12 s; node 1 at 3 s; node 2 (shard owner) not at all. */
	REQUIRE(stk_mgmt_state_heartbeat(st, 3, NULL, 0, 12 * SEC) == 0);
	REQUIRE(stk_mgmt_state_heartbeat(st, 77, NULL, 0, 12 * SEC) == 0);
	REQUIRE(stk_mgmt_state_heartbeat(st, 78, NULL, 0, 12 * SEC) == 0);
	REQUIRE(stk_mgmt_state_heartbeat(st, 99, NULL, 0, 12 * SEC) == -ENOENT);

	/* Capacity changes do not bump the version. */
	tinfo(&t[0], 1, "/data/t0", 500);
	tinfo(&t[1], 2, "/data/t1", 600);
	v = st->version;
	REQUIRE(stk_mgmt_state_heartbeat(st, 1, t, 2, 3 * SEC) == 0);
	REQUIRE(st->version == v);
	REQUIRE(stk_mgmt_state_target(st, 1)->used == 500);

	/* 10 s of silence is tolerated, a little more is not. Node 2 was last heard at 2 s. */
	REQUIRE(stk_mgmt_state_expire(st, 12 * SEC, TIMEOUT) == 0);
	REQUIRE(stk_mgmt_state_expire(st, 12 * SEC + 1, TIMEOUT) == 1);
	REQUIRE(st->version > v);
	REQUIRE(stk_mgmt_state_node(st, 2)->state == STK_NODE_OFFLINE);
	REQUIRE(stk_mgmt_state_node(st, 1)->state == STK_NODE_ONLINE);
	REQUIRE(stk_mgmt_state_target(st, 1)->state == STK_TARGET_SERVING);
	/* Node 1 (last heard at 3 s) goes OFFLINE with its targets. */
	REQUIRE(stk_mgmt_state_expire(st, 13 * SEC + 1, TIMEOUT) == 1);
	REQUIRE(stk_mgmt_state_node(st, 1)->state == STK_NODE_OFFLINE);
	REQUIRE(stk_mgmt_state_target(st, 1)->state == STK_TARGET_OFFLINE);
	REQUIRE(stk_mgmt_state_target(st, 2)->state == STK_TARGET_OFFLINE);
	REQUIRE(stk_mgmt_state_target(st, 7)->state == STK_TARGET_SERVING);
	REQUIRE(stk_mgmt_state_node(st, 3)->state == STK_NODE_ONLINE);
	REQUIRE(stk_mgmt_state_expire(st, 14 * SEC, TIMEOUT) == 0); /* already OFFLINE */

	/* A heartbeat brings node 1 and the targets it reports back. */
	v = st->version;
	REQUIRE(stk_mgmt_state_heartbeat(st, 1, t, 2, 15 * SEC) == 0);
	REQUIRE(st->version > v);
	REQUIRE(stk_mgmt_state_node(st, 1)->state == STK_NODE_ONLINE);
	REQUIRE(stk_mgmt_state_target(st, 1)->state == STK_TARGET_SERVING);
	REQUIRE(stk_mgmt_state_target(st, 2)->state == STK_TARGET_SERVING);

	/*
	 * The shard owner is OFFLINE: a meta node with another store still does not get
	 * shard 1 (it would serve an empty namespace in its place); the owner's store,
	 * restarted as node 3, does.
	 */
	rq = meta_req(3, "127.0.0.1:9601", 0xB);
	REQUIRE(stk_mgmt_state_register(st, &rq, NULL, 0, 15 * SEC, &node, ids) == 0);
	REQUIRE(node == 3 && st->shards[0].node == 2 && stk_mgmt_state_node(st, 3)->refused);
	rq = meta_req(3, "127.0.0.1:9601", 0xA);
	REQUIRE(stk_mgmt_state_register(st, &rq, NULL, 0, 15 * SEC, &node, ids) == 0);
	REQUIRE(node == 3 && st->shards[0].node == 3 && !stk_mgmt_state_node(st, 3)->refused);
	return 0;
}

static int test_routing(struct stk_mgmt_state *st)
{
	struct stk_routing rt;
	const struct stk_rt_chain *c;
	const struct stk_rt_node *n;

	REQUIRE(routing(st, st->version, 16 * SEC, &rt) == 0);
	REQUIRE(rt.version == st->version && rt.nnodes == 0 && rt.nchains == 0 && rt.ntargets == 0);
	stk_routing_free(&rt);

	REQUIRE(routing(st, 0, 16 * SEC, &rt) == 0);
	REQUIRE(rt.version == st->version);
	REQUIRE(rt.nnodes == 5 && rt.ntargets == 4 && rt.nchains == 8 && rt.nshards == 1);
	REQUIRE(rt.shards[0].id == 1 && rt.shards[0].node_id == 3 && rt.shards[0].ns.lo == 0xA &&
	      rt.shards[0].ns.hi == 0);
	n = stk_routing_node(&rt, 3);
	REQUIRE(n && !n->refused && n->ns.lo == 0xA);
	c = stk_routing_chain(&rt, 7);
	REQUIRE(c && c->ntargets == 1 && c->targets[0] == 7);
	c = stk_routing_chain(&rt, 3);
	REQUIRE(c && c->ntargets == 0);
	n = stk_routing_node(&rt, 1);
	REQUIRE(n && n->state == STK_NODE_ONLINE && n->last_seen_ms == 1000);
	REQUIRE(strcmp(n->addr, "127.0.0.1:9500") == 0 && n->role == STK_ROLE_STORAGE);
	REQUIRE(stk_routing_target(&rt, 2)->used == 600);
	REQUIRE(strcmp(stk_routing_target(&rt, 7)->path, "/data/t7") == 0);
	stk_routing_free(&rt);
	return 0;
}

static int test_persistence(struct stk_mgmt_state *st)
{
	char dir[64], path[128], tmp[160];
	struct stk_mgmt_state ld;
	uint8_t b;
	int fd, rc = 1;

	REQUIRE(check_tmpdir(dir, sizeof(dir), "mgmtd") == 0);
	snprintf(path, sizeof(path), "%s/mgmtd.state", dir);
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	stk_mgmt_state_init(&ld);
	if (stk_mgmt_state_load(&ld, path, 0) != -ENOENT || ld.nnodes != 0)
		goto out;
	if (stk_mgmt_state_save(st, path) || st->dirty || access(tmp, F_OK) == 0)
		goto out;
	if (stk_mgmt_state_load(&ld, path, 100 * SEC))
		goto out;
	if (ld.version != st->version || ld.next_node_id != st->next_node_id ||
	    ld.next_target_id != st->next_target_id || ld.shards[0].node != st->shards[0].node ||
	    !stk_ns_id_eq(&ld.shards[0].ns, &st->shards[0].ns) || ld.nnodes != st->nnodes ||
	    ld.ntargets != st->ntargets || ld.nchains != st->nchains)
		goto out;
	for (uint32_t i = 0; i < st->nnodes; i++) {
		const struct stk_mgmt_node *a = &st->nodes[i], *c = &ld.nodes[i];
		if (a->id != c->id || a->role != c->role || a->state != c->state ||
		    strcmp(a->addr, c->addr) || c->last_hb_ns != 100 * SEC ||
		    a->refused != c->refused || !stk_ns_id_eq(&a->ns, &c->ns))
			goto out;
	}
	for (uint32_t i = 0; i < st->ntargets; i++) {
		/* state changes are counted from mgmtd's start, not saved */
		struct stk_rt_target t = st->targets[i];

		t.state_changes = 0;
		if (ld.targets[i].state_changes || memcmp(&t, &ld.targets[i], sizeof(t)) != 0)
			goto out;
	}
	for (uint32_t i = 0; i < st->nchains; i++)
		if (memcmp(&st->chains[i], &ld.chains[i], sizeof(st->chains[i])) != 0)
			goto out;
	/* A loaded state keeps working: new ids continue after the old ones. */
	{
		struct stk_msg_mgmt_register_req rq = req(0, STK_ROLE_STORAGE, "h:1", 1);
		struct stk_msg_target_info t;
		uint32_t node, id;

		tinfo(&t, 0, "/x", 0);
		if (stk_mgmt_state_register(&ld, &rq, &t, 1, 100 * SEC, &node, &id) || node != 79 ||
		    id != 9 || ld.nchains != 9 || ld.chains[8].targets[0] != 9)
			goto out;
	}
	/* One flipped byte anywhere makes the file refused. */
	fd = open(path, O_RDWR);
	if (fd < 0 || pread(fd, &b, 1, 40) != 1)
		goto out;
	b ^= 1;
	if (pwrite(fd, &b, 1, 40) != 1)
		goto out;
	close(fd);
	if (stk_mgmt_state_load(&ld, path, 0) != -EBADMSG || ld.nnodes != 6)
		goto out;
	/* So does a truncated one. */
	if (truncate(path, 30) || stk_mgmt_state_load(&ld, path, 0) != -EBADMSG)
		goto out;
	rc = 0;
out:
	if (rc)
		CHECK_FAIL("persistence round trip failed");
	stk_mgmt_state_free(&ld);
	check_rm_rf(dir);
	return rc;
}

/*
 * The bytes a state encodes to (what goes to a file or to etcd) decode to the same
 * state, and encode again to the same bytes; a flipped byte or a short buffer is
 * refused and leaves the target state as it was.
 */
static int test_encode_round_trip(struct stk_mgmt_state *st)
{
	struct stk_mgmt_state ld;
	uint8_t *a = NULL, *b = NULL;
	size_t alen = 0, blen = 0;
	int rc = 1;

	stk_mgmt_state_init(&ld);
	REQUIRE(stk_mgmt_state_encode(st, &a, &alen) == 0);
	CHECK_RC(stk_mgmt_state_decode(&ld, a, alen, 7 * SEC), 0);
	CHECK_EQ(ld.version, st->version);
	CHECK_EQ(ld.nnodes, st->nnodes);
	CHECK_EQ(ld.ntargets, st->ntargets);
	CHECK_EQ(ld.nchains, st->nchains);
	CHECK_EQ(ld.replicas, st->replicas);
	for (uint32_t i = 0; i < ld.nnodes; i++) {
		CHECK_EQ(ld.nodes[i].last_hb_ns, 7 * SEC); /* a full timeout to report */
		CHECK(strcmp(ld.nodes[i].zone, st->nodes[i].zone) == 0);
	}
	CHECK_RC(stk_mgmt_state_encode(&ld, &b, &blen), 0);
	CHECK(b && alen == blen && memcmp(a, b, alen) == 0);
	a[alen / 2] ^= 0x10;
	CHECK_RC(stk_mgmt_state_decode(&ld, a, alen, 0), -EBADMSG);
	CHECK_EQ(ld.nnodes, st->nnodes);
	CHECK_RC(stk_mgmt_state_decode(&ld, a, 7, 0), -EBADMSG);
	CHECK_RC(stk_mgmt_state_decode(&ld, b, blen - 1, 0), -EBADMSG);
	rc = check_failures() ? 1 : 0;
	free(a);
	free(b);
	stk_mgmt_state_free(&ld);
	return rc;
}

/*
 * Client identities: add issues increasing generations and refuses a name held;
 * rm revokes the held one (listed as revoked) and the name may be added again
 * under a new generation; all of it survives an encode and decode; each change
 * bumps the routing version (nodes fetch the list again with the table).
 */
static int test_clients(void)
{
	struct stk_mgmt_state st, ld;
	struct stk_auth_client c, *rev = NULL;
	uint64_t v, gen = 0;
	uint32_t n = 0;
	uint8_t *buf = NULL;
	size_t len = 0;
	int rc = 1;

	stk_mgmt_state_init(&st);
	stk_mgmt_state_init(&ld);
	memset(&c, 0, sizeof(c));
	snprintf(c.name, sizeof(c.name), "alice");
	snprintf(c.subtree, sizeof(c.subtree), "/teamA");
	c.flags = STK_CLIENT_RO;
	c.anon_uid = c.anon_gid = 65534;
	v = st.version;
	CHECK_RC(stk_mgmt_state_client_add(&st, &c), 0);
	CHECK(c.gen == 1 && st.version > v && st.dirty);
	CHECK_RC(stk_mgmt_state_client_add(&st, &c), -EEXIST);
	snprintf(c.subtree, sizeof(c.subtree), "teamA");
	snprintf(c.name, sizeof(c.name), "bob");
	CHECK_RC(stk_mgmt_state_client_add(&st, &c), -EINVAL);
	snprintf(c.subtree, sizeof(c.subtree), "/");
	CHECK_RC(stk_mgmt_state_client_add(&st, &c), 0);
	CHECK_EQ(c.gen, 2);
	CHECK_RC(stk_mgmt_state_clients_revoked(&st, &rev, &n), 0);
	CHECK(n == 0 && rev == NULL);
	v = st.version;
	CHECK_RC(stk_mgmt_state_client_rm(&st, "alice", &gen), 0);
	CHECK(gen == 1 && st.version > v);
	CHECK_RC(stk_mgmt_state_client_rm(&st, "alice", &gen), -ENOENT);
	CHECK_RC(stk_mgmt_state_client_rm(&st, "carol", &gen), -ENOENT);
	snprintf(c.name, sizeof(c.name), "alice");
	CHECK_RC(stk_mgmt_state_client_add(&st, &c), 0);
	CHECK_EQ(c.gen, 3);
	REQUIRE(stk_mgmt_state_encode(&st, &buf, &len) == 0);
	CHECK_RC(stk_mgmt_state_decode(&ld, buf, len, 0), 0);
	CHECK_EQ(ld.nclients, 3);
	CHECK_EQ(ld.next_client_gen, 4);
	CHECK(ld.nclients == 3 && strcmp(ld.clients[0].id.subtree, "/teamA") == 0 &&
	      ld.clients[0].removed && ld.clients[0].id.flags == STK_CLIENT_RO &&
	      !ld.clients[2].removed && ld.clients[2].id.gen == 3);
	CHECK_RC(stk_mgmt_state_clients_revoked(&ld, &rev, &n), 0);
	CHECK(n == 1 && rev && strcmp(rev[0].name, "alice") == 0 && rev[0].gen == 1);
	rc = check_failures() ? 1 : 0;
	free(rev);
	free(buf);
	stk_mgmt_state_free(&ld);
	stk_mgmt_state_free(&st);
	return rc;
}

/* mgmtd lost its state: two storage nodes come back with their old ids and targets. */
static int test_lost_state(void)
{
	struct stk_mgmt_state st;
	struct stk_msg_mgmt_register_req rq;
	struct stk_msg_target_info t[2];
	uint32_t node, ids[2];
	int rc = 1;

	stk_mgmt_state_init(&st);
	rq = req(2, STK_ROLE_STORAGE, "10.0.0.2:9500", 1);
	tinfo(&t[0], 2, "/b", 0);
	if (stk_mgmt_state_register(&st, &rq, t, 1, SEC, &node, ids) || node != 2 || ids[0] != 2)
		goto out;
	rq = req(1, STK_ROLE_STORAGE, "10.0.0.1:9500", 1);
	tinfo(&t[0], 1, "/a", 0);
	if (stk_mgmt_state_register(&st, &rq, t, 1, SEC, &node, ids) || node != 1 || ids[0] != 1)
		goto out;
	if (st.nnodes != 2 || stk_mgmt_state_target(&st, 1)->node_id != 1 ||
	    stk_mgmt_state_target(&st, 2)->node_id != 2)
		goto out;
	/* Chain n holds target n again, whatever order the targets came back in. */
	if (st.nchains != 2 || st.chains[0].targets[0] != 1 || st.chains[1].targets[0] != 2 ||
	    st.chains[0].ntargets != 1 || st.chains[0].version != 2)
		goto out;
	/* A new node and a new target get ids after every id seen. */
	rq = req(0, STK_ROLE_STORAGE, "10.0.0.3:9500", 1);
	tinfo(&t[0], 0, "/c", 0);
	if (stk_mgmt_state_register(&st, &rq, t, 1, SEC, &node, ids) || node != 3 || ids[0] != 3 ||
	    st.nchains != 3 || st.chains[2].targets[0] != 3)
		goto out;
	/* A target id far past the table is not worth thousands of empty chains. */
	rq = req(3, STK_ROLE_STORAGE, "10.0.0.3:9500", 2);
	tinfo(&t[0], 3, "/c", 0);
	tinfo(&t[1], 1000000, "/d", 0);
	if (stk_mgmt_state_register(&st, &rq, t, 2, SEC, &node, ids) || ids[1] != 1000000 ||
	    st.nchains != 4 || st.chains[3].targets[0] != 1000000 || st.next_target_id != 1000001)
		goto out;
	rc = 0;
out:
	if (rc)
		CHECK_FAIL("lost-state registration failed");
	stk_mgmt_state_free(&st);
	return rc;
}

/* A node's host id and its targets' avail and device reach the routing table. */
static int test_host_identity(void)
{
	struct stk_mgmt_state st;
	struct stk_msg_mgmt_register_req rq;
	struct stk_msg_target_info t[1];
	struct stk_routing rt;
	uint32_t nid = 0, ids[1];
	uint64_t v;
	int rc = 0;

	stk_mgmt_state_init(&st);
	rq = req(0, STK_ROLE_STORAGE, "127.0.0.2:9402", 1);
	stk_strlcpy(rq.host_id, "hostA", sizeof(rq.host_id));
	tinfo(&t[0], 0, "/a/t0", 100);
	t[0].avail = 700;
	t[0].dev = 42;
	REQUIRE(stk_mgmt_state_register(&st, &rq, t, 1, 1 * SEC, &nid, ids) == 0);
	REQUIRE(routing(&st, 0, 1 * SEC, &rt) == 0);
	REQUIRE(rt.nnodes == 1 && strcmp(rt.nodes[0].host_id, "hostA") == 0);
	REQUIRE(rt.ntargets == 1 && rt.targets[0].avail == 700 && rt.targets[0].dev == 42);
	stk_routing_free(&rt);
	/* The same host id again: no new routing version; another one: a new version. */
	v = st.version;
	stk_mgmt_state_set_host(&st, nid, "hostA");
	REQUIRE(st.version == v);
	stk_mgmt_state_set_host(&st, nid, "hostB");
	REQUIRE(st.version > v);
	stk_mgmt_state_set_host(&st, nid + 100, "hostC"); /* unknown node: ignored */
	/* Heartbeats refresh avail and dev. */
	t[0].target_id = ids[0];
	t[0].avail = 650;
	t[0].dev = 43;
	REQUIRE(stk_mgmt_state_heartbeat(&st, nid, t, 1, 2 * SEC) == 0);
	REQUIRE(routing(&st, 0, 2 * SEC, &rt) == 0);
	REQUIRE(strcmp(rt.nodes[0].host_id, "hostB") == 0);
	REQUIRE(rt.targets[0].avail == 650 && rt.targets[0].dev == 43);
	stk_routing_free(&rt);
	stk_mgmt_state_free(&st);
	return rc;
}

/*
 * The assignment rules of shard 1 by store identity, from a fresh state: the
 * scenario of issue 21 (a second meta with an empty store beside the first, the
 * first away, the second restarted) never hands the shard to the empty store.
 */
static int test_identity(void)
{
	struct stk_mgmt_state st;
	struct stk_msg_mgmt_register_req rq;
	struct stk_routing rt;
	uint32_t node, ids[1];
	int rc = 1;

	stk_mgmt_state_init(&st);
	/* A meta node must say which store it has. */
	rq = meta_req(0, "10.0.0.1:9600", 0);
	if (stk_mgmt_state_register(&st, &rq, NULL, 0, SEC, &node, ids) != -EINVAL ||
	    st.nnodes != 0)
		goto out;
	/* The first meta node gives shard 1 its identity; the second (empty store) is refused. */
	rq = meta_req(0, "10.0.0.1:9600", 0x11);
	rq.ns_hi = 0x22;
	if (stk_mgmt_state_register(&st, &rq, NULL, 0, SEC, &node, ids) || node != 1 ||
	    st.shards[0].node != 1 || st.shards[0].ns.hi != 0x22 || st.shards[0].ns.lo != 0x11)
		goto out;
	rq = meta_req(0, "10.0.0.2:9600", 0x33);
	if (stk_mgmt_state_register(&st, &rq, NULL, 0, SEC, &node, ids) || node != 2 ||
	    st.shards[0].node != 1 || !stk_mgmt_state_node(&st, 2)->refused)
		goto out;
	/* The first goes away; the second registers again: still refused, the shard waits. */
	if (stk_mgmt_state_heartbeat(&st, 2, NULL, 0, 20 * SEC) ||
	    stk_mgmt_state_expire(&st, 20 * SEC, TIMEOUT) != 1 ||
	    stk_mgmt_state_node(&st, 1)->state != STK_NODE_OFFLINE)
		goto out;
	rq = meta_req(2, "10.0.0.2:9600", 0x33);
	if (stk_mgmt_state_register(&st, &rq, NULL, 0, 21 * SEC, &node, ids) || node != 2 ||
	    st.shards[0].node != 1 || !stk_mgmt_state_node(&st, 2)->refused)
		goto out;
	if (routing(&st, 0, 21 * SEC, &rt))
		goto out;
	if (rt.nshards != 1 || rt.shards[0].node_id != 1 || rt.shards[0].ns.lo != 0x11 ||
	    !stk_routing_node(&rt, 2)->refused || stk_routing_node(&rt, 2)->ns.lo != 0x33 ||
	    stk_routing_node(&rt, 1)->refused) {
		stk_routing_free(&rt);
		goto out;
	}
	stk_routing_free(&rt);
	/* The first one's store comes back at another address without its node id. */
	rq = meta_req(0, "10.0.0.9:9700", 0x11);
	rq.ns_hi = 0x22;
	if (stk_mgmt_state_register(&st, &rq, NULL, 0, 22 * SEC, &node, ids) || node != 3 ||
	    st.shards[0].node != 3 || stk_mgmt_state_node(&st, 3)->refused)
		goto out;
	/* The owner's id with another store (its folder wiped): refused, the shard has no node. */
	rq = meta_req(3, "10.0.0.9:9700", 0x44);
	if (stk_mgmt_state_register(&st, &rq, NULL, 0, 23 * SEC, &node, ids) || node != 3 ||
	    st.shards[0].node != 0 || !stk_mgmt_state_node(&st, 3)->refused)
		goto out;
	if (routing(&st, 0, 23 * SEC, &rt))
		goto out;
	if (rt.nshards != 1 || rt.shards[0].node_id != 0 || rt.shards[0].ns.hi != 0x22) {
		stk_routing_free(&rt);
		goto out;
	}
	stk_routing_free(&rt);
	/* The refused node 2 is given its right store: it is no longer refused and serves. */
	rq = meta_req(2, "10.0.0.2:9600", 0x11);
	rq.ns_hi = 0x22;
	if (stk_mgmt_state_register(&st, &rq, NULL, 0, 24 * SEC, &node, ids) || node != 2 ||
	    st.shards[0].node != 2 || stk_mgmt_state_node(&st, 2)->refused)
		goto out;
	rc = 0;
out:
	if (rc)
		CHECK_FAIL("shard identity rules failed");
	stk_mgmt_state_free(&st);
	return rc;
}

/*
 * A state file of format 1 (before identities): it loads, shard 1 keeps its owner,
 * another meta node waits (neither serving nor refused), and the owner's first
 * registration gives the shard its identity.
 */
static int test_old_format(void)
{
	char dir[64], path[128];
	struct stk_msg_mgmt_register_req rq;
	struct stk_mgmt_state st;
	uint8_t buf[256];
	struct stk_wbuf w;
	uint32_t node, ids[1];
	int rc = 1;

	stk_mgmt_state_init(&st);
	REQUIRE(check_tmpdir(dir, sizeof(dir), "mgmtd") == 0);
	snprintf(path, sizeof(path), "%s/mgmtd.state", dir);
	stk_wbuf_init(&w, buf, sizeof(buf));
	stk_put_u32(&w, 0x4D4B5453u);
	stk_put_u32(&w, 1);    /* format */
	stk_put_u64(&w, 1000); /* routing version */
	stk_put_u32(&w, 3);    /* next node id */
	stk_put_u32(&w, 1);    /* next target id */
	stk_put_u32(&w, 1);    /* shard1_node */
	stk_put_u32(&w, 1);    /* nnodes */
	stk_put_u32(&w, 0);
	stk_put_u32(&w, 0);
	stk_put_u32(&w, 1);
	stk_put_u8(&w, STK_ROLE_META);
	stk_put_u8(&w, STK_NODE_ONLINE);
	stk_put_str(&w, "10.0.0.1:9600");
	stk_put_i64(&w, 0);
	stk_put_u32(&w, stk_crc32c(0, buf, w.len));
	if (w.err || stk_write_file_atomic(path, buf, w.len))
		goto out;
	if (stk_mgmt_state_load(&st, path, SEC) || st.shards[0].node != 1 ||
	    !stk_ns_id_is_zero(&st.shards[0].ns) || st.nnodes != 1 || st.version != 1000)
		goto out;
	rq = meta_req(0, "10.0.0.2:9600", 0x55);
	if (stk_mgmt_state_register(&st, &rq, NULL, 0, SEC, &node, ids) || node != 3 ||
	    st.shards[0].node != 1 || stk_mgmt_state_node(&st, 3)->refused ||
	    !stk_ns_id_is_zero(&st.shards[0].ns))
		goto out;
	rq = meta_req(1, "10.0.0.1:9600", 0x66);
	if (stk_mgmt_state_register(&st, &rq, NULL, 0, SEC, &node, ids) || node != 1 ||
	    st.shards[0].node != 1 || st.shards[0].ns.lo != 0x66)
		goto out;
	rc = 0;
out:
	if (rc)
		CHECK_FAIL("format 1 state file failed");
	stk_mgmt_state_free(&st);
	check_rm_rf(dir);
	return rc;
}

/* A storage node of two targets in failure domain `zone` ("": its host id). */
static uint32_t add_node(struct stk_mgmt_state *st, const char *addr, const char *zone,
			 const char *host, uint64_t now)
{
	struct stk_msg_mgmt_register_req rq = req(0, STK_ROLE_STORAGE, addr, 2);
	struct stk_msg_target_info t[2];
	uint32_t node = 0, ids[2];

	stk_strlcpy(rq.zone, zone, sizeof(rq.zone));
	stk_strlcpy(rq.host_id, host, sizeof(rq.host_id));
	tinfo(&t[0], 0, "/t0", 0);
	tinfo(&t[1], 0, "/t1", 0);
	if (stk_mgmt_state_register(st, &rq, t, 2, now, &node, ids))
		return 0;
	return node;
}

/*
 * Replicated chains: R targets of R failure domains each, heads rotated; a member
 * that goes OFFLINE bumps its chain's version; one that comes back after its chain
 * went on is STALE; replicas and zones survive a save and a load.
 */
static int test_replicas(void)
{
	struct stk_mgmt_state st, ld;
	struct stk_msg_target_info t[2];
	char dir[64], path[128];
	uint32_t n1, n2, n3, heads = 0;
	int rc = 1;

	stk_mgmt_state_init(&st);
	stk_mgmt_state_init(&ld);
	st.replicas = 3;
	n1 = add_node(&st, "10.0.0.1:9500", "rack1", "h1", SEC);
	n2 = add_node(&st, "10.0.0.2:9500", "rack2", "h2", SEC);
	REQUIRE(n1 && n2 && st.nchains == 0); /* two domains: no chain of three yet */
	/* a second node in rack1 adds no domain */
	REQUIRE(add_node(&st, "10.0.0.9:9500", "rack1", "h9", SEC) && st.nchains == 0);
	n3 = add_node(&st, "10.0.0.3:9500", "", "h3", SEC); /* its host id is its domain */
	REQUIRE(n3 && st.nchains == 2);
	REQUIRE(strcmp(stk_mgmt_state_node(&st, n3)->zone, "h3") == 0);
	for (uint32_t i = 0; i < st.nchains; i++) {
		const struct stk_rt_chain *c = &st.chains[i];
		char zones[3][STK_HOST_ID_MAX];

		REQUIRE(c->ntargets == 3 && c->version == 1);
		for (int j = 0; j < 3; j++) {
			const struct stk_rt_target *m = stk_mgmt_state_target(&st, c->targets[j]);

			REQUIRE(m && m->state == STK_TARGET_SERVING);
			stk_strlcpy(zones[j], stk_mgmt_state_node(&st, m->node_id)->zone,
				    sizeof(zones[j]));
		}
		REQUIRE(strcmp(zones[0], zones[1]) && strcmp(zones[0], zones[2]) &&
			strcmp(zones[1], zones[2]));
		heads |= 1u << stk_mgmt_state_target(&st, c->targets[0])->node_id;
	}
	REQUIRE(__builtin_popcount(heads) == 2); /* the heads are on two nodes */

	/* n2 falls silent: its targets go OFFLINE, both chains' versions move on */
	for (uint32_t id = 1; id <= 4; id++)
		if (id != n2)
			REQUIRE(stk_mgmt_state_heartbeat(&st, id, NULL, 0, 20 * SEC) == 0);
	REQUIRE(stk_mgmt_state_expire(&st, 20 * SEC, TIMEOUT) == 1);
	for (uint32_t i = 0; i < st.nchains; i++)
		REQUIRE(st.chains[i].version == 2);

	/* n2 is back: its targets are SYNCING, last in their chains, versions moved on */
	tinfo(&t[0], 3, "/t0", 0);
	tinfo(&t[1], 4, "/t1", 0);
	REQUIRE(stk_mgmt_state_heartbeat(&st, n2, t, 2, 21 * SEC) == 0);
	REQUIRE(stk_mgmt_state_node(&st, n2)->state == STK_NODE_ONLINE);
	REQUIRE(stk_mgmt_state_target(&st, 3)->state == STK_TARGET_SYNCING);
	REQUIRE(stk_mgmt_state_target(&st, 4)->state == STK_TARGET_SYNCING);
	REQUIRE(!stk_mgmt_target_active(STK_TARGET_SYNCING));
	for (uint32_t i = 0; i < st.nchains; i++) {
		const struct stk_rt_chain *c = &st.chains[i];

		REQUIRE(c->version == 3 && (c->targets[2] == 3 || c->targets[2] == 4));
	}
	/* offline, then syncing: two changes each, counted */
	REQUIRE(stk_mgmt_state_target(&st, 3)->state_changes == 2);
	REQUIRE(stk_mgmt_state_target(&st, 1)->state_changes == 0);
	/* a heartbeat carries the copy's progress; it reaches the routing table */
	t[0].sync_chain = 1;
	t[0].sync_permille = 431;
	t[0].sync_checked = 1200;
	t[0].sync_copied = 35;
	t[0].sync_bytes = 35u << 20;
	REQUIRE(stk_mgmt_state_heartbeat(&st, n2, t, 2, 22 * SEC) == 0);
	{
		struct stk_routing rt;
		const struct stk_rt_target *r3;

		REQUIRE(routing(&st, 0, 22 * SEC, &rt) == 0);
		r3 = stk_routing_target(&rt, 3);
		REQUIRE(r3 && r3->sync_permille == 431 && r3->sync_checked == 1200 &&
			r3->sync_copied == 35 && r3->sync_bytes == 35u << 20);
		REQUIRE(stk_routing_target(&rt, 4)->sync_permille == 0);
		stk_routing_free(&rt);
	}
	/* caught up: a report for another version is refused, the right one serves */
	REQUIRE(stk_mgmt_state_target_synced(&st, n2, 3, st.chains[0].targets[2] == 3 ? 1 : 2,
					     2) == -ESTALE);
	REQUIRE(stk_mgmt_state_target_synced(&st, n1, 3, 1, 3) == -ENOENT);
	REQUIRE(stk_mgmt_state_target_synced(&st, n2, 3, st.chains[0].targets[2] == 3 ? 1 : 2,
					     3) == 0);
	REQUIRE(stk_mgmt_state_target(&st, 3)->state == STK_TARGET_SERVING);
	/* serving again: its copy's figures are gone, and the change counted */
	REQUIRE(stk_mgmt_state_target(&st, 3)->sync_permille == 0 &&
		stk_mgmt_state_target(&st, 3)->sync_checked == 0);
	REQUIRE(stk_mgmt_state_target(&st, 3)->state_changes == 3);

	REQUIRE(check_tmpdir(dir, sizeof(dir), "mgmtd-r") == 0);
	snprintf(path, sizeof(path), "%s/mgmtd.state", dir);
	if (stk_mgmt_state_save(&st, path) || stk_mgmt_state_load(&ld, path, 30 * SEC))
		goto out;
	if (ld.replicas != 3 || ld.nchains != 2 || ld.chains[0].version < 3 ||
	    stk_mgmt_state_target(&ld, 4)->state != STK_TARGET_SYNCING ||
	    strcmp(stk_mgmt_state_node(&ld, n1)->zone, "rack1") ||
	    strcmp(stk_mgmt_state_node(&ld, n3)->zone, "h3"))
		goto out;
	rc = 0;
out:
	if (rc)
		CHECK_FAIL("replicas or zones lost in a save and load");
	check_rm_rf(dir);
	stk_mgmt_state_free(&ld);
	stk_mgmt_state_free(&st);
	return rc;
}

/*
 * A node gone longer than the replace time: each of its targets is replaced in its
 * chain by a free target of a domain the chain lacks (SYNCING, last), never by one
 * of a domain the chain already holds; not before the time, and never when 0.
 */
static int test_replace(void)
{
	struct stk_mgmt_state st;
	uint32_t n1, n2, n3, n4, n5, v[2];
	int rc = 1;

	stk_mgmt_state_init(&st);
	st.replicas = 3;
	n1 = add_node(&st, "10.0.0.1:9500", "rack1", "h1", SEC);
	n2 = add_node(&st, "10.0.0.2:9500", "rack2", "h2", SEC);
	n3 = add_node(&st, "10.0.0.3:9500", "rack3", "h3", SEC);
	REQUIRE(n1 && n2 && n3 && st.nchains == 2);
	n5 = add_node(&st, "10.0.0.5:9500", "rack1", "h5", SEC); /* spare, but rack1 */
	REQUIRE(n5 && st.nchains == 2);
	for (uint32_t i = 0; i < 2; i++)
		v[i] = st.chains[i].version;
	/* n2 falls silent at 20 s */
	for (uint32_t id = 1; id <= 4; id++)
		if (id != n2)
			REQUIRE(stk_mgmt_state_heartbeat(&st, id, NULL, 0, 20 * SEC) == 0);
	REQUIRE(stk_mgmt_state_expire(&st, 20 * SEC, TIMEOUT) == 1);
	/* only a rack1 target is free: it may not join a chain that holds rack1 */
	REQUIRE(stk_mgmt_state_replace(&st, 100 * SEC, 10 * SEC, 0) == 0);
	n4 = add_node(&st, "10.0.0.4:9500", "rack4", "h4", 100 * SEC);
	REQUIRE(n4 && st.nchains == 2); /* one domain free: no new chain */
	REQUIRE(stk_mgmt_state_replace(&st, 100 * SEC, 0, 0) == 0); /* 0: never */
	REQUIRE(stk_mgmt_state_replace(&st, 100 * SEC, 10 * SEC, 0) == 2);
	for (uint32_t i = 0; i < 2; i++) {
		const struct stk_rt_chain *c = &st.chains[i];
		const struct stk_rt_target *last = stk_mgmt_state_target(&st, c->targets[2]);

		REQUIRE(c->ntargets == 3 && c->version > v[i] + 1);
		REQUIRE(last && last->node_id == n4 && last->state == STK_TARGET_SYNCING);
		for (int j = 0; j < 2; j++) {
			const struct stk_rt_target *m = stk_mgmt_state_target(&st, c->targets[j]);

			REQUIRE(m && m->node_id != n2 && m->state == STK_TARGET_SERVING);
		}
	}
	/* nothing more to replace; n2's targets are in no chain */
	REQUIRE(stk_mgmt_state_replace(&st, 200 * SEC, 10 * SEC, 0) == 0);
	rc = 0;
	stk_mgmt_state_free(&st);
	return rc;
}

/*
 * Every member of a chain lost, one after the other: the last one to go holds
 * every acknowledged change. Back in any order, only it serves by itself; one back
 * before it waits, SYNCING, and copies from it once it is back.
 */
static int test_all_lost(void)
{
	struct stk_mgmt_state st;
	struct stk_msg_target_info t[2];
	uint32_t n[4], last, first_gone;
	const struct stk_rt_chain *c;
	int rc = 1;

	stk_mgmt_state_init(&st);
	st.replicas = 3;
	n[1] = add_node(&st, "10.0.0.1:9500", "rack1", "h1", SEC);
	n[2] = add_node(&st, "10.0.0.2:9500", "rack2", "h2", SEC);
	n[3] = add_node(&st, "10.0.0.3:9500", "rack3", "h3", SEC);
	REQUIRE(n[1] == 1 && n[2] == 2 && n[3] == 3 && st.nchains == 2);
	c = &st.chains[0];
	/* the chain's members die one by one: the head first, the tail last */
	first_gone = stk_mgmt_state_target(&st, c->targets[0])->node_id;
	last = stk_mgmt_state_target(&st, c->targets[2])->node_id;
	{
		uint32_t order[3] = {first_gone, 6 - first_gone - last, last};
		uint64_t now = 20 * SEC;

		for (int k = 0; k < 3; k++, now += 20 * SEC) {
			for (uint32_t id = 1; id <= 3; id++) {
				int dead = 0;

				for (int q = 0; q <= k; q++)
					dead |= order[q] == id;
				if (!dead)
					REQUIRE(stk_mgmt_state_heartbeat(&st, id, NULL, 0, now) == 0);
			}
			REQUIRE(stk_mgmt_state_expire(&st, now, TIMEOUT) == 1);
		}
	}
	REQUIRE(stk_mgmt_state_target(&st, c->targets[0])->node_id == last);
	REQUIRE(stk_mgmt_state_target(&st, c->targets[2])->node_id == first_gone);
	/* the first to go comes back first: it waits */
	tinfo(&t[0], 2 * first_gone - 1, "/t0", 0);
	tinfo(&t[1], 2 * first_gone, "/t1", 0);
	REQUIRE(stk_mgmt_state_heartbeat(&st, first_gone, t, 2, 100 * SEC) == 0);
	REQUIRE(stk_mgmt_state_target(&st, c->targets[2])->state == STK_TARGET_SYNCING);
	REQUIRE(stk_mgmt_state_target(&st, c->targets[0])->state == STK_TARGET_OFFLINE);
	/* the last to go comes back: it serves, the other copies from it */
	tinfo(&t[0], 2 * last - 1, "/t0", 0);
	tinfo(&t[1], 2 * last, "/t1", 0);
	REQUIRE(stk_mgmt_state_heartbeat(&st, last, t, 2, 101 * SEC) == 0);
	REQUIRE(stk_mgmt_state_target(&st, c->targets[0])->state == STK_TARGET_SERVING);
	REQUIRE(stk_mgmt_state_target(&st, c->targets[0])->node_id == last);
	REQUIRE(stk_mgmt_state_target(&st, c->targets[2])->state == STK_TARGET_SYNCING);
	rc = 0;
	stk_mgmt_state_free(&st);
	return rc;
}

/*
 * `admin accept-loss`: every member of a chain lost, the newest copy gone for
 * good. Refused while no member is back, or while one works; then the first member
 * back serves, the others leave the chain (the newest, back later holding chunks,
 * is WIPING, never a member again unasked) and a spare of a fourth domain joins.
 */
static int test_accept_loss(void)
{
	struct stk_mgmt_state st;
	struct stk_msg_target_info t[2];
	uint32_t n[5], kept = 0, dropped = 0, added = 0, newest, lost;
	struct stk_rt_chain *c;
	uint64_t now = 20 * SEC;
	int rc = 1;

	stk_mgmt_state_init(&st);
	st.replicas = 3;
	for (uint32_t i = 1; i <= 3; i++) {
		char addr[32], zone[8], host[8];

		snprintf(addr, sizeof(addr), "10.0.0.%u:9500", i);
		snprintf(zone, sizeof(zone), "rack%u", i);
		snprintf(host, sizeof(host), "h%u", i);
		n[i] = add_node(&st, addr, zone, host, SEC);
	}
	REQUIRE(st.nchains == 2);
	c = &st.chains[0];
	REQUIRE(stk_mgmt_state_accept_loss(&st, 99, &kept, &dropped, &added) == -ENOENT);
	REQUIRE(stk_mgmt_state_accept_loss(&st, c->id, &kept, &dropped, &added) == -EBUSY);
	/* all three die at once */
	REQUIRE(stk_mgmt_state_expire(&st, now, TIMEOUT) == 3);
	lost = c->targets[0];
	newest = stk_mgmt_state_target(&st, lost)->node_id;
	REQUIRE(stk_mgmt_state_accept_loss(&st, c->id, &kept, &dropped, &added) == -EAGAIN);
	/* a node that is not the newest's comes back: it waits for the newest */
	{
		uint32_t back = newest == n[1] ? n[2] : n[1];

		tinfo(&t[0], 2 * back - 1, "/t0", 100);
		tinfo(&t[1], 2 * back, "/t1", 100);
		REQUIRE(stk_mgmt_state_heartbeat(&st, back, t, 2, now + SEC) == 0);
		/* a fourth node, of a rack of its own: its targets are free spares */
		n[4] = add_node(&st, "10.0.0.4:9500", "rack4", "h4", now + SEC);
		REQUIRE(stk_mgmt_state_accept_loss(&st, c->id, &kept, &dropped, &added) == 0);
		REQUIRE(stk_mgmt_state_target(&st, kept)->node_id == back);
		/* one spare: the fourth rack's second target would share its domain */
		REQUIRE(dropped == 2 && added == 1 && c->ntargets == 2);
		REQUIRE(c->targets[0] == kept);
		REQUIRE(stk_mgmt_state_target(&st, kept)->state == STK_TARGET_SERVING);
		REQUIRE(stk_mgmt_state_target(&st, c->targets[1])->node_id == n[4]);
		REQUIRE(stk_mgmt_state_target(&st, c->targets[1])->state == STK_TARGET_SYNCING);
		REQUIRE(stk_mgmt_state_accept_loss(&st, c->id, &kept, &dropped, &added) == -EBUSY);
	}
	/* the newest comes back: in no chain, holding chunks: WIPING, not serving */
	tinfo(&t[0], 2 * newest - 1, "/t0", 100);
	tinfo(&t[1], 2 * newest, "/t1", 100);
	REQUIRE(stk_mgmt_state_heartbeat(&st, newest, t, 2, now + 2 * SEC) == 0);
	REQUIRE(stk_mgmt_state_target(&st, lost)->state == STK_TARGET_WIPING);
	for (uint8_t j = 0; j < c->ntargets; j++)
		REQUIRE(c->targets[j] != lost);
	rc = 0;
	stk_mgmt_state_free(&st);
	return rc;
}

/* Working members of c, and whether any two of its members share a failure domain. */
static uint32_t chain_working(struct stk_mgmt_state *st, const struct stk_rt_chain *c, int *clash)
{
	uint32_t w = 0;

	*clash = 0;
	for (uint8_t j = 0; j < c->ntargets; j++) {
		const struct stk_rt_target *m = stk_mgmt_state_target(st, c->targets[j]);

		w += m && stk_mgmt_target_active(m->state);
		for (uint8_t k = j + 1; k < c->ntargets; k++) {
			const struct stk_rt_target *o = stk_mgmt_state_target(st, c->targets[k]);

			*clash |= m && o &&
				  strcmp(stk_mgmt_state_node(st, m->node_id)->zone,
					 stk_mgmt_state_node(st, o->node_id)->zone) == 0;
		}
	}
	return w;
}

/*
 * Runs the rebalancer round after round as mgmtd would, each copy done at once
 * (MGMT_TARGET_SYNCED) and each stale target wiped (MGMT_TARGET_WIPED), until a
 * round changes nothing. Checks on the way that no chain ever has fewer working
 * members than it had, and that a finished chain has no two members of one
 * domain. Returns how many moves started, or -1 if it never settles.
 */
static int run_moves(struct stk_mgmt_state *st, uint64_t now, unsigned max)
{
	uint64_t started = st->moves_started;
	uint32_t before[64] = {0}; /* a chain formed meanwhile starts from 0 */

	for (uint32_t i = 0; i < st->nchains && i < 64; i++) {
		int clash;

		before[i] = chain_working(st, &st->chains[i], &clash);
	}
	for (int round = 0; round < 200; round++) {
		unsigned changes = stk_mgmt_state_rebalance(st, now, max);

		if (st->nmoves > STK_MAX(max, 1u))
			return -1;
		for (uint32_t i = 0; i < st->nchains && i < 64; i++) {
			int clash;
			uint32_t w = chain_working(st, &st->chains[i], &clash);

			if (w < before[i])
				return -1;
			before[i] = w;
			if (clash && !stk_mgmt_state_chain_move(st, st->chains[i].id))
				return -1;
		}
		for (uint32_t i = 0; i < st->nmoves; i++) {
			const struct stk_mgmt_move *m = &st->moves[i];
			const struct stk_rt_target *in = stk_mgmt_state_target(st, m->in);
			const struct stk_rt_chain *c = &st->chains[m->chain_id - 1];

			if (stk_mgmt_state_target_synced(st, in->node_id, in->id, c->id, c->version))
				return -1;
			changes++;
			break; /* the array moved */
		}
		for (uint32_t i = 0; i < st->ntargets; i++)
			if (st->targets[i].state == STK_TARGET_WIPING) {
				if (stk_mgmt_state_target_wiped(st, st->targets[i].node_id,
								st->targets[i].id))
					return -1;
				changes++;
			}
		if (!changes)
			return (int)(st->moves_started - started);
	}
	return -1;
}

/*
 * The rebalancer (stk_mgmt_state_rebalance): a new cluster of nodes that register
 * together starts balanced and nothing moves; a node added later gets chain
 * memberships by moves and new chains until every node holds as many, and then
 * nothing moves; a drained node is emptied with no chain ever short of a copy;
 * a cancelled drain abandons its move; a move whose new member goes offline is
 * abandoned; a target that left its chain is WIPING until its node says it is
 * empty; moves and draining survive a save and a load.
 */
static int test_rebalance(void)
{
	struct stk_mgmt_state st, ld;
	struct stk_msg_target_info t[2];
	char dir[64], path[128];
	uint32_t n[6], out, in, cid;
	int rc = 1;

	stk_mgmt_state_init(&st);
	stk_mgmt_state_init(&ld);
	st.replicas = 2;
	st.form_settle_ns = SEC;
	n[1] = add_node(&st, "10.0.0.1:9500", "z1", "h1", SEC);
	n[2] = add_node(&st, "10.0.0.2:9500", "z2", "h2", SEC);
	REQUIRE(n[1] && n[2] && st.nchains == 0); /* not settled: no chain yet */
	n[3] = add_node(&st, "10.0.0.3:9500", "z3", "h3", SEC + SEC / 2);
	REQUIRE(stk_mgmt_state_rebalance(&st, 2 * SEC, 1) == 0 && st.nchains == 0);
	/* settled: three chains over the three nodes, two memberships each, no move */
	REQUIRE(run_moves(&st, 3 * SEC, 1) == 0);
	REQUIRE(st.nchains == 3);
	for (int i = 1; i <= 3; i++)
		REQUIRE(stk_mgmt_state_node_members(&st, n[i]) == 2);

	/* a fourth node: one move, then a new chain of the freed target and its other one */
	n[4] = add_node(&st, "10.0.0.4:9500", "z4", "h4", 10 * SEC);
	REQUIRE(n[4] && st.nchains == 3);
	REQUIRE(stk_mgmt_state_rebalance(&st, 12 * SEC, 0) == 0); /* 0: no balancing */
	REQUIRE(run_moves(&st, 12 * SEC, 1) == 1);
	REQUIRE(st.nchains == 4 && st.moves_finished == 1 && st.nmoves == 0);
	for (int i = 1; i <= 4; i++)
		REQUIRE(stk_mgmt_state_node_members(&st, n[i]) == 2);
	REQUIRE(run_moves(&st, 13 * SEC, 4) == 0); /* balanced: nothing more moves */

	/* a fifth node of two targets: drain node 1 onto it, then remove nothing */
	n[5] = add_node(&st, "10.0.0.5:9500", "z5", "h5", 20 * SEC);
	REQUIRE(stk_mgmt_state_drain(&st, 99, 1) == -ENOENT);
	REQUIRE(stk_mgmt_state_drain(&st, n[1], 1) == 0);
	REQUIRE(run_moves(&st, 22 * SEC, 0) == 2); /* a drain moves with balancing off */
	REQUIRE(stk_mgmt_state_node_members(&st, n[1]) == 0);
	for (int i = 2; i <= 5; i++)
		REQUIRE(stk_mgmt_state_node_members(&st, n[i]) == 2);
	for (uint32_t i = 0; i < st.ntargets; i++) /* node 1's targets stay out of chains */
		if (st.targets[i].node_id == n[1])
			REQUIRE(st.targets[i].state == STK_TARGET_SERVING);
	REQUIRE(run_moves(&st, 23 * SEC, 1) == 0);

	/* undrained: a move back onto it starts (its load is lowest) */
	REQUIRE(stk_mgmt_state_drain(&st, n[1], 0) == 0);
	REQUIRE(stk_mgmt_state_rebalance(&st, 24 * SEC, 1) >= 1 && st.nmoves == 1);
	out = st.moves[0].out;
	in = st.moves[0].in;
	cid = st.moves[0].chain_id;
	REQUIRE(stk_mgmt_state_target(&st, in)->node_id == n[1] &&
		stk_mgmt_state_target(&st, in)->state == STK_TARGET_SYNCING);
	REQUIRE(st.chains[cid - 1].ntargets == 3 && st.chains[cid - 1].targets[2] == in);

	/* saved and loaded with the move in flight */
	REQUIRE(check_tmpdir(dir, sizeof(dir), "mgmtd-rb") == 0);
	snprintf(path, sizeof(path), "%s/mgmtd.state", dir);
	REQUIRE(stk_mgmt_state_drain(&st, n[2], 1) == 0);
	if (stk_mgmt_state_save(&st, path) || stk_mgmt_state_load(&ld, path, 30 * SEC) ||
	    ld.nmoves != 1 || ld.moves[0].in != in || ld.moves[0].out != out ||
	    ld.moves[0].chain_id != cid || !stk_mgmt_state_node(&ld, n[2])->draining ||
	    stk_mgmt_state_node(&ld, n[1])->draining) {
		CHECK_FAIL("moves or draining lost in a save and load");
		goto out;
	}
	REQUIRE(stk_mgmt_state_drain(&st, n[2], 0) == 0);

	/* the new member's node goes silent: the move is abandoned, the chain as it was */
	for (int i = 1; i <= 5; i++)
		if (i != 1)
			REQUIRE(stk_mgmt_state_heartbeat(&st, n[i], NULL, 0, 40 * SEC) == 0);
	REQUIRE(stk_mgmt_state_expire(&st, 40 * SEC, TIMEOUT) == 1);
	REQUIRE(stk_mgmt_state_rebalance(&st, 40 * SEC, 0) >= 1);
	REQUIRE(st.nmoves == 0 && st.moves_abandoned == 1);
	REQUIRE(st.chains[cid - 1].ntargets == 2 && st.chains[cid - 1].targets[0] != in &&
		st.chains[cid - 1].targets[1] != in);
	/* it comes back holding the chunks it had begun to copy: WIPING, then free */
	tinfo(&t[0], in, "/t", 100);
	tinfo(&t[1], in == 1 ? 2 : 1, "/t", 0);
	REQUIRE(stk_mgmt_state_heartbeat(&st, n[1], t, 2, 41 * SEC) == 0);
	REQUIRE(stk_mgmt_state_target(&st, in)->state == STK_TARGET_WIPING);
	REQUIRE(stk_mgmt_state_target_wiped(&st, n[2], in) == -ENOENT);
	REQUIRE(stk_mgmt_state_target_wiped(&st, n[1], in) == 0);
	REQUIRE(stk_mgmt_state_target(&st, in)->state == STK_TARGET_SERVING);
	REQUIRE(stk_mgmt_state_target_wiped(&st, stk_mgmt_state_target(&st, out)->node_id, out) ==
		-ESTALE); /* in a chain: never wiped */

	/* a drain cancelled: its move in flight is abandoned, the chain as it was */
	REQUIRE(stk_mgmt_state_drain(&st, n[3], 1) == 0);
	REQUIRE(stk_mgmt_state_rebalance(&st, 42 * SEC, 0) >= 1 && st.nmoves == 1 &&
		st.moves[0].drain);
	in = st.moves[0].in;
	cid = st.moves[0].chain_id;
	REQUIRE(stk_mgmt_state_drain(&st, n[3], 0) == 0);
	REQUIRE(st.nmoves == 0 && st.moves_abandoned == 2 && st.chains[cid - 1].ntargets == 2);
	REQUIRE(stk_mgmt_state_target(&st, in)->state == STK_TARGET_WIPING);
	rc = 0;
out:
	check_rm_rf(dir);
	stk_mgmt_state_free(&ld);
	stk_mgmt_state_free(&st);
	return rc;
}

/*
 * Replicated metadata (state.h): the first meta leads, the next ones follow
 * whatever their stores, a third waits as a spare; a follower that goes OFFLINE
 * leaves and the spare takes its place; a leader that goes OFFLINE is replaced
 * by the follower of the shard's identity that reported the most; every change
 * takes a new epoch; the routing table and the state file carry it all.
 */
/*
 * Format 7 adds the QoS limits to format 6, which keeps both the client list and
 * the meta replicas; format 6 and the two formats 5 that two branches wrote (the
 * client list alone, the meta replicas alone) all still load, the formats 5 told
 * apart by their lengths.
 */
static int test_format_5_both(void)
{
	struct stk_mgmt_state st, bare, ld;
	struct stk_auth_client c;
	uint8_t *full = NULL, *nocl = NULL, f5[4096];
	size_t lf = 0, ln = 0, meta, cl, pre;
	struct stk_wbuf w;
	int rc = 1;

	stk_mgmt_state_init(&st);
	stk_mgmt_state_init(&ld);
	memset(&c, 0, sizeof(c));
	snprintf(c.name, sizeof(c.name), "alice");
	snprintf(c.subtree, sizeof(c.subtree), "/teamA");
	REQUIRE(stk_mgmt_state_client_add(&st, &c) == 0);
	st.meta_replicas = 3;
	st.shards[0].epoch = 77;
	st.shards[0].nfollowers = 2;
	st.shards[0].followers[0] = 5;
	st.shards[0].followers[1] = 6;
	REQUIRE(stk_mgmt_state_encode(&st, &full, &lf) == 0);
	REQUIRE(stk_mgmt_state_decode(&ld, full, lf, SEC) == 0);
	REQUIRE(ld.nclients == 1 && strcmp(ld.clients[0].id.subtree, "/teamA") == 0 &&
		ld.meta_replicas == 3 && ld.shards[0].epoch == 77 && ld.shards[0].nfollowers == 2 &&
		ld.shards[0].followers[1] == 6);
	/* the same state with no client: the client block's length is the difference */
	bare = st;
	bare.nclients = 0;
	bare.next_client_gen = 0;
	REQUIRE(stk_mgmt_state_encode(&bare, &nocl, &ln) == 0);
	meta = 1 + 8 + 1 + 4 * 2;
	cl = lf - ln + 12;
	pre = lf - 4 - 1 - 4 - meta - cl; /* no QoS limit, no other shard (format 8), the CRC */
	REQUIRE(lf < sizeof(f5));
	/* format 6: ... clients, meta replicas */
	memcpy(f5, full, pre + cl + meta);
	stk_wbuf_init(&w, f5 + 4, 4);
	stk_put_u32(&w, 6);
	stk_wbuf_init(&w, f5 + pre + cl + meta, 4);
	stk_put_u32(&w, stk_crc32c(0, f5, pre + cl + meta));
	REQUIRE(stk_mgmt_state_decode(&ld, f5, pre + cl + meta + 4, SEC) == 0);
	REQUIRE(ld.nclients == 1 && ld.meta_replicas == 3 && ld.shards[0].nfollowers == 2 &&
		ld.nqos == 0);
	/* main's format 5: ... clients */
	memcpy(f5, full, pre + cl);
	stk_wbuf_init(&w, f5 + 4, 4);
	stk_put_u32(&w, 5);
	stk_wbuf_init(&w, f5 + pre + cl, 4);
	stk_put_u32(&w, stk_crc32c(0, f5, pre + cl));
	REQUIRE(stk_mgmt_state_decode(&ld, f5, pre + cl + 4, SEC) == 0);
	REQUIRE(ld.nclients == 1 && strcmp(ld.clients[0].id.name, "alice") == 0 &&
		ld.meta_replicas == 0 && ld.shards[0].nfollowers == 0);
	/* metarepl's format 5: ... meta replicas */
	memcpy(f5, full, pre);
	memcpy(f5 + pre, full + pre + cl, meta);
	stk_wbuf_init(&w, f5 + 4, 4);
	stk_put_u32(&w, 5);
	stk_wbuf_init(&w, f5 + pre + meta, 4);
	stk_put_u32(&w, stk_crc32c(0, f5, pre + meta));
	REQUIRE(stk_mgmt_state_decode(&ld, f5, pre + meta + 4, SEC) == 0);
	REQUIRE(ld.nclients == 0 && ld.meta_replicas == 3 && ld.shards[0].epoch == 77 &&
		ld.shards[0].nfollowers == 2 && ld.shards[0].followers[0] == 5);
	rc = 0;
	free(full);
	free(nocl);
	stk_mgmt_state_free(&st);
	stk_mgmt_state_free(&ld);
	return rc;
}

static int test_meta_replicas(void)
{
	struct stk_msg_mgmt_register_req rq;
	struct stk_mgmt_state st, back;
	struct stk_ns_id ns = {.lo = 0xA};
	struct stk_routing rt;
	uint32_t m1, m2, m3, m4, ids[1];
	uint64_t e0, e1;
	uint8_t *buf;
	size_t len;
	int rc = 1;

	stk_mgmt_state_init(&st);
	st.meta_replicas = 3;
	rq = meta_req(0, "10.0.0.1:9600", 0xA);
	REQUIRE(stk_mgmt_state_register(&st, &rq, NULL, 0, 1 * SEC, &m1, ids) == 0);
	REQUIRE(st.shards[0].node == m1 && st.shards[0].ns.lo == 0xA && st.shards[0].epoch != 0);
	e0 = st.shards[0].epoch;
	/* other stores follow (they are copied), not refused */
	rq = meta_req(0, "10.0.0.2:9600", 0xB);
	REQUIRE(stk_mgmt_state_register(&st, &rq, NULL, 0, 1 * SEC, &m2, ids) == 0);
	rq = meta_req(0, "10.0.0.3:9600", 0xC);
	REQUIRE(stk_mgmt_state_register(&st, &rq, NULL, 0, 1 * SEC, &m3, ids) == 0);
	REQUIRE(st.shards[0].nfollowers == 2 && st.shards[0].followers[0] == m2 &&
		st.shards[0].followers[1] == m3);
	REQUIRE(!stk_mgmt_state_node(&st, m2)->refused && st.shards[0].epoch > e0);
	/* a fourth is a spare */
	rq = meta_req(0, "10.0.0.4:9600", 0xD);
	REQUIRE(stk_mgmt_state_register(&st, &rq, NULL, 0, 1 * SEC, &m4, ids) == 0);
	REQUIRE(st.shards[0].nfollowers == 2 && st.shards[0].node == m1);
	/* the leader restarting stays the leader */
	e1 = st.shards[0].epoch;
	rq = meta_req(m1, "10.0.0.1:9600", 0xA);
	REQUIRE(stk_mgmt_state_register(&st, &rq, NULL, 0, 2 * SEC, &m1, ids) == 0);
	REQUIRE(st.shards[0].node == m1 && st.shards[0].epoch == e1);

	/* followers copied: the shard's identity, and how far each is */
	stk_mgmt_state_meta_report(&st, m2, &ns, e1, 40);
	stk_mgmt_state_meta_report(&st, m3, &ns, e1, 42);
	stk_mgmt_state_meta_report(&st, m4, &(struct stk_ns_id){.lo = 0xD}, 0, 99);
	REQUIRE(routing(&st, 0, 2 * SEC, &rt) == 0);
	REQUIRE(rt.nshards == 1 && rt.shards[0].node_id == m1 && rt.shards[0].replicas == 3 &&
		rt.shards[0].nfollowers == 2 && rt.shards[0].followers[1] == m3 &&
		rt.shards[0].epoch == e1);
	REQUIRE(stk_routing_node(&rt, m3)->meta_seq == 42 &&
		stk_routing_node(&rt, m3)->ns.lo == 0xA);
	stk_routing_free(&rt);

	/* the state file keeps the shard's replicas, followers and epoch */
	REQUIRE(stk_mgmt_state_encode(&st, &buf, &len) == 0);
	stk_mgmt_state_init(&back);
	REQUIRE(stk_mgmt_state_decode(&back, buf, len, 3 * SEC) == 0);
	free(buf);
	REQUIRE(back.meta_replicas == 3 && back.shards[0].epoch == e1 &&
		back.shards[0].nfollowers == 2 && back.shards[0].followers[0] == m2 &&
		back.shards[0].node == m1);
	stk_mgmt_state_free(&back);

	/* all heartbeat but the leader, which goes OFFLINE: the follower with the most leads */
	for (uint32_t id = m2; id <= m4; id++)
		REQUIRE(stk_mgmt_state_heartbeat(&st, id, NULL, 0, 10 * SEC) == 0);
	REQUIRE(stk_mgmt_state_expire(&st, 13 * SEC, TIMEOUT) == 1);
	REQUIRE(st.shards[0].node == m3 && st.shards[0].epoch > e1);
	/* m2 still follows, and the spare m4 fills the place (the leader left none) */
	REQUIRE(st.shards[0].nfollowers == 2 && st.shards[0].followers[0] == m2 &&
		st.shards[0].followers[1] == m4);
	/* the old leader back is a spare: no room, and never the leader again by itself */
	REQUIRE(stk_mgmt_state_heartbeat(&st, m1, NULL, 0, 13 * SEC) == 0);
	REQUIRE(st.shards[0].node == m3 && st.shards[0].nfollowers == 2);
	/* a follower goes OFFLINE: it leaves, and the old leader follows in its place */
	e1 = st.shards[0].epoch;
	for (uint32_t id = m1; id <= m4; id++)
		if (id != m2)
			REQUIRE(stk_mgmt_state_heartbeat(&st, id, NULL, 0, 20 * SEC) == 0);
	REQUIRE(stk_mgmt_state_expire(&st, 24 * SEC, TIMEOUT) == 1);
	REQUIRE(st.shards[0].node == m3 && st.shards[0].epoch > e1 &&
		st.shards[0].nfollowers == 2 && st.shards[0].followers[0] == m4 &&
		st.shards[0].followers[1] == m1);
	/* only a follower of the shard's identity is promoted: m4 (0xD) and m1 stale are not */
	stk_mgmt_state_meta_report(&st, m1, &(struct stk_ns_id){.lo = 0xE}, 0, 1000);
	for (uint32_t id = m1; id <= m4; id++)
		if (id != m3 && id != m2)
			REQUIRE(stk_mgmt_state_heartbeat(&st, id, NULL, 0, 30 * SEC) == 0);
	REQUIRE(stk_mgmt_state_expire(&st, 34 * SEC, TIMEOUT) == 1);
	REQUIRE(st.shards[0].node == m3); /* kept: no follower may stand in for it */
	/* back to one copy: a copy of the shard's identity does not take it over */
	st.meta_replicas = 1;
	rq = meta_req(m2, "10.0.0.2:9600", 0xA);
	REQUIRE(stk_mgmt_state_register(&st, &rq, NULL, 0, 40 * SEC, &m2, ids) == 0);
	REQUIRE(st.shards[0].node == m3 && stk_mgmt_state_node(&st, m2)->refused);
	rc = 0;
	stk_mgmt_state_free(&st);
	return rc;
}

/*
 * `stoker admin drain-node` of a meta node (meta_drains in state.c): a spare takes
 * its place before it leaves; a drain never lowers the shard's copies, and waits
 * where no spare is free; a shard of one copy cannot be drained.
 */
static int test_meta_drain(void)
{
	struct stk_msg_mgmt_register_req rq;
	struct stk_mgmt_state st;
	struct stk_ns_id ns = {.lo = 0xA};
	uint32_t m1, m2, m3, m4, ids[1];
	uint64_t e;
	int rc = 1;

	stk_mgmt_state_init(&st);
	st.meta_replicas = 2;
	rq = meta_req(0, "10.0.0.1:9600", 0xA);
	REQUIRE(stk_mgmt_state_register(&st, &rq, NULL, 0, 1 * SEC, &m1, ids) == 0);
	rq = meta_req(0, "10.0.0.2:9600", 0xB);
	REQUIRE(stk_mgmt_state_register(&st, &rq, NULL, 0, 1 * SEC, &m2, ids) == 0);
	rq = meta_req(0, "10.0.0.3:9600", 0xC);
	REQUIRE(stk_mgmt_state_register(&st, &rq, NULL, 0, 1 * SEC, &m3, ids) == 0);
	REQUIRE(st.shards[0].node == m1 && st.shards[0].nfollowers == 1 &&
		st.shards[0].followers[0] == m2); /* m3 a spare */
	stk_mgmt_state_meta_report(&st, m2, &ns, st.shards[0].epoch, 10);
	REQUIRE(stk_mgmt_state_drain(&st, 999, 1) == -ENOENT);

	/*
	 * The leader drains: the spare follows first (a follower more for a while),
	 * once it has learned the shard (the leader copied its store to it as a
	 * learner, meta/repl.c): not while its store is another identity.
	 */
	REQUIRE(stk_mgmt_state_drain(&st, m1, 1) == 0);
	REQUIRE(stk_mgmt_state_meta_role(&st, m1) == 2);
	stk_mgmt_state_rebalance(&st, 2 * SEC, 0);
	REQUIRE(st.shards[0].node == m1 && st.shards[0].nfollowers == 1);
	stk_mgmt_state_meta_report(&st, m3, &ns, st.shards[0].epoch, 8);
	stk_mgmt_state_rebalance(&st, 3 * SEC, 0);
	REQUIRE(st.shards[0].node == m1 && st.shards[0].nfollowers == 2 &&
		st.shards[0].followers[1] == m3);
	/* m3 learned, but how far the leader was when it joined is not known yet */
	e = st.shards[0].epoch;
	stk_mgmt_state_meta_report(&st, m3, &ns, e, 12);
	stk_mgmt_state_meta_report(&st, m2, &ns, e, 12);
	stk_mgmt_state_rebalance(&st, 3 * SEC, 0);
	REQUIRE(st.shards[0].node == m1);
	/* the leader's next two reports: at change 12 then 14; m3 behind (12) is not ready */
	stk_mgmt_state_meta_report(&st, m1, &ns, e, 12);
	stk_mgmt_state_meta_report(&st, m1, &ns, e, 14);
	stk_mgmt_state_rebalance(&st, 3 * SEC, 0);
	REQUIRE(st.shards[0].node == m1);
	/* both at 14: the follower with the most changes leads, m1 holds no role */
	stk_mgmt_state_meta_report(&st, m2, &ns, e, 14);
	stk_mgmt_state_meta_report(&st, m3, &ns, e, 15);
	stk_mgmt_state_rebalance(&st, 4 * SEC, 0);
	REQUIRE(st.shards[0].node == m3 && st.shards[0].nfollowers == 1 &&
		st.shards[0].followers[0] == m2 && st.shards[0].epoch > e);
	REQUIRE(stk_mgmt_state_meta_role(&st, m1) == 0 && stk_mgmt_state_meta_role(&st, m3) == 2);
	/* a drained node back (restarted) takes no role */
	rq = meta_req(m1, "10.0.0.1:9600", 0xA);
	REQUIRE(stk_mgmt_state_register(&st, &rq, NULL, 0, 5 * SEC, &m1, ids) == 0);
	stk_mgmt_state_rebalance(&st, 5 * SEC, 0);
	REQUIRE(stk_mgmt_state_meta_role(&st, m1) == 0);

	/* a follower drains with no spare free: it stays, two copies kept */
	REQUIRE(stk_mgmt_state_drain(&st, m2, 1) == 0);
	stk_mgmt_state_rebalance(&st, 6 * SEC, 0);
	REQUIRE(st.shards[0].nfollowers == 1 && st.shards[0].followers[0] == m2);
	/*
	 * A new meta node registers: the shard holds its two copies still, so it waits
	 * to learn the shard; one that never does (a leader without learners) follows
	 * after a minute, is copied, and m2 leaves.
	 */
	rq = meta_req(0, "10.0.0.4:9600", 0xD);
	REQUIRE(stk_mgmt_state_register(&st, &rq, NULL, 0, 7 * SEC, &m4, ids) == 0);
	REQUIRE(st.shards[0].nfollowers == 1);
	stk_mgmt_state_rebalance(&st, 7 * SEC, 0);
	stk_mgmt_state_rebalance(&st, 66 * SEC, 0);
	REQUIRE(st.shards[0].nfollowers == 1);
	stk_mgmt_state_rebalance(&st, 68 * SEC, 0);
	REQUIRE(st.shards[0].nfollowers == 2 && st.shards[0].followers[1] == m4);
	stk_mgmt_state_rebalance(&st, 69 * SEC, 0);
	REQUIRE(st.shards[0].nfollowers == 2); /* m4 not copied yet */
	stk_mgmt_state_meta_report(&st, m3, &ns, st.shards[0].epoch, 20);
	stk_mgmt_state_meta_report(&st, m3, &ns, st.shards[0].epoch, 20);
	stk_mgmt_state_meta_report(&st, m4, &ns, st.shards[0].epoch, 20);
	stk_mgmt_state_rebalance(&st, 70 * SEC, 0);
	REQUIRE(st.shards[0].nfollowers == 1 && st.shards[0].followers[0] == m4 &&
		st.shards[0].node == m3 && stk_mgmt_state_meta_role(&st, m2) == 0);
	/* undrained, a node is a spare again, and follows where there is room */
	REQUIRE(stk_mgmt_state_drain(&st, m1, 0) == 0);
	stk_mgmt_state_rebalance(&st, 71 * SEC, 0);
	REQUIRE(stk_mgmt_state_meta_role(&st, m1) == 0); /* no room: R = 2 held */
	/* one copy: nothing can take a meta node's place */
	st.meta_replicas = 1;
	REQUIRE(stk_mgmt_state_drain(&st, m3, 1) == -EOPNOTSUPP);
	rc = 0;
	stk_mgmt_state_free(&st);
	return rc;
}

/*
 * Metadata shards (docs/meta-shards.md): each shard is its own replicated group
 * among the meta nodes registered for it; a node for a shard the cluster does not
 * have is refused; the state file (format 8) keeps the map.
 */
static int test_meta_shards(void)
{
	struct stk_msg_mgmt_register_req rq;
	struct stk_mgmt_state st, back;
	struct stk_routing rt;
	uint32_t a1, a2, b1, b2, x, ids[1];
	uint64_t e1;
	uint8_t *buf;
	size_t len;
	int rc = 1;

	stk_mgmt_state_init(&st);
	st.meta_replicas = 2;
	st.meta_shards = 2;
	rq = meta_req(0, "10.0.1.1:9600", 0xA1);
	REQUIRE(stk_mgmt_state_register(&st, &rq, NULL, 0, 1 * SEC, &a1, ids) == 0);
	rq = meta_req(0, "10.0.2.1:9600", 0xB1);
	rq.shard = 2;
	REQUIRE(stk_mgmt_state_register(&st, &rq, NULL, 0, 1 * SEC, &b1, ids) == 0);
	rq = meta_req(0, "10.0.2.2:9600", 0xB2);
	rq.shard = 2;
	REQUIRE(stk_mgmt_state_register(&st, &rq, NULL, 0, 1 * SEC, &b2, ids) == 0);
	rq = meta_req(0, "10.0.1.2:9600", 0xA2);
	rq.shard = 1;
	REQUIRE(stk_mgmt_state_register(&st, &rq, NULL, 0, 1 * SEC, &a2, ids) == 0);
	/* each shard leads and follows among its own nodes only */
	REQUIRE(st.shards[0].node == a1 && st.shards[0].ns.lo == 0xA1 &&
		st.shards[0].nfollowers == 1 && st.shards[0].followers[0] == a2);
	REQUIRE(st.shards[1].node == b1 && st.shards[1].ns.lo == 0xB1 &&
		st.shards[1].nfollowers == 1 && st.shards[1].followers[0] == b2);
	/* a shard the cluster does not have: refused, in no shard */
	rq = meta_req(0, "10.0.3.1:9600", 0xC1);
	rq.shard = 3;
	REQUIRE(stk_mgmt_state_register(&st, &rq, NULL, 0, 1 * SEC, &x, ids) == 0);
	REQUIRE(stk_mgmt_state_node(&st, x)->refused && stk_mgmt_state_node(&st, x)->shard == 3);
	REQUIRE(st.shards[2].node == 0 && stk_ns_id_is_zero(&st.shards[2].ns));

	REQUIRE(routing(&st, 0, 2 * SEC, &rt) == 0);
	REQUIRE(rt.nshards == 2 && rt.shards[0].id == 1 && rt.shards[0].node_id == a1 &&
		rt.shards[1].id == 2 && rt.shards[1].node_id == b1 &&
		rt.shards[1].nfollowers == 1 && rt.shards[1].followers[0] == b2);
	REQUIRE(stk_routing_node(&rt, b2)->shard == 2 && stk_routing_node(&rt, a2)->shard == 1);
	stk_routing_free(&rt);

	/* the state file (format 8) keeps the map */
	REQUIRE(stk_mgmt_state_encode(&st, &buf, &len) == 0);
	stk_mgmt_state_init(&back);
	REQUIRE(stk_mgmt_state_decode(&back, buf, len, 3 * SEC) == 0);
	free(buf);
	REQUIRE(back.meta_shards == 2 && back.shards[1].node == b1 &&
		back.shards[1].ns.lo == 0xB1 && back.shards[1].epoch == st.shards[1].epoch &&
		back.shards[1].nfollowers == 1 && back.shards[1].followers[0] == b2 &&
		stk_mgmt_state_node(&back, b2)->shard == 2 && back.shards[0].node == a1);
	stk_mgmt_state_free(&back);

	/* shard 2's leader goes OFFLINE: its follower leads; shard 1 is untouched */
	e1 = st.shards[0].epoch;
	REQUIRE(stk_mgmt_state_heartbeat(&st, a1, NULL, 0, 10 * SEC) == 0);
	REQUIRE(stk_mgmt_state_heartbeat(&st, a2, NULL, 0, 10 * SEC) == 0);
	REQUIRE(stk_mgmt_state_heartbeat(&st, b2, NULL, 0, 10 * SEC) == 0);
	REQUIRE(stk_mgmt_state_heartbeat(&st, x, NULL, 0, 10 * SEC) == 0);
	stk_mgmt_state_meta_report(&st, b2, &(struct stk_ns_id){.lo = 0xB1}, 1, 5);
	REQUIRE(stk_mgmt_state_expire(&st, 13 * SEC, TIMEOUT) == 1);
	REQUIRE(st.shards[1].node == b2 && st.shards[1].nfollowers == 0);
	REQUIRE(st.shards[0].node == a1 && st.shards[0].epoch == e1 &&
		st.shards[0].nfollowers == 1);
	rc = 0;
	stk_mgmt_state_free(&st);
	return rc;
}

int main(void)
{
	struct stk_mgmt_state st;
	int rc;

	stk_mgmt_state_init(&st);
	{
		/* Two fresh states never start at the same version (see state_init). */
		struct stk_mgmt_state other;
		usleep(2000);
		stk_mgmt_state_init(&other);
		if (other.version == st.version) {
			CHECK_FAIL("fresh states share a version");
			return check_done();
		}
	}
	/* The first four tests build on one state: the first that fails stops the run. */
	rc = test_registration(&st) || test_liveness(&st) || test_routing(&st) ||
	     test_encode_round_trip(&st) || test_persistence(&st) || test_lost_state() ||
	     test_host_identity() || test_identity() || test_old_format() || test_replicas() ||
	     test_replace() || test_all_lost() || test_accept_loss() || test_rebalance() ||
	     test_meta_replicas() || test_clients() || test_format_5_both() || test_meta_shards() ||
	     test_meta_drain();
	stk_mgmt_state_free(&st);
	if (rc && !check_failures())
		CHECK_FAIL("a test failed without a failed check");
	return check_done();
}
