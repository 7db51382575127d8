# Shared by the agent-CLI tests (tests/e2e/agent_*.sh; sourced after lib.sh):
# the skips, the CLIs installed at their pinned versions, a workspace under
# a real `airlock up` (the local sandbox), a scripted model server per run,
# and the command suite every CLI runs routed and unrouted.
#   agent_setup NAME        skip unless root, /dev/fuse, user namespaces, python3, the registry;
#                           sets BIN (the CLIs' commands), W (the workspace), PY, SRC
#   agent_up [ARG...]       airlock up "$W" ARG...; agent_down
#   serve RUN SCRIPT        start model_server.py on SCRIPT: PORT, its log $T/RUN.log
#   unserve                 stop it
#   results RUN TURN        the tool results the CLI sent back after turn TURN-1's tools
#   suite_script FILE TOOL TEMPLATE   the suite as a model script: each command a call of TOOL
#                           with TEMPLATE (JSON) where "@CMD@" is the command
#   suite_check RUN WHERE   check each command's result in RUN's log (WHERE: guest|host)
#   host_check NAME FN...   check for the control run on the host; skipped in a sanitizer build

# host_check NAME FN...: a check of the unrouted control run. No airlock code
# runs there, so a sanitizer build (the suite's second pass) skips it; the
# plain build runs it and compares.
host_check() {
	if sanitized "$AIRLOCK"; then
		skip "$1 (sanitizer build: nothing of airlock's runs on the host side; the plain build checks it)"
	else
		check "$@"
	fi
}

agent_setup() {
	AGENT_NAME=$1
	SRC=$(cd "$(dirname "$0")/../.." && pwd)
	PY=$(command -v /usr/bin/python3 || command -v python3 || true)
	if [ "$(id -u)" != 0 ] || [ ! -c /dev/fuse ]; then
		echo "skip - $AGENT_NAME needs root and /dev/fuse (uid $(id -u), /dev/fuse $([ -c /dev/fuse ] && echo present || echo missing))"
		exit 77
	fi
	if ! unshare -U true 2>/dev/null; then
		echo "skip - $AGENT_NAME: this machine does not allow user namespaces (the local sandbox needs them)"
		exit 77
	fi
	[ -n "$PY" ] || { echo "skip - $AGENT_NAME needs python3 (tests/deps.sh installs it)"; exit 77; }
	local rc=0
	BIN=$(sh "$SRC/tests/agents/install.sh" 2>"$T/install.err") || rc=$?
	if [ "$rc" = 77 ]; then
		echo "skip - $AGENT_NAME: $(cat "$T/install.err")"
		exit 77
	elif [ "$rc" != 0 ]; then
		cat "$T/install.err" >&2
		echo "not ok - installing the agent CLIs failed"
		exit 1
	fi
	export XDG_STATE_HOME=$T/state XDG_DATA_HOME=$T/data AIRLOCK_SOCKET=$T/relay.sock HOME=$T/hosthome
	TO="timeout -k 2"
	W=$T/work
	mkdir -p "$W/sub" "$HOME" "$T/bin" "$T/shim"
	echo "HOST_SECRET=do-not-ship-$$" >"$W/.env" # withheld: the guest never has it
	ln -s "$AIRLOCK" "$T/bin/airlock"
	local wrap
	wrap=$(dirname "$AIRLOCK")/tools/wrappers
	install -m 0755 "$wrap/airlock-sh" "$wrap/airlock-bash" "$wrap/airlock-claude" "$T/bin/"
	install -m 0755 "$wrap/bash" "$T/shim/bash" # what meson installs as LIBEXECDIR/airlock/bash/bash
	export AIRLOCK_BIN=$AIRLOCK
	trap 'agent_down >/dev/null 2>&1 || true; cleanup' EXIT
	# a port open on the host's loopback, for the egress command: reachable from the host only
	"$PY" -c 'import socket, sys
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(64)
open(sys.argv[1] + ".tmp", "w").write(str(s.getsockname()[1])); __import__("os").rename(sys.argv[1] + ".tmp", sys.argv[1])
while True: s.accept()[0].close()' "$T/egress.port" &
	PIDS+=("$!")
	wait_file "$T/egress.port"
	EGRESS_PORT=$(cat "$T/egress.port")
}

wait_file() {
	local i
	for ((i = 0; i < 500; i++)); do
		[ -s "$1" ] && return 0
		sleep 0.01
	done
	echo "$1 did not appear" >&2
	return 1
}

# pair_up: a guest agent on $G and `airlock up "$W"` to it over a unix socket, no sandbox
# (make_pair first): for the tests that need the relay and not the CLIs
pair_up() {
	start_bg agent "$AGENT" --listen "unix:$T/a.sock" --root "$G" --key "$T/gk" --allow "$HPUB" \
		--state "$T/agent.state" --fsync none
	wait_line "$T/agent.out" '^ready' 10
	start_bg up "$AIRLOCK" up "$W" --guest "unix:$T/a.sock" --key "$T/hk" --guest-key "$GPUB"
	UP_PID=$BG_PID
	wait_line "$T/up.out" "^airlock: $W in sync with unix:$T/a.sock\$" 20
}

