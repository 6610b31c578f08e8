"""What filled the GPU at PyTorch's allocated peak, wherever it fell, between two samples too: the
composition of the best `peak_history` reading (_agent/peak/history.py: the allocator's events walked
back to the peak, _agent/peak/replay.py says how each part is told), and the finding it makes. Pure.

The reading's parts are the allocated memory at that moment; beside them the CUDA context (the
breakdown's), the segments' bytes then less the allocated (the allocator's cache), and memory
outside PyTorch as the nearest capture (peak.py) read it. A reading whose events did not reach back
to the peak (`complete` false) is not used; the report says so."""
from __future__ import annotations

import os

from . import claims, fit, probed, words
from .findings import PEAK_CATEGORIES, Breakdown, Finding, PeakComposition, PeakPart
from .remedies import FINDINGS, LIBRARY_LOOPS
from .summaries import tell
from .summaries_allocated import AUTOGRAD_UNSEEN, ERROR_HOW, HOW, INCOMPLETE, NO_BACKWARD_MARK  # (their words)
from ..contract import HISTORY_COUNTER_SLACK as COUNTER_SLACK, reaches_counter
from ..contract import PEAK_MIN_BYTES as MIN_FINDING_BYTES

GATHERED_SHARE = 0.20  # of the allocated memory at the peak: an evaluation's gathered graphs or outputs
# An evaluation's graphs are a few tensors a batch over several batches: fewer gathered tensors (a
# metric's torch.cat of outputs kept elsewhere, and its result) are not called one.
MIN_GATHERED_BLOCKS = 8


def reading(agent, torch_index: int) -> dict | None:
    """The reading with the highest allocated peak on this device whose events reached it."""
    found = [r for r in agent.root.get("peak_histories", [])
             if r["device"] == torch_index and "error" not in r and complete(r) and r.get("parts")]
    return max(found, key=lambda r: r["allocated_peak"]) if found else None


def complete(r: dict) -> bool:
    """Whether a reading's events reached back to the counter's peak: as the agent judged, or by the
    agent's rule since (contract.reaches_counter; recordings made before it judged more strictly)."""
    return bool(r.get("complete")) or (r.get("counter") is not None and r.get("allocated_peak") is not None
                                       and reaches_counter(r["allocated_peak"], r["counter"]))


def incomplete_note(agent, torch_index: int) -> str | None:
    """Said where every reading of this device missed its peak (the events did not reach back to it)."""
    readings = [r for r in agent.root.get("peak_histories", []) if r["device"] == torch_index and "error" not in r]
    if readings and not any(complete(r) for r in readings):
        return INCOMPLETE
    return None


def compose(agent, torch_index: int, b: Breakdown, outside: int, device: int | None,
            where: str) -> tuple[PeakComposition, list[Finding]] | None:
    """The composition at the best reading's peak, and its finding; None without one."""
    r = reading(agent, torch_index)
    if r is None:
        return None
    allocated = r["allocated_peak"]
    reserved = max(r["reserved_at_peak"] or 0, allocated)
    parts: dict[str, PeakPart] = {}
    for category, p in r["parts"].items():
        if p["bytes"] > 0:
            parts[category] = PeakPart(category, p["bytes"], HOW[category], [])
    told = sum(p.bytes for p in parts.values())
    if told < allocated:  # (the walk's parts add up to its peak, the storages' 512-byte rounding aside)
        parts.setdefault("unclassified", PeakPart("unclassified", 0, HOW["unclassified"], [])).bytes += allocated - told
    elif told > allocated and parts:
        largest = max(parts.values(), key=lambda p: p.bytes)
        largest.bytes -= min(largest.bytes, told - allocated)
    if reserved > allocated:
        parts["cache"] = PeakPart("cache", reserved - allocated, HOW["cache"], [])
    if outside > 0:
        parts["outside-pytorch"] = PeakPart("outside-pytorch", outside, HOW["outside-pytorch"], [])
    parts["context"] = PeakPart("context", b.context_bytes or 0, HOW["context"], [])
    error = error_moment(agent, torch_index, r)
    if error is not None:
        _at_the_error(parts, error)
    # (the modules' split is another step's: at the error, this step's input made its own)
    saved = saved_by(agent, torch_index) if error is None else None
    if saved is not None and "activations" in parts:
        parts["activations"].holders = saved[0]
    ordered = [parts[c] for c in PEAK_CATEGORIES if c in parts and (parts[c].bytes > 0 or c == "context")]
    t = r["t"] - (r["peak_before_s"] or 0.0)
    # The step count then: the reading's may be a step later (it came at the next step's sample).
    step = max((s.step for s in agent.samples if s.t <= t and s.step is not None), default=r.get("step"))
    notes = [tell("allocated-split", allocated_bytes=allocated, before_s=r["peak_before_s"] or 0, phase=r["phase"])]
    short = (r["counter"] or 0) - allocated
    if short > COUNTER_SLACK:
        notes.append(tell("allocated-below-counter", short_bytes=short, counter_bytes=r["counter"]))
    if saved is not None and "activations" in parts:
        notes.append(saved[1])
    if not r.get("backward_marked", True):
        notes.append(NO_BACKWARD_MARK)
    if error is not None:
        notes.append(error_note(error))
    composition = PeakComposition(
        pid=agent.pid, device=device, torch_index=torch_index, t=t, step=step,
        total_bytes=sum(p.bytes for p in ordered), allocated_bytes=allocated, reserved_bytes=reserved, parts=ordered,
        allocated_peak_bytes=r["counter"], in_pause=False, where=error_at(error) if error else None, notes=notes)
    if error is not None:  # (the failing step's own tensors: nothing gathered to warn of)
        return composition, []
    readings = [x for x in agent.root.get("peak_histories", []) if x["device"] == torch_index and "error" not in x]
    name_from_probe(agent, torch_index, composition)  # (before the findings: who held a concatenation's pieces)
    return composition, findings(composition, r, where, readings, autograd_at(agent, torch_index, step, t))


