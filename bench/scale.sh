#!/usr/bin/env bash
# Scale (doc/BENCH.md "Scale"): airlock on a 100k-file tree (and, with
# SCALE_1M=1, a generated 1M-file tree) side by side with rsync -a and
# lsyncd (delay = 0, its rsync given --ignore-times), in one run:
#   initial sync      airlock: `airlock up -d` of the local sandbox, fresh state, to "in sync";
#                     rsync -a into an empty directory
#   unchanged up      airlock: `airlock down`, then `airlock up -d` again (median of 3);
#                     rsync -a of the unchanged tree (median of 3)
#   edit → guest      a small file rewritten (open O_TRUNC, write, close) in the workspace until
#                     the copy holds the new bytes (an inotify watcher on the copy's edits/
#                     directory, like bench/latency.sh); airlock also from `airlock status`
#                     latency_ms (the guest's acknowledgement); lsyncd delay = 0 on the same tree
#   write → exec      the same write, then `airlock exec -- cat` of it (the barrier), p50
#   peak RSS          VmHWM of the daemon and of the agent (/proc/PID/status) after all of the above
#   responsiveness    `airlock status` every 200 ms during the initial sync: its slowest and p99
#                     answer times (a new CLI process each time: its start is in the figure), and
#                     the daemon loop's own (SIGUSR1 until status.json is rewritten)
# The 100-file row (edits/ alone) is measured in the same run, for the ratios.
#
# usage: bench/scale.sh BUILD [EDITS]     (root + /dev/fuse)
#   BUILD  meson build dir with airlock and airlock-agent; EDITS per tool and tree (default 300)
# Environment: AIRLOCK_SCALE_DIR (default /tmp/airlock-scale) caches the generated trees
#   (deterministic: a seeded generator plus copies of this machine's /usr/include and
#   /usr/lib/python3*), SCALE_1M=1 adds the 1M-file tree, ONLY=airlock skips rsync and lsyncd,
#   SKIP_100K=1 skips the 100k tree, GUEST=agent syncs to a plain airlock-agent on a unix socket
#   with --fsync none (like bench/latency.sh and rsync: no fsync) instead of the local sandbox
#   (whose agent fsyncs its sequence file after every batch). SCALE_LINK=1 makes airlock's
#   workspace copy of a tree with hard links (edits/ copied: the only files the bench writes;
#   cp -a of the 1M tree took over 25 minutes at load 25). TRACE=1 runs the daemon with
#   AIRLOCK_TRACE=1 and prints, per tree, where an edit's and a command's time went (p50 / p99
#   of each step, from up.log: doc/UP.md "Tracing a push").
set -euo pipefail

B=$(realpath "${1:?usage: bench/scale.sh BUILD [EDITS]}")
N=${2:-300}
AIRLOCK=$B/airlock
C=${AIRLOCK_SCALE_DIR:-/tmp/airlock-scale}
[ "$(id -u)" = 0 ] && [ -c /dev/fuse ] || { echo "bench/scale.sh needs root and /dev/fuse" >&2; exit 1; }
for t in inotifywait rsync python3; do command -v $t >/dev/null || { echo "$t is required" >&2; exit 1; }; done
mkdir -p "$C"
T=$(mktemp -d "$C/run.XXXXXX")
W=
AP=
LP=
cleanup() {
	[ -n "$W" ] && "$AIRLOCK" down "$W" >/dev/null 2>&1 || true
	[ -n "${LP:-}" ] && kill "$LP" 2>/dev/null || true
	[ -n "${AP:-}" ] && kill "$AP" 2>/dev/null || true
	rm -rf "$T"
}
trap cleanup EXIT

