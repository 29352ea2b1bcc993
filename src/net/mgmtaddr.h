/*
 * Following the leading mgmtd: a list of mgmtd addresses and the rule for moving
 * along it.
 *
 * In cluster mode several mgmtd run at once and one leads (elected through an
 * etcd lease, src/mgmtd/etcd.h); the others answer every request but MGMT_LEADER
 * with the status NOT_LEADER (-EREMCHG). Nodes and clients are given the list of
 * all of them ("HOST:PORT,HOST:PORT,...": `--mgmtd a,b,c`, a client's
 * stk://a,b,c) and keep using the one that answered last. When it fails in
 * transport they try the next address; when it answers NOT_LEADER they ask it
 * MGMT_LEADER and go to the address it names (which need not be in the list: a
 * mgmtd moved or added since). An embedded mgmtd is a list of one that always
 * leads, so the same code serves both modes.
 *
 * The list (struct stk_mgmt_addrs) is plain data with no lock: its owner guards
 * it (the agent's call_lock, a client's own lock) and stk_mgmt_call is used by one
 * thread at a time per list.
 */
#ifndef STK_NET_MGMTADDR_H
#define STK_NET_MGMTADDR_H

#include <stddef.h>

#include "../proto/msg.h"

struct stk_conn;
struct stk_rpc;

/* Most addresses in a list; a list's text is at most STK_MGMT_LIST_MAX - 1 bytes. */
#define STK_MGMT_ADDRS_MAX 8
#define STK_MGMT_LIST_MAX (STK_MGMT_ADDRS_MAX * STK_ADDR_MAX)

struct stk_mgmt_addrs {
	unsigned n;   /* addresses in the list given */
	unsigned cur; /* the one in use: 0..n-1, or n for `extra` */
	/* [0, n): the list as given; [n]: a leader named that is not in the list */
	char addr[STK_MGMT_ADDRS_MAX + 1][STK_ADDR_MAX];
};

/*
 * Parses "HOST:PORT[,HOST:PORT...]" (spaces around commas allowed, duplicates
 * dropped) into l, the first address current. 0, or -EINVAL (empty, a malformed
 * address, more than STK_MGMT_ADDRS_MAX).
 */
int stk_mgmt_addrs_parse(struct stk_mgmt_addrs *l, const char *list);
/* The address to use now. */
const char *stk_mgmt_addrs_cur(const struct stk_mgmt_addrs *l);
/*
 * The current one failed in transport or named no leader: moves to the next
 * address of the list, in turn (from the extra address, to the list's first).
 */
void stk_mgmt_addrs_next(struct stk_mgmt_addrs *l);
/*
 * A mgmtd named `leader` as leading: it becomes current (added as the extra
 * address when it is not in the list). 0, or -EINVAL (empty or malformed: nothing
 * changes).
 */
int stk_mgmt_addrs_follow(struct stk_mgmt_addrs *l, const char *leader);
/* The list as text ("a,b,c", without the extra address) into buf. 0 or -ENAMETOOLONG. */
int stk_mgmt_addrs_format(const struct stk_mgmt_addrs *l, char *buf, size_t len);

/*
 * Asks MGMT_LEADER over c: *leads 1 when that mgmtd leads, leader its leader's
 * address ("" while none leads; STK_ADDR_MAX bytes), *etcd 1 in cluster mode.
 * 0, a transport error, the reply's status as -errno (-ENOSYS: a mgmtd from
 * before MGMT_LEADER, or no mgmtd), -EBADMSG.
 */
int stk_mgmt_leader_ask(struct stk_conn *c, int *leads, int *etcd, char *leader);

/*
 * Sends rpc to the leading mgmtd and receives its reply, following the leader:
 * *conn is the connection in use (NULL: none yet; kept open for the next call,
 * replaced when the call moves to another address); a transport failure moves to
 * the next address, NOT_LEADER to the leader named (or the next address while
 * none is named); it gives up after trying every address three times (sleeping
 * 100 ms between rounds), unless a mgmtd answered that none leads: then it goes
 * on for up to 8 s, the time an election takes (a lease) with room to spare. rpc is set as for stk_rpc_send (its private fields are
 * reset on every try). Returns 0 when a mgmtd answered with anything but
 * NOT_LEADER (rpc->status tells how the request went), -EREMCHG when every answer
 * was NOT_LEADER (an election is under way), or the last transport error.
 */
int stk_mgmt_call(struct stk_mgmt_addrs *l, struct stk_conn **conn, int connect_timeout_ms,
		  struct stk_rpc *rpc);

#endif
