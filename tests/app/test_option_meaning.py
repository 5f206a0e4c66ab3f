"""Every submit option means the same under every scheduler, or that scheduler refuses it with one line.

The walk covers the parser's whole option table: an option added later without a sample here fails the
first test, and one whose value changes nothing a scheduler produces (the rendered script, or the local
scheduler's commands and environment) fails the second, unless it is refused there with exit code 2 and
one line naming it. What follows a submission rather than shaping the job is listed apart, with the reason.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from slurmlaunch import cli

# option -> (options it needs to mean anything, the option with a value that is not its default)
SAMPLES: dict[str, tuple[list[str], list[str]]] = {
    "--nodes": ([], ["--nodes", "3"]),
    "--gpus-per-node": ([], ["--gpus-per-node", "2"]),
    "--tasks-per-node": ([], ["--tasks-per-node", "3"]),
    "--cpus-per-task": ([], ["--cpus-per-task", "5"]),
    "--cpus-per-gpu": (["--gpus-per-node", "2"], ["--cpus-per-gpu", "6"]),
    "--mem": ([], ["--mem", "7G"]),
    "--time": ([], ["--time", "1:02:03"]),
    "--partition": ([], ["--partition", "partx"]),
    "--account": ([], ["--account", "acctx"]),
    "--qos": ([], ["--qos", "qosx"]),
    "--constraint": ([], ["--constraint", "featx"]),
    "--exclusive": ([], ["--exclusive"]),
    "--gpu-flag": (["--gpus-per-node", "2"], ["--gpu-flag", "gres"]),
    "--job-name": ([], ["--job-name", "namex"]),
    "--output-dir": ([], ["--output-dir", "outx"]),
    "--env": ([], ["--env", "KEYX=valx"]),
    "--setup": ([], ["--setup", "echo setupx"]),
    "--sbatch-arg": ([], ["--sbatch-arg=--comment=argx"]),
    "--master-port": ([], ["--master-port", "23456"]),
    "--signal": (["--time", "10"], ["--signal", "USR1@45"]),
    "--requeue": (["--time", "10"], ["--requeue"]),
    "--max-requeues": (["--time", "10", "--requeue"], ["--max-requeues", "7"]),
    "--rdzv-timeout": ([], ["--rdzv-timeout", "33"]),
    "--stage-env": ([], ["--stage-env", "on"]),
    "--python": ([], ["--python", "/opt/pythonx"]),
    "--pbs-flavour": ([], ["--pbs-flavour", "torque"]),
    "--mpi": ([], ["--mpi", "mpich"]),
    "--pbs-resource": ([], ["--pbs-resource", "filesystems=fsx"]),
    "--pbs-chunk": ([], ["--pbs-chunk", "system=sysx"]),
    "--project": ([], ["--project", "projx"]),
    "--pbs-request": ([], ["--pbs-request", "totals"]),
    "--pbs-queues": ([], ["--pbs-queues", "queuex:1-"]),
    "--mpiexec-arg": ([], ["--mpiexec-arg=--argx"]),
    "--mode": ([], ["--mode", "torchrun"]),
    "--nproc-per-node": (["--mode", "torchrun"], ["--nproc-per-node", "3"]),
    "--max-restarts": (["--mode", "torchrun"], ["--max-restarts", "2"]),
    "--container-image": ([], ["--container-image", "imagex"]),
    "--apptainer": ([], ["--apptainer", "imagex.sif"]),
    "--container-mount": (["--apptainer", "imagex.sif"], ["--container-mount", "/srcx:/dstx"]),
    "--container-workdir": (["--apptainer", "imagex.sif"], ["--container-workdir", "/workx"]),
    "--array": ([], ["--array", "0-2"]),
    "--sweep": ([], ["--sweep", "lr=1,2"]),
    "--max-parallel": (["--array", "0-3"], ["--max-parallel", "2"]),
    "--module": ([], ["--module"]),
    "--no-python": ([], ["--no-python"]),
    "--legacy-local-rank-arg": ([], ["--legacy-local-rank-arg"]),
}
# What follows or steers the submission itself, not the job: no scheduler's output shows it.
NOT_THE_JOB = {
    "--profile": "chooses where defaults come from (tested in test_profiles.py)",
    "--scheduler": "chooses the scheduler itself",
    "--template-dir": "chooses templates; the local scheduler refuses it (tested below)",
    "--dry-run": "prints instead of submitting",
    "--wait": "follows the job after submission (locally: --wait and --no-wait detach it, test_jobs_local_detached.py)",
    "--wait-timeout": "bounds the following; the local scheduler refuses it without --wait (tested below)",
    "--cancel-on-interrupt": "what Ctrl-C during --wait does (locally without --wait, Ctrl-C stops the job)",
    "--remote": "where the job is submitted (over ssh; tested in test_remote_submit.py)",
    "--remote-setup": "shell lines before each remote command; refused without --remote (test_remote_submit.py)",
    "--sync": "whether the project is sent first; --no-sync refused without --remote (test_remote_submit.py)",
    "--remote-exclude": "what the sync leaves out; refused without --remote (test_remote_submit.py)",
    "--sync-limit": "the sync's size guard; refused without --remote (test_remote_submit.py)",
}


def submit_flags() -> list[str]:
    parser = cli._parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    flags = []
    for action in sub.choices["submit"]._actions:
        if action.option_strings and action.dest != "help":
            flags.append(next((s for s in action.option_strings if s.startswith("--")), action.option_strings[0]))
    return flags


def test_every_submit_option_is_walked() -> None:
    flags = set(submit_flags())
    assert flags == set(SAMPLES) | set(NOT_THE_JOB), "add the new option to SAMPLES (or NOT_THE_JOB, with why)"


def dry_run(capsys: pytest.CaptureFixture[str], scheduler: str, args: list[str]) -> tuple[int, str, str]:
    """(exit code, what would run: the script or commands and the submit command line, stderr)."""
    code = cli.main(["submit", "--scheduler", scheduler, "--dry-run", *args, "train.py"])
    out, err = capsys.readouterr()
    would_run = [line for line in err.splitlines() if line.startswith("# would run:")]
    return code, out + "\n".join(would_run), err


@pytest.mark.parametrize("scheduler", ["local", "slurm", "pbs"])
@pytest.mark.parametrize("flag", sorted(SAMPLES))
def test_option_has_an_effect_or_is_refused(site: Path, capsys: pytest.CaptureFixture[str], scheduler: str,
                                            flag: str) -> None:
    needs, option = SAMPLES[flag]
    base_code, base_out, base_err = dry_run(capsys, scheduler, needs)
    if base_code == 2:  # what the option needs is itself refused here (e.g. --array under PBS): so is it
        code, _, err = dry_run(capsys, scheduler, [*needs, *option])
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        return
    assert base_code == 0, base_err
    code, out, err = dry_run(capsys, scheduler, [*needs, *option])
    if code == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and flag in lines[0] and "Traceback" not in err, err
        return
    assert code == 0, err
    assert out != base_out, f"{flag} changed nothing in what the {scheduler} scheduler would run"


def test_what_the_local_scheduler_only_shows_is_said(site: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["submit", "--scheduler", "local", "--mem", "1G", "--partition", "p", "train.py"]) == 0
    err = capsys.readouterr().err
    assert "shows --mem 1G, --partition p to the tasks" in err and "enforces nothing" in err, err


@pytest.mark.parametrize("args", [["--template-dir", "tx"], ["--wait-timeout", "5"]])
def test_submission_options_without_local_meaning_are_refused(site: Path, capsys: pytest.CaptureFixture[str],
                                                              args: list[str]) -> None:
    code, _, err = dry_run(capsys, "local", args)
    assert code == 2 and len(err.strip().splitlines()) == 1 and args[0] in err, err


def test_a_refused_value_from_a_profile_names_the_file(site: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (site / "slurmlaunch.toml").write_text('[defaults]\nconstraint = "a100"\n')
    code, _, err = dry_run(capsys, "local", [])
    assert code == 2 and "--constraint a100 (from " in err and "slurmlaunch.toml [defaults]" in err, err
