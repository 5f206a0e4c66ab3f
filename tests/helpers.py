"""What several test modules share: constants, process helpers, environments and case tables.

Test modules import from here (and fixtures come from conftest.py); no test module imports another, so each
can be read, moved or deleted on its own.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from slurmlaunch.core import hostlist
from slurmlaunch.core.errors import SpecError
from slurmlaunch.core.spec import JobSpec, validate
from tests import ports

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
IN_CI = os.environ.get("CI", "").lower() == "true"


def skip_or_fail(reason: str) -> None:
    """Under CI a missing piece is a failure, never a skip."""
    if IN_CI:
        pytest.fail(f"required under CI=true: {reason}")
    pytest.skip(reason)


def run_cli(*args: str, env: dict[str, str] | None = None, cwd: str | Path | None = None,
            timeout: float = 120, input_text: str | None = None) -> subprocess.CompletedProcess[str]:
    """slurmlaunch as a user runs it: a separate process, its exit code and both streams."""
    return subprocess.run([sys.executable, "-m", "slurmlaunch", *args], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=timeout, input=input_text)


def per_test_env(cluster: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """A session-wide cluster's client environment for one test: its own per-user state (the index of jobs
    that `slurmlaunch jobs/status` read, doctor's site.json that submit reads) under ``tmp_path``, so no test
    sees another's submissions or site facts."""
    state = tmp_path / "state"
    state.mkdir(parents=True, exist_ok=True)
    return {**cluster, "XDG_STATE_HOME": str(state)}


# --- the local scheduler's processes: a rank script that records its pid, waiting on files ---------------
# A rank that says it is ready (pid-RANK, written whole, only once its USR1 handler is installed: a test may
# signal as soon as it sees the file), records each USR1 (usr1-RANK) and sleeps; the rank argv[2] exits with
# code argv[3] once every rank is ready (bounded), so "the others were running" is known, not guessed.
SLEEPER = """
import os, signal, sys, time
d, rank, world = sys.argv[1], int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
def on_usr1(*_):
    open(os.path.join(d, f"usr1-{rank}"), "w").close()
signal.signal(signal.SIGUSR1, on_usr1)
with open(os.path.join(d, f".pid-{rank}"), "w") as f:
    f.write(str(os.getpid()))
os.replace(os.path.join(d, f".pid-{rank}"), os.path.join(d, f"pid-{rank}"))
if rank == int(sys.argv[2]):
    deadline = time.monotonic() + 60
    while sum(n.startswith("pid-") for n in os.listdir(d)) < world and time.monotonic() < deadline:
        time.sleep(0.05)
    sys.exit(int(sys.argv[3]))
time.sleep(120)
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is not alive for our purposes
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def wait_for_files(d: Path, pattern: str, n: int, timeout: float = 60) -> list[Path]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = sorted(d.glob(pattern))
        if len(found) >= n:
            return found
        time.sleep(0.1)
    raise AssertionError(f"{n} files {pattern} did not appear in {d} within {timeout}s")


# --- rank scripts that leave processes behind (daemons, sleepers in their own sessions) ----------------------
# Every rank starts a daemon of its own (double fork into a new session: it escapes the rank's process
# group and is re-parented away from the rank) that keeps the rank's stdout open and sleeps; then rank 1
# segfaults. The daemons' pids go to files.
DAEMONS = """
import os, signal, sys, time
rank = int(os.environ["RANK"])
d = sys.argv[1]
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        open(os.path.join(d, f"daemon-{rank}"), "w").write(str(os.getpid()))
        time.sleep(300)
    os._exit(0)
while len([n for n in os.listdir(d) if n.startswith("daemon-")]) < int(os.environ["WORLD_SIZE"]):
    time.sleep(0.05)
if rank == 1:
    os.kill(os.getpid(), signal.SIGSEGV)
time.sleep(300)
"""


SLEEPERS = """
import os, subprocess, sys, time
rank = int(os.environ["RANK"])
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
open(os.path.join(sys.argv[1], f"pid-{rank}"), "w").write(f"{os.getpid()} {child.pid}")
print("ready", flush=True)
time.sleep(300)
"""


# --- requests and their scripts: a laptop's environment, the golden requests, hostile strings ---------------
GOLDEN = Path(__file__).parent / "golden"


def no_slurm_env(tmp_path: Path) -> dict[str, str]:
    """A PATH without sbatch (as on a laptop), HOME in tmp (no user templates)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    env["HOME"] = str(tmp_path)
    env.pop("XDG_CONFIG_HOME", None)
    tools = tmp_path / "no-slurm-bin"
    tools.mkdir(exist_ok=True)
    for tool in ("bash", "sh", "env", "true"):
        found = shutil.which(tool)
        if found and not (tools / tool).exists():
            (tools / tool).symlink_to(found)
    env["PATH"] = f"{Path(sys.executable).parent}:{tools}"
    return env


