"""`stoker doctor`: each check on a healthy cluster, then on a cluster with the fault
that check is for (docs/doctor.md).

- healthy: a one-machine cluster with its data on a tmpfs (so that its disk is
  quick whatever else the machine does), mounted, and a data set of large files:
  every check that can run says OK, the exit status is 0; a data set of small
  files gets the advice to pack them.
- a full target: one target folder on a tmpfs of its own, filled to 97%.
- a slowed target: one target folder on an ext4 on a loop device, and the storage
  process in a blkio cgroup that lets 5 writes a second reach that device: its
  fsyncs take 200 ms or more, the other target's (tmpfs) stay quick.
- a failing disk: the storage node's smartctl (STOKER_SMARTCTL) says it fails.
- harmful mount options: -o flush,attr_timeout=0.
- a stopped node and a smaller MTU: three storage nodes in network namespaces;
  one node's interface gets MTU 1400, then the node is killed.

The latency verdicts use one threshold both ways (--p99-ms 40): a 1 MiB write to
a tmpfs takes about a millisecond; a throttled one 200 ms or more.
"""
import json
import os
import re
import signal
import subprocess
import time

import pytest

from conftest import STOKER, errno_of, needs_fuse, needs_root, run
from netns import ip, net_cluster

pytestmark = needs_root

P99 = ["--p99-ms", "40", "--rtt-ms", "50"]


def doctor(cli, *args):
    """`stoker doctor --json ARGS` through cli: (exit status, {check: its result})."""
    p = cli("doctor", "--json", *args, check=False)
    assert p.returncode in (0, 1), (p.returncode, p.stdout, p.stderr)
    out = json.loads(p.stdout)
    return p.returncode, {c["check"]: c for c in out["checks"]}


def verdicts(checks):
    return {k: v["verdict"] for k, v in checks.items()}


def wait_for(what, fn, timeout=40, every=0.3):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(every)
    raise AssertionError("timed out waiting for " + what)


@pytest.fixture
def tmpfs():
    """make(path, size) mounts a tmpfs there; all unmounted at teardown. Ask for it
    before make_cluster, so that clusters stop before their file systems go."""
    made = []

    def make(path, size):
        os.makedirs(str(path), exist_ok=True)
        run(["mount", "-t", "tmpfs", "-o", "size=" + size, "tmpfs", str(path)])
        made.append(str(path))
        return str(path)

    yield make
    for p in reversed(made):
        run(["umount", "-l", p], check=False)


def target_ids(cluster):
    """{target folder: (target id, node id)} from `stoker status`."""
    out = cluster.cli("status").stdout.decode()
    ids = {}
    for m in re.finditer(r"^  (\d+)\s+(\d+)\s+\S+\s+.*\s(/\S+)$", out, re.M):
        ids[m.group(3)] = (int(m.group(1)), int(m.group(2)))
    return ids


def chunks(cluster, folder):
    """The chunks the target in folder holds, from `stoker status`."""
    out = cluster.cli("status").stdout.decode()
    m = re.search(r"^  \d+\s+\d+\s+\S+\s+.*\s(\d+)  %s$" % re.escape(folder), out, re.M)
    return int(m.group(1))


def fill(cluster, size):
    """Writes size bytes into the cluster as files of 1 MiB (a chunk each)."""
    chunk = os.urandom(1 << 20)
    for i in range(size >> 20):
        cluster.cli("put", "-", "/fill%d" % i, input=chunk)


def files(folder, n, size):
    os.makedirs(folder, exist_ok=True)
    for i in range(n):
        with open(os.path.join(folder, "f%05d" % i), "wb") as f:
            f.write(os.urandom(size))
    return str(folder)


