#!/usr/bin/env bash
# The training data path against the local file system, on the same disk, in one
# run (docs/BENCHMARKS.md): `stoker bench loader` on both presets, batched 16 KiB
# random reads against 8 threads of pread, a 2 GiB checkpoint against writing and
# fsyncing the same bytes locally, and a loader's samples/s while a checkpoint is
# saved. Starts its own cluster with its data under WORK (default /tmp/stoker-bench-
# training), the local copies beside it.
#
#   scripts/bench-training.sh [WORK]        CKPT_GIB=2 STEPS=12 ROUNDS=3 to change the sizes
# (ROUNDS: loader benchmarks per preset, Stoker and local in turn; the median counts)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WORK=${1:-/tmp/stoker-bench-training}
CKPT_GIB=${CKPT_GIB:-2}
STEPS=${STEPS:-12}
ROUNDS=${ROUNDS:-3}
PY=/usr/bin/python3
export PYTHONPATH=$ROOT/build/python
STOKER=$ROOT/build/stoker
PORT=${PORT:-47310}

make -j"$(nproc)" >/dev/null
rm -rf "$WORK"
mkdir -p "$WORK/local"
"$STOKER" up --data "$WORK/cluster" --daemon --port "$PORT" --targets 4 >/dev/null
trap '"$STOKER" down --data "$WORK/cluster" >/dev/null 2>&1 || true' EXIT
export STOKER_CLUSTER=stk://127.0.0.1:$PORT

loader() { # PATH ARGS... -> one JSON line
	local path=$1; shift
	"$STOKER" bench loader --json --steps "$STEPS" "$@" "$path" | tail -1
}
field() { $PY -c "import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])" "$1" "$2"; }

echo "== stoker bench loader (AU-90 accelerators; samples/s and MB/s at that count)"
echo "   $ROUNDS rounds, Stoker and local in turn; the median count of each"
median() { printf '%s\n' "$@" | sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
for preset in image segmentation; do
	sc=() lc=()
	for r in $(seq "$ROUNDS"); do
		s=$(loader "stk:///$preset" --preset "$preset")
		l=$(loader "$WORK/local/$preset" --preset "$preset")
		printf "%-13s round %d: stoker %3s (%8.0f samples/s %7.0f MB/s)   local %3s (%8.0f samples/s %7.0f MB/s)\n" \
			"$preset" "$r" "$(field "$s" au90_accelerators)" "$(field "$s" samples_per_s)" \
			"$(field "$s" mb_per_s)" "$(field "$l" au90_accelerators)" \
			"$(field "$l" samples_per_s)" "$(field "$l" mb_per_s)"
		sc+=("$(field "$s" au90_accelerators)") lc+=("$(field "$l" au90_accelerators)")
	done
	ms=$(median "${sc[@]}") ml=$(median "${lc[@]}")
	printf "%-13s median:  stoker %3s   local %3s   ratio %s\n" "$preset" "$ms" "$ml" \
		"$(awk -v s="$ms" -v l="$ml" 'BEGIN {printf "%.2f", l ? s / l : 0}')"
done

echo "== 16 KiB samples at random, flat out (batches of 256; stoker: one stk_batch; local: 8 threads of pread)"
small=(--preset image --samples 32768 --sample-size 16K --batch 256 --compute-ms 0 \
	--accelerators 1 --read-threads 8 --steps 60)
s=$(loader "stk:///small" "${small[@]}")
l=$(loader "$WORK/local/small" "${small[@]}")
printf "stoker %8.0f samples/s   local %8.0f samples/s\n" "$(field "$s" samples_per_s)" \
	"$(field "$l" samples_per_s)"
$PY - <<'EOF'
import random, time, stoker
c = stoker.connect()
f = c.open("/small/shard-00000.data")
S, n = 16384, f.size // 16384 - 1
best = 0
for _ in range(5):
    idx = [random.randrange(n) for _ in range(256 * 20)]
    t = time.time()
    for k in range(0, len(idx), 256):
        c.read_batch([(f, i * S, S) for i in idx[k:k + 256]])
    best = max(best, len(idx) / (time.time() - t))
print("python read_batch (256 x 16 KiB per call): %.0f samples/s" % best)
EOF

echo "== checkpoint of ${CKPT_GIB} GiB: stoker.checkpoint.save against torch.save + fsync locally"
$PY - "$CKPT_GIB" "$WORK/local" <<'EOF'
import os, sys, time, torch, stoker, stoker.checkpoint as ckpt
gib, local = int(sys.argv[1]), sys.argv[2]
obj = {"w": torch.ones(gib << 28, dtype=torch.float32)}       # gib GiB
c = stoker.connect()
c.makedirs("/ckpt", exist_ok=True)
def timed(fn):
    t = time.time(); fn(); return time.time() - t
def local_save():
    p = os.path.join(local, "ckpt.pt")
    with open(p, "wb") as f:
        torch.save(obj, f); f.flush(); os.fsync(f.fileno())
s = min(timed(lambda: ckpt.save(obj, "/ckpt/model.pt", client=c)) for _ in range(2))
l = min(timed(local_save) for _ in range(2))
print("stoker %.2f GB/s   local %.2f GB/s   ratio %.2f" % (gib * 1.073741824 / s,
      gib * 1.073741824 / l, l / s))
EOF

echo "== loader samples/s while a checkpoint is saved (image preset, 2 accelerators)"
alone=$(loader "stk:///image" --preset image --accelerators 2 --steps 40)
( $PY - "$CKPT_GIB" <<'EOF'
import sys, time, torch, stoker.checkpoint as ckpt
obj = {"w": torch.ones(int(sys.argv[1]) << 28, dtype=torch.float32)}
end = time.time() + 12
while time.time() < end:
    ckpt.save(obj, "/ckpt/concurrent.pt")
EOF
) &
saver=$!
sleep 1
during=$(loader "stk:///image" --preset image --accelerators 2 --steps 40)
wait $saver
printf "alone %8.0f samples/s   during a save %8.0f samples/s   drop %.0f%%\n" \
	"$(field "$alone" samples_per_s)" "$(field "$during" samples_per_s)" \
	"$($PY -c "print(100 * (1 - $(field "$during" samples_per_s) / $(field "$alone" samples_per_s)))")"
