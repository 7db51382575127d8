#!/usr/bin/env bash
# Round trip of `true` through the exec relay (doc/BENCH.md): in one run,
# side by side on the same machine,
#   sh -c true                      the floor: fork + exec, nothing remote
#   relay socket                    one persistent connection: exec {"argv":["true"]} -> exit event
#   airlock exec -- true            the CLI: connect, hello, exec, exit (what an editor's wrapper pays)
#   ssh -o ControlMaster            ssh localhost true over an established master connection
#   ssh (no ControlMaster)          a full ssh connection per command
# p50/p99 of each, and the ratio of airlock exec and the relay socket to ssh
# with ControlMaster. The agent and `airlock up` run as in the tests (agent
# on a Unix socket, real FUSE mount); sshd runs on a private loopback port
# with its own host key and config (the system's sshd is not touched).
#
# usage: bench/relay.sh BUILD [RUNS] [NOCM_RUNS]     (root + /dev/fuse)
#   BUILD      a meson build dir (release or debugoptimized) with airlock and airlock-agent
#   RUNS       round trips per row (default 1000)
#   NOCM_RUNS  for ssh without ControlMaster (default 200: each costs a key exchange)
# openssh-server/openssh-client are installed with apt-get when missing (bench only).
set -euo pipefail

B=$(realpath "${1:?usage: bench/relay.sh BUILD [RUNS] [NOCM_RUNS]}")
N=${2:-1000}
NOCM=${3:-200}
AIRLOCK=$(realpath "$B/airlock")
AGENT=$(realpath "$B/airlock-agent")
PY=$(command -v /usr/bin/python3 || command -v python3)

if ! [ -x /usr/sbin/sshd ] || ! command -v ssh >/dev/null; then
	echo "# installing openssh-server openssh-client" >&2
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends openssh-server openssh-client \
		>/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 &&
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends openssh-server \
			openssh-client >/dev/null 2>&1; }
fi

T=$(mktemp -d /tmp/airlock-bench-relay.XXXXXX)
chmod 0711 "$T"
PIDS=()
cleanup() {
	set +e
	[ -n "${W:-}" ] && "$AIRLOCK" down "$W" >/dev/null 2>&1
	[ -S "$T/ssh.ctl" ] && ssh -o ControlPath="$T/ssh.ctl" -O exit localhost >/dev/null 2>&1
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
	wait 2>/dev/null
	[ -n "${DEL_USER:-}" ] && userdel "$SSH_USER" 2>/dev/null
	rm -rf "$T"
}
trap cleanup EXIT

export XDG_STATE_HOME=$T/state AIRLOCK_SOCKET=$T/relay.sock
"$AIRLOCK" keygen -o "$T/hk" >"$T/hk.pub"
"$AIRLOCK" keygen -o "$T/gk" >"$T/gk.pub"
W=$T/work
G=$T/guest
mkdir -p "$W" "$G"
"$AGENT" --listen "unix:$T/a.sock" --root "$G" --key "$T/gk" --allow "$(cat "$T/hk.pub")" \
	--state "$T/agent.state" --fsync none >"$T/agent.out" 2>"$T/agent.err" &
PIDS+=($!)
for _ in $(seq 200); do grep -q '^ready' "$T/agent.out" 2>/dev/null && break; sleep 0.05; done
"$AIRLOCK" up "$W" --guest "unix:$T/a.sock" --key "$T/hk" --guest-key "$(cat "$T/gk.pub")" \
	>"$T/up.out" 2>"$T/up.err" &
PIDS+=($!)
for _ in $(seq 400); do grep -q 'in sync with' "$T/up.out" 2>/dev/null && break; sleep 0.05; done
grep -q 'in sync with' "$T/up.out" || { echo "airlock up did not come up: $(cat "$T/up.err")" >&2; exit 1; }

# sshd on a private port, key login only, our own host key. ssh logs in as a
# throwaway user whose shell is sh with no startup files (created here,
# removed at exit): root's shell here sources a .bashrc that would add its own
# start-up time to every ssh row and measure that instead of ssh.
SSH_USER=airlock-bench-ssh
if ! id "$SSH_USER" >/dev/null 2>&1; then
	useradd -M -d "$T/home" -s /bin/sh -p '*' "$SSH_USER" # '*': no password, not locked
	DEL_USER=1
