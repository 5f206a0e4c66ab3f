"""The one line submit prints for a client that cannot join the world the job would give it (app/clients.py
client_notes): a table through the pure function, the matrix's own client scripts (tests/clients/, the ones
that ran and showed it: tests/real/test_clients.py test_pbs for idr-torch under PBS), and the line itself
from `submit --dry-run` per scheduler."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from slurmlaunch.app.clients import client_notes, nested_torchrun
from tests.helpers import run_cli

CLIENTS = Path(__file__).resolve().parents[1] / "clients"

IDR = "idr-torch, which finds its world only"
MM = "MMEngine, whose init_dist"

# (source, the ranks see a Slurm step's variables, GPUs per node) -> the clients named
CASES = [
    ("import idr_torch\nidr_torch.init_process_group(backend='gloo')", False, 0, [IDR]),
    ("from idr_torch import rank", False, 4, [IDR]),
    ("def main():\n    import idr_torch.api\n", False, 0, [IDR]),
    ("import idr_torch", True, 0, []),  # a Slurm step (real or the local scheduler's): idr-torch's Slurm API
    ("from .idr_torch import x", False, 0, []),  # a local module of that name
    ("text = 'import idr_torch'", False, 0, []),  # a string is not an import
    ("from mmengine.dist import init_dist\ninit_dist('pytorch', backend='gloo')", True, 0, [MM]),
    ("import mmengine.dist as d\nd.init_dist('slurm')", False, 0, [MM]),
    ("from mmengine.runner import Runner\nRunner.from_cfg(cfg).train()", True, 0, [MM]),
    ("from mmengine.dist import init_dist\ninit_dist('pytorch')", True, 2, []),  # GPUs asked for
    ("from mmengine.config import Config\nConfig.fromfile('x.py')", True, 0, []),  # no world started
    ("import idr_torch\nfrom mmengine.dist import init_dist\ninit_dist('mpi')", False, 0, [IDR, MM]),
    ("import torch.distributed as dist\ndist.init_process_group('gloo')", False, 0, []),
    ("def (:", False, 0, []),  # not Python
]


@pytest.mark.parametrize("source,slurm_step,gpus,expected", CASES)
def test_client_notes_from_source(source: str, slurm_step: bool, gpus: int, expected: list[str]) -> None:
    notes = client_notes(source, slurm_step, gpus)
    assert [next(e for e in (IDR, MM) if n.startswith(e)) for n in notes] == expected, notes


def test_the_matrix_scripts() -> None:
    """The client scripts that run in the matrix: only idr-torch's is named, and only outside a Slurm step."""
    for script in sorted(CLIENTS.glob("*.py")):
        source = script.read_text()
        assert client_notes(source, True, 0) == [], script.name
        expected = [IDR] if script.name == "idr_torch_train.py" else []
        assert [n[:len(IDR)] for n in client_notes(source, False, 0)] == expected, script.name


@pytest.mark.parametrize("scheduler,named", [("pbs", True), ("slurm", False), ("local", False)])
def test_submit_says_it_in_one_line(tmp_path: Path, scheduler: str, named: bool) -> None:
    (tmp_path / "train.py").write_text((CLIENTS / "idr_torch_train.py").read_text())
    r = run_cli("submit", "--scheduler", scheduler, "--dry-run", "--nodes", "2", "train.py", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if "idr-torch" in ln]
    assert lines == ([f"slurmlaunch: train.py uses {IDR} in a Slurm step's or torchrun's variables: here every "
                      "rank would be a world of one and train alone (docs: Works with)"] if named else []), r.stderr


# --- a torchrun in every task ---------------------------------------------------------------------------------

