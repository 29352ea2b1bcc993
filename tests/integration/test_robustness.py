"""What must survive: kill -9, corruption, a full disk, hostile frames."""
import errno
import os
import signal
import subprocess
import time

import pytest

from conftest import CHECK, STOKER, needs_root, run, wait_until
from test_purge import killed_client
from test_mount import read_in_mib

MiB = 1 << 20


def test_kill9_everything_loses_no_acknowledged_data(make_cluster):
    c = make_cluster()
    writer = subprocess.Popen([CHECK, "ackloop", c.url, "/ack"], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL)
    time.sleep(4)
    pids = c.pids()
    assert set(pids) == {"mgmtd", "meta", "storage"}
    # kill the supervisor first so nothing is restarted, then every daemon at once
    up_pid = int(open(os.path.join(c.data, "up.pid")).read())
    os.kill(up_pid, signal.SIGKILL)
    for pid in pids.values():
        os.kill(pid, signal.SIGKILL)
    writer.kill()
    out, _ = writer.communicate()
    acked = [l.split() for l in out.decode().splitlines() if l.startswith("ACK ")]
    assert len(acked) >= 3, "the writer acknowledged too little to test anything"
    time.sleep(0.5)
    c.start()
    for _, path, size, seed in acked:
        c.check("verify", path, size, seed)
    # the file being written when the lights went out is whole or absent: never
    # a half-written chunk that fails its checksum
    names = c.cli("ls", "/ack").stdout.decode().split()
    for n in names:
        c.cli("cat", "/ack/" + n)


def test_kill9_of_storage_under_load_recovers(cluster):
    """A daemon killed mid-write is restarted by `stoker up`; the client's retries
    carry the write through."""
    writer = subprocess.Popen([CHECK, "write", cluster.url, "/under-load.bin", str(200 * MiB),
                               "5", str(MiB)], stderr=subprocess.PIPE)
    time.sleep(0.5)
    os.kill(cluster.pids()["storage"], signal.SIGKILL)
    _, err = writer.communicate(timeout=120)
    assert writer.returncode == 0, err
    cluster.check("verify", "/under-load.bin", str(200 * MiB), "5")


def test_corrupted_chunk_is_detected_not_returned(cluster, rand_file, tmp_path):
    src = rand_file(2 * MiB)
    cluster.cli("put", str(src), "/victim.bin")
    chunks = sorted(cluster.chunk_files())
    assert len(chunks) == 2
    victim = chunks[0]
    with open(victim, "r+b") as f:
        f.seek(os.path.getsize(victim) - 1000)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0x40]))
    p = cluster.cli("get", "/victim.bin", str(tmp_path / "out"), check=False)
    assert p.returncode == 1
    assert b"Input/output error" in p.stderr
    assert not (tmp_path / "out").exists()
    log = open(os.path.join(cluster.data, "log", "storage.log")).read()
    assert "checksum mismatch" in log
    assert os.path.basename(victim) in log or "chunk" in log


@needs_root
def test_full_disk_gives_enospc_and_keeps_data(make_cluster, tmp_path, rand_file):
    c = make_cluster("full", targets=2, start=False)
    mounted = []
    try:
        for t in c.target_dirs():
            os.makedirs(t, exist_ok=True)
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", t], check=True)
            mounted.append(t)
        c.start()
        keep = rand_file(3 * MiB, seed=11)
        c.cli("put", str(keep), "/keep.bin")
        p = c.check("fill", "/filler.bin", check=False, timeout=300)
        assert p.returncode == 0, p.stderr
        assert p.stdout.startswith(b"ENOSPC")
        assert c.cli("cat", "/keep.bin").stdout == keep.read_bytes()
        # the acknowledged part of the filler is intact too
        acked = int(p.stdout.split()[1])
        assert acked > 0
        c.cli("rm", "/filler.bin")
        c.cli("put", str(keep), "/after.bin")  # space is usable again
        assert c.cli("cat", "/after.bin").stdout == keep.read_bytes()
    finally:
        c.stop()
        for t in mounted:
            subprocess.run(["umount", "-l", t])


