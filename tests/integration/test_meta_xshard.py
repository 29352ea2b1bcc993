"""Folders on other shards (docs/meta-shards.md): placement, routing by inode,
cross-shard mkdir and rmdir with intents, and their recovery after a crash at
each step.

Two shards, one meta node each. A folder whose parent is pinned (or set to
spread) is made on another shard: its entry stays on its parent's shard, its
inode and everything made in it live on the other one, and clients send each
request to the shard of the inode it names. A file renamed between folders of
two shards keeps its inode (and number) on its shard, named by an entry on the
other, and so does a hard link between them; a folder moved between shards is
test_meta_xdir.py's.

The crash-point tests start the cluster with STOKER_TEST_XSHARD_STOP=OP:K: the
meta node that completes step K of a cross-shard mkdir, rmdir or rename kills itself
right after it, once, and `stoker up` restarts it. Whatever the client was told,
the namespace must settle by itself: the folder exists on both sides (named,
usable, unmarked) or on neither (no name, no inode left on the other shard), and
no intent or mark is left.
"""
import errno
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import threading
import time

import pytest

from conftest import CHECK, STOKER, Mount, errno_of, free_port, have_fuse, run, wait_until
from pyhelp import stoker as stoker_pkg
from test_meta_shards import ShardCluster, leader_of
from test_mount import changes_are_seen_at_once


class XCluster(ShardCluster):
    """ShardCluster with an environment for its daemons."""

    def __init__(self, tmp_path, env_extra=None, replicas=1):
        super().__init__(tmp_path, replicas, replicas, 2)
        self.env_extra = env_extra or {}

    def up(self):
        args = [STOKER, "up", "--data", self.data, "--daemon", "--port", str(self.port),
                "--targets", "1", "--meta-shards", "2", "--heartbeat-timeout-ms", "2000"]
        if self.nodes > 1:
            args += ["--nodes", str(self.nodes), "--meta", str(self.meta), "--mgmtd", "1"]
        p = run(args, check=False, timeout=120, env=dict(os.environ, **self.env_extra))
        assert p.returncode == 0, p.stderr.decode() + self.logs()

    def meta_addr(self, shard):
        if self.nodes > 1:
            return leader_of(self.shard_map()[shard])
        return "127.0.0.1:%d" % (self.port + 1 if shard == 1 else self.port + 40)

    def held(self, shard):
        """(inodes, intents, marks, releases waiting) the meta node of `shard` holds now."""
        p = run([CHECK, "xshard", self.meta_addr(shard)], check=False, env=self.env(),
                timeout=30)
        m = re.match(rb"files (\d+) intents (\d+) marks (\d+) releases (\d+)", p.stdout)
        assert m, p.stdout + p.stderr
        return tuple(int(g) for g in m.groups())


@pytest.fixture
def make_xc(tmp_path):
    made = []

    def make(env_extra=None, replicas=1):
        c = XCluster(tmp_path, env_extra, replicas)
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
               if "ERROR: AddressSanitizer" in line or "runtime error:" in line]
        assert not bad, c.logs()


def shard_of(ino):
    return (ino >> 48) + 1


def test_folders_on_another_shard(make_xc):
    sc = make_xc()
    # placement is a folder's setting; bad ones are refused with a clear error
    for bad, what in (("3", b"no such shard"), ("x", b"bad shard"), ("0", b"bad shard")):
        p = sc.cli("shard", "pin", "/", bad, check=False)
        assert p.returncode != 0 and what in p.stderr, (bad, p.stderr)
    out = sc.cli("status").stdout
    assert b"folders stay on their parent's shard" in out, out
    c = stoker_pkg.connect(sc.url)
    try:
        c.makedirs("/plain")
        assert shard_of(c.stat("/plain").st_ino) == 1  # no setting: its parent's shard
        c.write_file("/plain/f", b"x")
        p = sc.cli("shard", "pin", "/plain/f", "2", check=False)
        assert p.returncode != 0 and b"not a folder" in p.stderr, p.stderr
        sc.cli("shard", "pin", "/", "spread")
        assert b"folders made in / go spread over the shards" in sc.cli("status").stdout
        names = ["d%d" % i for i in range(12)]
        for n in names:
            c.makedirs("/" + n)
        where = {n: shard_of(c.stat("/" + n).st_ino) for n in names}
        assert set(where.values()) == {1, 2}, where
        # everything made in a folder lives on its shard, and reads back
        for n in names:
            c.write_file("/%s/f" % n, n.encode())
            c.makedirs("/%s/sub" % n)
            assert shard_of(c.stat("/%s/f" % n).st_ino) == where[n]
            assert shard_of(c.stat("/%s/sub" % n).st_ino) == where[n]
            assert c.read_file("/%s/f" % n) == n.encode()
            assert sorted(c.listdir("/" + n)) == ["f", "sub"]
            c.rename("/%s/f" % n, "/%s/sub/g" % n)  # within a shard: a rename
            assert c.read_file("/%s/sub/g" % n) == n.encode()
        assert sorted(c.listdir("/")) == sorted(names + ["plain"])
        a = [n for n in names if where[n] == 1][0]
        b = [n for n in names if where[n] == 2][0]
        # a folder moved across shards and back (test_meta_xdir.py; a file renamed
        # or linked across: test_file_renamed_across_shards_and_back, test_hard_link_...)
        for src, dst in (("/" + b, "/%s/moved" % a), ("/%s/sub" % a, "/%s/moved" % b)):
            ino = c.stat(src).st_ino
            c.rename(src, dst)
            assert c.stat(dst).st_ino == ino
            c.rename(dst, src)
        assert c.read_file("/%s/sub/g" % b) == b.encode()
        # ".." of a folder of another shard is its parent, asked of the parent's shard
        p = run([CHECK, "ino", sc.url, "parent", str(c.stat("/" + b).st_ino)],
                check=False, env=sc.env())
        assert p.stdout.split() == [b"ino", b"1", b"OK"], p.stdout + p.stderr
        # within its parent, a folder of another shard renames (only its entry moves)
        c.rename("/" + b, "/%s-renamed" % b)
        assert c.read_file("/%s-renamed/sub/g" % b) == b.encode()
        with pytest.raises(OSError) as e:
            c.rename("/%s-renamed" % b, "/" + a)  # replacing a folder with contents
        assert e.value.errno == errno.ENOTEMPTY
        c.rename("/%s-renamed" % b, "/" + b)
        assert sorted(c.listdir("/")) == sorted(names + ["plain"])
        # a folder of another shard: rmdir of it non-empty refused, then removed
        with pytest.raises(OSError) as e:
            c.rmdir("/" + b)
        assert e.value.errno == errno.ENOTEMPTY
        with pytest.raises(OSError) as e:
            c.remove("/" + b)
        assert e.value.errno in (errno.EISDIR, errno.EPERM)
        ino = c.stat("/" + b).st_ino
        c.remove("/%s/sub/g" % b)
        c.rmdir("/%s/sub" % b)
        c.rmdir("/" + b)
        with pytest.raises(FileNotFoundError):
            c.stat("/" + b)
        assert b not in c.listdir("/")
        # and its inode is gone on its shard too
        p = run([CHECK, "ino", sc.url, "getattr", str(ino)], check=False, env=sc.env())
        assert p.stdout.strip() == b"ENOENT", p.stdout + p.stderr
        # pinned: folders made in a folder go to the shard it names
        sc.cli("shard", "pin", "/%s" % a, "2")
        c.makedirs("/%s/pinned/deeper" % a)
        assert shard_of(c.stat("/%s/pinned" % a).st_ino) == 2
        assert shard_of(c.stat("/%s/pinned/deeper" % a).st_ino) == 2  # unpinned there
        show = sc.cli("shard", "show", "/%s" % a, "/%s/pinned" % a).stdout
        assert b"on shard 1; new folders in it: on shard 2" in show, show
        assert b"/pinned: on shard 2; new folders in it: on its shard" in show, show
        sc.cli("shard", "unpin", "/%s" % a)
        c.makedirs("/%s/after" % a)
        assert shard_of(c.stat("/%s/after" % a).st_ino) == 1
    finally:
        c.close()
    # nothing left half-done, and fsck (shard 1's namespace) finds nothing wrong
    for shard in (1, 2):
        assert sc.held(shard)[1:] == (0, 0, 0), sc.held(shard)
    p = sc.cli("fsck", check=False)
    assert p.returncode == 0, p.stdout + p.stderr
    # shard 2's files' chunks are not garbage to it, however old (it checks shard 1's)
    p = sc.cli("fsck", "--grace", "0", "--repair", check=False)
    assert p.returncode == 0, p.stdout + p.stderr
    c = stoker_pkg.connect(sc.url)
    try:
        for n in names:
            if n != b:
                assert c.read_file("/%s/sub/g" % n) == n.encode()
    finally:
        c.close()


def two_folders(sc, c):
    """/a on shard 1 and /b on shard 2."""
    c.makedirs("/a")
    sc.cli("shard", "pin", "/", "2")
    c.makedirs("/b")
    sc.cli("shard", "unpin", "/")
    assert shard_of(c.stat("/a").st_ino) == 1 and shard_of(c.stat("/b").st_ino) == 2


def gone(sc, ino):
    p = run([CHECK, "ino", sc.url, "getattr", str(ino)], check=False, env=sc.env())
    return p.stdout.strip() == b"ENOENT"


