"""submitit's own helpers inside an API job on the local scheduler (the real clusters: tests/real/test_api_pbs.py,
tests/real/test_api_slurm_faults.py): JobEnvironment and TorchDistributedEnvironment read the world slurmlaunch
gives the rank; export() as submitit's docs write it fails with a line saying why; export(overwrite=True) works."""

from __future__ import annotations

import pytest

import slurmlaunch
from tests.app.api.submitit_view import submitit_view
from tests.helpers import no_slurm_env

pytestmark = pytest.mark.usefixtures("torch_available")


def run(mode: str, tmp_path, monkeypatch: pytest.MonkeyPatch) -> list[dict[str, object]]:
    for k, v in no_slurm_env(tmp_path).items():
        monkeypatch.setenv(k, v)
    job = slurmlaunch.submit(submitit_view, mode, scheduler="local", nodes=2, tasks_per_node=2,
                             output_dir=str(tmp_path / "logs"))
    return job.results()


def test_submitits_view_is_the_world_slurmlaunch_gives(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    values = run("look", tmp_path, monkeypatch)
    for v in values:
        assert v["theirs"] == v["ours"] and v["num_nodes"] == 2, v  # the emulated nodes, not one per task
    assert [v["ours"][:5] for v in values] == [["0", "0", "4", "2", "0"], ["1", "1", "4", "2", "0"],
                                               ["2", "0", "4", "2", "1"], ["3", "1", "4", "2", "1"]]


def test_submitits_export_says_why_it_fails_and_overwrite_trains(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(slurmlaunch.RankFailed) as failed:
        run("export", tmp_path, monkeypatch)
    assert "RuntimeError: Cannot export environment variables as MASTER_ADDR is already set" in str(failed.value)
    last = [x for x in str(failed.value).splitlines() if x][-1]
    assert last.startswith("slurmlaunch: ") and last.endswith(
        "drop the call, or call export(overwrite=True, set_cuda_visible_devices=False)")
    values = run("overwrite", tmp_path, monkeypatch)
    assert [v["sum"] for v in values] == [4] * 4 and all(v["theirs"] == v["ours"] for v in values), values
