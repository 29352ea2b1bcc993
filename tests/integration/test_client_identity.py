"""Client identities (docs/security.md, "Client keys"): `stoker admin client add`
issues keys that confine a client to a subtree, read-only, or with root (or every
user) squashed, and meta and storage enforce them; `client rm` revokes a key.

Every test runs a real `stoker up` cluster (with its cluster key) and real clients:
the CLI, the C client through stoker_ll.h (stk_check ino: requests by inode number
as a client may craft them), the Python package, a FUSE mount and the S3 gateway.
The administrator's view (the cluster key) checks that nothing outside changed.
"""
import errno
import json
import os
import time
import urllib.request

import pytest

from conftest import CHECK, ROOT, STOKER, have_fuse, run, wait_until
from test_mount import meta_figure

# The package always comes from the release build, as in pyhelp.py: an ASan-built
# extension cannot be loaded into an uninstrumented python.
PYPATH = os.environ.get("STOKER_PYDIR") or os.path.join(ROOT, "build", "python")


def add_client(cluster, tmp_path, name, *flags):
    key = str(tmp_path / (name + ".key"))
    p = cluster.cli("admin", "client", "add", name, "--key-out", key, *flags)
    assert b"added" in p.stdout, p.stdout
    assert os.stat(key).st_mode & 0o777 == 0o600
    return key


def as_client(cluster, key, *args, check=False):
    """The CLI as the holder of client key `key` (and nothing else)."""
    env = dict(os.environ, STOKER_CLUSTER=cluster.url, STOKER_KEY_FILE=key)
    return run([STOKER] + list(args), check=check, env=env)


def ino_op(cluster, key, *args):
    """stk_check ino: one request by inode number; the errno's name it met."""
    env = dict(os.environ, STOKER_CLUSTER=cluster.url, STOKER_KEY_FILE=key)
    p = run([CHECK, "ino", cluster.url] + [str(a) for a in args], env=env)
    return p.stdout.decode().strip().splitlines()[-1]


def lookup_ino(cluster, key, parent, name):
    env = dict(os.environ, STOKER_CLUSTER=cluster.url, STOKER_KEY_FILE=key)
    out = run([CHECK, "ino", cluster.url, "lookup", str(parent), name], env=env).stdout.decode()
    assert out.splitlines()[-1] == "OK", out
    return int(out.split()[1])


def py_client(cluster, key, code):
    """Runs `code` in a Python process holding client key `key` (c: the client);
    returns what it prints, one value per line."""
    env = dict(os.environ, STOKER_CLUSTER=cluster.url, STOKER_KEY_FILE=key,
               PYTHONPATH=PYPATH)
    prog = "import errno, stoker\nc = stoker.connect()\n" + code
    p = run(["/usr/bin/python3", "-c", prog], env=env, check=False)
    assert p.returncode == 0, p.stderr.decode()
    return p.stdout.decode().split("\n")[:-1]


def metric(cluster, offset, name, reason):
    """A daemon's counter: offset 0 mgmtd, 1 meta, 2 storage (metrics 10 ports up)."""
    text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % (cluster.port + offset + 10),
                                  timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith('%s{reason="%s"}' % (name, reason)):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no %s{reason=%s} in /metrics" % (name, reason))


def tree(cluster):
    """The administrator's view of the whole namespace: path -> (mode, uid, gid, bytes)."""
    env = dict(os.environ, STOKER_CLUSTER=cluster.url, STOKER_KEY_FILE=cluster.key_file,
               PYTHONPATH=PYPATH)
    prog = ("import stoker, json\nc = stoker.connect()\nout = {}\n"
            "for d, dirs, files in c.walk('/'):\n"
            "    for n in dirs + files:\n"
            "        p = d.rstrip('/') + '/' + n\n"
            "        st = c.stat(p)\n"
            "        out[p] = [st.st_mode, st.st_uid, st.st_gid,\n"
            "                  c.read_file(p).hex() if n in files and (st.st_mode & 0o170000) == 0o100000 else '']\n"
            "print(json.dumps(out, sort_keys=True))\n")
    return json.loads(run(["/usr/bin/python3", "-c", prog], env=env).stdout)


