"""`submit --remote`: the script rendered here for the remote directory, the project synced there
(remote_sync), the package sent (remote_ship), sbatch or qsub on the login node with the script on its
standard input (never inside a shell string), and the record kept here, so that the job commands know where
to ask (remote_jobs)."""

from __future__ import annotations

import hashlib
import os
import shlex
import sys
import time
from collections.abc import Callable
from typing import Any

from ...core.errors import SpecError
from ...core.jobfiles import JobFiles
from ...core.spec import JobSpec
from ...schedulers.interface import Scheduler, SchedulerName
from ...schedulers.registry import ACCEPTED, NAMES, canonical, scheduler
from ..records import JobRecord
from .dest import Destination, parse_destination, shell_command
from .runner import SshRunner
from .shell import RemoteError
from .ship import check_python, pythonpath_setup, ship_argv, ship_package, shipped_path
from .ssh import Connection
from .sync import parse_size, plural, resolve_directory, sync, sync_argv

DEFAULT_SYNC_LIMIT_TEXT = "1G"  # --sync-limit's default, as written


def _project_name(workdir: str) -> str:
    name = os.path.basename(os.path.normpath(workdir)) or "project"
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name)


def _queued() -> list[Scheduler]:
    """The schedulers that run a job over ssh: those with a queue, in the registry's order."""
    return [edge for edge in map(scheduler, NAMES) if edge.queued]


def _refuse_unsupported_remote(ns: Any, spec: JobSpec) -> None:
    """What --remote does not do yet: say so instead of doing something else."""
    if ns.scheduler != "auto" and (ns.scheduler not in ACCEPTED or not scheduler(ns.scheduler).queued):
        edges = _queued()
        raise SpecError(f"--remote with --scheduler {ns.scheduler}: over ssh the cluster's "
                        f"{' or '.join(e.title for e in edges)} runs the job (leave out --scheduler, or --scheduler "
                        f"{' or '.join(e.name for e in edges)})")
    if spec.container:
        raise SpecError("--remote with --container-image/--apptainer is not supported yet (the container mounts "
                        "this machine's slurmlaunch); submit on the login node")
    if spec.is_array:
        raise SpecError("--remote with --array/--sweep is not supported yet; submit on the login node")


def remote_scheduler(requested: str, runner: SshRunner) -> SchedulerName:
    """--scheduler for a login node: a queued one as given; auto: the registry's first whose client is on the
    login node's PATH (after the --remote-setup lines): Slurm where sbatch is, else PBS where qsub is (one
    `command -v` round trip for both). No controller is asked and nothing falls back to this machine."""
    name = canonical(requested)
    if name is not None:
        return name
    from ...schedulers.choice import announce_once, auto_choice

    target = runner.conn.dest.target
    edges = _queued()

    def none_found(clients: list[str]) -> str:
        return (f"--remote {runner.conn.dest}: neither {' nor '.join(clients)} is on the PATH of {target}; add the "
                f"--remote-setup line that puts them there (e.g. 'module load slurm'), or --scheduler "
                f"{' or '.join(e.name for e in edges)}")

    chosen, why = auto_choice(edges, lambda edge: runner.which(str(edge.client)), where="its PATH", check=False,
                              none_found=none_found)
    announce_once(f"--scheduler auto chose {chosen.name} on {target} ({why})")  # once, as on this machine
    return chosen.name


def _checked_excludes(ns: Any, spec: JobSpec) -> list[str]:
    excludes = list(ns.remote_exclude or [])
    for pattern in excludes:
        if not pattern or not pattern.isprintable():
            raise SpecError(f"--remote-exclude {pattern!r} is not a pattern (expected an rsync --exclude "
                            f"pattern on one line, e.g. data/ or *.ckpt)")
    if not os.path.isabs(spec.output.output_dir):
        excludes.append(f"/{spec.output.output_dir.strip('/')}/")  # the job's logs are the remote's, never sent over
    return excludes