pin_of() { node -p 'require(process.argv[1]).dependencies[process.argv[2]]' "$SRC/tests/agents/package.json" "$1"; }

UPN=0
agent_up() {
	UPN=$((UPN + 1))
	start_bg "up$UPN" "$AIRLOCK" up "$W" "$@"
	UP_PID=$BG_PID
	wait_line "$T/up$UPN.out" "^airlock: $W in sync with sandbox local\$" 30
}
agent_down() {
	$TO 30 "$AIRLOCK" down "$W" >"$T/down.out" 2>&1 || { cat "$T/down.out" >&2; return 1; }
	wait "$UP_PID" 2>/dev/null || true
}

serve() {
	local run=$1 script=$2
	rm -f "$T/$run.port" "$T/$run.log"
	"$PY" "$SRC/tests/harness/model_server.py" "$script" "$T/$run.log" "$T/$run.port" 2>"$T/$run.srv.err" &
	SRV=$!
	PIDS+=("$SRV")
	wait_file "$T/$run.port"
	PORT=$(cat "$T/$run.port") || { cat "$T/$run.srv.err" >&2; return 1; }
}
unserve() {
	kill "$SRV" 2>/dev/null || true
	wait "$SRV" 2>/dev/null || true
}
results() { "$PY" "$SRC/tests/harness/model_server.py" --results "$T/$1.log" "$2"; }
# suite_turn NAME: the turn whose result holds command NAME's
suite_turn() {
	local i
	for i in "${!SUITE_NAMES[@]}"; do
		[ "${SUITE_NAMES[$i]}" = "$1" ] && echo $((i + 1)) && return 0
	done
	return 1
}

# The suite: what every routed CLI must show, in this order (one model turn each).
# EGRESS tries a port open on the host's loopback: reached from the host,
# refused in the guest.
SUITE_NAMES=(where exit quotes bash big background egress order cd pwd)
suite_cmds() {
	SUITE=(
		'id -u; hostname; cat /proc/1/comm; test -e .env && echo HAS_ENV || echo NO_ENV'
		'echo before-exit; exit 3'
		"printf '%s|%s\\n' \"it's\" 'a\"b'; cat <<'EOT'
heredoc \$HOME \"kept\"
EOT"
		'declare -A m=([k]=v); read -t 1 x <<<"hi"; let n=6*7; shopt -s extglob; [[ $x == h* ]] && echo "bash-only ${m[k]} $n"'
		'yes 0123456789abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstuvwxyz | head -c 1048576; echo; echo big-end'
		'(sleep 0.3; echo bg-late) & echo fg-first; wait; echo bg-waited'
		"python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", $1), 3)' 2>/dev/null && echo EGRESS_OPEN || echo EGRESS_REFUSED"
		'echo o1; echo e1 >&2; echo o2; echo e2 >&2'
		'cd sub && echo moved'
		'pwd'
	)
}
suite_script() {
	local file=$1 tool=$2 template=$3
	suite_cmds "$EGRESS_PORT"
	"$PY" - "$file" "$tool" "$template" "${SUITE[@]}" <<'PYEOF'
import json, sys
file, tool, template, cmds = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
def fill(v, cmd):
    if v == "@CMD@":
        return cmd
    if isinstance(v, dict):
        return {k: fill(x, cmd) for k, x in v.items()}
    if isinstance(v, list):
        return [fill(x, cmd) for x in v]
    return v
turns = [{"content": [{"type": "tool_use", "name": tool, "input": fill(json.loads(template), c)}]} for c in cmds]
turns.append({"content": [{"type": "text", "text": "suite: done"}]})
json.dump({"turns": turns}, open(file, "w"))
PYEOF
}

# suite_same RUN1 RUN2 NAME...: those commands' results are the same text in both runs
# (the CLIs' own varying parts, a process group, a chunk id, a wall time, left out)
suite_same() {
	local a=$1 b=$2 name n x y bad=0
	shift 2
	for name in "$@"; do
		n=$(suite_turn "$name")
		x=$(results "$a" "$n" | sed -E 's/(PGID|Chunk ID|Wall time): [0-9a-f.]+( seconds)?/\1: N/g') &&
			y=$(results "$b" "$n" | sed -E 's/(PGID|Chunk ID|Wall time): [0-9a-f.]+( seconds)?/\1: N/g') &&
			[ "$x" = "$y" ] || { echo "$name: $a ${x:0:300}, $b ${y:0:300}" >&2; bad=1; }
	done
	[ "$bad" = 0 ]
}
SAME_NAMES=(exit quotes bash background order cd pwd)
# suite_stream_order RUN: the order command's stdout lines in their order, and its stderr lines in
# theirs (for a CLI that reads the two from separate pipes: between them no order is kept)
suite_stream_order() {
	local got
	got=$(results "$1" "$(suite_turn order)") || return 1
	grep -qE 'o1\\n(.*\\n)?o2' <<<"$got" && grep -qE 'e1\\n(.*\\n)?e2' <<<"$got" || { echo "$got" >&2; return 1; }
}

