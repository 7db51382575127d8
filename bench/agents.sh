#!/usr/bin/env bash
# One agent command through airlock vs the same command run locally by the same CLI, per CLI
# (Claude Code, Gemini CLI, Codex, Continue's cn at the versions tests/agents pins): each CLI runs
# N turns of `echo bench I` against the scripted model server, routed as doc/EDITORS.md says and on
# the host; a command's time is the gap between the model requests before and after it (the CLI's
# own work between two turns included, the same in both runs). p50 of N per run, and the ratio.
# It runs tests/e2e/agent_*.sh with AIRLOCK_AGENT_BENCH=N (their bench_cli step).
#
# usage: bench/agents.sh BUILD [N]     (root + /dev/fuse + user namespaces + node/npm, as the tests)
set -euo pipefail
B=$(realpath "${1:?usage: bench/agents.sh BUILD [N]}")
N=${2:-20}
SRC=$(cd "$(dirname "$0")/.." && pwd)
for cli in claude gemini codex cn; do
	AIRLOCK_AGENT_BENCH=$N bash "$SRC/tests/e2e/agent_$cli.sh" "$B/airlock" 2>"/tmp/airlock-bench-agents-$cli.err" |
		grep '^bench:' || { echo "agent_$cli: no figure (stderr in /tmp/airlock-bench-agents-$cli.err)"; }
done
