"""The warning-signal policy without a cluster (issue 15 items 2 and 3): which signal a script's framework
listens for (a look at its source), what submit then asks for, the batch script's requeue block, and the
local scheduler telling "died of the warning signal" from "saved and exited 128+N"."""

from __future__ import annotations

import re
import signal
import subprocess
from pathlib import Path

import pytest

from slurmlaunch.allocation import step_rules
from slurmlaunch.app.clients import lightning_signal, script_source
from slurmlaunch.core.spec import JobSpec, validate
from slurmlaunch.render import slurm_script
from tests.helpers import run_cli

# --- the detector: a table through the pure function ------------------------------------------------

CASES = [
    ("import lightning as L\nL.Trainer()", ("USR1", True)),
    ("import pytorch_lightning as pl", ("USR1", True)),
    ("from lightning.pytorch import Trainer", ("USR1", True)),
    ("from pytorch_lightning.callbacks import ModelCheckpoint", ("USR1", True)),
    ("def main():\n    import lightning.pytorch as pl\n", ("USR1", True)),  # an import inside a function
    ("import lightning\nfrom lightning.pytorch.plugins.environments import SLURMEnvironment\n"
     "import signal\nenv = SLURMEnvironment(requeue_signal=signal.SIGUSR2)", ("USR2", True)),
    ("import lightning\nfrom lightning.pytorch.plugins.environments import SLURMEnvironment as S\n"
     "e = lightning.pytorch.plugins.environments.SLURMEnvironment(requeue_signal=SIGHUP)", ("HUP", True)),
    ("import pytorch_lightning as pl\npl.plugins.environments.SLURMEnvironment(auto_requeue=False)",
     ("USR1", False)),
    ("import lightning\nSLURMEnvironment(requeue_signal=pick())", (None, True)),  # not readable
    ("import lightning.fabric as F", None),  # Fabric alone installs no handler
    ("from lightning_fabric import Fabric", None),
    ("import torch\nimport lightningx\nimport my_lightning", None),
    ("text = 'import lightning'", None),  # a string is not an import
    ("from .lightning import x", None),  # a local module of that name
    ("def (:", None),  # not Python
]


@pytest.mark.parametrize("source,expected", CASES)
def test_lightning_signal_from_source(source: str, expected: tuple[str | None, bool] | None) -> None:
    found = lightning_signal(source)
    assert (None if found is None else (found.signal, found.requeues)) == expected


def test_script_source_reads_the_script_or_the_module(tmp_path: Path) -> None:
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "train.py").write_text("import lightning\n")
    (tmp_path / "pkg" / "mod.py").write_text("import pytorch_lightning\n")
    (tmp_path / "pkg" / "sub" / "__main__.py").write_text("x = 1\n")
    assert script_source("train.py", False, str(tmp_path)) == "import lightning\n"
    assert script_source(str(tmp_path / "train.py"), False, "/") == "import lightning\n"
    assert script_source("pkg.mod", True, str(tmp_path)) == "import pytorch_lightning\n"
    assert script_source("pkg.sub", True, str(tmp_path)) == "x = 1\n"
    assert script_source("missing.py", False, str(tmp_path)) is None
    assert script_source("json", True, str(tmp_path)) is None  # not under the working directory: not scanned


# --- what submit asks for ----------------------------------------------------------------------------

LIT = "import lightning as L\nL.Trainer().fit(None)\n"


def _requeues(script: str) -> bool:
    """Whether the batch step's plan has it requeue the job itself (scontrol requeue)."""
    return " --requeue 3 " in script and "--requeued-by-script" not in script


def _dry(tmp_path: Path, source: str, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "train.py").write_text(source)
    return run_cli("submit", "--scheduler", "slurm", "--dry-run", "--time", "10", *args, "train.py", cwd=tmp_path)


