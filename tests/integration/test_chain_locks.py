"""Two chains whose heads sit on each other's nodes never wait on each other.

Three storage nodes of two targets each make two chains of three, each member on
its own node and the two chains in different orders, so each node is the head
of one chain and the successor of a member of the other. A truncate holds its
inode's lock while it goes down its chain, a write shares it: were those locks a
node's (shared by every chain through it), a truncate going from node P to Q
while a write of another inode goes from Q to P could each hold the lock the
other waits for on its next node, until the forward timed out. Truncates and
writes of many files on both chains at once must all finish promptly.
"""
import os

from conftest import CHECK, needs_root, run
from netns import net_cluster
from test_replication import MGMTD, assert_replicas_identical, tables, wait_for

pytestmark = needs_root


def test_truncates_and_writes_on_crossing_chains(tmp_path):
    with net_cluster(tmp_path, mgmtd_args=MGMTD) as net:
        net.add_meta("meta1")
        for n in ("st1", "st2", "st3"):
            net.add_storage(n, targets=2)
        net.start_all()
        net.wait_serving()
        targets, chains = wait_for("two chains of three", lambda: (lambda t, c: (t, c) if len(
            c) >= 2 else None)(*tables(net.status())))
        heads = {targets[m[0]][1].split(os.sep)[-2] for _, m, _ in chains.values()}
        assert len(heads) == 2, ("the chains' heads share a node", chains, targets)

        # eight files whose inodes share a lock slot (stk_check picks them), 1200
        # KiB each (chunks on both chains), written, fsynced and cut to 4 KiB again
        # and again. Before the locks were a target's, this hung within seconds and
        # every file's change failed with EIO minutes later.
        p = run(net.in_client([CHECK, "truncloop", net.url, "/tl", "8", "20", "1200K"]), check=False,
                timeout=300)
        out = p.stdout.decode()
        assert p.returncode == 0, out + p.stderr.decode()[-2000:]
        f = out.split()
        ops, max_ms = int(f[f.index("ops") + 1]), int(f[f.index("max_ms") + 1])
        assert ops >= 48, out
        # a forward that waited on a lock the other chain held would have waited for
        # its RPC timeout (a minute); a loaded machine's worst write is a few seconds
        assert max_ms < 20000, "an operation waited %d ms: %s" % (max_ms, out)
        t, c = tables(net.status())
        assert_replicas_identical(net, c, t)
