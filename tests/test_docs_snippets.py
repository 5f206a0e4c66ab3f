"""Every code block of README.md and docs/ is checked, or says why not (issue 31, item 4).

The line before a fenced block (blank lines aside) is an HTML comment that says what the tests do with it:

    <!-- snippet: cli -->            every `slurmlaunch ...` command in it (also inside `&&`, `|` and `$(...)`)
                                     is parsed by the CLI's own parser; a `submit` (without --remote) is also
                                     run with --dry-run in a scratch project: the request is validated and the
                                     batch script rendered, nothing is submitted. Usage lines are read with
                                     their [optional] parts given and PLACEHOLDERS filled in.
    <!-- snippet: run -->            run by bash in the scratch project, HOME there too; it must exit 0
    <!-- snippet: python -->         compiled, and its use of the API checked: every `slurmlaunch.NAME` is in
                                     __all__, every keyword of submit/map_array/batch/submit_script is a job
                                     option or a parameter, every method called on their jobs exists
    <!-- snippet: python-run -->     checked as `python`, then run as a script in the scratch project (the local
                                     scheduler: a job of a few ranks, seconds); it must exit 0
    <!-- snippet: file NAME -->      written to NAME in the page's scratch project, for the blocks after it
                                     (a .toml file is parsed, and its profiles are then the ones `cli` uses)
    <!-- snippet: illustrative: WHY -->  not run: WHY says why (a real cluster, root, sample output, ...)

A block without such a line fails test_every_code_block_is_checked_or_marked_illustrative. All of it takes
a few seconds: the parser, --dry-run and the API's names; nothing waits for a job. The reference pages' generated
parts (between `<!-- generated: ... -->` and `<!-- end generated -->`: signatures, `launch`'s usage) are written
from the code, not by hand, and tests/test_docs.py checks them against it; their blocks are not read here.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
MARK = re.compile(r"<!-- snippet: (cli|run|python|python-run|file [\w./-]+|illustrative: [^>]*\S) -->")
# What a usage line's placeholders stand for (`slurmlaunch logs JOB [--rank N]`).
PLACEHOLDERS = {"JOB": "1234", "N": "3", "P": "gpu", "S": "30", "NAME": "booster"}


@dataclass
class Block:
    page: str
    line: int  # of the opening fence, 1-based
    language: str
    text: str
    mark: str | None

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of a Markdown page, each with the snippet comment before it (or None)."""
    lines = path.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        if lines[i].startswith("<!-- generated: "):  # docs/hooks/reference.py's part: skip to its end line
            i = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "<!-- end generated -->"), i) + 1
            continue
        fence = re.match(r"^(\s*)(```+|~~~+)\s*([\w+-]*)", lines[i])
        if not fence:
            i += 1
            continue
        indent, marker, language = fence.groups()
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == marker), len(lines))
        before = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        mark = MARK.fullmatch(before)
        body = "\n".join(line[len(indent):] for line in lines[i + 1:end])
        found.append(Block(str(path.relative_to(ROOT)), i + 1, language, body, mark[1] if mark else None))
        i = end + 1
    return found


ALL = [b for page in PAGES for b in blocks(page)]


def test_every_code_block_is_checked_or_marked_illustrative() -> None:
    assert len(ALL) > 30, len(ALL)  # the pages were read
    unmarked = [f"{b.where} ({b.text.splitlines()[0] if b.text else ''})" for b in ALL if b.mark is None]
    assert unmarked == [], ("code blocks with no <!-- snippet: ... --> line before them (tests/test_docs_snippets.py "
                            "says which kinds there are)")
    stray = [f"{page.relative_to(ROOT)}: {m}" for page in PAGES
             for m in re.findall(r"^[ \t]*" + MARK.pattern + r"[ \t]*$", page.read_text(), re.M)]
    assert len(stray) == len(ALL), "a snippet comment that is not right before a code block"
    # the illustrative ones stay the exception: most of what the docs show runs
    illustrative = [b for b in ALL if b.mark and b.mark.startswith("illustrative")]
    assert len(illustrative) * 2 < len(ALL), [b.where for b in illustrative]


# --- the shell blocks --------------------------------------------------------------------------------------------


def logical_lines(text: str) -> list[str]:
    """Lines with their backslash continuations joined."""
    return text.replace("\\\n", " ").splitlines()


def without_comment(line: str) -> str:
    """A shell line without its comment: from a # that starts a word, outside quotes."""
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def slurmlaunch_commands(text: str) -> list[list[str]]:
    """Every `slurmlaunch ...` command of a shell block, as argv after the program name."""
    commands: list[list[str]] = []
    for line in map(without_comment, logical_lines(text)):
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split, lexer.commenters = True, ""
        words = list(lexer)
        for inner in re.findall(r"\$\((slurmlaunch [^)]*)\)", line):  # eval "$(slurmlaunch completion bash)"
            commands += slurmlaunch_commands(inner)
        current: list[str] | None = None
        for word in words:
            if word in ("&&", "||", ";", "|", ">", ">>", "(", ")", "&"):
                if current is not None:
                    commands.append(current)
                current = None
            elif current is not None:
                current.append(word)
            elif word == "slurmlaunch":
                current = []
        if current is not None:
            commands.append(current)
    return commands


