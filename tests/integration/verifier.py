"""A workload for fault tests: write files, remember what was acknowledged, and after
any fault check that every byte read back is one that was written (never zeros that
nobody wrote).

    v = Verifier(seed=7)
    v.write_all(cli_writer(cluster, "/d"), [("a", 1000), ("b", 64 << 20)])   # all ack
    ... stop a storage node ...
    v.write_all(cli_writer(cluster, "/d"), [("a", 5000), ("c", 300)])        # some fail
    ... bring it back ...
    v.check(cli_reader(cluster, "/d"))       # raises AssertionError with every bad file

A writer is a callable writer(name, data) that returns when the write was
acknowledged (its close, and its fsync where it has one, returned success) and
raises when it was not. A reader is reader(name) -> bytes, or None when the file does
not exist; it raises when the read fails. Writers and readers for the CLI, the
Python package, a mount and the S3 gateway are below; a fault test passes its own.

For each file the verifier keeps the last acknowledged content (or "absent") and the
contents of every attempt since that was not acknowledged. check() then wants:

- a file whose last attempt was acknowledged: exactly those bytes (sha256 equal);
- a file with unacknowledged attempts since: every byte at offset i is byte i of the
  acknowledged content or of one of those attempts, and the file is no longer than
  the longest of them; a read error, or "no such file" when nothing was ever
  acknowledged, is also allowed (old bytes, new bytes or an error);
- never a byte that no candidate holds there. Contents hold no zero byte, so zeros
  read back (a size published over data that never reached storage) always fail.

check(reader, errors_ok=True) also lets an acknowledged file fail to read (for a
check made while the fault lasts); after recovery the default wants every
acknowledged byte back.
"""
import hashlib
import os
import random
import subprocess
import threading

from conftest import STOKER

_NO_ZERO = bytes([1]) + bytes(range(1, 256))


def content(name, size, gen, seed=0):
    """Deterministic bytes for (name, generation), none of them zero."""
    rnd = random.Random("%s/%s/%d/%d" % (seed, name, gen, size))
    return rnd.randbytes(size).translate(_NO_ZERO)


def sha(data):
    return hashlib.sha256(data).hexdigest()


class _State:
    def __init__(self):
        self.acked = None       # bytes of the last acknowledged write, None: absent
        self.pending = []       # attempts since, not acknowledged
        self.errors = []


class Verifier:
    def __init__(self, seed=0):
        self.seed = seed
        self.files = {}
        self.gen = 0
        self.lock = threading.Lock()
        self.acks = 0
        self.fails = 0

    def write(self, writer, name, size):
        """One write of size new bytes to name through writer; True when acknowledged."""
        with self.lock:
            self.gen += 1
            data = content(name, size, self.gen, self.seed)
            st = self.files.setdefault(name, _State())
            st.pending.append(data)
        try:
            writer(name, data)
        except Exception as e:  # the writer's way of saying "not acknowledged"
            with self.lock:
                st.errors.append(repr(e))
                self.fails += 1
            return False
        with self.lock:
            # Acknowledged: from now on this content, exactly (writes of one name
            # never overlap, so no other attempt is in flight).
            st.acked = data
            st.pending = []
            self.acks += 1
        return True

    def write_all(self, writer, specs, threads=4):
        """Writes [(name, size), ...] with up to threads at once; returns the names acked."""
        specs = list(specs)
        acked = []
        lock = threading.Lock()

        def work():
            while True:
                with lock:
                    if not specs:
                        return
                    name, size = specs.pop(0)
                if self.write(writer, name, size):
                    with lock:
                        acked.append(name)

        ts = [threading.Thread(target=work) for _ in range(max(1, threads))]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        return acked

    def acked_sha(self):
        """{name: sha256} of every file whose last write was acknowledged."""
        return {n: sha(s.acked) for n, s in self.files.items()
                if s.acked is not None and not s.pending}

    def _check_one(self, name, st, got):
        if not st.pending:
            if st.acked is None:
                return None
            if got is None:
                return "acknowledged file is gone"
            if got != st.acked:
                return "acknowledged %d bytes (sha256 %s), read %d (sha256 %s)%s" % (
                    len(st.acked), sha(st.acked)[:16], len(got), sha(got)[:16],
                    _first_diff(got, [st.acked]))
            return None
        cands = st.pending + ([st.acked] if st.acked is not None else [])
        if got is None:
            return None if st.acked is None else "file acknowledged before is gone"
        longest = max(len(c) for c in cands)
        if len(got) > longest:
            return "read %d bytes, no write was longer than %d" % (len(got), longest)
        bad = _first_diff(got, cands)
        return "read bytes nobody wrote" + bad if bad else None

    def check(self, reader, errors_ok=False):
        """Reads every file back with reader; raises AssertionError listing bad files."""
        bad = []
        for name in sorted(self.files):
            st = self.files[name]
            try:
                got = reader(name)
            except Exception as e:
                if st.pending or errors_ok:
                    continue  # an error is an allowed answer for a failed write
                bad.append("%s: read failed: %r" % (name, e))
                continue
            why = self._check_one(name, st, got)
            if why:
                bad.append("%s: %s (write errors: %s)" % (name, why, st.errors[-1:]))
        if bad:
            raise AssertionError("%d of %d files wrong:\n  %s" % (
                len(bad), len(self.files), "\n  ".join(bad)))


