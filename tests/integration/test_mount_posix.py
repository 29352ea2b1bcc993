"""POSIX semantics of the mount beyond test_mount.py: extended attributes, permissions
as non-root users with supplementary groups, directory listings (rewinddir,
telldir/seekdir, changes during a listing), names and path lengths, mmap, and
the smaller calls, each checked against the expected result and errno.

Runs as root (FUSE mounts, a non-root caller through setuid); skipped otherwise."""
import ctypes
import errno
import os
import stat
import subprocess
import tempfile
import time

import pytest

from conftest import NOBODY, Mount, as_nobody, errno_of, needs_fuse

pytestmark = needs_fuse

PY = "/usr/bin/python3"
MiB = 1 << 20


def test_xattr_set_get_list_remove(mount):
    p = os.path.join(mount.path, "f")
    with open(p, "wb") as f:
        f.write(b"data")
    assert os.listxattr(p) == []
    os.setxattr(p, "user.a", b"one")
    os.setxattr(p, "user.empty", b"")
    assert os.getxattr(p, "user.a") == b"one"
    assert os.getxattr(p, "user.empty") == b""
    assert sorted(os.listxattr(p)) == ["user.a", "user.empty"]
    # flags: XATTR_CREATE on an existing name, XATTR_REPLACE on a missing one
    assert errno_of(os.setxattr, p, "user.a", b"x", os.XATTR_CREATE) == errno.EEXIST
    assert errno_of(os.setxattr, p, "user.b", b"x", os.XATTR_REPLACE) == errno.ENODATA
    os.setxattr(p, "user.a", b"two", os.XATTR_REPLACE)
    os.setxattr(p, "user.b", b"new", os.XATTR_CREATE)
    assert os.getxattr(p, "user.a") == b"two"
    assert errno_of(os.getxattr, p, "user.missing") == errno.ENODATA
    assert errno_of(os.removexattr, p, "user.missing") == errno.ENODATA
    os.removexattr(p, "user.b")
    assert sorted(os.listxattr(p)) == ["user.a", "user.empty"]
    # limits: 255-byte names, 64 KiB values
    long_name = "user." + "n" * 250
    os.setxattr(p, long_name, b"v")
    assert os.getxattr(p, long_name) == b"v"
    assert errno_of(os.setxattr, p, long_name + "x", b"v") == errno.ERANGE
    big = os.urandom(65536)
    os.setxattr(p, "user.big", big)
    assert os.getxattr(p, "user.big") == big
    assert errno_of(os.setxattr, p, "user.big", big + b"x") == errno.E2BIG
    # POSIX ACLs and unknown namespaces are not supported
    assert errno_of(os.setxattr, p, "system.posix_acl_access", b"\x02\0\0\0") in (
        errno.EOPNOTSUPP, errno.EINVAL)
    assert errno_of(os.setxattr, p, "other.x", b"v") == errno.EOPNOTSUPP
    # root's namespaces
    os.setxattr(p, "trusted.t", b"root")
    os.setxattr(p, "security.s", b"sec")
    assert os.getxattr(p, "trusted.t") == b"root"
    assert "trusted.t" in os.listxattr(p)
    # directories have them too; they go with the inode
    d = os.path.join(mount.path, "d")
    os.mkdir(d)
    os.setxattr(d, "user.dir", b"yes")
    assert os.getxattr(d, "user.dir") == b"yes"
    os.rmdir(d)
    os.mkdir(d)
    assert os.listxattr(d) == []
    os.unlink(p)
    with open(p, "wb"):
        pass
    assert os.listxattr(p) == []


def test_xattr_size_queries_and_erange(mount):
    """A real tool's view (getfattr/setfattr when installed) and the raw size-0 query."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    p = os.path.join(mount.path, "f").encode()
    open(p, "wb").close()
    os.setxattr(p, "user.k", b"12345")
    assert libc.getxattr(p, b"user.k", None, 0) == 5
    buf = ctypes.create_string_buffer(4)
    assert libc.getxattr(p, b"user.k", buf, 4) == -1 and ctypes.get_errno() == errno.ERANGE
    assert libc.listxattr(p, None, 0) == len(b"user.k\0")
    lbuf = ctypes.create_string_buffer(3)
    assert libc.listxattr(p, lbuf, 3) == -1 and ctypes.get_errno() == errno.ERANGE
    if subprocess.run(["which", "getfattr"], capture_output=True).returncode == 0:
        subprocess.run(["setfattr", "-n", "user.tool", "-v", "hello", p], check=True)
        out = subprocess.run(["getfattr", "-n", "user.tool", "--only-values", p],
                             check=True, capture_output=True).stdout
        assert out == b"hello"


NOBODY_XATTR = r"""
import errno, os, sys
m = sys.argv[1]
def err(fn, *a):
    try:
        fn(*a)
    except OSError as e:
        return e.errno
    return 0
