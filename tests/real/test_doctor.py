"""slurmlaunch doctor: site checks and the probe job on the real cluster; submission adapting to them."""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from slurmlaunch.allocation.probe import Finding, GpuView, RankReport, TorchFinding
from slurmlaunch.app.doctor.command import (
    Check,
    DoctorReport,
    Partition,
    choose_gpu_flag,
    gpus_per_node,
    render_table,
    slurm_version,
)
from slurmlaunch.app.doctor.probe import MissingReport, ProbeJob, gpu_problem, probe_job, rank_rows
from tests import ports
from tests.helpers import no_slurm_env, run_cli


def test_pure_parts() -> None:
    assert slurm_version("slurm 22.05.8") == (22, 5) and slurm_version("slurm-wlm 23.11.4") == (23, 11)
    assert slurm_version("nonsense") is None
    assert choose_gpu_flag(True, True) == "gpus-per-node" and choose_gpu_flag(False, True) == "gres"
    assert choose_gpu_flag(False, False) is None
    assert [gpus_per_node(g) for g in ("gpu:4", "gpu:a100:8(S:0-1)", "(null)", "gpu:h100:4,nvme:1")] == \
        ["4", "8", "0", "4"]
    assert render_table(["a", "bb"], [["xxx", "y"]]) == "a    bb\nxxx  y\n"


def test_without_slurm_it_says_what_is_missing(tmp_path: Path) -> None:
    r = run_cli("doctor", env=no_slurm_env(tmp_path), cwd=tmp_path)
    assert r.returncode == 1 and "commands  fail   missing: sbatch, srun" in r.stdout and not r.stderr
    r = run_cli("doctor", "--allocate", "0", env=no_slurm_env(tmp_path), cwd=tmp_path)
    assert r.returncode == 2 and "--allocate 0 is not valid" in r.stderr


def test_an_installed_client_without_a_cluster_is_said_in_words(tmp_path: Path) -> None:
    """Debian's real scontrol with no slurm.conf, SLURM_CONF or DNS SRV record: doctor says what that means."""
    scontrol = shutil.which("scontrol")
    if scontrol is None or Path("/etc/slurm/slurm.conf").exists():
        pytest.skip("needs Slurm's clients installed and no cluster configured on this machine")
    env = {k: v for k, v in no_slurm_env(tmp_path).items() if k != "SLURM_CONF"}
    env["PATH"] += f":{Path(scontrol).parent}"
    r = run_cli("doctor", env=env, cwd=tmp_path)
    assert r.returncode == 1 and "controller  fail   no Slurm cluster is configured here" in r.stdout, r.stdout


