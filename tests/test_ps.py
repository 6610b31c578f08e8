"""`gpumemdoctor ps`: flags on plain facts, and the real CLI over the NVML test double."""
from __future__ import annotations

import json
import os
from pathlib import Path

from gpumemdoctor.holders import GpuMemory, Holder, busy_gpus, diagnose_holders

DOUBLES = str(Path(__file__).parent / "doubles")
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
    return {"PYTHONPATH": DOUBLES, "GPUMEMDOCTOR_TEST_NVML": str(path)}


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
