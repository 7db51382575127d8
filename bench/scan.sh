#!/usr/bin/env bash
# Content-scan cost on the initial sync (not a test): `airlock sync` of a
# copy of /usr/include (plus a copy with a dotenv file and a few tokens in
# it, so the withholding path runs too) into a fresh guest, the build
# under test against a base build without the content scanner, runs
# interleaved (A B A B ...) so load drifts hit both. Each run starts from
# nothing: fresh guest root, fresh state directory (no hash cache), fresh
# process (no verdict cache). Median and p99 (of RUNS runs) per build.
#   usage: bench/scan.sh BUILD_DIR BASE_BUILD_DIR [RUNS]
#   e.g.   bench/scan.sh build /tmp/build-main 21
set -euo pipefail
B=$(cd "$1" && pwd)
BASE=$(cd "$2" && pwd)
RUNS=${3:-21}

W=$(mktemp -d /tmp/airlock-bench.XXXXXX)
PIDS=()
cleanup() {
	for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$W" /dev/shm/airlock-scanbench.*
}
trap cleanup EXIT
stats() { # median p99 of the numbers on stdin
	sort -g | awk '{a[NR]=$1} END {m=(NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2; k=int(NR*0.99+0.999); if (k<1) k=1; if (k>NR) k=NR; printf "%.3f %.3f\n", m, a[k]}'
}

D=$(mktemp -d /dev/shm/airlock-scanbench.XXXXXX)
cp -a /usr/include "$D/src"
printf 'DEBUG=1\nDB_PASSWORD=s3cr3tPass99\n' >"$D/src/.env"
tok=gh
tok+=p_q8Zr2LmV0xKp4TbN7yWc1sHd9gFj3uEa6oRi
for i in 1 2 3; do printf '// x\nconst t = "%s";\n' "$tok" >"$D/src/leak$i.ts"; done
nfiles=$(find "$D/src" -type f | wc -l)
bytes=$(du -sb "$D/src" | cut -f1)

# private copies of the binaries under other names, so nothing else on
# the machine that stops agents by name stops these
mkdir -p "$W/new" "$W/base"
cp "$B/airlock" "$W/new/al-scanbench"
cp "$B/airlock-agent" "$W/new/al-scanbench-agent"
cp "$BASE/airlock" "$W/base/al-scanbench"
cp "$BASE/airlock-agent" "$W/base/al-scanbench-agent"
for v in new base; do
	bin=$W/$v
	"$bin/al-scanbench" keygen -o "$W/hk.$v" >"$W/hk.$v.pub"
	"$bin/al-scanbench" keygen -o "$W/gk.$v" >"$W/gk.$v.pub"
	mkdir -p "$D/g.$v"
	"$bin/al-scanbench-agent" --listen "unix:$W/$v.sock" --root "$D/g.$v" --key "$W/gk.$v" \
		--allow "$(cat "$W/hk.$v.pub")" --state "$D/g.$v.state" --fsync none >"$W/$v.agent.out" 2>&1 &
	PIDS+=($!)
	: >"$W/t.$v"
	: >"$W/c.$v"
done
sleep 0.5
for r in $(seq 1 "$RUNS"); do
	for v in new base; do
		bin=$W/$v
		find "$D/g.$v" -mindepth 1 -delete
		rm -rf "$W/state"
		sync
		# wall time, and the host process's CPU time (user + system): on a
		# shared, loaded machine the second is the steadier measure
		XDG_STATE_HOME=$W/state TIMEFORMAT='%R %U %S' bash -c 'time "$@" >"'"$W/$v.out"'" 2>&1' _ \
			"$bin/al-scanbench" sync "$D/src" --guest "unix:$W/$v.sock" --key "$W/hk.$v" \
			--guest-key "$(cat "$W/gk.$v.pub")" 2>"$W/$v.time" || { cat "$W/$v.out" >&2; exit 1; }
		read -r wall u sy <"$W/$v.time"
		echo "$wall" >>"$W/t.$v"
		echo "$u + $sy" | bc -l >>"$W/c.$v"
	done
done
cat "$W/new.out" >&2
[ ! -e "$D/g.new/leak1.ts" ] || { echo "leak1.ts reached the guest of the build under test" >&2; exit 1; }
read -r nm np < <(stats <"$W/t.new")
read -r bm bp < <(stats <"$W/t.base")
read -r ncm ncp < <(stats <"$W/c.new")
read -r bcm bcp < <(stats <"$W/c.base")
echo "### initial sync with and without the content scan (tmpfs, $nfiles files, $((bytes >> 20)) MiB; $RUNS runs each, interleaved)"
echo
echo "| build | wall median (s) | wall p99 (s) | host CPU median (s) | host CPU p99 (s) |"
echo "|---|---:|---:|---:|---:|"
printf '| base (no content scan) | %.3f | %.3f | %.3f | %.3f |\n' "$bm" "$bp" "$bcm" "$bcp"
printf '| content scan | %.3f | %.3f | %.3f | %.3f |\n' "$nm" "$np" "$ncm" "$ncp"
pct() { echo "($1 / $2 - 1) * 100" | bc -l; }
printf '| cost | %+.1f %% | %+.1f %% | %+.1f %% | %+.1f %% |\n' "$(pct "$nm" "$bm")" "$(pct "$np" "$bp")" \
	"$(pct "$ncm" "$bcm")" "$(pct "$ncp" "$bcp")"
