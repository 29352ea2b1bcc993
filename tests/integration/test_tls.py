"""TLS on Stoker's own transport (docs/security.md, "TLS"): `stoker up --tls`.

A cluster started with --tls serves the native client, Python and the mount, all
finding by themselves that it speaks TLS; every daemon port refuses plaintext (a
raw frame is answered TLS_REQUIRED and closed, a client without TLS fails with a
clear error) and counts it; a wrong key fails the handshake, counted too; the PSK
and its identity are what docs/security.md says (checked with `openssl s_client`
and a PSK derived here with Python's hmac, not Stoker's code); garbage, truncated
records and foreign handshakes on every port leave every daemon serving; and a
cluster of three storage nodes with three copies forwards its writes under TLS.
"""
import errno
import hashlib
import hmac
import os
import socket
import ssl
import subprocess
import urllib.request

import pytest

from conftest import (ROOT, STOKER, Cluster, Mount, have_fuse, pick_ports, run, wait_until)
from test_auth import OP_AUTH_HELLO, OP_MGMT_LEADER, closed, connect, frame, read_reply

ST_TLS_REQUIRED = 38
PYDIR = os.environ.get("STOKER_PYDIR") or os.path.join(ROOT, "build", "python")


class TlsCluster(Cluster):
    def start(self):
        p = run([STOKER, "up", "--data", self.data, "--daemon", "--port", str(self.port),
                 "--targets", str(self.targets), "--tls"], check=False, timeout=120)
        if p.returncode != 0:
            raise AssertionError("stoker up --tls failed: %s\n%s" % (p.stderr.decode(),
                                                                     self.logs()))
        return p


@pytest.fixture
def tls_cluster(tmp_path):
    c = TlsCluster(tmp_path / "stk", pick_ports())
    c.start()
    yield c
    c.stop()
    assert not c.sanitizer_reports(), c.logs()


def ports(c):
    return {"mgmtd": c.port, "meta": c.port + 1, "storage": c.port + 2}


def failures(port):
    text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % (port + 10),
                                  timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("stoker_auth_failures_total{"):
            reason = line.split('reason="', 1)[1].split('"', 1)[0]
            out[reason] = float(line.rsplit(" ", 1)[1])
    return out


def client_env(c, **extra):
    """A client's environment: the cluster's address and key, nothing about TLS (the
    client finds it in what `stoker up --tls` recorded)."""
    env = dict(os.environ, STOKER_CLUSTER=c.url, STOKER_KEY_FILE=c.key_file)
    env.pop("STOKER_TLS", None)
    env.update(extra)
    return env


def psk_of(key_file):
    """The PSK and identity docs/security.md describes, derived here: HKDF-SHA256
    (RFC 5869) with salt "stoker" and the labels as info."""
    with open(key_file) as f:
        key = bytes.fromhex(f.read().strip())
    prk = hmac.new(b"stoker", key, hashlib.sha256).digest()

    def expand(info, n):
        return hmac.new(prk, info + b"\x01", hashlib.sha256).digest()[:n]

    return expand(b"stoker-tls-1 psk", 32), "stoker-tls-1 " + expand(
        b"stoker-tls-1 identity", 8).hex()


def s_client(port, psk, identity):
    p = subprocess.run(["openssl", "s_client", "-connect", "127.0.0.1:%d" % port, "-tls1_3",
                        "-psk", psk.hex(), "-psk_identity", identity],
                       input=b"", capture_output=True, timeout=30)
    return p.stdout.decode(errors="replace") + p.stderr.decode(errors="replace")


def serves(c):
    """The cluster answers a TLS client: a listing of /."""
    return run([STOKER, "ls", "/"], env=client_env(c), check=False).returncode == 0


