"""What doctor learned about a cluster, kept per user in $XDG_STATE_HOME/slurmlaunch/site.json: doctor writes
it, submit reads the GPU flag from it. Its own module so that submit does not import doctor."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from typing import Any

from ..core.errors import SchedulerError
from ..core.spec import GPU_FLAGS, GpuFlag
from ..schedulers import run_command

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..schedulers.interface import Scheduler


def try_command(cmd: list[str], timeout: float = 30) -> tuple[bool, str]:
    """(True, its output) when the command succeeded, else (False, why): for checks that report a failure
    rather than raise it."""
    try:
        proc = run_command(cmd, timeout=timeout)
    except SchedulerError as e:
        return False, str(e)
    return True, (proc.stdout + proc.stderr).strip()


def site_path(environ: Mapping[str, str] = os.environ) -> str:
    from ..core.paths import state_dir

    return os.path.join(state_dir(environ), "site.json")


def load_site() -> dict[str, Any]:
    try:
        with open(site_path()) as f:
            data: dict[str, Any] = json.load(f)
            return data
    except (OSError, ValueError):
        return {}


def remember_site(cluster: str, facts: dict[str, Any]) -> None:
    data = load_site()
    data[cluster] = {**data.get(cluster, {}), **facts, "checked_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    os.makedirs(os.path.dirname(site_path()), mode=0o700, exist_ok=True)
    with open(site_path(), "w") as f:
        json.dump(data, f, indent=2)


def learned_gpu_flag(edge: Scheduler) -> tuple[GpuFlag, str] | None:
    """(gpu flag, cluster) that doctor found for the cluster ``edge``'s client talks to (its cluster()'s "name",
    the key doctor kept it under), where the flag is one of the edge's gpu_request_styles; else None."""
    site = load_site()
    if not site:
        return None
    cluster = edge.cluster().get("name", "")
    flag = site.get(cluster, {}).get("gpu_flag") if cluster else None
    return (flag, cluster) if flag in GPU_FLAGS and flag in edge.gpu_request_styles else None
