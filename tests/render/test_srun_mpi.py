"""MPI programs under Slurm: `submit --mpi TYPE` renders `srun --mpi=TYPE`, a value meant for another scheduler
is refused in one line, `srun --mpi=list` is read (the real cluster's runs: tests/real/test_srun_mpi_real.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from slurmlaunch.app.options import SUBMIT_OPTIONS
from slurmlaunch.core.errors import SpecError
from slurmlaunch.core.spec import MPI_FLAVOURS, SRUN_MPI_TYPES, JobSpec
from slurmlaunch.render import pbs_script, slurm_script
from slurmlaunch.schedulers import slurm
from slurmlaunch.schedulers.registry import scheduler
from tests.helpers import golden_spec, run_cli


def refuse_unsupported(spec: JobSpec, name: str) -> None:
    scheduler(name).refuse_unsupported(spec)


# --- the request: what --mpi means under each scheduler -------------------------------------------------------

@pytest.mark.parametrize("mpi", SRUN_MPI_TYPES)
def test_slurm_renders_srun_mpi(mpi: str) -> None:
    spec = golden_spec(mpi=mpi)
    refuse_unsupported(spec, "slurm")
    args = slurm_script.srun_args(spec)
    assert args.count(f"--mpi={mpi}") == 1
    srun = [ln for ln in slurm_script.render_script(spec).splitlines() if ln.startswith("srun ")]
    assert len(srun) == 1 and f" --mpi={mpi} " in srun[0], srun


def test_the_option_offers_exactly_the_requests_values() -> None:
    """options.py stays cheap to import, so it spells the values itself: they must be the request's."""
    opt = next(o for _, group in SUBMIT_OPTIONS for o in group if o.flags[0] == "--mpi")
    assert tuple(opt.choices or ()) == (*MPI_FLAVOURS, *SRUN_MPI_TYPES)


def test_without_mpi_srun_uses_the_clusters_default() -> None:
    assert not [a for a in slurm_script.srun_args(golden_spec()) if a.startswith("--mpi")]
    assert pbs_script.pbs_mpi(golden_spec()) == "openmpi"  # PBS's default is unchanged


@pytest.mark.parametrize("mpi", MPI_FLAVOURS)
def test_slurm_refuses_a_pbs_mpiexec_flavour(mpi: str) -> None:
    with pytest.raises(SpecError) as e:
        refuse_unsupported(golden_spec(mpi=mpi), "slurm")
    assert str(e.value) == (f"--mpi {mpi}: not valid under slurm (expected srun's --mpi plugin type: one of "
                            f"{', '.join(SRUN_MPI_TYPES)})")
    with pytest.raises(SpecError, match=f"--mpi {mpi} is not valid under Slurm"):
        slurm_script.srun_args(golden_spec(mpi=mpi))  # the render layer never writes one either


@pytest.mark.parametrize("mpi", SRUN_MPI_TYPES)
def test_pbs_refuses_an_srun_plugin_type(mpi: str) -> None:
    with pytest.raises(SpecError) as e:
        refuse_unsupported(golden_spec(mpi=mpi), "pbs")
    assert str(e.value) == (f"--mpi {mpi}: not valid under pbs (expected the MPI whose mpiexec starts the ranks: "
                            f"one of {', '.join(MPI_FLAVOURS)})")
    with pytest.raises(SpecError, match=f"--mpi {mpi} is not valid under PBS"):
        pbs_script.script_context(golden_spec(mpi=mpi))


@pytest.mark.parametrize(("scheduler", "mpi", "expect"), [
    ("slurm", "openmpi", "--mpi openmpi: not valid under slurm (expected srun's --mpi plugin type"),
    ("pbs", "pmix", "--mpi pmix: not valid under pbs (expected the MPI whose mpiexec starts the ranks"),
    ("local", "pmix", "--mpi pmix: the local scheduler cannot carry it out"),
])
def test_cli_refuses_in_one_line(scheduler: str, mpi: str, expect: str, tmp_path: Path) -> None:
    (tmp_path / "t.py").write_text("")
    r = run_cli("submit", "--scheduler", scheduler, "--dry-run", "--mpi", mpi, "t.py", cwd=tmp_path, timeout=60)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and expect in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not list(tmp_path.glob("slurmlaunch-logs/*.sbatch"))


def test_cli_dry_run_shows_srun_mpi(tmp_path: Path) -> None:
    (tmp_path / "t.py").write_text("")
    r = run_cli("submit", "--scheduler", "slurm", "--dry-run", "--nodes", "2", "--mpi", "pmix", "t.py",
                cwd=tmp_path, timeout=60)
    assert r.returncode == 0, r.stderr
    srun = [ln for ln in r.stdout.splitlines() if ln.startswith("srun ")]
    assert len(srun) == 1 and " --mpi=pmix " in srun[0], r.stdout


# What Debian's Slurm 22.05 srun prints (captured from the dev cluster), and a site with two pmix versions.
MPI_LIST = ("MPI plugin types are...\n\tpmix\n\tnone\n\tcray_shasta\n\tpmi2\n"
            "specific pmix plugin versions available: pmix_v4\n")


@pytest.mark.parametrize(("listing", "names"), [
    (MPI_LIST, ["pmix", "none", "cray_shasta", "pmi2", "pmix_v4"]),
    ("MPI plugin types are...\n\tnone\n\tpmix\nspecific pmix plugin versions available: pmix_v3,pmix_v4\n",
     ["none", "pmix", "pmix_v3", "pmix_v4"]),
    ("MPI plugin types are...\n\tnone\n\tpmi2\n", ["none", "pmi2"]),
    ("", []),
])
def test_srun_mpi_list_is_read(listing: str, names: list[str]) -> None:
    assert slurm.mpi_plugins(listing) == names