def test_tls_cluster_serves_every_client(tls_cluster, tmp_path):
    c = tls_cluster
    env = client_env(c)
    src = tmp_path / "in.bin"
    src.write_bytes(os.urandom((9 << 20) + 12345))
    run([STOKER, "put", str(src), "/a.bin"], env=env)
    run([STOKER, "get", "/a.bin", str(tmp_path / "out.bin")], env=env)
    assert (tmp_path / "out.bin").read_bytes() == src.read_bytes()

    # Python: writes a file, reads back the native client's
    code = ("import stoker, sys\n"
            "c = stoker.connect(%r)\n"
            "c.write_file('/py.bin', bytes(range(256)) * 40000)\n"
            "sys.stdout.buffer.write(c.read_file('/a.bin')[:4096])\n" % c.url)
    pyenv = dict(env, PYTHONPATH=PYDIR)
    p = run(["/usr/bin/python3", "-c", code], env=pyenv)
    assert p.stdout == src.read_bytes()[:4096]
    run([STOKER, "get", "/py.bin", str(tmp_path / "py.bin")], env=env)
    assert (tmp_path / "py.bin").read_bytes() == bytes(range(256)) * 40000

    # The mount (it is started without STOKER_TLS: it finds TLS as the others do)
    if have_fuse():
        m = Mount(c, tmp_path / "mnt")
        m.start()
        try:
            with open(os.path.join(m.path, "a.bin"), "rb") as f:
                assert f.read() == src.read_bytes()
            with open(os.path.join(m.path, "m.bin"), "wb") as f:
                f.write(b"through the mount " * 100000)
        finally:
            m.stop()
        assert not m.sanitizer_reports(), m.log()
        run([STOKER, "get", "/m.bin", str(tmp_path / "m.bin")], env=env)
        assert (tmp_path / "m.bin").read_bytes() == b"through the mount " * 100000

    # nobody was refused on the way, and the daemons really speak only TLS
    for role, port in ports(c).items():
        assert failures(port) == dict(failures(port), tls_plaintext=0, tls_handshake=0), role


@pytest.mark.parametrize("role", ["mgmtd", "meta", "storage"])
def test_plaintext_is_refused_on_every_port(tls_cluster, role):
    c = tls_cluster
    port = ports(c)[role]
    before = failures(port)

    # A raw frame: answered TLS_REQUIRED (so a client hears why), then closed.
    for op in (OP_AUTH_HELLO, OP_MGMT_LEADER):
        s = connect("127.0.0.1:%d" % port)
        s.sendall(frame(op, os.urandom(32) if op == OP_AUTH_HELLO else b""))
        r = read_reply(s)
        assert r is not None and r[0] == op and r[1] == ST_TLS_REQUIRED, r
        assert closed(s)
        s.close()
    after = failures(port)
    assert after["tls_plaintext"] == before["tls_plaintext"] + 2, (before, after)

    # The native client told not to use TLS: a clear error, not a hang or a crash.
    p = run([STOKER, "ls", "/"], env=client_env(c, STOKER_TLS="0", STOKER_RETRY_MS="500"),
            check=False, timeout=60)
    err = p.stderr.decode(errors="replace")
    assert p.returncode != 0
    assert "requires TLS" in err and "STOKER_TLS=1" in err, err
    # A bad STOKER_TLS is refused as such.
    p = run([STOKER, "ls", "/"], env=client_env(c, STOKER_TLS="yes"), check=False)
    assert p.returncode != 0 and "bad STOKER_TLS 'yes'" in p.stderr.decode(), p.stderr
    assert serves(c)
    with open(os.path.join(c.data, "log", "mgmtd.log" if role == "mgmtd" else
                           role + ".log")) as f:
        assert "requires TLS and the peer spoke plaintext" in f.read()


def test_wrong_key_fails_the_handshake(tls_cluster, tmp_path):
    c = tls_cluster
    other = str(tmp_path / "other.key")
    run([STOKER, "admin", "init", "--key", other])
    before = failures(c.port)

    p = run([STOKER, "ls", "/"], env=client_env(c, STOKER_KEY_FILE=other, STOKER_TLS="1",
                                                 STOKER_RETRY_MS="500"),
            check=False, timeout=60)
    err = p.stderr.decode(errors="replace")
    assert p.returncode != 0
    assert "TLS handshake with 127.0.0.1:%d failed" % c.port in err, err
    assert "another cluster key" in err, err
    after = failures(c.port)
    assert after["tls_handshake"] > before["tls_handshake"], (before, after)
    with open(os.path.join(c.data, "log", "mgmtd.log")) as f:
        assert "offered no key of this cluster" in f.read()

    # The PSK as documented, derived independently: openssl's own client gets in
    # with it, and not with the right identity and a PSK one bit off (the binder).
    psk, identity = psk_of(c.key_file)
    out = s_client(c.port, psk, identity)
    assert "Reused, TLSv1.3, Cipher is TLS_AES_128_GCM_SHA256" in out, out
    bad = bytes([psk[0] ^ 1]) + psk[1:]
    n = failures(c.port)["tls_handshake"]
    out = s_client(c.port, bad, identity)
    assert "Reused" not in out and "alert" in out, out
    wait_until(lambda: failures(c.port)["tls_handshake"] == n + 1, 10, "the failure counted")
    # another cluster's identity
    out = s_client(c.port, *psk_of(other))
    assert "Reused" not in out, out
    assert serves(c)


