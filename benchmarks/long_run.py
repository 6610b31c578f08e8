"""A day of a training run through the real agent and supervisor code, in minutes, on a CPU.

    python benchmarks/long_run.py [--hours 24] [--json PATH]

Nothing here needs a GPU or waits a day. The figures of the run are SYNTHETIC: a
training loop at 10 steps a second whose live tensors grow 0.1 MiB a minute (a slow
leak, 144 MiB a day) under 0-300 MiB of activations (seven batch shapes in turn), with a 20 GiB spike for three
seconds at hour 12; its NVML figure is reserved memory plus a 520 MiB context, and moves
at every NVML poll (the worst case for the supervisor: a point per poll). What runs on
them is the real code:

1. The agent (this process): a real `gpumemdoctor._agent.core.Agent` over the torch test
   double (tests/doubles/fake_cuda.py), its clock replaced by one this script advances
   0.1 s a step. Every step goes through `on_step` (the optimizer hook's path): samples,
   JSON lines, the online floor check, growth suspected, --trace auto's window, the exit
   probes. Measured: the time of each `on_step` call (real time, perf_counter) in the
   first simulated minute and the last, and every hour; the agent file's size; this
   process's RSS.
2. The supervisor (a child process of its own, so that its RSS is its own): the real
   `tree.TreeWatch` (tree refreshes every 0.5 s and host RSS reads every 0.2 s of
   simulated time, on itself; psutil's scan of the whole process table for the tree, 3 ms
   a time on the machine of the first run, is measured once and then answered in-process:
   the target has no children) polling an in-process NVML stand-in every 50 ms
   of simulated time (1.7 million polls; a real 5 ms poll of a figure that changes at
   every poll gives ten times more points, into the same bounded series), and the real
   `combine.AgentFiles` reading the agent's file once a simulated second as it grows
   (phase 1's lines are appended as the simulated clock passes them). Then the real
   `tree.collect`, `diagnose`, `report.build` and `report.write`. Measured: the
   supervisor's RSS every simulated hour and its peak, the time to collect, diagnose and
   write, the report's size, the verdict and the leak rate it found.

Writes the figures as JSON (--json), and prints them.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from types import SimpleNamespace

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(HERE)
sys.path[:0] = [REPO_ROOT, os.path.join(REPO_ROOT, "tests", "doubles")]

MIB = 1 << 20
STEP_S = 0.1
LEAK_PER_S = 0.1 * MIB / 60
CONTEXT = 520 * MIB
SPIKE = 20 << 30
T0 = 1000.0  # both stand-in clocks start here: the agent's times are the supervisor's


def allocated_at(step: int, rng: random.Random, hours: float) -> int:
    """1 GiB of weights and optimizer state, the leak, and activations that depend on the
    batch (seven shapes in turn, 0-300 MiB) with 2 MiB of jitter."""
    t = step * STEP_S
    spike = SPIKE if abs(t - hours * 3600 / 2) < 1.5 else 0
    activations = (step % 7) * 50 * MIB + int(rng.uniform(0, 2) * MIB)
    return (1 << 30) + int(LEAK_PER_S * t) + activations + spike


def reserved_for(allocated: int, reserved: int) -> int:
    """The allocator's cache: grows to what was asked, never gives back (no empty_cache)."""
    return max(reserved, allocated + 64 * MIB)


def rss_of_self() -> int:
    import psutil

    return psutil.Process().memory_info().rss


# -- phase 1: the agent -------------------------------------------------------------------

