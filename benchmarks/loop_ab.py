"""What `gpumemdoctor run` costs a training loop, measured inside one process (A/B blocks).

    python benchmarks/loop_ab.py [--only short|realistic] [--rounds 1] [--blocks 200]
        [--short-steps 100] [--realistic-steps 100] [--parts all|agent|supervisor]
        [--skip-plain] [--json PATH] [--check]
    python benchmarks/loop_ab.py --summarise JSON [JSON ...]

overhead.py compares separate processes, and on the lent machines a loop of 1 ms steps varies
by up to a third between two plain processes (pairs from 0.81 to 1.19): no 5% bound can be read
from that. Here each workload runs once under the tool with `--ab BLOCKSxSTEPS`: after 300
untimed steps it times blocks of steps with everything the tool does switched off and on by turns
(benchmarks/_switch.py: the agent's step hook, its sampling thread and collector callback, and
the supervisor, stopped with SIGSTOP), in the order on, off, off, on, ... The same workload
also runs plainly with `--ab` (nothing to switch: an A/A run), whose "on" and "off" blocks differ
by the method's own noise alone. `--parts` switches only the agent or only the supervisor.

Each group of four blocks gives one ratio (on / off - 1): neighbouring blocks share the machine's
drift. The groups of all rounds are pooled, and the summary is their median with a 95% interval
for it (order statistics; no assumption on the noise). Targets as in overhead.py: the realistic
loop at most 1% slower, the short-step loop at most 5%; a target holds when the interval's top is
under it, and the A/A interval should hold 0. --check exits 3 when a target is not shown or the
A/A interval misses 0. --summarise pools the groups of earlier --json files (rounds made on
several machines) and measures nothing. Without torch or a GPU it says so and exits 0.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

from _switch import PARTS
from overhead import HERE, WORKLOADS, RunFailed, _agent_activity, _base_env, _cuda_info, _shell

BLOCK_LINE = re.compile(r"^AB_BLOCK (on|off) ([0-9.eE+-]+)\s*$", re.MULTILINE)
SWITCH_LINE = re.compile(r"^AB_SWITCH (.*)$", re.MULTILINE)
AB_WORKLOADS = ("short", "realistic")


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    if args.summarise:
        return summarise_files(args.summarise, args.only or AB_WORKLOADS)
    if importlib.util.find_spec("torch") is None:
        print(f"loop_ab: skipped: torch is not installed for {sys.executable}; nothing to measure")
        return 0
    info = _cuda_info()
    if info is None:
        return 1
    if not info.get("cuda"):
        print(f"loop_ab: skipped: torch {info.get('torch')} sees no CUDA GPU; nothing to measure")
        return 0
    env = _base_env()
    results = {"meta": {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "torch": info.get("torch"),
                        "device": info.get("device"), "python": sys.version.split()[0], "argv": sys.argv,
                        "blocks": args.blocks, "rounds": args.rounds, "parts": args.parts},
               "workloads": {}}
    print(f"gpumemdoctor loop A/B: {info.get('device')}, torch {info.get('torch')}, "
          f"{args.blocks} blocks a run, {args.rounds} round(s) of plain (A/A) and tool (A/B)", flush=True)
    status = 0
    with tempfile.TemporaryDirectory(prefix="gpumemdoctor-loop-ab-") as tmp:
        report = os.path.join(tmp, "r.json")
        for name in args.only or AB_WORKLOADS:
            script, target = WORKLOADS[name]
            steps = args.short_steps if name == "short" else args.realistic_steps
            workload = [os.path.join(HERE, script), "--ab", f"{args.blocks}x{steps}", "--ab-parts", args.parts]
            commands = {"plain": [sys.executable, *workload],
                        "tool": [sys.executable, "-m", "gpumemdoctor", "run", "-o", report, "--force", "-q",
                                 *workload]}
            if args.skip_plain:
                del commands["plain"]
            entry = {"script": script, "target_pct": target, "block_steps": steps,
                     "commands": commands, "runs": []}
            results["workloads"][name] = entry
            try:
                for round_ in range(args.rounds):
                    for mode, cmd in commands.items():
                        run = _run(name, mode, cmd, env, tmp, report if mode == "tool" else None, args.timeout)
                        run["round"] = round_
                        entry["runs"].append(run)
                        print(f"  {name:9s} {mode:5s} #{round_ + 1}: on {run['on_ms']:.4f} ms/step, "
                              f"off {run['off_ms']:.4f} ms/step, {run['slowdown_pct']:+.2f}% "
                              f"(groups {run['group_pct_min']:+.2f}% to {run['group_pct_max']:+.2f}%)"
                              f"  [{run['switch']}]", flush=True)
            except RunFailed as exc:
                print(f"loop_ab: {exc}", file=sys.stderr)
                status = 1
                break
            entry["summary"] = _summarise(entry["runs"], target)
    done = {n: w for n, w in results["workloads"].items() if "summary" in w}
    if done:
        print()
        for name, w in done.items():
            print(summary_line(name, w["target_pct"], w["summary"]))
        print("(median of each group of four blocks' on/off - 1, pooled over rounds; [95% interval of "
              "that median]; the target holds when the interval's top is under it)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)
            f.write("\n")
        print(f"\nraw numbers: {args.json}")
    if status:
        return status
    if args.check and any(not (w["summary"]["within_target"] and w["summary"]["settled"]) for w in done.values()):
        print("loop_ab: a workload missed its target or could not be settled", file=sys.stderr)
        return 3
    return 0


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--only", action="append", choices=AB_WORKLOADS, help="this workload only (repeatable)")
    p.add_argument("--rounds", type=int, default=1, help="plain and tool runs per workload [default: 1]")
    p.add_argument("--blocks", type=int, default=200, help="blocks per run, a multiple of 4 [default: 200]")
    p.add_argument("--short-steps", type=int, default=100, help="steps per block of the short loop [default: 100]")
    p.add_argument("--realistic-steps", type=int, default=100,
                   help="steps per block of the realistic loop [default: 100]")
    p.add_argument("--parts", choices=PARTS, default="all",
                   help="switch only the agent or only the supervisor, to see where a cost comes from [default: all]")
    p.add_argument("--skip-plain", action="store_true", help="no A/A runs (then nothing is settled: no --check)")
    p.add_argument("--timeout", type=float, default=600.0, help="fail a run that takes longer [default: 600 s]")
    p.add_argument("--json", metavar="PATH", help="write every block's time here")
    p.add_argument("--check", action="store_true", help="exit 3 when a target is missed or not settled")
    p.add_argument("--summarise", nargs="+", metavar="JSON",
                   help="measure nothing: pool the groups of these --json files (runs on several machines)")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    if args.blocks < 4 or args.blocks % 4:
        p.error("--blocks must be a multiple of 4")
    if args.short_steps < 1 or args.realistic_steps < 1:
        p.error("steps per block must be at least 1")
    if args.only:
        args.only = list(dict.fromkeys(args.only))
    if args.skip_plain and args.check:
        p.error("--check needs the A/A runs: drop --skip-plain")
    return args


def _run(name: str, mode: str, cmd: list[str], env: dict, cwd: str, report: str | None, timeout: float) -> dict:
    if report is not None and os.path.exists(report):
        os.remove(report)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RunFailed(f"{name} ({mode}) ran past {timeout:g} s: {_shell(cmd)}")
    blocks = [(m, float(ms)) for m, ms in BLOCK_LINE.findall(proc.stdout)]
    if proc.returncode != 0 or not blocks:
        why = f"exit status {proc.returncode}" if proc.returncode else "no AB_BLOCK lines"
        raise RunFailed(f"{name} ({mode}) failed ({why}): {_shell(cmd)}\n"
                        f"--- stdout ---\n{proc.stdout}--- stderr ---\n{proc.stderr}")
    switch = SWITCH_LINE.search(proc.stdout)
    run = {"mode": mode, "switch": switch.group(1) if switch else None, "blocks": blocks}
    run.update(compare(blocks))
    if report is not None:
        run.update(_agent_activity(report))
    return run


def compare(blocks: list[tuple[str, float]]) -> dict:
    """The median "on" block against the median "off" block, and each group of four's ratio."""
    on = [ms for m, ms in blocks if m == "on"]
    off = [ms for m, ms in blocks if m == "off"]
    groups = []
    for g in range(0, len(blocks) - 3, 4):
        quad = blocks[g:g + 4]
        g_on = sum(ms for m, ms in quad if m == "on")
        g_off = sum(ms for m, ms in quad if m == "off")
        if g_off:
            groups.append((g_on / g_off - 1.0) * 100.0)
    on_ms, off_ms = statistics.median(on), statistics.median(off)
    return {"on_ms": on_ms, "off_ms": off_ms, "slowdown_pct": (on_ms / off_ms - 1.0) * 100.0,
            "group_pct": groups, "group_pct_median": statistics.median(groups),
            "group_pct_min": min(groups), "group_pct_max": max(groups)}


