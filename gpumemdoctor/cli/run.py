"""`gpumemdoctor run`: run a script or module under the supervisor, then diagnose and report."""
from __future__ import annotations

import os
import traceback

import click

from ..app import pipeline
from ..app.checks import make_policy
from ..errors import UsageError, internal_error
from ._ci_checks import TOLERANCE_DEFAULT, check_options
from .. import contract
from ._params import FileName, Seconds
from ._target import check_target, resolve_command


class _RunCommand(click.Command):
    """Everything from the script (or `-m MODULE`) on belongs to the target, as with python."""

    def collect_usage_pieces(self, ctx: click.Context) -> list[str]:
        return ["[OPTIONS]", "(SCRIPT | -m MODULE) [ARGS]..."]

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ours, target = _split(args, self)
        ctx.meta["gpumemdoctor.target"] = target
        return super().parse_args(ctx, ours)


def _split(args: list[str], command: click.Command) -> tuple[list[str], list[str]]:
    takes_value = {}
    for param in command.params:
        if isinstance(param, click.Option):
            for opt in [*param.opts, *param.secondary_opts]:
                takes_value[opt] = not param.is_flag and not param.count
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            return args[:i], args[i + 1:]
        if arg in ("-m", "--module"):
            if i + 1 >= len(args):
                raise UsageError("-m needs a module name, as in: gpumemdoctor run -m mypkg.train")
            return args[:i], ["-m", *args[i + 1:]]
        if arg.startswith("--module="):
            return args[:i], ["-m", arg.split("=", 1)[1], *args[i + 1:]]
        if arg.startswith("-m") and len(arg) > 2:
            return args[:i], ["-m", arg[2:], *args[i + 1:]]
        if not arg.startswith("-") or arg == "-":
            return args[:i], args[i:]
        name = arg.split("=", 1)[0]
        i += 2 if takes_value.get(name) and "=" not in arg else 1
    return args, []


@click.command("run", cls=_RunCommand, context_settings={"ignore_unknown_options": False})
@click.option("-m", "--module", "module", metavar="MODULE", default=None, expose_value=False,
              help="Run a module, like python -m; everything after it is the module's own.")
@click.option("-o", "--output", type=FileName(), default=None,
              help="Where to write the JSON report [default: gpumemdoctor-<script>.<pid>.json; under a "
                   "multi-node launcher gpumemdoctor-<script>.<host>.node<N>.rank<R>.<pid>.json].")
@click.option("--force", is_flag=True, help="Overwrite the report (and --html) file if it exists.")
@click.option("--interval", type=Seconds(contract.INTERVAL_MIN_S, contract.INTERVAL_MAX_S),
              default=contract.INTERVAL_DEFAULT_S, show_default=True,
              help="Seconds between the agent's allocator samples, at the least: a long run lengthens "
                   f"it up to {contract.LENGTHENED_INTERVAL_MAX_S:g} s (a longer one is kept as given).")
@click.option("--poll-interval", type=Seconds(contract.POLL_INTERVAL_MIN_S, contract.POLL_INTERVAL_MAX_S),
              default=contract.POLL_INTERVAL_DEFAULT_S, show_default=True,
              help="Seconds between NVML polls of the process tree.")
@click.option("--allow-no-gpu", is_flag=True,
              help="Run the target even where NVML is missing (nothing GPU-side is measured).")
@click.option("-q", "--quiet", is_flag=True, help="Print only the verdict line and the report path.")
@click.option("--trace", type=click.Choice(contract.TRACE_MODES), default=None,
              help="Record allocation stacks (PyTorch's memory history): from the start (on), for a "
                   "start-up window and once memory is seen growing (auto), or never (events: only "
                   "the allocation events that split the allocated peak, for steps that recording stacks "
                   "would slow; off: not those either). [default: auto; on with --snapshot]")
