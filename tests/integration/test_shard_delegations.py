"""Delegations and write-behind on metadata shards 2.. (docs/meta-shards.md,
docs/leases.md "Shards"): a folder of shard 2 is delegated by shard 2's meta to
the mount's holder there, so the mount answers creates and unlinks in it itself
and sends them to shard 2 in batches (META_NAMES), as in shard 1's folders.
Another mount sees every name at once (its read recalls the delegation), the
names outlive shard 2's leader, and a broken watch of shard 1 leaves shard 2's
cache and delegations alone. Runs as root (FUSE mounts).
"""
import errno
import os
import signal
import stat
import time

import pytest

from conftest import Mount, errno_of, have_fuse, wait_until
from test_meta_shards import leader_of
from test_meta_xshard import (make_xc, shard_lookups, shard_meta_figure,  # noqa: F401
                              shard_of)

pytestmark = pytest.mark.skipif(not have_fuse(), reason="needs root, /dev/fuse and fusermount3")


def at(sc, shard, op):
    return shard_meta_figure(sc, shard, "stoker_rpc_requests_total", op=op)


def touch(path):
    os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))


def mount_log(m):
    with open(m.logfile, errors="replace") as f:
        return f.read()


def delegated_creates(sc, folder, names, shard=2):
    """Creates `names` in `folder` (through a descriptor of it: no lookup of the
    folder's own name, which for a folder placed on another shard than its parent's
    would recall it, docs/meta-shards.md); True when shard's meta got none of them
    one by one (each went in a META_NAMES batch)."""
    creates = at(sc, shard, "META_CREATE")
    batches = at(sc, shard, "META_NAMES")
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for n in names:
            os.close(os.open(n, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644, dir_fd=fd))
    finally:
        os.close(fd)
    wait_until(lambda: at(sc, shard, "META_NAMES") > batches, 10,
               "a batch at shard %d (%s %s)" % (shard, batches, at(sc, shard, "META_CREATE") - creates))
    return at(sc, shard, "META_CREATE") == creates


def test_creates_in_folders_of_shard_2_are_delegated_and_seen_by_another_mount(
        make_xc, tmp_path):
    """A folder placed on shard 2 by its parent's setting (made by shard 1, which
    delegates nothing of it: shard 2 is asked) and a folder made inside it (by
    shard 2 itself) are both delegated: 200 creates and 100 unlinks in each reach
    shard 2 in batches, not one META_CREATE or META_UNLINK. Another mount lists
    and stats them at once, and its reads recalled the delegation: a create through
    the first mount goes to shard 2's meta again, and is seen too."""
    sc = make_xc()
    sc.cli("shard", "pin", "/", "2")
    a = Mount(sc, tmp_path / "a")
    b = Mount(sc, tmp_path / "b")
    a.start()
    b.start()
    try:
        # (apart: the other mount's reads of one must not recall the other)
        top = os.path.join(a.path, "d")
        os.mkdir(top)
        os.mkdir(os.path.join(a.path, "p"))
        inner = os.path.join(a.path, "p", "e")
        os.mkdir(inner)
        assert shard_of(os.stat(top).st_ino) == 2 and shard_of(os.stat(inner).st_ino) == 2
        names = ["f%03d" % i for i in range(200)]
        for folder, rel in ((top, "d"), (inner, "p/e")):
            unlinks = at(sc, 2, "META_UNLINK")
            assert delegated_creates(sc, folder, names), folder
            fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
            for n in names[::2]:
                os.unlink(n, dir_fd=fd)
            os.close(fd)
            # numbers of shard 2, answered by the mount
            assert shard_of(os.stat(os.path.join(folder, "f001")).st_ino) == 2
            # the other mount sees every change at once
            other = os.path.join(b.path, rel)
            assert sorted(os.listdir(other)) == names[1::2]
            assert os.path.isfile(os.path.join(other, "f001"))
            assert errno_of(os.stat, os.path.join(other, "f000")) == errno.ENOENT
            assert at(sc, 2, "META_UNLINK") == unlinks
            # recalled: a's next create goes to shard 2's meta, and b sees it
            creates = at(sc, 2, "META_CREATE")
            touch(os.path.join(folder, "after"))
            assert at(sc, 2, "META_CREATE") == creates + 1
            assert os.path.exists(os.path.join(other, "after"))
        # nothing refused
        assert "write-behind" not in mount_log(a)
    finally:
        a.stop()
        b.stop()


