#!/usr/bin/env bash
# The CLI's conventions: every command's --help (exit 0) and `airlock help
# CMD`, --version, every --json through a JSON parser, usage errors that
# name what is missing, and each trap and failure of doc/UP.md ("Refusals
# and warnings") with a message that names the cause and the fix.
# usage: cli_e2e.sh AIRLOCK AIRLOCK_AGENT   (the parts that mount need root + /dev/fuse; they skip without)
# shellcheck source=tests/e2e/lib.sh
source "$(dirname "$0")/lib.sh"

AIRLOCK=$1
AGENT=$2
export XDG_STATE_HOME=$T/state XDG_RUNTIME_DIR=$T/run XDG_CACHE_HOME=$T/cache XDG_DATA_HOME=$T/data
mkdir -p "$XDG_RUNTIME_DIR"
chmod 700 "$XDG_RUNTIME_DIR"
TO="timeout -k 2"
# every workspace this script may have brought up goes down first, whatever failed
cli_cleanup() {
	local w
	for w in "$T/ws/work" "$T/home" "$T/ws/work/sub" "$T/stale" "$T/gone" "$T/many"; do
		timeout 20 "$AIRLOCK" down "$w" >/dev/null 2>&1 || true
	done
	cleanup
}
trap cli_cleanup EXIT
CAN_MOUNT=0
[ "$(id -u)" = 0 ] && [ -c /dev/fuse ] && CAN_MOUNT=1

SCHEMAS=$(cd "$(dirname "$0")/../../doc/schema" && pwd)
SCHEMA_CHECK=$(dirname "$0")/../harness/schema_check.py
# json FILE [SCHEMA]: FILE is one valid JSON document (and valid against doc/schema/SCHEMA.schema.json;
# without python3-jsonschema only the parse is checked, said once)
json() {
	python3 -m json.tool "$1" >/dev/null || return 1
	[ -n "${2:-}" ] || return 0
	local rc=0
	python3 "$SCHEMA_CHECK" "$SCHEMAS" "$2" "$1" || rc=$?
	[ "$rc" = 77 ] && { [ -n "${SAID_NOSCHEMA:-}" ] || echo "(no python3-jsonschema: schemas not checked)"; SAID_NOSCHEMA=1; return 0; }
	return "$rc"
}
# has FILE REGEX...: FILE matches every REGEX (extended, case-insensitive)
has() {
	local f=$1 re
	shift
	for re in "$@"; do
		grep -qiE -- "$re" "$f" || { echo "no /$re/ in $f:" >&2; cat "$f" >&2; return 1; }
	done
}
# rc_is WANT CMD...: CMD exits WANT; its stdout and stderr in $T/o, $T/e
rc_is() {
	local want=$1 rc=0
	shift
	"$@" >"$T/o" 2>"$T/e" || rc=$?
	[ "$rc" = "$want" ] || { echo "exit $rc, wanted $want: $*" >&2; cat "$T/o" "$T/e" >&2; return 1; }
}

# ---- help and version ----
COMMANDS=$("$AIRLOCK" help | sed -n 's/^  \([a-z][a-z-]*\) .*/\1/p; s/^  \([a-z][a-z-]*\)$/\1/p' | sort -u)
t_commands_listed() {
	local c
	for c in up down status sync-wait exec shell audit sync ping keygen pubkey list logs doctor gc init policy version help; do
		grep -qx "$c" <<<"$COMMANDS" || { echo "airlock help does not list $c" >&2; return 1; }
	done
}
check "airlock help lists every command" t_commands_listed
t_help_forms() {
	rc_is 0 "$AIRLOCK" help && has "$T/o" '^  up DIR .*--sandbox' '^  up DIR --guest ADDR' '^  down DIR \[--destroy\]'
}
check "the top-level help shows both forms of up and down --destroy" t_help_forms
for c in $COMMANDS; do
	t_help() {
		rc_is 0 "$AIRLOCK" "$1" --help && has "$T/o" "^airlock $1" &&
			cp "$T/o" "$T/o1" && rc_is 0 "$AIRLOCK" help "$1" && cmp -s "$T/o" "$T/o1"
	}
	check "$c --help and airlock help $c print its help, exit 0" t_help "$c"
