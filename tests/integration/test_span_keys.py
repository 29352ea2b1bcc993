"""Client keys confined to a subtree, across metadata shards (docs/security.md,
"Subtrees across shards"; src/meta/span.c).

A two-shard `stoker up` cluster with its cluster key. The subtree key's folder
/t lives on shard 1; folders placed below it live on shard 2 (and one of shard 1
below one of shard 2), and a file of shard 1 is renamed into a folder of shard 2
below /t. Meta walks an inode's parents over both shards, so the key reaches all
of those through the Python package, stk_check (requests by inode number) and the
mount, and storage (which asks shard 1's META_WITHIN about every shard's files)
serves their chunks; a folder of shard 2 outside /t is refused by number,
whichever shard the request goes to. A folder moved out of /t on shard 1, above
a folder of shard 2, is refused within the bounds the docs give.
"""
import os
import time

from conftest import CHECK, Mount, have_fuse, run, wait_until
from pyhelp import stoker as stoker_pkg
from test_client_identity import add_client, as_client, ino_op, lookup_ino, py_client
from test_meta_xshard import make_xc, shard_of  # noqa: F401 (a fixture)


def chunk(sc, key, ino, op="read"):
    """A chunk request for ino straight to storage, as the holder of key."""
    env = dict(os.environ, STOKER_KEY_FILE=key)
    p = run([CHECK, "chunk", "127.0.0.1:%d" % (sc.port + 2), str(ino), op], env=env)
    return p.stdout.decode().split()[-1]


def make_tree(sc):
    """/t (shard 1) with d on shard 2, d/back on shard 1, x (shard 1) with x/y on
    shard 2; /u (shard 1) with e on shard 2; a file of shard 1 renamed into t/d."""
    sc.key_file = os.path.join(sc.data, "cluster.key")
    c = stoker_pkg.connect(sc.url)
    try:
        c.makedirs("/t/x")
        c.makedirs("/u")
        for path in ("/t", "/u", "/t/x"):
            sc.cli("shard", "pin", path, "2")
        c.makedirs("/t/d")
        c.makedirs("/t/x/y")
        c.makedirs("/u/e")
        sc.cli("shard", "pin", "/t/d", "1")
        c.makedirs("/t/d/back")
        c.write_file("/t/d/f", b"in d")
        c.write_file("/t/d/back/b", b"in back")
        c.write_file("/t/x/y/h", b"in y")
        c.write_file("/u/e/g", b"outside")
        c.write_file("/u/moved", b"renamed in")
        c.rename("/u/moved", "/t/d/moved")  # a file of shard 1, named on shard 2
        ino = {p: c.stat(p).st_ino for p in ("/t", "/t/x", "/t/d", "/t/d/back", "/t/x/y",
                                             "/u/e", "/t/d/f", "/t/d/back/b", "/t/x/y/h",
                                             "/u/e/g", "/t/d/moved")}
    finally:
        c.close()
    where = {p: shard_of(i) for p, i in ino.items()}
    assert where == {"/t": 1, "/t/x": 1, "/t/d": 2, "/t/d/back": 1, "/t/x/y": 2, "/u/e": 2,
                     "/t/d/f": 2, "/t/d/back/b": 1, "/t/x/y/h": 2, "/u/e/g": 2,
                     "/t/d/moved": 1}, where
    return ino


