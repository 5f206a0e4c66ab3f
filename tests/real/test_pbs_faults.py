"""PBS faults named as Slurm's are (issue 40, part 2), on the real 3-host OpenPBS dev cluster (tests/conftest.py
pbs_cluster): a failed rank's line said once by --wait and the same by `status`; `python -u` lines whole under
mpiexec --tag-output; a qdel'd job's stack summary and which stop it was reaching --wait; a lost host named
(its ranks gone with it: Open MPI's word; its MoM alone gone: the server's); what qsub would refuse refused
at submit, in one line.

The oracle is the server and Open MPI: qstat's and pbsnodes' words, the job's output file as PBS wrote it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from slurmlaunch.app.devcluster import pbs as pbscluster
from tests.helpers import run_cli, wait_for_files
from tests.real.test_pbs_real import AS_ROOT, submitted

pytestmark = pytest.mark.pbs

# Every rank prints a line in pieces (python -u: one write() per piece), and says it is up; rank 3 exits 7.
PIECES = """
import os, sys, time
d, rank = sys.argv[1], int(os.environ["RANK"])
print("hello from", rank, "argv=" + str(sys.argv[2:]))
open(os.path.join(d, f"up-{rank}"), "w").close()
if rank == int(sys.argv[2]):
    time.sleep(1)
    sys.exit(7)
