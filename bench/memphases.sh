#!/usr/bin/env bash
# Peak RSS over a session's life (doc/BENCH.md "Memory over a session"): on a prepared copy WORK of a
# tree of bench/scale.sh (synced in place, like bench/initsync.sh WORK=), to a plain airlock-agent
# (--fsync none, its copy in /dev/shm) on a unix socket, fresh state:
#   1 initial sync   `airlock up -d` to "in sync"
#   edits            200 appends to 20 files, 20 new files, a directory renamed (through the mount),
#                    then an exec (the barrier): VmHWM of the same daemon after them
#   2 rescan up      `airlock down`, `airlock up -d`: the first up after a session that changed the
#                    tree is a full scan with the hash cache and a levels reconcile
#   3 unchanged up   `airlock down`, `airlock up -d`: proven unchanged (doc/SYNC.md)
# VmHWM (/proc/PID/status) of each up's daemon and of the one agent, and their CPU (user + system
# s, /proc/PID/stat: each up's daemon; the agent's since it started). WORK is edited (the rename
# toggles back on the next run). HTPHASE 1, 2 or 3 attaches heaptrack (-p) to that up's daemon
# and writes HTOUT.zst (`heaptrack_print -f HTOUT.zst --print-peaks 1`); it attaches after the
# daemon starts, so a very short up is missed. The 1M tree of bench/scale.sh has neither directory
# the edits use: they are added to WORK first (gen/m00/p000 with 20 small files, gen/m01/p001 with
# one), as in doc/BENCH.md "Memory at 1M files".
#
# usage: bench/memphases.sh BUILD WORK [HTPHASE HTOUT]     (root + /dev/fuse)
set -euo pipefail
B=$(realpath "$1"); W0=$2; HTP=${3:-0}; HTO=${4:-}
AIRLOCK=$B/airlock
G=
T=$(mktemp -d "${TMPDIR:-/tmp}/memphases.XXXXXX"); AP= W=
cleanup() { [ -n "$W" ] && "$AIRLOCK" down "$W" >/dev/null 2>&1 || true; [ -n "$AP" ] && kill "$AP" 2>/dev/null || true; rm -rf "$T" "$G"; }
trap cleanup EXIT
export XDG_STATE_HOME=$T/state XDG_DATA_HOME=$T/data
W=$W0
if [ ! -d "$W/gen/m00/p000" ]; then
  mkdir -p "$W/gen/m00/p000"
  for i in $(seq -w 0 19); do echo "int x$i;" >"$W/gen/m00/p000/s$i.c"; done
fi
if [ ! -d "$W/gen/m01/p001" ] && [ ! -d "$W/gen/m01/p001x" ]; then mkdir -p "$W/gen/m01/p001"; echo y >"$W/gen/m01/p001/t.c"; fi
G=$(mktemp -d /dev/shm/memphases-guest.XXXXXX)
"$AIRLOCK" keygen -o "$T/hk" >"$T/hk.pub"; "$AIRLOCK" keygen -o "$T/gk" >"$T/gk.pub"
"$B/airlock-agent" --listen "unix:$T/a.sock" --root "$G" --key "$T/gk" --allow "$(cat "$T/hk.pub")" --state "$T/agent-state" --fsync none >"$T/agent.out" 2>&1 &
AP=$!
for _ in $(seq 200); do grep -q '^ready' "$T/agent.out" 2>/dev/null && break; sleep 0.05; done
UP=(--guest "unix:$T/a.sock" --key "$T/hk" --guest-key "$(cat "$T/gk.pub")")
hwm() { awk '/^VmHWM/ { printf "%.1f", $2 / 1024 }' "/proc/$1/status"; }
cpu() { awk -v t="$(getconf CLK_TCK)" '{ printf "%.2f", ($14 + $15) / t }' "/proc/$1/stat"; } # user + system s
up() { # N LABEL
  local t0=$(date +%s.%N) HT= d=
  rm -f $XDG_STATE_HOME/airlock/*/up.pid
  "$AIRLOCK" up "$W" "${UP[@]}" -d >/dev/null 2>"$T/up.err" &
  local UPP=$!
  for _ in $(seq 2000); do
    f=$(ls $XDG_STATE_HOME/airlock/*/up.pid 2>/dev/null | head -1 || true)
    [ -n "$f" ] && d=$(tr -dc 0-9 <"$f" || true); [ -n "$d" ] && break; sleep 0.01
  done
  [ "$1" = "$HTP" ] && { heaptrack -o "$HTO" -p "$d" >"$T/ht.out" 2>&1 & HTPID=$!; }
  wait $UPP || { cat "$T/up.err"; exit 1; }
  pid=$d
  echo "$2: $(echo "$(date +%s.%N) - $t0" | bc) s, daemon VmHWM $(hwm $pid), agent VmHWM $(hwm $AP), load $(cut -d' ' -f1 /proc/loadavg), CPU s daemon $(cpu $pid) agent (so far) $(cpu $AP)"
}
down() { "$AIRLOCK" down "$W" >/dev/null; [ -n "${HTPID:-}" ] && wait $HTPID || true; HTPID=; }
up 1 "initial sync"
for i in $(seq 0 199); do echo "edit $i" >>"$W/gen/m00/p000/$(ls "$W/gen/m00/p000" | sed -n "$((i % 20 + 1))p")"; done
for i in $(seq 0 19); do echo new >"$W/gen/m00/p000/new$i.c"; done
if [ -d "$W/gen/m01/p001x" ]; then mv "$W/gen/m01/p001x" "$W/gen/m01/p001"; else mv "$W/gen/m01/p001" "$W/gen/m01/p001x"; fi
"$AIRLOCK" exec -C "$W" -- true >/dev/null 2>&1 || true
"$AIRLOCK" sync-wait -C "$W" >/dev/null 2>&1 || sleep 2
echo "  after edits: daemon VmHWM $(hwm $pid), agent $(hwm $AP)"
down
up 2 "up after a session (rescan)"
down
up 3 "unchanged up"
down
W=
