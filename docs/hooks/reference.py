"""The reference pages that describe the code (options, commands, the Python API), written from the code and
committed: a page reads the same on a code host as on the built site.

A page asks for a generated part with a line of its own, an HTML comment:

    <!-- generated: options -->            every command's options, by group, from its parser
    <!-- generated: options COMMAND -->    those of `slurmlaunch COMMAND` only
    <!-- generated: commands -->           the table of commands, from the parser's subcommands
    <!-- generated: python-api -->         every name of `slurmlaunch.__all__`, its signature and docstring

and `python docs/hooks/reference.py --write` writes what it asks for below it, up to a line
`<!-- end generated -->` (added the first time). The options come from the argparse tree the CLI itself
parses with (slurmlaunch.cli._parser; `submit`'s options from its table, app/options.py), and `launch`'s from
its own usage text (it parses without argparse): whatever defines an option, the parser is where it ends up.

Regenerate after changing an option, a command, a help line or a public name of the API:

    .venv/bin/python docs/hooks/reference.py --write      # --check: only say which pages are stale (exit 1)

tests/test_docs.py fails, with that command, when a committed page differs from what the code produces now;
the MkDocs hook (mkdocs.yml `hooks:`) fails the strict build the same way, so the site never shows text that
git does not have. An unknown marker, a command without a "read more" page below or a name there that is not
a command fails both.

Why committed rather than written at build time only (as this hook first did): the README links these pages,
and on a code host, outside a MkDocs build, they were empty (issue 41). The price is a regeneration after an
option changes, one command, which the test names.
"""

from __future__ import annotations

import argparse
import inspect
import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# The checkout's own code, not whatever slurmlaunch the environment has installed: the site describes this tree.
_TREE = str(Path(__file__).resolve().parents[2])
if _TREE not in sys.path:
    sys.path.insert(0, _TREE)

MARKER = re.compile(r"^<!-- generated: ([a-z-]+)(?: ([a-z-]+))? -->[ \t]*$", re.M)
END = "<!-- end generated -->"
# A marker and what was written below it, up to the end line (absent the first time).
REGION = re.compile(r"^<!-- generated: ([a-z-]+)(?: ([a-z-]+))? -->[ \t]*$"
                    r"(?:\n(?:(?!^<!-- generated: ).)*?^<!-- end generated -->[ \t]*$)?", re.M | re.S)
DOCS = Path(__file__).resolve().parents[1]
COMMAND = "python docs/hooks/reference.py --write"

# Where each command is explained (relative to docs/reference/); every command needs one.
READ_MORE = {
    "submit": ("Submit a job", "../how-to/submit.md"),
    "list": ("Submit a job", "../how-to/submit.md"),
    "status": ("Submit a job", "../how-to/submit.md"),
    "logs": ("Submit a job", "../how-to/submit.md"),
    "cancel": ("Submit a job", "../how-to/submit.md"),
    "stacks": ("Debugging", "../how-to/debugging.md"),
    "timeline": ("Where start-up goes", "../how-to/timeline.md"),
    "doctor": ("Debugging", "../how-to/debugging.md"),
    "config": ("Profiles", "../how-to/profiles.md"),
    "run": ("run without a scheduler", "../how-to/run.md"),
    "dev-cluster": ("A dev cluster on this machine", "../how-to/dev-cluster.md"),
    "completion": ("Submit a job", "../how-to/submit.md"),
    "launch": ("The launcher", "../explanation/launcher.md"),
    "torchrun-node": ("--mode torchrun", "../how-to/torchrun-mode.md"),
    "env": ("The launcher", "../explanation/launcher.md"),
    "hostnames": ("The launcher", "../explanation/launcher.md"),
}


class GenerationError(Exception):
    """A marker the hook cannot fill (mkdocs reports it and the strict build fails)."""


@contextmanager
def _without_pet_variables() -> Iterator[None]:
    """`run`'s defaults come from PET_* variables when set (as torchrun's do): the reference shows the
    built-in ones, whatever the environment the site is built in."""
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("PET_")}
    try:
        yield
    finally:
        os.environ.update(saved)


def subcommands() -> dict[str, tuple[argparse.ArgumentParser, str]]:
    """Every `slurmlaunch COMMAND`: its parser and its one-line help, in READ_MORE's order (the ones a user
    types first), then any READ_MORE lacks (commands_markdown refuses those)."""
    from slurmlaunch.cli import _parser

    with _without_pet_variables():
        top = _parser()
    sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    helps = {choice.dest: choice.help or "" for choice in sub._choices_actions}
    names = [n for n in READ_MORE if n in sub.choices] + [n for n in sub.choices if n not in READ_MORE]
    return {name: (sub.choices[name], helps.get(name, "")) for name in names}


def visible_options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The options a user can give (not -h/--help, not the hidden ones), in --help's order."""
    return [a for a in parser._actions
            if a.option_strings and a.help != argparse.SUPPRESS and not isinstance(a, argparse._HelpAction)]


