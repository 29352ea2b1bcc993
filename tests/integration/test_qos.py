"""QoS (docs/qos.md): `stoker qos set TENANT` limits what a client key's name may
read, write and ask per second at each storage node; connections with the cluster
key are never limited.

Every test runs a real `stoker up` cluster and real clients: the CLI and the Python
package, each holding a client key (tenants "teamA" and "teamB"). Rates are read
from the storage node's /metrics (what it served), over windows of a few seconds,
with generous bounds (0.5x to 1.5x of a limit): the tests check that a limit holds,
not how fast anything is.
"""
import json
import os
import subprocess
import time
import urllib.request

import pytest

from conftest import ROOT, STOKER, run, wait_until

PYPATH = os.environ.get("STOKER_PYDIR") or os.path.join(ROOT, "build", "python")
MiB = 1 << 20


def add_client(cluster, tmp_path, name):
    key = str(tmp_path / (name + ".key"))
    cluster.cli("admin", "client", "add", name, "--key-out", key)
    return key


def scrape(cluster):
    """The storage node's /metrics (metrics ports are 10 above the daemons')."""
    return urllib.request.urlopen("http://127.0.0.1:%d/metrics" % (cluster.port + 12),
                                  timeout=10).read().decode()


def sample(cluster, name):
    """The value of series `name` (with its labels, as written) at the storage node, 0 if absent."""
    for line in scrape(cluster).splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def threads(pid):
    """The process's threads, but io_uring's kernel workers."""
    n = 0
    for t in os.listdir("/proc/%d/task" % pid):
        try:
            with open("/proc/%d/task/%s/comm" % (pid, t)) as f:
                if not f.read().startswith("iou-"):
                    n += 1
        except OSError:
            pass
    return n


