"""The tool's split of the allocated peak against PyTorch's MemTracker on real training programs
(issue 40): for each program, `gpumemdoctor run` (its JSON report, the recording in it) and the
MemTracker harness (benchmarks/memtracker_reference.py) on the same program, then the two splits
side by side, part by part.

    python benchmarks/peak_reference.py --out DIR [--only NAME ...] [--timeout SECONDS]

Writes, in DIR: `<name>.report.json` and `<name>.memtracker.json` (with `<name>.report.stderr.txt`
and `<name>.memtracker.stderr.txt`: what each printed), then `peak-reference.json` (every figure,
rewritten after each program) and `peak-reference.txt` (the table). The mapping of categories, the
tolerances (each part within 64 MiB or 10% of MemTracker's figure, unclassified at most 10% of the
allocated peak) and the comparison are benchmarks/_peak_compare.py's, which tests/test_peak_reference.py
uses on these files once copied into tests/fixtures/peak_reference/. The exit status is 0 when the
programs ran, whether or not a split missed (the table says so); a program that exits 77 (its
library missing, no GPU) is listed as skipped. Needs a CUDA GPU; run from anywhere.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks._peak_compare import (MAPPING_TEXT, PROGRAMS, compare, memtracker_split, table,  # noqa: E402
                                      tool_split)

SKIP_EXIT = 77
# Every child: the environment inherited, NVLink multicast off (the lent machines' rule).
CHILD_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def say(text: str) -> None:
    print(f"peak_reference: {text}", file=sys.stderr, flush=True)


def run_child(cmd: list[str], stderr_path: Path, timeout: float) -> dict:
    """Run one command from the repository's root, its output to stderr_path; its exit status and
    time, or that it timed out (its process group killed)."""
    env = {**os.environ, **CHILD_ENV}
    start = time.perf_counter()
    with open(stderr_path, "w", encoding="utf-8") as out:
        out.write(f"$ {shlex.join(cmd)}\n")
        out.flush()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            code = proc.wait()
            timed_out = True
    return {"command": shlex.join(cmd), "exit_code": code, "timed_out": timed_out,
            "elapsed_s": round(time.perf_counter() - start, 1)}


def one(name: str, out: Path, timeout: float) -> dict:
    program = f"corpus/{name}.py"
    report_path, mt_path = out / f"{name}.report.json", out / f"{name}.memtracker.json"
    for p in (report_path, mt_path):
        if p.exists():
            p.unlink()
    entry: dict = {"program": program}
    say(f"{name}: gpumemdoctor run")
    tool = run_child([sys.executable, "-m", "gpumemdoctor", "run", "-o", str(report_path), program],
                     out / f"{name}.report.stderr.txt", timeout)
    entry["tool_run"] = tool
    say(f"{name}: gpumemdoctor run: exit {tool['exit_code']}{' (timed out)' if tool['timed_out'] else ''}, "
        f"{tool['elapsed_s']} s")
    if tool["exit_code"] == SKIP_EXIT:
        entry["status"] = "skipped"
        entry["why"] = _last_line(out / f"{name}.report.stderr.txt")
        return entry
    say(f"{name}: MemTracker")
    mt = run_child([sys.executable, str(ROOT / "benchmarks" / "memtracker_reference.py"), "--json", str(mt_path),
                    program], out / f"{name}.memtracker.stderr.txt", timeout)
    entry["memtracker_run"] = mt
    say(f"{name}: MemTracker: exit {mt['exit_code']}{' (timed out)' if mt['timed_out'] else ''}, {mt['elapsed_s']} s")
    if mt["exit_code"] == SKIP_EXIT and tool["exit_code"] == 0:
        entry["status"] = "skipped"
        entry["why"] = "under MemTracker only: " + _last_line(out / f"{name}.memtracker.stderr.txt")
        return entry
    problems = []
    if tool["exit_code"] != 0 or not report_path.exists():
        problems.append(f"gpumemdoctor run exited {tool['exit_code']}" + ("" if report_path.exists() else ", no report")
                        + f": {_last_line(out / f'{name}.report.stderr.txt')[:300]}")
    if mt["exit_code"] != 0 or not mt_path.exists():
        problems.append(f"the MemTracker run exited {mt['exit_code']}" + ("" if mt_path.exists() else ", no record"))
    if not report_path.exists() or not mt_path.exists():
        entry["status"], entry["why"] = "failed", "; ".join(problems)
        return entry
    report = json.loads(report_path.read_text())
    record = json.loads(mt_path.read_text())
    entry["verdict"] = report.get("verdict")
    tool_side = tool_split(report)
    if tool_side is None:
        entry["status"], entry["why"] = "failed", "; ".join(problems + ["the report has no peak composition"])
        return entry
    reference = memtracker_split(record, tool_side["torch_index"])
    if reference is None:
        entry["status"], entry["why"] = "failed", "; ".join(
            problems + [f"MemTracker saw nothing on GPU {tool_side['torch_index']} ({record.get('error')})"])
        return entry
    result = compare(tool_side, reference)
    entry["result"] = result
    entry["status"] = "ok" if result["ok"] and not problems else "missed"
    if problems:
        entry["why"] = "; ".join(problems)
    return entry


def _last_line(path: Path) -> str:
    lines = [s for s in path.read_text(errors="replace").splitlines() if s.strip()]
    return lines[-1] if lines else ""


def versions() -> dict:
    out: dict = {"python": platform.python_version()}
    try:
        probe = subprocess.run([sys.executable, "-c", "import json, torch; print(json.dumps({'torch': torch.__version__, "
                                "'gpu': torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}))"],
                               capture_output=True, text=True, timeout=120)
        out.update(json.loads(probe.stdout.strip().splitlines()[-1]))
    except Exception as e:  # noqa: BLE001 (written down, not fatal)
        out["torch_error"] = repr(e)
    try:
        import gpumemdoctor
        out["gpumemdoctor"] = gpumemdoctor.__version__
    except Exception:  # noqa: BLE001
        pass
    try:
        out["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                       text=True, timeout=10).stdout.strip() or None
    except Exception:  # noqa: BLE001
        out["commit"] = None
    return out


def text(summary: dict) -> str:
    v = summary["versions"]
    lines = [f"Issue 40: the tool's split of the allocated peak against PyTorch's MemTracker ({v.get('gpu')}, "
             f"torch {v.get('torch')}, gpumemdoctor {v.get('gpumemdoctor')} at {v.get('commit')}), "
             f"{summary['finished']}", f"$ {summary['command']}", "", MAPPING_TEXT, ""]
    for name, entry in summary["programs"].items():
        if entry["status"] in ("ok", "missed") and "result" in entry:
            lines.append(table(name, entry["result"]))
            lines.append(f"  the tool's verdict: {entry.get('verdict')}; runs: gpumemdoctor "
                         f"{entry['tool_run']['elapsed_s']} s, MemTracker {entry['memtracker_run']['elapsed_s']} s"
                         + (f"; {entry['why']}" if entry.get("why") else ""))
        else:
            lines.append(f"{name}: {entry['status'].upper()}: {entry.get('why', '')}")
        lines.append("")
    counts = {s: sum(1 for e in summary["programs"].values() if e["status"] == s)
              for s in ("ok", "missed", "skipped", "failed")}
    lines.append(", ".join(f"{n} {s}" for s, n in counts.items()))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, metavar="DIR")
    p.add_argument("--only", action="append", choices=PROGRAMS, metavar="NAME",
                   help=f"one of {', '.join(PROGRAMS)} (repeat for several)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds for each child run (default 300)")
    argv = sys.argv[1:] if argv is None else argv
    a = p.parse_args(argv)
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    names = [n for n in PROGRAMS if not a.only or n in a.only]
    summary = {"command": shlex.join(["python", "benchmarks/peak_reference.py", *argv]), "versions": versions(),
               "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "finished": None, "programs": {}}
    say(f"{len(names)} programs, results in {out}")
    for i, name in enumerate(names, 1):
        say(f"[{i}/{len(names)}] {name}")
        try:
            entry = one(name, out, a.timeout)
        except Exception as e:  # noqa: BLE001 (one program's failure is written down; the others still run)
            entry = {"program": f"corpus/{name}.py", "status": "failed", "why": f"{type(e).__name__}: {e}"}
        summary["programs"][name] = entry
        say(f"[{i}/{len(names)}] {name}: {entry['status']}" + (f" ({entry['why']})" if entry.get("why") else ""))
        summary["finished"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
        (out / "peak-reference.json").write_text(json.dumps(summary, indent=1) + "\n")
        (out / "peak-reference.txt").write_text(text(summary))
    sys.stderr.write(text(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
