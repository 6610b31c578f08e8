"""`run --max-pause`: the longest a search during the run may pause the program (the fork of a copy).
The agent reads it from its environment (contract.ENV_MAX_PAUSE); out of bounds, the default."""
from __future__ import annotations

import subprocess
import sys

import pytest

from gpumemdoctor import contract


@pytest.mark.parametrize("given, used", [(None, 0.02), ("0.05", 0.05), ("0", 0.0), ("2", 0.02), ("nan", 0.02),
                                         ("-1", 0.02), ("x", 0.02)])
def test_the_limit_is_read_from_the_environment_with_bounds(given, used):
    env = {} if given is None else {contract.ENV_MAX_PAUSE: given}
    assert contract.max_pause_from_env(env) == used


def test_the_run_passes_the_limit_to_the_agent_and_the_agent_keeps_it(tmp_path, cli, script):
    script(tmp_path, "t.py", """
        import os
        from gpumemdoctor._agent.search import forked
        print("limit", os.environ["GPUMEMDOCTOR_MAX_PAUSE_S"], forked.MAX_PAUSE_S, forked.MAX_OOM_PAUSE_S)
    """)
    result = cli("run", "--allow-no-gpu", "--max-pause", "0.25", "-o", "r.json", "t.py", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "limit 0.25 0.25 0.25" in result.stdout
    result = cli("run", "--allow-no-gpu", "--force", "-o", "r.json", "t.py", cwd=tmp_path)
    assert "limit 0.02 0.02 0.08" in result.stdout  # the default; an out-of-memory error's search: 80 ms


def test_zero_makes_no_copy_and_says_how_to_allow_one():
    code = ("import os; os.environ['GPUMEMDOCTOR_MAX_PAUSE_S'] = '0'\n"
            "from gpumemdoctor._agent.search import forked\n"
            "why = forked.start(lambda: None, 1.0)\n"
            "print(why['why'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("the limit is 0 ms (run --max-pause)"), out.stdout


@pytest.mark.parametrize("value", ["-0.1", "1.5", "nan", "soon"])
def test_a_limit_out_of_bounds_is_one_line_and_nothing_runs(tmp_path, cli, script, value):
    script(tmp_path, "t.py", "open('ran', 'w').close()\n")
    result = cli("run", "--allow-no-gpu", "--max-pause", value, "t.py", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "--max-pause" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "ran").exists()
