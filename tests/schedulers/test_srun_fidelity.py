"""The local scheduler's tasks against a real srun step's, variable by variable.

The same request goes through `slurmlaunch submit` twice from the same directory and environment: to the
real dev cluster (so the srun line is the one users get) and to --scheduler local. Each task dumps its whole
os.environ; the two dumps must have the same names and, wherever a value is not a host, an id, a pid or a
port, the same values. What may differ is listed below with the reason; anything else is drift and fails.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

from slurmlaunch.allocation.gpus import dev_gpu_ids
from slurmlaunch.core import hostlist
from slurmlaunch.core.spec import JobSpec
from slurmlaunch.schedulers import local_stepenv as stepenv
from slurmlaunch.schedulers.local import rank_env
from tests.helpers import run_cli

DUMP = """
import json, os, sys
env = dict(os.environ)
key = "-".join([sys.argv[1], env.get("SLURM_ARRAY_TASK_ID", "x"), env["SLURM_NODEID"], env["LOCAL_RANK"]])
with open(os.path.join(env["OUT_DIR"], key + ".json"), "w") as f:
    json.dump({"pid": os.getpid(), "env": env}, f)
"""

# --- What may differ, and why --------------------------------------------------------------------------
# Names on one side only:
ONE_SIDED = {
    **dict.fromkeys(stepenv.NOT_EMULATED, "srun's own channels / the cluster's config file: not emulated"),
    "_": "the batch shell's last command (srun), not Slurm's",
    "OLDPWD": "the batch shell's `cd` into the working directory, not Slurm's",
    "SLURMLAUNCH_SCHEDULER": "the local scheduler marks its tasks",
    "SLURMLAUNCH_SUPERVISOR_TOKEN": "marks every process of a local job, so none outlives it (supervisor.py)",
}
# Names present on the real side only when the request does not name them: accounting's defaults.
DEFAULTED = {"SLURM_JOB_ACCOUNT": "--account", "SLURM_JOB_QOS": "--qos"}
# Same names, values that differ by nature:
FREE_VALUES = {
    "SLURM_JOB_ID": "job id", "SLURM_JOBID": "job id", "SLURM_ARRAY_JOB_ID": "job id",
    "TORCHELASTIC_RUN_ID": "job id (torchrun's run id)",
    "SLURM_TASK_PID": "pid (checked instead: the task's own pid, on both sides)",
    "MASTER_PORT": "port (derived from the job id)",
    "SLURM_CLUSTER_NAME": "the cluster's ClusterName",
    "TORCHELASTIC_ERROR_FILE": "a fresh temporary directory",
    "SLURMLAUNCH_RETURNED_DIR": "the job's own job-ID.returned directory (named by the job id)",
    "SLURMLAUNCH_REASONS_DIR": "the job's own job-ID.reasons directory (named by the job id)",
    "SLURMLAUNCH_STACKS_DIR": "the job's own job-ID.stacks directory (named by the job id)",
    "SLURMLAUNCH_TIMELINE_DIR": "the job's own job-ID.timeline directory (named by the job id)",
    "SLURM_JOB_START_TIME": "the time the job started (checked instead: within the test, on both sides)",
    "SLURM_JOB_END_TIME": "its start plus the time limit (checked instead: the same limit on both sides)",
}
# The node's size, which an --exclusive job gets whole: the dev cluster's nodes have 8 CPUs and 4 GPUs, the
# emulated ones this machine's (possibly no GPU: then no SLURM_JOB_GPUS either).
NODE_SIZE = ("SLURM_CPUS_ON_NODE", "SLURM_JOB_CPUS_PER_NODE", "SLURM_JOB_CPUS_PER_NODE_PACK_GROUP_0",
             "SLURM_JOB_GPUS")
# Node names, compared by their place in the job's node list (node1 and 127.0.0.1 are both node 0; MASTER_ADDR
# is node 0 on both sides, derived from the node list by the launcher):
NODE_VALUED = ("SLURMD_NODENAME", "SLURM_TOPOLOGY_ADDR", "HOSTNAME", "MASTER_ADDR")
NODE_LISTS = ("SLURM_JOB_NODELIST", "SLURM_NODELIST", "SLURM_STEP_NODELIST")
# GPU ids, compared by number: each real node numbers its own GPUs from 0, the emulated nodes share one
# machine's and each gets its own slice of them.
GPU_IDS = (*stepenv.GPU_LISTS, "SLURM_JOB_GPUS", "SLURM_STEP_GPUS")
# torchrun's elastic rendezvous numbers the nodes in arrival order, on a cluster as locally, and its workers'
# MASTER_ADDR is the host name of the agent that holds its store (this machine's own name locally). A worker's
# SLURM_NODEID is its GROUP_RANK (core.workerenv), so the node a task's key lands on is arrival order too.
RENDEZVOUS_ORDER = ("RANK", "GROUP_RANK", "ROLE_RANK", "MASTER_ADDR", "SLURMD_NODENAME", "SLURM_TOPOLOGY_ADDR")


def normalise(env: Mapping[str, str], request: list[str], torchrun: bool) -> dict[str, str]:
    """One task's environment with what may differ replaced by what must not (see the tables above)."""
    nodes = hostlist.expand(env["SLURM_JOB_NODELIST"])
    out = {}
    for name, value in env.items():
        if name in ONE_SIDED or (name in DEFAULTED and DEFAULTED[name] not in request):
            continue
        if "--exclusive" in request and name in NODE_SIZE:
            continue
        if name == "CUDA_VISIBLE_DEVICES" and value == "":
            continue  # locally, a job without GPUs on a machine with some: stands in for the device cgroup
        if name in FREE_VALUES or (name == "SLURM_JOB_PARTITION" and "--partition" not in request) \
                or (torchrun and name in RENDEZVOUS_ORDER):
            value = "<free>"
        elif name in NODE_VALUED:
            value = f"<node {nodes.index(value)}>"
        elif name in NODE_LISTS:
            value = ",".join(f"<node {nodes.index(h)}>" for h in hostlist.expand(value))
        elif name in GPU_IDS:
            value = f"<{len(value.split(','))} GPU(s)>"
        out[name] = value
    return out


