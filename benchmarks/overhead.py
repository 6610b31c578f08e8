"""How much `gpumemdoctor run` slows a training loop down.

    python benchmarks/overhead.py [--repeats 5] [--json PATH] [--only realistic|short]

For each workload it runs the same script plainly (`python W.py`) and under the
tool (`python -m gpumemdoctor run -o <tmp>/r.json --force -q W.py`), alternating
plain, tool, plain, tool, ... --repeats times each, so drift in clocks or
temperature falls on both sides alike. Each workload warms up on its own and then
times only its steady loop (torch.cuda.synchronize() around time.perf_counter()),
printing `STEP_TIME_MS <float>`: the slowdown is computed from those, median
against median, so interpreter start-up and the tool's exit probes do not count.
The whole-process wall time of every run is recorded as well and shown beside
it, which makes that start-up and exit cost visible on its own.

Workloads (benchmarks/):
  workload_realistic.py  an MLP (4 x Linear(4096, 4096), batch 512, bf16 autocast)
                         with AdamW, about 2-3 ms a step on an H100/H200
  workload_short.py      a tiny MLP (Linear(64, 64) layers, batch 32) with AdamW,
                         about 1.0 ms a step on an H200, bound by kernel launches
  workload_ddp.py        the realistic MLP under DistributedDataParallel, two ranks started
                         by torch.distributed.run (NCCL with a GPU per rank, gloo when
                         they share one); the tool wraps the launcher. It also prints its
                         longest single step (host-timed), summarised beside the medians
                         (issue 29: `--only ddp --repeats 3` on two GPUs)

Targets (median step time with the tool against without it):
  realistic loop:   slowdown at most 1%
  DDP loop:         slowdown at most 1% (the slowest rank's step)
  short-step loop:  slowdown at most 5%

It exits 1 when a run fails (printing that run's stderr), 0 otherwise; with
--check it exits 3 when a workload misses its target. Without torch, or where
torch.cuda.is_available() is False, it says so and exits 0 without measuring.
Only the standard library is used here; the workloads need torch.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(HERE)

WORKLOADS = {
    # name: (script, slowdown target in %)
    "realistic": ("workload_realistic.py", 1.0),
    "short": ("workload_short.py", 5.0),
    "ddp": ("workload_ddp.py", 1.0),  # run by torch.distributed.run, two ranks (LAUNCHED)
}
# Workloads started through a launcher: the tool wraps the launcher (`run -m torch.distributed.run`),
# and its agent reaches every rank through the environment.
LAUNCHED = {"ddp": ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]}
STEP_LINE = re.compile(r"^STEP_TIME_MS\s+([0-9.eE+-]+)\s*$", re.MULTILINE)
WORST_LINE = re.compile(r"^WORST_STEP_MS\s+([0-9.eE+-]+)\s*$", re.MULTILINE)  # workload_ddp.py's
PHASE_LINE = re.compile(r"^PHASE (\w+) ([0-9.]+)\s*$", re.MULTILINE)

_CUDA_CHECK = """\
import json, torch
ok = torch.cuda.is_available()
print(json.dumps({"torch": str(torch.__version__), "cuda": ok,
                  "device": torch.cuda.get_device_name(0) if ok else None}))
