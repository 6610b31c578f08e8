"""`gpumemdoctor watch` drawn: a live panel on a terminal, plain lines elsewhere, and a summary."""
from __future__ import annotations

import contextlib
import json

from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from ..units import format_bytes as fb
from .terminal import sparkline

SPARK_WIDTH = 50


def alert_text(a) -> str:
    """An alert (live.watch.Alert) in words."""
    if a.limit == "--max-vram":
        return f"VRAM {fb(int(a.measured))} is over --max-vram {fb(int(a.allowed))}"
    return f"the VRAM floor grows {fb(int(a.measured))}/min, over --max-growth {fb(int(a.allowed))}/min"


def jsonl_line(s, rate_per_min: float | None, alerts: list, full=None) -> str:
    """One sample as a line of `--jsonl`, with the floor's rate, the time until a GPU is full
    (live.watch.TimeToFull, or null) and the alerts (in words)."""
    return json.dumps(s.to_json() | {"floor_rate_bytes_per_min": rate_per_min,
                                     "time_to_full": full.to_json() if full is not None else None,
                                     "alerts": [alert_text(a) for a in alerts]}) + "\n"


def _line(s, verdict: str) -> str:
    gpus = "  ".join(f"GPU{i} {fb(b)}" for i, b in sorted(s.gpu_bytes.items())) or "no GPU memory"
    return f"{s.t:8.1f}s  {gpus}  total {fb(s.total_bytes)}  RSS {fb(s.rss_bytes)}  floor: {verdict}"


def _who(row: dict | None, pid: int) -> str:
    """A process as the user knows it in a job: rank 1 (local 1) PID 123, worker of rank 1 PID 130."""
    if row is None or row["role"] is None:
        return f"PID {pid}"
    if row["role"] == "launcher":
        return f"launcher PID {pid}"
    rank = "rank ?" if row["rank"] is None else f"rank {row['rank']}"
    if row["local_rank"] is not None:
        rank += f" (local {row['local_rank']})"
    if row["restart_count"]:
        rank += f" restart {row['restart_count']}"
    return f"{rank} PID {pid}" if row["role"] == "rank" else f"worker of {rank} PID {pid}"


def _held(row: dict) -> str:
    return ", ".join(f"GPU{i} {fb(b)}" for i, b in sorted(row["gpu_bytes"].items())) or "no GPU memory yet"


def _in_job(s) -> bool:
    return any(row["role"] is not None for row in s.processes)


def _flag(f: dict) -> str:
    """A flag in a few words: 'stray-context: rank 1 PID 123 holds 612 MiB on GPU 0'."""
    rank = "rank ?" if f.get("rank") is None else f"rank {f['rank']}"
    if f["flag"] == "stray-context":
        return f"stray-context: {rank} PID {f['pid']} holds {fb(f['bytes'])} on GPU {f['gpu']}, {f['how']}"
    return f"{f['flag']}: {rank} PID {f['pid']}"


def _torch_line(r: dict) -> str:
    return (f"tensors {fb(r['allocated_bytes'])}, cache {fb(r['cache_bytes'])}, "
            f"freed, awaiting stream events {fb(r['pending_stream_bytes'])}, context {fb(r['context_bytes'])}, "
            f"outside PyTorch {fb(r['non_torch_bytes'])}")


def inside_lines(inside: dict | None) -> list[str]:
    """What `watch --attach` shows of the agent in the process (cli/_attach.py's view): the running
    judgement of its allocated floor, growth suspected, the holders its searches named."""
    if inside is None:
        return []
    if not inside["cuda"]:
        return [f"agent in PID {inside['pid']} ({inside['method']}): waiting for the program to start CUDA"]
    lines = []
    for row in inside["leak"]:
        rate = row["rate_bytes_per_min"]
        words = (f"not enough samples yet ({row['samples']})" if rate is None else "flat: no sustained growth"
                 if rate == 0 else f"growing {fb(int(rate))}/min")
        lines.append(f"agent in PID {inside['pid']}, cuda:{row['torch_index']}: allocated floor {words}")
    if not lines:
        lines.append(f"agent in PID {inside['pid']} ({inside['method']}): no reading yet")
    for sus in inside["suspected"][-1:]:
        lines.append(f"growth suspected at {sus['t']:.1f} s on cuda:{sus['device']} (+{fb(sus['grown_bytes'])}): "
                     "allocation stacks on from then (the history starts at the attach)")
    if inside["declined"] and not inside["suspects"]:
        lines.append("a holder search was not made (its pause would pass --max-pause): the probes name holders")
    for found in inside["suspects"]:
        lines.append(f"holder on cuda:{found['torch_index']}: {found['summary']}")
    return lines


