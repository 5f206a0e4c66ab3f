"""Refusals that name the value as the user typed it: the bytes of a non-UTF-8 argument (not Python's
surrogates), the KEY of a bad --env pair, and a bare --python name looked up on PATH as a shell would."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from tests.helpers import no_slurm_env, run_cli

_BAD = os.fsdecode(b"\xff")  # what Python makes of the byte 0xff in argv (PEP 383)


def _submit(tmp_path: Path, *flags: str) -> tuple[int, str, str]:
    (tmp_path / "t.py").write_text("")
    r = run_cli("submit", "--dry-run", "--scheduler", "slurm", *flags, "t.py", env=no_slurm_env(tmp_path),
                cwd=tmp_path)
    return r.returncode, r.stdout, r.stderr


def test_an_env_value_that_is_not_utf8_is_named_with_its_key_and_its_byte(tmp_path: Path) -> None:
    rc, out, err = _submit(tmp_path, "--env", f"SEED={_BAD}")
    assert rc == 2 and out == "", (rc, out)
    assert err.strip() == ("slurmlaunch: error: --env 'SEED=\\xff' is not valid UTF-8 (the byte 0xff; expected "
                           "UTF-8 text, which the batch script is written in)"), err


def test_an_env_key_that_is_not_utf8_reads_as_its_byte(tmp_path: Path) -> None:
    rc, _, err = _submit(tmp_path, "--env", f"K{_BAD}=1")
    assert rc == 2 and "--env 'K\\xff=1' is not valid (expected KEY=VALUE" in err, err
    assert "udc" not in err, err


def test_a_bare_python_name_is_the_one_on_path(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "mypython").symlink_to(sys.executable)
    env = {**no_slurm_env(tmp_path), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    (tmp_path / "t.py").write_text("")
    r = run_cli("submit", "--dry-run", "--scheduler", "slurm", "--python", "mypython", "t.py", env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert f"{bin_dir / 'mypython'} -m slurmlaunch launch" in r.stdout, r.stdout
    assert shutil.which("no-such-python-here") is None
    r = run_cli("submit", "--dry-run", "--scheduler", "slurm", "--python", "no-such-python-here", "t.py", env=env,
                cwd=tmp_path)
    assert r.returncode == 2 and r.stdout == "", r.stdout
    assert r.stderr.strip() == ("slurmlaunch: error: --python 'no-such-python-here' not found (expected the "
                                "interpreter that runs the ranks: a path, or a command on PATH)"), r.stderr
