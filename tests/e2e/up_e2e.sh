#!/usr/bin/env bash
# airlock up end to end: a real FUSE mount over a workspace, a real agent on
# a unix socket, live sync of seeded random workloads, editor saves, git
# checkout, agent restarts, down/edit/up, secrets, clean unmount.
# usage: up_e2e.sh AIRLOCK AIRLOCK_AGENT FSWORKLOAD FORWARDER   (root + /dev/fuse, else skipped: exit 77)
# shellcheck source=tests/e2e/lib.sh
source "$(dirname "$0")/lib.sh"

AIRLOCK=$1
AGENT=$2
WORKLOAD=$3
FWD=$4
if [ "$(id -u)" != 0 ] || [ ! -c /dev/fuse ]; then
	echo "skip - up_e2e needs root and /dev/fuse (uid $(id -u), /dev/fuse $([ -c /dev/fuse ] && echo present || echo missing))"
	exit 77
fi
export XDG_STATE_HOME=$T/state
TO="timeout -k 2"

make_pair # $T/hk, $T/gk, HPUB, GPUB; W=$T/work, G=$T/guest

AGENT_PID=
start_agent() {
	start_bg agent "$AGENT" --listen "unix:$T/a.sock" --root "$G" --key "$T/gk" --allow "$HPUB" \
		--state "$T/agent.state" --fsync none
	AGENT_PID=$BG_PID
	wait_line "$T/agent.out" '^ready' 10
}
stop_agent() {
	kill -9 "$AGENT_PID" 2>/dev/null || true
	wait "$AGENT_PID" 2>/dev/null || true
}
UP_PID=
UPN=0
start_up() { # start_up [GUEST_ADDR]
	local addr=${1:-unix:$T/a.sock}
	UPN=$((UPN + 1))
	start_bg "up$UPN" "$AIRLOCK" up "$W" --guest "$addr" --key "$T/hk" --guest-key "$GPUB"
	UP_PID=$BG_PID
	wait_line "$T/up$UPN.out" "^airlock: $W in sync with $addr\$" 20
}
down() {
	$TO 15 "$AIRLOCK" down "$W" || return 1
	wait "$UP_PID" 2>/dev/null
	local rc=$?
	[ "$rc" = 0 ] || { echo "up exited $rc" >&2; cat "$T/up$UPN.err" >&2; return 1; }
}
syncwait() { $TO 40 "$AIRLOCK" sync-wait -C "$W" --timeout "${1:-30}"; }

# listing DIR [EXCLUDES]: one line per path (type, mode, size, sha256 or link target)
listing() {
	local dir=$1 excl=${2:-/dev/null}
	(cd "$dir" && find . -type f -print0 | xargs -0 -r sha256sum | sed 's|^\([0-9a-f]*\)  \./|\1\t|') >"$T/sums"
	(cd "$dir" && find . -mindepth 1 -printf '%P\t%y\t%m\t%s\t%l\n' | LC_ALL=C sort) |
		awk -F'\t' -v ex="$excl" -v sums="$T/sums" '
			BEGIN { while ((getline l < ex) > 0) x[l] = 1
			        while ((getline l < sums) > 0) { t = index(l, "\t"); h[substr(l, t + 1)] = substr(l, 1, t - 1) } }
			{ p = $1; skip = 0
			  while (p != "") { if (p in x) { skip = 1; break }
			                    if (index(p, "/") == 0) break; sub(/\/[^\/]*$/, "", p) }
			  if (skip) next
			  if ($2 == "f") print $1 "\t" $2 "\t" $3 "\t" $4 "\t" h[$1]
			  else if ($2 == "d") print $1 "\t" $2 "\t" $3
			  else print $1 "\t" $2 "\t" $5 }'
}
withheld_of() {
	"$AIRLOCK" audit -C "$W" --json | grep -o '"path":"[^"]*","rule"' | sed 's/^"path":"//; s/","rule"$//'
}
same_tree() {
	withheld_of >"$T/excl"
	echo ".git/config" >>"$T/excl"
	listing "$W" "$T/excl" >"$T/h.lst"
	listing "$G" "$T/excl" >"$T/g.lst"
	if ! diff -u "$T/h.lst" "$T/g.lst" >"$T/diff.out"; then
		head -20 "$T/diff.out" >&2
		return 1
	fi
}
sjson() { "$AIRLOCK" status -C "$W" --json | grep -o "\"$1\":[^,}]*" | head -1 | cut -d: -f2-; }

