"""Issue 41, "Papercuts found on the way": pass-through flags as --help shows them, a torchrun or sbatch user's
flags named with their counterparts, a rank recognisable in ps, auto's choice said once, `list`'s states,
filters and --prune, the local dry run's distributed variables, and the API's local 'enforces nothing' line."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import sys
import time
from pathlib import Path

import pytest

from slurmlaunch.app.flag_hints import SBATCH_ARG, SUBMIT_HINTS
from slurmlaunch.app.jobs import listing
from slurmlaunch.core.errors import SpecError
from tests.helpers import no_slurm_env, run_cli


def _env(tmp_path: Path) -> dict[str, str]:
    """A laptop's environment (no sbatch, no qsub) with this test's own per-user state."""
    return {**no_slurm_env(tmp_path), "XDG_STATE_HOME": str(tmp_path / "state")}


# -- --sbatch-arg --OPTION=VALUE, --mpiexec-arg --FLAG ------------------------------------------------------

def test_pass_through_flags_take_the_form_help_shows(tmp_path: Path) -> None:
    (tmp_path / "t.py").write_text("")
    r = run_cli("submit", "--dry-run", "--scheduler", "slurm", "--sbatch-arg", "--mail-type=END", "--sbatch-arg",
                "--hold", "--nodes", "2", "t.py", env=_env(tmp_path), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "#SBATCH --mail-type=END\n" in r.stdout and "#SBATCH --hold\n" in r.stdout, r.stdout
    r = run_cli("submit", "--dry-run", "--scheduler", "pbs", "--mpiexec-arg", "--cpu-bind=list:1-8", "t.py",
                env=_env(tmp_path), cwd=tmp_path)
    assert r.returncode == 0 and "--cpu-bind=list:1-8" in r.stdout, r.stderr
    help_text = run_cli("submit", "--help").stdout
    assert "--sbatch-arg --OPTION=VALUE" in help_text and "--mpiexec-arg --FLAG[=VALUE]" in help_text


def test_the_scripts_own_arguments_are_never_changed(tmp_path: Path) -> None:
    (tmp_path / "t.py").write_text("")
    r = run_cli("submit", "--dry-run", "--scheduler", "slurm", "t.py", "--sbatch-arg", "--x=1", env=_env(tmp_path),
                cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "#SBATCH --x=1" not in r.stdout and "t.py --sbatch-arg --x=1" in r.stdout, r.stdout


def test_a_pass_through_flag_without_its_value_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "t.py").write_text("")
    r = run_cli("submit", "--dry-run", "--sbatch-arg", env=_env(tmp_path), cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--sbatch-arg" in r.stderr, r.stderr


# -- a torchrun or sbatch user's flags ---------------------------------------------------------------------

@pytest.mark.parametrize(("typed", "said"), [
    (["--nnodes", "2"], "torchrun's --nnodes: use --nodes N"),
    (["--nnodes=2"], "torchrun's --nnodes: use --nodes N"),
    (["--ntasks-per-node", "4"], "sbatch's --ntasks-per-node: use --tasks-per-node N"),
    (["--nproc_per_node", "4"], "torchrun's --nproc_per_node: use --gpus-per-node G"),
    (["--node-rank", "1"], "torchrun's --node-rank: none here"),
    (["--master-addr", "h"], "torchrun's --master-addr: none here"),
    (["--master_port", "5"], "torchrun's --master_port: use --master-port PORT"),
    (["--rdzv-endpoint", "h:1"], "torchrun's --rdzv-endpoint: none here"),
    (["--standalone"], "torchrun's --standalone: none here"),
    (["--max_restarts", "3"], "torchrun's --max_restarts: use --max-restarts N"),
    (["-t", "10"], "sbatch's -t: use --time"),
    (["-c", "4"], "sbatch's -c: use --cpus-per-task N"),
    (["--gres", "gpu:4"], "sbatch's --gres: use --gpus-per-node N"),
    (["--gpus", "8"], "sbatch's --gpus: use --gpus-per-node N"),
    (["--mail-user", "me@x"], "sbatch's --mail-user passes through as --sbatch-arg=--mail-user=VALUE"),
])
def test_submit_names_the_counterpart_of_a_torchrun_or_sbatch_flag(typed: list[str], said: str,
                                                                   tmp_path: Path) -> None:
    (tmp_path / "t.py").write_text("")
    r = run_cli("submit", *typed, "t.py", env=_env(tmp_path), cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(f"slurmlaunch: error: unrecognized arguments: {typed[0]}") and said in r.stderr, \
        r.stderr


def test_run_sends_sbatch_flags_to_submit_and_keeps_its_torchrun_ones(tmp_path: Path) -> None:
    (tmp_path / "t.py").write_text("")
    r = run_cli("run", "--ntasks-per-node", "2", "t.py", env=_env(tmp_path), cwd=tmp_path)
    assert r.returncode == 2 and "sbatch's --ntasks-per-node asks a scheduler: slurmlaunch submit" in r.stderr, \
        r.stderr
    r = run_cli("submit", "--nodez", "2", "t.py", env=_env(tmp_path), cwd=tmp_path)  # nothing known: no guess
    assert r.returncode == 2 and r.stderr == "slurmlaunch: error: unrecognized arguments: --nodez\n", r.stderr


def test_the_hint_table_agrees_with_submits_options() -> None:
    """Every flag of the table is one submit does not have (else its hint could never be said), and every
    option a hint tells to use is one submit has."""
    import argparse

    from slurmlaunch.app.options import add_submit_options

    parser = argparse.ArgumentParser(add_help=False)
    add_submit_options(parser)
    known = set(parser._option_string_actions)
    assert not known & set(SUBMIT_HINTS)
    for flag, (_, instead) in SUBMIT_HINTS.items():
        own = re.sub(r"slurmlaunch [a-z]+[^,;)]*", "", instead.replace(SBATCH_ARG, ""))  # not another command's
        named = set(re.findall(r"--[a-z][a-z-]+", own))
        assert named <= known | {"--mode"}, (flag, named - known)
        assert instead.startswith(("none", "--")), flag


# -- a rank in ps, top and pgrep -f ---------------------------------------------------------------------------

SHOW_ME = """
import os, subprocess, sys
with open("/proc/self/cmdline", "rb") as f:
    argv = f.read().split(b"\\0")[:-1]
