"""Folders moved across shards (docs/meta-shards.md, "Folders moved across
shards"): a folder F (inode on shard C) moved from a folder of shard A to one of
shard B keeps its inode and everything in it on C; its entry moves from A to B,
its parent pointer on C follows, and the link counts of both parents change.

Two shards, one meta node each: /a on shard 1 and /b on shard 2 (test_meta_xshard's
two_folders). Every case of two shards is covered: A != B with C == A or C == B,
and A == B != C (a folder of another shard moved to another parent of the shard
that names it); X3Cluster adds a third shard for A != B != C. Crash-point tests
stop the node completing step K of a move (STOKER_TEST_XSHARD_STOP=rmove:K); the
concurrent test has two clients moving /a into /b and /b into /a at once, which
the folder-move lock on shard 1 orders so that no cycle is ever made; with two
replicas a shard, shard 1's leader is lost for good while the lock is held.
"""
import errno
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time

import pytest

from conftest import CHECK, STOKER, Mount, have_fuse, run, wait_until
from pyhelp import stoker as stoker_pkg
from test_meta_shards import leader_of
from test_meta_xshard import (XCluster, fsck_clean_under, gone, logged, make_xc,  # noqa: F401
                              shard_of, stopped, two_folders, xfsck)


def parent_of(sc, ino):
    """The folder `..` of folder ino names, asked of ino's shard."""
    p = run([CHECK, "ino", sc.url, "parent", str(ino)], check=False, env=sc.env())
    out = p.stdout.split()
    assert len(out) == 3 and out[0] == b"ino" and out[2] == b"OK", p.stdout + p.stderr
    return int(out[1])


def quiet(sc):
    return sc.held(1)[1:] == (0, 0, 0) and sc.held(2)[1:] == (0, 0, 0)


def fsck_clean(sc):
    wait_until(lambda: quiet(sc), timeout=30)
    out = xfsck(sc)
    assert out["clean"], out


def fill(c, path, tag):
    """A folder with a file and a subfolder holding a file."""
    c.makedirs(path + "/s")
    c.write_file(path + "/x", tag + b" x")
    c.write_file(path + "/s/y", tag + b" y")


def intact(c, sc, path, ino, tag, parent):
    st = c.stat(path)
    assert st.st_ino == ino, (path, st.st_ino, ino)
    assert sorted(c.listdir(path)) == ["s", "x"]
    assert c.read_file(path + "/x") == tag + b" x"
    assert c.read_file(path + "/s/y") == tag + b" y"
    assert st.st_nlink == 3  # ".", its entry, s's ".."
    assert parent_of(sc, ino) == c.stat(parent).st_ino


