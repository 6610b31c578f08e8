"""The agent times what it costs the program where the program waits for it: its own start in the
program's interpreter (`bootstrap_s`), and the whole of each step's end, all its parts together
(`step_pause_max_s`, issue 40's 10 ms per step)."""
from __future__ import annotations

import json
import time

from gpumemdoctor._agent.core import Agent


def test_a_steps_pause_is_all_of_the_agents_work_at_its_end(tmp_path):
    agent = Agent(str(tmp_path), 0.0)
    agent.on_step(False)
    first = agent.shared.cost["step_pause_max_s"]
    assert agent.shared.cost["step_pause_max_step"] == 1 and 0 < first < 0.5
    agent.forward_watch.state = 1  # (a part that does its work at this step's end)
    agent.forward_watch.at_step = lambda spent_s: time.sleep(0.03)
    agent.on_step(False)
    assert agent.shared.cost["step_pause_max_s"] >= 0.03 and agent.shared.cost["step_pause_max_step"] == 2
    agent.forward_watch.at_step = lambda spent_s: None
    agent.on_step(False)  # a shorter step keeps the longest
    assert agent.shared.cost["step_pause_max_s"] >= 0.03 and agent.shared.cost["step_pause_max_step"] == 2
    agent.forward_watch.at_step = lambda spent_s: 1 / 0  # a part that fails is still timed, and never raises
    agent.on_step(False)
    assert agent.shared.steps == 4


def test_the_agent_times_its_own_start_in_the_program(cli, script, tmp_path):
    script(tmp_path, "t.py", "print('hello')\n")
    result = cli("run", "--allow-no-gpu", "t.py", cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr
    (path,) = tmp_path.glob("gpumemdoctor-*.json")
    (agent,) = json.loads(path.read_text())["recording"]["agents"]
    cost = agent["exit_info"]["cost"]
    assert 0 < cost["bootstrap_s"] < 5  # the agent's import and start, timed from the bootstrap
    assert cost["step_pause_max_s"] == 0 and cost["step_pause_max_step"] == 0  # no step was made
