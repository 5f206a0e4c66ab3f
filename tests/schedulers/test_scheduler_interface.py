"""The scheduler seam: one command runner under every edge, one interface over the edges, one definition of
"finished" and of the scheduler choice. Real processes for the runner; Slurm's own man page for the states."""

from __future__ import annotations

import gzip
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from slurmlaunch.app import submit
from slurmlaunch.app.jobs import commands as jobs
from slurmlaunch.app.records import JobRecord
from slurmlaunch.core.errors import JobStateError, SchedulerError, SpecError
from slurmlaunch.schedulers import ACTIVE_STATES, JobStatus, is_final, pbs, slurm
from slurmlaunch.schedulers.choice import NAMES, choose, scheduler
from slurmlaunch.schedulers.runner import LocalRunner, current_runner, run_command, use_runner
from tests.render.test_submit import golden_spec


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

    def which(self, name: str) -> bool:
        return False


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
                        "qstat": '{"Jobs": {"77.pbs-server": {"job_state": "R", "substate": 42}}}\n'})
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
    # sinfo: how the running job's nodes are (a lost node is named while following)
    # submit holds the job, asks what the scheduler says of it and which cluster took it, and releases it
    assert [a[0] for a in runner.argvs] == ["scontrol", "sbatch", "squeue", "scontrol", "scontrol", "squeue", "sinfo",
                                            "scancel", "qsub", "qstat", "qstat", "qstat", "qrls", "qstat", "qdel"]
    assert runner.argvs[1][-2] == slurm.HOLD == f"--begin=now+{slurm.HOLD_S}"
    assert runner.argvs[4] == ["scontrol", "update", "JobId=4242", "StartTime=now"]
    assert runner.argvs[-1] == ["qdel", "77[3]"]


class RefusedStart(Recording):
    """Slurm refuses `scontrol update StartTime=now`, as it does for a job its partition cannot run now."""

    def run(self, argv: Sequence[str], *, timeout: float, input_text: str | None = None,
            env: dict[str, str] | None = None, umask: int = -1) -> subprocess.CompletedProcess[str]:
        if list(argv[-1:]) == ["StartTime=now"]:
            self.argvs.append(list(argv))
            raise SchedulerError("scontrol update failed (exit 1): Requested partition configuration not "
                                 "available now for job 4242")
        return super().run(argv, timeout=timeout, input_text=input_text, env=env, umask=umask)


def test_a_refused_release_is_said_and_bounded(tmp_path: Path, no_processes: None) -> None:
    """The held job's begin time stays where Slurm refuses to move it: submit says so in its note, with when it
    begins at the latest (minutes, not an hour) and the command that lets it go, and keeps the job (recorded)."""
    runner = RefusedStart({"sbatch": "4242\n", "squeue": "2026-12-07T00:00:01|x|train\n", "scontrol": ""})
    spec = golden_spec(output_dir=str(tmp_path / "logs"))
    with use_runner(runner):
        sub = slurm.submit(spec, "#!/bin/bash\n")
    assert slurm.HOLD_S <= 300
    assert sub.job_id == "4242" and Path(sub.record_path).is_file()
    assert sub.note is not None and "Requested partition configuration not available now" in sub.note, sub.note
    assert f"within {slurm.HOLD_S // 60} minutes of its submission" in sub.note, sub.note
    assert "scontrol update JobId=4242 StartTime=now" in sub.note, sub.note
    assert not any(a[0] == "scancel" for a in runner.argvs)


def test_run_command_uses_the_current_runner(no_processes: None) -> None:
    runner = Recording({"squeue": "x"})
    with use_runner(runner):
        assert run_command(["squeue", "-h"], timeout=5).stdout == "x"
    assert runner.argvs == [["squeue", "-h"]]


def _slurm_job_states() -> dict[str, str]:
    """squeue(1)'s JOB STATE CODES: each state's name and Slurm's own description of it."""
    found = [Path(d) / "man1" / "squeue.1.gz" for d in ("/usr/share/man", "/usr/local/share/man")]
    page = next((p for p in found if p.is_file()), None)
    if page is None:
        pytest.skip("squeue(1) is not installed (apt-get install slurm-client)")
    text = gzip.decompress(page.read_bytes()).decode()
    section = text.split('.SH "JOB STATE CODES"', 1)[1].split("\n.SH", 1)[0]
    return dict(re.findall(r"^\.TP\n\\fB[A-Z]+ +([A-Z_]+)\\fR\n(.*)$", section, re.M))


def test_finished_states_agree_with_slurms_man_page() -> None:
    states = _slurm_job_states()
    assert len(states) >= 20 and {"PENDING", "RUNNING", "COMPLETED", "TIMEOUT"} <= set(states)
    # Slurm's words for a job that is over: it terminated, was cancelled, ran out of memory, or (federation)
    # its sibling was removed; every other documented state can still run or be requeued.
    over = re.compile(r"^(Job (has )?terminated|Job was explicitly cancelled|Job experienced out of memory"
                      r"|Sibling was removed)")
    wrong = {name: why for name, why in states.items() if is_final(name) != bool(over.match(why))}
    assert not wrong, f"final/active disagrees with squeue(1) for {wrong}"
    assert ACTIVE_STATES - set(states) == {"UNKNOWN"}  # scontrol's word before the job is known


