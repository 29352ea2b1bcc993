#!/usr/bin/env bash
# Runs the shared peer workloads (../shared/peers/peerbench.sh: W1 sequential, W2 4 KiB
# random, W3 16 KiB files, W4 metadata, W5 checkpoint under readers, W6 loader) on the
# local file system, on a Stoker mount (`stoker up --mount`, one machine), and on the
# GlusterFS and MooseFS mounts that ../shared/peers sets up, one after the other in one
# run, then prints the markdown table of ../shared/peers/summarize.py and the ratios of
# Stoker against local and against the best peer.
#
#   bash scripts/bench-peers.sh                # everything (about 25 minutes)
#   TARGETS="local stoker" bash scripts/bench-peers.sh
#   ONLY=W1,W2 bash scripts/bench-peers.sh      # a subset of the workloads
#   STOKER_BEFORE=/path/to/other/build/stoker TARGETS="local stoker-before stoker" \
#       bash scripts/bench-peers.sh              # a change against the build before it
#   STOKER_PORT=10500 ...                        # the cluster's base port (default 9400)
#   TARGETS="stoker-before stoker stoker-s2" ...  # stoker-sN: `up --meta-shards N`
#                                                # (docs/meta-shards.md)
#
# Needs root (drop_caches, mounts). Everything lives under $PEERDATA (default
# /var/tmp/peerdata, the same disk for every target); results are appended to
# $PEERBENCH_OUT/peerbench.tsv (default /var/tmp/peerbench) under one run id.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PEERS=${PEERS:-$ROOT/../shared/peers}
PEERDATA=${PEERDATA:-/var/tmp/peerdata}
export PEERDATA
OUT=${PEERBENCH_OUT:-/var/tmp/peerbench}
TARGETS=${TARGETS:-local stoker gluster moosefs}
RUN=$(date +%Y%m%dT%H%M%S)
TSV=$OUT/peerbench-$RUN.tsv
export PEERBENCH_TSV=$TSV
STOKER=${STOKER:-$ROOT/build/stoker}
STOKER_PORT=${STOKER_PORT:-9400}
case $STOKER_PORT in '' | *[!0-9]*) echo "bench-peers: STOKER_PORT must be a port number"; exit 2 ;; esac
[ "$(id -u)" = 0 ] || { echo "bench-peers: run as root (drop_caches, mounts)"; exit 2; }
command -v fio >/dev/null || apt-get install -y -q fio >/dev/null
[ -x "$STOKER" ] || make -j"$(nproc)" >/dev/null
mkdir -p "$OUT" "$PEERDATA/local" "$PEERDATA/mnt"

# W6's accelerator period is calibrated on the local file system and reused for the
# others, as the peers' README does.
X_MS=${W6_X_MS:-}
run_one() { # MOUNTPOINT LABEL
	if [ -n "$X_MS" ]; then
		W6_X_MS=$X_MS RUNID="$RUN-$2" bash "$PEERS/peerbench.sh" "$1" "$2" | tee "$OUT/$RUN-$2.log"
	else
		RUNID="$RUN-$2" bash "$PEERS/peerbench.sh" "$1" "$2" | tee "$OUT/$RUN-$2.log"
		X_MS=$(awk '$2=="W6_X_ms"{printf "%.0f", $3}' "$OUT/$RUN-$2.log" | head -1)
	fi
}

for t in $TARGETS; do
	echo "=== $t"
	case $t in
	local) run_one "$PEERDATA/local" local ;;
	stoker | stoker-before | stoker-s[1-4])
		bin=$STOKER
		shards=()
		case $t in stoker-s*) shards=(--meta-shards "${t#stoker-s}") ;; esac
		if [ "$t" = stoker-before ]; then
			bin=${STOKER_BEFORE:-}
			[ -x "$bin" ] || { echo "stoker-before: set STOKER_BEFORE to a stoker binary"; continue; }
		fi
		"$bin" down --data "$PEERDATA/stoker" >/dev/null 2>&1
		rm -rf "$PEERDATA/stoker"; mkdir -p "$PEERDATA/mnt/stoker"
		"$bin" up --data "$PEERDATA/stoker" --daemon --port "$STOKER_PORT" \
			--mount "$PEERDATA/mnt/stoker" "${shards[@]}" ||
			{ echo "stoker up failed"; continue; }
		run_one "$PEERDATA/mnt/stoker" "$t"
		"$bin" down --data "$PEERDATA/stoker" ;;
	gluster)
		bash "$PEERS/setup-gluster.sh" && run_one "$PEERDATA/mnt/gluster" gluster
		bash "$PEERS/teardown-gluster.sh" ;;
	moosefs)
		bash "$PEERS/setup-moosefs.sh" && run_one "$PEERDATA/mnt/moosefs" moosefs
		bash "$PEERS/teardown-moosefs.sh" ;;
	*) echo "unknown target $t" ;;
	esac
done

echo; echo "=== summary ($TSV)"
/usr/bin/python3 "$PEERS/summarize.py" "$TSV"
echo; echo "=== stoker / local and stoker / best peer (higher is better; latencies: lower)"
/usr/bin/python3 - "$TSV" <<'EOF'
import csv, sys
vals = {}
for row in csv.reader(open(sys.argv[1]), delimiter="\t"):
    if len(row) < 5:
        continue
    try:
        vals.setdefault(row[3], {})[row[2]] = float(row[4])
    except ValueError:
        pass
for metric, by in vals.items():
    if "stoker" not in by:
        continue
    s = by["stoker"]
    low = metric.endswith(("_us", "_ms")) or metric in ("W6_wait_s", "total_runtime_s")
    peers = [by[p] for p in ("gluster", "moosefs") if p in by and by[p] > 0]
    best = (min(peers) if low else max(peers)) if peers else None
    loc = by.get("local")
    r_loc = "%.2f" % (s / loc) if loc else "-"
    r_peer = "%.2f" % (s / best) if best else "-"
    before = by.get("stoker-before")
    r_before = " stoker/before %.2f" % (s / before) if before else ""
    print("%-28s stoker %-12g local %-12s best peer %-12s stoker/local %-6s stoker/peer %s%s" %
          (metric, s, loc if loc is not None else "-", best if best is not None else "-", r_loc, r_peer,
           r_before))
EOF