def agent_phase(hours: float, run_dir: str) -> dict:
    import fake_cuda

    agent, clock = fake_cuda.make_agent(run_dir, context_bytes=CONTEXT)
    clock.now = T0
    write = agent.shared.channel.write
    write({"type": "hello", "pid": agent.shared.pid, "ppid": os.getppid(), "t": T0, "argv": ["train.py"],
           "python": platform.python_version()})
    write({"type": "torch", "t": T0, "version": agent.shared.torch.__version__})
    write({"type": "cuda", "t": T0})
    write({"type": "devices", "t": T0, "allocator_backend": "native", "devices": [
        {"index": 0, "uuid": "GPU-synthetic", "pci_bus_id": None, "name": "synthetic", "nvml_index": 0}]})
    rng = random.Random(24)
    steps = int(hours * 3600 / STEP_S)
    per_minute = int(60 / STEP_S)
    windows: dict[int, dict] = {}  # first step of a timed minute -> ns of each on_step, by kind
    hourly: dict[int, dict] = {}  # first step of a timed minute -> median us, by kind
    timed = {0, steps - per_minute} | {h * 36_000 for h in range(1, int(hours))}
    rss = {}
    reserved = 0
    started = time.perf_counter()
    for step in range(steps):
        clock.now = T0 + (step + 1) * STEP_S
        allocated = allocated_at(step, rng, hours)
        reserved = reserved_for(allocated, reserved)
        agent.shared.torch.set(allocated, reserved)
        start_of_minute = step - step % per_minute
        if start_of_minute in timed:
            samples = agent.sampler.samples
            before = time.perf_counter_ns()
            agent.on_step(explicit=True)
            spent = time.perf_counter_ns() - before
            window = windows.setdefault(start_of_minute, {"all": [], "sampling": [], "plain": []})
            window["all"].append(spent)
            window["sampling" if agent.sampler.samples > samples else "plain"].append(spent)
            if step == start_of_minute + per_minute - 1 and start_of_minute not in (0, steps - per_minute):
                hourly[start_of_minute] = {kind: round(statistics.median(ns) / 1e3, 3)
                                           for kind, ns in window.items() if ns}
                del windows[start_of_minute]  # only the medians of the hours in between are kept
        else:
            agent.on_step(explicit=True)
        if step % 36_000 == 0:
            rss[round(step * STEP_S / 3600, 1)] = rss_of_self()
    wall = time.perf_counter() - started
    clock.now += 1
    agent.shared.torch.set((1 << 30) + int(LEAK_PER_S * steps * STEP_S), reserved)  # at exit: weights and the leak
    exit_started = time.perf_counter()
    agent.at_exit()
    exit_s = time.perf_counter() - exit_started
    rss[round(hours, 1)] = rss_of_self()
    fake_cuda.restore_clock()
    path = os.path.join(run_dir, f"agent-{agent.shared.pid}.jsonl")

    def summary(window: dict) -> dict:
        out = {}
        for kind, ns in window.items():
            if ns:
                out[kind] = {"steps": len(ns), "mean_us": round(statistics.fmean(ns) / 1e3, 3),
                             "median_us": round(statistics.median(ns) / 1e3, 3),
                             "p99_us": round(sorted(ns)[int(len(ns) * 0.99)] / 1e3, 3),
                             "max_us": round(max(ns) / 1e3, 3)}
        return out

    first, last = windows[0], windows[steps - per_minute]
    with open(path, "rb") as f:
        lines = sum(1 for _ in f)
    return {
        "steps": steps, "wall_s": round(wall, 3), "exit_probes_s": round(exit_s, 3),
        "step_cost_first_minute": summary(first), "step_cost_last_minute": summary(last),
        "step_cost_median_us_by_hour": {str(round(k * STEP_S / 3600, 1)): v for k, v in sorted(
            {**hourly, **{k: {kind: round(statistics.median(ns) / 1e3, 3) for kind, ns in w.items() if ns}
                          for k, w in windows.items()}}.items())},
        "samples": agent.sampler.samples, "sampling_interval_s_at_end": agent.sampler.interval_s,
        "file_bytes": os.path.getsize(path), "file_lines": lines,
        "suspected_growth": agent.growth_watch.suspected,
        "history_calls": [c["enabled"] for c in agent.shared.torch.cuda.memory.history_calls],
        "window_costs_us": {k: round(v, 3) for k, v in agent.sampler.cost.windows().items()},
        "process_rss_bytes_by_hour": {str(k): v for k, v in rss.items()},
        "agent_file": path, "agent_pid": agent.shared.pid,
    }


# -- phase 2: the supervisor --------------------------------------------------------------

class _Feed:
    """Appends the agent's lines to the run folder as the simulated clock passes their times."""

    def __init__(self, source: str, dest: str, pid: int):
        self._source = open(source, "rb")
        self._dest = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._pid = pid
        self._pending: bytes | None = None

    def until(self, now: float) -> None:
        while True:
            line = self._pending if self._pending is not None else self._source.readline()
            self._pending = None
            if not line:
                return
            rec = json.loads(line)
            if rec.get("t") is not None and rec["t"] > now:
                self._pending = line
                return
            if rec.get("type") == "hello":
                rec["pid"] = self._pid  # the target is this process, for psutil and host RSS
                line = (json.dumps(rec) + "\n").encode()
            os.write(self._dest, line)

    def close(self) -> None:
        self.until(float("inf"))
        self._source.close()
        os.close(self._dest)


