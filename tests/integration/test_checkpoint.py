"""stoker.checkpoint: save/load round trips; atomic replacement under kill -9 (a
reader only ever sees a whole checkpoint, old or new); local-first saves whose
upload a crash interrupted, finished by `stoker checkpoint resume` or by the next
save, in save order."""
import os
import random
import signal
import subprocess
import time

import pytest

from pyhelp import PYTHON, client, env_for, stoker  # noqa: F401 (fixture)

torch = pytest.importorskip("torch")
import stoker.checkpoint as ckpt  # noqa: E402

MiB = 1 << 20


def make_obj(v, n=MiB):
    return {"v": v, "n": n, "t": torch.full((n,), float(v)), "meta": list(range(v % 50))}


def check_obj(o):
    """A checkpoint is whole when its parts agree with each other."""
    v, n = o["v"], o["n"]
    assert o["t"].shape == (n,) and bool((o["t"] == float(v)).all())
    assert o["meta"] == list(range(v % 50))
    return v


def test_save_load_round_trip(cluster, client):
    obj = {"w": torch.arange(3 * MiB, dtype=torch.float32), "step": 7, "name": "x"}
    client.mkdir("/ck")     # as with torch.save, the folder must exist
    ckpt.save(obj, cluster.url + "/ck/a.pt")
    got = ckpt.load(cluster.url + "/ck/a.pt")
    assert got["step"] == 7 and got["name"] == "x" and torch.equal(got["w"], obj["w"])
    # with an explicit client and a plain path; replaced in place
    ckpt.save({"step": 8}, "/ck/a.pt", client=client)
    assert ckpt.load("/ck/a.pt", client=client) == {"step": 8}
    # the replaced checkpoint stays, under a temporary name, for readers that had it open
    names = sorted(client.listdir("/ck"))
    assert names[0] == "a.pt" and len(names) == 2 and names[1].startswith("a.pt.tmp-")
    client.unlink("/ck/" + names[1])
    with pytest.raises(FileNotFoundError):
        ckpt.load("/ck/missing.pt", client=client)
    with pytest.raises(FileNotFoundError):
        ckpt.save({}, "/no/such/dir/x.pt", client=client)
    with pytest.raises(ValueError):
        ckpt.save({}, "relative.pt", client=client)
    # a save that fails while serialising leaves the old checkpoint and no temporary
    class Bad:
        def __reduce__(self):
            raise RuntimeError("cannot pickle me")
    with pytest.raises(RuntimeError):
        ckpt.save({"t": torch.zeros(MiB), "bad": Bad()}, "/ck/a.pt", client=client)
    assert ckpt.load("/ck/a.pt", client=client) == {"step": 8}
    assert sorted(client.listdir("/ck")) == ["a.pt"]


WRITER = r"""
import sys, torch, stoker.checkpoint as ckpt
v = int(sys.argv[1])
while True:
    ckpt.save({"v": v, "n": 4 << 20, "t": torch.full((4 << 20,), float(v)),
               "meta": list(range(v % 50))}, "/kill/ck.pt")
    print("saved", v, flush=True)
    v += 1
"""


