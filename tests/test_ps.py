"""`gpumemdoctor ps`: flags on plain facts, and the real CLI over the NVML test double."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from gpumemdoctor.live.ps import GpuMemory, Holder, busy_gpus, diagnose_holders

DOUBLES = str(Path(__file__).parent / "doubles")
# The test double first, then whatever PYTHONPATH the tests run under (it may name the
# checkout under test, ahead of an installed gpumemdoctor).
DOUBLES_PATH = os.pathsep.join(filter(None, [DOUBLES, os.environ.get("PYTHONPATH")]))
MIB = 1 << 20
GIB = 1 << 30


def gpu(holders, used, reserved=480 * MIB) -> GpuMemory:
    return GpuMemory(index=0, uuid="GPU-0", name="test", total_bytes=80 * GIB, used_bytes=used,
                     free_bytes=80 * GIB - used, reserved_bytes=reserved, holders=holders)


def flags_of(h: Holder) -> list[str]:
    return [f["flag"] for f in diagnose_holders([gpu([h], h.used_bytes or 0)])[0].holders[0].flags]


def test_flags_on_plain_facts():
    assert flags_of(Holder(pid=7, used_bytes=GIB, visible=False)) == ["not-in-this-namespace"]
    assert flags_of(Holder(pid=7, used_bytes=GIB, visible=True, status="zombie", ppid=5)) == ["zombie"]
    assert flags_of(Holder(pid=7, used_bytes=GIB, visible=True, status="sleeping", ppid=1,
                           session_leader=False)) == ["orphaned"]
    # a daemon started on purpose leads its own session
    assert flags_of(Holder(pid=7, used_bytes=GIB, visible=True, status="sleeping", ppid=1,
                           session_leader=True)) == []
    # in PID 1's session: PID 1 started it (a container's first process, a PID namespace's shell)
    assert flags_of(Holder(pid=7, used_bytes=GIB, visible=True, status="sleeping", ppid=1,
                           session_leader=False, in_init_session=True)) == []
    assert flags_of(Holder(pid=7, used_bytes=GIB, visible=True, status="sleeping", ppid=1,
                           session_leader=False, in_init_session=False)) == ["orphaned"]
    assert flags_of(Holder(pid=7, used_bytes=GIB, visible=True, status="running", ppid=3)) == []


def test_unaccounted_needs_memory_info_v2():
    v2 = diagnose_holders([gpu([Holder(pid=1, used_bytes=GIB, visible=True)], used=3 * GIB)])[0]
    assert v2.unaccounted_bytes == 2 * GIB and [f["flag"] for f in v2.flags] == ["unaccounted"]
    v1 = diagnose_holders([gpu([Holder(pid=1, used_bytes=GIB, visible=True)], used=3 * GIB, reserved=None)])[0]
    assert v1.unaccounted_bytes is None and v1.flags == []
    small = diagnose_holders([gpu([Holder(pid=1, used_bytes=GIB, visible=True)], used=GIB + 10 * MIB)])[0]
    assert small.flags == []


def test_busy_counts_processes_and_unaccounted():
    g = diagnose_holders([gpu([Holder(pid=1, used_bytes=GIB, visible=True)], used=3 * GIB)])
    assert busy_gpus(g, 0) == [(0, 3 * GIB)]
    assert busy_gpus(g, 3 * GIB) == []


def _state(tmp_path, processes, used, reserved=0):
    path = tmp_path / "nvml.json"
    path.write_text(json.dumps({"gpus": [{"uuid": "GPU-test-0", "name": "NVML test double GPU",
                                          "total": 80 * GIB, "used": used, "reserved": reserved,
                                          "processes": processes}]}))
    return {"PYTHONPATH": DOUBLES_PATH, "GPUMEMDOCTOR_TEST_NVML": str(path)}


def test_ps_over_the_nvml_double(cli, tmp_path):
    me = os.getpid()
    env = _state(tmp_path, [{"pid": me, "used": GIB}, {"pid": 4_000_000, "used": 2 * GIB}],
                 used=4 * GIB, reserved=480 * MIB)
    result = cli("ps", "--json", cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    (g,) = json.loads(result.stdout)["gpus"]
    holders = {h["pid"]: h for h in g["holders"]}
    assert holders[me]["visible"] and holders[me]["cmdline"] and holders[me]["agent"] is False
    assert [f["flag"] for f in holders[4_000_000]["flags"]] == ["not-in-this-namespace"]
    assert g["unaccounted_bytes"] == GIB and g["reserved_bytes"] == 480 * MIB
    text = cli("ps", cwd=tmp_path, env=env)
    assert text.returncode == 0 and "not-in-this-namespace" in text.stdout and "unaccounted: 1.00 GiB" in text.stdout


def test_expect_free(cli, tmp_path):
    busy = _state(tmp_path, [{"pid": os.getpid(), "used": GIB}], used=GIB)
    result = cli("ps", "--expect-free", cwd=tmp_path, env=busy)
    assert result.returncode == 11 and "GPU 0 holds 1.00 GiB" in result.stderr
    assert cli("ps", "--expect-free", "2GiB", cwd=tmp_path, env=busy).returncode == 0
    idle = _state(tmp_path, [], used=0)
    assert cli("ps", "--expect-free", cwd=tmp_path, env=idle).returncode == 0


def test_ps_without_nvml_is_exit_3_in_one_line(cli, tmp_path):
    result = cli("ps", cwd=tmp_path)
    assert result.returncode == 3
    assert result.stderr.startswith("gpumemdoctor: error: NVML") and "--allow-no-gpu" not in result.stderr


# A stand-in for torchrun (a file named torchrun, run by python, as the console script is): two
# ranks with torchrun's variables in their environment, each with a worker, and with
# OTHER_USER=1 a third child that runs as the user nobody (its environment is not ours to read).
FAKE_TORCHRUN = r'''
import json, os, subprocess, sys, time
RANK = "import subprocess, sys, time; w = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); print(w.pid, flush=True); time.sleep(120)"
ranks = []
for r in range(2):
    env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2", TORCHELASTIC_RUN_ID="test-run")
    ranks.append(subprocess.Popen([sys.executable, "-c", RANK], env=env, stdout=subprocess.PIPE, text=True))
workers = [int(p.stdout.readline()) for p in ranks]
other = None
if os.environ.get("OTHER_USER") == "1":
    other = subprocess.Popen(["sleep", "120"], user=65534, env=dict(os.environ, RANK="2")).pid
print(json.dumps({"launcher": os.getpid(), "ranks": [p.pid for p in ranks], "workers": workers,
                  "other": other}), flush=True)
time.sleep(120)
'''


@pytest.fixture
def fake_job(tmp_path):
    """Start the fake torchrun; yields a function that starts it and returns its PIDs."""
    started = []

    def start(other_user: bool = False) -> dict:
        launcher = tmp_path / "torchrun"
        launcher.write_text(FAKE_TORCHRUN)
        env = dict(os.environ, OTHER_USER="1" if other_user else "0")
        proc = subprocess.Popen([sys.executable, str(launcher), "--nproc-per-node", "2", "train.py"],
                                stdout=subprocess.PIPE, text=True, env=env)
        started.append(proc)
        return json.loads(proc.stdout.readline())

    yield start
    for proc in started:
        try:
            tree = psutil.Process(proc.pid).children(recursive=True)
        except psutil.Error:
            tree = []
        for p in [*tree, proc]:
            try:
                p.kill()
            except psutil.Error:
                pass
        proc.wait()
        proc.stdout.close()


def _gpus_state(tmp_path, per_gpu: list[list[tuple[int, int]]]) -> dict:
    path = tmp_path / "nvml.json"
    path.write_text(json.dumps({"gpus": [
        {"uuid": f"GPU-test-{i}", "name": "NVML test double GPU", "total": 80 * GIB,
         "used": sum(u for _, u in procs), "reserved": 0,
         "processes": [{"pid": pid, "used": used} for pid, used in procs]}
        for i, procs in enumerate(per_gpu)]}))
    return {"PYTHONPATH": DOUBLES_PATH, "GPUMEMDOCTOR_TEST_NVML": str(path)}


def test_ps_groups_a_job(cli, tmp_path, fake_job):
    job = fake_job()
    (r0, r1), (w0, w1) = job["ranks"], job["workers"]
    env = _gpus_state(tmp_path, [[(r0, 20 * GIB), (r1, 512 * MIB), (w0, 500 * MIB), (os.getpid(), GIB)],
                                 [(r1, 19 * GIB)]])
    result = cli("ps", "--json", cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    listed = json.loads(result.stdout)
    assert listed["schema"] == "gpumemdoctor.ps/1"
    # the per-GPU view is as it was: every holder, the job's included
    assert [h["pid"] for h in listed["gpus"][0]["holders"]] == [r0, r1, w0, os.getpid()]
    (j,) = listed["jobs"]  # the test process itself is in no job
    assert j["launcher"]["pid"] == job["launcher"] and j["launcher_kind"] == "torchrun"
    assert j["launcher"]["cmdline"][1].endswith("torchrun")
    assert (j["run_id"], j["world_size"]) == ("test-run", 2)
    assert [(r["rank"], r["local_rank"], r["pid"]) for r in j["ranks"]] == [(0, 0, r0), (1, 1, r1)]
    assert j["ranks"][0]["gpus"] == [{"index": 0, "used_bytes": 20 * GIB}]
    assert [w["pid"] for w in j["ranks"][0]["workers"]] == [w0]
    assert j["ranks"][1]["workers"] == [] and j["ranks"][1]["quiet_descendants"] == [w1]
    assert j["ranks"][1]["gpus"] == [{"index": 0, "used_bytes": 512 * MIB}, {"index": 1, "used_bytes": 19 * GIB}]
    assert j["gpus"] == [{"index": 0, "used_bytes": 20 * GIB + 512 * MIB + 500 * MIB},
                         {"index": 1, "used_bytes": 19 * GIB}]
    assert j["ranks"][0]["flags"] == [] and [f["flag"] for f in j["ranks"][1]["flags"]] == ["stray-context"]
    assert {k: j["ranks"][1]["flags"][0][k] for k in ("pid", "rank", "gpu", "bytes")} == {
        "pid": r1, "rank": 1, "gpu": 0, "bytes": 512 * MIB}

    text = cli("ps", cwd=tmp_path, env=env | {"COLUMNS": "100"})
    assert text.returncode == 0, text.stderr
    out = text.stdout
    assert f"Job: torchrun, launcher PID {job['launcher']}, run test-run, world size 2" in out
    assert re.search(rf"^0\s+0\s+{r0}\s+GPU 0 20\.0 GiB\s", out, re.M)
    assert re.search(rf"^  worker\s+{w0}\s+GPU 0 500 MiB\s", out, re.M)
    assert re.search(rf"^1\s+1\s+{r1}\s+GPU 0 512 MiB, GPU 1 19\.0 GiB\s", out, re.M)
    assert re.search(r"^  \+1 more\s+none\s+\(under this rank\)", out, re.M)
    assert "job total: GPU 0 21.0 GiB, GPU 1 19.0 GiB" in out
    assert f"stray-context: rank 1 (PID {r1}) holds 512 MiB on GPU 0, the GPU of rank 0 (PID {r0})" in out


def test_ps_without_a_job_shows_no_job(cli, tmp_path):
    env = _gpus_state(tmp_path, [[(os.getpid(), GIB)]])
    result = cli("ps", "--json", cwd=tmp_path, env=env)
    assert result.returncode == 0 and json.loads(result.stdout)["jobs"] == []
    assert "Job" not in cli("ps", cwd=tmp_path, env=env).stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="starting a process as another user needs root")
def test_another_users_environment_is_not_read(cli, tmp_path, fake_job):
    job = fake_job(other_user=True)
    other = job["other"]
    assert psutil.Process(other).environ().get("RANK") == "2"  # root could read it; ps must not
    env = _gpus_state(tmp_path, [[(job["ranks"][0], GIB), (other, GIB)]])
    result = cli("ps", "--json", cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    (j,) = json.loads(result.stdout)["jobs"]
    ranks = {r["pid"]: r for r in j["ranks"]}
    # nobody's process is a rank of the job (the launcher's child), of unknown number
    assert ranks[other]["rank"] is None and ranks[other]["local_rank"] is None
    assert ranks[job["ranks"][0]]["rank"] == 0
    holders = {h["pid"]: h for h in json.loads(result.stdout)["gpus"][0]["holders"]}
    assert holders[other]["agent"] is None and holders[other]["user"] == "nobody"
    text = cli("ps", cwd=tmp_path, env=env | {"COLUMNS": "100"}).stdout
    assert re.search(rf"^\?\s+\?\s+{other}\s+GPU 0 1\.00 GiB\s+sleep 120", text, re.M)


# PID 1 of a new PID namespace (as a container's first process is), over the NVML test double: a
# child it started itself, and a real orphan, whose parent (in a session of its own) started it
# and exited. `ps` runs inside the namespace, where NVML (the double) lists the namespace's PIDs.
NAMESPACE_INIT = r"""
import json, os, subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
# (the orphan must not keep the parent's stdout: run() waits for the pipe to close)
parent = subprocess.run([sys.executable, "-c", "import subprocess, sys; print(subprocess.Popen("
                         "[sys.executable, '-c', 'import time; time.sleep(60)'], stdout=subprocess.DEVNULL, "
                         "stderr=subprocess.DEVNULL).pid)"], capture_output=True, text=True, start_new_session=True)
