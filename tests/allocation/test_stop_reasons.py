"""Issue 18 item 7: when slurmlaunch stops a rank itself (a refusal before exec, the rendezvous time-out), the
reason reaches the batch log and --wait, and the job ends with the documented code of that stop, not srun's 143.

Layers: the reasons file format through pure functions; the launcher as a real process leaving its reason;
the PBS script's block run by bash around an EMULATED mpiexec (no PBS server here); the local scheduler; and
the real Slurm cluster (tests/conftest.py), where srun, --kill-on-bad-exit and the batch shell are Slurm's own.
"""

from __future__ import annotations

import os
import re
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurmlaunch.allocation import reasons
from slurmlaunch.allocation.smallfile import read_small
from slurmlaunch.render import pbs_script
from tests import ports
from tests.helpers import clean_env, golden_spec, launch, no_slurm_env, run_cli, step_env

# Rank 0 never starts its rendezvous (it sleeps); the others would wait in init_process_group for ever.
NEVER_LISTENS = "import time; time.sleep(300)\n"


@pytest.fixture
def held_port() -> Iterator[int]:
    """A port something already listens on (on every address): rank 0 cannot take it as MASTER_PORT."""
    with socket.socket() as s:
        s.bind(("", 0))
        s.listen(1)
        yield int(s.getsockname()[1])


# --- the reasons file: what the launcher writes and the readers take ---------------------------------------

def test_codes_are_distinct_and_collide_with_no_documented_code() -> None:
    stops = [reasons.MAPPING, reasons.RDZV_TIMEOUT, reasons.PREFLIGHT, reasons.WARNING_KILLED]
    assert len(set(stops)) == 4 and all(1 < c < 128 for c in stops)
    # 2 bad request, 124 --wait-timeout, 130 Ctrl-C, 141 closed pipe, 140 requeue (USR2), 128+N signals, 74 and
    # 181 the output directory's (the batch script's)
    assert not set(stops) & {0, 1, 2, 74, 124, 130, 140, 141, 181}


def test_docs_and_launch_help_document_every_stop_code() -> None:
    from slurmlaunch.allocation.launch import USAGE

    page = (Path(__file__).resolve().parents[2] / "docs" / "reference" / "exit-codes.md").read_text()
    section = page.split("# Exit codes", 1)[1].split("\n## ", 1)[0]
    table = next(block for block in section.split("\n\n") if block.startswith("| code |"))
    rows = {int(m.group(1)): m.group(2) for m in re.finditer(r"^\| (\d+) \| (.*) \|$", table, re.M)}
    assert "variables are malformed" in rows[reasons.MAPPING] and "pre-flight" in rows[reasons.PREFLIGHT]
    assert "MASTER_ADDR:MASTER_PORT" in rows[reasons.RDZV_TIMEOUT] and "launch" in rows[reasons.BAD_LAUNCH]
    for code in (reasons.BAD_LAUNCH, reasons.MAPPING, reasons.RDZV_TIMEOUT, reasons.PREFLIGHT):
        assert re.search(rf"^  {code} ", USAGE, re.M), code


def test_read_small_bounds_and_refusals(tmp_path: Path) -> None:
    """The one reader of small files (reasons, failure lines, records, exit codes): a prefix of a regular
    file; a link, a FIFO, a directory refused without blocking; ``whole`` refuses a file over the bound."""
    (tmp_path / "f").write_bytes(b"x" * 100)
    assert read_small(str(tmp_path / "f"), 10) == b"x" * 10
    assert read_small(str(tmp_path / "f"), 100, whole=True) == b"x" * 100
    with pytest.raises(OSError, match="more than the 99"):
        read_small(str(tmp_path / "f"), 99, whole=True)
    (tmp_path / "link").symlink_to(tmp_path / "f")
    os.mkfifo(tmp_path / "fifo")
    for name in ("link", "fifo", ".", "missing"):
        with pytest.raises(OSError):
            read_small(str(tmp_path / name), 10)


def test_record_then_read_first(tmp_path: Path) -> None:
    env = {reasons.REASONS_DIR: str(tmp_path)}
    assert reasons.record(env, 69, 3, "node2", "nothing\nlistened  at\tX")
    assert not reasons.record(env, 78, 3, "node2", "a second word for rank 3")  # the first one counts
    time.sleep(0.01)
    assert reasons.record(env, 78, None, "node 1", "later, by a task whose rank is unknown")
    mode = stat.S_IMODE((tmp_path / "3").stat().st_mode)
    assert mode == 0o600, oct(mode)
    first = reasons.read_first(str(tmp_path))
    assert first is not None and (first.code, first.rank, first.host, first.text) == (69, 3, "node2",
                                                                                     "nothing listened at X")
    assert first.who() == "rank 3 on node2"
    unknown = [reasons.parse(p.read_text()) for p in tmp_path.iterdir() if p.name != "3"]
    assert unknown[0] is not None and unknown[0].who() == "a task on node1"
    assert not reasons.record({}, 69, 1, "n", "no directory: nothing written")


