/*
 * stk_connsetup: what one connection's set-up costs through the client's own
 * transport (net.h, stk_conn_connect): connect, then the key handshake, or the TLS
 * handshake when the process uses TLS (STOKER_TLS=1, or a cluster of
 * `stoker up --tls`).
 *
 *   stk_connsetup HOST:PORT COUNT
 *
 * Opens and closes COUNT connections one after the other, finding the cluster's
 * key as any client does (client.h, stk_client_auth_find), and prints one line:
 * "conns=N tls=0|1 setup_us=MEAN". Exits 0, or 1 when a connection failed.
 */
#include <stdio.h>
#include <string.h>

#include "../../src/client/client.h"
#include "../../src/common/util.h"
#include "../../src/net/net.h"

int main(int argc, char **argv)
{
	uint64_t n, t0;

	if (argc != 3 || stk_parse_u64(argv[2], &n) || n == 0) {
		fprintf(stderr, "usage: stk_connsetup HOST:PORT COUNT\n");
		return 2;
	}
	if (stk_client_auth_find(argv[1], NULL))
		return 1;
	t0 = stk_now_ns();
	for (uint64_t i = 0; i < n; i++) {
		struct stk_conn *c;
		int rc = stk_conn_connect(argv[1], 5000, &c);

		if (rc) {
			fprintf(stderr, "stk_connsetup: connection %llu: %s\n",
				(unsigned long long)i, strerror(-rc));
			return 1;
		}
		stk_conn_close(c);
	}
	printf("conns=%llu tls=%d setup_us=%.1f\n", (unsigned long long)n, stk_net_tls(),
	       (double)(stk_now_ns() - t0) / 1e3 / (double)n);
	return 0;
}
