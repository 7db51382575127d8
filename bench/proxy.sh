#!/usr/bin/env bash
# Egress through the channel vs direct (doc/EGRESS.md "Reaching the proxy"):
# download throughput and per-request latency (TCP connect + request to first byte, and TLS
# handshake through CONNECT) for curl run
#   direct   in the host-side network namespace, straight to the server;
#   channel  in the guest via `airlock exec` (agent in a namespace with only loopback), through
#            the agent's per-command listener, a proxy stream over the channel (unix socket) and
#            the egress proxy in `airlock up`.
# Same topology as tests/e2e/proxy_e2e.sh: servers in their own namespace on 1.2.3.4, names from a
# bind-mounted /etc/hosts in the daemon's namespace.
#
# usage: bench/proxy.sh BUILD [REQUESTS] [MIB]    (root + /dev/fuse; default 200 requests, 256 MiB)
set -euo pipefail

B=${1:?usage: bench/proxy.sh BUILD [REQUESTS] [MIB]}
N=${2:-200}
MIB=${3:-256}
AIRLOCK=$(realpath "$B/airlock")
AGENT=$(realpath "$B/airlock-agent")
T=$(mktemp -d /tmp/airlock-proxybench.XXXXXX)
NS_S=albs$$
NS_C=albc$$
PIDS=()
cleanup() {
	"$AIRLOCK" down "$T/work" >/dev/null 2>&1 || true
	for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
	ip netns pids "$NS_S" 2>/dev/null | xargs -r kill 2>/dev/null || true
	ip netns pids "$NS_C" 2>/dev/null | xargs -r kill 2>/dev/null || true
	sleep 0.2
	ip netns del "$NS_S" 2>/dev/null || true
	ip netns del "$NS_C" 2>/dev/null || true
	rm -rf "$T"
}
trap cleanup EXIT
chmod 0711 "$T"
export XDG_STATE_HOME=$T/state AIRLOCK_SOCKET=$T/relay.sock

ip netns add "$NS_S"
ip netns add "$NS_C"
ip link add "abc$$" type veth peer name "abs$$"
ip link set "abc$$" netns "$NS_C"
ip link set "abs$$" netns "$NS_S"
ip -n "$NS_C" addr add 1.2.3.1/24 dev "abc$$"
ip -n "$NS_S" addr add 1.2.3.4/24 dev "abs$$"
for n in "$NS_C" "$NS_S"; do ip -n "$n" link set lo up; done
ip -n "$NS_C" link set "abc$$" up
ip -n "$NS_S" link set "abs$$" up

mkdir -p "$T/www" "$T/work" "$T/guest"
head -c $((MIB << 20)) /dev/zero >"$T/www/big"
echo small >"$T/www/small"
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=allowed.test" \
	-addext "subjectAltName=DNS:allowed.test" -keyout "$T/tls.key" -out "$T/tls.pem" 2>/dev/null
chmod 0644 "$T/tls.pem"
ip netns exec "$NS_S" python3 -m http.server 80 --bind 1.2.3.4 --directory "$T/www" >/dev/null 2>&1 &
PIDS+=($!)
ip netns exec "$NS_S" openssl s_server -quiet -accept 1.2.3.4:443 -cert "$T/tls.pem" -key "$T/tls.key" \
	-www >/dev/null 2>&1 &
PIDS+=($!)
printf '127.0.0.1 localhost\n1.2.3.4 allowed.test\n' >"$T/hosts"
echo '{ "egress": { "default": "deny", "allow": ["allowed.test"] } }' >"$T/work/airlock.json"
export XDG_CONFIG_HOME=$T/config # the trust store: the workspace policy's egress.allow needs the user's approval
"$AIRLOCK" trust "$T/work" 2>/dev/null
"$AIRLOCK" keygen -o "$T/hk" >"$T/hk.pub"
"$AIRLOCK" keygen -o "$T/gk" >"$T/gk.pub"
unshare -n sh -c 'ip link set lo up && exec "$0" "$@"' "$AGENT" --listen "unix:$T/a.sock" --root "$T/guest" \
	--key "$T/gk" --allow "$(cat "$T/hk.pub")" --state "$T/agent.state" --fsync none >"$T/agent.out" 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do grep -q '^ready' "$T/agent.out" 2>/dev/null && break; sleep 0.05; done
ip netns exec "$NS_C" unshare -m sh -c 'mount --bind "$0" /etc/hosts && exec "$@"' "$T/hosts" \
	"$AIRLOCK" up "$T/work" --guest "unix:$T/a.sock" --key "$T/hk" --guest-key "$(cat "$T/gk.pub")" \
	>"$T/up.out" 2>&1 &
PIDS+=($!)
for _ in $(seq 200); do grep -q 'in sync with' "$T/up.out" 2>/dev/null && break; sleep 0.05; done
for _ in $(seq 100); do
	ip netns exec "$NS_C" curl -s --max-time 1 -o /dev/null http://1.2.3.4/small && break
	sleep 0.1
done

DIRECT() { ip netns exec "$NS_C" unshare -m sh -c 'mount --bind "$0" /etc/hosts && exec "$@"' "$T/hosts" "$@"; }
CHANNEL() { "$AIRLOCK" exec -C "$T/work" -- "$@" </dev/null; }

# stats LABEL: p50/p99/mean (ms) of the seconds on stdin
stats() {
	sort -g | awk -v l="$1" '{ v[NR] = $1 * 1000; s += v[NR] } END {
		printf "  %-34s p50 %7.3f ms  p99 %7.3f ms  mean %7.3f ms  (n=%d)\n", l, v[int((NR - 1) * 0.5) + 1],
			v[int((NR - 1) * 0.99) + 1], s / NR, NR }'
}

# LOOP URL [CURL ARGS]: N sequential requests, one line "starttransfer appconnect" each
LOOP='u=$1; shift; for i in $(seq '"$N"'); do curl -s -o /dev/null -w "%{time_starttransfer} %{time_appconnect}\n" "$@" "$u"; done'
echo "# egress: direct vs through the channel proxy ($(nproc) cores, $(uname -r)); $N requests, $MIB MiB"
for way in DIRECT CHANNEL; do
	echo "$way"
	$way sh -c "$LOOP" loop http://allowed.test/small >"$T/http.$way"
	cut -d' ' -f1 "$T/http.$way" | stats "HTTP GET small: to first byte"
	$way sh -c "$LOOP" loop https://allowed.test/ --cacert "$T/tls.pem" >"$T/tls.$way"
	cut -d' ' -f2 "$T/tls.$way" | stats "HTTPS (CONNECT): TLS handshake done"
	for run in 1 2 3; do
		$way curl -s -o /dev/null -w "%{speed_download}\n" http://allowed.test/big
	done | sort -g | awk '{ v[NR] = $1 } END { printf "  %-34s median %7.1f MiB/s (3 runs: %.1f %.1f %.1f)\n",
		"download " '"$MIB"' " MiB", v[2] / 1048576, v[1] / 1048576, v[2] / 1048576, v[3] / 1048576 }'
done
