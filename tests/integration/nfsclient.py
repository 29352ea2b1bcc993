"""A small NFS client for the tests: Debian's libnfs (libnfs13) through ctypes.

libnfs speaks NFSv3 and NFSv4.0 entirely in user space, which is what this machine
needs: its kernel has no NFS client. Every call raises OSError(errno) on failure,
with libnfs's own message, so a test can assert the exact errno a server sent.
"""
import ctypes
import ctypes.util
import errno
import os

_lib = ctypes.CDLL(ctypes.util.find_library("nfs") or "libnfs.so.13", use_errno=True)


class _Url(ctypes.Structure):
    _fields_ = [("server", ctypes.c_char_p), ("path", ctypes.c_char_p), ("file", ctypes.c_char_p)]


class Stat(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in (
        "dev", "ino", "mode", "nlink", "uid", "gid", "rdev", "size", "blksize", "blocks",
        "atime", "mtime", "ctime", "atime_nsec", "mtime_nsec", "ctime_nsec", "used")]


class _Dirent(ctypes.Structure):
    pass


_Dirent._fields_ = [("next", ctypes.POINTER(_Dirent)), ("name", ctypes.c_char_p),
                    ("inode", ctypes.c_uint64)]

_P = ctypes.c_void_p
_lib.nfs_init_context.restype = _P
_lib.nfs_parse_url_dir.restype = ctypes.POINTER(_Url)
_lib.nfs_parse_url_dir.argtypes = [_P, ctypes.c_char_p]
_lib.nfs_destroy_url.argtypes = [ctypes.POINTER(_Url)]
_lib.nfs_get_error.restype = ctypes.c_char_p
_lib.nfs_get_error.argtypes = [_P]
_lib.nfs_destroy_context.argtypes = [_P]
_lib.nfs_readdir.restype = ctypes.POINTER(_Dirent)
_lib.nfs_readdir.argtypes = [_P, _P]
for _name in ("nfs_mount", "nfs_open", "nfs_open2", "nfs_creat", "nfs_close", "nfs_pread",
              "nfs_pwrite", "nfs_fsync", "nfs_mkdir", "nfs_rmdir", "nfs_unlink", "nfs_rename",
              "nfs_symlink", "nfs_readlink", "nfs_link", "nfs_chmod", "nfs_chown",
              "nfs_truncate", "nfs_stat64", "nfs_lstat64", "nfs_fstat64", "nfs_opendir",
              "nfs_closedir", "nfs_set_autoreconnect", "nfs_lockf"):
    getattr(_lib, _name).restype = ctypes.c_int
_lib.nfs_pread.argtypes = [_P, _P, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_void_p]
_lib.nfs_pwrite.argtypes = [_P, _P, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_void_p]
_lib.nfs_closedir.restype = None