def golden_spec(**kw: object) -> JobSpec:
    base: dict[str, object] = dict(script="train.py", args=("--lr", "0.1"), nodes=2, gpus_per_node=4,
                                   python="/opt/venv/bin/python", workdir="/home/me/project")
    base.update(kw)
    return JobSpec.of(**base)


GOLDEN_CASES = {
    "slurm_basic.sbatch": golden_spec(),
    "slurm_full.sbatch": golden_spec(
        cpus_per_gpu=8, mem="64G", time="1-00:00:00", partition="gpu", account="proj42", qos="high",
        constraint="a100", exclusive=True, env=(("WANDB_MODE", "offline"), ("WEIRD", "it's $(x) `y`\nz")),
        setup=("module load cuda/12.4", "source /opt/venv/bin/activate"), sbatch_args=("--mail-type=END",),
        master_port=23456, gpu_flag="gres", output_dir="logs", requeue=True, max_requeues=2, signal="TERM@300",
        rdzv_timeout=60),
    "slurm_cpu_module.sbatch": golden_spec(script="pkg.train", module=True, gpus_per_node=0, tasks_per_node=3,
                                           nodes=1, args=()),
    "slurm_sweep.sbatch": golden_spec(sweep=(("lr", ("0.1", "0.01")), ("tag", ("a b", "$(touch x)'"))),
                                      max_parallel=2, gpus_per_node=0, tasks_per_node=2),
    "slurm_array.sbatch": golden_spec(array="1-7:3,10", nodes=1),
    "slurm_pyxis.sbatch": golden_spec(container_image="nvcr.io#nvidia/pytorch:24.05-py3", python="python3",
                                      container_mounts=("/scratch:/scratch:ro", "/data:/data"),
                                      container_workdir="/workspace"),
    "slurm_apptainer.sbatch": golden_spec(apptainer="/images/torch.sif", python="python3", mode="torchrun",
                                          container_mounts=("/scratch:/scratch",)),
    "slurm_torchrun.sbatch": golden_spec(mode="torchrun", nodes=4, min_nodes=2, max_restarts=3, cpus_per_gpu=2,
                                         requeue=True),
}


def assert_refused(tmp_path: Path, expect: str, **kw: object) -> None:
    """validate() refuses JobSpec.of(**kw) for a script that exists, with a message containing ``expect``."""
    (tmp_path / "t.py").write_text("")
    with pytest.raises(SpecError, match=re.escape(expect)):
        validate(JobSpec.of(script="t.py", workdir=str(tmp_path), **kw))


def fake_sbatch(tmp_path: Path) -> Path:
    fake = tmp_path / "fakebin"
    fake.mkdir(exist_ok=True)
    (fake / "sbatch").write_text("#!/bin/sh\nexit 99\n")
    (fake / "sbatch").chmod(0o755)
    return fake


HOSTILE = ["$(touch PWNED)", "`touch PWNED`", "a b  c", "it's", 'say "hi"', "back\\slash", "new\nline",
           "; touch PWNED", "&& touch PWNED", "| touch PWNED", "$HOME", "${PATH}", "*", "~", "#not a comment",
           "--job-name=x", "\t", "é ü 中文", "!!", "$((1+1))", "<(touch PWNED)", "> PWNED", "%j %t", "\\n",
           "'$(touch PWNED)'", '"$(touch PWNED)"', "\r", "-", "", "a=b"]


# --- torch's teardown aborts (README: Teardown aborts) --------------------------------------------------------
def teardown_abort_only(log: str) -> bool:
    """torch 2.13 may abort a rank at interpreter exit after its training finished (README: Teardown aborts).
    The job then fails, honestly, and the console or batch log names each such rank. For tests of training
    runs: a failure of that kind alone (the only failure line is a torchrun node's 1 or a rank's 134, or none,
    as srun reports an aborted task without an exit code), with the training's output checked in full by the
    caller, is torch's and not the test's. Any other failure is the test's."""
    # each line once: `submit --wait` repeats the batch log's first-failure line on the console, and callers
    # join both; two different lines (two array elements) stay two
    lines = dict.fromkeys(re.findall(r"^slurmlaunch: .*failed first with exit code \d+.*$", log, re.M))
    failed = [re.search(r"failed first with exit code (\d+)", line)[1] for line in lines]  # type: ignore[index]
    teardown = re.findall(r"rank \d+ aborted in torch's teardown after the script returned", log)
    return bool(teardown) and failed in ([], ["1"], ["134"])


