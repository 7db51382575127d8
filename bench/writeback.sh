#!/usr/bin/env bash
# Guest changes back to the host (doc/SYNC.md §10), measured with the local sandbox:
#  (a) command exit -> its change on the host in auto mode: `airlock exec -- sh -c 'echo N >FILE'`
#      wall time with workspace.writeback auto (the exit waits for the write-back) and in review mode
#      (nothing written), and `exec -- true`; p50/p99 over RUNS, on a 100-file and a 100k-file tree.
#      auto - review is the write-back; review - true is the tracking and report of one change;
#  (b) a command that rewrites 10k files of the 100k tree (review), then `airlock changes --stat`
#      and `airlock accept --all` for them;
#  (c) side by side, a plain `rsync -a` of the guest's copy onto a copy of the host tree (what a
#      sync-back without tracking costs): after the 1-file change, and after the 10k changes.
# The 100k tree and its sandbox state are made once in $AIRLOCK_BENCH_DIR (default
# /tmp/airlock-bench-writeback) and reused.
#
# usage: bench/writeback.sh BUILD [RUNS]     (root + /dev/fuse + user namespaces)
set -euo pipefail

B=$(realpath "${1:?usage: bench/writeback.sh BUILD [RUNS]}")
N=${2:-30}
D=${AIRLOCK_BENCH_DIR:-/tmp/airlock-bench-writeback}
mkdir -p "$D"
export XDG_DATA_HOME=$D/data XDG_STATE_HOME=$D/state AIRLOCK_SOCKET=$D/relay.sock
A=$B/airlock

pct() { sort -g | awk -v p="$1" '{ v[NR] = $1 } END { i = int((NR - 1) * p / 100) + 1; printf "%.1f", v[i] }'; }
now_ms() { date +%s.%N | awk '{ printf "%.3f", $1 * 1000 }'; }
ms() { local t0 t1; t0=$(now_ms); "$@" >/dev/null 2>&1; t1=$(now_ms); echo "$t1 - $t0" | bc; }

make_tree() { # make_tree DIR FILES: FILES small files in FILES/1000 directories (at least 1)
	[ -f "$1/.made" ] && return 0
	rm -rf "$1"
	python3 - "$1" "$2" <<'PY'
import os, sys
root, n = sys.argv[1], int(sys.argv[2])
per = 1000 if n >= 1000 else n
for i in range(n):
    d = os.path.join(root, "src", "d%d" % (i // per))
    if i % per == 0:
        os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "f%d.txt" % (i % per)), "w") as f:
        f.write("line %d\n" % i)
PY
	touch "$1/.made"
}

up() { # up WORK POLICY
	"$A" up "$1" --policy "$2" -d >/dev/null 2>"$D/up.err"
}
down() { "$A" down "$1" >/dev/null 2>&1 || true; }
guest_copy() { # guest_copy NAME: the sandbox's copy of that tree (the big one has src/d99)
	local s
	for s in "$XDG_DATA_HOME"/airlock/sandboxes/*/workspace; do
			if { [ -d "$s/src/d99" ] && [ "$1" = big ]; } || { [ ! -d "$s/src/d99" ] && [ "$1" = small ]; }; then
			echo "$s"
			return
		fi
	done
}

echo '{"workspace": {"writeback": {"auto": ["**"]}}}' >"$D/auto.json"
echo '{"workspace": {"writeback": "review"}}' >"$D/review.json"

one_tree() { # one_tree NAME FILES
	local t
	W=$D/$1
	make_tree "$W" "$2"
	down "$W" # a run that was interrupted
	trap 'down "$W"' EXIT
	t=$(now_ms)
	up "$W" "$D/review.json"
	echo "# tree $1: $2 files; up (first time: the initial sync) $(echo "$(now_ms) - $t" | bc) ms"
	"$A" reject -C "$W" --all >/dev/null || true
	: >"$D/true" && : >"$D/review" && : >"$D/rsync"
	local G
	G=$(guest_copy "$1")
	rm -rf "$D/rsync-dst" && rsync -a --exclude .made "$G/" "$D/rsync-dst/"
	for i in $(seq "$N"); do
		ms "$A" exec -C "$W" -- true >>"$D/true"
		ms "$A" exec -C "$W" -- sh -c "echo review $i >src/d0/f1.txt" >>"$D/review"
		ms rsync -a --exclude .made "$G/" "$D/rsync-dst/" >>"$D/rsync"
	done
	"$A" reject -C "$W" --all >/dev/null || true
	down "$W"
	up "$W" "$D/auto.json"
	: >"$D/auto"
	for i in $(seq "$N"); do
		ms "$A" exec -C "$W" -- sh -c "echo auto $i >src/d0/f1.txt" >>"$D/auto"
		[ "$(cat "$W/src/d0/f1.txt")" = "auto $i" ] || { echo "auto mode: the host did not have the change at exit" >&2; exit 1; }
	done
	echo "exec -- true            p50 $(pct 50 <"$D/true") ms  p99 $(pct 99 <"$D/true") ms"
	echo "1 change, review        p50 $(pct 50 <"$D/review") ms  p99 $(pct 99 <"$D/review") ms"
	echo "1 change, auto          p50 $(pct 50 <"$D/auto") ms  p99 $(pct 99 <"$D/auto") ms  (on the host at exit)"
	echo "rsync -a of the copy    p50 $(pct 50 <"$D/rsync") ms  p99 $(pct 99 <"$D/rsync") ms"
	down "$W"
	trap - EXIT
}

if [ -z "${ONLY_10K:-}" ]; then # ONLY_10K=1: just (b) and the 10k part of (c)
	one_tree small 100
	one_tree big 100000
fi

W=$D/big
make_tree "$W" 100000
down "$W"
echo "# 10k changed files in the 100k tree (review)"
up "$W" "$D/review.json"
trap 'down "$W"' EXIT
rsync -a --delete --exclude .made "$(guest_copy big)/" "$D/rsync-dst/" # rsync's own starting point: the same tree
echo "command rewriting 10k files (exec wall, incl. their report)  $(ms "$A" exec -C "$W" -- sh -c 'for d in 0 1 2 3 4 5 6 7 8 9; do sed -i -e "s/^line/LINE/;t" -e "s/^LINE/line/" src/d$d/*.txt; done') ms"
: >"$D/stat"
for _ in 1 2 3 4 5; do ms "$A" changes -C "$W" --stat >>"$D/stat"; done
echo "airlock changes --stat (10k)  p50 $(pct 50 <"$D/stat") ms  max $(pct 100 <"$D/stat") ms; $("$A" changes -C "$W" --stat | tail -1)"
echo "rsync -a of the copy (10k changed of 100k)  $(ms rsync -a --exclude .made "$(guest_copy big)/" "$D/rsync-dst/") ms"
echo "airlock accept --all (10k)  $(ms "$A" accept -C "$W" --all) ms"
"$A" sync-wait -C "$W"
down "$W"
echo "# machine: $(nproc) cores, $(uname -r), $(awk '/model name/ { $1 = $2 = $3 = ""; print; exit }' /proc/cpuinfo)"
