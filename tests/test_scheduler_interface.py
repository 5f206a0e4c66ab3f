"""The scheduler seam: one command runner under every edge, one interface over the edges, one definition of
"finished" and of the scheduler choice. Real processes for the runner; Slurm's own man page for the states."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from slurmlaunch.core.errors import SchedulerError
from slurmlaunch.schedulers import pbs, slurm
from slurmlaunch.schedulers.runner import LocalRunner, current_runner, run_command, use_runner
from tests.test_submit import golden_spec


def test_local_runner_runs_an_argv_without_a_shell() -> None:
    out = LocalRunner().run(["printf", "%s", "a; echo b $HOME"], timeout=30).stdout
    assert out == "a; echo b $HOME"  # a shell would have run `echo b` and expanded $HOME


def test_local_runner_failure_names_the_command_and_its_stderr() -> None:
    code = "import sys; sys.stderr.write('sbatch: error: Invalid account\\n'); sys.exit(3)"
    with pytest.raises(SchedulerError) as e:
        LocalRunner().run([sys.executable, "-c", code], timeout=30)
    assert "failed (exit 3): sbatch: error: Invalid account" in str(e.value)
    assert sys.executable in str(e.value)


def test_local_runner_bounds_the_wait() -> None:
    with pytest.raises(SchedulerError, match="no answer within 1s from: sleep 60"):
        LocalRunner().run(["sleep", "60"], timeout=1)


def test_local_runner_missing_client() -> None:
    with pytest.raises(SchedulerError, match="'no-such-qsub' not found on PATH"):
        LocalRunner().run(["no-such-qsub"], timeout=30)


class Recording:
    """A runner that answers from a table and keeps every argv it was given (no process is started)."""

    def __init__(self, answers: dict[str, str]) -> None:
        self.answers = answers
        self.argvs: list[list[str]] = []

    def run(self, argv: Sequence[str], *, timeout: float, input_text: str | None = None,
            env: dict[str, str] | None = None, umask: int = -1) -> subprocess.CompletedProcess[str]:
        assert 0 < timeout <= 600, "every scheduler command has a bounded wait"
        self.argvs.append(list(argv))
        return subprocess.CompletedProcess(list(argv), 0, self.answers.get(argv[0], ""), "")


@pytest.fixture
def no_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any scheduler command that went around the runner fails the test."""
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"a process was started around the runner: {args[0] if args else kwargs}")

    monkeypatch.setattr(subprocess, "run", refuse)
    monkeypatch.setattr(subprocess, "Popen", refuse)


def test_every_edge_command_goes_through_the_runner(tmp_path: Path, no_processes: None) -> None:
    runner = Recording({"sbatch": "4242\n", "squeue": "RUNNING 0:05 node1\n", "qsub": "77.pbs-server\n",
                        "scontrol": "Slurmctld(primary) at c is UP\n",
                        "qstat": "Job Id: 77.pbs-server\n    job_state = R\n"})
    spec = golden_spec(output_dir=str(tmp_path / "logs"))
    with use_runner(runner):
        assert current_runner() is runner
        assert slurm.controller_answers()[0]
        sub = slurm.submit(spec, "#!/bin/bash\n")
        assert sub.job_id == "4242"
        assert slurm.status("4242", spec.log_dir).state == "RUNNING"
        slurm.cancel("4242")
        assert pbs.submit(spec, "#!/bin/bash\n").job_id == "77.pbs-server"
        assert pbs.status("77", spec.log_dir).state == "RUNNING"
        pbs.cancel("77_3")
    assert not isinstance(current_runner(), Recording)  # the previous runner is back
    assert [a[0] for a in runner.argvs] == ["scontrol", "sbatch", "squeue", "scancel", "qsub", "qstat", "qdel"]
    assert runner.argvs[-1] == ["qdel", "77[3]"]


def test_run_command_uses_the_current_runner(no_processes: None) -> None:
    runner = Recording({"squeue": "x"})
    with use_runner(runner):
        assert run_command(["squeue", "-h"], timeout=5).stdout == "x"
    assert runner.argvs == [["squeue", "-h"]]