def test_folder_moved_across_shards_and_back(make_xc):
    """Each case of two shards, with contents, read back through libstoker: the
    same inode, its children intact, `..` its new parent, the link counts of both
    parents right, fsck clean."""
    sc = make_xc()
    c = stoker_pkg.connect(sc.url)
    try:
        two_folders(sc, c)
        fill(c, "/a/f", b"f")
        f = c.stat("/a/f").st_ino
        assert shard_of(f) == 1
        # A = 1, B = 2, C = 1: the folder's inode stays on shard 1, named from 2
        c.rename("/a/f", "/b/m")
        assert c.listdir("/a") == [] and c.listdir("/b") == ["m"]
        intact(c, sc, "/b/m", f, b"f", "/b")
        assert c.stat("/a").st_nlink == 2 and c.stat("/b").st_nlink == 3
        # A = 2, B = 1, C = 1: home again
        c.rename("/b/m", "/a/back")
        intact(c, sc, "/a/back", f, b"f", "/a")
        assert c.stat("/a").st_nlink == 3 and c.stat("/b").st_nlink == 2
        # a folder of shard 2: A = 2, B = 1, C = 2, then A == B = 1 != C (to
        # another parent of shard 1), then A = 1, B = 2 = C (home)
        fill(c, "/b/g", b"g")
        g = c.stat("/b/g").st_ino
        assert shard_of(g) == 2
        c.rename("/b/g", "/a/g1")
        intact(c, sc, "/a/g1", g, b"g", "/a")
        c.rename("/a/g1", "/a/back/s/g2")
        intact(c, sc, "/a/back/s/g2", g, b"g", "/a/back/s")
        assert c.stat("/a").st_nlink == 3 and c.stat("/a/back/s").st_nlink == 3
        c.rename("/a/back/s/g2", "/b/g")
        intact(c, sc, "/b/g", g, b"g", "/b")
        assert c.stat("/a/back/s").st_nlink == 2 and c.stat("/b").st_nlink == 3
        fsck_clean(sc)
        # moved while full: files written in it through its new name
        c.rename("/a/back", "/b/back")
        c.write_file("/b/back/new", b"new")
        assert c.read_file("/b/back/new") == b"new"
        assert shard_of(c.stat("/b/back/new").st_ino) == 1  # made on the folder's shard
        c.remove("/b/back/new")
        c.rename("/b/back", "/a/back")
        assert c.stat("/a").st_nlink == 3 and c.stat("/b").st_nlink == 3
        # emptied and removed through the name it was moved to, both ways
        for folder, moved in (("/a/back", "/b/gone"), ("/b/g", "/a/gone")):
            ino = c.stat(folder).st_ino
            c.rename(folder, moved)
            c.remove(moved + "/x")
            c.remove(moved + "/s/y")
            c.rmdir(moved + "/s")
            c.rmdir(moved)
            assert gone(sc, ino)
        assert c.listdir("/a") == [] and c.listdir("/b") == []
        assert c.stat("/a").st_nlink == 2 and c.stat("/b").st_nlink == 2
    finally:
        c.close()
    fsck_clean(sc)


def test_folder_moved_over_an_empty_folder_and_refusals(make_xc):
    """A folder replaces an empty folder across shards (the one replaced gone) and
    within the shard naming it; a non-empty destination is ENOTEMPTY, a file
    ENOTDIR, a folder moved into its own subtree EINVAL (across shards, at any
    depth): nothing changes on a refusal."""
    sc = make_xc()
    c = stoker_pkg.connect(sc.url)
    try:
        two_folders(sc, c)
        fill(c, "/a/f", b"f")
        f = c.stat("/a/f").st_ino
        c.makedirs("/b/empty")
        c.makedirs("/b/full/k")
        c.write_file("/b/file", b"file")
        empty = c.stat("/b/empty").st_ino

        def unchanged():
            assert sorted(c.listdir("/a")) == ["f"]
            assert sorted(c.listdir("/b")) == ["empty", "file", "full"]
            intact(c, sc, "/a/f", f, b"f", "/a")
            assert c.stat("/a").st_nlink == 3 and c.stat("/b").st_nlink == 4
            assert quiet(sc)

        for dst, want in (("/b/full", errno.ENOTEMPTY), ("/b/file", errno.ENOTDIR),
                          ("/a/f/s/in", errno.EINVAL), ("/a/f/s", errno.EINVAL)):
            with pytest.raises(OSError) as e:
                c.rename("/a/f", dst)
            assert e.value.errno == want, (dst, e.value)
            unchanged()
        # into its own subtree through a folder of the other shard: /a/f/s/t is
        # placed on shard 2, so the walk up from it crosses shards twice
        sc.cli("shard", "pin", "/a/f/s", "2")
        c.makedirs("/a/f/s/t")
        sc.cli("shard", "unpin", "/a/f/s")
        t = c.stat("/a/f/s/t").st_ino
        assert shard_of(t) == 2
        for dst in ("/a/f/s/t/in", "/a/f/s/t"):
            with pytest.raises(OSError) as e:
                c.rename("/a/f", dst)
            assert e.value.errno == errno.EINVAL, dst
        c.rmdir("/a/f/s/t")
        unchanged()
        # /b moved under itself, asked of shard 1 (its entry's)
        with pytest.raises(OSError) as e:
            c.rename("/b", "/b/full/k/b")
        assert e.value.errno == errno.EINVAL
        unchanged()
        # over the empty folder of shard 2: it goes, /b keeps its link count
        c.rename("/a/f", "/b/empty")
        intact(c, sc, "/b/empty", f, b"f", "/b")
        wait_until(lambda: gone(sc, empty), timeout=30)
        assert c.stat("/a").st_nlink == 2 and c.stat("/b").st_nlink == 4
        # a folder of shard 2 named in shard 1 over an empty folder of shard 1,
        # within one parent and to another
        c.rename("/b/empty", "/a/f")
        fill(c, "/b/g", b"g")
        g = c.stat("/b/g").st_ino
        c.rename("/b/g", "/a/g")
        c.makedirs("/a/e1")
        c.makedirs("/a/f/e2")
        e1, e2 = c.stat("/a/e1").st_ino, c.stat("/a/f/e2").st_ino
        c.rename("/a/g", "/a/e1")
        intact(c, sc, "/a/e1", g, b"g", "/a")
        assert gone(sc, e1)
        c.rename("/a/e1", "/a/f/e2")
        intact(c, sc, "/a/f/e2", g, b"g", "/a/f")
        assert gone(sc, e2)
        assert c.stat("/a").st_nlink == 3 and c.stat("/a/f").st_nlink == 4
    finally:
        c.close()
    fsck_clean(sc)


