#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Fail when an #include crosses a layer upward or between the guest side
and the host side (doc/ARCHITECTURE.md "Layers").

    layers.py SOURCE_ROOT

Every C file of the product lives in one layer's folder; its public header
is include/airlock/<layer>/<module>.h. A file may include headers of its
own layer and of the layers LAYERS lists below it, and private headers
(*_i.h) of its own folder only. Prints one line per violation, naming the
file, the line and the rule, and exits 1 if there is any."""

import os
import re
import sys

# layer: (folder, side, layers it may include). Keep in step with
# meson.build (the libraries' dependencies) and doc/ARCHITECTURE.md.
LAYERS = {
    "core": ("relay/core", "shared", []),
    "exec": ("relay/exec", "shared", ["core"]),
    "content": ("fs/content", "shared", ["core"]),
    "policy": ("fs/policy", "host", ["core"]),
    "guest": ("guest-agent", "guest", ["core", "exec", "content"]),
    "sync": ("fs/sync", "host", ["core", "content", "policy"]),
    "mount": ("fs/mount", "host", ["core"]),
    "server": ("relay/server", "host", ["core"]),
    "host": ("relay/host", "host", ["core", "exec", "policy", "server"]),
    "egress": ("relay/egress", "host", ["core", "content", "policy", "sync", "server"]),
    "sandbox": ("relay/sandbox", "host", ["core", "exec", "content", "policy", "sync"]),
    "cli": ("relay/cli", "host",
            ["core", "exec", "content", "policy", "sync", "mount", "server", "host", "egress", "sandbox"]),
}
# The top-level folders that hold product code: every C file below them
# must be in a layer's folder.
PRODUCT = ("relay", "fs", "guest-agent", "include")
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')


def layer_of(rel):
    """The layer a product file belongs to, or None."""
    m = re.match(r"include/airlock/([^/]+)/[^/]+\.h$", rel)
    if m:
        return m.group(1) if m.group(1) in LAYERS else None
    best = None
    for name, (folder, _, _) in LAYERS.items():
        if os.path.dirname(rel) == folder:
            best = name
    return best


def check_file(root, rel, errors):
    me = layer_of(rel)
    if me is None:
        errors.append(f"{rel}: not in any layer's folder (see LAYERS in tests/check/layers.py)")
        return
    folder, side, below = LAYERS[me]
    allowed = set(below) | {me}
    with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            what = m.group(2)
            if m.group(1) == "<" and not what.startswith("airlock/"):
                continue  # system and library headers
            if what.startswith("airlock/"):
                parts = what.split("/")
                if len(parts) != 3 or parts[1] not in LAYERS:
                    errors.append(f"{rel}:{n}: {what}: not a layer's header (include/airlock/<layer>/<module>.h)")
                    continue
                to = parts[1]
                if to in allowed:
                    continue
                to_side = LAYERS[to][1]
                if {side, to_side} == {"guest", "host"}:
                    errors.append(f"{rel}:{n}: {me} ({side} side) includes {what} ({to_side} side): "
                                  "the guest and host sides never include each other")
                else:
                    errors.append(f"{rel}:{n}: {me} includes {what}: layer {to} is not below {me} "
                                  f"(it may include {', '.join(sorted(allowed))})")
                continue
            # a quoted, non-airlock include: only a private header of the same folder
            if "/" in what or not what.endswith("_i.h"):
                errors.append(f"{rel}:{n}: \"{what}\": product code includes airlock/<layer>/… headers "
                              "or a private *_i.h of its own folder, nothing else")
            elif not os.path.exists(os.path.join(root, os.path.dirname(rel), what)):
                errors.append(f"{rel}:{n}: \"{what}\": no such private header in {os.path.dirname(rel)}/")


def main():
    if len(sys.argv) != 2:
        print("usage: layers.py SOURCE_ROOT", file=sys.stderr)
        return 2
    root = sys.argv[1]
    errors, files = [], 0
    for top in PRODUCT:
        for d, dirs, names in os.walk(os.path.join(root, top)):
            dirs.sort()
            for name in sorted(names):
                if name.endswith((".c", ".h")):
                    files += 1
                    check_file(root, os.path.relpath(os.path.join(d, name), root), errors)
    for e in errors:
        print(e)
    if files == 0:
        print(f"layers: no C files under {root}: wrong SOURCE_ROOT?")
        return 1
    print(f"layers: {files} files, {len(errors)} violations")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
