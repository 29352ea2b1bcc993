"""The SMB gateway (`stoker gateway smb`): real Samba (smbd) over the gateway's own
Stoker mount, driven by real clients: `smbclient`, python3-smbc (libsmbclient) and
python3-impacket's SMB3 client (byte-range locks).

What a client sees is checked against the same files through a FUSE mount of the
cluster, and across protocols with the NFS gateway (test_nfs.py's helpers) and
`stoker cat`/`put` (libstoker).
"""
import errno
import hashlib
import os
import pwd
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time

import pytest

from conftest import STOKER, free_port, have_fuse, run, wait_until

pytestmark = [
    # One per machine: the SMB user these tests make and remove is the
    # machine's, so two modules at once would remove it under each other.
    pytest.mark.serial,
    pytest.mark.skipif(not have_fuse(), reason="needs root, /dev/fuse and fusermount3"),
    pytest.mark.skipif(not os.path.exists("/usr/sbin/smbd"), reason="needs samba"),
]

USER = "stksmbtest"  # an SMB user must be a Unix user: made for these tests if missing
PASSWORD = "pa ss-w0rd!"
MiB = 1 << 20


@pytest.fixture(scope="module")
def unix_user():
    made = False
    try:
        pw = pwd.getpwnam(USER)
    except KeyError:
        run(["useradd", "--system", "-M", "-s", "/usr/sbin/nologin", USER])
        made = True
        pw = pwd.getpwnam(USER)
    yield pw
    if made:
        run(["userdel", USER], check=False)


class Gateway:
    """A `stoker gateway smb` on a free port."""

    def __init__(self, cluster, tmp_path, extra=(), users=((USER, PASSWORD),), name="smb"):
        self.cluster = cluster
        self.port = free_port()
        # smbd enters the shares below the state folder as each client's user: not
        # below tmp_path, whose parents are 0700 (the gateway refuses such a folder).
        self.state = tempfile.mkdtemp(prefix="stoker-%s-" % name, dir="/tmp")
        os.chmod(self.state, 0o711)
        self.logfile = str(tmp_path / ("%s-gateway.log" % name))
        self.users = str(tmp_path / ("%s-users" % name))
        with open(self.users, "w") as f:
            f.write("# test users\n" + "".join("%s %s\n" % u for u in users))
        os.chmod(self.users, 0o600)
        self.args = [STOKER, "gateway", "smb", "--cluster", cluster.url, "--listen",
                     "127.0.0.1:%d" % self.port, "--state", self.state, "--users",
                     self.users] + list(extra)
        self.proc = None
        self.starts = 0

    def start(self):
        self.log_fd = open(self.logfile, "ab")
        self.proc = subprocess.Popen(self.args, stdout=self.log_fd, stderr=subprocess.STDOUT,
                                     env=self.cluster.env())
        deadline = time.time() + 60
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError("gateway exited %d:\n%s" % (self.proc.returncode, self.log()))
            if self.log().count("smb gateway: serving") > self.starts:
                self.starts += 1
                return self
            time.sleep(0.1)
        raise AssertionError("gateway did not serve:\n" + self.log())

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(60)
        with open("/proc/self/mountinfo") as f:
            assert not any(l.split()[4] == self.state + "/mnt" for l in f), \
                "the gateway left its mount behind"
        shutil.rmtree(self.state, ignore_errors=True)

    def log(self):
        try:
            with open(self.logfile, errors="replace") as f:
                return f.read()[-6000:]
        except OSError:
            return ""

    def smbclient(self, share, commands, user=USER, password=PASSWORD, extra=(), check=True):
        p = run(["smbclient", "-p", str(self.port), "-U", "%s%%%s" % (user, password)] +
                list(extra) + ["//127.0.0.1/" + share, "-c", commands], check=False, timeout=60)
        out = p.stdout.decode(errors="replace") + p.stderr.decode(errors="replace")
        if check:
            assert p.returncode == 0 and "NT_STATUS" not in out, out
        return p.returncode, out

    def smbc(self, user=USER, password=PASSWORD):
        import smbc
        ctx = smbc.Context(auth_fn=lambda srv, shr, wg, u, pw: ("WORKGROUP", user, password))
        ctx.optionNoAutoAnonymousLogin = True
        return ctx

    def url(self, share, path=""):
        return "smb://127.0.0.1:%d/%s%s" % (self.port, share, path)


@pytest.fixture
def make_gateway(tmp_path, unix_user):
    made = []

    def make(cluster, extra=(), name="smb", start=True, **kw):
        g = Gateway(cluster, tmp_path, extra, name=name, **kw)
        made.append(g)
        return g.start() if start else g

    yield make
    for g in made:
        g.stop()


