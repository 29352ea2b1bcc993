"""A meta node serves a shard only with that shard's own data (issue 21, part 2).

A second meta with an empty store, started beside the first, is refused; the first
killed, the second restarted: it is refused again instead of taking shard 1 (which
lost the namespace, handed out inode numbers 2 and 3 again, and let a client's
reaper delete the old files' chunks). The first restarted: every file reads back
byte-exact and no chunk file was removed. `stoker status` names the refused node
and says that the namespace waits for its meta node.
"""
import os
import re
import time

from conftest import CHECK, STOKER, run


def chunk_files(rc):
    """Every chunk file on the storage nodes' targets, with its size."""
    out = {}
    for node in rc.nodes.values():
        for t in getattr(node, "targets", []):
            for root, _, files in os.walk(t):
                for f in files:
                    p = os.path.join(root, f)
                    out[p] = os.path.getsize(p)
    return out


def wait_status(rc, pred, timeout=40):
    deadline = time.time() + timeout
    out = ""
    while time.time() < deadline:
        out = rc.status()
        if pred(out):
            return out
        time.sleep(0.3)
    raise AssertionError("status never matched:\n%s\n%s" % (out, rc.logs()))


def node_id(out, addr):
    for line in out.split("Nodes")[1].split("Targets")[0].splitlines():
        f = line.split()
        if len(f) >= 4 and f[1] == "meta" and f[3] == addr:
            return int(f[0])
    return None


def test_second_meta_never_takes_the_namespace(role_cluster):
    rc = role_cluster
    rc.add_meta("meta1")
    rc.add_storage("st1", targets=2)
    rc.start_all()
    rc.wait_serving()

    files = {"/a": os.urandom(5000), "/b": os.urandom(300000), "/c": os.urandom(70000)}
    for name, data in files.items():
        rc.cli("put", "-", name, input=data)
    before = chunk_files(rc)
    assert before, "the files left no chunk files to watch"
    out = rc.status()
    meta1_id = node_id(out, rc.nodes["meta1"].addr)
    assert meta1_id is not None, out

    # A second meta node with its own, empty data folder: refused, and it exits.
    meta2 = rc.add_meta("meta2")
    rc.start("meta2")
    assert meta2.proc.wait(timeout=30) != 0, rc.logs()
    with open(meta2.log, errors="replace") as f:
        assert "refused" in f.read()
    out = rc.status()
    meta2_id = node_id(out, meta2.addr)
    assert meta2_id is not None and meta2_id != meta1_id, out
    assert re.search(r"node %d \(%s, \w+\): refused: its store is namespace [0-9a-f]{32}, "
                     r"not shard 1's namespace [0-9a-f]{32}" % (meta2_id, re.escape(meta2.addr)),
                     out), out

    # The first one goes away: shard 1 waits for it.
    rc.kill("meta1")
    out = wait_status(rc, lambda o: "shard 1's meta node %d" % meta1_id in o and
                      "is offline: the namespace is unavailable until it returns" in o)

    # The second, restarted, is refused again and shard 1 stays with the first.
    rc.start("meta2")
    assert meta2.proc.wait(timeout=30) != 0, rc.logs()
    out = rc.status()
    shard = out.split("Metadata shards")[1].splitlines()[2].split()
    assert shard[0] == "1" and shard[1] == str(meta1_id), out
    assert "node %d (%s" % (meta2_id, meta2.addr) in out and "refused" in out, out

    # A client now finds no namespace to change: new files and removals fail
    # (before the fix they went to the empty store, and removing its new inodes 2
    # and 3 deleted the chunks of /a and /b).
    env = dict(rc.env(), STOKER_RETRY_MS="2000")
    for name in ("/new1", "/new2"):
        p = run([STOKER, "put", "-", name], input=b"x" * 4096, env=env, check=False,
                timeout=120)
        assert p.returncode != 0, "a put reached a namespace while shard 1's meta was away"
    run([STOKER, "rm", "/new1", "/new2"], env=env, check=False, timeout=120)
    assert chunk_files(rc) == before, "chunks changed while shard 1's meta was away"

    # The first one back: everything as it was.
    rc.start("meta1")
    rc.wait_serving()
    wait_status(rc, lambda o: "is offline: the namespace" not in o)
    for name, data in files.items():
        assert rc.cli("cat", name).stdout == data, name
    assert chunk_files(rc) == before
    out = rc.cli("ls", "/").stdout.decode().split()
    assert sorted(out) == ["a", "b", "c"], out
    with open(rc.nodes["mgmtd"].log, errors="replace") as f:
        log = f.read()
    assert "meta node %d (%s) refused" % (meta2_id, meta2.addr) in log


def test_chunk_removal_is_fenced_by_namespace(role_cluster):
    """Storage removes chunks only for a request naming shard 1's namespace: one
    naming none or another (a stranger meta's client) removes nothing, while the
    namespace's own removals still work."""
    rc = role_cluster
    rc.add_meta("meta1")
    st = rc.add_storage("st1", targets=2)
    rc.start_all()
    rc.wait_serving()
    data = os.urandom(3 * 1024 * 1024 + 17)
    rc.cli("put", "-", "/victim", input=data)
    rc.cli("put", "-", "/gone", input=os.urandom(200000))
    ino = rc.cli("stat", "/victim").stdout.decode().split("Inode:")[1].split()[0]
    before = chunk_files(rc)
    run([CHECK, "fence", st.addr, ino, "2"])
    assert chunk_files(rc) == before
    assert rc.cli("cat", "/victim").stdout == data
    # The namespace's own client still removes what it unlinks.
    rc.cli("rm", "/gone")
    after = chunk_files(rc)
    assert set(after) < set(before), "rm removed no chunk"
    assert rc.cli("cat", "/victim").stdout == data
    with open(st.log, errors="replace") as f:
        assert "chunk removal of inode" in f.read()
