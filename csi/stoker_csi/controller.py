"""The controller: volumes made, grown and removed as folders with quotas.

CreateVolume makes `ROOT/NAME`: ROOT is the StorageClass's `root` (else the
driver's --root), NAME comes from the claim (`NAMESPACE-CLAIM-PVNAME` when the
external provisioner passes the claim's name, `--extra-create-metadata`, else the
PV name the request carries). The folder is made as `ROOT/.creating-NAME`, given
its quota (bytes: the capacity asked for; inodes: the class's `inodes`, if any)
and renamed into place, so a folder under its final name always has its quota:
that is what makes a repeated CreateVolume answer from the folder alone (the
same capacity: the same volume; another: ALREADY_EXISTS) and lets a request that
died half-way be finished by the next one.

DeleteVolume renames the folder to `ROOT/.deleting-NAME-RANDOM` (one atomic step,
so the call is idempotent and quick) and removes the tree in the background;
what a driver killed meanwhile left is removed when a controller starts again.
Expansion raises the quota; a smaller size than the quota is answered with the
size it has (quotas never shrink under a volume).
"""
import logging
import os
import posixpath
import re
import threading

from .cluster import DYN, Error, clean_path, dyn_id, parse_id

log = logging.getLogger("stoker_csi")

K8S_PREFIX = "csi.storage.k8s.io/"
PARAMS = ("root", "inodes", "mode")
MAX_NAME = 200


def folder_name(name, params):
    """The volume's folder name: from the claim when its name is given."""
    ns = params.get(K8S_PREFIX + "pvc/namespace")
    claim = params.get(K8S_PREFIX + "pvc/name")
    base = "%s-%s-%s" % (ns, claim, name) if ns and claim else name
    base = re.sub(r"[^A-Za-z0-9._-]", "_", base).lstrip(".")
    if not base:
        raise Error("INVALID_ARGUMENT", "volume name %r makes no folder name" % name)
    return base[-MAX_NAME:]


def capacity(cr):
    """The byte quota for a CapacityRange (0: no limit asked for)."""
    if cr is None:
        return 0
    req, lim = cr.required_bytes, cr.limit_bytes
    if req < 0 or lim < 0:
        raise Error("INVALID_ARGUMENT", "capacity_range holds a negative size")
    if lim and req > lim:
        raise Error("OUT_OF_RANGE", "required_bytes %d above limit_bytes %d" % (req, lim))
    return req or lim