def _panel(watcher, s, verdict: str, alerts: list, inside: dict | None = None) -> Group:
    values = [x.total_bytes for x in watcher.samples]
    span = f"{watcher.samples[0].t:.0f}-{s.t:.0f} s" if watcher.samples else ""
    parts = [Text(f"gpumemdoctor watch: PID {watcher.pid}   (q to stop)", style="bold"),
             Text(_line(s, verdict)),
             Text(f"VRAM  {sparkline(values, max(values) if values else 0, SPARK_WIDTH)}  {span}, "
                  f"peak {fb(watcher.peak_bytes)}")]
    rows_by_pid = {row["pid"]: row for row in s.processes}
    if _in_job(s):
        parts += [Text(f"{_who(row, row['pid'])}: {_held(row)}") for row in s.processes]
    elif s.pids:
        parts.append(Text("holding GPU memory: PID " + ", ".join(map(str, s.pids))))
    for pid, rows in s.torch.items():
        for r in rows:
            parts.append(Text(f"PyTorch in {_who(rows_by_pid.get(pid), pid)}, cuda:{r['torch_index']}: "
                              + _torch_line(r)))
    if not s.gpu_bytes:
        parts.append(Text("the process holds no GPU memory now; watching in case it starts"))
    parts += [Text(line) for line in inside_lines(inside)]
    parts += [Text(f"! {f['flag']}: ", style="bold yellow") + Text(f["next_step"]) for f in s.flags]
    parts += [Text(f"ALERT: {alert_text(a)}", style="bold red") for a in alerts]
    return Group(*parts)


@contextlib.contextmanager
def view(console: Console, tui: bool):
    """A function that shows each sample: in a Live panel, or as one plain line."""
    if not tui:
        def show(watcher, s, verdict, alerts, inside=None):
            rows_by_pid = {row["pid"]: row for row in s.processes}
            ranks = "".join(f"  [{_who(row, row['pid'])}: {_held(row)}]" for row in s.processes) \
                if _in_job(s) else ""
            torch = "".join(f"  [{_who(rows_by_pid.get(pid), pid)} cuda:{r['torch_index']}: {_torch_line(r)}]"
                            for pid, rows in s.torch.items() for r in rows)
            flags = "".join(f"  [{_flag(f)}]" for f in s.flags) + "".join(f"  [{line}]" for line in inside_lines(inside))
            # one line per sample, however wide: a log is read line by line
            console.print(_line(s, verdict) + ranks + torch + flags + "".join(f"  ALERT: {alert_text(a)}" for a in alerts),
                          soft_wrap=True, markup=False)
        yield show
        return
    with Live(console=console, auto_refresh=False, transient=False) as live:
        def show(watcher, s, verdict, alerts, inside=None):
            live.update(_panel(watcher, s, verdict, alerts, inside), refresh=True)
        yield show


def summary(console: Console, watcher, ended: str, verdict: str, alerts: list[tuple]) -> None:
    """The end of a watch: how long, why it stopped, the peak and the floor, whether the memory was
    returned; then each limit crossed, as first raised (alerts: (first Alert, samples over it))."""
    last = watcher.samples[-1] if watcher.samples else None
    reason = {"exited": f"process {watcher.pid} exited", "duration": "--duration reached",
              "alert": "an alert (--exit-on-alert)", "stopped": "stopped"}[ended]
    console.print(f"\nWatched PID {watcher.pid} for {last.t if last else 0:.1f} s ({watcher.count} samples): "
                  f"{reason}.")
    console.print(f"Peak VRAM {fb(watcher.peak_bytes)}; floor: {verdict}.")
    if ended == "exited" and last is not None:
        if last.total_bytes:
            console.print(f"Its descendants still hold {fb(last.total_bytes)} (PID "
                          f"{', '.join(map(str, last.pids))}): the memory was not all returned.")
        else:
            console.print("Its GPU memory was returned to the device.")
    for f in sorted(watcher.strays.values(), key=lambda f: (f["pid"], f.get("gpu") or 0)):
        console.print(f"Seen: {f['flag']}: {f['next_step']}")
    for a, samples in alerts:
        console.print(f"Alert: {alert_text(a)}" + (f" (over the limit at {samples} samples)" if samples > 1 else ""))
