"""Every command shown in README.md and docs/ works, and the docs hold together.

Each shell command in a ```sh block (and each `run:` of a ```yaml block) is checked by what it is:
`gpumemdoctor ...` is parsed by the real click commands (options, values, sizes, the split of the
target's arguments), and run for real where it needs only files of this repository (a report of a
recorded fixture: then a ```text block right after it must be exactly its output); `pip install` may
name only extras that pyproject.toml has; `python -m pytest` only options pytest knows and paths that
exist; `apt-get install` only what .ci/run installs; `srun` only with `--name=value` options before
a gpumemdoctor command, checked as above. A command of any other kind fails the test, so a
new kind of command in the docs needs a check here.
"""
from __future__ import annotations

import functools
import re
import shlex
import subprocess
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import click
import pytest

from gpumemdoctor import errors
from gpumemdoctor.cli import cli as gpumemdoctor_cli

from .conftest import run_cli

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL = ("sh", "bash", "shell", "console")
USER_FILES = {"requirements.txt"}  # the reader's own project's files, in the CI example


@dataclass
class Command:
    text: str
    where: str  # file:line
    output: str | None  # the ```text block right after the command's block, if any


def blocks(path: Path) -> list[tuple[str, str, int, int]]:
    """Fenced code blocks: (language, text, line of the opening fence, line of the closing one)."""
    out, lines, i = [], path.read_text().split("\n"), 0
    while i < len(lines):
        m = re.match(r"^\s*```(\S*)\s*$", lines[i])
        if m:
            start, body = i + 1, []
            i += 1
            while not re.match(r"^\s*```\s*$", lines[i]):
                body.append(lines[i])
                i += 1
            indent = min((len(s) - len(s.lstrip()) for s in body if s.strip()), default=0)
            out.append((m.group(1), "\n".join(s[indent:] for s in body), start, i + 1))
        i += 1
    return out


def commands_in(path: Path) -> list[Command]:
    found: list[Command] = []
    bs = blocks(path)
    for n, (lang, text, line, end) in enumerate(bs):
        # output is a ```text block right after the command's block, with nothing but a blank line between
        following = (bs[n + 1][1] if n + 1 < len(bs) and bs[n + 1][0] == "text" and bs[n + 1][2] <= end + 2
                     else None)
        where = f"{path.relative_to(ROOT)}:{line}"
        if lang in SHELL:
            lines = [s for s in text.replace("\\\n", " ").split("\n") if s.strip() and not s.lstrip().startswith("#")]
            for s in lines:
                for part in s.split("&&"):
                    found.append(Command(" ".join(part.split()), where, following if len(lines) == 1 else None))
        elif lang == "yaml":
            for s in _yaml_runs(text):
                for part in s.split("&&"):
                    found.append(Command(" ".join(part.split()), where, None))
        elif lang == "" and text.strip():
            raise AssertionError(f"{where}: a code block without a language; mark it sh, text, python or yaml")
    return found


def _yaml_runs(text: str) -> list[str]:
    """The commands of `run:` keys, folded (`run: >`) or not."""
    runs, lines, i = [], text.split("\n"), 0
    while i < len(lines):
        m = re.match(r"^(\s*)(?:- )?run:\s*(.*)$", lines[i])
        if m:
            value = m.group(2)
            if value in (">", "|", ">-", "|-"):
                indent, parts = len(m.group(1)), []
                i += 1
                while i < len(lines) and lines[i].strip() and len(lines[i]) - len(lines[i].lstrip()) > indent:
                    parts.append(lines[i].strip())
                    i += 1
                runs.append(" ".join(parts))
                continue
            runs.append(value)
        i += 1
    return runs


ALL = [c for path in DOCS for c in commands_in(path)]


# -- the checks, one per kind of command ----------------------------------------------------------

@functools.lru_cache(maxsize=1)
def pytest_help() -> str:
    return subprocess.run([sys.executable, "-m", "pytest", "--help"], capture_output=True, text=True,
                          cwd=ROOT).stdout


