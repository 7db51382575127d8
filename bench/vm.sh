#!/usr/bin/env bash
# The vm sandbox side by side with a plain local agent, in one run (issue 7):
#   boot to first command ready   start of the guest -> `airlock up` in sync ->
#                                 first `airlock exec -- true` answered
#   sync latency                  edit one file through the mount, then
#                                 `airlock sync-wait` returns (the guest applied it)
#   exec round trip               `airlock exec -- true`, client start to exit
#   edit then exec                write a file through the mount, then `airlock exec
#                                 -- cat` it: the command is ordered after the edit
# The local row runs airlock-agent as a plain process on a unix socket (no
# namespaces); the vm row boots the base template with qemu through
# relay/sandbox_vm.c (tests/vm_harness).
#
# usage: bench/vm.sh BUILD [N]     (root + /dev/fuse + qemu)
#   BUILD  a meson build dir with airlock, airlock-agent, airlock-agent-static, tests/vm_harness
#   N      edits and exec round trips per row (default 100)
set -euo pipefail

B=$(realpath "${1:?usage: bench/vm.sh BUILD [N]}")
N=${2:-100}
SRC=$(cd "$(dirname "$0")/.." && pwd)
AIRLOCK=$B/airlock
T=$(mktemp -d /tmp/airlock-bench-vm.XXXXXX)
PIDS=()
cleanup() {
	local p
	for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
	sleep 1
	for d in "$T"/w-*; do mountpoint -q "$d" 2>/dev/null && umount -l "$d"; done
	rm -rf "$T"
}
trap cleanup EXIT
export XDG_STATE_HOME=$T/state

ms() { date +%s%N | awk '{ printf "%.3f", $1 / 1e6 }'; }
# stats FILE: p50 p90 max of one number per line
stats() { sort -n "$1" | awk '{ a[NR] = $1 } END { printf "p50 %.1f ms, p90 %.1f ms, max %.1f ms", a[int(NR*0.5+0.5)], a[int(NR*0.9+0.5)], a[NR] }'; }

tree() { # tree DIR: 200 small files
	mkdir -p "$1/src"
	for i in $(seq 1 200); do echo "file $i" >"$1/src/f$i.txt"; done
	echo "bench" >"$1/README"
}

# row NAME ADDR HOSTKEY GUESTPUB T0: up, first command, sync latency, exec round trips
row() {
	local name=$1 addr=$2 hk=$3 gpub=$4 t0=$5 w=$T/w-$1 t1 t2 i
	export AIRLOCK_SOCKET=$T/$name.sock
	"$AIRLOCK" up "$w" --guest "$addr" --key "$hk" --guest-key "$gpub" >"$T/up-$name.out" 2>&1 &
	PIDS+=("$!")
	until grep -qs "in sync with" "$T/up-$name.out"; do sleep 0.005; done
	"$AIRLOCK" exec -C "$w" -- true </dev/null
	t1=$(ms)
	printf '%-6s boot to first command ready: %.0f ms\n' "$name" "$(echo "$t1 - $t0" | bc)"
	: >"$T/sync-$name"
	for i in $(seq 1 "$N"); do
		t1=$(ms)
		echo "edit $i" >"$w/src/f$((i % 200 + 1)).txt"
		"$AIRLOCK" sync-wait -C "$w" --timeout 10 >/dev/null
		t2=$(ms)
		echo "$t2 - $t1" | bc >>"$T/sync-$name"
	done
	printf '%-6s sync latency (edit -> sync-wait returns), %d edits: %s\n' "$name" "$N" "$(stats "$T/sync-$name")"
	: >"$T/exec-$name"
	for i in $(seq 1 "$N"); do
		t1=$(ms)
		"$AIRLOCK" exec -C "$w" -- true </dev/null
		t2=$(ms)
		echo "$t2 - $t1" | bc >>"$T/exec-$name"
	done
	printf '%-6s exec -- true round trip, %d runs: %s\n' "$name" "$N" "$(stats "$T/exec-$name")"
	: >"$T/edit-$name"
	for i in $(seq 1 "$N"); do
		t1=$(ms)
		echo "seen $i" >"$w/src/f1.txt"
		[ "$("$AIRLOCK" exec -C "$w" -- cat src/f1.txt </dev/null)" = "seen $i" ] || { echo "stale read" >&2; exit 1; }
		t2=$(ms)
		echo "$t2 - $t1" | bc >>"$T/edit-$name"
	done
	printf '%-6s edit, then exec cat sees it (the barrier), %d runs: %s\n' "$name" "$N" "$(stats "$T/edit-$name")"
	"$AIRLOCK" down "$w" >/dev/null
}

echo "# $(date -u +%F), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), kernel $(uname -r)"

# ---- local: a plain agent process on a unix socket ----
tree "$T/w-local"
"$AIRLOCK" keygen -o "$T/hk" >"$T/hk.pub"
"$AIRLOCK" keygen -o "$T/gk" >"$T/gk.pub"
mkdir -p "$T/guest"
t0=$(ms)
"$B/airlock-agent" --listen "unix:$T/a.sock" --root "$T/guest" --key "$T/gk" --allow "$(cat "$T/hk.pub")" \
	--state "$T/agent.state" >"$T/agent.out" 2>&1 &
PIDS+=("$!")
until grep -qs "^ready" "$T/agent.out"; do sleep 0.002; done
row local "unix:$T/a.sock" "$T/hk" "$(cat "$T/gk.pub")" "$t0"

# ---- vm: the base template under qemu ----
AGENT_STATIC=$B/airlock-agent-static
TPL=$B/vm-template
"$SRC/guest-agent/template/build.sh" "$TPL" "$AGENT_STATIC" >/dev/null
tree "$T/w-vm"
mkfifo "$T/ctl"
exec 7<>"$T/ctl"
t0=$(ms)
"$B/tests/vm_harness" "$T/sb" "$TPL" <"$T/ctl" >"$T/h.out" 2>&1 7>&- &
PIDS+=("$!")
until grep -q '^ready$' "$T/h.out"; do
	sleep 0.01
	grep -q 'vm_harness:' "$T/h.out" && { cat "$T/h.out"; exit 1; }
done
echo "# $(grep '^describe' "$T/h.out"); qemu to agent ready: $(sed -n 's/^start_ms //p' "$T/h.out") ms"
row vm "$(sed -n 's/^addr //p' "$T/h.out")" "$(sed -n 's/^host-key //p' "$T/h.out")" \
	"$(sed -n 's/^guest-pub //p' "$T/h.out")" "$t0"
exec 7>&-
until grep -q '^stopped' "$T/h.out"; do sleep 0.05; done
echo "# vm $(grep '^stopped' "$T/h.out") (clean poweroff)"
