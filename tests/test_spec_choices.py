"""The closed choices of a job request (core/spec.py): each Literal type's values are exactly what validate
accepts, and anything else is refused in one line naming the option and the value."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from slurmlaunch.core import spec as spec_module
from slurmlaunch.core.errors import SpecError
from slurmlaunch.core.spec import JobSpec, validate

CHOICES = [("mode", "--mode", spec_module.MODES, ("srun", "torchrun")),
           ("gpu_flag", "--gpu-flag", spec_module.GPU_FLAGS, ("gpus-per-node", "gres")),
           ("mpi", "--mpi", spec_module.MPI_FLAVOURS, ("openmpi", "mpich", "pals")),
           ("pbs_flavour", "--pbs-flavour", spec_module.PBS_FLAVOURS, ("pro", "torque"))]


def request(tmp_path: Path, **changes: Any) -> JobSpec:
    (tmp_path / "t.py").write_text("pass\n")
    return JobSpec(script="t.py", workdir=str(tmp_path), output_dir=str(tmp_path / "logs"), **changes)


@pytest.mark.parametrize(("field", "option", "values", "documented"), CHOICES)
def test_each_value_of_the_type_is_accepted(tmp_path: Path, field: str, option: str, values: tuple[str, ...],
                                            documented: tuple[str, ...]) -> None:
    assert values == documented  # the README's and --help's lists
    for value in values:
        assert getattr(validate(request(tmp_path, **{field: value})), field) == value


@pytest.mark.parametrize(("field", "option", "values", "documented"), CHOICES)
@pytest.mark.parametrize("bad", ["", "SRUN", "gres ", "bogus"])
def test_other_values_are_refused(tmp_path: Path, field: str, option: str, values: tuple[str, ...],
                                  documented: tuple[str, ...], bad: str) -> None:
    with pytest.raises(SpecError) as e:
        validate(request(tmp_path, **{field: bad}))
    assert str(e.value).startswith(f"{option} {bad!r} is not valid (expected "), str(e.value)
