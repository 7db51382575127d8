#!/usr/bin/env bash
# Egress through the channel end to end (doc/EGRESS.md
# "Reaching the proxy"): a real agent in a network namespace with nothing but
# loopback, `airlock up` in another namespace that reaches test servers on
# public-looking addresses (a veth into a third namespace, names from a
# bind-mounted /etc/hosts), commands through `airlock exec` using the proxy
# variables the agent sets. Allowed names work over HTTP and HTTPS CONNECT;
# other names, suffix tricks, IP literals, allowed names on private
# addresses and a CONNECT whose SNI differs are refused, each with one line
# on the command's stderr and a record in `airlock audit --json`.
# Then the same from commands in the embedded local sandbox (`airlock up DIR`
# with no --guest, in the same namespaces, sharing the servers and names):
# only lo inside, a direct connection to the server fails, the allowed name
# works over HTTP and CONNECT, the five refusals each give one stderr line
# and one audit record; a server on the host side's loopback is out of
# reach, directly and through the proxy (an allowed name resolving to it).
# Then the same from commands in the microVM (`airlock up DIR --sandbox vm`,
# same namespaces; busybox only in there: wget for HTTP, nc with a
# ClientHello made on the host for CONNECT); skipped, saying so, without qemu.
# usage: proxy_e2e.sh AIRLOCK AIRLOCK_AGENT [AGENT_STATIC TEMPLATE_BUILD_SH TEMPLATE_DIR]
#   (root, /dev/fuse, netns; else exit 77. AGENT_STATIC '-': built from $AIRLOCK_SRC)
# shellcheck source=tests/e2e/lib.sh
source "$(dirname "$0")/lib.sh"

AIRLOCK=$1
AGENT=$2
VM_AGENT_ARG=${3:-}
VM_BUILD=${4:-}
VM_TPL=${5:-}
need() {
	echo "skip - proxy_e2e: $*"
	exit 77
}
[ "$(id -u)" = 0 ] || need "needs root (uid $(id -u))"
[ -c /dev/fuse ] || need "needs /dev/fuse"
for t in ip unshare curl openssl python3; do
	command -v "$t" >/dev/null || need "needs $t (tests/deps.sh installs it)"
done

NS_S=alsrv$$ # servers: 1.2.3.4 (allowed.test), 1.2.3.5 (other names)
NS_C=alcli$$ # the airlock up daemon: the host side, with a route to them
ip netns add "$NS_S" 2>/dev/null || need "cannot create network namespaces"
ip netns add "$NS_C"
netns_cleanup() {
	ip netns pids "$NS_S" 2>/dev/null | xargs -r kill 2>/dev/null || true
	ip netns pids "$NS_C" 2>/dev/null | xargs -r kill 2>/dev/null || true
	sleep 0.2
	ip netns del "$NS_S" 2>/dev/null || true
	ip netns del "$NS_C" 2>/dev/null || true
	cleanup
}
trap netns_cleanup EXIT
ip link add "alc$$" type veth peer name "als$$"
ip link set "alc$$" netns "$NS_C"
ip link set "als$$" netns "$NS_S"
ip -n "$NS_C" addr add 1.2.3.1/24 dev "alc$$"
ip -n "$NS_S" addr add 1.2.3.4/24 dev "als$$"
ip -n "$NS_S" addr add 1.2.3.5/24 dev "als$$"
for n in "$NS_C" "$NS_S"; do
	ip -n "$n" link set lo up
done
ip -n "$NS_C" link set "alc$$" up
ip -n "$NS_S" link set "als$$" up

chmod 0711 "$T" # commands run as nobody in the guest
export XDG_STATE_HOME=$T/state
export XDG_CONFIG_HOME=$T/config # the trust store: each workspace's airlock.json is approved below
export AIRLOCK_SOCKET=$T/relay.sock
TO="timeout -k 2"

# ---- servers ----
mkdir -p "$T/www"
echo "hello-allowed-$$" >"$T/www/hello.txt"
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=allowed.test" \
	-addext "subjectAltName=DNS:allowed.test,DNS:other.test" \
	-keyout "$T/tls.key" -out "$T/tls.pem" 2>/dev/null
chmod 0644 "$T/tls.pem"
start_bg http ip netns exec "$NS_S" python3 -m http.server 80 --bind 1.2.3.4 --directory "$T/www"
start_bg tls ip netns exec "$NS_S" openssl s_server -quiet -accept 1.2.3.4:443 -cert "$T/tls.pem" \
	-key "$T/tls.key" -www
start_bg tls5 ip netns exec "$NS_S" openssl s_server -quiet -accept 1.2.3.5:443 -cert "$T/tls.pem" \
	-key "$T/tls.key" -www