@click.option("--max-pause", type=Seconds(contract.MAX_PAUSE_MIN_S, contract.MAX_PAUSE_MAX_S),
              default=contract.MAX_PAUSE_DEFAULT_S, show_default=True, metavar="SECONDS",
              help="The longest your program may pause for a holder search during the run (a copy of "
                   "the process by fork, about 30 ms a GiB of its own memory): a search expected to "
                   "pause it longer is not made, the report says so, and the probes at its new highs "
                   "name the holders. 0.1: the deep search in most programs. 0: none during the run.")
@click.option("--snapshot", type=FileName(), metavar="PATH", default=None,
              help="Write PyTorch's allocator snapshot (a pickle for pytorch.org/memory_viz) here at exit.")
@click.option("--html", "html", type=FileName(), metavar="PATH", default=None,
              help='Also write the report as one self-contained HTML page, with charts '
                   '(needs plotly: pip install plotly).')
@click.option("--html-next-to-json", is_flag=True,
              help="Write the HTML page next to the JSON report, named like it with .html.")
@check_options
@click.option("--baseline", type=FileName(), metavar="FILE",
              help="Compare the run's figures with this baseline and fail past --tolerance.")
@click.option("--update-baseline", is_flag=True,
              help="Write the run's figures to --baseline FILE instead of comparing.")
@click.pass_context
def run_command(ctx: click.Context, output: str | None, force: bool, interval: float,
                poll_interval: float, allow_no_gpu: bool, quiet: bool, trace: str | None,
                max_pause: float, snapshot: str | None, html: str | None, html_next_to_json: bool, max_peak: int | None,
                max_retained: int | None, fail_on: str | None, tolerance: str,
                nvml_tolerance: str | None, junit: str | None, baseline: str | None,
                update_baseline: bool) -> int:
    """Run SCRIPT [ARGS]... (or -m MODULE [ARGS]...) and diagnose its GPU memory.

    Options go before the script; everything after it is the script's own.
    SCRIPT may also be a Python command on PATH, such as torchrun.
    The exit status is the script's (128 + N if signal N killed it).
    """
    from ..supervise.supervisor import RunOptions, exit_status, run

    target = ctx.meta.get("gpumemdoctor.target") or []
    if not target:
        raise UsageError("give a script to run (gpumemdoctor run train.py) or a module "
                         "(gpumemdoctor run -m mypkg.train)")
    target, note = resolve_command(target)
    name = check_target(target)
    if note:
        click.echo(f"gpumemdoctor: note: {note}", err=True)
    _check_options(ctx, html, html_next_to_json, baseline, update_baseline)
    if html is None and html_next_to_json and output is not None:
        html = pipeline.next_to(output)
    reads = {f"the script {target[0]}": None if target[0] == "-m" else target[0],
             f"the baseline {baseline}": None if update_baseline else baseline}
    _check_outputs(reads, output, force, snapshot, html, html_next_to_json, junit, baseline, update_baseline)
    policy = _policy(max_peak, max_retained, fail_on, tolerance, nvml_tolerance, junit, baseline, update_baseline)
    measure_gpu = _measure_gpu(allow_no_gpu, update_baseline)
    recording = run(RunOptions(target_args=target, poll_interval_s=poll_interval,
                               agent_interval_s=interval, measure_gpu=measure_gpu,
                               trace=trace or ("on" if snapshot else "auto"), max_pause_s=max_pause,
                               snapshot_path=os.path.abspath(snapshot) if snapshot else None,
                               prepare=pipeline.prepare))
    status = exit_status(recording)
    try:
        outputs = pipeline.RunOutputs(name=name, report=output, force=force, quiet=quiet, html=html,
                                      html_next_to_json=html_next_to_json, junit=junit,
                                      new_baseline=baseline if update_baseline else None, reads=reads)
        return pipeline.after_run(recording, status, outputs, policy)
    except Exception as exc:  # a bug of gpumemdoctor's own, after the target ran: its status stays
        if ctx.find_root().params.get("debug"):
            traceback.print_exc()
        click.echo(f"gpumemdoctor: error: {internal_error(exc)}; the exit status is the target's", err=True)
        return status


