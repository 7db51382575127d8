#!/bin/sh
# Install what airlock's build and tests need and is missing (Debian 12, as
# root). Idempotent: does nothing when everything is there.
set -eu
PKGS="meson ninja-build pkg-config gcc libc6-dev libfuse3-dev fuse3 libxxhash-dev libzstd-dev
libsodium-dev libjansson-dev libcmocka-dev socat git curl openssl python3 procps iproute2 util-linux
qemu-system-x86 qemu-utils busybox-static e2fsprogs cpio xz-utils zstd bc python3-jsonschema"
# qemu-utils: qemu-img, for the vm sandbox's forks (doc/VM.md "Forks"; vmfork_e2e skips without it).
# python3-jsonschema: tests/e2e/cli_e2e.sh checks every --json against doc/schema/.
# The vm sandbox's template (guest-agent/template/build.sh) also needs the
# kernel package linux-image-amd64 to be downloadable (apt-get download; it
# is not installed). Installing qemu pulls in udev, which changes /dev
# permissions; no test depends on them.
missing=""
for p in $PKGS; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
# The agent-CLI tests (tests/agents/, tests/e2e/agent_*.sh) install their CLIs
# with npm. Looked up as commands, not packages: a nodejs from NodeSource
# brings its own npm, and Debian's npm package would conflict with it.
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
	missing="$missing nodejs npm"
fi
if [ -n "$missing" ]; then
	if [ "$(id -u)" -ne 0 ]; then
		echo "airlock: missing packages:$missing (run this as root, or: sudo apt-get install$missing)" >&2
		exit 1
	fi
	echo "installing:$missing"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	# shellcheck disable=SC2086
	apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi
# The vm template downloads the kernel package (not installed): the package
# lists must know it even when every package above was already there.
if ! apt-cache show linux-image-amd64 >/dev/null 2>&1 && [ "$(id -u)" -eq 0 ]; then
	apt-get update -qq || true
fi
