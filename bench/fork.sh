#!/usr/bin/env bash
# Forks of the local sandbox (doc/SANDBOX.md "Forks"), measured on a warm
# sandbox whose workspace has FILES files (default 100000) and whose guest
# has a node_modules of NM files (default 20000, made in the guest):
#  (a) `airlock fork` until the fork runs a command: the fork op alone (the
#      daemon's "ms": parent stop, freeze, fork sandbox start) and fork +
#      `airlock exec --fork F -- true` end to end, RUNS times (each fork then
#      removed); and how long the parent takes to answer `exec -- true` again;
#  (b) a test suite (python3 unittest, CPU-bound, reading node_modules; it
#      prints 180 000 ResourceWarning lines to stderr) in one fork, then in
#      three forks at once, and `airlock try` with three patches running it:
#      the ratio of three to one, and the CPU seconds of every process (the
#      daemon, the forks' agents, the suites, the CLIs; the same suite on the
#      host beside them), which on a shared machine compare where wall time
#      does not (doc/BENCH.md "Forks, fourth pass").
#
# usage: bench/fork.sh BUILD [RUNS] [FILES] [NM]      (root + /dev/fuse + user namespaces)
set -euo pipefail

B=$(realpath "${1:?usage: bench/fork.sh BUILD [RUNS] [FILES] [NM]}")
N=${2:-20}
FILES=${3:-100000}
NM=${4:-20000}
T=$(mktemp -d "${FORK_BENCH_TMP:-/tmp/fork-bench}.XXXXXX")
export XDG_DATA_HOME=$T/data XDG_STATE_HOME=$T/state XDG_CONFIG_HOME=$T/config AIRLOCK_SOCKET=$T/relay.sock
W=$T/work
A=$B/airlock
mkdir -p "$W"
trap '"$A" down "$W" --destroy >/dev/null 2>&1 || true; rm -rf "$T"' EXIT

pct() { # pct P < numbers: the P-th percentile (nearest rank)
	sort -g | awk -v p="$1" '{ v[NR] = $1 } END { i = int((NR - 1) * p / 100) + 1; printf "%.1f", v[i] }'
}
now_ms() { date +%s.%N | awk '{ printf "%.3f", $1 * 1000 }'; }

echo "# workspace: $FILES files; guest node_modules: $NM files"
python3 - "$W" "$FILES" <<'PY'
import os, sys
root, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    d = os.path.join(root, "src", "d%03d" % (i // 1000))
    if i % 1000 == 0:
        os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "f%05d.js" % i), "w") as f:
        f.write("module.exports = %d;\n" % i)
