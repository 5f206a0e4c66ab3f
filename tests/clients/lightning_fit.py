"""A Lightning user's script, written from Lightning's docs (Trainer with accelerator, devices, num_nodes and
strategy="ddp"), nothing in it about slurmlaunch. Lightning picks its cluster environment itself (SLURM,
torchelastic or its own) from the variables the task sees; the script prints which one it picked.

    python lightning_fit.py --devices 2 --num-nodes 2
"""

from __future__ import annotations

import argparse
import hashlib

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Regressor(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(8, 1)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def digest(module: nn.Module) -> str:
    data = b"".join(p.detach().cpu().contiguous().numpy().tobytes() for p in module.parameters())
    return hashlib.sha256(data).hexdigest()[:16]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--devices", type=int, default=1)
    p.add_argument("--num-nodes", type=int, default=1)
    p.add_argument("--steps", type=int, default=2)
    args = p.parse_args()

    L.seed_everything(0)
    x = torch.randn(64, 8)
    data = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=4)
    model = Regressor()
    before = digest(model)
    trainer = L.Trainer(accelerator="cpu", devices=args.devices, num_nodes=args.num_nodes, strategy="ddp",
                        max_steps=args.steps, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, data)
    env = trainer.strategy.cluster_environment
    print(f"CLIENT lightning rank={trainer.global_rank} world={trainer.world_size} "
          f"local_rank={trainer.local_rank} node_rank={trainer.node_rank} env={type(env).__name__} "
          f"env_world={env.world_size()} env_rank={env.global_rank()} steps={trainer.global_step} "
          f"before={before} params={digest(model)}", flush=True)


if __name__ == "__main__":
    main()
