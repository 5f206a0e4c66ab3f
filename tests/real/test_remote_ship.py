"""`submit --remote` where the cluster has no slurmlaunch: the package travels with the job; and what the tool
writes there is private to the user. A real sshd on 127.0.0.1 is the login node of the real dev cluster."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

from tests import sshd
from tests.helpers import EXAMPLES
from tests.sshd import masters_left, on_laptop, python_without_slurmlaunch, setup_for


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_dry_run_shows_the_package_going_along(laptop: sshd.Laptop, tmp_path: Path) -> None:  # noqa: F811
    project = tmp_path / "proj"
    project.mkdir()
    (project / "train.py").write_text("print('hi')\n")
    r = on_laptop(laptop, "submit", "--remote", "login:/scratch/me/p", "--dry-run", "train.py", cwd=project)
    assert r.returncode == 0, r.stderr
    line = r"^export PYTHONPATH=(/scratch/me/p/\.slurmlaunch/pkg/[^/\s\"]+)\"\$\{PYTHONPATH:\+:\$PYTHONPATH\}\"$"
    m = re.search(line, r.stdout, re.MULTILINE)
    assert m, r.stdout
    assert f"login:{m.group(1)}/" in r.stderr and "--chmod=go-rwx" in r.stderr
    assert not Path("/scratch/me/p").exists()
    assert masters_left(laptop) == []


def test_example_trains_where_slurmlaunch_is_not_installed(laptop: sshd.Laptop,  # noqa: F811
                                                           cluster_env: dict[str, str], tmp_path: Path,
                                                           torch_available: None) -> None:
    python = python_without_slurmlaunch(tmp_path)
    project = tmp_path / "proj"
    project.mkdir()
    shutil.copy(EXAMPLES / "train_ddp.py", project / "train_ddp.py")
    (project / "train_ddp.py").chmod(0o644)  # a laptop's usual umask 022
    (project / "data").mkdir(mode=0o755)
    (project / "data" / "d.txt").write_text("x")
    (project / "data" / "d.txt").chmod(0o664)
    remote_dir = tmp_path / "cluster" / "work" / "proj"
    r = on_laptop(laptop, "submit", "--remote", f"login:{remote_dir}", *setup_for(cluster_env),
                  "--python", python, "--nodes", "2", "--gpus-per-node", "2", "--cpus-per-task", "1",
                  "--wait", "train_ddp.py", "--epochs", "1", cwd=project)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "done: world_size=4 sum_of_ranks=6" in r.stdout
    shipped = list((remote_dir / ".slurmlaunch" / "pkg").iterdir())
    assert len(shipped) == 1 and (shipped[0] / "slurmlaunch" / "allocation" / "launch.py").is_file()
    # private to the user: the synced project (whatever its modes here), the directories made on the way,
    # the package sent along, the logs
    for path in (tmp_path / "cluster", tmp_path / "cluster" / "work", remote_dir, remote_dir / "data",
                 remote_dir / ".slurmlaunch", remote_dir / ".slurmlaunch" / "pkg", shipped[0],
                 shipped[0] / "slurmlaunch", remote_dir / "slurmlaunch-logs"):
        assert mode(path) & 0o077 == 0, (path, oct(mode(path)))
    for path in (remote_dir / "train_ddp.py", remote_dir / "data" / "d.txt",
                 shipped[0] / "slurmlaunch" / "cli.py"):
        assert mode(path) & 0o077 == 0, (path, oct(mode(path)))

    # the same version again: nothing new is sent, the same directory is used
    again = on_laptop(laptop, "submit", "--remote", f"login:{remote_dir}", *setup_for(cluster_env),
                      "--python", python, "--nodes", "1", "--wait", "train_ddp.py", "--epochs", "1", cwd=project)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "done: world_size=1" in again.stdout
    assert list((remote_dir / ".slurmlaunch" / "pkg").iterdir()) == shipped
    assert masters_left(laptop) == []


def remote_setup(cluster_env: dict[str, str]) -> list[str]:
    return [a for a in setup_for(cluster_env) if a != "--master-port"][:4]


def test_doctor_remote_checks_the_login_node_and_allocates(laptop: sshd.Laptop,  # noqa: F811
                                                           cluster_env: dict[str, str], tmp_path: Path,
                                                           torch_available: None) -> None:
    python = python_without_slurmlaunch(tmp_path)
    # and without Jinja2: the probe job's script is rendered on the laptop (an import of jinja2 fails there)
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "no_jinja2.pth").write_text("import sys; sys.modules['jinja2'] = None\n")
    assert subprocess.run([python, "-c", "import jinja2"], capture_output=True, timeout=60).returncode != 0
    remote_dir = tmp_path / "cluster" / "proj"
    r = on_laptop(laptop, "doctor", "--remote", f"login:{remote_dir}", *remote_setup(cluster_env),
                  "--python", python, "--allocate", "2", "--timeout", "240", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(r.stdout)
    checks = {c["name"]: c["state"] for c in report["checks"]}
    assert checks["commands"] == checks["controller"] == "ok", report["checks"]
    assert report["probe_job"] and [rank["rank"] for rank in report["ranks"]] == [0, 1]
    assert all("missing" not in rank and rank["torch"]["ok"] for rank in report["ranks"]), report["ranks"]
    assert mode(remote_dir) & 0o077 == 0 and mode(remote_dir / "slurmlaunch-logs") & 0o077 == 0
    assert masters_left(laptop) == []


def test_doctor_remote_strings_are_data_and_failures_are_one_line(laptop: sshd.Laptop,  # noqa: F811
                                                                  cluster_env: dict[str, str],
                                                                  tmp_path: Path) -> None:
    pwned = Path("/tmp/slurmlaunch-pwned-doctor")
    pwned.unlink(missing_ok=True)
    r = on_laptop(laptop, "doctor", "--remote", f"login:{tmp_path / 'c'}", *remote_setup(cluster_env),
                  "--partition", f"p $(touch {pwned}) `touch {pwned}`", cwd=tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr  # the remote doctor's own verdict: no such partition
    assert "no such partition here" in r.stdout and f"$(touch {pwned})" in r.stdout
    assert not pwned.exists()
    # an interpreter that is not there: one line, exit 2
    r = on_laptop(laptop, "doctor", "--remote", f"login:{tmp_path / 'c'}", *remote_setup(cluster_env),
                  "--python", "/nonexistent/python3", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "/nonexistent/python3" in r.stderr, r.stderr
    # the remote-only options without --remote are refused, not ignored
    r = on_laptop(laptop, "doctor", "--remote-setup", "module load slurm", cwd=tmp_path)
    assert r.returncode == 2 and "only with doctor --remote" in r.stderr, r.stderr
    assert masters_left(laptop) == []


def test_the_package_path_stays_data_in_the_script(laptop: sshd.Laptop, tmp_path: Path) -> None:  # noqa: F811
    project = tmp_path / "proj"
    project.mkdir()
    (project / "train.py").write_text("print('hi')\n")
    where = "/scratch/me/p $(touch /tmp/slurmlaunch-pwned-ship) `id` 'q' \"d\" é"
    r = on_laptop(laptop, "submit", "--remote", f"login:{where}", "--dry-run", "train.py", cwd=project)
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if x.startswith("export PYTHONPATH="))
    Path("/tmp/slurmlaunch-pwned-ship").unlink(missing_ok=True)
    for before, after in (("", ""), ("/site/lib", ":/site/lib")):
        env = {"PATH": "/usr/bin:/bin", **({"PYTHONPATH": before} if before else {})}
        got = subprocess.run(["bash", "-c", f'{line}\nprintf %s "$PYTHONPATH"'], capture_output=True, text=True,
                             env=env, timeout=30).stdout
        assert got.startswith(f"{where}/.slurmlaunch/pkg/") and got.endswith(after) and "/" not in \
            got[len(f"{where}/.slurmlaunch/pkg/"):len(got) - len(after)], got
    assert not Path("/tmp/slurmlaunch-pwned-ship").exists()
