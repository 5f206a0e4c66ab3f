"""Which warning signal a training script's own framework listens for: a look at its source, without importing it.

PyTorch Lightning's Trainer (packages ``lightning`` and ``pytorch_lightning``), when it runs under Slurm with
its SLURMEnvironment (the default there), installs a handler for SIGUSR1 that saves an ``hpc_ckpt_N.ckpt``
and has global rank 0 run ``scontrol requeue`` itself; ``SLURMEnvironment(requeue_signal=...)`` moves it to
another signal and ``SLURMEnvironment(auto_requeue=False)`` turns it off. Any other signal without a handler
of the script's own kills every rank. So submit sends Lightning the signal it expects, and lets Lightning
requeue (docs: Time limits, preemption, requeue).

The scan reads one file: the script, or the module's file under the working directory. It is a heuristic
(an import of Lightning behind a local module is not seen); ``--signal`` always decides.

The same look finds clients that cannot join the world the job would give them (:func:`client_notes`), for
one line at submit: idr-torch outside a Slurm step, MMEngine's ``init_dist`` on ranks without a GPU; and
:func:`nested_torchrun`, a job whose every task would start a torchrun of its own.
"""

from __future__ import annotations

import ast
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass

LIGHTNING_DEFAULT_SIGNAL = "USR1"  # SLURMEnvironment's requeue_signal when none is given
LIGHTNING_REQUEUE = "scontrol requeue"  # what its rank 0 runs to requeue the job (with the job's id)
# Lightning's parts that bring no Trainer (and so no signal handler): Fabric alone never requeues.
_TRAINER_FREE = ("lightning.fabric", "lightning_fabric")
_LIGHTNING = ("lightning", "pytorch_lightning")
MAX_SOURCE_BYTES = 4 * 1024 * 1024  # a training script is far smaller; anything larger is not scanned


@dataclass(frozen=True)
class ClientSignal:
    """What the script's framework does with a warning signal."""

    client: str  # "Lightning"
    signal: str | None  # the signal it saves and requeues on (USR1 unless the script says); None: not readable
    requeues: bool  # False: SLURMEnvironment(auto_requeue=False), no handler at all
    detail: str  # how it was found, for the one line submit prints
    requeue_command: str  # the command it requeues the job with from inside it (a scheduler's rank_requeue)


def _is_lightning(module: str) -> bool:
    if module.startswith(_TRAINER_FREE):
        return False
    return any(module == name or module.startswith(name + ".") for name in _LIGHTNING)


def _signal_name(node: ast.expr) -> str | None:
    """``signal.SIGUSR2``, ``SIGUSR2``, ``signal.Signals.SIGUSR2`` -> "USR2"; anything else -> None."""
    name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
    if name and name.startswith("SIG") and name[3:].isalnum() and name[3:].isupper():
        return name[3:]
    return None


def _called_name(node: ast.Call) -> str | None:
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None


def lightning_signal(source: str) -> ClientSignal | None:
    """The Lightning facts of a script's source: None when it does not import Lightning's Trainer side (or
    is not Python this interpreter can parse)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    imported = None
    environments: list[ast.Call] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported = imported or next((a.name for a in node.names if _is_lightning(a.name)), None)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if _is_lightning(node.module):
                imported = imported or node.module
        elif isinstance(node, ast.Call) and _called_name(node) == "SLURMEnvironment":
            environments.append(node)
    if imported is None:
        return None
    signal: str | None = LIGHTNING_DEFAULT_SIGNAL
    requeues = True
    detail = f"imports {imported}"
    for call in environments:
        for kw in call.keywords:
            if kw.arg == "auto_requeue" and isinstance(kw.value, ast.Constant) and kw.value.value is False:
                requeues = False
                detail += ", SLURMEnvironment(auto_requeue=False)"
            elif kw.arg == "requeue_signal":
                signal = _signal_name(kw.value)
                detail += f", SLURMEnvironment(requeue_signal={ast.unparse(kw.value)})"
    return ClientSignal("Lightning", signal, requeues, detail, LIGHTNING_REQUEUE)


def _imports_and_calls(tree: ast.AST) -> tuple[set[str], set[str]]:
    """The top-level packages a module imports (absolute imports only) and the names it calls."""
    imported: set[str] = set()
    called: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(a.name.split(".", 1)[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            imported.add(node.module.split(".", 1)[0])
        elif isinstance(node, ast.Call):
            name = _called_name(node)
            if name:
                called.add(name)
    return imported, called


def client_notes(source: str, slurm_step: bool, gpus_per_node: int) -> list[str]:
    """What a client the script imports will do with the world it is given, where it cannot join it: one
    phrase each, empty when nothing is known to go wrong. ``slurm_step``: whether the scheduler's ranks see a
    Slurm step's variables (real or emulated); ``gpus_per_node``: the GPUs asked for per node."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    imported, called = _imports_and_calls(tree)
    notes = []
    # idr-torch knows two launchers, Slurm (SLURM_STEP_ID) and torchrun (TORCHELASTIC_RUN_ID); under any other
    # it falls back to its "Sequential" world of one with a warning, and each rank trains alone
    if "idr_torch" in imported and not slurm_step:
        notes.append("idr-torch, which finds its world only in a Slurm step's or torchrun's variables: here every "
                     "rank would be a world of one and train alone (docs: Works with)")
    # MMEngine's init_dist (which its Runner calls for launcher='pytorch'/'slurm'/'mpi') first calls
    # torch.cuda.set_device(LOCAL_RANK), whatever the backend: a rank without a CUDA device fails there
    if "mmengine" in imported and called & {"init_dist", "Runner", "from_cfg"} and gpus_per_node == 0:
        notes.append("MMEngine, whose init_dist calls torch.cuda.set_device(LOCAL_RANK) even with gloo: ranks "
                     "without a GPU fail there (asked: --gpus-per-node 0; docs: Works with)")
    return notes