def test_file_renamed_across_shards_and_back(make_xc):
    """A file renamed from a folder of shard 1 to one of shard 2, replacing a name
    there, and back over a name of shard 1: the same inode all along, what it
    replaced gone, nothing left half-done, fsck clean."""
    sc = make_xc()
    c = stoker_pkg.connect(sc.url)
    try:
        two_folders(sc, c)
        c.write_file("/a/f", b"new" * 1000)
        c.write_file("/b/f", b"old")
        c.write_file("/a/back", b"replaced on shard 1")
        ino, old = c.stat("/a/f").st_ino, c.stat("/b/f").st_ino
        assert shard_of(ino) == 1 and shard_of(old) == 2
        c.rename("/a/f", "/b/f")
        assert "f" not in c.listdir("/a") and "f" in c.listdir("/b")
        st = c.stat("/b/f")
        assert st.st_ino == ino and st.st_size == 3000 and st.st_nlink == 1
        assert c.read_file("/b/f") == b"new" * 1000
        wait_until(lambda: gone(sc, old), timeout=30)  # the old file and its data
        # written through its new name, renamed within shard 2, then home again
        c.write_file("/b/f", b"changed")
        c.makedirs("/b/sub")
        c.rename("/b/f", "/b/sub/g")
        assert c.stat("/b/sub/g").st_ino == ino
        with pytest.raises(OSError) as e:
            c.rename("/b/sub/g", "/b/sub")  # onto a folder
        assert e.value.errno in (errno.EISDIR, errno.EXDEV)
        # over a file of shard 2 there: that file goes
        c.write_file("/b/sub/x", b"x")
        x = c.stat("/b/sub/x").st_ino
        c.rename("/b/sub/g", "/b/sub/x")
        assert c.stat("/b/sub/x").st_ino == ino and c.read_file("/b/sub/x") == b"changed"
        wait_until(lambda: gone(sc, x), timeout=30)
        c.rename("/b/sub/x", "/b/sub/g")
        back = c.stat("/a/back").st_ino
        c.rename("/b/sub/g", "/a/back")
        assert c.stat("/a/back").st_ino == ino and c.read_file("/a/back") == b"changed"
        assert "g" not in c.listdir("/b/sub")
        wait_until(lambda: gone(sc, back), timeout=30)
        # to shard 2 again, then replaced there by a file of shard 2 (write, rename)
        c.rename("/a/back", "/b/ckpt")
        c.write_file("/b/tmp", b"checkpoint 2")
        c.rename("/b/tmp", "/b/ckpt")
        assert c.read_file("/b/ckpt") == b"checkpoint 2"
        wait_until(lambda: gone(sc, ino), timeout=30)
        # a name of a file of shard 1 on shard 2, unlinked there
        c.write_file("/a/u", b"u")
        u = c.stat("/a/u").st_ino
        c.rename("/a/u", "/b/u")
        with pytest.raises(OSError) as e:
            c.rename("/b", "/b/sub/b")  # a folder of shard 2 into its own subtree
        assert e.value.errno == errno.EINVAL
        p = run([CHECK, "ino", sc.url, "link", str(u), str(c.stat("/b").st_ino), "l"],
                check=False, env=sc.env())
        assert p.stdout.strip() == b"EXDEV", p.stdout + p.stderr  # a second name off home
        # renamed onto another name of the same file: nothing happens (POSIX)
        assert ino_link(sc, u, c.stat("/a").st_ino, "u-home") == "OK"
        c.rename("/b/u", "/a/u-home")
        assert c.stat("/b/u").st_ino == u and c.stat("/a/u-home").st_nlink == 2
        c.remove("/a/u-home")
        c.remove("/b/u")
        assert "u" not in c.listdir("/b")
        wait_until(lambda: gone(sc, u), timeout=30)
    finally:
        c.close()
    wait_until(lambda: sc.held(1)[1:] == (0, 0, 0) and sc.held(2)[1:] == (0, 0, 0), timeout=30)
    p = sc.cli("fsck", check=False)
    assert p.returncode == 0, p.stdout + p.stderr
    p = sc.cli("fsck", "--grace", "0", "--repair", check=False)
    assert p.returncode == 0, p.stdout + p.stderr


@pytest.mark.skipif(not have_fuse(), reason="needs root, /dev/fuse and fusermount3")
def test_mount_mv_moves_across_shards(make_xc, tmp_path):
    """Through the mount: `mv` between folders of two shards is a rename (the same
    inode after, no copy), a file open across it keeps working, and a hard link
    across shards is one inode with two links."""
    sc = make_xc()
    c = stoker_pkg.connect(sc.url)
    try:
        two_folders(sc, c)
    finally:
        c.close()
    m = Mount(sc, tmp_path / "mnt")
    m.start()
    try:
        a, b = os.path.join(m.path, "a"), os.path.join(m.path, "b")
        src = os.path.join(b, "data")
        with open(src, "wb") as f:
            f.write(b"y" * 100000)
        with open(os.path.join(a, "data"), "wb") as f:
            f.write(b"old")
        ino = os.stat(src).st_ino
        fd = os.open(src, os.O_RDWR)
        try:
            os.rename(src, os.path.join(a, "data"))
            assert os.stat(os.path.join(a, "data")).st_ino == ino
            assert not os.path.exists(src)
            os.pwrite(fd, b"z" * 10, 0)
            os.fsync(fd)
            assert os.pread(fd, 12, 0) == b"z" * 10 + b"yy"
        finally:
            os.close(fd)
        with open(os.path.join(a, "data"), "rb") as f:
            assert f.read() == b"z" * 10 + b"y" * 99990
        subprocess.run(["mv", os.path.join(a, "data"), os.path.join(b, "back")], check=True)
        assert os.stat(os.path.join(b, "back")).st_ino == ino
        assert os.listdir(a) == [] and os.listdir(b) == ["back"]
        # a hard link across shards through the mount: one inode, two links
        with open(os.path.join(a, "home"), "wb") as f:
            f.write(b"home")
        os.link(os.path.join(a, "home"), os.path.join(b, "linked"))
        st = os.stat(os.path.join(b, "linked"))
        assert st.st_ino == os.stat(os.path.join(a, "home")).st_ino and st.st_nlink == 2
        os.unlink(os.path.join(a, "home"))
        with open(os.path.join(b, "linked"), "rb") as f:
            assert f.read() == b"home"
        shutil.rmtree(b)
        assert sorted(os.listdir(m.path)) == ["a"] and os.listdir(a) == []
    finally:
        m.stop()
    wait_until(lambda: sc.held(1)[1:] == (0, 0, 0) and sc.held(2)[1:] == (0, 0, 0), timeout=30)
    p = sc.cli("fsck", check=False)
    assert p.returncode == 0, p.stdout + p.stderr


def shard_meta_figure(sc, shard, name, **labels):
    """The sum of the samples of name with these labels at the meta of `shard`
    (single node: its metrics 10 ports above it)."""
    from test_metrics import http, parse, total
    host, port = sc.meta_addr(shard).rsplit(":", 1)
    samples, _ = parse(http("%s:%d" % (host, int(port) + 10))[2])
    return total(samples, name, **labels)


def shard_lookups(sc, shard):
    return sum(shard_meta_figure(sc, shard, "stoker_rpc_requests_total", op=op)
               for op in ("META_LOOKUP", "META_LOOKUP_CACHE"))


@pytest.mark.skipif(not have_fuse(), reason="needs root, /dev/fuse and fusermount3")
def test_a_setgid_folder_passes_its_group_to_a_folder_on_another_shard(make_xc, tmp_path):
    """A folder made in a setgid folder takes the folder's group and the setgid bit,
    as POSIX has it, when it is made on another shard (which knows nothing of its
    parent) as when it is made on its parent's."""
    sc = make_xc()
    m = Mount(sc, tmp_path / "m")
    m.start()
    try:
        top = os.path.join(m.path, "team")
        os.mkdir(top)
        os.chown(top, 0, 4242)
        os.chmod(top, 0o2775)
        sc.cli("shard", "pin", "/team", "2")
        for name in ("there", "there/deeper"):
            p = os.path.join(top, name)
            os.mkdir(p, 0o755)
            st = os.stat(p)
            assert shard_of(st.st_ino) == 2, name
            assert st.st_gid == 4242 and st.st_mode & 0o2000, (name, oct(st.st_mode))
        sc.cli("shard", "unpin", "/team")
        here = os.path.join(top, "here")
        os.mkdir(here)
        st = os.stat(here)
        assert shard_of(st.st_ino) == 1
        assert st.st_gid == 4242 and st.st_mode & 0o2000, oct(st.st_mode)
    finally:
        m.stop()


