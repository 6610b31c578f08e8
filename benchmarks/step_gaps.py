"""The pause the program feels, plain against under the tool (issue 57), on real-library loops.

    python benchmarks/step_gaps.py [--pairs 3] [--only NAME ...] [--also OPTIONS ...] [--step-times DIR]
                                   [--keep DIR] [--out PATH] [--raw PATH]

Runs corpus.py's interleaved pairs (plain, tool, plain, tool, ...) over four workloads of corpus/
(two Lightning loops, one that keeps its step outputs and one clean; transformers GPT-2 124M with
AdamW; timm ResNet-50 with an EMA) and writes one row a pair:

    {"workload", "pair", "plain_worst_gap_s", "tool_worst_gap_s", "tool_reported_pause_s",
     "tool_reported_between", "tool_reported_collection_s", "tool_reported_agent_s",
     "tool_reported_agent_parts", "tool_reported_end_gap_s", "tool_reported_start_gap_s", "added_s",
     "reported_minus_seen_s", "plain_step_s", "tool_step_s", "step_added_s"}

`*_step_s` is the median step of the same run (STEP_TIME_MS): a worst gap that grows with every step
(a cost paid in each step, not a pause in one gap) shows there. With --also "OPTIONS" each pair
has one more tool run with those options (corpus.py's --also, e.g. "--trace off"), and its row
carries "tool_mode": the options. --step-times DIR keeps every run's step times, --keep DIR each tool
run's report (corpus.py's).

`*_worst_gap_s` is the longest time between two step ends after the first five steps, as a callback
of the program stamps it (corpus/_common.py's STEP_GAP_MAX_MS); `tool_reported_pause_s` is the
report's own figure for the same thing, the one its note leads with (diagnosis/step_gaps.py): the
longest gap between two steps' starts where the agent read them (`tool_reported_between`), else
between two optimizer steps' ends (_agent/readings/felt.py), with the collections' and the agent's
seconds inside that gap, and the agent's split by its part. Bounds (issue 57): the tool adds at most
2 ms to the worst gap (`added_s`, against the same pair's plain run) and its figure is within 5 ms of
the program's (`reported_minus_seen_s`). --out defaults to benchmarks/results/<date>-<gpu>-step-gaps.json;
--raw keeps corpus.py's whole JSON (wall split, exit costs). Needs a CUDA GPU; prints a line and
exits 0 without one.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import corpus  # noqa: E402

WORKLOADS = ["lightning_kept_step_outputs", "lightning_clean", "hf_gpt2_124m_adamw", "timm_resnet50_ema"]
ADDED_BOUND_S = 0.002
AGREE_BOUND_S = 0.005
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def rows(raw: dict) -> list[dict]:
    """One row a pair and tool mode ("tool", then each --also's), from corpus.py's JSON. Each row also
    carries `plain_spread_s`: how far its workload's plain runs' worst gaps lie apart (the longest less
    the shortest, every plain run of the call): what one pair's `added_s` would be with no tool at all."""
    out = []
    for name, workload in raw["workloads"].items():
        runs = workload["runs"]
        plains = [r["gap_max_ms"] for r in runs if r["mode"] == "plain" and r.get("gap_max_ms") is not None]
        spread = round((max(plains) - min(plains)) / 1000, 6) if len(plains) > 1 else None
        first = len(out)
        modes = list(dict.fromkeys(r["mode"] for r in runs if r["mode"] != "plain"))
        for pair in sorted({r["pair"] for r in runs}):
            plain = next((r for r in runs if r["pair"] == pair and r["mode"] == "plain"), None)
            for mode in modes:
                tool = next((r for r in runs if r["pair"] == pair and r["mode"] == mode), None)
                if plain is not None and tool is not None:
                    out.append(_row(name, pair, plain, tool, mode))
        for row in out[first:]:
            row["plain_spread_s"] = spread
    return out


def _row(name: str, pair: int, plain: dict, tool: dict, mode: str) -> dict:
    gaps = tool.get("step_gaps") or {}
    # What the report leads with (diagnosis/step_gaps.py): the starts' gap where it was read.
    starts = gaps.get("step_start_gap_agent_s") is not None
    kind = "step_start_gap" if starts else "step_gap"
    reported = gaps.get(f"{kind}_max_s")
    seen = tool["gap_max_ms"] / 1000
    row = {"workload": name, "pair": pair + 1, "plain_worst_gap_s": round(plain["gap_max_ms"] / 1000, 6),
           "tool_worst_gap_s": round(seen, 6), "tool_reported_pause_s": reported,
           "tool_reported_between": "starts" if starts else "ends",
           "tool_reported_collection_s": gaps.get(f"{kind}_collection_s"),
           "tool_reported_agent_s": gaps.get(f"{kind}_agent_s"),
           "tool_reported_agent_parts": gaps.get(f"{kind}_agent_parts"),
           "tool_reported_end_gap_s": gaps.get("step_gap_max_s"),
           "tool_reported_start_gap_s": gaps.get("step_start_gap_max_s"),
           "added_s": round(seen - plain["gap_max_ms"] / 1000, 6),
           "reported_minus_seen_s": None if reported is None else round(reported - seen, 6)}
    steps = plain.get("step_time_ms"), tool.get("step_time_ms")
    if None not in steps:
        row.update({"plain_step_s": round(steps[0] / 1000, 6), "tool_step_s": round(steps[1] / 1000, 6),
                    "step_added_s": round((steps[1] - steps[0]) / 1000, 6)})
    if mode != "tool":
        row["tool_mode"] = mode[len("tool "):]
    return row


def _parts(row: dict) -> str:
    parts = sorted((row.get("tool_reported_agent_parts") or {}).items(), key=lambda kv: -kv[1])[:3]
    return ", ".join(f"{name} {s * 1000:.1f}" for name, s in parts)


def within(row: dict) -> bool:
    agree = row["reported_minus_seen_s"]
    return row["added_s"] <= ADDED_BOUND_S and agree is not None and abs(agree) <= AGREE_BOUND_S


def write_rows(path: str, table: list[dict]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(table, f, indent=1)
        f.write("\n")


def print_table(table: list[dict]) -> None:
    print(f"\n{'workload':28s} pair  plain ms   tool ms  reported ms  in it: gc ms, agent ms  added ms  "
          "step+ ms  ok  the agent's largest parts in it")
    for r in table:
        rep = r["tool_reported_pause_s"]
        step = r.get("step_added_s")
        label = r["workload"] + (f" ({r['tool_mode']})" if "tool_mode" in r else "")
        print(f"{label:28s} {r['pair']:4d} {r['plain_worst_gap_s'] * 1000:9.1f} {r['tool_worst_gap_s'] * 1000:9.1f}"
              f" {'-' if rep is None else f'{rep * 1000:12.1f}'}"
              f"  {(r['tool_reported_collection_s'] or 0) * 1000:9.1f}, {(r['tool_reported_agent_s'] or 0) * 1000:8.1f}"
              f"  {r['added_s'] * 1000:+8.1f}  {'-' if step is None else f'{step * 1000:+8.2f}':>8s}"
              f"  {'yes' if within(r) else 'NO ':3s} {_parts(r)}")
    spreads = {r["workload"]: r.get("plain_spread_s") for r in table}
    for name, spread in spreads.items():
        if spread is not None:
            print(f"{name}: its plain runs' worst gaps lie {spread * 1000:.1f} ms apart (no tool in either)")


def profile(times_dir: str) -> list[str]:
    """Where in the loop each run's steps were slow: the median step in the agent's start-up windows
    (allocation stacks for the first STARTUP_STEPS steps, a sample at every step for the first
    EVERY_STEP_UNTIL) and after them, and the longest steps, from --step-times files (which start after
    the corpus's warm-up steps)."""
    import statistics

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, root)
    from gpumemdoctor._agent.readings.sampler import EVERY_STEP_UNTIL
    from gpumemdoctor._agent.readings.trace import STARTUP_STEPS

    sys.path.insert(0, os.path.join(root, "corpus"))
    from _common import WARMUP_STEPS

    stacks, every = STARTUP_STEPS - WARMUP_STEPS, EVERY_STEP_UNTIL - WARMUP_STEPS
    lines = [f"median step (ms) in steps {WARMUP_STEPS}-{STARTUP_STEPS} (under the tool: stacks and a sample a step), "
             f"{STARTUP_STEPS}-{EVERY_STEP_UNTIL} (a sample a step), after {EVERY_STEP_UNTIL}; the four longest (step, ms)"]
    for name in sorted(os.listdir(times_dir)):
        with open(os.path.join(times_dir, name), encoding="utf-8") as f:
            v = [float(x) for x in f if x.strip()]
        if len(v) <= every:
            continue
        longest = sorted(range(len(v)), key=lambda i: -v[i])[:4]
        lines.append(f"{name[:-4]:<42} {statistics.median(v[:stacks]):6.2f} {statistics.median(v[stacks:every]):6.2f} "
                     f"{statistics.median(v[every:]):6.2f}  {[(i + WARMUP_STEPS, round(v[i], 1)) for i in longest]}")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--only", action="append", choices=WORKLOADS)
    p.add_argument("--also", action="append", default=[], metavar="OPTIONS",
                   help='one more tool run a pair, with these options of `run` (e.g. "--trace off")')
    p.add_argument("--step-times", metavar="DIR", help="keep every run's step times here (corpus.py's)")
    p.add_argument("--keep", metavar="DIR", help="keep each tool run's report here (corpus.py's): its peak "
                   "probes' and readings' costs")
    p.add_argument("--out", metavar="PATH")
    p.add_argument("--raw", metavar="PATH")
    p.add_argument("--from-raw", nargs="+", metavar="RAW", help="run nothing: the rows and the table made again "
                   "from these saved --raw files (a call cut short keeps the runs it finished), written to --out")
    p.add_argument("--times-profile", metavar="DIR", help="run nothing: where in the loop each run of these "
                   "--step-times files was slow (the agent's start-up windows against after them)")
    args = p.parse_args(argv)
    if args.times_profile:
        print("\n".join(profile(args.times_profile)))
        return 0
    if args.from_raw:
        table = []
        for path in args.from_raw:
            with open(path, encoding="utf-8") as f:
                table.extend(rows(json.load(f)))
        if args.out:
            write_rows(args.out, table)
        print_table(table)
        return 0
    raw_path = args.raw or os.path.join(tempfile.mkdtemp(prefix="gpumemdoctor-gaps-"), "corpus.json")
    only = [a for name in (args.only or WORKLOADS) for a in ("--only", name)]
    also = [a for extra in args.also for a in ("--also", extra)]
    times = ["--step-times", args.step_times] if args.step_times else []
    keep = ["--keep", args.keep] if args.keep else []
    status = corpus.main(["--repeats", str(args.pairs), *only, *also, *times, *keep, "--json", raw_path])
    if not os.path.exists(raw_path):
        return status  # (no GPU: corpus.py said so)
    with open(raw_path, encoding="utf-8") as f:
        raw = json.load(f)
    table = rows(raw)
    gpu = re.sub(r"[^a-z0-9]+", "-", (raw["meta"].get("device") or "gpu").lower()).strip("-")
    gpu = next((g for g in ("h100", "h200", "a100") if g in gpu), gpu)
    out = args.out or os.path.join(RESULTS, f"{time.strftime('%Y-%m-%d')}-{gpu}-step-gaps.json")
    write_rows(out, table)
    print_table(table)
    print(f"rows: {out}")
    return status


if __name__ == "__main__":
    sys.exit(main())
