"""`submit --remote` and the job commands for jobs that live on a remote Slurm or PBS cluster.

The script is rendered here, by the same templates and validation as a local submission, for the remote
directory; the project is synced there (remote.sync); sbatch or qsub runs on the login node with the script on
its standard input (never inside a shell string). The laptop keeps the record (the index points at it, with
the destination), so `status`, `logs` and `cancel` know where to ask. They ask through the scheduler's own
edge (schedulers.slurm / schedulers.pbs) with the ssh runner plugged in (remote_runner.SshRunner): the code
that answers for a job of this machine answers for a remote one.
"""

from __future__ import annotations

import codecs
import contextlib
import hashlib
import os
import shlex
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, replace
from typing import Any

from ..core.errors import JobStateError, SchedulerError, SpecError
from ..core.spec import JobSpec
from ..schedulers import JobStatus
from ..schedulers.interface import Scheduler, SchedulerName
from ..schedulers.runner import READ_LIMIT, use_runner
from .records import JobRecord
from .remote import (
    COMMAND_TIMEOUT_S,
    Connection,
    Destination,
    RemoteError,
    parse_destination,
    parse_size,
    pythonpath_setup,
    resolve_directory,
    shell_command,
    ship_argv,
    ship_package,
    shipped_path,
    sync,
    sync_argv,
)
from .remote_runner import SshRunner

DEFAULT_SYNC_LIMIT_TEXT = "1G"  # --sync-limit's default, as written


def _project_name(workdir: str) -> str:
    name = os.path.basename(os.path.normpath(workdir)) or "project"
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name)


def _refuse_unsupported_remote(ns: Any, spec: JobSpec) -> None:
    """What --remote does not do yet: say so instead of doing something else."""
    if ns.scheduler not in ("auto", "slurm", "pbs"):
        raise SpecError(f"--remote with --scheduler {ns.scheduler}: over ssh the cluster's Slurm or PBS runs the "
                        f"job (leave out --scheduler, or --scheduler slurm or pbs)")
    if spec.container:
        raise SpecError("--remote with --container-image/--apptainer is not supported yet (the container mounts "
                        "this machine's slurmlaunch); submit on the login node")
    if spec.is_array:
        raise SpecError("--remote with --array/--sweep is not supported yet; submit on the login node")


def refuse_remote_only(ns: Any) -> None:
    """The options that mean something only with --remote, given without it: refused, not ignored."""
    given = [flag for flag, on in (("--remote-setup", ns.remote_setup), ("--remote-exclude", ns.remote_exclude),
                                   ("--no-sync", ns.sync is False),
                                   ("--sync-limit", ns.sync_limit not in (None, DEFAULT_SYNC_LIMIT_TEXT)))
             if on]
    if given:
        raise SpecError(f"{', '.join(given)}: only with --remote [USER@]HOST[:DIR] (leave it out, or add --remote)")


def remote_scheduler(requested: str, runner: SshRunner) -> SchedulerName:
    """--scheduler for a login node: slurm or pbs as given; auto: Slurm where sbatch is on the login node's
    PATH (after the --remote-setup lines), else PBS where qsub is (one `command -v` round trip for both)."""
    if requested in ("slurm", "pbs"):
        return "slurm" if requested == "slurm" else "pbs"
    target = runner.conn.dest.target
    chosen: SchedulerName
    if runner.which("sbatch"):
        chosen, why = "slurm", "sbatch is on its PATH"
    elif runner.which("qsub"):
        chosen, why = "pbs", "qsub is on its PATH and sbatch is not"
    else:
        raise SpecError(f"--remote {runner.conn.dest}: neither sbatch nor qsub is on the PATH of {target}; add the "
                        f"--remote-setup line that puts them there (e.g. 'module load slurm'), or --scheduler "
                        f"slurm or pbs")
    sys.stderr.write(f"slurmlaunch: --scheduler auto chose {chosen} on {target} ({why})\n")
    return chosen


def _parse_job_id(name: SchedulerName, out: str) -> str | None:
    from ..schedulers import pbs, slurm

    return (slurm.parse_job_id if name == "slurm" else pbs.parse_job_id)(out)


def _checked_excludes(ns: Any, spec: JobSpec) -> list[str]:
    excludes = list(ns.remote_exclude or [])
    for pattern in excludes:
        if not pattern or not pattern.isprintable():
            raise SpecError(f"--remote-exclude {pattern!r} is not a pattern (expected an rsync --exclude "
                            f"pattern on one line, e.g. data/ or *.ckpt)")
    if not os.path.isabs(spec.output_dir):
        excludes.append(f"/{spec.output_dir.strip('/')}/")  # the job's logs are the remote's, never sent over
    return excludes


