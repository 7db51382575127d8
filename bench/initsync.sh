#!/usr/bin/env bash
# Initial sync and memory (doc/BENCH.md "Initial sync: memory and compression level"): on one tree
# of bench/scale.sh (generate it there first), in one run:
#   airlock   `airlock up -d` to a plain airlock-agent on a unix socket (--fsync none), fresh state,
#             to "in sync"; then `airlock down` and an unchanged `airlock up -d`; VmHWM of the daemon
#             (each up's own process) and of the agent (one agent for both ups: the max of the two)
#   rsync -a  into an empty directory; tar | tar  the same (RSYNC=1)
# Beside each wall time: the CPU seconds (user + system) it cost, and the load average. On this
# shared 2-core machine wall times follow the load (several x between runs); CPU seconds do not,
# and they say which side is the critical path: daemon = the up process (scan + send), agent =
# the agent's CPU during that up, rsync/tar = all their processes (/usr/bin/time).
# CHECK=1 compares the guest's copy with the tree (diff -r; withheld secrets show up as missing).
#
# usage: bench/initsync.sh BUILD [TREE]   (root + /dev/fuse; TREE: small, 100k (default) or 1m)
# Environment: AIRLOCK_SCALE_DIR as for scale.sh; WORK=DIR syncs DIR in place instead of a fresh copy
#   of the tree (a 1M-file copy takes minutes).
set -euo pipefail
B=$(realpath "${1:?usage: bench/initsync.sh BUILD [TREE]}")
name=${2:-100k}
C=${AIRLOCK_SCALE_DIR:-/tmp/airlock-scale}
AIRLOCK=$B/airlock
[ -f "$C/$name.ok" ] || { echo "no tree $C/$name: run bench/scale.sh first (it generates them)" >&2; exit 1; }
T=$(mktemp -d "$C/init.XXXXXX")
AP= W=
cleanup() {
	[ -n "$W" ] && "$AIRLOCK" down "$W" >/dev/null 2>&1 || true
	[ -n "$AP" ] && kill "$AP" 2>/dev/null || true
	rm -rf "$T"
}
trap cleanup EXIT
export XDG_STATE_HOME=$T/state XDG_DATA_HOME=$T/data
if [ -n "${WORK:-}" ]; then W=$WORK; else W=$T/work; cp -a "$C/$name" "$W"; fi
G=$T/guest
mkdir -p "$G"
"$AIRLOCK" keygen -o "$T/hk" >"$T/hk.pub"
"$AIRLOCK" keygen -o "$T/gk" >"$T/gk.pub"
"$B/airlock-agent" --listen "unix:$T/a.sock" --root "$G" --key "$T/gk" --allow "$(cat "$T/hk.pub")" \
	--state "$T/agent-state" --fsync none >"$T/agent.out" 2>&1 &
AP=$!
for _ in $(seq 200); do grep -q '^ready' "$T/agent.out" 2>/dev/null && break; sleep 0.05; done
UP=(--guest "unix:$T/a.sock" --key "$T/hk" --guest-key "$(cat "$T/gk.pub")")
hwm() { awk '/^VmHWM/ { printf "%.1f", $2 / 1024 }' "/proc/$1/status"; }
cpu() { awk -v hz="$(getconf CLK_TCK)" '{ printf "%.2f", ($14 + $15) / hz }' "/proc/$1/stat"; } # user + system s
load() { cut -d' ' -f1-3 /proc/loadavg; }
now() { date +%s.%N; }
daemon_pid() { "$AIRLOCK" status -C "$W" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["pid"])'; }
up() { # up LABEL
	local t0 t1 pid a0 l0
	sync
	a0=$(cpu "$AP") l0=$(load)
	t0=$(now)
	"$AIRLOCK" up "$W" "${UP[@]}" -d >/dev/null 2>"$T/up.err" || { cat "$T/up.err" >&2; exit 1; }
	t1=$(now)
	pid=$(daemon_pid)
	echo "airlock $1: $(echo "$t1 - $t0" | bc) s, daemon VmHWM $(hwm "$pid") MiB, agent VmHWM $(hwm "$AP") MiB;" \
		"CPU s: daemon $(cpu "$pid"), agent $(echo "$(cpu "$AP") - $a0" | bc); load $l0 -> $(load)"
}
up "initial sync"
if [ -n "${CHECK:-}" ]; then
	diff -r "$W" "$G" >"$T/diff" 2>&1 && echo "copy equal" || { echo "copy differs:"; head -5 "$T/diff"; }
fi
"$AIRLOCK" down "$W" >/dev/null
up "unchanged up"
"$AIRLOCK" down "$W" >/dev/null
W=
if [ "${RSYNC:-0}" != 0 ]; then
	sync
	l0=$(load)
	t0=$(now)
	/usr/bin/time -f '%U %S' -o "$T/rs.cpu" rsync -a "$C/$name/" "$T/rs/"
	echo "rsync -a: $(echo "$(now) - $t0" | bc) s; CPU s $(awk '{ printf "%.2f", $1 + $2 }' "$T/rs.cpu"); load $l0 -> $(load)"
	sync
	mkdir "$T/tt"
	l0=$(load)
	t0=$(now)
	/usr/bin/time -f '%U %S' -o "$T/tt.cpu" sh -c 'cd "$1" && tar cf - . | (cd "$2" && tar xf -)' sh "$C/$name" "$T/tt"
	echo "tar | tar: $(echo "$(now) - $t0" | bc) s; CPU s $(awk '{ printf "%.2f", $1 + $2 }' "$T/tt.cpu"); load $l0 -> $(load)"
fi
