"""The combine step: the agents' JSON-lines files, read as they grow, into bounded recordings.

Each Python process of a run appends to `agent-<pid>.jsonl` in the run folder. The
supervisor reads the new lines of every file about once a second while the target runs
(`AgentFiles.poll`) and the rest when it ends (`AgentFiles.finish`), so the end of a long
run is quick and the supervisor's memory does not grow with the run's length:

- a process's samples go into a `series.Series`: every sample of the start and of the end,
  those around an out-of-memory error and where the agent first suspected growth, and in
  between a fixed number of buckets that keep each one's first, last, lowest and highest
  sample of allocated, reserved and NVML memory (so the floor and the spikes survive);
- a process that has exited (its exit line read, or the process gone) is set aside once its
  file has been read to its end, and the file is removed; at most MAX_QUIET_AGENTS processes that never used CUDA and
  MAX_CUDA_AGENTS that did are kept besides the target (the ranks of a distributed job first, then
  the ones that held most).

A line cut short by a killed process is skipped, and so is, while the run goes on, any other line
that is not a valid record (one bad line must not cost the whole run its report). A run folder read
again afterwards (`report --from-run-dir`, `strict`) is a file from outside: there only the last line
of a file may be cut short, and any other line that is not JSON (NaN and Infinity included) or not a
valid record makes the folder not valid.
"""
from __future__ import annotations

import math
import os

from ..system import procs
from . import records
from ..errors import BadReportError
from ..files.inputs import loads_strict
from ..files.schema import COUNT, INT, PID, STR, Shape, list_of, need_num, opt
from .recording import PROBE_PHASES, SAMPLE, TORCH_DEVICE, AgentRecording, Dist, TorchSample
from .series import Series

# The target's samples: about 1000 kept samples at most for a smooth series (a leak's),
# a few more for a noisy one; a rank of a distributed job keeps as many. Other processes keep fewer.
TARGET_SERIES = {"head": 128, "tail": 128, "buckets": 128, "window": 32, "events": 4}
OTHER_SERIES = {"head": 32, "tail": 32, "buckets": 32, "window": 16, "events": 2}
MAX_QUIET_AGENTS = 32  # processes that never used CUDA, kept besides the target
MAX_CUDA_AGENTS = 16  # processes that did, kept besides the target
MAX_ERRORS = 50  # error records kept per process
READ_CHUNK = 1 << 20
MAX_LINE_BYTES = 64 << 20  # bounds what a file without newlines can make the supervisor hold


# The agent's lines that are not root-cause records (those are records.RECORDS), as declared shapes;
# a sample's line is a recording's SAMPLE with its time made relative to the run's start.
HELLO = Shape({"pid": PID, "ppid": opt(PID), "forked_from": opt(PID), "python": opt(STR)})
DEVICES = Shape({"allocator_backend": opt(STR), "devices": list_of(TORCH_DEVICE)})


def sample_figures(sample: TorchSample) -> tuple:
    """What a bucket follows in a sample: allocated, reserved and NVML bytes of each device."""
    out: list = []
    for r in sample.readings:
        base = 3 * r.torch_index
        if len(out) < base + 3:
            out.extend([None] * (base + 3 - len(out)))
        out[base], out[base + 1], out[base + 2] = r.allocated_bytes, r.reserved_bytes, r.nvml_used_bytes
    return tuple(out)


def _sample_time(sample: TorchSample) -> float:
    return sample.t


def _agent_pid(name: str) -> int | None:
    stem = name[len("agent-"):-len(".jsonl")]
    return int(stem) if stem.isdigit() else None