os.makedirs(os.path.join(root, "tests"), exist_ok=True)
for k in range(6):  # the suite: CPU work plus reads of node_modules
    with open(os.path.join(root, "tests", "test_s%d.py" % k), "w") as f:
        f.write("""import os, unittest, hashlib
class T(unittest.TestCase):
    def test_work(self):
        h = hashlib.sha256()
        for dp, _, fs in os.walk("node_modules"):
            for x in fs[:50]:
                h.update(open(os.path.join(dp, x), "rb").read())
        s = 0
        for i in range(1500000):
            s += i * i % 7
        self.assertTrue(s > 0)
""")
PY
printf 'node_modules/\n' >"$W/.gitignore"
t0=$(now_ms)
"$A" up "$W" -d --quiet >/dev/null 2>"$T/up.err"
t1=$(now_ms)
echo "initial sync of the workspace: $(echo "($t1 - $t0) / 1000" | bc -l | xargs printf '%.1f') s"
"$A" exec -C "$W" -- python3 -c "
import os
for i in range($NM):
    d = 'node_modules/pkg%03d/lib' % (i // 100)
    if i % 100 == 0: os.makedirs(d, exist_ok=True)
    open('%s/m%05d.js' % (d, i), 'w').write('exports.v = %d;\n' % i)
" 2>/dev/null
"$A" exec -C "$W" -- true

echo "# (a) fork until a command runs in it, $N runs"
: >"$T/op" && : >"$T/e2e" && : >"$T/parent" && : >"$T/stop" && : >"$T/freeze" && : >"$T/start"
for i in $(seq "$N"); do
	"$A" exec -C "$W" -- sh -c "echo $i >>edits.txt" 2>/dev/null # a parent write: each fork freezes a layer
	"$A" sync-wait -C "$W" >/dev/null
	t0=$(now_ms)
	"$A" fork -C "$W" --name "b$i" --json >"$T/f.json"
	"$A" exec -C "$W" --fork "b$i" -- true
	t1=$(now_ms)
	"$A" exec -C "$W" -- true
	t2=$(now_ms)
	python3 - "$T/f.json" "$T" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for k, v in (("op", d["ms"]), ("stop", d["parent_stop_ms"]), ("freeze", d["freeze_ms"]), ("start", d["forks"][0]["start_ms"])):
    open(sys.argv[2] + "/" + k, "a").write("%f\n" % v)
PY
	echo "$t1 - $t0" | bc >>"$T/e2e"
	echo "$t2 - $t0" | bc >>"$T/parent"
	[ $((i % 4)) = 0 ] && "$A" fork -C "$W" --rm-all >/dev/null # and now and then none: the stack is merged
done
"$A" fork -C "$W" --rm-all >/dev/null
echo "fork op (daemon)                 p50 $(pct 50 <"$T/op") ms  p99 $(pct 99 <"$T/op") ms"
echo "  of which: parent stop p50 $(pct 50 <"$T/stop") ms, freeze p50 $(pct 50 <"$T/freeze") ms, fork sandbox start p50 $(pct 50 <"$T/start") ms"
echo "fork + exec --fork -- true (CLI) p50 $(pct 50 <"$T/e2e") ms  p99 $(pct 99 <"$T/e2e") ms"
echo "fork start to the parent's next exec -- true returning  p50 $(pct 50 <"$T/parent") ms  p99 $(pct 99 <"$T/parent") ms"

echo "# (b) the suite in one fork, then in three at once (load $(cut -d' ' -f1-3 /proc/loadavg))"
SUITE=(python3 -m unittest discover -q -s tests)
"$A" fork -C "$W" -n 3 >/dev/null
# warm each fork alike (the page cache, the overlay's own dentries, the
# suite's __pycache__ in its upper layer): the three-at-once run timed
# warm f1 against cold f2 and f3 before
for f in f1 f2 f3; do "$A" exec -C "$W" --fork "$f" -- "${SUITE[@]}" 2>/dev/null; done
# the parent, which starts again in the background after a fork where the
# daemon does that, is settled (connected and in sync, or idle-stopped)
# before anything is timed: its restart is not the forks' figure
for _ in $(seq 300); do
	"$A" status -C "$W" --json | python3 -c 'import json, sys; d = json.load(sys.stdin)
sys.exit(0 if d.get("sandbox_state") == "idle-stopped" or d.get("state") == "live" else 1)' && break
	sleep 0.1
done
DPID=$("$A" status -C "$W" --json | python3 -c 'import json, sys; print(json.load(sys.stdin)["pid"])')
# CPU ticks of every process involved: the daemon (its own), each fork's
# agent (its own, and its reaped children's: the suite), each CLI (time -f)
ticks() { awk '{ print $14 + $15, $16 + $17 }' "/proc/$1/stat"; }
fork_agents() { ps -o pid=,args= --ppid "$DPID" | awk '/airlock-agent/ && /--no-track/ { print $1 }'; }
snap() { # snap FILE: "pid own children" of the daemon and the forks' agents
	{ echo "$DPID $(ticks "$DPID")"; for p in $(fork_agents); do echo "$p $(ticks "$p")"; done; } >"$1"
}
cpu_report() { # cpu_report LABEL BEFORE AFTER CLI-TIME-FILES...: seconds of CPU per process
	local label=$1 b=$2 a=$3 hz
	shift 3
	hz=$(getconf CLK_TCK)
	python3 - "$label" "$b" "$a" "$DPID" "$hz" "$@" <<'PY2'
import sys
label, b, a, dpid, hz = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5])
rd = lambda f: {l.split()[0]: (int(l.split()[1]), int(l.split()[2])) for l in open(f) if l.strip()}
B, A = rd(b), rd(a)
d = (A[dpid][0] - B[dpid][0]) / hz
own = sum(A[p][0] - B[p][0] for p in A if p != dpid and p in B) / hz
kids = sum(A[p][1] - B[p][1] for p in A if p != dpid and p in B) / hz
cli = sum(sum(float(x) for x in open(f).read().split()[-2:]) for f in sys.argv[6:])
print("%s CPU s: daemon %.2f, agents %.2f, suites (agents' children) %.2f, CLIs %.2f; airlock's own %.2f" %
      (label, d, own, kids, cli, d + own + cli))
