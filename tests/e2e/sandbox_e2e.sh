#!/usr/bin/env bash
# The embedded local sandbox end to end (doc/SANDBOX.md): `airlock up DIR`
# with no --guest, then commands through `airlock exec` probe the boundary:
# the host's home and processes are out of sight, writes outside the
# workspace copy, /tmp and the home fail, no network (host loopback, host
# addresses, a public address, DNS), uid 1000 with no capabilities, seccomp
# and Landlock, PID 1 cannot be signalled from inside; state survives down
# and up, --destroy removes it; each sandbox has its own host uid; limits
# (processes, memory, /tmp, file size) hold and a fork bomb or a memory bomb
# in one sandbox leaves another and the host responsive; sparse files stay
# sparse; the idle TTL stops and restarts the agent; and the sandbox starts
# for an ordinary user (nobody) too.
# usage: sandbox_e2e.sh AIRLOCK AIRLOCK_AGENT SANDBOX_HARNESS   (root + /dev/fuse, else skipped: exit 77)
# shellcheck source=tests/e2e/lib.sh
source "$(dirname "$0")/lib.sh"

AIRLOCK=$1
AGENT=$2
HARNESS=$3
if [ "$(id -u)" != 0 ] || [ ! -c /dev/fuse ]; then
	echo "skip - sandbox_e2e needs root and /dev/fuse (uid $(id -u), /dev/fuse $([ -c /dev/fuse ] && echo present || echo missing))"
	exit 77
fi
if ! unshare -U true 2>/dev/null; then
	echo "skip - sandbox_e2e: this machine does not allow user namespaces (unshare -U fails)"
	exit 77
fi
export XDG_STATE_HOME=$T/state
export XDG_DATA_HOME=$T/data
export AIRLOCK_SOCKET=$T/relay.sock
export HOME=$T/hosthome
TO="timeout -k 2"
W=$T/work
mkdir -p "$W/src" "$HOME"
echo "hello from the workspace" >"$W/README"
printf 'node_modules/\n' >"$W/.gitignore" # guest-owned: what npm install makes in the sandbox
CANARY=host-home-canary-$$
echo "$CANARY" >"$HOME/canary"
ROOT_CANARY=/root/.airlock-sandbox-canary-$$
echo "$CANARY" >"$ROOT_CANARY"
EXTRA_CLEANUP() {
	rm -f "$ROOT_CANARY"
	"$AIRLOCK" down "$W" >/dev/null 2>&1 || true
}
trap 'EXTRA_CLEANUP; cleanup' EXIT

up() {
	start_bg up "$AIRLOCK" up "$W" "$@"
	UP_PID=$BG_PID
	wait_line "$T/up.out" "^airlock: $W in sync with sandbox local\$" 20
}
down() {
	"$AIRLOCK" down "$W" "$@" >"$T/down.out" 2>&1 || { cat "$T/down.out" >&2; return 1; }
	wait "$UP_PID" 2>/dev/null || true
}
X() { $TO 20 "$AIRLOCK" exec -C "$W" "$@" </dev/null; }
# until SECONDS CMD...: poll CMD every 50 ms until it succeeds; fail after
# SECONDS (a loaded machine is slow, but not that slow)
until_ok() {
	local secs=$1 i
	shift
	for ((i = 0; i < secs * 20; i++)); do
		"$@" && return 0
		sleep 0.05
	done
	return 1
}
agent_pid() { pgrep -f "airlock-agent .*--root $W --key"; }
no_agent() { ! agent_pid >/dev/null; }
idle_stopped() { "$AIRLOCK" status -C "$W" --json | grep -q '"sandbox_state":"idle-stopped"'; }

up
SB_DIR=$(sed -n 's/^airlock: sandbox started .*; state in //p' "$T/up.err")

