#!/usr/bin/env bash
# VM snapshots end to end (doc/VM.md, "Snapshots"): the first `airlock up
# --sandbox vm` boots the template cold and saves it at its snapshot point;
# later starts restore it. A restored guest gets a fresh handshake (a
# session recorded before is refused when replayed), the host's clock and
# fresh randomness (two restores of one snapshot: different /dev/urandom
# output, different agent ephemeral keys), keeps its own workspace disk; a
# changed VM setting (memory) boots cold; the snapshot holds nothing of a
# sandbox (no key); down --destroy leaves nothing of the sandbox.
# usage: vmsnap_e2e.sh AIRLOCK AGENT_STATIC VM_HARNESS TEMPLATE_BUILD_SH TEMPLATE_DIR CHAN_RECORD_PY
#   AGENT_STATIC '-': build one from $AIRLOCK_SRC with -Dstatic_agent=true
# Skips (exit 77) only when qemu, root or /dev/fuse are missing.
# shellcheck source=tests/e2e/lib.sh
source "$(dirname "$0")/lib.sh"

AIRLOCK=$1
AGENT_ARG=$2
HARNESS=$3
BUILD=$4
TPL=$5
REC=$6
if ! command -v qemu-system-x86_64 >/dev/null 2>&1; then
	echo "skip - vmsnap_e2e needs qemu-system-x86_64 (apt-get install qemu-system-x86, or tests/deps.sh)"
	exit 77
fi
if [ "$(id -u)" != 0 ] || [ ! -c /dev/fuse ]; then
	echo "skip - vmsnap_e2e needs root and /dev/fuse for airlock up (uid $(id -u))"
	exit 77
fi
# Under the sanitizers the snapshot path (save, restore, start line) is
# covered by vm_e2e, whose first start saves and restores; this test's cold
# boots (about a minute of TCG) run in the plain build only, to keep the
# suite within its time budget.
if [ "${AIRLOCK_SANITIZED:-0}" = 1 ]; then
	echo "skip - vmsnap_e2e runs in the plain build only (vm_e2e covers snapshot save and restore under the sanitizers)"
	exit 77
fi
export XDG_STATE_HOME=$T/state XDG_DATA_HOME=$T/data AIRLOCK_SOCKET=$T/relay.sock AIRLOCK_VM_TEMPLATE=$TPL
TO="timeout -k 2"
if ! vm_template "$AGENT_ARG" "$BUILD" "$TPL"; then
	cat "$T/sa.out" "$T/build.out" 2>/dev/null
	not_ok "a static agent and the template build"
	finish
	exit 1
fi
# the snapshots are a cache: start from none, so the first start is cold; the
# template was just built, no start needs to run its builder again
rm -rf "$TPL/snapshots"
export AIRLOCK_VM_NO_BUILD=1

W=$T/work
mkdir -p "$W/src"
echo "hello from the workspace" >"$W/README"
for f in $(seq 1 20); do echo "file $f" >"$W/src/f$f.txt"; done

vup() {
	start_bg "vup$1" "$AIRLOCK" up "$W" --sandbox vm
	UP_PID=$BG_PID
	wait_line "$T/vup$1.out" "^airlock: $W in sync with sandbox vm\$" 150
}
down() {
	$TO 30 "$AIRLOCK" down "$W" >/dev/null
	local i
	for i in $(seq 100); do kill -0 "$UP_PID" 2>/dev/null || return 0; sleep 0.1; done
	return 1
}
X() { $TO 60 "$AIRLOCK" exec -C "$W" "$@" </dev/null; }
# started N: "cold"/"restored" from up's "sandbox started in X ms, KIND (…)" line
started() { sed -n 's/^airlock: sandbox started in [0-9.]* ms, \([a-z]*\) (.*/\1/p' "$T/vup$1.err"; }
ms() { sed -n 's/^airlock: sandbox started in \([0-9.]*\) ms.*/\1/p' "$T/vup$1.err"; }

# ---- 1: cold, and the snapshot is saved ----
if ! vup 1; then
	cat "$T/vup1.err"
	not_ok "the first airlock up --sandbox vm boots and syncs"
	finish
	exit 1
