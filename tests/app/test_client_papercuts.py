"""Issue 15 items 4-6: --legacy-local-rank-arg through submit, whole lines from torchrun's workers, and the
OMP_NUM_THREADS rule; plus the prepared GPU check's CPU-only mode."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from slurmlaunch.allocation.torchrun_mode import RELAY, first_node_note, parse, torchrun_command
from slurmlaunch.allocation.torchrun_worker import AS_WORKER
from slurmlaunch.core.distenv import DistEnv
from slurmlaunch.core.spec import JobSpec, validate
from slurmlaunch.render.launch import launch_command
from tests.helpers import clean_env, no_slurm_env, run_cli, step_env

ROOT = Path(__file__).resolve().parents[2]

# A torch.distributed.launch-era script: its local rank comes only as an argument, under either spelling
# (torch < 2.0 passed --local_rank, later ones --local-rank); it prints what it got and what torch set.
LEGACY = """
import argparse, os
p = argparse.ArgumentParser()
p.add_argument("--local-rank", "--local_rank", dest="local_rank", type=int, required=True)
p.add_argument("--lr", type=float)
a = p.parse_args()
print(f"legacy arg={a.local_rank} LOCAL_RANK={os.environ['LOCAL_RANK']} RANK={os.environ['RANK']} lr={a.lr} "
      f"OMP={os.environ.get('OMP_NUM_THREADS', 'unset')}", flush=True)
"""
_LEGACY_LINE = re.compile(r"legacy arg=(\d+) LOCAL_RANK=(\d+) RANK=(\d+) lr=0.5 OMP=(\w+)")

# Two workers of one node printing long lines as print() does them: one write() per argument and one for the
# newline (python -u), stdout and stderr, with no pause in between.
CHATTY = """
import os, sys
lr = os.environ["LOCAL_RANK"]
for i in range(1500):
    print(f"[GPU{lr}]", "Epoch", f"{i:05d}", ("ab" if lr == "0" else "cd") * 200, "Steps:", 16)
    if i % 10 == 0:
        print(f"warn{lr}", i, file=sys.stderr)
