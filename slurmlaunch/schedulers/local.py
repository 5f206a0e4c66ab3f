"""The local scheduler: emulates a Slurm allocation on this machine.

It starts nodes x tasks-per-node processes with the variables a real srun step sets (SLURM_PROCID,
SLURM_LOCALID, SLURM_NODEID, the step's node list and task counts, SLURMD_NODENAME, ...), so each rank
goes through exactly the launcher path it takes on a cluster. The emulated nodes are named by loopback
addresses (see :func:`node_names`), so every client resolves them and MASTER_ADDR is the first node's, as on a
cluster.

A job runs under a supervisor (supervisor.py): in the submitting process (submit without --wait/--no-wait),
or detached in a session of its own (:func:`start_detached`: --no-wait, --wait, the Python API's jobs), which
no terminal's hang-up or Ctrl-C reaches. Either way the job's record names the supervisor by pid, start time
and boot, so `status`, `logs --follow`, `cancel` and `list` answer from any terminal (:class:`LocalScheduler`),
and a job whose supervisor is gone without writing its end (killed, the machine restarted) reads as ended.
"""

from __future__ import annotations

import functools
import grp
import ipaddress
import itertools
import json
import os
import pwd
import shlex
import shutil
import signal
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Final

from ..allocation.gpus import dev_gpu_ids, visible_gpus
from ..allocation.launch import RETURNED_DIR
from ..allocation.net import HeldPort
from ..allocation.reasons import REASONS_DIR, WARNING_KILLED, Reason, read_first
from ..allocation.script_runner import STACKS_DIR, recorded_exit
from ..allocation.stacks import STOPPED_HEADER, saved_summary
from ..allocation.step_rules import (
    asked_abort_message,
    keeps_asked_code,
    stopped_line,
    wants_requeue,
    warning_code,
    warning_fix,
)
from ..allocation.torchrun_mode import SIGABRT_CODE, aborted_workers, teardown_aborts, teardown_message
from ..core.errors import JobStateError, SchedulerError, SpecError
from ..core.jobfiles import JobFiles
from ..core.parse import signal_number
from ..core.paths import state_dir
from ..core.spec import JobSpec, validate_local
from ..render.launch import launch_command, script_env
from . import JobStatus, Submission, current_umask, make_log_dir, rank_log, write_private, write_record
from .interface import QuickStates
from .local_stepenv import GPU_LISTS, Submitter, step_env
from .supervisor import Outcome, RankProcess, detach, supervise
from .support import Refusals, default, flag, refuse

# Emulated node I is named 127.0.0.1 + I: an address is its own name to every resolver (getaddrinfo, gloo,
# NCCL, `getent hosts`: no /etc/hosts entry or DNS needed, and no root to add one), and on Linux the whole of
# 127.0.0.0/8 is this machine. A client that takes MASTER_ADDR from SLURM_NODELIST itself (idr-torch,
# ignite, Lightning's first-host regex, `scontrol show hostnames`) thus reaches rank 0 here, while the nodes
# keep distinct names; names that resolve nowhere (the former local-node0) hung such clients until the
# rendezvous watchdog stopped them.
FIRST_NODE = 0x7F000001  # 127.0.0.1


@functools.lru_cache(maxsize=4)  # every rank of a step asks
def node_names(nodes: int) -> tuple[str, ...]:
    """The emulated nodes' names, in node order: 127.0.0.1, 127.0.0.2, ... (127.0.1.0 follows 127.0.0.255)."""
    return tuple(str(ipaddress.IPv4Address(FIRST_NODE + i)) for i in range(nodes))


@functools.lru_cache(maxsize=4)
def node_list(nodes: int) -> str:
    """The emulated nodes as Slurm writes a node list: one bracket per /24 (``127.0.0.[1-255],127.0.1.[0-3]``),
    as `scontrol show hostlist` compresses them."""
    terms = []
    for prefix, group in itertools.groupby(node_names(nodes), key=lambda name: name.rsplit(".", 1)[0]):
        last = [name.rsplit(".", 1)[1] for name in group]
        terms.append(f"{prefix}.{last[0]}" if len(last) == 1 else f"{prefix}.[{last[0]}-{last[-1]}]")
    return ",".join(terms)


def gpu_plan(spec: JobSpec, environ: Mapping[str, str]) -> tuple[list[str] | None, str | None]:
    """(the GPUs to hand out, in node order; None: CPU) and a note to print once."""
    if spec.resources.gpus_per_node == 0:
        return None, None
    gpus = visible_gpus(environ)
    need = spec.resources.nodes * spec.resources.gpus_per_node
    if not gpus:
        return None, (f"no GPU on this machine: --gpus-per-node {spec.resources.gpus_per_node} starts "
                      f"{spec.resources.gpus_per_node} ranks per node, and all {spec.world_size} run on the CPU")
    if len(gpus) < need:
        raise SpecError(
            f"--nodes {spec.resources.nodes} --gpus-per-node {spec.resources.gpus_per_node} needs {need} GPUs on this "
            f"machine for the local scheduler, but {len(gpus)} are visible ({','.join(gpus)})"
        )
    return gpus[:need], None


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
    gid = os.getgid()
    try:
        group = grp.getgrgid(gid).gr_name
    except KeyError:  # a gid without a group entry: its number
        group = str(gid)
    return Submitter(user=user, uid=uid, gid=gid, group=group, host=socket.gethostname().split(".")[0],
                     umask=current_umask(), nice=os.getpriority(os.PRIO_PROCESS, 0),
                     node_cpus=_usable_cpus())  # every emulated node is this machine


