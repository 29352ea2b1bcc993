"""`stoker fsck` (docs/fsck.md): a healthy cluster is clean; planted problems of
the data (a chunk of an inode that does not exist, a chunk gone from every
replica) and of the namespace (records edited in a stopped meta's LMDB store) are
each reported, --repair fixes the safe ones and a second run is clean; and a
cluster under a writer and an unlinker gives no false alarm."""
import json
import os
import shutil
import struct
import pty
import subprocess
import tempfile
import threading
import time

from conftest import (BUILD, NOBODY, STOKER, Mount, as_nobody, have_fuse, pick_ports, run,
                      wait_until)
from pyhelp import stoker

MiB = 1 << 20
PLANT = os.path.join(BUILD, "tests", "stk_meta_plant")
OLD = time.time() - 7200  # older than the default grace period (600 s)


def fsck(cluster, *args):
    p = cluster.cli("fsck", "--json", *args, check=False, timeout=300)
    assert p.returncode in (0, 1) and p.stdout, p.stderr.decode(errors="replace")
    out = json.loads(p.stdout)
    assert out["clean"] == (p.returncode == 0)
    return out


def kinds(out):
    return sorted(p["kind"] for p in out["list"])


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def chunk_path(target, ino, idx):
    return os.path.join(target, "chunks", "%02x" % (ino & 0xFF), "%x" % ino, str(idx))


def find_chunk(cluster, ino, idx):
    for t in cluster.target_dirs():
        if os.path.exists(chunk_path(t, ino, idx)):
            return t, chunk_path(t, ino, idx)
    raise AssertionError("no copy of chunk %d of inode %d" % (idx, ino))


def plant_chunk(src, target, ino, idx):
    """A copy of chunk file src as chunk idx of inode ino in target, its header
    rewritten to name them (chunkfile.h: ino at 16, idx at 24, nblocks at 28, the
    header CRC after the block CRCs at 40), written two hours ago."""
    with open(src, "rb") as f:
        data = bytearray(f.read())
    nblocks = struct.unpack_from("<I", data, 28)[0]
    struct.pack_into("<QI", data, 16, ino, idx)
    end = 40 + 4 * nblocks
    struct.pack_into("<I", data, end, crc32c(bytes(data[:end])))
    dst = chunk_path(target, ino, idx)
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    with open(dst, "wb") as f:
        f.write(data)
    os.utime(dst, (OLD, OLD))
    return dst


def populate(c):
    c.makedirs("/d/e")
    c.write_file("/d/big", os.urandom(3 * MiB + 100))
    c.write_file("/d/e/small", b"small")
    c.write_file("/empty", b"")
    with c.open("/d/sparse", "wb") as f:
        f.pwrite(b"tail", 5 * MiB)
    c.symlink("/d/big", "/d/link")
    return {p: c.stat(p).st_ino for p in ("/d/big", "/d/e/small", "/d/sparse")}


def test_a_healthy_cluster_is_clean(cluster):
    c = stoker.connect(cluster.url)
    try:
        populate(c)
        cluster.cli("quota", "set", "/d", "--inodes", "100")
    finally:
        c.close()
    out = fsck(cluster)
    assert out["clean"] and out["remaining"] == 0 and out["list"] == []
    assert out["namespace"]["files"] >= 4 and out["namespace"]["dirs"] >= 3
    assert out["data"]["targets"] == cluster.targets and out["data"]["chunks"] >= 5
    p = cluster.cli("fsck")
    assert b"clean: no problem found" in p.stdout


