"""The CSI driver (docs/csi.md), driven as the kubelet and the external provisioner
drive it: a real gRPC client (python3-grpcio, stubs generated from csi/csi.proto)
over the unix socket of the real driver process, against a real cluster. Pods are
processes in mount namespaces of their own (`unshare -m`), reading and writing
the bind mounts the driver made; the manifests in deploy/kubernetes/ are checked
offline against the Kubernetes API's models (python3-kubernetes)."""
import errno
import glob
import json
import os
import signal
import subprocess
import sys
import threading
import time

import grpc
import pytest

from conftest import ROOT, STOKER, have_fuse, run, wait_until
from pyhelp import PYDIR, PYTHON, stoker

from stoker_csi import csi_pb2 as pb  # noqa: E402 (build/python, via pyhelp)
from stoker_csi import csi_pb2_grpc as pbg  # noqa: E402

pytestmark = pytest.mark.skipif(not have_fuse(), reason="needs root, /dev/fuse, fusermount3")

MiB = 1 << 20
M = pb.VolumeCapability.AccessMode
RWX, ROX, RWO = M.MULTI_NODE_MULTI_WRITER, M.MULTI_NODE_READER_ONLY, M.SINGLE_NODE_WRITER


def cap(mode=RWX, flags=()):
    return pb.VolumeCapability(mount=pb.VolumeCapability.MountVolume(mount_flags=list(flags)),
                               access_mode=M(mode=mode))


def block_cap(mode=RWX):
    return pb.VolumeCapability(block=pb.VolumeCapability.BlockVolume(), access_mode=M(mode=mode))


def code_of(fn, req):
    """The gRPC status code fn(req) ends with (OK when it succeeds)."""
    try:
        fn(req)
    except grpc.RpcError as e:
        return e.code()
    return grpc.StatusCode.OK


