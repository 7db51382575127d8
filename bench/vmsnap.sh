#!/usr/bin/env bash
# VM start from the template's snapshot against a cold boot, in one run
# (doc/VM.md "Snapshots"), through the user's CLI: `airlock up DIR
# --sandbox vm`, then the first `airlock exec -- true` answered, then
# `airlock down`. Rows:
#   cold, no snapshot     AIRLOCK_VM_SNAPSHOT=0: the template booted as before
#   cold, saving          no snapshot yet: boot to the snapshot point, save,
#                         restore (what the first start of a template costs)
#   restored (N starts)   p50 / p99 / max of up -> first command answered, and of
#                         the sandbox's own start (qemu start -> agent ready,
#                         the "sandbox started in X ms" of `up`), and its parts
#                         from qemu.log: qemu's start to its monitor answering
#                         migrate-incoming, the device state loaded, the guest's
#                         work from the start line to the agent's ready line
#   restored, private     PRIVATE=1: as many restores with AIRLOCK_VM_SHARED_RAM=0,
#                         each right after one of the above (the cost of the
#                         shared memory's copy)
# The template is a private copy (fresh snapshots), used as installed
# (AIRLOCK_VM_NO_BUILD=1: no builder run per start).
#
# usage: [FORKS=5] [PRIVATE=1] bench/vmsnap.sh BUILD [N]     (root + /dev/fuse + qemu; qemu-img for the fork rows)
#   BUILD  a meson build dir with airlock and airlock-agent-static
#   N      restored starts (default 10)
set -euo pipefail

B=$(realpath "${1:?usage: bench/vmsnap.sh BUILD [N]}")
N=${2:-10}
SRC=$(cd "$(dirname "$0")/.." && pwd)
AIRLOCK=$B/airlock
T=$(mktemp -d /tmp/alvs.XXXXXX) # short: the sandbox sockets live below it
cleanup() {
	"$AIRLOCK" down "$T/w" >/dev/null 2>&1 || true
	sleep 1
	mountpoint -q "$T/w" 2>/dev/null && umount -l "$T/w"
	rm -rf "$T"
}
trap cleanup EXIT
export XDG_STATE_HOME=$T/state XDG_DATA_HOME=$T/data AIRLOCK_VM_TEMPLATE=$T/tpl AIRLOCK_VM_NO_BUILD=1

sh "$SRC/guest-agent/template/build.sh" "$B/vm-template" "$B/airlock-agent-static" >/dev/null
mkdir -p "$T/tpl"
cp "$B/vm-template/vmlinux" "$B/vm-template/initramfs.cpio" "$B/vm-template/kernel.hz" "$B/vm-template/stamp" "$T/tpl/"
mkdir -p "$T/w/src"
for i in $(seq 1 50); do echo "file $i" >"$T/w/src/f$i.txt"; done

ms() { date +%s%N | awk '{ printf "%.1f", $1 / 1e6 }'; }
# one_start ENV...: up, first exec, down; prints "TOTAL_MS SANDBOX_MS KIND"
one_start() {
	local t0 t1 rc=0
	# emptied here: a background job's own redirection may come after the
	# first grep below, which would then see the last start's "in sync"
	: >"$T/up.out"
	: >"$T/up.err"
	t0=$(ms)
	env "$@" "$AIRLOCK" up "$T/w" --sandbox vm >>"$T/up.out" 2>>"$T/up.err" &
	local pid=$!
	for _ in $(seq 18000); do # 180 s: a cold boot that saves the snapshot takes a minute at load 16
		grep -q "in sync with sandbox vm" "$T/up.out" 2>/dev/null && break
		kill -0 "$pid" 2>/dev/null || { cat "$T/up.err" >&2; return 1; }
		sleep 0.01
	done
	"$AIRLOCK" exec -C "$T/w" -- true </dev/null || rc=$?
	t1=$(ms)
	[ "$rc" = 0 ] || {
		echo "bench/vmsnap.sh: exec failed ($rc)" >&2
		cat "$T/up.err" "$T"/data/airlock/sandboxes/*/qemu.log >&2
		return 1
	}
	"$AIRLOCK" down "$T/w" >/dev/null
	wait "$pid" || true
	# the restore's parts (qemu.log): qemu up to the monitor's answer, the
	# state loaded, then the guest's start line -> agent ready
	local parts
	parts=$(sed -n 's/^airlock: restored .*: qemu up in \([0-9]*\) ms, state loaded in \([0-9]*\) ms, agent ready \([0-9]*\) ms later$/\1 \2 \3/p' "$T"/data/airlock/sandboxes/*/qemu.log)
	echo "$(echo "$t1 - $t0" | bc) $(sed -n 's/^airlock: sandbox started in \([0-9.]*\) ms, \([a-z]*\).*/\1 \2/p' "$T/up.err") ${parts:-- - -}"
}
pct() { # pct FILE COLUMN: "p50 / p99 / max"
	awk -v c="$2" '{ print $c }' "$1" | sort -n |
		awk '{ a[NR] = $1 } END { printf "%.0f / %.0f / %.0f ms", a[int(NR*0.5+0.5)], a[int(NR*0.99+0.5)], a[NR] }'
}

echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# $(qemu-system-x86_64 --version | head -n 1); accel: $([ -w /dev/kvm ] && grep -qE ' (vmx|svm)' /proc/cpuinfo && echo kvm || echo 'tcg (no vmx/svm)')"
read -r nos_total nos_sb nos_kind < <(one_start AIRLOCK_VM_SNAPSHOT=0)
printf '%-28s %8s ms to the first command (sandbox %s ms, %s)\n' "cold, no snapshot" "$nos_total" "$nos_sb" "$nos_kind"
read -r cold_total cold_sb cold_kind < <(one_start)
printf '%-28s %8s ms to the first command (sandbox %s ms, %s)\n' "cold, saving the snapshot" "$cold_total" "$cold_sb" "$cold_kind"
: >"$T/restored"
: >"$T/restored0"
for i in $(seq 1 "$N"); do
	one_start >>"$T/restored"
	[ "${PRIVATE:-0}" = 1 ] && one_start AIRLOCK_VM_SHARED_RAM=0 >>"$T/restored0"
done
if awk '$3 != "restored" { bad = 1 } END { exit !bad }' "$T/restored"; then
	echo "bench/vmsnap.sh: a start was not restored:" >&2
	cat "$T/restored" >&2
	exit 1
fi
printf '%-28s %s to the first command; sandbox start %s\n' "restored ($N starts)" "$(pct "$T/restored" 1)" "$(pct "$T/restored" 2)"
printf '%-28s qemu up %s; state loaded %s; start line -> agent ready %s\n' "  of which (p50 / p99 / max)" "$(pct "$T/restored" 4)" "$(pct "$T/restored" 5)" "$(pct "$T/restored" 6)"
if [ -s "$T/restored0" ]; then
	printf '%-28s %s to the first command; sandbox start %s\n' "restored, private memory" "$(pct "$T/restored0" 1)" "$(pct "$T/restored0" 2)"
	printf '%-28s qemu up %s; state loaded %s; start line -> agent ready %s\n' "  of which (p50 / p99 / max)" "$(pct "$T/restored0" 4)" "$(pct "$T/restored0" 5)" "$(pct "$T/restored0" 6)"
fi
echo "# snapshot: $(du -sh --apparent-size "$T"/tpl/snapshots/*/ram | cut -f1) guest memory ($(du -sh "$T"/tpl/snapshots/*/ram | cut -f1) on disk), $(stat -c %s "$T"/tpl/snapshots/*/state) bytes of device state"

# VM forks through the CLI: `airlock up --sandbox vm` (restored), a first
# command, then FORKS times `airlock fork --name fI --json` (wall time, and
# the op's own ms, freeze_ms: the parent's pause, start_ms: the fork's
# start), `airlock exec --fork fI` (fork + first command in it), `fork --rm`.
FORKS=${FORKS:-5}
if command -v qemu-img >/dev/null 2>&1 && [ "$FORKS" -gt 0 ]; then
	: >"$T/up.out"
	"$AIRLOCK" up "$T/w" --sandbox vm >>"$T/up.out" 2>"$T/up.err" &
	upid=$!
	for _ in $(seq 18000); do grep -q "in sync with sandbox vm" "$T/up.out" 2>/dev/null && break; sleep 0.01; done
	"$AIRLOCK" exec -C "$T/w" -- true </dev/null
	: >"$T/cli"
	js() { grep -o "\"$1\":[0-9.]*" "$T/cf.out" | head -n 1 | cut -d: -f2 | cut -d. -f1; }
	for i in $(seq 1 "$FORKS"); do
		t0=$(ms)
		"$AIRLOCK" fork -C "$T/w" --name "f$i" --json >"$T/cf.out" 2>"$T/cf.err" || { cat "$T/cf.err" >&2; exit 1; }
		t1=$(ms)
		"$AIRLOCK" exec -C "$T/w" --fork "f$i" -- sh -c 'echo x >a' </dev/null
		t2=$(ms)
		echo "$(echo "$t1 - $t0" | bc) $(echo "$t2 - $t0" | bc) $(js ms) $(js freeze_ms) $(js start_ms)" >>"$T/cli"
		"$AIRLOCK" fork -C "$T/w" --rm "f$i" >/dev/null
	done
	"$AIRLOCK" down "$T/w" >/dev/null
	wait "$upid" || true
	printf '%-28s airlock fork %s; fork + first command in it %s\n' "cli forks ($FORKS)" "$(pct "$T/cli" 1)" "$(pct "$T/cli" 2)"
	printf '%-28s the op %s: parent paused %s, fork start %s\n' "  of which (p50 / p99 / max)" "$(pct "$T/cli" 3)" "$(pct "$T/cli" 4)" "$(pct "$T/cli" 5)"
