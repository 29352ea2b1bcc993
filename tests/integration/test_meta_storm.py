"""A metadata storm on replicated metadata (issue 24; docs/meta-replication.md).

mgmtd, three meta nodes (`--meta-replicas 3`), two storage nodes and the clients
each run in a network namespace of their own (netns.py). Several clients, native
ones and one through a FUSE mount, make, rename (onto new names and over existing
files), unlink, mkdir/rmdir and hard-link (through the mount) names in folders of
their own (storm_worker.py) while:

1. the meta leader is killed with SIGKILL, a follower takes over, and the old
   leader is started again (it follows the new one and catches up);
2. a follower's link is cut (its sockets stay open; only timeouts tell), mgmtd
   drops it from the followers, and the link is healed (it rejoins and catches up).

Afterwards, with every replica in step, the namespace must be what each client's
model of its acknowledged operations predicts (an operation whose answer was lost
in a failover may have happened or not: the model allows both, and a create also
its file made without its bytes, since a retried exclusive create answers EEXIST;
never anything else), hard links must share their inode, and `stoker fsck` must
find nothing.

The clients go on until the faults are over (the storm always covers them). The
short form, one round of faults, takes under a minute; `scripts/meta-storm.sh`
runs the long one (STOKER_STORM_ROUNDS rounds).
"""
import json
import os
import subprocess
import sys
import time

from conftest import STOKER, have_fuse, needs_root
from netns import net_cluster

pytestmark = needs_root

HB_MS = 2000
ROUNDS = int(os.environ.get("STOKER_STORM_ROUNDS", "1"))
SECONDS = 120 + 60 * ROUNDS  # the clients' longest run: they stop when the faults are over
HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "storm_worker.py")
PY = os.path.join(os.path.dirname(os.path.dirname(HERE)), "build", "python")


def roles(net):
    """{meta address: role} from `stoker status`."""
    out, section = {}, False
    for line in net.status().splitlines():
        if line.strip().startswith("NODE") and "ROLE" in line:
            section = True
            continue
        f = line.split()
        if section and len(f) >= 4 and f[0].isdigit():
            out[f[3]] = (f[1], f[2])
        elif section and not line.startswith("    "):
            section = False
    return out


