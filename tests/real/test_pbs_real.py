"""PBS end to end against a real OpenPBS 23.06 (the session's 3-host PBS dev cluster, tests/conftest.py
pbs_cluster): the rendered script through the real qsub, ranks started by Debian's Open MPI (no `tm`) over
pbs_tmrsh, status/logs/list/cancel/--wait from the real qstat -x -f -F json and qdel, fail-fast.

The oracle is the server itself: what its qstat prints for each job, the ranks' own view of their variables,
the kernel's (a rank's pid is gone after qdel). The tests run as root, so every job gets Open MPI's two
run-as-root variables through --env (PBS passes nothing else from the submitting shell).
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from slurmlaunch.schedulers import pbs
from tests.helpers import SLEEPER, alive, run_cli, teardown_abort_only, wait_for_files

pytestmark = pytest.mark.pbs

AS_ROOT = ["--env", "OMPI_ALLOW_RUN_AS_ROOT=1", "--env", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"]

# A few DDP steps on gloo; every rank prints what it was given and a digest of its final parameters.
DDP = """
import hashlib, os, socket
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(rank)  # different data on every rank: equal parameters come from the all-reduce alone
model = DDP(torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(5):
    opt.zero_grad()
    model(torch.randn(16, 8)).pow(2).mean().backward()
    opt.step()
digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()[:16]
# one write: the launcher runs python -u, so print() writes each piece apart, and mpiexec tags each piece
line = " ".join(["RANKINFO", os.environ["RANK"], os.environ["LOCAL_RANK"], os.environ["WORLD_SIZE"],
                 os.environ["MASTER_ADDR"], socket.gethostname(), digest])
os.write(1, (line + "\\n").encode())
dist.barrier()
dist.destroy_process_group()
"""


def submitted(stderr: str) -> str:
    m = re.search(r"submitted job (\S+)", stderr)
    assert m, stderr
    return m.group(1)


def test_ddp_on_two_hosts_through_the_real_qsub(pbs_env: dict[str, str], tmp_path: Path,
                                                torch_available: None) -> None:
    """2 hosts x 2 ranks: every rank's RANK, LOCAL_RANK, WORLD_SIZE and MASTER_ADDR (the first host PBS
    gave), and the same parameters everywhere after training; --wait follows the real server's states."""
    script = tmp_path / "ddp.py"
    script.write_text(DDP)
    r = run_cli("submit", "--scheduler", "pbs", "--nodes", "2", "--tasks-per-node", "2", *AS_ROOT, "--wait",
                "--wait-timeout", "400", str(script), env=pbs_env, cwd=tmp_path, timeout=480)
    job = submitted(r.stderr)
    # torch's teardown abort after the training (docs: Teardown aborts; seen once in CI) is torch's, and named
    aborted = r.returncode != 0 and teardown_abort_only(r.stderr + r.stdout)
    assert r.returncode == 0 or aborted, r.stderr + r.stdout
    assert re.search(rf"job {re.escape(job)} RUNNING on node\d/0\*2\+node\d/0\*2", r.stderr), r.stderr
    assert aborted or f"job {job} ended COMPLETED, exit code 0" in r.stderr
    out = (tmp_path / "slurmlaunch-logs" / f"{job}.OU").read_text()  # PBS Pro's name for qsub -o DIR/
    # mpiexec --tag-output tags what it reads in one go, which may be part of a line: drop every tag
    untagged = re.sub(r"\[\d+,\d+\]<std(?:out|err)>:", "", out)
    ranks = sorted(ln.split("RANKINFO ", 1)[1].split() for ln in untagged.splitlines() if "RANKINFO " in ln)
    assert len(ranks) == 4, out
    first, second = ranks[0][4], ranks[2][4]
    assert first != second and {first, second} <= {"node1", "node2", "node3"}, ranks
    assert [r[:5] for r in ranks] == [["0", "0", "4", first, first], ["1", "1", "4", first, first],
                                      ["2", "0", "4", first, second], ["3", "1", "4", first, second]]
    assert len({r[5] for r in ranks}) == 1, ranks  # identical final parameters on every rank
    # --wait showed the job's one output as PBS wrote it in place (-k doe), after the id submit prints
    # (the batch step's own lines in it, "slurmlaunch: ...", go to --wait's stderr)
    assert r.stdout == f"{job}\n" + "".join(ln for ln in out.splitlines(keepends=True)
                                            if not ln.startswith("slurmlaunch: ")), r.stdout
    st = run_cli("status", job, "--json", env=pbs_env, cwd=tmp_path)
    info = json.loads(st.stdout)
    assert aborted or (info["state"], info["exit_code"]) == ("COMPLETED", 0), info


