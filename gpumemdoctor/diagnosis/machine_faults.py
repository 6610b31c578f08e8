"""What the machine did to a run: a target killed for host memory, NVML that failed. Pure.

Neither is a fault of the program's GPU memory, and neither stops the diagnosis: the
report says what happened, from when, and judges on what was measured.
"""
from __future__ import annotations

import signal

from .judgement import Judged
from .remedies import FINDINGS
from .summaries import tell
from ..recording.recording import Recording
from ..units import MIB

HOST_RISE_BYTES = 64 * MIB  # the least rise of the target's RSS that counts as "rising"
NEAR_PEAK = 0.9  # the last reading within this share of the peak: still rising, or at its top
CURVE_POINTS = 48  # points of the host memory curve kept in the finding


def host_memory(rec: Recording) -> Judged | None:
    """A target ended by SIGKILL while its host memory rose: the kernel's out-of-memory killer,
    most likely (certainly, when the memory cgroup counted a kill during the run)."""
    if rec.target.get("signal") != signal.SIGKILL:
        return None
    points = [(t, rss) for t, rss, _ in rec.host_rss if rss]
    kills = rec.target.get("cgroup_oom_kills")
    if not points:
        if not kills:
            return None
        return Judged(
            kind="host-memory", bytes=0,
            summary=tell("host-memory-cgroup", kills=kills),
            evidence={"signal": int(signal.SIGKILL), "cgroup_oom_kills": kills, "curve": []},
            remedy=FINDINGS["host-memory"])
    start_t, start = points[0]
    last_t, last = points[-1]
    peak_t, peak = max(points, key=lambda p: p[1])
    # Rising at the end: over the second half of the run, not since the interpreter started
    # (a steady job killed with kill -9 grew too, when it imported its libraries).
    ref_t, ref = next(p for p in points if p[0] >= start_t + (last_t - start_t) / 2)
    rose = last - ref >= max(HOST_RISE_BYTES, ref // 10) and last >= NEAR_PEAK * peak
    if not rose and not kills:
        return None
    tree_peak = max((tree for _, _, tree in rec.host_rss if tree), default=None)
    return Judged(
        kind="host-memory", bytes=last,
        summary=tell("host-memory", rose=rose, from_bytes=ref, last_bytes=last, over_s=last_t - ref_t, kills=kills),
        evidence={"signal": int(signal.SIGKILL), "start_bytes": start, "start_t": start_t,
                  "rise_from_bytes": ref, "rise_from_t": ref_t, "last_bytes": last, "last_t": last_t,
                  "peak_bytes": peak, "peak_t": peak_t, "tree_peak_bytes": tree_peak,
                  "cgroup_oom_kills": kills, "curve": curve(points)},
        remedy=FINDINGS["host-memory"])


def curve(points: list[tuple[float, int]], size: int = CURVE_POINTS) -> list[list]:
    """At most `size` points of a curve: the highest of each of `size` stretches, and the last."""
    if len(points) <= size:
        return [[t, v] for t, v in points]
    n = len(points)
    out = [max(points[i * n // size:(i + 1) * n // size], key=lambda p: p[1]) for i in range(size - 1)]
    out.append(points[-1])
    return [[t, v] for t, v in out]


def nvml_notes(rec: Recording) -> list[str]:
    """One sentence per NVML outage: from when, on which GPU, what it said, and what the
    judgement rests on instead."""
    return [tell("nvml-failed", device=f["device"], from_t=f["from_t"], to_t=f["to_t"], error=f["error"],
                 failed_calls=f["failed_calls"]) for f in rec.nvml_failures]
