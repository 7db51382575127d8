#!/usr/bin/env bash
# The real Continue CLI (cn), from the npm registry at the version
# tests/agents/package-lock.json pins, against a scripted model server on
# 127.0.0.1 (tests/harness/model_server.py: OpenAI Chat Completions with SSE,
# a model with apiBase in the config file), from inside the mount of a real
# `airlock up` (the local sandbox). cn runs its Bash tool as
# `$SHELL -l -c COMMAND`: routed as doc/EDITORS.md says, with
# SHELL=airlock-bash. The command suite (tests/e2e/agent_lib.sh) runs routed
# and, as a control, with SHELL=/bin/bash on the host; then the Bash tool's
# timeout.
# usage: agent_cn.sh AIRLOCK   (root, /dev/fuse, user namespaces, node + npm and the registry;
#                               else skipped: exit 77)
# shellcheck source=tests/e2e/lib.sh
source "$(dirname "$0")/lib.sh"
# shellcheck source=tests/e2e/agent_lib.sh
source "$(dirname "$0")/agent_lib.sh"
AIRLOCK=$1
agent_setup agent_cn
CN=$BIN/cn
PIN=$(pin_of @continuedev/cli)
EXIT_SHOWN=no # cn's Bash result has the output only, not the status (on the host too)

# run_cn RUN SCRIPT SHELL: one headless `cn -p --auto` from inside the mount
run_cn() {
	local run=$1 script=$2 shell=$3 rc=0
	serve "$run" "$script" || return 1
	cat >"$T/$run.yaml" <<YAML
name: airlock-test
version: 0.0.1
schema: v1
models:
  - name: test
    provider: openai
    model: gpt-4o
    apiBase: http://127.0.0.1:$PORT/v1
    apiKey: airlock-test-dummy
    roles: [chat]
YAML
	(
		cd "$W" &&
			env SHELL="$shell" $TO 120 "$CN" -p --config "$T/$run.yaml" --auto "run the script" \
				</dev/null >"$T/$run.out" 2>"$T/$run.err"
	) || rc=$?
	unserve
	[ "$rc" = 0 ] || { echo "cn ($run) exited $rc: $(tail -5 "$T/$run.err")" >&2; return 1; }
	grep -qx 'suite: done' "$T/$run.out" || { echo "cn ($run): $(tail -5 "$T/$run.out")" >&2; return 1; }
}

agent_up
t_version() {
	local v
	v=$("$CN" --version 2>/dev/null | tail -1) || return 1
	[ "$v" = "$PIN" ] || { echo "cn --version: '$v', pinned $PIN" >&2; return 1; }
}
check "Continue's cn $PIN from the npm registry, as tests/agents/package-lock.json pins it" t_version

TEMPLATE='{"command": "@CMD@"}'
t_routed() {
	suite_script "$T/routed.json" Bash "$TEMPLATE" && run_cn routed "$T/routed.json" "$T/bin/airlock-bash" &&
		suite_check routed guest
}
check "routed (SHELL=airlock-bash): the suite ran in the guest (uid 1000, hostname airlock, PID 1 airlock-agent, no .env; exit 3, quotes and a heredoc, bash-only syntax, 1 MB, a background job, egress refused, cd not carried, as locally)" t_routed

t_control() {
	suite_script "$T/control.json" Bash "$TEMPLATE" && run_cn control "$T/control.json" /bin/bash &&
		suite_check control host
}
host_check "control run with SHELL=/bin/bash: the same suite ran on the host (host uid, hostname, PID 1, .env, egress open)" t_control

t_same() { suite_same routed control "${SAME_NAMES[@]}"; }
host_check "routed and on the host, the model got the same text for: ${SAME_NAMES[*]}" t_same

# the Bash tool's own timeout (seconds): cn kills the shell it started; the command must not go on
cat >"$T/timeout.json" <<'JSON'
{"turns": [
  {"content": [{"type": "tool_use", "name": "Bash", "input": {"command": "echo started; sleep 77; echo never", "timeout": 3}}]},
  {"content": [{"type": "text", "text": "suite: done"}]}
]}
JSON
t_timeout() {
	local got
	run_cn timeout "$T/timeout.json" "$T/bin/airlock-bash" || return 1
	got=$(results timeout 1) || return 1
	grep -qF started <<<"$got" && ! grep -qF never <<<"$got" && grep -qiE 'timed out|timeout' <<<"$got" ||
		{ echo "result: $got" >&2; return 1; }
	sleep 1
	got=$($TO 20 "$AIRLOCK" exec -C "$W" -- sh -c 'ps -eo args | grep "^sleep 77" || true' </dev/null) || return 1
	[ -z "$got" ] || { echo "still running in the guest: $got" >&2; return 1; }
}
check "routed: the Bash tool's timeout stops the command, in the guest too" t_timeout

bench_cli run_cn Bash "$TEMPLATE" "$T/bin/airlock-bash" /bin/bash

check "down ends airlock up cleanly" agent_down
finish
