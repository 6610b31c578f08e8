"""Strict checks for data read from files that came from outside: one type per field, or refuse."""
from __future__ import annotations

import math
from typing import Any, Callable

from ..errors import BadReportError
from ..units import MAX_SIZE_BYTES as MAX_BYTES

# Bounds on numbers from files, so that nothing absurd reaches the arithmetic and the formatting
# (10**400 bytes overflowed format_bytes). Every count, PID and step this tool writes fits in 64 bits;
# no GPU or host holds an exbibyte (MAX_BYTES); times and rates stay far below 1e18 (seconds since
# 1970 are 1.7e9).
MAX_INT = (1 << 63) - 1
MAX_NUMBER = 1e18


def _fail(what: str, value: Any, expected: str) -> BadReportError:
    return BadReportError(f"{what}: expected {expected}, found {type(value).__name__} {value!r:.60}")


def need_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not -MAX_INT <= value <= MAX_INT:
        raise _fail(what, value, "an integer of at most 64 bits")
    return value


def opt_int(value: Any, what: str) -> int | None:
    return None if value is None else need_int(value, what)


def need_num(value: Any, what: str) -> float:
    # The range first: math.isfinite(10**400) raises OverflowError.
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not -MAX_NUMBER <= value <= MAX_NUMBER
            or not math.isfinite(value)):
        raise _fail(what, value, "a finite number")
    return float(value)


def opt_num(value: Any, what: str) -> float | None:
    return None if value is None else need_num(value, what)


def need_size(value: Any, what: str) -> int:
    """A size in bytes: an integer from 0 to MAX_BYTES (a negative size is no measurement)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_BYTES:
        raise _fail(what, value, "a size in bytes (an integer, 0 or more, at most 2**60)")
    return value


def opt_size(value: Any, what: str) -> int | None:
    return None if value is None else need_size(value, what)


def need_int_key(key: Any, what: str) -> int:
    """An object's key that names a number ("0", "17"): ASCII digits, at most 18 of them."""
    if not (isinstance(key, str) and key.isascii() and key.isdigit() and len(key) <= 18):
        raise BadReportError(f"{what}: expected a number as the key, found {key!r:.40}")
    return int(key)


def need_str(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise _fail(what, value, "a string")
    return value


def opt_str(value: Any, what: str) -> str | None:
    return None if value is None else need_str(value, what)


def need_dict(value: Any, what: str) -> dict:
    if not isinstance(value, dict):
        raise _fail(what, value, "an object")
    return value


def need_list(value: Any, what: str) -> list:
    if not isinstance(value, list):
        raise _fail(what, value, "a list")
    return value


def need_pairs(value: Any, what: str, first: Callable, second: Callable) -> list:
    """A list of [a, b] pairs, each part checked by its function (need_num, need_size...)."""
    pairs = need_list(value, what)
    for pair in pairs:
        if not isinstance(pair, list) or len(pair) != 2:
            raise BadReportError(f"{what}: expected pairs [a, b], found {pair!r:.60}")
        first(pair[0], what)
        second(pair[1], what)
    return pairs


def check_sizes(obj: Any, what: str) -> None:
    """Every field named `bytes` or `..._bytes` anywhere in obj is a size (need_size): one rule for
    the nested records (evidence, root-cause records, suspects) that are checked only in shape."""
    stack = [(obj, what)]
    while stack:
        value, where = stack.pop()
        if isinstance(value, dict):
            for key, item in value.items():
                if isinstance(key, str) and (key == "bytes" or key.endswith("_bytes")) and item is not None \
                        and not isinstance(item, (dict, list)):
                    need_size(item, f"{where} {key}")
                elif isinstance(item, (dict, list)):
                    stack.append((item, key if isinstance(key, str) else where))
        elif isinstance(value, list):
            stack.extend((item, where) for item in value if isinstance(item, (dict, list)))
