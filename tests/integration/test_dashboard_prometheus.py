"""The dashboard's charts from Prometheus (mgmtd --prometheus URL, docs/dashboard.md):
a real Prometheus (Debian's) scrapes a live cluster every second; the history the
page draws then comes from its query API, with the cluster's capacity and the
writes of a workload in it, and the page says so; with Prometheus stopped the
charts go back to mgmtd's own samples and the page says why."""
import json
import shutil
import subprocess
import urllib.parse

import pytest

from conftest import STOKER, pick_ports, run
from test_dashboard import DashCluster, Page, api, get, scrape, wait_for, workload


def start_prometheus(tmp_path, port, targets):
    exe = shutil.which("prometheus")
    if not exe:
        pytest.skip("no prometheus binary (Debian's prometheus package)")
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                   "scrape_configs:\n  - job_name: stoker\n    static_configs:\n"
                   "      - targets: [%s]\n" % ", ".join("'%s'" % t for t in targets))
    log = open(tmp_path / "prometheus.log", "wb")
    p = subprocess.Popen([exe, "--config.file=%s" % cfg,
                          "--storage.tsdb.path=%s" % (tmp_path / "tsdb"),
                          "--web.listen-address=127.0.0.1:%d" % port],
                         stdout=log, stderr=subprocess.STDOUT)
    wait_for("prometheus to serve", lambda: _ready(port), timeout=60)
    return p


def _ready(port):
    try:
        return get("http://127.0.0.1:%d/-/ready" % port, timeout=2)[0] == 200
    except OSError:
        return False


def test_charts_from_prometheus(tmp_path):
    base, pport = pick_ports(), pick_ports()
    prom = start_prometheus(tmp_path, pport,
                            ["127.0.0.1:%d" % (base + k) for k in (10, 11, 12)])
    c = DashCluster(tmp_path / "stk", base,
                    extra=["--prometheus", "http://127.0.0.1:%d/" % pport])
    page = None
    try:
        c.start()
        ui = c.ui()

        def scraped():
            q = "count_over_time(up{instance='127.0.0.1:%d'}[1m])" % (base + 12)
            r = json.loads(get("http://127.0.0.1:%d/api/v1/query?query=%s"
                               % (pport, urllib.parse.quote(q)))[2])
            res = r["data"]["result"]
            return res and float(res[0]["value"][1]) >= 2
        # counters seen before the writes, so that their increase is in a rate
        wait_for("Prometheus scraping the storage node", scraped, timeout=60)
        written = workload(c, tmp_path, files=2, size=4 << 20)
        cap = scrape("127.0.0.1:%d" % (base + 10))["stoker_cluster_capacity_bytes"]

        last = {}

        def from_prometheus():
            h = last["h"] = api(ui, "history")
            ok = h.get("source") == "prometheus" and \
                any((v or 0) > 0 for v in h["write_bps"]) and \
                any(v == cap for v in h["capacity"])
            return h if ok else None
        try:
            h = wait_for("charts from Prometheus", from_prometheus, timeout=60)
        except AssertionError:
            raise AssertionError("history: %r, capacity %r" % (last.get("h"), cap))
        assert h["prometheus"] == "http://127.0.0.1:%d/" % pport and \
            h["prometheus_error"] is None, h
        # one grid, every column as long as the times, a step of one interval
        n = len(h["t_ms"])
        assert n >= 2 and all(len(h[k]) == n for k in ("read_bps", "write_p99", "used"))
        assert {b - a for a, b in zip(h["t_ms"], h["t_ms"][1:])} == {1000}, h["t_ms"]
        # a rate over a minute spreads the bytes, never makes more than were written
        assert 0 < max(v or 0 for v in h["write_bps"]) <= written * 1.5, h["write_bps"]
        assert any(v is not None and v > 0 for v in h["write_p99"]), h["write_p99"]

        page = Page(ui)
        wait_for("the page naming its source", lambda: "Charts from Prometheus" in page.js(
            "return document.getElementById('chart-source').innerText"), timeout=30)
        wait_for("charts drawn", lambda: page.points()["ch-tput"][1] > 0, timeout=30)
        assert not page.errors(), page.log

        # Prometheus gone: back to mgmtd's own samples within a few rounds, saying why
        prom.terminate()
        prom.wait(timeout=30)

        def fallback():
            h = api(ui, "history")
            return h if h["source"] == "mgmtd" and h["prometheus_error"] else None
        h = wait_for("charts from mgmtd again", fallback, timeout=30)
        assert "127.0.0.1:%d" % pport in h["prometheus_error"], h["prometheus_error"]
        assert len(h["t_ms"]) > 0
        wait_for("the page saying so", lambda: "does not answer" in page.js(
            "return document.getElementById('chart-source').innerText"), timeout=30)
        assert not page.errors(), page.log
    finally:
        if page:
            page.close()
        if prom.poll() is None:
            prom.kill()
            prom.wait()
        c.stop()
    assert not c.sanitizer_reports(), c.logs()


def test_prometheus_without_the_cluster_says_so(tmp_path):
    """A Prometheus that scrapes none of the cluster's nodes: mgmtd's own charts, and
    the reason."""
    base, pport = pick_ports(), pick_ports()
    prom = start_prometheus(tmp_path, pport, ["127.0.0.1:%d" % pport])   # itself only
    c = DashCluster(tmp_path / "stk", base, extra=["--prometheus", "http://127.0.0.1:%d" % pport])
    try:
        c.start()
        h = wait_for("the reason", lambda: (lambda h: h if h["prometheus_error"] else None)(
            api(c.ui(), "history")), timeout=30)
        assert h["source"] == "mgmtd" and "does it scrape" in h["prometheus_error"], h
        wait_for("mgmtd's own samples", lambda: len(api(c.ui(), "history")["t_ms"]) >= 2)
    finally:
        prom.kill()
        prom.wait()
        c.stop()
    assert not c.sanitizer_reports(), c.logs()


def test_bad_prometheus_url_is_refused(tmp_path):
    base = pick_ports()
    for bad in ("ftp://host:9090", "127.0.0.1:9090", "http://a b", "http://h:1/?q=1"):
        for cmd in (["up", "--data", str(tmp_path / "bad"), "--port", str(base)],
                    ["mgmtd", "--listen", "127.0.0.1:%d" % base, "--data", str(tmp_path / "m")]):
            r = run([STOKER] + cmd + ["--prometheus", bad], check=False, timeout=30)
            assert r.returncode == 2 and b"bad --prometheus" in r.stderr, (bad, cmd, r.stderr)