SB_UID=$(cat "$SB_DIR/uid" 2>/dev/null || true)
t_started() {
	[ -n "$SB_DIR" ] && [ -d "$SB_DIR/workspace" ] && [ -n "$SB_UID" ] &&
		[ "$(stat -c %u:%g "$SB_DIR/workspace")" = "$SB_UID:$SB_UID" ] &&
		[ "$(stat -c %a "$SB_DIR/keys/host.key")" = 600 ] &&
		"$AIRLOCK" status -C "$W" | grep -q "^sandbox     local, running (local: user+mount+pid+ipc+uts+net namespaces (uid 1000 inside = uid $SB_UID outside)"
}
check "up without --guest starts the local sandbox (state dir, copy owned by its own uid, 0600 keys, status)" t_started

# A second sandbox (another workspace) beside the first: started by the
# harness, stopped when its stdin closes.
W2=$T/work2
mkdir -p "$W2"
B_IN=
start_b() {
	mkfifo "$T/b.in"
	"$HARNESS" "$W2" "$AGENT" <"$T/b.in" >"$T/b.out" 2>"$T/b.err" &
	B_PID=$!
	PIDS+=("$B_PID")
	exec {B_IN}>"$T/b.in"
	wait_line "$T/b.out" '^ready$' 20 || { cat "$T/b.err" >&2; return 1; }
	B_DIR=$(sed -n 's/^dir //p' "$T/b.out")
}
stop_b() {
	exec {B_IN}>&-
	wait "$B_PID" 2>/dev/null
	rm -f "$T/b.in"
}

t_uids() {
	local b_uid pid u
	start_b || return 1
	b_uid=$(cat "$B_DIR/uid") || return 1
	grep -q "uid 1000 inside = uid $b_uid outside" "$T/b.out" || { cat "$T/b.out" >&2; return 1; }
	# each its own, from the range, named by no passwd or group entry
	[ "$SB_UID" != "$b_uid" ] && [ "$SB_UID" != 65534 ] && [ "$b_uid" != 65534 ] || return 1
	for u in "$SB_UID" "$b_uid"; do
		[ "$u" -ge 1610612736 ] && [ "$u" -le 1610678271 ] && ! getent passwd "$u" && ! getent group "$u" ||
			{ echo "uid $u: not a free uid of the range" >&2; return 1; }
	done
	[ "$(stat -c %u "$B_DIR/workspace")" = "$b_uid" ] || return 1
	# the agents run as them outside
	pid=$(agent_pid) && [ "$(awk '/^Uid:/ {print $2}' "/proc/$pid/status")" = "$SB_UID" ] || return 1
	pid=$(pgrep -f "airlock-agent .*--root $W2 --key") &&
		[ "$(awk '/^Uid:/ {print $2}' "/proc/$pid/status")" = "$b_uid" ] || return 1
	stop_b
	# kept across a restart
	start_b && [ "$(cat "$B_DIR/uid")" = "$b_uid" ] && grep -q "= uid $b_uid outside" "$T/b.out" || return 1
	stop_b
}
check "two sandboxes have distinct host uids of their own (not nobody), kept across a restart" t_uids

t_same_path() {
	[ "$(X -- pwd)" = "$W" ] && [ "$(X -- cat README)" = "hello from the workspace" ] &&
		[ "$(X -- sh -c 'echo $HOME')" = /home/airlock ] && [ "$(X -- hostname)" = airlock ] &&
		[ "$(X -- sh -c 'echo $(id -un) $(getent passwd 1000 | cut -d: -f6)')" = "airlock /home/airlock" ]
}
check "the workspace copy is at the host's path; HOME /home/airlock, user airlock; hostname airlock" t_same_path

t_home_hidden() {
	local out
	out=$(X -- sh -c "cat '$HOME/canary' $ROOT_CANARY 2>&1; ls /root 2>&1; grep -r '$CANARY' /home /tmp /airlock 2>/dev/null | head -1") || true
	! grep -q "^$CANARY" <<<"$out" || { echo "canary read: $out" >&2; return 1; }
	grep -q "No such file" <<<"$out"
}
check "a canary in the host's \$HOME and in /root is not readable (not there at all)" t_home_hidden