def test_lookup_cache_leases_on_another_shard(make_xc, tmp_path):
    """A folder on shard 2 is cached as shard 1's are: its meta leases to each
    mount's watch of shard 2, so repeated stats through a mount are answered by
    the mount, and another mount's change recalls the lease before it returns, so
    no stat after it answers from before it."""
    sc = make_xc()
    sc.cli("shard", "pin", "/", "2")
    nocache = ["entry_timeout=0", "attr_timeout=0"]
    m1 = Mount(sc, tmp_path / "m1", opts=nocache)
    m2 = Mount(sc, tmp_path / "m2", opts=nocache)
    m1.start()
    m2.start()
    try:
        os.mkdir(os.path.join(m1.path, "d"))
        assert shard_of(os.stat(os.path.join(m2.path, "d")).st_ino) == 2
        a = lambda n: os.path.join(m1.path, "d", n)
        b = lambda n: os.path.join(m2.path, "d", n)
        with open(b("f"), "wb") as f:
            f.write(b"x" * 10)
        assert os.stat(a("f")).st_size == 10
        assert shard_of(os.stat(a("f")).st_ino) == 2
        # each mount watches shard 2 with a holder of shard 2's, once it used it
        wait_until(lambda: shard_meta_figure(sc, 2, "stoker_meta_lease_holders") >= 2, 30,
                   "both mounts' watches of shard 2")

        def served_by_m1():
            # a lookup sent before m1's watch of shard 2 was answered took no lease
            before = shard_lookups(sc, 2)
            for _ in range(50):
                assert os.stat(a("f")).st_size == 10
            return shard_lookups(sc, 2) - before < 10

        wait_until(served_by_m1, 30, "m1 answering lookups in shard 2's folder itself")
        # every change through m2 is seen through m1 at once, no waiting
        changes_are_seen_at_once(a, b, lambda: shard_lookups(sc, 2))
        # shard 1 leases to each mount too, by its own holder ids
        assert shard_meta_figure(sc, 1, "stoker_meta_lease_holders") >= 2
    finally:
        m1.stop()
        m2.stop()


def shard_reads(sc, shard):
    """Lookups and attribute reads the meta of `shard` served."""
    return shard_lookups(sc, shard) + sum(
        shard_meta_figure(sc, shard, "stoker_rpc_requests_total", op=op)
        for op in ("META_GETATTR", "META_GETATTRS", "META_LOOKUPS"))


def mount_cache_figure(addr, result):
    from test_metrics import http, parse, total
    samples, _ = parse(http(addr)[2])
    return total(samples, "stoker_client_lookup_cache_total", result=result)


@pytest.mark.skipif(not have_fuse(), reason="needs root, /dev/fuse and fusermount3")
def test_a_broken_watch_of_one_shard_keeps_the_other_shards_cache(make_xc, tmp_path):
    """A mount caches names of a folder on each shard. Shard 2's meta is killed, so
    the mount's watch of shard 2 breaks (and the restarted meta knows none of its
    leases): shard 1's names are still answered by the mount (shard 1's meta counts
    no lookups or attribute reads), while shard 2's are asked of meta again and
    show every change another mount made while the watch was broken."""
    sc = make_xc()
    nocache = ["entry_timeout=0", "attr_timeout=0"]
    maddr = "127.0.0.1:%d" % free_port()
    m1 = Mount(sc, tmp_path / "m1", opts=nocache + ["metrics=" + maddr])
    m2 = Mount(sc, tmp_path / "m2", opts=nocache)
    m1.start()
    m2.start()
    try:
        os.mkdir(os.path.join(m1.path, "d1"))
        sc.cli("shard", "pin", "/", "2")
        os.mkdir(os.path.join(m1.path, "d2"))
        a1 = lambda n: os.path.join(m1.path, "d1", n)
        a2 = lambda n: os.path.join(m1.path, "d2", n)
        b2 = lambda n: os.path.join(m2.path, "d2", n)
        assert shard_of(os.stat(a1(".")).st_ino) == 1
        assert shard_of(os.stat(a2(".")).st_ino) == 2
        for f in (a1("f"), b2("f")):
            with open(f, "wb") as fh:
                fh.write(b"x" * 10)
        wait_until(lambda: shard_meta_figure(sc, 2, "stoker_meta_lease_holders") >= 2, 30,
                   "both mounts' watches of shard 2")

        def cached_2():
            # d2's own name is an entry of shard 1 naming a folder of shard 2, never
            # leased: only shard 2's lookups tell
            before = shard_lookups(sc, 2)
            for _ in range(30):
                assert os.stat(a2("f")).st_size == 10
                assert errno_of(os.stat, a2("g")) == errno.ENOENT
            return shard_lookups(sc, 2) - before < 10

        def cached_1():
            before = shard_reads(sc, 1)
            for _ in range(30):
                assert os.stat(a1("f")).st_size == 10
                assert errno_of(os.stat, a1("g")) == errno.ENOENT
            return shard_reads(sc, 1) - before < 5

        wait_until(cached_2, 30, "m1 answering stats in shard 2's folder itself")
        # a name m2 adds to d1 recalls m1's leases on d1 (and so on its name in the
        # root): m1 looks them up again now, so that what it keeps of shard 1 is far
        # from its 29 s expiry when counted below, however long the waits above took
        open(os.path.join(m2.path, "d1", "k"), "wb").close()
        assert os.stat(a1("k")).st_size == 0
        wait_until(cached_1, 30, "m1 answering stats in shard 1's folder itself")

        # shard 2's meta dies: m1's watch of it breaks at once (its connection ends)
        addr2 = sc.meta_addr(2)
        pid2 = sc.meta_pid(addr2)
        assert pid2
        resets = mount_cache_figure(maddr, "reset")
        os.kill(pid2, signal.SIGKILL)
        wait_until(lambda: mount_cache_figure(maddr, "reset") > resets, 30,
                   "m1 dropping what shard 2 leased")
        # shard 1's names are answered by m1 still, not one read at shard 1's meta
        before = shard_reads(sc, 1)
        for _ in range(50):
            assert os.stat(a1("f")).st_size == 10
            assert errno_of(os.stat, a1("g")) == errno.ENOENT
        assert shard_reads(sc, 1) - before == 0

        # the restarted shard 2 knows none of m1's leases, and recalls nothing from it:
        # changes another mount makes now must still be seen through m1
        sc.wait("shard 2's meta back", lambda: sc.meta_pid(addr2) not in (None, pid2) and
                shard_lookups(sc, 2) >= 0)
        os.chmod(b2("f"), 0o600)
        with open(b2("f"), "ab") as fh:
            fh.write(b"y" * 5)
        open(b2("g"), "wb").close()
        before = shard_lookups(sc, 2)
        st = os.stat(a2("f"))
        assert (st.st_size, stat.S_IMODE(st.st_mode)) == (15, 0o600)
        assert os.stat(a2("g")).st_size == 0
        assert shard_lookups(sc, 2) - before >= 2  # asked again, not answered from before
        # shard 1's cache went on unharmed, and shard 2's is kept again
        assert os.stat(a1("f")).st_size == 10
        wait_until(lambda: cached_again(sc, a2), 30,
                   "m1 answering stats in shard 2's folder itself again")
    finally:
        m1.stop()
        m2.stop()


def cached_again(sc, a2):
    before = shard_lookups(sc, 2)
    for _ in range(30):
        assert os.stat(a2("f")).st_size == 15
    return shard_lookups(sc, 2) - before < 10


def stopped(sc, op, step):
    return logged(sc, "stopping after step %d of a cross-shard %s" % (step, op))


def logged(sc, want):
    logdir = os.path.join(sc.data, "log")
    for name in os.listdir(logdir):
        with open(os.path.join(logdir, name), errors="replace") as f:
            if want in f.read():
                return True
    return False


def settled(sc, c, name, before):
    """The folder /name exists on both sides or on neither, nothing is marked or
    intended, and shard 2 holds exactly the folders named. Returns whether it
    exists, or None while recovery has not finished."""
    if sc.held(1)[1:] != (0, 0, 0) or sc.held(2)[1:] != (0, 0, 0):
        return None
    try:
        st = c.stat("/" + name)
    except FileNotFoundError:
        st = None
    files2 = sc.held(2)[0]
    if st is None:
        return False if files2 == before else None
    assert shard_of(st.st_ino) == 2
    return True if files2 == before + 1 else None


def wait_settled(sc, c, name, before):
    deadline = time.time() + 40
    while time.time() < deadline:
        try:
            v = settled(sc, c, name, before)
        except (AssertionError, OSError):
            v = None
        if v is not None:
            return v
        time.sleep(0.5)
    raise AssertionError("not settled: shard 1 %s, shard 2 %s (2 held %d before)\n%s" % (
        sc.held(1), sc.held(2), before, sc.logs()))


@pytest.mark.parametrize("op,step", [(op, k) for op in ("mkdir", "rmdir") for k in (1, 2, 3, 4)])
def test_crash_at_each_step_recovers(make_xc, op, step):
    sc = make_xc({"STOKER_TEST_XSHARD_STOP": "%s:%d" % (op, step)})
    sc.cli("shard", "pin", "/", "2")
    c = stoker_pkg.connect(sc.url)
    try:
        before = sc.held(2)[0]
        if op == "rmdir":
            c.makedirs("/d")
            assert shard_of(c.stat("/d").st_ino) == 2
            before = sc.held(2)[0] - 1
        try:
            if op == "mkdir":
                c.makedirs("/d")
            else:
                c.rmdir("/d")
            told = "ok"
        except OSError as e:
            told = e.errno
        # the participant stopped (its log says so) and was restarted
        sc.wait("the stop at step %d" % step, lambda: stopped(sc, op, step))
        exists = wait_settled(sc, c, "d", before)
        # where the stop left work for recovery, recovery did it (not a retry alone)
        want = {("mkdir", 1): "(intent 1) given up", ("rmdir", 1): "given up: shard 2 undid",
                ("mkdir", 3): "pending for shard 1's intent 1: kept",
                ("rmdir", 3): "dying for shard 1's intent 2: deleted"}.get((op, step))
        assert want is None or logged(sc, want), sc.logs()
        if told == "ok":
            assert exists == (op == "mkdir"), (told, exists)
        if exists:
            # usable: not marked dying, and its contents live on its shard
            c.write_file("/d/f", b"after")
            assert c.read_file("/d/f") == b"after"
            assert shard_of(c.stat("/d/f").st_ino) == 2
            c.remove("/d/f")
            c.rmdir("/d")
        assert "d" not in c.listdir("/")
        assert wait_settled(sc, c, "d", before) is False
    finally:
        c.close()
    p = sc.cli("fsck", check=False)
    assert p.returncode == 0, p.stdout + p.stderr