@needs_root
def test_a_full_metadata_disk_gives_enospc_and_keeps_the_namespace(make_cluster, make_mount):
    """The namespace's map only covers what its disk allocated: on a full disk meta
    refuses writes with ENOSPC (not EIO from a write that stopped half-way), keeps
    every acknowledged change, reuses what removals free, and opens again after a
    restart. Unlinks still work there although each frees a file whose purge needs
    a record: meta keeps those purges in memory, and still removes the chunks
    (here of files whose client was killed right after its unlink, so that only
    meta can)."""
    c = make_cluster("metafull", targets=1, start=False)
    meta_dir = os.path.join(c.data, "meta")
    os.makedirs(meta_dir)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=56m", "tmpfs", meta_dir], check=True)
    m = None
    try:
        c.start()
        m = make_mount(c)
        pid = c.pids()["meta"]
        datas, base = [], len(c.chunk_files())
        for i in range(3):
            with open(os.path.join(m.path, "data%d" % i), "wb") as f:
                f.write(os.urandom(2 * MiB + i))
            datas.append("/data%d" % i)
        assert len(c.chunk_files()) == base + 8
        pad = os.urandom(60000)
        made, err = [], None
        for i in range(3000):
            p = os.path.join(m.path, "f%04d" % i)
            try:
                os.close(os.open(p, os.O_CREAT | os.O_WRONLY, 0o644))
                os.setxattr(p, "user.pad", bytes([i % 256]) + pad)
            except OSError as e:
                err = e
                break
            made.append(p)
        assert err is not None and err.errno == errno.ENOSPC, err
        assert len(made) > 600, "the map never grew past its first 32 MiB"
        assert c.pids()["meta"] == pid
        for i, p in enumerate(made):
            assert os.getxattr(p, "user.pad") == bytes([i % 256]) + pad
        # Fill what the last failure left with smaller values, to the last page.
        for size in (16000, 4000, 1000, 100):
            for i, p in enumerate(made):
                try:
                    os.setxattr(p, "user.top", os.urandom(size))
                except OSError as e:
                    assert e.errno == errno.ENOSPC, e
                    break
        # The first unlinks on the full map: the data files', by a client that dies.
        killed_client(c, *["unlink:" + p for p in datas])
        wait_until(lambda: len(c.chunk_files()) == base, timeout=30,
                   what="meta to remove the chunks of files unlinked on a full map")
        for p in made[:200]:
            os.unlink(p)
        after = os.path.join(m.path, "after")
        os.close(os.open(after, os.O_CREAT | os.O_WRONLY, 0o644))
        os.setxattr(after, "user.pad", pad)
        assert os.path.getsize(os.path.join(meta_dir, "meta", "data.mdb")) <= 56 * MiB
        m.stop()
        c.stop()
        c.start()
        m.start()
        assert os.getxattr(after, "user.pad") == pad
        assert os.getxattr(made[-1], "user.pad") == bytes([(len(made) - 1) % 256]) + pad
        assert "cannot grow the namespace" in c.logs()
        with open(os.path.join(c.data, "log", "meta.log"), errors="replace") as f:
            assert "kept in memory only" in f.read()
    finally:
        if m:
            m.stop()
        c.stop()
        subprocess.run(["umount", "-l", meta_dir])


def test_malformed_truncates_truncate_nothing(cluster):
    """A STOR_TRUNCATES with too many records, fewer than it says, one cut short or
    bytes after the last is refused whole: the file it names keeps its data."""
    data = os.urandom(5 * MiB + 123)
    cluster.cli("put", "-", "/victim", input=data)
    stat = cluster.cli("stat", "/victim").stdout.decode()
    ino = stat.split("Inode:")[1].split()[0]
    run([CHECK, "truncates", "127.0.0.1:%d" % (cluster.port + 2), ino])
    assert cluster.cli("cat", "/victim").stdout == data


def test_hostile_watches_are_contained(cluster):
    """META_WATCH with session 0, another session's holder id, an acknowledgement of
    records never sent, a wait of 49 days; META_LOOKUP_CACHE for a holder that does
    not exist: refused or contained, and meta still serves."""
    out = run([CHECK, "watch", "127.0.0.1:%d" % (cluster.port + 1)])
    assert out.stdout.strip() == b"watch: ok"
    cluster.cli("put", "-", "/still-alive", input=b"ok")
    assert cluster.cli("cat", "/still-alive").stdout == b"ok"


