#!/usr/bin/env bash
# The vm sandbox end to end: build the base template (cached), boot it with
# qemu through relay/sandbox/sandbox_vm.c (tests/vm_harness), `airlock up` a real
# tree (a few hundred files, a .env secret, a .gitignore'd node_modules)
# against the VM, run commands with `airlock exec` (output, exit codes),
# check the secret was withheld and that the VM has no network interface but
# lo and no way to connect out, `airlock down`, `up` again against the same
# VM (a fresh session on the same virtio-serial port), power off; then the
# user's path, `airlock up DIR --sandbox vm` (the daemon boots the VM): exec,
# status, down, a second up reuses the workspace disk (a file a command made
# outside the synced paths, node_modules/x, is still there), down --destroy
# removes it.
# usage: vm_e2e.sh AIRLOCK AGENT_STATIC VM_HARNESS TEMPLATE_BUILD_SH TEMPLATE_DIR
#   AGENT_STATIC '-': build one from $AIRLOCK_SRC with -Dstatic_agent=true
# Skips (exit 77) only when qemu, root or /dev/fuse are missing.
# shellcheck source=tests/e2e/lib.sh
source "$(dirname "$0")/lib.sh"

AIRLOCK=$1
AGENT=$2
AGENT_ARG=$2
HARNESS=$3
BUILD=$4
TPL=$5
if ! command -v qemu-system-x86_64 >/dev/null 2>&1; then
	echo "skip - vm_e2e needs qemu-system-x86_64 (apt-get install qemu-system-x86, or tests/deps.sh)"
	exit 77
fi
if [ "$(id -u)" != 0 ] || [ ! -c /dev/fuse ]; then
	echo "skip - vm_e2e needs root and /dev/fuse for airlock up (uid $(id -u))"
	exit 77
fi
export XDG_STATE_HOME=$T/state
export AIRLOCK_SOCKET=$T/relay.sock
TO="timeout -k 2"

# ---- the template (cached in TEMPLATE_DIR: rebuilt only when an input changed), with
# this build's static agent or (sanitizer builds have none) one built with
# -Dstatic_agent=true next to the template, incrementally (lib.sh vm_template) ----
t0=$(date +%s.%N)
if ! vm_template "$AGENT_ARG" "$BUILD" "$TPL"; then
	cat "$T/sa.out" "$T/build.out" 2>/dev/null
	not_ok "a static agent and the template build"
	finish
	exit 1
fi
AGENT=$VM_AGENT
echo "# template: $(tail -n 1 "$T/build.out") in $(echo "$(date +%s.%N) - $t0" | bc) s"
t_cached() { "$BUILD" "$TPL" "$AGENT" | grep -q "is up to date"; }
check "template build is cached (second build does nothing)" t_cached

# ---- errors name what is missing ----
t_no_template() {
	mkdir -p "$T/empty"
	! AIRLOCK_VM_NO_BUILD=1 "$HARNESS" "$T/sb-x" "$T/empty" </dev/null >/dev/null 2>"$T/x.err" &&
		grep -q "no VM template in $T/empty (vmlinux, initramfs.cpio): build it with guest-agent/template/build.sh" "$T/x.err"
}
check "a missing template is an error that says how to build it" t_no_template
t_no_qemu() {
	! AIRLOCK_QEMU=/nonexistent/qemu "$HARNESS" "$T/sb-x" "$TPL" </dev/null >/dev/null 2>"$T/x.err" &&
		grep -q "AIRLOCK_QEMU=/nonexistent/qemu: no such executable" "$T/x.err"
}
check "a missing qemu is an error that names it" t_no_qemu
t_comma() {
	! "$HARNESS" "$T/sb,x" "$TPL" </dev/null >/dev/null 2>"$T/x.err" && grep -q "a ',' in the sandbox directory" "$T/x.err"
}
check "a sandbox directory qemu cannot take (a comma) is refused by name" t_comma
if [ "$AGENT_ARG" != - ]; then
	# a development build refreshes a stale template before booting (here: stopped right after, at qemu)
	t_refresh() {
		cp -a "$TPL" "$T/tpl-copy" && echo stale >"$T/tpl-copy/stamp" &&
			! AIRLOCK_QEMU=/nonexistent/qemu "$HARNESS" "$T/sb-r" "$T/tpl-copy" </dev/null >/dev/null 2>&1 &&
			grep -q "^template: built $T/tpl-copy" "$T/sb-r/template.log" &&
			[ "$(cat "$T/tpl-copy/stamp")" = "$(cat "$TPL/stamp")" ]
	}
	check "a stale template is rebuilt before the VM starts (development build)" t_refresh
	rm -rf "$T/tpl-copy"
