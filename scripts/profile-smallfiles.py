#!/usr/bin/python3
"""Where a small-file read through the mount spends its time.

Creates a tree of small files through a fresh mount (each file written and closed,
so durable, by THREADS threads) and reads every file of it in random
order with THREADS threads, twice: cold (a fresh mount and the kernel's caches
dropped) and warm (at once again, same mount), and prints per file: the FUSE
requests the mount served (from its -o metrics), their mean time in the daemon,
the round trips to meta and storage (from their /metrics), and the CPU seconds of
the reader (user and kernel), the mount daemon, meta and storage. With --local DIR
it reads the same tree copied there too, for the reference. With --list the cold
pass first lists every folder of the fresh mount (with the sizes, as `ls -l` and
ImageFolder do) and drops the kernel's caches again, as a data loader does before
its first epoch.

    /usr/bin/python3 scripts/profile-smallfiles.py --port 10500 --data /var/tmp/x \\
        [--files 4000] [--dirs 40] [--size 16384] [--threads 8] [--local DIR] [--list]

Needs root (drop_caches, mounts) and a built ./build/stoker. It starts a cluster
with `stoker up --port PORT` in DATA and stops it at the end.
"""
import argparse
import os
import random
import re
import resource
import shutil
import subprocess
import sys
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STOKER = os.environ.get("STOKER") or os.path.join(ROOT, "build", "stoker")


def scrape(port):
    """{metric{labels}: value} of one /metrics page."""
    out = {}
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("#") or " " not in line:
                continue
            k, v = line.rsplit(" ", 1)
            try:
                out[k] = float(v)
            except ValueError:
                pass
    return out


def pid_on(port):
    out = subprocess.run(["ss", "-ltnpH", "sport = :%d" % port], capture_output=True,
                         text=True).stdout
    m = re.search(r"pid=(\d+)", out)
    return int(m.group(1)) if m else None


def cpu(pid):
    """user+system seconds of a process (all its threads)."""
    if pid is None:
        return 0.0
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / tick


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def make_tree(top, files, dirs, size, threads):
    os.makedirs(top, exist_ok=True)
    for d in range(dirs):
        os.makedirs(os.path.join(top, "d%03d" % d), exist_ok=True)
    payload = os.urandom(size)

    def work(k):
        for i in range(k, files, threads):
            p = os.path.join(top, "d%03d" % (i % dirs), "f%06d" % i)
            with open(p, "wb") as f:
                f.write(payload)

    ts = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


def list_tree(top):
    paths = []
    for d in sorted(os.listdir(top)):
        for n in sorted(os.listdir(os.path.join(top, d))):
            paths.append(os.path.join(top, d, n))
    return paths


def read_all(paths, threads, seed):
    order = list(paths)
    random.Random(seed).shuffle(order)
    nbytes = [0] * threads

    def work(k):
        total = 0
        for p in order[k::threads]:
            fd = os.open(p, os.O_RDONLY)
            while True:
                b = os.read(fd, 1 << 20)
                if not b:
                    break
                total += len(b)
            os.close(fd)
        nbytes[k] = total

    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.monotonic()
    ts = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    wall = time.monotonic() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    return wall, r1.ru_utime - r0.ru_utime, r1.ru_stime - r0.ru_stime, sum(nbytes)


FUSE_RE = re.compile(r'stoker_client_(ops_total|op_duration_seconds_sum)\{frontend="fuse",op="(\w+)"\}')
RPC_RE = re.compile(r'stoker_rpc_requests_total\{op="(\w+)"\}')
RPC_T_RE = re.compile(r'stoker_rpc_duration_seconds_sum\{op="(\w+)"\}')


def diff(a, b):
    return {k: b[k] - a.get(k, 0.0) for k in b if b[k] - a.get(k, 0.0) != 0}