class AgentFile:
    """One agent's file, read a piece at a time as it grows."""

    def __init__(self, path: str, t0: float, sizes: dict | None = None, strict: bool = False):
        self.path = path
        self.t0 = t0
        self.strict = strict  # a bad line makes the file not valid (see the module's docstring)
        self.offset = 0
        self.lines = 0  # read so far, for the line number of a bad one
        self.last_t: float | None = None  # the latest time of a record applied, from the run's start
        self._partial = b""
        self._sizes = sizes or TARGET_SERIES
        self.agent: AgentRecording | None = None
        self.samples: Series[TorchSample] = self._series()

    def _series(self) -> Series:
        return Series(time_of=_sample_time, figures=sample_figures, **self._sizes)

    @property
    def exited(self) -> bool:
        return self.agent is not None and self.agent.exited_normally

    @property
    def used_cuda(self) -> bool:
        return self.agent is not None and (self.agent.cuda_t is not None or self.samples.seen > 0)

    def read(self, final: bool = False) -> None:
        """Apply the lines added since the last read; with `final`, a last line without its
        newline too (a process killed mid-write leaves one, which does not parse)."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                while True:
                    chunk = f.read(READ_CHUNK)
                    if not chunk:
                        break
                    self.offset += len(chunk)
                    lines = (self._partial + chunk).split(b"\n")
                    self._partial = lines.pop()
                    for line in lines:
                        self._line(line)
                    if len(self._partial) > MAX_LINE_BYTES:  # no agent writes such a line: skip it
                        self.lines += 1
                        self._bad(f"a line longer than {MAX_LINE_BYTES:,} bytes")
                        self._partial = b""
        except OSError:
            return
        if final and self._partial:
            self._line(self._partial, cut_short=True)
            self._partial = b""

    def finish(self) -> AgentRecording | None:
        """The recording, with its kept samples, once the file has been read to its end."""
        self.read(final=True)
        agent = self.agent
        if agent is not None:
            agent.samples = self.samples.points()
            if agent.steps is None and agent.samples:
                agent.steps = agent.samples[-1].step
        return agent

    def _line(self, line: bytes, cut_short: bool = False) -> None:
        """Apply one line; `cut_short`: the file's last, without its newline (a process killed mid-write)."""
        self.lines += 1
        try:
            rec = loads_strict(line.decode("utf-8"))
        except (ValueError, RecursionError) as exc:  # also not UTF-8, NaN, Infinity
            if not cut_short:
                self._bad(f"not JSON ({str(exc)[:80]})")
            return
        if not isinstance(rec, dict):
            self._bad("not a JSON object")
            return
        try:
            self._apply(rec)
        except (BadReportError, KeyError, TypeError, ValueError, IndexError) as exc:
            self._bad(f"not a valid {str(rec.get('type'))[:40]!r} record ({str(exc)[:120]})")
            return
        t = rec.get("t")
        if self.agent is not None and isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t):
            self.last_t = t - self.t0 if self.last_t is None else max(self.last_t, t - self.t0)

    def _bad(self, what: str) -> None:
        """A line that is not a valid record: skipped while the run goes on, an error when `strict`."""
        if self.strict:
            raise BadReportError(f"{os.path.basename(self.path)}, line {self.lines}: {what}")

    def _apply(self, rec: dict) -> None:
        kind = rec.get("type")
        if kind == "hello":
            hello = HELLO(rec, "hello")
            self.agent = AgentRecording(pid=hello["pid"], ppid=hello["ppid"],
                                        argv=[str(a) for a in rec.get("argv") or []],
                                        forked_from=hello["forked_from"], python=hello["python"])
            try:
                self.agent.dist = None if rec.get("dist") is None else Dist.from_json(rec["dist"])
            except BadReportError as exc:  # the process is still recorded, without its rank
                self.agent.errors.append(f"hello: {exc}")
            if self.agent.dist is not None:
                self._sizes = TARGET_SERIES  # a rank is a main process of the job, as the target is
            self.samples = self._series()
            return
        agent = self.agent
        if agent is None:
            return
        t = need_num(rec.get("t"), "t") - self.t0 if rec.get("t") is not None else None
        if kind == "torch":
            agent.torch_version = opt(STR)(rec.get("version"), "version")
        elif kind == "cuda":
            agent.cuda_t = t
            if "stack" in rec:
                agent.cuda_origin = records.CUDA_ORIGIN(rec, "cuda")
        elif kind == "devices":
            devices = DEVICES(rec, "devices")
            agent.allocator_backend, agent.devices = devices["allocator_backend"], devices["devices"]
        elif kind == "steps":
            agent.explicit_steps = True
        elif kind in ("s", "p"):
            if t is None:
                raise BadReportError("a sample without its time")
            sample = SAMPLE({**rec, "t": t, "by": rec["phase"] if kind == "p" else rec.get("by")}, "sample")
            if kind == "p":
                if sample.by in PROBE_PHASES:
                    agent.probes[sample.by] = sample
            else:
                self.samples.add(sample)
        elif kind == "hard-exit":  # os._exit(): its last reading, a sample; no exit probes ran
            if t is None:
                raise BadReportError("a hard exit without its time")
            agent.hard_exit = {"t": t, "status": opt(INT)(rec.get("status"), "status")}
            sample = SAMPLE({"t": t, "by": "hard-exit", "step": rec.get("steps"), "d": rec.get("d")}, "hard-exit")
            if sample.readings:
                self.samples.add(sample)
        elif kind == "exit":
            agent.exited_normally = True
            agent.steps = opt(COUNT)(rec.get("steps"), "steps")
            agent.explicit_steps = bool(rec.get("explicit_steps"))
            cupy = rec.get("cupy")
            agent.cupy_pool = cupy if isinstance(cupy, dict) else None
            if "cost" in rec:
                agent.exit_info = records.EXIT_INFO(rec, "exit")
        elif kind in records.RECORDS:
            records.apply_record(agent.root, kind, rec, self.t0)
            if kind in ("oom", "suspect") and t is not None:
                self.samples.mark("out-of-memory" if kind == "oom" else "growth suspected", t)
        elif kind == "error":
            if len(agent.errors) < MAX_ERRORS:
                agent.errors.append(str(rec.get("where")) + ": " + str(rec.get("message")))