fi
t_dynamic_agent() {
	! "$BUILD" "$T/tpl-x" "$AIRLOCK" >/dev/null 2>"$T/x.err" && grep -q "dynamically linked" "$T/x.err"
}
check "the template builder refuses a dynamically linked agent" t_dynamic_agent

# ---- a real tree: a few hundred files, a secret, ignore rules ----
W=$T/work
mkdir -p "$W/src" "$W/docs"
for d in 0 1 2 3 4 5 6 7 8 9; do
	mkdir -p "$W/src/m$d"
	for f in $(seq 1 30); do
		printf 'module %d file %d\n%s\n' "$d" "$f" "$(head -c 200 /dev/urandom | base64 -w0)" >"$W/src/m$d/f$f.txt"
	done
done
echo "hello from the workspace" >"$W/README"
printf 'node_modules/\n' >"$W/.gitignore"
echo "API_TOKEN=vm-e2e-canary-$$" >"$W/.env"
NFILES=$(cd "$W" && find . -type f ! -name .env | wc -l)

# ---- boot 1 ----
SB=$T/sb
mkfifo "$T/ctl1"
exec 7<>"$T/ctl1" # the harness stops the VM when its stdin ends: closing fd 7
# (not start_bg: a background command's stdin would be /dev/null)
"$HARNESS" "$SB" "$TPL" <"$T/ctl1" >"$T/h1.out" 2>"$T/h1.err" 7>&- &
PIDS+=("$!")
if ! wait_line "$T/h1.out" '^ready$' 150; then
	cat "$T/h1.err" "$SB/qemu.log" 2>/dev/null
	tail -n 30 "$SB/console.log" 2>/dev/null
	not_ok "the VM boots and its agent is ready"
	finish
	exit 1
fi
ok "the VM boots and its agent is ready ($(sed -n 's/^start_ms //p' "$T/h1.out") ms)"
ADDR=$(sed -n 's/^addr //p' "$T/h1.out")
HK=$(sed -n 's/^host-key //p' "$T/h1.out")
GPUB=$(sed -n 's/^guest-pub //p' "$T/h1.out")
echo "# $(grep '^describe' "$T/h1.out")"
t_describe() { grep -qE '^describe vm: qemu -M (microvm|q35), (kvm|software emulation \(TCG\))' "$T/h1.out"; }
check "describe names the machine and the accelerator" t_describe
t_nic() { grep -q -- '-nic none' "/proc/$(cat "$SB/run/qemu.pid")/cmdline" 2>/dev/null ||
	tr '\0' ' ' <"/proc/$(cat "$SB/run/qemu.pid")/cmdline" | grep -q -- '-nic none'; }
check "qemu runs with -nic none" t_nic
t_config_drive() {
	[ "$(stat -c %a "$SB/config.tar")" = 600 ] &&
		[ "$(tar -tf "$SB/config.tar" | sed 's|^\./||' | sort | tr '\n' ' ')" = "agent.conf allow guest.key " ] &&
		[ "$(tar -xOf "$SB/config.tar" allow)" = "$("$AIRLOCK" pubkey "$SB/keys/host.key")" ]
}
check "the config drive (0600) holds guest.key, allow (the host key) and agent.conf" t_config_drive
t_cmdline_keys() { ! tr '\0' ' ' <"/proc/$(cat "$SB/run/qemu.pid")/cmdline" | grep -q "$(head -c 20 "$SB/keys/guest.key")"; }
check "no key on qemu's command line (they come from the config drive)" t_cmdline_keys

up() {
	start_bg "up$1" "$AIRLOCK" up "$W" --guest "$ADDR" --key "$HK" --guest-key "$GPUB" 7>&- 8>&-
	UP_PID=$BG_PID
	wait_line "$T/up$1.out" "in sync with $ADDR" 30
}
down() {
	$TO 30 "$AIRLOCK" down "$W" >/dev/null
	local i
	for i in $(seq 100); do kill -0 "$UP_PID" 2>/dev/null || return 0; sleep 0.1; done
	return 1
}
X() { $TO 60 "$AIRLOCK" exec -C "$W" "$@" </dev/null; }

