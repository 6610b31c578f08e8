"""The command line: one group, one small module per subcommand, errors mapped to exit codes here."""
from __future__ import annotations

import os
import signal
import sys


def _aborted_while_starting(signum: int, frame) -> None:
    """Ctrl-C while the command line's modules load (its first ~50 ms): the line and the status that a
    Ctrl-C later gets, not a traceback from inside an import."""
    try:
        os.write(2, b"gpumemdoctor: error: aborted\n")
    except OSError:
        pass
    os._exit(130)


# Until the modules below are loaded, main() is not there to catch a KeyboardInterrupt. Only Python's own
# handler is replaced: a SIGINT that the caller ignores (a background job) stays ignored.
_SIGINT_BEFORE = signal.getsignal(signal.SIGINT)
try:
    if _SIGINT_BEFORE is signal.default_int_handler:
        signal.signal(signal.SIGINT, _aborted_while_starting)
except ValueError:  # imported outside the main thread, where no handler can be set
    pass

import traceback  # noqa: E402

import click  # noqa: E402

from .. import __version__  # noqa: E402
from ..errors import EXIT_INTERNAL, EXIT_USAGE, DoctorError, internal_error  # noqa: E402
from ._stdio import StandardStream  # noqa: E402

_debug = False


# Each subcommand's module, imported only when that subcommand runs (or the help lists it): a
# `run` does not wait for `compare`'s or `watch`'s imports before its target starts.
SUBCOMMANDS = {"run": "run:run_command", "report": "report:report_command", "compare": "compare:compare_command",
               "ps": "ps:ps_command", "watch": "watch:watch_command"}


class _LazyGroup(click.Group):
    """click's group, its subcommands loaded on first use (click's documented lazy-loading pattern)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(SUBCOMMANDS)

    def get_command(self, ctx: click.Context, name: str):
        if name not in self.commands and name in SUBCOMMANDS:
            import importlib

            module, attr = SUBCOMMANDS[name].split(":")
            self.add_command(getattr(importlib.import_module(f"{__name__}.{module}"), attr), name)
        return self.commands.get(name)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gpumemdoctor")
@click.option("--debug", is_flag=True, help="Show tracebacks of the tool's own errors.")
def cli(debug: bool) -> None:
    """A doctor for NVIDIA GPU memory in Python programs.

    \b
    gpumemdoctor run train.py --epochs 1     run a script, then a verdict and a report
    gpumemdoctor run -m mypkg.train          run a module, like python -m
    gpumemdoctor report REPORT.json          show a saved report again
    gpumemdoctor report R.json --html OUT    the same, as one HTML page with charts
    gpumemdoctor compare OLD.json NEW.json   what changed between two runs, checked
    gpumemdoctor ps                          who holds each GPU's memory right now
    gpumemdoctor watch --pid N               a running process's GPU memory, live
    """
    global _debug
    _debug = debug


if signal.getsignal(signal.SIGINT) is _aborted_while_starting:
    signal.signal(signal.SIGINT, _SIGINT_BEFORE)  # from here on main() catches it


def _fail(message: str, code: int) -> None:
    click.echo(f"gpumemdoctor: error: {message}", err=True)
    sys.exit(code)


def _traceback_then_exit(code: int) -> None:
    """--debug: the traceback, and still the exit code the table documents for this error."""
    traceback.print_exc()
    sys.exit(code)


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the CLI and turn every failure into one line and an exit code."""
    global _debug
    _debug = False  # set by the group's --debug; main may run more than once in one process (tests)
    args = sys.argv[1:] if argv is None else argv
    debug = "--debug" in args[:1]
    if not args:
        args = ["--help"]  # a bare `gpumemdoctor` shows the help, as click does for groups
    out, err = StandardStream(sys.stdout, "standard output", fatal=True), StandardStream(sys.stderr, "standard error",
                                                                                fatal=False)
    sys.stdout, sys.stderr = out, err
    try:
        code = cli.main(args=args, prog_name="gpumemdoctor", standalone_mode=False)
        out.flush()  # what is still buffered fails here, not as Python exits (exit 120)
    except click.ClickException as exc:
        _fail(f"{exc.format_message()} (see gpumemdoctor {_subcommand(args)}--help)", EXIT_USAGE)
    except click.exceptions.Abort:
        _fail("aborted", 130)
    except DoctorError as exc:
        if debug or _debug:
            _traceback_then_exit(exc.exit_code)
        _fail(str(exc), exc.exit_code)
    except KeyboardInterrupt:
        _fail("interrupted", 130)
    except Exception as exc:
        if debug or _debug:
            _traceback_then_exit(EXIT_INTERNAL)
        _fail(internal_error(exc), EXIT_INTERNAL)
    else:
        status = code if isinstance(code, int) else 0
        if argv is None and _subcommand(args) == "run ":
            _end_now(err, status)
        sys.exit(status)
    finally:
        for stream in (out, err):
            stream.silence()
        sys.stdout, sys.stderr = out.original, err.original


def _end_now(err: StandardStream, status: int) -> None:
    """The end of a `run` started as a command: its report is written and closed, standard output
    flushed, its run folder gone; the interpreter's teardown (freeing the recording, the diagnosis and
    every module one by one: 25-30 ms on this project's development machine) would only keep the user
    and the target's caller waiting, so the process ends here. Standard error is flushed first; a
    stream that cannot take it is no failure (as in _stdio)."""
    try:
        err.flush()
    except Exception:
        pass
    os._exit(status)


def _subcommand(args: list[str]) -> str:
    for arg in args:
        if arg in SUBCOMMANDS:
            return arg + " "
    return ""