def test_text_is_bounded_and_garbage_is_ignored(tmp_path: Path) -> None:
    reasons.record({reasons.REASONS_DIR: str(tmp_path)}, 65, 0, "n", "é" * 5000)
    data = (tmp_path / "0").read_bytes()
    assert len(data) < reasons.READ_BOUND and data.endswith(b"...\n") and data.count(b"\n") == 1
    (tmp_path / "junk").write_text("not a reason\n")
    (tmp_path / "1").write_text("1 2 3\n")
    first = reasons.read_first(str(tmp_path))
    assert first is not None and first.rank == 0 and first.code == 65
    assert reasons.read_first(str(tmp_path / "missing")) is None


def test_a_planted_link_is_not_written_through(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_text("keep\n")
    where = tmp_path / "reasons"
    where.mkdir()
    (where / "1").symlink_to(target)
    assert not reasons.record({reasons.REASONS_DIR: str(where)}, 69, 1, "n", "x")
    assert target.read_text() == "keep\n"


# --- the launcher leaves its reason, with its code ----------------------------------------------------------

def _stop(script: Path, env: dict[str, str], where: Path) -> tuple[int, str, reasons.Reason]:
    where.mkdir(exist_ok=True)
    p = launch(str(script), env={**env, reasons.REASONS_DIR: str(where)})
    _, err = p.communicate(timeout=60)
    found = reasons.read_first(str(where))
    assert found is not None, (p.returncode, err)
    return p.returncode, err, found


def test_preflight_refusal_leaves_its_reason(tmp_path: Path, held_port: int) -> None:
    script = tmp_path / "t.py"
    script.write_text("print('started')")
    env = clean_env(**step_env("localhost,localhost", [1, 1], 0, MASTER_ADDR="127.0.0.1",
                               MASTER_PORT=str(held_port)))
    code, err, found = _stop(script, env, tmp_path / "r")
    assert code == reasons.PREFLIGHT == found.code and found.rank == 0 and found.host == "localhost"
    assert found.text == "refused to start the rank: " + err.removeprefix("slurmlaunch: error: ").strip()
    assert f"cannot listen on MASTER_PORT={held_port}" in found.text


def test_mapping_error_names_the_task_by_its_stated_rank(tmp_path: Path) -> None:
    script = tmp_path / "t.py"
    script.write_text("print('started')")
    env = clean_env(**step_env("localhost", [2], 1, MASTER_ADDR="127.0.0.1", SLURM_STEP_TASKS_PER_NODE="2(x3"))
    code, _, found = _stop(script, env, tmp_path / "r")
    assert code == reasons.MAPPING == found.code and found.rank == 1 and "SLURM_STEP_TASKS_PER_NODE" in found.text
    env = clean_env(**step_env("localhost", [2], 1, MASTER_ADDR="127.0.0.1", SLURM_PROCID="abc"))
    code, _, found = _stop(script, env, tmp_path / "r2")
    assert code == reasons.MAPPING and found.rank is None and "SLURM_PROCID='abc'" in found.text


def test_watchdog_leaves_its_reason_before_the_sigterm(tmp_path: Path) -> None:
    script = tmp_path / "wait.py"
    script.write_text(NEVER_LISTENS)
    port = ports.port()
    env = clean_env(**step_env("localhost,localhost", [1, 1], 1, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)),
                    SLURMLAUNCH_RDZV_TIMEOUT="2")
    code, _, found = _stop(script, env, tmp_path / "r")
    assert code == -15  # the training process itself dies by the SIGTERM; the file carries the code
    assert found.code == reasons.RDZV_TIMEOUT and found.rank == 1
    assert found.text.startswith(f"nothing listened at MASTER_ADDR:MASTER_PORT=127.0.0.1:{port} within 2s")


# --- --wait: the failure line at the end ----------------------------------------------------------------------

def test_follow_prints_the_failure_lines_of_a_failed_job(tmp_path: Path) -> None:
    import io

    from slurmlaunch.app.follow import follow
    from slurmlaunch.schedulers import JobStatus

    (tmp_path / "job-5_10.failure").write_text("slurmlaunch: element ten\n")
    (tmp_path / "job-5_2.failure").write_text("slurmlaunch: element two\n")
    (tmp_path / "job-55.failure").write_text("slurmlaunch: another job\n")
    err = io.StringIO()
    code = follow("5", lambda: JobStatus("FAILED", 69), None, poll=0, out=io.StringIO(), err=err,
                  log_dir=str(tmp_path))
    lines = err.getvalue().splitlines()
    assert code == 69 and lines[-3:] == ["slurmlaunch: element two", "slurmlaunch: element ten",
                                         f"slurmlaunch: job 5 ended FAILED, exit code 69 (logs: {tmp_path})"]
    err = io.StringIO()
    (tmp_path / "job-6.failure").write_text("slurmlaunch: stale, from a run that was requeued\n")
    assert follow("6", lambda: JobStatus("COMPLETED", 0), None, poll=0, out=io.StringIO(), err=err,
                  log_dir=str(tmp_path)) == 0
    assert "stale" not in err.getvalue()


