#!/bin/sh
# Install the agent CLIs the tests drive, at the exact versions that
# tests/agents/package-lock.json pins (package.json names them), with
# `npm ci` into a cache outside the source tree, and print the directory
# that holds their commands (node_modules/.bin). A second run with the same
# lock file installs nothing; npm's own cache makes a new lock file fast.
#
#   install.sh            prints e.g. /root/.cache/airlock-test-agents/3f2a9c41d0b7e815/node_modules/.bin
#
# The cache is $AIRLOCK_AGENTS_CACHE, else $XDG_CACHE_HOME/airlock-test-agents,
# else ~/.cache/airlock-test-agents; one directory per lock file (its hash).
# Exit 77 with one line saying why when npm is missing or the registry cannot
# be reached (the callers skip); 1 when the install fails for another reason
# (npm's log on stderr).
set -eu

HERE=$(cd "$(dirname "$0")" && pwd)
if ! command -v npm >/dev/null 2>&1 || ! command -v node >/dev/null 2>&1; then
	echo "agent CLIs: node and npm are needed to install them (tests/deps.sh installs nodejs and npm)" >&2
	exit 77
fi
CACHE=${AIRLOCK_AGENTS_CACHE:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/airlock-test-agents}
KEY=$(cat "$HERE/package.json" "$HERE/package-lock.json" | sha256sum | cut -c1-16)
DEST=$CACHE/$KEY
mkdir -p "$CACHE"

if [ ! -f "$DEST/.complete" ]; then
	exec 9>"$CACHE/.lock"
	flock 9 # one installer at a time; the others then find it done
	if [ ! -f "$DEST/.complete" ]; then
		STAGE=$(mktemp -d "$CACHE/.stage.XXXXXX")
		cp "$HERE/package.json" "$HERE/package-lock.json" "$STAGE/"
		if ! (cd "$STAGE" && timeout 600 npm ci --no-audit --no-fund --loglevel=error) >"$STAGE.log" 2>&1; then
			if ! timeout 30 npm ping >/dev/null 2>&1; then
				rm -rf "$STAGE" "$STAGE.log"
				echo "agent CLIs: the npm registry ($(npm config get registry)) cannot be reached" >&2
				exit 77
			fi
			echo "agent CLIs: npm ci failed:" >&2
			cat "$STAGE.log" >&2
			rm -rf "$STAGE" "$STAGE.log"
			exit 1
		fi
		rm -f "$STAGE.log"
		rm -rf "$DEST"
		touch "$STAGE/.complete"
		mv "$STAGE" "$DEST"
	fi
fi
echo "$DEST/node_modules/.bin"