def setup_teams(cluster, tmp_path):
    src = tmp_path / "hello.txt"
    src.write_bytes(b"hello\n")
    cluster.cli("mkdir", "/teamA", "/teamA/sub", "/teamB", "/open")
    cluster.cli("put", str(src), "/teamA/a.txt")
    cluster.cli("put", str(src), "/teamB/b.txt")


def test_subtree_client_reaches_nothing_outside(cluster, tmp_path, make_mount):
    setup_teams(cluster, tmp_path)
    key = add_client(cluster, tmp_path, "alice", "--subtree", "/teamA")
    admin = cluster.key_file
    team_b = lookup_ino(cluster, admin, 1, "teamB")
    b_txt = lookup_ino(cluster, admin, team_b, "b.txt")
    team_a = lookup_ino(cluster, admin, 1, "teamA")
    before = tree(cluster)

    # Its root is /teamA: what is outside has no name for it.
    p = as_client(cluster, key, "ls", "/", check=True)
    assert sorted(p.stdout.decode().split()) == ["a.txt", "sub"]
    assert as_client(cluster, key, "cat", "/a.txt", check=True).stdout == b"hello\n"
    for path in ("/../teamB/b.txt", "/sub/../../teamB/b.txt", "/teamB/b.txt"):
        p = as_client(cluster, key, "cat", path)
        assert p.returncode != 0 and b"No such file" in p.stderr, (path, p.stderr)
    # ".." of its root is its root (a lookup the client sends as is)
    assert ino_op(cluster, key, "lookup", 1, "a.txt") == "OK"
    # Requests crafted by inode number: every kind refused.
    for args in (("getattr", team_b), ("getattr", b_txt), ("readdir", team_b), ("read", b_txt),
                 ("chmod", b_txt), ("chmod", team_b), ("setxattr", b_txt),
                 ("lookup", team_b, "b.txt"), ("create", team_b, "x"), ("mkdir", team_b, "x"),
                 ("unlink", team_b, "b.txt"), ("link", b_txt, 1, "stolen"),
                 ("rename", team_b, "b.txt", 1, "b.txt"), ("rename", 1, "a.txt", team_b, "a"),
                 ("link", lookup_ino(cluster, key, 1, "a.txt"), team_b, "leak")):
        assert ino_op(cluster, key, *args) == "EACCES", args
    # a batched getattr answers the outside inode alone as missing
    assert ino_op(cluster, key, "getattrs", b_txt) == "ENOENT"
    # its own tree works as usual, by name and by number
    assert ino_op(cluster, key, "getattr", team_a) == "OK"
    assert ino_op(cluster, key, "mkdir", 1, "made") == "OK"
    assert ino_op(cluster, key, "rename", 1, "made", lookup_ino(cluster, key, 1, "sub"),
                  "moved") == "OK"
    assert metric(cluster, 1, "stoker_client_refused_total", "outside") >= 15
    # Chunk requests straight to storage: storage asks meta whose the inode is.
    env = dict(os.environ, STOKER_KEY_FILE=key)
    storage = "127.0.0.1:%d" % (cluster.port + 2)
    for op in ("read", "truncate", "prefetch"):
        p = run([CHECK, "chunk", storage, str(b_txt), op], env=env)
        assert p.stdout.decode().split()[-1] == "EACCES", (op, p.stdout)
        p = run([CHECK, "chunk", storage, str(lookup_ino(cluster, key, 1, "a.txt")), op],
                env=env)
        assert p.stdout.decode().split()[-1] != "EACCES", (op, p.stdout)
    assert metric(cluster, 2, "stoker_client_refused_total", "outside") == 3

    after = tree(cluster)
    after.pop("/teamA/sub/moved")
    assert after == before  # nothing outside changed, nothing inside but what it made

    if have_fuse():
        # The mount shows /teamA as its root.
        m = make_mount(cluster, "alice", opts=["key=" + key])
        batched = meta_figure(cluster, "stoker_rpc_requests_total", op="META_LOOKUPS")
        listed = {e.name: e.is_dir() for e in os.scandir(m.path)}  # readdirplus
        assert listed == {"a.txt": False, "sub": True}
        # the listing's names were looked up in a batch, confined like one lookup
        assert meta_figure(cluster, "stoker_rpc_requests_total", op="META_LOOKUPS") > batched
        assert sorted(os.listdir(m.path)) == ["a.txt", "sub"]
        assert os.stat(m.path).st_ino == team_a
        with open(os.path.join(m.path, "a.txt"), "rb") as f:
            assert f.read() == b"hello\n"
        # a symlink is resolved by the client: against its own root
        os.symlink("../teamB/b.txt", os.path.join(m.path, "rel"))
        os.symlink("/teamB/b.txt", os.path.join(m.path, "abs"))
        assert not os.path.exists(os.path.join(m.path, "rel"))
        assert not os.path.exists(os.path.join(m.path, "abs"))
        p = as_client(cluster, key, "cat", "/rel")
        assert p.returncode != 0 and b"No such file" in p.stderr
        p = as_client(cluster, key, "cat", "/abs")
        assert p.returncode != 0 and b"No such file" in p.stderr
        with open(os.path.join(m.path, "sub", "new.txt"), "wb") as f:
            f.write(b"mine")
        assert tree(cluster)["/teamA/sub/new.txt"][3] == b"mine".hex()


