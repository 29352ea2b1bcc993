"""Metrics: every daemon's /metrics, a real Prometheus scraping a cluster, `stoker top`,
and the alert rules in deploy/prometheus.

`stoker up` serves the metrics of mgmtd, meta and storage on BASE+10, +11 and +12.
promtool and prometheus come from Debian's `prometheus` package, which
scripts/deps.sh installs: the promtool checks fail without it (they are the only
check of the exposition format and of the alert rules, so they must not pass by
being skipped); the one test that starts a Prometheus server is skipped, visibly.
"""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request

import pytest

from conftest import ROOT, STOKER, Cluster, free_port, pick_ports, run, wait_until

PROMTOOL = shutil.which("promtool")
PROMETHEUS = shutil.which("prometheus")
DEPLOY = os.path.join(ROOT, "deploy", "prometheus")
ROLES = ("mgmtd", "meta", "storage")



def promtool(*args, **kw):
    """Runs promtool; its absence is a failure, not a skip (see the module's comment)."""
    assert PROMTOOL, "promtool is missing: scripts/deps.sh installs Debian's prometheus"
    return subprocess.run([PROMTOOL] + list(args), capture_output=True, timeout=120, **kw)


needs_prometheus = pytest.mark.skipif(not PROMETHEUS, reason="needs prometheus (Debian package)")


def maddr(cluster, role):
    return "127.0.0.1:%d" % (cluster.port + 10 + ROLES.index(role))


def http(addr, path="/metrics"):
    with urllib.request.urlopen("http://%s%s" % (addr, path), timeout=10) as r:
        return r.status, r.headers.get("Content-Type"), r.read().decode()


SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse(text):
    """{(name, ((label, value), ...)): value} and {family: type}."""
    samples, types = {}, {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, typ = line.split(" ", 3)
            types[name] = typ
            continue
        if not line or line.startswith("#"):
            continue
        m = SAMPLE.match(line)
        assert m, "malformed sample line: %r" % line
        labels = tuple(sorted(LABEL.findall(m.group(2) or "")))
        samples[(m.group(1), labels)] = float(m.group(3))
    return samples, types


def scrape(cluster, role):
    return parse(http(maddr(cluster, role))[2])


def total(samples, name, **want):
    return sum(v for (n, labels), v in samples.items()
               if n == name and all(dict(labels).get(k) == w for k, w in want.items()))


def family_of(name, types):
    """The family a sample belongs to and its type (histogram samples have suffixes)."""
    if name in types:
        return name, types[name]
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix) and types.get(name[:-len(suffix)]) == "histogram":
            return name[:-len(suffix)], "histogram"
    return name, None


def check_histograms(samples, types):
    """_count equals the +Inf bucket, and buckets grow with le, for every series."""
    series = {}
    for (name, labels), v in samples.items():
        fam, typ = family_of(name, types)
        if typ != "histogram" or not name.endswith("_bucket"):
            continue
        d = dict(labels)
        le = d.pop("le")
        series.setdefault((fam, tuple(sorted(d.items()))), []).append(
            (float("inf") if le == "+Inf" else float(le), v))
    assert series, "no histogram series"
    for (fam, labels), buckets in series.items():
        buckets.sort()
        counts = [c for _, c in buckets]
        assert counts == sorted(counts), (fam, labels, buckets)
        assert buckets[-1][0] == float("inf"), (fam, labels)
        assert samples[(fam + "_count", labels)] == buckets[-1][1], (fam, labels)
        assert samples[(fam + "_sum", labels)] >= 0
    return len(series)


def test_every_daemon_serves_valid_metrics(cluster):
    for role in ROLES:
        status, ctype, text = http(maddr(cluster, role))
        assert status == 200
        assert ctype.startswith("text/plain; version=0.0.4"), ctype
        samples, types = parse(text)
        assert total(samples, "stoker_build_info", role=role) == 1, role
        assert total(samples, "stoker_process_resident_memory_bytes") > 0
        assert total(samples, "stoker_process_open_fds") > 0
        assert ("stoker_rpc_requests_total", ()) not in samples  # always labelled by op
        assert any(n == "stoker_rpc_requests_total" for n, _ in samples), role
        for name in {n for n, _ in samples}:
            assert name.startswith("stoker_"), name
            fam, typ = family_of(name, types)
            assert typ, "sample %s has no TYPE" % name
            if typ == "counter":
                assert fam.endswith("_total"), fam
        status, _, body = http(maddr(cluster, role), "/healthz")
        assert status == 200 and body == "ok\n"
        p = promtool("check", "metrics", input=text.encode())
        assert p.returncode == 0, (role, p.stdout.decode(), p.stderr.decode())
    with pytest.raises(urllib.error.HTTPError) as e:
        http(maddr(cluster, "meta"), "/nope")
    assert e.value.code == 404