class _Done:
    """A file already read to its end and set aside (kept in place: not the supervisor's folder)."""


def _held(agent: AgentRecording) -> tuple[bool, int]:
    """How set-aside processes are ranked: a process with a rank of a distributed job (not a
    DataLoader worker of it) first, then the most memory it was seen to hold."""
    rank = agent.dist is not None and not (agent.cuda_origin or {}).get("dataloader_worker")
    return rank, max((r.nvml_used_bytes or r.reserved_bytes or 0 for s in agent.samples for r in s.readings),
                     default=0)


class AgentFiles:
    """Every agent file of a run folder, read as the run goes; see the module's docstring."""

    def __init__(self, run_dir: str, t0: float, target_pid: int | None = None, remove_read: bool = True,
                 strict: bool = False):
        self.run_dir = run_dir
        self.t0 = t0
        self.target_pid = target_pid
        self.remove_read = remove_read  # remove a file once read to its end (the supervisor's run folder)
        self.strict = strict  # a run folder read again: a bad line makes it not valid (module docstring)
        self.last_t: float | None = None  # the latest record's time, from the run's start, of files finished
        self._files: dict[str, AgentFile] = {}
        self._quiet: list[tuple[str, AgentRecording]] = []  # exited, never used CUDA
        self._cuda: list[tuple[str, AgentRecording, dict]] = []  # exited, used CUDA
        self.dropped = 0  # processes left out of the recording
        self._summaries: dict[str, dict] = {}

    def poll(self) -> None:
        """Read what the agents have added; set aside the processes that have exited."""
        try:
            entries = list(os.scandir(self.run_dir))
        except OSError:
            return
        for entry in entries:
            name = entry.name
            if not (name.startswith("agent-") and name.endswith(".jsonl")):
                continue
            try:
                if not entry.is_file():  # a pipe or a device would block or never end
                    continue
            except OSError:
                continue
            reader = self._reader(name)
            if isinstance(reader, _Done):
                continue
            try:
                size = entry.stat().st_size
            except OSError:
                continue
            if size > reader.offset:
                reader.read()
            pid = _agent_pid(name)
            if pid == self.target_pid:
                continue
            # A process ends without its exit line when it leaves through os._exit (a forked
            # multiprocessing worker does) or is killed: once it is gone, its file is complete.
            if reader.exited or (self.remove_read and pid is not None and not procs.same_process(pid, None)):
                reader.read()
                self._set_aside(name, reader)

    def _reader(self, name: str) -> AgentFile:
        reader = self._files.get(name)
        if reader is None:
            pid = _agent_pid(name)
            sizes = TARGET_SERIES if self.target_pid is None or pid in (self.target_pid, None) else OTHER_SERIES
            reader = self._files[name] = AgentFile(os.path.join(self.run_dir, name), self.t0, sizes, self.strict)
        return reader

    def _set_aside(self, name: str, reader: AgentFile) -> None:
        used_cuda = reader.used_cuda
        agent = self._finished(reader)
        del self._files[name]
        if self.remove_read:
            try:
                os.remove(reader.path)  # read to its end: the process wrote its last line
            except OSError:
                pass
        else:
            self._files[name] = _Done()
        if agent is None:
            return
        if used_cuda:
            self._cuda.append((name, agent, reader.samples.summary()))
            if len(self._cuda) > MAX_CUDA_AGENTS:
                smallest = min(range(len(self._cuda)), key=lambda i: _held(self._cuda[i][1]))
                del self._cuda[smallest]
                self.dropped += 1
        elif len(self._quiet) < MAX_QUIET_AGENTS:
            self._quiet.append((name, agent))
        else:
            self.dropped += 1

    def _finished(self, reader: AgentFile) -> AgentRecording | None:
        agent = reader.finish()
        if reader.last_t is not None:
            self.last_t = reader.last_t if self.last_t is None else max(self.last_t, reader.last_t)
        return agent

    def current(self, pid: int) -> tuple[AgentRecording | None, list[TorchSample]]:
        """A process's recording as read so far, and its kept samples (`watch --attach`'s live view);
        (None, []) before its first record."""
        reader = self._files.get(f"agent-{pid}.jsonl")
        if reader is None or isinstance(reader, _Done) or reader.agent is None:
            return None, []
        return reader.agent, reader.samples.points()

    def finish(self) -> tuple[list[AgentRecording], list[str], dict]:
        """(the agents' recordings, notes, how their samples were kept) once the run has ended."""
        self.poll()
        kept = [(name, agent) for name, agent in self._quiet]
        for name, agent, summary in self._cuda:
            kept.append((name, agent))
            if summary["seen"] > summary["kept"]:
                self._summaries[f"agent {agent.pid} samples"] = summary
        for name, reader in sorted(self._files.items()):
            if isinstance(reader, _Done):
                continue
            agent = self._finished(reader)
            if agent is not None:
                kept.append((name, agent))
                summary = reader.samples.summary()
                if summary["seen"] > summary["kept"]:
                    self._summaries[f"agent {agent.pid} samples"] = summary
        self._files.clear()
        notes = []
        if self.dropped:
            notes.append(f"{self.dropped} more processes ran the agent and ended during the run; the "
                         f"recording keeps {MAX_QUIET_AGENTS} of those that never used CUDA and the "
                         f"{MAX_CUDA_AGENTS} that held the most of those that did")
        return [agent for _, agent in sorted(kept, key=lambda k: k[0])], notes, self._summaries


def read_agent_file(path: str, t0: float) -> AgentRecording | None:
    """Parse one agent's JSON-lines file whole (its samples kept as a target's are)."""
    return AgentFile(path, t0).finish()


def read_agents(run_dir: str, t0: float) -> list[AgentRecording]:
    """Combine step over a finished run folder: one recording per process that ran the agent."""
    agents, _, _ = AgentFiles(run_dir, t0, remove_read=False).finish()
    return agents
