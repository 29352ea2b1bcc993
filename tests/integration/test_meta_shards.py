"""Metadata shards (docs/meta-shards.md): mgmtd's shard map, first step.

`stoker up --meta-shards S` runs S metadata shards, each its own replicated group
(--meta M copies each), and mgmtd keeps one map of them in the routing table.
What must hold:

- `stoker status` shows every shard with its own namespace, leader and followers;
  each meta node follows only a shard it registered for (never another shard's
  leader, which would copy that shard's store over its own);
- losing a shard's leader promotes that shard's follower and leaves the other
  shards alone (same leader, same epoch), and clients keep working;
- a meta node for a shard the cluster does not have is refused and exits with a
  clear error (and `stoker status` says so); a store made for one shard refuses to
  serve another; bad --shard / --meta-shards values are refused; a shard's meta
  node serves requests on its own inodes and answers NOT_LEADER to those on
  another shard's (so that a client asks its routing table again); a rename or
  hard link between two shards is the shard's of the folder it names first
  (test_meta_xshard.py).

Clients send each request to the shard of the inode it names (the folder for a
name's requests); shard 1 holds the root, so with nothing placed elsewhere the
namespace works as before: the mount's POSIX suite runs against a two-shard
cluster with STOKER_TEST_META_SHARDS=2 (conftest.py).
"""
import os
import re
import signal
import threading
import time
import urllib.request

import pytest

from conftest import CHECK, STOKER, pick_ports, run
from pyhelp import stoker as stoker_pkg
from test_meta_replication import cmdlines

HB_MS = 2000


