"""The options of `submit`, defined once, as a table of named records (:data:`SUBMIT_OPTIONS`): the CLI's
`submit`, `config show` and the Python API's profiles (slurmlaunch.submit(profile=...)) all build their
parser from it with :func:`add_submit_options`, and profiles read their option table from that parser. Each
record fills the JobSpec field of its flag (core.spec's flag_of: --sbatch-arg -> sbatch_args, declared there
once) and says how (:func:`spec_values`), so `submit` and the API's profiles copy no option by hand. What the
field declares (its default, its closed choices) is read from the field (core/spec.py), not written here: this
table holds what only the CLI has, the flags' spellings, help, metavar, the converter and the group.

Kept cheap to import (no typing, no dataclasses): the fields are read when a parser is built, which only
`submit`, `config show`, `--help` and the API's profiles do."""

from __future__ import annotations

from ..core.limits import MAX_ARRAY_ELEMENTS, MAX_PER_NODE, MAX_RESTARTS, Count, Seconds

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, Literal

    Action = Literal["store", "store_true", "append", "toggle"]


class SchedulerChoices(tuple):  # type: ignore[type-arg]
    """--scheduler's choices: auto and the shipped schedulers, as --help and completion list them; a name
    beside them is taken where an installed plug-in gives it (schedulers/registry.py, looked up only then,
    so that this module stays cheap to import and a shipped name reads no package metadata)."""

    def __contains__(self, name: object) -> bool:
        if tuple.__contains__(self, name):
            return True
        from ..schedulers.registry import ACCEPTED

        return isinstance(name, str) and name in ACCEPTED


class SubmitOption:
    """One option of `submit`: its flags (the long one first) and argparse's settings for it, by name: help,
    default, type (a converter from core.limits), metavar, choices and action: store (a value, when none is
    named), store_true, append (repeatable; the default is a fresh list per parser) or toggle (--X / --no-X,
    argparse's BooleanOptionalAction). ``spec``: False for an option that is the CLI's own, not a JobSpec
    field; otherwise :attr:`field` is the field its flag sets (core.spec.field_of), whose default and choices
    the parser takes. ``to_spec``: the name of the core.parse function that makes the value the field's
    (default: a list becomes a tuple; a name, so that building a parser does not import it).
    Built once per process, at import: kept to a few attributes."""

    __slots__ = ("flags", "settings", "spec", "to_spec")

    def __init__(self, *flags: str, spec: bool = True, to_spec: str | None = None, **settings: Any) -> None:
        self.flags, self.settings, self.spec, self.to_spec = flags, settings, spec, to_spec

    @property
    def field(self) -> str | None:
        """The JobSpec field this option fills (--nodes: nodes, and min_nodes through spec_values), or None for
        the CLI's own options."""
        if not self.spec:
            return None
        from ..core.spec import field_of

        name = field_of(self.flag)
        if name is None:
            raise AssertionError(f"{self.flag}: no JobSpec field declares this option (core/spec.py)")
        return name

    @property
    def flag(self) -> str:
        """The long option, as the user writes it."""
        return next(f for f in self.flags if f.startswith("--"))

    @property
    def dest(self) -> str:
        return self.flag[2:].replace("-", "_")

    @property
    def action(self) -> Action:
        return self.settings.get("action", "store")  # type: ignore[no-any-return]

    @property
    def default(self) -> object:
        """argparse's default: the field's declared one (store_true: False), or the CLI's own option's."""
        return self.parser_settings().get("default", False if self.action == "store_true" else None)

    @property
    def type(self) -> Callable[[str], Any] | None:
        return self.settings.get("type")

    @property
    def choices(self) -> tuple[str, ...] | None:
        return self.parser_settings().get("choices")

    def parser_settings(self) -> dict[str, Any]:
        """The table's settings, and the field's default and choices (core/spec.py declares them)."""
        settings = dict(self.settings)
        name = self.field
        if name is not None:
            from ..core.spec import FIELDS

            declared = FIELDS[name]
            if self.action != "store_true":
                settings["default"] = declared.default
            if "choices" in declared.metadata:
                settings["choices"] = declared.metadata["choices"]
        return settings

    def add_to(self, group: Any, toggle: Any) -> None:
        """``group.add_argument`` with this option's settings; ``toggle``: argparse's BooleanOptionalAction."""
        settings = self.parser_settings()
        action = settings.get("action")
        if action == "toggle":
            settings["action"] = toggle
        elif action == "append":
            # a fresh list per parser: profiles.defer_defaults changes one parser's defaults only
            settings["default"] = list(settings["default"])
        if "choices" in settings and not isinstance(settings["choices"], SchedulerChoices):
            settings["choices"] = list(settings["choices"])
        group.add_argument(*self.flags, **settings)


