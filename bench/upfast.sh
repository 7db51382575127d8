#!/usr/bin/env bash
# Unchanged `airlock up` (doc/BENCH.md "Unchanged up"): the 100k-file tree of bench/scale.sh,
# synced once, then RUNS times `airlock down` + `airlock up -d` of the unchanged tree, timed
# until the up prints "in sync"; between them, in the same run, `rsync -a` of the unchanged tree
# into its synced copy (the no-op pass). p50 / p99 of each and their ratio, and the daemon's own
# line per reconcile (host scan time, whether the persisted scan was taken, files read, levels),
# and, from the daemon's AIRLOCK_TRACE start line (doc/UP.md "Tracing the start"), the median of
# when each step of the start happened and where the host scan's time went. The load average is
# printed at the start and at the end.
#
# usage: bench/upfast.sh BUILD [RUNS]     (root + /dev/fuse; RUNS default 9)
# Environment: AIRLOCK_SCALE_DIR (default /tmp/airlock-scale) holds the trees bench/scale.sh
#   generates (its gen function is used as it is, so both benches see the same tree);
#   UPFAST_TREE (default 100k: small, 100k or 1m); GUEST=sandbox syncs to the local sandbox
#   instead of a plain airlock-agent on a unix socket with --fsync none (as bench/scale.sh's
#   GUEST=agent); UPFAST_PERF=1 records `perf stat` of each up's daemon CPU (needs perf).
set -euo pipefail

B=$(realpath "${1:?usage: bench/upfast.sh BUILD [RUNS]}")
N=${2:-9}
HERE=$(cd "$(dirname "$0")" && pwd)
AIRLOCK=$B/airlock
C=${AIRLOCK_SCALE_DIR:-/tmp/airlock-scale}
NAME=${UPFAST_TREE:-100k}
[ "$(id -u)" = 0 ] && [ -c /dev/fuse ] || { echo "bench/upfast.sh needs root and /dev/fuse" >&2; exit 1; }
for t in rsync python3; do command -v $t >/dev/null || { echo "$t is required" >&2; exit 1; }; done
mkdir -p "$C"
T=$(mktemp -d "$C/upfast.XXXXXX")
W=
AP=
cleanup() {
	[ -n "$W" ] && "$AIRLOCK" down "$W" >/dev/null 2>&1 || true
	[ -n "${AP:-}" ] && kill "$AP" 2>/dev/null || true
	rm -rf "$T"
}
trap cleanup EXIT

# the tree generator of bench/scale.sh, taken from it (one generator for both benches)
eval "$(sed -n '/^gen() {/,/^}/p' "$HERE/scale.sh")"
declare -F gen >/dev/null || { echo "bench/scale.sh has no gen(): cannot make the tree" >&2; exit 1; }
gen "$NAME" "$NAME"

export XDG_STATE_HOME=$T/state XDG_DATA_HOME=$T/data AIRLOCK_TRACE=1
echo "# load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
W=$T/work
cp -a "$C/$NAME" "$W"
cp -a "$C/$NAME" "$T/rs" # rsync's synced copy
files=$(find "$W" -type f | wc -l)
mib=$(du -sm "$W" | cut -f1)
UP=()
if [ "${GUEST:-agent}" = agent ]; then
	G=$T/guest
	mkdir -p "$G"
	"$AIRLOCK" keygen -o "$T/hk" >"$T/hk.pub"
	"$AIRLOCK" keygen -o "$T/gk" >"$T/gk.pub"
	"$B/airlock-agent" --listen "unix:$T/a.sock" --root "$G" --key "$T/gk" --allow "$(cat "$T/hk.pub")" \
		--state "$T/agent-state" --fsync none >"$T/agent.out" 2>&1 &
	AP=$!
	for _ in $(seq 200); do grep -q '^ready' "$T/agent.out" 2>/dev/null && break; sleep 0.05; done
	UP=(--guest "unix:$T/a.sock" --key "$T/hk" --guest-key "$(cat "$T/gk.pub")")
fi
now() { date +%s.%N; }
since() { echo "$(now) - $1" | bc; }
stats() { # p50 p99 of the numbers on stdin
	sort -g | awk '{a[NR]=$1} END {k=int(NR*0.99+0.999); if (k<1) k=1; if (k>NR) k=NR;
		printf "%.3f %.3f\n", a[int((NR+1)/2)], a[k]}'
}

t0=$(now)
"$AIRLOCK" up "$W" "${UP[@]}" -d >/dev/null 2>"$T/up.err" || { cat "$T/up.err" >&2; exit 1; }
echo "# initial sync of $NAME ($files files, $mib MiB): $(since "$t0") s" >&2
rsync -a "$C/$NAME/" "$T/rs/" # warm rsync's side the same way
# The first up after the initial sync is not an unchanged one on the guest's side: the batches
# changed its copy since its last scan, so it scans fully once (and the host's state may hold
# racy entries of files written just before the initial scan). Timed, reported apart.
"$AIRLOCK" down "$W" >/dev/null
t0=$(now)
"$AIRLOCK" up "$W" "${UP[@]}" -d >/dev/null 2>"$T/up.err" || { cat "$T/up.err" >&2; exit 1; }
first=$(since "$t0")
echo "# first up after the initial sync: $first s" >&2
: >"$T/up.t"
: >"$T/rs.t"
for i in $(seq 1 "$N"); do
	"$AIRLOCK" down "$W" >/dev/null
	t0=$(now)
	"$AIRLOCK" up "$W" "${UP[@]}" -d >/dev/null 2>"$T/up.err" || { cat "$T/up.err" >&2; exit 1; }
	u=$(since "$t0")
	echo "$u" >>"$T/up.t"
	t0=$(now)
	rsync -a "$C/$NAME/" "$T/rs/"
	r=$(since "$t0")
	echo "$r" >>"$T/rs.t"
	echo "# run $i: airlock up $u s, rsync -a $r s" >&2
done
grep -h "reconcile:" "$XDG_STATE_HOME"/airlock/*/up.log | tail -n "$N" | sed 's/^/# /' >&2 || true
# the start line of each timed up: the median of each field (ms since the command began; scan ms)
grep -h "trace: up " "$XDG_STATE_HOME"/airlock/*/up.log | tail -n "$N" | python3 -c '
import re, statistics, sys
rows = [dict((k, float(v)) for k, v in re.findall(r"(\w+)_ms=(-?[0-9.]+)", l)) for l in sys.stdin]
if rows:
    keys = [k for k in rows[0] if all(k in r for r in rows)]
    print("# start, median of %d ups (ms since the command began, then the host scan): " % len(rows) +
          " ".join("%s=%.1f" % (k, statistics.median(r[k] for r in rows)) for k in keys))
' >&2 || true
echo "# load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
"$AIRLOCK" down "$W" >/dev/null
W=
read -r u50 u99 <<<"$(stats <"$T/up.t")"
read -r r50 r99 <<<"$(stats <"$T/rs.t")"
echo "| tree | runs | airlock unchanged up p50 / p99 s | rsync -a no-op p50 / p99 s | ratio p50 / p99 |"
echo "|---|---:|---:|---:|---:|"
awk -v n="$NAME ($files files, $mib MiB)" -v k="$N" -v a="$u50" -v b="$u99" -v c="$r50" -v d="$r99" \
	'BEGIN { printf "| %s | %d | %.3f / %.3f | %.3f / %.3f | %.2fx / %.2fx |\n", n, k, a, b, c, d, a / c, b / d }'
echo "first up after the initial sync (the guest scans its changed copy once): $first s"
