#!/usr/bin/env bash
# credentials and execution.local end to end: a real agent, `airlock up`
# (FUSE mount + relay socket) with a policy that forwards a variable,
# injects a credential from the user's credentials.json (a source command
# that counts its runs) with a 3 s ttl, and lists git commands under
# execution.local; the workspace is a git repository whose .git/config and
# .gitattributes would run marker commands.
# usage: cred_e2e.sh AIRLOCK AIRLOCK_AGENT RELAY_CLIENT   (root + /dev/fuse, else skipped: exit 77)
# shellcheck source=tests/e2e/lib.sh
source "$(dirname "$0")/lib.sh"

AIRLOCK=$1
AGENT=$2
RC=$3
if [ "$(id -u)" != 0 ] || [ ! -c /dev/fuse ]; then
	echo "skip - cred_e2e needs root and /dev/fuse (uid $(id -u), /dev/fuse $([ -c /dev/fuse ] && echo present || echo missing))"
	exit 77
fi
if ! command -v git >/dev/null; then
	echo "skip - cred_e2e needs git (tests/deps.sh installs it)"
	exit 77
fi
chmod 0711 "$T" # commands run as nobody in the guest
export XDG_STATE_HOME=$T/state
export XDG_CONFIG_HOME=$T/config
export AIRLOCK_SOCKET=$T/relay.sock
export AIRLOCK_E2E_CANARY=host-canary-$$
export FWD_VAR=forwarded-value-$$
unset FWD_UNSET || true
SECRET=s3cr3t-$$-$RANDOM$RANDOM
TO="timeout -k 2"
M=$T/markers
mkdir -p "$M"

make_pair # $T/hk, $T/gk, HPUB, GPUB; W=$T/work, G=$T/guest

# ---- the user's credentials.json and its source ----
mkdir -m 0700 "$XDG_CONFIG_HOME" "$XDG_CONFIG_HOME/airlock"
cat >"$T/source.sh" <<EOF
#!/bin/sh
# counts its runs; prints the value (or fails while $T/fail exists)
echo run >>"$T/count"
env >"$T/source.env"
if [ -e "$T/fail" ]; then echo "token service says no" >&2; exit 3; fi
if [ -e "$T/slow" ]; then sleep 1.5; fi
n=\$(wc -l <"$T/count")
printf '%s\n' "tok-\$n-\$AIRLOCK_CRED_SCOPE-$SECRET"
EOF
chmod 0700 "$T/source.sh"
CFG=$XDG_CONFIG_HOME/airlock/credentials.json
printf '{"sources": {"deploy-token": {"command": ["%s", "ignored-arg"], "timeout_seconds": 5}}}\n' "$T/source.sh" >"$CFG"
chmod 0600 "$CFG"

# ---- the workspace: a git repository that tries to run commands ----
cat >"$W/airlock.json" <<'EOF'
{
  "execution": { "local": ["git status", "git diff", "git log", "git add", "git commit",
                           "git credential", "git ls-remote", "git hash-object", "git rev-parse",
                           "printenv"] },
  "credentials": {
    "forward_env": ["FWD_VAR", "FWD_UNSET"],
    "inject": [ { "name": "INJ_TOKEN", "scope": "read:repo", "ttl_seconds": 3, "value_from": "deploy-token" } ]
  }
}
EOF
# the user reviewed this repository's policy and approved it (doc/UP.md "Trust")
"$AIRLOCK" trust "$W" 2>/dev/null
git -C "$W" init -q
git -C "$W" config user.name "airlock test"
git -C "$W" config user.email "test@airlock.invalid"
echo "one" >"$W/a.txt"
echo "bin" >"$W/b.dat"
git -C "$W" add a.txt b.dat
git -C "$W" commit -qm init
# from here on everything git could run writes a marker
cat >>"$W/.git/config" <<EOF
[core]
	fsmonitor = "touch $M/fsmonitor; true"
	hooksPath = hooks2
	pager = "touch $M/pager; cat"
	sshCommand = "touch $M/sshcommand; false"
	askPass = "touch $M/askpass"
[diff]
	external = "touch $M/diffexternal; true"
