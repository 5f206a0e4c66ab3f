"""Where slurmlaunch keeps per-user files, after the XDG base directory rules."""

from __future__ import annotations

import os
from collections.abc import Mapping


def config_dir(environ: Mapping[str, str] = os.environ) -> str:
    """$XDG_CONFIG_HOME/slurmlaunch (default ~/.config/slurmlaunch): config.toml, templates/."""
    base = environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "slurmlaunch")


def state_dir(environ: Mapping[str, str] = os.environ) -> str:
    """$XDG_STATE_HOME/slurmlaunch (default ~/.local/state/slurmlaunch): jobs.jsonl, site.json."""
    base = environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "slurmlaunch")
