"""Byte sizes: shown to people in binary units, parsed strictly from them."""
from __future__ import annotations

import re

_UNITS = [("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)]
_PARSE = {
    "": 1, "b": 1,
    "k": 1 << 10, "kb": 1000, "kib": 1 << 10,
    "m": 1 << 20, "mb": 1000**2, "mib": 1 << 20,
    "g": 1 << 30, "gb": 1000**3, "gib": 1 << 30,
    "t": 1 << 40, "tb": 1000**4, "tib": 1 << 40,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def format_bytes(n: int | None, signed: bool = False) -> str:
    """1536 MiB -> '1.50 GiB'; None -> 'n/a'."""
    if n is None:
        return "n/a"
    sign = "-" if n < 0 else ("+" if signed and n > 0 else "")
    a = abs(n)
    for name, size in _UNITS:
        if a >= size:
            value = a / size
            text = f"{value:.2f}" if value < 10 else f"{value:.1f}" if value < 100 else f"{value:.0f}"
            return f"{sign}{text} {name}"
    return f"{sign}{a} B"


def parse_size(text: str) -> int:
    """'512MiB' -> 536870912. Raises ValueError with a readable message."""
    m = _SIZE_RE.match(text)
    if not m or m.group(2).lower() not in _PARSE:
        raise ValueError(f"{text!r} is not a size; write it like 512MiB or 2GiB")
    return int(float(m.group(1)) * _PARSE[m.group(2).lower()])
