"""The training job's own view: how long it waits for data, what it reads, its checkpoints.

    from stoker.jobs import JobMonitor          # also stoker.torch.JobMonitor

    mon = JobMonitor("resnet50-run3")           # reports to the cluster's dashboard
    for epoch in range(90):
        for images, labels in mon.wrap(loader):  # any iterable: a DataLoader, ...
            step(images, labels)
        stoker.checkpoint.save(model.state_dict(), "/run3/model.pt")   # recorded
    mon.close()

wrap() times each next() on the loader's iterator: the time the training loop is
blocked waiting for its next batch, which is the time its accelerators sit idle for
data. Over each interval (5 s by default) the monitor works out the share of wall
time spent so (the data wait ratio), samples and bytes per second; a job that
waits 10% of its time or more is data-bound (the MLPerf Storage rule: accelerators
kept at least 90% busy). Samples are counted from the batch's first dimension (or
its length), bytes as the size of the bytes, arrays and tensors in the batch,
which for Stoker's datasets without a transform are the bytes read; count=
replaces both. stoker.checkpoint.save() and load() record their duration and size
in every monitor of the process by themselves; saving() and loading() time any
other checkpoint code.

Export, either or both:
- report=True (the default): a background thread POSTs the figures as JSON to the
  leading mgmtd's dashboard (http://MGMTD-METRICS/ui/api/jobs; the metrics port is
  the mgmtd's RPC port + 10, as `stoker up` places it, or dashboard="HOST:PORT"),
  signed with the cluster key when the job has it (as a Client finds it), so that
  the dashboard lists every job of the cluster. A job that ends says so
  and leaves the list at once; one that dies leaves it after three missed reports.
- port=N: an HTTP server in the training process answers GET /metrics in the
  Prometheus text format (stoker_job_* series, docs/metrics.md).

Nothing here may slow or stop training: the loop's cost is two clock reads and a
few additions per batch (docs/python.md gives the measured figure), reports go out
from the monitor's thread, and a mgmtd that cannot be reached or refuses a report
only shows in last_error (and one warning on stderr).
"""
import atexit
import hashlib
import hmac
import http.server
import json
import math
import os
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
import weakref

__all__ = ["JobMonitor", "DATA_BOUND"]

# A job waiting on data this share of its time or more is data-bound (mgmtd judges
# the same: src/mgmtd/jobs.h).
DATA_BOUND = 0.10
NAME_MAX = 128
INTERVAL_MIN, INTERVAL_MAX = 0.1, 600.0
METRICS_PORT_OFFSET = 10  # mgmtd's metrics at its RPC port + 10 (`stoker up`)
REPORT_TIMEOUT = 2.0
# Reports are signed with the cluster key: HMAC-SHA256(key, SIGN_LABEL + body) in
# X-Stoker-Signature (src/mgmtd/jobs.h).
SIGN_LABEL = b"stoker-job-report-1\n"
KEY_MIN, KEY_MAX = 32, 64


def _read_key(path):
    """The key in a cluster key file (hex digits on one line, docs/security.md)."""
    with open(path) as f:
        text = "".join(f.read().split())
    try:
        key = bytes.fromhex(text)
    except ValueError:
        raise ValueError("%s does not hold a cluster key (hex digits)" % path)
    if not KEY_MIN <= len(key) <= KEY_MAX:
        raise ValueError("%s holds a key of %d bytes, not %d to %d"
                         % (path, len(key), KEY_MIN, KEY_MAX))
    return key


def _find_key(key_file, address):
    """The cluster key as a client finds it: key_file, else $STOKER_KEY_FILE, else
    the file `stoker up` recorded for one of the mgmtd addresses; None without."""
    key_file = key_file or os.environ.get("STOKER_KEY_FILE") or None
    if key_file:
        return _read_key(key_file)
    for a in address.split(","):
        rec = "/tmp/stoker-%d/keys/%s" % (os.getuid(), a.strip())
        try:
            with open(rec) as f:
                path = f.read().split("\n")[0].strip()
        except OSError:
            continue
        if path:
            try:
                return _read_key(path)
            except (OSError, ValueError):
                continue
    return None

_monitors = weakref.WeakSet()  # the running monitors of this process
_monitors_lock = threading.Lock()


