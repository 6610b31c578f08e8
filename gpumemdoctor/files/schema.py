"""Declared shapes for data read from files that came from outside, and the one strict parser.

A shape names each field of a record with its check: a type and, for numbers, its bounds. The
recording, the agents' records, the report, the run file and the baseline are each declared once
(`Shape(...)`, in the module that owns the record) and read by `Shape.__call__`: a field of the
wrong type, out of bounds or missing refuses the whole file with one `BadReportError` that names
the field, never a Python error. A check is any function `(value, what) -> value`; the ones here
compose (`opt`, `list_of`, `pair`, `dict_of`, `one_of`, `Shape`).
"""
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

Check = Callable[[Any, str], Any]


def _fail(what: str, value: Any, expected: str) -> BadReportError:
    return BadReportError(f"{what}: expected {expected}, found {type(value).__name__} {value!r:.60}")


# -- the types ------------------------------------------------------------------------------

def need_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not -MAX_INT <= value <= MAX_INT:
        raise _fail(what, value, "an integer of at most 64 bits")
    return value


def need_count(value: Any, what: str) -> int:
    """A whole number of 0 or more (a count, a rank, a PID)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_INT:
        raise _fail(what, value, "a whole number of 0 or more")
    return value


def need_num(value: Any, what: str) -> float:
    # The range first: math.isfinite(10**400) raises OverflowError.
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not -MAX_NUMBER <= value <= MAX_NUMBER
            or not math.isfinite(value)):
        raise _fail(what, value, "a finite number")
    return float(value)


def need_size(value: Any, what: str) -> int:
    """A size in bytes: an integer from 0 to MAX_BYTES (a negative size is no measurement)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_BYTES:
        raise _fail(what, value, "a size in bytes (an integer, 0 or more, at most 2**60)")
    return value


def need_int_key(key: Any, what: str) -> int:
    """An object's key that names a number ("0", "17"): ASCII digits, at most 18 of them."""
    if not (isinstance(key, str) and key.isascii() and key.isdigit() and len(key) <= 18):
        raise BadReportError(f"{what}: expected a number as the key, found {key!r:.40}")
    return int(key)


