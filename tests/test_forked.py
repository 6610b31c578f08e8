"""The holder search's copy of the process (gpumemdoctor/_agent/forked.py): it sees the heap as it
was when it was made, says nothing on the program's output, starts no agent of its own, and is
reaped or killed by the program's agent."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from gpumemdoctor._agent import forked

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")


def test_the_copy_sees_the_heap_as_it_was_and_prints_nothing(capfd):
    kept = ["before"]
    r, w = os.pipe()

    def search():
        print("from the copy")  # goes to /dev/null there
        os.write(w, json.dumps(kept).encode())

    copy = forked.start(search, 5.0)
    kept.append("after")  # the program goes on; the copy's heap is the one of the fork
    assert isinstance(copy, forked.Copy), copy
    while not copy.poll():
        time.sleep(0.01)
    os.close(w)
    assert json.loads(os.read(r, 1000)) == ["before"]
    os.close(r)
    assert copy.status == 0 and copy.pause_s >= 0
    assert "from the copy" not in capfd.readouterr().out


def test_a_copy_past_its_deadline_is_killed():
    copy = forked.start(lambda: time.sleep(30), 0.2)
    assert isinstance(copy, forked.Copy)
    time.sleep(0.3)
    while not copy.poll():
        time.sleep(0.01)
    assert copy.status == -9


def test_no_copy_when_the_fork_would_pause_the_program_too_long(monkeypatch):
    monkeypatch.setattr(forked, "private_bytes", lambda: 64 << 30)
    why = forked.start(lambda: None, 1.0)
    assert isinstance(why, str) and "64.0 GiB" in why and "would pause it for about" in why


def test_the_copy_starts_no_agent_and_leaves_no_trace(tmp_path):
    """In a process with the agent running, the copy runs the interpreter's after-fork hooks (the
    agent's among them) but writes nothing but what its search writes."""
    code = textwrap.dedent("""
        import os, time
        from gpumemdoctor import _agent
        from gpumemdoctor._agent import forked
        _agent.start()
        agent = _agent._agent
        print("buffered once,", end=" ")  # in the buffer of a piped stdout when the copy is made
        copy = forked.start(lambda: agent.channel.write({"type": "note", "from": "copy"}), 5.0)
        while not copy.poll():
            time.sleep(0.01)
        print(copy.status)
    """)
    env = {**os.environ, "GPUMEMDOCTOR_RUN_DIR": str(tmp_path), "GPUMEMDOCTOR_SOCKET": "0"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "buffered once, 0"  # the copy flushed nothing of the program's
    files = sorted(p.name for p in tmp_path.iterdir())
    assert len(files) == 1, files  # one agent file: the copy made none of its own
    lines = [json.loads(x) for x in (tmp_path / files[0]).read_text().splitlines()]
    assert [x["type"] for x in lines].count("hello") == 1
    assert {"type": "note", "from": "copy"} in lines