def _check_name(name):
    if not isinstance(name, str):
        raise TypeError("job name must be a str, not %s" % type(name).__name__)
    n = len(name.encode("utf-8", "surrogatepass"))
    if not 1 <= n <= NAME_MAX:
        raise ValueError("job name must be 1 to %d bytes long, not %d" % (NAME_MAX, n))
    if any(ord(c) < 0x20 or ord(c) == 0x7f or 0xd800 <= ord(c) <= 0xdfff for c in name):
        raise ValueError("job name %r holds a control character" % name)
    return name


def _nbytes(x):
    """Bytes of a numpy array or torch tensor (older torch has no .nbytes); else None."""
    nb = getattr(x, "nbytes", None)
    if nb is not None:
        return int(nb)
    es = getattr(x, "element_size", None)
    if es is not None:
        return int(es()) * int(x.numel())
    return None


def _batch_count(batch, depth=0):
    """(samples, bytes) in a batch: samples from its first dimension or length; bytes
    of the bytes-like objects, numpy arrays and tensors in it."""
    t = type(batch)
    if t is bytes or t is bytearray or t is memoryview:
        return 1, len(batch)
    shape = getattr(batch, "shape", None)
    if shape is not None:
        nb = _nbytes(batch)
        if nb is not None:
            return (int(shape[0]) if len(shape) else 1), nb
    if t is dict or isinstance(batch, dict):
        samples, total = 0, 0
        for v in batch.values():
            s, b = _batch_count(v, depth + 1)
            samples = samples or s
            total += b
        return samples, total
    if isinstance(batch, (list, tuple)):
        if not batch:
            return 0, 0
        first = batch[0]
        # a collated batch: columns (tensors, lists) of one length; else a list of samples
        columns = depth < 3 and (isinstance(first, (list, tuple, dict)) or
                                 (getattr(first, "shape", None) is not None and
                                  len(first.shape) > 0 and len(batch) < 16))
        if columns:
            samples, total = 0, 0
            for v in batch:
                s, b = _batch_count(v, depth + 1)
                samples = samples or s
                total += b
            return samples, total
        tf = type(first)
        if tf is bytes or tf is bytearray:
            try:    # a list of samples' bytes (collate_fn=list): one C loop
                return len(batch), sum(map(len, batch))
            except TypeError:
                pass
        total = 0
        for v in batch:
            tv = type(v)
            if tv is bytes or tv is bytearray:
                total += len(v)
            else:
                total += _nbytes(v) or 0
        return len(batch), total
    return 1, 0


def _dashboards(address):
    """The dashboard "HOST:PORT" of each mgmtd in "A,B,C" (RPC port + 10)."""
    out = []
    for a in address.split(","):
        a = a.strip()
        host, sep, port = a.rpartition(":")
        if not sep or not port.isdigit():
            continue
        out.append("%s:%d" % (host, int(port) + METRICS_PORT_OFFSET))
    return out


def _esc(v):
    return str(v).replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", "\\n")


