#!/bin/bash
# Fail when an agent binary carries host-only code (doc/ARCHITECTURE.md
# "Layers"): no symbol defined in a host-side layer's library may be
# defined in the agent.
#   agent_symbols.sh AGENT AGENT_STATIC|- HOST_LIB.a...
set -u
agent=$1 agent_static=$2
shift 2
[ $# -gt 0 ] || { echo "agent_symbols: no host libraries given"; exit 2; }
command -v nm >/dev/null || { echo "skip: agent_symbols needs nm (binutils)"; exit 77; }
host=$(mktemp) ; trap 'rm -f "$host"' EXIT
# global definitions (text, data, bss, read-only) of every host library
nm -g --defined-only "$@" 2>/dev/null | awk 'NF == 3 && $2 ~ /^[TDBRV]$/ { print $3 }' | sort -u >"$host"
n=$(wc -l <"$host")
[ "$n" -gt 50 ] || { echo "agent_symbols: only $n symbols in the host libraries: wrong arguments?"; exit 2; }
status=0
for a in "$agent" "$agent_static"; do
	[ "$a" = - ] && continue
	found=$(nm --defined-only "$a" | awk 'NF == 3 { print $3 }' | sort -u | comm -12 - "$host")
	if [ -n "$found" ]; then
		echo "$a carries host-only code ($(wc -l <<<"$found") symbols of host-side layers):"
		sed "s/^/  /" <<<"$found"
		status=1
	else
		echo "ok - $a: none of the $n host-side symbols"
	fi
done
exit $status
