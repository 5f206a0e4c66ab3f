"""What submitit's own helpers see in a rank of an API job, beside what slurmlaunch exported: a client of the
API nobody here wrote (submitit's documented pattern, `TorchDistributedEnvironment().export()` then env://).
Imported by the local test and sent by value (its source) to the real clusters' drivers."""

from __future__ import annotations

import os


def submitit_view(mode: str) -> dict[str, object]:
    """submitit's JobEnvironment and TorchDistributedEnvironment beside our variables; with ``mode``
    "export": its export() as submitit's docs write it; "overwrite": export(overwrite=True), then a gloo
    all_reduce on the world it exported."""
    import socket

    import submitit

    job_env = submitit.JobEnvironment()
    tde = submitit.helpers.TorchDistributedEnvironment()
    names = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_PORT")
    out: dict[str, object] = {
        "ours": [os.environ[k] for k in names],
        "theirs": [str(v) for v in (tde.rank, tde.local_rank, tde.world_size, tde.local_world_size, job_env.node,
                                    tde.master_port)],
        "num_nodes": job_env.num_nodes, "master": [os.environ["MASTER_ADDR"], tde.master_addr],
        "host": socket.gethostname()}
    if mode == "export":
        tde.export(set_cuda_visible_devices=False)
    elif mode == "overwrite":
        import torch
        import torch.distributed as dist

        tde.export(set_cuda_visible_devices=False, overwrite=True)
        dist.init_process_group("gloo")
        t = torch.ones(1)
        dist.all_reduce(t)
        out["sum"] = int(t.item())
        dist.barrier()
        dist.destroy_process_group()
    return out
