"""A change waits for its successor in the chain on the event loop, not in a thread.

Chain replication forwards every change from the head down the chain, and the head
answers once the tail has it. By default (STOKER_LOOP_WRITES=1, or unset) the
storage node sends that forward from its event loop (src/net/loopclient.c), writes
as well as truncates, punches and syncs, and its worker goes on to other requests,
so a slow successor costs the node no threads. Here the chain's tail is stopped
(SIGSTOP) for two seconds, well within mgmtd's heartbeat timeout, while 16 clients
write over files that were there: every truncate and write forward waits for it.
The nodes run 4 workers, and the head's and the middle's thread counts must not
grow by more than one (a write's own file steps run on workers; io_uring's kernel
workers, "iou-*", are not ours and are not counted). The
same run with STOKER_LOOP_WRITES=0 (each forward waits on its worker, and the pool
grows to stand in for waiting workers) shows the count the test tells apart. Every
file reads back and the three copies are byte-identical either way.
"""
import os
import signal
import subprocess
import threading
import time

from conftest import STOKER, needs_root, run
from netns import net_cluster
from test_replication import MGMTD, assert_replicas_identical, chain_of_three, tables

pytestmark = needs_root

WRITERS = 16


def threads(pid):
    """The process's threads, but io_uring's kernel workers."""
    n = 0
    for t in os.listdir("/proc/%d/task" % pid):
        try:
            with open("/proc/%d/task/%s/comm" % (pid, t)) as f:
                if not f.read().startswith("iou-"):
                    n += 1
        except OSError:
            pass
    return n


def ino_lock_slot(net, path):
    """The storage node's inode lock slot of path (ino_lock in src/storage/service.c)."""
    out = net.cli("stat", path).stdout.decode()
    ino = int(out.split("Inode:")[1].split()[0])
    return ((ino * 0x9E3779B97F4A7C15) % (1 << 64)) >> 56


def growth_while_the_tail_stops(tmp_path, loop_writes):
    """Threads the head and the middle gained while WRITERS writes waited for the tail."""
    with net_cluster(tmp_path, mgmtd_args=MGMTD) as net:
        def env():
            for name in ("st1", "st2", "st3"):
                n = net.nodes[name]
                # loop_writes None: the default, whatever this process's environment says
                switch = (["-u", "STOKER_LOOP_WRITES"] if loop_writes is None
                          else ["STOKER_LOOP_WRITES=" + loop_writes])
                n.argv = ["env"] + switch + ["STOKER_NET_WORKERS=4",
                                             "STOKER_NET_LOOPS=2"] + n.argv
        targets, chains = chain_of_three(net, before_start=env)
        members = list(chains.values())[0][1]
        # which node holds each member: its target folder is under the node's
        order = [next(n for n in ("st1", "st2", "st3")
                      if os.sep + n + os.sep in targets[t][1] + os.sep) for t in members]
        pids = [net.nodes[n].proc.pid for n in order[:2]]  # the head and the middle
        tail = net.nodes[order[2]].proc.pid
        src = os.path.join(net.dir, "src")
        os.makedirs(src)
        # there before: each put below truncates it first (STOR_TRUNCATE down the
        # chain), then writes. A truncate holds its inode's lock slot until the tail
        # has it, and a write of another inode of the same slot waits for it on a
        # worker, for which the pool stands in: that thread waits for a lock, not a
        # successor, so the files are ones of distinct slots.
        slots, tries = set(), 0
        for i in range(WRITERS):
            while True:
                tries += 1
                assert tries < 200, "no %d inodes of distinct lock slots" % WRITERS
                net.cli("put", "-", "/f%d" % i, input=os.urandom(64 << 10))
                slot = ino_lock_slot(net, "/f%d" % i)
                if slot not in slots:
                    slots.add(slot)
                    break
                net.cli("rm", "/f%d" % i)
            with open(os.path.join(src, "f%d" % i), "wb") as f:
                f.write(os.urandom(256 << 10))
        time.sleep(11)  # threads a start-up or the first requests grew have left
        idle = [threads(p) for p in pids]
        peak = list(idle)
        stop = threading.Event()

        def sample():
            while not stop.is_set():
                for i, p in enumerate(pids):
                    peak[i] = max(peak[i], threads(p))
                time.sleep(0.02)

        sampler = threading.Thread(target=sample)
        sampler.start()
        os.kill(tail, signal.SIGSTOP)
        try:
            procs = [subprocess.Popen(net.in_client([STOKER, "put", os.path.join(src, "f%d" % i),
                                                     "/f%d" % i]),
                                      env=net.env(), stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE)
                     for i in range(WRITERS)]
            time.sleep(2)
            os.kill(tail, signal.SIGCONT)
            for p in procs:
                out, err = p.communicate(timeout=300)
                assert p.returncode == 0, err.decode(errors="replace")
        finally:
            os.kill(tail, signal.SIGCONT)
            stop.set()
            sampler.join()
        for i in range(WRITERS):
            got = net.cli("cat", "/f%d" % i).stdout
            with open(os.path.join(src, "f%d" % i), "rb") as f:
                assert got == f.read(), "f%d reads back other bytes" % i
        time.sleep(1)
        targets, chains = tables(net.status())
        assert assert_replicas_identical(net, chains, targets) >= WRITERS
        return [pk - i for pk, i in zip(peak, idle)], idle


def test_a_write_waiting_for_its_successor_holds_no_thread(tmp_path):
    grown, idle = growth_while_the_tail_stops(tmp_path / "loop", None)  # the default
    # At most one: a write's own file steps run on workers (not its wait for the
    # successor), and one may find every idle worker busy and start another, as
    # CI saw once; writes that held a thread while they wait grow the pool by
    # several (the run on workers below: 4 or more).
    assert max(grown) <= 1, "threads grew by %s (idle %s) with forwards on the loop" % (
        grown, idle)
    grown0, idle0 = growth_while_the_tail_stops(tmp_path / "workers", "0")
    print("threads (head, middle) idle %s grew %s on the loop; idle %s grew %s on workers"
          % (idle, grown, idle0, grown0))
    # The head's pool grows to stand in for workers that wait on their forwards.
    assert max(grown0) >= 4, "threads grew by %s (idle %s) with forwards on workers" % (
        grown0, idle0)
