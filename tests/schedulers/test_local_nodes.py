"""The local scheduler's emulated nodes are reachable by their names: a client that reads the node list
itself (idr-torch, ignite, Lightning, `scontrol show hostnames`) resolves every name, binds its own and
reaches rank 0 at the first one, as it would on a cluster.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from slurmlaunch.core import hostlist
from slurmlaunch.schedulers.local import node_list, node_names
from tests.helpers import run_cli

COUNTS = [1, 2, 3, 10, 255, 256, 257, 300, 1000]


@pytest.mark.parametrize("nodes", COUNTS)
def test_node_list_expands_to_the_names_in_order(nodes: int) -> None:
    names = list(node_names(nodes))
    assert len(set(names)) == nodes and names[0] == "127.0.0.1"
    assert hostlist.expand(node_list(nodes)) == names
    assert hostlist.count(node_list(nodes)) == nodes and hostlist.first_host(node_list(nodes)) == "127.0.0.1"


def test_node_list_is_compressed_as_scontrol_does(tmp_path: Path) -> None:
    """`scontrol show hostlist` (no controller needed: a two-line slurm.conf) is the oracle."""
    if shutil.which("scontrol") is None:
        pytest.skip("scontrol not installed (slurm-client)")
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=x\nSlurmctldHost=localhost\n")
    env = {"SLURM_CONF": str(conf), "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C"}
    for nodes in COUNTS:
        r = subprocess.run(["scontrol", "show", "hostlist", ",".join(node_names(nodes))], env=env,
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and r.stdout.strip() == node_list(nodes), (nodes, r.stdout, r.stderr)


@pytest.mark.parametrize("nodes", [2, 300])
def test_every_name_resolves_to_this_machine_and_binds(nodes: int) -> None:
    for name in node_names(nodes):
        infos = socket.getaddrinfo(name, 0, type=socket.SOCK_STREAM)
        assert {info[4][0] for info in infos} == {name}
        with socket.socket() as s:
            s.bind((name, 0))  # EADDRNOTAVAIL unless the address is this machine's


# A client that takes nothing from slurmlaunch but MASTER_PORT: it reads the Slurm node list the ways clients
# do, checks every name, binds its own node's name, and rendezvous at the first node by name.
CLIENT = r"""
import os, re, socket, sys
import hostlist
import torch
import torch.distributed as dist

nodes = hostlist.expand_hostlist(os.environ["SLURM_JOB_NODELIST"])  # idr-torch's and many scripts' way
assert hostlist.expand_hostlist(os.environ["SLURM_NODELIST"]) == nodes
assert hostlist.expand_hostlist(os.environ["SLURM_STEP_NODELIST"]) == nodes
first_by_regex = re.sub(r"\[([^,\-\]]*)[^\]]*\]", r"\1", os.environ["SLURM_JOB_NODELIST"]).split(",")[0]  # Lightning's
assert first_by_regex == nodes[0], (first_by_regex, nodes)
for name in nodes:
    socket.getaddrinfo(name, None)
me = os.environ["SLURMD_NODENAME"]
assert me == nodes[int(os.environ["SLURM_NODEID"])], (me, nodes)
with socket.socket() as s:
    s.bind((me, 0))  # this node's name is an address of the machine the rank runs on
rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
dist.init_process_group("gloo", init_method=f"tcp://{nodes[0]}:{os.environ['MASTER_PORT']}", rank=rank,
                        world_size=world)
t = torch.tensor([rank + 1.0])
dist.all_reduce(t)
print(f"client rank {rank} on {me} of {nodes}: sum {t.item():g}", flush=True)
dist.destroy_process_group()
"""


def test_a_client_rendezvous_at_the_first_node_by_name(tmp_path: Path, torch_available: None) -> None:
    pytest.importorskip("hostlist")
    (tmp_path / "client.py").write_text(CLIENT)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "MASTER_"))}
    r = run_cli("submit", "--scheduler", "local", "--nodes", "2", "--tasks-per-node", "2", "--rdzv-timeout", "120",
                "client.py", env=env, cwd=tmp_path, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    for rank, node in enumerate(["127.0.0.1", "127.0.0.1", "127.0.0.2", "127.0.0.2"]):
        assert f"client rank {rank} on {node} of ['127.0.0.1', '127.0.0.2']: sum 10" in r.stdout, r.stdout