"""


class RunFailed(Exception):
    pass


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)

    if importlib.util.find_spec("torch") is None:
        print("overhead: skipped: torch is not installed for "
              f"{sys.executable}; nothing to measure")
        return 0
    env_info = _cuda_info()
    if env_info is None:
        return 1
    if not env_info.get("cuda"):
        print(f"overhead: skipped: torch {env_info.get('torch')} sees no CUDA GPU "
              "(torch.cuda.is_available() is False); nothing to measure")
        return 0

    names = args.only or list(WORKLOADS)
    steps = {"realistic": args.realistic_steps, "short": args.short_steps, "ddp": args.ddp_steps}
    env = _base_env()
    results = {
        "meta": {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "host": platform.node(),
                 "python": sys.version.split()[0], "executable": sys.executable,
                 "torch": env_info.get("torch"), "device": env_info.get("device"),
                 "repeats": args.repeats, "warmup_pairs": args.warmup_pairs,
                 "tool_args": args.tool_arg, "argv": sys.argv},
        "workloads": {},
    }
    print(f"gpumemdoctor overhead: {env_info.get('device')}, torch {env_info.get('torch')}, "
          f"python {sys.version.split()[0]}, {args.repeats} interleaved pairs per workload",
          flush=True)

    status = 0
    with tempfile.TemporaryDirectory(prefix="gpumemdoctor-overhead-") as tmp:
        report = os.path.join(tmp, "r.json")
        for name in names:
            script, target = WORKLOADS[name]
            workload_args = [os.path.join(HERE, script)]
            if steps[name] is not None:
                workload_args.append(str(steps[name]))
            launcher = LAUNCHED.get(name, [])
            plain_cmd = [sys.executable, *launcher, *workload_args]
            tool_cmd = [sys.executable, "-m", "gpumemdoctor", "run", "-o", report, "--force", "-q",
                        *args.tool_arg, *launcher, *workload_args]
            entry = {"script": script, "steps": steps[name], "target_pct": target,
                     "plain_cmd": plain_cmd, "tool_cmd": tool_cmd, "runs": []}
            results["workloads"][name] = entry
            try:
                for pair in range(args.warmup_pairs + args.repeats):
                    counted = pair >= args.warmup_pairs
                    for mode, cmd in (("plain", plain_cmd), ("tool", tool_cmd)):
                        run = _run_once(name, mode, cmd, env, tmp, args.timeout,
                                        report if mode == "tool" else None)
                        run["pair"] = pair - args.warmup_pairs if counted else None
                        run["counted"] = counted
                        entry["runs"].append(run)
                        tag = "" if counted else " (warm-up, not counted)"
                        extra = ""
                        if mode == "tool":
                            extra = (f"  agent samples {run['agent_samples']}, "
                                     f"steps seen {run['agent_steps']}, "
                                     f"exit probes {run['exit_probes_s']} s "
                                     f"(holder search {run['exit_search_s']} s)")
                        worst = (f", longest step {run['worst_step_ms']:.2f} ms"
                                 if "worst_step_ms" in run else "")
                        print(f"  {name:9s} {mode:5s} #{pair + 1}: "
                              f"{run['step_time_ms']:.4f} ms/step{worst}, wall {run['wall_s']:.2f} s"
                              f"{extra}{tag}", flush=True)
            except RunFailed as exc:
                print(f"overhead: {exc}", file=sys.stderr)
                status = 1
                break
            entry["summary"] = _summarise(entry["runs"], target)
            _warn_if_agent_idle(name, entry["runs"])

    summarised = {n: w for n, w in results["workloads"].items() if "summary" in w}
    if summarised:
        print()
        _print_table(summarised)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)
            f.write("\n")
        print(f"\nraw numbers: {args.json}")
    if status:
        return status
    if args.check and any(not w["summary"]["within_target"] for w in summarised.values()):
        print("overhead: a workload missed its slowdown target", file=sys.stderr)
        return 3
    return 0


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Measure the slowdown of `gpumemdoctor run` on two training loops.",
        epilog="Targets: at most 1% slower on the realistic and DDP loops, at most 5% on the short-step loop.")
    parser.add_argument("--repeats", type=int, default=5,
                        help="plain/tool pairs per workload, interleaved [default: 5]")
    parser.add_argument("--json", metavar="PATH", help="write every run's numbers here as JSON")
    parser.add_argument("--only", action="append", choices=list(WORKLOADS),
                        help="run only this workload (repeatable) [default: all]")
    parser.add_argument("--realistic-steps", type=int, default=None, metavar="N",
                        help="timed steps of the realistic loop [default: the workload's, ~6 s]")
    parser.add_argument("--short-steps", type=int, default=None, metavar="N",
                        help="timed steps of the short-step loop [default: the workload's, ~6 s]")
    parser.add_argument("--ddp-steps", type=int, default=None, metavar="N",
                        help="timed steps of the two-rank DDP loop [default: the workload's]")
    parser.add_argument("--warmup-pairs", type=int, default=0, metavar="N",
                        help="extra plain/tool pairs run first and not counted [default: 0]")
    parser.add_argument("--tool-arg", action="append", default=[], metavar="ARG",
                        help="pass ARG to `gpumemdoctor run` (repeatable), e.g. "
                             "--tool-arg=--interval --tool-arg=0.05")
    parser.add_argument("--timeout", type=float, default=600.0, metavar="S",
                        help="fail a run that takes longer than S seconds [default: 600]")
    parser.add_argument("--check", action="store_true",
                        help="exit 3 when a workload's slowdown is over its target")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if args.warmup_pairs < 0:
        parser.error("--warmup-pairs must be at least 0")
    for opt in ("realistic_steps", "short_steps", "ddp_steps"):
        if getattr(args, opt) is not None and getattr(args, opt) < 1:
            parser.error(f"--{opt.replace('_', '-')} must be at least 1")
    if args.only:
        args.only = list(dict.fromkeys(args.only))
    return args


def _cuda_info() -> dict | None:
    """Ask a child interpreter, so this process never holds a CUDA context of its own."""
    try:
        proc = subprocess.run([sys.executable, "-c", _CUDA_CHECK], capture_output=True,
                              text=True, timeout=300, env=_base_env())
    except subprocess.TimeoutExpired:
        print("overhead: checking for CUDA timed out after 300 s", file=sys.stderr)
        return None
    if proc.returncode != 0:
        print(f"overhead: checking for CUDA failed (exit {proc.returncode}):\n{proc.stderr}",
              file=sys.stderr)
        return None
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        print(f"overhead: unexpected output from the CUDA check:\n{proc.stdout}{proc.stderr}",
              file=sys.stderr)
        return None


def _base_env() -> dict:
    """The same environment for plain and tool runs: this source tree importable, no stray run."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUMEMDOCTOR_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO_ROOT, env.get("PYTHONPATH")) if p)
    return env


