"""A write that did not reach storage is never published as data (issue 21, part 1).

A cluster started role by role (roles.py) with two storage nodes; one of them is
stopped (SIGSTOP) for longer than the clients' retry window while small files and a
large one are written through the CLI, the Python package, a mount and the S3
gateway, and while `stoker pack` and a checkpoint save run. Writes to chains on the
other node are acknowledged; those that touch the
stopped node fail. After the node comes back, every file must read back with exactly
its acknowledged bytes, or as it was before, or fail; before the fix a failed write
published its size anyway and the file read as zeros (verifier.py checks every byte).

The clients get a short retry window (STOKER_RETRY_MS, the mount's -o timeout) and a
short RPC timeout (STOKER_RPC_TIMEOUT_MS), so a stopped node fails their calls within
seconds; the daemons keep their defaults.
"""
import contextlib
import os
import signal
import subprocess

import pytest

from conftest import STOKER, have_fuse, Mount
from verifier import (Verifier, cli_reader, cli_writer, cluster_env, path_reader,
                      path_writer, python_writer, s3_reader, s3_writer)

MiB = 1 << 20
CLIENT_ENV = {"STOKER_RETRY_MS": "2000", "STOKER_RPC_TIMEOUT_MS": "1000"}

# Small files land on one chain each (so some on the stopped node, some not); the
# large ones are striped over every chain, so they always touch the stopped node.
SMALL = [("s%02d" % i, 700 + 9000 * i) for i in range(10)]


def start(role_cluster):
    role_cluster.add_meta("meta")
    role_cluster.add_storage("st1", targets=2)
    role_cluster.add_storage("st2", targets=2)
    role_cluster.start_all()
    role_cluster.wait_serving()
    return role_cluster


@contextlib.contextmanager
def stopped(rc, name):
    """The node is stopped (SIGSTOP) inside the block; after it, killed (what its
    sockets still hold is lost, as when a node dies) and started again."""
    rc.nodes[name].proc.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        rc.kill(name)
        rc.start(name)
    rc.wait_serving()


