#!/usr/bin/env bash
# What three copies cost: `stoker bench` on a one-machine cluster of 3 storage
# nodes (`stoker up --nodes 3`) with one copy of each chunk and with three,
# alternated over ROUNDS rounds in one run, beside a local write and read of the
# same size on the same disk. Prints a Markdown table (medians) for
# docs/BENCHMARKS.md.
#
#   bash scripts/bench-replication.sh [SIZE] [DIR]
#
# SIZE (default 512M) is the big file; DIR (default /var/tmp/stoker-repl) must be
# on the disk to measure. ROUNDS (default 3), THREADS (default 4), FILES (default
# 1000) and STOKER_BENCH_PORT (default 9760) may be set.
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE=${1:-512M}
DIR=${2:-/var/tmp/stoker-repl}
ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-4}
FILES=${FILES:-1000}
PORT=${STOKER_BENCH_PORT:-9760}
S=$PWD/build/stoker
make -j"$(nproc)" >/dev/null
rm -rf "$DIR"
mkdir -p "$DIR"
cleanup() { for r in 1 3; do $S down --data "$DIR/r$r" >/dev/null 2>&1 || true; done; }
trap cleanup EXIT

BYTES=$(numfmt --from=iec "$SIZE")
declare -A V # V[R,name,round] = value
names=("big write" "big read" "4K rand read" "small write" "small read" "create")

bench_one() { # R round
	local r=$1 i=$2
	$S up --nodes 3 --replicas "$r" --data "$DIR/r$r" --port "$PORT" --daemon >/dev/null
	STOKER_CLUSTER=stk://127.0.0.1:$PORT $S bench --threads "$THREADS" --size "$SIZE" \
		--files "$FILES" --json /b >"$DIR/r$r.$i.json"
	$S down --data "$DIR/r$r" >/dev/null
	rm -rf "$DIR/r$r"
	for n in "${names[@]}"; do
		V[$r,$n,$i]=$(python3 -c 'import json,sys
d=json.load(open(sys.argv[1]))
print([x["value"] for x in d["results"] if x["name"]==sys.argv[2]][0])' "$DIR/r$r.$i.json" "$n")
	done
}

local_one() { # round: write with fsync, then read cold-ish (the page cache dropped if root)
	local i=$1 a b
	a=$(date +%s.%N)
	dd if=/dev/zero of="$DIR/local.bin" bs=1M count=$((BYTES >> 20)) conv=fsync status=none
	b=$(date +%s.%N)
	V[L,big write,$i]=$(awk -v n="$BYTES" -v a="$a" -v b="$b" 'BEGIN{printf "%.1f", n/(b-a)/1e6}')
	[ "$(id -u)" = 0 ] && { sync; echo 3 >/proc/sys/vm/drop_caches; }
	a=$(date +%s.%N)
	dd if="$DIR/local.bin" of=/dev/null bs=1M status=none
	b=$(date +%s.%N)
	V[L,big read,$i]=$(awk -v n="$BYTES" -v a="$a" -v b="$b" 'BEGIN{printf "%.1f", n/(b-a)/1e6}')
	rm -f "$DIR/local.bin"
}

for i in $(seq 1 "$ROUNDS"); do
	echo "round $i of $ROUNDS" >&2
	local_one "$i"
	if [ $((i % 2)) = 1 ]; then bench_one 1 "$i"; bench_one 3 "$i"; else bench_one 3 "$i"; bench_one 1 "$i"; fi
done

med() { printf '%s\n' "$@" | sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
echo "| workload | local FS | R=1 | R=3 | R=3 / R=1 | R=3 / local |"
echo "|---|---|---|---|---|---|"
for n in "${names[@]}"; do
	one=(); three=(); loc=()
	for i in $(seq 1 "$ROUNDS"); do
		one+=("${V[1,$n,$i]}"); three+=("${V[3,$n,$i]}")
		[ -n "${V[L,$n,$i]:-}" ] && loc+=("${V[L,$n,$i]}")
	done
	m1=$(med "${one[@]}"); m3=$(med "${three[@]}")
	if [ ${#loc[@]} -gt 0 ]; then ml=$(med "${loc[@]}"); else ml=""; fi
	unit=$(python3 -c 'import json,sys
d=json.load(open(sys.argv[1]))
print([x["unit"] for x in d["results"] if x["name"]==sys.argv[2]][0])' "$DIR/r1.1.json" "$n")
	awk -v n="$n" -v u="$unit" -v l="$ml" -v a="$m1" -v b="$m3" 'BEGIN {
		printf "| %s (%s) | %s | %s | %s | %.2f | %s |\n", n, u, (l == "" ? "-" : l), a, b, b / a,
		       (l == "" ? "-" : sprintf("%.2f", b / l)) }'
done
echo
echo "rounds: $ROUNDS alternated, size $SIZE, $THREADS threads, $FILES small files; $(date -u +%F)"
