"""The one-machine cluster as a user meets it: up, down, status, ports, restarts,
roles run alone from a config file."""
import os
import socket
import subprocess
import time

import pytest

from conftest import STOKER, Cluster, pick_ports, run


def size_words(n):
    """A byte count as `stoker status` prints it: "252.0 GiB"."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return ["%d" % n, unit] if unit == "B" else ["%.1f" % n, unit]
        n /= 1024


def test_up_status_down(cluster):
    out = cluster.cli("status").stdout.decode()
    assert "routing version" in out
    assert out.count("serving") == 4
    assert "meta" in out and "storage" in out
    # 4 chains, one target each
    chains = out.split("Chains")[1].split("Metadata")[0].strip().splitlines()[1:]
    assert len(chains) == 4
    shards = out.split("Metadata shards")[1].strip().splitlines()[1:]
    assert len(shards) == 1
    # The targets share the data folder's disk: each shows all of it, the total it once.
    disk = os.statvfs(cluster.data)
    total = [l for l in out.splitlines() if l.strip().startswith("total")][0]
    assert total.split()[1:3] == size_words(disk.f_blocks * disk.f_frsize), (total, out)


def test_cluster_status_api(cluster):
    """libstoker's cluster status (stk_cluster_status_fetch), what `stoker status` and
    `stoker top` print: this cluster's nodes, targets, chains and shard, figures that
    follow a write, and the calls' errors (tests/tools/stk_check.c, cmd_cluster)."""
    p = cluster.check("cluster", "4", "/cluster-status.bin", check=False)
    assert p.returncode == 0, (p.stdout + p.stderr).decode()
    assert b"cluster: ok" in p.stdout

def test_second_up_on_same_dir_is_refused(cluster):
    p = run([STOKER, "up", "--data", cluster.data, "--daemon", "--port", str(pick_ports())],
            check=False)
    assert p.returncode != 0
    assert b"already running" in p.stderr
    # the refused start must leave the running cluster's records alone
    assert os.path.exists(os.path.join(cluster.data, "up.pid"))
    cluster.stop()
    assert not cluster.pids()


def test_port_in_use_is_a_clear_error(tmp_path):
    port = pick_ports()
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port + 1))
    s.listen(1)
    try:
        p = run([STOKER, "up", "--data", str(tmp_path / "d"), "--daemon", "--port", str(port)],
                check=False)
        assert p.returncode != 0
        assert b"port %d" % (port + 1) in p.stderr
        assert b"meta" in p.stderr
    finally:
        s.close()


def test_restart_finds_data(make_cluster, rand_file):
    c = make_cluster()
    src = rand_file(3 << 20)
    c.cli("mkdir", "-p", "/keep/deep")
    c.cli("put", str(src), "/keep/deep/file.bin")
    c.stop()
    assert not c.pids()
    c.start()
    got = c.cli("cat", "/keep/deep/file.bin").stdout
    assert got == src.read_bytes()
    # a file created after the restart gets a fresh inode, nothing is reused
    c.cli("put", str(src), "/keep/second.bin")
    assert c.cli("cat", "/keep/second.bin").stdout == src.read_bytes()
    ls = c.cli("ls", "/keep").stdout.decode().split()
    assert sorted(ls) == ["deep", "second.bin"]


# serial: every `stoker up` records itself as this machine's default cluster
# (/tmp/stoker-UID/cluster), so an up beside it would take its plain paths.
@pytest.mark.serial
def test_default_cluster_is_the_one_up_started(make_cluster, tmp_path):
    c = make_cluster()
    env = dict(os.environ)
    env.pop("STOKER_CLUSTER", None)
    src = tmp_path / "x.txt"
    src.write_bytes(b"plain paths work\n")
    run([STOKER, "put", str(src), "/plain.txt"], env=env)
    p = run([STOKER, "cat", "/plain.txt"], env=env)
    assert p.stdout == b"plain paths work\n"
    # and the stk:// form reaches the same file
    p = run([STOKER, "cat", c.url + "/plain.txt"], env=env)
    assert p.stdout == b"plain paths work\n"


def test_unreachable_cluster_is_a_clear_error():
    p = run([STOKER, "ls", "stk://127.0.0.1:1/"], check=False)
    assert p.returncode == 1
    assert b"cannot reach the cluster" in p.stderr