ERROR_WITHIN_S = 1.0  # an out-of-memory error this near the reading's peak, before the reading, is its moment


def error_moment(agent, torch_index: int, r: dict) -> dict | None:
    """The out-of-memory error whose moment the reading's peak is: allocated then as at the peak (the
    allocator's counter stops where the request failed), shortly before the reading, in a step's forward
    (grad mode on, no backward() or optimizer step running). An out-of-memory error is the run's peak:
    what made it is that moment, the failing step's own tensors and the request. None where none is."""
    peak_t = r["t"] - (r["peak_before_s"] or 0.0)
    for oom in agent.root.get("ooms", []):
        if oom["device"] != torch_index or oom.get("allocated_bytes") is None:
            continue
        if abs(oom["allocated_bytes"] - r["allocated_peak"]) > COUNTER_SLACK:
            continue
        if not (peak_t - ERROR_WITHIN_S <= oom["t"] <= r["t"]):
            continue
        if oom.get("inside") is None and oom.get("grad_enabled") and not oom.get("paused"):
            return oom
    return None


def _at_the_error(parts: dict, oom: dict) -> None:
    """The error's moment: what its events call gathered (made with no backward() after them, freed
    together) is the failing step's forward, let go of as the error unwound; and the request."""
    gathered = parts.pop("gathered", None)
    if gathered is not None:
        mine = parts.setdefault("activations", PeakPart("activations", 0, ERROR_HOW, []))
        mine.bytes += gathered.bytes
        mine.how = ERROR_HOW
    parts["request"] = PeakPart("request", oom["request_bytes"], HOW["request"], [])


def error_at(oom: dict) -> str | None:
    """'activations.py:66 in forward()': the line the error came at."""
    stack = oom.get("stack") or []
    if not stack:
        return None
    file, line, fn = stack[0]
    return f"{os.path.basename(file)}:{line} in {fn}()"


def error_note(oom: dict) -> str:
    """The composition's note at the error's moment: the request, and this step's input against the
    earlier steps' where the agent read them."""
    inputs = oom.get("inputs") or []
    earlier = []
    if inputs:  # (the earlier steps' shapes that this step's input did not have)
        shapes = {n: s for n, s, _ in inputs}
        earlier = [(n, s, k) for n, s, _, k in oom.get("earlier_inputs") or [] if shapes.get(n) != s]
    return tell("allocated-at-error", at=error_at(oom), request_bytes=oom["request_bytes"], inputs=inputs,
                earlier=earlier)


AUTOGRAD_WITHIN_S = 1.0  # a probe or search this near the peak, in the same step, tells its graphs


