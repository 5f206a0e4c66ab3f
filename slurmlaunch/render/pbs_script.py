"""The PBS request -> qsub script step (what --dry-run prints): the checks PBS would refuse, the #PBS
directives, mpiexec's flags, the template's context. Pure: no qsub, no files written."""

from __future__ import annotations

import os
import re
import shlex
from typing import Any

from ..core import RESTART_COUNT, __version__
from ..core.errors import SpecError
from ..core.jobfiles import SUBMISSION_MARK, own_dir
from ..core.parse import parse_mem
from ..core.spec import MPI_FLAVOURS, PBS_REQUESTS, UNLIMITED, JobSpec, time_seconds
from .jinja import render
from .launch import batch_step_command, host_python_check, launch_command, script_env

TEMPLATE = "pbs.qsub.j2"


def walltime(time: str) -> str:
    """A time in one of Slurm's formats (as --time takes them, already validated) as PBS's H:MM:SS.

    Slurm's no-limit spellings (UNLIMITED, INFINITE, and 0, which sbatch reads as no limit) are refused:
    PBS has no unlimited walltime, and walltime=0:00:00 would be a limit of nothing, not none. Leaving
    -l walltime out instead would quietly give the queue's default, which the user did not ask for (and
    sites such as ALCF refuse a job without it)."""
    total = time_seconds(time)
    if total is None:
        zero = "" if time.upper() in UNLIMITED else "Slurm reads a time of 0 as no limit, and "
        raise SpecError(f"--time {time}: {zero}PBS has no unlimited walltime (sites such as ALCF require "
                        f"-l walltime); give a time such as 1:00:00, or leave --time out for the queue's default")
    return f"{total // 3600:d}:{total // 60 % 60:02d}:{total % 60:02d}"


# PBS Pro / OpenPBS job names (qsub -N, the Job_Name attribute), as the real OpenPBS 23.06 checks them
# (Libcmds/ck_job_name.c; its qsub refused "a=b", "a,b", "x$(id)" and 231 characters, took "1abc"): at most
# 230 characters (PBS_MAXJOBNAME; the Reference Guide's 236 is not what the server takes), each a letter, a
# digit or one of - _ + . ; the first a letter or digit. Not the older 15-character rule of PBS 12 and Torque.
_JOB_NAME_MAX = 230
_JOB_NAME = re.compile(rf"[A-Za-z0-9][A-Za-z0-9_+.-]{{0,{_JOB_NAME_MAX - 1}}}")
_KEY = r"[A-Za-z_][A-Za-z0-9_.-]*"
_VALUE = r"[^\s'\"#,]+"
_RESOURCE = re.compile(rf"({_KEY})(?:=({_VALUE}))?")
_CHUNK = re.compile(rf"({_KEY})=([^\s'\"#,+:]+)")
_QUEUE = re.compile(r"([A-Za-z0-9_.@-]+):(\d+)-(\d*)")
# What slurmlaunch itself writes into the request: a user's value would contradict it.
_OWN_RESOURCES = {"select": "--nodes and --pbs-chunk", "walltime": "--time", "nodes": "--nodes (Torque)"}
_OWN_TOTALS = {"ncpus": "--cpus-per-task/--cpus-per-gpu", "ngpus": "--gpus-per-node", "mem": "--mem"}
_OWN_CHUNK = {"ncpus": "--cpus-per-task/--cpus-per-gpu", "mpiprocs": "--tasks-per-node",
              "ngpus": "--gpus-per-node", "mem": "--mem"}
# The variable each flavour sets to a subjob's index (PBS Pro -J: PBS_ARRAY_INDEX; Torque -t: PBS_ARRAYID).
ARRAY_INDEX = {"pro": "PBS_ARRAY_INDEX", "torque": "PBS_ARRAYID"}


def job_name(spec: JobSpec) -> str:
    """The name for qsub -N: --job-name as given (check() refused a bad one), else the script's name made
    to fit PBS's rule (any other character to '_', leading characters that are not alphanumeric dropped)."""
    if spec.output.job_name is not None:
        return spec.output.job_name
    name = re.sub(r"[^A-Za-z0-9_+.-]", "_", spec.name)
    name = re.sub(r"^[^A-Za-z0-9]+", "", name)[:_JOB_NAME_MAX]
    return name or "slurmlaunch"


def _pbs_size(mem: str, times: int = 1) -> str:
    """--mem (validated: digits and an optional K/M/G/T; M by default, as Slurm reads it) in PBS's spelling
    (64gb, 4000mb), multiplied by ``times`` in the same unit."""
    number, unit = parse_mem(mem)
    return f"{number * times}{unit.lower()}b"


