"""The training job's own view (stoker.jobs.JobMonitor, docs/python.md; the jobs table
of docs/dashboard.md), against a live cluster.

- Two real training processes, each a PyTorch DataLoader with worker processes over
  a StokerDataset in the cluster: one whose loader is slow (a transform that sleeps)
  and one whose step is slow. Both report to mgmtd; Debian's headless Chromium shows
  both in the dashboard's jobs table, the first "data-bound" (with its alert), the
  second "compute-bound", and the first one's own Prometheus endpoint answers.
  Their totals (samples, bytes, steps) are exactly the epochs they ran, and the
  checkpoint stoker.checkpoint.save wrote is recorded with its size in the cluster.
- A job killed with SIGKILL leaves the table once it missed three reports; one that
  ends cleanly leaves it at once.
- Malformed, oversized, and one-too-many reports are refused with a reason, counted
  in mgmtd's /metrics, and change nothing; bad arguments to JobMonitor are refused
  in the job, and a dashboard that cannot be reached does not stop the job.
"""
import hashlib
import hmac
import http.client
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from conftest import pick_ports
from pyhelp import PYDIR, PYTHON, env_for, stoker  # noqa: F401
from test_dashboard import DashCluster, Page, api, get, save_shot, scrape, wait_for

N_FILES = 48
SIZES = [1000 + 997 * i for i in range(N_FILES)]
BATCH = 8

JOB = r"""
import json, os, sys, time
import torch
from torch.utils.data import DataLoader
import stoker.checkpoint as ckpt
from stoker.torch import JobMonitor, StokerDataset

name, mode, interval, stopfile = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
slow_loader = mode == "data"

def decode(b):
    if slow_loader:
        time.sleep(0.03)        # a loader that cannot keep up: CPU decode, or slow reads
    return b

mon = JobMonitor(name, interval=interval, port=0)
print(json.dumps({"metrics": mon.metrics_address}), flush=True)
ds = StokerDataset("/ds", transform=decode)
loader = DataLoader(ds, batch_size=%d, shuffle=True, num_workers=2, collate_fn=list,
                    persistent_workers=True)
epochs = 0
while not os.path.exists(stopfile):
    for batch in mon.wrap(loader):
        time.sleep(0.005 if slow_loader else 0.08)   # the training step
    epochs += 1
ckpt.save({"w": torch.arange(50000)}, "/ckpt-%%s.pt" %% name)
print(json.dumps({"epochs": epochs, "steps": mon.steps}), flush=True)
if mode == "compute":
    mon.close()                 # a job that ends says so: it leaves the table at once
    sys.exit(0)
time.sleep(3600)                # the other one waits to be killed
""" % BATCH


def cluster_key(c):
    with open(os.path.join(c.data, "cluster.key")) as f:
        return bytes.fromhex("".join(f.read().split()))


def post(base, body, chunked=False, key=None, signature=None):
    """POSTs body to /ui/api/jobs, signed with key (or with signature as given):
    (status, parsed answer or text)."""
    host = base.split("//")[1].split("/")[0]
    conn = http.client.HTTPConnection(host, timeout=10)
    headers = {"Content-Type": "application/json"}
    if key is not None:
        signature = hmac.new(key, b"stoker-job-report-1\n" + body, hashlib.sha256).hexdigest()
    if signature is not None:
        headers["X-Stoker-Signature"] = signature
    try:
        if chunked:
            conn.putrequest("POST", "/ui/api/jobs")
            conn.putheader("Transfer-Encoding", "chunked")
            for k, v in headers.items():
                conn.putheader(k, v)
            conn.endheaders()
            for i in range(0, len(body), 1000):
                piece = body[i:i + 1000]
                conn.send(b"%x\r\n%s\r\n" % (len(piece), piece))
            conn.send(b"0\r\n\r\n")
        else:
            conn.request("POST", "/ui/api/jobs", body=body, headers=headers)
        r = conn.getresponse()
        data = r.read()
        try:
            return r.status, json.loads(data)
        except ValueError:
            return r.status, data.decode()
    finally:
        conn.close()


