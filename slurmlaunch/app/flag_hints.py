"""What a torchrun or sbatch user types, and what `submit` calls it: the hint on an unrecognized option (one line,
from :func:`hint`), and the table docs/how-to and the tests read (:data:`SUBMIT_HINTS`).

A table, not guessing: a flag of torchrun or sbatch that `submit` has under another name (or that has no
meaning here) is named with its counterpart; the same flag with underscores (torchrun's old spelling) is
named by its dashed one. Imported only when argparse refuses an option."""

from __future__ import annotations

from collections.abc import Collection

SBATCH_ARG = "--sbatch-arg=--FLAG=VALUE"  # the way to any sbatch flag submit has no option of its own for
_RDZV = "none: --mode torchrun makes a c10d rendezvous on the first node; --rdzv-timeout bounds the wait"
_RANKS = "none: each node's and rank's place comes from the allocation (the first node is MASTER_ADDR)"

# flag -> (whose flag, what submit has instead: an option, or "none: why"). torchrun's flags first, then sbatch's.
SUBMIT_HINTS: dict[str, tuple[str, str]] = {
    "--nnodes": ("torchrun", "--nodes N (--nodes MIN:MAX for an elastic job in --mode torchrun)"),
    "--nproc_per_node": ("torchrun", "--gpus-per-node G (one rank per GPU), or --tasks-per-node N"),
    "--node-rank": ("torchrun", _RANKS),
    "--node_rank": ("torchrun", _RANKS),
    "--master-addr": ("torchrun", _RANKS),
    "--master_addr": ("torchrun", _RANKS),
    "--master_port": ("torchrun", "--master-port PORT"),
    "--rdzv-backend": ("torchrun", _RDZV),
    "--rdzv_backend": ("torchrun", _RDZV),
    "--rdzv-endpoint": ("torchrun", _RDZV),
    "--rdzv_endpoint": ("torchrun", _RDZV),
    "--rdzv-id": ("torchrun", "none: the job id is TORCHELASTIC_RUN_ID"),
    "--rdzv_id": ("torchrun", "none: the job id is TORCHELASTIC_RUN_ID"),
    "--rdzv-conf": ("torchrun", _RDZV),
    "--rdzv_conf": ("torchrun", _RDZV),
    "--standalone": ("torchrun", "none: every job has a rendezvous of its own (on this machine alone: "
                                 "slurmlaunch run --standalone, or submit --scheduler local)"),
    "--max_restarts": ("torchrun", "--max-restarts N with --mode torchrun"),
    "--monitor-interval": ("torchrun", "none: a rank's exit is noticed at once"),
    "--start-method": ("torchrun", "none: every rank is a process of its own"),
    "--role": ("torchrun", "none"),
    "--log-dir": ("torchrun", "--output-dir DIR (one log per rank: slurmlaunch logs JOB --rank N)"),
    "--log_dir": ("torchrun", "--output-dir DIR (one log per rank: slurmlaunch logs JOB --rank N)"),
    "--redirects": ("torchrun", "none: each rank's output is its own file (slurmlaunch logs JOB --rank N)"),
    "--tee": ("torchrun", "none: each rank's output is its own file (slurmlaunch logs JOB --rank N)"),
    "--local-ranks-filter": ("torchrun", "none: slurmlaunch logs JOB --rank N shows one rank"),
    "--no_python": ("torchrun", "--no-python"),
    "--use-env": ("torch.distributed.launch", "none: the variables are always set"),
    "--use_env": ("torch.distributed.launch", "none: the variables are always set"),
    "--ntasks-per-node": ("sbatch", "--tasks-per-node N (ranks per node; default: --gpus-per-node)"),
    "--ntasks": ("sbatch", "--nodes N with --tasks-per-node M: a job is asked for per node"),
    "-n": ("sbatch", "--nodes N with --tasks-per-node M: a job is asked for per node"),
    "--gres": ("sbatch", "--gpus-per-node N (with --gpu-flag gres, asked as a gres); another gres: " + SBATCH_ARG),
    "--gpus": ("sbatch", "--gpus-per-node N (per node, one rank per GPU)"),
    "-G": ("sbatch", "--gpus-per-node N (per node, one rank per GPU)"),
    "--gpus-per-task": ("sbatch", "none: one rank per GPU, --gpus-per-node N"),
    "-t": ("sbatch", "--time"),
    "-c": ("sbatch", "--cpus-per-task N"),
    "--mem-per-cpu": ("sbatch", "--mem (per node), or " + SBATCH_ARG),
    "--mem-per-gpu": ("sbatch", "--mem (per node), or " + SBATCH_ARG),
    "-q": ("sbatch", "--qos"),
    "-a": ("sbatch", "--array"),
    "--output": ("sbatch", "--output-dir DIR (slurmlaunch names the files in it)"),
    "--error": ("sbatch", "--output-dir DIR (slurmlaunch names the files in it)"),
    "-e": ("sbatch", "--output-dir DIR (slurmlaunch names the files in it)"),
    "--chdir": ("sbatch", "none: the job runs in this directory (cd there first)"),
    "-D": ("sbatch", "none: the job runs in this directory (cd there first)"),
    "--wrap": ("sbatch", "none: SCRIPT is run (--no-python SCRIPT for an executable)"),
    "--test-only": ("sbatch", "--dry-run"),
    "-W": ("sbatch", "--wait"),
    "--export": ("sbatch", "--env KEY=VALUE (repeatable)"),
    "--ntasks-per-gpu": ("sbatch", "none: one rank per GPU, --gpus-per-node N"),
    # sbatch's own flags that only pass through
    **{flag: ("sbatch", SBATCH_ARG) for flag in (
        "--nodelist", "-w", "--exclude", "-x", "--mail-type", "--mail-user", "--dependency", "-d", "--begin",
        "--reservation", "--hold", "-H", "--licenses", "-L", "--comment", "--nice", "--distribution",
        "--open-mode", "--switches", "--hint", "--mincpus", "--tmp", "--deadline", "--clusters", "-M",
        "--wckey", "--gpu-bind", "--cpu-freq", "--gpu-freq", "--uid", "--gid", "--priority", "--kill-on-invalid-dep",
        "--parsable", "--cores-per-socket", "--sockets-per-node", "--threads-per-core")},
}


def hint(flag: str, known: Collection[str], command: str) -> str | None:
    """What to use instead of ``flag`` (as typed: `--nnodes=2` is `--nnodes`), an option ``command``'s parser
    does not know (``known``: the option strings it does), in a few words; None when nothing is known."""
    name = flag.split("=", 1)[0]
    dashed = "--" + name[2:].replace("_", "-") if name.startswith("--") else name
    if command == "submit" and name in SUBMIT_HINTS:
        whose, instead = SUBMIT_HINTS[name]
        if instead == SBATCH_ARG:
            return f"{whose}'s {name} passes through as --sbatch-arg={name}=VALUE"
        if instead.startswith("none"):
            return f"{whose}'s {name}: none here" + instead.removeprefix("none").replace(":", ",", 1)
        return f"{whose}'s {name}: use {instead}"
    if dashed != name and dashed in known:
        return f"{name}: use {dashed}"
    if command == "run" and SUBMIT_HINTS.get(name, ("",))[0] == "sbatch":
        return f"sbatch's {name} asks a scheduler: slurmlaunch submit (run starts this machine's ranks only)"
    return None
