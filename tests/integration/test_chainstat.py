"""What an operator sees of a chain that loses a member and gets it back.

Three storage nodes, each in a network namespace of its own (netns.py), one target
each: mgmtd (--replicas 3) makes one chain of the three. One node is killed:
`stoker status` says the chain is degraded and mgmtd's /metrics counts it. New
data is written without it. It comes back with --resync-rate 1M (1 MiB/s), so that
its copy of what it missed (8 MB) takes seconds: meanwhile `stoker status` shows it
syncing with a percentage that moves, `stoker top` lists it, and then it serves
again; the node's resync counters hold what it copied, at no more than the rate,
and mgmtd counted the target's state changes.
"""
import os
import re
import time

import pytest

from conftest import STOKER, needs_root, run
from netns import net_cluster

pytestmark = needs_root

MGMTD = ["--replicas", "3", "--heartbeat-timeout-ms", "3000"]
MB = 1000 * 1000


def metrics_addr(node):
    ip, port = node.addr.rsplit(":", 1)
    return "%s:%d" % (ip, int(port) + 10)


def scrape(net, node):
    """node's /metrics, fetched from the client's namespace: {series: value}."""
    code = ("import urllib.request,sys;"
            "sys.stdout.write(urllib.request.urlopen('http://%s/metrics',timeout=10)"
            ".read().decode())" % metrics_addr(node))
    out = run(net.in_client(["/usr/bin/python3", "-c", code]), timeout=30).stdout.decode()
    vals = {}
    for line in out.splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            vals[k] = float(v)
    return vals


def wait_for(what, fn, timeout=40, every=0.3):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(every)
    raise AssertionError("timed out waiting for " + what)


def test_degraded_chain_then_throttled_resync_in_status_top_and_metrics(tmp_path):
    with net_cluster(tmp_path, mgmtd_args=MGMTD) as net:
        mg = net.nodes["mgmtd"]
        mg.argv += ["--metrics", metrics_addr(mg)]
        net.add_meta("meta1")
        for n in ("st1", "st2", "st3"):
            node = net.add_storage(n, targets=1)
            node.argv += ["--metrics", metrics_addr(node)]
        net.nodes["st2"].argv += ["--resync-rate", "1M"]
        net.start_all()
        net.wait_serving()
        out = wait_for("a chain of three", lambda: (lambda s: s if re.search(
            r"^  1\s+\d+\s+\d+ \d+ \d+$", s, re.M) else None)(net.status()))
        assert "degraded chains: 0 of 1, unavailable: 0" in out, out
        m = scrape(net, mg)
        assert m['stoker_cluster_chains_by_state{state="healthy"}'] == 1, m
        assert m['stoker_cluster_chains_by_state{state="degraded"}'] == 0, m
        tid = int(re.search(r"^  (\d+)\s+\d+\s+\S+.*st2%st0$" % os.sep, out, re.M).group(1))

        for i in range(2):
            net.cli("put", "-", "/before%d" % i, input=os.urandom(300_000))

        # st2 dies: its target goes offline and the chain runs on two copies
        net.kill("st2")
        out = wait_for("a degraded chain", lambda: (lambda s: s if
                       "degraded chains: 1 of 1, unavailable: 0" in s else None)(net.status()))
        assert re.search(r"^  1\s+\d+\s+.*\b%d\(offline\).*! degraded$" % tid, out, re.M), out
        assert re.search(r"^    target %d \(node \d+\) offline$" % tid, out, re.M), out
        wait_for("mgmtd to count the degraded chain", lambda: scrape(net, mg).get(
            'stoker_cluster_chains_by_state{state="degraded"}') == 1)

        # what it misses: 8 MB it must copy when it is back, at 1 MB/s
        data = {"/missed%d" % i: os.urandom(MB) for i in range(8)}
        for name, d in data.items():
            net.cli("put", "-", name, input=d)

        t0 = time.time()
        net.start("st2")
        seen = []

        def progress():
            s = net.status()
            m = re.search(r"\b%d\(syncing:(\d+)%%\)" % tid, s)
            if m:
                seen.append(int(m.group(1)))
                assert "degraded chains: 1 of 1" in s, s
                assert re.search(r"^    target %d \(node \d+\) syncing: [\d.]+%%, \d+ chunks "
                                 r"compared, \d+ copied \(.*\)$" % tid, s, re.M), s
            return m and int(m.group(1)) > 0
        wait_for("a syncing target with its progress", progress, timeout=30, every=0.2)
        top = net.cli("top", "--once", "--interval", "1", "--cluster", net.url).stdout.decode()
        assert re.search(r"^chains: 0 healthy, 1 degraded, 0 unavailable$", top, re.M), top
        assert re.search(r"^  t%d\s+syncing \(node \d+\): [\d.]+%% done" % tid, top, re.M), top

        out = wait_for("the target serving again", lambda: (lambda s: s if
                       "degraded chains: 0 of 1" in s else None)(net.status()), timeout=40)
        took = time.time() - t0
        assert not re.search(r"\(syncing|\(offline|! degraded", out), out
        assert seen and max(seen) < 100, seen

        # the copy: at least what was missed, no faster than the rate allows
        sm = scrape(net, net.nodes["st2"])
        copied = sm['stoker_target_resync_copied_bytes_total{target="%d"}' % tid]
        assert copied >= 8 * MB, sm
        assert sm['stoker_target_resync_copied_chunks_total{target="%d"}' % tid] >= 8, sm
        assert sm['stoker_target_resync_checked_chunks_total{target="%d"}' % tid] >= 10, sm
        assert sm['stoker_target_resync_progress_ratio{target="%d"}' % tid] == 0, sm
        assert took >= copied / MB - 1.5, (took, copied)
        assert "catching up with chain 1 (version" in open(net.nodes["st2"].log).read()

        m = scrape(net, mg)
        assert m['stoker_cluster_chains_by_state{state="healthy"}'] == 1, m
        key = [k for k in m if k.startswith("stoker_cluster_target_state_changes_total{")
               and 'target="%d"' % tid in k]
        assert key and m[key[0]] >= 3, m  # offline, syncing, serving

        for name, d in data.items():
            assert net.cli("cat", name).stdout == d
