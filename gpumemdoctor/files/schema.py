"""Declared shapes for data read from files that came from outside, and the one strict parser.

A shape names each field of a record with its check: a type and, for numbers, its bounds. The
recording, the agents' records, the report, the run file and the baseline are each declared once
(`Shape(...)`, in the module that owns the record) and read by `Shape.__call__`: a field of the
wrong type, out of bounds or missing refuses the whole file with one `BadReportError` that names
the field, never a Python error. A check is any function `(value, what) -> value`: the types here
(`INT`, `PID`, `SECONDS`, `SIZE`, ..., each with the bounds of what a machine can have), and the
composers (`opt`, `list_of`, `pair`, `row`, `dict_of`, `one_of`, `Shape`; `then` and `also` for what is
made of a field once read, and a rule across fields), which keep their parts, so that a declaration
can be walked field by field (tests/schema_walk.py).

The same declaration writes what it reads (`write`): a dataclass made by `Shape.into` is written field
by field in the declared order, a `then` through its `back`, a field declared `since(...)` left out
while it holds its default. So the recording has one codec, not a writer beside each reader.
"""
from __future__ import annotations

import math
from typing import Any, Callable

from ..errors import BadReportError
from ..units import MAX_SIZE_BYTES as MAX_BYTES

# Bounds on numbers from files, so that nothing absurd reaches the arithmetic and the formatting
# (10**400 bytes overflowed format_bytes). Every count and step this tool writes fits in 64 bits; no
# GPU or host holds an exbibyte (MAX_BYTES); rates and other figures stay far below 1e18.
MAX_INT = (1 << 63) - 1
MAX_NUMBER = 1e18
# A process ID: PIDs are below /proc/sys/kernel/pid_max, which Linux caps at PID_MAX_LIMIT, 2**22 on 64
# bits (2**22 itself is then no process's: tests use it as such).
MAX_PID = 1 << 22
# Seconds: a time in a run (from its start), a duration, or a wall-clock time (seconds since 1970,
# 1.7e9 now): 10**10 s is 317 years, longer than any run and later than any clock (2286).
MAX_SECONDS = 1e10
# An exit status (0 to 255) and the number of the signal that ended a process (its shell status,
# 128 + N, fits in a byte).
MAX_EXIT_CODE = 255
MAX_SIGNAL = 127

Check = Callable[[Any, str], Any]


def _fail(what: str, value: Any, expected: str) -> BadReportError:
    return BadReportError(f"{what}: expected {expected}, found {type(value).__name__} {value!r:.60}")


# -- the types ------------------------------------------------------------------------------

def _whole(value: Any, least: int, most: int) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and least <= value <= most


def _seconds(value: Any, least: float) -> bool:
    # The range first: math.isfinite(10**400) raises OverflowError.
    return (not isinstance(value, bool) and isinstance(value, (int, float)) and least <= value <= MAX_SECONDS
            and math.isfinite(value))


def need_int(value: Any, what: str) -> int:
    if not _whole(value, -MAX_INT, MAX_INT):
        raise _fail(what, value, "an integer of at most 64 bits")
    return value


def need_count(value: Any, what: str) -> int:
    """A whole number of 0 or more (a count, a rank, a step)."""
    if not _whole(value, 0, MAX_INT):
        raise _fail(what, value, "a whole number of 0 or more")
    return value


def need_pid(value: Any, what: str) -> int:
    """A process ID, 0 (a container's first process's parent) to MAX_PID."""
    if not _whole(value, 0, MAX_PID):
        raise _fail(what, value, f"a process ID (a whole number, 0 to {MAX_PID})")
    return value


def need_exit_code(value: Any, what: str) -> int:
    if not _whole(value, 0, MAX_EXIT_CODE):
        raise _fail(what, value, f"an exit status (0 to {MAX_EXIT_CODE})")
    return value


def need_signal(value: Any, what: str) -> int:
    if not _whole(value, 1, MAX_SIGNAL):
        raise _fail(what, value, f"a signal number (1 to {MAX_SIGNAL})")
    return value


def need_num(value: Any, what: str) -> float:
    # The range first: math.isfinite(10**400) raises OverflowError.
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not -MAX_NUMBER <= value <= MAX_NUMBER
            or not math.isfinite(value)):
        raise _fail(what, value, "a finite number")
    return float(value)


