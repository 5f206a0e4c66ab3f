"""The local scheduler (the default without sbatch): real processes, real gloo, real signals."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests import ports
from tests.helpers import EXAMPLES, SLEEPER, alive, no_slurm_env, run_cli, teardown_abort_only, wait_for_files


def test_example_trains_on_two_emulated_nodes(torch_available: None, tmp_path: Path) -> None:
    # without --wait/--no-wait: in the foreground, every rank's output on the console, prefixed
    env = {**no_slurm_env(tmp_path), "XDG_STATE_HOME": str(tmp_path / "state")}  # auto's choice: said once per user
    r = run_cli("submit", "--nodes", "2", "--gpus-per-node", "2", str(EXAMPLES / "train_ddp.py"),
                "--epochs", "1", env=env, cwd=tmp_path, timeout=300)
    assert r.returncode == 0 or teardown_abort_only(r.stderr), r.stderr  # caught once in 4 runs of this file
    assert "auto chose local" in r.stderr and "run on the CPU" in r.stderr
    ranks = sorted(re.findall(r"\[rank (\d)\] rank=(\d) local_rank=(\d) node_rank=(\d) world_size=(\d)", r.stdout))
    assert ranks == [("0", "0", "0", "0", "4"), ("1", "1", "1", "0", "4"), ("2", "2", "0", "1", "4"),
                     ("3", "3", "1", "1", "4")]
    assert "[rank 0] done: world_size=4 sum_of_ranks=6" in r.stdout
    logs = sorted(p.name for p in (tmp_path / "slurmlaunch-logs").glob("*.rank-*.log"))
    assert len(logs) == 4 and all(re.fullmatch(r"job-\d+\.rank-\d\.log", n) for n in logs)
    assert (tmp_path / "checkpoint.pt").exists()


def test_first_failure_stops_the_rest(tmp_path: Path) -> None:
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    r = run_cli("submit", "--nodes", "2", "--tasks-per-node", "2", str(script), str(tmp_path), "2", "7",
                env=no_slurm_env(tmp_path), cwd=tmp_path, timeout=110)  # the others would sleep 120 s
    assert r.returncode == 7, r.stderr
    # stopped, not waited for: said so, and no rank left (a wall-clock bound here failed under load)
    assert "rank 2 failed first with exit code 7" in r.stderr and "the other ranks were stopped" in r.stderr, r.stderr
    pids = [int(p.read_text()) for p in tmp_path.glob("pid-*")]
    assert len(pids) == 4 and not any(alive(p) for p in pids)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_stops_every_rank(sig: int, tmp_path: Path) -> None:
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    p = subprocess.Popen([sys.executable, "-m", "slurmlaunch", "submit", "--nodes", "2", "--tasks-per-node", "2",
                          str(script), str(tmp_path), "-1", "0"], env=no_slurm_env(tmp_path), cwd=tmp_path,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    pid_files = wait_for_files(tmp_path, "pid-*", 4)
    p.send_signal(signal.SIGUSR1)  # forwarded, not fatal
    wait_for_files(tmp_path, "usr1-*", 4, timeout=20)
    p.send_signal(sig)
    p.communicate(timeout=60)
    assert p.returncode == 128 + sig
    assert not any(alive(int(f.read_text())) for f in pid_files)


def test_dry_run_local_shows_the_emulated_step(tmp_path: Path) -> None:
    r = run_cli("submit", "--scheduler", "local", "--dry-run", "--nodes", "2", "--tasks-per-node", "2",
                str(EXAMPLES / "train_ddp.py"), env=no_slurm_env(tmp_path), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    steps = [line for line in r.stdout.splitlines() if line.startswith("# rank ") and " reads: " not in line]
    reads = [line for line in r.stdout.splitlines() if line.startswith("# rank ") and " reads: " in line]
    assert len(steps) == len(reads) == 4 and "SLURM_STEP_NODELIST='127.0.0.[1-2]'" in r.stdout
    assert "RANK=3 " in reads[3] and "WORLD_SIZE=4 " in reads[3], reads
    assert not (tmp_path / "slurmlaunch-logs").exists()


def test_setup_lines_run_in_a_shell_but_arguments_do_not(tmp_path: Path) -> None:
    script = tmp_path / "show.py"
    script.write_text("import os, sys; print(repr(os.environ['FROM_SETUP']), repr(sys.argv[1:]), "
                      "repr(os.environ['HOSTILE']))")
    hostile = "$(touch PWNED) `x` 'q\"\n"
    r = run_cli("submit", "--setup", "export FROM_SETUP=$((20+22))", "--env", f"HOSTILE={hostile}",
                str(script), hostile, env=no_slurm_env(tmp_path), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert f"'42' {[hostile]!r} {hostile!r}" in r.stdout
    assert not list(tmp_path.rglob("PWNED"))


def test_logs_are_not_world_writable(tmp_path: Path) -> None:
    script = tmp_path / "ok.py"
    script.write_text("print('ok')")
    r = run_cli("submit", str(script), env=no_slurm_env(tmp_path), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    for f in (tmp_path / "slurmlaunch-logs").iterdir():
        assert f.stat().st_mode & 0o002 == 0, f


def test_a_local_jobs_master_port_is_free_here_not_derived_from_its_id(tmp_path: Path) -> None:
    """Local ids are unique per user and follow the clock: two users' jobs started in the same second had the
    same id, derived the same MASTER_PORT and joined each other's rendezvous (seen under pytest-xdist)."""
    from slurmlaunch.core.envvars import derive_port

    (tmp_path / "port.py").write_text("import os\n"
                                      "print('PORT', os.environ['MASTER_PORT'], os.environ['SLURM_JOB_ID'])\n")
    free = str(ports.port())  # a port nobody holds now: a fixed one would be every session's on this machine
    for given in ([], ["--master-port", free]):
        r = run_cli("submit", "--scheduler", "local", "--nodes", "2", *given, "port.py", env=no_slurm_env(tmp_path),
                    cwd=tmp_path, timeout=120)
        assert r.returncode == 0, r.stderr
        found = set(re.findall(r"PORT (\d+) (\d+)", r.stdout))
        assert len(found) == 1, r.stdout  # every rank, the same port
        port, job = found.pop()
        assert port == free if given else port != str(derive_port(int(job))), (port, job)


