"""Quotas per folder (docs/quotas.md): limits on inodes and bytes through the mount,
libstoker (the Python package) and S3; exact usage with many concurrent writers;
truncate, the rename rule, unlink of open files, a writer killed mid-write; df on a
mount of the quota folder; and bad input to `stoker quota`."""
import errno
import json
import multiprocessing
import os
import signal
import subprocess
import threading

import numpy as np
import pytest

from conftest import needs_fuse, wait_until
from pyhelp import PYTHON, env_for, stoker

KiB = 1 << 10
MiB = 1 << 20


def quota(cluster, path):
    """The quota path counts in, as meta reports it now (None: none)."""
    out = json.loads(cluster.cli("quota", "ls", path, "--json").stdout)
    return out[0] if out else None


def set_quota(cluster, path, *limits):
    return cluster.cli("quota", "set", path, *limits)


def pattern(size, seed):
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()


def sizes_under(client, folder):
    """Sum of the sizes of the regular files below folder, and the inode count (the
    folder itself included), as stat reports them."""
    total, inodes = 0, 1
    for top, dirs, files in client.walk(folder):
        inodes += len(dirs) + len(files)
        total += sum(client.stat(top.rstrip("/") + "/" + f).st_size for f in files)
    return total, inodes


def test_bad_input_gets_clear_errors(cluster):
    c = stoker.connect(cluster.url)
    try:
        c.mkdir("/q")
        c.write_file("/q/file", b"x")
    finally:
        c.close()
    p = cluster.cli("quota", "set", "/q/file", "--inodes", "10", check=False)
    assert p.returncode == 1 and b"not a folder" in p.stderr
    p = cluster.cli("quota", "set", "/nope", "--inodes", "10", check=False)
    assert p.returncode == 1 and b"No such file" in p.stderr
    p = cluster.cli("quota", "set", "/q", "--bytes", "10X", check=False)
    assert p.returncode == 2 and b"not a size" in p.stderr
    p = cluster.cli("quota", "set", "/q", "--inodes", "-3", check=False)
    assert p.returncode == 2 and b"not a count" in p.stderr
    p = cluster.cli("quota", "set", "/q", check=False)
    assert p.returncode == 2 and b"--bytes" in p.stderr
    p = cluster.cli("quota", "rm", "/q", check=False)
    assert p.returncode == 1 and b"no quota on this folder" in p.stderr
    p = cluster.cli("quota", "frobnicate", check=False)
    assert p.returncode == 2
    # nothing was set by any of them
    assert quota(cluster, "/q") is None
    assert json.loads(cluster.cli("quota", "ls", "--json").stdout) == []
    # and a good one works, with units as people write them
    set_quota(cluster, "/q", "--bytes", "10T", "--inodes", "1M")
    q = quota(cluster, "/q")
    assert (q["limit_bytes"], q["limit_inodes"]) == (10 << 40, 10 ** 6)
    assert (q["used_inodes"], q["used_bytes"]) == (2, 1)
    assert b"/q" in cluster.cli("quota", "ls").stdout


@needs_fuse
def test_inode_limit_through_libstoker_and_the_mount(cluster, make_mount):
    m = make_mount(cluster)
    c = stoker.connect(cluster.url)
    try:
        c.mkdir("/qi")
        set_quota(cluster, "/qi", "--inodes", "5")
        for i in range(4):  # the folder and 4 files: 5
            c.write_file("/qi/f%d" % i, b"data %d" % i)
        with pytest.raises(OSError) as e:
            c.write_file("/qi/f4", b"no room")
        assert e.value.errno == errno.EDQUOT
        with pytest.raises(OSError) as e:
            c.mkdir("/qi/d")
        assert e.value.errno == errno.EDQUOT
        mnt = m.path + "/qi"
        for make in (lambda: open(mnt + "/g", "w").close(), lambda: os.mkdir(mnt + "/d"),
                     lambda: os.symlink("f0", mnt + "/l"), lambda: os.mkfifo(mnt + "/p")):
            with pytest.raises(OSError) as e:
                make()
            assert e.value.errno == errno.EDQUOT
        assert sorted(os.listdir(mnt)) == ["f0", "f1", "f2", "f3"]
        # an unlink gives its inode back; what was there is intact
        os.unlink(mnt + "/f3")
        assert quota(cluster, "/qi")["used_inodes"] == 4
        with open(mnt + "/g", "w") as f:
            f.write("fits")
        assert quota(cluster, "/qi")["used_inodes"] == 5
        for i in range(3):
            assert c.read_file("/qi/f%d" % i) == b"data %d" % i
        # outside the quota nothing is limited
        c.write_file("/outside", b"free")
    finally:
        c.close()


