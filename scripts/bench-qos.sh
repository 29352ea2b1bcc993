#!/usr/bin/env bash
# QoS between two tenants (docs/qos.md, docs/BENCHMARKS.md, issue 26): tenant A runs
# `stoker bench loader --preset image` (the accelerators kept at AU >= 90%) while
# tenant B floods the same storage node with checkpoint-class writes, flat out.
# Three cases, alternated in each of ROUNDS rounds so that the machine's drift falls
# on all alike:
#   alone   A's loader, nothing else
#   flood   A's loader while B writes, no QoS
#   qos     the same with `stoker qos set @checkpoint --write-bw QOS_BW`: checkpoint
#           writes are held to QOS_BW while A's (default-class) reads are served
# Prints each run's accelerator count and the ratios flood / alone and qos / alone
# of their medians (goal for qos: at least 0.9).
#
#   bash scripts/bench-qos.sh      # ROUNDS=3 STEPS=8 QOS_BW=64M WRITERS=4 PORT=10800
#
# Data under $QBENCH (default /var/tmp/qos-bench), removed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
STOKER=${STOKER:-$PWD/build/stoker}
DATA=${QBENCH:-/var/tmp/qos-bench}
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-8}
QOS_BW=${QOS_BW:-64M}
WRITERS=${WRITERS:-4}
PORT=${PORT:-10800}
rm -rf "$DATA"
mkdir -p "$DATA"
"$STOKER" up --data "$DATA/stk" --daemon --port "$PORT" >/dev/null
flood_pid=
cleanup() {
	[ -n "$flood_pid" ] && kill "$flood_pid" 2>/dev/null && wait "$flood_pid" 2>/dev/null
	"$STOKER" down --data "$DATA/stk" >/dev/null 2>&1
	rm -rf "$DATA"
}
trap cleanup EXIT
export STOKER_CLUSTER=stk://127.0.0.1:$PORT STOKER_KEY_FILE=$DATA/stk/cluster.key
"$STOKER" admin client add teamA --key-out "$DATA/a.key" >/dev/null
"$STOKER" admin client add teamB --key-out "$DATA/b.key" >/dev/null
"$STOKER" mkdir /ds /ckpt

loader() { # prints A's AU-90 accelerator count
	STOKER_KEY_FILE=$DATA/a.key "$STOKER" bench loader --preset image --steps "$STEPS" \
		--json "stk://127.0.0.1:$PORT/ds" |
		/usr/bin/python3 -c 'import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])["au90_accelerators"])'
}

flood_start() { # B: WRITERS threads writing 64 MiB files, class checkpoint, until killed
	STOKER_KEY_FILE=$DATA/b.key STOKER_QOS_CLASS=checkpoint PYTHONPATH=$PWD/build/python \
		/usr/bin/python3 -c '
import os, sys, threading, stoker
c = stoker.connect()
data = os.urandom(1 << 20)
def w(k):
    i = 0
    while True:
        with c.open("/ckpt/w%d.%d" % (k, i % 2), "wb") as f:
            for _ in range(64):
                f.write(data)
        i += 1
ts = [threading.Thread(target=w, args=(k,), daemon=True) for k in range(int(sys.argv[1]))]
[t.start() for t in ts]
[t.join() for t in ts]
' "$WRITERS" &
	flood_pid=$!
	sleep 2
}

flood_stop() {
	kill "$flood_pid" 2>/dev/null || true
	wait "$flood_pid" 2>/dev/null || true
	flood_pid=
}

echo "generating the data set (tenant A, first loader run, not counted)" >&2
loader >/dev/null
out=$DATA/results.tsv
: >"$out"
for r in $(seq "$ROUNDS"); do
	for kind in alone flood qos; do
		if [ "$kind" = qos ]; then
			"$STOKER" qos set @checkpoint --write-bw "$QOS_BW" >/dev/null
			sleep 3 # the storage node fetches the limits with its next table
		fi
		[ "$kind" != alone ] && flood_start
		n=$(loader)
		[ "$kind" != alone ] && flood_stop
		if [ "$kind" = qos ]; then
			"$STOKER" qos rm @checkpoint >/dev/null
			sleep 3
		fi
		printf '%s\t%s\n' "$kind" "$n" >>"$out"
		echo "round $r: $kind: $n accelerators" >&2
	done
done
/usr/bin/python3 - "$out" <<'PY'
import collections, statistics, sys
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    kind, n = line.split()
    runs[kind].append(int(n))
alone = statistics.median(runs["alone"])
print("| case | AU-90 accelerators (rounds) | median | / alone |")
print("|---|---|---|---|")
for kind in ("alone", "flood", "qos"):
    m = statistics.median(runs[kind])
    print("| %s | %s | %g | %.2f |" % (kind, ", ".join(map(str, runs[kind])), m,
                                       m / alone if alone else 0))
PY
