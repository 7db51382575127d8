#!/usr/bin/env bash
# The vm sandbox side by side with the local sandbox (and a plain agent
# process), in one run (doc/VM.md), each through the user's CLI:
#   agent   airlock-agent as a plain process on a unix socket, `airlock up --guest`
#   local   `airlock up DIR --sandbox local` (namespaces, doc/SANDBOX.md)
#   vm      `airlock up DIR --sandbox vm` (the base template under qemu, doc/VM.md)
# Per column:
#   start to first command   `airlock up` starts -> in sync -> first `airlock exec
#                            -- true` answered (for agent: from the agent's start)
#   edit to guest            write a file through the mount -> a watcher command
#                            in the guest (busybox sh polling the file every 2 ms
#                            with shell builtins only, no fork) prints the new
#                            content -> the line reaches the host. Includes the
#                            output's way back; not `airlock sync-wait`, whose
#                            figure is floored by the daemon's status cadence
#   exec round trip          `airlock exec -- true`, client start to exit
#   edit then exec           write a file through the mount, then `airlock exec
#                            -- cat` it: the command is ordered after the edit
#   down                     `airlock down` returns (vm: the guest powers off)
#
# usage: bench/vm.sh BUILD [N]     (root + /dev/fuse + qemu + busybox)
#   BUILD  a meson build dir with airlock, airlock-agent, airlock-agent-static
#   N      edits and exec round trips per column (default 100)
set -euo pipefail

B=$(realpath "${1:?usage: bench/vm.sh BUILD [N]}")
N=${2:-100}
SRC=$(cd "$(dirname "$0")/.." && pwd)
AIRLOCK=$B/airlock
T=$(mktemp -d /tmp/airlock-bench-vm.XXXXXX)
PIDS=()
cleanup() {
	local p d
	for d in "$T"/w-*; do "$AIRLOCK" down "$d" >/dev/null 2>&1 || true; done
	for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
	sleep 1
	for d in "$T"/w-*; do mountpoint -q "$d" 2>/dev/null && umount -l "$d"; done
	rm -rf "$T"
}
trap cleanup EXIT
export XDG_STATE_HOME=$T/state XDG_DATA_HOME=$T/data
command -v busybox >/dev/null || { echo "bench/vm.sh: needs busybox (apt-get install busybox-static)" >&2; exit 1; }

ms() { date +%s%N | awk '{ printf "%.3f", $1 / 1e6 }'; }
# stats FILE: "p50 / p90" of one number per line
stats() { sort -n "$1" | awk '{ a[NR] = $1 } END { printf "%.1f / %.1f ms", a[int(NR*0.5+0.5)], a[int(NR*0.9+0.5)] }'; }

tree() { # tree DIR: 200 small files and the watcher
	mkdir -p "$1/src"
	for i in $(seq 1 200); do echo "file $i" >"$1/src/f$i.txt"; done
	echo "bench" >"$1/README"
	# watch.sh FILE: print FILE's first line whenever it changes; exit on "stop"
	cat >"$1/watch.sh" <<'EOF'
mkfifo /tmp/watch.$$ && exec 3<>/tmp/watch.$$ && rm /tmp/watch.$$ || exit 1
prev=
while :; do
	read -r l <"$1" || l=
	[ "$l" = "$prev" ] || { echo "$l"; prev=$l; }
	[ "$l" = stop ] && exit 0
	read -t 0.002 -u 3 x
done
EOF
}

