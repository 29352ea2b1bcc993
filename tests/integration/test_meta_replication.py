"""Replicated metadata: `stoker up --nodes 3 --meta 3` runs three meta nodes, one
leading the shard and two following it (docs/meta-replication.md). What must hold:

- what clients make (folders, files, sizes, renames, removals, symlinks) is on every
  replica: each one in turn serves it after its leader is killed;
- the leader killed with SIGKILL in the middle of a stream of creates costs the
  client a pause, never an error, and every create that was acknowledged exists
  afterwards; a follower took its place (mgmtd promoted it, with a new epoch);
- the old leader, restarted, follows the new one and holds what it missed;
- a follower killed and restarted catches up with what it missed;
- `stoker status` shows each replica and its role, /metrics its role and position;
- hostile META_REPL requests are refused and change nothing; a hung leader is
  replaced, and when it wakes it is fenced and follows;
- through the FUSE mount, files made in a loop across a failover all reach meta;
- a file unlinked just before a failover has its chunks purged by the new leader
  (the purge table is replicated; only the leader sends removals), and `stoker
  fsck` finds nothing wrong afterwards;
- a client key confined to a subtree stays confined on the new leader, and
  storage's META_WITHIN reaches it.

Failover is made quick with a short heartbeat timeout. `stoker up` restarts a
killed daemon at once, so to keep a leader down long enough for mgmtd to replace
it, the test pauses the supervisor (SIGSTOP) around the kill.
"""
import json
import os
import re
import signal
import threading
import time
import urllib.request

import pytest

from conftest import CHECK, STOKER, pick_ports, run
from pyhelp import stoker as stoker_pkg

HB_MS = 2000
MiB = 1 << 20


def cmdlines():
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                yield int(pid), f.read().split(b"\0")
        except OSError:
            continue


class MetaCluster:
    def __init__(self, tmp_path):
        self.data = str(tmp_path / "stk")
        self.port = pick_ports()
        self.url = "stk://127.0.0.1:%d" % self.port
        self.metas = ["127.0.0.%d:%d" % (h, self.port + 1) for h in (2, 3, 4)]

    def env(self):
        return dict(os.environ, STOKER_CLUSTER=self.url,
                    STOKER_KEY_FILE=os.path.join(self.data, "cluster.key"))

    def up(self):
        p = run([STOKER, "up", "--data", self.data, "--daemon", "--port", str(self.port),
                 "--nodes", "3", "--meta", "3", "--targets", "1", "--mgmtd", "1",
                 "--heartbeat-timeout-ms", str(HB_MS)], check=False, timeout=120)
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

    def metrics(self, addr):
        host, port = addr.split(":")
        with urllib.request.urlopen("http://%s:%d/metrics" % (host, int(port) + 10),
                                    timeout=5) as r:
            text = r.read().decode()
        out = {}
        for name in ("stoker_meta_repl_role", "stoker_meta_repl_seq"):
            m = re.search(r"^%s (\S+)$" % name, text, re.M)
            out[name] = int(float(m.group(1))) if m else None
        return out

    def roles(self):
        """{meta address: (role, change)} from `stoker status`."""
        out = {}
        section = False
        for line in self.cli("status").stdout.decode().splitlines():
            if line.strip().startswith("NODE") and "ROLE" in line:
                section = True
                continue
            f = line.split()
            if section and len(f) >= 5 and f[0].isdigit():
                out[f[3]] = (f[1], int(f[4]))
            elif section and not line.startswith("    "):
                section = False
        return out

    def leader(self):
        r = self.roles()
        leaders = [a for a, (role, _) in r.items() if role == "leader"]
        assert len(leaders) == 1, r
        return leaders[0]

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

    def in_step(self):
        """Every replica in the shard, holding the same last change."""
        r = self.roles()
        roles = sorted(role for role, _ in r.values())
        seqs = {self.metrics(a)["stoker_meta_repl_seq"] for a in self.metas}
        return roles == ["follower", "follower", "leader"] and len(seqs) == 1

    def kill_leader(self):
        """SIGKILL the leader with the supervisor paused (no restart); returns
        (its address, a function that lets the supervisor restart it)."""
        lead = self.leader()
        sup = self.supervisor()
        os.kill(sup, signal.SIGSTOP)
        os.kill(self.meta_pid(lead), signal.SIGKILL)

        def resume():
            os.kill(sup, signal.SIGCONT)
        return lead, resume


