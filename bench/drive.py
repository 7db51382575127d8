"""The edit and write -> exec drivers of bench/scale.sh and bench/latcpu.sh.

As a program (bench/scale.sh):
    drive.py EDIT DEST N                  N edits of EDIT/edits/f*.txt (open O_TRUNC, write, close),
                                          each until DEST holds the bytes (an inotify watcher on
                                          DEST/edits/, woken only by the edited names)
    drive.py EDIT DEST N AIRLOCK WS       N writes, each followed by `AIRLOCK exec -C WS -- cat` of it
prints "p50 p99 n timeouts" in ms.
"""
import os
import select
import subprocess
import sys
import time


def edits(edit, dest, n):
    """N edits; (latencies in ms, timeouts)."""
    lat, tmo = [], 0
    # only the edited names wake the driver: the temporaries each tool writes first (airlock's
    # .airlock-tmp-*, rsync's .fN.txt.XXXXXX) would wake it while the tool is still working
    w = subprocess.Popen(["inotifywait", "-m", "-e", "close_write,moved_to,create", "--format", "%w%f",
                          "--include", r"/f[0-9]+\.txt$", os.path.join(dest, "edits")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0)
    while b"Watches established" not in w.stderr.readline():
        pass
    fd = w.stdout.fileno()
    os.set_blocking(fd, False)
    time.sleep(0.2)
    for i in range(n):
        rel = "edits/f%d.txt" % (i % 100)
        want = ("edit %d of %d\n" % (i, i % 100)).encode()
        target = os.path.join(dest, rel)
        t0 = time.monotonic_ns()
        with open(os.path.join(edit, rel), "wb") as f:
            f.write(want)
        deadline = time.monotonic() + 5.0
        done = False
        while not done:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            r, _, _ = select.select([fd], [], [], left)
            if not r:
                continue
            try:
                os.read(fd, 65536)
            except BlockingIOError:
                continue
            ts = time.monotonic_ns()
            try:
                with open(target, "rb") as g:
                    if g.read() == want:
                        lat.append((ts - t0) / 1e6)
                        done = True
            except OSError:
                pass
        if not done:
            tmo += 1
        time.sleep(0.002)
    w.kill()
    return lat, tmo


def writes_exec(edit, n, airlock, ws, preexec_fn=None):
    """N writes, each then `airlock exec -C WS -- cat` of it; (latencies in ms, wrong answers)."""
    lat, bad = [], 0
    for i in range(n):
        rel = "edits/f%d.txt" % (i % 100)
        want = ("exec %d\n" % i).encode()
        t0 = time.monotonic_ns()
        with open(os.path.join(edit, rel), "wb") as f:
            f.write(want)
        got = subprocess.run([airlock, "exec", "-C", ws, "--", "cat", rel], stdout=subprocess.PIPE,
                             preexec_fn=preexec_fn).stdout
        t1 = time.monotonic_ns()
        if got == want:
            lat.append((t1 - t0) / 1e6)
        else:
            bad += 1
    return lat, bad


def pct(lat, p):
    """The p-th percentile of lat (sorted here), NaN when empty."""
    lat = sorted(lat)
    return lat[min(len(lat) - 1, int(p / 100.0 * len(lat)))] if lat else float("nan")


if __name__ == "__main__":
    edit_root, dest_root, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if len(sys.argv) > 5:
        got, misses = writes_exec(edit_root, count, sys.argv[4], sys.argv[5])
    else:
        got, misses = edits(edit_root, dest_root, count)
    print("%.3f %.3f %d %d" % (pct(got, 50), pct(got, 99), len(got), misses))
