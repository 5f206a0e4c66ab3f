"""The options table (app/options.py) is where a job option's CLI side is declared, and the JobSpec field
(core/spec.py) is where its type, default and choices are: every JobSpec field a user sets comes from one record
of the table, through spec_values, with no copy by hand, and the parser takes the field's default and choices."""

from __future__ import annotations

import argparse
import typing
from pathlib import Path

import pytest

from slurmlaunch.app.options import SUBMIT_OPTIONS, add_submit_options, spec_options, spec_value, spec_values
from slurmlaunch.core.spec import FIELDS, PART_OF, PARTS, JobSpec, field_of, flag_of

# The fields no option fills: SCRIPT and its ARGS, what app.resolve fills in (the interpreter, the directory),
# what submit decides (requeued_by: adapt_to_client), and --nodes' second (min_nodes: spec_values).
NOT_AN_OPTION = {"script", "args", "python", "workdir", "requeued_by", "min_nodes"}
# A value other than the default for each option that fills a field, as a user writes it.
GIVEN = {
    "--gpus-per-node": "2", "--tasks-per-node": "2", "--cpus-per-task": "3", "--cpus-per-gpu": "3", "--mem": "4G",
    "--time": "10", "--partition": "p", "--account": "a", "--qos": "q", "--constraint": "c", "--gpu-flag": "gres",
    "--job-name": "j", "--output-dir": "out", "--env": "A=1", "--setup": "true", "--sbatch-arg": "--x=1",
    "--master-port": "1234", "--signal": "USR1@60", "--max-requeues": "5", "--rdzv-timeout": "60",
    "--pbs-flavour": "torque", "--mpi": "pmix", "--pbs-resource": "wd", "--pbs-chunk": "a=b", "--project": "p",
    "--pbs-request": "nodes", "--mpiexec-arg": "--x", "--pbs-queues": "q:1-2", "--mode": "torchrun",
    "--nproc-per-node": "2", "--max-restarts": "1", "--container-image": "img", "--apptainer": "img.sif",
    "--container-mount": "/a:/b", "--container-workdir": "/w", "--array": "0-1", "--sweep": "lr=1,2",
    "--max-parallel": "1", "--stage-env": "fallback",
}
FLAGS = ("--exclusive", "--requeue", "--module", "--no-python", "--legacy-local-rank-arg")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    add_submit_options(p)
    return p


def test_every_field_a_user_sets_is_one_options() -> None:
    filled = [o.field for o in spec_options()]
    assert len(filled) == len(set(filled))
    assert set(filled) == set(PART_OF) - NOT_AN_OPTION
    flags = {o.flag for _, group in SUBMIT_OPTIONS for o in group}
    for name in set(PART_OF) - NOT_AN_OPTION:  # the field's flag (core.spec's) is the record's, and back
        assert flag_of(name) in flags and field_of(flag_of(name)) == name, name


def test_every_option_reaches_its_field() -> None:
    argv = [*(f"{flag}={value}" for flag, value in GIVEN.items()), *FLAGS, "--nodes", "2:3", "t.py"]
    ns = parser().parse_args(argv)
    spec = JobSpec.of(script="t.py", **spec_values(ns))
    default = JobSpec.of(script="t.py")
    unchanged = [o.flag for o in spec_options() if spec.value(o.field) == default.value(o.field)]  # type: ignore[arg-type]
    assert unchanged == [] and (spec.resources.nodes, spec.resources.min_nodes) == (3, 2)
    assert spec.site.sbatch_args == ("--x=1",) and spec.environment.env == (("A", "1"),)
    assert spec.arrays.sweep == (("lr", ("1", "2")),)


def test_a_fields_default_and_choices_are_declared_once() -> None:
    """Only the field declares them: no record of a field writes its own default or choices, the parser's
    defaults (what profiles start from) and choices are the fields', and a field of a closed type declares its
    Literal's values as its choices."""
    actions = {a.dest: a for a in parser()._actions}
    for option in spec_options():
        assert "default" not in option.settings and "choices" not in option.settings, option.flag
        declared = FIELDS[option.field]  # type: ignore[index]
        action = actions[option.dest]
        given = [] if action.default is None and option.action == "append" else action.default
        assert spec_value(option, given) == declared.default, option.flag
        assert (tuple(action.choices) if action.choices else None) == declared.metadata.get("choices"), option.flag
    assert spec_values(parser().parse_args(["t.py"]))["nodes"] == JobSpec.of(script="t.py").resources.nodes
    checked = []
    for part in PARTS.values():
        for name, hint in typing.get_type_hints(part).items():
            union = typing.get_args(hint) if typing.get_origin(hint) is not typing.Literal else (hint,)
            closed = [a for a in union if typing.get_origin(a) is typing.Literal]
            if closed:
                values = tuple(v for a in closed for v in typing.get_args(a))
                assert FIELDS[name].metadata.get("choices") == values, name
                checked.append(name)
    assert sorted(checked) == ["gpu_flag", "mode", "mpi", "pbs_flavour", "pbs_request"]


def test_the_help_names_the_declared_default() -> None:
    """--help's prose names some defaults ("(default 3)"); argparse's %(default)s cannot say them, as the
    profiles' parser holds None there (profiles.defer_defaults): the prose is held to the field."""
    named = []
    for option in spec_options():
        default, text = FIELDS[option.field].default, option.settings.get("help", "")  # type: ignore[index]
        if "default" in text and not (default is None or default is False or default == ()):
            assert str(default) in text, (option.flag, default, text)
            named.append(option.flag)
    assert len(named) == 9, named  # the nine defaults the help names


def test_a_profiles_keys_are_the_apis_fields(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A profile's keys are the CLI's names (sbatch-arg); the API takes them as JobSpec's fields (sbatch_args),
    converted as submit converts them: the same records."""
    from slurmlaunch.app.api.job_options import profile_options

    (tmp_path / "slurmlaunch.toml").write_text(
        '[profiles.site]\nsbatch-arg = ["--mail-type=END"]\npbs-resource = ["wd"]\nmpiexec-arg = ["--x"]\n'
        'env = ["A=1"]\nsignal = "USR1@30"\n')
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    assert profile_options("site") == {"sbatch_args": ("--mail-type=END",), "pbs_resources": ("wd",),
                                       "mpiexec_args": ("--x",), "env": (("A", "1"),), "signal": "USR1@30"}
