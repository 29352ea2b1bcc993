"""Nodes on hosts of their own: one network namespace per node, joined by veth pairs
to a bridge, so that a test can cut one node's link and heal it.

    net = NetCluster(tmp_path)        # the bridge and the client's namespace
    net.add_meta("meta1")
    net.add_storage("st1"); net.add_storage("st2")
    net.start_all(); net.wait_serving()
    net.cli("put", "-", "/x", input=b"...")   # a client in a namespace of its own
    net.cut("st2")                    # its link down: nobody reaches it, it reaches nobody
    net.heal("st2")
    net.close()                       # always (the fixture does): processes, namespaces,
                                      # veth pairs and the bridge go

Every namespace holds only its loopback and its end of a veth pair, with an address
on a /24 of 10.0.0.0/8 drawn at random per cluster; the bridge in this machine's own
namespace has no address. So traffic goes only between the namespaces the test made:
nothing reaches the machine's own network, and nothing here is reached from it.
Each node is `stoker ROLE` run through `ip netns exec`, from RoleCluster (roles.py):
the same arguments, logs and checks, on the node's own address. A node's host id
defaults to its namespace (src/common/host.c), so the client, in a namespace of its
own, never reads a node's chunk files from the disk.

Names are short (interface names have 15 bytes): `stkb<tag>` for the bridge,
`stk<tag>-<name>` for a namespace, `sv<tag><n>` for a node's end of its pair on the
bridge. Needs root.
"""
import contextlib
import os
import random
import re
import subprocess

from conftest import CHECK, STOKER, run
from roles import RoleCluster


# `ip netns exec` gives the command a mount namespace of its own, a copy of this
# one: with the FUSE mounts other tests hold at that moment. The copy keeps each
# one's file system alive after its test unmounts it here, so its mount daemon
# would not exit until the command does (our mounts are private: the unmount does
# not reach the copy). So the command first drops the copies, in its namespace only.
DROP_FUSE = ('findmnt -rn -o TARGET,FSTYPE | while read -r m t; do case "$t" in fuse*) '
             'umount -l "$m" 2>/dev/null;; esac; done; exec "$@"')


def netns_exec(ns, argv):
    """argv run in network namespace ns, without other tests' FUSE mounts."""
    return ["ip", "netns", "exec", ns, "sh", "-c", DROP_FUSE, "sh"] + list(argv)


def ip(*args, check=True):
    return run(["ip"] + list(args), check=check, timeout=30)


class NetCluster(RoleCluster):
    def __init__(self, tmp_path, port=9500, mgmtd_args=()):
        self.tag = "%05x" % random.randrange(1 << 20)
        self.subnet = "10.%d.%d" % (random.randrange(100, 200), random.randrange(256))
        self.bridge = "stkb" + self.tag
        self.netns = {}  # node name -> namespace
        self.links = {}  # node name -> its veth end on the bridge
        self._host = 1
        try:
            ip("link", "add", self.bridge, "type", "bridge")
            ip("link", "set", self.bridge, "up")
            # Namespaces have ports of their own: every node may use the same one.
            # RoleCluster's constructor adds mgmtd, in a namespace of its own (_add).
            super().__init__(tmp_path, port=port, mgmtd_args=mgmtd_args)
            os.makedirs(self.dir, exist_ok=True)
            self._namespace("client")
        except Exception:
            self.close()
            raise

    def _namespace(self, name):
        """A namespace for name, on the bridge, with an address of its own (returned)."""
        ns = "stk%s-%s" % (self.tag, name)
        n = len(self.netns)
        host_end, ns_end = "sv%s%d" % (self.tag, n), "sp%s%d" % (self.tag, n)
        self.netns[name] = ns
        ip("netns", "add", ns)
        ip("link", "add", host_end, "type", "veth", "peer", "name", ns_end)
        self.links[name] = host_end
        ip("link", "set", ns_end, "netns", ns)
        ip("link", "set", host_end, "master", self.bridge)
        ip("link", "set", host_end, "up")
        self._host += 1
        addr = "%s.%d" % (self.subnet, self._host)
        ip("-n", ns, "addr", "add", addr + "/24", "dev", ns_end)
        ip("-n", ns, "link", "set", ns_end, "up")
        ip("-n", ns, "link", "set", "lo", "up")
        return addr

    # RoleCluster gives each node 127.0.0.N; here each gets a namespace instead.
    def _ip(self):
        raise AssertionError("NetCluster places nodes by name")

    def _add(self, name, role, ipaddr, extra):
        addr = self._namespace(name)
        if name == "mgmtd":
            self.mgmtd_addr = "%s:%d" % (addr, self.port)
            self.url = "stk://" + self.mgmtd_addr
        node = super()._add(name, role, addr, extra)
        node.argv = netns_exec(self.netns[name], node.argv)
        return node

    def add_meta(self, name, ip=None):
        return self._add(name, "meta", None, [])

    def add_storage(self, name, targets=2, ip=None):
        tdirs = [os.path.join(self.dir, name, "t%d" % i) for i in range(targets)]
        extra = []
        for t in tdirs:
            extra += ["--target", t]
        node = self._add(name, "storage", None, extra)
        node.targets = tdirs
        return node

    def cut(self, name):
        """name's link to the bridge goes down: its packets go nowhere, both ways."""
        ip("link", "set", self.links[name], "down")

    def heal(self, name):
        ip("link", "set", self.links[name], "up")

    def in_client(self, argv):
        return netns_exec(self.netns["client"], argv)

    def status(self):
        return run(self.in_client([STOKER, "status", "--cluster", self.url]),
                   check=False).stdout.decode()

    def cli(self, *args, check=True, input=None, timeout=300, env=None):
        return run(self.in_client([STOKER] + list(args)), check=check, input=input,
                   timeout=timeout, env=dict(self.env(), **(env or {})))

    def check(self, *args, check=True, timeout=600):
        return run(self.in_client([CHECK, args[0], self.url] + list(args[1:])), check=check,
                   timeout=timeout)

    def close(self):
        """Stops every node and removes every namespace, veth pair and the bridge; safe
        to call more than once, and after a failed set-up."""
        try:
            if getattr(self, "nodes", None):
                self.stop_all()
        finally:
            for ns in list(self.netns.values()):
                ip("netns", "del", ns, check=False)  # takes its veth pair with it
            self.netns.clear()
            for link in list(self.links.values()):
                ip("link", "del", link, check=False)
            self.links.clear()
            ip("link", "del", self.bridge, check=False)


@contextlib.contextmanager
def net_cluster(tmp_path, **kw):
    """A NetCluster for one test: always closed; then no sanitizer report in its logs
    and none of its namespaces or links left behind."""
    c = NetCluster(tmp_path / "net", **kw)
    try:
        yield c
    finally:
        c.close()
    assert not c.sanitizer_reports(), c.logs()
    left = [n for n in leftovers() if c.tag in n]
    assert not left, left


def leftovers():
    """Namespaces and links this module makes that exist now (for a test's last check)."""
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True).stdout.decode()
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True).stdout.decode()
    mine = re.compile(r"^(stk[0-9a-f]{5}-|stkb[0-9a-f]{5}$|s[vp][0-9a-f]{5}\d+$)")
    names = [l.split()[0] for l in ns.splitlines() if l.strip()] + \
        [l.split(":")[1].strip().split("@")[0] for l in links.splitlines()]
    return [n for n in names if mine.match(n)]