# ---------------------------------------------------------------- start
t_bad_policy() {
	echo '{"workspace": {"sync": {"exclude": 7}}}' >"$T/bad.json"
	local rc=0
	$TO 10 "$AIRLOCK" up "$W" --guest "unix:$T/a.sock" --key "$T/hk" --guest-key "$GPUB" --policy "$T/bad.json" \
		2>"$T/bad.err" || rc=$?
	[ "$rc" = 2 ] && grep -q 'exclude' "$T/bad.err" && ! mountpoint -q "$W"
}
check "a malformed policy exits 2 before mounting, naming the key" t_bad_policy
echo "seed file" >"$W/README"
mkdir -p "$W/src" && echo "int main(void) { return 0; }" >"$W/src/main.c"
start_agent
t_up() {
	start_up || return 1
	mountpoint -q "$W" && same_tree
}
check "up: mounted, first reconcile done, one 'in sync' line" t_up
check "a second up for the same DIR is refused" \
	bash -c "! $TO 10 '$AIRLOCK' up '$W' --guest 'unix:$T/a.sock' --key '$T/hk' --guest-key '$GPUB' 2>'$T/second.err' && grep -q 'already' '$T/second.err'"

# ---------------------------------------------------------------- (a) random workloads
for seed in 1 2 3; do
	t_workload() {
		$TO 30 "$WORKLOAD" "$W" "$seed" 1000 >"$T/wl.out" || return 1
		echo "# seed $seed: $(cat "$T/wl.out")"
		syncwait || return 1
		same_tree
	}
	check "seeded workload $seed (1000 ops through the mount) converges" t_workload
done

# ---------------------------------------------------------------- (b) editor saves, git checkout
t_vim() {
	for i in 1 2 3; do
		printf 'version %s\n' "$i" >"$W/src/.main.c.swp"
		printf 'int main(void) { return %s; }\n' "$i" >"$W/src/main.c~tmp"
		mv -f "$W/src/main.c~tmp" "$W/src/main.c"
		rm -f "$W/src/.main.c.swp"
		syncwait || return 1
		[ "$(cat "$G/src/main.c")" = "int main(void) { return $i; }" ] || return 1
	done
	same_tree
}
check "vim-style save (temp file + rename over)" t_vim

t_git() {
	command -v git >/dev/null || { echo "no git" >&2; return 1; }
	local gq="git -C $W/repo -c user.email=t@t -c user.name=t -c init.defaultBranch=main"
	mkdir -p "$W/repo"
	$gq init -q && for i in $(seq 1 40); do echo "a $i" >"$W/repo/f$i.txt"; done &&
		$gq add -A && $gq commit -qm one && $gq checkout -qb two &&
		for i in $(seq 20 60); do echo "b $i" >"$W/repo/f$i.txt"; done && rm "$W/repo/f1.txt" &&
		mkdir -p "$W/repo/sub" && echo deep >"$W/repo/sub/x" && $gq add -A && $gq commit -qm two || return 1
	syncwait && same_tree || return 1
	$gq checkout -q main && syncwait && same_tree && [ ! -e "$G/repo/sub/x" ] || return 1
	$gq checkout -q two && syncwait && same_tree && [ -e "$G/repo/sub/x" ]
}
check "git checkout between two branches through the mount" t_git

# A file truncated to zero waits for its write (at most 2 ms, doc/UP.md "When a change is sent"):
# no sync-wait here (that would end the hold at once), the guest is polled, 10 s at most.
t_truncate() {
	guest_is() { for _ in $(seq 200); do [ "$(cat "$G/$1" 2>/dev/null)" = "$2" ] && return 0; sleep 0.05; done; return 1; }
	echo "full" >"$W/trunc.txt" && syncwait || return 1
	: >"$W/trunc.txt" && guest_is trunc.txt "" || { echo "an emptied file did not reach the guest" >&2; return 1; }
	[ -e "$G/trunc.txt" ] && [ ! -s "$G/trunc.txt" ] || return 1
	echo "saved" >"$W/trunc.txt" && guest_is trunc.txt saved || return 1
	python3 -c 'import sys, time
f = open(sys.argv[1], "wb"); time.sleep(0.05); f.write(b"late\n"); f.close()' "$W/trunc.txt" &&
		guest_is trunc.txt late || { echo "a write 50 ms after its truncation did not reach the guest" >&2; return 1; }
	rm "$W/trunc.txt" && syncwait && same_tree
}
check "a file emptied alone reaches the guest without a barrier; O_TRUNC then write, soon or late, too" t_truncate

