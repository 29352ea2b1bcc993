"""Write-behind of names in delegated folders (src/client/behind.h, docs/mount.md):
a mount answers creates and unlinks in a folder it made itself and tells meta a
moment later. Whatever another client does with the folder (list it, stat it,
look a name up, create the same name, the native client) sees every change the
mount answered before; the mount's own calls see them in order; fsync makes them
durable. Runs as root (FUSE mounts)."""
import os
import signal
import time

import pytest

from conftest import needs_fuse, wait_until
from test_mount import meta_figure

pytestmark = needs_fuse


def at_meta(cluster, op):
    return meta_figure(cluster, "stoker_rpc_requests_total", op=op)


def touch(path):
    os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))


def test_creates_and_unlinks_are_answered_by_the_mount_and_seen_by_the_other(cluster, make_mount):
    a = make_mount(cluster, "a")
    b = make_mount(cluster, "b")
    da, db = os.path.join(a.path, "d"), os.path.join(b.path, "d")
    os.mkdir(da)
    creates = at_meta(cluster, "META_CREATE")
    names = ["f%03d" % i for i in range(200)]
    for n in names:
        touch(os.path.join(da, n))
    for n in names[::2]:
        os.unlink(os.path.join(da, n))
    # none of them asked meta one by one: they went in batches
    assert at_meta(cluster, "META_CREATE") == creates
    assert at_meta(cluster, "META_NAMES") >= 1
    # the other mount lists the folder at once, with every change in it
    assert sorted(os.listdir(db)) == names[1::2]
    assert os.path.isfile(os.path.join(db, "f001"))
    assert not os.path.exists(os.path.join(db, "f000"))
    # and the folder is the other's too now: a create through a is meta's business again
    touch(os.path.join(da, "after"))
    assert at_meta(cluster, "META_CREATE") == creates + 1
    assert os.path.exists(os.path.join(db, "after"))


def test_a_lookup_stat_or_create_by_another_client_sees_the_mounts_names(cluster, make_mount):
    a = make_mount(cluster, "a")
    b = make_mount(cluster, "b")
    for sub in ("s1", "s2", "s3", "s4"):
        os.mkdir(os.path.join(a.path, sub))
    # a name looked up through the other mount
    touch(os.path.join(a.path, "s1", "x"))
    assert os.stat(os.path.join(b.path, "s1", "x")).st_size == 0
    # the folder's own attributes: its link count and times include the create
    before = time.time()
    touch(os.path.join(a.path, "s2", "x"))
    st = os.stat(os.path.join(b.path, "s2"))
    assert st.st_mtime >= before - 1
    # the same name made through the other mount: EEXIST, as if a had been meta
    touch(os.path.join(a.path, "s3", "x"))
    with pytest.raises(FileExistsError):
        touch(os.path.join(b.path, "s3", "x"))
    # the native client (no cache of its own) sees it too
    touch(os.path.join(a.path, "s4", "native"))
    assert cluster.cli("ls", "/s4").stdout.split() == [b"native"]


def test_written_files_reach_storage_only_once_meta_has_them(cluster, make_mount):
    a = make_mount(cluster, "a")
    b = make_mount(cluster, "b")
    os.mkdir(os.path.join(a.path, "w"))
    payload = os.urandom(3 * (1 << 20) + 123)
    with open(os.path.join(a.path, "w", "data"), "wb") as f:
        f.write(payload)
    assert open(os.path.join(b.path, "w", "data"), "rb").read() == payload
    assert cluster.cli("cat", "/w/data").stdout == payload
    # unlinked while open: stays readable through its descriptor (meta is asked)
    p = os.path.join(a.path, "w", "open")
    with open(p, "wb") as f:
        f.write(b"kept")
    fd = os.open(p, os.O_RDONLY)
    os.unlink(p)
    assert os.pread(fd, 4, 0) == b"kept"
    os.close(fd)
    assert not os.path.exists(os.path.join(b.path, "w", "open"))


def test_unlinked_files_give_their_space_back(cluster, make_mount):
    a = make_mount(cluster, "a")
    os.mkdir(os.path.join(a.path, "u"))
    for i in range(20):
        with open(os.path.join(a.path, "u", "f%d" % i), "wb") as f:
            f.write(b"z" * 300000)
    wait_until(lambda: len(cluster.chunk_files()) == 20, 10, "the 20 chunks to be written")
    for i in range(20):
        os.unlink(os.path.join(a.path, "u", "f%d" % i))
    wait_until(lambda: not cluster.chunk_files(), 20, "the chunks of unlinked files to go")
    assert os.listdir(os.path.join(a.path, "u")) == []