def reachable(c, top="/"):
    """Every folder reachable from top, by inode, walking names (a cycle unreachable
    from the root would leave folders out; one reachable would never end)."""
    seen, todo = {}, [top]
    while todo:
        path = todo.pop()
        for n in c.listdir(path):
            p = path.rstrip("/") + "/" + n
            st = c.stat(p)
            if st.st_mode & 0o170000 == 0o040000:
                assert st.st_ino not in seen, (p, seen[st.st_ino])
                seen[st.st_ino] = p
                todo.append(p)
        assert len(seen) < 1000
    return seen


def test_concurrent_moves_that_would_make_a_cycle(make_xc):
    """/a on shard 1 and /b on shard 2, /a/y and /b/x in them; two clients at once,
    one moving /a into /b/x, the other /b into /a/y, twenty times: at most one of
    each pair succeeds (the other EINVAL or, moved away meanwhile, ENOENT), never
    a cycle, every folder reachable from the root, fsck clean."""
    sc = make_xc()
    c = stoker_pkg.connect(sc.url)
    try:
        two_folders(sc, c)
        c.makedirs("/a/y")
        c.makedirs("/b/x")
        ids = {c.stat(p).st_ino for p in ("/a", "/b", "/a/y", "/b/x")}
    finally:
        c.close()
    results = []

    def put_back(cl):
        """Both at the root again, whichever moved."""
        for path, name in (("/b/x/a", "/a"), ("/a/y/b", "/b")):
            try:
                cl.rename(path, name)
            except FileNotFoundError:
                pass

    def mover(src, dst, tag, go, done):
        cl = stoker_pkg.connect(sc.url)
        try:
            for i in range(20):
                go[i].wait(60)
                try:
                    cl.rename(src, dst)
                    results.append((i, tag, "ok"))
                except OSError as e:
                    results.append((i, tag, errno.errorcode.get(e.errno, e.errno)))
                done[i].set()
        finally:
            cl.close()

    go = [threading.Event() for _ in range(20)]
    done1 = [threading.Event() for _ in range(20)]
    done2 = [threading.Event() for _ in range(20)]
    t1 = threading.Thread(target=mover, args=("/a", "/b/x/a", "1", go, done1))
    t2 = threading.Thread(target=mover, args=("/b", "/a/y/b", "2", go, done2))
    t1.start()
    t2.start()
    c = stoker_pkg.connect(sc.url)
    both = 0
    try:
        for i in range(20):
            go[i].set()
            assert done1[i].wait(60) and done2[i].wait(60)
            got = {tag: r for (k, tag, r) in results if k == i}
            oks = [tag for tag, r in got.items() if r == "ok"]
            assert len(oks) <= 1, got
            for tag, r in got.items():
                assert r in ("ok", "EINVAL", "ENOENT"), got
            both += len(oks) == 1
            seen = reachable(c)
            assert ids <= set(seen), (got, seen)
            put_back(c)
            assert sorted(c.listdir("/")) == ["a", "b"]
    finally:
        t1.join(60)
        t2.join(60)
        c.close()
    assert both == 20, results
    fsck_clean(sc)


