"""Fixtures for Stoker's integration tests: real clusters of real processes.

Every test that needs a cluster gets one started with `stoker up --daemon` in a
temporary folder, on its own ports, and stopped (`stoker down`) afterwards. The
binaries come from $STOKER_BUILD (default: build/ at the repository root), so the
same tests run against the sanitizer build with STOKER_BUILD=build-asan.

STOKER_TEST_TLS=1 runs them with TLS on every connection (docs/security.md): one
key for the session (TLS_KEY), given to every `stoker up` cluster as its
cluster.key and to every role daemon with --key-file and --tls on, and to the
tests' clients through STOKER_KEY_FILE and STOKER_TLS=1. Tests marked
`plaintext_wire` (they speak the wire protocol in plaintext themselves, or test
the key handshake TLS replaces) are skipped then.
"""
import errno
import getpass
import os
import random
import shutil
import signal
import socket
import subprocess
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.join(ROOT, os.environ.get("STOKER_BUILD", "build"))
STOKER = os.path.join(BUILD, "stoker")
CHECK = os.path.join(BUILD, "tests", "stk_check")
TLS = os.environ.get("STOKER_TEST_TLS") == "1"
TLS_KEY = "/tmp/stoker-test-tls-%d.key" % os.getuid()
# STOKER_TEST_META_SHARDS=S: every `stoker up` cluster of the Cluster fixtures runs S
# metadata shards (docs/meta-shards.md), so that a suite checks nothing changed with
# several (test_mount_posix.py is run so in test_meta_shards.py).
META_SHARDS = int(os.environ.get("STOKER_TEST_META_SHARDS", "1") or 1)
# STOKER_TEST_MOUNT_SHARD=K (with K <= STOKER_TEST_META_SHARDS): each Cluster fixture
# makes a folder /on-shard-K placed on shard K (`stoker shard pin`), its mounts
# mount that folder and its cli's absolute paths (but local files') point into it,
# so that test_mount_posix.py runs on shard K's inodes alone (docs/meta-shards.md).
# Shards 2.. lease as shard 1 does (test_mount.py counts every shard's requests);
# suites that rely on delegations or allowances (write-behind, quota allowances) do
# not apply: shards 2.. grant none yet.
MOUNT_SHARD = int(os.environ.get("STOKER_TEST_MOUNT_SHARD", "0") or 0)


def tls_setup():
    """TLS mode: the session's key (made once, shared by pytest's workers) and the
    clients' environment."""
    if not os.path.exists(TLS_KEY):
        subprocess.run([STOKER, "admin", "init", "--key", TLS_KEY], capture_output=True)
    assert os.path.exists(TLS_KEY), "cannot make " + TLS_KEY
    os.environ["STOKER_KEY_FILE"] = TLS_KEY
    os.environ["STOKER_TLS"] = "1"


def tls_args():
    """What a role daemon is given in TLS mode: the session's key and --tls on."""
    return ["--key-file", TLS_KEY, "--tls", "on"] if TLS else []


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "serial: times something against the clock, or relies on what is one per "
        "machine (the default cluster); scripts/test.sh runs these one at a time after the "
        "others, not beside them")
    config.addinivalue_line(
        "markers", "plaintext_wire: speaks the wire protocol in plaintext itself (raw frames, "
        "stk_connscale) or tests the key handshake: skipped with STOKER_TEST_TLS=1")
    if not hasattr(config, "workerinput"):
        drop_dead_test_mounts()
    if TLS:
        tls_setup()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.when == "call":
        item.stk_passed = rep.passed


@pytest.fixture(autouse=True)
def drop_data_of_passed_tests(request, tmp_path):
    """A test that passed leaves no data behind: its tmp_path (clusters' chunks can
    reach gigabytes in seconds) is removed once every other fixture of the test
    is torn down, unless something is still mounted below it. A failed test's
    folder stays for the post-mortem."""
    yield
    if not getattr(request.node, "stk_passed", False):
        return
    top = str(tmp_path) + "/"
    try:
        with open("/proc/self/mounts") as f:
            if any(l.split()[1].startswith(top) for l in f if len(l.split()) > 1):
                return
    except OSError:
        return
    shutil.rmtree(tmp_path, ignore_errors=True)


