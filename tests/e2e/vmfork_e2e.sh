#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
#
# A fork of a running vm sandbox (doc/VM.md, "Forks"): the parent VM, started
# by tests/harness/vm_harness.c from the template's snapshot, is frozen
# (qcow2 overlay of its workspace disk, its memory migrated to a file) and
# a fork restored from that with its own keys. Isolation both ways and from
# the host, the fork's own identity and start kind, the parent's overlay
# merged back at its next start, nothing left behind. Then the user's path:
# `airlock up --sandbox vm`, `airlock fork`, `exec --fork`, `fork_changes`,
# `try` (the winner's changes, and only those, the sandbox's guest changes),
# `accept`, `down --destroy` leaving nothing. Plain build only
# (about a minute of VMs under TCG here); vm_e2e covers the vm sandbox under
# the sanitizers.
#
# usage: vmfork_e2e.sh AIRLOCK AGENT HARNESS BUILDER TEMPLATE_DIR
source "$(dirname "$0")/lib.sh"

AIRLOCK=$1
AGENT_ARG=$2
HARNESS=$3
BUILD=$4
TPL=$5
if ! command -v qemu-system-x86_64 >/dev/null 2>&1 || ! command -v qemu-img >/dev/null 2>&1; then
	echo "skip - vmfork_e2e needs qemu-system-x86_64 and qemu-img (tests/deps.sh)"
	exit 77
fi
if [ "$(id -u)" != 0 ] || [ ! -c /dev/fuse ]; then
	echo "skip - vmfork_e2e needs root and /dev/fuse for airlock up (uid $(id -u))"
	exit 77
fi
if [ "${AIRLOCK_SANITIZED:-0}" = 1 ]; then
	echo "skip - vmfork_e2e runs in the plain build only (vm_e2e covers the vm sandbox under the sanitizers)"
	exit 77
fi
export XDG_STATE_HOME=$T/state AIRLOCK_VM_TEMPLATE=$TPL
TO="timeout -k 2"
if ! vm_template "$AGENT_ARG" "$BUILD" "$TPL"; then
	cat "$T/sa.out" "$T/build.out" 2>/dev/null
	not_ok "a static agent and the template build"
	finish
	exit 1
fi
export AIRLOCK_VM_NO_BUILD=1

P=$T/p
F=$P/forks/f
W1=$T/w1
W2=$T/w2
mkdir -p "$W1/src"
for f in $(seq 1 10); do echo "file $f" >"$W1/src/f$f.txt"; done
printf 'node_modules/\n' >"$W1/.gitignore" # guest-owned: not synced, kept on the disk
cp -a "$W1" "$W2"

# harness NAME DIR [--fork PARENT]: a VM on a fifo (stops when it closes)
harness() {
	local name=$1 dir=$2
	shift 2
	mkfifo "$T/$name.ctl"
	"$HARNESS" "$dir" "$TPL" "$@" <"$T/$name.ctl" >"$T/$name.out" 2>"$T/$name.err" &
	PIDS+=("$!")
	eval "exec {${name}_fd}>\"$T/$name.ctl\""
	wait_line "$T/$name.out" '^ready$' 150
}
field() { sed -n "s/^$2 //p" "$T/$1.out"; }
up() { # up NAME W HARNESS_NAME
	start_bg "$1" "$AIRLOCK" up "$2" --guest "$(field "$3" addr)" --key "$(field "$3" host-key)" \
		--guest-key "$(field "$3" guest-pub)"
	wait_line "$T/$1.out" "in sync with" 60
}
X() {
	local w=$1
	shift
	$TO 60 "$AIRLOCK" exec -C "$w" -- sh -c "$*" </dev/null
}
stop_harness() { # stop_harness NAME: close its fifo, wait for "stopped"
	local fdv="${1}_fd"
	[ -n "${!fdv:-}" ] || return 1 # never started
	eval "exec ${!fdv}>&-"
	wait_line "$T/$1.out" '^stopped' 60
}

