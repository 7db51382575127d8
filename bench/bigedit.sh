#!/usr/bin/env bash
# Large-file edits (doc/SYNC.md "Write ranges": re-hash only the chunks that written ranges
# touched"): overwrite 4 KiB in the middle of one large file through the
# airlock mount and time until the guest has applied it (`airlock sync-wait`,
# which returns when the daemon's applied sequence covers the edit), side by
# side, in one run, with rsync bringing a plain copy up to date after the
# same edit (-I: no quick check by size and mtime): `rsync --inplace --no-whole-file` (its delta algorithm: reads
# the whole file on both ends) and plain `rsync` (whole-file copy, its
# default for local paths).
#
# usage: bench/bigedit.sh BUILD [EDITS] [SIZES_MIB]   (root + /dev/fuse)
#   EDITS      edits per size and tool (default 20)
#   SIZES_MIB  space-separated file sizes in MiB (default "16 256 1024")
# Everything lives in a temp dir under /tmp (tmpfs or disk: say which when quoting).
set -euo pipefail

B=${1:?usage: bench/bigedit.sh BUILD [EDITS] [SIZES_MIB]}
N=${2:-20}
SIZES=${3:-16 256 1024}
AIRLOCK=$(realpath "$B/airlock")
AGENT=$(realpath "$B/airlock-agent")
command -v rsync >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q rsync >/dev/null 2>&1 || true

T=$(mktemp -d /tmp/airlock-big.XXXXXX)
agent_pid=
cleanup() {
	if mountpoint -q "$T/work" 2>/dev/null; then "$AIRLOCK" down "$T/work" >/dev/null 2>&1 || umount -l "$T/work" || true; fi
	[ -n "$agent_pid" ] && kill "$agent_pid" 2>/dev/null && wait "$agent_pid" 2>/dev/null || true
	rm -rf "$T"
}
trap cleanup EXIT
export XDG_STATE_HOME=$T/state

now_us() { date +%s%6N; }
# stats NAME FILE: median and p99 of the microsecond values in FILE
stats() {
	sort -n "$2" | awk -v name="$1" '{ v[NR] = $1 } END {
		m = v[int((NR + 1) / 2)]; p = v[int(NR * 0.99 + 0.999)]; if (p == "") p = v[NR];
		printf "%-34s median %9.2f ms   p99 %9.2f ms   (n=%d)\n", name, m / 1000, p / 1000, NR }'
}
median_of() { sort -n "$1" | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
# edit FILE SIZE I: overwrite 4 KiB at a different place near the middle each time
edit() {
	local off=$(( ($2 / 2) + ($3 * 7919 * 4096) % ($2 / 4) ))
	head -c 4096 /dev/urandom | dd of="$1" bs=4096 seek=$((off / 4096)) conv=notrunc status=none
}

"$AIRLOCK" keygen -o "$T/hk" >"$T/hk.pub"
"$AIRLOCK" keygen -o "$T/gk" >"$T/gk.pub"
mkdir -p "$T/guest" "$T/work"
"$AGENT" --listen "unix:$T/a.sock" --root "$T/guest" --key "$T/gk" --allow "$(cat "$T/hk.pub")" \
	--state "$T/agent.state" --fsync none >"$T/agent.out" 2>&1 &
agent_pid=$!
until grep -q '^ready' "$T/agent.out"; do sleep 0.02; done

echo "# bigedit: $N edits of 4 KiB per file size; $(nproc) CPUs, $(uname -r), /tmp on $(df --output=fstype /tmp | tail -1)"
for mib in $SIZES; do
	size=$((mib * 1048576))
	rm -rf "${T:?}/work/"* "${T:?}/plain" "${T:?}/copy"
	head -c "$size" /dev/urandom >"$T/work/big.bin"
	"$AIRLOCK" up "$T/work" --guest "unix:$T/a.sock" --key "$T/hk" --guest-key "$(cat "$T/gk.pub")" -d >/dev/null
	"$AIRLOCK" sync-wait -C "$T/work" --timeout 600
	: >"$T/al"
	for ((i = 0; i < N; i++)); do
		t0=$(now_us)
		edit "$T/work/big.bin" "$size" "$i"
		"$AIRLOCK" sync-wait -C "$T/work" --timeout 600
		echo $(($(now_us) - t0)) >>"$T/al"
	done
	cmp -s "$T/work/big.bin" "$T/guest/big.bin" || { echo "bigedit: guest copy differs" >&2; exit 1; }
	"$AIRLOCK" down "$T/work" >/dev/null

	# the peers: a plain file and a copy brought up to date after each edit
	cp "$T/work/big.bin" "$T/plain"
	cp "$T/plain" "$T/copy"
	: >"$T/rd"
	: >"$T/rw"
	for ((i = 0; i < N; i++)); do
		t0=$(now_us)
		edit "$T/plain" "$size" "$i"
		rsync -I --inplace --no-whole-file "$T/plain" "$T/copy"
		echo $(($(now_us) - t0)) >>"$T/rd"
		t0=$(now_us)
		edit "$T/plain" "$size" "$((i + N))"
		rsync -I "$T/plain" "$T/copy"
		echo $(($(now_us) - t0)) >>"$T/rw"
	done
	cmp -s "$T/plain" "$T/copy" || { echo "bigedit: rsync copy differs" >&2; exit 1; }
	echo "## ${mib} MiB file"
	stats "airlock (mount -> guest applied)" "$T/al"
	stats "rsync --inplace --no-whole-file" "$T/rd"
	stats "rsync (whole file)" "$T/rw"
	a=$(median_of "$T/al")
	awk -v a="$a" -v d="$(median_of "$T/rd")" -v w="$(median_of "$T/rw")" \
		'BEGIN { printf "ratio (median): rsync delta / airlock %.1fx, rsync whole / airlock %.1fx\n", d / a, w / a }'
done
