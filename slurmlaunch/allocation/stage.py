"""Environment staging (``submit --stage-env``, issue 42): the ranks import torch from a node-local copy of
their Python environment instead of the shared file system, whose metadata servers would otherwise serve
about 20,000 calls per rank at start-up.

What is packed: the prefix of the interpreter the ranks use (``sys.prefix`` of the batch step, which runs
with the ranks' --python): a venv, or a conda prefix. A venv is not self-contained: its ``bin/python`` is a
link to the base interpreter named by ``pyvenv.cfg``'s ``home``, whose standard library it uses. That base
interpreter is left where it is: every node must already have it at that path for the unstaged job to run,
it is normally the node image's (/usr), and its standard library is a few hundred files against torch's
14,000. The project (the script, an editable install) stays where it is too. A conda prefix carries its own
interpreter and standard library, so it is staged whole.

Per job, in the batch step (steps 2-4 as under Slurm; PBS's in allocation/stage_pbs.py):
1. the pack: an uncompressed tar of the prefix in a cache directory ($SLURMLAUNCH_STAGE_CACHE, else
   $XDG_CACHE_HOME/slurmlaunch/envs, else ~/.cache/slurmlaunch/envs), named by a content key. The key
   (``content_key``) is made of what every installer changes, not of every file: the directory listings of
   the prefix, its bin/ and site-packages, and the stamps of pyvenv.cfg, conda-meta/history and each
   distribution's RECORD -- 111 calls on the shared file system once per job for a torch venv, not a stat per file
   (38,220 for a torch venv). ``__pycache__`` is left out (the ranks' byte code would make every next job pack
   again); the pack holds what is there when it is made. Uncompressed: packing and unpacking cost no CPU
   beyond the copy.
2. each node's free space under the node-local directory ($SLURMLAUNCH_STAGE_DIR, else $TMPDIR, else /tmp)
   checked for twice the pack (the tar and its unpacked copy): one line naming the node and the shortfall.
3. ``sbcast`` (Slurm's own tree broadcast from the batch node) copies the pack to every node.
4. one task per node (``srun --overlap``) unpacks it, says "ready", and holds until its stdin ends (the
   batch step at the end) or Slurm stops it (SIGTERM: a cancel, the time limit), then removes the copy.
5. every argument of COMMAND under the prefix (the ranks' --python) is rewritten to the node-local copy, and
   its bin/ goes first on PATH.
Any step that fails stops the job with one line, unless ``--stage-env fallback`` asked to run from the shared
copy then. Standard library only: it runs in the batch step; what runs on every node is
allocation/stage_node.py, self-contained, started by :func:`node_command`.
"""

from __future__ import annotations

import hashlib
import os
import sys

from . import stage_node as node
from .stage_node import READY, STAGE_PREFIX, size_text
from .stage_node import say as _say

TYPE_CHECKING = False
if TYPE_CHECKING:
    import subprocess
    from collections.abc import Callable

MODES = ("on", "fallback")
STAGE_FAILED = 1  # the job's exit code when staging failed and no fallback was asked for
CACHE_VAR = "SLURMLAUNCH_STAGE_CACHE"
DIR_VAR = "SLURMLAUNCH_STAGE_DIR"
READY_WAIT_S = 900.0  # the unpack on every node, at most (750 MB from a node-local disk takes seconds)
# the holders' clean-up after the ranks, at most (a loaded shared disk here took 96 s to remove torch's 36,000 files)
HOLDER_STOP_S = 600.0


def env_prefix(prefix: str, base_prefix: str) -> str | None:
    """The prefix to stage: ``prefix`` when it is a venv (it differs from ``base_prefix``) or a conda
    prefix (it holds conda-meta/); None for a system interpreter, whose prefix (/usr) is the node image's."""
    if prefix != base_prefix or os.path.isdir(os.path.join(prefix, "conda-meta")):
        return prefix
    return None


def _entries(path: str) -> list[os.DirEntry[str]]:
    """The entries of ``path`` by name (one directory read, no stat: the types come with the names); none when
    it is missing."""
    try:
        with os.scandir(path) as it:
            return sorted(it, key=lambda e: e.name)
    except OSError:
        return []


