"""Which GPUs this process can see, without importing anything heavy (no torch, no NVML, no Level Zero).

NVIDIA: CUDA_VISIBLE_DEVICES, else /dev/nvidiaN. Intel (Level Zero, e.g. ALCF Aurora's PVC): ZE_AFFINITY_MASK,
else the GPUs behind /dev/dri/renderD*, counted as tiles when the Level Zero device hierarchy is FLAT.
"""

from __future__ import annotations

import os
from collections.abc import Mapping


def dev_gpu_ids(root: str = "/") -> list[str]:
    """The N of every /dev/nvidiaN: the GPUs of the machine when CUDA_VISIBLE_DEVICES is unset."""
    try:
        names = os.listdir(os.path.join(root, "dev"))
    except OSError:
        return []
    return sorted((n[6:] for n in names if n.startswith("nvidia") and n[6:].isdigit()), key=int)


def visible_gpus(environ: Mapping[str, str], root: str = "/") -> list[str]:
    """CUDA_VISIBLE_DEVICES as a list (Slurm's "NoDevFiles" and an empty value mean none), else /dev's GPUs."""
    cvd = environ.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None:
        return [] if cvd.strip() in ("", "NoDevFiles") else cvd.split(",")
    return dev_gpu_ids(root)


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def intel_gpu_ids(environ: Mapping[str, str], root: str = "/") -> list[str]:
    """The Level Zero devices this process sees, as ZE_AFFINITY_MASK names them ("0", "0.1").

    Reads ZE_AFFINITY_MASK first (a site or --gpu-bind set it: kept as given, never rewritten; empty means
    none), then ZE_FLAT_DEVICE_HIERARCHY: under FLAT (the driver's default on PVC, and what ALCF's
    frameworks module sets) each tile is a device, so a GPU with tiles gt0, gt1 under
    /sys/class/drm/cardN/gt counts twice; under COMPOSITE each GPU counts once. Only cards that have a
    render node (/dev/dri/renderD*) and are Intel's (vendor 0x8086) count. ``root`` is for tests.
    """
    mask = environ.get("ZE_AFFINITY_MASK")
    if mask is not None:
        return [part for part in mask.split(",") if part.strip()]
    drm = os.path.join(root, "sys/class/drm")
    if not any(n.startswith("renderD") for n in _listdir(os.path.join(root, "dev/dri"))):
        return []
    cards = sorted((n for n in _listdir(drm) if n.startswith("card") and n[4:].isdigit()), key=lambda n: int(n[4:]))
    flat = environ.get("ZE_FLAT_DEVICE_HIERARCHY", "FLAT").upper() == "FLAT"
    ids: list[str] = []
    for card in cards:
        try:
            with open(os.path.join(drm, card, "device/vendor"), encoding="ascii") as f:
                if f.read().strip().lower() != "0x8086":
                    continue
        except OSError:
            continue
        tiles = sum(1 for n in _listdir(os.path.join(drm, card, "gt")) if n.startswith("gt") and n[2:].isdigit())
        gpu = len({i.split(".")[0] for i in ids})
        ids += [f"{gpu}.{t}" for t in range(tiles)] if flat and tiles > 1 else [str(gpu)]
    return ids


def gpu_kind(environ: Mapping[str, str], root: str = "/") -> str | None:
    """"cuda" when NVIDIA GPUs are visible (visible_gpus), else "xpu" when Intel's are (intel_gpu_ids), else
    None: the CPU."""
    if visible_gpus(environ, root):
        return "cuda"
    return "xpu" if intel_gpu_ids(environ, root) else None


def device_count(environ: Mapping[str, str], root: str = "/") -> int:
    """The GPUs a rank chooses among when CUDA_VISIBLE_DEVICES is unset: /dev/nvidiaN, else Intel's."""
    return len(dev_gpu_ids(root)) or len(intel_gpu_ids(environ, root))
