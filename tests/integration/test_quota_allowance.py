"""Creates a mount answers itself under a quota (docs/quotas.md, "Creates a mount
answers itself"): meta sets an inode allowance aside in the quota for the mount
(META_ALLOW), the mount spends it on the creates it answers in its delegated
folders and gives what it did not spend back. The limit holds exactly, with one
mount or two sharing a quota; EDQUOT comes at the limit; a killed mount's
allowance comes back when its session expires; `stoker quota ls` is exact after
all of it. Real daemons, real FUSE mounts (root)."""
import errno
import json
import os
import signal
import threading

import pytest

from conftest import needs_fuse, wait_until
from pyhelp import stoker
from test_mount import meta_figure

pytestmark = needs_fuse


def quota(cluster, path):
    out = json.loads(cluster.cli("quota", "ls", path, "--json").stdout)
    return out[0] if out else None


def reserved_inodes(cluster, path):
    return meta_figure(cluster, "stoker_quota_reserved_inodes", quota=path)


def at_meta(cluster, op):
    return meta_figure(cluster, "stoker_rpc_requests_total", op=op)


def fsync_dir(path):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fill(folder, prefix, made, stop_at=None):
    """Creates files in folder until EDQUOT (or stop_at of them); the names made go
    to `made`. Returns the error that stopped it (None: stop_at reached)."""
    i = 0
    while stop_at is None or i < stop_at:
        name = "%s%05d" % (prefix, i)
        try:
            os.close(os.open(os.path.join(folder, name), os.O_CREAT | os.O_EXCL | os.O_WRONLY,
                             0o644))
        except OSError as e:
            return e
        made.append(name)
        i += 1
    return None


def test_creates_under_a_quota_go_behind_and_stop_at_the_limit(cluster, make_mount):
    a = make_mount(cluster, "a")
    b = make_mount(cluster, "b")
    os.mkdir(os.path.join(a.path, "qa"))
    cluster.cli("quota", "set", "/qa", "--inodes", "500")
    d = os.path.join(a.path, "qa", "d")
    os.mkdir(d)  # delegated to a: the quota root and this folder use 2 inodes
    creates = at_meta(cluster, "META_CREATE")
    made = []
    assert fill(d, "f", made, stop_at=200) is None
    # answered by the mount: no create went to meta one by one
    assert at_meta(cluster, "META_CREATE") == creates
    assert at_meta(cluster, "META_ALLOW") >= 1
    fsync_dir(d)
    q = quota(cluster, "/qa")
    assert q["used_inodes"] == 202
    assert reserved_inodes(cluster, "/qa") > 0  # what the mount holds and did not spend
    # now to the limit: EDQUOT, promptly and clearly, at exactly 500
    err = fill(d, "g", made)
    assert isinstance(err, OSError) and err.errno == errno.EDQUOT, err
    assert len(made) == 498
    fsync_dir(d)  # nothing the mount answered was refused
    assert quota(cluster, "/qa")["used_inodes"] == 500
    assert sorted(os.listdir(os.path.join(b.path, "qa", "d"))) == sorted(made)
    # an unlink gives an inode back, and the next create takes it
    os.unlink(os.path.join(d, made[0]))
    os.close(os.open(os.path.join(d, "again"), os.O_CREAT | os.O_WRONLY, 0o644))
    with pytest.raises(OSError) as e:
        os.close(os.open(os.path.join(d, "one-too-many"), os.O_CREAT | os.O_WRONLY, 0o644))
    assert e.value.errno == errno.EDQUOT
    fsync_dir(d)
    assert quota(cluster, "/qa")["used_inodes"] == 500
    # an idle mount gives back what it holds
    wait_until(lambda: reserved_inodes(cluster, "/qa") == 0, 15,
               "the mount to give its allowance back")
    p = cluster.cli("quota", "recount", "/qa")
    assert b"1 quota(s) recounted, 0 fixed" in p.stdout, p.stdout


