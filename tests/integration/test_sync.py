"""`stoker sync` between a local folder, a real cluster and the real S3 gateway: whole
trees with large files, symbolic links, empty folders and odd names, compared byte for
byte and attribute for attribute after a round trip; a run killed half-way and
resumed; --delete, --dry-run, --include/--exclude; a source file written to while it
is copied; unreachable endpoints and bad keys; and a run under `mpirun -np 4`.

The issue asks for a tree of 100,000 small files; the suite copies 5,000 (the same
code paths, in seconds rather than minutes on a shared machine), and
scripts/bench-sync.sh copies the 100,000.
"""
import json
import os
import random
import shutil
import signal
import subprocess
import tempfile
import time

import pytest

from conftest import STOKER, as_nobody, run
from test_s3 import AK, SK, Gateway

MiB = 1 << 20
# Names a shell, a URL or an XML listing could get wrong.
ODD = ["space in name", "ünïcødé ✓", "per%cent+plus", "hash#and?q", "quote'\"s",
       "-leading-dash", "amp&lt;"]


def make_tree(root, seed=1, big=9 * MiB + 17, links=True):
    """A tree with every kind of entry sync handles; returns nothing, the tree is the
    reference every test compares against."""
    g = random.Random(seed)
    os.makedirs(root / "a" / "b" / "c")
    os.makedirs(root / "empty")
    os.makedirs(root / "a" / "empty2")
    for size in (0, 1, 4095, 4097, MiB + 1):
        (root / "a" / ("f%d" % size)).write_bytes(g.randbytes(size))
    (root / "a" / "b" / "c" / "deep.txt").write_bytes(b"deep\n")
    (root / "big.bin").write_bytes(g.randbytes(big))
    for i, name in enumerate(ODD):
        (root / "a" / name).write_bytes(b"odd %d\n" % i)
    os.chmod(root / "a" / "f1", 0o600)
    os.chmod(root / "a" / "f4097", 0o751)
    os.chmod(root / "a" / "b", 0o750)
    if links:
        os.symlink("f4095", root / "a" / "link")
        os.symlink("../no/such/target", root / "a" / "dangling")
    # Times in the past, so that a copy that forgot them shows.
    for dirpath, dirs, files in os.walk(root, topdown=False):
        for n in files + dirs:
            p = os.path.join(dirpath, n)
            if not os.path.islink(p):
                t = 1600000000 + g.randrange(10 ** 7)
                os.utime(p, (t, t))


