#!/usr/bin/env bash
# Guest changes end to end (doc/SYNC.md "Guest changes and write-back"):
# `airlock up DIR` with the local sandbox, real commands through `airlock
# exec` change the guest's copy, and `airlock changes/accept/reject` review
# them: a formatter-style rewrite of 200 files, a new file, a delete, a
# directory rename, a mode change, a guest change plus a host edit of the
# same file (both kept), unreviewed changes across down/up and an agent
# restart, protected paths never written back by auto mode, the write-back
# cap, and auto mode's writes on the host before the exit reaches the client.
# usage: changes_e2e.sh AIRLOCK AIRLOCK_AGENT   (root + /dev/fuse + user namespaces, else skipped: exit 77)
# shellcheck source=tests/e2e/lib.sh
source "$(dirname "$0")/lib.sh"

AIRLOCK=$1
if [ "$(id -u)" != 0 ] || [ ! -c /dev/fuse ]; then
	echo "skip - changes_e2e needs root and /dev/fuse"
	exit 77
fi
if ! unshare -U true 2>/dev/null; then
	echo "skip - changes_e2e: this machine does not allow user namespaces"
	exit 77
fi
export XDG_STATE_HOME=$T/state
export XDG_DATA_HOME=$T/data
export XDG_CONFIG_HOME=$T/config # the trust store: this test's policies are the user's own
export AIRLOCK_SOCKET=$T/relay.sock
export HOME=$T/hosthome
TO="timeout -k 2"
W=$T/work
mkdir -p "$W/src/fmt" "$W/olddir" "$HOME"
for i in $(seq 1 200); do printf 'x  =  %d\n' "$i" >"$W/src/fmt/f$i.py"; done
echo "print('hi')" >"$W/app.py"
echo "to delete" >"$W/gone.txt"
echo "in old dir" >"$W/olddir/a.txt"
echo "run me" >"$W/run.sh"
printf 'node_modules/\n' >"$W/.gitignore"
trap '"$AIRLOCK" down "$W" >/dev/null 2>&1 || true; cleanup' EXIT

up() {
	start_bg up "$AIRLOCK" up "$W" "$@"
	UP_PID=$BG_PID
	wait_line "$T/up.out" "^airlock: $W in sync with sandbox local\$" 30
}
down() {
	"$AIRLOCK" down "$W" >"$T/down.out" 2>&1 || { cat "$T/down.out" >&2; return 1; }
	wait "$UP_PID" 2>/dev/null || true
}
X() { $TO 60 "$AIRLOCK" exec -C "$W" "$@" </dev/null; }
C() { $TO 60 "$AIRLOCK" changes -C "$W" "$@"; }
policy() { # the workspace's airlock.json, approved (auto globs loosen the default: doc/UP.md "Trust")
	printf '%s\n' "$1" >"$W/airlock.json" && "$AIRLOCK" trust "$W" >/dev/null
}

up

t_review_default() {
	X -- sh -c 'sed -i "s/  =  / = /" src/fmt/*.py && echo new >new.txt && rm gone.txt && mv olddir newdir && chmod 755 run.sh' 2>"$T/x.err" &&
		grep -q '^airlock: 0 changes written back, 20[0-9] wait for review (airlock changes)$' "$T/x.err" &&
		[ "$(cat "$W/src/fmt/f1.py")" = "x  =  1" ] && [ ! -e "$W/new.txt" ] && [ -e "$W/gone.txt" ] &&
		[ -d "$W/olddir" ] && [ ! -x "$W/run.sh" ]
}
check "review (default): a formatter over 200 files, a new file, a delete, a dir rename, a chmod wait; the host is untouched" t_review_default

t_list_waiting() {
	$TO 10 "$AIRLOCK" list --json >"$T/list.json" &&
		python3 - "$T/list.json" "$(realpath "$W")" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
w = [e for e in doc["workspaces"] if e["dir"] == sys.argv[2]]
assert w and w[0]["changes_waiting"] >= 200, w
PY
}
check "airlock list counts the guest changes waiting for review" t_list_waiting