found = subprocess.run([sys.argv[2], "-f", "find-me-41.py --marker"], capture_output=True, text=True).stdout.split()
print("ARGV", [a.decode() for a in argv], "PGREP", str(os.getpid()) in found, flush=True)
"""


def test_a_rank_is_recognisable_by_its_script_in_ps(tmp_path: Path) -> None:
    (tmp_path / "find-me-41.py").write_text(SHOW_ME)
    pgrep = shutil.which("pgrep")
    assert pgrep is not None, "procps' pgrep is part of the test machine"
    r = run_cli("submit", "--scheduler", "local", "--tasks-per-node", "2", "find-me-41.py", "--marker", pgrep,
                env=_env(tmp_path), cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = [line for line in r.stdout.splitlines() if "ARGV" in line]
    assert len(lines) == 2, r.stdout
    for line in lines:
        argv = eval(line.split("ARGV ", 1)[1].rsplit(" PGREP", 1)[0])  # noqa: S307 (our own repr of a list)
        assert line.endswith("PGREP True"), line
        script = next(i for i, a in enumerate(argv) if a.endswith("find-me-41.py"))
        assert argv[script + 1:] == ["--marker", pgrep], argv
        # the runner is there (its marks are made), named by its file: the script within the first 200 characters
        assert "rank_runner.py" in argv[script - 1] and len(" ".join(argv[:script + 1])) < 200 + len(sys.executable), \
            argv
        assert all("def _slurmlaunch" not in a for a in argv), argv
    assert (tmp_path / "slurmlaunch-logs").exists()


def test_the_runner_leaves_no_name_in_the_scripts_globals(tmp_path: Path) -> None:
    from slurmlaunch.allocation.script_runner import RUNNER

    (tmp_path / "g.py").write_text("print(sorted(k for k in globals() if not k.startswith('__')), __doc__)\n")
    import subprocess

    r = subprocess.run([sys.executable, "-u", "-c", RUNNER, str(tmp_path / "g.py")], capture_output=True, text=True,
                       env={**os.environ, "SLURMLAUNCH_RETURNED_DIR": str(tmp_path)}, timeout=60)
    assert r.returncode == 0 and r.stdout == "[] None\n", r.stdout + r.stderr
    assert (tmp_path / "rank").exists()  # the returned-mark: the runner ran


def test_the_runner_spells_the_file_names_as_the_core() -> None:
    from slurmlaunch.allocation.script_runner import RUNNER_FILE
    from slurmlaunch.core import (
        EXIT_MARK_SUFFIX,
        STACKS_DUMP_SUFFIX,
        STACKS_ENDED_SUFFIX,
        STACKS_PID_SUFFIX,
        STACKS_STOP_SUFFIX,
    )

    text = Path(RUNNER_FILE).read_text()
    for suffix in (EXIT_MARK_SUFFIX, STACKS_DUMP_SUFFIX, STACKS_PID_SUFFIX, STACKS_STOP_SUFFIX, STACKS_ENDED_SUFFIX):
        assert f'"{suffix}"' in text, suffix


# -- auto's choice and the OMP line: said once, short ---------------------------------------------------------

def test_autos_choice_is_said_once_and_again_when_it_changes(tmp_path: Path) -> None:
    (tmp_path / "t.py").write_text("")
    env = _env(tmp_path)
    said = [run_cli("submit", "--dry-run", "t.py", env=env, cwd=tmp_path).stderr for _ in range(2)]
    assert said[0].count("--scheduler auto chose local (no sbatch or qsub on PATH)") == 1, said[0]
    assert "auto chose" not in said[1], said[1]
    fake = tmp_path / "bin"  # a PBS client appears: the choice changed, and is said
    fake.mkdir()
    (fake / "qsub").write_text("#!/bin/sh\nexit 1\n")
    (fake / "qsub").chmod(0o755)
    r = run_cli("submit", "--dry-run", "t.py", env={**env, "PATH": f"{fake}:{env['PATH']}"}, cwd=tmp_path)
    assert "--scheduler auto chose pbs (qsub is on PATH and sbatch is not)" in r.stderr, r.stderr
    assert "auto chose local" in run_cli("submit", "--dry-run", "t.py", env=env, cwd=tmp_path).stderr


# -- list ---------------------------------------------------------------------------------------------------

def _submit(tmp_path: Path, env: dict[str, str], name: str, code: int) -> str:
    (tmp_path / f"{name}.py").write_text(f"import sys\nsys.exit({code})\n")
    r = run_cli("submit", "--scheduler", "local", "--job-name", name, f"{name}.py", env=env, cwd=tmp_path,
                timeout=120)
    assert r.returncode == code, r.stderr
    return r.stderr.split("local job ", 1)[1].split(":", 1)[0]


def test_list_states_filters_and_prune(tmp_path: Path) -> None:
    env = _env(tmp_path)
    failed = _submit(tmp_path, env, "train-a", 7)
    done = _submit(tmp_path, env, "eval-b", 0)
    table = run_cli("list", env=env).stdout
    assert re.search(rf"{failed}\s+local\s+FAILED 7\s", table) and re.search(rf"{done}\s+local\s+COMPLETED\s",
                                                                              table), table

    def ids(*args: str) -> list[str]:
        r = run_cli("list", "--json", *args, env=env)
        assert r.returncode == 0, r.stderr
        return [row["job_id"] for row in json.loads(r.stdout)]

    assert ids("--state", "failed") == [failed] and ids("--state", "COMPLETED,RUNNING") == [done]
    assert ids("train*") == [failed] and ids(done) == [done] and ids("nothing*") == []
    assert ids("--since", "1h") == [failed, done] and ids("--before", "1h") == []
    assert ids("--since", time.strftime("%Y-%m-%d", time.localtime(time.time() + 2 * 86400))) == []
    r = run_cli("list", "--since", "yesterday", env=env)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "30m, 12h, 3d, 2w" in r.stderr, r.stderr
    r = run_cli("list", "--prune", "--state", "FAILED", env=env)
    assert r.returncode == 0 and "removed 1 job(s)" in r.stdout, r.stdout + r.stderr
    assert ids() == [done]
    assert (tmp_path / "slurmlaunch-logs" / f"job-{failed}.json").exists()  # its files stay


def test_list_explains_the_states_it_cannot_tell(tmp_path: Path) -> None:
    env = _env(tmp_path)
    index = tmp_path / "state" / "slurmlaunch" / "jobs.jsonl"
    index.parent.mkdir(parents=True)
    rows = [{"job_id": "5", "scheduler": "slurm", "record": str(tmp_path / "gone.json"), "name": "x",
             "submitted_at": "2026-01-01T00:00:00+0000"}]
    index.write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = run_cli("list", env=env)
    assert "record gone" in r.stdout and "slurmlaunch: record gone: its record" in r.stderr, r.stdout + r.stderr
    assert listing.legend(["?", "COMPLETED"]) == [
        f"?: {listing.UNKNOWN_STATES['?']} (slurmlaunch status JOB says more)"]


def test_prune_keeps_a_job_whose_state_is_unknown_unless_asked(tmp_path: Path) -> None:
    env = _env(tmp_path)
    index = tmp_path / "state" / "slurmlaunch" / "jobs.jsonl"
    index.parent.mkdir(parents=True)
    (tmp_path / "bad.json").write_text('{"not": "a record"}')  # a record that does not read: "?"
    row = {"job_id": "5", "scheduler": "slurm", "record": str(tmp_path / "bad.json"), "name": "x",
           "submitted_at": "2026-01-01T00:00:00+0000"}
    index.write_text(json.dumps(row) + "\n")
    assert json.loads(run_cli("list", "--json", env=env).stdout)[0]["state"] == "?"
    r = run_cli("list", "--prune", env=env)
    assert "removed 0 job(s)" in r.stdout and "kept 1 job(s) that may still run (or whose state is ?): 5" in r.stderr
    r = run_cli("list", "--prune", "--state", "?", env=env)
    assert "removed 1 job(s)" in r.stdout and index.read_text() == "", r.stdout + r.stderr


def test_prune_keeps_jobs_that_may_still_run_and_lines_it_cannot_read(tmp_path: Path) -> None:
    index = tmp_path / "jobs.jsonl"
    rows = [{"job_id": str(n), "record": f"/r/{n}"} for n in range(3)]
    index.write_text(json.dumps(rows[0]) + "\nnot json\n" + json.dumps(rows[1]) + "\n" + json.dumps(rows[2]) + "\n")
    assert listing.prune(str(index), {("1", "/r/1")}) == 1
    assert index.read_text().splitlines() == [json.dumps(rows[0]), "not json", json.dumps(rows[2])]
    assert listing.alive("RUNNING") and listing.alive("PENDING") and not listing.alive("FAILED 7")


@pytest.mark.parametrize(("text", "expect"), [("30m", 1800), ("12h", 43200), ("3d", 3 * 86400), ("2w", 14 * 86400)])
def test_ages(text: str, expect: int) -> None:
    assert listing.parse_when(text, "--since", now=1e9) == 1e9 - expect


def test_dates_are_this_machines_time() -> None:
    assert listing.parse_when("2026-12-01T10:00", "--since") == time.mktime((2026, 12, 1, 10, 0, 0, 0, 0, -1))
    with pytest.raises(SpecError, match="--before '12/01' is not valid"):
        listing.parse_when("12/01", "--before")


# -- the local dry run's distributed variables ---------------------------------------------------------------

def test_local_dry_run_shows_what_each_rank_reads(tmp_path: Path) -> None:
    (tmp_path / "t.py").write_text("")
    r = run_cli("submit", "--dry-run", "--scheduler", "local", "--nodes", "2", "--tasks-per-node", "2", "t.py",
                env=_env(tmp_path), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    reads = [line for line in r.stdout.splitlines() if " reads: " in line]
    assert len(reads) == 4, r.stdout
    for rank, line in enumerate(reads):
        values = dict(word.split("=", 1) for word in shlex.split(line.split(" reads: ", 1)[1]))
        assert values["RANK"] == str(rank) and values["WORLD_SIZE"] == "4" and values["LOCAL_RANK"] == str(rank % 2)
        assert values["NODE_RANK"] == str(rank // 2) and values["MASTER_ADDR"] == "127.0.0.1"
        assert values["MASTER_PORT"] == "<a free port, when the job starts>" and values["OMP_NUM_THREADS"] == "1"
    r = run_cli("submit", "--dry-run", "--scheduler", "local", "--master-port", "2345", "t.py", env=_env(tmp_path),
                cwd=tmp_path)
    assert "MASTER_PORT=2345" in r.stdout, r.stdout


# -- the API's local jobs get the CLI's line ----------------------------------------------------------------------

def test_the_apis_local_job_says_what_it_does_not_enforce(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from slurmlaunch.app.api.executors import _executor
    from slurmlaunch.app.api.job_options import _spec
    from slurmlaunch.app.resolve import resolve

    monkeypatch.chdir(tmp_path)
    spec = resolve(_spec(sys.executable, {"partition": "gpu", "mem": "4G"}, module=True), has_script=False)
    _executor(spec, "local")
    err = capsys.readouterr().err
    assert "the local scheduler shows --mem 4G, --partition gpu to the tasks" in err and \
        "reserves and enforces nothing" in err, err
    _executor(resolve(_spec(sys.executable, {}, module=True), has_script=False), "local")
    assert "enforces nothing" not in capsys.readouterr().err


# -- on the real Slurm cluster ---------------------------------------------------------------------------------

ARGV_ONLY = """
with open("/proc/self/cmdline", "rb") as f:
    print("ARGV", [a.decode() for a in f.read().split(b"\\0")[:-1]], flush=True)
