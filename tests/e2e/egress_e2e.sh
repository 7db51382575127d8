#!/usr/bin/env bash
# egress end to end: the real proxy (tests/egress_driver) on real sockets,
# curl and openssl as clients, python3 http.server and openssl s_server as
# upstreams on 127.0.0.2. Loopback is reachable only because driver A is
# started with the TEST-ONLY --allow-private 127.0.0.2/32; driver B runs
# without it and must refuse the same name. Names come from a resolver
# table, so no DNS is needed.
#
#   egress_e2e.sh EGRESS_DRIVER
DRIVER=$1
# shellcheck source=tests/e2e/lib.sh
source "$(dirname "$0")/lib.sh"

for tool in curl openssl python3; do
	if ! command -v "$tool" >/dev/null; then
		echo "skip: $tool is not installed (tests/deps.sh installs it)"
		exit 77
	fi
done

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.2",0)); print(s.getsockname()[1])'; }

HP=$(free_port)  # plain HTTP upstream
TP=$(free_port)  # TLS upstream
NP=$(free_port)  # nothing listens here
SP=$(free_port)  # a server on 0.0.0.0: every address of the host
# one of the host's own non-loopback addresses (the driver treats it as
# public with --allow-private, so only the own-address rule can refuse it)
OWN=$(ip -4 -o addr show scope global 2>/dev/null | awk '{sub("/.*", "", $4); print $4; exit}')
ROOT=0
[ "$(id -u)" -eq 0 ] && ROOT=1

# ---- upstreams ----
mkdir -p "$T/www"
echo "hello egress" >"$T/www/hello.txt"
openssl req -x509 -newkey rsa:2048 -nodes -keyout "$T/key.pem" -out "$T/cert.pem" -days 1 -subj /CN=allowed.test \
	>/dev/null 2>&1
start_bg http python3 -u -m http.server --bind 127.0.0.2 --directory "$T/www" "$HP"
start_bg tls openssl s_server -quiet -www -accept "127.0.0.2:$TP" -cert "$T/cert.pem" -key "$T/key.pem"
start_bg anyaddr python3 -u -m http.server --bind 0.0.0.0 --directory "$T/www" "$SP"
if [ $ROOT -eq 1 ]; then
	start_bg tls443 openssl s_server -quiet -www -accept "127.0.0.2:443" -cert "$T/cert.pem" -key "$T/key.pem"
fi

cat >"$T/hosts" <<EOF
# resolver table for egress_driver --hosts
127.0.0.2 allowed.test a.wild.test wild.test evil.test allowed.test.evil.test noport.test
10.1.2.3 priv.test
169.254.169.254 meta.test
::ffff:127.0.0.1 mapped.test
8.8.8.8 mixed.test
127.0.0.3 mixed.test
${OWN:-192.0.2.254} self.test
168.63.129.16 wire.test
EOF
cat >"$T/policy.json" <<EOF
{ "egress": { "default": "deny", "allow": [
  "allowed.test:$HP", "allowed.test:$TP", "*.wild.test:$TP", "priv.test:$HP", "meta.test:$HP",
  "mapped.test:$HP", "mixed.test:$HP", "noport.test", "metadata.google.internal", "allowed.test:$NP",
  "self.test:$SP", "wire.test:$HP" ] } }
EOF

start_bg drvA "$DRIVER" --policy "$T/policy.json" --hosts "$T/hosts" --allow-private 127.0.0.2/32 \
	--allow-private "${OWN:-192.0.2.254}/32" \
	--unix "$T/egress.sock" --client cmd-A
DRV_A=$BG_PID
start_bg drvB "$DRIVER" --policy "$T/policy.json" --hosts "$T/hosts" --client cmd-42
DRV_B=$BG_PID
wait_line "$T/drvA.out" '^port ' 10
wait_line "$T/drvB.out" '^port ' 10
PA=$(awk '/^port /{print $2; exit}' "$T/drvA.out")
PB=$(awk '/^port /{print $2; exit}' "$T/drvB.out")
for i in $(seq 200); do
	curl -s -o /dev/null "http://127.0.0.2:$HP/hello.txt" && break
	sleep 0.05
done
for i in $(seq 200); do
	(exec 3<>"/dev/tcp/127.0.0.2/$TP") 2>/dev/null && break
	sleep 0.05
done
for i in $(seq 200); do
	curl -s -o /dev/null "http://127.0.0.1:$SP/hello.txt" && break
	sleep 0.05
done

PX=(--proxy "http://127.0.0.1:$PA" --max-time 10)

