"""The declarations of files/schema.py walked for the tests: every composer a declaration is made of, every
field it declares, values made from a declaration, and wrong values for each kind of field.

Test helpers only: the package reads files with the declarations, it never walks them.
"""
from __future__ import annotations

import random
from typing import Any, Callable, Iterator

from gpumemdoctor.files import schema
from gpumemdoctor.files.schema import Absent, Also, DictOf, ListOf, NullAs, OneOf, Opt, Row, Shape, Then

COMPOSERS = (Opt, NullAs, ListOf, Row, DictOf, OneOf, Then, Also, Shape)


def parts(check: Any) -> list[tuple[str, Any]]:
    """A composer's parts, each with where it sits ("pid", "[]", "[2]", "{}", "{key}"); none for a leaf."""
    if isinstance(check, Absent):
        return [("", check.check)]
    if isinstance(check, (Opt, NullAs, Then, Also)):
        return [("", check.check)]
    if isinstance(check, ListOf):
        return [("[]", check.check)]
    if isinstance(check, Row):
        return [(f"[{i}]", c) for i, c in enumerate(check.checks)]
    if isinstance(check, DictOf):
        return [("{key}", check.key), ("{}", check.value)]
    if isinstance(check, Shape):
        out = [(key, c) for key, c in check.fields.items()]
        return out + ([("*", check.rest)] if check.rest is not None else [])
    return []


def composers(root: Any) -> Iterator[Any]:
    """Every composer and Absent reachable from `root`, each once."""
    seen: set[int] = set()
    stack = [root]
    while stack:
        check = stack.pop()
        if id(check) in seen:
            continue
        seen.add(id(check))
        if isinstance(check, (*COMPOSERS, Absent)):
            yield check
        stack.extend(c for _, c in parts(check))


def leaves(root: Any, path: tuple = ()) -> Iterator[tuple[tuple, Any]]:
    """(path, leaf check) of every field a declaration names, depth first; a declaration met again
    below itself is not walked twice on one path."""
    def walk(check: Any, path: tuple, above: tuple) -> Iterator[tuple[tuple, Any]]:
        if id(check) in above:
            return
        inner = parts(check)
        if not inner or isinstance(check, OneOf):
            yield path, check
            return
        for where, sub in inner:
            yield from walk(sub, path + ((where,) if where else ()), above + (id(check),))
    yield from walk(root, path, ())


def located(check: Any, value: Any, path: tuple = (), general: tuple = (), name: str = "") -> Iterator[tuple]:
    """Each field of a document that `check` reads, as (its path in the document, its path in the
    declaration, its check, the name of the field it is in). An optional field is the optional check
    itself (null is no wrong value for it), but for an object or list that is there, whose own fields
    are then the fields."""
    if isinstance(check, Absent):
        check = check.check
    if isinstance(check, (Then, Also)):
        yield from located(check.check, value, path, general, name)
    elif isinstance(check, (Opt, NullAs)) and value is not None and parts(check.check) \
            and not isinstance(check.check, OneOf):
        yield from located(check.check, value, path, general, name)  # an optional object or list, there
    elif isinstance(check, Shape) and isinstance(value, dict):
        for key, sub in check.fields.items():
            if key in value:
                yield from located(sub, value[key], path + (key,), general + (key,), key)
    elif isinstance(check, ListOf) and isinstance(value, list):
        for i, item in enumerate(value):
            yield from located(check.check, item, path + (i,), general + ("[]",), name)
    elif isinstance(check, Row) and isinstance(value, list):
        for i, (sub, item) in enumerate(zip(check.checks, value)):
            yield from located(sub, item, path + (i,), general + (f"[{i}]",), name)
    elif isinstance(check, DictOf) and isinstance(value, dict):
        for key, item in value.items():
            yield from located(check.value, item, path + (key,), general + ("{}",), name)
    else:
        yield path, general, check, name


# -- values made from a declaration ----------------------------------------------------------
# Made with a random.Random that Hypothesis gives (st.randoms): one strategy for every declaration,
# rather than a tree of strategies per declaration that Hypothesis would keep for the whole session.

def _whole(least: int, most: int) -> Callable[[random.Random], int]:
    return lambda rnd: rnd.choice([least, most, rnd.randint(least, most), rnd.randint(least, min(most, least + 9))])