def test_two_mounts_sharing_a_quota_never_pass_it(cluster, make_mount):
    a = make_mount(cluster, "a")
    b = make_mount(cluster, "b")
    root = os.path.join(a.path, "qs")
    os.mkdir(root)
    limit = 1500
    cluster.cli("quota", "set", "/qs", "--inodes", str(limit))
    dirs = {"a": os.path.join(a.path, "qs", "da"), "b": os.path.join(b.path, "qs", "db")}
    for m in ("a", "b"):
        for t in range(2):
            os.mkdir(dirs[m] + str(t))  # each mount's own folders: delegated to it
    made = {(m, t): [] for m in ("a", "b") for t in range(2)}
    errs = {}
    seen = []

    def work(m, t):
        errs[(m, t)] = fill(dirs[m] + str(t), "f", made[(m, t)])

    def watch():
        while len(errs) < 4:
            q = quota(cluster, "/qs")
            seen.append((q["used_inodes"], reserved_inodes(cluster, "/qs")))

    threads = [threading.Thread(target=work, args=k) for k in made]
    threads.append(threading.Thread(target=watch))
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    for k, e in errs.items():
        assert isinstance(e, OSError) and e.errno == errno.EDQUOT, (k, e)
    for m in ("a", "b"):
        for t in range(2):
            fsync_dir(dirs[m] + str(t))  # no create either mount answered was refused
    # usage plus what is set aside never passed the limit while they raced
    assert seen and all(used + held <= limit for used, held in seen), seen[-5:]
    total = sum(len(v) for v in made.values())
    q = quota(cluster, "/qs")
    assert q["used_inodes"] == 1 + 4 + total <= limit
    # every create answered is there, seen from the other mount
    for (m, t), names in made.items():
        other = b if m == "a" else a
        sub = os.path.basename(dirs[m]) + str(t)
        assert sorted(os.listdir(os.path.join(other.path, "qs", sub))) == sorted(names)
    # what is left once both gave their allowances back fills the quota exactly
    wait_until(lambda: reserved_inodes(cluster, "/qs") == 0, 15,
               "both mounts to give their allowances back")
    c = stoker.connect(cluster.url)
    try:
        left = limit - quota(cluster, "/qs")["used_inodes"]
        for i in range(left):
            c.write_file("/qs/x%d" % i, b"")
        with pytest.raises(OSError) as e:
            c.write_file("/qs/over", b"")
        assert e.value.errno == errno.EDQUOT
    finally:
        c.close()
    assert quota(cluster, "/qs")["used_inodes"] == limit


def test_a_killed_mounts_allowance_comes_back(monkeypatch, make_cluster, make_mount):
    monkeypatch.setenv("STOKER_SESSION_LEASE_MS", "4000")
    cluster = make_cluster()
    a = make_mount(cluster, "a")
    os.mkdir(os.path.join(a.path, "qk"))
    limit = 300
    cluster.cli("quota", "set", "/qk", "--inodes", str(limit))
    d = os.path.join(a.path, "qk", "d")
    os.mkdir(d)
    made = []
    assert fill(d, "f", made, stop_at=10) is None
    fsync_dir(d)
    # killed while it holds the rest of its allowance (it gives it back only when idle)
    os.kill(a.pid(), signal.SIGKILL)
    assert reserved_inodes(cluster, "/qk") > 0
    # no other client can have all of the room meanwhile
    c = stoker.connect(cluster.url)
    try:
        assert quota(cluster, "/qk")["used_inodes"] == 12  # the root, d, the 10 synced
        # its session expires (4 s here) and its allowance with it
        wait_until(lambda: reserved_inodes(cluster, "/qk") == 0, 30,
                   "the killed mount's allowance to come back")
        free = limit - quota(cluster, "/qk")["used_inodes"]
        assert free == limit - 12
        for i in range(free):
            c.write_file("/qk/y%d" % i, b"")
        with pytest.raises(OSError) as e:
            c.write_file("/qk/over", b"")
        assert e.value.errno == errno.EDQUOT
        assert quota(cluster, "/qk")["used_inodes"] == limit
        p = cluster.cli("quota", "recount", "/qk")
        assert b"1 quota(s) recounted, 0 fixed" in p.stdout, p.stdout
    finally:
        c.close()


