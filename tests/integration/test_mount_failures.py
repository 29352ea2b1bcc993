"""The cluster's daemons killed under a busy mount.

A call that finds the cluster unreachable retries until the mount's `timeout`
(`-o timeout=SECONDS`, default 30 s): daemons that come back within it are never
noticed beyond the wait; after it the call fails with EIO and the next one tries
again. `timeout=0` is a hard mount: calls wait for the cluster however long it is
away. Never a crash of the mount, never wrong bytes."""
import errno
import hashlib
import os
import signal
import threading
import time

from conftest import errno_of, needs_fuse, wait_until

MiB = 1 << 20


def drop_caches():
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def kill_cluster(c):
    """Every daemon and the supervisor, so that nothing comes back by itself."""
    up_pid = int(open(os.path.join(c.data, "up.pid")).read())
    pids = c.pids()
    os.kill(up_pid, signal.SIGKILL)
    for pid in pids.values():
        os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not c.pids(), 30, "the daemons to go")


def read_file(path):
    with open(path, "rb") as f:
        return f.read()


@needs_fuse
def test_busy_mount_rides_through_daemon_kills(cluster, make_mount):
    """Writers and readers on the mount while storage, meta and mgmtd are each
    killed with SIGKILL (and restarted by `stoker up`): no call fails, every file
    reads back whole through a second mount."""
    m = make_mount(cluster, "busy")
    base = os.urandom(8 * MiB)
    with open(os.path.join(m.path, "base.bin"), "wb") as f:
        f.write(base)
    stop = threading.Event()
    errors, written = [], {}

    def writer(tid):
        i = 0
        while not stop.is_set():
            data = os.urandom(MiB + 4096 * i + tid)
            name = "w%d-%d.bin" % (tid, i)
            try:
                with open(os.path.join(m.path, name), "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                written[name] = hashlib.sha256(data).hexdigest()
            except OSError as e:
                errors.append(("write", name, e))
            i += 1

    def reader():
        want = hashlib.sha256(base).hexdigest()
        while not stop.is_set():
            try:
                # O_DIRECT-free way around the page cache: read at changing offsets
                # of a file whose pages the kernel may drop; the sum must hold.
                got = hashlib.sha256(read_file(os.path.join(m.path, "base.bin"))).hexdigest()
                if got != want:
                    errors.append(("read", "base.bin", "wrong bytes"))
            except OSError as e:
                errors.append(("read", "base.bin", e))

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(2)]
    threads.append(threading.Thread(target=reader))
    for t in threads:
        t.start()
    try:
        for role in ("storage", "meta", "mgmtd"):
            time.sleep(1.0)
            old = cluster.pids()[role]
            os.kill(old, signal.SIGKILL)
            drop_caches()
            wait_until(lambda: cluster.pids().get(role, old) != old, 60,
                       "stoker up to restart " + role)
        time.sleep(2.0)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=120)
    assert not errors, errors[:5]
    assert len(written) >= 6, "the writers got too little done to test anything"
    other = make_mount(cluster, "other")
    for name, digest in written.items():
        assert hashlib.sha256(read_file(os.path.join(other.path, name))).hexdigest() == digest
    assert m.mounted()


@needs_fuse
def test_timeout_fails_with_eio_then_the_mount_resumes(make_cluster, make_mount):
    c = make_cluster()
    m = make_mount(c, opts=["timeout=2"])
    data = os.urandom(3 * MiB)
    path = os.path.join(m.path, "f.bin")
    with open(path, "wb") as f:
        f.write(data)
    kill_cluster(c)
    drop_caches()
    t0 = time.time()
    assert errno_of(read_file, path) == errno.EIO
    took = time.time() - t0
    assert 1.5 <= took < 30, took
    assert errno_of(os.mkdir, os.path.join(m.path, "d")) == errno.EIO
    assert m.mounted()
    c.start()
    # The same mount, not remounted: the next calls reach the restarted cluster.
    wait_until(lambda: errno_of(os.stat, path) == 0, 60, "the mount to reach the cluster")
    assert read_file(path) == data
    os.mkdir(os.path.join(m.path, "d"))
    assert os.path.isdir(os.path.join(m.path, "d"))


@needs_fuse
def test_hard_mount_waits_for_the_cluster(monkeypatch, make_cluster, make_mount):
    """timeout=0: a read issued while the cluster is away blocks, then returns the
    right bytes once the cluster is back, however long that took. (The default
    here is cut to 2 s through STOKER_RETRY_MS: the option must override it.)"""
    monkeypatch.setenv("STOKER_RETRY_MS", "2000")
    c = make_cluster()
    m = make_mount(c, opts=["timeout=0"])
    data = os.urandom(2 * MiB + 5)
    path = os.path.join(m.path, "f.bin")
    with open(path, "wb") as f:
        f.write(data)
    kill_cluster(c)
    drop_caches()
    out = {}

    def read():
        try:
            out["data"] = read_file(path)
        except OSError as e:
            out["err"] = e

    t = threading.Thread(target=read)
    t.start()
    t.join(timeout=8)  # four times the default: it must still be waiting
    assert t.is_alive() and not out, out
    c.start()
    t.join(timeout=120)
    assert not t.is_alive()
    assert "err" not in out, out
    assert out["data"] == data


def test_bad_timeout_option(cluster, make_mount):
    m = make_mount(cluster, opts=["timeout=-1"], start=False)
    p = m.start(check=False)
    assert p.returncode != 0 and b"-o timeout needs seconds" in p.stderr
    assert not m.mounted()