time.sleep(600)
"""


def _submit(env: dict[str, str], tmp_path: Path, nodes: int, tpn: int, *args: str, wait: bool = False,
            extra: tuple[str, ...] = ()) -> subprocess.Popen[str]:
    (tmp_path / "pieces.py").write_text(PIECES)
    return subprocess.Popen(
        [sys.executable, "-m", "slurmlaunch",
         "submit", "--scheduler", "pbs", "--nodes", str(nodes), "--tasks-per-node", str(tpn), *AS_ROOT, *extra,
         *(["--wait", "--wait-timeout", "300"] if wait else []), "pieces.py", str(tmp_path), *args],
        env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_failed_rank_is_said_once_and_status_tells_the_same(pbs_env: dict[str, str], tmp_path: Path) -> None:
    """rank 3 exits 7: --wait says its line once (the job's output, which --wait shows, holds it already),
    `status` and `status --json` name the same rank, host and code; every rank's pieces arrive as one line,
    and Open MPI's harmless setpgid warning is not there."""
    proc = _submit(pbs_env, tmp_path, 2, 2, "3", wait=True)
    out, err = proc.communicate(timeout=360)
    job = submitted(err)
    said = out + err
    m = re.search(r"slurmlaunch: (rank 3 on (node\d) failed first with exit code 7; the other ranks were stopped)\n",
                  said)
    assert m, said
    assert said.count(m[1]) == 1 and m[0] in err, said  # once, where slurmlaunch speaks
    assert proc.returncode == 7 and f"job {job} ended FAILED, exit code 7" in err, said
    for rank in range(4):  # whole lines, whatever mpiexec read in one go
        assert f"[1,{rank}]<stdout>:hello from {rank} argv=['3']\n" in out, out
    assert not re.search(r"<stdout>:[^\n]*\[\d+,\d+\]<stdout>:", out), out
    assert "setpgid" not in said, said
    st = run_cli("status", job, env=pbs_env, cwd=tmp_path)
    assert st.returncode == 0, st.stderr
    assert st.stdout.splitlines()[1:] == [f"  {m[1]}"], st.stdout
    info = json.loads(run_cli("status", job, "--json", env=pbs_env, cwd=tmp_path).stdout)
    assert (info["state"], info["exit_code"], info["failure"]) == ("FAILED", 7, m[1]), info
    host = json.loads(subprocess.run(["qstat", "-x", "-f", "-F", "json", job], env=pbs_env, capture_output=True,
                                     text=True, timeout=60, check=True).stdout)["Jobs"][job]["exec_host"]
    assert host.split("+")[1].startswith(m[2] + "/"), host  # rank 3's host is the job's second, as PBS says


def test_qdel_under_wait_shows_where_the_ranks_were_and_which_stop(pbs_env: dict[str, str], tmp_path: Path) -> None:
    """qdel of a running job followed by --wait: the batch log says it was a qdel, before the walltime, and
    --wait shows where the ranks were (PBS says the job ended a moment before the batch step says it)."""
    proc = _submit(pbs_env, tmp_path, 2, 1, "-1", wait=True, extra=("--time", "10:00", "--signal", "none"))
    try:
        wait_for_files(tmp_path, "up-*", 2, timeout=180)
        job = json.loads(run_cli("list", "--json", env=pbs_env, cwd=tmp_path).stdout)[-1]["job_id"]
        subprocess.run(["qdel", job], env=pbs_env, check=True, capture_output=True, timeout=60)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    said = out + err
    assert re.search(r"slurmlaunch: the job was stopped \d+s into its run \(SIGTERM\): qdel or qrerun, before its "
                     r"walltime of 600s\n", said), said
    assert "where the ranks were when they were stopped" in said, said
    assert re.search(r"slurmlaunch:   ranks 0-1(?: on \S+)?: pieces\.py:9 in <module>: time\.sleep\(600\)\n",
                     said), said
    assert said.count("pieces.py:9 in <module>") == 1, said
    assert f"job {job} ended CANCELLED" in err, said


def _host_processes(root: Path, host: str) -> list[int]:
    """Every process of the dev cluster's ``host`` (its network namespace) but the one that holds it and sshd."""
    holder = int((pbscluster.host_dir(root, host) / "host.pid").read_text())
    ns = os.readlink(f"/proc/{holder}/ns/net")
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == holder:
            continue
        try:
            if os.readlink(f"/proc/{entry.name}/ns/net") == ns and \
                    Path(f"/proc/{entry.name}/comm").read_text().strip() != "sshd":
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _launched(root: Path, head: str, timeout: float = 60) -> None:
    """Until mpiexec on ``head`` has no pbs_tmrsh left: its daemons' launch is over. Each pbs_tmrsh lingers
    LINGER_S after its daemon detached (slurmlaunch/allocation/tmrsh.py); a host killed before then ends a
    pbs_tmrsh still running, and Open MPI counts that daemon as never started ("ORTE was unable to reliably start
    one or more daemons", seen once in a whole run): a failed launch, not the lost host this test is about."""
    deadline = time.monotonic() + timeout
    while "pbs_tmrsh" in map(_comm, _host_processes(root, head)):
        assert time.monotonic() < deadline, f"pbs_tmrsh still running on {head} after {timeout:.0f} s"
        time.sleep(0.2)


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:  # gone meanwhile
        return ""


def _restart_mom(root: Path, host: str) -> None:
    """The MoM of ``host`` started again, and the host free again for the tests after this one. Its lock file
    goes first: the killed MoM may linger as a zombie, whose pid PBS's init script takes for a running MoM."""
    (pbscluster.host_dir(root, host) / "spool" / "mom_priv" / "mom.lock").unlink(missing_ok=True)
    started = subprocess.run([*pbscluster.enter(root, host), str(pbscluster.PBS_EXEC / "libexec" / "pbs_init.d"),
                              "start"], env=pbscluster.QUIET_ENV, capture_output=True, text=True, timeout=120)
    deadline = time.monotonic() + 180
    while pbscluster.node_states(root).get(host) != "free":
        assert time.monotonic() < deadline, (pbscluster.node_states(root), started)
        time.sleep(1)


def test_a_lost_host_is_named_by_wait_and_status(pbs_env: dict[str, str], tmp_path: Path) -> None:
    """3 hosts x 1 rank. All of the second host's processes killed (its MoM, Open MPI's daemon, its rank):
    --wait names the host and its rank, in bounded time, as `status` does. Then, in a second job, its MoM
    alone: the ranks there run on and PBS keeps the job R (until its walltime), but `status` names the host
    down with the server's reason."""
    root = Path(pbs_env["SLURMLAUNCH_TEST_PBS_DIR"])
    proc = _submit(pbs_env, tmp_path, 3, 1, "-1", wait=True)
    lost = ""
    try:
        wait_for_files(tmp_path, "up-*", 3, timeout=180)
        job = json.loads(run_cli("list", "--json", env=pbs_env, cwd=tmp_path).stdout)[-1]["job_id"]
        hosts = [h.split("/")[0] for h in
                 json.loads(run_cli("status", job, "--json", env=pbs_env, cwd=tmp_path).stdout)["nodes"].split("+")]
        lost = hosts[1]
        _launched(root, hosts[0])
        for pid in _host_processes(root, lost):
            os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        out, err = proc.communicate(timeout=120)
        took = time.monotonic() - killed
    finally:
        proc.kill()
        if lost:
            _restart_mom(root, lost)
    print(f"{lost} lost with its rank: named by --wait {took:.1f}s after the kill")
    line = (f"rank 1 on {lost} failed first with exit code 205 (their host was lost: mpiexec lost contact with its "
            f"daemon on {lost}, whose host went down or whose processes were killed); the other ranks were stopped")
    assert f"slurmlaunch: {line}\n" in out + err, out + err
    assert f"slurmlaunch:   rank 1 on {lost}: its host was lost: no stacks\n" in err, err  # named, not left out
    assert took < 60 and f"job {job} ended FAILED, exit code 205" in err, (took, err)
    assert run_cli("status", job, env=pbs_env, cwd=tmp_path).stdout.splitlines()[1] == f"  {line}"

    # the MoM alone: its rank lives on, the job stays R; --wait names the host as status does
    (tmp_path / "second").mkdir()
    second = _submit(pbs_env, tmp_path / "second", 3, 1, "-1", wait=True)
    assert second.stderr is not None
    said: list[str] = []
    while not (job := next((m[1] for m in map(re.compile(r"submitted job (\S+)").search, said) if m), "")):
        said.append(second.stderr.readline())
        assert said[-1], "".join(said)
    # --wait's lines as they come (a thread: the named line must be seen before the job is ended below)
    reader = threading.Thread(target=lambda: said.extend(iter(second.stderr.readline, "")), daemon=True)
    reader.start()
    try:
        wait_for_files(tmp_path / "second", "up-*", 3, timeout=180)
        lost = json.loads(run_cli("status", job, "--json", env=pbs_env, cwd=tmp_path).stdout)["nodes"]
        lost = lost.split("+")[1].split("/")[0]
        mom = int((pbscluster.host_dir(root, lost) / "spool" / "mom_priv" / "mom.lock").read_text().split()[0])
        os.kill(mom, signal.SIGKILL)
        killed = time.monotonic()
        while True:
            st = json.loads(run_cli("status", job, "--json", env=pbs_env, cwd=tmp_path).stdout)
            if f"{lost} down" in (st.get("note") or "") or time.monotonic() - killed > 30:
                break
            time.sleep(0.5)
        print(f"{lost}'s MoM killed: named by status {time.monotonic() - killed:.1f}s after the kill")
        assert st["state"] == "RUNNING" and f"{lost} down (PBS's comment: node down: " in st["note"], st
        deadline = time.monotonic() + 60  # --wait asks at its own pace: the line comes within its next polls
        while not any(f"{lost} down (PBS's comment" in ln for ln in said) and time.monotonic() < deadline:
            time.sleep(0.5)
    finally:  # the host's orphaned ranks gone and the job with them, then its MoM back (quick that way)
        for pid in _host_processes(root, lost):
            os.kill(pid, signal.SIGKILL)
        subprocess.run(["qdel", "-W", "force", job], env=pbs_env, capture_output=True, timeout=60)
        _restart_mom(root, lost)
        second.wait(timeout=120)
        reader.join(timeout=30)
    followed = "".join(said)
    named = next((ln for ln in followed.splitlines() if f"{lost} down (PBS's comment: node down: " in ln), "")
    assert f"job {job} RUNNING" in named and followed.index(named) < followed.index(f"job {job} ended"), followed


def test_what_qsub_refuses_is_refused_at_submit(pbs_env: dict[str, str], tmp_path: Path) -> None:
    """A non-ASCII output directory (qsub -o refuses it with its usage text) and a non-UTF-8 argument: one
    line each, exit code 2, no directory made, nothing submitted."""
    (tmp_path / "pieces.py").write_text(PIECES)
    before = subprocess.run(["qstat", "-x"], env=pbs_env, capture_output=True, text=True, timeout=60).stdout
    r = run_cli("submit", "--scheduler", "pbs", *AS_ROOT, "--output-dir", str(tmp_path / "lögs"), "pieces.py",
                env=pbs_env, cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.splitlines()[-1] == (
        f"slurmlaunch: error: --output-dir {str(tmp_path / 'lögs')!r}: qsub takes no output path that is not ASCII "
        f"(expected an ASCII path: give another --output-dir)"), r.stderr
    assert not (tmp_path / "lögs").exists()
    raw = subprocess.run([sys.executable, "-m", "slurmlaunch", "submit", "--scheduler", "pbs",
                          *AS_ROOT, "pieces.py", "ok", b"caf\xe9"], env=pbs_env, cwd=tmp_path, capture_output=True,
                         timeout=120)
    assert raw.returncode == 2 and raw.stderr.decode().splitlines()[-1] == (
        r"slurmlaunch: error: SCRIPT argument 2 'caf\xe9' is not valid UTF-8 (the byte 0xe9; expected UTF-8 "
        "text, which the batch script is written in)"), raw.stderr
    assert subprocess.run(["qstat", "-x"], env=pbs_env, capture_output=True, text=True, timeout=60).stdout == before


def test_qdel_after_a_sister_moms_restart_reads_cancelled(pbs_env: dict[str, str], tmp_path: Path) -> None:
    """2 hosts x 1 rank; the second host's MoM killed and started again under the running job, then qdel: the
    server ends the job substate 93, Exit_status 0 (not 91), its comment "... and terminated by root@head".
    status reads CANCELLED, as for any qdel'd job, not COMPLETED 0."""
    root = Path(pbs_env["SLURMLAUNCH_TEST_PBS_DIR"])
    proc = _submit(pbs_env, tmp_path, 2, 1, "-1")
    _, err = proc.communicate(timeout=120)
    job = submitted(err)
    try:
        wait_for_files(tmp_path, "up-*", 2, timeout=180)
        sister = json.loads(run_cli("status", job, "--json", env=pbs_env, cwd=tmp_path).stdout)["nodes"]
        sister = sister.split("+")[1].split("/")[0]
        mom = int((pbscluster.host_dir(root, sister) / "spool" / "mom_priv" / "mom.lock").read_text().split()[0])
        os.kill(mom, signal.SIGKILL)
        _restart_mom(root, sister)
        deleted = subprocess.run(["qdel", job], env=pbs_env, capture_output=True, text=True, timeout=60)
        assert deleted.returncode == 0, deleted.stderr
        deadline = time.monotonic() + 90
        while (st := json.loads(run_cli("status", job, "--json", env=pbs_env, cwd=tmp_path).stdout))["state"] in \
                ("RUNNING", "COMPLETING", "PENDING"):
            assert time.monotonic() < deadline, f"waited 90s for job {job} to end after qdel: {st}"
            time.sleep(1)
        assert st["state"] == "CANCELLED", st
    finally:
        subprocess.run(["qdel", "-W", "force", job], env=pbs_env, capture_output=True, timeout=60)
