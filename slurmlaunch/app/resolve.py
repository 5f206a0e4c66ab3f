"""A request as the submitting process completes it: what only this process knows (its interpreter, its
working directory) filled in, and the checks that need this machine's files. The core's request and its
validation (core/spec.py) stay pure; everything that builds a request from user input (submit, the Python
API, doctor) goes through :func:`resolve`, and `slurmlaunch run` through :func:`check_script`.

Each refusal is a SpecError naming the value and what would be valid, like the core's.
"""

from __future__ import annotations

import os
import shutil
import sys

from ..core.errors import SpecError
from ..core.limits import shown
from ..core.spec import JobSpec, validate


def from_process(spec: JobSpec, python: str | None = None, workdir: str | None = None) -> JobSpec:
    """``spec`` with the ranks' interpreter and the working directory filled in: ``python`` when given, else
    python3 inside a container (the image's, not this machine's), else this process's (sys.executable);
    ``workdir`` when given, else this process's (os.getcwd()). A bare name outside a container (``--python
    python3``) is looked up on this machine's PATH, as a shell would, and kept as the path it found: the ranks
    run that interpreter, not whatever a compute node's PATH finds first."""
    chosen = python or ("python3" if spec.container else sys.executable)
    if spec.container is None and os.sep not in chosen:
        chosen = shutil.which(chosen) or chosen
    return spec.changed(python=chosen, workdir=workdir or os.getcwd())


def check_script(script: str, module: bool, no_python: bool, workdir: str) -> None:
    """SCRIPT as this machine sees it: a module is not looked for; a --no-python executable is a path or a
    command on PATH; a Python file exists relative to ``workdir`` (and is no directory)."""
    if module:
        # python -m takes dotted names, no path: "..x", "/abs" or "a..b" fail on every rank (and are no file to
        # look in for the client notes)
        if not all(part.isidentifier() for part in script.split(".")):
            raise SpecError(f"-m/--module {shown(script)} is not a module name (expected dotted Python names, as "
                            f"python -m takes them: pkg.train; a file is given without --module)")
        if script.endswith(".py") and os.path.isfile(os.path.join(workdir, script)) and \
                not os.path.isdir(os.path.join(workdir, script[:-3])):
            raise SpecError(f"-m/--module {shown(script)} names a module py of a package {shown(script[:-3])}, which "
                            f"is the file {shown(script)} here (expected: {shown(script)} without --module, or "
                            f"--module {shown(script[:-3])})")
        return
    if no_python:
        if not (os.path.exists(script) or shutil.which(script)):
            raise SpecError(f"--no-python executable {shown(script)} not found (a path or a command on PATH)")
        return
    path = os.path.join(workdir, script)
    if os.path.isdir(path):
        raise SpecError(f"script {shown(script)} is a directory (expected a Python file; -m for a package)")
    if os.path.exists(path) and not os.path.isfile(path):
        raise SpecError(f"script {shown(script)} is not a regular file (a FIFO or a device; expected a Python file)")
    if not os.path.isfile(path):
        raise SpecError(f"script {shown(script)} not found (expected a file, relative to {workdir!r})")


def check_output_dir(log_dir: str, given: str) -> None:
    """The logs' directory must be one or become one: a file on its path is refused here, before a dry run
    prints a script that could never write its logs (creating it is the scheduler's, at submission)."""
    path = os.path.abspath(log_dir)
    while True:
        if os.path.lexists(path):
            if not os.path.isdir(path):
                what = "is a file" if path == os.path.abspath(log_dir) else f"is under {path!r}, which is not a " \
                                                                            f"directory"
                raise SpecError(f"--output-dir {shown(given)} {what} (expected a directory, or a path where one "
                                f"can be made)")
            return
        parent = os.path.dirname(path)
        if parent == path:
            return
        path = parent


def check_files(spec: JobSpec, has_script: bool = True) -> JobSpec:
    """The checks that need this machine's files, after the core's (validate): the logs' directory, SCRIPT
    (unless ``has_script`` is false: the API's pickled call, whose ranks run this interpreter), and the
    interpreter (outside a container, where it is the image's)."""
    check_output_dir(spec.log_dir, spec.output.output_dir)
    if has_script:
        check_script(spec.program.script, spec.program.module, spec.program.no_python, spec.program.workdir)
    if spec.container is None and not os.path.isfile(spec.program.python):
        raise SpecError(f"--python {shown(spec.program.python)} not found (expected the interpreter that runs the "
                        f"ranks: a path, or a command on PATH)")
    return spec


def resolve(spec: JobSpec, python: str | None = None, workdir: str | None = None, has_script: bool = True) -> JobSpec:
    """The request the user asked for, completed (:func:`from_process`), validated (the core's rules) and
    checked against this machine's files (:func:`check_files`); SpecError for the first thing wrong."""
    return check_files(validate(from_process(spec, python, workdir)), has_script)
