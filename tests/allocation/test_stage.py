"""Environment staging's pure parts and its node side (allocation/stage.py), with real files and real tar."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurmlaunch.allocation import stage

SITE = Path("lib") / "python3.11" / "site-packages"


def _tree(root: Path) -> Path:
    (root / SITE / "pkg").mkdir(parents=True)
    (root / SITE / "pkg" / "__init__.py").write_text("x = 1\n")
    (root / SITE / "pkg-1.0.dist-info").mkdir()
    (root / SITE / "pkg-1.0.dist-info" / "RECORD").write_text("pkg/__init__.py,,\n")
    (root / "bin").mkdir()
    (root / "bin" / "python").symlink_to(sys.executable)
    (root / "lib64").symlink_to("lib")
    (root / "pyvenv.cfg").write_text("home = /usr/bin\n")
    return root


def _bump(path: Path) -> None:  # a rewrite in the same second: only the mtime in ns tells it
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))


def test_key_follows_installs_links_and_not_byte_code(tmp_path: Path) -> None:
    root = _tree(tmp_path / "env")
    key = stage.content_key(str(root))
    (root / SITE / "__pycache__").mkdir()  # the ranks' byte code does not make every job pack again
    (root / SITE / "__pycache__" / "six.cpython-311.pyc").write_bytes(b"1234")
    (root / SITE / "pkg" / "__pycache__").mkdir()
    assert stage.content_key(str(root)) == key
    _bump(root / SITE / "pkg-1.0.dist-info" / "RECORD")  # pip install --force-reinstall of the same version
    assert stage.content_key(str(root)) != key
    key = stage.content_key(str(root))
    (root / SITE / "new-2.0.dist-info").mkdir()  # a new distribution: a new name in the listing
    assert stage.content_key(str(root)) != key
    key = stage.content_key(str(root))
    (root / SITE / "__editable__.proj-0.1.pth").write_text("/shared/proj/src\n")
    assert stage.content_key(str(root)) != key
    key = stage.content_key(str(root))
    (root / "bin" / "python").unlink()
    (root / "bin" / "python").symlink_to("/usr/bin/python3")
    assert stage.content_key(str(root)) != key
    key = stage.content_key(str(root))
    _bump(root / "pyvenv.cfg")
    assert stage.content_key(str(root)) != key


def test_key_is_the_same_from_another_view_of_the_same_files(tmp_path: Path) -> None:
    """A copy with the same names, sizes and times (as another mount of a FUSE file system shows the same files
    under inode numbers of its own, sshfs's in the order of lookups): the same key, not a new pack per node."""
    root = _tree(tmp_path / "env")
    other = tmp_path / "view" / "env"
    shutil.copytree(root, other, symlinks=True, copy_function=shutil.copy2)
    assert (other / "pyvenv.cfg").stat().st_ino != (root / "pyvenv.cfg").stat().st_ino
    assert stage.content_key(str(other)) == stage.content_key(str(root))
    _bump(other / SITE / "pkg-1.0.dist-info" / "RECORD")
    assert stage.content_key(str(other)) != stage.content_key(str(root))


def test_key_misses_a_file_edited_by_hand_inside_a_package(tmp_path: Path) -> None:
    # the documented price of a key without a stat per file: an edit with no installer is not seen
    root = _tree(tmp_path / "env")
    key = stage.content_key(str(root))
    (root / SITE / "pkg" / "__init__.py").write_text("x = 22\n")
    assert stage.content_key(str(root)) == key


def test_key_costs_a_stat_per_distribution_not_per_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _tree(tmp_path / "env")
    for i in range(200):  # a stat per file would show as a directory read per package directory here
        (root / SITE / "pkg" / f"sub{i}").mkdir()
        (root / SITE / "pkg" / f"sub{i}" / "m.py").write_text("")
    calls: list[str] = []
    real_stat, real_scandir, real_readlink = os.stat, os.scandir, os.readlink

    def stat(path: str, *a: object, **k: object) -> os.stat_result:
        calls.append(f"stat {path}")
        return real_stat(path, *a, **k)  # type: ignore[arg-type]

    def scandir(path: str) -> object:
        calls.append(f"scandir {path}")
        return real_scandir(path)

    def readlink(path: str) -> str:
        calls.append(f"readlink {path}")
        return real_readlink(path)

    monkeypatch.setattr(os, "stat", stat)
    monkeypatch.setattr(os, "readlink", readlink)
    monkeypatch.setattr(os, "scandir", scandir)
    stage.content_key(str(root))
    monkeypatch.undo()
    # four directory reads (the prefix, bin, lib, site-packages), two links (bin/python, lib64), two stamps
    # (pyvenv.cfg, the one RECORD); none of the package's 201 directories and files
    assert sorted(c.split()[0] for c in calls) == ["readlink"] * 2 + ["scandir"] * 4 + ["stat"] * 2, calls


def test_pack_is_made_once_and_holds_the_tree(tmp_path: Path) -> None:
    root = _tree(tmp_path / "env")
    calls: list[list[str]] = []

    def run(cmd: list[str]) -> int:
        calls.append(cmd)
        return subprocess.run(cmd).returncode

    path, size, made = stage.ensure_pack(str(root), str(tmp_path / "cache"), run)
    assert made and len(calls) == 1 and size == os.path.getsize(path)
    again = stage.ensure_pack(str(root), str(tmp_path / "cache"), run)
    assert again == (path, size, False) and len(calls) == 1
    names = subprocess.run(["tar", "-tf", path], capture_output=True, text=True, check=True).stdout.split()
    assert f"./{SITE}/pkg/__init__.py" in names and "./bin/python" in names
    assert os.listdir(tmp_path / "cache") == [os.path.basename(path)]  # no partial file left


def test_failed_pack_leaves_no_partial_file(tmp_path: Path) -> None:
    root = _tree(tmp_path / "env")
    with pytest.raises(OSError, match="exited 2"):
        stage.ensure_pack(str(root), str(tmp_path / "cache"), lambda cmd: (Path(cmd[4]).write_text("half"), 2)[1])
    assert os.listdir(tmp_path / "cache") == []


def test_rewrite_moves_only_arguments_under_the_prefix() -> None:
    cmd = ["/v/env/bin/python", "-m", "slurmlaunch", "launch", "/v/env-other/x.py", "/v/env/share/a"]
    assert stage.rewrite(cmd, "/v/env", "/tmp/s") == ["/tmp/s/bin/python", "-m", "slurmlaunch", "launch",
                                                      "/v/env-other/x.py", "/tmp/s/share/a"]


def test_only_a_venv_or_conda_prefix_is_staged(tmp_path: Path) -> None:
    assert stage.env_prefix("/v/env", "/usr") == "/v/env"
    assert stage.env_prefix("/usr", "/usr") is None
    (tmp_path / "conda-meta").mkdir()
    assert stage.env_prefix(str(tmp_path), str(tmp_path)) == str(tmp_path)


def test_node_check_names_the_node_and_the_shortfall(tmp_path: Path) -> None:
    free = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
    r = subprocess.run(stage.node_command("check", str(tmp_path / "d"), str(free + (5 << 30))), capture_output=True,
                       text=True)
    assert r.returncode == stage.node.NO_SPACE
    line, = r.stderr.strip().splitlines()
    assert line.startswith(f"slurmlaunch: node {os.uname().nodename}: the node-local directory {tmp_path / 'd'} has ")
    assert line.endswith(" short")
    ok = subprocess.run(stage.node_command("check", str(tmp_path), "1"))
    assert ok.returncode == 0


def test_holder_unpacks_says_ready_and_removes_its_copy_at_the_end(tmp_path: Path) -> None:
    root = _tree(tmp_path / "env")
    pack, _, _ = stage.ensure_pack(str(root), str(tmp_path / "cache"), lambda c: subprocess.run(c).returncode)
    tar, dest = tmp_path / "node.tar", tmp_path / "node-copy"
    for end in ("stdin", "SIGTERM"):
        cut_short = tmp_path / f"slurmlaunch-stage-{end}{stage.node.REMOVING}"  # a removal KillWait cut short
        (cut_short / "lib").mkdir(parents=True)
        tar.write_bytes(Path(pack).read_bytes())
        p = subprocess.Popen(stage.node_command("hold", str(tar), str(dest)),
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert p.stdout is not None and p.stdin is not None
        assert p.stdout.readline().startswith(stage.node.READY)
        assert (dest / SITE / "pkg" / "__init__.py").read_text() == "x = 1\n" and not tar.exists()
        p.send_signal(signal.SIGUSR1)  # a signal sent to every step (scancel --signal USR1) leaves the copy
        time.sleep(0.2)
        assert p.poll() is None and dest.exists()
        if end == "stdin":
            p.stdin.close()
        else:
            p.terminate()
        assert p.wait(30) == 0 and not dest.exists(), end
        assert sorted(x.name for x in tmp_path.iterdir()) == ["cache", "env"], end


def test_local_scheduler_says_there_is_nothing_to_stage(tmp_path: Path) -> None:
    from tests.helpers import run_cli

    (tmp_path / "s.py").write_text("import sys; print('prefix', sys.prefix)\n")
    r = run_cli("submit", "--scheduler", "local", "--stage-env", "on", "--wait", "s.py", cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"prefix {sys.prefix}" in r.stdout
    assert "--stage-env: nothing to stage" in r.stderr  # said to the user too, not only in the detached job's log
    log = next((tmp_path / "slurmlaunch-logs").glob("*.batch.log")).read_text()
    assert "--stage-env: nothing to stage (the local scheduler's ranks run on this machine" in log


def test_node_side_runs_with_the_base_interpreter_and_no_site_packages() -> None:
    cmd = stage.node_command("check", "/tmp", "1")
    assert cmd[0] == os.path.realpath(sys.executable) and cmd[1:3] == ["-S", "-I"]
    # it imports nothing of slurmlaunch: it runs by its path, without the package on sys.path
    r = subprocess.run([*cmd[:3], "-c", "import sys; sys.path.insert(0, sys.argv[1]); import stage_node; "
                        "print(sorted(m for m in sys.modules if m.startswith('slurmlaunch')))",
                        os.path.dirname(cmd[3])], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stderr


def test_pbs_node_side_unpacks_keeps_and_stops(tmp_path: Path) -> None:
    root = _tree(tmp_path / "env")
    pack, size, _ = stage.ensure_pack(str(root), str(tmp_path / "cache"), lambda c: subprocess.run(c).returncode)
    local = tmp_path / "node-local"
    dest, report = local / "slurmlaunch-stage-7", tmp_path / "job-7.stage"
    keep = subprocess.Popen(stage.node_command("keep", str(dest)))
    r = subprocess.run(stage.node_command("unpack", pack, str(dest), str(size), str(report)))
    assert r.returncode == 0 and (dest / SITE / "pkg" / "__init__.py").read_text() == "x = 1\n"
    assert Path(pack).exists() and not list(tmp_path.glob("job-7.stage.*"))  # the shared pack stays, no tar here
    deadline = time.monotonic() + 30
    while not (local / "slurmlaunch-stage-7.pid").exists():  # keep has its handlers once it wrote its pid
        assert time.monotonic() < deadline and keep.poll() is None, "keep wrote no pid file within 30 s"
        time.sleep(0.05)
    keep.send_signal(signal.SIGUSR1)  # the warning sent to every task leaves the copy
    time.sleep(0.2)
    assert keep.poll() is None and dest.exists()
    assert subprocess.run(stage.node_command("stop", str(dest)), timeout=60).returncode == 0
    assert keep.wait(30) == 0 and list(local.iterdir()) == []
    # too little space: the line on stderr and in REPORT.HOST, the node's exit NO_SPACE, nothing unpacked
    free = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
    r = subprocess.run(stage.node_command("unpack", pack, str(dest), str(free + (5 << 30)), str(report)),
                       capture_output=True, text=True)
    assert r.returncode == stage.node.NO_SPACE and not dest.exists()
    said = (tmp_path / f"job-7.stage.{os.uname().nodename}").read_text().strip()
    assert r.stderr.strip() == f"slurmlaunch: {said}"
    assert said.startswith(f"node {os.uname().nodename}: the node-local directory {local} has ")
    assert said.endswith(" short") and "(its unpacked copy)" in said


def test_pbs_script_passes_it_to_the_batch_step(tmp_path: Path) -> None:
    from tests.helpers import run_cli

    (tmp_path / "s.py").write_text("print(1)\n")
    r = run_cli("submit", "--scheduler", "pbs", "--nodes", "2", "--stage-env", "fallback", "--dry-run", "s.py",
                cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert " --stage-env fallback --log-dir " in r.stdout


def test_torque_refuses_it_in_one_line(tmp_path: Path) -> None:
    from tests.helpers import run_cli

    (tmp_path / "s.py").write_text("print(1)\n")
    r = run_cli("submit", "--scheduler", "pbs", "--pbs-flavour", "torque", "--stage-env", "on", "--dry-run", "s.py",
                cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "slurmlaunch: error: --stage-env on: the pbs scheduler cannot carry it out: the environment is staged "
        "through pbs_tmrsh, which Torque has not (leave it out, or --pbs-flavour pro)"]