if ! harness hp "$P" || ! up up1 "$W1" hp; then
	cat "$T/hp.err" "$T/up1.err" 2>/dev/null
	tail -n 20 "$P/console.log" 2>/dev/null
	not_ok "the parent VM starts and airlock up syncs into it"
	finish
	exit 1
fi
ok "the parent VM starts ($(field hp describe | sed 's/.*, //'))"
# guest-owned paths the fork inherits: node_modules (ignored by the sync) and
# the command user's home, both on the workspace disk
H=/home/airlock
X "$W1" "echo parent-before >$H/pb && mkdir -p node_modules/x && echo dep >node_modules/x/i.js" ||
	not_ok "a write in the parent"

mkdir -p "$P/forks"
mkdir -m 0700 "$F"
if ! harness hf "$F" --fork "$P" || ! up up2 "$W2" hf; then
	cat "$T/hf.err" "$T/up2.err" "$F/qemu.log" 2>/dev/null
	tail -n 20 "$F/console.log" 2>/dev/null
	not_ok "the fork starts from the frozen parent and airlock up connects to it"
	finish
	exit 1
fi
ok "the fork starts: parent frozen in $(field hf freeze_ms) ms, fork ready $(field hf start_ms) ms after"
echo "# fork: $(field hf describe)"

t_identity() {
	[ "$(field hf guest-pub)" != "$(field hp guest-pub)" ] && [ "$(field hf host-key)" != "$(field hp host-key)" ] &&
		[ "$(X "$W2" 'cut -d" " -f1 /run/airlock-start')" = fork ] &&
		[ "$(X "$W1" 'cut -d" " -f1 /run/airlock-start')" != fork ] &&
		grep -q 'airlock-init: forked' "$F/console.log" && grep -q 'airlock-agent exited (137)' "$F/console.log"
}
check "the fork has its own keys, knows it is a fork (/run/airlock-start), its copy of the parent's agent was killed" t_identity
t_inherits() {
	[ "$(X "$W2" "cat $H/pb")" = parent-before ] && [ "$(X "$W2" 'cat node_modules/x/i.js')" = dep ]
}
check "the fork has the parent's workspace as it was, node_modules included" t_inherits
t_fork_write() {
	X "$W2" "echo fork-only >fo && echo fork-only >node_modules/fo && echo fork-only >$H/fo" &&
		X "$W1" "test ! -e fo && test ! -e node_modules/fo && test ! -e $H/fo" && [ ! -e "$W1/fo" ] && [ ! -e "$W2/fo" ]
}
check "a write in the fork is absent from the parent and the host" t_fork_write
t_parent_write() {
	X "$W1" "echo parent-after >node_modules/pa && echo parent-after >$H/pa" &&
		X "$W2" "test ! -e node_modules/pa && test ! -e $H/pa" && [ "$(X "$W1" "cat $H/pb")" = parent-before ]
}
check "the parent's later write is absent from the fork; the parent goes on" t_parent_write
t_rand() { [ "$(X "$W1" 'head -c 16 /dev/urandom | od -An -tx1')" != "$(X "$W2" 'head -c 16 /dev/urandom | od -An -tx1')" ]; }
check "parent and fork read different random bytes" t_rand
t_clock() {
	local g h
	g=$(X "$W2" 'date +%s') && h=$(date +%s) && [ $((h - g)) -le 2 ] && [ $((g - h)) -le 2 ]
}
check "the fork's clock is the host's (within 2 s)" t_clock
# ram_name DIR: the shared memory file of the VM of state directory DIR
ram_name() { printf '/dev/shm/airlock-%s/vm-%x-%x.ram' "$(id -u)" $(stat -c '%d %i' "$1"); }
t_shared_ram() {
	local ppid fpid
	ppid=$(cat "$P/run/qemu.pid") && fpid=$(cat "$F/run/qemu.pid") &&
		grep -q '^airlock: memory: shared, ' "$P/qemu.log" &&
		grep -q '^airlock: memory: shared, the parent.s copied at the freeze' "$F/qemu.log" &&
		[ "$(stat -c %s "$F/mem")" -lt 1048576 ] &&
		[ ! -e "$(ram_name "$P")" ] && [ ! -e "$(ram_name "$F")" ] &&
		ls -l "/proc/$ppid/fd" | grep -qF "$(ram_name "$P") (deleted)" &&
		ls -l "/proc/$fpid/fd" | grep -qF "$(ram_name "$F") (deleted)"
}
check "shared memory: the fork's mem is the device state alone, each qemu holds its own memory file, unlinked" t_shared_ram