@pytest.fixture
def mc(tmp_path):
    c = MetaCluster(tmp_path)
    c.up()
    yield c
    try:
        os.kill(c.supervisor(), signal.SIGCONT)
    except (AssertionError, OSError):
        pass
    c.down()
    bad = [line for line in c.logs().splitlines()
           if "ERROR: AddressSanitizer" in line or "runtime error:" in line or
           "ERROR: LeakSanitizer" in line]
    assert not bad, c.logs()


def tree(client, top="/"):
    """Everything a client sees under top: {path: (type, size, link target, xattrs)}."""
    out = {}
    for d, dirs, files in client.walk(top):
        for name in dirs + files:
            p = d.rstrip("/") + "/" + name
            st = client.stat(p)
            out[p] = (st.st_mode >> 12, st.st_size if name in files else 0)
    for p in list(out):
        if p.endswith(".lnk"):
            out[p] += (client.readlink(p),)
    return out


def test_every_replica_serves_the_same_namespace(mc):
    c = stoker_pkg.connect(mc.url)
    try:
        c.makedirs("/a/b/c")
        for i in range(30):
            c.write_file("/a/f%d" % i, b"x" * i)
        c.write_file("/a/b/c/deep", b"deep")
        c.symlink("b/c/deep", "/a/deep.lnk")
        c.remove("/a/f3")
        c.rename("/a/f4", "/a/b/moved")
        want = tree(c)
    finally:
        c.close()
    assert "/a/b/moved" in want and "/a/f3" not in want and len(want) == 34
    assert want["/a/deep.lnk"][-1] == "b/c/deep"
    mc.wait("replicas in step", mc.in_step)
    seen = set()
    for _ in range(2):
        old, resume = mc.kill_leader()
        seen.add(old)
        new = mc.wait("a new leader", lambda: next(
            (a for a, (r, _) in mc.roles().items() if r == "leader" and a != old), None))
        c = stoker_pkg.connect(mc.url)
        try:
            assert tree(c) == want  # all of it, from the promoted follower's store
        finally:
            c.close()
        resume()
        # the old leader, restarted by the supervisor, follows the new one
        mc.wait("the old leader following", lambda: mc.roles().get(old, ("",))[0] == "follower")
        mc.wait("replicas in step", mc.in_step)
        assert mc.metrics(old)["stoker_meta_repl_role"] == 2
        assert mc.metrics(new)["stoker_meta_repl_role"] == 1
    seen.add(mc.leader())
    assert len(seen) == 3  # each replica led once, and served everything


def creator(c, top, acked, errors, stop):
    """A thread (not started) writing top/f00000, f00001, ... through client c until
    stop is set: each acknowledged path appended to acked, each error to errors."""
    def run():
        i = 0
        while not stop.is_set():
            p = "%s/f%05d" % (top, i)
            try:
                c.write_file(p, b"%d" % i)
                acked.append(p)
            except OSError as e:
                errors.append((p, e))
            i += 1
    return threading.Thread(target=run)


def test_leader_killed_during_creates(mc):
    c = stoker_pkg.connect(mc.url)
    c.makedirs("/stream")
    acked, errors, stop = [], [], threading.Event()
    t = creator(c, "/stream", acked, errors, stop)
    held = c.open("/held", "wb")  # open across the failover: its session moves with it
    held.write(b"before ")
    t.start()
    try:
        mc.wait("some creates", lambda: len(acked) > 50)
        before = len(acked)
        old, resume = mc.kill_leader()
        t0 = time.time()
        mc.wait("creates after the failover", lambda: len(acked) > before + 50, timeout=60)
        pause = time.time() - t0
    finally:
        stop.set()
        t.join(timeout=120)
    assert not errors, errors[:5]
    held.write(b"after")
    held.close()
    assert c.read_file("/held") == b"before after"
    names = set(c.listdir("/stream"))
    missing = [p for p in acked if p.rsplit("/", 1)[1] not in names]
    assert not missing, missing[:10]
    for p in acked[-20:]:
        assert c.read_file(p) == p.rsplit("f", 1)[1].lstrip("0").encode() or \
            c.read_file(p) == b"0"
    c.close()
    assert pause < 60
    # the old leader comes back as a follower and catches up
    resume()
    mc.wait("the old leader following", lambda: mc.roles().get(old, ("",))[0] == "follower")
    mc.wait("replicas in step", mc.in_step)