[diff "tc"]
	textconv = "touch $M/textconv; cat"
[diff "cmd"]
	command = "touch $M/diffcommand; true"
[filter "f"]
	clean = "touch $M/clean; cat"
	smudge = "touch $M/smudge; cat"
[filter "p"]
	process = "touch $M/process; false"
[credential]
	helper = "!touch $M/credhelper; true"
[pager]
	log = "touch $M/pagerlog; cat"
	status = "touch $M/pagerstatus; cat"
[commit]
	gpgSign = true
[gpg]
	program = "$M/gpg.sh"
[remote "origin"]
	url = ssh://127.0.0.1:1/nothing.git
EOF
printf '#!/bin/sh\ntouch %s/gpg\nexit 1\n' "$M" >"$M/gpg.sh"
chmod +x "$M/gpg.sh"
mkdir "$W/hooks2"
for h in pre-commit post-commit commit-msg prepare-commit-msg post-index-change reference-transaction; do
	printf '#!/bin/sh\ntouch %s/hook-%s\n' "$M" "$h" >"$W/hooks2/$h"
	chmod +x "$W/hooks2/$h"
	cp "$W/hooks2/$h" "$W/.git/hooks/$h"
done
printf '*.txt diff=tc filter=f\n*.dat diff=cmd\n*.proc filter=p\n' >"$W/.gitattributes"

