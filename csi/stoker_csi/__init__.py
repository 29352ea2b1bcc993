"""Stoker's CSI driver: the control plane that lets Kubernetes hand Stoker folders to
pods as volumes (docs/csi.md).

A volume is a folder with a byte quota. The driver only manages: it makes and
removes folders and sets their quotas through libstoker (the `stoker` package)
and the `stoker quota` command, and on a node it runs one `stoker mount` per
cluster and bind-mounts volume folders of it into pods. No file data passes
through it.

Modules: `cluster` (addresses, keys, volume ids, the `stoker` commands),
`controller` (CreateVolume, DeleteVolume, expansion), `node` (stage, publish,
stats), `mounts` (the kernel's mount table, bind mounts, the shared mounts),
`server` (the gRPC services and `python3 -m stoker_csi`).
"""

NAME = "csi.stoker.io"
VERSION = "0.1.0"
