"""Schedulers as plug-ins: the registry lists each once, every edge implements the whole interface with facts
that point at real things (JobSpec fields, core.detect readers, the CLI's choices), and nothing outside
schedulers/ asks which scheduler it holds (it asks what the scheduler can do)."""

from __future__ import annotations

import ast
import inspect
from collections.abc import Iterator
from pathlib import Path

import pytest

import slurmlaunch
from slurmlaunch.app.options import SUBMIT_OPTIONS
from slurmlaunch.core import detect, detect_mpi
from slurmlaunch.core.errors import SpecError
from slurmlaunch.core.spec import PART_OF, JobSpec
from slurmlaunch.schedulers import interface, registry
from slurmlaunch.schedulers.registry import ACCEPTED, NAMES, PLUGINS, scheduler
from slurmlaunch.schedulers.support import flag

ROOT = Path(slurmlaunch.__file__).parent
EVERY_NAME = frozenset(ACCEPTED)


def _members(protocol: type) -> list[str]:
    return sorted(n for n in vars(protocol) if not n.startswith("_"))


def test_names_and_aliases_are_unique() -> None:
    assert len(ACCEPTED) == len(set(ACCEPTED)) and "auto" not in ACCEPTED
    assert len({p.module for p in PLUGINS}) == len(PLUGINS)


@pytest.mark.parametrize("plugin", PLUGINS, ids=[p.name for p in PLUGINS])
def test_each_edge_implements_the_interface(plugin: registry.Plugin) -> None:
    edge = scheduler(plugin.name)
    assert edge.name == plugin.name and all(scheduler(a) is edge for a in plugin.aliases)
    members = _members(interface.Scheduler)
    assert len(members) > 20
    for member in members:
        assert hasattr(edge, member), f"{plugin.name}: no {member}"
        declared = vars(interface.Scheduler)[member]
        if inspect.isfunction(declared):  # a method there is a method here, taking the same parameters
            mine = getattr(edge, member)
            assert callable(mine), f"{plugin.name}.{member}"
            wanted = list(inspect.signature(declared).parameters)[1:]
            assert list(inspect.signature(mine).parameters) == wanted, f"{plugin.name}.{member}"
    assert edge.title and isinstance(edge.queued, bool)
    # a queued scheduler has a client to look for and a script to keep; the fallback needs neither
    assert (edge.client is not None) == edge.queued == bool(edge.script_suffix)
    readers = {f.__name__ for f in (*detect.READERS, detect_mpi.read_mpi)}
    assert edge.readers and set(edge.readers) <= readers, edge.readers


@pytest.mark.parametrize("plugin", PLUGINS, ids=[p.name for p in PLUGINS])
def test_each_refusal_names_an_option_of_the_request(plugin: registry.Plugin) -> None:
    edge = scheduler(plugin.name)
    fields = set(PART_OF)
    flags = {o.flags[0] for _, group in SUBMIT_OPTIONS for o in group}
    tables = [edge.refusals.not_carried_out, edge.refusals.values,
              edge.refusals.more(JobSpec.of(script="", pbs_flavour="torque")) if edge.refusals.more else {}]
    for table in tables:
        for name in table:
            assert name in fields and flag(name) in flags, (plugin.name, name)
    for name, (values, _) in edge.refusals.values.items():
        assert values and all(isinstance(v, str) for v in values), (plugin.name, name)


def test_auto_tries_the_queued_ones_then_falls_back() -> None:
    edges = [scheduler(n) for n in NAMES]
    fallbacks = [e.name for e in edges if e.client is None]
    assert fallbacks == [NAMES[-1]], "one scheduler needs no client, and --scheduler auto tries it last"


def test_the_cli_offers_the_registrys_names() -> None:
    """options.py stays cheap to import (it cannot import the schedulers package), so it spells the shipped
    names itself: they must be the registry's (an installed plug-in's are taken too: tests/plugin/)."""
    opt = next(o for _, group in SUBMIT_OPTIONS for o in group if o.flags[0] == "--scheduler")
    assert tuple(opt.choices or ()) == ("auto", *registry.SHIPPED, *(a for p in PLUGINS for a in p.aliases))


def test_an_unknown_name_is_refused_naming_the_valid_ones() -> None:
    with pytest.raises(SpecError, match=r"scheduler 'lsf' is not valid \(expected auto, " + ", ".join(ACCEPTED)):
        scheduler("lsf")


# --- no scheduler-name branch outside schedulers/ ------------------------------------------------------------

