"""`submit --remote` end to end: a "laptop" (own HOME and ~/.ssh/config, no Slurm command on PATH) submits
over a real sshd to the real dev cluster, whose login node is this machine; then status, logs, list, cancel
from the laptop."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests import sshd
from tests.helpers import EXAMPLES, teardown_abort_only
from tests.sshd import masters_left, on_laptop, setup_for


def test_dry_run_shows_script_and_remote_commands(laptop: sshd.Laptop, tmp_path: Path) -> None:
    project = tmp_path / "my project"
    project.mkdir()
    (project / "train.py").write_text("print('hi')\n")
    r = on_laptop(laptop, "submit", "--remote", "login:/scratch/me/p", "--dry-run", "--nodes", "2", "train.py",
                  "--x", "$(id)", cwd=project)
    assert r.returncode == 0, r.stderr
    assert "cd /scratch/me/p || exit 2" in r.stdout and "'$(id)'" in r.stdout
    assert "python3 -m slurmlaunch launch /scratch/me/p/train.py" in r.stdout  # the cluster's python3
    assert "# would run here: rsync -a" in r.stderr and "login:/scratch/me/p/" in r.stderr
    assert "--chdir=/scratch/me/p" in r.stderr and "sbatch --parsable" in r.stderr
    # a directory relative to the remote home is resolved there (one round trip), not created
    r = on_laptop(laptop, "submit", "--remote", "login", "--dry-run", "train.py", cwd=project)
    assert r.returncode == 0, r.stderr
    assert "cd /root/slurmlaunch-projects/my_project || exit 2" in r.stdout
    assert not Path("/root/slurmlaunch-projects/my_project").exists()
    assert masters_left(laptop) == []


@pytest.mark.parametrize("dest", ["-oProxyCommand=touch${IFS}/tmp/x", "login:a\nb", "me@"])
def test_bad_destination_one_line_exit_2(laptop: sshd.Laptop, tmp_path: Path, dest: str) -> None:
    (tmp_path / "train.py").write_text("")
    r = on_laptop(laptop, "submit", f"--remote={dest}", "--dry-run", "train.py", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "expected [user@]host[:dir]" in r.stderr, r.stderr


def test_unknown_host_key_and_unresolvable_host_one_line_exit_2(laptop: sshd.Laptop, tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("")
    r = on_laptop(laptop, "submit", "--remote", "nowhere.invalid", "train.py", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "cannot be resolved" in r.stderr, r.stderr
    (laptop.ssh_dir / "known_hosts").write_text("")
    r = on_laptop(laptop, "submit", "--remote", "login", "train.py", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "host key of login is not known" in r.stderr, r.stderr
    assert masters_left(laptop) == []


def test_example_on_two_nodes_from_the_laptop(laptop: sshd.Laptop, cluster_env: dict[str, str], tmp_path: Path,
                                              torch_available: None) -> None:
    assert shutil.which("sbatch", path=laptop.env["PATH"]) is None  # the laptop has no Slurm
    project = tmp_path / "proj"
    project.mkdir()
    shutil.copy(EXAMPLES / "train_ddp.py", project / "train_ddp.py")
    (project / ".gitignore").write_text("*.ckpt\n")
    (project / "old.ckpt").write_bytes(b"x" * 1000)
    remote_dir = tmp_path / "on-the-cluster"
    def submit() -> subprocess.CompletedProcess[str]:
        return on_laptop(laptop, "submit", "--remote", f"login:{remote_dir}", *setup_for(cluster_env),
                         "--python", sys.executable, "--nodes", "2", "--gpus-per-node", "2", "--cpus-per-task", "1",
                         "--wait", "train_ddp.py", "--epochs", "1", cwd=project)

    r = submit()
    if r.returncode != 0:  # torch's gloo teardown abort (README: Teardown aborts) is not ours: once more
        failed = re.search(r"submitted job (\d+) on login", r.stderr)
        batch = remote_dir / "slurmlaunch-logs" / f"job-{failed.group(1) if failed else 'x'}.batch.log"
        if batch.is_file() and teardown_abort_only(batch.read_text(errors="replace")):
            r = submit()
    assert r.returncode == 0, r.stdout + r.stderr
    assert "synced to login:" in r.stderr and "1 of" not in r.stderr  # train_ddp.py and .gitignore
    assert re.search(r"job \d+ RUNNING on ", r.stderr), r.stderr
    assert "done: world_size=4 sum_of_ranks=6" in r.stdout  # rank 0's output, followed from the laptop
    job = re.search(r"submitted job (\d+) on login", r.stderr).group(1)  # type: ignore[union-attr]
    assert (remote_dir / "train_ddp.py").is_file() and not (remote_dir / "old.ckpt").exists()
    logs = remote_dir / "slurmlaunch-logs"
    assert all((logs / f"job-{job}.rank-{rank}.log").is_file() for rank in range(4))
    assert (logs / f"job-{job}.rank-0.log").stat().st_mode & 0o077 == 0  # private to the user
    assert masters_left(laptop) == []  # --wait ended: no ssh left behind

    # the job commands, from the laptop
    st = on_laptop(laptop, "status", job, "--json", cwd=project)
    assert st.returncode == 0, st.stderr
    info = json.loads(st.stdout)
    assert (info["state"], info["exit_code"], info["remote"]) == ("COMPLETED", 0, "login")
    lg = on_laptop(laptop, "logs", job, "--rank", "3", cwd=project)
    assert lg.returncode == 0 and "rank=3 " in lg.stdout, lg.stderr
    ls = on_laptop(laptop, "list", "--json", cwd=project)
    row = json.loads(ls.stdout)[-1]
    assert row["job_id"] == job and row["remote"] == "login" and row["directory"] == f"login:{logs}"
    assert row["state"] == "COMPLETED"  # sacct there knows it (not "ENDED?")
    # nothing to send the second time
    again = on_laptop(laptop, "submit", "--remote", f"login:{remote_dir}", *setup_for(cluster_env),
                      "--python", sys.executable, "--nodes", "1", "train_ddp.py", "--epochs", "1", cwd=project)
    assert again.returncode == 0 and "nothing changed (2 files up to date)" in again.stderr, again.stderr
    assert masters_left(laptop) == []


HOSTILE_JOB = """\
import json, os, sys
out = os.path.join(os.environ["OUT_DIR"], "rank-" + os.environ["RANK"] + ".json")
with open(out + ".tmp", "w", encoding="utf-8") as f:
    json.dump({"argv": sys.argv[1:], "env": os.environ["HOSTILE"], "name": os.environ["SLURM_JOB_NAME"]}, f)
