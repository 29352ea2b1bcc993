#!/usr/bin/env bash
# Meta requests per create (docs/BENCHMARKS.md, "Quotas"): 2,000 empty files made
# through a mount in a new folder, without and with a quota (--bytes 1T --inodes
# 100M), counted at meta's /metrics; then 2,000 files of 16 KiB written (W3's),
# every meta request counted. A count, not a rate: it does not drift with the
# machine's load.
#
#   bash scripts/bench-quota-rpcs.sh [STOKER_BINARY [PORT]]
#
# Needs root (the mount). Data under $QBENCH (default /var/tmp/qrpc), removed after.
set -u
cd "$(dirname "$0")/.."
B=${1:-$PWD/build/stoker}; PORT=${2:-17420}; D=${QBENCH:-/var/tmp/qrpc}
rm -rf $D; mkdir -p $D/mnt
$B up --data $D/stk --daemon --port $PORT --mount $D/mnt >/dev/null
export STOKER_CLUSTER=stk://127.0.0.1:$PORT
mkdir $D/mnt/none $D/mnt/quota
$B quota set /quota --bytes 1T --inodes 100M >/dev/null
total() { curl -s http://127.0.0.1:$((PORT + 11))/metrics | awk '/^stoker_rpc_requests_total\{op="META_(CREATE|NAMES|ALLOW|INOS|LOOKUP_CACHE|LOOKUP)"\}/ {s += $2} END {print s}'; }
for k in none quota; do
	mkdir $D/mnt/$k/d
	a=$(total)
	/usr/bin/python3 -c '
import os, sys
d = sys.argv[1]
for i in range(2000):
    os.close(os.open("%s/f%d" % (d, i), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
fd = os.open(d, os.O_RDONLY); os.fsync(fd); os.close(fd)
' $D/mnt/$k/d
	b=$(total)
	echo "$k: $((b - a)) meta requests for 2000 creates"
done
curl -s http://127.0.0.1:$((PORT + 11))/metrics | grep -E '^stoker_rpc_requests_total\{op="META_(CREATE|NAMES|ALLOW)"' | tr '\n' ' '; echo
every() { curl -s http://127.0.0.1:$((PORT + 11))/metrics | awk '/^stoker_rpc_requests_total\{op="META_/ {s += $2} END {print s}'; }
ops() { curl -s http://127.0.0.1:$((PORT + 11))/metrics | awk '/^stoker_rpc_requests_total\{op="META_(QUOTA|ALLOW_BYTES)"/ {printf "%s ", $0}'; }
for k in none quota; do
	mkdir $D/mnt/$k/w3
	a=$(every); o=$(ops)
	/usr/bin/python3 -c '
import os, sys
d = sys.argv[1]
data = b"w" * 16384
for i in range(2000):
    fd = os.open("%s/f%d" % (d, i), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    os.write(fd, data)
    os.close(fd)
os.sync()
' $D/mnt/$k/w3
	b=$(every)
	echo "$k: $((b - a)) meta requests for 2000 files of 16 KiB (before: $o)"
done
ops; echo
$B umount $D/mnt >/dev/null 2>&1; $B down --data $D/stk >/dev/null 2>&1; rm -rf $D
