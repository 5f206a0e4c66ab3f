"""Which warning signal a training script's own framework listens for: a look at its source, without importing it.

PyTorch Lightning's Trainer (packages ``lightning`` and ``pytorch_lightning``), when it runs under Slurm with
its SLURMEnvironment (the default there), installs a handler for SIGUSR1 that saves an ``hpc_ckpt_N.ckpt``
and has global rank 0 run ``scontrol requeue`` itself; ``SLURMEnvironment(requeue_signal=...)`` moves it to
another signal and ``SLURMEnvironment(auto_requeue=False)`` turns it off. Any other signal without a handler
of the script's own kills every rank. So submit sends Lightning the signal it expects, and lets Lightning
requeue (docs: Time limits, preemption, requeue).

The scan reads one file: the script, or the module's file under the working directory. It is a heuristic
(an import of Lightning behind a local module is not seen); ``--signal`` always decides.
"""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass

LIGHTNING_DEFAULT_SIGNAL = "USR1"  # SLURMEnvironment's requeue_signal when none is given
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
    return ClientSignal("Lightning", signal, requeues, detail)


def script_source(script: str, module: bool, workdir: str) -> str | None:
    """The text of the file that will run: SCRIPT, or for ``-m`` the module's ``.py`` (or package's
    ``__main__.py``) under ``workdir``; None when there is no such readable file or it is too large."""
    if module:
        base = os.path.join(workdir, *script.split("."))
        candidates = [base + ".py", os.path.join(base, "__main__.py")]
    else:
        candidates = [script if os.path.isabs(script) else os.path.join(workdir, script)]
    for path in candidates:
        try:
            with open(path, "rb") as f:
                data = f.read(MAX_SOURCE_BYTES + 1)
        except OSError:
            continue
        if len(data) > MAX_SOURCE_BYTES:
            return None
        return data.decode("utf-8", errors="replace")
    return None