# has_denial LOG KEY=VALUE...: a denial JSON line with all these fields
# (VALUE may be a substring for detail and message).
has_denial() {
	local log=$1
	shift
	python3 - "$log" "$@" <<'PY'
import json, sys
log, want = sys.argv[1], [a.split("=", 1) for a in sys.argv[2:]]
for line in open(log):
    if not line.startswith("{"):
        continue
    d = json.loads(line)
    if all((str(d.get(k)) == v) if k not in ("detail", "message") else (v in d.get(k, "")) for k, v in want):
        sys.exit(0)
print("no denial with", want, "in", log, file=sys.stderr)
sys.stderr.write(open(log).read())
sys.exit(1)
PY
}

# raw SOCKET_KIND ADDR PAYLOAD_PY: send bytes, print what comes back (3 s max)
raw() {
	python3 - "$@" <<'PY'
import socket, sys
kind, addr, payload = sys.argv[1], sys.argv[2], eval(sys.argv[3])
if kind == "unix":
    s = socket.socket(socket.AF_UNIX); s.connect(addr)
else:
    h, p = addr.rsplit(":", 1); s = socket.create_connection((h, int(p)))
s.settimeout(3)
out = b""
for part in payload if isinstance(payload, list) else [payload]:
    s.sendall(part)
    try:
        out += s.recv(65536)
    except socket.timeout:
        pass
try:
    while True:
        b = s.recv(65536)
        if not b: break
        out += b
except (socket.timeout, ConnectionResetError):
    pass
sys.stdout.write(out.decode("latin-1"))
PY
}
# rawq ARGS... -- REGEX: raw, then grep the whole reply (no early pipe close)
rawq() {
	local re=${*: -1} out
	out=$(raw "${@:1:$#-1}") || return 1
	grep -q -- "$re" <<<"$out"
}

