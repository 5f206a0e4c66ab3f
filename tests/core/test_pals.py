"""Cray PALS (Aurora-class PBS systems): with Cray PMI, with PALS_SIZE, and with PMIx, where no world size is
exported and it is derived as distinct hosts of PBS_NODEFILE x PALS_LOCAL_SIZE.

No PALS exists here: the variables are an emulation of what PALS's mpiexec sets per rank (per HPE's list
quoted in flux-framework/flux-core#3825 and flux-coral2#79, and meta-pytorch/torchcomms' PALS bootstrap),
built from a layout (hosts x ranks per node, ranks in blocks as `--ppn` places them). PBS_NODEFILE files are
shaped as PBS writes them (each chunk's host once per mpiprocs). The launcher processes and gloo are real.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from slurmlaunch.core.detect import Context, derive_port, detect
from slurmlaunch.core.distenv import DistEnv
from slurmlaunch.core.errors import EnvironmentMappingError
from tests.helpers import run_cli

NODEFILE_PATH = "/var/spool/pbs/aux/4321.aurora-pbs"


def pals_env(rank: int, per_node: list[int], pmi: str = "pmix", **extra: str) -> dict[str, str]:
    """The variables PALS's mpiexec gives global rank ``rank`` when node i runs per_node[i] ranks in blocks."""
    node = 0
    first = 0
    while rank >= first + per_node[node]:
        first += per_node[node]
        node += 1
    local, local_size, world = rank - first, per_node[node], sum(per_node)
    env = {"PBS_JOBID": "4321.aurora-pbs-0001", "PBS_NODEFILE": NODEFILE_PATH, "PALS_APID": "a1b2c3",
           "PALS_RANKID": str(rank), "PALS_LOCAL_RANKID": str(local), "PALS_NODEID": str(node),
           "PALS_LOCAL_SIZE": str(local_size), "PALS_DEPTH": "1"}
    if pmi == "pmix":
        env["PMIX_RANK"] = str(rank)
    else:  # Cray PMI
        env.update(PMI_RANK=str(rank), PMI_SIZE=str(world), PMI_LOCAL_RANK=str(local),
                   PMI_LOCAL_SIZE=str(local_size))
    env.update(extra)
    return env


def ctx(host: str, nodefile: str) -> Context:
    return Context(hostname=host, read_file=lambda path: nodefile if path == NODEFILE_PATH else "")


def place(d: DistEnv) -> tuple[int, int, int, int, int, int]:
    return d.rank, d.local_rank, d.world_size, d.local_world_size, d.node_rank, d.num_nodes


# Node files as PBS writes them: `select=2` on Aurora (mpiprocs defaults to 1: one line per node),
# `select=2:mpiprocs=4` (each host 4 times), one-slot chunks that share hosts, listed out of host order.
ONE_LINE_PER_NODE = "x4000c0s0b0n0.cluster.local\nx4000c0s1b0n0.cluster.local\n"  # names as the node file has them
ONE_LINE_PER_SLOT = "x4000c0s0b0n0\n" * 4 + "x4000c0s1b0n0\n" * 4
INTERLEAVED = "x4000c0s0b0n0\nx4000c0s1b0n0\n" * 4


@pytest.mark.parametrize("nodefile", [ONE_LINE_PER_NODE, ONE_LINE_PER_SLOT, INTERLEAVED],
                         ids=["one-line-per-node", "one-line-per-slot", "interleaved-chunks"])
