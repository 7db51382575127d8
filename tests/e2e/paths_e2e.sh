#!/usr/bin/env bash
# Per-path failures never wedge the sync (doc/SYNC.md "Per-path failures"):
# the agent runs as an ordinary uid over a small tmpfs, and each sequence
# that used to refuse a whole batch (a read-only directory renamed, filled,
# removed by root; in-place edits of mode 000 / 0200 files; a file larger
# than the guest's free space; a directory the agent may not write) either
# applies the way rsync applies it or is reported and retried, while the
# other paths sync, nothing reconnects, a running command keeps running,
# and `exec` runs with one stderr line naming what is missing. After the
# fix everything converges exactly.
# usage: paths_e2e.sh AIRLOCK AIRLOCK_AGENT   (root + /dev/fuse + setpriv, else skipped: exit 77)
# shellcheck source=tests/e2e/lib.sh
source "$(dirname "$0")/lib.sh"

AIRLOCK=$1
AGENT=$2
AU=65533 # the agent's uid and gid: not root, owns the guest's copy
if [ "$(id -u)" != 0 ] || [ ! -c /dev/fuse ] || ! command -v setpriv >/dev/null; then
	echo "skip - paths_e2e needs root, /dev/fuse and setpriv (uid $(id -u))"
	exit 77
fi
export XDG_STATE_HOME=$T/state
TO="timeout -k 2"

make_pair # $T/hk, $T/gk, HPUB, GPUB; W=$T/work, G=$T/guest
chmod 755 "$T"
# the guest's copy: a 6 MiB tmpfs the agent owns (a full guest disk on demand)
mount -t tmpfs -o size=6m,uid=$AU,gid=$AU,mode=0755 airlock-paths-guest "$G"
trap 'umount -l "$G" 2>/dev/null || true; cleanup' EXIT
mkdir -p "$T/as"
cp "$T/gk" "$T/as/gk"
chown -R $AU:$AU "$T/as"
chmod 700 "$T/as"
chmod 600 "$T/as/gk"

start_bg agent setpriv --reuid=$AU --regid=$AU --clear-groups "$AGENT" --listen "unix:$T/as/a.sock" --root "$G" \
	--key "$T/as/gk" --allow "$HPUB" --state "$T/as/state" --fsync none
wait_line "$T/agent.out" '^ready' 10

mkdir -p "$W/ro" "$W/sub" "$W/locked"
printf 'in ro\n' >"$W/ro/f"
printf 'x\n' >"$W/sub/x"
head -c 1048576 /dev/urandom >"$W/big0"
head -c 1048576 /dev/urandom >"$W/big2"
start_bg up "$AIRLOCK" up "$W" --guest "unix:$T/as/a.sock" --key "$T/hk" --guest-key "$GPUB"
wait_line "$T/up.out" "^airlock: $W in sync with unix:$T/as/a.sock\$" 20

syncwait() { $TO 20 "$AIRLOCK" sync-wait -C "$W" --timeout "${1:-10}"; }
sjson() { "$AIRLOCK" status -C "$W" --json | grep -o "\"$1\":[^,}]*" | head -1 | cut -d: -f2-; }
not_in_guest() { "$AIRLOCK" status -C "$W" --json | grep -o '"not_in_guest":{"total":[0-9]*' | grep -o '[0-9]*$'; }
listing() {
	# a directory's size is its filesystem's (the guest's is a tmpfs)
	(cd "$1" && find . -mindepth 1 -printf '%P\t%y\t%m\t%s\t%l\n' | LC_ALL=C sort) |
		awk -F'\t' -v OFS='\t' '{ if ($2 == "d") $4 = "-"; print }' >"$2.meta"
	(cd "$1" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 -r sha256sum) >"$2.sums"
	cat "$2.meta" "$2.sums" >"$2"
}
same_tree() {
	listing "$W" "$T/h.lst"
	listing "$G" "$T/g.lst"
	if ! diff -u "$T/h.lst" "$T/g.lst" >"$T/diff.out"; then
		head -20 "$T/diff.out" >&2
		return 1
	fi
}
R0=$(sjson reconnects)

# a command that runs through everything below: never killed
start_bg long "$AIRLOCK" exec -C "$W" -- sh -c 'sleep 12; echo alive'
LONG=$BG_PID
sleep 0.5