def supervisor_phase(hours: float, agent_file: str, poll_s: float) -> dict:
    from gpumemdoctor.system import nvml, procs
    from gpumemdoctor.supervise import supervisor, tree
    from gpumemdoctor.recording.agent_files import AgentFiles
    from gpumemdoctor.diagnosis.diagnose import diagnose
    from gpumemdoctor.app.report_file import build, write

    rss_start = rss_of_self()
    clock = SimpleNamespace(now=T0)
    tree.time = SimpleNamespace(monotonic=lambda: clock.now, sleep=time.sleep, time=time.time)
    pid = os.getpid()
    rng = random.Random(24)
    reserved = {"now": 0}

    def processes(device, strict=False):  # the NVML stand-in: this process, reserved + context
        step = int((clock.now - T0) / STEP_S)
        reserved["now"] = reserved_for(allocated_at(step, rng, hours), reserved["now"])
        reserved["polls"] = reserved.get("polls", 0) + 1
        return [(pid, reserved["now"] + CONTEXT + (reserved["polls"] % 2) * MIB)]  # moves at every poll

    def memory_info(device):  # the whole GPU: this process is all that is on it
        used = reserved["now"] + CONTEXT
        return nvml.MemoryInfo(device.total_bytes, used, device.total_bytes - used, None)

    tree.nvml = SimpleNamespace(processes=processes, memory_info=memory_info, CallFailed=nvml.CallFailed)
    scans = []
    for _ in range(50):
        started = time.perf_counter()
        procs.descendants(pid)
        scans.append(time.perf_counter() - started)
    real_descendants = procs.descendants
    procs.descendants = lambda p: [] if p == pid else real_descendants(p)
    device = nvml.Device(0, "GPU-synthetic", None, "synthetic", 80 << 30)
    run_dir = tempfile.mkdtemp(prefix="gpumemdoctor-long-")
    feed = _Feed(agent_file, os.path.join(run_dir, f"agent-{pid}.jsonl"), pid)
    watch = tree.TreeWatch(pid, T0, [device], True)
    agents = AgentFiles(run_dir, T0, pid)
    end = T0 + hours * 3600
    polls = 0
    last_read = T0
    rss = {"0.0": rss_of_self()}
    next_hour = T0 + 3600
    started = time.perf_counter()
    while clock.now < end:
        clock.now += poll_s
        feed.until(clock.now)
        watch.poll()
        polls += 1
        if clock.now - last_read >= supervisor.AGENT_READ_S:
            last_read = clock.now
            agents.poll()
        if clock.now >= next_hour:
            rss[str(round((clock.now - T0) / 3600, 1))] = rss_of_self()
            next_hour += 3600
    loop_s = time.perf_counter() - started
    feed.close()
    clock.now += 2
    watch.after_exit()
    collect_started = time.perf_counter()
    recording = tree.collect(
        supervisor.RunOptions(target_args=["train.py"], poll_interval_s=poll_s), watch, agents, pid, 0,
        started_wall=time.time(), duration_s=hours * 3600, versions={"tool": "benchmark"},
        devices=[device], notes=[], cost={}, oom_kills=None, host=supervisor.host_name())
    collect_s = time.perf_counter() - collect_started
    started = time.perf_counter()
    diagnosis = diagnose(recording)
    diagnose_s = time.perf_counter() - started
    report_path = os.path.join(run_dir, "report.json")
    started = time.perf_counter()
    write(build(recording, diagnosis), report_path, force=True)
    write_s = time.perf_counter() - started
    size = os.path.getsize(report_path)
    leak = next((g for g in diagnosis.growth if g.series == "allocated"), None)
    rss["end"] = rss_of_self()
    peak = procs.peak_rss_of_self()
    series = recording.nvml[(pid, 0)]
    agent = recording.agents[0]
    spike = max(agent.samples, key=lambda s: s.readings[0].allocated_bytes)
    for name in os.listdir(run_dir):
        os.remove(os.path.join(run_dir, name))
    os.rmdir(run_dir)
    return {
        "simulated_poll_interval_s": poll_s, "polls": polls,
        "tree_scan_ms": round(statistics.median(scans) * 1e3, 3), "poll_loop_wall_s": round(loop_s, 1),
        "poll_cost_us": round(loop_s / polls * 1e6, 2),
        "rss_bytes_at_start": rss_start, "rss_bytes_by_hour": rss, "peak_rss_bytes": peak,
        "collect_s": round(collect_s, 3), "diagnose_s": round(diagnose_s, 3), "report_write_s": round(write_s, 3),
        "report_bytes": size, "verdict": diagnosis.verdict,
        "leak_rate_true_bytes_per_s": LEAK_PER_S,
        "leak_rate_found_bytes_per_s": leak.rate_bytes_per_s if leak else None,
        "nvml_points_seen": watch.series[(pid, 0)].seen, "nvml_points_kept": len(series),
        "agent_samples_kept": len(agent.samples),
        "spike_in_report": {"t_s": round(spike.t, 1), "allocated_bytes": spike.readings[0].allocated_bytes},
        "host_rss_points_kept": len(recording.host_rss),
        "downsampling": recording.downsampling,
    }


