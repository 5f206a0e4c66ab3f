"""One rank of tests/gpu/check.sh. Modes (argv[1]):
  world   join the world (nccl on a GPU through slurmlaunch.init_process_group, gloo on the CPU),
          all_reduce, and check that the tensor lives on the device SLURMLAUNCH_LOCAL_DEVICE names
  device  no world: use the device SLURMLAUNCH_LOCAL_DEVICE names and check torch really does
  env     print what the launcher exported (no CUDA at all: the CPU-only mode's check of the GPU rule)
Every mode first leaves a file named by RANK in $PROBE_STARTED (a refused launch must leave none) and
prints one line starting with PROBE."""

from __future__ import annotations

import os
import sys

mode = sys.argv[1]
started = os.environ.get("PROBE_STARTED")
if started:
    os.makedirs(started, exist_ok=True)
    open(os.path.join(started, os.environ.get("RANK", "x")), "w").close()
rank, local_rank = os.environ["RANK"], os.environ["LOCAL_RANK"]
want = os.environ.get("SLURMLAUNCH_LOCAL_DEVICE")
place = (f"rank={rank} local_rank={local_rank} local_device={want} "
         f"cvd={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')} omp={os.environ.get('OMP_NUM_THREADS')}")
if mode == "env":
    print(f"PROBE {place}", flush=True)
    sys.exit(0)

import torch  # noqa: E402

if mode == "device":
    assert want is not None, "no SLURMLAUNCH_LOCAL_DEVICE: the launcher chose the CPU"
    torch.cuda.set_device(int(want))
    t = torch.ones(4, device="cuda")
    used = t.device.index
    props = torch.cuda.get_device_properties(used)
    ok = used == int(want) == torch.cuda.current_device()
    print(f"PROBE {place} used=cuda:{used} of {torch.cuda.device_count()} visible name={props.name!r} "
          f"uuid={getattr(props, 'uuid', '?')} ok={ok}", flush=True)
    sys.exit(0 if ok else 1)

import torch.distributed as dist  # noqa: E402

import slurmlaunch  # noqa: E402

device = slurmlaunch.init_process_group(rendezvous_timeout=60)
backend = dist.get_backend()
t = torch.full((1,), float(int(rank) + 1), device=device)
dist.all_reduce(t)
world = dist.get_world_size()
ok = t.item() == world * (world + 1) / 2
if want is not None:
    ok = ok and backend == "nccl" and t.device == torch.device("cuda", int(want)) == device
else:
    ok = ok and backend == "gloo" and t.device.type == "cpu"
print(f"PROBE {place} backend={backend} world={world} tensor_device={t.device} sum={t.item():g} ok={ok}", flush=True)
dist.destroy_process_group()
sys.exit(0 if ok else 1)