def _stamp(path: str) -> str:
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return "-"
    # not the inode: a FUSE file system (sshfs) numbers inodes per mount, in the order of lookups, so the batch
    # step on another node, or the same node later, would see another key and pack again
    return f"{st.st_size}:{st.st_mtime_ns}"


def content_key(prefix: str) -> str:
    """The key the pack of ``prefix`` is cached under, from what every install, upgrade or removal changes,
    without a stat per file (the shared file system serves the key once per job; a stat per file was 38,220
    calls for a torch venv): the names (and types, and the targets of links) in the prefix, its bin/ and each
    lib*/python*/site-packages; the size, mtime and inode of pyvenv.cfg, conda-meta/history (conda appends a
    line per transaction), each ``*.dist-info``'s RECORD (pip rewrites it on every install of the
    distribution, even a reinstall of the same version), each ``*.egg-info`` and each ``*.pth``. One directory
    read per directory named and one stat per distribution: 111 calls for the test venv (torch, 88 distributions).

    What it misses: a file changed inside site-packages by hand, without an installer (an edit in place of
    torch/foo.py, a file copied into a package's directory). Delete the pack from the cache to pack again.
    Editable installs are not staged at all: their .pth or finder points at the project's source, which the
    ranks import from where it is (the shared copy), so an edit there needs no new pack."""
    h = hashlib.sha256()

    def add(rel: str, entries: list[os.DirEntry[str]]) -> None:
        for e in entries:
            kind = "l" if e.is_symlink() else "d" if e.is_dir(follow_symlinks=False) else "f"
            link = os.readlink(e.path) if kind == "l" else ""
            h.update(f"{rel}/{e.name}\0{kind}\0{link}\n".encode("utf-8", "surrogateescape"))

    top = _entries(prefix)
    add("", top)
    names = {e.name: e for e in top}
    for stamped in ("pyvenv.cfg", "conda-meta/history"):
        if stamped.split("/")[0] in names:
            h.update(f"{stamped}\0{_stamp(os.path.join(prefix, stamped))}\n".encode())
    if "bin" in names:
        add("bin", _entries(os.path.join(prefix, "bin")))
    for lib in ("lib", "lib64"):
        if lib not in names or names[lib].is_symlink():  # a venv's lib64 is a link to lib
            continue
        for py in _entries(os.path.join(prefix, lib)):
            if not py.name.startswith("python") or not py.is_dir(follow_symlinks=False):
                continue
            site = os.path.join(py.path, "site-packages")
            rel = f"{lib}/{py.name}/site-packages"
            entries = [e for e in _entries(site) if e.name != "__pycache__"]  # the ranks' byte code
            add(rel, entries)
            for e in entries:
                if e.name.endswith(".dist-info"):
                    stamp = _stamp(os.path.join(e.path, "RECORD"))
                elif e.name.endswith((".egg-info", ".pth")):
                    stamp = _stamp(e.path)
                else:
                    continue
                h.update(f"{rel}/{e.name}\0{stamp}\n".encode("utf-8", "surrogateescape"))
    return h.hexdigest()[:24]


def cache_dir(environ: dict[str, str] | os._Environ[str]) -> str:
    """$SLURMLAUNCH_STAGE_CACHE, else $XDG_CACHE_HOME/slurmlaunch/envs, else ~/.cache/slurmlaunch/envs."""
    if environ.get(CACHE_VAR):
        return environ[CACHE_VAR]
    base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "slurmlaunch", "envs")


def node_dir(environ: dict[str, str] | os._Environ[str]) -> str:
    """The node-local directory copies go under: $SLURMLAUNCH_STAGE_DIR, else $TMPDIR, else /tmp."""
    return environ.get(DIR_VAR) or environ.get("TMPDIR") or "/tmp"


def pack_path(prefix: str, cache: str, key: str | None = None) -> str:
    """Where the pack of ``prefix`` is in ``cache``: named by the prefix and its content key (``key``, when
    computed already)."""
    name = os.path.basename(prefix.rstrip("/")).lstrip(".") or "env"  # .venv's pack is not a hidden file
    return os.path.join(cache, f"{name}-{key or content_key(prefix)}.tar")


