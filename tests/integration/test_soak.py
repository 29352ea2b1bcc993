"""A bounded fault soak: kills, restarts and link cuts under a verified workload.

Four storage nodes in network namespaces (netns.py), three copies of every chunk.
For STOKER_SOAK_S seconds (60 by default; scripts/soak.sh runs a long one), one
node at a time is hit by a random fault: SIGKILL and a restart, SIGSTOP and
SIGCONT (a node that hangs), or its link cut and healed. Meanwhile a writer
writes and fsyncs file after file and a reader reads files written before the
soak. Each fault is held a few seconds, past the heartbeat timeout half of the
time, and the next waits until every target serves again.

At the end: the writer never failed, every acknowledged file and every file of
before reads back whole, and every chain's copies are byte-identical. The seed
is printed (STOKER_SOAK_SEED replays one).
"""
import os
import random
import signal
import subprocess
import threading
import time

from conftest import CHECK, needs_root
from netns import net_cluster
from test_replication import replicas_identical_soon, tables, wait_for

pytestmark = needs_root

MGMTD = ["--replicas", "3", "--heartbeat-timeout-ms", "3000"]


def all_serving(net):
    t, c = tables(net.status())
    return (t, c) if t and c and all(s == "serving" for s, _ in t.values()) else None


def test_fault_soak(tmp_path):
    seconds = float(os.environ.get("STOKER_SOAK_S", "60"))
    seed = int(os.environ.get("STOKER_SOAK_SEED", str(random.randrange(1 << 30))))
    rnd = random.Random(seed)
    print("soak: %d s, seed %d" % (seconds, seed))
    with net_cluster(tmp_path, mgmtd_args=MGMTD) as net:
        net.add_meta("meta1")
        nodes = ["st1", "st2", "st3", "st4"]
        for n in nodes:
            net.add_storage(n, targets=1)
        net.start_all()
        net.wait_serving()
        wait_for("every target serving", lambda: all_serving(net))
        before = {}
        for i in range(6):
            before["/b%d" % i] = os.urandom(100_000 + 300_000 * i)
            net.cli("put", "-", "/b%d" % i, input=before["/b%d" % i])

        writer = subprocess.Popen(net.in_client([CHECK, "ackloop", net.url, "/ack", "256K"]),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        acks = []
        collector = threading.Thread(
            target=lambda: acks.extend(l.split() for l in writer.stdout
                                       if l.startswith(b"ACK ")), daemon=True)
        collector.start()
        stop = threading.Event()
        bad_reads = []

        def reader():
            while not stop.is_set():
                name = rnd.choice(sorted(before))
                p = net.cli("cat", name, check=False, timeout=120)
                if p.returncode != 0 or p.stdout != before[name]:
                    bad_reads.append((name, p.returncode, p.stderr.decode()[-500:]))
        r = threading.Thread(target=reader, daemon=True)
        r.start()

        faults = []
        end = time.time() + seconds
        try:
            while time.time() < end:
                victim = rnd.choice(nodes)
                kind = rnd.choice(["kill", "stop", "cut"])
                hold = rnd.uniform(1, 7)
                faults.append("%s %s %.1fs" % (kind, victim, hold))
                if kind == "kill":
                    net.kill(victim)
                elif kind == "stop":
                    net.nodes[victim].proc.send_signal(signal.SIGSTOP)
                else:
                    net.cut(victim)
                time.sleep(hold)
                if kind == "kill":
                    net.start(victim)
                elif kind == "stop":
                    net.nodes[victim].proc.send_signal(signal.SIGCONT)
                else:
                    net.heal(victim)
                wait_for("every target serving after " + faults[-1],
                         lambda: all_serving(net), timeout=120)
                assert writer.poll() is None, "the writer failed after %s: %s" % (
                    faults, writer.stderr.read().decode()[-2000:])
        finally:
            stop.set()
            for n in nodes:  # whatever the last fault was, undone
                net.heal(n)
                if net.nodes[n].running():
                    net.nodes[n].proc.send_signal(signal.SIGCONT)
        r.join(timeout=150)
        writer.send_signal(signal.SIGKILL)
        writer.wait()
        collector.join(timeout=10)
        print("soak: %d faults (%s), %d files acknowledged" % (len(faults), "; ".join(faults),
                                                                len(acks)))
        assert writer.returncode == -signal.SIGKILL, writer.stderr.read().decode()[-2000:]
        assert not bad_reads, bad_reads[:5]
        assert faults and acks

        targets, chains = wait_for("every target serving", lambda: all_serving(net))
        time.sleep(1)  # the writer was killed mid-file: its last change is through
        # a change a successor refused (the writer killed before it sent it again)
        # is sent on by the members that hold it, once the chain takes it
        assert replicas_identical_soon(net, chains, targets) >= 6
        listed = b"".join(b" ".join(a[1:]) + b"\n" for a in acks)
        p = subprocess.run(net.in_client([CHECK, "verifymany", net.url]), input=listed,
                           capture_output=True, timeout=600)
        assert p.returncode == 0, p.stdout.decode()[-2000:] + p.stderr.decode()[-2000:]
        for name, data in before.items():
            assert net.cli("cat", name).stdout == data