def test_pmix_world_is_distinct_hosts_times_local_size(nodefile: str) -> None:
    # 2 hosts x 4 ranks: every rank derives 8. Lines x PALS_LOCAL_SIZE (torchcomms counts lines, assuming
    # one line per node) would give 8, 32 and 32: a host repeats once per mpiprocs of each chunk.
    seen = set()
    for rank in range(8):
        host = ("x4000c0s0b0n0", "x4000c0s1b0n0")[rank // 4]
        d = detect(pals_env(rank, [4, 4]), ctx(host, nodefile))
        assert d.source == "mpi:pals"
        assert place(d) == (rank, rank % 4, 8, 4, rank // 4, 2)
        assert d.this_host is not None and d.this_host.startswith(host)
        seen.add((d.master_addr, d.master_port))
        assert d.origins["WORLD_SIZE"] == (
            f"2 distinct host(s) in PBS_NODEFILE={NODEFILE_PATH} x PALS_LOCAL_SIZE=4 (PALS with PMIx exports no "
            f"world size)")
        assert d.origins["LOCAL_WORLD_SIZE"] == "PALS_LOCAL_SIZE=4"
    first_host = nodefile.splitlines()[0]
    assert seen == {(first_host, derive_port(4321, 0))}  # every rank agrees on the master


def test_pmix_fewer_ranks_per_node_than_mpiprocs() -> None:
    # select=2:mpiprocs=4 but `mpiexec --ppn 2` (more threads per rank): the slots are uniform, the ranks too.
    d = detect(pals_env(3, [2, 2]), ctx("x4000c0s1b0n0", ONE_LINE_PER_SLOT))
    assert place(d) == (3, 1, 4, 2, 1, 2)


def test_pmix_with_empty_pmi_size_is_derived_too() -> None:
    # An empty PMI_SIZE is no size (Aurora job scripts meet it under --pmi=pmix).
    d = detect(pals_env(5, [4, 4], PMI_SIZE=""), ctx("x4000c0s1b0n0", ONE_LINE_PER_SLOT))
    assert place(d) == (5, 1, 8, 4, 1, 2)


@pytest.mark.parametrize(("extra", "origin"), [
    ({}, "PMI_SIZE=8"),  # Cray PMI: PMI_SIZE is the world
    ({"PALS_SIZE": "8"}, "PMI_SIZE=8"),  # PMI_SIZE is read first when both are set
])
def test_pals_with_cray_pmi(extra: dict[str, str], origin: str) -> None:
    # Cray PMI's sizes are read as they are: a non-uniform layout is no obstacle here.
    nodefile = "x4000c0s0b0n0\nx4000c0s1b0n0\nx4000c0s2b0n0\n"
    d = detect(pals_env(7, [3, 3, 2], pmi="cray", **extra), ctx("x4000c0s2b0n0", nodefile))
    assert place(d) == (7, 1, 8, 2, 2, 3)
    assert d.origins["WORLD_SIZE"] == origin


def test_pals_size_wins_over_the_derivation() -> None:
    # PALS_SIZE (set by a future PALS, or by hand: `PALS_SIZE=10 mpiexec -n 10 ...`) is read, not derived,
    # so a layout the derivation refuses still runs when the size is stated.
    nodefile = "x4000c0s0b0n0\nx4000c0s1b0n0\nx4000c0s2b0n0\n"
    d = detect(pals_env(9, [4, 4, 2], PALS_SIZE="10"), ctx("x4000c0s2b0n0", nodefile))
    assert place(d) == (9, 1, 10, 2, 2, 3)
    assert d.origins["WORLD_SIZE"] == "PALS_SIZE=10"


def refusal(env: dict[str, str], host: str, nodefile: str) -> str:
    with pytest.raises(EnvironmentMappingError) as e:
        detect(env, ctx(host, nodefile))
    message = str(e.value)
    assert "\n" not in message
    return message


def test_pmix_without_node_file_is_refused() -> None:
    env = {k: v for k, v in pals_env(1, [2]).items() if k != "PBS_NODEFILE"}
    message = refusal(env, "x4000c0s0b0n0", "")
    assert "PBS_NODEFILE is not set" in message and "distinct hosts x PALS_LOCAL_SIZE" in message
    assert "export PALS_SIZE=N" in message


def test_pmix_without_local_size_is_refused() -> None:
    env = {k: v for k, v in pals_env(1, [2, 2]).items() if k != "PALS_LOCAL_SIZE"}
    message = refusal(env, "x4000c0s0b0n0", ONE_LINE_PER_NODE)
    assert "neither PALS_LOCAL_SIZE nor PMI_LOCAL_SIZE is set" in message


def test_pmix_with_uneven_node_file_is_refused() -> None:
    # select=1:mpiprocs=4+1:mpiprocs=2: the allocation itself has different slots per host.
    nodefile = "x4000c0s0b0n0\n" * 4 + "x4000c0s1b0n0\n" * 2
    message = refusal(pals_env(0, [4, 2]), "x4000c0s0b0n0", nodefile)
    assert "gives its hosts different slot counts (x4000c0s0b0n0 x4, x4000c0s1b0n0 x2)" in message


def test_pmix_short_last_node_is_refused_there() -> None:
    # mpiexec -n 10 --ppn 4 on 3 nodes: the last node runs 2. Its ranks see PALS_LOCAL_SIZE=2 and would
    # derive 3 x 2 = 6 while the others derive 12: every rank of the short node refuses.
    nodefile = "x4000c0s0b0n0\nx4000c0s1b0n0\nx4000c0s2b0n0\n"
    for rank in (8, 9):
        message = refusal(pals_env(rank, [4, 4, 2]), "x4000c0s2b0n0", nodefile)
        assert (f"PALS_RANKID={rank} is not PALS_NODEID=2 x PALS_LOCAL_SIZE=2 + PALS_LOCAL_RANKID={rank - 8}"
                in message)
    # What one rank cannot see: the full nodes' ranks derive 12 (their own layout is consistent). The job
    # still fails, loudly, on the short node; PALS_SIZE=10 makes it run (test above).
    d = detect(pals_env(0, [4, 4, 2]), ctx("x4000c0s0b0n0", nodefile))
    assert d.world_size == 12


def test_pmix_out_of_range_values_keep_their_own_messages() -> None:
    message = refusal(pals_env(1, [2, 2], PALS_NODEID="5"), "x4000c0s0b0n0", ONE_LINE_PER_NODE)
    assert "PALS_NODEID=5 is not valid for the 2 hosts" in message
    env = {k: v for k, v in pals_env(1, [2, 2], PALS_RANKID="4").items() if k != "PALS_NODEID"}
    message = refusal(env, "x4000c0s0b0n0", ONE_LINE_PER_NODE)
    assert "PALS_RANKID=4 is not valid with WORLD_SIZE=4" in message and "2 distinct host(s)" in message


# --- through the real launcher process ------------------------------------------------------------------


def process_env(variables: dict[str, str], nodefile: Path | None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM", "OMPI", "PMI", "PALS", "MV2", "PBS_", "MASTER_", "RANK", "WORLD_",
                                "LOCAL_", "TORCHELASTIC", "OMP_", "CUDA_VISIBLE"))}
    env.update(variables, SLURMLAUNCH_ALLOW_LOOPBACK="1", **extra)
    if nodefile is None:
        env.pop("PBS_NODEFILE", None)
    else:
        env["PBS_NODEFILE"] = str(nodefile)
    return env