def test_read_only_client_changes_nothing(cluster, tmp_path, make_mount):
    setup_teams(cluster, tmp_path)
    key = add_client(cluster, tmp_path, "reader", "--read-only")
    before = tree(cluster)
    storage_before = metric(cluster, 2, "stoker_client_refused_total", "read_only")

    out = py_client(cluster, key, r"""
print(c.read_file('/teamB/b.txt').decode().strip())
def tryit(fn):
    try:
        fn()
        print('OK')
    except OSError as e:
        print(errno.errorcode[e.errno])
tryit(lambda: c.write_file('/teamB/new', b'x'))
tryit(lambda: c.write_file('/teamB/b.txt', b'x'))
tryit(lambda: c.makedirs('/teamB/d'))
tryit(lambda: c.remove('/teamB/b.txt'))
tryit(lambda: c.rmtree('/teamA/sub'))
def overwrite():
    f = c.open('/teamB/b.txt', 'r+b')   # meta registers the open; storage refuses the write
    f.write(b'XY')
    f.close()
tryit(overwrite)
""")
    assert out[0] == "hello"
    assert out[1:] == ["EROFS"] * 6, out
    # the overwrite reached storage, which refused it
    assert metric(cluster, 2, "stoker_client_refused_total", "read_only") > storage_before

    b_txt = lookup_ino(cluster, key, lookup_ino(cluster, key, 1, "teamB"), "b.txt")
    for args in (("chmod", b_txt), ("setxattr", b_txt), ("create", 1, "x"), ("mkdir", 1, "x"),
                 ("unlink", lookup_ino(cluster, key, 1, "teamB"), "b.txt"),
                 ("link", b_txt, 1, "hl"), ("rename", 1, "teamA", 1, "teamC")):
        assert ino_op(cluster, key, *args) == "EROFS", args
    for args in (("getattr", b_txt), ("read", b_txt), ("readdir", 1)):
        assert ino_op(cluster, key, *args) == "OK", args
    p = as_client(cluster, key, "mv", "/teamA", "/teamC")
    assert p.returncode != 0 and b"Read-only file system" in p.stderr

    if have_fuse():
        m = make_mount(cluster, "reader", opts=["key=" + key])
        path = os.path.join(m.path, "teamB", "b.txt")
        with open(path, "rb") as f:
            assert f.read() == b"hello\n"
        for fn, args in ((open, (path, "ab")), (os.mkdir, (os.path.join(m.path, "q"),)),
                         (os.unlink, (path,)), (os.chmod, (path, 0o777)),
                         (os.rename, (path, path + "2")), (os.link, (path, path + "3")),
                         (os.symlink, ("x", path + "4")), (os.truncate, (path, 0)),
                         (os.setxattr, (path, "user.a", b"1"))):
            with pytest.raises(OSError) as e:
                fn(*args)
            assert e.value.errno == errno.EROFS, (fn, args)
    assert tree(cluster) == before