def submit_remote(ns: Any, spec_from_args: Callable[[Any], JobSpec]) -> int:
    """`submit --remote DEST`: render here, sync, sbatch or qsub there, follow from here with --wait."""
    from ..core.support import refuse_unsupported
    from ..schedulers.choice import scheduler

    dest = parse_destination(ns.remote)
    limit = parse_size(ns.sync_limit) if ns.sync_limit else None
    # The ranks' interpreter is the cluster's (python3 there, or --python's path there): validated as one
    # of this machine's would be, it would have to exist here.
    python = ns.python or "python3"
    ns.python = sys.executable
    spec = replace(spec_from_args(ns), python=python)
    _refuse_unsupported_remote(ns, spec)
    origins = getattr(ns, "option_origins", {})
    if ns.scheduler != "auto":
        refuse_unsupported(spec, ns.scheduler, origins)  # before any ssh
    excludes = _checked_excludes(ns, spec)
    with Connection(dest, ns.remote_setup or ()) as conn:
        runner = SshRunner(conn)
        name = remote_scheduler(ns.scheduler, runner)
        if ns.scheduler == "auto":
            refuse_unsupported(spec, name, origins)
        edge = scheduler(name)
        remote_dir = dest.directory if dest.directory and dest.directory.startswith("/") and ns.dry_run else \
            resolve_directory(conn, dest.directory, _project_name(spec.workdir), create=not ns.dry_run)
        # The launcher travels with the job (remote.ship_package): the ranks import the package sent below.
        package = shipped_path(remote_dir)
        rspec = replace(spec, workdir=remote_dir, setup=(*spec.setup, pythonpath_setup(package)))
        script = edge.render(rspec, ns.template_dir)
        command = edge.submit_command(rspec, "-")[:-1]  # no file: sbatch and qsub read the script from stdin
        submit_line = shell_command(f"umask 077 && mkdir -p -m 700 -- {shlex.quote(rspec.log_dir)} && "
                                    f"{shlex.join(command)}", conn.setup)
        if ns.dry_run:
            if ns.sync:
                sys.stderr.write("# would run here: " + shlex.join(sync_argv(conn, spec.workdir, remote_dir,
                                                                              excludes)) + "\n")
            sys.stderr.write("# would run here: " + shlex.join(ship_argv(conn, remote_dir)) + "\n")
            sys.stderr.write(f"# would run on {dest.target} (this script on its stdin):\n"
                             + "".join(f"#   {line}\n" for line in submit_line.splitlines()))
            sys.stdout.write(script)
            return 0
        if ns.sync:
            summary = sync(conn, spec.workdir, remote_dir, excludes,
                           limit if limit is not None else parse_size(DEFAULT_SYNC_LIMIT_TEXT))
            sys.stderr.write(summary.line(f"{dest.target}:{remote_dir}") + "\n")
        ship_package(conn, remote_dir)
        out = conn.run(submit_line, input_bytes=script.encode()).stdout.decode(errors="replace").strip()
        full_id = out.splitlines()[-1].strip() if out else ""
        job_id = _parse_job_id(name, full_id)
        if job_id is None:
            raise RemoteError(f"on {dest.target}: {shlex.join(command)} printed {out!r}, not a job id")
        if name == "slurm":
            full_id = job_id  # 1234;cluster is 1234 to squeue and scancel
        record = write_local_record(dest, conn.setup, rspec, job_id, full_id, name, command, script)
        from ..schedulers.index import remember

        remember(full_id, name, record, rspec.name, remote=dest.target)
        sys.stderr.write(f"slurmlaunch: submitted job {full_id} on {dest.target} ({rspec.world_size} ranks on "
                         f"{rspec.nodes} node(s)); working directory {remote_dir}\n")
        print(full_id)
        sys.stdout.flush()
        if not ns.wait:
            return 0
        return wait_remote(runner, edge, rspec, full_id, ns.cancel_on_interrupt, ns.wait_timeout)


def _records_dir(dest: Destination) -> str:
    from ..core.paths import state_dir

    tag = hashlib.sha256(dest.target.encode()).hexdigest()[:12]
    return os.path.join(state_dir(), "remote", tag)


