"""slurmlaunch from Python, notebook style: each block could be a cell.

    python examples/api_quickstart.py        # local default on a machine without Slurm

Under Slurm the same calls submit to the cluster (scheduler="auto" picks Slurm when a controller answers).
"""

import slurmlaunch


def all_reduce_ranks(scale: float = 1.0) -> dict:
    """Runs on every rank: the distributed variables are already exported, as under torchrun."""
    import os

    import torch
    import torch.distributed as dist

    device = slurmlaunch.init_process_group()  # gloo on CPU, nccl + the rank's GPU with CUDA
    t = torch.tensor([float(dist.get_rank())], device=device) * scale
    dist.all_reduce(t)
    out = {"rank": dist.get_rank(), "node_rank": int(os.environ["NODE_RANK"]), "sum": t.item()}
    dist.barrier()  # nobody tears down its side of the process group while a peer still uses it
    dist.destroy_process_group()
    return out


if __name__ == "__main__":
    # Cell 1: one distributed job, 2 nodes x 2 ranks; `scale` goes to the function, the rest to the job.
    job = slurmlaunch.submit(all_reduce_ranks, nodes=2, tasks_per_node=2, scale=2.0, output_dir="slurmlaunch-logs")
    print(job)
    print("rank 0:", job.result())
    print("all ranks:", job.results())

    # Cell 2: a sweep as a job array, each element its own world with its own MASTER_PORT.
    jobs = slurmlaunch.map_array(all_reduce_ranks, [1.0, 10.0], tasks_per_node=2, output_dir="slurmlaunch-logs")
    print("sweep:", [j.result()["sum"] for j in jobs])
