#!/usr/bin/env bash
# The fault soak's long form: random kills, hangs and link cuts of storage nodes
# under a verified writer and reader (tests/integration/test_soak.py), for
# SECONDS (default 600), then every copy compared and every byte verified.
# Needs root (network namespaces) and a build (`make`); prints the seed, which
# STOKER_SOAK_SEED=N replays.
#   bash scripts/soak.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
export STOKER_SOAK_S="${1:-600}"
exec /usr/bin/python3 -m pytest -q -s -p no:cacheprovider tests/integration/test_soak.py
