"""Checkpoints that are never half-written: save(obj, path) and load(path).

    import stoker.checkpoint as ckpt
    ckpt.save(model.state_dict(), "stk://HOST:PORT/run1/model.pt")
    state = ckpt.load("stk://HOST:PORT/run1/model.pt", map_location="cpu")

save() serialises with torch.save straight into a new file next to the target,
PATH.tmp-HOST-PID-RANDOM, in large writes (each tensor's bytes as torch.save hands
them over, without a copy, small records gathered into 64 MiB; striped over the
file's chains in parallel, sent by a thread while torch.save goes on), closes it
(which returns only once every byte is on stable storage of every replica), then
renames it over PATH. Rename is atomic, so a reader opening PATH sees the old
checkpoint or the new one, never a partial one, even if the writer is killed
(kill -9) mid-save. A writer killed mid-save leaves its temporary file behind; the
next save on the same host removes those of processes that no longer exist.

Local-first: save(obj, path, local_dir="/nvme/ckpt") writes the checkpoint to the
local folder (fsynced), records it in a small journal there, and returns at once
with an Upload handle (.wait(), .done()); a background thread uploads it (with the
same temporary-file-and-rename rule) and then drops the local copy and the journal
record. A crash before the upload completes loses nothing already on local disk:
the next local-first save with that folder, or `stoker checkpoint resume DIR`
(python3 -m stoker.checkpoint resume DIR), finishes it. Uploads to one path are
applied in save order across processes sharing the folder: an older checkpoint
never replaces a newer one.
"""
import atexit
import errno
import fcntl
import hashlib
import io
import json
import os
import queue
import socket
import sys
import threading
import time
import uuid

import stoker

__all__ = ["save", "load", "resume", "Upload"]

WRITE_SIZE = 64 << 20
JOURNAL = ".stoker-journal"
RENAME_EXCHANGE = 2   # linux/fs.h
# How long a replaced checkpoint is kept (under a temporary name) for readers that
# opened it before the replacement: Stoker frees a file's data when its last name
# goes, even while another client reads it.
RETIRE_GRACE = float(os.environ.get("STOKER_CHECKPOINT_GRACE", "60"))

_clients = {}
_clients_lock = threading.Lock()


def _client(cluster, client):
    """The Client for a cluster: the caller's, else one cached per (process, address),
    whose reads and writes are QoS class "checkpoint" (docs/qos.md) unless
    $STOKER_QOS_CLASS says otherwise: a checkpoint gives way to training reads."""
    if client is not None:
        return client
    key = (os.getpid(), cluster)
    with _clients_lock:
        c = _clients.get(key)
        if c is None or c.closed:
            cls = os.environ.get("STOKER_QOS_CLASS") or "checkpoint"
            c = _clients[key] = stoker.connect(cluster, qos_class=cls)
        return c


def _split(path, client):
    cluster, p = stoker.split_url(path)
    if not p.startswith("/"):
        raise ValueError("checkpoint path must be absolute: %r" % path)
    return _client(cluster, client), p


def _tmp_name(path):
    return "%s.tmp-%s-%d-%s" % (path, socket.gethostname(), os.getpid(), uuid.uuid4().hex[:12])


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _remove_stale_tmps(c, path):
    """Removes PATH.tmp-THISHOST-PID-* left by processes of this host that are gone
    (a save killed mid-way, or a replaced checkpoint whose retirement timer died with
    its process), once they are older than RETIRE_GRACE."""
    d, base = os.path.split(path)
    prefix = "%s.tmp-%s-" % (base, socket.gethostname())
    try:
        names = c.listdir(d or "/")
    except OSError:
        return
    for n in names:
        if not n.startswith(prefix):
            continue
        try:
            pid = int(n[len(prefix):].split("-")[0])
        except ValueError:
            continue
        if pid != os.getpid() and not _pid_alive(pid):
            p = os.path.join(d, n)
            try:
                if time.time() - c.stat(p).st_mtime >= RETIRE_GRACE:
                    c.unlink(p)
            except OSError:
                pass


