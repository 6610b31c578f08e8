"""`gpumemdoctor ps`: who holds each GPU's memory, and what nobody accounts for."""
from __future__ import annotations

import json
import re

import click

from ..errors import EXIT_GPU_BUSY
from ..units import parse_size
from ._params import size as _size


class _PsCommand(click.Command):
    """`--expect-free` takes an optional value, and click takes a value that starts with "-" for the
    next option, also in `--expect-free=-1GiB` ("No such option '-1'"): say what is wrong instead."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        for i, arg in enumerate(args):
            value = args[i + 1] if arg == "--expect-free" and i + 1 < len(args) else \
                arg.partition("=")[2] if arg.startswith("--expect-free=") else ""
            if re.match(r"-[\d.]", value):
                try:
                    parse_size(value)  # says that a size must not be negative
                except ValueError as exc:
                    raise click.BadParameter(str(exc), ctx=ctx, param_hint="'--expect-free'") from None
        return super().parse_args(ctx, args)


@click.command("ps", cls=_PsCommand)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
@click.option("--expect-free", is_flag=False, flag_value="0", default=None, callback=_size,
              metavar="[SIZE]",
              help="Exit 11 when any GPU has more than SIZE held by processes or unaccounted "
                   "(default 0): a pre-flight check before GPU tests.")
def ps_command(as_json: bool, expect_free: int | None) -> int:
    """Show each GPU's memory, the processes that hold it, and what needs a look.

    Works for any process, Python or not; flags zombies, orphaned workers, PIDs from
    other PID namespaces and memory no visible process accounts for. The processes of a
    torchrun or Slurm job are also shown together: launcher, ranks, workers, per-GPU totals.
    """
    from ..reporters.console import make_console
    from ..live.ps import agents_reserved, busy_gpus, diagnose_holders, find_jobs, gather, gather_processes
    from ..reporters import ps as reporter
    from ..units import format_bytes as fb

    gpus = diagnose_holders(gather())
    jobs = find_jobs(gpus, *gather_processes(gpus), agents_reserved(gpus))
    console = make_console(stderr=False)
    if as_json:
        click.echo(json.dumps({"schema": "gpumemdoctor.ps/1", "gpus": [g.to_json() for g in gpus],
                               "jobs": [j.to_json() for j in jobs]}, indent=1))
    else:
        reporter.render(console, gpus, jobs)
    if expect_free is None:
        return 0
    busy = busy_gpus(gpus, expect_free)
    for index, held in busy:
        click.echo(f"gpumemdoctor: GPU {index} holds {fb(held)}, more than the {fb(expect_free)} "
                   f"--expect-free allows", err=True)
    return EXIT_GPU_BUSY if busy else 0
