"""The POSIX mount (`stoker mount`, FUSE): real programs and system calls through it,
checked against what the native client sees, with the errno each misuse must give.

Runs as root (FUSE mounts, a non-root caller through setuid); skipped otherwise."""
import ctypes
import errno
import hashlib
import os
import signal
import stat
import subprocess
import tempfile
import time

import pytest

from conftest import META_SHARDS, MOUNT_SHARD, NOBODY, Mount, STOKER, as_nobody, errno_of, needs_fuse, pick_ports, run, wait_until

pytestmark = needs_fuse

MiB = 1 << 20
PY = "/usr/bin/python3"


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(MiB)
            if not b:
                return h.hexdigest()
            h.update(b)


def tool_sha256(path):
    return run(["sha256sum", str(path)]).stdout.split()[0].decode()


def process_gone(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(") ", 1)[1][0] in "ZX"
    except FileNotFoundError:
        return True


def wait_for(cond, timeout=5.0):
    end = time.time() + timeout
    while time.time() < end:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


# ---- data round trips with real programs ----

SIZES = [0, 1, 4095, 4096, MiB - 1, MiB, MiB + 1, 4 * MiB + 123, 17 * MiB - 5, 50 * MiB + 7]


def test_round_trip_cp_cat_sha256(cluster, mount, rand_file, tmp_path):
    for size in SIZES:
        src = rand_file(size, seed=size)
        dst = os.path.join(mount.path, "f-%d" % size)
        run(["cp", str(src), dst])
        want = sha256(src)
        assert os.stat(dst).st_size == size
        assert tool_sha256(dst) == want, size
        # what the native client reads is what went through the mount
        native = cluster.cli("cat", "/f-%d" % size).stdout
        assert len(native) == size and hashlib.sha256(native).hexdigest() == want, size
        out = tmp_path / "out"
        with open(out, "wb") as f:
            subprocess.run(["cat", dst], stdout=f, check=True)
        assert sha256(out) == want, size


def read_in_mib(path):
    """The file read the way a sequential reader does: 1 MiB at a time."""
    out = bytearray()
    with open(path, "rb", buffering=0) as f:
        while True:
            b = f.read(MiB)
            if not b:
                return bytes(out)
            out += b


def drop_page_cache():
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def test_cold_sequential_reads_are_whole_and_checked(cluster, mount, rand_file):
    """A cold sequential read goes from the chunk files straight into the reply, the
    header and the data of each chunk in one direct read: every size comes back
    whole, and a flipped bit in a chunk's data or header is EIO, never other bytes."""
    sizes = [MiB, 2 * MiB + 4096, 3 * MiB + 1000, 1000, 300 * 1024 + 1]
    want = {}
    for size in sizes:
        src = rand_file(size, seed=size + 7)
        cluster.cli("put", str(src), "/cold-%d" % size)
        want[size] = src.read_bytes()
    for _ in range(2):  # cold, then whatever the first read left behind
        drop_page_cache()
        for size in sizes:
            got = read_in_mib(os.path.join(mount.path, "cold-%d" % size))
            assert got == want[size], size

    def chunk_of(name, idx):
        ino = os.stat(os.path.join(mount.path, name)).st_ino
        found = [c for c in cluster.chunk_files()
                 if os.path.basename(c) == str(idx) and os.path.basename(os.path.dirname(c)) == "%x" % ino]
        assert len(found) == 1, (name, idx, found)
        return found[0]

    def flip(path, at):
        with open(path, "r+b") as f:
            f.seek(at)
            b = f.read(1)
            f.seek(at)
            f.write(bytes([b[0] ^ 0x40]))

    data_victim = chunk_of("cold-%d" % (3 * MiB + 1000), 1)
    flip(data_victim, os.path.getsize(data_victim) - 5000)  # a data block
    head_victim = chunk_of("cold-%d" % (2 * MiB + 4096), 0)
    flip(head_victim, 40)  # the header's CRC of the first block
    drop_page_cache()
    for name in ("cold-%d" % (3 * MiB + 1000), "cold-%d" % (2 * MiB + 4096)):
        with pytest.raises(OSError) as e:
            read_in_mib(os.path.join(mount.path, name))
        assert e.value.errno == errno.EIO, name
    # what the flips did not touch still reads
    drop_page_cache()
    with open(os.path.join(mount.path, "cold-%d" % (3 * MiB + 1000)), "rb", buffering=0) as f:
        assert f.read(MiB) == want[3 * MiB + 1000][:MiB]
    assert read_in_mib(os.path.join(mount.path, "cold-%d" % MiB)) == want[MiB]
    log = open(os.path.join(cluster.data, "log", "storage.log")).read()
    assert "checksum mismatch" in log


def test_round_trip_dd_and_native_writes(cluster, mount, rand_file, tmp_path):
    size = 20 * MiB + 12345
    src = rand_file(size, seed=7)
    dst = os.path.join(mount.path, "dd.bin")
    # 64 KiB blocks: many writes per chunk, none aligned to the 1 MiB chunks at the end
    run(["dd", "if=%s" % src, "of=%s" % dst, "bs=65536", "conv=fsync", "status=none"])
    assert hashlib.sha256(cluster.cli("cat", "/dd.bin").stdout).hexdigest() == sha256(src)
    out = tmp_path / "dd.out"
    run(["dd", "if=%s" % dst, "of=%s" % out, "bs=1M", "status=none"])
    assert sha256(out) == sha256(src)
    # written by the native client, read through the mount
    src2 = rand_file(9 * MiB + 1, seed=8)
    cluster.cli("put", str(src2), "/native.bin")
    assert tool_sha256(os.path.join(mount.path, "native.bin")) == sha256(src2)


def test_write_back_cache_round_trip(cluster, make_mount, rand_file):
    m = make_mount(cluster, "wb", opts=["writeback"])
    src = rand_file(6 * MiB + 3, seed=9)
    dst = os.path.join(m.path, "wb.bin")
    run(["cp", str(src), dst])
    assert hashlib.sha256(cluster.cli("cat", "/wb.bin").stdout).hexdigest() == sha256(src)
    # partial overwrites and appends through the kernel's page cache
    with open(dst, "r+b") as f:
        f.seek(MiB - 2)
        f.write(b"abcd")
    with open(dst, "ab") as f:
        f.write(b"tail")
    want = bytearray(open(src, "rb").read())
    want[MiB - 2:MiB + 2] = b"abcd"
    want += b"tail"
    assert cluster.cli("cat", "/wb.bin").stdout == bytes(want)


# ---- namespace semantics and errno ----

def test_create_exclusive_and_names(mount):
    p = os.path.join(mount.path, "x")
    os.close(os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o640))
    assert errno_of(os.open, p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o640) == errno.EEXIST
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o640
    assert errno_of(os.open, os.path.join(mount.path, "n" * 256),
                    os.O_CREAT | os.O_WRONLY) == errno.ENAMETOOLONG
    assert errno_of(os.open, os.path.join(mount.path, "missing"), os.O_RDONLY) == errno.ENOENT
    os.mkdir(os.path.join(mount.path, "d"))
    assert errno_of(os.mkdir, os.path.join(mount.path, "d")) == errno.EEXIST
    assert errno_of(os.open, os.path.join(mount.path, "d"), os.O_WRONLY) == errno.EISDIR
    assert errno_of(os.rmdir, p) == errno.ENOTDIR
    assert errno_of(os.unlink, os.path.join(mount.path, "d")) == errno.EISDIR
    assert errno_of(os.open, os.path.join(p, "under-a-file"), os.O_CREAT | os.O_WRONLY) == \
        errno.ENOTDIR