def test_cluster_and_target_figures(cluster):
    m, _ = scrape(cluster, "mgmtd")
    assert total(m, "stoker_cluster_nodes", role="meta", state="online") == 1
    assert total(m, "stoker_cluster_nodes", role="storage", state="online") == 1
    assert total(m, "stoker_cluster_nodes", state="offline") == 0
    assert total(m, "stoker_cluster_targets", state="serving") == cluster.targets
    assert total(m, "stoker_cluster_target_serving") == cluster.targets
    assert total(m, "stoker_cluster_chains") >= cluster.targets
    assert total(m, "stoker_cluster_capacity_bytes") > 0
    assert total(m, "stoker_cluster_routing_version") > 0
    # The storage daemon names its targets' series once mgmtd gave it their ids,
    # which may be a moment after mgmtd counts them as serving.
    wait_until(lambda: all(total(scrape(cluster, "storage")[0], "stoker_target_capacity_bytes",
                                 target=str(t)) > 0 for t in range(1, cluster.targets + 1)),
               timeout=20, what="the storage daemon's target series")
    s, _ = scrape(cluster, "storage")
    for t in range(1, cluster.targets + 1):
        cap = total(s, "stoker_target_capacity_bytes", target=str(t))
        used = total(s, "stoker_target_used_bytes", target=str(t))
        free = total(s, "stoker_target_free_bytes", target=str(t))
        assert cap > 0 and cap == used + free, t
        assert ("stoker_target_checksum_errors_total", (("target", str(t)),)) in s
        assert ("stoker_target_inflight_requests", (("target", str(t)),)) in s
    # The targets of `stoker up` share the data folder's file system: the node's and
    # the cluster's totals count it once, not once per target.
    assert total(s, "stoker_node_capacity_bytes") == cap
    assert 0 < total(s, "stoker_node_used_bytes") <= cap
    assert total(m, "stoker_cluster_capacity_bytes") == cap
    assert 0 < total(m, "stoker_cluster_used_bytes") <= cap
    # No smartctl here or no real device: device health is absent, never a zero.
    if not shutil.which("smartctl"):
        assert not any(n.startswith("stoker_device_") for n, _ in s)
    # The host's TCP figures exist (a missing series would pass a ">= 0" check).
    for name in ("stoker_host_tcp_retransmitted_segments_total",
                 "stoker_host_tcp_in_errors_total"):
        assert (name, ()) in s and s[(name, ())] >= 0, name
    # segments sent: the cluster's own traffic made some, and it bounds the retransmits
    sent = s[("stoker_host_tcp_sent_segments_total", ())]
    assert sent > 0 and sent >= s[("stoker_host_tcp_retransmitted_segments_total", ())], sent
    drops = {dict(k[1]).get("reason") for k in s if k[0] == "stoker_host_tcp_drops_total"}
    assert drops and None not in drops, drops


def test_written_bytes_show_in_storage_counters(cluster, rand_file, tmp_path, monkeypatch):
    size = (3 << 20) + 12345
    src = rand_file(size)
    before, _ = scrape(cluster, "storage")
    cluster.cli("put", str(src), "/counted.bin")
    after, _ = scrape(cluster, "storage")
    written = total(after, "stoker_target_write_bytes_total") - \
        total(before, "stoker_target_write_bytes_total")
    assert written == size
    assert total(after, "stoker_target_writes_total") > total(before, "stoker_target_writes_total")
    assert total(after, "stoker_rpc_requests_total", op="STOR_WRITE") >= \
        total(before, "stoker_rpc_requests_total", op="STOR_WRITE") + 4
    assert total(after, "stoker_rpc_received_bytes_total", op="STOR_WRITE") - \
        total(before, "stoker_rpc_received_bytes_total", op="STOR_WRITE") > size
    # through the storage node: a short-circuit read would not be counted there
    monkeypatch.setenv("STOKER_SHORT_CIRCUIT", "0")
    cluster.cli("get", "/counted.bin", str(tmp_path / "back.bin"))
    again, _ = scrape(cluster, "storage")
    assert total(again, "stoker_target_read_bytes_total") - \
        total(after, "stoker_target_read_bytes_total") >= size
    # ... and under the address of the client that read it (this host, over loopback)
    assert total(again, "stoker_rpc_client_sent_bytes_total", client="127.0.0.1") - \
        total(after, "stoker_rpc_client_sent_bytes_total", client="127.0.0.1") >= size
    assert total(after, "stoker_rpc_client_received_bytes_total", client="127.0.0.1") > size
    assert total(again, "stoker_rpc_client_requests_total", client="other") == 0
    meta, _ = scrape(cluster, "meta")
    assert total(meta, "stoker_rpc_requests_total", op="META_CREATE") >= 1
    assert total(meta, "stoker_rpc_client_requests_total", client="127.0.0.1") >= 1
    # a failed lookup is an error by status
    cluster.cli("stat", "/does-not-exist", check=False)
    meta, _ = scrape(cluster, "meta")
    assert total(meta, "stoker_rpc_errors_total", op="META_LOOKUP", status="NOENT") >= 1