def queue(spec: JobSpec) -> str | None:
    """--partition, else the first --pbs-queues entry whose node range holds --nodes (check() parsed it)."""
    if spec.resources.partition or not spec.site.pbs_queues:
        return spec.resources.partition
    for item in spec.site.pbs_queues.split(","):
        m = _QUEUE.fullmatch(item.strip(" "))  # spaces after commas; never a newline
        assert m is not None
        low, high = int(m[2]), int(m[3]) if m[3] else None
        if low <= spec.resources.nodes and (high is None or spec.resources.nodes <= high):
            return m[1]
    raise SpecError(f"--nodes {spec.resources.nodes}: no queue of --pbs-queues {spec.site.pbs_queues!r} takes this "
                    f"many nodes (choose a node count one of them takes, or a queue with --partition)")


def array_range(spec: JobSpec) -> str | None:
    """The array's indices for -J (PBS Pro: X-Y[:Z][%N]) or -t (Torque: a list[%N]); None without one."""
    if not spec.is_array:
        return None
    indices = spec.array_indices
    limit = f"%{spec.arrays.max_parallel}" if spec.arrays.max_parallel else ""
    if spec.site.pbs_flavour == "torque":
        return ",".join(map(str, indices)) + limit  # Torque's -t takes lists, but no :step
    first, last = indices[0], indices[-1]
    step = indices[1] - indices[0] if len(indices) > 1 else 1
    shown = spec.array_directive
    if len(indices) < 2:
        raise SpecError(f"--array/--sweep {shown}: a PBS Pro job array needs at least two indices (qsub -J X-Y "
                        f"with X < Y); submit a single point as a plain job, or use --pbs-flavour torque")
    if indices != list(range(first, last + 1, step)):
        raise SpecError(f"--array {shown}: PBS Pro's qsub -J takes one range X-Y[:STEP], so a list maps only when "
                        f"its indices are evenly spaced (1,3 is 1-3:2; 0,4,8 is 0-8:4): submit the others as "
                        f"separate jobs, or use --pbs-flavour torque, whose -t takes any list")
    return f"{first}-{last}" + (f":{step}" if step != 1 else "") + limit


def _check_request(spec: JobSpec) -> None:
    """The job name, walltime and memory as PBS reads them, and how resources are requested."""
    if spec.output.job_name is not None and not _JOB_NAME.fullmatch(spec.output.job_name):
        raise SpecError(f"--job-name {spec.output.job_name!r} is not a PBS job name (at most 230 letters, digits or "
                        f"- _ + ., the first a letter or digit; e.g. {job_name(spec.changed(job_name=None))!r})")
    if not spec.log_dir.isascii():  # qsub -o refuses it ("illegal -o value", then its whole usage text)
        named = "--output-dir" if os.path.isabs(spec.output.output_dir) else \
            f"--output-dir {spec.output.output_dir!r} in"
        raise SpecError(f"{named} {spec.log_dir!r}: qsub takes no output path that is not ASCII (expected an ASCII "
                        f"path: give another --output-dir)")
    if spec.resources.time is not None:
        walltime(spec.resources.time)
    if spec.resources.mem is not None and parse_mem(spec.resources.mem)[0] == 0:  # Slurm: --mem=0 is all of it
        raise SpecError(f"--mem {spec.resources.mem}: Slurm reads 0 as all of a node's memory, PBS as a request for "
                        f"none; leave --mem out (the queue's default) or give a size such as 64G")
    if spec.site.pbs_request not in PBS_REQUESTS:
        raise SpecError(f"--pbs-request {spec.site.pbs_request!r} is not valid (expected select, nodes or totals)")
    if spec.site.pbs_flavour == "torque":
        for shown, given in ((f"--pbs-request {spec.site.pbs_request}", spec.site.pbs_request != "select"),
                             ("--pbs-chunk " + " ".join(spec.site.pbs_chunk), bool(spec.site.pbs_chunk)),
                             (f"--project {spec.site.project}", spec.site.project is not None)):
            if given:
                raise SpecError(f"{shown}: Torque's qsub script asks for -l nodes=N:ppn=C and has no select chunks "
                                f"or -P project (leave it out, or --pbs-flavour pro)")


