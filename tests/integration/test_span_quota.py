"""Quotas with several metadata shards (docs/quotas.md, "Several shards").

Each shard keeps the quotas of its own folders, and nothing below a quota spans
shards, so that every quota stays exact: a folder made below a quota stays on
the quota's shard whatever its placement setting, a quota is refused on a folder
that holds another shard's folders or files, and a file renamed or hard-linked
across shards must count in the same quota on both sides (none included), else
EXDEV (mv copies). `stoker quota ls` and `recount` see every shard's quotas.

A real two-shard `stoker up` cluster, the CLI and the Python package.
"""
import errno
import json
import os
import signal
import threading
import time

import pytest

from conftest import wait_until
from pyhelp import stoker as stoker_pkg
from test_client_identity import ino_op
from test_meta_xshard import make_xc, shard_of  # noqa: F401 (a fixture)


def quotas(sc):
    return {q["path"]: q for q in json.loads(sc.cli("quota", "ls", "--json").stdout)}


def test_quotas_stay_exact_with_two_shards(make_xc):
    sc = make_xc()
    c = stoker_pkg.connect(sc.url)
    try:
        c.makedirs("/q")
        c.makedirs("/plain")
        c.makedirs("/p")
        sc.cli("shard", "pin", "/", "2")
        c.makedirs("/b")    # on shard 2
        c.makedirs("/n2")   # on shard 2, no quota
        sc.cli("shard", "unpin", "/")
        assert shard_of(c.stat("/b").st_ino) == 2
        sc.cli("quota", "set", "/q", "--inodes", "10", "--bytes", "100M")
        sc.cli("quota", "set", "/b", "--inodes", "100")

        # a folder made below a quota stays on the quota's shard, setting or not
        sc.cli("shard", "pin", "/q", "2")
        c.makedirs("/q/d")
        assert shard_of(c.stat("/q/d").st_ino) == 1
        made = 0
        with pytest.raises(OSError) as e:
            for i in range(20):
                c.write_file("/q/d/f%d" % i, b"x" * 1000)
                made += 1
        assert e.value.errno == errno.EDQUOT
        assert made == 8  # /q, /q/d and 8 files: 10 inodes
        for i in range(made):
            assert c.read_file("/q/d/f%d" % i) == b"x" * 1000

        # every shard's quotas are listed, with their paths (volumes: folders of
        # shard 2 in a folder of shard 1, as CSI makes them under a pinned folder)
        c.makedirs("/vols")
        sc.cli("shard", "pin", "/vols", "2")
        for v in ("v1", "v2"):
            c.makedirs("/vols/" + v)
            assert shard_of(c.stat("/vols/" + v).st_ino) == 2
            sc.cli("quota", "set", "/vols/" + v, "--bytes", "1G")
        q = quotas(sc)
        assert set(q) == {"/q", "/b", "/vols/v1", "/vols/v2"}, q
        assert (q["/q"]["used_inodes"], q["/q"]["used_bytes"]) == (10, 8000)
        assert q["/b"]["used_inodes"] == 1 and shard_of(q["/b"]["ino"]) == 2
        assert json.loads(sc.cli("quota", "ls", "/b", "--json").stdout)[0]["path"] == "/b"

        # files across shards must count in the same quota on both sides
        c.write_file("/b/f", b"in b")
        c.write_file("/plain/f", b"plain")
        c.write_file("/n2/f", b"n2")
        for src, dst in (("/b/f", "/q/in"), ("/q/d/f0", "/b/out"), ("/plain/f", "/b/in"),
                         ("/b/f", "/plain/out")):
            with pytest.raises(OSError) as e:
                c.rename(src, dst)
            assert e.value.errno == errno.EXDEV, (src, dst)
        sc.key_file = os.path.join(sc.data, "cluster.key")
        assert ino_op(sc, sc.key_file, "link", c.stat("/b/f").st_ino, c.stat("/q").st_ino,
                      "linked") == "EXDEV"
        # no quota on either side: a rename across shards, as before
        c.rename("/n2/f", "/plain/g")
        assert c.read_file("/plain/g") == b"n2" and shard_of(c.stat("/plain/g").st_ino) == 2
        # that name of a file of shard 2, moved on within shard 1 into a quota: EXDEV
        with pytest.raises(OSError) as e:
            c.rename("/plain/g", "/q/d/g")
        assert e.value.errno == errno.EXDEV
        c.rename("/plain/g", "/plain/h")  # within the folder, or to one of no quota: as before
        assert c.read_file("/plain/h") == b"n2"
        assert c.read_file("/b/f") == b"in b" and c.read_file("/plain/f") == b"plain"
        q = quotas(sc)
        assert (q["/q"]["used_inodes"], q["/q"]["used_bytes"]) == (10, 8000)
        assert (q["/b"]["used_inodes"], q["/b"]["used_bytes"]) == (2, 4)

        # a quota over a folder that holds another shard's folder: refused, nothing set
        sc.cli("shard", "pin", "/p", "2")
        c.makedirs("/p/x")
        assert shard_of(c.stat("/p/x").st_ino) == 2
        p = sc.cli("quota", "set", "/p", "--inodes", "5", check=False)
        assert p.returncode != 0 and b"cross-device" in p.stderr, p.stderr
        assert set(quotas(sc)) == {"/q", "/b", "/vols/v1", "/vols/v2"}
    finally:
        c.close()

    # recount sees both shards' quotas and finds nothing to fix
    p = sc.cli("quota", "recount")
    assert b"4 quota(s) recounted, 0 fixed" in p.stdout, p.stdout
    assert b"/b: correct" in p.stdout and b"/vols/v2: correct" in p.stdout, p.stdout

    # kill -9 of shard 2's meta while a writer makes files in /b: the usage of
    # shard 2's quota is exact after its restart (what is there, not more or less)
    addr2 = sc.meta_addr(2)
    pid2 = sc.meta_pid(addr2)
    stop = threading.Event()

    def writer():
        w = stoker_pkg.connect(sc.url)
        try:
            for i in range(100000):
                if stop.is_set():
                    break
                try:
                    w.write_file("/b/k%d" % i, b"k" * 100)
                except OSError:
                    time.sleep(0.05)
        finally:
            w.close()

    t = threading.Thread(target=writer)
    t.start()
    try:
        wait_until(lambda: quotas(sc)["/b"]["used_inodes"] > 20, 60, "the writer to write")
        os.kill(pid2, signal.SIGKILL)
        sc.wait("shard 2's meta back", lambda: sc.meta_pid(addr2) not in (None, pid2) and
                quotas(sc)["/b"]["used_inodes"] > 0)
        time.sleep(1)
    finally:
        stop.set()
        t.join(120)
    c = stoker_pkg.connect(sc.url)
    try:
        names = c.listdir("/b")
        sizes = sum(c.stat("/b/" + n).st_size for n in names)
    finally:
        c.close()
    q = quotas(sc)["/b"]
    assert (q["used_inodes"], q["used_bytes"]) == (1 + len(names), sizes), (q, len(names))
    p = sc.cli("quota", "recount")
    assert b"4 quota(s) recounted, 0 fixed" in p.stdout, p.stdout