def test_lightning_script_gets_usr1_and_the_batch_shell_leaves_the_requeue_to_it(tmp_path: Path) -> None:
    r = _dry(tmp_path, LIT, "--requeue")
    assert r.returncode == 0, r.stderr
    assert "#SBATCH --signal=B:USR1@90" in r.stdout
    assert not _requeues(r.stdout)  # Lightning's rank 0 runs it; never both
    lines = [line for line in r.stderr.splitlines() if "uses Lightning" in line]
    assert lines == ["slurmlaunch: train.py uses Lightning (imports lightning): warning signal SIGUSR1 90s before "
                     "the time limit; Lightning saves a checkpoint on it and requeues the job itself, so the batch "
                     "script will not requeue it again (--signal NAME@SECONDS overrides)"]


def test_plain_script_keeps_usr2_and_slurmlaunch_requeues(tmp_path: Path) -> None:
    r = _dry(tmp_path, "import torch\n", "--requeue")
    assert r.returncode == 0, r.stderr
    assert "#SBATCH --signal=B:USR2@90" in r.stdout and _requeues(r.stdout)
    assert "Lightning" not in r.stderr


def test_given_signal_decides(tmp_path: Path) -> None:
    r = _dry(tmp_path, LIT, "--requeue", "--signal", "USR1@200")  # Lightning's own, with other seconds
    assert "#SBATCH --signal=B:USR1@200" in r.stdout and not _requeues(r.stdout)
    r = _dry(tmp_path, LIT, "--requeue", "--signal", "USR2@60")  # not Lightning's: said, and obeyed
    assert "#SBATCH --signal=B:USR2@60" in r.stdout and _requeues(r.stdout)
    assert "which saves and requeues on SIGUSR1 only: --signal USR2@60 reaches no handler (the ranks are not sent " \
        "it: nothing is saved) unless the script handles SIGUSR2 itself" in r.stderr
    r = _dry(tmp_path, "import lightning\nfrom x import SLURMEnvironment\n"
             "SLURMEnvironment(requeue_signal=signal.SIGUSR2)\n", "--requeue")
    assert "#SBATCH --signal=B:USR2@90" in r.stdout and not _requeues(r.stdout)
    r = _dry(tmp_path, "import lightning\nSLURMEnvironment(auto_requeue=False)\n", "--requeue")
    assert "#SBATCH --signal=B:USR2@90" in r.stdout and _requeues(r.stdout)


def test_requeued_by_is_validated() -> None:
    with pytest.raises(Exception, match="requeued_by 'lightning' is not valid"):
        validate(JobSpec.of(script="x.py", requeued_by="lightning"))


def _script(tmp_path: Path, **kw: object) -> str:
    (tmp_path / "x.py").write_text("pass\n")
    return slurm_script.render_script(validate(JobSpec.of(script="x.py", workdir=str(tmp_path), **kw)))


def test_batch_script_hands_the_warning_signal_to_the_batch_step(tmp_path: Path) -> None:
    text = _script(tmp_path, time="10", requeue=True)
    assert " --warning USR2 --requeue 3 " in text and "#SBATCH --signal=B:USR2@90" in text


def test_batch_step_reports_killed_ranks() -> None:
    """The batch step's warning rule, on srun's lines: only ranks the warning signal ended are named, in
    srun's words (strsignal's), whatever srun calls the others."""
    words = signal.strsignal(signal.SIGUSR2) or ""
    assert words == "User defined signal 2"
    lines = ["srun: error: node1: task 0: User defined signal 2",
             "srun: error: node2: tasks 1-3: User defined signal 2 (core dumped)",
             "srun: error: node3: task 4: Terminated",
             "srun: error: node3: task 5: Exited with exit code 140"]
    assert step_rules.srun_killed_by(lines, words) == "task 0 on node1, tasks 1-3 on node2"
    assert step_rules.srun_killed_by(lines[3:], words) == ""


# --- the local scheduler ----------------------------------------------------------------------------