def _mount_writer(path, seed, chunk, limit, out):
    """A process writing one file through the mount until EDQUOT or limit bytes."""
    data = pattern(limit, seed)
    done, err = 0, 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        while done < limit:
            try:
                n = os.write(fd, data[done:done + chunk])
            except OSError as e:
                err = e.errno
                break
            done += n
    finally:
        os.close(fd)
    out.put((path, seed, done, err))


@needs_fuse
def test_bytes_exact_with_many_concurrent_writers(cluster, make_mount):
    """Mount processes and libstoker threads fill one quota at once: the usage is
    exactly the sum of the sizes, no more than the limit, the writes that passed
    it failed with EDQUOT, and every byte acknowledged reads back intact."""
    m = make_mount(cluster)
    limit = 40 * MiB
    c = stoker.connect(cluster.url)
    c.mkdir("/qb")
    set_quota(cluster, "/qb", "--bytes", str(limit))
    results = []
    q = multiprocessing.get_context("fork").Queue()
    procs = [multiprocessing.get_context("fork").Process(
        target=_mount_writer, args=(m.path + "/qb/m%d" % i, i, 192 * KiB, 16 * MiB, q))
        for i in range(4)]
    lock = threading.Lock()

    def lib_writer(i):
        data = pattern(16 * MiB, 100 + i)
        done, err = 0, 0
        with c.open("/qb/l%d" % i, "wb") as f:
            while done < len(data):
                try:
                    done += f.write(data[done:done + 256 * KiB])
                except OSError as e:
                    err = e.errno
                    break
        with lock:
            results.append(("/qb/l%d" % i, 100 + i, done, err))

    threads = [threading.Thread(target=lib_writer, args=(i,)) for i in range(3)]
    for p in procs:
        p.start()
    for t in threads:
        t.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    for t in threads:
        t.join(120)
    while not q.empty():
        path, seed, done, err = q.get()
        results.append(("/qb/" + os.path.basename(path), seed, done, err))
    assert len(results) == 7
    # 7 writers of 16 MiB on 40 MiB: some were refused, with EDQUOT and nothing else
    assert any(r[3] for r in results)
    assert all(r[3] in (0, errno.EDQUOT) for r in results)
    total = 0
    for path, seed, done, err in results:
        assert c.stat(path).st_size == done, path
        assert c.read_file(path) == pattern(16 * MiB, seed)[:done], path
        total += done
    qb = quota(cluster, "/qb")
    assert qb["used_bytes"] == total == sizes_under(c, "/qb")[0]
    assert total <= limit
    # every writer closed; the mount gives its unspent byte allowance back when idle
    wait_until(lambda: quota(cluster, "/qb")["reserved_bytes"] == 0, 30,
               "the mount's byte allowance to go back")
    # the room the refused writers could not get is there for the next one
    room = limit - total
    c.write_file("/qb/rest", pattern(room, 7))
    with pytest.raises(OSError) as e:
        c.write_file("/qb/more", b"x")
    assert e.value.errno == errno.EDQUOT
    assert quota(cluster, "/qb")["used_bytes"] == limit
    c.close()


def test_truncate_gives_bytes_back(cluster):
    c = stoker.connect(cluster.url)
    try:
        c.mkdir("/qt")
        set_quota(cluster, "/qt", "--bytes", "4M")
        c.write_file("/qt/a", pattern(3 * MiB, 1))
        assert quota(cluster, "/qt")["used_bytes"] == 3 * MiB
        with pytest.raises(OSError) as e:
            c.write_file("/qt/b", pattern(2 * MiB, 2))
        assert e.value.errno == errno.EDQUOT
        c.truncate("/qt/a", MiB)
        assert quota(cluster, "/qt")["used_bytes"] == MiB + c.stat("/qt/b").st_size
        c.unlink("/qt/b")
        c.write_file("/qt/b", pattern(3 * MiB, 2))
        assert quota(cluster, "/qt")["used_bytes"] == 4 * MiB
        assert c.read_file("/qt/a") == pattern(3 * MiB, 1)[:MiB]
        # growing by truncate past the limit is refused and changes nothing
        with pytest.raises(OSError) as e:
            c.truncate("/qt/a", 2 * MiB)
        assert e.value.errno == errno.EDQUOT
        assert c.stat("/qt/a").st_size == MiB
    finally:
        c.close()