def write_local_record(dest: Destination, setup: tuple[str, ...], spec: JobSpec, job_id: str, full_id: str,
                       scheduler: SchedulerName, command: list[str], script: str) -> str:
    """The job's record and script on this machine (private), for status/logs/cancel later. ``job_id`` names
    the job's files; ``full_id`` is the scheduler's (PBS: 1234.server)."""
    from ..schedulers import rank_log, write_private

    directory = _records_dir(dest)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    script_path = os.path.join(directory, f"job-{job_id}.{'sbatch' if scheduler == 'slurm' else 'qsub'}")
    write_private(script_path, script, 0o600)
    record = {
        "job_id": job_id, "scheduler": scheduler, "remote": dest.target, "remote_setup": list(setup),
        "submitted_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "command": command, "log_dir": spec.log_dir,
        "rank_log": rank_log(spec, job_id, 0), "script": script_path, "spec": asdict(spec),
        **({"pbs_job_id": full_id} if full_id != job_id else {}),
    }
    path = os.path.join(directory, f"job-{job_id}.json")
    write_private(path, JobRecord(record, job_id).to_json(), 0o600)
    return path


MAX_BACKOFF_S = 15.0


class RemoteFollower:
    """follow()'s status callable for a remote job: each call asks the scheduler's edge over the ssh runner (a
    running Slurm job: one squeue round trip), then reads what ``log`` gained (one bounded read; once the job
    has ended, until the end of the file) and prints it. When the connection drops, each failed call waits
    longer before it reports (1, 2, 4 ... 15 s), so that follow()'s retries back off; follow() gives up after
    its LOST_CONTACT_S with one line."""

    def __init__(self, runner: SshRunner, edge: Scheduler, job_id: str, log_dir: str, log: str | None) -> None:
        self.runner, self.edge, self.job_id, self.log_dir, self.log = runner, edge, job_id, log_dir, log
        self.offset = 0
        self.failures = 0
        self._text = codecs.getincrementaldecoder("utf-8")(errors="replace")  # a character split by a chunk

    def _pump(self, to_the_end: bool) -> None:
        while self.log:
            data = self.runner.read(self.log, self.offset, READ_LIMIT)
            if data:
                self.offset += len(data)
                sys.stdout.write(self._text.decode(data))
                sys.stdout.flush()
            if not to_the_end or data is None or len(data) < READ_LIMIT:
                return

    def __call__(self) -> JobStatus:
        target = self.runner.conn.dest.target
        try:
            with use_runner(self.runner):
                st = self.edge.status(self.job_id, self.log_dir)
            self._pump(to_the_end=st.finished)
        except RemoteError as e:
            self.failures += 1
            if self.failures == 1:
                sys.stderr.write(f"slurmlaunch: lost contact with {target} ({e}); trying again, the job is not "
                                 f"affected\n")
            time.sleep(min(2.0 ** (self.failures - 1), MAX_BACKOFF_S) - 1.0)  # follow() sleeps 1 s more
            raise
        if self.failures:
            sys.stderr.write(f"slurmlaunch: reconnected to {target} after {self.failures} failed attempt(s)\n")
            self.failures = 0
        return st


def wait_remote(runner: SshRunner, edge: Scheduler, spec: JobSpec, job_id: str, cancel_on_interrupt: bool,
                timeout: float | None) -> int:
    """Follow the job from here: its states and rank 0's output (where the scheduler writes one; PBS: the
    states), as `submit --wait` does locally. A dropped connection is retried on every poll (a new master
    each time) for follow's LOST_CONTACT_S."""
    from .follow import ask, follow

    target = runner.conn.dest.target
    files_id = job_id.split(".", 1)[0]
    status = RemoteFollower(runner, edge, job_id, spec.log_dir, edge.rank_log(spec, files_id, 0))
    try:
        code: int = follow(job_id, status, None, timeout=timeout)
    except KeyboardInterrupt:
        if cancel_on_interrupt or ask(f"\nslurmlaunch: cancel job {job_id} on {target}? [y/N] "):
            with use_runner(runner):
                edge.cancel(job_id)
            sys.stderr.write(f"slurmlaunch: cancelled job {job_id}\n")
        else:
            sys.stderr.write(f"slurmlaunch: job {job_id} keeps running on {target} (slurmlaunch cancel "
                             f"{job_id} cancels it; slurmlaunch logs --follow {job_id} follows it)\n")
        return 130
    sys.stderr.write(f"slurmlaunch: logs on {target}:{spec.log_dir}\n")
    return code


# -- the job commands, for a record with a "remote" key: the edge of its scheduler, over the ssh runner --

@contextlib.contextmanager
def _login_node(record: JobRecord) -> Iterator[tuple[SshRunner, Scheduler]]:
    """The record's scheduler edge with its commands (and file reads) on the record's login node."""
    from ..schedulers.choice import scheduler

    edge = scheduler(record.scheduler)
    with Connection(parse_destination(str(record.remote)), tuple(record.data.get("remote_setup") or ())) as conn:
        runner = SshRunner(conn)
        with use_runner(runner):
            yield runner, edge


