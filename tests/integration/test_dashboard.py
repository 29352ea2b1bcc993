"""The web dashboard mgmtd serves at /ui (docs/dashboard.md), against live clusters.

- Its JSON (/ui/api/overview, /ui/api/history) says what `stoker status` and mgmtd's
  /metrics say, and after a workload its history holds the bytes that were written
  and the latency of the writes; the busiest client is this host.
- Debian's headless Chromium loads the page: no console error, the charts are drawn
  with data, the tables list the nodes and targets; screenshots are saved in the
  test's folder.
- `stoker up --nodes 3`: a storage node killed (its supervisor paused first, so it
  stays dead) shows offline in the page, with its alert and its degraded chains, and
  a follower mgmtd's dashboard points to the leader's. Its screenshot is the one in
  docs/dashboard.md: STOKER_DOCS_SHOT=1 copies it to docs/dashboard.png.
"""
import json
import os
import re
import shutil
import signal
import time
import urllib.error
import urllib.request

import pytest

from conftest import ROOT, STOKER, Cluster, pick_ports, run

INTERVAL_MS = 1000  # samples every second, so that charts fill within seconds


class DashCluster(Cluster):
    """A `stoker up` cluster with extra options (sample interval, nodes)."""

    def __init__(self, data, port, extra=(), targets=4):
        super().__init__(data, port, targets)
        self.extra = list(extra)

    def start(self):
        p = run([STOKER, "up", "--data", self.data, "--daemon", "--port", str(self.port),
                 "--targets", str(self.targets), "--ui-interval-ms", str(INTERVAL_MS)]
                + self.extra, check=False, timeout=180)
        if p.returncode != 0:
            raise AssertionError("stoker up failed: %s\n%s" % (p.stderr.decode(), self.logs()))
        return p

    def ui(self, port_offset=10):
        return "http://127.0.0.1:%d/ui" % (self.port + port_offset)


def get(url, timeout=10):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.headers, r.read()


def api(base, what):
    return json.loads(get(base + "/api/" + what)[2])


def wait_for(what, fn, timeout=60, every=0.5):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(every)
    raise AssertionError("timed out waiting for %s (last: %r)" % (what, last))


def integral(h, key):
    """What a rate of the history adds up to: each point's rate times the time since
    the point before it (the first point's, one interval)."""
    total, prev = 0.0, None
    for t, r in zip(h["t_ms"], h[key]):
        dt = (t - prev) / 1000 if prev is not None else h["interval_s"]
        total += (r or 0) * dt
        prev = t
    return total


def fmt_size(n):
    """stk_format_size, as `stoker status` prints sizes."""
    units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"]
    v, u = float(n), 0
    while v >= 1024 and u + 1 < len(units):
        v /= 1024
        u += 1
    return "%d B" % n if u == 0 else "%.1f %s" % (v, units[u])


def status_tables(text):
    """`stoker status`'s nodes {id: (role, state, addr)} and targets {id: (node, state,
    capacity text, chunks, path)}."""
    nodes, targets, section = {}, {}, None
    for line in text.splitlines():
        if line in ("Nodes", "Targets", "Chains", "Mgmtd"):
            section = line
            continue
        if not line.strip():
            section = None
            continue
        m = re.match(r"^  (\d+)\s+(\S+)\s+(\S+)\s+(\S+)\s", line)
        if section == "Nodes" and m:
            nodes[int(m.group(1))] = (m.group(2), m.group(3), m.group(4))
        m = re.match(r"^  (\d+)\s+(\d+)\s+(\S+)\s+(\S+ \S+)\s+(\S+ \S+)\s+(\d+)\s+(\S+)$", line)
        if section == "Targets" and m:
            targets[int(m.group(1))] = (int(m.group(2)), m.group(3), m.group(4),
                                        int(m.group(6)), m.group(7))
    return nodes, targets


def scrape(addr):
    vals = {}
    for line in get("http://%s/metrics" % addr)[2].decode().splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            vals[k] = float(v)
    return vals


