"""The launcher runs this package's own programs (``-m slurmlaunch.…``: the Python API's rank) in its own
interpreter instead of exec'ing a second one (issue 39: a second interpreter a rank made the API's short jobs
slower than plain submitit's); the program then runs as the exec'd interpreter would have run it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from slurmlaunch.allocation.launch import in_process, parse_launch_args
from slurmlaunch.allocation.script_runner import RUNNER
from tests.helpers import clean_env


@pytest.mark.parametrize(("argv", "here"), [
    (["-m", "slurmlaunch.app.api.rank", "slurm", "-", "/f/%j"], True),
    (["-m", "mymod"], False),  # the user's module: exec'd, as every script is
    (["-m", "slurmlaunchx.mod"], False),
    (["train.py"], False),
    (["--no-python", "slurmlaunch.x"], False),
])
def test_only_this_packages_modules_run_in_the_launchers_interpreter(argv: list[str], here: bool) -> None:
    opts = parse_launch_args(argv)
    assert opts is not None
    assert in_process(opts) is here


# What a program run by run_here sees: the launcher's modules are loaded (one interpreter), its argv, __main__.
PROBE = """
import sys
print(sys.argv, __name__, "slurmlaunch.allocation.launch" in sys.modules, sys.stdout.write_through, flush=False)
"""


def _run_here(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    code = f"import sys\nfrom slurmlaunch.allocation.launch import run_here\nrun_here({cmd!r})\n"
    return subprocess.run([sys.executable, "-c", code], env=clean_env(), cwd=cwd, capture_output=True, text=True,
                          timeout=60)


def test_a_program_runs_in_this_interpreter_as_python_would_run_it(tmp_path: Path) -> None:
    (tmp_path / "probe.py").write_text(PROBE)
    r = _run_here([sys.executable, "-u", "-m", "probe", "a", "-u", "b c"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"[{str(tmp_path / 'probe.py')!r}, 'a', '-u', 'b c'] __main__ True True"
    r = _run_here([sys.executable, "-u", "-c", PROBE, "-m", "x"], tmp_path)
    assert r.stdout.strip() == "['-c', '-m', 'x'] __main__ True True", r.stderr


def test_through_the_runner_its_exit_code_and_its_traceback(tmp_path: Path) -> None:
    (tmp_path / "leaves.py").write_text("import sys\nsys.exit(int(sys.argv[1]))\n")
    (tmp_path / "raises.py").write_text("def f():\n    raise ValueError('bad value')\nf()\n")
    r = _run_here([sys.executable, "-u", "-c", RUNNER, "-m", "leaves", "7"], tmp_path)
    assert r.returncode == 7, r.stderr
    r = _run_here([sys.executable, "-u", "-m", "raises"], tmp_path)
    assert r.returncode == 1
    assert "Traceback" in r.stderr and "ValueError: bad value" in r.stderr and "run_here" not in r.stderr, r.stderr
