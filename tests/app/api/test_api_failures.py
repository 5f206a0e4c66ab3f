"""The Python API's local path when ranks fail: the caller hears the real cause, the rank and how its process
ended within seconds of the failure, while the other ranks are still busy (they are stopped, as srun
--kill-on-bad-exit stops a Slurm step). Real processes throughout; every wait is bounded."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import slurmlaunch
from slurmlaunch.core.errors import SlurmLaunchError

# The report must arrive this soon after the failing rank's last act. The stop grace is 3 s and nothing
# else waits; 30 s leaves a loaded 2-core machine room. (Before: the caller waited for every rank to end
# on its own, here never, then 15 s per rank without a result file, one rank after another.)
BOUND_S = 30.0
BUSY_S = 600  # what the healthy ranks would go on doing if nobody stopped them


def outcome(job: slurmlaunch.Job, limit: float = 180.0) -> tuple[BaseException | list[Any], float]:
    """job.results() in a thread, bounded: (what it raised or returned, when); the job is cancelled and the
    test fails if nothing came within ``limit`` seconds."""
    box: dict[str, Any] = {}

    def wait() -> None:
        try:
            box["value"] = job.results()
        except BaseException as e:  # noqa: B036 (handed to the test thread as is)
            box["value"] = e
        box["at"] = time.time()

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    thread.join(limit)
    if thread.is_alive():
        job.cancel()
        pytest.fail(f"job.results() gave nothing within {limit:.0f}s")
    return box["value"], box["at"]


def stamp(path: str) -> None:
    Path(path).write_text(repr(time.time()))


def unpicklable_on_rank_1(stamp_path: str) -> object:
    if os.environ["RANK"] == "1":
        stamp(stamp_path)
        return {"fine": [1, 2], "lock": threading.Lock()}
    time.sleep(BUSY_S)
    return "rank 0 done"


def exits_3_on_rank_1(stamp_path: str) -> int:
    if os.environ["RANK"] == "1":
        stamp(stamp_path)
        os._exit(3)
    time.sleep(BUSY_S)
    return 0


def segfaults_on_rank_1(stamp_path: str) -> int:
    import ctypes

    if os.environ["RANK"] == "1":
        stamp(stamp_path)
        ctypes.string_at(0)  # a real SIGSEGV from native code
    time.sleep(BUSY_S)
    return 0


def local_job(fn: Any, tmp_path: Path, *args: Any, **options: Any) -> slurmlaunch.Job:
    options = {"nodes": 1, "tasks_per_node": 2, **options}
    return slurmlaunch.submit(fn, *args, scheduler="local", output_dir=str(tmp_path / "logs"), **options)


def failure_after_stamp(job: slurmlaunch.Job, stamp_path: Path) -> slurmlaunch.RankFailed:
    error, at = outcome(job)
    assert isinstance(error, slurmlaunch.RankFailed), error
    assert at - float(stamp_path.read_text()) < BOUND_S
    assert job.done()  # the busy rank was stopped, not left running
    return error


def test_unpicklable_return_value_is_reported_with_its_type(tmp_path: Path) -> None:
    job = local_job(unpicklable_on_rank_1, tmp_path, str(tmp_path / "t"))
    e = failure_after_stamp(job, tmp_path / "t")
    assert e.rank == 1 and e.returncode == 1 and e.signal_name is None
    text = str(e)
    assert e.host and text.startswith(f"rank 1 on {e.host} failed (exit code 1):\n")
    assert "the function returned a dict that cannot be pickled" in text
    assert "value['lock'] is a _thread.lock" in text and "cannot pickle '_thread.lock' object" in text
    assert "temporary saved file" not in text


def test_exit_code_of_a_rank_that_ends_without_an_exception(tmp_path: Path) -> None:
    job = local_job(exits_3_on_rank_1, tmp_path, str(tmp_path / "t"))
    e = failure_after_stamp(job, tmp_path / "t")
    assert e.rank == 1 and e.returncode == 3 and e.signal_name is None
    assert str(e).startswith(f"rank 1 on {e.host} failed (exit code 3):\nits process exited with code 3")


def test_signal_of_a_rank_that_crashes(tmp_path: Path) -> None:
    job = local_job(segfaults_on_rank_1, tmp_path, str(tmp_path / "t"))
    e = failure_after_stamp(job, tmp_path / "t")
    assert e.rank == 1 and e.returncode == -11 and e.signal_name == "SIGSEGV"
    assert str(e).startswith(f"rank 1 on {e.host} failed (killed by SIGSEGV (signal 11)):\n")  # the CLI's words


def term_handler() -> bool:
    return signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_local_rank_stops_at_sigterm(tmp_path: Path) -> None:
    """The rank supervisor stops the other ranks of a failed local job with SIGTERM, SIGKILL only after its grace
    (10 s); submitit's handlers let SIGTERM pass (Slurm's notice before a requeue), so the caller heard of the
    failure only after the grace. Under the local scheduler the function runs with SIGTERM's default action,
    after the stack dump that chains to it (rank.py: stop-on-term)."""
    assert local_job(term_handler, tmp_path).results() == [True, True]


def exits_3_once_rank_0_runs(stamp_path: str, running: str) -> int:
    if os.environ["RANK"] == "1":
        for _ in range(1200):  # 120 s at most: rank 0's function has started (its stop dump is armed by then)
            if os.path.exists(running):
                break
            time.sleep(0.1)
        stamp(stamp_path)
        os._exit(3)
    Path(running).touch()
    time.sleep(BUSY_S)
    return 0


def test_the_stopped_ranks_stacks_are_saved(tmp_path: Path) -> None:
    """The busy rank stopped after rank 1's failure saved where it was (its RANK.stopped, which `job.stacks()`
    shows after the job): the dump armed in the API's rank chains to the handler there is, instead of an
    empty file (the RUNNER's arming, replaced by submitit's handlers, had left none)."""
    job = local_job(exits_3_once_rank_0_runs, tmp_path, str(tmp_path / "t"), str(tmp_path / "running"))
    failure_after_stamp(job, tmp_path / "t")
    stopped = (tmp_path / "logs" / f"job-{job.job_id}.stacks" / "0.stopped").read_text()
    assert " in exits_3_once_rank_0_runs\n" in stopped, stopped


def dies_in_a_collective() -> int:
    import torch
    import torch.distributed as dist

    slurmlaunch.init_process_group(rendezvous_timeout=120)
    dist.barrier()
    if dist.get_rank() == 1:
        os._exit(3)
    dist.all_reduce(torch.ones(1))  # rank 0 gets gloo's "Connection reset by peer" here, a consequence
    return 0


def test_a_death_is_the_cause_not_the_peers_errors_about_it(torch_available: None, tmp_path: Path) -> None:
    job = slurmlaunch.submit(dies_in_a_collective, scheduler="local", nodes=2, tasks_per_node=1,
                             output_dir=str(tmp_path / "logs"))
    e, _ = outcome(job)
    assert isinstance(e, slurmlaunch.RankFailed), e
    assert e.rank == 1 and e.returncode == 3, str(e)


def sleeps() -> int:
    time.sleep(BUSY_S)
    return 0


def test_a_cancelled_job_says_so(tmp_path: Path) -> None:
    job = local_job(sleeps, tmp_path)
    deadline = time.monotonic() + 60
    folder = tmp_path / "logs" / "submitit" / job.job_id
    while not all((folder / f"{job.job_id}_{r}_log.out").exists() for r in (0, 1)) and time.monotonic() < deadline:
        time.sleep(0.1)
    job.cancel()
    e, _ = outcome(job, 60)
    assert isinstance(e, SlurmLaunchError) and not isinstance(e, slurmlaunch.RankFailed), e
    assert "was cancelled (CANCELLED) before rank(s) 0, 1 finished" in str(e)
    assert job.state == "CANCELLED"


class Resumable:
    """Checkpointable (submitit's protocol) without torch: each rank counts in its own file and resumes."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def __call__(self, steps: int) -> tuple[int, int]:
        path = Path(self.folder) / f"count-{os.environ['RANK']}"
        start = int(path.read_text()) if path.exists() else 0
        for i in range(start, steps):
            time.sleep(0.1)
            path.with_suffix(".tmp").write_text(str(i + 1))  # whole or not at all: a resumed rank reads it
            path.with_suffix(".tmp").replace(path)
        return start, steps

    def checkpoint(self, steps: int) -> object:
        import submitit

        return submitit.helpers.DelayedSubmission(self, steps)


def test_local_requeue_after_the_warning_signal(tmp_path: Path) -> None:
    """USR2 to the job's supervisor, as a preemption would send it (it passes it on to every rank): rank 0
    checkpoints and asks for a requeue, the supervisor stops the other rank and starts both again, and they
    resume."""
    job = local_job(Resumable(str(tmp_path)), tmp_path, 100)
    deadline = time.monotonic() + 60  # both ranks have counted: both run, with submitit's handlers installed
    while not all((tmp_path / f"count-{r}").exists() for r in (0, 1)) and time.monotonic() < deadline:
        time.sleep(0.1)
    record = json.loads((tmp_path / "logs" / f"job-{job.job_id}.json").read_text())
    os.kill(record["supervisor"]["pid"], signal.SIGUSR2)
    results, _ = outcome(job)
    assert isinstance(results, list), results
    assert [steps for _, steps in results] == [100, 100] and results[0][0] > 0


def gpu_view() -> tuple[str, str]:
    return os.environ["CUDA_VISIBLE_DEVICES"], os.environ.get("SLURMLAUNCH_LOCAL_DEVICE", "cpu")


def test_emulated_nodes_hand_out_the_callers_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No GPU is touched (nothing imports CUDA): what is checked is which ids each rank is given. submitit's
    controller blanked CUDA_VISIBLE_DEVICES for every job, so gpus_per_node had no effect."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    gpus = slurmlaunch.submit(gpu_view, scheduler="local", nodes=2, gpus_per_node=2, output_dir=str(tmp_path))
    cpus = local_job(gpu_view, tmp_path)
    assert outcome(gpus)[0] == [("4,5", "0"), ("4,5", "1"), ("6,7", "0"), ("6,7", "1")]
    assert outcome(cpus)[0] == [("", "cpu"), ("", "cpu")]  # no GPU asked, none given


@pytest.mark.slurm
def test_slurm_unpicklable_return_value_is_reported(cluster_env: dict[str, str], tmp_path: Path) -> None:
    """The same packing on submitit's Slurm executor: srun --kill-on-bad-exit stops rank 0, and the caller
    reads rank 1's own report instead of two ranks without a result."""
    import subprocess
    import sys

    code = (
        "import slurmlaunch\n"
        "from tests.app.api.test_api_failures import unpicklable_on_rank_1\n"
        f"job = slurmlaunch.submit(unpicklable_on_rank_1, {str(tmp_path / 't')!r}, scheduler='slurm', "
        f"tasks_per_node=2, output_dir={str(tmp_path / 'logs')!r})\n"
        "try:\n    job.results()\nexcept slurmlaunch.RankFailed as e:\n    print('FAILED', e.rank)\n    print(e)\n"
    )
    env = dict(cluster_env, PYTHONPATH=str(Path(__file__).parents[3]))
    r = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "FAILED 1\n" in r.stdout, r.stdout[-3000:]
    assert "value['lock'] is a _thread.lock" in r.stdout and "cannot pickle '_thread.lock' object" in r.stdout