def _check_resources(spec: JobSpec) -> None:
    """--pbs-resource and --pbs-chunk: well formed, and none that slurmlaunch writes itself."""
    own = dict(_OWN_RESOURCES, **(_OWN_TOTALS if spec.site.pbs_request == "totals" else {}))
    for item in spec.site.pbs_resources:
        m = _RESOURCE.fullmatch(item)
        if not m:
            raise SpecError(f"--pbs-resource {item!r} is not valid (expected KEY or KEY=VALUE without spaces, "
                            f"quotes, '#' or ',', e.g. filesystems=home:eagle, storage=gdata/ab1+scratch/ab1 or wd)")
        if m[1] in own:
            raise SpecError(f"--pbs-resource {item}: slurmlaunch writes {m[1]} itself (use {own[m[1]]})")
    for item in spec.site.pbs_chunk:
        m = _CHUNK.fullmatch(item)
        if not m:
            raise SpecError(f"--pbs-chunk {item!r} is not valid (expected KEY=VALUE without spaces, quotes, ':', "
                            f"'#', ',' or '+', e.g. system=polaris)")
        if m[1] in _OWN_CHUNK:
            raise SpecError(f"--pbs-chunk {item}: slurmlaunch writes {m[1]} itself (use {_OWN_CHUNK[m[1]]})")
    if spec.site.pbs_chunk and spec.site.pbs_request == "totals":
        raise SpecError("--pbs-chunk needs select chunks: it cannot be used with --pbs-request totals "
                        "(use --pbs-resource KEY=VALUE for a job-wide resource)")


def _check_placement(spec: JobSpec) -> None:
    """The project, the queue, mpiexec's flags and the array: where and how the job runs."""
    if spec.site.project is not None and (not spec.site.project or any(c.isspace() for c in spec.site.project)):
        raise SpecError(f"--project {spec.site.project!r} is not valid (expected a non-empty name without spaces)")
    if spec.site.pbs_queues is not None:
        for item in spec.site.pbs_queues.split(","):
            m = _QUEUE.fullmatch(item.strip(" "))  # spaces after commas; never a newline
            if not m or (m[3] and int(m[3]) < int(m[2])):
                raise SpecError(f"--pbs-queues {spec.site.pbs_queues!r} is not valid (expected QUEUE:MIN-MAX entries "
                                f"separated by commas, MAX may be empty: e.g. debug:1-2,prod:10-)")
        queue(spec)
    for arg in spec.site.mpiexec_args:
        if not arg.startswith("-") or "\n" in arg:
            raise SpecError(f"--mpiexec-arg {arg!r} is not valid (expected one mpiexec flag, e.g. --cpu-bind=list:1-8)")
    array_range(spec)


def check(spec: JobSpec) -> None:
    """SpecError for what PBS would refuse or what has no PBS meaning; each message names the value and
    what would be right. Runs before rendering, so --dry-run shows the same refusals as a submission."""
    _check_request(spec)
    _check_resources(spec)
    _check_placement(spec)


def _resource_request(spec: JobSpec) -> list[str]:
    """The -l lines that ask for the nodes, CPUs, GPUs and memory, in the spelling --pbs-request chose."""
    res, site = spec.resources, spec.site
    tpn = spec.ntasks_per_node
    cpus = tpn * (spec.per_task_cpus or 1)
    if site.pbs_flavour == "torque":
        gpus = f":gpus={res.gpus_per_node}" if res.gpus_per_node else ""
        out = [f"-l nodes={res.nodes}:ppn={cpus}{gpus}"]
        if res.mem:  # Torque's mem is the whole job's (qsub(1B), pbs_resources): --mem is per node
            out.append(f"-l mem={_pbs_size(res.mem, res.nodes)}")
        return out
    if site.pbs_request == "totals":  # job-wide amounts, as NCI's Gadi asks for them
        out = [f"-l ncpus={res.nodes * cpus}"]
        if res.gpus_per_node:
            out.append(f"-l ngpus={res.nodes * res.gpus_per_node}")
        if res.mem:
            out.append(f"-l mem={_pbs_size(res.mem, res.nodes)}")
        return out
    chunk = f"select={res.nodes}"
    if site.pbs_request == "select":
        chunk += f":ncpus={cpus}:mpiprocs={tpn}"
        if res.gpus_per_node:
            chunk += f":ngpus={res.gpus_per_node}"
        if res.mem:
            chunk += f":mem={_pbs_size(res.mem)}"
    elif res.mem:
        chunk += f":mem={_pbs_size(res.mem)}"
    chunk += "".join(f":{item}" for item in site.pbs_chunk)
    out = [f"-l {chunk}"]
    if not any(r.split("=", 1)[0] == "place" for r in site.pbs_resources):  # one chunk per node
        out.append("-l place=scatter:excl" if res.exclusive else "-l place=scatter")
    return out


