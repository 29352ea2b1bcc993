/*
 * Unit test of the mgmtd address list and leader following (src/net/mgmtaddr.c):
 * parsing, moving on after a failure, following a named leader (in the list or
 * not), and stk_mgmt_call against three in-process mgmtd stand-ins, one of which
 * leads, one refers to it and one is down.
 * Exit 0 pass, 1 fail.
 */
#include <errno.h>
#include <pthread.h>
#include <string.h>

#include "net/mgmtaddr.h"
#include "net/net.h"
#include "proto/msg.h"
#include "proto/status.h"
#include "common/util.h"
#include "check.h"

static void test_parse(void)
{
	struct stk_mgmt_addrs l;
	char buf[STK_MGMT_LIST_MAX];

	CHECK_RC(stk_mgmt_addrs_parse(&l, "127.0.0.1:7000"), 0);
	CHECK_EQ(l.n, 1);
	CHECK(strcmp(stk_mgmt_addrs_cur(&l), "127.0.0.1:7000") == 0);
	CHECK_RC(stk_mgmt_addrs_parse(&l, "a:1, b:2 ,c:3,a:1"), 0);
	CHECK_EQ(l.n, 3); /* the duplicate is dropped */
	CHECK(strcmp(l.addr[1], "b:2") == 0);
	CHECK_RC(stk_mgmt_addrs_format(&l, buf, sizeof(buf)), 0);
	CHECK(strcmp(buf, "a:1,b:2,c:3") == 0);
	CHECK_RC(stk_mgmt_addrs_format(&l, buf, 5), -ENAMETOOLONG);
	CHECK_RC(stk_mgmt_addrs_parse(&l, ""), -EINVAL);
	CHECK_RC(stk_mgmt_addrs_parse(&l, "a:1,"), -EINVAL);
	CHECK_RC(stk_mgmt_addrs_parse(&l, ",a:1"), -EINVAL);
	CHECK_RC(stk_mgmt_addrs_parse(&l, "a:1,noport"), -EINVAL);
	CHECK_RC(stk_mgmt_addrs_parse(&l, "a:99999"), -EINVAL);
	CHECK_RC(stk_mgmt_addrs_parse(&l, "a:1,b:1,c:1,d:1,e:1,f:1,g:1,h:1"), 0);
	CHECK_RC(stk_mgmt_addrs_parse(&l, "a:1,b:1,c:1,d:1,e:1,f:1,g:1,h:1,i:1"), -EINVAL);
	CHECK_RC(stk_mgmt_addrs_parse(&l, NULL), -EINVAL);
}

static int test_next_follow(void)
{
	struct stk_mgmt_addrs l;

	REQUIRE(stk_mgmt_addrs_parse(&l, "a:1,b:2,c:3") == 0);
	stk_mgmt_addrs_next(&l);
	CHECK(strcmp(stk_mgmt_addrs_cur(&l), "b:2") == 0);
	stk_mgmt_addrs_next(&l);
	stk_mgmt_addrs_next(&l);
	CHECK(strcmp(stk_mgmt_addrs_cur(&l), "a:1") == 0); /* wraps */
	CHECK_RC(stk_mgmt_addrs_follow(&l, "c:3"), 0);
	CHECK(strcmp(stk_mgmt_addrs_cur(&l), "c:3") == 0);
	CHECK_EQ(l.n, 3);
	/* A leader outside the list is used, and the list stays as given. */
	CHECK_RC(stk_mgmt_addrs_follow(&l, "d:4"), 0);
	CHECK(strcmp(stk_mgmt_addrs_cur(&l), "d:4") == 0);
	CHECK_EQ(l.n, 3);
	stk_mgmt_addrs_next(&l);
	CHECK(strcmp(stk_mgmt_addrs_cur(&l), "a:1") == 0);
	CHECK_RC(stk_mgmt_addrs_follow(&l, ""), -EINVAL);
	CHECK_RC(stk_mgmt_addrs_follow(&l, "junk"), -EINVAL);
	CHECK(strcmp(stk_mgmt_addrs_cur(&l), "a:1") == 0);
	return 0;
}

/* ---- stk_mgmt_call against stand-ins ---- */

struct fake {
	struct stk_server *s;
	pthread_t tid;
	int leads;
	char leader[STK_ADDR_MAX]; /* what MGMT_LEADER names */
	int calls;		   /* requests other than MGMT_LEADER */
};

