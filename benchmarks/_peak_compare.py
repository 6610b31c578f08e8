"""The tool's split of a program's allocated peak held to PyTorch's MemTracker (issue 40): the mapping
of categories, the tolerances and the comparison, shared by benchmarks/peak_reference.py (which runs
the programs on a GPU and writes the table) and tests/test_peak_reference.py (which holds the split
on the recordings it wrote, kept in tests/fixtures/peak_reference/). It lives beside the benchmark
that measures it, so that the benchmark imports nothing from the tests.

The two sides, from two runs of the same program, each at PyTorch's allocated peak:
- the tool's: the composition `gpumemdoctor run` shows for the target process (its
  `peak_compositions`), split at PyTorch's allocated peak from the allocator's events
  (diagnosis/allocated_peak.py; `source` says where it was not);
- MemTracker's (benchmarks/memtracker_reference.py), at the same kind of moment: PyTorch's allocated
  peak, the allocator's peak counter read (and reset) at the end of every operator; its categories
  then (the tensors' storages it tracks), what the allocator held beyond them inside that operator's
  call (freed before it returned: a workspace, `inside_operator`) and across it (no tracked tensor's
  storage: cuBLAS's workspaces, `beyond_memtracker`); and the bytes of the optimizers' parameters.
  On the CPU (a try without a GPU) there is no allocator to read: MemTracker's own peak instead.

MemTracker files every tensor made outside backward() and the optimizer steps as an activation, every
tensor made inside backward() as a temporary (until a gradient hook makes it a gradient), everything an
optimizer step makes as optimizer state, and every module's parameters as parameters. The tool tells
apart what a forward saved for backward() (activations), what was gathered with no backward() after it
(gathered), what lived within one part of a step (temporaries) and what was still allocated when its
reading came (kept-tensors); its parameters are the optimizers' only. So the parts compared are:

| part | the tool's categories | MemTracker's |
| --- | --- | --- |
| parameters | parameters | Parameter, up to the optimizers' parameters' bytes |
| gradients | gradients | Gradient |
| optimizer-state | optimizer-state, and temporaries where the peak came inside an optimizer step | Optstate |
| activations | activations, gathered, graphs-kept, and temporaries where the peak came outside backward() and the optimizer steps | Activation |
| temporaries | temporaries where the peak came inside backward() | Temp |
| kept-tensors | kept-tensors | Buffer, Other, Parameter beyond the optimizers' (an EMA's weights, a model no optimizer trains), and `beyond_memtracker` |

`inside_operator` goes to the part of the phase MemTracker was in at that operator: temporaries inside
backward(), optimizer-state inside an optimizer step, activations outside both (the tool files a
block made and freed within one part of a step as a temporary, and the part takes its temporaries).

`unclassified` has no counterpart: it must be at most UNCLASSIFIED_SHARE of the allocated peak. The
allocator's cache and fragmentation, the CUDA context and memory outside PyTorch are not allocated
memory and not in MemTracker's total: shown, not compared.
"""
from __future__ import annotations

import json
from pathlib import Path

MIB = 1 << 20
TOLERANCE_SHARE = 0.10  # of MemTracker's figure for the part ...
TOLERANCE_BYTES = 64 * MIB  # ... or this, whichever is larger
UNCLASSIFIED_SHARE = 0.10  # of the allocated peak

# The programs of issue 40's comparison, in corpus/.
PROGRAMS = ("hf_gpt2_124m_adamw", "timm_resnet50_ema", "lightning_validation_cleared", "plain_loop_transformer",
            "hf_trainer_eval", "hf_trainer_train")
FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "peak_reference"

