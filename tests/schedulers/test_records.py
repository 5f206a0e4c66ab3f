"""Job records and files: never overwritten, never followed through a planted link, a damaged index
costs only its damaged lines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from slurmlaunch.schedulers import write_private
from tests.helpers import no_slurm_env, run_cli

FAR_AHEAD = 3_000_000_000  # a local id no clock reaches soon (below 2**32, the bound on job ids)


def _state(env: dict[str, str]) -> Path:
    return Path(env["XDG_STATE_HOME"]) / "slurmlaunch"


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    e = no_slurm_env(tmp_path)
    e["XDG_STATE_HOME"] = str(tmp_path / "state")
    (tmp_path / "job.py").write_text("print('from the job')\n")
    return e


def submit(env: dict[str, str], tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("submit", "--scheduler", "local", "-o", "logs", *args, "job.py", env=env, cwd=tmp_path)


def test_write_private_never_writes_through_a_link(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    os.chmod(victim, 0o644)
    link = tmp_path / "planted"
    link.symlink_to(victim)
    with pytest.raises(FileExistsError):
        write_private(str(link), "x", exclusive=True)
    write_private(str(link), "record\n")  # replaces the link itself
    assert victim.read_text() == "precious\n" and oct(victim.stat().st_mode & 0o777) == "0o644"
    assert not link.is_symlink() and link.read_text() == "record\n"


def test_planted_links_in_the_output_dir_are_passed_over(env: dict[str, str], tmp_path: Path) -> None:
    state = _state(env)
    state.mkdir(parents=True)
    (state / "local-job-ids").write_text(f"{FAR_AHEAD}\n")
    logs = tmp_path / "logs"
    logs.mkdir(mode=0o750)
    victims = [tmp_path / "victim-record", tmp_path / "victim-log"]
    for v in victims:
        v.write_text("precious\n")
    (logs / f"job-{FAR_AHEAD + 1}.json").symlink_to(victims[0])
    (logs / f"job-{FAR_AHEAD + 2}.rank-0.log").symlink_to(victims[1])
    r = submit(env, tmp_path)
    assert r.returncode == 0, r.stderr
    assert [v.read_text() for v in victims] == ["precious\n", "precious\n"]
    job = FAR_AHEAD + 3
    assert (logs / f"job-{job}.rank-0.log").read_text() == "from the job\n"
    assert json.loads((logs / f"job-{job}.json").read_text())["job_id"] == str(job)


def test_ids_are_unique_and_the_next_job_never_touches_the_last_ones_files(env: dict[str, str],
                                                                           tmp_path: Path) -> None:
    ids = []
    for _ in range(3):
        r = submit(env, tmp_path)
        assert r.returncode == 0, r.stderr
        ids.append(json.loads(run_cli("list", "--json", env=env, cwd=tmp_path).stdout)[-1]["job_id"])
    assert len(set(ids)) == 3 and all(int(i) > 67_043_328 for i in ids)  # above any Slurm job id
    for job in ids:
        assert (tmp_path / "logs" / f"job-{job}.rank-0.log").read_text() == "from the job\n"


def test_unsafe_output_dirs_are_refused(env: dict[str, str], tmp_path: Path) -> None:
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)
    r = run_cli("submit", "--scheduler", "local", "-o", str(open_dir), "job.py", env=env, cwd=tmp_path)
    assert r.returncode == 2 and "writable by others" in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
    os.chmod(open_dir, 0o1777)  # sticky, as /tmp: others cannot replace our files
    r = run_cli("submit", "--scheduler", "local", "-o", str(open_dir), "job.py", env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    if os.geteuid() == 0:
        theirs = tmp_path / "theirs"
        theirs.mkdir()
        os.chown(theirs, 65534, 65534)
        r = run_cli("submit", "--scheduler", "local", "-o", str(theirs), "job.py", env=env, cwd=tmp_path)
        assert r.returncode == 2 and "belongs to uid 65534" in r.stderr, r.stderr


@pytest.mark.parametrize("bad", [b'{"job_id": "1", "sched', b"\xff\xfe\x00binary", b"[]", b"5",
                                 b'{"job_id": 5}', b'{"job_id": "9", "scheduler": "local"}', b"null"])
def test_a_bad_index_line_hides_nothing_else(env: dict[str, str], tmp_path: Path, bad: bytes) -> None:
    r = submit(env, tmp_path)
    assert r.returncode == 0, r.stderr
    index = _state(env) / "jobs.jsonl"
    good = index.read_bytes()
    index.write_bytes(bad + b"\n" + good + bad + b"\n")
    job = json.loads(good)["job_id"]
    listed = run_cli("list", env=env, cwd=tmp_path)
    assert listed.returncode == 0 and job in listed.stdout, listed.stderr
    assert f"skipped 2 unreadable line(s) of {index} (first: line 1)" in listed.stderr
    status = run_cli("status", job, env=env, cwd=tmp_path)
    assert status.returncode == 0 and "COMPLETED" in status.stdout, status.stderr
    assert "Traceback" not in listed.stderr + status.stderr


@pytest.mark.parametrize("record", ["/dev/zero", "/proc/self/environ", "DIR", "/nonexistent/x.json"])
def test_a_tampered_record_path_is_one_line(env: dict[str, str], tmp_path: Path, record: str) -> None:
    index = _state(env) / "jobs.jsonl"
    index.parent.mkdir(parents=True)
    path = str(tmp_path) if record == "DIR" else record
    index.write_text(json.dumps({"job_id": "77", "scheduler": "local", "record": path, "name": "x"}) + "\n")
    r = run_cli("status", "77", env=env, cwd=tmp_path, timeout=30)
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr


def test_huge_array_index_in_a_job_id_is_one_line(env: dict[str, str], tmp_path: Path) -> None:
    r = run_cli("status", "777_" + "9" * 5000, env=env, cwd=tmp_path)
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr


def test_local_files_are_not_world_readable_under_umask_0(env: dict[str, str], tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-c", "import os, sys; os.umask(0); from slurmlaunch.cli import main; "
                        "sys.exit(main(sys.argv[1:]))", "submit", "--scheduler", "local", "-o", "logs", "job.py"],
                       env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    for f in (tmp_path / "logs").iterdir():
        assert not f.stat().st_mode & 0o007, (f, oct(f.stat().st_mode))
