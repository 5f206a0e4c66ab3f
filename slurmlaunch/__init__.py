"""slurmlaunch: multi-node PyTorch on Slurm without hand-written batch scripts.

Importing the package is cheap on purpose (the launcher runs once per rank): everything heavier is loaded
on first use.
"""

from __future__ import annotations

from .core import __version__

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = ["__version__", "init_process_group", "mark", "submit", "submit_script", "map_array", "batch", "Job",
           "RankFailed", "SlurmLaunchError", "SpecError", "SchedulerError", "HostlistError",
           "EnvironmentMappingError", "PreflightError", "JobStateError", "DevClusterError"]
_API = ("submit", "submit_script", "map_array", "batch", "Job", "RankFailed")
_ERRORS = ("SlurmLaunchError", "SpecError", "SchedulerError", "HostlistError", "EnvironmentMappingError",
           "PreflightError", "JobStateError", "DevClusterError")


def __getattr__(name: str) -> Any:
    if name == "mark":
        from .allocation.timeline import mark

        return mark
    if name == "init_process_group":
        from .allocation.torch_helpers import init_process_group

        return init_process_group
    if name in _ERRORS:
        from .core import errors

        return getattr(errors, name)
    if name in _API:
        from .app import api

        return getattr(api, name)
    raise AttributeError(f"module 'slurmlaunch' has no attribute {name!r}")
