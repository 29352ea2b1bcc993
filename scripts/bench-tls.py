#!/usr/bin/env python3
"""What TLS costs (docs/security.md, "TLS"; docs/BENCHMARKS.md, "TLS").

Two one-machine clusters from `stoker up --targets 2`, both up for the whole run:
one plaintext on PORT (default 10700), one with --tls on PORT+40. Each round
measures both, in turn (the order swapped every round, so that neither always runs
first on a warmer machine):

  - large read: `stoker cat` of a SIZE_MB (default 1024) MiB file to /dev/null
    (STOKER_SHORT_CIRCUIT=0 for every client: all bytes cross the transport),
    with the page cache warm (read once before the rounds), so that what is
    measured is the transport and TLS, not the disk: MB/s, and the CPU seconds the
    read took per GB, the client's (getrusage of the child) and the daemons'
    (/proc/PID/stat) together;
  - connection set-up: tests/tools/stk_connsetup opens CONNS (default 500)
    connections to the storage node one after the other through the client's
    transport (connect and the key handshake, or connect and the TLS handshake);
  - `stoker bench --threads 4 --size 256M --files 2000 --meta-ops 4000
    --no-drop-caches` through libstoker: big write and read, 4 KiB random reads,
    small files, metadata rates (its connections are made once, so this is the
    per-request cost).

Prints each round, then a Markdown table of medians and their ratio (TLS / plain).

    /usr/bin/python3 scripts/bench-tls.py [WORK]   ROUNDS=3 PORT=10700 SIZE_MB=1024
                                                   CONNS=500
"""
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
S = os.path.join(ROOT, "build", "stoker")
WORK = sys.argv[1] if len(sys.argv) > 1 else "/var/tmp/stoker-bench-tls"
ROUNDS = int(os.environ.get("ROUNDS", "3"))
PORT = int(os.environ.get("PORT", "10700"))
SIZE_MB = int(os.environ.get("SIZE_MB", "1024"))
CONNS = int(os.environ.get("CONNS", "500"))
SETUP = os.path.join(ROOT, "build", "tests", "stk_connsetup")
TICK = os.sysconf("SC_CLK_TCK")
BENCH = ["bench", "--json", "--threads", "4", "--size", "256M", "--files", "2000",
         "--meta-ops", "4000", "--no-drop-caches"]
ITEMS = ["big write", "big read", "4K rand read", "small write", "small read", "create",
         "stat", "unlink"]


class Cluster:
    def __init__(self, name, port, tls):
        self.name, self.port, self.tls = name, port, tls
        self.data = os.path.join(WORK, name)

    def up(self):
        subprocess.run([S, "down", "--data", self.data], capture_output=True)
        subprocess.run([S, "up", "--data", self.data, "--daemon", "--port", str(self.port),
                        "--targets", "2"] + (["--tls"] if self.tls else []), check=True,
                       capture_output=True)

    def down(self):
        subprocess.run([S, "down", "--data", self.data], capture_output=True)

    def env(self):
        # no STOKER_TLS: the clients find it in what `stoker up --tls` recorded
        # no short-circuit reads: on the storage node's own host the client would
        # read chunk files from the disk, and the transport would not be measured
        env = dict(os.environ, STOKER_CLUSTER="stk://127.0.0.1:%d" % self.port,
                   STOKER_KEY_FILE=os.path.join(self.data, "cluster.key"),
                   STOKER_SHORT_CIRCUIT="0")
        env.pop("STOKER_TLS", None)
        return env

    def cli(self, *args, **kw):
        return subprocess.run([S] + list(args), env=self.env(), check=True,
                              capture_output=True, **kw)

    def daemon_cpu(self):
        """CPU seconds of this cluster's daemons so far."""
        total = 0
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open("/proc/%s/cmdline" % pid, "rb") as f:
                    argv = f.read().split(b"\0")
                if len(argv) < 2 or argv[1] not in (b"mgmtd", b"meta", b"storage") or \
                        self.data.encode() not in b" ".join(argv):
                    continue
                with open("/proc/%s/stat" % pid) as f:
                    st = f.read().rsplit(")", 1)[1].split()
                total += int(st[11]) + int(st[12])
            except (OSError, ValueError, IndexError):
                continue
        return total / TICK


def large_read(c):
    """(MB/s, CPU seconds per GB) of one `stoker cat` of /big.bin."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    d0 = c.daemon_cpu()
    t0 = time.monotonic()
    with open(os.devnull, "wb") as null:
        subprocess.run([S, "cat", "/big.bin"], env=c.env(), stdout=null, check=True)
    t1 = time.monotonic()
    d1 = c.daemon_cpu()
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    client = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    gb = SIZE_MB * 2**20 / 1e9
    return SIZE_MB * 2**20 / (t1 - t0) / 1e6, (client + d1 - d0) / gb


def setup(c):
    """Mean µs to open one connection to the storage node."""
    out = subprocess.run([SETUP, "127.0.0.1:%d" % (c.port + 2), str(CONNS)], env=c.env(),
                         check=True, capture_output=True).stdout.decode()
    assert ("tls=%d" % c.tls) in out, out
    return float(out.rsplit("setup_us=", 1)[1])


def bench(c):
    subprocess.run([S, "rm", "-r", "/bench"], env=c.env(), capture_output=True)
    out = c.cli(*(BENCH + ["/bench"])).stdout
    items = {r["name"]: r["value"] for r in json.loads(out)["results"]}
    return [items.get(k, 0.0) for k in ITEMS]


def main():
    os.makedirs(WORK, exist_ok=True)
    plain, tls = Cluster("plain", PORT, False), Cluster("tls", PORT + 40, True)
    src = os.path.join(WORK, "big.bin")
    try:
        for c in (plain, tls):
            c.up()
        with open(src, "wb") as f:
            for _ in range(SIZE_MB):
                f.write(os.urandom(1 << 20))
        for c in (plain, tls):
            c.cli("put", src, "/big.bin")
            large_read(c)  # warms the page cache
        os.unlink(src)
        res = {"plain": [], "tls": []}
        for r in range(ROUNDS):
            order = (plain, tls) if r % 2 == 0 else (tls, plain)
            for c in order:
                mbps, cpu = large_read(c)
                res[c.name].append([mbps, cpu, setup(c)] + bench(c))
                print("round %d %-5s: %s" % (r + 1, c.name,
                                             " ".join("%.1f" % v for v in res[c.name][-1])),
                      flush=True)
    finally:
        for c in (plain, tls):
            c.down()
        if os.path.exists(src):
            os.unlink(src)
    names = ["large read, warm, `stoker cat` (MB/s)", "CPU per GB read (s/GB, lower is better)",
             "connection set-up (µs, lower is better)",
             "bench: big write (MB/s)", "bench: big read (MB/s)",
             "bench: 4K random read (IOPS)", "bench: small write (files/s)",
             "bench: small read (files/s)", "bench: create (ops/s)", "bench: stat (ops/s)",
             "bench: unlink (ops/s)"]
    print()
    print("| measure (median of %d rounds) | plaintext | TLS | TLS / plaintext |" % ROUNDS)
    print("|---|---|---|---|")
    for i, name in enumerate(names):
        p = statistics.median(x[i] for x in res["plain"])
        t = statistics.median(x[i] for x in res["tls"])
        print("| %s | %.1f | %.1f | %.2f |" % (name, p, t, t / p if p else 0))
    shutil.rmtree(WORK, ignore_errors=True)


if __name__ == "__main__":
    main()