def wait(net, what, fn, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(0.3)
    raise AssertionError("timed out waiting for %s\n%s\n%s" % (what, net.status(), net.logs()))


def meta_named(net, role):
    r = roles(net)
    return [n for n, node in net.nodes.items()
            if node.role == "meta" and r.get(node.addr, ("", ""))[0] == role]


def full_shard(net):
    r = roles(net)
    return sorted(role for role, state in r.values() if state == "online") == \
        ["follower", "follower", "leader"]


def check_model(top, model, seen):
    """What a client's model allows against what a native client reads; problems, as text."""
    bad = []
    seen = dict(seen)

    def same(want, have):
        if want is None:
            return have is None
        return have is not None and have[0] == want[0] and (want[0] == "d" or have[1] == want[1])

    for name, want in model["certain"].items():
        have = seen.pop(name, None)
        if not same(want, have):
            bad.append("%s/%s: acknowledged %s, found %s" % (top, name, want, have))
    for alts in model["groups"]:
        names = sorted(set().union(*[set(a) for a in alts]))
        have = {n: seen.pop(n, None) for n in names}
        if not any(all(same(a.get(n), have[n]) for n in names) for a in alts):
            bad.append("%s: unanswered operation on %s: found %s, allowed %s" % (
                top, names, have, alts))
    for name, have in seen.items():
        bad.append("%s/%s: found %s, which no operation made" % (top, name, have))
    return bad


def test_meta_storm(tmp_path):
    with net_cluster(tmp_path, mgmtd_args=["--meta-replicas", "3",
                                           "--heartbeat-timeout-ms", str(HB_MS)]) as net:
        for m in ("meta1", "meta2", "meta3"):
            net.add_meta(m)
        net.add_storage("st1", targets=1)
        net.add_storage("st2", targets=1)
        net.start_all()
        net.wait_serving()
        wait(net, "three meta replicas", lambda: full_shard(net))

        env = dict(os.environ, STOKER_PY=PY)
        out = str(tmp_path / "models")
        os.makedirs(out)
        stop = str(tmp_path / "stop")
        clients, tops = [], []
        for i in range(2):
            top = "/native%d" % i
            tops.append(top)
            clients.append(subprocess.Popen(net.in_client(
                [sys.executable, WORKER, "--native", net.url, "--top", top,
                 "--seconds", str(SECONDS), "--stop", stop, "--seed", str(i),
                 "--out", os.path.join(out, top[1:] + ".json")]), env=env))
        if have_fuse():
            mnt, log = str(tmp_path / "mnt"), str(tmp_path / "mount.log")
            tops.append("/mounted")
            script = ('mkdir -p {m} && {stoker} mount {url} {m} -o log={log} || exit 1; '
                      'trap "{stoker} umount {m} || umount -l {m}" EXIT; '
                      '{py} {w} --mount {m} --top /mounted --seconds {s} --stop {stop} '
                      '--seed 9 --out {o}').format(m=mnt, stoker=STOKER, url=net.url, log=log,
                                                   py=sys.executable, w=WORKER, s=SECONDS,
                                                   stop=stop,
                                                   o=os.path.join(out, "mounted.json"))
            clients.append(subprocess.Popen(net.in_client(["sh", "-c", script]), env=env))
        try:
            new = None
            for _ in range(ROUNDS):
                time.sleep(3)
                # 1. the leader killed (-9), a follower promoted, the old one back as follower
                old = meta_named(net, "leader")[0]
                net.kill(old)
                new = wait(net, "a new leader",
                           lambda: [n for n in meta_named(net, "leader") if n != old])[0]
                net.start(old)
                wait(net, "the old leader following",
                     lambda: old in meta_named(net, "follower"))
                # 2. a follower cut off, dropped by mgmtd, healed, back in the shard
                cut = meta_named(net, "follower")[0]
                net.cut(cut)
                wait(net, "the cut follower dropped",
                     lambda: roles(net).get(net.nodes[cut].addr, ("", ""))[1] == "offline")
                time.sleep(1)
                net.heal(cut)
                wait(net, "the healed follower back", lambda: full_shard(net))
                assert meta_named(net, "leader") == [new]
            time.sleep(2)
            assert all(p.poll() is None for p in clients), "a client ended before the faults"
        finally:
            open(stop, "w").close()  # also when a fault failed: the mount goes with its client
            for p in clients:
                try:
                    p.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        assert all(p.returncode == 0 for p in clients), [p.returncode for p in clients]

        # every replica holds the same change, then what a client reads is the model's
        def in_step():
            st = net.status()
            lines = [l.split() for l in st.splitlines()]
            behind = [f[-1] for f in lines if len(f) == 6 and f[1] == "follower"]
            return full_shard(net) and len(behind) == 2 and behind == ["0", "0"]
        wait(net, "replicas in step", in_step)
        seen_file = str(tmp_path / "seen.json")
        p = subprocess.run(net.in_client([sys.executable, WORKER, "--dump", net.url,
                                          "--top", ",".join(tops), "--out", seen_file]),
                           env=env, capture_output=True, timeout=120)
        assert p.returncode == 0, p.stderr.decode(errors="replace")
        with open(seen_file) as f:
            seen = json.load(f)
        bad, done, failed = [], 0, []
        for top in tops:
            with open(os.path.join(out, top[1:] + ".json")) as f:
                model = json.load(f)
            done += model["done"]
            failed += model["failed"]
            assert not [x for x in model["failed"] if x[2].startswith("unexpected")], model
            bad += check_model(top, model, seen[top])
            for names in model["links"]:
                inos = {seen[top][n][2] for n in names if n in seen[top]}
                if len(inos) > 1:
                    bad.append("%s: hard links %s on inodes %s" % (top, names, inos))
        print("storm: %d operations answered, %d not (%s); tops %s" % (
            done, len(failed), sorted({x[0] + ": " + x[2] for x in failed})[:8], tops))
        assert not bad, "\n".join(bad[:30])
        # the storm did happen, and most of it was answered
        assert done > 200, done
        assert len(failed) <= done // 10, failed
        p = net.cli("fsck", "--json", check=False, timeout=300)
        assert p.returncode == 0, p.stdout.decode(errors="replace") + p.stderr.decode()
        assert json.loads(p.stdout)["clean"], p.stdout.decode()