# --- what srun sets for a task ---------------------------------------------------------------------------------
def compress(counts: list[int]) -> str:
    """Slurm's N(xR) form of a list of counts."""
    out: list[str] = []
    i = 0
    while i < len(counts):
        j = i
        while j < len(counts) and counts[j] == counts[i]:
            j += 1
        out.append(f"{counts[i]}(x{j - i})" if j - i > 1 else str(counts[i]))
        i = j
    return ",".join(out)


def step_env(nodelist: str, counts: list[int], rank: int, job: int = 1234, step: int = 0,
             **extra: str) -> dict[str, str]:
    """What srun sets for task ``rank`` of a block-distributed step (as observed on Slurm 22.05)."""
    hosts = hostlist.expand(nodelist)
    node, before = 0, 0
    while rank >= before + counts[node]:
        before += counts[node]
        node += 1
    env = {
        "SLURM_JOB_ID": str(job), "SLURM_JOBID": str(job), "SLURM_STEP_ID": str(step), "SLURM_STEPID": str(step),
        "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank - before), "SLURM_NODEID": str(node),
        "SLURM_NTASKS": str(sum(counts)), "SLURM_STEP_NUM_TASKS": str(sum(counts)),
        "SLURM_STEP_NODELIST": nodelist, "SLURM_NODELIST": nodelist, "SLURM_JOB_NODELIST": nodelist,
        "SLURM_STEP_NUM_NODES": str(len(hosts)), "SLURM_NNODES": str(len(hosts)),
        "SLURM_STEP_TASKS_PER_NODE": compress(counts), "SLURM_TASKS_PER_NODE": compress(counts),
        "SLURMD_NODENAME": hosts[node],
    }
    env.update(extra)
    return env


# --- the launcher as a process ---------------------------------------------------------------------------------
def clean_env(**extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("SLURM", "MASTER_", "RANK", "WORLD_", "LOCAL_", "TORCHELASTIC", "OMP_",
                                 "CUDA_VISIBLE"))}
    base["SLURMLAUNCH_ALLOW_LOOPBACK"] = "1"  # several "nodes" on this one machine
    base.update(extra)
    return base


def launch(*args: str, env: dict[str, str], cwd: Path | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "slurmlaunch", "launch", *args], env=env, cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