if ! up 1; then
	cat "$T/up1.err" "$T/up1.out"
	tail -n 20 "$SB/console.log"
	not_ok "airlock up syncs the tree into the VM"
	finish
	exit 1
fi
ok "airlock up syncs the tree into the VM"

t_output() { [ "$(X -- cat README)" = "hello from the workspace" ]; }
check "exec: output of a command in the VM" t_output
t_codes() {
	local c rc
	for c in 0 1 42; do
		rc=0
		X -- sh -c "exit $c" || rc=$?
		[ "$rc" = "$c" ] || { echo "exit $c gave $rc" >&2; return 1; }
	done
}
check "exec: exit codes 0, 1, 42 come back" t_codes
t_count() {
	local n
	n=$(X -- sh -c 'find . -type f | wc -l')
	[ "$n" = "$NFILES" ] || { echo "guest has $n files, host $NFILES" >&2; return 1; }
	[ "$(X -- cat src/m7/f29.txt)" = "$(cat "$W/src/m7/f29.txt")" ]
}
check "the guest holds the $NFILES synced files, byte for byte" t_count
t_secret() {
	local rc=0
	X -- test -e .env || rc=$?
	[ "$rc" = 1 ] && ! X -- sh -c 'grep -r vm-e2e-canary . 2>/dev/null' | grep -q canary
}
check "the .env secret is withheld from the VM" t_secret
t_clock() {
	local g h rc=0 t0 t1
	g=$(X -- date +%s)
	h=$(date +%s)
	[ $((h - g)) -le 3 ] && [ $((g - h)) -le 3 ] || { echo "guest clock $g, host $h" >&2; return 1; }
	# guest timers run in real time: the timeout fires after ~2 s of wall time
	t0=$(date +%s.%N)
	X --timeout 2 -- sleep 30 || rc=$?
	t1=$(date +%s.%N)
	[ "$rc" = 124 ] && [ "$(echo "$t1 - $t0 < 6" | bc)" = 1 ] && [ "$(echo "$t1 - $t0 >= 1.9" | bc)" = 1 ] ||
		{ echo "timeout rc $rc after $(echo "$t1 - $t0" | bc) s" >&2; return 1; }
}
check "the guest clock follows the host's; exec --timeout 2 fires after 2 s" t_clock
t_kernel() { X -- uname -r | grep -q 'amd64'; }
check "commands run on the template's kernel (a real VM)" t_kernel
t_nonet() {
	local ifs
	ifs=$(X -- ls /sys/class/net | tr '\n' ' ')
	[ "$ifs" = "lo " ] || { echo "interfaces: $ifs" >&2; return 1; }
	X -- sh -c 'ip -4 addr show lo | grep -q 127.0.0.1'
}
check "the VM has no network interface but lo (up)" t_nonet
t_connect() {
	local rc=0
	# raw TCP out, to an address and to the host's usual user-mode gateway
	X -- sh -c 'nc -w 2 1.1.1.1 80 </dev/null; e1=$?; nc -w 2 10.0.2.2 22 </dev/null; e2=$?;
		[ $e1 -ne 0 ] && [ $e2 -ne 0 ] && exit 7' || rc=$?
	[ "$rc" = 7 ] || { echo "connect attempts: rc $rc" >&2; return 1; }
}
check "a raw TCP connect from the VM fails" t_connect
t_outside() { X -- sh -c 'mkdir -p node_modules/x && echo kept-across-boots >node_modules/x/marker'; }
check "a command creates node_modules/x (outside the synced paths)" t_outside
t_edit() {
	echo "edited on the host" >"$W/README"
	[ "$(X -- cat README)" = "edited on the host" ]
}
check "an edit through the mount is seen by the next command" t_edit

check "airlock down" down
# the same VM, a new host connection: the agent gets a fresh session
t_reup() { up 2 && [ "$(X -- cat README)" = "edited on the host" ] && X -- test -f node_modules/x/marker; }
check "up again against the same VM (fresh session on the same port)" t_reup
t_reup3() { down && up 3 && X -- true; }
check "down and up a third time" t_reup3
check "airlock down again" down