# Prints how long it has run, every 0.2 s: a line "alive N" proves the script was alive N s after its own start,
# which is later than the scheduler's (the warning is timed from there).
HEARTBEAT = ("import time\nstart = time.monotonic()\nwhile True:\n"
             "    print(f'alive {time.monotonic() - start:.1f}', flush=True)\n    time.sleep(0.2)\n")


def _alive_for(out: str) -> float:
    return max((float(m) for m in re.findall(r"alive ([0-9.]+)", out)), default=0.0)


def test_local_script_without_a_handler_runs_to_its_limit(tmp_path: Path) -> None:
    """Issue 40 item 3: the default warning (here USR2 4 s into a 10 s limit) must not kill a script that never
    asked for it: it goes only to ranks with a handler, so these run on to the limit, which the job then reads
    (TIMEOUT, stopped by the limit's SIGTERM: 143), not "killed by the warning" (before: exit 140 at 4 s)."""
    (tmp_path / "plain.py").write_text(HEARTBEAT)
    r = run_cli("submit", "--scheduler", "local", "--nodes", "2", "--time", "0:10", "--signal", "USR2@6",
                "plain.py", cwd=tmp_path, timeout=120)
    assert r.returncode == 128 + signal.SIGTERM, r.stderr
    assert "reached its time limit (--time 0:10); the ranks were stopped (state TIMEOUT)" in r.stderr, r.stderr
    assert "the warning signal" not in r.stderr
    assert "SIGUSR2, the time limit's warning: sent to no rank; left alone: ranks 0-1 (no handler" in r.stderr
    assert _alive_for(r.stdout) >= 7.0, r.stdout[-2000:]  # well past the warning (4 s), up to the limit


def test_local_rank_killed_by_a_term_warning_is_not_a_saved_checkpoint(tmp_path: Path) -> None:
    """A warning that is also a stop signal (TERM) is not ignored (docs: Time limits): a script without a
    handler dies of it, which is named, not requeued, and ends with 79 ("killed by the warning, nothing saved"),
    not the 128 + N (143) that would read as "saved, requeue me"."""
    (tmp_path / "plain.py").write_text(HEARTBEAT)
    r = run_cli("submit", "--scheduler", "local", "--nodes", "2", "--time", "0:10", "--signal", "TERM@7",
                "--requeue", "plain.py", cwd=tmp_path, timeout=120)
    assert r.returncode == 79, r.stderr
    # both ranks get the warning at once; under load one may still be starting (in the launcher, before its
    # exec) when the other's death stops the job, and is then stopped by SIGTERM: the line names who died of it
    assert re.search(r"rank\(s\) (0, 1|0|1) killed by SIGTERM, the warning signal: the script does not handle it, "
                     r"so nothing was saved and the job is not requeued\. Fix: handle SIGTERM in the script",
                     r.stderr), r.stderr
    assert "requeued" not in r.stderr.replace("not requeued", "")
    assert _alive_for(r.stdout) < 6.0, r.stdout[-2000:]


def test_local_rank_that_saved_and_exited_140_is_requeued(tmp_path: Path) -> None:
    (tmp_path / "saver.py").write_text(
        "import os, signal, sys, time\n"
        "signal.signal(signal.SIGUSR2, lambda *_: sys.exit(140))\n"
        "if os.environ.get('SLURM_RESTART_COUNT'):\n    print('resumed', flush=True)\n    sys.exit(0)\n"
        "time.sleep(120)\n")
    r = run_cli("submit", "--scheduler", "local", "--nodes", "2", "--time", "1", "--signal", "USR2@57",
                "--requeue", "saver.py", cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "requeued (restart 1 of at most 3)" in r.stderr and "the warning signal" not in r.stderr
    assert r.stdout.count("resumed") == 2


def test_local_lightning_script_gets_usr1(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(LIT)
    r = run_cli("submit", "--scheduler", "local", "--dry-run", "--time", "10", "train.py", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "SIGUSR1 to every rank 90s before" in r.stdout
    assert "Lightning saves a checkpoint on it (--signal" in r.stderr


