#!/usr/bin/python3
"""What the transport costs: CPU per request, threads and memory per connection.

    STOKER_BEFORE=/path/to/base/build/stoker /usr/bin/python3 scripts/bench-transport.py [ROUNDS]
    BUILDS="a=/path/stoker,b=/other/stoker" /usr/bin/python3 scripts/bench-transport.py \
        --bench-only [ROUNDS]

For each round and each build (the one before the change, if STOKER_BEFORE names
it, and this tree's build/stoker; or those BUILDS names, in its order), in turn, a
fresh one-machine cluster:

  - a fixed libstoker workload, `stoker bench --threads 4 --size 256M --files 500
    --rand-ops 40000` with short-circuit reads off (every read crosses the
    transport): the CPU seconds the storage node, meta and the client used for it
    (getrusage and /proc/PID/stat around it);
  - tests/tools/stk_connscale against the storage node with 10, 1,000 and 10,000
    connections, two requests in flight on each, 8 s each: replies per second, the
    storage node's CPU per reply, its threads and resident memory at the peak.
    The requests name a chain the node does not have, so each is answered from the
    routing check: this is the transport's own cost per request.

Prints a markdown table per part with every round, then the medians, and the
median of each `stoker bench` item per build. --bench-only skips the connection
counts. Needs the tree built (`make`); as root for the connection counts
(open-file limits).
"""
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AFTER = os.environ.get("STOKER", os.path.join(ROOT, "build", "stoker"))
BEFORE = os.environ.get("STOKER_BEFORE")
CONNSCALE = os.environ.get("STK_CONNSCALE", os.path.join(ROOT, "build", "tests", "stk_connscale"))
PORT = int(os.environ.get("BENCH_PORT", "19400"))
TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def status(pid, key):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def pids(data):
    res = {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % p, "rb") as f:
                argv = f.read().split(b"\0")
            with open("/proc/%s/stat" % p) as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        # not a daemon's own child between fork and exec (storage runs smartctl)
        if len(argv) > 4 and argv[1] in (b"mgmtd", b"meta", b"storage") and \
                data.encode() in b" ".join(argv):
            res[int(p)] = (argv[1].decode(), ppid)
    return {role: pid for pid, (role, ppid) in res.items() if ppid not in res}


class Cluster:
    """A fresh cluster on ports of its own: the next one does not wait for the last
    one's ports to be free again."""
    started = 0

    def __init__(self, binary):
        self.bin = binary
        self.port = PORT + 40 * (Cluster.started % 8)
        Cluster.started += 1
        self.data = tempfile.mkdtemp(prefix="stk-bench-transport-", dir="/var/tmp")
        self.env = dict(os.environ, STOKER_CLUSTER="stk://127.0.0.1:%d" % self.port,
                        STOKER_SHORT_CIRCUIT="0")

    def __enter__(self):
        subprocess.run([self.bin, "up", "--data", self.data, "--daemon", "--port", str(self.port)],
                       check=True, capture_output=True, timeout=120)
        self.pids = pids(self.data)
        return self

    def __exit__(self, *exc):
        subprocess.run([self.bin, "down", "--data", self.data], capture_output=True, timeout=60)
        shutil.rmtree(self.data, ignore_errors=True)


def workload(c):
    """CPU seconds of storage, meta and the client for one fixed bench run."""
    before = {r: cpu_s(p) for r, p in c.pids.items()}
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.time()
    p = subprocess.run([c.bin, "bench", "--threads", "4", "--size", "256M", "--files", "500",
                        "--rand-ops", "40000", "--json"], env=c.env, check=True,
                       capture_output=True, timeout=900)
    wall = time.time() - t0
    items = {r["name"]: r["value"] for r in json.loads(p.stdout)["results"]}
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    client = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    d = {r: cpu_s(p) - before[r] for r, p in c.pids.items()}
    return {"storage": d["storage"], "meta": d["meta"], "client": client, "wall": wall,
            "items": items}


def connscale(c, n, seconds=8):
    pid = c.pids["storage"]
    peak = {"threads": 0, "rss": 0}
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            peak["threads"] = max(peak["threads"], status(pid, "Threads"))
            peak["rss"] = max(peak["rss"], status(pid, "VmRSS"))
            time.sleep(0.2)

    t = threading.Thread(target=sample)
    t.start()
    c0 = cpu_s(pid)
    p = subprocess.run([CONNSCALE, "127.0.0.1:%d" % (c.port + 2), str(n), str(seconds)],
                       capture_output=True, timeout=300)
    used = cpu_s(pid) - c0
    stop.set()
    t.join()
    out = dict(kv.split("=") for kv in p.stdout.decode().split() if "=" in kv)
    replies = int(out.get("replies", 0))
    return {"ok": p.returncode == 0, "answered": "%s/%d" % (out.get("ok", "0"), n),
            "rps": float(out.get("replies_per_s", 0)),
            "us_per_reply": used * 1e6 / replies if replies else 0,
            "threads": peak["threads"], "rss_mib": peak["rss"] / 1024}


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    bench_only = "--bench-only" in sys.argv[1:]
    rounds = int(args[0]) if args else 3
    if os.environ.get("BUILDS"):
        builds = [tuple(b.split("=", 1)) for b in os.environ["BUILDS"].split(",")]
    else:
        builds = ([("before", BEFORE)] if BEFORE else []) + [("after", AFTER)]
    work = {b: [] for b, _ in builds}
    scale = {(b, n): [] for b, _ in builds for n in (10, 1000, 10000)}
    for r in range(rounds):
        for name, binary in builds:
            with Cluster(binary) as c:
                w = workload(c)
                work[name].append(w)
                print("round %d %s: bench cpu storage %.2f s meta %.2f s client %.2f s, %.1f s" %
                      (r + 1, name, w["storage"], w["meta"], w["client"], w["wall"]), flush=True)
                for n in () if bench_only else (10, 1000, 10000):
                    s = connscale(c, n)
                    scale[(name, n)].append(s)
                    print("round %d %s: %d conns: %s" % (r + 1, name, n, s), flush=True)
    print("\n| build | storage CPU (s) | meta CPU (s) | client CPU (s) | wall (s) |")
    print("|---|---:|---:|---:|---:|")
    for name, _ in builds:
        m = {k: statistics.median(w[k] for w in work[name])
             for k in ("storage", "meta", "client", "wall")}
        print("| %s | %.2f | %.2f | %.2f | %.1f |" % (name, m["storage"], m["meta"], m["client"],
                                                      m["wall"]))
    names = list(work[builds[0][0]][0]["items"])
    print("\n| `stoker bench` item | " + " | ".join(n for n, _ in builds) + " |")
    print("|---|" + "---:|" * len(builds))
    for item in names:
        print("| %s | %s |" % (item, " | ".join(
            "%.0f" % statistics.median(w["items"][item] for w in work[n]) for n, _ in builds)))
    if bench_only:
        return
    print("\n| build | connections | answered | replies/s | storage CPU per reply (µs) | "
          "threads | RSS (MiB) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, _ in builds:
        for n in (10, 1000, 10000):
            rs = scale[(name, n)]
            print("| %s | %d | %s | %.0f | %.1f | %d | %.0f |" % (
                name, n, ", ".join(s["answered"] for s in rs),
                statistics.median(s["rps"] for s in rs),
                statistics.median(s["us_per_reply"] for s in rs),
                max(s["threads"] for s in rs), max(s["rss_mib"] for s in rs)))


if __name__ == "__main__":
    main()