fi
mkdir -p "$T/home" && chown "$SSH_USER" "$T/home"
PORT=$((20000 + RANDOM % 20000))
ssh-keygen -q -t ed25519 -N '' -f "$T/ssh_host" >/dev/null
ssh-keygen -q -t ed25519 -N '' -f "$T/id" >/dev/null
cp "$T/id.pub" "$T/authorized_keys"
chmod 0644 "$T/authorized_keys"
chmod 0644 "$T/id.pub"
cat >"$T/sshd_config" <<EOF
Port $PORT
ListenAddress 127.0.0.1
HostKey $T/ssh_host
PidFile $T/sshd.pid
AuthorizedKeysFile $T/authorized_keys
PermitRootLogin no
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PrintMotd no
EOF
mkdir -p /run/sshd
/usr/sbin/sshd -D -f "$T/sshd_config" -E "$T/sshd.log" &
PIDS+=($!)
SSH=(ssh -q -p "$PORT" -i "$T/id" -l "$SSH_USER" -o UserKnownHostsFile=/dev/null -o StrictHostKeyChecking=no
	-o BatchMode=yes -o LogLevel=ERROR)
for _ in $(seq 100); do "${SSH[@]}" 127.0.0.1 true 2>/dev/null && break; sleep 0.1; done
"${SSH[@]}" 127.0.0.1 true || { echo "ssh to 127.0.0.1:$PORT fails: $(tail -3 "$T/sshd.log")" >&2; exit 1; }
"${SSH[@]}" -o ControlMaster=yes -o ControlPath="$T/ssh.ctl" -o ControlPersist=600 -fN 127.0.0.1

cd "$W"
"$PY" - "$N" "$NOCM" "$AIRLOCK" "$AIRLOCK_SOCKET" "$T/ssh.ctl" "${SSH[@]}" <<'EOF'
import json, os, socket, subprocess, sys, time

n, nocm, airlock, sock, ctl = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
ssh = sys.argv[6:]

def timed(argv, runs):
    ts = []
    for _ in range(runs):
        t0 = time.perf_counter_ns()
        r = subprocess.run(argv, stdin=subprocess.DEVNULL)
        ts.append(time.perf_counter_ns() - t0)
        if r.returncode != 0:
            sys.exit("%r exited %d" % (argv, r.returncode))
    return ts

def relay(runs):
    s = socket.socket(socket.AF_UNIX)
    s.connect(sock)
    f = s.makefile("rb")
    f.readline()  # hello
    ts = []
    for i in range(runs):
        t0 = time.perf_counter_ns()
        s.sendall(b'{"id":%d,"op":"exec","argv":["true"]}\n' % i)
        while True:
            ev = json.loads(f.readline())
            if ev.get("event") == "exit":
                break
            if ev.get("event") == "error":
                sys.exit("relay: %r" % ev)
        ts.append(time.perf_counter_ns() - t0)
        if ev.get("code") != 0:
            sys.exit("relay: %r" % ev)
    return ts

def pct(ts, p):
    s = sorted(ts)
    return s[min(len(s) - 1, int(len(s) * p / 100))] / 1e6

rows = [
    ("sh -c true (floor)", timed(["sh", "-c", "true"], n)),
    ("relay socket (one connection)", relay(n)),
    ("airlock exec -- true", timed([airlock, "exec", "--", "true"], n)),
    ("ssh ControlMaster localhost true", timed(ssh + ["-o", "ControlPath=" + ctl, "127.0.0.1", "true"], n)),
    ("ssh localhost true (no master)", timed(ssh + ["-o", "ControlMaster=no", "-o", "ControlPath=none", "127.0.0.1", "true"], nocm)),
]
print("| path | runs | p50 ms | p99 ms |")
print("|---|---:|---:|---:|")
for name, ts in rows:
    print("| %s | %d | %.2f | %.2f |" % (name, len(ts), pct(ts, 50), pct(ts, 99)))
cm = pct(rows[3][1], 50)
print()
print("ssh ControlMaster p50 / airlock exec p50 = %.1fx; / relay socket p50 = %.1fx" % (
    cm / pct(rows[2][1], 50), cm / pct(rows[1][1], 50)))
EOF
BT=$("$PY" -c 'import json,sys; print([o["value"] for o in json.load(open(sys.argv[1])) if o["name"]=="buildtype"][0])' \
	"$B/meson-info/intro-buildoptions.json" 2>/dev/null || echo unknown)
echo "# machine: $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), kernel $(uname -r)," \
	"$(grep -m1 PRETTY_NAME /etc/os-release | cut -d'"' -f2); build: $BT"
