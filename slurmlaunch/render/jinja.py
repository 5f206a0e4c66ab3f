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

from ..core.errors import SpecError

TYPE_CHECKING = False
if TYPE_CHECKING:  # imported where used: a caller that only submits a script rendered elsewhere needs no Jinja2
    import jinja2


def shipped_template_dir() -> Path:
    """templates/ inside the installed package, or at the repository root in a source checkout."""
    here = Path(__file__).resolve().parent.parent
    installed = here / "templates"
    return installed if installed.is_dir() else here.parent / "templates"


def user_template_dir(environ: Mapping[str, str]) -> Path:
    from ..core.paths import config_dir

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
    import jinja2

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


def _template_line(exc: BaseException, filename: str | None) -> str:
    """" line N" of ``filename`` where ``exc`` was raised (Jinja maps template code to its source lines)."""
    import traceback

    lines = [f.lineno for f in traceback.extract_tb(exc.__traceback__) if filename and f.filename == filename]
    return f" line {lines[-1]}" if lines else ""


def render(name: str, context: Mapping[str, Any], template_dir: str | None = None,
           environ: Mapping[str, str] = os.environ) -> str:
    """Render template ``name``; a variable the template uses but the context lacks is an error.

    A user's template that is not UTF-8, includes what does not exist or raises while rendering is a
    SpecError naming the file; an exception from a shipped template stays a traceback (it is our bug).
    """
    import jinja2

    dirs = search_path(template_dir, environ)
    try:
        template = environment(dirs).get_template(name)
    except jinja2.TemplateNotFound as e:
        raise SpecError(_not_found(name, e, dirs)) from None
    except jinja2.TemplateSyntaxError as e:
        raise SpecError(f"template {e.filename or name!r} line {e.lineno}: {e.message}") from None
    except UnicodeDecodeError as e:
        raise SpecError(f"template {name!r} (first found in {', '.join(map(str, dirs))}) is not UTF-8 text "
                        f"(byte {e.object[e.start]:#04x} at offset {e.start})") from None
    where = template.filename or name
    try:
        return template.render(**context)
    except jinja2.TemplateNotFound as e:
        raise SpecError(f"template {where!r}: " + _not_found(name, e, dirs)) from None
    except jinja2.UndefinedError as e:
        raise SpecError(f"template {where!r}{_template_line(e, template.filename)}: {e.message} (variables "
                        f"available: {', '.join(sorted(context))})") from None
    except jinja2.TemplateSyntaxError as e:
        raise SpecError(f"template {e.filename or where!r} line {e.lineno}: {e.message}") from None
    except UnicodeDecodeError as e:  # an included template
        raise SpecError(f"template {where!r}: an included template is not UTF-8 text (byte "
                        f"{e.object[e.start]:#04x} at offset {e.start})") from None
    except Exception as e:
        shipped = str(shipped_template_dir())
        if where.startswith(shipped + os.sep):
            raise
        raise SpecError(f"template {where!r}{_template_line(e, template.filename)} failed: "
                        f"{type(e).__name__}: {e}") from None


def _not_found(name: str, e: jinja2.TemplateNotFound, dirs: list[Path]) -> str:
    missing = e.name if isinstance(e.name, str) else name
    if missing == name:
        return f"template {name!r} not found in {', '.join(map(str, dirs))}"
    # Included by the template: names are looked up in the template directories, never as absolute paths.
    return f"it includes {missing!r}, which is not found in {', '.join(map(str, dirs))} (includes are " \
           f"names relative to those directories)"