def workload(c, tmp_path, files=4, size=8 << 20):
    """Writes and reads back files through the native client; the bytes written."""
    for i in range(files):
        src = tmp_path / ("in%d.bin" % i)
        src.write_bytes(os.urandom(size))
        c.cli("put", str(src), "/w%d" % i)
        c.cli("get", "/w%d" % i, str(tmp_path / "out.bin"))
    return files * size


# ---- the browser ----

def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              "--window-size=1400,1700", "--no-first-run", "--disable-extensions"):
        opts.add_argument(a)
    opts.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(shutil.which("chromedriver") or
                                            "/usr/bin/chromedriver"), options=opts)


class Page:
    """A dashboard open in Chromium; keeps every console message it logged."""

    def __init__(self, url):
        self.d = browser()
        self.log = []
        self.d.get(url)

    def js(self, code):
        return self.d.execute_script(code)

    def drain(self):
        self.log += self.d.get_log("browser")
        return self.log

    def errors(self):
        return [e for e in self.drain() if e.get("level") == "SEVERE"]

    def points(self):
        """{chart id: (values drawn, largest value)}."""
        return self.js("return Object.fromEntries([...document.querySelectorAll('svg.chart')]"
                       ".map(s => [s.id, [+(s.dataset.points || 0), +(s.dataset.max || 0)]]))")

    def close(self):
        self.d.quit()


def save_shot(page, tmp_path, name, docs=False):
    path = tmp_path / name
    page.d.save_screenshot(str(path))
    assert path.stat().st_size > 10000, "the screenshot is empty"
    if docs and os.environ.get("STOKER_DOCS_SHOT") == "1":
        shutil.copy(path, os.path.join(ROOT, "docs", "dashboard.png"))
    return path


# ---- one node ----

def test_api_matches_status_and_counts_the_workload(tmp_path):
    c = DashCluster(tmp_path / "stk", pick_ports())
    c.start()
    try:
        base = c.ui()
        # the page and its files, from mgmtd itself, locked to its own origin
        st, hdr, body = get(base)
        assert st == 200 and hdr["Content-Type"].startswith("text/html"), hdr
        assert b"/ui/dash.js" in body and b"/ui/dash.css" in body
        assert "default-src 'self'" in hdr["Content-Security-Policy"], hdr
        for f, t in (("dash.js", "text/javascript"), ("dash.css", "text/css")):
            st, hdr, _ = get(base + "/" + f)
            assert st == 200 and hdr["Content-Type"].startswith(t), (f, hdr)
        with pytest.raises(urllib.error.HTTPError) as e:
            get(base + "/nope.js")
        assert e.value.code == 404
        # read-only: anything but GET and HEAD is refused
        req = urllib.request.Request(base + "/api/overview", data=b"{}", method="POST")
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=10)
        assert e.value.code == 405

        # the sampler counts what happens between its samples: let it take two first
        wait_for("the first samples", lambda: len(api(base, "history")["t_ms"]) >= 2)
        written = workload(c, tmp_path)
        # heartbeats bring the targets' chunk counts within a second or so
        o = wait_for("the chunks written, counted", lambda: (lambda o: o if sum(
            t["chunks"] for t in o["targets"]) >= written >> 20 else None)(
                api(base, "overview")))
        assert o["leading"] is True and o["mode"] == "embedded", o
        assert o["self"] == c.addr and o["interval_s"] == INTERVAL_MS / 1000, o
        nodes, targets = status_tables(c.cli("status").stdout.decode())
        assert {n["id"]: (n["role"], n["state"], n["addr"]) for n in o["nodes"]} == nodes
        assert len(o["targets"]) == c.targets == len(targets)
        for t in o["targets"]:
            node, state, cap, chunks, path = targets[t["id"]]
            assert (t["node"], t["state"], fmt_size(t["capacity"]), t["path"]) == \
                (node, state, cap, path), (t, targets[t["id"]])
            assert t["chunks"] == chunks, (t, chunks)
        assert o["chains"] == {"total": 4, "healthy": 4, "degraded": 0, "unavailable": 0,
                               "unhealthy": []}, o["chains"]
        assert o["health"]["status"] in ("ok", "warning"), o  # latency may be slow here
        assert not [a for a in o["alerts"] if a["severity"] == "critical"], o["alerts"]
        m = scrape("127.0.0.1:%d" % (c.port + 10))
        assert o["capacity"]["capacity"] == m["stoker_cluster_capacity_bytes"], (o, m)
        assert o["capacity"]["devices"] >= 1

        # the history holds the writes: bytes (the integral of the rate) and latency
        def history_with_writes():
            h = api(base, "history")
            if integral(h, "write_bps") >= written * 0.9 and \
                    any(p is not None for p in h["write_p99"]):
                return h
            return None
        try:
            h = wait_for("the workload in the history", history_with_writes, timeout=30)
        except AssertionError:
            h = api(base, "history")
            raise AssertionError("wrote %d, history has %d: %r" % (
                written, integral(h, "write_bps"), h))
        wrote = integral(h, "write_bps")
        assert wrote < written * 1.6, (wrote, written)  # one copy of each chunk
        assert h["capacity_points"] == 360 and len(h["t_ms"]) == len(h["used"])
        assert all(t1 > t0 for t0, t1 in zip(h["t_ms"], h["t_ms"][1:])), h["t_ms"]
        for p50, p95, p99 in zip(h["write_p50"], h["write_p95"], h["write_p99"]):
            if p99 is not None:
                assert 0 < p50 <= p95 <= p99 <= 10, (p50, p95, p99)
        # the reads (short-circuit here: the client is on the node's host) count too
        assert any(r for r in h["read_bps"]), h["read_bps"]

        # this host wrote it all: the busiest client
        o = api(base, "overview")
        assert o["clients"] and o["clients"][0]["client"] == "127.0.0.1", o["clients"]
        assert o["clients"][0]["write_bps"] > 0, o["clients"]
        # enough samples for a forecast after a dozen seconds: a verdict either way
        f = wait_for("a fill forecast", lambda: (lambda f: f if f["growing"] is not None
                                                 else None)(api(base, "overview")
                                                            ["capacity"]["forecast"]),
                     timeout=40)
        assert f["points"] >= 12, f
        if f["growing"]:
            assert f["days_to_full"] > 0 and f["bytes_per_day"] > 0, f
        else:
            assert f["days_to_full"] is None, f
    finally:
        c.stop()
    assert not c.sanitizer_reports(), c.logs()


