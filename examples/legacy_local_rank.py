"""A script from the `python -m torch.distributed.launch` era: it takes --local-rank (or --local_rank)
as an argument instead of reading LOCAL_RANK.

    slurmlaunch launch --legacy-local-rank-arg examples/legacy_local_rank.py
    python -m torch.distributed.launch --nproc-per-node 2 examples/legacy_local_rank.py
"""

import argparse
import os

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--local-rank", "--local_rank", type=int, required=True)
args, _ = p.parse_known_args()

device = torch.device("cuda", args.local_rank) if torch.cuda.is_available() else torch.device("cpu")
dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
t = torch.ones(1, device=device)
dist.all_reduce(t)
print(f"rank={dist.get_rank()} --local-rank={args.local_rank} LOCAL_RANK={os.environ.get('LOCAL_RANK')} "
      f"all_reduce={int(t.item())}", flush=True)
dist.barrier()  # nobody tears down its side of the process group while a peer still uses it
dist.destroy_process_group()
