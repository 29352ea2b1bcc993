#!/usr/bin/python3
"""A plain PyTorch loader on the mount against the same tree on the local disk.

A torchvision-style ImageFolder (a folder per class, one file per sample; the
samples are the sorted files of the sorted class folders, as torchvision lists
them) read by an unchanged torch.utils.data.DataLoader: WORKERS worker processes,
batches of BATCH, random order, each sample's bytes read whole (open, read, close;
no decoding, so that the figure is the storage's). Nothing here imports stoker.

Each round measures every target, in an order that rotates from round to round,
twice: cold (a fresh mount and the kernel's caches dropped, then the dataset built,
which lists the folders, and one epoch) and warm (a second epoch at once, on the
same mount). It prints samples/s per round, the medians, and the ratios to local.

    /usr/bin/python3 scripts/bench-torch-imagefolder.py --port 10500 --data /var/tmp/tb \\
        [--classes 100] [--per-class 200] [--size 16384] [--workers 8] [--batch 64] \\
        [--rounds 3] [--before /path/to/older/stoker] [--mount-opts OPTS]

Targets: `local` (DATA/local, the same disk), `stoker` (this build's `stoker mount`)
and, with --before, `before` (that binary's `stoker mount`, against the same
cluster). The cluster (`stoker up --port PORT`, this build) holds the tree; it is
written once through a mount and checked byte for byte against the local copy. Needs
root (drop_caches, mounts). Removes DATA's cluster and trees at the end unless --keep.
"""
import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
import warnings

import torch
from torch.utils.data import DataLoader, Dataset

warnings.filterwarnings("ignore", message="This DataLoader will create")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEED = 25


class ImageFolderBytes(Dataset):
    """torchvision.datasets.ImageFolder's listing, with a loader that returns bytes."""

    def __init__(self, root):
        self.classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
        if not self.classes:
            raise FileNotFoundError("no class folders in %s" % root)
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        self.samples = []
        for c in self.classes:
            d = os.path.join(root, c)
            for name in sorted(os.listdir(d)):
                p = os.path.join(d, name)
                if os.path.isfile(p):
                    self.samples.append((p, self.class_to_idx[c]))

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        path, target = self.samples[i]
        with open(path, "rb") as f:
            return f.read(), target


def collate(batch):
    """Samples of any size, joined in the worker: one uint8 tensor of the batch's bytes,
    their lengths and the targets. One tensor per batch crosses to the main process
    (a tensor per sample would cost a shared-memory segment each, and on a small
    machine that, not the storage, would set the pace)."""
    data = b"".join(b[0] for b in batch)
    return (torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else
            torch.empty(0, dtype=torch.uint8),
            torch.tensor([len(b[0]) for b in batch]), torch.tensor([b[1] for b in batch]))


def epoch(ds, workers, batch, seed):
    g = torch.Generator()
    g.manual_seed(seed)
    dl = DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers, generator=g,
                    collate_fn=collate)
    n = nbytes = 0
    t0 = time.perf_counter()
    for data, lens, ys in dl:
        n += len(ys)
        nbytes += data.numel()
        if int(lens.sum()) != data.numel():
            sys.exit("bench-torch-imagefolder: a batch's lengths do not add up")
    return n, nbytes, time.perf_counter() - t0


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("bench-torch-imagefolder: %s failed: %s" % (" ".join(cmd), r.stderr.strip()))


def make_tree(top, classes, per_class, size):
    rnd = random.Random(SEED)
    for c in range(classes):
        d = os.path.join(top, "class%03d" % c)
        os.makedirs(d, exist_ok=True)
        for i in range(per_class):
            with open(os.path.join(d, "img%05d.bin" % i), "wb") as f:
                f.write(rnd.randbytes(size))