def test_status_logs_list_and_cancel_of_a_running_job(pbs_env: dict[str, str], tmp_path: Path) -> None:
    """A running job is RUNNING on its hosts; logs shows its ranks' lines as they come (-k doe); list names
    it; cancel is the real qdel, after which the job reads CANCELLED (PBS itself says Exit_status 0,
    substate 91) and its ranks are gone."""
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER + "\n")
    r = run_cli("submit", "--scheduler", "pbs", "--nodes", "2", "--tasks-per-node", "2", *AS_ROOT, str(script),
                str(tmp_path), "-1", "0", env=pbs_env, cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    job = submitted(r.stderr)
    try:
        pids = [int(p.read_text()) for p in wait_for_files(tmp_path, "pid-*", 4, timeout=180)]
    except AssertionError:
        subprocess.run(["qdel", job], env=pbs_env, timeout=60)  # not left holding the hosts for later tests
        raise
    st = json.loads(run_cli("status", job, "--json", env=pbs_env, cwd=tmp_path).stdout)
    assert st["state"] == "RUNNING" and st["exit_code"] is None and re.fullmatch(r"node\d/0\*2\+node\d/0\*2",
                                                                                 st["nodes"]), st
    # status names the job as qsub and qstat do, whichever spelling named it; its elapsed time is counted from
    # the server's stime (resources_used.walltime stays 00:00:00 until the MoM polls the job)
    raw = _raw(pbs_env, job)
    started = time.mktime(time.strptime(" ".join(str(raw["stime"]).split()), "%a %b %d %H:%M:%S %Y"))
    while time.time() - started < 2:  # at least 2 s in: never 00:00:00 (bounded: the job runs already)
        time.sleep(0.2)
    before = time.time()
    text = run_cli("status", job.split(".", 1)[0], env=pbs_env, cwd=tmp_path).stdout
    after = time.time()
    m = re.fullmatch(rf"job {re.escape(job)} \(pbs\): RUNNING on {re.escape(st['nodes'])}, elapsed "
                     r"(\d\d):(\d\d):(\d\d)\n", text)
    assert m, (text, raw.get("resources_used"))
    shown = int(m[1]) * 3600 + int(m[2]) * 60 + int(m[3])
    assert int(before - started) <= shown <= after - started + 1, (text, raw["stime"], before, after)
    listed = json.loads(run_cli("list", "--json", env=pbs_env, cwd=tmp_path).stdout)
    assert [(row["job_id"], row["scheduler"]) for row in listed] == [(job, "pbs")], listed
    cancel = run_cli("cancel", job, env=pbs_env, cwd=tmp_path)
    assert cancel.returncode == 0 and f"cancelled job {job}" in cancel.stdout, cancel.stderr
    deadline = time.monotonic() + 120
    while True:
        st = json.loads(run_cli("status", job, "--json", env=pbs_env, cwd=tmp_path).stdout)
        if st["state"] not in ("RUNNING", "COMPLETING"):
            break
        assert time.monotonic() < deadline, f"job {job} still {st['state']} 120 s after qdel"
        time.sleep(0.5)
    raw = json.loads(subprocess.run(["qstat", "-x", "-f", "-F", "json", job], env=pbs_env, capture_output=True,
                                    text=True, timeout=60).stdout)["Jobs"][job]
    assert (raw["job_state"], raw["substate"], raw.get("Exit_status", 0)) == ("F", 91, 0), raw
    assert st["state"] == "CANCELLED" and st["exit_code"] != 0, st  # never a success
    deadline = time.monotonic() + 60
    while any(alive(p) for p in pids):
        assert time.monotonic() < deadline, "a rank outlived qdel by 60 s"
        time.sleep(0.2)
    logs = run_cli("logs", job, env=pbs_env, cwd=tmp_path)
    assert logs.returncode == 0, logs.stderr


def test_a_failing_rank_ends_the_job_with_its_code_naming_rank_and_host(pbs_env: dict[str, str],
                                                                         tmp_path: Path) -> None:
    """Rank 2 (the second host's first) exits 7 once all four run: mpiexec stops the rest, the job ends
    with 7, and --wait says which rank on which host."""
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER + "\n")
    start = time.monotonic()
    r = run_cli("submit", "--scheduler", "pbs", "--nodes", "2", "--tasks-per-node", "2", *AS_ROOT, "--wait",
                "--wait-timeout", "200", str(script), str(tmp_path), "2", "7", env=pbs_env, cwd=tmp_path,
                timeout=300)
    job = submitted(r.stderr)
    assert r.returncode == 7, r.stderr
    assert time.monotonic() - start < 200
    raw = json.loads(subprocess.run(["qstat", "-x", "-f", "-F", "json", job], env=pbs_env, capture_output=True,
                                    text=True, timeout=60).stdout)["Jobs"][job]
    second = raw["exec_host"].split("+")[1].split("/")[0]
    assert f"slurmlaunch: rank 2 on {second} failed first with exit code 7; the other ranks were stopped" in r.stderr
    assert f"job {job} ended FAILED, exit code 7" in r.stderr
    pids = [int(p.read_text()) for p in tmp_path.glob("pid-*")]
    assert len(pids) == 4 and not any(alive(p) for p in pids)