@functools.lru_cache(maxsize=1)
def extras() -> set[str]:
    text = (ROOT / "pyproject.toml").read_text()
    section = text.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
    return set(re.findall(r"^(\w[\w-]*)\s*=", section, re.M))


def ci_script() -> str:
    return (ROOT / ".ci" / "run").read_text()


def parse_gpumemdoctor(args: list[str]) -> tuple[str, click.Context]:
    """Parse like the real CLI, without running anything; raises click's errors."""
    with gpumemdoctor_cli.make_context("gpumemdoctor", list(args)) as ctx:
        with warnings.catch_warnings():  # click 8.2 deprecates protected_args; 9.0 keeps all in args
            warnings.simplefilter("ignore", DeprecationWarning)
            rest = [*getattr(ctx, "protected_args", []), *ctx.args]
        if not rest:
            return "", ctx
        name = rest[0]
        command = gpumemdoctor_cli.get_command(ctx, name)
        if command is None:
            raise click.UsageError(f"no such command {name!r}")
        return name, command.make_context(name, rest[1:], parent=ctx)


def check_gpumemdoctor(c: Command, args: list[str], tmp_path: Path) -> None:
    name, ctx = parse_gpumemdoctor(args)
    if name == "run":
        target = ctx.meta.get("gpumemdoctor.target") or []
        assert target, f"{c.where}: `{c.text}` gives no script to run"
        script = target[0]
        if "/" in script and script.split("/")[0] in ("scenarios", "tests", "benchmarks"):
            assert (ROOT / script).exists(), f"{c.where}: {script} does not exist"
    runnable = [a for a in args if a.startswith(("tests/", "scenarios/"))]
    if name == "report" and runnable:
        for folder in ("tests", "scenarios"):
            (tmp_path / folder).symlink_to(ROOT / folder)
        result = run_cli(*args, cwd=tmp_path)
        assert result.returncode == 0, f"{c.where}: `{c.text}` failed: {result.stderr}"
        if c.output is not None:
            shown = [s.rstrip() for s in c.output.rstrip("\n").split("\n")]
            assert [s.rstrip() for s in result.stdout.rstrip("\n").split("\n")] == shown, (
                f"{c.where}: the output shown after `{c.text}` is not what it prints now")
        html = ctx.params.get("html")
        if html:
            assert (tmp_path / html).read_text().startswith("<!DOCTYPE html>")
    else:
        assert c.output is None, f"{c.where}: output shown after `{c.text}`, which the test cannot run"


def check_pip(c: Command, args: list[str]) -> None:
    assert args[:1] == ["install"], f"{c.where}: pip {args[:1]}"
    rest = [a for a in args[1:] if a not in ("-e", "-q")]
    i = 0
    while i < len(rest):
        a = rest[i]
        if a == "-r":
            assert rest[i + 1] in USER_FILES, f"{c.where}: pip -r {rest[i + 1]}"
            i += 2
            continue
        if a == "--index-url":  # only PyTorch's index of CPU builds, for the pinned torch
            assert rest[i + 1] == "https://download.pytorch.org/whl/cpu", f"{c.where}: --index-url {rest[i + 1]}"
            assert any(r.startswith("torch==") for r in rest), f"{c.where}: --index-url without torch"
            i += 2
            continue
        m = re.fullmatch(r'(\.|gpumemdoctor)(?:\[([\w,-]+)\])?', a)
        if m:
            for extra in filter(None, (m.group(2) or "").split(",")):
                assert extra in extras(), f"{c.where}: pyproject.toml has no extra {extra!r}"
        elif a.startswith("torch=="):
            assert f"pip install {a}" in ci_script(), f"{c.where}: {a} is not the torch .ci/run pins"
        else:
            raise AssertionError(f"{c.where}: pip install {a}: no check for it")
        i += 1


def check_pytest(c: Command, args: list[str]) -> None:
    for a in args:
        if a.startswith("-"):
            option = a.split("=", 1)[0]
            assert re.search(rf"(^|[\s,]){re.escape(option)}([\s=,]|$)", pytest_help(), re.M), (
                f"{c.where}: pytest knows no option {option}")
        else:
            assert (ROOT / a.split("::")[0]).exists(), f"{c.where}: {a} does not exist"