def test_read_ahead_of_local_chunks_asks_the_storage_node_nothing(cluster, rand_file, tmp_path,
                                                                monkeypatch):
    """A sequential read prefetches the chunks ahead of it. A client that reads a
    chunk from its own disk advises the kernel itself; one that reads through the
    storage node sends it the hint (STOR_PREFETCH)."""
    src = rand_file(24 << 20)
    cluster.cli("put", str(src), "/ahead.bin")

    def prefetches():
        return total(scrape(cluster, "storage")[0], "stoker_rpc_requests_total", op="STOR_PREFETCH")

    base = prefetches()
    monkeypatch.setenv("STOKER_SHORT_CIRCUIT", "1")
    cluster.cli("get", "/ahead.bin", str(tmp_path / "a.bin"))
    assert (tmp_path / "a.bin").read_bytes() == src.read_bytes()
    assert prefetches() == base
    monkeypatch.setenv("STOKER_SHORT_CIRCUIT", "0")
    cluster.cli("get", "/ahead.bin", str(tmp_path / "b.bin"))
    assert (tmp_path / "b.bin").read_bytes() == src.read_bytes()
    assert prefetches() > base


def test_counters_never_go_backwards(cluster, rand_file, tmp_path):
    """Scrapes taken while clients come and go (connection threads exit)."""
    src = rand_file(1 << 20)
    stop = threading.Event()
    errors = []

    def load():
        i = 0
        while not stop.is_set():
            try:
                cluster.cli("put", str(src), "/load-%d.bin" % (i % 4))
                cluster.cli("get", "/load-%d.bin" % (i % 4), str(tmp_path / "out.bin"))
            except Exception as e:  # reported after the scrapes
                errors.append(e)
                return
            i += 1

    t = threading.Thread(target=load)
    t.start()
    try:
        prev = {role: scrape(cluster, role) for role in ROLES}
        nhist = 0
        for _ in range(12):
            time.sleep(0.25)
            for role in ROLES:
                cur, types = scrape(cluster, role)
                nhist += check_histograms(cur, types)
                psamples, _ = prev[role]
                for key, v in psamples.items():
                    fam, typ = family_of(key[0], types)
                    if typ in ("counter", "histogram") and key in cur:
                        assert cur[key] >= v, (role, key, v, cur[key])
                prev[role] = (cur, types)
        assert nhist > 0
    finally:
        stop.set()
        t.join()
    assert not errors, errors
    s, _ = prev["storage"]
    assert total(s, "stoker_rpc_connections_opened_total") > 4
    assert total(s, "stoker_target_write_bytes_total") >= 1 << 20


FAKE_SMARTCTL = """#!/bin/sh
# A stand-in for smartctl: healthy NVMe figures for any device, or nothing at all.
case "$*" in *--json*/dev/*) ;; *) exit 1 ;; esac
[ "$FAKE_SMART_FAIL" = 1 ] && exit 2
cat <<'JSON'
{"smartctl": {"exit_status": 0}, "smart_status": {"passed": true},
 "nvme_smart_health_information_log": {"temperature": 40, "percentage_used": 3, "media_errors": 0},
 "temperature": {"current": 40}}
JSON
"""


def device_figures(cluster):
    s, _ = scrape(cluster, "storage")
    return {k: v for k, v in s.items() if k[0].startswith("stoker_device_")}


