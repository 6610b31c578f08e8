"""The agent inside real target processes, without a GPU: start-up, children, torch's import."""
from __future__ import annotations

import json
import sys


def report_of(tmp_path) -> dict:
    (path,) = tmp_path.glob("gpumemdoctor-*.json")
    return json.loads(path.read_text())


def test_agent_starts_once_even_when_started_again(cli, script, tmp_path):
    script(tmp_path, "t.py", """
        from gpumemdoctor import _agent
        _agent.start()
        _agent.start()
        import gpumemdoctor
        gpumemdoctor.step()
        print("ok")
    """)
    result = cli("run", "--allow-no-gpu", "t.py", cwd=tmp_path)
    assert result.returncode == 0 and result.stdout == "ok\n"
    agents = report_of(tmp_path)["recording"]["agents"]
    assert len(agents) == 1 and agents[0]["explicit_steps"] is True


def test_each_python_child_gets_its_own_recording(cli, script, tmp_path):
    script(tmp_path, "t.py", """
        import multiprocessing as mp, os, subprocess, sys

        def work(q):
            q.put(os.getpid())

        if __name__ == "__main__":
            ctx = mp.get_context("spawn")
            q = ctx.Queue()
            p = ctx.Process(target=work, args=(q,))
            p.start(); spawned = q.get(); p.join()
            pid = os.fork()
            if pid == 0:
                os._exit(0)
            os.waitpid(pid, 0)
            subprocess.run([sys.executable, "-c", "pass"], check=True)
            print(spawned, pid)
    """)
    result = cli("run", "--allow-no-gpu", "t.py", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    spawned, forked = map(int, result.stdout.split())
    agents = {a["pid"]: a for a in report_of(tmp_path)["recording"]["agents"]}
    assert spawned in agents and forked in agents
    assert agents[forked]["forked_from"] == report_of(tmp_path)["target"]["pid"]
    assert len(agents) >= 4  # the target, the spawned worker, the fork, the subprocess


def test_a_sitecustomize_of_the_users_still_runs(cli, script, tmp_path, cli_env):
    site = tmp_path / "site"
    script(site, "sitecustomize.py", """
        import builtins
        builtins.USER_SITECUSTOMIZE_RAN = True
    """)
    script(tmp_path, "t.py", """
        import builtins
        print(getattr(builtins, "USER_SITECUSTOMIZE_RAN", False))
    """)
    result = cli("run", "--allow-no-gpu", "t.py", cwd=tmp_path, env={"PYTHONPATH": str(site)})
    assert result.returncode == 0, result.stderr
    assert result.stdout == "True\n"


def test_agent_survives_its_run_folder_vanishing(cli, script, tmp_path):
    script(tmp_path, "t.py", """
        import os, shutil
        shutil.rmtree(os.environ["GPUMEMDOCTOR_RUN_DIR"])
        import gpumemdoctor
        for _ in range(3):
            gpumemdoctor.step()
        print("still running")
    """)
    result = cli("run", "--allow-no-gpu", "t.py", cwd=tmp_path)
    assert result.returncode == 0 and result.stdout == "still running\n"
    assert "Traceback" not in result.stderr


def test_step_outside_a_run_does_nothing(tmp_path):
    import subprocess
    out = subprocess.run([sys.executable, "-c", "import gpumemdoctor; gpumemdoctor.step(); print('ok')"],
                         capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"}, cwd=tmp_path)
    assert out.returncode == 0 and out.stdout == "ok\n"


def test_device_ids_spell_the_pci_bus_id_as_nvml_does():
    """On the H200 of 2026-11-21 NVML said busId 00000000:00:06.0 for the device whose torch
    properties had pci_domain_id 0, pci_bus_id 0, pci_device_id 6 (NOTES.md's probe)."""
    from gpumemdoctor.system.nvml import torch_device_ids as device_ids

    class Props:
        uuid = "43ff4d40-4cf2-6692-c614-5e3ca76b49ac"
        pci_domain_id, pci_bus_id, pci_device_id = 0, 0, 6

    assert device_ids(Props()) == ("43ff4d40-4cf2-6692-c614-5e3ca76b49ac", "00000000:00:06.0")


def test_many_short_lived_children_keep_the_recording_bounded(cli, script, tmp_path):
    """Forked workers leave through os._exit, without their agent's exit line: once gone, their
    files are complete. The recording keeps a bounded number of them and says how many more."""
    from gpumemdoctor.recording.agent_files import MAX_QUIET_AGENTS

    script(tmp_path, "t.py", """
        import os
        for _ in range(50):
            pid = os.fork()
            if pid == 0:
                os._exit(0)
            os.waitpid(pid, 0)
        print("forked")
    """)
    result = cli("run", "--allow-no-gpu", "t.py", cwd=tmp_path)
    assert result.returncode == 0 and result.stdout == "forked\n", result.stderr
    report = report_of(tmp_path)
    agents = report["recording"]["agents"]
    assert len(agents) == MAX_QUIET_AGENTS + 1  # the target, and the first children
    assert any(a["pid"] == report["target"]["pid"] for a in agents)
    assert any(n.startswith(f"{50 - MAX_QUIET_AGENTS} more processes ran the agent") for n in report["notes"])


# -- the rank of a process, from its launcher's variables ------------------------------------------

def test_the_hello_names_the_rank_from_torchruns_variables(cli, script, tmp_path):
    script(tmp_path, "t.py", "print('ok')\n")
    env = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0",
           "TORCHELASTIC_RUN_ID": "job-7"}
    result = cli("run", "--allow-no-gpu", "-o", "r.json", "t.py", cwd=tmp_path, env=env)
    assert result.returncode == 0 and result.stdout == "ok\n", result.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    (agent,) = report["recording"]["agents"]
    assert agent["dist"] == {"rank": 1, "local_rank": 1, "world_size": 2, "local_world_size": 2, "node_rank": 0,
                             "run_id": "job-7", "source": "torch"}
    assert report["recording"]["host"]
    # the target is the rank: a row without a GPU (none was measured), and the job
    assert [(r["rank"], r["local_rank"], r["device"]) for r in report["ranks"]] == [(1, 1, None)]
    assert report["job"]["ranks"] == [1] and report["job"]["missing_ranks"] == [0]


def test_without_a_launchers_variables_the_hello_has_no_rank(cli, script, tmp_path):
    script(tmp_path, "t.py", "print('ok')\n")
    result = cli("run", "--allow-no-gpu", "t.py", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    report = report_of(tmp_path)
    assert report["recording"]["agents"][0]["dist"] is None
    assert report["ranks"] == [] and report["job"] is None


def test_a_launcher_and_its_ranks_a_parent_and_its_worker(cli, script, tmp_path):
    """A torchrun-like launcher (no rank) starts two ranks; rank 1 starts a helper that inherits its
    variables. The ranks are the two, not the launcher and not the helper."""
    script(tmp_path, "t.py", """
        import os, subprocess, sys
        helper = "import subprocess, sys; subprocess.run([sys.executable, '-c', 'pass'], check=True)"
        ranks = [subprocess.Popen([sys.executable, "-c", helper],
                                  env={**os.environ, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2"})
                 for r in (0, 1)]
        print(sorted(p.pid for p in ranks), [p.wait() for p in ranks])
    """)
    result = cli("run", "--allow-no-gpu", "t.py", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    report = report_of(tmp_path)
    agents = report["recording"]["agents"]
    assert len(agents) == 5  # the launcher, two ranks, a helper of each
    assert sum(a["dist"] is not None for a in agents) == 4
    rows = report["ranks"]
    assert sorted(r["rank"] for r in rows) == [0, 1]
    assert sorted(r["pid"] for r in rows) == json.loads(result.stdout.split("]")[0] + "]")
    assert report["job"]["summary"].startswith("2 ranks on 1 host")


def test_dist_from_env_reads_one_launchers_variables_strictly():
    from gpumemdoctor._agent.startup import dist_from_env

    assert dist_from_env({}) is None
    assert dist_from_env({"WORLD_SIZE": "2"}) is None  # no rank variable: not a rank
    assert dist_from_env({"RANK": "3", "WORLD_SIZE": "x", "LOCAL_RANK": "+1", "GROUP_RANK": "1.0"}) == {
        "rank": 3, "local_rank": None, "world_size": None, "local_world_size": None, "node_rank": None,
        "run_id": None, "source": "torch"}
    # torchrun under srun: torchrun's own variables are the process's; the node from Slurm
    assert dist_from_env({"RANK": "5", "LOCAL_RANK": "1", "SLURM_PROCID": "2", "SLURM_LOCALID": "0",
                          "SLURM_NODEID": "2", "SLURM_JOB_ID": "991"}) == {
        "rank": 5, "local_rank": 1, "world_size": None, "local_world_size": None, "node_rank": 2,
        "run_id": "991", "source": "torch"}
    assert dist_from_env({"SLURM_PROCID": "7", "SLURM_LOCALID": "3", "SLURM_NTASKS": "8",
                          "SLURM_NTASKS_PER_NODE": "4", "SLURM_NODEID": "1"})["source"] == "slurm"
    mpi = dist_from_env({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
                         "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "SLURM_PROCID": "0"})
    assert (mpi["rank"], mpi["local_rank"], mpi["world_size"], mpi["source"]) == (2, 0, 4, "openmpi")
    assert dist_from_env({"SLURM_PROCID": "٣"})["rank"] is None  # a digit, but not an ASCII one
