#!/usr/bin/python3
"""NFS and SMB through Stoker's gateways against the same servers on the local file
system (docs/BENCHMARKS.md, issue 27), in one run on this machine.

For each round, in turn: `stoker gateway nfs` (Ganesha over the gateway's Stoker
mount of a one-machine cluster), the same Ganesha configuration serving a local
folder on the same disk, `stoker gateway smb` (smbd over its mount), and the same
smbd configuration serving the local folder. With STOKER_BEFORE=PATH/stoker (an
older build, its stoker-nfs-fsid.so beside it) its gateways run too, on the same
cluster, so that a change is measured against what it replaced in the same run.
Odd rounds run the servers in the opposite order. The local servers'
configurations are the gateways' own, with the mount's path, ports and state
folders replaced, so the servers differ only in what lies under them. Each is
measured with a user-space client, as this kernel has no NFS or SMB client:

  - NFS (NFSv3, libnfs through tests/integration/nfsclient.py, 1 MiB requests):
    write a BIG_MIB MiB file (fsync at the end), read it back into a buffer the
    client touched beforehand (checked against what was written), read it again
    warm, read it cold once more into memory allocated as it reads (read_file: the
    old measure, which times the client's page faults as much as the server), read
    SMALL files of 16 KiB one after the other;
  - SMB (smbclient, SMB3): put the big file, get it, mget the small files;
  - and the same through the Stoker mount itself (default options, 1 MiB reads
    and writes, the file fsync'ed once), the path every gateway adds its server to.

Reads are cold on both sides: before each, the local files and the cluster's chunk
files are dropped from the page cache, file by file (posix_fadvise, so nothing else
on the machine loses its cache). The big file is then read a second time, warm:
from the page cache on the local side, from the chunk files' pages (and what the
gateway's mount kept) on Stoker's. For the cold read the script also reports the CPU
seconds per GB each party spent: the server (ganesha.nfsd, smbd), the gateway's
mount, the storage daemon, and the client.

Prints every round, then medians and the ratio Stoker / local for each.

    python3 scripts/bench-nfs-smb.py [WORK]   (BIG_MIB=2048 SMALL=2000 ROUNDS=3 PORT=10500)
Needs root, the build (make), nfs-ganesha, rpcbind, samba and smbclient.
"""
import ctypes
import mmap
import os
import pwd
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
S = os.path.join(ROOT, "build", "stoker")
BEFORE = os.environ.get("STOKER_BEFORE", "")
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
from nfsclient import Nfs  # noqa: E402

WORK = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "/var/tmp/stoker-bench-gw")
BIG = int(os.environ.get("BIG_MIB", "2048")) << 20
SMALL = int(os.environ.get("SMALL", "2000"))
ROUNDS = int(os.environ.get("ROUNDS", "3"))
PORT = int(os.environ.get("PORT", "10500"))
NFS_PORT, NFS_LOCAL, SMB_PORT, SMB_LOCAL = PORT + 40, PORT + 42, PORT + 44, PORT + 45
HZ = os.sysconf("SC_CLK_TCK")
USER, PASSWORD = "stkbench", "bench-pw-1"
URL = "stk://127.0.0.1:%d" % PORT


def sh(*args, **kw):
    return subprocess.run(args, check=True, capture_output=True, **kw)


