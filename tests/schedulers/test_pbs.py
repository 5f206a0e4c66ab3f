"""PBS: golden qsub scripts, time conversion, and the qsub/qstat/qdel edges against an EMULATION of those
commands (small scripts standing in for a PBS server, which cannot be installed here)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from pathlib import Path

import pytest

from slurmlaunch.core.errors import SchedulerError, SpecError
from slurmlaunch.render import pbs_script
from tests.helpers import EXAMPLES, GOLDEN, golden_spec, no_slurm_env, run_cli

PBS_GOLDEN = {
    "pbs_pro_openmpi.qsub": golden_spec(time="1-00:00:00", partition="gpuq", account="proj42", mem="64G",
                                        cpus_per_gpu=8, env=(("WANDB_MODE", "offline"),),
                                        setup=("module load openmpi",)),
    "pbs_torque_mpich.qsub": golden_spec(pbs_flavour="torque", mpi="mpich", time="90", exclusive=True),
    "pbs_pro_pals.qsub": golden_spec(mpi="pals", time="2:00:00", cpus_per_task=16, exclusive=True),
    "pbs_pro_sweep.qsub": golden_spec(time="30", sweep=(("lr", ("0.1", "0.01")), ("seed", ("1", "2"))),
                                      max_parallel=2, requeue=True),
    "pbs_torque_array.qsub": golden_spec(pbs_flavour="torque", mpi="mpich", time="30", array="1,3,5-6"),
}


@pytest.mark.parametrize("name", sorted(PBS_GOLDEN))
def test_golden_pbs_scripts(name: str) -> None:
    text = pbs_script.render_script(PBS_GOLDEN[name])
    path = GOLDEN / name
    if os.environ.get("SLURMLAUNCH_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert text == path.read_text(), f"rendered script differs from {path} (SLURMLAUNCH_UPDATE_GOLDEN=1)"
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0


@pytest.mark.parametrize(("slurm_time", "walltime"), [
    ("90", "1:30:00"), ("30:15", "0:30:15"), ("2:00:00", "2:00:00"), ("1-00:00:00", "24:00:00"),
    ("2-3", "51:00:00"), ("1-2:30", "26:30:00"), ("1:99", "0:02:39"),
])
def test_walltime(slurm_time: str, walltime: str) -> None:
    assert pbs_script.walltime(slurm_time) == walltime


@pytest.mark.parametrize("slurm_time", ["UNLIMITED", "infinite", "0", "0:00:00"])
def test_no_limit_is_refused_not_a_walltime_of_nothing(slurm_time: str) -> None:
    """Slurm's no-limit spellings (0 among them) have no PBS walltime: refused, never walltime=0:00:00."""
    with pytest.raises(SpecError) as e:
        pbs_script.walltime(slurm_time)
    zero = "" if slurm_time.upper() in ("UNLIMITED", "INFINITE") else "Slurm reads a time of 0 as no limit, and "
    assert str(e.value) == (f"--time {slurm_time}: {zero}PBS has no unlimited walltime (sites such as ALCF require "
                            f"-l walltime); give a time such as 1:00:00, or leave --time out for the queue's default")


def fake_pbs(tmp_path: Path, exit_status: int = 0) -> dict[str, str]:
    """EMULATION: qsub records its argv and prints a job id; qstat reports the job finished in the text form
    only, as Torque's does (-F json refused); qdel records."""
    bin_dir = tmp_path / "fake-pbs"
    bin_dir.mkdir()
    rec = tmp_path / "pbs-calls.jsonl"
    recorder = ("#!/usr/bin/env python3\nimport json, sys\n"
                f"open({str(rec)!r}, 'a').write(json.dumps(sys.argv) + '\\n')\n")
    (bin_dir / "qsub").write_text(recorder + "print('77.pbs-server')\n")
    (bin_dir / "qstat").write_text(recorder + "if '-F' in sys.argv: sys.exit(\"qstat: invalid option -- 'F'\")\n"
                                   "print('Job Id: 77.pbs-server')\nprint('    job_state = F')\n"
                                   "print('    ctime = Sun Dec  6 10:00:00 2026')\n"
                                   f"print('    Exit_status = {exit_status}')\n")
    (bin_dir / "qdel").write_text(recorder)
    (bin_dir / "qrls").write_text(recorder)  # submit holds the job until its record is written (qsub -h)
    (bin_dir / "qalter").write_text(recorder)
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    env = no_slurm_env(tmp_path)
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    return env


