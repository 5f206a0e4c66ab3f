"""`doctor --remote DEST`: the login-node checks on DEST, and with --allocate the probe job on its nodes, for the
scheduler chosen on DEST as submit --remote chooses it (--scheduler, or auto: the clients on DEST's PATH).

This slurmlaunch is sent to DEST's directory (as for submit) and its doctor runs there, in that directory;
the report and the exit code come back. The probe job's script is rendered here, by the same templates
and validation as a local doctor's, for the remote directory and interpreter, and sent with the request
(doctor_probe.ProbeJob as JSON on the remote command's stdin): the remote needs Python 3 (and torch for
the probe's torch check), not Jinja2.
"""

from __future__ import annotations

import json
import os
import shlex
import sys

from ...core.errors import SlurmLaunchError, SpecError
from ..doctor.command import cmd_doctor, doctor_scheduler
from ..doctor.probe import ProbeJob, probe_job
from . import (
    COMMAND_TIMEOUT_S,
    Connection,
    RemoteError,
    check_python,
    parse_destination,
    pythonpath_setup,
    resolve_directory,
    shell_command,
    ship_package,
)
from .jobs import _project_name
from .runner import SshRunner

# Run remotely by the shipped slurmlaunch: the request (JSON) on its stdin.
SERVE = "import sys\nfrom slurmlaunch.app.remote.doctor import serve\nsys.exit(serve(sys.stdin.read()))\n"


def login_node_scheduler(requested: str, runner: SshRunner) -> str:
    """doctor's scheduler on the login node (doctor_scheduler, with its clients looked for on the login node's
    PATH after the --remote-setup lines, one `command -v` round trip): the probe job is rendered here for it."""
    name = doctor_scheduler(requested, lambda edge: runner.which(str(edge.client)))
    if requested == "auto":
        from ...schedulers.choice import announce_once

        announce_once(f"--scheduler auto chose {name} on {runner.conn.dest.target}")  # once, as on this machine
    return name


def cmd_doctor_remote(target: str, setup: list[str] | None, python: str | None, partition: str | None,
                      as_json: bool, nodes: int | None, gpus: int, timeout: float, scheduler: str = "auto") -> int:
    """Run doctor on ``target`` (``setup``: --remote-setup lines; ``python``: the interpreter there, whose
    torch the probe checks; ``scheduler``: auto, slurm or pbs, chosen on the login node as submit --remote
    does); its report goes to stdout, its own messages to stderr, its exit code back."""
    if nodes is not None and nodes < 1:
        raise SpecError(f"--allocate {nodes} is not valid (expected a number of nodes >= 1)")
    doctor_scheduler(scheduler, lambda edge: True)  # a name doctor does not check: refused before connecting
    dest = parse_destination(target)
    with Connection(dest, tuple(setup or ())) as conn:
        interpreter = check_python(conn, python or "python3")  # doctor itself needs Python >= 3.10 there
        remote_dir = resolve_directory(conn, dest.directory, _project_name(os.getcwd()), create=True)
        package = ship_package(conn, remote_dir)
        name = login_node_scheduler(scheduler, SshRunner(conn))
        job = None if nodes is None else probe_job(nodes, gpus, partition, timeout, workdir=remote_dir,
                                                   python=interpreter, setup=(pythonpath_setup(package),),
                                                   scheduler=name)
        request = {"partition": partition, "json": as_json, "nodes": nodes, "gpus": gpus, "timeout": timeout,
                   "scheduler": name, "job": None if job is None else job.to_json()}
        command = [interpreter, "-c", SERVE]
        script = (f"cd -- {shlex.quote(remote_dir)} && umask 077 && {pythonpath_setup(package)} && "
                  f"{shlex.join(command)}")
        limit = COMMAND_TIMEOUT_S + (timeout if nodes is not None else 0.0)
        proc = conn.run(shell_command(script, conn.setup, limit), input_bytes=json.dumps(request).encode(),
                        check=False, timeout=limit)
    if proc.returncode not in (0, 1, 2):  # not doctor's own answer: the interpreter is missing, or worse
        said = proc.stderr.decode(errors="replace").strip().splitlines() or ["(no output)"]
        raise RemoteError(f"on {dest.target}: {interpreter} (slurmlaunch doctor) failed (exit {proc.returncode}): "
                          f"{said[-1]}")
    sys.stdout.buffer.write(proc.stdout)
    sys.stdout.flush()
    sys.stderr.buffer.write(proc.stderr)
    return proc.returncode


def serve(text: str) -> int:
    """The remote half: doctor with the request the laptop sent; errors as the CLI gives them (one line,
    exit 2)."""
    request = json.loads(text)
    try:
        job = ProbeJob.from_json(request["job"]) if request["job"] is not None else None
        code = cmd_doctor(request["partition"], bool(request["json"]), request["nodes"], int(request["gpus"]),
                          float(request["timeout"]), job=job, scheduler=str(request.get("scheduler", "auto")))
    except SlurmLaunchError as e:
        sys.stdout.flush()
        sys.stderr.write(f"slurmlaunch: error: {e}\n")
        return e.exit_code
    sys.stdout.flush()
    return code