@pytest.fixture
def share_dir(mount, unix_user):
    d = os.path.join(mount.path, "share")
    os.mkdir(d)
    os.chown(d, unix_user.pw_uid, unix_user.pw_gid)
    return d


def sha(b):
    return hashlib.sha256(b).hexdigest()


def test_smbclient_operations_match_the_mount(cluster, mount, share_dir, make_gateway, tmp_path,
                                              unix_user):
    g = make_gateway(cluster, ["--share", "data=/share"])
    src = tmp_path / "local.bin"
    data = os.urandom(5 * MiB + 333)  # six chunks of 1 MiB
    src.write_bytes(data)
    g.smbclient("data", "put %s big.bin; mkdir sub; rename big.bin sub/moved.bin; "
                "put %s gone.bin; del gone.bin" % (src, src))
    m = os.path.join(share_dir, "sub", "moved.bin")
    st = os.stat(m)
    assert (st.st_uid, st.st_gid) == (unix_user.pw_uid, unix_user.pw_gid)
    assert sha(open(m, "rb").read()) == sha(data)
    assert not os.path.exists(os.path.join(share_dir, "gone.bin"))
    # The other way: written through the mount, fetched over SMB.
    with open(os.path.join(share_dir, "from-mount"), "wb") as f:
        f.write(data[::-1])
    out = tmp_path / "fetched"
    g.smbclient("data", "get from-mount %s" % out)
    assert sha(out.read_bytes()) == sha(data[::-1])
    _, listing = g.smbclient("data", "ls")
    assert "from-mount" in listing and "sub" in listing and "gone.bin" not in listing


