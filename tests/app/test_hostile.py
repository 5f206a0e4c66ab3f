"""Hostile input: every rejection is one line and exit code 2, in bounded memory; never a traceback.

Three kinds of test: the cases of issue 13 (items 10-14) as real processes, some under `ulimit -v`; a walk
over the parsers' option tables (every option with a valid value plus a trailing newline), so that a new
option is covered without anyone remembering to; and a fuzz of hostile values over every option, in process.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import resource
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurmlaunch import cli
from slurmlaunch.app import options
from slurmlaunch.core import limits
from slurmlaunch.core.detect import Context, detect
from slurmlaunch.core.errors import EnvironmentMappingError, SpecError
from slurmlaunch.core.spec import JobSpec, parse_array, parse_nodes, validate
from tests.helpers import ROOT, no_slurm_env, step_env

MEMORY_LIMIT = 100 * 2**20  # the bound for any rejected input: ~100 MB of address space


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def run(args: list[str | bytes], cwd: Path, env: dict[str, str], memory_limit: bool = False,
        stdout: int | None = subprocess.PIPE, timeout: float = 60) -> subprocess.CompletedProcess[bytes]:
    """slurmlaunch in its own process (optionally under RLIMIT_AS, like `ulimit -v`)."""
    return subprocess.run([sys.executable, "-m", "slurmlaunch", *args], cwd=cwd, env=env, stdout=stdout,
                          stderr=subprocess.PIPE, timeout=timeout, preexec_fn=_limit_memory if memory_limit else None)


def one_line_exit_2(r: subprocess.CompletedProcess[bytes], *expect: str) -> str:
    err = r.stderr.decode(errors="replace")
    assert r.returncode == 2, (r.returncode, err[-3000:])
    assert "Traceback" not in err and err.endswith("\n") and err.count("\n") == 1, err[-3000:]
    for text in expect:
        assert text in err, err
    return err


@pytest.fixture
def work(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A working directory with t.py, an environment without Slurm, and a fake sbatch (dry runs only)."""
    (tmp_path / "t.py").write_text("print('ran')\n")
    env = no_slurm_env(tmp_path)
    fake = tmp_path / "fakebin"
    fake.mkdir()
    (fake / "sbatch").write_text("#!/bin/sh\nexit 99\n")
    (fake / "sbatch").chmod(0o755)
    env["PATH"] = f"{fake}:{env['PATH']}"
    return tmp_path, env


# --- item 10: counts are bounded before anything is built; memory stays small -------------------------

HUGE = [
    (["--array", "0-999999999"], "--array '0-999999999'"),
    (["--array", "0-3999999"], "more than 10000 elements"),
    (["--array", "0-4000001"], "MaxArraySize"),
    (["--array", "0-9999,0-9999:2"], "more than 10000 elements"),
    (["--nodes", "99999999999999999999"], "--nodes 99999999999999999999"),
    (["--nodes", "1:99999999999999999999"], "--nodes '1:99999999999999999999'"),
    (["--nodes", "100001"], "1..100000"),
    (["--tasks-per-node", "100000000"], "--tasks-per-node 100000000"),
    (["--gpus-per-node", "65534"], "0..65533"),
    (["--mode", "torchrun", "--nproc-per-node", "100000000"], "--nproc-per-node 100000000"),
    (["--nodes", "100000", "--tasks-per-node", "65533"], "32-bit"),
    (["--sweep", "a=" + ",".join(map(str, range(101))), "--sweep", "b=" + ",".join(map(str, range(100)))],
     "more than 10000 points"),
    (["--max-parallel", "9" * 30], "--max-parallel"),
    (["--max-requeues", "9" * 5000], "(5000 characters)"),
    (["--time", "9" * 30], "longer than Slurm can keep"),
    (["--mem", "9" * 30 + "T"], "more than any node has"),
    (["--signal", "USR2@" + "9" * 5000], "--signal"),
]


@pytest.mark.parametrize("scheduler", ["local", "slurm"])
@pytest.mark.parametrize(("args", "expect"), HUGE, ids=[" ".join(a)[:40] for a, _ in HUGE])
def test_huge_counts_one_line_in_bounded_memory(args: list[str], expect: str, scheduler: str,
                                                work: tuple[Path, dict[str, str]]) -> None:
    cwd, env = work
    r = run(["submit", "--dry-run", "--scheduler", scheduler, *args, "t.py"], cwd, env, memory_limit=True)
    one_line_exit_2(r, expect)


