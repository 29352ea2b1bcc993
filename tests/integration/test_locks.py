"""Advisory locks across mounts: flock and POSIX record locks taken through one
mount of a cluster block conflicting ones through another mount, and go when
their holder unlocks, closes, is killed, or its whole mount daemon dies (the
session lease in meta runs out)."""
import fcntl
import os
import re
import signal
import struct
import subprocess
import time
import urllib.request

import pytest

from conftest import free_port, needs_fuse, wait_until

PY = "/usr/bin/python3"
LEASE_MS = 3000

# A process that takes a lock on argv[1] and holds it until its stdin closes.
HOLD = r"""
import fcntl, sys
path, mode = sys.argv[1], sys.argv[2]
f = open(path, "r+b")
if mode == "flock":
    fcntl.flock(f, fcntl.LOCK_EX)
elif mode == "flock-sh":
    fcntl.flock(f, fcntl.LOCK_SH)
elif mode == "posix":
    fcntl.lockf(f, fcntl.LOCK_EX)
elif mode == "range":
    fcntl.lockf(f, fcntl.LOCK_EX, 10, 100)  # bytes 100..109
print("locked", flush=True)
sys.stdin.read()
"""

# A process that takes a shared POSIX lock through a read-only descriptor, then
# closes that descriptor (or exits) when told on stdin, and stays until stdin ends.
HOLD_RO = r"""
import fcntl, os, sys
f = open(sys.argv[1], "rb")
fcntl.lockf(f, fcntl.LOCK_SH)
print("locked", flush=True)
if sys.stdin.readline().strip() == "exit":
    os._exit(0)
f.close()
print("closed", flush=True)
sys.stdin.read()
"""

# A process that waits for a lock (F_SETLKW or blocking flock), says "got", and
# says "eintr" instead if SIGUSR1 interrupts the wait.
WAIT = r"""
import fcntl, signal, sys
class Interrupted(Exception):
    pass
def on_usr1(sig, frame):
    raise Interrupted()
signal.signal(signal.SIGUSR1, on_usr1)
path, mode = sys.argv[1], sys.argv[2]
f = open(path, "r+b")
try:
    print("waiting", flush=True)
    if mode == "flock":
        fcntl.flock(f, fcntl.LOCK_EX)
    else:
        fcntl.lockf(f, fcntl.LOCK_EX)
except Interrupted:
    print("eintr", flush=True)
    sys.exit(0)
print("got", flush=True)
sys.stdin.read()
"""


def spawn(script, *args):
    p = subprocess.Popen([PY, "-c", script] + [str(a) for a in args], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE)
    return p


def holder(path, mode):
    p = spawn(HOLD, path, mode)
    line = p.stdout.readline()
    assert line == b"locked\n", line
    return p


def finish(p):
    if p.poll() is None:
        p.stdin.close()
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def try_lock(path, mode, start=0, length=0):
    """True if the lock is granted at once (and releases it), False on EAGAIN."""
    with open(path, "r+b") as f:
        try:
            if mode == "flock":
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            elif mode == "flock-sh":
                fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
            elif mode == "posix-sh":
                fcntl.lockf(f, fcntl.LOCK_SH | fcntl.LOCK_NB, length, start)
            else:
                fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB, length, start)
        except OSError as e:
            assert e.errno in (11, 13), e  # EAGAIN (EACCES is allowed by POSIX)
            return False
        return True


@pytest.fixture
def two_mounts(monkeypatch, make_cluster, make_mount):
    monkeypatch.setenv("STOKER_SESSION_LEASE_MS", str(LEASE_MS))
    c = make_cluster()
    a = make_mount(c, "a")
    b = make_mount(c, "b")
    with open(os.path.join(a.path, "f"), "wb") as f:
        f.write(b"x" * 4096)
    return c, a, b


@needs_fuse
@pytest.mark.parametrize("mode", ["flock", "posix"])
def test_lock_blocks_other_mount_until_close(two_mounts, mode):
    c, a, b = two_mounts
    p = holder(os.path.join(a.path, "f"), mode)
    try:
        assert not try_lock(os.path.join(b.path, "f"), mode)
        # The same mount is refused too: the lock lives in meta, not in one kernel.
        assert not try_lock(os.path.join(a.path, "f"), mode)
    finally:
        finish(p)
    wait_until(lambda: try_lock(os.path.join(b.path, "f"), mode), what="lock after close")