def drop_dead_test_mounts():
    """Lazily unmounts the Stoker mounts an earlier, killed test run left in pytest's
    temporary folders with no daemon behind them: `stoker doctor` rightly fails such a
    mount, and pytest cannot remove a folder holding one. Only mounts below
    /tmp/pytest-of-USER whose stat fails with ENOTCONN are touched."""
    top = "/tmp/pytest-of-%s/" % getpass.getuser()
    try:
        with open("/proc/self/mounts") as f:
            lines = f.read().splitlines()
    except OSError:
        return
    for l in lines:
        f = l.split()
        if len(f) < 3 or f[2] != "fuse.stoker":
            continue
        mp = f[1].replace("\\040", " ")
        if not mp.startswith(top):
            continue
        try:
            os.stat(mp)
        except OSError as e:
            if e.errno == errno.ENOTCONN:
                subprocess.run(["umount", "-l", mp], check=False, capture_output=True)


def port_free(port):
    # BASE..BASE+2 for the daemons, BASE+10..BASE+12 for their metrics (`stoker up`),
    # BASE+13 for the S3 gateway's (`--s3`), BASE+14 for a mount's, BASE+15 and
    # BASE+19 for the NFS and SMB gateways' (`--nfs`, `--smb`); with --nodes,
    # BASE+16..BASE+18 for the other mgmtd, BASE+26..BASE+28 for their metrics,
    # BASE+30 and BASE+31 for etcd; with --meta-shards, BASE+40..BASE+42 for shards 2..4's
    # meta nodes and BASE+50..BASE+52 for their metrics
    for p in (port, port + 1, port + 2, port + 10, port + 11, port + 12, port + 13, port + 14,
              port + 15, port + 16, port + 17, port + 18, port + 19, port + 26, port + 27,
              port + 28, port + 30, port + 31, port + 40, port + 41, port + 42, port + 50,
              port + 51, port + 52):
        s = socket.socket()
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", p))
        except OSError:
            return False
        finally:
            s.close()
    return True


def port_range():
    """Where tests take their ports: outside the kernel's range for the local ends of
    outgoing connections, which could take a port between the check here and a
    daemon's bind (then `stoker up` fails: address in use)."""
    lo, hi = 20000, 60000
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            elo, ehi = map(int, f.read().split())
        if elo - 100 - 12000 >= 6000:
            lo, hi = 12000, elo - 100
        elif 65000 - (ehi + 100) >= 6000:
            lo, hi = ehi + 100, 65000
    except (OSError, ValueError):
        pass
    return lo, hi


def pick_ports():
    # Under pytest-xdist (scripts/test.sh runs tests in parallel) each worker draws
    # from its own band, so that two workers never pick overlapping ports between a
    # check here and their daemons binding them.
    lo, hi = port_range()
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    if worker.startswith("gw") and worker[2:].isdigit() and count > 1:
        band = (hi - lo) // count
        lo += int(worker[2:]) % count * band
        hi = lo + band - 60  # room for base+52 (shard 4's metrics) and neighbours
    for _ in range(200):
        base = random.randrange(lo, hi, 3)
        # Not near one handed out already: its daemons may not have bound it yet.
        if any(abs(base - g) < 54 for g in _given):
            continue
        if port_free(base):
            _given.append(base)
            del _given[:-64]
            return base
    raise RuntimeError("no free ports")


_given = []


def pytest_collection_modifyitems(config, items):
    if TLS:
        skip = pytest.mark.skip(reason="speaks plaintext itself: not with STOKER_TEST_TLS=1")
        for item in items:
            if "plaintext_wire" in item.keywords:
                item.add_marker(skip)


def free_port():
    """One free port for a daemon of a test's own, drawn as pick_ports draws."""
    return pick_ports()


def run(args, check=True, input=None, timeout=300, env=None):
    p = subprocess.run(args, input=input, capture_output=True, timeout=timeout, env=env)
    if check and p.returncode != 0:
        raise AssertionError(
            "%s exited %d\nstdout: %s\nstderr: %s"
            % (" ".join(map(str, args)), p.returncode, p.stdout.decode(errors="replace")[-3000:],
               p.stderr.decode(errors="replace")[-3000:]))
    return p