# ---------------------------------------------------------------- targeted pushes (doc/SYNC.md §9)
# Each step is one kind of change the push decides from its dirty paths alone; after each,
# the guest must match the whole host tree.
t_targeted() {
	step() { syncwait || { echo "step $1: sync-wait" >&2; return 1; }; same_tree || { echo "step $1" >&2; return 1; }; }
	echo "edit 1" >"$W/src/main.c" && step edit || return 1
	mkdir -p "$W/t/new/deeper" && echo "in new dir" >"$W/t/new/deeper/f.txt" && step create-in-new-dir || return 1
	[ "$(cat "$G/t/new/deeper/f.txt")" = "in new dir" ] || return 1
	mv "$W/t/new" "$W/t/renamed" && step rename-dir || return 1
	[ ! -e "$G/t/new" ] && [ -e "$G/t/renamed/deeper/f.txt" ] || return 1
	mkdir -p "$W/t/tree/a/b" && echo x >"$W/t/tree/a/b/c" && echo y >"$W/t/tree/a/d" && step tree || return 1
	rm -rf "$W/t/tree" && step delete-tree || return 1
	[ ! -e "$G/t/tree" ] || return 1
	chmod 0600 "$W/t/renamed/deeper/f.txt" && chmod 0700 "$W/t/renamed" && step chmod || return 1
	[ "$(stat -c %a "$G/t/renamed/deeper/f.txt")" = 600 ] && [ "$(stat -c %a "$G/t/renamed")" = 700 ] || return 1
	ln -s one "$W/t/link" && step symlink || return 1
	ln -sfn two "$W/t/link" && step symlink-retarget || return 1
	[ "$(readlink "$G/t/link")" = two ] || return 1
	echo "was plain" >"$W/t/plain2.txt" && step plain || return 1
	mv "$W/t/plain2.txt" "$W/t/.env.prod" && step secret-rename || return 1
	[ ! -e "$G/t/plain2.txt" ] && [ ! -e "$G/t/.env.prod" ] || return 1
	ln "$W/t/renamed/deeper/f.txt" "$W/t/hard" && echo "via link" >>"$W/t/hard" && step hard-link || return 1
	[ "$(cat "$G/t/renamed/deeper/f.txt")" = "$(cat "$G/t/hard")" ] || return 1
	head -c 300000 /dev/urandom >"$W/t/big.bin" && step big || return 1
	printf 'XY' | dd of="$W/t/big.bin" bs=1 seek=150000 conv=notrunc status=none && step big-edit || return 1
	mv "$W/t/big.bin" "$W/t/big2.bin" && step big-rename || return 1
	echo "renamed/" >"$W/t/.gitignore" && step gitignore || return 1
	[ ! -e "$G/t/renamed" ] || { echo "an ignored directory stayed in the guest" >&2; return 1; }
	rm "$W/t/.gitignore" && step gitignore-removed || return 1
	[ -e "$G/t/renamed/deeper/f.txt" ] || return 1
	rm -rf "$W/t" && step delete-all
}
check "targeted pushes: edit, new dir, dir rename, tree delete, chmod, symlink retarget, secret rename, hard link, big file, .gitignore" t_targeted

# ---------------------------------------------------------------- (c) agent killed mid-burst
t_agent_kill() {
	"$WORKLOAD" "$W" 11 3000 >/dev/null &
	local wl=$!
	sleep 0.15
	stop_agent
	wait "$wl" || return 1
	echo "while the agent was away" >"$W/offline.txt"
	start_agent || return 1
	syncwait 30 || return 1
	same_tree && [ "$(sjson reconnects)" -ge 1 ]
}
check "agent killed mid-burst and restarted: guest converges" t_agent_kill

# ---------------------------------------------------------------- (e) secrets
t_secret() {
	echo "API_KEY=canary-up-1" >"$W/.env"
	echo "plain content" >"$W/plain.txt"
	syncwait || return 1
	[ ! -e "$G/.env" ] && [ -e "$G/plain.txt" ] && ! grep -rq canary-up-1 "$G" || return 1
	mv "$W/plain.txt" "$W/.env.local"
	syncwait || return 1
	[ ! -e "$G/plain.txt" ] && [ ! -e "$G/.env.local" ] && same_tree || return 1
	[ "$(sjson withheld)" -ge 2 ]
}
check "a secret created through the mount is withheld; a file renamed to a secret name leaves the guest" t_secret
# documented (doc/UP.md): a secret renamed to an ordinary name keeps the withheld content: not sent
t_secret_out() {
	mv "$W/.env.local" "$W/notes.txt"
	syncwait || return 1
	[ ! -e "$G/notes.txt" ] || { echo "notes.txt reached the guest" >&2; return 1; }
	withheld_of | grep -qx notes.txt || { echo "notes.txt not in the audit:" >&2; "$AIRLOCK" audit -C "$W" >&2; return 1; }
	same_tree
}
check "a secret renamed to an ordinary name stays withheld (same content, documented)" t_secret_out

