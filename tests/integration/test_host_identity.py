"""Host identity (src/common/host.h): a client reads chunk files itself (short-circuit
reads) only from a storage node that is ONLINE with the client's own host id, never
because the node's address is on 127.0.0.0/8; and free space is counted once per
device over the whole cluster, however many targets of however many storage nodes
share it (df on a mount, `stoker status` totals, mgmtd's cluster metrics).

Nodes on this one machine are made distinct hosts with `--host-id`, a client with
STOKER_HOST_ID."""
import os
import random
import re
import urllib.request

from conftest import Mount, have_fuse, run, STOKER, wait_until

MiB = 1 << 20


def pattern(size, seed):
    return random.Random(seed).randbytes(size)


def size_words(n):
    """`stoker status`'s rendering of a byte count (stk_format_size)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return ["%d" % n, unit] if unit == "B" else ["%.1f" % n, unit]
        n /= 1024


def total_line(status):
    return [l for l in status.splitlines() if l.strip().startswith("total")][0]


def client_env(rc, host_id, retry_ms=None):
    env = dict(rc.env(), STOKER_HOST_ID=host_id)
    if retry_ms is not None:
        env["STOKER_RETRY_MS"] = str(retry_ms)
    return env


def get(rc, path, env):
    return run([STOKER, "get", path, "-"], check=False, env=env, timeout=120)


def chunk_files(node):
    return sum(len(files) for t in node.targets
               for _, _, files in os.walk(os.path.join(t, "chunks")))


def put_with_chunks_on(rc, node, data):
    """Puts data into new files until one has chunks on `node` (meta may place the
    first files on the chains it knew before the node's target came); its path."""
    made = []

    def attempt():
        before = chunk_files(node)
        made.append("/f%d" % len(made))
        rc.cli("put", "-", made[-1], input=data)
        return chunk_files(node) > before

    wait_until(attempt, timeout=60, what="a file with chunks on " + node.name)
    return made[-1]


def test_df_counts_a_shared_device_once(role_cluster, tmp_path):
    """Three storage nodes, two targets each, all on this test's file system: the
    mount's df and `stoker status`'s total show that file system once, not six
    targets' (or three nodes') worth of it. (The mount's part needs FUSE.)"""
    rc = role_cluster
    rc.add_meta("meta1")
    for i in range(3):
        rc.add_storage("st%d" % (i + 1), targets=2)
    rc.start_all()
    rc.wait_serving()
    tdir = rc.nodes["st1"].targets[0]
    before = os.statvfs(tdir)

    status = rc.status()
    line = total_line(status)
    assert line.split()[1:3] == size_words(before.f_blocks * before.f_frsize), status
    assert "on 1 device" in line, status

    got = None
    if have_fuse():
        m = Mount(rc, tmp_path / "mnt")
        m.start()
        try:
            got = os.statvfs(m.path)
        finally:
            m.stop()
        assert not m.sanitizer_reports(), m.log()
    after = os.statvfs(tdir)
    if got is not None:
        disk_total = before.f_blocks * before.f_frsize
        mnt_total = got.f_blocks * got.f_frsize
        assert disk_total - 4096 <= mnt_total <= disk_total, (mnt_total, disk_total)
        # Free space moves under the other programs of this machine: compare with
        # the most the disk had around the call, with a little room.
        avail_max = max(before.f_bavail, after.f_bavail) * before.f_frsize
        avail_min = min(before.f_bavail, after.f_bavail) * before.f_frsize
        mnt_avail = got.f_bavail * got.f_frsize
        slack = max(avail_max // 20, 256 * MiB)
        assert mnt_avail <= avail_max + slack, (mnt_avail, avail_max)
        assert mnt_avail >= avail_min - slack, (mnt_avail, avail_min)
        assert got.f_bfree >= got.f_bavail


def test_a_dead_node_of_another_host_is_not_read_behind_its_back(role_cluster):
    """Two storage nodes stand for two other hosts (--host-id), the client for a
    third. With one node killed, a read of a file with chunks on it fails (the
    client must not read that node's chunk files from disk because its address is
    127.0.0.x), and succeeds with the same bytes once the node is back."""
    rc = role_cluster
    rc.add_meta("meta1")
    for name, host in (("st1", "test-host-a"), ("st2", "test-host-b")):
        node = rc.add_storage(name, targets=1)
        node.argv += ["--host-id", host]
    rc.start_all()
    rc.wait_serving()
    status = rc.status()
    assert "test-host-a" in status and "test-host-b" in status, status

    data = pattern(4 * MiB + 12345, 1)
    path = put_with_chunks_on(rc, rc.nodes["st1"], data)
    env = client_env(rc, "test-client-host", retry_ms=1500)
    assert get(rc, path, env).stdout == data

    rc.kill("st1")
    p = get(rc, path, env)
    assert p.returncode != 0, "read of a dead node's chunks succeeded: %d bytes" % len(p.stdout)
    assert b"Input/output error" in p.stderr or b"error" in p.stderr.lower(), p.stderr

    rc.start("st1")
    rc.wait_serving()
    wait_until(lambda: get(rc, path, env).returncode == 0, timeout=60,
               what="the read to work again")
    assert get(rc, path, env).stdout == data


def stor_reads(cluster):
    url = "http://127.0.0.1:%d/metrics" % (cluster.port + 12)
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    m = re.search(r'^stoker_rpc_requests_total\{op="STOR_READ"\} (\S+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


def test_short_circuit_follows_the_host_id(cluster):
    """`stoker up`: a client of this host reads chunk files itself (no STOR_READ
    reaches the storage node); the same client claiming another host id reads
    through the network."""
    data = pattern(3 * MiB + 777, 2)
    cluster.cli("put", "-", "/g", input=data)
    env = dict(os.environ, STOKER_CLUSTER=cluster.url)
    env.pop("STOKER_HOST_ID", None)
    env.pop("STOKER_SHORT_CIRCUIT", None)

    n0 = stor_reads(cluster)
    p = run([STOKER, "get", "/g", "-"], env=env)
    assert p.stdout == data
    n1 = stor_reads(cluster)
    assert n1 == n0, "a client of this host read through storage: %s requests" % (n1 - n0)

    env["STOKER_HOST_ID"] = "test-elsewhere"
    p = run([STOKER, "get", "/g", "-"], env=env)
    assert p.stdout == data
    n2 = stor_reads(cluster)
    assert n2 >= n1 + 4, "another host's client read no chunk through storage"


def test_bad_host_ids_are_refused(role_cluster):
    rc = role_cluster
    p = run([STOKER, "storage", "--data", os.path.join(rc.dir, "x"), "--target",
             os.path.join(rc.dir, "x", "t0"), "--host-id", "two words"], check=False)
    assert p.returncode == 2 and b"bad --host-id" in p.stderr, p.stderr
    p = run([STOKER, "storage", "--data", os.path.join(rc.dir, "x"), "--target",
             os.path.join(rc.dir, "x", "t0"), "--host-id", "h" * 64], check=False)
    assert p.returncode == 2 and b"bad --host-id" in p.stderr, p.stderr
    env = dict(os.environ, STOKER_CLUSTER=rc.url, STOKER_HOST_ID="x" * 64)
    p = run([STOKER, "ls", "/"], check=False, env=env, timeout=60)
    assert p.returncode != 0 and b"STOKER_HOST_ID" in p.stderr, p.stderr