def _summarise(runs: list[dict], target: float) -> dict:
    """Every group of four of every run, pooled per mode: their median, and a 95% interval for it
    (distribution-free: order statistics of the binomial). The target holds when the tool's upper
    bound is under it; the A/A interval should hold 0, or the method is not measuring what it says."""
    out = {"plain": {"groups": 0, "median_pct": 0.0, "low_pct": 0.0, "high_pct": 0.0}}  # --skip-plain
    for mode in ("tool", "plain"):
        groups = sorted(g for r in runs if r["mode"] == mode for g in r["group_pct"])
        if not groups:
            continue
        low, high = median_interval(groups)
        out[mode] = {"groups": len(groups), "median_pct": statistics.median(groups), "low_pct": low,
                     "high_pct": high}
    return {**out, "within_target": out["tool"]["high_pct"] <= target,
            "settled": out["plain"]["groups"] > 0 and out["plain"]["low_pct"] <= 0.0 <= out["plain"]["high_pct"]}


def summarise_files(paths: list[str], names) -> int:
    """The pooled summary of earlier --json files, per workload."""
    pooled: dict = {}
    for path in paths:
        try:
            with open(path, encoding="utf-8") as f:
                workloads = json.load(f)["workloads"]
            for name, w in workloads.items():
                entry = pooled.setdefault(name, {"target_pct": float(w["target_pct"]), "runs": []})
                entry["runs"] += [{"mode": r["mode"], "group_pct": [float(g) for g in r["group_pct"]]}
                                  for r in w["runs"]]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"loop_ab: {path}: not a loop_ab --json file ({exc})", file=sys.stderr)
            return 2
    for name in names:
        if name not in pooled:
            continue
        target = pooled[name]["target_pct"]
        print(summary_line(name, target, _summarise(pooled[name]["runs"], target)))
    return 0


