"""A DDP script in the shape of PyTorch's multi-node tutorial (ddp-tutorial-series/multinode.py): a Trainer
that saves a snapshot (model state and epochs run) every few epochs and, when one exists at start, resumes
from it; LOCAL_RANK and RANK from the environment, init_process_group with env://. The device and backend
are the CPU and gloo. Nothing in it names slurmlaunch.

    torchrun --nnodes 2 --nproc-per-node 2 ... ddp_snapshot.py 2 1 --snapshot snap.pt
"""

from __future__ import annotations

import argparse
import hashlib
import os

import torch
import torch.nn.functional as F
from torch.distributed import destroy_process_group, get_rank, get_world_size, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def ddp_setup() -> None:
    init_process_group(backend="gloo")


class Trainer:
    def __init__(self, model: torch.nn.Module, train_data: DataLoader, optimizer: torch.optim.Optimizer,
                 save_every: int, snapshot_path: str) -> None:
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.global_rank = int(os.environ["RANK"])
        self.train_data = train_data
        self.optimizer = optimizer
        self.save_every = save_every
        self.epochs_run = 0
        self.snapshot_path = snapshot_path
        self.model = model
        if os.path.exists(snapshot_path):
            print(f"[RANK{self.global_rank}] loading snapshot", flush=True)
            self._load_snapshot(snapshot_path)
        self.model = DDP(self.model)

    def _load_snapshot(self, path: str) -> None:
        snapshot = torch.load(path, map_location="cpu")
        self.model.load_state_dict(snapshot["MODEL_STATE"])
        self.epochs_run = snapshot["EPOCHS_RUN"]
        print(f"[RANK{self.global_rank}] resuming training from snapshot at epoch {self.epochs_run}", flush=True)

    def _run_batch(self, source: torch.Tensor, targets: torch.Tensor) -> None:
        self.optimizer.zero_grad()
        loss = F.mse_loss(self.model(source), targets)
        loss.backward()
        self.optimizer.step()

    def _run_epoch(self, epoch: int) -> None:
        assert isinstance(self.train_data.sampler, DistributedSampler)
        self.train_data.sampler.set_epoch(epoch)
        for source, targets in self.train_data:
            self._run_batch(source, targets)

    def _save_snapshot(self, epoch: int) -> None:
        snapshot = {"MODEL_STATE": self.model.module.state_dict(), "EPOCHS_RUN": epoch}
        torch.save(snapshot, self.snapshot_path)
        print(f"[RANK{self.global_rank}] epoch {epoch} | training snapshot saved at {self.snapshot_path}", flush=True)

    def train(self, max_epochs: int) -> None:
        for epoch in range(self.epochs_run, max_epochs):
            self._run_epoch(epoch)
            if self.global_rank == 0 and epoch % self.save_every == 0:
                self._save_snapshot(epoch + 1)


def load_train_objs() -> tuple[Dataset[tuple[torch.Tensor, ...]], torch.nn.Module, torch.optim.Optimizer]:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, generator=generator)
    train_set = TensorDataset(x, x.sum(dim=1, keepdim=True))
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    return train_set, model, optimizer


def digest(module: torch.nn.Module) -> str:
    data = b"".join(p.detach().contiguous().numpy().tobytes() for p in module.parameters())
    return hashlib.sha256(data).hexdigest()[:16]


def main(save_every: int, total_epochs: int, batch_size: int, snapshot_path: str) -> None:
    ddp_setup()
    dataset, model, optimizer = load_train_objs()
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, sampler=DistributedSampler(dataset))
    trainer = Trainer(model, loader, optimizer, save_every, snapshot_path)
    before = digest(trainer.model.module)
    start = trainer.epochs_run
    trainer.train(total_epochs)
    print(f"CLIENT ddp rank={get_rank()} world={get_world_size()} local_rank={trainer.local_rank} "
          f"env=torch.distributed:{os.environ.get('TORCHELASTIC_RUN_ID') and 'torchelastic' or 'env://'} "
          f"epochs={start}->{total_epochs} before={before} params={digest(trainer.model.module)}", flush=True)
    destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="simple distributed training job")
    parser.add_argument("total_epochs", type=int, help="Total epochs to train the model")
    parser.add_argument("save_every", type=int, help="How often to save a snapshot")
    parser.add_argument("--batch_size", default=4, type=int, help="Input batch size on each device (default: 4)")
    parser.add_argument("--snapshot", default="snapshot.pt", help="Where the snapshot is saved and resumed from")
    args = parser.parse_args()
    main(args.save_every, args.total_epochs, args.batch_size, args.snapshot)
