"""Vouchers (docs/security.md, "Vouchers"): meta vouches, in its reply to a subtree
client key's lookup, open or create, that the file lies under the key's subtree,
and storage serves that file's chunks on the voucher's word, without asking meta
(META_WITHIN). A voucher is good for one inode (or the numbers meta reserved for
the client's creates), one client key, until it expires or meta's epoch moves (a
rename); a forged one, or one shown for another inode, is refused.

Real `stoker up` clusters, real clients: the Python package, a FUSE mount, and
stk_check (vouch: a raw META_LOOKUP that prints the voucher it got; chunk: a raw
chunk request carrying any voucher bytes, as a hostile client may send them).
"""
import hashlib
import hmac
import os
import struct
import time

from conftest import CHECK, have_fuse, run, wait_until
from test_client_identity import add_client, lookup_ino, py_client, setup_teams
from test_metrics import scrape, total
from test_mount import meta_figure


def storage_figure(cluster, name, **labels):
    samples, _ = scrape(cluster, "storage")
    return total(samples, name, **labels)


def asks(cluster):
    """META_WITHIN calls storage made so far."""
    return storage_figure(cluster, "stoker_storage_meta_asks_total", op="within")


def vouchers(cluster, result):
    return storage_figure(cluster, "stoker_storage_vouchers_total", result=result)


def vouch(cluster, key, parent, name):
    """(ino, voucher bytes or None) from a META_LOOKUP as the holder of key."""
    env = dict(os.environ, STOKER_KEY_FILE=key)
    out = run([CHECK, "vouch", "127.0.0.1:%d" % (cluster.port + 1), str(parent), name],
              env=env).stdout.decode().split()
    assert len(out) == 2, out
    return int(out[0]), None if out[1] == "none" else bytes.fromhex(out[1])


def chunk(cluster, key, ino, voucher=None, op="read"):
    """A chunk request for ino straight to storage, carrying voucher; the errno's name."""
    env = dict(os.environ, STOKER_KEY_FILE=key)
    args = [CHECK, "chunk", "127.0.0.1:%d" % (cluster.port + 2), str(ino), op]
    if voucher is not None:
        args.append(voucher.hex())
    return run(args, env=env).stdout.decode().split()[-1]


def fields(v):
    return list(struct.unpack("<4Q", v[:32])) + [v[32:]]


def pack(ino, count, expires, epoch, mac):
    return struct.pack("<4Q", ino, count, expires, epoch) + mac


def test_subtree_reads_need_no_meta_round_trip(cluster, tmp_path, make_mount):
    cluster.cli("mkdir", "/teamA")
    for i in range(20):
        src = tmp_path / ("f%d" % i)
        src.write_bytes(b"file %d\n" % i)
        cluster.cli("put", str(src), "/teamA/f%d" % i)
    key = add_client(cluster, tmp_path, "alice", "--subtree", "/teamA")
    before, accepted = asks(cluster), vouchers(cluster, "accepted")
    # the Python package: lookup and open at meta, vouched; reads at storage, unasked
    got = py_client(cluster, key, "for i in range(20):\n"
                    "    print(c.read_file('/f%d' % i).decode().strip())\n")
    assert got == ["file %d" % i for i in range(20)]
    assert asks(cluster) == before
    assert vouchers(cluster, "accepted") >= accepted + 20
    # the cluster key's clients get none, and need none
    assert vouch(cluster, cluster.key_file, lookup_ino(cluster, cluster.key_file, 1, "teamA"),
                 "f0")[1] is None

    if have_fuse():
        # W3's shape through the mount: files made, the kernel's caches dropped, read
        m = make_mount(cluster, "alice", opts=["key=" + key])
        # a listing (readdirplus: names looked up in a batch, each file vouched) and
        # reads of what another client wrote
        before = asks(cluster)
        batched = meta_figure(cluster, "stoker_rpc_requests_total", op="META_LOOKUPS")
        assert sorted(e.name for e in os.scandir(m.path)) == sorted("f%d" % i for i in range(20))
        assert meta_figure(cluster, "stoker_rpc_requests_total", op="META_LOOKUPS") > batched
        for i in range(20):
            with open(os.path.join(m.path, "f%d" % i), "rb") as f:
                assert f.read() == b"file %d\n" % i
        assert asks(cluster) == before
        os.mkdir(os.path.join(m.path, "w3"))
        for i in range(50):
            with open(os.path.join(m.path, "w3", "g%d" % i), "wb") as f:
                f.write(b"%d" % i * 1000)
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        before, accepted = asks(cluster), vouchers(cluster, "accepted")
        for i in range(50):
            with open(os.path.join(m.path, "w3", "g%d" % i), "rb") as f:
                assert f.read() == b"%d" % i * 1000
        assert asks(cluster) == before
        assert vouchers(cluster, "accepted") >= accepted + 50


