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


def scenarios() -> list[Path]:
    return sorted(p for p in SCENARIO_DIR.glob("*.py") if not p.name.startswith("_"))