class Cluster:
    def __init__(self, data, port, targets=4):
        self.data = str(data)
        self.port = port
        self.targets = targets
        self.addr = "127.0.0.1:%d" % port
        self.url = "stk://" + self.addr
        self.up_proc = None
        self.sub = ""  # the folder its mounts and cli paths are in (MOUNT_SHARD)

    def start(self):
        extra = []
        if TLS:
            # the session's key as this cluster's, so that the tests' clients hold it
            os.makedirs(self.data, exist_ok=True)
            if not os.path.exists(self.key_file):
                shutil.copyfile(TLS_KEY, self.key_file)
                os.chmod(self.key_file, 0o600)
            extra = ["--tls"]
        if META_SHARDS > 1:
            extra += ["--meta-shards", str(META_SHARDS)]
        p = run([STOKER, "up", "--data", self.data, "--daemon", "--port", str(self.port),
                 "--targets", str(self.targets)] + extra, check=False, timeout=120)
        if p.returncode != 0:
            raise AssertionError("stoker up failed: %s\n%s" % (p.stderr.decode(), self.logs()))
        if MOUNT_SHARD > 1 and META_SHARDS >= MOUNT_SHARD and not self.sub:
            sub = "/on-shard-%d" % MOUNT_SHARD
            self.cli("shard", "pin", "/", str(MOUNT_SHARD))
            self.cli("mkdir", sub)
            self.cli("shard", "unpin", "/")
            shown = self.cli("shard", "show", sub).stdout
            assert b"on shard %d;" % MOUNT_SHARD in shown, shown
            self.sub = sub
        return p

    def stop(self):
        run([STOKER, "down", "--data", self.data], check=False, timeout=150)

    def sanitizer_reports(self):
        """Lines where ASan or UBSan reported a bug in a daemon (sanitizer builds)."""
        bad = []
        logdir = os.path.join(self.data, "log")
        if os.path.isdir(logdir):
            for name in os.listdir(logdir):
                with open(os.path.join(logdir, name), errors="replace") as f:
                    for line in f:
                        if "ERROR: AddressSanitizer" in line or "runtime error:" in line or \
                                "ERROR: LeakSanitizer" in line:
                            bad.append("%s: %s" % (name, line.strip()))
        return bad

    def logs(self):
        out = []
        logdir = os.path.join(self.data, "log")
        if os.path.isdir(logdir):
            for name in sorted(os.listdir(logdir)):
                with open(os.path.join(logdir, name), errors="replace") as f:
                    out.append("--- %s ---\n%s" % (name, f.read()[-4000:]))
        return "\n".join(out)

    def pids(self):
        """The daemons' pids by role, from /proc (children of the supervisor). A
        daemon's own child between its fork and exec (storage runs smartctl) has the
        same command line: only a process whose parent is not a daemon counts."""
        found = {}
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open("/proc/%s/cmdline" % pid, "rb") as f:
                    argv = f.read().split(b"\0")
                with open("/proc/%s/stat" % pid) as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if len(argv) > 4 and argv[1] in (b"mgmtd", b"meta", b"storage") and \
                    self.data.encode() in b" ".join(argv):
                found[int(pid)] = (argv[1].decode(), ppid)
        return {role: pid for pid, (role, ppid) in found.items() if ppid not in found}

    @property
    def key_file(self):
        """The cluster key `stoker up` made (docs/security.md). Clients given the mgmtd
        address find it by themselves; tools given a meta or storage address get it
        through STOKER_KEY_FILE (self.env())."""
        return os.path.join(self.data, "cluster.key")

    def env(self, **extra):
        return dict(os.environ, STOKER_CLUSTER=self.url, STOKER_KEY_FILE=self.key_file, **extra)

    def cli(self, *args, check=True, input=None, timeout=300):
        if self.sub:
            args = [self.sub + a if a.startswith("/") and not os.path.exists(a) else a
                    for a in args]
        return run([STOKER] + list(args), check=check, input=input, timeout=timeout,
                   env=self.env())

    def check(self, *args, check=True, timeout=600):
        return run([CHECK, args[0], self.url] + list(args[1:]), check=check, timeout=timeout,
                   env=self.env())

    def target_dirs(self):
        return [os.path.join(self.data, "targets", str(i)) for i in range(self.targets)]

    def chunk_files(self):
        out = []
        for t in self.target_dirs():
            for dirpath, _, files in os.walk(os.path.join(t, "chunks")):
                out += [os.path.join(dirpath, f) for f in files if ".tmp" not in f]
        return out


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path / "stk", pick_ports())
    c.start()
    yield c
    c.stop()
    assert not c.sanitizer_reports(), c.logs()