def wait_port(port, proc=None, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError("%s exited %d" % (proc.args[0], proc.returncode))
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("nothing listens on %d" % port)


def stop(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def rpcbind_up():
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect("/run/rpcbind.sock")
        return True
    except OSError:
        return False
    finally:
        s.close()


class Mounted:
    """`stoker mount` of the cluster on WORK/m with its default options, as a
    training node mounts it: the reference a gateway adds its server to."""

    def __init__(self, exe=S):
        sh(exe, "mount", URL, WORK + "/m")

    def poll(self):
        return None

    def send_signal(self, sig):
        subprocess.run([S, "umount", WORK + "/m"], capture_output=True)

    def wait(self, timeout=None):
        return 0


def mount_round(port, blob, small):
    """(write MB/s, read MB/s, small files/s) through the mount itself."""
    path = WORK + "/m/bench/big.bin"

    def write():
        with open(path, "wb") as f:
            f.write(blob)
            os.fsync(f.fileno())

    def read():
        with open(path, "rb", buffering=0) as f:
            while f.read(1 << 20):
                pass

    w = timed(write)
    r, cpu = timed_read(read)
    warm = timed(read)
    got = []
    drop_cache()

    def smalls():
        for i in range(small):
            with open("%s/m/bench/small/%d" % (WORK, i), "rb") as f:
                got.append(len(f.read()))
    s = timed(smalls)
    assert sum(got) == small * 16384, "short small reads"
    os.unlink(path)
    return BIG / w / 1e6, BIG / r / 1e6, small / s, cpu, BIG / warm / 1e6


def nfs_gateway(exe=S):
    p = subprocess.Popen([exe, "gateway", "nfs", "--cluster", URL, "--listen",
                          "127.0.0.1:%d" % NFS_PORT, "--state", WORK + "/nfs", "--export",
                          "/bench", "--protocols", "3", "--no-root-squash", "--grace", "0"],
                         stdout=open(WORK + "/nfs-gateway.log", "ab"), stderr=subprocess.STDOUT)
    wait_port(NFS_PORT, p)
    time.sleep(1)  # Ganesha answers TCP a moment before its exports are loaded
    return p


def nfs_local():
    """Ganesha with the gateway's configuration over the local folder."""
    conf = open(WORK + "/nfs/ganesha.conf").read()
    conf = re.sub(r"\tPath = [^;]*;", "\tPath = %s/local;" % WORK, conf)
    conf = conf.replace(WORK + "/nfs/", WORK + "/nfsl/")
    conf = re.sub(r"NFS_Port = \d+", "NFS_Port = %d" % NFS_LOCAL, conf)
    conf = re.sub(r"MNT_Port = \d+", "MNT_Port = %d" % (NFS_LOCAL + 1), conf)
    os.makedirs(WORK + "/nfsl/v4recov", exist_ok=True)
    with open(WORK + "/nfsl/ganesha.conf", "w") as f:
        f.write(conf)
    p = subprocess.Popen(["/usr/bin/ganesha.nfsd", "-F", "-f", WORK + "/nfsl/ganesha.conf",
                          "-L", WORK + "/nfsl/ganesha.log", "-p", WORK + "/nfsl/ganesha.pid",
                          "-N", "NIV_EVENT"], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)
    wait_port(NFS_LOCAL, p)
    time.sleep(1)
    return p


def smb_gateway(exe=S):
    p = subprocess.Popen([exe, "gateway", "smb", "--cluster", URL, "--listen",
                          "127.0.0.1:%d" % SMB_PORT, "--state", WORK + "/smb", "--share",
                          "bench=/bench", "--users", WORK + "/users"],
                         stdout=open(WORK + "/smb-gateway.log", "ab"), stderr=subprocess.STDOUT)
    wait_port(SMB_PORT, p)
    return p


def smb_local():
    """smbd with the gateway's configuration (and user database) over the local folder."""
    conf = open(WORK + "/smb/smb.conf").read()
    conf = re.sub(r"\tpath = .*", "\tpath = %s/local" % WORK, conf)
    conf = conf.replace(WORK + "/smb/", WORK + "/smbl/")
    conf = re.sub(r"smb ports = \d+", "smb ports = %d" % SMB_LOCAL, conf)
    shutil.rmtree(WORK + "/smbl", ignore_errors=True)
    shutil.copytree(WORK + "/smb/smb", WORK + "/smbl/smb", symlinks=True,
                    ignore=shutil.ignore_patterns("*.pid", "*.sock", "msg.sock", "ncalrpc"))
    with open(WORK + "/smbl/smb.conf", "w") as f:
        f.write(conf)
    # a group of its own, as the gateway runs it: smbd signals its group as it stops
    p = subprocess.Popen(["/usr/sbin/smbd", "--foreground", "--no-process-group", "-s",
                          WORK + "/smbl/smb.conf"], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)
    wait_port(SMB_LOCAL, p)
    return p


def timed(fn):
    t0 = time.time()
    fn()
    return time.time() - t0


def drop_file(path):
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def drop_cache():
    """The local folder's and the cluster's chunk files leave the page cache, and so
    does the big file in the running gateway's mount: the pages the gateway kept of
    what it wrote (the local side's are dropped with the local folder)."""
    os.sync()
    for top in (WORK + "/local", WORK + "/c/targets", WORK + "/c/storage"):
        for dirpath, _, files in os.walk(top):
            for name in files:
                drop_file(os.path.join(dirpath, name))
    for mnt, path in ((WORK + "/nfs/mnt", "/big.bin"), (WORK + "/smb/mnt", "/bench/big.bin")):
        if os.path.ismount(mnt):
            drop_file(mnt + path)


def party(cmd):
    if "ganesha" in cmd or "smbd" in cmd:
        return "server"
    if " mount " in cmd:
        return "mount"
    if " storage " in cmd:
        return "storage"
    return None


def cpu_seconds():
    """{party: CPU seconds so far} of this run's processes (children reaped count)."""
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open("/proc/%s/stat" % pid) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        who = party(cmd) if WORK in cmd else None
        if who:
            out[who] = out.get(who, 0.0) + sum(int(x) for x in fields[11:15]) / HZ
    t = os.times()
    out["client"] = t.user + t.system + t.children_user + t.children_system
    return out


def timed_read(fn):
    """(seconds, {party: CPU seconds per GB}) of a cold read of the big file."""
    drop_cache()
    c0 = cpu_seconds()
    t = timed(fn)
    time.sleep(0.5)  # smbd reaps the child that served the connection
    c1 = cpu_seconds()
    return t, {k: (c1[k] - c0.get(k, 0.0)) / (BIG / 1e9) for k in c1}


def same(buf, blob):
    return all(buf[o:o + (64 << 20)] == blob[o:o + (64 << 20)] for o in range(0, BIG, 64 << 20))


def nfs_round(port, blob, small, buf):
    """(write MB/s, read MB/s, small files/s, read CPU, warm read MB/s, read MB/s of
    the whole file into new memory) over NFSv3 on port. The big reads land in buf,
    a buffer of the file's size whose pages the client touched before: a client
    that keeps the file in memory it allocates as it reads (read_file) spends as
    much time faulting in 4 GiB of fresh pages as the server spends reading, and
    that time swings 2-3x on this machine (the last column shows it)."""
    addr = ctypes.addressof((ctypes.c_char * BIG).from_buffer(buf))
    with Nfs("127.0.0.1", "/bench", port, version=3, mount_port=port + 1, uid=0, gid=0) as n:
        w = timed(lambda: n.write_file("/big.bin", blob))
        ctypes.memset(addr, 0, BIG)
        r, cpu = timed_read(lambda: n.read_into("/big.bin", buf))
        assert same(buf, blob), "the big file read back differs"
        warm = timed(lambda: n.read_into("/big.bin", buf))
        drop_cache()
        grow = timed(lambda: n.read_file("/big.bin"))
        got = []
        drop_cache()
        s = timed(lambda: [got.append(len(n.read_file("/small/%d" % i))) for i in range(small)])
        assert sum(got) == small * 16384, "short small reads"
        n.unlink("/big.bin")
    return BIG / w / 1e6, BIG / r / 1e6, small / s, cpu, BIG / warm / 1e6, BIG / grow / 1e6


def smbclient(port, commands):
    return sh("smbclient", "-p", str(port), "-m", "SMB3", "-U", "%s%%%s" % (USER, PASSWORD),
              "//127.0.0.1/bench", "-c", commands)


def smb_round(port, big_path, small):
    """(write MB/s, read MB/s, small files/s) with smbclient on port."""
    out = WORK + "/smb-out"
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    w = timed(lambda: smbclient(port, "put %s big.bin" % big_path))
    r, cpu = timed_read(lambda: smbclient(port, "get big.bin /dev/null"))
    warm = timed(lambda: smbclient(port, "get big.bin /dev/null"))
    drop_cache()
    s = timed(lambda: smbclient(port, "prompt off; cd small; lcd %s; mget *" % out))
    assert len(os.listdir(out)) == small, "mget brought %d of %d" % (len(os.listdir(out)), small)
    smbclient(port, "del big.bin")
    return BIG / w / 1e6, BIG / r / 1e6, small / s, cpu, BIG / warm / 1e6


def main():
    if os.geteuid() != 0:
        sys.exit("bench-nfs-smb.py: needs root (mounts, a Unix user for SMB)")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # cleans up below
    subprocess.run([S, "down", "--data", WORK + "/c"], capture_output=True)
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    os.chmod(WORK, 0o711)  # smbd enters the shares as the SMB user
    made_user = False
    try:
        pwd.getpwnam(USER)
    except KeyError:
        sh("useradd", "--system", "-M", "-s", "/usr/sbin/nologin", USER)
        made_user = True
    uid = pwd.getpwnam(USER).pw_uid
    with open(WORK + "/users", "w") as f:
        f.write("%s %s\n" % (USER, PASSWORD))
    os.chmod(WORK + "/users", 0o600)
    rpc = None
    if not rpcbind_up():
        rpc = subprocess.Popen(["rpcbind", "-f"], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
        time.sleep(1)
    sh(S, "up", "--data", WORK + "/c", "--daemon", "--port", str(PORT), "--targets", "2")
    env = dict(os.environ, STOKER_CLUSTER=URL)
    try:
        blob = os.urandom(BIG)
        big_path = WORK + "/big.src"
        with open(big_path, "wb") as f:
            f.write(blob)
        # the same small files and owner on both sides: the cluster's through a mount
        mnt = WORK + "/m"
        os.makedirs(mnt)
        sh(S, "mount", URL, mnt, env=env)
        for base in (mnt + "/bench", WORK + "/local"):
            os.makedirs(base + "/small")
            for i in range(SMALL):
                with open("%s/small/%d" % (base, i), "wb") as f:
                    f.write(os.urandom(16384))
            for d in (base, base + "/small"):
                os.chown(d, uid, uid)
            for i in range(SMALL):
                os.chown("%s/small/%d" % (base, i), uid, uid)
        sh(S, "umount", mnt, env=env)
        buf = mmap.mmap(-1, BIG)  # the NFS client's read buffer, touched here once
        buf[:] = blob
        nfs = lambda p: nfs_round(p, blob, SMALL, buf)
        smb = lambda p: smb_round(p, big_path, SMALL)
        runs = [("mount", Mounted, lambda p: mount_round(p, blob, SMALL), 0),
                ("nfs stoker", nfs_gateway, nfs, NFS_PORT), ("nfs local", nfs_local, nfs, NFS_LOCAL),
                ("smb stoker", smb_gateway, smb, SMB_PORT), ("smb local", smb_local, smb, SMB_LOCAL)]
        if BEFORE:
            runs[2:2] = [("nfs before", lambda: nfs_gateway(BEFORE), nfs, NFS_PORT)]
            runs[5:5] = [("smb before", lambda: smb_gateway(BEFORE), smb, SMB_PORT)]
        rows = {r[0]: [] for r in runs}
        for r in range(ROUNDS):
            for name, start, measure, port in (runs if r % 2 == 0 else runs[::-1]):
                sh("sync")
                proc = start()
                try:
                    res = measure(port)
                finally:
                    stop(proc)
                rows[name].append(res)
                print("round %d %-10s write %5.0f MB/s  read %5.0f MB/s (warm %5.0f%s)  16 KiB "
                      "files %5.0f/s  read CPU s/GB: %s" % (
                          r + 1, name, res[0], res[1], res[4],
                          ", into new memory %.0f" % res[5] if len(res) > 5 else "", res[2],
                          ", ".join("%s %.2f" % kv for kv in sorted(res[3].items())
                                    if kv[1] >= 0.005)), flush=True)
        print()
        print("| protocol | measure | Stoker gateway |%s same server on local | ratio |%s" % (
            " before |" if BEFORE else "", " before ratio |" if BEFORE else ""))
        print("|---|---|---|---|---|%s" % ("---|---|" if BEFORE else ""))
        for proto in ("nfs", "smb"):
            for i, what in ((0, "write %d MiB (MB/s)" % (BIG >> 20)),
                            (1, "read %d MiB, cold (MB/s)" % (BIG >> 20)),
                            (4, "read it again, warm (MB/s)"),
                            (5, "read it cold into new memory (MB/s)"),
                            (2, "read 16 KiB files, cold (files/s)")):
                if i == 5 and proto != "nfs":
                    continue
                med = lambda k: statistics.median(x[i] for x in rows["%s %s" % (proto, k)])
                st, lo = med("stoker"), med("local")
                cells = [proto.upper(), what, "%.0f" % st]
                if BEFORE:
                    cells.append("%.0f" % med("before"))
                cells += ["%.0f" % lo, "%.2f" % (st / lo if lo else 0)]
                if BEFORE:
                    cells.append("%.2f" % (med("before") / lo if lo else 0))
                print("| " + " | ".join(cells) + " |")
        print()
        print("read cold, Stoker / local by round: " + "; ".join(
            "%s %s" % (proto.upper(), ", ".join(
                "%.2f" % (a[1] / b[1]) for a, b in zip(rows["%s stoker" % proto],
                                                       rows["%s local" % proto])))
            for proto in ("nfs", "smb")))
        if BEFORE:
            print("read cold, before / local by round: " + "; ".join(
                "%s %s" % (proto.upper(), ", ".join(
                    "%.2f" % (a[1] / b[1]) for a, b in zip(rows["%s before" % proto],
                                                           rows["%s local" % proto])))
                for proto in ("nfs", "smb")))
        for i, what in ((0, "write"), (1, "read, cold"), (4, "read, warm"), (2, "16 KiB files")):
            print("the mount itself, %s: %.0f" % (what, statistics.median(
                x[i] for x in rows["mount"])))
        print()
        print("CPU seconds per GB of the big read (medians):")
        for name in rows:
            parties = sorted({k for x in rows[name] for k in x[3]})
            print("  %-10s %s" % (name, ", ".join(
                "%s %.2f" % (k, statistics.median(x[3].get(k, 0.0) for x in rows[name]))
                for k in parties)))
    finally:
        subprocess.run([S, "umount", "-l", WORK + "/m"], capture_output=True)
        subprocess.run([S, "down", "--data", WORK + "/c"], capture_output=True)
        if rpc:
            stop(rpc)
        if made_user:
            subprocess.run(["userdel", USER], capture_output=True)


if __name__ == "__main__":
    main()