def _retire(c, name):
    """Removes a replaced checkpoint once readers have had RETIRE_GRACE to finish."""
    def gone():
        try:
            c.unlink(name)
        except OSError:
            pass
    if RETIRE_GRACE <= 0:
        gone()
        return
    t = threading.Timer(RETIRE_GRACE, gone)
    t.daemon = True
    t.start()


class _Writer:
    """A write-only stream for torch.save, writing f in order from one background
    thread, so that torch.save goes on serialising while earlier bytes are on the
    wire.

    Small writes are gathered into WRITE_SIZE buffers (two, used in turn). A write
    of at least WRITE_SIZE is not copied: a bytes object (what torch.save hands over
    for each tensor's storage) cannot change, so it is sent from where it lies,
    later, by the thread; any other buffer (a memoryview valid only during the call)
    is sent from the calling thread before write returns. At most two writes wait
    for or are on the wire at once."""

    def __init__(self, f, size=WRITE_SIZE):
        self.f = f
        self.size = size
        self.spare = [bytearray(size), bytearray(size)]
        self.buf = None         # the buffer being filled
        self.n = 0
        self.pos = 0
        self.err = None         # the first failure of the thread, raised by the next call
        self.todo = queue.Queue(maxsize=1)    # (data, nbytes, buffer to give back or None)
        self.back = queue.Queue()             # buffers sent, free again
        self.thread = None

    def _run(self):
        while True:
            item = self.todo.get()
            if item is None:
                self.todo.task_done()
                return
            data, n, spare = item
            if self.err is None:
                try:
                    self.f.write(memoryview(data)[:n])
                except BaseException as e:  # noqa: B902 - handed to the saving thread
                    self.err = e
            if spare is not None:
                self.back.put(spare)
            del data, item
            self.todo.task_done()

    def _queue(self, data, n, spare):
        if self.thread is None:
            self.thread = threading.Thread(target=self._run, name="stoker-checkpoint-write",
                                           daemon=True)
            self.thread.start()
        self.todo.put((data, n, spare))

    def _check(self):
        if self.err is not None:
            raise self.err

    def _flush(self):
        if self.n:
            self._queue(self.buf, self.n, self.buf)
            self.buf = None
            self.n = 0

    def _drain(self):
        self.todo.join()
        self._check()

    def write(self, b):
        self._check()
        mv = memoryview(b).cast("B")
        total = mv.nbytes
        if total >= self.size:
            self._flush()
            if type(b) is bytes:
                self._queue(b, total, None)
            else:
                self._drain()
                self.f.write(mv)
        else:
            while len(mv):
                if self.buf is None:
                    self.buf = self.spare.pop() if self.spare else self.back.get()
                take = min(len(mv), self.size - self.n)
                self.buf[self.n:self.n + take] = mv[:take]
                self.n += take
                mv = mv[take:]
                if self.n == self.size:
                    self._flush()
        self.pos += total
        return total

    def tell(self):
        return self.pos

    def flush(self):
        pass

    def _stop(self):
        if self.thread is not None:
            self.todo.put(None)
            self.thread.join()
            self.thread = None

    def finish(self):
        """Sends what is left; returns once every byte was written (or raises)."""
        self._check()
        self._flush()
        self._stop()
        self._check()

    def abort(self):
        """Ends the thread without raising; what it had queued is still written."""
        self._stop()


def _save_to(c, path, write_fn):
    """Writes a new file with write_fn(stream) and puts it in place of path; returns
    its size.

    The new file is swapped with the old one (RENAME_EXCHANGE, atomic), so the old
    checkpoint keeps a name (the temporary one) and its data stays readable for
    readers that opened it before the swap; it is removed RETIRE_GRACE later."""
    tmp = _tmp_name(path)
    f = c.open(tmp, "xb")
    w = _Writer(f)
    try:
        write_fn(w)
        w.finish()
        f.close()       # durable on every replica before it has a name readers use
        try:
            c.rename(tmp, path, RENAME_EXCHANGE)
        except FileNotFoundError:
            c.rename(tmp, path)     # nothing to replace
        else:
            _retire(c, tmp)         # tmp now names the old checkpoint
        return w.pos
    except BaseException:
        w.abort()
        try:
            f.close()
        except OSError:
            pass
        try:
            c.unlink(tmp)
        except OSError:
            pass
        raise


