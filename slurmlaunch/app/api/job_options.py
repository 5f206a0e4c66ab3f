"""Which keyword arguments are job options, a profile's options as keyword arguments, and the JobSpec
they make."""

from __future__ import annotations

import os
from typing import Any

from ...core.errors import SpecError
from ...core.spec import ENV_KEY, PART_OF, JobSpec

# `slurmlaunch submit` features the submitit-based API does not carry out: refused, never silently dropped.
CLI_ONLY = frozenset({"array", "max_parallel", "sweep", "mode", "nproc_per_node", "max_restarts", "min_nodes",
                      "container_image", "apptainer", "container_mounts", "container_workdir", "template_dir"})
OPTION_NAMES = frozenset(PART_OF) - {"script", "args", "module", "no_python", "python",
                                                             "workdir", "legacy_local_rank_arg"} - CLI_ONLY


# A profile's keys that say where the job goes from a laptop (docs: From your laptop), as the API's
# keyword arguments: python is then the remote interpreter, as `submit --remote --python` has it.
_REMOTE_KEYS = {"remote": "remote", "remote_setup": "remote_setup", "python": "remote_python"}


def _profile_values(name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The submit options' table, and the values profile ``name`` (with the files' [defaults]) sets."""
    import argparse

    from .. import profiles
    from ..options import add_submit_options

    parser = argparse.ArgumentParser(add_help=False)
    add_submit_options(parser)
    table = profiles.option_table(parser)
    resolved = profiles.resolve(argparse.Namespace(profile=name), table, os.environ, os.getcwd())
    return table, {dest: value for dest, value in resolved.values.items()
                   if resolved.origins[dest] != profiles.BUILTIN}


def profile_remote(name: str) -> dict[str, Any]:
    """Where profile ``name`` sends jobs from a laptop: its remote, remote-setup and python keys, as the
    API's remote=, remote_setup= and remote_python= (only those it sets)."""
    _, given = _profile_values(name)
    out = {_REMOTE_KEYS[dest]: value for dest, value in given.items() if dest in _REMOTE_KEYS and value}
    if "remote_setup" in out:
        out["remote_setup"] = tuple(out["remote_setup"])
    return out


def profile_options(name: str) -> dict[str, Any]:
    """The job options profile ``name`` (with the files' [defaults]) sets, as keyword arguments (docs:
    Profiles). Settings the API does not carry out (mode, containers, ...) are refused; the scheduler,
    template and --wait settings are the CLI's and are not taken."""
    from ...core.spec import parse_nodes
    from ..options import spec_options, spec_value

    table, given = _profile_values(name)
    records = {o.dest: o for o in spec_options()}  # a profile's keys are the CLI's dests
    out: dict[str, Any] = {}
    for dest, value in given.items():
        record = records.get(dest)
        field = record.field if record is not None and record.field is not None else dest
        if field in CLI_ONLY and value:
            raise SpecError(f"profile {name!r} sets {table[dest].flag.lstrip('-')}, which only `slurmlaunch "
                            f"submit` carries out (from Python: leave it out of the profile, or use the CLI)")
        if field == "nodes":
            value, low = parse_nodes(value)
            if low is not None:
                raise SpecError(f"profile {name!r}: nodes = {low}:{value} needs `slurmlaunch submit --mode torchrun`")
        elif record is not None:
            value = spec_value(record, value)
        if field in OPTION_NAMES:
            out[field] = value
    return out


def _split_options(options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """JobSpec's field names are job options; everything else goes to the function. ``profile=NAME`` gives
    defaults for the job options; the ones given here win."""
    refused = sorted(set(options) & CLI_ONLY)
    if refused:
        raise SpecError(f"option(s) {', '.join(refused)} are carried out by `slurmlaunch submit`, not by the "
                        f"submitit-based API (for arrays use map_array or batch)")
    if "profile" in options:
        options = {**profile_options(options.pop("profile")), **options}
    job = {k: v for k, v in options.items() if k in OPTION_NAMES}
    rest = {k: v for k, v in options.items() if k not in OPTION_NAMES}
    return job, rest



def _spec(script: str, options: dict[str, Any], module: bool = False) -> JobSpec:
    env = options.pop("env", ())
    if isinstance(env, dict):
        env = tuple(env.items())
    for key, value in env:  # they become `export KEY=VALUE` lines of the batch script: names only
        if not (isinstance(key, str) and ENV_KEY.fullmatch(key) and isinstance(value, str)):
            raise SpecError(f"env {key!r}: {value!r} is not valid (expected a shell variable name and a string "
                            f"value, e.g. env={{'FOO': '1'}})")

    spec = JobSpec.of(script=script, module=module, env=tuple(env), **options)
    return spec

