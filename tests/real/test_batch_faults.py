"""Faults a production user meets, injected on the real Slurm cluster (issue 28 items 1, 4, 6; issue 33 item 1),
and what the batch scripts make of them:

- a rank killed by a signal (kill -9, a real OOM kill under a cgroup memory limit) is named with 128+N;
- a --time shorter than the default warning does not kill every rank at once (Slurm and the local scheduler);
- a full output file system, and one that turned read-only before the job started, are named (exit codes 74
  and 181) from the submitting side, where --wait can see them;
- a link planted where one of the job's files goes is never written through (Slurm, and the PBS script's
  block run by bash around an emulated mpiexec: there is no PBS server here).

The faults are real: a loop-mounted ext4 image mounted in every node's own mount namespace (the dev cluster's
slurmds each run in one) and in the test's, a kernel memory cgroup whose limit the OOM killer enforces.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import slurmlaunch
from slurmlaunch.allocation import step_rules
from slurmlaunch.app import faults
from slurmlaunch.core.jobfiles import WRITE_FAILED
from slurmlaunch.core.spec import JobSpec
from slurmlaunch.render import pbs_script
from tests.allocation.test_stop_reasons import FAKE_MPIEXEC
from tests.helpers import golden_spec, no_slurm_env, run_cli, skip_or_fail

# Rank 2 of a 2x2 job dies of SIGKILL once the group is formed; the others would wait for it in the barrier.
KILLED_RANK = """
import os, signal, sys, time
import torch.distributed as dist
dist.init_process_group("gloo")
if dist.get_rank() == 2:
    if len(sys.argv) > 1:  # into the memory cgroup the test made: the kernel's OOM killer ends it there
        with open(sys.argv[1], "w") as f:
            f.write(str(os.getpid()))
        hog = []
        while True:
            hog.append(b"x" * (16 << 20))  # touched pages, 16 MiB at a time, until the limit is hit
    os.kill(os.getpid(), signal.SIGKILL)