@needs_fuse
def test_healthy_cluster_passes_and_small_files_are_found(tmpfs, make_cluster, make_mount,
                                                         tmp_path):
    tmpfs(tmp_path / "stk", "1g")
    c = make_cluster("stk", targets=2)
    fill(c, 48 << 20)  # writes for each target's p99
    m = make_mount(c, "mnt")
    big = files(tmp_path / "ds" / "train", 40, 300 << 10)

    rc, ch = doctor(c.cli, "--cluster", c.url, *P99, "--gpus", "1", "--loader-batch", "2",
                    "--loader-step-ms", "100", big)
    v = verdicts(ch)
    assert rc == 0, ch
    for k in ("mgmtd", "nodes", "network", "tcp", "clock", "capacity", "latency", "chains",
              "versions", "files", "loader"):
        assert v[k] == "OK", (k, ch[k])
    assert v["mtu"] == "SKIP" and "loopback" in ch["mtu"]["text"], ch["mtu"]
    assert v["disks"] == "SKIP", ch["disks"]  # tmpfs: no device to ask
    assert "FAIL" not in v.values(), ch
    assert re.search(r"^2 nodes online \(1 meta, 1 storage\)", ch["nodes"]["text"]), ch
    assert re.search(r"^3 daemons answer from this host", ch["network"]["text"]), ch
    assert re.search(r"worst write p99 [\d.]+ (us|ms)", ch["latency"]["text"]), ch
    assert "2 chains of one target each" in ch["chains"]["text"], ch
    assert re.search(r"^1 accelerator kept 90% busy reading .*/ds/train \(40 files", ch[
        "loader"]["text"]), ch
    # other tests' mounts may be there too: none of the findings is about ours
    assert m.path not in json.dumps(ch["mounts"]), ch["mounts"]
    assert v["mounts"] in ("OK", "WARN"), ch["mounts"]

    # the text form: one line per check, the same verdicts, exit 0
    p = c.cli("doctor", "--cluster", c.url, *P99, "--quick", big)
    out = p.stdout.decode()
    assert p.returncode == 0, out
    for k in ("mgmtd", "nodes", "capacity", "chains", "files"):
        assert re.search(r"^OK    %s\s" % k, out, re.M), out
    assert re.search(r"^SKIP  loader\s+--quick$", out, re.M), out

    # many small files: the advice is to pack them (and nothing fails for it)
    # (in 100 folders: more than the walk's first queue holds)
    small = str(tmp_path / "small")
    for i in range(100):
        files(os.path.join(small, "c%03d" % i), 12, 4096)
    rc, ch = doctor(c.cli, "--cluster", c.url, *P99, "--quick", small)
    assert rc == 0, ch
    assert ch["files"]["verdict"] == "WARN", ch["files"]
    assert ch["files"]["text"].startswith("1200 of 1200 files sampled are under 256.0 KiB")
    assert "stoker pack %s" % small in ch["files"]["fix"], ch["files"]
    # and through Stoker itself
    c.cli("mkdir", "/small")
    for i in range(3):
        c.cli("put", os.path.join(small, "c000", "f%05d" % i), "/small/f%d" % i)
    rc, ch = doctor(c.cli, "--cluster", c.url, *P99, "--quick", c.url + "/small")
    assert ch["files"]["verdict"] == "OK", ch["files"]
    assert ch["files"]["text"].startswith("3 files sampled, 3 under 256.0 KiB"), ch["files"]


@needs_fuse
def test_harmful_mount_options(tmpfs, make_cluster, make_mount, tmp_path):
    tmpfs(tmp_path / "stk", "256m")
    c = make_cluster("stk", targets=1)
    good = make_mount(c, "good")
    bad = make_mount(c, "bad", opts=["flush", "attr_timeout=0"])
    rc, ch = doctor(c.cli, "--cluster", c.url, *P99, "--quick")
    mnt = ch["mounts"]
    assert mnt["verdict"] == "WARN", mnt
    texts = [f["text"] for f in mnt["findings"]]
    assert any(t.startswith("mount %s: -o attr_timeout=0" % bad.path) for t in texts), texts
    assert any(t.startswith("mount %s: -o flush" % bad.path) for t in texts), texts
    assert not any(good.path + ":" in t for t in texts), texts
    assert rc == 0, ch  # a WARN is no failure

    # a mount whose daemon is gone fails its own cluster's check, and no other's
    tmpfs(tmp_path / "stk2", "256m")
    c2 = make_cluster("stk2", targets=1)
    dead = make_mount(c2, "dead")
    os.kill(dead.pid(), signal.SIGKILL)
    wait_for("the killed mount daemon's mount to fail", lambda: errno_of(os.stat, dead.path))
    rc, ch = doctor(c2.cli, "--cluster", c2.url, *P99, "--quick")
    assert rc == 1 and ch["mounts"]["verdict"] == "FAIL", ch["mounts"]
    assert ch["mounts"]["text"].startswith("mount %s: " % dead.path), ch["mounts"]
    assert "its daemon is gone" in ch["mounts"]["text"], ch["mounts"]
    rc, ch = doctor(c.cli, "--cluster", c.url, *P99, "--quick")
    assert ch["mounts"]["verdict"] == "WARN", ch["mounts"]
    assert not any(dead.path in f["text"] for f in ch["mounts"]["findings"]), ch["mounts"]