def _show_dry_run(conn: Connection, workdir: str | None, remote_dir: str, excludes: list[str], submit_line: str,
                  script: str) -> int:
    """--dry-run: the script on stdout; on stderr the rsync (``workdir``: None with --no-sync), the package's
    rsync and the remote command that would run."""
    if workdir is not None:
        sys.stderr.write("# would run here: " + shlex.join(sync_argv(conn, workdir, remote_dir, excludes)) + "\n")
    sys.stderr.write("# would run here: " + shlex.join(ship_argv(conn, remote_dir)) + "\n")
    sys.stderr.write(f"# would run on {conn.dest.target} (this script on its stdin):\n"
                     + "".join(f"#   {line}\n" for line in submit_line.splitlines()))
    sys.stdout.write(script)
    return 0


def _queue(conn: Connection, name: SchedulerName, rspec: JobSpec, command: list[str], submit_line: str,
           script: str) -> str:
    """sbatch or qsub there, the script on its stdin; the record kept here and the index told. Returns the
    scheduler's job id."""
    from ...schedulers.index import remember

    dest = conn.dest
    sent = conn.run(submit_line, input_bytes=script.encode(), what=shlex.join(command))
    out = sent.stdout.decode(errors="replace").strip()
    full_id = out.splitlines()[-1].strip() if out else ""
    edge = scheduler(name)
    job_id = edge.parse_job_id(full_id)
    if job_id is None:
        raise RemoteError(f"on {dest.target}: {shlex.join(command)} printed {out!r}, not a job id")
    full_id = edge.command_id(full_id)  # Slurm: 1234;cluster is 1234 to squeue and scancel
    record = write_local_record(dest, conn.setup, rspec, job_id, full_id, name, command, script,
                                known_there(conn, edge, full_id))
    remember(full_id, name, record, rspec.name, remote=dest.target)
    return full_id


def known_there(conn: Connection, edge: Scheduler, full_id: str) -> dict[str, Any]:
    """Which cluster took job ``full_id`` and what it says of the job (a record's "cluster" and "identity"), asked
    over ``conn``, so that a later job of that id there (the login host's cluster started again, another
    destination) is never taken for it (app/records.py); without "identity" where it cannot be read, said."""
    from ...core.errors import SchedulerError
    from ...schedulers.runner import use_runner

    try:
        with use_runner(SshRunner(conn)):
            return {"cluster": {"remote": conn.dest.target, **edge.cluster()},
                    "identity": edge.identity(full_id) or {}}
    except SchedulerError as e:
        sys.stderr.write(f"slurmlaunch: job {full_id}: its identity could not be read on {conn.dest.target} ({e}); "
                         f"its record names none, so cancel will leave it to the scheduler's own command\n")
        return {"cluster": {"remote": conn.dest.target}}