def test_bad_options_and_a_caller_not_root_get_clear_errors(cluster):
    for args, want in ((("--grace", "soon"), b"--grace takes seconds"),
                       (("--grace", "-5"), b"--grace takes seconds"),
                       (("--grace", str(10 * 365 * 86400 + 1)), b"--grace takes seconds"),
                       (("--grace",), b"usage: stoker fsck"),
                       (("--repair", "now"), b"usage: stoker fsck")):
        p = cluster.cli("fsck", *args, check=False)
        assert p.returncode == 2 and want in p.stderr, (args, p.stderr)
        assert p.stdout == b""
    # Someone else than root, with the cluster's key: meta refuses, nothing is read.
    keydir = tempfile.mkdtemp()
    try:
        os.chmod(keydir, 0o755)
        key = os.path.join(keydir, "key")
        shutil.copy(cluster.key_file, key)
        os.chown(key, NOBODY, NOBODY)
        env = cluster.env()
        env["STOKER_KEY_FILE"] = key
        p = subprocess.run([STOKER, "fsck"], env=env, preexec_fn=as_nobody,
                           capture_output=True, timeout=120)
    finally:
        shutil.rmtree(keydir)
    assert p.returncode == 1 and b"only root may run fsck" in p.stderr, p.stderr
    assert p.stdout == b""


def test_progress_goes_to_stderr_when_it_is_a_terminal(cluster):
    c = stoker.connect(cluster.url)
    try:
        populate(c)
    finally:
        c.close()
    master, slave = pty.openpty()
    try:
        p = subprocess.run([STOKER, "fsck"], env=cluster.env(), stdout=subprocess.PIPE,
                           stderr=slave, timeout=120)
        os.close(slave)
        slave = None
        seen = b""
        while True:
            try:
                got = os.read(master, 65536)
            except OSError:  # EIO: the terminal's other side is closed
                break
            if not got:
                break
            seen += got
    finally:
        if slave is not None:
            os.close(slave)
        os.close(master)
    assert p.returncode == 0 and b"clean: no problem found" in p.stdout
    assert b"fsck: checking the namespace" in seen and b"fsck: target " in seen, seen
    assert b"\r\x1b[K" in seen  # each line overwrites the last, and the last is wiped
    assert seen.endswith(b"\r\x1b[K")
    # Not a terminal: no progress at all.
    p = cluster.cli("fsck")
    assert p.stderr == b""


def test_planted_data_problems_are_reported_and_garbage_is_repaired(cluster):
    c = stoker.connect(cluster.url)
    try:
        inos = populate(c)
        big = inos["/d/big"]
        # A chunk of an inode meta never handed out, and one of the big file's chunks
        # gone from its only replica.
        _, src = find_chunk(cluster, big, 0)
        ghost = (1 << 40) + 7
        planted = plant_chunk(src, cluster.target_dirs()[1], ghost, 0)
        _, lost = find_chunk(cluster, big, 1)
        os.unlink(lost)
    finally:
        c.close()
    out = fsck(cluster)
    assert kinds(out) == ["garbage", "missing-chunk"], out
    by_kind = {p["kind"]: p for p in out["list"]}
    assert by_kind["garbage"]["ino"] == ghost and not by_kind["garbage"]["repaired"]
    assert (by_kind["missing-chunk"]["ino"], by_kind["missing-chunk"]["chunk"]) == (big, 1)
    text = cluster.cli("fsck", check=False)
    assert text.returncode == 1
    assert b"garbage" in text.stdout and b"data lost" in text.stdout
    # --repair removes the garbage and invents no data: the lost chunk stays reported.
    out = fsck(cluster, "--repair")
    assert not os.path.exists(planted)
    assert {p["kind"]: p["repaired"] for p in out["list"]} == {"garbage": True,
                                                               "missing-chunk": False}
    assert out["remaining"] == 1 and not out["clean"]
    out = fsck(cluster)
    assert kinds(out) == ["missing-chunk"]
    # The file whose data is lost goes: nothing is left.
    cluster.cli("rm", "/d/big")
    wait_until(lambda: fsck(cluster)["clean"], timeout=30, what="a clean fsck")


def test_young_chunks_of_unknown_inodes_are_left_alone(cluster):
    c = stoker.connect(cluster.url)
    try:
        inos = populate(c)
        _, src = find_chunk(cluster, inos["/d/e/small"], 0)
        planted = plant_chunk(src, cluster.target_dirs()[0], (1 << 40) + 9, 0)
        os.utime(planted)  # written now: a file being created, as far as fsck knows
    finally:
        c.close()
    out = fsck(cluster, "--repair")
    assert out["clean"] and out["data"]["young_unknown"] == 1
    assert os.path.exists(planted)
    out = fsck(cluster, "--repair", "--grace", "0")
    assert kinds(out) == ["garbage"] and out["list"][0]["repaired"] and out["clean"]
    assert not os.path.exists(planted)


