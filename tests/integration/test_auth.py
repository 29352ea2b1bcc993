"""The cluster key (docs/security.md): every connection to mgmtd, meta and storage
proves it holds the key before anything is served, and the daemon proves it too.

Raw-socket tests on every daemon port of a `stoker up` cluster: no handshake, a
wrong key, a replayed handshake, a request before the handshake, a handshake never
finished: refused (answered AUTH where the request was small, then closed), counted
in stoker_auth_failures_total, and the daemon keeps serving everyone else. The
frames are built here from wire.h's layout, not with Stoker's code.
"""
import hashlib
import hmac
import os
import secrets
import socket
import struct
import subprocess
import time
import urllib.request

import pytest

from conftest import STOKER, free_port, run

# TLS (test_tls.py) replaces this handshake, and these tests speak it in plaintext
pytestmark = pytest.mark.plaintext_wire

MAGIC = 0x314B5453


def wire_version():
    """STK_WIRE_VERSION, from the header the daemons were built with."""
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "..", "..", "src", "proto", "wire.h")) as f:
        for line in f:
            if line.startswith("#define STK_WIRE_VERSION "):
                return int(line.split()[2])
    raise AssertionError("STK_WIRE_VERSION not found in src/proto/wire.h")


VERSION = wire_version()
HDR = struct.Struct("<IHHIIQIIII")
OP_MGMT_LEADER, OP_AUTH_HELLO, OP_AUTH_PROOF = 4, 96, 97
ST_OK, ST_NOSYS, ST_AUTH = 0, 27, 36
REPLY = 0x1


def _crc32c_table():
    t = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        t.append(c)
    return t


CRC_T = _crc32c_table()


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = CRC_T[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def frame(opcode, payload=b"", req_id=1):
    return HDR.pack(MAGIC, VERSION, opcode, 0, 0, req_id, len(payload), 0, crc32c(payload),
                    0) + payload


def recv_exact(s, n):
    buf = b""
    while len(buf) < n:
        got = s.recv(n - len(buf))
        if not got:
            return None
        buf += got
    return buf


def read_reply(s):
    """(opcode, status, payload), or None when the server closed the connection."""
    try:
        h = recv_exact(s, HDR.size)
    except ConnectionResetError:
        return None
    if h is None:
        return None
    magic, ver, op, flags, status, rid, plen, blen, crc, origin = HDR.unpack(h)
    assert magic == MAGIC and flags & REPLY
    payload = recv_exact(s, plen) if plen else b""
    return op, status, payload


def closed(s, timeout=3):
    """True when the server closes s within timeout seconds."""
    s.settimeout(timeout)
    try:
        while True:
            if not s.recv(4096):
                return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def mac(key, side, nc, ns):
    return hmac.new(key, b"stoker-auth-1 " + side + nc + ns, hashlib.sha256).digest()


def connect(addr):
    host, port = addr.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=10)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def hello(s, nc=None):
    """Sends AUTH_HELLO; returns (nc, ns, server mac)."""
    nc = nc or secrets.token_bytes(32)
    s.sendall(frame(OP_AUTH_HELLO, nc))
    op, status, payload = read_reply(s)
    assert (op, status, len(payload)) == (OP_AUTH_HELLO, ST_OK, 64)
    return nc, payload[:32], payload[32:]


def read_key(cluster):
    with open(cluster.key_file) as f:
        return bytes.fromhex(f.read().strip())


def failures(cluster, port):
    text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % (port + 10),
                                  timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("stoker_auth_failures_total{"):
            reason = line.split('reason="', 1)[1].split('"', 1)[0]
            out[reason] = float(line.rsplit(" ", 1)[1])
    return out


def ports(cluster):
    return {"mgmtd": cluster.port, "meta": cluster.port + 1, "storage": cluster.port + 2}


