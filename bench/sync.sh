#!/usr/bin/env bash
# Sync benchmark (not a test): initial sync of a real source tree (a copy of
# /usr/include) and re-sync after a one-file edit, airlock vs rsync -a
# (dir to dir, and to an rsync daemon on 127.0.0.1) vs tar | zstd -1 | tar,
# on tmpfs (/dev/shm) and on disk (/var/tmp). Medians of RUNS runs.
# Then: chunk average size vs wire bytes and time for a 1-byte edit in a
# 100 MiB file.
#   usage: bench/sync.sh BUILD_DIR [RUNS]      (e.g. bench/sync.sh build 5)
set -euo pipefail
B=$(cd "$1" && pwd)
RUNS=${2:-5}
AIRLOCK=$B/airlock
AGENT=$B/airlock-agent
command -v rsync >/dev/null || apt-get install -y -qq rsync >/dev/null
command -v zstd >/dev/null || apt-get install -y -qq zstd >/dev/null

W=$(mktemp -d /tmp/airlock-bench.XXXXXX)
PIDS=()
cleanup() {
	for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$W" /dev/shm/airlock-bench.* /var/tmp/airlock-bench.*
}
trap cleanup EXIT

"$AIRLOCK" keygen -o "$W/hk" >"$W/hk.pub"
"$AIRLOCK" keygen -o "$W/gk" >"$W/gk.pub"
export XDG_STATE_HOME=$W/state

now() { date +%s.%N; }
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }

# per filesystem
bench_fs() {
	local base=$1 label=$2 D
	D=$(mktemp -d "$base/airlock-bench.XXXXXX")
	cp -a /usr/include "$D/src"
	local nfiles bytes
	nfiles=$(find "$D/src" -type f | wc -l)
	bytes=$(du -sb "$D/src" | cut -f1)
	echo "$label: $nfiles files, $((bytes >> 20)) MiB" >&2
	# rsync daemon on loopback
	local port=$((20000 + RANDOM % 20000))
	cat >"$W/rsyncd.conf" <<EOF
use chroot = false
uid = $(id -u)
gid = $(id -g)
[dst]
	path = $D/rsd
	read only = false
EOF
	mkdir -p "$D/rsd"
	rsync --daemon --no-detach --address=127.0.0.1 --port=$port --config="$W/rsyncd.conf" &
	PIDS+=($!)
	# airlock agent
	mkdir -p "$D/al"
	"$AGENT" --listen "unix:$W/$label.sock" --root "$D/al" --key "$W/gk" --allow "$(cat "$W/hk.pub")" \
		--state "$D/al.state" --fsync none >"$W/$label.agent.out" 2>"$W/$label.agent.err" &
	PIDS+=($!)
	sleep 0.5
	local sync_args=(--guest "unix:$W/$label.sock" --key "$W/hk" --guest-key "$(cat "$W/gk.pub")")

	local tool r t0 t1
	for tool in airlock rsync rsyncd tarzstd; do
		: >"$W/init.$tool"
		: >"$W/edit.$tool"
		for r in $(seq 1 "$RUNS"); do
			# fresh destination each run
			case $tool in
			airlock) find "$D/al" -mindepth 1 -delete ;; # the agent keeps its root open
			rsync) rm -rf "$D/rs" && mkdir "$D/rs" ;;
			rsyncd) rm -rf "$D/rsd" && mkdir "$D/rsd" ;;
			tarzstd) rm -rf "$D/tz" && mkdir "$D/tz" ;;
			esac
			sync
			t0=$(now)
			case $tool in
			airlock) "$AIRLOCK" sync "$D/src" "${sync_args[@]}" >/dev/null ;;
			rsync) rsync -a "$D/src/" "$D/rs/" ;;
			rsyncd) rsync -a "$D/src/" "rsync://127.0.0.1:$port/dst/" ;;
			tarzstd) tar -C "$D/src" -cf - . | zstd -1 -q | zstd -dq | tar -C "$D/tz" -xf - ;;
			esac
			t1=$(now)
			echo "$t1 - $t0" | bc -l >>"$W/init.$tool"
			# one-file edit, then re-sync (tar has no re-sync: it copies again)
			echo "/* edit $r */" >>"$D/src/stdio.h"
			t0=$(now)
			case $tool in
			airlock) "$AIRLOCK" sync "$D/src" "${sync_args[@]}" >/dev/null ;;
			rsync) rsync -a "$D/src/" "$D/rs/" ;;
			rsyncd) rsync -a "$D/src/" "rsync://127.0.0.1:$port/dst/" ;;
			tarzstd) rm -rf "$D/tz" && mkdir "$D/tz" && tar -C "$D/src" -cf - . | zstd -1 -q | zstd -dq | tar -C "$D/tz" -xf - ;;
			esac
			t1=$(now)
			echo "$t1 - $t0" | bc -l >>"$W/edit.$tool"
		done
	done
	local ai ae
	ai=$(median <"$W/init.airlock")
	ae=$(median <"$W/edit.airlock")
	echo
	echo "### $label ($nfiles files, $((bytes >> 20)) MiB; median of $RUNS runs)"
	echo
	echo "| tool | initial sync (s) | airlock vs it | re-sync after 1-file edit (s) | airlock vs it |"
	echo "|---|---:|---:|---:|---:|"
	for tool in airlock rsync rsyncd tarzstd; do
		local i e name
		i=$(median <"$W/init.$tool")
		e=$(median <"$W/edit.$tool")
		case $tool in
		airlock) name="airlock sync (unix socket, agent --fsync none)" ;;
		rsync) name="rsync -a dir→dir" ;;
		rsyncd) name="rsync -a → rsync daemon on 127.0.0.1" ;;
		tarzstd) name="tar \\| zstd -1 \\| zstd -d \\| tar (no re-sync: full copy)" ;;
		esac
		printf '| %s | %.3f | %.2fx | %.3f | %.1fx |\n' "$name" "$i" "$(echo "$ai / $i" | bc -l)" "$e" \
			"$(echo "$i" | awk -v e="$e" -v ae="$ae" '{print e / ae}')"
	done
	kill "${PIDS[@]}" 2>/dev/null || true
	wait 2>/dev/null || true
	PIDS=()
	rm -rf "$D"
}