def test_env_shows_where_the_derived_world_size_came_from(tmp_path: Path) -> None:
    nodefile = tmp_path / "4321.aurora-pbs"
    nodefile.write_text(ONE_LINE_PER_SLOT)
    env = process_env(pals_env(6, [4, 4]), nodefile, SLURMLAUNCH_HOSTNAME="x4000c0s1b0n0")
    r = run_cli("env", "--json", env=env)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert (got["RANK"], got["WORLD_SIZE"], got["LOCAL_RANK"], got["LOCAL_WORLD_SIZE"], got["NODE_RANK"],
            got["GROUP_WORLD_SIZE"], got["MASTER_ADDR"]) == ("6", "8", "2", "4", "1", "2", "x4000c0s0b0n0")
    r = run_cli("env", env=env)
    assert r.returncode == 0, r.stderr
    lines = {line.split("=", 1)[0].strip(): line for line in r.stdout.splitlines() if "<-" in line}
    assert lines["WORLD_SIZE"].endswith(
        f"<- 2 distinct host(s) in PBS_NODEFILE={nodefile} x PALS_LOCAL_SIZE=4 (PALS with PMIx exports no "
        f"world size)")
    assert lines["ROLE_WORLD_SIZE"].endswith("x PALS_LOCAL_SIZE=4 (PALS with PMIx exports no world size)")
    assert lines["LOCAL_WORLD_SIZE"].endswith("<- PALS_LOCAL_SIZE=4")


@pytest.mark.parametrize(("drop_nodefile", "nodefile_text", "expect"), [
    (True, "", "PBS_NODEFILE is not set to derive it from"),
    (False, "x4000c0s0b0n0\n" * 4 + "x4000c0s1b0n0\n" * 2, "different slot counts"),
    (False, "", "is empty"),
])
def test_env_and_launch_refuse_in_one_line(tmp_path: Path, drop_nodefile: bool, nodefile_text: str,
                                           expect: str) -> None:
    nodefile = tmp_path / "4321.aurora-pbs"
    nodefile.write_text(nodefile_text)
    script = tmp_path / "never.py"
    script.write_text("print('STARTED')\n")
    env = process_env(pals_env(0, [4, 4]), None if drop_nodefile else nodefile,
                      SLURMLAUNCH_HOSTNAME="x4000c0s0b0n0")
    for args in (("env",), ("launch", str(script))):
        r = run_cli(*args, env=env)
        # `env` is a command (a bad request: 2); `launch` is a rank the launcher refuses (malformed variables: 65)
        assert r.returncode == (2 if args[0] == "env" else 65), (args, r.stdout, r.stderr)
        assert expect in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert "Traceback" not in r.stderr and "STARTED" not in r.stdout
