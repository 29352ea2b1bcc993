#!/usr/bin/python3
"""The pause a reader sees when a storage node fails, on a one-machine cluster of
three nodes and three copies (`stoker up --nodes 3`): a reader reads a 64 MiB file
over and over (the Python package, one client), and one storage node is
(a) killed with SIGKILL (the supervisor restarts it at once: a crashed daemon), or
(b) stopped with SIGSTOP for 20 s (a hung host: it answers nothing until mgmtd's
heartbeat timeout takes it out of its chains).
Prints, for each, the longest gap between two successful reads around the fault
and the heartbeat timeout it is measured against, as Markdown rows.

    python3 scripts/bench-failover.py [DIR] [ROUNDS]
"""
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


def one(kind):
    data = os.path.join(DIR, "c")
    subprocess.run([S, "down", "--data", data], capture_output=True)
    subprocess.run(["rm", "-rf", data])
    subprocess.run([S, "up", "--nodes", "3", "--data", data, "--port", str(PORT), "--daemon"],
                   check=True, capture_output=True)
    try:
        c = stoker.connect("stk://127.0.0.1:%d" % PORT)
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


def main():
    os.makedirs(DIR, exist_ok=True)
    print("| fault | longest pause of a reader (median of %d) | heartbeat timeout | errors |"
          % ROUNDS)
    print("|---|---|---|---|")
    for kind, what in (("kill", "storage daemon killed (restarted at once)"),
                       ("stop", "storage node hung 20 s (SIGSTOP)")):
        res = [one(kind) for _ in range(ROUNDS)]
        pauses = sorted(p for p, _ in res)
        errors = sum(len(b) for _, b in res)
        print("| %s | %.1f s | %.0f s | %d |" % (what, pauses[len(pauses) // 2], HB_S, errors))


if __name__ == "__main__":
    main()
