# Shared helpers for integration scripts (sourced, bash).
# Each script gets a private temp dir, kills what it started on exit, and
# ends with the plain "N passed, N failed" line.

set -euo pipefail

T=$(mktemp -d /tmp/airlock-test.XXXXXX)
PIDS=()
PASS=0
FAIL=0
SKIP=0

cleanup() {
	local p
	for p in "${PIDS[@]:-}"; do
		[ -n "$p" ] && kill "$p" 2>/dev/null || true
	done
	for p in "${PIDS[@]:-}"; do
		[ -n "$p" ] && wait "$p" 2>/dev/null || true
	done
	# a sanitizer report in any log of this run goes to stderr before the
	# logs are gone (a check's own message shows only a log's tail)
	for p in "$T"/*.err "$T"/*.out; do
		[ -f "$p" ] && grep -q 'ERROR: AddressSanitizer\|ERROR: LeakSanitizer\|runtime error' "$p" 2>/dev/null &&
			{ echo "# sanitizer report in ${p##*/}:" >&2; grep -m1 -A40 'ERROR: AddressSanitizer\|ERROR: LeakSanitizer\|runtime error' "$p" >&2; }
	done
	# AIRLOCK_TEST_KEEP=1 keeps the run's directory (logs, trees) for a look
	if [ -n "${AIRLOCK_TEST_KEEP:-}" ]; then echo "# kept $T" >&2; else rm -rf "$T"; fi
}
trap cleanup EXIT

# sanitized BIN: BIN is an AddressSanitizer build. (Not `ldd | grep -q`: under
# pipefail grep's early exit gives ldd a SIGPIPE, and the answer is random.)
sanitized() { case "$(ldd "$1" 2>/dev/null)" in *libasan*) return 0 ;; *) return 1 ;; esac; }

ok() { PASS=$((PASS + 1)); echo "ok - $*"; }
not_ok() { FAIL=$((FAIL + 1)); echo "not ok - $*"; }
skip() { SKIP=$((SKIP + 1)); echo "skip - $*"; }

# check NAME CMD...: run a check function, count the result.
check() {
	local name=$1 t0=$EPOCHREALTIME
	shift
	if "$@"; then ok "$name"; else not_ok "$name"; fi
	# each check's wall time, for finding where the suite's minutes go
	awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "# %.2f s\n", b - a }'
}

finish() {
	echo "$PASS passed, $FAIL failed, $SKIP skipped"
	[ "$FAIL" -eq 0 ]
}

# wait_line FILE REGEX [SECONDS]: wait until FILE has a line matching REGEX.
wait_line() {
	local file=$1 re=$2 secs=${3:-10} i
	for ((i = 0; i < secs * 200; i++)); do
		if grep -qE "$re" "$file" 2>/dev/null; then return 0; fi
		sleep 0.005
	done
	echo "timed out waiting for /$re/ in $file:" >&2
	cat "$file" >&2 || true
	return 1
}

# start_bg LOGPREFIX CMD...: start a background process with stdout and
# stderr in $T/LOGPREFIX.out/.err; sets BG_PID. The files are emptied before
# the fork: a wait_line right after must not match an earlier run's lines
# while the child has not yet opened them (it may not run for a while on a
# loaded machine).
start_bg() {
	local name=$1
	shift
	: >"$T/$name.out"
	: >"$T/$name.err"
	"$@" >>"$T/$name.out" 2>>"$T/$name.err" &
	BG_PID=$!
	PIDS+=("$BG_PID")
}

# vm_template AGENT_STATIC BUILD_SH TEMPLATE_DIR: the VM base template built
# (cached: BUILD_SH does nothing when it is up to date) with a static agent:
# AGENT_STATIC, or when it is '-' (sanitizer builds have none) one built from
# $AIRLOCK_SRC with -Dstatic_agent=true next to the template, incrementally.
# Sets VM_AGENT; the builders' output is in $T/sa.out and $T/build.out.
vm_template() {
	VM_AGENT=$1
	if [ "$1" = - ]; then
		local sa=$3.agent-build
		mkdir -p "$(dirname "$sa")"
		{ [ -f "$sa/build.ninja" ] || meson setup "$sa" "$AIRLOCK_SRC" -Dstatic_agent=true -Db_sanitize=none >"$T/sa.out" 2>&1; } &&
			ninja -C "$sa" -j2 airlock-agent >>"$T/sa.out" 2>&1 || return 1
		VM_AGENT=$sa/airlock-agent
	fi
	"$2" "$3" "$VM_AGENT" >"$T/build.out" 2>&1
}

# make_pair: a host and a guest key ($T/hk and $T/gk, public halves in
# HPUB and GPUB), the workspace W=$T/work and the guest's root G=$T/guest.
# Needs $AIRLOCK.
make_pair() {
	"$AIRLOCK" keygen -o "$T/hk" >"$T/hk.pub"
	"$AIRLOCK" keygen -o "$T/gk" >"$T/gk.pub"
	HPUB=$(cat "$T/hk.pub")
	GPUB=$(cat "$T/gk.pub")
	W=$T/work
	G=$T/guest
	mkdir -p "$W" "$G"
}

# t_up_down (for check): `airlock down $W` ends the `airlock up` started
# as $UP_PID (logs in $T/up.*) with status 0.
t_up_down() {
	timeout -k 2 15 "$AIRLOCK" down "$W" || return 1
	local rc=0
	wait "$UP_PID" || rc=$?
	[ "$rc" = 0 ] || { echo "up exited $rc" >&2; tail -5 "$T/up.err" >&2; return 1; }
}

# t_no_sanitizer_reports (for check): nothing from ASan/UBSan in the logs
# of airlock up and the agent ($T/up.err, $T/agent.err).
t_no_sanitizer_reports() {
	! grep -l 'AddressSanitizer\|LeakSanitizer\|runtime error' "$T/up.err" "$T/agent.err"
}