_TORCHRUN_MODULES = ("torch.distributed.run", "torch.distributed.launch")
# torchrun's own rendezvous options: with one, the user's torchruns may well find each other
_RENDEZVOUS = ("--rdzv-endpoint", "--rdzv_endpoint", "--master-addr", "--master_addr")


def nested_torchrun(script: str, args: Sequence[str], module: bool, tasks: int) -> str | None:
    """Why a job whose every task runs torchrun itself (``torchrun ...``, its entry script, ``python -m
    torch.distributed.run|launch``, or ``-m`` with those) goes wrong, or None. torchrun reads its own options
    (and PET_* variables), not the RANK/WORLD_SIZE/MASTER_ADDR the launcher exports: without ``--nnodes`` and a
    rendezvous endpoint of the user's, each of ``tasks`` torchruns makes a world of its own on its node, and on
    separate hosts each trains alone while the job ends 0 (tried on the local scheduler: two worlds of
    RANK 0..1, ports of their own). --mode torchrun is slurmlaunch's way of having torchrun start the ranks."""
    if tasks <= 1 or any(a.split("=", 1)[0] in _RENDEZVOUS for a in args):
        return None
    name = os.path.basename(script)
    if module:
        found = script in _TORCHRUN_MODULES
    else:
        found = name == "torchrun" or (name.startswith("python") and len(args) >= 2 and args[0] == "-m"
                                       and args[1] in _TORCHRUN_MODULES)
    if not found:
        return None
    return (f"each of the job's {tasks} tasks would start a torchrun of its own, and torchrun ignores the world "
            f"slurmlaunch gives it: every one makes a separate world of its --nproc-per-node ranks; for torchrun's "
            f"agents use submit --mode torchrun --nproc-per-node G SCRIPT (docs: --mode torchrun)")


def script_source(script: str, module: bool, workdir: str) -> str | None:
    """The text of the file that will run: SCRIPT, or for ``-m`` the module's ``.py`` (or package's
    ``__main__.py``) under ``workdir``; None when there is no such readable file or it is too large."""
    if module:
        base = os.path.join(workdir, *script.split("."))
        candidates = [base + ".py", os.path.join(base, "__main__.py")]
    else:
        candidates = [script if os.path.isabs(script) else os.path.join(workdir, script)]
    for path in candidates:
        data = _regular_file(path)
        if data is None:
            continue
        if len(data) > MAX_SOURCE_BYTES:
            return None
        return data.decode("utf-8", errors="replace")
    return None


def _regular_file(path: str) -> bytes | None:
    """At most MAX_SOURCE_BYTES + 1 bytes of ``path`` when it is a regular file; None for anything else. A FIFO,
    a terminal (/dev/stdin, /dev/tty) or a socket given as SCRIPT would block the read or eat the user's input:
    it is opened without blocking and left unread, and submit goes on without a note."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except (OSError, ValueError):  # ValueError: a NUL in the path
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks: list[bytes] = []
        left = MAX_SOURCE_BYTES + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)
