#!/usr/bin/env bash
# Edit-to-guest latency (doc/BENCH.md): write one small file, time until
# the copy has it. airlock up (its own acknowledgement from `airlock status`,
# and independently a watcher on the guest root) side by side with
# inotifywait→rsync, lsyncd (default config, and delay = 0) and
# `unison -repeat watch`, all on the same machine, one after another.
#
# usage: bench/latency.sh BUILD [EDITS] [FILES]     (root + /dev/fuse for airlock)
#   BUILD  a meson build dir (release or debugoptimized) with airlock and airlock-agent
#   EDITS  edits per tool (default 1000; lsyncd's default config waits 15 s per change,
#          so it gets LSYNCD_DEFAULT_EDITS, default 5)
#   FILES  files in the tree (default 50)
# Environment: ONLY=airlock runs only the airlock rows; AGENT_STATE=DIR puts the agent's
# --state directory (its sequence file, fsync'ed after every batch) there (default: in the
# temp dir, i.e. on the same filesystem as /tmp); AGENT_WRAP="strace -f -T -o FILE" wraps the agent.
# Missing tools are installed with apt-get (inotify-tools lsyncd unison rsync); a tool
# that is still missing is reported as skipped.
#
# Each edit: open(O_TRUNC) + write + close of one file (round robin), then wait for
# the watcher (inotifywait -m on the destination) to report the file *and* for the
# destination to hold the new bytes. The watcher's timestamp is taken when its line
# reaches the driver (a pipe hop, ~tens of µs).
set -euo pipefail

B=${1:?usage: bench/latency.sh BUILD [EDITS] [FILES]}
N=${2:-1000}
F=${3:-50}
LD_N=${LSYNCD_DEFAULT_EDITS:-5}
AIRLOCK=$(realpath "$B/airlock")
AGENT=$(realpath "$B/airlock-agent")

missing=()
for t in inotifywait:inotify-tools lsyncd:lsyncd unison:unison rsync:rsync; do
	command -v "${t%%:*}" >/dev/null || missing+=("${t#*:}")
