"""The long run on a real GPU: a slow leak under `gpumemdoctor run` for as long as one call allows.

    python benchmarks/long_gpu.py --out DIR [--minutes 7]
    python benchmarks/long_gpu.py --summarise DIR   (also judges the recording again: "rediagnosed")

Runs `python -m gpumemdoctor run -o DIR/long.json benchmarks/workload_long.py --minutes N`
(an AdamW MLP on CUDA that keeps 1 MiB every 2 s) and, meanwhile, reads the supervisor's
and the target's host memory (RSS, psutil) every 5 s. Everything lands in DIR as it
comes (so a run cut short still leaves its figures):

    DIR/long.json          the report
    DIR/workload.log       the workload's stdout: MINUTE lines (step times per minute), PHASE lines
    DIR/tool.stderr        gpumemdoctor's own output (the terminal report)
    DIR/rss.jsonl          {"t", "supervisor_rss_bytes", "target_rss_bytes"} every 5 s
    DIR/long-summary.json  the figures: was the leak found (rate, suspect line), the supervisor's
                           RSS over time and at its peak, the report's size, the step's time per
                           minute, the agent's sampling cost in its first and last minute

--summarise DIR writes long-summary.json again from those files. Needs a CUDA GPU, torch
and gpumemdoctor installed (python3 -m pip install --no-deps --no-build-isolation -e .).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(HERE)
WORKLOAD = os.path.join(HERE, "workload_long.py")
RSS_EVERY_S = 5.0
MINUTE_LINE = re.compile(r"^MINUTE (\d+) (\d+) ([0-9.]+) ([0-9.]+) ([0-9.]+) (\d+)$", re.M)
MIB = 1 << 20


def run(out: str, minutes: float, allow_no_gpu: bool = False) -> int:
    import psutil

    os.makedirs(out, exist_ok=True)
    report = os.path.join(out, "long.json")
    argv = [sys.executable, "-m", "gpumemdoctor", "run", "--force", "-o", report,
            *(["--allow-no-gpu"] if allow_no_gpu else []), WORKLOAD, "--minutes", str(minutes)]
    with open(os.path.join(out, "workload.log"), "wb") as log, \
            open(os.path.join(out, "tool.stderr"), "wb") as err, \
            open(os.path.join(out, "rss.jsonl"), "w", encoding="utf-8") as rss:
        started = time.monotonic()
        proc = subprocess.Popen(argv, stdout=log, stderr=err, stdin=subprocess.DEVNULL, cwd=REPO_ROOT)
        supervisor = psutil.Process(proc.pid)
        while proc.poll() is None:
            try:
                proc.wait(timeout=RSS_EVERY_S)
                break
            except subprocess.TimeoutExpired:
                pass
            row = {"t": round(time.monotonic() - started, 1), "supervisor_rss_bytes": None,
                   "target_rss_bytes": None}
            try:
                row["supervisor_rss_bytes"] = supervisor.memory_info().rss
                children = supervisor.children()
                if children:
                    row["target_rss_bytes"] = children[0].memory_info().rss
            except psutil.Error:
                pass
            rss.write(json.dumps(row) + "\n")
            rss.flush()
    print(f"long_gpu: gpumemdoctor run exited {proc.returncode} after {time.monotonic() - started:.0f} s")
    return summarise(out)


def summarise(out: str) -> int:
    report_path = os.path.join(out, "long.json")
    summary: dict = {"benchmark": "benchmarks/long_gpu.py", "files": sorted(os.listdir(out))}
    with open(os.path.join(out, "workload.log"), encoding="utf-8", errors="replace") as f:
        log = f.read()
    summary["step_ms_by_minute"] = [
        {"minute": int(m[0]), "steps": int(m[1]), "median_ms": float(m[2]), "mean_ms": float(m[3]),
         "p99_ms": float(m[4]), "allocated_bytes": int(m[5])} for m in MINUTE_LINE.findall(log)]
    rss = []
    try:
        with open(os.path.join(out, "rss.jsonl"), encoding="utf-8") as f:
            rss = [json.loads(line) for line in f if line.strip()]
    except OSError:
        pass
    sup = [r["supervisor_rss_bytes"] for r in rss if r.get("supervisor_rss_bytes")]
    summary["supervisor_rss_bytes"] = {
        "samples": len(sup), "first": sup[0] if sup else None, "last": sup[-1] if sup else None,
        "max": max(sup) if sup else None,
        "by_minute": {str(int(r["t"] // 60)): r["supervisor_rss_bytes"] for r in rss}}
    if os.path.exists(report_path):
        with open(report_path, encoding="utf-8") as f:
            report = json.load(f)
        rec = report["recording"]
        target = next((a for a in rec["agents"] if a["pid"] == report["target"]["pid"]), None)
        leak = next((f for f in report["findings"] if f["kind"] == "leak"), None)
        growth = next((g for g in report["growth"] if g["series"] == "allocated"), None)
        summary.update({
            "device": (report["devices"] or [{}])[0].get("name"), "versions": report["versions"],
            "verdict": report["verdict"], "target": report["target"],
            "report_bytes": os.path.getsize(report_path),
            "leak": None if leak is None else {
                "bytes": leak["bytes"], "summary": leak["summary"], "decided_by": leak["evidence"].get("decided_by"),
                "suspects": [s["summary"] for s in leak["suspects"]],
                "suspect_line_is_the_allocating_line": any(
                    s.get("where") and s["where"][0].endswith("workload_long.py")
                    and "# allocates" in _line_of(s["where"][0], s["where"][1]) for s in leak["suspects"])},
            "growth_rate_mib_per_min": None if growth is None or growth["rate_bytes_per_s"] is None
            else growth["rate_bytes_per_s"] * 60 / MIB,
            "tool_cost": rec["tool_cost"], "downsampling": rec.get("downsampling"),
            "agent_cost": ((target or {}).get("exit_info") or {}).get("cost"),
            "agent_samples_kept": len(target["samples"]) if target else None,
            "traces": target["root"]["traces"] if target else None,
            "host_rss_points": len(rec.get("host_rss", [])),
            "nvml_points": {f"{s['pid']}:{s['device']}": len(s["points"]) for s in rec["nvml"]},
            "notes": report["notes"],
            "rediagnosed": _rediagnosed(report_path),
        })
    else:
        summary["report_bytes"] = None
    with open(os.path.join(out, "long-summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1)
        f.write("\n")
    minutes = summary["step_ms_by_minute"]
    if minutes:
        print("long_gpu: median step " + ", ".join(f"min {m['minute']}: {m['median_ms']:.3f} ms" for m in minutes))
    s = summary["supervisor_rss_bytes"]
    if s["max"]:
        print(f"long_gpu: supervisor RSS {s['first'] / MIB:.1f} MiB first, {s['last'] / MIB:.1f} MiB last, "
              f"{s['max'] / MIB:.1f} MiB most ({s['samples']} readings)")
    if summary.get("verdict") is not None:
        print(f"long_gpu: verdict {summary['verdict']}, report {summary['report_bytes'] / MIB:.2f} MiB, growth "
              f"{summary['growth_rate_mib_per_min']} MiB/min, suspect at the allocating line: "
              f"{(summary['leak'] or {}).get('suspect_line_is_the_allocating_line')}")
    print(f"long_gpu: wrote {os.path.join(out, 'long-summary.json')}")
    return 0


def _rediagnosed(report_path: str) -> dict | None:
    """The recording judged again by the diagnosis installed now: a rule changed after a run
    shows here, beside what the run itself said (the recording is what was measured)."""
    try:
        from gpumemdoctor.diagnosis.diagnose import diagnose
        from gpumemdoctor.app.report_file import load
    except ImportError:
        return None
    recording, _ = load(report_path)
    d = diagnose(recording)
    leak = next((f for f in d.findings if f.kind == "leak"), None)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                    text=True).stdout.strip() or None
    return {"code_commit": commit, "verdict": d.verdict,
            "leak": None if leak is None else {
                "bytes": leak.bytes, "summary": leak.summary, "evidence": leak.evidence,
                "suspects": [x["summary"] for x in leak.suspects]},
            "growth": [g.to_json() for g in d.growth]}


def _line_of(path: str, line: int) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().splitlines()[line - 1]
    except (OSError, IndexError):
        return ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", help="folder for the report and the figures")
    parser.add_argument("--minutes", type=float, default=7.0, help="the workload's loop [default: 7]")
    parser.add_argument("--summarise", metavar="DIR", help="only write DIR/long-summary.json again")
    parser.add_argument("--allow-no-gpu", action="store_true", help=argparse.SUPPRESS)  # a dry run on a CPU
    args = parser.parse_args(argv)
    if args.summarise:
        return summarise(args.summarise)
    if not args.out:
        parser.error("give --out DIR (or --summarise DIR)")
    return run(args.out, args.minutes, args.allow_no_gpu)


if __name__ == "__main__":
    sys.exit(main())