def test_squash_root_and_all(cluster, tmp_path, make_mount):
    if os.getuid() != 0:
        pytest.skip("squashing root needs a root caller")
    if not have_fuse():
        pytest.skip("needs a mount to chmod as the administrator")
    setup_teams(cluster, tmp_path)
    root_key = add_client(cluster, tmp_path, "sqroot", "--squash-root")
    all_key = add_client(cluster, tmp_path, "sqall", "--squash-all", "--anon-uid", "1234",
                         "--anon-gid", "4321")
    plain = add_client(cluster, tmp_path, "plain")
    m = make_mount(cluster, "admin")  # the cluster key: /open for everyone
    os.chmod(os.path.join(m.path, "open"), 0o777)

    # root squashed: it acts as nobody (65534), so root's folders are closed to it
    p = as_client(cluster, root_key, "put", str(tmp_path / "hello.txt"), "/teamA/x")
    assert p.returncode != 0 and b"Permission denied" in p.stderr
    as_client(cluster, root_key, "put", str(tmp_path / "hello.txt"), "/open/r.txt", check=True)
    as_client(cluster, all_key, "put", str(tmp_path / "hello.txt"), "/open/a.txt", check=True)
    as_client(cluster, plain, "put", str(tmp_path / "hello.txt"), "/open/p.txt", check=True)
    t = tree(cluster)
    assert t["/open/r.txt"][1:3] == [65534, 65534]
    assert t["/open/a.txt"][1:3] == [1234, 4321]
    assert t["/open/p.txt"][1:3] == [0, 0]  # no squash: root stays root
    # a squashed root may not chmod what root owns either
    assert ino_op(cluster, root_key, "chmod",
                  lookup_ino(cluster, plain, 1, "teamA")) == "EPERM"

    # through a mount too
    sq = make_mount(cluster, "sq", opts=["key=" + root_key])
    with open(os.path.join(sq.path, "open", "m.txt"), "wb") as f:
        f.write(b"m")
    st = os.stat(os.path.join(m.path, "open", "m.txt"))
    assert (st.st_uid, st.st_gid) == (65534, 65534)
    with pytest.raises(PermissionError):
        open(os.path.join(sq.path, "teamA", "no.txt"), "wb")