def _number(least: float, most: float) -> Callable[[random.Random], float]:
    return lambda rnd: rnd.choice([least, most, rnd.uniform(least, most), float(rnd.randint(0, 9))
                                   if least <= 0 <= most - 9 else least])


def _text(rnd: random.Random) -> str:
    return "".join(rnd.choice("ab_.:/ 0é\n[]") for _ in range(rnd.randint(0, 8)))


LEAF_VALUES: dict[Callable, Callable[[random.Random], Any]] = {
    schema.need_int: _whole(-schema.MAX_INT, schema.MAX_INT),
    schema.need_count: _whole(0, schema.MAX_INT),
    schema.need_pid: _whole(0, schema.MAX_PID),
    schema.need_exit_code: _whole(0, schema.MAX_EXIT_CODE),
    schema.need_signal: _whole(1, schema.MAX_SIGNAL),
    schema.need_num: _number(-schema.MAX_NUMBER, schema.MAX_NUMBER),
    schema.need_seconds: _number(-schema.MAX_SECONDS, schema.MAX_SECONDS),
    schema.need_duration: _number(0, schema.MAX_SECONDS),
    schema.need_wall: _number(0, schema.MAX_SECONDS),
    schema.need_size: _whole(0, schema.MAX_BYTES),
    schema.need_str: _text,
    schema.need_bool: lambda rnd: rnd.random() < 0.5,
    schema.need_dict: lambda rnd: {_text(rnd): rnd.randint(0, 9) for _ in range(rnd.randint(0, 2))},
    schema.need_int_key: lambda rnd: str(rnd.randint(0, 10 ** 6)),
    schema.anything: lambda rnd: rnd.choice([None, rnd.randint(0, 9), _text(rnd)]),
    schema.frame: lambda rnd: [_text(rnd), rnd.randint(0, 10 ** 5), _text(rnd)],
}


def make(check: Any, rnd: random.Random, depth: int = 0) -> Any:
    """A value that `check` reads, made from its declaration (lists and objects kept small)."""
    if isinstance(check, Absent):
        return make(check.check, rnd, depth)
    if isinstance(check, (Opt, NullAs)):
        return None if rnd.random() < 0.3 else make(check.check, rnd, depth)
    if isinstance(check, (Then, Also)):
        return make(check.check, rnd, depth)
    if isinstance(check, OneOf):
        return rnd.choice(check.allowed)
    items = 0 if depth > 6 else rnd.randint(0, 2)
    if isinstance(check, ListOf):
        return [make(check.check, rnd, depth + 1) for _ in range(items)]
    if isinstance(check, Row):
        return [make(c, rnd, depth + 1) for c in check.checks]
    if isinstance(check, DictOf):
        return {make(check.key, rnd, depth + 1): make(check.value, rnd, depth + 1) for _ in range(items)}
    if isinstance(check, Shape):
        return {key: make(c, rnd, depth + 1) for key, c in check.fields.items()}
    if check in LEAF_VALUES:
        return LEAF_VALUES[check](rnd)
    raise LookupError(f"no values declared for {check!r}")


# -- wrong values, by the kind of field --------------------------------------------------------

_NOT_A_NUMBER = ["12", None, [], {}, True]
WRONG: dict[Callable, list] = {
    schema.need_int: [*_NOT_A_NUMBER, 1.5, 2 ** 64, -(2 ** 64)],
    schema.need_count: [*_NOT_A_NUMBER, 1.5, -1, 2 ** 64],
    schema.need_pid: [*_NOT_A_NUMBER, 1.5, -1, schema.MAX_PID + 1, 2 ** 70],
    schema.need_exit_code: [*_NOT_A_NUMBER, -1, 256, 1.0],
    schema.need_signal: [*_NOT_A_NUMBER, 0, 128, 9.0],
    schema.need_num: [*_NOT_A_NUMBER, 1e19, -1e19, 10 ** 400, 1e308],
    schema.need_seconds: [*_NOT_A_NUMBER, 1e11, -1e11, 1e19, 1e308, 10 ** 400],
    schema.need_duration: [*_NOT_A_NUMBER, -1.0, 1e19, 1e308],
    schema.need_wall: [*_NOT_A_NUMBER, -1.0, 1e19, 1e308],
    schema.need_size: [*_NOT_A_NUMBER, -1, 1.5, 2 ** 61, 10 ** 400],
    schema.need_str: [1, None, [], {}, True],
    schema.need_bool: [1, 0, "true", None, []],
    schema.need_dict: [[], "x", 1, None],
    schema.frame: [["f.py", 1], ["f.py", "1", "g"], "f.py:1", None],
    schema.need_int_key: [],  # a key: refused as a key (a field's name), not as a value
    schema.anything: [],  # data kept as it is: nothing is wrong for it
}


