"""The suite's own fixtures where they can be checked without a cluster: a session-wide cluster's client
environment is made per test (conftest.cluster_env / netns_cluster_env through helpers.per_test_env)."""

from __future__ import annotations

from pathlib import Path

from tests.helpers import per_test_env


def test_each_test_gets_its_own_per_user_state(tmp_path: Path) -> None:
    cluster = {"SLURM_CONF": "/c/slurm.conf", "PATH": "/c/bin", "XDG_STATE_HOME": "/session/state"}
    first, second = per_test_env(cluster, tmp_path / "a"), per_test_env(cluster, tmp_path / "b")
    assert first["XDG_STATE_HOME"] == str(tmp_path / "a" / "state") and Path(first["XDG_STATE_HOME"]).is_dir()
    assert first["XDG_STATE_HOME"] != second["XDG_STATE_HOME"]
    assert {k: v for k, v in first.items() if k != "XDG_STATE_HOME"} == {"SLURM_CONF": "/c/slurm.conf",
                                                                          "PATH": "/c/bin"}
    assert cluster["XDG_STATE_HOME"] == "/session/state"  # the session's environment is left as it was
