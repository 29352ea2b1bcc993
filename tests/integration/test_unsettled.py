"""A successor that does not take a change for as long as it likes: its disk is full.

Two storage nodes, each in a network namespace of its own (netns.py) with its one
target on a small tmpfs, make one chain of two (mgmtd --replicas 2). Once the
tail's tmpfs is filled, an overwrite the head applied is refused by the tail
(ENOSPC). What must hold (src/storage/service.c, "Unsettled changes"):

- the head keeps the change pending and says so: stoker_node_unsettled_changes
  is 1 and its age grows; `stoker status` and `stoker doctor` show it;
- readers get the committed bytes (the old ones, the tail's), never the head's;
- the head sends the change again with backoff (far fewer resends than one each
  250 ms), and once the tail has room it settles: the copies are identical;
- with the table full (STOKER_TEST_UNSETTLED_MAX=1 here), the head refuses a new
  change before applying it (EAGAIN, counted in
  stoker_node_unsettled_refused_total): its copy is never changed behind the
  chain's back; once the table has room again the same write goes through.
"""
import contextlib
import json
import os
import re
import time

from conftest import CHECK, needs_root, run
from netns import net_cluster
from test_replication import chunk_files, tables, wait_for

pytestmark = needs_root

MGMTD = ["--replicas", "2", "--heartbeat-timeout-ms", "3000"]
METRICS_PORT_OFFSET = 10  # the `stoker up` convention (src/cli/cli.h)


def metrics_addr(addr):
    host, port = addr.rsplit(":", 1)
    return "%s:%d" % (host, int(port) + METRICS_PORT_OFFSET)


def scrape(net, node):
    """{name: value} of node's /metrics, read from the client's namespace."""
    out = run(net.in_client(["curl", "-sf", "http://%s/metrics" % metrics_addr(node.addr)]),
              check=False).stdout.decode()
    vals = {}
    for line in out.splitlines():
        m = re.match(r"^(stoker_node_[a-z_]+) ([0-9.e+-]+)$", line)
        if m:
            vals[m.group(1)] = float(m.group(2))
    return vals


def fill(folder):
    """Fills folder's file system; returns the filler's path (remove it to free)."""
    path = os.path.join(folder, "filler")
    block = b"\0" * (1 << 20)
    with open(path, "wb", buffering=0) as f:
        while True:
            try:
                f.write(block)
            except OSError:
                break
    # what a whole block did not fit
    with open(path, "ab", buffering=0) as f:
        for _ in range(4096):
            try:
                f.write(b"\0" * 4096)
            except OSError:
                break
    return path


@contextlib.contextmanager
def full_tail_cluster(tmp_path, env=None):
    """meta1, st1 and st2 (one target each, on a 64 MiB tmpfs each, metrics on),
    one chain of two. Yields (net, head node, tail node, tail's target folder)."""
    mounted = []
    saved = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})
    try:
        with net_cluster(tmp_path, mgmtd_args=MGMTD) as net:
            net.add_meta("meta1")
            for name in ("st1", "st2"):
                node = net.add_storage(name, targets=1)
                node.argv += ["--metrics", metrics_addr(node.addr)]
                os.makedirs(node.targets[0])
                run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", node.targets[0]])
                mounted.append(node.targets[0])
            net.start_all()
            net.wait_serving()
            targets, chains = wait_for("a chain of two", lambda: (lambda t, c: (t, c) if c
                                       else None)(*tables(net.status())))
            assert len(chains) == 1, chains
            (_, (_, members, _)), = chains.items()
            assert len(members) == 2, chains
            node_of = {t: targets[t][1].split(os.sep)[-2] for t in members}
            head, tail = net.nodes[node_of[members[0]]], net.nodes[node_of[members[1]]]
            yield net, head, tail, tail.targets[0]
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        for m in mounted:
            run(["umount", "-l", m], check=False)


def overwrite(net, path, seed, env=None):
    """stk_check overwrite: PATH rewritten in place (no truncation) with pattern seed."""
    return run(net.in_client([CHECK, "overwrite", net.url, path, str(seed)]), check=False,
               env=dict(net.env(), **(env or {})))


def chain_files_differing(targets, chains):
    """The chunk files (relative paths) the members of the chain do not hold alike."""
    (_, (_, members, _)), = chains.items()
    a, b = (chunk_files(targets[t][1]) for t in members)
    return sorted(rel for rel in set(a) | set(b)
                  if rel not in a or rel not in b
                  or open(a[rel], "rb").read() != open(b[rel], "rb").read())