t_procs_hidden() {
	local sp out
	sleep 300 &
	sp=$!
	PIDS+=("$sp")
	[ -e "/proc/$sp" ] || return 1
	out=$(X -- sh -c "test -e /proc/$sp && echo visible; echo n=\$(ps -e -o pid= | wc -l); ps -e -o comm= | tr '\n' ' '")
	kill "$sp"
	! grep -q visible <<<"$out" || { echo "host pid $sp visible" >&2; return 1; }
	# the agent (PID 1), sh, ps, wc (and tr): nothing of the host
	grep -qE '^n=[1-5]$' <<<"$out" && ! grep -q sleep <<<"$out" || { echo "processes: $out" >&2; return 1; }
	[ "$(X -- sh -c 'ps -o comm= -p 1')" = airlock-agent ]
}
check "host processes are not visible; PID 1 is the agent" t_procs_hidden

t_writes() {
	local p
	for p in /usr/airlock-x /etc/airlock-x /airlock-x /home/airlock-x /opt/airlock-x; do
		if X -- sh -c "echo x >$p" 2>/dev/null; then
			echo "wrote $p" >&2
			return 1
		fi
		[ ! -e "$p" ] || { echo "$p appeared on the host" >&2; return 1; }
	done
	X -- sh -c 'echo x >/tmp/inside-tmp && echo x >$HOME/inside-home && echo x >inside-ws' &&
		[ ! -e /tmp/inside-tmp ] && [ ! -e "$HOME/inside-home" ]
}
check "writes to /usr, /etc, /, /home, /opt fail; /tmp and the home stay in the sandbox" t_writes

t_identity() {
	local out
	out=$(X -- sh -c 'id -u; id -g; grep ^CapEff /proc/self/status; grep ^CapPrm /proc/self/status; grep ^NoNewPrivs /proc/self/status')
	grep -qx 1000 <<<"$(sed -n 1p <<<"$out")" && grep -q 'CapEff:[[:space:]]*0000000000000000' <<<"$out" &&
		grep -q 'CapPrm:[[:space:]]*0000000000000000' <<<"$out" && grep -q 'NoNewPrivs:[[:space:]]*1' <<<"$out" ||
		{ echo "$out" >&2; return 1; }
}
check "commands run as uid 1000 with no capabilities and no_new_privs" t_identity

