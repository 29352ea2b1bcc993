#!/usr/bin/python3
"""The pause a reader sees when a storage node fails, on a one-machine cluster of
three nodes and three copies (`stoker up --nodes 3`): a reader reads a 64 MiB file
over and over (the Python package, one client), and one storage node is
(a) killed with SIGKILL (the supervisor restarts it at once: a crashed daemon), or
(b) stopped with SIGSTOP for 20 s (a hung host: it answers nothing until mgmtd's
heartbeat timeout takes it out of its chains).
Prints, for each, the longest gap between two successful reads around the fault
and the heartbeat timeout it is measured against, as Markdown rows; then how long
a node hung while 1 GiB was written takes to catch up once it is back, and the
rate of its copy (resync is limited to 256 MiB/s by default: --resync-rate).
Last, `stoker bench loader` (image preset) on the same cluster, alone and while a
node catches up after a hang in which RESYNC_GIB GiB (6 by default) were written,
in turn for ROUNDS rounds: the accelerators kept 90% busy in each case.

    python3 scripts/bench-failover.py [DIR] [ROUNDS]
    (ONLY=resync or ONLY=loader: that part alone; STEPS=12: loader steps per trial)
"""
import json
import os
import signal
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
S = os.path.join(ROOT, "build", "stoker")
sys.path.insert(0, os.path.join(ROOT, "build", "python"))
import stoker  # noqa: E402

DIR = sys.argv[1] if len(sys.argv) > 1 else "/var/tmp/stoker-failover"
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 3
PORT = int(os.environ.get("STOKER_BENCH_PORT", "9780"))
HB_S = 10.0  # mgmtd's default heartbeat timeout


def storage_pids(data):
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = open("/proc/%s/cmdline" % pid, "rb").read().split(b"\0")
        except OSError:
            continue
        if len(argv) > 2 and argv[1] == b"storage" and data.encode() in b" ".join(argv):
            out.append(int(pid))
    return sorted(out)


def fresh_cluster():
    """`stoker up --nodes 3` on an empty DIR/c: (its data folder, a client)."""
    data = os.path.join(DIR, "c")
    subprocess.run([S, "down", "--data", data], capture_output=True)
    subprocess.run(["rm", "-rf", data])
    subprocess.run([S, "up", "--nodes", "3", "--data", data, "--port", str(PORT), "--daemon"],
                   check=True, capture_output=True)
    try:
        return data, stoker.connect("stk://127.0.0.1:%d" % PORT)
    except OSError:
        subprocess.run([S, "down", "--data", data], capture_output=True)
        raise


def one(kind):
    data, c = fresh_cluster()
    try:
        blob = os.urandom(64 << 20)
        with c.open("/f", "wb") as f:
            f.write(blob)
        times, stop, bad = [], threading.Event(), []

        def reader():
            while not stop.is_set():
                try:
                    ok = c.read_file("/f") == blob
                except OSError as e:
                    bad.append(str(e))
                    continue
                times.append(time.time()) if ok else bad.append("wrong bytes")
        t = threading.Thread(target=reader)
        t.start()
        time.sleep(3)
        victim = storage_pids(data)[1]
        t0 = time.time()
        if kind == "kill":
            os.kill(victim, signal.SIGKILL)
            time.sleep(HB_S + 5)
        else:
            os.kill(victim, signal.SIGSTOP)
            time.sleep(20)
            os.kill(victim, signal.SIGCONT)
            time.sleep(5)
        stop.set()
        t.join()
        around = [x for x in times if x > t0 - 1]
        gaps = [b - a for a, b in zip([t0] + around, around)]
        return max(gaps), bad
    finally:
        subprocess.run([S, "down", "--data", data], capture_output=True)


def resync_round():
    """A node hung past the heartbeat timeout while 1 GiB is written: once it is back,
    how long its targets take to catch up, and at what rate (the storage log's own
    figures)."""
    data, c = fresh_cluster()
    try:
        victim = storage_pids(data)[1]
        log = [os.path.join(data, "log", n) for n in os.listdir(os.path.join(data, "log"))
               if n.startswith("storage")]
        os.kill(victim, signal.SIGSTOP)
        block = os.urandom(64 << 20)
        for i in range(16):
            with c.open("/w%d" % i, "wb") as f:
                f.write(block)
        time.sleep(max(0.0, HB_S + 2))
        t0 = time.time()
        os.kill(victim, signal.SIGCONT)
        deadline = t0 + 600
        while time.time() < deadline:
            st = subprocess.run([S, "status", "--cluster", "127.0.0.1:%d" % PORT],
                                capture_output=True).stdout.decode()
            if "syncing" not in st and "offline" not in st:
                break
            time.sleep(0.2)
        wall = time.time() - t0
        copied = 0.0
        for p in log:
            for line in open(p, errors="replace"):
                if "caught up with chain" in line and "copied (" in line:
                    size = line.split("copied (")[1].split(")")[0]
                    num, unit = float(size.split()[0]), size.split()[1]
                    copied += num * {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20,
                                     "GiB": 1 << 30}.get(unit, 1)
        return wall, copied
    finally:
        subprocess.run([S, "down", "--data", data], capture_output=True)