# ---- a read-only directory, the way rsync applies it ----
t_ro_rename() {
	chmod 555 "$W/ro" && syncwait || return 1
	[ "$(stat -c %a "$G/ro")" = 555 ] || { echo "ro is $(stat -c %a "$G/ro") in the guest" >&2; return 1; }
	mv "$W/ro" "$W/ro2" && syncwait || { echo "sync-wait after mv ro ro2 failed" >&2; return 1; }
	[ ! -e "$G/ro" ] && [ "$(cat "$G/ro2/f")" = "in ro" ] && [ "$(stat -c %a "$G/ro2")" = 555 ]
}
check "chmod 555 ro; mv ro ro2: renamed, filled, emptied, mode kept" t_ro_rename
t_file_in_ro() {
	printf 'new\n' >"$W/ro2/new" && syncwait || return 1 # root on the host may write in it
	[ "$(cat "$G/ro2/new")" = new ] && [ "$(stat -c %a "$G/ro2")" = 555 ]
}
check "a file created inside a 0555 directory" t_file_in_ro
t_rm_ro() {
	rm -rf "$W/ro2" && syncwait && [ ! -e "$G/ro2" ]
}
check "rm -rf of a 0555 directory (as root)" t_rm_ro
t_mode_edit() { # in-place edits of large files the agent may not read
	chmod 000 "$W/big0" && chmod 200 "$W/big2" && syncwait || return 1
	printf 'EDITED' | dd of="$W/big0" bs=1 seek=500000 conv=notrunc status=none
	printf 'EDITED' | dd of="$W/big2" bs=1 seek=700000 conv=notrunc status=none
	syncwait || return 1
	cmp -s "$W/big0" "$G/big0" && cmp -s "$W/big2" "$G/big2" && [ "$(stat -c %a "$G/big0")" = 0 ] &&
		[ "$(stat -c %a "$G/big2")" = 200 ]
}
check "in-place edits of mode 000 and 0200 large files" t_mode_edit

# ---- a directory the agent may not write: reported, retried, other paths go on ----
t_locked() {
	chown root:root "$G/locked" # the agent can no longer change it
	printf 'f\n' >"$W/locked/f"
	printf 'other\n' >"$W/other"
	syncwait || { echo "sync-wait hung behind a refused path" >&2; return 1; }
	[ "$(cat "$G/other" 2>/dev/null)" = other ] || { echo "other path not synced" >&2; return 1; }
	[ "$(not_in_guest)" = 1 ] || { echo "status: $("$AIRLOCK" status -C "$W")" >&2; return 1; }
	"$AIRLOCK" status -C "$W" | grep -q 'locked/f: PUT: renaming into place: Permission denied' ||
		{ "$AIRLOCK" status -C "$W" >&2; return 1; }
	"$AIRLOCK" audit -C "$W" | grep -q '^not in guest locked/f' || { "$AIRLOCK" audit -C "$W" >&2; return 1; }
	# exec runs, with the one line
	$TO 20 "$AIRLOCK" exec -C "$W" -- cat other >"$T/e1.out" 2>"$T/e1.err" || return 1
	[ "$(cat "$T/e1.out")" = other ] && [ "$(grep -c 'not in the guest' "$T/e1.err")" = 1 ] &&
		grep -q 'locked/f (Permission denied)' "$T/e1.err" || { cat "$T/e1.err" >&2; return 1; }
	# the fix: the retry (backoff, no edit of the path) applies it
	chown $AU:$AU "$G/locked"
	for _ in $(seq 1 100); do
		[ -f "$G/locked/f" ] && [ "$(not_in_guest)" = 0 ] && break
		sleep 0.1
	done
	[ "$(cat "$G/locked/f" 2>/dev/null)" = f ] && [ "$(not_in_guest)" = 0 ] || { echo "not retried" >&2; return 1; }
	"$AIRLOCK" audit -C "$W" | grep -q '^not in guest' && return 1
	$TO 20 "$AIRLOCK" exec -C "$W" -- true 2>"$T/e2.err" && ! grep -q 'not in the guest' "$T/e2.err"
}
check "a path the agent may not write: reported (status, audit, exec), others sync, retried after the fix" t_locked