dist.barrier()
time.sleep(120)
"""


def _submit_wait(env: dict[str, str], cwd: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], str]:
    r = run_cli("submit", "--wait", "--wait-timeout", "150", *args, env=env, cwd=cwd, timeout=200)
    m = re.search(r"submitted job (\d+)", r.stderr)
    assert m, r.stdout + r.stderr
    return r, m.group(1)


# --- 28.1: a rank killed by a signal is named under Slurm --------------------------------------------------

def test_signal_words_are_strsignals_with_their_codes() -> None:
    rows = step_rules.signal_words()
    assert rows["Killed"] == (137, "killed by SIGKILL")
    assert rows["Segmentation fault"] == (139, "killed by SIGSEGV")
    assert rows["Terminated"] == (143, "killed by SIGTERM")
    assert rows[step_rules.OUT_OF_MEMORY] == (137, "killed by SIGKILL: out of memory")


def _summary_of(srun_log: str) -> str:
    """The batch step's reading of srun's first word, on a made-up srun log (the real one is tested below),
    with golden_spec's warning signal (USR2) left to the warning's rule."""
    found = step_rules.srun_first(srun_log.splitlines(), "User defined signal 2")
    return "" if found is None else " ".join(map(str, found)).rstrip()


@pytest.mark.parametrize(("log", "first"), [
    ("srun: error: node2: task 2: Killed\nsrun: error: node1: tasks 0-1: Terminated\n",
     "node2 2 137 killed by SIGKILL"),
    ("srun: error: node2: task 3: Segmentation fault (core dumped)\n", "node2 3 139 killed by SIGSEGV"),
    ("srun: error: node1: tasks 0,2: Exited with exit code 7\nsrun: error: node2: task 1: Killed\n", "node1 0,2 7"),
    ("srun: launch/slurm: _step_signal: Terminating StepId=1.0\nsrun: error: node2: task 1: Out Of Memory\n",
     "node2 1 137 killed by SIGKILL: out of memory"),
    # the warning signal's own words are the warning block's (golden_spec: USR2)
    ("srun: error: node1: task 0: User defined signal 2\n", ""),
    ("srun: error: node1: task 0: Something new\n", ""),
])
def test_first_failure_is_srun_first_word(log: str, first: str) -> None:
    assert _summary_of(log) == first


@pytest.mark.slurm
def test_slurm_names_a_rank_killed_by_sigkill(cluster_env: dict[str, str], tmp_path: Path,
                                              torch_available: None) -> None:
    (tmp_path / "killed.py").write_text(KILLED_RANK)
    r, job = _submit_wait(cluster_env, tmp_path, "--nodes", "2", "--tasks-per-node", "2", "killed.py")
    line = ("slurmlaunch: rank(s) 2 on node2 failed first with exit code 137 (killed by SIGKILL); "
            "the other ranks were stopped")
    logs = tmp_path / "slurmlaunch-logs"
    batch = (logs / f"job-{job}.batch.log").read_text()
    assert "srun: error: node2: task 2: Killed" in batch, batch  # srun's own words, the first of its lines
    assert r.returncode == 137 and line in r.stderr.splitlines(), (r.returncode, r.stderr)
    assert line in batch.splitlines(), batch
    assert (logs / f"job-{job}.failure").read_text() == line + "\n"
    assert (logs / f"job-{job}.exitcode").read_text() == "137\n"
    st = run_cli("status", job, env=cluster_env, cwd=tmp_path)  # the same story as --wait's (issue 40)
    assert st.stdout.splitlines()[1:] == ["  " + line.removeprefix("slurmlaunch: ")], st.stdout + st.stderr


def test_local_names_a_rank_killed_by_sigkill(tmp_path: Path) -> None:
    """The local scheduler's line says the signal as the Slurm script's does."""
    (tmp_path / "k.py").write_text("import os, signal, time\nif os.environ['RANK'] == '1':\n"
                                   "    os.kill(os.getpid(), signal.SIGKILL)\ntime.sleep(60)\n")
    r = run_cli("submit", "--scheduler", "local", "--nodes", "1", "--tasks-per-node", "2", "k.py",
                env=no_slurm_env(tmp_path), cwd=tmp_path, timeout=120)
    assert r.returncode == 137, r.stdout + r.stderr
    m = re.search(r"^slurmlaunch: local job (\d+): (rank 1 failed first with exit code 137 \(killed by SIGKILL\); "
                  r"the other ranks were stopped)$", r.stderr, re.M)
    assert m, r.stderr
    st = run_cli("status", m[1], env=no_slurm_env(tmp_path), cwd=tmp_path)  # the same story (issue 40), with the
    # host, in the batch step's words that every scheduler's failure file holds
    assert st.stdout.splitlines()[1:] == ["  " + m[2].replace("rank 1 ", "rank 1 on 127.0.0.1 ", 1)], \
        st.stdout + st.stderr


@contextlib.contextmanager
def memory_cgroup(limit: int, tag: str) -> Iterator[Path]:
    """A new memory cgroup of ``limit`` bytes (v1's memory controller, or v2's), removed afterwards; yields
    the file a process writes its pid into to join it."""
    lines = Path("/proc/self/cgroup").read_text().splitlines()
    v1 = next((line.split(":", 2)[2] for line in lines if ":memory:" in line), None)
    if v1 is not None and Path("/sys/fs/cgroup/memory").is_dir():
        where = Path("/sys/fs/cgroup/memory" + v1) / tag
        files = ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes")
    else:
        v2 = next((line[3:] for line in lines if line.startswith("0::")), "/")
        where, files = Path("/sys/fs/cgroup" + v2) / tag, ("memory.max", "memory.swap.max")
    try:
        where.mkdir()
        for name in files:
            if (where / name).exists():
                (where / name).write_text(str(limit) if name != "memory.swap.max" else "0")
    except OSError as e:
        with contextlib.suppress(OSError):
            where.rmdir()
        skip_or_fail(f"cannot make a memory cgroup with a limit at {where}: {e}")
    try:
        yield where / "cgroup.procs"
    finally:
        for _ in range(100):  # the killed rank leaves it as soon as it is reaped
            try:
                where.rmdir()
                break
            except OSError:
                time.sleep(0.1)


@pytest.mark.slurm
def test_slurm_names_a_rank_the_oom_killer_ended(cluster_env: dict[str, str], tmp_path: Path,
                                                 torch_available: None) -> None:
    (tmp_path / "killed.py").write_text(KILLED_RANK)
    with memory_cgroup(200 << 20, f"slurmlaunch-oom-{os.getpid()}") as procs:
        r, job = _submit_wait(cluster_env, tmp_path, "--nodes", "2", "--tasks-per-node", "2", "killed.py",
                              str(procs))
    logs = tmp_path / "slurmlaunch-logs"
    batch = (logs / f"job-{job}.batch.log").read_text()
    line = ("slurmlaunch: rank(s) 2 on node2 failed first with exit code 137 (killed by SIGKILL); "
            "the other ranks were stopped")
    assert r.returncode == 137 and line in r.stderr.splitlines(), (r.returncode, r.stderr, batch)
    assert (logs / f"job-{job}.failure").read_text() == line + "\n"


# --- 28.4: a --time too short for the warning --------------------------------------------------------------

@pytest.mark.parametrize(("time_", "signal", "given"), [
    ("0:30", "USR2@90", ("USR2", 15)),  # the default, longer than the limit: half-way
    ("1:30", "USR2@90", ("USR2", 45)),  # the default would come in the first seconds: half-way
    ("3:00", "USR2@90", ("USR2", 90)),  # room enough: as asked
    ("1", "USR2@57", ("USR2", 57)),  # chosen, below the limit (an early warning on purpose): kept
    ("1", "USR1@60", ("USR1", 30)),  # chosen, not below the limit: half-way
    ("0:3", "USR1@2", ("USR1", 2)),
    ("0:1", "USR2@90", None),  # no whole second left for it
    (None, "USR2@90", ("USR2", 90)),  # no limit: as asked
    ("0:30", "none", None),
])
def test_warning_never_comes_at_once(time_: str | None, signal: str, given: tuple[str, int] | None) -> None:
    spec = JobSpec.of(script="t.py", time=time_, signal=signal)
    assert spec.warning == given
    assert (spec.warning_note is None) == (given == spec.asked_warning)


def test_short_time_limit_locally_is_not_killed_at_start(tmp_path: Path) -> None:
    """Before: the local scheduler sent USR2 at 0.14 s for --time 0:30, before the script ran (exit 140)."""
    (tmp_path / "ok.py").write_text("import time\ntime.sleep(3)\nprint('finished')\n")
    r = run_cli("submit", "--scheduler", "local", "--nodes", "1", "--tasks-per-node", "2", "--time", "0:30",
                "ok.py", env=no_slurm_env(tmp_path), cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("finished") == 2, r.stdout
    assert "--time 0:30 is too short for the warning SIGUSR2 90s before the limit" in r.stderr, r.stderr
    assert "it comes 15s before instead, half-way" in r.stderr


def rank_after_a_while() -> int:
    time.sleep(3)
    return int(os.environ["RANK"])


def test_api_short_time_limit_says_the_same(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    job = slurmlaunch.submit(rank_after_a_while, scheduler="local", nodes=1, tasks_per_node=2, time="0:30",
                             output_dir=str(tmp_path / "logs"))
    assert job.results() == [0, 1]
    note = "slurmlaunch: --time 0:30 is too short for the warning SIGUSR2 90s before the limit"
    assert note in capfd.readouterr().err


@pytest.mark.slurm
def test_slurm_short_time_limit_is_not_killed_at_start(cluster_env: dict[str, str], tmp_path: Path) -> None:
    """A 30 s job whose script (no handler for USR2) runs 8 s: Slurm sent the 90 s warning at once."""
    (tmp_path / "ok.py").write_text("import time\ntime.sleep(8)\nprint('finished')\n")
    r, job = _submit_wait(cluster_env, tmp_path, "--nodes", "2", "--tasks-per-node", "1", "--time", "0:30",
                          "ok.py")
    assert r.returncode == 0 and f"job {job} ended COMPLETED, exit code 0" in r.stderr, r.stdout + r.stderr
    assert "it comes 15s before instead, half-way" in r.stderr
    logs = tmp_path / "slurmlaunch-logs"
    assert "#SBATCH --signal=B:USR2@15\n" in (logs / f"job-{job}.sbatch").read_text()
    assert "finished" in (logs / f"job-{job}.rank-1.log").read_text()


# --- 28.6: the output directory fails the job ---------------------------------------------------------------

def _slurmd_pids(cluster_env: dict[str, str]) -> list[int]:
    root = Path(cluster_env["SLURMLAUNCH_TEST_CLUSTER_DIR"])
    return [int(p.read_text()) for p in sorted(root.glob("slurmd-*.pid"))]


@contextlib.contextmanager
def shared_ext4(cluster_env: dict[str, str], image: Path, mountpoint: Path, size_mb: int = 4) -> Iterator[list[str]]:
    """A small ext4 file system (no blocks reserved for root: the jobs run as root here) on one loop device,
    mounted at ``mountpoint`` in every node's mount namespace (one superblock: all see the same files, as on
    a shared file system), and not in the test's own: a cluster another test starts meanwhile copies the
    mounts of the namespace it starts from, and would keep this one. Yields the command prefix that runs a
    command in node1's namespace, where the test submits and looks, as from a login node."""
    for tool in ("losetup", "mkfs.ext4", "nsenter", "mount", "umount"):
        if not any(os.access(os.path.join(d, tool), os.X_OK) for d in ("/usr/sbin", "/sbin", "/usr/bin", "/bin")):
            skip_or_fail(f"{tool} is not installed (util-linux, e2fsprogs)")
    with open(image, "wb") as f:
        f.truncate(size_mb << 20)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", str(image)], check=True, capture_output=True)
    made = subprocess.run(["losetup", "--find", "--show", str(image)], capture_output=True, text=True)
    if made.returncode != 0:
        skip_or_fail(f"no loop device: {made.stderr.strip()}")
    device = made.stdout.strip()
    mountpoint.mkdir()
    entered = [["nsenter", f"--mount=/proc/{pid}/ns/mnt"] for pid in _slurmd_pids(cluster_env)]
    mounted: list[list[str]] = []
    try:
        for enter in entered:
            subprocess.run([*enter, "mount", device, str(mountpoint)], check=True, capture_output=True)
            mounted.append(enter)
        yield entered[0]
    finally:
        for enter in reversed(mounted):
            subprocess.run([*enter, "umount", str(mountpoint)], capture_output=True)
        subprocess.run(["losetup", "-d", device], capture_output=True)