def renamed_where(sc, c, ino, old):
    """After a rename of /a/f (inode ino) over /b/f (inode old): True when the file is
    /b/f alone, False when it is /a/f alone with /b/f still old, None while recovery
    has not finished (an intent, a mark or a release held, or both names)."""
    if sc.held(1)[1:] != (0, 0, 0) or sc.held(2)[1:] != (0, 0, 0):
        return None
    names = {}
    for path in ("/a/f", "/b/f"):
        try:
            names[path] = c.stat(path).st_ino
        except FileNotFoundError:
            names[path] = None
    if names["/b/f"] == ino and names["/a/f"] is None:
        return True
    if names["/a/f"] == ino and names["/b/f"] == old:
        return False
    return None


@pytest.mark.parametrize("step", [1, 2, 3, 4])
def test_rename_crash_at_each_step_recovers(make_xc, tmp_path, step):
    """The node completing step K of a file's rename across shards dies (1 and 3:
    the source folder's shard, 2 and 4: the destination's) and is restarted: the
    file ends under exactly one of its two names, the name it replaced either kept
    or gone with its data, nothing left half-done, fsck clean."""
    once = str(tmp_path / "stopped-once")
    sc = make_xc({"STOKER_TEST_XSHARD_STOP": "rename:%d:%s" % (step, once)})
    c = stoker_pkg.connect(sc.url)
    try:
        two_folders(sc, c)
        c.write_file("/a/f", b"moving")
        c.write_file("/b/f", b"replaced")
        ino, old = c.stat("/a/f").st_ino, c.stat("/b/f").st_ino
        try:
            c.rename("/a/f", "/b/f")
            told = "ok"
        except OSError as e:
            told = e.errno
        sc.wait("the stop at step %d" % step, lambda: stopped(sc, "rename", step))
        deadline = time.time() + 60
        moved = None
        while moved is None and time.time() < deadline:
            try:
                moved = renamed_where(sc, c, ino, old)
            except (AssertionError, OSError):
                moved = None
            if moved is None:
                time.sleep(0.5)
        assert moved is not None, (told, sc.held(1), sc.held(2), sc.logs())
        if told == "ok":
            assert moved, told
        want = {1: "(intent 2) given up", 3: "renamed here for shard 1's intent 2: kept"}.get(step)
        assert want is None or logged(sc, want), sc.logs()
        if moved:
            assert c.read_file("/b/f") == b"moving"
            wait_until(lambda: gone(sc, old), timeout=30)
            c.rename("/b/f", "/a/f")  # and back: no node stops again (the FILE made)
        else:
            assert c.read_file("/b/f") == b"replaced"
            c.remove("/b/f")
        assert c.read_file("/a/f") == b"moving" and c.stat("/a/f").st_ino == ino
        assert c.listdir("/b") == []
    finally:
        c.close()
    wait_until(lambda: sc.held(1)[1:] == (0, 0, 0) and sc.held(2)[1:] == (0, 0, 0), timeout=30)
    p = sc.cli("fsck", check=False)
    assert p.returncode == 0, p.stdout + p.stderr


@pytest.mark.parametrize("op,step,dies", [("mkdir", 3, 1), ("rmdir", 2, 2)])
def test_leader_lost_at_a_step_its_follower_settles(make_xc, tmp_path, op, step, dies):
    """Two replicas a shard: the leader completing step K dies and stays down (the
    supervisor held); its follower, which held that step before the next began,
    takes over, and the namespace settles as after a restart."""
    once = str(tmp_path / "stopped-once")  # not again on the follower that takes over
    sc = make_xc({"STOKER_TEST_XSHARD_STOP": "%s:%d:%s" % (op, step, once)}, replicas=2)
    m = sc.wait("two shards of two replicas each", lambda: (
        lambda s: s if len(s) == 2 and all(sorted(v["roles"].values()) == ["follower", "leader"]
                                           for v in s.values()) else None)(sc.shard_map()))
    # only a follower holding its leader's copy may be promoted
    for logs in (("meta", "meta1"), ("meta2", "meta3")):
        sc.wait("%s: the follower copied" % (logs,), lambda: any(
            "has the copy" in open(os.path.join(sc.data, "log", n + ".log")).read()
            for n in logs))
    sc.cli("shard", "pin", "/", "2")
    c = stoker_pkg.connect(sc.url)
    sup = sc.supervisor()
    try:
        before = sc.held(2)[0]
        if op == "rmdir":
            c.makedirs("/d")
        lost = leader_of(m[dies])
        os.kill(sup, signal.SIGSTOP)
        try:
            try:
                if op == "mkdir":
                    c.makedirs("/d")
                else:
                    c.rmdir("/d")
            except OSError:
                pass
            sc.wait("the stop at step %d" % step, lambda: stopped(sc, op, step))
            sc.wait("shard %d's follower promoted" % dies, lambda: (
                lambda s: s[dies]["roles"].get(lost) != "leader" and
                "leader" in s[dies]["roles"].values())(sc.shard_map()), timeout=30)
            exists = wait_settled(sc, c, "d", before)
            if exists:
                c.write_file("/d/f", b"after")
                assert c.read_file("/d/f") == b"after"
                c.remove("/d/f")
                c.rmdir("/d")
            assert wait_settled(sc, c, "d", before) is False
        finally:
            os.kill(sup, signal.SIGCONT)
    finally:
        c.close()


def xfsck(sc, *args):
    p = sc.cli("fsck", "--json", *args, check=False)
    assert p.returncode in (0, 1) and p.stdout, p.stdout + p.stderr
    out = json.loads(p.stdout)
    assert out["clean"] == (p.returncode == 0), out
    return out


def fsck_clean_under(sc, churn, tags, stop, runs=((), (), ()), ready=None, pause=0):
    """`stoker fsck` once per args of runs while churn(tag) runs in a thread per tag
    (after ready() holds, when given): each run clean. stop is set and the threads
    joined afterwards whatever happened; the runs' outputs are returned."""
    threads = [threading.Thread(target=churn, args=(t,)) for t in tags]
    for t in threads:
        t.start()
    outs = []
    try:
        if ready:
            sc.wait("the workload to run", ready)
        for args in runs:
            outs.append(xfsck(sc, *args))
            assert outs[-1]["clean"], outs[-1]
            time.sleep(pause)
    finally:
        stop.set()
        for t in threads:
            t.join(120)
    return outs


def test_fsck_checks_and_repairs_shard_2(make_xc):
    """fsck checks every shard: problems planted in shard 2's store and a chunk of an
    inode shard 2 never had are found and reported under shard 2, --repair fixes
    them and loses none of shard 2's files; a chunk of a shard the cluster does not
    have is left alone."""
    from test_fsck import PLANT, chunk_path, plant_chunk
    sc = make_xc()
    sc.cli("shard", "pin", "/", "2")
    c = stoker_pkg.connect(sc.url)
    try:
        c.mkdir("/d")
        keep = os.urandom(3 * (1 << 20) + 5)
        c.write_file("/d/keep", keep)
        c.write_file("/d/small", b"small")
        c.write_file("/d/dangling", os.urandom(2 << 20))
        c.write_file("/d/unreached", os.urandom((1 << 20) + 1))
        c.write_file("/top", b"shard one")
        ino = {p: c.stat(p).st_ino for p in ("/d", "/d/keep", "/d/small", "/d/dangling",
                                             "/d/unreached", "/top")}
    finally:
        c.close()
    assert shard_of(ino["/top"]) == 1
    assert all(shard_of(ino[p]) == 2 for p in ino if p != "/top"), ino
    text = sc.cli("fsck").stdout
    assert re.search(rb"^shard 2: \d+ inodes, \d+ entries, 2 folders, 4 files; clean$", text,
                     re.M), text
    assert b"clean: no problem found" in text, text
    target = os.path.join(sc.data, "targets", "0")
    src = chunk_path(target, ino["/d/keep"], 0)
    ghost2 = (1 << 48) + 777777  # shard 2's number, an inode it never had
    ghost9 = (8 << 48) + 5       # shard 9's: the cluster has no shard 9
    planted2 = plant_chunk(src, target, ghost2, 0)
    planted9 = plant_chunk(src, target, ghost9, 0)
    sc.down()
    store = os.path.join(sc.data, "meta1", "meta")
    run([PLANT, store, "drop-inode", str(ino["/d/dangling"])])
    run([PLANT, store, "drop-entry", str(ino["/d"]), "unreached"])
    run([PLANT, store, "set-nlink", str(ino["/d/small"]), "3"])
    sc.up()
    sc.wait("shard 2 to serve", lambda: xfsck(sc)["shards"][1]["inodes"], timeout=60)
    out = xfsck(sc, "--grace", "0")
    got = {(p["kind"], p["ino"]) for p in out["list"]}
    want = {("dangling-entry", ino["/d/dangling"]), ("unreached-inode", ino["/d/unreached"]),
            ("link-count", ino["/d/small"]), ("garbage", ghost2),
            ("garbage", ino["/d/dangling"])}  # its record went without a purge
    assert got == want, out
    assert not any(p["repaired"] for p in out["list"])
    sh = {s["shard"]: s for s in out["shards"]}
    assert sh[1]["problems"] == 0 and sh[2]["problems"] == sh[2]["remaining"] == 5, out
    text = sc.cli("fsck", "--grace", "0", check=False)
    assert text.returncode == 1
    assert b"shard 1: " in text.stdout and b"shard 2: " in text.stdout, text.stdout
    assert re.search(rb"^shard 2: .*; 5 problem\(s\), 5 left$", text.stdout, re.M), text.stdout
    out = xfsck(sc, "--repair", "--grace", "0")
    assert out["clean"] and all(p["repaired"] for p in out["list"]), out
    # The unreached file is never freed: it went into a folder of shard 2 that
    # shard 1's lost+found names (an entry of shard 1 names no file of shard 2).
    lost = [p for p in out["list"] if p["kind"] == "unreached-inode"]
    assert len(lost) == 1 and lost[0]["name"].endswith("/#%d" % ino["/d/unreached"]), out
    assert not os.path.exists(planted2)
    assert os.path.exists(planted9)  # no shard to ask about it: left alone
    out = xfsck(sc, "--grace", "0")
    assert out["clean"] and out["list"] == [], out
    c = stoker_pkg.connect(sc.url)
    try:
        assert sorted(c.listdir("/d")) == ["keep", "small"]
        assert c.read_file("/d/keep") == keep
        assert c.read_file("/d/small") == b"small"
        assert c.stat("/d/small").st_nlink == 1
        assert c.read_file("/top") == b"shard one"
        assert c.stat("/lost+found/" + lost[0]["name"]).st_size == (1 << 20) + 1
        holder = c.stat("/lost+found/" + lost[0]["name"].split("/")[0])
        assert shard_of(holder.st_ino) == 2 and (holder.st_mode & 0o7777) == 0o700
    finally:
        c.close()


