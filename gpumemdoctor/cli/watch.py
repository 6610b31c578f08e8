"""`gpumemdoctor watch --pid N`: a live view of a running process's GPU memory; with `--attach`, the
agent brought into a running Python program (live/attach.py), its report written at the stop as
`run` writes one."""
from __future__ import annotations

import contextlib
import os
import select
import sys
import time

import click

from .. import contract
from ..errors import EXIT_WATCH_ALERT, UsageError
from ._params import FileName, Seconds
from ._params import rate as _rate
from ._params import size as _size


@contextlib.contextmanager
def _keys(enabled: bool):
    """Read single key presses from the terminal while watching; restore it afterwards."""
    if not enabled:
        yield None
        return
    import termios
    import tty

    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        yield fd
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _wait(fd: int | None, seconds: float) -> bool:
    """Sleep for `seconds`; True when q was pressed meanwhile."""
    if fd is None:
        time.sleep(seconds)
        return False
    ready, _, _ = select.select([fd], [], [], seconds)
    return bool(ready) and os.read(fd, 16).lower().startswith(b"q")


def _until_next(interval: float, duration: float | None, watcher) -> float:
    """Seconds until the next sample: the interval, or less where --duration ends before it (the last
    sample is then taken at the end: `--interval 3600 --duration 0.5` watches half a second, not an hour)."""
    if duration is None:
        return interval
    return max(0.0, min(interval, duration - (time.monotonic() - watcher.t0)))


@click.command("watch")
@click.option("--pid", type=int, required=True, help="The process to watch (any program).")
@click.option("--interval", type=Seconds(0.05, 3600), default=1.0, show_default=True,
              help="Seconds between samples.")
@click.option("--duration", type=Seconds(0.1), default=None,
              help="Stop after this many seconds and print a summary.")
@click.option("--jsonl", type=FileName(), default=None,
              help="Append one JSON line per sample to this file, written as it is taken (tail -f follows it).")
@click.option("--force", is_flag=True,
              help="Write over a --jsonl file that is not a log of watch (a log of watch is appended to).")
@click.option("--max-vram", callback=_size, metavar="SIZE", help="Alert when the VRAM total passes SIZE.")
@click.option("--max-growth", callback=_rate, metavar="RATE",
              help="Alert when the VRAM floor grows faster than RATE (64MiB/min, 1MiB/s).")
@click.option("--exit-on-alert", is_flag=True, help="Exit 12 at the first alert.")
@click.option("--no-tui", is_flag=True, help="Plain lines, one per sample (the default when not a terminal).")
@click.option("--attach", is_flag=True,
              help="Bring gpumemdoctor's agent into the running Python program (gpumemdoctor and torch must be "
                   "importable there; before Python 3.14, ptrace alone on x86-64 Linux, gdb elsewhere): PyTorch's split, the leak's holder and line; "
                   "at the stop the agent is taken out and the report written, as `run` writes it.")
@click.option("-o", "--output", type=FileName(), default=None,
              help="With --attach: where to write the JSON report [default: gpumemdoctor-<script>.<pid>.json].")
@click.option("--html", "html", type=FileName(), metavar="PATH", default=None,
              help="With --attach: also write the report as an HTML page (needs plotly).")
@click.option("--debugger", type=FileName(), metavar="PATH", default=None,
              help="With --attach: attach through this gdb (or lldb) binary, not ptrace alone [default on x86-64 "
                   "Linux: none; elsewhere $GPUMEMDOCTOR_GDB, else gdb, else lldb on PATH].")
@click.option("--max-pause", type=Seconds(contract.MAX_PAUSE_MIN_S, contract.MAX_PAUSE_MAX_S),
              default=contract.MAX_PAUSE_DEFAULT_S, show_default=True, metavar="SECONDS",
              help="With --attach: the longest the program may pause for a holder search (a copy of the process), "
                   "as `run --max-pause`.")
@click.option("--attach-timeout", type=Seconds(1, 600), default=30.0, show_default=True, metavar="SECONDS",
              help="With --attach: how long the program's main thread has to reach a point where it runs Python.")
