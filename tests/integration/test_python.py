"""The Python package `stoker`: every call round-tripped, zero-copy reads into
bytearray / memoryview / numpy, read_batch, errors mapped to the right exception,
the GIL released during I/O, and clients that keep working after fork()."""
import errno
import os
import signal
import subprocess
import threading
import time

import numpy as np
import pytest

from conftest import needs_root
from pyhelp import PYTHON, client, env_for, stoker  # noqa: F401 (fixture)

MiB = 1 << 20


def pattern(size, seed):
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()


@pytest.mark.parametrize("size", [0, 1, 4095, MiB + 3, 5 * MiB + 17])
def test_write_read_sizes(client, size):
    data = pattern(size, size)
    with client.open("/f.bin", "wb") as f:
        assert f.write(data) == size
        assert f.tell() == size
    assert client.stat("/f.bin").st_size == size
    with client.open("/f.bin") as f:
        assert f.size == size
        assert f.read() == data
        assert f.read() == b""
        f.seek(0)
        assert f.read(size // 2) == data[:size // 2]
        assert f.tell() == size // 2
        assert f.read(10 ** 9) == data[size // 2:]


def test_readinto_buffers_zero_copy(client):
    data = pattern(3 * MiB + 5, 7)
    client.write_file("/z.bin", data)
    with client.open("/z.bin", "rb") as f:
        ba = bytearray(len(data))
        assert f.readinto(ba) == len(data)
        assert ba == data
        f.seek(0)
        arr = np.zeros(len(data), dtype=np.uint8)
        assert f.readinto(arr) == len(data)
        assert arr.tobytes() == data
        big = bytearray(100)
        mv = memoryview(big)[10:60]
        assert f.preadinto(mv, 1000) == 50
        assert bytes(big[10:60]) == data[1000:1050] and big[:10] == bytes(10)
        # a typed array: bytes land as they are
        a32 = np.zeros(4, dtype=np.uint32)
        assert f.preadinto(a32, 0) == 16
        assert a32.tobytes() == data[:16]
        assert f.preadinto(bytearray(10), len(data) + 5) == 0   # past the end
        with pytest.raises((TypeError, BufferError)):
            f.readinto(b"immutable")
        with pytest.raises((TypeError, BufferError, ValueError)):
            f.readinto(np.zeros((4, 4), dtype=np.uint8)[:, 1])   # not contiguous


def test_modes_seek_append_pwrite_truncate(client):
    with client.open("/m.bin", "xb") as f:
        f.write(b"0123456789")
        assert f.writable() and not f.readable() and f.seekable()
    with pytest.raises(FileExistsError):
        client.open("/m.bin", "x")
    with client.open("/m.bin", "ab") as f:
        f.write(b"ab")
    with client.open("/m.bin", "r+b") as f:
        assert f.read(3) == b"012"
        f.seek(-2, os.SEEK_END)
        assert f.read() == b"ab"
        f.pwrite(b"XY", 4)
        assert f.pread(4, 2) == b"23XY"      # reads see the handle's own writes
        f.seek(2, os.SEEK_CUR)
        f.truncate(8)
        assert f.size == 8
        f.fsync()
        st = f.fstat()
        assert st[6] == 8
    assert client.read_file("/m.bin") == b"0123XY67"
    with client.open("/m.bin", "w+b") as f:
        assert f.read() == b""
        f.write(b"new")
        f.seek(0)
        assert f.read() == b"new"
    client.truncate("/m.bin", 1)
    assert client.read_file("/m.bin") == b"n"
    for bad in ("rt", "q", "rbb", "r+x"):
        with pytest.raises(ValueError):
            client.open("/m.bin", bad)


def test_namespace_calls(client):
    client.makedirs("/a/b/c")
    client.makedirs("/a/b/c", exist_ok=True)
    with pytest.raises(FileExistsError):
        client.makedirs("/a/b/c")
    for i in range(5):
        client.write_file("/a/b/f%d" % i, b"x" * i)
    client.write_file("/a/top", b"t")
    assert sorted(client.listdir("/a/b")) == ["c", "f0", "f1", "f2", "f3", "f4"]
    walked = list(client.walk("/a"))
    assert walked[0] == ("/a", ["b"], ["top"])
    assert sorted(walked[1][2]) == ["f%d" % i for i in range(5)] and walked[1][1] == ["c"]
    assert walked[2] == ("/a/b/c", [], [])
    assert [w[0] for w in client.walk("/a", topdown=False)] == ["/a/b/c", "/a/b", "/a"]
    st = client.stat("/a/b/f3")
    assert st.st_size == 3 and st.st_mtime > 0 and st.st_mtime_ns > 0
    assert client.isdir("/a/b") and client.isfile("/a/top") and not client.exists("/nope")
    client.rename("/a/top", "/a/b/c/moved")
    assert client.read_file("/a/b/c/moved") == b"t"
    client.symlink("/a/b/c/moved", "/a/link")
    assert client.readlink("/a/link") == "/a/b/c/moved"
    client.remove("/a/b/f0")
    assert "f0" not in client.listdir("/a/b")
    client.rmtree("/a")
    assert not client.exists("/a")
    assert client.statvfs().f_bsize > 0


def test_read_batch(client):
    files = {"/rb/%d" % i: pattern(i * 7919 + 1, i) for i in range(20)}
    client.makedirs("/rb")
    for p, d in files.items():
        client.write_file(p, d)
    reqs, want = [], []
    rng = np.random.default_rng(1)
    for _ in range(300):
        p = "/rb/%d" % rng.integers(20)
        d = files[p]
        off = int(rng.integers(len(d) + 100))
        n = int(rng.integers(5000))
        reqs.append((p, off, n))
        want.append(d[off:off + n])
    assert client.read_batch(reqs) == want
    # whole files, length None; an empty batch
    assert client.read_batch([(p, 0, None) for p in files]) == list(files.values())
    assert client.read_batch([]) == []
    # open File objects and paths mixed, into numpy buffers
    with client.open("/rb/3") as f:
        bufs = [np.zeros(100, dtype=np.uint8) for _ in range(3)]
        got = client.read_batch([(f, 0, 100), ("/rb/4", 50, 100), (f, len(files["/rb/3"]) - 10, None)],
                                bufs=bufs)
        assert got == [100, 100, 10]
        assert bufs[0].tobytes() == files["/rb/3"][:100]
        assert bufs[1].tobytes() == files["/rb/4"][50:150]
        assert bufs[2][:10].tobytes() == files["/rb/3"][-10:]
    # many at once: more than the batch queue holds
    many = client.read_batch([("/rb/5", i, 1) for i in range(5000)])
    assert b"".join(many) == files["/rb/5"][:5000]


def test_errors_map_to_exceptions(client):
    client.makedirs("/e/d")
    client.write_file("/e/f", b"data")
    with pytest.raises(FileNotFoundError) as ei:
        client.open("/e/missing")
    assert ei.value.errno == errno.ENOENT and ei.value.filename == "/e/missing"
    with pytest.raises(IsADirectoryError):
        client.open("/e/d", "wb")
    with pytest.raises(NotADirectoryError):
        client.listdir("/e/f")
    with pytest.raises(NotADirectoryError):
        client.open("/e/f/x")
    with pytest.raises(FileExistsError):
        client.mkdir("/e/d")
    with pytest.raises(OSError) as ei:
        client.rmdir("/e")
    assert ei.value.errno == errno.ENOTEMPTY
    with client.open("/e/f", "wb") as w:
        with pytest.raises(OSError) as ei:
            w.read()
        assert ei.value.errno == errno.EBADF
    with client.open("/e/f") as r:
        with pytest.raises(OSError) as ei:
            r.write(b"x")
        assert ei.value.errno == errno.EBADF
        with pytest.raises(OSError) as ei:
            r.pread(1, -1)
        assert ei.value.errno == errno.EINVAL
        with pytest.raises(OSError) as ei:
            r.seek(-10)
        assert ei.value.errno == errno.EINVAL
    # closed file: ClosedError is both OSError(EBADF) and ValueError
    f = client.open("/e/f")
    f.close()
    f.close()   # twice is fine
    for call in (f.read, f.tell, lambda: f.readinto(bytearray(1)), lambda: f.seek(0)):
        with pytest.raises(ValueError):
            call()
        with pytest.raises(OSError) as ei:
            call()
        assert ei.value.errno == errno.EBADF
    with pytest.raises(stoker.ClosedError):
        client.read_batch([(f, 0, 1)])
    # read_batch: a missing path, a bad request, a buffer too small, a write-only file
    with pytest.raises(FileNotFoundError) as ei:
        client.read_batch([("/e/f", 0, 1), ("/e/none", 0, 1)])
    assert ei.value.filename == "/e/none"
    with pytest.raises(TypeError):
        client.read_batch([("/e/f", 0)])
    with pytest.raises(OSError) as ei:
        client.read_batch([("/e/f", -1, 1)])
    assert ei.value.errno == errno.EINVAL
    with pytest.raises(ValueError):
        client.read_batch([("/e/f", 0, 10)], bufs=[bytearray(5)])
    with pytest.raises(ValueError):
        client.read_batch([("/e/f", 0, 1)], bufs=[])
    with client.open("/e/w", "wb") as w:
        with pytest.raises(OSError) as ei:
            client.read_batch([(w, 0, 1)])
        assert ei.value.errno == errno.EBADF
    # bad cluster addresses
    with pytest.raises(OSError):
        stoker.connect("not an address")
    with pytest.raises(OSError) as ei:
        stoker.connect("127.0.0.1:1")
    assert ei.value.errno in (errno.ECONNREFUSED, errno.EIO, errno.ETIMEDOUT)


def test_closed_client(cluster):
    c = stoker.connect(cluster.url)
    c.write_file("/cc", b"abc")
    f = c.open("/cc")
    c.close()
    assert c.closed
    # a file open on it still works until closed; then the connection goes
    assert f.read() == b"abc"
    f.close()
    with pytest.raises(stoker.ClosedError) as ei:
        c.open("/cc")
    assert ei.value.errno == errno.EBADF
    with pytest.raises(OSError):
        c.read_batch([("/cc", 0, 1)])
    with pytest.raises(OSError):
        c.listdir("/")
    with stoker.connect(cluster.url) as c2:
        assert c2.read_file("/cc") == b"abc"
    assert c2.closed


def test_gil_released_while_storage_is_stopped(cluster, monkeypatch):
    """A read blocked on a stopped storage daemon must not hold the GIL."""
    # reads must cross the network to block: a short-circuit read would not wait
    monkeypatch.setenv("STOKER_SHORT_CIRCUIT", "0")
    client = stoker.connect(cluster.url)
    data = pattern(2 * MiB, 3)
    client.write_file("/gil.bin", data)
    f = client.open("/gil.bin")
    storage = cluster.pids()["storage"]
    got = {}
    os.kill(storage, signal.SIGSTOP)
    try:
        t = threading.Thread(target=lambda: got.setdefault("b", f.pread(len(data), 0)))
        t.start()
        ran = 0
        deadline = time.time() + 0.5
        while time.time() < deadline:
            ran += 1
        assert t.is_alive(), "the read finished although storage was stopped"
        assert ran > 1000
        bt = threading.Thread(target=lambda: got.setdefault(
            "batch", client.read_batch([("/gil.bin", 0, 10)])))
        bt.start()
        time.sleep(0.2)
        assert bt.is_alive()
    finally:
        os.kill(storage, signal.SIGCONT)
    t.join(60)
    bt.join(60)
    f.close()
    client.close()
    assert got["b"] == data and got["batch"] == [data[:10]]


FORK_CHILD = r"""
import os, sys, threading, stoker
c = stoker.connect()
data = c.read_file("/fork.bin")
stop = False
def busy():
    # I/O in another thread while the main thread forks
    while not stop:
        c.read_batch([("/fork.bin", i * 1000, 1000) for i in range(50)])
t = threading.Thread(target=busy)
t.start()
kids = []
for i in range(int(sys.argv[1])):
    pid = os.fork()
    if pid == 0:
        ok = c.read_file("/fork.bin") == data
        ok = ok and c.read_batch([("/fork.bin", 5, 10)] * 20) == [data[5:15]] * 20
        c.write_file("/fork-child-%d" % i, b"child %d" % i)
        os._exit(0 if ok else 3)
    kids.append(pid)
stop = True
t.join()
bad = [os.waitpid(p, 0)[1] for p in kids]
assert c.read_file("/fork.bin") == data
print("children", bad)
sys.exit(1 if any(bad) else 0)
"""


def test_fork_children_get_their_own_connections(cluster, client):
    data = pattern(3 * MiB, 9)
    client.write_file("/fork.bin", data)
    p = subprocess.run([PYTHON, "-c", FORK_CHILD, "6"], env=env_for(cluster),
                       capture_output=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    for i in range(6):
        assert client.read_file("/fork-child-%d" % i) == b"child %d" % i


@needs_root
def test_full_disk_raises_enospc(make_cluster):
    c = make_cluster("full", targets=1, start=False)
    t = c.target_dirs()[0]
    os.makedirs(t, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", t], check=True)
    try:
        c.start()
        cl = stoker.connect(c.url)
        chunk = b"z" * MiB
        with pytest.raises(OSError) as ei:
            with cl.open("/filler", "wb") as f:
                for _ in range(64):
                    f.write(chunk)
        assert ei.value.errno == errno.ENOSPC
        cl.remove("/filler")
        cl.write_file("/after", b"fine")
        assert cl.read_file("/after") == b"fine"
        cl.close()
    finally:
        c.stop()
        subprocess.run(["umount", "-l", t])
