#!/usr/bin/env bash
# Forks of the local sandbox end to end (doc/SANDBOX.md "Forks"): `airlock
# up DIR`, a warm sandbox (a node_modules and a home file made in the
# guest), `airlock fork`, commands in forks with `airlock exec --fork`.
# Isolation (a fork's write is absent from the parent, the other fork and
# the host; the parent's and the host's later edits never reach a fork),
# a fork's egress under the parent's allow-list, `airlock try` with three
# patches of which one passes (its changes, and only those, become the
# parent's guest changes), cleanup (fork --rm, the TTL, down, down
# --destroy: no agents, cgroups, state left), the layer stack merged back,
# and hostile input (a patch with ../, a secret's path, a bad name, -n 1000).
# usage: fork_e2e.sh AIRLOCK AIRLOCK_AGENT   (root + /dev/fuse + user namespaces + overlayfs, else skipped: exit 77)
# shellcheck source=tests/e2e/lib.sh
source "$(dirname "$0")/lib.sh"

AIRLOCK=$1
if [ "$(id -u)" != 0 ] || [ ! -c /dev/fuse ]; then
	echo "skip - fork_e2e needs root and /dev/fuse"
	exit 77
fi
if ! unshare -U true 2>/dev/null; then
	echo "skip - fork_e2e: this machine does not allow user namespaces"
	exit 77
fi
if ! grep -qw overlay /proc/filesystems && ! modprobe overlay 2>/dev/null; then
	echo "skip - fork_e2e: no overlay filesystem in this kernel"
	exit 77
fi
for t in patch tar xargs curl; do
	command -v "$t" >/dev/null || {
		echo "skip - fork_e2e needs $t"
		exit 77
	}
done
export XDG_STATE_HOME=$T/state
export XDG_DATA_HOME=$T/data
export XDG_CONFIG_HOME=$T/config
export AIRLOCK_SOCKET=$T/relay.sock
export HOME=$T/hosthome
TO="timeout -k 2"
W=$T/work
mkdir -p "$W/src" "$HOME"
printf 'def f():\n    return 1\n' >"$W/src/m.py"
echo hello >"$W/a.txt"
printf 'node_modules/\n' >"$W/.gitignore"
printf '{"egress": {"default": "deny", "allow": ["allowed.test"]}, "credentials": {"forward_env": ["FORK_TOKEN"]},
 "execution": {"local": ["hostname"]}}\n' >"$W/airlock.json"
"$AIRLOCK" trust "$W" >/dev/null
trap '"$AIRLOCK" down "$W" >/dev/null 2>&1 || true; cleanup' EXIT

up() {
	FORK_TOKEN=tok-$$ start_bg up "$AIRLOCK" up "$W"
	UP_PID=$BG_PID
	wait_line "$T/up.out" "^airlock: $W in sync with sandbox local\$" 30
}
X() { $TO 60 "$AIRLOCK" exec -C "$W" "$@" </dev/null; }
F() { # airlock fork; on failure the forks' agent logs (the reason a start failed is there)
	local rc=0
	$TO 60 "$AIRLOCK" fork -C "$W" "$@" || rc=$?
	[ "$rc" = 0 ] || [ "$rc" = 2 ] || tail -n 20 "${SD:-/nonexistent}"/forks/*/agent.log >&2 2>/dev/null || true
	return "$rc"
}
SCHEMAS=$(dirname "$0")/../../doc/schema
valid() { # valid FILE NAME: FILE is a NAME document (doc/schema); no python3-jsonschema: passes, said once
	local rc=0
	python3 "$(dirname "$0")/../harness/schema_check.py" "$SCHEMAS" "$2" "$1" || rc=$?
	[ "$rc" = 0 ] || [ "$rc" = 77 ]
}
daemon_pid() { $TO 10 "$AIRLOCK" status -C "$W" --json | python3 -c 'import json, sys; print(json.load(sys.stdin)["pid"])'; }
# the forks' agents: the daemon's airlock-agent children, less the sandbox's own when it runs (a fork
# leaves it idle-stopped until its next command)
agents() {
	local n st
	st=$($TO 10 "$AIRLOCK" status -C "$W" --json)
	n=$(ps -o comm= --ppid "$(echo "$st" | python3 -c 'import json, sys; print(json.load(sys.stdin)["pid"])')" | grep -c '^airlock-agent$' || true)
	echo "$st" | grep -q '"sandbox_state":"running"' && n=$((n - 1))
	echo "$n"
}
# agents N: true once agents says N, within 15 s (a sandbox halted for a fork is torn down and reaped
# in the background: its agent is the daemon's child until then)
agents_are() {
	local i
	for i in $(seq 1 150); do
		[ "$(agents)" = "$1" ] && return 0
		sleep 0.1
	done
	echo "agents: $(agents), not $1" >&2
	return 1
}
state_dir() { ls -d "$XDG_DATA_HOME"/airlock/sandboxes/*/ | head -1; }