def loader(data):
    """`stoker bench loader --preset image` on the cluster: its JSON result, and the
    seconds it ran."""
    t0 = time.time()
    out = subprocess.run([S, "bench", "loader", "--json", "--preset", "image", "--steps",
                          os.environ.get("STEPS", "12"), "stk://127.0.0.1:%d/image" % PORT],
                         check=True, capture_output=True).stdout.decode()
    return json.loads(out.strip().splitlines()[-1]), time.time() - t0


def syncing():
    st = subprocess.run([S, "status", "--cluster", "127.0.0.1:%d" % PORT],
                        capture_output=True).stdout.decode()
    return "syncing" in st or "offline" in st


def loader_rounds():
    """The loader's AU-90 accelerator count alone and during a resync, in turn: a list
    of (alone, during, seconds of the loader run the resync overlapped, loader run
    seconds)."""
    data, c = fresh_cluster()
    gib = int(os.environ.get("RESYNC_GIB", "6"))
    out = []
    try:
        loader(data)  # makes the data set, and warms what the first round would pay
        block = os.urandom(64 << 20)
        for r in range(ROUNDS):
            alone, _ = loader(data)
            victim = storage_pids(data)[1]
            os.kill(victim, signal.SIGSTOP)
            for i in range(gib * 16):
                with c.open("/w%d" % i, "wb") as f:
                    f.write(block)
            time.sleep(HB_S + 2)
            os.kill(victim, signal.SIGCONT)
            while not syncing():
                time.sleep(0.1)
            during, secs = loader(data)
            t_end = time.time()
            while syncing():
                time.sleep(0.2)
            overlap = min(secs, time.time() - (t_end - secs))
            # the chunks written meanwhile go, so every round copies as much
            for i in range(gib * 16 if r + 1 < ROUNDS else 0):
                c.remove("/w%d" % i)
            out.append((alone["au90_accelerators"], during["au90_accelerators"],
                        overlap, secs))
        return out
    finally:
        subprocess.run([S, "down", "--data", data], capture_output=True)


def main():
    os.makedirs(DIR, exist_ok=True)
    if os.environ.get("ONLY") == "loader":
        res = loader_rounds()
        for i, (a, d, o, secs) in enumerate(res):
            print("round %d: alone %d, during a resync %d (the resync ran %.0f of the "
                  "loader's %.0f s)" % (i + 1, a, d, o, secs))
        alone = sorted(a for a, _, _, _ in res)[len(res) // 2]
        during = sorted(d for _, d, _, _ in res)[len(res) // 2]
        print()
        print("| loader (image preset), AU-90 accelerators, median of %d | alone "
              "| during a resync | ratio |" % ROUNDS)
        print("|---|---|---|---|")
        print("| `stoker up --nodes 3`, one node catching up %s GiB | %d | %d | %.2f |"
              % (os.environ.get("RESYNC_GIB", "6"), alone, during,
                 during / alone if alone else 0))
        return
    print("| fault | longest pause of a reader (median of %d) | heartbeat timeout | errors |"
          % ROUNDS)
    print("|---|---|---|---|")
    for kind, what in (("kill", "storage daemon killed (restarted at once)"),
                       ("stop", "storage node hung 20 s (SIGSTOP)")):
        if os.environ.get("ONLY") == "resync":
            break
        res = [one(kind) for _ in range(ROUNDS)]
        pauses = sorted(p for p, _ in res)
        errors = sum(len(b) for _, b in res)
        print("| %s | %.1f s | %.0f s | %d |" % (what, pauses[len(pauses) // 2], HB_S, errors))
    res = sorted(resync_round() for _ in range(ROUNDS))
    wall, copied = res[len(res) // 2]
    print()
    print("| resync after a hang past the heartbeat timeout, 1 GiB written meanwhile "
          "| catch-up time (median of %d) | copied | rate |" % ROUNDS)
    print("|---|---|---|---|")
    print("| storage node hung, then continued | %.1f s | %.0f MiB | %.0f MB/s |"
          % (wall, copied / (1 << 20), copied / wall / 1e6 if wall else 0))


if __name__ == "__main__":
    main()