def test_a_bytes_only_quota_sets_no_inodes_aside(cluster, make_mount):
    a = make_mount(cluster, "a")
    os.mkdir(os.path.join(a.path, "qb"))
    cluster.cli("quota", "set", "/qb", "--bytes", "1M")
    d = os.path.join(a.path, "qb", "d")
    os.mkdir(d)
    creates = at_meta(cluster, "META_CREATE")
    made = []
    assert fill(d, "f", made, stop_at=100) is None
    assert at_meta(cluster, "META_CREATE") == creates
    fsync_dir(d)
    assert reserved_inodes(cluster, "/qb") == 0
    assert quota(cluster, "/qb")["used_inodes"] == 102


def test_quota_holds_through_a_meta_failover(tmp_path, monkeypatch):
    """Three meta replicas; a mount creates files under a quota until EDQUOT while
    the leader is killed. The allowances die with the leader; the new one sets
    room aside again. Every create that returned is there, and usage is exactly
    the files made, at the limit, never past it."""
    from conftest import Mount, have_fuse
    from test_meta_replication import MetaCluster
    if not have_fuse():
        pytest.skip("needs root, /dev/fuse and fusermount3")
    mc = MetaCluster(tmp_path)
    mc.up()
    monkeypatch.setenv("STOKER_KEY_FILE", os.path.join(mc.data, "cluster.key"))
    m = Mount(mc, tmp_path / "mnt")
    limit = 1500
    made, errors, done = [], [], threading.Event()
    try:
        m.start()
        os.mkdir(os.path.join(m.path, "qf"))
        mc.cli("quota", "set", "/qf", "--inodes", str(limit))
        top = os.path.join(m.path, "qf", "loop")
        os.mkdir(top)

        def loop():
            i = 0
            while len(errors) < 20:
                p = os.path.join(top, "f%05d" % i)
                try:
                    with open(p, "wb") as f:
                        f.write(b"%d" % i)
                except OSError as e:
                    errors.append(e)
                    if e.errno == errno.EDQUOT:
                        break
                else:
                    made.append("f%05d" % i)
                i += 1
            done.set()

        t = threading.Thread(target=loop)
        t.start()
        try:
            mc.wait("some files", lambda: len(made) > 30)
            old, resume = mc.kill_leader()
            killed_midway = not done.is_set()
            try:
                done.wait(180)
            finally:
                resume()
        finally:
            t.join(timeout=180)
        assert done.is_set(), "the loop did not reach the limit"
        assert killed_midway, "the loop reached the limit before the leader was killed"
        assert [e.errno for e in errors] == [errno.EDQUOT], errors[:5]
        fsync_dir(top)  # nothing the mount answered was refused
        assert sorted(os.listdir(top)) == made
        q = json.loads(mc.cli("quota", "ls", "/qf", "--json").stdout)[0]
        assert q["used_inodes"] == 2 + len(made) <= limit
        m.stop()  # its session ends: what it held goes
        # the room left fills the quota exactly
        c = stoker.connect(mc.url)
        try:
            for i in range(limit - 2 - len(made)):
                c.write_file("/qf/z%d" % i, b"")
            with pytest.raises(OSError) as e:
                c.write_file("/qf/over", b"")
            assert e.value.errno == errno.EDQUOT
        finally:
            c.close()
        p = mc.cli("quota", "recount", "/qf")
        assert b"1 quota(s) recounted, 0 fixed" in p.stdout, p.stdout
    finally:
        m.stop()
        try:
            os.kill(mc.supervisor(), signal.SIGCONT)
        except (AssertionError, OSError):
            pass
        mc.down()


# ---- byte allowances (docs/quotas.md, "Bytes a mount writes") ----

SMALL = 16384


def reserved_bytes(cluster, path):
    return meta_figure(cluster, "stoker_quota_reserved_bytes", quota=path)


