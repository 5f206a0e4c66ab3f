"""PALS under PBS with PMIx: ranks the launcher starts with the world it derives from the node file form one
torch gloo world (the derivation itself: tests/core/test_pals.py, in the unit layer)."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

from tests.core.test_pals import pals_env, process_env

ALLREDUCE = """
import json, os, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
print("RESULT " + json.dumps({k: os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK",
      "MASTER_ADDR")} | {"sum": int(t.item()), "world": dist.get_world_size()}), flush=True)
dist.barrier()
dist.destroy_process_group()
"""


def test_launch_pmix_ranks_rendezvous_with_the_derived_world(tmp_path: Path, torch_available: None) -> None:
    """2 "nodes" x 2 ranks with PMIx-only PALS variables, each a real launcher process exec'ing a gloo
    all_reduce: the derived WORLD_SIZE is one that torch's rendezvous completes with. The first host is
    named localhost so that MASTER_ADDR (the node file's first host) resolves without a private /etc/hosts."""
    script = tmp_path / "allreduce.py"
    script.write_text(ALLREDUCE)
    nodefile = tmp_path / "4321.aurora-pbs"
    nodefile.write_text("localhost\nnode2\n")  # Aurora's shape: one line per node
    with socket.socket() as s:  # a free port, not the one derived from the job id: other suites run here
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    try:
        for rank in range(4):
            env = process_env(pals_env(rank, [2, 2]), nodefile, SLURMLAUNCH_HOSTNAME=("localhost", "node2")[rank // 2],
                              SLURMLAUNCH_RDZV_TIMEOUT="150", OMP_NUM_THREADS="1", MASTER_PORT=str(port))
            procs.append(subprocess.Popen([sys.executable, "-m", "slurmlaunch", "launch", str(script)], env=env,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                                          start_new_session=True))
        deadline = time.monotonic() + 240  # one bound for all four (torch imports are slow on a loaded machine)
        outputs = [p.communicate(timeout=max(1.0, deadline - time.monotonic())) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)  # only the processes this test started
                p.wait(timeout=30)
    for p, (out, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, out + err
    results = sorted((json.loads(m) for out, _ in outputs for m in re.findall(r"RESULT (\{.*?\})", out)),
                     key=lambda x: int(x["RANK"]))
    assert [(x["RANK"], x["LOCAL_RANK"], x["NODE_RANK"]) for x in results] == [
        ("0", "0", "0"), ("1", "1", "0"), ("2", "0", "1"), ("3", "1", "1")]
    assert {(x["WORLD_SIZE"], x["world"], x["sum"], x["MASTER_ADDR"]) for x in results} == {("4", 4, 10, "localhost")}
