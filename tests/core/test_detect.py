"""The environment mapping: a mapping in, a frozen DistEnv out (no monkeypatching)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmlaunch.core.detect import PORT_BASE, PORT_SPAN, READERS, Context, derive_port, detect
from slurmlaunch.core.envvars import DAEMON_PORTS, cpus_per_task
from slurmlaunch.core.errors import EnvironmentMappingError, PreflightError, SlurmLaunchError
from tests.helpers import step_env


def test_two_nodes_two_tasks_each() -> None:
    d = detect(step_env("node[1-2]", [2, 2], 3, CUDA_VISIBLE_DEVICES="0,1", SLURM_CPUS_PER_TASK="4"))
    assert (d.source, d.rank, d.local_rank, d.world_size, d.local_world_size, d.node_rank, d.num_nodes) == (
        "slurm", 3, 1, 4, 2, 1, 2)
    assert d.master_addr == "node1" and d.master_port == derive_port(1234, 0)
    assert d.local_device == 1
    ex = d.exports({})
    assert ex["RANK"] == "3" and ex["GROUP_RANK"] == ex["NODE_RANK"] == "1" and ex["GROUP_WORLD_SIZE"] == "2"
    assert ex["ROLE_RANK"] == "3" and ex["ROLE_WORLD_SIZE"] == "4" and ex["OMP_NUM_THREADS"] == "4"
    assert "OMP_NUM_THREADS" not in d.exports({"OMP_NUM_THREADS": "7"})  # the user's value stands


def test_step_variables_win_over_job_variables() -> None:
    # A step on a subset of the allocation: the job has node[1-4], the step runs on node[3-4].
    env = step_env("node[3-4]", [1, 1], 1, SLURM_JOB_NODELIST="node[1-4]", SLURM_NTASKS="16",
                   SLURM_TASKS_PER_NODE="4(x4)", SLURM_NNODES="4")
    d = detect(env)
    assert d.world_size == 2 and d.num_nodes == 2 and d.master_addr == "node3" and d.node_rank == 1


def test_without_the_steps_list_the_jobs_canonical_name_wins() -> None:
    # sbatch(1): SLURM_NODELIST is SLURM_JOB_NODELIST's name kept for backwards compatibility. The reader once
    # preferred it (torchrun mode did not); a set-up that gives them different values now reads the job's.
    env = step_env("node[1-2]", [1, 1], 1, SLURM_NODELIST="other[1-2]")
    del env["SLURM_STEP_NODELIST"]
    d = detect(env)
    assert d.master_addr == "node1" and d.this_host == "node2"
    assert d.origins["GROUP_WORLD_SIZE"] == "SLURM_JOB_NODELIST=node[1-2]"


def test_uneven_tasks_per_node() -> None:
    counts = [3, 3, 1]
    seen = []
    for r in range(7):
        d = detect(step_env("n[01-03]", counts, r))
        seen.append((d.node_rank, d.local_rank, d.local_world_size))
    assert seen == [(0, 0, 3), (0, 1, 3), (0, 2, 3), (1, 0, 3), (1, 1, 3), (1, 2, 3), (2, 0, 1)]


def test_arbitrary_distribution_rank0_host_from_hostfile() -> None:
    env = step_env("node[1-2]", [1, 1], 0, SLURM_DISTRIBUTION="arbitrary", SLURM_HOSTFILE="/hf",
                   SLURMD_NODENAME="node2", SLURM_NODEID="1")
    ctx = Context(read_file=lambda p: "node2\nnode1\n" if p == "/hf" else "")
    d = detect(env, ctx)
    assert d.master_addr == "node2" and d.rank0_host == "node2" and d.this_host == "node2"


def test_user_master_addr_and_port_win() -> None:
    d = detect(step_env("node[1-2]", [1, 1], 0, MASTER_ADDR="10.0.0.5", MASTER_PORT="23456"))
    assert (d.master_addr, d.master_port) == ("10.0.0.5", 23456)
    assert "user" in d.origins["MASTER_ADDR"]


def test_port_is_deterministic_outside_ephemeral_range() -> None:
    ports = {derive_port(j, s) for j in range(0, 50000, 7) for s in range(3)}
    assert all(PORT_BASE <= p < PORT_BASE + PORT_SPAN and not 32768 <= p <= 60999 for p in ports)
    assert derive_port(42, 0) != derive_port(42, 1)  # two steps of one job do not collide
    # never a port PBS's daemons hold (pbs_mom's 15002 on every node), and no two keys below the span share one
    free = PORT_SPAN - len(DAEMON_PORTS)
    every = [derive_port(k) for k in range(free)]
    assert len(set(every)) == free and not set(every) & set(DAEMON_PORTS)
    assert [derive_port(k) for k in (0, 1, 2, 16990, 16991)] == [15000, 15008, 15009, 31998, 31999]


def test_torchrun_owned_is_left_alone() -> None:
    env = {"TORCHELASTIC_RUN_ID": "abc", "RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2",
           "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1", "MASTER_ADDR": "h",
           "MASTER_PORT": "29500", **step_env("node[1-2]", [1, 1], 1)}
    d = detect(env)
    assert d.source == "torchrun" and d.owned_by_torchrun and d.exports(env) == {}


def test_outside_everything_is_a_world_of_one() -> None:
    d = detect({"HOME": "/root"}, Context(hostname="box"))
    assert (d.source, d.rank, d.world_size, d.master_addr) == ("single", 0, 1, "127.0.0.1")
    assert d.notes  # it says so


def test_rank_set_by_hand_is_respected_but_not_over_a_scheduler() -> None:
    d = detect({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1234"})
    assert (d.source, d.rank, d.world_size, d.master_addr, d.master_port) == ("preset", 1, 2, "h", 1234)
    with pytest.raises(EnvironmentMappingError, match="MASTER_ADDR"):
        detect({"RANK": "1", "WORLD_SIZE": "2"})
    assert detect({**step_env("node[1-2]", [1, 1], 1), "RANK": "0", "WORLD_SIZE": "9"}).rank == 1


def test_detection_order_is_explicit() -> None:
    assert [r.__name__ for r in READERS] == ["read_torchrun", "read_run", "read_mpi", "read_slurm",
                                                    "read_pbs_script", "read_preset"]


def test_batch_step_with_many_tasks_is_refused() -> None:
    env = step_env("node[1-2]", [2, 2], 0)
    del env["SLURM_STEP_ID"], env["SLURM_STEPID"]
    with pytest.raises(EnvironmentMappingError, match="batch step.*srun"):
        detect(env)
    env["SLURM_NTASKS"] = "1"
    assert detect(env).source == "single"  # a one-task batch job is a legitimate world of 1


@pytest.mark.parametrize(("change", "names"), [
    ({"SLURM_PROCID": "x"}, "SLURM_PROCID='x'"),
    ({"SLURM_PROCID": "-1"}, "SLURM_PROCID='-1'"),
    ({"SLURM_PROCID": "4"}, "SLURM_PROCID=4"),
    ({"SLURM_PROCID": "１"}, "SLURM_PROCID='１'"),
    ({"SLURM_STEP_NUM_TASKS": "0"}, "SLURM_STEP_NUM_TASKS='0'"),
    ({"SLURM_STEP_NODELIST": "node[2-1]"}, "SLURM_STEP_NODELIST"),
    ({"SLURM_STEP_NODELIST": "node[1-3]"}, "names 3 hosts"),
    ({"SLURM_STEP_TASKS_PER_NODE": "2(x"}, "SLURM_STEP_TASKS_PER_NODE"),
    ({"SLURM_STEP_TASKS_PER_NODE": "3,1"}, "SLURM_STEP_TASKS_PER_NODE='3,1'"),
    ({"SLURM_NODEID": "2"}, "SLURM_NODEID=2"),
    ({"SLURM_LOCALID": "2"}, "SLURM_LOCALID=2"),
    ({"SLURMD_NODENAME": "node9"}, "SLURMD_NODENAME='node9'"),
    ({"SLURM_JOB_ID": "12a"}, "SLURM_JOB_ID='12a'"),
    ({"MASTER_PORT": "70000"}, "MASTER_PORT=70000"),
    ({"MASTER_PORT": "http"}, "MASTER_PORT='http'"),
])
def test_bad_variables_are_named(change: dict[str, str], names: str) -> None:
    env = step_env("node[1-2]", [2, 2], 3)
    env.update(change)
    with pytest.raises(EnvironmentMappingError) as e:
        detect(env)
    assert names in str(e.value)


def test_missing_variable_is_named() -> None:
    env = step_env("node[1-2]", [2, 2], 3)
    del env["SLURM_LOCALID"]
    with pytest.raises(EnvironmentMappingError, match="SLURM_LOCALID"):
        detect(env)


# --- GPUs ------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("extra", "rank", "device"), [
    ({"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, 3, 3),  # --gpus-per-node=4 / --gres=gpu:4: all visible, LOCAL_RANK
    ({"CUDA_VISIBLE_DEVICES": "2", "SLURM_GPUS_ON_NODE": "4"}, 2, 0),  # --gpus-per-task=1 / --gpu-bind
    ({"CUDA_VISIBLE_DEVICES": "2,3", "SLURM_GPUS_ON_NODE": "8"}, 1, 0),  # --gpus-per-task=2: its first
    ({"CUDA_VISIBLE_DEVICES": ""}, 1, None),
    ({"CUDA_VISIBLE_DEVICES": "NoDevFiles"}, 1, None),
    ({"CUDA_VISIBLE_DEVICES": "0,1", "SLURMLAUNCH_DEVICE": "cpu"}, 1, None),
    ({}, 2, None),  # no CUDA_VISIBLE_DEVICES and no /dev/nvidia*: the CPU
])
def test_gpu_choice(extra: dict[str, str], rank: int, device: int | None) -> None:
    env = step_env("node1", [4], rank, **extra)
    assert detect(env).local_device == device


def test_gpu_from_dev_count_when_unset() -> None:
    assert detect(step_env("node1", [4], 3), Context(gpu_device_count=lambda: 4)).local_device == 3
    with pytest.raises(PreflightError, match="4 ranks on node1 but only 2 GPU"):
        detect(step_env("node1", [4], 3), Context(gpu_device_count=lambda: 2))


def test_more_ranks_than_gpus_is_an_error() -> None:
    with pytest.raises(PreflightError, match="4 ranks on node1 but only 2 GPU.*CUDA_VISIBLE_DEVICES='0,1'"):
        detect(step_env("node1", [4], 0, CUDA_VISIBLE_DEVICES="0,1", SLURM_GPUS_ON_NODE="2"))


# --- properties -------------------------------------------------------------------------------------

@settings(max_examples=60)
@given(st.lists(st.integers(1, 5), min_size=1, max_size=9), st.integers(1, 10**6))
def test_ranks_are_a_bijection_and_all_agree(counts: list[int], job: int) -> None:
    nodelist = f"gpu-[{1:03d}-{len(counts):03d}]"
    results = [detect(step_env(nodelist, counts, r, job=job)) for r in range(sum(counts))]
    assert sorted(d.rank for d in results) == list(range(sum(counts)))
    assert len({(d.node_rank, d.local_rank) for d in results}) == sum(counts)
    assert {(d.master_addr, d.master_port) for d in results} == {("gpu-001", derive_port(job, 0))}
    assert all(d.world_size == sum(counts) and d.num_nodes == len(counts) for d in results)


@settings(max_examples=300)
@given(st.dictionaries(
    st.sampled_from(["SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_STEP_NODELIST",
                     "SLURM_STEP_TASKS_PER_NODE", "SLURM_NODEID", "SLURM_LOCALID", "SLURMD_NODENAME",
                     "CUDA_VISIBLE_DEVICES", "MASTER_PORT", "SLURM_CPUS_PER_TASK", "TORCHELASTIC_RUN_ID",
                     "RANK", "WORLD_SIZE"]),
    st.text(alphabet=st.sampled_from(list("0123[]-,x(n) \udcff")), max_size=12)))
def test_garbage_gives_our_error_or_a_valid_world(env: dict[str, str]) -> None:
    try:
        d = detect(env)
    except SlurmLaunchError:
        return
    assert 0 <= d.rank < d.world_size and 0 <= d.local_rank < d.local_world_size


def test_enormous_node_list_is_cheap() -> None:
    nodelist = ",".join(f"r{r}n[0-65535]" for r in range(16))
    env = step_env("n[1-2]", [1, 1], 0)
    env.update(SLURM_STEP_NODELIST=nodelist, SLURM_STEP_NUM_NODES=str(16 * 65536),
               SLURM_STEP_TASKS_PER_NODE=f"1(x{16 * 65536})", SLURM_STEP_NUM_TASKS=str(16 * 65536),
               SLURMD_NODENAME="r0n0", SLURM_PROCID="0", SLURM_NODEID="0", SLURM_LOCALID="0")
    d = detect(env)
    assert d.master_addr == "r0n0" and d.world_size == 16 * 65536


@pytest.mark.parametrize(("env", "expect"), [
    ({}, None), ({"SLURM_CPUS_PER_TASK": ""}, None), ({"SLURM_CPUS_PER_TASK": "4"}, 4),
    ({"SLURM_CPUS_PER_TASK": "65535"}, 65535),
])
def test_cpus_per_task_is_read_once_for_every_mode(env: dict[str, str], expect: int | None) -> None:
    assert cpus_per_task(env) == expect


@pytest.mark.parametrize("bad", ["x", "-1", "4 ", "65536", "9" * 5000])
def test_a_bad_cpus_per_task_is_an_error_not_ignored(bad: str) -> None:
    """The one reading (core.envvars.cpus_per_task) refuses what is no count: ignoring it would leave every
    rank's thread pool at all of the node's cores."""
    with pytest.raises(EnvironmentMappingError) as e:
        cpus_per_task({"SLURM_CPUS_PER_TASK": bad})
    assert str(e.value).startswith("SLURM_CPUS_PER_TASK=") and "\n" not in str(e.value) and len(str(e.value)) < 200
    with pytest.raises(EnvironmentMappingError, match="^SLURM_CPUS_PER_TASK="):
        detect(step_env("node[1-2]", [2, 2], 3, SLURM_CPUS_PER_TASK=bad))
