"""`submit --remote` to a PBS cluster whose login host runs the REAL qsub/qstat/qdel of the session's OpenPBS
23.06 (tests/conftest.py pbs_cluster), reached from the "laptop" through the real sshd of tests/sshd.py.

The login host is this machine's root namespace with the PBS dev cluster's client wrappers (DIR/bin: PBS's own
commands, run inside the cluster's head host) first on its PATH, given by --remote-setup as a site's `module
load pbs` would. Not a namespace host of the cluster running an sshd: the cluster's subnet is unreachable from
the root namespace by design (an `unreachable` route, so that nothing of the cluster leaks onto the machine's
network), and the laptop lives there. What differs from a real login node: the client commands run in the head
host's network namespace rather than in the login host's own. The login PATH holds no sbatch (this machine's
Slurm is in /usr/bin), so that auto must find PBS there. The script is rendered on the laptop; status, logs,
cancel and list go through the PBS edge with the ssh runner plugged in.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import sshd
from tests.helpers import SLEEPER, alive, wait_for_files
from tests.real.test_pbs_real import AS_ROOT
from tests.sshd import masters_left, on_laptop


def login_path(where: Path, pbs_env: dict[str, str]) -> list[str]:
    """The --remote-setup line that makes the login host's PATH the PBS clients and a few basics (no sbatch),
    and the ranks' interpreter there."""
    bin_dir = sshd.login_bin(where, {}, basics=("mkdir", "cat", "nsenter"))
    # the ranks' python3, which submit checks there (it runs, and is >= 3.10) before qsub
    (bin_dir / "python3").write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
    (bin_dir / "python3").chmod(0o755)
    pbs_bin = pbs_env["PATH"].split(":", 1)[0]
    return ["--remote-setup", f"export PATH={pbs_bin}:{bin_dir}", *AS_ROOT, "--python", sys.executable]


def qstat(pbs_env: dict[str, str], job: str) -> dict[str, object]:
    out = subprocess.run(["qstat", "-x", "-f", "-F", "json", job], env=pbs_env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout)["Jobs"][job])


@pytest.mark.pbs
def test_pbs_job_from_the_laptop(laptop: sshd.Laptop, pbs_env: dict[str, str], tmp_path: Path) -> None:
    """auto chooses PBS there (qsub on its PATH, no sbatch), the qsub script rendered here reaches the real
    qsub on its stdin (the server's job has the name, the -o directory and the resources it asked for), its
    ranks run on two hosts; status, list, logs and cancel (the real qdel) from the laptop; the job then reads
    CANCELLED and its ranks are gone."""
    setup = login_path(tmp_path, pbs_env)
    project = tmp_path / "proj"
    project.mkdir()
    (project / "sleeper.py").write_text(SLEEPER + "\n")
    remote_dir = tmp_path / "cluster" / "proj"
    out = tmp_path / "out"
    out.mkdir()
    name = "pbs-1.x+y_z"  # every kind of character the real qsub takes in a name ("$(" it refuses, as we do)
    args = [*setup, "--nodes", "2", "--tasks-per-node", "2", f"--job-name={name}", "sleeper.py", str(out), "-1",
            "0"]
    shown = on_laptop(laptop, "submit", "--remote", f"login:{remote_dir}", "--dry-run", *args, cwd=project)
    assert shown.returncode == 0, shown.stderr
    chose = "auto chose pbs on login (qsub is on its PATH and sbatch is not)"
    assert chose in shown.stderr, shown.stderr  # said once: the first time auto chose for that destination
    r = on_laptop(laptop, "submit", "--remote", f"login:{remote_dir}", *args, cwd=project)
    assert r.returncode == 0, r.stderr
    assert chose not in r.stderr, r.stderr  # the same choice again: not said again
    job = r.stdout.strip()
    assert re.fullmatch(r"\d+\.head", job), job
    short = job.split(".", 1)[0]
    logs = remote_dir / "slurmlaunch-logs"
    try:
        pids = [int(p.read_text()) for p in wait_for_files(out, "pid-*", 4, timeout=180)]
        raw = qstat(pbs_env, job)
        assert raw["Job_Name"] == name and raw["Submit_arguments"] == f"-N {name} -o {logs}/", raw  # stdin
        assert raw["Resource_List"]["select"] == "2:ncpus=2:mpiprocs=2", raw  # type: ignore[index]
        assert not (logs / f"job-{short}.qsub").exists()  # nothing but the server holds the script
        assert f"cd {remote_dir} || exit 2" in shown.stdout and logs.stat().st_mode & 0o077 == 0

        st = on_laptop(laptop, "status", short, "--json", cwd=project)
        assert st.returncode == 0, st.stderr
        info = json.loads(st.stdout)
        assert (info["state"], info["scheduler"], info["remote"]) == ("RUNNING", "pbs", "login"), info
        assert info["nodes"] == raw["exec_host"] and re.fullmatch(r"node\d/0\*2\+node\d/0\*2", info["nodes"]), info
        row = json.loads(on_laptop(laptop, "list", "--json", cwd=project).stdout)[-1]
        assert (row["job_id"], row["state"], row["directory"]) == (job, "RUNNING", f"login:{logs}"), row
        lg = on_laptop(laptop, "logs", short, cwd=project)  # -k doe: the job's output file is there already
        assert lg.returncode == 0, lg.stderr
        c = on_laptop(laptop, "cancel", short, cwd=project)
        assert c.returncode == 0 and f"cancelled job {short}" in c.stdout, c.stdout + c.stderr
    finally:
        subprocess.run(["qdel", job], env=pbs_env, capture_output=True, timeout=60)
    deadline = time.monotonic() + 120
    while True:
        info = json.loads(on_laptop(laptop, "status", short, "--json", cwd=project).stdout)
        if info["state"] not in ("RUNNING", "COMPLETING"):
            break
        assert time.monotonic() < deadline, f"job {job} still {info['state']} 120 s after qdel"
        time.sleep(0.5)
    assert (info["state"], info["exit_code"]) == ("CANCELLED", 1), info  # PBS says Exit_status 0: never a success
    assert (qstat(pbs_env, job)["substate"]) == 91
    deadline = time.monotonic() + 60
    while any(alive(p) for p in pids):
        assert time.monotonic() < deadline, "a rank outlived the cancel from the laptop by 60 s"
        time.sleep(0.2)
    assert masters_left(laptop) == []