t_list() {
	C --json >"$T/c.json" &&
		python3 - "$T/c.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
ch = {c["path"]: c for c in d["changes"]}
assert d["version"] == 1
assert sum(1 for p in ch if p.startswith("src/fmt/")) == 200, len(ch)
assert ch["src/fmt/f7.py"]["kind"] == "modify"
assert ch["new.txt"]["kind"] == "create" and ch["new.txt"]["size"] == 4
assert ch["gone.txt"]["kind"] == "delete"
assert ch["run.sh"]["kind"] == "mode" and ch["run.sh"]["mode"] == "0755", ch["run.sh"]
assert ch["newdir/a.txt"]["kind"] == "rename" and ch["newdir/a.txt"]["from"] == "olddir/a.txt", ch["newdir/a.txt"]
assert "olddir/a.txt" not in ch
by = ch["new.txt"]["by"]
assert by["argv"][0] == "sh" and "echo new" in by["argv"][2], by
assert ch["new.txt"]["protected"] is None and ch["new.txt"]["conflict"] is False
PY
}
check "changes --json lists each change with its kind and the command that made it" t_list

t_diff() {
	C --diff src/fmt/f3.py >"$T/d.out" && grep -q '^-x  =  3$' "$T/d.out" && grep -q '^+x = 3$' "$T/d.out" &&
		C --stat >"$T/s.out" && grep -q ' 20[0-9] changes$' "$T/s.out"
}
check "changes --diff shows a unified diff against the host; --stat counts" t_diff

t_accept() {
	$TO 60 "$AIRLOCK" accept -C "$W" src new.txt gone.txt newdir olddir run.sh >"$T/a.out" &&
		[ "$(cat "$W/src/fmt/f200.py")" = "x = 200" ] && [ "$(cat "$W/new.txt")" = new ] && [ ! -e "$W/gone.txt" ] &&
		[ "$(cat "$W/newdir/a.txt")" = "in old dir" ] && [ ! -e "$W/olddir/a.txt" ] && [ -x "$W/run.sh" ] &&
		[ "$(C --json)" = '{"version":1,"changes":[]}' ]
}
check "accept writes them to the host through the mount; nothing waits afterwards" t_accept

t_no_loop() {
	"$AIRLOCK" sync-wait -C "$W" && sleep 0.5 && [ "$(C --json)" = '{"version":1,"changes":[]}' ] &&
		[ "$(X -- cat src/fmt/f9.py)" = "x = 9" ]
}
check "the write-back does not loop back as a host edit" t_no_loop

t_reject() {
	X -- sh -c 'echo guest >app.py; echo junk >junk.txt' 2>/dev/null &&
		$TO 60 "$AIRLOCK" reject -C "$W" --all >"$T/r.out" &&
		[ "$(X -- cat app.py)" = "print('hi')" ] && X -- test ! -e junk.txt && [ "$(C --json)" = '{"version":1,"changes":[]}' ]
}
check "reject puts the host's version back in the guest (a modified file, a created one)" t_reject