def test_planted_namespace_problems_are_reported_and_repaired(cluster):
    c = stoker.connect(cluster.url)
    try:
        populate(c)
        c.write_file("/d/unreached", os.urandom(MiB + 1))
        c.write_file("/d/dangling", os.urandom(2 * MiB))
        c.mkdir("/q")
        cluster.cli("quota", "set", "/q", "--inodes", "100")
        c.write_file("/q/f", b"12345")
        ino = {p: c.stat(p).st_ino for p in ("/d", "/q", "/d/unreached", "/d/dangling", "/d/e/small",
                                              "/q/f")}
    finally:
        c.close()
    chunks = len(cluster.chunk_files())
    cluster.stop()
    store = os.path.join(cluster.data, "meta", "meta")
    subprocess.run([PLANT, store, "drop-entry", str(ino["/d"]), "unreached"], check=True)
    subprocess.run([PLANT, store, "drop-inode", str(ino["/d/dangling"])], check=True)
    subprocess.run([PLANT, store, "set-nlink", str(ino["/d/e/small"]), "3"], check=True)
    subprocess.run([PLANT, store, "drop-inode", str(ino["/q/f"])], check=True)
    cluster.start()
    out = fsck(cluster, "--grace", "0")
    got = {(p["kind"], p["ino"]) for p in out["list"]}
    assert ("dangling-entry", ino["/d/dangling"]) in got
    assert ("dangling-entry", ino["/q/f"]) in got
    assert ("unreached-inode", ino["/d/unreached"]) in got
    assert ("link-count", ino["/d/e/small"]) in got
    assert ("quota-inodes", ino["/q"]) in got and ("quota-bytes", ino["/q"]) in got
    # The dropped inodes' chunks are garbage now (their records went without a purge).
    assert ("garbage", ino["/d/dangling"]) in got and ("garbage", ino["/q/f"]) in got
    assert not any(p["repaired"] for p in out["list"])
    out = fsck(cluster, "--repair", "--grace", "0")
    assert out["clean"] and all(p["repaired"] for p in out["list"]), out
    # The garbage went; the unreached file was reattached under /lost+found, whole.
    wait_until(lambda: len(cluster.chunk_files()) == chunks - 2 - 1, timeout=30,
               what="the garbage to be removed")
    out = fsck(cluster)
    assert out["clean"] and out["list"] == [], out
    c = stoker.connect(cluster.url)
    try:
        assert c.stat("/d/e/small").st_nlink == 1
        assert sorted(c.listdir("/d")) == ["big", "e", "link", "sparse"]
        assert c.stat("/lost+found/#%d" % ino["/d/unreached"]).st_size == MiB + 1
        assert json.loads(cluster.cli("quota", "ls", "/q", "--json").stdout)[0]["used_inodes"] == 1
    finally:
        c.close()