def prose(text: str) -> str:
    """Plain text (a help string, a docstring) as Markdown that shows it as written: code spans kept,
    elsewhere no HTML tags, emphasis or table cells made of <, *, _ and |."""
    parts = re.split(r"(``[^`]+``|`[^`\n]+`)", text)
    for i in range(0, len(parts), 2):
        parts[i] = (parts[i].replace("\\", "\\\\").replace("<", "&lt;").replace("*", "\\*")
                    .replace("_", "\\_").replace("|", "\\|"))
    return re.sub(r"(?m)^([ \t]*)\\\* ", r"\1* ", "".join(parts))  # a docstring's bullet list stays one


def code(text: str) -> str:
    """``text`` as a code span. One with a | is written as HTML (`<code>N&#124;M</code>`): GitHub's tables end a
    cell at a | even inside a code span, unless escaped, and Python-Markdown's show the escape as written."""
    if "|" in text:
        return "<code>" + text.replace("&", "&amp;").replace("<", "&lt;").replace("|", "&#124;") + "</code>"
    return "`" + text + "`"


def _value(action: argparse.Action) -> str:
    if action.nargs == 0:
        return ""
    if action.choices is not None:
        word = "{" + ",".join(map(str, action.choices)) + "}"
    else:  # argparse's default metavar is dest.upper(), which can be a shared dest ("ignored"): the flag's name
        long_flag = next((o for o in action.option_strings if o.startswith("--")), action.option_strings[0])
        word = str(action.metavar or long_flag.lstrip("-").replace("-", "_").upper())
    return f"[{word}]" if action.nargs == "?" else word


def _default(action: argparse.Action) -> str:
    default = action.default
    if default is None or default is False or default == [] or default == () or default == argparse.SUPPRESS:
        return ""
    if default is True:
        return "on"
    if isinstance(default, float) and default.is_integer():
        default = int(default)
    return code(str(default))


def options_markdown(command: str) -> str:
    """Every option of `slurmlaunch COMMAND`, one table per group of its --help."""
    if command == "launch":
        from slurmlaunch.allocation.launch import USAGE

        return ("`launch` reads its options without argparse (it runs once per rank); this is its "
                "`--help`:\n\n```text\n" + USAGE.strip("\n") + "\n```\n")
    commands = subcommands()
    if command not in commands:
        raise GenerationError(f"options {command!r}: not a command (commands: {', '.join(commands)})")
    parser, _ = commands[command]
    out: list[str] = []
    positionals = [a for a in parser._actions if not a.option_strings]
    synopsis = " ".join(["slurmlaunch", command, *(["[options]"] if visible_options(parser) else []),
                         *(_positional(a) for a in positionals)])
    out.append(f"`{synopsis}`\n")
    if positionals:
        out.append("| argument | what it is |\n| --- | --- |")
        out.extend(f"| {code(_positional(a))} | {prose(a.help or '')} |" for a in positionals)
        out.append("")
    for group in parser._action_groups:
        actions = [a for a in group._group_actions if a in visible_options(parser)]
        if not actions:
            continue
        if len(parser._action_groups) > 2:
            title = group.title or ""
            out.append(f"**{prose(title)}**\n" if title != "options" else "**other options**\n")
        out.append("| option | value | default | what it does |\n| --- | --- | --- | --- |")
        for a in actions:
            flags = ", ".join(code(o) for o in a.option_strings)
            value = code(_value(a)) if _value(a) else ""
            out.append(f"| {flags} | {value} | {_default(a)} | {prose(a.help or '')} |")
        out.append("")
    return "\n".join(out)


def _positional(action: argparse.Action) -> str:
    if action.choices is not None:
        word = "{" + ",".join(map(str, action.choices)) + "}"
    else:
        word = str(action.metavar or action.dest.upper())
    if action.nargs == "?":
        return f"[{word}]"
    if action.nargs in ("*", argparse.REMAINDER):
        return f"[{word}...]"
    return word


def commands_markdown() -> str:
    """The table of commands: what each does (its --help line) and the page that explains it."""
    commands = subcommands()
    unknown = sorted(set(READ_MORE) - set(commands))
    missing = [name for name in commands if name not in READ_MORE]
    if unknown or missing:
        raise GenerationError(f"docs/hooks/reference.py READ_MORE: not commands: {unknown}; commands without a "
                              f"page: {missing}")
    rows = ["| command | what it does | options | read more |", "| --- | --- | --- | --- |"]
    for name, (parser, help_line) in commands.items():
        title, page = READ_MORE[name]
        has_options = name == "launch" or visible_options(parser) or any(not a.option_strings for a in parser._actions)
        options = f"[options](options.md#slurmlaunch-{name})" if has_options else ""
        rows.append(f"| `{name}` | {prose(help_line)} | {options} | [{title}]({page}) |")
    return "\n".join(rows) + "\n"


def options_page_commands() -> list[str]:
    """The commands whose options the options page lists: those with options or arguments, and launch."""
    return [name for name, (parser, _) in subcommands().items()
            if name == "launch" or any(a.help != argparse.SUPPRESS for a in parser._actions[1:])]