# (where F is made, its path, where it goes): A = 1, B = 2, C = 1; A = 2, B = 1,
# C = 2; A = B = 1, C = 2 (a folder of shard 2 to another parent of shard 1)
CASES = {"1to2": ("/a", "/a/f", "/b/m"), "2to1": ("/b", "/b/f", "/a/m"),
         "within1": ("/b", "/a/f", "/a/h/m")}


def names_of(c, ino, paths):
    out = []
    for p in paths:
        try:
            if c.stat(p).st_ino == ino:
                out.append(p)
        except FileNotFoundError:
            pass
    return out


@pytest.mark.parametrize("case,step", [(k, s) for k in sorted(CASES) for s in (1, 2, 3, 4)])
def test_move_crash_at_each_step_recovers(make_xc, tmp_path, case, step):
    """The node completing step K of a folder's move across shards dies (1 and 3:
    the shard of the old entry, 2: the new entry's or the folder's own, 4: the
    same) and is restarted: the folder ends under exactly one of its two names,
    whole (its contents, `..`, both parents' link counts), nothing left held (no
    intent, mark, done record or lock), fsck clean. A move the client was told
    succeeded is at its new name."""
    once = str(tmp_path / "stopped-once")
    sc = make_xc({"STOKER_TEST_XSHARD_STOP": "rmove:%d:%s" % (step, once)})
    made_in, src, dst = CASES[case]
    c = stoker_pkg.connect(sc.url)
    try:
        two_folders(sc, c)
        c.makedirs("/a/h")
        if made_in == "/b" and not src.startswith("/b"):
            sc.cli("shard", "pin", "/a", "2")  # a folder of shard 2 named in /a
            c.makedirs(src)
            sc.cli("shard", "unpin", "/a")
        fill(c, src, b"f")
        ino = c.stat(src).st_ino
        assert shard_of(ino) == (2 if made_in == "/b" else 1)
        try:
            c.rename(src, dst)
            told = "ok"
        except OSError as e:
            told = e.errno
        sc.wait("the stop at step %d" % step, lambda: stopped(sc, "rmove", step))
        deadline = time.time() + 60
        where = []
        while time.time() < deadline:
            try:
                if quiet(sc):
                    where = names_of(c, ino, (src, dst))
                    if len(where) == 1:
                        break
            except (AssertionError, OSError):
                pass
            time.sleep(0.5)
        assert len(where) == 1, (told, where, sc.held(1), sc.held(2), sc.logs())
        if told == "ok":
            assert where == [dst], told
        parent = os.path.dirname(where[0])
        intact(c, sc, where[0], ino, b"f", parent)
        other = os.path.dirname(dst if where[0] == src else src)
        assert c.stat(parent).st_nlink == 3 + (parent == "/a")  # /a holds h too
        assert c.stat(other).st_nlink == 2 + (other == "/a")
        # where the stop left work for recovery, recovery did it
        want = {1: "given up", 3: "finished by recovery"}.get(step)
        assert want is None or logged(sc, want), sc.logs()
        # and it moves on: back where it was, no node stops again (the FILE made)
        if where[0] == dst:
            c.rename(dst, src)
        intact(c, sc, src, ino, b"f", os.path.dirname(src))
    finally:
        c.close()
    fsck_clean(sc)


