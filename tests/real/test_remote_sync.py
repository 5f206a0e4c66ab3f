"""The sync's choice of files and its rsync target, against the real OpenSSH server (tests/sshd.py) and the
real rsync and git: an IPv6 destination in brackets, git's meaning of .gitignore (negations, nested files,
.git/info/exclude) in a work tree, one warning line for a `!` line where git cannot decide."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from slurmlaunch.app import remote
from slurmlaunch.app.remote.sync import FILTER_RULE, GIT_RULE
from slurmlaunch.core.errors import SpecError
from tests import sshd

# The remote calls here run in this process, as the laptop: its environment is this process's (conftest laptop).
pytestmark = pytest.mark.laptop_env

GIT = shutil.which("git")  # before the laptop fixture's PATH


def _with_git(lap: sshd.Laptop) -> None:
    """git on the laptop's PATH (sshd.make_laptop's PATH has none)."""
    if not GIT:
        pytest.skip("git is not installed here")
    (lap.bin / "git").symlink_to(GIT)


def _git(project: Path, *args: str) -> None:
    subprocess.run([GIT or "git", "-c", "user.name=t", "-c", "user.email=t@example.org", *args], cwd=project,
                   check=True, capture_output=True, timeout=60)


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if not p.is_dir() or p.is_symlink()}


def test_the_rsync_target_of_an_ipv6_destination_is_in_brackets(laptop: sshd.Laptop, tmp_path: Path) -> None:
    dest = remote.parse_destination("me@[::1]:proj")
    assert (dest.target, dest.path_target) == ("me@::1", "me@[::1]")
    assert remote.parse_destination("login").path_target == "login"
    assert remote.parse_destination("[fe80::1%eth0]").path_target == "[fe80::1%eth0]"
    with remote.Connection(dest) as conn:
        for listed in (False, True):
            argv = remote.sync_argv(conn, str(tmp_path), "/r/p", [], listed=listed)
            assert argv[-1] == "me@[::1]:/r/p/"
        assert remote.ship_argv(conn, "/r/p", "tag")[-1] == "me@[::1]:/r/p/.slurmlaunch/pkg/tag/"


def test_a_sync_to_an_ipv6_address_arrives(laptop: sshd.Laptop, server: sshd.Sshd, tmp_path: Path) -> None:
    if not sshd.ipv6_loopback():
        pytest.skip("::1 cannot be listened on here (no IPv6 loopback)")
    if f"port {server.port} on ::1 failed" in server.log:
        pytest.skip(f"the test sshd could not listen on [::1]:{server.port} (taken): {server.log[-300:]}")
    kind, key = (server.root / "host_ed25519.pub").read_text().split()[:2]
    with open(laptop.ssh_dir / "known_hosts", "a") as f:
        f.write(f"[::1]:{server.port} {kind} {key}\n")
    with open(laptop.ssh_dir / "config", "a") as f:  # [::1] itself, not an alias: the bug was the bare address
        f.write(f"Host ::1\n    Port {server.port}\n    IdentityFile {laptop.ssh_dir / 'id_ed25519'}\n"
                f"    UserKnownHostsFile {laptop.ssh_dir / 'known_hosts'}\n    StrictHostKeyChecking yes\n")
    project = tmp_path / "proj"
    project.mkdir()
    (project / "train.py").write_text("print('v6')\n")
    target = tmp_path / "remote-v6"
    with remote.Connection(remote.parse_destination(f"root@[::1]:{target}")) as conn:
        done = remote.sync(conn, str(project), remote.resolve_directory(conn, str(target), "proj", create=True))
        where = remote.ship_package(conn, str(target))
    assert done.sent_files == 1 and (target / "train.py").read_text() == "print('v6')\n"
    assert (Path(where) / "slurmlaunch" / "__init__.py").is_file()


def _negations_project(project: Path) -> None:
    (project / "logs").mkdir(parents=True)
    (project / "sub" / "deep").mkdir(parents=True)
    (project / ".gitignore").write_text("*.log\n!keep.log\n/build/\n")
    for name in ("run.log", "keep.log", "logs/a.log", "logs/keep.log", "train.py"):
        (project / name).write_text(name)
    (project / "sub" / ".gitignore").write_text("*.tmp\n!wanted.tmp\n")
    for name in ("x.tmp", "wanted.tmp", "deep/y.tmp", "deep/code.py"):
        (project / "sub" / name).write_text(name)
    (project / "build").mkdir()
    (project / "build" / "out.bin").write_text("built")
    (project / "secret.key").write_text("only .git/info/exclude ignores me")
    (project / "link.py").symlink_to("train.py")


def test_git_decides_what_is_sent_in_a_work_tree(laptop: sshd.Laptop, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    _with_git(laptop)
    project = tmp_path / "proj"
    _negations_project(project)
    _git(project, "init", "-q")
    (project / ".git" / "info").mkdir(exist_ok=True)
    (project / ".git" / "info" / "exclude").write_text("secret.key\n")
    (project / "out").mkdir()
    (project / "out" / "rank0.txt").write_text("the job's logs: never sent")
    (project / "notes.scratch").write_text("--remote-exclude")
    (project / "tracked-then-deleted.py").write_text("gone")
    _git(project, "add", "-A")
    _git(project, "commit", "-q", "-m", "c")
    (project / "tracked-then-deleted.py").unlink()
    (project / "untracked.py").write_text("new, not ignored")
    (project / "vendor").mkdir()  # a repository inside, untracked: its own git decides below it
    _git(project / "vendor", "init", "-q")
    (project / "vendor" / ".gitignore").write_text("*.o\n")
    (project / "vendor" / "lib.py").write_text("vendored")
    (project / "vendor" / "lib.o").write_text("built")
    git_says = set(subprocess.run([GIT or "git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=project,
                                  capture_output=True, text=True, check=True).stdout.split())
    assert "vendor/" in git_says
    git_says -= {"tracked-then-deleted.py", "out/rank0.txt", "notes.scratch", "vendor/"}
    git_says |= {"vendor/.gitignore", "vendor/lib.py"}
    assert {"keep.log", "logs/keep.log", "sub/wanted.tmp"} <= git_says
    target = tmp_path / "remote-side"
    excludes = ["/out/", "*.scratch"]
    with remote.Connection(remote.parse_destination("login")) as conn:
        first = remote.sync(conn, str(project), str(target), excludes)
        assert _tree(target) == git_says
        assert first.rule == GIT_RULE and first.line("login:x").endswith("files as git lists them")
        assert (target / "link.py").is_symlink() and os.readlink(target / "link.py") == "train.py"
        modes = {str(p.relative_to(target)): p.lstat().st_mode & 0o077 for p in target.rglob("*")
                 if not p.is_symlink()}
        assert modes and not any(modes.values()), modes  # private there, implied directories too
        again = remote.sync(conn, str(project), str(target), excludes)
    assert (again.sent_files, again.files) == (0, len(git_says) - 1)  # the link is no regular file
    assert f"nothing changed ({again.files} files up to date)" in again.line("login")
    assert capsys.readouterr().err == ""


def test_an_unchanged_1000_file_git_project_sends_nothing(laptop: sshd.Laptop, tmp_path: Path) -> None:
    _with_git(laptop)
    project = tmp_path / "proj"
    (project / "pkg").mkdir(parents=True)
    for i in range(1000):
        (project / "pkg" / f"m{i:04d}.py").write_text(f"x = {i}\n")
    (project / ".gitignore").write_text("*.ckpt\n")
    (project / "model.ckpt").write_bytes(b"w" * 4096)
    _git(project, "init", "-q")
    _git(project, "add", "-A")
    _git(project, "commit", "-q", "-m", "c")
    target = tmp_path / "remote-side"
    with remote.Connection(remote.parse_destination("login")) as conn:
        assert remote.sync(conn, str(project), str(target)).sent_files == 1001
        second = remote.sync(conn, str(project), str(target))
        assert (second.sent_files, second.sent_bytes, second.files) == (0, 0, 1001)
        with pytest.raises(SpecError, match="more than the limit"):
            remote.sync(conn, str(project), str(tmp_path / "fresh"), limit=1000)
    assert not (tmp_path / "fresh").exists() and not (target / "model.ckpt").exists()
    assert not (target / ".git").exists()


def test_outside_git_a_negation_is_named_in_one_line(laptop: sshd.Laptop, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    _with_git(laptop)  # on PATH, but the project is in no work tree
    project = tmp_path / "proj"
    _negations_project(project)
    target = tmp_path / "remote-side"
    with remote.Connection(remote.parse_destination("login")) as conn:
        done = remote.sync(conn, str(project), str(target))
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("slurmlaunch: warning: .gitignore:2: '!keep.log' (and 1 other)")
    assert "git's meaning needs git on PATH and a git work tree" in err
    assert done.rule == FILTER_RULE and "files as rsync's .gitignore filter leaves them" in done.line("login")
    sent = _tree(target)
    assert "keep.log" not in sent and "train.py" in sent and "secret.key" in sent  # rsync's meaning, as said


def test_no_warning_without_a_negation(laptop: sshd.Laptop, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    (project / ".gitignore").write_text("*.log\n\\!literal\n")
    (project / "a.py").write_text("a")
    with remote.Connection(remote.parse_destination("login")) as conn:
        remote.sync(conn, str(project), str(tmp_path / "there"))
    assert capsys.readouterr().err == ""


def test_a_directory_a_repository_above_ignores_goes_by_the_filter(laptop: sshd.Laptop, tmp_path: Path) -> None:
    """A home directory under git that ignores everything: git lists nothing here, which is not "send nothing"."""
    _with_git(laptop)
    _git(tmp_path, "init", "-q")
    (tmp_path / ".gitignore").write_text("*\n")
    project = tmp_path / "proj"
    project.mkdir()
    (project / "train.py").write_text("t")
    with remote.Connection(remote.parse_destination("login")) as conn:
        done = remote.sync(conn, str(project), str(tmp_path / "there"))
    assert (done.rule, done.sent_files) == (FILTER_RULE, 1) and (tmp_path / "there" / "train.py").is_file()
