#!/bin/bash
# mount_e2e.sh MOUNT_HARNESS: the FUSE passthrough and its journal through a
# real mount over a temp dir. Every mutating operation shows up in the
# journal with the right paths and ranges, the backing dir holds what was
# written, real tools (git, cp -a, tar, vim) work, stop and crash recovery
# leave the directory as it was plus the changes.
# Skips (exit 77) when FUSE is unavailable (no /dev/fuse, mount not permitted).
. "$(dirname "$0")/lib.sh"

H=$1
if [ ! -e /dev/fuse ]; then
	echo "skip: /dev/fuse is missing: FUSE tests need it (modprobe fuse, or run the container with --device /dev/fuse)"
	exit 77
fi

D=$T/ws
J=$T/harness.out
mkdir -p "$D"

# seed before the mount: writes to these are never absorbed by a create
printf '0123456789' >"$D/w1"
printf '0123456789' >"$D/w2"
printf '0123456789' >"$D/w3"
echo old >"$D/seed_r1"
head -c 8192 /dev/zero >"$D/m1"
echo one >"$D/x1"
echo two >"$D/x2"
mkdir -p "$D/pre/dir"
echo pre >"$D/pre/dir/file"

start_harness() {
	: >"$J"
	start_bg harness "$H" "$D"
	HPID=$BG_PID
	local i
	for ((i = 0; i < 1000; i++)); do
		grep -q '^mounted' "$J" 2>/dev/null && return 0
		if ! kill -0 "$HPID" 2>/dev/null; then
			wait "$HPID" && rc=0 || rc=$?
			if [ "$rc" -eq 77 ]; then
				echo "skip: cannot mount FUSE here: $(cat "$T/harness.err")"
				exit 77
			fi
			echo "harness failed to start (rc $rc): $(cat "$T/harness.err")" >&2
			return 1
		fi
		sleep 0.01
	done
	return 1
}

stop_harness() {
	kill -TERM "$HPID"
	wait "$HPID"
}

# jl 'OP\tPATH...': the journal has a record line matching (tabs via printf)
jl() {
	wait_line "$J" "$(printf "$1")" 5
}

snapshot() { # stable listing + content of the tree
	(cd "$D" && find . -printf '%p %y %m %s %i %l\n' | sort && find . -type f -print0 | sort -z | xargs -0 md5sum)
}

start_harness

check "mounted over itself" mountpoint -q "$D"
check "refuses a second mount of a live airlock dir" bash -c "! '$H' '$D' >/dev/null 2>$T/second.err && grep -q busy $T/second.err"

t_pwrite() {
	python3 -c "import os; fd=os.open('$D/w1', os.O_WRONLY); os.pwrite(fd, b'x'*100, 4096); os.close(fd)" &&
		jl '\twrite\tw1\t-\t4096\\+100$' && [ "$(stat -c %s "$D/w1")" = 4196 ]
}
check "write at an offset journals its range" t_pwrite

t_append() {
	printf abc >>"$D/w2" && jl '\twrite\tw2\t-\t10\\+3$' && [ "$(cat "$D/w2")" = 0123456789abc ]
}
check "O_APPEND journals the appended range" t_append

t_trunc() {
	truncate -s 5 "$D/w3" && jl '\ttruncate\tw3\t-\tsize=5$' && [ "$(cat "$D/w3")" = 01234 ]
}
check "truncate" t_trunc

t_otrunc() {
	printf new >"$D/w3" && jl '\ttruncate\tw3\t-\tsize=0$' && jl '\twrite\tw3\t-\t0\\+3$'
}
check "O_TRUNC open journals truncate + write" t_otrunc

t_create() {
	echo hello >"$D/new1" && jl '\tcreate\tnew1\t-\t' && [ "$(cat "$D/new1")" = hello ]
}
check "create" t_create

t_rename_over() {
	echo newer >"$D/r1src" && mv -f "$D/r1src" "$D/seed_r1" && jl '\trename\tr1src\tseed_r1\t' &&
		[ "$(cat "$D/seed_r1")" = newer ] && [ ! -e "$D/r1src" ]
}
check "rename over an existing file" t_rename_over

