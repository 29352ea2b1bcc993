/*
 * Fetching the routing table from mgmtd (net.h): what a client, a node or a tool
 * asks first, written once here for all of them.
 */
#include "net.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "../proto/msg.h"
#include "../proto/status.h"
#include "mgmtaddr.h"

/* One MGMT_GET_ROUTING over c, or through the leader-following list l when c is NULL. */
static int fetch(struct stk_conn *c, struct stk_mgmt_addrs *l, struct stk_conn **lc,
		 int timeout_ms, struct stk_routing *rt)
{
	struct stk_msg_mgmt_get_routing_req m = {.known_version = 0};
	struct stk_rpc rpc;
	struct stk_wbuf w;
	struct stk_rbuf r;
	uint8_t req[16];
	void *resp;
	int rc;

	memset(rt, 0, sizeof(*rt));
	stk_wbuf_init(&w, req, sizeof(req));
	rc = stk_msg_mgmt_get_routing_req_enc(&w, &m);
	if (rc)
		return rc;
	resp = malloc(STK_MAX_PAYLOAD);
	if (!resp)
		return -ENOMEM;
	memset(&rpc, 0, sizeof(rpc));
	rpc.opcode = STK_OP_MGMT_GET_ROUTING;
	rpc.req = req;
	rpc.req_len = w.len;
	rpc.resp = resp;
	rpc.resp_cap = STK_MAX_PAYLOAD;
	if (c) {
		rc = stk_rpc_call(c, &rpc);
	} else {
		rc = stk_mgmt_call(l, lc, timeout_ms, &rpc);
		if (rc == 0)
			rc = stk_status_to_errno(rpc.status);
	}
	if (rc)
		goto out;
	stk_rbuf_init(&r, resp, rpc.resp_len);
	rc = stk_routing_decode(&r, rt);
	if (rc == 0 && stk_rbuf_finish(&r)) {
		stk_routing_free(rt);
		rc = -EBADMSG;
	}
out:
	free(resp);
	return rc;
}

int stk_routing_fetch(struct stk_conn *c, struct stk_routing *rt)
{
	return fetch(c, NULL, NULL, 0, rt);
}

int stk_routing_fetch_leader(struct stk_mgmt_addrs *l, struct stk_conn **conn, int timeout_ms,
			     struct stk_routing *rt)
{
	return fetch(NULL, l, conn, timeout_ms, rt);
}

int stk_routing_fetch_from(const char *addr, int timeout_ms, struct stk_routing *rt)
{
	struct stk_conn *c;
	int rc;

	memset(rt, 0, sizeof(*rt));
	rc = stk_conn_connect(addr, timeout_ms, &c);
	if (rc)
		return rc;
	rc = stk_routing_fetch(c, rt);
	stk_conn_close(c);
	return rc;
}