@needs_fuse
def test_shared_flock_locks_coexist(two_mounts):
    c, a, b = two_mounts
    p = holder(os.path.join(a.path, "f"), "flock-sh")
    try:
        assert try_lock(os.path.join(b.path, "f"), "flock-sh")
        assert not try_lock(os.path.join(b.path, "f"), "flock")
    finally:
        finish(p)


@needs_fuse
def test_flock_and_posix_locks_are_independent(two_mounts):
    c, a, b = two_mounts
    p = holder(os.path.join(a.path, "f"), "flock")
    try:
        assert try_lock(os.path.join(b.path, "f"), "posix")
    finally:
        finish(p)


@needs_fuse
def test_byte_ranges_and_getlk(two_mounts):
    c, a, b = two_mounts
    p = holder(os.path.join(a.path, "f"), "range")  # bytes 100..109, exclusive
    try:
        fb = os.path.join(b.path, "f")
        assert try_lock(fb, "posix", 0, 100)
        assert try_lock(fb, "posix", 110, 1000)
        assert not try_lock(fb, "posix", 105, 1)
        assert not try_lock(fb, "posix-sh", 109, 1)
        assert not try_lock(fb, "posix", 50, 0)  # 50 to the end of file
        # F_GETLK names the conflicting lock and its holder.
        with open(fb, "r+b") as f:
            q = struct.pack("hhxxxxqqixxxx", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
            r = struct.unpack("hhxxxxqqixxxx", fcntl.fcntl(f, fcntl.F_GETLK, q))
            assert r[0] == fcntl.F_WRLCK
            assert (r[2], r[3]) == (100, 10)
            assert r[4] == p.pid
            q = struct.pack("hhxxxxqqixxxx", fcntl.F_WRLCK, os.SEEK_SET, 0, 100, 0)
            r = struct.unpack("hhxxxxqqixxxx", fcntl.fcntl(f, fcntl.F_GETLK, q))
            assert r[0] == fcntl.F_UNLCK
    finally:
        finish(p)


@needs_fuse
def test_split_unlock_releases_only_the_middle(two_mounts):
    c, a, b = two_mounts
    with open(os.path.join(a.path, "f"), "r+b") as f:
        fcntl.lockf(f, fcntl.LOCK_EX, 100, 0)  # 0..99
        fcntl.lockf(f, fcntl.LOCK_UN, 10, 40)  # frees 40..49
        fb = os.path.join(b.path, "f")
        assert try_lock(fb, "posix", 40, 10)
        assert not try_lock(fb, "posix", 39, 1)
        assert not try_lock(fb, "posix", 50, 1)
        fcntl.lockf(f, fcntl.LOCK_EX, 10, 40)  # merged back into one 0..99
        assert not try_lock(fb, "posix", 45, 1)
        fcntl.lockf(f, fcntl.LOCK_UN, 0, 0)
        assert try_lock(fb, "posix", 0, 100)


@needs_fuse
@pytest.mark.parametrize("mode", ["flock", "posix"])
def test_killed_holder_releases(two_mounts, mode):
    c, a, b = two_mounts
    p = holder(os.path.join(a.path, "f"), mode)
    assert not try_lock(os.path.join(b.path, "f"), mode)
    p.kill()
    p.wait()
    wait_until(lambda: try_lock(os.path.join(b.path, "f"), mode), what="lock after kill")


@needs_fuse
@pytest.mark.parametrize("mode", ["flock", "posix"])
def test_blocked_waiter_gets_lock(two_mounts, mode):
    c, a, b = two_mounts
    p = holder(os.path.join(a.path, "f"), mode)
    w = spawn(WAIT, os.path.join(b.path, "f"), mode)
    try:
        assert w.stdout.readline() == b"waiting\n"
        assert w.poll() is None
        finish(p)
        assert w.stdout.readline() == b"got\n"
        assert not try_lock(os.path.join(a.path, "f"), mode)
    finally:
        finish(p)
        finish(w)


@needs_fuse
@pytest.mark.parametrize("mode", ["flock", "posix"])
def test_signal_interrupts_waiter(two_mounts, mode):
    c, a, b = two_mounts
    p = holder(os.path.join(a.path, "f"), mode)
    w = spawn(WAIT, os.path.join(b.path, "f"), mode)
    try:
        assert w.stdout.readline() == b"waiting\n"
        # A signal before the call reaches the daemon interrupts it just the same.
        time.sleep(0.5)
        w.send_signal(signal.SIGUSR1)
        assert w.stdout.readline() == b"eintr\n"
        assert w.wait(timeout=60) == 0
    finally:
        finish(p)
        finish(w)
    wait_until(lambda: try_lock(os.path.join(b.path, "f"), mode), what="lock after close")


@needs_fuse
def test_mount_daemon_killed_releases_after_lease(two_mounts):
    c, a, b = two_mounts
    p = holder(os.path.join(a.path, "f"), "posix")
    q = holder(os.path.join(a.path, "f"), "flock")
    try:
        assert not try_lock(os.path.join(b.path, "f"), "posix")
        assert not try_lock(os.path.join(b.path, "f"), "flock")
        os.kill(a.pid(), signal.SIGKILL)
        wait_until(lambda: try_lock(os.path.join(b.path, "f"), "posix"), timeout=90,
                   what="the lease of the killed mount to run out")
        assert try_lock(os.path.join(b.path, "f"), "flock")
    finally:
        for h in (p, q):
            h.kill()
            h.wait()
        subprocess.run(["umount", "-l", a.path], check=False)


COUNTER = r"""
import os, sys
from filelock import FileLock
d, n = sys.argv[1], int(sys.argv[2])
lock = FileLock(os.path.join(d, "counter.lock"))
for _ in range(n):
    with lock:
        with open(os.path.join(d, "counter")) as f:
            v = int(f.read())
        with open(os.path.join(d, "counter"), "w") as f:
            f.write(str(v + 1))
"""


@needs_fuse
def test_python_filelock_mutual_exclusion(two_mounts):
    c, a, b = two_mounts
    with open(os.path.join(a.path, "counter"), "w") as f:
        f.write("0")
    n = 25
    procs = [subprocess.Popen([PY, "-c", COUNTER, m.path, str(n)]) for m in (a, b, a, b)]
    for p in procs:
        assert p.wait(timeout=300) == 0
    with open(os.path.join(b.path, "counter")) as f:
        assert int(f.read()) == 4 * n


def flushes(addr):
    """FLUSH requests the mount served, from its metrics."""
    with urllib.request.urlopen("http://%s/metrics" % addr, timeout=10) as r:
        text = r.read().decode()
    m = re.search(r'^stoker_client_ops_total\{[^}]*op="flush"[^}]*\} (\S+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


@needs_fuse
def test_read_only_closes_flush_once_the_mount_has_seen_a_posix_lock(make_cluster, make_mount):
    """A read-only close sends no FLUSH (a round trip per small file read) until the
    mount serves its first POSIX lock; from then on every close does, so that closing
    any descriptor of a file drops the process's locks on it as POSIX says."""
    c = make_cluster()
    addr = "127.0.0.1:%d" % free_port()
    m = make_mount(c, "m", opts=["metrics=" + addr])
    path = os.path.join(m.path, "f")
    with open(path, "wb") as f:
        f.write(b"x" * 4096)
    wait_until(lambda: flushes(addr) >= 1, what="the write's flush counted")
    time.sleep(0.3)  # counts land just after the replies
    base = flushes(addr)
    for _ in range(20):
        with open(path, "rb") as f:
            assert f.read() == b"x" * 4096
    time.sleep(0.3)
    assert flushes(addr) == base
    with open(path, "r+b") as f:  # the mount's first POSIX lock
        fcntl.lockf(f, fcntl.LOCK_EX)
        fcntl.lockf(f, fcntl.LOCK_UN)
    for _ in range(5):
        with open(path, "rb") as f:
            f.read()
    wait_until(lambda: flushes(addr) >= base + 6, what="flushes of read-only closes")


@needs_fuse
@pytest.mark.parametrize("how", ["close", "exit"])
def test_lock_through_read_only_descriptor_goes_with_it(two_mounts, how):
    """A shared POSIX lock taken through a read-only descriptor of a mount that had
    seen no lock before (its closes send no FLUSH) goes when that descriptor is
    closed, or its process exits, while the process itself lives on."""
    c, a, b = two_mounts
    p = spawn(HOLD_RO, os.path.join(a.path, "f"))
    try:
        assert p.stdout.readline() == b"locked\n"
        assert not try_lock(os.path.join(b.path, "f"), "posix")
        assert try_lock(os.path.join(b.path, "f"), "posix-sh")
        p.stdin.write(how.encode() + b"\n")
        p.stdin.flush()
        if how == "close":
            assert p.stdout.readline() == b"closed\n"
        wait_until(lambda: try_lock(os.path.join(b.path, "f"), "posix"),
                   what="lock after the read-only descriptor went")
    finally:
        finish(p)
