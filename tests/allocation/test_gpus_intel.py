"""GPUs under PBS sites. Intel GPUs (Level Zero, e.g. ALCF Aurora's PVC): found through ZE_AFFINITY_MASK or a
/dev + /sys tree laid out as the i915/xe drivers lay it out (render nodes in /dev/dri, one gt directory per
tile), and chosen per rank by the same rule as NVIDIA's; Polaris's reversed NVIDIA order. The trees are built
in tmp_path; the launcher runs as a real process."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from slurmlaunch.allocation.gpus import device_count, gpu_kind, intel_gpu_ids
from slurmlaunch.core.detect import Context, local_device
from slurmlaunch.core.errors import SlurmLaunchError
from tests.helpers import run_cli


def machine(root: Path, cards: list[tuple[str, int]], nvidia: int = 0) -> Path:
    """A fake root: /dev/dri/renderD* and /sys/class/drm/cardN/{device/vendor,gt/gtM} per (vendor, tiles)."""
    (root / "dev" / "dri").mkdir(parents=True)
    for n in range(nvidia):
        (root / "dev" / f"nvidia{n}").touch()
    for n, (vendor, tiles) in enumerate(cards):
        (root / "dev" / "dri" / f"renderD{128 + n}").touch()
        card = root / "sys" / "class" / "drm" / f"card{n}"
        (card / "device").mkdir(parents=True)
        (card / "device" / "vendor").write_text(vendor + "\n")
        for t in range(tiles):
            (card / "gt" / f"gt{t}").mkdir(parents=True)
    return root


AURORA_NODE = [("0x8086", 2)] * 6  # 6 PVC, 2 tiles each


def test_tiles_are_devices_under_flat_hierarchy(tmp_path: Path) -> None:
    root = str(machine(tmp_path, AURORA_NODE))
    ids = intel_gpu_ids({}, root)  # FLAT is the driver's default on PVC
    assert ids == [f"{g}.{t}" for g in range(6) for t in range(2)]
    assert intel_gpu_ids({"ZE_FLAT_DEVICE_HIERARCHY": "COMPOSITE"}, root) == [str(g) for g in range(6)]
    assert gpu_kind({}, root) == "xpu" and device_count({}, root) == 12


def test_the_mask_wins_and_other_vendors_do_not_count(tmp_path: Path) -> None:
    root = str(machine(tmp_path, [("0x1002", 1), ("0x8086", 1)]))  # an AMD card, then an Intel one
    assert intel_gpu_ids({}, root) == ["0"]
    assert intel_gpu_ids({"ZE_AFFINITY_MASK": "3.1"}, root) == ["3.1"]
    assert intel_gpu_ids({"ZE_AFFINITY_MASK": ""}, root) == []
    assert intel_gpu_ids({}, str(tmp_path / "nothing")) == []


def test_nvidia_comes_first(tmp_path: Path) -> None:
    root = str(machine(tmp_path, AURORA_NODE, nvidia=4))
    assert gpu_kind({}, root) == "cuda" and device_count({}, root) == 4
    assert gpu_kind({"CUDA_VISIBLE_DEVICES": ""}, root) == "xpu"


@pytest.mark.parametrize(("env", "local_rank", "expected"), [
    ({"ZE_AFFINITY_MASK": ",".join(f"{g}.{t}" for g in range(6) for t in range(2))}, 7, 7),  # all 12 tiles seen
    ({"ZE_AFFINITY_MASK": "3.1"}, 7, 0),  # gpu_tile_compact.sh / --gpu-bind gave this rank its own tile
    ({"ZE_AFFINITY_MASK": "3.1", "SLURMLAUNCH_DEVICE": "cpu"}, 7, None),
])
def test_the_rank_chooses_its_device_as_for_nvidia(env: dict[str, str], local_rank: int,
                                                   expected: int | None) -> None:
    ctx = Context(hostname="x", read_file=lambda p: "",
                  gpu_device_count=lambda: len(intel_gpu_ids(env, "/nonexistent")))
    assert local_device(env, local_rank, 12, ctx, "x") == expected


def test_too_few_devices_without_a_mask_is_refused(tmp_path: Path) -> None:
    root = str(machine(tmp_path, [("0x8086", 2)]))
    ctx = Context(hostname="x", read_file=lambda p: "", gpu_device_count=lambda: device_count({}, root))
    with pytest.raises(SlurmLaunchError, match="12 ranks on x but only 2 GPU"):
        local_device({}, 3, 12, ctx, "x")


@pytest.mark.skipif(any(n.startswith("nvidia") for n in os.listdir("/dev")), reason="this machine has NVIDIA GPUs")
def test_launcher_exports_the_tile_of_a_pals_rank(tmp_path: Path) -> None:
    """A real `slurmlaunch env` process as Cray PALS starts it on an Aurora node: rank 14 of 24, local rank 2."""
    (tmp_path / "nodes").write_text("x4000c0s0b0n0\nx4000c0s1b0n0\n")
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PBS_JOBID": "4242.aurora-pbs",
           "PBS_NODEFILE": str(tmp_path / "nodes"), "SLURMLAUNCH_HOSTNAME": "x4000c0s1b0n0",
           "PALS_RANKID": "14", "PMI_SIZE": "24", "PALS_LOCAL_RANKID": "2", "PMI_LOCAL_SIZE": "12",
           "PALS_NODEID": "1", "ZE_FLAT_DEVICE_HIERARCHY": "FLAT",
           "ZE_AFFINITY_MASK": ",".join(f"{g}.{t}" for g in range(6) for t in range(2))}
    r = run_cli("env", "--json", env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["RANK"] == "14" and out["LOCAL_RANK"] == "2" and out["SLURMLAUNCH_LOCAL_DEVICE"] == "2"
    r = run_cli("env", "--json", env={**env, "ZE_AFFINITY_MASK": "1.0"}, cwd=tmp_path)  # bound by the site
    assert r.returncode == 0 and json.loads(r.stdout)["SLURMLAUNCH_LOCAL_DEVICE"] == "0", r.stderr


def test_init_process_group_takes_xpu_and_xccl(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's own xpu module, told a device is there; the process group call itself is captured."""
    torch = pytest.importorskip("torch")
    import torch.distributed as dist

    from slurmlaunch.allocation import torch_helpers

    chosen: list[int] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.xpu, "is_available", lambda: True)
    monkeypatch.setattr(torch.xpu, "set_device", chosen.append)
    calls: list[tuple[object, ...]] = []
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kw: calls.append((backend, kw)))
    for k, v in {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29512",
                 "SLURMLAUNCH_LOCAL_DEVICE": "5", "TORCHELASTIC_USE_AGENT_STORE": "True"}.items():
        monkeypatch.setenv(k, v)
    device = torch_helpers.init_process_group()
    assert str(device) == "xpu:5" and chosen == [5] and calls[0][0] == "xccl"


@pytest.mark.parametrize(("order", "expected"), [("", [0, 1, 2, 3]), ("in-order", [0, 1, 2, 3]),
                                                 ("reversed", [3, 2, 1, 0])])
def test_polaris_order_of_nvidia_gpus(order: str, expected: list[int]) -> None:
    """ALCF binds Polaris's 4 ranks per node to GPUs 3, 2, 1, 0 (set_affinity_gpu_polaris.sh)."""
    env = {"CUDA_VISIBLE_DEVICES": "0,1,2,3", "SLURMLAUNCH_GPU_ORDER": order}
    ctx = Context(hostname="x", read_file=lambda p: "", gpu_device_count=lambda: 0)
    assert [local_device(env, r, 4, ctx, "x") for r in range(4)] == expected
    with pytest.raises(SlurmLaunchError, match="SLURMLAUNCH_GPU_ORDER='backwards'"):
        local_device({**env, "SLURMLAUNCH_GPU_ORDER": "backwards"}, 0, 4, ctx, "x")