# (script, args, -m, tasks) -> named
TORCHRUN_CASES = [
    ("torchrun", ["--nproc-per-node", "2", "train.py"], False, 2, True),
    ("/opt/venv/bin/torchrun", ["--nproc_per_node=4", "train.py"], False, 8, True),  # its entry script
    ("python3", ["-m", "torch.distributed.run", "--nproc-per-node", "2", "train.py"], False, 2, True),
    ("python", ["-m", "torch.distributed.launch", "train.py"], False, 2, True),
    ("torch.distributed.run", ["--nproc-per-node", "2", "train.py"], True, 4, True),  # submit -m
    ("torchrun", ["--nproc-per-node", "2", "train.py"], False, 1, False),  # one task: one torchrun, one world
    ("torchrun", ["--nnodes", "2", "--rdzv-endpoint", "node1:29400", "train.py"], False, 2, False),  # its own
    ("torchrun", ["--nnodes=2", "--master_addr=node1", "train.py"], False, 2, False),
    ("train.py", ["--torchrun"], False, 4, False),
    ("python3", ["train.py", "-m", "torch.distributed.run"], False, 4, False),
    ("torchrun_helper.py", [], False, 4, False),
    ("torch.distributed.elastic", [], True, 4, False),
]


@pytest.mark.parametrize("script,args,module,tasks,named", TORCHRUN_CASES)
def test_nested_torchrun(script: str, args: list[str], module: bool, tasks: int, named: bool) -> None:
    note = nested_torchrun(script, args, module, tasks)
    assert (note is not None) == named, note
    if note:
        assert note.startswith(f"each of the job's {tasks} tasks would start a torchrun of its own"), note


@pytest.mark.parametrize("options,named", [(["--no-python", "torchrun"], True),
                                           (["--mode", "torchrun", "--nproc-per-node", "2", "train.py"], False),
                                           (["train.py"], False)])
def test_submit_says_it_for_torchrun_in_every_task(tmp_path: Path, options: list[str], named: bool) -> None:
    (tmp_path / "train.py").write_text("print('hello')\n")
    extra = ["--nproc-per-node", "2", "train.py"] if options[-1] == "torchrun" else []
    r = run_cli("submit", "--scheduler", "slurm", "--dry-run", "--nodes", "2", *options, *extra, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if "torchrun of its own" in ln]
    assert len(lines) == (1 if named else 0), r.stderr


ROOT_NOTE = "this job is root's: Open MPI's mpiexec starts no rank as root"


@pytest.mark.skipif(os.geteuid() != 0, reason="the line is for jobs submitted by root")
@pytest.mark.parametrize("scheduler,options,missing", [
    ("pbs", [], ["OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"]),
    ("pbs", ["--env", "OMPI_ALLOW_RUN_AS_ROOT=1"], ["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"]),
    ("pbs", ["--env", "OMPI_ALLOW_RUN_AS_ROOT=1", "--setup", "export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"], []),
    ("pbs", ["--mpi", "mpich"], []),  # Hydra's mpiexec has no such rule
    ("slurm", [], []),  # srun starts the ranks, and sbatch passes the shell's variables on
])
def test_submit_says_what_roots_pbs_job_needs(tmp_path: Path, scheduler: str, options: list[str],
                                              missing: list[str]) -> None:
    """The PBS dev cluster's jobs are root's: without both variables every one failed at once (exit code 1,
    "mpiexec has detected an attempt to run as root" in its output)."""
    (tmp_path / "train.py").write_text("print('hello')\n")
    r = run_cli("submit", "--scheduler", scheduler, "--dry-run", "--nodes", "2", *options, "train.py", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ROOT_NOTE in ln]
    assert len(lines) == (1 if missing else 0), r.stderr
    if missing:
        assert lines[0].endswith(f"add {' '.join(f'--env {name}=1' for name in missing)}, or the job fails at once")


# --- the scan reads a file the user named: bounded, regular files only -----------------------------------------

def test_the_scan_reads_only_a_regular_file_and_at_most_its_bound(tmp_path: Path) -> None:
    """script_source opens the file without blocking and reads nothing but a regular file: a FIFO (whose open
    alone would wait for a writer for ever), a terminal or /dev/zero is no source; nor is a directory, a
    symlink loop or a file past MAX_SOURCE_BYTES. Bytes that are not UTF-8 are read all the same."""
    from slurmlaunch.app.clients import MAX_SOURCE_BYTES, script_source

    os.mkfifo(tmp_path / "fifo.py")
    (tmp_path / "pkg").mkdir()
    os.mkfifo(tmp_path / "pkg" / "__main__.py")
    (tmp_path / "loop.py").symlink_to(tmp_path / "loop.py")
    (tmp_path / "big.py").write_bytes(b"import idr_torch\n" + b"#" * MAX_SOURCE_BYTES)
    (tmp_path / "latin.py").write_bytes(b"import idr_torch\n# caf\xe9\n")
    for script, module in [("fifo.py", False), ("fifo", True), ("pkg", True), ("/dev/zero", False),
                           ("/dev/null", False), ("loop.py", False), ("big.py", False), (str(tmp_path), False)]:
        assert script_source(script, module, str(tmp_path)) is None, script
    assert script_source("latin.py", False, str(tmp_path)) == "import idr_torch\n# caf\ufffd\n"