class ShardCluster:
    def __init__(self, tmp_path, nodes, meta, shards):
        self.data = str(tmp_path / "stk")
        self.port = pick_ports()
        self.url = "stk://127.0.0.1:%d" % self.port
        self.nodes, self.meta, self.shards = nodes, meta, shards

    def env(self):
        return dict(os.environ, STOKER_CLUSTER=self.url,
                    STOKER_KEY_FILE=os.path.join(self.data, "cluster.key"))

    def up(self):
        args = [STOKER, "up", "--data", self.data, "--daemon", "--port", str(self.port),
                "--targets", "1", "--meta-shards", str(self.shards),
                "--heartbeat-timeout-ms", str(HB_MS)]
        if self.nodes > 1:
            args += ["--nodes", str(self.nodes), "--meta", str(self.meta), "--mgmtd", "1"]
        p = run(args, check=False, timeout=120)
        assert p.returncode == 0, p.stderr.decode() + self.logs()

    def down(self):
        run([STOKER, "down", "--data", self.data], check=False, timeout=150)

    def logs(self):
        out = []
        logdir = os.path.join(self.data, "log")
        if os.path.isdir(logdir):
            for name in sorted(os.listdir(logdir)):
                with open(os.path.join(logdir, name), errors="replace") as f:
                    out.append("--- %s ---\n%s" % (name, f.read()[-4000:]))
        return "\n".join(out)

    def cli(self, *args, check=True):
        return run([STOKER] + list(args), check=check, env=self.env(), timeout=120)

    def supervisor(self):
        for pid, argv in cmdlines():
            if len(argv) > 3 and argv[1] == b"up" and self.data.encode() in argv:
                return pid
        raise AssertionError("no stoker up for " + self.data)

    def meta_pid(self, addr):
        for pid, argv in cmdlines():
            if len(argv) > 3 and argv[1] == b"meta" and addr.encode() in argv and \
                    self.data.encode() in b" ".join(argv):
                return pid
        return None

    def shard_map(self):
        """{shard: {"node", "ns", "epoch", "roles": {addr: role}}} from `stoker status`."""
        out, cur, section = {}, None, False
        for line in self.cli("status").stdout.decode().splitlines():
            if line.startswith("Metadata shards"):
                section = True
                continue
            if not section:
                continue
            m = re.match(r"^  (\d+)\s+(\d+|none)\s+namespace (\S+)", line)
            if m:
                cur = out[int(m.group(1))] = {"node": m.group(2), "ns": m.group(3),
                                              "epoch": 0, "roles": {}}
                continue
            m = re.match(r"^    replicas \d+, epoch (\d+)", line)
            if m and cur is not None:
                cur["epoch"] = int(m.group(1))
                continue
            f = line.split()
            if cur is not None and line.startswith("    ") and len(f) >= 4 and f[0].isdigit():
                cur["roles"][f[3]] = f[1]
            elif line and not line.startswith(" "):
                section = False
        return out

    def wait(self, what, fn, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                v = fn()
            except (AssertionError, OSError):
                v = None
            if v:
                return v
            time.sleep(0.3)
        raise AssertionError("timed out waiting for %s\n%s" % (what, self.logs()))


@pytest.fixture
def make_sc(tmp_path):
    made = []

    def make(nodes=1, meta=1, shards=2):
        c = ShardCluster(tmp_path, nodes, meta, shards)
        made.append(c)
        c.up()
        return c

    yield make
    for c in made:
        try:
            os.kill(c.supervisor(), signal.SIGCONT)
        except (AssertionError, OSError):
            pass
        c.down()
        bad = [line for line in c.logs().splitlines()
               if "ERROR: AddressSanitizer" in line or "runtime error:" in line or
               "ERROR: LeakSanitizer" in line]
        assert not bad, c.logs()


def leader_of(sh):
    leaders = [a for a, role in sh["roles"].items() if role == "leader"]
    assert len(leaders) == 1, sh
    return leaders[0]


def test_each_shard_is_its_own_replicated_group(make_sc):
    sc = make_sc(nodes=2, meta=2, shards=2)
    one = "127.0.0.%d:" + str(sc.port + 1)
    two = "127.0.0.%d:" + str(sc.port + 40)
    m = sc.wait("two shards of two replicas each", lambda: (
        lambda s: s if len(s) == 2 and all(len(v["roles"]) == 2 for v in s.values()) else None)(
            sc.shard_map()))
    assert set(m) == {1, 2}
    assert m[1]["ns"] != m[2]["ns"], m
    # each shard's replicas are its own meta nodes: shard 1's on BASE+1, shard 2's on BASE+40
    assert set(m[1]["roles"]) == {one % 2, one % 3}, m
    assert set(m[2]["roles"]) == {two % 2, two % 3}, m
    for sh in m.values():
        assert sorted(sh["roles"].values()) == ["follower", "leader"], m
    # every follower holds its leader's copy (only such a follower may be promoted)
    for logs in (("meta", "meta1"), ("meta2", "meta3")):
        sc.wait("%s: the follower copied" % (logs,), lambda: any(
            "has the copy" in open(os.path.join(sc.data, "log", n + ".log")).read()
            for n in logs))
    # shard 2's stores were made for shard 2
    assert os.path.isdir(os.path.join(sc.data, "meta2")) and \
        os.path.isdir(os.path.join(sc.data, "meta3"))

    c = stoker_pkg.connect(sc.url)
    try:
        c.makedirs("/a/b")
        for i in range(20):
            c.write_file("/a/b/f%d" % i, b"x" * (i + 1))

        # shard 2 loses its leader (the supervisor held, so that it stays down)
        lead2, lead1, epoch1 = leader_of(m[2]), leader_of(m[1]), m[1]["epoch"]
        sup = sc.supervisor()
        os.kill(sup, signal.SIGSTOP)
        try:
            os.kill(sc.meta_pid(lead2), signal.SIGKILL)
            after = sc.wait("shard 2's follower promoted", lambda: (
                lambda s: s if s[2]["roles"].get(lead2) != "leader" and
                "leader" in s[2]["roles"].values() else None)(sc.shard_map()),
                timeout=HB_MS / 1000 * 6)
            assert leader_of(after[2]) != lead2 and after[2]["epoch"] > m[2]["epoch"], after
            # shard 1 untouched: same leader, same epoch, and its clients go on
            assert leader_of(after[1]) == lead1 and after[1]["epoch"] == epoch1, after
            for i in range(20):
                assert c.read_file("/a/b/f%d" % i) == b"x" * (i + 1)
            c.write_file("/a/b/during", b"during")
        finally:
            os.kill(sup, signal.SIGCONT)
        # the old leader, restarted by the supervisor, follows shard 2 again
        sc.wait("the old leader back as shard 2's follower",
                lambda: sc.shard_map()[2]["roles"].get(lead2) == "follower")
        final = sc.shard_map()
        assert final[1]["roles"] == m[1]["roles"] and final[1]["epoch"] == epoch1, final
        assert c.read_file("/a/b/during") == b"during"
        assert sorted(c.listdir("/a/b")) == sorted(["f%d" % i for i in range(20)] + ["during"])
    finally:
        c.close()


def test_wrong_shard_is_refused_with_a_clear_error(make_sc, tmp_path):
    sc = make_sc(shards=2)
    m = sc.wait("two shards", lambda: (lambda s: s if len(s) == 2 else None)(sc.shard_map()))
    assert m[1]["node"] != "none" and m[2]["node"] != "none", m
    key = os.path.join(sc.data, "cluster.key")
    mgmtd = "127.0.0.1:%d" % sc.port
    store = str(tmp_path / "m3")

    # a meta node for shard 3 of a two-shard cluster: refused, it exits
    port = pick_ports()
    p = run([STOKER, "meta", "--listen", "127.0.0.1:%d" % port, "--mgmtd", mgmtd,
             "--data", store, "--shard", "3", "--key-file", key], check=False, timeout=60)
    err = p.stderr.decode() + p.stdout.decode()
    assert p.returncode != 0 and "refused" in err and "shard 3" in err, err
    out = sc.cli("status").stdout.decode()
    assert re.search(r"refused for shard 3: the cluster has no such shard", out), out
    assert sc.shard_map() == m  # the map did not change
    p = sc.cli("doctor", "--cluster", sc.url, "--quick", check=False)
    assert re.search(r"meta node \d+ \(127\.0\.0\.1:%d\) was refused for shard 3" % port,
                     p.stdout.decode()), p.stdout.decode()

    # its store was made for shard 3: it never serves shard 2
    p = run([STOKER, "meta", "--listen", "127.0.0.1:%d" % port, "--mgmtd", mgmtd,
             "--data", store, "--shard", "2", "--key-file", key], check=False, timeout=60)
    err = p.stderr.decode() + p.stdout.decode()
    assert p.returncode != 0 and "holds metadata shard 3, not shard 2" in err, err
    assert sc.shard_map() == m

    # bad values
    for bad in ("0", "17", "x", "-1"):
        p = run([STOKER, "meta", "--listen", "127.0.0.1:%d" % port, "--mgmtd", mgmtd,
                 "--data", store, "--shard", bad, "--key-file", key], check=False, timeout=30)
        assert p.returncode == 2 and b"bad --shard" in p.stderr, (bad, p.stderr)
        p = run([STOKER, "mgmtd", "--listen", "127.0.0.1:%d" % port, "--data", store,
                 "--meta-shards", bad, "--auth", "off"], check=False, timeout=30)
        assert p.returncode == 2 and b"bad --meta-shards" in p.stderr, (bad, p.stderr)
    p = run([STOKER, "up", "--data", str(tmp_path / "x"), "--meta-shards", "5"],
            check=False, timeout=30)
    assert p.returncode != 0 and b"--meta-shards must be 1..4" in p.stderr, p.stderr


def test_one_shard_keeps_todays_numbers(make_sc):
    """Shard 1 holds the root and hands out today's inode numbers (no shard bits);
    shard 2's meta node serves its own inode numbers, answers NOT_LEADER for shard
    1's, and takes a rename from its folder into shard 1's and a hard link into its
    folder as its own (stk_check shardgate)."""
    sc = make_sc(shards=2)
    p = run([CHECK, "shardgate", "127.0.0.1:%d" % (sc.port + 40)], check=False, env=sc.env())
    # its metrics where every daemon's are, 10 ports up (stoker top, doctor, dashboard)
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % (sc.port + 50), timeout=5) as r:
        assert b"stoker_meta_repl_role" in r.read()
    assert p.returncode == 0 and b"shardgate: ok" in p.stdout, p.stdout + p.stderr
    # the native client sends each request to the shard its inode names
    p = run([CHECK, "shardroute", sc.url], check=False, env=sc.env(), timeout=60)
    assert p.returncode == 0 and b"shardroute: ok" in p.stdout, p.stdout + p.stderr
    c = stoker_pkg.connect(sc.url)
    try:
        c.makedirs("/d")
        c.write_file("/d/f", b"abc")
        assert c.stat("/d/f").st_ino >> 48 == 0
        assert c.stat("/d").st_ino >> 48 == 0
        assert c.read_file("/d/f") == b"abc"
    finally:
        c.close()


