#!/bin/bash
# End-to-end channel tests: the real airlock and airlock-agent binaries over
# every transport available here, key and PSK refusals, and a man in the
# middle (tests/harness/forwarder.c) that flips, drops, duplicates, swaps, cuts,
# reflects and replays records.
# usage: chan_e2e.sh AIRLOCK AGENT FORWARDER FC_STANDIN
AIRLOCK=$1 AGENT=$2 FWD=$3 FC=$4
. "$(dirname "$0")/lib.sh"

"$AIRLOCK" keygen -o "$T/host.key" >"$T/host.pub"
"$AIRLOCK" keygen -o "$T/guest.key" >"$T/guest.pub"
"$AIRLOCK" keygen -o "$T/other.key" >"$T/other.pub"
"$AIRLOCK" keygen -o "$T/psk" >/dev/null
"$AIRLOCK" keygen -o "$T/psk2" >/dev/null
HOST=$(cat "$T/host.pub") GUEST=$(cat "$T/guest.pub") OTHER=$(cat "$T/other.pub")
mkdir -p "$T/root"

start_bg agent "$AGENT" --listen "unix:$T/agent.sock" --root "$T/root" --key "$T/guest.key" --allow "$HOST"
AGENT_PID=$BG_PID
wait_line "$T/agent.out" '^ready'

ping_to() { # ping_to ADDR [extra args]: stdout+stderr in $T/ping.log
	local addr=$1
	shift
	# timeout(1) is a backstop: ping has its own --timeout, and a ping that
	# outlives it is itself a bug worth a message.
	timeout -k 5 60 "$AIRLOCK" ping --guest "$addr" --key "$T/host.key" --guest-key "$GUEST" "$@" >"$T/ping.log" 2>&1
	local rc=$?
	[ $rc -ne 124 ] || echo "ping to $addr hung past 60 s: $*" >&2
	return $rc
}

t_unix() { ping_to "unix:$T/agent.sock" -n 20 && grep -q 'rtt over 20 round trips' "$T/ping.log"; }
check "unix transport carries a session" t_unix

t_bulk() { ping_to "unix:$T/agent.sock" -n 1 --bulk 32M && grep -q 'bulk 33554432 bytes' "$T/ping.log"; }
check "bulk transfer through a windowed stream arrives whole" t_bulk

# A flooding stream must not starve small messages on another stream, and
# memory must not grow with the amount of data: round trips run while 256 MiB
# and then 1 GiB flood a bulk stream.
t_flood() {
	ping_to "unix:$T/agent.sock" -n 200 --bulk 256M --concurrent --json || { cat "$T/ping.log"; return 1; }
	local small big
	small=$(grep -o '"max_rss_kb":[0-9]*' "$T/ping.log" | cut -d: -f2)
	# The slowest round trip must be far shorter than the flood itself:
	# without per-stream fairness it would wait behind the whole transfer.
	awk '{ match($0, /"max":[0-9.]+/); mx = substr($0, RSTART + 6, RLENGTH - 6);
	       match($0, /"seconds":[0-9.]+/); s = substr($0, RSTART + 10, RLENGTH - 10);
	       if (mx / 1e6 >= s / 4) { print "slowest round trip " mx " us during a " s " s flood" > "/dev/stderr"; exit 1 } }' \
		"$T/ping.log" || return 1
	ping_to "unix:$T/agent.sock" -n 200 --bulk 1G --concurrent --json || { cat "$T/ping.log"; return 1; }
	big=$(grep -o '"max_rss_kb":[0-9]*' "$T/ping.log" | cut -d: -f2)
	local agent_hwm
	agent_hwm=$(awk '/VmHWM/ { print $2 }' "/proc/$AGENT_PID/status")
	echo "host max RSS: $small kB after 256 MiB, $big kB after 1 GiB; agent VmHWM $agent_hwm kB"
	if sanitized "$AIRLOCK"; then
		return 0 # ASan's quarantine holds freed memory: sizes say nothing here
	fi
	[ $((big - small)) -lt 8192 ] && [ "$agent_hwm" -lt 32768 ]
}
check "a flooding stream leaves small messages prompt and memory bounded on both sides" t_flood

t_wrong_guest_key() {
	! "$AIRLOCK" ping --guest "unix:$T/agent.sock" --key "$T/host.key" --guest-key "$OTHER" >"$T/ping.log" 2>&1 &&
		grep -q 'guest key' "$T/ping.log"
}
check "a wrong guest key is refused, naming the guest key" t_wrong_guest_key

