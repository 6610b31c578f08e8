"""gdb from the .deb files that tests/gpu/fetch_gdb.sh downloaded (`.gdb/debs`), unpacked into a folder of
its own (`.gdb/root`), with a wrapper (`.gdb/gdb`) that runs it through the unpacked dynamic loader with the
unpacked libraries only: nothing of the machine's own but the kernel. For the GPU machine, which has no
package registry and may have no gdb (nor dpkg: the .debs are read here, `ar` and `tar` in Python).

    python tests/gpu/gdb_from_debs.py [.gdb]     # prints the wrapper's path
"""
from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

TRIPLETS = ("x86_64-linux-gnu", "aarch64-linux-gnu")


def members(deb: Path):
    """(name, bytes) of each member of a .deb (an `ar` archive)."""
    data = deb.read_bytes()
    if not data.startswith(b"!<arch>\n"):
        raise ValueError(f"{deb} is not a .deb")
    i = 8
    while i + 60 <= len(data):
        header = data[i:i + 60]
        name = header[:16].decode().strip().rstrip("/")
        size = int(header[48:58].decode().strip())
        yield name, data[i + 60:i + 60 + size]
        i += 60 + size + (size % 2)


def unpack(debs: Path, root: Path) -> None:
    """Every .deb's files (its data.tar.*) into root, as `dpkg -x` does."""
    root.mkdir(parents=True, exist_ok=True)
    for deb in sorted(debs.glob("*.deb")):
        for name, blob in members(deb):
            if name.startswith("data.tar"):
                if name.endswith(".zst"):
                    raise ValueError(f"{deb}: zstd-compressed; fetch Debian's packages (xz) with fetch_gdb.sh")
                with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
                    kwargs = {"filter": "fully_trusted"} if hasattr(tarfile, "fully_trusted_filter") else {}
                    tar.extractall(root, **kwargs)


def wrapper(folder: Path) -> Path:
    """Unpack folder/debs into folder/root (once) and write folder/gdb; its path."""
    root = folder / "root"
    if not (root / "usr" / "bin" / "gdb").exists():
        if shutil.which("dpkg"):
            root.mkdir(parents=True, exist_ok=True)
            for deb in sorted((folder / "debs").glob("*.deb")):
                subprocess.run(["dpkg", "-x", str(deb), str(root)], check=True)
        else:
            unpack(folder / "debs", root)
    triplet = next(t for t in TRIPLETS if (root / "lib" / t).is_dir())
    loader = next((root / "lib" / triplet).glob("ld-linux*.so.*"))
    gdb = folder / "gdb"
    libs = f"$root/lib/{triplet}:$root/usr/lib/{triplet}"
    gdb.write_text("#!/bin/sh\n"
                   "# gdb-minimal unpacked from .gdb/debs: its own loader, its own libraries only.\n"
                   'root="$(cd "$(dirname "$0")" && pwd)/root"\n'
                   f'exec "$root/lib/{triplet}/{loader.name}" --library-path "{libs}" '
                   '"$root/usr/bin/gdb" --data-directory="$root/usr/share/gdb" "$@"\n')
    gdb.chmod(0o755)
    return gdb


if __name__ == "__main__":
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else ".gdb").resolve()
    path = wrapper(folder)
    version = subprocess.run([str(path), "--version"], capture_output=True, text=True)
    print(path if version.returncode == 0 else f"{path} does not run: {version.stderr.strip()[:300]}")
    sys.exit(version.returncode)
