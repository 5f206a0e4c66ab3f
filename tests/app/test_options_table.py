"""The options table (app/options.py) is where a job option is declared: every JobSpec field a user sets comes
from one record of it, through spec_values, with no copy by hand."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from slurmlaunch.app.options import SUBMIT_OPTIONS, add_submit_options, spec_options, spec_value, spec_values
from slurmlaunch.core.spec import FIELDS, GPU_FLAGS, MODES, MPI_FLAVOURS, PART_OF, PBS_FLAVOURS, SRUN_MPI_TYPES, JobSpec

# The fields no option fills: SCRIPT and its ARGS, what app.resolve fills in (the interpreter, the directory),
# what submit decides (requeued_by: adapt_to_client), and --nodes' two (nodes, min_nodes: spec_values).
NOT_AN_OPTION = {"script", "args", "python", "workdir", "requeued_by", "nodes", "min_nodes"}
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
    "--max-parallel": "1",
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


def test_every_option_reaches_its_field() -> None:
    argv = [*(f"{flag}={value}" for flag, value in GIVEN.items()), *FLAGS, "--nodes", "2:3", "t.py"]
    ns = parser().parse_args(argv)
    spec = JobSpec.of(script="t.py", **spec_values(ns))
    default = JobSpec.of(script="t.py")
    unchanged = [o.flag for o in spec_options() if spec.value(o.field) == default.value(o.field)]  # type: ignore[arg-type]
    assert unchanged == [] and (spec.resources.nodes, spec.resources.min_nodes) == (3, 2)
    assert spec.site.sbatch_args == ("--x=1",) and spec.environment.env == (("A", "1"),)
    assert spec.arrays.sweep == (("lr", ("1", "2")),)


def test_the_tables_defaults_are_the_requests() -> None:
    """The defaults argparse shows (and profiles start from) are JobSpec's, and so are the closed choices."""
    defaults = {name: f.default for name, f in FIELDS.items()}
    for option in spec_options():
        given = False if option.action == "store_true" else option.default
        assert spec_value(option, list(given) if option.action == "append" else given) == defaults[option.field], \
            option.flag  # type: ignore[index]
    assert spec_values(parser().parse_args(["t.py"]))["nodes"] == JobSpec.of(script="t.py").resources.nodes
    choices = {o.flag: o.choices for _, group in SUBMIT_OPTIONS for o in group}
    assert (choices["--mode"], choices["--gpu-flag"], choices["--pbs-flavour"]) == (MODES, GPU_FLAGS, PBS_FLAVOURS)
    assert choices["--mpi"] == (*MPI_FLAVOURS, *SRUN_MPI_TYPES)


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
