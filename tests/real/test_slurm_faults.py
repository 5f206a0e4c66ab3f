"""Faults injected on the real dev cluster (issue 28, items 2, 3, 5, 7): the controller stalled (SIGSTOP of the
slurmctld of its pid file, SIGCONT later, always), a node's slurmd killed under a running job, a submit
directory removed, a user function that raises. What is checked is what a user sees (the CLI's lines and
exit codes) against what Slurm itself says (squeue, sinfo, sacct): the oracles nobody here wrote.

The clusters here are their own, not the session's: a stalled controller or a dead node would break the
other tests' jobs. Their job ids come from blocks of this worker's own (tests.helpers.JOB_ID_BLOCKS), so that
no two clusters of one worker hand out the same ids (jobs derive MASTER_PORT from them)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import io
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from slurmlaunch.app.devcluster import slurm as devcluster
from slurmlaunch.app.devcluster.netns import _stop_pids
from slurmlaunch.core.errors import DevClusterError, SchedulerError
from tests.helpers import first_job_id, per_test_env, run_cli, skip_or_fail

ROOT = Path(__file__).resolve().parents[2]
# SlurmdTimeout of these clusters: Slurm pings each slurmd every third of it and marks a silent node DOWN
# after it; Slurm's 300 s would make a lost-node test wait 7 minutes. 30 s: a missed ping shows within
# 10-20 s, DOWN at 30-40 s, and a node of a loaded 2-core machine still answers a ping every 10 s.
SLURMD_TIMEOUT = 30


def wait_for(what: str, check: Callable[[], bool], bound: float = 120.0, poll: float = 0.5,
             show: Callable[[], str] | None = None) -> None:
    deadline = time.monotonic() + bound
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {bound:.0f}s for {what}" + (f" (last: {show()})" if show else ""))
        time.sleep(poll)


def start_cluster(block: str, nodes: int = 3) -> tuple[Path, dict[str, str]]:
    why = devcluster.missing_requirements() or devcluster.accounting_missing()
    if why:
        skip_or_fail(why)
    root = Path(tempfile.mkdtemp(prefix="slurmlaunch-faults-"))
    try:
        env = devcluster.up(root, nodes=nodes, gpus=0, cpus=4, accounting=True,
                            first_job_id=first_job_id(block), slurmd_timeout=SLURMD_TIMEOUT)
    except Exception as e:
        logs = "".join(p.read_text(errors="replace")[-2000:] for p in (root / "log").glob("*.log"))
        with contextlib.suppress(DevClusterError):
            devcluster.down(root)
        pytest.fail(f"fault cluster did not come up: {e}\n{logs}")
    return root, {**os.environ, **env}


def stop_cluster(root: Path) -> None:
    for daemon in ("slurmctld", "slurmdbd"):
        with contextlib.suppress(OSError, ValueError):
            os.kill(int((root / f"{daemon}.pid").read_text()), signal.SIGCONT)  # a test that failed mid-stall
    devcluster.down(root)
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def fault_cluster() -> Iterator[tuple[Path, dict[str, str]]]:
    """A 3-node cluster with accounting whose controller the tests here stall (and always resume)."""
    root, env = start_cluster("faults")
    yield root, env
    stop_cluster(root)


@pytest.fixture
def faults(fault_cluster: tuple[Path, dict[str, str]], tmp_path: Path) -> tuple[Path, dict[str, str]]:
    root, env = fault_cluster
    return root, per_test_env(env, tmp_path)


@contextlib.contextmanager
def stalled(root: Path, daemon: str = "slurmctld") -> Iterator[Callable[[], None]]:
    """The controller (or ``daemon``: slurmdbd) stopped (SIGSTOP) inside the block; the block may resume it
    early (the function it gets), and it is resumed at the block's end whatever happens."""
    pid = int((root / f"{daemon}.pid").read_text())
    os.kill(pid, signal.SIGSTOP)

    def resume() -> None:
        with contextlib.suppress(ProcessLookupError):  # stopped meanwhile (dev-cluster down)
            os.kill(pid, signal.SIGCONT)

    try:
        yield resume
    finally:
        resume()


def squeue(env: dict[str, str], *args: str) -> str:
    return subprocess.run(["squeue", "-h", *args], env=env, capture_output=True, text=True, timeout=60,
                          check=True).stdout