os.rename(out + ".tmp", out)
if os.environ["RANK"] == "1":  # fail only once rank 0 has written (srun then stops the step at once)
    import time
    deadline = time.monotonic() + 60
    while not os.path.exists(out.replace("rank-1", "rank-0")) and time.monotonic() < deadline:
        time.sleep(0.1)
    sys.exit(3)
"""


def test_hostile_strings_reach_the_remote_job_and_a_failing_rank_code_comes_back(
        laptop: sshd.Laptop, cluster_env: dict[str, str], tmp_path: Path) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    (project / "job.py").write_text(HOSTILE_JOB)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    args = ["a b", "it's", '"q"', "$(touch /tmp/slurmlaunch-pwned)", "`id`", "l1\nl2", "naïve ✓", ";|&", "$HOME"]
    name = "n $(id) `x` 'q' é"
    value = "v $(touch /tmp/slurmlaunch-pwned) \"q\" ünï"
    Path("/tmp/slurmlaunch-pwned").unlink(missing_ok=True)
    r = on_laptop(laptop, "submit", "--remote", f"login:{tmp_path / 'remote'}", *setup_for(cluster_env),
                  "--python", sys.executable, "--nodes", "2", "--job-name", name, "--env", f"HOSTILE={value}",
                  "--env", f"OUT_DIR={out_dir}", "--wait", "job.py", *args, cwd=project)
    assert r.returncode == 3, r.stdout + r.stderr  # rank 1's exit code, back on the laptop
    for rank in (0, 1):
        got = json.loads((out_dir / f"rank-{rank}.json").read_text(encoding="utf-8"))
        assert got == {"argv": args, "env": value, "name": name}
    assert not Path("/tmp/slurmlaunch-pwned").exists()


SLEEPER = "import time\nprint('started', flush=True)\ntime.sleep(600)\n"


NO_ACCOUNTING = "import sys\nsys.stderr.write('sacct: error: Slurm accounting storage is disabled\\n')\nsys.exit(1)\n"


def test_list_from_the_laptop_without_accounting(laptop: sshd.Laptop, cluster_env: dict[str, str],
                                                 tmp_path: Path) -> None:
    """A cluster without accounting (its sacct fails as Slurm's does): `list` on the laptop shows how a finished
    remote job ended, from the exit-code file its script wrote on the cluster, not "ENDED?"."""
    bin_dir = sshd.login_bin(tmp_path, {"sacct": NO_ACCOUNTING}, basics=())
    project = tmp_path / "proj"
    project.mkdir()
    (project / "three.py").write_text("import sys\nsys.exit(3)\n")
    r = on_laptop(laptop, "submit", "--remote", f"login:{tmp_path / 'remote'}", *setup_for(cluster_env),
                  "--remote-setup", f"export PATH={bin_dir}:$PATH", "--python", sys.executable, "--nodes", "1",
                  "--wait", "three.py", cwd=project)
    assert r.returncode == 3, r.stderr
    # the first-failure line the batch script left on the cluster, as a local --wait shows it
    assert re.search(r"^slurmlaunch: rank\(s\) 0 on node\d+ failed first with exit code 3\b", r.stderr, re.M), r.stderr
    job = re.search(r"submitted job (\d+) on login", r.stderr).group(1)  # type: ignore[union-attr]
    ls = on_laptop(laptop, "list", "--json", cwd=project)
    assert ls.returncode == 0, ls.stderr
    assert [(row["job_id"], row["state"]) for row in json.loads(ls.stdout)] == [(job, "FAILED 3")], ls.stdout
    assert masters_left(laptop) == []


def test_cancel_and_follow_from_the_laptop(laptop: sshd.Laptop, cluster_env: dict[str, str], tmp_path: Path) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    (project / "sleeper.py").write_text(SLEEPER)
    r = on_laptop(laptop, "submit", "--remote", f"login:{tmp_path / 'remote'}", *setup_for(cluster_env),
                  "--python", sys.executable, "--nodes", "1", "sleeper.py", cwd=project)
    assert r.returncode == 0, r.stderr
    job = r.stdout.strip()
    follower = subprocess.Popen([sys.executable, "-m", "slurmlaunch", "logs", job, "--rank", "0", "--follow"],
                                env=laptop.env, cwd=project, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
    log = tmp_path / "remote" / "slurmlaunch-logs" / f"job-{job}.rank-0.log"
    deadline = time.monotonic() + 120
    while not (log.is_file() and "started" in log.read_text()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "started" in log.read_text()
    c = on_laptop(laptop, "cancel", job, cwd=project)
    assert c.returncode == 0 and f"cancelled job {job}" in c.stdout, c.stderr
    out, err = follower.communicate(timeout=120)
    assert "started" in out and "CANCELLED" in err, err
    st = on_laptop(laptop, "status", job, "--json", cwd=project)
    assert json.loads(st.stdout)["state"] == "CANCELLED", st.stdout + st.stderr
    again = on_laptop(laptop, "cancel", job, cwd=project)
    assert again.returncode == 0 and again.stdout.startswith(f"job {job} had already ended (CANCELLED"), again
    assert masters_left(laptop) == []


@pytest.mark.parametrize("option", [["--remote-setup", "module load slurm"], ["--remote-exclude", "*.ckpt"],
                                    ["--no-sync"], ["--sync-limit", "10M"],
                                    ["--sync-limit", "1G"]])  # the default's value, given, is given too
def test_remote_only_options_are_refused_without_remote(site: Path, capsys: pytest.CaptureFixture[str],
                                                         option: list[str]) -> None:
    from slurmlaunch import cli

    assert cli.main(["submit", "--scheduler", "slurm", "--dry-run", "train.py"]) == 0
    capsys.readouterr()
    assert cli.main(["submit", "--scheduler", "slurm", "--dry-run", *option, "train.py"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "only with --remote" in err and option[0] in err, err


@pytest.mark.parametrize("value", ["", "1 G", "-1", "1.5G"])
def test_a_sync_limit_that_is_not_a_size_is_one_line(site: Path, capsys: pytest.CaptureFixture[str],
                                                     value: str) -> None:
    from slurmlaunch import cli

    assert cli.main(["submit", "--remote", "login:/abs", "--scheduler", "slurm", "--dry-run", "--sync-limit", value,
                     "train.py"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--sync-limit {value!r} is not a size" in err, err


TICKER = """\
import sys, time
print("started", flush=True)
for i in range(int(sys.argv[1])):
    time.sleep(1)
    print("tick", i, flush=True)
print("finished", flush=True)
"""


def test_connection_drop_during_wait_is_survived(laptop: sshd.Laptop, server: sshd.Sshd,
                                                 cluster_env: dict[str, str], tmp_path: Path) -> None:
    """sshd goes away for a few seconds while --wait follows the job: the follower says so once, tries
    again with a growing pause, reconnects, and ends with the job's code and all of rank 0's output; the
    job itself never noticed."""
    project = tmp_path / "proj"
    project.mkdir()
    (project / "ticker.py").write_text(TICKER)
    remote_dir = tmp_path / "remote"
    p = subprocess.Popen([sys.executable, "-m", "slurmlaunch", "submit", "--remote", f"login:{remote_dir}",
                          *setup_for(cluster_env), "--python", sys.executable, "--nodes", "1", "--wait",
                          "ticker.py", "25"], env=laptop.env, cwd=project, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        logs = remote_dir / "slurmlaunch-logs"
        while not any("tick 1" in f.read_text() for f in logs.glob("job-*.rank-0.log")) and \
                time.monotonic() < deadline:
            time.sleep(0.2)
        server.drop()
        time.sleep(6)
        server.start()
        out, err = p.communicate(timeout=180)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0, out + err
    assert err.count("lost contact with login") == 1 and "reconnected to login" in err, err
    assert "started" in out and "finished" in out and out.count("tick 24") == 1, out
    assert [int(n) for n in re.findall(r"tick (\d+)", out)] == list(range(25))  # nothing lost, nothing twice
    assert masters_left(laptop) == []


def test_profile_carries_the_destination_and_setup(laptop: sshd.Laptop, tmp_path: Path) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    (project / "train.py").write_text("")
    (project / "slurmlaunch.toml").write_text(
        '[profiles.booster]\nremote = "login:/scratch/booster/proj"\nremote-setup = ["module load slurm"]\n'
        'remote-exclude = ["data/"]\n')
    # --scheduler named and DIR absolute: the dry run needs no ssh (auto asks the login node: one round trip)
    r = on_laptop(laptop, "submit", "--profile", "booster", "--scheduler", "slurm", "--dry-run", "train.py",
                  cwd=project)
    assert r.returncode == 0, r.stderr
    assert "cd /scratch/booster/proj || exit 2" in r.stdout
    assert "#   module load slurm" in r.stderr and "--exclude=data/" in r.stderr
    shown = on_laptop(laptop, "config", "show", "--profile", "booster", cwd=project)
    assert "login:/scratch/booster/proj" in shown.stdout, shown.stdout + shown.stderr


@pytest.mark.parametrize(("args", "expect"), [
    (["--scheduler", "local"], "the cluster's Slurm or PBS runs the job"),
    (["--array", "0-3"], "--array/--sweep"), (["--apptainer", "img.sif"], "--container-image/--apptainer"),
])
def test_what_remote_does_not_do_yet_is_refused(laptop: sshd.Laptop, tmp_path: Path, args: list[str],
                                                expect: str) -> None:
    (tmp_path / "train.py").write_text("")
    r = on_laptop(laptop, "submit", "--remote", "login:/abs/dir", "--dry-run", *args, "train.py", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and expect in r.stderr, r.stderr


def test_interrupting_remote_wait_cancels_the_job(laptop: sshd.Laptop, cluster_env: dict[str, str],
                                                  tmp_path: Path) -> None:
    import signal

    project = tmp_path / "proj"
    project.mkdir()
    (project / "sleeper.py").write_text(SLEEPER)
    remote_dir = tmp_path / "remote"
    p = subprocess.Popen([sys.executable, "-m", "slurmlaunch", "submit", "--remote", f"login:{remote_dir}",
                          *setup_for(cluster_env), "--python", sys.executable, "--nodes", "1", "--wait",
                          "--cancel-on-interrupt", "sleeper.py"], env=laptop.env, cwd=project,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        logs = remote_dir / "slurmlaunch-logs"
        while not any("started" in f.read_text() for f in logs.glob("job-*.rank-0.log")) and \
                time.monotonic() < deadline:
            time.sleep(0.2)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 130, err
    job = out.split()[0]
    assert f"cancelled job {job}" in err, err
    deadline = time.monotonic() + 60  # scancel returns at once; the job may read COMPLETING for a moment
    while True:
        st = on_laptop(laptop, "status", job, "--json", cwd=project)
        if json.loads(st.stdout)["state"] != "COMPLETING" or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert json.loads(st.stdout)["state"] == "CANCELLED", st.stdout + st.stderr
    assert masters_left(laptop) == []


def test_sbatch_refusal_on_the_login_node_is_one_line(laptop: sshd.Laptop, cluster_env: dict[str, str],
                                                      tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("")
    r = on_laptop(laptop, "submit", "--remote", f"login:{tmp_path / 'remote'}", *setup_for(cluster_env),
                  "--partition", "no-such-partition", "train.py", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    error = [line for line in r.stderr.splitlines() if "error" in line]
    assert len(error) == 1 and "sbatch --parsable" in error[0] and "invalid partition" in error[0].lower(), r.stderr
    assert masters_left(laptop) == []


def test_client_set_ups_of_the_audit_on_the_command_line(laptop: sshd.Laptop, tmp_path: Path) -> None:
    """Audit 1, 3, 4: a 60-character TMPDIR works; `--python '~/...'` is the remote home's, checked there (a
    missing one is one line, exit 2, before anything is queued); a chatty dotfile is one line naming it."""
    project = tmp_path / "proj"
    project.mkdir()
    (project / "train.py").write_text("")
    base = tempfile.mkdtemp(prefix="sl-long-", dir="/tmp")
    try:
        long_tmp = Path(base, "t" * (60 - len(base) - 1))
        long_tmp.mkdir()
        home = tmp_path / "remote-home"
        (home / "venv/bin").mkdir(parents=True)
        (home / "venv/bin/python").write_text(f"#!/bin/sh\nexec {shutil.which('python3')} \"$@\"\n")
        (home / "venv/bin/python").chmod(0o755)
        env = {**laptop.env, "TMPDIR": str(long_tmp)}
        lap = sshd.Laptop(laptop.home, laptop.bin, env)
        common = ["submit", "--remote", "login:/scratch/p", "--scheduler", "slurm", "--dry-run",
                  "--remote-setup", f"export HOME={home}"]
        r = on_laptop(lap, *common, "--python", "~/venv/bin/python", "train.py", cwd=project)
        assert r.returncode == 0, r.stderr
        assert f"{home}/venv/bin/python -m slurmlaunch launch /scratch/p/train.py" in r.stdout
        assert os.listdir(long_tmp) == []
        r = on_laptop(lap, *common, "--python", "~/nope/python", "train.py", cwd=project)
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
        assert "--python ~/nope/python on login: not found" in r.stderr
    finally:
        shutil.rmtree(base, ignore_errors=True)
    rc = tmp_path / "bashrc"
    rc.write_text("echo 'Last login: yesterday'\n")
    config = laptop.ssh_dir / "config"
    config.write_text(config.read_text().replace("Host login\n", f"Host login\n    SetEnv BASH_ENV={rc}\n", 1))
    r = on_laptop(laptop, "submit", "--remote", "login", "train.py", cwd=project)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "~/.bashrc" in r.stderr, r.stderr
    assert "'Last login: yesterday'" in r.stderr
    assert masters_left(laptop) == []


def test_list_asks_per_destination_and_setup_lines(laptop: sshd.Laptop, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Audit 7: two jobs to one destination with different --remote-setup lines are asked about with their
    own lines (the first's cached answer is not the second's); a finished job shows sacct's state."""
    from slurmlaunch.app.records import JobRecord
    from slurmlaunch.app.remote.jobs import list_row

    rows = []
    for n, (job, queue, ended) in enumerate([("101", "101|RUNNING", "99|COMPLETED"),
                                            ("202", "202|PENDING", "98|CANCELLED by 0")]):
        (tmp_path / f"site{n}").mkdir()
        bin_dir = sshd.login_bin(tmp_path / f"site{n}", {
            "squeue": f"print({queue!r})\n", "sacct": f"print({ended!r})\n"})
        record = tmp_path / f"job-{job}.json"
        record.write_text(JobRecord({"job_id": job, "scheduler": "slurm", "remote": "login", "log_dir": "/x",
                                     "remote_setup": [f"export PATH={bin_dir}"]}, job).to_json())
        for one in (job, str(99 - n)):
            rows.append({"job_id": one, "record": str(record), "remote": "login"})
    live: dict[str, dict[str, str] | None] = {}
    for key, value in laptop.env.items():
        monkeypatch.setenv(key, value)
    states = [list_row(row, live)["state"] for row in rows]
    assert states == ["RUNNING", "COMPLETED", "PENDING", "CANCELLED"]
    assert len(live) == 2


