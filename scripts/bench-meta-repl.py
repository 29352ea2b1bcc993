#!/usr/bin/python3
"""What replicated metadata costs (docs/meta-replication.md, docs/BENCHMARKS.md).

1. W4-like metadata rates through the native client (`stoker bench`: create, stat
   and unlink of empty files, THREADS threads, META_OPS each phase) and through a
   FUSE mount (THREADS threads, MOUNT_FILES files each: open(O_CREAT), stat,
   unlink) on `stoker up --nodes 3 --meta 3` against `--meta 1`, a fresh cluster
   each, the order alternated over ROUNDS rounds; medians and ratios.
2. The failover pause: a client creating files in a loop while the meta leader is
   killed (SIGKILL, the supervisor paused so it is not restarted): the longest gap
   between two acknowledged creates, and the heartbeat timeout it ran with. With
   BASE=DIR (a build of another commit: DIR/build/stoker), its rounds alternate
   with that build's, in the same run.

Usage: ROUNDS=3 THREADS=4 META_OPS=4000 PORT=10300 [BASE=DIR] [MOUNT_FILES=1000]
       [PARTS=creates,failover] /usr/bin/python3 scripts/bench-meta-repl.py
A round whose bench fails is reported and left out.
"""
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STOKER = os.path.join(ROOT, "build", "stoker")
sys.path.insert(0, os.path.join(ROOT, "build", "python"))
import stoker  # noqa: E402

ROUNDS = int(os.environ.get("ROUNDS", "3"))
THREADS = int(os.environ.get("THREADS", "4"))
META_OPS = int(os.environ.get("META_OPS", "4000"))
PORT = int(os.environ.get("PORT", "10300"))
MOUNT_FILES = int(os.environ.get("MOUNT_FILES", "1000"))
BASE = os.environ.get("BASE")
PARTS = os.environ.get("PARTS", "creates,failover").split(",")
HB_MS = int(os.environ.get("HB_MS", "2000"))


def up(data, nmeta, stoker=STOKER):
    subprocess.run([stoker, "up", "--data", data, "--daemon", "--port", str(PORT), "--nodes",
                    "3", "--meta", str(nmeta), "--targets", "1", "--mgmtd", "1",
                    "--heartbeat-timeout-ms", str(HB_MS)], check=True, capture_output=True,
                   timeout=120)


def down(data, stoker=STOKER):
    subprocess.run([stoker, "down", "--data", data], capture_output=True, timeout=150)


def env(data):
    return dict(os.environ, STOKER_CLUSTER="stk://127.0.0.1:%d" % PORT,
                STOKER_KEY_FILE=os.path.join(data, "cluster.key"))


