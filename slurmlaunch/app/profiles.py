"""Cluster profiles: defaults for any submit option, from TOML files, with the origin of every value.

Files, later ones winning:
  the per-user file   $SLURMLAUNCH_CONFIG, else $XDG_CONFIG_HOME/slurmlaunch/config.toml
                      (default ~/.config/slurmlaunch/config.toml)
  the project file    slurmlaunch.toml in the working directory or the nearest directory above it

Each file may hold ``profile = "NAME"`` (the profile used when none is asked for), a ``[defaults]`` table and
``[profiles.NAME]`` tables. Keys are the submit options' long names (``gpus-per-node`` or ``gpus_per_node``).
Layers, lowest first: built-in defaults, user [defaults], project [defaults], user [profiles.NAME], project
[profiles.NAME], the command line. Lists (setup, sbatch-arg, container-mount) and env are joined, not
replaced: the profile's entries come first and the command line's are added (an env key given on the command
line wins). The profile is chosen by --profile, else $SLURMLAUNCH_PROFILE, else a file's ``profile`` key.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.errors import SpecError
from ..core.limits import MAX_NODES, MAX_SECONDS, Count, Seconds, shown, shown_value
from ..core.paths import config_dir

PROJECT_FILE = "slurmlaunch.toml"
BUILTIN = "built-in default"
COMMAND_LINE = "command line"
# Options that describe one submission, not a cluster: never taken from a profile.
NOT_IN_PROFILES = frozenset({"script", "args", "dry_run", "profile", "help", "sweep", "array"})
# Options that change what SCRIPT is (a file, a module, an executable): a file that set them would silently
# turn every `submit train.py` into `-m train.py`, so a file naming them is refused (docs: Profiles).
CHANGES_WHAT_RUNS = {"module": "-m/--module", "no_python": "--no-python",
                     "legacy_local_rank_arg": "--legacy-local-rank-arg"}
SHOW_ALIGN = 48  # `config show`: values up to this wide line their origins up
# Paths a file may give relative to itself (docs: Profiles), so that a file means the same from any directory.
FILE_RELATIVE = frozenset({"template_dir", "output_dir"})
# A site fact, not an option: `account-as = "project"` where the site charges the project named by PBS's -P
# (NCI Gadi) and -A is not what it bills; --account then writes -P. Profiles and [defaults] may hold it.
ACCOUNT_AS = ("account-as", "account_as")
ACCOUNT_AS_VALUES = ("account", "project")


@dataclass(frozen=True)
class Option:
    dest: str
    flag: str  # the long option, as the user writes it
    kind: str  # int, float, str, bool, list, env
    choices: tuple[str, ...] | None
    builtin: Any
    bounds: tuple[float, float] | None = None  # an integer's or seconds' range, from the option's type


def option_table(parser: argparse.ArgumentParser) -> dict[str, Option]:
    """The submit options a profile may set, read from the parser (its defaults are the built-in ones).
    The parser is left as it was (:func:`defer_defaults` is the variant that changes it)."""
    table: dict[str, Option] = {}
    for action in parser._actions:
        if action.dest in NOT_IN_PROFILES or action.dest in CHANGES_WHAT_RUNS or not action.option_strings:
            continue
        flag = next(o for o in action.option_strings if o.startswith("--"))
        if isinstance(action, argparse._AppendAction):
            kind = "env" if action.dest == "env" else "list"
            builtin: Any = [] if action.default is None else list(action.default)
        elif isinstance(action, (argparse._StoreTrueAction, argparse.BooleanOptionalAction)):
            kind, builtin = "bool", bool(action.default)
        elif action.dest == "nodes":
            kind, builtin = "nodes", action.default  # N, or MIN:MAX
        else:
            kind = getattr(action.type, "kind", None) or \
                {int: "int", float: "float"}.get(action.type, "str")  # type: ignore[call-overload]
            builtin = action.default
        bounds: tuple[float, float] | None = None
        if isinstance(action.type, Count):
            bounds = (action.type.minimum, action.type.maximum)
        elif isinstance(action.type, Seconds):
            bounds = (0, MAX_SECONDS)
        # a tuple as it is: a subclass may take more than it lists (options.SchedulerChoices)
        choices = action.choices if isinstance(action.choices, tuple) else \
            tuple(action.choices) if action.choices else None
        table[action.dest] = Option(action.dest, flag, kind, choices, builtin, bounds)
    return table


def defer_defaults(parser: argparse.ArgumentParser) -> dict[str, Option]:
    """:func:`option_table`, and then the parser's defaults of those options set to None, so that after
    parsing None means "not on the command line" (:func:`resolve` fills in the profile's or built-in value)."""
    table = option_table(parser)
    for action in parser._actions:
        if action.dest in table:
            action.default = None
    return table


def user_config_path(environ: Mapping[str, str]) -> Path:
    if environ.get("SLURMLAUNCH_CONFIG"):
        return Path(environ["SLURMLAUNCH_CONFIG"])
    return Path(config_dir(environ)) / "config.toml"


def project_config_path(cwd: str) -> Path | None:
    here = Path(cwd).resolve()
    for d in (here, *here.parents):
        if (d / PROJECT_FILE).is_file():
            return d / PROJECT_FILE
    return None


def _load(path: Path) -> dict[str, Any]:
    # Imported here: every argparse command builds the option table, only a config file needs TOML.
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib  # type: ignore[import-not-found,unused-ignore]
    try:
        with open(path, "rb") as f:
            data: dict[str, Any] = tomllib.load(f)
    except OSError as e:
        raise SpecError(f"config file {str(path)!r} cannot be read: {e.strerror}") from None
    except UnicodeDecodeError as e:  # TOML is UTF-8; tomllib lets the decoding error through
        raise SpecError(f"config file {str(path)!r} is not UTF-8 text (byte {e.object[e.start]:#04x} at offset "
                        f"{e.start}; TOML files are UTF-8)") from None
    except ValueError as e:  # TOMLDecodeError, or an integer too long for int()
        raise SpecError(f"config file {str(path)!r} is not valid TOML: {e}") from None
    unknown = set(data) - {"profile", "defaults", "profiles"}
    if unknown:
        raise SpecError(f"config file {str(path)!r}: unknown key(s) {', '.join(sorted(unknown))} "
                        f"(expected profile = \"NAME\", [defaults] and [profiles.NAME] tables)")
    if "profile" in data and not isinstance(data["profile"], str):
        raise SpecError(f"config file {str(path)!r}: profile = {data['profile']!r} is not valid "
                        f"(expected profile = \"NAME\"; options go in [defaults] and [profiles.NAME] tables)")
    if not isinstance(data.get("profiles", {}), dict):
        raise SpecError(f"config file {str(path)!r}: profiles = {shown_value(data['profiles'])} is not valid "
                        f"(expected [profiles.NAME] tables)")
    if not isinstance(data.get("defaults", {}), dict):
        raise SpecError(f"config file {str(path)!r}: defaults = {shown_value(data['defaults'])} is not valid "
                        f"(expected a [defaults] table of options)")
    for name, table in data.get("profiles", {}).items():
        if not isinstance(table, dict):
            raise SpecError(f"config file {str(path)!r}: profiles.{name} is not a table (expected "
                            f"[profiles.{name}] with options under it)")
    return data


def shipped_profile_files() -> list[Path]:
    """Site profiles shipped with slurmlaunch (slurmlaunch/site_profiles/*.toml, docs: PBS): the lowest
    profile layer, used only when their profile is chosen; the user's and project's files add to them."""
    return sorted((Path(__file__).resolve().parent.parent / "site_profiles").glob("*.toml"))


def profile_names(environ: Mapping[str, str], cwd: str) -> list[str]:
    """The profiles the user and project files define (for completion and `config profiles`)."""
    names: set[str] = set()
    for path in (*shipped_profile_files(), user_config_path(environ), project_config_path(cwd)):
        if path is not None and path.is_file():
            names.update(_load(path).get("profiles", {}))
    return sorted(names)


def _convert(opt: Option, value: Any, where: str) -> Any:
    """A TOML value checked against the option's kind; SpecError names the file, the table and the key."""
    def bad(expected: str) -> SpecError:
        return SpecError(f"{where}: {opt.flag.lstrip('-')} = {shown_value(value)} is not valid (expected "
                         f"{expected})")

    convert = _CONVERTERS.get(opt.kind, _string)
    return convert(opt, value, bad, where)


Bad = Callable[[str], SpecError]


def _bool(opt: Option, value: Any, bad: Bad, where: str) -> Any:
    if not isinstance(value, bool):
        raise bad("true or false")
    return value


def _nodes(opt: Option, value: Any, bad: Bad, where: str) -> Any:
    from ..core.parse import parse_nodes

    expected = f"a number of nodes 1..{MAX_NODES}, or \"MIN:MAX\" for --mode torchrun with 1 <= MIN <= MAX"
    if isinstance(value, bool) or not isinstance(value, (int, str)) or \
            (isinstance(value, str) and not re.fullmatch(r"\d+(:\d+)?", value)):
        raise bad(expected)
    try:  # the bounds checked here, so that the error names this file and table (nodes = 0)
        parse_nodes(value)
    except SpecError:
        raise bad(expected) from None
    return value


def _in_bounds(opt: Option, number: float) -> bool:
    return opt.bounds is None or opt.bounds[0] <= number <= opt.bounds[1]  # False for nan


def _int(opt: Option, value: Any, bad: Bad, where: str) -> Any:
    if isinstance(value, bool) or not isinstance(value, int) or not _in_bounds(opt, value):
        raise bad("an integer" + (f" {opt.bounds[0]}..{opt.bounds[1]}" if opt.bounds else ""))
    return value


def _float(opt: Option, value: Any, bad: Bad, where: str) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not _in_bounds(opt, value):
        raise bad("a number" + (f" {opt.bounds[0]}..{opt.bounds[1]}" if opt.bounds else ""))
    return float(value)


def _list(opt: Option, value: Any, bad: Bad, where: str) -> Any:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        raise bad("a string or a list of strings")
    return list(items)


def _env(opt: Option, value: Any, bad: Bad, where: str) -> Any:
    from ..core.spec import ENV_KEY

    if isinstance(value, dict):
        out = []
        for k, v in value.items():
            if isinstance(v, bool) or not isinstance(v, (str, int, float)):
                raise bad("a table of strings, e.g. env = { NCCL_DEBUG = \"WARN\" }")
            out.append(f"{k}={v}")
    elif isinstance(value, list) and all(isinstance(i, str) for i in value):
        out = list(value)
    else:
        raise bad("a table of strings, e.g. env = { NCCL_DEBUG = \"WARN\" }")
    for item in out:  # checked here, so that the error names this file and table
        key, eq, _ = item.partition("=")
        if not eq or not ENV_KEY.fullmatch(key):
            raise SpecError(f"{where}: env key {shown(key)} is not valid (expected a shell variable name "
                            f"such as NCCL_DEBUG)")
    return out


def _string(opt: Option, value: Any, bad: Bad, where: str) -> Any:
    if not isinstance(value, str):
        raise bad("a string")
    if opt.choices and value not in opt.choices:
        raise bad("one of " + ", ".join(opt.choices))
    return value


# Option.kind -> the check of a TOML value (any other kind: a string, from the choices if there are any)
_CONVERTERS: dict[str, Callable[[Option, Any, Bad, str], Any]] = {
    "bool": _bool, "nodes": _nodes, "int": _int, "float": _float, "list": _list, "env": _env,
}


@dataclass
class Resolved:
    values: dict[str, Any]
    origins: dict[str, str]
    profile: str | None
    files: list[Path]


def _layers(files: list[tuple[Path, dict[str, Any]]], profile: str | None) -> list[tuple[str, Path, dict[str, Any]]]:
    layers = [(f"{path} [defaults]", path, data.get("defaults", {})) for path, data in files]
    if profile is not None:
        found = [(f"{path} [profiles.{profile}]", path, data["profiles"][profile])
                 for path, data in files if profile in data.get("profiles", {})]
        if not found:
            known = sorted({name for _, data in files for name in data.get("profiles", {})})
            where = ", ".join(str(p) for p, _ in files)
            raise SpecError(f"profile {profile!r} not found in {where} (known profiles: "
                            f"{', '.join(known) or 'none'})")
        layers += found
    return layers


def resolve(ns: argparse.Namespace, table: Mapping[str, Option], environ: Mapping[str, str],
            cwd: str) -> Resolved:
    """Merge built-in defaults, the config files and the command line (``ns``, None = not given)."""
    files, profile = _files_and_profile(ns, environ, cwd)
    values = {dest: (list(o.builtin) if isinstance(o.builtin, list) else o.builtin) for dest, o in table.items()}
    origins = {dest: BUILTIN for dest in table}
    by_name = {o.flag.lstrip("-"): o for o in table.values()} | {dest: o for dest, o in table.items()}
    account_as: tuple[str, str] | None = None  # (value, where it was set)
    for where, path, layer in _layers(files, profile):
        for key, raw in layer.items():
            if key in ACCOUNT_AS:
                if raw not in ACCOUNT_AS_VALUES:
                    raise SpecError(f"{where}: {key} = {shown_value(raw)} is not valid (expected \"project\": the "
                                    f"site charges the project named by -P, or \"account\": -A)")
                account_as = (str(raw), where)
                continue
            opt = _option_named(key, raw, by_name, table, where)
            value = _convert(opt, raw, where)
            if opt.dest in FILE_RELATIVE:
                value = str(path.parent / os.path.expanduser(value))
            if opt.kind in ("list", "env") and origins[opt.dest] != BUILTIN:
                values[opt.dest] = values[opt.dest] + value
                origins[opt.dest] += " + " + where
            else:
                values[opt.dest], origins[opt.dest] = value, where
    _add_command_line(ns, table, values, origins)
    if account_as is not None and account_as[0] == "project" and "account" in values:
        _account_as_project(values, origins, account_as[1])
    return Resolved(values, origins, profile, [p for p, _ in files])


def _account_as_project(values: dict[str, Any], origins: dict[str, str], where: str) -> None:
    """--account written as the project (-P) at a site that charges the project: what the user meant by it."""
    account, project = values.get("account"), values.get("project")
    if account is None:
        return
    if project is not None and project != account:
        raise SpecError(f"--account {account} and --project {project}: this site charges the project named by -P "
                        f"and has no separate account (account-as = \"project\" in {where}); give one of them")
    values["project"], values["account"] = account, None
    origins["project"] = f"{origins['account']}, as --account (account-as = \"project\" in {where})"
    origins["account"] = f"written as --project (account-as = \"project\" in {where})"


def _files_and_profile(ns: argparse.Namespace, environ: Mapping[str, str],
                       cwd: str) -> tuple[list[tuple[Path, dict[str, Any]]], str | None]:
    """The config files that exist (the shipped ones holding the chosen profile first) and the profile:
    --profile, else $SLURMLAUNCH_PROFILE, else the last file's ``profile =``."""
    files: list[tuple[Path, dict[str, Any]]] = []
    user = user_config_path(environ)
    if user.is_file() or environ.get("SLURMLAUNCH_CONFIG"):
        files.append((user, _load(user)))
    project = project_config_path(cwd)
    if project is not None:
        files.append((project, _load(project)))
    profile = getattr(ns, "profile", None) or environ.get("SLURMLAUNCH_PROFILE") or None
    if profile is None:
        for _, data in files:
            profile = data.get("profile", profile)
    if profile is not None:
        shipped = [(path, data) for path in shipped_profile_files()
                   for data in (_load(path),) if profile in data.get("profiles", {})]
        files = [(path, {"profiles": {profile: data["profiles"][profile]}}) for path, data in shipped] + files
    if profile is not None and not files:
        raise SpecError(f"profile {profile!r} not found: no config file ({user} or {PROJECT_FILE} in "
                        f"{cwd} or above)")
    return files, profile


def _option_named(key: str, raw: Any, by_name: Mapping[str, Option], table: Mapping[str, Option],
                  where: str) -> Option:
    """The option a file's key names; SpecError for an unknown key and for one that changes what SCRIPT is."""
    opt = by_name.get(key)
    if opt is not None:
        return opt
    refused = CHANGES_WHAT_RUNS.get(key.replace("-", "_"))
    if refused is not None:
        as_toml = str(raw).lower() if isinstance(raw, bool) else shown_value(raw)
        raise SpecError(f"{where}: {key} = {as_toml} is not taken from config files (it changes what "
                        f"SCRIPT is for every submission; give {refused} on the command line)")
    raise SpecError(f"{where}: unknown option {key!r} (valid: "
                    f"{', '.join(sorted(o.flag.lstrip('-') for o in table.values()))})")


def _add_command_line(ns: argparse.Namespace, table: Mapping[str, Option], values: dict[str, Any],
                      origins: dict[str, str]) -> None:
    """The options given on the command line win; lists and env are added to the files' entries."""
    for dest, opt in table.items():
        given = getattr(ns, dest, None)
        if given is None or (opt.kind in ("list", "env") and not given):
            continue
        if opt.kind in ("list", "env"):
            values[dest] = values[dest] + list(given)
            origins[dest] = COMMAND_LINE if origins[dest] == BUILTIN else origins[dest] + " + " + COMMAND_LINE
        else:
            values[dest], origins[dest] = given, COMMAND_LINE


def apply(ns: argparse.Namespace, resolved: Resolved) -> argparse.Namespace:
    """``ns`` with every profile-able option set to its merged value."""
    merged = argparse.Namespace(**vars(ns))
    for dest, value in resolved.values.items():
        setattr(merged, dest, value)
    return merged


def show(resolved: Resolved, table: Mapping[str, Option], as_json: bool) -> str:
    import json

    if as_json:
        return json.dumps({
            "files": [str(p) for p in resolved.files], "profile": resolved.profile,
            "options": {table[d].flag.lstrip("-"): {"value": json.loads(_shown(d, v)), "origin": resolved.origins[d]}
                        for d, v in resolved.values.items()},
        }, indent=2) + "\n"
    lines = ["files: " + (", ".join(str(p) for p in resolved.files) or "none"),
             f"profile: {resolved.profile or 'none'}"]
    rows = [(f"  {table[d].flag.lstrip('-')} = {_shown(d, v)}", resolved.origins[d])
            for d, v in resolved.values.items()]
    # The origins line up, except after a value too long to line up with: one long setup line or env table
    # would otherwise pad every line to its width.
    width = max((len(left) for left, _ in rows if len(left) <= SHOW_ALIGN), default=0)
    lines += [left.ljust(width) + f"  <- {origin}" for left, origin in rows]
    return "\n".join(lines) + "\n"


def _shown(dest: str, value: Any) -> str:
    import json

    from ..core.distenv import mask

    if dest == "env":  # values named like secrets (TOKEN, PASSWORD, ...) are not printed
        value = [f"{k}={mask(k, v)}" for k, _, v in (item.partition("=") for item in value)]
    return json.dumps(value)
