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


def test_ten_thousand_connections_to_one_storage_node(cluster, tmp_path):
    pid = cluster.pids()["storage"]
    src = tmp_path / "data.bin"
    src.write_bytes(os.urandom(4 << 20))
    cluster.cli("put", str(src), "/data.bin")
    threads_before = proc_status(pid, "Threads")
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