def ensure_pack(prefix: str, cache: str, run: Callable[[list[str]], int]) -> tuple[str, int, bool]:
    """(the pack's path, its size, whether it was made now): the cached tar of ``prefix`` under its content
    key, made (tar, into a private name renamed into place: two jobs packing at once both end with one whole
    pack) when the cache has none. Raises OSError when it cannot be made."""
    path = pack_path(prefix, cache)
    if os.path.isfile(path):
        return path, os.path.getsize(path), False
    os.makedirs(cache, 0o700, exist_ok=True)
    tmp = f"{path}.{os.getpid()}.partial"
    code = run(["tar", "-C", prefix, "-cf", tmp, "."])
    if code != 0:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise OSError(f"tar -C {prefix} -cf {tmp} . exited {code}")
    os.replace(tmp, path)
    return path, os.path.getsize(path), True


def rewrite(command: list[str], prefix: str, local: str) -> list[str]:
    """COMMAND with every argument under ``prefix`` (the ranks' --python) moved under ``local``."""
    roots = {prefix.rstrip("/"), os.path.realpath(prefix)}
    out = []
    for arg in command:
        for root in roots:
            if arg == root or arg.startswith(root + "/"):
                arg = local + arg[len(root):]
                break
        out.append(arg)
    return out


# --- in the batch step -------------------------------------------------------------------------------------

def node_command(*args: str) -> list[str]:
    """The command that runs allocation/stage_node.py's ``args`` on a node: with the base interpreter of the
    ranks' venv (the real path of its ``bin/python``; for a conda prefix, whose interpreter is its own, that
    one), ``-S -I`` (no site-packages, no user site, no PYTHON* variables), by the file's path. What it reads
    from the shared file system before the copy is ready is then that one file."""
    return [os.path.realpath(sys.executable), "-S", "-I", node.__file__, *args]


class Staged:
    """A staged environment: the command the ranks run from it, and its clean-up."""

    def __init__(self, command: list[str], clean: Callable[[], None] | None = None) -> None:
        self.command, self._clean = command, clean

    def clean(self) -> None:
        """Remove every node's copy (bounded); nothing for the shared copy's."""
        clean, self._clean = self._clean, None
        if clean is not None:
            clean()


def _end_holder(holder: subprocess.Popen[bytes]) -> None:
    """Slurm: end the holders, each removing its node's copy: their stdin closed (a SIGTERM to srun would end
    the step with SIGKILL, srun's "forcing job termination", and leave the copies); bounded."""
    import subprocess

    if holder.poll() is not None:
        return
    assert holder.stdin is not None
    holder.stdin.close()
    try:
        holder.wait(HOLDER_STOP_S)
    except subprocess.TimeoutExpired:
        _say(f"the staged environment's holders did not end within {HOLDER_STOP_S:.0f}s: killed, their "
             f"copies may be left")
        holder.kill()
        holder.wait()


def _wait_ready(proc: subprocess.Popen[bytes], nodes: int) -> bool:
    """Whether all ``nodes`` holders said READY before READY_WAIT_S, or before one of them ended."""
    import threading

    seen: list[str] = []
    done = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for raw in iter(proc.stdout.readline, b""):
            line = raw.decode("utf-8", "replace").strip()
            if line.startswith(READY):
                seen.append(line)
                if len(seen) >= nodes:
                    done.set()
        done.set()

    threading.Thread(target=read, daemon=True).start()
    if not done.wait(READY_WAIT_S):
        _say(f"the environment was not unpacked on all {nodes} node(s) within {READY_WAIT_S:.0f}s "
             f"({len(seen)} ready)")
    return len(seen) >= nodes


class StageFailed(Exception):
    """Staging failed: its line, and what to fix before fallback (the failure line's "Fix: ")."""

    def __init__(self, text: str, fix: str = "") -> None:
        super().__init__(text)
        self.text, self.fix = text, fix


def nodes_said(lines: list[str], code: int) -> StageFailed:
    """The failure of the space check: the first node's line (and how many more said one)."""
    said = [ln[len("slurmlaunch: "):] if ln.startswith("slurmlaunch: ") else ln for ln in lines]
    text = (said[0] if len(said) == 1 else f"{said[0]} (and {len(said) - 1} more node(s), in the batch log)"
            if said else f"the check of the node-local directory failed (exit {code})")
    return StageFailed(text, f"set {DIR_VAR} (--env) to a larger node-local directory, or ")


