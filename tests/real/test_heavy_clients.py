"""Clients too heavy for every CI run, run when asked (SLURMLAUNCH_HEAVY_CLIENTS=1; CI leaves them out):
DeepSpeed's own script (tests/clients/deepspeed_train.py: deepspeed.init_distributed(), deepspeed.initialize,
2 steps) on 2 nodes x 2 ranks, through the local default, real Slurm in srun mode and --mode torchrun, and
real PBS (Open MPI's mpiexec). The oracle is DeepSpeed's own view (deepspeed.comm's rank, world size and local
rank, torch's backend, its accelerator) and identical trained parameters on every rank.

Why not in CI (docs: Works with): DeepSpeed 0.19.8 installs only from source and on the CPU compiles a C++
op (its shared-memory all-reduce) at the first init_distributed of each build environment, ~1-3 minutes on
this project's machine kind, holding a lock file in ~/.cache/torch_extensions that a killed compile leaves
behind. Install it with: DS_BUILD_OPS=0 pip install --no-build-isolation --no-deps deepspeed==0.19.8 &&
pip install einops hjson msgpack ninja py-cpuinfo 'pydantic>=2' (with torch already there)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.real.test_clients import CLIENTS, RECORD, job_text, pbs_text, records, run_together, submit, succeeded

# skipped before any fixture starts a cluster for it
pytestmark = pytest.mark.skipif(os.environ.get("SLURMLAUNCH_HEAVY_CLIENTS") != "1",
                                reason="heavy clients run when asked: SLURMLAUNCH_HEAVY_CLIENTS=1 (CI leaves them out)")

NODES, PER_NODE = 2, 2
WAIT = ["--wait", "--wait-timeout", "560"]  # the first run in a build environment compiles DeepSpeed's op


@pytest.fixture(scope="module")
def deepspeed_asked() -> None:
    try:
        import deepspeed  # noqa: F401
    except ImportError:
        pytest.fail("SLURMLAUNCH_HEAVY_CLIENTS=1 but deepspeed is not installed (see this module's docstring)")


def check(text: str) -> None:
    got = records(text, "deepspeed")
    for line in RECORD.findall(text):
        print(*line)
    world = NODES * PER_NODE
    assert sorted(int(r["rank"]) for r in got) == list(range(world)), text[-4000:]
    assert {(r["world"], r["backend"], r["accelerator"], r["steps"]) for r in got} == {(str(world), "gloo", "cpu", "2")}
    assert sorted(int(r["local_rank"]) for r in got) == sorted(list(range(PER_NODE)) * NODES), got
    assert len({r["params"] for r in got}) == 1 and got[0]["params"] != got[0]["before"], got


def shape(*extra: str) -> list[str]:
    return ["--nodes", str(NODES), *extra, str(CLIENTS / "deepspeed_train.py")]


def test_local_default(tmp_path: Path, deepspeed_asked: None) -> None:
    # this shell's PATH (DeepSpeed's op compile needs c++ and ninja) and HOME (its build cache), no Slurm job's
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    code, console = run_together({"ds": (submit(*shape("--scheduler", "local", "--tasks-per-node", str(PER_NODE))),
                                         env, tmp_path)}, timeout=600)["ds"]
    assert succeeded(code, console, tmp_path), console[-3000:]
    check(job_text(tmp_path))


@pytest.mark.slurm
@pytest.mark.parametrize("mode", ["srun", "torchrun"])
def test_real_slurm(mode: str, netns_cluster_env: dict[str, str], tmp_path: Path, deepspeed_asked: None) -> None:
    how = (["--tasks-per-node", str(PER_NODE)] if mode == "srun"
           else ["--mode", "torchrun", "--nproc-per-node", str(PER_NODE)])
    code, console = run_together({"ds": (submit(*shape("--time", "10", *WAIT, "--cancel-on-interrupt", *how)),
                                         netns_cluster_env, tmp_path)}, timeout=600)["ds"]
    assert succeeded(code, console, tmp_path), console[-3000:] + job_text(tmp_path)[-3000:]
    check(job_text(tmp_path))


@pytest.mark.pbs
def test_pbs(pbs_env: dict[str, str], tmp_path: Path, deepspeed_asked: None) -> None:
    as_root = ["--env", "OMPI_ALLOW_RUN_AS_ROOT=1", "--env", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"]
    code, console = run_together({"ds": (submit(*shape("--scheduler", "pbs", "--tasks-per-node", str(PER_NODE),
                                                       *WAIT, *as_root)), pbs_env, tmp_path)}, timeout=600)["ds"]
    assert succeeded(code, console, tmp_path), console[-3000:] + pbs_text(tmp_path)[-3000:]
    check(pbs_text(tmp_path))