@pytest.mark.slurm
def test_site_checks_and_what_they_teach_submit(cluster_env: dict[str, str], tmp_path: Path) -> None:
    env = dict(cluster_env)
    r = run_cli("doctor", env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "cluster: sltest" in r.stdout and "--gpus-per-node=N accepted; submit uses it" in r.stdout
    assert "slurm-wlm 22.05.8: srun no longer inherits --cpus-per-task" in r.stdout
    assert [line.split()[:3] for line in r.stdout.splitlines() if line.startswith(("debug", "first"))] == \
        [["debug*", "up", "4"], ["first", "up", "1"]]
    site = json.loads((tmp_path / "state/slurmlaunch/site.json").read_text())
    assert site["sltest"]["gpu_flag"] == "gpus-per-node"
    # a site where doctor found --gpus-per-node refused: submit switches to --gres, unless told otherwise
    site["sltest"]["gpu_flag"] = "gres"
    (tmp_path / "state/slurmlaunch/site.json").write_text(json.dumps(site))
    (tmp_path / "t.py").write_text("")
    r = run_cli("submit", "--gpus-per-node", "2", "--dry-run", "t.py", env=env, cwd=tmp_path)
    assert r.returncode == 0 and "#SBATCH --gres=gpu:2" in r.stdout, r.stderr
    assert "requesting GPUs with --gres (slurmlaunch doctor found that cluster sltest wants it" in r.stderr
    r = run_cli("submit", "--gpus-per-node", "2", "--gpu-flag", "gpus-per-node", "--dry-run", "t.py", env=env,
                cwd=tmp_path)
    assert "#SBATCH --gpus-per-node=2" in r.stdout and "requesting GPUs" not in r.stderr


@pytest.mark.slurm
def test_probe_job_on_two_nodes(netns_cluster_env: dict[str, str], tmp_path: Path, torch_available: None) -> None:
    """On the networked cluster: node1 resolves to its own address on every node, rank 0's port is reached
    over the bridge."""
    env = dict(netns_cluster_env)
    r = run_cli("doctor", "--allocate", "2", "--gpus-per-node", "2", "--timeout", "120", "--json", env=env,
                cwd=tmp_path, timeout=180)
    report = json.loads(r.stdout)
    # the dev cluster's GPUs are /dev/null stand-ins: torch sees no CUDA, and doctor says the site cannot serve it
    assert r.returncode == 1 and [p.split(" see no CUDA")[0] for p in report["problems"]] == [
        "--gpus-per-node 2 was asked for, but rank(s) 0, 1, 2, 3"], r.stdout + r.stderr
    ranks = sorted(report["ranks"], key=lambda x: x["rank"])
    assert [(x["rank"], x["host"], x["gpus"]["CUDA_VISIBLE_DEVICES"], x["gpus"]["local_device"]) for x in ranks] == [
        (0, "node1", "0,1", "0"), (1, "node1", "0,1", "1"), (2, "node2", "0,1", "0"), (3, "node2", "0,1", "1")]
    assert all(x["resolve"]["ok"] and x["port"]["ok"] and x["torch"]["ok"] for x in ranks)
    addresses = {x["resolve"]["detail"] for x in ranks}
    assert len(addresses) == 1 and not ipaddress.ip_address(addresses.pop()).is_loopback, ranks
    assert ranks[0]["port"]["detail"].endswith("all 3 other ranks connected")
    assert "torch 2.13.0" in ranks[1]["torch"]["detail"] and ranks[1]["master_addr"] == "node1"


@pytest.mark.slurm
def test_probe_reports_an_unresolvable_master_within_its_bound(cluster_env: dict[str, str], tmp_path: Path) -> None:
    env = dict(cluster_env, MASTER_ADDR="no-such-host.invalid")
    r = run_cli("doctor", "--allocate", "2", "--timeout", "40", env=env, cwd=tmp_path, timeout=120)
    assert r.returncode == 1, r.stdout + r.stderr
    rows = [line for line in r.stdout.splitlines() if line[:1].isdigit()]
    assert len(rows) == 2 and all("FAIL no-such-host.invalid -> does not resolve" in row for row in rows)
    assert "of 1 other ranks connected before the timeout" in rows[0] and "skipped" in rows[1]


def test_probe_rank_is_bounded_by_its_budget_torchs_import_included(tmp_path: Path) -> None:
    """The probe's rank 0, whom no other rank reaches, with a torch whose import never ends: it reports within
    its budget, the import named as what did not finish. (Before, the import came after the port's wait: a
    loaded machine's slow import took the probe job past doctor's --timeout, seen in CI beside two busy loops.)"""
    fake = tmp_path / "fake" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("import time\ntime.sleep(600)\n")
    out = tmp_path / "out"
    out.mkdir()
    env = dict(os.environ, PYTHONPATH=str(fake.parent), RANK="0", LOCAL_RANK="0", WORLD_SIZE="2",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(ports.port()), SLURMLAUNCH_PROBE_TIMEOUT="2")
    r = subprocess.run([sys.executable, "-m", "slurmlaunch.allocation.probe", str(out)], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=60)  # 600 s without the bound
    assert r.returncode == 0, r.stderr
    report = RankReport.from_json(json.loads((out / "rank-0.json").read_text()))
    assert report.torch == TorchFinding(False, "import torch did not finish within the probe's 2s (a slow file "
                                                "system?)"), report
    assert report.port.detail.endswith("0 of 1 other ranks connected before the timeout"), report


def _report(rank: int, torch: TorchFinding) -> RankReport:
    return RankReport(rank, str(rank), "node1", "node1", 29500, Finding(True, "10.0.0.1"),
                      Finding(True, "reached node1:29500"), GpuView("0", 1, "0"), Finding(True, "python 3.11"), torch)


def test_gpu_problem_names_the_ranks_without_cuda() -> None:
    seen = _report(0, TorchFinding(True, "torch 2", cuda=True, devices=1))
    blind = _report(1, TorchFinding(True, "torch 2", cuda=False))
    no_torch = _report(2, TorchFinding(False, "import torch failed"))
    missing = MissingReport(3, "no report")
    assert gpu_problem([seen, blind, no_torch, missing], 0) is None  # no GPU asked for: nothing to serve
    assert gpu_problem([seen], 4) is None
    problem = gpu_problem([seen, blind, no_torch, missing], 4)
    assert problem is not None and problem.startswith("--gpus-per-node 4 was asked for, but rank(s) 1, 2 see no")


def test_reports_cross_as_the_json_they_always_were() -> None:
    """The rank's file and `doctor --json` keep their shape; from_json reads back what to_json wrote."""
    ok = _report(0, TorchFinding(True, "torch 2", cuda=True, devices=1, import_s=0.5))
    failed = _report(1, TorchFinding(False, "import torch failed: ImportError: x"))
    assert ok.to_json() == {
        "rank": 0, "local_rank": "0", "host": "node1", "master_addr": "node1", "master_port": 29500,
        "resolve": {"ok": True, "detail": "10.0.0.1"}, "port": {"ok": True, "detail": "reached node1:29500"},
        "gpus": {"CUDA_VISIBLE_DEVICES": "0", "dev": 1, "local_device": "0"},
        "python": {"ok": True, "detail": "python 3.11"},
        "torch": {"ok": True, "detail": "torch 2", "cuda": True, "devices": 1, "import_s": 0.5}}
    assert failed.to_json()["torch"] == {"ok": False, "detail": "import torch failed: ImportError: x"}
    for report in (ok, failed):
        assert RankReport.from_json(json.loads(json.dumps(report.to_json()))) == report
    rows, healthy = rank_rows([ok, MissingReport(1, "no report (see x)")])
    assert not healthy and rows[0][2] == "ok node1 -> 10.0.0.1" and rows[1][-1] == "no report (see x)"
    report = DoctorReport(None, [Check("commands", "ok", "all")], [Partition("debug*", "up", "4", "gpu:2", "8",
                                                                            "1000", "1:00:00")], "7", [ok], [])
    assert list(json.loads(report.to_json())) == ["cluster", "checks", "problems", "partitions", "probe_job", "ranks"]
    assert json.loads(report.to_json())["partitions"] == [{"partition": "debug*", "avail": "up", "nodes": "4",
                                                          "gres": "gpu:2", "cpus": "8", "memory": "1000",
                                                          "timelimit": "1:00:00"}]


def test_the_probe_job_crosses_as_json(tmp_path: Path) -> None:
    """doctor --remote renders the probe job on the laptop: the JobSpec and script come back whole."""
    job = probe_job(2, 1, "gpu", 100.0, workdir=str(tmp_path / "remote dir"), python="/opt/py/bin/python",
                    setup=("export PYTHONPATH=/x",))
    back = ProbeJob.from_json(job.to_json())
    env = back.spec.environment.env
    assert back == job and env == job.spec.environment.env and isinstance(env[0], tuple)
    assert back.spec.program.python == "/opt/py/bin/python" and back.out_dir.startswith(str(tmp_path / "remote dir"))
    assert "export PYTHONPATH=/x" in back.script and "/opt/py/bin/python" in back.script


@pytest.mark.slurm
def test_a_partition_that_does_not_exist_fails(cluster_env: dict[str, str], tmp_path: Path) -> None:
    env = dict(cluster_env)
    r = run_cli("doctor", "--partition", "nosuch", env=env, cwd=tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    row = [line for line in r.stdout.splitlines() if line.startswith("partition ")]
    assert len(row) == 1 and "fail" in row[0] and "--partition nosuch: no such partition here (known: debug, " \
        "first)" in row[0], r.stdout
    r = run_cli("doctor", "--partition", "first", env=env, cwd=tmp_path)
    assert r.returncode == 0 and "first exists" in r.stdout, r.stdout + r.stderr


@pytest.mark.slurm
def test_gpus_the_ranks_cannot_use_fail_and_the_wait_is_reported(cluster_env: dict[str, str], tmp_path: Path,
                                                                 torch_available: None) -> None:
    """The dev cluster's GPUs are /dev/null stand-ins: Slurm grants them, torch sees no CUDA device."""
    env = dict(cluster_env)
    r = run_cli("doctor", "--allocate", "1", "--gpus-per-node", "2", "--timeout", "100", env=env, cwd=tmp_path,
                timeout=180)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "FAIL: --gpus-per-node 2 was asked for, but rank(s) 0, 1 see no CUDA device" in r.stdout, r.stdout
    # between "waiting at most" and the table: the probe job's states, with the time so far
    lines = r.stderr.splitlines()
    assert "waiting at most 100s" in lines[0], r.stderr
    import re
    states = [m.group(1) for line in lines[1:] if (m := re.fullmatch(r"slurmlaunch doctor: probe job \d+ "
                                                                      r"(?:still )?([A-Z]+) after \d+s", line))]
    assert states and states[-1] == "COMPLETED" and len(states) == len(lines) - 1, r.stderr