def autograd_at(agent, torch_index: int, step: int | None, t: float) -> str | None:
    """What showed autograd at work near the peak (the same step, within AUTOGRAD_WITHIN_S): a probe
    of the program's names that found a name carrying an autograd graph, or a holder search that found
    memory held through one; None where nothing did (then no claim about autograd is made)."""
    for capture, probe in probed.probes_of(agent, torch_index):
        if capture["step"] == step and abs(capture["t"] - t) <= AUTOGRAD_WITHIN_S:
            graph = probed.longest_graph(probed.holders(probe))
            if graph is not None:
                return tell("autograd-probed", graph=graph)
    ooms = agent.root.get("ooms", [])
    for search in agent.root.get("investigations", []):
        if search["step"] != step or abs(search["t"] - t) > AUTOGRAD_WITHIN_S:
            continue
        # (at an error in a step's forward, its locals' graphs are the step's activations: no evaluation's)
        oom = ooms[0] if search["when"] == "oom" and ooms else None
        for group in search["groups"]:
            graph = next((h for h in group["holders"] if h["kind"] == "autograd-graph"
                          and not (oom is not None and fit.running_step(oom, h))), None)
            if graph is not None and group.get("device") in (None, torch_index):
                return tell("autograd-searched", t=search["t"], path=graph["path"])
    return None


def saved_by(agent, torch_index: int) -> tuple[list[dict], str] | None:
    """The modules whose forward made the activations of the step recorded with module hooks
    (_agent/peak/saved_by.py), as holders of the activations part, each with the line that called the
    outermost forward; and the note that says where they come from. None without that record."""
    r = next((r for r in agent.root.get("forward_modules", [])
              if r["device"] == torch_index and "error" not in r and r.get("modules")), None)
    if r is None:
        return None
    line = r.get("line")
    where = f"{os.path.basename(line['file'])}:{line['line']}" if line else None
    holders = [{"name": m["name"], "bytes": m["bytes"], "line": where} for m in r["modules"][:4]]
    return holders, tell("allocated-saved-by", step=r["step"] + 1, outside_bytes=r.get("outside_modules"),
                         called_at=where)


PROBE_BEFORE_S = 1.0  # a probe this long before the peak, at the same step, names its holders
MIN_HOLDER_BYTES = 64 << 10
NAMED_PARTS = ("gathered", "kept-tensors", "temporaries")  # the parts a probe's names can hold


def name_from_probe(agent, torch_index: int, c: PeakComposition) -> None:
    """The holders that the latest probe of the program's names before the peak, at the same step,
    found (temporaries and kept tensors): on the largest of NAMED_PARTS, with a note saying when; and
    whether that moment was in a pause in the steps, as the probe's capture says. The events name no
    holder."""
    made = probed.probes_of(agent, torch_index)
    before = [(capture, probe) for capture, probe in made
              if capture["step"] == c.step and c.t - PROBE_BEFORE_S <= capture["t"] <= c.t]
    if not before:
        _graph_after(agent, torch_index, c, made)
        return
    capture, probe = before[-1]
    c.in_pause = capture["paused"]
    rows = [h for key in ("temporaries", "kept-tensors") for h in probe.get(key) or [] if h[1] >= MIN_HOLDER_BYTES]
    part = max((p for p in c.parts if p.category in NAMED_PARTS), key=lambda p: p.bytes, default=None)
    if not rows or part is None:
        return
    part.holders = [{"name": h[0], "bytes": h[1], "line": h[2]} for h in sorted(rows, key=lambda h: -h[1])[:4]]
    c.notes.append(tell("allocated-holders-probed", before_s=c.t - capture["t"]))


NEAR_PEAK_SHARE = 0.95  # of the allocated peak: a capture this full saw the peak's tensors still there


def _graph_after(agent, torch_index: int, c: PeakComposition, made: list) -> None:
    """Where no probe came before the peak but one came after it, in the same step and before the
    reading that split it, at a capture that still had the peak's memory in use (a sample that landed
    on an evaluation's graphs at their height): the name whose autograd graph chained the most
    operations of one kind, as a note on the gathered part. A note, not a holder: the probe read the
    name's graph, not which blocks it kept."""
    gathered = c.part("gathered")
    r = reading(agent, torch_index)
    if gathered is None or r is None:
        return
    after = [(capture, probe) for capture, probe in made
             if capture["step"] == c.step and c.t < capture["t"] <= r["t"]
             and (capture["allocated"] or 0) >= NEAR_PEAK_SHARE * c.allocated_bytes]
    for capture, probe in after:
        graph = probed.longest_graph(probed.holders(probe))
        if graph is not None:
            c.notes.append(tell("allocated-graph-after", after_s=capture["t"] - c.t, graph=graph))
            return


LOOP_REMEDIES = LIBRARY_LOOPS  # (remedies.py: the library loops' own switches)