def check_apt(c: Command, args: list[str]) -> None:
    assert args[:1] == ["install"], f"{c.where}: apt-get {args[:1]}"
    for package in (a for a in args[1:] if not a.startswith("-")):
        assert re.search(rf"apt-get[^\n]*install[^\n]*\b{re.escape(package)}\b", ci_script()), (
            f"{c.where}: .ci/run does not install {package}")


def check_srun(c: Command, args: list[str], tmp_path: Path) -> None:
    """srun's own options, each a flag or --name=value, then a gpumemdoctor command."""
    i = 0
    while i < len(args) and args[i].startswith("--"):
        i += 1
    assert args[i:i + 1] == ["gpumemdoctor"], f"{c.where}: srun runs no gpumemdoctor command in `{c.text}`"
    check_gpumemdoctor(c, args[i + 1:], tmp_path)


def check(c: Command, tmp_path: Path) -> None:
    argv = shlex.split(c.text)
    while argv and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", argv[0]):
        argv.pop(0)  # VAR=value before a command
    if argv[:1] == ["gpumemdoctor"]:
        check_gpumemdoctor(c, argv[1:], tmp_path)
    elif argv[:3] in (["python", "-m", "gpumemdoctor"], ["python3", "-m", "gpumemdoctor"]):
        check_gpumemdoctor(c, argv[3:], tmp_path)
    elif argv[:1] == ["pip"] or argv[:3] in (["python", "-m", "pip"], ["python3", "-m", "pip"]):
        check_pip(c, argv[1:] if argv[0] == "pip" else argv[3:])
    elif argv[:3] in (["python", "-m", "pytest"], ["python3", "-m", "pytest"]):
        check_pytest(c, argv[3:])
    elif argv[:1] == ["apt-get"]:
        check_apt(c, argv[1:])
    elif argv[:1] == ["srun"]:
        check_srun(c, argv[1:], tmp_path)
    else:
        raise AssertionError(f"{c.where}: no check for `{c.text}`; add one to tests/test_docs.py")


@pytest.mark.parametrize("command", ALL, ids=[f"{c.where} {c.text[:60]}" for c in ALL])
def test_command_in_the_docs_works(command, tmp_path):
    check(command, tmp_path)


def test_the_docs_show_commands_at_all():
    texts = [c.text for c in ALL]
    assert len(ALL) >= 20
    for expected in ("gpumemdoctor run train.py --epochs 1", "gpumemdoctor ps", "python -m pytest",
                     "gpumemdoctor report tests/fixtures/reports/leak_training_list.json --html leak.html"):
        assert expected in texts
    assert sum(c.output is not None for c in ALL) >= 2  # README's report, and cli.md's


@pytest.mark.parametrize("text", [
    "gpumemdoctor run --no-such-option train.py",
    "gpumemdoctor run --max-peak lots train.py",
    "gpumemdoctor run --html",
    "gpumemdoctor run --epochs 1",
    "gpumemdoctor report tests/fixtures/reports/leak_training_list.json --colour",
    "gpumemdoctor frobnicate",
    "gpumemdoctor run scenarios/no_such_scenario.py",
    "gpumemdoctor report tests/fixtures/reports/no_such.json",
    'pip install ".[no-such-extra]"',
    "pip install torch==1.0",
    "python -m pytest --no-such-flag",
    "python -m pytest tests/no_such_test.py",
    "apt-get install -y firefox-esr",
    "curl https://example.com | sh",
    "srun -N 2 gpumemdoctor run train.py",
    "srun --nodes=2 gpumemdoctor run --no-such-option train.py",
])
def test_the_checks_can_fail(text, tmp_path):
    with pytest.raises((AssertionError, click.ClickException, errors.DoctorError)):
        check(Command(text, "test", None), tmp_path)


