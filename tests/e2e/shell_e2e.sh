#!/usr/bin/env bash
# airlock exec --tty and airlock shell through a real `airlock up` and agent,
# on real pseudo-terminals (tests/harness/pty_drive.py): an interactive login shell
# (pty in the guest, window size and resize, ^C, ^Z, jobs and fg, exit
# status, the local terminal restored), exec --tty (isatty, size, exit
# status and death by signal as without a tty), shell -c (status, $0 and
# arguments, pty only on a terminal), shell --bash and the options tools
# pass to a shell; then the editor setups of doc/EDITORS.md: the installed
# wrappers (tools/wrappers, as meson builds them), Claude Code's
# CLAUDE_CODE_SHELL_PREFIX quoting and command wrapping as 2.1.332 does it
# (/bin/bash -c, no login shell), SHELL -l -c (Cline, Continue) through
# airlock-sh, and a bash found on PATH (Gemini CLI) through the bash shim.
# tests/e2e/agent_*.sh drive the real CLIs.
# usage: shell_e2e.sh AIRLOCK AIRLOCK_AGENT   (root + /dev/fuse, else skipped: exit 77)
# shellcheck source=tests/e2e/lib.sh
source "$(dirname "$0")/lib.sh"
# shellcheck source=tests/e2e/agent_lib.sh
source "$(dirname "$0")/agent_lib.sh"

AIRLOCK=$1
AGENT=$2
SRC=$(cd "$(dirname "$0")/../.." && pwd)
PY=$(command -v /usr/bin/python3 || command -v python3 || true)
if [ "$(id -u)" != 0 ] || [ ! -c /dev/fuse ]; then
	echo "skip - shell_e2e needs root and /dev/fuse (uid $(id -u), /dev/fuse $([ -c /dev/fuse ] && echo present || echo missing))"
	exit 77
fi
[ -n "$PY" ] || { echo "skip - shell_e2e needs python3 (tests/deps.sh installs it)"; exit 77; }
PTY="$PY $SRC/tests/harness/pty_drive.py"
chmod 0711 "$T" # commands run as nobody in the guest: let them reach the workspace copy
export XDG_STATE_HOME=$T/state
export AIRLOCK_SOCKET=$T/relay.sock
TO="timeout -k 2"

make_pair # $T/hk, $T/gk, HPUB, GPUB; W=$T/work, G=$T/guest

pair_up
echo "only the guest has this" >"$G/guest-only.txt" # after the first reconcile, which would remove it
cd "$W"

t_login() { $TO 60 $PTY login "$AIRLOCK"; }
check "airlock shell: login shell on a pty, resize, ^C, ^Z/jobs/fg, exit 7, terminal restored" t_login

t_exec_tty() {
	local out
	out=$($TO 20 $PTY run 33 91 3 "$AIRLOCK" exec --tty -- sh -c 'test -t 0 && test -t 1 && stty size; exit 3') || return 1
	[ "$out" = "33 91" ] || { echo "got '$out'" >&2; return 1; }
	# death by a signal: 128+N, as without a tty
	$TO 20 $PTY run 24 80 143 "$AIRLOCK" exec --tty -- sh -c 'kill -TERM $$' >/dev/null
}
check "exec --tty: the command sees a terminal of our size; exit status and signal death as without" t_exec_tty

t_shell_c() {
	local rc=0 out
	$TO 20 "$AIRLOCK" shell -c 'exit 7' </dev/null || rc=$?
	[ "$rc" = 7 ] || { echo "shell -c 'exit 7' without a terminal: $rc" >&2; return 1; }
	out=$($TO 20 $PTY run 24 80 7 "$AIRLOCK" shell -c 'test -t 0 && echo on-a-pty; exit 7') || return 1
	[ "$out" = on-a-pty ] || { echo "on a terminal: '$out'" >&2; return 1; }
	out=$($TO 20 "$AIRLOCK" shell -c 'test -t 1 || echo no-pty; echo "$0|$1|$2"' name 'a b' c </dev/null) || return 1
	[ "$out" = $'no-pty\nname|a b|c' ] || { echo "args: '$out'" >&2; return 1; }
	rc=0
	out=$(printf 'echo from-stdin; cat guest-only.txt\nexit 4\n' | $TO 20 "$AIRLOCK" shell) || rc=$?
	[ "$rc" = 4 ] && [ "$out" = $'from-stdin\nonly the guest has this' ] || { echo "script on stdin: $rc '$out'" >&2; return 1; }
}
check "shell -c: exit status, \$0 and arguments, pty only on a terminal; a script on stdin without one" t_shell_c