def test_a_voucher_opens_its_inode_only(cluster, tmp_path):
    setup_teams(cluster, tmp_path)
    admin = cluster.key_file
    cluster.cli("put", str(tmp_path / "hello.txt"), "/teamA/a2.txt")
    b_txt = lookup_ino(cluster, admin, lookup_ino(cluster, admin, 1, "teamB"), "b.txt")
    key = add_client(cluster, tmp_path, "alice", "--subtree", "/teamA")
    a_txt, v = vouch(cluster, key, 1, "a.txt")
    a2_txt, v2 = vouch(cluster, key, 1, "a2.txt")
    assert v is not None and v2 is not None
    ino, count, expires, epoch, mac = fields(v)
    assert (ino, count) == (a_txt, 1)
    assert 0 < expires - time.time() * 1000 <= 61000

    before = asks(cluster)
    accepted, refused = vouchers(cluster, "accepted"), vouchers(cluster, "refused")
    assert chunk(cluster, key, a_txt, v) != "EACCES"
    assert vouchers(cluster, "accepted") == accepted + 1
    # shown for another inode, outside or inside the subtree: refused, meta not asked
    assert chunk(cluster, key, b_txt, v) == "EACCES"
    assert chunk(cluster, key, a2_txt, v) == "EACCES"
    assert chunk(cluster, key, a2_txt, v2) != "EACCES"
    assert asks(cluster) == before

    # forged: a MAC bit flipped; the inode, count, expiry or epoch changed under the
    # same MAC; a MAC made with the client's own key; bytes too few, or none valid
    client_key = bytes.fromhex([ln.split()[1] for ln in open(key) if ln.startswith("key ")][0])
    text = ("stoker-vouch-1\nino=%d\ncount=1\nexpires=%d\nepoch=%d\nname=alice\ngen=1\n"
            "flags=0\nanon=65534:65534\nsubtree=/teamA" % (b_txt, expires, epoch)).encode()
    forged = [
        pack(ino, count, expires, epoch, bytes([mac[0] ^ 1]) + mac[1:]),
        pack(b_txt, count, expires, epoch, mac),
        pack(min(a_txt, b_txt), abs(a_txt - b_txt) + 1, expires, epoch, mac),
        pack(ino, count, expires + 3600000, epoch, mac),
        pack(ino, count, expires, epoch + 1, mac),
        pack(b_txt, 1, expires, epoch, hmac.new(client_key, text, hashlib.sha256).digest()),
        v[:10],
        b"",
        os.urandom(64),
    ]
    for f in forged:
        assert chunk(cluster, key, b_txt, f) == "EACCES", f.hex()
        assert chunk(cluster, key, a_txt, f) == "EACCES", f.hex()
    assert vouchers(cluster, "refused") >= refused + 2 + 2 * len(forged)
    assert asks(cluster) == before
    assert "that meta did not make" in cluster.logs()
    # another client key, of the same subtree, cannot use alice's
    bob = add_client(cluster, tmp_path, "bob", "--subtree", "/teamA")
    assert chunk(cluster, bob, a_txt, v) == "EACCES"
    # a write carries one as a read does; a truncate too
    assert chunk(cluster, key, a_txt, v, "truncate") != "EACCES"
    assert chunk(cluster, key, b_txt, v, "truncate") == "EACCES"
    # and storage still serves: without a voucher it asks meta, as before
    assert chunk(cluster, key, a2_txt) != "EACCES"
    assert chunk(cluster, key, b_txt) == "EACCES"
    assert asks(cluster) > before