def test_local_scheduler_bounds_ranks_over_all_elements(work: tuple[Path, dict[str, str]]) -> None:
    """What Slurm may accept (many nodes), the local scheduler would build on this machine: its own bound."""
    cwd, env = work
    for args in (["--nodes", "1000", "--tasks-per-node", "1000"], ["--nodes", "2", "--array", "0-9999"],
                 ["--nodes", "100000", "--tasks-per-node", "21474"]):
        r = run(["submit", "--dry-run", "--scheduler", "local", *args, "t.py"], cwd, env, memory_limit=True)
        one_line_exit_2(r, "more than the local scheduler runs on one machine")
        r = run(["submit", "--dry-run", "--scheduler", "slurm", *args, "t.py"], cwd, env, memory_limit=True)
        assert r.returncode == 0, r.stderr.decode()


def test_run_nproc_huge_is_refused_before_any_process(work: tuple[Path, dict[str, str]]) -> None:
    cwd, env = work
    one_line_exit_2(run(["run", "--nproc-per-node", "100000000", "t.py"], cwd, env, memory_limit=True),
                    "--nproc-per-node '100000000'", "1..65533")
    one_line_exit_2(run(["run", "--nnodes", "9" * 5000, "t.py"], cwd, env, memory_limit=True), "--nnodes")


def test_the_largest_accepted_values_render_in_bounded_memory(work: tuple[Path, dict[str, str]]) -> None:
    """The bounds are usable, and using them costs no memory either: it is the bound, not luck, that helps."""
    cwd, env = work
    r = run(["submit", "--dry-run", "--scheduler", "slurm", "--nodes", "100000", "--tasks-per-node", "21474",
             "--array", "3990001-4000000", "--max-parallel", "10000", "t.py"], cwd, env, memory_limit=True)
    assert r.returncode == 0, r.stderr.decode()
    assert b"#SBATCH --array=3990001-4000000%10000" in r.stdout
    r = run(["submit", "--dry-run", "--scheduler", "local", "--array", "0-3999:4", "t.py"], cwd, env,
            memory_limit=True)
    assert r.returncode == 0 and r.stdout.count(b"# array element") == 1000, r.stderr.decode()[-2000:]


def test_bounds_are_checked_for_the_python_api_too(tmp_path: Path) -> None:
    (tmp_path / "t.py").write_text("")
    for kw, expect in [({"nodes": 10**20}, "--nodes 100000000000000000000"),
                       ({"tasks_per_node": 10**5000}, "an integer of 16610 bits"),
                       ({"array": "0-" + "9" * 5000}, "--array '0-999"),
                       ({"rdzv_timeout": float("inf")}, "--rdzv-timeout inf"),
                       ({"max_restarts": 10**9, "mode": "torchrun"}, "--max-restarts")]:
        with pytest.raises(SpecError, match=expect.replace("(", r"\(").replace(".", r"\.")):
            validate(JobSpec.of(script="t.py", workdir=str(tmp_path), **kw))
    assert parse_nodes(100000) == (100000, None) and parse_array("3,1-2") == [1, 2, 3]


# --- item 11: integers of thousands of digits in variables and job ids -----------------------------------

def _slurm_step(**extra: str) -> dict[str, str]:
    env = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_NTASKS": "1",
           "SLURM_STEP_NODELIST": "n1", "SLURM_STEP_NUM_NODES": "1", "SLURM_STEP_TASKS_PER_NODE": "1",
           "SLURM_NODEID": "0", "SLURM_LOCALID": "0", "SLURMD_NODENAME": "n1"}
    env.update(extra)
    return env


@pytest.mark.parametrize("name,value", [
    ("SLURM_JOB_ID", "9" * 5000), ("SLURM_STEP_ID", "9" * 5000), ("SLURM_PROCID", "1" * 4301),
    ("SLURM_STEP_TASKS_PER_NODE", "1" * 5000), ("SLURM_STEP_TASKS_PER_NODE", "1(x" + "1" * 5000 + ")"),
    ("SLURM_NTASKS", "²"), ("SLURM_JOB_ID", "4294967296"), ("SLURM_CPUS_PER_TASK", "abc"),
    ("SLURM_CPUS_PER_TASK", "9" * 5000), ("SLURM_NODEID", "٣"),
])
def test_garbage_slurm_numbers_are_one_error_naming_the_variable(name: str, value: str) -> None:
    env = _slurm_step(**{name: value})
    if name == "SLURM_NTASKS":
        env.pop("SLURM_STEP_NUM_TASKS", None)
    with pytest.raises(EnvironmentMappingError) as e:
        detect(env, Context(hostname="n1"))
    assert len(str(e.value)) < 400 and "\n" not in str(e.value)


