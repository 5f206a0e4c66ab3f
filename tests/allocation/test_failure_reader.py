"""The one failure reader: step_rules.read_failure reads back the first-failure line the batch step writes to the
job's failure file (Step.finish), which the Python API turns into RankFailed (app/api/collect.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurmlaunch.allocation import batch_step, step_rules


@pytest.mark.parametrize(("line", "expect"), [
    ("rank(s) 2-3,5 on node2 failed first with exit code 7; the other ranks were stopped",
     ([2, 3, 5], "node2", 7, "")),
    ("rank(s) 1 on node1 failed first with exit code 139 (killed by SIGSEGV); the other ranks were stopped",
     ([1], "node1", 139, "killed by SIGSEGV")),
    ("rank 0 on host-a failed first with exit code 137 (killed by SIGKILL: out of memory)",
     ([0], "host-a", 137, "killed by SIGKILL: out of memory")),
    (step_rules.stopped_line("rank 3 on node2", 3, "no rendezvous (MASTER_ADDR=x) within 900s", ""),
     ([3], "node2", 3, "stopped by slurmlaunch: no rendezvous (MASTER_ADDR=x) within 900s")),
    ("torchrun on node1 (node task 0) failed first with exit code 1", None),
    ("node1 refused to start the ranks as root (Open MPI's run-as-root protection; no rank ran)", None),
])
def test_the_batch_steps_line_is_read_back(line: str, expect: object, tmp_path: Path) -> None:
    path = tmp_path / "job-1.failure"
    assert batch_step.put_file(str(path), "slurmlaunch: " + line)
    assert step_rules.read_failure(str(path)) == expect


def test_no_failure_file_is_none(tmp_path: Path) -> None:
    assert step_rules.read_failure(str(tmp_path / "job-1.failure")) is None


def test_the_api_reads_the_same_file(tmp_path: Path) -> None:
    """collect._step_ends: the batch step's ranks and code, a signal as subprocess has it (-N)."""
    from slurmlaunch.app.api.collect import _step_ends

    assert batch_step.put_file(str(tmp_path / "job-12_3.failure"), "slurmlaunch: rank(s) 1 on node1 failed first "
                               "with exit code 139 (killed by SIGSEGV); the other ranks were stopped")
    assert _step_ends(str(tmp_path), "12_3") == {1: (0, -11, "killed by SIGSEGV on node1", "node1")}
    # a lost host's ranks, as the batch step words them under PBS (RankFailed names the host)
    assert batch_step.put_file(str(tmp_path / "job-13.failure"), "slurmlaunch: ranks 2-3 on node2 failed first with "
                               "exit code 205 (their host was lost: mpiexec lost contact with its daemon on node2)")
    ends = _step_ends(str(tmp_path), "13")
    assert sorted(ends) == [2, 3] and ends[2][1] == 205 and ends[2][3] == "node2"
    assert _step_ends(None, "12_3") == {} and _step_ends(str(tmp_path), "12") == {}