# a service on the daemon's side bound to every address it has (1.2.3.1 is the daemon's own)
start_bg selfsrv ip netns exec "$NS_C" python3 -m http.server 8081 --bind 0.0.0.0 --directory "$T/www"
for i in $(seq 100); do
	ip netns exec "$NS_C" curl -s --max-time 1 -o /dev/null http://1.2.3.4/hello.txt &&
		ip netns exec "$NS_C" curl -sk --max-time 1 -o /dev/null https://1.2.3.4/ && break
	sleep 0.1
done

cat >"$T/hosts" <<EOF
127.0.0.1 localhost
1.2.3.4 allowed.test
1.2.3.5 other.test evil.test allowed.test.evil.test
10.0.0.5 private.test
127.0.0.1 loopback.test
1.2.3.1 self.test
EOF

# ---- agent (no network but loopback) and airlock up (host side) ----
"$AIRLOCK" keygen -o "$T/hk" >"$T/hk.pub"
"$AIRLOCK" keygen -o "$T/gk" >"$T/gk.pub"
W=$T/work
G=$T/guest
mkdir -p "$W" "$G"
cat >"$W/airlock.json" <<'EOF'
{ "egress": { "default": "deny", "allow": ["allowed.test", "private.test", "self.test:8081"] } }
EOF
"$AIRLOCK" trust "$W" 2>/dev/null # its egress.allow loosens the default: approved (doc/UP.md "Trust")
start_bg agent unshare -n sh -c 'ip link set lo up && exec "$0" "$@"' "$AGENT" --listen "unix:$T/a.sock" \
	--root "$G" --key "$T/gk" --allow "$(cat "$T/hk.pub")" --state "$T/agent.state" --fsync none
wait_line "$T/agent.out" '^ready' 10
AGENT_PID=$BG_PID
start_bg up ip netns exec "$NS_C" unshare -m sh -c 'mount --bind "$0" /etc/hosts && exec "$@"' "$T/hosts" \
	"$AIRLOCK" up "$W" --guest "unix:$T/a.sock" --key "$T/hk" --guest-key "$(cat "$T/gk.pub")"
UP_PID=$BG_PID
wait_line "$T/up.out" "in sync with unix:$T/a.sock\$" 20

# X NAME CMD...: run CMD in the guest; stdout/stderr in $T/NAME.{o,e}, status in RC
X() {
	local name=$1
	shift
	RC=0
	$TO 30 "$AIRLOCK" exec -C "$W" -- "$@" </dev/null >"$T/$name.o" 2>"$T/$name.e" || RC=$?
}
denied_lines() { grep -c '^airlock: egress denied' "$T/$1.e" || true; }
# one denial line on the command's stderr, matching REGEX
one_denial() {
	local name=$1 re=$2 n
	n=$(denied_lines "$name")
	[ "$n" = 1 ] || { echo "$name: $n denial lines on stderr:" >&2; cat "$T/$name.e" >&2; return 1; }
	grep -qE "$re" "$T/$name.e" || { echo "$name: stderr does not match /$re/:" >&2; cat "$T/$name.e" >&2; return 1; }
}

