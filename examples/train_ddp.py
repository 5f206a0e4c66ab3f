"""A small but real DDP training run, in the style the classic multi-node tutorials teach.

Runs unchanged under `torchrun`, `python -m torch.distributed.launch --use-env`, `slurmlaunch launch`,
`slurmlaunch run` and `slurmlaunch submit`: it reads only torch's standard variables (RANK, LOCAL_RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT). It uses GPU LOCAL_RANK with NCCL when CUDA is available, and the
CPU with gloo otherwise (and says so).

    slurmlaunch submit --nodes 2 --gpus-per-node 4 --wait examples/train_ddp.py --epochs 3
"""

from __future__ import annotations

import argparse
import os
import socket
import warnings

# torch warns at import when NumPy is not installed ("Failed to initialize NumPy"), once per rank. This example
# never converts a tensor to NumPy, so that one warning is not for its user; any other warning still shows, and
# a script that does use NumPy without it installed fails at .numpy() with torch's own error.
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=r"Failed to initialize NumPy", category=UserWarning)
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--checkpoint", default="checkpoint.pt", help="written by rank 0 after each epoch")
    args = p.parse_args()

    local_rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device, backend = torch.device("cuda", local_rank), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    dist.init_process_group(backend=backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    node_rank = os.environ.get("NODE_RANK", os.environ.get("GROUP_RANK", "?"))  # torchrun sets GROUP_RANK
    print(f"rank={rank} local_rank={local_rank} node_rank={node_rank} "
          f"world_size={world} host={socket.gethostname()} device={device} backend={backend}", flush=True)
    if rank == 0 and backend == "gloo":
        print("no GPU available: training on the CPU with gloo", flush=True)

    torch.manual_seed(0)  # the same data on every rank; the sampler gives each its own shard
    x = torch.randn(1024, 16)
    y = x @ torch.arange(16, dtype=torch.float32).unsqueeze(1) / 16 + 0.1 * torch.randn(1024, 1)
    data = TensorDataset(x, y)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)

    model = DDP(torch.nn.Linear(16, 1).to(device), device_ids=[local_rank] if backend == "nccl" else None)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    loss_fn = torch.nn.MSELoss()
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        total = torch.zeros(2, device=device)
        for xb, yb in loader:
            xb, yb = xb.to(device), yb.to(device)
            opt.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()
            opt.step()
            total += torch.stack([loss.detach() * len(xb), torch.tensor(float(len(xb)), device=device)])
        dist.all_reduce(total)
        if rank == 0:
            print(f"epoch {epoch} loss {total[0].item() / total[1].item():.4f} samples {int(total[1].item())}",
                  flush=True)
            torch.save({"epoch": epoch, "model": model.module.state_dict()}, args.checkpoint)
    check = torch.tensor([float(rank)], device=device)
    dist.all_reduce(check)
    if rank == 0:
        print(f"done: world_size={world} sum_of_ranks={int(check.item())}", flush=True)
    dist.barrier()  # nobody tears down its side of the process group while a peer still uses it
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
