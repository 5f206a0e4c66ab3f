"""slurmlaunch.init_process_group: device/backend choice, a bounded rendezvous that names missing ranks."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurmlaunch.allocation.torch_helpers import _compress, _select_device
from slurmlaunch.core.errors import SlurmLaunchError
from tests import ports
from tests.helpers import clean_env, run_cli

SCRIPT = """
import os, sys, torch, torch.distributed as dist, slurmlaunch
device = slurmlaunch.init_process_group(rendezvous_timeout=float(sys.argv[1]))
t = torch.ones(1, device=device)
dist.all_reduce(t)
print(f"rank={dist.get_rank()} backend={dist.get_backend()} device={device} sum={int(t.item())}", flush=True)
dist.destroy_process_group()
"""


def test_compress() -> None:
    assert _compress([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8" and _compress([3]) == "3" and _compress([]) == ""


def test_a_bad_device_index_is_one_line(torch_available: None) -> None:
    with pytest.raises(SlurmLaunchError, match=re.escape("SLURMLAUNCH_LOCAL_DEVICE='gpu0' is not valid")):
        _select_device({"SLURMLAUNCH_LOCAL_DEVICE": "gpu0", "LOCAL_RANK": "0"})


def test_helper_world_of_three(torch_available: None, tmp_path: Path) -> None:
    script = tmp_path / "h.py"
    script.write_text(SCRIPT)
    r = run_cli("run", "--standalone", "--nproc-per-node", "3", str(script), "60", env=clean_env(), timeout=180)
    assert r.returncode == 0, r.stderr
    assert sorted(re.findall(r"rank=(\d) backend=gloo device=cpu sum=3", r.stdout)) == ["0", "1", "2"]


def lone_rank(tmp_path: Path, rank: int, timeout: int) -> tuple[subprocess.CompletedProcess[str], int, float]:
    """One rank of a world of 4 whose others never come, on a port nobody listens on."""
    script = tmp_path / "h.py"
    script.write_text(SCRIPT)
    port = ports.port()
    env = clean_env(RANK=str(rank), LOCAL_RANK="0", WORLD_SIZE="4", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    start = time.monotonic()
    r = subprocess.run([sys.executable, str(script), str(timeout)], env=env, capture_output=True, text=True,
                       timeout=120)
    return r, port, time.monotonic() - start


def test_helper_names_the_missing_ranks(torch_available: None, tmp_path: Path) -> None:
    r, _, took = lone_rank(tmp_path, 0, 3)
    assert r.returncode != 0 and took < 60
    assert "1 of 4 ranks arrived; missing rank(s) 1-3" in r.stderr


def test_helper_non_zero_rank_names_the_master(torch_available: None, tmp_path: Path) -> None:
    r, port, took = lone_rank(tmp_path, 2, 2)
    assert r.returncode != 0 and took < 60
    assert f"nothing listened at MASTER_ADDR:MASTER_PORT=127.0.0.1:{port}" in r.stderr
