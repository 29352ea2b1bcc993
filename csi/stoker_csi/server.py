"""The CSI gRPC services on a unix socket, and `python3 -m stoker_csi`.

gRPC is Debian's python3-grpcio, the stubs are generated from csi/csi.proto by
python3-grpc-tools at build time (`make python`). Each call runs in a thread of
the server's pool; an Error raised by the controller or node code becomes its
gRPC status, any other exception INTERNAL with its text, and every call is
logged with its outcome.

    python3 -m stoker_csi --endpoint unix:///csi/csi.sock --mode node --node-id N
"""
import argparse
import concurrent.futures
import functools
import logging
import os
import shutil
import signal
import sys
import threading
import time

import grpc
from google.protobuf import wrappers_pb2

from . import NAME, VERSION
from . import csi_pb2 as pb
from . import csi_pb2_grpc as pbg
from .cluster import Clusters, Error
from .controller import Controller
from .node import Node, check_capabilities

log = logging.getLogger("stoker_csi")


def rpc(fn):
    """Maps Error to its status code and logs the call."""
    @functools.wraps(fn)
    def call(self, req, ctx):
        t = time.monotonic()
        try:
            out = fn(self, req, ctx)
            log.info("%s ok (%.0f ms)", fn.__name__, (time.monotonic() - t) * 1e3)
            return out
        except Error as e:
            log.info("%s %s: %s", fn.__name__, e.code, e.message)
            ctx.abort(getattr(grpc.StatusCode, e.code), e.message)
        except OSError as e:
            log.exception("%s failed", fn.__name__)
            ctx.abort(grpc.StatusCode.INTERNAL, "%s" % e)
    return call


class Identity(pbg.IdentityServicer):
    def __init__(self, controller):
        self.controller = controller

    @rpc
    def GetPluginInfo(self, req, ctx):
        return pb.GetPluginInfoResponse(name=NAME, vendor_version=VERSION)

    @rpc
    def GetPluginCapabilities(self, req, ctx):
        C = pb.PluginCapability
        caps = [C(volume_expansion=C.VolumeExpansion(type=C.VolumeExpansion.ONLINE))]
        if self.controller:
            caps.insert(0, C(service=C.Service(type=C.Service.CONTROLLER_SERVICE)))
        return pb.GetPluginCapabilitiesResponse(capabilities=caps)

    @rpc
    def Probe(self, req, ctx):
        return pb.ProbeResponse(ready=wrappers_pb2.BoolValue(value=True))


class ControllerService(pbg.ControllerServicer):
    def __init__(self, controller):
        self.c = controller

    @rpc
    def CreateVolume(self, req, ctx):
        vid, size, context = self.c.create(req)
        return pb.CreateVolumeResponse(volume=pb.Volume(volume_id=vid, capacity_bytes=size,
                                                        volume_context=context))

    @rpc
    def DeleteVolume(self, req, ctx):
        self.c.delete(req)
        return pb.DeleteVolumeResponse()

    @rpc
    def ValidateVolumeCapabilities(self, req, ctx):
        bad = self.c.validate(req)
        if bad:
            return pb.ValidateVolumeCapabilitiesResponse(message=bad)
        return pb.ValidateVolumeCapabilitiesResponse(
            confirmed=pb.ValidateVolumeCapabilitiesResponse.Confirmed(
                volume_context=req.volume_context, volume_capabilities=req.volume_capabilities,
                parameters=req.parameters))

    @rpc
    def ControllerGetCapabilities(self, req, ctx):
        R = pb.ControllerServiceCapability.RPC
        return pb.ControllerGetCapabilitiesResponse(capabilities=[
            pb.ControllerServiceCapability(rpc=R(type=t))
            for t in (R.CREATE_DELETE_VOLUME, R.EXPAND_VOLUME, R.SINGLE_NODE_MULTI_WRITER)])

    @rpc
    def ControllerExpandVolume(self, req, ctx):
        size = self.c.expand(req)
        return pb.ControllerExpandVolumeResponse(capacity_bytes=size,
                                                 node_expansion_required=False)