def test_unreached_file_and_folder_are_reattached_under_lost_and_found(cluster, tmp_path):
    deep, loose = os.urandom(MiB + 7), os.urandom(1000)
    c = stoker.connect(cluster.url)
    try:
        c.makedirs("/a/keep/sub")
        c.write_file("/a/keep/sub/deep", deep)
        c.write_file("/a/keep/top", b"top")
        c.write_file("/a/loose", loose)
        ino = {p: c.stat(p).st_ino for p in ("/a", "/a/keep", "/a/loose")}
    finally:
        c.close()
    cluster.stop()
    store = os.path.join(cluster.data, "meta", "meta")
    subprocess.run([PLANT, store, "drop-entry", str(ino["/a"]), "keep"], check=True)
    subprocess.run([PLANT, store, "drop-entry", str(ino["/a"]), "loose"], check=True)
    cluster.start()
    keep, loose_name = "#%d" % ino["/a/keep"], "#%d" % ino["/a/loose"]
    out = fsck(cluster)
    got = {(p["kind"], p["ino"]) for p in out["list"]}
    assert ("unreached-inode", ino["/a/keep"]) in got
    assert ("unreached-inode", ino["/a/loose"]) in got
    assert ("link-count", ino["/a"]) in got  # it lost a subfolder's entry
    assert not out["clean"] and not any(p["repaired"] for p in out["list"])
    c = stoker.connect(cluster.url)
    try:
        assert not c.exists("/lost+found")  # a report changes nothing
    finally:
        c.close()
    p = cluster.cli("fsck", "--repair", check=False, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert ("reattached as /lost+found/%s" % keep).encode() in p.stdout, p.stdout
    assert ("reattached as /lost+found/%s" % loose_name).encode() in p.stdout, p.stdout
    c = stoker.connect(cluster.url)
    try:
        st = c.stat("/lost+found")
        assert (st.st_mode & 0o7777) == 0o700 and st.st_uid == 0 and st.st_gid == 0
        assert sorted(c.listdir("/lost+found")) == sorted([keep, loose_name])
        assert c.read_file("/lost+found/%s/sub/deep" % keep) == deep
        assert c.read_file("/lost+found/%s/top" % keep) == b"top"
        assert c.read_file("/lost+found/%s" % loose_name) == loose
        assert c.stat("/lost+found").st_nlink == 3
        assert sorted(c.listdir("/a")) == []
    finally:
        c.close()
    out = fsck(cluster)
    assert out["clean"] and out["list"] == [], out
    # Through the mount as well: the reattached folder is a folder like any other.
    if not have_fuse():
        return
    m = Mount(cluster, tmp_path / "mnt")
    m.start()
    try:
        with open(os.path.join(m.path, "lost+found", keep, "sub", "deep"), "rb") as f:
            assert f.read() == deep
        assert sorted(os.listdir(os.path.join(m.path, "lost+found", keep))) == ["sub", "top"]
    finally:
        m.stop()
    assert not m.sanitizer_reports(), m.log()


def test_a_loop_of_folders_cut_off_from_the_root_is_reattached(cluster):
    """Folders named in each other in a loop that the root does not reach (each has
    a name, so none is unreached by itself) are found and reported with nothing
    changed; --repair cuts the loop at its smallest folder and reattaches that one
    under /lost+found, with everything in the loop reached through it."""
    data = os.urandom(MiB + 3)
    c = stoker.connect(cluster.url)
    try:
        c.makedirs("/a/b/c")
        c.write_file("/a/b/c/f", data)
        c.mkdir("/stays")
        ino = {p: c.stat(p).st_ino for p in ("/", "/a", "/a/b")}
        root_links = c.stat("/").st_nlink
    finally:
        c.close()
    cluster.stop()
    store = os.path.join(cluster.data, "meta", "meta")
    # /a's entry moves into /a/b: a names b, b names a, the root names neither
    subprocess.run([PLANT, store, "move-entry", str(ino["/"]), "a", str(ino["/a/b"])],
                   check=True)
    subprocess.run([PLANT, store, "set-parent", str(ino["/a"]), str(ino["/a/b"])], check=True)
    subprocess.run([PLANT, store, "set-nlink", str(ino["/"]), str(root_links - 1)], check=True)
    subprocess.run([PLANT, store, "set-nlink", str(ino["/a/b"]), "4"], check=True)
    cluster.start()
    out = fsck(cluster)
    got = [(p["kind"], p["ino"], p["parent"], p["name"], p["found"]) for p in out["list"]]
    assert got == [("folder-cycle", ino["/a"], ino["/a/b"], "a", 2)], out
    assert not out["clean"] and not out["list"][0]["repaired"]
    c = stoker.connect(cluster.url)
    try:
        assert sorted(c.listdir("/")) == ["stays"]  # a report changes nothing
    finally:
        c.close()
    p = cluster.cli("fsck", "--repair", check=False, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert b"folder cycle: folder %d ('a' in %d) is in a loop of 2 folders" % (
        ino["/a"], ino["/a/b"]) in p.stdout, p.stdout
    assert b"reattached as /lost+found/#%d" % ino["/a"] in p.stdout, p.stdout
    c = stoker.connect(cluster.url)
    try:
        assert c.listdir("/lost+found") == ["#%d" % ino["/a"]]
        assert c.stat("/lost+found/#%d/b" % ino["/a"]).st_ino == ino["/a/b"]
        assert c.read_file("/lost+found/#%d/b/c/f" % ino["/a"]) == data
        assert c.listdir("/lost+found/#%d/b" % ino["/a"]) == ["c"]
    finally:
        c.close()
    out = fsck(cluster)
    assert out["clean"] and out["list"] == [], out


def test_no_false_alarm_under_a_writer_and_an_unlinker(cluster):
    c = stoker.connect(cluster.url)
    stop = threading.Event()
    errors, done = [], []

    def churn(tag):
        i = 0
        try:
            while not stop.is_set():
                p = "/w/%s%d" % (tag, i % 8)
                c.write_file(p, os.urandom((i % 5) * MiB // 2 + 1))
                if i % 3 == 0:
                    c.rename(p, "/w/%s-renamed" % tag)
                elif i % 3 == 1:
                    c.unlink(p)
                else:
                    with c.open(p, "r+b") as f:
                        f.truncate(100)
                i += 1
                done.append(1)
        except Exception as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    try:
        c.mkdir("/w")
        populate(c)
        threads = [threading.Thread(target=churn, args=(t,)) for t in ("a", "b")]
        for t in threads:
            t.start()
        try:
            wait_until(lambda: len(done) > 10, timeout=60, what="the workload to run")
            # Without a grace period too: chunks of inodes meta does not know yet are
            # never taken for garbage by both passes.
            for args in ((), ("--grace", "0"), ("--grace", "0")):
                out = fsck(cluster, *args)
                assert out["clean"] and out["list"] == [], out
        finally:
            stop.set()
            for t in threads:
                t.join()
        assert not errors, errors
        assert len(done) > 20
    finally:
        c.close()


def test_replicas_that_disagree_are_reported(tmp_path):
    """Three nodes, chains of three copies: one copy of a chunk gone, another's
    version rewritten, are each reported as disagreeing replicas (not lost data),
    and a chunk gone from all three as lost."""
    port = pick_ports()
    data = str(tmp_path / "stk")
    env = dict(os.environ, STOKER_CLUSTER="stk://127.0.0.1:%d" % port)
    p = run([STOKER, "up", "--data", data, "--daemon", "--port", str(port), "--nodes", "3",
             "--targets", "1"], check=False, timeout=120)
    try:
        assert p.returncode == 0, p.stderr.decode() + p.stdout.decode()
        c = stoker.connect(env["STOKER_CLUSTER"])
        try:
            c.write_file("/f", os.urandom(3 * MiB))
            ino = c.stat("/f").st_ino
        finally:
            c.close()

        def copies(idx):
            found = []
            for dirpath, _, files in os.walk(os.path.join(data, "targets")):
                if dirpath.endswith("/%x" % ino) and str(idx) in files:
                    found.append(os.path.join(dirpath, str(idx)))
            return sorted(found)

        assert len(copies(0)) == 3 and len(copies(1)) == 3 and len(copies(2)) == 3
        os.unlink(copies(0)[0])
        # chunk 1: one copy says it is a version ahead (its header CRC made right)
        path = copies(1)[1]
        with open(path, "rb") as f:
            blob = bytearray(f.read())
        nblocks = struct.unpack_from("<I", blob, 28)[0]
        struct.pack_into("<Q", blob, 32, struct.unpack_from("<Q", blob, 32)[0] + 1)
        struct.pack_into("<I", blob, 40 + 4 * nblocks, crc32c(bytes(blob[:40 + 4 * nblocks])))
        with open(path, "wb") as f:
            f.write(blob)
        for path in copies(2):
            os.unlink(path)
        out = json.loads(run([STOKER, "fsck", "--json"], check=False, env=env).stdout)
        got = sorted((q["kind"], q["chunk"]) for q in out["list"])
        assert got == [("missing-chunk", 2), ("replicas-differ", 0), ("replicas-differ", 1)], out
        assert out["data"]["targets"] == 3 and not out["clean"]
    finally:
        run([STOKER, "down", "--data", data], check=False, timeout=150)
