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
import threading
import time

import pytest

from conftest import CHECK, needs_root, run
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
        every = set.intersection(*[set(f) for f in files])
        assert all(set(f) == set(files[0]) for f in files), \
            "chain %d: members hold different chunks (beside those all hold): %s" % (
                cid, [sorted(set(f) - every) for f in files])
        for rel in files[0]:
            data = [open(f[rel], "rb").read() for f in files]
            assert all(d == data[0] for d in data), "chain %d: %s differs" % (cid, rel)
            checked += 1
    return checked


def replicas_identical_soon(net, chains, targets, timeout=20):
    """assert_replicas_identical within timeout seconds: a change a successor did not
    take is sent on by its predecessors themselves (settle_main in
    src/storage/service.c) once the chain is whole, a moment later."""
    t0 = time.time()
    while True:
        try:
            n = assert_replicas_identical(net, chains, targets)
            if time.time() - t0 > 0.5:
                print("replicas identical after %.1f s" % (time.time() - t0))
            return n
        except AssertionError:
            if time.time() > t0 + timeout:
                raise
        time.sleep(0.3)


def serving_again(net, tids, timeout=60):
    """Waits until targets tids serve, then a second more (a change on its way
    lands); returns (targets, chains)."""
    def serving():
        t, _ = tables(net.status())
        return all(t[d][0] == "serving" for d in tids)
    wait_for("targets %s serving again" % sorted(tids), serving, timeout=timeout)
    time.sleep(1)
    return tables(net.status())