# --- PBS: the qsub script's block, run by bash around an EMULATED mpiexec ------------------------------------

FAKE_MPIEXEC = """#!/usr/bin/env python3
# EMULATION of mpiexec (no PBS or MPI here): runs the launcher command it was given once per stated rank
# (FAKE_RANKS), each with variables that make the launcher refuse; exits 1 as mpiexec does when a rank fails.
import os, subprocess, sys
args = sys.argv[1:]
i = next(i for i in range(len(args)) if args[i:i + 3] == ["-m", "slurmlaunch", "launch"]) - 1
with open(os.environ["FAKE_SEEN"], "w") as f:
    f.write(os.environ.get("SLURMLAUNCH_REASONS_DIR", ""))
for rank in os.environ["FAKE_RANKS"].split():
    subprocess.run(args[i:], env={**os.environ, "PMI_RANK": rank, "SLURMLAUNCH_RDZV_TIMEOUT": "soon"})
sys.exit(1)
"""


@pytest.mark.parametrize("mpi", ["openmpi", "mpich"])
def test_pbs_script_reports_the_first_stopped_rank(tmp_path: Path, mpi: str) -> None:
    logs = tmp_path / "logs"
    spec = golden_spec(mpi=mpi, script=str(tmp_path / "train.py"), python=sys.executable, workdir=str(tmp_path),
                       output_dir=str(logs))
    (tmp_path / "train.py").write_text("print('started')")
    text = pbs_script.render_script(spec)
    assert ' batch-step --outlive-stop ' in text  # which sets SLURMLAUNCH_REASONS_DIR for mpiexec (seen below)
    if mpi == "openmpi":  # Open MPI forwards only the variables named with -x
        assert "-x SLURMLAUNCH_REASONS_DIR" in text
    script = tmp_path / "job.qsub"
    script.write_text(text)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "mpiexec").write_text(FAKE_MPIEXEC)
    (bin_dir / "mpiexec").chmod(0o755)
    logs.mkdir()
    env = no_slurm_env(tmp_path)
    env.update(PATH=f"{bin_dir}:{env['PATH']}:/usr/bin:/bin", PBS_JOBID="41.server", PBS_NODEFILE="/dev/null",
               FAKE_RANKS="5 2", FAKE_SEEN=str(tmp_path / "seen"))
    r = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=120)
    # Rank 5 stopped first (it ran first); a bad SLURMLAUNCH_RDZV_TIMEOUT is a bad request: code 2.
    line = ("slurmlaunch: rank 5 on " + os.uname().nodename + " failed first with exit code 2 (stopped by "
            "slurmlaunch: refused to start the rank: SLURMLAUNCH_RDZV_TIMEOUT='soon' is not valid (expected "
            "seconds >= 0; 0 = off)); the other ranks were stopped")
    assert r.returncode == 2 and line in r.stderr.splitlines(), (r.returncode, r.stderr)
    assert (tmp_path / "seen").read_text() == str(logs / "job-41.reasons")
    assert (logs / "job-41.failure").read_text() == line + "\n"
    assert (logs / "job-41.exitcode").read_text() == "2\n"
    assert not (logs / "job-41.reasons").exists()


def test_pbs_script_keeps_mpiexecs_code_without_a_reason(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    spec = golden_spec(mpi="mpich", workdir=str(tmp_path), output_dir=str(logs), python=sys.executable)
    script = tmp_path / "job.qsub"
    script.write_text(pbs_script.render_script(spec))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "mpiexec").write_text("#!/bin/sh\nexit 7\n")
    (bin_dir / "mpiexec").chmod(0o755)
    logs.mkdir()
    env = no_slurm_env(tmp_path)
    env.update(PATH=f"{bin_dir}:{env['PATH']}:/usr/bin:/bin", PBS_JOBID="42.server", PBS_NODEFILE="/dev/null")
    r = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 7 and "failed first" not in r.stderr, r.stderr
    assert not (logs / "job-42.failure").exists()


# --- the local scheduler: the same line, the same code --------------------------------------------------------