done
t_help_up() { rc_is 0 "$AIRLOCK" help up && has "$T/o" '--guest ADDR' '--policy FILE' '--sandbox' && ! grep -q '^commands:' "$T/o"; }
check "airlock help up is up's help, not the general one" t_help_up
t_exec_passthrough() {
	# exec's --help after the command is the guest command's: not intercepted
	rc_is 125 "$AIRLOCK" exec -C "$T" -- ls --help && has "$T/e" 'cannot reach the relay'
}
check "exec -- CMD --help is CMD's own --help" t_exec_passthrough
t_version() {
	rc_is 0 "$AIRLOCK" --version && has "$T/o" '^airlock [0-9]+\.[0-9]+' &&
		rc_is 0 "$AIRLOCK" version && has "$T/o" '^airlock [0-9]' &&
		rc_is 0 "$AIRLOCK" version --json && json "$T/o" version && has "$T/o" '"version": *1' '"airlock": *"[0-9]'
}
check "--version, version, version --json" t_version
t_usage_names() {
	rc_is 2 $TO 20 "$AIRLOCK" up && has "$T/e" 'missing DIR' 'usage: airlock up' &&
		rc_is 2 $TO 20 "$AIRLOCK" up "$T" --guest unix:/x && has "$T/e" 'missing --key FILE' &&
		rc_is 2 $TO 20 "$AIRLOCK" up "$T" --guest unix:/x --key /x && has "$T/e" 'missing --guest-key' &&
		rc_is 2 "$AIRLOCK" ping --key /x --guest-key y && has "$T/e" 'missing --guest ADDR' &&
		rc_is 2 "$AIRLOCK" sync --guest unix:/x && has "$T/e" 'missing DIR' &&
		rc_is 2 "$AIRLOCK" down && has "$T/e" 'missing DIR' &&
		rc_is 2 "$AIRLOCK" status extra && has "$T/e" "unexpected argument 'extra'" &&
		rc_is 2 "$AIRLOCK" exec && has "$T/e" 'missing the command' &&
		rc_is 2 "$AIRLOCK" nosuch && has "$T/e" "unknown command 'nosuch'"
}
check "usage errors name what is missing (exit 2)" t_usage_names
t_json_failures() {
	# every --json, failing: still one valid document on stdout, with version, ok false and the error
	rc_is 1 "$AIRLOCK" status -C "$T" --json && json "$T/o" status && has "$T/o" '"ok": *false' '"error": *"no airlock up' &&
		rc_is 1 "$AIRLOCK" audit -C "$T/nonexistent" --json && json "$T/o" failure && has "$T/o" '"error": *"audit: ' &&
		rc_is 2 "$AIRLOCK" ping --json && json "$T/o" failure && has "$T/o" '"exit": *2' 'missing --guest' &&
		rc_is 2 "$AIRLOCK" sync "$T" --guest "unix:$T/none.sock" --key "$T/k" --guest-key AAAA --json &&
		json "$T/o" failure && has "$T/o" 'not a public key'
}
check "--json failures are valid JSON documents (status, audit, ping, sync)" t_json_failures
t_init() {
	local p=$T/proj
	mkdir -p "$p/src" "$p/deps"
	echo '{}' >"$p/package.json"
	echo 'module x' >"$p/go.mod"
	echo x >"$p/.env"
	echo 'deps/' >"$p/.gitignore"
	touch "$p/src/a.c" "$p/deps/d.js"
	rc_is 0 "$AIRLOCK" init "$p" && has "$T/o" "wrote $p/airlock.json" 'package.json \(npm\)' 'go.mod \(Go modules\)' &&
		json "$p/airlock.json" airlock && has "$p/airlock.json" '"\$schema"' 'registry.npmjs.org' 'proxy.golang.org' &&
		rc_is 1 "$AIRLOCK" init "$p" && has "$T/e" 'exists' 'airlock policy check' '--force' &&
		rc_is 0 "$AIRLOCK" policy check "$p/airlock.json" && has "$T/o" 'valid \(3 egress hosts' &&
		rc_is 0 bash -c "cd '$p/src' && '$AIRLOCK' policy check" &&
		rc_is 0 "$AIRLOCK" policy explain -C "$p" "$p/.env" "$p/src/a.c" "$p/deps/d.js" &&
		has "$T/o" '^\.env: withheld by secret: ' '^src/a\.c: synced' '^deps/d\.js: withheld by gitignore: \.gitignore:1: deps/' &&
		echo '{"$schema": "x", "egress": {"allow": ["https://example.com/x"]}}' >"$T/url.json" &&
		rc_is 2 "$AIRLOCK" policy check "$T/url.json" && has "$T/e" 'egress.allow\[0\]' 'give the host name'
}
check "init writes a starter policy from the detected files (valid, with \$schema); policy check and explain" t_init
t_doctor() {
	local rc=0
	"$AIRLOCK" doctor --json >"$T/o" 2>"$T/e" || rc=$?
	json "$T/o" doctor && { [ "$rc" = 0 ] || [ "$rc" = 1 ]; } &&
		python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); n={c["name"] for c in d["checks"]}