# --- node list expressions: our table, checked against scontrol in test_hostlist_scontrol ----------------------
# (expression, hosts as scontrol show hostnames prints them)
VALID = [
    ("", []),
    ("node1", ["node1"]),
    ("node1-5", ["node1-5"]),
    ("a,a,b", ["a", "a", "b"]),
    ("a b\tc", ["a", "b", "c"]),
    (",a", ["a"]),
    ("n[1-2],,m", ["n1", "n2", "m"]),
    ("n[1-3],", ["n1", "n2", "n3"]),
    ("node[01-10]", [f"node{i:02d}" for i in range(1, 11)]),
    ("node[009-11]", ["node009", "node010", "node011"]),
    ("node[1-010]", [f"node{i}" for i in range(1, 11)]),
    ("n[9-010]", ["n9", "n10"]),
    ("n[01-9]", [f"n{i:02d}" for i in range(1, 10)]),
    ("n[001-3]", ["n001", "n002", "n003"]),
    ("n[00-00]", ["n00"]),
    ("n[007]", ["n007"]),
    ("n[1,01]", ["n1", "n01"]),
    ("n[1-3,5]", ["n1", "n2", "n3", "n5"]),
    ("n[9-11],n[1]", ["n9", "n10", "n11", "n1"]),
    ("n[1-]", ["n1"]),
    ("n[3-3]", ["n3"]),
    ("n[ 1-2]", ["n01", "n02"]),
    ("n[1 -2]", ["n01", "n02"]),
    ("n[+1-2]", ["n01", "n02"]),
    ("n[1y-2]", ["n01", "n02"]),
    ("n[1- 2]", ["n1", "n2"]),
    ("n[1, 2]", ["n1", "n02"]),
    ("n[18446744073709551614]", ["n18446744073709551614"]),
    ("n[18446744073709551615]", ["n18446744073709551615"]),  # alone in the last bracket: Slurm copes
    ("n[018446744073709551615-]", ["n018446744073709551615"]),
    ("a[1-2]b[1,18446744073709551615]", ["a1b1", "a1b18446744073709551615", "a2b1", "a2b18446744073709551615"]),
    ("n[18446744073709551613-18446744073709551614]", ["n18446744073709551613", "n18446744073709551614"]),
    ("n18446744073709551615", ["n18446744073709551615"]),
    ("n000000000000000000000000000000018446744073709551615", ["n000000000000000000000000000000018446744073709551615"]),
    ("n[0000000000000000000000000000000000000000000000000000000000000001]", ["n" + "0" * 63 + "1"]),
    ("gpu-[001-004,010]", ["gpu-001", "gpu-002", "gpu-003", "gpu-004", "gpu-010"]),
    ("rack[1-2]-node[01-02]", ["rack1-node01", "rack1-node02", "rack2-node01", "rack2-node02"]),
    ("a[1-2][3-4]", ["a13", "a14", "a23", "a24"]),
    ("n[1-2]-[3-4]", ["n1-3", "n1-4", "n2-3", "n2-4"]),
    ("[1-2]", ["1", "2"]),
    ("[1]-[2]", ["1-2"]),
    ("n[1,2]x[3,4]", ["n1x3", "n1x4", "n2x3", "n2x4"]),
    ("n[1, 2]x[3, 4]", ["n1x3", "n1x04", "n02x3", "n02x04"]),
    ("a[1-2]b[3-4]c[5-6]", ["a1b3c5", "a1b3c6", "a2b3c5", "a2b3c6", "a1b4c5", "a1b4c6", "a2b4c5", "a2b4c6"]),
    ("a[1-2]b[3-4]c[5-6]d[7]", ["a1b3c5d7", "a2b3c5d7", "a1b4c5d7", "a2b4c5d7",
                                "a1b3c6d7", "a2b3c6d7", "a1b4c6d7", "a2b4c6d7"]),
    ("a]", ["a]"]),
    ("a]b[1]", ["a]b1"]),
    ("a]b[c[1]", ["a]b[c1"]),
    ("a[1]b[c[2]", ["a[1]b[c2"]),
    ("0[[01-2]", ["0[01", "0[02"]),
    ("a\nb", ["a\nb"]),
    ("rack[1-2]-node[01-02],x", ["rack1-node01", "rack1-node02", "rack2-node01", "rack2-node02", "x"]),
    # Issue 14: a bracket holding a separator after an already closed bracket is still the same term.
    ("rack[1-2]-node[01,03]", ["rack1-node01", "rack1-node03", "rack2-node01", "rack2-node03"]),
    ("gpu[1-100]-ib[0,2]", [f"gpu{i}-ib{j}" for i in range(1, 101) for j in (0, 2)]),
    ("a[2-3]b[1,4],a5b1", ["a2b1", "a2b4", "a3b1", "a3b4", "a5b1"]),
    ("a[3-29]p[1-9,50-58]", [f"a{i}p{j}" for i in range(3, 30) for j in [*range(1, 10), *range(50, 59)]]),
    ("a[1,2] b[3, 4]", ["a1", "a2", "b3", "b04"]),  # a space inside a bracket is part of the range
    ("a[1,2]	b[3,4]c[5,6]", ["a1", "a2", "b3c5", "b3c6", "b4c5", "b4c6"]),
    ("x[1,2]y[3,4]z[5,6]", ["x1y3z5", "x1y3z6", "x2y3z5", "x2y3z6", "x1y4z5", "x1y4z6", "x2y4z5", "x2y4z6"]),
    ("a[1,[2],3]", ["a[1,2", "3]"]),  # the term ends at the first ']' that follows a separator
    ("a[1],b]", ["a1", "b]"]),
    ("]a", ["]a"]),
    ("a[1-2]b[3],[4]", ["a1b3", "a2b3", "4"]),
    ("r[0-65535]s[1]", [f"r{i}s1" for i in range(65536)]),  # a bracket before the last: 65536 is allowed
    ("r[0-30000,30001-65535]s[1-2]", [f"r{i}s{j}" for i in range(65536) for j in (1, 2)]),
]


