#!/usr/bin/env bash
# Forks of the local sandbox (doc/SANDBOX.md "Forks"), measured on a warm
# sandbox whose workspace has FILES files (default 100000) and whose guest
# has a node_modules of NM files (default 20000, made in the guest):
#  (a) `airlock fork` until the fork runs a command: the fork op alone (the
#      daemon's "ms": parent stop, freeze, fork sandbox start) and fork +
#      `airlock exec --fork F -- true` end to end, RUNS times (each fork then
#      removed); and how long the parent takes to answer `exec -- true` again;
#  (b) a test suite (python3 unittest, CPU-bound, reading node_modules) in one
#      fork, then in three forks at once, and `airlock try` with three patches
#      running it: the ratio of three to one.
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

echo "# (b) the suite in one fork, then in three at once"
SUITE=(python3 -m unittest discover -q -s tests)
"$A" fork -C "$W" -n 3 >/dev/null
# warm each fork alike (the page cache, the overlay's own dentries, the
# suite's __pycache__ in its upper layer): the three-at-once run timed
# warm f1 against cold f2 and f3 before
for f in f1 f2 f3; do "$A" exec -C "$W" --fork "$f" -- "${SUITE[@]}" 2>/dev/null; done
t0=$(now_ms)
"$A" exec -C "$W" --fork f1 -- "${SUITE[@]}" 2>/dev/null
t1=$(now_ms)
one=$(echo "$t1 - $t0" | bc)
DPID=$("$A" status -C "$W" --json | python3 -c 'import json, sys; print(json.load(sys.stdin)["pid"])')
cpu() { awk '{ print $14 + $15 }' "/proc/$DPID/stat"; } # the daemon's user + system ticks
c0=$(cpu)
t0=$(now_ms)
for f in f1 f2 f3; do "$A" exec -C "$W" --fork "$f" -- "${SUITE[@]}" 2>/dev/null & done
wait
t1=$(now_ms)
c1=$(cpu)
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
t0=$(now_ms)
(cd "$N0" && "${SUITE[@]}" 2>/dev/null)
t1=$(now_ms)
none=$(echo "$t1 - $t0" | bc)
t0=$(now_ms)
for _ in 1 2 3; do (cd "$N0" && "${SUITE[@]}" 2>/dev/null) & done
wait
t1=$(now_ms)
nthree=$(echo "$t1 - $t0" | bc)
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
printf 'on the host, no sandbox: one %.0f ms; three at once %.0f ms; ratio %.2f\n' "$none" "$nthree" "$(echo "$nthree / $none" | bc -l)"
printf 'airlock try, three patches, the suite in each (forks, patches, run, changes, replay in the parent): %.0f ms\n' "$try"
