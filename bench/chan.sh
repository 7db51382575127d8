#!/bin/bash
# Channel overhead: `airlock ping` (Noise handshake, secretstream records,
# frames, credit windows) against the same traffic over a plain socket with
# no crypto (bench/plain_peer), on loopback, in one run. Prints a markdown
# table with medians, p99 and ratios, and the machine.
# usage: bench/chan.sh [BUILD_DIR] [ROUND_TRIPS] [BULK_BYTES]
set -euo pipefail
B=${1:-build}
N=${2:-5000}
BULK=${3:-1073741824}
T=$(mktemp -d /tmp/airlock-bench.XXXXXX)
pids=()
trap 'for p in "${pids[@]}"; do kill $p 2>/dev/null || true; done; rm -rf "$T"' EXIT

"$B/airlock" keygen -o "$T/h.key" >"$T/h.pub"
"$B/airlock" keygen -o "$T/g.key" >"$T/g.pub"
wait_ready() { for _ in $(seq 250); do grep -q '^ready' "$1" 2>/dev/null && return 0; sleep 0.02; done; return 1; }

"$B/airlock-agent" --listen "unix:$T/a.sock" --root "$T/root" --key "$T/g.key" --allow "$(cat "$T/h.pub")" >"$T/a.out" 2>/dev/null &
pids+=($!)
"$B/airlock-agent" --listen "tcp:127.0.0.1:0" --root "$T/root" --key "$T/g.key" --allow "$(cat "$T/h.pub")" >"$T/at.out" 2>/dev/null &
pids+=($!)
"$B/bench/plain_peer" serve "unix:$T/p.sock" >"$T/p.out" &
pids+=($!)
"$B/bench/plain_peer" serve "tcp:127.0.0.1:0" >"$T/pt.out" &
pids+=($!)
for f in a at p pt; do wait_ready "$T/$f.out"; done
ATCP=$(sed -n 's/^ready //p' "$T/at.out")
PTCP=$(sed -n 's/^ready //p' "$T/pt.out")

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2fx", a / b }'; }
field() { sed -n "s/.*$1 \([0-9.]*\).*/\1/p" | head -1; }

echo "## Channel overhead ($(date -u +%Y-%m-%d), $(nproc) cores, $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1), kernel $(uname -r))"
echo
echo "Round trips: $N sequential, 12-byte payload; bulk: $BULK bytes in 64 KiB records."
echo
echo "| transport | path | handshake ms | RTT p50 us | RTT p99 us | bulk MiB/s |"
echo "|---|---|---|---|---|---|"
declare -A R
for tr in unix tcp; do
	if [ $tr = unix ]; then aaddr="unix:$T/a.sock"; paddr="unix:$T/p.sock"; else aaddr=$ATCP; paddr=$PTCP; fi
	out=$("$B/airlock" ping --guest "$aaddr" --key "$T/h.key" --guest-key "$(cat "$T/g.pub")" -n "$N" --bulk "$BULK" --timeout 600)
	hs=$(echo "$out" | sed -n 's/.*: \([0-9.]*\) ms (connect.*/\1/p')
	a50=$(echo "$out" | field 'p50'); a99=$(echo "$out" | field 'p99'); abw=$(echo "$out" | sed -n 's/.*s: \([0-9.]*\) MiB\/s/\1/p')
	out=$("$B/bench/plain_peer" ping "$paddr" -n "$N" --bulk "$BULK")
	p50=$(echo "$out" | field 'p50'); p99=$(echo "$out" | field 'p99'); pbw=$(echo "$out" | sed -n 's/.*s: \([0-9.]*\) MiB\/s/\1/p')
	echo "| $tr | airlock channel | $hs | $a50 | $a99 | $abw |"
	echo "| $tr | plain socket | - | $p50 | $p99 | $pbw |"
	echo "| $tr | **ratio** | | $(ratio "$a50" "$p50") | $(ratio "$a99" "$p99") | $(ratio "$abw" "$pbw") |"
done
