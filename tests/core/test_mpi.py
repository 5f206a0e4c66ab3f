"""MPI-launched ranks (PBS jobs): table tests of every flavour's variables, PBS_NODEFILE semantics, and a
real Open MPI mpirun starting ranks through the launcher for a gloo all_reduce.

No PBS server exists here: PBS_NODEFILE / PBS_JOBID are an emulation of the PBS job environment (a file
shaped like PBS writes it, a job id of PBS's form). The mpirun, the launcher and gloo are real.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from slurmlaunch.core.detect import Context, derive_port, detect
from slurmlaunch.core.errors import EnvironmentMappingError
from tests.helpers import run_cli

NODEFILE = "node1\nnode1\nnode2\nnode2\n"


def ctx(host: str, nodefile: str = NODEFILE) -> Context:
    return Context(hostname=host, read_file=lambda path: nodefile if path == "/pbs/nodefile" else "")


PBS = {"PBS_JOBID": "1234.pbs-server", "PBS_NODEFILE": "/pbs/nodefile"}

# flavour, the variables its launcher sets for global rank 3 = node 1, local rank 1 (2 nodes x 2)
FLAVOURS = [
    ("openmpi", {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
                 "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMPI_COMM_WORLD_NODE_RANK": "1"}),
    ("mpich", {"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}),
    ("pals", {"PALS_RANKID": "3", "PALS_LOCAL_RANKID": "1", "PALS_NODEID": "1", "PMI_SIZE": "4",
              "PMI_LOCAL_SIZE": "2"}),
    ("mvapich", {"MV2_COMM_WORLD_RANK": "3", "MV2_COMM_WORLD_SIZE": "4", "MV2_COMM_WORLD_LOCAL_RANK": "1",
                 "MV2_COMM_WORLD_LOCAL_SIZE": "2"}),
    ("pmix", {"PMIX_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
              "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}),
]


@pytest.mark.parametrize(("flavour", "variables"), FLAVOURS)
def test_each_flavour_under_pbs(flavour: str, variables: dict[str, str]) -> None:
    d = detect({**PBS, **variables}, ctx("node2"))
    assert d.source == f"mpi:{flavour}"
    assert (d.rank, d.local_rank, d.world_size, d.local_world_size, d.node_rank, d.num_nodes) == (3, 1, 4, 2, 1, 2)
    assert (d.master_addr, d.master_port) == ("node1", derive_port(1234, 0))


def test_pmix_alone() -> None:
    env = {**PBS, "PMIX_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "0"}
    d = detect(env, ctx("node2.cluster.local"))
    assert d.source == "mpi:pmix" and d.node_rank == 1 and d.local_world_size == 2


def test_node_rank_var_of_open_mpi_is_not_the_node_index() -> None:
    env = {**PBS, **dict(FLAVOURS[0][1]), "OMPI_COMM_WORLD_NODE_RANK": "0"}
    assert detect(env, ctx("node2")).node_rank == 1


def test_nodes_in_order_of_first_appearance_never_sorted() -> None:
    nodefile = "zeta\nzeta\nalpha\nalpha\n"
    env = {**PBS, "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "0"}
    d = detect(env, ctx("zeta", nodefile))
    assert (d.master_addr, d.node_rank, d.local_world_size) == ("zeta", 0, 2)
    assert detect(dict(env, OMPI_COMM_WORLD_RANK="2"), ctx("alpha.site", nodefile)).node_rank == 1


def test_one_line_per_node_nodefile_needs_the_local_size() -> None:
    env = {**PBS, "OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
           "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}
    d = detect(env, ctx("b", "a\nb\n"))
    assert (d.node_rank, d.num_nodes, d.local_world_size) == (1, 2, 4)


def test_array_job_id_and_user_port() -> None:
    env = {**PBS, "PBS_JOBID": "1234[7].pbs", **FLAVOURS[0][1]}
    assert detect(env, ctx("node2")).master_port == derive_port(1234, 7)
    assert detect(dict(env, MASTER_PORT="25000"), ctx("node2")).master_port == 25000


def test_without_nodefile_blocks_and_master_addr() -> None:
    mpirun = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
              "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    d = detect(mpirun, Context(hostname="box"))
    assert (d.node_rank, d.num_nodes, d.master_addr) == (0, 1, "box")
    several = {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
               "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    with pytest.raises(EnvironmentMappingError, match="MASTER_ADDR"):
        detect(several, Context(hostname="box"))
    assert detect(dict(several, MASTER_ADDR="head"), Context(hostname="box")).node_rank == 1


def test_mpi_wins_over_slurm_variables_of_mpiruns_daemons() -> None:
    env = {**PBS, **FLAVOURS[0][1], "SLURM_JOB_ID": "9", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0",
           "SLURM_NTASKS": "2", "SLURM_STEP_NODELIST": "node[1-2]", "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
           "SLURM_NODEID": "1", "SLURM_LOCALID": "0"}
    assert detect(env, ctx("node2")).rank == 3


@pytest.mark.parametrize(("env", "host", "nodefile", "expect"), [
    ({**PBS, **FLAVOURS[0][1]}, "node9", NODEFILE, "this host 'node9' is not in PBS_NODEFILE"),
    ({**PBS, **FLAVOURS[0][1]}, "node2", "", "is empty"),
    ({**PBS, **FLAVOURS[0][1], "OMPI_COMM_WORLD_RANK": "4"}, "node2", NODEFILE, "OMPI_COMM_WORLD_RANK=4"),
    ({**PBS, **FLAVOURS[0][1], "OMPI_COMM_WORLD_LOCAL_RANK": "x"}, "node2", NODEFILE, "'x'"),
    ({**PBS, **FLAVOURS[0][1], "PBS_JOBID": "abc.server"}, "node2", NODEFILE, "PBS_JOBID='abc.server'"),
    ({**PBS, "PALS_RANKID": "1", "PALS_LOCAL_RANKID": "0"}, "node2", NODEFILE, "PMI_SIZE"),
    ({**PBS, "PALS_RANKID": "1", "PALS_LOCAL_RANKID": "0", "PMI_SIZE": "4", "PALS_NODEID": "5"}, "node2", NODEFILE,
     "PALS_NODEID=5"),
    (dict(PBS), "node1", NODEFILE, "PBS job script"),
])
def test_bad_pbs_and_mpi_environments(env: dict[str, str], host: str, nodefile: str, expect: str) -> None:
    with pytest.raises(EnvironmentMappingError) as e:
        detect(env, ctx(host, nodefile))
    assert expect in str(e.value)


def test_env_json_under_each_flavour(tmp_path: Path) -> None:
    nodefile = tmp_path / "nodefile"
    nodefile.write_text(NODEFILE)
    for flavour, variables in FLAVOURS:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "OMPI", "PMI", "PALS", "MV2"))}
        env.update(variables, PBS_JOBID="1234.pbs", PBS_NODEFILE=str(nodefile), SLURMLAUNCH_HOSTNAME="node2",
                   SLURMLAUNCH_ALLOW_LOOPBACK="1")
        r = run_cli("env", "--json", env=env)
        assert r.returncode == 0, (flavour, r.stderr)
        got = json.loads(r.stdout)
        assert (got["RANK"], got["LOCAL_RANK"], got["NODE_RANK"], got["MASTER_ADDR"]) == ("3", "1", "1", "node1")


# --- a real mpirun -------------------------------------------------------------------------------------