@pytest.mark.skipif(not have_fuse(), reason="no FUSE")
def test_mount_mv_moves_folders_across_shards(make_xc, tmp_path):
    """Through the mount: a folder moved by rename(2) and by `mv` between folders
    of two shards is a rename (the same inode, no copy), `..` in it is its new
    parent, a file open in it reads and writes on, RENAME_NOREPLACE is EEXIST and
    RENAME_EXCHANGE across shards EXDEV with nothing changed."""
    from test_mount import renameat2

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
        d = os.path.join(a, "d")
        os.makedirs(os.path.join(d, "s"))
        with open(os.path.join(d, "s", "f"), "wb") as f:
            f.write(b"y" * 100000)
        ino = os.stat(d).st_ino
        fd = os.open(os.path.join(d, "s", "f"), os.O_RDWR)
        try:
            os.rename(d, os.path.join(b, "d"))
            nd = os.path.join(b, "d")
            assert os.stat(nd).st_ino == ino and not os.path.exists(d)
            assert os.stat(os.path.join(nd, "..")).st_ino == os.stat(b).st_ino
            assert os.stat(os.path.join(nd, "s", "..")).st_ino == ino
            assert os.stat(a).st_nlink == 2 and os.stat(b).st_nlink == 3
            os.pwrite(fd, b"z" * 10, 0)
            os.fsync(fd)
            assert os.pread(fd, 12, 0) == b"z" * 10 + b"yy"
        finally:
            os.close(fd)
        with open(os.path.join(b, "d", "s", "f"), "rb") as f:
            assert f.read() == b"z" * 10 + b"y" * 99990
        subprocess.run(["mv", os.path.join(b, "d"), os.path.join(a, "back")], check=True)
        back = os.path.join(a, "back")
        assert os.stat(back).st_ino == ino and os.listdir(b) == []
        assert os.stat(os.path.join(back, "..")).st_ino == os.stat(a).st_ino
        assert os.stat(a).st_nlink == 3 and os.stat(b).st_nlink == 2
        os.mkdir(os.path.join(b, "there"))
        assert renameat2(back, os.path.join(b, "there"), 1) == errno.EEXIST
        assert renameat2(back, os.path.join(b, "there"), 2) == errno.EXDEV
        assert os.stat(back).st_ino == ino and os.listdir(os.path.join(b, "there")) == []
        # over the empty folder: it goes
        os.rename(back, os.path.join(b, "there"))
        assert os.stat(os.path.join(b, "there")).st_ino == ino
        assert os.listdir(os.path.join(b, "there")) == ["s"]
        assert os.listdir(a) == [] and os.listdir(b) == ["there"]
    finally:
        m.stop()
    fsck_clean(sc)


MOVE_AS_ALICE = r"""
import errno, sys
sys.path.insert(0, sys.argv[1])
import stoker
c = stoker.connect(sys.argv[2])
def t(src, dst):
    try:
        c.rename(src, dst)
        return "ok"
    except OSError as e:
        return errno.errorcode[e.errno]
print(t("/a/f", "/a/sub/f"), t("/a/f", "/b/f"), t("/a/f", "/a/g"))
"""


