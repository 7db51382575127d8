#!/usr/bin/env bash
# The relay socket of a real `airlock up` (doc/RELAY.md), driven by
# tests/harness/relay_drive.py over real connections, commands running in a real
# agent: write through the mount then cat, 1000 times over one connection
# (never stale); 64 commands from 8 clients at once (each its own output
# and exit status, all listed by status); another uid refused by the
# SO_PEERCRED check itself; malformed, unknown, oversized and incomplete
# requests answered with errors while that connection and the others carry
# on; a disconnect mid-command, then status and attach replaying what was
# missed; several GiB of `yes` into a slow reader while other commands keep
# a short round trip and memory stays bounded.
# usage: relay_e2e.sh AIRLOCK AIRLOCK_AGENT   (root + /dev/fuse, else skipped: exit 77)
# shellcheck source=tests/e2e/lib.sh
source "$(dirname "$0")/lib.sh"

AIRLOCK=$1
AGENT=$2
# Debian's python3 by path when there is one: a python3 earlier on PATH (a
# pyenv shim under /root) may be out of reach of the other uid below
PY=$(command -v /usr/bin/python3 || command -v python3 || true)
DRIVE="$PY $(cd "$(dirname "$0")/../harness" && pwd)/relay_drive.py"
if [ "$(id -u)" != 0 ] || [ ! -c /dev/fuse ]; then
	echo "skip - relay_e2e needs root and /dev/fuse (uid $(id -u), /dev/fuse $([ -c /dev/fuse ] && echo present || echo missing))"
	exit 77
fi
[ -n "$PY" ] || { echo "skip - relay_e2e needs python3 (tests/deps.sh installs it)"; exit 77; }
chmod 0711 "$T" # commands run as nobody in the guest: let them reach the workspace copy
export XDG_STATE_HOME=$T/state
export AIRLOCK_SOCKET=$T/relay.sock
TO="timeout -k 2"

# The flood: 512 MiB, 8000 times the memory bound it checks. The round-trip
# bound is not a speed figure (bench/relay.sh has those): a `true` queued
# behind the flood would wait out the reader's 0.5 s stalls, so a p50 under
# 400 ms says it was not, at any load. ASan keeps freed memory in a
# quarantine (256 MiB by default), which would read as growth in the flood's
# RSS check: keep it small for these processes.
FLOOD_P50=400 FLOOD=$((512 << 20))
if sanitized "$AIRLOCK"; then
	export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}quarantine_size_mb=8"
fi
make_pair # $T/hk, $T/gk, HPUB, GPUB; W=$T/work, G=$T/guest

start_bg agent "$AGENT" --listen "unix:$T/a.sock" --root "$G" --key "$T/gk" --allow "$HPUB" \
	--state "$T/agent.state" --fsync none
wait_line "$T/agent.out" '^ready' 10
AGENT_PID=$BG_PID
start_bg up "$AIRLOCK" up "$W" --guest "unix:$T/a.sock" --key "$T/hk" --guest-key "$GPUB"
UP_PID=$BG_PID
wait_line "$T/up.out" "^airlock: $W in sync with unix:$T/a.sock\$" 20
S=$T/relay.sock

t_barrier() { $TO 60 $DRIVE barrier "$S" "$W" 1000; }
check "write through the mount then cat in the guest, 1000 times over one connection: never stale" t_barrier

t_concurrent() { $TO 60 $DRIVE concurrent "$S" 8 8; }
check "64 concurrent commands from 8 clients: each gets its own output and exit status; status lists them" t_concurrent

t_malformed() { $TO 60 $DRIVE malformed "$S"; }
check "bad JSON, unknown op, missing fields, oversized line: errors, and every connection carries on" t_malformed

t_attach() { $TO 60 $DRIVE attach "$S"; }
check "disconnect mid-command: status lists it, attach replays what was missed, then the rest" t_attach

# Several GiB of `yes` into a client that reads in 256 MiB bursts and stalls
# 0.5 s between them; `true` every 50 ms from another client meanwhile.
t_flood() { $TO 240 $DRIVE flood "$S" "$FLOOD" "$UP_PID,$AGENT_PID" "$FLOOD_P50" $((64 << 10)); }
check "a $((FLOOD >> 20)) MiB flood from yes into a slow reader: true keeps a short round trip, daemon and agent memory bounded" t_flood

t_other_uid() {
	local out mode
	# the relay's own defences, one at a time: first the socket's mode 0600
	# (nobody may not even connect), then, with the socket opened up to
	# everyone, the SO_PEERCRED check must refuse on its own
	mode=$(stat -c %a "$S")
	[ "$mode" = 600 ] || { echo "socket mode $mode" >&2; return 1; }
	out=$($TO 10 setpriv --reuid=nobody --regid=nogroup --clear-groups $DRIVE refused "$S") || return 1
	[ "$out" = EACCES ] || { echo "with mode 0600: $out" >&2; return 1; }
	chmod 0666 "$S"
	out=$($TO 10 setpriv --reuid=nobody --regid=nogroup --clear-groups $DRIVE refused "$S")
	local rc=$?
	chmod 0600 "$S"
	[ "$rc" = 0 ] || return 1
	echo "# $out"
	case $out in "forbidden_peer: "*"uid 65534 refused"*) ;; *) return 1 ;; esac
	# the relay still serves its own user
	[ "$($TO 10 "$AIRLOCK" exec -C "$W" -- echo still serving </dev/null)" = "still serving" ]
}
check "a client of another uid is refused by the peer uid check (socket opened to all for the test)" t_other_uid

check "down ends airlock up cleanly" t_up_down
check "no sanitizer reports from airlock up or the agent" t_no_sanitizer_reports

finish
