"""--stage-env on the real local Slurm cluster (issue 42): the ranks start from a node-local copy of their
environment, sbcast'ed once per node, and nothing is left behind.

The cluster's nodes share this machine's file systems; each node's "node-local" directory is made here as
a site would have it: a mount seen by that node only (each slurmd runs in its own mount namespace, so a bind
mount of a per-node directory, or a tiny tmpfs for the fault, is made in that namespace with nsenter).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

import slurmlaunch
from slurmlaunch.allocation.timeline import read as read_timeline
from slurmlaunch.core.timeline import build
from tests.helpers import run_cli, teardown_abort_only

pytestmark = pytest.mark.slurm

NODES = 4  # the session cluster's (tests/conftest.py)
REPO = Path(slurmlaunch.__file__).resolve().parents[1]

RECORD = """
import json, os, sys
out = os.path.join(sys.argv[1], f"rank-{os.environ['RANK']}.json")
rec = {"host": os.uname().nodename, "prefix": sys.prefix, "executable": sys.executable,
       "path0": os.environ["PATH"].split(":")[0], "ino": os.stat(sys.prefix).st_ino}
if len(sys.argv) > 2 and sys.argv[2] == "torch":
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t)
    rec.update(torch=torch.__file__, sum=t.item())
    dist.destroy_process_group()
with open(out + ".tmp", "w") as f:
    json.dump(rec, f)
os.rename(out + ".tmp", out)
if len(sys.argv) > 2 and sys.argv[2] == "sleep":
    import time
    time.sleep(300)
if len(sys.argv) > 2 and sys.argv[2] == "fail":
    sys.exit(3)
