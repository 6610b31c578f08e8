"""The words of the pytest plugin's vram_limit failure for what filled the test's peak: the split at
the peak itself from PyTorch's allocation events (_agent/peak/plugin_history.py), in the parts' labels
and the CI gate's list (`parts_text`), the largest first (those under 1 MiB counted at the end);
where the events did not reach back to the peak, why, and the words the plugin had before them
(the parts read at the last optimizer step).
"""
from __future__ import annotations

from ..contract import HISTORY_PARTS
from ..diagnosis.words import PHASES
from .ci_checks import MIN_PART_SAID, parts_text


def what_filled(found: dict | None, fallback: str) -> str:
    """`found`: plugin_history's split (replay.replay's record), {"error": why}, or None where no
    events were kept (then `fallback` alone, the plugin's words before the events were read)."""
    if found is None:
        return fallback
    if "error" in found:
        return f"PyTorch's allocation events did not split it ({found['error']}). {fallback}".strip()
    if not found["complete"]:
        full = f": they kept only the last {found['events']:,}" if found["ring_full"] else ""
        return f"PyTorch's allocation events did not reach back to the peak{full}. {fallback}".strip()
    parts = sorted(((name, p["bytes"]) for name, p in found["parts"].items() if p["bytes"] > 0),
                   key=lambda part: (-part[1], HISTORY_PARTS.index(part[0])))  # (equal ones in the parts' order)
    named = sum(size >= MIN_PART_SAID for _, size in parts) or 1  # the rest: "and 2 more (96.0 KiB)"
    text = f"What filled it, at the peak itself, which came {PHASES[found['phase']]}: {parts_text(parts, named)}."
    if found["ring_full"]:
        text += (f" PyTorch's allocation events kept only the last {found['events']:,}: what was made before "
                 "them is told by the optimizers' storages only, the rest kept tensors or unclassified.")
    return text