fi

# VM forks (doc/VM.md "Forks"), through tests/harness/vm_harness: a parent
# VM restored from the snapshot, then FORKS forks of it one after another
# (each: the parent frozen, its disk onto a new overlay and its memory to a
# file, then the fork restored from that with its own keys), each stopped
# and removed before the next. Rows: the parent's freeze (paused for it),
# the fork ready (freeze + start, vm_harness's start_ms), the start alone,
# and the start's parts from the fork's qemu.log. AIRLOCK_VM_SHARED_RAM=0:
# the parent's memory is not shared, each freeze migrates all of it.
H=$B/tests/harness/vm_harness
if [ -x "$H" ] && command -v qemu-img >/dev/null 2>&1 && [ "$FORKS" -gt 0 ]; then
	P=$T/p
	mkfifo "$T/p.ctl"
	"$H" "$P" "$T/tpl" <"$T/p.ctl" >"$T/p.out" 2>"$T/p.err" &
	exec 9>"$T/p.ctl"
	for _ in $(seq 3000); do grep -q '^ready$' "$T/p.out" && break; sleep 0.05; done
	: >"$T/forks"
	: >"$T/forks.start"
	mkdir -p "$P/forks"
	for i in $(seq 1 "$FORKS"); do
		mkdir -m 0700 "$P/forks/f"
		mkfifo "$T/f.ctl"
		"$H" "$P/forks/f" "$T/tpl" --fork "$P" <"$T/f.ctl" >"$T/f.out" 2>"$T/f.err" &
		hf=$!
		exec 8>"$T/f.ctl"
		for _ in $(seq 3000); do grep -q '^ready$' "$T/f.out" && break; sleep 0.01; done
		grep -q '^ready$' "$T/f.out" || { cat "$T/f.err" >&2; exit 1; }
		echo "$(sed -n 's/^freeze_ms //p' "$T/f.out") $(sed -n 's/^start_ms //p' "$T/f.out") $(stat -c %s "$P/forks/f/mem") $(sed -n 's/^airlock: restored .*: qemu up in \([0-9]*\) ms, state loaded in \([0-9]*\) ms, agent ready \([0-9]*\) ms later$/\1 \2 \3/p' "$P/forks/f/qemu.log")" >>"$T/forks"
		tail -n 1 "$T/forks" | awk '{ print $2 - $1 }' >>"$T/forks.start"
		exec 8>&-
		wait "$hf" || true
		rm -rf "$P/forks/f" "$T/f.ctl"
	done
	exec 9>&-
	wait || true
	printf '%-28s parent frozen %s; fork ready (freeze + start) %s; its start alone %s\n' "vm forks ($FORKS)" "$(pct "$T/forks" 1)" "$(pct "$T/forks" 2)" "$(pct "$T/forks.start" 1)"
	printf '%-28s qemu up %s; state loaded %s; start line -> agent ready %s\n' "  of which (p50 / p99 / max)" "$(pct "$T/forks" 4)" "$(pct "$T/forks" 5)" "$(pct "$T/forks" 6)"
	echo "# a fork's memory: $(grep -m1 '^airlock: memory:' "$P/qemu.log" | sed 's/^airlock: memory: //'); its mem file $(awk '{ print int($3 / 1024) }' "$T/forks" | sort -n | sed -n 1p) KiB; load now $(cut -d' ' -f1-3 /proc/loadavg)"
fi