done
if [ ${#missing[@]} -gt 0 ]; then
	echo "# installing: ${missing[*]}" >&2
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null 2>&1 ||
		{ apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null 2>&1; } ||
		echo "# apt-get failed; tools still missing are skipped" >&2
fi
command -v inotifywait >/dev/null || { echo "inotifywait (inotify-tools) is required" >&2; exit 1; }

T=$(mktemp -d /tmp/airlock-lat.XXXXXX)
PIDS=()
cleanup() {
	for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
	if mountpoint -q "$T/work" 2>/dev/null; then "$AIRLOCK" down "$T/work" >/dev/null 2>&1 || umount -l "$T/work" || true; fi
	for p in "${PIDS[@]:-}"; do [ -n "$p" ] && wait "$p" 2>/dev/null || true; done
	rm -rf "$T"
}
trap cleanup EXIT
export XDG_STATE_HOME=$T/state

# tree SRC: F small files in a few directories
tree() {
	local d=$1 i
	mkdir -p "$d"
	for ((i = 0; i < F; i++)); do
		mkdir -p "$d/d$((i % 5))"
		printf 'file %d\n' "$i" >"$d/d$((i % 5))/f$i.txt"
	done
}

# The driver: edits in EDIT, watches DEST with inotifywait; prints "p50 p99 mean n timeouts" in ms.
cat >"$T/drive.py" <<'EOF'
import os, select, subprocess, sys, time
edit, dest, n, nfiles = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
timeout = float(sys.argv[5]) if len(sys.argv) > 5 else 5.0
w = subprocess.Popen(["inotifywait", "-m", "-r", "-e", "close_write,moved_to,create", "--format", "%w%f", dest],
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0)
while b"Watches established" not in w.stderr.readline():
    pass
fd = w.stdout.fileno()
os.set_blocking(fd, False)
pend = b""
def lines(deadline):
    global pend
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        r, _, _ = select.select([fd], [], [], left)
        if r:
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                continue
            pend += chunk
            if b"\n" in pend:
                out, pend = pend.rsplit(b"\n", 1)
                return (time.monotonic_ns(), out.split(b"\n"))
lat, tmo = [], 0
time.sleep(0.2)
for i in range(n):
    k = i % nfiles
    rel = "d%d/f%d.txt" % (k % 5, k)
    want = ("edit %d of file %d\n" % (i, k)).encode()
    target = os.path.join(dest, rel).encode()
    t0 = time.monotonic_ns()
    with open(os.path.join(edit, rel), "wb") as f:
        f.write(want)
    deadline = time.monotonic() + timeout
    done = False
    while not done:
        got = lines(deadline)
        if got is None:
            break
        ts, evs = got
        if target in evs:
            try:
                with open(target, "rb") as g:
                    if g.read() == want:
                        lat.append((ts - t0) / 1e6)
                        done = True
            except OSError:
                pass
    if not done:
        tmo += 1
w.kill()
lat.sort()
def pct(p):
    return lat[min(len(lat) - 1, int(p / 100.0 * len(lat)))] if lat else float("nan")
mean = sum(lat) / len(lat) if lat else float("nan")
print("%.3f %.3f %.3f %d %d" % (pct(50), pct(99), mean, len(lat), tmo))
EOF

ROWS=()
row() { ROWS+=("| $1 | $2 |"); echo "# $1: $2" >&2; }
fmt() { read -r p50 p99 mean n tmo <<<"$1"; echo "$p50 | $p99 | $mean | $n | $tmo"; }

# ---- airlock up (agent on a unix socket, --fsync none like the e2e test and rsync)
if [ "$(id -u)" = 0 ] && [ -c /dev/fuse ]; then
	tree "$T/work"
	mkdir -p "$T/guest"
	"$AIRLOCK" keygen -o "$T/hk" >"$T/hk.pub"
	"$AIRLOCK" keygen -o "$T/gk" >"$T/gk.pub"
	# shellcheck disable=SC2086
	${AGENT_WRAP:-} "$AGENT" --listen "unix:$T/a.sock" --root "$T/guest" --key "$T/gk" --allow "$(cat "$T/hk.pub")" \
		--state "${AGENT_STATE:-$T/agent.state}" --fsync none >"$T/agent.out" 2>&1 &
	PIDS+=($!)
	for _ in $(seq 200); do grep -q '^ready' "$T/agent.out" 2>/dev/null && break; sleep 0.05; done
	"$AIRLOCK" up "$T/work" --guest "unix:$T/a.sock" --key "$T/hk" --guest-key "$(cat "$T/gk.pub")" \
		>"$T/up.out" 2>"$T/up.err" &
	PIDS+=($!)
	for _ in $(seq 400); do grep -q 'in sync' "$T/up.out" 2>/dev/null && break; sleep 0.05; done
	r=$(python3 "$T/drive.py" "$T/work" "$T/guest" "$N" "$F")
	"$AIRLOCK" sync-wait -C "$T/work" --timeout 30 >/dev/null
	st=$("$AIRLOCK" status -C "$T/work" --json)
	ap50=$(grep -o '"p50":[0-9.e+-]*' <<<"$st" | cut -d: -f2)
	ap99=$(grep -o '"p99":[0-9.e+-]*' <<<"$st" | cut -d: -f2)
	asm=$(grep -o '"samples":[0-9]*' <<<"$st" | cut -d: -f2)
	row "airlock up — guest acknowledgement (status latency_ms)" "$(printf '%.3f' "$ap50") | $(printf '%.3f' "$ap99") | - | $asm pushes | -"
	row "airlock up — watcher on the guest root" "$(fmt "$r")"
	"$AIRLOCK" down "$T/work" >/dev/null
else
	echo "# airlock up skipped: needs root and /dev/fuse" >&2
fi

if [ "${ONLY:-}" = airlock ]; then
	echo "| tool | p50 ms | p99 ms | mean ms | edits observed | timeouts (5 s) |"
	echo "|---|---:|---:|---:|---:|---:|"
	printf '%s\n' "${ROWS[@]}"
	exit 0
fi

# ---- inotifywait → rsync -a --delete (one rsync per event batch)
S=$T/src D=$T/dst
rm -rf "$S" "$D"; tree "$S"; rsync -a "$S/" "$D/"
(inotifywait -m -r -q -e close_write,create,delete,moved_to,moved_from,attrib --format x "$S" |
	while read -r _; do rsync -a --delete "$S/" "$D/"; done) &
PIDS+=($!)
sleep 0.5
r=$(python3 "$T/drive.py" "$S" "$D" "$N" "$F")
row "inotifywait → rsync -a --delete" "$(fmt "$r")"
pkill -P $! 2>/dev/null || true; kill $! 2>/dev/null || true

# ---- lsyncd (default.rsync): default settings (delay 15 s) and delay = 0
if command -v lsyncd >/dev/null; then
	for mode in default zero; do
		rm -rf "$S" "$D"; tree "$S"; rsync -a "$S/" "$D/"
		{ echo 'settings { nodaemon = true, logfile = "'"$T"'/lsyncd.log", statusFile = "'"$T"'/lsyncd.status" }'
		  if [ $mode = zero ]; then
			echo 'sync { default.rsync, source = "'"$S"'", target = "'"$D"'", delay = 0 }'
		  else
			echo 'sync { default.rsync, source = "'"$S"'", target = "'"$D"'" }'
		  fi; } >"$T/lsyncd.lua"
		lsyncd "$T/lsyncd.lua" >"$T/lsyncd.out" 2>&1 &
		lp=$!
		PIDS+=("$lp")
		sleep 2
		if [ $mode = zero ]; then
			r=$(python3 "$T/drive.py" "$S" "$D" "$N" "$F")
			row "lsyncd, delay = 0" "$(fmt "$r")"
		else
			r=$(python3 "$T/drive.py" "$S" "$D" "$LD_N" "$F" 30)
			row "lsyncd, default config ($LD_N edits)" "$(fmt "$r")"
		fi
		kill $lp 2>/dev/null || true
		wait $lp 2>/dev/null || true
	done
else
	row "lsyncd" "not installed | | | | "
fi

# ---- unison -repeat watch
if command -v unison >/dev/null && command -v unison-fsmonitor >/dev/null; then
	rm -rf "$S" "$D"; tree "$S"; rsync -a "$S/" "$D/"
	export UNISON=$T/unison
	mkdir -p "$UNISON"
	unison "$S" "$D" -batch -auto -silent -repeat watch -confirmbigdel=false >"$T/unison.out" 2>&1 &
	PIDS+=($!)
	sleep 3
	r=$(python3 "$T/drive.py" "$S" "$D" "$N" "$F")
	row "unison -repeat watch" "$(fmt "$r")"
	kill $! 2>/dev/null || true
elif command -v unison >/dev/null; then
	# Debian's unison packages ship no unison-fsmonitor, which -repeat watch needs:
	# measure its polling mode (-repeat 1) on a few edits instead, and say so.
	UN=${UNISON_POLL_EDITS:-20}
	rm -rf "$S" "$D"; tree "$S"; rsync -a "$S/" "$D/"
	export UNISON=$T/unison
	mkdir -p "$UNISON"
	unison "$S" "$D" -batch -auto -silent -repeat 1 -confirmbigdel=false >"$T/unison.out" 2>&1 &
	PIDS+=($!)
	sleep 3
	r=$(python3 "$T/drive.py" "$S" "$D" "$UN" "$F")
	row "unison -repeat 1 (no unison-fsmonitor for -repeat watch; $UN edits)" "$(fmt "$r")"
	kill $! 2>/dev/null || true
else
	row "unison" "not installed | | | | "
fi

echo "| tool | p50 ms | p99 ms | mean ms | edits observed | timeouts (5 s) |"
echo "|---|---:|---:|---:|---:|---:|"
printf '%s\n' "${ROWS[@]}"