need={"fuse","fusermount3","user namespaces","landlock","seccomp","qemu","kvm","cgroups","mounts"}
assert need <= n, need - n
assert all(c["fix"] for c in d["checks"] if c["status"] != "ok"), d
assert (int(sys.argv[2]) == 0) == d["ok"], d' "$T/o" "$rc" &&
		"$AIRLOCK" doctor >"$T/o" 2>&1 || [ $? = 1 ] && has "$T/o" '^ok +fuse' 'failed, [0-9]+ warning'
}
check "doctor [--json]: every check, a fix for each problem, exit 1 only on a failure" t_doctor
t_audit_empty() {
	mkdir -p "$T/fresh"
	rc_is 0 "$AIRLOCK" audit -C "$T/fresh" --json && json "$T/o" audit &&
		python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["version"]==1
assert d["egress"]["denials"]==[] and d["sync"]["withheld"]==[] and d["sync"]["skipped"]==[], d' "$T/o"
}
check "audit --json with nothing recorded: version, [] lists, never null" t_audit_empty

# ---- the parts that mount: a real airlock up with the embedded sandbox ----
if [ "$CAN_MOUNT" != 1 ]; then
	skip "the traps and failures need root and /dev/fuse (uid $(id -u))"
	finish
	exit $?
fi
W=$T/ws/work
mkdir -p "$W/sub"
echo hello >"$W/a.txt"
up_d() { $TO 60 "$AIRLOCK" up "$@" -d >"$T/up.out" 2>"$T/up.err"; }
down_q() { $TO 20 "$AIRLOCK" down "$1" >/dev/null 2>&1 || true; }

if up_d "$W"; then ok "up -d of a plain workspace"; else not_ok "up -d: $(cat "$T/up.err")"; fi
t_timeout_line() {
	rc_is 124 "$AIRLOCK" exec -C "$W" --timeout 1 -- sleep 5 &&
		has "$T/e" "timed out after 1\.[0-9] s" "--timeout 1" &&
		rc_is 124 "$AIRLOCK" shell -C "$W" --timeout 0.5 -c 'sleep 5' && has "$T/e" 'timed out' "--timeout 0.5"
}
check "a timeout says so on stderr, with the limit and where to change it" t_timeout_line
t_127_line() {
	rc_is 127 "$AIRLOCK" exec -C "$W" -- no-such-command-xyz &&
		has "$T/e" "'no-such-command-xyz'.*not found in the sandbox" 'PATH there is /[^ ]*bin' 'full path'
}
check "127 says the command was not found in the sandbox, with its PATH there" t_127_line
t_exit_quiet() { rc_is 3 "$AIRLOCK" exec -C "$W" -- sh -c 'exit 3' && [ ! -s "$T/e" ]; }
check "an ordinary exit status adds no line" t_exit_quiet
down_q "$W"