def _local(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    env = no_slurm_env(tmp_path)
    env["SLURMLAUNCH_ALLOW_LOOPBACK"] = "1"
    r = run_cli("submit", "--scheduler", "local", "--nodes", "2", *args, env=env, cwd=tmp_path, timeout=120)
    return r, tmp_path / "slurmlaunch-logs"


def test_local_rendezvous_timeout(tmp_path: Path) -> None:
    (tmp_path / "hang.py").write_text(NEVER_LISTENS)
    r, logs = _local(tmp_path, "--rdzv-timeout", "3", "hang.py")
    assert r.returncode == reasons.RDZV_TIMEOUT, r.stderr
    m = re.search(r"local job (\d+): rank 1 on 127\.0\.0\.2 failed first with exit code 69 \(stopped by "
                  r"slurmlaunch: nothing listened at MASTER_ADDR:MASTER_PORT=127\.0\.0\.1:\d+ within 3s .*\); "
                  r"the other ranks were stopped\n", r.stderr)
    assert m, r.stderr
    assert "exit code 143" not in r.stderr  # (not "143" alone: pytest's own tmp path can hold it)
    job = m.group(1)
    assert (logs / f"job-{job}.exitcode").read_text() == "69\nFAILED\n"
    # the failure file in the batch step's words (what every scheduler's reader reads): the line without "local job N: "
    assert (logs / f"job-{job}.failure").read_text() == "slurmlaunch: " + m.group(0).split(": ", 1)[1]
    assert not (logs / f"job-{job}.reasons").exists()


def test_local_preflight_refusal(tmp_path: Path, held_port: int) -> None:
    (tmp_path / "t.py").write_text(NEVER_LISTENS)
    r, _ = _local(tmp_path, "--master-port", str(held_port), "t.py")
    assert r.returncode == reasons.PREFLIGHT, r.stderr
    assert re.search(r"local job \d+: rank 0 on 127\.0\.0\.1 failed first with exit code 78 \(stopped by slurmlaunch: "
                     rf"refused to start the rank: rank 0 cannot listen on MASTER_PORT={held_port} on 127\.0\.0\.1 ",
                     r.stderr), r.stderr


# --- the real Slurm cluster ----------------------------------------------------------------------------------

def _submit(env: dict[str, str], tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], str, str]:
    r = run_cli("submit", "--nodes", "2", "--tasks-per-node", "1", "--wait", *args, env=env, cwd=tmp_path,
                timeout=180)
    m = re.search(r"submitted job (\d+)", r.stderr)
    assert m, r.stderr
    batch = tmp_path / "slurmlaunch-logs" / f"job-{m.group(1)}.batch.log"
    return r, m.group(1), batch.read_text()


@pytest.mark.slurm
def test_slurm_rendezvous_timeout_reaches_batch_log_and_wait(cluster_env: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "hang.py").write_text(NEVER_LISTENS)
    # A port of our choosing: the derived one (15001 for job 1) may be held by a job of another test cluster,
    # and rank 0 would then refuse (78) before the watchdog's time-out this test is about.
    free = ports.port()
    r, job, batch = _submit(cluster_env, tmp_path, "--rdzv-timeout", "3", "--master-port", str(free), "hang.py")
    line = re.search(r"^slurmlaunch: rank 1 on node2 failed first with exit code 69 \(stopped by slurmlaunch: nothing "
                     rf"listened at MASTER_ADDR:MASTER_PORT=node1:{free} within 3s .*\); the other ranks were stopped$",
                     batch, re.M)
    assert line, batch
    assert r.returncode == 69, (r.returncode, r.stderr)
    assert line.group(0) in r.stderr.splitlines(), r.stderr  # --wait shows the batch log's line
    assert re.search(rf"job {job} ended FAILED, exit code 69\b", r.stderr), r.stderr
    assert "task 1: Terminated" in batch  # what srun itself says of the rank: no code, no reason
    logs = tmp_path / "slurmlaunch-logs"
    assert (logs / f"job-{job}.exitcode").read_text().strip() == "69"
    assert not (logs / f"job-{job}.reasons").exists()


@pytest.mark.slurm
def test_slurm_preflight_refusal_reaches_batch_log_and_wait(cluster_env: dict[str, str], tmp_path: Path,
                                                            held_port: int) -> None:
    (tmp_path / "t.py").write_text(NEVER_LISTENS)
    r, job, batch = _submit(cluster_env, tmp_path, "--master-port", str(held_port), "t.py")
    expect = (f"slurmlaunch: rank 0 on node1 failed first with exit code 78 (stopped by slurmlaunch: refused to "
              f"start the rank: rank 0 cannot listen on MASTER_PORT={held_port} on node1 (Address already in use)")
    lines = [x for x in batch.splitlines() if x.startswith(expect)]
    assert len(lines) == 1 and lines[0].endswith("; the other ranks were stopped"), batch
    assert r.returncode == 78, (r.returncode, r.stderr)
    assert lines[0] in r.stderr.splitlines(), r.stderr
    assert re.search(rf"job {job} ended FAILED, exit code 78\b", r.stderr), r.stderr