def directives(spec: JobSpec) -> list[str]:
    """The #PBS lines' options, in the order the golden scripts hold them."""
    out = _resource_request(spec)
    if spec.resources.time:
        out.append(f"-l walltime={walltime(spec.resources.time)}")
    out.extend(f"-l {r}" for r in spec.site.pbs_resources)
    chosen = queue(spec)
    if chosen:
        out.append(f"-q {chosen}")
    if spec.resources.account:
        out.append(f"-A {spec.resources.account}")
    if spec.site.project:
        out.append(f"-P {spec.site.project}")
    span = array_range(spec)
    if span is not None:
        out.append(f"-J {span}" if spec.site.pbs_flavour == "pro" else f"-t {span}")
    if spec.preemption.requeue:
        out.append("-r y")  # PBS may rerun the job (node failure, preemption, qrerun); see docs: how-to, PBS
    out.append("-j oe")
    if spec.site.pbs_flavour == "pro":
        # d: written straight into the -o path while the job runs (logs --follow sees it); oe: both streams.
        out.append("-k doe")
    out.extend(spec.site.sbatch_args)
    return out


def _setup_exports(setup: tuple[str, ...]) -> list[str]:
    """Variables the --setup lines export (export A=1 B, declare -x C): Open MPI forwards only those named."""
    names: list[str] = []
    for line in setup:
        for m in re.finditer(r"(?:^|[;&|]\s*)(?:export|declare\s+-x)\s+([^;&|#]*)", line):
            try:  # words as the shell splits them: export A="x y" names A only (not y: mpiexec warned of it)
                words = shlex.split(m[1], comments=True)
            except ValueError:
                words = m[1].split()
            names += [w.split("=", 1)[0] for w in words if re.match(r"^[A-Za-z_]\w*(=|$)", w)]
    return names


def pbs_mpi(spec: JobSpec) -> str:
    """The MPI whose mpiexec starts the ranks: --mpi, else Open MPI."""
    if spec.launch.mpi is not None and spec.launch.mpi not in MPI_FLAVOURS:
        raise SpecError(f"--mpi {spec.launch.mpi} is not valid under PBS (expected one of {', '.join(MPI_FLAVOURS)}: "
                        f"the MPI whose mpiexec starts the ranks)")
    return spec.launch.mpi or "openmpi"


def _tm_agent(spec: JobSpec) -> list[str]:
    """PBS Pro: Open MPI starts its daemons on the other hosts through pbs_tmrsh (allocation.tmrsh), not ssh.
    Debian's Open MPI has no `tm` launcher, and without it mpiexec needs ssh keys between compute nodes and
    its daemons are not the job's (qdel would leave them). A `tm` build never calls the agent. Not with
    --apptainer (the agent runs on the host, where the container's python is not), nor when the user names
    an agent with --mpiexec-arg."""
    if spec.site.pbs_flavour != "pro" or spec.containers.apptainer or \
            any("plm_rsh_agent" in a for a in spec.site.mpiexec_args):
        return []
    # no tree spawn: every daemon from mpiexec's host, where the agent is
    return ["--mca", "plm_rsh_agent", f"{spec.program.python} -m slurmlaunch.allocation.tmrsh",
            "--mca", "plm_rsh_no_tree_spawn", "1"]