def test_python_smbc_operations(cluster, mount, share_dir, make_gateway, unix_user):
    import smbc
    g = make_gateway(cluster, ["--share", "data=/share"])
    ctx = g.smbc()
    f = ctx.open(g.url("data", "/py.txt"), os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    f.write(b"from python-smbc\n")
    f.close()
    ctx.mkdir(g.url("data", "/pdir"), 0o755)
    ctx.rename(g.url("data", "/py.txt"), g.url("data", "/pdir/py2.txt"))
    assert ctx.open(g.url("data", "/pdir/py2.txt")).read() == b"from python-smbc\n"
    names = {e.name for e in ctx.opendir(g.url("data", "/pdir")).getdents()} - {".", ".."}
    assert names == {"py2.txt"}
    st = ctx.stat(g.url("data", "/pdir/py2.txt"))
    assert st[6] == len(b"from python-smbc\n")  # st_size
    ctx.unlink(g.url("data", "/pdir/py2.txt"))
    ctx.rmdir(g.url("data", "/pdir"))
    assert os.listdir(share_dir) == []
    with pytest.raises(smbc.NoEntryError):
        ctx.stat(g.url("data", "/pdir"))


def test_wrong_password_and_unknown_user_refused(cluster, mount, share_dir, make_gateway):
    g = make_gateway(cluster, ["--share", "data=/share"])
    rc, out = g.smbclient("data", "ls", password="not-the-password", check=False)
    assert rc != 0 and "NT_STATUS_LOGON_FAILURE" in out
    rc, out = g.smbclient("data", "ls", user="nosuchuser", check=False)
    assert rc != 0 and "NT_STATUS_LOGON_FAILURE" in out
    rc, out = run(["smbclient", "-p", str(g.port), "-N", "//127.0.0.1/data", "-c", "ls"],
                  check=False).returncode, ""
    assert rc != 0  # no guest, no anonymous
    g.smbclient("data", "ls")


def test_read_only_share(cluster, mount, share_dir, make_gateway, tmp_path):
    with open(os.path.join(share_dir, "r.txt"), "wb") as f:
        f.write(b"readable")
    g = make_gateway(cluster, ["--share", "ro=/share:ro", "--share", "rw=/share"])
    out = tmp_path / "r.txt"
    g.smbclient("ro", "get r.txt %s" % out)
    assert out.read_bytes() == b"readable"
    rc, msg = g.smbclient("ro", "put %s new.txt" % out, check=False)
    assert "NT_STATUS_ACCESS_DENIED" in msg or "NT_STATUS_MEDIA_WRITE_PROTECTED" in msg, msg
    rc, msg = g.smbclient("ro", "del r.txt", check=False)
    assert "NT_STATUS" in msg
    assert sorted(os.listdir(share_dir)) == ["r.txt"]
    g.smbclient("rw", "put %s new.txt" % out)
    assert sorted(os.listdir(share_dir)) == ["new.txt", "r.txt"]


def negotiate_security_mode(port):
    """Sends one SMB2 NEGOTIATE (SMB 2.1 and 3.0 dialects) and returns the server's
    SecurityMode field: bit 0x2 is SMB2_NEGOTIATE_SIGNING_REQUIRED (MS-SMB2 2.2.4)."""
    dialects = struct.pack("<HH", 0x0210, 0x0300)
    body = struct.pack("<HHHHI16sQ", 36, 2, 1, 0, 0, b"stoker-test-guid", 0) + dialects
    hdr = b"\xfeSMB" + struct.pack("<HHIHHIIQIIQ16s", 64, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0,
                                   b"\0" * 16)
    msg = hdr + body
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(struct.pack(">I", len(msg)) + msg)
        need = struct.unpack(">I", s.recv(4))[0]
        buf = b""
        while len(buf) < need:
            chunk = s.recv(need - len(buf))
            assert chunk
            buf += chunk
    assert buf[:4] == b"\xfeSMB" and struct.unpack("<I", buf[8:12])[0] == 0  # STATUS_SUCCESS
    return struct.unpack("<H", buf[64 + 2:64 + 4])[0]


def test_signing_required_and_encryption(cluster, mount, share_dir, make_gateway):
    g = make_gateway(cluster, ["--share", "data=/share"])
    assert negotiate_security_mode(g.port) & 0x2, "signing is not required"
    g.smbclient("data", "ls", extra=["--client-protection=encrypt"])
    req = make_gateway(cluster, ["--share", "data=/share", "--encrypt", "required"], name="enc")
    assert negotiate_security_mode(req.port) & 0x2
    req.smbclient("data", "ls", extra=["--client-protection=encrypt"])
    # SMB 2.1 has no encryption: a client that cannot go beyond it is refused, while
    # the first gateway (encryption desired) lets it in.
    rc, out = req.smbclient("data", "ls", extra=["-m", "SMB2_10"], check=False)
    assert rc != 0 and "NT_STATUS_ACCESS_DENIED" in out, out
    g.smbclient("data", "ls", extra=["-m", "SMB2_10"])
    off = make_gateway(cluster, ["--share", "data=/share", "--encrypt", "off"], name="off")
    rc, out = off.smbclient("data", "ls", extra=["--client-protection=encrypt"], check=False)
    assert rc != 0, out


class Smb3:
    """An SMB3 session of impacket's client (python3-impacket) on one share: the one
    Debian client that sends SMB2 LOCK requests from a script."""

    def __init__(self, g, share, user=USER, password=PASSWORD):
        from impacket import smb3structs
        from impacket.smbconnection import SMBConnection
        # SMB 3.0: impacket 0.10 signs and encrypts it (AES-128-CCM) as Samba asks
        self.conn = SMBConnection("127.0.0.1", "127.0.0.1", sess_port=g.port,
                                  preferredDialect=smb3structs.SMB2_DIALECT_30)
        self.conn.login(user, password)
        self.tid = self.conn.connectTree(share)
        self.smb3 = self.conn.getSMBServer()

    def signed_and_encrypted(self):
        from impacket.smb3structs import SMB2_SESSION_FLAG_ENCRYPT_DATA
        session = self.smb3._Session
        return (self.conn.isSigningRequired(),
                bool(session["SessionFlags"] & SMB2_SESSION_FLAG_ENCRYPT_DATA) or
                session["TreeConnectTable"][self.tid]["EncryptData"] is True)

    def open(self, name):
        from impacket.smb3structs import FILE_READ_DATA, FILE_SHARE_READ, FILE_SHARE_WRITE, \
            FILE_WRITE_DATA
        return self.conn.openFile(self.tid, name, FILE_READ_DATA | FILE_WRITE_DATA,
                                  FILE_SHARE_READ | FILE_SHARE_WRITE)

    def lock(self, fid, offset, length, unlock=False):
        """One SMB2 LOCK of [offset, offset+length): exclusive and failing at once on a
        conflict (no blocking wait), or an unlock. Raises SessionError on refusal."""
        from impacket import smb3structs as s

        class Element(s.SMB2_LOCK_ELEMENT):
            # impacket 0.10's SMB3.lock() joins str() of each element, which is
            # bytes under Python 3: hand it the bytes as the latin-1 text it encodes
            def __str__(self):
                return self.getData().decode("latin-1")

        e = Element()
        e["Offset"], e["Length"] = offset, length
        e["Flags"] = s.SMB2_LOCKFLAG_UNLOCK if unlock else (
            s.SMB2_LOCKFLAG_EXCLUSIVE_LOCK | s.SMB2_LOCKFLAG_FAIL_IMMEDIATELY)
        return self.smb3.lock(self.tid, fid, [e])

    def close(self, fid):
        self.conn.closeFile(self.tid, fid)

    def logoff(self):
        self.conn.logoff()


def test_smb_byte_range_locks_and_mount_locks_see_each_other(cluster, mount, share_dir,
                                                             make_gateway):
    """smbd mirrors an SMB2 byte-range lock as a POSIX lock on its descriptor of the
    gateway's mount (`posix locking = yes`), which meta holds: another mount's fcntl
    locks conflict with it on that range and only there, both ways."""
    import fcntl
    from impacket.nt_errors import STATUS_FILE_LOCK_CONFLICT, STATUS_LOCK_NOT_GRANTED
    from impacket.smb3 import SessionError
    path = os.path.join(share_dir, "locked")
    with open(path, "wb") as f:
        f.write(b"x" * 1000)
    os.chmod(path, 0o666)
    g = make_gateway(cluster, ["--share", "data=/share"])  # signing required, encryption desired
    c = Smb3(g, "data")
    assert c.signed_and_encrypted() == (True, True)
    fd = os.open(path, os.O_RDWR)

    def mount_lock(length, start):
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, length, start)
        fcntl.lockf(fd, fcntl.LOCK_UN, length, start)

    def refused(length, start):
        with pytest.raises(OSError) as e:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, length, start)
        return e.value.errno in (errno.EAGAIN, errno.EACCES)

    try:
        fid = c.open("locked")
        # SMB holds [100, 150): the mount is refused on it and on any overlap
        c.lock(fid, 100, 50)
        assert refused(50, 100) and refused(10, 145) and refused(200, 0)
        mount_lock(50, 150)  # the ranges either side are free
        mount_lock(100, 0)
        c.lock(fid, 100, 50, unlock=True)
        mount_lock(50, 100)
        # The other way: the mount holds [300, 350); SMB's LOCK is not granted
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 50, 300)
        for off, length in ((300, 50), (340, 20)):
            with pytest.raises(SessionError) as e:
                c.lock(fid, off, length)
            assert e.value.get_error_code() in (STATUS_LOCK_NOT_GRANTED,
                                              STATUS_FILE_LOCK_CONFLICT), e.value
        c.lock(fid, 350, 50)  # outside it
        c.lock(fid, 350, 50, unlock=True)
        fcntl.lockf(fd, fcntl.LOCK_UN, 50, 300)
        c.lock(fid, 300, 50)
        assert refused(50, 300)
        # Closing the SMB handle drops its locks, as on Windows
        c.close(fid)
        mount_lock(50, 300)
        c.logoff()
    finally:
        os.close(fd)