# ---- trees (cached; "ok" marks a finished generation)
gen() { # gen NAME KIND
	local d=$C/$1
	[ -f "$d.ok" ] && return 0
	echo "# generating $1 in $d" >&2
	rm -rf "$d"
	mkdir -p "$d"
	python3 - "$d" "$2" <<'EOF'
import os, random, sys
d, kind = sys.argv[1], sys.argv[2]
rng = random.Random(0x61697231)
words = ["int", "return", "static", "const", "struct", "void", "if", "else", "for", "while", "size_t",
         "char", "uint64_t", "buf", "len", "err", "goto", "out", "free", "alloc", "node", "next", "list"]
def src(n):
    out, k = [], 0
    while k < n:
        line = " ".join(rng.choice(words) for _ in range(rng.randint(2, 10))) + ";\n"
        out.append(line)
        k += len(line)
    return "".join(out)[:n].encode()
os.makedirs(os.path.join(d, "edits"))
for i in range(100):
    with open(os.path.join(d, "edits", "f%d.txt" % i), "wb") as f:
        f.write(b"file %d\n" % i)
if kind == "small":
    sys.exit(0)
if kind == "100k":   # 72k generated sources of 100 B .. 6 KB in 3 levels
    for i in range(72000):
        p = os.path.join(d, "gen", "m%02d" % (i % 40), "p%03d" % (i // 40 % 45))
        if i < 1800:
            os.makedirs(p, exist_ok=True)
        with open(os.path.join(p, "s%05d.c" % i), "wb") as f:
            f.write(src(rng.randint(100, 6000)))
else:                # 1M files of 20 .. 200 bytes, 1000 directories of 1000
    for i in range(1000000):
        p = os.path.join(d, "gen", "a%02d" % (i % 40), "b%02d" % (i // 40 % 25))
        if i < 1000:
            os.makedirs(p, exist_ok=True)
        with open(os.path.join(p, "f%06d" % i), "wb") as f:
            f.write(src(rng.randint(20, 200)))
EOF
	if [ "$2" = 100k ]; then
		for k in 1 2 3; do cp -a /usr/include "$d/include$k"; done
		for p in /usr/lib/python3 /usr/lib/python3.*; do [ -d "$p" ] && cp -a "$p" "$d/$(basename "$p")"; done
		find "$d" ! -type f ! -type d -delete # no special files; symlinks kept out too (not compared by rsync the same way)
	fi
	touch "$d.ok"
}
gen small small
[ -z "${SKIP_100K:-}" ] && gen 100k 100k
[ -n "${SCALE_1M:-}" ] && gen 1m 1m

ROWS=()
TRACES=()
declare -A EDIT EDIT99 INIT UNCH RINIT RUNCH LEDIT
row() { ROWS+=("| $* |"); echo "# $*" >&2; }
med() { sort -g | awk '{ v[NR] = $1 } END { printf "%.3f", v[int((NR + 1) / 2)] }'; }
now() { date +%s.%N; }
since() { echo "$(now) - $1" | bc; }

# The driver (bench/drive.py): EDIT root, DEST root, N edits of edits/f*.txt; waits for DEST to
# hold the bytes. Prints "p50 p99 n timeouts" in ms. With a 5th argument (the workspace), runs
# `airlock exec -C WS -- cat` after each write instead of watching, and prints its p50 p99.
DRIVE=$(dirname "$(realpath "$0")")/drive.py

# `airlock status` answered during the initial sync, every 200 ms, from the first answer until
# the up is in sync: "max p99 n loopmax loopp99" in ms. max/p99: the whole CLI (a new process:
# start, connect, ask, print; on a loaded machine its start is most of it); loopmax/loopp99: the
# daemon's loop alone (SIGUSR1, as status sends it, until status.json is rewritten)
cat >"$T/probe.py" <<'EOF'
import glob, json, os, signal, subprocess, sys, time
airlock, ws, done = sys.argv[1:4]
lat, loop, pid = [], [], None
state = os.path.join(os.environ.get("XDG_STATE_HOME", ""), "airlock", "*", "status.json")
while not os.path.exists(done):
    t0 = time.monotonic()
    r = subprocess.run([airlock, "status", "-C", ws, "--json"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    t1 = time.monotonic()
    if r.returncode == 0:
        lat.append((t1 - t0) * 1000)
        try:
            pid = json.loads(r.stdout)["pid"]
        except (ValueError, KeyError):
            pass
    files = glob.glob(state)
    if pid and files:
        real0 = time.time_ns()
        t2 = time.monotonic()
        try:
            os.kill(pid, signal.SIGUSR1)
            while time.monotonic() - t2 < 10 and not os.path.exists(done):
                try:
                    if json.load(open(files[0]))["updated_ns"] >= real0:
                        loop.append((time.monotonic() - t2) * 1000)
                        break
                except (OSError, ValueError, KeyError):
                    pass
                time.sleep(0.001)
        except ProcessLookupError:
            pid = None
    time.sleep(max(0.0, 0.2 - (time.monotonic() - t0)))
def mp(l):
    l.sort()
    return "%.1f %.1f" % (l[-1], l[min(len(l) - 1, int(0.99 * len(l)))]) if l else "- -"
print("%s %d %s" % (mp(lat), len(lat), mp(loop)))
EOF

# TRACE=1: p50 / p99 of each step of the pushes and commands traced in up.log (doc/UP.md)
cat >"$T/trace.py" <<'EOF'
import re, sys
steps = ["queue_us", "decide_us", "send_us", "ack_us", "done_us", "total_us"]
v = {k: [] for k in steps + ["barrier_us"]}
for line in open(sys.argv[1], errors="replace"):
    if "trace: push" in line or "trace: exec" in line:
        for k, x in re.findall(r"(\w+_us)=(-?[\d.]+)", line):
            if k in v and float(x) >= 0:
                v[k].append(float(x))
pct = lambda l, p: sorted(l)[min(len(l) - 1, int(p / 100.0 * len(l)))]
print(" ".join("%s %.0f/%.0f" % (k[:-3], pct(l, 50), pct(l, 99)) for k, l in v.items() if l) + " (us p50/p99)")
EOF

hwm() { awk '/^VmHWM/ { printf "%.1f", $2 / 1024 }' "/proc/$1/status" 2>/dev/null || echo "-"; }
agent_pid() { # the airlock-agent beneath the daemon PID $1
	local p q
	[ "${GUEST:-sandbox}" = agent ] && { echo "$AP"; return; }
	for p in $(pgrep -x airlock-agent); do
		q=$p
		while [ "$q" -gt 1 ]; do
			[ "$q" = "$1" ] && { echo "$p"; return; }
			q=$(awk '/^PPid/ { print $2 }' "/proc/$q/status" 2>/dev/null || echo 1)
		done
	done
}

# airlock NAME: every airlock figure on tree NAME
airlock_run() {
	local name=$1 files mib t0 init unch p50 p99 tmo st
	export XDG_STATE_HOME=$T/$name.state XDG_DATA_HOME=$T/$name.data
	W=$T/$name.work
	if [ -n "${SCALE_LINK:-}" ]; then # hard links but edits/ (the only files the bench writes)
		cp -al "$C/$name" "$W"
		rm -rf "$W/edits"
		cp -a "$C/$name/edits" "$W/edits"
	else
		cp -a "$C/$name" "$W"
	fi
	files=$(find "$W" -type f | wc -l)
	mib=$(du -sm "$W" | cut -f1)
	local G UP=()
	if [ "${GUEST:-sandbox}" = agent ]; then
		G=$T/$name.guest
		mkdir -p "$G"
		rm -f "$T/hk" "$T/gk"
		"$AIRLOCK" keygen -o "$T/hk" >"$T/hk.pub"
		"$AIRLOCK" keygen -o "$T/gk" >"$T/gk.pub"
		"$B/airlock-agent" --listen "unix:$T/a.sock" --root "$G" --key "$T/gk" --allow "$(cat "$T/hk.pub")" \
			--state "$T/$name.agent-state" --fsync none >"$T/agent.out" 2>&1 &
		AP=$!
		for _ in $(seq 200); do grep -q '^ready' "$T/agent.out" 2>/dev/null && break; sleep 0.05; done
		UP=(--guest "unix:$T/a.sock" --key "$T/hk" --guest-key "$(cat "$T/gk.pub")")
	fi
	sync
	rm -f "$T/up.done"
	[ -n "${TRACE:-}" ] && export AIRLOCK_TRACE=1
	python3 "$T/probe.py" "$AIRLOCK" "$W" "$T/up.done" >"$T/probe.out" &
	local PRP=$!
	t0=$(now)
	"$AIRLOCK" up "$W" "${UP[@]}" -d >/dev/null 2>"$T/up.err" || { cat "$T/up.err" >&2; return 1; }
	init=$(since "$t0")
	touch "$T/up.done"
	wait "$PRP" || true
	local probe
	probe=$(cat "$T/probe.out")
	[ "${GUEST:-sandbox}" = agent ] || G=$(echo "$XDG_DATA_HOME"/airlock/sandboxes/*/workspace)
	# the first command after the initial sync (its exit report once walked the whole copy
	# when the sync's own applies had overflowed the agent's inotify queue: doc/SYNC.md
	# "Lost events")
	t0=$(now)
	"$AIRLOCK" exec -C "$W" -- true </dev/null >/dev/null 2>&1 || true
	local first
	first=$(echo "($(since "$t0")) * 1000" | bc)
	read -r p50 p99 _ tmo <<<"$(python3 "$DRIVE" "$W" "$G" "$N")"
	"$AIRLOCK" sync-wait -C "$W" --timeout 60 >/dev/null
	st=$("$AIRLOCK" status -C "$W" --json)
	local ap50 ap99 pid apid e50 e99 pmax p99s pn lmax l99
	ap50=$(python3 -c 'import json,sys; print("%.3f" % json.load(sys.stdin)["latency_ms"]["p50"])' <<<"$st")
	ap99=$(python3 -c 'import json,sys; print("%.3f" % json.load(sys.stdin)["latency_ms"]["p99"])' <<<"$st")
	read -r e50 e99 _ _ <<<"$(python3 "$DRIVE" "$W" "$G" "$((N < 200 ? N : 200))" "$AIRLOCK" "$W")"
	if [ -n "${TRACE:-}" ]; then
		TRACES+=("$name: $(python3 "$T/trace.py" "$XDG_STATE_HOME"/airlock/*/up.log)")
		echo "# trace ${TRACES[-1]}" >&2
	fi
	pid=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["pid"])' <<<"$st")
	apid=$(agent_pid "$pid")
	local rss_d rss_a
	rss_d=$(hwm "$pid")
	rss_a=$([ -n "$apid" ] && hwm "$apid" || echo -)
	[ "${GUEST:-sandbox}" = agent ] && rss_a="$rss_a (one agent for every up)"
	if [ "$name" != small ]; then
		: >"$T/unch"
		for _ in 1 2 3; do
			"$AIRLOCK" down "$W" >/dev/null
			t0=$(now)
			"$AIRLOCK" up "$W" "${UP[@]}" -d >/dev/null 2>"$T/up.err" || { cat "$T/up.err" >&2; return 1; }
			since "$t0" >>"$T/unch"
		done
		unch=$(med <"$T/unch")
		# the unchanged up's daemon and agent are new processes: their peak is the up alone
		st=$("$AIRLOCK" status -C "$W" --json)
		pid=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["pid"])' <<<"$st")
		apid=$(agent_pid "$pid")
		rss_d="$rss_d (up: $(hwm "$pid"))"
		rss_a="$rss_a (up: $([ -n "$apid" ] && hwm "$apid" || echo -))"
	else
		unch=-
	fi
	"$AIRLOCK" down "$W" >/dev/null
	W=
	[ -n "${AP:-}" ] && { kill "$AP"; wait "$AP" 2>/dev/null || true; AP=; }
	read -r pmax p99s pn lmax l99 <<<"$probe"
	row "airlock | $name ($files files, $mib MiB) | $init (first exec $first ms) | $unch | $p50 / $p99 ($tmo timeouts) | $ap50 / $ap99 | $e50 / $e99 | $rss_d | $rss_a | $pmax / $p99s ($pn); loop $lmax / $l99"
	EDIT[$name]=$p50 EDIT99[$name]=$p99 INIT[$name]=$init UNCH[$name]=$unch
	rm -rf "$T/$name.work" "$T/$name.data" "$T/$name.state" "$T/$name.guest" "$T/$name.agent-state"
}

rsync_run() {
	local name=$1 t0 init unch
	sync
	t0=$(now)
	rsync -a "$C/$name/" "$T/$name.rs/"
	init=$(since "$t0")
	: >"$T/unch"
	for _ in 1 2 3; do
		t0=$(now)
		rsync -a "$C/$name/" "$T/$name.rs/"
		since "$t0" >>"$T/unch"
	done
	unch=$(med <"$T/unch")
	row "rsync -a | $name | $init | $unch | - | - | - | - | - | -"
	RINIT[$name]=$init RUNCH[$name]=$unch
}

lsyncd_run() {
	local name=$1 p50 p99 tmo S D
	S=$T/$name.lsrc D=$T/$name.rs
	command -v lsyncd >/dev/null || { row "lsyncd | not installed | | | | | | |"; return 0; }
	cp -a "$C/$name" "$S"
	rsync -a --delete "$S/" "$D/"
	cat >"$T/lsyncd.lua" <<EOF
settings { nodaemon = true, logfile = "$T/lsyncd.log", statusFile = "$T/lsyncd.status", maxProcesses = 1 }
sync { default.rsync, source = "$S", target = "$D", delay = 0, rsync = { archive = true, _extra = { "--ignore-times" } } }
EOF
	: >"$T/lsyncd.log"
	lsyncd "$T/lsyncd.lua" >"$T/lsyncd.out" 2>&1 &
	LP=$!
	for _ in $(seq 1200); do grep -q "Startup of .* finished" "$T/lsyncd.log" && break; sleep 0.1; done
	read -r p50 p99 _ tmo <<<"$(python3 "$DRIVE" "$S" "$D" "$N")"
	kill "$LP" 2>/dev/null || true
	wait "$LP" 2>/dev/null || true
	LP=
	row "lsyncd delay=0 | $name | - | - | $p50 / $p99 ($tmo timeouts) | - | - | - | - | -"
	LEDIT[$name]=$p50
	rm -rf "$S" "$D"
}

TREES="small"
[ -z "${SKIP_100K:-}" ] && TREES="$TREES 100k"
[ -n "${SCALE_1M:-}" ] && TREES="$TREES 1m"
for t in $TREES; do
	airlock_run "$t"
	if [ "${ONLY:-}" != airlock ]; then
		[ "$t" != small ] && rsync_run "$t"
		lsyncd_run "$t"
	fi
done

echo "| tool | tree | initial sync s | unchanged up s | edit → guest p50 / p99 ms | guest ack p50 / p99 ms | write → exec cat p50 / p99 ms | daemon VmHWM MiB | agent VmHWM MiB | status during initial sync max / p99 ms (answers); the loop alone |"
echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
printf '%s\n' "${ROWS[@]}"
echo
[ ${#TRACES[@]} -gt 0 ] && { printf 'trace, %s\n' "${TRACES[@]}"; echo; }
r() { awk -v a="$1" -v b="$2" 'BEGIN { if (a > 0 && b > 0) printf "%.2fx", a / b; else print "-" }'; }
for t in $TREES; do
	[ "$t" = small ] && continue
	echo "ratios, $t: edit p50 vs the 100-file tree $(r "${EDIT[$t]}" "${EDIT[small]}")," \
		"p99 $(r "${EDIT99[$t]}" "${EDIT99[small]}");" \
		"initial sync vs rsync -a $(r "${INIT[$t]}" "${RINIT[$t]:-0}");" \
		"unchanged up vs rsync no-op $(r "${UNCH[$t]}" "${RUNCH[$t]:-0}");" \
		"edit p50 vs lsyncd $(r "${EDIT[$t]}" "${LEDIT[$t]:-0}")"
done