static int fake_handle(void *ctx, struct stk_rpc_req *req, struct stk_rpc_resp *resp)
{
	struct fake *f = ctx;
	struct stk_msg_mgmt_leader_resp m;

	if (req->hdr.opcode == STK_OP_MGMT_LEADER) {
		memset(&m, 0, sizeof(m));
		m.leader = (uint8_t)f->leads;
		m.etcd = 1;
		stk_strlcpy(m.addr, f->leader, sizeof(m.addr));
		return stk_msg_mgmt_leader_resp_enc(&resp->payload, &m);
	}
	__atomic_add_fetch(&f->calls, 1, __ATOMIC_SEQ_CST);
	if (!f->leads)
		return -EREMCHG;
	stk_put_u32(&resp->payload, 42);
	return resp->payload.err;
}

static void *run_server(void *arg)
{
	stk_server_run(arg);
	return NULL;
}

static int fake_start(struct fake *f)
{
	struct stk_server_opts o;

	memset(&o, 0, sizeof(o));
	o.size = sizeof(o);
	o.listen = "127.0.0.1:0";
	o.handler = fake_handle;
	o.ctx = f;
	o.workers = 1;
	if (stk_server_create(&o, &f->s))
		return -1;
	return pthread_create(&f->tid, NULL, run_server, f->s) ? -1 : 0;
}

static void fake_stop(struct fake *f)
{
	stk_server_stop(f->s);
	pthread_join(f->tid, NULL);
	stk_server_destroy(f->s);
}

static int test_call(void)
{
	struct fake lead, follow;
	struct stk_mgmt_addrs l;
	struct stk_conn *conn = NULL;
	char list[STK_MGMT_LIST_MAX];
	uint8_t resp[16];
	struct stk_rpc rpc;

	memset(&lead, 0, sizeof(lead));
	memset(&follow, 0, sizeof(follow));
	REQUIRE(fake_start(&lead) == 0);
	REQUIRE(fake_start(&follow) == 0);
	lead.leads = 1;
	stk_strlcpy(lead.leader, stk_server_addr(lead.s), sizeof(lead.leader));
	stk_strlcpy(follow.leader, stk_server_addr(lead.s), sizeof(follow.leader));
	/* First a dead address (port 1 refuses), then the follower, then the leader. */
	snprintf(list, sizeof(list), "127.0.0.1:1,%s,%s", stk_server_addr(follow.s),
		 stk_server_addr(lead.s));
	REQUIRE(stk_mgmt_addrs_parse(&l, list) == 0);

	memset(&rpc, 0, sizeof(rpc));
	rpc.opcode = STK_OP_MGMT_GET_ROUTING;
	rpc.resp = resp;
	rpc.resp_cap = sizeof(resp);
	CHECK_RC(stk_mgmt_call(&l, &conn, 500, &rpc), 0);
	CHECK_EQ(rpc.status, STK_ST_OK);
	CHECK_EQ(rpc.resp_len, 4);
	CHECK(strcmp(stk_mgmt_addrs_cur(&l), stk_server_addr(lead.s)) == 0);
	CHECK_EQ(follow.calls, 1);
	CHECK_EQ(lead.calls, 1);
	/* The next call goes straight to the leader, on the same connection. */
	CHECK_RC(stk_mgmt_call(&l, &conn, 500, &rpc), 0);
	CHECK_EQ(lead.calls, 2);
	CHECK_EQ(follow.calls, 1);

	/* No leader anywhere (an election under way): -EREMCHG after a few rounds. */
	lead.leads = 0;
	lead.leader[0] = 0;
	follow.leader[0] = 0;
	CHECK_RC(stk_mgmt_call(&l, &conn, 500, &rpc), -EREMCHG);

	/* The follower takes over: the call finds it. */
	follow.leads = 1;
	stk_strlcpy(follow.leader, stk_server_addr(follow.s), sizeof(follow.leader));
	stk_strlcpy(lead.leader, stk_server_addr(follow.s), sizeof(lead.leader));
	CHECK_RC(stk_mgmt_call(&l, &conn, 500, &rpc), 0);
	CHECK(strcmp(stk_mgmt_addrs_cur(&l), stk_server_addr(follow.s)) == 0);

	/* Every mgmtd gone: the transport error. */
	if (conn)
		stk_conn_close(conn);
	conn = NULL;
	fake_stop(&lead);
	fake_stop(&follow);
	CHECK(stk_mgmt_call(&l, &conn, 500, &rpc) == -ECONNREFUSED);
	CHECK(conn == NULL);
	return 0;
}

static void run_next_follow(void)
{
	test_next_follow();
}

static void run_call(void)
{
	test_call();
}

int main(void)
{
	CHECK_RUN(test_parse);
	CHECK_RUN(run_next_follow);
	CHECK_RUN(run_call);
	return check_done();
}
