"""`submit --remote` and the job commands for jobs that live on a remote Slurm cluster.

The script is rendered here, by the same templates and validation as a local submission, for the remote
directory; the project is synced there (remote.sync); sbatch runs on the login node with the script on its
standard input (never inside a shell string). The laptop keeps the record (the index points at it, with the
destination), so `status`, `logs` and `cancel` know where to ask.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shlex
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, replace
from typing import Any

from ..core.errors import SchedulerError, SpecError
from ..core.spec import JobSpec
from ..schedulers import JobStatus
from .records import JobRecord
from .remote import (
    Connection,
    Destination,
    RemoteError,
    parse_destination,
    parse_size,
    pythonpath_setup,
    remote_command,
    resolve_directory,
    shell_command,
    ship_argv,
    ship_package,
    shipped_path,
    sync,
    sync_argv,
)

DEFAULT_SYNC_LIMIT_TEXT = "1G"  # --sync-limit's default, as written

# Run on the login node by its python3 (standard library only): the job's state, as the Slurm edge finds it
# locally (squeue while it is queued or running; then sacct, else scontrol; the exit code from the file the
# batch script writes), and what a log gained since OFFSET, in one JSON line. One round trip per poll.
PROBE = r"""
import base64, json, os, re, shutil, subprocess, sys
job, log_dir, log, offset = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
         "BOOT_FAIL", "DEADLINE")
def run(cmd):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=30, errors="replace")
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, str(e)
    return (p.stdout if p.returncode == 0 else None), p.stderr.strip()
out = {"state": None, "exit_code": None, "nodes": None, "elapsed": None}
line, err = run(["squeue", "-h", "-j", job, "-o", "%T %M %N"])
if line is None and "Invalid job id" not in err:
    print(json.dumps({"error": "squeue -j " + job + ": " + (err or "failed")}))
    sys.exit(0)
parts = ((line or "").strip() + "  ").split(" ", 2)
if parts[0] and parts[0] not in ENDED:
    out.update(state=parts[0], elapsed=parts[1] or None, nodes=parts[2].strip() or None)
else:
    fields = {}
    if shutil.which("sacct"):
        acct, _ = run(["sacct", "-n", "-X", "-P", "-j", job, "-o", "State,Elapsed,NodeList,ExitCode"])
        row = next((r for r in (acct or "").splitlines() if r.count("|") == 3), "")
        if row:
            s, e, n, x = row.split("|")
            fields = {"JobState": s.split()[0] if s.split() else "", "Elapsed": e, "NodeList": n, "ExitCode": x}
    if not fields:
        shown, _ = run(["scontrol", "show", "job", "-o", job])
        found = re.findall(r"\b(JobState|ExitCode|NodeList|RunTime)=(\S+)", (shown or "").split(" UserId=", 1)[-1])
        fields = dict(reversed(found))
        if "RunTime" in fields:
            fields["Elapsed"] = fields.pop("RunTime")
    code = None
    try:
        with open(os.path.join(log_dir, "job-" + job + ".exitcode")) as f:
            code = int(f.read().strip())
    except (OSError, ValueError):
        pass
    state = fields.get("JobState") or ("COMPLETED" if code == 0 else "FAILED" if code else "GONE")
    if code is None and "ExitCode" in fields:
        status, _, signal = fields["ExitCode"].partition(":")
        code = int(status) if status.isdigit() else None
        if code == 0 and signal.isdigit() and int(signal):
            code = 128 + int(signal)
    if code is None or (code == 0 and state != "COMPLETED"):
        code = 0 if state == "COMPLETED" else 1
    nodes = fields.get("NodeList")
    out.update(state=state, exit_code=code, elapsed=fields.get("Elapsed"),
               nodes=nodes if nodes not in (None, "None assigned", "(null)") else None)
data = b""
if log:
    try:
        with open(log, "rb") as f:
            f.seek(offset)
            data = f.read(1 << 20)
    except OSError:
        pass