def test_list_says_why_a_destination_gave_no_states(laptop: sshd.Laptop, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Second audit: a failing squeue (or a chatty dotfile, an unreachable host) was a silent '?'."""
    from slurmlaunch.app.records import JobRecord
    from slurmlaunch.app.remote.jobs import list_row

    bin_dir = sshd.login_bin(tmp_path, {"squeue": "import sys\nsys.exit('squeue: error: slurmctld is down')\n"})
    record = tmp_path / "job-7.json"
    record.write_text(JobRecord({"job_id": "7", "scheduler": "slurm", "remote": "login", "log_dir": "/x",
                                 "remote_setup": [f"export PATH={bin_dir}"]}, "7").to_json())
    for key, value in laptop.env.items():
        monkeypatch.setenv(key, value)
    assert list_row({"job_id": "7", "record": str(record), "remote": "login"}, {})["state"] == "?"
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no states from login" in err and "slurmctld is down" in err, err


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGHUP"])
def test_a_signal_during_a_remote_command_leaves_no_master_or_directory(laptop: sshd.Laptop, tmp_path: Path,
                                                                        signame: str) -> None:
    """Audit 11, from the command line: SIGTERM/SIGHUP while a remote command runs (here doctor --remote,
    whose --python is a stand-in that blocks) stops our master and removes its private directory."""
    import signal

    started = tmp_path / "started"
    blocker = tmp_path / "blocking-python"
    blocker.write_text(f"#!/bin/sh\ntouch '{started}'\nexec sleep 120\n")
    blocker.chmod(0o755)
    proc = subprocess.Popen([sys.executable, "-m", "slurmlaunch", "doctor", "--remote", f"login:{tmp_path / 'p'}",
                             "--python", str(blocker)], env=laptop.env, cwd=tmp_path, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not started.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert started.exists(), proc.communicate()
    paths = {m.group(1) for args in masters_left(laptop) for m in [re.search(r"ControlPath=(\S+)/%C", args)] if m}
    assert len(paths) == 1 and next(iter(paths)).startswith("/tmp/sl-"), paths
    proc.send_signal(getattr(signal, signame))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + getattr(signal, signame), err
    assert masters_left(laptop) == [] and not os.path.exists(next(iter(paths)))