def test_atomic_under_kill9(cluster, client):
    """A writer saving 16 MiB checkpoints in a loop is killed at random moments; a
    reader loading all the while sees only whole checkpoints, never going back."""
    client.mkdir("/kill")
    ckpt.save(make_obj(0, 4 << 20), "/kill/ck.pt", client=client)
    rng = random.Random(3)
    last = 0
    start = 1
    for _ in range(3):
        w = subprocess.Popen([PYTHON, "-c", WRITER, str(start)], env=env_for(cluster),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            w.stdout.readline()             # one whole save done: now kill mid-way in others
            deadline = time.time() + rng.uniform(0.05, 1.0)
            while time.time() < deadline:
                v = check_obj(ckpt.load("/kill/ck.pt", client=client))
                assert v >= last
                last = v
        finally:
            w.send_signal(signal.SIGKILL)
            out, err = w.communicate()
        assert w.returncode == -signal.SIGKILL, err
        saved = [int(l.split()[1]) for l in out.decode().split("\n") if l.startswith("saved")]
        v = check_obj(ckpt.load("/kill/ck.pt", client=client))
        assert v >= last
        last = v
        start = v + 100
    # the killed writers' temporaries, and the replaced checkpoints kept for late
    # readers, go once their grace period is over
    grace = ckpt.RETIRE_GRACE
    ckpt.RETIRE_GRACE = 0
    try:
        ckpt.save(make_obj(999, 16), "/kill/ck.pt", client=client)
    finally:
        ckpt.RETIRE_GRACE = grace
    assert client.listdir("/kill") == ["ck.pt"]
    assert check_obj(ckpt.load("/kill/ck.pt", client=client)) == 999


LOCAL_FIRST = r"""
import os, sys, torch, stoker.checkpoint as ckpt
h = ckpt.save({"v": int(sys.argv[2]), "n": 1 << 20, "t": torch.full((1 << 20,), float(sys.argv[2])),
               "meta": list(range(int(sys.argv[2]) % 50))}, sys.argv[1], local_dir=sys.argv[3])
print("local", flush=True)
if sys.argv[4] == "wait":
    h.wait()
    print("uploaded", flush=True)
else:
    import time; time.sleep(60)     # killed before the (delayed) upload completes
"""


def local_first(cluster, path, v, local, mode, delay="0"):
    return subprocess.Popen([PYTHON, "-c", LOCAL_FIRST, path, str(v), str(local), mode],
                            env=env_for(cluster, STOKER_CHECKPOINT_UPLOAD_DELAY=delay),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def crash_after_local_save(cluster, path, v, local):
    p = local_first(cluster, path, v, local, "crash", delay="30")
    assert p.stdout.readline() == b"local\n", p.stderr.read()
    p.send_signal(signal.SIGKILL)
    p.communicate()
    return p


def test_local_first_upload_and_resume(cluster, client, tmp_path):
    local = tmp_path / "nvme"
    client.mkdir("/lf")
    # a normal local-first save: returns, uploads, leaves nothing behind locally
    h = ckpt.save(make_obj(1), cluster.url + "/lf/a.pt", local_dir=str(local))
    assert h.wait(60) == cluster.url + "/lf/a.pt" and h.done()
    assert check_obj(ckpt.load("/lf/a.pt", client=client)) == 1
    assert [n for n in os.listdir(local / ".stoker-journal") if n.endswith((".json", ".data"))] == []

    # crash before the upload: the data is on local disk and in the journal
    crash_after_local_save(cluster, "/lf/b.pt", 2, local)
    assert not client.exists("/lf/b.pt")
    assert len(ckpt._pending(str(local))) == 1
    p = cluster.cli("checkpoint", "resume", str(local))
    assert b"resumed 1 upload" in p.stdout
    assert check_obj(ckpt.load("/lf/b.pt", client=client)) == 2
    assert ckpt._pending(str(local)) == []
    assert b"resumed 0 uploads" in cluster.cli("checkpoint", "resume", str(local)).stdout

    # crash again; the next local-first save (another process) finishes it first
    crash_after_local_save(cluster, "/lf/c.pt", 3, local)
    p = local_first(cluster, "/lf/d.pt", 4, local, "wait")
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    assert check_obj(ckpt.load("/lf/c.pt", client=client)) == 3
    assert check_obj(ckpt.load("/lf/d.pt", client=client)) == 4
    assert ckpt._pending(str(local)) == []

    # an interrupted older save of a path never replaces a newer one
    crash_after_local_save(cluster, "/lf/e.pt", 5, local)
    ckpt.save(make_obj(6), "/lf/e.pt", client=client, local_dir=str(local)).wait(60)
    assert check_obj(ckpt.load("/lf/e.pt", client=client)) == 6
    cluster.cli("checkpoint", "resume", str(local))
    assert check_obj(ckpt.load("/lf/e.pt", client=client)) == 6
    assert ckpt._pending(str(local)) == []

    p = cluster.cli("checkpoint", "resume", str(tmp_path / "nowhere"), check=False)
    assert p.returncode == 1
    assert cluster.cli("checkpoint", check=False).returncode == 2