def test_a_change_the_full_successor_refuses_waits_and_settles(tmp_path):
    with full_tail_cluster(tmp_path) as (net, head, tail, tail_dir):
        old = os.urandom(300_000)
        net.cli("put", "-", "/f", input=old)
        assert scrape(net, head).get("stoker_node_unsettled_changes") == 0
        filler = fill(tail_dir)
        r = overwrite(net, "/f", 7)
        assert r.returncode != 0, "the tail had no room, yet the overwrite was acknowledged"
        assert b"space" in r.stderr, r.stderr
        t_refused = time.time()
        m = wait_for("the head to hold the change",
                     lambda: (lambda v: v if v.get("stoker_node_unsettled_changes") == 1
                              else None)(scrape(net, head)))
        assert m["stoker_node_unsettled_capacity"] == 4096, m
        # readers get the committed copy, the tail's: the old bytes, again and again
        for _ in range(5):
            assert net.cli("cat", "/f").stdout == old
        assert "stays pending until it does" in open(head.log).read()

        # a successor that keeps refusing is asked with backoff, not every 250 ms
        while time.time() < t_refused + 12:
            time.sleep(0.5)
        m = scrape(net, head)
        assert m["stoker_node_unsettled_changes"] == 1, m
        assert m["stoker_node_unsettled_oldest_seconds"] >= 10, m
        assert 2 <= m["stoker_node_settle_resends_total"] <= 10, m
        assert m["stoker_node_settle_failures_total"] == m["stoker_node_settle_resends_total"]
        assert net.cli("cat", "/f").stdout == old

        # the operator sees it
        status = net.status()
        assert re.search(r"node %s: 1 change its successors have not taken" % r"\d+", status), \
            status
        doc = json.loads(net.cli("doctor", "--cluster", net.url, "--json", "--quick",
                                 check=False).stdout)
        chains = [c for c in doc["checks"] if c["check"] == "chains"][0]
        assert chains["verdict"] == "WARN", chains
        assert "changes its successors have not taken" in chains["text"] or \
            "change its successors have not taken" in chains["text"], chains

        # room again: the change settles by itself, and the copies meet
        os.unlink(filler)
        wait_for("the change to settle",
                 lambda: scrape(net, head).get("stoker_node_unsettled_changes") == 0,
                 timeout=30)
        assert "settled (sent whole to its successor again)" in open(head.log).read()
        t, c = tables(net.status())
        assert chain_files_differing(t, c) == [], "the copies still differ once settled"
        new = net.cli("cat", "/f").stdout
        assert len(new) == len(old) and new != old
        assert "its successors have not taken" not in net.status()


def test_a_full_table_refuses_the_next_change_before_applying_it(tmp_path):
    with full_tail_cluster(tmp_path, env={"STOKER_TEST_UNSETTLED_MAX": "1"}) as (
            net, head, tail, tail_dir):
        f, g = os.urandom(200_000), os.urandom(200_000)
        net.cli("put", "-", "/f", input=f)
        net.cli("put", "-", "/g", input=g)
        filler = fill(tail_dir)
        assert overwrite(net, "/f", 7).returncode != 0
        wait_for("the head to hold the change",
                 lambda: scrape(net, head).get("stoker_node_unsettled_changes") == 1)
        # the table is full: /g's overwrite is refused by the head before it applies it,
        # and its client, told to try again (EAGAIN), gives up after its retry time
        r = overwrite(net, "/g", 8, env={"STOKER_RETRY_MS": "1500"})
        assert r.returncode != 0, "a change the head could not keep pending was taken"
        m = scrape(net, head)
        assert m["stoker_node_unsettled_refused_total"] >= 1, m
        assert m["stoker_node_unsettled_changes"] == 1, m
        assert "new changes are refused" in open(head.log).read()
        t, c = tables(net.status())
        assert len(chain_files_differing(t, c)) == 1, "the head changed /g's chunk"
        assert net.cli("cat", "/g").stdout == g
        assert "FULL: new changes refused" in net.status()

        os.unlink(filler)
        wait_for("the change to settle",
                 lambda: scrape(net, head).get("stoker_node_unsettled_changes") == 0,
                 timeout=30)
        r = overwrite(net, "/g", 8)
        assert r.returncode == 0, r.stderr
        t, c = tables(net.status())
        assert chain_files_differing(t, c) == []
        assert net.cli("cat", "/g").stdout != g
