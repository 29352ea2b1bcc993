"""python3 -m stoker_csi: runs the CSI driver (server.py, docs/csi.md)."""
from .server import main

main()
