#!/usr/bin/env bash
# Faults never leave the workspace unusable: kill -9 of the daemon (the
# supervisor keeps the FUSE connection and restarts it on the same mount),
# of the agent, of both, SIGSTOP of either, a cut of the channel, each during
# a seeded random workload (fsworkload's creates, writes, truncates, renames,
# links, symlinks, chmods, deletes, plus git, tar x, cp -a and renames of
# read-only directories), then an exact comparison of guest and host minus
# withheld paths; a full host workspace and a full or read-only state
# directory; permissions across uids through up --allow-other; a name the guest
# filesystem refuses (strict casefold ext4, or without kernel support REFUSEFS:
# tests/harness/refusefs.c, a FUSE passthrough refusing names the same way).
# usage: faults_e2e.sh AIRLOCK AIRLOCK_AGENT FSWORKLOAD FORWARDER [REFUSEFS]   (root + /dev/fuse, else skipped: exit 77)
# The channel runs through FORWARDER (tests/harness/forwarder.c), restarted after each
# connection: a cut kills it (both ends see the connection end without FINAL, neither dies).
# Bounded by default (~2 min); at full length on demand:
#   FAULTS_ROUNDS=N  rounds per fault kind (default 2; e.g. 10 for a long run)
#   FAULTS_SEED=S    the first seed (printed; the same S repeats the same workloads)
#   FAULTS_KINDS     the faults of the mixed rounds, default "agent both stop-daemon stop-agent cut"
#   FAULTS_STOP_S    how long SIGSTOP holds a process (default 2 s)
#   FAULTS_OPS=N     fsworkload operations per round (default 3000)
# shellcheck source=tests/e2e/lib.sh
source "$(dirname "$0")/lib.sh"

AIRLOCK=$1
AGENT=$2
WORKLOAD=$3
FWD=$4
REFUSEFS=${5:-}
ROUNDS=${FAULTS_ROUNDS:-2}
KINDS=${FAULTS_KINDS:-agent both stop-daemon stop-agent cut}
STOP_S=${FAULTS_STOP_S:-2}
OPS=${FAULTS_OPS:-3000}
SEED=${FAULTS_SEED:-$RANDOM}
if [ "$(id -u)" != 0 ] || [ ! -c /dev/fuse ]; then
	echo "skip - faults_e2e needs root and /dev/fuse (uid $(id -u), /dev/fuse $([ -c /dev/fuse ] && echo present || echo missing))"
	exit 77
fi
export XDG_STATE_HOME=$T/state
TO="timeout -k 2"
echo "# seed $SEED, $ROUNDS rounds per fault (FAULTS_SEED=$SEED reproduces)"

make_pair # $T/hk, $T/gk, HPUB, GPUB; W=$T/work, G=$T/guest

AGENT_PID=
start_agent() {
	start_bg agent "$AGENT" --listen "unix:$T/a.sock" --root "$G" --key "$T/gk" --allow "$HPUB" \
		--state "$T/agent.state" --fsync none
	AGENT_PID=$BG_PID
	wait_line "$T/agent.out" '^ready' 10
}
# the channel's forwarder: one connection each, a new one after it ends
fwd_loop() {
	while [ -e "$T/fwd.on" ]; do
		"$FWD" "$T/f.sock" "$T/a.sock" none >>"$T/fwd.out" 2>&1 &
		echo $! >"$T/fwd.pid"
		wait $! 2>/dev/null || true
	done
}
touch "$T/fwd.on"
fwd_loop &
PIDS+=($!)
cut_channel() { kill -9 "$(cat "$T/fwd.pid")" 2>/dev/null || true; }
UP_PID=
start_up() {
	# an earlier daemon's log is kept (a later start empties up.err)
	[ -s "$T/up.err" ] && cat "$T/up.err" >>"$T/up-earlier.err"
	start_bg up "$AIRLOCK" up "$W" --guest "unix:$T/f.sock" --key "$T/hk" --guest-key "$GPUB" "$@"
	UP_PID=$BG_PID
	wait_line "$T/up.out" "^airlock: $W in sync with unix:$T/f.sock\$" 60
}
syncwait() { $TO 40 "$AIRLOCK" sync-wait -C "$W" --timeout "${1:-30}"; }
sjson() { "$AIRLOCK" status -C "$W" --json | grep -o "\"$1\":[^,}]*" | head -1 | cut -d: -f2-; }
daemon_pid() { sjson pid; }

