#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Drive the relay socket of a real `airlock up` (doc/RELAY.md) for
tests/e2e/relay_e2e.sh. One subcommand per check; exit status 0 = the check
passed, anything else = it failed (the reason on stderr).

  relay_drive.py barrier SOCK WORKSPACE N    write through the mount, exec cat, N times
  relay_drive.py concurrent SOCK CLIENTS PER  CLIENTS connections x PER commands at once
  relay_drive.py malformed SOCK              bad requests get errors; everything carries on
  relay_drive.py attach SOCK                 disconnect mid-command, status, attach replays
  relay_drive.py refused SOCK                (run as another uid) the relay says forbidden_peer
"""
import json
import os
import selectors
import socket
import sys
import time

DEADLINE = 30.0


def fail(msg):
    print("relay_drive: " + msg, file=sys.stderr)
    sys.exit(1)


class Conn:
    """One relay connection: send request objects, read event objects."""

    def __init__(self, path, hello=True):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.settimeout(DEADLINE)
        self.s.connect(path)
        self.buf = b""
        if hello:
            h = self.next()
            if h.get("event") != "hello" or h.get("protocol") != 3:
                fail("expected hello, got %r" % h)

    def send(self, obj):
        self.send_raw(json.dumps(obj, separators=(",", ":")).encode() + b"\n")

    def send_raw(self, data):
        self.s.sendall(data)

    def fill(self):
        d = self.s.recv(1 << 16)
        if not d:
            raise EOFError("relay closed the connection")
        self.buf += d

    def has_line(self):
        return b"\n" in self.buf

    def pop(self):
        line, _, self.buf = self.buf.partition(b"\n")
        return json.loads(line)

    def next(self):
        while not self.has_line():
            self.fill()
        return self.pop()

    def until(self, pred, what):
        """Events up to and including the first matching pred."""
        seen = []
        t_end = time.monotonic() + DEADLINE
        while time.monotonic() < t_end:
            ev = self.next()
            seen.append(ev)
            if pred(ev):
                return seen
        fail("timed out waiting for " + what)

    def run(self, rid):
        """Collect one command's output until its exit (or error)."""
        out = {"stdout": b"", "stderr": b""}
        evs = self.until(lambda e: e.get("id") == rid and e.get("event") in ("exit", "error", "result"),
                         "the end of %r" % rid)
        for e in evs:
            if e.get("id") != rid:
                continue
            feed(out, e)
        return out, evs[-1]

    def close(self):
        self.s.close()


def feed(out, e):
    ev = e.get("event")
    if ev in ("stdout", "stderr"):
        if e["offset"] != len(out[ev]):
            fail("%s of %r: offset %d, have %d bytes" % (ev, e.get("id"), e["offset"], len(out[ev])))
        if "data" in e:
            out[ev] += e["data"].encode()
        else:
            import base64
            out[ev] += base64.b64decode(e["data_b64"])


def expect_error(c, code, needle, rid=None):
    e = c.next()
    if e.get("event") != "error" or e.get("code") != code or needle not in e.get("message", ""):
        fail("expected error %s mentioning %r, got %r" % (code, needle, e))
    if rid is not None and e.get("id") != rid:
        fail("error for %r carries id %r" % (rid, e.get("id")))


# ---------------------------------------------------------------------------

def barrier(path, ws, n):
    """Write new content through the mount, then cat it in the guest, n times
    in a row over one connection: never stale (the exec is ordered after the
    write's journal entry)."""
    c = Conn(path)
    f = os.path.join(ws, "barrier.txt")
    t0 = time.monotonic()
    for i in range(n):
        content = "round %d %s\n" % (i, os.urandom(6).hex()) * (1 + i % 7)
        with open(f, "w") as fh:
            fh.write(content)
        rid = "b%d" % i
        c.send({"id": rid, "op": "exec", "argv": ["cat", "barrier.txt"]})
        out, end = c.run(rid)
        if end.get("event") != "exit" or end.get("code") != 0:
            fail("round %d: %r" % (i, end))
        if out["stdout"].decode() != content:
            fail("round %d: stale: got %r, wrote %r" % (i, out["stdout"][:80], content[:80]))
    dt = time.monotonic() - t0
    print("# %d write+cat round trips in %.2f s (%.2f ms each)" % (n, dt, dt * 1000 / n))