def calls(tmp_path: Path) -> list[list[str]]:
    return [json.loads(line) for line in (tmp_path / "pbs-calls.jsonl").read_text().splitlines()]


def test_submit_wait_through_emulated_pbs(tmp_path: Path) -> None:
    env = {**fake_pbs(tmp_path, exit_status=3), "XDG_STATE_HOME": str(tmp_path / "state")}  # auto: said once per user
    name = "job-1.x+y_z"  # every kind of character the real qsub takes in a name (a "$(" it refuses)
    r = run_cli("submit", "--nodes", "2", "--gpus-per-node", "4", f"--job-name={name}", "--wait",
                str(EXAMPLES / "train_ddp.py"), env=env, cwd=tmp_path)
    assert r.returncode == 3, r.stderr
    assert "auto chose pbs (qsub is on PATH and sbatch is not)" in r.stderr
    assert "job 77.pbs-server ended FAILED, exit code 3" in r.stderr
    qsub = calls(tmp_path)[0]
    assert qsub[1:4] == ["-N", name, "-o"] and qsub[-2] == "-h"  # held until its record is written, then qrls
    record = json.loads((tmp_path / "slurmlaunch-logs" / "job-77.json").read_text())
    assert record["scheduler"] == "pbs" and record["pbs_job_id"] == "77.pbs-server"
    assert record["command"][:3] == ["qsub", "-N", name] and record["command"][-1].endswith("job-77.qsub")
    script = Path(record["command"][-1]).read_text()
    assert "#PBS -l select=2:ncpus=4:mpiprocs=4:ngpus=4" in script and "mpiexec -np 8" in script
    qstats = [[Path(c[0]).name, *c[1:]] for c in calls(tmp_path)[1:3]]  # the JSON form first, then the text
    assert qstats == [["qstat", "-x", "-f", "-F", "json", "77.pbs-server"], ["qstat", "-x", "-f", "77.pbs-server"]]


def test_pbs_dry_run_and_refusals(tmp_path: Path) -> None:
    env = fake_pbs(tmp_path)
    r = run_cli("submit", "--scheduler", "pbs", "--dry-run", "--mpi", "mpich", "--pbs-flavour", "torque",
                str(EXAMPLES / "train_ddp.py"), env=env, cwd=tmp_path)
    assert r.returncode == 0 and "#PBS -l nodes=1:ppn=1" in r.stdout and "# would run: qsub -N" in r.stderr
    r = run_cli("submit", "--scheduler", "pbs", "--mpi", "intel", str(EXAMPLES / "train_ddp.py"), env=env,
                cwd=tmp_path)
    assert r.returncode == 2 and "--mpi" in r.stderr and r.stderr.count("\n") == 1
    r = run_cli("submit", "--scheduler", "pbs", str(EXAMPLES / "train_ddp.py"), env=no_slurm_env(tmp_path),
                cwd=tmp_path)
    assert r.returncode == 2 and "qsub is not on PATH" in r.stderr