# The same commands run directly, in a copy, must leave markers: the test
# can fail (the repository really is hostile).
t_control() {
	local C=$T/control CM=$T/control-markers
	cp -a "$W" "$C"
	mkdir -p "$CM"
	sed -i "s#$M#$CM#g" "$C/.git/config"
	for f in "$C"/hooks2/* "$C"/.git/hooks/*; do sed -i "s#$M#$CM#g" "$f"; done
	sed "s#$M#$CM#g" "$M/gpg.sh" >"$CM/gpg.sh"
	chmod +x "$CM/gpg.sh"
	echo "two" >>"$C/a.txt"
	echo "more" >>"$C/b.dat"
	(
		cd "$C"
		git status >/dev/null 2>&1 || true
		git diff >/dev/null 2>&1 || true
		git diff --no-ext-diff >/dev/null 2>&1 || true
		script -qec 'git log -1' /dev/null >/dev/null 2>&1 || true
		git add -A >/dev/null 2>&1 || true
		git commit -qm control >/dev/null 2>&1 || true
		printf 'protocol=https\nhost=example.invalid\n\n' | git credential fill >/dev/null 2>&1 || true
		git ls-remote origin >/dev/null 2>&1 || true
		# last: a failing process filter makes git die
		echo "long-running filter" >c.proc
		git add c.proc >/dev/null 2>&1 || true
	) </dev/null
	local want got
	for want in fsmonitor diffexternal diffcommand textconv clean process hook-pre-commit credhelper sshcommand gpg pagerlog; do
		[ -e "$CM/$want" ] || { echo "control run left no '$want' marker: the test would prove nothing" >&2; return 1; }
	done
	got=$(ls "$CM" | grep -v '^gpg.sh$' | tr '\n' ' ')
	echo "# control markers: $got"
}
check "control: run directly, the repository's config runs its commands" t_control
echo "long-running filter" >"$W/c.proc" # filter=p (process): added by the git add below

start_bg agent "$AGENT" --listen "unix:$T/a.sock" --root "$G" --key "$T/gk" --allow "$HPUB" \
	--state "$T/agent.state" --fsync none --verbose # the most it logs: the value must still not show
wait_line "$T/agent.out" '^ready' 10
AGENT_PID=$BG_PID
start_bg up "$AIRLOCK" up "$W" --guest "unix:$T/a.sock" --key "$T/hk" --guest-key "$GPUB"
UP_PID=$BG_PID
wait_line "$T/up.out" "^airlock: $W in sync with unix:$T/a.sock\$" 20
X() { $TO 20 "$AIRLOCK" exec -C "$W" "$@"; }
runs() { [ -e "$T/count" ] && wc -l <"$T/count" || echo 0; }

t_forward() {
	local out
	out=$(X -- env </dev/null) || return 1
	echo "$out" | grep -qx "FWD_VAR=$FWD_VAR" || { echo "FWD_VAR missing: $out" >&2; return 1; }
	! echo "$out" | grep -q "AIRLOCK_E2E_CANARY\|FWD_UNSET\|XDG_CONFIG_HOME\|AIRLOCK_SOCKET" ||
		{ echo "host env leaked: $out" >&2; return 1; }
}
check "forward_env: a listed variable arrives, unlisted host variables do not" t_forward

t_inject() {
	local out a b
	out=$(X -- env </dev/null) || return 1
	echo "$out" | grep -qx "INJ_TOKEN=tok-1-read:repo-$SECRET" || { echo "INJ_TOKEN: $(echo "$out" | grep INJ_)" >&2; return 1; }
	a=$(runs)
	out=$(X -- printenv INJ_TOKEN </dev/null) || true # printenv is local: no inject there
	out=$(X -- sh -c 'echo "$INJ_TOKEN"' </dev/null) || return 1
	b=$(runs)
	[ "$out" = "tok-1-read:repo-$SECRET" ] && [ "$a" = 1 ] && [ "$b" = 1 ] ||
		{ echo "reuse within ttl: '$out' runs $a then $b" >&2; return 1; }
	# the source's own environment: minimal, with name, scope and ttl
	grep -qx "AIRLOCK_CRED_NAME=INJ_TOKEN" "$T/source.env" && grep -qx "AIRLOCK_CRED_SCOPE=read:repo" "$T/source.env" &&
		grep -qx "AIRLOCK_CRED_TTL=3" "$T/source.env" && ! grep -q "AIRLOCK_E2E_CANARY\|FWD_VAR" "$T/source.env" ||
		{ echo "source env:" >&2; cat "$T/source.env" >&2; return 1; }
	sleep 3.2
	out=$(X -- sh -c 'echo "$INJ_TOKEN"' </dev/null) || return 1
	[ "$out" = "tok-2-read:repo-$SECRET" ] && [ "$(runs)" = 2 ] || { echo "after ttl: '$out', runs $(runs)" >&2; return 1; }
}
check "inject: the value arrives, is reused within its ttl and resolved again after it" t_inject

t_source_fail() {
	local out rc=0
	touch "$T/fail"
	sleep 3.2
	out=$(X -- true </dev/null 2>&1) || rc=$?
	rm -f "$T/fail"
	[ "$rc" != 0 ] && echo "$out" | grep -q "credential INJ_TOKEN: source 'deploy-token' failed with status 3: token service says no" ||
		{ echo "rc $rc: $out" >&2; return 1; }
	kill -0 "$UP_PID" || { echo "airlock up died" >&2; return 1; }
	out=$(X -- sh -c 'echo "$INJ_TOKEN"' </dev/null) && [ "$out" = "tok-4-read:repo-$SECRET" ] ||
		{ echo "after recovery: '$out'" >&2; return 1; }
}
check "a failing source is a clear error on the command, and the next command resolves again" t_source_fail

t_wait_cancel() {
	local out
	touch "$T/slow"
	sleep 3.2
	# the command waits for its credential: stdin gets busy, cancel ends it before it starts
	out=$(printf '%s\n' '{"id":"w","op":"exec","argv":["true"],"stdin":true}' '{"id":"w","op":"stdin","data":"x"}' \
		'{"id":"w","op":"cancel"}' | $TO 20 "$RC") || return 1
	rm -f "$T/slow"
	echo "$out" | grep -q '"event":"error","id":"w","code":"busy"' &&
		echo "$out" | grep -q '"event":"error","id":"w","code":"canceled"' &&
		! echo "$out" | grep -q '"event":"started"' || { echo "$out" >&2; return 1; }
	# the resolution went on: its value serves the next command without another run
	sleep 1.6
	out=$(X -- sh -c 'echo "$INJ_TOKEN"' </dev/null) && [ "$out" = "tok-5-read:repo-$SECRET" ] && [ "$(runs)" = 5 ] ||
		{ echo "after cancel: '$out', runs $(runs)" >&2; return 1; }
}
check "a command waiting for its credential: stdin is busy, cancel ends it, the value is kept" t_wait_cancel

t_local_env() {
	local out
	out=$(X -- printenv </dev/null) || return 1
	echo "$out" | grep -qx "FWD_VAR=$FWD_VAR" && echo "$out" | grep -qx "GIT_CONFIG_GLOBAL=/dev/null" &&
		echo "$out" | grep -qx "GIT_CEILING_DIRECTORIES=$(dirname "$(realpath "$W")")" &&
		! echo "$out" | grep -q "INJ_TOKEN\|AIRLOCK_E2E_CANARY\|XDG_CONFIG_HOME" ||
		{ echo "local env: $out" >&2; return 1; }
}
check "execution.local: scrubbed environment with forward_env, without inject values, git's discovery ceiling at the workspace's parent" t_local_env

t_where() {
	local out
	out=$(printf '%s\n' '{"id":"l","op":"exec","argv":["git","status","--short"]}' \
		'{"id":"g","op":"exec","argv":["git","--version"]}' | $TO 20 "$RC") || return 1
	echo "$out" | grep -q '"event":"started","id":"l".*"where":"host"' &&
		echo "$out" | grep -q '"event":"started","id":"g".*"where":"guest"' || { echo "$out" >&2; return 1; }
	# a shell string never runs locally, even when it reads like a prefix
	out=$(printf '%s\n' '{"id":"s","op":"exec","shell":"git status"}' | $TO 20 "$RC") || return 1
	! echo "$out" | grep -q '"where":"host"' || { echo "$out" >&2; return 1; }
}
check "started says where: host for an execution.local argv, guest otherwise and for shell strings" t_where

t_local_io() {
	local out want rc=0
	want=$(printf 'some stdin' | git hash-object --stdin)
	out=$(printf 'some stdin' | X -- git hash-object --stdin) && [ "$out" = "$want" ] ||
		{ echo "stdin: '$out' want '$want'" >&2; return 1; }
	mkdir -p "$W/sub/dir"
	out=$(X -C "$W/sub/dir" -- git rev-parse --show-prefix </dev/null) && [ "$out" = "sub/dir/" ] ||
		{ echo "cwd: '$out'" >&2; return 1; }
	X -- git rev-parse --verify --quiet no-such-ref-xyz </dev/null >/dev/null 2>&1 || rc=$?
	[ "$rc" = 1 ] || { echo "exit code $rc (want 1)" >&2; return 1; }
	rc=0
	# stdin stays open and silent: git waits on it until the timeout kills it
	$TO 20 "$AIRLOCK" exec -C "$W" --timeout 1 -- git hash-object --stdin < <(sleep 2.5) >/dev/null 2>&1 || rc=$?
	[ "$rc" = 124 ] || { echo "timeout gave $rc" >&2; return 1; }
}
check "execution.local: stdin, cwd beneath the workspace, exit status and timeout (124)" t_local_io

t_local_refused() {
	local out
	out=$(printf '%s\n' '{"id":"e","op":"exec","argv":["git","status"],"env":{"LD_PRELOAD":"/nonexistent/x.so"}}' \
		'{"id":"c","op":"exec","argv":["git","-c","core.hooksPath=hooks2","commit","--allow-empty","-m","x"]}' \
		'{"id":"ok","op":"exec","argv":["git","status"],"env":{"LC_ALL":"C","GIT_AUTHOR_NAME":"x"}}' |
		$TO 20 "$RC") || return 1
	echo "$out" | grep -q '"event":"error","id":"e","code":"local_refused".*env LD_PRELOAD is not allowed' &&
		echo "$out" | grep -q '"event":"exit","id":"ok","code":0' &&
		! echo "$out" | grep -q '"event":"started","id":"e"' || { echo "$out" >&2; return 1; }
	# "git -c ... commit" does not start with the prefix "git commit": it goes to the guest
	# (a bare "git" prefix would match it, and then -c is refused: tests/unit/host/test_gitargs.c)
	echo "$out" | grep -q '"event":"started","id":"c".*"where":"guest"' || { echo "$out" >&2; return 1; }
	[ ! -e "$M/hook-pre-commit" ]
}
check "execution.local refuses request env that could load code (LD_PRELOAD); git -c is not a prefix match" t_local_refused

t_local_model() {
	local out rc
	# the host's /etc/shadow through `git diff --no-index` (and its implicit form)
	out=$(printf '%s\n' '{"id":"n","op":"exec","argv":["git","diff","--no-index","/etc/shadow","/dev/null"]}' \
		'{"id":"i","op":"exec","argv":["git","diff","/etc/shadow","/dev/null"]}' \
		'{"id":"o","op":"exec","argv":["git","diff","--no-index","--output='"$T"'/pwned","--output-indicator-new=X","/dev/null","a.txt"]}' \
		'{"id":"t","op":"exec","argv":["git","status"],"env":{"TZ":"/etc/shadow"}}' \
		'{"id":"p","op":"exec","argv":["printenv","HOME"]}' |
		$TO 20 "$RC") || return 1
	echo "$out" | grep -q '"event":"error","id":"n","code":"local_refused".*option .--no-index. is not allowed' &&
		echo "$out" | grep -q '"event":"error","id":"i","code":"local_refused".*argument ./etc/shadow. is an absolute path outside the workspace' &&
		echo "$out" | grep -q '"event":"error","id":"o","code":"local_refused".*option .--no-index. is not allowed' &&
		echo "$out" | grep -q '"event":"error","id":"t","code":"local_refused".*env TZ: the value is a path' &&
		echo "$out" | grep -q '"event":"error","id":"p","code":"local_refused".*exactly as execution.local lists it' &&
		! echo "$out" | grep -q '"event":"started"' || { echo "$out" >&2; return 1; }
	! echo "$out" | grep -q 'root:' || { echo "/etc/shadow content in the output" >&2; return 1; }
	# the same through `airlock exec`: the error, a failing status, nothing of /etc/shadow
	rc=0
	out=$(X -- git diff --no-index /etc/shadow /dev/null </dev/null 2>&1) || rc=$?
	[ "$rc" != 0 ] && echo "$out" | grep -q "option '--no-index' is not allowed.*(local_refused)" &&
		! echo "$out" | grep -q 'root:' || { echo "rc $rc: $out" >&2; return 1; }
	# --output alone (without --no-index) writes a file anywhere: refused, nothing written
	rc=0
	out=$(X -- git diff --output="$T/pwned" --output-indicator-new=X HEAD </dev/null 2>&1) || rc=$?
	[ "$rc" != 0 ] && echo "$out" | grep -q "option '--output' is not allowed" || { echo "rc $rc: $out" >&2; return 1; }
	[ ! -e "$T/pwned" ] || { echo "--output wrote $T/pwned on the host" >&2; return 1; }
	# a repository configuration that moves the work tree to / : refused before anything runs
	git -C "$W" config core.worktree /
	rc=0
	out=$(X -- git status </dev/null 2>&1) || rc=$?
	git -C "$W" config --unset core.worktree
	[ "$rc" != 0 ] && echo "$out" | grep -q "sets core.worktree.*(local_refused)" || { echo "rc $rc: $out" >&2; return 1; }
	# the control: the same commands run directly on the host (outside the hostile repository) do read and write
	(cd "$T" && git diff --no-index --no-ext-diff /etc/shadow /dev/null) >"$T/control-shadow" 2>&1 || true
	grep -q '^-root:' "$T/control-shadow" ||
		{ echo "control: git diff --no-index did not print /etc/shadow (the check would prove nothing)" >&2; return 1; }
	(cd "$T" && git diff --no-index --no-ext-diff --output="$T/control-pwned" /dev/null "$W/a.txt") || true
	[ -s "$T/control-pwned" ] || { echo "control: --output wrote nothing" >&2; return 1; }
}
check "execution.local git: --no-index, a path outside, --output, a TZ path and extra arguments to a non-git prefix are refused (local_refused), nothing read or written on the host" t_local_model

t_git() {
	local out
	echo "two" >>"$W/a.txt"
	echo "more" >>"$W/b.dat"
	X -- git status </dev/null >"$T/git-status.out" || { echo "git status failed" >&2; return 1; }
	grep -q "modified: *a.txt" "$T/git-status.out" || { cat "$T/git-status.out" >&2; return 1; }
	X -- git diff </dev/null >"$T/git-diff.out" || { echo "git diff failed" >&2; return 1; }
	grep -q '^+two' "$T/git-diff.out" || { cat "$T/git-diff.out" >&2; return 1; }
	X -- git diff --no-ext-diff </dev/null >"$T/git-diff2.out" || { echo "git diff --no-ext-diff failed" >&2; return 1; }
	grep -q '^+two' "$T/git-diff2.out" || { cat "$T/git-diff2.out" >&2; return 1; }
	# on a terminal git would start its pager
	printf '%s\n' '{"id":"p","op":"exec","argv":["git","log","-1"],"tty":{"rows":24,"cols":80}}' |
		$TO 20 "$RC" >"$T/git-tty.out" || { echo "git log on a tty failed" >&2; return 1; }
	grep -q '"where":"host"' "$T/git-tty.out" && grep -q '"event":"exit"' "$T/git-tty.out" ||
		{ cat "$T/git-tty.out" >&2; return 1; }
	X -- git add -A </dev/null || { echo "git add failed" >&2; return 1; }
	X -- git commit -qm "via airlock" </dev/null || { echo "git commit failed" >&2; return 1; }
	X -- git log -p -1 </dev/null >"$T/git-log.out" || { echo "git log failed" >&2; return 1; }
	grep -q "via airlock" "$T/git-log.out" && grep -q '^+two' "$T/git-log.out" || { cat "$T/git-log.out" >&2; return 1; }
	printf 'protocol=https\nhost=example.invalid\n\n' | X -- git credential fill >/dev/null 2>&1 || true
	X -- git ls-remote origin </dev/null >/dev/null 2>&1 || true
	out=$(ls -A "$M" | grep -v '^gpg.sh$' || true)
	[ -z "$out" ] || { echo "markers left: $out" >&2; return 1; }
}
check "execution.local git: status, diff, log -p, add, commit, credential, ls-remote run no repository command" t_git

t_no_leak() {
	local where
	"$AIRLOCK" status -C "$W" --json >"$T/status.json" || return 1
	"$AIRLOCK" audit -C "$W" --json >"$T/audit.json" || return 1
	for where in "$T/status.json" "$T/audit.json" "$T/agent.out" "$T/agent.err" "$T/up.out" "$T/up.err" \
		"$G" "$T/agent.state" "$XDG_STATE_HOME"; do
		if grep -rqa -- "$SECRET" "$where"; then
			echo "the injected value is in $where" >&2
			return 1
		fi
	done
	# the check itself can fail: the value is findable where it is
	grep -qa -- "$SECRET" <(X -- env </dev/null)
}
check "the injected value is not in logs, status, audit, the guest's disk or state" t_no_leak

t_guest_down() {
	local out rc=0 before
	kill "$AGENT_PID"
	wait "$AGENT_PID" 2>/dev/null || true
	sleep 3.2 # the cached value expires: a command that could start would resolve it again
	before=$(runs)
	out=$(X -- touch "$T/ran-on-host" </dev/null 2>&1) || rc=$?
	[ "$rc" != 0 ] && [ ! -e "$T/ran-on-host" ] && echo "$out" | grep -q "not connected" ||
		{ echo "rc $rc: $out" >&2; return 1; }
	[ "$(runs)" = "$before" ] || { echo "a source ran for a command that could not start" >&2; return 1; }
	out=$(X -- git status --short </dev/null) || { echo "local git failed with the guest down" >&2; return 1; }
}
check "guest down: a non-local command fails (no source run) and never runs on the host; local ones still run" t_guest_down

t_down() {
	$TO 15 "$AIRLOCK" down "$W" || return 1
	local rc=0
	wait "$UP_PID" || rc=$?
	[ "$rc" = 0 ] || { echo "up exited $rc" >&2; tail -5 "$T/up.err" >&2; return 1; }
	# sanitizer builds: the daemon and the agent must have reported nothing
	! grep -l 'AddressSanitizer\|LeakSanitizer\|runtime error' "$T/up.err" "$T/agent.err"
}
check "down stops the daemon cleanly (no sanitizer reports)" t_down

finish
