"""`slurmlaunch stacks` on the real OpenPBS dev cluster (tests/conftest.py pbs_cluster): a hung 2x2 gloo job
where rank 3 sleeps in a function of its own while ranks 0-2 wait in all_reduce. `stacks` reaches the ranks
by ssh to each execution host the job holds (the dev cluster's hosts run sshd, as PBS sites let a job's owner
onto its hosts), names rank 3, its host and its function, and groups the others; qdel then leaves the grouped
summary in the job's output file."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers import run_cli, wait_for_files
from tests.test_pbs_real import AS_ROOT, submitted
from tests.test_stacks import HUNG, _check_hung

pytestmark = pytest.mark.pbs


def test_pbs_hung_job_stacks_then_qdel_leaves_the_summary(pbs_env: dict[str, str], tmp_path: Path,
                                                          torch_available: None) -> None:
    (tmp_path / "hung.py").write_text(HUNG)
    r = run_cli("submit", "--scheduler", "pbs", "--nodes", "2", "--tasks-per-node", "2", *AS_ROOT, "hung.py",
                str(tmp_path), env=pbs_env, cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    job = submitted(r.stderr)
    try:
        wait_for_files(tmp_path, "sleeping", 1, timeout=240)
        st = json.loads(run_cli("status", job, "--json", env=pbs_env, cwd=tmp_path).stdout)
        second = st["nodes"].split("+")[1].split("/")[0]  # exec_host "nodeA/0*2+nodeB/0*2": rank 3 is on B
        deadline = time.monotonic() + 120
        while True:  # ranks 0-2 reach all_reduce soon after rank 3 sleeps; their stack says when
            start = time.monotonic()
            s = run_cli("stacks", job, "--json", env=pbs_env, cwd=tmp_path, timeout=180)
            took = time.monotonic() - start
            assert s.returncode == 0, s.stderr
            data = json.loads(s.stdout)
            if len(data["groups"]) == 2 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        print(f"stacks at 2x2 on the PBS dev cluster: {took:.2f}s (collection {data['seconds']}s)")
        assert data["live"] is True
        _check_hung(data, second)
        text = run_cli("stacks", job, env=pbs_env, cwd=tmp_path, timeout=180).stdout
        assert f"rank 3 on {second}: hung.py:6 in load_batch" in text.splitlines()[1], text
        c = run_cli("cancel", job, env=pbs_env, cwd=tmp_path, timeout=120)
        assert c.returncode == 0, c.stderr
    finally:
        subprocess.run(["qdel", job], env=pbs_env, capture_output=True, timeout=60)
    out = tmp_path / "slurmlaunch-logs" / f"{job}.OU"  # PBS Pro's name for qsub -o DIR/, staged out at the end
    deadline = time.monotonic() + 120
    while not (out.exists() and "where the ranks were" in out.read_text(errors="replace")):
        assert time.monotonic() < deadline, f"no stacks summary in {out} 120 s after qdel: " + (
            out.read_text(errors="replace")[-3000:] if out.exists() else "(no file)")
        time.sleep(0.5)
    log = out.read_text(errors="replace")
    assert f"rank 3 on {second}: hung.py:6 in load_batch: time.sleep(600)" in log, log
    assert re.search(r"ranks 0-2(?: on \S+)?: hung\.py:8 in step: dist\.all_reduce\(t\)", log), log
    after = run_cli("stacks", job, "--json", env=pbs_env, cwd=tmp_path)  # ended: what the ranks saved
    assert after.returncode == 0, after.stderr
    data = json.loads(after.stdout)
    assert data["live"] is False
    _check_hung(data, second)
