"""`%gpumemdoctor` drawn: the kernel's split on each device and who holds its largest tensors, each
with the one thing that lets it go (what _agent/kernel.py's `look` found). Computes nothing."""
from __future__ import annotations

from ..units import format_bytes as fb


def render(found: dict, pid: int) -> str:
    """The look as plain lines, for a notebook cell's output."""
    lines = [f"gpumemdoctor: this kernel's memory now (PID {pid})"]
    if not found["torch"]:
        lines.append("torch is not imported in this kernel: there is no PyTorch memory to look at")
        return "\n".join(lines)
    if found["cuda"]:
        for d in found["devices"]:
            a, act, r, n = d["allocated_bytes"], d["active_bytes"], d["reserved_bytes"], d["nvml_bytes"]
            gpu = f"GPU {d['nvml_index']}" if d["nvml_index"] is not None else f"cuda:{d['torch_index']}"
            parts = [f"tensors {fb(a)} (live, or garbage cycles not yet collected)",
                     f"cache {fb(max(0, r - max(act, a)))}",
                     f"freed, awaiting stream work {fb(max(0, act - a))}"]
            if n is not None:
                parts.append(f"outside PyTorch's allocator (the CUDA context, other libraries) {fb(max(0, n - r))}")
            total = f"NVML {fb(n)}" if n is not None else f"reserved {fb(r)}"
            lines.append(f"{gpu} ({d['name']}): {total} = " + " + ".join(parts))
        if not found["devices"]:
            lines.append("CUDA is started, and PyTorch holds no GPU memory")
        kind = "CUDA tensors"
    else:
        lines.append("CUDA is not started in this kernel: the split of GPU memory does not apply; "
                     "what follows is CPU tensors")
        kind = "CPU tensors"
    places = found["places"]
    if not places:
        lines.append(f"No name of the notebook holds {kind}.")
        return "\n".join(lines)
    lines.append(f"Who holds the largest {kind} (a tensor two places hold is freed once both let go):")
    width = max(len(p["place"]) for p in places)
    for p in places:
        where = f" ({p['line']})" if p.get("line") else ""
        detail = f" [{p['detail']}]" if p.get("detail") else ""
        lines.append(f"  {fb(p['bytes']):>10}  {p['place']:<{width}}{where}{detail}  {p['kind']}; clear: {p['remedy']}")
    if found.get("more_places"):
        lines.append(f"  and {found['more_places']} smaller places")
    if found.get("tensor_bytes") is not None:
        rest = found["tensor_bytes"] - found["named_bytes"]
        if rest > 0:
            lines.append(f"  {fb(rest):>10}  held elsewhere: deeper in objects, closures or C code than these names "
                         "show (gpumemdoctor run's holder search follows them)")
    if found.get("stopped"):
        lines.append(f"(the look stopped at its budget: {found['stopped']})")
    lines.append("Garbage cycles are not collected here (gc.collect() would change the kernel): a tensor no place "
                 "holds may be one; gc.collect() and %gpumemdoctor again tell.")
    return "\n".join(lines)