INVALID = [
    "node[5-3]", "n[10-9]", "n[]", "n[a-b]", "n[1-2]]", "n[1-3,5]x", "x[1-3]y", "n[1-2]-b", "n[1-2].dom",
    "n[-2]", "n[-1--2]", "n[1-2-3]", "n[1,]", "n[,1]", "n[1,,2]", "n[1-2,3 ]", "n[0x1]", "n[1x-2]",
    "n[1-1e2]", "a[]b[1]", "a[1]b[]", "a[x]b[1]", "x[1]y]z[2]", "a[1-2]b]", "n[0-65536]", "n[0-999999]",
    "n[1-2]\ny", "a[1-2]b[3-4]c",
    # Issue 14: rightly refused, for the right reason (see test_refusal_reasons).
    "da[1-10]c[1-2,8]p0",
    # Slurm's bounds: 65537 hosts in a range, or in a bracket before the last one.
    "n[0-65536]", "a[0-65535,0]b[1]", "a[1-32768,1-32769]b[1-2]",
    # Slurm 22.05 logs an error in a bracket third from last or earlier but then drops the term and
    # carries on (it answers "d" for the first): we refuse.
    "a[x]b[1]c[2],d", "a[5-3]b[1-2]c[2],d", "a[x]b[1-2]c[2]d[3],e",
    # Numbers at or above 2**64-1: Slurm clamps them, and crashes or hangs on a range that reaches 2**64-1.
    "n[18446744073709551616]", "n[18446744073709551614-18446744073709551615]", "n[099999999999999999999]",
    "a[18446744073709551615]b[1-2]", "n18446744073709551616", "n99999999999999999999999",
    # Longer than a host name can be: at most 64 digits in a number.
    "n[00000000000000000000000000000000000000000000000000000000000000001]",
    # Slurm 22.05 mangles an unclosed '[' into a host that does not exist ("n[1-2" -> "n]"); we refuse.
    "n[1-2", "n[", "n1,n[2", "[", "][", "][,[0+]", "a]b[1,2]",
]


# Every test process (a pytest-xdist worker, or pytest alone) holds a slot of its own on this machine
# (tests/ports.py), and its clusters' job ids start in that slot's block: a job's MASTER_PORT is derived from its
# id (envvars.derive_port), so two loopback clusters' job 7 (two workers', or two test runs') would otherwise
# rendezvous on the same port of 127.0.0.1. The block's parts, one per cluster that can be up at once:
JOB_IDS_PER_WORKER = ports.JOB_IDS_PER_SLOT
JOB_ID_BLOCKS = {
    "session": (0, 1100),       # the session's Slurm 22.05 cluster (conftest.slurm_cluster)
    "stacks": (1100, 1200),     # test_stacks' cluster of its own
    "faults": (1200, 1300),     # test_slurm_faults' clusters (one at a time)
    "faults-big": (1300, 1400),
    "current": (1400, 1900),    # the session's current Slurm (25.11) cluster
    "launch": (1900, 2000),     # launchers run outside any cluster (launch_job_id)
}


def first_job_id(block: str = "session", slot: int | None = None) -> int:
    """The first job id of ``block`` (JOB_ID_BLOCKS) in this process's slot (or ``slot``'s)."""
    n = ports.slot() if slot is None else slot
    return 1 + n * JOB_IDS_PER_WORKER + JOB_ID_BLOCKS[block][0]


def launch_job_id(n: int = 0, slot: int | None = None) -> int:
    """A job id for a test that runs launchers outside any cluster (step_env's ``job``), the ``n``th (0-99) of
    the slot's "launch" block, which no cluster hands out: the ranks derive MASTER_PORT from it, and a fixed id
    would put every worker and every test run on this machine on one port."""
    assert 0 <= n < 100, n
    return first_job_id("launch", slot) + n


class StaleShimLockSweeper:
    """Removes the lock pyenv's rehash leaves behind when it is killed, on machines whose login shells run
    `pyenv init -` (this project's machines do, from root's ~/.bashrc). Every PBS job starts in a login shell,
    so it rehashes; the real-PBS tests kill jobs on purpose (qdel, the walltime, the dev cluster's down), and a
    job killed inside its rehash leaves ``$PYENV_ROOT/shims/.pyenv-shim``. Every later job's login shell then
    waits PYENV_REHASH_TIMEOUT (60 s) on it before the script runs, and short-walltime tests fail (seen in CI
    run 6). A rehash holds the lock for a second or two, so a lock older than ``stale_s`` is removed, as
    pyenv's own release_lock would have; nothing else is touched."""

    def __init__(self, lock: Path | None = None, stale_s: float = 30.0, every_s: float = 2.0) -> None:
        root = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")
        self.lock = lock or root / "shims" / ".pyenv-shim"
        self.stale_s, self.every_s = stale_s, every_s
        self.removed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pyenv-lock-sweeper", daemon=True)

    def sweep(self) -> None:
        try:
            if time.time() - self.lock.stat().st_mtime > self.stale_s:
                self.lock.unlink()
                self.removed += 1
                sys.stderr.write(f"tests: removed a stale pyenv rehash lock {self.lock} (a killed job's)\n")
        except FileNotFoundError:
            pass

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.sweep()

    def start(self) -> None:
        self.sweep()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
