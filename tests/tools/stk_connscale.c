/*
 * stk_connscale: holds many connections to one server, each with requests in
 * flight, for a while, and says whether every one was answered.
 *
 *   stk_connscale HOST:PORT CONNS SECONDS [INFLIGHT]
 *
 * One thread and one epoll set drive every connection (so the tool itself costs
 * little): CONNS connections are opened one at a time (connect, and the key
 * handshake when the cluster has a key; connect_us in the results is the mean time
 * of that set-up, the cost a key adds to a connection), then for
 * SECONDS each keeps INFLIGHT (default 2) STOR_READ requests on the wire, sending
 * another as each reply arrives. The requests name a chain no node has, so a
 * storage node answers each from its routing check, through the whole transport
 * (loop, worker, reply); the request id is the same on all (replies are counted,
 * not matched). Prints one line of key=value results and exits 0 when every
 * connection was opened, none was closed and each got replies; 1 otherwise.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../../src/client/client.h"
#include "../../src/common/util.h"
#include "../../src/net/net.h"
#include "../../src/net/netint.h"
#include "../../src/proto/codec.h"
#include "../../src/proto/msg.h"
#include "../../src/proto/wire.h"

struct sconn {
	int fd;
	int connected;
	int dead;
	unsigned inflight;
	uint64_t sent, answered;
	uint8_t hb[STK_FRAME_HDR_LEN];
	size_t hb_got;
	uint32_t skip; /* payload and bulk bytes of the reply being read */
	size_t out_off; /* bytes of the current request written */
};

static uint8_t g_req[STK_FRAME_HDR_LEN + 128];
static size_t g_req_len;

static void build_request(void)
{
	struct stk_msg_stor_read_req m = {.chain_id = 0xfffffff0u, .chain_ver = 1, .ino = 1,
					  .chunk_idx = 0, .offset = 0, .length = 4096};
	struct stk_frame_hdr h = {0};
	struct stk_wbuf w;

	stk_wbuf_init(&w, g_req + STK_FRAME_HDR_LEN, sizeof(g_req) - STK_FRAME_HDR_LEN);
	stk_msg_stor_read_req_enc(&w, &m);
	h.opcode = STK_OP_STOR_READ;
	h.payload_len = (uint32_t)w.len;
	stk_frame_seal(&h, g_req + STK_FRAME_HDR_LEN, NULL, g_req);
	g_req_len = STK_FRAME_HDR_LEN + w.len;
}

/* Writes requests until INFLIGHT are out or the socket is full. */
static void pump_out(struct sconn *c, unsigned inflight)
{
	while (!c->dead && (c->out_off || c->inflight < inflight)) {
		ssize_t n;

		n = send(c->fd, g_req + c->out_off, g_req_len - c->out_off, MSG_NOSIGNAL);
		if (n < 0) {
			if (errno != EAGAIN && errno != EINTR)
				c->dead = 1;
			return;
		}
		c->out_off += (size_t)n;
		if (c->out_off == g_req_len) {
			c->out_off = 0;
			c->inflight++;
			c->sent++;
		}
	}
}

/* Reads replies, counting each whole one. */
static void pump_in(struct sconn *c)
{
	uint8_t sink[4096];

	while (!c->dead) {
		ssize_t n;

		if (c->skip) {
			n = recv(c->fd, sink, c->skip < sizeof(sink) ? c->skip : sizeof(sink), 0);
			if (n > 0) {
				c->skip -= (uint32_t)n;
				if (!c->skip) {
					c->answered++;
					c->inflight--;
				}
				continue;
			}
		} else {
			n = recv(c->fd, c->hb + c->hb_got, sizeof(c->hb) - c->hb_got, 0);
			if (n > 0) {
				struct stk_frame_hdr h;

				c->hb_got += (size_t)n;
				if (c->hb_got < sizeof(c->hb))
					continue;
				c->hb_got = 0;
				if (stk_hdr_decode(c->hb, &h) || !(h.flags & STK_FRAME_REPLY)) {
					c->dead = 1;
					return;
				}
				c->skip = h.payload_len + h.bulk_len;
				if (!c->skip) {
					c->answered++;
					c->inflight--;
				}
				continue;
			}
		}
		if (n == 0 || (errno != EAGAIN && errno != EINTR))
			c->dead = 1;
		return;
	}
}

