"""A search's groups and their allocating stacks, read for suspects: whether a group counts on a
device, the program's own line in a stack (also for a program that lives among installed packages)
and how it is written, and the stack of a tensor that replaces itself. Pure."""
from __future__ import annotations

import os


def on_device(group: dict, torch_index: int, new: bool | None = None) -> bool:
    """Whether a search's group counts on this device (one without a device counts on every one);
    `new`: only groups new since the baseline (True), or only those that are not (False)."""
    return (group["device"] in (torch_index, None)
            and (new is None or (group["new"] is not False) is new))


def user_line(stack: list) -> list | None:
    """The innermost frame of the program's own code; else (a program that lives among installed
    packages) the innermost outside the standard library; else the innermost frame."""
    for frame in stack:
        if not _library(frame[0]):
            return frame
    return outside_stdlib(stack)


def at(frame: list) -> str:
    """A frame as the report writes it: `train.py:12 in step()`."""
    return f"{os.path.basename(frame[0])}:{frame[1]} in {frame[2]}()"


def _library(filename: str) -> bool:
    return ("site-packages" in filename or "dist-packages" in filename or filename.startswith("<")
            or "/lib/python3" in filename)


def outside_stdlib(stack: list) -> list | None:
    """Where no frame is outside the standard library and installed packages (a program that lives
    among installed packages): the innermost frame outside the standard library, else the innermost."""
    return next((f for f in stack if not _stdlib(f[0])), stack[0] if stack else None)


def _stdlib(filename: str) -> bool:
    return filename.startswith("<") or ("/lib/python3" in filename and "site-packages" not in filename
                                        and "dist-packages" not in filename)


def latest_stack(group: dict, root: dict, torch_index: int) -> dict:
    """A tensor that replaces itself (`buf = torch.cat([buf, x])`) is one block, allocated anew at
    every step, and the search that names it can come after the allocation history stopped: it
    gets the stack of its latest allocation recorded, the same holder's one block in the latest
    search that has a stack for it (`stack_from` says which search)."""
    if group["count"] != 1 or len(group["holders"]) != 1:
        return group
    path = group["holders"][0]["path"]
    for found in sorted(root["investigations"], key=lambda i: -i["t"]):
        for other in found["groups"]:
            if other["frames"] and on_device(other, torch_index) and other["count"] == 1 \
                    and [h["path"] for h in other["holders"]] == [path]:
                return {**group, "frames": other["frames"],
                        "stack_from": {"when": found["when"], "step": found["step"], "t": found["t"]}}
    return group