def test_removed_and_forged_keys_are_refused(cluster, tmp_path, make_mount):
    setup_teams(cluster, tmp_path)
    key = add_client(cluster, tmp_path, "bob", "--subtree", "/teamA", "--read-only")
    assert as_client(cluster, key, "ls", "/").returncode == 0
    m = make_mount(cluster, "bob", opts=["key=" + key, "timeout=2"]) if have_fuse() else None
    if m:
        assert sorted(os.listdir(m.path)) == ["a.txt", "sub"]

    # A key whose policy was edited proves nothing: wider subtree, or read-write.
    text = open(key).read()
    for old, new in (("subtree /teamA", "subtree /"), ("flags 1", "flags 0"),
                     ("name bob", "name bobby"), ("gen 1", "gen 2")):
        assert old in text
        forged = tmp_path / ("forged-%d.key" % len(new))
        forged.write_text(text.replace(old, new))
        os.chmod(forged, 0o600)
        p = as_client(cluster, str(forged), "ls", "/")
        assert p.returncode != 0 and b"refused" in p.stderr, (old, p.stderr)
        assert b"a.txt" not in p.stdout and b"teamB" not in p.stdout
    # the daemon's side: a forged key's holder never gets its proof checked, since it
    # cannot verify the daemon's; a key readable by others is refused before use
    os.chmod(key, 0o644)
    p = as_client(cluster, key, "ls", "/")
    assert p.returncode != 0 and b"chmod 600" in p.stderr
    os.chmod(key, 0o600)

    # A client key manages nothing: no client add, no node removal.
    p = as_client(cluster, key, "admin", "client", "add", "eve", "--key-out",
                  str(tmp_path / "eve.key"))
    assert p.returncode != 0 and not os.path.exists(tmp_path / "eve.key")
    p = as_client(cluster, key, "admin", "remove-node", "1")
    assert p.returncode != 0 and b"not permitted" in p.stderr

    # Removed: every daemon refuses it at connection set-up.
    before = metric(cluster, 0, "stoker_auth_failures_total", "revoked")
    cluster.cli("admin", "client", "rm", "bob")
    wait_until(lambda: as_client(cluster, key, "ls", "/").returncode != 0, 30,
               "the removed key to be refused")
    p = as_client(cluster, key, "ls", "/")
    assert b"refused" in p.stderr
    assert metric(cluster, 0, "stoker_auth_failures_total", "revoked") > before
    if m:
        # connections it opened before are cut too: the mount's calls fail (xattrs:
        # never answered from the mount's caches)
        def cut():
            try:
                os.listxattr(os.path.join(m.path, "a.txt"))
                return False
            except OSError as e:
                return e.errno in (errno.EKEYREJECTED, errno.EIO)
        wait_until(cut, 30, "the removed key's mount to be cut off")
    # meta and storage have learned it too (raw connections through stk_check)
    wait_until(lambda: metric_refuses(cluster, key, 1), 30, "meta to refuse the removed key")
    wait_until(lambda: metric_refuses(cluster, key, 2), 30,
               "storage to refuse the removed key")

    # The name again: a new generation, a new key; the old one stays refused.
    key2 = str(tmp_path / "bob2.key")
    cluster.cli("admin", "client", "add", "bob", "--subtree", "/teamA", "--key-out", key2)
    assert "gen 2" in open(key2).read()
    assert as_client(cluster, key2, "ls", "/").returncode == 0
    assert as_client(cluster, key, "ls", "/").returncode != 0
    ls = json.loads(cluster.cli("admin", "client", "ls", "--json").stdout)
    assert [(c["name"], c["generation"], c["removed"]) for c in ls] == \
        [("bob", 1, True), ("bob", 2, False)]

    # mgmtd remembers across a restart
    cluster.stop()
    cluster.start()
    assert as_client(cluster, key, "ls", "/").returncode != 0
    wait_until(lambda: as_client(cluster, key2, "ls", "/").returncode == 0, 60,
               "the new key to be served after the restart")


def metric_refuses(cluster, key, offset):
    """A connection to meta (1) or storage (2) with `key`: refused at set-up?"""
    env = dict(os.environ, STOKER_KEY_FILE=key)
    addr = "127.0.0.1:%d" % (cluster.port + offset)
    p = run([CHECK, "handshake", addr], env=env, check=False)
    return p.returncode == 0 and "EKEYREJECTED" in p.stdout.decode()


def test_client_cli_rejects_bad_input(cluster, tmp_path):
    k = str(tmp_path / "k.key")
    cases = [
        (["add", "x"], b"--key-out"),
        (["add", "a/b", "--key-out", k], b"only letters"),
        (["add", "x" * 64, "--key-out", k], b"at most 63"),
        (["add", "x", "--subtree", "rel", "--key-out", k], b"absolute path"),
        (["add", "x", "--subtree", "/a/../b", "--key-out", k], b"not a plain path"),
        (["add", "x", "--squash-root", "--squash-all", "--key-out", k], b"not both"),
        (["add", "x", "--anon-uid", "-1", "--key-out", k], b"--anon-uid"),
        (["add", "x", "--anon-gid", "4294967295", "--key-out", k], b"--anon-gid"),
        (["rm", "nobody"], b"no client named"),
        (["frob"], b"client add NAME"),
    ]
    for args, want in cases:
        p = cluster.cli("admin", "client", *args, check=False)
        assert p.returncode != 0 and want in p.stderr, (args, p.stderr)
        assert not os.path.exists(k)
    assert json.loads(cluster.cli("admin", "client", "ls", "--json").stdout) == []
    open(k, "w").close()
    p = cluster.cli("admin", "client", "add", "x", "--key-out", k, check=False)
    assert p.returncode != 0 and b"exists" in p.stderr
    assert json.loads(cluster.cli("admin", "client", "ls", "--json").stdout) == []
    os.unlink(k)
    cluster.cli("admin", "client", "add", "x", "--key-out", k)
    p = cluster.cli("admin", "client", "add", "x", "--key-out", k + "2", check=False)
    assert p.returncode != 0 and b"exists" in p.stderr and not os.path.exists(k + "2")
    out = cluster.cli("admin", "client", "ls").stdout.decode()
    assert "x" in out and "read-write" in out and "active" in out
    # a key file that is no key
    bad = tmp_path / "bad.key"
    bad.write_text("stoker-client-key 1\nname x\n")
    os.chmod(bad, 0o600)
    p = as_client(cluster, str(bad), "ls", "/")
    assert p.returncode != 0 and b"a field is missing" in p.stderr