def test_moving_a_folder_of_another_shard_needs_write_on_it(make_xc, tmp_path):
    """A folder moved to another parent has its `..` changed, so its mover needs
    write permission on it, as on a local file system (the mount's kernel checks
    it too; a libstoker client's calls have only meta to check them); a folder of
    shard 2 named in a folder of shard 1 has its mode on shard 2, which shard 1
    asks. Without it: EACCES, to a folder of shard 1 or 2, nothing changed;
    renamed within its folder, no `..` changes and it needs none; once writable,
    it moves."""
    from pyhelp import PYDIR
    from test_mount_posix import ALICE, as_user

    sc = make_xc()
    c = stoker_pkg.connect(sc.url)
    try:
        two_folders(sc, c)
        c.makedirs("/a/sub")
        c.makedirs("/b/f/s")
        c.rename("/b/f", "/a/f")  # named on shard 1, its inode on shard 2
        ino = c.stat("/a/f").st_ino
        assert shard_of(ino) == 2
    finally:
        c.close()
    m = Mount(sc, tmp_path / "mnt")  # root's, to change the modes
    m.start()
    keys = None
    try:
        for d in ("a", "a/sub", "b"):
            os.chmod(os.path.join(m.path, d), 0o777)
        os.chmod(os.path.join(m.path, "a/f"), 0o755)  # root's, not alice's to write
        keys = tempfile.mkdtemp(prefix="stoker-test-key-")  # /tmp/pytest-of-root is 0700
        os.chmod(keys, 0o755)
        key = os.path.join(keys, "alice.key")  # she holds the cluster key, as a client
        shutil.copy(os.path.join(sc.data, "cluster.key"), key)
        os.chown(key, ALICE, ALICE)

        def alice():
            r = subprocess.run(["/usr/bin/python3", "-c", MOVE_AS_ALICE, PYDIR, sc.url],
                               capture_output=True, preexec_fn=as_user(ALICE, ALICE),
                               env=dict(sc.env(), STOKER_KEY_FILE=key), timeout=120)
            assert r.returncode == 0, r.stderr.decode()
            return r.stdout.decode().split()

        assert alice() == ["EACCES", "EACCES", "ok"]
        c = stoker_pkg.connect(sc.url)
        try:
            assert c.stat("/a/g").st_ino == ino and parent_of(sc, ino) == c.stat("/a").st_ino
            assert c.listdir("/a/sub") == [] and c.listdir("/b") == []
            c.rename("/a/g", "/a/f")
        finally:
            c.close()
        os.chmod(os.path.join(m.path, "a/f"), 0o777)
        assert alice() == ["ok", "ENOENT", "ENOENT"]
        c = stoker_pkg.connect(sc.url)
        try:
            assert c.stat("/a/sub/f").st_ino == ino and c.listdir("/a/sub/f") == ["s"]
            assert parent_of(sc, ino) == c.stat("/a/sub").st_ino
        finally:
            c.close()
    finally:
        m.stop()
        if keys:
            shutil.rmtree(keys, ignore_errors=True)
    fsck_clean(sc)


@pytest.mark.parametrize("case,dies", [("2to1", 1), ("1to2", 1)])
def test_lock_holder_lost_for_good_is_released(make_xc, tmp_path, case, dies):
    """Two replicas a shard: shard 1's leader dies for good, holding the
    folder-move lock, right after step 2 of a move from shard 2 (the new entry's
    mark; the lock is shard 2's) or step 3 of a move from shard 1 (the done record;
    the lock its own). Its promoted follower has the lock and the records (each
    step is held by the followers before the next): the move settles, the lock
    goes, and the next folder move takes it."""
    step = 3 if case == "1to2" else 2
    once = str(tmp_path / "stopped-once")
    sc = make_xc({"STOKER_TEST_XSHARD_STOP": "rmove:%d:%s" % (step, once)}, replicas=2)
    m = sc.wait("two shards of two replicas each", lambda: (
        lambda s: s if len(s) == 2 and all(sorted(v["roles"].values()) == ["follower", "leader"]
                                           for v in s.values()) else None)(sc.shard_map()))
    for logs in (("meta", "meta1"), ("meta2", "meta3")):
        sc.wait("%s: the follower copied" % (logs,), lambda: any(
            "has the copy" in open(os.path.join(sc.data, "log", n + ".log")).read()
            for n in logs))
    made_in, src, dst = CASES[case]
    c = stoker_pkg.connect(sc.url)
    sup = sc.supervisor()
    try:
        two_folders(sc, c)
        fill(c, src, b"f")
        ino = c.stat(src).st_ino
        lost = leader_of(m[dies])
        os.kill(sup, signal.SIGSTOP)
        try:
            try:
                c.rename(src, dst)
            except OSError:
                pass
            sc.wait("the stop at step %d" % step, lambda: stopped(sc, "rmove", step))
            sc.wait("shard %d's follower promoted" % dies, lambda: (
                lambda s: s[dies]["roles"].get(lost) != "leader" and
                "leader" in s[dies]["roles"].values())(sc.shard_map()), timeout=30)
            deadline = time.time() + 60
            where = []
            while time.time() < deadline:
                try:
                    if quiet(sc):
                        where = names_of(c, ino, (src, dst))
                        if len(where) == 1:
                            break
                except (AssertionError, OSError):
                    pass
                time.sleep(0.5)
            assert len(where) == 1, (where, sc.held(1), sc.held(2), sc.logs())
            if step == 3:
                assert where == [dst]  # committed before the leader died
            intact(c, sc, where[0], ino, b"f", os.path.dirname(where[0]))
            # the lock is free: another folder moves to another parent
            c.makedirs("/a/h/k")
            k = c.stat("/a/h/k").st_ino
            c.rename("/a/h/k", "/b/k")
            assert c.stat("/b/k").st_ino == k and c.listdir("/a/h") == []
        finally:
            os.kill(sup, signal.SIGCONT)
    finally:
        c.close()
    fsck_clean(sc)