def usage_to_argv(words: list[str]) -> list[str]:
    """A usage line's words as a command line: [optional] parts given, placeholders filled in."""
    return [PLACEHOLDERS.get(w.strip("[]"), w.strip("[]")) for w in words if w.strip("[]")]


def scratch_project(tmp_path: Path, page: str, placeholders: bool = True) -> Path:
    """The project a page's blocks run in: the files its `file` blocks write and (``placeholders``: for the
    blocks only parsed or dry-run) empty scripts of the names they use. A `run` block gets no placeholders: a
    reader who runs it has only what the page wrote (a `train.py` the page never shows is a "not found")."""
    project = tmp_path / "project"
    if not project.exists():
        for script in ("train.py", "mpi_prog.py", "examples/train_ddp.py", "pkg/__init__.py", "pkg/train.py"):
            if placeholders:
                (project / script).parent.mkdir(parents=True, exist_ok=True)
                (project / script).write_text("")
        (project / ".config" / "fish" / "completions").mkdir(parents=True)
        (project / "templates").mkdir()  # a profile's template-dir
        for b in ALL:
            if b.page == page and b.mark and b.mark.startswith("file "):
                (project / b.mark.split(" ", 1)[1]).write_text(b.text + "\n")
    return project


def clean_env(project: Path) -> dict[str, str]:
    """No Slurm, PBS or slurmlaunch settings of the machine running the tests; HOME is the project, and so is
    the per-user state: a reader's `slurmlaunch list` shows the jobs the page made, not every job this test
    process's earlier tests left in the session's index (each a state to ask for)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM", "PBS_", "PET_", "XDG_CONFIG", "XDG_STATE")) and k not in ("SQUEUE_FORMAT",)}
    env.update(HOME=str(project), SLURM_CONF=str(project / "no-slurm.conf"),
               XDG_STATE_HOME=str(project / ".local" / "state"),
               PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]))
    return env


def parse_error(argv: list[str]) -> str | None:
    """What the CLI's parser says about argv (None: it parses)."""
    import contextlib
    import io

    from slurmlaunch.cli import _parser

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            _parser(profiles=False, command=argv[0] if argv else None).parse_args(argv)
        except SystemExit as e:
            return None if e.code == 0 else err.getvalue().strip() or f"exit {e.code}"
    return None