def test_a_rank_aborted_after_its_script_returned_is_named(pbs_env: dict[str, str], tmp_path: Path) -> None:
    """torch's teardown abort (docs: Teardown aborts) as the real mpiexec reports it: rank 3 (on the second
    host) finishes its script, then SIGABRT ends it at interpreter exit; the job fails with 134, and --wait
    names the rank, its host, and that it died after its script returned (the runner's mark, across hosts)."""
    script = tmp_path / "aborts.py"
    script.write_text("import atexit, os\nif os.environ['RANK'] == '3':\n    atexit.register(os.abort)\n")
    r = run_cli("submit", "--scheduler", "pbs", "--nodes", "2", "--tasks-per-node", "2", *AS_ROOT, "--wait",
                "--wait-timeout", "200", str(script), env=pbs_env, cwd=tmp_path, timeout=300)
    job = submitted(r.stderr)
    assert r.returncode == 134, r.stderr
    second = re.search(r"rank 3 on (node\d) failed first with exit code 134 \(killed by SIGABRT\)", r.stderr)
    assert second, r.stderr
    assert f"job {job} ended FAILED, exit code 134" in r.stderr, r.stderr
    # the job's output as PBS kept it ends with the batch step's word on the abort, which --wait says on stderr
    assert "slurmlaunch: rank 3 aborted in torch's teardown after the script returned" in r.stderr, r.stderr
    out = (tmp_path / "slurmlaunch-logs" / f"{job}.OU").read_text()
    assert "slurmlaunch: rank 3 aborted in torch's teardown after the script returned" in out, out
    assert teardown_abort_only(r.stderr + r.stdout)


def test_roots_job_without_open_mpis_consent_says_why(pbs_env: dict[str, str], tmp_path: Path) -> None:
    """Root's job without the two OMPI_ALLOW_RUN_AS_ROOT variables: submit warns, the real mpiexec refuses at
    once (exit 1, no rank started), and --wait names that refusal, with the fix, as the job's failure."""
    script = tmp_path / "never.py"
    script.write_text("raise SystemExit(5)\n")  # never runs: a 5 would mean a rank did
    r = run_cli("submit", "--scheduler", "pbs", "--nodes", "1", "--wait", "--wait-timeout", "200", str(script),
                env=pbs_env, cwd=tmp_path, timeout=300)
    job = submitted(r.stderr)
    assert r.returncode == 1, r.stderr
    assert "slurmlaunch: this job is root's: Open MPI's mpiexec starts no rank as root" in r.stderr
    line = "slurmlaunch: mpiexec refused to start the ranks as root (Open MPI's run-as-root protection; no rank " \
           "ran). Fix: add --env OMPI_ALLOW_RUN_AS_ROOT=1 --env OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 to slurmlaunch " \
           "submit, or submit as a user other than root"
    ended = f"slurmlaunch: job {job} ended FAILED, exit code 1"
    assert f"{line}\n" in r.stderr and ended in r.stderr, r.stderr
    assert r.stderr.index(line) < r.stderr.index(ended), r.stderr  # (the follower's state lines may come between)
    assert "mpiexec has detected an attempt to run as root." in r.stdout, r.stdout  # Open MPI's own words


