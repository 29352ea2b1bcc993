#!/usr/bin/env bash
# What counting costs: `stoker bench` against a cluster with metrics on (`stoker up`)
# and off (`stoker up --no-metrics`: no endpoint, nothing counted), in interleaved
# rounds (on, off, off, on, ...) so that drift of the machine hits both alike. Prints
# per workload the median of each side and the ratio on/off (higher-is-better
# figures: below 1 means metrics cost something; the spread between rounds of one
# side is printed too, a ratio inside it is noise).
#
#   bash scripts/bench-metrics.sh [ROUNDS] [SIZE] [FILES] [DIR]
#
# Defaults: 6 rounds, --size 1G, --files 2000, DIR /var/tmp/stoker-bench-metrics (on
# the disk to measure). A smoke run: bash scripts/bench-metrics.sh 2 64M 200
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-6}
SIZE=${2:-1G}
FILES=${3:-2000}
DIR=${4:-/var/tmp/stoker-bench-metrics}
S=$PWD/build/stoker
PORT=${STOKER_BENCH_PORT:-9730}
make -j"$(nproc)" >/dev/null
$S down --data "$DIR/cluster" >/dev/null 2>&1 || true
rm -rf "$DIR"; mkdir -p "$DIR"
trap '$S down --data "$DIR/cluster" >/dev/null 2>&1 || true' EXIT
export STOKER_CLUSTER=stk://127.0.0.1:$PORT

# one round: a fresh cluster, one `stoker bench`, "workload<TAB>value" lines
round() { # $1: on|off, $2: output file
	local flag=""
	[ "$1" = off ] && flag=--no-metrics
	$S up --data "$DIR/cluster" --daemon --port "$PORT" $flag >/dev/null
	$S bench --threads 4 --size "$SIZE" --files "$FILES" /bench |
		awk -F'|' '/^\| / && $3 ~ /[0-9]/ && $2 !~ /workload/ {
			w = $2; gsub(/^ +| +$/, "", w); v = $3; gsub(/[^0-9.]/, "", v); print w "\t" v }' >"$2"
	$S down --data "$DIR/cluster" >/dev/null
	rm -rf "$DIR/cluster"
}

for i in $(seq 1 "$ROUNDS"); do
	if [ $((i % 2)) = 1 ]; then order="on off"; else order="off on"; fi
	for side in $order; do
		echo "round $i: metrics $side" >&2
		round "$side" "$DIR/$side.$i"
	done
done

cat "$DIR"/on.* "$DIR"/off.* >/dev/null
echo "| workload | metrics on (median of $ROUNDS) | off | ratio on/off | spread on | spread off |"
echo "|---|---|---|---|---|---|"
for f in "$DIR"/on.* "$DIR"/off.*; do
	side=${f##*/}; side=${side%%.*}
	sed "s/^/$side\t/" "$f"
done | awk -F'\t' '
	{ k = $2; if (!(k in seen)) { seen[k] = 1; order[++n] = k }
	  v[$1, k, ++c[$1, k]] = $3 }
	function med(s, k,   m, i, j, t, a) {
		m = c[s, k]; for (i = 1; i <= m; i++) a[i] = v[s, k, i]
		for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
		lo[s] = a[1]; hi[s] = a[m]
		return m % 2 ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2 }
	END { for (i = 1; i <= n; i++) { k = order[i]; on = med("on", k); off = med("off", k)
		printf "| %s | %g | %g | %.2f | %.2f | %.2f |\n", k, on, off, off ? on / off : 0,
		       lo["on"] ? hi["on"] / lo["on"] : 0, lo["off"] ? hi["off"] / lo["off"] : 0 } }'
