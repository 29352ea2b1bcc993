"""The control plane in cluster mode: mgmtd's state in etcd, a leader elected
through an etcd lease, nodes and clients that follow it.

`stoker up --nodes 2` starts a real etcd and three mgmtd beside meta and two
storage nodes. The tests kill the leading mgmtd with SIGKILL (alone, and while a
storage node restarts) and check that another one leads within seconds, that
`stoker status` and new files (which need routing) work, that old data reads back,
and that the killed mgmtd, restarted by `up`, follows. Every cluster is stopped
(`stoker down`) whatever happens, and no process of it may be left.
"""
import os
import time

from conftest import STOKER, pick_ports, run


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


class HA:
    def __init__(self, tmp_path, nodes=2):
        self.port = pick_ports()
        self.data = str(tmp_path / "stk")
        self.mgmtd = ["127.0.0.1:%d" % self.port] + \
            ["127.0.0.1:%d" % (self.port + 15 + k) for k in (1, 2)]
        self.env = dict(os.environ, STOKER_CLUSTER="stk://" + ",".join(self.mgmtd))
        self.nodes = nodes

    def up(self):
        p = run([STOKER, "up", "--data", self.data, "--daemon", "--port", str(self.port),
                 "--nodes", str(self.nodes), "--targets", "2"], check=False, timeout=120)
        assert p.returncode == 0, p.stderr.decode() + self.logs()
        return p.stdout.decode()

    def down(self):
        run([STOKER, "down", "--data", self.data], check=False, timeout=150)
        deadline = time.time() + 10
        while time.time() < deadline:
            left = [pid for pid, argv in cmdlines() if self.data.encode() in argv]
            if not left:
                return
            time.sleep(0.2)
        raise AssertionError("left running: %s" % left)

    def logs(self):
        out = []
        logdir = os.path.join(self.data, "log")
        if os.path.isdir(logdir):
            for name in sorted(os.listdir(logdir)):
                with open(os.path.join(logdir, name), errors="replace") as f:
                    out.append("--- %s ---\n%s" % (name, f.read()[-3000:]))
        return "\n".join(out)

    def cli(self, *args, check=True):
        return run([STOKER] + list(args), check=check, env=self.env, timeout=120)

    def mgmtd_states(self):
        """{address: "leader" | "follower" | "down"} from `stoker status`, or None."""
        p = self.cli("status", check=False)
        if p.returncode != 0:
            return None
        states, on = {}, False
        for line in p.stdout.decode().splitlines():
            if line.startswith("Mgmtd"):
                on = True
            elif on and not line.strip():
                break
            elif on and "ADDRESS" not in line:
                addr, state = line.split()
                states[addr] = state
        return states

    def leader(self, timeout=20, not_=None):
        deadline = time.time() + timeout
        while time.time() < deadline:
            st = self.mgmtd_states()
            if st:
                leaders = [a for a, s in st.items() if s == "leader"]
                if len(leaders) == 1 and leaders[0] != not_:
                    return leaders[0]
            time.sleep(0.3)
        raise AssertionError("no mgmtd leads: %s\n%s" % (self.mgmtd_states(), self.logs()))

    def leader_after(self, killed, timeout=15):
        """The address of the mgmtd that leads once pid `killed` is gone: a leader
        whose process is not that one (a restarted mgmtd at its address may win)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            st = self.mgmtd_states()
            leaders = [a for a, s in (st or {}).items() if s == "leader"]
            if len(leaders) == 1:
                try:
                    if self.pid_of("--listen\0" + leaders[0], "mgmtd") != killed:
                        return leaders[0]
                except AssertionError:
                    pass  # between the kill and the restart
            time.sleep(0.3)
        raise AssertionError("no mgmtd leads: %s\n%s" % (self.mgmtd_states(), self.logs()))

    def pid_of(self, argv_part, role):
        pids = [pid for pid, argv in cmdlines()
                if argv_part.encode() in argv and self.data.encode() in argv and
                argv.split(b"\0")[1:2] == [role.encode()]]
        assert len(pids) == 1, (argv_part, pids)
        return pids[0]

    def wait_state(self, addr, want, timeout=30):
        deadline = time.time() + timeout
        while time.time() < deadline:
            st = self.mgmtd_states()
            if st and st.get(addr) == want:
                return
            time.sleep(0.3)
        raise AssertionError("%s is not %s: %s" % (addr, want, self.mgmtd_states()))


def put_get(ha, tmp_path, name, size=3 << 20):
    src = tmp_path / (name + ".in")
    src.write_bytes(os.urandom(size))
    ha.cli("put", str(src), "/" + name)
    return src


def read_back(ha, tmp_path, name, src, timeout=30):
    out = tmp_path / (name + ".out")
    deadline = time.time() + timeout
    while True:
        p = ha.cli("get", "/" + name, str(out), check=False)
        if p.returncode == 0 and out.read_bytes() == src.read_bytes():
            return
        if time.time() > deadline:
            raise AssertionError("cannot read /%s back: %s\n%s" % (name, p.stderr, ha.logs()))
        time.sleep(0.5)


def test_leader_killed(tmp_path):
    ha = HA(tmp_path)
    try:
        out = ha.up()
        assert "over etcd" in out and ",".join(ha.mgmtd) in out, out
        assert os.path.isdir(os.path.join(ha.data, "etcd"))
        first = ha.leader()
        st = ha.mgmtd_states()
        assert sorted(st) == sorted(ha.mgmtd), st
        assert sorted(st.values()) == ["follower", "follower", "leader"], st
        old = put_get(ha, tmp_path, "old")

        # `up` restarts the killed mgmtd at once, and it may win the next election
        # itself (a third of the time); kill the leader again until another one
        # takes over.
        for _ in range(8):
            killed = ha.pid_of("--listen\0" + first, "mgmtd")
            os.kill(killed, 9)
            t0 = time.time()
            second = ha.leader_after(killed, timeout=15)
            assert time.time() - t0 < 15
            if second != first:
                break
            first = second
        assert second != first
        # routing works through the new leader: a new file, and the old one reads back
        new = put_get(ha, tmp_path, "new")
        read_back(ha, tmp_path, "new", new)
        read_back(ha, tmp_path, "old", old)
        # the killed one is restarted by `up` and follows
        ha.wait_state(first, "follower")
        # a client that names only that follower is sent to the leader
        p = run([STOKER, "get", "/old", str(tmp_path / "via-follower")],
                env=dict(os.environ, STOKER_CLUSTER="stk://" + first), timeout=60)
        assert (tmp_path / "via-follower").read_bytes() == old.read_bytes()
        assert "mgmtd" in open(os.path.join(ha.data, "log", "up.log")).read()
    finally:
        ha.down()


def test_leader_killed_while_storage_restarts(tmp_path):
    """The leading mgmtd and a storage node die together: the node, restarted by
    `up`, registers with the new leader, its targets serve again and every file
    reads back."""
    ha = HA(tmp_path)
    try:
        ha.up()
        first = ha.leader()
        old = put_get(ha, tmp_path, "old", size=8 << 20)
        storage = ha.pid_of("127.0.0.3:%d" % (ha.port + 2), "storage")
        killed = ha.pid_of("--listen\0" + first, "mgmtd")
        os.kill(killed, 9)
        os.kill(storage, 9)
        ha.leader_after(killed, timeout=15)
        deadline = time.time() + 40
        while time.time() < deadline:
            st = ha.cli("status", check=False).stdout.decode()
            if st.count(" serving ") == 4 and st.count(" online ") == 3:
                break
            time.sleep(0.5)
        assert st.count(" serving ") == 4 and st.count(" online ") == 3, st + ha.logs()
        read_back(ha, tmp_path, "old", old)
        new = put_get(ha, tmp_path, "new")
        read_back(ha, tmp_path, "new", new)
    finally:
        ha.down()


def test_state_survives_every_mgmtd_restart(tmp_path):
    """The state lives in etcd, not in any mgmtd: with all three mgmtd killed at once
    (and restarted by `up`), the cluster comes back with its nodes and files."""
    ha = HA(tmp_path)
    try:
        ha.up()
        ha.leader()
        old = put_get(ha, tmp_path, "old")
        before = ha.cli("status").stdout.decode()
        for addr in ha.mgmtd:
            os.kill(ha.pid_of("--listen\0" + addr, "mgmtd"), 9)
        ha.leader(timeout=30)
        after = ha.cli("status").stdout.decode()
        for line in before.splitlines():
            if line.strip().startswith(("1 ", "2 ", "3 ")) and "/targets/" in line:
                assert line.split()[-1] in after, (before, after)
        read_back(ha, tmp_path, "old", old)
    finally:
        ha.down()


def test_up_without_nodes_has_no_etcd(tmp_path):
    """Plain `stoker up` keeps the embedded mgmtd with its local file: no etcd."""
    port = pick_ports()
    data = str(tmp_path / "stk")
    env = dict(os.environ, STOKER_CLUSTER="stk://127.0.0.1:%d" % port)
    p = run([STOKER, "up", "--data", data, "--daemon", "--port", str(port), "--targets", "1"],
            check=False, timeout=120)
    try:
        assert p.returncode == 0, p.stderr
        assert b"over etcd" not in p.stdout
        assert not os.path.exists(os.path.join(data, "etcd"))
        assert os.path.exists(os.path.join(data, "mgmtd", "mgmtd.state"))
        st = run([STOKER, "status"], env=env).stdout.decode()
        assert "127.0.0.1:%d        leader" % port in st, st
    finally:
        run([STOKER, "down", "--data", data], check=False, timeout=150)