def profile_scheduler(argv: list[str], project: Path) -> str:
    """The scheduler the --profile of a submit command line sets (auto without one)."""
    import json

    name = next((argv[i + 1] for i, w in enumerate(argv[:-1]) if w == "--profile"), None)
    if name is None:
        return "auto"
    r = subprocess.run([sys.executable, "-m", "slurmlaunch", "config", "show", "--profile", name, "--json"],
                       cwd=project, env=clean_env(project), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return str(json.loads(r.stdout)["options"]["scheduler"]["value"])


CLI = [b for b in ALL if b.mark == "cli"]


@pytest.mark.parametrize("block", CLI, ids=[b.where for b in CLI])
def test_cli_block(block: Block, tmp_path: Path) -> None:
    commands = slurmlaunch_commands(block.text)
    assert commands, "a `cli` block without a slurmlaunch command (mark it illustrative, or run)"
    project = scratch_project(tmp_path, block.page)
    for words in commands:
        argv = usage_to_argv(words)
        assert parse_error(argv) is None, (argv, parse_error(argv))
        if argv[0] != "submit" or any(w.startswith("--remote") for w in argv):
            continue  # --remote --dry-run still asks the ssh destination: the parse is the check here
        # Slurm's script unless the command, or its profile (polaris is a PBS site), names the scheduler
        named = any(w.startswith("--scheduler") for w in argv) or profile_scheduler(argv, project) != "auto"
        r = subprocess.run([sys.executable, "-m", "slurmlaunch", "submit", "--dry-run",
                            *([] if named else ["--scheduler", "slurm"]), *argv[1:]],
                           cwd=project, env=clean_env(project), capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, (argv, r.stderr[-2000:])
        assert re.search(r"would run: (sbatch|qsub) ", r.stdout + r.stderr), (argv, r.stdout[-2000:], r.stderr[-2000:])


RUN = [b for b in ALL if b.mark == "run"]


@pytest.mark.parametrize("block", RUN, ids=[b.where for b in RUN])
def test_run_block(block: Block, tmp_path: Path) -> None:
    project = scratch_project(tmp_path, block.page, placeholders=False)
    env = clean_env(project)
    env["PATH"] = os.pathsep.join([str(ROOT / ".venv" / "bin"), env["PATH"]]) if (ROOT / ".venv").is_dir() else \
        env["PATH"]
    r = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block.text], cwd=project, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, (block.text, r.stdout[-1000:], r.stderr[-2000:])


FILES = [b for b in ALL if b.mark and b.mark.startswith("file ")]


@pytest.mark.parametrize("block", FILES, ids=[b.where for b in FILES])
def test_file_block(block: Block, tmp_path: Path) -> None:
    """A file the docs show: a TOML file parses, and the profiles it defines are what `config` shows."""
    name = block.mark.split(" ", 1)[1] if block.mark else ""
    if not name.endswith(".toml"):
        return
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    data = tomllib.loads(block.text)
    project = scratch_project(tmp_path, block.page)
    for profile in data.get("profiles", {}):
        r = subprocess.run([sys.executable, "-m", "slurmlaunch", "config", "show", "--profile", profile],
                           cwd=project, env=clean_env(project), capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and f"profile: {profile}\n" in r.stdout, (profile, r.stdout, r.stderr)
        from_file = {line.split(" = ")[0].strip() for line in r.stdout.splitlines()
                     if " = " in line and "<- built-in default" not in line}
        assert set(data["profiles"][profile]) <= from_file, (profile, r.stdout)


# --- the Python blocks ---------------------------------------------------------------------------------------------

PYTHON = [b for b in ALL if b.mark in ("python", "python-run")]


def api_classes() -> dict[str, list[type]]:
    """What each API function returns (a handle's class; map_array: a list of them), for the names a snippet calls (a
    RemoteJob answers the same questions as a Job: tests/real/test_remote_api.py)."""
    from slurmlaunch.app.api import Batch, Job

    return {"submit": [Job], "submit_script": [Job], "map_array": [list], "batch": [Batch]}


@pytest.mark.parametrize("block", PYTHON, ids=[b.where for b in PYTHON])
def test_python_block(block: Block) -> None:
    import inspect

    import slurmlaunch
    from slurmlaunch.app.api.job_options import OPTION_NAMES

    tree = ast.parse(block.text, filename=block.where)
    classes = api_classes()
    handles: dict[str, str] = {}  # a variable -> the API function whose result it holds
    problems: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "slurmlaunch":
            if node.attr not in slurmlaunch.__all__:
                problems.append(f"slurmlaunch.{node.attr} is not in slurmlaunch.__all__")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                isinstance(node.func.value, ast.Name) and node.func.value.id == "slurmlaunch" and \
                node.func.attr in classes:
            params = set(inspect.signature(getattr(slurmlaunch, node.func.attr)).parameters)
            for kw in node.keywords:
                if kw.arg is not None and kw.arg not in params | OPTION_NAMES | {"profile"}:
                    problems.append(f"slurmlaunch.{node.func.attr}(..., {kw.arg}=...): not a job option")
        if isinstance(node, ast.Assign | ast.withitem):
            value = node.value if isinstance(node, ast.Assign) else node.context_expr
            targets = node.targets if isinstance(node, ast.Assign) else [node.optional_vars]
            if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and \
                    isinstance(value.func.value, ast.Name) and value.func.value.id == "slurmlaunch":
                handles.update({t.id: value.func.attr for t in targets if isinstance(t, ast.Name)})
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in handles:
            kinds = classes.get(handles[node.value.id], [])
            if kinds and not all(hasattr(k, node.attr) for k in kinds) and \
                    not any(node.attr in getattr(k, "__slots__", ()) or node.attr in _instance_attributes(k)
                            for k in kinds):
                problems.append(f"{node.value.id}.{node.attr}: what {handles[node.value.id]}() returns has no such "
                                f"attribute")
    assert problems == []


PYTHON_RUN = [b for b in ALL if b.mark == "python-run"]


@pytest.mark.parametrize("block", PYTHON_RUN, ids=[b.where for b in PYTHON_RUN])
def test_python_run_block(block: Block, tmp_path: Path) -> None:
    project = scratch_project(tmp_path, block.page)
    (project / "snippet.py").write_text(block.text + "\n")
    r = subprocess.run([sys.executable, "snippet.py"], cwd=project, env=clean_env(project), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    # `print(x)    # WHAT IT PRINTS` (with ... for what is left out): the output has such a line
    said = [python_comment(line) for line in block.text.splitlines() if "print(" in line and "# " in line]
    for comment in said:
        pattern = ".*".join(re.escape(part.strip(" ,")) for part in comment.split("..."))
        assert re.search(pattern, r.stdout), (comment, r.stdout)


def python_comment(line: str) -> str:
    """The comment of a Python line (after its last `#  `)."""
    return line.rsplit("# ", 1)[1].strip()


def _instance_attributes(cls: type) -> set[str]:
    """The attributes __init__ sets (self.NAME = ...)."""
    import inspect
    import textwrap

    try:
        source = textwrap.dedent(inspect.getsource(cls.__init__))  # type: ignore[misc]
    except (OSError, TypeError):
        return set()
    return set(re.findall(r"self\.(\w+)\s*(?::[^=]*)?=", source))
