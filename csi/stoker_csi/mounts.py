"""Mounts on a node: the kernel's mount table is the only record.

Nothing about mounts is kept in the driver's memory or files: whether a path is
mounted, from which file system and folder, and how many volumes still use a
shared Stoker mount are read from /proc/self/mountinfo each time. A driver that
restarts (a crash, an upgrade of the node plugin) so finds every mount it made,
and repeats of NodeStage/NodePublish after it are answered from the table.
"""
import errno
import os
import shlex
import subprocess


def _unescape(s):
    # mountinfo writes space, tab, newline and backslash as \ooo
    out, i = [], 0
    while i < len(s):
        if s[i] == "\\" and i + 4 <= len(s) and s[i + 1:i + 4].isdigit():
            out.append(chr(int(s[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(s[i])
            i += 1
    return "".join(out)


class Entry:
    __slots__ = ("dev", "root", "point", "opts", "fstype", "source")

    def __init__(self, line):
        f = line.split()
        sep = f.index("-")
        self.dev = f[2]
        self.root = _unescape(f[3])
        self.point = _unescape(f[4])
        self.opts = f[5].split(",")
        self.fstype = f[sep + 1]
        self.source = _unescape(f[sep + 2])

    @property
    def readonly(self):
        return "ro" in self.opts


def table():
    with open("/proc/self/mountinfo") as f:
        return [Entry(line) for line in f if line.strip()]


def at(path):
    """The mount on top at path (the last one mounted there), or None."""
    path = os.path.normpath(path)
    found = None
    for e in table():
        if e.point == path:
            found = e
    return found


# What a path on a FUSE mount whose daemon is gone answers: ENOTCONN, or
# ECONNABORTED once the connection was aborted (`stoker umount` of a dead mount),
# ECANCELED for requests that were queued to the daemon when it died.
DEAD = (errno.ENOTCONN, errno.ECONNABORTED, errno.ECANCELED, errno.EIO)


def alive(path):
    """False when path is on a FUSE mount whose daemon is gone (ENOTCONN)."""
    try:
        os.statvfs(path)  # always asks the daemon: a stat may be answered from a cache
        return True
    except OSError as e:
        return e.errno not in DEAD


def _run(args):
    p = subprocess.run(args, capture_output=True, text=True)
    if p.returncode != 0:
        raise OSError(errno.EIO, "%s: %s" % (" ".join(shlex.quote(a) for a in args),
                                             p.stderr.strip() or "exit %d" % p.returncode))


def bind(src, dst, readonly):
    """Bind-mounts folder src on dst, read-only if asked (util-linux remounts the
    bind read-only in the same command)."""
    _run(["mount", "--bind"] + (["-o", "ro"] if readonly else []) + [src, dst])


def unmount_all(path):
    """Unmounts everything stacked at path; lazily when busy (a pod going away)."""
    for _ in range(16):
        if at(path) is None:
            return
        p = subprocess.run(["umount", path], capture_output=True, text=True)
        if p.returncode != 0:
            _run(["umount", "-l", path])
    raise OSError(errno.EBUSY, "%s: still mounted after 16 unmounts" % path)


def users(dev, shared_point):
    """Mount points of the same file system (dev) other than the shared mount."""
    return [e.point for e in table() if e.dev == dev and e.point != shared_point]