# ^C of a foreground up, as a terminal sends it: to the whole process group
# (its sandbox or agent too). MODE peer-kill: the peer dies without FINAL at
# the same instant, and up sees both in one wake (up is stopped meanwhile).
sigint_up() { # sigint_up LOG MODE CMD...
	python3 - "$@" <<'PY'
import os, signal, subprocess, sys, time
log, mode, cmd = sys.argv[1], sys.argv[2], sys.argv[3:]
p = subprocess.Popen(cmd, stdout=open(log + ".out", "w"), stderr=open(log + ".err", "w"), start_new_session=True)
for _ in range(1200):
    if " in sync with " in open(log + ".out").read():
        break
    time.sleep(0.05)
time.sleep(0.3)
# the daemon is the child of airlock up's supervisor (doc/UP.md "Crashes")
def comm(pid):
    try:
        return open("/proc/%s/comm" % pid).read().strip()
    except OSError:
        return ""
kids = [k for k in open("/proc/%d/task/%d/children" % (p.pid, p.pid)).read().split() if comm(k) == "airlock"]
d = int(kids[0]) if kids else p.pid
os.kill(d, signal.SIGSTOP)
if mode == "peer-kill":
    os.kill(int(open(log + ".agentpid").read()), signal.SIGKILL)
    os.kill(d, signal.SIGINT)
else:
    os.killpg(p.pid, signal.SIGINT)
time.sleep(0.5)
os.kill(d, signal.SIGCONT)
try:
    print(p.wait(30))
except subprocess.TimeoutExpired:
    p.kill()
    print("hung")
PY
}
t_ctrl_c() {
	local rc
	rc=$(sigint_up "$T/int" group "$AIRLOCK" up "$W")
	[ "$rc" = 130 ] || { echo "exit $rc, wanted 130" >&2; cat "$T/int.err" >&2; return 1; }
	! grep -qiE 'FINAL|lost|error' "$T/int.err" || { cat "$T/int.err" >&2; return 1; }
}
check "^C of a foreground up (sandbox local) exits 130, no connection error" t_ctrl_c
make_pair # (W stays $T/ws/work below)
W=$T/ws/work
t_ctrl_c_peer() {
	local rc
	cat >"$T/both.sh" <<SH
"$AGENT" --listen unix:$T/a.sock --root "$G" --key "$T/gk" --allow "$HPUB" --fsync none --state "$T/agent.state" &
echo \$! >"$T/intp.agentpid"
for i in \$(seq 100); do [ -S "$T/a.sock" ] && break; sleep 0.05; done
exec "$AIRLOCK" up "$W" --guest unix:$T/a.sock --key "$T/hk" --guest-key "$GPUB"
SH
	rc=$(sigint_up "$T/intp" peer-kill sh "$T/both.sh")
	[ "$rc" = 130 ] || { echo "exit $rc, wanted 130" >&2; cat "$T/intp.err" >&2; return 1; }
	! grep -qE 'FINAL|lost' "$T/intp.err" || { cat "$T/intp.err" >&2; return 1; }
}
check "^C while the peer dies in the same instant: 130, no 'peer closed without FINAL'" t_ctrl_c_peer