def jobs(base):
    return {j["name"]: j for j in api(base, "jobs")["jobs"]}


def start_job(cluster, name, mode, interval, stopfile):
    p = subprocess.Popen([PYTHON, "-c", JOB, name, mode, str(interval), str(stopfile)],
                         env=env_for(cluster), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    line = p.stdout.readline()
    assert line, "the job did not start: %s" % p.stderr.read().decode()
    return p, json.loads(line)["metrics"]


def test_training_jobs_in_the_dashboard(tmp_path):
    c = DashCluster(tmp_path / "stk", pick_ports())
    c.start()
    procs, page = [], None
    try:
        client = stoker.connect(c.url)
        client.makedirs("/ds")
        for i, n in enumerate(SIZES):
            client.write_file("/ds/s%03d.bin" % i, os.urandom(n))
        base = c.ui()
        stop_a, stop_b = tmp_path / "stop-a", tmp_path / "stop-b"
        a, a_metrics = start_job(c, "loader-starved", "data", 0.5, stop_a)
        procs.append(a)
        b, _ = start_job(c, "compute-heavy", "compute", 5, stop_b)
        procs.append(b)

        # the API: the slow loader's job is data-bound, the other is not
        def verdicts():
            j = jobs(base)
            ok = "loader-starved" in j and "compute-heavy" in j and \
                j["loader-starved"]["data_bound"] and j["loader-starved"]["samples_per_s"] > 0 \
                and j["compute-heavy"]["window_s"] > 0 and not j["compute-heavy"]["data_bound"] \
                and j["compute-heavy"]["samples_per_s"] > 0
            return j if ok else None
        j = wait_for("both jobs' verdicts", verdicts, timeout=60, every=0.3)
        # over its whole run too, not only the window (a 0.5 s window holds few batches)
        assert j["loader-starved"]["data_wait_s"] >= 0.3 * j["loader-starved"]["running_s"], j
        assert j["loader-starved"]["host"] and j["loader-starved"]["pid"] == a.pid
        assert j["compute-heavy"]["data_wait_ratio"] < 0.1, j

        # the job's own Prometheus endpoint
        m = get("http://%s/metrics" % a_metrics)[2].decode()
        waits = [float(line.rsplit(" ", 1)[1]) for line in m.splitlines()
                 if line.startswith('stoker_job_data_wait_seconds_total{training_job="loader-starved"')]
        assert waits and waits[0] > 0, m

        # the page, in Chromium: both rows, their verdicts, the alert, no console error
        page = Page(base)

        def shown():
            rows = page.js("return [...document.querySelectorAll('#jobs tbody tr')]"
                           ".map(r => [...r.cells].map(td => td.innerText))")
            by = {r[0]: r for r in rows}
            if "loader-starved" in by and "compute-heavy" in by and \
                    by["loader-starved"][4] == "data-bound" and \
                    by["compute-heavy"][4] == "compute-bound":
                return by
            return None
        by = wait_for("the jobs in the page", shown, timeout=60)
        assert by["loader-starved"][3].endswith("%"), by
        assert float(by["loader-starved"][3][:-1]) >= 10, by
        assert by["loader-starved"][2] == "%s / %d" % (j["loader-starved"]["host"], a.pid)
        text = page.js("return document.body.innerText")
        assert "data-bound" in page.js("return document.getElementById('c-jobs-sub').innerText")
        assert "StokerJobDataBound" in page.js(
            "return document.querySelector('#alerts tbody').innerText"), text
        save_shot(page, tmp_path, "dashboard-jobs.png")
        if os.environ.get("STOKER_DOCS_SHOT") == "1":
            import shutil
            from conftest import ROOT
            shutil.copy(tmp_path / "dashboard-jobs.png", os.path.join(ROOT, "docs",
                                                                   "dashboard-jobs.png"))
        assert not page.errors(), page.log

        # totals: exactly the epochs each ran; the checkpoint with its size in the cluster
        stop_a.touch()
        done_a = json.loads(a.stdout.readline())
        size = client.getsize("/ckpt-loader-starved.pt")

        def saved():
            x = jobs(base).get("loader-starved")
            return x if x and x["checkpoint_saves"] == 1 else None
        x = wait_for("the checkpoint recorded", saved, timeout=20)
        e = done_a["epochs"]
        assert e >= 1
        assert x["samples"] == e * N_FILES and x["bytes"] == e * sum(SIZES), (x, e)
        assert x["steps"] == e * -(-N_FILES // BATCH) == done_a["steps"], (x, e)
        assert x["checkpoint_save_bytes"] == size and x["checkpoint_save_s"] > 0, x
        assert x["checkpoint_save_age_s"] is not None and x["checkpoint_save_age_s"] < 30
        row = wait_for("the checkpoint in the page", lambda: "ago" in page.js(
            "return [...document.querySelectorAll('#jobs tbody tr')].find(r => "
            "r.cells[0].innerText == 'loader-starved').cells[8].innerText") or None, timeout=10)
        assert row

        # SIGKILL: no last word; the job leaves after missing three reports (1.5 s)
        a.send_signal(signal.SIGKILL)
        a.wait()
        t_kill = time.monotonic()
        assert "loader-starved" in jobs(base)
        wait_for("the killed job to leave", lambda: "loader-starved" not in jobs(base),
                 timeout=15, every=0.1)
        gone_after = time.monotonic() - t_kill
        assert gone_after >= 0.5, gone_after   # it was not dropped at once
        assert "compute-heavy" in jobs(base)
        wait_for("the page without it", lambda: "loader-starved" not in page.js(
            "return document.querySelector('#jobs tbody').innerText"), timeout=10)

        # a clean end: its final report removes it at once (its timeout would be 15 s)
        stop_b.touch()
        assert b.wait(timeout=60) == 0, b.stderr.read().decode()
        t_end = time.monotonic()
        wait_for("the ended job to leave", lambda: "compute-heavy" not in jobs(base),
                 timeout=5, every=0.1)
        assert time.monotonic() - t_end < 5
        metrics = scrape("127.0.0.1:%d" % (c.port + 10))
        assert metrics['stoker_mgmtd_job_reports_total{result="accepted"}'] > 5
        assert metrics["stoker_mgmtd_jobs"] == 0
        client.close()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        if page:
            page.close()
        c.stop()
    assert not c.sanitizer_reports(), c.logs()


def report(i, **kw):
    r = {"v": 1, "id": "job%08d" % i, "name": "j%d" % i, "host": "h", "pid": 100 + i,
         "interval_s": 60, "running_s": 1, "steps": 1, "samples": 8, "bytes": 800,
         "data_wait_s": 0.1, "window_s": 1, "data_wait_ratio": 0.1, "samples_per_s": 8,
         "bytes_per_s": 800}
    r.update(kw)
    return json.dumps(r).encode()


def test_bad_reports_are_refused(tmp_path):
    c = DashCluster(tmp_path / "stk", pick_ports())
    c.start()
    try:
        base = c.ui()
        key = cluster_key(c)
        # only holders of the cluster key put jobs on the page
        st, ans = post(base, report(0))
        assert st == 401 and "STOKER_KEY_FILE" in ans["error"], (st, ans)
        st, ans = post(base, report(0), key=b"x" * 32)
        assert st == 401 and "not the cluster key's" in ans["error"], (st, ans)
        assert post(base, report(0), signature="00" * 32)[0] == 401
        assert post(base, report(0), signature="nothex")[0] == 401
        assert post(base, report(0), key=key) == (200, {"ok": True})
        bad = [
            (b"", "not JSON"),
            (b"garbage", "not JSON"),
            (b"[1]", "JSON object"),
            (b'{"v":1}', '"id" is missing'),
            (report(1, v=7), "version 7"),
            (report(1, name=""), '"name" must be 1 to 128'),
            (report(1, name="x" * 129), '"name" must be 1 to 128'),
            (report(1, name="a\nb"), "character"),
            (report(1, id="../../etc"), "character"),
            (report(1, pid="12"), '"pid" must be an integer'),
            (report(1, data_wait_ratio=3), '"data_wait_ratio" is 3'),
            (report(1, samples=-1), '"samples" is -1'),
            (report(1, interval_s=0), '"interval_s" is 0'),
            (report(1, final="yes"), '"final"'),
            (report(1).replace(b'"samples_per_s": 8', b'"samples_per_s": NaN'), "not JSON"),
            (report(1).replace(b'"steps": 1', b'"steps": 1, "steps": 2'), "not JSON"),
        ]
        for body, why in bad:
            st, ans = post(base, body, key=key)
            assert st == 400 and why in ans["error"], (body, st, ans)
        # too large, announced or chunked: refused without reading it whole
        st, ans = post(base, b"{" + b" " * 100000 + b"}", key=key)
        assert st == 413, (st, ans)
        st, ans = post(base, report(1, name="y" * 100) + b" " * 8000, chunked=True, key=key)
        assert st == 413, (st, ans)
        # other methods and paths stay refused
        req = urllib.request.Request(base + "/api/overview", data=b"{}", method="POST")
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=10)
        assert e.value.code == 405
        assert list(jobs(base)) == ["j0"]
        # at most 256 jobs: one more is refused until one leaves; known ones update
        for i in range(1, 256):
            assert post(base, report(i), key=key)[0] == 200
        st, ans = post(base, report(256), key=key)
        assert st == 429 and "256 jobs at most" in ans["error"], (st, ans)
        assert post(base, report(5, steps=9), key=key)[0] == 200
        assert post(base, report(7, final=True), key=key)[0] == 200
        assert post(base, report(256), key=key)[0] == 200
        js = jobs(base)
        assert len(js) == 256 and js["j5"]["steps"] == 9 and "j7" not in js
        m = scrape("127.0.0.1:%d" % (c.port + 10))
        assert m["stoker_mgmtd_jobs"] == 256
        assert m['stoker_mgmtd_job_reports_total{result="malformed"}'] == len(bad)
        assert m['stoker_mgmtd_job_reports_total{result="too_many"}'] == 1
        assert m['stoker_mgmtd_job_reports_total{result="unauthenticated"}'] == 4
        # the overview and the page's API still answer, with every job
        assert len(api(base, "overview")["jobs"]) == 256
        # a monitor with another cluster's key is refused, says why, and goes on
        from stoker.jobs import JobMonitor
        other = tmp_path / "other.key"
        other.write_text("ab" * 32 + "\n")
        other.chmod(0o600)
        mon = JobMonitor("wrong-key", cluster=c.url, interval=0.2, key_file=str(other))
        try:
            wait_for("the refusal", lambda: mon.last_error, timeout=10, every=0.05)
            assert "(401)" in mon.last_error and "not the cluster key" in mon.last_error, \
                mon.last_error
            assert mon.reports == 0
        finally:
            mon.close()
        assert "wrong-key" not in jobs(base)
        bad_key = tmp_path / "bad.key"
        bad_key.write_text("zz\n")
        with pytest.raises(ValueError):
            JobMonitor("x", key_file=str(bad_key))
        assert get(base.replace("/ui", "/healthz"))[2] == b"ok\n"
    finally:
        c.stop()
    assert not c.sanitizer_reports(), c.logs()


def test_job_monitor_refuses_bad_arguments_and_survives_no_mgmtd(tmp_path):
    from stoker.jobs import JobMonitor
    for kw, exc in (({"name": ""}, ValueError), ({"name": "x" * 129}, ValueError),
                    ({"name": "a\tb"}, ValueError), ({"name": 5}, TypeError),
                    ({"name": "ok", "interval": 0}, ValueError),
                    ({"name": "ok", "interval": float("nan")}, ValueError),
                    ({"name": "ok", "rank": -2}, ValueError),
                    ({"name": "ok", "port": 70000}, ValueError),
                    ({"name": "ok", "port": "nope"}, ValueError),
                    ({"name": "ok", "dashboard": ""}, ValueError)):
        with pytest.raises(exc):
            JobMonitor(**kw)
    # nobody listens at the dashboard: the job goes on, the failure is in last_error
    port = pick_ports()
    mon = JobMonitor("lonely", dashboard="127.0.0.1:%d" % port, interval=0.1)
    try:
        for _ in mon.wrap([b"abc"] * 10):
            pass
        wait_for("a failed report", lambda: mon.last_error, timeout=10, every=0.05)
        assert "127.0.0.1:%d" % port in mon.last_error
        assert mon.steps == 10 and mon.samples == 10 and mon.bytes == 30
        with pytest.raises(ValueError):
            mon.record_checkpoint("upload", 1.0)
        with pytest.raises(ValueError):
            mon.record_checkpoint("save", -1.0)
    finally:
        mon.close()
    # a process that forks (not a DataLoader worker, which leaves by os._exit) and
    # whose child exits normally: the child's exit closes the monitor it inherited
    # without waiting for threads it does not have
    code = ("import os, sys\nfrom stoker.jobs import JobMonitor\n"
            "m = JobMonitor('forky', report=False, port=0)\n"
            "pid = os.fork()\nif pid == 0:\n    sys.exit(0)\n"
            "print(os.waitpid(pid, 0)[1])\nm.close()\n")
    p = subprocess.run([PYTHON, "-c", code], env=dict(os.environ, PYTHONPATH=PYDIR),
                       capture_output=True, timeout=60)
    assert p.returncode == 0 and p.stdout == b"0\n", p


def test_reports_follow_the_leader(tmp_path):
    """With three mgmtd, a report sent to a follower is answered 503 with the leader's
    dashboard, and the monitor reports there."""
    from stoker.jobs import JobMonitor
    c = DashCluster(tmp_path / "stk", pick_ports(), targets=1,
                    extra=["--nodes", "3"])
    c.start()
    mons = []
    try:
        o = wait_for("a leader", lambda: (lambda o: o if o["leading"] or o["leader_ui"]
                                          else None)(api(c.ui(), "overview")))
        leader = c.ui() if o["leading"] else o["leader_ui"]
        followers = [c.ui(off) for off in (10, 26, 27) if c.ui(off) != leader]
        assert len(followers) == 2
        st, ans = post(followers[0], report(1))
        assert st == 503 and ans["leader_ui"] == leader, (st, ans)
        assert "does not lead" in ans["error"]
        # a monitor given only a follower, and one given the cluster's address
        hostport = followers[0].split("//")[1].split("/")[0]
        mons.append(JobMonitor("via-follower", dashboard=hostport, interval=0.3, report=True))
        mons.append(JobMonitor("via-cluster", cluster=c.url, interval=0.3))
        wait_for("both jobs at the leader", lambda: {"via-follower", "via-cluster"} <=
                 set(jobs(leader)), timeout=20)
        assert all(m.last_error is None for m in mons), [m.last_error for m in mons]
        assert api(followers[0], "jobs")["jobs"] == []
        m = scrape(hostport)
        assert m['stoker_mgmtd_job_reports_total{result="not_leader"}'] >= 2
        for mon in mons:
            mon.close()
        wait_for("both gone", lambda: not jobs(leader), timeout=5)
    finally:
        for mon in mons:
            mon.close()
        c.stop()
    assert not c.sanitizer_reports(), c.logs()
