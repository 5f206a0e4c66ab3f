"""The local scheduler: emulates a Slurm allocation on this machine.

It starts nodes x tasks-per-node processes with the variables a real srun step sets (SLURM_PROCID,
SLURM_LOCALID, SLURM_NODEID, the step's node list and task counts, SLURMD_NODENAME, ...), so each rank
goes through exactly the launcher path it takes on a cluster. The emulated node names do not resolve,
so MASTER_ADDR is 127.0.0.1 unless the user set one. It runs in the foreground (as if --wait).
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from collections.abc import Mapping

from ..errors import SpecError
from ..gpus import visible_gpus
from ..launch import RETURNED_DIR
from ..spec import JobSpec
from ..supervisor import Outcome, RankProcess, supervise
from ..torchrun_mode import SIGABRT_CODE, aborted_workers, teardown_aborts, teardown_message
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
    tpn = spec.slurm_tasks_per_node
    ntasks = str(spec.nodes * tpn)
    node, local = divmod(rank, tpn)
    nodelist = node_list(spec.nodes)
    counts = str(tpn) if spec.nodes == 1 else f"{tpn}(x{spec.nodes})"
    env.update({
        "SLURM_JOB_ID": job_id, "SLURM_JOBID": job_id, "SLURM_STEP_ID": "0", "SLURM_STEPID": "0",
        "SLURM_JOB_NAME": spec.name, "SLURM_NTASKS": ntasks,
        "SLURM_STEP_NUM_TASKS": ntasks, "SLURM_NNODES": str(spec.nodes),
        "SLURM_JOB_NUM_NODES": str(spec.nodes), "SLURM_STEP_NUM_NODES": str(spec.nodes),
        "SLURM_NODELIST": nodelist, "SLURM_JOB_NODELIST": nodelist, "SLURM_STEP_NODELIST": nodelist,
        "SLURM_TASKS_PER_NODE": counts, "SLURM_STEP_TASKS_PER_NODE": counts,
        "SLURM_SUBMIT_DIR": spec.workdir, "SLURMLAUNCH_SCHEDULER": "local",
        "SLURM_NODEID": str(node), "SLURMD_NODENAME": f"{NODE_PREFIX}{node}",
        "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(local),
    })
    if spec.slurm_cpus_per_task is not None:
        env["SLURM_CPUS_PER_TASK"] = str(spec.slurm_cpus_per_task)
    if gpus is not None:
        mine = gpus[node * spec.gpus_per_node:(node + 1) * spec.gpus_per_node]
        env.update(CUDA_VISIBLE_DEVICES=",".join(mine), SLURM_GPUS_ON_NODE=str(len(mine)))
    return env


def rank_processes(spec: JobSpec, job_id: str, environ: Mapping[str, str], tag: str | None = None,
                   extra_env: Mapping[str, str] | None = None, point: list[str] | None = None) -> list[RankProcess]:
    """The processes of one (emulated) srun step; ``tag`` names the log files (default: the job id)."""
    gpus, _ = gpu_plan(spec, environ)
    argv = [*launch_command(spec), *(point or [])]
    if spec.setup:
        # --setup lines are shell by design; the command itself reaches exec as argv, unparsed.
        argv = ["bash", "-c", "\n".join(spec.setup) + '\nexec "$@"', "slurmlaunch-setup", *argv]
    tasks = spec.nodes * spec.slurm_tasks_per_node
    return [RankProcess(rank, argv, {**rank_env(spec, job_id, rank, environ, gpus), **(extra_env or {})},
                        rank_log(spec, tag or job_id, rank), spec.workdir, spec.log_unit) for rank in range(tasks)]


def elements(spec: JobSpec, base: int) -> list[tuple[str, str, dict[str, str], list[str]]]:
    """An array's elements as (log tag, job id, array variables, sweep arguments), in index order; like
    Slurm, element n of array job J gets job id J + n (so each derives its own MASTER_PORT)."""
    indices = spec.array_indices
    shared = {"SLURM_ARRAY_JOB_ID": str(base), "SLURM_ARRAY_TASK_COUNT": str(len(indices)),
              "SLURM_ARRAY_TASK_MIN": str(indices[0]), "SLURM_ARRAY_TASK_MAX": str(indices[-1])}
    return [(f"{base}_{index}", str(base + n), {**shared, "SLURM_ARRAY_TASK_ID": str(index)},
             spec.sweep_points[index] if spec.sweep else []) for n, index in enumerate(indices)]


def dry_run(spec: JobSpec, environ: Mapping[str, str]) -> str:
    lines = []
    steps = elements(spec, 1000) if spec.is_array else [("<job id>", "<job id>", {}, [])]
    for tag, job_id, extra, point in steps:
        if spec.is_array:
            lines.append(f"# array element {tag} (one after another)")
        for r in rank_processes(spec, job_id, environ, tag, extra, point):
            emulated = {k: v for k, v in r.env.items() if k.startswith(("SLURM", "CUDA_", "MASTER_"))}
            lines.append(f"# rank {r.rank}: " + " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(emulated.items())))
            lines.append(shlex.join(r.argv))
    return "\n".join(lines) + "\n"


def aborted_ranks(spec: JobSpec, procs: list[RankProcess], result: Outcome) -> list[int]:
    """Ranks killed by SIGABRT: by their exit code, or in torchrun mode by the failure summary torchrun wrote
    into its node's log."""
    if spec.mode != "torchrun":
        return [rank for rank, code in sorted(result.codes.items()) if code == SIGABRT_CODE]
    ranks: set[int] = set()
    for p in procs:
        if result.codes.get(p.rank, 0) != 0 and p.log_path:
            try:
                with open(p.log_path, encoding="utf-8", errors="replace") as f:
                    ranks.update(aborted_workers(f.read()))
            except OSError:
                pass
    return sorted(ranks)