class Nfs:
    """One NFS session: Nfs("127.0.0.1", "/", port=2049, version=3, mount_port=2050,
    uid=1000, gid=1000). Paths are relative to the export, starting with "/"."""

    def __init__(self, host, export, port, version=3, mount_port=None, uid=None, gid=None):
        self.version = version
        # A c_void_p, not an int: ctypes passes a bare int as a 32-bit C int.
        self.ctx = _P(_lib.nfs_init_context())
        if not self.ctx.value:
            raise OSError(errno.ENOMEM, "nfs_init_context")
        args = ["nfsport=%d" % port, "version=%d" % version]
        if mount_port:
            args.append("mountport=%d" % mount_port)
        if uid is not None:
            args.append("uid=%d" % uid)
        if gid is not None:
            args.append("gid=%d" % gid)
        url = "nfs://%s%s?%s" % (host, export, "&".join(args))
        u = _lib.nfs_parse_url_dir(self.ctx, url.encode())
        if not u:
            self.close()
            raise OSError(errno.EINVAL, "bad url %s" % url)
        try:
            self._check(_lib.nfs_mount(self.ctx, u.contents.server, u.contents.path), "mount")
        except OSError:
            _lib.nfs_destroy_url(u)
            self.close()
            raise
        _lib.nfs_destroy_url(u)

    def close(self):
        if self.ctx and self.ctx.value:
            _lib.nfs_destroy_context(self.ctx)
            self.ctx = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _check(self, rc, what):
        if rc < 0:
            msg = _lib.nfs_get_error(self.ctx) if self.ctx else b""
            raise OSError(-rc, "%s: %s" % (what, (msg or b"").decode(errors="replace")))
        return rc

    def open(self, path, flags=os.O_RDONLY, mode=0o644):
        fh = _P()
        if flags & os.O_CREAT:
            rc = _lib.nfs_open2(self.ctx, path.encode(), flags, mode, ctypes.byref(fh))
        else:
            rc = _lib.nfs_open(self.ctx, path.encode(), flags, ctypes.byref(fh))
        self._check(rc, "open " + path)
        return fh

    def fclose(self, fh):
        self._check(_lib.nfs_close(self.ctx, fh), "close")

    def pread(self, fh, off, count):
        buf = ctypes.create_string_buffer(count)
        n = self._check(_lib.nfs_pread(self.ctx, fh, off, count, buf), "pread")
        return buf.raw[:n]

    def pwrite(self, fh, off, data):
        n = self._check(_lib.nfs_pwrite(self.ctx, fh, off, len(data), data), "pwrite")
        if n != len(data):
            raise OSError(errno.EIO, "short write %d of %d" % (n, len(data)))

    # nfs_lockf's operations (NFSv4 only): lock, try to lock, unlock, test.
    F_LOCK, F_TLOCK, F_ULOCK, F_TEST = 0, 1, 2, 3

    def lockf(self, fh, op, count=1 << 20):
        """An NFSv4 byte-range lock of count bytes from the file's offset (0 is invalid)."""
        self._check(_lib.nfs_lockf(self.ctx, fh, op, ctypes.c_uint64(count)), "lockf")

    def fsync(self, fh):
        self._check(_lib.nfs_fsync(self.ctx, fh), "fsync")

    def write_file(self, path, data, mode=0o644, chunk=None):
        # libnfs 4.0's NFSv4 WRITE cannot encode more than about 4000 bytes (its
        # nfs-cp fails the same way), so NFSv4 writes go in small pieces.
        if chunk is None:
            chunk = 1 << 20 if self.version == 3 else 3000
        # libnfs's NFSv4 open with O_CREAT refuses an existing file (EXIST).
        try:
            fh = self.open(path, os.O_WRONLY | os.O_TRUNC)
        except FileNotFoundError:
            fh = self.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        try:
            for off in range(0, len(data), chunk):
                self.pwrite(fh, off, data[off:off + chunk])
        finally:
            self.fclose(fh)

    def read_file(self, path, chunk=1 << 20):
        fh = self.open(path)
        out = []
        off = 0
        try:
            while True:
                b = self.pread(fh, off, chunk)
                if not b:
                    break
                out.append(b)
                off += len(b)
        finally:
            self.fclose(fh)
        return b"".join(out)

    def read_into(self, path, buf, chunk=1 << 20):
        """Reads the file into buf (a writable buffer, bytearray or mmap, as large as
        the file or larger) with one READ of chunk bytes at a time, as read_file does,
        but allocating nothing per READ: what a client that owns its buffers (a cp,
        a data loader) does. Returns the number of bytes read."""
        view = (ctypes.c_char * len(buf)).from_buffer(buf)
        base = ctypes.addressof(view)
        fh = self.open(path)
        off = 0
        try:
            while off < len(buf):
                n = self._check(_lib.nfs_pread(self.ctx, fh, off, min(chunk, len(buf) - off),
                                               ctypes.c_void_p(base + off)), "pread")
                if not n:
                    break
                off += n
        finally:
            self.fclose(fh)
            del view
        return off

    def stat(self, path, follow=True):
        st = Stat()
        fn = _lib.nfs_stat64 if follow else _lib.nfs_lstat64
        self._check(fn(self.ctx, path.encode(), ctypes.byref(st)), "stat " + path)
        return st

    def fstat(self, fh):
        st = Stat()
        self._check(_lib.nfs_fstat64(self.ctx, fh, ctypes.byref(st)), "fstat")
        return st

    def mkdir(self, path):
        self._check(_lib.nfs_mkdir(self.ctx, path.encode()), "mkdir " + path)

    def rmdir(self, path):
        self._check(_lib.nfs_rmdir(self.ctx, path.encode()), "rmdir " + path)

    def unlink(self, path):
        self._check(_lib.nfs_unlink(self.ctx, path.encode()), "unlink " + path)

    def rename(self, a, b):
        self._check(_lib.nfs_rename(self.ctx, a.encode(), b.encode()), "rename " + a)

    def symlink(self, target, path):
        self._check(_lib.nfs_symlink(self.ctx, target.encode(), path.encode()), "symlink " + path)

    def readlink(self, path):
        buf = ctypes.create_string_buffer(4096)
        self._check(_lib.nfs_readlink(self.ctx, path.encode(), buf, 4096), "readlink " + path)
        return buf.value.decode()

    def link(self, a, b):
        self._check(_lib.nfs_link(self.ctx, a.encode(), b.encode()), "link " + a)

    def chmod(self, path, mode):
        self._check(_lib.nfs_chmod(self.ctx, path.encode(), mode), "chmod " + path)

    def chown(self, path, uid, gid):
        self._check(_lib.nfs_chown(self.ctx, path.encode(), uid, gid), "chown " + path)

    def truncate(self, path, size):
        self._check(_lib.nfs_truncate(self.ctx, path.encode(), ctypes.c_uint64(size)),
                    "truncate " + path)

    def listdir(self, path):
        d = _P()
        self._check(_lib.nfs_opendir(self.ctx, path.encode(), ctypes.byref(d)), "opendir " + path)
        names = []
        try:
            while True:
                e = _lib.nfs_readdir(self.ctx, d)
                if not e:
                    break
                n = e.contents.name.decode(errors="surrogateescape")
                if n not in (".", ".."):
                    names.append(n)
        finally:
            _lib.nfs_closedir(self.ctx, d)
        return names