Opt = SubmitOption
# (group title, its options), in --help's order.
SUBMIT_OPTIONS: tuple[tuple[str, tuple[SubmitOption, ...]], ...] = (
    ("resources", (
        Opt("--profile", spec=False, help="defaults from [profiles.NAME] of slurmlaunch.toml or the per-user "
            "config (see slurmlaunch config show); options given here override them"),
        # two fields, nodes and min_nodes: spec_values
        Opt("--nodes", "-N", metavar="N|MIN:MAX",
            help="nodes (default 1); MIN:MAX for an elastic job in --mode torchrun"),
        Opt("--gpus-per-node", type=Count("--gpus-per-node", 0, MAX_PER_NODE),
            help="GPUs per node; one rank per GPU (default 0)"),
        Opt("--tasks-per-node", type=Count("--tasks-per-node", 1, MAX_PER_NODE),
            help="ranks per node (default: GPUs per node, or 1)"),
        Opt("--cpus-per-task", type=Count("--cpus-per-task", 1, MAX_PER_NODE),
            help="CPUs per rank (sets OMP_NUM_THREADS)"),
        Opt("--cpus-per-gpu", type=Count("--cpus-per-gpu", 1, MAX_PER_NODE), help="CPUs per GPU (= per rank)"),
        Opt("--mem", help="memory per node, e.g. 64G"),
        Opt("--time", help="time limit: minutes, HH:MM:SS, D-HH:MM:SS"),
        Opt("--partition", "-p"),
        Opt("--account", "-A"),
        Opt("--qos"),
        Opt("--constraint", "-C"),
        Opt("--exclusive", action="toggle"),
        Opt("--gpu-flag", help="how GPUs are requested: --gpus-per-node=N (default) or --gres=gpu:N"),
    )),
    ("job", (
        Opt("--job-name", "-J"),
        Opt("--output-dir", "-o",
            help="logs, the rendered script and the submission record (default ./slurmlaunch-logs)"),
        Opt("--env", to_spec="parse_env", action="append", metavar="KEY=VALUE",
            help="export KEY=VALUE to every rank, byte for byte (repeatable)"),
        Opt("--setup", action="append", metavar="'SHELL LINE'",
            help="a shell line run before the ranks start, e.g. 'module load cuda' (repeatable; this one IS run "
            "by the shell)"),
        Opt("--sbatch-arg", action="append", metavar="--OPTION=VALUE",
            help="extra sbatch (or qsub) option, written as an #SBATCH (#PBS) line (repeatable)"),
        Opt("--master-port", type=Count("--master-port", 1, 65535),
            help="MASTER_PORT (default: derived from the job id)"),
        Opt("--signal", metavar="[B:]NAME[@SECONDS]",
            help="warning signal before the time limit, passed to every rank (default USR2@90; none). sbatch's "
            "B: prefix is accepted and changes nothing: the batch step always gets it and passes it on"),
        Opt("--requeue", action="toggle",
            help="requeue the job when the warning signal came (ranks save a checkpoint, exit 128+N)"),
        Opt("--max-requeues", type=Count("--max-requeues", 0, MAX_RESTARTS),
            help="with --requeue: at most this many (default 3)"),
        Opt("--stage-env", metavar="on|fallback",  # a value always: an optional one would take SCRIPT's name
            help="Slurm, PBS: copy the ranks' Python environment (a venv or conda prefix) to node-local storage "
            "once per node (sbcast; PBS: a pbs_tmrsh task per host) and start every rank from there; fallback: run "
            "from the shared copy when it cannot be staged (docs: Start-up at scale)"),
        Opt("--rdzv-timeout", type=Seconds("--rdzv-timeout"),
            help="seconds a rank waits for MASTER_ADDR:MASTER_PORT before it is stopped (default 900)"),
        Opt("--python", spec=False,  # app.resolve's
            help="interpreter for the ranks (default: the one running slurmlaunch; python3 inside a container)"),
        Opt("--template-dir", spec=False, help="look for templates here first ($SLURMLAUNCH_TEMPLATE_DIR, "
            "~/.config/slurmlaunch/templates, then the shipped ones)"),
        Opt("--scheduler", spec=False, choices=SchedulerChoices(("auto", "slurm", "pbs", "local")), default="auto",
            help="auto: slurm when a Slurm controller answers, pbs when qsub is on PATH and sbatch is not, else "
            "local; or the name of an installed scheduler plug-in"),
        Opt("--pbs-flavour", help="PBS Pro/OpenPBS (-l select=...) or Torque (-l nodes=N:ppn=...)"),
        Opt("--mpi",
            help="under PBS: the MPI whose mpiexec starts the ranks (flags differ; default openmpi); under Slurm: "
            "srun --mpi=TYPE, the PMI your MPI library talks to (e.g. pmix; default: the cluster's MpiDefault)"),
    )),
    ("PBS site resources (docs: PBS sites; shipped profiles polaris, aurora, gadi, torque)", (
        Opt("--pbs-resource", action="append", metavar="KEY[=VALUE]",
            help="a job-wide resource, #PBS -l KEY=VALUE (e.g. filesystems=home:eagle, storage=gdata/ab1, "
            "jobfs=100GB, wd)"),
        Opt("--pbs-chunk", action="append", metavar="KEY=VALUE",
            help="a resource of every select chunk, select=N:...:KEY=VALUE (e.g. system=polaris)"),
        Opt("--project", "-P", help="under PBS: #PBS -P PROJECT (the project charged, e.g. on Gadi)"),
        Opt("--pbs-request",
            help="select: select=N:ncpus=..:mpiprocs=..:ngpus=.. (default); nodes: select=N and the --pbs-chunk "
            "resources only (ALCF); totals: job-wide -l ncpus/ngpus/mem (NCI Gadi)"),
        Opt("--mpiexec-arg", action="append", metavar="--FLAG[=VALUE]",
            help="under PBS: an extra mpiexec flag, e.g. Aurora's --cpu-bind=list:... / --gpu-bind=list:... (a "
            "--cpu-bind here replaces slurmlaunch's own)"),
        Opt("--pbs-queues", metavar="QUEUE:MIN-MAX,...",
            help="without --partition: the first queue whose node range holds --nodes (MAX may be empty)"),
    )),
    ("torchrun mode", (
        Opt("--mode", help="srun: one Slurm task per rank through the launcher (default); torchrun: one task per node "
            "running torchrun (c10d rendezvous on the first node, restarts, elastic ranges)"),
        Opt("--nproc-per-node", type=Count("--nproc-per-node", 1, MAX_PER_NODE),
            help="torchrun mode without GPUs: ranks per node"),
        Opt("--max-restarts", type=Count("--max-restarts", 0, MAX_RESTARTS),
            help="torchrun mode: restarts of the whole world after a rank fails (default 0)"),
    )),
    ("containers", (
        Opt("--container-image", metavar="IMAGE",
            help="run every task in IMAGE with Slurm's pyxis/enroot plugin (srun --container-image)"),
        Opt("--apptainer", metavar="IMAGE",
            help="run every task in an Apptainer/Singularity IMAGE (apptainer exec [--nv] IMAGE ...)"),
        Opt("--container-mount", action="append", metavar="SRC:DST[:FLAGS]",
            help="bind mount (repeatable); the working directory is always mounted at its own path"),
        Opt("--container-workdir", metavar="DIR",
            help="working directory inside the container (default: the working directory's own path)"),
    )),
    ("arrays and sweeps (Slurm and local)", (
        Opt("--array", metavar="INDICES",
            help="a job array: one distributed job per index, e.g. 0-9 or 1,3,5-7 ($SLURM_ARRAY_TASK_ID tells "
            "SCRIPT which)"),
        Opt("--sweep", to_spec="parse_sweep", action="append", metavar="KEY=V1,V2,...",
            help="a grid, one array element per point; each point adds --KEY=VALUE to SCRIPT's arguments "
            "(repeatable: the product of all)"),
        Opt("--max-parallel", type=Count("--max-parallel", 1, MAX_ARRAY_ELEMENTS), metavar="N",
            help="run at most N array elements at once"),
    )),
    ("from your laptop (docs: From your laptop)", (
        Opt("--remote", spec=False, metavar="[USER@]HOST[:DIR]",
            help="submit on this ssh destination (an alias of ~/.ssh/config works): the project is synced to DIR "
            "(default ~/slurmlaunch-projects/<this directory's name>) and sbatch runs there"),
        Opt("--remote-setup", spec=False, action="append", default=(), metavar="'SHELL LINE'",
            help="with --remote: a shell line run before every remote command, e.g. 'module load slurm' "
            "(repeatable; the remote shell is a non-login one)"),
        Opt("--sync", spec=False, action="toggle", default=True,
            help="with --remote: rsync the working directory first (default; --no-sync: the code is there)"),
        Opt("--remote-exclude", spec=False, action="append", default=(), metavar="PATTERN",
            help="with --remote: leave PATTERN out of the sync (rsync's --exclude; .gitignore files and .git/ are "
            "always honoured; repeatable)"),
        Opt("--sync-limit", spec=False, metavar="SIZE",  # None: 1G (remote_submit), and "given" can be told apart
            help="with --remote: refuse a sync that would send more than SIZE (default 1G)"),
    )),
    ("what and how", (
        Opt("-m", "--module", action="store_true", help="SCRIPT is a Python module"),
        Opt("--no-python", action="store_true", help="SCRIPT is an executable"),
        Opt("--legacy-local-rank-arg", action="store_true",
            help="pass --local-rank=N to SCRIPT, as torch.distributed.launch did (every mode and scheduler)"),
        Opt("--dry-run", spec=False, action="store_true", help="print the script (or local commands); submit nothing"),
        # Every boolean a profile may set has its --no- undo (docs: Profiles); -m, --no-python and
        # --legacy-local-rank-arg are not taken from files (profiles.CHANGES_WHAT_RUNS), so they have none.
        Opt("--wait", spec=False, action="toggle", default=False,
            help="follow the job until it ends; exit with its code"),
        Opt("--wait-timeout", spec=False, type=Seconds("--wait-timeout"),
            help="give up following after this many seconds"),
        Opt("--cancel-on-interrupt", spec=False, action="toggle", default=False,
            help="with --wait: Ctrl-C cancels the job without asking"),
    )),
)
del Opt