def _names_in(node: ast.AST) -> Iterator[str]:
    """The scheduler names a comparison operand, a match pattern or a dict key spells out."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in EVERY_NAME:
        yield node.value
    elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        for element in node.elts:
            yield from _names_in(element)


def scheduler_branches(source: str) -> list[tuple[int, str]]:
    """(line, code) of each place ``source`` branches on a scheduler's name: a comparison with one (==, !=,
    in, not in: `name == "pbs"`, `name in ("slurm", "local")`), a match case on one, or a table keyed by
    them ({"slurm": ...}: a branch written as data)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            if any(True for operand in (node.left, *node.comparators) for _ in _names_in(operand)):
                found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.MatchValue):
            if any(True for _ in _names_in(node.value)):
                found.append((node.lineno, f"case {ast.unparse(node)}"))
        elif isinstance(node, ast.Dict):
            if any(True for key in node.keys if key is not None for _ in _names_in(key)):
                found.append((node.lineno, ast.unparse(node)[:80]))
    return found


def test_the_branch_finder_finds_branches() -> None:
    """The guard below cannot pass by finding nothing: each form of a name branch is caught, and what only
    names a scheduler (a call's argument, a record's value) is not."""
    caught = ('if edge_name == "pbs": pass', 'x = kind in ("slurm", "local")', 'y = "slurm" != s',
              'match s:\n    case "local":\n        pass', 'T = {"pbs": 1}')
    for source in caught:
        assert scheduler_branches(source), source
    for source in ('remember(job_id, "slurm", record, name)', 'd = {"scheduler": "local"}', 'x = a == "slurmd"',
                   'x = kind in ("srun", "torchrun")'):
        assert not scheduler_branches(source), source


# (file name, code) -> why it is not a scheduler branch. Kept by file name and code, not line: rooms move.
EXEMPT = {
    ("cli.py", "ns.scheduler == 'pbs'"): "`dev-cluster --scheduler pbs` picks which test cluster to start "
                                         "(app/devcluster/), not a scheduler edge",
}


def test_no_scheduler_name_is_branched_on_outside_schedulers() -> None:
    """app/, core/, render/, allocation/ and the CLI ask a scheduler what it can do (interface.py), never
    which one it is: a new scheduler then needs no change there (README: Where to add a scheduler)."""
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        if (ROOT / "schedulers") in path.parents:
            continue
        found += [f"{path.relative_to(ROOT)}:{line}: {code}" for line, code in scheduler_branches(path.read_text())
                  if (path.name, code) not in EXEMPT]
    assert not found, "scheduler names branched on outside schedulers/ (ask the edge instead):\n" + "\n".join(found)


# --- no specific scheduler imported outside schedulers/ -----------------------------------------------------
# The modules of schedulers/ every scheduler shares (the interface, the registry and auto's choice, the refusal
# rule, the one command runner, the index of jobs, the package's records and submission helpers) and the rank
# supervisor (the local scheduler's and `slurmlaunch run`'s: no scheduler's own). Every other module there is one
# scheduler's, reached only through registry.scheduler(name): a new module there is a scheduler's until listed.
SHARED = frozenset({"interface", "registry", "choice", "support", "runner", "index", "supervisor"})
PACKAGE = "slurmlaunch"