# (part, the tool's categories, MemTracker's, in words): see the module's docstring.
PARTS = (
    ("parameters", ("parameters",), ("Parameter",), "MemTracker's Parameter up to the optimizers' parameters"),
    ("gradients", ("gradients",), ("Gradient",), ""),
    ("optimizer-state", ("optimizer-state",), ("Optstate",), "the tool's temporaries too, at a peak inside an "
                                                             "optimizer step"),
    ("activations", ("activations", "gathered", "graphs-kept"), ("Activation",),
     "the tool's temporaries too, at a peak outside backward() and the optimizer steps"),
    ("temporaries", (), ("Temp",), "the tool's temporaries at a peak inside backward()"),
    ("kept-tensors", ("kept-tensors",), ("Buffer", "Other"),
     "MemTracker's Parameter beyond the optimizers', and the allocated memory beyond what it tracked"),
)
# The part that takes a phase's temporaries (the tool's) and the blocks inside an operator's call (MemTracker's).
PHASE_PART = {"backward": "temporaries", "optimizer step": "optimizer-state", "outside": "activations"}
NOT_ALLOCATED = ("request", "graph-pools", "fragmentation", "cache", "outside-pytorch", "context")
PHASES = {"inside backward()": "backward", "inside an optimizer step": "optimizer step",
          "outside backward() and the optimizer steps": "outside"}


def allowed(reference: int) -> int:
    return max(TOLERANCE_BYTES, int(TOLERANCE_SHARE * reference))


def load(name: str, folder: Path = FIXTURES) -> tuple[dict, dict]:
    """A program's report (`gpumemdoctor run`'s JSON) and MemTracker's record, from `folder`; says
    which file is missing."""
    paths = (folder / f"{name}.report.json", folder / f"{name}.memtracker.json")
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        raise FileNotFoundError(f"missing {', '.join(missing)}: run benchmarks/peak_reference.py on a GPU and copy "
                                f"its files into {folder} (tests/fixtures/peak_reference/README.md)")
    return json.loads(paths[0].read_text()), json.loads(paths[1].read_text())


def tool_split(report: dict, compositions: list[dict] | None = None) -> dict | None:
    """The tool's split at the target process's peak: from `compositions` (PeakComposition.to_json()
    of a diagnosis made again) or the report's own `peak_compositions`; the largest allocated peak
    of that process if it used several GPUs. None when there is none."""
    pid = report["target"]["pid"]
    found = [c for c in (report.get("peak_compositions") or [] if compositions is None else compositions)
             if c["pid"] == pid]
    if not found:
        return None
    c = max(found, key=lambda c: c["allocated_bytes"])
    parts: dict = {}
    for p in c["parts"]:
        parts[p["category"]] = parts.get(p["category"], 0) + p["bytes"]
    split_at_peak = bool(c["notes"]) and c["notes"][0].startswith("split at PyTorch's allocated peak")
    return {"pid": pid, "torch_index": c["torch_index"], "allocated": c["allocated_bytes"],
            "source": "allocated-peak" if split_at_peak else "reading", "phase": _phase(report, c, split_at_peak),
            "step": c.get("step"), "parts": parts, "notes": list(c["notes"])}


def _phase(report: dict, c: dict, split_at_peak: bool) -> str | None:
    """Where the allocated peak came: the agent's reading of it (`peak_histories`), or the note."""
    if not split_at_peak:
        return None
    for agent in report["recording"]["agents"]:
        if agent["pid"] != c["pid"]:
            continue
        for r in agent["root"].get("peak_histories", []):
            if r.get("device") == c["torch_index"] and r.get("allocated_peak") == c["allocated_bytes"]:
                return r.get("phase")
    for words, phase in PHASES.items():
        if words in c["notes"][0]:
            return phase
    return None