class Controller:
    def __init__(self, clusters, default_root, caps):
        self.clusters = clusters
        self.default_root = clean_path(default_root, "--root")
        self.caps = caps  # node.check_capabilities, shared with the node service
        self._lock = threading.Lock()

    # ---- CreateVolume ----

    def create(self, req):
        if not req.name:
            raise Error("INVALID_ARGUMENT", "name is required")
        if not req.volume_capabilities:
            raise Error("INVALID_ARGUMENT", "volume_capabilities are required")
        bad = self.caps(req.volume_capabilities)
        if bad:
            raise Error("INVALID_ARGUMENT", bad)
        if req.HasField("volume_content_source"):
            raise Error("INVALID_ARGUMENT", "volumes from snapshots or clones are not supported")
        size = capacity(req.capacity_range if req.HasField("capacity_range") else None)
        params = dict(req.parameters)
        for k in params:
            if k not in PARAMS and not k.startswith(K8S_PREFIX):
                raise Error("INVALID_ARGUMENT", "unknown parameter %r (known: %s)" %
                            (k, ", ".join(PARAMS)))
        root = clean_path(params.get("root", self.default_root), "parameter root")
        if root == "/":
            raise Error("INVALID_ARGUMENT", "parameter root must not be the cluster's root")
        try:
            inodes = int(params.get("inodes", "0"))
            mode = int(params.get("mode", "0777"), 8)
        except ValueError:
            raise Error("INVALID_ARGUMENT", "parameters inodes (a count) or mode (octal) "
                        "malformed")
        if inodes < 0 or not 0 <= mode <= 0o7777:
            raise Error("INVALID_ARGUMENT", "parameters inodes or mode out of range")
        url, key, _ = self.clusters.resolve(req.secrets)
        name = folder_name(req.name, params)
        path = root + "/" + name
        c = self.clusters.client(url, key)
        with self._lock:
            if c.exists(path):
                q = self.clusters.quota(url, key, path) or {}
                have = (q.get("limit_bytes", 0), q.get("limit_inodes", 0))
                if have != (size, inodes):
                    raise Error("ALREADY_EXISTS", "volume %s exists with %d bytes and %d "
                                "inodes, not %d and %d" % (path, have[0], have[1], size, inodes))
                log.info("CreateVolume %s: exists already", path)
            else:
                tmp = root + "/.creating-" + name
                c.makedirs(root, 0o755, exist_ok=True)
                try:
                    c.mkdir(tmp, mode)
                except FileExistsError:
                    pass  # a request that died half-way: finish it
                if size or inodes:
                    self.clusters.set_quota(url, key, tmp, size, inodes)
                c.rename(tmp, path)
                log.info("CreateVolume %s: made, %d bytes, %d inodes", path, size, inodes)
        return dyn_id(url, path), size, {"cluster": url, "path": path}

    # ---- DeleteVolume ----

    def delete(self, req):
        if not req.volume_id:
            raise Error("INVALID_ARGUMENT", "volume_id is required")
        parsed = parse_id(req.volume_id)
        if not parsed or not parsed[2]:
            # Not one this driver made (a static volume, or a stranger): nothing of
            # it is ever removed, and the call succeeds as for a volume that is gone.
            log.info("DeleteVolume %s: not a dynamic volume, left alone", req.volume_id)
            return
        url, path, _ = parsed
        if path.count("/") < 2:
            log.warning("DeleteVolume %s: refusing to remove a top-level folder", path)
            return
        key = self.clusters.key_file(req.secrets)
        if req.secrets.get("cluster"):
            url = self.clusters.resolve(req.secrets)[0]
        c = self.clusters.client(url, key)
        root, name = posixpath.split(path)
        with self._lock:
            if not c.exists(path):
                log.info("DeleteVolume %s: gone already", path)
                return
            trash = "%s/.deleting-%s-%s" % (root, name, os.urandom(4).hex())
            c.rename(path, trash)
        log.info("DeleteVolume %s: removing (as %s)", path, trash)
        threading.Thread(target=self._remove, args=(c, trash), daemon=True).start()

    def _remove(self, c, path):
        try:
            c.rmtree(path)
        except OSError as e:
            log.error("removing %s failed: %s (removed at the next start)", path, e)

    def sweep(self):
        """Removes what deletes interrupted left in the default root, in the background."""
        def run():
            try:
                url, key, _ = self.clusters.resolve()
                c = self.clusters.client(url, key)
                if not c.isdir(self.default_root):
                    return
                for name in c.listdir(self.default_root):
                    if name.startswith(".deleting-"):
                        self._remove(c, self.default_root + "/" + name)
            except (Error, OSError) as e:
                log.warning("sweeping %s: %s", self.default_root, e)
        threading.Thread(target=run, daemon=True).start()

    # ---- the volume's folder, for validation and expansion ----

    def locate(self, volume_id, secrets, context=None):
        """(url, key, path) of an existing volume; NOT_FOUND when it is not there."""
        if not volume_id:
            raise Error("INVALID_ARGUMENT", "volume_id is required")
        if not parse_id(volume_id) and not (context or {}).get("path"):
            raise Error("NOT_FOUND", "no volume %r" % volume_id)
        url, key, path = self.clusters.resolve(secrets, context, volume_id)
        if not self.clusters.client(url, key).isdir(path):
            raise Error("NOT_FOUND", "volume %s: no folder %s" % (volume_id, path))
        return url, key, path

    def validate(self, req):
        if not req.volume_id:
            raise Error("INVALID_ARGUMENT", "volume_id is required")
        if not req.volume_capabilities:
            raise Error("INVALID_ARGUMENT", "volume_capabilities are required")
        self.locate(req.volume_id, req.secrets, req.volume_context)
        return self.caps(req.volume_capabilities)

    def expand(self, req):
        if not req.volume_id:
            raise Error("INVALID_ARGUMENT", "volume_id is required")
        if not req.HasField("capacity_range"):
            raise Error("INVALID_ARGUMENT", "capacity_range is required")
        size = capacity(req.capacity_range)
        if not size:
            raise Error("INVALID_ARGUMENT", "capacity_range asks for no size")
        url, key, path = self.locate(req.volume_id, req.secrets)
        with self._lock:
            q = self.clusters.quota(url, key, path) or {}
            limit = q.get("limit_bytes", 0)
            if limit and limit >= size:
                return limit
            self.clusters.set_quota(url, key, path, size, q.get("limit_inodes", 0))
        log.info("ControllerExpandVolume %s: %d -> %d bytes", path, limit, size)
        return size


__all__ = ["Controller", "DYN"]
