"""The verdict each scenario must get, read from its own `# expect:` lines."""
from __future__ import annotations

from pathlib import Path

SCENARIO_DIR = Path(__file__).resolve().parents[1] / "scenarios"


def expectations(path: Path) -> tuple[str, list[str]]:
    """(`# expect: VERDICT`, [`# expect-finding: KIND`, ...]) from the file's first comment lines."""
    verdict = None
    findings = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        key, _, value = line[1:].partition(":")
        if key.strip() == "expect":
            verdict = value.strip()
        elif key.strip() == "expect-finding":
            findings.append(value.strip())
    if verdict is None:
        raise ValueError(f"{path} has no '# expect: VERDICT' line")
    return verdict, findings


def root_cause(path: Path) -> dict:
    """What a scenario says about its root cause: `# expect-holder:` (a start of the holder's path
    pattern), `# expect-holder-kind:`, `# expect-thread:` (a start of a thread name),
    `# expect-suspects-on:` (the finding that carries the suspects; the verdict's by default), and
    the line that allocates the memory, marked with a `# allocates` comment. Empty when it says
    nothing."""
    out: dict = {}
    lines = path.read_text().splitlines()
    for line in lines:
        if not line.startswith("#"):
            break
        key, _, value = line[1:].partition(":")
        if key.strip() in ("expect-holder", "expect-holder-kind", "expect-thread", "expect-suspects-on"):
            out[key.strip()[len("expect-"):]] = value.strip()
    if out:
        marked = [i for i, line in enumerate(lines, 1) if "# allocates" in line]
        if len(marked) != 1:
            raise ValueError(f"{path} must mark exactly one line with '# allocates'")
        out["line"] = marked[0]
    return out


def header(path: Path, key: str) -> str | None:
    """The value of `# KEY: value` in the scenario's first comment lines."""
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        name, _, value = line[1:].partition(":")
        if name.strip() == key:
            return value.strip()
    return None


def exit_status(path: Path) -> int:
    """`# expect-exit: N`: the target's exit status (0 when not given)."""
    value = header(path, "expect-exit")
    return int(value) if value is not None else 0


def extra_args(path: Path) -> list[str]:
    """`# expect-args: --trace on`: options the scenario is run with."""
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        key, _, value = line[1:].partition(":")
        if key.strip() == "expect-args":
            return value.split()
    return []


def scenarios(folder: Path = SCENARIO_DIR) -> list[Path]:
    return sorted(p for p in folder.glob("*.py") if not p.name.startswith("_"))


CORPUS_DIR = SCENARIO_DIR.parent / "corpus"


def corpus() -> list[Path]:
    """The real-library workloads (corpus/): each says what it expects, as a scenario does."""
    return scenarios(CORPUS_DIR)