def status(record: JobRecord) -> dict[str, Any]:
    with _login_node(record) as (_, edge):
        st = edge.status(record.full_id, record.log_dir)
    return {"job_id": record.full_id, "scheduler": record.scheduler, "remote": record.remote, "state": st.state,
            "exit_code": st.exit_code, "nodes": st.nodes, "elapsed": st.elapsed}


def logs(record: JobRecord, path: str, follow: bool) -> int:
    """Print the remote log ``path`` (with ``follow``: as it grows, until the job ends), in bounded reads."""
    from .follow import follow as follow_job

    with _login_node(record) as (runner, edge):
        if follow:
            return follow_job(record.full_id, RemoteFollower(runner, edge, record.full_id, record.log_dir, path),
                              None)
        offset = 0
        while True:
            data = runner.read(path, offset, READ_LIMIT)
            if data is None and offset == 0:
                raise JobStateError(f"no log {path!r} on {runner.conn.dest.target} yet")
            sys.stdout.buffer.write(data or b"")
            offset += len(data or b"")
            if data is None or len(data) < READ_LIMIT:
                sys.stdout.flush()
                return 0


def cancel(record: JobRecord) -> None:
    with _login_node(record) as (_, edge):
        edge.cancel(record.full_id)


def _queue_states(record: JobRecord, row: Mapping[str, Any]) -> dict[str, str]:
    """The destination's jobs, id -> state: Slurm's in one `squeue --me`; a PBS job's own (qstat)."""
    from ..schedulers.runner import run_command

    with _login_node(record) as (_, edge):
        if record.scheduler == "pbs":
            return {str(row["job_id"]): edge.status(record.full_id, record.log_dir).state}
        out = run_command(["squeue", "-h", "--me", "-o", "%F %T"], timeout=30).stdout
    return dict(line.split(" ", 1) for line in out.splitlines() if " " in line)


def list_row(row: Mapping[str, Any], live: dict[str, dict[str, str] | None]) -> dict[str, Any]:
    """`list`'s row for a remote job: a quick state from one `squeue --me` per destination (``live``
    caches it; PBS: the job's qstat), its files' place as DEST:DIR. `status` asks properly."""
    from ..schedulers.index import read_bounded

    target = str(row["remote"])
    try:
        record = JobRecord.from_json(read_bounded(str(row["record"])).decode("utf-8"), str(row["job_id"]))
    except (OSError, ValueError, KeyError, TypeError):
        return {**row, "state": "record gone", "directory": f"{target}:?"}
    key = target if record.scheduler == "slurm" else f"{target} {row['job_id']}"
    if key not in live:
        try:
            live[key] = _queue_states(record, row)
        except SchedulerError:
            live[key] = None  # unreachable now: no quick state
    known = live[key]
    state = "?" if known is None else known.get(str(row["job_id"]), "ENDED?")
    return {**row, "state": state, "directory": f"{target}:{record.log_dir}"}


def doctor_remote(target: str, setup: Sequence[str], python: str | None, argv: list[str], wait: float) -> int:
    """`doctor --remote DEST`: this slurmlaunch is sent to DEST's directory (as for submit) and its doctor runs
    there, in that directory, with ``argv``; its report and exit code come back. ``wait``: --allocate's
    --timeout (0 without), added to the time the remote command is given."""
    dest = parse_destination(target)
    with Connection(dest, setup) as conn:
        remote_dir = resolve_directory(conn, dest.directory, _project_name(os.getcwd()), create=True)
        package = ship_package(conn, remote_dir)
        command = [python or "python3", "-m", "slurmlaunch", "doctor", *argv]
        script = (f"cd -- {shlex.quote(remote_dir)} && umask 077 && {pythonpath_setup(package)} && "
                  f"{shlex.join(command)}")
        proc = conn.run(shell_command(script, conn.setup), check=False, timeout=COMMAND_TIMEOUT_S + wait)
    if proc.returncode not in (0, 1, 2):  # not doctor's own answer: the interpreter is missing, or worse
        said = proc.stderr.decode(errors="replace").strip().splitlines() or ["(no output)"]
        raise RemoteError(f"on {dest.target}: {shlex.join(command)} failed (exit {proc.returncode}): {said[-1]}")
    sys.stdout.buffer.write(proc.stdout)
    sys.stdout.flush()
    sys.stderr.buffer.write(proc.stderr)
    return proc.returncode