fi
VSB=$(sed -n 's/^airlock: sandbox started .*; state in //p' "$T/vup1.err")
SNAP=$(ls -d "$TPL"/snapshots/*/ 2>/dev/null | head -n 1)
SNAP=${SNAP%/}
t_cold() {
	[ "$(started 1)" = cold ] && grep -q 'snapshot saved' "$T/vup1.err" &&
		"$AIRLOCK" status -C "$W" --json | grep -q '"sandbox_boot":"cold"' &&
		"$AIRLOCK" status -C "$W" | grep -q '^started     cold in ' &&
		[ "$(X -- cat /run/airlock-start)" = "cold 1" ]
}
check "the first start is cold ($(ms 1) ms: boot, save, restore): up, status, and the guest say so" t_cold
t_snap_files() {
	[ -n "$SNAP" ] && [ "$(stat -c %a "$SNAP")" = 700 ] && [ "$(stat -c %a "$TPL/snapshots")" = 700 ] &&
		for f in ram state meta; do [ "$(stat -c %a "$SNAP/$f")" = 600 ] || return 1; done &&
		[ ! -e "$SNAP/ws.img" ] && [ ! -e "$SNAP/config.tar" ] &&
		grep -q '^append .*rdinit=/init' "$SNAP/meta" && grep -q '^memory 1024M$' "$SNAP/meta"
}
check "the snapshot (ram, state, meta) is 0600 in a 0700 directory of the template" t_snap_files
t_no_key() {
	local k
	k=$(head -c 44 "$VSB/keys/guest.key")
	[ -n "$k" ] && ! grep -qaF "$k" "$SNAP/ram" && ! grep -qaF "$k" "$SNAP/state" && ! grep -qaF "$k" "$SNAP/meta"
}
check "the snapshot holds no key of the sandbox (saved before the init read its config)" t_no_key
check "a command leaves node_modules/x/marker on the workspace disk" X -- sh -c 'mkdir -p node_modules/x && echo kept >node_modules/x/marker'
check "airlock down" down
SNAP_T=$(stat -c %Y "$SNAP/state")

# ---- 2: restored, more than 5 s after the snapshot: clock, randomness, the sandbox's own disk ----
while [ $(($(date +%s) - SNAP_T)) -lt 6 ]; do sleep 0.5; done
if vup 2; then
	t_restored() {
		[ "$(started 2)" = restored ] && grep -q 'restored from a snapshot' "$T/vup2.err" &&
			"$AIRLOCK" status -C "$W" --json | grep -q '"sandbox_boot":"restored"' &&
			[ "$(X -- cat /run/airlock-start)" = "restored 2" ]
	}
	check "a second start restores the snapshot ($(ms 2) ms; cold: $(ms 1) ms); the guest learns it (restored 2)" t_restored
	t_clock() {
		local g h
		g=$(X -- date +%s) && h=$(date +%s)
		echo "# guest $g host $h, snapshot taken $((h - SNAP_T)) s before" >&2
		[ $((h - g)) -le 2 ] && [ $((g - h)) -le 2 ]
	}
	check "the restored guest's clock is the host's (within 2 s; snapshot > 5 s old)" t_clock
	t_disk() { [ "$(X -- cat node_modules/x/marker)" = kept ] && [ "$(X -- cat README)" = "hello from the workspace" ]; }
	check "the restored VM has this sandbox's workspace disk (node_modules/x/marker) and the synced tree" t_disk
	U1=$(X -- sh -c 'head -c 32 /dev/urandom | od -An -tx1 | tr -d " \n"')
	check "airlock down" down
else
	cat "$T/vup2.err"
	not_ok "a second start restores the snapshot"
fi
if vup 3; then
	U2=$(X -- sh -c 'head -c 32 /dev/urandom | od -An -tx1 | tr -d " \n"')
	t_random() { [ "$(started 3)" = restored ] && [ ${#U1} = 64 ] && [ ${#U2} = 64 ] && [ "$U1" != "$U2" ]; }
	check "two restores of the same snapshot read different /dev/urandom bytes" t_random
	check "airlock down" down
else
	cat "$T/vup3.err"
	not_ok "a third start restores the snapshot"
fi

# ---- 3: a session recorded on one restore is refused by the next; ephemeral keys differ ----
SBH=$T/sbh
harness() { # harness N [ENV...]: start the vm backend alone on $SBH
	local n=$1
	shift
	mkfifo "$T/hc$n"
	exec 7<>"$T/hc$n"
	env "$@" "$HARNESS" "$SBH" "$TPL" <"$T/hc$n" >"$T/h$n.out" 2>"$T/h$n.err" 7>&- &
	PIDS+=("$!")
	wait_line "$T/h$n.out" '^ready$' 150
}
hstop() { exec 7>&- && wait_line "$T/h$1.out" '^stopped' 30; }
if harness 1; then
	GPUB=$(sed -n 's/^guest-pub //p' "$T/h1.out")
	ping_via() { $TO 40 "$AIRLOCK" ping --guest "$1" --key "$SBH/keys/host.key" --guest-key "$GPUB" -n 3 --timeout 30; }
	start_bg rec python3 "$REC" record "$T/rec.sock" "$SBH/run/agent.sock" "$T/s1"
	t_recorded() { wait_line "$T/rec.out" '^listening$' 20 && ping_via "unix:$T/rec.sock" >/dev/null && wait "$BG_PID"; }
	check "a ping session with the restored agent, recorded (host->guest and guest->host bytes)" t_recorded
	hstop 1
else
	cat "$T/h1.err"
	not_ok "the harness restores the snapshot"
fi
if harness 2; then
	t_replay() {
		local n1 n2
		python3 "$REC" replay "$SBH/run/agent.sock" "$T/s1.h2g" "$T/r.g2h" || return 1
		n1=$(stat -c %s "$T/s1.g2h") n2=$(stat -c %s "$T/r.g2h")
		echo "# recorded session: guest sent $n1 bytes; replayed: $n2 bytes, then closed" >&2
		# the replayed msg1 gets a reply (a record: 4-byte header, RESP, msg2 = a new e and a tag;
		# then the record holding the stream's 24-byte header), then the first recorded record
		# fails to decrypt under the new keys: nothing more (the recorded session had pongs)
		[ "$n2" = 81 ] && [ "$n1" -gt 81 ] &&
			[ "$(head -c 37 "$T/s1.g2h" | tail -c 32 | od -An -tx1)" != "$(head -c 37 "$T/r.g2h" | tail -c 32 | od -An -tx1)" ] &&
			wait_line "$SBH/console.log" 'session [0-9]+: ended: record [0-9]+ failed authentication' 10
	}
	check "the session recorded on the previous restore is refused when replayed (new ephemeral key)" t_replay
	t_after() { ping_via "unix:$SBH/run/agent.sock" >/dev/null && grep -q 'restored from a snapshot' "$T/h2.out"; }
	check "a fresh session after the refused replay works" t_after
	hstop 2
else
	cat "$T/h2.err"
	not_ok "the harness restores the snapshot again"
fi

# ---- 4: another VM setting, another snapshot: memory 512 MiB boots cold ----
if harness 3 AIRLOCK_VM_MEMORY=512; then
	t_mem() {
		grep -q 'snapshot saved' "$T/h3.out" && grep -q 'started: cold' "$SBH/console.log" &&
			[ "$(ls -d "$TPL"/snapshots/*/ | wc -l)" = 2 ] && grep -lq '^memory 512M$' "$TPL"/snapshots/*/meta
	}
	check "a changed VM memory size (AIRLOCK_VM_MEMORY=512) boots cold and saves its own snapshot" t_mem
	hstop 3
