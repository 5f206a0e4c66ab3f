"""An accelerate user's script, as accelerate's quick tour writes one: Accelerator() with no arguments,
prepare(), accelerator.backward(). accelerate decides on its own, from the environment, whether it is one of
several processes (WORLD_SIZE, RANK, LOCAL_RANK, MASTER_ADDR, MASTER_PORT); nothing here names slurmlaunch.

    python accelerate_loop.py --steps 2
"""

from __future__ import annotations

import argparse
import hashlib

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def digest(module: nn.Module) -> str:
    data = b"".join(p.detach().cpu().contiguous().numpy().tobytes() for p in module.parameters())
    return hashlib.sha256(data).hexdigest()[:16]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=2)
    args = p.parse_args()

    accelerator = Accelerator()
    set_seed(0)
    x = torch.randn(64, 8)
    loader = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=4, shuffle=True)
    model = nn.Linear(8, 1)
    before = digest(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    model.train()
    done = 0
    for inputs, targets in loader:
        if done == args.steps:
            break
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(inputs), targets)
        accelerator.backward(loss)
        optimizer.step()
        done += 1
    accelerator.wait_for_everyone()
    state = accelerator.state
    view = " | ".join(line.strip() for line in repr(state).splitlines() if line.strip())
    print(f"CLIENT accelerate rank={accelerator.process_index} world={accelerator.num_processes} "
          f"local_rank={accelerator.local_process_index} env={state.distributed_type} "
          f"backend={state.backend} steps={done} before={before} "
          f"params={digest(accelerator.unwrap_model(model))} state=[{view}]", flush=True)
    accelerator.end_training()


if __name__ == "__main__":
    main()
