#!/usr/bin/env bash
# Trust for the repository's own policy end to end: a real agent and
# `airlock up` over a workspace whose airlock.json asks for `sh -c pwd` on the host
# (execution.local), a host variable in the guest (forward_env) and its .env
# in the guest (allow_secrets). Until `airlock trust` approves it none of
# that happens, and up, status and audit name each ignored key; approved, it
# all does; a change to the file's bytes needs a new approval, and
# --revoke withdraws one.
# usage: trust_e2e.sh AIRLOCK AIRLOCK_AGENT   (root + /dev/fuse, else skipped: exit 77)
# shellcheck source=tests/e2e/lib.sh
source "$(dirname "$0")/lib.sh"

AIRLOCK=$1
AGENT=$2
if [ "$(id -u)" != 0 ] || [ ! -c /dev/fuse ]; then
	echo "skip - trust_e2e needs root and /dev/fuse (uid $(id -u), /dev/fuse $([ -c /dev/fuse ] && echo present || echo missing))"
	exit 77
fi
chmod 0711 "$T" # commands run as nobody in the guest
export XDG_STATE_HOME=$T/state
export XDG_CONFIG_HOME=$T/config # the trust store: $XDG_CONFIG_HOME/airlock/trust
export AIRLOCK_SOCKET=$T/relay.sock
export TRUST_FWD=forwarded-$$
CANARY=trust-e2e-dotenv-$$
TO="timeout -k 2"

make_pair # $T/hk, $T/gk, HPUB, GPUB; W=$T/work, G=$T/guest
cat >"$W/airlock.json" <<'EOF'
{ "execution": { "local": ["sh -c pwd"] },
  "credentials": { "forward_env": ["TRUST_FWD"] },
  "workspace": { "sync": { "allow_secrets": [".env"], "exclude": ["build/"] } } }
EOF
echo "API_KEY=$CANARY" >"$W/.env"
mkdir -p "$W/build"
echo artefact >"$W/build/out.o"
echo hello >"$W/a.txt"
NOTE="ignored from the untrusted $W/airlock.json: execution.local, credentials.forward_env, workspace.sync.allow_secrets; review it, then run: airlock trust $W"

start_bg agent "$AGENT" --listen "unix:$T/a.sock" --root "$G" --key "$T/gk" --allow "$HPUB" \
	--state "$T/agent.state" --fsync none
wait_line "$T/agent.out" '^ready' 10

# up_start: airlock up in the background ($UP_PID, logs $T/up.*), in sync.
up_start() {
	start_bg up "$AIRLOCK" up "$W" --guest "unix:$T/a.sock" --key "$T/hk" --guest-key "$GPUB"
	UP_PID=$BG_PID
	wait_line "$T/up.out" "^airlock: $W in sync with unix:$T/a.sock\$" 20
}
X() { $TO 20 "$AIRLOCK" exec -C "$W" "$@" </dev/null; }

# untrusted: where sh runs (its cwd: the guest's copy, not the host's
# workspace), what it sees of TRUST_FWD, and the guest's copy; the
# tightening key (exclude) applies all the same
t_untrusted() {
	local where fwd
	where=$(X -- sh -c pwd) || return 1
	[ "$where" = "$G" ] || { echo "sh ran in $where, not in the guest's $G" >&2; return 1; }
	fwd=$(X -- sh -c 'printf %s "${TRUST_FWD:-unset}"') || return 1
	[ "$fwd" = unset ] || { echo "the guest got TRUST_FWD=$fwd" >&2; return 1; }
	[ ! -e "$G/.env" ] || { echo ".env reached the guest" >&2; return 1; }
	! grep -rq "$CANARY" "$G" || { echo "the .env canary is in the guest's copy" >&2; return 1; }
	[ ! -e "$G/build/out.o" ] || { echo "the untrusted file's exclude did not apply" >&2; return 1; }
	[ -e "$G/a.txt" ] || { echo "a.txt did not sync" >&2; return 1; }
}

t_named() {
	grep -qxF "airlock: $NOTE" "$T/up.err" || { echo "up did not say: $NOTE" >&2; cat "$T/up.err" >&2; return 1; }
	$TO 10 "$AIRLOCK" status -C "$W" | grep -qxF "untrusted   $NOTE" ||
		{ echo "status does not name the ignored keys" >&2; "$AIRLOCK" status -C "$W" >&2; return 1; }
	$TO 10 "$AIRLOCK" status -C "$W" --json | grep -qF '"keys":["execution.local","credentials.forward_env","workspace.sync.allow_secrets"]' ||
		{ echo "status --json does not list the keys" >&2; return 1; }
	$TO 10 "$AIRLOCK" audit -C "$W" | grep -qxF "untrusted $NOTE" ||
		{ echo "audit does not name the ignored keys" >&2; "$AIRLOCK" audit -C "$W" >&2; return 1; }
}