t_env() {
	X env sh -c 'echo "$HTTP_PROXY|$HTTPS_PROXY|$ALL_PROXY|$http_proxy|$https_proxy|$all_proxy|$npm_config_proxy|$npm_config_https_proxy|$PIP_PROXY|$GIT_CONFIG_KEY_0=$GIT_CONFIG_VALUE_0|$NO_PROXY|$no_proxy"'
	[ "$RC" = 0 ] || return 1
	local u
	u=$(cut -d'|' -f1 "$T/env.o")
	[[ "$u" =~ ^http://127\.0\.0\.1:[0-9]+$ ]] || { cat "$T/env.o" >&2; return 1; }
	[ "$(cat "$T/env.o")" = "$u|$u|$u|$u|$u|$u|$u|$u|$u|http.proxy=$u|localhost,127.0.0.1,::1|localhost,127.0.0.1,::1" ] ||
		{ cat "$T/env.o" >&2; return 1; }
}
check "the agent sets the proxy variables (curl, npm, pip, git) to its loopback listener" t_env

t_no_route() {
	X direct curl -sS --noproxy '*' --max-time 3 http://1.2.3.4/hello.txt
	[ "$RC" != 0 ] && ! grep -q "hello-allowed" "$T/direct.o"
}
check "the guest has no route: a direct connection fails" t_no_route

t_http_allowed() {
	X http curl -sS --max-time 10 http://allowed.test/hello.txt
	[ "$RC" = 0 ] && grep -qx "hello-allowed-$$" "$T/http.o" && [ "$(denied_lines http)" = 0 ] ||
		{ cat "$T/http.o" "$T/http.e" >&2; return 1; }
}
check "allowed name over plain HTTP works through the channel" t_http_allowed

t_https_allowed() {
	X https curl -sS --max-time 10 --cacert "$T/tls.pem" https://allowed.test/
	[ "$RC" = 0 ] && grep -q "s_server" "$T/https.o" && [ "$(denied_lines https)" = 0 ] ||
		{ head -c 2000 "$T/https.o" >&2; cat "$T/https.e" >&2; return 1; }
}
check "allowed name over HTTPS CONNECT works (certificate verified)" t_https_allowed

t_https_big() {
	# a 3 MiB body in both directions crosses many windows
	head -c 3145728 /dev/urandom >"$T/www/big.bin"
	X big sh -c "curl -sS --max-time 20 http://allowed.test/big.bin | sha256sum"
	[ "$RC" = 0 ] && [ "$(cut -d' ' -f1 "$T/big.o")" = "$(sha256sum <"$T/www/big.bin" | cut -d' ' -f1)" ] ||
		{ cat "$T/big.o" "$T/big.e" >&2; return 1; }
}
check "3 MiB through the proxy stream arrives intact" t_https_big

t_slow_reader() {
	# 32 MiB read at 8 MiB/s in the guest: the windows hold the rest back (in the kernel's socket
	# buffers and at the server), so neither the agent nor the daemon grows with the download
	local dpid a0 d0 a1 d1
	head -c 33554432 /dev/urandom >"$T/www/slow.bin"
	dpid=$("$AIRLOCK" status -C "$W" --json | python3 -c 'import json, sys; print(json.load(sys.stdin)["pid"])')
	a0=$(awk '/^VmHWM/ { print $2 }' "/proc/$AGENT_PID/status")
	d0=$(awk '/^VmHWM/ { print $2 }' "/proc/$dpid/status")
	X slow sh -c "curl -sS --max-time 30 --limit-rate 8M http://allowed.test/slow.bin | sha256sum"
	a1=$(awk '/^VmHWM/ { print $2 }' "/proc/$AGENT_PID/status")
	d1=$(awk '/^VmHWM/ { print $2 }' "/proc/$dpid/status")
	echo "slow reader: agent VmHWM $a0 -> $a1 kB, daemon $d0 -> $d1 kB" >&2
	[ "$RC" = 0 ] && [ "$(cut -d' ' -f1 "$T/slow.o")" = "$(sha256sum <"$T/www/slow.bin" | cut -d' ' -f1)" ] ||
		{ cat "$T/slow.o" "$T/slow.e" >&2; return 1; }
	[ $((a1 - a0)) -lt 8192 ] && [ $((d1 - d0)) -lt 8192 ]
}
check "a slow reader in the guest: memory of agent and daemon stays bounded" t_slow_reader

t_parallel() {
	X par sh -c 'for i in 1 2 3 4 5 6 7 8; do curl -sS --max-time 10 http://allowed.test/hello.txt & done; wait'
	[ "$RC" = 0 ] && [ "$(grep -cx "hello-allowed-$$" "$T/par.o")" = 8 ] || { cat "$T/par.o" "$T/par.e" >&2; return 1; }
}
check "8 parallel connections from one command" t_parallel

t_listener_closes() {
	local port
	port=$(cut -d'|' -f1 "$T/env.o")
	port=${port##*:}
	# an earlier command's listener is gone; this command's own works
	X stale sh -c "curl -sS --max-time 5 -x http://127.0.0.1:$port http://allowed.test/hello.txt; echo rc=\$?; curl -sS --max-time 5 http://allowed.test/hello.txt"
	grep -q "rc=7" "$T/stale.o" && grep -qx "hello-allowed-$$" "$T/stale.o" || { cat "$T/stale.o" "$T/stale.e" >&2; return 1; }
}
check "a command's listener closes when it exits" t_listener_closes

t_limit() {
	# 40 connections held open at once: 32 (WIRE_PROXY_PER_CMD) are served, the rest reset
	X limit python3 -c '
import os, socket
port = int(os.environ["HTTP_PROXY"].rsplit(":", 1)[1])
socks = []
for _ in range(40):
    try:  # the agent may reset an extra connection before connect() returns
        socks.append(socket.create_connection(("127.0.0.1", port), timeout=10))
    except OSError:
        pass
ok = 0
for s in socks:
    try:
        s.sendall(b"GET http://allowed.test/hello.txt HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
        data = b""
        while True:
            b = s.recv(65536)
            if not b:
                break
            data += b
        ok += data.startswith(b"HTTP/1.0 200") or data.startswith(b"HTTP/1.1 200")
    except OSError:
        pass
print("served", ok)'
	grep -qx "served 32" "$T/limit.o" || { cat "$T/limit.o" "$T/limit.e" >&2; return 1; }
}
check "at most 32 proxy connections per command" t_limit

t_not_allowed() {
	X deny_http curl -sS --max-time 10 http://other.test/hello.txt
	grep -q "airlock egress: denied GET other.test:80" "$T/deny_http.o" || { cat "$T/deny_http.o" >&2; return 1; }
	one_denial deny_http '^airlock: egress denied GET other.test:80 \(not-allowed: .* in .*airlock.json\)$' || return 1
	X deny_https curl -sS --max-time 10 https://other.test/
	[ "$RC" != 0 ] && one_denial deny_https '^airlock: egress denied CONNECT other.test:443 \(not-allowed'
}
check "a name not on the list is refused (HTTP and CONNECT), one stderr line each" t_not_allowed

t_suffix() {
	X suffix curl -sS --max-time 10 https://allowed.test.evil.test/
	[ "$RC" != 0 ] && one_denial suffix '^airlock: egress denied CONNECT allowed.test.evil.test:443 \(not-allowed'
}
check "suffix trick allowed.test.evil.test is refused" t_suffix

t_literal() {
	X literal curl -sS --max-time 10 http://1.2.3.4/hello.txt
	! grep -q "hello-allowed" "$T/literal.o" && one_denial literal '^airlock: egress denied GET 1.2.3.4:80 \(ip-literal'
}
check "an IP literal is refused" t_literal

t_private() {
	X private curl -sS --max-time 10 https://private.test/
	[ "$RC" != 0 ] && one_denial private '^airlock: egress denied CONNECT private.test:443 \(private-address: .*10\.0\.0\.5'
}
check "an allowed name that resolves to a private address is refused" t_private

t_sni() {
	X sni sh -c 'echo | openssl s_client -proxy "${HTTP_PROXY#http://}" -connect allowed.test:443 -servername other.test'
	# no server certificate reached the client: the proxy cut the tunnel
	! grep -q "BEGIN CERTIFICATE" "$T/sni.o" || { cat "$T/sni.o" >&2; return 1; }
	one_denial sni '^airlock: egress denied CONNECT allowed.test:443 \(sni-mismatch: .*other.test'
}
check "a CONNECT whose TLS SNI differs from its host is refused" t_sni

t_self() {
	# the control: the service answers on the daemon's own address
	ip netns exec "$NS_C" curl -sS --max-time 5 -o /dev/null http://1.2.3.1:8081/hello.txt ||
		{ echo "control: 1.2.3.1:8081 does not answer" >&2; return 1; }
	X self curl -sS --max-time 10 http://self.test:8081/hello.txt
	! grep -q "hello-allowed" "$T/self.o" &&
		one_denial self '^airlock: egress denied GET self.test:8081 \(host-address: .*1\.2\.3\.1 \(host interface\)'
}
check "an allowed name that resolves to the daemon's own (public-looking) address is refused" t_self

# audit_each N "METHOD HOST PORT REASON"...: $W's audit record (--json)
# holds exactly N denials, exactly one per record given, each naming the
# command (curl or openssl; $AUDIT_CMD, a regex, overrides) and a time; the
# text form shows the last.
# Polled: the daemon writes the record within EGRESS_LINK_WRITE_MS.
audit_each() {
	local n=$1 j i m h p reason
	shift
	for i in $(seq 50); do
		j=$("$AIRLOCK" audit -C "$W" --json)
		echo "$j" | python3 -c '
import json, os, re, sys
n, want = int(sys.argv[1]), sys.argv[2:]
cmd_re = os.environ.get("AUDIT_CMD") or "curl|openssl"
d = json.load(sys.stdin)["egress"] or {"denials": [], "denials_total": 0}
bad = []
for r in want:
    m, h, p, reason = r.split()
    ok = [x for x in d["denials"] if x["method"] == m and x["host"] == h and x["port"] == int(p)
          and x["reason"] == reason and x["time"] and re.search(cmd_re, x["command"])]
    if len(ok) != 1:
        bad.append("%d records for %s" % (len(ok), r))
if d["denials_total"] != n:
    bad.append("%d denials in all, not %d" % (d["denials_total"], n))
if bad:
    print("; ".join(bad), file=sys.stderr)
sys.exit(1 if bad else 0)' "$n" "$@" 2>"$T/audit_each.err" && break
		sleep 0.1
	done
	[ ! -s "$T/audit_each.err" ] || { cat "$T/audit_each.err" >&2; echo "$j" >&2; return 1; }
	read -r m h p reason <<<"${!#}"
	"$AIRLOCK" audit -C "$W" | grep -q "denied $m $h:$p ($reason" || { "$AIRLOCK" audit -C "$W" >&2; return 1; }
}
t_audit() {
	audit_each 7 "GET other.test 80 not-allowed" "CONNECT other.test 443 not-allowed" \
		"CONNECT allowed.test.evil.test 443 not-allowed" "GET 1.2.3.4 80 ip-literal" \
		"CONNECT private.test 443 private-address" "CONNECT allowed.test 443 sni-mismatch" \
		"GET self.test 8081 host-address"
}

t_status() {
	local i j
	for i in $(seq 50); do # rewritten at most every 100 ms after a change
		j=$("$AIRLOCK" status -C "$W" --json)
		echo "$j" | python3 -c '
import json, sys
e = json.load(sys.stdin)["egress"]
sys.exit(0 if e["denials"] == 7 and e["opened"] >= 50 and e["streams"] == 0 else 1)' && break
		sleep 0.1
	done
	echo "$j" | grep -q '"denials":7' && "$AIRLOCK" status -C "$W" | grep -q "^egress .* 7 denied" ||
		{ echo "$j" >&2; "$AIRLOCK" status -C "$W" >&2; return 1; }
}
check "airlock status counts proxy connections and denials" t_status
check "every denial is in airlock audit (--json and text) with the command" t_audit

t_clean_exit() {
	local f
	$TO 15 "$AIRLOCK" down "$W" || return 1
	kill -TERM "$AGENT_PID"
	wait "$AGENT_PID" 2>/dev/null || true
	wait "$UP_PID" 2>/dev/null || true
	# no session was dropped for a protocol error, no sanitizer report
	for f in "$T/up.err" "$T/agent.err"; do
		if grep -E "AddressSanitizer|LeakSanitizer|runtime error|malformed|unexpected|closing" "$f"; then
			echo "in $f" >&2
			return 1
		fi
	done
}
check "airlock up and the agent end cleanly (no protocol error, no sanitizer report)" t_clean_exit

# ---- the same from commands in the microVM (doc/VM.md) ----
# `airlock up DIR --sandbox vm` in the same namespaces (route to the servers,
# the test's /etc/hosts): the daemon boots the base template with qemu (no
# network device: the channel on virtio-serial is the only way out). busybox
# only in there: wget for HTTP; for CONNECT, nc sends a CONNECT and then a
# TLS ClientHello made on the host (python's ssl, SNI allowed.test or
# other.test) and synced in; the server's TLS answer (a handshake record)
# must come back, or, for the other SNI, must not.
vm_part() {
	if [ -z "$VM_BUILD" ]; then
		skip "vm part: no template builder given (usage: proxy_e2e.sh AIRLOCK AGENT AGENT_STATIC BUILD_SH TEMPLATE_DIR)"
		return
	fi
	if ! command -v qemu-system-x86_64 >/dev/null 2>&1; then
		skip "vm part: needs qemu-system-x86_64 (apt-get install qemu-system-x86, or tests/deps.sh)"
		return
	fi
	if ! vm_template "$VM_AGENT_ARG" "$VM_BUILD" "$VM_TPL"; then
		cat "$T/sa.out" "$T/build.out" 2>/dev/null
		not_ok "vm: the base template builds"
		return
	fi
	export XDG_DATA_HOME=$T/vmdata AIRLOCK_VM_TEMPLATE=$VM_TPL AUDIT_CMD='wget|tunnel.sh'
	W=$T/vmwork
	mkdir -p "$W"
	cat >"$W/airlock.json" <<'EOF'
{ "egress": { "default": "deny", "allow": ["allowed.test", "private.test", "loopback.test:81"] } }
EOF
	"$AIRLOCK" trust "$W" 2>/dev/null # its egress.allow loosens the default: approved (doc/UP.md "Trust")
	python3 - "$W" <<'EOF'
import ssl, sys
for sni in ("allowed.test", "other.test"):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    out = ssl.MemoryBIO()
    tls = ctx.wrap_bio(ssl.MemoryBIO(), out, server_hostname=sni)
    try:
        tls.do_handshake()
    except ssl.SSLWantReadError:
        pass
    open("%s/hello-%s.bin" % (sys.argv[1], sni), "wb").write(out.read())
EOF
	# tunnel.sh HOST HELLO: CONNECT HOST:443 through the proxy variable, send
	# the ClientHello HELLO, print what comes back in hex (one line)
	cat >"$W/tunnel.sh" <<'EOF'
p=${http_proxy##*:}
{ printf 'CONNECT %s:443 HTTP/1.1\r\nHost: %s:443\r\n\r\n' "$1" "$1"; sleep 1; cat "$2"; sleep 3; } |
	timeout 8 nc 127.0.0.1 "$p" | od -An -tx1 -v | tr -d ' \n'
echo
EOF
	# a server on the host side's loopback (the daemon's network namespace)
	echo "vm-host-loopback-$$" >"$T/www/vmlo.txt"
	start_bg vmlohttp ip netns exec "$NS_C" python3 -m http.server 81 --bind 127.0.0.1 --directory "$T/www"
	start_bg vmup ip netns exec "$NS_C" unshare -m sh -c 'mount --bind "$0" /etc/hosts && exec "$@"' "$T/hosts" \
		"$AIRLOCK" up "$W" --sandbox vm
	UP_PID=$BG_PID
	if ! wait_line "$T/vmup.out" "^airlock: $W in sync with sandbox vm\$" 150; then
		cat "$T/vmup.err"
		not_ok "vm: airlock up --sandbox vm boots the VM and syncs"
		return
	fi
	ok "vm: airlock up --sandbox vm boots the VM and syncs"

	t_vm_boundary() {
		"$AIRLOCK" status -C "$W" | grep -q '^sandbox     vm, running' || { "$AIRLOCK" status -C "$W" >&2; return 1; }
		X vmnet sh -c 'ls /sys/class/net; test -r hello-allowed.test.bin && echo hello'
		[ "$(tr '\n' ' ' <"$T/vmnet.o")" = "lo hello " ] || { cat "$T/vmnet.o" "$T/vmnet.e" >&2; return 1; }
		# straight to the server's address, not through the proxy: no route
		X vmdirect sh -c 'echo "GET /hello.txt HTTP/1.0" | nc -w 3 1.2.3.4 80'
		[ "$RC" != 0 ] && ! grep -q "hello-allowed" "$T/vmdirect.o" && grep -q "unreachable" "$T/vmdirect.e" &&
			[ "$(denied_lines vmdirect)" = 0 ] || { cat "$T/vmdirect.o" "$T/vmdirect.e" >&2; return 1; }
	}
	check "vm: only lo in the VM; a direct connection to the server fails" t_vm_boundary

	# tls_answer NAME: NAME.o (hex) has the proxy's 200, then a TLS handshake record (0x16 0x03)
	tls_answer() {
		python3 - "$T/$1.o" <<'EOF'
import sys
b = bytes.fromhex(open(sys.argv[1]).read().strip())
head, sep, rest = b.partition(b"\r\n\r\n")
ok = head.split(b"\r\n")[0].split(b" ")[1:2] == [b"200"] and rest[:2] == b"\x16\x03"
sys.exit(0 if ok else 1)
EOF
	}
	t_vm_allowed() {
		X vmhttp wget -q -O - http://allowed.test/hello.txt
		[ "$RC" = 0 ] && grep -qx "hello-allowed-$$" "$T/vmhttp.o" && [ "$(denied_lines vmhttp)" = 0 ] ||
			{ cat "$T/vmhttp.o" "$T/vmhttp.e" >&2; return 1; }
		X vmconnect sh tunnel.sh allowed.test hello-allowed.test.bin
		tls_answer vmconnect && [ "$(denied_lines vmconnect)" = 0 ] || { cat "$T/vmconnect.o" "$T/vmconnect.e" >&2; return 1; }
	}
	check "vm: an allowed name works over HTTP (wget) and over CONNECT (the server's TLS answer comes back)" t_vm_allowed

	t_vm_denied() {
		X vmother wget -q -O - http://other.test/hello.txt
		[ "$RC" != 0 ] && one_denial vmother '^airlock: egress denied GET other.test:80 \(not-allowed: .* in .*airlock.json\)$' ||
			return 1
		X vmsuffix wget -q -O - http://allowed.test.evil.test/hello.txt
		[ "$RC" != 0 ] && one_denial vmsuffix '^airlock: egress denied GET allowed.test.evil.test:80 \(not-allowed' || return 1
		X vmliteral wget -q -O - http://1.2.3.4/hello.txt
		! grep -q "hello-allowed" "$T/vmliteral.o" && one_denial vmliteral '^airlock: egress denied GET 1.2.3.4:80 \(ip-literal' ||
			return 1
		X vmprivate wget -q -O - http://private.test/hello.txt
		[ "$RC" != 0 ] && one_denial vmprivate '^airlock: egress denied GET private.test:80 \(private-address: .*10\.0\.0\.5' ||
			return 1
		X vmsni sh tunnel.sh allowed.test hello-other.test.bin
		! tls_answer vmsni || { cat "$T/vmsni.o" >&2; return 1; }
		one_denial vmsni '^airlock: egress denied CONNECT allowed.test:443 \(sni-mismatch: .*other.test'
	}
	check "vm: another name, allowed.test.evil.test, an IP literal, a private address, another SNI: refused, one stderr line each" \
		t_vm_denied

	t_vm_host_loopback() {
		# the server answers on the host side, so only the boundary keeps it out
		local i
		for i in $(seq 100); do
			[ "$(ip netns exec "$NS_C" curl -s --max-time 1 http://127.0.0.1:81/vmlo.txt)" = "vm-host-loopback-$$" ] && break
			sleep 0.1
		done
		[ "$i" -lt 100 ] || return 1
		# directly (wget -Y off: no proxy): the VM's 127.0.0.1 is its own
		X vmlo_direct wget -Y off -q -O - http://127.0.0.1:81/vmlo.txt
		[ "$RC" != 0 ] && ! grep -q "host-loopback" "$T/vmlo_direct.o" || { cat "$T/vmlo_direct.o" >&2; return 1; }
		# through the proxy: an allowed name that resolves to loopback
		X vmlo wget -q -O - http://loopback.test:81/vmlo.txt
		! grep -q "host-loopback" "$T/vmlo.o" &&
			one_denial vmlo '^airlock: egress denied GET loopback.test:81 \(private-address: .*127\.0\.0\.1 \(loopback\)'
	}
	check "vm: a loopback HTTP server on the host is unreachable, directly and through the proxy" t_vm_host_loopback

	t_vm_audit() {
		audit_each 6 "GET other.test 80 not-allowed" "GET allowed.test.evil.test 80 not-allowed" \
			"GET 1.2.3.4 80 ip-literal" "GET private.test 80 private-address" "GET loopback.test 81 private-address" \
			"CONNECT allowed.test 443 sni-mismatch"
	}
	check "vm: each of the 6 denials is in airlock audit (--json and text) with its command" t_vm_audit

	t_vm_down() {
		$TO 30 "$AIRLOCK" down "$W" --destroy || return 1
		wait "$UP_PID" 2>/dev/null || true
		[ -z "$(ls "$T/vmdata/airlock/sandboxes" 2>/dev/null)" ] && ! pgrep -f "qemu-system.*$T/vmdata" >/dev/null || return 1
		! grep -E "AddressSanitizer|LeakSanitizer|runtime error|malformed|unexpected|closing" "$T/vmup.err" ||
			{ echo "in $T/vmup.err" >&2; return 1; }
	}
	check "vm: down --destroy ends it cleanly (no qemu left, no protocol error, no sanitizer report)" t_vm_down
	unset AUDIT_CMD AIRLOCK_VM_TEMPLATE
}

# ---- the same from commands in the embedded local sandbox (doc/SANDBOX.md) ----
# `airlock up DIR` with no --guest, in the same namespaces as above (route to
# the servers, the test's /etc/hosts): the daemon starts the sandbox itself;
# commands run there as uid 1000 in a network namespace with only lo, and
# reach the proxy only over the channel.
if ! unshare -U true 2>/dev/null; then
	skip "sandbox part: this machine does not allow user namespaces (unshare -U fails)"
	vm_part
	finish
	exit
fi
export XDG_DATA_HOME=$T/data
W=$T/sbwork
mkdir -p "$W"
cp "$T/tls.pem" "$W/test-ca.pem" # the test server's certificate, for curl --cacert
cat >"$W/airlock.json" <<'EOF'
{ "workspace": { "sync": { "allow_secrets": ["test-ca.pem"] } },
  "egress": { "default": "deny", "allow": ["allowed.test", "private.test", "loopback.test"] } }
EOF
"$AIRLOCK" trust "$W" 2>/dev/null # its egress.allow loosens the default: approved (doc/UP.md "Trust")
# a server on the host side's loopback (the daemon's network namespace)
echo "host-loopback-$$" >"$T/www/lo.txt"
start_bg lohttp ip netns exec "$NS_C" python3 -m http.server 80 --bind 127.0.0.1 --directory "$T/www"
for i in $(seq 100); do
	ip netns exec "$NS_C" curl -s --max-time 1 -o /dev/null http://127.0.0.1/lo.txt && break
	sleep 0.1
done
start_bg sbup ip netns exec "$NS_C" unshare -m sh -c 'mount --bind "$0" /etc/hosts && exec "$@"' "$T/hosts" \
	"$AIRLOCK" up "$W"
UP_PID=$BG_PID
wait_line "$T/sbup.out" "^airlock: $W in sync with sandbox local\$" 20

t_sb_boundary() {
	"$AIRLOCK" status -C "$W" | grep -q '^sandbox     local, running' || { "$AIRLOCK" status -C "$W" >&2; return 1; }
	X sbid sh -c 'id -u; ip -o link | grep -vc " lo:"; test -r test-ca.pem && echo ca'
	[ "$(tr '\n' ' ' <"$T/sbid.o")" = "1000 0 ca " ] || { cat "$T/sbid.o" "$T/sbid.e" >&2; return 1; }
	# straight to the server's address, not through the proxy: no route
	X sbdirect curl -sS --noproxy '*' --max-time 3 http://1.2.3.4/hello.txt
	[ "$RC" != 0 ] && ! grep -q "hello-allowed" "$T/sbdirect.o" && [ "$(denied_lines sbdirect)" = 0 ] ||
		{ cat "$T/sbdirect.o" "$T/sbdirect.e" >&2; return 1; }
	X sbraw python3 -c 'import socket; socket.create_connection(("1.2.3.4", 443), timeout=3)'
	[ "$RC" != 0 ] && grep -q "unreachable" "$T/sbraw.e" || { cat "$T/sbraw.e" >&2; return 1; }
}
check "sandbox: commands run as uid 1000 with only lo; a direct connection to the server fails" t_sb_boundary

t_sb_allowed() {
	X sbhttp curl -sS --max-time 10 http://allowed.test/hello.txt
	[ "$RC" = 0 ] && grep -qx "hello-allowed-$$" "$T/sbhttp.o" && [ "$(denied_lines sbhttp)" = 0 ] ||
		{ cat "$T/sbhttp.o" "$T/sbhttp.e" >&2; return 1; }
	X sbhttps curl -sS --max-time 10 --cacert test-ca.pem https://allowed.test/
	[ "$RC" = 0 ] && grep -q "s_server" "$T/sbhttps.o" && [ "$(denied_lines sbhttps)" = 0 ] ||
		{ head -c 2000 "$T/sbhttps.o" >&2; cat "$T/sbhttps.e" >&2; return 1; }
}
check "sandbox: an allowed name works over HTTP and over HTTPS CONNECT (certificate verified)" t_sb_allowed

t_sb_denied() {
	X sbother curl -sS --max-time 10 --cacert test-ca.pem https://other.test/
	[ "$RC" != 0 ] && one_denial sbother '^airlock: egress denied CONNECT other.test:443 \(not-allowed: .* in .*airlock.json\)$' ||
		return 1
	X sbsuffix curl -sS --max-time 10 --cacert test-ca.pem https://allowed.test.evil.test/
	[ "$RC" != 0 ] && one_denial sbsuffix '^airlock: egress denied CONNECT allowed.test.evil.test:443 \(not-allowed' || return 1
	X sbliteral curl -sS --max-time 10 http://1.2.3.4/hello.txt
	! grep -q "hello-allowed" "$T/sbliteral.o" && one_denial sbliteral '^airlock: egress denied GET 1.2.3.4:80 \(ip-literal' ||
		return 1
	X sbprivate curl -sS --max-time 10 --cacert test-ca.pem https://private.test/
	[ "$RC" != 0 ] && one_denial sbprivate '^airlock: egress denied CONNECT private.test:443 \(private-address: .*10\.0\.0\.5' ||
		return 1
	X sbsni sh -c 'echo | openssl s_client -proxy "${HTTP_PROXY#http://}" -connect allowed.test:443 -servername other.test'
	! grep -q "BEGIN CERTIFICATE" "$T/sbsni.o" || { cat "$T/sbsni.o" >&2; return 1; }
	one_denial sbsni '^airlock: egress denied CONNECT allowed.test:443 \(sni-mismatch: .*other.test'
}
check "sandbox: another name, allowed.test.evil.test, an IP literal, a private address, another SNI: refused, one stderr line each" \
	t_sb_denied

t_sb_host_loopback() {
	# the server answers on the host side, so only the boundary keeps it out
	[ "$(ip netns exec "$NS_C" curl -s --max-time 5 http://127.0.0.1/lo.txt)" = "host-loopback-$$" ] || return 1
	# directly: the sandbox's 127.0.0.1 is its own (nothing listens there)
	X sblo_direct curl -sS --max-time 5 http://127.0.0.1/lo.txt
	[ "$RC" != 0 ] && ! grep -q "host-loopback" "$T/sblo_direct.o" || { cat "$T/sblo_direct.o" >&2; return 1; }
	# through the proxy: an allowed name that resolves to loopback
	X sblo curl -sS --max-time 5 http://loopback.test/lo.txt
	! grep -q "host-loopback" "$T/sblo.o" &&
		one_denial sblo '^airlock: egress denied GET loopback.test:80 \(private-address: .*127\.0\.0\.1 \(loopback\)'
}
check "sandbox: a loopback HTTP server on the host is unreachable, directly and through the proxy" t_sb_host_loopback

t_sb_audit() {
	audit_each 6 "CONNECT other.test 443 not-allowed" "CONNECT allowed.test.evil.test 443 not-allowed" \
		"GET 1.2.3.4 80 ip-literal" "CONNECT private.test 443 private-address" "GET loopback.test 80 private-address" \
		"CONNECT allowed.test 443 sni-mismatch"
}
check "sandbox: each of the 6 denials is in airlock audit (--json and text) with its command" t_sb_audit

t_sb_down() {
	$TO 15 "$AIRLOCK" down "$W" --destroy || return 1
	wait "$UP_PID" 2>/dev/null || true
	[ ! -e "$T/data/airlock/sandboxes" ] || [ -z "$(ls "$T/data/airlock/sandboxes")" ] || return 1
	! grep -E "AddressSanitizer|LeakSanitizer|runtime error|malformed|unexpected|closing" "$T/sbup.err" ||
		{ echo "in $T/sbup.err" >&2; return 1; }
}
check "sandbox: down --destroy ends it cleanly (no protocol error, no sanitizer report)" t_sb_down

vm_part
finish
