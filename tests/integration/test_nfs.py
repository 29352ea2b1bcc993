"""The NFS gateway (`stoker gateway nfs`): real NFS-Ganesha over the gateway's own
Stoker mount, driven by real clients in user space (this kernel has no NFS client):
Debian's libnfs through a small ctypes client (nfsclient.py) and libnfs-utils'
nfs-ls, nfs-cp and nfs-cat, over NFSv3 and NFSv4.0 (what libnfs speaks).

What a client sees is checked against the same files through a FUSE mount of the
cluster and through `stoker cat`/`put` (libstoker): contents, owners, modes, links.
"""
import errno
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import pytest

from conftest import STOKER, free_port, have_fuse, run, wait_until
from nfsclient import Nfs

pytestmark = [
    # One per machine: NFSv3 registers with the machine's one rpcbind (started and
    # stopped by this module), so two modules at once would take each other's
    # registrations and rpcbind away.
    pytest.mark.serial,
    pytest.mark.skipif(not have_fuse(), reason="needs root, /dev/fuse and fusermount3"),
    pytest.mark.skipif(not os.path.exists("/usr/bin/ganesha.nfsd"), reason="needs nfs-ganesha"),
]

MiB = 1 << 20
USER = 1000  # the uid and gid tests act as over NFS (root is squashed)


def rpcbind_up():
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect("/run/rpcbind.sock")
        return True
    except OSError:
        return False
    finally:
        s.close()


