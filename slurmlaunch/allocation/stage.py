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

Per job, in the batch step (Slurm):
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
copy then. Standard library only: it runs in the batch step, and as ``python -m slurmlaunch.allocation.stage``
on every node.
"""

from __future__ import annotations

import hashlib
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    import subprocess
    from collections.abc import Callable

MODES = ("on", "fallback")
STAGE_FAILED = 1  # the job's exit code when staging failed and no fallback was asked for
CACHE_VAR = "SLURMLAUNCH_STAGE_CACHE"
DIR_VAR = "SLURMLAUNCH_STAGE_DIR"
READY = "slurmlaunch-stage-ready"
REMOVING = ".removing"  # a node's copy being removed
NO_SPACE = 3  # a node's exit code when its node-local directory is too small
READY_WAIT_S = 900.0  # the unpack on every node, at most (750 MB from a node-local disk takes seconds)
# the holders' clean-up after the ranks, at most (a loaded shared disk here took 96 s to remove torch's 36,000 files)
HOLDER_STOP_S = 600.0


def _say(text: str) -> None:
    sys.stderr.write(f"slurmlaunch: {text}\n")
    sys.stderr.flush()


def size_text(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


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
    return f"{st.st_size}:{st.st_mtime_ns}:{st.st_ino}"


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


def ensure_pack(prefix: str, cache: str, run: Callable[[list[str]], int]) -> tuple[str, int, bool]:
    """(the pack's path, its size, whether it was made now): the cached tar of ``prefix`` under its content
    key, made (tar, into a private name renamed into place: two jobs packing at once both end with one whole
    pack) when the cache has none. Raises OSError when it cannot be made."""
    key = content_key(prefix)
    name = os.path.basename(prefix.rstrip("/")).lstrip(".") or "env"  # .venv's pack is not a hidden file
    path = os.path.join(cache, f"{name}-{key}.tar")
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


def shortfall_line(node: str, where: str, free: int, need: int) -> str:
    """The one line of a node whose node-local directory cannot take the environment."""
    return (f"node {node}: the node-local directory {where} has {size_text(free)} free, staging the environment "
            f"needs {size_text(need)} (the pack and its unpacked copy): {size_text(need - free)} short")


# --- on every node: `python -m slurmlaunch.allocation.stage check|hold ...` ------------------------------------

def node_check(where: str, need: int) -> int:
    """0 when ``where`` (made if missing) has ``need`` bytes free; else the one line, and NO_SPACE."""
    import socket

    try:
        os.makedirs(where, exist_ok=True)
        st = os.statvfs(where)
    except OSError as e:
        _say(f"node {socket.gethostname()}: the node-local directory {where} cannot be used: {e.strerror or e}")
        return NO_SPACE
    free = st.f_bavail * st.f_frsize
    if free < need:
        _say(shortfall_line(socket.gethostname(), where, free, need))
        return NO_SPACE
    return 0


def node_hold(tar: str, dest: str) -> int:
    """Unpack ``tar`` into ``dest`` (then remove the tar), say READY on stdout, and hold until stdin ends (the
    batch step closes it after the ranks; srun passes stdin to every task) or a stop signal comes (Slurm's
    SIGTERM at a cancel or the time limit), then remove ``dest``. Not by the signals a user or the warning may
    send to all steps (scancel --signal USR1): those are ignored, the copy is the ranks'."""
    import shutil
    import signal
    import socket
    import subprocess

    def remove(*_: object) -> None:
        # renamed first (instant): a removal that Slurm's KillWait cuts short (a cancel) leaves a name the
        # next holder on this node sweeps, not a copy that looks like a job's
        trash = f"{dest}{REMOVING}"
        try:
            os.rename(dest, trash)
        except OSError:
            trash = dest
        shutil.rmtree(trash, ignore_errors=True)
        try:
            os.unlink(tar)
        except OSError:
            pass
        os._exit(0)

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, remove)
    for s in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM):
        signal.signal(s, signal.SIG_IGN)
    try:
        os.makedirs(dest, 0o700)
        done = subprocess.run(["tar", "-C", dest, "-xf", tar], stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise OSError(f"tar -xf {tar} exited {done.returncode}")
    except OSError as e:
        _say(f"node {socket.gethostname()}: could not unpack the environment into {dest}: {e}")
        remove()
    try:
        os.unlink(tar)
    except OSError:
        pass
    sys.stdout.write(f"{READY} {socket.gethostname()}\n")
    sys.stdout.flush()
    parent = os.path.dirname(dest)
    # earlier jobs' copies whose removal was cut short (ours only: rmtree fails on other users')
    for left in os.listdir(parent):
        if left.startswith("slurmlaunch-stage-") and left.endswith(REMOVING):
            shutil.rmtree(os.path.join(parent, left), ignore_errors=True)
    while sys.stdin.buffer.read(1 << 16):
        pass
    remove()
    return 0


# --- in the batch step -------------------------------------------------------------------------------------

class Staged:
    """A staged environment: the command the ranks run from it, and its clean-up (the holders' end)."""

    def __init__(self, command: list[str], holder: subprocess.Popen[bytes] | None) -> None:
        self.command, self.holder = command, holder

    def clean(self) -> None:
        """End the holders, each removing its node's copy: their stdin closed (a SIGTERM to srun would end
        the step with SIGKILL, srun's "forcing job termination", and leave the copies); bounded."""
        import subprocess

        if self.holder is None or self.holder.poll() is not None:
            return
        assert self.holder.stdin is not None
        self.holder.stdin.close()
        try:
            self.holder.wait(HOLDER_STOP_S)
        except subprocess.TimeoutExpired:
            _say(f"the staged environment's holders did not end within {HOLDER_STOP_S:.0f}s: killed, their "
                 f"copies may be left")
            self.holder.kill()
            self.holder.wait()


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


def stage_slurm(mode: str, nodes: int, job: str, command: list[str]) -> Staged | str:
    """Stage the ranks' environment on every node of this Slurm job (the module's steps 1-5): the Staged
    environment; on a failure with ``mode`` "fallback" the shared copy's (COMMAND as it is), else the
    failure's line (said already; the job ends with STAGE_FAILED). Reads sys.prefix, $SLURMLAUNCH_STAGE_CACHE,
    $SLURMLAUNCH_STAGE_DIR, $TMPDIR."""
    import subprocess
    import time

    def run(cmd: list[str]) -> int:
        return subprocess.run(cmd, stdin=subprocess.DEVNULL).returncode

    def failed(text: str, fix: str = "") -> Staged | str:
        if mode == "fallback":
            _say(f"{text}; running from the shared copy (--stage-env fallback)")
            return Staged(command, None)
        line = f"{text}; no rank was started. Fix: {fix}--stage-env fallback to run from the shared copy then"
        _say(line)
        return line

    prefix = env_prefix(sys.prefix, sys.base_prefix)
    if prefix is None:
        return failed(f"--stage-env: the ranks' interpreter {sys.executable} is not in a virtual environment or "
                      f"a conda prefix (its prefix {sys.prefix} is the system's), so there is nothing to stage")
    start = time.monotonic()
    try:
        pack, size, made = ensure_pack(prefix, cache_dir(os.environ), run)
    except OSError as e:
        return failed(f"could not pack the environment {prefix}: {e}")
    _say(f"environment {prefix} {'packed' if made else 'found packed'} in {pack} ({size_text(size)}"
         f"{f', {time.monotonic() - start:.1f}s' if made else ', skipped the pack'})")
    root = os.path.join(node_dir(os.environ), f"slurmlaunch-stage-{job}")
    tar, dest = root + ".tar", root
    step = ["srun", "--overlap", f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1"]
    module = [sys.executable, "-m", __name__]
    check = subprocess.run([*step, "--kill-on-bad-exit=0", *module, "check", os.path.dirname(root), str(2 * size)],
                           stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, errors="replace")
    sys.stderr.write(check.stderr)  # each node's line (all of them: no node's check stops another's)
    if check.returncode != 0:
        said = [ln[len("slurmlaunch: "):] for ln in check.stderr.splitlines() if ln.startswith("slurmlaunch: node ")]
        return failed(said[0] if len(said) == 1 else f"{said[0]} (and {len(said) - 1} more node(s), in the batch log)"
                      if said else f"the check of the node-local directory failed (exit {check.returncode})",
                      f"set {DIR_VAR} (--env) to a larger node-local directory, or ")
    if run(["sbcast", "--force", pack, tar]) != 0:
        return failed(f"sbcast {pack} {tar} failed")
    holder = subprocess.Popen([*step, "--kill-on-bad-exit=1", *module, "hold", tar, dest], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE)
    staged = Staged(rewrite(command, prefix, dest), holder)
    if not _wait_ready(holder, nodes):
        staged.clean()
        return failed("the environment could not be unpacked on every node")
    os.environ["PATH"] = os.path.join(dest, "bin") + os.pathsep + os.environ.get("PATH", "")
    if os.environ.get("VIRTUAL_ENV"):
        os.environ["VIRTUAL_ENV"] = dest
    _say(f"environment staged on {nodes} node(s) in {dest} ({time.monotonic() - start:.1f}s)")
    return staged


def main(argv: list[str]) -> int:
    if argv[:1] == ["check"] and len(argv) == 3:
        return node_check(argv[1], int(argv[2]))
    if argv[:1] == ["hold"] and len(argv) == 3:
        return node_hold(argv[1], argv[2])
    _say("usage: python -m slurmlaunch.allocation.stage check DIR BYTES | hold TAR DIR")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