def test_vouchers_end_with_a_rename_or_the_key(cluster, tmp_path):
    setup_teams(cluster, tmp_path)
    key = add_client(cluster, tmp_path, "alice", "--subtree", "/teamA")
    a_txt, v = vouch(cluster, key, 1, "a.txt")
    assert chunk(cluster, key, a_txt, v) != "EACCES"
    # Moved out of the subtree: meta's epoch moves, storage learns it within a
    # second and asks meta, whose answer is no. The bound (docs/security.md): 5 s.
    cluster.cli("mv", "/teamA/a.txt", "/teamB/a.txt")
    t0 = time.monotonic()
    wait_until(lambda: chunk(cluster, key, a_txt, v) == "EACCES", 10,
               "the voucher of a file moved out to be refused")
    assert time.monotonic() - t0 < 5.5
    assert vouchers(cluster, "stale") >= 1
    _, v2 = vouch(cluster, key, 1, "sub")
    assert v2 is None  # folders get none: storage holds no chunks of theirs
    for name in ("c.txt", "d.txt"):
        cluster.cli("put", str(tmp_path / "hello.txt"), "/teamA/" + name)
    c_txt, vc = vouch(cluster, key, 1, "c.txt")
    d_txt, vd = vouch(cluster, key, 1, "d.txt")
    # files renamed within their folders, inside the subtree and outside it, change
    # no other file's subtree: c.txt's voucher of before them is still taken, and
    # meta is not asked (d.txt's own ends: a renamed file counts where it was
    # renamed, which for a file with a name in another folder may differ)
    cluster.cli("mv", "/teamB/b.txt", "/teamB/b2.txt")
    cluster.cli("mv", "/teamA/d.txt", "/teamA/d2.txt")
    time.sleep(1.2)
    assert chunk(cluster, key, c_txt, vc) != "EACCES"  # storage learns the renames
    before, accepted = asks(cluster), vouchers(cluster, "accepted")
    stale = vouchers(cluster, "stale")
    assert chunk(cluster, key, c_txt, vc) != "EACCES"
    assert asks(cluster) == before
    assert vouchers(cluster, "accepted") == accepted + 1
    assert chunk(cluster, key, d_txt, vd) != "EACCES"
    assert vouchers(cluster, "stale") == stale + 1
    assert asks(cluster) == before + 1

    # The key removed: its connections are refused, vouchers or not; the name added
    # again is a new key (generation 2), for which gen 1's vouchers are worth nothing.
    _, vc = vouch(cluster, key, 1, "c.txt")
    cluster.cli("admin", "client", "rm", "alice")
    wait_until(lambda: chunk(cluster, key, c_txt, vc) == "EKEYREJECTED", 30,
               "storage to refuse the removed key")
    key2 = str(tmp_path / "alice2.key")
    cluster.cli("admin", "client", "add", "alice", "--subtree", "/teamA", "--key-out", key2)
    assert chunk(cluster, key2, c_txt, vc) == "EACCES"
    _, vc2 = vouch(cluster, key2, 1, "c.txt")
    assert chunk(cluster, key2, c_txt, vc2) != "EACCES"


