"""One rank of the barrier benchmark: time when the script starts (start), when torch is imported (ready) and
after the first barrier.

Appends one JSON line per rank to $BENCH_OUT. --helper uses slurmlaunch.init_process_group instead of
torch's env:// rendezvous.
"""

import time

start = time.time()

import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

import torch.distributed as dist  # noqa: E402

ready = time.time()
if "--helper" in sys.argv:
    import slurmlaunch

    slurmlaunch.init_process_group("gloo")
else:
    dist.init_process_group("gloo")
dist.barrier()
done = time.time()
with open(os.environ["BENCH_OUT"], "a") as f:
    f.write(json.dumps({"rank": dist.get_rank(), "start": start, "ready": ready, "done": done}) + "\n")
dist.destroy_process_group()
