"""JobSpec in typed parts (core/spec.py): each field lives in one part, its name is the one the API and the
record use, and the flat views (JobSpec.of, changed, value, values) go through the parts, not around them."""

from __future__ import annotations

from dataclasses import fields

import pytest

from slurmlaunch.core.spec import FIELDS, PART_OF, PARTS, JobSpec, Resources, field_of, flag_of


def test_each_field_is_in_one_part() -> None:
    names = [f.name for part in PARTS.values() for f in fields(part)]
    assert len(names) == len(set(names)) == len(PART_OF) == len(FIELDS) == 51  # 51: stage_env (issue 42)
    assert [f.name for f in fields(JobSpec)] == list(PARTS)
    assert {f.name: f.type for f in fields(JobSpec)} == {name: part.__name__ for name, part in PARTS.items()}


def test_of_puts_each_value_in_its_part() -> None:
    spec = JobSpec.of(script="t.py", nodes=2, mode="torchrun", signal="USR1@30", sbatch_args=("--x",),
                      env=(("A", "1"),))
    assert (spec.program.script, spec.resources.nodes, spec.launch.mode) == ("t.py", 2, "torchrun")
    assert (spec.preemption.signal, spec.site.sbatch_args, spec.environment.env) == ("USR1@30", ("--x",), (("A", "1"),))
    assert spec.resources == Resources(nodes=2)  # the other parts' fields left its defaults alone
    assert spec.values() == {**JobSpec.of(script="t.py").values(), "nodes": 2, "mode": "torchrun",
                             "signal": "USR1@30", "sbatch_args": ("--x",), "env": (("A", "1"),)}
    assert JobSpec.of(**spec.values()) == spec  # what a record or the probe job keeps comes back whole


def test_changed_changes_only_the_named_fields() -> None:
    spec = JobSpec.of(script="t.py", nodes=2, qos="high")
    moved = spec.changed(python="/py", qos="low")
    assert (moved.program.python, moved.resources.qos, moved.resources.nodes) == ("/py", "low", 2)
    assert (spec.program.python, spec.resources.qos) == ("python3", "high")  # frozen: a new request
    assert moved.launch is spec.launch and moved.site is spec.site  # untouched parts are shared
    assert moved.value("qos") == "low"


@pytest.mark.parametrize("call", [lambda: JobSpec.of(script="t.py", nodez=2),
                                  lambda: JobSpec.of(script="t.py").changed(bogus=1)])
def test_an_unknown_field_is_refused_by_name(call: object) -> None:
    with pytest.raises(TypeError, match="JobSpec has no field"):
        call()  # type: ignore[operator]


def test_flags_and_fields_name_each_other() -> None:
    assert (flag_of("sbatch_args"), flag_of("gpus_per_node"), flag_of("requeued_by")) == \
        ("--sbatch-arg", "--gpus-per-node", "requeued_by")
    assert field_of("--sbatch-arg") == "sbatch_args" and field_of("--nodes") == "nodes"
    assert field_of("--no-such-option") is None