def save(obj, path, client=None, local_dir=None, **torch_kw):
    """Saves obj (anything torch.save takes) to path atomically. path: "/dir/x.pt" on
    the default cluster (or client's), or "stk://HOST:PORT/dir/x.pt". With local_dir,
    writes there first and returns an Upload handle; else returns None once the
    checkpoint is durable and in place."""
    import torch

    t0 = time.perf_counter()
    if local_dir is not None:
        h = _save_local_first(obj, path, client, local_dir, torch_kw)
        _record("save", t0, h.size)
        return h
    c, p = _split(path, client)
    _remove_stale_tmps(c, p)
    n = _save_to(c, p, lambda w: torch.save(obj, w, **torch_kw))
    _record("save", t0, n)


def _record(kind, t0, nbytes):
    """Tells the job monitors of this process (stoker.jobs) how long it took."""
    jobs = sys.modules.get("stoker.jobs")
    if jobs is not None:
        jobs._checkpoint(kind, time.perf_counter() - t0, nbytes)


def load(path, client=None, map_location=None, **torch_kw):
    """Loads a checkpoint saved by save(). The file is read whole, in one striped
    parallel read, then deserialised from memory."""
    import torch

    t0 = time.perf_counter()
    c, p = _split(path, client)
    with c.open(p) as f:
        data = f.read()
    obj = torch.load(io.BytesIO(data), map_location=map_location, **torch_kw)
    _record("load", t0, len(data))
    return obj


# ---- local-first ----

class Upload:
    """The upload of one local-first save. wait() returns once the checkpoint is in
    place (raising what the upload raised); done() says whether it has finished."""

    def __init__(self, path, entry, size=None):
        self.path = path
        self.entry = entry
        self.size = size    # bytes of the checkpoint
        self._event = threading.Event()
        self._error = None

    def _finish(self, error=None):
        self._error = error
        self._event.set()

    def done(self):
        return self._event.is_set()

    def wait(self, timeout=None):
        if not self._event.wait(timeout):
            raise TimeoutError("upload of %s still running" % self.path)
        if self._error is not None:
            raise self._error
        return self.path

    def __repr__(self):
        return "<stoker.checkpoint.Upload %s %s>" % (self.path, "done" if self.done() else "running")