# ---- a full guest disk ----
t_disk_full() {
	head -c 8388608 /dev/urandom >"$W/huge" # more than the guest has
	printf 'small\n' >"$W/small"
	syncwait || { echo "sync-wait hung behind a full disk" >&2; return 1; }
	# the guest keeps what it had of huge (an earlier push may have sent it half written)
	[ "$(cat "$G/small" 2>/dev/null)" = small ] && ! cmp -s "$W/huge" "$G/huge" || return 1
	$TO 20 "$AIRLOCK" exec -C "$W" -- cat small >"$T/e3.out" 2>"$T/e3.err" || return 1
	grep -q 'huge (No space left on device)' "$T/e3.err" || { cat "$T/e3.err" >&2; return 1; }
	rm -f "$W/huge" && syncwait && [ "$(not_in_guest)" = 0 ] && [ ! -e "$G/huge" ]
}
check "a file larger than the guest's free space: the rest syncs, exec runs and says so" t_disk_full
t_filler() {
	# a command fills the guest's disk; host edits wait in no queue; rm -f filler frees it
	$TO 20 "$AIRLOCK" exec -C "$W" -- sh -c 'head -c 8388608 /dev/zero >filler 2>/dev/null; true' || return 1
	head -c 300000 /dev/urandom >"$W/edit"
	syncwait || return 1
	[ "$(not_in_guest)" = 1 ] || { echo "expected edit to be refused: $("$AIRLOCK" status -C "$W")" >&2; return 1; }
	$TO 20 "$AIRLOCK" exec -C "$W" -- rm -f filler 2>"$T/e4.err" || { cat "$T/e4.err" >&2; return 1; }
	grep -q 'edit (No space left on device)' "$T/e4.err" || { cat "$T/e4.err" >&2; return 1; }
	for _ in $(seq 1 100); do
		cmp -s "$W/edit" "$G/edit" && [ "$(not_in_guest)" = 0 ] && return 0
		sleep 0.1
	done
	echo "edit never applied after rm -f filler" >&2
	return 1
}
check "a command fills the guest disk: exec -- rm -f filler runs and the retry applies the edit" t_filler

t_barrier_fail() {
	chown root:root "$G/sub"
	printf 'y\n' >"$W/sub/y"
	syncwait || return 1
	# execution.barrier "fail" (a policy from outside the workspace applies as written)
	printf '{ "execution": { "barrier": "fail" } }\n' >"$T/strict.json"
	"$AIRLOCK" down "$W" >/dev/null 2>&1 || true
	start_bg up2 "$AIRLOCK" up "$W" --guest "unix:$T/as/a.sock" --key "$T/hk" --guest-key "$GPUB" \
		--policy "$T/strict.json"
	wait_line "$T/up2.out" "in sync with" 20 || return 1
	if $TO 20 "$AIRLOCK" exec -C "$W" -- echo ran >"$T/e5.out" 2>"$T/e5.err"; then
		echo "ran although barrier is fail" >&2
		return 1
	fi
	! grep -q ran "$T/e5.out" && grep -q 'sub/y (Permission denied)' "$T/e5.err" || { cat "$T/e5.err" >&2; return 1; }
	chown $AU:$AU "$G/sub"
	for _ in $(seq 1 100); do
		[ -f "$G/sub/y" ] && [ "$(not_in_guest)" = 0 ] && break
		sleep 0.1
	done
	$TO 20 "$AIRLOCK" exec -C "$W" -- echo ran >"$T/e6.out" 2>/dev/null && grep -q ran "$T/e6.out"
}

t_no_reconnect() {
	local r
	r=$(sjson reconnects)
	[ "$r" = "$R0" ] || { echo "reconnects went from $R0 to $r" >&2; return 1; }
}
check "no reconnect through all of it" t_no_reconnect
t_long_alive() {
	wait "$LONG" && grep -q '^alive$' "$T/long.out"
}
check "the command running throughout was not killed" t_long_alive
t_converged() { syncwait && same_tree; }
check "guest and host are the same tree" t_converged
check "execution.barrier \"fail\": the command fails at once naming the path, runs after the fix" t_barrier_fail

"$AIRLOCK" down "$W" >/dev/null 2>&1 || true
finish