def differences(real: Mapping[str, str], local: Mapping[str, str]) -> list[str]:
    return [f"{k}: real {real.get(k)!r}, local {local.get(k)!r}" for k in sorted(set(real) | set(local))
            if real.get(k) != local.get(k)]


def lightning_check(env: Mapping[str, str], devices: int, num_nodes: int) -> None:
    """What Lightning's SLURMEnvironment demands of an srun step (its behaviour, written here, not installed):
    more than one task needs SLURM_NTASKS_PER_NODE, which must equal the trainer's devices, with
    SLURM_NNODES its num_nodes; and the task's place must fit those counts."""
    ntasks = int(env.get("SLURM_NTASKS", "1"))
    if ntasks > 1 and "SLURM_NTASKS_PER_NODE" not in env:
        raise AssertionError(f"SLURM_NTASKS={ntasks} without SLURM_NTASKS_PER_NODE")
    per_node, nnodes = int(env["SLURM_NTASKS_PER_NODE"]), int(env["SLURM_NNODES"])
    assert (per_node, nnodes) == (devices, num_nodes), (per_node, nnodes, devices, num_nodes)
    assert per_node * nnodes == ntasks
    node, local, rank = int(env["SLURM_NODEID"]), int(env["SLURM_LOCALID"]), int(env["SLURM_PROCID"])
    assert node < nnodes and local < per_node and rank == node * per_node + local
    assert len(hostlist.expand(env["SLURM_NODELIST"])) == nnodes


# --- Without a cluster ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("nodes", "tasks"), [(1, 1), (1, 4), (2, 2), (3, 1)])
def test_lightning_accepts_every_emulated_task(nodes: int, tasks: int, tmp_path: Path) -> None:
    (tmp_path / "t.py").write_text("")
    spec = JobSpec.of(script="t.py", nodes=nodes, tasks_per_node=tasks, workdir=str(tmp_path))
    for rank in range(nodes * tasks):
        lightning_check(rank_env(spec, "77", rank, {}, None), devices=tasks, num_nodes=nodes)


LIGHTNING_SCRIPT = f"""
import os, sys
sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
from tests.schedulers.test_srun_fidelity import lightning_check
lightning_check(os.environ, devices=2, num_nodes=2)
print("lightning-ok", os.environ["SLURM_PROCID"])
"""