up
X -- sh -c 'mkdir -p node_modules/dep && echo "module.exports = 42" >node_modules/dep/index.js && echo warm >~/cache.txt' 2>/dev/null
SD=$(state_dir)

t_fork() {
	F -n 2 >"$T/fork.out" 2>&1 && grep -q '^fork f1 ready' "$T/fork.out" && grep -q '^fork f2 ready' "$T/fork.out" &&
		agents_are 2 || { cat "$T/fork.out" >&2; return 1; }
}
check "fork -n 2: two forks, each its own agent" t_fork

t_identity() { # each fork its own keys both ways; its agent refuses another sandbox's host key
	local d k1 g1 sock1 all
	all=$(for d in "$SD" "$SD/forks/f1" "$SD/forks/f2"; do
		"$AIRLOCK" pubkey "$d/keys/host.key" && "$AIRLOCK" pubkey "$d/keys/guest.key"
	done)
	[ "$(echo "$all" | wc -l)" = 6 ] && [ "$(echo "$all" | sort -u | wc -l)" = 6 ] || { echo "keys: $all" >&2; return 1; }
	g1=$("$AIRLOCK" pubkey "$SD/forks/f1/keys/guest.key")
	sock1=$SD/run.$(cat "$SD/forks/f1/slot")/agent.sock
	[ -S "$sock1" ] || { echo "no socket $sock1" >&2; return 1; }
	for k in "$SD/keys/host.key" "$SD/forks/f2/keys/host.key"; do
		if $TO 10 "$AIRLOCK" ping --guest "unix:$sock1" --key "$k" --guest-key "$g1" -n 1 --timeout 5 >"$T/id.o" 2>&1; then
			echo "fork f1's agent took the host key $k" >&2
			return 1
		fi
	done
	X --fork f1 -- true # its own channel is untouched
}
check "each fork has its own host and guest keys; a fork's agent refuses the parent's and another fork's host key" t_identity

t_parent_wakes() {
	$TO 10 "$AIRLOCK" status -C "$W" --json | grep -q '"sandbox_state":"idle-stopped"' &&
		[ "$(X -- cat a.txt)" = hello ] && $TO 10 "$AIRLOCK" status -C "$W" --json | grep -q '"sandbox_state":"running"'
}
t_policy() { # while the sandbox is stopped for the fork: credentials as the parent's, nothing on the host
	$TO 10 "$AIRLOCK" fork -C "$W" --name pol >/dev/null &&
		$TO 10 "$AIRLOCK" status -C "$W" --json | grep -q '"sandbox_state":"idle-stopped"' &&
		[ "$(X --fork pol -- sh -c 'echo "$FORK_TOKEN"')" = "tok-$$" ] && [ "$(X --fork pol -- hostname)" = airlock ] &&
		[ "$(X -- hostname)" = "$(hostname)" ] && F --rm pol >/dev/null
}
check "a fork's commands get the parent's credentials (forward_env) and run in the fork, never by execution.local on the host" t_policy

check "the sandbox, stopped for the fork, starts again at its next command" t_parent_wakes

