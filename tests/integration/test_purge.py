"""Meta removes the chunks of the files it frees (src/meta/purge.h): a client killed
right after its unlink or rename leaks nothing, a meta killed in the middle of a
purge finishes it after its restart, a file unlinked while open goes at its last
close, and quotas count exactly what is left."""
import json
import os
import signal
import subprocess

from conftest import wait_until
from pyhelp import PYTHON, env_for, stoker
from test_metrics import scrape, total

MiB = 1 << 20

# Does each "unlink:PATH" / "rename:SRC:DST" of argv, then kills itself at once: its
# client has no time to do anything after meta answered.
KILLED = r"""
import os, signal, sys, stoker
c = stoker.connect()
for op in sys.argv[1:]:
    how, *paths = op.split(":")
    if how == "unlink":
        c.unlink(paths[0])
    else:
        c.rename(paths[0], paths[1])
os.kill(os.getpid(), signal.SIGKILL)
"""


def killed_client(cluster, *ops):
    p = subprocess.run([PYTHON, "-c", KILLED] + list(ops), env=env_for(cluster),
                       capture_output=True, timeout=300)
    assert p.returncode == -signal.SIGKILL, p.stderr.decode(errors="replace")


def meta_metric(cluster, name):
    samples, _ = scrape(cluster, "meta")
    return int(total(samples, name))


def test_a_killed_clients_unlink_and_rename_leave_no_chunks(cluster):
    c = stoker.connect(cluster.url)
    try:
        keep = os.urandom(3 * MiB + 5)
        c.write_file("/keep", keep)
        kept = len(cluster.chunk_files())
        c.write_file("/big", os.urandom(24 * MiB))
        c.write_file("/old", os.urandom(2 * MiB))
        c.write_file("/new", b"the new one")
        assert len(cluster.chunk_files()) == kept + 24 + 2 + 1
        files0 = meta_metric(cluster, "stoker_meta_purged_files_total")
        bytes0 = meta_metric(cluster, "stoker_meta_purged_bytes_total")
        killed_client(cluster, "unlink:/big", "rename:/new:/old")
        wait_until(lambda: len(cluster.chunk_files()) == kept + 1, timeout=30,
                   what="meta to remove the chunks of the killed client's files")
        assert meta_metric(cluster, "stoker_meta_purged_files_total") - files0 == 2
        assert meta_metric(cluster, "stoker_meta_purged_bytes_total") - bytes0 == 26 * MiB
        assert meta_metric(cluster, "stoker_meta_purge_queue") == 0
        assert c.read_file("/keep") == keep
        assert c.read_file("/old") == b"the new one"
    finally:
        c.close()


def quota(cluster, path):
    return json.loads(cluster.cli("quota", "ls", path, "--json").stdout)[0]


def test_a_purge_cut_by_a_meta_kill_finishes_after_the_restart(monkeypatch, make_cluster):
    # Slow enough that meta is killed with most of the files still to purge.
    monkeypatch.setenv("STOKER_PURGE_RATE", "100")
    cluster = make_cluster()
    n = 700
    c = stoker.connect(cluster.url)
    try:
        c.write_file("/keep", b"kept")
        c.mkdir("/q")
        cluster.cli("quota", "set", "/q", "--inodes", "10000")
        kept = len(cluster.chunk_files())
        for i in range(n):
            c.write_file("/q/f%d" % i, b"x" * (i + 1))
        assert len(cluster.chunk_files()) == kept + n
        q = quota(cluster, "/q")
        assert (q["used_inodes"], q["used_bytes"]) == (n + 1, n * (n + 1) // 2)
        killed_client(cluster, *["unlink:/q/f%d" % i for i in range(n)])
        # Usage goes down with the inodes, before any chunk does.
        q = quota(cluster, "/q")
        assert (q["used_inodes"], q["used_bytes"]) == (1, 0)
        wait_until(lambda: meta_metric(cluster, "stoker_meta_purged_files_total") > 0,
                   timeout=30, what="the purge to begin")
        left = meta_metric(cluster, "stoker_meta_purge_queue")
        assert 0 < left < n
        meta = cluster.pids()["meta"]
        os.kill(meta, signal.SIGKILL)
        wait_until(lambda: cluster.pids().get("meta", meta) != meta, timeout=120,
                   what="stoker up to restart meta")
        wait_until(lambda: len(cluster.chunk_files()) == kept, timeout=60,
                   what="the restarted meta to finish the purge")
        wait_until(lambda: meta_metric(cluster, "stoker_meta_purge_queue") == 0, timeout=30,
                   what="the purge queue to empty")
        q = quota(cluster, "/q")
        assert (q["used_inodes"], q["used_bytes"]) == (1, 0)
        assert c.read_file("/keep") == b"kept"
        assert c.listdir("/q") == []
    finally:
        c.close()


def test_a_file_unlinked_while_open_is_purged_at_its_last_close(cluster):
    c = stoker.connect(cluster.url)
    try:
        data = os.urandom(5 * MiB + 17)
        c.write_file("/f", data)
        before = len(cluster.chunk_files())
        f = c.open("/f")
        try:
            killed_client(cluster, "unlink:/f")
            assert not c.exists("/f")
            # meta keeps the orphan while this client holds it, whatever the purger does.
            wait_until(lambda: meta_metric(cluster, "stoker_meta_purge_queue") == 0,
                       timeout=10, what="an empty purge queue")
            assert len(cluster.chunk_files()) == before
            assert f.read() == data
        finally:
            f.close()
        wait_until(lambda: len(cluster.chunk_files()) == before - 6, timeout=30,
                   what="the orphan's chunks to go at its last close")
    finally:
        c.close()