def _run_once(name: str, mode: str, cmd: list[str], env: dict, cwd: str, timeout: float,
              report: str | None) -> dict:
    if report is not None and os.path.exists(report):
        os.remove(report)
    start = time.perf_counter()
    launched = time.time()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd,
                              timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        stderr = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr
        raise RunFailed(f"{name} ({mode}) ran past {timeout:g} s: {_shell(cmd)}\n"
                        f"--- stderr ---\n{stderr or ''}")
    wall = time.perf_counter() - start
    done = time.time()
    found = STEP_LINE.findall(proc.stdout)
    if proc.returncode != 0 or not found:
        why = f"exit status {proc.returncode}" if proc.returncode != 0 else "no STEP_TIME_MS line"
        raise RunFailed(f"{name} ({mode}) failed ({why}): {_shell(cmd)}\n"
                        f"--- stdout ---\n{proc.stdout}--- stderr ---\n{proc.stderr}")
    run = {"mode": mode, "step_time_ms": float(found[-1]), "wall_s": round(wall, 6),
           "returncode": proc.returncode}
    worst = WORST_LINE.findall(proc.stdout)
    if worst:
        run["worst_step_ms"] = float(worst[-1])
    # Where the wall time went: before the script's first line (interpreter, imports, and under
    # the tool its own start-up), the script itself (import torch, CUDA, the loop), and after its
    # last line (exit hooks, which hold the agent's exit probes; teardown; the tool's report).
    phases = {name: float(t) for name, t in PHASE_LINE.findall(proc.stdout)}
    if "start" in phases and "end" in phases:
        run.update(before_script_s=round(phases["start"] - launched, 4),
                   script_s=round(phases["end"] - phases["start"], 4),
                   to_loop_s=round(phases.get("loop", phases["start"]) - phases["start"], 4),
                   after_script_s=round(done - phases["end"], 4))
    if report is not None:
        run.update(_agent_activity(report))
        # The verdict line goes to the tool's console (stdout or stderr) and may wrap.
        verdict = re.search(r"gpumemdoctor verdict: (.*?)(?:\s+report:|$)",
                            proc.stdout + "\n" + proc.stderr, re.M)
        run["verdict"] = verdict.group(1).strip() if verdict else None
    return run


