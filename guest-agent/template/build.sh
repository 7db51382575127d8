#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
#
# Build the base template for `airlock up --sandbox vm` (doc/VM.md):
#   OUTDIR/vmlinux          uncompressed kernel (PVH entry; -M microvm boots it directly)
#   OUTDIR/initramfs.cpio   busybox, the static airlock-agent, the init, the modules
#   OUTDIR/kernel.hz        the kernel's CONFIG_HZ (for lpj= on the command line)
#   OUTDIR/template.txt     what went in (kernel version, modules, input hashes)
#
# Everything comes from Debian packages: the kernel from linux-image-amd64
# (apt-get download + dpkg-deb -x, no install), busybox from busybox-static.
# The build is cached: it is redone only when an input changed (this script,
# the init, the agent, busybox, the kernel package).
#
# usage: build.sh OUTDIR AGENT
#   AGENT: a statically linked airlock-agent (meson setup b -Dstatic_agent=true)
# environment:
#   AIRLOCK_KERNEL_DEB  use this linux-image-*.deb instead of downloading one
#   AIRLOCK_BUSYBOX     static busybox to use (default /bin/busybox from busybox-static)
set -eu

die() { echo "template: $*" >&2; exit 1; }

[ $# -eq 2 ] || die "usage: build.sh OUTDIR AGENT"
OUT=$1
AGENT=$2
HERE=$(cd "$(dirname "$0")" && pwd)
BUSYBOX=${AIRLOCK_BUSYBOX:-/bin/busybox}

[ -x "$AGENT" ] || die "$AGENT: no such executable (build it with: meson setup b -Dstatic_agent=true && ninja -C b)"
# A dynamic agent would find no libc in the initramfs.
if readelf -l "$AGENT" 2>/dev/null | grep -q 'Requesting program interpreter'; then
	die "$AGENT is dynamically linked; the template needs the static agent (meson setup b -Dstatic_agent=true)"
fi
[ -x "$BUSYBOX" ] || die "$BUSYBOX: missing (apt-get install busybox-static)"
if readelf -l "$BUSYBOX" 2>/dev/null | grep -q 'Requesting program interpreter'; then
	die "$BUSYBOX is dynamically linked (apt-get install busybox-static)"
fi
for t in dpkg-deb cpio xz sha256sum; do
	command -v $t >/dev/null 2>&1 || die "$t is missing (apt-get install dpkg cpio xz-utils coreutils)"
done

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
mkdir -p "$OUT/cache"

# ---- the kernel package: a given .deb, or the one linux-image-amd64 depends on ----
if [ -n "${AIRLOCK_KERNEL_DEB:-}" ]; then
	DEB=$AIRLOCK_KERNEL_DEB
	[ -f "$DEB" ] || die "AIRLOCK_KERNEL_DEB=$DEB: no such file"
else
	PKG=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ { print $2; exit }')
	[ -n "$PKG" ] || die "apt-cache knows no linux-image-amd64 (run apt-get update, or set AIRLOCK_KERNEL_DEB)"
	DEB=$(ls "$OUT/cache/${PKG}_"*.deb 2>/dev/null | head -n 1 || true)
	if [ -z "$DEB" ]; then
		(cd "$OUT/cache" && apt-get download -q "$PKG" >/dev/null 2>&1) ||
			die "apt-get download $PKG failed (network? set AIRLOCK_KERNEL_DEB to a downloaded .deb)"
		DEB=$(ls "$OUT/cache/${PKG}_"*.deb | head -n 1)
	fi
fi

# ---- cache key: every input's content ----
KEY=$( (sha256sum "$0" "$HERE/init" "$AGENT" "$BUSYBOX" | awk '{ print $1 }'; basename "$DEB") | sha256sum | cut -c1-16)
if [ -f "$OUT/stamp" ] && [ "$(cat "$OUT/stamp")" = "$KEY" ] && [ -f "$OUT/vmlinux" ] && [ -f "$OUT/initramfs.cpio" ] && [ -f "$OUT/kernel.hz" ]; then
	echo "template: $OUT is up to date ($KEY)"
	exit 0
fi
rm -f "$OUT/stamp"

W=$(mktemp -d "$OUT/.build.XXXXXX")
trap 'rm -rf "$W"' EXIT
dpkg-deb -x "$DEB" "$W/k"
KVER=$(ls "$W/k/lib/modules" | head -n 1)
[ -n "$KVER" ] || die "$DEB holds no /lib/modules"
BZ="$W/k/boot/vmlinuz-$KVER"
MODDIR="$W/k/lib/modules/$KVER"

# ---- vmlinux: the ELF inside the bzImage (the kernel's extract-vmlinux approach):
# find each compression magic, decompress from there, keep the first ELF ----
elf_ok() { [ "$(head -c 4 "$1" | od -An -c | tr -d ' \n')" = '177ELF' ]; }
try_decomp() { # MAGIC(tr form) MAGIC(grep form) CMD...
	tr_from=$1 grep_re=$2
	shift 2
	for pos in $(tr "$tr_from\n$grep_re" "\n$grep_re=" <"$BZ" | grep -abo "^$grep_re" | cut -d: -f1); do
		tail -c+"$pos" "$BZ" | "$@" >"$W/vmlinux" 2>/dev/null || true
		if [ -s "$W/vmlinux" ] && elf_ok "$W/vmlinux"; then return 0; fi
	done
	return 1
}
try_decomp '\3757zXZ\000' xy xz -dc ||
	try_decomp '(\265/\375' xxx zstd -dc ||
	try_decomp '\037\213\010' xy gunzip -c ||
	die "cannot find the compressed kernel inside $BZ"
mv "$W/vmlinux" "$OUT/vmlinux.new"

# ---- modules the kernel lacks built in, with their dependencies ----
# (from modinfo's depends= field, read straight from the .ko: no kmod needed)
WANT="virtio_mmio virtio_pci virtio_blk virtio_console crc32c_generic ext4"
ko_of() { find "$MODDIR/kernel" -name "$1.ko" -o -name "$1.ko.xz" | head -n 1; }
builtin() { grep -q "/$1.ko\$" "$MODDIR/modules.builtin"; }
ORDER=""
add_mod() { # depth-first: dependencies before the module ("local": dash and busybox sh have it)
	local m f deps d
	m=$(echo "$1" | tr - _)
	case " $ORDER " in *" $m "*) return 0 ;; esac
	builtin "$m" && return 0
	f=$(ko_of "$m")
	[ -n "$f" ] || f=$(ko_of "$(echo "$m" | tr _ -)")
	[ -n "$f" ] || die "kernel $KVER has no module $m"
	case "$f" in *.xz) xz -dc "$f" >"$W/m.ko" ;; *) cp "$f" "$W/m.ko" ;; esac
	deps=$(tr '\0' '\n' <"$W/m.ko" | sed -n 's/^depends=//p' | tr , ' ')
	for d in $deps; do add_mod "$d"; done
	case " $ORDER " in *" $m "*) return 0 ;; esac
	mkdir -p "$W/root/lib/modules"
	case "$f" in *.xz) xz -dc "$f" >"$W/root/lib/modules/$m.ko" ;; *) cp "$f" "$W/root/lib/modules/$m.ko" ;; esac
	ORDER="$ORDER $m"
}
for m in $WANT; do add_mod "$m"; done
echo "$ORDER" | tr ' ' '\n' | sed '/^$/d' >"$W/root/lib/modules/load.order"

