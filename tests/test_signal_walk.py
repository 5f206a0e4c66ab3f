"""--signal, room by room (issue 30: "a walk of --signal from the CLI to the rank passes each room once";
docs/explanation/architecture.md has the walk). Two checks: every spelling reaches every room as the same
signal (a table through the real functions of each room), and no room but core/parse.py reads a signal's
name itself (an AST walk of the package), so a second parser cannot come back unseen."""

from __future__ import annotations

import ast
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest

from slurmlaunch.allocation import batch_step, step_args, step_rules, torchrun_mode, warning
from slurmlaunch.app.api import rank as api_rank
from slurmlaunch.app.api.executors import rank_spec
from slurmlaunch.core.errors import SpecError
from slurmlaunch.core.parse import WARNING_SIGNALS, parse_signal, signal_number
from slurmlaunch.core.signals import STOP_SIGNALS
from slurmlaunch.core.spec import JobSpec, validate
from slurmlaunch.render import launch, pbs_script, slurm_script
from slurmlaunch.schedulers import local

PACKAGE = Path(__file__).parents[1] / "slurmlaunch"

SPELLINGS = [  # what a user may write -> (name, seconds before the limit); None: no warning; SpecError: refused
    ("USR1", ("USR1", 90)), ("SIGUSR1", ("USR1", 90)), ("usr1", ("USR1", 90)), ("sigusr1@60", ("USR1", 60)),
    ("B:USR2@90", ("USR2", 90)), ("b:SIGUSR2@120", ("USR2", 120)), ("USR2@0", ("USR2", 0)), ("TERM@30", ("TERM", 30)),
    ("none", None), ("", None),
    ("10", SpecError), ("12@90", SpecError), ("R:USR1@60", SpecError), ("KILL", SpecError), ("USR2@65536", SpecError),
    ("USR2@-1", SpecError), ("SIGSIGUSR2", SpecError), ("B:", SpecError),
]