def job_state(env: dict[str, str], job_id: str) -> str:
    """squeue's state of the job, or its error (a controller just resumed may still time out a request)."""
    r = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], env=env, capture_output=True, text=True,
                       timeout=60)
    return r.stdout.strip() if r.returncode == 0 else f"error: {r.stderr.strip()}"


def child_named(parent: int, name: str) -> bool:
    """Whether ``parent`` has a child process called ``name`` now."""
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                stat = Path(f"/proc/{entry.name}/stat").read_text()
                comm, fields = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
                if comm == name and int(fields[1]) == parent:
                    return True
    return False


def script(tmp_path: Path, body: str, name: str = "train.py") -> Path:
    path = tmp_path / name
    path.write_text(body)
    return path


# --- 28.2: a stalled controller at submit makes no ghost job -------------------------------------------------

@pytest.mark.slurm
def test_a_job_the_stalled_controller_takes_later_is_found_and_recorded(faults: tuple[Path, dict[str, str]],
                                                                       tmp_path: Path) -> None:
    """sbatch gives up after MessageTimeout (5 s here) while slurmctld is stopped; Slurm takes the request
    once it runs again. The controller is resumed only once slurmlaunch is looking for the job (its squeue
    is running), so the failure path is the one taken, every time."""
    root, env = faults
    train = script(tmp_path, "print('ran')\n")
    with stalled(root) as resume:
        proc = subprocess.Popen([sys.executable, "-m", "slurmlaunch", "submit", "--scheduler", "slurm", "--no-wait",
                                 "--nodes", "2", str(train)], env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        wait_for("slurmlaunch to look for the job sbatch gave up on", lambda: child_named(proc.pid, "squeue"))
        resume()
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    job_id = out.strip()
    assert "Batch job submission failed: Socket timed out" in err, err
    assert f"but Slurm accepted the job all the same: it is job {job_id} (found by its comment " \
           f"slurmlaunch-submit:" in err, err
    token = err.split("found by its comment ", 1)[1].split(")", 1)[0]
    # Slurm's own list: one job carries the token, and it is the one recorded
    carriers = [line.split("|")[0] for line in squeue(env, "-t", "all", "-o", "%i|%k").splitlines()
                if token in line]
    assert carriers == [job_id], (carriers, token)
    listed = run_cli("list", env=env)
    assert listed.returncode == 0 and job_id in listed.stdout, listed.stdout + listed.stderr
    assert (tmp_path / "slurmlaunch-logs" / f"job-{job_id}.sbatch").exists()
    waited = run_cli("status", job_id, env=env)
    assert waited.returncode == 0 and f"job {job_id} (slurm)" in waited.stdout, waited.stdout + waited.stderr


@pytest.mark.slurm
def test_when_the_controller_stays_silent_the_failure_names_the_token(faults: tuple[Path, dict[str, str]],
                                                                     tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """The lookup is bounded (LOOKUP_S, 60 s; 8 s here): past it, one line says the job may exist, with the
    token and the command that finds it; that command, run once the controller is back, finds it."""
    from slurmlaunch import cli
    from slurmlaunch.schedulers import slurm

    root, env = faults
    for key in ("SLURM_CONF", "SLURMLAUNCH_ALLOW_LOOPBACK", "XDG_STATE_HOME"):
        monkeypatch.setenv(key, env[key])
    monkeypatch.setattr(slurm, "LOOKUP_S", 8.0)
    monkeypatch.chdir(tmp_path)
    train = script(tmp_path, "print('ran')\n")
    with stalled(root):
        code = cli.main(["submit", "--scheduler", "slurm", "--no-wait", str(train)])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "whether Slurm accepted the job cannot be known" in lines[0], err
    check = lines[0].split("look for it with: ", 1)[1]
    token = check.rsplit("grep ", 1)[1]
    assert token.startswith("slurmlaunch-submit:") and len(token) > len("slurmlaunch-submit:") + 8, check
    wait_for(f"the job that carries {token} in Slurm's queue",
             lambda: token in subprocess.run(check, shell=True, env=env, capture_output=True, text=True,
                                             timeout=60).stdout, bound=60)
    job_id = next(line.split()[0] for line in squeue(env, "-t", "all", "-o", "%i %k").splitlines() if token in line)
    subprocess.run(["scancel", job_id], env=env, check=True, timeout=60)


# --- 28.3: auto never runs a cluster's job here ----------------------------------------------------------------

@pytest.mark.slurm
def test_auto_with_a_silent_controller_refuses_and_runs_nothing(faults: tuple[Path, dict[str, str]],
                                                               tmp_path: Path) -> None:
    root, env = faults
    marker = tmp_path / "ran-here"
    train = script(tmp_path, f"open({str(marker)!r}, 'a').write('rank')\n")
    with stalled(root):
        r = run_cli("submit", "--no-wait", "--nodes", "3", "--tasks-per-node", "2", str(train), env=env,
                    cwd=tmp_path)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "a Slurm cluster is configured here" in r.stderr and "nothing was run" in r.stderr, r.stderr
    assert f"SLURM_CONF={env['SLURM_CONF']}" in r.stderr and "--scheduler local" in r.stderr, r.stderr
    assert not marker.exists() and not (tmp_path / "slurmlaunch-logs").exists() and r.stdout == ""
    # once it answers, auto is Slurm again
    r = run_cli("submit", "--no-wait", "--nodes", "2", str(train), env=env, cwd=tmp_path)
    assert r.returncode == 0 and "auto chose slurm" in r.stderr, r.stderr


@pytest.mark.slurm
def test_auto_without_any_slurm_configuration_runs_here(tmp_path: Path) -> None:
    """README command 1 on a machine with Slurm's clients and no cluster: the client itself finds no
    configuration source (no SLURM_CONF, no slurm.conf, no DNS SRV record), so auto is local."""
    if shutil.which("scontrol") is None:
        skip_or_fail("scontrol is not installed (apt-get install slurm-client)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    probe = subprocess.run(["scontrol", "ping"], env=env, capture_output=True, text=True, timeout=60)
    if "Could not establish a configuration source" not in probe.stderr:
        pytest.skip(f"this machine has a Slurm configuration: {probe.stdout.strip() or probe.stderr.strip()}")
    train = script(tmp_path, "import os; print('hello-from', os.environ['RANK'])\n")
    r = run_cli("submit", "--nodes", "2", "--tasks-per-node", "2", "--wait", str(train),
                env=dict(env, HOME=str(tmp_path), XDG_STATE_HOME=str(tmp_path / "state")), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "auto chose local (sbatch is on PATH but no Slurm cluster is configured here)" in r.stderr, r.stderr
    # --wait shows rank 0 (as on a queue); every rank's own log holds its line
    assert [line.split()[-1] for line in r.stdout.splitlines() if "hello-from" in line] == ["0"], r.stdout
    logs = sorted((tmp_path / "slurmlaunch-logs").glob("job-*.rank-*.log"))
    assert sorted(p.read_text().split()[-1] for p in logs) == ["0", "1", "2", "3"], logs


# --- 28.7: status without the record, --wait losing the controller ------------------------------------------

@pytest.mark.slurm
def test_status_after_the_submit_directory_is_gone_asks_slurm(faults: tuple[Path, dict[str, str]],
                                                              tmp_path: Path) -> None:
    _, env = faults
    work = tmp_path / "work"
    work.mkdir()
    train = script(work, "import sys; sys.exit(3)\n")
    r = run_cli("submit", "--scheduler", "slurm", "--wait", str(train), env=env, cwd=work, timeout=180)
    assert r.returncode == 3, r.stderr
    job_id = r.stdout.strip()
    shutil.rmtree(work)
    r = run_cli("status", job_id, env=env)
    assert r.returncode == 0, r.stderr
    assert "its record" in r.stderr and "is gone (its directory was removed); what slurm says of it" in r.stderr
    accounted = subprocess.run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State"], env=env,
                               capture_output=True, text=True, timeout=60, check=True).stdout.split()[0]
    assert r.stdout.startswith(f"job {job_id} (slurm): {accounted}") and accounted == "FAILED", r.stdout
    assert "exit code 3" in r.stdout, r.stdout


@pytest.mark.slurm
def test_wait_that_loses_the_controller_says_the_job_is_untouched(faults: tuple[Path, dict[str, str]],
                                                                 tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """--wait's bound on a silent scheduler (LOST_CONTACT_S, 120 s; 6 s here) against a really stalled
    controller: the line says the job goes on and how to follow it, and the job does go on."""
    from slurmlaunch.app import follow
    from slurmlaunch.schedulers import slurm

    root, env = faults
    started = tmp_path / "started"
    train = script(tmp_path, f"import time; open({str(started)!r}, 'w'); time.sleep(600)\n")
    r = run_cli("submit", "--scheduler", "slurm", "--no-wait", str(train), env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    job_id = r.stdout.strip()
    monkeypatch.setenv("SLURM_CONF", env["SLURM_CONF"])
    monkeypatch.setattr(follow, "LOST_CONTACT_S", 6.0)
    # the rank runs: srun has its step (an srun still asking for it during the stall would fail the job)
    wait_for(f"job {job_id}'s rank to start", started.exists)
    err = io.StringIO()
    with stalled(root), pytest.raises(SchedulerError) as e:
        follow.follow(job_id, lambda: slurm.status(job_id, str(tmp_path / "slurmlaunch-logs")), None,
                      out=io.StringIO(), err=err)
    assert str(e.value).startswith(f"no answer about job {job_id} for 6s (last error: "), e.value
    assert str(e.value).endswith(f"; the job itself is untouched (stopping --wait cancels nothing): follow it later "
                                 f"with slurmlaunch status {job_id} and slurmlaunch logs --follow {job_id}"), e.value
    wait_for(f"job {job_id} still RUNNING after the stall",
             lambda: job_state(env, job_id) == "RUNNING", bound=60, show=lambda: job_state(env, job_id))
    subprocess.run(["scancel", job_id], env=env, check=True, timeout=60)


# --- 40: a scheduler that cannot be asked is not one that forgot the job ----------------------------------------

@pytest.mark.slurm
def test_status_and_cancel_while_slurmdbd_is_stalled_say_slurm_was_not_asked(faults: tuple[Path, dict[str, str]],
                                                                              tmp_path: Path) -> None:
    """A job squeue has forgotten (MinJobAge) is known only to sacct; with slurmdbd stopped (SIGSTOP), sacct
    gives no answer. `status` says so in one line naming sacct, exit 2, never "gone"; `cancel` refuses, exit 2;
    once slurmdbd runs again, both agree with sacct (FAILED, exit code 3, still ours)."""
    root, env = faults
    train = script(tmp_path, "import sys; sys.exit(3)\n")
    r = run_cli("submit", "--scheduler", "slurm", "--wait", str(train), env=env, cwd=tmp_path, timeout=180)
    assert r.returncode == 3, r.stderr
    job_id = r.stdout.strip()
    wait_for(f"squeue to forget job {job_id} (MinJobAge)", lambda: job_state(env, job_id).startswith("error:"),
             bound=120, show=lambda: job_state(env, job_id))
    # Both at once: each waits out sacct's own bound (MessageTimeout + 35 s) for the stopped slurmdbd, and
    # neither's answer depends on the other's (cancel refuses: nothing is cancelled).
    with stalled(root, "slurmdbd"), concurrent.futures.ThreadPoolExecutor(2) as pool:
        asked = [pool.submit(run_cli, action, job_id, env=env, timeout=240) for action in ("status", "cancel")]
        st, c = (f.result() for f in asked)
    for said in (st, c):
        assert said.returncode == 2 and said.stdout == "", said.stdout + said.stderr
        lines = said.stderr.strip().splitlines()
        assert len(lines) == 1 and "gone" not in lines[0] and "another job" not in lines[0], said.stderr
        assert f"job {job_id}: Slurm could not be asked whether its job of that id is still the one submitted " \
               f"(" in lines[0] and "sacct -n -X -D -P -j" in lines[0], said.stderr
    assert c.stderr.rstrip().endswith(": nothing cancelled"), c.stderr
    accounted = subprocess.run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State"], env=env,
                               capture_output=True, text=True, timeout=120, check=True).stdout.split()
    assert accounted[:1] == ["FAILED"], accounted
    st = run_cli("status", job_id, env=env, timeout=240)
    assert st.returncode == 0 and st.stdout.startswith(f"job {job_id} (slurm): FAILED"), st.stdout + st.stderr
    assert "exit code 3" in st.stdout and "gone" not in st.stdout + st.stderr, st.stdout + st.stderr
    c = run_cli("cancel", job_id, env=env, timeout=240)
    assert c.returncode == 0 and "had already ended (FAILED, exit code 3)" in c.stdout, c.stdout + c.stderr


# --- 28.5: a lost node is named; 28.7: `down` leaves no step daemon -------------------------------------------

def follow_lines(proc: subprocess.Popen[str]) -> queue.Queue[str]:
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    return lines


def wait_line(lines: queue.Queue[str], seen: list[str], what: str, match: Callable[[str], bool],
              bound: float) -> str:
    deadline = time.monotonic() + bound
    while True:
        try:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError(f"no line {what} within {bound:.0f}s; --wait said:\n{''.join(seen)}") from None
        seen.append(line)
        if match(line):
            return line


def open_files(pid: int) -> set[str]:
    try:
        return {os.path.realpath(fd.path) for fd in os.scandir(f"/proc/{pid}/fd")}
    except OSError:  # ended meanwhile
        return set()


def node_processes(root: Path, node: str) -> list[int]:
    """The pids of what runs as ``node`` of the cluster under ``root``: its slurmd, its step daemons (they
    hold the node's log file open) and everything they started."""
    log = str(root.resolve() / "log" / f"slurmd-{node}.log")
    steps = [pid for pid in devcluster.step_daemons(root) if log in open_files(pid)]
    return [int((root / f"slurmd-{node}.pid").read_text()), *steps, *devcluster.descendants(steps)]


def started_at(pid: int) -> str | None:
    """The process's start time (/proc/PID/stat, field 22) while it runs; None once it ended (a zombie has)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else fields[19]


def running(processes: dict[int, str | None]) -> list[str]:
    """Those of ``processes`` (pid: start time) that still run, with their command lines."""
    found = []
    for pid, start in processes.items():
        if start is not None and started_at(pid) == start:
            with contextlib.suppress(OSError):
                found.append(f"{pid} {Path(f'/proc/{pid}/cmdline').read_bytes()[:120]!r}")
    return found


# How a node is lost: its slurmd alone (kill -9), or all its processes (slurmd, step daemons, ranks); the node
# each way loses, and the nodes of the job that loses it
LOST = {"slurmd": ("node2", "node[1-3]"), "node": ("node5", "node[4-6]")}


def _still_running(pid: int, comm: str, within: float = 10.0) -> bool:
    """Whether ``pid`` is still a running ``comm`` after ``within`` seconds (a zombie, or another program that
    took the pid, is not)."""
    deadline = time.monotonic() + within
    while True:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        name, state = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()[0]
        if name != comm or state == "Z":
            return False
        if time.monotonic() > deadline:
            return True
        time.sleep(0.2)


@pytest.mark.slurm
def test_wait_names_a_lost_node_and_slurms_requeue(tmp_path: Path) -> None:
    """kill -9 of node2's slurmd under a running 3-node job on node[1-3], and of all node5's processes
    (slurmd, step daemons, ranks) under another on node[4-6], at once on one 6-node cluster (each waits about
    a minute for Slurm's SlurmdTimeout): --wait names the node as soon as Slurm's ping misses it, then the
    requeue Slurm makes after NODE_FAIL and why the job waits; `dev-cluster down` afterwards leaves none of
    that cluster's step daemons (node2's outlived its slurmd) and none of the jobs' ranks (node2's outlived
    both)."""
    root, env = start_cluster("faults-big", nodes=6)
    procs: dict[str, subprocess.Popen[str]] = {}
    try:
        env = per_test_env(env, tmp_path)
        for lost, (_, nodes) in LOST.items():
            where = tmp_path / lost
            where.mkdir()
            train = script(where, f"import os, time; open({str(where)!r} + '/started-' + os.environ['RANK'], 'w')"
                                  f".write(str(os.getpid())); time.sleep(600)\n")
            procs[lost] = subprocess.Popen(
                [sys.executable, "-m", "slurmlaunch", "submit", "--scheduler", "slurm", "--wait", "--nodes", "3",
                 f"--sbatch-arg=--nodelist={nodes}", str(train)], env=env, cwd=where, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, text=True)
        try:
            lines = {lost: follow_lines(proc) for lost, proc in procs.items()}
            seen: dict[str, list[str]] = {lost: [] for lost in LOST}
            tasks: dict[int, str | None] = {}
            for lost, (_, nodes) in LOST.items():
                wait_line(lines[lost], seen[lost], f"saying the job runs on {nodes}",
                          lambda s, nodes=nodes: f"RUNNING on {nodes}" in s, 180)
                # every rank runs (a slurmd killed while it starts its step's tasks fails the step instead)
                started = tmp_path / lost
                wait_for(f"the 3 ranks on {nodes} to start",
                         lambda started=started: len(list(started.glob("started-*"))) == 3)
                # the ranks and what they started (their rendezvous watchdogs): none may outlive `down`
                ranks = [int(p.read_text()) for p in started.glob("started-*")]
                tasks.update({pid: started_at(pid) for pid in [*ranks, *devcluster.descendants(ranks)]})
            victims = {"slurmd": [int((root / "slurmd-node2.pid").read_text())],
                       "node": node_processes(root, "node5")}
            assert len(victims["node"]) >= 3, victims  # slurmd, a step daemon, a rank at least
            for pid in [*victims["slurmd"], *victims["node"]]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            killed = time.monotonic()
            job_ids = {}
            for lost, (node, nodes) in LOST.items():
                # Slurm's ping misses the node within SlurmdTimeout/3 (+ the ping's own timeout); --wait polls
                # every s. Both jobs' lines queue while the other is read: each bound counts from the kill.
                named_line = wait_line(lines[lost], seen[lost], f"naming {node}", lambda s, node=node: f"{node} " in s,
                                       killed + 3 * SLURMD_TIMEOUT - time.monotonic())
                assert f"{node} not responding" in named_line or f"{node} down" in named_line, named_line
                job_ids[lost] = next(s.split("job ", 1)[1].split()[0] for s in seen[lost] if "] job " in s)
                # the node's step daemon is gone or cannot report: srun waits for it, Slurm ends the run
                # NODE_FAIL when it marks the node DOWN (SlurmdTimeout), and requeues the job
                requeued = wait_line(lines[lost], seen[lost], "saying Slurm requeued the job after NODE_FAIL",
                                     lambda s: "Slurm requeued it after NODE_FAIL" in s,
                                     killed + 4 * SLURMD_TIMEOUT - time.monotonic())
                assert " PENDING (" in requeued and f"of its run on {nodes}" in requeued, requeued
                print(f"{lost}: {node} named and the job requeued by {time.monotonic() - killed:.0f}s after the "
                      f"kill")  # shown with -s
                wait_line(lines[lost], seen[lost], f"saying {node} is down, with Slurm's reason",
                          lambda s, node=node: f"{node} down (Not responding)" in s and "Slurm's reason: " in s,
                          killed + 5 * SLURMD_TIMEOUT - time.monotonic())
                shown = run_cli("status", job_ids[lost], env=env)
                assert shown.returncode == 0 and f"job {job_ids[lost]} (slurm): PENDING" in shown.stdout, shown.stderr
                assert "NODE_FAIL" in shown.stdout and f"{node} down (Not responding)" in shown.stdout, shown.stdout
        finally:
            for proc in procs.values():
                proc.kill()
                proc.wait(timeout=60)
        subprocess.run(["scancel", *job_ids.values()], env=env, check=True, timeout=60)
        log = str(root.resolve() / "log" / "slurmd-node2.log")
        orphans = [pid for pid in devcluster.step_daemons(root) if log in open_files(pid)]
        assert orphans, "node2's step daemon outlived its slurmd: the case `down` must handle"
    finally:
        stop_cluster(root)
    assert devcluster.step_daemons(root) == []
    for pid in orphans:  # gone, or KILLed and not yet reaped by init (a zombie holds its pid and comm a moment)
        assert not _still_running(pid, "slurmstepd"), f"node2's orphaned step daemon {pid} outlived down"
    # node2's rank outlived its slurmd and step daemon (nothing tells it its step is gone): `down` stops it
    # with the step daemons (init reaps it within moments; it would otherwise sleep out its 600 s)
    wait_for("the jobs' ranks and watchdogs to be gone after `down`", lambda: not running(tasks), bound=30,
             show=lambda: "; ".join(running(tasks)))


@pytest.mark.slurm
def test_down_stops_the_step_daemons_of_a_job_that_ran_during_a_stall(tmp_path: Path) -> None:
    """A job ends while the controller is stopped: its step daemons wait to report it. `slurmlaunch
    dev-cluster down` (the CLI, as a developer runs it) stops them too, by pid, and no other cluster's."""
    root, env = start_cluster("faults-big")
    try:
        env = per_test_env(env, tmp_path)
        done, go = tmp_path / "done", tmp_path / "go"
        # each rank says it runs, waits for the test's go (bounded), then ends: inside the stall, every time
        train = script(tmp_path, (
            f"import os, time\nrank = os.environ['RANK']\nopen({str(tmp_path)!r} + '/started-' + rank, 'w')\n"
            f"deadline = time.monotonic() + 300\n"
            f"while not os.path.exists({str(go)!r}) and time.monotonic() < deadline:\n    time.sleep(0.2)\n"
            f"open({str(done)!r} + rank, 'w')\n"))
        r = run_cli("submit", "--scheduler", "slurm", "--no-wait", "--nodes", "2", str(train), env=env,
                    cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        job_id = r.stdout.strip()
        wait_for(f"job {job_id}'s 2 ranks to start", lambda: len(list(tmp_path.glob("started-*"))) == 2,
                 show=lambda: job_state(env, job_id))
        others = set(_all_step_daemons()) - set(devcluster.step_daemons(root))
        with stalled(root):
            go.write_text("")
            wait_for("both ranks to finish during the stall",
                     lambda: all(Path(f"{done}{rank}").exists() for rank in (0, 1)))
            ours = devcluster.step_daemons(root)
            assert ours, "no step daemon of the job left: the stall came too late to test anything"
            r = run_cli("dev-cluster", "down", "--dir", str(root), env=env)
            assert r.returncode == 0, r.stderr
    finally:
        stop_cluster(root)
    assert devcluster.step_daemons(root) == []
    assert not [pid for pid in ours if _alive(pid)], ours
    assert others <= set(_all_step_daemons()) | _ended(others), "another cluster's step daemon was stopped"


def test_down_ends_a_stopped_daemon_by_its_term_not_a_kill_after_the_bound() -> None:
    """A daemon stopped by SIGSTOP (a stalled controller) holds a TERM pending until it runs again: `down`
    continues what it TERMs, so such a daemon ends by its TERM at once, not by a KILL after the bound (the
    test above took 10 s more for it)."""
    # a handler, as the daemons have (a stopped process whose TERM is at its default dies of it at once)
    proc = subprocess.Popen([sys.executable, "-c", "import os, signal, sys, time\n"
                             "signal.signal(signal.SIGTERM, lambda *_: os._exit(15))\n"
                             "print('armed', flush=True)\ntime.sleep(300)\n"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "armed\n"
        os.kill(proc.pid, signal.SIGSTOP)
        start = time.monotonic()
        _stop_pids([proc.pid], timeout=60)
        took = time.monotonic() - start
        assert proc.wait(timeout=60) == 15 and took < 30, (proc.returncode, took)
    finally:
        proc.kill()
        proc.wait()


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs: a stopped daemon may stay a zombie a moment, until init reaps it (seen in CI)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat[stat.rindex(b")") + 2:][:1] not in (b"Z", b"X")


def _all_step_daemons() -> list[int]:
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if Path(f"/proc/{entry.name}/comm").read_text().strip() == "slurmstepd":
                    found.append(int(entry.name))
    return found


def _ended(pids: set[int]) -> set[int]:
    """Those of ``pids`` that ended on their own (other engineers' jobs end too): not stopped by us."""
    return {pid for pid in pids if not Path(f"/proc/{pid}").exists()}


# --- 28.7: the API's traceback shows the user's file and line ------------------------------------------------

@pytest.mark.slurm
def test_the_api_traceback_names_the_users_file_and_line(faults: tuple[Path, dict[str, str]],
                                                          tmp_path: Path) -> None:
    """A function defined in the user's script travels by value (cloudpickle names its code
    "<dynamic-code>"); the failure the caller gets points at the script's real lines."""
    _, env = faults
    user = script(tmp_path, (
        "import slurmlaunch\n"
        "def divide(x):\n"
        "    return 1 / x\n"
        "def train():\n"
        "    return divide(0)\n"
        "if __name__ == '__main__':\n"
        f"    job = slurmlaunch.submit(train, scheduler='slurm', output_dir={str(tmp_path / 'logs')!r})\n"
        "    try:\n"
        "        job.result()\n"
        "    except slurmlaunch.SlurmLaunchError as e:\n"
        "        print(e)\n"), name="user_train.py")
    r = subprocess.run([sys.executable, str(user)], env=dict(env, PYTHONPATH=str(ROOT)), cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "<dynamic-code>" not in r.stdout, r.stdout
    assert f'File "{user}", line 5, in train\n    return divide(0)' in r.stdout, r.stdout
    assert f'File "{user}", line 3, in divide\n    return 1 / x' in r.stdout, r.stdout
    assert "ZeroDivisionError: division by zero" in r.stdout, r.stdout