def rank_env(spec: JobSpec, job_id: str, rank: int, environ: Mapping[str, str],
             gpus: list[str] | None) -> dict[str, str]:
    """The environment a real srun step would give task ``rank`` of ``spec``, on emulated nodes: ``environ``
    without its SLURM_* and SLURMD_* variables, then --env, then the step's variables (local_stepenv.py)."""
    # The emulated step must not mix with a real Slurm job's variables we might be running inside.
    env = {k: v for k, v in environ.items() if not k.startswith(("SLURM_", "SLURMD_"))}
    env.update(script_env(spec))  # --env, --master-port, --rdzv-timeout: what a batch script exports
    env.setdefault("SLURMLAUNCH_ALLOW_LOOPBACK", "1")  # every emulated node is this machine, a loopback address
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("TMPDIR", "/tmp")  # slurmd's TmpFS default, unless the submitter had one
    env["PWD"] = spec.program.workdir  # the batch script's `cd` exported it; the caller's may be another directory
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
    nodes = list(node_names(spec.resources.nodes))
    env.update(step_env(spec, job_id, rank, nodes, node_list(spec.resources.nodes), submitter(), gpus))
    if spec.resources.exclusive and machine:
        # an --exclusive job holds every GPU of its node even when its step asked for none (the step sees none)
        env["SLURM_JOB_GPUS"] = ",".join(machine)
    return env


def rank_processes(spec: JobSpec, job_id: str, environ: Mapping[str, str], tag: str | None = None,
                   extra_env: Mapping[str, str] | None = None, point: list[str] | None = None) -> list[RankProcess]:
    """The processes of one (emulated) srun step; ``tag`` names the log files (default: the job id)."""
    gpus, _ = gpu_plan(spec, environ)
    argv = [*launch_command(spec), *(point or [])]
    if spec.environment.setup:
        # --setup lines are shell by design; the command itself reaches exec as argv, unparsed.
        argv = ["bash", "-c", "\n".join(spec.environment.setup) + '\nexec "$@"', "slurmlaunch-setup", *argv]
    tasks = spec.resources.nodes * spec.slurm_tasks_per_node
    return [RankProcess(rank, argv, {**rank_env(spec, job_id, rank, environ, gpus), **(extra_env or {})},
                        rank_log(spec, tag or job_id, rank), spec.program.workdir, spec.log_unit)
            for rank in range(tasks)]


def elements(spec: JobSpec, base: int) -> list[tuple[str, str, dict[str, str], list[str]]]:
    """An array's elements as (log tag, job id, array variables, sweep arguments), in index order; like
    Slurm, element n of array job J gets job id J + n (so each derives its own MASTER_PORT)."""
    indices = spec.array_indices
    shared = {"SLURM_ARRAY_JOB_ID": str(base), "SLURM_ARRAY_TASK_COUNT": str(len(indices)),
              "SLURM_ARRAY_TASK_MIN": str(indices[0]), "SLURM_ARRAY_TASK_MAX": str(indices[-1])}
    return [(f"{base}_{index}", str(base + n), {**shared, "SLURM_ARRAY_TASK_ID": str(index)},
             spec.sweep_points[index] if spec.arrays.sweep else []) for n, index in enumerate(indices)]


def dry_run(spec: JobSpec, environ: Mapping[str, str]) -> str:
    lines = [f"# local job {spec.name!r}: logs in {spec.log_dir}"]
    if spec.time_limit_seconds is not None:
        warned = f"; SIG{spec.warning[0]} to every rank {spec.warning[1]}s before" if spec.warning else ""
        lines.append(f"# time limit {spec.resources.time} ({spec.time_limit_seconds}s)"
                     f"{warned or '; no warning signal'}")
    if spec.preemption.requeue:
        lines.append(f"# requeued on the warning or exit code 128+signal, at most {spec.preemption.max_requeues} "
                     f"time(s)")
    if spec.environment.stage_env:
        lines.append(f"# {NOTHING_TO_STAGE}")
    steps = elements(spec, 1000) if spec.is_array else [("<job id>", "<job id>", {}, [])]
    for tag, job_id, extra, point in steps:
        if spec.is_array:
            at_once = "" if spec.arrays.max_parallel is None else f"; --max-parallel {spec.arrays.max_parallel} is kept"
            lines.append(f"# array element {tag} (one after another{at_once})")
        for r in rank_processes(spec, job_id, environ, tag, extra, point):
            asked = {k for k, _ in spec.environment.env}
            emulated = {k: v for k, v in r.env.items() if k.startswith(("SLURM", "CUDA_", "MASTER_")) or k in asked}
            lines.append(f"# rank {r.rank}: " + " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(emulated.items())))
            if spec.launch.mode != "torchrun":
                lines.append(f"# rank {r.rank} reads: {_distributed_shown(r.env)}")
            lines.append(shlex.join(r.argv))
    if spec.launch.mode == "torchrun":
        lines.append("# each node's torchrun sets its workers' RANK, LOCAL_RANK and WORLD_SIZE (c10d rendezvous on "
                     "the first node)")
    return "\n".join(lines) + "\n"


_SHOWN_DIST = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT",
               "OMP_NUM_THREADS")


def _distributed_shown(env: Mapping[str, str]) -> str:
    """The torch variables the launcher will export from a rank's emulated Slurm variables (what the rank's
    script reads: RANK, WORLD_SIZE, MASTER_ADDR...), as the launcher maps them (core.detect). MASTER_PORT,
    unless it was given, is a port free when the job starts (run_job), shown as such."""
    from ..allocation.launch import context
    from ..core.detect import detect
    from ..core.errors import SlurmLaunchError

    seen = []
    for job_id in ("1", "2"):  # two ids: a port that follows the job id differs between them
        given = {**env, "SLURM_JOB_ID": job_id, "SLURM_JOBID": job_id}
        try:
            dist = detect(given, context())
        except SlurmLaunchError as e:
            return f"(not known before the job runs: {e})"
        seen.append(dist.exports(given))
    shown = {k: seen[0][k] for k in _SHOWN_DIST if k in seen[0]}
    if "MASTER_PORT" in shown and seen[0]["MASTER_PORT"] != seen[1]["MASTER_PORT"]:
        shown["MASTER_PORT"] = "<a free port, when the job starts>"
    return " ".join(f"{k}={shlex.quote(v)}" for k, v in shown.items())