def test_full_target(tmpfs, make_cluster, tmp_path):
    data = tmpfs(tmp_path / "stk", "256m")
    small = tmpfs(os.path.join(data, "targets", "0"), "32m")
    with open(os.path.join(small, "filler"), "wb") as f:
        f.write(b"\0" * (31 << 20))  # 97% of it
    c = make_cluster("stk", targets=2)
    tid, nid = target_ids(c)[small]
    wait_for("the target's capacity at mgmtd", lambda: doctor(
        c.cli, "--cluster", c.url, *P99, "--quick", "--window", "0.2")[1]["capacity"][
        "verdict"] == "FAIL", timeout=20)
    rc, ch = doctor(c.cli, "--cluster", c.url, *P99, "--quick")
    cap = ch["capacity"]
    assert rc == 1, ch
    assert cap["verdict"] == "FAIL", cap
    assert re.match(r"target %d on node %d is (9[5-9]|100)%% full" % (tid, nid), cap["text"]), cap
    assert "`stoker admin drain-node %d`" % nid in cap["fix"], cap
    # the other target, on the larger tmpfs, is not named
    assert len(cap["findings"]) == 1, cap
    others = {k: v for k, v in verdicts(ch).items() if v == "FAIL" and k != "capacity"}
    assert not others, ch

    # the same thresholds, moved: a warning at 90%, no failure until 99%
    rc, ch = doctor(c.cli, "--cluster", c.url, *P99, "--quick", "--full-warn", "90",
                    "--full-fail", "99.9")
    assert rc == 0 and ch["capacity"]["verdict"] == "WARN", ch["capacity"]


def whole_disk(dev):
    """The block device (MAJ:MIN) that blkio rules name for dev: a partition's disk."""
    sysdir = os.path.realpath("/sys/dev/block/%d:%d" % (os.major(dev), os.minor(dev)))
    if os.path.exists(os.path.join(sysdir, "partition")):
        sysdir = os.path.dirname(sysdir)
    with open(os.path.join(sysdir, "dev")) as f:
        return f.read().strip()


@pytest.fixture
def loop_ext4():
    """make(image, mountpoint): an ext4 on a loop device over image, mounted; all gone
    at teardown (ask for it before make_cluster)."""
    made = []

    def make(image, mp):
        run(["truncate", "-s", "96M", image])
        dev = run(["losetup", "-f", "--show", image]).stdout.decode().strip()
        made.append((None, dev))
        run(["mkfs.ext4", "-q", dev])
        os.makedirs(mp, exist_ok=True)
        run(["mount", dev, mp])
        made.append((mp, None))
        return dev

    yield make
    for mp, dev in reversed(made):
        if mp:
            run(["umount", "-l", mp], check=False)
        else:
            run(["losetup", "-d", dev], check=False)


@pytest.fixture
def blkio():
    """make(name, rule_file, rule): a blkio cgroup (v1) with one throttle rule;
    move(pid) puts a process in it. Removed at teardown, its processes back at the
    root."""
    root = "/sys/fs/cgroup/blkio"
    if not os.path.isdir(root) or not os.access(root, os.W_OK):
        pytest.skip("no writable blkio cgroup (v1) hierarchy")
    made = []

    class G:
        def __init__(self, name):
            self.path = os.path.join(root, name)
            os.makedirs(self.path, exist_ok=True)
            made.append(self)

        def rule(self, what, line):
            with open(os.path.join(self.path, "blkio.throttle." + what), "w") as f:
                f.write(line)

        def move(self, pid):
            with open(os.path.join(self.path, "cgroup.procs"), "w") as f:
                f.write(str(pid))

    yield G
    for g in made:
        try:
            with open(os.path.join(g.path, "cgroup.procs")) as f:
                pids = f.read().split()
            for pid in pids:
                try:
                    with open(os.path.join(root, "cgroup.procs"), "w") as f:
                        f.write(pid)
                except OSError:
                    pass
            os.rmdir(g.path)
        except OSError:
            pass