def same_tree(a, b):
    for d in sorted(os.listdir(a)):
        for n in sorted(os.listdir(os.path.join(a, d))):
            with open(os.path.join(a, d, n), "rb") as x, open(os.path.join(b, d, n), "rb") as y:
                if x.read() != y.read():
                    return os.path.join(d, n)
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--port", type=int, required=True, help="the cluster's base port")
    ap.add_argument("--data", required=True, help="a folder on the disk to measure")
    ap.add_argument("--classes", type=int, default=100)
    ap.add_argument("--per-class", type=int, default=200)
    ap.add_argument("--size", type=int, default=16384, help="bytes per sample")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--before", help="another stoker binary whose mount to measure too")
    ap.add_argument("--mount-opts", default="", help="-o options for the mounts")
    ap.add_argument("--keep", action="store_true", help="keep the cluster and trees")
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench-torch-imagefolder: run as root (drop_caches, mounts)")
    for k in ("classes", "per_class", "workers", "batch", "rounds"):
        if getattr(a, k) < 1:
            sys.exit("bench-torch-imagefolder: --%s must be at least 1" % k.replace("_", "-"))
    if a.size < 0 or not 0 < a.port < 65536 - 20:
        sys.exit("bench-torch-imagefolder: bad --size or --port")
    stoker = os.path.join(ROOT, "build", "stoker")
    bins = {"stoker": stoker}
    if a.before:
        if not os.access(a.before, os.X_OK):
            sys.exit("bench-torch-imagefolder: --before %s is not an executable" % a.before)
        bins["before"] = os.path.abspath(a.before)
    data = os.path.abspath(a.data)
    local = os.path.join(data, "local")
    mnt = os.path.join(data, "mnt")
    cdata = os.path.join(data, "cluster")
    os.makedirs(mnt, exist_ok=True)
    cluster = "stk://127.0.0.1:%d" % a.port
    mopts = ["-o", a.mount_opts] if a.mount_opts else []
    run([stoker, "up", "--data", cdata, "--daemon", "--port", str(a.port), "--no-metrics"])
    try:
        if not os.path.isdir(local):
            make_tree(local, a.classes, a.per_class, a.size)
        run([stoker, "mount", cluster, mnt] + mopts)
        if not os.path.isdir(os.path.join(mnt, "tree")):
            shutil.copytree(local, os.path.join(mnt, "tree"))
        bad = same_tree(local, os.path.join(mnt, "tree"))
        run([stoker, "umount", mnt])
        if bad:
            sys.exit("bench-torch-imagefolder: %s differs between local and the mount" % bad)
        targets = ["local"] + list(bins)
        res = {(t, k): [] for t in targets for k in ("cold", "warm")}
        print("# torch %s, %d samples of %d bytes, %d workers, batches of %d, %d rounds" %
              (torch.__version__, a.classes * a.per_class, a.size, a.workers, a.batch, a.rounds))
        for r in range(a.rounds):
            order = targets[r % len(targets):] + targets[:r % len(targets)]
            for t in order:
                if t != "local":
                    run([bins[t], "mount", cluster, mnt] + mopts)
                root = local if t == "local" else os.path.join(mnt, "tree")
                try:
                    drop_caches()
                    ds = ImageFolderBytes(root)
                    for k, seed in (("cold", SEED + r), ("warm", SEED + 100 + r)):
                        n, nb, dt = epoch(ds, a.workers, a.batch, seed)
                        if n != len(ds) or nb != n * a.size:
                            sys.exit("bench-torch-imagefolder: %s read %d samples, %d bytes" %
                                     (t, n, nb))
                        res[(t, k)].append(n / dt)
                        print("round %d %-7s %s %9.0f samples/s" % (r + 1, t, k, n / dt),
                              flush=True)
                finally:
                    if t != "local":
                        run([bins[t], "umount", mnt])
        print("\n| target | cold samples/s (median) | / local | warm samples/s (median) | / local |")
        print("|---|---:|---:|---:|---:|")
        med = {key: statistics.median(v) for key, v in res.items()}
        for t in targets:
            print("| %s | %.0f | %.2f | %.0f | %.2f |" % (
                t, med[(t, "cold")], med[(t, "cold")] / med[("local", "cold")],
                med[(t, "warm")], med[(t, "warm")] / med[("local", "warm")]))
        if "before" in bins:
            print("\nstoker / before: cold %.2f, warm %.2f" % (
                med[("stoker", "cold")] / med[("before", "cold")],
                med[("stoker", "warm")] / med[("before", "warm")]))
    finally:
        subprocess.run(["umount", "-l", mnt], stderr=subprocess.DEVNULL)
        subprocess.run([stoker, "down", "--data", cdata], stdout=subprocess.DEVNULL)
        if not a.keep:
            shutil.rmtree(cdata, ignore_errors=True)
            shutil.rmtree(local, ignore_errors=True)


if __name__ == "__main__":
    main()