@needs_fuse
def test_rename_between_quota_folders(cluster, make_mount):
    m = make_mount(cluster)
    c = stoker.connect(cluster.url)
    try:
        for d in ("/qa", "/qb", "/qa/dir"):
            c.mkdir(d)
        set_quota(cluster, "/qa", "--bytes", "8M")
        set_quota(cluster, "/qb", "--bytes", "3M", "--inodes", "4")
        c.write_file("/qa/f", pattern(2 * MiB, 1))
        c.write_file("/qa/dir/g", pattern(MiB, 2))
        # a file moves with its usage
        c.rename("/qa/f", "/qb/f")
        assert quota(cluster, "/qa")["used_bytes"] == MiB
        assert quota(cluster, "/qb")["used_bytes"] == 2 * MiB
        assert c.read_file("/qb/f") == pattern(2 * MiB, 1)
        # a folder does not: EXDEV, and mv copies it instead
        with pytest.raises(OSError) as e:
            os.rename(m.path + "/qa/dir", m.path + "/qb/dir")
        assert e.value.errno == errno.EXDEV
        # a file that does not fit is refused and stays where it was
        c.write_file("/qa/big", pattern(2 * MiB, 3))
        with pytest.raises(OSError) as e:
            c.rename("/qa/big", "/qb/big")
        assert e.value.errno == errno.EDQUOT
        assert c.read_file("/qa/big") == pattern(2 * MiB, 3)
        subprocess.run(["mv", m.path + "/qa/dir", m.path + "/qb/dir"], check=True,
                       capture_output=True, timeout=60)
        assert c.read_file("/qb/dir/g") == pattern(MiB, 2)
        assert not c.exists("/qa/dir")
        # hard links stay in one quota
        with pytest.raises(OSError) as e:
            os.link(m.path + "/qa/big", m.path + "/qb/big")
        assert e.value.errno == errno.EXDEV
        qa, qb = quota(cluster, "/qa"), quota(cluster, "/qb")
        assert (qa["used_bytes"], qa["used_inodes"]) == sizes_under(c, "/qa")
        assert (qb["used_bytes"], qb["used_inodes"]) == sizes_under(c, "/qb")
    finally:
        c.close()


