"""The local scheduler: emulates a Slurm allocation on this machine.

It starts nodes x tasks-per-node processes with the variables a real srun step sets (SLURM_PROCID,
SLURM_LOCALID, SLURM_NODEID, the step's node list and task counts, SLURMD_NODENAME, ...), so each rank
goes through exactly the launcher path it takes on a cluster. The emulated node names do not resolve,
so MASTER_ADDR is 127.0.0.1 unless the user set one. It runs in the foreground (as if --wait).
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Mapping

from ..errors import SpecError
from ..gpus import visible_gpus
from ..spec import JobSpec
from ..supervisor import Outcome, RankProcess, supervise
from . import make_log_dir, rank_log, write_private, write_record
from .slurm import launch_command

NODE_PREFIX = "local-node"


def node_list(nodes: int) -> str:
    return f"{NODE_PREFIX}0" if nodes == 1 else f"{NODE_PREFIX}[0-{nodes - 1}]"


def gpu_plan(spec: JobSpec, environ: Mapping[str, str]) -> tuple[list[str] | None, str | None]:
    """(the GPUs to hand out, in node order; None: CPU) and a note to print once."""
    if spec.gpus_per_node == 0:
        return None, None
    gpus = visible_gpus(environ)
    need = spec.nodes * spec.gpus_per_node
    if not gpus:
        return None, (f"no GPU on this machine: the {spec.world_size} ranks run on the CPU "
                      f"(the example falls back to gloo)")
    if len(gpus) < need:
        raise SpecError(
            f"--nodes {spec.nodes} --gpus-per-node {spec.gpus_per_node} needs {need} GPUs on this machine "
            f"for the local scheduler, but {len(gpus)} are visible ({','.join(gpus)})"
        )
    return gpus[:need], None


def rank_env(spec: JobSpec, job_id: str, rank: int, environ: Mapping[str, str],
             gpus: list[str] | None) -> dict[str, str]:
    """The environment a real srun step would give task ``rank`` of ``spec``, on emulated nodes."""
    # The emulated step must not mix with a real Slurm job's variables we might be running inside.
    env = {k: v for k, v in environ.items() if not k.startswith(("SLURM_", "SLURMD_"))}
    env.update(spec.env)
    env.setdefault("MASTER_ADDR", "127.0.0.1")
    env.setdefault("SLURMLAUNCH_ALLOW_LOOPBACK", "1")  # every emulated node is this machine
    if spec.master_port is not None:
        env["MASTER_PORT"] = str(spec.master_port)
    env.setdefault("PYTHONUNBUFFERED", "1")
    tpn = spec.ntasks_per_node
    node, local = divmod(rank, tpn)
    nodelist = node_list(spec.nodes)
    counts = str(tpn) if spec.nodes == 1 else f"{tpn}(x{spec.nodes})"
    env.update({
        "SLURM_JOB_ID": job_id, "SLURM_JOBID": job_id, "SLURM_STEP_ID": "0", "SLURM_STEPID": "0",
        "SLURM_JOB_NAME": spec.name, "SLURM_NTASKS": str(spec.world_size),
        "SLURM_STEP_NUM_TASKS": str(spec.world_size), "SLURM_NNODES": str(spec.nodes),
        "SLURM_JOB_NUM_NODES": str(spec.nodes), "SLURM_STEP_NUM_NODES": str(spec.nodes),
        "SLURM_NODELIST": nodelist, "SLURM_JOB_NODELIST": nodelist, "SLURM_STEP_NODELIST": nodelist,
        "SLURM_TASKS_PER_NODE": counts, "SLURM_STEP_TASKS_PER_NODE": counts,
        "SLURM_SUBMIT_DIR": spec.workdir, "SLURMLAUNCH_SCHEDULER": "local",
        "SLURM_NODEID": str(node), "SLURMD_NODENAME": f"{NODE_PREFIX}{node}",
        "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(local),
    })
    if spec.per_task_cpus is not None:
        env["SLURM_CPUS_PER_TASK"] = str(spec.per_task_cpus)
    if gpus is not None:
        mine = gpus[node * spec.gpus_per_node:(node + 1) * spec.gpus_per_node]
        env.update(CUDA_VISIBLE_DEVICES=",".join(mine), SLURM_GPUS_ON_NODE=str(len(mine)))
    return env


def rank_processes(spec: JobSpec, job_id: str, environ: Mapping[str, str]) -> list[RankProcess]:
    gpus, _ = gpu_plan(spec, environ)
    argv = launch_command(spec)
    if spec.setup:
        # --setup lines are shell by design; the command itself reaches exec as argv, unparsed.
        argv = ["bash", "-c", "\n".join(spec.setup) + '\nexec "$@"', "slurmlaunch-setup", *argv]
    return [RankProcess(rank, argv, rank_env(spec, job_id, rank, environ, gpus), rank_log(spec, job_id, rank),
                        spec.workdir) for rank in range(spec.world_size)]


def dry_run(spec: JobSpec, environ: Mapping[str, str]) -> str:
    lines = []
    for r in rank_processes(spec, "<job id>", environ):
        emulated = {k: v for k, v in r.env.items() if k.startswith(("SLURM", "CUDA_", "MASTER_"))}
        lines.append(f"# rank {r.rank}: " + " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(emulated.items())))
        lines.append(shlex.join(r.argv))
    return "\n".join(lines) + "\n"


def run(spec: JobSpec, environ: Mapping[str, str], grace: float = 10.0) -> tuple[str, Outcome]:
    """Run the job in the foreground; returns (job id, outcome)."""
    _, note = gpu_plan(spec, environ)
    job_id = str(os.getpid())
    make_log_dir(spec.log_dir)
    ranks = rank_processes(spec, job_id, environ)
    record = write_record(spec, job_id, "local", ranks[0].argv)
    from ..jobs import remember

    remember(job_id, "local", record, spec.name)
    if note:
        sys.stderr.write(f"slurmlaunch: {note}\n")
    sys.stderr.write(f"slurmlaunch: local job {job_id}: {spec.world_size} rank(s) on {spec.nodes} emulated "
                     f"node(s) {node_list(spec.nodes)}; logs in {spec.log_dir}\n")
    outcome = supervise(ranks, grace=grace)
    write_private(os.path.join(spec.log_dir, f"job-{job_id}.exitcode"), f"{outcome.exit_code}\n")
    if outcome.first_failed_rank is not None:
        sys.stderr.write(f"slurmlaunch: rank {outcome.first_failed_rank} failed first with exit code "
                         f"{outcome.exit_code}; the other ranks were stopped\n")
    return job_id, outcome
