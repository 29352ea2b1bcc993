"""Lose a node, lose nothing: nodes added and drained while the cluster serves.

Each storage node runs in a network namespace of its own (netns.py), with real
daemons and real clients. What must hold:

- a node added to a running cluster is put to use: mgmtd's rebalancer moves chain
  memberships onto it (the new member copies the chain's chunks before the old
  one leaves) and forms new chains of the freed targets, until every node holds
  as many memberships as it has targets; every chain then has all its copies,
  byte-identical, and everything written before and during the moves reads back;
- `stoker admin drain-node` empties an online node the same way under a writer,
  the chain keeping three serving copies throughout; `undrain-node` cancels it,
  abandoning the move in flight; a drained node is removed while it runs;
- a target that leaves a chain (a move's old member, an abandoned move's new
  one) has its stale chunk files removed by its node before it may serve again.
"""
import os
import re
import signal
import subprocess
import time

from conftest import CHECK, needs_root
from netns import net_cluster
from test_replication import chunk_files, replicas_identical_soon, tables, wait_for

pytestmark = needs_root


def loads(status):
    """{node id: (members, targets, draining words)} from the Rebalance section."""
    out = {}
    for line in status.splitlines():
        m = re.match(r"  node (\d+): (\d+) of (\d+) targets in chains(.*)", line)
        if m:
            out[int(m.group(1))] = (int(m.group(2)), int(m.group(3)), m.group(4))
    return out


def moves(status):
    """[(chain, from target, to target)] of the moves in flight."""
    return [tuple(int(x) for x in m.groups()) for m in
            re.finditer(r"  chain (\d+): target (\d+) -> (\d+) \(", status)]


def node_of(status):
    """{target id: node id} from the Targets table."""
    out, part = {}, None
    for line in status.splitlines():
        if line in ("Targets", "Chains"):
            part = line
            continue
        f = line.split()
        if part == "Targets" and f and f[0].isdigit():
            out[int(f[0])] = int(f[1])
    return out


def settled(net, want=None):
    """Waits until no move is in flight and every target is serving (none syncing or
    wiping), then a second more; returns the status."""
    def done():
        st = net.status()
        t, c = tables(st)
        ok = "Rebalance: 0 move(s)" in st and all(s == "serving" for s, _ in t.values())
        return st if ok and (want is None or want(st)) else None
    wait_for("the rebalance to settle", done, timeout=90)
    time.sleep(1)
    return net.status()