class JobMonitor:
    """Records one training process's data wait, throughput and checkpoints, and
    exports them (see the module's text).

    name: the job's name on the dashboard (1 to 128 bytes, no control characters);
    every process of a job uses the same name, told apart by rank ($RANK by default,
    as torchrun sets it) and host. cluster: the cluster's address as connect() takes
    it (None: $STOKER_CLUSTER, else the `stoker up` cluster); dashboard: "HOST:PORT"
    of mgmtd's metrics endpoint(s), comma-separated, instead of the RPC port + 10.
    report: push to mgmtd. port: serve Prometheus /metrics on this port (0: any free
    one, see metrics_address; "HOST:PORT" to choose the address; None: no server).
    interval: seconds between figures and reports (0.1 to 600). key_file: the cluster
    key that signs the reports (default: found as the client finds it,
    $STOKER_KEY_FILE or the `stoker up` cluster's)."""

    def __init__(self, name, cluster=None, report=True, port=None, interval=5.0, rank=None,
                 dashboard=None, key_file=None):
        self.name = _check_name(name)
        if isinstance(interval, bool) or not isinstance(interval, (int, float)) or \
                not INTERVAL_MIN <= interval <= INTERVAL_MAX:
            raise ValueError("interval must be %g to %g seconds, not %r"
                             % (INTERVAL_MIN, INTERVAL_MAX, interval))
        self.interval = float(interval)
        if rank is None:
            env = os.environ.get("RANK", "")
            rank = int(env) if env.isdigit() else -1
        if isinstance(rank, bool) or not isinstance(rank, int) or not -1 <= rank <= 1 << 24:
            raise ValueError("rank must be an int from -1 (none) to %d, not %r" % (1 << 24, rank))
        self.rank = rank
        if cluster is not None and not isinstance(cluster, str):
            raise TypeError("cluster must be a str")
        self.cluster = cluster
        if dashboard is not None:
            if not isinstance(dashboard, str) or not dashboard.strip():
                raise ValueError("dashboard must be \"HOST:PORT[,HOST:PORT...]\"")
            dashboard = [d.strip().removeprefix("http://").rstrip("/")
                         for d in dashboard.split(",") if d.strip()]
        self._dash = dashboard              # None: found from the cluster on first report
        self._dash_i = 0
        if key_file is not None:
            self._key = _read_key(key_file)   # a bad file is an error now, not later
        else:
            self._key = False               # False: not looked for yet
        self.report = bool(report)
        self.id = uuid.uuid4().hex
        self.host = socket.gethostname()[:64] or "unknown"
        self.pid = os.getpid()
        self.last_error = None              # why the last report failed, None when it went
        self.reports = 0                    # reports mgmtd accepted
        self._warned = False
        # the counters: written by the training thread only, read by the monitor's
        self._t0 = time.monotonic()
        self.steps = 0
        self.samples = 0
        self.bytes = 0
        self.data_wait_s = 0.0
        # checkpoints: [saves, loads] of [count, last seconds, last bytes, ended at (monotonic)]
        self._ck = [[0, None, None, None], [0, None, None, None]]
        self._ck_total = [[0.0, 0], [0.0, 0]]   # seconds, bytes: for Prometheus
        # the last window's figures
        self._prev = (self._t0, 0, 0, 0, 0.0)
        self.window = {"window_s": 0.0, "data_wait_ratio": 0.0, "samples_per_s": 0.0,
                       "bytes_per_s": 0.0}
        self._stop = threading.Event()
        self._closed = False
        self._server = None
        self.metrics_address = None
        if port is not None:
            self._serve(port)
        self._thread = threading.Thread(target=self._run, name="stoker-job-monitor", daemon=True)
        self._thread.start()
        with _monitors_lock:
            _monitors.add(self)
        atexit.register(self.close)

    # ---- recording (the training thread) ----

    def wrap(self, iterable, count=None):
        """Iterates iterable (a DataLoader, ...), timing how long each next() blocks.
        count(batch) -> (samples, bytes) replaces the monitor's own count."""
        it = iter(iterable)
        clock = time.perf_counter
        counter = count or _batch_count
        while True:
            t0 = clock()
            try:
                batch = next(it)
            except StopIteration:
                self.data_wait_s += clock() - t0
                return
            self.data_wait_s += clock() - t0
            s, b = counter(batch)
            self.steps += 1
            self.samples += s
            self.bytes += b
            yield batch

    def record_wait(self, seconds, samples=0, nbytes=0):
        """Records one step by hand: seconds waited for its data, its samples and bytes."""
        if not (isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds >= 0):
            raise ValueError("seconds must be a finite number >= 0, not %r" % (seconds,))
        if not isinstance(samples, int) or samples < 0 or not isinstance(nbytes, int) or nbytes < 0:
            raise ValueError("samples and nbytes must be ints >= 0")
        self.data_wait_s += seconds
        self.steps += 1
        self.samples += samples
        self.bytes += nbytes

    def record_checkpoint(self, kind, seconds, nbytes=None):
        """Records a checkpoint "save" or "load" that took seconds, of nbytes."""
        if kind not in ("save", "load"):
            raise ValueError("kind must be \"save\" or \"load\", not %r" % (kind,))
        if not (isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds >= 0):
            raise ValueError("seconds must be a finite number >= 0, not %r" % (seconds,))
        if nbytes is not None and (not isinstance(nbytes, int) or nbytes < 0):
            raise ValueError("nbytes must be an int >= 0 or None")
        k = 0 if kind == "save" else 1
        self._ck[k] = [self._ck[k][0] + 1, float(seconds), nbytes, time.monotonic()]
        self._ck_total[k][0] += seconds
        self._ck_total[k][1] += nbytes or 0

    def saving(self, path=None, nbytes=None):
        """with mon.saving("/mnt/stoker/run/model.pt"): torch.save(...): records the
        block's duration as a checkpoint save; its size from nbytes, else path's."""
        return _Timed(self, "save", path, nbytes)

    def loading(self, path=None, nbytes=None):
        """The same for a checkpoint load."""
        return _Timed(self, "load", path, nbytes)

    # ---- figures ----

    @property
    def data_bound(self):
        """Whether the last window's data wait was DATA_BOUND (10%) or more."""
        return self.window["window_s"] > 0 and self.window["data_wait_ratio"] >= DATA_BOUND

    def _tick(self):
        now = time.monotonic()
        t, steps, samples, nbytes, wait = self._prev
        cur = (now, self.steps, self.samples, self.bytes, self.data_wait_s)
        dt = now - t
        if dt > 0:
            self.window = {
                "window_s": dt,
                "data_wait_ratio": min(1.0, max(0.0, (cur[4] - wait) / dt)),
                "samples_per_s": (cur[2] - samples) / dt,
                "bytes_per_s": (cur[3] - nbytes) / dt,
            }
        self._prev = cur

    def stats(self, final=False):
        """The report mgmtd gets, as a dict."""
        now = time.monotonic()
        r = {"v": 1, "id": self.id, "name": self.name, "host": self.host, "pid": self.pid,
             "rank": self.rank, "interval_s": self.interval, "running_s": now - self._t0,
             "steps": self.steps, "samples": self.samples, "bytes": self.bytes,
             "data_wait_s": self.data_wait_s}
        r.update(self.window)
        for k, kind in enumerate(("save", "load")):
            n, secs, nb, at = self._ck[k]
            r["checkpoint_%ss" % kind] = n
            r["checkpoint_%s_s" % kind] = secs
            r["checkpoint_%s_bytes" % kind] = nb
            r["checkpoint_%s_ago_s" % kind] = None if at is None else max(0.0, now - at)
        if final:
            r["final"] = True
        return r

    def prometheus(self):
        """The figures in the Prometheus text format."""
        lab = '{training_job="%s",rank="%d",host="%s"}' % (_esc(self.name), self.rank, _esc(self.host))
        w = self.window
        rows = [
            ("stoker_job_steps_total", "counter", "Batches the training loop took.", self.steps),
            ("stoker_job_samples_total", "counter", "Samples in those batches.", self.samples),
            ("stoker_job_read_bytes_total", "counter",
             "Bytes in those batches (the bytes read, for Stoker's datasets without a "
             "transform).", self.bytes),
            ("stoker_job_data_wait_seconds_total", "counter",
             "Time the training loop waited for its next batch.", self.data_wait_s),
            ("stoker_job_running_seconds_total", "counter", "Time since the monitor started.",
             time.monotonic() - self._t0),
            ("stoker_job_data_wait_ratio", "gauge",
             "Share of the last window's wall time spent waiting for data.",
             w["data_wait_ratio"]),
            ("stoker_job_samples_per_second", "gauge", "Samples per second, last window.",
             w["samples_per_s"]),
            ("stoker_job_read_bytes_per_second", "gauge", "Bytes per second, last window.",
             w["bytes_per_s"]),
            ("stoker_job_data_bound", "gauge",
             "1 when the last window's data wait ratio was 0.1 or more.", int(self.data_bound)),
        ]
        for k, kind in enumerate(("save", "load")):
            n, secs, nb, at = self._ck[k]
            rows += [
                ("stoker_job_checkpoint_%ss_total" % kind, "counter",
                 "Checkpoint %ss recorded." % kind, n),
                ("stoker_job_checkpoint_%s_seconds_total" % kind, "counter",
                 "Time spent in checkpoint %ss." % kind, self._ck_total[k][0]),
                ("stoker_job_checkpoint_%s_bytes_total" % kind, "counter",
                 "Bytes of checkpoint %ss (those whose size is known)." % kind,
                 self._ck_total[k][1]),
            ]
            if at is not None:
                rows.append(("stoker_job_checkpoint_last_%s_timestamp_seconds" % kind, "gauge",
                             "When the last checkpoint %s ended (Unix time)." % kind,
                             time.time() - (time.monotonic() - at)))
        out = []
        for name, typ, help_, v in rows:
            out.append("# HELP %s %s\n# TYPE %s %s\n%s%s %s\n"
                       % (name, help_, name, typ, name, lab, repr(float(v))))
        return "".join(out)

    # ---- export (the monitor's thread) ----

    def _run(self):
        if self.report:
            self._report()      # on the dashboard from the start
        while not self._stop.wait(self.interval):
            self._tick()
            if self.report:
                self._report()

    def _targets(self):
        if self._dash is None:
            if self.cluster is not None:
                addr = self.cluster.removeprefix("stk://").split("/")[0]
            else:
                import stoker
                c = stoker.connect()
                addr = c.address
                c.close()
            self._dash = _dashboards(addr)
            if not self._dash:
                self._dash = None
                raise ValueError("no mgmtd HOST:PORT in the cluster address %r" % addr)
            self._addr = addr
        if self._key is False:
            addr = getattr(self, "_addr", None)
            if addr is None:    # dashboard= given: the mgmtd are at its ports - 10
                addr = ",".join("%s:%d" % (h, int(p) - METRICS_PORT_OFFSET)
                                for h, _, p in (d.rpartition(":") for d in self._dash)
                                if p.isdigit())
            self._key = _find_key(None, addr)
        return self._dash

    def _report(self, final=False):
        try:
            targets = self._targets()
            body = json.dumps(self.stats(final), allow_nan=False).encode()
        except (OSError, ValueError) as e:
            self._failed("cannot report: %s" % e)
            return False
        tried = 0
        while tried < len(targets):
            url = "http://%s/ui/api/jobs" % targets[self._dash_i % len(targets)]
            headers = {"Content-Type": "application/json"}
            if self._key:
                headers["X-Stoker-Signature"] = hmac.new(self._key, SIGN_LABEL + body,
                                                         hashlib.sha256).hexdigest()
            req = urllib.request.Request(url, data=body, method="POST", headers=headers)
            try:
                with urllib.request.urlopen(req, timeout=REPORT_TIMEOUT) as r:
                    r.read()
                self.reports += 1
                self.last_error = None
                return True
            except urllib.error.HTTPError as e:
                try:
                    why = json.loads(e.read() or b"{}")
                except ValueError:
                    why = {}
                if e.code == 503 and why.get("leader_ui"):   # a follower: go to the leader
                    leader = why["leader_ui"].removeprefix("http://").split("/")[0]
                    if leader not in targets:
                        targets.append(leader)
                    self._dash_i = targets.index(leader)
                    tried += 1
                    continue
                self._failed("%s refused the report (%d): %s"
                             % (url, e.code, why.get("error", e.reason)))
                return False
            except (OSError, ValueError) as e:
                self._failed("%s: %s" % (url, getattr(e, "reason", e)))
                self._dash_i += 1
                tried += 1
        return False

    def _failed(self, why):
        self.last_error = why
        if not self._warned:
            self._warned = True
            print("stoker.jobs: %s (the job goes on; further failures only in "
                  "JobMonitor.last_error)" % why, file=sys.stderr)

    def _serve(self, port):
        host = ""
        if isinstance(port, str):
            host, sep, p = port.rpartition(":")
            if not sep or not p.isdigit():
                raise ValueError("port must be an int or \"HOST:PORT\", not %r" % port)
            port = int(p)
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ValueError("port must be 0 to 65535, not %r" % (port,))
        mon = weakref.proxy(self)

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404, "try /metrics")
                    return
                body = mon.prometheus().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self._server = http.server.ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        h, p = self._server.server_address[:2]
        self.metrics_address = "%s:%d" % (h, p)
        threading.Thread(target=self._server.serve_forever, name="stoker-job-metrics",
                         daemon=True).start()

    def close(self):
        """Stops the monitor: a last report that removes the job from the dashboard, and
        the /metrics server closes. Called at interpreter exit too."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()
        with _monitors_lock:
            _monitors.discard(self)
        if self.report and self.pid == os.getpid():
            self._report(final=True)
        if self._server is not None:
            if self.pid == os.getpid():     # a forked child has no thread serving it
                self._server.shutdown()
            self._server.server_close()
        atexit.unregister(self.close)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return "<stoker.jobs.JobMonitor %r %s>" % (self.name, "closed" if self._closed else "running")


class _Timed:
    def __init__(self, mon, kind, path, nbytes):
        self.mon, self.kind, self.path, self.nbytes = mon, kind, path, nbytes

    def __enter__(self):
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, etype, *rest):
        if etype is not None:
            return False
        dt = time.perf_counter() - self.t0
        nb = self.nbytes
        if nb is None and self.path is not None:
            try:
                nb = os.path.getsize(self.path)
            except OSError:
                nb = None
        self.mon.record_checkpoint(self.kind, dt, nb)
        return False


def _checkpoint(kind, seconds, nbytes):
    """Called by stoker.checkpoint: records into every running monitor of this process."""
    with _monitors_lock:
        mons = list(_monitors)
    for m in mons:
        if m.pid == os.getpid():
            m.record_checkpoint(kind, seconds, nbytes)
