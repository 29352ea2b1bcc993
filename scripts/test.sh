#!/usr/bin/env bash
# Runs every test: unit tests (plain and ASan/UBSan builds), the fuzzers for a
# bounded time, and the integration tests (real clusters, real processes), the
# core of them again against the sanitizer build. Ends with one summary line.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh || exit 1
JOBS=$(nproc)
FUZZ_SECONDS=${FUZZ_SECONDS:-30}
# Integration tests run in parallel (pytest-xdist): each starts its own cluster on
# its own ports and folder, and most of a test's time is waiting on daemons, so
# three at once on two cores finish in under half the time of one at a time.
TEST_WORKERS=${TEST_WORKERS:-3}
fail=0
step() { echo; echo "=== $*"; }

step "layers (includes point down; frontends use only include/stoker/)"
bash scripts/check-layers.sh || fail=1

step "build (release, ASan/UBSan, fuzzers)"
make -j"$JOBS" >/dev/null || { echo "build failed"; make 2>&1 | tail -30; exit 1; }
make -j"$JOBS" SAN=1 >/dev/null || { echo "ASan build failed"; make SAN=1 2>&1 | tail -30; exit 1; }
make -j"$JOBS" fuzz >/dev/null || { echo "fuzz build failed"; exit 1; }

step "install (a program built on the installed libstoker through pkg-config)"
bash tests/install/test_install.sh build || fail=1

step "unit tests"
make unit || fail=1
step "unit tests under ASan/UBSan"
ASAN_OPTIONS=detect_leaks=1 make SAN=1 unit || fail=1

step "fuzzing (${FUZZ_SECONDS}s per target, all targets at once)"
fuzz_pids=()
for f in build-fuzz/fuzz_*; do
	# The targets only: their logs and corpora sit beside them.
	[ -f "$f" ] && [ -x "$f" ] || continue
	mkdir -p "build-fuzz/corpus-$(basename "$f")"
	"$f" -max_total_time="$FUZZ_SECONDS" -print_final_stats=0 \
		"build-fuzz/corpus-$(basename "$f")" >"build-fuzz/$(basename "$f").log" 2>&1 &
	fuzz_pids+=("$!:$f")
done
for pf in "${fuzz_pids[@]}"; do
	f=${pf#*:}
	if wait "${pf%%:*}"; then
		echo "PASS $f ($(grep -c . "build-fuzz/$(basename "$f").log") log lines)"
	else
		echo "FAIL $f"; tail -40 "build-fuzz/$(basename "$f").log"; fail=1
	fi
done

# One pass: the tests three at a time, then those marked `serial` (they time
# something against the clock, or use the default cluster) one by one. $1: the build
# folder for its report. No -x: a failure stops nothing, so the report names every
# failing test (and no worker is stopped in the middle of a test, cluster running).
integration() {
	local out=$1 rc=0
	shift
	/usr/bin/python3 -m pytest -q -p no:cacheprovider -n "$TEST_WORKERS" tests/integration \
		-m "not serial" --junitxml="$out/integration.xml" "$@" || rc=1
	/usr/bin/python3 -m pytest -q -p no:cacheprovider tests/integration \
		-m serial --junitxml="$out/integration-serial.xml" "$@" || rc=1
	return $rc
}

step "integration tests"
integration build || fail=1

step "integration tests on a folder of metadata shard 2 (docs/meta-shards.md)"
# The mount's POSIX suite, locks and orphans again, on a cluster of two shards
# with the tests' folder placed on shard 2: sessions, open files, locks and
# orphans on another shard than the root's (under a minute).
STOKER_TEST_META_SHARDS=2 STOKER_TEST_MOUNT_SHARD=2 \
	/usr/bin/python3 -m pytest -q -p no:cacheprovider -n "$TEST_WORKERS" \
	tests/integration/test_mount_posix.py tests/integration/test_locks.py \
	tests/integration/test_orphans.py --junitxml=build/integration-shard2.xml || fail=1

step "integration tests against the ASan/UBSan build"
# The 100,000-entry listing runs in the first pass only (a minute of creates, meta-bound),
# as do the counts of delegated creates (under the sanitizers' slowness a watch may
# lapse, which rightly ends a delegation, and the count then tells nothing).
# This pass also turns short-circuit reads off, so that reads cross the network as
# they do between machines (on one machine the client reads chunk files itself).
STOKER_BUILD=build-asan STOKER_SHORT_CIRCUIT=0 ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 \
	integration build-asan \
	-k "(api or frames or round_trip or restart or concurrent or corrupted or mount or metrics or s3 or batch or locks or orphans or full_metadata) and not 100000 and not delegated" \
	|| fail=1

echo
if [ $fail = 0 ]; then echo "all tests passed"; else echo "SOME TESTS FAILED"; fi
exit $fail