def _grown(readings: list, best: dict) -> list[int]:
    """The concatenations' results of this device's readings up to the best one, where each was
    larger than the one before (a tensor grown by concatenation, step after step); else []."""
    sizes = [r["joined"]["bytes"] for r in readings if r.get("joined") and r["t"] <= best["t"]]
    return sizes if len(sizes) >= 2 and all(a < b for a, b in zip(sizes, sizes[1:])) else []


def findings(c: PeakComposition, r: dict, where: str, readings: list = (), autograd: str | None = None) -> list[Finding]:
    """Tensors gathered at the peak with no backward() after them: a concatenation made while its
    pieces were held (`joined`), or an evaluation's graphs or outputs (the avoidable peak an
    evaluation without no_grad makes, said so only where `autograd` says what showed autograd at work:
    autograd_at)."""
    gathered = c.part("gathered")
    if gathered is None or r["phase"] != "outside":
        return []
    if gathered.bytes < max(MIN_FINDING_BYTES, GATHERED_SHARE * c.allocated_bytes):
        return []
    p = r["parts"]["gathered"]
    moment = {"where": where, "total_bytes": c.total_bytes, "step": c.step}
    evidence = {"decided_by": "peak", "peak_t": c.t, "peak_step": c.step, "peak_bytes": c.total_bytes,
                "gathered_bytes": gathered.bytes, "gathered_blocks": p["blocks"], "phase": r["phase"]}
    joined = r.get("joined")
    if joined and joined["bytes"] + joined["pieces_bytes"] >= 0.5 * gathered.bytes:
        return _concatenation(c, r, gathered, readings, moment, evidence, autograd)
    if p["blocks"] < MIN_GATHERED_BLOCKS:
        return []
    made = [claims.make("gathered", bytes=gathered.bytes, blocks=p["blocks"], phase=r["phase"])]
    loop = r.get("loop") if r.get("loop") in LOOP_REMEDIES else None
    loop_claim = loop_joined = None
    if loop:  # the reading came inside a library's gathering loop: its own switches govern what it gathers
        made.append(loop_claim := claims.make("library-loop", loop=loop, called_at=r.get("loop_called_at"), t=r["t"]))
        loop_joined = _joined_in_loop(r, readings, evidence)
        evidence["loop"] = loop
    graphs, unseen = _autograd(autograd)
    made.append(graphs if graphs is not None else unseen)
    kind = "avoidable-peak"
    if loop_joined is not None:  # an earlier reading in the loop saw it concatenate: the same finding as there
        kind = "temporary-peak"
        made.insert(0, claims.make("concatenation", bytes=loop_joined["bytes"], pieces=loop_joined["pieces"],
                                   pieces_bytes=loop_joined["pieces_bytes"], pieces_live_at_peak=True,
                                   result_held_at_reading=loop_joined["held"], reading_t=loop_joined["t"]))
    made = [m for m in made if m is not None]
    if loop:
        remedy = LOOP_REMEDIES[loop]
    else:
        remedy = FINDINGS["graphs-at-peak"] if graphs is not None else FINDINGS["gathered-at-peak"]
    return [Finding(kind=kind, bytes=gathered.bytes, pid=c.pid, device=c.device,
                    summary=tell("allocated-gathered", **moment, gathered_bytes=gathered.bytes, blocks=p["blocks"],
                                 first_before_s=p["first_before_s"], last_before_s=p["last_before_s"],
                                 loop_claim=loop_claim, loop_joined=loop_joined, reading_t=r["t"], graphs=graphs,
                                 unseen=unseen),
                    evidence={**evidence, "autograd": autograd},
                    remedy=remedy, claims=[words.as_json(m) for m in made])]


