"""A real mpirun (Open MPI) starts the launcher as two emulated PBS nodes of two ranks each, which form one
torch gloo world (the mapping itself: tests/core/test_mpi.py, in the unit layer)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from slurmlaunch.core.detect import derive_port
from tests.core.test_mpi import NODEFILE
from tests.helpers import launch_job_id, skip_or_fail

ALLREDUCE = """
import json, os, socket, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
print("RESULT " + json.dumps({k: os.environ[k] for k in ("RANK", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE",
      "MASTER_ADDR", "MASTER_PORT")} | {"sum": int(t.item()), "host": os.environ["SLURMLAUNCH_HOSTNAME"]}),
      flush=True)
dist.barrier()  # leaving without these lets a rank's gloo teardown abort while a peer still uses it
dist.destroy_process_group()
"""


def test_real_mpirun_two_nodes_two_ranks_gloo(tmp_path: Path, torch_available: None) -> None:
    if shutil.which("mpirun") is None:
        skip_or_fail("Open MPI's mpirun is not installed (apt-get install openmpi-bin)")
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        skip_or_fail("node names are made to resolve with a private /etc/hosts (unshare --mount): needs root")
    script = tmp_path / "allreduce.py"
    script.write_text(ALLREDUCE)
    nodefile = tmp_path / "PBS_NODEFILE"
    nodefile.write_text(NODEFILE)
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 localhost node1 node2\n")
    # One MPI world of 4 ranks; each app context (-x applies per context) plays one "node" of the emulated
    # PBS nodefile.
    job = launch_job_id(2)  # its MASTER_PORT: this worker's own, not every session's on the machine
    contexts: list[str] = []
    for node in ("node1", "node2"):
        contexts += [":"] if contexts else []
        contexts += ["-np", "2", "-x", f"PBS_JOBID={job}.pbs-server", "-x", f"PBS_NODEFILE={nodefile}",
                     "-x", "SLURMLAUNCH_ALLOW_LOOPBACK=1", "-x", f"SLURMLAUNCH_HOSTNAME={node}", "-x", "PATH",
                     "-x", "OMP_NUM_THREADS=1", "-x", "SLURMLAUNCH_RDZV_TIMEOUT=60",
                     sys.executable, "-m", "slurmlaunch", "launch", str(script)]
    mpirun = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--host", "localhost:4", *contexts]
    inner = f"mount --bind {hosts} /etc/hosts && exec \"$@\""
    p = subprocess.Popen(["unshare", "--mount", "--", "sh", "-c", inner, "sh", *mpirun], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, cwd=tmp_path, start_new_session=True)
    try:
        out, err = p.communicate(timeout=180)
    finally:
        try:
            os.killpg(p.pid, 9)  # nothing of this test outlives it, even when it failed
        except ProcessLookupError:
            pass
    assert p.returncode == 0, out + err
    r = subprocess.CompletedProcess(p.args, p.returncode, out, err)
    # mpirun may join lines of several ranks: take each {...} that follows RESULT
    results = sorted((json.loads(m) for m in re.findall(r"RESULT (\{.*?\})", r.stdout)), key=lambda x: int(x["RANK"]))
    assert [(x["RANK"], x["LOCAL_RANK"], x["NODE_RANK"], x["host"]) for x in results] == [
        ("0", "0", "0", "node1"), ("1", "1", "0", "node1"), ("2", "0", "1", "node2"), ("3", "1", "1", "node2")]
    assert {(x["MASTER_ADDR"], x["MASTER_PORT"], x["WORLD_SIZE"], x["sum"]) for x in results} == {
        ("node1", str(derive_port(job, 0)), "4", 10)}
