"""A storage node cut off by the network, on hosts of their own (netns.py).

mgmtd, meta, two storage nodes and the client each run in a network namespace of
their own, joined by veth pairs on a bridge the test makes and removes. A node's
link set down is a network cut: unlike a stopped process, its sockets stay open and
nothing tells its peers; only timeouts do. With one copy of each chunk (replication
is issue 23's), a cut node's files must fail cleanly and promptly (never wrong bytes),
the others' keep working, mgmtd marks the node offline so that new files avoid it,
and once the link is back the node serves again and every file reads back whole.
"""
import os
import time

import pytest

from conftest import needs_root
from netns import net_cluster

pytestmark = needs_root

# Clients give up on a node within seconds (the daemons keep their defaults).
CLIENT = {"STOKER_RETRY_MS": "2000", "STOKER_RPC_TIMEOUT_MS": "1000"}


@pytest.fixture
def net(tmp_path):
    with net_cluster(tmp_path) as c:
        yield c


def read(net, name):
    p = net.cli("cat", name, check=False, env=CLIENT, timeout=120)
    return p.stdout if p.returncode == 0 else None


def test_a_cut_node_fails_cleanly_is_avoided_and_heals(net):
    net.add_meta("meta1")
    net.add_storage("st1")
    net.add_storage("st2")
    net.start_all()
    net.wait_serving()
    files = {}
    for i in range(16):
        files["/f%d" % i] = os.urandom(3000 + 1117 * i)
        net.cli("put", "-", "/f%d" % i, input=files["/f%d" % i], env=CLIENT)

    net.cut("st2")
    t0 = time.time()
    got = {name: read(net, name) for name in files}
    took = time.time() - t0
    # never wrong bytes: each file is whole, or its read failed
    assert all(g is None or g == files[n] for n, g in got.items())
    failed = [n for n, g in got.items() if g is None]
    assert 0 < len(failed) < len(files), "files on both nodes expected: %s" % failed
    # each failed read gave up within the client's window, not the daemons' timeouts
    assert took < 16 * 8, took

    # mgmtd, in a namespace of its own, misses st2's heartbeats: its targets go offline
    deadline = time.time() + 40
    while time.time() < deadline and net.status().count(" offline ") < 2:
        time.sleep(0.5)
    st = net.status()
    assert st.count(" offline ") >= 2, st
    time.sleep(2)  # meta learns the table at its next heartbeat
    # new files go to the node that is still reachable, and read back
    for i in range(6):
        data = os.urandom(5000 + i)
        net.cli("put", "-", "/new%d" % i, input=data, env=CLIENT)
        assert read(net, "/new%d" % i) == data

    net.heal("st2")
    deadline = time.time() + 40
    while time.time() < deadline and net.status().count(" serving ") < 4:
        time.sleep(0.5)
    assert net.status().count(" serving ") == 4, net.status()
    for name, data in files.items():
        assert read(net, name) == data, name