def _concatenation(c: PeakComposition, r: dict, gathered, readings: list, moment: dict, evidence: dict,
                   autograd: str | None) -> list[Finding]:
    """The peak's reading at a concatenation made while its pieces were held (`joined`): a temporary
    peak, in a library's loop with its loop's remedy and claims."""
    joined = r["joined"]
    p = r["parts"]["gathered"]
    grown = _grown(readings, r)
    grown_told = grown if len(grown) >= 3 else []  # (told over three readings or more, the cache beside it)
    cache = c.bytes_of("cache") if grown_told and c.bytes_of("cache") >= 0.25 * c.total_bytes else None
    # (the best reading may come after the loop ended: at exit; the growth's readings came in it)
    inside = next((x for x in [r, *readings] if x.get("loop") in LOOP_REMEDIES
                   and (x is r or (x.get("joined") and x["t"] <= r["t"]))), None)
    loop = inside["loop"] if inside else None
    if inside:
        called = inside.get("loop_called_at")
        evidence["loop"] = loop
        if called:
            evidence["loop_called_at"] = called
        # The name that held the result in the loop, with the library's line, as the latest reading found it.
        holder = next((x["loop_holder"] for x in [r, *reversed(readings)] if x.get("loop_holder")
                       and x["t"] <= r["t"]), None)
        if holder:
            evidence["loop_holder"] = holder
    if grown:
        evidence["grown_bytes"] = grown
    made = [claims.make("concatenation", bytes=joined["bytes"], pieces=joined["pieces"],
                        # (the pieces are gathered blocks of the peak: allocated at its moment, by the events)
                        pieces_bytes=joined["pieces_bytes"], pieces_live_at_peak=True,
                        result_held_at_reading=joined.get("held"), reading_t=r["t"])]
    if loop:
        made.append(claims.make("library-loop", loop=loop, called_at=evidence.get("loop_called_at"),
                                t=inside["t"]))
    # The probe's names before the peak, where one name held as much as the pieces: who held them.
    # (a probe before the last pieces were made saw fewer of them: at least half, at most a tenth more)
    most = joined["pieces_bytes"] + max(1 << 20, joined["pieces_bytes"] // 10)
    pieces = next((h for h in gathered.holders if joined["pieces_bytes"] // 2 <= h["bytes"] <= most), None)
    if pieces is not None:
        evidence["pieces_holder"] = pieces["name"]
    if loop and p["blocks"] >= MIN_GATHERED_BLOCKS:  # a library's loop gathering by concatenation
        made += _loop_gathering(gathered.bytes, p["blocks"], r["phase"], autograd)
    made = [m for m in made if m is not None]
    concatenation = made[0] if made and made[0].name == "concatenation" else None
    return [Finding(kind="temporary-peak", bytes=joined["bytes"], pid=c.pid, device=c.device,
                    summary=tell("allocated-concatenation", **moment, concatenation=concatenation, joined=joined,
                                 pieces=pieces, grown=grown_told, cache_bytes=cache, loop=loop,
                                 called_at=evidence.get("loop_called_at"), loop_holder=evidence.get("loop_holder")),
                    evidence={**evidence, "joined": joined},
                    remedy=LOOP_REMEDIES.get(loop) or FINDINGS["concatenation-at-peak"],
                    claims=[words.as_json(m) for m in made])]


def _joined_in_loop(r: dict, readings: list, evidence: dict) -> dict | None:
    """What an earlier reading in the same run of the library's loop (same loop, same calling line,
    same step) found: a concatenation of pieces still held, and the name in the loop that held its
    result: the loop gathering batch after batch (kept as the evidence's `loop_joined`). None where
    none did."""
    earlier = [x for x in readings if x.get("joined") and x["t"] < r["t"] and x.get("loop") == r.get("loop")
               and x.get("loop_called_at") == r.get("loop_called_at") and x.get("step") == r.get("step")]
    if not earlier:
        return None
    x = earlier[-1]
    joined = x["joined"]
    evidence["loop_joined"] = {"t": x["t"], "bytes": joined["bytes"], "pieces": joined["pieces"],
                               "pieces_bytes": joined["pieces_bytes"], "held": joined.get("held"),
                               "holder": x.get("loop_holder")}
    return evidence["loop_joined"]


def _loop_gathering(gathered_bytes: int, blocks: int, phase: str, autograd: str | None) -> list:
    """The claims a library's loop that gathers batch after batch by concatenation makes beside the
    concatenation, whichever of its readings fell at the peak: the one at a concatenation, or one between
    two, with an earlier reading in the loop at a concatenation (the Trainer's evaluation_loop: both, in
    three runs of one program on the H200). So the same program gets the same finding every run."""
    graphs, unseen = _autograd(autograd)
    return [claims.make("gathered", bytes=gathered_bytes, blocks=blocks, phase=phase),
            graphs if graphs is not None else unseen]


def _autograd(autograd: str | None) -> tuple:
    """(`without-no-grad`, None) where autograd was seen at work (autograd_at), else (None, the
    `not-seen` claim that says it was not)."""
    graphs = claims.make("without-no-grad", autograd=autograd)
    return graphs, claims.not_seen(*AUTOGRAD_UNSEEN) if graphs is None else None
