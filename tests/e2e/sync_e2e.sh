#!/usr/bin/env bash
# airlock sync end to end: real airlock + airlock-agent over a unix socket,
# real trees (/usr/include, a git repository with history), secrets with
# canaries, policies, restarts. usage: sync_e2e.sh AIRLOCK AIRLOCK_AGENT
# shellcheck source=tests/e2e/lib.sh
source "$(dirname "$0")/lib.sh"

AIRLOCK=$1
AGENT=$2
export XDG_STATE_HOME=$T/state
DATA=$(cd "$(dirname "$0")/../data" && pwd)

"$AIRLOCK" keygen -o "$T/hk" >"$T/hk.pub"
"$AIRLOCK" keygen -o "$T/gk" >"$T/gk.pub"
"$AIRLOCK" keygen -o "$T/other" >"$T/other.pub"
HPUB=$(cat "$T/hk.pub")
GPUB=$(cat "$T/gk.pub")

AGENT_PID=
# start_agent NAME ROOT [ALLOWKEY]: agent on unix:$T/NAME.sock
start_agent() {
	local name=$1 root=$2 allow=${3:-$HPUB}
	mkdir -p "$root"
	start_bg "$name" "$AGENT" --listen "unix:$T/$name.sock" --root "$root" --key "$T/gk" --allow "$allow" \
		--state "$T/$name.state" --fsync none
	AGENT_PID=$BG_PID
	wait_line "$T/$name.out" '^ready' 10
}
stop_agent() {
	kill "$AGENT_PID" 2>/dev/null || true
	wait "$AGENT_PID" 2>/dev/null || true
}
# do_sync NAME DIR [args...]: sync DIR to agent NAME; JSON summary in $T/last.json
do_sync() {
	local name=$1 dir=$2
	shift 2
	"$AIRLOCK" sync "$dir" --guest "unix:$T/$name.sock" --key "$T/hk" --guest-key "$GPUB" --json "$@" \
		>"$T/last.json" 2>"$T/last.err"
	local rc=$?
	echo "# sync $(basename "$dir"): $(grep -o '"seconds":[0-9.]*' "$T/last.json" | cut -d: -f2) s, $(jnum files_sent) files, $(jnum wire_bytes) wire bytes"
	return $rc
}
jnum() { grep -o "\"$1\":[0-9]*" "$T/last.json" | head -1 | cut -d: -f2; }

# listing DIR [EXCLUDES]: one line per path (type, mode, link target, sha256)
listing() {
	local dir=$1 excl=${2:-/dev/null}
	(cd "$dir" && find . -type f -print0 | xargs -0 -r sha256sum | sed 's|^\([0-9a-f]*\)  \./|\1\t|') >"$T/sums"
	(cd "$dir" && find . -mindepth 1 -printf '%P\t%y\t%m\t%l\n' | LC_ALL=C sort) |
		awk -F'\t' -v ex="$excl" -v sums="$T/sums" '
			BEGIN { while ((getline l < ex) > 0) x[l] = 1
			        while ((getline l < sums) > 0) { t = index(l, "\t"); h[substr(l, t + 1)] = substr(l, 1, t - 1) } }
			{ p = $1; skip = 0
			  while (p != "") { if (p in x) { skip = 1; break }
			                    if (index(p, "/") == 0) break; sub(/\/[^\/]*$/, "", p) }
			  if (skip || $2 == "p" || $2 == "s" || $2 == "b" || $2 == "c") next
			  m = $3 % 1000   # permission bits only: setuid & co never sync
			  if ($2 == "f") print $1 "\t" $2 "\t" m "\t" h[$1]
			  else if ($2 == "d") print $1 "\t" $2 "\t" m
			  else print $1 "\t" $2 "\t" $4 }'
}
# withheld_of DIR: withheld paths from `airlock audit --json`, one a line
withheld_of() {
	"$AIRLOCK" audit -C "$1" --json | grep -o '"path":"[^"]*","rule"' | sed 's/^"path":"//; s/","rule"$//'
}
same_tree() { # HOST GUEST: equal minus withheld, .git/config and guest-only paths given in $3
	local h=$1 g=$2 extra=${3:-}
	withheld_of "$h" >"$T/excl"
	echo ".git/config" >>"$T/excl"
	[ -n "$extra" ] && echo "$extra" >>"$T/excl"
	listing "$h" "$T/excl" >"$T/h.lst"
	listing "$g" "$T/excl" >"$T/g.lst"
	if ! diff -u "$T/h.lst" "$T/g.lst" >"$T/diff.out"; then
		head -20 "$T/diff.out" >&2
		return 1
	fi
}