t_dir_rename() {
	mkdir -p "$D/dd/sub" && echo f >"$D/dd/sub/f" && mv "$D/dd" "$D/ee" && jl '\trename\tdd\tee\t' &&
		printf more >>"$D/ee/sub/f" && jl '\twrite\tee/sub/f\t-\t2\\+4$' &&
		mv "$D/pre" "$D/pre2" && printf x >>"$D/pre2/dir/file" && jl '\twrite\tpre2/dir/file\t'
}
check "directory rename: later writes below it carry the new path" t_dir_rename

t_link() {
	ln "$D/w1" "$D/hl1" && jl '\tlink\tw1\thl1\t' && [ "$(stat -c %i "$D/w1")" = "$(stat -c %i "$D/hl1")" ] &&
		[ "$(stat -c %h "$D/w1")" = 2 ]
}
check "hard link" t_link

# a write through one name of a hard link changes the others, which a path
# record would not name (a push of that name alone, after it was unlinked,
# left the other name stale in the guest: faults_e2e): a root rescan
nrescan() { grep -c "$(printf '\trescan\t\t')" "$J" || true; }
t_link_written() {
	local n0
	n0=$(nrescan)
	printf more >>"$D/hl1" && wait_line "$J" "$(printf '\trescan\t\t')" 5 && [ "$(nrescan)" -gt "$n0" ] || return 1
	n0=$(nrescan)
	# the name it was opened by unlinked, another one left: still a rescan
	python3 - "$D" <<'EOF' || return 1
import os, sys
d = sys.argv[1]
fd = os.open(d + "/lw1", os.O_WRONLY | os.O_CREAT, 0o644)
os.link(d + "/lw1", d + "/lw2")
os.unlink(d + "/lw1")
os.write(fd, b"through the unlinked name")
os.close(fd)
EOF
	for _ in $(seq 1 100); do [ "$(nrescan)" -gt "$n0" ] && break; sleep 0.05; done
	[ "$(nrescan)" -gt "$n0" ] && [ "$(cat "$D/lw2")" = "through the unlinked name" ] && rm "$D/lw2"
}
check "hard link written through: a rescan, also after the name it was opened by is gone" t_link_written

t_symlink() {
	ln -s w1 "$D/sl1" && jl '\tsymlink\tsl1\t' && [ "$(readlink "$D/sl1")" = w1 ] && [ -L "$D/sl1" ]
}
check "symlink + readlink" t_symlink

t_chmod() {
	chmod 700 "$D/w2" && jl '\tsetattr\tw2\t-\tmode$' && [ "$(stat -c %a "$D/w2")" = 700 ] &&
		touch -d '2001-01-01' "$D/w2" && jl '\tsetattr\tw2\t-\ttimes$' &&
		[ "$(stat -c %Y "$D/w2")" = "$(date -d 2001-01-01 +%s)" ]
}
check "chmod + utimens" t_chmod

t_unlink_rmdir() {
	rm "$D/hl1" && jl '\tunlink\thl1\t' && mkdir "$D/rmd" && rmdir "$D/rmd" && jl '\trmdir\trmd\t' &&
		[ "$(stat -c %h "$D/w1")" = 1 ]
}
check "unlink + rmdir" t_unlink_rmdir

t_xattr() {
	python3 - "$D/w1" <<'EOF' && jl '\txattr\tw1\t'
import os, sys
p = sys.argv[1]
os.setxattr(p, 'user.k', b'v1')
assert os.getxattr(p, 'user.k') == b'v1'
assert 'user.k' in os.listxattr(p)
os.removexattr(p, 'user.k')
assert 'user.k' not in os.listxattr(p)
EOF
}
check "xattrs set/get/list/remove" t_xattr

t_renameat2() {
	python3 - "$D" <<'EOF' && jl '\texchange\tx1\tx2\t' && jl '\trename\tx1\tx3\t'
import ctypes, errno, os, sys
d = sys.argv[1]
libc = ctypes.CDLL(None, use_errno=True)
AT = -100
def r2(a, b, flags):
    if libc.renameat2(AT, os.path.join(d, a).encode(), AT, os.path.join(d, b).encode(), flags) != 0:
        return ctypes.get_errno()
    return 0
assert r2('x1', 'x2', 2) == 0  # RENAME_EXCHANGE
assert open(d + '/x1').read() == 'two\n' and open(d + '/x2').read() == 'one\n'
assert r2('x1', 'x2', 1) == errno.EEXIST  # RENAME_NOREPLACE onto an existing name
assert r2('x1', 'x3', 1) == 0
assert not os.path.exists(d + '/x1') and open(d + '/x3').read() == 'two\n'
EOF
}
check "RENAME_EXCHANGE and RENAME_NOREPLACE" t_renameat2

