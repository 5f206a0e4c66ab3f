"""What every task runs, whatever the scheduler: the launcher's command line, the container around it, and
the variables a batch script exports. Pure: a JobSpec in, lists out (the Slurm, PBS and local edges share it)."""

from __future__ import annotations

import os

from ..core.spec import JobSpec

# Inside a container, slurmlaunch is this installation's package, mounted read-only (the image need not have
# it, and the script's side matches the side that rendered it); the bootstrap puts it first on sys.path.
CONTAINER_PKG = "/opt/slurmlaunch-pkg"
BOOTSTRAP = (f'import sys; sys.path.insert(0, "{CONTAINER_PKG}"); '
             "from slurmlaunch.cli import main; sys.exit(main())")


def container_mounts(spec: JobSpec) -> list[str]:
    """The working directory at its own path (the script, its data), slurmlaunch, then --container-mount's."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    workdir = spec.program.workdir
    return [f"{workdir}:{workdir}", f"{package}:{CONTAINER_PKG}/slurmlaunch:ro", *spec.containers.container_mounts]


def launch_command(spec: JobSpec) -> list[str]:
    """What each task runs: the launcher in front of the script (no shell in between); in torchrun mode,
    the per-node torchrun starter; with --apptainer, `apptainer exec` in front of either."""
    entry = [spec.program.python, "-c", BOOTSTRAP] if spec.container else [spec.program.python, "-m", "slurmlaunch"]
    cmd = [*entry, "launch"]
    if spec.containers.apptainer:
        binds = [a for m in container_mounts(spec) for a in ("--bind", m)]
        gpus = ["--nv"] if spec.resources.gpus_per_node else []
        entry = ["apptainer", "exec", *gpus, *binds, "--pwd", spec.containers.container_workdir or spec.program.workdir,
                 spec.containers.apptainer, *entry]
        cmd = [*entry, "launch"]
    if spec.launch.mode == "torchrun":
        cmd = [*entry, "torchrun-node", f"--nproc-per-node={spec.ntasks_per_node}",
               f"--max-restarts={spec.launch.max_restarts}"]
        if spec.resources.min_nodes is not None:
            cmd.append(f"--nnodes={spec.nodes_text}")
        if spec.warning:
            cmd.append(f"--forward-signal={spec.warning[0]}")
    if spec.program.module:
        cmd.append("-m")
    if spec.program.no_python:
        cmd.append("--no-python")
    if spec.program.legacy_local_rank_arg:  # launch and torchrun-node both take it; PBS and local run this same command
        cmd.append("--legacy-local-rank-arg")
    script = spec.program.script
    if not (spec.program.module or spec.program.no_python or os.path.isabs(script)):
        script = os.path.join(spec.program.workdir, script)
    return [*cmd, script, *spec.program.args]



def batch_step_command(spec: JobSpec) -> list[str]:
    """What a batch script ends with: the batch step's supervisor (allocation/batch_step.py) in this
    installation. It runs in the batch shell, outside any container: there, with --container-image or
    --apptainer, the host's python3 runs it from this installation's package (which the container mounts)."""
    if spec.container:
        package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        boot = (f'import os, sys; sys.path.insert(0, os.path.dirname("{package}")); '
                "from slurmlaunch.cli import main; sys.exit(main())")
        return ["python3", "-c", boot, "batch-step"]
    return [spec.program.python, "-m", "slurmlaunch", "batch-step"]


# The oldest Python the package runs on (pyproject's requires-python); the host check below compares with it.
MIN_PYTHON = (3, 10)


def host_python_check(spec: JobSpec) -> str | None:
    """One shell line for a batch script whose batch step runs on the host with the host's python3 (with
    --container-image or --apptainer; batch_step_command): when that python3 is missing or older than
    MIN_PYTHON, the job's log gets one line (what was found, what is needed, the fix) and the script exits 2,
    before the package's import could fail with a traceback. The Python code is valid Python 2 as well (RHEL 7's
    python3 may be 3.6, an old site's `python3` a link to 2.7). None without a container (the batch step then
    runs with --python, the ranks' own interpreter)."""
    if not spec.container:
        return None
    need = ".".join(map(str, MIN_PYTHON))
    found = ('$(command -v python3 >/dev/null && echo "$(python3 -V 2>&1 | head -n 1) at $(command -v python3)" '
             "|| echo no python3 on PATH)")
    say = (f"slurmlaunch: the batch step runs on this host with its python3 and found {found}; it needs Python >= "
           f"{need}. Fix: load one in --setup (e.g. --setup 'module load python/3.11') or put one first on PATH "
           f"(--python is the container's)")
    return (f"python3 -c 'import sys; sys.exit(sys.version_info[:2] < {MIN_PYTHON!r})' 2>/dev/null "
            f'|| {{ echo "{say}" >&2; exit 2; }}')


def script_env(spec: JobSpec) -> list[tuple[str, str]]:
    """The variables a batch script exports for every rank: --env, then --master-port, --rdzv-timeout."""
    env = list(spec.environment.env)
    if spec.environment.master_port is not None:
        env.append(("MASTER_PORT", str(spec.environment.master_port)))
    if spec.environment.rdzv_timeout is not None:
        env.append(("SLURMLAUNCH_RDZV_TIMEOUT", f"{spec.environment.rdzv_timeout:g}"))
    return env