@needs_fuse
def test_unlink_of_an_open_file_frees_at_last_close(cluster, make_mount):
    m = make_mount(cluster)
    c = stoker.connect(cluster.url)
    c.mkdir("/qu")
    set_quota(cluster, "/qu", "--bytes", "16M")
    path = m.path + "/qu/open"
    with open(path, "wb") as f:
        f.write(pattern(3 * MiB, 1))
    holder = subprocess.Popen(
        [PYTHON, "-c", "import sys; f = open(sys.argv[1], 'rb'); print('open', flush=True);"
         " sys.stdin.read(); assert len(f.read()) == 3 << 20", path],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline() == b"open\n"
        os.unlink(path)
        assert not os.path.exists(path)
        q = quota(cluster, "/qu")
        assert (q["used_bytes"], q["used_inodes"]) == (3 * MiB, 2)
        holder.stdin.close()
        assert holder.wait(30) == 0
    finally:
        if holder.poll() is None:
            holder.kill()
    wait_until(lambda: quota(cluster, "/qu")["used_inodes"] == 1, 30, "the orphan to go")
    assert quota(cluster, "/qu")["used_bytes"] == 0
    c.close()


WRITER = r"""
import sys, stoker
c = stoker.connect()
f = c.open(sys.argv[1], "wb")
chunk = b"k" * (256 << 10)
n = 0
while True:
    f.write(chunk)
    n += 1
    if n == 8:
        f.flush()
        f.fsync()
        print("synced", flush=True)
"""


def test_writer_killed_mid_write_leaves_exact_usage(monkeypatch, make_cluster):
    """A libstoker writer is SIGKILLed while it holds room: once its session expires
    the room comes back, the usage is the file's size as meta knows it, and a
    recount finds nothing to fix."""
    monkeypatch.setenv("STOKER_SESSION_LEASE_MS", "2000")
    cluster = make_cluster()
    c = stoker.connect(cluster.url)
    c.mkdir("/qk")
    set_quota(cluster, "/qk", "--bytes", "64M")
    w = subprocess.Popen([PYTHON, "-c", WRITER, "/qk/f"], env=env_for(cluster),
                         stdout=subprocess.PIPE)
    try:
        assert w.stdout.readline() == b"synced\n"
        assert quota(cluster, "/qk")["reserved_bytes"] > 0
        os.kill(w.pid, signal.SIGKILL)
        w.wait(30)
    finally:
        if w.poll() is None:
            w.kill()
    wait_until(lambda: quota(cluster, "/qk")["reserved_bytes"] == 0, 30,
               "the dead writer's session to expire")
    q = quota(cluster, "/qk")
    size = c.stat("/qk/f").st_size
    assert size >= 2 * MiB  # what it synced
    assert q["used_bytes"] == size
    p = cluster.cli("quota", "recount", "/qk")
    assert b"1 quota(s) recounted, 0 fixed" in p.stdout, p.stdout
    # all the room not used is there for the next writer
    c.write_file("/qk/g", b"z" * (64 * MiB - size))
    assert quota(cluster, "/qk")["used_bytes"] == 64 * MiB
    c.close()


@needs_fuse
def test_df_on_a_mount_of_the_quota_folder(cluster, make_mount):
    c = stoker.connect(cluster.url)
    c.mkdir("/qd")
    set_quota(cluster, "/qd", "--bytes", "64M", "--inodes", "1000")
    m = make_mount(cluster, "mnt", sub="/qd")
    st = os.statvfs(m.path)
    assert st.f_blocks * st.f_frsize == 64 * MiB
    assert st.f_files == 1000
    assert st.f_ffree == 999
    with open(m.path + "/f", "wb") as f:
        f.write(pattern(8 * MiB, 1))
    # free: the limit less the usage and what is set aside, which the mount's byte
    # allowance is until it gives it back (idle for 2 s)
    wait_until(lambda: os.statvfs(m.path).f_bfree * st.f_frsize == 56 * MiB, 30,
               "the mount's byte allowance to go back")
    st = os.statvfs(m.path)
    assert st.f_ffree == 998
    df = subprocess.run(["df", "-B1", m.path], capture_output=True, text=True, check=True)
    assert str(64 * MiB) in df.stdout.splitlines()[1].split()
    # a mount of the cluster root shows the cluster, not the quota
    whole = make_mount(cluster, "whole")
    assert os.statvfs(whole.path).f_files != 1000
    # ...but the quota folder inside it (a bind mount of it, as the CSI driver makes,
    # alike) shows its quota: statfs asks about the inode of the path given
    st = os.statvfs(whole.path + "/qd")
    assert (st.f_blocks * st.f_frsize, st.f_files, st.f_ffree) == (64 * MiB, 1000, 998)
    c.close()


def test_s3_put_past_the_quota_is_quota_exceeded(cluster, tmp_path):
    boto3 = pytest.importorskip("boto3")
    from botocore.exceptions import ClientError
    from test_s3 import Gateway
    g = Gateway(cluster, tmp_path)
    try:
        s3 = g.client()
        s3.create_bucket(Bucket="quotabucket")
        set_quota(cluster, "/quotabucket", "--bytes", "3M")
        first = pattern(2 * MiB, 1)
        s3.put_object(Bucket="quotabucket", Key="first", Body=first)
        with pytest.raises(ClientError) as e:
            s3.put_object(Bucket="quotabucket", Key="second", Body=pattern(2 * MiB, 2))
        err = e.value.response
        assert err["Error"]["Code"] == "QuotaExceeded"
        assert err["ResponseMetadata"]["HTTPStatusCode"] == 403
        assert s3.get_object(Bucket="quotabucket", Key="first")["Body"].read() == first
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket="quotabucket").get("Contents", [])]
        assert keys == ["first"]
        # the refused PUT left nothing counted behind
        wait_until(lambda: quota(cluster, "/quotabucket")["used_bytes"] == 2 * MiB, 30,
                   "the refused object's temporary file to go")
        assert boto3  # the real client was used
    finally:
        g.stop()


def test_metrics_show_each_quota(cluster):
    import urllib.request
    c = stoker.connect(cluster.url)
    c.mkdir("/qm")
    c.write_file("/qm/f", b"x" * 1000)
    set_quota(cluster, "/qm", "--bytes", "1M", "--inodes", "10")
    body = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % (cluster.port + 11),
                                  timeout=10).read().decode()
    assert 'stoker_quota_used_bytes{quota="/qm"} 1000' in body
    assert 'stoker_quota_limit_bytes{quota="/qm"} 1048576' in body
    assert 'stoker_quota_used_inodes{quota="/qm"} 2' in body
    assert 'stoker_quota_limit_inodes{quota="/qm"} 10' in body
    cluster.cli("quota", "rm", "/qm")
    body = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % (cluster.port + 11),
                                  timeout=10).read().decode()
    assert 'quota="/qm"' not in body
    c.close()