def wrong_values(check: Any) -> list:
    """Values that `check` refuses: a leaf's (WRONG), a one_of's, a composer's (what is not a list or
    an object at all), an opt's but null."""
    if isinstance(check, Absent):
        return wrong_values(check.check)
    if isinstance(check, (Opt, NullAs)):
        return [v for v in wrong_values(check.check) if v is not None]
    if isinstance(check, (Then, Also)):
        return wrong_values(check.check)
    if isinstance(check, OneOf):
        return [v for v in ("no-such-value", 12345, None, []) if v not in check.allowed]
    if isinstance(check, (Shape, DictOf)):
        return ["x", 1, [], None]
    if isinstance(check, (ListOf, Row)):
        return ["x", 1, {}, None]
    return list(WRONG.get(check, []))


def refuses(check: Any, value: Any) -> bool:
    try:
        check(value, "x")
    except schema.BadReportError:
        return True
    return False


# -- reads of what no declaration names ---------------------------------------------------------

class Traced(dict):
    """An object read from a file that notes each key read from it (`[key]`, `get`, `in`) that its
    declaration does not name: data kept as it is (`rest=ANY`, `anything`, `need_dict`) that some code
    then reads as a field. Copying it, iterating it or dumping it as JSON reads no field."""

    def __init__(self, data: dict, declared: set, where: str, reads: set):
        super().__init__(data)
        self.declared, self.where, self.reads = declared, where, reads

    def _read(self, key: Any) -> None:
        if key not in self.declared:
            self.reads.add((self.where, key))

    def __getitem__(self, key):
        self._read(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        self._read(key)
        return super().get(key, default)

    def __contains__(self, key) -> bool:
        self._read(key)
        return super().__contains__(key)


def undeclared(value: Any, where: str, reads: set) -> Any:
    """`value`, every object in it Traced with nothing declared."""
    if isinstance(value, dict) and not isinstance(value, Traced):
        return Traced({k: undeclared(v, f"{where} {k}", reads) for k, v in value.items()}, set(), where, reads)
    if isinstance(value, list):
        return [undeclared(v, where, reads) for v in value]
    return value


def trace_reads(monkeypatch, root: Any) -> set:
    """From now on (for the test), what `root`'s declarations read keeps undeclared data Traced: the
    set returned fills with (where, key) for each read of a field that no declaration names."""
    reads: set = set()
    parse = Shape.__call__

    def traced_shape(self, value, what):
        out = parse(self, value, what)
        if self.rest is None:
            return out
        declared = {self.rename.get(k, k) for k in self.fields}
        return Traced({k: v if k in declared else undeclared(v, f"{what} {k}", reads) for k, v in out.items()},
                      declared, what, reads)

    def traced_leaf(leaf):
        return lambda value, what: undeclared(leaf(value, what), what, reads)

    monkeypatch.setattr(Shape, "__call__", traced_shape)
    kept_as_data = (schema.anything, schema.need_dict)
    for c in composers(root):
        for attr in ("check", "value", "rest"):
            if getattr(c, attr, None) in kept_as_data:
                monkeypatch.setattr(c, attr, traced_leaf(getattr(c, attr)))
        if isinstance(c, Row) and any(x in kept_as_data for x in c.checks):
            monkeypatch.setattr(c, "checks", tuple(traced_leaf(x) if x in kept_as_data else x for x in c.checks))
        if isinstance(c, Shape):
            for key, sub in c.fields.items():
                if sub in kept_as_data:
                    monkeypatch.setitem(c.fields, key, traced_leaf(sub))
    return reads
