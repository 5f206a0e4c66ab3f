"""Shell completion scripts, generated from the argparse parser (so they never lag behind the options).

bash: commands, each command's options, the choices of options that have them, profile names (from
`slurmlaunch config profiles`), file names otherwise. zsh: the bash function through bashcompinit. fish:
one `complete` line per command and option.
"""

from __future__ import annotations

import argparse
import shlex
from typing import Any

# Commands run inside allocations, not typed by people: not offered.
HIDDEN = {"launch", "torchrun-node"}


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {name: p for name, p in sub.choices.items() if name not in HIDDEN}


def _options(parser: argparse.ArgumentParser) -> list[tuple[list[str], list[str] | None, bool, str]]:
    """(option strings, choices, takes a value, help) of each option."""
    out: list[tuple[list[str], list[str] | None, bool, str]] = []
    for action in parser._actions:
        if isinstance(action, argparse.BooleanOptionalAction):
            # Its --no-X spellings are undo flags, offered (and described) apart: --no-python, which is not
            # an undo of anything, is a plain option and keeps its own help.
            yes = [o for o in action.option_strings if not o.startswith("--no-")]
            no = [o for o in action.option_strings if o.startswith("--no-")]
            out.append((yes, None, False, action.help or ""))
            out.append((no, None, False, "undo " + " ".join(yes)))
        elif action.option_strings and action.help != argparse.SUPPRESS:  # refused torchrun flags: not offered
            choices = [str(c) for c in action.choices] if action.choices else None
            out.append((list(action.option_strings), choices, action.nargs != 0, action.help or ""))
    return out


def bash(parser: argparse.ArgumentParser) -> str:
    commands = _commands(parser)
    lines = [
        "# slurmlaunch completion for bash: eval \"$(slurmlaunch completion bash)\"",
        "_slurmlaunch() {",
        "    local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]} cmd=${COMP_WORDS[1]}",
        "    if [ \"$COMP_CWORD\" -eq 1 ]; then",
        f"        COMPREPLY=($(compgen -W {shlex.quote(' '.join(commands))} -- \"$cur\"))",
        "        return",
        "    fi",
        "    local opts=",
        "    case \"$cmd\" in",
    ]
    choice_cases: dict[str, list[str]] = {}
    for name, sub in commands.items():
        opts = _options(sub)
        lines.append(f"        {name}) opts={shlex.quote(' '.join(o for strings, *_ in opts for o in strings))}")
        for strings, choices, _, _ in opts:
            if choices:
                for o in strings:
                    choice_cases.setdefault(" ".join(choices), []).append(f"{name}:{o}")
        positional = [a for a in sub._actions if not a.option_strings and a.choices]
        if positional:
            words = " ".join(str(c) for c in positional[0].choices or ())
            lines.append(f"            if [[ $cur != -* ]] && [ \"$COMP_CWORD\" -eq 2 ]; then COMPREPLY=($(compgen "
                         f"-W {shlex.quote(words)} -- \"$cur\")); return; fi")
        lines.append("            ;;")
    lines += ["    esac", "    case \"$cmd:$prev\" in"]
    for words, keys in choice_cases.items():
        lines.append(f"        {'|'.join(keys)}) COMPREPLY=($(compgen -W {shlex.quote(words)} -- \"$cur\")); return ;;")
    lines += [
        "        *:--profile) COMPREPLY=($(compgen -W \"$(slurmlaunch config profiles 2>/dev/null)\" -- \"$cur\"));"
        " return ;;",
        "    esac",
        "    if [[ $cur == -* ]]; then",
        "        COMPREPLY=($(compgen -W \"$opts\" -- \"$cur\"))",
        "    else",
        "        COMPREPLY=($(compgen -f -- \"$cur\"))",
        "    fi",
        "}",
        "complete -o filenames -F _slurmlaunch slurmlaunch",
    ]
    return "\n".join(lines) + "\n"


def zsh(parser: argparse.ArgumentParser) -> str:
    return ("# slurmlaunch completion for zsh: eval \"$(slurmlaunch completion zsh)\"\n"
            "autoload -U +X compinit && compinit\nautoload -U +X bashcompinit && bashcompinit\n"
            + bash(parser).split("\n", 1)[1])


def fish(parser: argparse.ArgumentParser) -> str:
    commands = _commands(parser)
    lines = ["# slurmlaunch completion for fish: slurmlaunch completion fish > ~/.config/fish/completions/"
             "slurmlaunch.fish", "complete -c slurmlaunch -f"]
    top = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {c.dest: c.help or "" for c in top._choices_actions}
    for name in commands:
        described = _fish_quote(helps.get(name, ""))
        lines.append(f"complete -c slurmlaunch -n __fish_use_subcommand -a {name} -d {described}")
    for name, sub in commands.items():
        for strings, choices, takes_value, help_text in _options(sub):
            flags = " ".join(f"-l {o[2:]}" if o.startswith("--") else f"-s {o[1:]}" for o in strings)
            extra = f" -x -a {_fish_quote(' '.join(choices))}" if choices else (" -r -F" if takes_value else "")
            if strings[-1] == "--profile":
                extra = " -x -a '(slurmlaunch config profiles 2>/dev/null)'"
            lines.append(f"complete -c slurmlaunch -n '__fish_seen_subcommand_from {name}' {flags}{extra} "
                         f"-d {_fish_quote(help_text.split('(')[0].strip()[:60])}")
    return "\n".join(lines) + "\n"


def _fish_quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def script(shell: str, parser: Any) -> str:
    return {"bash": bash, "zsh": zsh, "fish": fish}[shell](parser)