def need_seconds(value: Any, what: str) -> float:
    """A time in seconds (from a run's start: a moment before it is negative), at most MAX_SECONDS either way."""
    if not _seconds(value, -MAX_SECONDS):
        raise _fail(what, value, f"a number of seconds (at most {MAX_SECONDS:g} either way)")
    return float(value)


def need_duration(value: Any, what: str) -> float:
    """How long something took, in seconds: 0 to MAX_SECONDS."""
    if not _seconds(value, 0):
        raise _fail(what, value, f"a duration in seconds (0 to {MAX_SECONDS:g})")
    return float(value)


def need_wall(value: Any, what: str) -> float:
    """A wall-clock time: seconds since 1970, 0 to MAX_SECONDS."""
    if not _seconds(value, 0):
        raise _fail(what, value, f"a time in seconds since 1970 (0 to {MAX_SECONDS:g})")
    return float(value)


def need_size(value: Any, what: str) -> int:
    """A size in bytes: an integer from 0 to MAX_BYTES (a negative size is no measurement)."""
    if not _whole(value, 0, MAX_BYTES):
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
# Each composer is a small class that keeps its parts (tests/test_schema.py makes objects from the
# declarations and damages one field at a time).

class Opt:
    """The check, or null."""

    def __init__(self, check: Check):
        self.check = check

    def __call__(self, value: Any, what: str) -> Any:
        return None if value is None else self.check(value, what)


class NullAs:
    """The check, or null read as the default (a fresh copy of a list or dict)."""

    def __init__(self, default: Any, check: Check):
        self.default, self.check = default, check

    def __call__(self, value: Any, what: str) -> Any:
        if value is None:
            return type(self.default)(self.default) if isinstance(self.default, (list, dict)) else self.default
        return self.check(value, what)


class ListOf:
    def __init__(self, check: Check):
        self.check = check

    def __call__(self, value: Any, what: str) -> list:
        return [self.check(x, what) for x in need_list(value, what)]


class Row:
    """A list whose items have a check each, in order; `least` of them must be there."""

    def __init__(self, checks: tuple, least: int, pair: bool = False):
        self.checks, self.least, self.pair = checks, least, pair

    def __call__(self, value: Any, what: str) -> list:
        if not isinstance(value, list) or not self.least <= len(value) <= len(self.checks):
            if self.pair:
                raise BadReportError(f"{what}: expected a pair [a, b], found {value!r:.60}")
            many = f"{self.least} to {len(self.checks)}" if self.least != len(self.checks) else str(self.least)
            raise BadReportError(f"{what}: expected a list of {many} items, found {value!r:.80}")
        return [c(v, what) for c, v in zip(self.checks, value)]


class DictOf:
    """An object whose keys and values each pass their check (keys are always strings in JSON)."""

    def __init__(self, key: Check, value: Check):
        self.key, self.value = key, value

    def __call__(self, obj: Any, what: str) -> dict:
        return {self.key(k, what): self.value(v, f"{what} {k!r:.20}") for k, v in need_dict(obj, what).items()}


class OneOf:
    def __init__(self, allowed: tuple):
        self.allowed = allowed

    def __call__(self, value: Any, what: str) -> Any:
        if isinstance(value, (dict, list)) or value not in self.allowed:
            raise BadReportError(f"{what}: {value!r:.40} is not one of {', '.join(map(str, self.allowed))}")
        return value


class Then:
    """The check, then what the program keeps made of its result (`into`: a dataclass; a series as
    a dict by its key); `back` turns what was made into what the check reads again (`write`)."""

    def __init__(self, check: Check, make: Callable[[Any], Any], back: Callable[[Any], Any] | None = None):
        self.check, self.make, self.back = check, make, back

    def __call__(self, value: Any, what: str) -> Any:
        return self.make(self.check(value, what))


class Also:
    """The check, then a rule over what it read (`rule(result, what)` raises where it is broken: an
    out-of-memory error must have its bytes, one way or the other)."""

    def __init__(self, check: Check, rule: Callable[[Any, str], None]):
        self.check, self.rule = check, rule

    def __call__(self, value: Any, what: str) -> Any:
        result = self.check(value, what)
        self.rule(result, what)
        return result


def opt(check: Check) -> Opt:
    return Opt(check)


def null_as(default: Any, check: Check) -> NullAs:
    return NullAs(default, check)


def list_of(check: Check) -> ListOf:
    return ListOf(check)


