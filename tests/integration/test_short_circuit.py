"""Short-circuit reads of replicated chains (docs/architecture.md, "short-circuit";
src/chunk/servemap.h): a client with a storage node's host id reads that node's
copies of a chain of three from the disk itself, but only as the node would serve
them, and the node counts those reads in its /metrics.

Each node runs in a network namespace of its own (netns.py) with the host id
"roles-NAME"; the client runs in its own namespace and claims a node's host id
(STOKER_HOST_ID), which makes that node's chunk files its own disk's. What must
hold:

- a local client reads a chain of three through the short circuit, gets the right
  bytes, and the node's stoker_target_short_circuit_* count it (and its own
  stoker_target_reads_total does not);
- while a change of the chunk is pending on the local node (its successor
  stopped with SIGSTOP, so the tail has not acknowledged it), the local reader
  never returns the new bytes: each read ending before the successor resumes is
  the old file, and the reader counted reads sent away for the pending change;
- a local node cut off from mgmtd fences itself: its map expires, the local
  reader goes through the network, learns the node is gone and never reads its
  stale copy once a rewrite was acknowledged without it.
"""
import os
import signal
import subprocess
import threading
import time

import pytest

from conftest import CHECK, needs_root, run
from netns import net_cluster
from test_chainstat import metrics_addr, scrape
from test_replication import fnv1a64, serving_again, tables, wait_for

pytestmark = needs_root

MGMTD = ["--replicas", "3", "--heartbeat-timeout-ms", "3000"]
CHUNK = 64 << 10


@pytest.fixture
def net(tmp_path):
    with net_cluster(tmp_path, mgmtd_args=MGMTD) as c:
        yield c


def three_nodes(net):
    """meta1 and st1..st3 of one target each, with /metrics: (targets, chains,
    members of the one chain head first, {target id: node name})."""
    meta = net.add_meta("meta1")
    meta.argv += ["--chunk-size", "64K"]
    for i in range(3):
        node = net.add_storage("st%d" % (i + 1), targets=1)
        node.argv += ["--metrics", metrics_addr(node)]
    net.start_all()
    net.wait_serving()
    targets, chains = wait_for("a chain of three", lambda: (lambda t, c: (t, c) if c
                               else None)(*tables(net.status())))
    assert len(chains) == 1, chains
    (_, (_, members, _)), = chains.items()
    names = {tid: path.split(os.sep)[-2] for tid, (_, path) in targets.items()}
    return targets, chains, members, names


def local_env(name):
    return {"STOKER_HOST_ID": "roles-" + name}


def sc_counts(net, name, tid):
    m = scrape(net, net.nodes[name])
    key = '{target="%d"}' % tid
    return (m["stoker_target_short_circuit_reads_total" + key],
            m["stoker_target_short_circuit_read_bytes_total" + key],
            m["stoker_target_reads_total" + key])


def start_reader(net, name, path, secs):
    """stk_check staleread as a client local to node name; (process, lines, thread)."""
    p = subprocess.Popen(net.in_client([CHECK, "staleread", net.url, path, str(secs)]),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=dict(os.environ, **local_env(name)))
    lines = []
    t = threading.Thread(target=lambda: lines.extend(p.stdout), daemon=True)
    t.start()
    return p, lines, t


def reads(lines):
    """[(hash, t0, t1, short-circuit reads, pending refusals)] of staleread's lines."""
    out = []
    for l in list(lines):
        f = l.split()
        if f and f[0] == b"READ":
            out.append((f[2].decode(), int(f[3]), int(f[4]), int(f[5]), int(f[6])))
    return out