out["log"] = base64.b64encode(data).decode()
print(json.dumps(out))
"""


def _project_name(workdir: str) -> str:
    name = os.path.basename(os.path.normpath(workdir)) or "project"
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name)


def _refuse_unsupported_remote(ns: Any, spec: JobSpec) -> None:
    """What --remote does not do yet: say so instead of doing something else."""
    if ns.scheduler not in ("auto", "slurm"):
        raise SpecError(f"--remote with --scheduler {ns.scheduler}: only Slurm clusters are supported over ssh "
                        f"for now (leave out --scheduler, or submit on the login node)")
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


def submit_remote(ns: Any, spec_from_args: Callable[[Any], JobSpec]) -> int:
    """`submit --remote DEST`: render here, sync, sbatch there, follow from here with --wait."""
    from ..core.support import refuse_unsupported
    from ..schedulers import slurm

    dest = parse_destination(ns.remote)
    limit = parse_size(ns.sync_limit) if ns.sync_limit else None
    # The ranks' interpreter is the cluster's (python3 there, or --python's path there): validated as one
    # of this machine's would be, it would have to exist here.
    python = ns.python or "python3"
    ns.python = sys.executable
    spec = replace(spec_from_args(ns), python=python)
    _refuse_unsupported_remote(ns, spec)
    refuse_unsupported(spec, "slurm", getattr(ns, "option_origins", {}))
    excludes = list(ns.remote_exclude or [])
    for pattern in excludes:
        if not pattern or not pattern.isprintable():
            raise SpecError(f"--remote-exclude {pattern!r} is not a pattern (expected an rsync --exclude "
                            f"pattern on one line, e.g. data/ or *.ckpt)")
    if not os.path.isabs(spec.output_dir):
        excludes.append(f"/{spec.output_dir.strip('/')}/")  # the job's logs are the remote's, never sent over
    with Connection(dest, ns.remote_setup or ()) as conn:
        remote_dir = dest.directory if dest.directory and dest.directory.startswith("/") and ns.dry_run else \
            resolve_directory(conn, dest.directory, _project_name(spec.workdir), create=not ns.dry_run)
        # The launcher travels with the job (remote.ship_package): the ranks import the package sent below.
        package = shipped_path(remote_dir)
        rspec = replace(spec, workdir=remote_dir, setup=(*spec.setup, pythonpath_setup(package)))
        script = slurm.render_script(rspec, ns.template_dir)
        sbatch = slurm.sbatch_command(rspec, "-")[:-1]  # no file: sbatch reads the script from stdin
        submit_line = shell_command(f"umask 077 && mkdir -p -m 700 -- {shlex.quote(rspec.log_dir)} && "
                                    f"{shlex.join(sbatch)}", conn.setup)
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
        job_id = out.splitlines()[-1].split(";")[0] if out else ""
        if not job_id.isdigit():
            raise RemoteError(f"on {dest.target}: {shlex.join(sbatch)} printed {out!r}, not a job id")
        record = write_local_record(dest, conn.setup, rspec, job_id, sbatch, script)
        from ..schedulers.index import remember

        remember(job_id, "slurm", record, rspec.name, remote=dest.target)
        sys.stderr.write(f"slurmlaunch: submitted job {job_id} on {dest.target} ({rspec.world_size} ranks on "
                         f"{rspec.nodes} node(s)); working directory {remote_dir}\n")
        print(job_id)
        sys.stdout.flush()
        if not ns.wait:
            return 0
        return wait_remote(conn, rspec, job_id, ns.cancel_on_interrupt, ns.wait_timeout)


def _records_dir(dest: Destination) -> str:
    from ..core.paths import state_dir

    tag = hashlib.sha256(dest.target.encode()).hexdigest()[:12]
    return os.path.join(state_dir(), "remote", tag)


def write_local_record(dest: Destination, setup: tuple[str, ...], spec: JobSpec, job_id: str,
                       command: list[str], script: str) -> str:
    """The job's record and script on this machine (private), for status/logs/cancel later."""
    from ..schedulers import rank_log, write_private

    directory = _records_dir(dest)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    script_path = os.path.join(directory, f"job-{job_id}.sbatch")
    write_private(script_path, script, 0o600)
    record = {
        "job_id": job_id, "scheduler": "slurm", "remote": dest.target, "remote_setup": list(setup),
        "submitted_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "command": command, "log_dir": spec.log_dir,
        "rank_log": rank_log(spec, job_id, 0), "script": script_path, "spec": asdict(spec),
    }
    path = os.path.join(directory, f"job-{job_id}.json")
    write_private(path, JobRecord(record, job_id).to_json(), 0o600)
    return path