def test_submit_with_a_fifo_for_the_module_goes_on_without_a_note(tmp_path: Path) -> None:
    """-m names a module whose file is a FIFO (nothing ever writes to it): submit --dry-run ends, prints its
    script and no client line (before, it waited in the FIFO's open for ever). A FIFO as SCRIPT is refused in
    one line, as no regular file."""
    os.mkfifo(tmp_path / "train.py")
    r = run_cli("submit", "--scheduler", "slurm", "--dry-run", "--nodes", "2", "-m", "train", cwd=tmp_path, timeout=60)
    assert r.returncode == 0 and "#SBATCH" in r.stdout and "uses" not in r.stderr, r.stderr
    r = run_cli("submit", "--scheduler", "slurm", "--dry-run", "train.py", cwd=tmp_path, timeout=60)
    assert (r.returncode, r.stdout) == (2, ""), r.stderr
    assert r.stderr == ("slurmlaunch: error: script 'train.py' is not a regular file (a FIFO or a device; expected a "
                        "Python file)\n"), r.stderr


@pytest.mark.parametrize("name", ["..etc.passwd", "/etc/passwd", "a..b", ".x", "pkg.", "my-pkg.train", "pkg/train",
                                  "$(touch pwned)", "a\nb"])
def test_a_module_name_that_python_m_cannot_take_is_refused(tmp_path: Path, name: str) -> None:
    """-m takes dotted Python names: a path, a relative name or an empty part would fail on every rank, and
    would have the client scan look outside the working directory. One line, exit 2, nothing run."""
    r = run_cli("submit", "--scheduler", "slurm", "--dry-run", "-m", name, cwd=tmp_path, timeout=60)
    assert (r.returncode, r.stdout) == (2, ""), r.stderr
    assert r.stderr.count("\n") == 1 and "is not a module name (expected dotted Python names" in r.stderr, r.stderr
    assert not (tmp_path / "pwned").exists()


def test_a_file_given_with_m_is_refused_with_what_was_meant(tmp_path: Path) -> None:
    """submit -m train.py where train.py is a file: python -m would look for a package train; the line says to
    leave out -m (or drop .py)."""
    (tmp_path / "train.py").write_text("print('hi')\n")
    r = run_cli("submit", "--scheduler", "slurm", "--dry-run", "-m", "train.py", cwd=tmp_path, timeout=60)
    assert (r.returncode, r.stdout) == (2, ""), r.stderr
    assert r.stderr == ("slurmlaunch: error: -m/--module 'train.py' names a module py of a package 'train', which is "
                        "the file 'train.py' here (expected: 'train.py' without --module, or --module "
                        "'train')\n"), r.stderr
    assert run_cli("submit", "--scheduler", "slurm", "--dry-run", "-m", "train", cwd=tmp_path).returncode == 0


def test_a_script_name_with_a_newline_or_an_escape_keeps_the_note_on_one_line(tmp_path: Path) -> None:
    """The note names SCRIPT, which may hold any byte a file name may: a newline or a terminal escape there
    is shown escaped, the note stays one line, and the job is still rendered for the file as it is named."""
    name = "a\nb\x1b[31m.py"
    (tmp_path / name).write_text("import idr_torch\n")
    r = run_cli("submit", "--scheduler", "pbs", "--dry-run", name, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stderr, r.stderr
    assert any(line.startswith(f"slurmlaunch: {name!r} uses {IDR}") for line in r.stderr.splitlines()), r.stderr