def slurm_nodes(nodes: int, pack: str, size: int, root: str, lap: Callable[[str], None]) -> Callable[[], None]:
    """Slurm (steps 2-4) on the job's ``nodes`` nodes: the check, sbcast, the holders; their clean-up. ``lap``
    is called with each step's name as it ends (the staged line's split)."""
    import subprocess

    tar, dest = root + ".tar", root
    step = ["srun", "--overlap", f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1"]
    check = subprocess.run([*step, "--kill-on-bad-exit=0", *node_command("check", os.path.dirname(root),
                                                                        str(2 * size))],
                           stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, errors="replace")
    sys.stderr.write(check.stderr)  # each node's line (all of them: no node's check stops another's)
    if check.returncode != 0:
        raise nodes_said([ln for ln in check.stderr.splitlines() if ln.startswith("slurmlaunch: node ")],
                          check.returncode)
    lap("space check")
    if subprocess.run(["sbcast", "--force", pack, tar], stdin=subprocess.DEVNULL).returncode != 0:
        raise StageFailed(f"sbcast {pack} {tar} failed")
    lap("sbcast")
    holder = subprocess.Popen([*step, "--kill-on-bad-exit=1", *node_command("hold", tar, dest)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    if not _wait_ready(holder, nodes):
        _end_holder(holder)
        raise StageFailed("the environment could not be unpacked on every node")
    lap("unpack")
    return lambda: _end_holder(holder)


def stage(mode: str, job: str, command: list[str],
          to_nodes: Callable[[str, int, str, Callable[[str], None]], Callable[[], None]], nodes: int) -> Staged | str:
    """Stage the ranks' environment on every node of this job (the module's steps 1-5); ``to_nodes(pack,
    size, copy, lap)`` moves the pack to every node as ``copy`` (calling ``lap(name)`` as each of its steps
    ends) and returns the clean-up that removes the copies
    (``slurm_nodes``; under PBS allocation/stage_pbs.py's), or raises StageFailed. The Staged environment; on a
    failure with ``mode`` "fallback" the shared copy's (COMMAND as it is), else the failure's line (said
    already; the job ends with STAGE_FAILED). Reads sys.prefix, $SLURMLAUNCH_STAGE_CACHE,
    $SLURMLAUNCH_STAGE_DIR, $TMPDIR.
    """
    import subprocess
    import time

    def failed(text: str, fix: str = "") -> Staged | str:
        if mode == "fallback":
            _say(f"{text}; running from the shared copy (--stage-env fallback)")
            return Staged(command)
        line = f"{text}; no rank was started. Fix: {fix}--stage-env fallback to run from the shared copy then"
        _say(line)
        return line

    prefix = env_prefix(sys.prefix, sys.base_prefix)
    if prefix is None:
        return failed(f"--stage-env: the ranks' interpreter {sys.executable} is not in a virtual environment or "
                      f"a conda prefix (its prefix {sys.prefix} is the system's), so there is nothing to stage")
    start = time.monotonic()
    took: list[str] = []  # each step's seconds, for the staged line: where a slow staging went
    last = start

    def lap(name: str) -> None:
        nonlocal last
        now = time.monotonic()
        took.append(f"{name} {now - last:.1f}s")
        last = now

    try:
        pack, size, made = ensure_pack(prefix, cache_dir(os.environ),
                                       lambda c: subprocess.run(c, stdin=subprocess.DEVNULL).returncode)
    except OSError as e:
        return failed(f"could not pack the environment {prefix}: {e}")
    lap("pack" if made else "content key")
    _say(f"environment {prefix} {'packed' if made else 'found packed'} in {pack} ({size_text(size)}"
         f"{f', {time.monotonic() - start:.1f}s' if made else f', skipped the pack, {took[0]}'})")
    root = os.path.join(node_dir(os.environ), f"{STAGE_PREFIX}{job}")
    try:
        clean = to_nodes(pack, size, root, lap)
    except StageFailed as e:
        return failed(e.text, e.fix)
    os.environ["PATH"] = os.path.join(root, "bin") + os.pathsep + os.environ.get("PATH", "")
    if os.environ.get("VIRTUAL_ENV"):
        os.environ["VIRTUAL_ENV"] = root
    _say(f"environment staged on {nodes} node(s) in {root} ({time.monotonic() - start:.1f}s: {', '.join(took)})")
    return Staged(rewrite(command, prefix, root), clean)