def _first_diff(got, cands, block=1 << 16):
    """"" when every byte of got is the same byte of some candidate, else where not."""
    for off in range(0, len(got), block):
        g = got[off:off + block]
        if any(c[off:off + len(g)] == g for c in cands):
            continue
        for i, b in enumerate(g):
            j = off + i
            if not any(j < len(c) and c[j] == b for c in cands):
                return " at offset %d: byte %d%s" % (j, b, " (an unwritten zero)" if b == 0 else "")
    return ""


# ---- writers and readers ----

def cli_writer(cluster, root, env=None):
    """`stoker put - ROOT/NAME`; acknowledged when it exits 0."""
    env = dict(env or cluster_env(cluster))

    def write(name, data):
        p = subprocess.run([STOKER, "put", "-", root + "/" + name], input=data,
                           capture_output=True, env=env, timeout=300)
        if p.returncode != 0:
            raise OSError("stoker put exited %d: %s" % (p.returncode,
                                                        p.stderr.decode(errors="replace")))
    return write


def cli_reader(cluster, root, env=None):
    """`stoker cat ROOT/NAME`; None when it says there is no such file."""
    env = dict(env or cluster_env(cluster))

    def read(name):
        p = subprocess.run([STOKER, "cat", root + "/" + name], capture_output=True, env=env,
                           timeout=300)
        if p.returncode != 0:
            err = p.stderr.decode(errors="replace")
            if "No such file" in err:
                return None
            raise OSError("stoker cat exited %d: %s" % (p.returncode, err))
        return p.stdout
    return read


_PY_WRITE = """
import sys, stoker
c = stoker.connect(sys.argv[1])
f = c.open(sys.argv[2], "wb")
try:
    f.write(sys.stdin.buffer.read())
    f.flush()
finally:
    f.close()
"""


def python_writer(cluster, root, env):
    """The Python package (libstoker) in a child python: open "wb", write, close.
    env must put the built package on PYTHONPATH (pyhelp.env_for)."""
    def write(name, data):
        p = subprocess.run(["/usr/bin/python3", "-c", _PY_WRITE, cluster.url, root + "/" + name],
                           input=data, capture_output=True, env=env, timeout=300)
        if p.returncode != 0:
            raise OSError("python writer exited %d: %s" % (
                p.returncode, p.stderr.decode(errors="replace")[-2000:]))
    return write


def path_writer(root, fsync=True):
    """A folder (a mount): open, write, fsync, close; acknowledged when all succeed."""
    def write(name, data):
        fd = os.open(os.path.join(root, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            if fsync:
                os.fsync(fd)
        except BaseException:
            try:
                os.close(fd)
            except OSError:
                pass
            raise
        os.close(fd)
    return write


def path_reader(root):
    def read(name):
        try:
            with open(os.path.join(root, name), "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None
    return read


def s3_writer(s3, bucket):
    """boto3 put_object; acknowledged when it returns (HTTP 200)."""
    def write(name, data):
        s3.put_object(Bucket=bucket, Key=name, Body=data)
    return write


def s3_reader(s3, bucket):
    def read(name):
        try:
            return s3.get_object(Bucket=bucket, Key=name)["Body"].read()
        except Exception as e:
            code = getattr(e, "response", {}).get("Error", {}).get("Code")
            if code in ("NoSuchKey", "404"):
                return None
            raise
    return read


def cluster_env(cluster, **extra):
    env = dict(os.environ, STOKER_CLUSTER=cluster.url)
    env.update(extra)
    return env