def test_cpus_per_task_is_used_when_it_is_a_number() -> None:
    assert detect(_slurm_step(SLURM_CPUS_PER_TASK="6"), Context(hostname="n1")).omp_num_threads == 6
    assert detect(_slurm_step(SLURM_CPUS_PER_TASK="0"), Context(hostname="n1")).omp_num_threads is None


@pytest.mark.parametrize("env_extra,expect", [
    ({"SLURM_JOB_ID": "abc"}, "SLURM_JOB_ID='abc'"),
    ({"SLURM_JOB_ID": "9" * 5000}, "(5000 characters)"),
    ({"SLURM_JOBID": "²"}, "SLURM_JOBID='²'"),
])
def test_torchrun_node_job_id(env_extra: dict[str, str], expect: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "MASTER_"))}
    env.update(SLURM_STEP_NODELIST="n1", **env_extra)
    one_line_exit_2(run(["torchrun-node", "--nproc-per-node", "1", "--no-python", "true"], tmp_path, env), expect)


@pytest.mark.parametrize(("name", "value"), [("SLURM_STEP_ID", "9" * 5000), ("SLURM_CPUS_PER_TASK", "²")])
def test_torchrun_node_other_numbers_are_one_short_line(name: str, value: str) -> None:
    """Read through the launcher's parsers (core.envvars): refused, not ignored, and the line stays short."""
    from slurmlaunch.allocation.torchrun_mode import torchrun_command
    from slurmlaunch.core.errors import EnvironmentMappingError

    env = dict(step_env("n1", [1], 0, job=7), **{name: value})
    with pytest.raises(EnvironmentMappingError) as e:
        torchrun_command(env, {"nproc-per-node": "2"}, [], ["t.py"], "python")
    assert str(e.value).startswith(f"{name}=") and "\n" not in str(e.value) and len(str(e.value)) < 300


def test_status_of_an_element_with_thousands_of_digits(work: tuple[Path, dict[str, str]]) -> None:
    cwd, env = work
    env["XDG_STATE_HOME"] = str(cwd / "state")
    r = run(["submit", "--scheduler", "local", "--array", "0-1", "--no-python", "true"], cwd, env)
    assert r.returncode == 0, r.stderr.decode()
    job = json.loads(run(["list", "--json"], cwd, env).stdout)[-1]["job_id"]
    one_line_exit_2(run(["status", f"{job}_" + "7" * 5000], cwd, env), "array element")
    one_line_exit_2(run(["status", f"{job}_5"], cwd, env), "has no array element 5")


# --- item 12: a trailing newline, walked over every option of the parsers ------------------------------

def _submit_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    options.add_submit_options(p)
    return p