def summary_line(name: str, target: float, s: dict) -> str:
    """One workload's pooled result: the tool's median and interval, the A/A check, the target."""
    tool, plain = s["tool"], s["plain"]
    line = (f"{name:9s} tool {tool['median_pct']:+.2f}% [{tool['low_pct']:+.2f}%, {tool['high_pct']:+.2f}%] "
            f"({tool['groups']} groups), ")
    if plain["groups"]:
        line += (f"plain A/A {plain['median_pct']:+.2f}% [{plain['low_pct']:+.2f}%, {plain['high_pct']:+.2f}%]"
                 f" ({plain['groups']} groups){'' if s['settled'] else ', its interval misses 0: the method is off'}; ")
    else:
        line += "no A/A runs; "
    return line + f"target <= {target:g}%: {'ok' if s['within_target'] else 'NOT SHOWN'}"


def median_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float]:
    """A distribution-free interval for the median of `values`: the k-th smallest and k-th largest,
    k the largest rank with P(Binomial(n, 1/2) < k) <= (1 - confidence) / 2."""
    values = sorted(values)
    n = len(values)
    tail = (1.0 - confidence) / 2.0
    k, below = 0, 0.0
    while k < n:
        below_next = below + math.comb(n, k) / 2.0 ** n
        if below_next > tail:
            break
        below, k = below_next, k + 1
    if k == 0:
        return values[0], values[-1]  # too few values for that confidence: the whole range
    return values[k - 1], values[n - k]

if __name__ == "__main__":
    sys.exit(main())
