"""Which node list a task of a step reads, asked of the real Slurm: in a one-node step of a two-node job,
srun sets SLURM_STEP_NODELIST to the step's node and SLURM_JOB_NODELIST and SLURM_NODELIST (its older name,
sbatch(1)) both to the job's; core.detect.read_slurm, which the launcher and torchrun mode share, takes the
step's node as rank 0's."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from slurmlaunch.allocation.torchrun_mode import parse, torchrun_command
from slurmlaunch.core.detect import Context, read_slurm
from slurmlaunch.core.errors import EnvironmentMappingError
from slurmlaunch.core.hostlist import expand


@pytest.mark.slurm
def test_a_step_on_the_second_node_reads_its_own_node_list(cluster_env: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "env"
    # -r1: the step starts on the job's second node, so the step's first node is not the job's
    subprocess.run(["sbatch", "--wait", "-N2", "-o", str(tmp_path / "job.out"), "--wrap",
                    f"srun -N1 -n1 -r1 env -0 > {out}"], env=cluster_env, check=True, capture_output=True,
                   timeout=120)
    env = dict(item.split("=", 1) for item in out.read_text().split("\0") if "=" in item)
    env = {k: v for k, v in env.items() if not k.startswith("MASTER_")}
    job_nodes = expand(env["SLURM_JOB_NODELIST"])
    assert len(job_nodes) == 2 and env["SLURM_NODELIST"] == env["SLURM_JOB_NODELIST"], env
    assert env["SLURM_STEP_NODELIST"] == job_nodes[1] == env["SLURMD_NODENAME"] and env["SLURM_NNODES"] == "1"

    step = read_slurm(env, Context())
    assert step is not None and (step.master_addr, step.this_host, step.num_nodes) == (job_nodes[1],) * 2 + (1,)
    values, flags, script = parse(["--nproc-per-node=2", "t.py"])
    cmd, _ = torchrun_command(env, values, flags, script, "/py")
    assert f"--rdzv-endpoint={job_nodes[1]}:{step.master_port}" in cmd and "--rdzv-conf=is_host=1" in cmd
    # Without the step's list the job's is the fallback, whose two hosts the step's node count refuses: one
    # line, not rank 0 placed on a node outside the step.
    without = {k: v for k, v in env.items() if k != "SLURM_STEP_NODELIST"}
    with pytest.raises(EnvironmentMappingError, match="SLURM_JOB_NODELIST="):
        read_slurm(without, Context())
