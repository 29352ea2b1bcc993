"""The node: one Stoker mount per cluster, bind mounts of volume folders.

NodeStageVolume makes sure the node has a Stoker mount of the volume's cluster,
`STATE/mounts/HASH` (one per cluster, key and set of mount options: every volume
of a StorageClass shares it), started with `stoker mount ... -o allow_other,...`
if there is none or the one there is dead, and bind-mounts the volume's folder of
it on the staging path. NodePublishVolume bind-mounts the staging path on the
pod's target path, read-only for a read-only publish or access mode.
NodeUnstageVolume removes the staging bind and, when no bind of the shared
mount is left on the node, unmounts it (`stoker umount`, which waits for the
daemon to flush and exit).

The mount daemons are processes of their own (`stoker mount` puts its daemon in
a session of its own), so the driver can die and restart under running pods: the
pods keep their binds and the daemons serve them; the restarted driver finds
everything again in the mount table (mounts.py). Where the driver runs in a
container, `--mount-launcher` starts the daemons outside its lifetime
(docs/csi.md).
"""
import errno
import hashlib
import logging
import os
import re
import shlex
import subprocess
import threading

from . import mounts
from .cluster import Error

log = logging.getLogger("stoker_csi")

OPT_RE = re.compile(r"^[A-Za-z0-9_.:=/+-]+$")
# Options of the shared mount that the driver sets itself or that belong to the
# bind mounts (ro), never to the mount shared by every volume.
OWN_OPTS = ("log", "ro", "rw", "allow_other", "nonempty")


def check_capabilities(caps, pb):
    """'' when the driver supports every capability, else why not. A capability
    missing its required fields is INVALID_ARGUMENT (raised)."""
    for c in caps:
        if not c.HasField("access_mode") or \
                c.access_mode.mode == pb.VolumeCapability.AccessMode.UNKNOWN:
            raise Error("INVALID_ARGUMENT", "a volume capability has no access_mode")
        which = c.WhichOneof("access_type")
        if which is None:
            raise Error("INVALID_ARGUMENT", "a volume capability has no access_type")
        if which == "block":
            return "block volumes are not supported: Stoker volumes are file systems"
    return ""


def mount_options(cap):
    """(options of the shared mount, sorted; read-only asked in the flags)."""
    opts, ro = set(), False
    flags = cap.mount.mount_flags if cap.WhichOneof("access_type") == "mount" else []
    for flag in flags:
        for o in flag.split(","):
            o = o.strip()
            if not o:
                continue
            if not OPT_RE.match(o):
                raise Error("INVALID_ARGUMENT", "mount option %r malformed" % o)
            name = o.split("=", 1)[0]
            if name == "ro":
                ro = True
            if name in OWN_OPTS:
                continue
            opts.add(o)
    return sorted(opts), ro