def watch_command(pid: int, interval: float, duration: float | None, jsonl: str | None, force: bool,
                  max_vram: int | None, max_growth: float | None, exit_on_alert: bool,
                  no_tui: bool, attach: bool, output: str | None, html: str | None, debugger: str | None,
                  max_pause: float, attach_timeout: float) -> int:
    """Watch the GPU memory of process PID and its children, live, with a leak judgement.

    q or Ctrl-C stops and prints a summary. Needs nothing installed in the process; with --attach,
    gpumemdoctor's agent goes into it for the watch and comes out at the stop.
    """
    from ..system import nvml
    from ..files.outputs import check_log, open_log
    from ..reporters.console import make_console
    from ..reporters import watch as reporter
    from ..live.watch import Watcher, is_watch_log, judgement

    _check_process_and_options(pid, attach, output, html, debugger)
    replace = check_log(jsonl, force, is_watch_log) if jsonl is not None else False
    if attach:
        from ._attach import check_outputs

        check_outputs(output, html, force, jsonl)
    devices = nvml.devices()
    watcher = Watcher(pid, devices)
    console = make_console(stderr=False)
    tui = not no_tui and sys.stdout.isatty() and sys.stdin.isatty()
    inside = None
    if attach:
        from ._attach import Inside

        inside = Inside.open(pid, watcher, devices, debugger, max_pause, attach_timeout)
    log = open_log(jsonl, replace) if jsonl else None
    raised: dict[str, list] = {}  # limit -> [its first Alert, samples over it]: bounded over hours
    ended = _watch(watcher, inside, log, console, tui, interval, duration, max_vram, max_growth, exit_on_alert,
                   raised)
    rate = watcher.floor_rate_per_min()
    full = watcher.time_to_full(rate) if ended != "exited" else None  # an ended process fills nothing
    reporter.summary(console, watcher, ended, judgement(rate, full), [(a, n) for a, n in raised.values()])
    if inside is not None:
        inside.report(ended, output, html, force)
    return EXIT_WATCH_ALERT if ended == "alert" else 0


def _check_process_and_options(pid: int, attach: bool, output: str | None, html: str | None,
                               debugger: str | None) -> None:
    """UsageError where no process PID is here, or where options that go with --attach are given
    without it."""
    from ..system import procs

    if pid <= 0 or procs.info(pid) is None:
        raise UsageError(f"no process with PID {pid} here (it may have exited, or live in "
                         "another PID namespace)")
    if not attach:
        given = [name for name, value in (("-o", output), ("--html", html), ("--debugger", debugger)) if value]
        given += [f"--{name.replace('_', '-')}" for name in ("max_pause", "attach_timeout")
                  if click.get_current_context().get_parameter_source(name) is not click.core.ParameterSource.DEFAULT]
        if given:
            raise UsageError(f"{', '.join(given)} go with --attach (the report of the agent in the process): add "
                             "--attach, or leave them out")


def _watch(watcher, inside, log, console, tui: bool, interval: float, duration: float | None,
           max_vram: int | None, max_growth: float | None, exit_on_alert: bool, raised: dict) -> str:
    """The samples until the watch ends, each checked against the limits (`raised` counts each limit's
    alerts), written to the `log` and shown; how it ended: "exited", "alert", "duration" or "stopped"
    (q, Ctrl-C, or SIGTERM with an agent `inside`). However it ended, the log is closed and the agent
    taken out."""
    from ..reporters import watch as reporter
    from ..live.watch import alerts, judgement

    ended = "stopped"
    try:
        with _keys(tui) as fd, reporter.view(console, tui) as show, _terminate_as_interrupt(inside is not None):
            while True:
                s = watcher.sample()
                if inside is not None:
                    inside.poll()
                rate = watcher.floor_rate_per_min()
                full = watcher.time_to_full(rate)
                now = alerts(s, rate, max_vram, max_growth)
                for a in now:
                    raised.setdefault(a.limit, [a, 0])[1] += 1
                if log is not None:
                    failed = log.write(reporter.jsonl_line(s, rate, now, full))
                    if failed:  # a full disk, a reader gone: said once, and watching goes on
                        click.echo(f"gpumemdoctor: warning: {failed}", err=True)
                        log = None
                show(watcher, s, judgement(rate, full), now, inside.view() if inside is not None else None)
                if not s.alive:
                    ended = "exited"
                    _until_dropped(watcher, s)
                    break
                if now and exit_on_alert:
                    ended = "alert"
                    break
                if duration is not None and s.t >= duration:
                    ended = "duration"
                    break
                if _wait(fd, _until_next(interval, duration, watcher)):
                    break
    except KeyboardInterrupt:
        pass
    finally:
        if log is not None:
            log.close()
        if inside is not None:
            inside.stop(ended)  # the agent taken out, whatever ended the watch
    return ended


def _until_dropped(watcher, s) -> None:
    """After the process exited (sample `s`), samples again for up to a second until NVML no longer
    lists it (it drops an exited process within about 0.5 s)."""
    for _ in range(10):
        if watcher.pid not in s.pids:
            break
        time.sleep(0.1)
        s = watcher.sample()


@contextlib.contextmanager
def _terminate_as_interrupt(enabled: bool):
    """While an agent is in the process, SIGTERM stops the watch as Ctrl-C does: the agent is taken out."""
    if not enabled:
        yield
        return
    import signal

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
