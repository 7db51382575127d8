#!/bin/bash
# FUSE overhead: the same workloads on a bare directory and through airlock's
# passthrough mount over that same directory (not a test).
#
#   bash bench/fuse.sh [BUILD_DIR] [RUNS] [BIG_FILE_BYTES]
#
# BUILD_DIR must hold tests/harness/mount_harness (default build). Needs /dev/fuse,
# git, python3, and root (a bind mount gives a bare view of the backing
# directory while the FUSE mount covers it, so native and FUSE runs can
# alternate and share whatever else the machine is doing). Prints a markdown
# table of medians (warm page cache on both sides) and the FUSE/native ratio.
set -euo pipefail

B=${1:-build}
RUNS=${2:-5}
BIG=${3:-1073741824}
H=$B/tests/harness/mount_harness
[ -x "$H" ] || { echo "no $H: build first (meson setup $B && ninja -C $B)" >&2; exit 1; }

T=$(mktemp -d /tmp/airlock-bench.XXXXXX)
W=$T/ws
N=$T/native
HPID=
cleanup() {
	[ -n "$HPID" ] && kill "$HPID" 2>/dev/null && wait "$HPID" 2>/dev/null || true
	mountpoint -q "$N" 2>/dev/null && umount "$N"
	rm -rf "$T"
}
trap cleanup EXIT

mkdir -p "$W" "$N"
echo "preparing: /usr/include as a git repository, a $BIG-byte file" >&2
cp -a /usr/include "$W/repo"
(
	cd "$W/repo"
	export GIT_AUTHOR_NAME=b GIT_AUTHOR_EMAIL=b@b GIT_COMMITTER_NAME=b GIT_COMMITTER_EMAIL=b@b
	git init -q && git add -A && git commit -qm import && git gc -q # packed, as real clones are
)
head -c "$BIG" /dev/urandom >"$W/big"
NFILES=$(find "$W/repo" -type f | wc -l)

now() { date +%s%N; }

# time_cmd NAME CMD...: run once, print elapsed ms
time_ms() {
	local s e
	s=$(now)
	"$@" >/dev/null 2>&1
	e=$(now)
	echo $(((e - s) / 1000)) | awk '{ printf "%.1f\n", $1 / 1000 }'
}

median() { sort -n | awk '{ a[NR] = $1 } END { if (NR % 2) print a[(NR + 1) / 2]; else printf "%.1f\n", (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }

# workloads take the root to work in: $N (bare) or $W (through the mount)
# no index refresh: the two views must not write behind each other's back
w_git_status() { GIT_OPTIONAL_LOCKS=0 git -C "$1/repo" status --porcelain; }
w_grep() { grep -r -l "define __GLIBC__" "$1/repo" || true; }
w_find_stat() { find "$1/repo" -print0 | xargs -0 stat -c '%s %Y' ; }
w_seqread() { cat "$1/big"; }
w_smallfiles() {
	python3 - "$1/small-$(basename "$1")" <<'EOF'
import os, sys
d = sys.argv[1]
os.mkdir(d)
data = b'x' * 100
for i in range(10000):
    fd = os.open(f'{d}/f{i}', os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    os.write(fd, data)
    os.close(fd)
EOF
}

WORKLOADS=(git_status grep find_stat seqread smallfiles)
declare -A LABEL=(
	[git_status]="git status ($NFILES files)"
	[grep]="grep -r (/usr/include copy)"
	[find_stat]="find \\| xargs stat"
	[seqread]="sequential read $((BIG / 1048576)) MiB"
	[smallfiles]="create+write 10k small files"
)

# One workload: warm-up on both sides, then RUNS alternating native/FUSE
# runs (so both see the same background load); medians into RES.
declare -A RES
bench_one() {
	local w=$1 i
	"w_$w" "$N" >/dev/null 2>&1 || true
	"w_$w" "$W" >/dev/null 2>&1 || true
	rm -rf "$N/small-native" "$W/small-ws"
	: >"$T/native.ms"
	: >"$T/fuse.ms"
	for ((i = 0; i < RUNS; i++)); do
		time_ms "w_$w" "$N" >>"$T/native.ms"
		rm -rf "$N/small-native"
		time_ms "w_$w" "$W" >>"$T/fuse.ms"
		rm -rf "$W/small-ws"
	done
	RES[native.$w]=$(median <"$T/native.ms")
	RES[fuse.$w]=$(median <"$T/fuse.ms")
	echo "$w: native ${RES[native.$w]} ms, fuse ${RES[fuse.$w]} ms" >&2
}

# the bare view of the backing directory, taken before the mount covers it
mount --bind "$W" "$N"
"$H" --quiet "$W" >"$T/h.out" 2>"$T/h.err" &
HPID=$!
for ((i = 0; i < 500; i++)); do grep -q '^mounted' "$T/h.out" && break; sleep 0.01; done
grep -q '^mounted' "$T/h.out" || { echo "mount failed: $(cat "$T/h.err")" >&2; exit 1; }
for w in "${WORKLOADS[@]}"; do bench_one "$w"; done
kill "$HPID"
wait "$HPID" || true
HPID=

echo
echo "| workload | native ms (median of $RUNS) | airlock FUSE ms (median of $RUNS) | ratio |"
echo "|---|---|---|---|"
for w in "${WORKLOADS[@]}"; do
	awk -v l="${LABEL[$w]}" -v n="${RES[native.$w]}" -v f="${RES[fuse.$w]}" \
		'BEGIN { printf "| %s | %.1f | %.1f | %.2fx |\n", l, n, f, (n > 0 ? f / n : 0) }'
done