guest_is() { [ "$(X -- cat "$1" 2>/dev/null)" = "$2" ]; }
until_ok() { local i; for ((i = 0; i < 100; i++)); do "$@" && return 0; sleep 0.1; done; return 1; }
t_conflict() {
	X -- sh -c 'echo guest-side >app.py' 2>/dev/null && echo host-side >"$W/app.py" &&
		"$AIRLOCK" sync-wait -C "$W" && until_ok guest_is app.py host-side && C --json >"$T/c.json" &&
		grep -q '"path":"app.py","kind":"modify"' "$T/c.json" && grep -q '"conflict":true' "$T/c.json" &&
		[ "$(cat "$W/app.py")" = host-side ] && C --diff app.py >"$T/d.out" && grep -q '^+guest-side$' "$T/d.out" &&
		grep -q '^-host-side$' "$T/d.out" && ls "$XDG_STATE_HOME"/airlock/*/conflict-* >/dev/null
}
check "a guest change plus a host edit of the same file: the host's goes to the guest, the guest's is kept (conflict, diff)" t_conflict

t_survive() {
	X -- sh -c 'echo survivor >keep.txt' 2>/dev/null && down && up &&
		[ "$(X -- cat keep.txt)" = survivor ] && [ "$(X -- cat app.py)" = host-side ] &&
		C --json | grep -q '"path":"keep.txt"' && C --json | grep -q '"path":"app.py","kind":"modify".*"conflict":true'
}
check "unreviewed changes and the kept conflict survive down/up (the reconcile keeps them)" t_survive

t_accept_conflict() {
	$TO 60 "$AIRLOCK" accept -C "$W" app.py >/dev/null && [ "$(cat "$W/app.py")" = guest-side ] &&
		until_ok guest_is app.py guest-side && ! C --json | grep -q '"path":"app.py"' &&
		! ls "$XDG_STATE_HOME"/airlock/*/conflict-* >/dev/null 2>&1
}
check "accept of the conflict writes the kept guest version to the host, and the guest gets it back" t_accept_conflict

agent_pid() { pgrep -f "airlock-agent .*--root $W --key"; } # this test's agent only
kill_agent() { local p; p=$(agent_pid) && kill -KILL $p; }
t_agent_restart() {
	kill_agent || return 1
	for _ in $(seq 1 100); do X -- true 2>/dev/null && break; sleep 0.1; done
	[ "$(X -- cat keep.txt)" = survivor ] && C --json | grep -q '"path":"keep.txt"'
}
check "unreviewed changes survive an agent restart" t_agent_restart

t_unreported() {
	# no other command ends meanwhile (each exit reports every change so far)
	(X -- sh -c 'sleep 1; echo unreported >late.txt; sleep 30' >/dev/null 2>&1 &)
	sleep 4
	kill_agent || return 1
	for _ in $(seq 1 100); do X -- true 2>/dev/null && break; sleep 0.1; done
	[ "$(X -- cat late.txt)" = unreported ] && C --json | grep -q '"path":"late.txt","kind":"create"' &&
		[ ! -e "$W/late.txt" ]
}
check "a change whose command never reported it (the agent killed while it ran) is found by the reconcile and kept" t_unreported

# auto mode: everything matches the globs, only the protected paths wait
$TO 30 "$AIRLOCK" reject -C "$W" --all >/dev/null
AUTO_POLICY='{"workspace": {"writeback": {"auto": ["**"]}, "guest_owned": ["build/"]}}'
policy "$AUTO_POLICY"
down && up

t_auto() {
	X -- sh -c 'echo auto >src/auto.txt && cat src/auto.txt' >"$T/x.out" 2>"$T/x.err" &&
		[ "$(cat "$W/src/auto.txt")" = auto ] && grep -q '^airlock: 1 change written back$' "$T/x.err" &&
		[ "$(C --json)" = '{"version":1,"changes":[]}' ] || { cat "$T/x.err" >&2; C --json >&2; return 1; }
}
check "auto mode: the change is on the host when exec returns (before the exit reached the client)" t_auto

t_owned() {
	X -- sh -c 'mkdir -p build && echo obj >build/out.o' 2>"$T/x.err" && [ ! -s "$T/x.err" ] && [ ! -e "$W/build" ] &&
		[ "$(C --json)" = '{"version":1,"changes":[]}' ]
}
check "workspace.guest_owned: build/ stays in the guest, not a change, not on the host" t_owned