# A valid value for each submit option that takes one, and what it needs beside it. A new option makes
# test_every_option_is_walked fail until it is added here: that is the point.
SUBMIT_VALID: dict[str, tuple[str, list[str]]] = {
    "profile": ("p", []), "nodes": ("2", []), "gpus_per_node": ("2", []), "tasks_per_node": ("2", []),
    "cpus_per_task": ("2", []), "cpus_per_gpu": ("2", ["--gpus-per-node", "1"]), "mem": ("4G", []),
    "time": ("10", []), "partition": ("gpu", []), "account": ("acct", []), "qos": ("high", []),
    "constraint": ("a100", []), "gpu_flag": ("gres", []), "job_name": ("name", []), "output_dir": ("logs", []),
    "env": ("A=1", []), "setup": ("module load x", []), "sbatch_arg": ("--mail-type=END", []),
    "master_port": ("12345", []), "signal": ("USR1@60", []), "max_requeues": ("2", ["--requeue"]),
    "rdzv_timeout": ("30", []), "python": (sys.executable, []), "template_dir": ("tpl", []),
    "scheduler": ("slurm", []), "pbs_flavour": ("torque", []), "mpi": ("mpich", []), "mode": ("torchrun", []),
    "nproc_per_node": ("2", ["--mode", "torchrun"]), "max_restarts": ("1", ["--mode", "torchrun"]),
    "container_image": ("img", []), "apptainer": ("img.sif", []),
    "container_mount": ("/a:/b", ["--apptainer", "i.sif"]), "container_workdir": ("/w", ["--apptainer", "i.sif"]),
    "array": ("0-3", []), "sweep": ("lr=1,2", []), "max_parallel": ("2", ["--array", "0-3"]),
    "wait_timeout": ("5", []), "stage_env": ("on", []),
    "pbs_resource": ("filesystems=home", []), "pbs_chunk": ("system=polaris", []), "project": ("proj", []),
    "pbs_request": ("totals", []), "pbs_queues": ("debug:1-2", []), "mpiexec_arg": ("--no-transfer", []),
    # an absolute remote directory: the dry run needs no ssh
    "remote": ("login:/abs", []), "remote_setup": ("module load x", ["--remote", "login:/abs"]),
    "remote_exclude": ("*.tmp", ["--remote", "login:/abs"]), "sync_limit": ("10M", ["--remote", "login:/abs"]),
}
PBS_ONLY = {"pbs_flavour", "mpi", "pbs_resource", "pbs_chunk", "project", "pbs_request", "pbs_queues", "mpiexec_arg"}
# Values kept byte for byte by design (README: Strings are data): a newline there is data.
BYTE_FOR_BYTE = {"env", "setup", "sweep", "job_name", "remote_setup"}


def value_options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.option_strings and a.nargs != 0]


@contextlib.contextmanager
def in_process(cwd: Path, env: dict[str, str]) -> Iterator[None]:
    old_env, old_cwd = dict(os.environ), os.getcwd()
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    try:
        yield
    finally:
        os.chdir(old_cwd)
        os.environ.clear()
        os.environ.update(old_env)


def call(args: list[str]) -> tuple[int, str, str]:
    """cli.main in this process: (exit code, stdout, stderr); any exception but SystemExit(0/2) escapes."""
    raw = io.BytesIO()
    out, err = io.TextIOWrapper(raw, encoding="utf-8", errors="surrogateescape"), io.StringIO()  # has .buffer
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(args)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
    out.flush()
    return code, raw.getvalue().decode(errors="replace"), err.getvalue()


def assert_refused_or_ok(code: int, err: str, what: object, also: tuple[int, ...] = ()) -> None:
    assert code in (0, 2, *also), (what, code, err[-2000:])
    if code == 2:
        assert err.count("\n") == 1 and err.endswith("\n") and "Traceback" not in err, (what, err[-2000:])


@pytest.fixture
def project(work: tuple[Path, dict[str, str]]) -> tuple[Path, dict[str, str]]:
    cwd, env = work
    (cwd / "slurmlaunch.toml").write_text("[profiles.p]\n")
    (cwd / "tpl").mkdir()
    return cwd, env


def test_every_option_is_walked() -> None:
    missing = {a.dest for a in value_options(_submit_parser())} - set(SUBMIT_VALID)
    assert not missing, f"add a valid example for {sorted(missing)} to SUBMIT_VALID"


# Control characters (issue 33.2): a newline, other C0 ones, DEL, a terminal's ESC sequence, a C1 one; after
# the value, and inside it. NUL cannot be in argv: the API's table below has it.
CONTROLS = [("{}\n", "\n"), ("{}\x01", "\x01"), ("{}\t", "\t"), ("\x7f{}", "\x7f"), ("{}\x1b[31m", "\x1b"),
            ("{}\x1b", "\x1b"), ("{}\r", "\r"), ("{}\x85", "\x85")]