@contextlib.contextmanager
def environ(extra):
    """os.environ with extra set, for children started inside (a mount, a gateway)."""
    old = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run_workload(v, writer, reader, large, during=None):
    """Writes every file (all acknowledged), stops st2 and writes them all again plus
    new ones, brings st2 back, checks; then writes once more and checks it all came
    back exactly. during: the cluster, to stop and restart st2."""
    rc = during
    names = SMALL + [("big", large)]
    assert len(v.write_all(writer, names)) == len(names), v.files
    # Rewrites of the files fail: O_TRUNC cuts the file's chunks on every chain of its
    # stripe, the stopped node's too. New small files land on one chain each: with
    # twelve, some land on the node that stayed (all on st2: one chance in 4,096).
    # A PUT writes a new file, which meta lays over serving chains only once mgmtd has
    # marked st2's down (store.c, layout_avoid_down): on a slow machine every PUT may
    # come after that and none fails, so the stop is tried again (at most 3 times).
    for attempt in range(3):
        with stopped(rc, "st2"):
            v.write_all(writer, [(n, s + 4321 + attempt) for n, s in names] +
                        [("new%02d" % i, 1500 + 7000 * i + attempt) for i in range(12)] +
                        [("newbig", large // 2 + attempt)])
        if v.fails:
            break
    print("acknowledged %d, failed %d" % (v.acks, v.fails))
    assert v.fails, "no write failed while a storage node was stopped: %s" % rc.logs()[-3000:]
    assert v.acks > len(names), "no write succeeded on the node that stayed"
    v.check(reader)
    acked = v.acked_sha()
    # The cluster is whole again: everything written now is acknowledged and read back.
    assert len(v.write_all(writer, [(n, s + 11) for n, s in names])) == len(names)
    v.check(reader)
    return acked


def test_cli_put_never_publishes_a_failed_write(role_cluster):
    rc = start(role_cluster)
    rc.cli("mkdir", "/d")
    env = cluster_env(rc, **CLIENT_ENV)
    v = Verifier(seed=1)
    acked = run_workload(v, cli_writer(rc, "/d", env), cli_reader(rc, "/d", env), 64 * MiB,
                         during=rc)
    assert "big" not in acked  # striped over the stopped node: never acknowledged


def test_python_close_raises_and_publishes_nothing(role_cluster):
    import pyhelp
    rc = start(role_cluster)
    rc.cli("mkdir", "/p")
    env = pyhelp.env_for(rc, **CLIENT_ENV)
    v = Verifier(seed=2)
    run_workload(v, python_writer(rc, "/p", env), cli_reader(rc, "/p", env), 16 * MiB,
                 during=rc)
    assert any("OSError" in e or "Input/output" in e
               for st in v.files.values() for e in st.errors), v.files


@pytest.mark.skipif(not have_fuse(), reason="needs root, /dev/fuse and fusermount3")
def test_mount_close_fails_and_publishes_nothing(role_cluster, tmp_path):
    rc = start(role_cluster)
    rc.cli("mkdir", "/m")
    with environ({"STOKER_RPC_TIMEOUT_MS": CLIENT_ENV["STOKER_RPC_TIMEOUT_MS"]}):
        m = Mount(rc, tmp_path / "mnt", opts=["timeout=2"])
        m.start()
    try:
        root = os.path.join(m.path, "m")
        v = Verifier(seed=3)
        env = cluster_env(rc, **CLIENT_ENV)
        # Written through the mount, read by another client (the CLI) and by the mount.
        run_workload(v, path_writer(root), cli_reader(rc, "/m", env), 16 * MiB, during=rc)
        v.check(path_reader(root))
    finally:
        m.stop()
    assert not m.sanitizer_reports(), m.log()


def test_s3_put_fails_with_500_and_keeps_the_old_object(role_cluster, tmp_path):
    pytest.importorskip("boto3")
    from test_s3 import Gateway
    rc = start(role_cluster)
    with environ(CLIENT_ENV):
        gw = Gateway(rc, tmp_path)
    try:
        s3 = gw.client()
        s3.create_bucket(Bucket="nwb")
        v = Verifier(seed=4)
        run_workload(v, s3_writer(s3, "nwb"), s3_reader(s3, "nwb"), 16 * MiB, during=rc)
        codes = {e.split("'Code': '")[1].split("'")[0] if "'Code': '" in e else e
                 for st in v.files.values() for e in st.errors}
        assert any("500" in c or "InternalError" in c for c in codes), codes
        # Multipart: parts written while whole, completion while a node is stopped.
        up = s3.create_multipart_upload(Bucket="nwb", Key="mpu")["UploadId"]
        parts = []
        for i in (1, 2):
            body = bytes([i]) * (5 * MiB)
            e = s3.upload_part(Bucket="nwb", Key="mpu", UploadId=up, PartNumber=i, Body=body)
            parts.append({"PartNumber": i, "ETag": e["ETag"]})
        with stopped(rc, "st2"):
            with pytest.raises(Exception) as ei:
                s3.complete_multipart_upload(Bucket="nwb", Key="mpu", UploadId=up,
                                             MultipartUpload={"Parts": parts})
        assert "500" in str(ei.value) or "InternalError" in str(ei.value), ei.value
        with pytest.raises(Exception) as ei:
            s3.get_object(Bucket="nwb", Key="mpu")
        assert "NoSuchKey" in str(ei.value), ei.value
        # Once whole again, the same completion succeeds.
        s3.complete_multipart_upload(Bucket="nwb", Key="mpu", UploadId=up,
                                     MultipartUpload={"Parts": parts})
        assert s3.get_object(Bucket="nwb", Key="mpu")["Body"].read() == \
            bytes([1]) * (5 * MiB) + bytes([2]) * (5 * MiB)
    finally:
        gw.stop()


def test_pack_fails_and_publishes_only_complete_shards(role_cluster, tmp_path):
    import pyhelp  # noqa: F401 (puts the package on sys.path)
    from stoker.shards import parse_index
    from verifier import content
    rc = start(role_cluster)
    src = tmp_path / "samples"
    src.mkdir()
    want = {}
    # 6 MiB in shards of up to 4 MiB: the first shard's data spans every chain, so
    # it always touches the stopped node.
    for i in range(40):
        name = "x%02d.bin" % i
        want[name] = content(name, 150000 + 1000 * i, 0)
        (src / name).write_bytes(want[name])
    env = cluster_env(rc, **CLIENT_ENV)
    with stopped(rc, "st2"):
        p = subprocess.run([STOKER, "pack", str(src), rc.url + "/packed", "--shard-size", "4M"],
                           capture_output=True, env=env, timeout=300)
    assert p.returncode != 0, p.stdout
    assert b"pack" in p.stderr, p.stderr
    # Every shard with an index is whole: each sample reads back as packed.
    names = rc.cli("ls", "/packed").stdout.decode().split()
    for idx in [n for n in names if n.endswith(".index")]:
        ix = parse_index(rc.cli("cat", "/packed/" + idx).stdout)
        data = rc.cli("cat", "/packed/" + idx[:-len("index")] + "data").stdout
        assert len(data) >= ix.data_size, idx
        for i in range(ix.count):
            o, n = int(ix.offsets[i]), int(ix.lengths[i])
            assert data[o:o + n] == want[ix.name(i)], (idx, ix.name(i))


_CKPT = """
import sys, stoker, stoker.checkpoint as ckpt
blob = bytes([int(sys.argv[2])]) * (int(sys.argv[3]) << 20)
if sys.argv[1] == "save":
    ckpt.save({"blob": blob}, sys.argv[4])
else:
    assert ckpt.load(sys.argv[4])["blob"] == blob, "checkpoint changed"
"""


def test_checkpoint_save_raises_and_keeps_the_old_one(role_cluster):
    import pyhelp
    pytest.importorskip("torch")
    rc = start(role_cluster)
    rc.cli("mkdir", "/ck")
    env = pyhelp.env_for(rc, **CLIENT_ENV)
    path = rc.url + "/ck/model.pt"

    def ck(*args):
        return subprocess.run([pyhelp.PYTHON, "-c", _CKPT] + [str(a) for a in args] + [path],
                              capture_output=True, env=env, timeout=300)

    p = ck("save", 1, 24)
    assert p.returncode == 0, p.stderr
    with stopped(rc, "st2"):
        p = ck("save", 2, 24)
    assert p.returncode != 0 and b"Error" in p.stderr, p.stderr
    p = ck("load", 1, 24)
    assert p.returncode == 0, p.stderr
