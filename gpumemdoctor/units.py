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
MAX_SIZE_BYTES = 1 << 60  # 1 EiB: no GPU or host has that much, so a larger size is a mistake
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def format_bytes(n: int | None, signed: bool = False) -> str:
    """1536 MiB -> '1.50 GiB'; None -> 'n/a'. Three significant digits."""
    if n is None:
        return "n/a"
    sign = "-" if n < 0 else ("+" if signed and n > 0 else "")
    a = abs(n)
    if a >= 1 << 60:  # past an exbibyte a float loses the digits, and past 10**308 it overflows
        return f"{sign}{(a + (1 << 29)) >> 30} GiB"
    for name, size in _UNITS:
        if a >= size:
            value = a / size
            for digits, limit in ((2, 10), (1, 100), (0, 1024)):
                text = f"{value:.{digits}f}"
                if float(text) < limit:
                    return f"{sign}{text} {name}"
            # rounds up to 1024 of this unit: show it in the next one up
            bigger = _UNITS[_UNITS.index((name, size)) - 1] if name != "GiB" else None
            if bigger is not None:
                return f"{sign}{a / bigger[1]:.2f} {bigger[0]}"
            return f"{sign}{value:.0f} {name}"
    return f"{sign}{a} B"


def parse_size(text: str) -> int:
    """'512MiB' -> 536870912. Raises ValueError with a readable message."""
    if text.strip().startswith("-"):
        raise ValueError(f"{text!r:.60}: a size must not be negative; give 0 or more, like 512MiB")
    m = _SIZE_RE.match(text)
    if not m or m.group(2).lower() not in _PARSE:
        raise ValueError(f"{text!r:.60} is not a size; write it like 512MiB or 2GiB")
    number = m.group(1)
    if len(number) > 30:  # float() would give infinity, or lose the digits
        raise ValueError(f"{text!r:.60} is too large a size; write it like 512MiB or 2GiB")
    size = int(float(number) * _PARSE[m.group(2).lower()])
    if size > MAX_SIZE_BYTES:
        raise ValueError(f"{text!r:.60} is larger than any memory (the most is {MAX_SIZE_BYTES} bytes, "
                         "1 EiB); write it like 512MiB or 2GiB")
    return size