def test_names_answered_in_a_folder_of_shard_2_outlive_its_leader(make_xc, tmp_path):
    """Two replicas a shard. The mount answers 300 creates in a delegated folder of
    shard 2 and shard 2's leader is killed at once, with records still on their way:
    the promoted follower has every name (the mount sends what it queued to it, as
    it does to shard 1's), the other mount lists them all, and the mount refused
    nothing; fsync of the folder then succeeds."""
    sc = make_xc(replicas=2)
    m = sc.wait("two shards of two replicas", lambda: (
        lambda s: s if len(s) == 2 and all(len(v["roles"]) == 2 for v in s.values()) and
        all(sorted(v["roles"].values()) == ["follower", "leader"] for v in s.values())
        else None)(sc.shard_map()))
    for logs in (("meta", "meta1"), ("meta2", "meta3")):
        sc.wait("%s: the follower copied" % (logs,), lambda: any(
            "has the copy" in open(os.path.join(sc.data, "log", n + ".log")).read()
            for n in logs))
    sc.cli("shard", "pin", "/", "2")
    a = Mount(sc, tmp_path / "a")
    b = Mount(sc, tmp_path / "b")
    a.start()
    b.start()
    try:
        # made by shard 2 itself, in a folder placed there
        os.mkdir(os.path.join(a.path, "p"))
        folder = os.path.join(a.path, "p", "d")
        os.mkdir(folder)
        assert shard_of(os.stat(folder).st_ino) == 2
        # delegated: the first creates go in a batch
        assert delegated_creates(sc, folder, ["w%02d" % i for i in range(20)])
        lead2 = leader_of(sc.shard_map()[2])
        names = ["f%03d" % i for i in range(300)]
        for n in names:
            touch(os.path.join(folder, n))
        os.kill(sc.meta_pid(lead2), signal.SIGKILL)
        want = sorted(["w%02d" % i for i in range(20)] + names)
        other = os.path.join(b.path, "p", "d")
        wait_until(lambda: sorted(os.listdir(other)) == want, 60,
                   "every name answered at the promoted follower")
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        assert "refused" not in mount_log(a) and "are lost" not in mount_log(a), mount_log(a)
    finally:
        a.stop()
        b.stop()


