#!/usr/bin/env bash
# Pathological ignore rules do not stall the daemon (doc/SYNC.md "Bounds on
# ignore rules"): a real agent and `airlock up` over a generated tree of
# 20k files with long names and a ~270 KB .gitignore of 9000 patterns that
# are the matcher's worst case. `airlock down` is answered while the
# initial scan runs (it runs off the daemon's loop); on a small tree the
# scan finishes, every path whose decision went over the matcher's budget
# is withheld, and `airlock audit` names the rule.
# usage: ignore_e2e.sh AIRLOCK AIRLOCK_AGENT   (root + /dev/fuse, else skipped: exit 77)
# shellcheck source=tests/e2e/lib.sh
source "$(dirname "$0")/lib.sh"

AIRLOCK=$1
AGENT=$2
if [ "$(id -u)" != 0 ] || [ ! -c /dev/fuse ]; then
	echo "skip - ignore_e2e needs root and /dev/fuse (uid $(id -u), /dev/fuse $([ -c /dev/fuse ] && echo present || echo missing))"
	exit 77
fi
chmod 0711 "$T"
export XDG_STATE_HOME=$T/state
export XDG_CONFIG_HOME=$T/config
export AIRLOCK_SOCKET=$T/relay.sock
make_pair # $T/hk, $T/gk, HPUB, GPUB; W=$T/work, G=$T/guest

# gen DIR FILES: FILES files named 200 a's and a number, 1000 per directory,
# and the .gitignore: a star, then a literal run that almost matches a's
# (O(name * run) steps per pattern for the classic matcher) and no literal
# tail for a suffix check to turn away
gen() {
	python3 - "$1" "$2" <<'EOF'
import os, sys
root, n = sys.argv[1], int(sys.argv[2])
with open(os.path.join(root, ".gitignore"), "w") as f:
    for i in range(9000):
        f.write("**/*aaaaaaaaaaaaaaaaaaaab%d?\n" % i)
for i in range(n):
    d = os.path.join(root, "d%02d" % (i // 1000))
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "a" * 200 + str(i)), "w") as f:
        f.write("x\n")
with open(os.path.join(root, "short.txt"), "w") as f:
    f.write("kept\n")
EOF
}
gen "$W" 20000
echo "# $(find "$W" -type f | wc -l) files, .gitignore $(stat -c %s "$W/.gitignore") bytes"

start_bg agent "$AGENT" --listen "unix:$T/a.sock" --root "$G" --key "$T/gk" --allow "$HPUB" \
	--state "$T/agent.state" --fsync none
wait_line "$T/agent.out" '^ready' 10
AGENT_PID=$BG_PID

t_down_during_scan() {
	start_bg up "$AIRLOCK" up "$W" --guest "unix:$T/a.sock" --key "$T/hk" --guest-key "$GPUB"
	UP_PID=$BG_PID
	wait_line "$T/up.err" "connecting to unix:$T/a.sock" 20 || return 1
	sleep 1 # the scan is under way
	if grep -q "in sync" "$T/up.out"; then
		echo "the scan finished before down: the test proves nothing" >&2
		return 1
	fi
	local t0 t1 rc=0
	t0=$(date +%s%N)
	timeout -k 2 10 "$AIRLOCK" down "$W" || rc=$?
	t1=$(date +%s%N)
	echo "# airlock down answered in $(((t1 - t0) / 1000000)) ms during the scan"
	[ "$rc" = 0 ] || { echo "down exited $rc" >&2; tail -5 "$T/up.err" >&2; return 1; }
	[ $(((t1 - t0) / 1000000)) -lt 3000 ] || { echo "down took over 3 s" >&2; return 1; }
	rc=0
	wait "$UP_PID" || rc=$?
	[ "$rc" = 0 ] || { echo "up exited $rc" >&2; tail -5 "$T/up.err" >&2; return 1; }
}
check "airlock down answers within 3 s while 20k paths meet a pathological .gitignore" t_down_during_scan

# a small tree: the scan finishes; over-budget paths are withheld and audited
kill "$AGENT_PID" 2>/dev/null || true
W=$T/small G=$T/small-guest
mkdir -p "$W" "$G"
gen "$W" 30
start_bg agent2 "$AGENT" --listen "unix:$T/a2.sock" --root "$G" --key "$T/gk" --allow "$HPUB" \
	--state "$T/agent2.state" --fsync none
wait_line "$T/agent2.out" '^ready' 10
t_withheld() {
	start_bg up "$AIRLOCK" up "$W" --guest "unix:$T/a2.sock" --key "$T/hk" --guest-key "$GPUB"
	UP_PID=$BG_PID
	wait_line "$T/up.out" "^airlock: $W in sync with unix:$T/a2.sock\$" 60 || return 1
	[ -e "$G/short.txt" ] || { echo "short.txt did not sync" >&2; return 1; }
	local sent
	sent=$(find "$G" -name 'aaaa*' | wc -l)
	[ "$sent" = 0 ] || { echo "$sent over-budget paths reached the guest" >&2; return 1; }
	"$AIRLOCK" audit -C "$W" >"$T/audit.out"
	grep -q "over budget: .gitignore:[0-9]*: \*\*/\*aaaaaaaaaaaaaaaaaaaab[0-9]*?: deciding this path took over" "$T/audit.out" ||
		{ echo "audit does not name the rule:" >&2; head -5 "$T/audit.out" >&2; return 1; }
}
check "over the matcher's budget: withheld (not synced), audit names the rule" t_withheld
check "down" t_up_down

# a rule file over the pattern cap: not used, and audit says so
t_cap() {
	python3 -c 'import sys; sys.stdout.write("".join("x%d\n" % i for i in range(10001)))' >"$W/.gitignore"
	echo kept >"$W/x5"
	start_bg up "$AIRLOCK" up "$W" --guest "unix:$T/a2.sock" --key "$T/hk" --guest-key "$GPUB"
	UP_PID=$BG_PID
	wait_line "$T/up.out" "^airlock: $W in sync with unix:$T/a2.sock\$" 60 || return 1
	[ -e "$G/x5" ] || { echo "x5 was not synced" >&2; return 1; }
	"$AIRLOCK" audit -C "$W" | grep -qF "skipped   (ignore rules)  (.gitignore: more than 10000 patterns; its rules are not used)" ||
		{ echo "audit does not name the capped file:" >&2; "$AIRLOCK" audit -C "$W" | head -5 >&2; return 1; }
}
check "a .gitignore over 10000 patterns: not used, audit names the file and the cap" t_cap
check "down" t_up_down
check "no sanitizer reports" t_no_sanitizer_reports
finish
