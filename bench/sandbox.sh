#!/usr/bin/env bash
# The embedded local sandbox (doc/SANDBOX.md), measured:
#  (a) start: sandbox_start() to the agent's "ready" (namespaces, private root,
#      pivot_root, exec of the agent), as sandbox_harness reports it, and its
#      stop (SIGTERM to PID 1 until reaped), over RUNS starts;
#  (b) a command's round trip `airlock exec -- true` with the sandbox running,
#      and the same right after an idle stop (workspace.ttl_seconds = 1): the
#      sandbox's start, the reconnect and reconcile are paid by that command.
#
# usage: bench/sandbox.sh BUILD [RUNS]      (root + /dev/fuse; BUILD built with tests, for sandbox_harness)
set -euo pipefail

B=$(realpath "${1:?usage: bench/sandbox.sh BUILD [RUNS]}")
N=${2:-50}
T=$(mktemp -d /tmp/airlock-bench-sandbox.XXXXXX)
export XDG_DATA_HOME=$T/data XDG_STATE_HOME=$T/state AIRLOCK_SOCKET=$T/relay.sock
W=$T/work
mkdir -p "$W"
echo hello >"$W/README"
trap '"$B/airlock" down "$W" --destroy >/dev/null 2>&1 || true; rm -rf "$T"' EXIT

pct() { # pct P < numbers: the P-th percentile (nearest rank)
	sort -g | awk -v p="$1" '{ v[NR] = $1 } END { i = int((NR - 1) * p / 100) + 1; printf "%.2f", v[i] }'
}
now_ms() { date +%s.%N | awk '{ printf "%.3f", $1 * 1000 }'; }

echo "# (a) sandbox start and stop, $N runs"
: >"$T/start" && : >"$T/stop"
for _ in $(seq "$N"); do
	exec 3> >("$B/tests/harness/sandbox_harness" "$W" "$B/airlock-agent" >"$T/h.out" 2>&1)
	hp=$!
	until grep -q '^ready' "$T/h.out" 2>/dev/null; do sleep 0.001; done
	sed -n 's/^start_ms //p' "$T/h.out" >>"$T/start"
	t0=$(now_ms)
	exec 3>&-
	while [ -e "/proc/$hp" ]; do sleep 0.001; done
	t1=$(now_ms)
	echo "$t1 - $t0" | bc >>"$T/stop"
done
echo "start  p50 $(pct 50 <"$T/start") ms  p99 $(pct 99 <"$T/start") ms"
echo "stop   p50 $(pct 50 <"$T/stop") ms  p99 $(pct 99 <"$T/stop") ms  (includes the harness's exit; polled every 1 ms)"

echo "# (b) airlock exec -- true: sandbox running vs just idle-stopped (ttl_seconds 1), 10 runs each"
echo '{ "workspace": { "ttl_seconds": 1 } }' >"$T/ttl.json"
"$B/airlock" up "$W" --policy "$T/ttl.json" -d >/dev/null 2>"$T/up.err"
: >"$T/warm" && : >"$T/cold"
for _ in $(seq 10); do
	"$B/airlock" exec -C "$W" -- true # a running sandbox
	t0=$(now_ms)
	"$B/airlock" exec -C "$W" -- true
	t1=$(now_ms)
	echo "$t1 - $t0" | bc >>"$T/warm"
	until "$B/airlock" status -C "$W" --json | grep -q '"sandbox_state":"idle-stopped"'; do sleep 0.05; done
	t0=$(now_ms)
	"$B/airlock" exec -C "$W" -- true
	t1=$(now_ms)
	echo "$t1 - $t0" | bc >>"$T/cold"
done
echo "running       p50 $(pct 50 <"$T/warm") ms  max $(pct 100 <"$T/warm") ms"
echo "idle-stopped  p50 $(pct 50 <"$T/cold") ms  max $(pct 100 <"$T/cold") ms  (start + handshake + reconcile + command)"
"$B/airlock" down "$W" >/dev/null
