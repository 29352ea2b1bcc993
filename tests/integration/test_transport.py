"""The event-driven transport at scale: one storage node holds 10,000 connections.

A test client (tests/tools/stk_connscale.c, one thread and one epoll set) opens
10,000 connections to one storage node and keeps two requests in flight on each
for a while. The node must answer every connection, keep its thread count fixed
(loop threads and a fixed worker pool, no thread per connection) and its resident
memory under a stated bound, while an ordinary client reads a file meanwhile.
"""
import os
import subprocess
import threading
import time

import pytest

from conftest import BUILD, STOKER, run

CONNSCALE = os.path.join(BUILD, "tests", "stk_connscale")
CONNS = 10000
# What the node may grow by while holding them: a connection costs a struct of a
# few hundred bytes in the node (the kernel's socket buffers are not counted in
# its resident memory), requests come from pools. 64 MiB is ten times that.
RSS_GROWTH_BOUND = 64 << 20


def proc_status(pid, key):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


@pytest.mark.plaintext_wire  # stk_connscale's connections are plain sockets
def test_ten_thousand_connections_to_one_storage_node(cluster, tmp_path):
    pid = cluster.pids()["storage"]
    src = tmp_path / "data.bin"
    src.write_bytes(os.urandom(4 << 20))
    cluster.cli("put", str(src), "/data.bin")
    try:
        threads_before = proc_status(pid, "Threads")
    except FileNotFoundError:  # it died: say why (the supervisor's log names the signal)
        raise AssertionError("storage (pid %d) is gone after a put\n%s" % (pid, cluster.logs()))
    rss_before = proc_status(pid, "VmRSS") << 10

    samples = []
    reads = []
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            samples.append((proc_status(pid, "Threads"), proc_status(pid, "VmRSS") << 10))
            time.sleep(0.2)

    def reader():
        # An ordinary client reads the whole file again and again meanwhile.
        env = dict(os.environ, STOKER_CLUSTER=cluster.url, STOKER_SHORT_CIRCUIT="0")
        while not stop.is_set():
            t0 = time.time()
            p = subprocess.run([STOKER, "cat", "/data.bin"], env=env, capture_output=True,
                               timeout=120)
            reads.append((p.returncode, p.stdout == src.read_bytes(), time.time() - t0))

    ts = [threading.Thread(target=sample), threading.Thread(target=reader)]
    for t in ts:
        t.start()
    try:
        p = subprocess.run([CONNSCALE, "127.0.0.1:%d" % (cluster.port + 2), str(CONNS), "10"],
                           capture_output=True, timeout=300)
    finally:
        stop.set()
        for t in ts:
            t.join()
    out = p.stdout.decode() + p.stderr.decode()
    print(out)
    assert p.returncode == 0, out + cluster.logs()[-3000:]
    res = dict(kv.split("=") for kv in p.stdout.decode().split())
    assert int(res["connected"]) == CONNS and int(res["ok"]) == CONNS, res
    assert int(res["min_per_conn"]) >= 1, res
    # Its threads stayed what they were, its memory within the bound.
    assert samples, "no samples"
    assert all(t == threads_before for t, _ in samples), (threads_before, samples[:20])
    peak = max(r for _, r in samples)
    print("storage node: threads %d, rss %d MiB before, peak %d MiB with %d connections" %
          (threads_before, rss_before >> 20, peak >> 20, CONNS))
    assert peak - rss_before < RSS_GROWTH_BOUND, (rss_before, peak)
    # The ordinary client's reads were answered, right, meanwhile.
    assert reads, "the ordinary client read nothing"
    assert all(rc == 0 and same for rc, same, _ in reads), reads
    # And the node still serves once they are gone.
    assert cluster.cli("cat", "/data.bin").stdout == src.read_bytes()


def loop_requests(cluster, role="storage"):
    """stoker_process_loop_requests_total of a daemon: requests its event loops
    answered themselves (storage: reads of open chunks, through io_uring; meta:
    lookups and attributes)."""
    import urllib.request
    port = cluster.port + {"meta": 11, "storage": 12}[role]
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port,
                                timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("stoker_process_loop_requests_total"):
                return int(float(line.split()[-1]))
    return 0


def read_small_files(cluster, tmp_path, n=24):
    """Writes n small files and reads each back three times over the network (no
    short-circuit), checking every byte; the chunks' files are a second old by the
    second pass, so the node keeps them open from then on."""
    want = {}
    for i in range(n):
        p = tmp_path / ("s%d" % i)
        p.write_bytes(os.urandom(3000 + 4096 * (i % 9) + i))
        want["/s%d" % i] = p.read_bytes()
        cluster.cli("put", str(p), "/s%d" % i)
    time.sleep(1)
    env = dict(os.environ, STOKER_CLUSTER=cluster.url, STOKER_SHORT_CIRCUIT="0")
    for _ in range(3):
        for name, data in want.items():
            got = subprocess.run([STOKER, "cat", name], env=env, capture_output=True,
                                 timeout=60)
            assert got.returncode == 0 and got.stdout == data, (name, got.stderr)


def test_reads_of_open_chunks_are_answered_on_the_loop(cluster, tmp_path):
    """A read of a chunk the storage node keeps open is answered by the event loop
    that read it (io_uring, no worker): byte-exact, and counted. So are the
    lookups of the names on meta."""
    before = loop_requests(cluster)
    meta_before = loop_requests(cluster, "meta")
    read_small_files(cluster, tmp_path)
    served = loop_requests(cluster) - before
    # each `stoker cat` looks its path up: 72 of them
    assert loop_requests(cluster, "meta") - meta_before >= 72
    # the second and third passes: every read of a chunk already open (48), give or
    # take those a worker took because the loop's slots were busy
    assert served >= 24, served


def test_reads_without_loop_reads_still_right(make_cluster, tmp_path, monkeypatch):
    """STOKER_LOOP_READS=0 (or no io_uring): every read goes to the workers, right."""
    monkeypatch.setenv("STOKER_LOOP_READS", "0")
    c = make_cluster()
    monkeypatch.delenv("STOKER_LOOP_READS")
    read_small_files(c, tmp_path)
    assert loop_requests(c) == 0
    assert loop_requests(c, "meta") == 0