@pytest.fixture
def make_cluster(tmp_path):
    made = []

    def make(name="stk", targets=4, start=True):
        c = Cluster(tmp_path / name, pick_ports(), targets)
        made.append(c)
        if start:
            c.start()
        return c

    yield make
    for c in made:
        c.stop()
    for c in made:
        assert not c.sanitizer_reports(), c.logs()


@pytest.fixture
def rand_file(tmp_path):
    def make(size, name=None, seed=1):
        path = tmp_path / (name or "f-%d-%d.bin" % (size, seed))
        with open(path, "wb") as f:
            left = size
            g = random.Random(seed)
            while left:
                n = min(left, 1 << 20)
                f.write(g.randbytes(n))
                left -= n
        return path
    return make


def have_root():
    return os.geteuid() == 0


needs_root = pytest.mark.skipif(not have_root(), reason="needs root (tmpfs mounts)")


def stacks(pid):
    """What each thread of a hung process is doing: gdb's backtraces where gdb is
    installed, else each thread's kernel wait channel."""
    if shutil.which("gdb"):
        p = subprocess.run(["gdb", "-p", str(pid), "-batch", "-nx", "-ex",
                            "thread apply all bt"], capture_output=True, timeout=60)
        return p.stdout.decode(errors="replace")[-6000:]
    out = []
    for t in sorted(os.listdir("/proc/%d/task" % pid)):
        try:
            with open("/proc/%d/task/%s/wchan" % (pid, t)) as f:
                out.append("%s %s" % (t, f.read()))
        except OSError:
            pass
    return "\n".join(out)


def holders(path):
    """Processes with a descriptor, cwd or map below path: [(pid, comm, what)]."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            links = [os.readlink("/proc/%s/cwd" % pid)]
            fds = "/proc/%s/fd" % pid
            links += [os.readlink(os.path.join(fds, fd)) for fd in os.listdir(fds)]
            with open("/proc/%s/maps" % pid) as f:
                links += [l.split(None, 5)[-1].strip() for l in f if path in l]
            with open("/proc/%s/comm" % pid) as f:
                comm = f.read().strip()
        except OSError:
            continue
        out += [(int(pid), comm, l) for l in links if l.startswith(path)]
    return out


def gone(pid, timeout):
    """Waits up to timeout s for process pid to exit (a zombie counts as gone)."""
    end = time.time() + timeout
    while time.time() < end:
        try:
            with open("/proc/%d/stat" % pid) as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except OSError:
            return True
        time.sleep(0.05)
    return False


def have_fuse():
    return have_root() and os.path.exists("/dev/fuse") and shutil.which("fusermount3") is not None


needs_fuse = pytest.mark.skipif(not have_fuse(), reason="needs root, /dev/fuse and fusermount3")


class Mount:
    """A `stoker mount` of a cluster (or of a folder in it) on a temporary folder.

    Each mount logs to its own file, which teardown scans for sanitizer reports."""

    def __init__(self, cluster, path, sub="", opts=()):
        self.cluster = cluster
        self.path = str(path)
        self.sub = getattr(cluster, "sub", "") + sub
        self.opts = list(opts)
        self.logfile = self.path + ".log"

    def start(self, check=True):
        os.makedirs(self.path, exist_ok=True)
        opts = ",".join(["log=" + self.logfile] + self.opts)
        p = run([STOKER, "mount", self.cluster.url + self.sub, self.path, "-o", opts],
                check=False, timeout=90)
        if check and p.returncode != 0:
            raise AssertionError("stoker mount failed (%d): %s\n%s" % (
                p.returncode, p.stderr.decode(errors="replace"), self.log()))
        return p

    def mounted(self):
        with open("/proc/self/mountinfo") as f:
            return any(l.split()[4] == self.path for l in f)

    def pid(self):
        """The mount daemon's pid, from the file it records for `stoker umount`."""
        dev = os.stat(self.path).st_dev
        name = "/tmp/stoker-%d/mount-%d:%d.pid" % (os.getuid(), os.major(dev), os.minor(dev))
        with open(name) as f:
            return int(f.read().split()[0])

    lingered = None

    def stop(self):
        """Unmounts; the daemon must then exit (else self.lingered, and it is killed)."""
        if self.mounted():
            try:
                pid = self.pid()
            except (OSError, ValueError):
                pid = None
            p = run([STOKER, "umount", self.path], check=False, timeout=120)
            lazy = p.returncode != 0 and self.mounted()
            if lazy:
                run(["umount", "-l", self.path], check=False)
            if pid and not gone(pid, 60):
                self.lingered = ("mount daemon %d still running after its umount (%s)\n"
                                 "open below the mount point: %s\n%s" % (
                                     pid, "lazy, `stoker umount` said: %s" %
                                     p.stderr.decode(errors="replace").strip()
                                     if lazy else "stoker umount said 0",
                                     holders(self.path), stacks(pid)))
                os.kill(pid, signal.SIGKILL)

    def log(self):
        try:
            with open(self.logfile, errors="replace") as f:
                return f.read()[-4000:]
        except OSError:
            return ""

    def sanitizer_reports(self):
        return [l for l in self.log().splitlines()
                if "ERROR: AddressSanitizer" in l or "runtime error:" in l or
                "ERROR: LeakSanitizer" in l]