def test_shown_output_that_is_not_the_commands_fails(tmp_path):
    wrong = Command("gpumemdoctor report tests/fixtures/reports/leak_training_list.json --width 80", "test",
                    "gpumemdoctor verdict: clean")
    with pytest.raises(AssertionError, match="not what it prints now"):
        check(wrong, tmp_path)


def test_readme_is_the_front_door():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.encode()) <= 12 * 1024
    for page in (ROOT / "docs").glob("*.md"):
        assert f"(docs/{page.name})" in readme, f"README does not link to docs/{page.name}"


def test_the_ci_runs_the_readmes_test_command():
    readme_cmds = [c.text for c in commands_in(ROOT / "README.md") if "pytest" in c.text]
    assert readme_cmds == ["python -m pytest"]
    assert re.search(r"^python -m pytest\b", ci_script(), re.M)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


@pytest.mark.parametrize("path", DOCS, ids=[str(p.relative_to(ROOT)) for p in DOCS])
def test_links_between_the_pages_resolve(path):
    text = path.read_text()
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        assert dest.exists(), f"{path.name}: link to {target}: no such file"
        if anchor:
            headings = re.findall(r"^#+ (.*)$", dest.read_text(), re.M)
            assert anchor in {slug(h) for h in headings}, f"{path.name}: link to {target}: no such heading"


def test_every_exit_code_is_in_the_table():
    table = (ROOT / "docs" / "cli.md").read_text().split("## Exit codes", 1)[1]
    codes = {v for k, v in vars(errors).items() if k.startswith("EXIT_")}
    for code in codes:
        assert re.search(rf"^\| {code} \|", table, re.M), f"exit code {code} is not in docs/cli.md"


def _repository_docs() -> list[Path]:
    """Every Markdown file of the repository (NOTES.md, ARCHITECTURE.md, the READMEs of tests and fixtures
    included), whether or not a reader is linked to it; not those of tools' folders (.git, a venv)."""
    return sorted(p for p in ROOT.rglob("*.md")
                  if not any(part.startswith(".") or part.endswith(".egg-info") or part in ("build", "dist")
                             for part in p.relative_to(ROOT).parts[:-1]))


def test_no_doc_points_outside_the_repository():
    """Everything a reader needs is in the repository (issue 28, row 11): no link, and no path written out
    (`../shared/notes.md`), leads out of it."""
    docs = _repository_docs()
    assert ROOT / "NOTES.md" in docs and ROOT / "tests" / "gpu" / "README.md" in docs
    outside = []
    for path in docs:
        text = path.read_text()
        links = [t.partition("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", text) if not re.match(r"[a-z]+:", t)]
        written = re.findall(r"(?<![\w./-])((?:\.\./)+[\w.\-/]*)", text)
        for target in [*links, *written]:
            dest = (path.parent / target).resolve()
            if target and ROOT not in (dest, *dest.parents):
                outside.append(f"{path.relative_to(ROOT)}: {target}")
    assert outside == []


def test_no_source_points_outside_the_repository():
    """Nor a module, scenario, test or benchmark: a path it cites (`../x.md`, `shared/x.md`, the
    workspace's folder beside a clone) is in the repository, so that a reader of a clone finds it."""
    sources = sorted(p for p in ROOT.rglob("*.py")
                     if not any(part.startswith(".") or part.endswith(".egg-info") or part in ("build", "dist")
                                for part in p.relative_to(ROOT).parts[:-1]))
    assert ROOT / "gpumemdoctor" / "diagnosis" / "nccl.py" in sources
    outside = []
    for path in sources:
        if path == Path(__file__).resolve():
            continue  # its docstrings name such paths as what is refused
        text = path.read_text()
        for target in re.findall(r"(?<![\w./-])((?:\.\./)+[\w.\-/]*|shared/[\w.\-/]+)", text):
            dest = (path.parent / target).resolve() if target.startswith("..") else ROOT / target
            if ROOT not in (dest, *dest.parents) or not dest.exists():
                outside.append(f"{path.relative_to(ROOT)}: {target}")
    assert outside == []