def test_s3_gateway_with_client_keys(cluster, tmp_path):
    pytest.importorskip("boto3")
    from test_s3 import Gateway
    from botocore.exceptions import ClientError

    setup_teams(cluster, tmp_path)
    cluster.cli("mkdir", "/teamA/bucket-a", "/teamB/bucket-b")
    src = tmp_path / "obj"
    src.write_bytes(b"object")
    cluster.cli("put", str(src), "/teamA/bucket-a/o1")
    key = add_client(cluster, tmp_path, "gw", "--subtree", "/teamA")
    ro = add_client(cluster, tmp_path, "gwro", "--subtree", "/teamA", "--read-only")
    g = Gateway(cluster, tmp_path, extra=["--key-file", key])
    try:
        s3 = g.client()
        names = [b["Name"] for b in s3.list_buckets()["Buckets"]]
        assert "bucket-a" in names and "bucket-b" not in names and "teamB" not in names
        assert s3.get_object(Bucket="bucket-a", Key="o1")["Body"].read() == b"object"
        s3.put_object(Bucket="bucket-a", Key="o2", Body=b"two")
        with pytest.raises(ClientError):
            s3.get_object(Bucket="bucket-b", Key="b.txt")
    finally:
        g.stop()
    assert tree(cluster)["/teamA/bucket-a/o2"][3] == b"two".hex()
    (tmp_path / "ro").mkdir()
    g = Gateway(cluster, tmp_path / "ro", extra=["--key-file", ro])
    try:
        s3 = g.client()
        assert s3.get_object(Bucket="bucket-a", Key="o1")["Body"].read() == b"object"
        with pytest.raises(ClientError):
            s3.put_object(Bucket="bucket-a", Key="o3", Body=b"three")
    finally:
        g.stop()
    assert "/teamA/bucket-a/o3" not in tree(cluster)


@pytest.mark.skipif(not have_fuse(), reason="needs /dev/fuse")
def test_a_removed_keys_mount_does_not_flood_the_logs(cluster, tmp_path, make_mount):
    """A mount left running after its key was removed keeps trying to reach meta;
    it once did so five times a second, each try a warning in meta's log, for as
    long as it ran. Now the mount waits longer after each refusal and says so once,
    and meta logs a refusal of one kind once in 10 s, counting the rest."""
    setup_teams(cluster, tmp_path)
    key = add_client(cluster, tmp_path, "carol", "--subtree", "/teamA")
    m = make_mount(cluster, "carol", opts=["key=" + key, "timeout=2"])
    assert "a.txt" in os.listdir(m.path)
    log = os.path.join(cluster.data, "log", "meta.log")
    before = open(log).read().count("a removed client key (client carol")
    cluster.cli("admin", "client", "rm", "carol")
    wait_until(lambda: metric(cluster, 1, "stoker_auth_failures_total", "revoked") > 0, 30,
               "meta to refuse the removed key")
    time.sleep(12)
    lines = open(log).read().count("a removed client key (client carol") - before
    assert 1 <= lines <= 3, "meta logged the removed key's refusal %d times in 12 s" % lines
    # every try is counted all the same
    assert metric(cluster, 1, "stoker_auth_failures_total", "revoked") >= lines
    assert "meta refuses this client's key" in open(m.logfile).read()