t_unknown_host() {
	! "$AIRLOCK" ping --guest "unix:$T/agent.sock" --key "$T/other.key" --guest-key "$GUEST" >"$T/ping.log" 2>&1 &&
		grep -q 'allow-list' "$T/ping.log"
}
check "an unknown host key is refused, naming the allow-list" t_unknown_host

# PSK: a second agent that requires one
start_bg agentpsk "$AGENT" --listen "unix:$T/psk.sock" --root "$T/root" --key "$T/guest.key" --allow "$HOST" --psk-file "$T/psk"
wait_line "$T/agentpsk.out" '^ready'
t_psk_ok() { ping_to "unix:$T/psk.sock" -n 3 --psk-file "$T/psk"; }
check "matching pre-shared key works" t_psk_ok
t_psk_wrong() { ! ping_to "unix:$T/psk.sock" -n 3 --psk-file "$T/psk2" && grep -q 'pre-shared key' "$T/ping.log"; }
check "a wrong pre-shared key is refused, naming the pre-shared key" t_psk_wrong
t_psk_missing() { ! ping_to "unix:$T/psk.sock" -n 3 && grep -q 'pre-shared key' "$T/ping.log"; }
check "a missing pre-shared key is refused" t_psk_missing

# TCP on an ephemeral port
start_bg agenttcp "$AGENT" --listen "tcp:127.0.0.1:0" --root "$T/root" --key "$T/guest.key" --allow "$HOST"
wait_line "$T/agenttcp.out" '^ready tcp:'
TCPADDR=$(sed -n 's/^ready //p' "$T/agenttcp.out")
t_tcp() { ping_to "$TCPADDR" -n 20; }
check "tcp transport carries a session ($TCPADDR)" t_tcp

# Firecracker-style vsock UDS through the stand-in
start_bg fc "$FC" "$T/fc.sock" 52 "$T/agent.sock"
wait_line "$T/fc.out" 'ready' || true
for _ in $(seq 50); do [ -S "$T/fc.sock" ] && break; sleep 0.02; done
t_fc() { ping_to "fc:$T/fc.sock:52" -n 20; }
check "fc: transport (CONNECT/OK line protocol) carries a session" t_fc
t_fc_badport() { ! ping_to "fc:$T/fc.sock:53" -n 1 --timeout 5; }
check "fc: a port the proxy does not serve is an error" t_fc_badport

# Serial: the agent opens a pty as its 'virtio-serial port'; socat joins the
# pty master to a Unix socket, as qemu's chardev does for a real port.
if command -v socat >/dev/null; then
	start_bg socat socat "PTY,link=$T/vport,raw,echo=0" "UNIX-LISTEN:$T/serial.sock"
	for _ in $(seq 100); do [ -e "$T/vport" ] && [ -S "$T/serial.sock" ] && break; sleep 0.02; done
	start_bg agentser "$AGENT" --listen "serial:$T/vport" --root "$T/root" --key "$T/guest.key" --allow "$HOST"
	wait_line "$T/agentser.out" '^ready'
	t_serial() { ping_to "unix:$T/serial.sock" -n 20 --timeout 10; }
	check "serial transport (pty as the port) carries a session" t_serial
else
	skip "serial transport: socat not installed"
fi

# vsock: needs AF_VSOCK and a way to reach ourselves (CID 1, vsock_loopback).
# Without the loopback transport a connect would go to the hypervisor, so
# none is attempted.
if [ -e /dev/vsock ] && [ -d /sys/module/vsock_loopback ]; then
	VPORT=$((20000 + RANDOM % 20000))
	start_bg agentvs "$AGENT" --listen "vsock:any:$VPORT" --root "$T/root" --key "$T/guest.key" --allow "$HOST"
	if wait_line "$T/agentvs.out" '^ready' 3 2>/dev/null; then
		if ping_to "vsock:1:$VPORT" -n 5 --timeout 5; then
			ok "vsock transport carries a session"
		elif grep -q 'vsock:1' "$T/ping.log" && ! grep -qiE 'handshake|refused the' "$T/ping.log"; then
			skip "vsock: the agent listens, but this host cannot connect to itself ($(tail -1 "$T/ping.log"))"
		else
			not_ok "vsock transport carries a session"
			cat "$T/ping.log"
		fi
	else
		skip "vsock: cannot listen ($(tail -1 "$T/agentvs.err"))"
	fi
