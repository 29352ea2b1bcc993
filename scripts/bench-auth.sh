#!/usr/bin/env bash
# What the cluster key costs (docs/security.md, docs/BENCHMARKS.md): the same
# one-machine cluster (mgmtd, meta, one storage node with 2 targets, each role
# started by hand) with a key (--key-file) and without one (--auth off), in turn
# for ROUNDS rounds, fresh each time:
#   - connection set-up: tests/tools/stk_connscale opens CONNS connections to the
#     storage node one at a time (with the key: connect and the mutual HMAC
#     handshake) and says the mean time each took (connect_us);
#   - metadata and small files: `stoker bench` (libstoker; its connections are
#     made once, so this shows what a key costs per request: nothing is expected).
# Prints every round, then the medians and their ratios (key / none).
#
#   scripts/bench-auth.sh [WORK]     ROUNDS=3 CONNS=2000 PORT=47600 to change them
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WORK=${1:-/tmp/stoker-bench-auth}
ROUNDS=${ROUNDS:-3}
CONNS=${CONNS:-2000}
PORT=${PORT:-47600}
S=$ROOT/build/stoker
make -j"$(nproc)" >/dev/null

pids=()
stop() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	pids=()
}
trap stop EXIT

# start MODE: the three roles, MODE "key" or "none"; waits until the node serves
start() {
	local d=$WORK/$1 auth=(--auth off)
	rm -rf "$d"
	mkdir -p "$d/t0" "$d/t1"
	if [ "$1" = key ]; then
		"$S" admin init --key "$d/cluster.key" >/dev/null
		auth=(--key-file "$d/cluster.key")
		export STOKER_KEY_FILE=$d/cluster.key
	else
		unset STOKER_KEY_FILE
	fi
	"$S" mgmtd --listen 127.0.0.1:$PORT --data "$d/mgmtd" "${auth[@]}" 2>"$d/mgmtd.log" &
	pids+=($!)
	"$S" meta --listen 127.0.0.1:$((PORT + 1)) --mgmtd 127.0.0.1:$PORT --data "$d/meta" \
		"${auth[@]}" 2>"$d/meta.log" &
	pids+=($!)
	"$S" storage --listen 127.0.0.1:$((PORT + 2)) --mgmtd 127.0.0.1:$PORT --data "$d/storage" \
		--target "$d/t0" --target "$d/t1" "${auth[@]}" 2>"$d/storage.log" &
	pids+=($!)
	for _ in $(seq 100); do
		if "$S" status --cluster 127.0.0.1:$PORT 2>/dev/null | grep -q " serving "; then
			return 0
		fi
		sleep 0.2
	done
	echo "the $1 cluster did not come up: see $d/*.log" >&2
	exit 1
}

# one MODE: prints "connect_us create stat unlink small_write small_read"
one() {
	local c b
	start "$1"
	c=$(build/tests/stk_connscale 127.0.0.1:$((PORT + 2)) "$CONNS" 1 |
		sed -n 's/.*connect_us=\([0-9.]*\).*/\1/p')
	b=$(STOKER_CLUSTER=stk://127.0.0.1:$PORT "$S" bench --json --threads 4 --size 16M \
		--files 2000 --meta-ops 4000 --no-drop-caches)
	stop
	/usr/bin/python3 - "$c" "$b" <<'EOF'
import json, sys
items = {r["name"]: r["value"] for r in json.loads(sys.argv[2])["results"]}
print(sys.argv[1], *(items.get(k, 0) for k in
      ("create", "stat", "unlink", "small write", "small read")))
EOF
}

declare -a KEY NONE
for r in $(seq "$ROUNDS"); do
	KEY+=("$(one key)")
	NONE+=("$(one none)")
	echo "round $r: key:  ${KEY[-1]}"
	echo "round $r: none: ${NONE[-1]}"
done
/usr/bin/python3 - "$ROUNDS" "${KEY[@]}" "${NONE[@]}" <<'EOF'
import statistics, sys
n = int(sys.argv[1])
key = [list(map(float, l.split())) for l in sys.argv[2:2 + n]]
none = [list(map(float, l.split())) for l in sys.argv[2 + n:2 + 2 * n]]
names = ["connection set-up (µs, lower is better)", "create (ops/s)", "stat (ops/s)",
         "unlink (ops/s)", "small write (files/s)", "small read (files/s)"]
print()
print("| measure (median of %d) | with the key | without | key / without |" % n)
print("|---|---|---|---|")
for i, name in enumerate(names):
    k = statistics.median(r[i] for r in key)
    w = statistics.median(r[i] for r in none)
    print("| %s | %.1f | %.1f | %.2f |" % (name, k, w, k / w if w else 0))
EOF