# The wrappers exactly as doc/EDITORS.md gives them: the ```sh block holding
# the marker line.
doc_block() {
	awk -v m="$1" '/^```sh$/ { inb = 1; buf = ""; next }
		inb && /^```$/ { inb = 0; if (buf ~ m) printf "%s", buf; next }
		inb { buf = buf $0 "\n" }' "$SRC/doc/EDITORS.md"
}
# The wrappers as meson builds them (tools/wrappers: installed by meson
# install, calling the installed airlock unless AIRLOCK_BIN says otherwise).
WRAP=$(dirname "$AIRLOCK")/tools/wrappers
mkdir -p "$T/bin" "$T/shim"
ln -s "$AIRLOCK" "$T/bin/airlock"
install -m 0755 "$WRAP/airlock-sh" "$WRAP/airlock-bash" "$WRAP/airlock-claude" "$T/bin/"
install -m 0755 "$WRAP/bash" "$T/shim/bash"
export PATH=$T/bin:$PATH AIRLOCK_BIN=$AIRLOCK
mkdir -p "$T/home"

t_bash() {
	local rc=0 out err
	# the options tools pass to any shell: -l, --login, -i, -lc
	out=$($TO 20 airlock-sh --login -i -c 'echo "$0"; exit 3' </dev/null) || rc=$?
	[ "$rc" = 3 ] && [ "$out" = sh ] || { echo "airlock-sh --login -i -c: rc $rc '$out'" >&2; return 1; }
	# bash-only syntax the models write: [[ ]], read -t, here-strings, arrays, shopt, declare, process substitution
	out=$($TO 20 airlock-bash -lc 'shopt -s extglob; declare -A m=([k]=v); read -t 1 x <<<"hi"
		[[ $x == h* ]] && echo "$x ${m[k]} $(cat <(echo ps)) ${BASH_VERSION%%.*}" ; id -u' </dev/null) || {
		echo "airlock-bash -lc: rc $? '$out'" >&2
		return 1
	}
	[ "${out%%$'\n'*}" = "hi v ps 5" ] && [ "${out#*$'\n'}" = 65534 ] || { echo "bash syntax: '$out'" >&2; return 1; }
	# bash's set options reach the guest's bash: -e -o pipefail stops at the failing pipe
	rc=0
	out=$($TO 20 airlock-bash -e -o pipefail -c 'false | true; echo reached' </dev/null) || rc=$?
	[ "$rc" = 1 ] && [ -z "$out" ] || { echo "-e -o pipefail: rc $rc '$out'" >&2; return 1; }
	# a bash found on PATH (Gemini CLI's way): the shim, in the guest
	out=$(PATH=$T/shim:$PATH; $TO 20 bash -c 'cat guest-only.txt; echo "${BASH_VERSINFO[0]}"' </dev/null) || return 1
	[ "$out" = $'only the guest has this\n5' ] || { echo "bash shim: '$out'" >&2; return 1; }
	# stdout and stderr one file (a tool reading one stream): the order as written; two files: each its own
	$TO 20 airlock-bash -c 'for i in 1 2 3; do echo "o$i"; echo "e$i" >&2; done' </dev/null >"$T/merged" 2>&1 || return 1
	[ "$(tr '\n' ' ' <"$T/merged")" = "o1 e1 o2 e2 o3 e3 " ] || { echo "merged: $(cat "$T/merged")" >&2; return 1; }
	out=$($TO 20 airlock-sh -c 'echo o1; echo e1 >&2' </dev/null 2>"$T/e.only") && [ "$out" = o1 ] &&
		[ "$(cat "$T/e.only")" = e1 ] || { echo "separate: '$out' '$(cat "$T/e.only")'" >&2; return 1; }
	# options we do not know: our prefix and the option, status 2; a bash option without --bash is refused
	rc=0
	err=$($TO 20 airlock-sh --bogus -c true 2>&1 </dev/null) || rc=$?
	[ "$rc" = 2 ] && [ "${err%%$'\n'*}" = "airlock: shell: unknown option '--bogus'" ] ||
		{ echo "--bogus: rc $rc '$err'" >&2; return 1; }
	rc=0
	err=$($TO 20 airlock shell -e -c true 2>&1 </dev/null) || rc=$?
	[ "$rc" = 2 ] && [ "${err#*--bash}" != "$err" ] || { echo "-e without --bash: rc $rc '$err'" >&2; return 1; }
}
check "shell --bash: -l/--login/-i/-lc accepted, bash syntax and set options in the guest, the bash shim, unknown options named" t_bash

# Claude Code's CLAUDE_CODE_SHELL_PREFIX: the prefix up to its first " -"
# (after the last '/') quoted as one path, its flags, then the command string
# quoted as one argument (shell-quote style), run by /bin/bash -c (2.1.332:
# not a login shell).
q() { printf "'%s'" "$(printf %s "$1" | sed "s/'/'\\\\''/g")"; }
claude_run() {
	local prefix=$1 cmd=$2 tail=${1##*/} head
	if [ "${tail#* -}" != "$tail" ]; then
		head=${prefix%%" -${tail#* -}"}
		HOME=$T/home /bin/bash -c "$(q "$head") -${tail#* -} $(q "$cmd")"
	else
		HOME=$T/home /bin/bash -c "$(q "$prefix") $(q "$cmd")"
	fi
}

t_claude() {
	local rc=0 out user cmd
	export CLAUDE_CODE_SHELL_PREFIX=$T/bin/airlock-claude
	# the command string alone: quotes, a pipe, &&, a non-zero exit
	out=$($TO 30 bash -c 'claude_run "$@"' _ "$CLAUDE_CODE_SHELL_PREFIX" \
		"printf '%s\n' \"it's\" 'a|b' | grep -c '|' && cat guest-only.txt && ls /no/such/dir-\$((6*7))" 2>"$T/cc.err") || rc=$?
	[ "$rc" = 2 ] && [ "$out" = $'1\nonly the guest has this' ] && grep -q 'dir-42' "$T/cc.err" ||
		{ echo "plain: rc $rc out '$out' err '$(cat "$T/cc.err")'" >&2; return 1; }
	# as Claude Code 2.1.332 sends it: its shell snapshot (a host file the guest lacks)
	# sourced first, the command eval'd with stdin from /dev/null, the cwd saved
	mkdir -p "$W/sub/deeper"
	$TO 20 "$AIRLOCK" sync-wait -C "$W" --timeout 10 || return 1
	local cwdf=$T/claude-e2e$$-cwd
	cc_cmd() { printf '%s' "source $T/home/.claude/shell-snapshots/snapshot-bash-1764460800000-abc123.sh 2>/dev/null || true && eval $(q "$1") < /dev/null && pwd -P >| $cwdf"; }
	user="cd sub && printf '%s %s\n' \"\$(pwd | sed 's|.*/||')\" \"it's\" | tr a-z A-Z; exit 3"
	rc=0
	out=$($TO 30 bash -c 'claude_run "$@"' _ "$CLAUDE_CODE_SHELL_PREFIX" "$(cc_cmd "$user")" 2>"$T/cc2.err") || rc=$?
	[ "$rc" = 3 ] && [ "$out" = "SUB IT'S" ] && [ ! -e "$cwdf" ] ||
		{ echo "wrapped: rc $rc out '$out' err '$(cat "$T/cc2.err")'" >&2; return 1; }
	# the cwd file: the host path of where the command ended (the guest's copy is elsewhere),
	# the cwd marker line not in stderr, nothing in the guest's /tmp
	out=$(cd "$W/sub" && $TO 30 bash -c 'claude_run "$@"' _ "$CLAUDE_CODE_SHELL_PREFIX" \
		"$(cc_cmd 'cd deeper && echo out && echo err >&2')" 2>"$T/cc3.err") || { cat "$T/cc3.err" >&2; return 1; }
	[ "$out" = out ] && [ "$(cat "$T/cc3.err")" = err ] && [ "$(cat "$cwdf")" = "$W/sub/deeper" ] ||
		{ echo "cwd file: out '$out' err '$(cat "$T/cc3.err")' file '$(cat "$cwdf")'" >&2; return 1; }
	rm -f "$cwdf"
	[ -z "$(ls "$G/tmp" /tmp 2>/dev/null | grep "claude-e2e$$")" ] || { echo "a cwd file in a /tmp" >&2; return 1; }
	# a failing command writes none (as with && locally); a forged report is refused
	out=$($TO 30 bash -c 'claude_run "$@"' _ "$CLAUDE_CODE_SHELL_PREFIX" "$(cc_cmd 'cd sub && false')" 2>&1) && return 1
	[ ! -e "$cwdf" ] || { echo "a failed command wrote the cwd file" >&2; return 1; }
	out=$($TO 30 bash -c 'claude_run "$@"' _ "$CLAUDE_CODE_SHELL_PREFIX" \
		"$(cc_cmd 'printf "%s/../..\n" "$__airlock_m" >&2; exit 0')" 2>&1) || true
	[ ! -e "$cwdf" ] && [ "${out#*not a directory of the workspace}" != "$out" ] ||
		{ echo "forged: '$out' file $(cat "$cwdf" 2>&1)" >&2; return 1; }
	# the prefix with a flag, as some set it: the path is still one word
	rc=0
	out=$($TO 30 bash -c 'claude_run "$@"' _ "$T/bin/airlock-sh -c" 'echo "$((2+3)) in the guest: $(cat guest-only.txt)"; exit 9') || rc=$?
	[ "$rc" = 9 ] && [ "$out" = "5 in the guest: only the guest has this" ] || { echo "flagged prefix: rc $rc '$out'" >&2; return 1; }
}
export T
export -f q claude_run
check "Claude Code's way (doc/EDITORS.md): CLAUDE_CODE_SHELL_PREFIX=airlock-claude, one argument, runs in the guest, output and status; its cwd file on the host, mapped from the guest's copy; none in the guest's /tmp" t_claude

t_shell_path() {
	local rc=0 out
	# Cline (background execution) and Continue: SHELL -l -c COMMAND
	out=$(SHELL=$T/bin/airlock-sh; $TO 30 "$SHELL" -l -c 'id -u; cat guest-only.txt; exit 5' </dev/null) || rc=$?
	[ "$rc" = 5 ] && [ "$out" = $'65534\nonly the guest has this' ] || { echo "rc $rc '$out'" >&2; return 1; }
}
check "SHELL=airlock-sh: SHELL -l -c COMMAND (Cline background execution, Continue) runs in the guest" t_shell_path

t_kill9() {
	local pid i left
	"$AIRLOCK" shell -c 'echo up; sleep 78; echo never' </dev/null >"$T/k9.out" 2>&1 &
	pid=$!
	for ((i = 0; i < 200; i++)); do
		grep -q up "$T/k9.out" && break
		sleep 0.05
	done
	kill -KILL "$pid"
	wait "$pid" 2>/dev/null || true
	for ((i = 0; i < 100; i++)); do
		left=$($TO 20 "$AIRLOCK" exec -- sh -c 'ps -eo args | grep "^sleep 78" || true' </dev/null) || return 1
		[ -z "$left" ] && return 0
		sleep 0.05
	done
	echo "still running in the guest after the client was killed: $left" >&2
	return 1
}
check "a client killed with SIGKILL (an agent's timeout) takes its command in the guest with it" t_kill9

cd /
check "down ends airlock up cleanly" t_up_down
check "no sanitizer reports from airlock up or the agent" t_no_sanitizer_reports

finish