# Writes until the file system says it is full: big pieces, then what is left a page and a byte at a time.
FILL = """
import errno, os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
for size in (1 << 16, 1 << 12, 1):
    try:
        while True:
            os.write(fd, bytes(size))
            os.fsync(fd)
    except OSError as e:
        assert e.errno == errno.ENOSPC, e
"""


def _fill(file: Path, enter: list[str]) -> None:
    subprocess.run([*enter, sys.executable, "-c", FILL, str(file)], check=True, timeout=120)


def _cli(enter: list[str], *args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """slurmlaunch run in the mount namespace ``enter`` leads into ([]: the test's own)."""
    wd = [f"--wd={cwd}"] if enter else []  # nsenter starts in / otherwise
    return subprocess.run([*enter, *wd, sys.executable, "-m", "slurmlaunch", *args], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=200)


def _held(env: dict[str, str], cwd: Path, *args: str, enter: list[str] | None = None) -> str:
    """A job submitted on hold (--sbatch-arg=--hold): its id is known, and the fault comes before it starts."""
    r = _cli(enter or [], "submit", "--sbatch-arg=--hold", *args, env=env, cwd=cwd)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout.split()[0]


def _release_and_follow(env: dict[str, str], cwd: Path, job: str,
                        enter: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    subprocess.run(["scontrol", "release", job], env=env, check=True, capture_output=True, timeout=60)
    return _cli(enter or [], "logs", "--follow", job, env=env, cwd=cwd)


def _read(enter: list[str], path: Path) -> str | None:
    r = subprocess.run([*enter, "cat", str(path)], capture_output=True, text=True, timeout=60)
    return r.stdout if r.returncode == 0 else None


@pytest.mark.slurm
def test_slurm_full_output_directory_is_named(cluster_env: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "ok.py").write_text("print('RANK-STARTED')\n")
    fs = tmp_path / "fs"
    with shared_ext4(cluster_env, tmp_path / "fs.img", fs) as enter:
        job = _held(cluster_env, tmp_path, "--nodes", "2", "-o", str(fs / "logs"), "ok.py", enter=enter)
        _fill(fs / "filler", enter)
        r = _release_and_follow(cluster_env, tmp_path, job, enter)
        batch = _read(enter, fs / "logs" / f"job-{job}.batch.log")
    assert r.returncode == WRITE_FAILED, r.stdout + r.stderr
    assert (f"slurmlaunch: job {job}: exit code 74: the batch script could not write in the output directory "
            f"{fs / 'logs'}, so no rank was started; a write test there from this host says: No space left on "
            f"device") in r.stderr.splitlines(), r.stderr
    assert "RANK-STARTED" not in r.stdout  # no rank started
    # Whether the batch log could still take the script's line depends on the blocks ext4 had left for it.
    assert batch is not None, "slurmd could create the batch log: the fault is the script's to name"
    assert not batch or "No space left on device; no rank was started (exit code 74)" in batch, batch


@pytest.mark.slurm
def test_slurm_output_directory_read_only_before_the_start_is_181(cluster_env: dict[str, str],
                                                                  tmp_path: Path) -> None:
    (tmp_path / "ok.py").write_text("print('RANK-STARTED')\n")
    fs = tmp_path / "fs"
    with shared_ext4(cluster_env, tmp_path / "fs.img", fs) as enter:
        job = _held(cluster_env, tmp_path, "--nodes", "2", "-o", str(fs / "logs"), "ok.py", enter=enter)
        # one superblock: read-only for every node at once
        subprocess.run([*enter, "mount", "-o", "remount,ro", str(fs)], check=True, capture_output=True)
        r = _release_and_follow(cluster_env, tmp_path, job, enter)
        batch = _read(enter, fs / "logs" / f"job-{job}.batch.log")
    sacct = subprocess.run(["sacct", "-X", "-n", "-P", "-j", job, "-o", "ExitCode"], env=cluster_env,
                           capture_output=True, text=True, timeout=60).stdout.strip()
    assert r.returncode == faults.BATCH_NOT_STARTED == 181, r.stdout + r.stderr
    assert sacct == "0:53", sacct
    # submit created the batch log, empty (issue 40, item 4); Slurm could not open it to write: the script never ran
    assert batch == ""
    assert (f"slurmlaunch: job {job}: exit code 181 (sacct: 0:53): Slurm could not start the batch script, most "
            f"often because it could not open the batch log in {fs / 'logs'} (slurmd's log on the node says why); "
            f"a write test there from this host says: Read-only file system") in r.stderr.splitlines(), r.stderr


@pytest.mark.slurm
def test_slurm_output_directory_filled_during_the_run_is_named(cluster_env: dict[str, str], tmp_path: Path) -> None:
    """The ranks' own output fills the file system: their writes fail (srun's log and the batch log stay
    empty, the failure line cannot be written); --wait says what a write test finds."""
    (tmp_path / "chatty.py").write_text("for _ in range(40000):\n    print('x' * 200, flush=True)\n")
    fs = tmp_path / "fs"
    with shared_ext4(cluster_env, tmp_path / "fs.img", fs) as enter:
        r = _cli(enter, "submit", "--wait", "--wait-timeout", "150", "--nodes", "2", "--tasks-per-node", "1",
                 "-o", str(fs / "logs"), "chatty.py", env=cluster_env, cwd=tmp_path)
    m = re.search(r"submitted job (\d+)", r.stderr)
    assert m and r.returncode != 0, r.stdout + r.stderr
    assert (f"slurmlaunch: job {m.group(1)}: the output directory {fs / 'logs'} takes no write now (a write test "
            f"there from this host says: No space left on device): the job's logs and its failure line may be cut "
            f"short or missing") in r.stderr.splitlines(), r.stderr


def test_explain_only_the_output_directory_codes(tmp_path: Path) -> None:
    assert faults.explain(1, str(tmp_path)) is None and faults.explain(137, str(tmp_path)) is None
    assert faults.explain(0, str(tmp_path)) is None and faults.explain(1, str(tmp_path / "gone")) is None
    assert faults.explain(74, str(tmp_path)) == (
        f"exit code 74: the batch script could not write in the output directory {tmp_path}, so no rank was "
        f"started; it takes a write from this host now (the fault was on the nodes only, or has passed)")
    assert "No such file or directory" in (faults.explain(181, str(tmp_path / "gone")) or "")
    assert not list(tmp_path.iterdir())  # the write test leaves nothing


# --- 33.1: never through a planted link -------------------------------------------------------------------

@pytest.mark.slurm
def test_slurm_script_never_writes_through_a_planted_link(cluster_env: dict[str, str], tmp_path: Path) -> None:
    # Rank 0 fails once rank 1's line is in its log (bounded): both logs then hold their rank's line.
    (tmp_path / "fails.py").write_text(
        "import os, sys, time\nprint('rank', os.environ['RANK'])\n"
        "other = f\"slurmlaunch-logs/job-{os.environ['SLURM_JOB_ID']}.rank-1.log\"\n"
        "for _ in range(600):\n"
        "    if os.environ['RANK'] == '0' and os.path.exists(other) and os.path.getsize(other):\n"
        "        sys.exit(3)\n"
        "    time.sleep(0.1)\nsys.exit(4)\n")
    logs = tmp_path / "slurmlaunch-logs"
    job = _held(cluster_env, tmp_path, "--nodes", "2", "--tasks-per-node", "1", "fails.py")
    victims = tmp_path / "victims"
    victims.mkdir()
    planted = {}
    for suffix in ("exitcode", "failure", "srun.log", "rank-0.log", "rank-1.log"):
        victim = victims / suffix
        victim.write_text("not yours\n")
        (logs / f"job-{job}.{suffix}").symlink_to(victim)
        planted[suffix] = victim
    for suffix in ("returned", "reasons"):  # directories the ranks write into
        (victims / suffix).mkdir()
        (logs / f"job-{job}.{suffix}").symlink_to(victims / suffix)
    r = _release_and_follow(cluster_env, tmp_path, job)
    assert r.returncode == 3, r.stdout + r.stderr
    for suffix, victim in planted.items():
        assert victim.read_text() == "not yours\n", suffix
        assert not (logs / f"job-{job}.{suffix}").is_symlink(), suffix
    assert sorted(p.name for p in victims.iterdir()) == sorted([*planted, "returned", "reasons"])
    assert not list((victims / "returned").iterdir()) and not list((victims / "reasons").iterdir())
    assert (logs / f"job-{job}.exitcode").read_text() == "3\n"
    assert "failed first with exit code 3" in (logs / f"job-{job}.failure").read_text()
    for rank in (0, 1):
        assert f"rank {rank}" in (logs / f"job-{job}.rank-{rank}.log").read_text()


def test_pbs_script_never_writes_through_a_planted_link(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    spec = golden_spec(mpi="mpich", script=str(tmp_path / "train.py"), python=sys.executable,
                       workdir=str(tmp_path), output_dir=str(logs))
    (tmp_path / "train.py").write_text("print('started')")
    script = tmp_path / "job.qsub"
    script.write_text(pbs_script.render_script(spec))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "mpiexec").write_text(FAKE_MPIEXEC)
    (bin_dir / "mpiexec").chmod(0o755)
    logs.mkdir()
    victims = {}
    for suffix in ("exitcode", "failure"):
        victims[suffix] = tmp_path / f"victim-{suffix}"
        victims[suffix].write_text("not yours\n")
        (logs / f"job-43.{suffix}").symlink_to(victims[suffix])
    env = no_slurm_env(tmp_path)
    env.update(PATH=f"{bin_dir}:{env['PATH']}:/usr/bin:/bin", PBS_JOBID="43.server", PBS_NODEFILE="/dev/null",
               FAKE_RANKS="1", FAKE_SEEN=str(tmp_path / "seen"))
    r = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    for suffix, victim in victims.items():
        assert victim.read_text() == "not yours\n", suffix
        assert not (logs / f"job-43.{suffix}").is_symlink()
    assert (logs / "job-43.exitcode").read_text() == "2\n"
    assert "failed first with exit code 2" in (logs / "job-43.failure").read_text()
    # no temporary left (the stacks and timeline directories are kept after the job, by design)
    assert sorted(p.name for p in logs.iterdir()) == ["job-43.exitcode", "job-43.failure", "job-43.stacks",
                                                     "job-43.timeline"]


def test_pbs_script_full_output_directory_starts_no_rank(tmp_path: Path) -> None:
    """The pre-flight write test, on a real full file system (a 64 KiB tmpfs) where root can mount one."""
    logs = tmp_path / "logs"
    logs.mkdir()
    spec = golden_spec(mpi="mpich", workdir=str(tmp_path), output_dir=str(logs), python=sys.executable)
    script = tmp_path / "job.qsub"
    script.write_text(pbs_script.render_script(spec))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "mpiexec").write_text(f"#!/bin/sh\ntouch {tmp_path}/ran\n")
    (bin_dir / "mpiexec").chmod(0o755)
    env = no_slurm_env(tmp_path)
    env.update(PATH=f"{bin_dir}:{env['PATH']}:/usr/bin:/bin", PBS_JOBID="44.server", PBS_NODEFILE="/dev/null")
    # In a mount namespace of its own (gone with the command): the tmpfs shows in no other.
    inside = ('mount -t tmpfs -o size=64k tmpfs "$1" || exit 99\n'
              '"$3" -c "$4" "$1/filler" && exec bash "$2"')
    r = subprocess.run(["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", inside, "sh", str(logs),
                        str(script), sys.executable, FILL], env=env, capture_output=True, text=True, timeout=120)
    if r.returncode == 99 or "unshare failed" in r.stderr:
        skip_or_fail(f"cannot mount a tmpfs in a mount namespace of its own (needs root): {r.stderr.strip()}")
    assert r.returncode == WRITE_FAILED, r.stderr
    assert (f"slurmlaunch: cannot write in the output directory {logs}: No space left on device; no rank was "
            f"started (exit code 74)") in r.stderr.splitlines(), r.stderr
    assert not (tmp_path / "ran").exists()