def writer(net, path):
    """A writer of small files (at most 200 KB), fsynced one after the other."""
    return subprocess.Popen(net.in_client([CHECK, "ackloop", net.url, path, "200K"]),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def stop_writer(w):
    w.kill()
    out, err = w.communicate()
    assert w.returncode == -9, "the writer failed: %s" % err.decode()[-2000:]
    acked = [l.split() for l in out.decode().splitlines() if l.startswith("ACK ")]
    assert acked, err.decode()[-2000:]
    return acked


def test_a_node_added_later_takes_its_share(tmp_path):
    """Three nodes of two targets, chains of two: balanced from the start (nothing
    moves). A fourth node joins under a writer: a membership moves onto it, a new
    chain forms of the target that left and the new node's other one, and every
    node holds two memberships; all copies identical, every file reads back."""
    with net_cluster(tmp_path, mgmtd_args=["--replicas", "2", "--heartbeat-timeout-ms",
                                           "3000"]) as net:
        net.add_meta("meta1")
        for n in ("st1", "st2", "st3"):
            net.add_storage(n, targets=2)
        net.start_all()
        net.wait_serving()
        st = settled(net, lambda s: len(tables(s)[1]) == 3)
        assert set(v[:2] for v in loads(st).values()) == {(2, 2)}, st
        assert "0 finished" in st, st  # a new cluster starts balanced
        targets, chains = tables(st)
        files = {"/a%d" % i: os.urandom(150_000 * i + 1) for i in range(5)}
        for name, data in files.items():
            net.cli("put", "-", name, input=data)

        w = writer(net, "/ack")
        time.sleep(1)
        net.add_storage("st4", targets=2)
        net.start("st4")

        def st4_in_use(s):
            nodes = node_of(s)
            st4 = {nodes[t] for t, (_, p) in tables(s)[0].items() if "/st4/" in p}
            return st4 and all(loads(s)[n][0] == 2 for n in st4)
        st = settled(net, st4_in_use)
        acked = stop_writer(w)
        st = settled(net)
        targets, chains = tables(st)
        assert len(chains) == 4, st
        assert set(v[:2] for v in loads(st).values()) == {(2, 2)}, st
        for cid, (_, members, words) in chains.items():
            assert len(members) == 2 and not any("(" in x for x in words), st
        # the killed writer's last change may be on a head only: sent on by itself
        assert replicas_identical_soon(net, chains, targets) >= 5
        for name, data in files.items():
            assert net.cli("cat", name).stdout == data
        for _, path, size, seed in acked:
            net.check("verify", path, size, seed)
        mlog = open(net.nodes["mgmtd"].log).read()
        assert "moving target" in mlog and "leaves the chain (WIPING)" in mlog, mlog[-3000:]
        # the member that left had chunks of its old chain: its node removed them
        logs = "".join(open(net.nodes[n].log).read() for n in ("st1", "st2", "st3"))
        assert "stale chunks removed" in logs, logs[-3000:]


def test_a_change_on_its_way_in_reaches_a_member_that_joins(tmp_path):
    """Three nodes of one target, chains of two: one chain and a spare. Every write
    waits a second at the chain's tail before it lands (STOKER_TEST_TAIL_DELAY_MS).
    The tail's node is drained under a writer: the spare joins last and copies
    from the tail, while a write the tail admitted as the tail is still on its
    way in. The copy waits for it (tail_enter in src/storage/service.c), so that
    once the tail has left, the spare holds every chunk the head holds."""
    saved = os.environ.get("STOKER_TEST_TAIL_DELAY_MS")
    os.environ["STOKER_TEST_TAIL_DELAY_MS"] = "1000"
    try:
        with net_cluster(tmp_path, mgmtd_args=["--replicas", "2", "--heartbeat-timeout-ms",
                                               "3000"]) as net:
            net.add_meta("meta1")
            for i in range(3):
                net.add_storage("st%d" % (i + 1), targets=1)
            net.start_all()
            net.wait_serving()
            st = settled(net, lambda s: len(tables(s)[1]) == 1)
            targets, chains = tables(st)
            (cid, (_, members, _)), = chains.items()
            head, tail = members
            spare = [t for t in targets if t not in members][0]
            w = writer(net, "/ack")
            wait_for("the writer's first files", lambda: len(chunk_files(targets[head][1])) >= 2,
                     timeout=60)
            net.cli("admin", "drain-node", str(node_of(st)[tail]), "--cluster", net.url)
            settled(net, lambda s: tail not in tables(s)[1][cid][1])
            acked = stop_writer(w)
            targets, chains = tables(net.status())
            assert chains[cid][1] == [head, spare], chains
            assert replicas_identical_soon(net, chains, targets) >= 2
            for _, path, size, seed in acked:
                net.check("verify", path, size, seed)
    finally:
        if saved is None:
            os.environ.pop("STOKER_TEST_TAIL_DELAY_MS", None)
        else:
            os.environ["STOKER_TEST_TAIL_DELAY_MS"] = saved


def test_drain_cancel_drain_and_remove_an_online_node(tmp_path):
    """Four nodes of one target, chains of three: one chain and a spare. A drain of a
    member's node starts a move to the spare; cancelled, the move is abandoned and
    the spare's half-copied chunks are removed. Drained again under a writer, the
    node ends with no membership, the chain with three serving copies none on it,
    its own stale chunks removed; remove-node then drops it though it runs."""
    with net_cluster(tmp_path, mgmtd_args=["--replicas", "3", "--heartbeat-timeout-ms",
                                           "3000"]) as net:
        net.add_meta("meta1")
        for i in range(4):
            # a slow copy (1 MB/s), so that the first drain is cancelled mid-copy
            net.add_storage("st%d" % (i + 1), targets=1).argv += ["--resync-rate", "1M"]
        net.start_all()
        net.wait_serving()
        st = settled(net, lambda s: len(tables(s)[1]) == 1)
        targets, chains = tables(st)
        nodes = node_of(st)
        (cid, (_, members, _)), = chains.items()
        spare = [t for t in targets if t not in members][0]
        files = {"/d%d" % i: os.urandom(1_000_000 + i) for i in range(3)}
        for name, data in files.items():
            net.cli("put", "-", name, input=data)
        victim_t = members[1]
        victim = nodes[victim_t]
        victim_dir = targets[victim_t][1]
        spare_dir = targets[spare][1]
        assert chunk_files(victim_dir) and not chunk_files(spare_dir)

        p = net.cli("admin", "drain-node", "999", "--cluster", net.url, check=False)
        assert p.returncode == 1 and b"has no storage or meta node 999" in p.stderr, p.stderr
        p = net.cli("admin", "remove-node", str(victim), "--cluster", net.url, check=False)
        assert p.returncode == 1 and b"drain it first" in p.stderr, p.stderr

        # drain, and cancel while the spare copies
        p = net.cli("admin", "drain-node", str(victim), "--cluster", net.url)
        assert b"draining, 1 chain membership(s) left" in p.stdout, p.stdout
        st = wait_for("the move to the spare", lambda: (lambda s: s if moves(s) == [
            (cid, victim_t, spare)] and chunk_files(spare_dir) else None)(net.status()))
        assert "draining: 1 membership(s) left" in st, st
        p = net.cli("admin", "undrain-node", str(victim), "--cluster", net.url)
        assert b"no longer draining" in p.stdout, p.stdout
        st = settled(net)
        targets, chains = tables(st)
        assert sorted(chains[cid][1]) == sorted(members), st
        assert "1 abandoned" in st and "draining" not in st, st
        wait_for("the spare's stale chunks removed", lambda: not chunk_files(spare_dir))
        # the spare again at the default copy rate: a writer outruns 1 MB/s
        name = [n for n in net.nodes if os.sep + n + os.sep in spare_dir][0]
        net.kill(name, signal.SIGTERM)
        net.nodes[name].argv = net.nodes[name].argv[:-2]
        net.start(name)
        wait_for("the spare back", lambda: tables(net.status())[0][spare][0] == "serving")

        # drained for good under a writer; the chain never has fewer than 3 serving
        net.cli("admin", "drain-node", str(victim), "--cluster", net.url)
        w = writer(net, "/ack")

        def drained():
            s = net.status()
            t, c = tables(s)
            working = [x for x in c[cid][2] if "(" not in x]
            assert len(working) >= 3, s
            return s if "drained: no membership left" in s else None
        wait_for("the node drained", drained, timeout=90)
        acked = stop_writer(w)
        st = settled(net)
        targets, chains = tables(st)
        assert victim_t not in chains[cid][1] and spare in chains[cid][1], st
        assert len(chains[cid][1]) == 3 and not any("(" in x for x in chains[cid][2]), st
        wait_for("the drained target's stale chunks removed", lambda: not chunk_files(victim_dir))
        p = net.cli("admin", "remove-node", str(victim), "--cluster", net.url)
        assert b"0 target(s) replaced" in p.stdout, p.stdout
        assert replicas_identical_soon(net, chains, targets) >= 3
        for name, data in files.items():
            assert net.cli("cat", name).stdout == data
        for _, path, size, seed in acked:
            net.check("verify", path, size, seed)
        name = [n for n in net.nodes if os.sep + n + os.sep in victim_dir][0]
        slog = open(net.nodes[name].log).read()
        assert "stale chunks removed" in slog, slog[-3000:]