def test_a_broken_watch_of_shard_1_keeps_shard_2_cached_and_delegated(make_xc, tmp_path):
    """Shard 1's meta is stopped (SIGSTOP: its watch gets no answer, so the mount
    trusts nothing of shard 1 after 1.9 s): stats of names in a folder of shard 2
    are still answered by the mount (shard 2's meta counts no lookups), lookups of
    new names there are still leased, and creates in a delegated folder of shard 2
    are still answered by the mount and sent in batches."""
    sc = make_xc()
    nocache = ["entry_timeout=0", "attr_timeout=0"]
    sc.cli("shard", "pin", "/", "2")
    a = Mount(sc, tmp_path / "a", opts=nocache)
    b = Mount(sc, tmp_path / "b", opts=nocache)
    a.start()
    b.start()
    sup = None
    try:
        d = os.path.join(a.path, "d")
        os.mkdir(d)
        dd = os.path.join(d, "dd")
        os.mkdir(dd)
        for n in ("f", "g"):
            with open(os.path.join(d, n), "wb") as fh:
                fh.write(b"x" * 10)
        assert shard_of(os.stat(d).st_ino) == 2
        # a name a did not make, so not known to it (b's create recalls d from a)
        with open(os.path.join(b.path, "d", "h"), "wb") as fh:
            fh.write(b"y" * 7)

        def cached():
            before = shard_lookups(sc, 2)
            for _ in range(30):
                assert os.stat(os.path.join(d, "f")).st_size == 10
                assert errno_of(os.stat, os.path.join(d, "nope")) == errno.ENOENT
            return shard_lookups(sc, 2) - before < 10

        wait_until(cached, 30, "the mount answering stats in shard 2's folder itself")
        # from here on through descriptors of d and dd: a path from the root would
        # look up names in shard 1's root, which cannot answer while stopped
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        addr1 = sc.meta_addr(1)
        sup = sc.supervisor()
        os.kill(sup, signal.SIGSTOP)
        pid1 = sc.meta_pid(addr1)
        os.kill(pid1, signal.SIGSTOP)
        try:
            time.sleep(2.5)  # shard 1's trust (1.9 s after its last answered watch) is over
            # shard 2's names: answered by the mount, shard 2's meta asked nothing
            before = shard_lookups(sc, 2)
            for _ in range(50):
                assert os.stat("f", dir_fd=fd).st_size == 10
                assert errno_of(lambda: os.stat("nope", dir_fd=fd)) == errno.ENOENT
            assert shard_lookups(sc, 2) - before == 0
            # a name not known to it is looked up leased, then answered by the mount
            before = shard_lookups(sc, 2)
            assert os.stat("h", dir_fd=fd).st_size == 7
            assert shard_lookups(sc, 2) - before == 1
            for _ in range(20):
                assert os.stat("h", dir_fd=fd).st_size == 7
            assert shard_lookups(sc, 2) - before == 1
            # creates in shard 2's delegated folder: still answered by the mount
            names = ["k%02d" % i for i in range(50)]
            creates = at(sc, 2, "META_CREATE")
            batches = at(sc, 2, "META_NAMES")
            dfd = os.open("dd", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            for n in names:
                os.close(os.open(n, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644, dir_fd=dfd))
            wait_until(lambda: at(sc, 2, "META_NAMES") > batches, 10, "a batch at shard 2")
            assert at(sc, 2, "META_CREATE") == creates
            assert sorted(os.listdir(dfd)) == names
            os.close(dfd)
        finally:
            os.kill(pid1, signal.SIGCONT)
            os.kill(sup, signal.SIGCONT)
            os.close(fd)
    finally:
        a.stop()
        b.stop()


def test_a_placed_folder_stays_delegated_when_its_holder_looks_its_name_up(make_xc, tmp_path):
    """A folder placed on shard 2 is named on shard 1: a lookup of its name makes
    shard 1 ask shard 2 for its attributes. Asked for the mount that holds it
    (its own kernel looking the name up again past entry_timeout), that read
    leaves the delegation in place: creates by path after it are still answered
    by the mount. Asked for another mount, it recalls it: a's next create goes to
    meta, and b sees every name."""
    sc = make_xc()
    sc.cli("shard", "pin", "/", "2")
    a = Mount(sc, tmp_path / "a")
    b = Mount(sc, tmp_path / "b")
    a.start()
    b.start()
    try:
        d = os.path.join(a.path, "d")
        os.mkdir(d)
        assert shard_of(os.stat(d).st_ino) == 2
        for round_ in range(2):
            time.sleep(1.5)  # the kernel's entry for d (1 s) is gone: looked up again
            looked = at(sc, 1, "META_LOOKUP") + at(sc, 1, "META_LOOKUP_CACHE")
            assert os.stat(d).st_ino
            assert at(sc, 1, "META_LOOKUP") + at(sc, 1, "META_LOOKUP_CACHE") > looked
            creates = at(sc, 2, "META_CREATE")
            batches = at(sc, 2, "META_NAMES")
            names = ["r%d_%03d" % (round_, i) for i in range(100)]
            for n in names:
                touch(os.path.join(d, n))  # by path: d's name resolved each time
            wait_until(lambda: at(sc, 2, "META_NAMES") > batches, 10, "a batch at shard 2")
            assert at(sc, 2, "META_CREATE") == creates, round_
        # another mount's lookup of d recalls it
        assert len(os.listdir(os.path.join(b.path, "d"))) == 200
        creates = at(sc, 2, "META_CREATE")
        touch(os.path.join(d, "after"))
        assert at(sc, 2, "META_CREATE") == creates + 1
        assert os.path.exists(os.path.join(b.path, "d", "after"))
    finally:
        a.stop()
        b.stop()


def test_names_of_folders_on_another_shard_are_leased_and_seen_changed(make_xc, tmp_path):
    """The name of a folder placed on shard 2 is on shard 1, its attributes on
    shard 2: a lookup of it is leased by both (shard 1 the name, shard 2 the
    attributes, ATTR), so repeated stats of it through a mount with no kernel
    cache ask neither shard once the mount's watches are answered. Every change
    through another mount is seen at once: the folder's mode and times (shard 2
    recalls), a rename of its name, a new folder by that name, its removal
    (shard 1 recalls)."""
    sc = make_xc()
    nocache = ["entry_timeout=0", "attr_timeout=0"]
    sc.cli("shard", "pin", "/", "2")
    a = Mount(sc, tmp_path / "a", opts=nocache)
    b = Mount(sc, tmp_path / "b", opts=nocache)
    a.start()
    b.start()
    try:
        os.mkdir(os.path.join(b.path, "d"))
        with open(os.path.join(b.path, "d", "f"), "wb") as fh:
            fh.write(b"x" * 10)
        A = lambda n: os.path.join(a.path, n)
        B = lambda n: os.path.join(b.path, n)
        assert shard_of(os.stat(A("d")).st_ino) == 2
        assert os.stat(A("d/f")).st_size == 10  # a's watch of shard 2 starts

        def asked():
            return shard_lookups(sc, 1) + at(sc, 2, "META_XSHARD") + \
                at(sc, 2, "META_GETATTR")

        def cached():
            before = asked()
            for _ in range(40):
                assert stat.S_ISDIR(os.stat(A("d")).st_mode)
                assert os.stat(A("d/f")).st_size == 10
            return asked() - before < 5

        wait_until(cached, 30, "a answering stats of d and d/f itself")
        os.chmod(B("d"), 0o700)
        assert stat.S_IMODE(os.stat(A("d")).st_mode) == 0o700
        os.utime(B("d"), (1000000000, 1200000000))
        assert os.stat(A("d")).st_mtime == 1200000000
        wait_until(cached, 30, "a caching d again")
        os.rename(B("d"), B("e"))
        assert errno_of(os.stat, A("d")) == errno.ENOENT
        assert os.stat(A("e/f")).st_size == 10
        os.mkdir(B("d"))
        assert os.stat(A("d")).st_nlink == 2 and os.listdir(A("d")) == []
        os.rmdir(B("d"))
        assert errno_of(os.stat, A("d")) == errno.ENOENT
    finally:
        a.stop()
        b.stop()


def test_creates_under_a_quota_of_shard_2_spend_an_allowance_of_shard_2(make_xc, tmp_path):
    """A quota on a folder placed on shard 2: creates in a folder made in it are
    answered by the mount on an inode allowance shard 2 set aside for the mount's
    holder there (META_ALLOW at shard 2), not one META_CREATE, and stop with
    EDQUOT at exactly the limit."""
    from test_quota_allowance import quota
    sc = make_xc()
    sc.cli("shard", "pin", "/", "2")
    a = Mount(sc, tmp_path / "a")
    a.start()
    try:
        os.mkdir(os.path.join(a.path, "q"))
        sc.cli("quota", "set", "/q", "--inodes", "300")
        d = os.path.join(a.path, "q", "d")
        os.mkdir(d)  # made by shard 2, delegated with its quota: 2 inodes used
        assert shard_of(os.stat(d).st_ino) == 2
        allows = at(sc, 2, "META_ALLOW")
        assert delegated_creates(sc, d, ["f%03d" % i for i in range(100)])
        assert at(sc, 2, "META_ALLOW") > allows
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
            assert quota(sc, "/q")["used_inodes"] == 102
            made = 100
            while True:
                try:
                    os.close(os.open("g%04d" % made, os.O_CREAT | os.O_EXCL | os.O_WRONLY,
                                     0o644, dir_fd=fd))
                except OSError as e:
                    assert e.errno == errno.EDQUOT, e
                    break
                made += 1
                assert made <= 298
            assert made == 298
            os.fsync(fd)
        finally:
            os.close(fd)
        assert quota(sc, "/q")["used_inodes"] == 300
        assert "refused" not in mount_log(a), mount_log(a)
    finally:
        a.stop()
