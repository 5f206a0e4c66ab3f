"""A DeepSpeed user's script, as DeepSpeed's getting-started writes one: deepspeed.init_distributed(),
deepspeed.initialize(model=..., optimizer=..., config=...), model_engine.backward() and .step(), the data
sharded by rank. DeepSpeed takes RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT from the
environment (it asks MPI through mpi4py only when one of them is missing) and picks its accelerator and
backend itself (no GPU: the CPU accelerator and gloo). Nothing here names slurmlaunch. Too heavy for CI
(docs: Works with); tests/real/test_heavy_clients.py runs it when asked.

    python deepspeed_train.py --steps 2
"""

from __future__ import annotations

import argparse
import hashlib

import deepspeed
import deepspeed.comm as dist
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def digest(module: nn.Module) -> str:
    data = b"".join(p.detach().float().cpu().contiguous().numpy().tobytes() for p in module.parameters())
    return hashlib.sha256(data).hexdigest()[:16]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--local_rank", type=int, default=-1)  # what the deepspeed launcher passes; torchrun does not
    args = p.parse_args()
    deepspeed.init_distributed()
    torch.manual_seed(0)
    x = torch.randn(64, 8)
    dataset = TensorDataset(x, x.sum(dim=1, keepdim=True))
    sampler = DistributedSampler(dataset, num_replicas=dist.get_world_size(), rank=dist.get_rank(), shuffle=False)
    loader = DataLoader(dataset, batch_size=4, sampler=sampler)
    model = nn.Linear(8, 1)
    before = digest(model)
    config = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1}
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                           config=config)
    done = 0
    for inputs, targets in loader:
        if done == args.steps:
            break
        loss = nn.functional.mse_loss(engine(inputs), targets)
        engine.backward(loss)
        engine.step()
        done += 1
    print(f"CLIENT deepspeed rank={dist.get_rank()} world={dist.get_world_size()} "
          f"local_rank={dist.get_local_rank()} backend={torch.distributed.get_backend()} "
          f"accelerator={deepspeed.get_accelerator().device_name()} steps={done} before={before} "
          f"params={digest(engine.module)}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
