#!/usr/bin/env bash
# The cost of client rights on the W3/W4 metadata rates (docs/BENCHMARKS.md, issue
# 26): the shared peers' W3 (16 KiB files created with sync, then read) and W4
# (create, stat, unlink of empty files) in one folder /team of one cluster, through
# two mounts of it, alternately: one with the cluster key (the folder as
# MNT/team) and one with a client key confined to /team (`stoker admin client add
# team --subtree /team`; the folder is its root), ROUNDS times each, so that the
# machine's drift falls on both alike. Prints each run's rates and the ratio
# client key / cluster key of their medians.
#
#   bash scripts/bench-clientkey.sh      # ROUNDS=2, W3_FILES=4000, W4_FILES=2500
#
# Needs root (the mounts, drop_caches). Data under $CBENCH (default
# /var/tmp/cbench), removed at the end; PORT (default 10400) and the two above it.
set -euo pipefail
cd "$(dirname "$0")/.."
STOKER=${STOKER:-$PWD/build/stoker}
TOOL="/usr/bin/python3 ${PEERS:-$PWD/../shared/peers}/pbtool.py"
[ -f "${PEERS:-$PWD/../shared/peers}/pbtool.py" ] || TOOL="/usr/bin/python3 /work/shared/peers/pbtool.py"
DATA=${CBENCH:-/var/tmp/cbench}
ROUNDS=${ROUNDS:-2}
W3_FILES=${W3_FILES:-4000}
W4_FILES=${W4_FILES:-2500}
PORT=${PORT:-10400}
MNT=$DATA/mnt
MNTK=$DATA/mntk
rm -rf "$DATA"
mkdir -p "$DATA" "$MNT" "$MNTK"
"$STOKER" up --data "$DATA/stk" --daemon --port "$PORT" --mount "$MNT" >/dev/null
cleanup() {
	"$STOKER" umount "$MNTK" >/dev/null 2>&1 || true
	"$STOKER" umount "$MNT" >/dev/null 2>&1 || true
	"$STOKER" down --data "$DATA/stk" >/dev/null 2>&1 || true
	grep -q " $DATA/" /proc/mounts || rm -rf "$DATA"
}
trap cleanup EXIT
export STOKER_CLUSTER=stk://127.0.0.1:$PORT
mkdir "$MNT/team"
"$STOKER" admin client add team --subtree /team --key-out "$DATA/team.key" >/dev/null
"$STOKER" mount "$STOKER_CLUSTER" "$MNTK" -o "key=$DATA/team.key,log=$DATA/mntk.log"
out=$DATA/results.tsv
: >"$out"
for r in $(seq "$ROUNDS"); do
	for kind in cluster client; do
		if [ $kind = cluster ]; then d=$MNT/team/$kind$r; else d=$MNTK/$kind$r; fi
		mkdir -p "$d"
		sync; echo 3 >/proc/sys/vm/drop_caches
		$TOOL smallfiles "$d/w3" --files "$W3_FILES" --dirs 40 --size 16384 --threads 8 |
			awk -v k="$kind" '{print k "\tW3_" $1 "\t" $2}' >>"$out"
		$TOOL meta "$d/w4" --threads 4 --files "$W4_FILES" --readdir 5000 |
			awk -v k="$kind" '{print k "\tW4_" $1 "\t" $2}' >>"$out"
		rm -rf "$d"
	done
done
/usr/bin/python3 - "$out" <<'PY'
import collections, statistics, sys
runs = collections.defaultdict(lambda: collections.defaultdict(list))
for line in open(sys.argv[1]):
    kind, metric, value = line.split("\t")
    try:
        runs[metric][kind].append(float(value))
    except ValueError:
        pass
print("| metric | cluster key (runs) | client key (runs) | client / cluster |")
print("|---|---|---|---|")
for metric in sorted(runs):
    a, b = runs[metric]["cluster"], runs[metric]["client"]
    if not a or not b or "ops" not in metric and "files" not in metric:
        continue
    ratio = statistics.median(b) / statistics.median(a) if statistics.median(a) else 0
    print("| %s | %s | %s | %.3f |" % (metric, ", ".join("%.0f" % x for x in a),
                                        ", ".join("%.0f" % x for x in b), ratio))
PY