def add_submit_options(s: Any) -> None:
    """Every option of :data:`SUBMIT_OPTIONS` in its group, then SCRIPT and its ARGS."""
    import argparse

    for title, options in SUBMIT_OPTIONS:
        group = s.add_argument_group(title)
        for option in options:
            option.add_to(group, argparse.BooleanOptionalAction)
    s.add_argument("script", metavar="SCRIPT")
    rest = s.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS", help="passed to SCRIPT unchanged")
    rest.required = False  # argparse counts a REMAINDER as required: "required: SCRIPT, ARGS" misled


def spec_options() -> list[SubmitOption]:
    """The options whose values are JobSpec fields, in the table's order."""
    return [o for _, group in SUBMIT_OPTIONS for o in group if o.field is not None]


def spec_value(option: SubmitOption, value: Any) -> Any:
    """An option's value (as argparse or a profile gives it) as its JobSpec field's."""
    if option.to_spec is not None:
        from ..core import parse

        return getattr(parse, option.to_spec)(value)
    return tuple(value) if isinstance(value, list) else value


def spec_values(ns: Any) -> dict[str, Any]:
    """The JobSpec fields the options in ``ns`` give, by field name, --nodes as nodes and min_nodes;
    SCRIPT, its ARGS and the interpreter (app.resolve's) are the caller's."""
    from ..core.parse import parse_nodes

    values = {o.field: spec_value(o, getattr(ns, o.dest)) for o in spec_options() if o.field is not None}
    values["nodes"], values["min_nodes"] = parse_nodes(ns.nodes)
    return values


def refuse_remote_only(ns: Any) -> None:
    """The options that mean something only with --remote, given without it: refused, not ignored (here, not
    with the remote modules, which a local submission does not import)."""
    given = [flag for flag, on in (("--remote-setup", ns.remote_setup), ("--remote-exclude", ns.remote_exclude),
                                   ("--no-sync", ns.sync is False),
                                   ("--sync-limit", ns.sync_limit is not None))
             if on]
    if given:
        from ..core.errors import SpecError

        raise SpecError(f"{', '.join(given)}: only with --remote [USER@]HOST[:DIR] (leave it out, or add --remote)")