def _check_options(ctx: click.Context, html: str | None, html_next_to_json: bool, baseline: str | None,
                   update_baseline: bool) -> None:
    """Refuse options that contradict each other, or that ask for what nothing will use."""
    if html is not None and html_next_to_json:
        raise UsageError("give --html PATH or --html-next-to-json, not both")
    if update_baseline and not baseline:
        raise UsageError("--update-baseline needs --baseline FILE to write to")
    for option in ("tolerance", "nvml_tolerance"):  # as --junit without a check: asked for, never used
        if not baseline and ctx.get_parameter_source(option) is not click.core.ParameterSource.DEFAULT:
            raise UsageError(f"--{option.replace('_', '-')} says how much a figure may grow over its baseline, "
                             "and no --baseline FILE is given: add one, or leave it out")


def _check_outputs(reads: dict, output: str | None, force: bool, snapshot: str | None, html: str | None,
                   html_next_to_json: bool, junit: str | None, baseline: str | None, update_baseline: bool) -> None:
    """Every file this run will write, checked before the target starts: none over the script, the
    baseline it reads (`reads`) or another of them, and each one writable (exit 2 now, not after the run)."""
    from ..files.outputs import check_distinct, check_folder_writable, check_writable

    check_distinct({f"-o {output}": output, f"--html {html}": html, f"--junit {junit}": junit,
                    f"--snapshot {snapshot}": snapshot,
                    f"--baseline {baseline}": baseline if update_baseline else None}, reads)
    if output is not None:
        check_writable(output, force)
    else:
        check_folder_writable(os.getcwd())  # the default name holds the target's PID, unknown yet
    if snapshot is not None:
        check_writable(snapshot, force, what="snapshot")
    if html is not None or html_next_to_json:
        from ..reporters import html as html_reporter

        html_reporter.require_plotly()
        if html is not None:
            check_writable(html, force, what="HTML page")
    if update_baseline:
        check_writable(baseline, True, what="baseline")  # a baseline is rewritten each time


def _policy(max_peak: int | None, max_retained: int | None, fail_on: str | None, tolerance: str,
            nvml_tolerance: str | None, junit: str | None, baseline: str | None, update_baseline: bool):
    """The checks asked for, with the baseline's figures read now (a bad baseline is exit 4 before the
    run); --junit without a check is refused, and its file checked. None where no check and no
    tolerance was asked for: the checks' module (and the diagnosis it imports, 0.1 s) is then not
    imported before the target starts, but while it runs."""
    from ..files.outputs import check_writable

    if (max_peak is None and max_retained is None and fail_on is None and baseline is None and junit is None
            and tolerance == TOLERANCE_DEFAULT and nvml_tolerance is None):
        return None
    baseline_figures = None
    if baseline and not update_baseline:
        from ..app.baseline_file import load_baseline

        baseline_figures = load_baseline(baseline)
    policy = make_policy(max_peak, max_retained, fail_on, tolerance, nvml_tolerance, baseline_figures)
    if junit is not None:
        if policy.empty:
            raise UsageError("--junit writes the results of checks, and none is asked for: add --max-peak, "
                             "--max-retained, --fail-on or --baseline")
        check_writable(junit, True, what="JUnit XML")  # rewritten each time, as CI runs again
    return policy


def _measure_gpu(allow_no_gpu: bool, update_baseline: bool) -> bool:
    """Check that NVML answers (the supervisor initialises it while the target starts): False where
    it does not and --allow-no-gpu runs the target all the same."""
    from ..errors import NoGpuError
    from ..system import nvml

    try:
        nvml.check_available()
    except NoGpuError as exc:
        if not allow_no_gpu:
            raise NoGpuError(f"{exc}, or pass --allow-no-gpu to run the target without GPU "
                             "measurement") from None
        if update_baseline:
            raise UsageError(f"--update-baseline: nothing can be measured here ({exc}), and a baseline "
                             "without figures fails every later check: make it where a GPU is") from None
        return False
    return True
