/*
 * The mgmtd address list and following the leader (mgmtaddr.h).
 *
 * The list is tiny (a handful of mgmtd), so it is a fixed array searched
 * linearly. stk_mgmt_call is the one place that knows the rule "transport error:
 * next address; NOT_LEADER: ask who leads and go there", so the node agent, the
 * client library and the tools all follow the leader the same way.
 */
#include "mgmtaddr.h"

#include <errno.h>
#include <string.h>
#include <time.h>

#include "../common/util.h"
#include "../proto/status.h"
#include "net.h"

static int valid_addr(const char *a)
{
	char host[256];
	uint16_t port;

	return a[0] && strlen(a) < STK_ADDR_MAX &&
	       stk_parse_hostport(a, host, sizeof(host), &port) == 0;
}

static int find(const struct stk_mgmt_addrs *l, const char *a)
{
	for (unsigned i = 0; i < l->n; i++)
		if (strcmp(l->addr[i], a) == 0)
			return (int)i;
	return -1;
}

int stk_mgmt_addrs_parse(struct stk_mgmt_addrs *l, const char *list)
{
	struct stk_mgmt_addrs out;
	const char *p = list;

	memset(&out, 0, sizeof(out));
	if (!list)
		return -EINVAL;
	for (;;) {
		const char *end = strchr(p, ',');
		size_t len = end ? (size_t)(end - p) : strlen(p);
		char a[STK_ADDR_MAX];

		while (len && (*p == ' ' || *p == '\t')) {
			p++;
			len--;
		}
		while (len && (p[len - 1] == ' ' || p[len - 1] == '\t'))
			len--;
		if (len == 0 || len >= sizeof(a))
			return -EINVAL;
		memcpy(a, p, len);
		a[len] = 0;
		if (!valid_addr(a))
			return -EINVAL;
		if (find(&out, a) < 0) {
			if (out.n == STK_MGMT_ADDRS_MAX)
				return -EINVAL;
			memcpy(out.addr[out.n++], a, len + 1);
		}
		if (!end)
			break;
		p = end + 1;
	}
	*l = out;
	return 0;
}

const char *stk_mgmt_addrs_cur(const struct stk_mgmt_addrs *l)
{
	return l->addr[l->cur <= l->n ? l->cur : 0];
}

void stk_mgmt_addrs_next(struct stk_mgmt_addrs *l)
{
	if (l->n == 0)
		return;
	l->cur = l->cur >= l->n ? 0 : (l->cur + 1) % l->n;
}

int stk_mgmt_addrs_follow(struct stk_mgmt_addrs *l, const char *leader)
{
	int i;

	if (!leader || !valid_addr(leader))
		return -EINVAL;
	i = find(l, leader);
	if (i >= 0) {
		l->cur = (unsigned)i;
		return 0;
	}
	stk_strlcpy(l->addr[l->n], leader, STK_ADDR_MAX);
	l->cur = l->n;
	return 0;
}

int stk_mgmt_addrs_format(const struct stk_mgmt_addrs *l, char *buf, size_t len)
{
	size_t off = 0;

	if (len == 0)
		return -ENAMETOOLONG;
	buf[0] = 0;
	for (unsigned i = 0; i < l->n; i++) {
		size_t al = strlen(l->addr[i]);

		if (off + al + (i ? 1 : 0) + 1 > len)
			return -ENAMETOOLONG;
		if (i)
			buf[off++] = ',';
		memcpy(buf + off, l->addr[i], al + 1);
		off += al;
	}
	return 0;
}

int stk_mgmt_leader_ask(struct stk_conn *c, int *leads, int *etcd, char *leader)
{
	struct stk_msg_mgmt_leader_resp m;
	uint8_t resp[128];
	struct stk_rpc rpc;
	struct stk_rbuf r;
	int rc;

	memset(&rpc, 0, sizeof(rpc));
	rpc.opcode = STK_OP_MGMT_LEADER;
	rpc.resp = resp;
	rpc.resp_cap = sizeof(resp);
	rc = stk_rpc_call(c, &rpc);
	if (rc)
		return rc;
	stk_rbuf_init(&r, resp, rpc.resp_len);
	if (stk_msg_mgmt_leader_resp_dec(&r, &m) || stk_rbuf_finish(&r))
		return -EBADMSG;
	*leads = m.leader;
	*etcd = m.etcd;
	memcpy(leader, m.addr, STK_ADDR_MAX);
	leader[STK_ADDR_MAX - 1] = 0;
	return 0;
}

static void drop(struct stk_conn **conn)
{
	if (*conn) {
		stk_conn_close(*conn);
		*conn = NULL;
	}
}

#define MGMT_ELECTION_WAIT_MS 8000

int stk_mgmt_call(struct stk_mgmt_addrs *l, struct stk_conn **conn, int connect_timeout_ms,
		  struct stk_rpc *rpc)
{
	unsigned tries = 3 * (l->n + 1);
	int rc = -ENOTCONN, answered_no = 0;
	struct timespec t0, now;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	/* an election (mgmtd answer, none leads) takes up to a lease: wait that out */
	for (unsigned t = 0;; t++) {
		if (t >= tries) {
			clock_gettime(CLOCK_MONOTONIC, &now);
			if (!answered_no || (now.tv_sec - t0.tv_sec) * 1000 +
						    (now.tv_nsec - t0.tv_nsec) / 1000000 >
						    MGMT_ELECTION_WAIT_MS)
				break;
		}
		char leader[STK_ADDR_MAX];
		int leads = 0, etcd = 0;

		if (t && t % (l->n + 1) == 0)
			nanosleep(&(struct timespec){.tv_nsec = 100000000}, NULL);
		if (*conn && (stk_conn_broken(*conn) ||
			      strcmp(stk_conn_addr(*conn), stk_mgmt_addrs_cur(l)) != 0))
			drop(conn);
		if (!*conn) {
			rc = stk_conn_connect(stk_mgmt_addrs_cur(l), connect_timeout_ms, conn);
			if (rc) {
				*conn = NULL;
				stk_mgmt_addrs_next(l);
				continue;
			}
		}
		rpc->resp_len = 0;
		rpc->bulk_in_len = 0;
		rpc->status = 0;
		rc = stk_rpc_send(*conn, rpc);
		if (rc == 0)
			rc = stk_rpc_recv(*conn, rpc);
		if (rc) {
			drop(conn);
			stk_mgmt_addrs_next(l);
			continue;
		}
		if (rpc->status != STK_ST_NOT_LEADER)
			return 0;
		answered_no = 1;
		rc = stk_mgmt_leader_ask(*conn, &leads, &etcd, leader);
		if (rc == 0 && !leads && strcmp(leader, stk_mgmt_addrs_cur(l)) != 0 &&
		    stk_mgmt_addrs_follow(l, leader) == 0)
			continue;
		if (rc)
			drop(conn);
		stk_mgmt_addrs_next(l);
	}
	return answered_no ? -EREMCHG : rc;
}
