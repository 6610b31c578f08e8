"""CI check results drawn three ways: terminal lines, JUnit XML, and a GitHub step summary."""
from __future__ import annotations

import os
from xml.etree import ElementTree as ET

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..diagnosis.ci_checks import RANK_FIGURES, CheckResult
from ..recording.recording import Recording
from ..units import format_bytes as fb
from .vocabulary import peak_label

MAX_PARTS_SAID = 4  # the parts a message names, the largest first
MIN_PART_SAID = 1 << 20  # a part's change under 1 MiB is not named
SHARE_FROM_BYTES = 1 << 20  # a change is given as a share of the old figure from this size on


def render(console: Console, results: list[CheckResult]) -> None:
    """One line per check, failures marked."""
    if not results:
        return
    failed = sum(not r.passed for r in results)
    console.print(f"\nChecks   {len(results) - failed} passed, {failed} failed")
    table = Table(show_header=False, box=None, pad_edge=False, padding=(0, 0, 0, 0))
    table.add_column("mark", width=7)
    table.add_column("text", overflow="fold")
    for r in results:
        mark = Text("  ok", style="green") if r.passed else Text("  FAIL", style="bold red")
        table.add_row(mark, f"{r.name}: {message(r)}")
    console.print(table)


def message(r: CheckResult) -> str:
    """A check's message, with what filled the peak where a max-peak check failed, and what grew by
    category where a baseline check has the peak's parts on both sides."""
    text = r.message
    if r.made_of and not r.passed and r.peak is not None:
        c = r.peak
        where = f"process {c.pid}{f' on {c.host}' if c.host else ''}, GPU {'?' if c.device is None else c.device}"
        busiest = ", the reading with the most memory in use" if c.highest else ""
        text += f"; what filled it ({where}, {fb(c.total_bytes)}{busiest}): {parts_text(r.made_of)}"
    if r.grew_by is not None and r.grew_by["change"] > 0:
        text += f"; the largest peak's parts against the baseline: {growth_text(r.grew_by)}"
    return text


def parts_text(parts: list[tuple[str, int]], most: int = MAX_PARTS_SAID) -> str:
    """'optimizer state 1.00 GiB, parameters 512 MiB, ... and 2 more (96.0 MiB)'."""
    said = ", ".join(f"{peak_label(cat)} {fb(size)}" for cat, size in parts[:most])
    rest = parts[most:]
    return said + (f", and {len(rest)} more ({fb(sum(size for _, size in rest))})" if rest else "")


def growth_text(grew: dict) -> str:
    """'+1.20 GiB, of which optimizer state +1.00 GiB, parameters +200 MiB': the largest changes, up or down."""
    parts = [(cat, change) for cat, change in grew["parts"] if abs(change) >= MIN_PART_SAID][:MAX_PARTS_SAID]
    said = ", ".join(f"{peak_label(cat)} {fb(change, signed=True)}" for cat, change in parts)
    return fb(grew["change"], signed=True) + (f", of which {said}" if said else "")


def render_comparison(console: Console, old_verdict: str | None, new_verdict: str | None,
                      old: dict, new: dict, old_ranks: dict | None = None, new_ranks: dict | None = None,
                      grew: dict | None = None, old_parts: dict | None = None, new_parts: dict | None = None) -> None:
    """The two runs' figures side by side; with ranks, each rank's verdict and figures after; then the
    largest peak's parts, where a run has them, and what changed by category."""
    table = Table(show_header=True, box=None, pad_edge=False, padding=(0, 2, 0, 0))
    for name, justify in (("figure", "left"), ("old", "right"), ("new", "right"), ("change", "right")):
        table.add_column(name, justify=justify)
    table.add_row("verdict", old_verdict or "none", new_verdict or "none", "")
    for key in new:
        table.add_row(key, *_compared(old.get(key), new.get(key)))
    old_ranks, new_ranks = old_ranks or {}, new_ranks or {}
    for rank in sorted(set(old_ranks) | set(new_ranks)):
        a, b = old_ranks.get(rank), new_ranks.get(rank)
        table.add_row(f"rank {rank} verdict", (a or {}).get("verdict") or ("-" if a is None else "none"),
                      (b or {}).get("verdict") or ("-" if b is None else "none"), "")
        for key in RANK_FIGURES:
            table.add_row(f"rank {rank} {key}", *_compared((a or {}).get(key), (b or {}).get(key)))
    if old_parts is not None or new_parts is not None:
        for cat in dict.fromkeys([*(new_parts or {}), *(old_parts or {})]):
            a, b = (old_parts or {}).get(cat), (new_parts or {}).get(cat)
            if a or b:
                table.add_row(f"peak: {peak_label(cat)}", *_compared(a, b))
    console.print(table)
    if grew is not None:
        console.print(f"The largest peak: {growth_text(grew)}")