def py_proc(cluster, key, code, *args, qos_class=None):
    """A Python process holding client key `key` (c: its client), running `code`."""
    env = dict(os.environ, STOKER_CLUSTER=cluster.url, STOKER_KEY_FILE=key, PYTHONPATH=PYPATH)
    env.pop("STOKER_QOS_CLASS", None)
    if qos_class:
        env["STOKER_QOS_CLASS"] = qos_class
    prog = "import os, sys, time, stoker\nc = stoker.connect()\n" + code
    return subprocess.Popen(["/usr/bin/python3", "-c", prog] + [str(a) for a in args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


# Writes 1 MiB blocks to file argv[1] flat out, in files of argv[2] MiB, until killed.
WRITER = """
data = os.urandom(1 << 20)
i = 0
while True:
    with c.open("%s.%d" % (sys.argv[1], i % 4), "wb") as f:
        for _ in range(int(sys.argv[2])):
            f.write(data)
    i += 1
"""


def rate(cluster, series, seconds):
    """Growth per second of a storage series over `seconds`."""
    a, t0 = sample(cluster, series), time.time()
    time.sleep(seconds)
    return (sample(cluster, series) - a) / (time.time() - t0)


def qos(cluster, *args, check=True):
    return cluster.cli("qos", *args, check=check)


def wait_applied(cluster, tenant, limited=True):
    """Until the storage node has fetched the list (its series shows the tenant)."""
    series = 'stoker_qos_requests_total{tenant="%s"}' % tenant
    if limited:
        # A new tenant's series appears once the node holds its limits; requests
        # only count then, so the test's writer makes it show.
        wait_until(lambda: series in scrape(cluster), 30, "storage to fetch the QoS limits")
    else:
        time.sleep(3)  # a removal shows in no series: the agent refetches within ~1 s


def test_qos_set_ls_rm_round_trip_and_bad_input(cluster, tmp_path):
    assert json.loads(qos(cluster, "ls", "--json").stdout) == []
    p = qos(cluster, "set", "teamB", "--write-bw", "100M/s", "--iops", "2k")
    assert b"teamB set" in p.stdout
    qos(cluster, "set", "teamA", "--read-bw", "1G")
    got = {t["tenant"]: t for t in json.loads(qos(cluster, "ls", "--json").stdout)}
    assert got == {"teamB": {"tenant": "teamB", "read_bw": 0, "write_bw": 100 * MiB, "iops": 2000,
                             "class": None},
                   "teamA": {"tenant": "teamA", "read_bw": 1 << 30, "write_bw": 0, "iops": 0,
                             "class": None}}
    table = qos(cluster, "ls").stdout.decode()
    assert "100.0 MiB/s" in table and "2000" in table, table
    # set replaces a tenant's limits; "none" is no limit
    qos(cluster, "set", "teamB", "--write-bw", "none", "--iops", "50")
    got = {t["tenant"]: t for t in json.loads(qos(cluster, "ls", "--json").stdout)}
    assert got["teamB"] == {"tenant": "teamB", "read_bw": 0, "write_bw": 0, "iops": 50,
                            "class": None}
    # a cap on a tenant's class, and a class's own limits
    qos(cluster, "set", "teamC", "--class", "checkpoint")
    qos(cluster, "set", "@checkpoint", "--write-bw", "200M")
    got = {t["tenant"]: t for t in json.loads(qos(cluster, "ls", "--json").stdout)}
    assert got["teamC"]["class"] == "checkpoint" and got["teamC"]["write_bw"] == 0
    assert got["@checkpoint"] == {"tenant": "@checkpoint", "read_bw": 0, "write_bw": 200 * MiB,
                                  "iops": 0, "class": None}
    assert "checkpoint" in qos(cluster, "ls").stdout.decode()

    # bad input: a clear error, exit 1 (2 for usage), and nothing changed
    before = qos(cluster, "ls", "--json").stdout
    for args, code, msg in (
            (("set", "bad/name", "--iops", "5"), 1, b"not a tenant name"),
            (("set", "x" * 64, "--iops", "5"), 1, b"at most 63 characters"),
            (("set", "teamB", "--read-bw", "fast"), 1, b"not a rate"),
            (("set", "teamB", "--write-bw", "-5M"), 1, b"not a rate"),
            (("set", "teamB", "--iops", "1x"), 1, b"not a count"),
            (("set", "teamB", "--iops", "99999999999"), 1, b"too large"),
            (("set", "teamB"), 2, b"needs --read-bw, --write-bw, --iops or --class"),
            (("set", "teamB", "--class", "urgent"), 1, b"not a class"),
            (("set", "@training-read", "--iops", "5"), 1, b"nor a class's"),
            (("set", "@other", "--iops", "5"), 1, b"nor a class's"),
            (("set", "@checkpoint", "--class", "default"), 1, b"take no --class"),
            (("set",), 2, b"needs a TENANT"),
            (("rm", "nobody"), 1, b"has no limits"),
            (("frob",), 2, b"usage"),
            (("ls", "extra"), 2, b"unexpected argument"),
            (("set", "teamB", "--iops"), 2, b"unexpected argument")):
        p = qos(cluster, *args, check=False)
        assert p.returncode == code and msg in p.stderr, (args, p.returncode, p.stderr)
    assert qos(cluster, "ls", "--json").stdout == before
    # a client marking its requests with no such class is told so
    p = run([STOKER, "ls", "/"], check=False, env=cluster.env(STOKER_QOS_CLASS="urgent"))
    assert p.returncode != 0 and b"not a class" in p.stderr, p.stderr

    # a client key may not change or read limits
    key = add_client(cluster, tmp_path, "teamB")
    env = dict(os.environ, STOKER_CLUSTER=cluster.url, STOKER_KEY_FILE=key)
    p = run([STOKER, "qos", "set", "teamB", "--iops", "1000000"], check=False, env=env)
    assert p.returncode == 1 and b"only the cluster key's holder" in p.stderr, p.stderr
    p = run([STOKER, "qos", "ls"], check=False, env=env)
    assert p.returncode == 1, p.stdout

    # limits survive a restart of the cluster (mgmtd's state)
    cluster.stop()
    cluster.start()
    assert qos(cluster, "ls", "--json").stdout == before
    assert b"limits dropped" in qos(cluster, "rm", "teamA").stdout
    got = json.loads(qos(cluster, "ls", "--json").stdout)
    assert sorted(t["tenant"] for t in got) == ["@checkpoint", "teamB", "teamC"]


@pytest.mark.serial
def test_write_limit_holds_while_another_tenant_reads(cluster, tmp_path):
    a_key = add_client(cluster, tmp_path, "teamA")
    b_key = add_client(cluster, tmp_path, "teamB")
    data = os.urandom(32 * MiB)
    (tmp_path / "big").write_bytes(data)
    cluster.cli("put", str(tmp_path / "big"), "/big")
    limit = 8 * MiB
    qos(cluster, "set", "teamB", "--write-bw", "8M/s")
    writer = py_proc(cluster, b_key, WRITER, "/b", 16)
    # teamA reads /big again and again, flat out; prints its MiB/s each pass
    reader = py_proc(cluster, a_key, """
while True:
    t = time.time()
    n = len(c.read_file("/big"))
    print(n / (time.time() - t) / (1 << 20), flush=True)
""")
    try:
        wait_applied(cluster, "teamB")
        time.sleep(1)
        got = rate(cluster, 'stoker_rpc_received_bytes_total{op="STOR_WRITE"}', 6)
        print("teamB wrote %.1f MiB/s under a limit of 8" % (got / MiB))
        assert 0.5 * limit <= got <= 1.5 * limit, "teamB wrote %.1f MiB/s, limit 8" % (got / MiB)
        held = sample(cluster, 'stoker_qos_throttled_seconds_count{tenant="teamB"}')
        assert held > 0
        assert sample(cluster, 'stoker_qos_throttled_seconds_sum{tenant="teamB"}') > 1
        # stoker top shows the tenant held, with its throttled time
        top = cluster.cli("top", "--once", "--interval", "1").stdout.decode()
        line = [l for l in top.splitlines() if l.strip().startswith("teamB")]
        assert "requests held now" in top and line, top
        assert float(line[0].split()[-2]) > 0, line
    finally:
        writer.kill()
        reader.kill()
    out = reader.communicate()[0].decode().split()
    assert writer.wait() and len(out) >= 3, out
    # teamA's reads were never held: they ran far above teamB's limit
    print("teamA read at %.0f MiB/s (median of %d passes)" % (
        sorted(float(x) for x in out)[len(out) // 2], len(out)))
    assert sorted(float(x) for x in out)[len(out) // 2] > 3 * limit / MiB, out
    assert 'tenant="teamA"' not in scrape(cluster)


@pytest.mark.serial
def test_iops_limit(cluster, tmp_path):
    key = add_client(cluster, tmp_path, "teamB")
    (tmp_path / "f").write_bytes(os.urandom(4096))
    cluster.cli("put", str(tmp_path / "f"), "/f")
    qos(cluster, "set", "teamB", "--iops", "40")
    # a small file read whole again and again: a storage request each time
    reader = py_proc(cluster, key, """
while True:
    c.read_file("/f")
""")
    try:
        wait_applied(cluster, "teamB")
        time.sleep(1)
        got = rate(cluster, 'stoker_qos_requests_total{tenant="teamB"}', 6)
        print("teamB made %.1f requests/s under a limit of 40" % got)
        assert 20 <= got <= 60, "teamB made %.1f requests/s, limit 40" % got
        assert sample(cluster, "stoker_qos_held_requests") >= 0
    finally:
        reader.kill()
    reader.wait()


@pytest.mark.serial
def test_a_limit_set_and_removed_applies_to_a_live_connection(cluster, tmp_path):
    key = add_client(cluster, tmp_path, "teamB")
    series = 'stoker_rpc_received_bytes_total{op="STOR_WRITE"}'
    writer = py_proc(cluster, key, WRITER, "/b", 8)  # one client, one connection, throughout
    limit = 4 * MiB
    try:
        wait_until(lambda: sample(cluster, series) > 0, 30, "the writer to start")
        free = rate(cluster, series, 3)
        assert free > 3 * limit, "unlimited, teamB wrote only %.1f MiB/s" % (free / MiB)
        qos(cluster, "set", "teamB", "--write-bw", "4M")
        wait_applied(cluster, "teamB")
        time.sleep(2)  # what was charged before the limit drains
        held = rate(cluster, series, 5)
        assert 0.5 * limit <= held <= 1.5 * limit, "teamB wrote %.1f MiB/s, limit 4" % (held / MiB)
        qos(cluster, "rm", "teamB")
        wait_applied(cluster, "teamB", limited=False)
        again = rate(cluster, series, 3)
        print("teamB wrote %.1f, %.1f, %.1f MiB/s: free, limited to 4, free again" % (
            free / MiB, held / MiB, again / MiB))
        assert again > 3 * limit, "limit removed, teamB wrote only %.1f MiB/s" % (again / MiB)
    finally:
        writer.kill()
    writer.wait()


@pytest.mark.serial
def test_held_requests_take_no_thread_and_leave_others_served(cluster, tmp_path):
    a_key = add_client(cluster, tmp_path, "teamA")
    b_key = add_client(cluster, tmp_path, "teamB")
    pid = cluster.pids()["storage"]
    qos(cluster, "set", "teamB", "--write-bw", "1M")
    time.sleep(3)
    idle = threads(pid)
    # 48 writers of teamB, far more than the node's 32 workers, each held for seconds
    procs = [py_proc(cluster, b_key, """
import threading
def w(i):
    with c.open("/b%s.%d" % (sys.argv[1], i), "wb") as f:
        f.write(os.urandom(1 << 20))
ts = [threading.Thread(target=w, args=(i,)) for i in range(16)]
[t.start() for t in ts]
[t.join() for t in ts]
""", k) for k in range(3)]
    try:
        wait_until(lambda: sample(cluster, "stoker_qos_held_requests") >= 40, 60,
                   "40 of teamB's writes to be held")
        peak = threads(pid)
        # teamA (unlimited) writes and reads meanwhile, as quickly as ever
        t = time.time()
        (tmp_path / "a").write_bytes(os.urandom(4 * MiB))
        env = dict(os.environ, STOKER_CLUSTER=cluster.url, STOKER_KEY_FILE=a_key)
        run([STOKER, "put", str(tmp_path / "a"), "/a"], env=env)
        assert run([STOKER, "cat", "/a"], env=env).stdout == (tmp_path / "a").read_bytes()
        took = time.time() - t
        held = sample(cluster, "stoker_qos_held_requests")
        peak = max(peak, threads(pid))
    finally:
        for p in procs:
            p.kill()
            p.wait()
    print("threads idle %d, peak %d; %d requests held; teamA's put and cat took %.2f s" % (
        idle, peak, held, took))
    assert held >= 30, held
    assert took < 10, "teamA's 4 MiB took %.1f s while teamB's writes were held" % took
    assert peak <= idle, "threads grew from %d to %d while teamB's writes were held" % (idle, peak)


@pytest.mark.serial
def test_checkpoint_class_gives_way_to_reads(cluster, tmp_path):
    a_key = add_client(cluster, tmp_path, "teamA")
    b_key = add_client(cluster, tmp_path, "teamB")
    c_key = add_client(cluster, tmp_path, "teamC")
    (tmp_path / "big").write_bytes(os.urandom(16 * MiB))
    cluster.cli("put", str(tmp_path / "big"), "/big")
    series = 'stoker_rpc_received_bytes_total{op="STOR_WRITE"}'
    limit = 4 * MiB
    # checkpoint-class writes get 4 MiB/s at a node while a higher class is served
    qos(cluster, "set", "@checkpoint", "--write-bw", "4M")
    # teamC marks its writes training-read, but counts as checkpoint at most
    qos(cluster, "set", "teamC", "--class", "checkpoint")
    wait_until(lambda: 'tenant="@checkpoint"' in scrape(cluster) or
               json.loads(qos(cluster, "ls", "--json").stdout), 30, "the limits to be set")
    time.sleep(3)  # the storage node fetches them with its next table
    reader = None
    for key, cls in ((b_key, "checkpoint"), (c_key, "training-read")):
        writer = py_proc(cluster, key, WRITER, "/w" + cls, 8, qos_class=cls)
        try:
            wait_until(lambda: rate(cluster, series, 0.5) > 0, 30, "the writer to start")
            alone = rate(cluster, series, 3)
            assert alone > 3 * limit, "%s alone wrote only %.1f MiB/s" % (cls, alone / MiB)
            # teamA reads (class default, above checkpoint) flat out
            reader = py_proc(cluster, a_key, "while True:\n    c.read_file('/big')\n")
            time.sleep(1.5)
            shared = rate(cluster, series, 5)
            reader.kill()
            reader.wait()
            print("%s writes: %.1f MiB/s alone, %.1f with reads (class limit 4)" % (
                cls, alone / MiB, shared / MiB))
            assert 0.5 * limit <= shared <= 1.5 * limit, \
                "%s wrote %.1f MiB/s beside reads, class limit 4" % (cls, shared / MiB)
            time.sleep(1.5)
            after = rate(cluster, series, 3)
            assert after > 3 * limit, "reads gone, %s wrote only %.1f MiB/s" % (cls, after / MiB)
        finally:
            writer.kill()
            writer.wait()
            if reader:
                reader.kill()
                reader.wait()
    assert sample(cluster, 'stoker_qos_throttled_seconds_count{tenant="@checkpoint"}') > 0


def test_checkpoint_helper_marks_its_writes(cluster, tmp_path):
    """stoker.checkpoint.save writes as class checkpoint: held by @checkpoint's limit
    while another tenant reads, its bytes intact."""
    a_key = add_client(cluster, tmp_path, "teamA")
    b_key = add_client(cluster, tmp_path, "teamB")
    (tmp_path / "big").write_bytes(os.urandom(8 * MiB))
    cluster.cli("put", str(tmp_path / "big"), "/big")
    qos(cluster, "set", "@checkpoint", "--write-bw", "2M")
    time.sleep(3)
    reader = py_proc(cluster, a_key, "while True:\n    c.read_file('/big')\n")
    try:
        time.sleep(1)
        saver = py_proc(cluster, b_key, """
import stoker.checkpoint as ck
blob = bytes(range(256)) * (16 << 12)  # 4 MiB
ck.save(blob, "/ck.pt")
print(ck.load("/ck.pt") == blob)
""")
        out, err = saver.communicate(timeout=120)
    finally:
        reader.kill()
        reader.wait()
    assert saver.returncode == 0 and out.split()[-1] == b"True", err
    assert sample(cluster, 'stoker_qos_throttled_seconds_count{tenant="@checkpoint"}') > 0