@pytest.fixture
def mount(cluster, tmp_path):
    """The cluster of the `cluster` fixture, mounted on tmp_path/mnt; unmounted at teardown."""
    if not have_fuse():
        pytest.skip("needs root, /dev/fuse and fusermount3")
    m = Mount(cluster, tmp_path / "mnt")
    m.start()
    yield m
    m.stop()
    assert not m.sanitizer_reports(), m.log()
    assert not m.lingered, m.lingered + "\n" + m.log()


@pytest.fixture
def make_mount(tmp_path):
    """make(cluster, name, sub="", opts=()) mounts more; all unmounted at teardown.
    Ask for it after the cluster fixtures, so that mounts go before their clusters."""
    if not have_fuse():
        pytest.skip("needs root, /dev/fuse and fusermount3")
    made = []

    def make(cluster, name="mnt", sub="", opts=(), start=True):
        m = Mount(cluster, tmp_path / name, sub, opts)
        made.append(m)
        if start:
            m.start()
        return m

    yield make
    for m in reversed(made):
        m.stop()
    for m in made:
        assert not m.sanitizer_reports(), m.log()
        assert not m.lingered, m.lingered + "\n" + m.log()


NOBODY = 65534


def as_nobody():
    """preexec_fn: the child runs as nobody, with no supplementary groups."""
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)


def errno_of(fn, *args):
    """The errno fn(*args) fails with, 0 when it succeeds."""
    try:
        fn(*args)
    except OSError as e:
        return e.errno
    return 0


def wait_until(cond, timeout=60, what="condition"):
    """Polls cond() every 0.1 s until it is true; fails the test after timeout s."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return
        time.sleep(0.1)
    raise AssertionError("timed out waiting for " + what)


__all__ = ["free_port", "pick_ports", "Cluster", "Mount", "run", "errno_of", "wait_until", "NOBODY", "as_nobody", "STOKER", "CHECK", "needs_root", "needs_fuse", "shutil",
           "time"]


@pytest.fixture
def role_cluster(tmp_path):
    """A cluster started role by role on 127.0.0.1, .2, .3... (tests/integration/roles.py):
    nothing started yet; the test adds nodes and starts them. Stopped afterwards."""
    from roles import RoleCluster
    rc = RoleCluster(tmp_path / "roles")
    os.makedirs(rc.dir, exist_ok=True)
    yield rc
    rc.stop_all()
    assert not rc.sanitizer_reports(), rc.logs()