def test_device_health_from_smartctl(make_cluster, tmp_path, monkeypatch):
    """SMART figures appear when smartctl answers, and stay absent (not zero) when not."""
    fake = tmp_path / "smartctl"
    fake.write_text(FAKE_SMARTCTL)
    fake.chmod(0o755)
    st = os.stat(tmp_path)
    if os.major(st.st_dev) == 0 or \
            not os.path.exists("/sys/dev/block/%d:%d" % (os.major(st.st_dev), os.minor(st.st_dev))):
        pytest.skip("the test folder is not on a block device")
    monkeypatch.setenv("STOKER_SMARTCTL", str(fake))
    ok = make_cluster("smart", targets=2)
    monkeypatch.setenv("FAKE_SMART_FAIL", "1")
    failing = make_cluster("nosmart", targets=1)
    figs = wait_for("SMART figures", lambda: device_figures(ok), timeout=30)
    healthy = {dict(k[1])["target"]: v for k, v in figs.items()
               if k[0] == "stoker_device_smart_healthy"}
    assert healthy == {"1": 1, "2": 1}, figs
    assert all(dict(k[1])["device"].startswith("/dev/") for k in figs)
    assert total(figs, "stoker_device_temperature_celsius") == 80
    assert total(figs, "stoker_device_wear_ratio") == pytest.approx(0.06)
    assert ("stoker_device_media_errors_total",) == tuple(
        {k[0] for k in figs if k[0].endswith("_total")})
    time.sleep(1)  # the failing cluster's checker has run by now too
    assert device_figures(failing) == {}


def test_top_once(cluster, rand_file):
    cluster.cli("put", str(rand_file(1 << 20)), "/top.bin")
    p = cluster.cli("top", "--once", "--interval", "0.5")
    out = p.stdout.decode()
    for role in ROLES:
        assert maddr(cluster, role) in out, out
        assert role in out
    assert out.count(" target ") == cluster.targets, out
    assert "cluster" in out and "READ" in out and "R-P99" in out
    # one file system under all four targets: the cluster's capacity is one target's
    sizes = {l.split()[0] if not l.startswith(" ") else "target":
             re.search(r"% of (.*)$", l).group(1) for l in out.splitlines()
             if re.search(r"% of ", l)}
    assert sizes["cluster"] == sizes["target"], out
    p = cluster.cli("top", "--once", "--metrics",
                    "%s,%s" % (maddr(cluster, "storage"), maddr(cluster, "meta")))
    out = p.stdout.decode()
    assert "storage" in out and "meta" in out and maddr(cluster, "mgmtd") not in out, out
    p = cluster.cli("top", "--once", "--metrics", "127.0.0.1:9", check=False)
    assert p.returncode == 1 and b"unreachable" in p.stdout


def test_top_live_view_refreshes_until_interrupted(cluster, rand_file):
    """Without --once, on a terminal: a new frame each interval, the screen cleared
    before each, until SIGINT ends it with status 0."""
    import pty
    import select
    master, slave = pty.openpty()
    p = subprocess.Popen([STOKER, "top", "--cluster", cluster.url, "--interval", "0.3"],
                         stdin=slave, stdout=slave, stderr=subprocess.PIPE, close_fds=True)
    os.close(slave)
    out = b""
    try:
        cluster.cli("put", str(rand_file(4 << 20)), "/live.bin")
        deadline = time.time() + 30
        while out.count(b"stoker top ") < 4 and time.time() < deadline:
            r, _, _ = select.select([master], [], [], 0.5)
            if r:
                try:
                    out += os.read(master, 65536)
                except OSError:  # the pty closed: top is gone
                    break
        p.send_signal(signal.SIGINT)
        assert p.wait(timeout=30) == 0, p.stderr.read()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        os.close(master)
    frames = out.count(b"stoker top ")
    assert frames >= 4, out[-2000:]
    assert out.count(b"\033[H\033[2J") >= frames - 1, out[-2000:]
    for role in ROLES:
        assert maddr(cluster, role).encode() in out


def test_no_metrics_and_bad_metrics_address(tmp_path):
    c = Cluster(tmp_path / "nm", pick_ports(), targets=1)
    p = run([STOKER, "up", "--data", c.data, "--daemon", "--port", str(c.port), "--targets", "1",
             "--no-metrics"], check=False, timeout=120)
    try:
        assert p.returncode == 0, p.stderr.decode() + c.logs()
        assert b"metrics on" not in p.stdout
        with pytest.raises(OSError):
            http(maddr(c, "storage"))
    finally:
        c.stop()
    # a daemon asked to serve metrics where it cannot refuses to start, and says why
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    try:
        p = run([STOKER, "mgmtd", "--listen", "127.0.0.1:0", "--data", str(tmp_path / "m"),
                 "--metrics", "127.0.0.1:%d" % busy.getsockname()[1]], check=False, timeout=30)
        assert p.returncode != 0
        assert b"cannot serve metrics" in p.stderr, p.stderr
    finally:
        busy.close()


