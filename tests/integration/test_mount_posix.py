"""POSIX semantics of the mount beyond test_mount.py: extended attributes, as root,
as a non-root caller and across two mounts, each checked against the expected
result and errno.

Runs as root (FUSE mounts, a non-root caller through setuid); skipped otherwise."""
import errno
import os
import subprocess
import tempfile

import pytest

from conftest import Mount, needs_fuse

pytestmark = needs_fuse

NOBODY = 65534
PY = "/usr/bin/python3"


def errno_of(fn, *args):
    try:
        fn(*args)
    except OSError as e:
        return e.errno
    return 0


def as_nobody():
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)


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
