"""A cluster started role by role, as on separate hosts: one mgmtd, meta and storage
nodes each a process of its own on its own loopback address (127.0.0.1, .2, .3...),
each killed and restarted alone. For fault tests that `stoker up` (one supervisor
that restarts what dies) cannot stage.

    rc = RoleCluster(tmp_path)
    rc.add_meta("meta1")
    rc.add_storage("st1", targets=2)
    rc.add_storage("st2", targets=2)
    rc.start_all()
    rc.wait_serving()
    rc.cli("put", "-", "/x", input=b"...")
    rc.kill("st1")            # SIGKILL, no restart
    rc.start("st1")           # same data, same address
    rc.stop_all()             # in teardown

mgmtd_args go to mgmtd (e.g. ["--replicas", "3", "--heartbeat-timeout-ms", "3000"]).

Every node of a test listens on the same port (its own address tells nodes apart);
mgmtd is 127.0.0.1:PORT. Logs go to DIR/NAME.log. Each meta and storage node gets a
host id of its own (`--host-id roles-NAME`), so that it stands for a host of its own
and the test's clients (this machine's host id) never read its chunk files from
disk: a killed storage node is really gone for them. Append another `--host-id` to
node.argv before starting it to choose one.
"""
import os
import signal
import subprocess
import time

from conftest import STOKER, CHECK, pick_ports, run, tls_args


class Node:
    def __init__(self, name, role, addr, argv, log):
        self.name = name
        self.role = role
        self.addr = addr
        self.argv = argv
        self.log = log
        self.proc = None

    def running(self):
        return self.proc is not None and self.proc.poll() is None


class RoleCluster:
    def __init__(self, tmp_path, port=None, mgmtd_args=()):
        self.dir = str(tmp_path)
        self.port = port or pick_ports()
        self.mgmtd_addr = "127.0.0.1:%d" % self.port
        self.url = "stk://" + self.mgmtd_addr
        self.nodes = {}
        self._next_ip = 2
        self._add("mgmtd", "mgmtd", "127.0.0.1", list(mgmtd_args))

    def _add(self, name, role, ip, extra):
        addr = "%s:%d" % (ip, self.port)
        data = os.path.join(self.dir, name)
        argv = [STOKER, role, "--listen", addr, "--data", data] + tls_args()
        if role != "mgmtd":
            argv += ["--mgmtd", self.mgmtd_addr, "--host-id", "roles-" + name]
        node = Node(name, role, addr, argv + extra, os.path.join(self.dir, name + ".log"))
        node.data = data
        self.nodes[name] = node
        return node

    def _ip(self):
        ip = "127.0.0.%d" % self._next_ip
        self._next_ip += 1
        return ip

    def add_meta(self, name, ip=None):
        return self._add(name, "meta", ip or self._ip(), [])

    def add_storage(self, name, targets=2, ip=None):
        tdirs = [os.path.join(self.dir, name, "t%d" % i) for i in range(targets)]
        extra = []
        for t in tdirs:
            extra += ["--target", t]
        node = self._add(name, "storage", ip or self._ip(), extra)
        node.targets = tdirs
        return node

    def start(self, name):
        node = self.nodes[name]
        assert not node.running(), "%s is running already" % name
        log = open(node.log, "a")
        node.proc = subprocess.Popen(node.argv, stdout=log, stderr=log)
        log.close()
        return node

    def start_all(self):
        self.start("mgmtd")
        for name, node in self.nodes.items():
            if name != "mgmtd":
                self.start(name)

    def kill(self, name, sig=signal.SIGKILL):
        node = self.nodes[name]
        if node.running():
            node.proc.send_signal(sig)
            node.proc.wait(timeout=30)

    def stop_all(self):
        for node in reversed(list(self.nodes.values())):
            if node.running():
                node.proc.terminate()
        for node in self.nodes.values():
            if node.proc is not None:
                try:
                    node.proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    node.proc.kill()
                    node.proc.wait()

    def status(self):
        return run([STOKER, "status", "--cluster", self.url], check=False).stdout.decode()

    def wait_serving(self, timeout=30):
        """Until every storage target started here serves and shard 1 has a meta node."""
        want = sum(len(n.targets) for n in self.nodes.values()
                   if n.role == "storage" and n.running())
        deadline = time.time() + timeout
        out = ""
        while time.time() < deadline:
            out = self.status()
            if out.count("serving") >= want and "Metadata shards\n  SHARD  META NODE\n  1" in out:
                # Meta learns the new routing table at its next heartbeat (each
                # second): until then it places new files on the chains it knew.
                time.sleep(1.5)
                return out
            time.sleep(0.2)
        raise AssertionError("role cluster did not come up:\n%s\n%s" % (out, self.logs()))

    def env(self):
        return dict(os.environ, STOKER_CLUSTER=self.url)

    def cli(self, *args, check=True, input=None, timeout=300):
        return run([STOKER] + list(args), check=check, input=input, timeout=timeout,
                   env=self.env())

    def check(self, *args, check=True, timeout=600):
        return run([CHECK, args[0], self.url] + list(args[1:]), check=check, timeout=timeout)

    def logs(self):
        out = []
        for node in self.nodes.values():
            if os.path.exists(node.log):
                with open(node.log, errors="replace") as f:
                    out.append("--- %s ---\n%s" % (node.name, f.read()[-4000:]))
        return "\n".join(out)

    def sanitizer_reports(self):
        bad = []
        for node in self.nodes.values():
            if os.path.exists(node.log):
                with open(node.log, errors="replace") as f:
                    for line in f:
                        if "ERROR: AddressSanitizer" in line or "runtime error:" in line:
                            bad.append("%s: %s" % (node.name, line.strip()))
        return bad