def test_fsck_checks_names_of_files_off_their_home(make_xc):
    """Names of files off their home shard against their records, damaged in the
    stores: a name whose home lost its 'X' record, a name whose shard lost its 'R'
    record, 'X' records whose name (and 'R') its shard lost, one of them a
    file's last link, and a name of a file gone from its home (with its 'X', and
    without it: the 'X' of a file the home lacks goes too). Each is reported
    with nothing changed (the file whose home
    lost its record is not called unreached there); --repair writes the records
    again, drops the stale ones with their link (the last link's file freed as
    an unlink would) and the dangling names; a second run is clean, and unlinking the restored names
    releases them at home as it should."""
    from test_fsck import PLANT
    sc = make_xc()
    c = stoker_pkg.connect(sc.url)
    try:
        two_folders(sc, c)
        b = c.stat("/b").st_ino
        names = ("moved", "linked", "stale", "last", "ghost", "ghost2", "lo")
        for n in names:
            c.write_file("/a/" + n, n.encode() * 100)
        c.rename("/a/moved", "/b/moved")
        ino = {n: c.stat(("/b/" if n == "moved" else "/a/") + n).st_ino for n in names}
        a = c.stat("/a").st_ino
        assert ino_link(sc, ino["linked"], b, "l") == "OK"
        assert ino_link(sc, ino["stale"], b, "s") == "OK"
        assert ino_link(sc, ino["last"], b, "t") == "OK"
        assert ino_link(sc, ino["ghost"], b, "gh") == "OK"
        assert ino_link(sc, ino["ghost2"], b, "gh2") == "OK"
        assert ino_link(sc, ino["lo"], b, "lo") == "OK"
        c.remove("/a/last")  # its one name is off its home now
        assert all(shard_of(i) == 1 for i in ino.values()), ino
    finally:
        c.close()
    wait_until(lambda: sc.held(1)[1:] == (0, 0, 0) and sc.held(2)[1:] == (0, 0, 0), timeout=30)
    assert xfsck(sc)["clean"]
    sc.down()
    one, two = (os.path.join(sc.data, d, "meta") for d in ("meta", "meta1"))
    run([PLANT, one, "drop-xrec", "X", str(ino["moved"])])
    # a file gone from its home with its record: both its names dangle
    run([PLANT, one, "drop-inode", str(ino["ghost"])])
    run([PLANT, one, "drop-xrec", "X", str(ino["ghost"])])
    run([PLANT, one, "drop-inode", str(ino["ghost2"])])  # its 'X' left
    run([PLANT, two, "drop-xrec", "R", str(ino["linked"])])
    run([PLANT, two, "drop-entry", str(b), "s"])  # its 'R' left over
    run([PLANT, two, "drop-entry", str(b), "t"])
    run([PLANT, two, "drop-xrec", "R", str(ino["last"])])
    # a name gone on both sides but for shard 2's 'R' (the home's link count, 2, its own check's)
    run([PLANT, two, "drop-entry", str(b), "lo"])
    run([PLANT, one, "drop-xrec", "X", str(ino["lo"])])
    sc.up()
    sc.wait("both shards to serve", lambda: len(xfsck(sc)["shards"]) == 2, timeout=60)
    out = xfsck(sc)
    got = {(p["kind"], p["ino"], p["parent"], p["name"], p["expect"], p["found"])
           for p in out["list"]}
    assert got == {("name-off-home", ino["moved"], b, "moved", 1, 1),
                   ("name-off-home", ino["linked"], b, "l", 2, 1),
                   ("stale-name-record", ino["stale"], 0, "", 1, 2),
                   ("stale-name-record", ino["last"], 0, "", 0, 2),
                   ("dangling-entry", ino["ghost"], b, "gh", 0, 0),
                   ("dangling-entry", ino["ghost"], a, "ghost", 0, 0),
                   ("dangling-entry", ino["ghost2"], b, "gh2", 0, 0),
                   ("dangling-entry", ino["ghost2"], a, "ghost2", 0, 0),
                   ("stale-name-record", ino["ghost2"], 0, "", 0, 2),
                   ("stale-name-record", ino["lo"], 0, "", 2, 1),
                   ("link-count", ino["lo"], 0, "", 1, 2)}, out
    assert not any(p["repaired"] for p in out["list"])
    sh = {s["shard"]: s for s in out["shards"]}
    assert (sh[1]["problems"], sh[2]["problems"]) == (6, 5), out
    text = sc.cli("fsck", check=False).stdout
    assert b"name off home: 'moved' in folder %d names file %d of shard 1, which does not " \
        b"count it" % (b, ino["moved"]) in text, text
    assert b"stale name record: file %d counts a name on shard 2, which that shard does not " \
        b"have (it keeps a leftover record of it)" % ino["stale"] in text, text
    c = stoker_pkg.connect(sc.url)
    try:
        assert c.stat("/a/stale").st_nlink == 2 and not c.exists("/lost+found")
    finally:
        c.close()
    out = xfsck(sc, "--repair")
    assert out["clean"] and len(out["list"]) == 11 and all(p["repaired"] for p in out["list"]), out
    out = xfsck(sc)
    assert out["clean"] and out["list"] == [], out
    wait_until(lambda: gone(sc, ino["last"]), timeout=30)
    c = stoker_pkg.connect(sc.url)
    try:
        assert c.read_file("/b/moved") == b"moved" * 100 and c.stat("/b/moved").st_nlink == 1
        assert c.stat("/a/linked").st_nlink == 2 and c.read_file("/b/l") == b"linked" * 100
        assert c.stat("/a/stale").st_nlink == 1 and c.read_file("/a/stale") == b"stale" * 100
        assert sorted(c.listdir("/b")) == ["l", "moved"] and not c.exists("/lost+found")
        assert sorted(c.listdir("/a")) == ["linked", "lo", "stale"]
        assert c.stat("/a/lo").st_nlink == 1
        assert ino_link(sc, ino["lo"], b, "lo") == "OK"  # no record left on shard 2
        c.remove("/b/lo")
        # the leftover 'R' went too: the file takes a name off home again
        assert ino_link(sc, ino["stale"], b, "s2") == "OK" and c.stat("/a/stale").st_nlink == 2
        c.remove("/b/s2")
        wait_until(lambda: c.stat("/a/stale").st_nlink == 1, timeout=30)
        # the records written again are the protocol's own: the names release at home
        c.remove("/b/l")
        wait_until(lambda: c.stat("/a/linked").st_nlink == 1, timeout=30)
        c.remove("/b/moved")
        wait_until(lambda: gone(sc, ino["moved"]), timeout=30)
    finally:
        c.close()
    wait_until(lambda: sc.held(1)[1:] == (0, 0, 0) and sc.held(2)[1:] == (0, 0, 0), timeout=30)
    out = xfsck(sc)
    assert out["clean"] and out["list"] == [], out


def rename_in_thread(sc, src, dst, told):
    """A thread, started, that renames src to dst with a client of its own and
    appends "OK" or the errno to told."""
    def rename():
        c = stoker_pkg.connect(sc.url)
        try:
            c.rename(src, dst)
            told.append("OK")
        except OSError as e:
            told.append(e.errno)
        finally:
            c.close()

    t = threading.Thread(target=rename)
    t.start()
    return t


