"""The launcher travels with the job: this installation's package, sent beside the project, and the
remote interpreter that will run it, checked before a job is queued."""

from __future__ import annotations

import hashlib
import os
import re
import shlex

from ...core.errors import SpecError
from .dest import shell_command
from .shell import RemoteError
from .ssh import COMMAND_TIMEOUT_S, Connection
from .sync import SHIPPED_DIR, _rsync

MIN_PYTHON = (3, 10)  # pyproject's requires-python: the launcher's own code needs it
_PY = "slurmlaunch-python:"

# -- the launcher travels with the job ----------------------------------------------------------------------
# The remote side needs Python 3 and the training environment only. This installation's package is sent
# to <remote project>/.slurmlaunch/pkg/<version>-<content hash>/slurmlaunch (the project directory is the
# one place the ranks are sure to see), and the batch script puts that directory first on PYTHONPATH: the
# ranks' `python -m slurmlaunch launch` (and torchrun-node's children, which inherit the environment) run the
# very code that rendered the script, whether or not another slurmlaunch is installed there. The path the
# launcher imports is standard library only, so nothing else has to travel.

def package_dir() -> str:
    """This installation's ``slurmlaunch`` package directory."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _sources() -> list[str]:
    """What is sent: the package and, in a source checkout, the templates beside it (an installed package
    holds them; --allocate's probe job is rendered there)."""
    from ...render.jinja import shipped_template_dir

    templates = str(shipped_template_dir())
    inside = templates.startswith(package_dir() + os.sep)
    return [package_dir()] if inside or not os.path.isdir(templates) else [package_dir(), templates]


def _package_files() -> list[str]:
    found = []
    for root in _sources():
        for parent, dirs, files in os.walk(root):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            found += [os.path.join(parent, f) for f in sorted(files) if not f.endswith((".pyc", ".pyo"))]
    return found


def package_tag() -> str:
    """``<version>-<12 hex digits of the package's content>``: a new directory for every change, so a job
    still queued keeps the code it was rendered with while a newer one is sent beside it."""
    from ...core import __version__

    digest = hashlib.sha256()
    top = os.path.dirname(package_dir())
    for path in _package_files():
        digest.update(os.path.relpath(path, top).encode("utf-8", "surrogateescape") + b"\0")
        with open(path, "rb") as f:
            digest.update(f.read())
        digest.update(b"\0")
    safe = re.sub(r"[^A-Za-z0-9._+-]", "_", __version__)
    return f"{safe}-{digest.hexdigest()[:12]}"


def shipped_path(remote_dir: str, tag: str | None = None) -> str:
    """Where the package goes in ``remote_dir``: the directory to put on the ranks' PYTHONPATH."""
    return f"{remote_dir.rstrip('/')}/{SHIPPED_DIR}/pkg/{tag or package_tag()}"


def ship_argv(conn: Connection, remote_dir: str, tag: str | None = None) -> list[str]:
    """The rsync that sends the package (its sources, no byte code) to shipped_path, private to the user."""
    return ["rsync", "-a", "--chmod=go-rwx", "-s", "-e", conn.rsync_shell(), "--exclude=__pycache__/",
            "--exclude=*.py[co]", "--", *(path.rstrip("/") for path in _sources()),
            f"{conn.dest.path_target}:{shipped_path(remote_dir, tag)}/"]


def ship_package(conn: Connection, remote_dir: str) -> str:
    """Send the package (nothing, when this version is there already) and return the directory for
    PYTHONPATH. ``remote_dir`` must exist (resolve_directory with create)."""
    tag = package_tag()
    where = shipped_path(remote_dir, tag)
    q = shlex.quote(where)
    # rsync creates one level only; umask 077 keeps .slurmlaunch/pkg private.
    conn.run(shell_command(f"umask 077 && mkdir -p -- {q}", conn.setup, conn.timeout), what=f"mkdir -p -- {q}")
    _rsync(conn, ship_argv(conn, remote_dir, tag), COMMAND_TIMEOUT_S)
    return where


def pythonpath_setup(path: str) -> str:
    """The batch script's line that puts the shipped package first on the ranks' PYTHONPATH (keeping what
    --env, the site or a --setup line set)."""
    return f'export PYTHONPATH={shlex.quote(path)}"${{PYTHONPATH:+:$PYTHONPATH}}"'


def check_python(conn: Connection, python: str, flag: str = "--python") -> str:
    """The ranks' interpreter on the login node, checked in one round trip (after the --remote-setup lines):
    it runs and is at least MIN_PYTHON. ``~/`` is expanded there (the path returned is absolute, as the
    batch script needs it); ``~user`` is refused. RemoteError, in one line, naming ``python`` otherwise."""
    if python.startswith("-") or not python.isprintable():
        raise SpecError(f"{flag} {python!r} is not an interpreter's name or path (e.g. python3 or "
                        f"~/venv/bin/python)")
    if python.startswith("~") and not python.startswith("~/"):
        raise SpecError(f"{flag} {python!r}: only ~/ (your home there) is expanded; give the path")
    word = f'"$HOME"/{shlex.quote(python[2:])}' if python.startswith("~/") else shlex.quote(python)
    code = "import sys; sys.stdout.write('%d.%d' % sys.version_info[:2])"
    script = (f'out=$({word} -c {shlex.quote(code)} 2>&1); rc=$?; '
              f'printf "{_PY}%s:%s\\n%s\\n" "$rc" "$HOME" "$out"')
    out = conn.run(shell_command(script, conn.setup, 60), what=f"{python} -c ...", timeout=60)
    text = out.stdout.decode(errors="replace")
    head, _, said = text[text.find(_PY) + len(_PY):].partition("\n") if _PY in text else ("", "", text)
    rc, _, home = head.partition(":")
    said = said.strip()
    where = f"{flag} {python} on {conn.dest.target}"
    if rc in ("126", "127"):
        raise RemoteError(f"{where}: {'not found' if rc == '127' else 'not executable'} ({said or 'no output'}); "
                          f"name the training environment's interpreter there, e.g. {flag} ~/venv/bin/python")
    if rc != "0" or not re.fullmatch(r"\d+\.\d+", said):
        last = said.splitlines()[-1] if said else "(no output)"
        raise RemoteError(f"{where} does not run (exit {rc or '?'}): {last}")
    version = tuple(int(part) for part in said.split("."))
    if version < MIN_PYTHON:
        raise RemoteError(f"{where} is Python {said}; slurmlaunch's launcher needs Python >= "
                          f"{'.'.join(map(str, MIN_PYTHON))} there: name a newer one with {flag}")
    return f"{home.rstrip('/')}/{python[2:]}" if python.startswith("~/") else python