def test_follower_killed_catches_up(mc):
    lead = mc.leader()
    fol = [a for a, (r, _) in mc.roles().items() if r == "follower"][0]
    c = stoker_pkg.connect(mc.url)
    try:
        c.makedirs("/f")
        sup = mc.supervisor()
        os.kill(sup, signal.SIGSTOP)
        try:
            os.kill(mc.meta_pid(fol), signal.SIGKILL)
            # the leader waits for the dead follower until mgmtd drops it, then goes on
            for i in range(20):
                c.write_file("/f/while-down-%d" % i, b"y")
            mc.wait("the follower dropped", lambda: mc.roles().get(fol, ("",))[0] != "follower")
            for i in range(20, 40):
                c.write_file("/f/while-down-%d" % i, b"y")
        finally:
            os.kill(sup, signal.SIGCONT)
        mc.wait("the follower back", lambda: mc.roles().get(fol, ("",))[0] == "follower")
        mc.wait("replicas in step", mc.in_step)
        assert mc.leader() == lead
        want = tree(c)
    finally:
        c.close()
    # what it missed is on it: it serves all of it once it leads
    old, resume = mc.kill_leader()
    mc.wait("a new leader", lambda: mc.leader() != old)
    c = stoker_pkg.connect(mc.url)
    try:
        assert tree(c) == want
    finally:
        c.close()
    resume()


def test_status_and_bad_options(mc, tmp_path):
    out = mc.cli("status").stdout.decode()
    assert "replicas 3" in out
    r = mc.roles()
    assert sorted(role for role, _ in r.values()) == ["follower", "follower", "leader"]
    assert set(r) == set(mc.metas)
    # bad input: a clear error, no cluster started
    p = run([STOKER, "up", "--data", str(tmp_path / "bad"), "--nodes", "2", "--meta", "3"],
            check=False)
    assert p.returncode != 0 and b"--meta 3 needs at least 3 nodes" in p.stderr
    p = run([STOKER, "up", "--data", str(tmp_path / "bad"), "--meta", "0"], check=False)
    assert p.returncode != 0 and b"--meta must be" in p.stderr
    p = run([STOKER, "mgmtd", "--data", str(tmp_path / "bad"), "--meta-replicas", "9"],
            check=False)
    assert p.returncode != 0 and b"bad --meta-replicas" in p.stderr


def test_hostile_repl_requests(mc):
    """META_REPL that no leader of the current epoch sent is refused by a follower
    (malformed, a stale epoch, another leader, an epoch the routing table does not
    know), clients get NOT_LEADER from it, and replication goes on untouched."""
    out = mc.cli("status").stdout.decode()
    epoch = re.search(r"replicas 3, epoch (\d+)", out).group(1)
    fol = [a for a, (r, _) in mc.roles().items() if r == "follower"][0]
    p = run([CHECK, "repl", fol, epoch], check=False, env=mc.env())
    assert p.returncode == 0, p.stdout.decode() + p.stderr.decode()
    c = stoker_pkg.connect(mc.url)
    try:
        c.write_file("/after-hostile", b"ok")
    finally:
        c.close()
    mc.wait("replicas in step", mc.in_step)
    old, resume = mc.kill_leader()
    mc.wait("a new leader", lambda: mc.leader() != old)
    c = stoker_pkg.connect(mc.url)
    try:
        assert c.read_file("/after-hostile") == b"ok"
    finally:
        c.close()
    resume()