def _agent_activity(report: str) -> dict:
    """How much the agent did in a tool run, from its report: proof that it was measuring."""
    out = {"agent_samples": None, "agent_step_samples": None, "agent_steps": None,
           "exit_probes_s": None, "exit_search_s": None, "tool_cost": None, "agent_cost": None}
    try:
        with open(report, encoding="utf-8") as f:
            obj = json.load(f)
        rows = obj.get("timeline") or []
        target_pid = (obj.get("target") or {}).get("pid")
        out["tool_cost"] = (obj.get("recording") or {}).get("tool_cost")
        # Under a launcher the target has no CUDA: the busiest process (a rank) stands for it.
        counts: dict = {}
        for r in rows:
            counts[r.get("pid")] = counts.get(r.get("pid"), 0) + 1
        if target_pid not in counts and counts:
            target_pid = max(counts, key=counts.get)
        mine = [r for r in rows if r.get("pid") == target_pid]
        out["agent_samples"] = len(mine)
        out["agent_step_samples"] = sum(1 for r in mine if r.get("by") == "step")
        for agent in (obj.get("recording") or {}).get("agents") or []:
            if agent.get("pid") == target_pid:
                out["agent_steps"] = agent.get("steps")
                # The work done at exit, inside the target: from its first exit reading to its last.
                probes = agent.get("probes") or {}
                if "end" in probes and "empty_cache" in probes:
                    out["exit_probes_s"] = round(probes["empty_cache"]["t"] - probes["end"]["t"], 3)
                searches = [i["elapsed_s"] for i in (agent.get("root") or {}).get("investigations") or []
                            if i.get("when") == "exit"]
                out["exit_search_s"] = searches[-1] if searches else None
                out["agent_cost"] = ((agent.get("exit_info") or {}).get("cost"))
    except (OSError, ValueError, AttributeError, TypeError):
        pass
    return out


def _warn_if_agent_idle(name: str, runs: list[dict]) -> None:
    idle = [r for r in runs if r["mode"] == "tool" and not r.get("agent_samples")]
    if idle:
        print(f"overhead: warning: in {len(idle)} tool run(s) of {name} the agent recorded no "
              "samples, so the tool may not have been measuring at all", file=sys.stderr)