PY2
}
snap "$T/c0"
t0=$(now_ms)
/usr/bin/time -f '%U %S' -o "$T/t1.cli" "$A" exec -C "$W" --fork f1 -- "${SUITE[@]}" 2>/dev/null
t1=$(now_ms)
snap "$T/c1"
one=$(echo "$t1 - $t0" | bc)
c0=$(awk -v d="$DPID" '$1 == d { print $2 }' "$T/c1")
t0=$(now_ms)
for f in f1 f2 f3; do /usr/bin/time -f '%U %S' -o "$T/t3$f.cli" "$A" exec -C "$W" --fork "$f" -- "${SUITE[@]}" 2>/dev/null & done
wait
t1=$(now_ms)
snap "$T/c3"
c1=$(awk -v d="$DPID" '$1 == d { print $2 }' "$T/c3")
three=$(echo "$t1 - $t0" | bc)
# the same suite on the host, no sandbox: what two cores give three copies of it
N0=$T/native
mkdir -p "$N0" && cp -r "$W/tests" "$N0/" && (cd "$N0" && python3 -c "
import os
for i in range($NM):
    d = 'node_modules/pkg%03d/lib' % (i // 100)
    if i % 100 == 0: os.makedirs(d, exist_ok=True)
    open('%s/m%05d.js' % (d, i), 'w').write('exports.v = %d;\n' % i)
")
(cd "$N0" && "${SUITE[@]}" 2>/dev/null) # warm
hcpu() { awk '{ s += $1 + $2 } END { printf "%.2f", s }' "$@"; } # user + system seconds of time -f files
t0=$(now_ms)
(cd "$N0" && /usr/bin/time -f '%U %S' -o "$T/h1" "${SUITE[@]}" 2>/dev/null)
t1=$(now_ms)
none=$(echo "$t1 - $t0" | bc)
hcpu "$T/h1" >"$T/h1.cpu"
t0=$(now_ms)
for k in 1 2 3; do (cd "$N0" && /usr/bin/time -f '%U %S' -o "$T/h3.$k" "${SUITE[@]}" 2>/dev/null) & done
wait
t1=$(now_ms)
nthree=$(echo "$t1 - $t0" | bc)
hcpu "$T"/h3.? >"$T/h3.cpu"
"$A" fork -C "$W" --rm-all >/dev/null
for v in 1 2 3; do
	printf -- '--- a/tests/test_s0.py\n+++ b/tests/test_s0.py\n@@ -1 +1,2 @@\n import os, unittest, hashlib\n+V = %d\n' "$v" >"$T/p$v.diff"
done
t0=$(now_ms)
"$A" try -C "$W" --json --patch "$T/p1.diff" --patch "$T/p2.diff" --patch "$T/p3.diff" -- "${SUITE[@]}" >"$T/try.json" 2>/dev/null || true
t1=$(now_ms)
try=$(echo "$t1 - $t0" | bc)
printf 'one fork: %.0f ms; three forks at once: %.0f ms; ratio %.2f (2 cores); the daemon used %d ticks of CPU (%s Hz) meanwhile\n' \
	"$one" "$three" "$(echo "$three / $one" | bc -l)" "$((c1 - c0))" "$(getconf CLK_TCK)"
cpu_report "one fork:" "$T/c0" "$T/c1" "$T/t1.cli"
cpu_report "three forks:" "$T/c1" "$T/c3" "$T"/t3f?.cli
printf 'on the host, no sandbox: one %.0f ms (CPU %s s); three at once %.0f ms (CPU %s s); ratio %.2f\n' "$none" "$(cat "$T/h1.cpu")" "$nthree" "$(cat "$T/h3.cpu")" "$(echo "$nthree / $none" | bc -l)"
printf 'airlock try, three patches, the suite in each (forks, patches, run, changes, replay in the parent): %.0f ms\n' "$try"