t_inherits() {
	[ "$(X --fork f1 -- sh -c 'cat a.txt node_modules/dep/index.js ~/cache.txt')" = "hello
module.exports = 42
warm" ]
}
check "a fork inherits the workspace copy, the guest's node_modules and the home" t_inherits

t_isolation() {
	X --fork f1 -- sh -c 'echo f1 >f1.txt && echo changed >a.txt && rm src/m.py && echo more >>~/cache.txt' &&
		[ "$(X --fork f2 -- sh -c 'ls; cat a.txt ~/cache.txt')" = "a.txt
airlock.json
node_modules
src
hello
warm" ] &&
		[ "$(X -- sh -c 'cat a.txt ~/cache.txt; ls src; test ! -e f1.txt && echo none' 2>/dev/null)" = "hello
warm
m.py
none" ] &&
		[ ! -e "$W/f1.txt" ] && [ "$(cat "$W/a.txt")" = hello ] && [ -e "$W/src/m.py" ]
}
check "a fork's writes are absent from the parent, the other fork and the host" t_isolation

t_no_leak() {
	echo edit >"$W/host-later.txt" && "$AIRLOCK" sync-wait -C "$W" --timeout 20 &&
		X -- sh -c 'echo p >parent-later.txt && echo parent >>a.txt' 2>/dev/null &&
		[ "$(X -- cat host-later.txt)" = edit ] &&
		[ "$(X --fork f1 -- sh -c 'ls host-later.txt parent-later.txt 2>&1 | wc -l; cat a.txt')" = "2
changed" ] &&
		[ "$(X --fork f2 -- sh -c 'cat a.txt; test ! -e parent-later.txt && echo none')" = "hello
none" ]
}
check "the host's and the parent's later edits do not reach the forks" t_no_leak

t_egress() {
	X --fork f2 -- sh -c 'curl -sS --max-time 10 http://other.test/x; echo "rc=$?"; curl -sS --max-time 10 http://allowed.test/x; echo "rc=$?"' >"$T/eg.o" 2>"$T/eg.e" || true
	grep -q "airlock egress: denied GET other.test:80" "$T/eg.o" && ! grep -q "denied GET allowed.test" "$T/eg.o" &&
		$TO 10 "$AIRLOCK" audit -C "$W" --json | grep -q 'other.test' || {
		cat "$T/eg.o" "$T/eg.e" >&2
		return 1
	}
}
check "a fork's egress goes through the parent's proxy and allow-list (other.test denied and audited, allowed.test not)" t_egress

t_audit_shared() { # the sandbox's link and each fork's write one egress.json: none overwrites another's denials
	X -- sh -c 'curl -sS --max-time 10 http://parent-one.test/' >/dev/null 2>&1
	X --fork f2 -- sh -c 'curl -sS --max-time 10 http://fork-two.test/' >/dev/null 2>&1
	X -- sh -c 'curl -sS --max-time 10 http://parent-three.test/' >/dev/null 2>&1
	sleep 0.3 # a link writes at most every 100 ms
	$TO 10 "$AIRLOCK" audit -C "$W" --json >"$T/aud.json" &&
		grep -q 'parent-one.test' "$T/aud.json" && grep -q 'fork-two.test' "$T/aud.json" &&
		grep -q 'parent-three.test' "$T/aud.json" && grep -q 'other.test' "$T/aud.json" || {
		cat "$T/aud.json" >&2
		return 1
	}
}
check "the sandbox's and a fork's egress denials are all audited (one egress.json, merged, never overwritten)" t_audit_shared

t_egress_policy_own() { # the fork's copy of airlock.json is the fork's file, never the policy
	X --fork f2 -- sh -c 'printf "{\"egress\": {\"default\": \"allow\", \"allow\": [\"other.test\"]}}\n" >airlock.json' &&
		X --fork f2 -- sh -c 'curl -sS --max-time 10 http://other.test/y; echo "rc=$?"' >"$T/eg2.o" 2>&1
	grep -q "airlock egress: denied GET other.test:80" "$T/eg2.o" && ! grep -q other.test "$W/airlock.json" &&
		X -- sh -c 'curl -sS --max-time 10 http://other.test/z' 2>&1 | grep -q "airlock egress: denied GET other.test:80" || {
		cat "$T/eg2.o" >&2
		return 1
	}
}
check "a fork cannot change the policy: its own airlock.json is a file of its copy; the parent's allow-list still holds for it and for the parent" t_egress_policy_own

t_rm() {
	F --rm f1 >/dev/null || { echo "rm failed" >&2; return 1; }
	[ ! -e "$SD/forks/f1" ] || { echo "state left: $(ls "$SD/forks")" >&2; return 1; }
	agents_are 1 || { ps -o pid,stat,comm --ppid "$(daemon_pid)" >&2; return 1; }
	! X --fork f1 -- true 2>"$T/rm.e" && grep -q "no fork named 'f1'" "$T/rm.e" || { cat "$T/rm.e" >&2; return 1; }
}
check "fork --rm: its agent and state are gone, exec --fork says there is no such fork" t_rm

t_list_status() {
	F --list | grep -q '^f2 .*ready' && $TO 10 "$AIRLOCK" status -C "$W" --json | python3 -c '
import json, sys
d = json.load(sys.stdin)
assert [f["name"] for f in d["forks"]] == ["f2"], d["forks"]'
}
check "fork --list and status --json list the forks" t_list_status

t_schemas() {
	$TO 10 "$AIRLOCK" status -C "$W" --json >"$T/st.json" && valid "$T/st.json" status &&
		F --list --json >"$T/fl.json" && valid "$T/fl.json" fork &&
		$TO 10 "$AIRLOCK" list --json >"$T/list.json" && valid "$T/list.json" list &&
		grep -q '"forks":\[{"name":"f2"' "$T/list.json"
}
check "status, list and fork --list --json carry the forks and match their schemas" t_schemas

t_ttl() {
	F --name short --ttl 1 >"$T/ttl.out" 2>&1 || { cat "$T/ttl.out" "$SD/forks/short/agent.log" >&2; return 1; }
	for _ in $(seq 1 60); do
		[ ! -e "$SD/forks/short" ] && break
		sleep 0.1
	done
	[ ! -e "$SD/forks/short" ] && ! F --list | grep -q '^short ' && agents_are 1
}
check "a fork idle past its TTL is removed (agent and state)" t_ttl

# ---- try ----
for v in 1 2 3; do
	cat >"$T/p$v.diff" <<EOF
--- a/src/m.py
+++ b/src/m.py
@@ -1,2 +1,2 @@
 def f():
-    return 1
+    return $v
EOF
done

t_try() {
	F --rm-all >/dev/null
	$TO 10 "$AIRLOCK" changes -C "$W" --json >"$T/before.json"
	$TO 120 "$AIRLOCK" try -C "$W" --json --patch "$T/p1.diff" --patch "$T/p2.diff" --patch "$T/p3.diff" -- \
		sh -c 'grep -q "return 2" src/m.py && echo passed >result.txt && echo "ok"; grep -q "return 2" src/m.py || { echo "bad" >&2; exit 3; }' \
		>"$T/try.json" 2>"$T/try.err" || { cat "$T/try.err" >&2; return 1; }
	valid "$T/try.json" try || return 1
	$TO 10 "$AIRLOCK" changes -C "$W" --json >"$T/after.json"
	python3 - "$T/try.json" "$T/before.json" "$T/after.json" <<'PY' || { cat "$T/try.json" "$T/try.err" >&2; return 1; }
import json, sys
t = json.load(open(sys.argv[1]))
assert t["version"] == 1 and t["winner"] == "B" and t["applied"], t
v = {x["name"]: x for x in t["variants"]}
assert v["B"]["exit_code"] == 0 and v["A"]["exit_code"] == 3 and v["C"]["exit_code"] == 3, v
assert sorted(c["path"] for c in v["B"]["changes"]) == ["result.txt", "src/m.py"], v["B"]
assert sorted(c["path"] for c in v["C"]["changes"]) == ["src/m.py"], v["C"]
before = {c["path"] for c in json.load(open(sys.argv[2]))["changes"]}
after = {c["path"] for c in json.load(open(sys.argv[3]))["changes"]}
assert after - before == {"result.txt", "src/m.py"}, (after - before)
PY
	grep -q '^\[B\] ok$' "$T/try.err" && grep -q '^\[A\] bad$' "$T/try.err" && grep -q '^\[C\] bad$' "$T/try.err" &&
		[ "$(cat "$W/src/m.py")" = "def f():
    return 1" ] && [ ! -e "$W/result.txt" ] && [ "$(X -- cat src/m.py)" = "def f():
    return 2" ] && ! ls -d "$SD/forks"/try* >/dev/null 2>&1 && agents_are 0
}
check "try: three patches, one passes; its changes and only those are the parent's guest changes; the forks are gone" t_try

t_accept() {
	$TO 20 "$AIRLOCK" accept -C "$W" src/m.py >/dev/null && [ "$(cat "$W/src/m.py")" = "def f():
    return 2" ]
}
check "the winner's change is accepted like any other guest change" t_accept

t_try_none() {
	local rc=0
	$TO 120 "$AIRLOCK" try -C "$W" --patch "$T/p1.diff" --patch "$T/p3.diff" -- sh -c 'grep -q "return 9" src/m.py' \
		>/dev/null 2>"$T/none.err" || rc=$?
	[ "$rc" = 1 ] && grep -q 'no variant passed' "$T/none.err" && agents_are 0
}
check "try: no variant passes: exit 1, nothing applied, forks removed" t_try_none

t_try_names() { # names a fork makes are names to the replay (cp -a of a directory, xargs -0 rm --), never options
	printf -- '--- /dev/null\n+++ b/names.txt\n@@ -0,0 +1 @@\n+x\n' >"$T/new.diff"
	$TO 120 "$AIRLOCK" try -C "$W" --patch "$T/new.diff" -- sh -c 'touch -- "--checkpoint=1" "--checkpoint-action=exec=touch owned" "-rf"' \
		>/dev/null 2>"$T/names.err" || { cat "$T/names.err" >&2; return 1; }
	[ -z "$(find "$T" "$SD" -name owned 2>/dev/null)" ] &&
		$TO 10 "$AIRLOCK" changes -C "$W" --json | grep -q 'checkpoint-action=exec=touch owned' &&
		[ "$(X -- sh -c 'ls -- --checkpoint=1 -rf | wc -l')" = 2 ]
}
check "try: file names like options are replayed as names (nothing runs on the host)" t_try_names

t_try_op() { # the relay's try op itself, as an extension sends it: per-variant commands, tagged events, keep by name
	python3 - "$AIRLOCK_SOCKET" <<'PY' >"$T/op.out" 2>&1 || { cat "$T/op.out" >&2; return 1; }
import json, socket, sys
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); f = s.makefile("rw")
f.write(json.dumps({"id": 1, "op": "sync_wait"}) + "\n"); f.flush()
while json.loads(f.readline()).get("id") != 1: pass
patch = "--- /dev/null\n+++ b/src/new_b.py\n@@ -0,0 +1 @@\n+B = 1\n"
rq = {"id": "t1", "op": "try", "argv": ["false"],
      "variants": [{"name": "a", "argv": ["sh", "-c", "echo out-a; echo err-a >&2; echo a >op-a.txt; rm a.txt; exit 4"]},
                   {"name": "b", "patch": patch, "argv": ["sh", "-c", "test -e src/new_b.py && echo out-b && echo b >op-b.txt"]}],
      "keep": ["a"], "timeout_seconds": 60}
for attempt in range(100):
    f.write(json.dumps(rq) + "\n"); f.flush()
    ev, evs = None, []
    while True:
        ev = json.loads(f.readline())
        if ev.get("id") != "t1": continue
        evs.append(ev)
        if ev["event"] in ("try", "error"): break
    if ev["event"] != "error" or ev["code"] != "busy": break
    import time; time.sleep(0.1)
assert ev["event"] == "try", ev
names = [e["event"] for e in evs]
assert names[0] == "try_started" and names.count("try_variant") == 2, names
out = {(e["variant"], e["phase"], e["stream"]): e["data"] for e in evs if e["event"] == "try_output"}
assert "out-a" in out[("a", "run", "stdout")] and "err-a" in out[("a", "run", "stderr")] and "out-b" in out[("b", "run", "stdout")], out
v = {x["name"]: x for x in ev["variants"]}
assert v["a"]["exit_code"] == 4 and not v["a"]["passed"] and v["b"]["passed"] and v["b"]["patch_applied"], v
assert sorted(c["path"] for c in v["a"]["changes"]) == ["a.txt", "op-a.txt"], v["a"]
assert [c["deleted"] for c in v["a"]["changes"] if c["path"] == "a.txt"] == [True], v["a"]
assert ev["winner"] == "b" and ev["applied"] and ev["files"] == 2 and ev["kept"] == [v["a"]["fork"]], ev
print(v["a"]["fork"])
PY
	local kept
	kept=$(tail -n 1 "$T/op.out")
	[ "$(X -- sh -c 'cat op-b.txt src/new_b.py; test ! -e op-a.txt && test -e a.txt && echo none')" = "b
B = 1
none" ] && [ "$(X --fork "$kept" -- cat op-a.txt)" = a ] && F --rm "$kept" >/dev/null && agents_are 0 &&
		$TO 10 "$AIRLOCK" changes -C "$W" --json | grep -q '"op-b.txt"'
}
check "try over the relay socket: per-variant commands, output tagged per variant and phase, exit and changes per variant, the winner replayed in the sandbox, a loser kept by name" t_try_op

# ---- hostile input ----
t_bad() {
	printf -- '--- a/../../etc/passwd\n+++ b/../../etc/passwd\n@@ -1 +1 @@\n-x\n+y\n' >"$T/evil.diff"
	printf -- '--- a/.env\n+++ b/.env\n@@ -1 +1 @@\n-x\n+y\n' >"$T/secret.diff"
	printf -- '--- /etc/passwd\n+++ /etc/passwd\n@@ -1 +1 @@\n-x\n+y\n' >"$T/abs.diff"
	local rc
	rc=0 && "$AIRLOCK" try -C "$W" --patch "$T/evil.diff" -- true 2>"$T/b1" || rc=$?
	[ "$rc" = 2 ] && grep -q "refused: 'a/../../etc/passwd' is a '..' or '.' component" "$T/b1" || { cat "$T/b1" >&2; return 1; }
	rc=0 && "$AIRLOCK" try -C "$W" --patch "$T/secret.diff" -- true 2>"$T/b2" || rc=$?
	[ "$rc" = 2 ] && grep -q "withheld" "$T/b2" || { cat "$T/b2" >&2; return 1; }
	rc=0 && "$AIRLOCK" try -C "$W" --patch "$T/abs.diff" -- true 2>"$T/b3" || rc=$?
	[ "$rc" = 2 ] && grep -q "an absolute path" "$T/b3" || { cat "$T/b3" >&2; return 1; }
	rc=0 && F --name 'Bad/Name' 2>"$T/b4" || rc=$?
	[ "$rc" = 2 ] && grep -q "fork: --name 'Bad/Name'" "$T/b4" || return 1
	rc=0 && F -n 1000 2>"$T/b5" || rc=$?
	[ "$rc" = 2 ] && grep -q "from 1 to 16" "$T/b5" || return 1
	python3 - "$AIRLOCK_SOCKET" <<'PY' || return 1
import json, socket, sys
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); f = s.makefile("rw")
def ask(o):
    f.write(json.dumps(o) + "\n"); f.flush()
    while True:  # the hello event comes first
        e = json.loads(f.readline())
        if e.get("id") == o["id"]:
            return e
e = ask({"id": 1, "op": "fork", "count": 1000}); assert e["code"] == "bad_field" and "count" in e["message"], e
e = ask({"id": 2, "op": "fork", "names": ["../x"]}); assert e["code"] == "bad_field", e
e = ask({"id": 3, "op": "exec", "argv": ["true"], "fork": "nope"}); assert e["event"] == "error" and e["code"] == "no_fork", e
e = ask({"id": 4, "op": "fork_rm", "names": ["nope"]}); assert e["code"] == "no_fork", e
e = ask({"id": 5, "op": "fork_changes"}); assert e["code"] == "missing_field", e
PY
	agents_are 0 && ! ls "$SD/forks"/* >/dev/null 2>&1
}
check "hostile input: a patch with ../, a secret or an absolute path, a bad name, -n 1000, bad relay requests: clear errors, nothing made" t_bad

# ---- the layer stack, and cleanup with the daemon ----
t_compact() {
	for _ in 1 2 3; do
		F --name c >/dev/null && X -- sh -c 'echo x >>layers.txt' 2>"$T/cx.e" && F --rm c >/dev/null || {
			cat "$T/cx.e" >&2
			tail -n 20 "$T/up.out" >&2
			return 1
		}
	done
	# each fork with none alive merged the stack first: at most one layer below the parent's upper
	local nl lines
	nl=$(ls "$SD/layers" 2>/dev/null | wc -l)
	lines=$(X -- sh -c 'wc -l <layers.txt' 2>/dev/null)
	[ "$nl" -le 1 ] && [ "$lines" = 3 ] || { echo "layers: $nl, layers.txt: $lines lines" >&2; tail -n 15 "$T/up.out" >&2; return 1; }
}
check "repeated fork/rm: the layer stack is merged back (bounded), the parent keeps every edit" t_compact

t_down_cleans() {
	F -n 2 >/dev/null || return 1
	local dpid cg
	dpid=$(daemon_pid)
	timeout -k 2 15 "$AIRLOCK" down "$W" >/dev/null && wait "$UP_PID" 2>/dev/null
	cg=$(find /sys/fs/cgroup -maxdepth 6 -type d -name "airlock-sandbox.$dpid*" 2>/dev/null | wc -l)
	[ ! -e "$SD/forks/f1" ] && [ ! -e "$SD/forks/f2" ] && [ "$cg" = 0 ] &&
		! grep -q "$SD" /proc/self/mountinfo && ! pgrep -P "$dpid" >/dev/null
}
check "down: the forks' agents, cgroups and state are gone with the daemon" t_down_cleans

t_merged_at_start() {
	up && [ "$(X -- sh -c 'cat src/m.py; wc -l <layers.txt; cat a.txt' 2>/dev/null)" = "def f():
    return 2
3
hello
parent" ] && [ ! -e "$SD/layers" ] && [ ! -e "$SD/upper" ]
}
check "the next up merges the layers into the base: the parent's copy is whole, no stack is left" t_merged_at_start

t_destroy() { # with the daemon and a fork still running
	F -n 1 >/dev/null && [ -e "$SD/forks/f1" ] || return 1
	local dpid cg
	dpid=$(daemon_pid)
	timeout -k 2 20 "$AIRLOCK" down "$W" --destroy >/dev/null 2>&1 && wait "$UP_PID" 2>/dev/null
	cg=$(find /sys/fs/cgroup -maxdepth 6 -type d -name "airlock-sandbox.$dpid*" 2>/dev/null | wc -l)
	[ ! -e "$SD" ] && [ "$cg" = 0 ] && ! pgrep -P "$dpid" >/dev/null
}
check "down --destroy of a running daemon removes the sandbox with its layers, forks, agents and cgroups" t_destroy

t_no_reports() { # a sanitizer build: nothing from ASan/UBSan in the daemon's log or the CLI's output
	! grep -l 'AddressSanitizer\|LeakSanitizer\|runtime error' "$T"/*.out "$T"/*.err "$T"/*.e 2>/dev/null
}
check "no sanitizer reports from the daemon and the CLI" t_no_reports

finish