def memtracker_split(record: dict, torch_index: int | None) -> dict | None:
    """MemTracker's split at PyTorch's allocated peak on that GPU (`at_allocator_peak`), or at its
    own peak where there is no allocator to read (the CPU, for a CORPUS_DEVICE=cpu try)."""
    devices = record.get("devices") or {}
    row = devices.get(f"cuda:{torch_index}") or (devices.get("cpu") if len(devices) == 1 else None)
    if row is None:
        return None
    own = {"total": row["peak"].get("Total", 0), "phase": row.get("peak_phase"), "step": row.get("peak_step")}
    at = row.get("at_allocator_peak")
    if at:
        return {"source": "allocator-peak", "categories": dict(at["categories"]), "total": at["memtracker_total"],
                "allocated": at["allocated"], "inside_operator": at["inside_operator"],
                "beyond_memtracker": at["beyond_memtracker"], "operator": at.get("operator"), "phase": at["phase"],
                "step": at["step"], "own_peak": own,
                "optimizer_parameter_bytes": row.get("optimizer_parameter_bytes") or 0,
                "max_memory_allocated": row.get("max_memory_allocated")}
    categories = {k: v for k, v in row["peak"].items() if k != "Total"}
    allocated = row.get("allocated_at_peak")
    return {"source": "memtracker-peak", "categories": categories, "total": own["total"], "allocated": allocated,
            "inside_operator": 0, "beyond_memtracker": max(0, (allocated or 0) - own["total"]), "operator": None,
            "phase": own["phase"], "step": own["step"], "own_peak": own,
            "optimizer_parameter_bytes": row.get("optimizer_parameter_bytes") or 0,
            "max_memory_allocated": row.get("max_memory_allocated")}


def compare(tool: dict, reference: dict) -> dict:
    """Each part (PARTS) of the tool's split against MemTracker's: its bytes on each side, the
    difference, what is allowed, whether it is within; unclassified against the allocated peak."""
    t, m = tool["parts"], reference["categories"]
    phase = tool["phase"] or "outside"  # a reading's temporaries are the locals of running functions
    parameters = m.get("Parameter", 0)
    optimizers = reference["optimizer_parameter_bytes"]
    rows = []
    for part, tool_categories, mt_categories, _ in PARTS:
        ours = list(tool_categories)
        if PHASE_PART[phase] == part:
            ours.append("temporaries")
        theirs = {c: m.get(c, 0) for c in mt_categories}
        if part == "parameters":
            theirs["Parameter"] = min(parameters, optimizers)
        if part == "kept-tensors":
            theirs["Parameter beyond the optimizers'"] = max(0, parameters - optimizers)
            theirs["beyond what it tracked"] = reference["beyond_memtracker"]
        if PHASE_PART.get(reference["phase"] or "outside") == part:
            theirs["inside an operator"] = reference["inside_operator"]
        a = sum(t.get(c, 0) for c in ours)
        b = sum(theirs.values())
        rows.append({"part": part, "tool": a, "memtracker": b, "difference": a - b, "allowed": allowed(b),
                     "ok": abs(a - b) <= allowed(b), "tool_from": {c: t.get(c, 0) for c in ours},
                     "memtracker_from": theirs})
    unclassified = t.get("unclassified", 0)
    limit = int(UNCLASSIFIED_SHARE * tool["allocated"])
    result = {
        "source": tool["source"], "phase": tool["phase"], "rows": rows,
        "unclassified": {"bytes": unclassified, "share": unclassified / tool["allocated"] if tool["allocated"] else 0.0,
                         "limit": limit, "ok": unclassified <= limit},
        "not_compared": {c: t[c] for c in NOT_ALLOCATED if t.get(c)},
        "totals": {"tool_allocated_peak": tool["allocated"], "memtracker_allocated": reference["allocated"],
                   "memtracker_total": reference["total"], "memtracker_own_peak": reference["own_peak"]["total"],
                   "max_memory_allocated": reference["max_memory_allocated"]},
        "memtracker_source": reference["source"], "memtracker_operator": reference["operator"],
        "memtracker_phase": reference["phase"], "memtracker_step": reference["step"], "tool_step": tool["step"],
        "memtracker_own_phase": reference["own_peak"]["phase"], "memtracker_own_step": reference["own_peak"]["step"]}
    result["failures"] = [f"{r['part']}: the tool {mib(r['tool'])}, MemTracker {mib(r['memtracker'])} "
                          f"(off by {mib(abs(r['difference']))}, {mib(r['allowed'])} allowed)"
                          for r in rows if not r["ok"]]
    if not result["unclassified"]["ok"]:
        result["failures"].append(f"unclassified {mib(unclassified)}: {100 * result['unclassified']['share']:.1f}% "
                                  f"of the allocated peak, {100 * UNCLASSIFIED_SHARE:.0f}% allowed")
    if tool["source"] != "allocated-peak":
        result["failures"].append("the tool's composition is a sample's reading, not split at the allocated peak")
    result["ok"] = not result["failures"]
    return result