def test_local_replica_reads_are_counted_and_never_uncommitted(net):
    targets, chains, members, names = three_nodes(net)
    head, succ = names[members[0]], names[members[1]]
    old = os.urandom(CHUNK)
    net.cli("put", "-", "/one", input=old)  # one chunk

    # read on the head's host: through the short circuit, counted by the head
    r0, b0, n0 = sc_counts(net, head, members[0])
    assert net.cli("cat", "/one", env=local_env(head)).stdout == old
    r1, b1, n1 = sc_counts(net, head, members[0])
    assert r1 >= r0 + 1 and b1 >= b0 + CHUNK, (r0, r1, b0, b1)
    assert n1 == n0, "the local read went through the node"
    # another host's client: through a node, counted as a node's read
    assert net.cli("cat", "/one").stdout == old

    reader, lines, t = start_reader(net, head, "/one", 60)
    wait_for("local reads", lambda: len(reads(lines)) >= 5)
    assert reads(lines)[-1][3] > 0, "the reader read nothing through the short circuit"
    # the head's successor stops: a change of the chunk stays pending on the head
    os.kill(net.nodes[succ].proc.pid, signal.SIGSTOP)
    writer = None
    try:
        writer = subprocess.Popen(net.in_client([CHECK, "overwrite", net.url, "/one", "7"]),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        time.sleep(1.5)  # under mgmtd's 3 s timeout: the successor stays in the chain
        resumed = time.monotonic_ns()
    finally:
        os.kill(net.nodes[succ].proc.pid, signal.SIGCONT)
    out, err = writer.communicate(timeout=120)
    assert writer.returncode == 0, err.decode()[-2000:]
    acked = int(out.split(b"ACKED ")[1].split()[0])
    started = int(out.split(b"START ")[1].split()[0])
    assert acked > resumed, "the write was acknowledged with the successor stopped"
    n = len(reads(lines))
    wait_for("reads after the write", lambda: len(reads(lines)) >= n + 10)
    reader.kill()
    reader.wait()
    t.join(timeout=10)
    new = net.cli("cat", "/one").stdout
    assert new != old and len(new) == CHUNK
    want = {fnv1a64(old): "old", fnv1a64(new): "new"}
    got = reads(lines)
    seen = [(want.get(h, "OTHER"), t0, t1) for h, t0, t1, _, _ in got]
    assert all(w != "OTHER" for w, _, _ in seen), seen
    early = [w for w, _, t1 in seen if t1 < resumed]
    assert early and all(w == "old" for w in early), \
        "a read returned bytes the tail had not acknowledged: %s" % seen
    assert all(w == "new" for w, t0, _ in seen if t0 > acked), seen
    # the short circuit was refused while the change was pending, and used after
    during = [g for g in got if g[2] > started]
    assert during and during[-1][4] > got[0][4], "no local read met the pending change"
    assert got[-1][3] > during[0][3], "no short-circuit read after the write"
    r2, _, _ = sc_counts(net, head, members[0])
    assert r2 > r1


def test_a_fenced_local_node_is_not_read_behind_its_back(net):
    targets, chains, members, names = three_nodes(net)
    local = names[members[0]]
    old = os.urandom(CHUNK)
    net.cli("put", "-", "/f", input=old)
    reader, lines, t = start_reader(net, local, "/f", 90)
    wait_for("local reads", lambda: len(reads(lines)) >= 5)
    assert reads(lines)[-1][3] > 0, "the reader read nothing through the short circuit"
    mgmtd_ip = net.mgmtd_addr.split(":")[0]
    ns = net.netns[local]
    run(["ip", "-n", ns, "route", "add", "blackhole", mgmtd_ip + "/32"])
    try:
        wait_for("the local node offline", lambda: tables(net.status())[0][members[0]][0]
                 == "offline")
        out = run(net.in_client([CHECK, "overwrite", net.url, "/f", "9"]), timeout=120).stdout
        acked = int(out.split(b"ACKED ")[1].split()[0])
        n = len(reads(lines))
        wait_for("reads after the rewrite", lambda: len(reads(lines)) >= n + 10)
    finally:
        run(["ip", "-n", ns, "route", "del", "blackhole", mgmtd_ip + "/32"], check=False)
    reader.kill()
    reader.wait()
    t.join(timeout=10)
    new = net.cli("cat", "/f").stdout
    assert new != old
    want = {fnv1a64(old): "old", fnv1a64(new): "new"}
    seen = [(want.get(h, "OTHER"), t0) for h, t0, _, _, _ in reads(lines)]
    after = [w for w, t0 in seen if t0 > acked]
    assert after and all(w == "new" for w in after), \
        "the fenced node's stale copy was read: %s" % seen

    # back in touch, it catches up and its host reads it locally again
    targets, final = serving_again(net, {members[0]})
    r0, _, _ = sc_counts(net, local, members[0])
    assert wait_for("a local read of the new copy", lambda: net.cli(
        "cat", "/f", env=local_env(local)).stdout == new and
        sc_counts(net, local, members[0])[0] > r0, timeout=30)