def test_a_move_ends_the_vouchers_it_concerns(cluster, tmp_path):
    """A file moved to another folder ends its own vouchers, not others'; a folder
    renamed ends them all (what lies beneath it, or a subtree's path, may change)."""
    setup_teams(cluster, tmp_path)
    hello = str(tmp_path / "hello.txt")
    cluster.cli("mkdir", "/teamA/d")
    for name in ("/teamA/d/f.txt", "/teamA/x.txt", "/teamA/y.txt"):
        cluster.cli("put", hello, name)
    key = add_client(cluster, tmp_path, "alice", "--subtree", "/teamA")
    d = lookup_ino(cluster, key, 1, "d")
    f_txt, vf = vouch(cluster, key, d, "f.txt")
    x_txt, vx = vouch(cluster, key, 1, "x.txt")
    y_txt, vy = vouch(cluster, key, 1, "y.txt")
    for ino, v in ((f_txt, vf), (x_txt, vx), (y_txt, vy)):
        assert chunk(cluster, key, ino, v) != "EACCES"

    # x.txt moved between two folders inside the subtree: its voucher is stale
    # (meta is asked, and says yes); y.txt's and f.txt's are still taken
    cluster.cli("mv", "/teamA/x.txt", "/teamA/sub/x.txt")
    time.sleep(1.2)
    assert chunk(cluster, key, y_txt, vy) != "EACCES"  # storage learns the move
    before, stale = asks(cluster), vouchers(cluster, "stale")
    accepted = vouchers(cluster, "accepted")
    assert chunk(cluster, key, y_txt, vy) != "EACCES"
    assert chunk(cluster, key, f_txt, vf) != "EACCES"
    assert asks(cluster) == before
    assert vouchers(cluster, "accepted") == accepted + 2
    assert chunk(cluster, key, x_txt, vx) != "EACCES"
    assert asks(cluster) == before + 1
    assert vouchers(cluster, "stale") == stale + 1
    # a new voucher for it is taken again
    sub = lookup_ino(cluster, key, 1, "sub")
    _, vx2 = vouch(cluster, key, sub, "x.txt")
    assert chunk(cluster, key, x_txt, vx2) != "EACCES"
    assert asks(cluster) == before + 1

    # the folder d moved out of the subtree, with f.txt in it: f.txt's voucher is
    # refused within the bound docs/security.md gives (5 s), y.txt's goes to meta
    cluster.cli("mv", "/teamA/d", "/teamB/d")
    t0 = time.monotonic()
    wait_until(lambda: chunk(cluster, key, f_txt, vf) == "EACCES", 10,
               "the voucher of a file in a folder moved out to be refused")
    assert time.monotonic() - t0 < 5.5
    before = asks(cluster)
    assert chunk(cluster, key, y_txt, vy) != "EACCES"
    assert asks(cluster) == before + 1

    # a folder renamed within its parent ends them all too: it may be the subtree's
    _, vy = vouch(cluster, key, 1, "y.txt")
    cluster.cli("mv", "/teamB/d", "/teamB/e")
    time.sleep(1.2)
    assert chunk(cluster, key, y_txt, vy) != "EACCES"
    stale = vouchers(cluster, "stale")
    assert chunk(cluster, key, y_txt, vy) != "EACCES"
    assert vouchers(cluster, "stale") == stale + 1


def test_a_second_name_renamed_ends_its_voucher(cluster, tmp_path, make_mount):
    """A file counts in the folder it was made in or last renamed into: its second
    name, outside the subtree, renamed within its own folder takes the file out
    of the subtree, and the voucher the subtree's client holds for it ends."""
    setup_teams(cluster, tmp_path)
    key = add_client(cluster, tmp_path, "alice", "--subtree", "/teamA")
    m = make_mount(cluster, "admin")
    os.link(os.path.join(m.path, "teamA", "a.txt"), os.path.join(m.path, "teamB", "h"))
    a_txt, v = vouch(cluster, key, 1, "a.txt")
    assert chunk(cluster, key, a_txt, v) != "EACCES"
    os.rename(os.path.join(m.path, "teamB", "h"), os.path.join(m.path, "teamB", "h2"))
    t0 = time.monotonic()
    wait_until(lambda: chunk(cluster, key, a_txt, v) == "EACCES", 10,
               "the voucher of a file now counted outside to be refused")
    assert time.monotonic() - t0 < 5.5


def listread(cluster, key, ino):
    """stk_check's listing by inode (readdir, then META_GETATTRS) and a byte of
    each file opened from those attributes, as the holder of key; the files read."""
    env = dict(os.environ, STOKER_CLUSTER=cluster.url, STOKER_KEY_FILE=key)
    out = run([CHECK, "ino", cluster.url, "listread", str(ino)], env=env).stdout.decode()
    assert out.splitlines()[-1] == "OK", out
    return int(out.split()[1])