# withheld paths (the audit's record), one a line: left out of the comparison
withheld() {
	"$AIRLOCK" audit -C "$W" --json 2>/dev/null | python3 -c '
import json, sys
try:
    d = json.load(sys.stdin)
except ValueError:
    sys.exit(0)
for w in (d.get("sync") or {}).get("withheld", []):
    print(w["path"])' >"$T/withheld.lst" || true
}
listing() {
	# MODE_MASK=1: permission bits only (the sync does not carry setuid, setgid, sticky)
	(cd "$1" && find . -mindepth 1 -printf '%P\t%y\t%m\t%s\t%l\n' | LC_ALL=C sort) |
		awk -F'\t' -v OFS='\t' -v m="${MODE_MASK:-0}" '{ if (m == 1) $3 = substr($3, length($3) - 2); if ($2 == "d") $4 = "-"; print }' >"$2.meta"
	(cd "$1" && find . -type f -printf '%P\0' | LC_ALL=C sort -z | xargs -0 -r sha256sum) |
		awk '{ h = $1; sub(/^[^ ]+  /, ""); print $0 "\t" h }' >"$2.sums"
	# minus the withheld paths and what is beneath them (.git/config: the guest's is generated)
	awk -F'\t' 'NR == FNR { w[$0] = 1; next }
		{ p = $1; while (p != "") { if (p in w) next; if (p !~ /\//) break; sub(/\/[^\/]*$/, "", p) } print }' \
		"$T/withheld.lst" "$2.meta" "$2.sums" >"$2"
}
same_tree() {
	withheld
	listing "$W" "$T/h.lst"
	listing "$G" "$T/g.lst"
	if ! diff -u "$T/h.lst" "$T/g.lst" >"$T/diff.out"; then
		head -20 "$T/diff.out" >&2
		return 1
	fi
}

# the state directory on a small tmpfs of its own, to fill it
mkdir -p "$T/state"
mount -t tmpfs -o size=4m airlock-faults-state "$T/state"
cleanup_state() {
	rm -f "$T/fwd.on"
	kill "$(cat "$T/fwd.pid" 2>/dev/null)" 2>/dev/null || true
	umount -l "$T/state" 2>/dev/null || true
	umount -l "$T/small" 2>/dev/null || true
	umount -l "$T/cfmnt" 2>/dev/null || true
}
trap 'cleanup_state; cleanup' EXIT

# relay sockets in a directory of this test alone: another up on the machine sweeps the shared one
export XDG_RUNTIME_DIR=$T/run
mkdir -p "$XDG_RUNTIME_DIR" && chmod 700 "$XDG_RUNTIME_DIR"
start_agent
mkdir -p "$W/sub"
printf 'before\n' >"$W/sub/f"
start_up
RELAY_DIR=$(dirname "$("$AIRLOCK" status -C "$W" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["socket"])')")

# ---- kill -9 of the daemon: DIR stays the workspace ----
t_daemon_crash() {
	local pid new t0 t1 ms i
	pid=$(daemon_pid)
	[ -n "$pid" ] || { echo "no daemon pid" >&2; return 1; }
	# a shell whose cwd is DIR, and an editor writing through it
	(cd "$W" && sleep 1 && ls >"$T/cwd.ls" 2>&1 && echo ok >"$T/cwd.rc" || echo fail >"$T/cwd.rc") &
	for ((i = 0; i < 200; i++)); do printf 'line %d\n' "$i" >>"$W/edited"; done
	t0=$(date +%s%N)
	kill -9 "$pid"
	# the first access after the crash waits for the restarted daemon
	if ! printf 'after\n' >>"$W/edited" || ! grep -q '^line 199$' "$W/edited"; then
		echo "DIR unusable after the crash: $(ls "$W" 2>&1 | head -1)" >&2
		return 1
	fi
	t1=$(date +%s%N)
	ms=$(((t1 - t0) / 1000000))
	echo "# DIR usable again ${ms} ms after kill -9 of the daemon"
	wait_line "$T/cwd.rc" . 5 || return 1
	[ "$(cat "$T/cwd.rc")" = ok ] || { echo "cwd shell: $(cat "$T/cwd.ls")" >&2; return 1; }
	grep -qx 'sub' "$T/cwd.ls" || { echo "cwd ls: $(cat "$T/cwd.ls")" >&2; return 1; }
	[ "$(cat "$W/sub/f")" = before ] || return 1
	[ "$(wc -l <"$W/edited")" = 201 ] || { echo "edited has $(wc -l <"$W/edited") lines" >&2; return 1; }
	for ((i = 0; i < 500; i++)); do
		new=$(daemon_pid 2>/dev/null || true)
		[ -n "$new" ] && [ "$new" != "$pid" ] && break
		sleep 0.01
	done
	[ -n "$new" ] && [ "$new" != "$pid" ] || { echo "no new daemon" >&2; return 1; }
	echo new >"$W/sub/g"
	syncwait 30 || return 1
	[ "$(sjson restarts)" = 1 ] || { echo "status restarts: $(sjson restarts)" >&2; return 1; }
	"$AIRLOCK" status -C "$W" | grep -q 'killed by signal 9' || { "$AIRLOCK" status -C "$W" >&2; return 1; }
	same_tree
}
check "kill -9 of the daemon: DIR keeps working (cwd shell, writes), the restarted daemon converges" t_daemon_crash

# ---- every node id the kernel holds survives the crash ----
# The kernel keeps each name it looked up (and each file it created) under
# the node id the daemon gave it, and a write to a file opened through that
# cached name carries that id, with no lookup. An id the dead daemon gave
# the kernel but the supervisor never heard of is answered ESTALE by the
# next daemon: such a write failed ("Stale file handle") when the daemon was
# killed right after the file's create (seen in t_daemon_crash). Files are
# created in a tight loop while the daemon is killed; then each is appended
# to through its cached name.
t_ids_across_crash() {
	local pid
	mkdir -p "$W/ids"
	python3 - "$W/ids" >"$T/ids.out" 2>&1 <<'PY' &
import os, sys
d = sys.argv[1]
for i in range(4000):
    with open(os.path.join(d, "f%d" % i), "w") as f:
        f.write("c%d\n" % i)
PY
	local cr=$!
	sleep 0.$((RANDOM % 3 + 2))
	pid=$(daemon_pid)
	kill -9 "$pid"
	wait "$cr" || { echo "the creating loop failed across the crash: $(tail -2 "$T/ids.out")" >&2; return 1; }
	python3 - "$W/ids" <<'PY' || return 1
import os, sys
d = sys.argv[1]
bad = []
for i in range(4000):
    try:
        with open(os.path.join(d, "f%d" % i), "a") as f:
            f.write("a%d\n" % i)
    except OSError as e:
        bad.append("f%d: %s" % (i, e.strerror))
if bad:
    print("%d appends failed after the crash: %s" % (len(bad), "; ".join(bad[:5])), file=sys.stderr)
    sys.exit(1)
PY
	syncwait 30 && [ "$(cat "$G/ids/f3999")" = "$(printf 'c3999\na3999')" ] && same_tree || return 1
	rm -rf "$W/ids" # (the rounds below compare the whole tree)
}
check "files created while the daemon is killed: each one written again through its cached name" t_ids_across_crash

# ---- seeded workloads with kill -9 of the daemon in the middle ----
t_crash_workload() {
	local r s pid
	for ((r = 0; r < ROUNDS; r++)); do
		s=$((SEED + r))
		"$WORKLOAD" "$W" "$s" 3000 >/dev/null &
		local wl=$!
		sleep 0.$((RANDOM % 5 + 1))
		pid=$(daemon_pid)
		kill -9 "$pid"
		wait "$wl" || { echo "workload seed $s failed after the crash" >&2; return 1; }
		syncwait 60 || { echo "seed $s: no convergence" >&2; return 1; }
		same_tree || { echo "seed $s: trees differ" >&2; return 1; }
	done
}
check "kill -9 of the daemon during a seeded workload ($ROUNDS rounds): guest equals host" t_crash_workload

# ---- a file held open and a shell in a subdirectory across the crash ----
t_held_across_crash() {
	local pid
	mkdir -p "$W/deep/er"
	exec 7>>"$W/deep/held"
	printf 'one\n' >&7
	(cd "$W/deep/er" && sleep 1 && ls .. >"$T/sub.ls" 2>&1 && echo ok >"$T/sub.rc" || echo fail >"$T/sub.rc") &
	syncwait 30 || return 1
	pid=$(daemon_pid)
	kill -9 "$pid"
	printf 'two\n' >&7 || { exec 7>&-; echo "write to the held file failed" >&2; return 1; }
	exec 7>&-
	wait_line "$T/sub.rc" . 5 || return 1
	[ "$(cat "$T/sub.rc")" = ok ] || { echo "subdir shell: $(cat "$T/sub.ls")" >&2; return 1; }
	[ "$(cat "$W/deep/held")" = "$(printf 'one\ntwo')" ] || { echo "held: $(cat "$W/deep/held")" >&2; return 1; }
	syncwait 30 && same_tree
}
check "a file held open and a shell in a subdirectory keep working across kill -9 of the daemon" t_held_across_crash

# ---- sync-wait after a restart: the new daemon's journal is empty, its reconcile decides ----
t_syncwait_restart() {
	local pid new i rc=0
	syncwait 30 || return 1
	kill -9 "$AGENT_PID"
	wait "$AGENT_PID" 2>/dev/null || true
	echo "while the guest is away" >"$W/sub/away"
	pid=$(daemon_pid)
	kill -9 "$pid"
	for ((i = 0; i < 500; i++)); do
		new=$(daemon_pid 2>/dev/null || true)
		[ -n "$new" ] && [ "$new" != "$pid" ] && break
		sleep 0.01
	done
	# not in sync: the guest lacks sub/away, though the new daemon journaled nothing
	$TO 10 "$AIRLOCK" sync-wait -C "$W" --timeout 2 2>"$T/sw.err" || rc=$?
	[ "$rc" = 1 ] || { echo "sync-wait exited $rc with the guest away after a restart" >&2; start_agent; return 1; }
	grep -q 'not in sync' "$T/sw.err" || { cat "$T/sw.err" >&2; start_agent; return 1; }
	start_agent
	syncwait 30 && [ "$(cat "$G/sub/away")" = "while the guest is away" ] && same_tree
}
check "sync-wait after a daemon restart with the guest away: not in sync until it reconciled" t_syncwait_restart

# ---- the confirmed state's exact mark never outlives the state it describes ----
# A lost connection saves the confirmed state marked exact; the first push
# the guest confirms after it marks it lagging. A reconnect attempt that
# failed in its handshake (the agent still down) made the daemon forget
# that the disk said exact, so the mark stayed for the whole session and
# the next daemon (after a kill -9) took that old state for the guest's:
# a file the host created and deleted since, whose delete the guest never
# got, was kept there as a guest change (seen in faults_e2e's "both").
t_exact_mark() {
	local n0 pid i meta sd=("$T"/state/airlock/*/)
	syncwait 30 || return 1
	meta=${sd[0]}confirmed.manifest.meta
	n0=$(sjson reconnects)
	kill -9 "$AGENT_PID"
	wait "$AGENT_PID" 2>/dev/null || true
	# the loss, then at least one attempt refused in its handshake (the forwarder answers, nobody behind it)
	for ((i = 0; i < 100; i++)); do
		[ "$(sjson reconnects)" -ge $((n0 + 2)) ] && break
		sleep 0.1
	done
	[ "$(sjson reconnects)" -ge $((n0 + 2)) ] || { echo "no failed reconnect: $(sjson reconnects)" >&2; start_agent; return 1; }
	start_agent
	syncwait 30 || return 1
	echo probe >"$W/sub/exact-probe"
	syncwait 30 && [ -f "$G/sub/exact-probe" ] || { echo "probe not in the guest" >&2; return 1; }
	grep -q ' lagging ' "$meta" || { echo "after a confirmed push: $(cat "$meta")" >&2; return 1; }
	# its delete never reaches the guest: the agent is stopped, then both die
	kill -STOP "$AGENT_PID"
	rm "$W/sub/exact-probe"
	sleep 0.3
	pid=$(daemon_pid)
	kill -9 "$pid"
	kill -9 "$AGENT_PID"
	wait "$AGENT_PID" 2>/dev/null || true
	start_agent
	syncwait 30 || return 1
	[ ! -e "$G/sub/exact-probe" ] || { echo "the guest keeps the deleted file; changes: $("$AIRLOCK" changes -C "$W" 2>&1 | head -3)" >&2; return 1; }
	same_tree
}
check "a reconnect refused in its handshake: the confirmed state is still marked lagging once a push is confirmed" t_exact_mark

# the apply's temporaries have a fixed-length name (MANIFEST_RESERVED_PREFIX
# + 16 hex digits), never the target's name plus a suffix: a name of
# NAME_MAX bytes and a directory of one apply like any other
t_name_max() {
	local n255
	n255=$(printf 'n%.0s' $(seq 1 255))
	mkdir -p "$W/sub/$n255" && printf 'long\n' >"$W/sub/$n255/$n255" && syncwait 30 &&
		[ "$(cat "$G/sub/$n255/$n255")" = long ] && [ "$(sjson not_in_guest | grep -o '[0-9]*' | head -1)" = 0 ] || return 1
	rm -r "$W/sub/$n255" && syncwait 30 && [ ! -e "$G/sub/$n255" ]
}
check "names of NAME_MAX (255) bytes, a file in a directory: applied, no failure" t_name_max

# ---- the agent, both, SIGSTOP of either, each during a seeded workload ----
# The rest of the issue's workload, seeded like fsworkload, in x/ (which
# fsworkload never names): git commits, branches and checkouts, tar x,
# cp -a, read-only directories made, filled, renamed and removed.
tar_src() {
	mkdir -p "$T/tsrc/d/e" "$T/tsrc/ro"
	head -c 70000 /dev/urandom >"$T/tsrc/d/big"
	printf 'a\n' >"$T/tsrc/d/e/a" && chmod 600 "$T/tsrc/d/e/a"
	printf 'x\n' >"$T/tsrc/ro/x" && chmod 555 "$T/tsrc/ro"
	ln -sf e/a "$T/tsrc/d/link" && ln -f "$T/tsrc/d/big" "$T/tsrc/d/hard"
	tar cf "$T/src.tar" -C "$T/tsrc" .
}
tar_src
xworkload() { # xworkload SEED
	local i d g="git -c user.name=t -c user.email=t@t -c init.defaultBranch=main"
	RANDOM=$1
	mkdir -p "$W/x"
	for ((i = 0; i < 8; i++)); do
		d=$W/x/n$((RANDOM % 3))
		case $((i == 0 ? 0 : RANDOM % 6)) in
		0 | 1) # git: a commit, sometimes a branch and a checkout back
			mkdir -p "$W/x/repo" && cd "$W/x/repo" || return 1
			[ -d .git ] || $g init -q
			echo "$RANDOM" >>"f$((RANDOM % 3))"
			# (a commit may find nothing to commit: logged, not fatal; the trees are compared)
			$g add -A && { $g commit -qm "c$i" || echo "commit c$i: nothing to commit"; }
			if ((RANDOM % 2)); then
				$g checkout -q -B "b$i" && echo "$i" >"br" && $g add br && $g commit -qm "b$i" && $g checkout -q main
			fi
			cd / || return 1
			;;
		2) mkdir -p "$d" && tar xf "$T/src.tar" -C "$d" ;;
		3) [ -d "$W/x/n0" ] && { rm -rf "$W/x/cp" && cp -a "$W/x/n0" "$W/x/cp"; } ;;
		4) # a read-only directory, filled, renamed
			mkdir -p "$d/ro$1_$i/in" && echo "$i" >"$d/ro$1_$i/in/f" && chmod 555 "$d/ro$1_$i/in" "$d/ro$1_$i"
			mv "$d/ro$1_$i" "$d/rn$1_$i"
			;;
		5) [ -d "$d" ] && { chmod -R u+w "$d" && rm -rf "$d"; } ;;
		esac || true
	done
}

fault_round() { # fault_round KIND SEED
	local kind=$1 s=$2 wl xl pid
	"$WORKLOAD" "$W" "$s" "$OPS" >/dev/null &
	wl=$!
	xworkload "$s" >"$T/xwl.out" 2>&1 &
	xl=$!
	sleep 0.$((RANDOM % 4 + 1))
	pid=$(daemon_pid)
	case $kind in
	agent) kill -9 "$AGENT_PID"; wait "$AGENT_PID" 2>/dev/null || true; start_agent ;;
	both) kill -9 "$AGENT_PID" "$pid"; wait "$AGENT_PID" 2>/dev/null || true; start_agent ;;
	stop-daemon) kill -STOP "$pid"; sleep "$STOP_S"; kill -CONT "$pid" ;;
	stop-agent) kill -STOP "$AGENT_PID"; sleep "$STOP_S"; kill -CONT "$AGENT_PID" ;;
	cut) cut_channel ;;
	*) echo "unknown fault kind $kind" >&2; return 1 ;;
	esac
	wait "$wl" || { echo "$kind seed $s: the workload failed" >&2; return 1; }
	wait "$xl" || { echo "$kind seed $s: the git/tar/cp workload failed: $(tail -3 "$T/xwl.out")" >&2; return 1; }
	syncwait 60 || { echo "$kind seed $s: no convergence" >&2; tail -8 "$T/up.err" >&2; return 1; }
	same_tree || {
		echo "$kind seed $s: trees differ" >&2
		tail -8 "$T/up.err" >&2
		"$AIRLOCK" changes -C "$W" 2>&1 | head -5 >&2
		# a late arrival (sync-wait returned early) or a lost change?
		sleep 3
		syncwait 30 && same_tree 2>/dev/null && echo "(the same after 3 s more: converged late)" >&2
		return 1
	}
}
t_faults() {
	local kind r
	for kind in $KINDS; do
		for ((r = 0; r < ROUNDS; r++)); do
			fault_round "$kind" $((SEED + 100 + r)) || return 1
		done
	done
	[ -f "$G/x/repo/.git/HEAD" ] && [ -f "$G/x/repo/.git/config" ] || { echo "no git repository in the guest" >&2; return 1; }
}
check "$KINDS during seeded workloads ($ROUNDS rounds each, with git, tar x, cp -a, read-only dirs): guest equals host minus withheld" t_faults

# ---- a full state directory is an error, not silence ----
# status recovers once the directory is writable again (failed files are written again)
status_recovers() {
	local i
	for ((i = 0; i < 50; i++)); do
		"$AIRLOCK" status -C "$W" >/dev/null 2>&1 && return 0
		sleep 0.1
	done
	"$AIRLOCK" status -C "$W" >&2
	return 1
}
t_state_full() {
	local out rc=0 n
	syncwait 30 || return 1
	n=$(grep -c 'cannot write' "$T/up.err" || true)
	dd if=/dev/zero of="$T/state/filler" bs=64k 2>/dev/null || true
	echo more >>"$W/sub/f"
	echo 'TOKEN=1' >"$W/sub/.env" # withheld: the audit record is written again
	sleep 0.5
	out=$("$AIRLOCK" status -C "$W" 2>&1) || rc=$?
	rm -f "$T/state/filler"
	[ "$rc" = 1 ] || { echo "status exited $rc with a full state directory: $out" >&2; return 1; }
	echo "$out" | grep -q 'cannot write .*No space left on device' || { echo "$out" >&2; return 1; }
	tail -n +$((n + 1)) "$T/up.err" >"$T/up.new"
	for f in status.json withheld.json; do
		grep -q "cannot write .*/$f: No space left on device" "$T/up.new" || { echo "no error for $f:" >&2; cat "$T/up.new" >&2; return 1; }
	done
	status_recovers || return 1
	grep -q 'withheld.json is written again' "$T/up.err" || { tail -5 "$T/up.err" >&2; return 1; }
	syncwait 30 && "$AIRLOCK" audit -C "$W" | grep -q 'sub/.env'
}
check "a full state directory: status, the daemon's stderr name each file (status, audit record); freed, all is well again" t_state_full
t_audit_rename() {
	local out
	mv "$W/sub" "$W/sub2" && syncwait 30 || return 1
	out=$("$AIRLOCK" audit -C "$W") || return 1
	echo "$out" | grep -q ' sub2/\.env ' && ! echo "$out" | grep -q ' sub/\.env ' || { echo "$out" >&2; return 1; }
	[ ! -e "$G/sub2/.env" ] && [ -f "$G/sub2/f" ]
}
check "audit after a directory rename names the withheld file at its new path only" t_audit_rename
t_state_ro() {
	local out rc=0
	# a read-only bind over it (the daemon's open log keeps the tmpfs itself from going read-only)
	mount --bind "$T/state/airlock" "$T/state/airlock" && mount -o remount,bind,ro "$T/state/airlock" || return 1
	echo ro >>"$W/sub2/f"
	sleep 0.3
	out=$("$AIRLOCK" status -C "$W" 2>&1) || rc=$?
	umount "$T/state/airlock"
	[ "$rc" = 1 ] || { echo "status exited $rc with a read-only state directory: $out" >&2; return 1; }
	echo "$out" | grep -q 'Read-only file system' || { echo "$out" >&2; return 1; }
	status_recovers && syncwait 30
}
check "a read-only state directory: status fails naming it; writable again, all is well" t_state_ro

t_down_after_crash() {
	kill -9 "$(daemon_pid)"
	$TO 15 "$AIRLOCK" down "$W" || return 1
	local rc=0
	wait "$UP_PID" || rc=$?
	[ "$rc" = 0 ] || { echo "up exited $rc" >&2; tail -5 "$T/up.err" >&2; return 1; }
	! mountpoint -q "$W"
}
check "down right after a crash stops the restarted daemon, first time" t_down_after_crash

# ---- permissions across uids through up --allow-other ----
as_nobody() { setpriv --reuid 65534 --regid 65534 --clear-groups -- "$@"; }
t_stale_sockets() {
	local rc=0 stale=$RELAY_DIR/faults-gone-$$.sock
	# a relay socket left by a daemon that died with its supervisor (kill -9 of both)
	python3 -c 'import socket,sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])' "$stale" || return 1
	sleep 2.2 # younger ones may be bound, not yet listening: left alone
	start_up || rc=1
	[ ! -e "$stale" ] || { echo "the stale socket $stale is still there" >&2; rc=1; }
	grep -q 'removed [0-9]* stale relay socket' "$T/up.err" || { head -5 "$T/up.err" >&2; rc=1; }
	[ -S "$("$AIRLOCK" status -C "$W" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["socket"])')" ] || rc=1
	$TO 15 "$AIRLOCK" down "$W" && wait "$UP_PID" || rc=1
	return $rc
}
check "stale relay sockets of daemons that are gone are removed by the next up" t_stale_sockets
t_other_uid_refused() {
	local out
	start_up || return 1
	chmod 711 "$T" && chmod 755 "$W"
	out=$(as_nobody stat "$W" 2>&1) && { echo "another uid reached DIR without --allow-other" >&2; return 1; }
	echo "$out" | grep -q 'Permission denied' || { echo "$out" >&2; return 1; }
	$TO 15 "$AIRLOCK" down "$W" && wait "$UP_PID"
}
check "without --allow-other another uid gets EACCES on DIR" t_other_uid_refused
t_allow_other() {
	chmod 711 "$T" && chmod 755 "$W" # nobody must reach W (the workloads chmod it)
	start_up --allow-other || return 1
	mkdir -p "$W/perm/sticky" "$W/perm/sgid"
	chmod 1777 "$W/perm/sticky"
	echo root >"$W/perm/sticky/rootfile"
	echo secret >"$W/perm/private" && chmod 600 "$W/perm/private"
	echo pub >"$W/perm/public" && chmod 644 "$W/perm/public"
	chgrp 100 "$W/perm/sgid" && chmod 2777 "$W/perm/sgid"
	[ "$(as_nobody cat "$W/perm/public")" = pub ] || { echo "nobody cannot read a 0644 file" >&2; return 1; }
	as_nobody cat "$W/perm/private" 2>"$T/eacces" && { echo "nobody read a 0600 file" >&2; return 1; }
	grep -q 'Permission denied' "$T/eacces" || { echo "reading a 0600 file: $(cat "$T/eacces")" >&2; return 1; }
	as_nobody sh -c "echo x >>'$W/perm/public'" 2>/dev/null && { echo "nobody wrote root's 0644 file" >&2; return 1; }
	as_nobody rm -f "$W/perm/sticky/rootfile" 2>/dev/null && { echo "sticky bit ignored" >&2; return 1; }
	as_nobody sh -c "echo mine >'$W/perm/sticky/nobodyfile'" || return 1
	[ "$(stat -c %u "$W/perm/sticky/nobodyfile")" = 65534 ] || { echo "owner $(stat -c %u "$W/perm/sticky/nobodyfile")" >&2; return 1; }
	as_nobody chown 0 "$W/perm/sticky/nobodyfile" 2>"$T/eperm" && { echo "nobody gave a file to root" >&2; return 1; }
	grep -q 'Operation not permitted' "$T/eperm" || { echo "chown as nobody: $(cat "$T/eperm")" >&2; return 1; }
	# root gives a file away: its new owner may write it, and chmod it
	chown 65534 "$W/perm/public" || return 1
	as_nobody sh -c "echo more >>'$W/perm/public'" && as_nobody chmod 600 "$W/perm/public" || return 1
	[ "$(stat -c %u:%a "$W/perm/public")" = 65534:600 ] || { echo "public: $(stat -c %u:%a "$W/perm/public")" >&2; return 1; }
	as_nobody mkdir "$W/perm/sgid/d" || return 1
	[ "$(stat -c %g "$W/perm/sgid/d")" = 100 ] && [ -g "$W/perm/sgid/d" ] || { echo "setgid not inherited" >&2; return 1; }
	as_nobody chmod 700 "$W/perm/sticky/nobodyfile" || return 1
	syncwait 30 && MODE_MASK=1 same_tree
}
check "--allow-other: modes, owners, sticky and setgid directories hold for another uid; the guest converges" t_allow_other
$TO 15 "$AIRLOCK" down "$W" >/dev/null 2>&1 || true

# ---- a full host workspace: the editor's write gets ENOSPC through the mount, nothing is lost ----
t_host_full() {
	local small=$T/small g2=$T/guest2 out rc=0 apid upid
	mkdir -p "$small" "$g2"
	mount -t tmpfs -o size=1m airlock-faults-small "$small" || return 1
	printf 'kept\n' >"$small/keep"
	start_bg agent2 "$AGENT" --listen "unix:$T/a2.sock" --root "$g2" --key "$T/gk" --allow "$HPUB" \
		--state "$T/agent2.state" --fsync none
	apid=$BG_PID
	wait_line "$T/agent2.out" '^ready' 10 || return 1
	start_bg up2 "$AIRLOCK" up "$small" --guest "unix:$T/a2.sock" --key "$T/hk" --guest-key "$GPUB"
	upid=$BG_PID
	wait_line "$T/up2.out" "in sync with unix:$T/a2.sock\$" 20 || return 1
	out=$(dd if=/dev/urandom of="$small/big" bs=64k count=64 2>&1) || rc=$?
	[ "$rc" != 0 ] && echo "$out" | grep -q 'No space left on device' || { echo "dd: rc $rc: $out" >&2; return 1; }
	[ "$(cat "$small/keep")" = kept ] || return 1
	$TO 40 "$AIRLOCK" sync-wait -C "$small" --timeout 30 || return 1
	W=$small G=$g2 same_tree || { echo "full: guest differs" >&2; return 1; }
	rm -f "$small/big"
	# the space comes back once the kernel forgets the unlinked inode (the mount then closes its descriptor)
	local i
	for ((i = 0; i < 50; i++)); do
		printf 'after\n' 2>/dev/null >"$small/after" && break
		sleep 0.1
	done
	[ "$i" -lt 50 ] || { echo "no space 5 s after rm of the big file: $(df -h "$small" | tail -1)" >&2; return 1; }
	[ "$i" = 0 ] || echo "# space back ${i}00 ms after the rm"
	$TO 40 "$AIRLOCK" sync-wait -C "$small" --timeout 30 && [ "$(cat "$g2/after")" = after ] && [ ! -e "$g2/big" ] &&
		W=$small G=$g2 same_tree || return 1
	$TO 15 "$AIRLOCK" down "$small" && wait "$upid"
	kill "$apid" 2>/dev/null
	! mountpoint -q "$small/keep" && [ "$(cat "$small/after")" = after ]
}
check "a full host workspace: ENOSPC through the mount, nothing lost, the guest equals it; space back, sync goes on" t_host_full

# ---- a name the guest's filesystem refuses: its copy on a strict casefold ext4 ----
# (invalid UTF-8 gives EINVAL there) reported, retried, never blocking the
# other paths, no reconnect, a running command kept; renamed on the host, it converges.
# Without kernel casefold the same on refusefs (a FUSE passthrough refusing such names).
# refusing_fs_mount ext4|refusefs MNT: MNT/root refuses names that are not UTF-8 (EINVAL)
REFUSEFS_PID=
refusing_fs_mount() {
	local kind=$1 mnt=$2 i
	mkdir -p "$mnt"
	if [ "$kind" = ext4 ]; then
		truncate -s 16m "$T/cf.img" &&
			mkfs.ext4 -q -O casefold -E encoding=utf8,encoding_flags=strict "$T/cf.img" 2>"$T/mkfs.err" &&
			mount -o loop "$T/cf.img" "$mnt" 2>"$T/mkfs.err" || { cat "$T/mkfs.err" >&2; return 1; }
		mkdir "$mnt/root" && chattr +F "$mnt/root" || { refusing_fs_umount "$mnt"; return 1; }
		return 0
	fi
	mkdir -p "$T/refuse.back"
	# allow_other: the agent runs commands as nobody (as on ext4, every uid reaches it)
	start_bg refusefs "$REFUSEFS" "$T/refuse.back" "$mnt" -f -o allow_other
	REFUSEFS_PID=$BG_PID
	for ((i = 0; i < 100; i++)); do
		mountpoint -q "$mnt" && break
		kill -0 "$REFUSEFS_PID" 2>/dev/null || break
		sleep 0.05
	done
	mountpoint -q "$mnt" || { echo "refusefs did not mount: $(cat "$T/refusefs.err")" >&2; return 1; }
	mkdir "$mnt/root" || { refusing_fs_umount "$mnt"; return 1; }
}
refusing_fs_umount() {
	umount "$1" 2>/dev/null || umount -l "$1"
	[ -z "$REFUSEFS_PID" ] || wait "$REFUSEFS_PID" 2>/dev/null || true
	REFUSEFS_PID=
}
t_refused_name() { # t_refused_name ext4|refusefs
	local mnt=$T/cfmnt w3=$T/w3 apid upid lpid r0 i rc=0 bad=$'bad-\xff.txt'
	mkdir -p "$w3"
	chmod 711 "$T" # the agent's commands run as nobody: they must reach the guest's root
	refusing_fs_mount "$1" "$mnt" || return 1
	printf 'ok\n' >"$w3/ok.txt"
	start_bg agent3 "$AGENT" --listen "unix:$T/a3.sock" --root "$mnt/root" --key "$T/gk" --allow "$HPUB" \
		--state "$T/agent3.state" --fsync none
	apid=$BG_PID
	wait_line "$T/agent3.out" '^ready' 10 || rc=1
	[ $rc = 0 ] && start_bg up3 "$AIRLOCK" up "$w3" --guest "unix:$T/a3.sock" --key "$T/hk" --guest-key "$GPUB" &&
		upid=$BG_PID && wait_line "$T/up3.out" "in sync with unix:$T/a3.sock\$" 20 || rc=1
	r0=$("$AIRLOCK" status -C "$w3" --json | grep -o '"reconnects":[0-9]*' | cut -d: -f2)
	start_bg long3 "$AIRLOCK" exec -C "$w3" -- sh -c 'sleep 6; echo alive'
	lpid=$BG_PID
	printf 'refused\n' >"$w3/$bad"
	printf 'other\n' >"$w3/other.txt"
	[ $rc = 0 ] && $TO 20 "$AIRLOCK" sync-wait -C "$w3" --timeout 15 || { echo "sync-wait hung behind a refused name" >&2; rc=1; }
	[ $rc = 0 ] && [ "$(cat "$mnt/root/other.txt" 2>/dev/null)" = other ] || { echo "other.txt not synced" >&2; rc=1; }
	[ $rc = 0 ] && "$AIRLOCK" status -C "$w3" | grep -q 'Invalid argument' || { "$AIRLOCK" status -C "$w3" >&2; rc=1; }
	[ $rc = 0 ] && "$AIRLOCK" audit -C "$w3" | grep -q '^not in guest bad-' || { "$AIRLOCK" audit -C "$w3" >&2; rc=1; }
	[ $rc = 0 ] && $TO 20 "$AIRLOCK" exec -C "$w3" -- cat other.txt >"$T/e3.out" 2>"$T/e3.err" &&
		[ "$(cat "$T/e3.out")" = other ] && grep -q 'not in the guest' "$T/e3.err" && grep -q '(Invalid argument)' "$T/e3.err" ||
		{ [ $rc = 0 ] && cat "$T/e3.err" >&2; rc=1; }
	# retried with backoff meanwhile, on the same connection
	for ((i = 0; i < 40 && rc == 0; i++)); do
		"$AIRLOCK" status -C "$w3" --json | grep -q '"retries":[1-9]' && break
		sleep 0.1
	done
	[ $rc = 0 ] && [ "$i" -lt 40 ] || { echo "no retry" >&2; rc=1; }
	mv "$w3/$bad" "$w3/good.txt"
	[ $rc = 0 ] && $TO 20 "$AIRLOCK" sync-wait -C "$w3" --timeout 15 && [ "$(cat "$mnt/root/good.txt")" = refused ] ||
		{ echo "not converged after the rename" >&2; rc=1; }
	[ "$("$AIRLOCK" status -C "$w3" --json | grep -o '"reconnects":[0-9]*' | cut -d: -f2)" = "$r0" ] || { echo "reconnected" >&2; rc=1; }
	wait "$lpid" && grep -q alive "$T/long3.out" || { echo "the running command was killed" >&2; rc=1; }
	[ $rc = 0 ] && W=$w3 G=$mnt/root same_tree || rc=1
	$TO 15 "$AIRLOCK" down "$w3" >/dev/null 2>&1 && wait "$upid" 2>/dev/null
	kill "$apid" 2>/dev/null && wait "$apid" 2>/dev/null
	refusing_fs_umount "$mnt"
	return $rc
}
# casefold needs the kernel's CONFIG_UNICODE (/sys/fs/ext4/features/casefold),
# e2fsprogs and loop devices; else refusefs (root and /dev/fuse are this script's own needs)
REFUSED_WHAT="reported, retried, the rest syncs, no reconnect, renamed it converges"
if [ -e /sys/fs/ext4/features/casefold ] && command -v mkfs.ext4 >/dev/null && command -v chattr >/dev/null &&
	losetup -f >/dev/null 2>&1; then
	check "a name the guest filesystem refuses (invalid UTF-8 on strict casefold ext4): $REFUSED_WHAT" t_refused_name ext4
elif [ -n "$REFUSEFS" ] && [ -x "$REFUSEFS" ]; then
	check "a name the guest filesystem refuses (invalid UTF-8 on refusefs, FUSE: no ext4 casefold here): $REFUSED_WHAT" \
		t_refused_name refusefs
else
	skip "a name the guest filesystem refuses: no ext4 casefold (CONFIG_UNICODE, e2fsprogs, a loop device) and no REFUSEFS"
fi

finish
