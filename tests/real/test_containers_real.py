"""Apptainer's command line through tests/fakes/apptainer (the stand-in of tests/render/test_containers.py) on
the real Slurm cluster: two nodes, the binds applied, the ranks' variables as the launcher gives them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import run_cli
from tests.render.test_containers import HOSTILE, RECORD, SYSTEM_PYTHON, check_ranks, fake_apptainer_env


@pytest.mark.slurm
def test_apptainer_on_the_real_cluster_through_the_stand_in(cluster_env: dict[str, str], tmp_path: Path) -> None:
    env = fake_apptainer_env(cluster_env, tmp_path)
    (tmp_path / "record.py").write_text(RECORD)
    r = run_cli("submit", "--apptainer", "/images/torch.sif", "--python", SYSTEM_PYTHON, "--nodes", "2",
                "--tasks-per-node", "2", "--env", f"HOSTILE={HOSTILE}",
                "--container-mount", f"{tmp_path}:/opt/extra:ro",
                "--wait", "--wait-timeout", "90", "record.py", "--x", "y z", env=env, cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    check_ranks(tmp_path, 4)
    recs = [json.loads(p.read_text()) for p in (tmp_path / "out").glob("rank-*.json")]
    assert {r["MASTER_ADDR"] for r in recs} == {"node1"} and {r["cwd"] for r in recs} == {str(tmp_path)}