def cpu_ticks(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def meta_cpu(data):
    """{listen address: CPU ticks so far} of every meta process."""
    out = {}
    for pid, argv in pids(data, b"meta"):
        addr = argv[argv.index(b"--listen") + 1].decode()
        out[addr] = cpu_ticks(pid)
    return out


def leader_addr(data):
    st = subprocess.run([STOKER, "status"], capture_output=True, env=env(data)).stdout.decode()
    lead = [ln.split()[3] for ln in st.splitlines() if " leader " in ln]
    return lead[0] if lead else None


def bench(data):
    lead = leader_addr(data)
    before = meta_cpu(data)
    p = subprocess.run([STOKER, "bench", "--threads", str(THREADS), "--size", "%dM" % max(4, THREADS), "--block", "1M",
                        "--files", "10", "--rand-ops", "10", "--meta-ops", str(META_OPS),
                        "--no-drop-caches", "--json"], capture_output=True,
                       env=env(data), timeout=900)
    if p.returncode:
        raise RuntimeError("stoker bench failed (%d): %s" % (p.returncode,
                                                             p.stderr.decode()[-2000:]))
    out = json.loads(p.stdout)
    after = meta_cpu(data)
    rates = {}
    for ph in out["results"]:
        if ph["name"] in ("create", "stat", "unlink"):
            rates[ph["name"]] = ph["value"]
    # CPU of the whole run (every phase) per metadata operation, in ms
    ops = 3 * META_OPS * THREADS
    tick_ms = 1000.0 / os.sysconf("SC_CLK_TCK")
    used = {a: (after[a] - before.get(a, 0)) * tick_ms / ops for a in after}
    if lead:
        rates["cpu_leader"] = used.pop(lead, 0.0)
        rates["cpu_followers"] = sum(used.values())
    else:
        rates["cpu_leader"] = sum(used.values())
        rates["cpu_followers"] = 0.0
    return rates


def mount_w4(data):
    """create, stat, unlink of empty files through a FUSE mount: {phase: ops/s}."""
    mnt = data + "-mnt"
    os.makedirs(mnt)
    subprocess.run([STOKER, "mount", "stk://127.0.0.1:%d" % PORT, mnt], check=True,
                   capture_output=True, env=env(data), timeout=60)
    rates = {}
    try:
        dirs = [os.path.join(mnt, "w%d" % t) for t in range(THREADS)]
        for d in dirs:
            os.mkdir(d)

        def phase(fn):
            ts = [threading.Thread(target=lambda d=d: [fn(os.path.join(d, "f%d" % i))
                                                       for i in range(MOUNT_FILES)])
                  for d in dirs]
            t0 = time.monotonic()
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            return THREADS * MOUNT_FILES / (time.monotonic() - t0)
        rates["mount create"] = phase(lambda p: os.close(os.open(p, os.O_CREAT | os.O_WRONLY)))
        rates["mount stat"] = phase(os.stat)
        rates["mount unlink"] = phase(os.unlink)
    finally:
        subprocess.run([STOKER, "umount", mnt], capture_output=True, timeout=60)
        os.rmdir(mnt)
    return rates


def pids(data, role):
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if len(argv) > 3 and argv[1] == role and data.encode() in b" ".join(argv):
            found.append((int(pid), argv))
    return found


def failover_pause(data):
    st = subprocess.run([STOKER, "status"], capture_output=True, env=env(data)).stdout.decode()
    lead = [ln.split()[3] for ln in st.splitlines() if " leader " in ln][0]
    c = stoker.connect("stk://127.0.0.1:%d" % PORT)
    c.makedirs("/fo")
    acks, stop = [], threading.Event()

    def loop():
        i = 0
        while not stop.is_set():
            c.write_file("/fo/f%d" % i, b"")
            acks.append(time.monotonic())
            i += 1

    t = threading.Thread(target=loop)
    t.start()
    time.sleep(2)
    sup = pids(data, b"up")[0][0]
    meta = [p for p, argv in pids(data, b"meta") if lead.encode() in argv][0]
    os.kill(sup, signal.SIGSTOP)
    killed = time.monotonic()
    os.kill(meta, signal.SIGKILL)
    while time.monotonic() - killed < 40 and (not acks or acks[-1] < killed + 1):
        time.sleep(0.2)
    time.sleep(1)
    stop.set()
    t.join()
    os.kill(sup, signal.SIGCONT)
    c.close()
    gaps = [b - a for a, b in zip(acks, acks[1:])]
    return max(gaps), next(a for a in acks if a > killed) - killed


def main():
    results = {1: [], 3: [], "base3": []}
    kinds = [(1, STOKER), (3, STOKER)]
    if BASE:
        kinds.append(("base3", os.path.join(BASE, "build", "stoker")))
    for r in range(ROUNDS if "creates" in PARTS else 0):
        for kind, binary in (kinds if r % 2 == 0 else kinds[::-1]):
            nmeta = 3 if kind == "base3" else kind
            data = tempfile.mkdtemp(prefix="metarepl-bench-")
            try:
                up(data, nmeta, binary)
                try:
                    res = bench(data)
                    res.update(mount_w4(data))
                except (RuntimeError, subprocess.SubprocessError, OSError) as e:
                    print("round %d %s: failed, left out: %s" % (r + 1, kind, e), flush=True)
                    continue
                results[kind].append(res)
                print("round %d %s: %s" % (r + 1, kind, res), flush=True)
            finally:
                down(data, binary)
                subprocess.run(["rm", "-rf", data])
    if results[1] and results[3]:
        table(results)
    failover(PARTS)


def table(results):
    print("\n| W4-like, native client, %d threads | --meta 3 / --meta 1 | --meta 3 (median) "
          "| --meta 1 (median) |" % THREADS)
    print("|---|---:|---:|---:|")
    for op in ("create", "stat", "unlink", "mount create", "mount stat", "mount unlink"):
        a = statistics.median(x[op] for x in results[3])
        b = statistics.median(x[op] for x in results[1])
        print("| %s (ops/s) | %.2f | %.0f | %.0f |" % (op, a / b, a, b))
        if results["base3"]:
            c = statistics.median(x[op] for x in results["base3"])
            print("|   BASE --meta 3: %s | %.2f | %.0f | |" % (op, c / b, c))
    for what in ("cpu_leader", "cpu_followers"):
        a = statistics.median(x[what] for x in results[3])
        b = statistics.median(x[what] for x in results[1])
        print("| %s, ms per op (all phases) | %s | %.3f | %.3f |"
              % (what, "%.2f" % (a / b) if b else "-", a, b))
        if results["base3"]:
            c = statistics.median(x[what] for x in results["base3"])
            print("|   BASE --meta 3: %s | %s | %.3f | |" % (what, "%.2f" % (c / b) if b else "-",
                                                              c))


def failover(parts):
    if "failover" not in parts:
        return
    builds = [("this build", STOKER)]
    if BASE:
        builds.append(("BASE", os.path.join(BASE, "build", "stoker")))
    pauses = {name: [] for name, _ in builds}
    for r in range(ROUNDS):
        for name, binary in (builds if r % 2 == 0 else builds[::-1]):
            data = tempfile.mkdtemp(prefix="metarepl-bench-")
            try:
                up(data, 3, binary)
                pauses[name].append(failover_pause(data))
                print("failover round %d, %s: longest gap %.2f s, first create after the "
                      "kill %.2f s" % (r + 1, name, *pauses[name][-1]), flush=True)
            finally:
                down(data, binary)
                subprocess.run(["rm", "-rf", data])
    for name, _ in builds:
        print("\nfailover pause, %s (heartbeat timeout %d ms): longest gap between creates, "
              "median %.2f s (%s)" % (name, HB_MS, statistics.median(p[0] for p in pauses[name]),
                                      ", ".join("%.2f" % p[0] for p in pauses[name])))


if __name__ == "__main__":
    main()
