"""The request as the submitting process completes it (app/resolve.py): the interpreter and working
directory filled in from this process, and each check that needs this machine's files, with its exact line.
Real files in tmp_path; no processes."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from slurmlaunch.app.resolve import check_files, check_script, from_process, resolve
from slurmlaunch.core.errors import SpecError
from slurmlaunch.core.spec import JobSpec


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "t.py").write_text("")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "afile").write_text("")
    return tmp_path


def request(workdir: Path, **kw: object) -> JobSpec:
    base: dict[str, object] = dict(script="t.py", workdir=str(workdir), python=sys.executable)
    base.update(kw)
    return JobSpec.of(**base)


def refusal(spec: JobSpec) -> str:
    with pytest.raises(SpecError) as e:
        check_files(spec)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_a_complete_request_passes_unchanged(workdir: Path) -> None:
    spec = request(workdir)
    assert check_files(spec) is spec
    assert check_files(request(workdir, script="pkg.train", module=True)) is not None  # a module is not looked for


def test_the_script_is_looked_for_in_the_workdir(workdir: Path) -> None:
    assert refusal(request(workdir, script="missing.py")) == (
        f"script 'missing.py' not found (expected a file, relative to {str(workdir)!r})")
    assert refusal(request(workdir, script="pkg")) == (
        "script 'pkg' is a directory (expected a Python file; -m for a package)")


def test_a_no_python_executable_is_a_path_or_on_path(workdir: Path) -> None:
    assert refusal(request(workdir, no_python=True, script="no-such-executable-zz")) == (
        "--no-python executable 'no-such-executable-zz' not found (a path or a command on PATH)")
    assert check_files(request(workdir, no_python=True, script="true"))  # on PATH


def test_the_interpreter_must_exist_outside_a_container(workdir: Path) -> None:
    assert refusal(request(workdir, python="/no/such/python")) == (
        "--python '/no/such/python' not found (expected the interpreter that runs the ranks: a path, or a command on "
        "PATH)")
    assert check_files(request(workdir, python="python3", apptainer="img.sif"))  # the image's, not this machine's


@pytest.mark.parametrize(("output_dir", "what"), [
    ("afile", "is a file"), ("afile/logs", "is under {dir}/afile, which is not a directory"),
])
def test_the_log_directory_must_be_or_become_a_directory(workdir: Path, output_dir: str, what: str) -> None:
    expected_what = what.replace("{dir}/afile", repr(str(workdir / "afile")))
    assert refusal(request(workdir, output_dir=output_dir)) == (
        f"--output-dir {output_dir!r} {expected_what} (expected a directory, or a path where one can be made)")
    assert check_files(request(workdir, output_dir="new/logs"))  # made at submission


def test_from_process_fills_in_the_interpreter_and_directory(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(workdir)
    plain = from_process(JobSpec.of(script="t.py"))
    assert (plain.program.python, plain.program.workdir) == (sys.executable, os.getcwd())
    assert from_process(JobSpec.of(script="t.py", container_image="img")).program.python == "python3"  # the image's
    given = from_process(JobSpec.of(script="t.py"), python="/opt/py", workdir="/w")
    assert (given.program.python, given.program.workdir) == ("/opt/py", "/w")


def test_resolve_validates_first_then_checks_files(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(workdir)
    with pytest.raises(SpecError, match=r"^--nodes 0 is not valid"):
        resolve(JobSpec.of(script="missing.py", nodes=0))
    with pytest.raises(SpecError, match=r"^script 'missing.py' not found"):
        resolve(JobSpec.of(script="missing.py"))
    assert resolve(JobSpec.of(script="t.py")).program.workdir == str(workdir)


def test_check_script_is_the_one_run_uses_too(workdir: Path) -> None:
    check_script("t.py", False, False, str(workdir))
    check_script("anything", True, False, str(workdir))
    with pytest.raises(SpecError, match="is a directory"):
        check_script("pkg", False, False, str(workdir))