def test_slowed_target(tmpfs, loop_ext4, blkio, make_cluster, tmp_path):
    data = tmpfs(tmp_path / "stk", "512m")
    slow = os.path.join(data, "targets", "0")
    dev = loop_ext4(os.path.join(data, "disk.img"), slow)
    c = make_cluster("stk", targets=2)
    ids = target_ids(c)
    tid, nid = ids[slow]
    fast = [t for p, (t, _) in ids.items() if p != slow]
    st = os.stat(dev)
    g = blkio("stkdoctor-%d" % os.getpid())
    g.rule("write_iops_device", "%s 5" % whole_disk(st.st_rdev))
    g.move(c.pids()["storage"])
    # files of one chunk each, every write fsynced, until the throttled target has
    # taken enough of them for a p99 (files are spread over the chains by a seed)
    chunk, i = os.urandom(1 << 20), 0
    while chunks(c, slow) < 24:
        c.cli("put", "-", "/f%d" % i, input=chunk)
        i += 1

    rc, ch = doctor(c.cli, "--cluster", c.url, *P99, "--quick")
    lat = ch["latency"]
    assert lat["verdict"] in ("WARN", "FAIL"), lat
    named = {int(m.group(1)) for f in lat["findings"]
             for m in [re.match(r"target (\d+) on node (\d+): write p99", f["text"])] if m}
    assert named == {tid}, (lat, tid, fast)
    assert re.match(r"target %d on node %d: write p99 [\d.]+ (ms|s) " % (tid, nid),
                    lat["text"]), lat
    assert "check node %d's device" % nid in lat["fix"], lat
    assert rc == (1 if lat["verdict"] == "FAIL" else 0), ch


FAKE_SMARTCTL = """#!/bin/sh
# A stand-in for smartctl: one NVMe device's health, passing or failing.
case "$*" in *--json*/dev/*) ;; *) exit 1 ;; esac
if [ "$FAKE_SMART_FAIL" = 1 ]; then
    echo '{"smartctl": {"exit_status": 8}, "smart_status": {"passed": false},'
    echo ' "nvme_smart_health_information_log": {"percentage_used": 97, "media_errors": 12}}'
    exit 8
fi
echo '{"smartctl": {"exit_status": 0}, "smart_status": {"passed": true},'
echo ' "nvme_smart_health_information_log": {"temperature": 40, "percentage_used": 3,'
echo '  "media_errors": 0}, "temperature": {"current": 40}}'
"""


def test_disk_health(make_cluster, tmp_path, monkeypatch):
    st = os.stat(tmp_path)
    if os.major(st.st_dev) == 0 or \
            not os.path.exists("/sys/dev/block/%d:%d" % (os.major(st.st_dev), os.minor(st.st_dev))):
        pytest.skip("the test folder is not on a block device")
    fake = tmp_path / "smartctl"
    fake.write_text(FAKE_SMARTCTL)
    fake.chmod(0o755)
    monkeypatch.setenv("STOKER_SMARTCTL", str(fake))
    for fail in (0, 1):
        monkeypatch.setenv("FAKE_SMART_FAIL", str(fail))
        c = make_cluster("smart%d" % fail, targets=2)
        ch = wait_for("SMART figures", lambda: (lambda r: r[1] if r[1]["disks"][
            "verdict"] != "SKIP" else None)(doctor(c.cli, "--cluster", c.url, *P99, "--quick",
                                                   "--window", "0.2")), timeout=30)
        disks = ch["disks"]
        if not fail:
            assert disks["verdict"] == "OK", disks
            assert disks["text"].startswith("1 device pass SMART; most worn 3%"), disks
        else:
            assert disks["verdict"] == "FAIL", disks
            # one device under both targets: one finding
            assert len(disks["findings"]) == 1, disks
            assert re.match(r"device /dev/\S+ \(target \d+, node \d+\) fails its SMART health",
                            disks["text"]), disks
            assert "drain-node" in disks["fix"], disks
        c.stop()


