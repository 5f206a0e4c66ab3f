"""The closed choices of a job request (core/spec.py): each Literal type's values are exactly what validate
accepts, and anything else is refused in one line naming the option and the value."""

from __future__ import annotations

from typing import Any

import pytest

from slurmlaunch.core import spec as spec_module
from slurmlaunch.core.errors import SpecError
from slurmlaunch.core.spec import JobSpec, validate

CHOICES = [("mode", "--mode", spec_module.MODES, ("srun", "torchrun")),
           ("gpu_flag", "--gpu-flag", spec_module.GPU_FLAGS, ("gpus-per-node", "gres")),
           ("mpi", "--mpi", (*spec_module.MPI_FLAVOURS, *spec_module.SRUN_MPI_TYPES),
            ("openmpi", "mpich", "pals", "pmix", "pmix_v2", "pmix_v3", "pmix_v4", "pmix_v5", "pmi2", "cray_shasta",
             "none")),
           ("pbs_flavour", "--pbs-flavour", spec_module.PBS_FLAVOURS, ("pro", "torque"))]


def request(**changes: Any) -> JobSpec:
    return JobSpec.of(script="t.py", workdir="/nonexistent/w", **changes)  # pure: validate looks at no file


@pytest.mark.parametrize(("field", "option", "values", "documented"), CHOICES)
def test_each_value_of_the_type_is_accepted(field: str, option: str, values: tuple[str, ...],
                                            documented: tuple[str, ...]) -> None:
    assert values == documented  # the README's and --help's lists
    for value in values:
        assert validate(request(**{field: value})).value(field) == value


@pytest.mark.parametrize(("field", "option", "values", "documented"), CHOICES)
@pytest.mark.parametrize("bad", ["", "SRUN", "gres ", "bogus"])
def test_other_values_are_refused(field: str, option: str, values: tuple[str, ...],
                                  documented: tuple[str, ...], bad: str) -> None:
    with pytest.raises(SpecError) as e:
        validate(request(**{field: bad}))
    assert str(e.value).startswith(f"{option} {bad!r} is not valid (expected "), str(e.value)