def test_fsync_of_the_folder_makes_them_durable_past_a_killed_mount(cluster, make_mount):
    a = make_mount(cluster, "a")
    d = os.path.join(a.path, "dur")
    os.mkdir(d)
    for i in range(50):
        touch(os.path.join(d, "k%02d" % i))
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    os.fsync(fd)
    os.close(fd)
    os.kill(a.pid(), signal.SIGKILL)
    wait_until(lambda: len(cluster.cli("ls", "/dur").stdout.split()) == 50, 10,
               "the 50 names to be at meta after the mount died")


def test_off_with_nowritebehind(cluster, make_mount):
    a = make_mount(cluster, "a", opts=("nowritebehind",))
    os.mkdir(os.path.join(a.path, "sync"))
    creates = at_meta(cluster, "META_CREATE")
    for i in range(10):
        touch(os.path.join(a.path, "sync", "f%d" % i))
    assert at_meta(cluster, "META_CREATE") == creates + 10
    assert at_meta(cluster, "META_NAMES") == 0


def test_many_threads_in_many_folders_then_another_mount(cluster, make_mount):
    """W4's shape: 4 threads, a folder each, create then stat then unlink half."""
    import threading
    a = make_mount(cluster, "a")
    b = make_mount(cluster, "b")
    dirs = [os.path.join(a.path, "t%d" % i) for i in range(4)]
    for d in dirs:
        os.mkdir(d)
    errs = []

    def work(d):
        try:
            for j in range(1500):
                touch(os.path.join(d, "e%05d" % j))
            for j in range(1500):
                os.stat(os.path.join(d, "e%05d" % j))
            for j in range(0, 1500, 2):
                os.unlink(os.path.join(d, "e%05d" % j))
        except OSError as e:
            errs.append(e)

    th = [threading.Thread(target=work, args=(d,)) for d in dirs]
    for t in th:
        t.start()
    for t in th:
        t.join()
    assert not errs, errs
    for i in range(4):
        listed = os.listdir(os.path.join(b.path, "t%d" % i))
        assert sorted(listed) == ["e%05d" % j for j in range(1, 1500, 2)]


def test_a_clean_unmount_sends_what_it_answered(cluster, make_mount):
    a = make_mount(cluster, "a")
    os.mkdir(os.path.join(a.path, "um"))
    for i in range(300):
        touch(os.path.join(a.path, "um", "n%03d" % i))
    os.unlink(os.path.join(a.path, "um", "n000"))
    a.stop()
    listed = cluster.cli("ls", "/um").stdout.split()
    assert sorted(listed) == [b"n%03d" % i for i in range(1, 300)]


def test_a_name_made_and_removed_in_one_batch(cluster, make_mount):
    """Creates and unlinks of the same names a moment apart reach meta in the same
    batch: each unlink removes what the create before it made."""
    a = make_mount(cluster, "a")
    b = make_mount(cluster, "b")
    d = os.path.join(a.path, "churn")
    os.mkdir(d)
    for i in range(300):
        touch(os.path.join(d, "x%d" % i))
        if i % 3:
            os.unlink(os.path.join(d, "x%d" % i))
    for _ in range(100):  # one name made and removed over and over
        touch(os.path.join(d, "again"))
        os.unlink(os.path.join(d, "again"))
    touch(os.path.join(d, "again"))
    left = sorted(os.listdir(os.path.join(b.path, "churn")))
    assert left == sorted(["x%d" % i for i in range(0, 300, 3)] + ["again"])
    assert "refused" not in a.log() and "lost" not in a.log(), a.log()