class _Shown:
    """An annotation as written in the source (they are strings here: `from __future__ import annotations`)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def signature(obj: Any) -> str:
    """``obj``'s signature with its annotations as written."""
    sig = inspect.signature(obj)

    def shown(annotation: Any) -> Any:
        if annotation is inspect.Parameter.empty:
            return annotation
        return _Shown(annotation if isinstance(annotation, str) else inspect.formatannotation(annotation))

    params = [p.replace(annotation=shown(p.annotation)) for p in sig.parameters.values()]
    return str(sig.replace(parameters=params, return_annotation=shown(sig.return_annotation)))


def _doc(obj: Any) -> str:
    return inspect.getdoc(obj) or ""


def _members(cls: type) -> list[tuple[str, Any]]:
    """The public methods and properties a class defines itself (not those of Exception or object)."""
    return [(name, member) for name, member in vars(cls).items()
            if not name.startswith("_") and (inspect.isfunction(member) or isinstance(member, property))]


def python_api_markdown() -> str:
    """Every name `import slurmlaunch` provides (its __all__): signature and docstring, methods of classes."""
    import slurmlaunch

    out: list[str] = []
    for name in slurmlaunch.__all__:
        obj = getattr(slurmlaunch, name)
        if name == "__version__":
            out.append(f"### `__version__`\n\nThe version, a string: `{obj}` here.\n")
            continue
        if inspect.isclass(obj):
            bases = ", ".join(b.__name__ for b in obj.__bases__ if b is not object)
            out.append(f"### `{name}`\n\n```python\nclass slurmlaunch.{name}" + (f"({bases})" if bases else "")
                       + "\n```\n\n" + prose(_doc(obj)) + "\n")
            for member_name, member in _members(obj):
                if isinstance(member, property):
                    out.append(f"#### `{name}.{member_name}`\n\nA property. " + prose(_doc(member)) + "\n")
                else:
                    out.append(f"#### `{name}.{member_name}`\n\n```python\n{member_name}{signature(member)}\n```\n\n"
                               + prose(_doc(member)) + "\n")
        else:
            out.append(f"### `{name}`\n\n```python\nslurmlaunch.{name}{signature(obj)}\n```\n\n"
                       + prose(_doc(obj)) + "\n")
    return "\n".join(out)


def all_options_markdown() -> str:
    """A section per command with options or arguments (launch's too), in the parser's order."""
    return "\n".join(f"## `slurmlaunch {name}`\n\n{options_markdown(name)}" for name in options_page_commands())


def generate(kind: str, argument: str | None) -> str:
    if kind == "options":
        return options_markdown(argument) if argument else all_options_markdown()
    if kind == "commands" and argument is None:
        return commands_markdown()
    if kind == "python-api" and argument is None:
        return python_api_markdown()
    raise GenerationError(f"unknown marker <!-- generated: {kind}{' ' + argument if argument else ''} -->")


def render(markdown: str) -> str:
    """``markdown`` with what each marker asks for written below it (replacing what was there), up to END."""
    return REGION.sub(lambda m: f"{m[0].splitlines()[0]}\n\n{generate(m[1], m[2]).rstrip(chr(10))}\n\n{END}",
                      markdown)


def generated_pages() -> list[Path]:
    """The pages of docs/ with a marker."""
    return [p for p in sorted(DOCS.rglob("*.md")) if MARKER.search(p.read_text())]


def stale_pages() -> list[Path]:
    """The pages whose committed text differs from what the code produces now."""
    return [p for p in generated_pages() if render(p.read_text()) != p.read_text()]


def without_generated(markdown: str) -> str:
    """``markdown`` as written by hand: each generated part left out, its marker kept."""
    return REGION.sub(lambda m: m[0].splitlines()[0], markdown)


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    """The build checks, it does not write: a stale page fails the strict build with the command that fixes it."""
    from mkdocs.exceptions import PluginError

    where = f"docs/hooks/reference.py: docs/{kwargs['page'].file.src_path}"
    try:
        fresh = render(markdown)
    except GenerationError as e:
        raise PluginError(f"{where}: {e}") from e
    if fresh != markdown:
        raise PluginError(f"{where}: the generated reference differs from the code; regenerate it: {COMMAND}")
    return markdown


def main(argv: list[str]) -> int:
    if argv not in (["--write"], ["--check"]):
        print(f"usage: python docs/hooks/reference.py --write | --check (got: {' '.join(argv) or 'no argument'})",
              file=sys.stderr)
        return 2
    try:
        stale = stale_pages()
        if argv == ["--write"]:
            for page in stale:
                page.write_text(render(page.read_text()))
    except GenerationError as e:
        print(f"docs/hooks/reference.py: {e}", file=sys.stderr)
        return 2
    names = ", ".join(str(p.relative_to(DOCS.parent)) for p in stale)
    if argv == ["--write"]:
        print(f"rewrote {names}" if stale else "the generated reference pages are up to date")
        return 0
    if stale:
        print(f"stale: {names}; regenerate: {COMMAND}", file=sys.stderr)
        return 1
    print("the generated reference pages are up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
