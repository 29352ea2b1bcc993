"""Unlink (or rename over) a file that another client holds open: the holder
keeps reading and writing the original bytes through its descriptor, and the
file's chunks are removed only when its last reference goes (close, or the
holder's session lease running out after its mount daemon is killed). A meta
restart in between loses nothing."""
import os
import random
import signal
import subprocess
import threading
import time

import pytest

from conftest import needs_fuse, wait_until
from test_metrics import scrape, total

PY = "/usr/bin/python3"
LEASE_MS = 2000
SIZE = 3 * (1 << 20) + 12345

# Holds argv[1] open for reading until stdin closes; says "open" once it has it.
HOLD = r"""
import sys
f = open(sys.argv[1], "rb")
print("open", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def two_mounts(monkeypatch, make_cluster, make_mount):
    monkeypatch.setenv("STOKER_SESSION_LEASE_MS", str(LEASE_MS))
    c = make_cluster()
    a = make_mount(c, "a")
    b = make_mount(c, "b")
    return c, a, b


def write_file(path, seed=1):
    data = random.Random(seed).randbytes(SIZE)
    with open(path, "wb") as f:
        f.write(data)
    return data


@needs_fuse
@pytest.mark.parametrize("how", ["unlink", "rename"])
def test_open_file_outlives_its_name_on_another_mount(two_mounts, how):
    c, a, b = two_mounts
    data = write_file(os.path.join(a.path, "f"))
    before = len(c.chunk_files())
    assert before > 0
    f = open(os.path.join(a.path, "f"), "r+b")
    try:
        if how == "unlink":
            os.unlink(os.path.join(b.path, "f"))
        else:
            with open(os.path.join(b.path, "new"), "wb") as g:
                g.write(b"the new file")
            os.replace(os.path.join(b.path, "new"), os.path.join(b.path, "f"))
            with open(os.path.join(b.path, "f"), "rb") as g:
                assert g.read() == b"the new file"
        assert os.path.exists(os.path.join(b.path, "f")) == (how == "rename")
        # The holder still reads every original byte, from storage, not a cache.
        f.seek(0)
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        assert f.read() == data
        assert os.fstat(f.fileno()).st_size == SIZE
        assert os.fstat(f.fileno()).st_nlink == 0
        f.seek(SIZE)
        f.write(b"tail")
        f.flush()
        os.fsync(f.fileno())
        f.seek(0)
        assert f.read() == data + b"tail"
        assert len(c.chunk_files()) >= before
    finally:
        f.close()
    extra = 1 if how == "rename" else 0  # the new file's one chunk
    wait_until(lambda: len(c.chunk_files()) == extra, what="the orphan's chunks to go")


@needs_fuse
def test_unlink_through_the_holding_mount(two_mounts):
    c, a, b = two_mounts
    data = write_file(os.path.join(a.path, "f"))
    f = open(os.path.join(a.path, "f"), "rb")
    try:
        os.unlink(os.path.join(a.path, "f"))
        # Another mount opened it before: it sees the same orphan through its handle.
        assert f.read() == data
    finally:
        f.close()
    wait_until(lambda: not c.chunk_files(), what="the orphan's chunks to go")


@needs_fuse
def test_orphan_reaped_when_holder_mount_dies(two_mounts):
    c, a, b = two_mounts
    write_file(os.path.join(a.path, "f"))
    p = subprocess.Popen([PY, "-c", HOLD, os.path.join(a.path, "f")], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE)
    try:
        assert p.stdout.readline() == b"open\n"
        os.unlink(os.path.join(b.path, "f"))
        assert c.chunk_files()
        os.kill(a.pid(), signal.SIGKILL)
        wait_until(lambda: not c.chunk_files(), timeout=90,
                   what="the killed mount's lease to run out and the orphan to go")
    finally:
        p.kill()
        p.wait()
        subprocess.run(["umount", "-l", a.path], check=False)


@needs_fuse
def test_orphan_survives_meta_restart(two_mounts):
    c, a, b = two_mounts
    data = write_file(os.path.join(a.path, "f"))
    f = open(os.path.join(a.path, "f"), "rb")
    try:
        os.unlink(os.path.join(b.path, "f"))
        n = len(c.chunk_files())
        meta = c.pids()["meta"]
        os.kill(meta, signal.SIGKILL)
        wait_until(lambda: c.pids().get("meta", meta) != meta, timeout=120,
                   what="stoker up to restart meta")
        # meta serves again (a namespace call through B answers) ...
        wait_until(lambda: os.path.isdir(os.path.join(b.path, ".")) and
                   open(os.path.join(b.path, "probe"), "wb").close() is None, timeout=120,
                   what="meta to serve again")
        # ... and keeps the orphan past a lease and its margin: the holder's session
        # registered it again.
        time.sleep(LEASE_MS / 1000 * 2 + 3)
        assert len(c.chunk_files()) == n
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        assert f.read() == data
    finally:
        f.close()
    wait_until(lambda: not c.chunk_files(), what="the orphan's chunks to go after close")


@needs_fuse
def test_removed_files_chunks_go_in_the_background(cluster, make_mount):
    """A file's chunks are removed after its unlink returns, by meta's purge: they
    all go, also when the mount is unmounted at once, and files that stay keep
    every byte."""
    m = make_mount(cluster, "reap")
    keep = os.urandom(SIZE)
    with open(os.path.join(m.path, "keep.bin"), "wb") as f:
        f.write(keep)
    kept = len(cluster.chunk_files())
    for i in range(40):
        with open(os.path.join(m.path, "gone%d" % i), "wb") as f:
            f.write(os.urandom(1 << 20))
    os.mkdir(os.path.join(m.path, "d"))
    with open(os.path.join(m.path, "d", "replaced"), "wb") as f:
        f.write(os.urandom(2 << 20))
    with open(os.path.join(m.path, "d", "new"), "wb") as f:
        f.write(b"new")
    assert len(cluster.chunk_files()) == kept + 40 + 2 + 1
    for i in range(40):
        os.unlink(os.path.join(m.path, "gone%d" % i))
    os.rename(os.path.join(m.path, "d", "new"), os.path.join(m.path, "d", "replaced"))
    m.stop()  # at once: the removals are meta's, not the mount's
    assert not m.mounted()
    wait_until(lambda: len(cluster.chunk_files()) == kept + 1, 30,
               "meta to purge the removed files' chunks")
    assert cluster.cli("cat", "/keep.bin").stdout == keep
    assert cluster.cli("cat", "/d/replaced").stdout == b"new"


def storage_requests(cluster, op):
    samples, _ = scrape(cluster, "storage")
    return int(total(samples, "stoker_rpc_requests_total", op=op))


@needs_fuse
def test_removals_reach_storage_in_batches(cluster, make_mount):
    """Files unlinked in a burst have their chunks removed by one STOR_TRUNCATES per
    chain for many of them: fewer requests than one per file and chain, every
    chunk of theirs gone, the files that stay whole."""
    m = make_mount(cluster, "batch")
    keep = os.urandom(SIZE)
    with open(os.path.join(m.path, "keep.bin"), "wb") as f:
        f.write(keep)
    kept = len(cluster.chunk_files())
    nfiles, nchains = 64, 4  # `stoker up` makes four chains
    for i in range(nfiles):
        with open(os.path.join(m.path, "gone%d" % i), "wb") as f:
            f.write(os.urandom(1000 + i))
    assert len(cluster.chunk_files()) == kept + nfiles
    single, batched = (storage_requests(cluster, op) for op in ("STOR_TRUNCATE", "STOR_TRUNCATES"))
    threads = [threading.Thread(target=lambda t=t: [os.unlink(os.path.join(m.path, "gone%d" % i))
                                                    for i in range(t, nfiles, 4)])
               for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wait_until(lambda: len(cluster.chunk_files()) == kept, 30, "the removed files' chunks to go")
    single = storage_requests(cluster, "STOR_TRUNCATE") - single
    batched = storage_requests(cluster, "STOR_TRUNCATES") - batched
    assert batched >= 1
    assert single + batched < nfiles * nchains
    with open(os.path.join(m.path, "keep.bin"), "rb") as f:
        assert f.read() == keep


@needs_fuse
def test_open_racing_unlink_from_another_mount(two_mounts):
    """An open through A registers its reference and reads the attributes in one
    step (META_OPEN), while B unlinks the name: whichever comes first, an open that
    succeeds reads every byte, and no reference is left behind (all chunks go)."""
    import threading
    c, a, b = two_mounts
    data = random.Random(7).randbytes(3 * (1 << 16) + 999)
    opened = gone = 0
    for i in range(150):
        name = "race%d" % i
        with open(os.path.join(b.path, name), "wb") as f:  # A has no cached pages
            f.write(data)
        if i % 2:
            os.stat(os.path.join(a.path, name))  # A's kernel knows the name: open by inode
        go = threading.Barrier(2)
        got = {}

        def opener():
            go.wait()
            try:
                with open(os.path.join(a.path, name), "rb") as f:
                    time.sleep(0.001 * (i % 3))
                    got["data"] = f.read()
            except FileNotFoundError:
                got["data"] = None

        t = threading.Thread(target=opener)
        t.start()
        go.wait()
        if i % 5:
            time.sleep(0.0005 * (i % 4))
        os.unlink(os.path.join(b.path, name))
        t.join()
        if got["data"] is None:
            gone += 1
        else:
            assert got["data"] == data, "open %d read %d bytes" % (i, len(got["data"]))
            opened += 1
    assert opened > 0
    wait_until(lambda: not c.chunk_files(), what="every raced file's chunks to go")


@needs_fuse
def test_orphan_survives_meta_restart_with_opens_racing_the_renewal(two_mounts):
    """As above, but the holder's mount keeps opening another file while meta
    restarts, so that an open (not the session renewal) is likely the first request
    the new meta sees from it: meta must still tell the mount, at its renewal, that
    it lost the session, so that the mount registers the orphan it holds again."""
    import threading
    c, a, b = two_mounts
    data = write_file(os.path.join(a.path, "f"))
    with open(os.path.join(a.path, "g"), "wb") as g:
        g.write(b"g")
    f = open(os.path.join(a.path, "f"), "rb")
    stop = threading.Event()

    def opener():
        while not stop.is_set():
            try:
                with open(os.path.join(a.path, "g"), "rb") as g:
                    g.read()
            except OSError:
                pass

    threads = [threading.Thread(target=opener) for _ in range(4)]
    try:
        os.unlink(os.path.join(b.path, "f"))
        n = len(c.chunk_files())
        for t in threads:
            t.start()
        meta = c.pids()["meta"]
        os.kill(meta, signal.SIGKILL)
        wait_until(lambda: c.pids().get("meta", meta) != meta, timeout=120,
                   what="stoker up to restart meta")
        wait_until(lambda: open(os.path.join(b.path, "probe"), "wb").close() is None,
                   timeout=120, what="meta to serve again")
        time.sleep(LEASE_MS / 1000 * 2 + 3)
        stop.set()
        for t in threads:
            t.join()
        assert len(c.chunk_files()) == n
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        assert f.read() == data
    finally:
        stop.set()
        f.close()
    wait_until(lambda: len(c.chunk_files()) == 1, what="the orphan's chunks to go after close")


@needs_fuse
def test_an_open_on_a_lease_is_at_meta_before_any_unlink(two_mounts):
    """An open through A of a file whose attributes A's lookup cache holds under a
    lease does not wait for meta: the open reference is sent a few milliseconds
    later, or never when the close comes first. An unlink or a rename over the name
    right after such an open, through B (meta revokes A's lease first, and A sends
    the reference before it acknowledges) or through A itself (sent before the
    unlink), still leaves every byte readable through the open descriptor; and no
    reference is left behind: once all is closed and removed, every chunk goes."""
    from test_mount import delta, meta_counts
    c, a, b = two_mounts
    data = random.Random(5).randbytes(3 * (1 << 16) + 999)
    quiet = os.path.join(a.path, "quiet")
    with open(quiet, "wb") as f:
        f.write(data)
    time.sleep(0.2)
    before = meta_counts(c)
    for _ in range(30):  # no read: no atime to record, which would drop the lease
        os.close(os.open(quiet, os.O_RDONLY))
    time.sleep(0.2)
    # None of them asked meta before opening. The reference is sent a few ms after an
    # open whose close has not come yet: on a loaded machine (three sanitizer
    # clusters on two cores) a close now and then comes later than that.
    assert delta(before, meta_counts(c), "META_OPEN") <= 3
    for i in range(24):
        how = ("unlink B", "unlink A", "rename over B", "rename over A")[i % 4]
        name = "held%d" % i
        with open(os.path.join(a.path, name), "wb") as f:  # A holds the entry leased
            f.write(data)
        if how.startswith("rename"):
            with open(os.path.join(b.path, name + ".new"), "wb") as f:
                f.write(b"new")
        time.sleep(0.02 * (i % 3))  # sometimes the reference would have gone by itself
        f = open(os.path.join(a.path, name), "rb")
        try:
            mnt = b if how.endswith("B") else a
            if how.startswith("unlink"):
                os.unlink(os.path.join(mnt.path, name))
            else:
                os.rename(os.path.join(mnt.path, name + ".new"), os.path.join(mnt.path, name))
            time.sleep(0.05)  # meta would have removed the data by now
            assert f.read() == data, "%s: %s" % (name, how)
        finally:
            f.close()
    for mnt_name in os.listdir(a.path):
        os.unlink(os.path.join(a.path, mnt_name))
    wait_until(lambda: not c.chunk_files(), what="every chunk to go (no reference left)")