# ---- the initramfs tree ----
R="$W/root"
mkdir -p "$R/bin" "$R/sbin" "$R/etc" "$R/proc" "$R/sys" "$R/dev" "$R/run" "$R/tmp" "$R/root" \
	"$R/persist" "$R/workspace" "$R/home/airlock"
chmod 1777 "$R/tmp"
cp "$BUSYBOX" "$R/bin/busybox"
for a in $("$BUSYBOX" --list); do
	[ "$a" = busybox ] || ln -s busybox "$R/bin/$a"
done
cp "$AGENT" "$R/sbin/airlock-agent"
cp "$HERE/init" "$R/init"
chmod 0755 "$R/init" "$R/sbin/airlock-agent"
cat >"$R/etc/passwd" <<'PW'
root:x:0:0:root:/root:/bin/sh
airlock:x:1000:1000:airlock:/home/airlock:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
PW
cat >"$R/etc/group" <<'GR'
root:x:0:
tty:x:5:
airlock:x:1000:
nogroup:x:65534:
GR
echo "airlock-vm" >"$R/etc/hostname"
(cd "$R" && find . | LC_ALL=C sort | cpio -o -H newc --quiet -R 0:0) >"$OUT/initramfs.cpio.new"

# CONFIG_HZ: the host computes loops-per-jiffy (lpj=) for the command line from it
sed -n 's/^CONFIG_HZ=//p' "$W/k/boot/config-$KVER" >"$OUT/kernel.hz"
mv "$OUT/vmlinux.new" "$OUT/vmlinux"
mv "$OUT/initramfs.cpio.new" "$OUT/initramfs.cpio"
{
	echo "kernel $KVER ($(basename "$DEB"))"
	echo "modules$ORDER"
	echo "busybox $("$BUSYBOX" | head -n 1)"
	echo "key $KEY"
} >"$OUT/template.txt"
echo "$KEY" >"$OUT/stamp"
echo "template: built $OUT (kernel $KVER, modules:$ORDER)"
