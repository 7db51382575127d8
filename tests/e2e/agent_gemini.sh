#!/usr/bin/env bash
# The real Gemini CLI, from the npm registry at the version
# tests/agents/package-lock.json pins, against a scripted model server on
# 127.0.0.1 (tests/harness/model_server.py: streamGenerateContent with SSE;
# GOOGLE_GEMINI_BASE_URL, a dummy GEMINI_API_KEY), from inside the mount of
# a real `airlock up` (the local sandbox). Routed as doc/EDITORS.md says:
# Gemini CLI runs every run_shell_command as `bash -c STRING` with bash
# from PATH, so PATH starts with the directory of airlock's bash shim
# (LIBEXECDIR/airlock/bash). The command suite (tests/e2e/agent_lib.sh)
# runs routed (in the guest) and, as a control, unrouted (on the host);
# then a timeout, and no stray bgpids.tmp errors.
# usage: agent_gemini.sh AIRLOCK   (root, /dev/fuse, user namespaces, node + npm and the registry;
#                                   else skipped: exit 77)
# shellcheck source=tests/e2e/lib.sh
source "$(dirname "$0")/lib.sh"
# shellcheck source=tests/e2e/agent_lib.sh
source "$(dirname "$0")/agent_lib.sh"
AIRLOCK=$1
agent_setup agent_gemini
GEMINI=$BIN/gemini
PIN=$(pin_of @google/gemini-cli)
mkdir -p "$HOME/.gemini"
# the API key auth without asking; no update check, no usage statistics
cat >"$HOME/.gemini/settings.json" <<'JSON'
{"security": {"auth": {"selectedType": "gemini-api-key"}}, "general": {"disableAutoUpdate": true},
 "privacy": {"usageStatisticsEnabled": false}, "telemetry": {"enabled": false},
 "tools": {"shell": {"inactivityTimeout": 6}}}
JSON

# run_gemini RUN SCRIPT [PATHDIR]: one headless run from inside the mount; with PATHDIR first on PATH
run_gemini() {
	local run=$1 script=$2 pathdir=${3:-} rc=0
	serve "$run" "$script" || return 1
	(
		cd "$W" &&
			env PATH="${pathdir:+$pathdir:}$PATH" GEMINI_CLI_TRUST_WORKSPACE=true GEMINI_API_KEY=airlock-test-dummy \
				GOOGLE_GEMINI_BASE_URL="http://127.0.0.1:$PORT" \
				$TO 120 "$GEMINI" -m gemini-2.5-flash -p "run the script" --yolo -o json \
				</dev/null >"$T/$run.json" 2>"$T/$run.err"
	) || rc=$?
	unserve
	[ "$rc" = 0 ] || { echo "gemini ($run) exited $rc: $(grep -v '^    at' "$T/$run.err" | tail -5)" >&2; return 1; }
	"$PY" -c 'import json,sys; r=json.load(open(sys.argv[1])); sys.exit(r.get("response") != sys.argv[2])' \
		"$T/$run.json" "suite: done" || { echo "gemini ($run): $(head -c 400 "$T/$run.json")" >&2; return 1; }
}

agent_up
t_version() {
	local v
	v=$("$GEMINI" --version 2>&1) || return 1
	[ "$v" = "$PIN" ] || { echo "gemini --version: '$v', pinned $PIN" >&2; return 1; }
}
check "Gemini CLI $PIN from the npm registry, as tests/agents/package-lock.json pins it" t_version

TEMPLATE='{"command": "@CMD@", "description": "suite"}'
t_routed() {
	suite_script "$T/routed.json" run_shell_command "$TEMPLATE" &&
		run_gemini routed "$T/routed.json" "$T/shim" && suite_check routed guest
}
check "routed (PATH starts with airlock's bash shim): the suite ran in the guest (uid 1000, hostname airlock, PID 1 airlock-agent, no .env; exit 3, quotes and a heredoc, bash-only syntax, 1 MB, a background job, egress refused, cd not carried, as locally)" t_routed

t_no_bgpids() {
	if grep -q 'bgpids' "$T/routed.log" "$T/routed.err"; then
		grep -oh '.\{80\}bgpids.\{40\}' "$T/routed.log" "$T/routed.err" | head -2 >&2
		return 1
	fi
}
check "routed: no bgpids.tmp error from Gemini's host temporary directory" t_no_bgpids

t_control() {
	suite_script "$T/control.json" run_shell_command "$TEMPLATE" && run_gemini control "$T/control.json" &&
		suite_check control host
}
host_check "control run without the shim: the same suite ran on the host (host uid, hostname, PID 1, .env, egress open)" t_control

# Gemini CLI (headless, no pty) reads a command's stdout and stderr from two sockets: locally the
# model sees them interleaved as they arrive; between two pipes the guest agent reads no order is
# kept (each stream's own is), doc/EDITORS.md
SAME_NAMES=(exit quotes bash background cd pwd)
t_same() { suite_same routed control "${SAME_NAMES[@]}"; }
host_check "routed and on the host, the model got the same text for: ${SAME_NAMES[*]}" t_same
t_order() { suite_stream_order routed; }
check "routed: stdout's lines and stderr's lines each in their own order" t_order

# Gemini's own timeout (tools.shell.inactivityTimeout, 6 s here): it kills the shim's process
# group; the command must not go on in the guest
cat >"$T/timeout.json" <<'JSON'
{"turns": [
  {"content": [{"type": "tool_use", "name": "run_shell_command", "input": {"command": "echo started; sleep 77; echo never", "description": "slow"}}]},
  {"content": [{"type": "text", "text": "suite: done"}]}
]}
JSON
t_timeout() {
	local got
	run_gemini timeout "$T/timeout.json" "$T/shim" || return 1
	got=$(results timeout 1) || return 1
	grep -qF started <<<"$got" && ! grep -qF never <<<"$got" && grep -qiE 'timed out|timeout|cancel' <<<"$got" ||
		{ echo "result: $got" >&2; return 1; }
	sleep 1
	got=$($TO 20 "$AIRLOCK" exec -C "$W" -- sh -c 'ps -eo args | grep "^sleep 77" || true' </dev/null) || return 1
	[ -z "$got" ] || { echo "still running in the guest: $got" >&2; return 1; }
}
check "routed: Gemini's inactivity timeout stops the command, in the guest too" t_timeout

bench_cli run_gemini run_shell_command "$TEMPLATE" "$T/shim" ""

check "down ends airlock up cleanly" agent_down
finish
