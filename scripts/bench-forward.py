#!/usr/bin/python3
"""What forwarding writes down a chain from the event loop costs and saves.

    ROUNDS=3 /usr/bin/python3 scripts/bench-forward.py [DIR]

For each round, with writes forwarded from the storage nodes' event loops
(STOKER_LOOP_WRITES=1, the default) and from their workers (=0), in turn, a fresh
one-machine cluster of three storage nodes and three copies of every chunk
(`stoker up --nodes 3 --replicas 3`, short-circuit reads off), and a fixed write
workload: one big file put whole (BIG MiB, default 256: 1 MiB chunk writes, many
in flight) and SMALL files of 64 KiB (default 400) put by 4 clients at once. It
records the wall time of each part, the CPU seconds the three storage nodes used
for it (/proc/PID/stat around it) and that CPU per chunk write the clients made,
and the storage nodes' peak thread count. Prints every round, then the medians.
DIR (default /var/tmp/stoker-fwd) must be on the disk to measure.
"""
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STOKER = os.environ.get("STOKER", os.path.join(ROOT, "build", "stoker"))
PORT = int(os.environ.get("STOKER_BENCH_PORT", "9780"))
TICK = os.sysconf("SC_CLK_TCK")
BIG = int(os.environ.get("BIG", "256"))
SMALL = int(os.environ.get("SMALL", "400"))


def storage_pids(data):
    res = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % p, "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if len(argv) > 4 and argv[1] == b"storage" and data.encode() in b" ".join(argv):
            res.append(int(p))
    # not a daemon's own child between fork and exec (storage runs smartctl)
    return [p for p in res if ppid(p) not in res]


def ppid(pid):
    with open("/proc/%d/stat" % pid) as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def cpu_s(pids):
    t = 0
    for pid in pids:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        t += int(fields[11]) + int(fields[12])
    return t / TICK


def threads(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    return 0


def one(base, variant, rnd):
    data = os.path.join(base, "%s-%d" % (variant, rnd))
    env = dict(os.environ, STOKER_CLUSTER="stk://127.0.0.1:%d" % PORT, STOKER_SHORT_CIRCUIT="0")
    env["STOKER_LOOP_WRITES"] = "0" if variant == "workers" else "1"
    subprocess.run([STOKER, "up", "--data", data, "--daemon", "--port", str(PORT), "--nodes",
                    "3", "--replicas", "3"], check=True, capture_output=True, timeout=180,
                   env=env)
    try:
        pids = storage_pids(data)
        assert len(pids) == 3, pids
        src = os.path.join(base, "src")
        peak = [0]
        stop = threading.Event()

        def sample():
            while not stop.is_set():
                peak[0] = max(peak[0], max(threads(p) for p in pids))
                time.sleep(0.05)

        t = threading.Thread(target=sample)
        t.start()
        out = {}
        c0, w0 = cpu_s(pids), time.time()
        subprocess.run([STOKER, "put", os.path.join(src, "big"), "/big"], check=True, env=env,
                       capture_output=True, timeout=900)
        c1, w1 = cpu_s(pids), time.time()
        lanes = [subprocess.Popen(
            "for i in $(seq %d 4 %d); do %s put %s/s$i /s$i || exit 1; done" % (
                k, SMALL - 1, STOKER, src), shell=True, env=env) for k in range(4)]
        for p in lanes:
            assert p.wait(timeout=900) == 0
        c2, w2 = cpu_s(pids), time.time()
        stop.set()
        t.join()
        out["big_s"], out["big_cpu"] = w1 - w0, c1 - c0
        out["small_s"], out["small_cpu"] = w2 - w1, c2 - c1
        out["big_us"] = out["big_cpu"] * 1e6 / BIG  # one chunk write per MiB
        out["small_us"] = out["small_cpu"] * 1e6 / SMALL
        out["threads"] = peak[0]
        return out
    finally:
        subprocess.run([STOKER, "down", "--data", data], capture_output=True, timeout=120)
        shutil.rmtree(data, ignore_errors=True)


def main():
    base = sys.argv[1] if len(sys.argv) > 1 else "/var/tmp/stoker-fwd"
    rounds = int(os.environ.get("ROUNDS", "3"))
    shutil.rmtree(base, ignore_errors=True)
    src = os.path.join(base, "src")
    os.makedirs(src)
    with open(os.path.join(src, "big"), "wb") as f:
        for _ in range(BIG):
            f.write(os.urandom(1 << 20))
    for i in range(SMALL):
        with open(os.path.join(src, "s%d" % i), "wb") as f:
            f.write(os.urandom(64 << 10))
    res = {"loop": [], "workers": []}
    for r in range(rounds):
        for v in ("loop", "workers"):
            o = one(base, v, r)
            res[v].append(o)
            print("round %d %s: %s" % (r + 1, v, " ".join(
                "%s=%.2f" % (k, x) for k, x in sorted(o.items()))), flush=True)
    shutil.rmtree(base, ignore_errors=True)
    print("\n| R=3, medians of %d | loop | workers | loop / workers |" % rounds)
    print("|---|---:|---:|---:|")
    for k, what in (("big_s", "%d MiB put, wall (s)" % BIG),
                    ("big_us", "storage CPU per 1 MiB chunk write, 3 nodes (µs)"),
                    ("small_s", "%d files of 64 KiB, 4 clients, wall (s)" % SMALL),
                    ("small_us", "storage CPU per 64 KiB file write, 3 nodes (µs)"),
                    ("threads", "peak threads of a storage node")):
        a = statistics.median(o[k] for o in res["loop"])
        b = statistics.median(o[k] for o in res["workers"])
        print("| %s | %.1f | %.1f | %.2f |" % (what, a, b, a / b if b else 0))


if __name__ == "__main__":
    main()