def client_hello():
    """A real TLS 1.3 ClientHello, from Python's ssl (no PSK: a stranger's)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(inc, out)
    with pytest.raises(ssl.SSLWantReadError):
        obj.do_handshake()
    return out.read()


@pytest.mark.parametrize("role", ["mgmtd", "meta", "storage"])
def test_garbage_and_truncated_records_leave_every_daemon_serving(tls_cluster, role):
    c = tls_cluster
    port = ports(c)[role]
    pids = c.pids()
    hello = client_hello()
    assert hello[0] == 0x16
    cases = [
        os.urandom(5000),  # garbage
        b"\x16\x03\x01\x40\x00" + os.urandom(100),  # a record announcing 16 KiB, cut
        b"\x16\x03\x01\xff\xff" + os.urandom(3000),  # a length over the limit
        b"\x16\x03\x01\x00\x05" + os.urandom(5),  # a handshake record of garbage
        b"\x17\x03\x03\x00\x20" + os.urandom(32),  # application data before a handshake
        hello[:len(hello) // 2],  # a ClientHello, truncated
        hello,  # a whole one, with no PSK of ours: refused
        b"",  # connect, then nothing
        b"\x16",  # one byte
    ]
    for data in cases:
        s = connect("127.0.0.1:%d" % port)
        if data:
            try:
                s.sendall(data)
            except (BrokenPipeError, ConnectionResetError):
                pass
        try:
            s.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # closed already: refused at once
        assert closed(s, timeout=10), data[:16]
        s.close()
    # a ClientHello left hanging: closed at the handshake deadline (5 s)
    s = connect("127.0.0.1:%d" % port)
    s.sendall(hello[:20])
    assert closed(s, timeout=15)
    s.close()
    assert c.pids() == pids
    assert serves(c)
    f = failures(port)
    assert f["tls_handshake"] >= 4 and f["tls_plaintext"] >= 1 and f["timeout"] >= 1, f


def test_replicated_cluster_forwards_writes_under_tls(tmp_path):
    port = pick_ports()
    data = str(tmp_path / "stk")
    env = dict(os.environ, STOKER_CLUSTER="stk://127.0.0.1:%d" % port)
    env.pop("STOKER_TLS", None)
    env.pop("STOKER_KEY_FILE", None)
    p = run([STOKER, "up", "--data", data, "--daemon", "--port", str(port), "--nodes", "3",
             "--targets", "2", "--tls"], check=False, timeout=180)
    try:
        assert p.returncode == 0, p.stderr.decode() + p.stdout.decode()
        src = tmp_path / "in.bin"
        src.write_bytes(os.urandom(24 << 20))
        run([STOKER, "put", str(src), "/big"], env=env)
        run([STOKER, "get", "/big", str(tmp_path / "out.bin")], env=env)
        assert (tmp_path / "out.bin").read_bytes() == src.read_bytes()
        # three copies: every node holds every chunk, forwarded head to tail
        held = []
        for i in range(3):
            held.append(sorted(f for _, _, fs in os.walk(os.path.join(data, "targets", str(i)))
                               for f in fs if ".tmp" not in f))
            assert held[i], "node %d holds no chunk" % i
        assert held[0] == held[1] == held[2], held
        # each node refuses plaintext: its peers' forwards came in over TLS
        for i in range(3):
            addr = "127.0.0.%d:%d" % (i + 2, port + 2)
            s = connect(addr)
            s.sendall(frame(OP_MGMT_LEADER))
            r = read_reply(s)
            assert r is not None and r[1] == ST_TLS_REQUIRED, (addr, r)
            s.close()
        for name in os.listdir(os.path.join(data, "log")):
            with open(os.path.join(data, "log", name), errors="replace") as f:
                text = f.read()
            assert "TLS handshake" not in text, (name, text[-3000:])
            assert "AddressSanitizer" not in text and "runtime error:" not in text, name
    finally:
        run([STOKER, "down", "--data", data], check=False, timeout=150)


def test_tls_needs_a_key_and_says_so(tmp_path):
    """A daemon asked for TLS without a key, or with a bad --tls, refuses to start."""
    p = run([STOKER, "mgmtd", "--listen", "127.0.0.1:%d" % pick_ports(), "--data",
             str(tmp_path / "m"), "--tls", "on"], check=False, timeout=30)
    assert p.returncode == 2 and "--tls on needs the cluster key" in p.stderr.decode(), \
        p.stderr
    p = run([STOKER, "mgmtd", "--listen", "127.0.0.1:%d" % pick_ports(), "--data",
             str(tmp_path / "m"), "--tls", "maybe"], check=False, timeout=30)
    assert p.returncode == 2 and "bad --tls 'maybe': on or off" in p.stderr.decode(), p.stderr


def client_psk_of(key_file):
    """A client key's PSK and identity as docs/security.md describes them, derived
    here from the key file's lines (HKDF-SHA256 of the client key)."""
    f = dict(l.split(" ", 1) for l in open(key_file).read().splitlines()
             if l and not l.startswith("#") and " " in l)
    ckey = bytes.fromhex(f["key"])
    prk = hmac.new(b"stoker", ckey, hashlib.sha256).digest()
    psk = hmac.new(prk, b"stoker-tls-1 client psk\x01", hashlib.sha256).digest()
    anon = f["anon"].split()
    ident = "stoker-tls-c1 %s %s %s %s %s %s" % (f["name"], f["gen"], f["flags"], anon[0],
                                                anon[1], f["subtree"])
    return psk, ident


