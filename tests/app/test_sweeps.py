"""Job arrays and parameter sweeps: the grid, validation, local runs, and a real Slurm job array."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from slurmlaunch.core.errors import SpecError
from slurmlaunch.core.spec import JobSpec, parse_array, parse_sweep
from tests.helpers import assert_refused, no_slurm_env, run_cli

# Each rank joins a real gloo world, sums the ranks, and records what it saw.
WORLD = """
import json, os, sys
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank())])
dist.all_reduce(t)
rec = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "SLURM_ARRAY_TASK_ID",
                                      "SLURM_JOB_ID")}
rec.update(argv=sys.argv[1:], sum=t.item())
tag = f"{os.environ['SLURM_ARRAY_TASK_ID']}-{os.environ['RANK']}"
with open(os.path.join(os.environ["OUT_DIR"], tag + ".json"), "w") as f:
    json.dump(rec, f)
dist.barrier()
dist.destroy_process_group()
"""

# No torch: prints what it got; fails when told to.
ECHO = """
import json, os, sys
print(json.dumps({"rank": os.environ["RANK"], "world": os.environ["WORLD_SIZE"], "port": os.environ["MASTER_PORT"],
                  "index": os.environ["SLURM_ARRAY_TASK_ID"], "argv": sys.argv[1:]}))
if "--fail=yes" in sys.argv and os.environ["RANK"] == "1":
    sys.exit(5)
