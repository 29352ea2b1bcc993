#!/usr/bin/env bash
# The cost of quotas on the W3/W4 metadata rates (docs/BENCHMARKS.md, issue 26):
# the shared peers' W3 (16 KiB files created with sync, then read) and W4 (create,
# stat, unlink of empty files) on one Stoker mount, alternately in a folder without
# a quota and in one with a quota (bytes and inodes, far from full), ROUNDS times
# each, so that the machine's drift falls on both alike. Prints each run's rates
# and the ratio quota / none of their medians.
#
#   bash scripts/bench-quota.sh             # ROUNDS=2, W3_FILES=4000, W4_FILES=2500
#
# Needs root (the mount, drop_caches). Data under $QBENCH (default /var/tmp/qbench).
set -euo pipefail
cd "$(dirname "$0")/.."
STOKER=${STOKER:-$PWD/build/stoker}
TOOL="/usr/bin/python3 ${PEERS:-$PWD/../shared/peers}/pbtool.py"
[ -f "${PEERS:-$PWD/../shared/peers}/pbtool.py" ] || TOOL="/usr/bin/python3 /work/shared/peers/pbtool.py"
DATA=${QBENCH:-/var/tmp/qbench}
ROUNDS=${ROUNDS:-2}
W3_FILES=${W3_FILES:-4000}
W4_FILES=${W4_FILES:-2500}
PORT=${PORT:-17400}
MNT=$DATA/mnt
rm -rf "$DATA"
mkdir -p "$DATA" "$MNT"
"$STOKER" up --data "$DATA/stk" --daemon --port "$PORT" --mount "$MNT" >/dev/null
trap '"$STOKER" umount "$MNT" >/dev/null 2>&1; "$STOKER" down --data "$DATA/stk" >/dev/null 2>&1' EXIT
export STOKER_CLUSTER=stk://127.0.0.1:$PORT
mkdir "$MNT/none" "$MNT/quota"
"$STOKER" quota set /quota --bytes 1T --inodes 100M >/dev/null
out=$DATA/results.tsv
: >"$out"
for r in $(seq "$ROUNDS"); do
	# each order in turn: the one run second finds the first's removals in flight
	order="none quota"
	[ $((r % 2)) = 0 ] && order="quota none"
	for kind in $order; do
		d=$MNT/$kind/r$r
		mkdir -p "$d"
		sync; echo 3 >/proc/sys/vm/drop_caches
		$TOOL smallfiles "$d/w3" --files "$W3_FILES" --dirs 40 --size 16384 --threads 8 |
			awk -v k="$kind" '{print k "\tW3_" $1 "\t" $2}' >>"$out"
		$TOOL meta "$d/w4" --threads 4 --files "$W4_FILES" --readdir 5000 |
			awk -v k="$kind" '{print k "\tW4_" $1 "\t" $2}' >>"$out"
		rm -rf "$d"
	done
done
"$STOKER" quota ls /quota
/usr/bin/python3 - "$out" <<'PY'
import collections, statistics, sys
runs = collections.defaultdict(lambda: collections.defaultdict(list))
for line in open(sys.argv[1]):
    kind, metric, value = line.split("\t")
    try:
        runs[metric][kind].append(float(value))
    except ValueError:
        pass
print("| metric | none (runs) | quota (runs) | quota / none |")
print("|---|---|---|---|")
for metric in sorted(runs):
    a, b = runs[metric]["none"], runs[metric]["quota"]
    if not a or not b or "ops" not in metric and "files" not in metric:
        continue
    ratio = statistics.median(b) / statistics.median(a) if statistics.median(a) else 0
    print("| %s | %s | %s | %.3f |" % (metric, ", ".join("%.0f" % x for x in a),
                                        ", ".join("%.0f" % x for x in b), ratio))
PY
