#!/usr/bin/env bash
# Stoker's main job on its embedded default: builds, starts a one-machine cluster
# (mgmtd, meta, storage with 4 targets) in /tmp/stoker-demo, writes a sample
# dataset through the native client, reads it back, checks every byte, and prints
# what it measured. The cluster keeps running afterwards; stop it with
#   build/stoker down --data /tmp/stoker-demo
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
make -j"$(nproc)" >/dev/null
S=build/stoker
DATA=${STOKER_DEMO_DIR:-/tmp/stoker-demo}
SIZE_MB=${STOKER_DEMO_MB:-1024}
$S down --data "$DATA" >/dev/null 2>&1 || true
$S up --data "$DATA" --daemon
$S status

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
echo
echo "Making a sample dataset: one ${SIZE_MB} MiB file and 500 files of 64 KiB..."
head -c "$((SIZE_MB << 20))" /dev/urandom >"$WORK/big.bin"
mkdir "$WORK/small"
for i in $(seq 0 499); do head -c 65536 /dev/urandom >"$WORK/small/$i.bin"; done

t() { date +%s.%N; }
rate() { awk -v b="$1" -v s="$2" -v e="$3" 'BEGIN { printf "%.0f MB/s", b / (e - s) / 1e6 }'; }
$S mkdir -p /demo/small
a=$(t); $S put "$WORK/big.bin" /demo/big.bin; b=$(t)
echo "write ${SIZE_MB} MiB through the native client: $(rate $((SIZE_MB << 20)) "$a" "$b")"
[ "$(id -u)" = 0 ] && sync && echo 3 >/proc/sys/vm/drop_caches
a=$(t); $S get /demo/big.bin "$WORK/big.back"; b=$(t)
echo "read it back, cold cache:                  $(rate $((SIZE_MB << 20)) "$a" "$b")"
cmp "$WORK/big.bin" "$WORK/big.back" && echo "every byte matches"
a=$(t)
for i in $(seq 0 499); do $S put "$WORK/small/$i.bin" "/demo/small/$i.bin"; done
b=$(t)
echo "500 small files written (one CLI process each): $(awk -v s="$a" -v e="$b" 'BEGIN{printf "%.0f files/s", 500/(e-s)}')"
$S ls /demo/small | wc -l | xargs echo "files listed:"
echo
echo "The built-in benchmark (stoker bench, 4 threads):"
$S bench --threads 4 --size 512M --files 1000
echo
echo "The cluster is still running: try 'build/stoker ls -l /demo'."
echo "Stop it with: build/stoker down --data $DATA"