def shard_loads(sc):
    """{shard: (requests a second, inodes)} from the load lines of `stoker status`."""
    out, cur, section = {}, None, False
    for line in sc.cli("status").stdout.decode().splitlines():
        if line.startswith("Metadata shards"):
            section = True
        elif section and re.match(r"^  (\d+)\s", line):
            cur = int(line.split()[0])
        elif section and cur is not None and line.startswith("    load:"):
            m = re.match(r"^    load: ([\d.]+) requests/s, (\d+) inodes?$", line)
            assert m, line
            out[cur] = (float(m.group(1)), int(m.group(2)))
        elif section and line and not line.startswith(" "):
            section = False
    return out


def test_status_shows_each_shards_load(make_sc):
    """Under "Metadata shards", `stoker status` gives each shard's load, read from its
    leader's /metrics: requests a second and the inodes its store holds. Files
    written into a folder of shard 2 move shard 2's figures and leave shard 1's
    inodes where they were (shard 1 still answers the lookups of the folder's name
    in the root)."""
    sc = make_sc(shards=2)
    sc.wait("two shards", lambda: (lambda s: s if len(s) == 2 else None)(sc.shard_map()))
    idle = sc.wait("both shards' load", lambda: (
        lambda s: s if set(s) == {1, 2} else None)(shard_loads(sc)))
    sc.cli("shard", "pin", "/", "2")
    c = stoker_pkg.connect(sc.url)
    written, stop, failed = [0], threading.Event(), []

    def writer():
        try:
            while not stop.is_set():
                c.write_file("/w/f%d" % written[0], b"x")
                written[0] += 1
        except Exception as e:  # reported by the test below
            failed.append(e)

    try:
        c.makedirs("/w")
        assert c.stat("/w").st_ino >> 48 == 1  # on shard 2
        t = threading.Thread(target=writer)
        t.start()
        try:
            sc.wait("files written", lambda: written[0] >= 50)
            busy = shard_loads(sc)
        finally:
            stop.set()
            t.join(60)
        assert not failed, failed
        # shard 2 is busy and growing; shard 1 gained no inode
        assert busy[2][0] > busy[1][0] and busy[2][0] >= 5, (idle, busy)
        assert busy[2][1] >= idle[2][1] + 50 and busy[1][1] == idle[1][1], (idle, busy)
        # once the writer stopped: every file counted, on shard 2 alone
        after = shard_loads(sc)
        assert after[2][1] == idle[2][1] + 1 + written[0], (idle, after, written)
        assert after[1][1] == idle[1][1], (idle, after)
        assert after[2][0] < busy[2][0], (busy, after)
    finally:
        c.close()