def run(spec: JobSpec, environ: Mapping[str, str], grace: float = 10.0) -> tuple[str, Outcome]:
    """Run the job in the foreground (an array's elements one after another); returns (job id, outcome):
    an array's is its first failing element's, in index order."""
    _, note = gpu_plan(spec, environ)
    job_id = str(os.getpid())
    make_log_dir(spec.log_dir)
    steps = elements(spec, int(job_id)) if spec.is_array else [(job_id, job_id, {}, [])]
    tag0, job0, extra0, point0 = steps[0]
    record = write_record(spec, job_id, "local", rank_processes(spec, job0, environ, tag0, extra0, point0)[0].argv)
    from ..jobs import remember

    remember(job_id, "local", record, spec.name)
    if note:
        sys.stderr.write(f"slurmlaunch: {note}\n")
    outcome: Outcome | None = None
    for tag, step_job, extra, point in steps:
        what = f"array element {tag}" + (f" ({shlex.join(point)})" if point else "") if spec.is_array else \
            f"local job {job_id}"
        sys.stderr.write(f"slurmlaunch: {what}: {spec.world_size} rank(s) on {spec.nodes} emulated "
                         f"node(s) {node_list(spec.nodes)}; logs in {spec.log_dir}\n")
        returned = os.path.join(spec.log_dir, f"job-{tag}.returned")  # the launcher's "script returned" marks
        os.makedirs(returned, exist_ok=True)
        procs = rank_processes(spec, step_job, environ, tag, {**extra, RETURNED_DIR: returned}, point)
        result = supervise(procs, grace=grace)
        write_private(os.path.join(spec.log_dir, f"job-{tag}.exitcode"), f"{result.exit_code}\n")
        if result.first_failed_rank is not None:
            sys.stderr.write(f"slurmlaunch: {what}: {spec.log_unit} {result.first_failed_rank} failed first with "
                             f"exit code {result.exit_code}; the other ranks were stopped\n")
        for rank in teardown_aborts(aborted_ranks(spec, procs, result), returned):
            sys.stderr.write(f"slurmlaunch: {what}: {teardown_message(rank)}\n")
        shutil.rmtree(returned, ignore_errors=True)
        if outcome is None or (outcome.exit_code == 0 and result.exit_code != 0):
            outcome = result
    assert outcome is not None
    if spec.is_array:
        write_private(os.path.join(spec.log_dir, f"job-{job_id}.exitcode"), f"{outcome.exit_code}\n")
    return job_id, outcome
