"""Stoker from Python: files, directories and batched reads over libstoker.

    import stoker
    c = stoker.connect()                      # $STOKER_CLUSTER, or the `stoker up` cluster
    with c.open("/data/a.bin", "wb") as f:
        f.write(b"hello")
    with c.open("/data/a.bin") as f:          # binary; "rb" is the default mode
        buf = bytearray(5)
        f.readinto(buf)                       # zero-copy into any writable buffer
    c.read_batch([("/data/a.bin", 0, 2), ("/data/a.bin", 3, None)])   # [b"he", b"lo"]

Everything is binary: there is no text mode. Errors are OSError subclasses chosen
by errno (FileNotFoundError, PermissionError, IsADirectoryError, ...); use of a
closed file or client raises ClosedError (an OSError with errno EBADF that is also
a ValueError, as the io module would raise). The GIL is released during I/O, and
a Client keeps working in a child after fork() (DataLoader workers): its first
call there reconnects. See docs/python.md.
"""
import errno as _errno
import os as _os
import posixpath as _pp
import stat as _stat

from . import _stoker
from ._stoker import ClosedError, File

__all__ = ["connect", "Client", "File", "ClosedError", "stat_result", "split_url"]

_DT_DIR = 4
_DT_UNKNOWN = 0

# mode string -> (open flags, needs existing file?)
_MODES = {
    "r": _os.O_RDONLY,
    "w": _os.O_WRONLY | _os.O_CREAT | _os.O_TRUNC,
    "a": _os.O_WRONLY | _os.O_CREAT | _os.O_APPEND,
    "x": _os.O_WRONLY | _os.O_CREAT | _os.O_EXCL,
    "r+": _os.O_RDWR,
    "w+": _os.O_RDWR | _os.O_CREAT | _os.O_TRUNC,
    "a+": _os.O_RDWR | _os.O_CREAT | _os.O_APPEND,
    "x+": _os.O_RDWR | _os.O_CREAT | _os.O_EXCL,
}


def _mode_flags(mode):
    if not isinstance(mode, str):
        raise TypeError("mode must be a str, not %s" % type(mode).__name__)
    if "t" in mode:
        raise ValueError("stoker files are binary: mode %r has 't'" % mode)
    key = mode.replace("b", "")
    if mode.count("b") > 1 or key not in _MODES:
        raise ValueError("invalid mode: %r" % mode)
    return _MODES[key]


def stat_result(t):
    """An os.stat_result from the tuple the extension returns."""
    mode, ino, dev, nlink, uid, gid, size, at, mt, ct, blksize, blocks = t
    return _os.stat_result(
        (mode, ino, dev, nlink, uid, gid, size, at // 10**9, mt // 10**9, ct // 10**9),
        {"st_atime": at / 1e9, "st_mtime": mt / 1e9, "st_ctime": ct / 1e9,
         "st_atime_ns": at, "st_mtime_ns": mt, "st_ctime_ns": ct,
         "st_blksize": blksize, "st_blocks": blocks})


def split_url(url):
    """"stk://HOST:PORT/a/b" -> ("HOST:PORT", "/a/b"); a plain path -> (None, path)."""
    if url.startswith("stk://"):
        rest = url[6:]
        i = rest.find("/")
        if i < 0:
            return rest, "/"
        return rest[:i], rest[i:]
    return None, url


class Client(_stoker.Client):
    """A connection to one cluster (see connect()). Safe to share between threads."""

    def open(self, path, mode="rb", perm=0o644):
        """Opens a file. mode: "rb", "wb", "ab", "xb", "r+b", "w+b", "a+b" ("b" optional).
        perm: permission bits for a file created (no umask is applied)."""
        return self._open(path, _mode_flags(mode), mode, perm)

    def stat(self, path):
        """os.stat_result of path (a symlink itself is not followed)."""
        return stat_result(self._stat(path))

    def exists(self, path):
        try:
            self._stat(path)
            return True
        except FileNotFoundError:
            return False

    def isdir(self, path):
        try:
            return _stat.S_ISDIR(self._stat(path)[0])
        except (FileNotFoundError, NotADirectoryError):
            return False

    def isfile(self, path):
        try:
            return _stat.S_ISREG(self._stat(path)[0])
        except (FileNotFoundError, NotADirectoryError):
            return False

    def getsize(self, path):
        return self._stat(path)[6]

    def listdir(self, path="/"):
        """Names in a directory, in the server's order, without "." and ".."."""
        return [name for name, _ in self._scandir(path)]

    def remove(self, path):
        self.unlink(path)

    def makedirs(self, path, mode=0o755, exist_ok=False):
        """mkdir -p: makes path and its missing parents."""
        path = _pp.normpath(path)
        parent = _pp.dirname(path)
        if parent and parent != path and not self.exists(parent):
            self.makedirs(parent, mode, exist_ok=True)
        try:
            self.mkdir(path, mode)
        except FileExistsError:
            if not exist_ok or not self.isdir(path):
                raise

    def walk(self, top="/", topdown=True):
        """As os.walk: yields (dirpath, dirnames, filenames); with topdown, dirnames may
        be pruned in place. Errors listing a directory other than top are skipped."""
        return self._walk(_pp.normpath(top), topdown, True)

    def _walk(self, top, topdown, is_top):
        try:
            ents = self._scandir(top)
        except OSError:
            if is_top:
                raise
            return
        dirs, files = [], []
        for name, dtype in ents:
            if dtype == _DT_UNKNOWN:
                is_dir = self.isdir(_pp.join(top, name))
            else:
                is_dir = dtype == _DT_DIR
            (dirs if is_dir else files).append(name)
        if topdown:
            yield top, dirs, files
        for d in dirs:
            yield from self._walk(_pp.join(top, d), topdown, False)
        if not topdown:
            yield top, dirs, files

    def rmtree(self, path):
        """rm -r."""
        for name, dtype in self._scandir(path):
            p = _pp.join(path, name)
            if dtype == _DT_DIR or (dtype == _DT_UNKNOWN and self.isdir(p)):
                self.rmtree(p)
            else:
                self.unlink(p)
        self.rmdir(path)

    def statvfs(self):
        return _os.statvfs_result(self._statvfs())

    def read_file(self, path):
        """The whole file's bytes."""
        with self.open(path) as f:
            return f.read()

    def write_file(self, path, data, mode="wb"):
        """Writes data to path (created or truncated), durable on return."""
        with self.open(path, mode) as f:
            f.write(data)

    def __repr__(self):
        if self.closed:
            return "<stoker.Client closed>"
        return "<stoker.Client %s>" % self.address

    def __reduce__(self):
        # A Client pickles as its address (for spawn-started workers): a new connection.
        return (connect, (self.address,))


def connect(cluster=None, **opts):
    """Connects to a cluster: "stk://HOST:PORT", "HOST:PORT", or None for $STOKER_CLUSTER
    (else the cluster `stoker up` started here). Options: conns_per_node,
    max_inflight (batched chunk reads in flight, default 64), batch_threads,
    write_buffer, stripe, chunk_size, qos_class ("training-read", "default" or
    "checkpoint": the QoS class of its reads and writes, docs/qos.md; default
    $STOKER_QOS_CLASS, else "default")."""
    if cluster is not None and cluster.startswith("stk://"):
        cluster = split_url(cluster)[0]
    return Client(cluster, **opts)