def snapshot(root, modes=True, times=True, links=True):
    """Every entry under root: kind, bytes or link target, and mode and mtime."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for n in dirs + files:
            p = os.path.join(dirpath, n)
            rel = os.path.relpath(p, root)
            st = os.lstat(p)
            if os.path.islink(p):
                if links:
                    out[rel] = ("link", os.readlink(p))
                continue
            kind = "dir" if os.path.isdir(p) else "file"
            data = open(p, "rb").read() if kind == "file" else None
            entry = [kind, data]
            if modes:
                entry.append(st.st_mode & 0o7777)
            if times and kind == "file":
                entry.append(int(st.st_mtime))
            out[rel] = tuple(entry)
    return out


def sync(*args, check=True, env=None, timeout=300):
    p = run([STOKER, "sync"] + [str(a) for a in args], check=False, env=env, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError("stoker sync %s exited %d\nstdout: %s\nstderr: %s" % (
            " ".join(map(str, args)), p.returncode, p.stdout.decode(errors="replace"),
            p.stderr.decode(errors="replace")[-4000:]))
    return p


def summary(p):
    """The --json summary (the last line of stdout)."""
    return json.loads(p.stdout.decode().strip().splitlines()[-1])


def test_local_to_local(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    make_tree(src)
    if os.geteuid() == 0:
        os.lchown(src / "a" / "f1", 1234, 5678)
        os.lchown(src / "a" / "link", 4321, 8765)
    p = sync(src, dst, "--json")
    s = summary(p)
    assert s["failed"] == [] and s["files_copied"] == 14 and s["links_made"] == 2
    assert snapshot(dst) == snapshot(src)
    if os.geteuid() == 0:
        st = os.lstat(dst / "a" / "f1")
        assert (st.st_uid, st.st_gid) == (1234, 5678)
        st = os.lstat(dst / "a" / "link")
        assert (st.st_uid, st.st_gid) == (4321, 8765)
    # Nothing left under a temporary name.
    assert not [n for _, _, fs in os.walk(dst) for n in fs if n.startswith(".stoker-sync-")]
    # A second run finds everything the same and copies nothing.
    s = summary(sync(src, dst, "--json"))
    assert s["files_copied"] == 0 and s["files_same"] == 14 and s["failed"] == []
    # --checksum notices other bytes of the same size and mtime.
    st = os.stat(dst / "a" / "f4095")
    with open(dst / "a" / "f4095", "r+b") as f:
        f.write(b"X")
    os.utime(dst / "a" / "f4095", ns=(st.st_atime_ns, st.st_mtime_ns))
    assert summary(sync(src, dst, "--json"))["files_copied"] == 0  # size and mtime agree
    s = summary(sync(src, dst, "--json", "--checksum"))
    assert s["files_copied"] == 1 and s["files_same"] == 13
    assert snapshot(dst) == snapshot(src)
    # --update leaves a file that is newer at the destination; a plain run does not.
    (dst / "a" / "f1").write_bytes(b"edited at the destination")
    s = summary(sync(src, dst, "--json", "--update"))
    assert s["files_copied"] == 0 and (dst / "a" / "f1").read_bytes() == b"edited at the destination"
    s = summary(sync(src, dst, "--json"))
    assert s["files_copied"] == 1 and snapshot(dst) == snapshot(src)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as nobody")
def test_unwritable_destination_loses_nothing(tmp_path):
    top = tempfile.mkdtemp(prefix="stoker-sync-")  # traversable by nobody, unlike tmp_path
    try:
        os.chmod(top, 0o755)
        src, dst = os.path.join(top, "src"), os.path.join(top, "dst")
        os.makedirs(os.path.join(src, "sub"))
        for n in ("x", "y", "sub/z"):
            with open(os.path.join(src, n), "wb") as f:
                f.write(n.encode() * 100)
        os.chmod(os.path.join(src, "sub"), 0o755)
        os.makedirs(dst)
        with open(os.path.join(dst, "x"), "wb") as f:
            f.write(b"precious")
        p = subprocess.run([STOKER, "sync", src, dst, "--json"], capture_output=True,
                           preexec_fn=as_nobody, timeout=120)
        assert p.returncode == 1, p
        s = summary(p)
        failed = {f["path"]: f["error"] for f in s["failed"]}
        assert set(failed) >= {"x", "y", "sub"}, failed
        assert "Permission denied" in failed["x"]
        assert b"Permission denied" in p.stderr
        assert open(os.path.join(dst, "x"), "rb").read() == b"precious"
        assert sorted(os.listdir(dst)) == ["x"]
    finally:
        shutil.rmtree(top)


def test_local_to_stoker_and_back(cluster, tmp_path):
    src, back = tmp_path / "src", tmp_path / "back"
    make_tree(src)
    env = cluster.env()
    # Parts of 1 MiB: the 9 MiB file is copied by several workers at once.
    s = summary(sync(src, cluster.url + "/data", "--json", "--part-size", "1M", env=env))
    assert s["failed"] == [] and s["files_copied"] == 14
    # Seen by Stoker's own tools: the bytes, the link, the mode.
    assert cluster.cli("cat", "/data/a/b/c/deep.txt").stdout == b"deep\n"
    assert cluster.cli("cat", "/data/a/" + ODD[1]).stdout == b"odd 1\n"
    ls = cluster.cli("ls", "-l", "/data/a").stdout.decode()
    assert "link -> f4095" in ls
    assert "-rwxr-x--x" in ls  # f4097, 0751
    s = summary(sync(cluster.url + "/data", back, "--json", "--checksum", env=env))
    assert s["failed"] == [] and s["files_copied"] == 14
    assert snapshot(back) == snapshot(src)
    # Both directions are in step: reruns copy nothing.
    for a, b in ((src, cluster.url + "/data"), (cluster.url + "/data", back)):
        s = summary(sync(a, b, "--json", env=env))
        assert s["files_copied"] == 0 and s["files_same"] == 14, s


def test_stoker_to_s3_gateway_and_back(cluster, tmp_path):
    src, back = tmp_path / "src", tmp_path / "back"
    make_tree(src, big=21 * MiB + 5)
    env = cluster.env()
    sync(src, "stk:///tree", env=env)
    gw = Gateway(cluster, tmp_path)
    try:
        s3 = gw.client()
        s3.create_bucket(Bucket="syncb")
        env_s3 = dict(env, AWS_ACCESS_KEY_ID=AK, AWS_SECRET_ACCESS_KEY=SK)
        ep = ["--endpoint", gw.endpoint]
        # 5 MiB parts: the big file goes up as a multipart upload of 5 parts.
        p = sync("stk:///tree", "s3://syncb/some/prefix", "--json", "--checksum",
                 "--part-size", "5M", *ep, env=env_s3)
        s = summary(p)
        assert s["failed"] == [] and s["files_copied"] == 14
        assert s["skipped"] == 2  # the links: S3 has none
        keys = {}
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket="syncb"):
            keys.update({o["Key"]: o for o in page.get("Contents", [])})
        assert "some/prefix/empty/" in keys  # an empty folder's marker
        assert keys["some/prefix/big.bin"]["ETag"].endswith('-5"')
        for name in ODD:
            body = s3.get_object(Bucket="syncb", Key="some/prefix/a/" + name)["Body"].read()
            assert body == (src / "a" / name).read_bytes()
        assert s3.get_object(Bucket="syncb", Key="some/prefix/big.bin")["Body"].read() == \
            (src / "big.bin").read_bytes()
        # Back out of S3 into a local folder: same bytes, folders, empty ones too.
        s = summary(sync("s3://syncb/some/prefix/", back, "--json", "--checksum",
                         "--part-size", "4M", *ep, env=env_s3))
        assert s["failed"] == [] and s["files_copied"] == 14
        assert snapshot(back, modes=False, times=False) == \
            snapshot(src, modes=False, times=False, links=False)
        # And out of S3 straight into Stoker.
        s = summary(sync("s3://syncb/some/prefix", "stk:///from-s3", "--json", *ep,
                         env=env_s3))
        assert s["failed"] == [] and s["files_copied"] == 14
        back2 = tmp_path / "back2"
        sync("stk:///from-s3", back2, env=env)
        assert snapshot(back2, modes=False) == snapshot(back, modes=False)
        # Reruns in both directions copy nothing (S3 keeps no mtime: the upload
        # time, newer than the source's, counts as in step).
        s = summary(sync("stk:///tree", "s3://syncb/some/prefix", "--json", *ep, env=env_s3))
        assert s["files_copied"] == 0 and s["files_same"] == 14, s
        s = summary(sync("s3://syncb/some/prefix", back, "--json", *ep, env=env_s3))
        assert s["files_copied"] == 0 and s["files_same"] == 14, s
        # --delete into S3: a file gone from the source goes from the bucket.
        cluster.cli("rm", "/tree/a/f1")
        s = summary(sync("stk:///tree", "s3://syncb/some/prefix", "--json", "--delete", *ep,
                         env=env_s3))
        assert s["deleted"] == 1 and s["failed"] == []
        names = [o["Key"] for o in s3.list_objects_v2(Bucket="syncb")["Contents"]]
        assert "some/prefix/a/f1" not in names and "some/prefix/a/f0" in names
    finally:
        gw.stop()


def test_many_small_files_killed_and_resumed(cluster, tmp_path):
    src, back = tmp_path / "src", tmp_path / "back"
    g = random.Random(5)
    n = 5000
    for i in range(n):
        d = src / ("d%02d" % (i % 20))
        d.mkdir(parents=True, exist_ok=True)
        (d / ("f%05d" % i)).write_bytes(g.randbytes(g.randrange(1, 16384)))
    env = cluster.env()
    # Slowed down (--bwlimit) so that the kill lands half-way.
    proc = subprocess.Popen([STOKER, "sync", str(src), "stk:///many", "--bwlimit", "4M",
                             "--json"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    # Killed once the first files are in place (the copy goes in path order).
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        ls = cluster.cli("ls", "/many/d00", check=False).stdout.decode().split()
        if [x for x in ls if x.startswith("f")]:
            break
        time.sleep(0.2)
    time.sleep(1)
    assert proc.poll() is None, "finished before the kill: %r" % (proc.communicate(),)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    # What was copied is whole: every file under its real name has all its bytes.
    s = summary(sync("stk:///many", back, "--json", env=env))
    done = s["files_copied"]
    assert 0 < done < n, s
    for dirpath, _, files in os.walk(back):
        for f in files:
            rel = os.path.relpath(os.path.join(dirpath, f), back)
            assert (back / rel).read_bytes() == (src / rel).read_bytes(), rel
    # The rerun does only what is left, then nothing is left.
    s = summary(sync(src, "stk:///many", "--json", env=env))
    assert s["failed"] == []
    assert s["files_copied"] == n - done and s["files_same"] == done, (s, done)
    shutil.rmtree(back)
    s = summary(sync("stk:///many", back, "--json", env=env))
    assert s["files_copied"] == n
    assert snapshot(back) == snapshot(src)
    # No temporary file of the killed run is left behind.
    for i in range(20):
        names = cluster.cli("ls", "/many/d%02d" % i).stdout.decode().split("\n")
        assert not [x for x in names if x.startswith(".stoker-sync-")], names


def test_delete_dry_run_include_exclude(cluster, tmp_path):
    src = tmp_path / "src"
    make_tree(src, big=2 * MiB)
    env = cluster.env()
    dst = cluster.url + "/m"
    sync(src, dst, env=env)
    # Change the source: a file gone, a folder gone, a file new, a file changed.
    os.unlink(src / "a" / "f1")
    shutil.rmtree(src / "a" / "b")
    (src / "new.txt").write_bytes(b"new\n")
    (src / "a" / "f0").write_bytes(b"now not empty")
    before = cluster.cli("ls", "/m/a").stdout
    p = sync(src, dst, "--delete", "--dry-run", env=env)
    out = p.stdout.decode()
    assert "delete a/f1\n" in out and "delete a/b/\n" in out
    assert "delete a/b/c" not in out  # inside a deleted folder: goes with it
    assert "copy new.txt (4 bytes)" in out and "copy a/f0 (13 bytes)" in out
    assert "copy a/f4095" not in out
    assert cluster.cli("ls", "/m/a").stdout == before  # a dry run changes nothing
    assert cluster.cli("stat", "/m/new.txt", check=False).returncode != 0
    # Without --delete, nothing goes.
    s = summary(sync(src, dst, "--json", env=env))
    assert s["deleted"] == 0 and s["files_copied"] == 2
    assert cluster.cli("cat", "/m/a/f1").returncode == 0
    # --delete, but an excluded file is neither copied nor deleted.
    (src / "keep.tmp").write_bytes(b"t")
    cluster.cli("put", "-", "/m/old.tmp", input=b"old")
    s = summary(sync(src, dst, "--json", "--delete", "--exclude", "*.tmp", env=env))
    assert s["deleted"] == 2 and s["failed"] == []
    assert cluster.cli("cat", "/m/old.tmp").stdout == b"old"
    assert cluster.cli("stat", "/m/keep.tmp", check=False).returncode != 0
    assert cluster.cli("stat", "/m/a/b", check=False).returncode != 0
    assert cluster.cli("stat", "/m/a/f1", check=False).returncode != 0
    # Only *.txt, and not under a/: the first pattern that matches decides.
    back = tmp_path / "inc"
    sync(dst, back, "--include", "*.txt", "--exclude", "*", "--exclude", "a/", env=env)
    got = sorted(os.path.relpath(os.path.join(d, f), back)
                 for d, _, fs in os.walk(back) for f in fs)
    assert got == ["new.txt"]


def test_source_changed_while_copied(cluster, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "steady").write_bytes(os.urandom(3 * MiB))
    (src / "busy").write_bytes(os.urandom(24 * MiB))
    env = cluster.env()
    proc = subprocess.Popen([STOKER, "sync", str(src), "stk:///ch", "--bwlimit", "8M",
                             "--part-size", "4M", "--threads", "2", "--json"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    # Once its copy has begun (its temporary file is there), the file is written to.
    deadline = time.time() + 60
    while time.time() < deadline and proc.poll() is None:
        ls = cluster.cli("ls", "/ch", check=False).stdout.decode().split()
        if [x for x in ls if x.startswith(".stoker-sync-")]:
            break
        time.sleep(0.1)
    time.sleep(0.5)
    assert proc.poll() is None
    with open(src / "busy", "r+b") as f:  # a writer in the middle of the file
        f.seek(12 * MiB)
        f.write(b"changed under the copy")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, (out, err)
    s = json.loads(out.decode().strip().splitlines()[-1])
    assert [f["path"] for f in s["failed"]] == ["busy"]
    assert "changed while copied" in s["failed"][0]["error"]
    assert b"busy: changed while copied" in err
    # Never copied torn: no file under its name; the steady one is whole.
    assert cluster.cli("stat", "/ch/busy", check=False).returncode != 0
    assert cluster.cli("cat", "/ch/steady").stdout == (src / "steady").read_bytes()
    # Once it is quiet, a rerun copies it.
    s = summary(sync(src, "stk:///ch", "--json", env=env))
    assert s["files_copied"] == 1 and s["failed"] == []
    assert cluster.cli("cat", "/ch/busy").stdout == (src / "busy").read_bytes()


def test_s3_object_changed_while_copied(cluster, tmp_path):
    """An object replaced while it is read in ranges: each GET carries If-Match on the
    ETag listed, so the copy fails instead of mixing old and new bytes."""
    gw = Gateway(cluster, tmp_path)
    try:
        s3 = gw.client()
        s3.create_bucket(Bucket="chg")
        old = os.urandom(24 * MiB)
        s3.put_object(Bucket="chg", Key="d/obj", Body=old)
        s3.put_object(Bucket="chg", Key="d/other", Body=b"quiet")
        dst = tmp_path / "out"
        env = dict(cluster.env(), AWS_ACCESS_KEY_ID=AK, AWS_SECRET_ACCESS_KEY=SK)
        proc = subprocess.Popen([STOKER, "sync", "s3://chg/d", str(dst), "--endpoint",
                                 gw.endpoint, "--bwlimit", "8M", "--part-size", "4M",
                                 "--threads", "2", "--json"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.time() + 60
        while time.time() < deadline and proc.poll() is None:
            if dst.exists() and [n for n in os.listdir(dst) if n.startswith(".stoker-sync-")]:
                break
            time.sleep(0.05)
        assert proc.poll() is None
        s3.put_object(Bucket="chg", Key="d/obj", Body=os.urandom(24 * MiB))
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 1, (out, err)
        s = json.loads(out.decode().strip().splitlines()[-1])
        assert [f["path"] for f in s["failed"]] == ["obj"]
        assert "changed while copied" in s["failed"][0]["error"]
        assert not (dst / "obj").exists()
        assert (dst / "other").read_bytes() == b"quiet"
    finally:
        gw.stop()


def test_bad_input_clear_errors(cluster, tmp_path):
    src = tmp_path / "src"
    make_tree(src, big=MiB)
    env = cluster.env()
    # A missing source.
    p = sync(tmp_path / "nope", tmp_path / "d", check=False)
    assert p.returncode == 1 and b"No such file or directory" in p.stderr
    assert not (tmp_path / "d").exists()
    # A destination that cannot be made (under a file).
    (tmp_path / "afile").write_bytes(b"x")
    p = sync(src, tmp_path / "afile" / "sub", check=False)
    assert p.returncode == 1 and b"Not a directory" in p.stderr
    # An unreachable cluster.
    p = sync(src, "stk://127.0.0.1:1/x", check=False, env=dict(env, STOKER_RETRY_MS="500"))
    assert p.returncode == 1 and b"cannot reach the cluster" in p.stderr
    # An unreachable S3 endpoint, and bad keys on a real one.
    env_s3 = dict(env, AWS_ACCESS_KEY_ID=AK, AWS_SECRET_ACCESS_KEY=SK)
    p = sync(src, "s3://b/x", "--endpoint", "http://127.0.0.1:1", check=False, env=env_s3)
    assert p.returncode == 1 and b"connect" in p.stderr.lower(), p.stderr
    gw = Gateway(cluster, tmp_path)
    try:
        gw.client().create_bucket(Bucket="keys")
        p = sync(src, "s3://keys/x", "--endpoint", gw.endpoint, check=False,
                 env=dict(env_s3, AWS_SECRET_ACCESS_KEY="wrong"))
        assert p.returncode == 1 and b"403" in p.stderr, p.stderr
        p = sync(src, "s3://keys/x", "--endpoint", gw.endpoint, check=False,
                 env=dict(env_s3, AWS_ACCESS_KEY_ID="NOSUCHKEY"))
        assert p.returncode == 1 and b"403" in p.stderr, p.stderr
        # No keys at all: said before anything is sent.
        bare = {k: v for k, v in env.items() if not k.startswith("AWS_")}
        bare["HOME"] = str(tmp_path)
        p = sync(src, "s3://keys/x", "--endpoint", gw.endpoint, check=False, env=bare)
        assert p.returncode == 1 and b"no S3 keys" in p.stderr
        # Keys from a credentials file's profile work.
        (tmp_path / ".aws").mkdir()
        (tmp_path / ".aws" / "credentials").write_text(
            "[default]\naws_access_key_id = nope\naws_secret_access_key = nope\n"
            "[other]\naws_access_key_id = %s\naws_secret_access_key = %s\n" % (AK, SK))
        s = summary(sync(src, "s3://keys/x", "--endpoint", gw.endpoint, "--profile", "other",
                         "--json", env=bare))
        assert s["files_copied"] == 14
        # A bucket that does not exist.
        p = sync("s3://nosuchbucket/x", tmp_path / "o", "--endpoint", gw.endpoint,
                 check=False, env=env_s3)
        assert p.returncode == 1 and b"404" in p.stderr
        p = sync(src, "s3://nosuchbucket/x", "--endpoint", gw.endpoint, check=False,
                 env=env_s3)
        assert p.returncode == 1 and b"404" in p.stderr and b"cannot list" in p.stderr
        assert not (tmp_path / "o").exists()
        # Nothing lost on a failed run: the bucket holds what the good run put.
        assert len(gw.client().list_objects_v2(Bucket="keys")["Contents"]) == 16
    finally:
        gw.stop()


MPIRUN = shutil.which("mpirun")


@pytest.mark.skipif(not MPIRUN, reason="no mpirun (scripts/deps.sh installs openmpi-bin)")
def test_mpirun_four_ranks(cluster, tmp_path):
    src, back = tmp_path / "src", tmp_path / "back"
    make_tree(src)
    for i in range(300):
        (src / "many").mkdir(exist_ok=True)
        (src / "many" / ("m%03d" % i)).write_bytes(b"%d\n" % i * (i + 1))
    env = dict(cluster.env(), OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_plm_rsh_agent="")
    p = run([MPIRUN, "--oversubscribe", "-np", "4", STOKER, "sync", str(src),
             "stk:///mpi", "--json", "--threads", "2", "--part-size", "1M"], env=env,
            check=False, timeout=300)
    assert p.returncode == 0, (p.stdout.decode(), p.stderr.decode()[-3000:])
    sums = [json.loads(line) for line in p.stdout.decode().splitlines()
            if line.startswith("{")]
    assert sorted(s["rank"] for s in sums) == [0, 1, 2, 3]
    assert all(s["ranks"] == 4 and s["failed"] == [] for s in sums)
    # Each rank took a share, and the shares make the whole tree once.
    assert all(s["files_copied"] > 0 for s in sums), sums
    assert sum(s["files_copied"] for s in sums) == 314
    assert sum(s["links_made"] for s in sums) == 2
    sync("stk:///mpi", back, env=cluster.env())
    assert snapshot(back) == snapshot(src)
