#!/usr/bin/env bash
# Installs what building and testing Stoker needs on Debian 12, and nothing else.
# Skips apt entirely when every package is already there (fast, works offline).
set -euo pipefail
PKGS=(make gcc clang libclang-rt-14-dev pkg-config
      libfuse3-dev fuse3 liburing-dev liblmdb-dev libisal-dev libxxhash-dev
      libssl-dev libexpat1-dev awscli python3-boto3 s3cmd
      python3 python3-pytest python3-pytest-xdist procps util-linux curl openssl
      python3-dev python3-numpy python3-torch python3-filelock
      libmicrohttpd-dev prometheus libcurl4-openssl-dev libjansson-dev etcd-server
      nfs-ganesha nfs-ganesha-vfs rpcbind libnfs-utils libnfs-dev
      samba smbclient python3-smbc
      python3-impacket  # its SMB3 client sends SMB2 byte-range LOCKs (test_smb.py)
      xxd   # embeds the dashboard's files into the binary (src/mgmtd/ui/)
      chromium chromium-driver python3-selenium  # the dashboard's browser test
      python3-grpcio python3-grpc-tools python3-kubernetes  # the CSI driver and its tests
      openmpi-bin rsync  # `stoker sync` under mpirun (tests); rsync: its benchmark
      gdb)  # gdb: backtraces of a daemon a test finds hung
missing=()
for p in "${PKGS[@]}"; do
	dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	SUDO=""
	[ "$(id -u)" = 0 ] || SUDO="sudo"
	echo "installing: ${missing[*]}"
	$SUDO apt-get update -q
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${missing[@]}"
fi
