#!/usr/bin/python3
"""The CSI driver's costs (docs/BENCHMARKS.md): how long CreateVolume, the first and
later NodeStageVolume and NodePublishVolume take, and a cold read of one file
through a published volume's bind mount against the same file through the Stoker
mount it stands on (the pages dropped with fadvise before each read).

    /usr/bin/python3 scripts/bench-csi.py [--size MiB] [--rounds N]

Run as root from the repository root after `make && make python`; it starts its
own cluster (`stoker up`) and driver in a temporary folder and removes them.
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, "build")
STOKER = os.path.join(BUILD, "stoker")
sys.path.insert(0, os.path.join(BUILD, "python"))

import grpc  # noqa: E402
from stoker_csi import csi_pb2 as pb, csi_pb2_grpc as pbg  # noqa: E402

MiB = 1 << 20


def cold_read(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        t = time.perf_counter()
        n = 0
        while True:
            b = os.read(fd, MiB)
            if not b:
                break
            n += len(b)
        return n / (time.perf_counter() - t) / MiB
    finally:
        os.close(fd)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=256, help="MiB read per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--port", type=int, default=24600)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="bench-csi.")
    data, state = tmp + "/stk", tmp + "/state"
    url = "stk://127.0.0.1:%d" % a.port
    subprocess.run([STOKER, "up", "--data", data, "--daemon", "--port", str(a.port)],
                   check=True, capture_output=True)
    env = dict(os.environ, PYTHONPATH=os.path.join(BUILD, "python"), STOKER_BIN=STOKER)
    drv = subprocess.Popen([sys.executable, "-m", "stoker_csi", "--endpoint",
                            "unix://%s/csi.sock" % tmp, "--cluster", url, "--key-file",
                            data + "/cluster.key", "--state-dir", state],
                           env=env, stderr=subprocess.DEVNULL)
    cap = pb.VolumeCapability(mount=pb.VolumeCapability.MountVolume(),
                              access_mode=pb.VolumeCapability.AccessMode(mode=5))
    targets, stagings = [], []
    try:
        ch = grpc.insecure_channel("unix://%s/csi.sock" % tmp)
        grpc.channel_ready_future(ch).result(timeout=60)
        ctl, node = pbg.ControllerStub(ch), pbg.NodeStub(ch)

        def timed(fn, req):
            t = time.perf_counter()
            r = fn(req)
            return r, (time.perf_counter() - t) * 1e3

        creates, stages, publishes, vols = [], [], [], []
        for i in range(a.rounds * 2):
            r, ms = timed(ctl.CreateVolume, pb.CreateVolumeRequest(
                name="pvc-bench-%d" % i, volume_capabilities=[cap],
                capacity_range=pb.CapacityRange(required_bytes=(a.size + 64) * MiB)))
            creates.append(ms)
            vols.append(r.volume)
        for i, v in enumerate(vols):
            st = "%s/st-%d" % (tmp, i)
            _, ms = timed(node.NodeStageVolume, pb.NodeStageVolumeRequest(
                volume_id=v.volume_id, staging_target_path=st, volume_capability=cap))
            stages.append(ms)
            stagings.append((v.volume_id, st))
            t = "%s/t-%d" % (tmp, i)
            _, ms = timed(node.NodePublishVolume, pb.NodePublishVolumeRequest(
                volume_id=v.volume_id, staging_target_path=st, target_path=t,
                volume_capability=cap))
            publishes.append(ms)
            targets.append((v.volume_id, t))
        print("CreateVolume ms: median %.1f (min %.1f, max %.1f, %d calls)" % (
            statistics.median(creates), min(creates), max(creates), len(creates)))
        print("NodeStageVolume ms: first %.1f (starts the Stoker mount), then median %.1f" % (
            stages[0], statistics.median(stages[1:])))
        print("NodePublishVolume ms: median %.1f (min %.1f, max %.1f)" % (
            statistics.median(publishes), min(publishes), max(publishes)))
        shared = os.path.join(state, "mounts", os.listdir(state + "/mounts")[0])
        if not os.path.ismount(shared):
            shared = [os.path.join(state, "mounts", n) for n in os.listdir(state + "/mounts")
                      if os.path.ismount(os.path.join(state, "mounts", n))][0]
        path = vols[0].volume_context["path"]
        with open(targets[0][1] + "/big", "wb") as f:
            block = os.urandom(MiB)
            for _ in range(a.size):
                f.write(block)
        bind, direct = [], []
        os.sync()
        cold_read(targets[0][1] + "/big")  # once unmeasured: write-back done, caches alike
        for i in range(a.rounds):
            # alternate which goes first, so that neither always follows the other
            order = [(bind, targets[0][1]), (direct, shared + path)]
            for out, where in (order if i % 2 == 0 else order[::-1]):
                out.append(cold_read(where + "/big"))
        print("cold read %d MiB, MiB/s: bind mount %s median %.0f; Stoker mount %s median %.0f"
              % (a.size, [round(x) for x in bind], statistics.median(bind),
                 [round(x) for x in direct], statistics.median(direct)))
    finally:
        for vid, t in targets:
            subprocess.run(["umount", t], capture_output=True)
        for vid, st in stagings:
            subprocess.run(["umount", st], capture_output=True)
        for n in os.listdir(state + "/mounts") if os.path.isdir(state + "/mounts") else []:
            p = os.path.join(state, "mounts", n)
            if os.path.ismount(p):
                subprocess.run([STOKER, "umount", p], capture_output=True)
        drv.terminate()
        drv.wait()
        subprocess.run([STOKER, "down", "--data", data], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