def pair(first: Check, second: Check) -> Row:
    return Row((first, second), 2, pair=True)


def row(*checks: Check, least: int | None = None) -> Row:
    """A list whose items have a check each, in order; `least` of them must be there (all by default)."""
    return Row(checks, len(checks) if least is None else least)


def dict_of(key: Check, value: Check) -> DictOf:
    return DictOf(key, value)


def one_of(*allowed: Any) -> OneOf:
    return OneOf(allowed)


def then(check: Check, make: Callable[[Any], Any], back: Callable[[Any], Any] | None = None) -> Then:
    return Then(check, make, back)


def also(check: Check, rule: Callable[[Any, str], None]) -> Also:
    return Also(check, rule)


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


class Since(Absent):
    """A field added by a later version: read as `absent`, and written only where it holds more than
    its default, so that a file of an older version reads back and is written again as it was."""


def since(check: Check, default: Any) -> Since:
    return Since(check, default)


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

    def into(self, cls: type) -> Into:
        """A check that parses the object and makes `cls(**fields)` of it."""
        return Into(self, cls)


class Into(Then):
    """A shape read into a dataclass (`Shape.into`); written back from the dataclass's fields."""

    def __init__(self, shape: Shape, cls: type):
        super().__init__(shape, lambda fields: cls(**fields))
        self.cls = cls
        self._plan: list | None = None

    def plan(self) -> list:
        """Each field as `write` goes over it: its key, the attribute, its declaration, and the check
        to write it by (None where the value is written as it is)."""
        if self._plan is None:
            shape = self.check
            self._plan = []
            for key, field in shape.fields.items():
                inner = field.check if isinstance(field, Absent) else field
                self._plan.append((key, shape.rename.get(key, key), field, None if _plain(inner) else inner))
        return self._plan


def write(check: Check, value: Any) -> Any:
    """What `check` reads, made from what it returned (`value`): the one writer of the declarations.
    A part that reads JSON into JSON (a record of plain dicts and lists) is written as it is."""
    if value is None or _plain(check):
        return value
    if isinstance(check, Into):
        out = {}
        for key, name, field, inner in check.plan():
            item = getattr(value, name)
            if not _left_out(field, item):
                out[key] = item if inner is None else write(inner, item)
        return out
    if isinstance(check, Then):
        return write(check.check, value if check.back is None else check.back(value))
    if isinstance(check, (Opt, NullAs, Also)):
        return write(check.check, value)
    if isinstance(check, ListOf):
        return [write(check.check, item) for item in value]
    if isinstance(check, Row):
        return [write(c, item) for c, item in zip(check.checks, value)]
    if isinstance(check, DictOf):
        return {(str(k) if check.key is need_int_key else k): write(check.value, v) for k, v in value.items()}
    if isinstance(check, Shape):  # a dict: its own order, each declared field by its check
        out = {}
        for key, item in value.items():
            c = check.fields.get(key)
            if c is None:
                out[key] = item if check.rest is None else write(check.rest, item)
            elif not _left_out(c, item):
                out[key] = write(c.check if isinstance(c, Absent) else c, item)
        return out
    return value


def _left_out(check: Check | Absent, value: Any) -> bool:
    return isinstance(check, Since) and value == check.value()


_PLAIN: dict[int, bool] = {}


def _plain(check: Any) -> bool:
    """Whether `check` reads JSON into the same JSON (nothing made of it, no key turned into a number,
    no field left out when written): then `write` keeps the value, as it is, without a copy."""
    known = _PLAIN.get(id(check))
    if known is None:
        _PLAIN[id(check)] = True  # a declaration met again below itself
        if isinstance(check, (Then, Since)) or (isinstance(check, DictOf) and check.key is need_int_key):
            known = False
        elif isinstance(check, Shape):
            known = all(_plain(c) for c in check.fields.values()) and (check.rest is None or _plain(check.rest))
            known = known and not check.rename
        elif isinstance(check, DictOf):
            known = _plain(check.value)
        elif isinstance(check, (Opt, NullAs, ListOf, Also, Absent)):
            known = _plain(check.check)
        elif isinstance(check, Row):
            known = all(_plain(c) for c in check.checks)
        else:
            known = True
        _PLAIN[id(check)] = known
    return known


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
PID, SECONDS, DURATION, WALL, EXIT_CODE, SIGNAL = (need_pid, need_seconds, need_duration, need_wall, need_exit_code,
                                                   need_signal)
