"""`watch --attach`'s part of the command: the agent brought in (live/attach.py), what the live view
shows of it, and at the stop the agent taken out and the report written and drawn as `run` does it
(app/pipeline.py's `after_run`: the same JSON report, the same HTML page, the same terminal report)."""
from __future__ import annotations

import os
import time

import click

from ..errors import UsageError

SUSPECTS_EVERY_S = 2.0  # the live view's holders are read again this often (the records, not the process)


def check_outputs(output: str | None, html: str | None, force: bool, jsonl: str | None) -> None:
    """Every file the stop will write, checked before anything is changed in the process."""
    from ..files.outputs import check_distinct, check_folder_writable, check_writable

    check_distinct({f"-o {output}": output, f"--html {html}": html, f"--jsonl {jsonl}": jsonl}, {})
    if output is not None:
        check_writable(output, force)
    else:
        check_folder_writable(os.getcwd())
    if html is not None:
        from ..reporters import html as html_reporter

        html_reporter.require_plotly()
        check_writable(html, force, what="HTML page")


class Inside:
    """The agent in the watched process, from the attach to the report."""

    def __init__(self, session, watcher, devices: list, started_wall: float):
        self.session = session
        self.watcher = watcher
        self.devices = devices
        self.started_wall = started_wall
        self.suspects: list[dict] = []
        self.suspects_t = 0.0
        self.stopped = False

    @classmethod
    def open(cls, pid: int, watcher, devices: list, debugger: str | None, max_pause_s: float,
             timeout_s: float) -> Inside:
        from ..live.attach import Attach
        from ..system import nvml

        started_wall = time.time()
        session = Attach(pid, watcher.t0, debugger=debugger, max_pause_s=max_pause_s, timeout_s=timeout_s)
        click.echo(f"gpumemdoctor: attaching to process {pid} through {session.method} ...", err=True)
        try:
            attached = session.open(devices, measure_gpu=True)
        except BaseException:
            session.close()
            raise
        click.echo(f"gpumemdoctor: the agent is in process {pid} (Python {attached.python}, torch "
                   f"{attached.status.get('torch')}) after {attached.attach_s:.2f} s; q or Ctrl-C takes it out "
                   "and writes the report", err=True)
        inside = cls(session, watcher, devices, started_wall)
        inside.versions = {"tool": attached.status.get("version"), "python": attached.python}
        try:
            inside.versions.update(nvml.versions())
        except Exception:
            pass
        return inside

    def poll(self) -> None:
        self.session.poll()

    def view(self) -> dict:
        """What the live view shows of the agent: the running leak judgement from its samples, growth
        suspected, the holders its searches found (diagnosis/suspects.py, on the records so far)."""
        agent, samples = self.session.agent()
        root = agent.root if agent is not None else {}
        if agent is not None and time.monotonic() - self.suspects_t >= SUSPECTS_EVERY_S:
            self.suspects_t = time.monotonic()
            self.suspects = _suspects(agent, samples)
        return {"pid": self.session.pid, "method": self.session.method, "leak": self.session.leak(),
                "suspected": [{"t": s["t"], "device": s["device"], "grown_bytes": s["grown_bytes"]}
                              for s in root.get("suspicions", [])],
                "searches": len(root.get("investigations", [])), "declined": len(root.get("declined", [])),
                "suspects": self.suspects, "cuda": agent is not None and agent.cuda_t is not None}

    def stop(self, ended: str) -> None:
        if self.stopped:
            return
        self.stopped = True
        if ended != "exited":
            click.echo(f"gpumemdoctor: taking the agent out of process {self.session.pid} ...", err=True)
        try:
            self.session.stop(ended)
        except KeyboardInterrupt:
            pass

    def report(self, ended: str, output: str | None, html: str | None, force: bool) -> None:
        """The report of the attached stretch, written and drawn as `run` does; the run folder removed."""
        from ..app.pipeline import RunOutputs, after_run

        session = self.session
        try:
            recording = session.recording(ended, self.started_wall, time.monotonic() - self.watcher.t0,
                                          self.versions, self.devices)
        finally:
            session.close()
        outputs = RunOutputs(name=_name(recording.target.get("argv") or []), report=output, force=force,
                             quiet=False, html=html, html_next_to_json=False, junit=None, new_baseline=None)
        try:
            after_run(recording, 0, outputs, None)
        except UsageError as exc:
            click.echo(f"gpumemdoctor: error: {exc}", err=True)


def _suspects(agent, samples: list) -> list[dict]:
    """The leak's suspects on each device the agent saw, as the report will name them."""
    from ..diagnosis.suspects import leak_suspects

    if not agent.root.get("investigations"):
        return []
    out = []
    for index in sorted({r.torch_index for s in samples for r in s.readings} | {d.index for d in agent.devices}):
        try:
            found, _ = leak_suspects(agent.root, index)
        except Exception:
            continue
        out.extend({"torch_index": index, "summary": s.get("summary"), "bytes": s.get("bytes")} for s in found[:3])
    return out


def _name(argv: list[str]) -> str:
    """The report's name stem, as `run` makes it from its script: the script's name, or the module's."""
    if len(argv) >= 2 and argv[0] == "-m":
        return argv[1]
    for arg in argv:
        if not arg.startswith("-"):
            return os.path.splitext(os.path.basename(arg))[0] or "python"
    return "python"
