#!/usr/bin/python3
"""Metadata shards against one meta (issue 24, docs/meta-shards.md, docs/BENCHMARKS.md).

For each shard count S of SHARDS (default "1 2 4"), a fresh `stoker up --meta-shards S
--mount`, one machine: two folders made in the mount, each set to spread the folders
made in it over the shards (`stoker shard pin DIR spread`; with S = 1 nothing to
spread), then the peers' W3 (`pbtool smallfiles`: FILES files of 16 KiB in 100
folders, 8 threads: create, cold read, stat) and W4 (`pbtool meta`: 4 threads of
W4_FILES empty files each, each thread in its own folder: create, stat, unlink; then
a big folder) in them, through the mount. The shard counts alternate over ROUNDS
rounds (the order rotated each round); each metric's median per S, and its ratio
to S = 1 within each round (median and range). Each shard's meta CPU time over the
run (utime + stime of its process) says how the work spread and what one operation
costs a shard: CPU microseconds per W4 operation (create + stat + unlink) and per
W3 file (create + read + stat), summed over shards.

Usage (root: drop_caches, mounts):
    ROUNDS=3 FILES=20000 W4_FILES=5000 READDIR=20000 PORT=10400 SHARDS="1 2 4" \
        /usr/bin/python3 scripts/bench-shards.py
"""
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STOKER = os.path.join(ROOT, "build", "stoker")
PBTOOL = os.path.join(ROOT, "..", "shared", "peers", "pbtool.py")
ROUNDS = int(os.environ.get("ROUNDS", "3"))
FILES = int(os.environ.get("FILES", "20000"))
W4_FILES = int(os.environ.get("W4_FILES", "5000"))
READDIR = int(os.environ.get("READDIR", "20000"))
PORT = int(os.environ.get("PORT", "10400"))
SHARDS = [int(s) for s in os.environ.get("SHARDS", "1 2 4").split()]
TICK = os.sysconf("SC_CLK_TCK")


def run(args, **kw):
    return subprocess.run(args, check=True, capture_output=True, timeout=1800, **kw)


def meta_cpu(data):
    """{shard: CPU seconds} of the meta processes of the cluster in `data`."""
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                argv = f.read().split(b"\0")
            with open("/proc/%s/stat" % pid) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if len(argv) < 2 or argv[1] != b"meta" or data.encode() not in b" ".join(argv):
            continue
        shard = 1
        if b"--shard" in argv:
            shard = int(argv[argv.index(b"--shard") + 1])
        out[shard] = out.get(shard, 0.0) + (int(fields[11]) + int(fields[12])) / TICK
    return out


def tool(*args):
    """The metrics pbtool prints ("NAME VALUE" lines)."""
    p = run(["/usr/bin/python3", PBTOOL] + list(args))
    vals = {}
    for line in p.stdout.decode().splitlines():
        f = line.split()
        if len(f) == 2:
            try:
                vals[f[0]] = float(f[1])
            except ValueError:
                pass
    return vals


def one(shards, work):
    data = os.path.join(work, "stk")
    mnt = os.path.join(work, "mnt")
    os.makedirs(mnt, exist_ok=True)
    env = dict(os.environ, STOKER_CLUSTER="stk://127.0.0.1:%d" % PORT,
               STOKER_KEY_FILE=os.path.join(data, "cluster.key"))
    run([STOKER, "up", "--data", data, "--daemon", "--port", str(PORT), "--meta-shards",
         str(shards), "--mount", mnt])
    try:
        for d in ("w3", "w4"):
            os.mkdir(os.path.join(mnt, d))
            if shards > 1:
                run([STOKER, "shard", "pin", "/" + d, "spread"], env=env)
        cpu0 = meta_cpu(data)
        vals = tool("smallfiles", os.path.join(mnt, "w3"), "--files", str(FILES), "--dirs",
                    "100", "--size", "16384", "--threads", "8")
        cpu1 = meta_cpu(data)
        vals.update(tool("meta", os.path.join(mnt, "w4"), "--threads", "4", "--files",
                         str(W4_FILES), "--readdir", str(READDIR)))
        cpu2 = meta_cpu(data)
        w3 = {k: cpu1.get(k, 0) - cpu0.get(k, 0) for k in cpu1}
        w4 = {k: cpu2.get(k, 0) - cpu1.get(k, 0) for k in cpu2}
        vals["W3_meta_cpu_us_per_file"] = sum(w3.values()) * 1e6 / FILES
        vals["W4_meta_cpu_us_per_op"] = sum(w4.values()) * 1e6 / (3 * 4 * W4_FILES + READDIR)
        vals["shares"] = "W3 " + " ".join("%d:%.0f%%" % (k, 100 * v / max(sum(w3.values()),
                                          1e-9)) for k, v in sorted(w3.items()))
        return vals
    finally:
        subprocess.run([STOKER, "down", "--data", data], capture_output=True, timeout=300)


def main():
    if os.getuid() != 0:
        sys.exit("bench-shards: run as root (drop_caches, mounts)")
    results = {s: [] for s in SHARDS}
    for r in range(ROUNDS):
        order = SHARDS[r % len(SHARDS):] + SHARDS[:r % len(SHARDS)]
        for s in order:
            with tempfile.TemporaryDirectory(dir="/var/tmp") as work:
                try:
                    v = one(s, work)
                except subprocess.CalledProcessError as e:
                    print("round %d, %d shard(s): failed: %s" % (r + 1, s,
                          (e.stderr or b"").decode()[-500:]), flush=True)
                    continue
            results[s].append(v)
            print("round %d, %d shard(s): %s" % (r + 1, s, " ".join(
                "%s=%s" % (k, ("%.1f" % x) if isinstance(x, float) else x)
                for k, x in sorted(v.items()))), flush=True)
    metrics = [k for k in (results[SHARDS[0]][0] if results[SHARDS[0]] else {})
               if k != "shares"]
    print("\n| metric | " + " | ".join("%d shard(s)" % s for s in SHARDS) + " | " +
          " | ".join("%d / 1 (range)" % s for s in SHARDS if s != 1) + " |")
    print("|---" * (1 + len(SHARDS) + len(SHARDS) - 1) + "|")
    for k in sorted(metrics):
        meds = [statistics.median([v[k] for v in results[s]]) if results[s] else 0
                for s in SHARDS]
        ratios = []
        for s in SHARDS:
            if s == 1:
                continue
            rr = [b[k] / a[k] for a, b in zip(results[1], results[s]) if a.get(k)]
            ratios.append("%.2f (%.2f-%.2f)" % (statistics.median(rr), min(rr), max(rr))
                          if rr else "-")
        print("| %s | %s | %s |" % (k, " | ".join("%.1f" % m for m in meds),
                                    " | ".join(ratios)))


if __name__ == "__main__":
    main()
