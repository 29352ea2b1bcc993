"""Three copies of every chunk, on three hosts, and a host that dies under load.

mgmtd (--replicas 3) makes chains of three targets, one from each storage node;
each node runs in a network namespace of its own (netns.py), so the client never
reads a chunk file from the disk. What must hold:

- every write reaches all three members: their chunk files are byte-identical;
- a member killed with SIGKILL in the middle of a write workload costs the writer
  a pause, never an error, and every acknowledged file reads back whole, from the
  survivors;
- mgmtd marks the dead node's targets offline and bumps its chains' versions, and
  when the node comes back, under a writer again, its targets are "syncing" (last
  in their chains, sent every change, serving no read) while they copy what they
  missed, then serving: all three copies are byte-identical again, and every
  acknowledged file reads back.
"""
import os
import re
import signal
import subprocess
import time

import pytest

from conftest import CHECK, needs_root
from netns import net_cluster

pytestmark = needs_root

MGMTD = ["--replicas", "3", "--heartbeat-timeout-ms", "3000"]


@pytest.fixture
def net(tmp_path):
    with net_cluster(tmp_path, mgmtd_args=MGMTD) as c:
        yield c


def tables(status):
    """(targets, chains) of `stoker status`: {id: (state, path)}, {id: (version,
    [member ids], [member words as printed])}."""
    targets, chains, part = {}, {}, None
    for line in status.splitlines():
        if line in ("Targets", "Chains", "Nodes") or line.startswith("Metadata"):
            part = line
            continue
        f = line.split()
        if not f or not f[0].isdigit():
            continue
        if part == "Targets":
            targets[int(f[0])] = (f[2], f[-1])
        elif part == "Chains":
            # members are the words that start with their id; "! degraded" may follow
            words = [w for w in f[2:] if w[0].isdigit()]
            chains[int(f[0])] = (int(f[1]), [int(re.match(r"\d+", w).group()) for w in words],
                                 words)
    return targets, chains


def wait_for(what, fn, timeout=40):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(0.3)
    raise AssertionError("timed out waiting for " + what)


def chunk_files(target_dir):
    out = {}
    for root, _, names in os.walk(os.path.join(target_dir, "chunks")):
        for n in names:
            p = os.path.join(root, n)
            out[os.path.relpath(p, target_dir)] = p
    return out


def assert_replicas_identical(net, chains, targets, skip=()):
    checked = 0
    for cid, (_, members, _) in chains.items():
        dirs = [targets[t][1] for t in members if t not in skip]
        files = [chunk_files(d) for d in dirs]
        assert all(set(f) == set(files[0]) for f in files), \
            "chain %d: members hold different chunks: %s" % (cid, [sorted(f) for f in files])
        for rel in files[0]:
            data = [open(f[rel], "rb").read() for f in files]
            assert all(d == data[0] for d in data), "chain %d: %s differs" % (cid, rel)
            checked += 1
    return checked


def test_three_copies_survive_a_dead_node_under_load(net):
    net.add_meta("meta1")
    for n in ("st1", "st2", "st3"):
        net.add_storage(n, targets=2)
    net.start_all()
    net.wait_serving()
    targets, chains = wait_for("two chains of three", lambda: (lambda t, c: (t, c) if len(c) >= 2
                               else None)(*tables(net.status())))
    for cid, (_, members, _) in chains.items():
        assert len(members) == 3, chains
        # one target of each node: the three paths are under three nodes' folders
        nodes = {targets[t][1].split(os.sep)[-2] for t in members}
        assert nodes == {"st1", "st2", "st3"}, (cid, [targets[t][1] for t in members])

    files = {}
    for i in range(8):
        files["/f%d" % i] = os.urandom(1000 + 400_000 * i)
        net.cli("put", "-", "/f%d" % i, input=files["/f%d" % i])
    assert assert_replicas_identical(net, chains, targets) >= 8

    # kill -9 one node while a writer writes and fsyncs file after file
    writer = subprocess.Popen(net.in_client([CHECK, "ackloop", net.url, "/ack"]),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    time.sleep(3)
    net.kill("st2")
    dead = {t for t, (_, p) in targets.items() if os.sep + "st2" + os.sep in p}
    # mgmtd marks its targets offline and every chain goes on without it
    wait_for("st2's targets offline", lambda: all(
        tables(net.status())[0][t][0] == "offline" for t in dead))
    time.sleep(6)  # the writer goes on past the change
    writer.send_signal(signal.SIGKILL)
    out, err = writer.communicate()
    acked = [l.split() for l in out.decode().splitlines() if l.startswith("ACK ")]
    assert writer.returncode == -signal.SIGKILL, "the writer failed: %s" % err.decode()[-2000:]
    assert len(acked) >= 4, "the writer acknowledged too little to test anything: %s" % err

    _, after = tables(net.status())
    for cid, (version, members, words) in after.items():
        assert version > chains[cid][0], "chain %d kept its version: %s" % (cid, after)
        assert sum("(offline)" in w for w in words) == 1, words

    # everything acknowledged reads back whole from the two survivors
    for _, path, size, seed in acked:
        net.check("verify", path, size, seed)
    for name, data in files.items():
        assert net.cli("cat", name).stdout == data
    # and new files are written and read
    for i in range(4):
        data = os.urandom(300_000 + i)
        net.cli("put", "-", "/after%d" % i, input=data)
        assert net.cli("cat", "/after%d" % i).stdout == data
    assert assert_replicas_identical(net, after, targets, skip=dead) >= 8

    # some of what st2 holds goes away while it is down: it must go there too
    net.cli("rm", "/f1")
    del files["/f1"]

    # back, under a writer: its targets catch up, then serve
    writer = subprocess.Popen(net.in_client([CHECK, "ackloop", net.url, "/ack2"]),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    time.sleep(1)
    net.start("st2")

    def serving_again():
        t, _ = tables(net.status())
        return all(t[d][0] == "serving" for d in dead)
    wait_for("st2's targets serving again", serving_again, timeout=90)
    time.sleep(2)
    writer.send_signal(signal.SIGKILL)
    out, err = writer.communicate()
    assert writer.returncode == -signal.SIGKILL, "the writer failed: %s" % err.decode()[-2000:]
    acked2 = [l.split() for l in out.decode().splitlines() if l.startswith("ACK ")]
    assert acked2, err
    targets, final = tables(net.status())
    assert all(not any("(" in w for w in words) for _, _, words in final.values()), final

    # the writer stopped mid-file: wait until that file's last change is through
    time.sleep(1)
    assert assert_replicas_identical(net, final, targets) >= 8
    for name, data in files.items():
        assert net.cli("cat", name).stdout == data
    for _, path, size, seed in acked + acked2:
        net.check("verify", path, size, seed)
    assert "caught up with chain" in open(net.nodes["st2"].log).read()