# ---------------------------------------------------------------- trees
H=$T/h1
G=$T/g1
mkdir -p "$H"
cp -a /usr/include "$H/inc"
mkdir -p "$H/gen"
for d in $(seq 0 119); do
	mkdir -p "$H/gen/d$d"
	for f in $(seq 0 99); do echo "file $d $f" >"$H/gen/d$d/f$f.txt"; done
done
ln -s inc/stdio.h "$H/stdio-link"
ln -s /nonexistent/absolute "$H/dangling"
printf '#!/bin/sh\necho hi\n' >"$H/run.sh"
chmod 4755 "$H/run.sh" # setuid must not arrive
mkfifo "$H/a-fifo"
NFILES=$(find "$H" -type f | wc -l)
HBYTES=$(du -sb "$H" | cut -f1)

start_agent a1 "$G"
mkdir -p "$G/node_modules/pkg" && echo "guest-installed" >"$G/node_modules/pkg/index.js"
echo "node_modules/" >"$H/.gitignore"

t_initial() {
	do_sync a1 "$H" || { cat "$T/last.err" >&2; return 1; }
	[ "$(jnum files_sent)" -ge "$NFILES" ] || { echo "files_sent $(jnum files_sent) < $NFILES" >&2; return 1; }
	same_tree "$H" "$G" "node_modules" || return 1
}
check "initial sync of $NFILES files (/usr/include + generated): guest == host minus withheld" t_initial

t_modes() {
	[ "$(stat -c %a "$G/run.sh")" = 755 ] && [ "$(readlink "$G/dangling")" = /nonexistent/absolute ] &&
		[ -L "$G/stdio-link" ] && [ ! -e "$G/a-fifo" ] && grep -q 'a-fifo' "$T/last.err"
}
check "setuid dropped, symlinks as links, fifo skipped and reported" t_modes
check "guest-side node_modules survives" test "$(cat "$G/node_modules/pkg/index.js")" = guest-installed

t_resync() {
	do_sync a1 "$H" || return 1
	local w
	w=$(jnum wire_bytes)
	echo "# re-sync of $NFILES files / $HBYTES bytes: $w bytes on the wire"
	[ "$w" -lt $((HBYTES / 100)) ]
}
check "re-sync of an unchanged tree sends < 1% of its bytes" t_resync

# Hash caches (doc/SYNC.md §3): both sides now have one. A command in the
# guest rewrites a file with the same size and puts its mtime back; a host
# file gets the same treatment. Both must still be noticed (ctime).
t_cache_edits() {
	sleep 1.1 # past the racy window of the files the last sync wrote
	do_sync a1 "$H" || return 1 # caches now hold the whole tree
	local gf=$G/gen/d9/f9.txt hf=$H/gen/d8/f8.txt
	[ -s "$T/a1.state/hash-cache" ] || return 1
	printf 'FILE 9 9\n' | dd of="$gf" conv=notrunc status=none && touch -d "@$(stat -c %Y "$H/gen/d9/f9.txt")" "$gf"
	touch -r "$hf" "$T/hf.time" && printf 'FILE 8 8\n' | dd of="$hf" conv=notrunc status=none && touch -r "$T/hf.time" "$hf"
	do_sync a1 "$H" || return 1
	[ "$(cat "$gf")" = "file 9 9" ] && [ "$(cat "$G/gen/d8/f8.txt")" = "FILE 8 8" ] || return 1
	printf 'file 8 8\n' >"$hf"
}
check "hash caches: same-size edits with restored mtime on guest and host are synced" t_cache_edits