t_status() {
	"$AIRLOCK" status -C "$W" >"$T/status.txt" || return 1
	grep -q 'live' "$T/status.txt" && [ "$(sjson pending)" = 0 ] &&
		[ "$(sjson applied_seq)" = "$(sjson journal_seq)" ] || { cat "$T/status.txt" >&2; return 1; }
	echo "# $(grep latency "$T/status.txt")"
	# status asks the daemon for a fresh status: an edit made just before is counted
	local js0 js1
	js0=$(sjson journal_seq)
	echo fresh >>"$W/status-probe.txt"
	js1=$(sjson journal_seq)
	[ "$js1" -gt "$js0" ] || { echo "status after an edit: journal_seq $js1, before $js0" >&2; return 1; }
	"$AIRLOCK" sync-wait -C "$W" --timeout 30
}
check "status: live, nothing pending, applied == journal seq" t_status

# ---------------------------------------------------------------- (d) down, edit backing, up
t_down_edit_up() {
	down || return 1
	mountpoint -q "$W" && return 1
	echo "edited while down" >"$W/offline2.txt"
	rm -f "$W/README"
	mkdir -p "$W/newdir" && echo x >"$W/newdir/y"
	start_up || return 1
	same_tree
}
check "down, edit the backing directory, up again: guest converges" t_down_edit_up

# ---------------------------------------------------------------- npm install through the mount
# A local package (no registry needed): npm writes package-lock.json,
# node_modules with a link, and renames through the mount.
t_npm() {
	mkdir -p "$W/npmproj/localpkg" || return 1
	printf '{"name":"localpkg","version":"1.0.0","main":"index.js"}\n' >"$W/npmproj/localpkg/package.json"
	echo 'module.exports = () => "hi";' >"$W/npmproj/localpkg/index.js"
	(cd "$W/npmproj" && $TO 120 npm init -y >/dev/null &&
		$TO 120 npm install --offline --no-audit --no-fund --no-update-notifier ./localpkg >/dev/null) || return 1
	[ -e "$W/npmproj/node_modules/localpkg/index.js" ] && [ -e "$W/npmproj/package-lock.json" ] || return 1
	syncwait 30 && same_tree
}
if command -v npm >/dev/null; then
	check "npm install (a local package) through the mount; the guest matches" t_npm
else
	skip "npm install through the mount: npm is not installed"
fi

# ---------------------------------------------------------------- (c') connection cut mid-burst
# The channel runs through a forwarder the test controls; it is killed in
# the middle of a burst (both ends see a connection end without FINAL),
# edits go on, and a new forwarder comes up later at the same path.
t_cut() {
	down || return 1
	start_bg fwd1 "$FWD" "$T/f.sock" "$T/a.sock" none
	local fpid=$BG_PID
	wait_line "$T/fwd1.out" '^ready' 5 || return 1
	start_up "unix:$T/f.sock" || return 1
	local before
	before=$(sjson reconnects)
	"$WORKLOAD" "$W" 21 2000 >/dev/null &
	local wl=$!
	sleep 0.1
	kill -9 "$fpid"
	wait "$fpid" 2>/dev/null
	wait "$wl" || return 1
	echo "written while the connection was cut" >"$W/cut.txt"
	sleep 0.3
	start_bg fwd2 "$FWD" "$T/f.sock" "$T/a.sock" none
	wait_line "$T/fwd2.out" '^ready' 5 || return 1
	syncwait 30 || return 1
	same_tree && [ "$(sjson reconnects)" -gt "$before" ]
}
check "connection cut mid-burst (forwarder killed), restored later: guest converges" t_cut

# ---------------------------------------------------------------- (f) clean down
t_clean_down() {
	listing "$W" >"$T/before.lst"
	down || return 1
	! mountpoint -q "$W" || return 1
	listing "$W" >"$T/after.lst"
	diff -u "$T/before.lst" "$T/after.lst" >&2 || return 1
	[ -z "$(find "$W" -name '.fuse_hidden*' -o -name '*.airlock-tmp*')" ] &&
		! "$AIRLOCK" status -C "$W" >/dev/null && [ ! -e "$XDG_STATE_HOME/airlock/"*/up.pid ]
}
check "after down: not a mountpoint, same files, no leftovers, no daemon" t_clean_down

finish