@pytest.mark.parametrize("state", ["RESV_DEL_HOLD", "REQUEUE_HOLD", "REQUEUE_FED", "SPECIAL_EXIT"])
def test_a_held_or_requeued_job_is_not_finished(state: str, tmp_path: Path, no_processes: None) -> None:
    """squeue still lists it: --wait and logs --follow must go on waiting (they stopped here before)."""
    with use_runner(Recording({"squeue": f"{state} 1:00 \n"})):
        st = slurm.status("7", str(tmp_path))
    assert st == JobStatus(state, None, None, elapsed="1:00") and not st.finished


def test_each_edge_behind_the_interface(tmp_path: Path) -> None:
    spec = golden_spec(output_dir=str(tmp_path))
    edges = {name: scheduler(name) for name in NAMES}
    assert {e.name for e in edges.values()} == set(NAMES) and edges["slurm"] is slurm.EDGE
    assert [n for n, e in edges.items() if e.queued] == ["slurm", "pbs"]
    assert edges["slurm"].render(spec) == slurm.render_script(spec)
    assert edges["pbs"].submit_command(spec, "s.qsub")[0] == "qsub"
    assert edges["slurm"].submit_command(spec, "s.sbatch")[-1] == "s.sbatch"
    assert edges["local"].render(spec).startswith("# local job")
    # where the ranks' output is: Slurm one file per rank, PBS one tagged file, an array many rank 0s
    assert edges["slurm"].rank_log(spec, "9", 0) == os.path.join(spec.log_dir, "job-9.rank-0.log")
    assert edges["pbs"].rank_log(spec, "9", 0) is None
    assert edges["slurm"].rank_log(golden_spec(array="0-3", output_dir=str(tmp_path)), "9", 0) is None
    assert edges["slurm"].batch_log(spec, "9") == os.path.join(spec.log_dir, "job-9.batch.log")
    with pytest.raises(JobStateError, match="job 3: its record .* cannot be read"):  # it reads the job's files
        edges["local"].status("3", spec.log_dir)
    with pytest.raises(SchedulerError, match="no queue to submit to"):  # its submit starts the job detached
        edges["local"].submit_command(spec, "job.sh")
    assert jobs._edge(JobRecord.from_data({"scheduler": "local", "job_id": "3", "log_dir": spec.log_dir}, "3")) \
        is edges["local"]
    with pytest.raises(SpecError, match="scheduler 'sge' is not valid"):
        scheduler("sge")


@pytest.fixture
def clients(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty PATH directory to put stand-in clients in (only their presence is looked at here)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))  # auto's choice is said once per user
    return bin_dir


def _client(bin_dir: Path, name: str) -> None:
    (bin_dir / name).write_text("#!/bin/sh\nexit 1\n")
    (bin_dir / name).chmod(0o755)
    assert shutil.which(name) == str(bin_dir / name)


def test_choice_without_clients(clients: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert choose("auto") == "local"
    assert "auto chose local (no sbatch or qsub on PATH)" in capsys.readouterr().err
    with pytest.raises(SpecError, match="--scheduler slurm: sbatch is not on PATH"):
        choose("slurm")
    with pytest.raises(SpecError, match="--scheduler pbs: qsub is not on PATH"):
        choose("pbs")
    assert choose("pbs", preview=True) == "pbs"  # a dry run needs no client
    assert choose("slurm", allowed=("slurm", "local"), check_client=False, announce=False) == "slurm"
    assert capsys.readouterr().err == ""


def test_cli_and_api_choose_alike(clients: Path, no_processes: None, capsys: pytest.CaptureFixture[str]) -> None:
    from slurmlaunch.app import api

    _client(clients, "qsub")
    assert submit.choose_scheduler("auto") == "pbs"
    assert api._choose("auto") == "local"  # the API's auto keeps to Slurm or local: PBS only when named
    assert api._choose("pbs") == "pbs"
    _client(clients, "sbatch")
    silent = Recording({"scontrol": ""})  # a controller that does not say UP: never local (a login node)
    with use_runner(silent):
        for choose_one in (submit.choose_scheduler, api._choose):
            with pytest.raises(SchedulerError, match="a Slurm cluster is configured here but its controller does "
                                                     r"not answer \(no output\); nothing was run"):
                choose_one("auto")
    # what Slurm's client says where it finds no configuration at all (no slurm.conf, no DNS SRV record)
    unconfigured = Recording({"scontrol": "scontrol: error: fetch_config: DNS SRV lookup failed\n"
                                          "scontrol: fatal: Could not establish a configuration source\n"})
    with use_runner(unconfigured):
        assert submit.choose_scheduler("auto") == api._choose("auto") == "local"
    with use_runner(Recording({"scontrol": "Slurmctld(primary) at ctl is UP\n"})):
        assert submit.choose_scheduler("auto") == api._choose("auto") == "slurm"
    assert "auto chose slurm (sbatch is on PATH and slurmctld answers)" in capsys.readouterr().err
    assert silent.argvs == [["scontrol", "ping"]] * 2


def test_only_the_runner_and_the_local_supervisor_start_processes() -> None:
    """Scheduler commands go through runner.py; supervisor.py starts the local scheduler's ranks (no
    scheduler command); render/ is pure. A new edge that imports subprocess fails here."""
    import ast

    import slurmlaunch

    root = Path(slurmlaunch.__file__).parent
    starters = {"subprocess", "os.system", "os.spawnv", "os.execv", "os.execvp", "os.posix_spawn", "pty"}
    found = set()
    for path in [*(root / "schedulers").glob("*.py"), *(root / "render").glob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                [f"os.{node.attr}"] if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and node.value.id == "os" else []
            if starters & set(names):
                found.add(f"{path.parent.name}/{path.name}")
    assert found == {"schedulers/runner.py", "schedulers/supervisor.py"}