# A fresh venv holds torch and slurmlaunch, not NumPy (the test venv has it, for the client matrix): a package
# named numpy that cannot be imported puts the ranks where a new user's are.
NO_NUMPY = 'raise ModuleNotFoundError("No module named \'numpy\'", name="numpy")\n'
# What Python prints for a warning: "file:line: SomethingWarning: text" (warnings.formatwarning).
PY_WARNING = re.compile(r"^.*:\d+: \w*Warning: .*$", re.MULTILINE)


@pytest.mark.parametrize("numpy", ["absent", "installed"])
def test_readme_command_1_prints_no_warning_and_each_fact_once(torch_available: None, tmp_path: Path,
                                                               numpy: str) -> None:
    """README command 1 as a new user runs it (the local default, 2 emulated nodes x 4 ranks): no Python
    warning from anyone, and each thing slurmlaunch says said on one line, once."""
    env = no_slurm_env(tmp_path)
    if numpy == "absent":
        hide = tmp_path / "hide-numpy" / "numpy"
        hide.mkdir(parents=True)
        (hide / "__init__.py").write_text(NO_NUMPY)
        env["PYTHONPATH"] = str(hide.parent)
        sanity = subprocess.run([sys.executable, "-c", "import torch"], env=env, capture_output=True, text=True,
                                timeout=120)
        assert "Failed to initialize NumPy" in sanity.stderr, sanity.stderr  # else this run proves nothing
    r = run_cli("submit", "--nodes", "2", "--gpus-per-node", "4", "--wait", str(EXAMPLES / "train_ddp.py"),
                env=env, cwd=tmp_path, timeout=600)
    assert r.returncode == 0 or teardown_abort_only(r.stderr), r.stderr
    # --wait on the local default: detached and followed as a queued job is (rank 0's output, unprefixed)
    assert "\ndone: world_size=8 sum_of_ranks=28\n" in r.stdout and "[rank" not in r.stdout, r.stdout
    assert "run on the CPU" in r.stderr and "ended COMPLETED, exit code 0" in r.stderr, r.stderr
    out = r.stdout + r.stderr
    assert PY_WARNING.findall(out) == [], out
    ours = [line for line in out.splitlines() if re.match(r"(\[rank \d\] )?slurmlaunch: ", line)]
    assert len(ours) == len(set(ours)) >= 3, ours
    assert "rank(s)" not in out and "node(s)" not in out and "the example" not in out, ours