def test_roles_alone_from_config_files(tmp_path):
    """Each role as it runs on its own host: separate processes, config files."""
    base = pick_ports()
    procs = []
    cfg = {}
    for role, extra in (("mgmtd", ""), ("meta", "mgmtd = 127.0.0.1:%d\n" % base),
                        ("storage", "mgmtd = 127.0.0.1:%d\ntarget = %s\ntarget = %s\n" % (
                            base, tmp_path / "t0", tmp_path / "t1"))):
        port = base + {"mgmtd": 0, "meta": 1, "storage": 2}[role]
        path = tmp_path / ("%s.conf" % role)
        path.write_text("# %s\nlisten = 127.0.0.1:%d\ndata = %s\n%s" % (
            role, port, tmp_path / role, extra))
        cfg[role] = path
    try:
        for role in ("mgmtd", "meta", "storage"):
            log = open(tmp_path / ("%s.log" % role), "w")
            procs.append(subprocess.Popen([STOKER, role, "--config", str(cfg[role])],
                                          stdout=log, stderr=log))
        addr = "stk://127.0.0.1:%d" % base
        deadline = time.time() + 30
        while time.time() < deadline:
            p = run([STOKER, "status", "--cluster", addr], check=False)
            if p.returncode == 0 and p.stdout.count(b"serving") == 2 and \
                    b"Metadata shards\n  SHARD  META NODE\n  1" in p.stdout:
                break
            time.sleep(0.2)
        else:
            raise AssertionError("cluster of separate roles did not come up")
        env = dict(os.environ, STOKER_CLUSTER=addr)
        run([STOKER, "put", "-", "/hello"], input=b"roles", env=env)
        assert run([STOKER, "cat", "/hello"], env=env).stdout == b"roles"
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            assert p.wait(timeout=20) == 0


def test_up_mounts_and_down_unmounts(tmp_path):
    from conftest import have_fuse
    if not have_fuse():
        import pytest
        pytest.skip("needs root, /dev/fuse and fusermount3")
    port = pick_ports()
    data, mnt = tmp_path / "d", tmp_path / "mnt"
    mnt.mkdir()
    p = run([STOKER, "up", "--data", str(data), "--daemon", "--port", str(port),
             "--mount", str(mnt)], check=False, timeout=120)
    try:
        assert p.returncode == 0, p.stderr
        assert b"mounted on " + str(mnt).encode() in p.stdout
        (mnt / "through-the-mount.txt").write_bytes(b"hello mount")
        env = dict(os.environ, STOKER_CLUSTER="stk://127.0.0.1:%d" % port)
        assert run([STOKER, "cat", "/through-the-mount.txt"], env=env).stdout == b"hello mount"
    finally:
        run([STOKER, "down", "--data", str(data)], check=False, timeout=120)
    with open("/proc/self/mountinfo") as f:
        assert not any(l.split()[4] == str(mnt) for l in f)
    p = run([STOKER, "up", "--data", str(tmp_path / "e"), "--daemon", "--port", str(port),
             "--mount", str(tmp_path / "missing")], check=False)
    assert p.returncode != 0 and b"missing" in p.stderr


def test_up_serves_s3(tmp_path):
    import boto3
    from botocore.config import Config
    port, s3port = pick_ports(), pick_ports() + 20
    data = tmp_path / "d"
    p = run([STOKER, "up", "--data", str(data), "--daemon", "--port", str(port),
             "--s3", str(s3port)], check=False, timeout=120,
            env={k: v for k, v in os.environ.items() if not k.startswith("STOKER_S3")})
    try:
        assert p.returncode == 0, p.stderr
        assert b"S3 on http://127.0.0.1:%d" % s3port in p.stdout
        key, secret = (data / "s3.keys").read_text().split()
        env = dict(os.environ, STOKER_CLUSTER="stk://127.0.0.1:%d" % port)
        run([STOKER, "mkdir", "/bucket"], env=env)
        run([STOKER, "put", "-", "/bucket/obj.txt"], input=b"via the cli", env=env)
        s3 = boto3.client("s3", endpoint_url="http://127.0.0.1:%d" % s3port,
                          aws_access_key_id=key, aws_secret_access_key=secret,
                          region_name="us-east-1", config=Config(retries={"max_attempts": 10}))
        deadline = time.time() + 20
        while True:
            try:
                body = s3.get_object(Bucket="bucket", Key="obj.txt")["Body"].read()
                break
            except Exception:
                if time.time() > deadline:
                    raise
                time.sleep(0.2)
        assert body == b"via the cli"
    finally:
        run([STOKER, "down", "--data", str(data)], check=False, timeout=120)