PROTECTED="airlock.json .git/hooks/pre-commit .vscode/settings.json .claude/settings.json .github/workflows/ci.yml .envrc .env suid fifo out"
t_protected() {
	X -- sh -c 'echo "{}" >airlock.json; mkdir -p .git/hooks .vscode .claude .github/workflows;
		echo evil >.git/hooks/pre-commit; echo {} >.vscode/settings.json; echo {} >.claude/settings.json;
		echo on: push >.github/workflows/ci.yml; echo "export X=1" >.envrc; echo SECRET=1 >.env;
		echo x >suid; chmod 4755 suid; mkfifo fifo; ln -s /etc/passwd out; echo fine >src/fine.txt' 2>"$T/x.err" &&
		grep -q '^airlock: 2 changes written back, ' "$T/x.err" && [ "$(cat "$W/src/fine.txt")" = fine ] && [ -d "$W/.github" ] &&
		C --json >"$T/c.json" && python3 - "$T/c.json" $PROTECTED <<'PY' && [ ! -e "$W/.env" ] && [ ! -e "$W/.envrc" ] &&
import json, sys
ch = {c["path"]: c for c in json.load(open(sys.argv[1]))["changes"]}
for p in sys.argv[2:]:
    assert p in ch, (p, sorted(ch))
    assert ch[p]["protected"], (p, ch[p])
assert "src/fine.txt" not in ch
PY
		[ "$(cat "$W/airlock.json")" = "$AUTO_POLICY" ] && [ ! -e "$W/out" ] && [ ! -e "$W/fifo" ]
}
check "auto mode never writes a protected path (policy file, .git, editor/agent settings, CI, .envrc, .env, setuid, fifo, symlink out); review marks them" t_protected

t_accept_all_skips_protected() {
	! $TO 60 "$AIRLOCK" accept -C "$W" --all >"$T/a.out" && grep -q '^refused .vscode/settings.json: protected' "$T/a.out" &&
		[ ! -e "$W/.vscode/settings.json" ]
}
check "accept --all refuses the protected ones (they must be named)" t_accept_all_skips_protected
$TO 30 "$AIRLOCK" reject -C "$W" --all >/dev/null

t_cap_default() {
	X -- sh -c 'truncate -s 10G huge.bin' 2>"$T/x.err" && ! $TO 60 "$AIRLOCK" accept -C "$W" huge.bin 2>"$T/a.err" &&
		grep -q 'over the write-back cap of 1024 MiB (workspace.writeback_max_mib); nothing was written' "$T/a.err" &&
		[ ! -e "$W/huge.bin" ] && grep -q 'huge.bin .* over the cap of 1024 MiB (workspace.writeback_max_mib); it waits' "$T/up.err"
}
check "a 10 GiB write is refused at the default cap (1024 MiB), in auto mode and by accept; the host untouched" t_cap_default

t_undone() {
	X -- rm huge.bin && [ "$(C --json)" = '{"version":1,"changes":[]}' ]
}
check "a change the guest undoes (the file removed again) no longer waits" t_undone

policy '{"workspace": {"writeback": {"auto": ["**"]}, "writeback_max_mib": 1, "guest_owned": ["build/"]}}'
down && up
t_owned_kept() { [ "$(X -- cat build/out.o)" = obj ] && [ ! -e "$W/build" ]; }
check "guest-owned build/ is still in the guest after down/up (never deleted by the reconcile)" t_owned_kept
t_cap_low() {
	X -- sh -c 'head -c 3000000 /dev/urandom >big.bin; echo small >small.txt' 2>"$T/x.err" &&
		grep -q '^airlock: 1 change written back, 1 waits for review' "$T/x.err" && [ ! -e "$W/big.bin" ] &&
		[ "$(cat "$W/small.txt")" = small ] && echo small2 >"$W/small.txt" &&
		! $TO 60 "$AIRLOCK" accept -C "$W" big.bin 2>"$T/a.err" && grep -q 'cap of 1 MiB (workspace.writeback_max_mib)' "$T/a.err" &&
		X -- sh -c 'echo small3 >small.txt' 2>/dev/null && [ "$(cat "$W/small.txt")" = small3 ] && [ ! -e "$W/big.bin" ]
}
check "a lowered cap (workspace.writeback_max_mib: 1) refuses a 3 MB write with the host untouched; smaller ones still land" t_cap_low

t_clean() { down && ! grep -qE 'ERROR: [A-Za-z]+Sanitizer|runtime error:' "$T/up.err"; }
check "down; no sanitizer reports from airlock up" t_clean

finish