def chain_of_three(net, chunk_size=None, before_start=None, nodes=3):
    """meta1 and st1..stN (N = nodes) of one target each: one chain of three (and a
    spare target per node past three). Returns (targets, chains) as `tables` reads
    them once it serves."""
    meta = net.add_meta("meta1")
    if chunk_size:
        meta.argv += ["--chunk-size", chunk_size]
    for i in range(nodes):
        net.add_storage("st%d" % (i + 1), targets=1)
    if before_start:
        before_start()
    net.start_all()
    net.wait_serving()
    return wait_for("a chain of three", lambda: (lambda t, c: (t, c) if c
                    else None)(*tables(net.status())))


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
    writer = subprocess.Popen(net.in_client([CHECK, "ackloop", net.url, "/ack", "512K"]),
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

    # some of what st2 holds goes away while it is down: it must go there too. meta
    # removes a file's chunks after the unlink (src/meta/purge.h): wait until both
    # live copies of /f1's one chunk are gone before st2 returns
    live = [t for t in targets if t not in dead]

    def live_chunks():
        return sum(len(chunk_files(targets[t][1])) for t in live)
    n = live_chunks()
    net.cli("rm", "/f1")
    del files["/f1"]
    wait_for("meta to purge /f1 from the live members", lambda: live_chunks() == n - 2)

    # back, under a writer: its targets catch up, then serve
    writer = subprocess.Popen(net.in_client([CHECK, "ackloop", net.url, "/ack2", "512K"]),
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

    # the writer stopped mid-file: its last change may have reached the head only,
    # while st2 still caught up; the head sends it on by itself (settle_main)
    assert replicas_identical_soon(net, final, targets) >= 8
    for name, data in files.items():
        assert net.cli("cat", name).stdout == data
    for _, path, size, seed in acked + acked2:
        net.check("verify", path, size, seed)
    assert "caught up with chain" in open(net.nodes["st2"].log).read()


def corrupt_data(path):
    """Flips bytes of a chunk file's data (its tail: the header is at the front)."""
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.seek(size - 40)
        b = f.read(16)
        f.seek(size - 40)
        f.write(bytes(x ^ 0xA5 for x in b))


def test_a_damaged_copy_is_read_around_and_repaired(net):
    """A chunk whose bytes went bad on one replica: every read still returns the
    right bytes (the damaged member answers CHUNK_DAMAGED and the client reads
    another), each chunk read there is rewritten from a good member, and the
    scrubber finds and repairs the ones nobody read."""
    def metrics_on_st1():
        st1 = net.nodes["st1"]
        st1.argv += ["--metrics", "%s:%d" % (st1.addr.split(":")[0], net.port + 10)]
    # a 2 MiB file: 32 chunks on one chain
    targets, chains = chain_of_three(net, chunk_size="64K", before_start=metrics_on_st1)
    st1 = net.nodes["st1"]
    data = os.urandom(2 << 20)
    net.cli("put", "-", "/d", input=data)
    assert assert_replicas_identical(net, chains, targets) >= 32

    st1_dir = net.nodes["st1"].targets[0]
    st2_dir = net.nodes["st2"].targets[0]
    damaged = chunk_files(st1_dir)
    assert len(damaged) >= 32, damaged
    for p in damaged.values():
        corrupt_data(p)

    def metric(name):
        out = run(net.in_client(["curl", "-s", "http://%s:%d/metrics" % (
            st1.addr.split(":")[0], net.port + 10)]), check=False).stdout.decode()
        return sum(float(l.split()[-1]) for l in out.splitlines()
                   if l.startswith(name + "{") or l.startswith(name + " "))

    # reads spread over the replicas: some chunks are read on st1, none comes back wrong
    for _ in range(3):
        assert net.cli("cat", "/d").stdout == data
    good = chunk_files(st2_dir)

    def repaired_on_st1():
        return [rel for rel, p in damaged.items()
                if open(p, "rb").read() == open(good[rel], "rb").read()]
    fixed = wait_for("chunks read on st1 repaired", repaired_on_st1)
    assert len(fixed) < len(damaged), "every chunk was read on st1: the scrub is untested"
    print("repaired on read:", len(fixed), "of", len(damaged))
    assert metric("stoker_target_checksum_errors_total") >= len(fixed)
    assert metric("stoker_target_chunks_repaired_total") == len(fixed)
    assert "was damaged; rewritten from" in open(st1.log).read()

    # the rest nobody reads: st1 restarted with a scrub every second finds them
    net.kill("st1", signal.SIGTERM)
    st1.argv += ["--scrub-interval", "1", "--scrub-rate", "64M"]
    net.start("st1")
    wait_for("the scrubber to repair the rest", lambda: len(repaired_on_st1()) == len(damaged),
             timeout=60)
    t, c = tables(net.status())
    wait_for("st1 serving", lambda: all(s == "serving" for s, _ in tables(net.status())[0].values()))
    assert assert_replicas_identical(net, c, t) >= 32
    assert net.cli("cat", "/d").stdout == data
    assert "scrub:" in open(st1.log).read()


def test_a_node_cut_off_costs_a_pause_not_the_rpc_timeout(net):
    """A node whose link goes down answers nothing and resets nothing. Calls in
    flight to it (a client's, a head's forward) are given up once mgmtd marks it
    offline, not at the RPC timeout (a minute): the writer and a reader pause for
    about the heartbeat timeout. Healed, the node resyncs and all copies agree."""
    targets, chains = chain_of_three(net)
    data = os.urandom(8 << 20)
    net.cli("put", "-", "/big", input=data)

    writer = subprocess.Popen(net.in_client([CHECK, "ackloop", net.url, "/ack", "512K"]),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    acks = []  # (time, fields)

    def collect():
        for line in writer.stdout:
            if line.startswith(b"ACK "):
                acks.append((time.time(), line.decode().split()))
    t = threading.Thread(target=collect, daemon=True)
    t.start()
    wait_for("the writer to start", lambda: len(acks) >= 2)
    read = {}

    def reader():
        t0 = time.time()
        read["ok"] = net.cli("cat", "/big", timeout=120).stdout == data
        read["s"] = time.time() - t0
    r = threading.Thread(target=reader, daemon=True)
    cut_at = time.time()
    net.cut("st2")
    try:
        r.start()  # routed by the table of before: some of its reads go to st2
        wait_for("an acknowledged write after the cut",
                 lambda: any(a > cut_at + 0.5 for a, _ in acks), timeout=45)
        first_after = min(a for a, _ in acks if a > cut_at + 0.5) - cut_at
        writer.send_signal(signal.SIGKILL)
        writer.wait()
        t.join(timeout=10)
        assert writer.returncode == -signal.SIGKILL, writer.stderr.read().decode()[-2000:]
        r.join(timeout=120)
        assert read.get("ok"), "the read during the cut failed or returned wrong bytes"
        print("read %.1f s, first write after the cut %.1f s" % (read["s"], first_after))
        # heartbeat timeout 3 s, a routing refresh, a retry: well under the 60 s RPC timeout
        assert read["s"] < 25, "a read waited %.1f s on the cut node" % read["s"]
        assert first_after < 25, "the writer waited %.1f s on the cut node" % first_after
    finally:
        if writer.poll() is None:
            writer.kill()
        net.heal("st2")
    dead = {tid for tid, (_, p) in targets.items() if os.sep + "st2" + os.sep in p}

    targets, final = serving_again(net, dead, timeout=90)
    assert replicas_identical_soon(net, final, targets) >= 8
    for _, (_, path, size, seed) in acks:
        net.check("verify", path, size, seed)
    assert net.cli("cat", "/big").stdout == data


def test_a_node_gone_for_good_is_replaced(tmp_path):
    """Four nodes, chains of three: the fourth node's target waits in no chain.
    A chain member's node dies and stays dead past --replace-after: the spare takes
    its place (syncing, then serving), copies the chain's chunks, and the chain has
    three identical copies again, none on the dead node."""
    with net_cluster(tmp_path, mgmtd_args=MGMTD + ["--replace-after", "3"]) as net:
        targets, chains = chain_of_three(net, nodes=4)
        assert len(chains) == 1, chains
        (cid, (_, members, _)), = chains.items()
        spare = [t for t in targets if t not in members]
        assert len(spare) == 1, (targets, chains)
        data = {"/r%d" % i: os.urandom(200_000 * i + 1) for i in range(6)}
        for name, d in data.items():
            net.cli("put", "-", name, input=d)
        victim_t = members[1]
        victim = targets[victim_t][1].split(os.sep)[-2]
        net.kill(victim)

        def replaced():
            t, c = tables(net.status())
            m = c[cid][1]
            return (t, c) if victim_t not in m and spare[0] in m and all(
                t[x][0] == "serving" for x in m) else None
        targets, chains = wait_for("the spare serving in the chain", replaced, timeout=60)
        assert chains[cid][1][-1] == spare[0] or spare[0] in chains[cid][1], chains
        assert assert_replicas_identical(net, chains, targets) >= 6
        for name, d in data.items():
            assert net.cli("cat", name).stdout == d
        mlog = open(net.nodes["mgmtd"].log).read()
        assert "is replaced by target %d" % spare[0] in mlog, mlog[-3000:]


def fnv1a64(data):
    h = 0xcbf29ce484222325
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return "%016x" % h


def test_a_node_cut_off_from_mgmtd_serves_no_stale_copy(net):
    """st2 loses mgmtd (a blackhole route) but not the clients. mgmtd takes it out
    of its chain and the file is rewritten without it. A client that still routes
    by the old table reads st2's chunks on and on: st2 must refuse them once mgmtd
    may have given up on it (it fences itself), so every read is the old file or
    the new one, never a mix. Back in touch, st2 catches up and serves again."""
    # 16 chunks a file of 1 MiB: each replica serves some
    targets, chains = chain_of_three(net, chunk_size="64K")
    a, b = os.urandom(1 << 20), os.urandom(1 << 20)
    net.cli("put", "-", "/s", input=a)
    reader = subprocess.Popen(net.in_client([CHECK, "staleread", net.url, "/s", "60"]),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    lines = []
    t = threading.Thread(target=lambda: lines.extend(reader.stdout), daemon=True)
    t.start()
    wait_for("the reader to read", lambda: len(lines) >= 3)
    mgmtd_ip = net.mgmtd_addr.split(":")[0]
    ns = net.netns["st2"]
    st2 = {tid for tid, (_, p) in targets.items() if os.sep + "st2" + os.sep in p}
    run(["ip", "-n", ns, "route", "add", "blackhole", mgmtd_ip + "/32"])
    try:
        wait_for("st2 offline", lambda: all(tables(net.status())[0][x][0] == "offline"
                                            for x in st2))
        # a new file renamed over the old: a reader opens one or the other, whole
        net.cli("put", "-", "/s.new", input=b)
        net.cli("mv", "/s.new", "/s")
        n = len(lines)
        wait_for("reads of the new file", lambda: len(lines) >= n + 20)
    finally:
        run(["ip", "-n", ns, "route", "del", "blackhole", mgmtd_ip + "/32"], check=False)
    reader.kill()
    reader.wait()
    t.join(timeout=10)
    got = [l.split() for l in lines if l.startswith(b"READ ")]
    want = {fnv1a64(a): "old", fnv1a64(b): "new"}
    seen = [want.get(h.decode(), "MIXED") for _, _, h, *_ in got]
    assert "MIXED" not in seen, (seen, reader.stderr.read().decode()[-2000:])
    assert seen[-1] == "new", seen
    assert "serving no replicated chain" in open(net.nodes["st2"].log).read()

    targets, final = serving_again(net, st2)
    assert assert_replicas_identical(net, final, targets) >= 16
    assert net.cli("cat", "/s").stdout == b


FENCE_MGMTD = ["--replicas", "3", "--heartbeat-timeout-ms", "12000"]


def until_the_fenced_tail_refuses(net, tail, attempt):
    """Cuts node tail off mgmtd (a blackhole route) but not from its predecessor,
    calls attempt(i) for i = 0, 1, ... until one returns False (refused), then heals
    it before mgmtd gives it up. The tail fences itself 9 s after the last heartbeat
    mgmtd answered, and mgmtd gives it up after 12 s: a change between is refused by
    the tail only. Returns the i refused, or None."""
    mgmtd_ip = net.mgmtd_addr.split(":")[0]
    ns = net.netns[tail]
    run(["ip", "-n", ns, "route", "add", "blackhole", mgmtd_ip + "/32"])
    try:
        deadline = time.time() + 14
        i = 0
        while time.time() < deadline:
            if not attempt(i):
                return i
            i += 1
            time.sleep(0.1)
        return None
    finally:
        run(["ip", "-n", ns, "route", "del", "blackhole", mgmtd_ip + "/32"], check=False)
        # its heartbeat's connection, stuck in TCP's backoff, is reset: the agent
        # connects again at once, before mgmtd's timeout
        run(["ip", "netns", "exec", ns, "ss", "-K", "dst", mgmtd_ip], check=False)


def settled_after_the_fence(net, cid, ver, tail, members, node_of, want):
    """The copies meet again, the chain never changed (else the case is another), and
    the logs of the head and the middle say they kept the change and settled it."""
    assert "serving no replicated chain" in open(net.nodes[tail].log).read()
    t, c = tables(net.status())
    replicas_identical_soon(net, c, t, timeout=30)
    t, c = tables(net.status())
    assert c[cid][0] == ver, ("mgmtd gave the tail up: not the case under test", c)
    assert all(s == "serving" for s, _ in t.values()), t
    assert "OFFLINE" not in open(net.nodes["mgmtd"].log).read()
    logs = "".join(open(net.nodes[node_of[m]].log).read() for m in members[:-1])
    for w in want:
        assert w in logs, (w, logs[-3000:])


def test_a_change_its_fenced_tail_refused_is_settled(tmp_path):
    """The tail loses mgmtd but not its predecessor, and fences itself once mgmtd
    may have given up on it: it refuses the next write, which the head and the
    middle have applied. The writer gives up at once (a short retry time, as a
    writer killed before its retry would) and the tail is back in touch before
    mgmtd's timeout, so the chain never changes and nobody sends the write again.
    The head and the middle keep the change pending and send it on themselves once
    the tail takes it: the three copies are identical again, and the file reads
    back as the head holds it. Without that they parted for good."""
    with net_cluster(tmp_path, mgmtd_args=FENCE_MGMTD) as net:
        targets, chains = chain_of_three(net)
        assert len(chains) == 1, chains
        (cid, (ver, members, _)), = chains.items()
        node_of = {t: targets[t][1].split(os.sep)[-2] for t in members}
        tail = node_of[members[-1]]
        net.cli("put", "-", "/before", input=os.urandom(200_000))
        data = {}

        def write(i):
            data[i] = os.urandom(150_000)
            return net.cli("put", "-", "/f%d" % i, input=data[i], check=False,
                           env={"STOKER_RETRY_MS": "300"}).returncode == 0
        failed = until_the_fenced_tail_refuses(net, tail, write)
        assert failed is not None, "no write was refused while the tail was fenced"
        settled_after_the_fence(net, cid, ver, tail, members, node_of,
                                ["stays pending until it does",
                                 "settled (sent whole to its successor again)"])
        # the file the writer gave up on: whatever it holds, every copy says the same
        got = net.cli("cat", "/f%d" % failed, check=False).stdout
        assert got in (b"", data[failed]), len(got)
        for k in range(failed):
            assert net.cli("cat", "/f%d" % k).stdout == data[k]


def test_a_truncate_its_fenced_tail_refused_is_settled(tmp_path):
    """The same with a truncate (a put of nothing over a file of four chunks): the
    head and the middle removed chunks the fenced tail keeps. They take no other
    change of that inode until they have sent the truncate again, as it was, and
    the tail took it: the copies are identical, the file is empty."""
    with net_cluster(tmp_path, mgmtd_args=FENCE_MGMTD) as net:
        targets, chains = chain_of_three(net, chunk_size="64K")
        (cid, (ver, members, _)), = chains.items()
        node_of = {t: targets[t][1].split(os.sep)[-2] for t in members}
        tail = node_of[members[-1]]
        data = os.urandom(200_000)
        for i in range(80):
            net.cli("put", "-", "/f%d" % i, input=data)

        def cut(i):
            return net.cli("put", "-", "/f%d" % i, input=b"", check=False,
                           env={"STOKER_RETRY_MS": "300"}).returncode == 0
        failed = until_the_fenced_tail_refuses(net, tail, cut)
        assert failed is not None, "no truncate was refused while the tail was fenced"
        settled_after_the_fence(net, cid, ver, tail, members, node_of,
                                ["the inode takes no other change until it does",
                                 "settled (sent to its successor again)"])
        for k in range(80):
            assert net.cli("cat", "/f%d" % k).stdout == (b"" if k <= failed else data), k


def test_punches_and_truncates_reach_every_copy(net):
    """A hole punched (stk_fallocate) and files cut by a rewrite (O_TRUNC) go down
    the chain like writes (from the event loop: forward_on_loop): stk_check
    special's file reads back with its hole, the cut files with their new bytes,
    and the three copies are identical."""
    targets, chains = chain_of_three(net)
    for i in range(4):
        net.cli("put", "-", "/cut%d" % i, input=os.urandom(3 << 20))
    p = net.check("special", "/sp", check=False)
    assert p.returncode == 0, p.stdout.decode()[-2000:] + p.stderr.decode()[-2000:]
    small = {}
    for i in range(4):
        small[i] = os.urandom(5000)
        net.cli("put", "-", "/cut%d" % i, input=small[i])
    t, c = tables(net.status())
    assert assert_replicas_identical(net, c, t) >= 4 + 3
    for i in range(4):
        assert net.cli("cat", "/cut%d" % i).stdout == small[i]


def test_every_copy_lost_and_back_in_any_order(net):
    """The chain's nodes die one after the other, a file written between each death;
    the last one alive holds all of them. A write with every copy gone fails with a
    clear error after the retry time. The first node to die comes back first: it
    must not serve (its copy lacks the later files), so reads wait or fail, never
    return wrong bytes. The last node back serves, the others copy from it, and
    every file reads back."""
    targets, chains = chain_of_three(net)
    tid = {n: t for t, (_, p) in targets.items() for n in ("st1", "st2", "st3")
           if os.sep + n + os.sep in p}
    files = {}

    def put(name):
        files[name] = os.urandom(300_000)
        net.cli("put", "-", name, input=files[name])

    def offline(n):
        return lambda: tables(net.status())[0][tid[n]][0] == "offline"
    put("/x1")
    net.kill("st1")
    wait_for("st1 offline", offline("st1"))
    put("/x2")
    net.kill("st2")
    wait_for("st2 offline", offline("st2"))
    put("/x3")  # on st3 alone
    net.kill("st3")
    wait_for("st3 offline", offline("st3"))
    fast = {"STOKER_RETRY_MS": "3000"}
    p = net.cli("put", "-", "/x4", input=b"no copy left", check=False, env=fast, timeout=120)
    assert p.returncode != 0 and p.stderr, (p.returncode, p.stderr)

    net.start("st1")  # the stalest copy, back first
    wait_for("st1 back, not serving", lambda: tables(net.status())[0][tid["st1"]][0]
             == "syncing")
    for name in ("/x3", "/x2"):
        p = net.cli("cat", name, check=False, env=fast, timeout=120)
        assert p.returncode != 0 or p.stdout == files[name], \
            "%s read back wrong from the stale copy" % name
    net.start("st3")  # the newest
    net.start("st2")

    def all_serving():
        t, c = tables(net.status())
        return (t, c) if all(s == "serving" for s, _ in t.values()) else None
    targets, chains = wait_for("every copy serving", all_serving, timeout=90)
    time.sleep(1)
    assert assert_replicas_identical(net, chains, targets) >= 3
    for name, data in files.items():
        assert net.cli("cat", name).stdout == data
    assert "newest copy is on target %d" % tid["st3"] in open(net.nodes["mgmtd"].log).read()


def test_accept_loss_serves_a_chain_whose_newest_copy_is_gone(tmp_path):
    """Every copy of a chain lost, the newest one for good: the chain waits for it
    (reads fail, never wrong) until `stoker admin accept-loss CHAIN --yes-lose-data`
    lets the stale copy back serve what it holds; a spare joins and copies it; the
    newest copy's node, back later, is wiped, never a member again. Refusals (a
    working chain, no member back, no such chain, no --yes-lose-data) are clear."""
    with net_cluster(tmp_path, mgmtd_args=MGMTD) as net:
        targets, chains = chain_of_three(net, nodes=4)
        (cid, (_, members, _)), = chains.items()
        tid = {targets[t][1].split(os.sep)[-2]: t for t in targets}
        node_of = {t: n for n, t in tid.items()}
        spare = [t for t in targets if t not in members][0]
        head, mid, tail = (node_of[t] for t in members)
        admin = ("admin", "accept-loss", str(cid), "--cluster", net.url)

        def state(n):
            return tables(net.status())[0][tid[n]][0]
        old = os.urandom(300_000)
        net.cli("put", "-", "/old", input=old)
        p = net.cli(*admin, "--yes-lose-data", check=False)
        assert p.returncode == 1 and b"has a working member" in p.stderr, p.stderr
        p = net.cli("admin", "accept-loss", "999", "--yes-lose-data", "--cluster", net.url,
                    check=False)
        assert p.returncode == 1 and b"has no chain 999" in p.stderr, p.stderr

        net.kill(tail)
        wait_for(tail + " offline", lambda: state(tail) == "offline")
        net.kill(mid)
        wait_for(mid + " offline", lambda: state(mid) == "offline")
        new = os.urandom(300_000)
        net.cli("put", "-", "/new", input=new)  # on the head alone: the newest copy
        net.kill(head)
        wait_for(head + " offline", lambda: state(head) == "offline")
        p = net.cli(*admin, "--yes-lose-data", check=False)
        assert p.returncode == 1 and b"no member of chain" in p.stderr, p.stderr

        net.start(tail)  # the stalest copy: it waits for the newest
        wait_for(tail + " back, waiting", lambda: state(tail) == "syncing")
        fast = {"STOKER_RETRY_MS": "2000"}
        p = net.cli("cat", "/old", check=False, env=fast, timeout=120)
        assert p.returncode != 0 or p.stdout == old
        p = net.cli(*admin, check=False)
        assert p.returncode == 2 and b"--yes-lose-data" in p.stderr, p.stderr
        p = net.cli(*admin, "--yes-lose-data")
        assert (b"target %d serves what it holds; 2 member(s)" % tid[tail]) in p.stdout, \
            p.stdout
        # the stale copy serves what it had; the spare copies it
        assert net.cli("cat", "/old").stdout == old
        targets, chains = serving_again(net, [tid[tail], spare], timeout=90)
        assert chains[cid][1] == [tid[tail], spare], chains
        assert assert_replicas_identical(net, chains, targets) >= 1
        # what only the lost copy held is gone: never the new bytes from nowhere
        got = net.cli("cat", "/new", check=False, env=fast, timeout=120).stdout
        assert got != new
        # the newest copy's node comes back: its target left the chain and is wiped
        net.start(head)
        wait_for(head + "'s stale copy wiped", lambda: state(head) == "serving", timeout=90)
        _, chains = tables(net.status())
        assert tid[head] not in chains[cid][1], chains
        assert not chunk_files(targets[tid[head]][1])
        assert "the loss is accepted" in open(net.nodes["mgmtd"].log).read()


def test_remove_node_replaces_an_offline_node_now(tmp_path):
    """`stoker admin remove-node ID`: an offline node's target is replaced in its
    chain at once (mgmtd's --replace-after is ten minutes); an online node or an
    unknown id is refused with a clear message."""
    with net_cluster(tmp_path, mgmtd_args=MGMTD) as net:
        targets, chains = chain_of_three(net, nodes=4)
        (cid, (_, members, _)), = chains.items()
        spare = [t for t in targets if t not in members][0]
        data = os.urandom(700_000)
        net.cli("put", "-", "/r", input=data)
        victim_t = members[0]
        node = [int(l.split()[1]) for l in net.status().splitlines()
                if l.split()[:1] == [str(victim_t)] and l.endswith(targets[victim_t][1])][0]
        victim = targets[victim_t][1].split(os.sep)[-2]

        p = net.cli("admin", "remove-node", str(node), "--cluster", net.url, check=False)
        assert p.returncode == 1 and b"is online: stop it first" in p.stderr, p.stderr
        p = net.cli("admin", "remove-node", "999", "--cluster", net.url, check=False)
        assert p.returncode == 1 and b"has no storage node 999" in p.stderr, p.stderr

        net.kill(victim)
        wait_for("the victim offline", lambda: tables(net.status())[0][victim_t][0]
                 == "offline")
        p = net.cli("admin", "remove-node", str(node), "--cluster", net.url)
        assert b"1 target(s) replaced" in p.stdout, p.stdout

        def replaced():
            t, c = tables(net.status())
            m = c[cid][1]
            return (t, c) if victim_t not in m and spare in m and all(
                t[x][0] == "serving" for x in m) else None
        targets, chains = wait_for("the spare serving in the chain", replaced, timeout=60)
        assert assert_replicas_identical(net, chains, targets) >= 1
        assert net.cli("cat", "/r").stdout == data
