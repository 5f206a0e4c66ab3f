"""The job's file names (core/jobfiles.py) are the ones the batch templates write, and the readers that
now take them from JobFiles (follow, the job commands) find the files the writers leave."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from slurmlaunch.app.follow import failure_lines
from slurmlaunch.core.jobfiles import JobFiles

GOLDEN = Path(__file__).parents[1] / "golden"


@pytest.mark.parametrize("golden", ["slurm_basic.sbatch", "slurm_array.sbatch", "slurm_torchrun.sbatch"])
@pytest.mark.parametrize("name", ["exit_code", "failure", "reasons", "returned"])
def test_names_are_not_the_templates(golden: str, name: str) -> None:
    """The scripts spell no name of the job's files: the batch step takes them from JobFiles."""
    text = (GOLDEN / golden).read_text()
    assert f"/{Path(getattr(JobFiles('', '$job_tag'), name)).name}" not in text.replace('"', "")


def test_spellings() -> None:
    files = JobFiles("/logs", "7", "node", 4)
    assert files.rank_log(9) == "/logs/job-7.node-2.log"
    assert files.batch_log == "/logs/job-7.batch.log"
    element = files.element(3)
    assert (element.exit_code, element.failure) == ("/logs/job-7_3.exitcode", "/logs/job-7_3.failure")
    assert element.rank_log(4) == "/logs/job-7_3.node-1.log"


def test_failure_lines_of_an_array_in_index_order(tmp_path: Path) -> None:
    for tag in ("7", "7_10", "7_2", "8_1", "7_x"):
        (tmp_path / f"job-{tag}.failure").write_text(f"failed {tag}\n")
    (tmp_path / "job-7_5.exitcode").write_text("0\n")
    assert failure_lines(str(tmp_path), "7") == ["failed 7", "failed 7_x", "failed 7_2", "failed 7_10"]


ROOT = Path(__file__).resolve().parents[2]
# A job file's name spelled by hand: "job-" followed by a variable (f"job-{id}...", "$log_dir/job-$job_tag..."),
# or one of the names' endings closing a string literal (".exitcode"', '.batch.log"').
HAND_SPELLED = re.compile(r"""job-[{$]|["']job-["']|\.(exitcode|batch\.log|srun\.log|failure|reasons|returned|"""
                          r"""exit|sbatch|qsub)["']""")
# Spelled elsewhere on purpose: the RUNNER's exit-mark suffix in core/__init__.py (the launcher's path reads it
# without building JobFiles).
# rank_runner.py runs in the rank where nothing of slurmlaunch is importable: it spells them, and
# tests/allocation/test_teardown.py checks they agree
ALLOWED = {"slurmlaunch/core/jobfiles.py", "slurmlaunch/core/__init__.py", "slurmlaunch/allocation/rank_runner.py"}


def test_no_job_file_name_is_spelled_outside_jobfiles() -> None:
    """A new hand-spelled job file name (in the package or a template) fails here: take it from JobFiles."""
    files = [*ROOT.glob("slurmlaunch/**/*.py"), *ROOT.glob("templates/*.j2")]
    assert len(files) > 40
    found = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}" for p in files if str(p.relative_to(ROOT)) not in ALLOWED
             for n, line in enumerate(p.read_text().splitlines(), 1) if HAND_SPELLED.search(line)]
    assert found == []


@pytest.mark.parametrize("line", ['open(os.path.join(d, f"job-{i}.exitcode"))', 'x = "$log_dir/job-$job_tag.srun.log"',
                                  "--output={d}/job-%j.batch.log'", 'name + ".exit"'])
def test_the_grep_catches_a_hand_spelled_name(line: str) -> None:
    assert HAND_SPELLED.search(line)
