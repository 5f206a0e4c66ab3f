"""`doctor --remote DEST`: the login-node checks on DEST, and with --allocate the probe job on its nodes.

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
from ..doctor.command import cmd_doctor
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

# Run remotely by the shipped slurmlaunch: the request (JSON) on its stdin.
SERVE = "import sys\nfrom slurmlaunch.app.remote.doctor import serve\nsys.exit(serve(sys.stdin.read()))\n"


def cmd_doctor_remote(target: str, setup: list[str] | None, python: str | None, partition: str | None,
                      as_json: bool, nodes: int | None, gpus: int, timeout: float) -> int:
    """Run doctor on ``target`` (``setup``: --remote-setup lines; ``python``: the interpreter there, whose
    torch the probe checks); its report goes to stdout, its own messages to stderr, its exit code back."""
    if nodes is not None and nodes < 1:
        raise SpecError(f"--allocate {nodes} is not valid (expected a number of nodes >= 1)")
    dest = parse_destination(target)
    with Connection(dest, tuple(setup or ())) as conn:
        interpreter = check_python(conn, python or "python3")  # doctor itself needs Python >= 3.10 there
        remote_dir = resolve_directory(conn, dest.directory, _project_name(os.getcwd()), create=True)
        package = ship_package(conn, remote_dir)
        job = None if nodes is None else probe_job(nodes, gpus, partition, timeout, workdir=remote_dir,
                                                   python=interpreter, setup=(pythonpath_setup(package),))
        request = {"partition": partition, "json": as_json, "nodes": nodes, "gpus": gpus, "timeout": timeout,
                   "job": None if job is None else job.to_json()}
        command = [interpreter, "-c", SERVE]
        script = (f"cd -- {shlex.quote(remote_dir)} && umask 077 && {pythonpath_setup(package)} && "
                  f"{shlex.join(command)}")
        proc = conn.run(shell_command(script, conn.setup), input_bytes=json.dumps(request).encode(), check=False,
                        timeout=COMMAND_TIMEOUT_S + (timeout if nodes is not None else 0.0))
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
                          float(request["timeout"]), job=job)
    except SlurmLaunchError as e:
        sys.stdout.flush()
        sys.stderr.write(f"slurmlaunch: error: {e}\n")
        return e.exit_code
    sys.stdout.flush()
    return code