class NodeService(pbg.NodeServicer):
    def __init__(self, node):
        self.n = node

    @rpc
    def NodeStageVolume(self, req, ctx):
        self.n.stage(req)
        return pb.NodeStageVolumeResponse()

    @rpc
    def NodeUnstageVolume(self, req, ctx):
        self.n.unstage(req)
        return pb.NodeUnstageVolumeResponse()

    @rpc
    def NodePublishVolume(self, req, ctx):
        self.n.publish(req)
        return pb.NodePublishVolumeResponse()

    @rpc
    def NodeUnpublishVolume(self, req, ctx):
        self.n.unpublish(req)
        return pb.NodeUnpublishVolumeResponse()

    @rpc
    def NodeGetVolumeStats(self, req, ctx):
        return self.n.stats(req)

    @rpc
    def NodeExpandVolume(self, req, ctx):
        # The quota grew in ControllerExpandVolume; there is no file system to grow.
        if not req.volume_id or not req.volume_path:
            raise Error("INVALID_ARGUMENT", "volume_id and volume_path are required")
        return pb.NodeExpandVolumeResponse(capacity_bytes=req.capacity_range.required_bytes)

    @rpc
    def NodeGetCapabilities(self, req, ctx):
        R = pb.NodeServiceCapability.RPC
        return pb.NodeGetCapabilitiesResponse(capabilities=[
            pb.NodeServiceCapability(rpc=R(type=t))
            for t in (R.STAGE_UNSTAGE_VOLUME, R.GET_VOLUME_STATS, R.VOLUME_CONDITION,
                      R.SINGLE_NODE_MULTI_WRITER)])

    @rpc
    def NodeGetInfo(self, req, ctx):
        return pb.NodeGetInfoResponse(node_id=self.n.node_id)


def default_stoker():
    """The stoker binary: $STOKER_BIN, else the one beside this package's folder
    (build/stoker for build/python), else stoker on PATH."""
    env = os.environ.get("STOKER_BIN")
    if env:
        return env
    here = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))), "stoker")
    return here if os.access(here, os.X_OK) else (shutil.which("stoker") or "stoker")


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python3 -m stoker_csi",
                                description="Stoker's CSI driver (docs/csi.md)")
    p.add_argument("--endpoint", default=os.environ.get("CSI_ENDPOINT",
                                                        "unix:///csi/csi.sock"),
                   help="unix:///PATH of the socket to serve ($CSI_ENDPOINT)")
    p.add_argument("--mode", choices=("controller", "node", "all"), default="all")
    p.add_argument("--node-id", default=os.environ.get("NODE_ID") or os.uname().nodename)
    p.add_argument("--cluster", default=os.environ.get("STOKER_CLUSTER"),
                   help="default cluster, stk://HOST:PORT ($STOKER_CLUSTER)")
    p.add_argument("--key-file", default=os.environ.get("STOKER_KEY_FILE"),
                   help="default cluster key file ($STOKER_KEY_FILE)")
    p.add_argument("--root", default="/volumes",
                   help="folder of dynamically made volumes (StorageClass parameter root)")
    p.add_argument("--state-dir", default="/var/lib/kubelet/plugins/csi.stoker.io",
                   help="where the shared mounts and keys from secrets live")
    p.add_argument("--stoker", default=default_stoker(), help="the stoker binary")
    p.add_argument("--mount-launcher", default=os.environ.get("STOKER_CSI_MOUNT_LAUNCHER",
                                                              ""),
                   help="command put before `stoker mount` ({pid}: the driver's pid), to "
                   "run mount daemons outside the driver's container")
    p.add_argument("--workers", type=int, default=8)
    return p.parse_args(argv)


def serve(args):
    path = args.endpoint[len("unix://"):] if args.endpoint.startswith("unix://") else None
    if not path:
        raise SystemExit("stoker_csi: --endpoint must be unix:///PATH")
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    if os.path.exists(path):
        os.unlink(path)  # a socket left by a driver that died
    os.makedirs(args.state_dir, mode=0o755, exist_ok=True)
    clusters = Clusters(args.stoker, args.state_dir, args.cluster, args.key_file)
    caps = functools.partial(check_capabilities, pb=pb)
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=args.workers))
    controller = None
    if args.mode in ("controller", "all"):
        controller = Controller(clusters, args.root, caps)
        pbg.add_ControllerServicer_to_server(ControllerService(controller), server)
        if args.cluster:
            controller.sweep()
    if args.mode in ("node", "all"):
        pbg.add_NodeServicer_to_server(NodeService(Node(clusters, args.node_id, args.state_dir,
                                                        args.mount_launcher, pb)), server)
    pbg.add_IdentityServicer_to_server(Identity(controller), server)
    server.add_insecure_port("unix://" + path)
    server.start()
    log.info("%s %s serving %s (%s, node %s)", NAME, VERSION, path, args.mode, args.node_id)
    stop = threading.Event()
    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, lambda *_: stop.set())
    stop.wait()
    # Mounts stay: pods keep using them; the next driver finds them in the mount table.
    server.stop(5).wait()
    log.info("stopped")


def main(argv=None):
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s stoker-csi %(levelname)s %(message)s")
    serve(parse_args(sys.argv[1:] if argv is None else argv))