def test_rmdir_and_rename_rules(cluster, mount):
    d = os.path.join(mount.path, "d")
    os.makedirs(os.path.join(d, "sub"))
    with open(os.path.join(d, "f"), "w") as f:
        f.write("f")
    assert errno_of(os.rmdir, d) == errno.ENOTEMPTY
    assert errno_of(os.rename, d, os.path.join(d, "sub", "x")) == errno.EINVAL
    # rename over a non-empty folder fails; over a file, atomically replaces
    os.mkdir(os.path.join(mount.path, "e"))
    assert errno_of(os.rename, os.path.join(mount.path, "e"), d) == errno.ENOTEMPTY
    with open(os.path.join(mount.path, "g"), "w") as f:
        f.write("g")
    os.rename(os.path.join(mount.path, "g"), os.path.join(d, "f"))
    assert open(os.path.join(d, "f")).read() == "g"
    assert cluster.cli("cat", "/d/f").stdout == b"g"
    assert not os.path.exists(os.path.join(mount.path, "g"))
    os.rmdir(os.path.join(d, "sub"))
    os.unlink(os.path.join(d, "f"))
    os.rmdir(d)
    assert cluster.cli("ls", "/d", check=False).returncode == 1


def renameat2(src, dst, flags):
    libc = ctypes.CDLL(None, use_errno=True)
    if not hasattr(libc, "renameat2"):
        pytest.skip("no renameat2 in libc")
    AT_FDCWD = -100
    rc = libc.renameat2(AT_FDCWD, src.encode(), AT_FDCWD, dst.encode(), flags)
    return 0 if rc == 0 else ctypes.get_errno()


def test_rename_noreplace_and_exchange(cluster, mount):
    a, b = os.path.join(mount.path, "a"), os.path.join(mount.path, "b")
    for p, s in ((a, "A"), (b, "B")):
        with open(p, "w") as f:
            f.write(s)
    assert renameat2(a, b, 1) == errno.EEXIST  # RENAME_NOREPLACE
    assert open(a).read() == "A" and open(b).read() == "B"
    assert renameat2(a, b, 2) == 0  # RENAME_EXCHANGE
    assert open(a).read() == "B" and open(b).read() == "A"
    assert cluster.cli("cat", "/a").stdout == b"B"
    assert renameat2(a, os.path.join(mount.path, "c"), 1) == 0
    assert open(os.path.join(mount.path, "c")).read() == "B"
    assert renameat2(b, os.path.join(mount.path, "c"), 4) == errno.EINVAL  # RENAME_WHITEOUT


def test_truncate_up_and_down_reads_zeros(cluster, mount):
    p = os.path.join(mount.path, "t")
    with open(p, "wb") as f:
        f.write(b"a" * 100)
    os.truncate(p, 3 * MiB + 5)
    d = open(p, "rb").read()
    assert d == b"a" * 100 + bytes(3 * MiB + 5 - 100)
    os.truncate(p, 50)
    assert open(p, "rb").read() == b"a" * 50
    os.truncate(p, 2 * MiB)  # the old bytes past 50 must not come back
    assert open(p, "rb").read() == b"a" * 50 + bytes(2 * MiB - 50)
    assert cluster.cli("cat", "/t").stdout == b"a" * 50 + bytes(2 * MiB - 50)
    # ftruncate on a handle that has buffered writes
    fd = os.open(p, os.O_RDWR)
    os.pwrite(fd, b"z" * 1000, 0)
    os.ftruncate(fd, 10)
    assert os.fstat(fd).st_size == 10
    os.close(fd)
    assert open(p, "rb").read() == b"z" * 10
    assert cluster.cli("cat", "/t").stdout == b"z" * 10
    # O_TRUNC on open
    with open(p, "wb") as f:
        f.write(b"new")
    assert open(p, "rb").read() == b"new"
    # truncate by name while a descriptor still buffers writes past the new size
    fd = os.open(p, os.O_WRONLY)
    os.write(fd, b"q" * 5000)
    os.truncate(p, 100)
    assert os.stat(p).st_size == 100
    os.close(fd)
    assert os.stat(p).st_size == 100 and open(p, "rb").read() == b"q" * 100
    assert cluster.cli("cat", "/t").stdout == b"q" * 100


def test_pwrite_at_offsets_and_size_while_open(cluster, mount):
    p = os.path.join(mount.path, "p")
    fd = os.open(p, os.O_CREAT | os.O_RDWR, 0o644)
    os.pwrite(fd, b"XYZ", 5 * MiB)
    os.pwrite(fd, b"abc", 10)
    os.pwrite(fd, b"M" * 4096, MiB - 2048)  # across a chunk boundary
    # before any close: the size is what was written, through the fd and by name
    assert os.fstat(fd).st_size == 5 * MiB + 3
    assert os.stat(p).st_size == 5 * MiB + 3
    assert os.pread(fd, 3, 5 * MiB) == b"XYZ"
    assert os.pread(fd, 13, 0) == bytes(10) + b"abc"
    os.close(fd)
    data = cluster.cli("cat", "/p").stdout
    assert len(data) == 5 * MiB + 3
    assert data[10:13] == b"abc" and data[5 * MiB:] == b"XYZ"
    assert data[MiB - 2048:MiB + 2048] == b"M" * 4096
    assert data[13:MiB - 2048] == bytes(MiB - 2048 - 13)
    # appends from two descriptors in one mount interleave, never overwrite
    q = os.path.join(mount.path, "log")
    f1 = os.open(q, os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o644)
    f2 = os.open(q, os.O_WRONLY | os.O_APPEND)
    for i in range(5):
        os.write(f1, b"1%d" % i)
        os.write(f2, b"2%d" % i)
    os.close(f1)
    os.close(f2)
    assert open(q, "rb").read() == b"".join(b"1%d2%d" % (i, i) for i in range(5))


def test_read_after_write_across_descriptors(cluster, mount):
    """One mount is one client: a write through one descriptor is seen by every other
    at once, before any close, as on a local file system."""
    p = os.path.join(mount.path, "shared-fd")
    open(p, "w").close()
    r0 = os.open(p, os.O_RDONLY)  # opened before anyone writes
    w = os.open(p, os.O_WRONLY)
    os.write(w, b"first line\n")  # a partial page, still in the writer's buffer
    r = os.open(p, os.O_RDONLY)
    assert os.read(r, 100) == b"first line\n"
    # drop the kernel's cached pages, so that the reads below come from the daemon
    os.posix_fadvise(r0, 0, 0, os.POSIX_FADV_DONTNEED)
    assert os.read(r0, 100) == b"first line\n"
    os.write(w, b"second\n")
    assert os.pread(r, 100, 0) == b"first line\nsecond\n"
    r2 = os.open(p, os.O_RDONLY)  # opened after the writes, before the close
    assert os.fstat(r2).st_size == 18 and os.read(r2, 100) == b"first line\nsecond\n"
    os.pwrite(w, b"X" * 3 * MiB, MiB)  # a large write, partly straight to storage
    os.posix_fadvise(r0, 0, 0, os.POSIX_FADV_DONTNEED)
    assert os.pread(r2, 4, 3 * MiB) == b"XXXX" and os.fstat(r).st_size == 4 * MiB
    assert os.pread(r0, 4, 4 * MiB - 4) == b"XXXX"
    # fsync through the writer makes it durable and visible to the native client
    os.fsync(w)
    assert len(cluster.cli("cat", "/shared-fd").stdout) == 4 * MiB
    for fd in (w, r, r2, r0):
        os.close(fd)
    assert open(p, "rb").read(18) == b"first line\nsecond\n"


STRESS_SCRIPT = r"""
import os, random, sys
path, i, n, reg, bs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), 65536
r = random.Random(i)
fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
offs = list(range(0, reg, bs))
r.shuffle(offs)
for k, o in enumerate(offs):
    os.pwrite(fd, bytes([65 + i]) * bs, i * reg + o)
    if k % 5 == 0:  # another writer's block: its bytes or zeros, byte by byte
        # A read racing a write may see it half done: the page cache copies a write
        # and grows the size a page at a time, and a read of a page already cached
        # takes no lock, so it may catch a copy midway (a local file system's reads
        # do too). Each byte is the writer's or not yet written, never anyone
        # else's. What lands is checked whole at the end.
        j = r.randrange(n)
        d = os.pread(fd, bs, j * reg + r.randrange(0, reg, bs))
        bad = set(d) - {0, 65 + j}
        assert not bad, (j, len(d), sorted(bad)[:4])
    if k % 7 == 0:
        os.fsync(fd)
os.close(fd)
"""