def test_up_with_several_storage_nodes(tmp_path):
    """`stoker up --nodes 3`: three storage nodes, each on a loopback address and a
    host id of its own, all serving, each role given the options up passes it; a
    file is spread over them and read back; a node killed is restarted by the
    supervisor at the same address with the same options; down stops all."""
    port = pick_ports()
    data = str(tmp_path / "stk")
    env = dict(os.environ, STOKER_CLUSTER="stk://127.0.0.1:%d" % port)
    p = run([STOKER, "up", "--data", data, "--daemon", "--port", str(port), "--nodes", "3",
             "--targets", "2", "--resync-rate", "64M", "--scrub-interval", "86400",
             "--replace-after", "900"], check=False, timeout=120)
    try:
        assert p.returncode == 0, p.stderr.decode() + p.stdout.decode()
        assert "3 storage nodes" in p.stdout.decode(), p.stdout
        # the role options given to up reach every process of their role
        procs = [argv.split(b"\0") for _, argv in cmdlines() if data.encode() in argv]
        stor = [a for a in procs if b"storage" in a[1:2]]
        mgmt = [a for a in procs if b"mgmtd" in a[1:2]]
        assert len(stor) == 3 and len(mgmt) == 3, procs
        for a in stor:
            assert a[a.index(b"--resync-rate") + 1] == b"64M", a
            assert a[a.index(b"--scrub-interval") + 1] == b"86400", a
            assert b"--replace-after" not in a, a
        for a in mgmt:
            assert a[a.index(b"--replace-after") + 1] == b"900", a
            assert b"--resync-rate" not in a, a
        st = run([STOKER, "status"], env=env).stdout.decode()
        for i in range(3):
            assert "127.0.0.%d:%d" % (i + 2, port + 2) in st and "up-storage%d" % i in st, st
        assert st.count(" serving ") == 6, st
        # top finds every node's metrics; the one disk under all counts once
        top = run([STOKER, "top", "--once", "--interval", "0.5"], env=env).stdout.decode()
        assert top.count(" storage ") == 3 and top.count(" target ") == 6, top
        sizes = {l.split()[0] if not l.startswith(" ") else "target":
                 l.split("% of ")[1] for l in top.splitlines() if "% of " in l}
        assert sizes["cluster"] == sizes["target"], top
        src = tmp_path / "in.bin"
        src.write_bytes(os.urandom(24 << 20))
        run([STOKER, "put", str(src), "/big"], env=env)
        for i in range(3):
            chunks = [f for _, _, fs in os.walk(os.path.join(data, "targets", str(i)))
                      for f in fs]
            assert chunks, "node %d holds none of the file's chunks" % i
        # a node killed: restarted where it was; the file reads back whole
        victim = [pid for pid, argv in cmdlines()
                  if b"127.0.0.3:%d" % (port + 2) in argv and b"storage" in argv]
        assert len(victim) == 1, victim
        os.kill(int(victim[0]), 9)
        deadline = time.time() + 30
        while time.time() < deadline:
            if run([STOKER, "get", "/big", str(tmp_path / "out.bin")], env=env,
                   check=False).returncode == 0:
                break
            time.sleep(0.5)
        assert (tmp_path / "out.bin").read_bytes() == src.read_bytes()
        # with 3 copies the read needs no restart; the supervisor notices on its own,
        # and restarts the node with the options it had
        deadline = time.time() + 30
        while True:
            again = [argv.split(b"\0") for pid, argv in cmdlines()
                     if b"127.0.0.3:%d" % (port + 2) in argv and b"storage" in argv
                     and pid != victim[0]]
            if again and "exited" in open(os.path.join(data, "log", "up.log")).read():
                break
            assert time.time() < deadline, "the supervisor never restarted the node"
            time.sleep(0.2)
        assert again[0][again[0].index(b"--resync-rate") + 1] == b"64M", again
    finally:
        down = run([STOKER, "down", "--data", data], check=False, timeout=150)
    left = [(pid, argv) for pid, argv in cmdlines() if data.encode() in argv]
    assert not left, (left, down.stderr, open(os.path.join(data, "log", "up.log")).read())


def cmdlines():
    """(pid, command line) of every process (those gone meanwhile left out)."""
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open("/proc/%s/cmdline" % pid, "rb") as f:
                    out.append((pid, f.read()))
            except OSError:
                pass
    return out


def test_up_nodes_bad_input(tmp_path):
    p = run([STOKER, "up", "--data", str(tmp_path / "a"), "--nodes", "9"], check=False)
    assert p.returncode != 0 and b"--nodes must be 1..8" in p.stderr, p.stderr
    p = run([STOKER, "up", "--data", str(tmp_path / "b"), "--nodes", "2", "--host",
             "0.0.0.0"], check=False)
    assert p.returncode != 0 and b"does not go with --host" in p.stderr, p.stderr