t_inodes() {
	local a b c
	a=$(stat -c %i "$D/w2") && b=$(stat -c %i "$D/w2") && mv "$D/w2" "$D/w2b" && c=$(stat -c %i "$D/w2b") &&
		[ "$a" = "$b" ] && [ "$b" = "$c" ] && mv "$D/w2b" "$D/w2" && echo "$a" >"$T/w2.ino"
}
check "stable inode numbers (twice, across rename)" t_inodes

t_mmap() {
	python3 - "$D/m1" <<'EOF' && jl '\twrite\tm1\t-\t'
import mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
m = mmap.mmap(fd, 8192, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
m[4096:4101] = b'mmap!'
m.flush()
m.close()
os.close(fd)
EOF
	[ "$(dd if="$D/m1" bs=1 skip=4096 count=5 2>/dev/null)" = 'mmap!' ]
}
check "mmap write + msync is journaled" t_mmap

t_flock() {
	flock -x "$D/w1" -c "! flock -n -x '$D/w1' true" && flock -n "$D/w1" true &&
		python3 - "$D/w1" <<'EOF'
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.lockf(fd, fcntl.LOCK_EX)
pid = os.fork()
if pid == 0:
    fd2 = os.open(sys.argv[1], os.O_RDWR)
    try:
        fcntl.lockf(fd2, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os._exit(1)
    except OSError:
        os._exit(0)
_, st = os.waitpid(pid, 0)
assert os.WEXITSTATUS(st) == 0, "POSIX lock not exclusive"
EOF
}
check "flock and POSIX locks" t_flock

t_git() {
	(
		set -e
		export GIT_AUTHOR_NAME=t GIT_AUTHOR_EMAIL=t@t GIT_COMMITTER_NAME=t GIT_COMMITTER_EMAIL=t@t
		export GIT_CONFIG_NOSYSTEM=1 HOME=$T
		cd "$D" && git init -q -b main repo && cd repo
		for i in $(seq 1 50); do echo "line $i" >"f$i.txt"; done
		mkdir -p src/a/b && cp /usr/include/stdio.h src/a/b/
		git add -A && git commit -qm one
		git checkout -qb br && echo changed >>f1.txt && git rm -q f2.txt && git commit -qam two
		git checkout -q main && [ "$(tail -1 f1.txt)" = "line 1" ] && [ -e f2.txt ]
		echo dirty >>f3.txt && git status --porcelain | grep -q 'f3.txt'
		git stash -q && git status --porcelain | { ! grep -q .; } && git stash pop -q
		git commit -qam three && git gc -q && git fsck --no-progress 2>&1 | { ! grep -q error; }
		git checkout -q br && git log --oneline | wc -l | grep -q 2
	) >"$T/git.log" 2>&1 || { cat "$T/git.log" >&2; return 1; }
	jl '\trename\trepo/.git/'
}
check "git init/add/commit/checkout -b/status/stash/gc on the mount" t_git

t_cp_a() {
	cp -a /usr/include/linux "$D/" && diff -r /usr/include/linux "$D/linux" >/dev/null &&
		[ "$(stat -c %Y /usr/include/linux/fs.h)" = "$(stat -c %Y "$D/linux/fs.h")" ]
}
check "cp -a /usr/include/linux" t_cp_a

t_tar() {
	tar -C /usr/include -cf "$T/x.tar" linux net 2>/dev/null && mkdir "$D/tarx" &&
		tar -C "$D/tarx" -xf "$T/x.tar" && diff -r /usr/include/net "$D/tarx/net" >/dev/null &&
		diff -r /usr/include/linux "$D/tarx/linux" >/dev/null
}
check "tar -x" t_tar

t_vim() {
	printf 'first\n' >"$D/v.txt" && sleep 0.05 &&
		HOME=$T timeout 20 vim -Nu NONE -i NONE -n -Es -c 'set backup writebackup backupcopy=no backupdir=. backupskip=' \
			-c 'normal Gosecond' -c 'wq' "$D/v.txt" </dev/null &&
		[ "$(cat "$D/v.txt")" = "$(printf 'first\nsecond')" ] && [ "$(cat "$D/v.txt~")" = first ] &&
		jl '\trename\tv.txt\tv.txt~\t' && jl '\tcreate\tv.txt\t' &&
		# VS Code / atomic-write style: temp file + rename over
		printf 'third\n' >"$D/.v.txt.tmp" && mv "$D/.v.txt.tmp" "$D/v.txt" && jl '\trename\t.v.txt.tmp\tv.txt\t' &&
		[ "$(cat "$D/v.txt")" = third ]
}
check "vim save (backup + rename) and temp+rename save" t_vim

t_many() { # bounded: a burst of 3000 files stays a bounded record set
	mkdir "$D/burst" && for i in $(seq 1 3000); do echo "$i" >"$D/burst/f$i"; done &&
		[ "$(ls "$D/burst" | wc -l)" = 3000 ]
}
check "burst of 3000 creates" t_many
t_many_journal() {
	wait_line "$J" "$(printf '\tcreate\tburst/f3000\t')" 5 && [ "$(grep -c "$(printf '\tcreate\tburst/f')" "$J")" = 3000 ]
}
check "... each journaled as a create" t_many_journal

t_seq() { # record first seqs strictly increase; upto lines present
	awk -F'\t' '/^[0-9]+-[0-9]+\t/ { split($1, s, "-"); if (s[1] + 0 <= last) bad = 1; last = s[1] + 0 } END { exit bad }' "$J" &&
		grep -q '^upto' "$J"
}
check "journal is in seq order" t_seq

snapshot >"$T/snap.mounted"
stop_harness
check "clean stop prints stopped" grep -q '^stopped' "$J"
check "not a mountpoint after stop" bash -c "! mountpoint -q '$D'"
snapshot >"$T/snap.after"
check "after stop the directory holds exactly what the mount showed" diff "$T/snap.mounted" "$T/snap.after"
check "no leftovers (.fuse_hidden*)" bash -c "! find '$D' -name '.fuse_hidden*' | grep -q ."
check "inode number through the mount = backing inode" [ "$(cat "$T/w2.ino")" = "$(stat -c %i "$D/w2")" ]

# crash: kill -9 leaves a dead mount; the next start detaches it
start_harness
kill -9 "$HPID"
wait "$HPID" 2>/dev/null || true
check "after kill -9 the mount is dead (ENOTCONN)" bash -c "ls '$D' 2>&1 | grep -q 'not connected'"
start_harness
check "next start clears the stale mount and serves again" bash -c "[ \"\$(cat '$D/x3')\" = two ]"
# a file held open past the stop: the connection is aborted after a grace period
exec 9<"$D/x3"
STOP_T0=$(date +%s)
stop_harness
check "stop with a file held open ends within 10 s" [ $(($(date +%s) - STOP_T0)) -lt 10 ]
exec 9<&-
check "after recovery + stop: not a mountpoint, content intact" bash -c "! mountpoint -q '$D' && [ \"\$(cat '$D/x3')\" = two ]"
check "no stale airlock mount left" bash -c "! grep -q ' $D ' /proc/self/mountinfo"

# a tree larger than the fd limit: the reaper makes the kernel forget
# cached inodes, so lookups never run out of descriptors
D=$T/big
mkdir -p "$D"
: >"$J"
(ulimit -n 800 && exec "$H" "$D") >"$J" 2>"$T/harness.err" &
HPID=$!
PIDS+=("$HPID")
wait_line "$J" '^mounted' 10
t_fdlimit() {
	mkdir "$D/many" && (cd "$D/many" && seq 1 3000 | xargs touch) && cp -a /usr/include/linux "$D/" &&
		diff -r /usr/include/linux "$D/linux" >/dev/null && [ "$(ls "$D/many" | wc -l)" = 3000 ] &&
		rm -rf "$D/many" "$D/linux" && [ -z "$(ls -A "$D")" ] &&
		[ "$(ls /proc/$HPID/fd | wc -l)" -lt 800 ]
}
check "4000+ files through a mount limited to 800 descriptors" t_fdlimit
stop_harness

finish
