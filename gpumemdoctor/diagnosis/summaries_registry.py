"""The registry the findings' summaries share (summaries.py and its families, summaries_*.py). Pure.

Each sentence is a function registered under its name, whose keyword arguments are the facts it is
made of; `tell(name, **facts)` makes it (a missing or unknown fact is a TypeError, never a guess).
Import `tell` from summaries.py: it loads every family, so that every name is registered.
"""
from __future__ import annotations

from typing import Callable

SUMMARIES: dict[str, Callable[..., str]] = {}


def tell(name: str, **facts) -> str:
    """The summary `name`, in words, from its facts."""
    return SUMMARIES[name](**facts)


def summary(name: str):
    """Registers the function it decorates as the summary `name`."""
    def register(fn: Callable[..., str]) -> Callable[..., str]:
        if name in SUMMARIES:
            raise ValueError(f"summary {name!r} registered twice")
        SUMMARIES[name] = fn
        return fn
    return register
