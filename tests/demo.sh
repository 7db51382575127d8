#!/bin/sh
# The README's main command: install what is missing, build, and run
# airlock's main job on the embedded default: `airlock up DIR` with no guest
# options starts the local sandbox (doc/SANDBOX.md) with keys made and pinned
# by itself, mounts a copy of the demo project (tests/demo/project) over
# itself and keeps the sandbox's copy in sync live, minus the .env (a fake
# production secret); `airlock exec` runs the demo's tests in the sandbox,
# an edit through the mount is seen by the very next command, the sandbox's
# boundary is shown from inside, a request to a host not on egress.allow is
# refused (one line on the command's stderr); `airlock audit` shows why the
# .env was withheld and the egress denial with its command; `airlock
# status`, the channel's latency floor against the sandbox's agent, a
# stranger's key refused, `airlock down` and `airlock down --destroy`.
set -eu
cd "$(dirname "$0")/.."
# AIRLOCK_BUILD: an already-built build directory (the test suite runs this
# script as the 'demo' test that way); otherwise install what is missing and build.
if [ -n "${AIRLOCK_BUILD:-}" ]; then
	B=$AIRLOCK_BUILD
else
	sh tests/deps.sh
	[ -f build/build.ninja ] || meson setup build >/dev/null
	ninja -C build >/dev/null
	B=build
fi
if [ ! -c /dev/fuse ] || [ "$(id -u)" -ne 0 ]; then
	echo "demo: needs root and /dev/fuse (airlock up mounts the project over itself)" >&2
	[ -n "${AIRLOCK_BUILD:-}" ] && exit 77
	exit 1
fi

T=$(mktemp -d /tmp/airlock-demo.XXXXXX)
export XDG_STATE_HOME="$T/state" # the audit record stays in the demo's temp dir
export XDG_DATA_HOME="$T/data"   # so does the sandbox's state
P=$T/project
cleanup() {
	$B/airlock down "$P" --destroy >/dev/null 2>&1 || true
	rm -rf "$T"
}
trap cleanup EXIT INT TERM

# Refusals the demo provokes on purpose are shown marked, so they do not
# read as failures: "[expected refusal] ...".
expected() { sed 's/^/   [expected refusal] /'; }

cp -a tests/demo/project "$P"
echo "== airlock up $P   (no guest options: the embedded local sandbox, keys made and pinned by itself)"
$B/airlock up "$P" -d
SB=$($B/airlock status -C "$P" --json | sed -n 's/.*"sandbox_dir":"\([^"]*\)".*/\1/p')

if grep -rq AIRLOCK-DEMO-CANARY "$SB/workspace"; then
	echo "demo: the .env secret reached the sandbox" >&2
	exit 1
fi
echo "-- the sandbox's copy ($SB/workspace): no .env"
(cd "$SB/workspace" && find . -path ./.git -prune -o -print | sort)

echo "== airlock exec -- sh tests/test_greet.sh   (runs in the sandbox, without the .env)"
$B/airlock exec -C "$P" -- sh tests/test_greet.sh
echo "-- an editor saves a change through the mount; the very next command sees it:"
echo "Edited at $(date -u +%H:%M:%S.%N)." >>"$P/README.md"
echo "   host:    $(tail -1 "$P/README.md")"
echo "   sandbox: $($B/airlock exec -C "$P" -- tail -1 README.md)"
echo "-- the sandbox from inside:"
$B/airlock exec -C "$P" -- sh -c '
	echo "   $(id -un) (uid $(id -u)) in $(pwd); HOME=$HOME; $(env | wc -l) variables; $(grep ^CapEff /proc/self/status)"
	echo "   processes: $(ps -e -o pid=,comm= | tr -s " \n" " ")"
	echo "   /root: $(ls /root 2>&1 | head -1)"
	echo "   write /usr: $( (echo x >/usr/x) 2>&1 | sed "s/.*: //") [expected refusal]"
	echo "   network: $(ip -o link | cut -d: -f2 | tr -d "\n");" \
		"DNS: $(getent hosts deb.debian.org >/dev/null 2>&1 && echo resolves || echo none)"
	echo "   grep for the .env canary: $(grep -rl AIRLOCK-DEMO-CANARY . 2>/dev/null | wc -l) files"'
echo "-- egress: curl https://example.com from the sandbox (not on the policy's egress.allow: refused before any lookup)"
if $B/airlock exec -C "$P" -- curl -sS --max-time 10 -o /dev/null https://example.com 2>"$T/egress.err"; then
	echo "demo: example.com was reached from the sandbox" >&2
	exit 1
fi
expected <"$T/egress.err"
grep -q '^airlock: egress denied CONNECT example.com:443 (not-allowed' "$T/egress.err" ||
	{ echo "demo: no egress denial line on the command's stderr" >&2; exit 1; }
echo "== airlock audit: the .env stayed on the host (and the rule), the egress denial (and the command)"
# the daemon writes the denial record within 100 ms (EGRESS_LINK_WRITE_MS)
i=0
until $B/airlock audit -C "$P" | grep -q 'denied CONNECT example.com:443 (not-allowed'; do
	i=$((i + 1))
	[ "$i" -lt 50 ] || { echo "demo: the denial is not in airlock audit" >&2; exit 1; }
	sleep 0.1
done
$B/airlock audit -C "$P"
echo "== airlock status"
$B/airlock sync-wait -C "$P" # also makes the daemon write a fresh status
$B/airlock status -C "$P"

echo "== airlock ping: the sandbox's agent over its Unix socket, 1000 round trips, 64 MiB bulk"
GUEST=$($B/airlock pubkey "$SB/keys/guest.key")
$B/airlock ping --guest "unix:$SB/run/agent.sock" --key "$SB/keys/host.key" --guest-key "$GUEST" -n 1000 --bulk 64M

echo "== a host key the sandbox does not know is refused before any data moves"
$B/airlock keygen -o "$T/stranger.key" >/dev/null
if $B/airlock ping --guest "unix:$SB/run/agent.sock" --key "$T/stranger.key" --guest-key "$GUEST" -n 1 2>"$T/stranger.err"; then
	echo "demo: the stranger was let in" >&2
	exit 1
fi
expected <"$T/stranger.err"

echo "== a second workspace inside the live one is refused (one mount would hide the other)"
mkdir -p "$P/inner"
if $B/airlock up "$P/inner" -d 2>"$T/inner.err"; then
	echo "demo: a workspace inside a live one was accepted" >&2
	exit 1
fi
expected <"$T/inner.err"
rmdir "$P/inner"

echo "== airlock down: unmount, stop the sandbox (its state is kept for the next up)"
$B/airlock down "$P"
echo "== the sandbox's agent log"
cat "$SB/agent.log"
echo "== airlock down --destroy: remove the sandbox's state"
$B/airlock down "$P" --destroy
[ ! -e "$SB" ] || { echo "demo: $SB still exists" >&2; exit 1; }