def report(label, n, wall, ut, st, d_mount, d_meta, d_stor, cpus):
    print("== %s: %d files in %.2f s, %.0f files/s" % (label, n, wall, n / wall))
    ops = {}
    for k, v in d_mount.items():
        m = FUSE_RE.match(k)
        if m:
            ops.setdefault(m.group(2), {})[m.group(1)] = v
    print("  FUSE requests per file (mean time in the daemon):")
    for op, v in sorted(ops.items(), key=lambda x: -x[1].get("ops_total", 0)):
        c = v.get("ops_total", 0)
        if c:
            print("    %-12s %5.2f  (%6.1f us)" % (op, c / n,
                                                  1e6 * v.get("op_duration_seconds_sum", 0) / c))
    for name, d in (("meta", d_meta), ("storage", d_stor)):
        rpcs = {RPC_RE.match(k).group(1): v for k, v in d.items() if RPC_RE.match(k)}
        secs = {RPC_T_RE.match(k).group(1): v for k, v in d.items() if RPC_T_RE.match(k)}
        print("  %s round trips per file (mean time served): %s" % (name, ", ".join(
            "%s %.2f (%.0f us)" % (k, v / n, 1e6 * secs.get(k, 0) / v)
            for k, v in sorted(rpcs.items(), key=lambda x: -x[1]) if v / n >= 0.005) or "none"))
    print("  CPU us per file: reader user %.1f, reader kernel %.1f, mount %.1f, meta %.1f, "
          "storage %.1f" % (1e6 * ut / n, 1e6 * st / n, 1e6 * cpus[0] / n, 1e6 * cpus[1] / n,
                           1e6 * cpus[2] / n))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--files", type=int, default=4000)
    ap.add_argument("--dirs", type=int, default=40)
    ap.add_argument("--size", type=int, default=16384)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--local", help="also read a copy of the tree in this local folder")
    ap.add_argument("--mount-opts", default="", help="extra -o options for the mount")
    ap.add_argument("--list", action="store_true",
                    help="list the fresh mount's folders before the cold pass")
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("profile-smallfiles: run as root (drop_caches, mounts)")
    if a.files < 1 or a.dirs < 1 or a.size < 0 or a.threads < 1:
        sys.exit("profile-smallfiles: --files, --dirs and --threads must be positive")
    data = os.path.abspath(a.data)
    mnt = os.path.join(data, "mnt")
    os.makedirs(mnt, exist_ok=True)
    cluster = "stk://127.0.0.1:%d" % a.port
    mport = a.port + 14
    opts = "metrics=127.0.0.1:%d" % mport + ("," + a.mount_opts if a.mount_opts else "")
    subprocess.run([STOKER, "up", "--data", os.path.join(data, "c"), "--daemon", "--port",
                    str(a.port)], check=True, stdout=subprocess.DEVNULL)
    try:
        subprocess.run([STOKER, "mount", cluster, mnt, "-o", opts], check=True)
        top = os.path.join(mnt, "tree")
        pids = [pid_on(mport), pid_on(a.port + 1), pid_on(a.port + 2)]
        c0 = [cpu(p) for p in pids]
        m0, e0, s0 = scrape(mport), scrape(a.port + 11), scrape(a.port + 12)
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.monotonic()
        make_tree(top, a.files, a.dirs, a.size, a.threads)
        wall = time.monotonic() - t0
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        m1, e1, s1 = scrape(mport), scrape(a.port + 11), scrape(a.port + 12)
        c1 = [cpu(p) for p in pids]
        report("mount, create", a.files, wall, r1.ru_utime - r0.ru_utime,
               r1.ru_stime - r0.ru_stime, diff(m0, m1), diff(e0, e1), diff(s0, s1),
               [y - x for x, y in zip(c0, c1)])
        paths = [p[len(mnt) + 1:] for p in list_tree(top)]
        if a.local:
            lt = os.path.join(a.local, "tree")
            if not os.path.isdir(lt):
                t0 = time.monotonic()
                make_tree(lt, a.files, a.dirs, a.size, a.threads)
                os.sync()
                print("== local, create (and one sync): %.0f files/s" %
                      (a.files / (time.monotonic() - t0)))
            lpaths = list_tree(lt)
        subprocess.run([STOKER, "umount", mnt], check=True)
        for label in ("cold", "warm"):
            if label == "cold":
                drop_caches()
                subprocess.run([STOKER, "mount", cluster, mnt, "-o", opts], check=True)
                if a.list:
                    for d in os.scandir(top):
                        for e in os.scandir(d.path):
                            e.stat()
                    drop_caches()
            pids = [pid_on(mport), pid_on(a.port + 1), pid_on(a.port + 2)]
            c0 = [cpu(p) for p in pids]
            m0, e0, s0 = scrape(mport), scrape(a.port + 11), scrape(a.port + 12)
            wall, ut, st, nb = read_all([os.path.join(mnt, p) for p in paths], a.threads, 1)
            m1, e1, s1 = scrape(mport), scrape(a.port + 11), scrape(a.port + 12)
            c1 = [cpu(p) for p in pids]
            if nb != len(paths) * a.size:
                sys.exit("profile-smallfiles: read %d bytes, expected %d" %
                         (nb, len(paths) * a.size))
            report("mount, " + label, len(paths), wall, ut, st, diff(m0, m1), diff(e0, e1),
                   diff(s0, s1), [y - x for x, y in zip(c0, c1)])
            if a.local:
                if label == "cold":
                    drop_caches()
                wall, ut, st, nb = read_all(lpaths, a.threads, 1)
                print("== local, %s: %d files in %.2f s, %.0f files/s; reader CPU us per file: "
                      "user %.1f, kernel %.1f" % (label, len(lpaths), wall, len(lpaths) / wall,
                                                  1e6 * ut / len(lpaths), 1e6 * st / len(lpaths)))
        subprocess.run([STOKER, "umount", mnt], check=True)
    finally:
        subprocess.run(["umount", "-l", mnt], stderr=subprocess.DEVNULL)
        subprocess.run([STOKER, "down", "--data", os.path.join(data, "c")],
                       stdout=subprocess.DEVNULL)
        if a.local:
            shutil.rmtree(os.path.join(a.local, "tree"), ignore_errors=True)


if __name__ == "__main__":
    main()
