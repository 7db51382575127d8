#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Record or replay the bytes of one channel session (tests/e2e/vmsnap_e2e.sh).

  chan_record.py record LISTEN TARGET OUT   accept one connection on the Unix
      socket LISTEN, forward it to the Unix socket TARGET both ways until
      either side closes, write what the host sent to OUT.h2g and what the
      guest sent to OUT.g2h; prints "listening" once LISTEN exists.
  chan_record.py replay TARGET IN.h2g OUT   connect to TARGET, send IN's
      first record (the handshake's msg1), read the guest's first record
      (its reply), send the rest of IN, read until the guest closes (or 20 s
      pass); write all the guest sent to OUT.

Bounded: at most 16 MiB per direction, 60 s per session.
"""
import os
import select
import socket
import sys
import time

LIMIT = 16 << 20


def pump(a, b, out_ab, out_ba, deadline):
    socks = [a, b]
    open_ = {a: True, b: True}
    while any(open_.values()) and time.monotonic() < deadline:
        rd, _, _ = select.select([s for s in socks if open_[s]], [], [], 0.2)
        for s in rd:
            data = s.recv(65536)
            other = b if s is a else a
            if not data:
                return
            (out_ab if s is a else out_ba).extend(data)
            if len(out_ab) > LIMIT or len(out_ba) > LIMIT:
                return
            other.sendall(data)


def record(listen, target, out):
    if os.path.exists(listen):
        os.unlink(listen)
    ls = socket.socket(socket.AF_UNIX)
    ls.bind(listen)
    ls.listen(1)
    print("listening", flush=True)
    ls.settimeout(60)
    host, _ = ls.accept()
    guest = socket.socket(socket.AF_UNIX)
    guest.connect(target)
    h2g, g2h = bytearray(), bytearray()
    pump(host, guest, h2g, g2h, time.monotonic() + 60)
    host.close()
    guest.close()
    with open(out + ".h2g", "wb") as f:
        f.write(h2g)
    with open(out + ".g2h", "wb") as f:
        f.write(g2h)


def record_len(data):
    """Length of the record at the start of data (doc/PROTOCOL.md "Records")."""
    if len(data) < 4:
        return None
    return 4 + (int.from_bytes(data[:4], "big") & 0xFFFFFF)


def read_some(s, got, want, deadline):
    """Read into got until want(got) or the peer closes or the deadline."""
    while time.monotonic() < deadline and len(got) < LIMIT and not want(got):
        try:
            d = s.recv(65536)
        except socket.timeout:
            continue
        except OSError:
            return False
        if not d:
            return False
        got.extend(d)
    return True


def replay(target, inp, out):
    with open(inp, "rb") as f:
        data = f.read()
    first = record_len(data) or len(data)
    s = socket.socket(socket.AF_UNIX)
    s.connect(target)
    s.settimeout(0.5)
    got = bytearray()
    deadline = time.monotonic() + 20
    s.sendall(data[:first])
    open_ = read_some(s, got, lambda g: record_len(g) is not None and len(g) >= record_len(g), deadline)
    if open_:
        try:
            s.sendall(data[first:])
        except OSError:
            open_ = False
    if open_:
        read_some(s, got, lambda g: False, deadline)
    s.close()
    with open(out, "wb") as f:
        f.write(got)


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "record":
        record(sys.argv[2], sys.argv[3], sys.argv[4])
    elif len(sys.argv) == 5 and sys.argv[1] == "replay":
        replay(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        sys.exit(__doc__)
