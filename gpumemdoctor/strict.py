"""Strict checks for data read from files that came from outside: one type per field, or refuse."""
from __future__ import annotations

import math
from typing import Any

from .errors import BadReportError

def _fail(what: str, value: Any, expected: str) -> BadReportError:
    return BadReportError(f"{what}: expected {expected}, found {type(value).__name__} {value!r:.60}")


def need_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(what, value, "an integer")
    return value


def opt_int(value: Any, what: str) -> int | None:
    return None if value is None else need_int(value, what)


def need_num(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _fail(what, value, "a finite number")
    return float(value)


def opt_num(value: Any, what: str) -> float | None:
    return None if value is None else need_num(value, what)


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