def _fsync_dir(d):
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_local(path, data_fn):
    """Creates path with data_fn(file), fsynced, atomically (tmp + rename + dir fsync)."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        data_fn(f)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, path)
    _fsync_dir(os.path.dirname(path))


def _dest_key(cluster, path):
    return hashlib.sha1(("%s|%s" % (cluster or "", path)).encode()).hexdigest()[:20]


class _Uploader:
    """One background thread per process, uploading journal entries in FIFO order."""

    def __init__(self):
        self.q = queue.Queue()
        self.thread = None
        self.lock = threading.Lock()
        self.queued = set()   # entry paths queued or running in this process
        self.pid = os.getpid()

    def submit(self, entry_path, handle=None):
        with self.lock:
            if self.pid != os.getpid():   # a forked child: the thread is the parent's
                self.__init__()
            if entry_path in self.queued:
                return
            self.queued.add(entry_path)
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="stoker-checkpoint-upload",
                                               daemon=True)
                self.thread.start()
            self.q.put((entry_path, handle))

    def _run(self):
        while True:
            entry_path, handle = self.q.get()
            err = None
            try:
                _upload_entry(entry_path)
            except BaseException as e:  # noqa: B902 - reported through the handle
                err = e
                if handle is None:
                    print("stoker.checkpoint: upload of %s failed: %s" % (entry_path, e),
                          file=sys.stderr)
            with self.lock:
                self.queued.discard(entry_path)
            if handle is not None:
                handle._finish(err)
            self.q.task_done()

    def drain(self):
        if self.thread is not None and self.pid == os.getpid():
            self.q.join()


_uploader = _Uploader()
atexit.register(_uploader.drain)


def _upload_entry(entry_path):
    """Uploads one journal entry, unless a newer checkpoint of its path is already up.
    Holds the destination's lock (flock, in the journal folder) throughout, so that
    uploaders in several processes apply one path's checkpoints in save order."""
    jdir = os.path.dirname(entry_path)
    try:
        with open(entry_path) as f:
            e = json.load(f)
    except FileNotFoundError:
        return  # done by someone else
    key = _dest_key(e["cluster"], e["path"])
    lock_fd = os.open(os.path.join(jdir, key + ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        if not os.path.exists(entry_path):
            return
        delay = float(os.environ.get("STOKER_CHECKPOINT_UPLOAD_DELAY", "0") or 0)
        if delay:
            time.sleep(delay)   # a test hook: a window in which to crash
        done_file = os.path.join(jdir, key + ".uploaded")
        try:
            with open(done_file) as f:
                last = int(f.read().strip() or 0)
        except (FileNotFoundError, ValueError):
            last = 0
        if e["seq"] > last:
            c, p = _split(e["url"], None)
            local = os.path.join(jdir, e["data"])

            def copy(w):
                with open(local, "rb") as src:
                    while True:
                        b = src.read(WRITE_SIZE)
                        if not b:
                            break
                        w.write(b)
            _save_to(c, p, copy)
            _write_local(done_file, lambda f: f.write(b"%d\n" % e["seq"]))
        # uploaded, or superseded by a newer one: forget it
        for name in (e["data"], os.path.basename(entry_path)):
            try:
                os.unlink(os.path.join(jdir, name))
            except FileNotFoundError:
                pass
        _fsync_dir(jdir)
    finally:
        os.close(lock_fd)


def _pending(local_dir):
    jdir = os.path.join(local_dir, JOURNAL)
    try:
        names = os.listdir(jdir)
    except FileNotFoundError:
        return []
    return sorted(os.path.join(jdir, n) for n in names if n.endswith(".json"))


def _save_local_first(obj, path, client, local_dir, torch_kw):
    import torch

    cluster, p = stoker.split_url(path)
    if not p.startswith("/"):
        raise ValueError("checkpoint path must be absolute: %r" % path)
    # The journal names the cluster itself, not "the default": whoever resumes the
    # upload may have another default, and one path's uploads are ordered by address.
    cluster = _client(cluster, client).address
    jdir = os.path.join(local_dir, JOURNAL)
    os.makedirs(jdir, exist_ok=True)
    # Pending uploads of earlier saves go first (FIFO), then this one.
    for entry in _pending(local_dir):
        _uploader.submit(entry)
    seq = time.time_ns()
    name = "%020d-%s" % (seq, uuid.uuid4().hex[:8])
    _write_local(os.path.join(jdir, name + ".data"), lambda f: torch.save(obj, f, **torch_kw))
    url = "stk://%s%s" % (cluster, p)
    entry = {"seq": seq, "url": url, "cluster": cluster, "path": p, "data": name + ".data",
             "saved": time.time()}
    entry_path = os.path.join(jdir, name + ".json")
    _write_local(entry_path, lambda f: f.write(json.dumps(entry).encode()))
    handle = Upload(path, entry_path, os.path.getsize(os.path.join(jdir, name + ".data")))
    _uploader.submit(entry_path, handle)
    return handle


def resume(local_dir, wait=True):
    """Finishes the uploads a crash interrupted. Returns the number of journal entries
    found. With wait, returns once they are done (raising the first failure)."""
    entries = _pending(local_dir)
    if not wait:
        for e in entries:
            _uploader.submit(e)
        return len(entries)
    for e in entries:
        _upload_entry(e)
    return len(entries)


def _main(argv):
    if len(argv) != 2 or argv[0] != "resume":
        print("usage: python3 -m stoker.checkpoint resume LOCAL_DIR", file=sys.stderr)
        return 2
    if not os.path.isdir(argv[1]):
        print("stoker checkpoint: %s: %s" % (argv[1], os.strerror(errno.ENOENT)),
              file=sys.stderr)
        return 1
    try:
        n = resume(argv[1])
    except OSError as e:
        print("stoker checkpoint: %s" % e, file=sys.stderr)
        return 1
    print("resumed %d upload%s from %s" % (n, "" if n == 1 else "s", argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
