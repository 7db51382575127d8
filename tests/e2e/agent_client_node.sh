#!/usr/bin/env bash
# clients/node (the relay client library for editor extensions) against a
# real `airlock up` and agent: node's test runner runs clients/node/test/
# with AIRLOCK_SOCKET and the workspace mount (AIRLOCK_TEST_W).
# usage: agent_client_node.sh AIRLOCK AIRLOCK_AGENT   (root + /dev/fuse + node, else skipped: exit 77)
# shellcheck source=tests/e2e/lib.sh
source "$(dirname "$0")/lib.sh"
# shellcheck source=tests/e2e/agent_lib.sh
source "$(dirname "$0")/agent_lib.sh"

AIRLOCK=$1
AGENT=$2
SRC=$(cd "$(dirname "$0")/../.." && pwd)
if [ "$(id -u)" != 0 ] || [ ! -c /dev/fuse ]; then
	echo "skip - agent_client_node needs root and /dev/fuse (uid $(id -u), /dev/fuse $([ -c /dev/fuse ] && echo present || echo missing))"
	exit 77
fi
command -v node >/dev/null || { echo "skip - agent_client_node needs node (tests/deps.sh installs nodejs)"; exit 77; }
chmod 0711 "$T"
export XDG_STATE_HOME=$T/state AIRLOCK_SOCKET=$T/relay.sock
make_pair # $T/hk, $T/gk, HPUB, GPUB; W=$T/work, G=$T/guest
mkdir -p "$W/sub"
chmod 0777 "$G" # commands run as nobody in the guest: let them write the workspace copy
echo "HOST_SECRET=x" >"$W/.env"
pair_up

t_node() {
	(cd "$SRC/clients/node" && AIRLOCK_TEST_W=$W timeout 120 node --test test/) >"$T/node.out" 2>&1 ||
		{ cat "$T/node.out" >&2; return 1; }
	grep -E '^# (pass|fail)' "$T/node.out"
}
check "clients/node: node --test against the relay of a real airlock up" t_node
check "down ends airlock up cleanly" t_up_down
check "no sanitizer reports from airlock up or the agent" t_no_sanitizer_reports
finish