def test_control_characters_on_every_submit_option(project: tuple[Path, dict[str, str]]) -> None:
    """Every option x every control character: refused in one line naming the value, unless the option is
    data (README: Strings are data), where the value is kept and the script still parses."""
    cwd, env = project
    base = ["submit", "--dry-run", "--scheduler", "slurm"]
    with in_process(cwd, env):
        for action in value_options(_submit_parser()):
            flag = next(o for o in action.option_strings if o.startswith("--"))
            value, companions = SUBMIT_VALID[action.dest]
            if flag == "--scheduler":
                companions = []
                base_here = ["submit", "--dry-run"]
            elif action.dest in PBS_ONLY:  # PBS's own options: Slurm refuses them (schedulers/slurm.py REFUSALS)
                base_here = ["submit", "--dry-run", "--scheduler", "pbs"]
            else:
                base_here = base
            code, good, err = call([*base_here, *companions, f"{flag}={value}", "t.py"])
            assert code == 0, (flag, value, err)  # the control: the value without the character is valid
            for form, char in CONTROLS:
                # a data option's control characters go after its value (env's key is a name, not data)
                bad = value + form.format("") if action.dest in BYTE_FOR_BYTE else form.format(value)
                code, out, err = call([*base_here, *companions, f"{flag}={bad}", "t.py"])
                if action.dest in BYTE_FOR_BYTE:
                    assert code == 0, (flag, err)
                    # data, not a line of the script: the #SBATCH header is unchanged and bash parses the script
                    header = [ln for ln in out.splitlines() if ln.startswith("#SBATCH")]
                    assert header == [ln for ln in good.splitlines() if ln.startswith("#SBATCH")], flag
                    (cwd / "s.sh").write_text(out)
                    assert subprocess.run(["bash", "-n", str(cwd / "s.sh")]).returncode == 0, (flag, out)
                else:
                    assert code == 2 and err.count("\n") == 1, (flag, bad, code, err)
                    # it names the value (shown with its escapes) or, for a choice, argparse names the option
                    assert repr(bad)[1:-1] in err or "invalid choice" in err, (flag, bad, err)
                    assert char not in err[:-1], (flag, bad, err)  # the character itself never reaches the terminal


# The API's job options that are not data, each with a valid value (keyword arguments of slurmlaunch.submit).
API_NAMES = {"partition": "gpu", "account": "acct", "qos": "high", "constraint": "a100", "mem": "4G", "time": "10",
             "output_dir": "logs", "signal": "USR1@60", "requeued_by": "script", "gpu_flag": "gres",
             "sbatch_args": ("--mail-type=END",), "pbs_resources": ("wd",), "pbs_chunk": ("system=x",),
             "project": "proj", "pbs_queues": "debug:1-2", "mpiexec_args": ("--no-transfer",),
             "pbs_flavour": "torque", "mpi": "mpich", "pbs_request": "totals", "stage_env": "on"}


@pytest.mark.parametrize("char", ["\x00", "\x01", "\n", "\x1b", "\x7f", "\x9b"])
def test_control_characters_in_the_apis_options(char: str, work: tuple[Path, dict[str, str]]) -> None:
    """The API's same options: SpecError naming the option and the value, before anything is submitted."""
    import slurmlaunch

    assert set(API_NAMES) | {"python", "container_image", "apptainer", "container_workdir", "container_mounts", "mode",
                             "array"} >= set(slurmlaunch_spec_names()), "a new option that is a name: add it here"
    cwd, env = work
    with in_process(cwd, env):
        for name, value in API_NAMES.items():
            bad = (value[0] + char,) if isinstance(value, tuple) else value + char
            with pytest.raises(slurmlaunch.SpecError) as e:
                slurmlaunch.submit(print, scheduler="local", **{name: bad})
            message = str(e.value)
            assert "control character" in message and "\n" not in message and char not in message, (name, message)


def slurmlaunch_spec_names() -> list[str]:
    from slurmlaunch.core.spec import _NAME_OPTIONS

    return list(_NAME_OPTIONS)


RUN_VALID: dict[str, tuple[str, list[str]]] = {
    "nnodes": ("1", []), "node_rank": ("0", []), "master_addr": ("127.0.0.1", []),
    "master_port": ("0", []), "rdzv_endpoint": ("127.0.0.1:0", []), "nproc": ("1", []),
    "master_timeout": ("5", []), "log_dir": ("rl", []), "shutdown_timeout": ("5", []), "rdzv_id": ("job-1", []),
}
# --rdzv-backend/--monitor-interval/--start-method: accepted for torchrun compatibility, never used;
# refused: torchrun's flags that `run` refuses whatever the value (tests/app/test_everyday.py walks them)
RUN_IGNORED = {"ignored", "refused"}