def test_fsck_leaves_a_rename_held_mid_protocol_alone(make_xc, tmp_path):
    """A rename across shards held between its steps 2 and 3 (STOKER_TEST_XSHARD_HOLD:
    shard 1's intent, shard 2's entry naming the file and its mark keeping what the
    entry replaced): fsck reports it in progress and nothing else, and --repair
    changes nothing there; once let go the rename completes and fsck is clean."""
    hold = tmp_path / "hold"
    sc = make_xc({"STOKER_TEST_XSHARD_HOLD": "rename:%s" % hold})
    c = stoker_pkg.connect(sc.url)
    told = []
    try:
        two_folders(sc, c)
        c.write_file("/a/f", b"moving")
        c.write_file("/b/g", b"replaced")
        f, g = c.stat("/a/f").st_ino, c.stat("/b/g").st_ino
        hold.write_bytes(b"")
        t = rename_in_thread(sc, "/a/f", "/b/g", told)
        try:
            wait_until(lambda: sc.held(1)[1:] == (1, 0, 0) and sc.held(2)[1:] == (0, 1, 0),
                       timeout=30, what="the rename to be held after its step 2")
            for args in ((), ("--repair",)):
                out = xfsck(sc, *args)
                assert out["clean"] and out["list"] == [], out
                assert out["in_progress"] >= 1, out
                assert sc.held(1)[1:] == (1, 0, 0) and sc.held(2)[1:] == (0, 1, 0)
            text = sc.cli("fsck").stdout
            assert b"in progress: " in text and b"left to its protocol" in text, text
            assert b"clean: no problem found" in text, text
            # both names the file's meanwhile; what the new one replaced kept till step 4
            assert c.stat("/a/f").st_ino == f and c.stat("/b/g").st_ino == f
            assert not c.exists("/lost+found")
        finally:
            hold.unlink()
            t.join(timeout=60)
        assert told == ["OK"], told
        assert c.stat("/b/g").st_ino == f and not c.exists("/a/f")
        assert c.read_file("/b/g") == b"moving"
        wait_until(lambda: gone(sc, g), timeout=30)
    finally:
        c.close()
    wait_until(lambda: sc.held(1)[1:] == (0, 0, 0) and sc.held(2)[1:] == (0, 0, 0), timeout=30)
    out = xfsck(sc)
    assert out["clean"] and out["list"] == [] and out["in_progress"] == 0, out


@pytest.mark.skipif(not have_fuse(), reason="no FUSE")
def test_an_undone_rename_is_seen_at_once_through_a_mount(make_xc, tmp_path):
    """A file going home from shard 2 over a name of shard 1, its rename given up
    after its step 2 (STOKER_TEST_XSHARD_HOLD rename-undo: shard 1 undoes its new
    entry): a mount that looked the name up meanwhile, its answer cached under
    shard 1's lease, sees the name's old file as soon as the undo is done, not the
    moved one until the lease runs out (30 s)."""
    hold = tmp_path / "hold"
    sc = make_xc({"STOKER_TEST_XSHARD_HOLD": "rename-undo:%s" % hold})
    c = stoker_pkg.connect(sc.url)
    try:
        two_folders(sc, c)
        c.write_file("/a/f", b"moving")
        c.rename("/a/f", "/b/f")  # off its home: back home below
        c.write_file("/a/g", b"replaced")
        f, g = c.stat("/b/f").st_ino, c.stat("/a/g").st_ino
    finally:
        c.close()
    # no kernel caching: what the mount answers is what its lookup cache holds
    m = Mount(sc, tmp_path / "mnt", opts=["entry_timeout=0", "attr_timeout=0"])
    m.start()
    told = []
    t = None
    try:
        mg = os.path.join(m.path, "a", "g")
        assert os.stat(mg).st_ino == g
        hold.write_bytes(b"")
        t = rename_in_thread(sc, "/b/f", "/a/g", told)
        wait_until(lambda: sc.held(2)[1:] == (1, 0, 0) and sc.held(1)[1:] == (0, 1, 0),
                   timeout=30, what="the rename to be held after its step 2")
        for _ in range(3):  # both names the file's meanwhile, and the mount knows it
            assert os.stat(mg).st_ino == f
        hold.unlink()
        t.join(timeout=60)
        assert told == [errno.EIO], told
        assert os.stat(mg).st_ino == g
        with open(mg, "rb") as fh:
            assert fh.read() == b"replaced"
        assert os.stat(os.path.join(m.path, "b", "f")).st_ino == f
    finally:
        if hold.exists():
            hold.unlink()
        if t:
            t.join(timeout=60)
        m.stop()
    wait_until(lambda: sc.held(1)[1:] == (0, 0, 0) and sc.held(2)[1:] == (0, 0, 0), timeout=30)
    out = xfsck(sc)
    assert out["clean"] and out["list"] == [], out


def test_a_release_waiting_for_its_home_is_counted(make_xc):
    """A name off home unlinked while its home's meta is down: the shard that had
    the name keeps a release to tell the home, which `stk_check xshard` counts;
    once the home is back the release goes and the file's link with it."""
    sc = make_xc()
    c = stoker_pkg.connect(sc.url)
    try:
        two_folders(sc, c)
        b = c.stat("/b").st_ino
        c.write_file("/a/f", b"f")
        ino = c.stat("/a/f").st_ino
        assert ino_link(sc, ino, b, "l") == "OK" and c.stat("/a/f").st_nlink == 2
    finally:
        c.close()
    assert sc.held(2)[1:] == (0, 0, 0)
    sup = sc.supervisor()
    os.kill(sup, signal.SIGSTOP)  # shard 1's meta stays down once killed
    try:
        pid1 = sc.meta_pid(sc.meta_addr(1))
        assert pid1
        os.kill(pid1, signal.SIGKILL)
        wait_until(lambda: sc.meta_pid(sc.meta_addr(1)) is None, timeout=30)
        p = run([CHECK, "ino", sc.url, "unlink", str(b), "l"], check=False, env=sc.env(),
                timeout=60)
        assert p.stdout.strip() == b"OK", p.stdout + p.stderr
        assert sc.held(2)[1:] == (0, 0, 1), sc.held(2)
    finally:
        os.kill(sup, signal.SIGCONT)
    wait_until(lambda: sc.held(2)[1:] == (0, 0, 0), timeout=60, what="the release told")
    c = stoker_pkg.connect(sc.url)
    try:
        wait_until(lambda: c.stat("/a/f").st_nlink == 1, timeout=30)
    finally:
        c.close()
    assert xfsck(sc)["clean"]


def test_fsck_of_two_shards_under_a_writer_is_clean(make_xc):
    """A writer, renamer and unlinker on both shards: fsck, with and without a grace
    period, finds nothing, and --repair removes nothing of shard 2's files."""
    sc = make_xc()
    sc.cli("shard", "pin", "/", "2")
    c = stoker_pkg.connect(sc.url)
    stop = threading.Event()
    errors, done = [], []

    def churn(folder):
        i = 0
        try:
            while not stop.is_set():
                p = "%s/f%d" % (folder, i % 6)
                c.write_file(p, os.urandom((i % 4) * (1 << 19) + 1))
                if i % 3 == 0:
                    c.rename(p, "%s/renamed" % folder)
                elif i % 3 == 1:
                    c.unlink(p)
                i += 1
                done.append(1)
        except Exception as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    try:
        c.mkdir("/two")     # on shard 2 (pinned)
        c.write_file("/two/stays", b"stays on shard 2")
        sc.cli("shard", "unpin", "/")
        c.mkdir("/one")     # on shard 1
        assert shard_of(c.stat("/two").st_ino) == 2 and shard_of(c.stat("/one").st_ino) == 1
        outs = fsck_clean_under(sc, churn, ("/one", "/two"), stop,
                                ((), ("--grace", "0"), ("--grace", "0", "--repair")),
                                ready=lambda: len(done) > 10)
        for out in outs:
            assert out["list"] == [] and [s["shard"] for s in out["shards"]] == [1, 2], out
        assert not errors, errors
        assert c.read_file("/two/stays") == b"stays on shard 2"
    finally:
        c.close()


def test_fsck_finds_folders_named_across_shards_that_do_not_match(make_xc):
    """An entry on shard 1 naming a folder shard 2 does not have is a dangling entry
    of shard 1 (--repair drops it and its parent's link); a folder on shard 2 that
    no entry on shard 1 names is an unreached folder of shard 2 (reattached under
    shard 1's lost+found, never removed); the folder beside them and its files
    stay whole."""
    from test_fsck import PLANT
    sc = make_xc()
    sc.cli("shard", "pin", "/", "2")
    c = stoker_pkg.connect(sc.url)
    try:
        for d in ("/x", "/y", "/keep"):
            c.mkdir(d)
        c.write_file("/keep/f", b"kept")
        c.mkdir("/keep/sub")
        ino = {p: c.stat(p).st_ino for p in ("/x", "/y", "/keep")}
        assert all(shard_of(i) == 2 for i in ino.values()), ino
    finally:
        c.close()
    out = xfsck(sc, "--grace", "0")
    assert out["clean"] and out["list"] == [], out
    sc.down()
    run([PLANT, os.path.join(sc.data, "meta1", "meta"), "drop-inode", str(ino["/x"])])
    run([PLANT, os.path.join(sc.data, "meta", "meta"), "drop-entry", "1", "y"])
    sc.up()
    sc.wait("both shards to serve", lambda: len(xfsck(sc)["shards"]) == 2, timeout=60)
    out = xfsck(sc)
    got = {(p["kind"], p["ino"], p["parent"], p["name"]) for p in out["list"]}
    assert got == {("dangling-entry", ino["/x"], 1, "x"), ("unreached-inode", ino["/y"], 1, ""),
                   ("link-count", 1, 0, "")}, out  # the root counted /y
    sh = {s["shard"]: s for s in out["shards"]}
    assert (sh[1]["problems"], sh[2]["problems"]) == (2, 1), out
    text = sc.cli("fsck", check=False).stdout
    assert re.search(rb"^shard 1: .*; 2 problem\(s\), 2 left$", text, re.M), text
    assert re.search(rb"^shard 2: .*; 1 problem\(s\), 1 left$", text, re.M), text
    out = xfsck(sc, "--repair")
    fixed = {p["kind"]: p["repaired"] for p in out["list"]}
    assert fixed == {"dangling-entry": True, "unreached-inode": True, "link-count": True}, out
    assert out["remaining"] == 0
    out = xfsck(sc)
    assert out["clean"] and out["list"] == [], out
    assert sc.held(2)[0] >= 4  # /y and /keep's folders are still there
    c = stoker_pkg.connect(sc.url)
    try:
        # /y reattached under shard 1's lost+found, never removed
        assert sorted(c.listdir("/")) == ["keep", "lost+found"]
        assert c.listdir("/lost+found") == ["#%d" % ino["/y"]]
        assert c.stat("/").st_nlink == 4
        assert c.read_file("/keep/f") == b"kept"
        assert sorted(c.listdir("/keep")) == ["f", "sub"]
    finally:
        c.close()