def concurrent(path, nclients, per):
    """nclients connections, each with `per` commands in flight at once; each
    command's output and exit status are its own."""
    sel = selectors.DefaultSelector()
    conns = []
    expect = {}
    for k in range(nclients):
        c = Conn(path)
        c.s.setblocking(False)
        c.pending = {}
        conns.append(c)
        sel.register(c.s, selectors.EVENT_READ, c)
    for k, c in enumerate(conns):
        for j in range(per):
            rid = "c%d-%d" % (k, j)
            lines = 200 + 37 * j + 11 * k
            code = (k * per + j) % 256
            # each its own text on both streams and its own exit status; each
            # waits for its stdin to end, so all of them run at the same time
            sh = ("read go; i=0; while [ $i -lt %d ]; do echo \"%s line $i\"; i=$((i+1)); done; "
                  "echo \"%s err\" >&2; exit %d") % (lines, rid, rid, code)
            want_out = "".join("%s line %d\n" % (rid, i) for i in range(lines)).encode()
            expect[rid] = (want_out, ("%s err\n" % rid).encode(), code, c)
            c.pending[rid] = {"stdout": b"", "stderr": b""}
            c.s.setblocking(True)
            c.send({"id": rid, "op": "exec", "shell": sh, "stdin": True})
            c.s.setblocking(False)
    # a status from another connection while they run lists every one
    st = Conn(path)
    t_end = time.monotonic() + DEADLINE
    while True:
        st.send({"id": "st", "op": "status"})
        ev = st.until(lambda e: e.get("event") == "status", "status")[-1]
        running = {x["id"] for x in ev["commands"] if x["state"] == "running"}
        if set(expect) <= running:
            break
        if time.monotonic() > t_end:
            fail("status never listed all %d running, e.g. %s missing" % (
                len(expect), sorted(set(expect) - running)[:3]))
        time.sleep(0.05)
    st.close()
    for c in conns:
        c.s.setblocking(True)
        for rid in c.pending:
            c.send({"id": rid, "op": "stdin", "data": "go\n", "eof": True})
        c.s.setblocking(False)
    done = {}
    t_end = time.monotonic() + DEADLINE
    while len(done) < len(expect) and time.monotonic() < t_end:
        for key, _ in sel.select(timeout=1.0):
            c = key.data
            try:
                c.fill()
            except BlockingIOError:
                continue
            while c.has_line():
                e = c.pop()
                rid = e.get("id")
                if rid not in c.pending:
                    fail("connection %d got an event for %r: %r" % (conns.index(c), rid, e))
                feed(c.pending[rid], e)
                if e.get("event") in ("exit", "error"):
                    done[rid] = (c.pending[rid], e)
    if len(done) != len(expect):
        fail("only %d of %d commands ended" % (len(done), len(expect)))
    for rid, (out, end) in done.items():
        want_out, want_err, code, _ = expect[rid]
        if end.get("event") != "exit" or end.get("code") != code:
            fail("%s: expected exit %d, got %r" % (rid, code, end))
        if out["stdout"] != want_out or out["stderr"] != want_err:
            fail("%s: output differs (%d/%d bytes stdout, stderr %r)" % (
                rid, len(out["stdout"]), len(want_out), out["stderr"][:60]))
        if end.get("stdout_bytes") != len(want_out) or end.get("truncated"):
            fail("%s: exit event says %r" % (rid, end))
    print("# %d commands from %d clients: each its own output and status" % (len(done), nclients))