def test_lightning_check_passes_in_a_local_job(tmp_path: Path) -> None:
    """The check in the ranks' own environment, through the launcher, as a Lightning script would run."""
    (tmp_path / "l.py").write_text(LIGHTNING_SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    r = run_cli("submit", "--scheduler", "local", "--nodes", "2", "--tasks-per-node", "2", "l.py",
                env=env, cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(re.findall(r"lightning-ok (\d)", r.stdout)) == ["0", "1", "2", "3"]


@pytest.mark.parametrize(("text", "mb"), [("1000", 1000), ("1500m", 1500), ("1G", 1024), ("2049K", 3),
                                          ("1023k", 1), ("2T", 2 * 1024 * 1024)])
def test_mem_per_node_in_megabytes(text: str, mb: int) -> None:
    assert stepenv.mem_mb(text) == mb


def test_exclusive_gets_the_whole_emulated_node(tmp_path: Path) -> None:
    (tmp_path / "t.py").write_text("")
    spec = JobSpec.of(script="t.py", nodes=2, tasks_per_node=2, exclusive=True, workdir=str(tmp_path))
    env = rank_env(spec, "7", 3, {}, None)
    cpus = len(os.sched_getaffinity(0))
    assert (env["SLURM_CPUS_ON_NODE"], env["SLURM_JOB_CPUS_PER_NODE"]) == (str(cpus), f"{cpus}(x2)")
    env = rank_env(spec, "7", 3, {"CUDA_VISIBLE_DEVICES": "0,1,2"}, None)
    assert (env["SLURM_JOB_GPUS"], env["CUDA_VISIBLE_DEVICES"]) == ("0,1,2", "")  # the job's, not the step's


# What sbatch gave (test_array_step_as_sbatch_gives_it asks it again on the cluster).
@pytest.mark.parametrize(("expr", "step"), [("2", 1), ("1,3,5-7", 1), ("0,4,8", 1), ("1-7:3", 3), ("3-3:4", 4),
                                            ("0-4:2,10-20:5", 2), ("0-2,10-20:5", 5), ("0-20:5%2", 5)])
def test_array_step_is_the_first_written(expr: str, step: int) -> None:
    assert stepenv.array_step(expr) == step


def test_cpu_job_hides_this_machines_gpus(tmp_path: Path) -> None:
    """A real node's device cgroup keeps a CPU job off the GPUs, and Slurm unsets the GPU lists; here the
    emulation hides the visible GPUs with an empty list and drops the others."""
    (tmp_path / "t.py").write_text("")
    spec = JobSpec.of(script="t.py", workdir=str(tmp_path))
    env = rank_env(spec, "7", 0, {"CUDA_VISIBLE_DEVICES": "0,1", "ROCR_VISIBLE_DEVICES": "0"}, None)
    assert env["CUDA_VISIBLE_DEVICES"] == "" and "ROCR_VISIBLE_DEVICES" not in env
    assert not {"SLURM_GPUS_ON_NODE", "SLURM_JOB_GPUS"} & set(env)
    # without any GPU here the variable is unset, as Slurm leaves it; with /dev/nvidia* it must hide them
    env = rank_env(spec, "7", 0, {"CUDA_VISIBLE_DEVICES": ""}, None)
    assert env.get("CUDA_VISIBLE_DEVICES") == ("" if dev_gpu_ids() else None)


# --- Against the real cluster ---------------------------------------------------------------------------

# Every shape slurmlaunch can request. It cannot ask for uneven tasks per node (srun gets --nodes,
# --ntasks-per-node and --ntasks = their product): "uneven" here is an odd count on one node and one task
# on each of three nodes (which also flips srun's default distribution from block to cyclic).
SHAPES = {
    "2x2": ["--nodes", "2", "--tasks-per-node", "2"],
    "1x3": ["--nodes", "1", "--tasks-per-node", "3"],
    "3x1": ["--nodes", "3"],
    "cpus-mem-time": ["--nodes", "2", "--tasks-per-node", "2", "--cpus-per-task", "3", "--mem", "1500M",
                      "--time", "10"],
    "gpus-per-node": ["--nodes", "2", "--gpus-per-node", "2"],
    "gres-accounting": ["--nodes", "2", "--gpus-per-node", "1", "--gpu-flag", "gres", "--cpus-per-gpu", "2",
                        "--partition", "debug", "--account", "root", "--qos", "normal", "--mem", "2049K"],
    "exclusive": ["--nodes", "2", "--tasks-per-node", "2", "--exclusive"],
    "array": ["--nodes", "2", "--array", "0,4-8:4"],
    "sweep": ["--nodes", "1", "--tasks-per-node", "2", "--sweep", "lr=0.1,0.2", "--max-parallel", "1"],
    "torchrun": ["--mode", "torchrun", "--nodes", "2", "--nproc-per-node", "2", "--cpus-per-task", "2"],
}
GPU_SHAPES = ("gpus-per-node", "gres-accounting")


def dumps(d: Path, side: str) -> dict[str, dict[str, object]]:
    return {p.stem.removeprefix(side + "-"): json.loads(p.read_text()) for p in d.glob(f"{side}-*.json")}


# The releases a step is compared against (the fixture of each cluster): Debian's 22.05 and a current one,
# 25.11 (tests/slurm_current.py). The emulation follows the newest; what the older one's step has or lacks
# beside it is listed and left out of its comparison, on the side that has it.
RELEASES = {"22.05": "cluster_env", "25.11": "slurm_current_env"}
NOT_IN = {
    "22.05": ("SLURM_JOB_START_TIME", "SLURM_JOB_END_TIME", "SLURM_JOB_GROUP", "SLURM_OOM_KILL_STEP",
              "SLURM_TRES_PER_TASK", "SLURMD_DEBUG"),
    "25.11": (),
}
ONLY_IN = {
    "22.05": ("SLURM_JOB_CPUS_PER_NODE_PACK_GROUP_0", "SLURM_NODE_ALIASES"),
    "25.11": (),
}


def times(env: Mapping[str, str]) -> tuple[int, int]:
    """The job's start (epoch seconds) and how long after it its end is (the time limit; a year without one)."""
    start = int(env["SLURM_JOB_START_TIME"])
    return start, int(env["SLURM_JOB_END_TIME"]) - start


@pytest.mark.slurm
# every 25.11 test on one worker (tests/run.sh: --dist loadgroup), so that one 25.11 cluster serves them all
@pytest.mark.parametrize("release", [pytest.param(r, marks=pytest.mark.xdist_group("slurm_current")) if r == "25.11"
                                     else r for r in RELEASES])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_local_task_environment_equals_a_real_srun_steps(shape: str, release: str, request: pytest.FixtureRequest,
                                                        tmp_path: Path) -> None:
    cluster_env: dict[str, str] = request.getfixturevalue(RELEASES[release])
    asked = SHAPES[shape]
    torchrun = "torchrun" in asked
    if torchrun:
        pytest.importorskip("torch")
    (tmp_path / "dump.py").write_text(DUMP)
    env = {k: v for k, v in cluster_env.items() if k not in GPU_IDS and k != "SLURMLAUNCH_SCHEDULER"}
    if shape in GPU_SHAPES:
        env["CUDA_VISIBLE_DEVICES"] = "0,1,2,3,4,5,6,7"  # this machine's GPUs for the local side; Slurm sets its own
    began = int(time.time())
    for side, scheduler in (("real", "slurm"), ("local", "local")):
        r = run_cli("submit", "--scheduler", scheduler, "--wait", *asked, "--env", f"OUT_DIR={tmp_path}",
                    "dump.py", side, env=env, cwd=tmp_path, timeout=240)
        assert r.returncode == 0, r.stdout + r.stderr
    ended = int(time.time())
    real, local = dumps(tmp_path, "real"), dumps(tmp_path, "local")
    assert sorted(real) == sorted(local) and real, (sorted(real), sorted(local))
    drift, compared = [], 0
    for task in sorted(real):
        real_env: dict[str, str] = real[task]["env"]  # type: ignore[assignment]
        local_env: dict[str, str] = local[task]["env"]  # type: ignore[assignment]
        assert not set(ONLY_IN[release]) - set(real_env) and not set(NOT_IN[release]) & set(real_env), \
            f"{release}'s step has other variables than listed: {sorted(real_env)}"
        if not NOT_IN[release]:  # the times, each side's own: a start within the test, the same time limit
            for side_env in (real_env, local_env):
                assert began <= times(side_env)[0] <= ended, (task, times(side_env), began, ended)
            assert times(real_env)[1] == times(local_env)[1], (task, times(real_env), times(local_env))
        want = normalise({k: v for k, v in real_env.items() if k not in ONLY_IN[release]}, asked, torchrun)
        got = normalise({k: v for k, v in local_env.items() if k not in NOT_IN[release]}, asked, torchrun)
        drift += [f"task {task}: {d}" for d in differences(want, got)]
        compared += sum(k.startswith("SLURM") for k in want)
    assert not drift, f"{shape}: the local task environment differs from srun's ({release}):\n" + "\n".join(drift)
    assert compared >= 35 * len(real)  # the comparison saw the step, not an empty dump
    for side in (*real.values(), *local.values()):
        task_env: dict[str, str] = side["env"]  # type: ignore[assignment]
        if not torchrun:  # torchrun's ranks are children of the task
            assert task_env.get("SLURM_TASK_PID") == str(side["pid"])  # the launcher exec'd the script
            lightning_check(task_env, devices=int(task_env["SLURM_NTASKS_PER_NODE"]),
                            num_nodes=int(task_env["SLURM_NNODES"]))


@pytest.mark.slurm
def test_array_step_as_sbatch_gives_it(cluster_env: dict[str, str], tmp_path: Path) -> None:
    """SLURM_ARRAY_TASK_STEP comes from the text of --array, not from the indices: ask sbatch."""
    for n, expr in enumerate(["3", "0,4,8", "0-2,10-20:5", "0-10:5,20-26:3%2"]):
        out = tmp_path / f"step{n}-%a.txt"
        subprocess.run(["sbatch", "--wait", f"--array={expr}", "-o", str(out), "--wrap",
                        "echo $SLURM_ARRAY_TASK_STEP"], env=cluster_env, check=True, capture_output=True,
                       timeout=120)
        seen = {p.read_text().strip() for p in tmp_path.glob(f"step{n}-*.txt")}
        assert seen == {str(stepenv.array_step(expr))}, (expr, seen)