def mib(n: int | None, signed: bool = False) -> str:
    return "-" if n is None else f"{n / MIB:{'+' if signed else ''},.1f} MiB"


def table(name: str, result: dict) -> str:
    """The comparison of one program, as lines of text."""
    totals = result["totals"]
    lines = [f"{name}: {'ok' if result['ok'] else 'MISSED'}",
             f"  the tool: {result['source']} split, allocated peak {mib(totals['tool_allocated_peak'])}, "
             f"phase {result['phase'] or '-'}, step {result['tool_step'] if result['tool_step'] is not None else '-'}",
             f"  MemTracker: {result['memtracker_source']} split, allocated {mib(totals['memtracker_allocated'])} "
             f"(its tensors {mib(totals['memtracker_total'])}), phase {result['memtracker_phase'] or '-'}, after "
             f"{result['memtracker_step']} optimizer steps, at {result['memtracker_operator'] or '-'}; its own peak "
             f"{mib(totals['memtracker_own_peak'])} (phase {result['memtracker_own_phase'] or '-'}, after "
             f"{result['memtracker_own_step']} steps)",
             f"  {'part':<16}{'tool':>14}{'MemTracker':>14}{'difference':>14}{'allowed':>12}  ok"]
    for r in result["rows"]:
        lines.append(f"  {r['part']:<16}{mib(r['tool']):>14}{mib(r['memtracker']):>14}"
                     f"{mib(r['difference'], signed=True):>14}{mib(r['allowed']):>12}  {'yes' if r['ok'] else 'NO'}")
        ours = [f"{k} {mib(v)}" for k, v in r["tool_from"].items() if v]
        theirs = [f"{k} {mib(v)}" for k, v in r["memtracker_from"].items() if v]
        if ours or theirs:
            lines.append(f"  {'':<16}(the tool: {' + '.join(ours) or '0'}; MemTracker: {' + '.join(theirs) or '0'})")
    u = result["unclassified"]
    lines.append(f"  {'unclassified':<16}{mib(u['bytes']):>14}  {100 * u['share']:.1f}% of the allocated peak "
                 f"(at most {100 * UNCLASSIFIED_SHARE:.0f}%)  {'yes' if u['ok'] else 'NO'}")
    if result["not_compared"]:
        lines.append("  not compared (not allocated memory): " +
                     ", ".join(f"{k} {mib(v)}" for k, v in result["not_compared"].items()))
    lines += [f"  missed: {f}" for f in result["failures"]]
    return "\n".join(lines)


MAPPING_TEXT = "\n".join(
    ["Both sides at PyTorch's allocated peak: the tool's split of it, and MemTracker's categories at the "
     "operator where the allocator's peak counter was highest, with what the allocator held beyond them "
     "inside that operator's call and across it. The parts compared (each within max(64 MiB, 10% of "
     "MemTracker's); unclassified at most 10% of the allocated peak):"] +
    [f"  {part}: the tool's {' + '.join(ours) or '(none)'} against MemTracker's {' + '.join(theirs)}"
     f"{'; ' + words if words else ''}" for part, ours, theirs, words in PARTS] +
    ["  MemTracker's blocks inside an operator's call go to temporaries in backward(), optimizer-state in an "
     "optimizer step, activations outside both",
     "  not compared: " + ", ".join(NOT_ALLOCATED) + " (not allocated memory: not in MemTracker's figures)"])