def test_fsck_reattaches_folders_and_sets_parent_pointers_across_shards(make_xc):
    """Folders of shard 2 that no name reaches, one whose parent is on shard 1 and one
    whose parent is on shard 2, are reported, then reattached with their contents
    under shard 1's /lost+found; a file of shard 2 that no name reaches goes into a
    folder of shard 2 that lost+found names; folders of shard 2 whose parent pointer is not the folder on shard 1
    whose entry names them (pointing at shard 1 or at shard 2) are reported and
    set; nothing changes without --repair, and a second run finds nothing more."""
    from test_fsck import PLANT
    sc = make_xc()
    sc.cli("shard", "pin", "/", "2")
    deep = os.urandom((1 << 20) + 3)
    c = stoker_pkg.connect(sc.url)
    try:
        for d in ("/y", "/y/in", "/d", "/d/sub", "/p", "/q"):
            c.mkdir(d)
        c.write_file("/y/in/f", deep)
        c.write_file("/y/g", b"g")
        c.write_file("/d/sub/f", b"sub's")
        c.write_file("/d/loose", b"loose")
        c.write_file("/p/f", b"p's")
        sc.cli("shard", "unpin", "/")
        c.mkdir("/one")
        ino = {p: c.stat(p).st_ino for p in ("/y", "/d", "/d/sub", "/d/loose", "/p", "/q",
                                             "/one")}
    finally:
        c.close()
    assert shard_of(ino["/one"]) == 1
    assert all(shard_of(ino[p]) == 2 for p in ino if p != "/one"), ino
    sc.down()
    one, two = (os.path.join(sc.data, m, "meta") for m in ("meta", "meta1"))
    run([PLANT, one, "drop-entry", "1", "y"])
    run([PLANT, two, "drop-entry", str(ino["/d"]), "sub"])
    run([PLANT, two, "drop-entry", str(ino["/d"]), "loose"])
    run([PLANT, two, "set-parent", str(ino["/q"]), str(ino["/one"])])  # at shard 1
    run([PLANT, two, "set-parent", str(ino["/p"]), str(ino["/d"])])    # at shard 2
    sc.up()
    sc.wait("both shards to serve", lambda: len(xfsck(sc)["shards"]) == 2, timeout=60)
    want = {("link-count", 1), ("link-count", ino["/d"]),  # each lost a subfolder's entry
            ("unreached-inode", ino["/y"]), ("unreached-inode", ino["/d/sub"]),
            ("unreached-inode", ino["/d/loose"]),
            ("unreached-inode", ino["/p"]),  # to shard 2's own check: its pointer is there
            ("parent-pointer", ino["/q"]), ("parent-pointer", ino["/p"])}
    out = xfsck(sc)
    assert {(p["kind"], p["ino"]) for p in out["list"]} == want, out
    assert not any(p["repaired"] for p in out["list"]), out
    pp = {p["ino"]: (p["expect"], p["found"]) for p in out["list"]
          if p["kind"] == "parent-pointer"}
    assert pp == {ino["/q"]: (1, ino["/one"]), ino["/p"]: (1, ino["/d"])}, out
    c = stoker_pkg.connect(sc.url)
    try:
        assert not c.exists("/lost+found")
    finally:
        c.close()
    text = sc.cli("fsck", check=False).stdout
    assert re.search(rb"parent pointer: folder %d points at %d, its entry is in 1$" % (
        ino["/q"], ino["/one"]), text, re.M), text
    out = xfsck(sc, "--repair")
    assert out["clean"] and all(p["repaired"] for p in out["list"]), out
    assert {(p["kind"], p["ino"]) for p in out["list"]} == want, out
    names = {p["ino"]: p["name"] for p in out["list"] if p["kind"] == "unreached-inode"
             and p["ino"] != ino["/p"]}
    loose = names.pop(ino["/d/loose"])
    assert names == {ino["/y"]: "#%d" % ino["/y"], ino["/d/sub"]: "#%d" % ino["/d/sub"]}, out
    assert re.fullmatch(r"#\d+/#%d" % ino["/d/loose"], loose), loose
    out = xfsck(sc)
    assert out["clean"] and out["list"] == [], out
    c = stoker_pkg.connect(sc.url)
    try:
        st = c.stat("/lost+found")
        assert shard_of(st.st_ino) == 1 and (st.st_mode & 0o7777) == 0o700 and st.st_uid == 0
        y, sub = "/lost+found/#%d" % ino["/y"], "/lost+found/#%d" % ino["/d/sub"]
        assert sorted(c.listdir("/lost+found")) == sorted([y[12:], sub[12:],
                                                           loose.split("/")[0]])
        assert st.st_nlink == 5
        assert c.read_file(y + "/in/f") == deep and c.read_file(y + "/g") == b"g"
        assert c.read_file(sub + "/f") == b"sub's"
        assert c.read_file("/lost+found/" + loose) == b"loose"
        assert c.read_file("/p/f") == b"p's"
        assert sorted(c.listdir("/")) == ["d", "lost+found", "one", "p", "q"]
        assert sorted(c.listdir("/d")) == []
        # a folder made in a reattached one lands on its shard, as before
        c.mkdir(y + "/new")
        assert shard_of(c.stat(y + "/new").st_ino) == 2
    finally:
        c.close()
    # "..", as meta answers it from the parent pointers
    c = stoker_pkg.connect(sc.url)
    try:
        lf = c.stat("/lost+found").st_ino
    finally:
        c.close()
    for d, up in ((ino["/q"], 1), (ino["/p"], 1), (ino["/y"], lf), (ino["/d/sub"], lf)):
        p = run([CHECK, "ino", sc.url, "parent", str(d)], env=sc.env(), check=False)
        assert p.stdout.split(b"\n")[0] == b"ino %d" % up, (d, p.stdout, p.stderr)
    text = sc.cli("fsck").stdout
    assert b"clean: no problem found" in text, text
    # A crash between B's pointer and A's entry (of a folder, of the folder that
    # gathered B's files) leaves folders of shard 2 pointing at lost+found that no
    # name reaches: the next repair reattaches them, their files whole.
    holder = loose.split("/")[0]
    sc.down()
    run([PLANT, one, "drop-entry", str(lf), "#%d" % ino["/y"]])
    run([PLANT, one, "drop-entry", str(lf), holder])
    sc.up()
    sc.wait("both shards to serve", lambda: len(xfsck(sc)["shards"]) == 2, timeout=60)
    out = xfsck(sc, "--repair")
    assert {(p["kind"], p["ino"], p["repaired"]) for p in out["list"]} == {
        ("unreached-inode", ino["/y"], True), ("unreached-inode", int(holder[1:]), True),
        ("link-count", lf, True)}, out
    out = xfsck(sc)
    assert out["clean"] and out["list"] == [], out
    c = stoker_pkg.connect(sc.url)
    try:
        assert c.read_file(y + "/in/f") == deep
        assert c.read_file("/lost+found/" + loose) == b"loose"
    finally:
        c.close()


def test_fsck_under_cross_shard_mkdir_and_rmdir_is_clean(make_xc):
    """Cross-shard mkdir and rmdir running all along: the entries and folders the
    protocol has in flight are never reported, and --repair touches none."""
    sc = make_xc()
    sc.cli("shard", "pin", "/", "2")
    c = stoker_pkg.connect(sc.url)
    stop = threading.Event()
    errors, done = [], []

    def churn(tag):
        i = 0
        try:
            while not stop.is_set():
                p = "/%s%d" % (tag, i % 4)
                c.mkdir(p)
                if i % 2:
                    c.rmdir(p)
                else:  # within its parent: its entry moves (a name never taken)
                    c.rename(p, "/%s-kept%d" % (tag, i))
                i += 1
                done.append(1)
        except Exception as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    try:
        # more than one page (1024) of entries naming folders of shard 2
        for i in range(1100):
            c.mkdir("/many%d" % i)
        out = xfsck(sc)
        assert out["clean"] and out["list"] == [], out
        assert out["shards"][1]["dirs"] >= 1100, out
        outs = fsck_clean_under(sc, churn, ("a", "b"), stop, ((), ("--repair",), ()),
                                ready=lambda: len(done) > 10)
        assert all(out["list"] == [] for out in outs), outs
        assert not errors, errors
        assert len(done) > 20
        out = xfsck(sc)
        assert out["clean"] and out["list"] == [], out
    finally:
        c.close()


