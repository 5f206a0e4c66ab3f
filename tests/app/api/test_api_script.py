"""The script an API job submits on a queued scheduler is the CLI's: ``edge.render`` of the same JobSpec, the
same template, batch step and directives as `slurmlaunch submit --dry-run` prints for the same request; only
the rank command differs (the launcher running the API's rank module, app/api/rank.py, which runs submitit's
processing of the pickled call, instead of the user's script). No cluster: the scripts are compared as text."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from slurmlaunch.app.api.executors import SpecExecutor, _executor
from slurmlaunch.app.api.job_options import _spec
from slurmlaunch.app.resolve import resolve

# one request, as API keyword arguments and as the CLI's flags
OPTIONS = {"nodes": 2, "tasks_per_node": 2, "time": "0:10:00", "signal": "USR1@60", "env": {"A": "b c; $(x)"},
           "setup": ("module load foo",), "output_dir": "logs"}
FLAGS = ["--nodes", "2", "--tasks-per-node", "2", "--time", "0:10:00", "--signal", "USR1@60", "--env", "A=b c; $(x)",
         "--setup", "module load foo", "--output-dir", "logs",
         # the API's default: no rendezvous watchdog beside its ranks (a function need not rendezvous)
         "--rdzv-timeout", "0"]


def _api_script(scheduler: str, array: int = 0) -> tuple[str, str]:
    spec = resolve(_spec(sys.executable, dict(OPTIONS, job_name="train"), module=True), has_script=False)
    ex = _executor(spec, scheduler)
    assert isinstance(ex, SpecExecutor)
    ex._array_count = array
    return ex._make_submission_file_text("", ""), str(ex.folder)


def _cli_script(scheduler: str, cwd: Path, extra: tuple[str, ...] = ()) -> str:
    (cwd / "train.py").write_text("print(1)\n")
    r = subprocess.run([sys.executable, "-m", "slurmlaunch", "submit", "--dry-run", "--scheduler", scheduler,
                        *FLAGS, *extra, "train.py"], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    # the command line ("# would run: sbatch ..."), where it is printed before the script, is not the script's
    return "".join(line for line in r.stdout.splitlines(keepends=True) if not line.startswith("# would run: "))


@pytest.mark.parametrize(("scheduler", "array"), [("slurm", 0), ("slurm", 3), ("pbs", 0), ("pbs", 3)])
def test_an_api_jobs_script_is_the_clis_but_for_the_rank_command(scheduler: str, array: int, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    api, folder = _api_script(scheduler, array)
    cli = _cli_script(scheduler, tmp_path, ("--array", "0-2") if array else ())
    launch = f"{sys.executable} -m slurmlaunch launch "
    cli_command = launch + str(tmp_path / "train.py")
    api_command = launch + f"-m slurmlaunch.app.api.rank {scheduler} USR1 {folder}"
    assert cli.count(cli_command) == 1 and api.count(api_command) == 1, (api, cli)
    assert api.replace(api_command, cli_command) == cli  # every other line the same: one producer of batch scripts
    assert api.count("--signal=B:USR1@60") == (1 if scheduler == "slurm" else 0), api  # written once


def test_no_other_producer_of_batch_scripts_is_left() -> None:
    import slurmlaunch.app.api.executors as executors
    import slurmlaunch.app.api.pbs as pbs

    assert not hasattr(executors, "_batch_lines") and not hasattr(executors, "_srun_lines")
    assert not hasattr(pbs, "batch_script")


def test_the_rendezvous_watchdog_is_off_unless_asked_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    api, _ = _api_script("slurm")
    assert "export SLURMLAUNCH_RDZV_TIMEOUT=0\n" in api, api
    spec = resolve(_spec(sys.executable, dict(OPTIONS, job_name="train", rdzv_timeout=60), module=True),
                   has_script=False)
    ex = _executor(spec, "slurm")
    assert isinstance(ex, SpecExecutor)
    assert "export SLURMLAUNCH_RDZV_TIMEOUT=60\n" in ex._make_submission_file_text("", "")


def test_one_failure_reader_the_api_reads_the_batch_steps_failure_file() -> None:
    """srun's and Open MPI's words on a failed rank are read in one place, the batch step (its failure file, which
    app/api/collect.py reads with allocation/step_rules.read_failure); no module of the API knows those words."""
    from slurmlaunch.allocation import step_rules

    api = Path(step_rules.__file__).resolve().parents[1] / "app" / "api"
    words = (step_rules._SRUN_ERROR, "noticed that process rank", "exited on signal", "Aborted")
    assert all(w in Path(step_rules.__file__).read_text() for w in words)  # the reader is still where it was
    found = [f"{p.name}: {w!r}" for p in sorted(api.glob("*.py")) for w in words if w in p.read_text()]
    assert not found, found
    assert "read_failure" in (api / "collect.py").read_text()