def _qsub(env: dict[str, str], tmp_path: Path, *args: str) -> str:
    r = subprocess.run(["qsub", "-j", "oe", "-o", f"{tmp_path}/", *args], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def _raw(env: dict[str, str], job: str) -> dict[str, object]:
    out = subprocess.run(["qstat", "-x", "-f", "-F", "json", job], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout)["Jobs"][job])


def _until(env: dict[str, str], job: str, done: object, timeout: float = 120) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    while True:
        raw = _raw(env, job)
        if done(raw):  # type: ignore[operator]
            return raw
        assert time.monotonic() < deadline, f"{job}: still {raw.get('job_state')}/{raw.get('substate')}"
        time.sleep(0.3)


def test_every_state_the_server_showed_maps(pbs_env: dict[str, str], tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Jobs put in each state and substate this server was seen in, read with the real qstat both raw and
    through the PBS edge: queued (never runnable) and held are PENDING, running RUNNING, exit 7 FAILED 7,
    killed by a signal FAILED 128+N, past its walltime TIMEOUT, qdel'd (running or held) CANCELLED."""
    monkeypatch.setenv("PATH", pbs_env["PATH"])  # the edge runs qstat itself
    queued = _qsub(pbs_env, tmp_path, "-l", "select=4:ncpus=1", "-l", "place=scatter", "--", "/bin/true")
    held = _qsub(pbs_env, tmp_path, "-h", "--", "/bin/true")
    running = _qsub(pbs_env, tmp_path, "--", "/bin/sleep", "300")
    seven = _qsub(pbs_env, tmp_path, "--", "/bin/sh", "-c", "exit 7")
    killed = _qsub(pbs_env, tmp_path, "--", "/bin/sh", "-c", "kill -9 $$")
    late = _qsub(pbs_env, tmp_path, "-l", "walltime=00:00:02", "--", "/bin/sleep", "300")
    fine = _qsub(pbs_env, tmp_path, "--", "/bin/true")
    seen = {}
    for job, done in [(queued, lambda r: "Can Never Run" in str(r.get("comment", ""))),
                      (held, lambda r: r["job_state"] == "H"), (running, lambda r: r["substate"] == 42),
                      (seven, lambda r: r["job_state"] == "F"), (killed, lambda r: r["job_state"] == "F"),
                      (late, lambda r: r["job_state"] == "F"), (fine, lambda r: r["job_state"] == "F")]:
        raw = _until(pbs_env, job, done)
        seen[job] = (raw["job_state"], raw["substate"], raw.get("Exit_status"), pbs.status(job))
    subprocess.run(["qdel", running, held, queued], env=pbs_env, check=True, timeout=60)
    for job in (running, held, queued):
        raw = _until(pbs_env, job, lambda r: r["job_state"] == "F")
        seen[f"{job} after qdel"] = (raw["job_state"], raw["substate"], raw.get("Exit_status"), pbs.status(job))
    got = {k: (s, sub, code, st.state, st.exit_code) for k, (s, sub, code, st) in seen.items()}
    assert got == {
        queued: ("Q", 10, None, "PENDING", None),
        held: ("H", 20, None, "PENDING", None),
        running: ("R", 42, None, "RUNNING", None),
        seven: ("F", 93, 7, "FAILED", 7),
        killed: ("F", 93, 265, "FAILED", 137),  # 256 + SIGKILL: the job script itself was killed
        late: ("F", 93, -29, "TIMEOUT", 1),  # JOB_EXEC_KILL_WALLTIME
        fine: ("F", 92, 0, "COMPLETED", 0),
        f"{running} after qdel": ("F", 91, 0, "CANCELLED", 1),  # PBS says 0: never read as a success
        f"{held} after qdel": ("F", 91, None, "CANCELLED", 1),
        f"{queued} after qdel": ("F", 91, None, "CANCELLED", 1),
    }, got
    assert seen[running][3].nodes and seen[running][3].nodes.startswith("node")
    assert seen[queued][3].note == "PBS's comment: Can Never Run: Not enough total nodes available", seen[queued]