else
	cat "$T/h3.err"
	not_ok "AIRLOCK_VM_MEMORY=512 boots"
fi
t_bad_mem() { ! AIRLOCK_VM_MEMORY=12x "$HARNESS" "$T/sb-x" "$TPL" </dev/null >/dev/null 2>"$T/x.err" &&
	grep -q 'AIRLOCK_VM_MEMORY=12x: not a size in MiB' "$T/x.err"; }
check "a bad AIRLOCK_VM_MEMORY is refused by name" t_bad_mem

# ---- 5: cleanup ----
t_destroy() {
	"$AIRLOCK" down "$W" --destroy >"$T/destroy.out" 2>&1 || { cat "$T/destroy.out" >&2; return 1; }
	[ ! -e "$VSB" ] && ! pgrep -f "qemu-system.*$T" >/dev/null && [ -f "$SNAP/state" ]
}
check "down --destroy removes the sandbox (disk, console, counters), no qemu is left; the template's snapshot stays" t_destroy

if [ "$FAIL" -gt 0 ]; then
	for f in "$T"/vup*.err "$T"/h*.err; do echo "--- $f" && tail -n 15 "$f"; done
	[ -n "${VSB:-}" ] && echo "--- qemu.log" && cat "$VSB/qemu.log" 2>/dev/null
	echo "--- console" && tail -n 30 "$SBH/console.log" 2>/dev/null
fi
finish