# suite_check RUN WHERE: each turn's result, as the CLI sent it to the model.
suite_check() {
	local run=$1 where=$2 n=0 name got bad=0 want
	for name in "${SUITE_NAMES[@]}"; do
		n=$((n + 1))
		got=$(results "$run" "$n" 2>&1) || { echo "$name: $got" >&2; bad=1; continue; }
		case $name in
		where)
			if [ "$where" = guest ]; then
				want='1000\\nairlock\\nairlock-agent\\nNO_ENV'
			else
				want="$(id -u)\\\\n$(hostname)\\\\n$(cat /proc/1/comm)\\\\nHAS_ENV"
			fi
			grep -q -- "$want" <<<"$got" ;;
		exit) # the status as the CLI shows it (cn shows none, on the host neither: suite_same compares)
			grep -q 'before-exit' <<<"$got" &&
				{ [ "${EXIT_SHOWN:-yes}" = no ] || grep -qiE 'exit code:? 3|exited with (code|status) 3' <<<"$got"; } ;;
		quotes) grep -qF "it's|a\\\"b" <<<"$got" && grep -qF 'heredoc $HOME \"kept\"' <<<"$got" ;;
		bash) grep -qF 'bash-only v 42' <<<"$got" ;;
		order) grep -qF o1 <<<"$got" && grep -qF e2 <<<"$got" ;; # the same order as on the host: the caller compares
		big) grep -qF '0123456789abcdefghijklmnopqrstuvwxyz' <<<"$got" ;;
		background) grep -qF 'fg-first' <<<"$got" && grep -qF 'bg-late' <<<"$got" && grep -qF 'bg-waited' <<<"$got" ;;
		egress) if [ "$where" = guest ]; then grep -qF EGRESS_REFUSED <<<"$got"; else grep -qF EGRESS_OPEN <<<"$got"; fi ;;
		cd) grep -qF moved <<<"$got" ;;
		pwd) # where the next command starts: as locally (PWD_WANT)
			want=${PWD_WANT:-$W}
			{ grep -qF "$want\\n" <<<"$got" || grep -qF "$want\"" <<<"$got"; } &&
				{ [ "$want" != "$W" ] || ! grep -qF "$W/sub" <<<"$got"; } ;;
		esac || { echo "$name ($where): ${got:0:600}" >&2; bad=1; }
	done
	[ "$bad" = 0 ]
}

# bench_cli RUNFN TOOL TEMPLATE ROUTED CONTROL: with AIRLOCK_AGENT_BENCH=N set (bench/agents.sh), the CLI
# runs N turns of one short command (echo bench I), routed (RUNFN RUN SCRIPT ROUTED) and on the host (... CONTROL);
# a command's time is the gap between the model requests before and after it (the CLI's own work
# included, the same in both). Prints one "bench: NAME routed_p50 host_p50 ratio" line.
bench_cli() {
	local fn=$1 tool=$2 template=$3 routed=$4 control=$5 n=${AIRLOCK_AGENT_BENCH:-}
	[ -n "$n" ] || return 0
	"$PY" - "$T/bench.json" "$tool" "$template" "$n" <<'PYEOF'
import json, sys
file, tool, template, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
# a different command each turn: Gemini CLI stops a run that repeats one tool call (loop detection)
turns = [{"content": [{"type": "tool_use", "name": tool, "input": json.loads(template.replace("@CMD@", "echo bench %d" % i))}]}
         for i in range(n)]
turns.append({"content": [{"type": "text", "text": "suite: done"}]})
json.dump({"turns": turns}, open(file, "w"))
PYEOF
	"$fn" bench-routed "$T/bench.json" "$routed" && "$fn" bench-host "$T/bench.json" "$control" || return 1
	"$PY" - "$T/bench-routed.log" "$T/bench-host.log" "$AGENT_NAME" <<'PYEOF'
import json, statistics, sys
def p50(log):
    t = {}
    for line in open(log):
        r = json.loads(line)
        if not r.get("side") and "turn" in r:
            t.setdefault(r["turn"], r["t"])
    gaps = [(t[k] - t[k - 1]) * 1000 for k in sorted(t) if k - 1 in t]
    return statistics.median(gaps), len(gaps)
(a, na), (b, nb) = p50(sys.argv[1]), p50(sys.argv[2])
print("bench: %s routed_p50_ms %.0f host_p50_ms %.0f ratio %.2f (n=%d/%d)" % (sys.argv[3], a, b, a / b, na, nb))
PYEOF
}