def need_str(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise _fail(what, value, "a string")
    return value


def need_bool(value: Any, what: str) -> bool:
    if not isinstance(value, bool):
        raise BadReportError(f"{what}: expected true or false, found {value!r:.40}")
    return value


def need_dict(value: Any, what: str) -> dict:
    if not isinstance(value, dict):
        raise _fail(what, value, "an object")
    return value


def need_list(value: Any, what: str) -> list:
    if not isinstance(value, list):
        raise _fail(what, value, "a list")
    return value


def anything(value: Any, what: str) -> Any:
    """Data kept as it is (a finding's evidence beyond its checked fields)."""
    return value


def frame(value: Any, what: str) -> list:
    """A stack frame: [file, line, function]."""
    if not isinstance(value, list) or len(value) != 3:
        raise BadReportError(f"{what}: a stack frame must be [file, line, function]")
    return [need_str(value[0], what), need_int(value[1], what), need_str(value[2], what)]


# -- composing them -------------------------------------------------------------------------

def opt(check: Check) -> Check:
    """The check, or null."""
    return lambda value, what: None if value is None else check(value, what)


def null_as(default: Any, check: Check) -> Check:
    """The check, or null read as the default (a fresh copy of a list or dict)."""
    def read(value: Any, what: str) -> Any:
        if value is None:
            return type(default)(default) if isinstance(default, (list, dict)) else default
        return check(value, what)
    return read


def list_of(check: Check) -> Check:
    return lambda value, what: [check(x, what) for x in need_list(value, what)]


def pair(first: Check, second: Check) -> Check:
    def check(value: Any, what: str) -> list:
        if not isinstance(value, list) or len(value) != 2:
            raise BadReportError(f"{what}: expected a pair [a, b], found {value!r:.60}")
        return [first(value[0], what), second(value[1], what)]
    return check


def row(*checks: Check, least: int | None = None) -> Check:
    """A list whose items have a check each, in order; `least` of them must be there (all by default)."""
    need = len(checks) if least is None else least

    def check(value: Any, what: str) -> list:
        if not isinstance(value, list) or not need <= len(value) <= len(checks):
            many = f"{need} to {len(checks)}" if need != len(checks) else str(need)
            raise BadReportError(f"{what}: expected a list of {many} items, found {value!r:.80}")
        return [c(v, what) for c, v in zip(checks, value)]
    return check


def dict_of(key: Check, value: Check) -> Check:
    """An object whose keys and values each pass their check (keys are always strings in JSON)."""
    def check(obj: Any, what: str) -> dict:
        return {key(k, what): value(v, f"{what} {k!r:.20}") for k, v in need_dict(obj, what).items()}
    return check


def one_of(*allowed: Any) -> Check:
    def check(value: Any, what: str) -> Any:
        if value not in allowed:
            raise BadReportError(f"{what}: {value!r:.40} is not one of {', '.join(map(str, allowed))}")
        return value
    return check


class Absent:
    """A field that may be left out: `default` stands for it (a fresh copy of a list or dict; a
    function's result where `default` is a function)."""

    def __init__(self, check: Check, default: Any):
        self.check, self.default = check, default

    def value(self) -> Any:
        if callable(self.default):
            return self.default()
        return type(self.default)(self.default) if isinstance(self.default, (list, dict)) else self.default


def absent(check: Check, default: Any) -> Absent:
    return Absent(check, default)


OMIT = object()
REQUIRED = object()


def written(check: Check) -> Absent:
    """A field that must be written, even as null (a baseline's figure: null where not measured)."""
    return Absent(check, REQUIRED)


def may(check: Check) -> Absent:
    """A field that may be left out, and then stays out (free-form data: a finding's evidence)."""
    return Absent(check, OMIT)


class Shape:
    """An object's declared fields, each with its check; `Shape(...)(value, what)` is the parser.

    A field missing from the object is checked as null (so it must be `opt`), unless it is declared
    `absent(check, default)`, which fills in the default. Keys not declared are dropped, or with
    `rest=check` kept after that check, in the object's order (a target's own fields, a finding's
    free-form evidence); a field declared `may(check)` is checked where present and left out where not;
    one declared `written(check)` must be there, null or not.
    `rename` maps a key to the name it is given in the result (a dataclass's field).
    """

    def __init__(self, fields: dict[str, Check | Absent], rest: Check | None = None,
                 rename: dict[str, str] | None = None):
        self.fields, self.rest, self.rename = fields, rest, rename or {}

    def __call__(self, value: Any, what: str) -> dict:
        obj = need_dict(value, what)
        out = {}
        if self.rest is not None:  # the object's own order, its undeclared keys among the rest
            for key, item in obj.items():
                check = self.fields.get(key)
                if check is None:
                    out[need_str(key, what)] = self.rest(item, f"{what} {key!r:.20}")
                else:
                    check = check.check if isinstance(check, Absent) else check
                    out[self.rename.get(key, key)] = check(item, f"{what} {key}")
        for key, check in self.fields.items():
            name = self.rename.get(key, key)
            if name in out and self.rest is not None:
                continue
            if isinstance(check, Absent):
                if key in obj:
                    out[name] = check.check(obj[key], f"{what} {key}")
                elif check.default is REQUIRED:
                    raise BadReportError(f"{what}: {key} missing (null where it was not measured)")
                elif check.default is not OMIT:
                    out[name] = check.value()
            else:
                out[name] = check(obj.get(key), f"{what} {key}")
        return out

    def into(self, cls: type) -> Check:
        """A check that parses the object and makes `cls(**fields)` of it."""
        return lambda value, what: cls(**self(value, what))


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


# The shorthands the declarations use.
INT, COUNT, NUM, SIZE, STR, BOOL, DICT, ANY = (need_int, need_count, need_num, need_size, need_str, need_bool,
                                               need_dict, anything)