@pytest.mark.parametrize("role", ["mgmtd", "meta", "storage"])
def test_every_port_refuses_what_does_not_prove_the_key(cluster, role):
    port = ports(cluster)[role]
    addr = "127.0.0.1:%d" % port
    key = read_key(cluster)
    before = failures(cluster, port)

    # No handshake, a request: answered AUTH, then closed.
    s = connect(addr)
    s.sendall(frame(OP_MGMT_LEADER))
    r = read_reply(s)
    assert r is not None and r[1] == ST_AUTH, r
    assert closed(s)
    s.close()

    # A large request before the handshake: closed without reading it.
    s = connect(addr)
    s.sendall(frame(OP_MGMT_LEADER, b"x" * 100000)[:60000])
    assert closed(s)
    s.close()

    # A request after AUTH_HELLO, before the proof: refused too.
    s = connect(addr)
    nc, ns, smac = hello(s)
    s.sendall(frame(OP_MGMT_LEADER, req_id=2))
    r = read_reply(s)
    assert r is not None and r[1] == ST_AUTH, r
    assert closed(s)
    s.close()

    # A wrong key: the server's MAC does not verify with it, and its proof is refused.
    wrong = secrets.token_bytes(32)
    s = connect(addr)
    nc, ns, smac = hello(s)
    assert smac != mac(wrong, b"server", nc, ns)
    assert smac == mac(key, b"server", nc, ns)  # the daemon holds the cluster key
    s.sendall(frame(OP_AUTH_PROOF, mac(wrong, b"client", nc, ns), req_id=2))
    r = read_reply(s)
    assert r is not None and r[1] == ST_AUTH, r
    assert closed(s)
    s.close()

    # The server's own MAC sent back as a proof: refused (the labels differ).
    s = connect(addr)
    nc, ns, smac = hello(s)
    s.sendall(frame(OP_AUTH_PROOF, smac, req_id=2))
    r = read_reply(s)
    assert r is not None and r[1] == ST_AUTH, r
    s.close()

    # The right key: served. An unknown opcode then gets an answer, not a hang-up.
    good = connect(addr)
    nc, ns, smac = hello(good)
    proof = mac(key, b"client", nc, ns)
    good.sendall(frame(OP_AUTH_PROOF, proof, req_id=2))
    assert read_reply(good)[:2] == (OP_AUTH_PROOF, ST_OK)
    good.sendall(frame(0xfff0, req_id=3))
    r = read_reply(good)
    assert r is not None and r[1] == ST_NOSYS, r

    # Replay: the same Nc and the proof recorded above, on a new connection. The
    # server's nonce differs, so the old proof proves nothing.
    s = connect(addr)
    nc2, ns2, _ = hello(s, nc)
    assert ns2 != ns
    s.sendall(frame(OP_AUTH_PROOF, proof, req_id=2))
    r = read_reply(s)
    assert r is not None and r[1] == ST_AUTH, r
    assert closed(s)
    s.close()

    # A malformed handshake (short nonce): closed.
    s = connect(addr)
    s.sendall(frame(OP_AUTH_HELLO, b"short"))
    assert closed(s)
    s.close()

    # The daemon is unharmed: the authenticated connection still works, and so do
    # clients.
    good.sendall(frame(0xfff0, req_id=4))
    assert read_reply(good)[1] == ST_NOSYS
    good.close()
    cluster.cli("mkdir", "-p", "/after-" + role)
    assert "after-" + role in cluster.cli("ls", "/").stdout.decode()

    after = failures(cluster, port)
    assert after["no_handshake"] >= before["no_handshake"] + 3
    assert after["bad_proof"] >= before["bad_proof"] + 3
    assert after["malformed"] >= before["malformed"] + 1
    with open(os.path.join(cluster.data, "log", role + ".log")) as f:
        log = f.read()
    assert "refused: it did not prove the cluster key" in log
    assert "refused: a request before the key handshake" in log


def test_an_unfinished_handshake_is_closed_after_5_s(cluster):
    port = cluster.port + 2
    before = failures(cluster, port)
    s = connect("127.0.0.1:%d" % port)
    t0 = time.time()
    assert closed(s, timeout=12)
    assert 4 <= time.time() - t0 <= 11
    s.close()
    assert failures(cluster, port)["timeout"] >= before.get("timeout", 0) + 1


def test_clients_with_the_key_work_and_others_are_told_why(cluster, tmp_path):
    # The key is found with no flag: the record `stoker up` wrote for this address.
    env = dict(os.environ, STOKER_CLUSTER=cluster.url)
    env.pop("STOKER_KEY_FILE", None)
    run([STOKER, "put", "-", "/k"], input=b"secret bytes", env=env)
    assert run([STOKER, "cat", "/k"], env=env).stdout == b"secret bytes"
    assert "leader" in run([STOKER, "status"], env=env).stdout.decode()

    # Another key: refused, clearly.
    other = tmp_path / "other.key"
    run([STOKER, "admin", "init", "--key", str(other)])
    assert oct(os.stat(other).st_mode & 0o777) == "0o600"
    p = run([STOKER, "cat", "/k"], check=False, env=dict(env, STOKER_KEY_FILE=str(other)))
    assert p.returncode != 0
    assert b"refused this process's key" in p.stderr

    # `admin init` never overwrites a key.
    p = run([STOKER, "admin", "init", "--key", str(other)], check=False)
    assert p.returncode != 0 and b"never overwritten" in p.stderr

    # No key at all: refused, clearly.
    record = "/tmp/stoker-%d/keys/%s" % (os.getuid(), cluster.addr)
    os.rename(record, record + ".away")
    try:
        p = run([STOKER, "cat", "/k"], check=False, env=env)
    finally:
        os.rename(record + ".away", record)
    assert p.returncode != 0
    assert b"refused this process's key" in p.stderr


