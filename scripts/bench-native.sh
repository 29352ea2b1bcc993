#!/usr/bin/env bash
# Big-file sequential read through the native client against the same bytes read
# through the local file system on the same disk, cold cache, in one run; then
# `stoker bench`. Prints a Markdown table for docs/BENCHMARKS.md.
#
#   sudo bash scripts/bench-native.sh [SIZE_MB] [DIR]
#
# DIR (default /var/tmp/stoker-bench) must be on the disk to measure; the cluster's
# targets and the local copy both live there. Needs root to drop the page cache.
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE_MB=${1:-2048}
DIR=${2:-/var/tmp/stoker-bench}
S=$PWD/build/stoker
[ "$(id -u)" = 0 ] || { echo "needs root (drops the page cache between runs)"; exit 1; }
make -j"$(nproc)" >/dev/null
$S down --data "$DIR/cluster" >/dev/null 2>&1 || true
rm -rf "$DIR"; mkdir -p "$DIR"
PORT=${STOKER_BENCH_PORT:-9700}
$S up --data "$DIR/cluster" --daemon --port "$PORT" >/dev/null
export STOKER_CLUSTER=stk://127.0.0.1:$PORT
trap '$S down --data "$DIR/cluster" >/dev/null 2>&1 || true' EXIT

drop() { sync; echo 3 >/proc/sys/vm/drop_caches; }
now() { date +%s.%N; }
mbps() { awk -v b="$1" -v s="$2" -v e="$3" 'BEGIN { printf "%.0f", b / (e - s) / 1e6 }'; }
BYTES=$((SIZE_MB << 20))

head -c "$BYTES" /dev/urandom >"$DIR/local.bin"
$S put "$DIR/local.bin" /big.bin

runs=${RUNS:-3}
for i in $(seq 1 "$runs"); do
	drop; a=$(now); dd if="$DIR/local.bin" of=/dev/null bs=1M status=none; b=$(now)
	L[$i]=$(mbps $BYTES "$a" "$b")
	drop; a=$(now); $S cat /big.bin >/dev/null; b=$(now)
	N[$i]=$(mbps $BYTES "$a" "$b")
done
med() { printf '%s\n' "$@" | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
LM=$(med "${L[@]}"); NM=$(med "${N[@]}")
echo "| workload | local FS | Stoker native | ratio |"
echo "|---|---|---|---|"
echo "| ${SIZE_MB} MiB sequential read, cold, 1 MiB requests (local) vs 16 MiB (Stoker), median of $runs | $LM MB/s | $NM MB/s | $(awk -v n="$NM" -v l="$LM" 'BEGIN{printf "%.2f", n/l}') |"
echo
echo "runs: local ${L[*]} MB/s; stoker ${N[*]} MB/s"
echo
$S bench --threads 4 --size 1G --files 2000 /bench
