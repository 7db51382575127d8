#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# airlock keygen / pubkey, end to end through the real binary.
# usage: keys_cli.sh PATH/TO/airlock
set -euo pipefail

AIRLOCK=${1:?usage: keys_cli.sh PATH/TO/airlock}
T=$(mktemp -d "${TMPDIR:-/tmp}/airlock-keys-cli.XXXXXX")
trap 'rm -rf "$T"' EXIT
umask 022 # the key file must come out 0600 whatever the umask allows

PASS=0
FAIL=0
ok() { PASS=$((PASS + 1)); echo "ok - $*"; }
not_ok() { FAIL=$((FAIL + 1)); echo "not ok - $*"; }

# run OUT ERR CMD...: run CMD with a timeout, stdout/stderr to files; prints
# the exit status (never fails itself, so set -e does not end the script).
run() {
	local out=$1 err=$2
	shift 2
	local rc=0
	timeout 30 "$@" >"$out" 2>"$err" || rc=$?
	echo "$rc"
}

KEY=$T/host.key

# keygen writes the key and prints its public key: one 44-char line
rc=$(run "$T/gen.out" "$T/gen.err" "$AIRLOCK" keygen -o "$KEY")
lines=$(wc -l <"$T/gen.out")
pub=$(head -n 1 "$T/gen.out")
if [ "$rc" = 0 ] && [ "$lines" = 1 ] && [ ${#pub} = 44 ] && [[ $pub =~ ^[A-Za-z0-9+/]{43}=$ ]]; then
	ok "keygen prints a 44-character public key"
else
	not_ok "keygen: rc=$rc lines=$lines out='$(cat "$T/gen.out")' err='$(cat "$T/gen.err")'"
fi

mode=$(stat -c %a "$KEY" 2>/dev/null || echo missing)
if [ "$mode" = 600 ]; then ok "key file mode is 600"; else not_ok "key file mode is $mode, want 600"; fi

size=$(stat -c %s "$KEY" 2>/dev/null || echo missing)
if [ "$size" = 45 ] && [ "$(ls -A "$T" | grep -c '\.tmp-')" = 0 ]; then
	ok "key file is 45 bytes, no temp file left"
else
	not_ok "key file size $size; dir: $(ls -A "$T" | tr '\n' ' ')"
fi

# pubkey prints the same public key
rc=$(run "$T/pub.out" "$T/pub.err" "$AIRLOCK" pubkey "$KEY")
if [ "$rc" = 0 ] && [ "$(cat "$T/pub.out")" = "$pub" ]; then
	ok "pubkey prints the key keygen printed"
else
	not_ok "pubkey: rc=$rc out='$(cat "$T/pub.out")' want '$pub' err='$(cat "$T/pub.err")'"
fi

# keygen over an existing file fails and leaves it alone
before=$(sha256sum <"$KEY")
rc=$(run "$T/over.out" "$T/over.err" "$AIRLOCK" keygen -o "$KEY")
if [ "$rc" = 1 ] && grep -q "already exists" "$T/over.err" && grep -qF "$KEY" "$T/over.err" &&
	[ ! -s "$T/over.out" ] && [ "$(sha256sum <"$KEY")" = "$before" ]; then
	ok "keygen refuses to overwrite an existing file"
else
	not_ok "keygen over existing: rc=$rc err='$(cat "$T/over.err")'"
fi

# a group/world-readable key file is refused, with the mode and the fix
chmod 644 "$KEY"
rc=$(run "$T/perm.out" "$T/perm.err" "$AIRLOCK" pubkey "$KEY")
if [ "$rc" = 1 ] && grep -q "mode 0644" "$T/perm.err" && grep -qF "chmod 600 $KEY" "$T/perm.err" &&
	[ ! -s "$T/perm.out" ]; then
	ok "pubkey refuses a mode 644 key file"
else
	not_ok "pubkey on 644: rc=$rc out='$(cat "$T/perm.out")' err='$(cat "$T/perm.err")'"
fi
chmod 600 "$KEY"

# a symlink to the key is refused
ln -s "$KEY" "$T/link.key"
rc=$(run "$T/ln.out" "$T/ln.err" "$AIRLOCK" pubkey "$T/link.key")
if [ "$rc" = 1 ] && grep -q "symbolic link" "$T/ln.err"; then
	ok "pubkey refuses a symlink"
else
	not_ok "pubkey on symlink: rc=$rc err='$(cat "$T/ln.err")'"
fi

# usage errors exit 2
rc=$(run "$T/u1.out" "$T/u1.err" "$AIRLOCK" keygen)
if [ "$rc" = 2 ] && grep -q -- "-o FILE" "$T/u1.err"; then
	ok "keygen without -o is a usage error"
else
	not_ok "keygen without -o: rc=$rc err='$(cat "$T/u1.err")'"
fi
rc=$(run "$T/u2.out" "$T/u2.err" "$AIRLOCK" pubkey)
if [ "$rc" = 2 ]; then ok "pubkey without a file is a usage error"; else not_ok "pubkey without a file: rc=$rc"; fi
rc=$(run "$T/u3.out" "$T/u3.err" "$AIRLOCK" keygen -o "$T/x.key" extra)
if [ "$rc" = 2 ] && [ ! -e "$T/x.key" ]; then
	ok "keygen with an extra argument is a usage error"
else
	not_ok "keygen extra argument: rc=$rc"
fi

# a missing or garbage key file: exit 1, named in the message
rc=$(run "$T/m.out" "$T/m.err" "$AIRLOCK" pubkey "$T/missing.key")
if [ "$rc" = 1 ] && grep -qF "$T/missing.key" "$T/m.err"; then
	ok "pubkey on a missing file"
else
	not_ok "pubkey on a missing file: rc=$rc err='$(cat "$T/m.err")'"
fi
(
	umask 077
	echo "not a key" >"$T/garbage.key"
)
rc=$(run "$T/g.out" "$T/g.err" "$AIRLOCK" pubkey "$T/garbage.key")
if [ "$rc" = 1 ] && grep -qF "$T/garbage.key" "$T/g.err"; then
	ok "pubkey on a garbage file"
else
	not_ok "pubkey on garbage: rc=$rc err='$(cat "$T/g.err")'"
fi

# two keygens give two different keys
rc=$(run "$T/gen2.out" "$T/gen2.err" "$AIRLOCK" keygen -o "$T/second.key")
if [ "$rc" = 0 ] && [ "$(cat "$T/gen2.out")" != "$pub" ]; then
	ok "a second keygen gives a different key"
else
	not_ok "second keygen: rc=$rc"
fi

echo "$PASS passed, $FAIL failed"
[ "$FAIL" = 0 ]