def test_client_keys_work_over_tls(tls_cluster, tmp_path, request):
    """A client key's holder on a TLS cluster: its PSK identity names its policy, and
    every daemon confines it as without TLS, through the CLI (libstoker), Python and
    the mount; an edited identity or key file is refused, a removed key too."""
    c = tls_cluster
    env = client_env(c)
    src = tmp_path / "in.bin"
    src.write_bytes(os.urandom((3 << 20) + 777))
    run([STOKER, "mkdir", "/team", "/other"], env=env)
    run([STOKER, "put", str(src), "/other/secret.bin"], env=env)
    run([STOKER, "put", str(src), "/team/given.bin"], env=env)
    team = str(tmp_path / "team.key")
    ro = str(tmp_path / "ro.key")
    run([STOKER, "admin", "client", "add", "team", "--subtree", "/team", "--key-out", team],
        env=env)
    run([STOKER, "admin", "client", "add", "reader", "--read-only", "--key-out", ro], env=env)
    tenv = client_env(c, STOKER_KEY_FILE=team)
    renv = client_env(c, STOKER_KEY_FILE=ro)

    # libstoker (the CLI): inside its subtree it reads and writes; outside, nothing
    p = run([STOKER, "ls", "/"], env=tenv)
    assert p.stdout.split() == [b"given.bin"], p.stdout
    run([STOKER, "put", str(src), "/mine.bin"], env=tenv)
    run([STOKER, "get", "/given.bin", str(tmp_path / "g.bin")], env=tenv)
    assert (tmp_path / "g.bin").read_bytes() == src.read_bytes()
    for path in ("/../other/secret.bin", "/other/secret.bin"):
        p = run([STOKER, "get", path, str(tmp_path / "x.bin")], env=tenv, check=False)
        assert p.returncode != 0 and not (tmp_path / "x.bin").exists(), path
    run([STOKER, "get", "/team/mine.bin", str(tmp_path / "a.bin")], env=env)
    assert (tmp_path / "a.bin").read_bytes() == src.read_bytes()

    # read-only: reads everything, changes nothing
    p = run([STOKER, "ls", "/"], env=renv)
    assert sorted(p.stdout.split()) == [b"other", b"team"], p.stdout
    run([STOKER, "get", "/other/secret.bin", str(tmp_path / "r.bin")], env=renv)
    assert (tmp_path / "r.bin").read_bytes() == src.read_bytes()
    for args in (["put", str(src), "/ro.bin"], ["rm", "/team/given.bin"], ["mkdir", "/d"]):
        p = run([STOKER] + args, env=renv, check=False)
        assert p.returncode != 0 and b"read-only" in p.stderr.lower(), (args, p.stderr)

    # Python, with the subtree key
    code = ("import errno, stoker\n"
            "c = stoker.connect(%r)\n"
            "c.write_file('/py.bin', b'py' * 50000)\n"
            "print(sorted(c.listdir('/')))\n"
            "try:\n"
            "    c.read_file('/../other/secret.bin')\n"
            "    print('read')\n"
            "except OSError as e:\n"
            "    print('refused', e.errno)\n" % c.url)
    p = run(["/usr/bin/python3", "-c", code], env=dict(tenv, PYTHONPATH=PYDIR))
    out = p.stdout.decode().splitlines()
    assert out[0] == "['given.bin', 'mine.bin', 'py.bin']", out
    assert out[1].startswith("refused"), out
    run([STOKER, "get", "/team/py.bin", str(tmp_path / "py.bin")], env=env)
    assert (tmp_path / "py.bin").read_bytes() == b"py" * 50000

    # The mount with each key (it finds TLS in what `stoker up --tls` recorded)
    make_mount = request.getfixturevalue("make_mount") if have_fuse() else None
    m = make_mount(c, "mt", opts=["key=" + team]) if make_mount else None
    if m:
        assert sorted(os.listdir(m.path)) == ["given.bin", "mine.bin", "py.bin"]
        with open(os.path.join(m.path, "m.bin"), "wb") as f:
            f.write(b"mount " * 100000)
        with open(os.path.join(m.path, "given.bin"), "rb") as f:
            assert f.read() == src.read_bytes()
        run([STOKER, "get", "/team/m.bin", str(tmp_path / "m.bin")], env=env)
        assert (tmp_path / "m.bin").read_bytes() == b"mount " * 100000
        mr = make_mount(c, "mr", opts=["key=" + ro])
        with open(os.path.join(mr.path, "other", "secret.bin"), "rb") as f:
            assert f.read() == src.read_bytes()
        with pytest.raises(OSError) as e:
            open(os.path.join(mr.path, "new.bin"), "wb").close()
        assert e.value.errno == errno.EROFS

    # The identity and PSK are what docs/security.md says: openssl's own client gets
    # in with them; the same PSK under an edited identity (a wider subtree, read-write
    # for read-only) fails the binder
    psk, ident = client_psk_of(team)
    assert "Reused, TLSv1.3" in s_client(c.port + 1, psk, ident)
    for edited in (ident.replace(" /team", " /"), ident.replace("team 1", "team 2"),
                   ident.replace(" 0 65534", " 4 65534")):
        assert edited != ident
        assert "Reused, TLSv1.3" not in s_client(c.port + 1, psk, edited), edited
    rpsk, rident = client_psk_of(ro)
    assert " 1 65534 65534 /" in rident
    assert "Reused, TLSv1.3" not in s_client(c.port, rpsk, rident.replace(" 1 65534", " 0 65534"))
    # an edited key file: the client is refused with a clear line
    forged = tmp_path / "forged.key"
    forged.write_text(open(team).read().replace("subtree /team", "subtree /"))
    os.chmod(forged, 0o600)
    p = run([STOKER, "ls", "/"], env=client_env(c, STOKER_KEY_FILE=str(forged)), check=False)
    assert p.returncode != 0 and b"other" not in p.stdout
    assert b"refused this client key" in p.stderr, p.stderr
    before = {role: failures(port) for role, port in ports(c).items()}

    # Removed: refused at once by mgmtd, within a heartbeat by meta and storage, and
    # the mount's open connections are cut
    run([STOKER, "admin", "client", "rm", "team"], env=env)
    assert "Reused, TLSv1.3" not in s_client(c.port, psk, ident)
    for port in (c.port + 1, c.port + 2):
        wait_until(lambda: "Reused, TLSv1.3" not in s_client(port, psk, ident), 10,
                   "port %d to refuse the removed key" % port)
    p = run([STOKER, "ls", "/"], env=tenv, check=False)
    assert p.returncode != 0 and b"given.bin" not in p.stdout
    for role, port in ports(c).items():
        assert failures(port).get("revoked", 0) > before[role].get("revoked", 0), role

    def cut():
        try:
            os.listxattr(os.path.join(m.path, "given.bin"))
            return False
        except OSError as e:
            return e.errno in (errno.EKEYREJECTED, errno.EIO)
    if m:
        wait_until(cut, 30, "the removed key's mount to be cut off")
    # the others are still served
    assert serves(c)
    assert run([STOKER, "ls", "/"], env=renv).returncode == 0