def aborted_ranks(spec: JobSpec, procs: list[RankProcess], result: Outcome) -> list[int]:
    """Ranks killed by SIGABRT: by their exit code, or in torchrun mode by the failure summary torchrun wrote
    into its node's log."""
    if spec.launch.mode != "torchrun":
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


ID_FILE = "local-job-ids"
STATES_BY_SIGNAL = {signal.SIGINT: "CANCELLED", signal.SIGTERM: "CANCELLED", signal.SIGHUP: "CANCELLED"}


def write_end(log_dir: str, tag: str, code: int, state: str) -> None:
    """The job's (or element's) exit file, "CODE\\nSTATE", which :func:`job_status` reads: written once, at the end."""
    write_private(JobFiles(log_dir, tag).exit_code, f"{code}\n{state}\n", exclusive=True)


def allocate_ids(count: int, environ: Mapping[str, str]) -> int:
    """The first of ``count`` consecutive local job ids, unique for this user: a counter kept under an
    exclusive lock in the state directory (so concurrent submitters, in any PID namespace, never get the
    same id) that never falls below the current Unix time. Ids are therefore above any Slurm job id
    (MaxJobId is at most 67,043,328), so `status ID` never confuses a local job with a Slurm one, and they do
    not restart at 1 when the state directory is new."""
    import fcntl

    directory = state_dir(environ)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    fd = os.open(os.path.join(directory, ID_FILE), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        text = os.read(fd, 64).decode("ascii", "replace").strip()
        last = int(text) if text.isdigit() and len(text) < 20 else 0
        first = max(last + 1, int(time.time()))
        os.lseek(fd, 0, os.SEEK_SET)
        os.ftruncate(fd, 0)
        os.write(fd, f"{first + count - 1}\n".encode())
    finally:
        os.close(fd)  # closing releases the lock
    return first


def _claim(spec: JobSpec, count: int, environ: Mapping[str, str], argv: list[str]) -> tuple[str, str]:
    """(job id, record path): a fresh id whose record this call created, and no file of that id already in
    the output directory (a record left by another state directory, say): no job's files are ever shared."""
    for _ in range(50):
        job_id = str(allocate_ids(count, environ))
        try:
            record = write_record(spec, job_id, "local", argv, {"supervisor": supervisor_entry(os.getpid())},
                                  exclusive=True)
        except FileExistsError:
            continue
        stem = JobFiles(spec.log_dir, job_id).stem
        taken = [n for n in os.listdir(spec.log_dir) if n.startswith((f"{stem}.", f"{stem}_"))]
        if taken == [os.path.basename(record)]:
            return job_id, record
        os.unlink(record)
    raise SpecError(f"--output-dir {spec.log_dir!r}: could not find an unused job id there after 50 tries")


def process_identity(pid: int) -> dict[str, int] | None:
    """A process's pid with its start time (clock ticks after boot, /proc/PID/stat field 22): together they
    name the process even after the pid is reused."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return {"pid": pid, "start": int(fields[19])}
    except (OSError, IndexError, ValueError):
        return None


def boot_id() -> str:
    """This boot's id (Linux: /proc/sys/kernel/random/boot_id); "" where there is none. A start time counts
    from the boot, so after a restart an early process may have the same pid and start time as a recorded one."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def supervisor_entry(pid: int) -> dict[str, object] | None:
    """What a record keeps of the process that supervises a job: its identity, this boot, when it started."""
    identity = process_identity(pid)
    if identity is None:
        return None
    return {**identity, "boot": boot_id(), "started": time.time()}


def supervisor_alive(entry: object) -> bool:
    """Whether the supervisor a record names still runs: the same pid with the same start time, in the same
    boot (a pid alone is reused)."""
    if not isinstance(entry, dict) or not isinstance(entry.get("pid"), int) or \
            not isinstance(entry.get("start"), int):
        return False
    if entry.get("boot") and entry["boot"] != boot_id():
        return False
    try:
        with open(f"/proc/{entry['pid']}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return fields[0] != b"Z" and int(fields[19]) == entry["start"]  # a zombie has ended
    except (OSError, IndexError, ValueError):
        return False


def _say(text: str) -> None:
    """A line on stderr, which may be a terminal that has gone (a hang-up): then nothing."""
    try:
        sys.stderr.write(f"slurmlaunch: {text}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def end_state(outcome: Outcome) -> str:
    """Slurm's word for how a step ended."""
    if outcome.interrupted_by is not None:
        return STATES_BY_SIGNAL.get(signal.Signals(outcome.interrupted_by), "CANCELLED")
    if outcome.timed_out:
        return "TIMEOUT"
    return "COMPLETED" if outcome.exit_code == 0 else "FAILED"


def _warning(spec: JobSpec) -> tuple[int, float] | None:
    if spec.warning is None or spec.time_limit_seconds is None:
        return None
    name, seconds = spec.warning
    return signal_number(name), float(seconds)


def stopped_first(result: Outcome, reasons_dir: str) -> tuple[Outcome, Reason | None]:
    """The outcome as the batch script would report it: when a rank failed and slurmlaunch had stopped a
    rank itself (a refusal, the rendezvous time-out), the earliest such rank is the first failure and its
    documented code the job's; a rank the watchdog stopped died by SIGTERM, and its 143 says nothing."""
    if result.first_failed_rank is None:
        return result, None
    stopped = read_first(reasons_dir)
    if stopped is None:
        return result, None
    rank = stopped.rank if stopped.rank is not None else result.first_failed_rank
    return replace(result, exit_code=stopped.code, first_failed_rank=rank), stopped


def asked_before_abort(what: str, spec: JobSpec, result: Outcome, stopped: Reason | None,
                       files: JobFiles) -> Outcome:
    """The outcome with the first failing rank counted as exiting 128 + the warning signal ("saved, requeue
    me") when its script asked for that code (the RUNNER's exit mark) and torch then aborted it in its
    teardown: the request is not lost to the abort (the batch script has the same rule)."""
    rank = result.first_failed_rank
    if spec.warning is None or spec.launch.mode == "torchrun" or stopped is not None or rank is None \
            or result.codes.get(rank) != SIGABRT_CODE:
        return result
    code = warning_code(spec.warning[0])
    if not keeps_asked_code(recorded_exit(files.exit_mark(rank)), code, True):
        return result
    _say(f"{what}: {asked_abort_message(rank, code)}")
    return replace(result, exit_code=code, codes={**result.codes, rank: code},
                   signaled={r: n for r, n in result.signaled.items() if r != rank})


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:  # a real-time signal has no name of its own
        return f"signal {number}"


def _node_of(spec: JobSpec, index: int) -> str:
    """The emulated node of rank ``index`` (of node ``index`` in torchrun mode, whose unit is a node)."""
    per_node = 1 if spec.launch.mode == "torchrun" else spec.slurm_tasks_per_node
    return node_names(spec.resources.nodes)[min(index // max(per_node, 1), spec.resources.nodes - 1)]


def _report(what: str, spec: JobSpec, result: Outcome, stopped: Reason | None = None) -> tuple[str, str] | None:
    """Say how the run ended; returns the first-failure line, if a rank failed: as said, and as the job's failure
    file keeps it (the batch step's words, with the rank's node: allocation/step_rules.read_failure reads both)."""
    failure = filed = None
    if result.interrupted_by is not None:
        name = signal.Signals(result.interrupted_by).name
        why = "the terminal or session closed" if result.interrupted_by == signal.SIGHUP else "you or the system"
        _say(f"{what}: stopped by {name} ({why}); every rank was stopped (exit code {result.exit_code})")
    elif result.timed_out:
        _say(f"{what}: reached its time limit (--time {spec.resources.time}); the ranks were stopped (state TIMEOUT)")
    elif stopped is not None:
        others = f"; the other {spec.log_unit}s were stopped" if len(result.codes) > 1 else ""
        filed = stopped_line(stopped.who(), result.exit_code, stopped.text, others, bool(others))
        failure = f"{what}: {filed}"
    elif result.first_failed_rank is not None:
        others = "; the other ranks were stopped" if len(result.codes) > 1 else ""
        # as the batch script says it under Slurm: a signal that ended the rank is named
        number = result.signaled.get(result.first_failed_rank)
        how = f" (killed by {_signal_name(number)})" if number and result.exit_code == 128 + number else ""
        rank = result.first_failed_rank
        words = (f"failed with exit code {result.exit_code}{how}" if not others else
                 f"failed first with exit code {result.exit_code}{how}{others}")
        failure = f"{what}: {spec.log_unit} {rank} {words}"
        filed = f"{spec.log_unit} {rank} on {_node_of(spec, rank)} {words}"
    if failure:
        _say(failure)
    if result.console_lost:
        _say(f"{what}: the console went away during the run; every {spec.log_unit}'s whole output is in "
             f"{spec.log_dir}")
    return (failure, filed) if failure and filed else None


def count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def start_timeline(directory: str) -> dict[str, str]:
    """As the batch step's start_timeline: a fresh directory for the ranks' start-up moments and this run's
    own two (both now: the local scheduler has no batch shell, and this process may be the API's, started long
    before); the variable to give the ranks."""
    from ..allocation.timeline import TIMELINE_DIR, batch_started

    shutil.rmtree(directory, ignore_errors=True)
    try:
        os.makedirs(directory, mode=0o700)
    except OSError:
        return {}
    batch_started({TIMELINE_DIR: directory}, time.time_ns())
    return {TIMELINE_DIR: directory}


def _step_ranks(spec: JobSpec, environ: Mapping[str, str], tag: str, step_job: str, extra: dict[str, str],
                point: list[str], restarts: int) -> tuple[list[RankProcess], JobFiles, HeldPort | None]:
    """One run's rank processes, with fresh directories for the launcher's "script returned" marks and
    for why slurmlaunch stopped a rank, and the MASTER_PORT held for them (None: the user's or the spec's)."""
    files = JobFiles(spec.log_dir, tag)
    os.makedirs(files.returned, mode=0o750, exist_ok=True)
    shutil.rmtree(files.reasons, ignore_errors=True)
    os.makedirs(files.reasons, mode=0o700)
    shutil.rmtree(files.stacks, ignore_errors=True)  # kept after the job (the stacks saved at a stop), not a run
    os.makedirs(files.stacks, mode=0o700)
    step_env = {**extra, RETURNED_DIR: files.returned, REASONS_DIR: files.reasons, STACKS_DIR: files.stacks,
                **start_timeline(files.timeline)}
    held = None
    if spec.environment.master_port is None and "MASTER_PORT" not in environ:
        # Every emulated node is this machine, so a port free here now, not one derived from the job id: local
        # ids are unique per user and follow the clock, and two users' (or two state directories') jobs
        # started in the same second would derive the same port and join each other's rendezvous.
        # Held by this process until the run ends (net.HeldPort: why), so no other bind(0) draws it first.
        held = HeldPort()
        step_env["MASTER_PORT"] = str(held.port)
    if restarts:
        step_env["SLURM_RESTART_COUNT"] = str(restarts)
    try:
        ranks = rank_processes(spec, step_job, environ, tag, step_env, point)
    except BaseException:
        if held is not None:
            held.close()
        raise
    if restarts:  # a requeued run goes on in the same logs, as Slurm's does
        ranks = [replace(r, log_append=True) for r in ranks]
    return ranks, files, held


def _run_once(spec: JobSpec, environ: Mapping[str, str], grace: float, warning: tuple[int, float] | None,
              what: str, step: tuple[str, str, dict[str, str], list[str]],
              restarts: int) -> tuple[Outcome, tuple[str, str] | None, bool]:
    """One run of an element: (its outcome, the failure line as said and as filed, whether the ranks saved for a
    requeue)."""
    tag, step_job, extra, point = step
    _say(f"{what}: {count(spec.world_size, 'rank')} on {count(spec.resources.nodes, 'emulated node')} "
         f"{node_list(spec.resources.nodes)}; logs in {spec.log_dir}")
    if spec.environment.stage_env and not restarts:
        _say(f"{what}: {NOTHING_TO_STAGE}")
    ranks, files, held = _step_ranks(spec, environ, tag, step_job, extra, point, restarts)
    try:
        result = supervise(ranks, grace=grace, time_limit=spec.time_limit_seconds, warning=warning)
    finally:
        if held is not None:
            held.close()
    result, stopped = stopped_first(result, files.reasons)
    result = asked_before_abort(what, spec, result, stopped, files)
    shutil.rmtree(files.reasons, ignore_errors=True)
    # the warning's number, whether the timer sends it (a time limit) or it comes from outside (a preemption,
    # `kill -USR2` of the supervisor, which passes it on)
    named = signal_number(spec.warning[0]) if spec.warning is not None else None
    killed = sorted(r for r, number in result.signaled.items() if named is not None and number == named)
    if killed and result.interrupted_by is None and result.first_failed_rank in killed:
        result = replace(result, exit_code=WARNING_KILLED)  # not the 128 + N that asks for a requeue
    failure = _report(what, spec, result, stopped)
    if result.exit_code != 0:  # a stop (fail-fast, the time limit, a signal): where the ranks were
        lines = saved_summary(files.stacks)
        if lines:
            _say(f"{what}: {STOPPED_HEADER} (every thread in {files.stacks}):")
            for line in lines:
                _say(f"  {line}")
    for rank in teardown_aborts(aborted_ranks(spec, ranks, result), files.returned):
        _say(f"{what}: {teardown_message(rank)}")
    shutil.rmtree(files.returned, ignore_errors=True)
    if killed and spec.warning is not None and result.interrupted_by is None:
        _say(f"{what}: {spec.log_unit}(s) {', '.join(map(str, killed))} killed by "
             f"SIG{spec.warning[0]}, the warning signal: " + warning_fix(spec.warning[0], spec.preemption.requeue))
    # a rank that died of the warning signal had no handler for it and saved nothing
    saved = named is not None and wants_requeue(result.warned, result.exit_code, bool(killed), 128 + named)
    return result, failure, saved


def _run_element(spec: JobSpec, environ: Mapping[str, str], grace: float, warning: tuple[int, float] | None,
                 what: str, step: tuple[str, str, dict[str, str], list[str]]) -> Outcome:
    """An element's runs (again after the warning with --requeue, up to --max-requeues), its files left as
    the batch script leaves them: the exit code and state, the failure line (for `logs --follow`, --wait)."""
    restarts = 0
    while True:
        result, failure, saved = _run_once(spec, environ, grace, warning, what, step, restarts)
        if spec.preemption.requeue and saved and result.interrupted_by is None:
            if restarts < spec.preemption.max_requeues:
                restarts += 1
                _say(f"{what}: requeued (restart {restarts} of at most {spec.preemption.max_requeues})")
                continue
            _say(f"{what}: not requeued: already requeued {restarts} time(s) (--max-requeues "
                 f"{spec.preemption.max_requeues})")
        break
    files = JobFiles(spec.log_dir, step[0])
    write_end(spec.log_dir, step[0], result.exit_code, end_state(result))
    if failure:
        write_private(files.failure, f"slurmlaunch: {failure[1]}\n", exclusive=True)
    return result


def _array_summary(job_id: str, steps: Sequence[tuple[str, str, dict[str, str], list[str]]],
                   ended: Sequence[tuple[str, Outcome]]) -> None:
    _say(f"array job {job_id}: {len(ended)} of {len(steps)} element(s) ran")
    for tag, done in ended:
        _say(f"  {tag}: {end_state(done)} {done.exit_code}")
    for tag, _, _, _ in steps[len(ended):]:
        _say(f"  {tag}: CANCELLED (not started)")


def claim(spec: JobSpec, environ: Mapping[str, str], command: Sequence[str] | None = None) -> tuple[str, str]:
    """(job id, record path): the job's id claimed, its record written (naming this process as its
    supervisor) and its line added to the index, so that `status`, `list` and `cancel` know it at once.
    ``command``: what runs the job, for the record (default: rank 0's command line)."""
    make_log_dir(spec.log_dir)
    count = len(spec.array_indices) if spec.is_array else 1
    first_point = spec.sweep_points[spec.array_indices[0]] if spec.arrays.sweep else []
    argv = list(command) if command is not None else \
        list(rank_processes(spec, "0", environ, "0", None, first_point)[0].argv)
    job_id, record = _claim(spec, count, environ, argv)
    from .index import remember

    remember(job_id, "local", record, spec.name)
    return job_id, record


def run(spec: JobSpec, environ: Mapping[str, str], grace: float = 10.0,
        claimed: str | None = None) -> tuple[str, Outcome]:
    """Run the job under a supervisor in this process (an array's elements one after another); returns (job
    id, outcome): an array's is its first failing element's, in index order. ``claimed``: the id
    :func:`claim` gave it (a detached job's); else one is claimed here. Like Slurm: --time stops the ranks at
    the limit, after the warning signal; with --requeue a run that got the warning, or whose ranks exited
    with 128 + its number, runs again (SLURM_RESTART_COUNT), at most --max-requeues times."""
    _, note = gpu_plan(spec, environ)
    job_id = claimed if claimed is not None else claim(spec, environ)[0]
    steps = elements(spec, int(job_id)) if spec.is_array else [(job_id, job_id, {}, [])]
    if note:
        _say(note)
    warning = _warning(spec)
    outcome: Outcome | None = None
    ended: list[tuple[str, Outcome]] = []
    for step in steps:
        tag, point = step[0], step[3]
        what = f"array element {tag}" + (f" ({shlex.join(point)})" if point else "") if spec.is_array else \
            f"local job {job_id}"
        result = _run_element(spec, environ, grace, warning, what, step)
        ended.append((tag, result))
        if outcome is None or (outcome.exit_code == 0 and result.exit_code != 0) or result.interrupted_by:
            outcome = result
        if result.interrupted_by is not None:
            break  # a stop ends the whole job, the elements not yet run included
    assert outcome is not None
    if spec.is_array:
        _array_summary(job_id, steps, ended)
        write_end(spec.log_dir, job_id, outcome.exit_code, end_state(outcome))
    return job_id, outcome


DETACHED_COMMAND = "local-job"  # the hidden command a detached job's supervisor runs (cli.py: NAME-job, job_main)


def start_detached(spec: JobSpec, environ: Mapping[str, str]) -> str:
    """Start the job detached (:func:`detach_job`) and return its id."""
    return detach_job(spec, environ)[0]


def detach_job(spec: JobSpec, environ: Mapping[str, str]) -> tuple[str, str]:
    """Start the job under a supervisor of its own (``python -m slurmlaunch local-job``) and return its id at
    once. The supervisor runs in a session of its own (no terminal: a hang-up or Ctrl-C there does not reach
    it), with stdin from /dev/null, the ranks' output in their logs and its own messages in the job's batch
    log; it is not this process's to wait for, so this process may end (the submitting shell, the Python
    interpreter that called slurmlaunch.submit, too). Returns (its id, its record's path)."""
    import pickle

    _, note = gpu_plan(spec, environ)  # a refusal before anything is written
    if note:
        _say(note)  # here too: its supervisor says it in the batch log
    if spec.environment.stage_env:
        _say(NOTHING_TO_STAGE)  # the same: said where the user is, not only in the batch log
    job_id, record = claim(spec, environ)
    pid = detach([sys.executable, "-m", "slurmlaunch", DETACHED_COMMAND, record], environ,
                 pickle.dumps((spec, job_id)), JobFiles(spec.log_dir, job_id).batch_log)
    name_supervisor(record, pid)
    return job_id, record


def name_supervisor(record: str, pid: int) -> None:
    """Write process ``pid`` into the job's record as the one that supervises it."""
    from .index import read_bounded

    data = json.loads(read_bounded(record).decode("utf-8"))
    data["supervisor"] = supervisor_entry(pid)
    write_private(record, json.dumps(data, indent=2) + "\n")


def detached_main(argv: Sequence[str]) -> int:
    """The detached supervisor (``slurmlaunch local-job RECORD``, started by :func:`start_detached`): reads the
    job from stdin, then runs it as the foreground one runs, with stdin on /dev/null."""
    import pickle

    data = sys.stdin.buffer.read()
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    try:
        spec, job_id = pickle.loads(data)
    except Exception as e:  # the submitter went away before it sent the job: nothing ran
        _say(f"local job {' '.join(argv)}: its submitter sent no job ({type(e).__name__}); nothing ran")
        return 2
    _, outcome = run(spec, os.environ, claimed=job_id)
    return outcome.exit_code


def _read_record(log_dir: str, job_id: str) -> dict[str, object]:
    from .index import read_bounded

    path = JobFiles(log_dir, job_id).record
    try:
        data = json.loads(read_bounded(path).decode("utf-8"))
    except (OSError, ValueError) as e:
        raise JobStateError(f"job {job_id}: its record {path!r} cannot be read ({e})") from None
    if not isinstance(data, dict):
        raise JobStateError(f"job {job_id}: {path!r} is not a slurmlaunch job record")
    return data


def _ended(log_dir: str, tag: str) -> tuple[int, str, float] | None:
    """(exit code, state, when) from the exit file the supervisor writes at a job's (or element's) end."""
    path = JobFiles(log_dir, tag).exit_code
    try:
        with open(path, "rb") as f:
            words = f.read(4096).decode().split()
        code = int(words[0])
        return code, words[1] if len(words) > 1 else ("COMPLETED" if code == 0 else "FAILED"), os.stat(path).st_mtime
    except (OSError, ValueError, IndexError, UnicodeDecodeError):
        return None


def _elapsed(seconds: float) -> str:
    """As sacct shows it: [D-]HH:MM:SS."""
    days, rest = divmod(max(0, int(seconds)), 86400)
    h, rest = divmod(rest, 3600)
    m, s = divmod(rest, 60)
    return f"{days}-{h:02d}:{m:02d}:{s:02d}" if days else f"{h:02d}:{m:02d}:{s:02d}"


LOST_NOTE = ("lost: its supervisor (pid {pid}) is gone without recording how the job ended: killed, or this "
             "machine restarted")


def job_status(job_id: str, log_dir: str | None, indices: Sequence[int] = ()) -> JobStatus:
    """A local job's (or array element's, ``ID_INDEX``) state, from its files: the exit file once it has
    ended; RUNNING while the supervisor its record names runs (the same pid and start time, this boot);
    else FAILED without an exit code, "lost" (its processes are gone: nothing can run it any more)."""
    base, _, element = job_id.partition("_")
    if log_dir is None:
        raise JobStateError(f"job {job_id}: the local scheduler answers from the job's files, and their "
                            f"directory is not known")
    record = _read_record(log_dir, base)
    saved = record.get("spec") if isinstance(record.get("spec"), dict) else {}
    assert isinstance(saved, dict)
    nodes = node_list(int(saved.get("nodes") or 1))
    entry = record.get("supervisor")
    running = supervisor_alive(entry)
    started = entry.get("started") if isinstance(entry, dict) else None
    ended = _ended(log_dir, base)
    note = None
    if ended is not None:
        code: int | None
        code, state, at = ended
    elif running:
        state, code, at = "RUNNING", None, time.time()
    else:
        pid = entry.get("pid") if isinstance(entry, dict) else "?"
        state, code, at, note = "FAILED", None, None, LOST_NOTE.format(pid=pid)
    elapsed = _elapsed(at - started) if isinstance(started, (int, float)) and at is not None else None
    if element or indices:
        sweep = tuple((k, tuple(v)) for k, v in saved.get("sweep", ()))
        array = JobSpec.of(script="", array=saved.get("array"), sweep=sweep).array_indices
        words = _element_states(log_dir, base, array, state)
        if element:
            if element not in words:
                raise JobStateError(f"job {base} has no array element {element}")
            word, _, shown = words[element].partition(" ")
            return JobStatus(word, int(shown) if shown.isdigit() else None, nodes if word == "RUNNING" else None,
                             elapsed=elapsed if word == "RUNNING" else None, note=note)
        return JobStatus(state, code, nodes, words, elapsed, note)
    return JobStatus(state, code, nodes, None, elapsed, note)


def _element_states(log_dir: str, base: str, indices: Sequence[int], job_state: str) -> dict[str, str]:
    """A local array's elements, index -> "STATE CODE" or "STATE". They run one after another: while the
    job runs, the first without an exit file is RUNNING and the rest PENDING; elements a stopped job never
    reached are CANCELLED."""
    out: dict[str, str] = {}
    running_seen = False
    for index in indices:
        ended = _ended(log_dir, f"{base}_{index}")
        if ended is not None:
            out[str(index)] = f"{ended[1]} {ended[0]}"
        elif job_state == "RUNNING":
            out[str(index)] = "PENDING" if running_seen else "RUNNING"
            running_seen = True
        else:
            out[str(index)] = "CANCELLED" if job_state == "CANCELLED" else "FAILED (no exit code recorded)"
    return out


def cancel(job_id: str, log_dir: str | None) -> str:
    """SIGTERM to the job's supervisor (checked by pid, start time and boot), which stops every rank as a
    stop signal does (SIGTERM, SIGKILL after the grace) and records the job CANCELLED."""
    base, _, element = job_id.partition("_")
    if element:
        raise JobStateError(f"job {job_id}: the local scheduler runs an array's elements one after another under "
                            f"one supervisor: cancel the whole job, slurmlaunch cancel {base}")
    if log_dir is None:
        raise JobStateError(f"job {job_id}: the directory of its files is not known")
    entry = _read_record(log_dir, base).get("supervisor")
    if not supervisor_alive(entry):
        raise JobStateError(f"job {job_id} does not run (its supervisor is gone)")
    assert isinstance(entry, dict)
    try:
        os.kill(entry["pid"], signal.SIGTERM)
    except ProcessLookupError:
        raise JobStateError(f"job {job_id} does not run (its supervisor has just ended)") from None
    return job_id


NOTHING_TO_STAGE = ("--stage-env: nothing to stage (the local scheduler's ranks run on this machine, from the "
                    "environment as it is)")
_NO_QUEUE = ("the local scheduler has no queue to submit to: it starts the job at once, on this machine "
             "(slurmlaunch submit --scheduler local)")


# What the local scheduler cannot carry out (schedulers/support.py).
REFUSALS = Refusals(not_carried_out={
    "constraint": "the local scheduler has one kind of node, this machine: no features to ask for (leave "
                  "it out, or --scheduler slurm)",
    "sbatch_args": "there is no batch script to add directives to (leave it out, or --scheduler slurm/pbs)",
    "container_image": "it uses Slurm's pyxis plugin through srun (use --apptainer IMAGE here)",
    "pbs_flavour": "it is for PBS (leave it out, or --scheduler pbs)",
    "mpi": "it chooses how PBS's mpiexec or Slurm's srun starts MPI ranks, and the local scheduler offers "
           "MPI no PMI (leave it out, or --scheduler slurm/pbs)",
    "pbs_resources": "it is a PBS site resource (leave it out, or --scheduler pbs)",
    "pbs_chunk": "it is a PBS select-chunk resource (leave it out, or --scheduler pbs)",
    "project": "it is PBS's -P project (leave it out; --account is the account charged)",
    "pbs_request": "it chooses how a PBS job asks for resources (leave it out, or --scheduler pbs)",
    "pbs_queues": "it chooses a PBS queue by node count (leave it out; --partition chooses the partition)",
    "mpiexec_args": "it starts the ranks itself, without mpiexec (leave it out, or --scheduler pbs)",
})
# What the local scheduler shows the tasks as Slurm would (SLURM_MEM_PER_NODE, SLURM_JOB_PARTITION, ...) but
# cannot reserve or enforce on one machine: said in one line at submission, never silently.
SHOWN_NOT_ENFORCED = ("mem", "partition", "account", "qos", "exclusive", "gpu_flag")


def shown_not_enforced(spec: JobSpec) -> list[str]:
    """The options of ``spec`` (as "--flag value") the local scheduler only shows its tasks."""
    out = []
    for name in SHOWN_NOT_ENFORCED:
        value = spec.value(name)
        if value != default(name) and value not in (None, False):
            out.append(flag(name) if value is True else f"{flag(name)} {value}")
    return out


def not_enforced_note(spec: JobSpec) -> str | None:
    """The line said at submission (the CLI's and the Python API's) when ``spec`` asks for what the local
    scheduler only shows its tasks (:func:`shown_not_enforced`); None when it asks for none of it."""
    shown = shown_not_enforced(spec)
    if not shown:
        return None
    return (f"the local scheduler shows {', '.join(shown)} to the tasks as Slurm would (SLURM_* variables) but "
            f"reserves and enforces nothing on this machine")


def _no_template(template_dir: str | None) -> None:
    if template_dir is not None:
        raise SpecError("--template-dir: the local scheduler renders no batch script (leave it out, or "
                        "--scheduler slurm/pbs)")


class LocalScheduler:
    """The local scheduler as a :class:`~.interface.Scheduler`: it renders its plan (--dry-run) and runs a job
    with :func:`run` or :func:`start_detached`; there is no queue to submit to, but a job's state comes from
    its files and its supervisor (:func:`job_status`), and cancel signals that supervisor."""

    name: Final = "local"
    title: Final = "the local scheduler"
    client: Final = None
    queued: Final = False
    readers: Final = ("read_slurm",)  # its ranks get a Slurm step's variables (local_stepenv.py)
    refusals: Final = REFUSALS
    script_suffix: Final = ""
    warning_signal: Final = True
    rank_requeue: Final = None  # Lightning's scontrol cannot reach it: it requeues itself
    gpu_request_styles: Final = ()  # no site to learn from: --gpu-flag is only shown to the tasks
    shared_output: Final = None
    lists_in_one_call: Final = False
    submitit_executor: Final = "local"
    job_id_variable: Final = None
    exports_environment: Final = True  # its ranks are this shell's children
    doctor_checks: Final = None

    def available(self) -> bool:
        return True

    def auto_check(self) -> tuple[bool, str]:
        return True, ""  # the fallback: this machine is always there

    def refuse_unsupported(self, spec: JobSpec, origins: Mapping[str, str] | None = None) -> None:
        refuse(spec, self.name, self.refusals, origins)

    def parse_job_id(self, out: str) -> str | None:
        return out if out.isdigit() else None

    def command_id(self, out: str) -> str:
        return out

    def quick_states(self, job_ids: Sequence[str] | None) -> QuickStates:
        raise SchedulerError(_NO_QUEUE)

    def queue_states(self, job_ids: Sequence[str]) -> dict[str, str] | None:
        return None  # no queue: a job's state is its supervisor's record (status)

    def output_log(self, log_dir: str, job: str, printed_id: str) -> str | None:
        return None  # rank 0's

    def render(self, spec: JobSpec, template_dir: str | None = None) -> str:
        _no_template(template_dir)
        return dry_run(spec, os.environ)

    def submit_command(self, spec: JobSpec, script_path: str) -> list[str]:
        raise SchedulerError(_NO_QUEUE)

    def submit(self, spec: JobSpec, script_text: str) -> Submission:
        """No queue: the job starts at once, detached, under its own supervisor (:func:`detach_job`; there is
        no batch script, ``script_text`` is not used). The Python API's local jobs start here."""
        job_id, record = detach_job(spec, os.environ)
        started = (f"started local job {job_id} ({count(spec.world_size, 'rank')} on "
                   f"{count(spec.resources.nodes, 'emulated node')}), detached; logs in {spec.log_dir}")
        return Submission(job_id, "", record, [sys.executable, "-m", "slurmlaunch", DETACHED_COMMAND, record],
                          note=started, files_id=job_id, log_dir=spec.log_dir)

    def refuse_here(self, spec: JobSpec, template_dir: str | None) -> None:
        _no_template(template_dir)
        if spec.containers.apptainer and not shutil.which("apptainer"):
            raise SpecError("--apptainer: apptainer is not on PATH on this machine (install it, or leave out "
                            "--apptainer for the local scheduler)")
        validate_local(spec)  # before the ranks (or the dry run's lines) are built

    def start_notes(self, spec: JobSpec) -> list[str]:
        note = not_enforced_note(spec)
        return [note] if note else []

    def run_here(self, spec: JobSpec) -> int:
        return int(run(spec, os.environ)[1].exit_code)

    def job_main(self, argv: Sequence[str]) -> int:
        return detached_main(argv)

    def status(self, job_id: str, log_dir: str | None, indices: Sequence[int] = ()) -> JobStatus:
        return job_status(job_id, log_dir, indices)

    def cancel(self, job_id: str, log_dir: str | None = None) -> str:
        return cancel(job_id, log_dir)

    def resubmissions(self, job_id: str, log_dir: str) -> list[str]:
        return []  # its requeue (--requeue, locally) keeps the job's id

    def rank_log(self, spec: JobSpec, job_id: str, rank: int) -> str | None:
        return None if spec.is_array else rank_log(spec, job_id, rank)

    def batch_log(self, spec: JobSpec, job_id: str) -> str | None:
        path = JobFiles(spec.log_dir, job_id).batch_log  # a detached job's supervisor writes it
        return path if os.path.exists(path) else None

    def node_commands(self, job_id: str, nodes: str, argv: Sequence[str]) -> dict[str, list[str]]:
        return {}  # every emulated node is this machine: `slurmlaunch stacks` signals the ranks itself


    def identity(self, job_id: str) -> dict[str, str] | None:
        return None  # its jobs are told apart by their supervisor's pid and start time (app/jobs/commands.py)

    def cluster(self) -> dict[str, str]:
        return {}


EDGE = LocalScheduler()