def test_page_renders_with_charts_in_chromium(tmp_path):
    c = DashCluster(tmp_path / "stk", pick_ports())
    c.start()
    page = None
    try:
        wait_for("the first samples", lambda: len(api(c.ui(), "history")["t_ms"]) >= 2)
        workload(c, tmp_path)
        page = Page(c.ui())

        def drawn():
            p = page.points()
            # bytes and operations above zero, latencies and capacity drawn
            ok = p["ch-tput"][1] > 0 and p["ch-iops"][1] > 0 and p["ch-wlat"][0] > 0 and \
                p["ch-wlat"][1] > 0 and p["ch-cap"][1] > 0
            return p if ok else None
        wait_for("charts with data", drawn, timeout=40)
        assert page.js("return document.getElementById('health').textContent") in \
            ("healthy", "warning"), page.js("return document.body.innerText")
        rows = page.js("return [...document.querySelectorAll('#nodes tbody tr')]"
                       ".map(r => [r.dataset.node, r.querySelector('.nstate').innerText])")
        assert sorted(rows) == [["1", "online"], ["2", "online"]], rows
        trows = page.js("return document.querySelectorAll('#targets tbody tr').length")
        assert trows == c.targets
        text = page.js("return document.body.innerText")
        assert "%d / %d serving" % (c.targets, c.targets) in text, text
        assert "127.0.0.1" in page.js(
            "return document.querySelector('#clients tbody').innerText"), text
        # the chart lines are drawn, not only counted
        assert page.js("return document.querySelectorAll('#ch-tput polyline, #ch-tput circle')"
                       ".length") > 0
        save_shot(page, tmp_path, "dashboard.png")
        assert not page.errors(), page.log
    finally:
        if page:
            page.close()
        c.stop()
    assert not c.sanitizer_reports(), c.logs()


