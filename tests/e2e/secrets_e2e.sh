#!/usr/bin/env bash
# Secrets through a real `airlock up` mount: editors' save schemes and
# copies of a secret never put its bytes in the guest, not even for a
# moment. A watcher polls the guest's tree for the markers during every
# step; the audit record names what was withheld and why, never a value.
# usage: secrets_e2e.sh AIRLOCK AIRLOCK_AGENT   (root + /dev/fuse, else skipped: exit 77)
# shellcheck source=tests/e2e/lib.sh
source "$(dirname "$0")/lib.sh"

AIRLOCK=$1
AGENT=$2
if [ "$(id -u)" != 0 ] || [ ! -c /dev/fuse ]; then
	echo "skip - secrets_e2e needs root and /dev/fuse (uid $(id -u), /dev/fuse $([ -c /dev/fuse ] && echo present || echo missing))"
	exit 77
fi
export XDG_STATE_HOME=$T/state
TO="timeout -k 2"

make_pair # $T/hk, $T/gk, HPUB, GPUB; W=$T/work, G=$T/guest

# Values a content rule would not see: only the name rules, the copy
# hashes and the temporaries rule keep them out.
echo "MODE=zqmark-0" >"$W/.env"
mkdir -p "$W/src"
echo "int main(void) { return 0; }" >"$W/src/main.c"

start_bg agent "$AGENT" --listen "unix:$T/a.sock" --root "$G" --key "$T/gk" --allow "$HPUB" \
	--state "$T/agent.state" --fsync none
wait_line "$T/agent.out" '^ready' 10
start_bg up "$AIRLOCK" up "$W" --guest "unix:$T/a.sock" --key "$T/hk" --guest-key "$GPUB"
UP_PID=$BG_PID
wait_line "$T/up.out" "^airlock: $W in sync with unix:$T/a.sock\$" 20
syncwait() { $TO 40 "$AIRLOCK" sync-wait -C "$W" --timeout 30; }

# The watcher: every few milliseconds, any guest file holding a marker
# is logged (a file that was there for a moment counts).
: >"$T/seen"
(
	while [ ! -e "$T/stop" ]; do
		grep -rls zqmark "$G" >>"$T/seen" 2>/dev/null || true
		sleep 0.002
	done
) &
WATCH=$!
PIDS+=("$WATCH")

t_watcher_sees() { # the watcher works: an ordinary file with a marker is seen
	echo "zqmark-visible" >"$W/src/probe.txt"
	syncwait || return 1
	local i
	for ((i = 0; i < 500; i++)); do
		grep -q probe.txt "$T/seen" && break
		sleep 0.01
	done
	grep -q probe.txt "$T/seen" || return 1
	rm "$W/src/probe.txt"
	syncwait || return 1
	sleep 0.1
	: >"$T/seen"
}
check "the watcher sees a marker that reaches the guest" t_watcher_sees

none_seen() {
	if [ -s "$T/seen" ]; then
		sort -u "$T/seen" >&2
		return 1
	fi
	! grep -rqs zqmark "$G"
}

t_jetbrains() { # JetBrains safe write, 10 saves with new values
	local i
	for i in $(seq 1 10); do
		echo "MODE=zqmark-jb$i" >"$W/.env___jb_tmp___"
		mv "$W/.env" "$W/.env___jb_old___"
		mv "$W/.env___jb_tmp___" "$W/.env"
		rm "$W/.env___jb_old___"
		sleep 0.05
	done
	syncwait && none_seen && grep -q zqmark-jb10 "$W/.env"
}
check "JetBrains safe write x10 (tmp, rename old, rename onto .env): no value reaches the guest" t_jetbrains

t_sed() { # sed -i writes ./sedXXXXXX beside .env and renames it onto it
	local i
	for i in 1 2 3 4 5; do
		(cd "$W" && sed -i "s/zqmark-[a-z0-9]*/zqmark-sed$i/" .env)
		sleep 0.05
	done
	syncwait && none_seen && grep -q zqmark-sed5 "$W/.env"
}
check "sed -i on .env x5: no value reaches the guest" t_sed

t_vim() { # vim: a 4913 probe, a swap file, a backup renamed aside, .env written anew
	: >"$W/4913" && rm "$W/4913"
	cp "$W/.env" "$W/..env.swp"
	mv "$W/.env" "$W/.env~"
	echo "MODE=zqmark-vim" >"$W/.env"
	rm "$W/..env.swp"
	syncwait && none_seen && [ ! -e "$G/.env~" ]
}
check "vim-style save (4913, .swp, backup ~): no value reaches the guest" t_vim

t_cp() {
	cp "$W/.env" "$W/notes.txt"
	syncwait && none_seen && [ ! -e "$G/notes.txt" ] &&
		"$AIRLOCK" audit -C "$W" >"$T/audit.txt" && grep -q 'notes.txt.*same content as withheld' "$T/audit.txt"
}
check "cp .env notes.txt: the copy is withheld (audit says why)" t_cp

t_mv() {
	mv "$W/.env" "$W/env.txt"
	syncwait && none_seen && [ ! -e "$G/env.txt" ]
}
check "mv .env env.txt: the renamed file is withheld" t_mv

t_backup() {
	echo "MODE=zqmark-tilde" >"$W/.env~"
	echo "MODE=zqmark-bak" >"$W/.netrc.bak"
	syncwait && none_seen && [ ! -e "$G/.env~" ] && [ ! -e "$G/.netrc.bak" ]
}
check ".env~ and .netrc.bak are withheld" t_backup

t_content() { # a token in an ordinary file: withheld; audit names rule and line, not the value
	local tok=gh
	tok+=p_q8Zr2LmV0xKp4TbN7yWc1sHd9gFj3uEa6oRi
	printf '// settings\nconst token = "%s";\n' "$tok" >"$W/src/settings.ts"
	syncwait || { echo "sync-wait failed" >&2; return 1; }
	[ ! -e "$G/src/settings.ts" ] || { echo "src/settings.ts reached the guest" >&2; "$AIRLOCK" audit -C "$W" >&2; cat "$G/src/settings.ts" >&2; "$AIRLOCK" status -C "$W" >&2; return 1; }
	"$AIRLOCK" audit -C "$W" >"$T/audit.txt" || return 1
	"$AIRLOCK" audit -C "$W" --json >>"$T/audit.txt" || return 1
	grep -q 'src/settings.ts.*secret content: github-pat .* at line 2' "$T/audit.txt" &&
		! grep -q "${tok:4}" "$T/audit.txt" || { cat "$T/audit.txt" >&2; return 1; }
	echo "const token = process.env.TOKEN;" >"$W/src/settings.ts"
	syncwait && grep -q process.env "$G/src/settings.ts"
}
check "a token in src/settings.ts is withheld, audit names the rule and line only; fixed, it syncs" t_content

t_main_synced() { [ -e "$G/src/main.c" ]; }
check "ordinary files still sync" t_main_synced

touch "$T/stop"
wait "$WATCH" 2>/dev/null || true
t_down() {
	$TO 15 "$AIRLOCK" down "$W" || return 1
	wait "$UP_PID"
}
check "airlock down" t_down
check "no sanitizer reports" t_no_sanitizer_reports
finish
