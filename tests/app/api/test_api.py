"""The Python API on submitit: the local executor here, submitit's Slurm executor on the real cluster."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import slurmlaunch
from slurmlaunch.core.errors import SpecError
from tests.helpers import EXAMPLES, no_slurm_env, wait_for_files


def ranks_and_sum(offset: int = 0) -> dict[str, int]:
    import torch
    import torch.distributed as dist

    slurmlaunch.init_process_group(rendezvous_timeout=120)
    t = torch.tensor([float(dist.get_rank() + offset)])
    dist.all_reduce(t)
    out = {k: int(os.environ[k]) for k in ("RANK", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE")}
    out["sum"] = int(t.item())
    out["port"] = int(os.environ["MASTER_PORT"])
    dist.barrier()
    dist.destroy_process_group()
    return out


def fails_on_rank_2() -> int:
    import torch
    import torch.distributed as dist

    slurmlaunch.init_process_group(rendezvous_timeout=120)
    if dist.get_rank() == 2:
        raise ValueError("rank 2 cannot go on")
    t = torch.ones(1)
    dist.all_reduce(t)  # the others fail here once rank 2 is gone
    return dist.get_rank()


def check(results: list[dict[str, int]], nodes: int, tpn: int, offset: int = 0) -> None:
    world = nodes * tpn
    assert [r["RANK"] for r in results] == list(range(world))
    assert [(r["NODE_RANK"], r["LOCAL_RANK"]) for r in results] == [divmod(i, tpn) for i in range(world)]
    assert {r["sum"] for r in results} == {sum(range(world)) + offset * world}


def test_local_function_on_two_emulated_nodes(torch_available: None, tmp_path: Path) -> None:
    job = slurmlaunch.submit(ranks_and_sum, scheduler="local", nodes=2, tasks_per_node=2,
                             output_dir=str(tmp_path / "logs"), offset=1)
    results = job.results()
    assert job.done() and job.state == "COMPLETED"  # the state agrees with done() at once (issue 18 item 9)
    check(results, 2, 2, offset=1)
    assert job.result() == results[0] and job.done()


def test_local_exception_in_rank_2_reaches_the_caller(torch_available: None, tmp_path: Path) -> None:
    job = slurmlaunch.submit(fails_on_rank_2, scheduler="local", nodes=2, tasks_per_node=2,
                             output_dir=str(tmp_path / "logs"))
    with pytest.raises(slurmlaunch.RankFailed) as e:
        job.results()
    assert e.value.rank == 2 and "ValueError: rank 2 cannot go on" in str(e.value)
    assert e.value.host and e.value.returncode == 1  # the host, as the CLI's failure line names it
    assert str(e.value).startswith(f"rank 2 on {e.value.host} failed (exit code 1):\n")


def test_local_array_each_its_own_world(torch_available: None, tmp_path: Path) -> None:
    jobs = slurmlaunch.map_array(ranks_and_sum, [0, 10], scheduler="local", tasks_per_node=2,
                                 output_dir=str(tmp_path / "logs"))
    out = [j.results() for j in jobs]
    assert [r[0]["sum"] for r in out] == [1, 21]
    assert out[0][0]["port"] != out[1][0]["port"]


def test_local_batch_of_different_functions(torch_available: None, tmp_path: Path) -> None:
    with slurmlaunch.batch(scheduler="local", tasks_per_node=2, output_dir=str(tmp_path / "logs")) as b:
        first = b.submit(ranks_and_sum, offset=5)
        second = b.submit(sleeper, 0.1)
    assert [j.results() for j in (b.jobs[first], b.jobs[second])][1] == [0, 0]
    assert b.jobs[first].result()["sum"] == 1 + 5 * 2
    with pytest.raises(SpecError, match="unknown option"):
        slurmlaunch.batch(scheduler="local", offset=5)


def test_options_are_validated_like_the_cli(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="--nodes 0"):
        slurmlaunch.submit(ranks_and_sum, scheduler="local", nodes=0)
    with pytest.raises(SpecError, match="--time '1h'"):
        slurmlaunch.submit(ranks_and_sum, scheduler="local", time="1h")
    with pytest.raises(SpecError, match="unknown option"):
        slurmlaunch.submit_script(str(EXAMPLES / "train_ddp.py"), scheduler="local", bogus=1)


def test_import_is_lazy() -> None:
    probe = ("import sys; before = set(sys.modules); import slurmlaunch; "
             "print(sorted(m for m in set(sys.modules) - before if m.split('.')[0] != 'slurmlaunch'))")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert r.stdout.strip() == "[]", r.stdout + r.stderr  # nothing beyond the package itself


@pytest.mark.slurm
def test_slurm_function_two_nodes_two_tasks(cluster_env: dict[str, str], tmp_path: Path,
                                            torch_available: None) -> None:
    code = (
        "import json, sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parents[3])!r})\n"
        "import slurmlaunch\n"
        "from tests.app.api.test_api import ranks_and_sum, fails_on_rank_2\n"
        f"job = slurmlaunch.submit(ranks_and_sum, scheduler='slurm', nodes=2, tasks_per_node=2, "
        f"output_dir={str(tmp_path / 'logs')!r})\n"
        "print('RESULTS ' + json.dumps(job.results()))\n"
        f"bad = slurmlaunch.submit(fails_on_rank_2, scheduler='slurm', nodes=2, tasks_per_node=2, "
        f"output_dir={str(tmp_path / 'logs')!r})\n"
        "try:\n    bad.results()\nexcept slurmlaunch.RankFailed as e:\n"
        "    print('FAILED', e.rank, 'ValueError: rank 2 cannot go on' in str(e))\n"
    )
    env = dict(cluster_env, PYTHONPATH=str(Path(__file__).parents[3]))  # the tasks unpickle tests.app.api.test_api
    r = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    import json

    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("RESULTS "))
    check(json.loads(line[8:]), 2, 2)
    assert "FAILED 2 True" in r.stdout


def sleeper(seconds: float, started: str | None = None) -> int:
    """Sleeps; with ``started`` (a directory), each rank first says it is running there (started-RANK)."""
    import time

    if started:
        Path(started, f"started-{os.environ['RANK']}").touch()
    time.sleep(seconds)
    return 0


def test_local_script_logs_and_cancel(torch_available: None, tmp_path: Path) -> None:
    job = slurmlaunch.submit_script(str(EXAMPLES / "train_ddp.py"), ["--epochs", "1", "--checkpoint",
                                    str(tmp_path / "ck.pt")], scheduler="local", tasks_per_node=2,
                                    output_dir=str(tmp_path / "logs"))
    assert job.results() == [0, 0]
    assert "done: world_size=2 sum_of_ranks=1" in job.logs(0)
    slow = slurmlaunch.submit(sleeper, 120, str(tmp_path), scheduler="local", tasks_per_node=2,
                              output_dir=str(tmp_path / "logs"))
    wait_for_files(tmp_path, "started-*", 2)  # both ranks run: the cancel stops a running job
    slow.cancel()
    deadline = time.monotonic() + 30
    while not slow.done() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert slow.done()


def test_notebook_example_runs_on_the_local_default(torch_available: None, tmp_path: Path) -> None:

    env = dict(no_slurm_env(tmp_path), PYTHONPATH=str(Path(__file__).parents[3]))
    r = subprocess.run([sys.executable, str(EXAMPLES / "api_quickstart.py")], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "rank 0: {'rank': 0, 'node_rank': 0, 'sum': 12.0}" in r.stdout and "sweep: [1.0, 10.0]" in r.stdout


@pytest.mark.slurm
def test_slurm_batch_is_an_array_of_worlds(cluster_env: dict[str, str], tmp_path: Path, torch_available: None) -> None:
    code = (
        "import json, slurmlaunch\n"
        "from tests.app.api.test_api import ranks_and_sum\n"
        f"with slurmlaunch.batch(scheduler='slurm', nodes=2, tasks_per_node=1, output_dir={str(tmp_path)!r}) as b:\n"
        "    b.submit(ranks_and_sum, offset=0)\n    b.submit(ranks_and_sum, offset=10)\n"
        "print('RESULTS ' + json.dumps([j.results() for j in b.jobs]))\n"
    )
    env = dict(cluster_env, PYTHONPATH=str(Path(__file__).parents[3]))
    r = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    import json

    first, second = json.loads(r.stdout.split("RESULTS ", 1)[1])
    check(first, 2, 1)
    check(second, 2, 1, offset=10)
    assert first[0]["port"] != second[0]["port"]  # each array element its own MASTER_PORT


def env_value(name: str) -> str | None:
    return os.environ.get(name)


def test_profile_from_python(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, torch_available: None) -> None:
    (tmp_path / "config.toml").write_text(
        '[profiles.pair]\ntasks-per-node = 2\nenv = { FROM_PROFILE = "a b" }\ntime = "5"\n'
        '[profiles.elastic]\nmode = "torchrun"\n')
    monkeypatch.setenv("SLURMLAUNCH_CONFIG", str(tmp_path / "config.toml"))  # the per-user file
    job = slurmlaunch.submit(env_value, "FROM_PROFILE", scheduler="local", profile="pair",
                             output_dir=str(tmp_path / "logs"))
    assert job.spec.ntasks_per_node == 2 and job.spec.resources.time == "5" and job.results() == ["a b", "a b"]
    with pytest.raises(SpecError, match="profile 'elastic' sets mode, which only `slurmlaunch submit` carries out"):
        slurmlaunch.submit(env_value, "X", scheduler="local", profile="elastic")
    with pytest.raises(SpecError, match=r"option\(s\) mode are carried out by `slurmlaunch submit`"):
        slurmlaunch.submit(env_value, "X", scheduler="local", mode="torchrun")


def test_a_profiles_remote_keys_are_the_apis_remote_arguments(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """remote, remote-setup and python of a profile become remote=, remote_setup=, remote_python=; what is
    wrong is refused before any ssh (the destination here does not exist: reaching it would fail otherwise)."""
    from slurmlaunch.app.api.job_options import profile_options, profile_remote

    (tmp_path / "slurmlaunch.toml").write_text(
        '[profiles.booster]\nremote = "nosuch.invalid:work"\nremote-setup = ["module load slurm"]\n'
        'python = "/opt/venv/bin/python"\nnodes = 2\n[profiles.plain]\nnodes = 1\n')
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    assert profile_remote("booster") == {"remote": "nosuch.invalid:work", "remote_setup": ("module load slurm",),
                                         "remote_python": "/opt/venv/bin/python"}
    assert profile_remote("plain") == {} and profile_options("booster") == {"nodes": 2}
    with pytest.raises(SpecError, match="nodes"):
        slurmlaunch.submit(print, profile="booster", nodes=0)
    with pytest.raises(SpecError, match="only Slurm and PBS clusters"):
        slurmlaunch.map_array(print, [1], profile="booster", scheduler="local")
    with pytest.raises(SpecError, match="only Slurm and PBS clusters"):
        slurmlaunch.batch(profile="booster", scheduler="local")
    with pytest.raises(SpecError, match="only with remote="):
        slurmlaunch.map_array(print, [1], remote_setup=["module load slurm"], scheduler="local")
    with pytest.raises(SpecError, match="only with remote="):
        slurmlaunch.submit(print, profile="plain", remote_python="python3", scheduler="local")


@pytest.mark.parametrize(("given", "minutes"), [
    (None, 525600), ("0", 525600), ("UNLIMITED", 525600), ("infinite", 525600),  # sbatch: 0 is no limit
    ("1", 1), ("1:30", 2), ("90", 90), ("1-0", 1440), ("0:0:1", 1),
])
def test_the_apis_time_limit_for_submitit_follows_sbatchs_reading(given: str | None, minutes: int) -> None:
    from slurmlaunch.app.api.executors import _minutes

    assert _minutes(given) == minutes


def test_a_rank_unpickles_its_call_without_loading_jobspec(tmp_path: Path) -> None:
    """A rank under Slurm needs the call's log directory, not the JobSpec, whose module (a dataclass of some 50
    fields) every rank of every short job would pay to load (issue 32): the spec travels pickled on its own and
    is unpickled where it is used (the local scheduler's step variables, a checkpoint's resubmission)."""
    made = ("import sys, cloudpickle\n"
            "from slurmlaunch.core.spec import JobSpec\n"
            "from slurmlaunch.app.api.calls import _wrap\n"
            f"spec = JobSpec.of(script='t.py', workdir={str(tmp_path)!r}, output_dir='logs')\n"
            "call = _wrap(spec, print, (1,), {})\n"
            "sys.stdout.buffer.write(cloudpickle.dumps(call))\n")
    pickled = subprocess.run([sys.executable, "-c", made], capture_output=True, check=True, timeout=60).stdout
    rank = ("import pickle, sys\n"
            "call = pickle.loads(sys.stdin.buffer.read())\n"
            "print(call.log_dir, 'slurmlaunch.core.spec' in sys.modules)\n"
            "spec = call.spec\n"
            "print(spec.program.script, spec.log_dir == call.log_dir, 'slurmlaunch.core.spec' in sys.modules)\n")
    r = subprocess.run([sys.executable, "-c", rank], input=pickled, capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr.decode()
    assert r.stdout.decode().splitlines() == [f"{tmp_path / 'logs'} False", "t.py True True"]


def test_a_call_pickled_by_an_earlier_slurmlaunch_still_runs(tmp_path: Path) -> None:
    """A job queued across an upgrade: its call was pickled with the spec as a plain attribute."""
    from slurmlaunch.app.api.calls import _DistributedCall
    from slurmlaunch.core.spec import JobSpec

    spec = JobSpec.of(script="t.py", workdir=str(tmp_path), output_dir="logs")
    call = _DistributedCall.__new__(_DistributedCall)
    call.__setstate__({"spec": spec, "fn": print, "args": (1,), "kwargs": {}})
    assert call.spec is spec and call.log_dir == str(tmp_path / "logs") and call.args == (1,)
