"""--mode torchrun: one task per node runs torchrun, which starts that node's ranks.

`slurmlaunch torchrun-node [options] SCRIPT [ARGS...]` runs once per node inside the allocation. It reads
the Slurm step (SLURM_JOB_ID, SLURM_STEP_ID, SLURM_STEP_NODELIST or SLURM_JOB_NODELIST, SLURMD_NODENAME,
SLURM_NODEID) and execs ``python -m torch.distributed.run`` with a c10d rendezvous on the first node of the
step: endpoint MASTER_ADDR if set, else that node's name; port MASTER_PORT if set, else the one the launcher
derives from the job and step ids; rendezvous id the job id. The first node is told it hosts the rendezvous
store (is_host), so nothing depends on the node name matching the machine's host name. The warning signal
is added to the signals torchrun passes on to its workers (PET_SIGNALS_TO_HANDLE, torch >= 2.9), and
SLURMLAUNCH_RDZV_TIMEOUT (--rdzv-timeout) becomes the rendezvous' join_timeout.
Standard library only, like the launcher.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping, Sequence

from ..core.detect import derive_port
from ..core.errors import EnvironmentMappingError, SlurmLaunchError
from ..core.hostlist import first_host
from ..core.limits import MAX_JOB_ID, bounded_int, parse_count
from .launch import RETURNED_DIR, python_argv

USAGE = """usage: slurmlaunch torchrun-node --nproc-per-node N [--nnodes N|MIN:MAX] [--max-restarts N]
                              [--forward-signal NAME] [-m|--no-python] SCRIPT [ARGS...]
Inside a Slurm step with one task per node: exec torchrun with a c10d rendezvous on the step's first node.

example (what `slurmlaunch submit --mode torchrun` writes into the batch script):
  srun --ntasks-per-node=1 python -m slurmlaunch torchrun-node --nproc-per-node=4 --max-restarts=3 train.py
