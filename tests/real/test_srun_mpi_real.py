"""An mpi4py program runs across two nodes of the real dev cluster with Slurm's PMIx plugin (Debian's
slurm-wlm-basic-plugins mpi/pmix, which loads libpmix.so from libpmix-dev) and Debian's Open MPI, whose PMIx
client talks to the PMIx server in each node's slurmstepd (what is rendered: tests/render/test_srun_mpi.py).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from slurmlaunch.schedulers import slurm
from tests.helpers import run_cli, skip_or_fail
from tests.render.test_srun_mpi import MPI_LIST

# Where Debian's Slurm 22.05 build (--with-pmix=/usr/lib/x86_64-linux-gnu/pmix2) dlopens libpmix.so from: the
# unversioned name only libpmix-dev installs. Without it `srun --mpi=pmix` fails to start the step.
DEBIAN_LIBPMIX = Path("/usr/lib/x86_64-linux-gnu/pmix2/lib/libpmix.so")


# --- the real cluster: mpi4py across two nodes through `slurmlaunch submit` -----------------------------------

MPI_PROGRAM = """
import json, os, socket, sys
from mpi4py import MPI
world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
total = world.allreduce(rank + 1, op=MPI.SUM)
hosts = world.allgather(socket.gethostname())
with open(os.path.join(sys.argv[1], f"rank-{rank}.json"), "w") as f:
    json.dump({"rank": rank, "size": size, "sum": total, "hosts": hosts, "host": socket.gethostname(),
               "procid": os.environ["SLURM_PROCID"], "torch_rank": os.environ["RANK"],
               "world_size": os.environ["WORLD_SIZE"], "pmix_rank": os.environ.get("PMIX_RANK")}, f)
print(f"mpi rank {rank} of {size} on {socket.gethostname()}: allreduce {total}", flush=True)
"""


def _pmix_ready() -> None:
    try:
        import mpi4py  # noqa: F401
    except ImportError as e:
        skip_or_fail(f"mpi4py is not installed ({e}): pip install -e '.[test]'")
    if not DEBIAN_LIBPMIX.exists():
        skip_or_fail(f"{DEBIAN_LIBPMIX} is missing: Slurm's mpi/pmix plugin cannot load PMIx (apt-get install "
                     "libpmix-dev)")


@pytest.mark.slurm
def test_mpi4py_across_two_nodes_with_pmix(netns_cluster_env: dict[str, str], tmp_path: Path) -> None:
    """4 ranks (2 nodes x 2): each sees its own COMM_WORLD rank (= SLURM_PROCID = the launcher's RANK) and size
    4, the allreduce of rank+1 is 10, and the ranks are on node1 and node2 (different hosts of the netns
    cluster, so Open MPI talks over the bridge, never a machine address)."""
    _pmix_ready()
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "mpi_prog.py").write_text(MPI_PROGRAM)
    r = run_cli("submit", "--scheduler", "slurm", "--nodes", "2", "--tasks-per-node", "2", "--mpi", "pmix",
                "--time", "5", "--wait", "--wait-timeout", "240", "mpi_prog.py", str(out),
                env=netns_cluster_env, cwd=tmp_path, timeout=300)
    job = re.search(r"submitted job (\d+)", r.stderr)
    logs = tmp_path / "slurmlaunch-logs"
    detail = r.stdout + r.stderr + "".join(p.read_text(errors="replace")[-1500:] for p in logs.glob("*.log"))
    assert r.returncode == 0 and job, detail
    assert "--mpi=pmix" in (logs / f"job-{job.group(1)}.sbatch").read_text()
    ranks = [json.loads((out / f"rank-{i}.json").read_text()) for i in range(4)]
    for i, rec in enumerate(ranks):
        assert (rec["rank"], rec["size"], rec["sum"]) == (i, 4, 10), rec
        assert rec["procid"] == rec["torch_rank"] == rec["pmix_rank"] == str(i) and rec["world_size"] == "4", rec
        assert rec["hosts"] == ["node1", "node1", "node2", "node2"], rec


@pytest.mark.slurm
def test_without_mpi_the_ranks_are_no_world(netns_cluster_env: dict[str, str], tmp_path: Path) -> None:
    """The control: the same program without --mpi (the cluster's MpiDefault=none) never gets its world of 4,
    as the issue saw it under plain srun; what makes the difference above is --mpi pmix."""
    _pmix_ready()
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "mpi_prog.py").write_text(MPI_PROGRAM)
    r = run_cli("submit", "--scheduler", "slurm", "--nodes", "2", "--tasks-per-node", "2", "--time", "5", "--wait",
                "--wait-timeout", "240", "mpi_prog.py", str(out), env=netns_cluster_env, cwd=tmp_path, timeout=300)
    sizes = [json.loads(p.read_text())["size"] for p in out.glob("rank-*.json")]
    logs = "".join(p.read_text(errors="replace") for p in (tmp_path / "slurmlaunch-logs").glob("*.log"))
    assert r.returncode != 0 and sizes != [4] * 4 and "PMI" in logs + r.stdout + r.stderr, \
        (r.returncode, sizes, logs[-2000:])


@pytest.mark.slurm
def test_a_plugin_the_cluster_lacks_is_refused_before_sbatch(netns_cluster_env: dict[str, str],
                                                              tmp_path: Path) -> None:
    """Debian builds Slurm's pmix plugin for PMIx 4 only: pmix_v3 would wait in the queue and fail at its step.
    Refused at submission instead, naming what `srun --mpi=list` offers here; nothing submitted."""
    listed = subprocess.run(["srun", "--mpi=list"], env=netns_cluster_env, capture_output=True, text=True,
                            timeout=60)
    assert listed.returncode == 0 and slurm.mpi_plugins(listed.stdout + listed.stderr) == \
        slurm.mpi_plugins(MPI_LIST), listed.stdout + listed.stderr
    (tmp_path / "refused_mpi_probe.py").write_text("")
    r = run_cli("submit", "--scheduler", "slurm", "--mpi", "pmix_v3", "refused_mpi_probe.py", env=netns_cluster_env,
                cwd=tmp_path, timeout=120)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "slurmlaunch: error: --mpi pmix_v3: this cluster's srun has no such mpi plugin (expected one of pmix, none, "
        "cray_shasta, pmi2, pmix_v4, as `srun --mpi=list` shows)"], r.stderr
    assert not list(tmp_path.glob("slurmlaunch-logs/*.sbatch")) and not list(tmp_path.glob("slurmlaunch-logs/*.json"))
    jobs = subprocess.run(["sacct", "-n", "-X", "-o", "JobName%40", "-S", "now-1hour"], env=netns_cluster_env,
                          capture_output=True, text=True, timeout=60)
    assert jobs.returncode == 0 and "refused_mpi_probe" not in jobs.stdout, jobs.stdout + jobs.stderr