@pytest.mark.parametrize("role", ["mgmtd", "meta", "storage"])
def test_malformed_frames_close_only_that_connection(cluster, role):
    port = cluster.port + {"mgmtd": 0, "meta": 1, "storage": 2}[role]
    run([CHECK, "frames", "127.0.0.1:%d" % port])
    # and the cluster still works
    cluster.cli("put", "-", "/still-alive", input=b"ok")
    assert cluster.cli("cat", "/still-alive").stdout == b"ok"


@needs_root
def test_a_stream_through_the_mount_checks_every_block_it_reads_past_the_cache(
        cluster, make_mount, monkeypatch):
    """The mount reads a sequential stream's local chunks with O_DIRECT, straight into
    its reply (its kernel caches the bytes), never through the chunk files' page
    cache: the bytes must be the file's, and a block that no longer matches its
    checksum must fail the read, not be returned."""
    monkeypatch.setenv("STOKER_SHORT_CIRCUIT", "1")  # the sanitizer runs turn it off
    monkeypatch.delenv("STOKER_DIRECT_STREAMS", raising=False)
    data = os.urandom(6 * MiB + 12345)
    cluster.cli("put", "-", "/stream.bin", input=data)
    m = make_mount(cluster, "m")
    path = os.path.join(m.path, "stream.bin")
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")
    assert read_in_mib(path) == data
    # the whole chunks (all but the short last one) were read past the page cache
    chunks = sorted(cluster.chunk_files())
    assert len(chunks) == 7, chunks
    resident = run(["fincore", "-b", "-n", "-r", "-o", "RES"] + chunks).stdout.split()
    assert sum(1 for r in resident if int(r) == 0) >= 5, list(zip(chunks, resident))
    # a byte of chunk 3 flipped on disk: the kernel's copy of the file goes too
    victim = [p for p in cluster.chunk_files() if p.endswith("/3")]
    assert len(victim) == 1, victim
    with open(victim[0], "r+b") as f:
        f.seek(os.path.getsize(victim[0]) - 5000)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0x10]))
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")
    with open(path, "rb", buffering=0) as f:
        assert f.read(3 * MiB) == data[:3 * MiB]
        with pytest.raises(OSError) as e:
            while f.read(MiB):
                pass
    assert e.value.errno == 5  # EIO
    log = open(os.path.join(cluster.data, "log", "storage.log")).read()
    assert "checksum mismatch" in log


@pytest.mark.plaintext_wire
def test_a_daemon_of_another_wire_version_is_named(tmp_path):
    """A client meeting a daemon of another wire version (here a stand-in that
    answers every frame NOTSUP from version STK_WIRE_VERSION + 1, as a newer daemon
    does) fails with a line that names both versions, not a hang or a bare error."""
    import socket
    import threading

    from test_auth import HDR, MAGIC, REPLY, VERSION, recv_exact

    ST_NOTSUP = 12
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    port = srv.getsockname()[1]
    seen = []

    def serve_one(s):
        with s:
            while True:
                h = recv_exact(s, HDR.size)
                if h is None:
                    return
                f = HDR.unpack(h)
                if f[6] + f[7] and recv_exact(s, f[6] + f[7]) is None:
                    return
                seen.append((f[1], f[2]))
                s.sendall(HDR.pack(MAGIC, VERSION + 1, f[2], REPLY, ST_NOTSUP, f[5], 0, 0, 0, 0))

    def serve():
        while True:
            try:
                s, _ = srv.accept()
            except OSError:
                return
            threading.Thread(target=serve_one, args=(s,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    try:
        env = dict(os.environ, STOKER_CLUSTER="stk://127.0.0.1:%d" % port,
                   STOKER_RETRY_MS="500")
        env.pop("STOKER_KEY_FILE", None)
        env.pop("STOKER_TLS", None)
        p = run([STOKER, "ls", "/"], env=env, check=False, timeout=60)
    finally:
        srv.close()
    assert p.returncode != 0
    assert seen and all(v == VERSION for v, _ in seen), seen
    msg = "speaks wire protocol version %d, this process %d" % (VERSION + 1, VERSION)
    assert msg.encode() in p.stderr, p.stderr
