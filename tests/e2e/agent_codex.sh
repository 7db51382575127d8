#!/usr/bin/env bash
# The real OpenAI Codex CLI, from the npm registry at the version
# tests/agents/package-lock.json pins, against a scripted model server on
# 127.0.0.1 (tests/harness/model_server.py: the Responses API with SSE, a
# model provider in config.toml), from inside the mount of a real `airlock
# up` (the local sandbox). Codex has no shell setting: it runs its
# exec_command tool as `/bin/bash -lc STRING`, bash being the login shell of
# the password database. Routed as doc/EDITORS.md says, with nothing but
# Codex's own config: its commands' environment gets
# BASH_ENV=DATADIR/airlock/bash_env (shell_environment_policy.set), which
# bash reads before STRING and which runs STRING in the guest, and
# features.shell_snapshot is off (its snapshot is a host file). No private
# mount namespace, no other user. The command suite (tests/e2e/agent_lib.sh)
# runs routed and, as a control, without BASH_ENV on the host; then a
# command left running when Codex ends.
# usage: agent_codex.sh AIRLOCK   (root, /dev/fuse, user namespaces, node + npm and the registry;
#                                  else skipped: exit 77)
# shellcheck source=tests/e2e/lib.sh
source "$(dirname "$0")/lib.sh"
# shellcheck source=tests/e2e/agent_lib.sh
source "$(dirname "$0")/agent_lib.sh"
AIRLOCK=$1
agent_setup agent_codex
CODEX=$BIN/codex
PIN=$(pin_of @openai/codex)
BASH_ENV_FILE=$T/share/airlock/bash_env # what meson installs as DATADIR/airlock/bash_env
mkdir -p "$T/share/airlock"
install -m 0644 "$(dirname "$AIRLOCK")/tools/wrappers/bash_env" "$BASH_ENV_FILE"

# run_codex RUN SCRIPT [routed]: one `codex exec` from inside the mount, its config in $T/codex-RUN
run_codex() {
	local run=$1 script=$2 routed=${3:-} rc=0 home=$T/codex-$1
	serve "$run" "$script" || return 1
	mkdir -p "$home"
	cat >"$home/config.toml" <<TOML
model = "gpt-5-codex"
model_provider = "airlock-test"
approval_policy = "never"
sandbox_mode = "danger-full-access"
check_for_update_on_startup = false

[model_providers.airlock-test]
name = "airlock test"
base_url = "http://127.0.0.1:$PORT/v1"
wire_api = "responses"
env_key = "AIRLOCK_TEST_KEY"

[features]
shell_snapshot = false
TOML
	[ -z "$routed" ] || printf '\n[shell_environment_policy]\nset = { BASH_ENV = "%s" }\n' "$BASH_ENV_FILE" >>"$home/config.toml"
	(
		cd "$W" &&
			env CODEX_HOME="$home" AIRLOCK_TEST_KEY=airlock-test-dummy \
				$TO 120 "$CODEX" exec --skip-git-repo-check "run the script" </dev/null >"$T/$run.out" 2>"$T/$run.err"
	) || rc=$?
	unserve
	[ "$rc" = 0 ] || { echo "codex ($run) exited $rc: $(tail -5 "$T/$run.err")" >&2; return 1; }
	grep -qx 'suite: done' "$T/$run.out" || { echo "codex ($run): $(tail -5 "$T/$run.out")" >&2; return 1; }
}

agent_up
t_version() {
	local v
	v=$("$CODEX" --version 2>/dev/null | tail -1) || return 1
	[ "$v" = "codex-cli $PIN" ] || { echo "codex --version: '$v', pinned $PIN" >&2; return 1; }
}
check "Codex $PIN from the npm registry, as tests/agents/package-lock.json pins it" t_version

TEMPLATE='{"cmd": "@CMD@"}'
t_routed() {
	suite_script "$T/routed.json" exec_command "$TEMPLATE" && run_codex routed "$T/routed.json" routed &&
		suite_check routed guest
}
check "routed (shell_environment_policy.set BASH_ENV=airlock's bash_env): the suite ran in the guest (uid 1000, hostname airlock, PID 1 airlock-agent, no .env; exit 3, quotes and a heredoc, bash-only syntax, 1 MB, a background job, egress refused, cd not carried, as locally)" t_routed

t_control() {
	suite_script "$T/control.json" exec_command "$TEMPLATE" && run_codex control "$T/control.json" &&
		suite_check control host
}
host_check "control run without BASH_ENV: the same suite ran on the host (host uid, hostname, PID 1, .env, egress open)" t_control

# Codex reads a command's stdout and stderr pipes as they fill, so locally the model sees the
# lines interleaved as written (o1 e1 o2 e2). Between two pipes the guest agent reads the order is
# not kept (each stream's own is); doc/EDITORS.md says so
SAME_NAMES=(exit quotes bash background cd pwd)
t_same() { suite_same routed control "${SAME_NAMES[@]}"; }
host_check "routed and on the host, the model got the same text for: ${SAME_NAMES[*]}" t_same
t_order() { suite_stream_order routed; }
check "routed: stdout's lines and stderr's lines each in their own order" t_order

# exec_command yields after yield_time_ms and leaves the command running in a session; Codex
# ends its sessions when it exits: the command must not go on in the guest
cat >"$T/timeout.json" <<'JSON'
{"turns": [
  {"content": [{"type": "tool_use", "name": "exec_command", "input": {"cmd": "echo started; sleep 77; echo never", "yield_time_ms": 1000}}]},
  {"content": [{"type": "text", "text": "suite: done"}]}
]}
JSON
t_timeout() {
	local got
	run_codex timeout "$T/timeout.json" routed || return 1
	got=$(results timeout 1) || return 1
	grep -qF started <<<"$got" && ! grep -qF never <<<"$got" && grep -qi 'session' <<<"$got" ||
		{ echo "result: $got" >&2; return 1; }
	sleep 1
	got=$($TO 20 "$AIRLOCK" exec -C "$W" -- sh -c 'ps -eo args | grep "^sleep 77" || true' </dev/null) || return 1
	[ -z "$got" ] || { echo "still running in the guest: $got" >&2; return 1; }
}
check "routed: a command still running after yield_time_ms is stopped in the guest when Codex ends" t_timeout

bench_cli run_codex exec_command "$TEMPLATE" routed ""

check "down ends airlock up cleanly" agent_down
finish
