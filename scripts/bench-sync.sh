#!/usr/bin/env bash
# `stoker sync` from the local file system into Stoker, against the tools people use
# today for the same trees, in one run (docs/BENCHMARKS.md, issue 28):
#   small  FILES files of 16 KiB in folders of 1000
#   big    one file of BIG_MB MiB
# copied by
#   sync   stoker sync SRC stk:///DST (native client, 16 threads)
#   cp     cp -a SRC into a Stoker mount (`stoker up --mount`)
#   rsync  rsync -a SRC/ into the same mount
#   aws    aws s3 sync SRC to the S3 gateway (`stoker up --s3`)
# Each copy goes into a fresh cluster (so no tool finds the previous one's work),
# with the page cache dropped first when run as root (every tool reads the source
# from the disk). Rounds alternate the order of the tools, so that what the other
# users of a shared machine do weighs on each the same; the table gives every
# round's seconds, the median, and the ratios of sync to the others (above 1:
# sync is faster). Goal (issue 28): sync at least 3 times rsync on the small files,
# at least 0.8 of cp on the large file.
#
#   bash scripts/bench-sync.sh [FILES] [BIG_MB] [ROUNDS] [DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
FILES=${1:-100000}
BIG_MB=${2:-4096}
ROUNDS=${3:-2}
DIR=${4:-/var/tmp/stoker-sync-bench}
S=$PWD/build/stoker
PORT=${STOKER_BENCH_PORT:-9850} # below the kernel's range of ephemeral ports
S3PORT=$((PORT + 20))
make -s -j"$(nproc)" >/dev/null
for t in rsync /usr/bin/aws; do command -v $t >/dev/null || { echo "missing $t: bash scripts/deps.sh"; exit 2; }; done
export STOKER_CLUSTER=stk://127.0.0.1:$PORT
export STOKER_S3_ACCESS_KEY=BENCHKEY STOKER_S3_SECRET_KEY=benchsecret
export AWS_ACCESS_KEY_ID=$STOKER_S3_ACCESS_KEY AWS_SECRET_ACCESS_KEY=$STOKER_S3_SECRET_KEY
export AWS_DEFAULT_REGION=us-east-1 AWS_EC2_METADATA_DISABLED=true
EP=http://127.0.0.1:$S3PORT

down() { $S down --data "$DIR/cluster" >/dev/null 2>&1 || true; rm -rf "$DIR/cluster"; }
trap down EXIT
down
# The trees: random bytes (nothing compresses or dedups); kept for a rerun with
# the same sizes.
if [ ! -e "$DIR/src/done-$FILES-$BIG_MB" ]; then
rm -rf "$DIR"; mkdir -p "$DIR/src/small" "$DIR/src/big" "$DIR/mnt"
/usr/bin/python3 - "$DIR/src/small" "$FILES" <<'EOF'
import os, sys
root, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    d = os.path.join(root, "d%03d" % (i // 1000))
    if i % 1000 == 0:
        os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "f%06d" % i), "wb") as f:
        f.write(os.urandom(16384))
EOF
head -c $((BIG_MB << 20)) /dev/urandom >"$DIR/src/big/big.bin"
touch "$DIR/src/done-$FILES-$BIG_MB"
fi

fresh() {
	local try
	for try in 1 2 3 4 5; do
		down
		if $S up --data "$DIR/cluster" --daemon --port "$PORT" --mount "$DIR/mnt" \
			--s3 "$S3PORT" >/dev/null 2>"$DIR/up.err" && mountpoint -q "$DIR/mnt"; then
			break
		fi
		[ "$try" != 5 ] || { cat "$DIR/up.err" >&2; exit 1; }
		sleep 2 # a port the last cluster held, not yet free
	done
	for _ in $(seq 100); do (echo >/dev/tcp/127.0.0.1/$S3PORT) 2>/dev/null && break; sleep 0.1; done
	/usr/bin/aws --endpoint-url "$EP" s3 mb s3://bench >/dev/null
	sync
	[ "$(id -u)" != 0 ] || echo 3 >/proc/sys/vm/drop_caches
}

# One copy of tree $2 by tool $1; prints its seconds, and checks the copy.
copy() {
	local tool=$1 tree=$2 t0 t1
	fresh
	t0=$(date +%s.%N)
	case $tool in
	sync) $S sync "$DIR/src/$tree" "stk:///$tree" --no-progress >/dev/null ;;
	cp) cp -a "$DIR/src/$tree" "$DIR/mnt/$tree" ;;
	rsync) rsync -a "$DIR/src/$tree/" "$DIR/mnt/$tree/" ;;
	aws) /usr/bin/aws --endpoint-url "$EP" s3 sync --only-show-errors "$DIR/src/$tree" "s3://bench/$tree" ;;
	esac
	t1=$(date +%s.%N)
	# The copy is whole: as many files, as many bytes, read back through the mount.
	local where=$DIR/mnt/$tree
	[ "$tool" != aws ] || where=$DIR/mnt/bench/$tree
	local n b
	n=$(find "$where" -type f | wc -l)
	b=$(du -sb --apparent-size "$where" | cut -f1)
	local want_n want_b
	want_n=$(find "$DIR/src/$tree" -type f | wc -l)
	want_b=$(find "$DIR/src/$tree" -type f -printf '%s\n' | awk '{s += $1} END {printf "%d\n", s}')
	[ "$n" = "$want_n" ] || { echo "$tool $tree: $n files of $want_n" >&2; exit 1; }
	[ "$b" -ge "$want_b" ] || { echo "$tool $tree: $b bytes of $want_b" >&2; exit 1; }
	awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }'
}

TOOLS=(sync cp rsync aws)
declare -A T
for r in $(seq "$ROUNDS"); do
	order=("${TOOLS[@]}")
	if [ $((r % 2)) = 0 ]; then order=(aws rsync cp sync); fi
	for tree in small big; do
		for tool in "${order[@]}"; do
			s=$(copy "$tool" "$tree")
			T[$tool.$tree]="${T[$tool.$tree]:-} $s"
			echo "round $r: $tool $tree ${s}s" >&2
		done
	done
done

median() { tr ' ' '\n' | grep . | sort -n | awk '{v[NR] = $1} END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.2f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
echo
echo "bash scripts/bench-sync.sh $FILES $BIG_MB $ROUNDS, $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| tree | tool | seconds per round | median | rate | sync's speed / tool's |"
echo "|---|---|---|---|---|---|"
for tree in small big; do
	ms=$(echo "${T[sync.$tree]}" | median)
	for tool in "${TOOLS[@]}"; do
		m=$(echo "${T[$tool.$tree]}" | median)
		if [ "$tree" = small ]; then
			rate=$(awk -v n="$FILES" -v s="$m" 'BEGIN { printf "%.0f files/s", n / s }')
		else
			rate=$(awk -v n="$BIG_MB" -v s="$m" 'BEGIN { printf "%.0f MiB/s", n / s }')
		fi
		ratio=$(awk -v a="$m" -v b="$ms" 'BEGIN { printf "%.2f", a / b }')
		echo "| $tree | $tool |${T[$tool.$tree]} | $m | $rate | $ratio |"
	done
done
