"""One rank of the barrier benchmark: time when torch is imported (ready) and after the first barrier.

Appends one JSON line per rank to $BENCH_OUT. --helper uses slurmlaunch.init_process_group instead of
torch's env:// rendezvous.
"""

import json
import os
import sys
import time

import torch.distributed as dist

ready = time.time()
if "--helper" in sys.argv:
    import slurmlaunch

    slurmlaunch.init_process_group("gloo")
else:
    dist.init_process_group("gloo")
dist.barrier()
done = time.time()
with open(os.environ["BENCH_OUT"], "a") as f:
    f.write(json.dumps({"rank": dist.get_rank(), "ready": ready, "done": done}) + "\n")
dist.destroy_process_group()