orphan = int(parent.stdout)
with open(sys.argv[1], "w") as f:
    json.dump({"gpus": [{"uuid": "GPU-test-0", "name": "NVML test double GPU", "total": 80 << 30,
                         "used": 2 << 30, "reserved": 0, "processes": [{"pid": child.pid, "used": 1 << 30},
                                                                        {"pid": orphan, "used": 1 << 30}]}]}, f)
ps = subprocess.run([sys.executable, "-m", "gpumemdoctor", "ps", "--json"], capture_output=True, text=True)
print(json.dumps({"me": os.getpid(), "child": child.pid, "orphan": orphan, "code": ps.returncode,
                  "out": ps.stdout, "err": ps.stderr}))
"""


def _can_unshare() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _can_unshare(), reason="a PID namespace needs root and unshare")
def test_ps_in_a_pid_namespace_flags_only_the_real_orphan(tmp_path, cli_env):
    """A process whose parent is the namespace's PID 1 is no orphan when PID 1 started it (issue 28,
    row 12); one whose own parent is gone still is. tests/gpu/pidns_check.sh does this on a GPU."""
    env = cli_env({"PYTHONPATH": DOUBLES_PATH, "GPUMEMDOCTOR_TEST_NVML": str(tmp_path / "nvml.json")})
    result = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", NAMESPACE_INIT,
                             str(tmp_path / "nvml.json")], capture_output=True, text=True, timeout=120, env=env,
                            cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert found["me"] == 1 and found["code"] == 0, found["err"]
    holders = {h["pid"]: h for h in json.loads(found["out"])["gpus"][0]["holders"]}
    child, orphan = holders[found["child"]], holders[found["orphan"]]
    assert child["ppid"] == 1 and orphan["ppid"] == 1  # both have PID 1 as their parent now
    assert child["flags"] == []
    assert [f["flag"] for f in orphan["flags"]] == ["orphaned"]