t_changes() {
	rm -rf "$H/gen/d3"                    # a directory deleted
	rm "$H/gen/d4/f1.txt"                 # a file deleted
	rm -rf "$H/gen/d5" && echo x >"$H/gen/d5" # dir -> file
	rm "$H/gen/d6/f0.txt" && mkdir -p "$H/gen/d6/f0.txt/sub" && echo y >"$H/gen/d6/f0.txt/sub/z" # file -> dir
	echo changed >>"$H/inc/stdio.h"
	mkdir -p "$G/gen/d7/node_modules" && echo keep >"$G/gen/d7/node_modules/k" # nested, guest-only
	do_sync a1 "$H" || { cat "$T/last.err" >&2; return 1; }
	[ ! -e "$G/gen/d3" ] && [ ! -e "$G/gen/d4/f1.txt" ] && [ -f "$G/gen/d5" ] && [ -f "$G/gen/d6/f0.txt/sub/z" ] &&
		[ "$(cat "$G/gen/d7/node_modules/k")" = keep ] && [ -f "$G/node_modules/pkg/index.js" ] &&
		same_tree "$H" "$G" "node_modules
gen/d7/node_modules"
}
check "deletes, dir<->file replacement, edits propagate; guest-only node_modules kept" t_changes

t_bigfile() {
	head -c $((100 << 20)) /dev/urandom >"$H/big.bin"
	do_sync a1 "$H" || { cat "$T/last.err" >&2; return 1; }
	printf '\x5a' | dd of="$H/big.bin" bs=1 seek=$((50 << 20)) conv=notrunc status=none
	do_sync a1 "$H" || { cat "$T/last.err" >&2; return 1; }
	local w
	w=$(jnum wire_bytes)
	echo "# 1-byte change in a 100 MiB file: $w bytes on the wire"
	[ "$w" -lt $((1 << 20)) ] && cmp -s "$H/big.bin" "$G/big.bin"
}
check "1-byte change in a 100 MiB file sends < 1 MiB" t_bigfile
rm -f "$H/big.bin"

t_restart() {
	local seq1
	seq1=$(jnum guest_seq)
	stop_agent
	echo after-restart >"$H/gen/new-after-restart.txt"
	start_agent a1 "$G"
	do_sync a1 "$H" || { cat "$T/last.err" >&2; return 1; }
	[ "$(cat "$G/gen/new-after-restart.txt")" = after-restart ] && [ "$(jnum guest_seq)" -gt "$seq1" ] &&
		[ "$(cut -d" " -f1 "$T/a1.state/sync-seq")" = "$(jnum guest_seq)" ] # "SEQ GEN ROOT-ID"
}
check "agent restart: sequence persisted, re-sync continues above it" t_restart
stop_agent

# ---------------------------------------------------------------- git
R=$T/repo
GR=$T/grepo
t_git() {
	mkdir -p "$R" && cd "$R" || return 1
	git init -q -b main
	git config user.email t@example.com
	git config user.name tester
	git remote add origin "https://user:ghp_CANARYGITTOKEN@example.com/org/repo.git"
	git config credential.helper store
	for i in 1 2 3; do
		echo "line $i" >>file.txt
		mkdir -p "src/m$i" && echo "int x$i;" >"src/m$i/x.c"
		git add -A && git commit -qm "commit $i"
	done
	git checkout -qb feature && echo feat >feat.txt && git add feat.txt && git commit -qm feature
	git checkout -q main && git tag -a v1 -m v1 && git tag light
	git pack-refs --all
	git gc -q 2>/dev/null || true
	echo "more" >>file.txt && git commit -qam "after gc"
	cd - >/dev/null || return 1
	start_agent a2 "$GR"
	do_sync a2 "$R" || { cat "$T/last.err" >&2; return 1; }
	same_tree "$R" "$GR" || return 1
	[ -z "$(git -C "$GR" status --porcelain)" ] || { git -C "$GR" status >&2; return 1; }
	[ "$(git -C "$GR" log --oneline --all | wc -l)" -eq 5 ] || return 1
	[ "$(git -C "$GR" rev-parse v1^{commit})" = "$(git -C "$R" rev-parse v1^{commit})" ] || return 1
	! grep -qiE 'remote|url|CANARY|credential|helper' "$GR/.git/config" || return 1
	[ -z "$(git -C "$GR" remote)" ]
}
check "git repository: status clean, log/tags/branches work, generated .git/config has no remote/url" t_git
stop_agent