def write_small(folder, prefix, made, stop_at=None, payload=b"s" * SMALL):
    """Writes 16 KiB files in folder until EDQUOT (or stop_at of them); the names
    of those written whole go to `made`. Returns the error that stopped it."""
    i = 0
    while stop_at is None or i < stop_at:
        name = "%s%05d" % (prefix, i)
        fd = os.open(os.path.join(folder, name), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        err = None
        try:
            assert os.write(fd, payload) == len(payload)
        except OSError as e:
            err = e
        try:
            os.close(fd)
        except OSError as e:
            err = err or e
        if err:
            return err
        made.append(name)
        i += 1
    return None


def test_small_files_under_a_byte_quota_ask_meta_nothing_and_stop_at_it(cluster, make_mount):
    a = make_mount(cluster, "a")
    os.mkdir(os.path.join(a.path, "qs"))
    limit = 2 << 20
    cluster.cli("quota", "set", "/qs", "--bytes", str(limit))
    d = os.path.join(a.path, "qs", "d")
    os.mkdir(d)
    asks = at_meta(cluster, "META_QUOTA")
    made = []
    assert write_small(d, "f", made, stop_at=40) is None
    # 40 files' first writes: room from the allowance, not a META_QUOTA each
    assert at_meta(cluster, "META_QUOTA") - asks < 5
    assert at_meta(cluster, "META_ALLOW_BYTES") >= 1
    err = write_small(d, "g", made)
    assert err is not None and err.errno == errno.EDQUOT, err
    fsync_dir(d)
    os.sync()
    q = quota(cluster, "/qs")
    # the last files reserved what was left, exactly: the limit is reached
    assert q["used_bytes"] == SMALL * len(made) == limit, q
    for name in made:
        with open(os.path.join(d, name), "rb") as f:
            assert f.read() == b"s" * SMALL
    wait_until(lambda: reserved_bytes(cluster, "/qs") == 0, 30, "the idle allowance to go back")
    p = cluster.cli("quota", "recount", "/qs")
    assert b"1 quota(s) recounted, 0 fixed" in p.stdout, p.stdout


def test_two_mounts_writing_under_a_byte_quota_never_pass_it(cluster, make_mount):
    a = make_mount(cluster, "a")
    b = make_mount(cluster, "b")
    os.mkdir(os.path.join(a.path, "qr"))
    limit = 3 << 20
    cluster.cli("quota", "set", "/qr", "--bytes", str(limit))
    dirs = [os.path.join(m.path, "qr", "m%d" % i) for i, m in enumerate((a, b))]
    for x in dirs:
        os.mkdir(x)
    made = [[] for _ in dirs]
    errs = [None] * len(dirs)

    def run(i):
        errs[i] = write_small(dirs[i], "f", made[i])

    ts = [threading.Thread(target=run, args=(i,)) for i in range(len(dirs))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for e in errs:
        assert e is not None and e.errno == errno.EDQUOT, e
    for x in dirs:
        fsync_dir(x)
    os.sync()
    q = quota(cluster, "/qr")
    total = SMALL * sum(len(m) for m in made)
    assert q["used_bytes"] == total <= limit, q
    assert min(len(m) for m in made) > 0
    p = cluster.cli("quota", "recount", "/qr")
    assert b"1 quota(s) recounted, 0 fixed" in p.stdout, p.stdout


def test_a_killed_mounts_byte_allowance_comes_back(monkeypatch, make_cluster, make_mount):
    monkeypatch.setenv("STOKER_SESSION_LEASE_MS", "4000")
    cluster = make_cluster()
    a = make_mount(cluster, "a")
    os.mkdir(os.path.join(a.path, "qkb"))
    limit = 8 << 20
    cluster.cli("quota", "set", "/qkb", "--bytes", str(limit))
    d = os.path.join(a.path, "qkb", "d")
    os.mkdir(d)
    made = []
    assert write_small(d, "f", made, stop_at=10) is None  # each close reported its size
    # killed while it holds the rest of its allowance (it gives it back only when idle)
    os.kill(a.pid(), signal.SIGKILL)
    assert reserved_bytes(cluster, "/qkb") > 0
    assert quota(cluster, "/qkb")["used_bytes"] == 10 * SMALL
    wait_until(lambda: reserved_bytes(cluster, "/qkb") == 0, 30,
               "the killed mount's byte allowance to come back")
    c = stoker.connect(cluster.url)
    try:
        free = limit - 10 * SMALL
        c.write_file("/qkb/big", b"x" * free)
        with pytest.raises(OSError) as e:
            c.write_file("/qkb/over", b"y")
        assert e.value.errno == errno.EDQUOT
        assert quota(cluster, "/qkb")["used_bytes"] == limit
    finally:
        c.close()
    p = cluster.cli("quota", "recount", "/qkb")
    assert b"1 quota(s) recounted, 0 fixed" in p.stdout, p.stdout