command -v bc >/dev/null || apt-get install -y -qq bc >/dev/null
echo "## machine: $(nproc) CPUs, $(awk '/model name/ {$1=$2=$3=""; print; exit}' /proc/cpuinfo | sed 's/^ *//'), kernel $(uname -r)"
echo "## command: bench/sync.sh $1 $RUNS"
echo "(\"airlock vs it\": airlock time / tool time for the initial sync (< 1 = airlock faster);"
echo " tool time / airlock time for the re-sync (> 1 = airlock faster))"
bench_fs /dev/shm tmpfs
bench_fs /var/tmp disk

# chunk average size: 1-byte edit in a 100 MiB file
D=$(mktemp -d /dev/shm/airlock-bench.XXXXXX)
mkdir -p "$D/src" "$D/al"
head -c $((100 << 20)) /dev/urandom >"$D/src/big.bin"
"$AGENT" --listen "unix:$W/chunk.sock" --root "$D/al" --key "$W/gk" --allow "$(cat "$W/hk.pub")" \
	--state "$D/al.state" --fsync none >"$W/chunk.agent.out" 2>"$W/chunk.agent.err" &
PIDS+=($!)
sleep 0.3
echo
echo "### chunk average size: 1-byte edit in a 100 MiB random file (tmpfs)"
echo
echo "| avg | initial sync (s) | re-sync (s) | re-sync wire bytes |"
echo "|---:|---:|---:|---:|"
for avg in 8192 16384 32768 65536 131072; do
	find "$D/al" -mindepth 1 -delete
	t0=$(now)
	AIRLOCK_BENCH_CHUNK_AVG=$avg "$AIRLOCK" sync "$D/src" --guest "unix:$W/chunk.sock" --key "$W/hk" \
		--guest-key "$(cat "$W/gk.pub")" --json >/dev/null
	t1=$(now)
	printf '\x01' | dd of="$D/src/big.bin" bs=1 seek=$((RANDOM * 1000)) conv=notrunc status=none
	t2=$(now)
	out=$(AIRLOCK_BENCH_CHUNK_AVG=$avg "$AIRLOCK" sync "$D/src" --guest "unix:$W/chunk.sock" --key "$W/hk" \
		--guest-key "$(cat "$W/gk.pub")" --json)
	t3=$(now)
	printf '| %d KiB | %.3f | %.3f | %s |\n' $((avg >> 10)) "$(echo "$t1 - $t0" | bc -l)" "$(echo "$t3 - $t2" | bc -l)" \
		"$(echo "$out" | grep -o '"wire_bytes":[0-9]*' | cut -d: -f2)"
done
