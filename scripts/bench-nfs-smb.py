#!/usr/bin/python3
"""NFS and SMB through Stoker's gateways against the same servers on the local file
system (docs/BENCHMARKS.md, issue 27), in one run on this machine.

For each round, in turn: `stoker gateway nfs` (Ganesha over the gateway's Stoker
mount of a one-machine cluster), the same Ganesha configuration serving a local
folder on the same disk, `stoker gateway smb` (smbd over its mount), and the same
smbd configuration serving the local folder. The local servers' configurations are
the gateways' own, with the mount's path, ports and state folders replaced, so the
servers differ only in what lies under them. Each is measured with a user-space
client, as this kernel has no NFS or SMB client:

  - NFS (NFSv3, libnfs through tests/integration/nfsclient.py, 1 MiB requests):
    write a BIG_MIB MiB file (fsync at the end), read it back, read SMALL files of
    16 KiB one after the other;
  - SMB (smbclient, SMB3): put the big file, get it, mget the small files.

Prints every round, then medians and the ratio Stoker / local for each.

    python3 scripts/bench-nfs-smb.py [WORK]   (BIG_MIB=2048 SMALL=2000 ROUNDS=3 PORT=10500)
Needs root, the build (make), nfs-ganesha, rpcbind, samba and smbclient.
"""
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
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
from nfsclient import Nfs  # noqa: E402

WORK = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "/var/tmp/stoker-bench-gw")
BIG = int(os.environ.get("BIG_MIB", "2048")) << 20
SMALL = int(os.environ.get("SMALL", "2000"))
ROUNDS = int(os.environ.get("ROUNDS", "3"))
PORT = int(os.environ.get("PORT", "10500"))
NFS_PORT, NFS_LOCAL, SMB_PORT, SMB_LOCAL = PORT + 40, PORT + 42, PORT + 44, PORT + 45
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


def nfs_gateway():
    p = subprocess.Popen([S, "gateway", "nfs", "--cluster", URL, "--listen",
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


def smb_gateway():
    p = subprocess.Popen([S, "gateway", "smb", "--cluster", URL, "--listen",
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


def nfs_round(port, blob, small):
    """(write MB/s, read MB/s, small files/s) over NFSv3 on port."""
    with Nfs("127.0.0.1", "/bench", port, version=3, mount_port=port + 1, uid=0, gid=0) as n:
        w = timed(lambda: n.write_file("/big.bin", blob))
        r = timed(lambda: n.read_file("/big.bin"))
        got = []
        s = timed(lambda: [got.append(len(n.read_file("/small/%d" % i))) for i in range(small)])
        assert sum(got) == small * 16384, "short small reads"
        n.unlink("/big.bin")
    return BIG / w / 1e6, BIG / r / 1e6, small / s


def smbclient(port, commands):
    return sh("smbclient", "-p", str(port), "-m", "SMB3", "-U", "%s%%%s" % (USER, PASSWORD),
              "//127.0.0.1/bench", "-c", commands)


def smb_round(port, big_path, small):
    """(write MB/s, read MB/s, small files/s) with smbclient on port."""
    out = WORK + "/smb-out"
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    w = timed(lambda: smbclient(port, "put %s big.bin" % big_path))
    r = timed(lambda: smbclient(port, "get big.bin /dev/null"))
    s = timed(lambda: smbclient(port, "prompt off; cd small; lcd %s; mget *" % out))
    assert len(os.listdir(out)) == small, "mget brought %d of %d" % (len(os.listdir(out)), small)
    smbclient(port, "del big.bin")
    return BIG / w / 1e6, BIG / r / 1e6, small / s


def main():
    if os.geteuid() != 0:
        sys.exit("bench-nfs-smb.py: needs root (mounts, a Unix user for SMB)")
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
        rows = {k: [] for k in ("nfs stoker", "nfs local", "smb stoker", "smb local")}
        for r in range(ROUNDS):
            for name, start, measure, port in (
                    ("nfs stoker", nfs_gateway, lambda p: nfs_round(p, blob, SMALL), NFS_PORT),
                    ("nfs local", nfs_local, lambda p: nfs_round(p, blob, SMALL), NFS_LOCAL),
                    ("smb stoker", smb_gateway, lambda p: smb_round(p, big_path, SMALL),
                     SMB_PORT),
                    ("smb local", smb_local, lambda p: smb_round(p, big_path, SMALL),
                     SMB_LOCAL)):
                sh("sync")
                proc = start()
                try:
                    res = measure(port)
                finally:
                    stop(proc)
                rows[name].append(res)
                print("round %d %-10s write %7.0f MB/s  read %7.0f MB/s  16 KiB files %7.0f/s"
                      % (r + 1, name, *res), flush=True)
        print()
        print("| protocol | measure | Stoker gateway | same server on local | ratio |")
        print("|---|---|---|---|---|")
        for proto in ("nfs", "smb"):
            for i, what in enumerate(("write %d MiB (MB/s)" % (BIG >> 20),
                                      "read %d MiB (MB/s)" % (BIG >> 20),
                                      "read 16 KiB files (files/s)")):
                st = statistics.median(x[i] for x in rows[proto + " stoker"])
                lo = statistics.median(x[i] for x in rows[proto + " local"])
                print("| %s | %s | %.0f | %.0f | %.2f |" % (proto.upper(), what, st, lo,
                                                          st / lo if lo else 0))
    finally:
        subprocess.run([S, "umount", "-l", WORK + "/m"], capture_output=True)
        subprocess.run([S, "down", "--data", WORK + "/c"], capture_output=True)
        if rpc:
            stop(rpc)
        if made_user:
            subprocess.run(["userdel", USER], capture_output=True)


if __name__ == "__main__":
    main()