MGMTD = ["--replicas", "3", "--heartbeat-timeout-ms", "3000"]


def metrics_addr(node):
    host, port = node.addr.rsplit(":", 1)
    return "%s:%d" % (host, int(port) + 10)


def test_stopped_node_and_mtu_in_netns(tmp_path):
    with net_cluster(tmp_path, mgmtd_args=MGMTD) as net:
        mg = net.nodes["mgmtd"]
        mg.argv += ["--metrics", metrics_addr(mg)]
        net.add_meta("meta1")
        for n in ("st1", "st2", "st3"):
            node = net.add_storage(n, targets=1)
            node.argv += ["--metrics", metrics_addr(node)]
        net.start_all()
        net.wait_serving()
        wait_for("a chain of three", lambda: re.search(r"^  1\s+\d+\s+\d+ \d+ \d+$",
                                                        net.status(), re.M))
        net.cli("put", "-", "/x", input=os.urandom(3 << 20))
        st3 = net.nodes["st3"]
        st3_ip = st3.addr.rsplit(":", 1)[0]

        rc, ch = doctor(net.cli, "--cluster", net.url, *P99, "--quick")
        v = verdicts(ch)
        assert rc == 0, ch
        for k in ("mgmtd", "nodes", "network", "tcp", "clock", "mtu", "capacity", "chains",
                  "versions"):
            assert v[k] == "OK", (k, ch[k])
        assert ch["chains"]["text"] == "1 chain of 3 replicas, all complete", ch["chains"]
        assert re.match(r"MTU 1500 towards 5 hosts; full-size frames reach each",
                        ch["mtu"]["text"]), ch["mtu"]
        assert re.match(r"5 daemons answer from this host", ch["network"]["text"]), ch

        # st3's side of its link takes less than the rest of the network
        ns_end = "sp" + net.links["st3"][2:]
        ip("-n", net.netns["st3"], "link", "set", "dev", ns_end, "mtu", "1400")
        rc, ch = doctor(net.cli, "--cluster", net.url, *P99, "--quick")
        mtu = ch["mtu"]
        assert mtu["verdict"] == "WARN", mtu
        assert mtu["text"] == ("frames of 1500 bytes (this host's MTU towards it) do not reach "
                               "%s, small ones do: an interface or switch on the way has a "
                               "smaller MTU" % st3_ip), mtu
        assert len(mtu["findings"]) == 1, mtu
        assert rc == 0, ch
        ip("-n", net.netns["st3"], "link", "set", "dev", ns_end, "mtu", "1500")

        # st3 stops: mgmtd marks it offline, this host cannot reach it, chains lack it
        net.kill("st3")
        wait_for("st3 offline", lambda: re.search(
            r"^  \d+\s+storage\s+offline\s+%s" % re.escape(st3.addr), net.status(), re.M))
        rc, ch = doctor(net.cli, "--cluster", net.url, *P99, "--quick")
        v = verdicts(ch)
        assert rc == 1, ch
        assert v["nodes"] == "FAIL", ch["nodes"]
        assert re.match(r"node (\d+) \(storage, %s\) is offline: no heartbeat reached mgmtd" %
                        re.escape(st3.addr), ch["nodes"]["text"]), ch["nodes"]
        node_id = int(re.match(r"node (\d+)", ch["nodes"]["text"]).group(1))
        assert "`stoker admin remove-node %d`" % node_id in ch["nodes"]["fix"], ch["nodes"]
        assert v["network"] == "FAIL", ch["network"]
        assert ch["network"]["text"].startswith(
            "node %d (storage, %s) does not answer from this host" % (node_id, st3.addr))
        assert v["chains"] == "WARN", ch["chains"]
        assert re.search(r"2 of 3 members working \(target \d+ on node %d offline\)" % node_id,
                         ch["chains"]["text"]), ch["chains"]
        assert v["mgmtd"] == "OK" and v["capacity"] == "OK", ch
