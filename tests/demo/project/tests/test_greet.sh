#!/bin/sh
# The demo project's test suite: run it where airlock runs commands.
set -eu
cd "$(dirname "$0")/.."
. ./src/greet.sh
fail=0
check() {
	if [ "$1" = "$2" ]; then echo "ok - $3"; else echo "not ok - $3 (got '$1')"; fail=1; fi
}
check "$(greet)" "hello, world" "greets the world by default"
check "$(greet airlock)" "hello, airlock" "greets by name"
if [ -e .env ]; then echo "not ok - .env reached this machine"; fail=1; else echo "ok - no .env here"; fi
exit $fail
