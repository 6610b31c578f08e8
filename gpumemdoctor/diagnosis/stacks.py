"""Allocating stacks for suspects: the line of a program that lives among installed packages, and
the stack of a tensor that replaces itself. Pure."""
from __future__ import annotations


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
            if other["frames"] and other["device"] in (torch_index, None) and other["count"] == 1 \
                    and [h["path"] for h in other["holders"]] == [path]:
                return {**group, "frames": other["frames"],
                        "stack_from": {"when": found["when"], "step": found["step"], "t": found["t"]}}
    return group