def test_smbd_restarted_when_it_dies(cluster, mount, share_dir, make_gateway):
    g = make_gateway(cluster, ["--share", "data=/share"])
    with open(os.path.join(g.state, "smb", "run", "smbd.pid")) as f:
        pid = int(f.read().split()[0])
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: "serves again" in g.log(), 60, "smbd restarted")
    g.smbclient("data", "mkdir after-crash")
    assert os.path.isdir(os.path.join(share_dir, "after-crash"))


def test_bad_configuration_refused_clearly(cluster, tmp_path, unix_user):
    users = tmp_path / "users"
    users.write_text("%s %s\n" % (USER, PASSWORD))

    def gw(*args):
        p = run([STOKER, "gateway", "smb", "--cluster", cluster.url, "--state",
                 str(tmp_path / "bad-state")] + list(args), check=False, timeout=60,
                env=cluster.env())
        assert p.returncode != 0
        return p.stderr.decode()

    port = free_port()
    listen = ["--listen", "127.0.0.1:%d" % port]
    # tmp_path's parents are 0700: smbd could not enter the shares as the clients' users
    assert "is not searchable by other users" in gw("--users", str(users), *listen)
    assert "--share x=/no/such: No such file or directory" in gw("--share", "x=/no/such", *listen)
    assert "expected NAME=/DIR" in gw("--share", "bad name=/", *listen)
    assert "expected NAME=/DIR" in gw("--share", "global=/", *listen)
    assert "given twice" in gw("--share", "a=/", "--share", "A=/", *listen)
    assert "Samba is not installed" in gw("--smbd", "/nonexistent/smbd", *listen)
    assert "--encrypt maybe" in gw("--encrypt", "maybe", *listen)
    bad_users = tmp_path / "bad-users"
    bad_users.write_text("nosuchunixuser secret\n")
    assert "nosuchunixuser is not a user of this machine" in gw("--users", str(bad_users),
                                                                 *listen)
    s = socket.socket()
    s.bind(("127.0.0.1", port))
    s.listen(1)
    try:
        assert "port in use" in gw("--users", str(users), *listen)
    finally:
        s.close()
    with open("/proc/self/mountinfo") as f:
        assert str(tmp_path / "bad-state") not in f.read()