class Driver:
    """The driver process, serving its socket; restartable (same state folder)."""

    def __init__(self, cluster, tmp):
        self.cluster = cluster
        self.tmp = str(tmp)
        self.sock = os.path.join(self.tmp, "csi", "csi.sock")
        self.state = os.path.join(self.tmp, "state")
        self.logfile = os.path.join(self.tmp, "driver.log")
        self.proc = None

    def start(self):
        env = dict(os.environ, PYTHONPATH=PYDIR, STOKER_BIN=STOKER)
        env.pop("STOKER_CLUSTER", None)
        env.pop("STOKER_KEY_FILE", None)
        log = open(self.logfile, "a")
        self.proc = subprocess.Popen(
            [PYTHON, "-m", "stoker_csi", "--endpoint", "unix://" + self.sock, "--mode", "all",
             "--node-id", "node-1", "--cluster", self.cluster.url, "--key-file",
             self.cluster.key_file, "--root", "/volumes", "--state-dir", self.state],
            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        log.close()
        self.channel = grpc.insecure_channel("unix://" + self.sock)
        grpc.channel_ready_future(self.channel).result(timeout=60)
        self.identity = pbg.IdentityStub(self.channel)
        self.ctl = pbg.ControllerStub(self.channel)
        self.node = pbg.NodeStub(self.channel)

    def kill(self):
        self.channel.close()
        self.proc.kill()
        self.proc.wait()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.channel.close()
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log(self):
        with open(self.logfile, errors="replace") as f:
            return f.read()[-6000:]

    def shared_mounts(self):
        """The Stoker mounts under the state folder: [(mount point, dev)]."""
        out = []
        with open("/proc/self/mountinfo") as f:
            for line in f:
                fl = line.split()
                if fl[4].startswith(self.state + "/mounts/") and \
                        fl[fl.index("-") + 1].startswith("fuse"):
                    out.append((fl[4], fl[2]))
        return out

    def create(self, name, size, mode=RWX, **params):
        return self.ctl.CreateVolume(pb.CreateVolumeRequest(
            name=name, capacity_range=pb.CapacityRange(required_bytes=size),
            volume_capabilities=[cap(mode)], parameters=params)).volume

    def stage(self, vid, staging, mode=RWX, flags=(), context=None):
        self.node.NodeStageVolume(pb.NodeStageVolumeRequest(
            volume_id=vid, staging_target_path=staging, volume_capability=cap(mode, flags),
            volume_context=context or {}))

    def publish(self, vid, staging, target, mode=RWX, readonly=False, context=None):
        self.node.NodePublishVolume(pb.NodePublishVolumeRequest(
            volume_id=vid, staging_target_path=staging, target_path=target,
            volume_capability=cap(mode), readonly=readonly, volume_context=context or {}))

    def unpublish(self, vid, target):
        self.node.NodeUnpublishVolume(pb.NodeUnpublishVolumeRequest(volume_id=vid,
                                                                    target_path=target))

    def unstage(self, vid, staging):
        self.node.NodeUnstageVolume(pb.NodeUnstageVolumeRequest(volume_id=vid,
                                                                staging_target_path=staging))


def mounts_under(path):
    with open("/proc/self/mountinfo") as f:
        return [l.split()[4] for l in f if l.split()[4].startswith(path + "/")]


@pytest.fixture
def csi(cluster, tmp_path):
    d = Driver(cluster, tmp_path)
    d.start()
    yield d
    d.stop()
    # what a failing test left mounted: binds first, then the shared Stoker mounts
    for p in reversed(mounts_under(str(tmp_path))):
        if not p.startswith(d.state + "/mounts/"):
            subprocess.run(["umount", "-l", p], capture_output=True)
    for p, _ in d.shared_mounts():
        subprocess.run([STOKER, "umount", p], capture_output=True, timeout=120)
        if p in mounts_under(str(tmp_path)):
            subprocess.run([STOKER, "umount", "-l", p], capture_output=True)


# A pod: a process in a mount namespace of its own (a copy of the node's mounts at
# its start, private from then on, as a container's), running the Python code it is
# sent, one JSON line per request, and answering with its result or its errno.
POD = r"""
import json, os, sys
for line in sys.stdin:
    ns = {"os": os}
    try:
        exec(json.loads(line), ns)
        out = {"result": ns.get("result")}
    except OSError as e:
        out = {"errno": e.errno, "error": str(e)}
    print(json.dumps(out), flush=True)
"""


class Pod:
    def __init__(self):
        self.p = subprocess.Popen(["unshare", "-m", "--propagation", "private", PYTHON, "-c",
                                   POD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True)
        # answers once python runs, so after unshare(2): its namespace is its own
        assert self.run("result = 1") == {"result": 1}

    def run(self, code):
        self.p.stdin.write(json.dumps(code) + "\n")
        self.p.stdin.flush()
        return json.loads(self.p.stdout.readline())

    def ns(self):
        return os.readlink("/proc/%d/ns/mnt" % self.p.pid)

    def close(self):
        self.p.stdin.close()
        self.p.wait(60)


@pytest.fixture
def pods():
    made = []

    def make():
        p = Pod()
        made.append(p)
        return p
    yield make
    for p in made:
        if p.p.poll() is None:
            p.p.kill()
            p.p.wait()


def write_code(path, size, seed):
    return ("data = bytes((i * %d + 7) %% 251 for i in range(%d))\n"
            "with open(%r, 'wb') as f:\n    f.write(data)\n    os.fsync(f.fileno())\n"
            "result = len(data)" % (seed, size, path))


def read_code(path):
    return "import hashlib\nresult = hashlib.sha256(open(%r, 'rb').read()).hexdigest()" % path


def expected_sha(size, seed):
    import hashlib
    return hashlib.sha256(bytes((i * seed + 7) % 251 for i in range(size))).hexdigest()


def quota_of(cluster, path):
    out = json.loads(cluster.cli("quota", "ls", path, "--json").stdout)
    return next((q for q in out if q["path"] == path), None)


# ---- Identity ----

def test_identity_and_capabilities(csi):
    info = csi.identity.GetPluginInfo(pb.GetPluginInfoRequest())
    assert info.name == "csi.stoker.io" and info.vendor_version
    caps = csi.identity.GetPluginCapabilities(pb.GetPluginCapabilitiesRequest()).capabilities
    C = pb.PluginCapability
    assert C.Service.CONTROLLER_SERVICE in [c.service.type for c in caps if c.HasField("service")]
    assert C.VolumeExpansion.ONLINE in [c.volume_expansion.type for c in caps
                                        if c.HasField("volume_expansion")]
    assert csi.identity.Probe(pb.ProbeRequest()).ready.value is True
    R = pb.ControllerServiceCapability.RPC
    ccaps = {c.rpc.type for c in csi.ctl.ControllerGetCapabilities(
        pb.ControllerGetCapabilitiesRequest()).capabilities}
    assert {R.CREATE_DELETE_VOLUME, R.EXPAND_VOLUME} <= ccaps
    N = pb.NodeServiceCapability.RPC
    ncaps = {c.rpc.type for c in csi.node.NodeGetCapabilities(
        pb.NodeGetCapabilitiesRequest()).capabilities}
    assert {N.STAGE_UNSTAGE_VOLUME, N.GET_VOLUME_STATS} <= ncaps
    assert csi.node.NodeGetInfo(pb.NodeGetInfoRequest()).node_id == "node-1"
    # a method the driver does not serve is UNIMPLEMENTED, as the spec asks
    unknown = csi.channel.unary_unary("/csi.v1.Controller/ListVolumes",
                                      request_serializer=lambda m: b"",
                                      response_deserializer=lambda b: b)
    assert code_of(unknown, None) == grpc.StatusCode.UNIMPLEMENTED


# ---- Controller ----

def test_create_volume_is_idempotent_and_checks_its_arguments(csi, cluster):
    c = stoker.connect(cluster.url)
    v = csi.create("pvc-aaaa", 64 * MiB)
    assert v.capacity_bytes == 64 * MiB
    path = v.volume_context["path"]
    assert path == "/volumes/pvc-aaaa" and c.isdir(path)
    assert quota_of(cluster, path)["limit_bytes"] == 64 * MiB
    # same name and capacity: the same volume
    again = csi.create("pvc-aaaa", 64 * MiB)
    assert (again.volume_id, again.capacity_bytes) == (v.volume_id, v.capacity_bytes)
    # same name, another capacity: ALREADY_EXISTS, and the volume is untouched
    assert code_of(lambda r: csi.create("pvc-aaaa", 65 * MiB), None) == \
        grpc.StatusCode.ALREADY_EXISTS
    assert quota_of(cluster, path)["limit_bytes"] == 64 * MiB
    # named from the claim when the provisioner passes it; root and inodes from the class
    w = csi.create("pvc-bbbb", 8 * MiB, **{"csi.storage.k8s.io/pvc/namespace": "team-a",
                                           "csi.storage.k8s.io/pvc/name": "train-data",
                                           "root": "/k8s/vols", "inodes": "500"})
    assert w.volume_context["path"] == "/k8s/vols/team-a-train-data-pvc-bbbb"
    q = quota_of(cluster, "/k8s/vols/team-a-train-data-pvc-bbbb")
    assert (q["limit_bytes"], q["limit_inodes"]) == (8 * MiB, 500)
    assert not [n for n in c.listdir("/volumes") + c.listdir("/k8s/vols")
                if n.startswith(".")]

    def create(**kw):
        args = dict(name="pvc-x", capacity_range=pb.CapacityRange(required_bytes=MiB),
                    volume_capabilities=[cap()])
        args.update(kw)
        return lambda r: csi.ctl.CreateVolume(pb.CreateVolumeRequest(**args))
    INVALID = grpc.StatusCode.INVALID_ARGUMENT
    assert code_of(create(name=""), None) == INVALID
    assert code_of(create(volume_capabilities=[]), None) == INVALID
    assert code_of(create(volume_capabilities=[block_cap()]), None) == INVALID
    assert code_of(create(volume_capabilities=[pb.VolumeCapability(
        mount=pb.VolumeCapability.MountVolume())]), None) == INVALID
    assert code_of(create(capacity_range=pb.CapacityRange(required_bytes=-1)), None) == INVALID
    assert code_of(create(capacity_range=pb.CapacityRange(required_bytes=2 * MiB,
                                                          limit_bytes=MiB)), None) == \
        grpc.StatusCode.OUT_OF_RANGE
    assert code_of(create(parameters={"colour": "blue"}), None) == INVALID
    assert code_of(create(parameters={"root": "relative"}), None) == INVALID
    assert code_of(create(parameters={"root": "/a/../b"}), None) == INVALID
    assert code_of(create(volume_content_source=pb.VolumeContentSource(
        snapshot=pb.VolumeContentSource.SnapshotSource(snapshot_id="s"))), None) == INVALID
    assert not c.exists("/volumes/pvc-x")
    # every access mode a shared file system serves
    for mode in (RWX, ROX, RWO, M.SINGLE_NODE_READER_ONLY, M.MULTI_NODE_SINGLE_WRITER):
        assert csi.create("pvc-mode-%d" % mode, MiB, mode=mode).capacity_bytes == MiB
    c.close()


def test_delete_volume(csi, cluster):
    c = stoker.connect(cluster.url)
    v = csi.create("pvc-del", 16 * MiB)
    path = v.volume_context["path"]
    c.write_file(path + "/f", b"x" * 1000)
    c.makedirs(path + "/d/e")
    csi.ctl.DeleteVolume(pb.DeleteVolumeRequest(volume_id=v.volume_id))
    assert not c.exists(path)
    wait_until(lambda: not [n for n in c.listdir("/volumes") if n.startswith(".deleting")],
               what="the deleted volume's tree removed")
    assert all(q["path"] != path for q in json.loads(cluster.cli("quota", "ls", "--json").stdout))
    # deleting again, an unknown volume, a volume id of another form: all OK
    for vid in (v.volume_id, "dyn:%s/volumes/never-made" % cluster.url, "nope",
                "dyn:garbage"):
        csi.ctl.DeleteVolume(pb.DeleteVolumeRequest(volume_id=vid))
    # a static volume's folder is never removed, whatever the CO asks
    c.makedirs("/datasets/keep")
    csi.ctl.DeleteVolume(pb.DeleteVolumeRequest(volume_id="%s/datasets/keep" % cluster.url))
    assert c.isdir("/datasets/keep")
    assert code_of(csi.ctl.DeleteVolume, pb.DeleteVolumeRequest()) == \
        grpc.StatusCode.INVALID_ARGUMENT
    # the name can be provisioned again afterwards, with another size
    assert csi.create("pvc-del", 32 * MiB).capacity_bytes == 32 * MiB
    c.close()


def test_validate_volume_capabilities(csi, cluster):
    v = csi.create("pvc-val", MiB)
    V = csi.ctl.ValidateVolumeCapabilities
    for caps in ([cap(RWX)], [cap(ROX)], [cap(RWO), cap(RWX)]):
        r = V(pb.ValidateVolumeCapabilitiesRequest(volume_id=v.volume_id,
                                                   volume_capabilities=caps))
        assert list(r.confirmed.volume_capabilities) == caps
    r = V(pb.ValidateVolumeCapabilitiesRequest(volume_id=v.volume_id,
                                               volume_capabilities=[block_cap()]))
    assert not r.HasField("confirmed") and "block" in r.message
    # a static volume, by its attributes
    stoker.connect(cluster.url).makedirs("/datasets/imagenet")
    r = V(pb.ValidateVolumeCapabilitiesRequest(
        volume_id="imagenet", volume_context={"path": "/datasets/imagenet"},
        volume_capabilities=[cap(ROX)]))
    assert r.HasField("confirmed")
    assert code_of(V, pb.ValidateVolumeCapabilitiesRequest(
        volume_id="dyn:%s/volumes/none" % cluster.url, volume_capabilities=[cap()])) == \
        grpc.StatusCode.NOT_FOUND
    assert code_of(V, pb.ValidateVolumeCapabilitiesRequest(
        volume_id="nope", volume_capabilities=[cap()])) == grpc.StatusCode.NOT_FOUND
    assert code_of(V, pb.ValidateVolumeCapabilitiesRequest(volume_id=v.volume_id)) == \
        grpc.StatusCode.INVALID_ARGUMENT
    assert code_of(V, pb.ValidateVolumeCapabilitiesRequest(volume_capabilities=[cap()])) == \
        grpc.StatusCode.INVALID_ARGUMENT


# ---- Node ----

def test_two_pods_share_a_volume_and_its_quota(csi, cluster, tmp_path, pods):
    v = csi.create("pvc-rwx", 16 * MiB)
    w = csi.create("pvc-other", 16 * MiB)
    k = str(tmp_path / "kubelet")
    st1, st2 = k + "/globalmount-1", k + "/globalmount-2"
    csi.stage(v.volume_id, st1, context=v.volume_context)
    csi.stage(w.volume_id, st2, context=w.volume_context)
    # one Stoker mount for the node, whatever the number of volumes
    assert len(csi.shared_mounts()) == 1
    t1, t2, t3 = k + "/pod-a/vol", k + "/pod-b/vol", k + "/pod-c/vol"
    csi.publish(v.volume_id, st1, t1)
    csi.publish(v.volume_id, st1, t2)
    csi.publish(w.volume_id, st2, t3)
    csi.publish(v.volume_id, st1, t1)  # again: answered from the mount table
    a, b = pods(), pods()
    assert a.ns() != b.ns() != os.readlink("/proc/self/ns/mnt")
    # both pods write at once, then each reads what the other wrote
    results = {}
    ta = threading.Thread(target=lambda: results.update(a=a.run(write_code(t1 + "/a", 4 * MiB,
                                                                          3))))
    tb = threading.Thread(target=lambda: results.update(b=b.run(write_code(t2 + "/b", 4 * MiB,
                                                                          5))))
    ta.start(), tb.start(), ta.join(), tb.join()
    assert results == {"a": {"result": 4 * MiB}, "b": {"result": 4 * MiB}}
    assert a.run(read_code(t1 + "/b"))["result"] == expected_sha(4 * MiB, 5)
    assert b.run(read_code(t2 + "/a"))["result"] == expected_sha(4 * MiB, 3)
    # the data is in the volume's folder of the cluster, and not in the other volume
    c = stoker.connect(cluster.url)
    assert sorted(c.listdir(v.volume_context["path"])) == ["a", "b"]
    assert c.listdir(w.volume_context["path"]) == []
    # the quota holds inside the pod: 8 MiB more does not fit in 16
    r = a.run(write_code(t1 + "/big", 9 * MiB, 1))
    assert r.get("errno") == errno.EDQUOT, r
    # and df in the pod shows the volume, not the cluster
    r = b.run("st = os.statvfs(%r); result = [st.f_blocks * st.f_frsize]" % t2)
    assert r["result"] == [16 * MiB]
    # NodeGetVolumeStats: bytes and inodes against the quota
    s = csi.node.NodeGetVolumeStats(pb.NodeGetVolumeStatsRequest(volume_id=v.volume_id,
                                                                 volume_path=t1))
    U = pb.VolumeUsage
    by = {u.unit: u for u in s.usage}
    assert by[U.BYTES].total == 16 * MiB
    assert by[U.BYTES].used >= 8 * MiB and by[U.BYTES].available <= 8 * MiB
    assert by[U.INODES].used >= 3 and not s.volume_condition.abnormal
    # unpublish: the target goes; the other pod keeps working
    csi.unpublish(v.volume_id, t1)
    assert not os.path.exists(t1)
    assert b.run(read_code(t2 + "/a"))["result"] == expected_sha(4 * MiB, 3)
    csi.unpublish(v.volume_id, t1)  # again: OK
    csi.unpublish(v.volume_id, t2)
    csi.unpublish(w.volume_id, t3)
    csi.unstage(v.volume_id, st1)
    assert len(csi.shared_mounts()) == 1  # the other volume still uses it
    csi.unstage(w.volume_id, st2)
    wait_until(lambda: not csi.shared_mounts(), what="the shared mount released")
    csi.unstage(w.volume_id, st2)  # again: OK
    a.close(), b.close()
    c.close()


def test_node_calls_check_their_arguments(csi, tmp_path):
    v = csi.create("pvc-args", MiB)
    st, t = str(tmp_path / "st"), str(tmp_path / "t")
    N = csi.node
    INVALID = grpc.StatusCode.INVALID_ARGUMENT
    R = pb.NodeStageVolumeRequest
    assert code_of(N.NodeStageVolume, R(staging_target_path=st, volume_capability=cap())) == \
        INVALID
    assert code_of(N.NodeStageVolume, R(volume_id=v.volume_id, volume_capability=cap())) == \
        INVALID
    assert code_of(N.NodeStageVolume, R(volume_id=v.volume_id, staging_target_path=st)) == \
        INVALID
    assert code_of(N.NodeStageVolume, R(volume_id=v.volume_id, staging_target_path=st,
                                        volume_capability=block_cap())) == INVALID
    assert code_of(N.NodeStageVolume, R(volume_id="static", staging_target_path=st,
                                        volume_capability=cap())) == INVALID
    assert code_of(N.NodeStageVolume, R(volume_id="x", staging_target_path=st,
                                        volume_capability=cap(),
                                        volume_context={"path": "/not/there"})) == \
        grpc.StatusCode.NOT_FOUND
    P = pb.NodePublishVolumeRequest
    # publish before stage: FAILED_PRECONDITION
    assert code_of(N.NodePublishVolume, P(volume_id=v.volume_id, staging_target_path=st,
                                          target_path=t, volume_capability=cap())) == \
        grpc.StatusCode.FAILED_PRECONDITION
    for kw in (dict(staging_target_path=st, target_path=t, volume_capability=cap()),
               dict(volume_id=v.volume_id, target_path=t, volume_capability=cap()),
               dict(volume_id=v.volume_id, staging_target_path=st, volume_capability=cap()),
               dict(volume_id=v.volume_id, staging_target_path=st, target_path=t)):
        assert code_of(N.NodePublishVolume, P(**kw)) == INVALID, kw
    assert code_of(N.NodeUnpublishVolume, pb.NodeUnpublishVolumeRequest(volume_id="x")) == \
        INVALID
    assert code_of(N.NodeUnpublishVolume, pb.NodeUnpublishVolumeRequest(target_path=t)) == \
        INVALID
    assert code_of(N.NodeUnstageVolume, pb.NodeUnstageVolumeRequest(volume_id="x")) == INVALID
    assert code_of(N.NodeGetVolumeStats, pb.NodeGetVolumeStatsRequest(volume_id="x")) == \
        INVALID
    assert code_of(N.NodeGetVolumeStats, pb.NodeGetVolumeStatsRequest(
        volume_id="x", volume_path=str(tmp_path / "nothing"))) == grpc.StatusCode.NOT_FOUND
    # a target published read-write cannot be published again read-only
    csi.stage(v.volume_id, st)
    csi.publish(v.volume_id, st, t)
    assert code_of(N.NodePublishVolume, P(volume_id=v.volume_id, staging_target_path=st,
                                          target_path=t, volume_capability=cap(),
                                          readonly=True)) == grpc.StatusCode.ALREADY_EXISTS
    csi.unpublish(v.volume_id, t)
    csi.unstage(v.volume_id, st)
    assert not csi.shared_mounts()


def test_static_volume_read_only_and_read_write(csi, cluster, tmp_path, pods):
    c = stoker.connect(cluster.url)
    c.makedirs("/datasets/imagenet")
    c.write_file("/datasets/imagenet/train-0.bin", b"sample" * 1000)
    ctx = {"path": "/datasets/imagenet"}  # a PV's volumeAttributes
    st = str(tmp_path / "st")
    ro_t, rw_t, rox_t = (str(tmp_path / n) for n in ("ro", "rw", "rox"))
    csi.stage("imagenet", st, mode=ROX, context=ctx)
    csi.publish("imagenet", st, ro_t, mode=RWX, readonly=True, context=ctx)  # PV readOnly
    csi.publish("imagenet", st, rox_t, mode=ROX, context=ctx)  # ReadOnlyMany
    csi.publish("imagenet", st, rw_t, mode=RWX, context=ctx)
    p = pods()
    assert p.run("result = open(%r, 'rb').read()[:6].decode()" % (ro_t + "/train-0.bin")) == \
        {"result": "sample"}
    for t in (ro_t, rox_t):
        r = p.run("open(%r, 'wb')" % (t + "/new"))
        assert r.get("errno") == errno.EROFS, r
    assert p.run(write_code(rw_t + "/labels", 1000, 2)) == {"result": 1000}
    assert c.read_file("/datasets/imagenet/labels") == \
        bytes((i * 2 + 7) % 251 for i in range(1000))
    for t in (ro_t, rox_t, rw_t):
        csi.unpublish("imagenet", t)
    csi.unstage("imagenet", st)
    # the static volume's id in the stk:// form works without attributes too
    csi.stage("%s/datasets/imagenet" % cluster.url, st)
    assert os.listdir(st) == ["labels", "train-0.bin"] or \
        sorted(os.listdir(st)) == ["labels", "train-0.bin"]
    csi.unstage("x", st)
    p.close()
    c.close()


def test_mount_options_reach_stoker_mount(csi, tmp_path):
    v = csi.create("pvc-opts", MiB)
    st, st2 = str(tmp_path / "st"), str(tmp_path / "st2")
    csi.stage(v.volume_id, st, flags=["attr_timeout=0.25,entry_timeout=0.25", "noatime"])
    [(mp, dev)] = csi.shared_mounts()
    major, minor = dev.split(":")
    with open("/tmp/stoker-0/mount-%s:%s.pid" % (major, minor)) as f:
        pid = int(f.read().split()[0])
    with open("/proc/%d/cmdline" % pid, "rb") as f:
        argv = f.read().split(b"\0")
    opts = argv[argv.index(b"-o") + 1].decode().split(",")
    assert {"attr_timeout=0.25", "entry_timeout=0.25", "noatime", "allow_other"} <= set(opts)
    # other options: a mount of their own; the same ones again: the same mount
    csi.stage(v.volume_id, st2)
    assert len(csi.shared_mounts()) == 2
    csi.unstage(v.volume_id, st2)
    assert [m for m, _ in csi.shared_mounts()] == [mp]
    # an option `stoker mount` does not know, or one that is malformed
    for flags in (["frobnicate"], ["a b"]):
        assert code_of(csi.node.NodeStageVolume, pb.NodeStageVolumeRequest(
            volume_id=v.volume_id, staging_target_path=str(tmp_path / "st3"),
            volume_capability=cap(RWX, flags))) == grpc.StatusCode.INVALID_ARGUMENT
    csi.unstage(v.volume_id, st)
    assert not csi.shared_mounts()


def test_expansion_online_seen_by_a_running_pod(csi, tmp_path, pods, cluster):
    v = csi.create("pvc-grow", 32 * MiB)
    st, t = str(tmp_path / "st"), str(tmp_path / "t")
    csi.stage(v.volume_id, st)
    csi.publish(v.volume_id, st, t)
    p = pods()
    df = "st = os.statvfs(%r); result = st.f_blocks * st.f_frsize" % t
    assert p.run(df) == {"result": 32 * MiB}
    assert p.run(write_code(t + "/f", 40 * MiB, 1)).get("errno") == errno.EDQUOT
    E = csi.ctl.ControllerExpandVolume
    r = E(pb.ControllerExpandVolumeRequest(volume_id=v.volume_id,
                                           capacity_range=pb.CapacityRange(
                                               required_bytes=96 * MiB)))
    assert (r.capacity_bytes, r.node_expansion_required) == (96 * MiB, False)
    # the same pod, no restart: df shows the new size and the write now fits
    assert p.run(df) == {"result": 96 * MiB}
    assert p.run(write_code(t + "/f", 40 * MiB, 1)) == {"result": 40 * MiB}
    assert quota_of(cluster, v.volume_context["path"])["limit_bytes"] == 96 * MiB
    # smaller than it is: the size it has; again: the same
    r = E(pb.ControllerExpandVolumeRequest(volume_id=v.volume_id, capacity_range=pb.CapacityRange(
        required_bytes=64 * MiB)))
    assert r.capacity_bytes == 96 * MiB
    assert quota_of(cluster, v.volume_context["path"])["limit_bytes"] == 96 * MiB
    assert code_of(E, pb.ControllerExpandVolumeRequest(
        volume_id="dyn:%s/volumes/none" % cluster.url,
        capacity_range=pb.CapacityRange(required_bytes=MiB))) == grpc.StatusCode.NOT_FOUND
    assert code_of(E, pb.ControllerExpandVolumeRequest(volume_id=v.volume_id)) == \
        grpc.StatusCode.INVALID_ARGUMENT
    assert code_of(E, pb.ControllerExpandVolumeRequest(
        capacity_range=pb.CapacityRange(required_bytes=MiB))) == grpc.StatusCode.INVALID_ARGUMENT
    p.close()
    csi.unpublish(v.volume_id, t)
    csi.unstage(v.volume_id, st)


WRITER = r"""
import os, sys, time
path, stop = sys.argv[1], sys.argv[2]
n, block = 0, bytes(range(256)) * 256          # 64 KiB
with open(path, "wb") as f:
    while not os.path.exists(stop):
        f.write(block)
        n += 1
        if n % 16 == 0:
            os.fsync(f.fileno())
        time.sleep(0.005)
    os.fsync(f.fileno())
print(n, flush=True)
"""


def test_node_plugin_restart_keeps_pods_writing(csi, cluster, tmp_path, pods):
    v = csi.create("pvc-restart", 256 * MiB)
    st, t = str(tmp_path / "st"), str(tmp_path / "t")
    csi.stage(v.volume_id, st)
    csi.publish(v.volume_id, st, t)
    [(mp, dev)] = csi.shared_mounts()
    stopfile = str(tmp_path / "stop")
    writer = subprocess.Popen(["unshare", "-m", "--propagation", "private", PYTHON, "-c",
                               WRITER, t + "/log", stopfile], stdout=subprocess.PIPE, text=True)
    c = stoker.connect(cluster.url)
    path = v.volume_context["path"] + "/log"
    wait_until(lambda: c.exists(path) and c.stat(path).st_size > 0, what="the pod writing")
    csi.kill()  # kill -9 of the node plugin, mid-write
    time.sleep(1)
    assert writer.poll() is None, "the pod's writer died with the plugin"
    csi.start()
    # the restarted plugin finds its mounts: a repeat is answered from the mount table,
    # a new pod's publish uses the same Stoker mount (no second daemon)
    csi.stage(v.volume_id, st)
    csi.publish(v.volume_id, st, t)
    t2 = str(tmp_path / "t2")
    csi.publish(v.volume_id, st, t2)
    assert csi.shared_mounts() == [(mp, dev)]
    size_then = c.stat(path).st_size
    wait_until(lambda: c.stat(path).st_size > size_then + 16 * 65536,
               what="the pod's writes going on after the restart")
    open(stopfile, "w").close()
    out, _ = writer.communicate(timeout=60)
    assert writer.returncode == 0
    n = int(out)
    # every block the pod wrote is there, in order
    data = c.read_file(path)
    assert len(data) == n * 65536 and data == bytes(range(256)) * 256 * n
    p = pods()
    assert p.run("result = os.path.getsize(%r)" % (t2 + "/log")) == {"result": n * 65536}
    p.close()
    csi.unpublish(v.volume_id, t)
    csi.unpublish(v.volume_id, t2)
    csi.unstage(v.volume_id, st)
    wait_until(lambda: not csi.shared_mounts(), what="the shared mount released")
    c.close()


def test_dead_mount_is_reported_and_mounted_again(csi, tmp_path):
    v = csi.create("pvc-dead", MiB)
    st, t = str(tmp_path / "st"), str(tmp_path / "t")
    csi.stage(v.volume_id, st)
    csi.publish(v.volume_id, st, t)
    [(mp, dev)] = csi.shared_mounts()
    major, minor = dev.split(":")
    with open("/tmp/stoker-0/mount-%s:%s.pid" % (major, minor)) as f:
        os.kill(int(f.read().split()[0]), signal.SIGKILL)
    wait_until(lambda: run(["stat", t], check=False).returncode != 0, what="the mount dead")
    s = csi.node.NodeGetVolumeStats(pb.NodeGetVolumeStatsRequest(volume_id=v.volume_id,
                                                                 volume_path=t))
    assert s.volume_condition.abnormal and "gone" in s.volume_condition.message
    # the kubelet stages and publishes again for the next pod: a fresh mount serves it
    csi.unpublish(v.volume_id, t)
    csi.stage(v.volume_id, st)
    csi.publish(v.volume_id, st, t)
    assert os.listdir(t) == []
    assert len(csi.shared_mounts()) == 1
    csi.unpublish(v.volume_id, t)
    csi.unstage(v.volume_id, st)
    assert not csi.shared_mounts()


# ---- manifests ----

def test_manifests_are_valid_kubernetes_objects():
    sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
    import k8s_schema
    docs = k8s_schema.load_dir(os.path.join(ROOT, "deploy", "kubernetes"))
    problems = [p for d in docs for p in k8s_schema.check(d)]
    assert problems == []
    kinds = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    assert kinds[("CSIDriver", "csi.stoker.io")]["spec"]["attachRequired"] is False
    sc = [d for d in docs if d["kind"] == "StorageClass"]
    assert sc and all(s["provisioner"] == "csi.stoker.io" and s["allowVolumeExpansion"] is True
                      for s in sc)
    pvc = [d for d in docs if d["kind"] == "PersistentVolumeClaim"
           and d["spec"]["resources"]["requests"]["storage"] == "5Ti"]
    assert pvc and pvc[0]["spec"]["accessModes"] == ["ReadWriteMany"]
    ds = [d for d in docs if d["kind"] == "DaemonSet"][0]
    names = [c["name"] for c in ds["spec"]["template"]["spec"]["containers"]]
    assert "node-driver-registrar" in names and "stoker-csi" in names
    dep = [d for d in docs if d["kind"] == "Deployment"][0]
    names = [c["name"] for c in dep["spec"]["template"]["spec"]["containers"]]
    assert {"csi-provisioner", "csi-resizer", "stoker-csi"} <= set(names)
    for kind in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding"):
        assert any(d["kind"] == kind for d in docs), kind
    # the driver's own arguments in the manifests are ones it accepts
    from stoker_csi import server
    for d in (ds, dep):
        for c in d["spec"]["template"]["spec"]["containers"]:
            if c["name"] == "stoker-csi":
                args = [a for a in c.get("args", []) if "$(" not in a]
                server.parse_args(args)
    # and the check catches what kubectl would refuse
    bad = json.loads(json.dumps(kinds[("CSIDriver", "csi.stoker.io")]))
    bad["spec"]["attachRequird"] = False
    assert k8s_schema.check(bad)
    bad = json.loads(json.dumps(ds))
    bad["spec"]["template"]["spec"]["containers"][0]["image"] = 5
    assert k8s_schema.check(bad)