def test_mount_carries_on_through_failover(mc, tmp_path, monkeypatch):
    """Through the FUSE mount: files made in a loop while the meta leader is killed;
    no call fails, and every file whose close returned is there afterwards, through
    the mount and through a client of its own (so meta has it, not only the mount's
    write-behind)."""
    from conftest import Mount, have_fuse
    if not have_fuse():
        pytest.skip("needs root, /dev/fuse and fusermount3")
    monkeypatch.setenv("STOKER_KEY_FILE", os.path.join(mc.data, "cluster.key"))
    m = Mount(mc, tmp_path / "mnt")
    m.start()
    try:
        top = os.path.join(m.path, "loop")
        os.mkdir(top)
        made, errors, stop = [], [], threading.Event()

        def loop():
            i = 0
            while not stop.is_set():
                p = os.path.join(top, "f%05d" % i)
                try:
                    with open(p, "wb") as f:
                        f.write(b"%d" % i)
                    made.append("f%05d" % i)
                except OSError as e:
                    errors.append((p, e))
                i += 1

        t = threading.Thread(target=loop)
        t.start()
        try:
            mc.wait("some files", lambda: len(made) > 30)
            before = len(made)
            old, resume = mc.kill_leader()
            mc.wait("files after the failover", lambda: len(made) > before + 30, timeout=90)
        finally:
            stop.set()
            t.join(timeout=120)
        resume()
        assert not errors, errors[:5]
        assert set(made) <= set(os.listdir(top))
        os.sync()
    finally:
        m.stop()
    c = stoker_pkg.connect(mc.url)
    try:
        mc.wait("the mount's names at meta", lambda: set(made) <= set(c.listdir("/loop")),
                timeout=30)
    finally:
        c.close()


def test_hung_leader_is_fenced(mc):
    """A leader that hangs (SIGSTOP) is replaced; when it wakes it serves no client
    and takes no change (NOT_LEADER, a stale epoch refused), follows the new leader
    and catches up, and nothing acknowledged meanwhile is lost."""
    c = stoker_pkg.connect(mc.url)
    try:
        c.makedirs("/h")
        mc.wait("replicas in step", mc.in_step)
        lead = mc.leader()
        pid = mc.meta_pid(lead)
        os.kill(pid, signal.SIGSTOP)
        try:
            for i in range(20):  # the first waits out the failover
                c.write_file("/h/f%d" % i, b"%d" % i)
            assert mc.leader() != lead
        finally:
            os.kill(pid, signal.SIGCONT)
        mc.wait("the old leader following", lambda: mc.roles().get(lead, ("",))[0] == "follower")
        out = mc.cli("status").stdout.decode()
        epoch = re.search(r"replicas 3, epoch (\d+)", out).group(1)
        p = run([CHECK, "repl", lead, epoch], check=False, env=mc.env())
        assert p.returncode == 0, p.stdout.decode() + p.stderr.decode()
        mc.wait("replicas in step", mc.in_step)
        assert sorted(c.listdir("/h")) == sorted("f%d" % i for i in range(20))
    finally:
        c.close()


def chunk_files(mc):
    out = []
    for dirpath, _, files in os.walk(os.path.join(mc.data, "targets")):
        if os.sep + "chunks" in dirpath:
            out += [os.path.join(dirpath, f) for f in files if ".tmp" not in f]
    return out


def metric(addr, name):
    host, port = addr.split(":")
    with urllib.request.urlopen("http://%s:%d/metrics" % (host, int(port) + 10),
                                timeout=5) as r:
        m = re.search(r"^%s (\S+)$" % name, r.read().decode(), re.M)
    return int(float(m.group(1))) if m else None


def storage_pids(mc):
    return [pid for pid, argv in cmdlines()
            if len(argv) > 3 and argv[1] == b"storage" and mc.data.encode() in b" ".join(argv)]


def fsck_clean(mc):
    p = mc.cli("fsck", "--json", check=False)
    assert p.returncode in (0, 1), p.stderr.decode(errors="replace")
    out = json.loads(p.stdout)
    return out if out["clean"] else None