t_stop() {
	exec 7>&-
	wait_line "$T/h1.out" '^stopped' 30 && grep -q 'airlock-init: powering off' "$SB/console.log" &&
		! grep -q 'terminating on signal' "$SB/qemu.log"
}
check "the VM powers off cleanly when asked (no signal needed)" t_stop
echo "# $(grep '^stopped' "$T/h1.out")"
t_clean_sessions() {
	[ "$(grep -c 'session [0-9]*: closed' "$SB/console.log")" -ge 3 ] && ! grep 'session [0-9]*: ended' "$SB/console.log"
}
check "every up/down was a clean session in the guest (no session ended on an error)" t_clean_sessions

# ---- the user's path: `airlock up DIR --sandbox vm` (no harness, no --guest):
# the daemon boots the VM from the template (AIRLOCK_VM_TEMPLATE: this
# test's), its state under XDG_DATA_HOME. Two boots: the second reuses the
# workspace disk; then down --destroy removes it ----
export XDG_DATA_HOME=$T/data AIRLOCK_VM_TEMPLATE=$TPL
vup() {
	start_bg "vup$1" "$AIRLOCK" up "$W" --sandbox vm 7>&- 8>&-
	UP_PID=$BG_PID
	wait_line "$T/vup$1.out" "^airlock: $W in sync with sandbox vm\$" 150
}
if vup 1; then
	VSB=$(sed -n 's/^airlock: sandbox started .*; state in //p' "$T/vup1.err")
	ok "airlock up --sandbox vm boots the VM and syncs ($(sed -n 's/^airlock: sandbox started in \([0-9.]*\) ms.*/\1/p' "$T/vup1.err") ms to the agent)"
	t_cli_status() {
		"$AIRLOCK" status -C "$W" | grep -qE '^sandbox     vm, running \(vm: qemu -M (microvm|q35), ' &&
			"$AIRLOCK" status -C "$W" --json | grep -q '"sandbox":"vm"' &&
			[ -n "$VSB" ] && [ -f "$VSB/workspace.img" ] && case $VSB in "$T/data/"*) ;; *) false ;; esac
	}
	check "status shows the vm sandbox running; its disk is under XDG_DATA_HOME" t_cli_status
	t_cli_exec() {
		local rc=0
		[ "$(X -- cat README)" = "edited on the host" ] && X -- uname -r | grep -q amd64 || return 1
		X -- sh -c 'echo out; echo err >&2; exit 3' >"$T/ce.out" 2>"$T/ce.err" || rc=$?
		[ "$rc" = 3 ] && [ "$(cat "$T/ce.out")" = out ] && [ "$(cat "$T/ce.err")" = err ]
	}
	check "exec in the VM: output, stderr, exit code 3" t_cli_exec
	t_cli_count() { [ "$(X -- sh -c 'find . -type f | wc -l')" = "$NFILES" ] && X -- sh -c '! test -e .env'; }
	check "the tree ($NFILES files) is in the VM, the secret is not" t_cli_count
	t_cli_mark() {
		X -- sh -c 'mkdir -p node_modules/x && echo cli-kept >node_modules/x/marker' && [ ! -e "$W/node_modules" ] &&
			X -- sh -c 'echo vm-change >made-in-vm.txt' 2>/dev/null && [ ! -e "$W/made-in-vm.txt" ] &&
			"$AIRLOCK" changes -C "$W" --json | grep -q '"path":"made-in-vm.txt","kind":"create"'
	}
	check "a command makes node_modules/x in the VM (not on the host) and made-in-vm.txt (a guest change, waiting)" t_cli_mark
	# what the agent (root in the VM) writes is the command user's: a
	# command edits, adds and removes files in a synced directory, and in
	# one the host makes now; accept brings them to the host
	t_cli_owned() {
		mkdir "$W/src/newdir" && echo from-host >"$W/src/newdir/h.txt" || return 1
		X -- sh -c 'echo vm-edit >>src/m7/f29.txt && echo vm-new >src/m7/made.txt && rm src/m7/f28.txt &&
			echo vm-more >>src/newdir/h.txt && echo vm-g >src/newdir/g.txt' || return 1
		"$AIRLOCK" changes -C "$W" --json >"$T/own.json" || return 1
		grep -q '"path":"src/m7/f29.txt","kind":"modify"' "$T/own.json" &&
			grep -q '"path":"src/m7/made.txt","kind":"create"' "$T/own.json" &&
			grep -q '"path":"src/m7/f28.txt","kind":"delete"' "$T/own.json" &&
			grep -q '"path":"src/newdir/g.txt","kind":"create"' "$T/own.json" || { cat "$T/own.json" >&2; return 1; }
		$TO 60 "$AIRLOCK" accept -C "$W" src/m7/f29.txt src/m7/made.txt src/m7/f28.txt src/newdir/h.txt \
			src/newdir/g.txt >/dev/null &&
			[ "$(tail -n 1 "$W/src/m7/f29.txt")" = vm-edit ] && [ "$(cat "$W/src/m7/made.txt")" = vm-new ] &&
			[ ! -e "$W/src/m7/f28.txt" ] && [ "$(cat "$W/src/newdir/h.txt")" = "$(printf 'from-host\nvm-more')" ] &&
			[ "$(cat "$W/src/newdir/g.txt")" = vm-g ]
	}
	check "a command changes files the host synced, in a synced directory and in a new one (they are the command user's); accept brings them" t_cli_owned
	check "airlock down stops the VM" down
	t_cli_gone() { ! pgrep -f "qemu-system.*$VSB" >/dev/null; }
	check "no qemu is left after down" t_cli_gone
	t_cli_reuse() {
		local ino
		ino=$(stat -c %i "$VSB/workspace.img") && vup 2 || return 1
		[ "$(X -- cat node_modules/x/marker)" = cli-kept ] && ! grep -q 'Creating regular file' "$VSB/qemu.log" &&
			[ "$(stat -c %i "$VSB/workspace.img")" = "$ino" ]
	}
	check "a second up --sandbox vm boots on the same workspace disk (node_modules/x is there)" t_cli_reuse
	t_cli_change_kept() {
		[ "$(X -- cat made-in-vm.txt)" = vm-change ] && [ ! -e "$W/made-in-vm.txt" ] &&
			"$AIRLOCK" changes -C "$W" --json | grep -q '"path":"made-in-vm.txt","kind":"create"' &&
			$TO 60 "$AIRLOCK" accept -C "$W" made-in-vm.txt >/dev/null && [ "$(cat "$W/made-in-vm.txt")" = vm-change ]
	}
	check "the unreviewed guest change survived the VM reboot (down/up), still listed; accept brings it" t_cli_change_kept
	check "airlock down again" down
	t_cli_destroy() {
		"$AIRLOCK" down "$W" --destroy >"$T/destroy.out" 2>&1 || { cat "$T/destroy.out" >&2; return 1; }
		[ ! -e "$VSB/workspace.img" ] && [ ! -e "$VSB" ]
	}
	check "down --destroy removes the disk image" t_cli_destroy