def test_listing_its_own_folder_keeps_the_delegation_and_the_names(cluster, make_mount):
    """A listing, `ls -l` or stat of a folder by the mount it is delegated to is sent
    with that mount's origin: meta keeps the delegation, and the mount's lookup cache
    keeps the names, so a loader that lists its folders and then opens every file
    (ImageFolder, W6) asks meta nothing per file. Another client still sees
    everything, and a change it makes is seen by the first after close and open."""
    a = make_mount(cluster, "a")
    b = make_mount(cluster, "b")
    da, db = os.path.join(a.path, "ds"), os.path.join(b.path, "ds")
    os.mkdir(da)
    names = ["s%03d" % i for i in range(50)]
    for n in names:
        with open(os.path.join(da, n), "wb") as f:
            f.write(n.encode() * 100)
    assert sorted(os.listdir(da)) == names
    assert sorted(e.name for e in os.scandir(da) if e.stat().st_size == 400) == names
    os.stat(da)
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("2\n")  # the kernel's entries go, the mount's cache stays
    lookups, creates = at_meta(cluster, "META_LOOKUP_CACHE"), at_meta(cluster, "META_CREATE")
    for n in names:
        with open(os.path.join(da, n), "rb") as f:
            assert f.read() == n.encode() * 100
    # the folder's own name may be asked for again (its times moved), no file's is
    assert at_meta(cluster, "META_LOOKUP_CACHE") - lookups <= 2
    # still delegated: a create through a is answered by a
    touch(os.path.join(da, "mine"))
    assert at_meta(cluster, "META_CREATE") == creates
    # the other mount sees every name, the new one included
    assert sorted(os.listdir(db)) == sorted(names + ["mine"])
    # its changes are seen through a after close and open (close-to-open)
    with open(os.path.join(db, "s000"), "wb") as f:
        f.write(b"changed by b")
    os.unlink(os.path.join(db, "s001"))
    with open(os.path.join(db, "new"), "wb") as f:
        f.write(b"made by b")
    with open(os.path.join(da, "s000"), "rb") as f:
        assert f.read() == b"changed by b"
    with pytest.raises(FileNotFoundError):  # an open asks meta (docs/mount.md)
        open(os.path.join(da, "s001"), "rb")
    with open(os.path.join(da, "new"), "rb") as f:
        assert f.read() == b"made by b"
    assert "new" in os.listdir(da) and "s001" not in os.listdir(da)
    # and the native client's too
    cluster.cli("rm", "/ds/s002")
    with pytest.raises(FileNotFoundError):
        open(os.path.join(da, "s002"), "rb")
    assert "s002" not in os.listdir(da)


def test_small_files_in_new_folders_are_whole_elsewhere_at_close_and_past_a_killed_storage(
        cluster, make_mount):
    """W3 create's shape: 8 threads write small files (each a new folder on storage,
    whose sync goes with the data's: src/storage/chunk.c, sync_new) and two-chunk
    ones through one mount. Each file, once closed, reads whole through another
    mount and the native client (close-to-open); after storage is killed with
    SIGKILL and restarted, every file still reads whole through a fresh mount, and
    no temporary chunk file is left."""
    import hashlib
    import threading
    a = make_mount(cluster, "a")
    b = make_mount(cluster, "b")
    for d in range(4):
        os.mkdir(os.path.join(a.path, "n%d" % d))
    written, errs = {}, []

    def work(k):
        try:
            for i in range(k, 240, 8):
                size = 16384 + i if i % 20 else (1 << 20) + 4096 * i  # some span two chunks
                data = os.urandom(size)
                rel = os.path.join("n%d" % (i % 4), "f%03d" % i)
                with open(os.path.join(a.path, rel), "wb") as f:
                    f.write(data)
                # closed: the other mount reads it whole at once
                with open(os.path.join(b.path, rel), "rb") as f:
                    if f.read() != data:
                        errs.append(("other mount", rel))
                written[rel] = hashlib.sha256(data).hexdigest()
        except OSError as e:
            errs.append(e)

    th = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    assert not errs, errs[:5]
    assert len(written) == 240
    for rel in ("n0/f000", "n1/f021", "n3/f239"):
        got = cluster.cli("cat", "/" + rel).stdout
        assert hashlib.sha256(got).hexdigest() == written[rel], rel
    old = cluster.pids()["storage"]
    os.kill(old, signal.SIGKILL)
    wait_until(lambda: cluster.pids().get("storage", old) != old, 60,
               "stoker up to restart storage")
    c = make_mount(cluster, "c")
    for rel, digest in written.items():
        with open(os.path.join(c.path, rel), "rb") as f:
            assert hashlib.sha256(f.read()).hexdigest() == digest, rel
    left = [os.path.join(p, n) for t in cluster.target_dirs()
            for p, _, files in os.walk(os.path.join(t, "chunks")) for n in files if ".tmp" in n]
    assert left == []