def _summarise(runs: list[dict], target: float) -> dict:
    counted = [r for r in runs if r["counted"]]
    plain = [r for r in counted if r["mode"] == "plain"]
    tool = [r for r in counted if r["mode"] == "tool"]
    plain_step = statistics.median(r["step_time_ms"] for r in plain)
    tool_step = statistics.median(r["step_time_ms"] for r in tool)
    slowdown = (tool_step / plain_step - 1.0) * 100.0
    pair_ratios = [(t["step_time_ms"] / p["step_time_ms"] - 1.0) * 100.0
                   for p, t in zip(plain, tool)]
    plain_wall = statistics.median(r["wall_s"] for r in plain)
    tool_wall = statistics.median(r["wall_s"] for r in tool)
    split = {}
    for part in ("before_script_s", "to_loop_s", "script_s", "after_script_s"):
        if all(part in r for r in counted):
            split[part] = {"plain": statistics.median(r[part] for r in plain),
                           "tool": statistics.median(r[part] for r in tool)}
            split[part]["extra"] = split[part]["tool"] - split[part]["plain"]
    costs: dict = {}
    for r in tool:
        for source in ("tool_cost", "agent_cost"):
            for k, v in (r.get(source) or {}).items():
                if isinstance(v, (int, float)):
                    costs.setdefault(f"{source.split('_')[0]}.{k}", []).append(v)
    worst = {}
    if all("worst_step_ms" in r for r in counted):
        worst = {"plain": statistics.median(r["worst_step_ms"] for r in plain),
                 "tool": statistics.median(r["worst_step_ms"] for r in tool)}
    return {
        "worst_step_ms_median": worst,
        "wall_split": split,
        "tool_own_costs_median_s": {k: statistics.median(v) for k, v in sorted(costs.items())},
        "plain_step_ms_median": plain_step, "tool_step_ms_median": tool_step,
        "slowdown_pct": slowdown, "within_target": slowdown <= target,
        "pair_slowdown_pct": pair_ratios,
        "plain_step_ms_min": min(r["step_time_ms"] for r in plain),
        "plain_step_ms_max": max(r["step_time_ms"] for r in plain),
        "tool_step_ms_min": min(r["step_time_ms"] for r in tool),
        "tool_step_ms_max": max(r["step_time_ms"] for r in tool),
        "plain_wall_s_median": plain_wall, "tool_wall_s_median": tool_wall,
        "wall_extra_s": tool_wall - plain_wall,
    }


def _print_table(workloads: dict) -> None:
    header = ["workload", "plain ms/step", "tool ms/step", "slowdown", "target",
              "plain wall s", "tool wall s", "wall +s", "plain spread"]
    rows = []
    for name, w in workloads.items():
        s = w["summary"]
        spread = (s["plain_step_ms_max"] - s["plain_step_ms_min"]) / s["plain_step_ms_median"] * 100
        rows.append([
            name, f"{s['plain_step_ms_median']:.4f}", f"{s['tool_step_ms_median']:.4f}",
            f"{s['slowdown_pct']:+.2f}%",
            f"<={w['target_pct']:g}% " + ("ok" if s["within_target"] else "MISSED"),
            f"{s['plain_wall_s_median']:.2f}", f"{s['tool_wall_s_median']:.2f}",
            f"{s['wall_extra_s']:+.2f}", f"{spread:.2f}%",
        ])
    widths = [max(len(header[i]), *(len(r[i]) for r in rows)) for i in range(len(header))]

    def line(cells):
        return "  ".join(c.ljust(widths[0]) if i == 0 else c.rjust(widths[i])
                         for i, c in enumerate(cells))

    print(line(header))
    print(line(["-" * w for w in widths]))
    for r in rows:
        print(line(r))
    print("(medians over the counted runs; slowdown = tool / plain step time - 1; "
          "plain spread = (max - min) / median of the plain step times)")
    for name, w in workloads.items():
        worst = w["summary"].get("worst_step_ms_median") or {}
        if worst:
            print(f"\n{name}: longest single step (medians over runs, ms): plain {worst['plain']:.2f}, "
                  f"tool {worst['tool']:.2f} ({worst['tool'] - worst['plain']:+.2f})")
        split = w["summary"].get("wall_split") or {}
        if split:
            print(f"\n{name}: where the extra wall time goes (medians, seconds; plain -> tool)")
            for part, v in split.items():
                print(f"  {part:16s} {v['plain']:8.3f} -> {v['tool']:8.3f}  ({v['extra']:+.3f})")
        costs = w["summary"].get("tool_own_costs_median_s") or {}
        if costs:
            print("  measured by the tool itself: " + ", ".join(f"{k} {v:.3f}" for k, v in costs.items()))


def _shell(cmd: list[str]) -> str:
    import shlex
    return " ".join(shlex.quote(c) for c in cmd)


if __name__ == "__main__":
    sys.exit(main())
