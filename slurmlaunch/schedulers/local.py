"""The local scheduler: emulates a Slurm allocation on this machine.

It starts nodes x tasks-per-node processes with the variables a real srun step sets (SLURM_PROCID,
SLURM_LOCALID, SLURM_NODEID, the step's node list and task counts, SLURMD_NODENAME, ...), so each rank
goes through exactly the launcher path it takes on a cluster. The emulated node names do not resolve,
so MASTER_ADDR is 127.0.0.1 unless the user set one. It runs in the foreground (as if --wait).
"""

from __future__ import annotations

import functools
import os
import pwd
import shlex
import socket
import sys
from collections.abc import Mapping

from ..errors import SpecError
from ..gpus import dev_gpu_ids, visible_gpus
from ..spec import JobSpec
from ..stepenv import GPU_LISTS, Submitter, step_env
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


def _umask() -> int:
    try:  # Linux >= 4.7 shows it without changing it
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _usable_cpus() -> int:
    if hasattr(os, "sched_getaffinity"):  # Linux: the CPUs this process may run on, as a cgroup'd node's
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


@functools.lru_cache(maxsize=1)
def submitter() -> Submitter:
    """This process as sbatch would record its caller, and this machine as the emulated nodes' size (read
    once: every rank of a step shares it)."""
    uid = os.getuid()
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:  # a uid without a passwd entry (containers): Slurm would refuse it; keep the number
        user = str(uid)
    return Submitter(user=user, uid=uid, gid=os.getgid(), host=socket.gethostname().split(".")[0],
                     umask=_umask(), nice=os.getpriority(os.PRIO_PROCESS, 0),
                     node_cpus=_usable_cpus())  # every emulated node is this machine


def rank_env(spec: JobSpec, job_id: str, rank: int, environ: Mapping[str, str],
             gpus: list[str] | None) -> dict[str, str]:
    """The environment a real srun step would give task ``rank`` of ``spec``, on emulated nodes: ``environ``
    without its SLURM_* and SLURMD_* variables, then --env, then the step's variables (slurmlaunch.stepenv)."""
    # The emulated step must not mix with a real Slurm job's variables we might be running inside.
    env = {k: v for k, v in environ.items() if not k.startswith(("SLURM_", "SLURMD_"))}
    env.update(spec.env)
    env.setdefault("MASTER_ADDR", "127.0.0.1")
    env.setdefault("SLURMLAUNCH_ALLOW_LOOPBACK", "1")  # every emulated node is this machine
    if spec.master_port is not None:
        env["MASTER_PORT"] = str(spec.master_port)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("TMPDIR", "/tmp")  # slurmd's TmpFS default, unless the submitter had one
    env["PWD"] = spec.workdir  # the batch script's `cd` exported it; the caller's may be another directory
    env["SLURMLAUNCH_SCHEDULER"] = "local"
    for name in GPU_LISTS:  # Slurm unsets them in a step without GPUs, or sets them all below
        env.pop(name, None)
    machine: list[str] = []
    if gpus is None:
        here = dev_gpu_ids()
        machine = visible_gpus(environ) if "CUDA_VISIBLE_DEVICES" in environ else here
        if machine or here:
            # stands in for the device cgroup of a real node: a step without GPUs cannot use this machine's
            env["CUDA_VISIBLE_DEVICES"] = ""
    nodes = [f"{NODE_PREFIX}{i}" for i in range(spec.nodes)]
    env.update(step_env(spec, job_id, rank, nodes, node_list(spec.nodes), submitter(), gpus))
    if spec.exclusive and machine:
        # an --exclusive job holds every GPU of its node even when its step asked for none (the step sees none)
        env["SLURM_JOB_GPUS"] = ",".join(machine)
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
        result = supervise(rank_processes(spec, step_job, environ, tag, extra, point), grace=grace)
        write_private(os.path.join(spec.log_dir, f"job-{tag}.exitcode"), f"{result.exit_code}\n")
        if result.first_failed_rank is not None:
            sys.stderr.write(f"slurmlaunch: {what}: {spec.log_unit} {result.first_failed_rank} failed first with "
                             f"exit code {result.exit_code}; the other ranks were stopped\n")
        if outcome is None or (outcome.exit_code == 0 and result.exit_code != 0):
            outcome = result
    assert outcome is not None
    if spec.is_array:
        write_private(os.path.join(spec.log_dir, f"job-{job_id}.exitcode"), f"{outcome.exit_code}\n")
    return job_id, outcome