def test_concurrent_writers_one_file(cluster, mount):
    """Processes writing and reading one file through one mount at once (they share
    its buffered handle): every byte lands, nothing is torn or lost."""
    p = os.path.join(mount.path, "shared.bin")
    n, reg = 6, MiB
    procs = [subprocess.Popen([PY, "-c", STRESS_SCRIPT, p, str(i), str(n), str(reg)],
                              stderr=subprocess.PIPE) for i in range(n)]
    for pr in procs:
        _, err = pr.communicate(timeout=120)
        assert pr.returncode == 0, err.decode()
    want = b"".join(bytes([65 + i]) * reg for i in range(n))
    assert os.stat(p).st_size == n * reg
    assert open(p, "rb").read() == want
    assert cluster.cli("cat", "/shared.bin").stdout == want


def test_hard_links_and_symlinks(cluster, mount):
    p = os.path.join(mount.path, "orig")
    with open(p, "w") as f:
        f.write("linked")
    os.mkdir(os.path.join(mount.path, "d"))
    q = os.path.join(mount.path, "d", "other")
    os.link(p, q)
    assert os.stat(p).st_nlink == 2 and os.stat(q).st_nlink == 2
    assert os.stat(p).st_ino == os.stat(q).st_ino
    os.unlink(p)
    assert os.stat(q).st_nlink == 1 and open(q).read() == "linked"
    assert "Links: 1" in cluster.cli("stat", "/d/other").stdout.decode()
    assert errno_of(os.link, os.path.join(mount.path, "d"), os.path.join(mount.path, "dl")) \
        == errno.EPERM
    # symlinks: relative and absolute targets, lstat, dangling
    s = os.path.join(mount.path, "s")
    os.symlink("d/other", s)
    assert os.readlink(s) == "d/other"
    assert os.lstat(s).st_size == len("d/other") and stat.S_ISLNK(os.lstat(s).st_mode)
    assert open(s).read() == "linked"
    os.symlink("/nowhere/at/all", os.path.join(mount.path, "dangling"))
    assert os.readlink(os.path.join(mount.path, "dangling")) == "/nowhere/at/all"
    assert errno_of(os.stat, os.path.join(mount.path, "dangling")) == errno.ENOENT
    assert "-> d/other" in cluster.cli("ls", "-l", "/").stdout.decode()
    assert errno_of(os.symlink, "x", s) == errno.EEXIST


def test_chmod_chown_utime(cluster, mount):
    p = os.path.join(mount.path, "m")
    with open(p, "w") as f:
        f.write("m")
    os.chmod(p, 0o4751)
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o4751
    os.chown(p, 1234, 5678)
    st = os.stat(p)
    assert (st.st_uid, st.st_gid) == (1234, 5678)
    os.utime(p, ns=(1_000_000_123, 2_000_000_456))
    st = os.stat(p)
    assert st.st_atime_ns == 1_000_000_123 and st.st_mtime_ns == 2_000_000_456
    out = cluster.cli("stat", "/m").stdout.decode()
    assert "Uid: 1234" in out and "Gid: 5678" in out and "Modify: 2.000000456" in out
    before = time.time_ns()
    os.utime(p)  # UTIME_NOW
    assert os.stat(p).st_mtime_ns >= before - 2_000_000_000
    # directories too, and ctime moves on every change
    d = os.path.join(mount.path, "dir")
    os.mkdir(d, 0o700)
    ctime = os.stat(d).st_ctime_ns
    time.sleep(0.01)
    os.chmod(d, 0o755)
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o755 and os.stat(d).st_ctime_ns > ctime