def test_quota_folders_do_not_move_across_shards(make_xc):
    """Quotas do not follow a folder across shards (docs/meta-shards.md): a
    folder moved out of, or into, a folder counted in a quota across shards is
    EXDEV (mv copies, and the copy counts), with nothing changed."""
    sc = make_xc()
    c = stoker_pkg.connect(sc.url)
    try:
        two_folders(sc, c)
        fill(c, "/a/q/f", b"f")
        fill(c, "/b/g", b"g")
        sc.cli("quota", "set", "/a/q", "--inodes", "100")
        f, g = c.stat("/a/q/f").st_ino, c.stat("/b/g").st_ino
        for src, dst in (("/a/q/f", "/b/f"), ("/b/g", "/a/q/g")):
            with pytest.raises(OSError) as e:
                c.rename(src, dst)
            assert e.value.errno == errno.EXDEV, (src, dst)
        intact(c, sc, "/a/q/f", f, b"f", "/a/q")
        intact(c, sc, "/b/g", g, b"g", "/b")
        assert c.listdir("/b") == ["g"] and c.listdir("/a/q") == ["f"]
        c.rename("/a/q/f", "/a/q/f2")  # within its folder: a rename as before
        intact(c, sc, "/a/q/f2", f, b"f", "/a/q")
    finally:
        c.close()
    fsck_clean(sc)


def test_fsck_under_folder_moves_across_shards_is_clean(make_xc):
    """Two clients move folders with contents back and forth between /a (shard 1)
    and /b (shard 2), over empty folders too, while fsck runs: fsck finds nothing
    at any time, every folder ends under one name with its contents, nothing is
    left held once the clients stop, and fsck --repair changes nothing."""
    sc = make_xc()
    c = stoker_pkg.connect(sc.url)
    try:
        two_folders(sc, c)
        for tag in ("p", "q"):
            fill(c, "/a/" + tag, tag.encode())
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
                try:
                    src = [p for p in ("/a/" + tag, "/b/" + tag) if cl.exists(p)][0]
                    dst = ("/b/" if src.startswith("/a") else "/a/") + tag
                    if i % 3 == 0:  # over an empty folder there
                        cl.makedirs(dst)
                    cl.rename(src, dst)
                    assert cl.read_file(dst + "/s/y") == tag.encode() + b" y"
                    moved.append(tag)
                except OSError as e:
                    if e.errno != errno.EBUSY:
                        errors.append(repr(e))
                except (AssertionError, IndexError) as e:
                    errors.append(repr(e))
        finally:
            cl.close()

    fsck_clean_under(sc, churn, ("p", "q"), stop, pause=1)
    assert not errors, errors[:5]
    assert moved.count("p") > 5 and moved.count("q") > 5, len(moved)
    wait_until(lambda: quiet(sc), timeout=30)
    c = stoker_pkg.connect(sc.url)
    try:
        for tag in ("p", "q"):
            where = [p for p in ("/a/" + tag, "/b/" + tag) if c.exists(p)]
            assert len(where) == 1, where
            intact(c, sc, where[0], c.stat(where[0]).st_ino, tag.encode(),
                   os.path.dirname(where[0]))
    finally:
        c.close()
    out = xfsck(sc, "--repair", "--grace", "0")
    assert out["clean"], out
    fsck_clean(sc)


