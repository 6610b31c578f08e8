"""The baseline file of `run --baseline` and `--update-baseline`: read strictly, written whole. The
document and its declared shape are the CI checks' (diagnosis/ci_checks.py: `baseline_document`,
`parse_baseline`); reading and writing the file is here."""
from __future__ import annotations

import json

from ..diagnosis.ci_checks import parse_baseline
from ..errors import BadReportError
from ..files.inputs import read_json
from ..files.outputs import write_text

MAX_BASELINE_BYTES = 1 << 20


def load_baseline(path: str) -> dict:
    """The figures of a baseline file (ci_checks.parse_baseline), or the error that names what is wrong."""
    obj = read_json(path, MAX_BASELINE_BYTES, "baseline",
                    missing=f"baseline {path} does not exist: make it with --update-baseline")
    try:
        return parse_baseline(obj)
    except BadReportError as exc:
        raise BadReportError(f"{path} is not a valid baseline: {exc}") from None


def write_baseline(path: str, document: dict) -> None:
    """Write a baseline file, replacing the one there (as outputs.write_text writes every file)."""
    write_text(json.dumps(document, indent=1) + "\n", path, force=True, what="baseline")
