#!/bin/bash
# The checks of this folder must be able to fail: each is run on a case
# made to break it, and must name what is wrong.
#   selftest.sh LAYERS_PY AGENT_SYMBOLS_SH AIRLOCK HOST_LIB...
set -u
layers=$1 syms=$2 airlock=$3
shift 3
here=$(cd "$(dirname "$0")" && pwd)
pass=0 fail=0
expect() { # expect NAME PATTERN OUTPUT
	if grep -qF -- "$2" <<<"$3"; then pass=$((pass + 1)); echo "ok - $1"; else
		fail=$((fail + 1)); echo "not ok - $1: no line with: $2"; echo "$3" | sed 's/^/# /'; fi
}
out=$(python3 "$layers" "$here/fixture"); rc=$?
expect "layers: exits 1 on violations" "rc=1" "rc=$rc"
expect "layers: an upward include" "relay/core/up.c:2: core includes airlock/sync/sync.h: layer sync is not below core" "$out"
expect "layers: guest into host" "guest-agent/cross.c:2: guest (guest side) includes airlock/host/route.h (host side)" "$out"
expect "layers: a relative path" "guest-agent/cross.c:3: \"../relay/core/transport_i.h\"" "$out"
expect "layers: a file outside the layers" "fs/stray/x.c: not in any layer's folder" "$out"
expect "layers: an allowed include is not reported" "layers: 3 files, 4 violations" "$out"
# The airlock binary is full of host code: as an "agent" it must fail.
out=$(bash "$syms" "$airlock" - "$@" 2>&1); rc=$?
expect "agent_symbols: exits 1 on host code" "rc=1" "rc=$rc"
expect "agent_symbols: names a host symbol" "relay_new" "$out"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
