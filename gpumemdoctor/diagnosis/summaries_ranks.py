"""The ranks' words: who a process is, the stray contexts, a rank's imbalance and the job in one
line (ranks.py decides them), and a job's notes on its runs (job.py). Pure.

The same registry as summaries.py's (summaries_registry.py): each sentence a registered function, its
keyword arguments the facts ranks.py decided; `tell(name, **facts)` makes it. `rank_words`, `who` and
`ranges` are ranks.py's too (it names them as before).
"""
from __future__ import annotations

from .summaries_registry import summary as _summary
from ..recording.recording import Dist
from ..units import format_bytes as fb


def rank_words(dist: Dist | None) -> str:
    """'rank 1, local rank 1', or '' for a process that is not a rank."""
    if dist is None:
        return ""
    parts = []
    if dist.rank is not None:
        parts.append(f"rank {dist.rank}")
    if dist.local_rank is not None:
        parts.append(f"local rank {dist.local_rank}")
    return ", ".join(parts)


def who(pid: int, dist: Dist | None) -> str:
    """'process 123 (rank 1, local rank 1)', or 'process 123'."""
    words = rank_words(dist)
    return f"process {pid} ({words})" if words else f"process {pid}"


def ranges(numbers: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'."""
    out: list[str] = []
    for n in sorted(set(numbers)):
        if out and out[-1].split("-")[-1] == str(n - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{n}"
        else:
            out.append(str(n))
    return ", ".join(out)


@_summary("stray-context")
def _stray_context(pid: int, dist: Dist | None, held: int, nvml_index: int, torch_index: int,
                   owner_rank: int | None, works_on: list[int], reserved_there: int, at: str | None) -> str:
    """A process's CUDA context on a GPU that is not its work (`owner_rank`: the rank whose GPU it is)."""
    gpus_text = ", ".join(f"GPU {n}" for n in works_on)
    there = f"GPU {nvml_index} (its cuda:{torch_index})"
    if owner_rank is not None:
        there += f", rank {owner_rank}'s GPU"
    if reserved_there:
        what = (f"where PyTorch reserved only {fb(reserved_there)}, while it works on {gpus_text}: a CUDA "
                f"context it did not need, made by a tensor or CUDA call on cuda:0 before "
                f"torch.cuda.set_device, or by a library (gloo staging a CUDA tensor on the current device).")
    else:
        what = (f"where PyTorch never allocated anything, while it works on {gpus_text}: a CUDA context it "
                f"did not need, made by a CUDA call before torch.cuda.set_device (or by a barrier or "
                f"collective without device_ids).")
    summary = f"{who(pid, dist).capitalize()} holds {fb(held)} on {there}, {what}"
    if at:
        summary += f" CUDA started in it at {at}."
    return summary


@_summary("rank-imbalance")
def _rank_imbalance(rank: int, peak_reserved_bytes: int, device: int | None, excess: int, share: float | None,
                    others_count: int, median: int, also_over: list[int]) -> str:
    """The rank whose peak is above the median of the `others_count` other ranks' (`also_over`: the
    other ranks above them too)."""
    gpu = f" on GPU {device}" if device is not None else ""
    summary = (f"Rank {rank}'s peak of PyTorch's reserved memory, {fb(peak_reserved_bytes)}{gpu}, "
               f"is {fb(excess)}" + (f" ({share:.0%})" if share is not None else "")
               + f" above the median of the other {others_count} ranks, {fb(median)}: with the same GPU "
               f"on every rank, the job runs out of memory on this one first.")
    if also_over:
        many = len(also_over) > 1
        summary += f" Rank{'s' if many else ''} {ranges(also_over)} {'are' if many else 'is'} above the others too."
    return summary


@_summary("job")
def _job(count: int, hosts: list[str | None], world_size: int | None, missing: list[int],
         with_leak: list[int]) -> str:
    """'2 ranks on 1 host (node-a); leak on rank 1 only, of 2 ranks: ...' (ranks.job_summary's facts)."""
    named = sorted({h for h in hosts if h})
    places = len(set(hosts))
    text = f"{count} rank{'s' if count != 1 else ''} on {places} host{'s' if places != 1 else ''}"
    if named:
        text += f" ({', '.join(named[:4])}{', ...' if len(named) > 4 else ''})"
    if with_leak:
        if count > 1 and len(with_leak) >= count:
            text += f"; leak on every rank ({count}): in code that all ranks run"
        elif count > 1:
            one = len(with_leak) == 1
            text += (f"; leak on rank{'' if one else 's'} {ranges(with_leak)} only, of {count} ranks: in what "
                     f"only {'that rank does' if one else 'those ranks do'}")
        else:
            text += f"; leak on rank {ranges(with_leak)}"
    if missing:
        text += (f"; world size {world_size}, but rank{'s' if len(missing) > 1 else ''} {ranges(missing)} "
                 f"{'are' if len(missing) > 1 else 'is'} not in {'these reports' if len(set(hosts)) > 1 else 'this report'} "
                 f"(give every node's report to gpumemdoctor report)")
    return text


# A job of several recordings (job.py).
@_summary("job-run-note")
def _job_run_note(host: str | None, pid: int, note: str) -> str:
    """A run's note in the job's notes, with the host (or the process) it came from."""
    return f"{host or f'the run of process {pid}'}: {note}"


@_summary("job-run-ids")
def _job_run_ids(run_ids: list) -> str:
    return f"the reports come from runs with different run ids ({', '.join(run_ids[:4])}): are they one job?"