"""
_WHOLE = re.compile(r"\[GPU([01])\] Epoch \d{5} (?:(?:ab){200}|(?:cd){200}) Steps: 16|warn[01] \d+")


def _legacy_lines(text: str) -> list[tuple[str, ...]]:
    return sorted(_LEGACY_LINE.findall(text))


# -- item 4: --legacy-local-rank-arg through submit ---------------------------------------------------------

@pytest.mark.parametrize("mode", ["srun", "torchrun"])
def test_submit_puts_the_option_in_every_schedulers_command(mode: str, tmp_path: Path) -> None:
    (tmp_path / "t.py").write_text("")
    per_node = {"nproc_per_node": 2} if mode == "torchrun" else {"tasks_per_node": 2}
    spec = validate(JobSpec.of(script="t.py", args=("--lr", "1"), nodes=2, mode=mode, legacy_local_rank_arg=True,
                               workdir=str(tmp_path), **per_node))
    cmd = launch_command(spec)  # the PBS and local schedulers run this same command
    verb = "launch" if mode == "srun" else "torchrun-node"
    assert cmd[cmd.index(verb):].count("--legacy-local-rank-arg") == 1
    assert cmd[-3:] == [str(tmp_path / "t.py"), "--lr", "1"]
    for scheduler in ("slurm", "pbs", "local") if mode == "srun" else ("slurm", "local"):  # PBS refuses torchrun mode
        r = run_cli("submit", "--dry-run", "--scheduler", scheduler, "--mode", mode, "--nodes", "2",
                    "--nproc-per-node" if mode == "torchrun" else "--tasks-per-node", "2",
                    "--legacy-local-rank-arg", "t.py", env=no_slurm_env(tmp_path), cwd=tmp_path)
        assert r.returncode == 0 and "--legacy-local-rank-arg" in r.stdout, (scheduler, r.stdout + r.stderr)


def test_torchrun_node_passes_the_local_rank_right_after_the_script() -> None:
    env = step_env("n1", [1], 0, job=7)
    for nproc, expect in (("1", ["--max-restarts=0", "--no-python", "/py", "-c", AS_WORKER, "-u", "t.py",
                                 "--local-rank=${local_rank}", "--lr", "1"]),
                          ("2", ["--max-restarts=0", "--no-python", "/py", "-c", RELAY, "-u", "t.py",
                                 "--local-rank=${local_rank}", "--lr", "1"])):
        values, flags, script = parse([f"--nproc-per-node={nproc}", "--legacy-local-rank-arg", "t.py", "--lr", "1"])
        cmd, _ = torchrun_command(env, values, flags, script, "/py")
        assert cmd[cmd.index("--max-restarts=0"):] == expect


def test_profiles_do_not_set_it(tmp_path: Path) -> None:
    (tmp_path / "slurmlaunch.toml").write_text("[profiles.old]\nlegacy-local-rank-arg = true\n")
    (tmp_path / "t.py").write_text("")
    r = run_cli("submit", "--dry-run", "--scheduler", "slurm", "--profile", "old", "t.py",
                env=no_slurm_env(tmp_path), cwd=tmp_path)
    assert r.returncode == 2 and "legacy-local-rank-arg" in r.stderr and "not taken from config files" in r.stderr


@pytest.mark.parametrize("mode", ["srun", "torchrun"])
def test_legacy_script_through_submit_on_the_local_scheduler(mode: str, tmp_path: Path,
                                                             torch_available: None) -> None:
    (tmp_path / "legacy.py").write_text(LEGACY)
    size = ["--nproc-per-node", "2"] if mode == "torchrun" else ["--tasks-per-node", "2"]
    r = run_cli("submit", "--scheduler", "local", "--mode", mode, "--nodes", "2", *size,
                "--legacy-local-rank-arg", "legacy.py", "--lr", "0.5", env=no_slurm_env(tmp_path), cwd=tmp_path,
                timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    text = "".join(p.read_text() for p in (tmp_path / "slurmlaunch-logs").glob("*.log"))
    assert _legacy_lines(text) == [("0", "0", "0", "1"), ("0", "0", "2", "1"), ("1", "1", "1", "1"),
                                   ("1", "1", "3", "1")], text


def test_legacy_script_through_run(tmp_path: Path) -> None:
    (tmp_path / "legacy.py").write_text(LEGACY)
    r = subprocess.run([sys.executable, "-m", "slurmlaunch", "run", "--nproc-per-node", "2", "--cpu",
                        "--legacy-local-rank-arg", "legacy.py", "--lr", "0.5"], env=clean_env(), cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert _legacy_lines(r.stdout) == [("0", "0", "0", "1"), ("1", "1", "1", "1")], r.stdout
    assert r.stdout.count("OMP_NUM_THREADS=1 per rank") == 1, r.stdout  # said once, by rank 0
    # the advice `run` can take (it has no --cpus-per-task), in one short line
    note = next(line for line in r.stdout.splitlines() if "OMP_NUM_THREADS=1 per rank" in line)
    assert "OMP_NUM_THREADS=N slurmlaunch run" in note and "--cpus-per-task" not in note and len(note) < 140, note


@pytest.mark.slurm
@pytest.mark.parametrize("mode", ["srun", "torchrun"])
def test_legacy_script_through_submit_on_the_real_cluster(mode: str, cluster_env: dict[str, str], tmp_path: Path,
                                                          torch_available: None) -> None:
    (tmp_path / "legacy.py").write_text(LEGACY)
    size = ["--nproc-per-node", "2"] if mode == "torchrun" else ["--tasks-per-node", "2"]
    r = run_cli("submit", "--mode", mode, "--nodes", "2", *size, "--legacy-local-rank-arg", "--wait",
                "--wait-timeout", "150", "legacy.py", "--lr", "0.5", env=cluster_env, cwd=tmp_path, timeout=200)
    assert r.returncode == 0, r.stdout + r.stderr
    job = r.stdout.split()[0]
    text = "".join(p.read_text() for p in (tmp_path / "slurmlaunch-logs").glob(f"job-{job}.*.log"))
    lines = _legacy_lines(text)
    assert [(a, b) for a, b, _, _ in lines] == [("0", "0"), ("0", "0"), ("1", "1"), ("1", "1")], text
    assert sorted(rank for _, _, rank, _ in lines) == ["0", "1", "2", "3"] and {o for *_, o in lines} == {"1"}


# -- item 5: the workers' lines stay whole ------------------------------------------------------------------

def _broken_lines(text: str) -> list[str]:
    return [ln[:120] for ln in text.splitlines() if ln.startswith(("[GPU", "warn")) and not _WHOLE.fullmatch(ln)]


def test_torchrun_mode_node_log_keeps_every_line_whole(tmp_path: Path, torch_available: None) -> None:
    (tmp_path / "chatty.py").write_text(CHATTY)
    r = run_cli("submit", "--scheduler", "local", "--mode", "torchrun", "--nproc-per-node", "2", "chatty.py",
                env=no_slurm_env(tmp_path), cwd=tmp_path, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    (log,) = (tmp_path / "slurmlaunch-logs").glob("*.node-0.log")
    text = log.read_text()
    assert _broken_lines(text) == []
    assert len(re.findall(r"^\[GPU[01]\] Epoch", text, re.M)) == 3000
    assert len(re.findall(r"^warn[01] \d+$", text, re.M)) == 300


def _relay(*argv: str, **kw: object) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-c", RELAY, *argv], capture_output=True, timeout=60, **kw)  # type: ignore[call-overload, no-any-return]


def test_relay_exits_as_the_worker_did() -> None:
    assert _relay("-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)").returncode == 3
    r = _relay("-c", "import os, signal; print('before', flush=True); os.kill(os.getpid(), signal.SIGABRT)")
    assert r.returncode == -signal.SIGABRT and r.stdout == b"before\n"  # torchrun's summary still says -6
    r = _relay("sh", "-c", "printf 'no newline at the end'; echo oops >&2; exit 5")  # --no-python form
    assert (r.returncode, r.stdout, r.stderr) == (5, b"no newline at the end", b"oops\n")


def test_relay_outlives_a_signal_to_the_group_until_the_worker_is_done() -> None:
    # torchrun stops (or warns) its workers with killpg: the relay gets the signal too, and must keep passing
    # on what the worker says while it handles it (a checkpoint's "saved" line), then exit as the worker did
    worker = ("import signal, sys, time\n"
              "def stop(*_):\n    print('saved on', 'SIGUSR2'); sys.exit(7)\n"
              "signal.signal(signal.SIGUSR2, stop)\nprint('ready', flush=True)\ntime.sleep(60)\n")
    p = subprocess.Popen([sys.executable, "-c", RELAY, "-u", "-c", worker], stdout=subprocess.PIPE,
                         start_new_session=True)
    try:
        assert p.stdout is not None
        import select

        assert select.select([p.stdout], [], [], 60)[0] and p.stdout.readline() == b"ready\n"
        os.killpg(p.pid, signal.SIGUSR2)
        out, _ = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert (p.returncode, out) == (7, b"saved on SIGUSR2\n")


def test_relay_does_not_wait_for_what_the_worker_left_behind() -> None:
    # a child of the worker that keeps the output open (a daemon) must not keep torchrun waiting
    r = _relay("sh", "-c", "sleep 30 & echo started", stdin=subprocess.DEVNULL)
    assert r.returncode == 0 and r.stdout == b"started\n"


# -- item 6: OMP_NUM_THREADS ---------------------------------------------------------------------------------

def _dist(local_world: int, cpus: int | None = None, rank: int = 0) -> DistEnv:
    return DistEnv(source="slurm", rank=rank, local_rank=0, world_size=local_world * 2, local_world_size=local_world,
                   node_rank=0, num_nodes=2, master_addr="n1", master_port=29500, omp_num_threads=cpus)


@pytest.mark.parametrize(("local_world", "cpus", "environ", "expect"), [
    (4, None, {}, "1"),  # several ranks on a node: torchrun's rule
    (1, None, {}, None),  # one rank per node: the runtime's default (every core)
    (4, 6, {}, "6"),  # Slurm's CPUs per task
    (1, 6, {}, "6"),
    (4, 6, {"OMP_NUM_THREADS": "3"}, None),  # the user's value stands
    (4, None, {"OMP_NUM_THREADS": ""}, None),
])
def test_omp_rule(local_world: int, cpus: int | None, environ: dict[str, str], expect: str | None) -> None:
    assert _dist(local_world, cpus).exports(environ).get("OMP_NUM_THREADS") == expect


def test_omp_note_is_said_by_rank_0_only() -> None:
    assert _dist(4).omp_note({}) == ("OMP_NUM_THREADS=1 per rank (4 ranks per node, as torchrun does); for more: "
                                     "submit --cpus-per-task N")
    assert _dist(4, rank=5).omp_note({}) is None and _dist(4, cpus=2).omp_note({}) is None
    assert _dist(4).omp_note({"OMP_NUM_THREADS": "8"}) is None and _dist(1).omp_note({}) is None


@pytest.mark.parametrize(("env", "nproc", "expect", "noted"), [
    ({}, "4", "1", True),
    ({"SLURMD_NODENAME": "n2", "SLURM_NODEID": "1", "SLURM_PROCID": "1"}, "4", "1", False),  # the first node only
    ({}, "1", None, False),
    ({"SLURM_CPUS_PER_TASK": "8"}, "4", "2", False),
    ({"OMP_NUM_THREADS": "5"}, "4", None, False),
])
def test_omp_rule_in_torchrun_mode(env: dict[str, str], nproc: str, expect: str | None, noted: bool) -> None:
    step = step_env("n[1-2]", [1, 1], 0, job=7, **env)
    values, flags, script = parse([f"--nproc-per-node={nproc}", "t.py"])
    _, extra = torchrun_command(step, values, flags, script, "/py")
    assert extra.get("OMP_NUM_THREADS") == expect
    assert (first_node_note(step, values) is not None) == noted


@pytest.mark.parametrize(("options", "expect"), [
    ([], "1"), (["--cpus-per-task", "2"], "2"), (["--env", "OMP_NUM_THREADS=3"], "3")])
def test_omp_rule_on_the_local_scheduler(options: list[str], expect: str, tmp_path: Path) -> None:
    (tmp_path / "omp.py").write_text("import os\nprint('OMP', os.environ['RANK'], os.environ.get('OMP_NUM_THREADS'))\n")
    r = run_cli("submit", "--scheduler", "local", "--tasks-per-node", "2", *options, "omp.py",
                env=no_slurm_env(tmp_path), cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    text = "".join(p.read_text() for p in (tmp_path / "slurmlaunch-logs").glob("*.log"))
    assert sorted(re.findall(r"^OMP (\d) (\S+)$", text, re.M)) == [("0", expect), ("1", expect)], text
    assert text.count("OMP_NUM_THREADS=1 per rank") == (1 if expect == "1" and not options else 0)


# -- the prepared GPU check ------------------------------------------------------------------------------------

def test_gpu_check_parses_and_runs_without_a_gpu(tmp_path: Path) -> None:
    script = ROOT / "tests" / "gpu" / "check.sh"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True, timeout=30).returncode == 0
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "CUDA_VISIBLE"))}
    env.update(PYTHON=sys.executable, SLURMLAUNCH_GPU_CHECK_WORKDIR=str(tmp_path))
    r = subprocess.run(["bash", str(script), "--cpu-only"], capture_output=True, text=True, env=env, cwd=ROOT,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SKIP" in r.stdout and "FAIL" not in r.stdout and re.search(r"summary: \d+ passed, 0 failed", r.stdout)
    assert shutil.which("bash") is not None
