#!/bin/sh
# The README's main command: install what is missing, build, and run
# airlock's main job on the embedded default. Until the local sandbox lands
# (issue "Embedded default sandbox"), the guest agent runs as a plain
# process on a private Unix socket: pinned keys both ways, the demo project
# (tests/demo/project) mirrored into the guest minus its .env, the audit of
# what was withheld, `airlock up` keeping a mounted copy in sync live while
# `airlock exec` runs the demo's tests in the guest, the channel's latency
# floor (1000 round trips and a 256 MiB bulk transfer), and a stranger's
# key refused.
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

T=$(mktemp -d /tmp/airlock-demo.XXXXXX)
export XDG_STATE_HOME="$T/state" # the audit record stays in the demo's temp dir
agent_pid=
cleanup() {
	[ -n "$agent_pid" ] && kill "$agent_pid" 2>/dev/null && wait "$agent_pid" 2>/dev/null
	rm -rf "$T"
}
trap cleanup EXIT INT TERM

echo "== keys: one for the host, one for the guest (private files are mode 0600)"
host=$($B/airlock keygen -o "$T/host.key")
guest=$($B/airlock keygen -o "$T/guest.key")
echo "host  $host"
echo "guest $guest"

echo "== guest agent: listens on unix:$T/agent.sock, accepts only the host key"
$B/airlock-agent --listen "unix:$T/agent.sock" --root "$T/workspace" --key "$T/guest.key" \
	--allow "$host" >"$T/agent.out" 2>"$T/agent.log" &
agent_pid=$!
i=0
until grep -q '^ready' "$T/agent.out" 2>/dev/null; do
	i=$((i + 1))
	[ $i -lt 250 ] || { cat "$T/agent.log" >&2; exit 1; }
	sleep 0.02
done

echo "== airlock sync: the demo project into the guest (policy: tests/demo/project/airlock.json)"
$B/airlock sync tests/demo/project --guest "unix:$T/agent.sock" --key "$T/host.key" --guest-key "$guest"
echo "-- the guest's copy:"
(cd "$T/workspace" && find . -path ./.git -prune -o -print | sort)
if grep -rq AIRLOCK-DEMO-CANARY "$T/workspace"; then
	echo "demo: the .env secret reached the guest" >&2
	exit 1
fi
echo "-- the .env canary is nowhere in the guest; airlock audit says why:"
$B/airlock audit -C tests/demo/project

if [ -c /dev/fuse ]; then
	echo "== airlock up: mount a copy of the demo project over itself, keep the guest in sync live"
	cp -a tests/demo/project "$T/project"
	chmod 711 "$T" # commands run as nobody in the guest and must reach its workspace copy
	$B/airlock up "$T/project" --guest "unix:$T/agent.sock" --key "$T/host.key" --guest-key "$guest" \
		>"$T/up.out" 2>"$T/up.err" &
	up_pid=$!
	i=0
	until grep -q 'in sync' "$T/up.err" "$T/up.out" 2>/dev/null; do
		i=$((i + 1))
		[ $i -lt 500 ] || { cat "$T/up.err" >&2; exit 1; }
		sleep 0.02
	done
	cat "$T/up.out" "$T/up.err"
	echo "-- airlock exec -- sh tests/test_greet.sh   (runs in the guest, as nobody, without the .env)"
	$B/airlock exec -C "$T/project" -- sh tests/test_greet.sh
	echo "-- an editor saves a change through the mount; the very next command sees it:"
	echo "Edited at $(date -u +%H:%M:%S.%N)." >>"$T/project/README.md"
	echo "   host:  $(tail -1 "$T/project/README.md")"
	echo "   guest: $($B/airlock exec -C "$T/project" -- tail -1 README.md)"
	$B/airlock exec -C "$T/project" -- sh -c 'echo "guest: $(id -un) in $(pwd); HOME=$HOME; env has $(env | wc -l) variables"'
	$B/airlock sync-wait -C "$T/project" # also makes the daemon write a fresh status
	$B/airlock status -C "$T/project"
	$B/airlock down "$T/project"
	wait "$up_pid" 2>/dev/null || true
else
	echo "== (no /dev/fuse here: skipping airlock up / exec)"
fi

echo "== airlock ping: Noise IKpsk2 handshake, 1000 round trips, 256 MiB bulk"
$B/airlock ping --guest "unix:$T/agent.sock" --key "$T/host.key" --guest-key "$guest" -n 1000 --bulk 256M

echo "== a host key the guest does not know is refused before any data moves"
$B/airlock keygen -o "$T/stranger.key" >/dev/null
if $B/airlock ping --guest "unix:$T/agent.sock" --key "$T/stranger.key" --guest-key "$guest" -n 1; then
	echo "demo: the stranger was let in" >&2
	exit 1
fi
echo "== agent log"
cat "$T/agent.log"
