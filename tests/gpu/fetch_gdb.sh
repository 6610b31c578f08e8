#!/usr/bin/env bash
# Bring gdb to a machine without a package registry (the lent GPU machine), for `watch --attach`'s GPU
# tests: run HERE, on a Debian machine with apt. It downloads Debian's gdb-minimal (gdb without Python)
# and every library it loads, its C library and dynamic loader included, as .deb files (apt-get
# download) into .gdb/debs, checks them by unpacking them here as the GPU machine will (tests/gpu/
# gdb_from_debs.py: into .gdb/root, a folder of their own, with .gdb/gdb, a wrapper that runs that gdb
# through the unpacked loader with only the unpacked libraries, so that it needs nothing of the machine
# but the kernel) and running it. .gdb/ is listed in .git/info/exclude. Carry .gdb/debs (15 MB) to the
# GPU machine (`run`'s carry: [".gdb/debs"]): tests/gpu/test_attach_gpu.py unpacks it there and
# attaches through it where ptrace alone is not the way (not x86-64 Linux, or GPUMEMDOCTOR_GDB set).
#
# Usage: bash tests/gpu/fetch_gdb.sh   (then: .gdb/gdb --version)
set -euo pipefail

cd "$(dirname "$0")/../.."
out=.gdb
arch="$(dpkg --print-architecture)"
triplet="$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -dumpmachine 2>/dev/null || echo x86_64-linux-gnu)"
rm -rf "$out"
mkdir -p "$out/debs" "$out/root"
exclude="$(git rev-parse --git-path info/exclude)"
mkdir -p "$(dirname "$exclude")"
grep -qxF "/.gdb/" "$exclude" 2>/dev/null || echo "/.gdb/" >> "$exclude"

if ! apt-cache show gdb-minimal >/dev/null 2>&1; then
    apt-get update -qq
fi

fetch() {  # fetch PACKAGE: download its .deb (once) and unpack it into the root
    local package="$1"
    if ls "$out/debs/${package}"_*.deb >/dev/null 2>&1; then
        return
    fi
    (cd "$out/debs" && apt-get download -qq "$package:$arch" 2>/dev/null || apt-get download -qq "$package")
    dpkg -x "$out/debs/${package}"_*.deb "$out/root"
    echo "  $package"
}

echo "downloading gdb-minimal and what it loads into $out/debs:"
fetch gdb-minimal
fetch libc6
fetch libgcc-s1
fetch libstdc++6
libs="$out/root/lib/$triplet:$out/root/usr/lib/$triplet"
loader="$(ls "$out/root/lib/$triplet"/ld-linux*.so.* | head -n 1)"
# Every library gdb loads, found here by ldd, and the package that owns it; again until ldd finds all
# of them in the root (a library's own libraries come in with it).
for _ in 1 2 3 4 5 6; do
    missing=0
    while read -r lib; do
        [ -n "$lib" ] || continue
        case "$lib" in "$PWD/$out/root"/*|"$out/root"/*) continue ;; esac
        owner="$(dpkg -S "$(readlink -f "$lib")" 2>/dev/null | head -n 1 | cut -d: -f1 || true)"
        [ -n "$owner" ] || owner="$(dpkg -S "$lib" 2>/dev/null | head -n 1 | cut -d: -f1 || true)"
        if [ -z "$owner" ]; then
            echo "no package here owns $lib: install gdb here first (apt-get install gdb-minimal)" >&2
            exit 1
        fi
        fetch "$owner"
        missing=1
    done < <(LD_LIBRARY_PATH="$libs" ldd "$out/root/usr/bin/gdb" | awk '/=>/ {print $3}')
    [ "$missing" = 0 ] && break
done
if LD_LIBRARY_PATH="$libs" ldd "$out/root/usr/bin/gdb" | grep -q "not found"; then
    LD_LIBRARY_PATH="$libs" ldd "$out/root/usr/bin/gdb" | grep "not found" >&2
    echo "some of gdb's libraries are not on this machine: apt-get install gdb-minimal here, then run this again" >&2
    exit 1
fi

# The folder as the GPU machine will have it: the .debs alone, unpacked by the Python reader there
# (no dpkg needed), and the gdb so made run once here.
rm -rf "$out/root" "$out/gdb"
python3 -c "import sys; sys.path.insert(0, 'tests/gpu'); import gdb_from_debs as g; from pathlib import Path; \
g.unpack(Path('$out/debs'), Path('$out/root')); print(g.wrapper(Path('$out').resolve()))" >/dev/null
echo "gdb: $out/gdb, from $(ls "$out/debs" | wc -l) .debs ($(du -sh "$out/debs" | cut -f1)): $("$out/gdb" --version | head -n 1)"
echo "its libraries, all unpacked (ldd through the unpacked loader):"
"$out/root/lib/$triplet/$(basename "$loader")" --list --library-path "$out/root/lib/$triplet:$out/root/usr/lib/$triplet" \
    "$out/root/usr/bin/gdb" | awk '/=>/ {print "  " $1 " => " $3}'
echo "carry \".gdb/debs\" to the GPU machine: its tests unpack them there (tests/gpu/gdb_from_debs.py)"