mine = os.path.join(m, "pub", "mine")
open(mine, "wb").close()
os.setxattr(mine, "user.x", b"mine")
assert os.getxattr(mine, "user.x") == b"mine"
ro = os.path.join(m, "ro")          # root's, mode 0644: readable, not writable
assert os.getxattr(ro, "user.r") == b"root"
assert err(os.setxattr, ro, "user.r", b"no") == errno.EACCES
assert err(os.removexattr, ro, "user.r") == errno.EACCES
secret = os.path.join(m, "secret")  # root's, mode 0600
assert err(os.getxattr, secret, "user.r") == errno.EACCES
assert err(os.setxattr, mine, "trusted.t", b"no") == errno.EPERM
assert err(os.getxattr, ro, "trusted.t") == errno.ENODATA
assert "trusted.t" not in os.listxattr(ro)
assert err(os.setxattr, mine, "security.s", b"no") == errno.EPERM
print("ok")
"""


def test_xattr_permissions_non_root(cluster, make_mount, tmp_path):
    # pytest's tmp_path is 0700: nobody could not even reach a mount under it
    where = tempfile.mkdtemp(prefix="stoker-test-mnt-")
    try:
        mnt = make_mount(cluster, where, opts=["allow_other"], start=False)
        mnt.logfile = str(tmp_path / "mount.log")
        mnt.start()
        check_xattr_non_root(mnt.path)
    finally:
        Mount(cluster, where).stop()
        os.rmdir(where)


def check_xattr_non_root(m):
    os.mkdir(os.path.join(m, "pub"))
    os.chmod(os.path.join(m, "pub"), 0o777)
    for name, mode in (("ro", 0o644), ("secret", 0o600)):
        p = os.path.join(m, name)
        open(p, "wb").close()
        os.chmod(p, mode)
        os.setxattr(p, "user.r", b"root")
        os.setxattr(p, "trusted.t", b"root")
    r = subprocess.run([PY, "-c", NOBODY_XATTR, m], preexec_fn=as_nobody,
                       capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr.decode()
    assert r.stdout.strip() == b"ok"
    # user.* on a symlink: EPERM to set (the kernel's rule, and meta's)
    link = os.path.join(m, "link")
    os.symlink("ro", link)
    assert errno_of(lambda: os.setxattr(link, "user.l", b"v", follow_symlinks=False)) == errno.EPERM


def test_xattr_across_two_mounts(cluster, make_mount):
    a = make_mount(cluster, "a")
    b = make_mount(cluster, "b")
    pa = os.path.join(a.path, "shared")
    pb = os.path.join(b.path, "shared")
    with open(pa, "wb") as f:
        f.write(b"x")
    os.setxattr(pa, "user.v", b"from-a")
    assert os.getxattr(pb, "user.v") == b"from-a"
    os.setxattr(pb, "user.v", b"from-b")
    assert os.getxattr(pa, "user.v") == b"from-b"
    os.removexattr(pa, "user.v")
    assert errno_of(os.getxattr, pb, "user.v") == errno.ENODATA


def test_write_clears_file_capabilities(cluster, make_mount):
    """A write removes security.capability, as on a local file system, even though the
    mount answers the kernel's question before each write from what it knows: a new
    file has none, and a file whose capability was set through this mount (or
    another, once attr_timeout passed) is asked about again."""
    import struct
    caps = struct.pack("<5I", 0x02000000, 1 << 10, 0, 0, 0)  # v2: cap_net_bind_service
    a = make_mount(cluster, "a")
    b = make_mount(cluster, "b")
    pa, pb = (os.path.join(m.path, "capped") for m in (a, b))
    with open(pa, "wb") as f:
        for _ in range(20):  # a new file: no meta call per write (see test_mount.py)
            f.write(b"x" * 4096)
            f.flush()
        os.setxattr(pa, "security.capability", caps)
        assert os.getxattr(pb, "security.capability") == caps
        f.write(b"y")  # through the same descriptor, right after the set
        f.flush()
    assert errno_of(os.getxattr, pb, "security.capability") == errno.ENODATA
    # Set through another mount: seen by this one's writes after attr_timeout (1 s).
    os.setxattr(pb, "security.capability", caps)
    time.sleep(1.1)
    with open(pa, "ab") as f:
        f.write(b"z")
    assert errno_of(os.getxattr, pb, "security.capability") == errno.ENODATA
    assert open(pb, "rb").read() == b"x" * 4096 * 20 + b"yz"


# ---- permissions as non-root users, with their supplementary groups ----

ALICE, BOB = 1001, 1002  # uids (and primary gids) no test machine gives meaning to
TEAM, OTHER = 2000, 3000  # a group alice is in, one she is not


def as_user(uid, gid, groups=(), umask=None):
    """A preexec_fn that becomes uid:gid with exactly these supplementary groups."""
    def become():
        os.setgroups(list(groups))
        os.setgid(gid)
        os.setuid(uid)
        if umask is not None:
            os.umask(umask)
    return become


def run_as(user, script, *args):
    """Runs a Python script as user (as_user's arguments); returns its stdout lines."""
    r = subprocess.run([PY, "-c", script] + list(args), preexec_fn=as_user(*user),
                       capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr.decode()
    return r.stdout.decode().split()


@pytest.fixture
def pub_mount(cluster, make_mount, tmp_path):
    """A mount with allow_other on a folder everyone can reach (tmp_path is 0700)."""
    where = tempfile.mkdtemp(prefix="stoker-test-mnt-")
    os.chmod(where, 0o755)
    try:
        m = make_mount(cluster, where, opts=["allow_other"], start=False)
        m.logfile = str(tmp_path / "mount.log")
        m.start()
        yield m
    finally:
        Mount(cluster, where).stop()
        os.rmdir(where)


# Each script prints one word per check: "ok" or the errno's name.
SCRIPT_HEAD = r"""
import errno, os, sys
m = sys.argv[1]
def t(fn, *a):
    try:
        fn(*a)
        return "ok"
    except OSError as e:
        return errno.errorcode[e.errno]
def touch(p, mode=0o666):
    os.close(os.open(p, os.O_CREAT | os.O_WRONLY, mode))
"""

STICKY_ALICE = SCRIPT_HEAD + r"""
touch(os.path.join(m, "sticky", "alices"))
touch(os.path.join(m, "sticky", "alices2"))
print("ok")
"""

STICKY_BOB = SCRIPT_HEAD + r"""
s = os.path.join(m, "sticky")
touch(os.path.join(s, "bobs"))
print(t(os.unlink, os.path.join(s, "alices")))                              # EPERM
print(t(os.rename, os.path.join(s, "alices"), os.path.join(s, "taken")))   # EPERM
print(t(os.rename, os.path.join(s, "bobs"), os.path.join(s, "alices")))    # EPERM: over hers
print(t(os.rename, os.path.join(s, "alices"), os.path.join(m, "pub", "x")))  # EPERM
print(t(os.unlink, os.path.join(s, "bobs")))                               # ok: his own
print(t(os.rename, os.path.join(s, "nobody-has-this"), os.path.join(s, "y")))  # ENOENT
"""


def test_sticky_directory(pub_mount):
    m = pub_mount.path
    s = os.path.join(m, "sticky")
    os.mkdir(s)
    os.chmod(s, 0o1777)
    os.mkdir(os.path.join(m, "pub"))
    os.chmod(os.path.join(m, "pub"), 0o777)
    assert run_as((ALICE, ALICE), STICKY_ALICE, m) == ["ok"]
    assert run_as((BOB, BOB), STICKY_BOB, m) == ["EPERM", "EPERM", "EPERM", "EPERM", "ok",
                                                "ENOENT"]
    assert sorted(os.listdir(s)) == ["alices", "alices2"]
    # her own files she may remove; the folder's owner (root) too
    assert run_as((ALICE, ALICE), SCRIPT_HEAD + r"""
print(t(os.rename, os.path.join(m, "sticky", "alices2"), os.path.join(m, "sticky", "moved")))
print(t(os.unlink, os.path.join(m, "sticky", "moved")))
""", m) == ["ok", "ok"]
    os.unlink(os.path.join(s, "alices"))
    assert os.listdir(s) == []


SETGID_SCRIPT = SCRIPT_HEAD + r"""
d = os.path.join(m, "shared")
touch(os.path.join(d, "f"), 0o666)
os.mkdir(os.path.join(d, "sub"), 0o777)
touch(os.path.join(d, "sub", "g"), 0o666)
os.mkdir(os.path.join(m, "plain", "mine"), 0o777)
touch(os.path.join(m, "plain", "mine", "h"), 0o666)
for p in ("shared/f", "shared/sub", "shared/sub/g", "plain/mine", "plain/mine/h"):
    st = os.stat(os.path.join(m, p))
    print("%s:%d:%o" % (p, st.st_gid, st.st_mode & 0o7777))
"""


def test_setgid_directory_and_umask(pub_mount):
    m = pub_mount.path
    d = os.path.join(m, "shared")
    os.mkdir(d)
    os.chown(d, 0, TEAM)
    os.chmod(d, 0o2775)
    plain = os.path.join(m, "plain")
    os.mkdir(plain)
    os.chmod(plain, 0o777)
    out = run_as((ALICE, ALICE, [TEAM], 0o027), SETGID_SCRIPT, m)
    # in a set-gid folder new entries take its group, and new folders stay set-gid;
    # elsewhere they take the creator's; umask 027 masks every create
    assert out == ["shared/f:%d:640" % TEAM, "shared/sub:%d:2750" % TEAM,
                   "shared/sub/g:%d:640" % TEAM,
                   "plain/mine:%d:750" % ALICE, "plain/mine/h:%d:640" % ALICE]
    assert os.stat(os.path.join(d, "f")).st_uid == ALICE
    # umask 0 keeps the mode asked for
    out = run_as((ALICE, ALICE, [], 0), SCRIPT_HEAD + r"""
touch(os.path.join(m, "plain", "u0"), 0o666)
os.mkdir(os.path.join(m, "plain", "d0"), 0o777)
print("%o %o" % (os.stat(os.path.join(m, "plain", "u0")).st_mode & 0o777,
                 os.stat(os.path.join(m, "plain", "d0")).st_mode & 0o777))
""", m)
    assert out == ["666", "777"]


GROUP_SCRIPT = SCRIPT_HEAD + r"""
g = os.path.join(m, "team")
f = os.path.join(g, "f")
print(t(os.listdir, g))
print(t(lambda: open(f, "rb").read()))
print(t(lambda: open(f, "ab").write(b"+")))
print(t(lambda: os.close(os.open(os.path.join(g, "new"), os.O_CREAT | os.O_WRONLY, 0o644))))
# O_RDONLY|O_TRUNC truncates (Linux does), with write permission from the group
print(t(lambda: os.close(os.open(os.path.join(g, "t1"), os.O_RDONLY | os.O_TRUNC))))
print(t(lambda: os.close(os.open(os.path.join(g, "t2"), os.O_WRONLY | os.O_TRUNC))))
print(t(os.truncate, os.path.join(g, "t3"), 1))
print(t(os.unlink, os.path.join(g, "new")))
"""


def test_access_through_supplementary_group(pub_mount):
    m = pub_mount.path
    g = os.path.join(m, "team")
    os.mkdir(g)
    os.chown(g, 0, TEAM)
    os.chmod(g, 0o770)
    for name in ("f", "t1", "t2", "t3"):
        with open(os.path.join(g, name), "wb") as f:
            f.write(b"team data")
        os.chown(os.path.join(g, name), 0, TEAM)
        os.chmod(os.path.join(g, name), 0o660)
    # alice is in the group only as a supplementary one
    assert run_as((ALICE, ALICE, [OTHER, TEAM]), GROUP_SCRIPT, m) == ["ok"] * 8
    assert open(os.path.join(g, "f"), "rb").read() == b"team data+"
    for name, size in (("t1", 0), ("t2", 0), ("t3", 1)):
        assert os.stat(os.path.join(g, name)).st_size == size, name
    # bob, in other groups only, is refused everything
    assert run_as((BOB, BOB, [OTHER]), GROUP_SCRIPT, m) == ["EACCES"] * 8
    # and alice without the group too
    assert run_as((ALICE, ALICE, []), GROUP_SCRIPT, m) == ["EACCES"] * 8


CHOWN_SCRIPT = SCRIPT_HEAD + r"""
p = os.path.join(m, "pub", "mine")
touch(p, 0o644)
print(t(os.chown, p, BOB_UID, -1))         # EPERM: giving a file away is root's
print(t(os.chown, p, os.getuid(), -1))     # ok: to oneself is a no-op
print(t(os.chown, p, -1, TEAM_GID))        # ok: a group of one's own
print(os.stat(p).st_gid)
print(t(os.chown, p, -1, OTHER_GID))       # EPERM: a group one is not in
print(t(os.chown, os.path.join(m, "rootfile"), -1, TEAM_GID))  # EPERM: not the owner
print(t(os.chmod, os.path.join(m, "rootfile"), 0o777))        # EPERM
print(os.stat(p).st_gid)
"""


def test_chown_and_chgrp_as_non_root(pub_mount):
    m = pub_mount.path
    os.mkdir(os.path.join(m, "pub"))
    os.chmod(os.path.join(m, "pub"), 0o777)
    open(os.path.join(m, "rootfile"), "w").close()
    script = CHOWN_SCRIPT.replace("BOB_UID", str(BOB)).replace("TEAM_GID", str(TEAM)) \
        .replace("OTHER_GID", str(OTHER))
    assert run_as((ALICE, ALICE, [TEAM]), script, m) == \
        ["EPERM", "ok", "ok", str(TEAM), "EPERM", "EPERM", "EPERM", str(TEAM)]
    st = os.stat(os.path.join(m, "pub", "mine"))
    assert (st.st_uid, st.st_gid) == (ALICE, TEAM)
    st = os.stat(os.path.join(m, "rootfile"))
    assert (st.st_uid, st.st_gid) == (0, 0)
    # root may give anything away
    os.chown(os.path.join(m, "pub", "mine"), BOB, OTHER)
    st = os.stat(os.path.join(m, "pub", "mine"))
    assert (st.st_uid, st.st_gid) == (BOB, OTHER)


# ---- directory listings: rewinddir, telldir/seekdir, changes during a listing ----

class Dirent(ctypes.Structure):
    # glibc's struct dirent on 64-bit Linux (the same as dirent64)
    _fields_ = [("d_ino", ctypes.c_uint64), ("d_off", ctypes.c_int64),
                ("d_reclen", ctypes.c_ushort), ("d_type", ctypes.c_ubyte),
                ("d_name", ctypes.c_char * 256)]


class Dir:
    """libc's opendir/readdir/telldir/seekdir/rewinddir, which Python does not expose."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.opendir.restype = ctypes.c_void_p
    libc.opendir.argtypes = [ctypes.c_char_p]
    libc.readdir.restype = ctypes.POINTER(Dirent)
    libc.readdir.argtypes = [ctypes.c_void_p]
    libc.telldir.restype = ctypes.c_long
    libc.telldir.argtypes = [ctypes.c_void_p]
    libc.seekdir.argtypes = [ctypes.c_void_p, ctypes.c_long]
    libc.rewinddir.argtypes = [ctypes.c_void_p]
    libc.closedir.argtypes = [ctypes.c_void_p]

    def __init__(self, path):
        self.d = self.libc.opendir(os.fsencode(path))
        assert self.d, os.strerror(ctypes.get_errno())

    def next(self):
        """The next name other than . and .., or None at the end."""
        while True:
            ctypes.set_errno(0)
            e = self.libc.readdir(self.d)
            if not e:
                assert ctypes.get_errno() == 0, os.strerror(ctypes.get_errno())
                return None
            name = e.contents.d_name
            if name not in (b".", b".."):
                return name

    def take(self, n):
        out = []
        while len(out) < n:
            name = self.next()
            if name is None:
                break
            out.append(name)
        return out

    def rest(self):
        return self.take(1 << 30)

    def tell(self):
        return self.libc.telldir(self.d)

    def seek(self, loc):
        self.libc.seekdir(self.d, loc)

    def rewind(self):
        self.libc.rewinddir(self.d)

    def close(self):
        self.libc.closedir(self.d)


def make_files(d, names):
    for n in names:
        os.close(os.open(os.path.join(d, n), os.O_CREAT | os.O_WRONLY, 0o644))


def test_rewinddir_sees_new_entries(mount):
    d = os.path.join(mount.path, "small")
    os.mkdir(d)
    make_files(d, ["a", "b", "c"])
    h = Dir(d)
    try:
        assert sorted(h.rest()) == [b"a", b"b", b"c"]
        make_files(d, ["new"])
        os.unlink(os.path.join(d, "a"))
        h.rewind()  # POSIX: the listing now shows the folder as it is
        assert sorted(h.rest()) == [b"b", b"c", b"new"]
        # a rewind in the middle of a listing too
        h.rewind()
        h.take(1)
        make_files(d, ["newer"])
        h.rewind()
        assert sorted(h.rest()) == [b"b", b"c", b"new", b"newer"]
    finally:
        h.close()


def test_telldir_seekdir_resume_exactly(mount):
    d = os.path.join(mount.path, "big")
    os.mkdir(d)
    # more than one batch from meta (256) and more than one getdents buffer
    make_files(d, ["entry-%04d-%s" % (i, "x" * 40) for i in range(1500)])
    h = Dir(d)
    try:
        marks = []
        listing = []
        while True:
            marks.append((h.tell(), len(listing)))
            batch = h.take(97)
            listing += batch
            if len(batch) < 97:
                break
        assert len(listing) == len(set(listing)) == 1500
        # back to every mark, in a shuffled order: the same names follow
        for loc, at in marks[::-3] + marks[1::3]:
            h.seek(loc)
            assert h.take(5) == listing[at:at + 5], at
        h.seek(marks[3][0])
        assert h.rest() == listing[marks[3][1]:]
    finally:
        h.close()


def test_listing_while_entries_come_and_go(mount):
    d = os.path.join(mount.path, "busy")
    os.mkdir(d)
    stay = set(b"stay-%05d" % i for i in range(3000))
    gone = [b"gone-%05d" % i for i in range(1500)]
    make_files(d, [n.decode() for n in stay] + [n.decode() for n in gone])
    h = Dir(d)
    try:
        seen = h.take(1000)
        # while the listing is open: half the removable entries go, new ones come
        for n in gone[::2]:
            os.unlink(os.path.join(d, n.decode()))
        make_files(d, ["new-%05d" % i for i in range(1500)])
        seen += h.take(1000)
        for n in gone[1::2]:
            os.unlink(os.path.join(d, n.decode()))
        seen += h.rest()
    finally:
        h.close()
    # every entry there the whole time shows exactly once; nothing shows twice
    assert len(seen) == len(set(seen))
    assert stay <= set(seen)
    assert set(seen) <= stay | set(gone) | set(b"new-%05d" % i for i in range(1500))
    assert len(os.listdir(d)) == 4500


def test_readdir_100000_entries(cluster, mount):
    """A folder of 100,000 entries, made by 8 threads through the mount, listed whole:
    each name once, by listdir, scandir and a resumed libc listing."""
    import concurrent.futures
    d = os.path.join(mount.path, "huge")
    os.mkdir(d)
    n = 100000
    t0 = time.time()

    def make(lo):
        for i in range(lo, min(lo + 1000, n)):
            os.close(os.open(os.path.join(d, "f%06d" % i), os.O_CREAT | os.O_WRONLY, 0o644))

    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        list(ex.map(make, range(0, n, 1000)))
    made = time.time() - t0
    t0 = time.time()
    listed = os.listdir(d)
    listing = time.time() - t0
    print("100,000 creates %.1f s, listdir %.1f s" % (made, listing))
    assert len(listed) == len(set(listed)) == n
    assert set(listed) == set("f%06d" % i for i in range(n))
    # readdirplus, as `ls -l` and scandir with is_file use it
    assert sum(1 for e in os.scandir(d) if e.is_file()) == n
    # a listing resumed from a telldir taken deep into it
    h = Dir(d)
    try:
        h.take(70000)
        loc = h.tell()
        tail = h.rest()
        assert len(tail) == n - 70000
        h.seek(loc)
        assert h.take(100) == tail[:100]
    finally:
        h.close()


# ---- names and paths ----

def test_name_length_limits(cluster, mount):
    m = mount.path
    n255, n256 = "n" * 255, "n" * 256
    utf8 = "é" * 127 + "x"  # 255 bytes, 128 characters
    for name in (n255, utf8):
        p = os.path.join(m, name)
        with open(p, "w") as f:
            f.write("long")
        assert os.stat(p).st_size == 4
        assert name in os.listdir(m)
        os.rename(p, p[:-1] + "Z")
        assert open(p[:-1] + "Z").read() == "long"
        os.unlink(p[:-1] + "Z")
    os.mkdir(os.path.join(m, n255))
    os.symlink(n255, os.path.join(m, "s" * 255))
    os.link(os.path.join(m, "s" * 255), os.path.join(m, "l" * 255), follow_symlinks=False)
    assert os.readlink(os.path.join(m, "l" * 255)) == n255
    assert cluster.cli("stat", "/" + n255).returncode == 0
    # one byte more is ENAMETOOLONG, for every call that makes or finds a name
    p256 = os.path.join(m, n256)
    assert errno_of(os.open, p256, os.O_CREAT | os.O_WRONLY) == errno.ENAMETOOLONG
    assert errno_of(os.mkdir, p256) == errno.ENAMETOOLONG
    assert errno_of(os.symlink, "x", p256) == errno.ENAMETOOLONG
    assert errno_of(os.link, os.path.join(m, "s" * 255), p256) == errno.ENAMETOOLONG
    assert errno_of(os.rename, os.path.join(m, n255), p256) == errno.ENAMETOOLONG
    assert errno_of(os.stat, p256) == errno.ENAMETOOLONG
    assert errno_of(os.stat, os.path.join(m, "é" * 128)) == errno.ENAMETOOLONG  # 256 bytes
    assert os.path.isdir(os.path.join(m, n255))


def test_path_length_limits(mount):
    """Paths to 4095 bytes (PATH_MAX with its NUL) by nesting; longer ones only by
    walking from an open folder, as on any Linux file system."""
    base = os.path.join(mount.path, "deep")
    os.mkdir(base)
    path = base
    # folders of 200 bytes (less for the last) until a leaf of at most NAME_MAX
    # reaches 4095: how many depends on the length of the test's own folder
    while 4095 - len(path) - 1 > 255:
        path = os.path.join(path, "d" * min(200, 4095 - len(path) - 3))
        os.mkdir(path)
    leaf = os.path.join(path, "f" * (4095 - len(path) - 1))
    assert len(leaf) == 4095 and len(os.path.basename(leaf)) <= 255
    with open(leaf, "w") as f:
        f.write("at the bottom")
    assert open(leaf).read() == "at the bottom"
    assert os.stat(leaf).st_size == 13
    os.rename(leaf, leaf[:-1] + "g")
    assert os.path.exists(leaf[:-1] + "g")
    too_long = leaf[:-1] + "gh"
    assert len(too_long) == 4096
    assert errno_of(os.stat, too_long) == errno.ENAMETOOLONG
    assert errno_of(os.open, too_long, os.O_CREAT | os.O_WRONLY) == errno.ENAMETOOLONG
    assert errno_of(os.mkdir, too_long) == errno.ENAMETOOLONG
    # the tree goes on below through relative names: the limit is the kernel's on a
    # path argument, not the depth Stoker can hold
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(10):
            os.mkdir("e" * 200, dir_fd=fd)
            nfd = os.open("e" * 200, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nfd
        os.close(os.open("bottom", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=fd))
        assert os.listdir(fd) == ["bottom"]
    finally:
        os.close(fd)
    # and the whole tree goes away
    subprocess.run(["rm", "-rf", base], check=True, timeout=120)
    assert not os.path.exists(base)


ODD_NAMES = [b"new\nline", b"\xff\xfe not utf-8", b"back\\slash", b" lead and trail ",
             "名前 ünïcödé 🚀".encode(), b"\x01\x1f\x7f", b"-dash", b"*?[glob]", b"'\"quotes\"'",
             b".hidden", b"...", b"tab\there", b"%s%n", b"\xc3\x28"]


def test_any_byte_but_slash_and_nul_in_names(cluster, mount):
    m = os.fsencode(mount.path)
    for i, name in enumerate(ODD_NAMES):
        p = os.path.join(m, name)
        with open(p, "wb") as f:
            f.write(b"%d" % i)
        os.mkdir(os.path.join(m, b"dir-" + name))
    listed = os.listdir(m)
    assert sorted(listed) == sorted(ODD_NAMES + [b"dir-" + n for n in ODD_NAMES])
    assert sorted(e.name for e in os.scandir(m) if e.is_file()) == sorted(ODD_NAMES)
    for i, name in enumerate(ODD_NAMES):
        p = os.path.join(m, name)
        assert os.stat(p).st_size == len(b"%d" % i)
        # into a folder with an odd name, under another odd name, and back
        q = os.path.join(m, b"dir-" + name, name + b".moved")
        os.rename(p, q)
        assert open(q, "rb").read() == b"%d" % i
        assert os.listdir(os.path.join(m, b"dir-" + name)) == [name + b".moved"]
        os.rename(q, p)
    # the native client sees the same bytes
    assert cluster.cli("cat", "/" + "名前 ünïcödé 🚀").stdout == b"4"
    with pytest.raises(ValueError):  # NUL cannot even be passed
        os.stat(os.path.join(m, b"a\0b"))
    for name in ODD_NAMES:
        os.unlink(os.path.join(m, name))
        os.rmdir(os.path.join(m, b"dir-" + name))
    assert os.listdir(m) == []


# ---- mmap ----

def test_mmap_shared_read_and_write(cluster, make_mount):
    import mmap
    a = make_mount(cluster, "a")
    b = make_mount(cluster, "b")
    pa, pb = os.path.join(a.path, "mapped"), os.path.join(b.path, "mapped")
    data = bytes(range(256)) * 8192 + b"tail"  # 2 MiB + 4: two chunks and a bit
    with open(pa, "wb") as f:
        f.write(data)
    # a shared read mapping sees the file's bytes, through either mount
    for p in (pa, pb):
        with open(p, "rb") as f:
            with mmap.mmap(f.fileno(), 0, mmap.MAP_SHARED, mmap.PROT_READ) as mm:
                assert len(mm) == len(data)
                assert mm[:256] == bytes(range(256)) and mm[-4:] == b"tail"
                assert mm[:] == data
    # a shared write mapping: its changes reach the file, and the other mount
    with open(pa, "r+b") as f:
        with mmap.mmap(f.fileno(), 0, mmap.MAP_SHARED) as mm:
            mm[0:5] = b"HELLO"
            mm[(1 << 20) + 10:(1 << 20) + 15] = b"WORLD"  # in the second chunk
            mm.flush()  # msync(MS_SYNC)
    want = bytearray(data)
    want[0:5] = b"HELLO"
    want[(1 << 20) + 10:(1 << 20) + 15] = b"WORLD"
    assert open(pb, "rb").read() == want
    assert cluster.cli("cat", "/mapped").stdout == want
    # stores after the descriptor is closed still land, at msync and munmap
    fd = os.open(pa, os.O_RDWR)
    mm = mmap.mmap(fd, 0, mmap.MAP_SHARED)
    os.close(fd)
    mm[-4:] = b"TAIL"
    mm.flush()
    mm.close()
    want[-4:] = b"TAIL"
    assert open(pb, "rb").read() == want
    # a writable shared mapping of a read-only descriptor is EACCES, as everywhere
    with open(pa, "rb") as f:
        with pytest.raises(PermissionError):
            mmap.mmap(f.fileno(), 0, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    # a private mapping's stores stay private
    with open(pa, "rb") as f:
        with mmap.mmap(f.fileno(), 0, mmap.MAP_PRIVATE,
                       mmap.PROT_READ | mmap.PROT_WRITE) as mm:
            mm[0:5] = b"xxxxx"
    assert open(pa, "rb").read(5) == b"HELLO"


# ---- the smaller calls ----

def wait_for(cond, timeout=5.0):
    end = time.time() + timeout
    while time.time() < end:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


def test_fdatasync_and_ftruncate_up(cluster, make_mount):
    a = make_mount(cluster, "a")
    b = make_mount(cluster, "b")
    pa, pb = os.path.join(a.path, "f"), os.path.join(b.path, "f")
    fd = os.open(pa, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        os.write(fd, b"synced")
        os.fdatasync(fd)
        # durable and sized in meta while still open: another client's open reads it
        assert open(pb, "rb").read() == b"synced"
        os.ftruncate(fd, 3 * MiB + 7)  # up, past a chunk boundary
        assert os.fstat(fd).st_size == 3 * MiB + 7
        assert os.pread(fd, 64, 3 * MiB - 8) == bytes(15)  # to the end
        os.pwrite(fd, b"end", 3 * MiB + 4)
        os.fsync(fd)
        got = open(pb, "rb").read()
        assert len(got) == 3 * MiB + 7 and got[:6] == b"synced" and got[-3:] == b"end"
        assert got[6:-3] == bytes(3 * MiB - 2)
    finally:
        os.close(fd)


def fallocate(fd, mode, off, length):
    libc = ctypes.CDLL(None, use_errno=True)
    libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    rc = libc.fallocate(fd, mode, off, length)
    return 0 if rc == 0 else ctypes.get_errno()


FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE, FALLOC_FL_COLLAPSE_RANGE = 0x01, 0x02, 0x08
FALLOC_FL_ZERO_RANGE, FALLOC_FL_INSERT_RANGE = 0x10, 0x20


def test_fallocate_modes(mount):
    p = os.path.join(mount.path, "f")
    with open(p, "wb") as f:
        f.write(b"x" * 8192)
    fd = os.open(p, os.O_RDWR)
    try:
        # collapse and insert are not supported: refused, and the data is untouched
        # (punch and zero: test_fallocate_punch_and_zero_range)
        assert fallocate(fd, FALLOC_FL_PUNCH_HOLE, 0, 4096) == errno.EOPNOTSUPP
        assert fallocate(fd, FALLOC_FL_COLLAPSE_RANGE, 0, 4096) == errno.EOPNOTSUPP
        assert fallocate(fd, FALLOC_FL_INSERT_RANGE, 0, 4096) == errno.EOPNOTSUPP
        assert os.pread(fd, 8192, 0) == b"x" * 8192
        # KEEP_SIZE alone succeeds and changes nothing; mode 0 grows the file
        assert fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, 1 << 20) == 0
        assert os.fstat(fd).st_size == 8192
        assert fallocate(fd, 0, 4096, 12288) == 0
        assert os.fstat(fd).st_size == 16384
        assert fallocate(fd, 0, 0, 100) == 0  # inside the file: nothing to do
        assert os.fstat(fd).st_size == 16384
        assert fallocate(fd, 0, -1, 10) == errno.EINVAL
        assert fallocate(fd, 0, 0, 0) == errno.EINVAL
    finally:
        os.close(fd)
    assert open(p, "rb").read() == b"x" * 8192 + bytes(8192)


def test_directory_renames(cluster, mount):
    m = mount.path
    for d in ("a/x/inner", "b", "c/empty", "c/full/thing", "e1/one", "e2/two"):
        os.makedirs(os.path.join(m, d))
    with open(os.path.join(m, "a/x/inner/f"), "w") as f:
        f.write("moved along")
    with open(os.path.join(m, "file"), "w") as f:
        f.write("file")
    # across folders, with everything under it
    os.rename(os.path.join(m, "a/x"), os.path.join(m, "b/y"))
    assert open(os.path.join(m, "b/y/inner/f")).read() == "moved along"
    assert os.listdir(os.path.join(m, "a")) == []
    assert cluster.cli("cat", "/b/y/inner/f").stdout == b"moved along"
    # over an empty folder: replaces it; over a non-empty one: ENOTEMPTY
    os.rename(os.path.join(m, "b/y"), os.path.join(m, "c/empty"))
    assert open(os.path.join(m, "c/empty/inner/f")).read() == "moved along"
    assert sorted(os.listdir(os.path.join(m, "b"))) == []
    assert errno_of(os.rename, os.path.join(m, "c/empty"), os.path.join(m, "c/full")) == \
        errno.ENOTEMPTY
    # folder over a file, file over a folder
    assert errno_of(os.rename, os.path.join(m, "c/empty"), os.path.join(m, "file")) == \
        errno.ENOTDIR
    assert errno_of(os.rename, os.path.join(m, "file"), os.path.join(m, "b")) == errno.EISDIR
    # into its own subtree
    assert errno_of(os.rename, os.path.join(m, "c"), os.path.join(m, "c/empty/inner/c")) == \
        errno.EINVAL
    # RENAME_EXCHANGE of two folders in different parents, and of a folder and a file
    exchange = 2
    assert renameat2(os.path.join(m, "e1/one"), os.path.join(m, "e2/two"), exchange) == 0
    os.close(os.open(os.path.join(m, "e1/one/in-old-two"), os.O_CREAT | os.O_WRONLY))
    assert os.listdir(os.path.join(m, "e2/two")) == []
    assert renameat2(os.path.join(m, "e1/one"), os.path.join(m, "e2/two"), exchange) == 0
    assert os.listdir(os.path.join(m, "e2/two")) == ["in-old-two"]
    assert renameat2(os.path.join(m, "e1/one"), os.path.join(m, "file"), exchange) == 0
    assert os.path.isdir(os.path.join(m, "file")) and os.path.isfile(os.path.join(m, "e1/one"))
    assert open(os.path.join(m, "e1/one")).read() == "file"
    assert renameat2(os.path.join(m, "e1/one"), os.path.join(m, "e1/missing"), exchange) == \
        errno.ENOENT


def renameat2(src, dst, flags):
    libc = ctypes.CDLL(None, use_errno=True)
    rc = libc.renameat2(-100, os.fsencode(src), -100, os.fsencode(dst), flags)
    return 0 if rc == 0 else ctypes.get_errno()


@pytest.mark.serial
def test_chmod_seen_by_another_mount_within_attr_timeout(cluster, make_mount):
    a = make_mount(cluster, "a", opts=["attr_timeout=0.5"])
    b = make_mount(cluster, "b", opts=["attr_timeout=0.5"])
    pa, pb = os.path.join(a.path, "f"), os.path.join(b.path, "f")
    open(pa, "w").close()
    os.chmod(pa, 0o600)
    assert wait_for(lambda: stat.S_IMODE(os.stat(pb).st_mode) == 0o600, 3)
    assert stat.S_IMODE(os.stat(pb).st_mode) == 0o600  # b has it cached now
    t0 = time.time()
    os.chmod(pa, 0o751)
    assert wait_for(lambda: stat.S_IMODE(os.stat(pb).st_mode) == 0o751, 3)
    assert time.time() - t0 < 0.5 + 1.0  # the attribute timeout, plus slack for a busy machine
    os.chown(pb, 1234, 5678)
    assert wait_for(lambda: (os.stat(pa).st_uid, os.stat(pa).st_gid) == (1234, 5678), 3)


UTIME_NOW, UTIME_OMIT = (1 << 30) - 1, (1 << 30) - 2


def utimensat(path, atime, mtime):
    class Timespec(ctypes.Structure):
        _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]
    libc = ctypes.CDLL(None, use_errno=True)
    ts = (Timespec * 2)(Timespec(*atime), Timespec(*mtime))
    rc = libc.utimensat(-100, os.fsencode(path), ts, 0)
    return 0 if rc == 0 else ctypes.get_errno()


def test_utimens_omit_and_now(mount):
    p = os.path.join(mount.path, "f")
    open(p, "w").close()
    os.utime(p, ns=(1_000_000_001, 2_000_000_002))
    assert utimensat(p, (5, UTIME_OMIT), (7, 700)) == 0  # atime kept, mtime set
    st = os.stat(p)
    assert (st.st_atime_ns, st.st_mtime_ns) == (1_000_000_001, 7_000_000_700)
    assert utimensat(p, (9, 900), (0, UTIME_OMIT)) == 0  # mtime kept, atime set
    st = os.stat(p)
    assert (st.st_atime_ns, st.st_mtime_ns) == (9_000_000_900, 7_000_000_700)
    ctime = st.st_ctime_ns
    time.sleep(0.01)
    assert utimensat(p, (0, UTIME_NOW), (0, UTIME_OMIT)) == 0
    st = os.stat(p)
    assert st.st_atime_ns > 9_000_000_900 and st.st_mtime_ns == 7_000_000_700
    assert st.st_ctime_ns >= ctime
    assert utimensat(p, (0, UTIME_OMIT), (0, UTIME_OMIT)) == 0  # nothing to do
    assert os.stat(p).st_mtime_ns == 7_000_000_700
    assert utimensat(p, (0, 2_000_000_000), (0, 0)) == errno.EINVAL  # nsec out of range


def test_a_folders_times_and_links_stay_right_once_the_kernel_asks_again(cluster, make_mount):
    # The kernel forgets its copy of a folder's entry after entry_timeout and looks the
    # folder up again; the mount's lookup cache must not answer that with the folder's
    # times and link count from before this mount's own changes in it.
    m = make_mount(cluster, "m", opts=["entry_timeout=0.3", "attr_timeout=0.3"])
    d = os.path.join(m.path, "d")
    os.mkdir(d)
    os.stat(d)  # cached here, with its lease
    for change, links in ((lambda: open(os.path.join(d, "f"), "w").close(), 2),
                          (lambda: os.mkdir(os.path.join(d, "sub")), 3),
                          (lambda: os.unlink(os.path.join(d, "f")), 3),
                          (lambda: os.rmdir(os.path.join(d, "sub")), 2)):
        time.sleep(0.02)
        change()
        now = os.stat(d)
        time.sleep(0.8)  # the kernel's entry and attributes expire: it asks again
        later = os.stat(d)
        assert (later.st_mtime_ns, later.st_ctime_ns) == (now.st_mtime_ns, now.st_ctime_ns)
        assert now.st_nlink == later.st_nlink == links


def test_parent_times_change_on_create_and_unlink(cluster, make_mount):
    a = make_mount(cluster, "a")
    b = make_mount(cluster, "b", opts=["attr_timeout=0.2"])
    d = os.path.join(a.path, "d")
    os.mkdir(d)

    def times(path):
        st = os.stat(path)
        return st.st_mtime_ns, st.st_ctime_ns

    for change in (lambda: open(os.path.join(d, "f"), "w").close(),
                   lambda: os.mkdir(os.path.join(d, "sub")),
                   lambda: os.rename(os.path.join(d, "f"), os.path.join(d, "g")),
                   lambda: os.unlink(os.path.join(d, "g")),
                   lambda: os.rmdir(os.path.join(d, "sub"))):
        before = times(d)
        seen_b = times(os.path.join(b.path, "d"))
        time.sleep(0.02)
        change()
        after = times(d)
        assert after[0] > before[0] and after[1] > before[1]
        # and the other client sees the new times once its cache expires
        assert wait_for(lambda: times(os.path.join(b.path, "d")) == after, 3), seen_b
    # a file's own ctime moves with its link count
    p = os.path.join(d, "h")
    open(p, "w").close()
    c0 = os.stat(p).st_ctime_ns
    time.sleep(0.02)
    os.link(p, p + "2")
    assert os.stat(p).st_ctime_ns > c0 and os.stat(p).st_nlink == 2


def test_fusermount_u_unmounts_and_flushes(cluster, make_mount):
    m = make_mount(cluster, "m")
    pid = m.pid()
    with open(os.path.join(m.path, "f"), "wb") as f:
        f.write(b"written before fusermount -u")
    subprocess.run(["fusermount3", "-u", m.path], check=True, timeout=60)
    assert not m.mounted()
    # the daemon notices, flushes and exits
    assert wait_for(lambda: not os.path.exists("/proc/%d" % pid) or
                    open("/proc/%d/stat" % pid).read().rsplit(") ", 1)[1][0] in "ZX", 15)
    assert cluster.cli("cat", "/f").stdout == b"written before fusermount -u"
    # and the folder mounts again
    m.start()
    assert open(os.path.join(m.path, "f"), "rb").read() == b"written before fusermount -u"


def test_relatime(cluster, make_mount):
    a = make_mount(cluster, "a")
    b = make_mount(cluster, "b")
    c = make_mount(cluster, "c", opts=["noatime"])
    pa, pb, pc = (os.path.join(m.path, "f") for m in (a, b, c))
    with open(pa, "wb") as f:
        f.write(b"read me" * 1000)
    os.utime(pa, ns=(1_000_000_000, 2_000_000_000))  # atime before mtime: a read is due
    st0 = os.stat(pa)
    # through the noatime mount: reads leave atime alone
    assert open(pc, "rb").read(4) == b"read"
    assert os.stat(pa).st_atime_ns == 1_000_000_000
    # through a relatime mount: the first read moves atime to now, and not ctime
    before = time.time_ns()
    assert open(pb, "rb").read(4) == b"read"
    # recorded just after the read is answered (the reader does not wait for it)
    assert wait_for(lambda: os.stat(pb).st_atime_ns >= before - 2_000_000_000, 3)
    st = os.stat(pb)
    assert st.st_ctime_ns == st0.st_ctime_ns and st.st_mtime_ns == 2_000_000_000
    assert wait_for(lambda: os.stat(pa).st_atime_ns == st.st_atime_ns, 3)
    # read again before any change: not due, atime stays (through another mount too)
    time.sleep(0.02)
    assert open(pa, "rb").read() == b"read me" * 1000
    with open(pb, "rb") as f:
        f.read()
    assert os.stat(pb).st_atime_ns == st.st_atime_ns
    # after a write, the next read moves it again
    time.sleep(0.02)
    with open(pa, "ab") as f:
        f.write(b"more")
    assert wait_for(lambda: os.stat(pb).st_mtime_ns > st.st_atime_ns, 3)
    assert open(pb, "rb").read()[-4:] == b"more"
    assert wait_for(lambda: os.stat(pb).st_atime_ns >= os.stat(pb).st_mtime_ns, 3)
    # writes alone never move it, and a read-only descriptor's open alone neither
    at = os.stat(pb).st_atime_ns
    os.close(os.open(pb, os.O_RDONLY))
    with open(pb, "ab") as f:
        f.write(b"x")
    assert os.stat(pb).st_atime_ns == at


# ---- special files, sparse files, punch and zero (issue 21 part 6) ----

def test_special_files_fifo_devices_socket(cluster, mount):
    import socket
    d = os.path.join(mount.path, "sp")
    os.mkdir(d)
    fifo, chr_, blk, sock = (os.path.join(d, n) for n in ("fifo", "null", "sda", "sock"))
    os.mkfifo(fifo, 0o640)
    os.mknod(chr_, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    os.mknod(blk, stat.S_IFBLK | 0o660, os.makedev(8, 1))
    st = os.stat(fifo)
    assert stat.S_ISFIFO(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o640
    st = os.stat(chr_)
    assert stat.S_ISCHR(st.st_mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) == (1, 3)
    st = os.stat(blk)
    assert stat.S_ISBLK(st.st_mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) == (8, 1)
    assert os.path.exists(fifo) and errno_of(os.mkfifo, fifo) == errno.EEXIST
    # a fifo opens through the kernel: bytes pass between a writer and a reader
    r = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    w = os.open(fifo, os.O_WRONLY)
    os.write(w, b"through the fifo")
    assert os.read(r, 100) == b"through the fifo"
    os.close(w)
    os.close(r)
    # a device node on a nodev mount: present, but not openable
    assert errno_of(os.open, chr_, os.O_RDONLY) in (errno.EACCES, errno.EPERM, errno.ENXIO)
    # a Unix socket bound in the mount: connect and send through it
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(sock)
    srv.listen(1)
    assert stat.S_ISSOCK(os.stat(sock).st_mode)
    cli = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    cli.connect(sock)
    conn, _ = srv.accept()
    cli.sendall(b"hello socket")
    assert conn.recv(100) == b"hello socket"
    for s in (conn, cli, srv):
        s.close()
    # chmod, chown, link, rename, xattrs, unlink on them
    os.chmod(fifo, 0o600)
    os.chown(fifo, 1234, 5678)
    st = os.stat(fifo)
    assert stat.S_IMODE(st.st_mode) == 0o600 and (st.st_uid, st.st_gid) == (1234, 5678)
    os.link(fifo, fifo + "2")
    assert os.stat(fifo).st_nlink == 2
    os.rename(fifo + "2", fifo + "3")
    os.setxattr(chr_, "trusted.t", b"v")
    assert os.getxattr(chr_, "trusted.t") == b"v"
    os.unlink(fifo + "3")
    assert os.stat(fifo).st_nlink == 1
    # the CLI names the types; libstoker refuses their data with a clear error
    ls = cluster.cli("ls", "-l", "/sp").stdout.decode()
    kinds = {line.split()[-1]: line[0] for line in ls.splitlines() if line.strip()}
    assert kinds == {"fifo": "p", "null": "c", "sda": "b", "sock": "s"}, ls
    assert "character device" in cluster.cli("stat", "/sp/null").stdout.decode()
    assert cluster.cli("cat", "/sp/fifo", check=False).returncode != 0
    # cp -a and tar of the tree keep types and device numbers
    subprocess.run(["cp", "-a", d, os.path.join(mount.path, "copy")], check=True)
    subprocess.run("tar -C %s -cf - sp | tar -C %s -xf -" % (mount.path, tmp := tempfile.mkdtemp(
        dir=mount.path)), shell=True, check=True)
    for top in (os.path.join(mount.path, "copy"), os.path.join(tmp, "sp")):
        for n in ("fifo", "null", "sda"):
            a, b = os.stat(os.path.join(d, n)), os.stat(os.path.join(top, n))
            assert stat.S_IFMT(a.st_mode) == stat.S_IFMT(b.st_mode), (top, n)
            assert a.st_rdev == b.st_rdev and stat.S_IMODE(a.st_mode) == stat.S_IMODE(b.st_mode)
    # all gone with rm -r
    subprocess.run(["rm", "-r", d, os.path.join(mount.path, "copy"), tmp], check=True)
    assert not os.path.exists(d)


def du_bytes(p):
    return int(subprocess.run(["du", "-B1", p], check=True,
                              capture_output=True).stdout.split()[0])


def test_sparse_file_du(cluster, mount):
    p = os.path.join(mount.path, "sparse")
    subprocess.run(["truncate", "-s", "1G", p], check=True)
    assert os.stat(p).st_size == 1 << 30 and os.stat(p).st_blocks == 0
    with open(p, "r+b") as f:
        f.seek(512 * MiB)
        f.write(os.urandom(MiB))
    st = os.stat(p)
    assert st.st_size == 1 << 30
    # about 1 MiB, not 1 GiB (a written chunk counts whole)
    assert MiB <= st.st_blocks * 512 <= 2 * MiB, st.st_blocks
    assert MiB <= du_bytes(p) <= 2 * MiB
    # a file written from start to end counts its size
    q = os.path.join(mount.path, "full")
    with open(q, "wb") as f:
        f.write(os.urandom(3 * MiB + 100))
    assert os.stat(q).st_blocks == (3 * MiB + 100 + 511) // 512
    # data at both ends, copied in one open with holes kept: the middle counts nothing
    with open(p, "r+b") as f:
        f.write(b"head")
        f.seek((1 << 30) - 4)
        f.write(b"tail")
    c = os.path.join(mount.path, "sparse-copy")
    subprocess.run(["cp", "--sparse=always", p, c], check=True)
    assert os.stat(c).st_size == 1 << 30
    assert 3 * MiB <= os.stat(c).st_blocks * 512 <= 6 * MiB, os.stat(c).st_blocks
    with open(c, "rb") as f:
        assert f.read(4) == b"head"
        f.seek((1 << 30) - 4)
        assert f.read(4) == b"tail"
    # another client (the CLI) reads the same figure from meta
    assert "Blocks: %d" % os.stat(p).st_blocks in cluster.cli("stat", "/sparse").stdout.decode()


def test_fallocate_punch_and_zero_range(cluster, mount):
    p = os.path.join(mount.path, "holes")
    data = bytearray(os.urandom(8 * MiB))
    with open(p, "wb") as f:
        f.write(data)
    assert os.stat(p).st_blocks * 512 == 8 * MiB
    fd = os.open(p, os.O_RDWR)
    try:
        # punch 1.5 MiB .. 5.5 MiB: chunks 2-4 go whole, the edges get zeros
        assert fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                         MiB + MiB // 2, 4 * MiB) == 0
        data[MiB + MiB // 2:5 * MiB + MiB // 2] = bytes(4 * MiB)
        assert os.fstat(fd).st_size == 8 * MiB
        assert os.pread(fd, 8 * MiB, 0) == bytes(data)
        # zero-range inside one chunk, keeping the size
        assert fallocate(fd, FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE, 7 * MiB + 10, 1000) == 0
        data[7 * MiB + 10:7 * MiB + 1010] = bytes(1000)
        # zero-range past the end grows the file
        assert fallocate(fd, FALLOC_FL_ZERO_RANGE, 8 * MiB - 4096, 8192) == 0
        data[8 * MiB - 4096:] = bytes(4096)
        data += bytes(4096)
        assert os.fstat(fd).st_size == 8 * MiB + 4096
        assert os.pread(fd, 9 * MiB, 0) == bytes(data)
    finally:
        os.close(fd)
    # the punched whole chunks count no more
    st = os.stat(p)
    assert 5 * MiB <= st.st_blocks * 512 <= 6 * MiB, st.st_blocks
    assert du_bytes(p) <= 6 * MiB
    # another client reads the same bytes
    assert cluster.cli("cat", "/holes").stdout == bytes(data)
    # fallocate(1) from util-linux agrees
    subprocess.run(["fallocate", "--punch-hole", "--offset", "0", "--length", str(MiB), p],
                   check=True)
    data[:MiB] = bytes(MiB)
    assert open(p, "rb").read() == bytes(data)
    assert os.stat(p).st_blocks * 512 <= 5 * MiB
