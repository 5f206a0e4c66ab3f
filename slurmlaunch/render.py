"""Jinja2 rendering of batch scripts: strict about missing variables, quoting for the shell.

Template lookup, first match wins: --template-dir, $SLURMLAUNCH_TEMPLATE_DIR, the per-user config
directory ($XDG_CONFIG_HOME/slurmlaunch/templates, default ~/.config/slurmlaunch/templates), then the
templates shipped with slurmlaunch. A user's template of the same name therefore replaces ours.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import jinja2

from .errors import SpecError


def shipped_template_dir() -> Path:
    """templates/ inside the installed package, or at the repository root in a source checkout."""
    here = Path(__file__).resolve().parent
    installed = here / "templates"
    return installed if installed.is_dir() else here.parent / "templates"


def user_template_dir(environ: Mapping[str, str]) -> Path:
    from .paths import config_dir

    return Path(config_dir(environ)) / "templates"


def search_path(template_dir: str | None, environ: Mapping[str, str]) -> list[Path]:
    dirs: list[Path] = []
    if template_dir:
        if not os.path.isdir(template_dir):
            raise SpecError(f"--template-dir {template_dir!r} is not a directory")
        dirs.append(Path(template_dir))
    if environ.get("SLURMLAUNCH_TEMPLATE_DIR"):
        dirs.append(Path(environ["SLURMLAUNCH_TEMPLATE_DIR"]))
    dirs.append(user_template_dir(environ))
    dirs.append(shipped_template_dir())
    return dirs


def _qjoin(items: Iterable[str]) -> str:
    return " ".join(shlex.quote(str(i)) for i in items)


def environment(dirs: list[Path]) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader([str(d) for d in dirs]),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    env.filters["q"] = lambda value: shlex.quote(str(value))
    env.filters["qjoin"] = _qjoin
    return env


def render(name: str, context: Mapping[str, Any], template_dir: str | None = None,
           environ: Mapping[str, str] = os.environ) -> str:
    """Render template ``name``; a variable the template uses but the context lacks is an error."""
    dirs = search_path(template_dir, environ)
    try:
        return environment(dirs).get_template(name).render(**context)
    except jinja2.TemplateNotFound:
        raise SpecError(f"template {name!r} not found in {', '.join(map(str, dirs))}") from None
    except jinja2.UndefinedError as e:
        raise SpecError(f"template {name!r}: {e.message} (variables available: {', '.join(sorted(context))})") \
            from None
    except jinja2.TemplateSyntaxError as e:
        raise SpecError(f"template {name!r} line {e.lineno}: {e.message}") from None
