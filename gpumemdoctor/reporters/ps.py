"""`gpumemdoctor ps` drawn: each GPU's memory, who holds it, and what needs a look."""
from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..holders import GpuMemory
from ..units import format_bytes as fb


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def render(console: Console, gpus: list[GpuMemory]) -> None:
    for gpu in gpus:
        reserved = f", driver-reserved {fb(gpu.reserved_bytes)}" if gpu.reserved_bytes is not None else ""
        console.print(Text(f"GPU {gpu.index}  {gpu.name or '?'}", style="bold")
                      + Text(f"  used {fb(gpu.used_bytes)} of {fb(gpu.total_bytes)}, "
                             f"free {fb(gpu.free_bytes)}{reserved}"))
        if gpu.holders:
            table = Table(box=None, pad_edge=False, padding=(0, 2, 0, 0), show_header=True)
            for name, justify in (("PID", "right"), ("user", "left"), ("VRAM", "right"),
                                  ("RSS", "right"), ("age", "right"), ("agent", "left"),
                                  ("command", "left")):
                table.add_column(name, justify=justify, overflow="ellipsis", no_wrap=name == "command")
            for h in sorted(gpu.holders, key=lambda h: -(h.used_bytes or 0)):
                agent = {True: "yes", False: "no", None: "?"}[h.agent]
                command = " ".join(" ".join(h.cmdline or []).split()) or ("(not visible here)"
                                                                         if not h.visible else "?")
                table.add_row(str(h.pid), h.user or "?", fb(h.used_bytes), fb(h.rss_bytes),
                              _age(h.age_s), agent, command)
            console.print(table)
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