"""
TORCHRUN_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"  # torchrun's own default
# torchrun's failure summary: "  rank      : 3 (local_rank: 1)" then "  exitcode  : -6 (pid: 812) ..."
_FAILED_WORKER = re.compile(r"^ *rank *: (\d+) \(local_rank: \d+\)\n *exitcode *: (-?\d+) ", re.M)
SIGABRT_CODE = 128 + 6  # the shell's and the supervisor's code for a process killed by SIGABRT


def parse(argv: Sequence[str]) -> tuple[dict[str, str], list[str], list[str]]:
    """(values of --nproc-per-node/--nnodes/--max-restarts/--forward-signal, flags, SCRIPT + ARGS)."""
    values: dict[str, str] = {}
    flags: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, eq, value = arg.partition("=")
        if name in ("--nproc-per-node", "--nnodes", "--max-restarts", "--forward-signal"):
            if not eq:
                if i + 1 >= len(argv):
                    raise SlurmLaunchError(f"torchrun-node: {name} needs a value")
                i += 1
                value = argv[i]
            values[name[2:]] = value
        elif arg in ("-m", "--module", "--no-python"):
            flags.append("-m" if arg == "--module" else arg)
        elif arg == "--":
            i += 1
            break
        elif arg.startswith("-"):
            raise SlurmLaunchError(f"torchrun-node: unknown option {arg!r} (valid: --nproc-per-node, --nnodes, "
                                   f"--max-restarts, --forward-signal, -m, --no-python)")
        else:
            break
        i += 1
    if "nproc-per-node" not in values:
        raise SlurmLaunchError("torchrun-node: --nproc-per-node is required")
    if i >= len(argv):
        raise SlurmLaunchError("torchrun-node: no SCRIPT given")
    return values, flags, list(argv[i:])


def torchrun_command(env: Mapping[str, str], values: Mapping[str, str], flags: Sequence[str],
                     script: Sequence[str], python: str) -> tuple[list[str], dict[str, str]]:
    """(the torchrun argv, variables to add). Reads the step's variables from ``env``."""
    job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not job or not nodelist:
        raise SlurmLaunchError("torchrun-node: not inside a Slurm step (SLURM_JOB_ID and SLURM_STEP_NODELIST "
                               "are unset); it is what `slurmlaunch submit --mode torchrun` runs on each node")
    job_name = "SLURM_JOB_ID" if env.get("SLURM_JOB_ID") else "SLURM_JOBID"
    job_id = parse_count(job_name, job, 0, MAX_JOB_ID, sep="=", error=EnvironmentMappingError)
    step = env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID") or "0"
    head = first_host(nodelist)
    host = env.get("MASTER_ADDR") or head
    port = env.get("MASTER_PORT") or str(derive_port(job_id, bounded_int(step, MAX_JOB_ID) or 0))
    me = env.get("SLURMD_NODENAME")
    is_host = me == head if me else env.get("SLURM_NODEID", "0") == "0"
    conf = f"is_host={int(is_host)}"
    timeout = env.get("SLURMLAUNCH_RDZV_TIMEOUT", "")
    # --rdzv-timeout: how long nodes wait (ASCII digits only: '²'.isdigit() is true, and float() refuses it)
    if re.fullmatch(r"[0-9]+(\.[0-9]*)?", timeout) and float(timeout) > 0:
        conf += f",join_timeout={float(timeout):g}"
    nnodes = values.get("nnodes") or env.get("SLURM_STEP_NUM_NODES") or env.get("SLURM_NNODES") or "1"
    if env.get(RETURNED_DIR) and "--no-python" not in flags:
        # each worker through the launcher's RUNNER, which marks "the script returned" (torchrun adds -u
        # itself only when it runs Python)
        script = [*python_argv(python, "-m" in flags, script[0], env), *script[1:]]
        flags = ["--no-python"]
    argv = [python, "-m", "torch.distributed.run", f"--nnodes={nnodes}",
            f"--nproc-per-node={values['nproc-per-node']}", "--rdzv-backend=c10d",
            f"--rdzv-endpoint={host}:{port}", f"--rdzv-id={job}", f"--rdzv-conf={conf}",
            f"--max-restarts={values.get('max-restarts', '0')}", *flags, *script]
    extra: dict[str, str] = {}
    signame = values.get("forward-signal")
    if signame:
        handled = env.get("PET_SIGNALS_TO_HANDLE", TORCHRUN_SIGNALS)
        wanted = "SIG" + signame.upper().removeprefix("SIG")
        if wanted not in handled.split(","):
            extra["PET_SIGNALS_TO_HANDLE"] = f"{handled},{wanted}"
    cpus = bounded_int(env.get("SLURM_CPUS_PER_TASK", ""), MAX_JOB_ID)
    nproc = bounded_int(values["nproc-per-node"], MAX_JOB_ID)
    if "OMP_NUM_THREADS" not in env and cpus is not None and nproc:
        extra["OMP_NUM_THREADS"] = str(max(1, cpus // nproc))  # torchrun would say 1
    return argv, extra


def aborted_workers(log_text: str) -> list[int]:
    """The ranks torchrun's failure summary in ``log_text`` reports as killed by SIGABRT (exitcode -6)."""
    return sorted({int(rank) for rank, code in _FAILED_WORKER.findall(log_text) if code == "-6"})


def teardown_aborts(aborted: Sequence[int], returned_dir: str) -> list[int]:
    """Of the ranks killed by SIGABRT, those whose script had returned (the launcher's RUNNER left their
    marker in ``returned_dir``): they died in torch's teardown at interpreter exit, not in the training."""
    return [r for r in aborted if os.path.exists(os.path.join(returned_dir, str(r)))]


def teardown_message(rank: int) -> str:
    return (f"rank {rank} aborted in torch's teardown after the script returned (SIGABRT at interpreter exit, "
            f"its work had finished; see the README's 'Teardown aborts'); the job counts as failed")


def main(argv: Sequence[str]) -> int:
    if any(a in ("-h", "--help") for a in argv[:1]):
        sys.stdout.write(USAGE)
        return 0
    values, flags, script = parse(argv)
    cmd, extra = torchrun_command(os.environ, values, flags, script, sys.executable)
    os.environ.update(extra)
    if os.environ.get("SLURMLAUNCH_PRINT_TORCHRUN"):
        sys.stderr.write("slurmlaunch: " + " ".join(cmd) + "\n")
    sys.stdout.flush()
    os.execv(cmd[0], cmd)
    return 127  # not reached