else
	skip "vsock: no vsock loopback on this host (/dev/vsock or the vsock_loopback module missing)"
fi

# ---- man in the middle ----
# Every fault must end the session with a channel-level error, never let a
# damaged, reordered or replayed frame reach the application (ping checks
# every PONG's order and bytes and would say "out of order" or "differs").
n=0
mitm() { # mitm FAULT: expect failure with a channel error
	local fault=$1
	n=$((n + 1))
	local sock="$T/mitm$n.sock" out="$T/fwd$n.out"
	timeout -k 5 60 "$FWD" "$sock" "$T/agent.sock" "$fault" >"$out" 2>"$T/fwd.err" &
	local fpid=$!
	PIDS+=("$fpid")
	wait_line "$out" '^ready' 5 || return 1
	local t0=$SECONDS
	if ping_to "unix:$sock" -n 40 --window 8 --timeout 2; then
		echo "fault $fault: session succeeded" >&2
		kill "$fpid" 2>/dev/null || true
		return 1
	fi
	kill "$fpid" 2>/dev/null || true
	wait "$fpid" 2>/dev/null || true
	if [ $((SECONDS - t0)) -ge 2 ]; then
		echo "fault $fault: detected only by the client's timeout ($(tail -1 "$T/ping.log"))" >&2
	fi
	if ! kill -0 "$AGENT_PID" 2>/dev/null; then
		echo "fault $fault: the agent died" >&2
		return 1
	fi
	if grep -qE 'malformed PONG|out of order|payload differs|unexpected frame|guest received' "$T/ping.log"; then
		echo "fault $fault leaked to the application:" >&2
		cat "$T/ping.log" >&2
		return 1
	fi
	return 0
}

t_mitm_clean() {
	"$FWD" "$T/clean.sock" "$T/agent.sock" none >"$T/clean.out" 2>&1 &
	PIDS+=("$!")
	wait_line "$T/clean.out" '^ready' 5 && ping_to "unix:$T/clean.sock" -n 40 --window 8 --timeout 4
}
check "forwarder without a fault passes the session" t_mitm_clean

# Records c2s: 0 msg1, 1 header, 2 HELLO, 3.. PINGs, last BYE.
# Records s2c: 0 msg2, 1 header, 2 HELLO_OK, 3.. PONGs, last BYE.
faults_failed=0
for dir in c2s s2c; do
	for rec in 0 1 2 3 9 20 42; do
		for bit in 0 7 26 31 32 40 63 100 150 199; do
			mitm "flip:$dir:$rec:$bit" || { faults_failed=1; echo "flip:$dir:$rec:$bit not detected" >&2; }
		done
	done
done
check "a flipped bit at any offset is detected (140 cases)" test $faults_failed -eq 0

for kind in drop dup swap reflect cut; do
	faults_failed=0
	for dir in c2s s2c; do
		for rec in 0 1 2 3 10 30 42; do
			mitm "$kind:$dir:$rec" || { faults_failed=1; echo "$kind:$dir:$rec not detected" >&2; }
		done
	done
	check "$kind of a record is detected in both directions" test $faults_failed -eq 0
done

faults_failed=0
for dir in c2s s2c; do
	for rec in 0 1 2 5 42; do
		for cut in 1 3 4 5 20; do
			mitm "cutmid:$dir:$rec:$cut" || { faults_failed=1; echo "cutmid:$dir:$rec:$cut not detected" >&2; }
		done
	done
done
check "truncation inside a record is detected" test $faults_failed -eq 0

# Replay of a first handshake message: captured from a good session, sent
# again to the same agent: refused with WIRE_REFUSE_REPLAY (4).
t_replay() {
	"$FWD" "$T/rec.sock" "$T/agent.sock" none --save-msg1 "$T/msg1" >"$T/rec.out" 2>&1 &
	PIDS+=("$!")
	wait_line "$T/rec.out" '^ready' 5 && ping_to "unix:$T/rec.sock" -n 2 || { cat "$T/ping.log"; return 1; }
	local got
	got=$("$FWD" --replay "$T/msg1" "$T/agent.sock")
	[ "$got" = "refused 4" ] || { echo "replay answered: $got" >&2; tail -3 "$T/agent.err" >&2; return 1; }
}
check "a replayed first handshake message is refused" t_replay

t_agent_alive() { kill -0 "$AGENT_PID" && ping_to "unix:$T/agent.sock" -n 5; }
check "the agent survived every fault and still serves" t_agent_alive

finish