def test_trailing_newline_on_every_run_option(work: tuple[Path, dict[str, str]]) -> None:
    from slurmlaunch.app.run import add_run_options
    from tests.ports import port as free_port

    cwd, env = work
    parser = argparse.ArgumentParser(add_help=False)
    add_run_options(parser, {})
    dests = {a.dest for a in value_options(parser)}
    assert not dests - set(RUN_VALID) - RUN_IGNORED, f"add a valid example for {dests - set(RUN_VALID)}"
    with in_process(cwd, env):
        for action in value_options(parser):
            if action.dest in RUN_IGNORED:
                continue
            flag = next(o for o in action.option_strings if o.startswith("--"))
            value, companions = RUN_VALID[action.dest]
            port = str(free_port())
            value = value.replace(":0", ":" + port) if action.dest == "rdzv_endpoint" else \
                port if action.dest == "master_port" else value
            code, _, err = call(["run", *companions, f"{flag}={value}", "--no-python", "true"])
            assert code == 0, (flag, value, err)
            code, _, err = call(["run", *companions, f"{flag}={value}\n", "--no-python", "true"])
            assert code == 2 and err.count("\n") == 1 and flag.split("-")[-1] in err, (flag, code, err)


# --- item 13: tracebacks that become one line ---------------------------------------------------------

def test_output_dir_that_cannot_be_a_directory(work: tuple[Path, dict[str, str]]) -> None:
    cwd, env = work
    for scheduler in ("local", "slurm"):
        for dry in (["--dry-run"], []):
            if scheduler == "slurm" and not dry:
                continue  # the fake sbatch would refuse anyway; the check comes before it
            for out_dir, expect in [("t.py", "is a file"), ("t.py/logs", "which is not a directory")]:
                r = run(["submit", "--scheduler", scheduler, *dry, "-o", out_dir, "t.py"], cwd, env)
                one_line_exit_2(r, f"--output-dir '{out_dir}'", expect)
    r = run(["submit", "--scheduler", "local", "-o", "/proc/slurmlaunch-logs", "t.py"], cwd, env)
    one_line_exit_2(r, "/proc/slurmlaunch-logs")


def test_output_dir_on_a_read_only_filesystem(work: tuple[Path, dict[str, str]]) -> None:
    """A real read-only mount (a tmpfs remounted ro in a private mount namespace; needs root)."""
    cwd, env = work
    unshare, mount, sh = shutil.which("unshare"), shutil.which("mount"), shutil.which("sh")
    if os.geteuid() != 0 or not (unshare and mount and sh):
        pytest.skip("needs root, unshare and mount for a private read-only mount")
    ro = cwd / "ro"
    ro.mkdir()
    inner = (f"{mount} -t tmpfs -o ro none {ro} && exec {sys.executable} -m slurmlaunch submit --scheduler local "
             f"-o {ro}/logs t.py")
    r = subprocess.run([unshare, "--mount", "--propagation", "private", sh, "-c", inner], cwd=cwd, env=env,
                       capture_output=True, timeout=60)
    if r.returncode != 2 and b"slurmlaunch" not in r.stderr:
        pytest.skip(f"no private mount here: {r.stderr.decode(errors='replace')[-300:]}")
    one_line_exit_2(r, "Read-only file system", f"{ro}/logs")