"""


def _slurmd_pid(cluster: dict[str, str], node: int) -> str:
    return (Path(cluster["SLURMLAUNCH_TEST_CLUSTER_DIR"]) / f"slurmd-node{node}.pid").read_text().strip()


def _in_node(cluster: dict[str, str], node: int, *cmd: str) -> None:
    subprocess.run(["nsenter", "-t", _slurmd_pid(cluster, node), "-m", *cmd], check=True, timeout=30)


@contextlib.contextmanager
def mounted_node_local(tmp_path: Path, hosts: Sequence[str], size: str | None,
                       in_host: Callable[..., object]) -> Iterator[tuple[Path, list[Path]]]:
    """One path, a node-local directory on each host as a site has it: a mount only that host sees (a bind
    mount of a directory of its own, or a tmpfs of ``size``), made in the host's mount namespace by
    ``in_host(host, *command)``. (The path, each host's own directory behind it: empty for a tmpfs.)"""
    where = tmp_path / "node-local"
    where.mkdir()
    backing = []
    for host in hosts:
        if size is None:
            own = tmp_path / f"disk-{host}"
            own.mkdir()
            backing.append(own)
            in_host(host, "mount", "--bind", str(own), str(where))
        else:
            in_host(host, "mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where))
    try:
        yield where, backing
    finally:
        for host in hosts:
            in_host(host, "umount", "-l", str(where))


@pytest.fixture
def node_local(slurm_cluster: dict[str, str], tmp_path: Path,
               request: pytest.FixtureRequest) -> Iterator[tuple[Path, list[Path]]]:
    """The node-local directory on each of the cluster's nodes (:func:`mounted_node_local`); ``request.param``:
    a tmpfs size instead of a bind mount."""
    with mounted_node_local(tmp_path, [f"node{i}" for i in range(1, NODES + 1)], getattr(request, "param", None),
                            lambda host, *cmd: _in_node(slurm_cluster, int(host[4:]), *cmd)) as mounted:
        yield mounted


def recorder(tmp_path: Path, out: str = "out") -> tuple[Path, Path]:
    """The script each rank runs (:data:`RECORD`) and a new directory ``out`` for what they record."""
    script = tmp_path / "record.py"
    if not script.exists():
        script.write_text(RECORD)
    where = tmp_path / out
    where.mkdir()
    return script, where


def _small_venv(tmp_path: Path) -> Path:
    """A venv of a few files whose site-packages finds this checkout's slurmlaunch (as an editable install)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next(venv.glob("lib/python3*/site-packages"))
    (site / "slurmlaunch_checkout.pth").write_text(f"{REPO}\n")
    return venv


def _submit(env: dict[str, str], cwd: Path, where: Path, python: Path, *args: str, stage: str = "--stage-env=on",
            wait: bool = True, timeout: float = 300, cache: Path | None = None) -> subprocess.CompletedProcess[str]:
    return run_cli("submit", "--nodes", "2", "--tasks-per-node", "2", stage, "--python", str(python),
                   "--env", f"SLURMLAUNCH_STAGE_DIR={where}",
                   "--env", f"SLURMLAUNCH_STAGE_CACHE={cache or cwd / 'cache'}",
                   *(["--wait"] if wait else []), *args, env=env, cwd=cwd, timeout=timeout)


def _job(r: subprocess.CompletedProcess[str]) -> str:
    m = re.search(r"submitted job (\d+)", r.stderr)
    assert m, r.stdout + r.stderr
    return m[1]


def _batch_log(cwd: Path, job: str) -> str:
    return (cwd / "slurmlaunch-logs" / f"job-{job}.batch.log").read_text()


def _records(d: Path, n: int = 4) -> list[dict[str, object]]:
    return [json.loads((d / f"rank-{r}.json").read_text()) for r in range(n)]


def test_ranks_run_from_a_node_local_copy_packed_once(cluster_env: dict[str, str], tmp_path: Path,
                                                     node_local: tuple[Path, list[Path]]) -> None:
    where, backing = node_local
    venv = _small_venv(tmp_path)
    runs = []
    for n in (1, 2):
        script, out = recorder(tmp_path, f"out{n}")
        r = _submit(cluster_env, tmp_path, where, venv / "bin" / "python", str(script), str(out))
        assert r.returncode == 0, r.stdout + r.stderr
        job = _job(r)
        local = f"{where}/slurmlaunch-stage-{job}"
        recs = _records(out)
        for rec in recs:
            assert rec["prefix"] == local and rec["executable"] == f"{local}/bin/python", rec
            assert rec["path0"] == f"{local}/bin"
        hosts = {rec["host"] for rec in recs}
        assert len(hosts) == 2
        # one copy per node: the ranks of a node share it, the two nodes' copies are different directories
        inos = {h: {rec["ino"] for rec in recs if rec["host"] == h} for h in hosts}
        assert all(len(v) == 1 for v in inos.values()) and len(set().union(*inos.values())) == 2
        assert all(list(b.iterdir()) == [] for b in backing)  # cleaned up on every node
        runs.append(_batch_log(tmp_path, job))
        # where the staging went, by step; and the timeline's "batch step" phase holds it (the ranks' command
        # starts after it), not every rank's task start
        staged = re.search(r"environment staged on 2 node\(s\) in \S+ \(([\d.]+)s: (?:pack|content key) [\d.]+s, "
                           r"space check [\d.]+s, sbcast [\d.]+s, unpack [\d.]+s\)", runs[-1])
        assert staged, runs[-1]
        tl = build(job, read_timeline(str(tmp_path / "slurmlaunch-logs" / f"job-{job}.timeline")), 4)
        batch_step = [p for p in tl.ranks[0].phases if p.name == "batch step"]
        assert len(batch_step) == 1 and batch_step[0].seconds >= float(staged[1]) - 0.05, (tl.ranks[0], staged[0])
    assert re.search(r"environment \S+ packed in \S+cache/venv-\w+\.tar", runs[0]), runs[0]
    assert "skipped the pack" not in runs[0]
    assert "found packed" in runs[1] and "skipped the pack" in runs[1], runs[1]
    assert len(list((tmp_path / "cache").iterdir())) == 1


def test_failure_and_cancel_leave_nothing(cluster_env: dict[str, str], tmp_path: Path,
                                          node_local: tuple[Path, list[Path]]) -> None:
    where, backing = node_local
    venv = _small_venv(tmp_path)
    script, out = recorder(tmp_path, "fail")
    r = _submit(cluster_env, tmp_path, where, venv / "bin" / "python", str(script), str(out), "fail")
    assert r.returncode == 3, r.stdout + r.stderr
    # the first rank to exit 3 ends the others (srun --kill-on-bad-exit), maybe before they wrote theirs
    recs = [json.loads(p.read_text()) for p in out.glob("rank-*.json")]
    assert recs and {rec["prefix"] for rec in recs} == {f"{where}/slurmlaunch-stage-{_job(r)}"}
    assert all(list(b.iterdir()) == [] for b in backing)
    _, out = recorder(tmp_path, "cancel")
    r = _submit(cluster_env, tmp_path, where, venv / "bin" / "python", str(script), str(out), "sleep", wait=False)
    assert r.returncode == 0, r.stderr
    job = _job(r)
    deadline = time.monotonic() + 120
    while len(list(out.glob("rank-*.json"))) < 4:
        assert time.monotonic() < deadline, "the 4 ranks did not start within 120 s"
        time.sleep(0.5)
    assert sum(len(list(b.iterdir())) for b in backing) == 2  # a copy on each of the job's 2 nodes
    c = run_cli("cancel", job, env=cluster_env, cwd=tmp_path)
    assert c.returncode == 0, c.stderr
    deadline = time.monotonic() + 60
    while any(list(b.iterdir()) for b in backing):
        assert time.monotonic() < deadline, [list(b.iterdir()) for b in backing]
        time.sleep(0.5)


@pytest.mark.parametrize("node_local", ["8k"], indirect=True)
def test_too_small_node_local_space_is_one_line(cluster_env: dict[str, str], tmp_path: Path,
                                               node_local: tuple[Path, list[Path]]) -> None:
    where, _ = node_local
    venv = _small_venv(tmp_path)
    script, out = recorder(tmp_path)
    r = _submit(cluster_env, tmp_path, where, venv / "bin" / "python", str(script), str(out))
    assert r.returncode == 1, r.stdout + r.stderr
    log = _batch_log(tmp_path, _job(r))
    lines = [ln for ln in log.splitlines() if "short" in ln and "no rank was started" not in ln]
    assert len(lines) == 2 and {re.search(r"node (node\d):", ln)[1] for ln in lines} == {"node1", "node2"}, log  # type: ignore[index]
    assert f"the node-local directory {where} has " in lines[0] and "no rank was started" in log
    said = [ln for ln in r.stderr.splitlines() if "short" in ln]  # --wait: the failure's line
    assert len(said) == 1 and "no rank was started" in said[0] and "1 more node(s)" in said[0], r.stderr
    assert "Fix: set SLURMLAUNCH_STAGE_DIR (--env) to a larger node-local directory" in said[0]
    assert list(out.iterdir()) == []
    r = _submit(cluster_env, tmp_path, where, venv / "bin" / "python", str(script), str(out),
                stage="--stage-env=fallback")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "running from the shared copy (--stage-env fallback)" in _batch_log(tmp_path, _job(r))
    assert {rec["prefix"] for rec in _records(out)} == {str(venv)}


# The torch environment's pack (1.2 GiB) kept across test sessions on this machine, under its content key: a
# second CI run skips the pack (the cache is what users get too). Other keys' packs a day old are removed.
TORCH_CACHE = Path(f"/tmp/slurmlaunch-test-stage-cache-{os.getuid()}")


def _in_node_listing(cluster: dict[str, str], node: int, where: Path) -> list[str]:
    done = subprocess.run(["nsenter", "-t", _slurmd_pid(cluster, node), "-m", "ls", "-A", str(where)],
                          capture_output=True, text=True, check=True, timeout=30)
    return done.stdout.split()


@pytest.mark.parametrize("node_local", ["4g"], indirect=True)
def test_torch_gloo_from_the_node_local_copy(cluster_env: dict[str, str], tmp_path: Path, torch_available: None,
                                             slurm_cluster: dict[str, str],
                                             node_local: tuple[Path, list[Path]]) -> None:
    """The real environment (torch's, this checkout's .venv): all_reduce over gloo, torch imported from each
    node's copy. The node-local directory is a tmpfs per node (as /dev/shm or a tmpfs /tmp is at many sites):
    the unpack and the clean-up of its 38,000 files take seconds, not the 96 s of rm -rf on this shared disk."""
    where, _ = node_local
    script, out = recorder(tmp_path)
    r = _submit(cluster_env, tmp_path, where, Path(sys.prefix) / "bin" / "python", str(script), str(out), "torch",
                timeout=600, cache=TORCH_CACHE)
    assert r.returncode == 0 or teardown_abort_only(r.stderr), r.stdout + r.stderr
    local = f"{where}/slurmlaunch-stage-{_job(r)}"
    for rec in _records(out):
        assert rec["sum"] == 6.0 and str(rec["torch"]).startswith(f"{local}/lib/"), rec
    for node in range(1, NODES + 1):
        assert _in_node_listing(slurm_cluster, node, where) == [], node
    used = re.search(r"in (\S+\.tar) \(", _batch_log(tmp_path, _job(r)))
    assert used, _batch_log(tmp_path, _job(r))
    for old in TORCH_CACHE.glob("*.tar"):  # a day old: not another session's, packed just now
        if old != Path(used[1]) and time.time() - old.stat().st_mtime > 86400:
            old.unlink(missing_ok=True)


def where_am_i() -> dict[str, str]:
    """An API rank's answer: its interpreter's prefix and its node."""
    return {"prefix": sys.prefix, "host": os.uname().nodename}


def test_api_argument_stages_too(cluster_env: dict[str, str], tmp_path: Path,
                                 node_local: tuple[Path, list[Path]]) -> None:
    """slurmlaunch.submit(..., stage_env="on"): the same batch step stages the API's interpreter (a small venv
    that finds this checkout and the test venv's packages, submitit among them, through .pth files)."""
    where, backing = node_local
    venv = _small_venv(tmp_path)
    site = next(venv.glob("lib/python3*/site-packages"))
    (site / "test_venv.pth").write_text(f"{next(Path(sys.prefix).glob('lib/python3*/site-packages'))}\n")
    code = (
        "import json, slurmlaunch\n"
        "from tests.real.test_stage_env import where_am_i\n"
        f"job = slurmlaunch.submit(where_am_i, scheduler='slurm', nodes=2, tasks_per_node=1, stage_env='on', "
        f"env={{'SLURMLAUNCH_STAGE_DIR': {str(where)!r}, 'SLURMLAUNCH_STAGE_CACHE': {str(tmp_path / 'cache')!r}}}, "
        f"output_dir={str(tmp_path / 'logs')!r})\n"
        "print('RESULTS ' + json.dumps([job.job_id, job.results()]))\n"
    )
    env = dict(cluster_env, PYTHONPATH=str(REPO))
    r = subprocess.run([str(venv / "bin" / "python"), "-c", code], env=env, cwd=tmp_path, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    job, results = json.loads(next(ln for ln in r.stdout.splitlines() if ln.startswith("RESULTS "))[8:])
    assert {res["prefix"] for res in results} == {f"{where}/slurmlaunch-stage-{job}"}, results
    assert len({res["host"] for res in results}) == 2
    # results() answers once the ranks' results are written; the holders remove the copies after, and the batch
    # step writes its exit code after them
    ended = tmp_path / "logs" / f"job-{job}.exitcode"
    deadline = time.monotonic() + 120
    while not ended.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ended.exists(), f"the batch step did not end within 120 s (no {ended})"
    assert all(list(b.iterdir()) == [] for b in backing)
