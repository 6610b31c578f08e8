"""How much the HTML report weighs: for recorded fixtures, and for a one-hour run synthesised from one.

No GPU ran for an hour to make this. The one-hour run is a recorded fixture stretched: every agent's
samples are repeated, in the recorded order, on the agent's own schedule for an hour (the interval
starts at 0.02 s and doubles every 1000 samples, up to 5 s: about 7,400 samples), with a step at each
sample; and every NVML series is repeated so that its figure changes at every 5 ms poll for the whole
hour (720,000 points, more than any real run records, since the supervisor keeps a point only where
the figure changed). The findings and suspects are the fixture's own.

    python benchmarks/html_size.py [FIXTURE ...]
"""
from __future__ import annotations

import copy
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "reports"
ONE_HOUR_S = 3600.0
POLL_S = 0.005
FIRST_INTERVAL_S, MAX_INTERVAL_S, SAMPLES_PER_DOUBLING = 0.02, 5.0, 1000  # as in gpumemdoctor/_agent/startup.py and sampler.py


def one_hour(report: dict, duration_s: float = ONE_HOUR_S, poll_s: float = POLL_S) -> dict:
    """A copy of `report` whose recording lasts `duration_s`, its series repeated (see above); each
    NVML figure changes every `poll_s`."""
    report = copy.deepcopy(report)
    rec = report["recording"]
    for agent in rec["agents"]:
        source = agent["samples"]
        if not source:
            continue
        samples, t, interval, step = [], source[0]["t"], FIRST_INTERVAL_S, 0
        while t < duration_s:
            recorded = source[len(samples) % len(source)]
            samples.append({**recorded, "t": round(t, 6), "by": "step", "step": step})
            step += 1
            if len(samples) % SAMPLES_PER_DOUBLING == 0:
                interval = min(interval * 2, MAX_INTERVAL_S)
            t += interval
        agent["samples"], agent["steps"] = samples, step
    for series in rec["nvml"]:
        values = [v for _, v in series["points"]]
        if not values:
            continue
        start = series["points"][0][0]
        polls = int((duration_s - start) / poll_s)
        points, last = [], None
        for k in range(polls):
            value = values[k % len(values)]
            if value == last:  # keep the figure changing at every poll, as the worst case
                value += 1
            points.append([round(start + k * poll_s, 6), value])
            last = value
        series["points"] = points
    rec["duration_s"] = duration_s
    report["target"]["duration_s"] = duration_s
    report["timeline"] = []  # the HTML page draws the recording, not this flattened copy
    return report


def weigh(report: dict, name: str) -> dict:
    """Render the page for `report` and return its figures."""
    from gpumemdoctor.app.report_file import parse
    from gpumemdoctor.reporters import html

    recording, diagnosis = parse(report)
    started = time.perf_counter()
    page = html.render(recording, diagnosis, name)
    return {"report": name, "html_bytes": len(page.encode()), "render_s": round(time.perf_counter() - started, 2),
            "samples": sum(len(a.samples) for a in recording.agents),
            "nvml_points": sum(len(p) for p in recording.nvml.values()),
            "duration_s": round(recording.duration_s, 1)}


def main(names: list[str]) -> None:
    from gpumemdoctor.reporters import html

    print(f"embedded plotly.js (gzip, base64): {len(html._plotly_js())} bytes")
    for name in names or ["leak_training_list", "dataloader_worker_contexts"]:
        report = json.loads((FIXTURES / f"{name}.json").read_text())
        for label, r in ((name, report), (f"{name}, stretched to one hour", one_hour(report))):
            print(json.dumps(weigh(r, label)))


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main(sys.argv[1:])
