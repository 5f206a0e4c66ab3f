"""The architecture (README: Architecture): the import contracts hold, the error family names each kind of
failure, the option table reads the parser without changing it, the job's file names are spelled once."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import slurmlaunch
from slurmlaunch.app import profiles
from slurmlaunch.app.devcluster import slurm as devcluster
from slurmlaunch.app.jobs import commands as jobs
from slurmlaunch.app.options import add_submit_options
from slurmlaunch.core import errors
from slurmlaunch.core.jobfiles import JobFiles
from slurmlaunch.core.spec import JobSpec
from slurmlaunch.schedulers import rank_log
from tests.helpers import ROOT, run_cli


def test_import_contracts_hold() -> None:
    # The same command tests/run.sh runs; here too so that a plain `pytest` catches an upward import.
    lint = shutil.which("lint-imports", path=os.path.dirname(sys.executable)) or shutil.which("lint-imports")
    assert lint, "lint-imports (import-linter, in the test extras) is not installed"
    r = subprocess.run([lint, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "0 broken" in r.stdout and "6 kept" in r.stdout, r.stdout[-2000:]


def test_new_errors_are_in_the_family_and_exported() -> None:
    for name in ("JobStateError", "DevClusterError"):
        cls = getattr(errors, name)
        assert issubclass(cls, errors.SlurmLaunchError) and not issubclass(cls, errors.SpecError)
        assert getattr(slurmlaunch, name) is cls and name in slurmlaunch.__all__


def test_unknown_job_is_a_state_error_not_a_request_error(site: Path) -> None:
    with pytest.raises(errors.JobStateError, match="was not submitted from here"):
        jobs.find("424242")


def test_unknown_job_at_the_cli_is_one_line_and_exit_2(tmp_path: Path) -> None:
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}
    r = run_cli("status", "424242", env=env, cwd=tmp_path)
    assert r.returncode == 2 and r.stdout == "", (r.returncode, r.stdout, r.stderr)
    assert r.stderr.count("\n") == 1 and "was not submitted from here" in r.stderr, r.stderr


def test_dev_cluster_failures_are_dev_cluster_errors(tmp_path: Path) -> None:
    with pytest.raises(errors.DevClusterError, match="none in"):
        devcluster.cmd("status", tmp_path / "nothing-here", 1, 0, 1, False)
    assert not hasattr(devcluster, "main")  # one entry point: `slurmlaunch dev-cluster`


def test_option_table_leaves_the_parser_alone_and_defer_defaults_says_it_changes_it() -> None:
    parser = argparse.ArgumentParser(add_help=False)
    add_submit_options(parser)
    before = {a.dest: a.default for a in parser._actions}
    table = profiles.option_table(parser)
    assert {a.dest: a.default for a in parser._actions} == before
    assert table["gpus_per_node"].builtin == 0 and table["output_dir"].builtin == "slurmlaunch-logs"
    assert profiles.defer_defaults(parser) == table
    assert all(a.default is None for a in parser._actions if a.dest in table)
    assert parser.parse_args(["train.py"]).gpus_per_node is None  # None: not on the command line


@pytest.mark.parametrize("mode", ["srun", "torchrun"])
def test_job_files_spell_the_names_the_schedulers_use(mode: str, tmp_path: Path) -> None:
    spec = JobSpec.of(script="train.py", nodes=2, gpus_per_node=4, mode=mode, workdir=str(tmp_path))
    files = JobFiles(spec.log_dir, "77", spec.log_unit, spec.ranks_per_log)
    for rank in range(spec.world_size):
        index = rank if mode == "srun" else rank // 4
        assert files.rank_log(rank) == rank_log(spec, "77", index)
    unit = "rank" if mode == "srun" else "node"
    assert files.rank_log(5) == os.path.join(spec.log_dir, f"job-77.{unit}-{5 if mode == 'srun' else 1}.log")
    assert files.exit_code == os.path.join(spec.log_dir, "job-77.exitcode")