@pytest.mark.pbs
def test_doctor_from_the_laptop_allocates_on_the_real_pbs(laptop: sshd.Laptop, pbs_env: dict[str, str],
                                                          tmp_path: Path, torch_available: None) -> None:
    """doctor --remote --allocate 2 with auto: PBS is chosen on the login host (qsub on its PATH, no sbatch), its
    PBS checks run there, and the probe job rendered here as a qsub script runs on two hosts of the real server."""
    setup = [a for a in login_path(tmp_path, pbs_env) if not a.startswith(("--env", "OMPI_"))]
    env = {**laptop.env, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}  # read here
    r = subprocess.run([sys.executable, "-m", "slurmlaunch", "doctor", "--remote", f"login:{tmp_path / 'proj'}",
                        *setup, "--allocate", "2", "--timeout", "240", "--json"], capture_output=True, text=True,
                       env=env, cwd=tmp_path, timeout=300, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr + r.stdout
    assert "--scheduler auto chose pbs on login" in r.stderr, r.stderr
    report = json.loads(r.stdout)
    checks = {c["name"]: c["state"] for c in report["checks"]}
    assert checks["commands"] == checks["server"] == checks["queue"] == "ok", report["checks"]
    assert re.fullmatch(r"\d+\.head", str(report["probe_job"])), report
    assert [rank["rank"] for rank in report["ranks"]] == [0, 1], report["ranks"]
    assert len({rank["host"] for rank in report["ranks"]}) == 2, report["ranks"]
    assert masters_left(laptop) == []


@pytest.mark.pbs
def test_pbs_wait_from_the_laptop_names_the_failing_rank_and_returns_its_code(
        laptop: sshd.Laptop, pbs_env: dict[str, str], tmp_path: Path) -> None:
    """--scheduler pbs named (no `command -v`), --wait from the laptop follows the real server's states and
    ends with the failing rank's exit code; the job's failure line on the login host names the rank and its
    host (the laptop's --wait does not show it: it reads no file over ssh, under Slurm neither)."""
    setup = login_path(tmp_path, pbs_env)
    (tmp_path / "sleeper.py").write_text(SLEEPER + "\n")
    out = tmp_path / "out"
    out.mkdir()
    r = on_laptop(laptop, "submit", "--remote", f"login:{tmp_path / 'cluster'}", "--scheduler", "pbs", *setup,
                  "--nodes", "2", "--tasks-per-node", "1", "--wait", "--wait-timeout", "240", "sleeper.py",
                  str(out), "1", "3", cwd=tmp_path)
    assert r.returncode == 3, r.stderr
    assert "auto chose" not in r.stderr
    job = re.search(r"submitted job (\S+)", r.stderr)
    assert job, r.stderr
    assert re.search(rf"job {re.escape(job[1])} RUNNING", r.stderr), r.stderr
    assert f"job {job[1]} ended FAILED, exit code 3" in r.stderr, r.stderr
    failure = tmp_path / "cluster" / "slurmlaunch-logs" / f"job-{job[1].split('.', 1)[0]}.failure"
    assert re.fullmatch(r"slurmlaunch: rank 1 on node\d failed first with exit code 3; the other ranks were "
                        r"stopped\n", failure.read_text()), failure.read_text()
    assert r.stderr.count(failure.read_text()) == 1, r.stderr  # --wait said it, once
    st = on_laptop(laptop, "status", job[1], cwd=tmp_path)  # and status tells the same (issue 40)
    assert st.returncode == 0 and st.stdout.splitlines()[1] == "  " + failure.read_text().strip().removeprefix(
        "slurmlaunch: "), st.stdout + st.stderr
    assert masters_left(laptop) == []


@pytest.mark.parametrize(("args", "expect"), [
    (["--array", "0-3"], "--array/--sweep"), (["--apptainer", "img.sif"], "--container-image/--apptainer"),
])
def test_what_pbs_over_ssh_does_not_do_yet_is_refused(laptop: sshd.Laptop, tmp_path: Path, args: list[str],
                                                      expect: str) -> None:
    (tmp_path / "train.py").write_text("")
    r = on_laptop(laptop, "submit", "--remote", "login:/abs/dir", "--scheduler", "pbs", "--dry-run", *args,
                  "train.py", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and expect in r.stderr, r.stderr


def test_a_login_node_without_sbatch_or_qsub_is_one_line(laptop: sshd.Laptop, tmp_path: Path) -> None:
    bin_dir = sshd.login_bin(tmp_path, {})
    (tmp_path / "train.py").write_text("")
    r = on_laptop(laptop, "submit", "--remote", "login:/abs/dir", "--remote-setup", f"export PATH={bin_dir}",
                  "--dry-run", "train.py", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "neither sbatch nor qsub" in r.stderr, r.stderr
    assert masters_left(laptop) == []


API_SCRIPT = """\
import json, os, socket, sys
import slurmlaunch

def where(tag):  # defined in __main__: it travels by value
    rank = int(os.environ["RANK"])
    print("hello from rank", rank, flush=True)
    if tag == "fail" and rank == 1:
        raise ValueError("rank one refuses: " + tag)
    return [rank, int(os.environ["WORLD_SIZE"]), os.environ["MASTER_ADDR"], socket.gethostname(), tag]

dest, setup, python, as_root = json.loads(sys.argv[1])
common = dict(remote=dest, remote_setup=setup, remote_python=python, nodes=2, tasks_per_node=1, env=as_root,
              time="00:10:00")
out = {}
job = slurmlaunch.submit(where, "x y $(id)", **common)  # auto: the login node has qsub and no sbatch
out["id"], out["values"], out["state"] = job.job_id, job.results(), job.state
out["logs"] = job.logs(rank=0)
bad = slurmlaunch.submit(where, "fail", scheduler="pbs", **common)
try:
    bad.results()
except slurmlaunch.RankFailed as e:
    out["failed"] = [type(e).__name__, e.rank, e.trace]
out["array"] = [j.results() for j in slurmlaunch.map_array(where, ["a", "b"], scheduler="pbs", **common)]
print("OUT " + json.dumps(out))
"""


@pytest.mark.pbs
def test_the_api_from_the_laptop_on_the_real_pbs(laptop: sshd.Laptop, pbs_env: dict[str, str],
                                                 tmp_path: Path) -> None:
    """slurmlaunch.submit(fn, remote=...) to the PBS login host: auto chooses PBS there, each rank's value comes
    back from its own host, a failing rank's exception reaches the laptop (RankFailed, rank 1, its
    traceback), map_array is one PBS array; the laptop's `list` and `status` know the jobs as PBS ones."""
    setup = login_path(tmp_path, pbs_env)
    path_line = setup[1]
    project = tmp_path / "notebook"
    project.mkdir()
    (project / "run.py").write_text(API_SCRIPT)
    as_root = dict(a.split("=", 1) for a in AS_ROOT[1::2])
    argv = json.dumps([f"login:{tmp_path / 'cluster'}", [path_line], sys.executable, as_root])
    r = subprocess.run(["python3", "run.py", argv], capture_output=True, text=True, env=laptop.env, cwd=project,
                       timeout=600, stdin=subprocess.DEVNULL)
    assert r.returncode == 0 and "OUT " in r.stdout, r.stdout[-2000:] + r.stderr[-3000:]
    out = json.loads(r.stdout.split("OUT ", 1)[1])
    values = out["values"]
    assert [v[:2] for v in values] == [[0, 2], [1, 2]], out
    hosts = [v[3] for v in values]
    assert len(set(hosts)) == 2 and all(v[2] == hosts[0] and v[4] == "x y $(id)" for v in values), out
    assert out["state"] == "COMPLETED" and "hello from rank 0" in out["logs"], out
    kind, rank, trace = out["failed"]
    assert (kind, rank) == ("RankFailed", 1) and "ValueError: rank one refuses: fail" in trace, trace
    assert [[v[:2] + v[4:] for v in element] for element in out["array"]] == \
        [[[0, 2, "a"], [1, 2, "a"]], [[0, 2, "b"], [1, 2, "b"]]], out["array"]
    raw = qstat(pbs_env, f"{out['id']}.head")
    assert raw["job_state"] == "F" and raw["Exit_status"] == 0, raw
    rows = {row["job_id"]: row for row in json.loads(on_laptop(laptop, "list", "--json", cwd=project).stdout)}
    assert rows and all(row["scheduler"] == "pbs" for row in rows.values()), rows
    st = json.loads(on_laptop(laptop, "status", out["id"], "--json", cwd=project).stdout)
    assert (st["scheduler"], st["state"], st["remote"]) == ("pbs", "COMPLETED", "login"), st
    assert masters_left(laptop) == []