def malformed(path):
    """Every kind of bad request gets its error on the same connection, which
    carries on, while another connection's command is unaffected."""
    other = Conn(path)
    other.send({"id": "long", "op": "exec", "shell": "sleep 1; echo still here; exit 5"})
    c = Conn(path)
    c.send_raw(b'{"op":"exec", "id":\n')
    expect_error(c, "bad_json", "not valid JSON")
    c.send_raw(b'[1,2,3]\n')
    expect_error(c, "bad_json", "JSON object")
    c.send_raw(b'{"id":1,"id":2,"op":"status"}\n')
    expect_error(c, "bad_json", "")
    c.send({"id": 10, "op": "launch"})
    expect_error(c, "unknown_op", "launch", rid=10)
    c.send({"id": 11})
    expect_error(c, "missing_field", "'op'", rid=11)
    c.send({"op": "exec", "argv": ["true"]})
    expect_error(c, "missing_field", "'id'")
    c.send({"id": 12, "op": "exec"})
    expect_error(c, "missing_field", "argv", rid=12)
    c.send({"id": 13, "op": "signal"})
    expect_error(c, "missing_field", "'signal'", rid=13)
    c.send({"id": 14, "op": "exec", "argv": ["true"], "timeout": 5})
    expect_error(c, "bad_field", "timeout", rid=14)
    c.send({"id": 15, "op": "exec", "argv": ["ls"], "cwd": "../etc"})
    expect_error(c, "bad_field", "cwd", rid=15)
    c.send({"id": 16, "op": "resize", "rows": 0, "cols": 80})
    expect_error(c, "bad_field", "rows", rid=16)
    c.send({"id": "nobody-has-this", "op": "cancel"})
    expect_error(c, "unknown_id", "", rid="nobody-has-this")
    # a line longer than the 1 MiB limit: one error, the rest is discarded,
    # and the next line is a request again
    big = b'{"id":"big","op":"exec","shell":"' + b"x" * (1 << 20) + b'"}\n'
    c.send_raw(big)
    expect_error(c, "line_too_long", "longer than")
    c.send({"id": "after", "op": "exec", "argv": ["echo", "fine"]})
    out, end = c.run("after")
    if end.get("code") != 0 or out["stdout"] != b"fine\n":
        fail("after the bad requests: %r %r" % (out, end))
    # another new connection works too
    d = Conn(path)
    d.send({"id": "new", "op": "exec", "argv": ["echo", "new"]})
    out, end = d.run("new")
    if end.get("code") != 0 or out["stdout"] != b"new\n":
        fail("a new connection: %r %r" % (out, end))
    out, end = other.run("long")
    if end.get("code") != 5 or out["stdout"] != b"still here\n":
        fail("the other connection's command: %r %r" % (out, end))
    for x in (c, d, other):
        x.close()


def attach(path):
    """Commands outlive their connection: status finds one, attach replays
    exactly what a client missed (from an offset) or everything."""
    sh = "echo early; sleep 0.6; echo late; sleep 1.2; echo end >&2; echo done; exit 3"
    a = Conn(path)
    a.send({"id": "att", "op": "exec", "shell": sh})
    a.until(lambda e: e.get("event") == "stdout" and e.get("id") == "att", "the first output")
    a.close()  # disconnect mid-command
    time.sleep(1.0)  # "late" is written while nobody is connected
    b = Conn(path)
    b.send({"id": "st", "op": "status"})
    ev = b.until(lambda e: e.get("event") == "status", "status")[-1]
    mine = [x for x in ev["commands"] if x["id"] == "att"]
    if not mine or mine[0]["state"] != "running" or mine[0]["attached"] != 0:
        fail("status after the disconnect: %r" % mine)
    if mine[0]["stdout_bytes"] != len("early\nlate\n") or mine[0]["argv"] != ["sh", "-c", sh] or not mine[0]["shell"]:
        fail("status entry: %r" % mine[0])
    b.send({"id": "att", "op": "attach", "from": {"stdout": 6, "stderr": 0}})
    at = b.next()
    if at.get("event") != "attached" or at.get("stdout_offset") != 6 or at.get("state") != "running":
        fail("attach answered %r" % at)
    out = {"stdout": b"early\n", "stderr": b""}
    evs = b.until(lambda e: e.get("id") == "att" and e.get("event") == "exit", "exit after attach")
    for e in evs:
        feed(out, e)
    if out["stdout"] != b"early\nlate\ndone\n" or out["stderr"] != b"end\n":
        fail("replay from offset 6: %r" % out)
    if evs[-1].get("code") != 3 or evs[-1].get("truncated"):
        fail("exit after attach: %r" % evs[-1])
    # a third connection attaches after the end: the whole output again
    c = Conn(path)
    c.send({"id": "att", "op": "attach"})
    at = c.next()
    if at.get("event") != "attached" or at.get("state") != "exited" or at.get("stdout_offset") != 0:
        fail("attach after the end answered %r" % at)
    out, end = c.run("att")
    if out["stdout"] != b"early\nlate\ndone\n" or end.get("code") != 3:
        fail("full replay: %r %r" % (out, end))
    for x in (b, c):
        x.close()


def refused(path):
    try:
        c = Conn(path, hello=False)
    except PermissionError:
        print("EACCES")  # the socket's mode stopped us before the relay did
        return
    e = c.next()
    if e.get("event") != "error" or e.get("code") != "forbidden_peer":
        fail("a connection from uid %d got %r" % (os.getuid(), e))
    print("forbidden_peer: " + e.get("message", ""))
    # and the relay closes it: nothing else comes, requests go nowhere
    try:
        c.send({"id": 1, "op": "exec", "argv": ["id"]})
    except OSError:
        pass
    try:
        c.fill()
        fail("the relay kept a refused connection open: %r" % c.buf[:200])
    except (EOFError, ConnectionResetError):
        pass


