"""Checkpoint on the warning signal, resume after the requeue.

    slurmlaunch submit --nodes 2 --tasks-per-node 2 --requeue --max-requeues 3 --signal USR2@120 \
        examples/checkpoint_requeue.py --steps 200 --checkpoint ckpt.pt

Before the time limit (or on `scancel --signal=USR2 JOB`) every rank receives SIGUSR2 directly: the
launcher exec'd this process, so no shell sits in between. The ranks agree on a step to stop at (a
signal reaches them at slightly different steps, and a collective needs all of them), rank 0 saves a
checkpoint, and every rank exits with 128 + SIGUSR2: the batch script reads that exit status as "requeue
me", requeues the job, and the next run resumes from the checkpoint (SLURM_RESTART_COUNT tells which run
this is). The result equals that of an uninterrupted run: the data of step s depends on s only.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

stop_requested = False


def on_warning(signum: int, _frame: object) -> None:
    global stop_requested
    stop_requested = True


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--checkpoint", default="checkpoint_requeue.pt")
    p.add_argument("--step-seconds", type=float, default=0.0, help="sleep per step (to make room for a signal)")
    p.add_argument("--signal", default="USR2", help="the warning signal slurmlaunch submit asked for")
    args = p.parse_args()
    warning = getattr(signal, f"SIG{args.signal}")
    # First, before the seconds torch takes to import: Slurm may send the warning up to a minute early, and
    # until a handler is set the rank ignores it (slurmlaunch starts it so): a warning then would be missed.
    signal.signal(warning, on_warning)
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = torch.nn.Linear(8, 1, bias=False)
    torch.nn.init.zeros_(model.weight)
    start = 0
    if os.path.exists(args.checkpoint):
        state = torch.load(args.checkpoint)
        model.load_state_dict(state["model"])
        start = state["step"]
        if rank == 0:
            print(f"resumed from step {start} (SLURM_RESTART_COUNT={os.environ.get('SLURM_RESTART_COUNT', 0)})",
                  flush=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    target = torch.arange(8, dtype=torch.float32) / 8
    for step in range(start, args.steps):
        flag = torch.tensor([1.0 if stop_requested else 0.0])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # all ranks stop at the same step
        if flag.item() > 0:
            if rank == 0:
                torch.save({"model": model.state_dict(), "step": step}, args.checkpoint)
                print(f"warning signal: checkpoint saved at step {step}, asking for a requeue", flush=True)
            dist.barrier()
            dist.destroy_process_group()
            sys.exit(128 + warning)
        g = torch.Generator().manual_seed(step * world + rank)
        x = torch.randn(16, 8, generator=g)
        y = x @ target
        opt.zero_grad()
        loss = ((model(x).squeeze(1) - y) ** 2).mean()
        loss.backward()
        for param in model.parameters():
            assert param.grad is not None
            dist.all_reduce(param.grad)
            param.grad /= world
        opt.step()
        if rank == 0 and step % 10 == 0:
            print(f"step {step} loss {loss.item():.6f}", flush=True)
        time.sleep(args.step_seconds)
    if rank == 0:
        weights = " ".join(f"{w:.6f}" for w in model.weight.detach().flatten().tolist())
        print(f"final weights {weights}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