def _module_of(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(source: str, module: str, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, absolute module name) of every module ``source`` (the text of ``module``) may import: import
    statements (relative ones resolved; ``from X import Y`` counts X.Y too, Y may be a module) and calls of
    importlib.import_module / __import__ with a literal name, anywhere in the file (inside functions too)."""
    package = module if is_package else module.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                where = ".".join([*base, *([node.module] if node.module else [])])
            else:
                where = node.module or ""
            found.append((node.lineno, where))
            if not specific_scheduler(where):  # from a scheduler's module: that module is what it imports
                found += [(node.lineno, f"{where}.{alias.name}") for alias in node.names]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            func = ast.unparse(node.func)
            if func in ("importlib.import_module", "import_module", "__import__"):
                name = node.args[0].value
                if name.startswith(".") and len(node.args) > 1:
                    name = f"{ast.unparse(node.args[1]).strip(chr(34) + chr(39))}{name}"
                found.append((node.lineno, name))
    return found


def specific_scheduler(name: str) -> str | None:
    """The scheduler module of schedulers/ that module ``name`` is or lies in, unless a shared one."""
    parts = name.split(".")
    if parts[:2] != [PACKAGE, "schedulers"] or len(parts) < 3 or parts[2] in SHARED:
        return None
    # `from ..schedulers import JobStatus`: a name of the package, not a module of it
    return name if (ROOT / "schedulers" / f"{parts[2]}.py").exists() or not parts[2][:1].isupper() \
        and (ROOT / "schedulers" / parts[2]).is_dir() else None


def test_the_import_finder_resolves_every_form() -> None:
    """The guard below cannot pass by finding nothing: each way of reaching a scheduler's module is caught,
    and what only reaches the shared modules is not."""
    here = "slurmlaunch.app.jobs.commands"
    caught = ["from ...schedulers import slurm", "from ...schedulers.pbs import qsub_command",
              "import slurmlaunch.schedulers.local", "from slurmlaunch.schedulers import local as edge",
              "def f():\n    from ...schedulers.local_stepenv import step_env",
              "importlib.import_module('slurmlaunch.schedulers.slurm')", "__import__('slurmlaunch.schedulers.pbs')"]
    for source in caught:
        assert any(specific_scheduler(m) for _, m in imported_modules(source, here)), source
    for source in ("from ...schedulers import JobStatus, is_final", "from ...schedulers.registry import scheduler",
                   "from ...schedulers.interface import Scheduler", "from ..slurm import x",
                   "import slurmlaunch.schedulers"):
        assert not any(specific_scheduler(m) for _, m in imported_modules(source, here)), source


def still_to_go() -> set[tuple[str, str]]:
    """(importer, scheduler module) pairs pyproject.toml's import-linter contract "No module outside schedulers/
    imports a specific scheduler" still ignores: one list for both guards, each pair a debt to remove."""
    import tomllib

    config = tomllib.loads((ROOT.parent / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    contract = next(c for c in config if c["name"] == "No module outside schedulers/ imports a specific scheduler")
    return {tuple(x.strip() for x in pair.split("->")) for pair in contract.get("ignore_imports", [])}  # type: ignore[misc]


def test_no_module_outside_schedulers_imports_a_specific_scheduler() -> None:
    """issue 39: app/, the CLI, core/, render/ and allocation/ reach a scheduler through the registry and the
    interface only, so an installed plug-in is one of them (tests/plugin/) and none is special. The imports
    still to go are listed once (still_to_go); a listed one that is gone must leave the list."""
    found: dict[tuple[str, str], list[str]] = {}
    for path in sorted(ROOT.rglob("*.py")):
        if (ROOT / "schedulers") in path.parents:
            continue
        module = _module_of(path)
        for line, name in imported_modules(path.read_text(), module, path.name == "__init__.py"):
            target = specific_scheduler(name)
            if target:
                edge = ".".join(target.split(".")[:3])
                found.setdefault((module, edge), []).append(f"{path.relative_to(ROOT)}:{line}: {name}")
    listed = still_to_go()
    new = sorted(where for pair, wheres in found.items() if pair not in listed for where in wheres)
    assert not new, "a specific scheduler imported outside schedulers/ (go through registry.scheduler and the " \
                    "interface):\n" + "\n".join(new)
    gone = sorted(f"{a} -> {b}" for a, b in listed - set(found))
    assert not gone, f"no longer imported: remove from pyproject.toml's ignore_imports: {gone}"


# --- a scheduler that runs its jobs here is asked, never imported ---------------------------------------------

def test_a_name_job_command_is_handed_to_the_edge_of_that_name(tmp_path: Path) -> None:
    """`slurmlaunch NAME-job ARGS` (cli.py) reaches scheduler NAME's job_main through the registry: the local
    scheduler's detached supervisor reads its job from stdin (here none: it says so, exit 2); a queued edge has
    no such command; a name no scheduler has is argparse's usage error."""
    import subprocess
    import sys

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "slurmlaunch", *argv], input="", capture_output=True,
                              text=True, timeout=120, cwd=tmp_path)

    local = run("local-job", "RECORD")
    assert local.returncode == 2 and "local job RECORD: its submitter sent no job" in local.stderr, local.stderr
    queued = run("slurm-job")
    assert queued.returncode == 2 and "slurm-job: Slurm runs no command of its own" in queued.stderr, queued.stderr
    unknown = run("lsf-job")
    assert unknown.returncode == 2 and "invalid choice: 'lsf-job'" in unknown.stderr, unknown.stderr


@pytest.mark.parametrize(("name", "sees"), [("slurm", True), ("pbs", False), ("local", True)])
def test_slurm_step_variables_follow_the_readers(name: str, sees: bool) -> None:
    """What `submit`'s client notes ask (idr-torch finds its world only in a Slurm step's variables): the
    ranks of Slurm and of the local scheduler's emulated step see them, PBS's do not."""
    assert interface.slurm_step_variables(scheduler(name)) is sees


def test_a_queued_edge_refuses_running_here() -> None:
    """A queued edge's part of the no-queue interface: it refuses nothing and notes nothing here, and runs no
    job in this process (submit never asks it to: its jobs go to the queue)."""
    from slurmlaunch.core.errors import SchedulerError

    edge = scheduler("slurm")
    spec = JobSpec.of(script="train.py")
    assert edge.refuse_here(spec, "templates") is None and edge.start_notes(spec) == []
    with pytest.raises(SchedulerError, match="Slurm runs no job in this process"):
        edge.run_here(spec)