def test_statfs_and_unsupported(mount):
    v = os.statvfs(mount.path)
    assert v.f_bsize > 0 and v.f_blocks > 0 and v.f_bavail <= v.f_blocks
    # The four targets of `stoker up` share the data folder's disk: df counts it once
    # (its figures are the storage node's last heartbeat, a second old at most).
    def df_is_the_disk():
        v, disk = os.statvfs(mount.path), os.statvfs(mount.cluster.data)
        used, disk_used = ((x.f_blocks - x.f_bfree) * x.f_frsize for x in (v, disk))
        return (abs(v.f_blocks * v.f_frsize - disk.f_blocks * disk.f_frsize) < 4 * v.f_frsize
                and abs(used - disk_used) < max(256 << 20, disk_used // 50))
    wait_until(df_is_the_disk, 15, "df on the mount to show the data folder's disk once")
    assert v.f_namemax == 255
    df = run(["df", "-P", mount.path]).stdout.decode()
    assert mount.path in df and "stk://" in df
    p = os.path.join(mount.path, "f")
    open(p, "w").close()
    # special files are inodes (test_mount_posix.py has the rest)
    os.mkfifo(os.path.join(mount.path, "fifo"))
    assert stat.S_ISFIFO(os.stat(os.path.join(mount.path, "fifo")).st_mode)
    # xattrs are (test_mount_posix.py); an absent one is ENODATA
    assert errno_of(os.getxattr, p, "user.k") == errno.ENODATA
    # fallocate grows the size (mode 0); punching holes is refused
    fd = os.open(p, os.O_RDWR)
    os.posix_fallocate(fd, 0, 3 * 4096)
    assert os.fstat(fd).st_size == 3 * 4096
    os.close(fd)
    assert os.stat(p).st_size == 3 * 4096 and open(p, "rb").read() == bytes(3 * 4096)


def test_readdir_10000_entries(cluster, mount):
    d = os.path.join(mount.path, "many")
    os.mkdir(d)
    names = set("f%05d" % i for i in range(10000))
    for n in names:
        os.close(os.open(os.path.join(d, n), os.O_CREAT | os.O_WRONLY, 0o644))
    os.mkdir(os.path.join(d, "sub"))
    listed = os.listdir(d)
    assert len(listed) == len(set(listed)) == 10001
    assert set(listed) == names | {"sub"}
    kinds = {e.name: e.is_dir() for e in os.scandir(d)}
    assert kinds["sub"] and not kinds["f00042"]
    # `ls -l` uses readdirplus and then stats every entry
    lines = run(["ls", "-la", d]).stdout.decode().splitlines()
    assert len(lines) == 10001 + 3  # "total", ".", ".."
    assert len(cluster.cli("ls", "/many").stdout.split()) == 10001
    # entries removed between two listings disappear
    for i in range(0, 10000, 2):
        os.unlink(os.path.join(d, "f%05d" % i))
    assert len(os.listdir(d)) == 5001


def test_two_mounts_close_to_open(cluster, make_mount):
    m1 = make_mount(cluster, "m1")
    m2 = make_mount(cluster, "m2")
    a, b = os.path.join(m1.path, "shared"), os.path.join(m2.path, "shared")
    with open(a, "wb") as f:
        f.write(b"v1" * 1000)
    assert open(b, "rb").read() == b"v1" * 1000  # b now has it in its page cache
    with open(a, "wb") as f:
        f.write(b"version-2" * 3000)
    assert open(b, "rb").read() == b"version-2" * 3000  # grown: open sees the new size
    with open(a, "r+b") as f:
        f.write(b"XX")
    assert open(b, "rb").read(4) == b"XXrs"  # same size, new bytes: the cache is dropped
    # a reader that stays open keeps its view until it reopens; a new open sees the write
    with open(b, "rb") as reader:
        with open(a, "ab") as f:
            f.write(b"more")
        with open(b, "rb") as again:
            assert again.read()[-4:] == b"more"
        reader.read()
    # renames and unlinks show within the attribute timeout (1 s)
    os.rename(a, a + ".new")
    assert wait_for(lambda: not os.path.exists(b), 3)
    assert open(b + ".new", "rb").read(2) == b"XX"
    os.unlink(b + ".new")
    # m1 still caches the name, but an open asks meta: gone at once
    assert errno_of(open, a + ".new", "rb") == errno.ENOENT
    assert wait_for(lambda: not os.path.exists(a + ".new"), 3)
    os.mkdir(os.path.join(m2.path, "fromb"))
    assert wait_for(lambda: os.path.isdir(os.path.join(m1.path, "fromb")), 3)


def meta_figure(cluster, name, **labels):
    """The sum of meta's samples of name with these labels, scraped now: of every
    shard's meta (STOKER_TEST_META_SHARDS; shard k > 1's metrics are 50 + k - 2
    ports up, docs/meta-shards.md)."""
    from test_metrics import http, parse, scrape, total
    samples, _ = scrape(cluster, "meta")
    n = total(samples, name, **labels)
    for k in range(2, META_SHARDS + 1):
        samples, _ = parse(http("127.0.0.1:%d" % (cluster.port + 50 + k - 2))[2])
        n += total(samples, name, **labels)
    return n


def lookups_at_meta(cluster):
    return sum(meta_figure(cluster, "stoker_rpc_requests_total", op=op)
               for op in ("META_LOOKUP", "META_LOOKUP_CACHE"))


def lease_holders(cluster):
    """Holders of the shard the mounts' folders are on (STOKER_TEST_MOUNT_SHARD): a
    mount watches a shard once it has used it."""
    from test_metrics import http, parse, scrape, total
    if MOUNT_SHARD > 1:
        samples, _ = parse(http("127.0.0.1:%d" % (cluster.port + 50 + MOUNT_SHARD - 2))[2])
    else:
        samples, _ = scrape(cluster, "meta")
    return total(samples, "stoker_meta_lease_holders")


def changes_are_seen_at_once(a, b, lookups):
    """Two mounts with no kernel caching, a(name) and b(name) one folder through each,
    holding a 10-byte file f: every change through b is seen through a at once; a
    folder a made is known whole to a (names not in it answered without meta, by
    lookups(): meta's lookup count) until b adds one, which a then sees at once."""
    os.chmod(b("f"), 0o600)
    assert stat.S_IMODE(os.stat(a("f")).st_mode) == 0o600
    with open(b("f"), "ab") as f:
        f.write(b"y" * 5)
    assert os.stat(a("f")).st_size == 15
    os.utime(b("f"), (1000000000, 1200000000))
    assert os.stat(a("f")).st_mtime == 1200000000
    assert errno_of(os.stat, a("g")) == errno.ENOENT  # a cached "no such name"
    open(b("g"), "wb").close()
    assert os.stat(a("g")).st_size == 0
    os.rename(b("g"), b("h"))
    assert errno_of(os.stat, a("g")) == errno.ENOENT and os.path.exists(a("h"))
    os.link(b("h"), b("h2"))
    assert os.stat(a("h")).st_nlink == 2
    os.unlink(b("h"))
    assert errno_of(os.stat, a("h")) == errno.ENOENT and os.stat(a("h2")).st_nlink == 1
    os.mkdir(b("sub"))
    assert os.path.isdir(a("sub"))
    os.rmdir(b("sub"))
    assert errno_of(os.stat, a("sub")) == errno.ENOENT
    os.mkdir(a("new"))
    open(a("new/mine"), "wb").close()
    before = lookups()
    for i in range(50):
        assert errno_of(os.stat, a("new/none%d" % i)) == errno.ENOENT
    assert os.path.exists(a("new/mine"))
    assert lookups() - before < 10
    open(b("new/theirs"), "wb").close()
    assert os.path.exists(a("new/theirs")) and os.path.exists(a("new/mine"))
    # a's own changes show in both at once too
    os.unlink(a("new/mine"))
    assert errno_of(os.stat, a("new/mine")) == errno.ENOENT
    assert errno_of(os.stat, b("new/mine")) == errno.ENOENT


def test_lookup_cache_is_coherent_across_mounts(cluster, make_mount):
    # No kernel caching of names or attributes: every stat reaches the mount's own
    # lookup cache, which must never answer from before a change another mount made.
    nocache = ["entry_timeout=0", "attr_timeout=0"]
    m1 = make_mount(cluster, "m1", opts=nocache)
    m2 = make_mount(cluster, "m2", opts=nocache)
    os.mkdir(os.path.join(m1.path, "d"))
    a = lambda n: os.path.join(m1.path, "d", n)
    b = lambda n: os.path.join(m2.path, "d", n)
    with open(b("f"), "wb") as f:
        f.write(b"x" * 10)
    assert os.stat(a("f")).st_size == 10
    # answered by m1 itself now: repeated stats do not reach meta
    before = lookups_at_meta(cluster)
    for _ in range(50):
        assert os.stat(a("f")).st_size == 10
    assert lookups_at_meta(cluster) - before < 10
    # every change through m2 is seen through m1 at once, no waiting
    changes_are_seen_at_once(a, b, lambda: lookups_at_meta(cluster))
    # and m1's own changes show in m1 at once too
    os.unlink(a("f"))
    assert errno_of(os.stat, a("f")) == errno.ENOENT
    assert errno_of(os.stat, b("f")) == errno.ENOENT
    # search permission is checked on cached answers as meta checks it
    os.chmod(os.path.join(m2.path, "d"), 0o700)
    out = run(["setpriv", "--reuid=%d" % NOBODY, "--regid=%d" % NOBODY, "--clear-groups",
               "/usr/bin/python3", "-c",
               "import os,sys\ntry:\n os.stat(sys.argv[1]); print('ok')\n"
               "except OSError as e: print(e.errno)", a("h2")], check=False)
    assert out.stdout.decode().strip() == str(errno.EACCES), out


def test_getattr_answers_from_the_lookup_cache_and_sees_every_change(cluster, make_mount):
    # m1 keeps names in the kernel but no attributes: every stat is a GETATTR, which
    # m1 answers from its lookup cache under a lease on the inode, and must never
    # answer from before a change another mount made.
    m1 = make_mount(cluster, "m1", opts=["entry_timeout=60", "attr_timeout=0"])
    m2 = make_mount(cluster, "m2", opts=["entry_timeout=0", "attr_timeout=0"])
    wait_until(lambda: lease_holders(cluster) >= 2, 30, "both mounts' watches")
    a, b = os.path.join(m1.path, "f"), os.path.join(m2.path, "f")
    with open(b, "wb") as f:
        f.write(b"x" * 10)

    def served_by_m1():
        getattrs = lambda: meta_figure(cluster, "stoker_rpc_requests_total", op="META_GETATTR")
        before = getattrs()
        for _ in range(20):
            assert os.stat(a).st_size == 10
        if getattrs() - before < 5:
            return True
        # The lookup went while a loaded machine answered m1's watch late, so it took
        # no lease: drop the kernel's names, so that the next round looks it up again.
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("2")
        return False

    wait_until(served_by_m1, 30, "m1 answering stat itself")
    fd = os.open(a, os.O_RDONLY)
    try:
        os.chmod(b, 0o600)
        assert stat.S_IMODE(os.stat(a).st_mode) == 0o600
        with open(b, "ab") as f:
            f.write(b"y" * 5)
        assert os.stat(a).st_size == 15 and os.fstat(fd).st_size == 15
        os.truncate(b, 3)
        assert os.fstat(fd).st_size == 3
        os.utime(b, (1000000000, 1200000000))
        assert os.stat(a).st_mtime == 1200000000
        os.link(b, b + "2")
        assert os.fstat(fd).st_nlink == 2
        os.unlink(b)
        os.unlink(b + "2")
        assert os.fstat(fd).st_nlink == 0  # open in m1: still there, with no name
        assert os.read(fd, 10) == b"xxx"
    finally:
        os.close(fd)


def test_leased_attributes_stay_in_the_kernel_until_revoked(cluster, make_mount):
    # The gateways' mount: attr_timeout=0 but leased_attr_timeout, so the kernel keeps
    # attributes the mount holds under a lease and answers fstat itself (no GETATTR
    # reaches the mount), until another mount's change revokes the lease: the kernel
    # must then have forgotten them before that change returns.
    from test_metrics import free_port, http, parse, total
    addr = "127.0.0.1:%d" % free_port()
    m1 = make_mount(cluster, "m1", opts=["entry_timeout=0", "attr_timeout=0",
                                         "leased_attr_timeout=30", "metrics=" + addr])
    m2 = make_mount(cluster, "m2", opts=["entry_timeout=0", "attr_timeout=0"])
    wait_until(lambda: lease_holders(cluster) >= 2, 30, "both mounts' watches")
    a, b = os.path.join(m1.path, "f"), os.path.join(m2.path, "f")
    with open(b, "wb") as f:
        f.write(b"x" * 10)
    getattrs = lambda: total(parse(http(addr)[2])[0], "stoker_client_ops_total",
                             frontend="fuse", op="getattr")
    fds, size = [], [10]

    def kept_by_the_kernel():
        # The open's lookup takes the lease; on a loaded machine m1's watch may answer
        # late and the lookup take none: open again then.
        fds.append(os.open(a, os.O_RDONLY))
        os.fstat(fds[-1])
        before = getattrs()
        for _ in range(50):
            assert os.fstat(fds[-1]).st_size == size[0]
        return getattrs() - before < 10

    try:
        wait_until(kept_by_the_kernel, 30, "fstat answered by m1's kernel")
        fd = fds[-1]
        os.chmod(b, 0o600)
        assert stat.S_IMODE(os.fstat(fd).st_mode) == 0o600
        with open(b, "ab") as f:
            f.write(b"y" * 5)
        assert os.fstat(fd).st_size == 15
        with open(a, "rb") as f:  # close-to-open: a new open reads what m2 closed
            assert f.read() == b"x" * 10 + b"y" * 5
        with open(b, "r+b") as f:  # same size, other bytes: only the times move
            f.write(b"z" * 15)
        assert os.fstat(fd).st_mtime_ns == os.stat(b).st_mtime_ns
        with open(a, "rb") as f:
            assert f.read() == b"z" * 15
        os.utime(b, (1000000000, 1200000000))
        assert os.fstat(fd).st_mtime == 1200000000
        os.truncate(b, 3)
        assert os.fstat(fd).st_size == 3
        # and the kernel keeps them again once m1 looked the file up anew
        size[0] = 3
        wait_until(kept_by_the_kernel, 30, "fstat answered by m1's kernel again")
    finally:
        for fd in fds:
            os.close(fd)


@pytest.mark.serial
def test_lookup_cache_survives_a_killed_mount(cluster, make_mount):
    # A mount killed while it holds leases must not hold up others' changes for long.
    nocache = ["entry_timeout=0", "attr_timeout=0"]
    m1 = make_mount(cluster, "m1", opts=nocache)
    m2 = make_mount(cluster, "m2", opts=nocache)
    # Both watches answered, so m1's lookups below take leases (on a loaded machine a
    # mount's first watch can come after them, and nothing would wait).
    wait_until(lambda: lease_holders(cluster) >= 2, 30, "both mounts' watches")
    for i in range(20):
        open(os.path.join(m2.path, "f%d" % i), "wb").close()
    before = meta_figure(cluster, "stoker_meta_leases")

    def m1_leased():
        # A lookup m1 sends while it does not trust its cache (a watch answered late
        # on a loaded machine) takes no lease: look again until meta holds m1's
        # leases on the 20 inodes and their folder.
        for i in range(20):
            os.stat(os.path.join(m1.path, "f%d" % i))
        return meta_figure(cluster, "stoker_meta_leases") >= before + 21

    wait_until(m1_leased, 30, "m1's leases")
    pid = m1.pid()
    os.kill(pid, signal.SIGSTOP)  # alive, holding leases, acknowledging nothing
    try:
        t0 = time.monotonic()
        os.unlink(os.path.join(m2.path, "f0"))
        waited = time.monotonic() - t0
        assert 1.5 < waited < 10, waited  # meta waited out m1's trust, then went on
        t0 = time.monotonic()
        os.unlink(os.path.join(m2.path, "f1"))
        assert time.monotonic() - t0 < 1.5  # m1's cache was reset: no waiting again
    finally:
        os.kill(pid, signal.SIGCONT)
    # m1 stopped trusting its cache while stopped: it sees the changes at once
    assert not os.path.exists(os.path.join(m1.path, "f0"))
    assert not os.path.exists(os.path.join(m1.path, "f1"))
    assert os.path.exists(os.path.join(m1.path, "f2"))


NOBODY_SCRIPT = r"""
import errno, os, sys
root = sys.argv[1]
def try_(fn, *a):
    try:
        fn(*a)
        return "ok"
    except OSError as e:
        return errno.errorcode[e.errno]
print(try_(lambda: open(os.path.join(root, "rootdir", "f"), "w")))
print(try_(os.mkdir, os.path.join(root, "rootdir", "d")))
print(try_(os.unlink, os.path.join(root, "rootdir", "owned")))
print(try_(lambda: open(os.path.join(root, "rootdir", "owned"), "a")))
print(try_(lambda: open(os.path.join(root, "rootdir", "owned")).read()))
print(try_(lambda: open(os.path.join(root, "pub", "mine"), "w").write("n")))
print(try_(os.chmod, os.path.join(root, "rootdir", "owned"), 0o777))
print(try_(os.listdir, os.path.join(root, "private")))
print(try_(lambda: open(os.path.join(root, "pub", "suid"), "a").write("by nobody")))
"""


def test_non_root_gets_eacces(cluster, make_mount, tmp_path):
    # pytest's tmp_path is 0700: nobody could not even reach a mount under it
    where = tempfile.mkdtemp(prefix="stoker-test-mnt-")
    try:
        m = make_mount(cluster, where, opts=["allow_other"], start=False)
        m.logfile = str(tmp_path / "mount.log")
        m.start()
        check_non_root(cluster, m)
    finally:
        Mount(cluster, where).stop()
        os.rmdir(where)


def mount_options(path):
    """The options the kernel shows for the mount at path, from /proc/mounts."""
    for line in open("/proc/mounts"):
        f = line.split()
        if f[1] == str(path):
            return f[3].split(",")
    raise AssertionError("%s is not mounted" % path)


def test_root_only_mount_leaves_permissions_to_meta(cluster, make_mount):
    """Mounted by root without allow_other, only root can enter, so the kernel's own
    permission check (default_permissions) is left out: it would cost a GETATTR of
    the folder after each create or unlink in it. access(2) and chdir are then
    answered by the mount, with root's rules: everything but execute of a file with
    no x bit. -o default_permissions keeps the kernel's check; allow_other implies it."""
    m = make_mount(cluster)
    assert "default_permissions" not in mount_options(m.path)
    k = make_mount(cluster, "k", opts=["default_permissions"])
    assert "default_permissions" in mount_options(k.path)
    for mp in (m, k):
        f = os.path.join(mp.path, "f")
        with open(f, "w") as out:
            out.write("#!/bin/sh\necho ran\n")
        os.chmod(f, 0o644)
        assert os.access(f, os.R_OK | os.W_OK) and not os.access(f, os.X_OK)
        # the kernel refuses to run it either way
        assert errno_of(lambda: subprocess.run([f], capture_output=True)) == errno.EACCES
        os.chmod(f, 0o744)
        assert os.access(f, os.X_OK)
        assert subprocess.run([f], capture_output=True, timeout=30).stdout == b"ran\n"
        d = os.path.join(mp.path, "locked")
        os.mkdir(d, 0o000)
        assert os.access(d, os.R_OK | os.W_OK | os.X_OK)
        assert subprocess.run(["pwd"], cwd=d, capture_output=True, timeout=30).returncode == 0
        with open(os.path.join(d, "inside"), "w") as out:
            out.write("root passes")
        assert os.listdir(d) == ["inside"]
        assert not os.access(os.path.join(mp.path, "missing"), os.R_OK)
        os.unlink(f)
        os.unlink(os.path.join(d, "inside"))
        os.rmdir(d)


URING_PARAM = "/sys/module/fuse/parameters/enable_uring"


def test_requests_come_through_io_uring_per_cpu(cluster, make_mount):
    """On a kernel with FUSE over io_uring (6.14+) a root mount turns it on and serves
    requests from threads pinned to each CPU, so a caller and the thread serving it
    share a CPU; -o nouring keeps /dev/fuse. Both see the same bytes, 1 MiB reads and
    writes included, from threads on every CPU."""
    if not os.path.exists(URING_PARAM):
        pytest.skip("this kernel has no FUSE over io_uring")
    u = make_mount(cluster, "u")
    n = make_mount(cluster, "n", opts=["nouring"])
    assert open(URING_PARAM).read().strip() == "Y"
    cpus = sorted(os.sched_getaffinity(0))
    data = {c: os.urandom(3 * MiB + c) for c in cpus}
    errors = []

    def work(c):
        try:
            os.sched_setaffinity(0, {c})  # this thread only
            for i in range(20):
                with open(os.path.join(u.path, "c%d-%d" % (c, i)), "wb") as f:
                    f.write(data[c][:4096 * i])
            with open(os.path.join(u.path, "big%d" % c), "wb") as f:
                f.write(data[c])
            with open(os.path.join(n.path, "big%d" % c), "rb") as f:
                assert f.read() == data[c]
            with open(os.path.join(n.path, "back%d" % c), "wb") as f:
                f.write(data[c][::-1])
            with open(os.path.join(u.path, "back%d" % c), "rb") as f:
                assert f.read() == data[c][::-1]
            for i in range(20):
                p = os.path.join(u.path, "c%d-%d" % (c, i))
                assert os.stat(p).st_size == 4096 * i
                os.unlink(p)
        except BaseException as e:  # reported below, from the test's thread
            errors.append(e)

    import threading
    ts = [threading.Thread(target=work, args=(c,)) for c in cpus]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors
    assert "io_uring: serving requests through" in u.log(), u.log()
    assert "io_uring: serving" not in n.log(), n.log()
    # a thread of u's daemon is pinned to each CPU
    pinned = set()
    for tid in os.listdir("/proc/%d/task" % u.pid()):
        with open("/proc/%d/task/%s/status" % (u.pid(), tid)) as f:
            allowed = [l.split()[1] for l in f if l.startswith("Cpus_allowed_list:")][0]
        if allowed.isdigit():
            pinned.add(int(allowed))
    assert set(cpus) <= pinned, pinned
    assert sorted(os.listdir(u.path)) == sorted(os.listdir(n.path))


def check_non_root(cluster, m):
    # others can enter: the kernel checks permissions too
    assert "default_permissions" in mount_options(m.path)
    os.mkdir(os.path.join(m.path, "rootdir"), 0o755)
    with open(os.path.join(m.path, "rootdir", "owned"), "w") as f:
        f.write("root's")
    os.chmod(os.path.join(m.path, "rootdir", "owned"), 0o644)
    os.mkdir(os.path.join(m.path, "pub"))
    os.chmod(os.path.join(m.path, "pub"), 0o777)
    os.mkdir(os.path.join(m.path, "private"), 0o700)
    suid = os.path.join(m.path, "pub", "suid")
    open(suid, "w").close()
    os.chmod(suid, 0o4777)
    p = subprocess.run([PY, "-c", NOBODY_SCRIPT, m.path], preexec_fn=as_nobody,
                       capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr.decode()
    assert p.stdout.decode().split() == ["EACCES", "EACCES", "EACCES", "EACCES", "ok", "ok",
                                         "EPERM", "EACCES", "ok"]
    # a write by someone else drops set-uid, as on any Linux file system
    assert stat.S_IMODE(os.stat(suid).st_mode) == 0o777
    assert open(suid).read() == "by nobody"
    st = os.stat(os.path.join(m.path, "pub", "mine"))
    assert (st.st_uid, st.st_gid) == (NOBODY, NOBODY)
    assert "Uid: %d" % NOBODY in cluster.cli("stat", "/pub/mine").stdout.decode()
    assert not os.path.exists(os.path.join(m.path, "rootdir", "f"))


def test_read_only_and_subdir_mounts(cluster, make_mount):
    cluster.cli("mkdir", "-p", "/proj/data")
    cluster.cli("put", "-", "/proj/data/x", input=b"in the subdir")
    sub = make_mount(cluster, "sub", sub="/proj")
    assert sorted(os.listdir(sub.path)) == ["data"]
    assert open(os.path.join(sub.path, "data", "x")).read() == "in the subdir"
    with open(os.path.join(sub.path, "new"), "w") as f:
        f.write("made in the subdir mount")
    assert cluster.cli("cat", "/proj/new").stdout == b"made in the subdir mount"
    os.rename(os.path.join(sub.path, "new"), os.path.join(sub.path, "data", "moved"))
    assert cluster.cli("cat", "/proj/data/moved").stdout == b"made in the subdir mount"
    assert os.stat(sub.path).st_ino != 1  # the subdir's own inode, not the cluster root
    ro = make_mount(cluster, "ro", opts=["ro"])
    assert open(os.path.join(ro.path, "proj", "data", "x")).read() == "in the subdir"
    assert errno_of(lambda: open(os.path.join(ro.path, "w"), "w")) == errno.EROFS
    assert errno_of(os.mkdir, os.path.join(ro.path, "w")) == errno.EROFS
    assert errno_of(os.unlink, os.path.join(ro.path, "proj", "data", "x")) == errno.EROFS


def test_unlink_and_replace_while_open(cluster, mount):
    p = os.path.join(mount.path, "tmpfile")
    fd = os.open(p, os.O_CREAT | os.O_RDWR, 0o600)
    os.write(fd, b"s" * (3 * MiB))
    os.fsync(fd)
    chunks = len(cluster.chunk_files())
    assert chunks >= 3
    os.unlink(p)
    assert not os.path.exists(p)
    assert os.fstat(fd).st_nlink == 0 and os.fstat(fd).st_size == 3 * MiB
    assert os.pread(fd, 4, 2 * MiB) == b"ssss"
    os.pwrite(fd, b"after", 0)
    assert os.pread(fd, 5, 0) == b"after"
    os.close(fd)  # the last close removes the data
    assert wait_for(lambda: len(cluster.chunk_files()) <= chunks - 3, 5)
    # write-then-rename over a file a reader holds: the reader keeps the old bytes
    q = os.path.join(mount.path, "ckpt")
    with open(q, "wb") as f:
        f.write(b"old" * 1000)
    reader = open(q, "rb")
    with open(q + ".tmp", "wb") as f:
        f.write(b"new" * 1000)
    os.rename(q + ".tmp", q)
    assert reader.read() == b"old" * 1000
    reader.close()
    assert open(q, "rb").read() == b"new" * 1000


# ---- mounting and unmounting ----

def test_mount_errors(cluster, tmp_path):
    if not os.path.exists("/dev/fuse"):
        pytest.skip("no /dev/fuse")
    empty = tmp_path / "empty"
    empty.mkdir()
    full = tmp_path / "full"
    full.mkdir()
    (full / "something").write_text("x")
    cluster.cli("put", "-", "/afile", input=b"x")

    def mount(url, mp, *extra):
        p = run([STOKER, "mount", url, str(mp)] + list(extra), check=False, timeout=60)
        return p.returncode, p.stderr.decode()

    rc, err = mount(cluster.url, tmp_path / "missing")
    assert rc != 0 and "missing: No such file or directory" in err
    rc, err = mount(cluster.url, full)
    assert rc != 0 and "not empty" in err and "nonempty" in err
    rc, err = mount(cluster.url, tmp_path / "full" / "something")
    assert rc != 0 and "Not a directory" in err
    rc, err = mount("stk://127.0.0.1:%d" % pick_ports(), empty)
    assert rc != 0 and "cannot reach the cluster" in err
    rc, err = mount(cluster.url + "/nope", empty)
    assert rc != 0 and "/nope: No such file or directory in the cluster" in err
    rc, err = mount(cluster.url + "/afile", empty)
    assert rc != 0 and "/afile: Not a directory" in err
    rc, err = mount(cluster.url, empty, "-o", "no_such_option")
    assert rc != 0 and "unknown option" in err
    rc, err = mount(cluster.url, empty, "-o", "attr_timeout=soon")
    assert rc != 0 and "attr_timeout" in err
    assert os.listdir(empty) == [] and not Mount(cluster, empty).mounted()
    # -o nonempty mounts over the non-empty folder
    m = Mount(cluster, full, opts=["nonempty"])
    m.start()
    try:
        assert m.mounted() and "something" not in os.listdir(full)
    finally:
        m.stop()
    assert os.listdir(full) == ["something"]
    p = run([STOKER, "umount", str(empty)], check=False)
    assert p.returncode != 0 and b"not mounted" in p.stderr


def test_umount_flushes_waits_and_refuses_when_busy(cluster, make_mount):
    m = make_mount(cluster, "m")
    pid = m.pid()
    # a writer that has not closed yet holds the mount busy
    holder = subprocess.Popen([PY, "-c", "import sys, time\n"
                               "f = open(sys.argv[1], 'wb'); f.write(b'w' * 3000000); "
                               "f.flush(); print('ready', flush=True); sys.stdin.read(); "
                               "f.close()", os.path.join(m.path, "held")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert holder.stdout.readline() == b"ready\n"
    p = run([STOKER, "umount", m.path], check=False)
    assert p.returncode != 0 and b"busy" in p.stderr and m.mounted()
    holder.communicate(b"", timeout=60)
    assert holder.returncode == 0
    run([STOKER, "umount", m.path])
    # umount returns only once the daemon has exited
    assert not m.mounted()
    assert process_gone(pid)
    assert cluster.cli("cat", "/held").stdout == b"w" * 3000000
    # and the mount point can be mounted again
    m.start()
    assert open(os.path.join(m.path, "held"), "rb").read(1) == b"w"


def test_kill9_daemon_then_umount_clears_the_mount(cluster, make_mount):
    m = make_mount(cluster, "m")
    with open(os.path.join(m.path, "before"), "w") as f:
        f.write("durable at close")
    os.kill(m.pid(), signal.SIGKILL)
    assert wait_for(lambda: errno_of(os.stat, m.path) == errno.ENOTCONN, 5)
    p = run([STOKER, "mount", cluster.url, m.path], check=False)
    assert p.returncode != 0 and b"stoker umount" in p.stderr
    run([STOKER, "umount", m.path])
    assert not m.mounted() and os.listdir(m.path) == []
    assert cluster.cli("cat", "/before").stdout == b"durable at close"
    m.start()
    assert open(os.path.join(m.path, "before")).read() == "durable at close"


def meta_counts(cluster):
    """Requests meta served, per op, from its /metrics (BASE+11), summed over every
    shard's meta (shard k > 1's at BASE+50+k-2)."""
    import re
    import urllib.request

    out = {}
    for port in [cluster.port + 11] + [cluster.port + 50 + k - 2
                                       for k in range(2, META_SHARDS + 1)]:
        url = "http://127.0.0.1:%d/metrics" % port
        with urllib.request.urlopen(url, timeout=10) as r:
            text = r.read().decode()
        for m in re.finditer(r'^stoker_rpc_requests_total\{[^}]*op="(\w+)"[^}]*\}\s+(\S+)$',
                             text, re.M):
            out[m.group(1)] = out.get(m.group(1), 0) + float(m.group(2))
    return out


def delta(before, after, op):
    return int(after.get(op, 0) - before.get(op, 0))


def test_open_and_create_cost_one_meta_call(cluster, make_mount, monkeypatch):
    """Round trips to meta, counted by meta's /metrics: an open through the mount of a
    file whose attributes its lookup cache holds under a lease asks meta nothing (the
    open reference is sent later, and not at all when the close comes first); without
    the cache it is one META_OPEN, which registers the open reference and brings the
    fresh attributes (no META_GETATTR); a create is one META_CREATE, which registers
    it too (no META_OPEN)."""

    def counts():
        return meta_counts(cluster)

    # Long cache timeouts: the kernel asks nothing but the opens themselves. Creates
    # each wait for meta (test_write_behind.py has those answered by the mount).
    opts = ["attr_timeout=600", "entry_timeout=600", "noatime"]
    m = make_mount(cluster, opts=opts + ["nowritebehind"])
    monkeypatch.setenv("STOKER_LOOKUP_CACHE", "0")
    nc = make_mount(cluster, "nocache", opts=opts)
    n = 50
    data = os.urandom(16384)
    path = os.path.join(m.path, "f")
    with open(path, "wb") as f:
        f.write(data)
    for mnt, per_open in ((m, 0), (nc, 1)):
        p = os.path.join(mnt.path, "f")
        for _ in range(2):  # the kernel learns the name and size; the session is renewed
            with open(p, "rb") as f:
                assert f.read() == data
        time.sleep(0.5)
        before = counts()
        for _ in range(n):
            with open(p, "rb") as f:
                assert f.read() == data
        time.sleep(0.1)  # an open reference left unsent would go within 20 ms
        after = counts()
        if per_open:
            assert delta(before, after, "META_OPEN") == n * per_open, mnt.path
        else:
            # An open that outlives the 10 ms its reference waits before it is sent
            # (a slow sanitizer run) is sent: a stray one, not one per open.
            assert delta(before, after, "META_OPEN") <= 2, mnt.path
        # Per open, none (one each before META_OPEN brought the attributes). A stray
        # one or two may come from elsewhere on a slow (sanitizer) run: the kernel
        # revalidating the root, the session's renewal.
        assert delta(before, after, "META_GETATTR") <= 2
        assert delta(before, after, "META_LOOKUP") <= 2

    os.mkdir(os.path.join(m.path, "d"))
    before = counts()
    for i in range(n):
        with open(os.path.join(m.path, "d", "new%d" % i), "wb"):
            pass
    after = counts()
    assert delta(before, after, "META_CREATE") == n
    assert delta(before, after, "META_OPEN") <= 2


def test_ls_l_asks_meta_for_attributes_in_batches(cluster, make_mount):
    """`ls -l` of a folder a mount has not seen: the kernel lists it with readdirplus,
    whose names are looked up at meta a batch at a time (META_LOOKUPS, leased), not one
    META_GETATTR or META_LOOKUP per name; each name has its own size, mode and owner,
    and a name removed through another mount after the listing is not shown."""
    w = make_mount(cluster, "writer")
    d = os.path.join(w.path, "many")
    os.mkdir(d)
    n = 600
    for i in range(n):
        p = os.path.join(d, "f%04d" % i)
        with open(p, "wb") as f:
            f.write(b"x" * (i % 97))
        os.chmod(p, 0o600 + (i % 8))
        if i % 5 == 0:
            os.chown(p, 1000 + i, 2000 + i)
    r = make_mount(cluster, "reader")
    before = meta_counts(cluster)
    seen = {}
    for e in os.scandir(os.path.join(r.path, "many")):
        st = e.stat(follow_symlinks=False)
        seen[e.name] = (st.st_size, st.st_mode & 0o7777, st.st_uid, st.st_gid)
    after = meta_counts(cluster)
    want = {"f%04d" % i: (i % 97, 0o600 + (i % 8), 1000 + i if i % 5 == 0 else 0,
                          2000 + i if i % 5 == 0 else 0) for i in range(n)}
    assert seen == want
    asked = delta(before, after, "META_LOOKUPS")
    assert 1 <= asked <= n // 20
    assert delta(before, after, "META_GETATTRS") == 0
    assert delta(before, after, "META_GETATTR") + delta(before, after, "META_LOOKUP") < n // 10
    lines = run(["ls", "-ln", os.path.join(r.path, "many")]).stdout.decode().splitlines()
    assert len(lines) == n + 1
    # Gone through the writer before the reader lists: not shown, the rest are.
    os.unlink(os.path.join(d, "f0007"))
    time.sleep(1.2)  # the reader's entry and attribute caches (1 s) run out
    names = run(["ls", "-l", os.path.join(r.path, "many")]).stdout.decode()
    assert " f0007\n" not in names and " f0008\n" in names


def test_a_big_folder_this_mount_made_stays_known(cluster, make_mount):
    """A folder the mount made is known name by name in its lookup cache, so "no
    such name" needs no round trip to meta. With more names than the cache's sets
    hold evenly, some are given up for others: those are remembered as such (and
    looked up at meta, found), while other absent names are still answered here."""
    m = make_mount(cluster, opts=["entry_timeout=0", "attr_timeout=0"])
    d = os.path.join(m.path, "big")
    os.mkdir(d)
    n = 12000
    for i in range(n):
        os.close(os.open(os.path.join(d, "file-%06d" % i), os.O_CREAT | os.O_WRONLY, 0o644))
    before = meta_counts(cluster)
    absent = 2000
    for i in range(absent):
        assert not os.path.exists(os.path.join(d, "none-%06d" % i))
    after = meta_counts(cluster)
    asked = delta(before, after, "META_LOOKUP") + delta(before, after, "META_LOOKUP_CACHE")
    assert asked < absent // 10, asked
    for i in range(n):  # every name is found, those given up too
        assert stat.S_ISREG(os.stat(os.path.join(d, "file-%06d" % i)).st_mode)


def test_metadata_round_trips_with_default_options(cluster, make_mount):
    """With the default options (1 s caches, relatime, write-behind): creates in a
    folder the mount made are answered by the mount and reach meta in batches
    (META_NAMES), with no META_LOOKUP or META_CREATE each; once another mount has
    looked at the folder, an unlink is a META_LOOKUP and a META_UNLINK, with no
    META_GETATTR of the folder (meta sends its attributes with the reply); a read
    of a fresh file this
    mount made asks meta nothing to open it (its lookup cache holds the file under a
    lease: no META_OPEN, no META_GETATTR for the size) and no META_SETATTR for atime:
    closes and reads to record go in batches (META_CLOSES). And what the
    mount answers from those replies is right: the folder's times as another mount
    sees them, after creates and after a rename, and a file's size after a write."""
    a = make_mount(cluster, "a")
    b = make_mount(cluster, "b", opts=["attr_timeout=0", "entry_timeout=0"])
    n = 40
    d = os.path.join(a.path, "d")
    os.mkdir(d)
    os.stat(d)
    time.sleep(0.3)
    before = meta_counts(cluster)
    for i in range(n):
        os.close(os.open(os.path.join(d, "e%d" % i), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    after = meta_counts(cluster)
    assert delta(before, after, "META_CREATE") == 0
    assert 1 <= delta(before, after, "META_NAMES") <= n
    assert delta(before, after, "META_GETATTR") <= 2  # the kernel revalidating the root
    assert delta(before, after, "META_LOOKUP") <= 2
    # The folder's times as the creates left them: what a mount with no cache sees.
    da, db = os.stat(d), os.stat(os.path.join(b.path, "d"))
    assert (da.st_mtime_ns, da.st_ctime_ns, da.st_nlink) == \
        (db.st_mtime_ns, db.st_ctime_ns, db.st_nlink)
    # A rename in it moves them again; the mount must not answer the create's.
    time.sleep(0.01)
    os.rename(os.path.join(d, "e0"), os.path.join(d, "renamed"))
    created = da.st_mtime_ns
    da, db = os.stat(d), os.stat(os.path.join(b.path, "d"))
    assert da.st_mtime_ns == db.st_mtime_ns and da.st_mtime_ns > created
    os.rename(os.path.join(d, "renamed"), os.path.join(d, "e0"))

    time.sleep(0.3)
    before = meta_counts(cluster)
    for i in range(n):
        os.unlink(os.path.join(d, "e%d" % i))
    after = meta_counts(cluster)
    # b has looked at the folder since: it is no longer a's alone, each unlink asks meta
    assert delta(before, after, "META_UNLINK") == n
    assert delta(before, after, "META_GETATTR") <= 2
    assert os.listdir(d) == [] and os.listdir(os.path.join(b.path, "d")) == []

    # Fresh files read once: atime is due on each.
    data = [os.urandom(16384) for _ in range(n)]
    before = meta_counts(cluster)
    for i in range(n):
        with open(os.path.join(d, "f%d" % i), "wb") as f:
            f.write(data[i][:8192])
            f.flush()
            f.write(data[i][8192:])
    # The kernel asks for security.capability before each write: a new file has none.
    assert delta(before, meta_counts(cluster), "META_GETXATTR") == 0
    time.sleep(1.2)  # the kernel's names and attributes expire
    t0 = time.time_ns()
    before = meta_counts(cluster)
    for i in range(n):
        with open(os.path.join(d, "f%d" % i), "rb") as f:
            assert f.read() == data[i]
    after = meta_counts(cluster)
    # An open's reference goes to meta only if the file is still open 10 ms later
    # (a loaded CI machine: a few of them), never one per open.
    assert delta(before, after, "META_OPEN") <= n // 4
    assert delta(before, after, "META_GETATTR") <= 2
    assert delta(before, after, "META_SETATTR") == 0
    assert delta(before, after, "META_CLOSE") == 0
    # The reads and closes reach meta in batches, a moment later.
    wait_until(lambda: all(os.stat(os.path.join(b.path, "d", "f%d" % i)).st_atime_ns
                           >= t0 - 2_000_000_000 for i in range(n)), 5, "the reads' atime")
    closes = delta(before, meta_counts(cluster), "META_CLOSES")
    assert 1 <= closes <= n
    # Meta's replies to those records carried what each left: the lookup cache kept
    # the files, so a second pass (the next epoch of a data loader) asks meta no
    # lookup, and a stat shows the atime meta recorded (what a mount without
    # caches sees).
    time.sleep(1.2)
    before = meta_counts(cluster)
    for i in range(n):
        with open(os.path.join(d, "f%d" % i), "rb") as f:
            assert f.read() == data[i]
    after = meta_counts(cluster)
    assert delta(before, after, "META_LOOKUP") + delta(before, after, "META_LOOKUP_CACHE") == 0
    assert delta(before, after, "META_OPEN") <= n // 4
    for i in range(n):
        assert os.stat(os.path.join(d, "f%d" % i)).st_atime_ns == \
            os.stat(os.path.join(b.path, "d", "f%d" % i)).st_atime_ns

    # A read-only open keeps the attributes it fetched for the first read's getattr;
    # a write through the same mount in between must not leave them to be answered.
    p = os.path.join(d, "f0")
    with open(p, "rb") as r:
        with open(p, "ab") as w:
            w.write(b"more")
        assert os.fstat(r.fileno()).st_size == 16384 + 4
        assert r.read() == data[0] + b"more"
    assert os.stat(p).st_size == 16384 + 4



def test_a_listing_leases_its_names_and_changes_elsewhere_are_still_seen(cluster, make_mount):
    """readdirplus looks a listing's names up in one leased META_LOOKUPS, so the files
    of a folder listed through a fresh mount are then opened without a lookup at meta
    each, also after the kernel dropped its entries. The leases keep close-to-open:
    what another mount or the native client changes afterwards is seen at the next
    open (docs/mount.md)."""
    b = make_mount(cluster, "b")
    db = os.path.join(b.path, "imgs", "cls")
    os.makedirs(db)
    names = ["s%03d" % i for i in range(120)]
    for n in names:
        with open(os.path.join(db, n), "wb") as f:
            f.write(n.encode() * 50)
    a = make_mount(cluster, "a")  # fresh: nothing of the folder cached
    da = os.path.join(a.path, "imgs", "cls")
    batched = meta_figure(cluster, "stoker_rpc_requests_total", op="META_LOOKUPS")
    listed = {e.name: e.stat().st_size for e in os.scandir(da)}  # readdirplus
    assert listed == {n: 200 for n in names}
    assert meta_figure(cluster, "stoker_rpc_requests_total", op="META_LOOKUPS") > batched
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("2\n")  # the kernel's entries go, the mount's leased ones stay
    before = lookups_at_meta(cluster)
    for n in names:
        with open(os.path.join(da, n), "rb") as f:
            assert f.read() == n.encode() * 50
    # the two folders on the way may be asked for again, no file is
    assert lookups_at_meta(cluster) - before <= 2
    # changes through the other mount, each seen at the next open through a
    with open(os.path.join(db, "s000"), "wb") as f:
        f.write(b"rewritten by b")
    os.unlink(os.path.join(db, "s001"))
    with open(os.path.join(db, "tmp"), "wb") as f:
        f.write(b"renamed over by b")
    os.rename(os.path.join(db, "tmp"), os.path.join(db, "s002"))
    with open(os.path.join(db, "s999"), "wb") as f:
        f.write(b"made by b")
    with open(os.path.join(da, "s000"), "rb") as f:
        assert f.read() == b"rewritten by b"
    with pytest.raises(FileNotFoundError):
        open(os.path.join(da, "s001"), "rb")
    with open(os.path.join(da, "s002"), "rb") as f:
        assert f.read() == b"renamed over by b"
    with open(os.path.join(da, "s999"), "rb") as f:
        assert f.read() == b"made by b"
    listed = {e.name: e.stat().st_size for e in os.scandir(da)}
    assert "s001" not in listed and listed["s999"] == 9 and listed["s000"] == 14
    # and through the native client
    cluster.cli("rm", "/imgs/cls/s003")
    with pytest.raises(FileNotFoundError):
        open(os.path.join(da, "s003"), "rb")
    assert os.stat(os.path.join(da, "s004")).st_size == 200