# ---------------------------------------------------------------- secrets
S=$T/sec
GS=$T/gsec
t_secrets() {
	local n=0 p
	mkdir -p "$S"
	git -C "$S" init -q
	git -C "$S" remote add origin "https://x:CANARY_GITCFG@example.com/r.git"
	echo "visible" >"$S/README"
	for p in .env .env.local .env.production sub/.env deep/a/b/.env.test .envrc id_rsa keys/id_ed25519 \
		tls/server.pem tls/server.key certs/client.p12 store.pfx .npmrc .pypirc .aws/credentials .aws/config \
		.ssh/id_ecdsa .git-credentials .docker/config.json .netrc secrets.json .kube/config terraform.tfstate \
		sub/credentials.json .vault-token; do
		mkdir -p "$S/$(dirname "$p")"
		n=$((n + 1))
		echo "CANARY_$n secret material" >"$S/$p"
		echo "$p" >>"$T/secret-paths"
	done
	echo "$n secrets planted" >"$T/nsecrets"
	start_agent a3 "$GS"
	do_sync a3 "$S" || { cat "$T/last.err" >&2; return 1; }
	[ -f "$GS/README" ] || return 1
	if grep -rl 'CANARY' "$GS"; then return 1; fi
	"$AIRLOCK" audit -C "$S" --json >"$T/audit.json" || return 1
	while read -r p; do
		grep -qF "\"path\":\"$p\",\"rule\":\"secret: " "$T/audit.json" ||
			grep -qF "\"path\":\"${p%%/*}\",\"rule\":\"secret: " "$T/audit.json" ||
			{ echo "audit lacks $p" >&2; return 1; }
	done <"$T/secret-paths"
	grep -qF '"path":".git/config","rule":"secret: ' "$T/audit.json" && "$AIRLOCK" audit -C "$S" | grep -q withheld
}
check "secret shapes with canaries: none reaches the guest, audit lists each with its rule" t_secrets
stop_agent

# ---------------------------------------------------------------- policies
t_policies() {
	local f out msgs=0 ok=1
	: >"$T/msgs"
	for f in "$DATA"/policies/bad-*.json; do
		set +e
		"$AIRLOCK" sync "$S" --policy "$f" --guest "unix:$T/none.sock" --key "$T/hk" --guest-key "$GPUB" 2>"$T/p.err"
		local rc=$?
		set -e
		out=$(cat "$T/p.err")
		if [ $rc -ne 2 ] || ! grep -qF "$(basename "$f")" "$T/p.err"; then
			echo "$(basename "$f"): exit $rc: $out" >&2
			ok=0
		fi
		sed "s|$f||" "$T/p.err" >>"$T/msgs"
		msgs=$((msgs + 1))
	done
	# workspace airlock.json is used when --policy is absent
	mkdir -p "$T/wsp" && cp "$DATA/policies/bad-unknown-top.json" "$T/wsp/airlock.json"
	set +e
	"$AIRLOCK" sync "$T/wsp" --guest "unix:$T/none.sock" --key "$T/hk" --guest-key "$GPUB" 2>"$T/p.err"
	local rc=$?
	set -e
	[ $rc -eq 2 ] && grep -q airlock.json "$T/p.err" || ok=0
	[ "$(sort -u "$T/msgs" | wc -l)" -eq "$msgs" ] || { echo "messages not distinct" >&2; ok=0; }
	[ $ok -eq 1 ]
}
check "each malformed policy: exit 2 naming the file, its own message" t_policies

# ---------------------------------------------------------------- wrong key
t_wrong_key() {
	start_agent a4 "$T/g4" "$(cat "$T/other.pub")"
	set +e
	do_sync a4 "$S"
	local rc=$?
	set -e
	stop_agent
	[ $rc -eq 1 ] && grep -q "allow-list" "$T/last.err" && [ -z "$(ls -A "$T/g4")" ]
}
check "agent whose --allow key differs: exit 1, nothing written" t_wrong_key

finish