int main(int argc, char **argv)
{
	struct sockaddr_storage ss;
	socklen_t sslen;
	struct rlimit rl;
	struct sconn *cs;
	unsigned nconns, inflight = 2, opened = 0, connecting = 0, connected = 0;
	uint64_t seconds, start, end, t_connected = 0, t0, setup_ns = 0;
	int ep;

	if (argc < 4) {
		fprintf(stderr, "usage: stk_connscale HOST:PORT CONNS SECONDS [INFLIGHT]\n");
		return 2;
	}
	nconns = (unsigned)strtoul(argv[2], NULL, 10);
	seconds = strtoull(argv[3], NULL, 10);
	if (argc > 4)
		inflight = (unsigned)strtoul(argv[4], NULL, 10);
	if (!nconns || !inflight || stk_net_resolve(argv[1], &ss, &sslen)) {
		fprintf(stderr, "stk_connscale: bad arguments\n");
		return 2;
	}
	getrlimit(RLIMIT_NOFILE, &rl);
	if (rl.rlim_max < nconns + 64)
		rl.rlim_max = nconns + 64; /* root may raise it */
	rl.rlim_cur = rl.rlim_max;
	if (setrlimit(RLIMIT_NOFILE, &rl)) {
		fprintf(stderr, "stk_connscale: cannot allow %u open files: %s\n", nconns + 64,
			strerror(errno));
		return 1;
	}
	/* The cluster's key, as a client finds it (client.h): each connection proves it. */
	if (stk_client_auth_find(argv[1], NULL))
		return 1;
	build_request();
	cs = calloc(nconns, sizeof(*cs));
	ep = epoll_create1(0);
	if (!cs || ep < 0)
		return 1;
	start = stk_now_ns();
	end = 0;
	for (;;) {
		struct epoll_event ev[256];
		uint64_t now = stk_now_ns();
		int n;

		while (opened < nconns && connecting < 512) {
			struct sconn *c = &cs[opened];
			struct epoll_event e = {.events = EPOLLIN | EPOLLOUT, .data.ptr = c};
			int one = 1;

			c->fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
			if (c->fd < 0) {
				fprintf(stderr, "stk_connscale: socket %u: %s\n", opened, strerror(errno));
				return 1;
			}
			setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
			/*
			 * Connected, and with a key proven, one at a time and blocking, with
			 * or without a key alike, so that connect_us (below) is what one
			 * connection's set-up costs, the handshake included or not.
			 */
			t0 = stk_now_ns();
			if (connect(c->fd, (struct sockaddr *)&ss, sslen) < 0 ||
			    (stk_net_auth_keys() && stk_net_auth_fd(c->fd, argv[1])))
				c->dead = 1;
			setup_ns += stk_now_ns() - t0;
			fcntl(c->fd, F_SETFL, fcntl(c->fd, F_GETFL) | O_NONBLOCK);
			epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &e);
			opened++;
			connecting++;
		}
		if (connected == nconns && !end) {
			t_connected = now;
			end = now + seconds * 1000000000ull;
		}
		if (end && now >= end)
			break;
		if (!end && now - start > 120ull * 1000000000ull) {
			fprintf(stderr, "stk_connscale: only %u of %u connected after 120 s\n",
				connected, nconns);
			break;
		}
		n = epoll_wait(ep, ev, 256, 100);
		for (int i = 0; i < n; i++) {
			struct sconn *c = ev[i].data.ptr;

			if (c->dead)
				continue;
			if (!c->connected) {
				int err = 0;
				socklen_t elen = sizeof(err);

				getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &elen);
				if (err) {
					c->dead = 1;
					connecting--;
					continue;
				}
				c->connected = 1;
				connecting--;
				connected++;
			}
			if (ev[i].events & EPOLLIN)
				pump_in(c);
			pump_out(c, inflight);
		}
	}
	{
		uint64_t total = 0, min = UINT64_MAX, dead = 0, ok = 0;
		double secs = t_connected ? (double)(stk_now_ns() - t_connected) / 1e9 : 0;

		for (unsigned i = 0; i < nconns; i++) {
			struct sconn *c = &cs[i];

			total += c->answered;
			if (c->answered < min)
				min = c->answered;
			if (c->dead)
				dead++;
			if (c->connected && !c->dead && c->answered > 0)
				ok++;
		}
		printf("conns=%u connected=%u ok=%llu dead=%llu replies=%llu "
		       "min_per_conn=%llu seconds=%.1f replies_per_s=%.0f connect_us=%.1f\n",
		       nconns, connected, (unsigned long long)ok, (unsigned long long)dead,
		       (unsigned long long)total,
		       (unsigned long long)(min == UINT64_MAX ? 0 : min), secs,
		       secs > 0 ? (double)total / secs : 0.0,
		       opened ? (double)setup_ns / opened / 1e3 : 0.0);
		for (unsigned i = 0; i < nconns; i++)
			close(cs[i].fd);
		free(cs);
		return ok == nconns ? 0 : 1;
	}
}
