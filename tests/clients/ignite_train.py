"""A pytorch-ignite user's script, in either of the two ways ignite's docs start a distributed run:
`with idist.Parallel(backend="gloo") as parallel: parallel.run(training, config)` (--style parallel), or
`idist.initialize("gloo")` ... `idist.finalize()` (--style initialize). The model, optimizer and data loader
go through idist.auto_model/auto_optim/auto_dataloader (DDP and a DistributedSampler when there are several
processes) and a trainer from create_supervised_trainer. ignite reads the environment itself: RANK,
LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, and, inside a Slurm job, SLURM_PROCID, SLURM_LOCALID,
SLURM_NTASKS, SLURM_JOB_NODELIST and SLURM_JOB_NUM_NODES, which must agree with the former on a multi-node
job. Nothing here names slurmlaunch.

    python ignite_train.py --style parallel --epochs 2
"""

from __future__ import annotations

import argparse
import hashlib
from typing import Any

import ignite.distributed as idist
import torch
from ignite.engine import create_supervised_trainer
from torch import nn
from torch.utils.data import TensorDataset


def digest(module: nn.Module) -> str:
    data = b"".join(p.detach().cpu().contiguous().numpy().tobytes() for p in module.parameters())
    return hashlib.sha256(data).hexdigest()[:16]


def training(local_rank: int, config: dict[str, Any]) -> None:
    torch.manual_seed(0)
    x = torch.randn(64, 8)
    loader = idist.auto_dataloader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=4, shuffle=False)
    model = nn.Linear(8, 1)
    before = digest(model)
    model = idist.auto_model(model)
    optimizer = idist.auto_optim(torch.optim.SGD(model.parameters(), lr=0.01))
    trainer = create_supervised_trainer(model, optimizer, nn.functional.mse_loss, device=idist.device())
    trainer.run(loader, max_epochs=config["epochs"])
    plain = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
    print(f"CLIENT ignite-{config['style']} rank={idist.get_rank()} world={idist.get_world_size()} "
          f"local_rank={local_rank} env={idist.model_name()} backend={idist.backend()} nodes={idist.get_nnodes()} "
          f"node={idist.get_node_rank()} epochs={trainer.state.epoch} before={before} params={digest(plain)}",
          flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--style", choices=["parallel", "initialize"], default="parallel")
    p.add_argument("--epochs", type=int, default=2)
    args = p.parse_args()
    config = {"epochs": args.epochs, "style": args.style}
    if args.style == "parallel":
        with idist.Parallel(backend="gloo") as parallel:
            parallel.run(training, config)
    else:
        idist.initialize("gloo")
        training(idist.get_local_rank(), config)
        idist.finalize()


if __name__ == "__main__":
    main()