declare -A R
# column NAME T0 UP_ARGS...: up, first command, edit to guest, exec round trips, barrier, down
column() {
	local name=$1 t0=$2 w=$T/w-$1 t1 t2 i line
	shift 2
	export AIRLOCK_SOCKET=$T/$name.sock
	"$AIRLOCK" up "$w" "$@" >"$T/up-$name.out" 2>"$T/up-$name.err" &
	PIDS+=("$!")
	until grep -qs "in sync with" "$T/up-$name.out"; do
		sleep 0.005
		kill -0 "${PIDS[-1]}" 2>/dev/null || { cat "$T/up-$name.err" >&2; exit 1; }
	done
	"$AIRLOCK" exec -C "$w" -- true </dev/null
	t1=$(ms)
	R[$name.start]=$(printf '%.0f ms' "$(echo "$t1 - $t0" | bc)")
	[ "$name" = agent ] || R[$name.describe]=$("$AIRLOCK" status -C "$w" --json |
		python3 -c 'import json, sys; d = json.load(sys.stdin); print("%s (agent ready after %.0f ms)" % (d["sandbox_describe"], d["sandbox_start_ms"]))')

	# edit to guest: the watcher's output comes back on a fifo
	mkfifo "$T/watch-$name"
	"$AIRLOCK" exec -C "$w" -- busybox sh watch.sh src/f1.txt </dev/null >"$T/watch-$name" &
	PIDS+=("$!")
	exec 5<"$T/watch-$name"
	read -r -t 30 line <&5 # the first line: the current content
	: >"$T/sync-$name"
	for i in $(seq 1 "$N"); do
		t1=$(ms)
		echo "edit $i" >"$w/src/f1.txt"
		while read -r -t 10 line <&5 && [ "$line" != "edit $i" ]; do :; done
		[ "$line" = "edit $i" ] || { echo "$name: the watcher did not see edit $i" >&2; exit 1; }
		t2=$(ms)
		echo "$t2 - $t1" | bc >>"$T/sync-$name"
	done
	echo stop >"$w/src/f1.txt"
	while read -r -t 10 line <&5 && [ "$line" != stop ]; do :; done
	exec 5<&-
	R[$name.sync]=$(stats "$T/sync-$name")

	: >"$T/exec-$name"
	for i in $(seq 1 "$N"); do
		t1=$(ms)
		"$AIRLOCK" exec -C "$w" -- true </dev/null
		t2=$(ms)
		echo "$t2 - $t1" | bc >>"$T/exec-$name"
	done
	R[$name.exec]=$(stats "$T/exec-$name")
	: >"$T/edit-$name"
	for i in $(seq 1 "$N"); do
		t1=$(ms)
		echo "seen $i" >"$w/src/f2.txt"
		[ "$("$AIRLOCK" exec -C "$w" -- cat src/f2.txt </dev/null)" = "seen $i" ] || { echo "stale read" >&2; exit 1; }
		t2=$(ms)
		echo "$t2 - $t1" | bc >>"$T/edit-$name"
	done
	R[$name.edit]=$(stats "$T/edit-$name")
	t1=$(ms)
	"$AIRLOCK" down "$w" >/dev/null
	t2=$(ms)
	R[$name.down]=$(printf '%.0f ms' "$(echo "$t2 - $t1" | bc)")
	echo "# $name done" >&2
}

echo "# $(date -u +%F), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), kernel $(uname -r), N=$N"

# ---- agent: a plain agent process on a unix socket ----
tree "$T/w-agent"
"$AIRLOCK" keygen -o "$T/hk" >"$T/hk.pub"
"$AIRLOCK" keygen -o "$T/gk" >"$T/gk.pub"
mkdir -p "$T/guest"
t0=$(ms)
"$B/airlock-agent" --listen "unix:$T/a.sock" --root "$T/guest" --key "$T/gk" --allow "$(cat "$T/hk.pub")" \
	--state "$T/agent.state" >"$T/agent.out" 2>&1 &
PIDS+=("$!")
until grep -qs "^ready" "$T/agent.out"; do sleep 0.002; done
column agent "$t0" --guest "unix:$T/a.sock" --key "$T/hk" --guest-key "$(cat "$T/gk.pub")"

# ---- local: the embedded namespace sandbox ----
tree "$T/w-local"
column local "$(ms)" --sandbox local

# ---- vm: the base template under qemu (built here when missing or stale) ----
export AIRLOCK_VM_TEMPLATE=$B/vm-template
"$SRC/guest-agent/template/build.sh" "$AIRLOCK_VM_TEMPLATE" "$B/airlock-agent-static" >/dev/null
tree "$T/w-vm"
column vm "$(ms)" --sandbox vm

echo "# ${R[local.describe]}"
echo "# ${R[vm.describe]}"
printf '| | plain agent (unix socket) | `--sandbox local` | `--sandbox vm` |\n|---|---|---|---|\n'
row() { printf '| %s | %s | %s | %s |\n' "$1" "${R[agent.$2]}" "${R[local.$2]}" "${R[vm.$2]}"; }
row 'start → first `airlock exec -- true` answered' start
row "edit → a watcher in the guest prints it (back on the host), p50 / p90 of $N" sync
row "\`airlock exec -- true\` round trip, p50 / p90 of $N" exec
row "edit, then \`exec cat\` sees it (barrier), p50 / p90 of $N" edit
row '`airlock down` returns' down