# ---- allowed ----
http_ok() { [ "$(curl -sS "${PX[@]}" "http://allowed.test:$HP/hello.txt")" = "hello egress" ]; }
check "allowed name over plain HTTP" http_ok
https_ok() { curl -sS -k "${PX[@]}" -o "$T/tls.got" "https://allowed.test:$TP/" && grep -q "s_server" "$T/tls.got"; }
check "allowed name over HTTPS CONNECT" https_ok
wild_ok() { curl -sS -k "${PX[@]}" -o "$T/tls.got" "https://a.wild.test:$TP/" && grep -q "s_server" "$T/tls.got"; }
check "*.wild.test matches a subdomain" wild_ok
unix_ok() {
	rawq unix "$T/egress.sock" "b'GET http://allowed.test:$HP/hello.txt HTTP/1.1\r\nHost: allowed.test:$HP\r\n\r\n'" "hello egress"
}
check "Unix socket listener" unix_ok
explicit_raw_ok() {
	rawq tcp "127.0.0.1:$PA" "[b'CONNECT allowed.test:$HP HTTP/1.1\r\nHost: allowed.test:$HP\r\n\r\n', b'GET /hello.txt HTTP/1.0\r\n\r\n']" "hello egress"
}
check "non-TLS tunnel allowed to an explicitly listed port" explicit_raw_ok
if [ $ROOT -eq 1 ]; then
	default443_ok() { curl -sS -k "${PX[@]}" -o "$T/tls.got" "https://noport.test/" && grep -q "s_server" "$T/tls.got"; }
	check "entry without a port allows 443" default443_ok
else
	skip "port 443 checks need root"
fi

# ---- refused ----
# refused_http URL REASON HOST PORT: plain HTTP gets 403 and the one-line reason
refused_http() {
	local url=$1 reason=$2 host=$3 port=$4 code body
	code=$(curl -sS "${PX[@]}" -o "$T/body" -w '%{http_code}' "$url") || return 1
	body=$(cat "$T/body")
	[ "$code" = 403 ] || { echo "code $code" >&2; return 1; }
	[[ "$body" == "airlock egress: denied GET $host:$port: "* ]] || { echo "body: $body" >&2; return 1; }
	has_denial "$T/drvA.out" reason="$reason" host="$host" port="$port" method=GET client=cmd-A message="$body"
}
# refused_connect URL REASON HOST PORT [DETAIL]: CONNECT answered 403
refused_connect() {
	local url=$1 reason=$2 host=$3 port=$4 detail=${5:-} code
	code=$(curl -sS -k "${PX[@]}" -o /dev/null -w '%{http_connect}' "$url" 2>/dev/null) || true
	[ "$code" = 403 ] || { echo "CONNECT code $code" >&2; return 1; }
	has_denial "$T/drvA.out" reason="$reason" host="$host" port="$port" method=CONNECT detail="$detail"
}
check "name not on the list (HTTP)" refused_http "http://evil.test:$HP/" not-allowed evil.test "$HP"
check "name not on the list (CONNECT)" refused_connect "https://evil.test:$TP/" not-allowed evil.test "$TP"
check "suffix trick allowed.test.evil.test" refused_connect "https://allowed.test.evil.test:$TP/" not-allowed \
	allowed.test.evil.test "$TP"
check "*.wild.test does not match wild.test" refused_connect "https://wild.test:$TP/" not-allowed wild.test "$TP"
check "listed name, unlisted port" refused_connect "https://allowed.test:$((TP == 65535 ? 1 : TP + 1))/" \
	port-not-allowed allowed.test "$((TP == 65535 ? 1 : TP + 1))"
check "IP literal (HTTP)" refused_http "http://127.0.0.2:$HP/" ip-literal 127.0.0.2 "$HP"
check "IP literal (CONNECT, IPv6)" refused_connect "https://[::1]:$TP/" ip-literal "[::1]" "$TP"
int_literal() {
	rawq tcp "127.0.0.1:$PA" "b'CONNECT 2130706433:$TP HTTP/1.1\r\n\r\n'" "denied CONNECT 2130706433:$TP: IP address literals" &&
		has_denial "$T/drvA.out" reason=ip-literal host=2130706433
}
check "IP literal (integer form 2130706433)" int_literal
hex_literal() {
	rawq tcp "127.0.0.1:$PA" "b'CONNECT 0x7f.1:$TP HTTP/1.1\r\n\r\n'" "403 Forbidden" &&
		has_denial "$T/drvA.out" reason=ip-literal host=0x7f.1
}
check "IP literal (hex form 0x7f.1)" hex_literal
check "allowed name resolving to a private address" refused_http "http://priv.test:$HP/" private-address priv.test "$HP"
check "  ... names the address" has_denial "$T/drvA.out" host=priv.test detail="10.1.2.3 (private)"
check "allowed name resolving to the metadata address" refused_http "http://meta.test:$HP/" metadata meta.test "$HP"
check "allowed name resolving to ::ffff:127.0.0.1" refused_http "http://mapped.test:$HP/" private-address mapped.test "$HP"
check "  ... classified as loopback" has_denial "$T/drvA.out" host=mapped.test detail="::ffff:127.0.0.1 (loopback)"
check "public + private addresses: refused, not filtered" refused_http "http://mixed.test:$HP/" private-address \
	mixed.test "$HP"
self_refused() {
	[ -n "$OWN" ] || { echo "# no non-loopback IPv4 address on this host: nothing to check"; return 0; }
	# the control: the server answers on that address directly
	curl -sS --max-time 5 -o /dev/null "http://$OWN:$SP/hello.txt" || { echo "control: $OWN:$SP not reachable" >&2; return 1; }
	refused_http "http://self.test:$SP/hello.txt" host-address self.test "$SP" &&
		has_denial "$T/drvA.out" host=self.test detail="$OWN (host interface)"
}
check "allowed name resolving to the host's own address ($OWN), even inside allow_private_cidrs" self_refused
wire_refused() {
	refused_http "http://wire.test:$HP/" metadata wire.test "$HP" &&
		has_denial "$T/drvA.out" host=wire.test detail="168.63.129.16 (metadata)"
}
check "allowed name resolving to Azure's WireServer 168.63.129.16" wire_refused
check "metadata.google.internal by name, even when listed" refused_http "http://metadata.google.internal/" metadata \
	metadata.google.internal 80

sni_mismatch() {
	timeout 10 openssl s_client -proxy "127.0.0.1:$PA" -connect "allowed.test:$TP" -servername other.test \
		</dev/null >"$T/sni.out" 2>&1 && return 1
	has_denial "$T/drvA.out" reason=sni-mismatch host=allowed.test port="$TP" detail=other.test
}
check "CONNECT whose SNI differs" sni_mismatch
sni_alert() { grep -qi "alert access denied" "$T/sni.out"; }
check "  ... client gets a TLS access_denied alert" sni_alert
no_sni() {
	timeout 10 openssl s_client -proxy "127.0.0.1:$PA" -connect "allowed.test:$TP" -noservername \
		</dev/null >/dev/null 2>&1 && return 1
	has_denial "$T/drvA.out" reason=no-sni host=allowed.test port="$TP"
}
check "CONNECT without SNI" no_sni
curl_connect_to() {
	# curl asks the proxy for allowed.test but sends SNI evil.test
	curl -sS -k "${PX[@]}" --connect-to "evil.test:$TP:allowed.test:$TP" "https://evil.test:$TP/" \
		>/dev/null 2>&1 && return 1
	has_denial "$T/drvA.out" reason=sni-mismatch host=allowed.test detail=evil.test
}
check "curl --connect-to with another SNI" curl_connect_to
if [ $ROOT -eq 1 ]; then
	not_tls_443() {
		raw tcp "127.0.0.1:$PA" "[b'CONNECT noport.test:443 HTTP/1.1\r\n\r\n', b'GET / HTTP/1.0\r\n\r\n']" \
			>"$T/nottls.out"
		grep -q "200 Connection established" "$T/nottls.out" &&
			has_denial "$T/drvA.out" reason=not-tls host=noport.test port=443
	}
	check "non-TLS bytes in a CONNECT to 443" not_tls_443
fi
bad_origin() {
	rawq tcp "127.0.0.1:$PA" "b'GET /hello.txt HTTP/1.1\r\nHost: allowed.test:$HP\r\n\r\n'" "403 Forbidden" &&
		has_denial "$T/drvA.out" reason=bad-request detail="origin-form"
}
check "origin-form request is a bad request" bad_origin
bad_host() {
	rawq tcp "127.0.0.1:$PA" "b'GET http://allowed.test:$HP/ HTTP/1.1\r\nHost: evil.test\r\n\r\n'" "Host header does not match" &&
		has_denial "$T/drvA.out" reason=bad-request detail="Host header does not match"
}
check "Host header must agree with the URI" bad_host
bad_fold() {
	rawq tcp "127.0.0.1:$PA" "b'GET http://allowed.test:$HP/ HTTP/1.1\r\nHost: allowed.test:$HP\r\n x: y\r\n\r\n'" "403 Forbidden" && has_denial "$T/drvA.out" reason=bad-request detail="folding"
}
check "obs-fold refused" bad_fold
oversized() {
	rawq tcp "127.0.0.1:$PA" "b'GET http://allowed.test:$HP/ HTTP/1.1\r\nX: ' + b'a' * 20000" "403 Forbidden" && has_denial "$T/drvA.out" reason=bad-request detail="16 KiB"
}
check "request head over 16 KiB refused" oversized
unreachable() {
	local code
	code=$(curl -sS "${PX[@]}" -o "$T/body" -w '%{http_code}' "http://allowed.test:$NP/") || return 1
	[ "$code" = 502 ] && grep -q "cannot connect" "$T/body"
}
check "connection refused upstream is a 502, not a denial" unreachable

# ---- driver B: no test permission, so loopback is refused ----
loopback_refused() {
	local code
	code=$(curl -sS --proxy "http://127.0.0.1:$PB" --max-time 10 -o "$T/bodyB" -w '%{http_code}' \
		"http://allowed.test:$HP/hello.txt") || return 1
	[ "$code" = 403 ] && grep -q "non-public address: 127.0.0.2 (loopback)" "$T/bodyB" &&
		has_denial "$T/drvB.out" reason=private-address host=allowed.test client=cmd-42 detail="127.0.0.2 (loopback)"
}
check "without allow_private_cidrs, loopback upstream is refused (HTTP)" loopback_refused
loopback_refused_connect() {
	local code
	code=$(curl -sS -k --proxy "http://127.0.0.1:$PB" --max-time 10 -o /dev/null -w '%{http_connect}' \
		"https://allowed.test:$TP/" 2>/dev/null) || true
	[ "$code" = 403 ] && has_denial "$T/drvB.out" reason=private-address host=allowed.test port="$TP"
}
check "without allow_private_cidrs, loopback upstream is refused (CONNECT)" loopback_refused_connect

# ---- a bigger transfer through the tunnel and the relay's backpressure ----
head -c 3000000 /dev/urandom >"$T/www/big.bin"
big_ok() {
	curl -sS "${PX[@]}" --limit-rate 20M -o "$T/big.got" "http://allowed.test:$HP/big.bin" &&
		cmp -s "$T/www/big.bin" "$T/big.got"
}
check "3 MB download intact" big_ok

# ---- clean shutdown (leak checkers run at exit) ----
stop_clean() {
	kill -TERM "$1" && wait "$1"
}
check "driver A exits cleanly" stop_clean "$DRV_A"
check "driver B exits cleanly" stop_clean "$DRV_B"
check "Unix socket removed on exit" test ! -e "$T/egress.sock"

finish