class Node:
    def __init__(self, clusters, node_id, state_dir, launcher, pb):
        self.clusters = clusters
        self.node_id = node_id
        self.dir = os.path.join(state_dir, "mounts")
        self.launcher = launcher
        self.pb = pb
        self._lock = threading.Lock()
        os.makedirs(self.dir, mode=0o755, exist_ok=True)

    def readonly_mode(self, cap):
        m = self.pb.VolumeCapability.AccessMode
        return cap.access_mode.mode in (m.SINGLE_NODE_READER_ONLY, m.MULTI_NODE_READER_ONLY)

    def _check(self, cap):
        bad = check_capabilities([cap], self.pb)
        if bad:
            raise Error("INVALID_ARGUMENT", bad)

    # ---- the shared mount ----

    def shared_point(self, url, key, opts):
        h = hashlib.sha256("\0".join([url, key or ""] + opts).encode()).hexdigest()[:16]
        return os.path.join(self.dir, h)

    def ensure_shared(self, url, key, opts):
        mp = self.shared_point(url, key, opts)
        e = mounts.at(mp)
        if e is not None and mounts.alive(mp):
            return mp, e
        if e is not None:
            log.warning("shared mount %s is dead (its daemon is gone): mounting it again", mp)
            self._umount_shared(mp)
        os.makedirs(mp, exist_ok=True)
        args = [self.clusters.stoker_bin, "mount", url, mp, "-o",
                ",".join(["allow_other", "log=" + mp + ".log"] + opts)]
        prefix = [a.replace("{pid}", str(os.getpid())) for a in shlex.split(self.launcher)]
        p = subprocess.run(prefix + args, capture_output=True, text=True,
                           env=self.clusters.env(url, key), timeout=120)
        if p.returncode != 0:
            msg = p.stderr.strip() or "exit %d" % p.returncode
            code = "INVALID_ARGUMENT" if "option" in msg else "INTERNAL"
            raise Error(code, "stoker mount %s: %s" % (url, msg))
        e = mounts.at(mp)
        if e is None:
            raise Error("INTERNAL", "stoker mount %s said 0 but %s is not mounted" % (url, mp))
        log.info("mounted %s on %s (-o %s)", url, mp, ",".join(opts) or "-")
        return mp, e

    def _umount_shared(self, mp):
        p = subprocess.run([self.clusters.stoker_bin, "umount", mp], capture_output=True,
                           text=True, timeout=180)
        if p.returncode != 0 and mounts.at(mp) is not None:
            log.warning("stoker umount %s: %s; detaching it", mp, p.stderr.strip())
            subprocess.run([self.clusters.stoker_bin, "umount", "-l", mp], capture_output=True)
        try:
            os.rmdir(mp)
        except OSError:
            pass

    def _release(self, dev):
        """Unmounts the shared mount of file system dev when nothing uses it."""
        for e in mounts.table():
            if e.dev == dev and os.path.dirname(e.point) == self.dir:
                if not mounts.users(dev, e.point):
                    log.info("no volume uses %s any more: unmounting it", e.point)
                    self._umount_shared(e.point)
                return

    # ---- stage ----

    def stage(self, req):
        if not req.volume_id:
            raise Error("INVALID_ARGUMENT", "volume_id is required")
        if not req.staging_target_path:
            raise Error("INVALID_ARGUMENT", "staging_target_path is required")
        if not req.HasField("volume_capability"):
            raise Error("INVALID_ARGUMENT", "volume_capability is required")
        self._check(req.volume_capability)
        url, key, path = self.clusters.resolve(req.secrets, req.volume_context, req.volume_id)
        if path is None:
            raise Error("INVALID_ARGUMENT", "volume %s names no folder: give a static volume "
                        "the attribute 'path'" % req.volume_id)
        opts, _ = mount_options(req.volume_capability)
        staging = os.path.normpath(req.staging_target_path)
        with self._lock:
            mp, shared = self.ensure_shared(url, key, opts)
            e = mounts.at(staging)
            if e is not None and mounts.alive(staging):
                if e.dev == shared.dev and e.root == path:
                    return
                raise Error("ALREADY_EXISTS", "%s holds another mount (%s %s)" %
                            (staging, e.source, e.root))
            if e is not None:
                mounts.unmount_all(staging)
            src = mp + path
            if not os.path.isdir(src):
                raise Error("NOT_FOUND", "volume %s: no folder %s in %s" % (req.volume_id, path,
                                                                           url))
            os.makedirs(staging, exist_ok=True)
            mounts.bind(src, staging, False)
            log.info("NodeStageVolume %s: %s%s on %s", req.volume_id, url, path, staging)

    def unstage(self, req):
        if not req.volume_id:
            raise Error("INVALID_ARGUMENT", "volume_id is required")
        if not req.staging_target_path:
            raise Error("INVALID_ARGUMENT", "staging_target_path is required")
        staging = os.path.normpath(req.staging_target_path)
        with self._lock:
            e = mounts.at(staging)
            if e is None:
                return
            mounts.unmount_all(staging)
            log.info("NodeUnstageVolume %s: %s unmounted", req.volume_id, staging)
            self._release(e.dev)

    # ---- publish ----

    def publish(self, req):
        if not req.volume_id:
            raise Error("INVALID_ARGUMENT", "volume_id is required")
        if not req.staging_target_path:
            raise Error("INVALID_ARGUMENT", "staging_target_path is required")
        if not req.target_path:
            raise Error("INVALID_ARGUMENT", "target_path is required")
        if not req.HasField("volume_capability"):
            raise Error("INVALID_ARGUMENT", "volume_capability is required")
        self._check(req.volume_capability)
        _, ro_flag = mount_options(req.volume_capability)
        ro = req.readonly or ro_flag or self.readonly_mode(req.volume_capability)
        staging = os.path.normpath(req.staging_target_path)
        target = os.path.normpath(req.target_path)
        with self._lock:
            se = mounts.at(staging)
            if se is None or not mounts.alive(staging):
                raise Error("FAILED_PRECONDITION", "volume %s is not staged on %s" %
                            (req.volume_id, staging))
            te = mounts.at(target)
            if te is not None and mounts.alive(target):
                if te.dev == se.dev and te.root == se.root and te.readonly == ro:
                    return
                raise Error("ALREADY_EXISTS", "%s is published already, differently" % target)
            if te is not None:
                mounts.unmount_all(target)
            os.makedirs(target, exist_ok=True)
            mounts.bind(staging, target, ro)
            log.info("NodePublishVolume %s: %s on %s%s", req.volume_id, staging, target,
                     " (read-only)" if ro else "")

    def unpublish(self, req):
        if not req.volume_id:
            raise Error("INVALID_ARGUMENT", "volume_id is required")
        if not req.target_path:
            raise Error("INVALID_ARGUMENT", "target_path is required")
        target = os.path.normpath(req.target_path)
        with self._lock:
            if mounts.at(target) is not None:
                mounts.unmount_all(target)
            try:
                os.rmdir(target)
            except FileNotFoundError:
                pass
            except OSError as e:
                log.warning("NodeUnpublishVolume: leaving %s: %s", target, e)
            log.info("NodeUnpublishVolume %s: %s", req.volume_id, target)

    # ---- stats ----

    def stats(self, req):
        """Bytes and inodes of the volume as its folder's quota shows them (statfs of
        a quota folder answers with the quota, docs/quotas.md "df"); a dead mount is
        an abnormal condition, not an error."""
        if not req.volume_id:
            raise Error("INVALID_ARGUMENT", "volume_id is required")
        if not req.volume_path:
            raise Error("INVALID_ARGUMENT", "volume_path is required")
        pb = self.pb
        try:
            st = os.statvfs(req.volume_path)
        except FileNotFoundError:
            raise Error("NOT_FOUND", "no volume at %s" % req.volume_path)
        except OSError as e:
            if e.errno in mounts.DEAD:
                return pb.NodeGetVolumeStatsResponse(volume_condition=pb.VolumeCondition(
                    abnormal=True, message="%s: %s (its Stoker mount is gone; the pod needs "
                    "a restart)" % (req.volume_path, os.strerror(e.errno))))
            raise
        bs = st.f_frsize or st.f_bsize
        total, free = st.f_blocks * bs, st.f_bavail * bs
        U = pb.VolumeUsage
        return pb.NodeGetVolumeStatsResponse(
            usage=[U(unit=U.BYTES, total=total, available=free,
                     used=max(0, total - st.f_bfree * bs)),
                   U(unit=U.INODES, total=st.f_files, available=st.f_ffree,
                     used=max(0, st.f_files - st.f_ffree))],
            volume_condition=pb.VolumeCondition(abnormal=False, message="healthy"))