# ---- traps: each refused or named before anything starts ----
t_not_dir() {
	echo x >"$T/afile"
	rc_is 2 $TO 20 "$AIRLOCK" up "$T/afile" && has "$T/e" "$T/afile is not a directory" && ! grep -qi policy "$T/e"
}
check "up AFILE says it is not a directory (not a policy error)" t_not_dir
t_home() {
	mkdir -p "$T/home"
	HOME=$T/home rc_is 2 $TO 20 "$AIRLOCK" up "$T/home" && has "$T/e" 'home directory' '--allow-home' &&
		HOME=$T/home up_d "$T/home" --allow-home && down_q "$T/home"
}
check "up \$HOME asks for --allow-home (and works with it)" t_home
t_own_state() {
	# the default XDG paths under a home given as the workspace: up would hang (the issue's trap)
	mkdir -p "$T/home2"
	(unset XDG_STATE_HOME XDG_RUNTIME_DIR XDG_DATA_HOME && HOME=$T/home2 rc_is 2 $TO 20 "$AIRLOCK" up "$T/home2" --allow-home) &&
		has "$T/e" "holds airlock's own state directory \($T/home2/.local/state/airlock/" 'XDG_STATE_HOME=' &&
		XDG_RUNTIME_DIR=$T/ws/run rc_is 2 $TO 20 "$AIRLOCK" up "$T/ws" && has "$T/e" "own relay socket" 'XDG_RUNTIME_DIR=.*AIRLOCK_SOCKET' &&
		XDG_DATA_HOME=$T/ws/data rc_is 2 $TO 20 "$AIRLOCK" up "$T/ws" && has "$T/e" "own sandbox state" 'XDG_DATA_HOME='
}
check "up refuses a workspace holding airlock's own state, socket or sandbox dirs, naming the setting" t_own_state
t_url_policy() {
	mkdir -p "$T/urlws"
	echo '{"egress": {"allow": ["https://example.com"]}}' >"$T/urlws/airlock.json"
	rc_is 2 $TO 20 "$AIRLOCK" up "$T/urlws" && has "$T/e" 'egress.allow\[0\]' 'give the host name' && ! grep -q 'port must' "$T/e"
}
check "a URL in egress.allow: the message says to give the host name" t_url_policy

# a shell already in DIR before the mount (the issue's first trap)
(cd "$W" && exec sleep 300) &
SLEEPER=$!
PIDS+=("$SLEEPER")
t_procs_named() {
	up_d "$W" && has "$T/up.err" "pid $SLEEPER \(sleep, cwd\)" 'will not see the mount' 'cd "\$PWD"'
}
check "up names the processes whose cwd is below DIR, with the fix" t_procs_named
t_doctor_shell() {
	"$AIRLOCK" doctor >"$T/o" 2>&1 || true
	has "$T/o" "pid $SLEEPER \(sleep\) has its cwd in the directory under a mount" 'fix: in that shell: cd "\$PWD"'
}
check "doctor names a shell whose cwd is below a mount, with the fix" t_doctor_shell
kill "$SLEEPER" 2>/dev/null || true
t_exec_under() {
	# a shell whose cwd was taken before the mount: the directory under it
	down_q "$W"
	rc_is 0 bash -c "cd '$W' && '$AIRLOCK' up '$W' -d >/dev/null 2>&1 && '$AIRLOCK' exec -- true" &&
		has "$T/e" 'directory under the airlock mount' 'cd "\$PWD"' &&
		rc_is 0 bash -c "cd '$W' && '$AIRLOCK' exec -- true" && ! grep -q 'under the airlock mount' "$T/e"
}
check "exec warns when its cwd is the directory under the mount, not when it is on it" t_exec_under
t_subdir() {
	rc_is 0 bash -c "cd '$W/sub' && '$AIRLOCK' status" && has "$T/o" "^workspace +$W " &&
		rc_is 0 bash -c "cd '$W/sub' && '$AIRLOCK' sync-wait --timeout 20" &&
		rc_is 0 bash -c "cd '$W/sub' && '$AIRLOCK' audit" && has "$T/o" 'last sync scan' &&
		rc_is 0 bash -c "cd '$W/sub' && '$AIRLOCK' status --json" && json "$T/o" status &&
		rc_is 0 bash -c "cd '$W/sub' && '$AIRLOCK' audit --json" && json "$T/o" audit
}
check "status, sync-wait and audit work from a subdirectory of the workspace" t_subdir
t_nested() {
	rc_is 2 $TO 20 "$AIRLOCK" up "$W/sub" && has "$T/e" "inside the live workspace $W" "airlock down $W" &&
		rc_is 2 $TO 20 "$AIRLOCK" up "$T/ws" && has "$T/e" "holds the live workspace $W" "airlock down $W"
}
check "a workspace inside or around a live one is refused" t_nested
down_q "$W"
t_status_none() {
	mkdir -p "$T/none/sub"
	rc_is 1 bash -c "cd '$T/none/sub' && '$AIRLOCK' status" && [ ! -s "$T/o" ] &&
		has "$T/e" "no airlock up runs for $T/none/sub" 'airlock up DIR' &&
		rc_is 1 bash -c "cd '$T/none/sub' && '$AIRLOCK' status --json" && json "$T/o" &&
		has "$T/o" '"running": *false' '"version": *1' "\"dir\": *\"$T/none/sub\""
}
check "status without a daemon: stderr, the resolved path; --json still valid JSON" t_status_none
t_no_fuse_access() {
	local nr=$T/nr
	mkdir -p "$nr/w"
	chown -R 65534:65534 "$nr"
	chmod 755 "$T"
	if setpriv --reuid=65534 --regid=65534 --clear-groups test -r /dev/fuse -a -w /dev/fuse; then
		echo "(uid 65534 can open /dev/fuse here: nothing to test)"
		return 0
	fi
	rc_is 1 setpriv --reuid=65534 --regid=65534 --clear-groups env -i HOME="$nr" PATH=/usr/bin:/bin \
		"$AIRLOCK" up "$nr/w" &&
		has "$T/e" '/dev/fuse' 'Permission denied' 'chmod 0666 /dev/fuse' && ! grep -q 'sandbox started' "$T/e" &&
		[ ! -e "$nr/.local/share/airlock/sandboxes" ] && [ -z "$(pgrep -u 65534 -f "root $nr/w" || true)" ]
}
if command -v setpriv >/dev/null; then
	check "non-root without /dev/fuse access: the cause and the fix, nothing started" t_no_fuse_access
