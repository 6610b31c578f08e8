"""Byte sizes: shown to people in binary units, parsed strictly from them; rates and durations in words."""
from __future__ import annotations

import re

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30  # the binary units, for every module that counts in them
_UNITS = [("GiB", GIB), ("MiB", MIB), ("KiB", KIB)]
_PARSE = {
    "": 1, "b": 1,
    "k": 1 << 10, "kb": 1000, "kib": 1 << 10,
    "m": 1 << 20, "mb": 1000**2, "mib": 1 << 20,
    "g": 1 << 30, "gb": 1000**3, "gib": 1 << 30,
    "t": 1 << 40, "tb": 1000**4, "tib": 1 << 40,
    "p": 1 << 50, "pb": 1000**5, "pib": 1 << 50,
    "eb": 1000**6, "eib": 1 << 60,  # no bare "e": "1e" reads as a number's exponent cut short
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


def format_duration(seconds: float) -> str:
    """A time ahead, rounded as people say it: 'under a second', 'about 40 seconds', 'about 12
    minutes', 'about 5 hours', 'about 3 days', 'more than a year'. Each unit holds up to 90 of the
    one below (48 for hours), so 75 s is 'about 75 seconds' and not 'about 1 minute'."""
    if seconds < 1:
        return "under a second"
    for limit, size, name in ((90, 1, "second"), (90 * 60, 60, "minute"), (48 * 3600, 3600, "hour"),
                              (365 * 86400, 86400, "day")):
        if seconds < limit:
            count = max(1, int(seconds / size + 0.5))
            return f"about {count} {name}" + ("s" if count != 1 else "")
    return "more than a year"


def full_words(rate_bytes_per_s: float, seconds: float, gpu: str = "the GPU", ended: bool = False) -> str:
    """'at 35.0 MiB/s the GPU is full in about 12 minutes' (growth.seconds_to_full's answer in
    words); for a run that has ended, 'at 35.0 MiB/s it would have been full in about 12 minutes'.
    0 seconds: the GPU is (or was) already full."""
    rate = f"{format_bytes(int(rate_bytes_per_s))}/s"
    if seconds <= 0:
        return f"at {rate} {gpu} {'was' if ended else 'is'} already full"
    if ended:
        return f"at {rate} it would have been full in {format_duration(seconds)}"
    return f"at {rate} {gpu} is full in {format_duration(seconds)}"
