"""A Lightning Fabric user's script, as Fabric's docs write one: Fabric(accelerator=..., devices=D,
num_nodes=N, strategy="ddp"), fabric.launch(), fabric.setup(model, optimizer), fabric.setup_dataloaders(),
fabric.backward(). Fabric picks its cluster environment itself (SLURM, torchelastic or its own) from the
variables the process sees, and checks devices and num_nodes against them; the script prints which one it
picked. Nothing here names slurmlaunch.

    python fabric_loop.py --devices 2 --num-nodes 2 --steps 2
"""

from __future__ import annotations

import argparse
import hashlib

import torch
from lightning.fabric import Fabric
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def digest(module: nn.Module) -> str:
    data = b"".join(p.detach().cpu().contiguous().numpy().tobytes() for p in module.parameters())
    return hashlib.sha256(data).hexdigest()[:16]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--devices", type=int, default=1)
    p.add_argument("--num-nodes", type=int, default=1)
    p.add_argument("--steps", type=int, default=2)
    args = p.parse_args()

    fabric = Fabric(accelerator="cpu", devices=args.devices, num_nodes=args.num_nodes, strategy="ddp")
    fabric.launch()
    fabric.seed_everything(0)
    x = torch.randn(64, 8)
    loader = fabric.setup_dataloaders(DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=4))
    model = nn.Linear(8, 1)
    before = digest(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = fabric.setup(model, optimizer)
    done = 0
    for inputs, targets in loader:
        if done == args.steps:
            break
        optimizer.zero_grad()
        fabric.backward(nn.functional.mse_loss(model(inputs), targets))
        optimizer.step()
        done += 1
    fabric.barrier()
    env = fabric.strategy.cluster_environment
    print(f"CLIENT fabric rank={fabric.global_rank} world={fabric.world_size} local_rank={fabric.local_rank} "
          f"node_rank={fabric.node_rank} env={type(env).__name__} env_world={env.world_size()} "
          f"env_rank={env.global_rank()} steps={done} before={before} params={digest(model.module)}", flush=True)


if __name__ == "__main__":
    main()