else
	skip "no setpriv: the non-root /dev/fuse case"
fi

# ---- list, logs, gc ----
t_list() {
	rc_is 0 "$AIRLOCK" list --json && json "$T/o" list && has "$T/o" '"workspaces": *\[\]' &&
		up_d "$W" && rc_is 0 "$AIRLOCK" list --json && json "$T/o" list &&
		python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); w=[x for x in d["workspaces"] if x["dir"]==sys.argv[2]]
assert len(w)==1 and w[0]["running"] and w[0]["pid"]>0 and w[0]["kind"]=="local" and w[0]["state"]=="live", d' "$T/o" "$W" &&
		rc_is 0 "$AIRLOCK" list && has "$T/o" "^$W +live +local +[0-9]+"
}
t_list_fresh() {
	local rc=0
	XDG_STATE_HOME=$T/emptystate t_list || rc=1
	XDG_STATE_HOME=$T/emptystate down_q "$W"
	return $rc
}
check "list [--json]: [] with none, then the running workspace (state, kind, pid)" t_list_fresh
t_logs() {
	local lp
	start_bg upfg "$AIRLOCK" up "$W" # foreground: no -d, still logged
	wait_line "$T/upfg.out" 'in sync with' 30 || return 1
	rc_is 0 "$AIRLOCK" logs "$W" &&
		has "$T/o" "^==> daemon: .*/up.log <==" "^20[0-9-]{8}T[0-9:]{8}\.[0-9]{3}Z airlock: $W mounted" '^==> agent: .*agent.log <==' || return 1
	"$AIRLOCK" logs -f -n 0 -C "$W/sub" >"$T/logf.out" 2>&1 &
	lp=$!
	PIDS+=("$lp")
	sleep 0.5
	$TO 20 "$AIRLOCK" down "$W" >/dev/null 2>&1
	wait_line "$T/logf.out" 'Z airlock: stopping \(SIGTERM\)' 10 || return 1
	kill "$lp"
}
check "logs: the daemon's timestamped log without -d, the agent's, -f follows from a subdirectory" t_logs
t_log_rotate() {
	local log
	log=$(sed -n 's/^==> daemon: \(.*\/up\.log\) <==$/\1/p' "$T/o" | head -n 1)
	[ -f "$log" ] || { echo "no daemon log named in: $(cat "$T/o")" >&2; return 1; }
	head -c 1048576 /dev/zero | tr '\0' x >>"$log" # full: the next line rotates it
	up_d "$W" || return 1
	local old=$(stat -c %s "$log.1" 2>/dev/null || echo 0) new=$(stat -c %s "$log")
	down_q "$W"
	[ "$old" -ge 1048576 ] && [ "$new" -lt 65536 ] && grep -q "Z airlock: $W mounted" "$log" ||
		{ echo "after a full log: up.log.1 $old bytes, up.log $new bytes" >&2; return 1; }
}
check "logs: a full up.log is rotated to up.log.1 (at most two files of 1 MiB)" t_log_rotate
t_gc() {
	local gw=$T/gone gsb
	mkdir -p "$gw"
	up_d "$gw" && down_q "$gw" && rm -rf "$gw" &&
		gsb=$(sed -n 's/.*state in \(.*\)$/\1/p' "$T/up.err") && [ -d "$gsb" ] &&
		rc_is 0 "$AIRLOCK" list && has "$T/o" "^$gw .*directory gone: airlock gc" &&
		rc_is 0 "$AIRLOCK" gc --dry-run && has "$T/o" "would remove .*\($gw\), its directory is gone" &&
		rc_is 0 "$AIRLOCK" gc && has "$T/o" 'removed the state of [0-9]+ workspace' &&
		rc_is 0 "$AIRLOCK" list --json && { ! grep -q "\"$gw\"" "$T/o" || { cat "$T/o" >&2; false; }; } && [ ! -e "$gsb" ] &&
		rc_is 0 "$AIRLOCK" list && has "$T/o" "^$W +stopped"
}
t_doctor_stale() {
	local sw=$T/stale pid dpid
	mkdir -p "$sw"
	# the supervisor (its pid is the one -d prints) first, so it restarts nothing, then the daemon
	up_d "$sw" && pid=$(sed -n 's/.*in the background as pid \([0-9]*\).*/\1/p' "$T/up.err") && [ -n "$pid" ] &&
		dpid=$(cat "/proc/$pid/task/$pid/children") && kill -9 "$pid" $dpid && sleep 0.5 &&
		{ "$AIRLOCK" doctor >"$T/o" 2>&1; [ $? = 1 ]; } &&
		has "$T/o" "FAIL +stale mount +$sw is an airlock mount whose daemon is gone" 'fix: airlock down DIR' &&
		$TO 20 "$AIRLOCK" down "$sw" >/dev/null 2>&1 && ! grep -q " $sw " /proc/self/mounts
}
check "doctor finds the stale mount of a killed up (FAIL, fix airlock down); down clears it" t_doctor_stale
t_progress() {
	local pw=$T/many i
	mkdir -p "$pw"
	for i in $(seq 400); do head -c 20000 /dev/urandom >"$pw/f$i"; done
	up_d "$pw" && has "$T/up.err" "^airlock: $pw: scan\.\.\." && down_q "$pw" &&
		rm -rf "$XDG_DATA_HOME/airlock/sandboxes" && # a fresh sandbox: everything is sent again
		up_d "$pw" --quiet && ! grep -qE "^airlock: $pw: (scan|send|reconcile)" "$T/up.err" && down_q "$pw"
}
check "up shows the initial sync's progress (periodic lines when not a terminal); --quiet does not" t_progress
check "gc removes the state (and sandbox state) of a workspace whose directory is gone, keeps the rest" t_gc
#@MORE@

finish
