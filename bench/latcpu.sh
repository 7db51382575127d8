#!/usr/bin/env bash
# CPU per operation, two builds alternating (doc/BENCH.md "Latency, fourth pass"): for each
# round and each build, a fresh `airlock up` of a 100-file tree to a plain agent (--fsync none),
# then
#   perf stat -r 30 airlock exec -- true            task-clock and page faults of the CLI
#   30 x airlock exec -- true in a cgroup           the CLI with whatever it forks (a guard)
#   100 x write, then airlock exec -- cat of it      p50 / p99, and CPU per command of the CLI
#                                                   (cgroup), the daemon and the agent
#                                                   (/proc/PID/task/*/schedstat), the guest
#                                                   command (the agent's cutime + cstime)
#   300 x edit until the guest's copy holds it       p50 / p99, CPU per edit of daemon and agent
# and prints, per figure, each build's median and the median (min-max) of the rounds' ratios
# B / A. On a loaded machine read the ratios, not the absolute figures.
#
# usage: bench/latcpu.sh BUILD_A BUILD_B [ROUNDS]     (root, /dev/fuse, inotifywait, python3;
#   perf for the perf stat rows; a cgroup v1 cpuacct or v2 hierarchy for the cgroup rows)
set -euo pipefail

A=$(realpath "${1:?usage: bench/latcpu.sh BUILD_A BUILD_B [ROUNDS]}")
B=$(realpath "${2:?usage: bench/latcpu.sh BUILD_A BUILD_B [ROUNDS]}")
ROUNDS=${3:-10}
BENCH=$(dirname "$(realpath "$0")")
[ "$(id -u)" = 0 ] && [ -c /dev/fuse ] || { echo "bench/latcpu.sh needs root and /dev/fuse" >&2; exit 1; }
for t in inotifywait python3; do command -v $t >/dev/null || { echo "$t is required" >&2; exit 1; }; done
T=$(mktemp -d /tmp/airlock-latcpu.XXXXXX)
if [ -d /sys/fs/cgroup/cpuacct ]; then
	CG=/sys/fs/cgroup/cpuacct/airlock-latcpu-$$
else
	CG=/sys/fs/cgroup/airlock-latcpu-$$
fi
mkdir "$CG"
UP_B= UP_W= AP=
stop() {
	[ -n "$UP_W" ] && "$UP_B/airlock" down "$UP_W" >/dev/null 2>&1 || true
	[ -n "$AP" ] && { kill "$AP" 2>/dev/null || true; wait "$AP" 2>/dev/null || true; }
	UP_W= AP=
}
cleanup() {
	stop
	rmdir "$CG" 2>/dev/null || true
	rm -rf "$T"
}
trap cleanup EXIT

mkdir -p "$T/tree/edits"
for i in $(seq 0 99); do echo "file $i" >"$T/tree/edits/f$i.txt"; done

# up BUILD: a fresh workspace copy, agent and up; sets UP_W, G, AP, DP
up() {
	local b=$1
	rm -rf "$T/run"
	mkdir -p "$T/run/guest" "$T/run/rt"
	chmod 700 "$T/run/rt"
	cp -a "$T/tree" "$T/run/work"
	"$b/airlock" keygen -o "$T/run/hk" >"$T/run/hk.pub"
	"$b/airlock" keygen -o "$T/run/gk" >"$T/run/gk.pub"
	"$b/airlock-agent" --listen "unix:$T/run/a.sock" --root "$T/run/guest" --key "$T/run/gk" \
		--allow "$(cat "$T/run/hk.pub")" --state "$T/run/astate" --fsync none >"$T/run/agent.out" 2>&1 &
	AP=$!
	for _ in $(seq 200); do grep -q '^ready' "$T/run/agent.out" 2>/dev/null && break; sleep 0.05; done
	export XDG_STATE_HOME=$T/run/state XDG_DATA_HOME=$T/run/data XDG_RUNTIME_DIR=$T/run/rt
	"$b/airlock" up "$T/run/work" --guest "unix:$T/run/a.sock" --key "$T/run/hk" \
		--guest-key "$(cat "$T/run/gk.pub")" -d >/dev/null 2>"$T/run/up.err" || { cat "$T/run/up.err" >&2; exit 1; }
	UP_B=$b UP_W=$T/run/work G=$T/run/guest
	DP=$("$b/airlock" status -C "$UP_W" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["pid"])')
}

cg_ns() { # CPU ns charged to the cgroup so far
	if [ -f "$CG/cpuacct.usage" ]; then cat "$CG/cpuacct.usage"; else awk '/^usage_usec/ { print $2 * 1000 }' "$CG/cpu.stat"; fi
}

