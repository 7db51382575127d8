#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Run airlock on a real pseudo-terminal, as a person at a terminal would,
for tests/e2e/shell_e2e.sh. Exit status 0 = the check passed (reasons for a
failure on stderr).

  pty_drive.py login AIRLOCK        airlock shell: a login shell in the guest (tty, resize,
                                    ^C, ^Z and job control, exit status, terminal restored)
  pty_drive.py run ROWS COLS CODE AIRLOCK ARG...
                                    run airlock ARG... on a ROWSxCOLS pty; print what it wrote
                                    (\\r removed) and check it exits CODE with the terminal restored
"""
import fcntl
import os
import pty
import select
import struct
import sys
import termios
import time


def fail(msg):
    print("pty_drive: " + msg, file=sys.stderr)
    sys.exit(1)


def set_size(fd, rows, cols):
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


class Term:
    def __init__(self, argv, rows, cols):
        pid, fd = pty.fork()
        if pid == 0:
            set_size(0, rows, cols)
            os.execv(argv[0], argv)
        self.pid, self.fd = pid, fd
        self.out = b""
        self.status = None

    def read_some(self, timeout):
        r, _, _ = select.select([self.fd], [], [], timeout)
        if not r:
            return False
        try:
            d = os.read(self.fd, 65536)
        except OSError:  # EIO: every slave fd is closed
            d = b""
        if not d:
            return None
        self.out += d
        return True

    def expect(self, needle, timeout=10.0, since=0, soft=False):
        if isinstance(needle, str):
            needle = needle.encode()
        t_end = time.monotonic() + timeout
        while needle not in self.out[since:]:
            left = t_end - time.monotonic()
            if left <= 0 or self.read_some(left) is None:
                if soft:
                    return None
                fail("did not see %r; the terminal shows:\n%s" % (needle, self.out[-1500:].decode(errors="replace")))
        return self.out.index(needle, since) + len(needle)

    def send(self, data):
        os.write(self.fd, data.encode() if isinstance(data, str) else data)

    def lflag(self):
        return termios.tcgetattr(self.fd)[3]

    def wait(self, timeout=15.0):
        t_end = time.monotonic() + timeout
        while time.monotonic() < t_end:
            pid, st = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                while self.read_some(0.05):
                    pass
                self.status = os.waitstatus_to_exitcode(st)
                return self.status
            self.read_some(0.05)
        os.kill(self.pid, 9)
        fail("airlock did not exit; the terminal shows:\n%s" % self.out[-1500:].decode(errors="replace"))

    def restored(self):
        # a new pty starts cooked (canonical, echo, signals, output
        # processing): what airlock must give back whatever it did
        now = termios.tcgetattr(self.fd)
        want = termios.ICANON | termios.ECHO | termios.ISIG
        if now[3] & want != want or not now[1] & termios.OPOST:
            fail("the terminal was not restored: lflag %#x oflag %#x" % (now[3], now[1]))


def login(airlock):
    t = Term([airlock, "shell"], 30, 100)
    # a command of ours, then its answer: the shell is up and reads the pty
    t.send("echo READY-$((6*7))\r")
    at = t.expect("READY-42")
    if t.lflag() & (termios.ICANON | termios.ECHO):
        fail("the local terminal is not in raw mode while the shell runs")
    t.send("tty; stty size; echo $0; case $- in *i*) echo INTERACTIVE;; esac\r")
    at = t.expect("30 100", since=at)
    at = t.expect("INTERACTIVE", since=at)
    if b"/dev/pts/" not in t.out or b"not a tty" in t.out:
        fail("no pty in the guest: %r" % t.out[-400:])
    # resize: the kernel tells airlock (SIGWINCH), airlock tells the guest
    set_size(t.fd, 41, 123)
    t_end = time.monotonic() + 10
    while True:
        mark = len(t.out)
        t.send("stty size\r")
        if t.expect("41 123", timeout=1.0, since=mark, soft=True):
            break
        if time.monotonic() > t_end:
            fail("the guest never saw the new size; the terminal shows:\n%s" % t.out[-600:].decode(errors="replace"))
    at = len(t.out)
    # ^C reaches the foreground job in the guest, not airlock
    # (markers are computed by the shell, so the echo of what we type never matches)
    t.send("sleep 30; echo NOT-$((2+2))-INTERRUPTED\r")
    time.sleep(0.5)
    t0 = time.monotonic()
    t.send(b"\x03")
    t.send("echo AFTER-$((3*3))-INT\r")
    at = t.expect("AFTER-9-INT", timeout=5, since=at)
    if time.monotonic() - t0 > 5 or b"NOT-4-INTERRUPTED" in t.out:
        fail("^C did not interrupt sleep")
    # ^Z stops it (job control), jobs lists it, fg/kill work on it
    t.send("sleep 31\r")
    time.sleep(0.5)
    t.send(b"\x1a")
    at = t.expect("Stopped", timeout=5, since=at)
    t.send("jobs\r")
    at = t.expect("sleep 31", since=at)
    # fg brings it back to the foreground (bash prints its command line), ^C ends it
    t.send("fg\r")
    at = t.expect("sleep 31", since=at)
    time.sleep(0.3)
    t.send(b"\x03")
    t.send("echo JOB-$((7*7))-GONE\r")
    at = t.expect("JOB-49-GONE", since=at)
    # (a job still stopped would make this first exit refuse: "There are stopped jobs")
    t.send("exit 7\r")
    code = t.wait()
    if code != 7:
        fail("airlock shell exited %r after 'exit 7'" % code)
    t.restored()
    print("# login shell: %s" % ("bash" if b"bash" in t.out else "sh"))


def run(rows, cols, code, argv):
    t = Term(argv, rows, cols)
    got = t.wait()
    sys.stdout.write(t.out.replace(b"\r", b"").decode(errors="replace"))
    if got != code:
        fail("%r exited %r, want %r" % (argv[1:], got, code))
    t.restored()


def main():
    if len(sys.argv) < 3:
        fail(__doc__)
    if sys.argv[1] == "login":
        login(sys.argv[2])
    elif sys.argv[1] == "run":
        run(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5:])
    else:
        fail("unknown check " + sys.argv[1])


if __name__ == "__main__":
    main()
