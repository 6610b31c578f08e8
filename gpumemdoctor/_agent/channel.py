"""The agent's record file: one JSON line a record, appended to agent-<pid>.jsonl in the run folder.

A plain write that cannot block on a reader and that survives the supervisor dying. The
first failure (disk full, folder gone) ends the recording, never the program.
"""
from __future__ import annotations

import json
import os


class Channel:
    """Where the agent's records go; without a run folder (gpumemdoctor.enable() alone), nowhere."""

    def __init__(self, run_dir: str | None, pid: int):
        self.fd = None
        if run_dir:
            path = os.path.join(run_dir, f"agent-{pid}.jsonl")
            flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)
            self.fd = os.open(path, flags, 0o600)
        self.dead = False

    def write(self, record: dict) -> None:
        if self.dead or self.fd is None:
            return
        try:
            os.write(self.fd, (json.dumps(record, separators=(",", ":")) + "\n").encode())
        except Exception:
            self.dead = True  # disk full, folder gone: stop recording, keep the program

    def write_line(self, text: str) -> None:
        """One record already written as JSON text: what the sampling path uses, since
        json.dumps and a record's dict would come from the program's free lists."""
        if self.dead or self.fd is None:
            return
        try:
            os.write(self.fd, f"{text}\n".encode())
        except Exception:
            self.dead = True
