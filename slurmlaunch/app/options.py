"""The options of `submit`, defined once: the CLI's `submit`, `config show` and the Python API's profiles
(slurmlaunch.submit(profile=...)) all build their parser with :func:`add_submit_options`."""

from __future__ import annotations

from typing import Any

from ..core.limits import MAX_ARRAY_ELEMENTS, MAX_PER_NODE, MAX_RESTARTS, Count, Seconds


def add_submit_options(s: Any) -> None:
    import argparse

    g = s.add_argument_group("resources")
    g.add_argument("--profile", help="defaults from [profiles.NAME] of slurmlaunch.toml or the per-user "
                   "config (see slurmlaunch config show); options given here override them")
    g.add_argument("--nodes", "-N", default=1, metavar="N|MIN:MAX",
                   help="nodes (default 1); MIN:MAX for an elastic job in --mode torchrun")
    g.add_argument("--gpus-per-node", type=Count("--gpus-per-node", 0, MAX_PER_NODE), default=0,
                   help="GPUs per node; one rank per GPU (default 0)")
    g.add_argument("--tasks-per-node", type=Count("--tasks-per-node", 1, MAX_PER_NODE),
                   help="ranks per node (default: GPUs per node, or 1)")
    g.add_argument("--cpus-per-task", type=Count("--cpus-per-task", 1, MAX_PER_NODE),
                   help="CPUs per rank (sets OMP_NUM_THREADS)")
    g.add_argument("--cpus-per-gpu", type=Count("--cpus-per-gpu", 1, MAX_PER_NODE), help="CPUs per GPU (= per rank)")
    g.add_argument("--mem", help="memory per node, e.g. 64G")
    g.add_argument("--time", help="time limit: minutes, HH:MM:SS, D-HH:MM:SS")
    g.add_argument("--partition", "-p")
    g.add_argument("--account", "-A")
    g.add_argument("--qos")
    g.add_argument("--constraint", "-C")
    g.add_argument("--exclusive", action=argparse.BooleanOptionalAction, default=False)
    g.add_argument("--gpu-flag", choices=["gpus-per-node", "gres"], default="gpus-per-node",
                   help="how GPUs are requested: --gpus-per-node=N (default) or --gres=gpu:N")
    g = s.add_argument_group("job")
    g.add_argument("--job-name", "-J")
    g.add_argument("--output-dir", "-o", default="slurmlaunch-logs",
                   help="logs, the rendered script and the submission record (default ./slurmlaunch-logs)")
    g.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="export KEY=VALUE to every rank, byte for byte (repeatable)")
    g.add_argument("--setup", action="append", default=[], metavar="'SHELL LINE'",
                   help="a shell line run before the ranks start, e.g. 'module load cuda' (repeatable; "
                        "this one IS run by the shell)")
    g.add_argument("--sbatch-arg", action="append", default=[], metavar="--OPTION=VALUE",
                   help="extra sbatch (or qsub) option, written as an #SBATCH (#PBS) line (repeatable)")
    g.add_argument("--master-port", type=Count("--master-port", 1, 65535),
                   help="MASTER_PORT (default: derived from the job id)")
    g.add_argument("--signal", default="USR2@90", metavar="NAME[@SECONDS]",
                   help="warning signal before the time limit, passed to every rank (default USR2@90; none)")
    g.add_argument("--requeue", action=argparse.BooleanOptionalAction, default=False,
                   help="requeue the job when the warning signal came (ranks save a checkpoint, exit 128+N)")
    g.add_argument("--max-requeues", type=Count("--max-requeues", 0, MAX_RESTARTS), default=3,
                   help="with --requeue: at most this many (default 3)")
    g.add_argument("--rdzv-timeout", type=Seconds("--rdzv-timeout"),
                   help="seconds a rank waits for MASTER_ADDR:MASTER_PORT before it is stopped (default 900)")
    g.add_argument("--python", help="interpreter for the ranks (default: the one running slurmlaunch; "
                   "python3 inside a container)")
    g.add_argument("--template-dir", help="look for templates here first ($SLURMLAUNCH_TEMPLATE_DIR, "
                   "~/.config/slurmlaunch/templates, then the shipped ones)")
    g.add_argument("--scheduler", choices=["auto", "slurm", "pbs", "local"], default="auto",
                   help="auto: slurm when a Slurm controller answers, pbs when qsub is on PATH and sbatch "
                        "is not, else local")
    g.add_argument("--pbs-flavour", choices=["pro", "torque"], default="pro",
                   help="PBS Pro/OpenPBS (-l select=...) or Torque (-l nodes=N:ppn=...)")
    g.add_argument("--mpi", choices=["openmpi", "mpich", "pals"], default="openmpi",
                   help="under PBS: the MPI whose mpiexec starts the ranks (flags differ)")
    g = s.add_argument_group("PBS site resources (README: PBS; shipped profiles polaris, aurora, gadi, torque)")
    g.add_argument("--pbs-resource", action="append", default=[], metavar="KEY[=VALUE]",
                   help="a job-wide resource, #PBS -l KEY=VALUE (e.g. filesystems=home:eagle, storage=gdata/ab1, "
                        "jobfs=100GB, wd)")
    g.add_argument("--pbs-chunk", action="append", default=[], metavar="KEY=VALUE",
                   help="a resource of every select chunk, select=N:...:KEY=VALUE (e.g. system=polaris)")
    g.add_argument("--project", "-P", help="under PBS: #PBS -P PROJECT (the project charged, e.g. on Gadi)")
    g.add_argument("--pbs-request", choices=["select", "nodes", "totals"], default="select",
                   help="select: select=N:ncpus=..:mpiprocs=..:ngpus=.. (default); nodes: select=N and the "
                        "--pbs-chunk resources only (ALCF); totals: job-wide -l ncpus/ngpus/mem (NCI Gadi)")
    g.add_argument("--mpiexec-arg", action="append", default=[], metavar="--FLAG[=VALUE]",
                   help="under PBS: an extra mpiexec flag, e.g. Aurora's --cpu-bind=list:... / --gpu-bind=list:... "
                        "(a --cpu-bind here replaces slurmlaunch's own)")
    g.add_argument("--pbs-queues", metavar="QUEUE:MIN-MAX,...",
                   help="without --partition: the first queue whose node range holds --nodes (MAX may be empty)")
    g = s.add_argument_group("torchrun mode")
    g.add_argument("--mode", choices=["srun", "torchrun"], default="srun",
                   help="srun: one Slurm task per rank through the launcher (default); torchrun: one task per "
                        "node running torchrun (c10d rendezvous on the first node, restarts, elastic ranges)")
    g.add_argument("--nproc-per-node", type=Count("--nproc-per-node", 1, MAX_PER_NODE),
                   help="torchrun mode without GPUs: ranks per node")
    g.add_argument("--max-restarts", type=Count("--max-restarts", 0, MAX_RESTARTS), default=0,
                   help="torchrun mode: restarts of the whole world "
                   "after a rank fails (default 0)")
    g = s.add_argument_group("containers")
    g.add_argument("--container-image", metavar="IMAGE",
                   help="run every task in IMAGE with Slurm's pyxis/enroot plugin (srun --container-image)")
    g.add_argument("--apptainer", metavar="IMAGE",
                   help="run every task in an Apptainer/Singularity IMAGE (apptainer exec [--nv] IMAGE ...)")
    g.add_argument("--container-mount", action="append", default=[], metavar="SRC:DST[:FLAGS]",
                   help="bind mount (repeatable); the working directory is always mounted at its own path")
    g.add_argument("--container-workdir", metavar="DIR", help="working directory inside the container "
                   "(default: the working directory's own path)")
    g = s.add_argument_group("arrays and sweeps (Slurm and local)")
    g.add_argument("--array", metavar="INDICES",
                   help="a job array: one distributed job per index, e.g. 0-9 or 1,3,5-7 "
                        "($SLURM_ARRAY_TASK_ID tells SCRIPT which)")
    g.add_argument("--sweep", action="append", default=[], metavar="KEY=V1,V2,...",
                   help="a grid, one array element per point; each point adds --KEY=VALUE to SCRIPT's "
                        "arguments (repeatable: the product of all)")
    g.add_argument("--max-parallel", type=Count("--max-parallel", 1, MAX_ARRAY_ELEMENTS), metavar="N",
                   help="run at most N array elements at once")
    g = s.add_argument_group("from your laptop (README: From your laptop)")
    g.add_argument("--remote", metavar="[USER@]HOST[:DIR]",
                   help="submit on this ssh destination (an alias of ~/.ssh/config works): the project is synced "
                        "to DIR (default ~/slurmlaunch-projects/<this directory's name>) and sbatch runs there")
    g.add_argument("--remote-setup", action="append", default=[], metavar="'SHELL LINE'",
                   help="with --remote: a shell line run before every remote command, e.g. 'module load slurm' "
                        "(repeatable; the remote shell is a non-login one)")
    g.add_argument("--sync", action=argparse.BooleanOptionalAction, default=True,
                   help="with --remote: rsync the working directory first (default; --no-sync: the code is there)")
    g.add_argument("--remote-exclude", action="append", default=[], metavar="PATTERN",
                   help="with --remote: leave PATTERN out of the sync (rsync's --exclude; .gitignore files and "
                        ".git/ are always honoured; repeatable)")
    g.add_argument("--sync-limit", default="1G", metavar="SIZE",
                   help="with --remote: refuse a sync that would send more than SIZE (default 1G)")
    g = s.add_argument_group("what and how")
    g.add_argument("-m", "--module", action="store_true", help="SCRIPT is a Python module")
    g.add_argument("--no-python", action="store_true", help="SCRIPT is an executable")
    g.add_argument("--legacy-local-rank-arg", action="store_true",
                   help="pass --local-rank=N to SCRIPT, as torch.distributed.launch did (every mode and scheduler)")
    g.add_argument("--dry-run", action="store_true", help="print the script (or local commands); submit nothing")
    # Every boolean a profile may set has its --no- undo (README: Profiles); -m, --no-python and
    # --legacy-local-rank-arg are not taken from files (profiles.CHANGES_WHAT_RUNS), so they have none.
    g.add_argument("--wait", action=argparse.BooleanOptionalAction, default=False,
                   help="follow the job until it ends; exit with its code")
    g.add_argument("--wait-timeout", type=Seconds("--wait-timeout"), help="give up following after this many seconds")
    g.add_argument("--cancel-on-interrupt", action=argparse.BooleanOptionalAction, default=False,
                   help="with --wait: Ctrl-C cancels the job without asking")
    s.add_argument("script", metavar="SCRIPT")
    s.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS", help="passed to SCRIPT unchanged")