def test_a_subtree_key_reaches_its_folders_on_every_shard(make_xc, tmp_path):
    sc = make_xc()
    ino = make_tree(sc)
    key = add_client(sc, tmp_path, "alice", "--subtree", "/t")

    # by name, through the Python package: reads, writes, creates on shard 2
    out = py_client(sc, key, r"""
print(sorted(c.listdir('/')))
print(sorted(c.listdir('/d')))
print(c.read_file('/d/f').decode())
print(c.read_file('/d/back/b').decode())
print(c.read_file('/x/y/h').decode())
print(c.read_file('/d/moved').decode())
c.write_file('/d/new', b'made on shard 2')
print(c.read_file('/d/new').decode())
c.makedirs('/d/sub/deeper')
c.write_file('/d/sub/deeper/z', b'deep')
print(c.read_file('/d/sub/deeper/z').decode())
c.write_file('/d/moved', b'rewritten')
print(c.read_file('/d/moved').decode())
c.rename('/d/new', '/d/sub/new')
print(sorted(c.listdir('/d/sub')))
""")
    assert out == ["['d', 'x']", "['back', 'f', 'moved']", "in d", "in back", "in y",
                   "renamed in", "made on shard 2", "deep", "rewritten", "['deeper', 'new']"]

    # by number: inside on either shard OK, outside refused on either shard
    for args in (("getattr", ino["/t/d"]), ("getattr", ino["/t/d/f"]),
                 ("getattr", ino["/t/d/back/b"]), ("getattr", ino["/t/x/y/h"]),
                 ("getattr", ino["/t/d/moved"]), ("readdir", ino["/t/d"]),
                 ("readdir", ino["/t/d/back"]), ("lookup", ino["/t/d"], "f")):
        assert ino_op(sc, key, *args) == "OK", args
    e, g = ino["/u/e"], ino["/u/e/g"]
    for args in (("getattr", e), ("getattr", g), ("readdir", e), ("read", g), ("chmod", g),
                 ("chmod", e), ("setxattr", g), ("lookup", e, "g"), ("create", e, "x"),
                 ("mkdir", e, "x"), ("unlink", e, "g"), ("link", g, 1, "stolen"),
                 ("rename", e, "g", 1, "g"), ("rename", ino["/t/d"], "f", e, "f"),
                 ("link", ino["/t/d/f"], e, "leak")):
        assert ino_op(sc, key, *args) == "EACCES", args
    assert ino_op(sc, key, "getattrs", g) == "ENOENT"  # a batch answers it as missing

    # storage asks shard 1, which walks both shards
    for name in ("/t/d/f", "/t/d/back/b", "/t/x/y/h", "/t/d/moved"):
        assert chunk(sc, key, ino[name]) != "EACCES", name
    for op in ("read", "truncate", "prefetch"):
        assert chunk(sc, key, g, op) == "EACCES", op

    # the administrator's view: nothing outside changed
    c = stoker_pkg.connect(sc.url)
    try:
        assert c.listdir("/u/e") == ["g"] and c.read_file("/u/e/g") == b"outside"
        assert c.read_file("/t/d/sub/new") == b"made on shard 2"
    finally:
        c.close()

    if have_fuse():
        m = Mount(sc, tmp_path / "mnt", opts=["key=" + key])
        m.start()
        try:
            assert sorted(os.listdir(m.path)) == ["d", "x"]
            assert os.stat(os.path.join(m.path, "d")).st_ino == ino["/t/d"]
            with open(os.path.join(m.path, "x", "y", "h"), "rb") as f:
                assert f.read() == b"in y"
            with open(os.path.join(m.path, "d", "mounted"), "wb") as f:
                f.write(b"m" * 100000)
            os.mkdir(os.path.join(m.path, "x", "y", "made"))
            with open(os.path.join(m.path, "d", "mounted"), "rb") as f:
                assert f.read() == b"m" * 100000
            assert sorted(os.listdir(os.path.join(m.path, "x", "y"))) == ["h", "made"]
        finally:
            m.stop()

    # A folder of shard 1 above a folder of shard 2 moved out of /t (a rename on
    # shard 1): what lies below it on shard 2 is refused by meta within a second
    # (the other shard's answer kept) and by storage within its 5 s.
    h = ino["/t/x/y/h"]
    assert ino_op(sc, key, "getattr", h) == "OK" and chunk(sc, key, h) != "EACCES"
    sc.cli("mv", "/t/x", "/u/x")
    t0 = time.monotonic()
    wait_until(lambda: ino_op(sc, key, "getattr", h) == "EACCES", 10,
               "meta to refuse a file of shard 2 moved out with its folder's parent")
    assert time.monotonic() - t0 < 5
    wait_until(lambda: chunk(sc, key, h) == "EACCES", 10,
               "storage to refuse a file of shard 2 moved out")
    assert time.monotonic() - t0 < 8
    assert ino_op(sc, key, "readdir", ino["/t/x/y"]) == "EACCES"
    out = py_client(sc, key, "print(sorted(c.listdir('/')))\n")
    assert out == ["['d']"]
    # and moved back in: reached again at once (a no is never kept)
    sc.cli("mv", "/u/x", "/t/x")
    assert ino_op(sc, key, "getattr", h) == "OK"


def test_a_subtree_whose_folder_is_on_another_shard_is_refused_clearly(make_xc, tmp_path):
    sc = make_xc()
    sc.key_file = os.path.join(sc.data, "cluster.key")
    sc.cli("shard", "pin", "/", "2")
    sc.cli("mkdir", "/far")
    sc.cli("shard", "unpin", "/")
    assert shard_of(lookup_ino(sc, sc.key_file, 1, "far")) == 2
    key = add_client(sc, tmp_path, "bob", "--subtree", "/far")
    p = as_client(sc, key, "ls", "/")
    assert p.returncode != 0 and b"not supported" in p.stderr, p.stderr
    assert b"must be on shard 1" in open(os.path.join(sc.data, "log", "meta.log"), "rb").read()