def test_unlinked_before_failover_is_purged_by_the_new_leader(mc):
    """The unlink's purge record is on every follower before its reply (the purge
    table is replicated like any table); the leader is killed before its purger can
    have storage remove the chunks (storage paused), and the new leader drains the
    table: the chunks go, the record goes on every replica, and fsck is clean."""
    c = stoker_pkg.connect(mc.url)
    try:
        keep = os.urandom(MiB + 3)
        c.write_file("/keep", keep)
        kept = len(chunk_files(mc))
        c.write_file("/gone", os.urandom(6 * MiB))
        assert len(chunk_files(mc)) > kept
        mc.wait("replicas in step", mc.in_step)
        sup = mc.supervisor()
        os.kill(sup, signal.SIGSTOP)
        stopped = storage_pids(mc)
        assert stopped
        lead = mc.leader()
        try:
            for pid in stopped:
                os.kill(pid, signal.SIGSTOP)
            # meta alone: the record is on the followers once this returns
            c.unlink("/gone")
            os.kill(mc.meta_pid(lead), signal.SIGKILL)
        finally:
            for pid in stopped:
                os.kill(pid, signal.SIGCONT)
        new = mc.wait("a new leader", lambda: next(
            (a for a, (r, _) in mc.roles().items() if r == "leader" and a != lead), None))
        mc.wait("the new leader to purge /gone", lambda: len(chunk_files(mc)) == kept,
                timeout=60)
        mc.wait("the purge table empty on the new leader",
                lambda: metric(new, "stoker_meta_purge_queue") == 0)
        assert metric(new, "stoker_meta_purged_files_total") >= 1
        os.kill(sup, signal.SIGCONT)
        mc.wait("the old leader following", lambda: mc.roles().get(lead, ("",))[0] == "follower")
        mc.wait("replicas in step", mc.in_step)
        # the record's removal reached every replica; a follower sends nothing
        for a in mc.metas:
            assert metric(a, "stoker_meta_purge_queue") == 0, a
            if a != new:
                assert metric(a, "stoker_meta_purged_files_total") == 0, a
        assert c.read_file("/keep") == keep
    finally:
        c.close()
    out = mc.wait("a clean fsck after the failover", lambda: fsck_clean(mc), timeout=60)
    assert out["list"] == [] and out["namespace"]["files"] >= 1


def as_client(mc, key, *args):
    env = dict(os.environ, STOKER_CLUSTER=mc.url, STOKER_KEY_FILE=key)
    return run([STOKER] + list(args), check=False, env=env, timeout=120)


def ino_op(mc, key, *args):
    env = dict(os.environ, STOKER_CLUSTER=mc.url, STOKER_KEY_FILE=key)
    p = run([CHECK, "ino", mc.url] + [str(a) for a in args], env=env, check=False)
    return p.stdout.decode().strip().splitlines()[-1]


def test_client_key_stays_confined_after_failover(mc, tmp_path):
    """A subtree client key against a replicated meta: confined by the leader before
    and by the promoted follower after (its policy is not meta's state but the
    key's, its folder records are replicated); a file it writes after the failover
    is read back through storage, whose META_WITHIN finds the new leader."""
    src = tmp_path / "hello.txt"
    src.write_bytes(b"hello\n")
    mc.cli("mkdir", "/teamA", "/teamB")
    mc.cli("put", str(src), "/teamA/a.txt")
    mc.cli("put", str(src), "/teamB/b.txt")
    key = str(tmp_path / "alice.key")
    p = mc.cli("admin", "client", "add", "alice", "--subtree", "/teamA", "--key-out", key)
    assert b"added" in p.stdout, p.stdout

    def confined():
        p = as_client(mc, key, "ls", "/")
        assert p.returncode == 0, p.stderr
        assert sorted(p.stdout.decode().split()) == sorted(["a.txt"] + made)
        assert as_client(mc, key, "cat", "/a.txt").stdout == b"hello\n"
        for path in ("/../teamB/b.txt", "/teamB/b.txt"):
            p = as_client(mc, key, "cat", path)
            assert p.returncode != 0 and b"No such file" in p.stderr, (path, p.stderr)

    made = []
    confined()
    mc.wait("replicas in step", mc.in_step)
    old, resume = mc.kill_leader()
    try:
        mc.wait("a new leader", lambda: next(
            (a for a, (r, _) in mc.roles().items() if r == "leader" and a != old), None))
        confined()
        env = dict(os.environ, STOKER_CLUSTER=mc.url, STOKER_KEY_FILE=mc.env()["STOKER_KEY_FILE"])
        out = run([CHECK, "ino", mc.url, "lookup", "1", "teamB"], env=env).stdout.decode()
        team_b = int(out.split()[1])
        assert ino_op(mc, key, "getattr", team_b) == "EACCES"
        assert ino_op(mc, key, "readdir", team_b) == "EACCES"
        # written and read back through storage after the failover
        src.write_bytes(b"after the failover\n")
        p = as_client(mc, key, "put", str(src), "/after.txt")
        assert p.returncode == 0, p.stderr
        made.append("after.txt")
        assert as_client(mc, key, "cat", "/after.txt").stdout == b"after the failover\n"
        confined()
    finally:
        resume()
    mc.wait("the old leader following", lambda: mc.roles().get(old, ("",))[0] == "follower")
