#!/usr/bin/env bash
# meson install into a DESTDIR, then the installed binaries: airlock and
# airlock-agent run, help/version/doctor/init work, the man pages render,
# the completions complete, the schemas validate the installed airlock's
# output, the units carry this prefix's paths, the static agent and the
# template builder are in libexecdir. With qemu, root and /dev/fuse it also
# boots the vm sandbox with the installed airlock (about 30 s here);
# AIRLOCK_INSTALL_VM=0 turns that part off.
# usage: install_e2e.sh BUILD_DIR PREFIX
# shellcheck source=tests/e2e/lib.sh
source "$(dirname "$0")/lib.sh"

BUILD=$1
PREFIX=$2
D=$T/dest
P=$D$PREFIX
export XDG_STATE_HOME=$T/state XDG_RUNTIME_DIR=$T/run XDG_CACHE_HOME=$T/cache XDG_DATA_HOME=$T/data
mkdir -p "$XDG_RUNTIME_DIR" && chmod 700 "$XDG_RUNTIME_DIR"

t_install() { meson install -C "$BUILD" --destdir "$D" --no-rebuild >"$T/install.log" 2>&1 || { cat "$T/install.log" >&2; return 1; }; }
check "meson install --destdir" t_install
A=$P/bin/airlock
t_files() {
	local f
	for f in bin/airlock bin/airlock-agent libexec/airlock/build.sh libexec/airlock/init \
		share/man/man1/airlock.1 share/man/man8/airlock-agent.8 share/man/man5/airlock.json.5 \
		share/bash-completion/completions/airlock share/zsh/site-functions/_airlock \
		share/airlock/schema/airlock.schema.json share/airlock/schema/status.schema.json \
		share/airlock/airlock-agent.service lib/systemd/user/airlock-up@.service; do
		[ -e "$P/$f" ] || { echo "missing $PREFIX/$f" >&2; return 1; }
	done
	if [ -x "$BUILD/airlock-agent-static" ]; then
		[ -x "$P/libexec/airlock/airlock-agent-static" ] || { echo "no static agent in libexecdir" >&2; return 1; }
	fi
}
check "binaries, static agent, template builder, man pages, completions, schemas, units installed" t_files
t_run() {
	"$A" --version | grep -qE '^airlock [0-9]' && "$A" help up | grep -q -- '--sandbox' &&
		"$P/bin/airlock-agent" --help 2>&1 | grep -q -- '--listen' &&
		"$A" doctor --json >"$T/doctor.json" || [ $? = 1 ]
	python3 -m json.tool "$T/doctor.json" >/dev/null
}
check "the installed airlock and airlock-agent run (version, help, doctor --json)" t_run
t_paths() {
	# found beside the installed binary, not through the build's source paths
	grep -qa '\.\./libexec/airlock' "$A" &&
		grep -q "^ExecStart=$PREFIX/bin/airlock up %f" "$P/lib/systemd/user/airlock-up@.service" &&
		grep -q "^ExecStart=$PREFIX/bin/airlock-agent " "$P/share/airlock/airlock-agent.service"
}
check "the units carry the configured bindir; airlock looks for libexecdir beside itself" t_paths
t_init_schema() {
	mkdir -p "$T/proj" && echo '{}' >"$T/proj/package.json" &&
		"$A" init "$T/proj" >/dev/null && grep -q "\"\\\$schema\": \"$PREFIX/share/airlock/schema/airlock.schema.json\"" "$T/proj/airlock.json" &&
		python3 "$(dirname "$0")/../harness/schema_check.py" "$P/share/airlock/schema" airlock "$T/proj/airlock.json"
	local rc=$?
	[ "$rc" = 0 ] || [ "$rc" = 77 ]
}
check "init's \$schema names the installed schema, which validates it" t_init_schema
t_man() {
	command -v man >/dev/null || { echo "(no man: rendering not checked)"; return 0; }
	local m
	for m in man1/airlock.1 man8/airlock-agent.8 man5/airlock.json.5; do
		MANWIDTH=100 man -l "$P/share/man/$m" 2>"$T/man.err" | grep -qE '^(NAME|N.A.M.E)' || { cat "$T/man.err" >&2; return 1; }
		[ ! -s "$T/man.err" ] || { echo "$m:" >&2; cat "$T/man.err" >&2; return 1; }
	done
}
check "the man pages render without warnings" t_man
t_completion() {
	PATH=$P/bin:$PATH bash -c 'source "$1"; COMP_WORDS=(airlock stat); COMP_CWORD=1; _airlock; [ "${COMPREPLY[*]}" = status ] &&
		COMP_WORDS=(airlock up /x --sand); COMP_CWORD=3; _airlock; [ "${COMPREPLY[*]}" = --sandbox ]' _ "$P/share/bash-completion/completions/airlock"
}
check "bash completion completes commands and options from the installed airlock" t_completion

if [ ! -x "$BUILD/airlock-agent-static" ]; then
	skip "vm part: this build has no static agent to install (sanitizer builds; the plain build runs it)"
elif [ "${AIRLOCK_INSTALL_VM:-1}" = 1 ] && [ "$(id -u)" = 0 ] && [ -c /dev/fuse ] &&
	command -v qemu-system-x86_64 >/dev/null 2>&1; then
	t_vm() {
		mkdir -p "$T/vmw" && echo hi >"$T/vmw/a" &&
			timeout -k 5 600 "$A" up "$T/vmw" --sandbox vm -d >"$T/vm.out" 2>"$T/vm.err" &&
			"$A" exec -C "$T/vmw" -- cat a | grep -qx hi; local rc=$?
		grep -rqs "$PREFIX/libexec/airlock/build.sh\|up to date" "$XDG_DATA_HOME"/airlock/sandboxes/*/template.log || true
		timeout 30 "$A" down "$T/vmw" >/dev/null 2>&1
		return $rc
	}
	check "vm: the installed airlock boots the vm sandbox (template from libexecdir)" t_vm
else
	skip "vm part off (it needs root, /dev/fuse and qemu-system-x86_64; AIRLOCK_INSTALL_VM=0 turns it off)"
fi
finish