@pytest.mark.parametrize("text, expect", SPELLINGS, ids=[repr(s) for s, _ in SPELLINGS])
def test_every_room_gets_the_same_signal(text: str, expect: object, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    if expect is SpecError:
        with pytest.raises(SpecError, match="is not valid"):
            parse_signal(text)
        with pytest.raises(SpecError, match="is not valid"):
            validate(JobSpec.of(script="t.py", signal=text))  # the CLI's and the API's path: the same refusal
        return
    assert parse_signal(text) == expect
    spec = JobSpec.of(script="t.py", signal=text, time="2:00:00", nodes=2, workdir=str(tmp_path))
    assert spec.warning == expect
    directives = slurm_script.directives(spec)
    plan, pbs_plan = slurm_script.batch_step_plan(spec), pbs_script.batch_step_plan(spec)
    torchrun = launch.launch_command(JobSpec.of(script="t.py", signal=text, time="2:00:00", mode="torchrun",
                                                nproc_per_node=2))
    if expect is None:
        assert not [d for d in directives if d.startswith("--signal")] and "--warning" not in plan + pbs_plan
        assert not [a for a in torchrun if a.startswith("--forward-signal")] and local._warning(spec) is None
        return
    name, seconds = expect
    number = int(signal.Signals["SIG" + name])
    # render: the directive (to the batch shell) and the batch step's plan, Slurm and PBS
    assert f"--signal=B:{name}@{seconds}" in directives
    assert plan[plan.index("--warning") + 1] == name
    assert pbs_plan[pbs_plan.index("--warning") + 1:pbs_plan.index("--warning") + 6:2] == [name, "7200",
                                                                                            str(seconds)]
    # the batch step: the signal it catches and passes on, and the exit code that asks for a requeue
    step = batch_step.Step(step_args.parser().parse_args([*plan, "--", "true"]))
    assert step.warning == number and step_rules.warning_code(name) == 128 + number
    # the ranks: only those with a handler get it, but a stop signal, which goes to every rank
    assert warning.to_all(name) == (name in STOP_SIGNALS)
    # the local scheduler: the signal it sends every rank, and when
    assert local._warning(spec) == (number, float(seconds))
    # torchrun mode: the flag render writes, and the signal torchrun then passes to its workers
    forward = [a.partition("=")[2] for a in torchrun if a.startswith("--forward-signal=")]
    assert forward == [name]
    extra = torchrun_mode._extra_env({"PET_SIGNALS_TO_HANDLE": "SIGHUP"}, {"forward-signal": forward[0],
                                     "nproc-per-node": "1"}, SimpleNamespace(omp_num_threads=None))  # type: ignore[arg-type]
    assert extra.get("PET_SIGNALS_TO_HANDLE", "SIGHUP") == ",".join(dict.fromkeys(["SIGHUP", f"SIG{name}"]))
    # the API (Slurm, PBS): the CLI's script and plan (above), its rank module tells submitit's handler the name
    for scheduler in ("slurm", "pbs"):
        args = rank_spec(spec, scheduler, str(tmp_path / "%j")).program.args
        environ: dict[str, str] = {}
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(api_rank.os, "environ", environ)
            api_rank._environment(*args[:2])  # ENVIRONMENT SIGNAL (FOLDER)
        assert environ["SUBMITIT_PREEMPT_SIGNAL"] == name, (scheduler, args)


def test_signal_number_is_the_systems_number_for_every_warning_signal() -> None:
    for name in WARNING_SIGNALS:
        assert signal_number(name) == int(signal.Signals["SIG" + name])
    with pytest.raises(SpecError, match="warning signal 'KILL' is not valid"):
        signal_number("KILL")


def test_a_number_is_refused_with_the_reason() -> None:
    with pytest.raises(SpecError, match="a name, not a number"):
        parse_signal("10@90")


# --- no second parser --------------------------------------------------------------------------------------
# What reads a signal's name: Signals[...], Signals.__getitem__, getattr(signal, <not a constant>), and the
# normalising of a spelling (.removeprefix("SIG")). Allowed where the names are the code's own, not --signal's.
ALLOWED = {
    ("core/parse.py", "*"): "the one parser",
    ("allocation/step_rules.py", "Signals.__getitem__"): "KILLING, its own table of srun's words",
    ("allocation/rank_runner.py", "getattr(_signal)"): "its own stack-dump signals, by name",
}


def _readers(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and (
                isinstance(node.value, ast.Attribute) and node.value.attr == "Signals"
                or isinstance(node.value, ast.Name) and node.value.id == "Signals"):
            found.append((node.lineno, "Signals[]"))
        elif isinstance(node, ast.Attribute) and node.attr == "__getitem__" and (
                isinstance(node.value, ast.Name | ast.Attribute)
                and getattr(node.value, "id", getattr(node.value, "attr", "")) == "Signals"):
            found.append((node.lineno, "Signals.__getitem__"))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr" \
                and isinstance(node.args[0], ast.Name) and node.args[0].id in ("signal", "_signal") \
                and not isinstance(node.args[1], ast.Constant):
            found.append((node.lineno, f"getattr({node.args[0].id})"))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("removeprefix", "lstrip", "strip") and node.args \
                and isinstance(node.args[0], ast.Constant) and node.args[0].value == "SIG":
            found.append((node.lineno, f".{node.func.attr}('SIG')"))
    return found


def test_only_core_parse_reads_a_signal_name() -> None:
    stray = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if (rel, "*") in ALLOWED:
            continue
        stray += [f"{rel}:{line}: {what}" for line, what in _readers(ast.parse(path.read_text()))
                  if (rel, what) not in ALLOWED]
    assert stray == [], "a second reader of signal names (use core/parse.parse_signal/signal_number):\n" + \
        "\n".join(stray)


def test_the_ast_walk_sees_each_kind_of_reader() -> None:
    code = ('Signals["SIG" + n]\nsignal.Signals[x]\nmap(Signals.__getitem__, y)\ngetattr(signal, "SIG" + n)\n'
            'n.upper().removeprefix("SIG")\n')
    assert sorted(what for _, what in _readers(ast.parse(code))) == sorted([
        "Signals[]", "Signals[]", "Signals.__getitem__", "getattr(signal)", ".removeprefix('SIG')"])


RANK = """
import os, signal, sys, time
def got(number, _frame):
    with open(sys.argv[1], "w") as f:
        f.write(f"{signal.Signals(number).name} {os.environ.get('SUBMITIT_PREEMPT_SIGNAL')}")
    sys.exit(0)
for s in (signal.SIGUSR1, signal.SIGUSR2):
    signal.signal(s, got)
time.sleep(10)  # warned 4 s in, or never
"""


@pytest.mark.parametrize("warning", ["USR1@56", "none"])
def test_the_apis_local_jobs_get_the_named_warning(warning: str, tmp_path: Path) -> None:
    """The API's local jobs (the local scheduler's supervisor, as the CLI's): NAME (not submitit's default USR2)
    SECONDS before the limit, and the ranks' submitit handler is told the same name; with signal="none" no
    warning at all (before this walk: USR2, 90 s, always)."""
    import slurmlaunch

    (tmp_path / "rank.py").write_text(RANK)
    out = tmp_path / "got"
    job = slurmlaunch.submit_script(str(tmp_path / "rank.py"), [str(out)], scheduler="local", time="1",
                                    signal=warning, output_dir=str(tmp_path / "logs"))
    assert job.results() == [0]
    if warning == "none":
        assert not out.exists()  # it slept its 10 s, never warned
    else:
        assert out.read_text() == "SIGUSR1 USR1"
