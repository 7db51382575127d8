#!/usr/bin/env bash
# Round trip of one command through the relay socket (exec request to exit
# event, one connection, sequential), p50/p99, for:
#   true in the guest, no credentials                    the baseline
#   git --version via execution.local                    on the host: the `git config --list -z`
#                                                        probe, then the command (doc/RELAY.md)
#   git --version run directly by the client (no relay)  the floor for the line above
#   true in the guest with forward_env x2 + 1 cached inject value   the forwarded layer's cost
#   true in the guest, inject ttl 1 s, 1.05 s between runs          a source run before each command
# usage: bench/cred.sh BUILD [N]     (root + /dev/fuse; N runs per line, default 500)
set -euo pipefail

B=${1:?usage: bench/cred.sh BUILD [N]}
N=${2:-500}
AIRLOCK=$(realpath "$B/airlock")
AGENT=$(realpath "$B/airlock-agent")
T=$(mktemp -d /tmp/airlock-credbench.XXXXXX)
PIDS=()
cleanup() {
	if mountpoint -q "$T/work" 2>/dev/null; then "$AIRLOCK" down "$T/work" >/dev/null 2>&1 || umount -l "$T/work" || true; fi
	for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
	for p in "${PIDS[@]:-}"; do [ -n "$p" ] && wait "$p" 2>/dev/null || true; done
	rm -rf "$T"
}
trap cleanup EXIT
chmod 0711 "$T"
export XDG_STATE_HOME=$T/state XDG_CONFIG_HOME=$T/config AIRLOCK_SOCKET=$T/relay.sock FWD_A=a FWD_B=b
mkdir -m 0700 -p "$XDG_CONFIG_HOME/airlock"
printf '#!/bin/sh\necho tok-$$\n' >"$T/src.sh"
chmod 0700 "$T/src.sh"
printf '{"sources": {"tok": {"command": ["%s"]}, "short": {"command": ["%s"]}}}\n' "$T/src.sh" "$T/src.sh" \
	>"$XDG_CONFIG_HOME/airlock/credentials.json"
chmod 0600 "$XDG_CONFIG_HOME/airlock/credentials.json"
"$AIRLOCK" keygen -o "$T/hk" >"$T/hk.pub"
"$AIRLOCK" keygen -o "$T/gk" >"$T/gk.pub"
mkdir -p "$T/work" "$T/guest"
git -C "$T/work" init -q

run_case() { # POLICY_JSON: start agent + up with it, print the timings of the cases
	local policy=$1
	shift
	echo "$policy" >"$T/policy.json"
	"$AGENT" --listen "unix:$T/a.sock" --root "$T/guest" --key "$T/gk" --allow "$(cat "$T/hk.pub")" \
		--state "$T/agent.state" --fsync none >"$T/agent.out" 2>&1 &
	local ap=$!
	PIDS+=("$ap")
	for _ in $(seq 200); do grep -q '^ready' "$T/agent.out" 2>/dev/null && break; sleep 0.01; done
	"$AIRLOCK" up "$T/work" --policy "$T/policy.json" --guest "unix:$T/a.sock" --key "$T/hk" \
		--guest-key "$(cat "$T/gk.pub")" >"$T/up.out" 2>&1 &
	local up=$!
	PIDS+=("$up")
	for _ in $(seq 2000); do grep -q 'in sync with' "$T/up.out" 2>/dev/null && break; sleep 0.01; done
	python3 - "$T/relay.sock" "$@" <<'EOF'
import json, socket, sys, time
sock, cases = sys.argv[1], sys.argv[2:]
s = socket.socket(socket.AF_UNIX); s.connect(sock); f = s.makefile("rwb", buffering=0)
import subprocess
def run(argv, i):
    t = time.perf_counter()
    if argv[0] == "direct":
        subprocess.run(argv[1:], check=True, stdout=subprocess.DEVNULL)
        return (time.perf_counter() - t) * 1e3, "host"
    f.write((json.dumps({"id": i, "op": "exec", "argv": argv}) + "\n").encode())
    where = None
    while True:
        ev = json.loads(f.readline())
        if ev.get("event") == "started": where = ev.get("where")
        if ev.get("event") in ("exit", "error"):
            if ev.get("event") == "error" or ev.get("code") != 0: sys.exit("failed: %r" % ev)
            return (time.perf_counter() - t) * 1e3, where
i = 0
for c in cases:
    label, n, pause, argv = c.split("|", 3)
    argv = json.loads(argv); lat = []; where = None
    for _ in range(int(n)):
        i += 1; ms, where = run(argv, i); lat.append(ms)
        if float(pause): time.sleep(float(pause))
    lat.sort()
    p = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))]
    print("| %-46s | %-5s | %5d | %7.2f | %7.2f |" % (label, where, len(lat), p(0.5), p(0.99)))
EOF
	"$AIRLOCK" down "$T/work" >/dev/null 2>&1 || true
	wait "$up" 2>/dev/null || true
	kill "$ap" 2>/dev/null || true
	wait "$ap" 2>/dev/null || true
}

echo "| command | where | runs | p50 ms | p99 ms |"
echo "|---|---|---|---|---|"
run_case '{"execution": {"local": ["git --version"]}}' \
	"true (no credentials)|$N|0|[\"true\"]" \
	"git --version, execution.local (probe + run)|$N|0|[\"git\",\"--version\"]" \
	"git --version run directly (no relay, the floor)|$N|0|[\"direct\",\"git\",\"--version\"]"
run_case '{"credentials": {"forward_env": ["FWD_A", "FWD_B"], "inject": [{"name": "TOK", "value_from": "tok", "ttl_seconds": 3600}]}}' \
	"true, forward_env x2 + 1 cached inject value|$N|0|[\"true\"]"
run_case '{"credentials": {"inject": [{"name": "TOK", "value_from": "short", "ttl_seconds": 1}]}}' \
	"true, inject expired every run (source runs)|$((N / 50 + 2))|1.05|[\"true\"]"