def test_alert_rules():
    p = promtool("check", "rules", "alerts.yml", cwd=DEPLOY)
    assert p.returncode == 0, p.stdout.decode() + p.stderr.decode()
    p = promtool("test", "rules", "alerts_test.yml", cwd=DEPLOY)
    assert p.returncode == 0, p.stdout.decode() + p.stderr.decode()
    p = promtool("check", "config", "prometheus.yml", cwd=DEPLOY)
    assert p.returncode == 0, p.stdout.decode() + p.stderr.decode()


def test_scrape_config_lists_every_daemon():
    """deploy/prometheus/prometheus.yml scrapes each daemon `stoker up` starts, at the
    ports docs/metrics.md gives (BASE+10..+14 of the default 9400), and a training
    job's monitor at the port its example uses."""
    with open(os.path.join(DEPLOY, "prometheus.yml")) as f:
        cfg = f.read()
    jobs, job = {}, None
    for line in cfg.splitlines():
        m = re.match(r"\s*- job_name:\s*(\S+)", line)
        if m:
            job = m.group(1)
        m = re.match(r"\s*- (127\.0\.0\.1:\d+)", line)
        if m and job:
            jobs.setdefault(job, []).append(m.group(1))
    assert jobs == {"stoker": ["127.0.0.1:9410", "127.0.0.1:9411", "127.0.0.1:9412"],
                    "stoker-s3": ["127.0.0.1:9413"],
                    "stoker-mount": ["127.0.0.1:9414"],
                    "stoker-jobs": ["127.0.0.1:9700"]}, jobs
    with open(os.path.join(ROOT, "docs", "metrics.md")) as f:
        doc = f.read()
    for job, port in (("stoker-s3", "BASE+13"), ("stoker-mount", "BASE+14"),
                      ("stoker-jobs", "port=9700")):
        assert job in doc and port in doc, job


def prom_query(port, q):
    url = "http://127.0.0.1:%d/api/v1/query?%s" % (port, urllib.parse.urlencode({"query": q}))
    with urllib.request.urlopen(url, timeout=10) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return body["data"]["result"]


def wait_for(what, fn, timeout=60):
    """Until fn() is true; an OSError (nothing listening yet) counts as not yet."""
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        try:
            last = fn()
        except OSError as e:
            last = e
        else:
            if last:
                return last
        time.sleep(0.25)
    raise AssertionError("timed out waiting for %s (last: %r)" % (what, last))