def comparison_notes(old: Recording, new: Recording) -> list[str]:
    """What `compare` says where its two reports are not one program's runs on one GPU model: a change
    between them may then come from the GPU, or be no change of the code at all."""
    notes = []
    if old.gpu_models != new.gpu_models:
        notes.append(f"the two reports were made on different GPUs (old: {_models(old)}; new: {_models(new)}): "
                     "what a program holds can depend on the GPU (a program that fills it holds more of a larger "
                     "one; its libraries may choose other kernels and workspaces there, its stream work may take "
                     "another time), so a change between them is not by itself a change in the code; compare "
                     "runs made on one GPU model")
    if old.program != new.program:
        notes.append(f"the two reports are of different programs (old: {old.command}; new: {new.command}): "
                     "their figures are not one program's before and after a change")
    elif _arguments(old) != _arguments(new):
        notes.append(f"the two reports are of one program run with different arguments (old: {old.command}; "
                     f"new: {new.command}): a change between them may come from the arguments")
    return notes


def _models(recording: Recording) -> str:
    return ", ".join(recording.gpu_models) or "no GPU recorded"


def _arguments(recording: Recording) -> list[str]:
    """The target's arguments after its script (or after -m and its module); a script among them (a
    launcher's: torchrun's train.py) by its file name, as the program is, so that one checkout against
    another is no difference."""
    argv = recording.target.get("argv") or []
    return [os.path.basename(a) if a.endswith(".py") else a for a in (argv[2:] if argv[:1] == ["-m"] else argv[1:])]


def _compared(a: int | None, b: int | None) -> tuple[str, str, str]:
    change = ""
    if a is not None and b is not None:
        # a share of a near-empty part says nothing (+6708359.4% of 1016 bytes)
        change = fb(b - a, signed=True) + (f" ({(b - a) / a * 100:+.1f}%)" if a >= SHARE_FROM_BYTES else "")
    return fb(a), fb(b), change


def junit_xml(results: list[CheckResult], suite: str = "gpumemdoctor", notes: list[str] = ()) -> str:
    """A JUnit XML document with one test case per check; the notes (`compare`'s) in the suite's
    standard output, which CI systems show beside its test cases."""
    root = ET.Element("testsuites")
    node = ET.SubElement(root, "testsuite", name=suite, tests=str(len(results)),
                         failures=str(sum(not r.passed for r in results)), errors="0")
    for r in results:
        case = ET.SubElement(node, "testcase", classname=suite, name=r.name)
        if not r.passed:
            failure = ET.SubElement(case, "failure", message=message(r))
            failure.text = message(r)
    if notes:
        ET.SubElement(node, "system-out").text = "".join(f"note: {n}\n" for n in notes)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def markdown_summary(title: str, verdict: str | None, figures: dict, results: list[CheckResult],
                     html: str | None = None, run_url: str | None = None, notes: list[str] = ()) -> str:
    """A GitHub step summary: the verdict, the notes, the HTML report's name, the figures, and the checks."""
    failed = [r for r in results if not r.passed]
    head = "failed" if failed else "passed"
    lines = [f"### gpumemdoctor: {title}", "",
             f"Verdict: **{verdict or 'none'}**; checks {head} "
             f"({len(results) - len(failed)} of {len(results)} passed)", ""]
    lines += [*(f"Note: {n}" for n in notes), ""] if notes else []
    if html:
        where = f"[this run's artifacts]({run_url})" if run_url else "this job's artifacts"
        lines += [f"HTML report: `{os.path.basename(html)}`, with the timeline, breakdown and suspects: "
                  f"upload it as an artifact and open it from {where}.", ""]
    lines += ["| figure | bytes |", "| --- | --- |"]
    for key, value in figures.items():
        lines.append(f"| {key} | {fb(value)} |")
    if results:
        lines += ["", "| check | result | detail |", "| --- | --- | --- |"]
        for r in results:
            detail = message(r).replace("|", "\\|")
            lines.append(f"| {r.name} | {'pass' if r.passed else '**FAIL**'} | {detail} |")
    return "\n".join(lines) + "\n\n"
