"""An idr-torch user's script, as IDRIS's documentation writes one: `import idr_torch`, then
idr_torch.init_process_group(backend=...), the model in DDP, a DistributedSampler over idr_torch.world_size
shards. idr-torch picks its launcher itself: Slurm's variables when SLURM_STEP_ID is set (rank SLURM_PROCID,
world SLURM_STEP_NUM_TASKS, MASTER_ADDR the step's first node and MASTER_PORT 10000 + job id % 20000, both
set by idr-torch), torchrun's when TORCHELASTIC_RUN_ID is, else a world of one. Nothing here names slurmlaunch.

    python idr_torch_train.py --epochs 2
"""

from __future__ import annotations

import argparse
import hashlib

import idr_torch
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def digest(module: nn.Module) -> str:
    data = b"".join(p.detach().cpu().contiguous().numpy().tobytes() for p in module.parameters())
    return hashlib.sha256(data).hexdigest()[:16]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=2)
    args = p.parse_args()
    idr_torch.init_process_group(backend="gloo")
    torch.manual_seed(0)
    x = torch.randn(64, 8)
    dataset = TensorDataset(x, x.sum(dim=1, keepdim=True))
    sampler = DistributedSampler(dataset, num_replicas=idr_torch.world_size, rank=idr_torch.rank, shuffle=False)
    loader = DataLoader(dataset, batch_size=4, sampler=sampler)
    model = nn.Linear(8, 1)
    before = digest(model)
    ddp = DDP(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for inputs, targets in loader:
            optimizer.zero_grad()
            nn.functional.mse_loss(ddp(inputs), targets).backward()
            optimizer.step()
    print(f"CLIENT idr rank={idr_torch.rank} world={idr_torch.world_size} local_rank={idr_torch.local_rank} "
          f"env={idr_torch.current_API} torch_rank={dist.get_rank()} torch_world={dist.get_world_size()} "
          f"nodes={idr_torch.num_nodes} master={idr_torch.master_addr}:{idr_torch.master_port} "
          f"before={before} params={digest(model)}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