def test_a_key_file_others_can_read_is_refused(tmp_path):
    key = tmp_path / "open.key"
    key.write_text(secrets.token_hex(32) + "\n")
    os.chmod(key, 0o644)
    port = free_port()
    p = run([STOKER, "mgmtd", "--listen", "127.0.0.1:%d" % port, "--data", str(tmp_path / "m"),
             "--key-file", str(key)], check=False, timeout=30)
    assert p.returncode != 0
    assert b"chmod 600" in p.stderr, p.stderr
    # A client is refused the same file, and says why.
    p = run([STOKER, "status", "--cluster", "127.0.0.1:%d" % port], check=False,
            env=dict(os.environ, STOKER_KEY_FILE=str(key)))
    assert p.returncode != 0 and b"chmod 600" in p.stderr
    # Not a key at all.
    key.write_text("hello\n")
    os.chmod(key, 0o600)
    p = run([STOKER, "mgmtd", "--listen", "127.0.0.1:%d" % port, "--data", str(tmp_path / "m"),
             "--key-file", str(key)], check=False, timeout=30)
    assert p.returncode != 0 and b"is not a key" in p.stderr


def test_key_file_from_a_config_file_and_auth_off(tmp_path):
    """Roles started by hand: key_file in a config file requires the key; --auth off
    (or no key at all, with a warning) serves anyone, as before."""
    key = tmp_path / "c.key"
    run([STOKER, "admin", "init", "--key", str(key)])
    port = free_port()
    conf = tmp_path / "mgmtd.conf"
    conf.write_text("listen = 127.0.0.1:%d\ndata = %s\nkey_file = %s\n"
                    % (port, tmp_path / "m", key))
    d = subprocess.Popen([STOKER, "mgmtd", "--config", str(conf)], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 20
        while True:
            p = run([STOKER, "status", "--cluster", "127.0.0.1:%d" % port], check=False,
                    env=dict(os.environ, STOKER_KEY_FILE=str(key)))
            if p.returncode == 0 or time.time() > deadline:
                break
            time.sleep(0.2)
        assert p.returncode == 0, p.stderr
        s = connect("127.0.0.1:%d" % port)
        s.sendall(frame(OP_MGMT_LEADER))
        r = read_reply(s)
        assert r is not None and r[1] == ST_AUTH
        s.close()
    finally:
        d.terminate()
        d.wait(30)
    p = run([STOKER, "mgmtd", "--data", str(tmp_path / "x"), "--auth", "off", "--key-file",
             str(key)], check=False, timeout=30)
    assert p.returncode != 0 and b"contradict" in p.stderr


def test_strict_clients_refuse_a_daemon_without_a_key(cluster, tmp_path):
    """STOKER_AUTH=strict: a daemon that needs no handshake has proved nothing and
    is refused; a strict process with no key connects nowhere; a cluster that
    proves the key is used as ever."""
    env = dict(os.environ, STOKER_CLUSTER=cluster.url)
    env.pop("STOKER_KEY_FILE", None)
    strict = dict(env, STOKER_AUTH="strict")
    run([STOKER, "put", "-", "/strict"], input=b"proved", env=strict)
    assert run([STOKER, "cat", "/strict"], env=strict).stdout == b"proved"

    key = tmp_path / "c.key"
    run([STOKER, "admin", "init", "--key", str(key)])
    port = free_port()
    d = subprocess.Popen([STOKER, "mgmtd", "--listen", "127.0.0.1:%d" % port, "--data",
                          str(tmp_path / "m"), "--auth", "off"], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    try:
        keyed = dict(env, STOKER_KEY_FILE=str(key))
        status = [STOKER, "status", "--cluster", "127.0.0.1:%d" % port]
        deadline = time.time() + 20
        while True:
            p = run(status, check=False, env=keyed)
            if p.returncode == 0 or time.time() > deadline:
                break
            time.sleep(0.2)
        # by default a client with a key still talks to a daemon run without one
        assert p.returncode == 0, p.stderr
        p = run(status, check=False, env=dict(keyed, STOKER_AUTH="strict"))
        assert p.returncode != 0
        assert b"runs without a cluster key" in p.stderr, p.stderr
        nokey = dict(env, STOKER_AUTH="strict")
        p = run(status, check=False, env=nokey)
        assert p.returncode != 0 and b"holds no cluster key" in p.stderr, p.stderr
    finally:
        d.terminate()
        d.wait(30)