"""


@pytest.mark.slurm
@pytest.mark.parametrize("mode", ["srun", "torchrun"])
def test_on_slurm_the_help_form_reaches_sbatch_and_a_rank_shows_its_script(mode: str, cluster_env: dict[str, str],
                                                                           tmp_path: Path) -> None:
    """`--sbatch-arg --comment=...` as --help shows it reaches the real sbatch (scontrol reads the comment back);
    each rank's command line, as ps shows it, is its script and arguments behind the runner's short prefix."""
    import subprocess

    (tmp_path / "argv41.py").write_text(ARGV_ONLY)
    size = ["--nproc-per-node", "2"] if mode == "torchrun" else ["--tasks-per-node", "2"]
    r = run_cli("submit", "--mode", mode, "--nodes", "2", *size, "--sbatch-arg", "--comment=papercut41", "--wait",
                "--wait-timeout", "150", "argv41.py", "--lr", "0.5", env=cluster_env, cwd=tmp_path, timeout=200)
    assert r.returncode == 0, r.stdout + r.stderr
    job = r.stdout.split()[0]
    shown = subprocess.run(["scontrol", "show", "job", job], env=cluster_env, capture_output=True, text=True,
                           timeout=60).stdout
    assert "Comment=papercut41" in shown, shown
    text = "".join(p.read_text() for p in (tmp_path / "slurmlaunch-logs").glob(f"job-{job}.*.log"))
    argvs = [eval(line.split("ARGV ", 1)[1]) for line in text.splitlines() if "ARGV [" in line]  # noqa: S307
    assert len(argvs) == 4, text
    for argv in argvs:
        script = next(i for i, a in enumerate(argv) if a.endswith("argv41.py"))
        assert argv[script + 1:] == ["--lr", "0.5"] and "rank_runner.py" in argv[script - 1], argv
        assert all("def _slurmlaunch" not in a for a in argv), argv
