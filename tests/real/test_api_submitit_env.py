"""submitit's own helpers in API jobs on the real clusters (the local scheduler: tests/app/api/
test_api_submitit_env.py): submitit.JobEnvironment and TorchDistributedEnvironment, as a user coming from
submitit calls them, read the world slurmlaunch gives each rank (under PBS through our plugin's
JobEnvironment, whose host list is $PBS_NODEFILE's); export(overwrite=True) then trains on it. The driver's
functions travel by value, as a user's script's do."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

VIEW = (Path(__file__).resolve().parents[1] / "app" / "api" / "submitit_view.py").read_text()
BODY = """
import json, sys
import slurmlaunch
options = json.loads(sys.argv[1])
print("VIEW " + json.dumps(slurmlaunch.submit(submitit_view, "overwrite", **options).results()))
"""


def drive(options: dict[str, object], env: dict[str, str], tmp_path: Path) -> list[dict[str, object]]:
    driver = tmp_path / "driver.py"
    driver.write_text(VIEW + BODY)
    r = subprocess.run([sys.executable, str(driver), json.dumps(options)], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return list(json.loads(r.stdout.split("VIEW ", 1)[1]))


def check(looked: list[dict[str, object]]) -> None:
    """Each rank's view before the export (submitit's beside ours), and the all-reduce after it."""
    assert [v["ours"][:5] for v in looked] == [["0", "0", "4", "2", "0"], ["1", "1", "4", "2", "0"],  # type: ignore[index]
                                               ["2", "0", "4", "2", "1"], ["3", "1", "4", "2", "1"]], looked
    for v in looked:
        assert v["theirs"] == v["ours"] and v["num_nodes"] == 2, v
    hosts = [v["host"] for v in looked]
    assert hosts[0] == hosts[1] != hosts[2] == hosts[3], hosts
    # MASTER_ADDR: ours may be the address, submitit's is the first host's name; both are rank 0's host
    assert all(v["master"][1] == hosts[0] for v in looked), looked  # type: ignore[index]
    assert [v["sum"] for v in looked] == [4] * 4, looked


@pytest.mark.slurm
def test_submitits_helpers_under_slurm(cluster_env: dict[str, str], tmp_path: Path, torch_available: None) -> None:
    options = {"scheduler": "slurm", "nodes": 2, "tasks_per_node": 2, "time": "5",
               "output_dir": str(tmp_path / "logs")}
    check(drive(options, cluster_env, tmp_path))


@pytest.mark.pbs
def test_submitits_helpers_under_pbs(pbs_env: dict[str, str], tmp_path: Path, torch_available: None) -> None:
    options = {"scheduler": "pbs", "nodes": 2, "tasks_per_node": 2, "time": "00:10:00",
               "output_dir": str(tmp_path / "logs"),
               "env": {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}}
    check(drive(options, pbs_env, tmp_path))