def mpiexec_args(spec: JobSpec, env: list[tuple[str, str]]) -> tuple[list[str], str | None]:
    """The flags of the site's MPI, and its hostfile flag (the hostfile itself is $PBS_NODEFILE)."""
    tpn = spec.ntasks_per_node
    extra = list(spec.site.mpiexec_args)
    if pbs_mpi(spec) == "openmpi":
        # Open MPI forwards only the variables named with -x (and warns about unset ones).
        # SLURMLAUNCH_REASONS_DIR: where a rank the launcher stops says why (the script reads it at the end);
        # SLURMLAUNCH_STACKS_DIR: where each rank's runner writes its pid and stacks (`slurmlaunch stacks`).
        # SLURMLAUNCH_RETURNED_DIR: where each rank's runner marks that its script returned (teardown aborts).
        # SLURMLAUNCH_TIMELINE_DIR: where each rank's launcher and runner record its start-up (`timeline`).
        names = ["PBS_NODEFILE", "PBS_JOBID", "PATH", "SLURMLAUNCH_REASONS_DIR", "SLURMLAUNCH_STACKS_DIR",
                 "SLURMLAUNCH_RETURNED_DIR", "SLURMLAUNCH_TIMELINE_DIR",
                 *(k for k, _ in env),
                 *_setup_exports(spec.environment.setup)]
        if spec.is_array:
            names.append(ARRAY_INDEX[spec.site.pbs_flavour])
        if resubmits(spec):  # which run this is (the batch step sets it)
            names.append(RESTART_COUNT)
        forwards = [a for n in dict.fromkeys(names) for a in ("-x", n)]
        return ["-np", str(spec.world_size), "--map-by", f"ppr:{tpn}:node", "--tag-output", *_tm_agent(spec),
                *forwards, *extra], "--hostfile"
    if pbs_mpi(spec) == "mpich":
        return ["-n", str(spec.world_size), "-ppn", str(tpn), "-genvall", "-prepend-rank", *extra], "-f"
    depth = spec.per_task_cpus or 1  # Cray PALS places by its own node list
    bind = [] if any(a.startswith("--cpu-bind") for a in extra) else ["--depth", str(depth), "--cpu-bind", "depth"]
    return ["-n", str(spec.world_size), "--ppn", str(tpn), *bind, "--label", *extra], None


def resubmits(spec: JobSpec) -> bool:
    """Whether --requeue is carried out at the warning too, by the batch step submitting the job's script again
    (PBS lets no job's own user requeue it: qrerun needs operator or manager rights): a PBS Pro job that is not
    an array (an element cannot be submitted again on its own; Torque's chain is not tested). -r y stands
    either way."""
    return spec.preemption.requeue and spec.site.pbs_flavour == "pro" and not spec.is_array


def batch_step_plan(spec: JobSpec) -> list[str]:
    """The batch step's plan (allocation/batch_step.py's options, before its --log-dir and --job): the MPI whose
    lines name a failed rank, the world, the warning signal and when to send it (PBS sends none before the
    walltime: the batch step does, --signal's seconds before --time), the stacks at a stop."""
    plan = ["--outlive-stop", "--mpi", pbs_mpi(spec), "--ranks", str(spec.world_size), "--nodes",
            str(spec.resources.nodes), "--tasks-per-node", str(spec.ntasks_per_node)]
    limit = spec.time_limit_seconds
    if spec.warning and limit is not None:
        plan += ["--warning", spec.warning[0], "--walltime", str(limit), "--warn-before", str(spec.warning[1])]
    elif limit is not None:  # no warning: the walltime still tells a qdel from the walltime's stop
        plan += ["--walltime", str(limit)]
    if resubmits(spec):
        assert spec.warning is not None  # check_warning: --requeue needs one
        if limit is None:  # no warning is sent, but ranks that exit 128 + its number still ask for a requeue
            plan += ["--warning", spec.warning[0]]
        plan += ["--requeue", str(spec.preemption.max_requeues), "--resubmit", job_name(spec)]
    if not spec.container:  # the batch shell runs outside the container, where the ranks' stacks are not said
        plan.append("--stacks")
    if spec.environment.stage_env:
        plan += ["--stage-env", spec.environment.stage_env]
    return plan


def script_context(spec: JobSpec) -> dict[str, Any]:
    check(spec)
    env = script_env(spec)
    args, hostfile_flag = mpiexec_args(spec, env)
    return {
        # a job whose id older files carry has its files in a directory of its own (jobfiles.own_dir)
        "own_dir": own_dir("$log_dir", "${PBS_JOBID%%[.[]*}", SUBMISSION_MARK),
        "version": __version__, "flavour": f"PBS {spec.site.pbs_flavour}", "mpi": pbs_mpi(spec),
        "world_size": spec.world_size, "nodes": spec.resources.nodes, "tasks_per_node": spec.ntasks_per_node,
        "directives": directives(spec), "setup": list(spec.environment.setup), "env": env, "log_dir": spec.log_dir,
        "workdir": spec.program.workdir, "mpiexec_args": args, "hostfile_flag": hostfile_flag,
        "launch_cmd": launch_command(spec),
        "array_index": ARRAY_INDEX[spec.site.pbs_flavour] if spec.is_array else None,
        "sweep_points": list(enumerate(spec.sweep_points)),
        "batch_step": [*batch_step_command(spec), *batch_step_plan(spec)], "host_check": host_python_check(spec),
        "warn": spec.warning[1] if spec.warning and spec.time_limit_seconds is not None else None,
    }


def render_script(spec: JobSpec, template_dir: str | None = None) -> str:
    return render(TEMPLATE, script_context(spec), template_dir)

