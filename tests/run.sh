#!/bin/sh
# The whole test suite: install what is missing, build airlock twice (plain,
# and with AddressSanitizer + UndefinedBehaviorSanitizer), run every test in
# both, and end with one "N passed, N failed" line.
set -eu
cd "$(dirname "$0")/.."
sh tests/deps.sh

setup() { # setup DIR [meson options]
	dir=$1
	shift
	if [ -f "$dir/build.ninja" ]; then
		meson setup --reconfigure "$dir" "$@" >/dev/null
	else
		meson setup "$dir" "$@" >/dev/null
	fi
	ninja -C "$dir"
}

setup build
setup build-san -Db_sanitize=address,undefined -Db_lundef=false

status=0
meson test -C build --print-errorlogs --num-processes 2 || status=1
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	meson test -C build-san --print-errorlogs --num-processes 2 --timeout-multiplier 3 || status=1

count() { # count KEY: sum of meson's "KEY: N" summary over both runs
	cat build/meson-logs/testlog.txt build-san/meson-logs/testlog.txt |
		awk -v k="$1:" '$1 == k { s += $2 } END { print s + 0 }'
}
ok=$(count Ok)
fail=$(( $(count Fail) + $(count Timeout) ))
skipped=$(count Skipped)
echo "suite: $ok passed, $fail failed, $skipped skipped"
exit $status