"""


@pytest.mark.parametrize(("text", "expect"), [
    ("0-3", [0, 1, 2, 3]), ("7", [7]), ("1,3,5-7", [1, 3, 5, 6, 7]), ("0-15:4", [0, 4, 8, 12]),
    ("3,1,1", [1, 3]), ("0-0", [0]),
])
def test_array_indices(text: str, expect: list[int]) -> None:
    assert parse_array(text) == expect


@pytest.mark.parametrize("text", ["", "a", "3-1", "0-4:0", "1,,2", "-1", "0-3%2", "1-", "0:2"])
def test_bad_array_names_the_value(text: str) -> None:
    with pytest.raises(SpecError, match=re.escape(repr(text)) + r" is not valid \(expected indices"):
        parse_array(text)


def test_sweep_grid_order_and_values_byte_for_byte() -> None:
    spec = JobSpec.of(script="t.py", sweep=parse_sweep(["lr=0.1,0.01", "name=a b,$(x)'\"", "seed=1"]))
    assert spec.sweep_points == [
        ["--lr=0.1", "--name=a b", "--seed=1"], ["--lr=0.1", "--name=$(x)'\"", "--seed=1"],
        ["--lr=0.01", "--name=a b", "--seed=1"], ["--lr=0.01", "--name=$(x)'\"", "--seed=1"],
    ]
    assert spec.array_indices == [0, 1, 2, 3] and spec.array_directive == "0-3"


@pytest.mark.parametrize(("items", "expect"), [
    (["lr"], "--sweep 'lr' is not valid"), (["lr=0.1,,2"], "non-empty values"), (["=1,2"], "is not valid"),
    (["lr=1", "lr=2"], "--sweep lr is given twice"), (["l r=1"], "is not valid"),
])
def test_bad_sweeps(items: list[str], expect: str) -> None:
    with pytest.raises(SpecError, match=re.escape(expect)):
        parse_sweep(items)


@pytest.mark.parametrize(("kw", "expect"), [
    (dict(array="0-3", sweep=(("lr", ("1",)),)), "--array and --sweep cannot be used together"),
    (dict(max_parallel=2), "--max-parallel needs --array or --sweep"),
    (dict(array="0-3", max_parallel=0), "--max-parallel 0 is not valid"),
    (dict(array="0-3", master_port=12345), "--master-port 12345 cannot be used with --array/--sweep"),
])
def test_bad_combinations(kw: dict[str, object], expect: str, tmp_path: Path) -> None:
    assert_refused(tmp_path, expect, **kw)


def test_local_sweep_runs_every_point_in_its_own_world(tmp_path: Path) -> None:
    env = no_slurm_env(tmp_path)
    (tmp_path / "echo.py").write_text(ECHO)
    r = run_cli("submit", "--tasks-per-node", "2", "--sweep", "lr=0.1,0.01", "--sweep", "fail=no,yes",
                "echo.py", "--base", env=env, cwd=tmp_path)
    assert r.returncode == 5, r.stderr  # the first failing element's code; the others still ran
    job = re.search(r"array element (\d+)_0", r.stderr).group(1)  # type: ignore[union-attr]
    seen = {}
    # rank 1's logs: it always prints (rank 0 may be stopped before it does when rank 1 fails)
    for log in (tmp_path / "slurmlaunch-logs").glob(f"job-{job}_*.rank-1.log"):
        rec = json.loads(log.read_text().splitlines()[0])
        seen[rec["index"]] = (rec["argv"], rec["world"], rec["port"])
    assert {k: v[0] for k, v in seen.items()} == {
        "0": ["--base", "--lr=0.1", "--fail=no"], "1": ["--base", "--lr=0.1", "--fail=yes"],
        "2": ["--base", "--lr=0.01", "--fail=no"], "3": ["--base", "--lr=0.01", "--fail=yes"]}
    assert len({v[2] for v in seen.values()}) == 4 and {v[1] for v in seen.values()} == {"2"}
    st = json.loads(run_cli("status", f"{job}_2", "--json", env=env).stdout)
    assert (st["state"], st["exit_code"]) == ("COMPLETED", 0)
    st = json.loads(run_cli("status", f"{job}_1", "--json", env=env).stdout)
    assert (st["state"], st["exit_code"]) == ("FAILED", 5)
    r = run_cli("logs", job, env=env)
    assert r.returncode == 2 and f"name one, e.g. {job}_0" in r.stderr


def test_pbs_submits_arrays_as_one_job_array(tmp_path: Path) -> None:
    env = no_slurm_env(tmp_path)
    bin_dir = tmp_path / "pbs-bin"
    bin_dir.mkdir()
    # EMULATION of qsub: keeps the script it was given, prints an array job's id as PBS Pro does.
    (bin_dir / "qsub").write_text(f"#!{sys.executable}\nimport shutil, sys\n"
                                  f"shutil.copy(sys.argv[-1], {str(tmp_path / 'SUBMITTED')!r})\nprint('88[].srv')\n")
    (bin_dir / "qsub").chmod(0o755)
    (tmp_path / "t.py").write_text("")
    r = run_cli("submit", "--scheduler", "pbs", "--sweep", "lr=0.1,0.2", "t.py",
                env=dict(env, PATH=f"{bin_dir}:{env['PATH']}"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    script = (tmp_path / "SUBMITTED").read_text()
    assert "#PBS -J 0-1\n" in script and '1) point=(--lr=0.2) ;;' in script and "$PBS_ARRAY_INDEX" in script


@pytest.mark.slurm
def test_sweep_as_a_real_slurm_array(cluster_env: dict[str, str], tmp_path: Path, torch_available: None) -> None:
    (tmp_path / "world.py").write_text(WORLD)
    out = tmp_path / "out"
    out.mkdir()
    env = dict(cluster_env, XDG_STATE_HOME=str(tmp_path / "state"))
    # 2 nodes x 1 rank: still a world of several nodes per element; each rank imports torch (1.4 s of CPU)
    r = run_cli("submit", "--nodes", "2", "--tasks-per-node", "1", "--cpus-per-task", "1", "--env", f"OUT_DIR={out}",
                "--sweep", "lr=0.1,0.01", "--sweep", "name=a b,$(touch pwned)'", "--wait", "--wait-timeout", "240",
                "world.py", env=env, cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    job = r.stdout.split()[0]
    assert f"{job}_3: COMPLETED 0" in r.stderr
    recs = [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]
    assert len(recs) == 8 and all(rec["sum"] == 1.0 and rec["WORLD_SIZE"] == "2" for rec in recs)
    by_element: dict[str, set[tuple[str, str, str]]] = {}
    for rec in recs:
        by_element.setdefault(rec["SLURM_ARRAY_TASK_ID"], set()).add(
            (rec["MASTER_PORT"], rec["SLURM_JOB_ID"], json.dumps(rec["argv"])))
    assert all(len(v) == 1 for v in by_element.values())  # one world per element
    ports = {next(iter(v))[0] for v in by_element.values()}
    assert len(ports) == 4  # each element its own MASTER_PORT
    assert {json.loads(next(iter(v))[2])[1] for v in by_element.values()} == {"--name=a b", "--name=$(touch pwned)'"}
    assert not (tmp_path / "pwned").exists()
    st = json.loads(run_cli("status", job, "--json", env=env).stdout)
    assert st["state"] == "COMPLETED" and st["elements"] == {str(i): "COMPLETED 0" for i in range(4)}
    assert run_cli("status", f"{job}_2", env=env).stdout.startswith(f"job {job}_2 (slurm): COMPLETED")
    assert run_cli("logs", f"{job}_2", env=env).returncode == 0  # the element's batch log
