"""The recording of a run whose supervisor died, from the run folder it left (`report --from-run-dir`).

The supervisor writes the run file (RUN_FILE) into the run folder when the target starts;
with it, the agents' files alone make a recording.
"""
from __future__ import annotations

import json
import os

from .. import __version__
from ..system import procs
from ..recording.agent_files import AgentFiles
from ..errors import BadReportError, UsageError
from ..files.inputs import loads_strict, read_json
from ..recording.recording import DEVICE, VERSIONS, ProcessRecord, Recording
from .supervisor import RUN_FILE, RUN_SCHEMA
from ..files.schema import (BOOL, DURATION, PID, SECONDS, STR, WALL, Shape, absent, check_sizes, list_of, need_dict,
                            opt)

MAX_RUN_FILE_BYTES = 16 << 20  # a run file holds the target's arguments and the devices: a few KiB
# What the supervisor writes at the start of a run (supervisor._write_run_file), as read back.
RUN_INFO = Shape({"t0": SECONDS, "started_wall": WALL, "target_args": list_of(STR), "pid": PID, "create_time": opt(WALL),
                  "cwd": opt(STR), "poll_interval_s": DURATION, "measure_gpu": absent(BOOL, False),
                  "versions": absent(VERSIONS, {}), "devices": absent(list_of(DEVICE), []), "host": opt(STR)})


def recover(run_dir: str) -> Recording:
    """The recording of a run whose supervisor died (SIGKILL): from the run folder it left, the
    agents' files alone. No NVML polls of the tree (the NVML figures are the agents' own
    readings), no host memory, no exit status; the processes that had ended and been read
    while the supervisor lived are not in it."""
    path = os.path.join(run_dir, RUN_FILE)
    if not os.path.isdir(run_dir):
        raise UsageError(f"{run_dir} is not a folder")
    info = need_dict(read_json(path, MAX_RUN_FILE_BYTES, "run file",
                               missing=f"{run_dir} is not a gpumemdoctor run folder (it has no {RUN_FILE})"),
                     "run file")
    if info.get("schema") != RUN_SCHEMA:
        raise BadReportError(f"{path} is not a run file (schema {info.get('schema')!r}, expected {RUN_SCHEMA!r})")
    info = RUN_INFO(info, "run file")
    t0, pid, create_time, args = info["t0"], info["pid"], info["create_time"], info["target_args"]
    files = AgentFiles(run_dir, t0, pid, remove_read=False, strict=True)
    try:
        agents, notes, kept = files.finish()
    except BadReportError as exc:
        raise BadReportError(f"{run_dir} is not a valid run folder: {exc}") from None
    nvml_series: dict = {}
    for agent in agents:
        for sample in [*agent.samples, *agent.probes.values()]:
            for r in sample.readings:
                device = agent.device(r.torch_index)
                if device is not None and device.nvml_index is not None and r.nvml_used_bytes is not None:
                    nvml_series.setdefault((agent.pid, device.nvml_index), []).append((sample.t, r.nvml_used_bytes))
    for points in nvml_series.values():
        points.sort()
    # Until the agents' last records, by the times they hold (the run's clock, t0 its start), not by
    # their files' modification times: a copy or a `touch` changes those.
    started_wall = info["started_wall"]
    running = procs.same_process(pid, create_time)
    note = (f"recovered from the run folder {run_dir}: gpumemdoctor's supervisor ended before the target, so "
            "this report rests on the agents' files alone: NVML figures are the agents' own readings, and "
            "there is no host memory and no exit status")
    if running:
        note += f"; the target (PID {pid}) is still running: recover again once it has ended for the whole run"
    versions = info["versions"]
    for agent in agents:
        if agent.torch_version:
            versions.setdefault("torch", agent.torch_version)
    recording = Recording(
        tool_version=__version__,
        target={"argv": args, "pid": pid, "exit_code": None, "signal": None, "cwd": info["cwd"],
                "recovered_from": run_dir},
        started_wall=started_wall, duration_s=round(max(0.0, files.last_t or 0.0), 6),
        poll_interval_s=info["poll_interval_s"], nvml_available=info["measure_gpu"], versions=versions,
        devices=info["devices"],
        nvml=nvml_series,
        processes=[ProcessRecord(pid=pid, ppid=None, cmdline=None, create_time=create_time, is_target=True,
                                 first_seen_t=0.0, alive_after_exit=False)],
        agents=agents, notes=[note, *notes], downsampling=kept, host=info["host"])
    # What the agents' files hold is read leniently, line by line; the report made of it must be one
    # that `report` reads back, so it goes through the same strict reading as a saved report.
    try:
        document = loads_strict(json.dumps(recording.to_json()))
        check_sizes(document, "recording")
        return Recording.from_json(document)
    except (BadReportError, ValueError) as exc:
        raise BadReportError(f"{run_dir} is not a valid run folder: {exc}") from None
