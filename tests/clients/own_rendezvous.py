"""A training script that rendezvous its own way, as older scripts and some libraries do, with nothing in it
about slurmlaunch: `port` sets its own MASTER_PORT (idr-torch's way) and uses env://, `tcp` passes
init_method="tcp://MASTER_ADDR:PORT", `file` passes init_method="file://PATH". RANK and WORLD_SIZE come from
the environment. It averages a gradient, then keeps training until LIVE seconds after it started (past a
short --rdzv-timeout), and averages again.

    own_rendezvous.py STYLE PORT FILE LIVE
"""

from __future__ import annotations

import os
import sys
import time

START = time.monotonic()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def main(style: str, port: str, path: str, live: float) -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if style == "port":
        os.environ["MASTER_PORT"] = port
        dist.init_process_group("gloo")
    elif style == "tcp":
        dist.init_process_group("gloo", init_method=f"tcp://{os.environ['MASTER_ADDR']}:{port}", rank=rank,
                                world_size=world)
    else:
        dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=world)
    joined = time.monotonic() - START
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    data = torch.full((8, 4), float(rank + 1))
    steps = 0
    while True:
        model.zero_grad()
        model(data).sum().backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.01 * p.grad
        steps += 1
        done = torch.tensor([float(time.monotonic() - START > live)])
        dist.all_reduce(done, op=dist.ReduceOp.MAX)  # every rank stops at the same step
        if done.item():
            break
        time.sleep(0.5)
    total = torch.tensor([float(rank)])
    dist.all_reduce(total)
    params = ",".join(f"{v:.6f}" for v in torch.cat([p.detach().flatten() for p in model.parameters()]).tolist())
    print(f"CLIENT own rank={rank} world={world} style={style} joined_s={joined:.1f} steps={steps} "
          f"sum={total.item():g} lived_s={time.monotonic() - START:.1f} params={params}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]))