@pytest.mark.skipif(not os.path.exists("/usr/bin/ganesha.nfsd"), reason="needs nfs-ganesha")
def test_same_files_over_smb_nfs_mount_and_libstoker(cluster, mount, share_dir, make_gateway,
                                                     tmp_path, unix_user):
    """Close-to-open across protocols: each write, closed through one, is read whole by
    the next open through every other (SMB, NFS, the mount, libstoker and S3)."""
    from nfsclient import Nfs
    from test_s3 import AK as S3_AK, SK as S3_SK, Gateway as S3Gateway
    nport = free_port()
    nstate = str(tmp_path / "nfs-state")
    nfs = subprocess.Popen([STOKER, "gateway", "nfs", "--cluster", cluster.url, "--listen",
                            "127.0.0.1:%d" % nport, "--state", nstate, "--protocols", "4",
                            "--grace", "0"], stdout=subprocess.DEVNULL,
                           stderr=open(str(tmp_path / "nfs.log"), "wb"), env=cluster.env())
    try:
        wait_until(lambda: "serving" in open(str(tmp_path / "nfs.log")).read(), 60, "nfs")
        g = make_gateway(cluster, ["--share", "data=/share"])
        uid, gid = unix_user.pw_uid, unix_user.pw_gid
        local = tmp_path / "x"
        with Nfs("127.0.0.1", "/", nport, version=4, uid=uid, gid=gid) as n:
            for i in range(2):
                body = b"smb %d " % i * 500
                local.write_bytes(body)
                g.smbclient("data", "put %s x" % local)
                assert n.read_file("/share/x") == body
                assert open(os.path.join(share_dir, "x"), "rb").read() == body
                assert cluster.cli("cat", "/share/x").stdout == body
                body = b"nfs %d " % i * 500  # the same size: only the contents tell
                n.write_file("/share/x", body)
                g.smbclient("data", "get x %s" % local)
                assert local.read_bytes() == body
                with open(os.path.join(share_dir, "x"), "wb") as f:
                    f.write(b"mnt %d " % i * 500)
                g.smbclient("data", "get x %s" % local)
                assert local.read_bytes() == b"mnt %d " % i * 500
                assert n.read_file("/share/x") == b"mnt %d " % i * 500
            st = n.stat("/share/x")
            mst = os.stat(os.path.join(share_dir, "x"))
            assert (st.uid, st.gid, st.mode, st.size, st.mtime) == (
                mst.st_uid, mst.st_gid, mst.st_mode, mst.st_size, int(mst.st_mtime))
            # and S3: the bucket "share" is the same folder; its user acts as the SMB
            # user's uid and gid, so each protocol may replace what another wrote
            s3g = S3Gateway(cluster, tmp_path, keys_text="%s %s user=smbt uid=%d gid=%d "
                            "buckets=share:rw\n" % (S3_AK, S3_SK, uid, gid))
            try:
                s3 = s3g.client()
                get = lambda: s3.get_object(Bucket="share", Key="x")["Body"].read()
                for i in range(2):
                    body = b"s3: %d " % i * 600
                    s3.put_object(Bucket="share", Key="x", Body=body)
                    assert n.read_file("/share/x") == body
                    g.smbclient("data", "get x %s" % local)
                    assert local.read_bytes() == body
                    assert open(os.path.join(share_dir, "x"), "rb").read() == body
                    body = b"smb %d " % i * 600  # the same size: only the bytes tell
                    local.write_bytes(body)
                    g.smbclient("data", "put %s x" % local)
                    assert get() == body
                    body = b"nfs %d " % i * 600
                    n.write_file("/share/x", body)
                    assert get() == body
                head = s3.head_object(Bucket="share", Key="x")
                assert head["ContentLength"] == n.stat("/share/x").size == 600 * 6
                st, mst = n.stat("/share/x"), os.stat(os.path.join(share_dir, "x"))
                assert (st.uid, st.gid) == (mst.st_uid, mst.st_gid) == (uid, gid)
            finally:
                s3g.stop()
    finally:
        nfs.send_signal(signal.SIGTERM)
        nfs.wait(60)
