"""--stage-env on the real 3-host OpenPBS dev cluster (tests/conftest.py pbs_cluster; issue 42): one pbs_tmrsh
task per host unpacks the pack from the cache, every rank starts from its host's copy, and the copies are gone
after the job, after a failed rank and after a qdel; a host whose node-local directory is too small is named
in one line, before any rank starts.

Each dev-cluster host is a process holding a mount namespace of its own (app/devcluster/pbs.py): its
"node-local" directory is made as a site would have it, a mount seen by that host only (a bind mount of a
per-host directory, or a small tmpfs), made in that namespace with nsenter.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurmlaunch.app.devcluster import pbs as pbscluster
from tests.helpers import run_cli, teardown_abort_only
from tests.real.test_pbs_real import AS_ROOT, submitted
from tests.real.test_stage_env import TORCH_CACHE, _small_venv, mounted_node_local, recorder

pytestmark = pytest.mark.pbs

HOSTS = ("node1", "node2", "node3")  # the session cluster's execution hosts (tests/conftest.py)


def _host_pid(cluster: dict[str, str], host: str) -> str:
    root = Path(cluster["SLURMLAUNCH_TEST_PBS_DIR"])
    return (pbscluster.host_dir(root, host) / "host.pid").read_text().strip()


def _in_host(cluster: dict[str, str], host: str, *cmd: str) -> str:
    return subprocess.run(["nsenter", "-t", _host_pid(cluster, host), "-m", *cmd], check=True, timeout=30,
                          capture_output=True, text=True).stdout


@pytest.fixture
def node_local(pbs_cluster: dict[str, str], tmp_path: Path,
               request: pytest.FixtureRequest) -> Iterator[tuple[Path, list[Path]]]:
    """The node-local directory on each host (tests/real/test_stage_env.py: mounted_node_local);
    ``request.param``: a tmpfs size instead of a bind mount."""
    with mounted_node_local(tmp_path, HOSTS, getattr(request, "param", None),
                            lambda host, *cmd: _in_host(pbs_cluster, host, *cmd)) as mounted:
        yield mounted


def _submit(env: dict[str, str], cwd: Path, where: Path, python: Path, *args: str, stage: str = "--stage-env=on",
            wait: bool = True, timeout: float = 400, cache: Path | None = None) -> subprocess.CompletedProcess[str]:
    return run_cli("submit", "--scheduler", "pbs", "--nodes", "2", "--tasks-per-node", "2", *AS_ROOT, stage,
                   "--python", str(python), "--env", f"SLURMLAUNCH_STAGE_DIR={where}",
                   "--env", f"SLURMLAUNCH_STAGE_CACHE={cache or cwd / 'cache'}",
                   *(["--wait", "--wait-timeout", str(int(timeout - 30))] if wait else []), *args,
                   env=env, cwd=cwd, timeout=timeout)


def _output(cwd: Path, job: str) -> str:
    return (cwd / "slurmlaunch-logs" / f"{job}.OU").read_text(errors="replace")  # PBS Pro's name for -o DIR/


def _records(d: Path) -> list[dict[str, object]]:
    return [json.loads(p.read_text()) for p in sorted(d.glob("rank-*.json"))]


@pytest.mark.parametrize("node_local", ["4g"], indirect=True)
def test_pbs_ranks_import_torch_from_their_hosts_copy(pbs_env: dict[str, str], pbs_cluster: dict[str, str],
                                                      tmp_path: Path, torch_available: None,
                                                      node_local: tuple[Path, list[Path]]) -> None:
    """2 hosts x 2 ranks of the real environment (this checkout's .venv, torch's): every rank's sys.prefix
    and torch.__file__ are under its host's copy, gloo's all_reduce sums over all 4, and every host's
    node-local directory is empty after the job. The node-local directory is a tmpfs per host."""
    where, _ = node_local
    script, out = recorder(tmp_path)
    r = _submit(pbs_env, tmp_path, where, Path(sys.prefix) / "bin" / "python", str(script), str(out), "torch",
                timeout=900, cache=TORCH_CACHE)
    job = submitted(r.stderr)
    assert r.returncode == 0 or teardown_abort_only(r.stderr + r.stdout), r.stdout + r.stderr + _output(tmp_path, job)
    local = f"{where}/slurmlaunch-stage-{job.split('.')[0]}"
    recs = _records(out)
    assert len(recs) == 4 and len({rec["host"] for rec in recs}) == 2, recs
    for rec in recs:
        assert rec["prefix"] == local and rec["executable"] == f"{local}/bin/python", rec
        assert rec["sum"] == 6.0 and str(rec["torch"]).startswith(f"{local}/lib/"), rec
    for host in HOSTS:
        assert _in_host(pbs_cluster, host, "ls", "-A", str(where)).split() == [], host
    assert re.search(rf"environment staged on 2 node\(s\) in {re.escape(local)} ", _output(tmp_path, job))


def test_pbs_failure_and_qdel_leave_nothing(pbs_env: dict[str, str], tmp_path: Path,
                                            node_local: tuple[Path, list[Path]]) -> None:
    """A rank that exits 3 fails the job, and both hosts' copies are removed; so are they after a qdel
    (`slurmlaunch cancel`) of a running staged job: the MoM's SIGTERM reaches each host's holder."""
    where, backing = node_local
    venv = _small_venv(tmp_path)
    script, out = recorder(tmp_path, "fail")
    r = _submit(pbs_env, tmp_path, where, venv / "bin" / "python", str(script), str(out), "fail")
    job = submitted(r.stderr)
    assert r.returncode != 0 and f"job {job} ended" in r.stderr, r.stdout + r.stderr
    recs = _records(out)
    assert recs and {rec["prefix"] for rec in recs} == {f"{where}/slurmlaunch-stage-{job.split('.')[0]}"}, recs
    assert all(list(b.iterdir()) == [] for b in backing), [list(b.iterdir()) for b in backing]
    _, out = recorder(tmp_path, "cancel")
    r = _submit(pbs_env, tmp_path, where, venv / "bin" / "python", str(script), str(out), "sleep", wait=False)
    assert r.returncode == 0, r.stderr
    job = submitted(r.stderr)
    deadline = time.monotonic() + 180
    while len(list(out.glob("rank-*.json"))) < 4:
        assert time.monotonic() < deadline, "the 4 ranks did not start within 180 s"
        time.sleep(0.5)
    held = [b for b in backing if any(p.name == f"slurmlaunch-stage-{job.split('.')[0]}" for p in b.iterdir())]
    assert len(held) == 2, [list(b.iterdir()) for b in backing]  # a copy on each of the job's 2 hosts
    c = run_cli("cancel", job, env=pbs_env, cwd=tmp_path)
    assert c.returncode == 0, c.stderr
    deadline = time.monotonic() + 90
    while any(list(b.iterdir()) for b in backing):
        assert time.monotonic() < deadline, ([list(b.iterdir()) for b in backing], _output(tmp_path, job)[-3000:])
        time.sleep(0.5)


@pytest.mark.parametrize("node_local", ["8k"], indirect=True)
def test_pbs_too_small_node_local_space_is_one_line(pbs_env: dict[str, str], tmp_path: Path,
                                                    node_local: tuple[Path, list[Path]]) -> None:
    where, _ = node_local
    venv = _small_venv(tmp_path)
    script, out = recorder(tmp_path)
    r = _submit(pbs_env, tmp_path, where, venv / "bin" / "python", str(script), str(out))
    job = submitted(r.stderr)
    assert r.returncode == 1, r.stdout + r.stderr
    said = [ln for ln in r.stderr.splitlines() if "no rank was started" in ln]  # --wait: the failure's line
    assert len(said) == 1 and "1 more node(s)" in said[0], r.stderr
    each = [ln for ln in _output(tmp_path, job).splitlines() if ln.endswith(" short")]  # each host's own line
    assert sorted(re.search(r"node (node\d):", ln)[1] for ln in each) == sorted(  # type: ignore[index]
        re.findall(r"(node\d)/0\*2", r.stderr)), (each, r.stderr)
    assert re.search(rf"node node\d: the node-local directory {re.escape(str(where))} has \S+ \w+ free, staging "
                     r"the environment needs \S+ \w+ \(its unpacked copy\): \S+ \w+ short", said[0]), said[0]
    assert "Fix: set SLURMLAUNCH_STAGE_DIR (--env) to a larger node-local directory" in said[0]
    assert list(out.iterdir()) == [] and not list((tmp_path / "slurmlaunch-logs").glob("*.stage*"))
    r = _submit(pbs_env, tmp_path, where, venv / "bin" / "python", str(script), str(out),
                stage="--stage-env=fallback")
    job = submitted(r.stderr)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "running from the shared copy (--stage-env fallback)" in _output(tmp_path, job)
    assert {rec["prefix"] for rec in _records(out)} == {str(venv)}