def cli_peak_rss() -> int | None:
    """The real `gpumemdoctor run`'s own peak RSS on a script that does nothing (click, rich,
    psutil and all): what the supervisor starts from, before anything it keeps."""
    with tempfile.TemporaryDirectory(prefix="gpumemdoctor-long-cli-") as folder:
        with open(os.path.join(folder, "t.py"), "w", encoding="utf-8") as f:
            f.write("pass\n")
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUMEMDOCTOR_")}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO_ROOT, env.get("PYTHONPATH")) if p)
        done = subprocess.run([sys.executable, "-m", "gpumemdoctor", "run", "--allow-no-gpu", "-q", "-o", "r.json",
                               "t.py"], cwd=folder, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            return None
        with open(os.path.join(folder, "r.json"), encoding="utf-8") as f:
            return json.load(f)["recording"]["tool_cost"].get("supervisor_peak_rss_bytes")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hours", type=float, default=24.0, help="simulated hours [default: 24]")
    parser.add_argument("--poll-interval", type=float, default=0.05,
                        help="simulated seconds between NVML polls [default: 0.05]")
    parser.add_argument("--json", metavar="PATH", help="write the figures here")
    parser.add_argument("--phase", choices=["supervisor"], help=argparse.SUPPRESS)
    parser.add_argument("--agent-file", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.hours < 0.05 or args.poll_interval <= 0:
        parser.error("--hours must be at least 0.05 and --poll-interval positive")
    if args.phase == "supervisor":
        print(json.dumps(supervisor_phase(args.hours, args.agent_file, args.poll_interval)))
        return 0

    with tempfile.TemporaryDirectory(prefix="gpumemdoctor-long-agent-") as run_dir:
        print(f"long_run: phase 1, the agent: {args.hours:g} simulated hours at 10 steps/s ...", flush=True)
        agent = agent_phase(args.hours, run_dir)
        print("long_run: phase 2, the supervisor (a child process) ...", flush=True)
        child = subprocess.run([sys.executable, os.path.abspath(__file__), "--phase", "supervisor",
                                "--hours", str(args.hours), "--poll-interval", str(args.poll_interval),
                                "--agent-file", agent["agent_file"]], capture_output=True, text=True)
        if child.returncode != 0:
            print(child.stderr, file=sys.stderr)
            return 1
        sup = json.loads(child.stdout)
    del agent["agent_file"]
    sup["cli_peak_rss_bytes_of_an_empty_run"] = cli_peak_rss()
    result = {
        "benchmark": "benchmarks/long_run.py", "date": "2026-11-23",
        "machine": f"CPU only, no GPU; synthetic figures ({platform.machine()}, {os.cpu_count()} cores)",
        "python": platform.python_version(), "simulated_hours": args.hours,
        "workload": "10 steps/s; live tensors +0.1 MiB/min (a slow leak) under 0-300 MiB of activations "
                    "(seven batch shapes in turn, 2 MiB jitter); "
                    "a 20 GiB spike for 3 s at mid-run; NVML = reserved + 520 MiB, moving at every poll",
        "agent": agent, "supervisor": sup,
    }
    f1, f2 = agent["step_cost_first_minute"], agent["step_cost_last_minute"]
    print(f"agent: {agent['steps']} steps in {agent['wall_s']:.1f} s; its file {agent['file_bytes'] / MIB:.1f} MiB, "
          f"{agent['file_lines']} lines")
    for kind in ("all", "sampling", "plain"):
        if kind in f1 and kind in f2:
            print(f"  on_step, {kind:8} steps: median {f1[kind]['median_us']:7.2f} us in the first minute "
                  f"({f1[kind]['steps']} steps), {f2[kind]['median_us']:7.2f} us in the last ({f2[kind]['steps']})")
    by_hour = agent["step_cost_median_us_by_hour"]
    plain = [v["plain"] for v in by_hour.values() if "plain" in v]
    if plain:
        print(f"  on_step, plain steps by hour (medians): {min(plain):.2f}-{max(plain):.2f} us over "
              f"{len(plain)} hours")
    print(f"supervisor: RSS {sup['rss_bytes_at_start'] / MIB:.1f} MiB at start, "
          f"{sup['rss_bytes_by_hour']['end'] / MIB:.1f} MiB at the end, peak {sup['peak_rss_bytes'] / MIB:.1f} MiB; "
          f"collect {sup['collect_s']:.2f} s, diagnose {sup['diagnose_s']:.2f} s, write {sup['report_write_s']:.2f} s")
    if sup["cli_peak_rss_bytes_of_an_empty_run"]:
        print(f"  (the real gpumemdoctor run, with click and rich, peaks at "
              f"{sup['cli_peak_rss_bytes_of_an_empty_run'] / MIB:.1f} MiB on a script that does nothing)")
    print(f"report: {sup['report_bytes'] / MIB:.2f} MiB, verdict {sup['verdict']}, leak rate found "
          f"{(sup['leak_rate_found_bytes_per_s'] or 0) * 60 / MIB:.3f} MiB/min (true "
          f"{LEAK_PER_S * 60 / MIB:.3f}); spike kept at {sup['spike_in_report']['t_s']} s")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