@pytest.fixture(scope="module")
def rpcbind():
    """NFSv3 needs rpcbind (Ganesha registers there); started for these tests when the
    machine runs none, and stopped after them."""
    if rpcbind_up():
        yield
        return
    if not shutil.which("rpcbind"):
        pytest.skip("needs rpcbind for NFSv3")
    p = subprocess.Popen(["rpcbind", "-f"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_until(rpcbind_up, 10, "rpcbind")
    yield
    p.terminate()
    p.wait(10)


class Gateway:
    """A `stoker gateway nfs` on free ports (NFS on port, MOUNT on port + 1)."""

    def __init__(self, cluster, tmp_path, extra=(), name="nfs"):
        self.cluster = cluster
        self.port = free_port()
        self.mount_port = self.port + 1
        self.state = str(tmp_path / ("%s-state" % name))
        self.logfile = str(tmp_path / ("%s-gateway.log" % name))
        self.args = [STOKER, "gateway", "nfs", "--cluster", cluster.url, "--listen",
                     "127.0.0.1:%d" % self.port, "--state", self.state, "--grace", "0"] + \
            list(extra)
        self.proc = None

    def start(self):
        self.log_fd = open(self.logfile, "ab")
        self.proc = subprocess.Popen(self.args, stdout=self.log_fd, stderr=subprocess.STDOUT,
                                     env=self.cluster.env())
        deadline = time.time() + 60
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError("gateway exited %d:\n%s" % (self.proc.returncode, self.log()))
            if self.log().count("nfs gateway: serving") > self.starts:
                self.starts += 1
                return self
            time.sleep(0.1)
        raise AssertionError("gateway did not serve:\n" + self.log())

    starts = 0

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(60)
        assert not self.mounted(), "the gateway left its mount behind"

    def mounted(self):
        with open("/proc/self/mountinfo") as f:
            return any(l.split()[4] == self.state + "/mnt" for l in f)

    def log(self):
        try:
            with open(self.logfile, errors="replace") as f:
                return f.read()[-6000:]
        except OSError:
            return ""

    def ganesha_pid(self):
        with open(os.path.join(self.state, "ganesha.pid")) as f:
            return int(f.read().split()[0])

    def client(self, version, uid=USER, gid=USER, export="/"):
        return Nfs("127.0.0.1", export, self.port, version=version,
                   mount_port=self.mount_port if version == 3 else None, uid=uid, gid=gid)

    def url(self, path, version, uid=USER):
        extra = "&mountport=%d" % self.mount_port if version == 3 else ""
        return "nfs://127.0.0.1%s?nfsport=%d&version=%d&uid=%d&gid=%d%s" % (
            path, self.port, version, uid, uid, extra)


@pytest.fixture
def make_gateway(tmp_path, rpcbind):
    made = []

    def make(cluster, extra=(), name="nfs", start=True):
        g = Gateway(cluster, tmp_path, extra, name)
        made.append(g)
        return g.start() if start else g

    yield make
    for g in made:
        g.stop()


@pytest.fixture
def shared(mount):
    """A folder owned by USER in the cluster, made through the mount."""
    d = os.path.join(mount.path, "shared")
    os.mkdir(d)
    os.chown(d, USER, USER)
    return d


def sha(b):
    return hashlib.sha256(b).hexdigest()


@pytest.mark.parametrize("version", [3, 4])
def test_basic_operations_match_the_mount(cluster, mount, shared, make_gateway, version):
    g = make_gateway(cluster)
    with g.client(version) as n:
        n.write_file("/shared/a.txt", b"written over nfs\n", mode=0o640)
        assert n.read_file("/shared/a.txt") == b"written over nfs\n"
        n.mkdir("/shared/sub")
        n.rename("/shared/a.txt", "/shared/sub/b.txt")
        n.symlink("sub/b.txt", "/shared/link")
        n.link("/shared/sub/b.txt", "/shared/hard")
        n.chmod("/shared/sub/b.txt", 0o604)
        n.write_file("/shared/gone", b"x")
        n.unlink("/shared/gone")
        n.write_file("/shared/trunc", b"0123456789")
        n.truncate("/shared/trunc", 4)
        assert sorted(n.listdir("/shared")) == ["hard", "link", "sub", "trunc"]
        assert n.readlink("/shared/link") == "sub/b.txt"
        st = n.stat("/shared/sub/b.txt")
        assert st.nlink == 2 and st.uid == USER and st.gid == USER
        assert st.mode & 0o7777 == 0o604
        assert n.stat("/shared/hard").ino == st.ino
        with pytest.raises(OSError) as e:
            n.stat("/shared/gone")
        assert e.value.errno == errno.ENOENT
    # The same files, through the FUSE mount of the same cluster.
    m = os.path.join(shared, "sub", "b.txt")
    mst = os.stat(m)
    assert open(m, "rb").read() == b"written over nfs\n"
    assert (mst.st_uid, mst.st_gid, mst.st_mode & 0o7777, mst.st_nlink) == (USER, USER, 0o604, 2)
    assert mst.st_ino == st.ino
    assert os.readlink(os.path.join(shared, "link")) == "sub/b.txt"
    assert os.path.samefile(os.path.join(shared, "hard"), m)
    assert open(os.path.join(shared, "trunc"), "rb").read() == b"0123"
    assert not os.path.exists(os.path.join(shared, "gone"))
    assert int(mst.st_mtime) == st.mtime


def test_libnfs_utils_and_libstoker(cluster, mount, shared, make_gateway, tmp_path):
    g = make_gateway(cluster)
    src = tmp_path / "src.bin"
    data = os.urandom(300000)
    src.write_bytes(data)
    run(["nfs-cp", str(src), g.url("/shared/cp.bin", 3)])
    assert cluster.cli("cat", "/shared/cp.bin").stdout == data
    cluster.cli("put", str(src), "/shared/put.bin")
    assert run(["nfs-cat", g.url("/shared/put.bin", 4)]).stdout == data
    out = run(["nfs-ls", g.url("/shared", 4)]).stdout.decode()
    assert "cp.bin" in out and "put.bin" in out


@pytest.mark.parametrize("version", [3, 4])
def test_large_file_across_chunks_both_ways(cluster, mount, shared, make_gateway, version):
    g = make_gateway(cluster)
    data = os.urandom(24 * MiB + 12345)  # 25 chunks of 1 MiB, the last one partial
    # libnfs writes NFSv4 in 3000-byte pieces (nfsclient.py): a smaller file there.
    wdata = data if version == 3 else data[:3 * MiB + 777]
    with g.client(version) as n:
        n.write_file("/shared/big-nfs", wdata)
        with open(os.path.join(shared, "big-nfs"), "rb") as f:
            assert sha(f.read()) == sha(wdata)
        with open(os.path.join(shared, "big-mount"), "wb") as f:
            f.write(data[::-1])
        assert sha(n.read_file("/shared/big-mount")) == sha(data[::-1])
        # into a buffer of the client's own, as scripts/bench-nfs-smb.py reads
        buf = bytearray(len(data) + 4096)
        assert n.read_into("/shared/big-mount", buf) == len(data)
        assert sha(bytes(buf[:len(data)])) == sha(data[::-1])


@pytest.mark.parametrize("version", [3, 4])
def test_close_to_open_across_protocols(cluster, mount, shared, make_gateway, version):
    """A file closed through one client is seen whole at the next open through any other,
    also when its size stays the same (Ganesha keeps descriptors open on the mount)."""
    g = make_gateway(cluster)
    path = os.path.join(shared, "cto")
    with open(path, "wb"):
        pass
    os.chown(path, USER, USER)
    with g.client(version) as n:
        for i in range(3):
            body = (b"round %d " % i) * 1000
            with open(path, "wb") as f:
                f.write(body)
            assert n.read_file("/shared/cto") == body
            body = (b"nfs-w %d " % i) * 1000
            n.write_file("/shared/cto", body)
            with open(path, "rb") as f:
                assert f.read() == body


def test_readdir_of_many_entries(cluster, mount, shared, make_gateway):
    g = make_gateway(cluster)
    d = os.path.join(shared, "many")
    os.mkdir(d)
    names = {"f%05d" % i for i in range(10000)}
    for name in names:
        os.close(os.open(os.path.join(d, name), os.O_CREAT | os.O_WRONLY, 0o644))
    for version in (3, 4):
        with g.client(version) as n:
            got = n.listdir("/shared/many")
        assert len(got) == len(names) and set(got) == names


def test_handles_survive_a_gateway_restart(cluster, mount, shared, make_gateway):
    """A file an NFSv3 client holds open stays readable and writable through its handle
    after the whole gateway stopped (Ganesha gone, mount unmounted) and started again."""
    g = make_gateway(cluster)
    with open(os.path.join(shared, "held"), "wb") as f:
        f.write(b"before restart")
    os.makedirs(os.path.join(shared, "deep", "er"))
    for p in ("held", "deep", "deep/er"):
        os.chown(os.path.join(shared, p), USER, USER)
    with g.client(3) as n:
        fh = n.open("/shared/held", os.O_RDWR)
        assert n.pread(fh, 0, 100) == b"before restart"
        dh = n.open("/shared/deep/er/x", os.O_RDWR | os.O_CREAT, 0o644)
        g.stop()
        assert not g.mounted()
        g.start()
        assert n.pread(fh, 0, 100) == b"before restart"
        n.pwrite(fh, 0, b"AFTER")
        n.pwrite(dh, 0, b"in a folder the new mount never looked up")
        n.fclose(fh)
        n.fclose(dh)
    assert open(os.path.join(shared, "held"), "rb").read() == b"AFTERe restart"
    assert open(os.path.join(shared, "deep", "er", "x"), "rb").read() == \
        b"in a folder the new mount never looked up"


def test_ganesha_restarted_when_it_dies(cluster, mount, shared, make_gateway):
    g = make_gateway(cluster)
    first = g.ganesha_pid()
    os.kill(first, signal.SIGKILL)
    wait_until(lambda: "serves again" in g.log(), 60, "ganesha restarted")
    assert g.ganesha_pid() != first
    with g.client(4) as n:
        n.write_file("/shared/after-crash", b"ok")
    assert open(os.path.join(shared, "after-crash"), "rb").read() == b"ok"


def test_root_squash_by_default_and_anonymous_ids(cluster, mount, shared, make_gateway):
    os.chmod(shared, 0o777)
    os.mkdir(os.path.join(mount.path, "rootonly"))
    g = make_gateway(cluster, ["--anon-uid", "4321", "--anon-gid", "4322"])
    with g.client(3, uid=0, gid=0) as n:
        n.write_file("/shared/by-root", b"squashed")
        with pytest.raises(OSError) as e:
            n.write_file("/rootonly/x", b"no")
        assert e.value.errno == errno.EACCES
    st = os.stat(os.path.join(shared, "by-root"))
    assert (st.st_uid, st.st_gid) == (4321, 4322)
    assert not os.path.exists(os.path.join(mount.path, "rootonly", "x"))


def test_no_root_squash(cluster, mount, make_gateway):
    os.mkdir(os.path.join(mount.path, "rootonly"))
    g = make_gateway(cluster, ["--no-root-squash"])
    with g.client(4, uid=0, gid=0) as n:
        n.write_file("/rootonly/x", b"root may")
    st = os.stat(os.path.join(mount.path, "rootonly", "x"))
    assert (st.st_uid, st.st_gid) == (0, 0)


@pytest.mark.parametrize("version", [3, 4])
def test_read_only_export_refuses_writes(cluster, mount, shared, make_gateway, version):
    with open(os.path.join(shared, "r"), "wb") as f:
        f.write(b"readable")
    g = make_gateway(cluster, ["--ro"])
    with g.client(version) as n:
        assert n.read_file("/shared/r") == b"readable"
        for op in (lambda: n.write_file("/shared/new", b"x"), lambda: n.mkdir("/shared/d"),
                   lambda: n.unlink("/shared/r"), lambda: n.chmod("/shared/r", 0o600)):
            with pytest.raises(OSError) as e:
                op()
            assert e.value.errno in (errno.EROFS, errno.EACCES), e.value
    assert sorted(os.listdir(shared)) == ["r"]
    assert os.stat(os.path.join(shared, "r")).st_mode & 0o777 == 0o644


def test_export_of_a_folder(cluster, mount, shared, make_gateway):
    os.makedirs(os.path.join(shared, "proj", "data"))
    os.chown(os.path.join(shared, "proj"), USER, USER)
    g = make_gateway(cluster, ["--export", "/shared/proj"])
    with g.client(3, export="/shared/proj") as n:
        assert n.listdir("/") == ["data"]
        n.write_file("/in-proj", b"p")
    assert open(os.path.join(shared, "proj", "in-proj"), "rb").read() == b"p"


@pytest.mark.parametrize("version", [3, 4])
def test_client_address_not_allowed(cluster, mount, shared, make_gateway, version):
    g = make_gateway(cluster, ["--clients", "10.99.0.0/16, 192.0.2.7"], name="deny")
    with pytest.raises(OSError):
        with g.client(version) as n:
            n.write_file("/shared/should-not", b"x")
    assert not os.path.exists(os.path.join(shared, "should-not"))
    ok = make_gateway(cluster, ["--clients", "127.0.0.1", "--ro"], name="allow")
    with ok.client(version) as n:
        n.listdir("/shared")
        with pytest.raises(OSError):
            n.write_file("/shared/ro", b"x")


def test_bad_configuration_refused_clearly(cluster, tmp_path, rpcbind):
    def gw(*args):
        p = run([STOKER, "gateway", "nfs", "--cluster", cluster.url, "--state",
                 str(tmp_path / "bad-state")] + list(args), check=False, timeout=60,
                env=cluster.env())
        assert p.returncode != 0
        return p.stderr.decode()

    port = free_port()
    listen = ["--listen", "127.0.0.1:%d" % port]
    assert "--export /no/such: No such file or directory" in gw("--export", "/no/such", *listen)
    assert "expected an absolute path" in gw("--export", "rel", *listen)
    assert "NFS-Ganesha is not installed" in gw("--ganesha", "/nonexistent/ganesha", *listen)
    assert "--clients" in gw("--clients", "a;b", *listen)
    assert "--protocols 5" in gw("--protocols", "5", *listen)
    assert "--listen nope" in gw("--listen", "nope")
    s = socket.socket()
    s.bind(("127.0.0.1", port))
    s.listen(1)
    try:
        assert "port in use" in gw(*listen)
    finally:
        s.close()
    assert not os.path.exists(str(tmp_path / "bad-state" / "ganesha.conf"))
    with open("/proc/self/mountinfo") as f:
        assert str(tmp_path / "bad-state") not in f.read()


def test_two_gateways_on_one_state_folder(cluster, make_gateway):
    g = make_gateway(cluster)
    p = run(g.args[:6] + ["127.0.0.1:%d" % free_port()] + g.args[7:], check=False,
            env=cluster.env(), timeout=60)
    assert p.returncode != 0
    assert b"in use by another running gateway" in p.stderr
    with g.client(4, uid=0, gid=0) as n:
        n.listdir("/")


def test_nfsv4_locks_and_mount_locks_see_each_other(cluster, mount, shared, make_gateway):
    """Ganesha takes an NFSv4 byte-range lock as a POSIX lock on its descriptor of the
    mount, which meta holds: another mount's fcntl locks conflict with it, both ways."""
    import fcntl
    path = os.path.join(shared, "locked")
    with open(path, "wb") as f:
        f.write(b"x" * 100)
    os.chown(path, USER, USER)
    g = make_gateway(cluster)
    fd = os.open(path, os.O_RDWR)
    try:
        with g.client(4) as n:
            fh = n.open("/shared/locked", os.O_WRONLY | os.O_TRUNC)
            n.lockf(fh, n.F_TLOCK)
            with pytest.raises(BlockingIOError):
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            n.lockf(fh, n.F_ULOCK)
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            with pytest.raises(OSError):
                n.lockf(fh, n.F_TLOCK)
            fcntl.lockf(fd, fcntl.LOCK_UN)
            n.lockf(fh, n.F_TLOCK)
            # No CLOSE: libnfs 4.0 counts the denied LOCK's seqid wrong and Ganesha
            # rightly refuses its CLOSE (BAD_SEQID); the session's end drops the lock.
    finally:
        os.close(fd)


def urllib_get(url):
    import urllib.request
    return urllib.request.urlopen(url, timeout=10).read()


def test_metrics_count_what_clients_did(cluster, mount, shared, make_gateway):
    mport = free_port()
    g = make_gateway(cluster, ["--metrics", "127.0.0.1:%d" % mport])
    with g.client(3) as n:
        n.write_file("/shared/m", b"z" * 300000)
        assert n.read_file("/shared/m") == b"z" * 300000
    text = urllib_get("http://127.0.0.1:%d/metrics" % mport).decode()
    written = ops = 0
    for line in text.splitlines():
        if line.startswith("stoker_client_write_bytes_total"):
            written += float(line.split()[-1])
        if line.startswith('stoker_client_ops_total{frontend="fuse",op="write"}'):
            ops += float(line.split()[-1])
    assert written >= 300000 and ops > 0, text[:3000]
    top = run([STOKER, "top", "--cluster", cluster.url, "--mount", "127.0.0.1:%d" % mport,
               "--once", "--interval", "0.5"], env=cluster.env(), timeout=60)
    assert ("127.0.0.1:%d" % mport).encode() in top.stdout, top.stdout


def test_up_starts_and_stops_the_gateways(rpcbind):
    data = tempfile.mkdtemp(prefix="stoker-up-gw-", dir="/tmp")  # searchable: smbd enters it
    os.chmod(data, 0o711)
    base = free_port()
    nfs_port, smb_port = free_port(), free_port()
    try:
        p = run([STOKER, "up", "--data", data, "--daemon", "--port", str(base), "--targets", "1",
                 "--nfs", str(nfs_port), "--smb", str(smb_port)], timeout=120)
        assert b"NFS on 127.0.0.1:%d" % nfs_port in p.stdout
        for kind in ("nfs", "smb"):
            log = os.path.join(data, "log", kind + ".log")
            wait_until(lambda: os.path.exists(log) and
                       (b"%s gateway: serving" % kind.encode()) in open(log, "rb").read(),
                       60, kind + " gateway")
        with Nfs("127.0.0.1", "/", nfs_port, version=4, uid=0, gid=0) as n:
            assert n.listdir("/") == []
        r = run(["smbclient", "-p", str(smb_port), "-N", "//127.0.0.1/stoker", "-c", "ls"],
                check=False)
        assert b"NT_STATUS" in r.stdout + r.stderr  # it answers, and wants a user
        assert b"stoker_client_ops_total" in urllib_get("http://127.0.0.1:%d/metrics" % (base + 15))
    finally:
        run([STOKER, "down", "--data", data], check=False, timeout=150)
    with open("/proc/self/mountinfo") as f:
        assert data not in f.read()
    shutil.rmtree(data, ignore_errors=True)
