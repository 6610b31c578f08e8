"""`gpumemdoctor ps` drawn: each GPU's memory, who holds it, what needs a look, and the jobs."""
from __future__ import annotations

from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..live.ps import GpuMemory
from ..live.roles import Job
from ..units import format_bytes as fb


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def _command(cmdline: list[str] | None) -> str:
    return " ".join(" ".join(cmdline or []).split()) or "?"


def _gpus(gpus: list[dict]) -> str:
    return ", ".join(f"GPU {g['index']} {fb(g['used_bytes'])}" for g in gpus) or "none"


def _table(console: Console, columns: tuple, rows: list[tuple[str, ...]]) -> Table:
    """A table whose last column, the command, is cut short (…) to what the console's width
    leaves it, so that a long command never squeezes the other columns away."""
    table = Table(box=None, pad_edge=False, padding=(0, 2, 0, 0), show_header=True)
    others = sum(max(cell_len(name), *(cell_len(r[i]) for r in rows)) + 2
                 for i, (name, _) in enumerate(columns[:-1]))
    for i, (name, justify) in enumerate(columns):
        last = i == len(columns) - 1
        table.add_column(name, justify=justify, overflow="ellipsis", no_wrap=last,
                         max_width=max(12, console.width - others) if last else None)
    for row in rows:
        table.add_row(*row)
    return table


def render(console: Console, gpus: list[GpuMemory], jobs: list[Job] = ()) -> None:
    for gpu in gpus:
        reserved = f", driver-reserved {fb(gpu.reserved_bytes)}" if gpu.reserved_bytes is not None else ""
        console.print(Text(f"GPU {gpu.index}  {gpu.name or '?'}", style="bold")
                      + Text(f"  used {fb(gpu.used_bytes)} of {fb(gpu.total_bytes)}, "
                             f"free {fb(gpu.free_bytes)}{reserved}"))
        if gpu.holders:
            rows = []
            for h in sorted(gpu.holders, key=lambda h: -(h.used_bytes or 0)):
                agent = {True: "yes", False: "no", None: "?"}[h.agent]
                command = " ".join(" ".join(h.cmdline or []).split()) or ("(not visible here)"
                                                                         if not h.visible else "?")
                rows.append((str(h.pid), h.user or "?", fb(h.used_bytes), fb(h.rss_bytes),
                             _age(h.age_s), agent, command))
            console.print(_table(console, (("PID", "right"), ("user", "left"), ("VRAM", "right"),
                                           ("RSS", "right"), ("age", "right"), ("agent", "left"),
                                           ("command", "left")), rows))
        else:
            console.print("  no process holds memory on this GPU")
        unaccounted = "n/a (the driver has no memory info v2)" if gpu.unaccounted_bytes is None \
            else fb(gpu.unaccounted_bytes)
        console.print(f"  unaccounted: {unaccounted}")
        for h in gpu.holders:
            for f in h.flags:
                console.print(Text(f"  ! {f['flag']}: ", style="bold yellow") + Text(f["next_step"]))
        for f in gpu.flags:
            console.print(Text(f"  ! {f['flag']}: ", style="bold yellow") + Text(f["next_step"]))
        console.print()
    for job in jobs:
        _render_job(console, job)


def _render_job(console: Console, job: Job) -> None:
    if job.launcher is not None:
        title = (f"Job: {job.launcher_kind}, launcher PID {job.launcher.pid}" if job.launcher_kind
                 else f"Job: launched by PID {job.launcher.pid}")
    else:
        title = "Job: no launcher found"
    about = [f"run {job.run_id}" if job.run_id else "", f"Slurm job {job.slurm_job_id}" if job.slurm_job_id else "",
             f"world size {job.world_size}" if job.world_size is not None else ""]
    console.print(Text(title, style="bold") + Text("".join(f", {a}" for a in about if a)))
    if job.launcher is not None:
        console.print("  " + _command(job.launcher.cmdline), overflow="ellipsis", no_wrap=True)
        if job.launcher.gpus:
            console.print(f"  the launcher itself holds {_gpus(job.launcher.gpus)}")
    rows = []
    for rank in job.ranks:
        number = "?" if rank.rank is None else str(rank.rank)
        if rank.restart_count:
            number += f" (restart {rank.restart_count})"
        rows.append((number, "?" if rank.local_rank is None else str(rank.local_rank), str(rank.pid),
                     _gpus(rank.gpus), _command(rank.cmdline)))
        for worker in rank.workers:
            rows.append(("  worker", "", str(worker.pid), _gpus(worker.gpus), _command(worker.cmdline)))
        if rank.quiet_descendants:
            rows.append((f"  +{len(rank.quiet_descendants)} more", "", "", "none", "(under this rank)"))
    if rows:
        console.print(_table(console, (("rank", "left"), ("local", "right"), ("PID", "right"),
                                       ("GPU memory", "left"), ("command", "left")), rows))
    else:
        console.print("  no rank found")
    console.print(f"  job total: {_gpus(job.gpus)}")
    for rank in job.ranks:
        for f in rank.flags:
            console.print(Text(f"  ! {f['flag']}: ", style="bold yellow") + Text(f["next_step"]))
    console.print()