def submit_remote(ns: Any, spec_from_args: Callable[[Any], JobSpec]) -> int:
    """`submit --remote DEST`: render here, sync, sbatch or qsub there, follow from here with --wait."""
    dest = parse_destination(ns.remote)
    # --sync-limit's default (None) is 1G; an empty value is refused like any other that is not a size
    limit = parse_size(DEFAULT_SYNC_LIMIT_TEXT if ns.sync_limit is None else ns.sync_limit)
    # The ranks' interpreter is the cluster's (python3 there, or --python's path there): validated as one
    # of this machine's would be, it would have to exist here.
    python = ns.python or "python3"
    ns.python = sys.executable
    spec = spec_from_args(ns).changed(python=python)
    _refuse_unsupported_remote(ns, spec)
    origins = getattr(ns, "option_origins", {})
    if ns.scheduler != "auto":
        scheduler(ns.scheduler).refuse_unsupported(spec, origins)  # before any ssh
    excludes = _checked_excludes(ns, spec)
    with Connection(dest, ns.remote_setup or ()) as conn:
        runner = SshRunner(conn)
        name = remote_scheduler(ns.scheduler, runner)
        edge = scheduler(name)
        if ns.scheduler == "auto":
            edge.refuse_unsupported(spec, origins)
        if not ns.dry_run or python.startswith("~"):  # a dry run asks only for the remote home
            spec = spec.changed(python=check_python(conn, python))  # ~/ expanded there
        remote_dir = dest.directory if dest.directory and dest.directory.startswith("/") and ns.dry_run else \
            resolve_directory(conn, dest.directory, _project_name(spec.program.workdir), create=not ns.dry_run)
        # The launcher travels with the job (remote.ship_package): the ranks import the package sent below.
        package = shipped_path(remote_dir)
        rspec = spec.changed(workdir=remote_dir, setup=(*spec.environment.setup, pythonpath_setup(package)))
        script = edge.render(rspec, ns.template_dir)
        command = edge.submit_command(rspec, "-")[:-1]  # no file: sbatch and qsub read the script from stdin
        submit_line = shell_command(f"umask 077 && mkdir -p -m 700 -- {shlex.quote(rspec.log_dir)} && "
                                    f"{shlex.join(command)}", conn.setup)
        if ns.dry_run:
            return _show_dry_run(conn, spec.program.workdir if ns.sync else None, remote_dir, excludes, submit_line,
                                 script)
        if ns.sync:
            summary = sync(conn, spec.program.workdir, remote_dir, excludes,
                           limit if limit is not None else parse_size(DEFAULT_SYNC_LIMIT_TEXT))
            sys.stderr.write(summary.line(f"{dest.path_target}:{remote_dir}") + "\n")
        ship_package(conn, remote_dir)
        full_id = _queue(conn, name, rspec, command, submit_line, script)
        sys.stderr.write(f"slurmlaunch: submitted job {full_id} on {dest.target} ({plural(rspec.world_size, 'rank')} "
                         f"on {plural(rspec.resources.nodes, 'node')}); working directory {remote_dir}\n")
        print(full_id)
        sys.stdout.flush()
        if not ns.wait:
            return 0
        from .follow import wait_remote

        return wait_remote(runner, edge, rspec, full_id, ns.cancel_on_interrupt, ns.wait_timeout)


def _records_dir(dest: Destination) -> str:
    from ...core.paths import state_dir

    tag = hashlib.sha256(dest.target.encode()).hexdigest()[:12]
    return os.path.join(state_dir(), "remote", tag)


def write_local_record(dest: Destination, setup: tuple[str, ...], spec: JobSpec, job_id: str, full_id: str,
                       name: SchedulerName, command: list[str], script: str,
                       known: dict[str, Any] | None = None) -> str:
    """The job's record and script on this machine (private), for status/logs/cancel later. ``job_id`` names
    the job's files; ``full_id`` is the scheduler's (PBS: 1234.server); ``known``: its "cluster" and
    "identity". An older record of the same id (the destination's ids were reused) is kept: this one goes to a
    directory of its own."""
    import secrets

    from ...core.jobfiles import own_dir
    from ...schedulers import rank_log, write_private

    directory = _records_dir(dest)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    files = JobFiles(directory, job_id)
    if os.path.lexists(files.record):
        files = JobFiles(own_dir(directory, job_id, secrets.token_hex(4)), job_id)
        os.mkdir(files.log_dir, 0o700)
    script_path = files.script(scheduler(name).script_suffix)
    write_private(script_path, script, 0o600)
    record = {
        "job_id": job_id, "scheduler": name, "remote": dest.target, "remote_setup": list(setup),
        "submitted_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "command": command, "log_dir": spec.log_dir,
        "rank_log": rank_log(spec, job_id, 0), "script": script_path, "spec": spec.values(),
        **({f"{name}_job_id": full_id} if full_id != job_id else {}), **(known or {}),
    }
    path = files.record
    write_private(path, JobRecord(record, job_id).to_json(), 0o600)
    return path
