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