class X3Cluster(XCluster):
    """Three shards, one meta node each (shard k > 1's at port + 40 + k - 2)."""

    def __init__(self, tmp_path, env_extra=None):
        super().__init__(tmp_path, env_extra)
        self.shards = 3

    def up(self):
        args = [STOKER, "up", "--data", self.data, "--daemon", "--port", str(self.port),
                "--targets", "1", "--meta-shards", "3", "--heartbeat-timeout-ms", "2000"]
        p = run(args, check=False, timeout=120, env=dict(os.environ, **self.env_extra))
        assert p.returncode == 0, p.stderr.decode() + self.logs()

    def meta_addr(self, shard):
        return "127.0.0.1:%d" % (self.port + 1 if shard == 1 else self.port + 40 + shard - 2)


@pytest.fixture
def make_x3(tmp_path):
    made = []

    def make(env_extra=None):
        c = X3Cluster(tmp_path, env_extra)
        made.append(c)
        c.up()
        return c

    yield make
    for c in made:
        c.down()
        bad = [line for line in c.logs().splitlines()
               if "ERROR: AddressSanitizer" in line or "runtime error:" in line]
        assert not bad, c.logs()


def quiet3(sc):
    return all(sc.held(k)[1:] == (0, 0, 0) for k in (1, 2, 3))


@pytest.mark.parametrize("step", [0, 2, 4])
def test_folder_of_a_third_shard_moved(make_x3, step):
    """Three shards: a folder of shard 3 named in /a (shard 1) moved into /b
    (shard 2) and back: its entry moves between 1 and 2, its parent pointer on 3
    follows (step 2 marks it there). With step K, every node completing step K
    of a move (2: shard 2's entry and shard 3's mark; 4: both settlings) dies
    once and is restarted: the folder ends under one name, whole, nothing held,
    fsck clean."""
    env = {"STOKER_TEST_XSHARD_STOP": "rmove:%d" % step} if step else None
    sc = make_x3(env)
    c = stoker_pkg.connect(sc.url)
    try:
        two_folders(sc, c)
        sc.cli("shard", "pin", "/a", "3")
        c.makedirs("/a/f")
        sc.cli("shard", "unpin", "/a")
        fill(c, "/a/f", b"f")
        ino = c.stat("/a/f").st_ino
        assert shard_of(ino) == 3 and shard_of(c.stat("/a/f/s").st_ino) == 3
        for src, dst in (("/a/f", "/b/m"), ("/b/m", "/a/f")):
            try:
                c.rename(src, dst)
                told = "ok"
            except OSError as e:
                told = e.errno
            deadline = time.time() + 60
            where = []
            while time.time() < deadline:
                try:
                    if quiet3(sc):
                        where = names_of(c, ino, (src, dst))
                        if len(where) == 1:
                            break
                except (AssertionError, OSError):
                    pass
                time.sleep(0.5)
            assert len(where) == 1, (told, where, sc.logs())
            if told == "ok":
                assert where == [dst], told
            intact(c, sc, where[0], ino, b"f", os.path.dirname(where[0]))
            if where[0] == src:
                c.rename(src, dst)  # not moved (the stop): once more, no stop now
                intact(c, sc, dst, ino, b"f", os.path.dirname(dst))
            other = os.path.dirname(src)
            assert c.stat(os.path.dirname(dst)).st_nlink == 3
            assert c.stat(other).st_nlink == 2
        if step:
            assert stopped(sc, "rmove", step)
    finally:
        c.close()
    wait_until(lambda: quiet3(sc), timeout=30)
    out = xfsck(sc)
    assert out["clean"], out
