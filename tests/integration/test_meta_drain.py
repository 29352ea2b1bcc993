"""A meta node added to a running cluster takes a shard's place from another,
online (docs/meta-replication.md, "Moving a shard to another meta node").

`stoker up --nodes 3 --meta 3` runs shard 1 on three meta nodes (a leader and two
followers); a fourth meta node started by hand on the same cluster waits as a
spare. What must hold:

- the leader keeps the spare in step as a learner (its store copied, at most
  64 MiB/s, the log sent after, no reply waiting for it);
- `stoker admin drain-node LEADER`, under a stream of creates: the spare follows
  first, its store learned (no copy while the replies wait), then the
  leadership passes to a follower that stays and the old leader holds no copy;
  the client sees no error and every acknowledged create is there;
- a follower drained with no spare free keeps its place (the shard never has
  fewer copies than its replica count), and leaves once a node takes it (here the
  old leader, undrained);
- `stoker status` says which node drains or is drained; a node the cluster does
  not have is refused with a clear error.
"""
import os
import re
import signal
import subprocess
import threading

from conftest import STOKER
from pyhelp import stoker as stoker_pkg
from test_meta_replication import cmdlines, creator, mc, tree  # noqa: F401 (mc: a fixture)


def node_ids(mc):
    """{meta address: node id} from `stoker status`'s shard replicas."""
    out, section = {}, False
    for line in mc.cli("status").stdout.decode().splitlines():
        if line.strip().startswith("NODE") and "ROLE" in line:
            section = True
            continue
        f = line.split()
        if section and len(f) >= 5 and f[0].isdigit():
            out[f[3]] = int(f[0])
        elif section and not line.startswith("    "):
            section = False
    return out


def start_extra_meta(mc, addr, tmp_path):
    """A meta node of the cluster started by hand, as an operator adds one: the
    arguments of one `stoker up` started, with its own address and data folder."""
    for _, argv in cmdlines():
        if len(argv) > 3 and argv[1] == b"meta" and mc.data.encode() in b" ".join(argv):
            args = [a.decode() for a in argv if a]
            break
    else:
        raise AssertionError("no meta process of the cluster")
    host, port = addr.split(":")
    data = str(tmp_path / "meta-extra")
    os.makedirs(data)

    def swap(opt, value):
        i = args.index(opt)
        args[i + 1] = value
    swap("--listen", addr)
    swap("--data", data)
    if "--metrics" in args:
        swap("--metrics", "%s:%d" % (host, int(port) + 10))
    if "--host-id" in args:
        swap("--host-id", "extra-meta")
    log = open(str(tmp_path / "meta-extra.log"), "wb")
    return subprocess.Popen([STOKER] + args[1:], stdout=log, stderr=subprocess.STDOUT), log


def full_logs(mc, tmp_path):
    """Every line the cluster's daemons and the extra meta node logged."""
    out = []
    for d in (os.path.join(mc.data, "log"), str(tmp_path)):
        for name in sorted(os.listdir(d)):
            if name.endswith(".log"):
                with open(os.path.join(d, name), errors="replace") as f:
                    out.append(f.read())
    return "\n".join(out)


def test_a_meta_node_added_takes_the_leaders_place(mc, tmp_path):
    extra = "127.0.0.5:%d" % (mc.port + 1)
    proc, log = start_extra_meta(mc, extra, tmp_path)
    c = stoker_pkg.connect(mc.url)
    try:
        mc.wait("the new meta node a spare", lambda: mc.roles().get(extra, ("",))[0] == "spare")
        c.makedirs("/before")
        for i in range(50):
            c.write_file("/before/f%d" % i, b"%d" % i)
        ids = node_ids(mc)
        lead = mc.leader()
        p = mc.cli("admin", "drain-node", "999", check=False)
        assert p.returncode == 1 and b"no storage or meta node 999" in p.stderr, p.stderr
        learns = "copying the store to meta node %d (%s) as of change" % (ids[extra], extra)
        mc.wait("the spare to learn the shard",
                lambda: [l for l in full_logs(mc, tmp_path).splitlines() if learns in l])
        copies = [l for l in full_logs(mc, tmp_path).splitlines() if learns in l]
        assert all("a spare that learns the shard" in l for l in copies), copies

        acked, errors, stop = [], [], threading.Event()
        c.makedirs("/stream")
        t = creator(c, "/stream", acked, errors, stop)
        t.start()
        try:
            mc.wait("some creates", lambda: len(acked) > 30)
            p = mc.cli("admin", "drain-node", str(ids[lead]))
            assert b"draining" in p.stdout, p.stdout
            roles = mc.wait("the old leader drained", lambda: (lambda r: r if r[lead][0] == "spare"
                            and sorted(x for x, _ in r.values()) ==
                            ["follower", "follower", "leader", "spare"] else None)(mc.roles()),
                            timeout=90)
            assert roles[extra][0] in ("leader", "follower"), roles
            n = len(acked)
            mc.wait("creates after the handover", lambda: len(acked) > n + 30)
        finally:
            stop.set()
            t.join(timeout=120)
        assert not errors, errors[:5]
        names = set(c.listdir("/stream"))
        missing = [p for p in acked if p.rsplit("/", 1)[1] not in names]
        assert not missing, missing[:10]
        assert sorted(c.listdir("/before")) == sorted("f%d" % i for i in range(50))
        st = mc.cli("status").stdout.decode()
        assert "drained: holds no copy, may be stopped" in st, st
        logs = mc.logs()
        assert "drained: meta node" in logs and "leads shard 1 now" in logs, logs[-3000:]
        # it joined with its store learned: no copy of the store for it since
        logs = full_logs(mc, tmp_path)
        assert "meta node %d (%s) follows shard 1" % (ids[extra], extra) in logs
        assert re.search(r"meta node %d \(%s\) follows shard 1 \(epoch \d+\), its store "
                         r"learned" % (ids[extra], re.escape(extra)), logs), logs[-3000:]
        copies = [l for l in logs.splitlines() if learns in l]
        assert all("a spare that learns the shard" in l for l in copies), copies

        # a follower drains with no spare free: it keeps its place
        fol = [a for a, (r, _) in mc.roles().items() if r == "follower" and a != extra][0]
        p = mc.cli("admin", "drain-node", str(ids[fol]))
        assert b"draining" in p.stdout, p.stdout
        mc.wait("the follower draining", lambda: "draining: leaves once others hold the shard"
                in mc.cli("status").stdout.decode())
        c.write_file("/while-draining", b"x")
        assert mc.roles()[fol][0] == "follower"
        # the old leader undrained takes its place; then the follower leaves
        p = mc.cli("admin", "undrain-node", str(ids[lead]))
        assert b"no longer draining" in p.stdout, p.stdout
        mc.wait("the follower drained", lambda: (lambda r: r[fol][0] == "spare" and
                r[lead][0] == "follower")(mc.roles()), timeout=90)
        want = tree(c)
        c.close()
        # what the shard's replicas hold now is the whole namespace: the leader
        # killed, a follower that took part in the moves serves it all
        old = mc.leader()
        if old == extra:
            proc.kill()
            resume = None
        else:
            old, resume = mc.kill_leader()
        mc.wait("a new leader", lambda: mc.leader() != old)
        c = stoker_pkg.connect(mc.url)
        assert tree(c) == want
        if resume:
            resume()
    finally:
        c.close()
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