def test_reader_gone_and_disk_full(work: tuple[Path, dict[str, str]]) -> None:
    cwd, env = work
    for expr in ("n[1-60000]", "n[1-3]"):
        p = subprocess.Popen([sys.executable, "-m", "slurmlaunch", "hostnames", expr], cwd=cwd, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert p.stdout is not None and p.stderr is not None
        p.stdout.read(3)
        p.stdout.close()  # `| head -c 3`
        err = p.stderr.read()
        assert p.wait(timeout=60) in (0, 141) and err == b"", err.decode()
    with open("/dev/full", "wb") as full:
        for expr in ("n[1-60000]", "n[1-3]"):
            r = run(["hostnames", expr], cwd, env, stdout=full.fileno())
            one_line_exit_2(r, "No space left on device")
        r = run(["submit", "--dry-run", "--scheduler", "local", "t.py"], cwd, env, stdout=full.fileno())
        one_line_exit_2(r, "No space left on device")


@pytest.mark.parametrize("template,expect", [
    ("{{ 1/0 }}", "line 1 failed: ZeroDivisionError"),
    ("ok\n{{ nothing_here }}", "line 2: 'nothing_here' is undefined"),
    ('{% include "/etc/passwd" %}', "it includes '/etc/passwd', which is not found"),
    ("{% if %}", "line 1"),
    (b"\xff\xfe not utf-8 {{ 1 }}", "is not UTF-8 text (byte 0xff at offset 0)"),
])
def test_user_template_failures_name_the_template(template: str | bytes, expect: str,
                                                  work: tuple[Path, dict[str, str]]) -> None:
    cwd, env = work
    tpl = cwd / "tpl"
    tpl.mkdir()
    path = tpl / "slurm.sbatch.j2"
    path.write_bytes(template if isinstance(template, bytes) else template.encode())
    r = run(["submit", "--dry-run", "--scheduler", "slurm", "--template-dir", str(tpl), "t.py"], cwd, env)
    one_line_exit_2(r, expect, "slurm.sbatch.j2")


@pytest.mark.parametrize("toml,expect", [
    (b"profiles = 5\n", "profiles = 5 is not valid (expected [profiles.NAME] tables)"),
    (b'defaults = "x"\n', "defaults = 'x' is not valid (expected a [defaults] table"),
    (b"[profiles]\np = 3\n", "profiles.p is not a table"),
    (b"\xff[defaults]\n", "is not UTF-8 text (byte 0xff at offset 0"),
    (b'profile = "p"\n[profiles.p]\nenv = { "A B" = "x" }\n', "[profiles.p]: env key 'A B' is not valid"),
    (b'[defaults]\nenv = ["A\\n=x"]\n', "[defaults]: env key 'A\\n' is not valid"),
    (b"[defaults]\nnodes = 99999999999999999\n", "[defaults]: nodes = 99999999999999999 is not valid"),
    (b"[defaults]\ngpus-per-node = 70000\n", "gpus-per-node = 70000 is not valid (expected an integer 0..65533)"),
    (b"[defaults]\nrdzv-timeout = nan\n", "rdzv-timeout = nan is not valid"),
    (b"[defaults]\ntime = \"10\\n\"\n", "--time '10\\n'"),
    (b"[defaults]\nmax-requeues = " + b"9" * 5000 + b"\n", "is not valid TOML"),
])
def test_config_file_failures_name_the_file(toml: bytes, expect: str, work: tuple[Path, dict[str, str]]) -> None:
    cwd, env = work
    (cwd / "slurmlaunch.toml").write_bytes(toml)
    r = run(["submit", "--dry-run", "--scheduler", "local", "t.py"], cwd, env)
    err = one_line_exit_2(r, expect)
    if b"--nodes" not in expect.encode() and b"--time" not in expect.encode():
        assert "slurmlaunch.toml" in err


# --- item 14: messages that say what is wrong ----------------------------------------------------------

def test_a_directory_as_script(work: tuple[Path, dict[str, str]]) -> None:
    cwd, env = work
    (cwd / "pkg").mkdir()
    one_line_exit_2(run(["submit", "--dry-run", "--scheduler", "local", "pkg"], cwd, env), "'pkg' is a directory")
    one_line_exit_2(run(["run", "pkg"], cwd, env), "'pkg' is a directory")


def test_pet_variables_that_are_not_numbers(work: tuple[Path, dict[str, str]]) -> None:
    cwd, env = work
    for name, flag in (("PET_NODE_RANK", "--node-rank"), ("PET_MASTER_PORT", "--master-port")):
        one_line_exit_2(run(["run", "t.py"], cwd, dict(env, **{name: "abc"})), f"{flag} (from {name}) 'abc'")


# --- the fuzz: hostile values over every option of every command --------------------------------------

HOSTILE = ["", " ", "\t", "\x1b[2J", "\x7f", "\u202e", "\x01x", "-1", "0", "00000000000000000000001",
           "99999999999999999999", "9" * 5000, "²", "٣", "1_000", "1e9", "nan", "inf", "-inf", "0x10",
           "\udcff\udcfe", "caf\udce9", "../../../../etc/passwd", "/proc/self/mem", "/dev/full", "-", "--",
           "%n%s%x", "{{ 7*7 }}", "$(touch pwned)", "`touch pwned`", "a" * 20000, "1-2\r", "1,2,,3",
           "0-0:0", "4294967296", "-0", "+5", " 5", "5 "]


def _commands() -> list[tuple[list[str], argparse.ArgumentParser]]:
    top = cli._parser()
    sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    out = []
    for name, parser in sub.choices.items():
        if name in ("launch", "torchrun-node", "dev-cluster"):
            continue  # in-allocation fast paths (their variables are covered above); dev-cluster starts daemons
        prefix = {"submit": ["submit", "--dry-run", "--scheduler", "local"],
                  "doctor": ["doctor"], "run": ["run"]}.get(name, [name])
        out.append((prefix, parser))
    return out


def _tail(name: str) -> list[str]:
    return {"submit": ["t.py"], "run": ["--no-python", "true"], "hostnames": ["n1"],
            "status": ["1"], "logs": ["1"], "cancel": ["1"], "config": ["show"], "completion": ["bash"]}.get(name, [])


def test_fuzz_every_option_with_hostile_values(project: tuple[Path, dict[str, str]]) -> None:
    """exit 0 or 2, one line on 2, never an exception; the values reach nothing that runs (dry runs, a run of
    `true`, doctor without a Slurm controller, --remote through an ssh that connects nowhere)."""
    cwd, env = project
    # No fake sbatch. An ssh that connects nowhere: doctor --remote gave the real one "0x10" and "000...01",
    # which are addresses (0.0.0.16, 0.0.0.1), and each waited out ConnectTimeout (20 s) off this machine.
    # Its configuration is still the real client's (-G connects nothing); a connection fails at once, as an
    # unreachable host's does.
    fake = cwd / "ssh-nowhere"
    fake.mkdir()
    (fake / "ssh").write_text('#!/bin/sh\nfor a; do [ "$a" = -G ] && exec /usr/bin/ssh "$@"; done\n'
                              'echo "ssh: connect to host port 22: Network is unreachable" >&2\nexit 255\n')
    (fake / "ssh").chmod(0o755)
    env = dict(env, PATH=f"{fake}:{Path(sys.executable).parent}:/usr/bin:/bin")
    env.pop("SLURM_CONF", None)
    seen = 0
    with in_process(cwd, env):
        for prefix, parser in _commands():
            name = prefix[0]
            for action in value_options(parser):
                if action.dest in ("help", "allocate"):  # --allocate would submit a probe job
                    continue
                flag = next((o for o in action.option_strings if o.startswith("--")), action.option_strings[0])
                for value in HOSTILE:
                    args = [*prefix, f"{flag}={value}", *_tail(name)]
                    code, _, err = call(args)
                    # doctor's own exit code 1 is its verdict: "this site has problems" (here: no Slurm)
                    assert_refused_or_ok(code, err, [*prefix, flag, value[:100]], (1,) if name == "doctor" else ())
                    seen += 1
            for value in HOSTILE:  # the positional arguments too
                args = [*prefix, *_tail(name)[:-1], value] if _tail(name) else [*prefix, value]
                code, _, err = call(args)
                if name == "run" and "failed first with exit code" in err:
                    continue  # the value was started as a program (/proc/self/mem...): its failure is its own
                assert_refused_or_ok(code, err, (name, value[:100]), (1,) if name == "doctor" else ())
    assert seen > 1000 and not (cwd / "pwned").exists()


def test_non_utf8_bytes_in_argv(work: tuple[Path, dict[str, str]]) -> None:
    """Real bytes that are not UTF-8 (Python gives them to us as surrogate escapes)."""
    cwd, env = work
    for args in ([b"hostnames", b"n\xff[1-2]"], [b"submit", b"--dry-run", b"--scheduler", b"local", b"-J",
                                                 b"j\xe9", b"t.py"],
                 [b"submit", b"--dry-run", b"--scheduler", b"local", b"--env", b"A=\xff", b"t.py"],
                 [b"submit", b"--dry-run", b"--scheduler", b"local", b"--nodes", b"\xff", b"t.py"],
                 [b"status", b"\xff"], [b"run", b"\xff.py"]):
        r = run(list(args), cwd, env, memory_limit=True)
        assert r.returncode in (0, 2) and b"Traceback" not in r.stderr, (args, r.stderr.decode(errors="replace"))
        if r.returncode == 2:
            assert r.stderr.count(b"\n") == 1, r.stderr


def test_limits_parser_never_converts_more_digits_than_the_bound() -> None:
    assert limits.bounded_int("9" * 100_000, 10) is None  # int() of that would raise past 4300 digits
    assert limits.bounded_int("0" * 100 + "10", 10) == 10 and limits.bounded_int("11", 10) is None
    assert limits.bounded_int("²", 10) is None and limits.bounded_int("٣", 10) is None
    assert limits.shown("x" * 1000).endswith("(1000 characters)")
    assert ROOT.is_dir()