$TO 30 "$AIRLOCK" down "$W2" >/dev/null 2>&1
t_fork_gone() {
	local pid
	pid=$(cat "$F/run/qemu.pid" 2>/dev/null)
	stop_harness hf && { [ -z "$pid" ] || ! kill -0 "$pid" 2>/dev/null; } &&
		[ -z "$(find "$F/run" -type s 2>/dev/null)" ] &&
		! $TO 60 "$HARNESS" "$F" "$TPL" --fork-again </dev/null >"$T/again.out" 2>"$T/again.err" &&
		grep -q 'a vm fork starts once' "$T/again.err" && rm -rf "$F" && [ -z "$(ls -A "$P/forks")" ]
}
check "the fork stops: no qemu, no socket; started again it is refused (its memory is gone); its directory removed" t_fork_gone
$TO 30 "$AIRLOCK" down "$W1" >/dev/null 2>&1
# the parent's stop made a spare copy of the snapshot's memory (0600, at
# most two kept), and its next start takes it instead of copying
# (two old dummies and a stale temporary one: the stop keeps the newest two
# spares, its own among them, and removes the rest)
spares() { find "/dev/shm/airlock-$(id -u)" -maxdepth 1 -name 'spare-*.ram' "$@"; }
SD=/dev/shm/airlock-$(id -u)
for d in 1 2; do : >"$SD/spare-vmforktest$$-$d.ram" && touch -d "$((3 - d)) days ago" "$SD/spare-vmforktest$$-$d.ram"; done
: >"$SD/spare-vmforktest$$-0.ram.1.tmp" && touch -d '1 hour ago' "$SD/spare-vmforktest$$-0.ram.1.tmp"
t_merged() {
	stop_harness hp && [ -n "$(spares -perm 0600 -size +1M -newer "$P/qemu.log")" ] && [ "$(spares | wc -l)" -le 2 ] &&
		[ ! -e "$SD/spare-vmforktest$$-1.ram" ] && [ ! -e "$SD/spare-vmforktest$$-0.ram.1.tmp" ] &&
		[ -e "$P/ws-top" ] && harness hp2 "$P" && [ ! -e "$P/ws-top" ] &&
		grep -q '^airlock: memory: shared, the spare copy of the snapshot.s made at the last stop' "$P/qemu.log" &&
		[ -z "$(find "$P" -maxdepth 1 -name 'ws.*.qcow2')" ] && up up3 "$W1" hp2 &&
		[ "$(X "$W1" "cat node_modules/pa $H/pb node_modules/x/i.js")" = "parent-after
parent-before
dep" ]
}
check "the parent's stop makes a spare and keeps the newest two, its next start takes it, merges its overlay into workspace.img and keeps its writes" t_merged
rm -f "$SD"/spare-vmforktest$$-*
$TO 30 "$AIRLOCK" down "$W1" >/dev/null 2>&1
# without shared memory a freeze migrates all of the parent's memory into
# the fork's mem: here because the parent's start finds no room on the
# tmpfs it is given (AIRLOCK_VM_RAM_DIR: 64 MiB for a 1024 MiB guest) and
# falls back to the snapshot's file (AIRLOCK_VM_SHARED_RAM=0 does the same)
t_migrated() {
	mkdir -p "$T/shm" && mount -t tmpfs -o size=64m,mode=0700 tmpfs "$T/shm" &&
		stop_harness hp2 && AIRLOCK_VM_RAM_DIR=$T/shm harness hp3 "$P" && up up5 "$W1" hp3 &&
		grep -q '^airlock: not on shared memory: no room on tmpfs for 1024 MiB' "$P/qemu.log" &&
		grep -q '^airlock: memory: the snapshot.s file, copy on write' "$P/qemu.log" && [ -z "$(ls -A "$T/shm")" ] &&
		X "$W1" "echo p3 >$H/p3" && mkdir -m 0700 "$F" && harness hf2 "$F" --fork "$P" &&
		echo "# fork by migration: parent frozen in $(field hf2 freeze_ms) ms, fork ready $(field hf2 start_ms) ms after" &&
		grep -q '^airlock: memory: migrated' "$F/qemu.log" && [ "$(stat -c %s "$F/mem")" -gt 10485760 ] &&
		up up6 "$W2" hf2 && [ "$(X "$W2" "cat $H/p3; cut -d' ' -f1 /run/airlock-start")" = "p3
fork" ] &&
		X "$W2" "echo f2 >$H/f2" && X "$W1" "test ! -e $H/f2"
}
check "a fork of a parent without shared memory: its memory migrated, isolated" t_migrated
$TO 30 "$AIRLOCK" down "$W2" >/dev/null 2>&1
$TO 30 "$AIRLOCK" down "$W1" >/dev/null 2>&1
stop_harness hf2 >/dev/null
rm -rf "$F"
stop_harness hp3 >/dev/null
umount "$T/shm" 2>/dev/null

# ---- the user's path: `airlock up --sandbox vm` (the daemon's own VM,
# restored from the template's snapshot), `airlock fork`, `exec --fork`,
# try (three forks), `down --destroy` ----
export XDG_DATA_HOME=$T/data
W3=$T/w3
cp -a "$W1" "$W3"
echo "file 1" >"$W3/m.txt"
echo del >"$W3/del.txt"
mkdir -p "$W3/src" && echo "sub 1" >"$W3/src/s.txt"
start_bg vup "$AIRLOCK" up "$W3" --sandbox vm 7>&- 8>&-
if wait_line "$T/vup.out" "^airlock: $W3 in sync with sandbox vm\$" 150; then
	VSB=$(sed -n 's/^airlock: sandbox started .*; state in //p' "$T/vup.err")
	ok "airlock up --sandbox vm ($(sed -n 's/^airlock: sandbox started in [0-9.]* ms, \([a-z]*\).*/\1/p' "$T/vup.err"))"
	js() { grep -o "\"$1\":[0-9.]*" "$T/cf.out" | head -n 1 | cut -d: -f2 | cut -d. -f1; }
	t_cli_fork() {
		local t0 t1 t2
		t0=$(date +%s.%N)
		$TO 120 "$AIRLOCK" fork -C "$W3" --name f1 --json >"$T/cf.out" 2>"$T/cf.err" || { cat "$T/cf.err" >&2; return 1; }
		t1=$(date +%s.%N)
		$TO 60 "$AIRLOCK" exec -C "$W3" --fork f1 -- sh -c 'echo x > a' </dev/null || return 1
		t2=$(date +%s.%N)
		echo "# airlock fork: $(echo "$t1 - $t0" | bc) s (op $(js ms) ms: parent paused $(js freeze_ms) ms, fork start $(js start_ms) ms), fork + first exec: $(echo "$t2 - $t0" | bc) s (load $(cut -d' ' -f1-3 /proc/loadavg))"
		[ "$($TO 60 "$AIRLOCK" exec -C "$W3" --fork f1 -- cat a </dev/null)" = x ] &&
			$TO 60 "$AIRLOCK" exec -C "$W3" -- test ! -e a </dev/null && [ ! -e "$W3/a" ] &&
			[ -f "$VSB/forks/f1/ws.qcow2" ] && [ -f "$VSB/forks/f1/mem" ] &&
			grep -q '^airlock: memory: shared' "$VSB/forks/f1/qemu.log" && [ ! -e "$(ram_name "$VSB/forks/f1")" ] &&
			"$AIRLOCK" fork -C "$W3" --list | grep -q '^f1 *ready'
	}
	check "airlock fork --name f1 of the vm sandbox; a write by exec --fork f1 is absent from the parent and the host" t_cli_fork
	t_cli_fork_changes() { # the fork_changes op: what f1's agent reported; f1 runs on
		python3 - "$($TO 10 "$AIRLOCK" status -C "$W3" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["socket"])')" <<'PY' >"$T/fc.out" 2>&1 || { cat "$T/fc.out" >&2; return 1; }
import json, socket, sys
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); f = s.makefile("rw")
f.write(json.dumps({"id": 1, "op": "fork_changes", "names": ["f1"]}) + "\n"); f.flush()
while True:
    ev = json.loads(f.readline())
    if ev.get("id") == 1: break
assert ev["event"] == "fork_changes" and ev["changes"] == [{"path": "a", "deleted": False}] and "upper" not in ev, ev
PY
		[ "$($TO 60 "$AIRLOCK" exec -C "$W3" --fork f1 -- cat a </dev/null)" = x ] &&
			[ "$($TO 60 "$AIRLOCK" exec -C "$W3" --fork f1 -- sh -c "grep -l 'settle-report[s]' /proc/[0-9]*/cmdline | wc -l" </dev/null)" = 1 ] &&
			[ "$($TO 60 "$AIRLOCK" exec -C "$W3" -- sh -c "grep -l 'settle-report[s]' /proc/[0-9]*/cmdline | wc -l" </dev/null)" = 0 ]
	}
	check "fork_changes of a vm fork: what its agent reported, the fork still running; its agent settles lost events before each report, the sandbox's does not" t_cli_fork_changes
	# try: three patches of which B passes, each changing a file at the
	# top and one in a synced directory; B's run also deletes a file and
	# makes a file and a symlink
	for v in a b c; do
		printf -- '--- a/m.txt\n+++ b/m.txt\n@@ -1 +1 @@\n-file 1\n+%s\n--- a/src/s.txt\n+++ b/src/s.txt\n@@ -1 +1 @@\n-sub 1\n+sub %s\n' "$v" "$v" >"$T/p$v.diff"
	done
	t_cli_try() {
		$TO 10 "$AIRLOCK" changes -C "$W3" --json >"$T/before.json" || return 1
		$TO 300 "$AIRLOCK" try -C "$W3" --json --patch "$T/pa.diff" --patch "$T/pb.diff" --patch "$T/pc.diff" -- \
			sh -c 'grep -qx b m.txt || { echo bad >&2; exit 3; }; rm del.txt; echo new >new.txt; mkdir -p d/e; ln -s ../../new.txt d/e/l; echo ok' \
			>"$T/try.json" 2>"$T/try.err" </dev/null || { cat "$T/try.err" "$T/try.json" >&2; return 1; }
		$TO 10 "$AIRLOCK" changes -C "$W3" --json >"$T/after.json" || return 1
		python3 - "$T/try.json" "$T/before.json" "$T/after.json" <<'PY' || { cat "$T/try.json" "$T/try.err" >&2; return 1; }
import json, sys
t = json.load(open(sys.argv[1]))
assert t["winner"] == "B" and t["applied"] and not t["kept"], t
v = {x["name"]: x for x in t["variants"]}
assert v["B"]["exit_code"] == 0 and v["A"]["exit_code"] == 3 and v["C"]["exit_code"] == 3, v
assert v["A"]["patch_applied"] and v["B"]["patch_applied"] and v["C"]["patch_applied"], v
# listed as deleted too: what a fork made and removed again (patch's temporary m.txtXXXXXX)
def made(x): return {c["path"] for c in x["changes"] if not c["deleted"]}
def gone(x): return {c["path"] for c in x["changes"] if c["deleted"] and not c["path"].startswith(("m.txt", "src/s.txt"))}
assert made(v["B"]) == {"d/e/l", "new.txt", "m.txt", "src/s.txt"} and gone(v["B"]) == {"del.txt"}, v["B"]
assert made(v["C"]) == {"m.txt", "src/s.txt"} and gone(v["C"]) == set(), v["C"]
before = {c["path"] for c in json.load(open(sys.argv[2]))["changes"]}
after = {c["path"]: c for c in json.load(open(sys.argv[3]))["changes"]}
assert set(after) - before - {"d", "d/e"} == {"d/e/l", "new.txt", "m.txt", "src/s.txt", "del.txt"}, after
assert after["del.txt"]["kind"] == "delete" and after["new.txt"]["kind"] == "create", after
assert after["m.txt"]["kind"] == "modify" and after["src/s.txt"]["kind"] == "modify", after
assert after["d/e/l"]["kind"] == "symlink", after
PY
		grep -q '^\[B\] ok$' "$T/try.err" && grep -q '^\[A\] bad$' "$T/try.err" && grep -q '^\[C\] bad$' "$T/try.err" &&
			[ "$(cat "$W3/m.txt")" = "file 1" ] && [ "$(cat "$W3/src/s.txt")" = "sub 1" ] && [ -e "$W3/del.txt" ] && [ ! -e "$W3/new.txt" ] &&
			[ ! -e "$W3/d" ] && [ "$($TO 60 "$AIRLOCK" exec -C "$W3" -- sh -c 'cat m.txt src/s.txt new.txt d/e/l; test ! -e del.txt && echo gone' </dev/null)" = "b
sub b
new
new
gone" ] && ! ls -d "$VSB/forks"/try* >/dev/null 2>&1 && [ -z "$(find "$T/data" -path '*/.airlock-try*' 2>/dev/null)" ]
	}
	check "try on a vm sandbox: three patches, B passes; only B's changes (two changed, one in a synced directory, a deleted, a new file, a symlink) are the sandbox's guest changes; the host untouched; the forks removed" t_cli_try
	t_cli_try_accept() {
		$TO 60 "$AIRLOCK" accept -C "$W3" m.txt src/s.txt del.txt new.txt >"$T/acc.out" 2>&1 || { cat "$T/acc.out" >&2; return 1; }
		[ "$(cat "$W3/m.txt" "$W3/src/s.txt" "$W3/new.txt")" = "b
sub b
new" ] && [ ! -e "$W3/del.txt" ] && [ ! -e "$W3/d" ]
	}
	check "the winner's changes are accepted like any other: on the host now (and only those accepted)" t_cli_try_accept
	t_cli_destroy() {
		$TO 60 "$AIRLOCK" down "$W3" --destroy >"$T/destroy.out" 2>&1 || { cat "$T/destroy.out" >&2; return 1; }
		! pgrep -f "qemu-system.*$VSB" >/dev/null && [ ! -e "$VSB" ] &&
			[ -z "$(find "$T/data" \( -name '*.qcow2' -o -name mem \) 2>/dev/null)" ]
	}
	check "down --destroy: no qemu, no overlay, no memory file left" t_cli_destroy
else
	cat "$T/vup.err"
	not_ok "airlock up --sandbox vm boots the VM and syncs"
fi

t_no_qemu() { ! pgrep -f "qemu-system.*$T" >/dev/null; }
check "no qemu is left" t_no_qemu

if [ "$FAIL" != 0 ]; then
	for n in hp hf hp2 hp3 hf2; do echo "--- $n" && cat "$T/$n.err" 2>/dev/null; done
	echo "--- parent console" && tail -n 30 "$P/console.log" 2>/dev/null
	echo "--- fork qemu.log" && cat "$F/qemu.log" 2>/dev/null
fi
finish
