#!/bin/bash
# The long form of the metadata storm (tests/integration/test_meta_storm.py): the
# same clients, models and checks, through ROUNDS rounds of faults (the meta leader
# killed and restarted, a follower cut off and healed), RUNS times over.
#
# Usage: ROUNDS=10 RUNS=3 bash scripts/meta-storm.sh   (as root: network namespaces)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-10}
RUNS=${RUNS:-1}
for i in $(seq "$RUNS"); do
	echo "meta storm: run $i of $RUNS, $ROUNDS rounds of faults"
	STOKER_STORM_ROUNDS=$ROUNDS /usr/bin/python3 -m pytest -q -s -p no:cacheprovider \
		tests/integration/test_meta_storm.py
done