def test_a_listing_by_inode_then_reads_asks_storage_nothing(cluster, tmp_path):
    """A subtree client that listed a folder with attributes by inode (a
    readdirplus by inode: META_GETATTRS, whose reply carries no voucher) reads its
    files with no call from storage to meta: opening each registers it at meta
    (META_OPEN), and that reply vouches for it."""
    cluster.cli("mkdir", "/teamA", "/teamA/w", "/teamB")
    src = tmp_path / "f"
    src.write_bytes(b"data\n")
    for i in range(30):
        cluster.cli("put", str(src), "/teamA/w/f%d" % i)
    cluster.cli("put", str(src), "/teamB/b.txt")
    key = add_client(cluster, tmp_path, "alice", "--subtree", "/teamA")
    w = lookup_ino(cluster, key, 1, "w")
    before, accepted = asks(cluster), vouchers(cluster, "accepted")
    listed = meta_figure(cluster, "stoker_rpc_requests_total", op="META_GETATTRS")
    opened = meta_figure(cluster, "stoker_rpc_requests_total", op="META_OPEN")
    assert listread(cluster, key, w) == 30
    assert meta_figure(cluster, "stoker_rpc_requests_total", op="META_GETATTRS") > listed
    assert meta_figure(cluster, "stoker_rpc_requests_total", op="META_OPEN") >= opened + 30
    assert asks(cluster) == before
    assert vouchers(cluster, "accepted") >= accepted + 30
    # a file outside stays outside: asked by number, it is missing, and unreadable
    admin = cluster.key_file
    b_txt = lookup_ino(cluster, admin, lookup_ino(cluster, admin, 1, "teamB"), "b.txt")
    env = dict(os.environ, STOKER_CLUSTER=cluster.url, STOKER_KEY_FILE=key)
    out = run([CHECK, "ino", cluster.url, "getattrs", str(b_txt)], env=env).stdout.decode()
    assert out.split()[-1] == "ENOENT", out
    assert chunk(cluster, key, b_txt) == "EACCES"


def test_a_meta_that_tells_only_its_epoch(make_cluster, tmp_path, monkeypatch):
    """Storage asks a meta from before moves its bare epoch (META_EPOCH with no
    `since`, as STOKER_TEST_VOUCH_EPOCH_ONLY=1 makes it ask any meta): every
    rename there ends every voucher, as before moves were told; a file moved out
    is still refused within the bound."""
    monkeypatch.setenv("STOKER_TEST_VOUCH_EPOCH_ONLY", "1")
    cluster = make_cluster(start=False)
    cluster.start()
    setup_teams(cluster, tmp_path)
    cluster.cli("put", str(tmp_path / "hello.txt"), "/teamA/c.txt")
    key = add_client(cluster, tmp_path, "alice", "--subtree", "/teamA")
    a_txt, v = vouch(cluster, key, 1, "a.txt")
    c_txt, vc = vouch(cluster, key, 1, "c.txt")
    before, accepted = asks(cluster), vouchers(cluster, "accepted")
    assert chunk(cluster, key, c_txt, vc) != "EACCES"
    assert vouchers(cluster, "accepted") == accepted + 1
    assert asks(cluster) == before
    # a rename within a folder outside the subtree: every voucher of before is stale
    cluster.cli("mv", "/teamB/b.txt", "/teamB/b2.txt")
    time.sleep(1.2)
    stale = vouchers(cluster, "stale")
    assert chunk(cluster, key, c_txt, vc) != "EACCES"
    assert vouchers(cluster, "stale") == stale + 1
    assert asks(cluster) == before + 1
    # and one moved out is refused
    cluster.cli("mv", "/teamA/a.txt", "/teamB/a.txt")
    t0 = time.monotonic()
    wait_until(lambda: chunk(cluster, key, a_txt, v) == "EACCES", 10,
               "the voucher of a file moved out to be refused")
    assert time.monotonic() - t0 < 5.5