def test_fsck_under_renames_across_shards_is_clean(make_xc):
    """Two clients rename files back and forth between folders of two shards, over
    each other's names, write them and unlink and remake them, while fsck runs:
    fsck finds nothing at any time (each shard's counts hold between any two
    steps), every file ends under one name with its own data, and nothing is left
    held once the clients stop."""
    sc = make_xc()
    c = stoker_pkg.connect(sc.url)
    try:
        two_folders(sc, c)
    finally:
        c.close()
    stop = threading.Event()
    errors, moved = [], []

    def churn(tag):
        cl = stoker_pkg.connect(sc.url)
        try:
            i = 0
            while not stop.is_set():
                i += 1
                name = "%s%d" % (tag, i % 4)
                a, b = "/a/" + name, "/b/" + name
                try:
                    cl.write_file(a, b"%s %d" % (tag.encode(), i))
                    cl.rename(a, "/b/shared" if i % 3 == 0 else b)
                    if i % 3 != 0:
                        assert cl.read_file(b) == b"%s %d" % (tag.encode(), i)
                        cl.rename(b, a if i % 2 else "/a/shared")
                    moved.append(tag)
                    if i % 5 == 0:
                        cl.remove("/b/shared")
                except (FileNotFoundError, FileExistsError):
                    pass  # the other client's name, taken or gone meanwhile
                except OSError as e:
                    if e.errno != errno.EBUSY:  # a file in the other's rename
                        errors.append(repr(e))
                except AssertionError as e:
                    errors.append(repr(e))
        finally:
            cl.close()

    fsck_clean_under(sc, churn, ("p", "q"), stop, pause=1)
    assert not errors, errors[:5]
    assert moved.count("p") > 5 and moved.count("q") > 5, len(moved)
    wait_until(lambda: sc.held(1)[1:] == (0, 0, 0) and sc.held(2)[1:] == (0, 0, 0), timeout=30)
    c = stoker_pkg.connect(sc.url)
    try:
        for folder in ("/a", "/b"):
            for n in c.listdir(folder):
                data = c.read_file("%s/%s" % (folder, n))
                assert re.match(rb"^[pq] \d+$", data), (folder, n, data)
    finally:
        c.close()
    out = xfsck(sc)
    assert out["clean"], out
    out = xfsck(sc, "--repair", "--grace", "0")
    assert out["clean"], out


def ino_link(sc, ino, parent, name):
    p = run([CHECK, "ino", sc.url, "link", str(ino), str(parent), name], check=False,
            env=sc.env())
    return p.stdout.strip().decode()


def test_hard_link_across_shards(make_xc):
    """A hard link of a file of shard 1 into a folder of shard 2 (and one of shard
    2 into shard 1): both names one inode, its link count 2, a second name off its
    home EXDEV, either name unlinked first, the file gone with the last; fsck
    clean all along."""
    sc = make_xc()
    c = stoker_pkg.connect(sc.url)
    try:
        two_folders(sc, c)
        b = c.stat("/b").st_ino
        a = c.stat("/a").st_ino
        for home, there, parent in (("/a/f", "/b/l", b), ("/b/g", "/a/m", a)):
            c.write_file(home, b"linked " + home.encode())
            ino = c.stat(home).st_ino
            assert ino_link(sc, ino, parent, there.split("/")[2]) == "OK"
            st = c.stat(there)
            assert st.st_ino == ino and st.st_nlink == 2 and c.stat(home).st_nlink == 2
            assert c.read_file(there) == b"linked " + home.encode()
            assert ino_link(sc, ino, parent, "again") == "EXDEV"  # one name off home
            assert ino_link(sc, ino, parent, there.split("/")[2]) == "EEXIST"
            assert xfsck(sc)["clean"]
        # the home name first, then the last: the file goes
        c.remove("/a/f")
        assert c.stat("/b/l").st_nlink == 1 and c.read_file("/b/l") == b"linked /a/f"
        ino = c.stat("/b/l").st_ino
        c.remove("/b/l")
        wait_until(lambda: gone(sc, ino), timeout=30)
        # the name off home first: the file stays, one link
        ino = c.stat("/b/g").st_ino
        c.remove("/a/m")
        wait_until(lambda: c.stat("/b/g").st_nlink == 1, timeout=30)
        assert c.read_file("/b/g") == b"linked /b/g"
        # its home keeps no record of it now: linked across again
        assert ino_link(sc, ino, a, "m2") == "OK"
        c.remove("/b/g")
        assert c.read_file("/a/m2") == b"linked /b/g"
        c.remove("/a/m2")
        wait_until(lambda: gone(sc, ino), timeout=30)
    finally:
        c.close()
    wait_until(lambda: sc.held(1)[1:] == (0, 0, 0) and sc.held(2)[1:] == (0, 0, 0), timeout=30)
    out = xfsck(sc)
    assert out["clean"], out


@pytest.mark.parametrize("step", [1, 2, 3, 4])
def test_link_crash_at_each_step_recovers(make_xc, tmp_path, step):
    """The node completing step K of a hard link across shards dies (1 and 3: the
    new name's shard, 2 and 4: the file's) and is restarted: the file ends with
    both names and 2 links, or its one name and 1 link; nothing held, fsck clean."""
    once = str(tmp_path / "stopped-once")
    sc = make_xc({"STOKER_TEST_XSHARD_STOP": "link:%d:%s" % (step, once)})
    c = stoker_pkg.connect(sc.url)
    try:
        two_folders(sc, c)
        c.write_file("/a/f", b"linked")
        ino, b = c.stat("/a/f").st_ino, c.stat("/b").st_ino
        told = ino_link(sc, ino, b, "l")
        sc.wait("the stop at step %d" % step, lambda: stopped(sc, "link", step))

        def where():
            if sc.held(1)[1:] != (0, 0, 0) or sc.held(2)[1:] != (0, 0, 0):
                return None
            try:
                st = c.stat("/b/l")
            except FileNotFoundError:
                st = None
            n = c.stat("/a/f").st_nlink
            if st is None and n == 1:
                return False
            if st is not None and st.st_ino == ino and n == 2:
                return True
            return None

        deadline = time.time() + 60
        linked = None
        while linked is None and time.time() < deadline:
            try:
                linked = where()
            except (AssertionError, OSError):
                linked = None
            if linked is None:
                time.sleep(0.5)
        assert linked is not None, (told, sc.held(1), sc.held(2), sc.logs())
        if told == "OK":
            assert linked, told
        assert xfsck(sc)["clean"]
        if linked:
            assert c.read_file("/b/l") == b"linked"
            c.remove("/b/l")
            wait_until(lambda: c.stat("/a/f").st_nlink == 1, timeout=30)
        c.remove("/a/f")
        wait_until(lambda: gone(sc, ino), timeout=30)
    finally:
        c.close()
    out = xfsck(sc)
    assert out["clean"], out


@pytest.mark.parametrize("step,dies", [(3, 1), (2, 2)])
def test_rename_leader_lost_its_follower_settles(make_xc, tmp_path, step, dies):
    """Two replicas a shard: the leader completing step K of a rename across shards
    dies and stays down (the supervisor held); its follower, which held that step
    before the next began, takes over, and the file ends under one name."""
    once = str(tmp_path / "stopped-once")
    sc = make_xc({"STOKER_TEST_XSHARD_STOP": "rename:%d:%s" % (step, once)}, replicas=2)
    m = sc.wait("two shards of two replicas each", lambda: (
        lambda s: s if len(s) == 2 and all(sorted(v["roles"].values()) == ["follower", "leader"]
                                           for v in s.values()) else None)(sc.shard_map()))
    for logs in (("meta", "meta1"), ("meta2", "meta3")):
        sc.wait("%s: the follower copied" % (logs,), lambda: any(
            "has the copy" in open(os.path.join(sc.data, "log", n + ".log")).read()
            for n in logs))
    c = stoker_pkg.connect(sc.url)
    sup = sc.supervisor()
    try:
        two_folders(sc, c)
        c.write_file("/a/f", b"moving")
        c.write_file("/b/f", b"replaced")
        ino, old = c.stat("/a/f").st_ino, c.stat("/b/f").st_ino
        lost = leader_of(m[dies])
        os.kill(sup, signal.SIGSTOP)
        try:
            try:
                c.rename("/a/f", "/b/f")
            except OSError:
                pass
            sc.wait("the stop at step %d" % step, lambda: stopped(sc, "rename", step))
            sc.wait("shard %d's follower promoted" % dies, lambda: (
                lambda s: s[dies]["roles"].get(lost) != "leader" and
                "leader" in s[dies]["roles"].values())(sc.shard_map()), timeout=30)
            deadline = time.time() + 60
            moved = None
            while moved is None and time.time() < deadline:
                try:
                    moved = renamed_where(sc, c, ino, old)
                except (AssertionError, OSError):
                    moved = None
                if moved is None:
                    time.sleep(0.5)
            assert moved is not None, (sc.held(1), sc.held(2), sc.logs())
            if step == 3:
                assert moved  # committed before the leader died
            want = b"moving" if moved else b"replaced"
            assert c.read_file("/b/f") == want
            if moved:
                wait_until(lambda: gone(sc, old), timeout=30)
        finally:
            os.kill(sup, signal.SIGCONT)
    finally:
        c.close()