@needs_prometheus
def test_prometheus_scrapes_the_cluster(cluster, rand_file, tmp_path):
    port = free_port()
    shutil.copy(os.path.join(DEPLOY, "alerts.yml"), tmp_path / "alerts.yml")
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text("""global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - alerts.yml
scrape_configs:
  - job_name: stoker
    static_configs:
      - targets: [%s]
""" % ", ".join("'%s'" % maddr(cluster, r) for r in ROLES))
    log = open(tmp_path / "prometheus.log", "wb")
    prom = subprocess.Popen([PROMETHEUS, "--config.file=%s" % cfg,
                             "--storage.tsdb.path=%s" % (tmp_path / "tsdb"),
                             "--web.listen-address=127.0.0.1:%d" % port],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        def ready():
            try:
                return http("127.0.0.1:%d" % port, "/-/ready")[0] == 200
            except OSError:
                return False
        wait_for("prometheus to start", ready)
        wait_for("three stoker targets up", lambda: len(
            [r for r in prom_query(port, 'up{job="stoker"} == 1')]) == 3)

        # What storage says now, and Prometheus caught up with it...
        now, _ = scrape(cluster, "storage")
        b0 = total(now, "stoker_target_write_bytes_total")
        q = 'sum(stoker_target_write_bytes_total{job="stoker"})'

        def value():
            res = prom_query(port, q)
            return float(res[0]["value"][1]) if res else None
        wait_for("prometheus to see %d bytes" % b0, lambda: value() == b0)
        # ...then the bytes this test writes, through PromQL.
        size = (2 << 20) + 777
        cluster.cli("put", str(rand_file(size, seed=7)), "/prom.bin")
        got = wait_for("prometheus to see the new bytes", lambda: value() == b0 + size and value())
        assert got == b0 + size
        # the rates and quantiles an operator graphs evaluate, and the rules loaded
        res = prom_query(port, 'histogram_quantile(0.99, sum by (le) '
                         '(rate(stoker_target_io_duration_seconds_bucket{op="write"}[1m])))')
        assert res and float(res[0]["value"][1]) > 0
        with urllib.request.urlopen("http://127.0.0.1:%d/api/v1/rules" % port, timeout=10) as r:
            rules = json.load(r)["data"]["groups"]
        names = {rule["name"] for g in rules for rule in g["rules"]}
        assert {"StokerTargetCapacityHigh", "StokerReadLatencyHigh", "StokerTargetOffline",
                "StokerChecksumErrors", "StokerNodeOffline", "StokerChainDegraded",
                "StokerResyncStalled", "StokerTargetFlapping"} <= names
        assert all(rule["health"] == "ok" for g in rules for rule in g["rules"]), rules
    finally:
        prom.terminate()
        try:
            prom.wait(timeout=30)
        except subprocess.TimeoutExpired:
            prom.kill()
            prom.wait()
        log.close()


def test_mount_serves_metrics(cluster, make_mount):
    """`stoker mount -o metrics=ADDR`: per-call counts, errors by errno name, bytes
    read and written and latency histograms of the FUSE daemon; valid exposition,
    counters that never go backwards."""
    addr = "127.0.0.1:%d" % free_port()
    m = make_mount(cluster, opts=["metrics=" + addr])
    status, ctype, text = http(addr)
    assert status == 200 and ctype.startswith("text/plain; version=0.0.4"), ctype
    first, types = parse(text)
    assert total(first, "stoker_build_info", role="mount") == 1
    assert http(addr, "/healthz")[2] == "ok\n"

    data = os.urandom(3 * 1024 * 1024 + 17)
    path = os.path.join(m.path, "f.bin")
    with open(path, "wb") as f:
        f.write(data)
    with open(path, "rb") as f:
        assert f.read() == data
    assert not os.path.exists(os.path.join(m.path, "no-such-file"))
    os.listdir(m.path)

    fuse = {"frontend": "fuse"}
    calls = ("lookup", "create", "write", "flush", "release", "opendir", "readdir", "read",
             "open")

    def counted(snap, op):
        if op == "readdir" and total(snap, "stoker_client_ops_total", op="readdirplus"):
            op = "readdirplus"
        return total(snap, "stoker_client_ops_total", op=op, **fuse)

    # A call is counted just after its reply reaches the kernel (release even after
    # close(2) returns), so a scrape right after the calls may run ahead of the last
    # few counts by a moment: scrape until they are all in, for at most 10 s.
    deadline = time.time() + 10
    while True:
        text = http(addr)[2]
        second, types = parse(text)
        if all(counted(second, op) >= 1 for op in calls) or time.time() > deadline:
            break
        time.sleep(0.1)
    assert total(second, "stoker_client_write_bytes_total", op="write", **fuse) == len(data)
    # The kernel may read ahead past what we asked, never less than the file.
    assert total(second, "stoker_client_read_bytes_total", op="read", **fuse) >= len(data)
    for op in calls:
        assert counted(second, op) >= 1, op
    assert total(second, "stoker_client_errors_total", op="lookup", error="ENOENT",
                 **fuse) >= 1
    writes = total(second, "stoker_client_ops_total", op="write", **fuse)
    assert total(second, "stoker_client_op_duration_seconds_count", op="write",
                 **fuse) == writes
    assert check_histograms(second, types) > 0
    for key, v in first.items():
        if family_of(key[0], types)[1] == "counter" and key in second:
            assert second[key] >= v, key
    p = promtool("check", "metrics", input=text.encode())
    assert p.returncode == 0, (p.stdout.decode(), p.stderr.decode())


def test_open_keeps_the_attributes_the_kernel_was_told(cluster, make_mount):
    """A file the kernel has just looked up, opened read-only: meta's fresh attributes
    at the open are those the kernel was told at the lookup, so its copy stays and
    the first read asks no getattr (counted by the mount's /metrics). After another
    mount rewrote the file, the open finds them changed, drops the kernel's copy, and
    the read sees the new bytes and size."""
    w = make_mount(cluster, "writer")
    addr = "127.0.0.1:%d" % free_port()
    r = make_mount(cluster, "reader", opts=["metrics=" + addr])
    fuse = {"frontend": "fuse"}
    n = 30
    datas = [os.urandom(1000 + 37 * i) for i in range(n)]
    os.mkdir(os.path.join(w.path, "d"))
    for i, data in enumerate(datas):
        with open(os.path.join(w.path, "d", "f%d" % i), "wb") as f:
            f.write(data)
    os.listdir(os.path.join(r.path, "d"))
    before = parse(http(addr)[2])[0]
    for i, data in enumerate(datas):
        with open(os.path.join(r.path, "d", "f%d" % i), "rb") as f:
            assert f.read() == data
    after = parse(http(addr)[2])[0]
    opens = total(after, "stoker_client_ops_total", op="open", **fuse) - \
        total(before, "stoker_client_ops_total", op="open", **fuse)
    getattrs = total(after, "stoker_client_ops_total", op="getattr", **fuse) - \
        total(before, "stoker_client_ops_total", op="getattr", **fuse)
    assert opens == n
    assert getattrs <= 2  # a stray one: the kernel revalidating the folder
    # rewritten elsewhere, longer, then the same length with other bytes
    p = os.path.join(r.path, "d", "f0")
    for new in (os.urandom(5000), os.urandom(5000)):
        with open(os.path.join(w.path, "d", "f0"), "wb") as f:
            f.write(new)
        with open(p, "rb") as f:
            assert f.read() == new
        assert os.stat(p).st_size == len(new)


def test_mount_bad_metrics_address(cluster, make_mount):
    m = make_mount(cluster, opts=["metrics="], start=False)
    p = m.start(check=False)
    assert p.returncode != 0 and b"-o metrics needs HOST:PORT" in p.stderr
    assert not m.mounted()
    m = make_mount(cluster, name="mnt2", opts=["metrics=999.1.1.1:x"], start=False)
    p = m.start(check=False)
    assert p.returncode != 0 and not m.mounted()
    assert b"metrics" in p.stderr, p.stderr


def test_up_mount_serves_metrics_on_base_plus_14(tmp_path):
    from conftest import have_fuse
    if not have_fuse():
        pytest.skip("needs root, /dev/fuse and fusermount3")
    port = pick_ports()
    data, mnt = tmp_path / "d", tmp_path / "mnt"
    mnt.mkdir()
    p = run([STOKER, "up", "--data", str(data), "--daemon", "--port", str(port),
             "--mount", str(mnt)], check=False, timeout=120)
    try:
        assert p.returncode == 0, p.stderr
        (mnt / "x").write_bytes(b"y" * 4096)
        samples, _ = parse(http("127.0.0.1:%d" % (port + 14))[2])
        assert total(samples, "stoker_build_info", role="mount") == 1
        assert total(samples, "stoker_client_write_bytes_total", frontend="fuse") == 4096
    finally:
        run([STOKER, "down", "--data", str(data)], check=False, timeout=120)


def test_top_once_shows_the_mount(cluster, make_mount):
    """`stoker top --mount ADDR` adds the mount's own row (role mount) while it writes."""
    addr = "127.0.0.1:%d" % free_port()
    m = make_mount(cluster, opts=["metrics=" + addr])
    stop = threading.Event()

    def writer():
        with open(os.path.join(m.path, "top.bin"), "wb") as f:
            while not stop.is_set():
                f.write(b"z" * 65536)
                f.flush()

    t = threading.Thread(target=writer)
    t.start()
    try:
        p = cluster.cli("top", "--once", "--interval", "1", "--mount", addr)
    finally:
        stop.set()
        t.join(timeout=60)
    out = p.stdout.decode()
    rows = [l for l in out.splitlines() if addr in l]
    assert len(rows) == 1 and " mount " in rows[0], out
    assert "unreachable" not in rows[0] and "waiting" not in rows[0], out
    assert maddr(cluster, "storage") in out
    p = cluster.cli("top", "--once", "--mount", ",", check=False)
    assert p.returncode == 2 and b"bad --mount list" in p.stderr


def test_top_once_shows_a_gateways_reads_and_writes(tmp_path):
    """A gateway's row counts its S3 data operations (GetObject, PutObject, UploadPart)
    as reads and writes: IOPS and a p99, not 0 and '-' (its ops are not named read and
    write as the mount's are)."""
    boto3 = pytest.importorskip("boto3")
    from botocore.config import Config
    port, s3port = pick_ports(), free_port()
    data = tmp_path / "d"
    ak, sk = "AKIDTOPTEST", "top-secret"
    env = dict(os.environ, STOKER_S3_ACCESS_KEY=ak, STOKER_S3_SECRET_KEY=sk)
    p = run([STOKER, "up", "--data", str(data), "--daemon", "--port", str(port),
             "--targets", "1", "--s3", str(s3port)], check=False, timeout=120, env=env)
    gw = "127.0.0.1:%d" % (port + 13)
    stop = threading.Event()
    errors = []
    try:
        assert p.returncode == 0, p.stderr
        s3 = boto3.client("s3", endpoint_url="http://127.0.0.1:%d" % s3port,
                          aws_access_key_id=ak, aws_secret_access_key=sk,
                          region_name="us-east-1",
                          config=Config(s3={"addressing_style": "path"},
                                        retries={"max_attempts": 1}))
        wait_for("the gateway's metrics", lambda: "stoker_client_ops_total" in http(gw)[2],
                 timeout=30)
        def bucket_made():
            try:
                return s3.create_bucket(Bucket="top") and True
            except Exception as e:  # not listening yet: botocore's own errors
                if "BucketAlreadyOwnedByYou" in str(e):
                    return True
                return False

        wait_for("the gateway", bucket_made, timeout=30)
        body = os.urandom(64 << 10)

        def load():
            try:
                while not stop.is_set():
                    s3.put_object(Bucket="top", Key="k", Body=body)
                    assert s3.get_object(Bucket="top", Key="k")["Body"].read() == body
            except Exception as e:  # reported after top
                errors.append(e)

        t = threading.Thread(target=load)
        t.start()
        try:
            time.sleep(0.5)
            p = run([STOKER, "top", "--once", "--interval", "1", "--cluster",
                     "stk://127.0.0.1:%d" % port, "--mount", gw], check=False)
        finally:
            stop.set()
            t.join(timeout=60)
        assert not errors, errors
        out = p.stdout.decode()
        assert p.returncode == 0, out + p.stderr.decode()
        rows = [l for l in out.splitlines() if gw in l]
        assert len(rows) == 1 and " s3 " in rows[0], out
        # NAME ROLE ADDR READ WRITE R-IOPS W-IOPS R-P99 W-P99 ...: the byte rates are
        # two words each ("1.2 MiB/s"), the latencies too ("3.10 ms")
        cols = rows[0].split()
        riops, wiops = float(cols[7].rstrip("k")), float(cols[8].rstrip("k"))
        assert riops > 0 and wiops > 0, out
        assert cols[9] != "-" and cols[11] != "-", out
    finally:
        stop.set()
        run([STOKER, "down", "--data", str(data)], check=False, timeout=120)


def test_a_stopped_storage_node_goes_offline_in_mgmtds_gauges(tmp_path):
    """Kill a storage daemon: within the heartbeat timeout mgmtd's gauges say so
    (node online 0, its targets not serving and in state offline, the counts by
    state). Roles run as separate processes here, since `stoker up`'s supervisor
    would restart the daemon at once."""
    port, mport = free_port(), free_port()
    mgmtd_addr, maddr_m = "127.0.0.1:%d" % port, "127.0.0.1:%d" % mport
    procs = []

    def spawn(name, *args):
        log = open(tmp_path / (name + ".log"), "wb")
        p = subprocess.Popen([STOKER] + list(args), stdout=log, stderr=subprocess.STDOUT)
        procs.append((p, log))
        return p

    try:
        spawn("mgmtd", "mgmtd", "--listen", mgmtd_addr, "--data", str(tmp_path / "m"),
              "--metrics", maddr_m, "--heartbeat-timeout-ms", "2000")
        wait_for("mgmtd's metrics", lambda: _try_scrape(maddr_m), timeout=30)
        storage = spawn("storage", "storage", "--listen", "127.0.0.1:%d" % free_port(),
                        "--mgmtd", mgmtd_addr, "--data", str(tmp_path / "s"),
                        "--target", str(tmp_path / "s" / "t0"),
                        "--target", str(tmp_path / "s" / "t1"))

        def serving():
            m = _try_scrape(maddr_m)
            return m and total(m, "stoker_cluster_target_serving") == 2 and m
        m = wait_for("two serving targets", serving, timeout=30)
        assert total(m, "stoker_cluster_node_online", role="storage") == 1
        assert total(m, "stoker_cluster_target_state", state="serving") == 2
        assert total(m, "stoker_cluster_target_state", state="offline") == 0
        # two target folders on one file system: mgmtd counts it once
        assert total(m, "stoker_cluster_capacity_bytes") == \
            os.statvfs(tmp_path).f_blocks * os.statvfs(tmp_path).f_frsize

        storage.kill()
        storage.wait()
        t0 = time.time()

        def offline():
            m = _try_scrape(maddr_m)
            return m and total(m, "stoker_cluster_node_online", role="storage") == 0 and m
        m = wait_for("the node offline", offline, timeout=15)
        # heartbeat timeout 2 s, checked by mgmtd about once a second
        assert time.time() - t0 < 10
        assert total(m, "stoker_cluster_nodes", role="storage", state="offline") == 1
        assert total(m, "stoker_cluster_target_serving") == 0
        assert total(m, "stoker_cluster_target_state", state="offline") == 2
        assert total(m, "stoker_cluster_targets", state="offline") == 2
    finally:
        for p, log in procs:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
            log.close()


def _try_scrape(addr):
    try:
        return parse(http(addr)[2])[0]
    except OSError:
        return None