up_start
check "untrusted: no sh on the host, no forwarded variable, no .env in the guest; exclude applies" t_untrusted
check "untrusted: up, status and audit name each ignored key and the command to approve" t_named
check "down" t_up_down

t_trust() {
	$TO 10 "$AIRLOCK" trust "$W" 2>"$T/trust.err" || { cat "$T/trust.err" >&2; return 1; }
	grep -qF "which allows: execution.local, credentials.forward_env, workspace.sync.allow_secrets" "$T/trust.err" ||
		{ echo "trust did not say what it allows" >&2; cat "$T/trust.err" >&2; return 1; }
	local rec
	rec=$(find "$XDG_CONFIG_HOME/airlock/trust" -type f)
	[ "$(echo "$rec" | wc -l)" = 1 ] && [ "$(stat -c %a "$rec")" = 600 ] &&
		[ "$(stat -c %a "$XDG_CONFIG_HOME/airlock/trust")" = 700 ] ||
		{ echo "trust record: $rec, modes $(stat -c '%n %a' "$XDG_CONFIG_HOME/airlock/trust" $rec)" >&2; return 1; }
	$TO 10 "$AIRLOCK" trust --list | grep -qxF "$W  trusted"
}
check "airlock trust: one record (0600 in a 0700 store), listed as trusted" t_trust

t_trusted() {
	local where fwd
	! grep -qF "ignored from the untrusted" "$T/up.err" || { echo "up still ignores keys" >&2; return 1; }
	where=$(X -- sh -c pwd) || return 1
	[ "$where" = "$W" ] || { echo "trusted: sh ran in $where, not on the host in $W" >&2; return 1; }
	fwd=$(X -- printenv TRUST_FWD) || return 1
	[ "$fwd" = "$TRUST_FWD" ] || { echo "trusted: the guest got TRUST_FWD='$fwd'" >&2; return 1; }
	grep -qF "$CANARY" "$G/.env" || { echo "trusted: .env is not in the guest" >&2; return 1; }
	! $TO 10 "$AIRLOCK" status -C "$W" | grep -q '^untrusted'
}
up_start
check "trusted: sh on the host, the variable and .env in the guest" t_trusted
check "down" t_up_down

# one byte more: the approval no longer covers the file
echo " " >>"$W/airlock.json"
rm -f "$G/.env" # what the trusted run sent; the untrusted one must not send it again
t_changed() {
	$TO 10 "$AIRLOCK" trust --list | grep -qF "$W  changed since approved" || return 1
	t_untrusted && t_named
}
up_start
check "changed after approval: untrusted again, named again" t_changed
check "down" t_up_down

t_revoke() {
	$TO 10 "$AIRLOCK" trust "$W" 2>/dev/null || return 1
	$TO 10 "$AIRLOCK" trust --list | grep -qxF "$W  trusted" || return 1
	$TO 10 "$AIRLOCK" trust --revoke "$W" 2>"$T/revoke.err" || return 1
	grep -q "approval withdrawn" "$T/revoke.err" || return 1
	[ -z "$($TO 10 "$AIRLOCK" trust --list)" ] || return 1
	up_start
	t_untrusted && t_named
}
check "trust --revoke: untrusted again" t_revoke
check "down" t_up_down

t_outside() {
	# the same content passed from outside the workspace is the user's own
	cp "$W/airlock.json" "$T/mine.json"
	start_bg up "$AIRLOCK" up "$W" --policy "$T/mine.json" --guest "unix:$T/a.sock" --key "$T/hk" --guest-key "$GPUB"
	UP_PID=$BG_PID
	wait_line "$T/up.out" "^airlock: $W in sync with unix:$T/a.sock\$" 20 || return 1
	local where
	where=$(X -- sh -c pwd) || return 1
	[ "$where" = "$W" ] || { echo "--policy from outside: sh ran in $where" >&2; return 1; }
	! grep -qF "ignored from the untrusted" "$T/up.err"
}
check "--policy FILE from outside the workspace applies as written" t_outside
check "down" t_up_down
check "no sanitizer reports" t_no_sanitizer_reports
finish