# cpu.py MODE AIRLOCK WS GUEST N DAEMON_PID AGENT_PID CGROUP: bench/drive.py's edits, or writes
# each then exec, with the CPU each took; one line of key=value figures
cat >"$T/cpu.py" <<'EOF'
import os, sys, time
sys.path.insert(0, os.environ["BENCH_DIR"])
import drive
mode, airlock, ws, guest, n, dpid, apid, cg = sys.argv[1:9]
n = int(n)
tck = os.sysconf("SC_CLK_TCK")
def children_cpu(pid):  # reaped children's user + system, s
    f = open("/proc/%s/stat" % pid).read().rsplit(")", 1)[1].split()
    return (int(f[13]) + int(f[14])) / tck
def sched(pid):  # ns on a CPU, all threads
    tot = 0
    for t in os.listdir("/proc/%s/task" % pid):
        try:
            tot += int(open("/proc/%s/task/%s/schedstat" % (pid, t)).read().split()[0])
        except OSError:
            pass
    return tot
def cg_ns():
    if os.path.exists(cg + "/cpuacct.usage"):
        return int(open(cg + "/cpuacct.usage").read())
    for line in open(cg + "/cpu.stat"):
        if line.startswith("usage_usec"):
            return int(line.split()[1]) * 1000
def into_cg():
    with open(cg + "/cgroup.procs", "w") as f:
        f.write(str(os.getpid()))
c0, d0, a0, k0 = cg_ns(), sched(dpid), sched(apid), children_cpu(apid)
if mode == "exec":
    lat, bad = drive.writes_exec(ws, n, airlock, ws, preexec_fn=into_cg)
    if bad:
        sys.exit("write -> exec: %d commands did not print what was written" % bad)
    time.sleep(0.2)
    extra = " exec_cli_cpu_us=%.0f exec_guest_cmd_cpu_us=%.0f" % (
        (cg_ns() - c0) / n / 1e3, (children_cpu(apid) - k0) / n * 1e6)
else:
    lat, _ = drive.edits(ws, guest, n)
    extra = ""
d1, a1 = sched(dpid), sched(apid)
print("%s_p50_ms=%.3f %s_p99_ms=%.3f %s_daemon_cpu_us=%.0f %s_agent_cpu_us=%.0f%s" % (
    mode, drive.pct(lat, 50), mode, drive.pct(lat, 99), mode, (d1 - d0) / n / 1e3, mode,
    (a1 - a0) / n / 1e3, extra))
EOF

for round in $(seq "$ROUNDS"); do
	for v in A B; do
		b=$A
		[ $v = B ] && b=$B
		up "$b"
		line="build=$v round=$round load=$(cut -d' ' -f1 /proc/loadavg)"
		if command -v perf >/dev/null; then
			line+=" $(cd "$UP_W" && perf stat -r 30 -x, -e task-clock,page-faults "$b/airlock" exec -- true 2>&1 >/dev/null |
				awk -F, '$3 == "task-clock" { printf "true_task_clock_ms=%s ", $1 } $3 == "page-faults" { printf "true_page_faults=%s", $1 }')"
		fi
		c0=$(cg_ns)
		for _ in $(seq 30); do (cd "$UP_W" && sh -c "echo \$\$ >$CG/cgroup.procs && exec $b/airlock exec -- true"); done
		sleep 0.2
		line+=" true_cgroup_cpu_us=$((($(cg_ns) - c0) / 30000))"
		line+=" $(BENCH_DIR=$BENCH python3 "$T/cpu.py" exec "$b/airlock" "$UP_W" "$G" 100 "$DP" "$AP" "$CG")"
		line+=" $(BENCH_DIR=$BENCH python3 "$T/cpu.py" edit "$b/airlock" "$UP_W" "$G" 300 "$DP" "$AP" "$CG")"
		echo "$line" | tee -a "$T/rows"
		stop
	done
done

python3 - "$T/rows" <<'EOF'
import statistics as st, sys
rows = {"A": [], "B": []}
for line in open(sys.argv[1]):
    kv = dict(x.split("=", 1) for x in line.split())
    rows[kv["build"]].append(kv)
keys = [k for k in rows["A"][0] if k not in ("build", "round", "load")]
print("| figure (%d rounds, load %s-%s) | A, median | B, median | B / A, median of the rounds' ratios (min-max) |" % (
    len(rows["A"]), min(r["load"] for r in rows["A"] + rows["B"]), max(r["load"] for r in rows["A"] + rows["B"])))
print("|---|---:|---:|---:|")
for k in keys:
    a = [float(r[k]) for r in rows["A"]]
    b = [float(r[k]) for r in rows["B"]]
    q = sorted(y / x for x, y in zip(a, b) if x)
    print("| %s | %.2f | %.2f | %.2fx (%.2f-%.2f) |" % (k, st.median(a), st.median(b), st.median(q), q[0], q[-1]))
EOF