else
	cat "$T/vup1.err"
	not_ok "airlock up --sandbox vm boots the VM and syncs"
fi
unset XDG_DATA_HOME AIRLOCK_VM_TEMPLATE
# ---- the q35 fallback (for a qemu without microvm): boots, answers a ping, powers off ----
mkfifo "$T/ctl3"
exec 9<>"$T/ctl3"
# (and the boot without snapshots, AIRLOCK_VM_SNAPSHOT=0: the start line comes at once)
AIRLOCK_VM_SNAPSHOT=0 AIRLOCK_VM_MACHINE=q35 "$HARNESS" "$T/sb-q35" "$TPL" <"$T/ctl3" >"$T/h3.out" 2>"$T/h3.err" 9>&- &
PIDS+=("$!")
if wait_line "$T/h3.out" '^ready$' 150; then
	t_q35() {
		grep -q '^describe vm: qemu -M q35.*, no snapshot$' "$T/h3.out" && grep -q 'started: cold 1' "$T/sb-q35/console.log" &&
			$TO 30 "$AIRLOCK" ping --guest "$(sed -n 's/^addr //p' "$T/h3.out")" --key "$T/sb-q35/keys/host.key" \
				--guest-key "$(sed -n 's/^guest-pub //p' "$T/h3.out")" -n 20 --timeout 20 >/dev/null
	}
	check "-M q35 (the fallback), no snapshot, boots cold and answers a ping ($(sed -n 's/^start_ms //p' "$T/h3.out") ms)" t_q35
else
	cat "$T/h3.err"
	not_ok "-M q35 (the fallback) boots"
fi
exec 9>&-
wait_line "$T/h3.out" '^stopped' 30 || true

if [ "$FAIL" -gt 0 ]; then
	for f in "$T"/up*.err "$T"/h*.err; do echo "--- $f" && tail -n 15 "$f"; done
	echo "--- console" && tail -n 40 "$SB/console.log"
fi
finish