t_seccomp() {
	local out
	out=$(X -- sh -c 'unshare -U true 2>&1; echo rc=$?')
	grep -q 'rc=1' <<<"$out" && grep -qi 'not permitted' <<<"$out" || { echo "$out" >&2; return 1; }
	out=$(X -- python3 -c 'import ctypes; l = ctypes.CDLL(None, use_errno=True); print(l.ptrace(16, 1, 0, 0), ctypes.get_errno())')
	[ "$out" = "-1 1" ] || { echo "ptrace: $out" >&2; return 1; }
	# vsock ignores network namespaces: refused like a family the kernel lacks
	out=$(X -- python3 -c '
import socket
for fam in ("AF_VSOCK", "AF_PACKET", "AF_INET"):
    try:
        socket.socket(getattr(socket, fam), socket.SOCK_DGRAM if fam == "AF_PACKET" else socket.SOCK_STREAM).close()
        print(fam, "ok")
    except OSError as e:
        print(fam, e.errno)
')
	[ "$out" = "$(printf 'AF_VSOCK 97\nAF_PACKET 97\nAF_INET ok')" ] || { echo "sockets: $out" >&2; return 1; }
}
check "seccomp: unshare -U and ptrace fail with EPERM; vsock and packet sockets with EAFNOSUPPORT" t_seccomp

t_landlock() {
	local out
	out=$(X -- sh -c 'echo x >/airlock/state/x 2>&1; echo w=$?; cat /airlock/keys/guest.key 2>&1; echo r=$?; ls /airlock/run')
	grep -q 'w=2' <<<"$out" && grep -q 'r=1' <<<"$out" && grep -q 'agent.sock' <<<"$out" &&
		[ ! -e "$SB_DIR/agent/x" ] || { echo "$out" >&2; return 1; }
}
check "landlock: the agent's state is not writable, its key not readable (names are)" t_landlock

t_pid1() {
	local out pid
	pid=$(agent_pid) || return 1
	out=$(X -- sh -c 'kill -TERM 1 2>&1; kill -KILL 1 2>&1; cat /proc/1/environ 2>&1 | wc -c')
	# a dead agent would be started again and the next command run in the
	# new one: the agent's pid is what must not change
	[ "$(X -- echo alive)" = alive ] && [ "$(agent_pid)" = "$pid" ] || { echo "$out" >&2; return 1; }
	grep -q 'denied\|not permitted' <<<"$out"
}
check "PID 1 (the agent) survives kill -TERM/-KILL from a command; its environ is unreadable" t_pid1

t_strays() {
	local out
	local n=7$$ # unique on this machine while we run
	X -- sh -c "setsid sleep $n </dev/null >/dev/null 2>&1 & until pgrep -xf 'sleep $n' >/dev/null; do sleep 0.01; done" ||
		return 1
	agent_pid >/dev/null || return 1
	# the sweep follows the command's exit; the stray is gone soon after
	until_ok 10 eval '! pgrep -xf "sleep $n" >/dev/null' ||
		{ echo "a setsid stray survived: $(pgrep -af "sleep $n")" >&2; return 1; }
	# and orphans are reaped: the orphan (reparented to PID 1) writes its pid
	# and exits; PID 1 must reap it, so its /proc entry goes away (bounded
	# wait), and no zombie is left
	out=$(X -- sh -c '(sh -c "echo \$\$ >/tmp/orphan.pid; exit 3" &)
		until [ -s /tmp/orphan.pid ]; do sleep 0.01; done
		p=$(cat /tmp/orphan.pid)
		for i in $(seq 200); do [ -e /proc/$p ] || break; sleep 0.05; done
		grep -l "^State:.*Z" /proc/[0-9]*/status 2>/dev/null | wc -l')
	[ "$out" = 0 ] || { echo "zombies: $out" >&2; return 1; }
}
check "a setsid stray dies with the last command; PID 1 reaps orphans" t_strays

t_network() {
	local port out ips
	port=$((20000 + RANDOM % 20000))
	python3 -m http.server --bind 127.0.0.1 "$port" >/dev/null 2>&1 &
	PIDS+=("$!")
	for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$port/" && break; sleep 0.05; done
	curl -s -o /dev/null "http://127.0.0.1:$port/" || { echo "host http server did not start" >&2; return 1; }
	ips=$(hostname -I 2>/dev/null || true)
	cat >"$W/probe.py" <<'EOF'
import socket, sys
port = int(sys.argv[1])
targets = [("127.0.0.1", port), ("1.1.1.1", 80), ("8.8.8.8", 53)] + [(ip, port) for ip in sys.argv[2:]]
for host, p in targets:
    try:
        socket.create_connection((host, p), timeout=2).close()
        print("CONNECTED", host, p)
    except OSError as e:
        print("refused", host, p, e.errno)
try:
    print("RESOLVED", socket.getaddrinfo("example.com", 80))
except OSError as e:
    print("dns failed", e)
EOF
	# shellcheck disable=SC2086
	out=$(X -- python3 probe.py "$port" $ips 2>&1) || true
	rm -f "$W/probe.py"
	echo "$out" | sed 's/^/    /'
	! grep -q 'CONNECTED\|RESOLVED' <<<"$out" && grep -q 'dns failed' <<<"$out" &&
		[ "$(grep -c '^refused' <<<"$out")" -ge 3 ] || return 1
	out=$(X -- sh -c 'getent hosts example.com; echo rc=$?; ip -o link 2>/dev/null | grep -v " lo:" | wc -l')
	grep -q 'rc=2' <<<"$out" && [ "$(tail -1 <<<"$out")" = 0 ] || { echo "$out" >&2; return 1; }
}
check "no network: host loopback server, host addresses, public addresses and DNS all fail; only lo" t_network

t_agent_killed() {
	local pid
	pid=$(pgrep -f "airlock-agent .*--root $W --key") || return 1
	kill -KILL "$pid"
	# once the daemon saw the session end, the next command waits for the
	# sandbox's restart (or runs in it, if that was quicker)
	wait_line "$T/up.err" 'lost|closed the session' 10 || return 1
	[ "$(X -- echo back)" = back ] || { tail -5 "$T/up.err" >&2; return 1; }
	grep -q "the sandbox's agent is gone; starting it again" "$T/up.err" &&
		[ "$(pgrep -f "airlock-agent .*--root $W --key")" != "$pid" ]
}
check "an agent killed from the host is started again; the next command waits for it and runs" t_agent_killed

t_sync() {
	local i
	for i in 1 2 3; do
		echo "edit $i" >"$W/src/edited.txt"
		[ "$(X -- cat src/edited.txt)" = "edit $i" ] || return 1
	done
}
check "an edit through the mount is seen by the next command" t_sync

t_sparse() {
	local blocks
	truncate -s 1G "$W/sparse.img"
	printf 'tail' | dd of="$W/sparse.img" bs=1 seek=$((512 << 20)) conv=notrunc status=none
	[ "$(X -- stat -c %s sparse.img)" = 1073741824 ] && [ "$(X -- tail -c +$(((512 << 20) + 1)) sparse.img | head -c 4)" = tail ] ||
		return 1
	# blocks of 512 bytes the copy occupies on the host's disk: a few KiB, not 1 GiB
	blocks=$(stat -c %b "$SB_DIR/workspace/sparse.img")
	echo "    1 GiB sparse file: $blocks blocks of 512 bytes in the copy"
	rm -f "$W/sparse.img"
	[ "$blocks" -le 64 ]
}
check "a 1 GiB sparse file stays sparse in the copy (about 0 real blocks)" t_sparse

t_persist() {
	X -- sh -c 'mkdir -p node_modules/pkg && echo installed >node_modules/pkg/index.js && echo dot >$HOME/.cache-x' &&
		[ ! -e "$W/node_modules" ] || return 1
	down && up && [ "$(X -- cat node_modules/pkg/index.js)" = installed ] && [ "$(X -- sh -c 'cat $HOME/.cache-x')" = dot ]
}
check "node_modules made in the sandbox (outside the synced paths) and the home survive down and up" t_persist

t_destroy() {
	local out
	out=$("$AIRLOCK" down "$W" --destroy 2>&1) || true
	wait "$UP_PID" 2>/dev/null || true
	[ ! -e "$SB_DIR" ] || { echo "$SB_DIR still there: $out" >&2; return 1; }
	up && [ -z "$(X -- sh -c 'ls node_modules 2>/dev/null')" ] && [ "$(X -- cat README)" = "hello from the workspace" ]
}
check "down --destroy removes the sandbox's state; the next up starts fresh" t_destroy

# The host's saved state about the guest's copy (confirmed manifest, the
# changes waiting) must not outlive the copy: after --destroy, and after
# the copy was removed by hand while airlock was down, the next up fills
# the new copy with every file (doc/SYNC.md "Generations").
same_copy() { # the guest's listing and contents of dz/ are the host's
	$TO 30 "$AIRLOCK" sync-wait -C "$W" >/dev/null &&
		[ "$(X -- sh -c 'cd dz && find . | sort && cat a b c')" = "$(cd "$W/dz" && find . | sort && cat a b c)" ] ||
		{ echo "guest: $(X -- sh -c 'find dz | sort' 2>&1 | tr '\n' ' ')" >&2; return 1; }
}
t_destroy_refills() {
	mkdir -p "$W/dz/sub" && echo a >"$W/dz/a" && echo b >"$W/dz/b" && echo c >"$W/dz/c" && echo s >"$W/dz/sub/s"
	same_copy || return 1
	X -- sh -c 'rm dz/a && echo guest >dz/b' && "$AIRLOCK" changes -C "$W" | grep -q '^D dz/a' || return 1
	down --destroy && up && same_copy || return 1
	! "$AIRLOCK" changes -C "$W" | grep -q 'dz/' || { echo "changes of the destroyed copy are still listed" >&2; return 1; }
	down && rm -rf "$SB_DIR/workspace" && up && same_copy
}
check "after down --destroy, and after the copy was removed by hand, the next up fills the new copy" t_destroy_refills

t_destroy_busy() {
	# the state of a running sandbox is not removed from under it
	! "$HARNESS" "$W" "$AGENT" </dev/null >/dev/null 2>"$T/busy.err" && grep -q 'already running' "$T/busy.err"
}
check "a second sandbox for a running one's workspace is refused" t_destroy_busy
down

# ---- limits (doc/SANDBOX.md, "Limits"): small ones, so bombs hit them fast ----
LIM_PIDS=256
echo "{ \"sandbox\": { \"limits\": { \"pids\": $LIM_PIDS, \"memory\": \"256M\", \"tmp\": \"64M\", \"workspace\": \"512M\" } } }" >"$T/limits.json"
up --policy "$T/limits.json"

# cg_file CONTROLLER FILE: FILE of the agent's cgroup that carries
# CONTROLLER (pids | memory), on v1 or v2
cg_file() {
	local pid line rel m
	pid=$(agent_pid) || return 1
	if line=$(grep -E "^[0-9]+:([^:]*,)?$1(,[^:]*)?:" "/proc/$pid/cgroup"); then
		rel=${line#*:*:}
		for m in /sys/fs/cgroup/$1 /sys/fs/cgroup/*,"$1" /sys/fs/cgroup/"$1",*; do
			[ -e "$m$rel/$2" ] && { echo "$m$rel/$2"; return 0; }
		done
	fi
	rel=$(sed -n 's/^0:://p' "/proc/$pid/cgroup")
	for m in /sys/fs/cgroup /sys/fs/cgroup/unified; do
		[ -e "$m$rel/$2" ] && { echo "$m$rel/$2"; return 0; }
	done
	return 1
}

t_limits() {
	local out f
	local nproc=$LIM_PIDS st
	st=$("$AIRLOCK" status -C "$W")
	# with a pids cgroup, RLIMIT_NPROC is a backstop at twice the limit
	! grep -q "limits: $LIM_PIDS pids (cgroup)" <<<"$st" || nproc=$((2 * LIM_PIDS))
	out=$(X -- sh -c 'grep -E "^Max (processes|core file size|file size)" /proc/self/limits; df -k /tmp | tail -1')
	echo "$out" | sed 's/^/    /'
	grep -qE "^Max processes +$nproc +$nproc " <<<"$out" && grep -qE '^Max core file size +0 +0 ' <<<"$out" &&
		grep -qE '^Max file size +536870912 +536870912 ' <<<"$out" && grep -qE ' 65536 +[0-9]+ +[0-9]+ ' <<<"$out" ||
		return 1
	# /tmp is full at its size, not at half the host's RAM
	out=$(X -- sh -c 'head -c 100M /dev/zero 2>&1 >/tmp/big; echo rc=$?; rm -f /tmp/big')
	grep -q 'No space left' <<<"$out" && grep -q 'rc=1' <<<"$out" || { echo "$out" >&2; return 1; }
	# a file past the size limit
	out=$(X -- sh -c 'head -c 600M /dev/zero >big.bin; echo rc=$?; stat -c %s big.bin; rm -f big.bin')
	grep -qE 'File too large|rc=153' <<<"$out" && grep -qx 536870912 <<<"$out" || { echo "$out" >&2; return 1; }
	# the whole sandbox in one cgroup with the limits, where the host has one
	grep -q "limits: $LIM_PIDS pids (\(cgroup\|rlimit\)), memory 256 MiB" <<<"$st" || { echo "$st" >&2; return 1; }
	if f=$(cg_file pids pids.max); then
		echo "    $f: $(cat "$f")"
		[ "$(cat "$f")" = "$LIM_PIDS" ] || return 1
		f=$(cg_file memory memory.max || cg_file memory memory.limit_in_bytes) && [ "$(cat "$f")" = $((256 << 20)) ] ||
			return 1
	else
		echo "    no pids cgroup on this host: rlimits only"
	fi
}
check "limits from sandbox.limits: pids (cgroup + RLIMIT_NPROC), memory, /tmp size, file size, no core dumps" t_limits

# Sandbox B: a second airlock up, with its own relay socket.
BX() { AIRLOCK_SOCKET=$T/relayB.sock $TO 20 "$AIRLOCK" exec -C "$W2" "$@" </dev/null; }
up_b() {
	AIRLOCK_SOCKET=$T/relayB.sock start_bg upb "$AIRLOCK" up "$W2"
	UPB_PID=$BG_PID
	wait_line "$T/upb.out" "^airlock: $W2 in sync with sandbox local\$" 20
}
down_b() {
	AIRLOCK_SOCKET=$T/relayB.sock "$AIRLOCK" down "$W2" >/dev/null 2>&1 || true
	wait "$UPB_PID" 2>/dev/null || true
}
# responsive SECONDS: sandbox B runs a command and the host runs one, both
# within SECONDS
responsive() {
	local t0 t1
	t0=$(date +%s%N)
	BX -- true || { echo "sandbox B did not answer" >&2; return 1; }
	timeout "$1" sh -c 'ls / >/dev/null' || { echo "the host did not answer" >&2; return 1; }
	t1=$(date +%s%N)
	echo "    B and the host answered in $(((t1 - t0) / 1000000)) ms"
	[ $(((t1 - t0) / 1000000)) -lt $(($1 * 1000)) ]
}

t_fork_bomb() {
	local bomb_pid rc=0 f hit=
	# only with a process limit in force: never an unbounded bomb
	X -- grep -qE "^Max processes +($LIM_PIDS|$((2 * LIM_PIDS))) " /proc/self/limits ||
		{ echo "no process limit: not bombing" >&2; return 1; }
	up_b || return 1
	f=$(cg_file pids pids.events) || f=
	X --timeout 6 -- sh -c 'b() { b | b & }; b 2>/dev/null; exec sleep 10' >/dev/null 2>&1 &
	bomb_pid=$!
	sleep 2
	responsive 10 || rc=1
	if [ -n "$f" ]; then
		hit=$(sed -n 's/^max //p' "$f")
		echo "    $f: max $hit"
		[ "${hit:-0}" -gt 0 ] || rc=1
	fi
	wait "$bomb_pid" || true
	# A recovers once the bomb's command ended (its group killed, strays swept)
	until_ok 20 eval '[ "$(X -- echo back 2>/dev/null)" = back ]' || { echo "A did not recover" >&2; rc=1; }
	return $rc
}
check "a fork bomb in sandbox A hits its pids limit; sandbox B and the host answer; A recovers" t_fork_bomb

t_memory_bomb() {
	local rc=0 pid out
	pid=$(agent_pid) || return 1
	out=$(X -- python3 -c '
a = []
while True:
    a.append(b"x" * (32 << 20))
' 2>&1) && return 1 || rc=$?
	echo "    memory bomb: exit $rc $(tail -1 <<<"$out")"
	# the OOM killer (cgroup) kills it, or it gets MemoryError (RLIMIT_DATA)
	[ "$rc" = 137 ] || grep -q MemoryError <<<"$out" || return 1
	responsive 10 || return 1
	[ "$(agent_pid)" = "$pid" ] && [ "$(X -- echo back)" = back ]
}
check "a memory bomb in sandbox A is killed at its memory limit; B and the host answer; A's agent lives on" t_memory_bomb
down_b
down

t_ttl() {
	echo '{ "workspace": { "ttl_seconds": 2 } }' >"$T/ttl.json"
	up --policy "$T/ttl.json"
	"$AIRLOCK" status -C "$W" | grep -q '^idle ttl    2 s' || return 1
	[ "$(X -- echo one)" = one ] || return 1
	# the daemon logs the stop, closes the session, then stops the agent and
	# only then says idle-stopped (a moment later, or longer on a loaded
	# machine): from then on no agent runs
	wait_line "$T/up.err" 'stopping the sandbox' 10 || return 1
	until_ok 10 idle_stopped || { "$AIRLOCK" status -C "$W" --json >&2; return 1; }
	no_agent || { echo "idle-stopped, but the agent still runs" >&2; return 1; }
	# a command starts it again and waits for it
	[ "$(X -- echo two)" = two ] || { cat "$T/up.err" >&2; return 1; }
	"$AIRLOCK" status -C "$W" --json | grep -q '"sandbox_state":"running"' || return 1
	# so does an edit through the mount
	until_ok 10 eval '[ "$(grep -c "stopping the sandbox" "$T/up.err")" = 2 ]' || { cat "$T/up.err" >&2; return 1; }
	until_ok 10 idle_stopped || { "$AIRLOCK" status -C "$W" --json >&2; return 1; }
	no_agent || { echo "idle-stopped, but the agent still runs" >&2; return 1; }
	echo "while idle" >"$W/idle.txt"
	until_ok 10 eval '"$AIRLOCK" status -C "$W" --json | grep -q "\"sandbox_state\":\"running\""' ||
		{ "$AIRLOCK" status -C "$W" --json >&2; return 1; }
	[ "$(X -- cat idle.txt)" = "while idle" ]
}
check "idle TTL (ttl_seconds 2): the agent stops, a command or an edit starts it again" t_ttl
down

t_nobody() {
	local d=$T/nobody hpid hin
	mkdir -p "$d/ws"
	chown -R 65534:65534 "$d"
	chmod 711 "$T"
	# the harness runs until its stdin closes: a fifo this shell holds open
	mkfifo "$d/in"
	setpriv --reuid 65534 --regid 65534 --clear-groups env -i HOME="$d" XDG_DATA_HOME="$d/data" \
		"$HARNESS" "$d/ws" "$AGENT" <"$d/in" >"$d/out" 2>"$d/err" &
	hpid=$!
	PIDS+=("$hpid")
	exec {hin}>"$d/in"
	nobody_ping "$d"
	local rc=$?
	exec {hin}>&- # the harness stops the sandbox and exits 0
	wait "$hpid" || { cat "$d/err" >&2; return 1; }
	[ "$rc" = 0 ] && [ "$(stat -c %U "$d/data/airlock/sandboxes")" = nobody ]
}
nobody_ping() {
	local d=$1 out addr key guest
	wait_line "$d/out" '^ready$' 20 || { cat "$d/err" >&2; return 1; }
	addr=$(sed -n 's/^address //p' "$d/out")
	key=$(sed -n 's/^hostkey //p' "$d/out")
	guest=$(sed -n 's/^guest //p' "$d/out")
	grep -q 'uid 1000 inside = you outside' "$d/out" || return 1
	out=$(setpriv --reuid 65534 --regid 65534 --clear-groups "$AIRLOCK" ping --guest "$addr" --key "$key" \
		--guest-key "$guest" -n 20 2>&1) || { echo "$out" >&2; return 1; }
	echo "$out" | sed 's/^/    /'
}
check "an ordinary user (nobody) starts the sandbox; airlock ping reaches its agent" t_nobody

t_userns_off() {
	# user.max_user_namespaces is per user namespace: 0 inside a nested one
	# disables them for what runs there, without touching the machine's setting
	mkdir -p "$T/nsws"
	! unshare -Ur sh -c "echo 0 >/proc/sys/user/max_user_namespaces && XDG_DATA_HOME=$T/nsdata \"$HARNESS\" $T/nsws $AGENT" \
		</dev/null >/dev/null 2>"$T/ns.err" || return 1
	cat "$T/ns.err"
	grep -q "user namespaces are disabled (user.max_user_namespaces=0; enable with: sysctl -w user.max_user_namespaces=" "$T/ns.err"
}
check "with user namespaces disabled, the start fails naming the sysctl to change" t_userns_off

t_args() {
	local rc
	rc=0; "$AIRLOCK" up "$W" --guest "unix:$T/x.sock" --sandbox local 2>"$T/a.err" || rc=$?
	[ "$rc" = 2 ] && grep -q 'exclude each other' "$T/a.err" || return 1
	rc=0; "$AIRLOCK" up "$W" --sandbox bogus 2>"$T/a.err" || rc=$?
	[ "$rc" = 2 ] && grep -q "'bogus': expected local or vm" "$T/a.err" || return 1
	rc=0; "$AIRLOCK" up "$W" --key "$T/nokey" 2>"$T/a.err" || rc=$?
	[ "$rc" = 2 ] && grep -q 'the sandbox makes and pins its own keys' "$T/a.err" || return 1
	mount | grep -q " $W " && return 1
	return 0
}
check "up: --guest with --sandbox, an unknown kind, --key without --guest are refused (exit 2)" t_args

finish