def test_pbs_logs_are_the_jobs_one_output(tmp_path: Path) -> None:
    env = fake_pbs(tmp_path)
    r = run_cli("submit", "--scheduler", "pbs", str(EXAMPLES / "train_ddp.py"), env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    (tmp_path / "slurmlaunch-logs" / "77.pbs-server.OU").write_text("0: hello\n1: hello\n")  # as PBS Pro names it
    assert run_cli("logs", "77", env=env).stdout == "0: hello\n1: hello\n"
    r = run_cli("logs", "77", "--rank", "1", env=env)
    assert r.returncode == 2 and "tagged by mpiexec" in r.stderr


def test_array_status_and_cancel_through_emulated_pbs(tmp_path: Path) -> None:
    """EMULATION: qsub prints an array's id (77[].pbs-server); qstat -t lists the array and its subjobs in the
    layout of PBS Pro's qstat -f (one "Job Id:" block each)."""
    env = fake_pbs(tmp_path)
    bin_dir = tmp_path / "fake-pbs"
    rec = tmp_path / "pbs-calls.jsonl"
    recorder = ("#!/usr/bin/env python3\nimport json, sys\n"
                f"open({str(rec)!r}, 'a').write(json.dumps(sys.argv) + '\\n')\n")
    (bin_dir / "qsub").write_text(recorder + "print('77[].pbs-server')\n")
    states = tmp_path / "states"
    states.write_text("F 0\nR\nQ\n")
    (bin_dir / "qstat").write_text(recorder + f"""
lines = open({str(states)!r}).read().split('\\n')
print('Job Id: 77[].pbs-server\\n    job_state = B\\n    ctime = Sun Dec  6 10:00:00 2026')
for i, line in enumerate(l for l in lines if l):
    state, _, code = line.partition(' ')
    print(f'Job Id: 77[{{i}}].pbs-server\\n    job_state = {{state}}\\n    exec_host = n{{i}}/0*4')
    if code:
        print(f'    Exit_status = {{code}}')
""")
    r = run_cli("submit", "--scheduler", "pbs", "--array", "0-2", str(EXAMPLES / "train_ddp.py"), env=env,
                cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "slurmlaunch-logs" / "job-77.json").exists()
    r = run_cli("status", "77", "--json", env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    st = json.loads(r.stdout)
    assert st["state"] == "RUNNING" and st["elements"] == {"0": "COMPLETED 0", "1": "RUNNING", "2": "PENDING"}, st
    assert calls(tmp_path)[-1][1:] == ["-x", "-f", "-t", "77[]"]
    states.write_text("F 0\nF 3\nF 0\n")
    (tmp_path / "slurmlaunch-logs" / "job-77_2.exitcode").write_text("5\n")  # the script's own word wins
    st = json.loads(run_cli("status", "77", "--json", env=env, cwd=tmp_path).stdout)
    assert st["state"] == "FAILED" and st["exit_code"] == 3 and st["elements"]["2"] == "FAILED 5", st
    run_cli("status", "77_1", env=env, cwd=tmp_path)
    assert calls(tmp_path)[-1][1:] == ["-x", "-f", "77[1]"]
    # an ended job is not cancelled: cancel says so, and runs no qdel
    r = run_cli("cancel", "77", env=env, cwd=tmp_path)
    assert r.returncode == 0 and "had already ended (FAILED, exit code 3)" in r.stdout, r.stdout + r.stderr
    assert all(c[0].rpartition("/")[2] != "qdel" for c in calls(tmp_path)), calls(tmp_path)
    states.write_text("R\nR\nR\n")
    for job, qdel in (("77", "77[].pbs-server"), ("77_2", "77[2]")):
        r = run_cli("cancel", job, env=env, cwd=tmp_path)
        assert r.returncode == 0 and calls(tmp_path)[-1][1:] == [qdel], r.stderr


def test_the_scripts_exit_code_wins_over_a_qstat_without_one(tmp_path: Path) -> None:
    """EMULATION of a Torque-style qstat (Slurm's slurm-wlm-torque wrapper prints no exit status)."""
    env = fake_pbs(tmp_path)
    (tmp_path / "fake-pbs" / "qstat").write_text("#!/bin/sh\necho 'Job Id: 77'\necho '    job_state = C'\n"
                                                 "echo '    ctime = Sun Dec  6 10:00:00 2026'\n")
    r = run_cli("submit", "--scheduler", "pbs", str(EXAMPLES / "train_ddp.py"), env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(run_cli("status", "77", "--json", env=env, cwd=tmp_path).stdout)["state"] == "COMPLETED"
    (tmp_path / "slurmlaunch-logs" / "job-77.exitcode").write_text("4\n")
    st = json.loads(run_cli("status", "77", "--json", env=env, cwd=tmp_path).stdout)
    assert st["state"] == "FAILED" and st["exit_code"] == 4, st


# What a real OpenPBS 23.06's `qstat -x -f -F json` showed for each kind of job (tests/real/test_pbs_real.py puts
# jobs in each of these and checks the same mapping against the server itself).
@pytest.mark.parametrize(("attrs", "code_file", "state", "code"), [
    ({"job_state": "Q", "substate": 10}, None, "PENDING", None),
    ({"job_state": "H", "substate": 20}, None, "PENDING", None),
    ({"job_state": "R", "substate": 41}, None, "RUNNING", None),  # PRERUN: sent to the MoM
    ({"job_state": "R", "substate": 42}, None, "RUNNING", None),
    ({"job_state": "F", "substate": 92, "Exit_status": 0}, None, "COMPLETED", 0),
    ({"job_state": "F", "substate": 92, "Exit_status": 0}, 5, "FAILED", 5),  # the script's own word wins
    ({"job_state": "F", "substate": 93, "Exit_status": 7}, None, "FAILED", 7),
    ({"job_state": "F", "substate": 93, "Exit_status": 265}, None, "FAILED", 137),  # 256 + SIGKILL
    ({"job_state": "F", "substate": 93, "Exit_status": -29}, None, "TIMEOUT", 1),  # past its walltime
    ({"job_state": "F", "substate": 93, "Exit_status": -1}, None, "FAILED", 1),  # JOB_EXEC_FAIL1
    ({"job_state": "F", "substate": 91, "Exit_status": 0}, None, "CANCELLED", 1),  # qdel'd while running
    ({"job_state": "F", "substate": 91, "Exit_status": 0}, 0, "CANCELLED", 1),
    ({"job_state": "F", "substate": 91}, None, "CANCELLED", 1),  # qdel'd before it ran
    ({"job_state": "F", "substate": 91, "Exit_status": 7}, None, "CANCELLED", 7),
    # qdel'd after a sister host's MoM was started again (seen on OpenPBS 23.06): substate 93, Exit_status 0, and
    # the server's comment says who terminated it
    ({"job_state": "F", "substate": 93, "Exit_status": 0, "comment": "Job run at Mon Dec 07 at 03:29 on "
      "(node1:ncpus=1)+(node2:ncpus=1) and terminated by root@head"}, None, "CANCELLED", 1),
    ({"job_state": "F", "substate": 92, "Exit_status": 0,
      "comment": "Job run at Mon Dec 07 at 03:29 on (node1:ncpus=1) and finished"}, None, "COMPLETED", 0),
    ({"job_state": "F", "substate": 93, "Exit_status": 3,
      "comment": "Job run at Mon Dec 07 at 03:29 on (node1:ncpus=1) and failed"}, None, "FAILED", 3),
])
def test_real_pbs_states_map(attrs: dict[str, object], code_file: int | None, state: str, code: int | None) -> None:
    from slurmlaunch.schedulers.pbs import job_status

    st = job_status({**attrs, "exec_host": "node1/0*2"}, code_file)
    assert (st.state, st.exit_code, st.nodes) == (state, code, "node1/0*2")


# A -r y job across a rerun, as the real server showed it (tests/real/test_pbs_real_rerun.py): queued again with
# the stopped run's Exit_status (-11 after qrerun) and run_count; run_count + 1 once it runs again.
@pytest.mark.parametrize(("attrs", "state", "note"), [
    ({"job_state": "Q", "substate": 10, "Exit_status": -11, "run_count": 1}, "PENDING",
     "PBS stopped run 1 and queued it again to rerun (qrerun)"),
    ({"job_state": "Q", "substate": 10, "Exit_status": -20, "run_count": 2}, "PENDING",
     "PBS stopped run 2 and queued it again to rerun (its first host failed)"),
    ({"job_state": "R", "substate": 42, "run_count": 2}, "RUNNING", "run 2: PBS reran it from the start"),
    ({"job_state": "R", "substate": 42, "run_count": 1}, "RUNNING", None),
    ({"job_state": "Q", "substate": 10}, "PENDING", None),
    ({"job_state": "Q", "substate": 10, "Exit_status": -29, "run_count": 1}, "PENDING", None),  # not a rerun code
    ({"job_state": "F", "substate": 93, "Exit_status": 3, "run_count": 2}, "FAILED", None),  # ended: no note
    # why a queued job waits, in the scheduler's words (its comment), as the real server wrote it
    ({"job_state": "Q", "substate": 10, "comment": "Can Never Run: Not enough total nodes available"}, "PENDING",
     "PBS's comment: Can Never Run: Not enough total nodes available"),
    ({"job_state": "Q", "substate": 10, "Exit_status": -11, "run_count": 1, "comment": "Job held"}, "PENDING",
     "PBS stopped run 1 and queued it again to rerun (qrerun)"),  # the rerun says more
    ({"job_state": "R", "substate": 42, "comment": "Job run at ..."}, "RUNNING", None),
])
def test_a_rerun_is_noted(attrs: dict[str, object], state: str, note: str | None) -> None:
    from slurmlaunch.schedulers.pbs import job_status

    st = job_status(attrs)
    assert (st.state, st.note) == (state, note)


def test_a_running_jobs_elapsed_time_is_counted_from_its_start() -> None:
    """The MoM sends resources_used.walltime only when it polls (00:00:00 for the first minutes on the real
    server): while the job runs, elapsed is now less stime; once it has ended, PBS's walltime."""
    import time

    from slurmlaunch.schedulers.pbs import elapsed_of, job_status

    start = time.mktime((2026, 12, 2, 17, 0, 5, 0, 0, -1))
    stime = time.strftime("%a %b %e %H:%M:%S %Y", time.localtime(start))  # qstat's form: "Wed Dec  2 17:00:05 2026"
    running = {"job_state": "R", "substate": 42, "stime": stime, "resources_used": {"walltime": "00:00:00"}}
    assert job_status(running, now=start + 3725).elapsed == "01:02:05"
    assert elapsed_of({**running, "stime": int(start)}, start + 61) == "00:01:01"
    assert elapsed_of({**running, "resources_used": {"walltime": "00:05:00"}}, start + 61) == "00:05:00"
    assert elapsed_of({**running, "stime": "soon"}, start + 61) == "00:00:00"  # unreadable: PBS's own word
    assert elapsed_of({"job_state": "Q"}, start) is None
    ended = {"job_state": "F", "substate": 92, "Exit_status": 0, "stime": stime,
             "resources_used": {"walltime": "00:00:17"}}
    assert job_status(ended, now=start + 3725).elapsed == "00:00:17"  # no clock reading once it has ended


def test_an_unknown_pbs_state_is_named() -> None:
    from slurmlaunch.schedulers.pbs import job_status

    with pytest.raises(SchedulerError, match="unknown job_state 'Z'"):
        job_status({"job_state": "Z"})


def test_tmrsh_agent_runs_open_mpis_command_line_through_pbs_tmrsh() -> None:
    """Open MPI gives the agent HOST and the words of one shell command line (as to ssh); pbs_tmrsh runs an
    argv without a shell, so the words go to /bin/sh -c. pbs_tmrsh is found through PBS_EXEC, pbs.conf,
    PATH or /opt/pbs; with none, ssh (Open MPI's default)."""
    from slurmlaunch.allocation import tmrsh

    words = ["PATH=/x:$PATH", ";", "export", "PATH", ";", "orted", "-mca", "ess", "env"]
    assert tmrsh.command(["node2", *words], "/p/bin/pbs_tmrsh") == [
        "/p/bin/pbs_tmrsh", "node2", "/bin/sh", "-c",
        f"PATH=/x:$PATH ; export PATH ; orted -mca ess env\nrc=$?; sleep {tmrsh.LINGER_S}; exit $rc"]
    assert tmrsh.command(["node2", *words], None) == ["ssh", "node2", *words]
    with pytest.raises(ValueError, match="expected HOST COMMAND"):
        tmrsh.command(["node2"], None)
    conf = {"/etc/pbs.conf": "PBS_EXEC=/srv/pbs\nPBS_SERVER=head\n"}
    on = {"/srv/pbs/bin/pbs_tmrsh", "/usr/local/bin/pbs_tmrsh", "/opt/pbs/bin/pbs_tmrsh", "/e/bin/pbs_tmrsh"}
    find = tmrsh.find_tmrsh
    assert find({"PBS_EXEC": "/e", "PATH": "/usr/local/bin"}, on.__contains__, conf.get) == "/e/bin/pbs_tmrsh"
    assert find({"PATH": "/usr/local/bin"}, on.__contains__, conf.get) == "/srv/pbs/bin/pbs_tmrsh"
    assert find({"PATH": "/usr/local/bin"}, on.__contains__, {}.get) == "/usr/local/bin/pbs_tmrsh"
    assert find({}, on.__contains__, {}.get) == "/opt/pbs/bin/pbs_tmrsh"
    assert find({}, set().__contains__, conf.get) is None


def test_a_job_submitted_again_at_the_warning_is_cancelled_where_it_runs_now(tmp_path: Path) -> None:
    """The batch step lists a job's resubmissions in its job-ID.requeued (allocation/batch_step.py); cancel
    (and status) go to the last one. A line that is not a job id is not one to qdel."""
    from slurmlaunch.schedulers import pbs

    (tmp_path / "job-5.requeued").write_text("6.head\n7.head\n$(id)\n")
    assert pbs.resubmissions("5.head", str(tmp_path)) == ["6.head", "7.head"]
    assert pbs.EDGE.resubmissions("5.head", str(tmp_path)) == ["6.head", "7.head"]
    sent: list[str] = []
    ours = {("6.head", "5.head"), ("7.head", "5.head"), ("10.head", "9.head")}  # qstat -f's Variable_List
    edge = dataclasses.replace(pbs.EDGE, cancel_job=sent.append,  # qdel's stand-in
                               resubmission_check=lambda job, first: (job, first) in ours)
    assert edge.cancel("5.head", str(tmp_path)) == "7.head"  # the id cancel says it deleted
    assert edge.cancel("8.head", str(tmp_path)) == "8.head" and edge.cancel("5.head") == "5.head"
    assert sent == ["7.head", "8.head", "5.head"]

    def qdel_as_it_is_submitted_again(job: str) -> None:  # the batch step's qsub answered while qdel ran
        sent.append(job)
        (tmp_path / "job-9.requeued").write_text("10.head\n")

    sent.clear()
    edge = dataclasses.replace(edge, cancel_job=qdel_as_it_is_submitted_again)
    assert edge.cancel("9.head", str(tmp_path)) == "10.head" and sent == ["9.head", "10.head"]


def test_every_id_of_a_chain_submitted_again_at_the_warning_names_the_chain(tmp_path: Path) -> None:
    """EMULATION: job 77 was submitted again at the warning as 78, and 78 as 79, which runs (the batch step lists
    them in job-77.requeued; qstat answers per id). The later ids have no line in the index: status, logs and
    cancel of any of them (full or short) find the first job's record, follow the chain and say which run the
    id is; cancel says which job it deleted."""
    env = fake_pbs(tmp_path)
    (tmp_path / "fake-pbs" / "qstat").write_text(
        "#!/usr/bin/env python3\nimport sys\n"
        "if '-F' in sys.argv: sys.exit(\"qstat: invalid option -- 'F'\")\n"
        "job = sys.argv[-1]\nprint('Job Id: ' + job)\n"
        "print('    job_state = ' + ('R' if job.startswith('79') else 'F'))\n"
        "print('    ctime = Sun Dec  6 10:00:00 2026')\n"
        "print('    Exit_status = 0')\n"
        "if job[:2] in ('78', '79'):  # the batch step's qsub -v, folded as qstat -f folds a long line\n"
        "    print('    Variable_List = PBS_O_HOME=/root,SLURMLAUNCH_RESTART_COUNT=1,SLURMLAUNCH_REQ')\n"
        "    print('\\tUEUE_OF=77.pbs-server,PBS_O_WORKDIR=/tmp')\n")
    r = run_cli("submit", "--scheduler", "pbs", str(EXAMPLES / "train_ddp.py"), env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    logs = tmp_path / "slurmlaunch-logs"
    (logs / "job-77.requeued").write_text("78.pbs-server\n79.pbs-server\n")
    (logs / "77.pbs-server.OU").write_text("run 1\nrun 2\nrun 3\n")

    def status(job: str) -> dict[str, object]:
        s = run_cli("status", job, "--json", env=env, cwd=tmp_path)
        assert s.returncode == 0, s.stderr
        return dict(json.loads(s.stdout))

    first = status("77")
    assert (first["state"], first["note"]) == ("RUNNING", "run 3: resubmitted at the warning as job 79.pbs-server")
    assert "named" not in first
    second = status("78.pbs-server")
    assert (second["state"], second["named"], second["run"]) == ("RUNNING", "78.pbs-server", 2), second
    assert second["note"] == ("job 78.pbs-server is its run 2; run 3: resubmitted at the warning as job "
                              "79.pbs-server"), second
    third = status("79")  # the short id, as for any job
    assert (third["named"], third["run"]) == ("79.pbs-server", 3), third
    assert third["note"] == "run 3: resubmitted at the warning as job 79.pbs-server", third  # said once
    text = run_cli("status", "78", env=env, cwd=tmp_path).stdout
    assert text == ("job 77.pbs-server (pbs): RUNNING (job 78.pbs-server is its run 2; run 3: resubmitted at the "
                    "warning as job 79.pbs-server)\n"), text  # named as qsub printed it, though 78 was asked
    unknown = run_cli("status", "80", env=env, cwd=tmp_path)
    assert unknown.returncode == 2 and "job '80' was not submitted from here" in unknown.stderr, unknown.stderr

    shown = run_cli("logs", "78", env=env, cwd=tmp_path)
    assert shown.stdout == "run 1\nrun 2\nrun 3\n", shown.stderr  # the chain's one output
    assert shown.stderr == (f"slurmlaunch: job 78.pbs-server is run 2 of job 77.pbs-server, resubmitted at the "
                            f"warning: every run's output is in {logs / '77.pbs-server.OU'}\n")

    for job in ("78.pbs-server", "77"):
        c = run_cli("cancel", job, env=env, cwd=tmp_path)
        assert c.stdout == "cancelled job 79.pbs-server (run 3 of job 77.pbs-server)\n", c.stdout + c.stderr
    qdels = [c[1:] for c in calls(tmp_path) if Path(c[0]).name == "qdel"]
    assert qdels == [["79.pbs-server"], ["79.pbs-server"]]  # the run that runs now, never an ended one


@pytest.mark.parametrize("planted", [
    "4242.pbs-server\n",  # another user's job: qstat shows no resubmission word in its Variable_List
    "4343.pbs-server\n",  # a resubmission, but of job 99
    "77.pbs-server\n" * 100 + "4242\n",  # the job itself (a chain that loops), many times over, then another's
    "4242\n" * 20000,  # past the 64 KiB read: the first lines are read, no more
])
def test_a_planted_list_of_resubmissions_deletes_and_follows_no_other_job(tmp_path: Path, planted: str) -> None:
    """EMULATION: job-77.requeued is only a file in the log directory; whoever may write there can plant one
    that names someone else's job. cancel deletes no listed id that qstat -f does not show as job 77's
    resubmission (the batch step's qsub -v SLURMLAUNCH_REQUEUE_OF=77...), and says so in one line; status
    reports job 77 itself, and says why it did not follow the list."""
    env = fake_pbs(tmp_path)
    (tmp_path / "fake-pbs" / "qstat").write_text(
        "#!/usr/bin/env python3\nimport sys\n"
        "if '-F' in sys.argv: sys.exit(\"qstat: invalid option -- 'F'\")\n"
        "job = sys.argv[-1]\nprint('Job Id: ' + job)\n"
        f"print('    job_state = ' + (open({str(tmp_path / 'state-77')!r}).read() if job.startswith('77') else 'R'))\n"
        "print('    ctime = Sun Dec  6 10:00:00 2026')\n"
        "print('    Exit_status = 0')\n"
        "print('    Variable_List = PBS_O_HOME=/root' + (',SLURMLAUNCH_REQUEUE_OF=99.pbs-server' "
        "if job.startswith('4343') else ''))\n")
    (tmp_path / "state-77").write_text("Q")  # held, as submitted
    r = run_cli("submit", "--scheduler", "pbs", str(EXAMPLES / "train_ddp.py"), env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    (tmp_path / "slurmlaunch-logs" / "job-77.requeued").write_text(planted)
    listed = planted[:64 << 10].split()[-1]  # the part read

    (tmp_path / "state-77").write_text("R")  # the first run runs (the list was planted meanwhile)
    c = run_cli("cancel", "77", env=env, cwd=tmp_path)
    assert c.returncode != 0 and "Traceback" not in c.stderr, c.stderr
    assert c.stderr.count("\n") == 1 and f"names job {listed}, which PBS does not show as one: nothing deleted" \
        in c.stderr, c.stderr
    assert [c for c in calls(tmp_path) if Path(c[0]).name == "qdel"] == []

    (tmp_path / "state-77").write_text("F")  # it ended: status does not take the listed job for its next run
    ended = run_cli("cancel", "77", env=env, cwd=tmp_path)
    assert ended.stdout.startswith("job 77.pbs-server had already ended"), ended.stdout + ended.stderr
    assert [c for c in calls(tmp_path) if Path(c[0]).name == "qdel"] == []

    s = run_cli("status", "77", "--json", env=env, cwd=tmp_path)
    assert s.returncode == 0, s.stderr
    st = json.loads(s.stdout)
    assert st["state"] == "COMPLETED" and "named" not in st, st  # job 77's own state, not the listed job's
    assert st["note"] == f"its job-77.requeued lists job {listed}, which PBS does not show as its resubmission: " \
                         f"not followed", st


@pytest.mark.parametrize(("variables", "ours"), [
    ({"SLURMLAUNCH_REQUEUE_OF": "77.pbs-server", "SLURMLAUNCH_RESTART_COUNT": 1}, True),
    ({"SLURMLAUNCH_REQUEUE_OF": "99.pbs-server"}, False),
    ({"PBS_O_HOME": "/root"}, False),
    ("not an object", False),
])
def test_a_resubmission_is_known_by_its_variable_in_qstat_json(monkeypatch: pytest.MonkeyPatch,
                                                               variables: object, ours: bool) -> None:
    """EMULATION of `qstat -x -f -F json` (OpenPBS; the real server's form, tests/real/test_pbs_real_requeue.py
    reads Variable_List there): the batch step's qsub -v SLURMLAUNCH_REQUEUE_OF=FIRST is what makes an id the
    first job's resubmission."""
    from slurmlaunch.schedulers import pbs

    answer = json.dumps({"Jobs": {"78.pbs-server": {"job_state": "R", "Variable_List": variables}}})
    monkeypatch.setattr(pbs, "run_command", lambda argv, timeout: subprocess.CompletedProcess(argv, 0, answer, ""))
    assert pbs.resubmission_of("78.pbs-server", "77.pbs-server") is ours
    assert pbs.resubmission_of("78", "77") is ours