def probe(conn: Connection, job_id: str, log_dir: str, log: str = "", offset: int = 0) -> tuple[JobStatus, bytes]:
    """The job's state and what ``log`` gained after ``offset``, in one round trip."""
    proc = conn.run(remote_command(["python3", "-c", PROBE, job_id, log_dir, log, str(offset)], conn.setup))
    try:
        answer = json.loads(proc.stdout.decode(errors="replace").strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise RemoteError(f"on {conn.dest.target}: the status probe printed "
                          f"{proc.stdout[-200:]!r}, not its JSON line") from None
    if answer.get("error"):
        raise SchedulerError(f"on {conn.dest.target}: {answer['error']}")
    st = JobStatus(answer["state"], answer["exit_code"], answer["nodes"], elapsed=answer["elapsed"])
    return st, base64.b64decode(answer["log"])


MAX_BACKOFF_S = 15.0


class RemoteFollower:
    """follow()'s status callable for a remote job: each call is one probe, which also prints what the log
    gained. When the connection drops, each failed call waits longer before it reports (1, 2, 4 ... 15 s),
    so that follow()'s retries back off; follow() gives up after its LOST_CONTACT_S with one line."""

    def __init__(self, conn: Connection, job_id: str, log_dir: str, log: str) -> None:
        self.conn, self.job_id, self.log_dir, self.log = conn, job_id, log_dir, log
        self.offset = 0
        self.failures = 0

    def __call__(self) -> JobStatus:
        try:
            st, data = probe(self.conn, self.job_id, self.log_dir, self.log, self.offset)
        except RemoteError as e:
            self.failures += 1
            if self.failures == 1:
                sys.stderr.write(f"slurmlaunch: lost contact with {self.conn.dest.target} ({e}); trying again, "
                                 f"the job is not affected\n")
            time.sleep(min(2.0 ** (self.failures - 1), MAX_BACKOFF_S) - 1.0)  # follow() sleeps 1 s more
            raise
        if self.failures:
            sys.stderr.write(f"slurmlaunch: reconnected to {self.conn.dest.target} after {self.failures} failed "
                             f"attempt(s)\n")
            self.failures = 0
        if data:
            self.offset += len(data)
            sys.stdout.write(data.decode("utf-8", errors="replace"))
            sys.stdout.flush()
        return st


def wait_remote(conn: Connection, spec: JobSpec, job_id: str, cancel_on_interrupt: bool,
                timeout: float | None) -> int:
    """Follow the job from here: its states and rank 0's output, as `submit --wait` does locally. A dropped
    connection is retried on every poll (a new master each time) for follow's LOST_CONTACT_S."""
    from ..schedulers import rank_log
    from .follow import ask, follow

    status = RemoteFollower(conn, job_id, spec.log_dir, rank_log(spec, job_id, 0))
    try:
        code: int = follow(job_id, status, None, timeout=timeout)
    except KeyboardInterrupt:
        if cancel_on_interrupt or ask(f"\nslurmlaunch: cancel job {job_id} on {conn.dest.target}? [y/N] "):
            conn.run_argv(["scancel", job_id], timeout=60)
            sys.stderr.write(f"slurmlaunch: cancelled job {job_id}\n")
        else:
            sys.stderr.write(f"slurmlaunch: job {job_id} keeps running on {conn.dest.target} (slurmlaunch cancel "
                             f"{job_id} cancels it; slurmlaunch logs --follow {job_id} follows it)\n")
        return 130
    sys.stderr.write(f"slurmlaunch: logs on {conn.dest.target}:{spec.log_dir}\n")
    return code


# -- the job commands, for a record with a "remote" key -------------------------------------------------

def _connection(record: JobRecord) -> Connection:
    return Connection(parse_destination(str(record.remote)), tuple(record.data.get("remote_setup") or ()))


def status(record: JobRecord) -> dict[str, Any]:
    with _connection(record) as conn:
        st, _ = probe(conn, record.full_id, record.log_dir)
    return {"job_id": record.full_id, "scheduler": "slurm", "remote": record.remote, "state": st.state,
            "exit_code": st.exit_code, "nodes": st.nodes, "elapsed": st.elapsed}


def logs(record: JobRecord, path: str, follow: bool) -> int:
    """Print the remote log ``path`` (with ``follow``: as it grows, until the job ends)."""
    job_id = record.full_id
    with _connection(record) as conn:
        if not follow:
            proc = conn.run_argv(["cat", "--", path], check=False)
            if proc.returncode != 0:
                raise SpecError(f"no log {path!r} on {conn.dest.target} yet")
            sys.stdout.buffer.write(proc.stdout)
            return 0
        from .follow import follow as follow_job

        return follow_job(job_id, RemoteFollower(conn, job_id, record.log_dir, path), None)


def cancel(record: JobRecord) -> None:
    with _connection(record) as conn:
        conn.run_argv(["scancel", record.full_id], timeout=60)


def list_row(row: Mapping[str, Any], live: dict[str, dict[str, str] | None]) -> dict[str, Any]:
    """`list`'s row for a remote job: a quick state from one `squeue --me` per destination (``live``
    caches it), its files' place as DEST:DIR. `status` asks properly."""
    from ..schedulers.index import read_bounded

    target = str(row["remote"])
    try:
        record = json.loads(read_bounded(str(row["record"])).decode("utf-8"))
        directory = f"{target}:{record['log_dir']}"
        setup = tuple(record.get("remote_setup") or ())
    except (OSError, ValueError, KeyError, TypeError):
        return {**row, "state": "record gone", "directory": f"{target}:?"}
    if target not in live:
        try:
            with Connection(parse_destination(target), setup) as conn:
                out = conn.run_argv(["squeue", "-h", "--me", "-o", "%F %T"], timeout=30).stdout.decode(errors="replace")
            live[target] = dict(line.split(" ", 1) for line in out.splitlines() if " " in line)
        except SchedulerError:
            live[target] = None  # unreachable now: no quick state
    known = live[target]
    state = "?" if known is None else known.get(str(row["job_id"]), "ENDED?")
    return {**row, "state": state, "directory": directory}