# ---- several nodes ----

def cmdlines():
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open("/proc/%s/cmdline" % pid, "rb") as f:
                    out.append((int(pid), f.read()))
            except OSError:
                pass
    return out


def test_killed_node_shows_down_and_follower_points_to_leader(tmp_path):
    c = DashCluster(tmp_path / "stk", pick_ports(), targets=1,
                    extra=["--nodes", "3", "--heartbeat-timeout-ms", "3000"])
    c.start()
    page = None
    up_pid = None
    try:
        # which mgmtd leads: the first's dashboard says, or names the leader's
        o = wait_for("a leader", lambda: (lambda o: o if o["leading"] or o["leader_ui"]
                                          else None)(api(c.ui(), "overview")))
        base = c.ui() if o["leading"] else o["leader_ui"]
        for off in (10, 26, 27):
            f = api(c.ui(off), "overview")
            if f["leading"]:
                assert c.ui(off) == base, (off, base)
            else:
                # a follower shows no cluster of its own, and points to the leader
                assert f["leader_ui"] == base and "nodes" not in f, f
                assert api(c.ui(off), "history")["leading"] is False
        o = api(base, "overview")
        assert o["mode"] == "cluster"
        storage = {n["addr"]: n["id"] for n in o["nodes"] if n["role"] == "storage"}
        assert len(storage) == 3, o["nodes"]
        wait_for("one healthy chain of three", lambda: (lambda o: o["chains"]["total"] >= 1 and
                 o["chains"]["healthy"] == o["chains"]["total"])(api(base, "overview")))
        victim_addr = "127.0.0.3:%d" % (c.port + 2)
        victim = storage[victim_addr]
        workload(c, tmp_path, files=2, size=4 << 20)

        page = Page(base)
        wait_for("the page with three storage nodes online", lambda: page.js(
            "return [...document.querySelectorAll('#nodes tbody tr .nstate')]"
            ".filter(s => s.innerText == 'online').length") == 4)
        # the supervisor paused, so that the node it would restart stays dead
        with open(os.path.join(c.data, "up.pid")) as f:
            up_pid = int(f.read().split()[0])
        os.kill(up_pid, signal.SIGSTOP)
        pids = [pid for pid, argv in cmdlines()
                if victim_addr.encode() in argv and b"storage" in argv.split(b"\0")[1:2]]
        assert len(pids) == 1, pids
        os.kill(pids[0], signal.SIGKILL)

        sel = "#nodes tbody tr[data-node='%d']" % victim
        wait_for("node %d shown offline" % victim, lambda: page.js(
            "const r = document.querySelector(\"%s\");"
            "return r && r.classList.contains('down') && "
            "r.querySelector('.nstate').innerText == 'offline'" % sel), timeout=40)
        wait_for("the alerts of a node down", lambda: {"StokerNodeOffline", "StokerTargetOffline",
                 "StokerChainDegraded"} <= set(page.js(
                     "return [...document.querySelectorAll('#alerts tbody tr')]"
                     ".map(r => r.dataset.alert)")), timeout=20)
        assert page.js("return document.getElementById('health').textContent") == "critical"
        assert page.js("return document.getElementById('chains-section').hidden") is False
        o = api(base, "overview")
        assert [(n["state"], n["metrics"]) for n in o["nodes"] if n["id"] == victim] == \
            [("offline", "not read (offline)")], o["nodes"]
        assert [t["state"] for t in o["targets"] if t["node"] == victim] == ["offline"]
        assert o["chains"]["degraded"] >= 1, o["chains"]
        nodes, _ = status_tables(c.cli("status").stdout.decode())
        assert nodes[victim][1] == "offline", nodes
        save_shot(page, tmp_path, "dashboard-node-down.png", docs=True)
        assert not page.errors(), page.log
    finally:
        if page:
            page.close()
        if up_pid:
            os.kill(up_pid, signal.SIGCONT)
        c.stop()
    assert not c.sanitizer_reports(), c.logs()