def rss_kib(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def flood(path, total, pids, p50_max_ms, rss_max_kib):
    """`yes` into a client that reads in bursts and stalls between them,
    until `total` bytes of events went by; meanwhile another client runs
    `true` every 50 ms (its round trips must stay short) and the daemon's
    and the agent's RSS are sampled (their growth must stay bounded)."""
    import threading
    f = Conn(path)
    f.send({"id": "flood", "op": "exec", "argv": ["yes", "airlock flood"]})
    stop = threading.Event()
    rtts, rss = [], {p: [rss_kib(p)] for p in pids}
    errors = []

    def pinger():
        try:
            c = Conn(path)
            i = 0
            while not stop.is_set():
                i += 1
                t0 = time.monotonic()
                c.send({"id": "t%d" % i, "op": "exec", "argv": ["true"]})
                _, end = c.run("t%d" % i)
                rtts.append((time.monotonic() - t0) * 1000.0)
                if end.get("event") != "exit" or end.get("code") != 0:
                    errors.append("true ended with %r" % end)
                    return
                for p in pids:
                    rss[p].append(rss_kib(p))
                time.sleep(0.05)
            c.close()
        except Exception as e:  # the main thread reports it
            errors.append("pinger: %r" % e)

    th = threading.Thread(target=pinger)
    th.start()
    n, burst, t0 = 0, 0, time.monotonic()
    try:
        while n < total:
            d = f.s.recv(1 << 20)
            if not d:
                fail("the relay closed the flood's connection")
            n += len(d)
            burst += len(d)
            if burst >= 256 << 20:  # a slow reader: stall, let everything back up
                burst = 0
                time.sleep(0.5)
    finally:
        stop.set()
        th.join()
    secs = time.monotonic() - t0
    f.send({"id": "flood", "op": "cancel"})
    # drain to the flood's end (the partial line in hand is skipped)
    t_end = time.monotonic() + DEADLINE
    tail = b""
    while True:
        if time.monotonic() > t_end:
            fail("no exit after cancelling the flood")
        d = f.s.recv(1 << 20)
        if not d:
            fail("the relay closed before the flood's exit")
        tail = (tail + d)[-8192:]
        if b'"event":"exit"' in tail and b'"flood"' in tail:
            break
    f.close()
    if errors:
        fail("; ".join(errors))
    if len(rtts) < 10:
        fail("only %d round trips during the flood" % len(rtts))
    rtts.sort()
    p50, p99 = rtts[len(rtts) // 2], rtts[min(len(rtts) - 1, int(len(rtts) * 0.99))]
    growth = {p: max(v) - v[0] for p, v in rss.items()}
    print("# flood: %.2f GiB of events in %.1f s (%.0f MB/s); `true` meanwhile: %d runs, p50 %.1f ms, "
          "p99 %.1f ms, max %.1f ms; RSS growth %s" % (
              n / 2**30, secs, n / secs / 1e6, len(rtts), p50, p99, rtts[-1],
              ", ".join("pid %d +%d KiB" % (p, g) for p, g in growth.items())))
    if p50 > p50_max_ms:
        fail("round trip of true during the flood: p50 %.1f ms (limit %.1f)" % (p50, p50_max_ms))
    for p, g in growth.items():
        if g > rss_max_kib:
            fail("pid %d grew by %d KiB during the flood (limit %d)" % (p, g, rss_max_kib))



def main():
    if len(sys.argv) < 3:
        fail(__doc__)
    what, path = sys.argv[1], sys.argv[2]
    if what == "barrier":
        barrier(path, sys.argv[3], int(sys.argv[4]))
    elif what == "concurrent":
        concurrent(path, int(sys.argv[3]), int(sys.argv[4]))
    elif what == "malformed":
        malformed(path)
    elif what == "attach":
        attach(path)
    elif what == "refused":
        refused(path)
    elif what == "flood":
        flood(path, int(sys.argv[3]), [int(p) for p in sys.argv[4].split(",")], float(sys.argv[5]),
              int(sys.argv[6]))
    else:
        fail("unknown check " + what)


if __name__ == "__main__":
    main()
