"""--remote's pieces against a real OpenSSH server (tests/sshd.py) and the real rsync: destinations, the
multiplexed transport (ours, or the user's own ControlMaster), the ssh command runner under the scheduler
edges, strings as data, one-line errors for what ssh refuses, and the sync."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from slurmlaunch.app import remote
from slurmlaunch.app.remote_runner import SshRunner
from slurmlaunch.core.errors import SchedulerError, SlurmLaunchError, SpecError
from slurmlaunch.schedulers import slurm
from slurmlaunch.schedulers.runner import READ_LIMIT, LocalRunner, use_runner

from . import sshd

HOSTILE = [
    "two words", "it's", 'say "hi"', "$(touch /tmp/slurmlaunch-pwned)", "`touch /tmp/slurmlaunch-pwned`",
    "line1\nline2", "tab\there", "naïve ünïcødé ✓ 日本", "; rm -rf ~ #", "a\\b\\\\c", "*", "~", "$HOME", "-n",
    "'", '"', "&& echo no", "|cat", "> /tmp/x", "\r", " leading and trailing ", "!event", "{a,b}",
]


@pytest.fixture
def laptop(server: sshd.Sshd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> sshd.Laptop:
    lap = sshd.make_laptop(server, tmp_path)
    for key in list(os.environ):
        if key not in lap.env:
            monkeypatch.delenv(key)
    for key, value in lap.env.items():
        monkeypatch.setenv(key, value)
    return lap


@pytest.mark.parametrize(("text", "expected"), [
    ("login", remote.Destination("login")),
    ("me@login", remote.Destination("login", "me")),
    ("me@login:work/proj", remote.Destination("login", "me", "work/proj")),
    ("login:/scratch/me/p q", remote.Destination("login", None, "/scratch/me/p q")),
    ("login:~/proj", remote.Destination("login", None, "proj")),
    ("login:", remote.Destination("login")),
    ("cluster.example.org", remote.Destination("cluster.example.org")),
    ("[::1]:proj", remote.Destination("::1", None, "proj")),
    ("me@[fe80::1%eth0]", remote.Destination("fe80::1%eth0", "me")),
])
def test_destination_parsing(text: str, expected: remote.Destination) -> None:
    assert remote.parse_destination(text) == expected


@pytest.mark.parametrize("text", ["", "-oProxyCommand=touch /tmp/x", "me@", "@host", "ho st", "host\n",
                                  "a;b", "$(id)", "[::1", "[zz]:x", "[::1]x", "me@-p", "login:a\nb", "us er@h"])
def test_bad_destinations_are_one_line_spec_errors(text: str) -> None:
    with pytest.raises(SpecError) as e:
        remote.parse_destination(text)
    assert "\n" not in str(e.value) and "[user@]host[:dir]" in str(e.value)


def test_hostile_strings_reach_the_remote_byte_for_byte(laptop: sshd.Laptop) -> None:
    """Each string is one word for the remote shell: printf and python receive it unchanged, and nothing
    in it is run (the marker file is never created)."""
    marker = Path("/tmp/slurmlaunch-pwned")
    marker.unlink(missing_ok=True)
    with remote.Connection(remote.parse_destination("login"), setup=["export SL_SETUP=yes"]) as conn:
        for s in HOSTILE:
            assert conn.run_argv(["printf", "%s", s], timeout=60).stdout == s.encode(), s
        code = "import sys; print(repr(sys.argv[1:]))"
        out = conn.run_argv(["python3", "-c", code, *HOSTILE], timeout=60).stdout.decode()
        assert ast.literal_eval(out) == HOSTILE
        # the setup line is shell code on purpose, and runs before the command
        assert conn.run_argv(["printenv", "SL_SETUP"], timeout=60).stdout == b"yes\n"
    assert not marker.exists()


def test_one_master_reused_and_stopped_at_the_end(laptop: sshd.Laptop, server: sshd.Sshd) -> None:
    with remote.Connection(remote.parse_destination("login")) as conn:
        for _ in range(3):
            conn.run_argv(["true"], timeout=60)
        sockets = os.listdir(conn.control_dir)
        assert len(sockets) == 1  # one master socket, in a private directory
        assert os.stat(conn.control_dir).st_mode & 0o777 == 0o700
        assert sshd.processes_naming(conn.control_dir)  # the master runs while the connection is open
        control_dir = conn.control_dir
    assert not os.path.exists(control_dir)
    assert sshd.processes_naming(control_dir) == []  # ssh -O exit: nothing left behind
    # three commands, one login: sshd saw one accepted key
    assert server.log.count("Accepted publickey") >= 1


def test_setup_line_that_fails_stops_the_command(laptop: sshd.Laptop) -> None:
    with remote.Connection(remote.parse_destination("login"), setup=["false"]) as conn:
        proc = conn.run_argv(["printf", "ran"], timeout=60, check=False)
    assert proc.returncode != 0 and proc.stdout == b""


def _one_line_error(fn: object) -> str:
    with pytest.raises(SlurmLaunchError) as e:
        fn()  # type: ignore[operator]
    assert "\n" not in str(e.value)
    return str(e.value)


def test_unknown_host_refused_key_unknown_and_changed_host_key(laptop: sshd.Laptop, server: sshd.Sshd) -> None:
    def attempt(dest: str = "login") -> str:
        def go() -> None:
            with remote.Connection(remote.parse_destination(dest)) as conn:
                conn.run_argv(["true"], timeout=60)
        return _one_line_error(go)

    assert "cannot be resolved" in attempt("no-such-host.invalid")
    known = laptop.ssh_dir / "known_hosts"
    original = known.read_text()
    known.write_text("")
    assert "host key of login is not known" in attempt()
    other = laptop.home / "other_host_key"
    sshd.keygen(other, "impostor")
    kind, key = other.with_suffix(".pub").read_text().split()[:2]
    known.write_text(f"[127.0.0.1]:{server.port} {kind} {key}\n")
    assert "has CHANGED" in attempt()
    known.write_text(original)
    stranger = laptop.ssh_dir / "id_ed25519"
    stranger.unlink()
    stranger.with_suffix(".pub").unlink(missing_ok=True)
    sshd.keygen(stranger, "not-authorized")
    assert "refused the login" in attempt()


def test_sync_sends_changes_only_and_honours_excludes(laptop: sshd.Laptop, tmp_path: Path) -> None:
    project = tmp_path / "proj"
    (project / "pkg").mkdir(parents=True)
    for i in range(1000):
        (project / "pkg" / f"m{i:04d}.py").write_text(f"x = {i}\n")
    (project / ".gitignore").write_text("*.ckpt\ndata/\n")
    (project / "model.ckpt").write_bytes(b"w" * 4096)
    (project / "data").mkdir()
    (project / "data" / "big.bin").write_bytes(b"d" * 4096)
    (project / "notes.tmp").write_text("scratch")
    (project / ".git").mkdir()
    (project / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    target = tmp_path / "remote-side"
    with remote.Connection(remote.parse_destination("login")) as conn:
        first = remote.sync(conn, str(project), str(target), excludes=["*.tmp"])
        assert first.sent_files == 1001 == first.files  # 1,000 modules and .gitignore
        second = remote.sync(conn, str(project), str(target), excludes=["*.tmp"])
        assert (second.sent_files, second.sent_bytes) == (0, 0)
        assert "nothing changed (1001 files up to date)" in second.line("login")
        (project / "pkg" / "m0007.py").write_text("x = 'changed'\n")
        third = remote.sync(conn, str(project), str(target), excludes=["*.tmp"])
        assert (third.sent_files, third.sent_bytes) == (1, len("x = 'changed'\n"))
        guard = _one_line_error(lambda: remote.sync(conn, str(project), str(tmp_path / "fresh"), limit=1000))
        assert "more than the limit" in guard
        assert not (tmp_path / "fresh").exists()  # refused before anything was sent
    sent = {str(p.relative_to(target)) for p in target.rglob("*")}
    assert "pkg/m0999.py" in sent and ".gitignore" in sent
    assert not {"model.ckpt", "data", "data/big.bin", "notes.tmp", ".git"} & sent
    assert (target / "pkg" / "m0007.py").read_text() == "x = 'changed'\n"


def test_sizes() -> None:
    assert remote.parse_size("500M") == 500 << 20
    assert remote.parse_size("2g") == 2 << 30
    assert remote.parse_size("1234") == 1234
    with pytest.raises(SpecError):
        remote.parse_size("lots")


def test_ssh_runner_is_a_command_runner(laptop: sshd.Laptop, tmp_path: Path) -> None:
    """argv word by word after the setup lines, input on stdin, the umask honoured, the wait bounded, a
    failure naming the command and its output; bounded reads from an offset; `which` for every client in
    one round trip."""
    marker = Path("/tmp/slurmlaunch-pwned")
    marker.unlink(missing_ok=True)
    with remote.Connection(remote.parse_destination("login"), setup=["export SL_SETUP=yes"]) as conn:
        runner = SshRunner(conn)
        out = runner.run(["python3", "-c", "import sys; print(repr(sys.argv[1:]))", *HOSTILE], timeout=60).stdout
        assert ast.literal_eval(out) == HOSTILE
        assert runner.run(["printenv", "SL_SETUP"], timeout=60).stdout == "yes\n"
        assert runner.run(["cat"], timeout=60, input_text="the script\n$(id)\n").stdout == "the script\n$(id)\n"
        made = tmp_path / "made-with-umask"
        runner.run(["touch", str(made)], timeout=60, umask=0o077)
        assert made.stat().st_mode & 0o777 == 0o600
        assert runner.run(["printenv", "SL_X"], timeout=60, env={"SL_X": "a $(b)"}).stdout == "a $(b)\n"
        with pytest.raises(SchedulerError) as e:
            runner.run(["sh", "-c", "echo 'squeue: error: Invalid job id' >&2; exit 1", "it's"], timeout=60)
        assert str(e.value).startswith("on login: sh -c ") and "'it'\"'\"'s'" in str(e.value)
        assert "failed (exit 1): squeue: error: Invalid job id" in str(e.value)
        with pytest.raises(SchedulerError, match="no answer within 1s"):
            runner.run(["sleep", "30"], timeout=1)
        log = tmp_path / "a log with 'quotes' $(x)"
        data = bytes(range(256)) * 9000  # more than one read holds
        log.write_bytes(data)
        assert runner.read(str(log)) == data[:READ_LIMIT] == LocalRunner().read(str(log))
        assert runner.read(str(log), 1000, 10) == data[1000:1010] == LocalRunner().read(str(log), 1000, 10)
        assert runner.read(str(log), len(data)) == b""
        assert runner.read(str(tmp_path / "missing")) is None is LocalRunner().read(str(tmp_path / "missing"))
    assert not marker.exists()
    bin_dir = sshd.login_bin(tmp_path, {"sbatch": "", "sacct": ""})
    with remote.Connection(remote.parse_destination("login"), setup=[f"export PATH={bin_dir}"]) as conn:
        runner = SshRunner(conn)
        asked: list[str] = []
        original = conn.run

        def counting(command: str, **kwargs: object) -> subprocess.CompletedProcess[bytes]:
            asked.append(command)
            return original(command, **kwargs)  # type: ignore[arg-type]

        conn.run = counting  # type: ignore[method-assign]
        assert runner.which("sbatch") and not runner.which("qsub") and runner.which("sacct")
        assert len(asked) == 1  # one `command -v` round trip answered all three
        assert not runner.which("no-such-client") and len(asked) == 2


def test_the_slurm_edge_answers_over_ssh_as_it_does_here(laptop: sshd.Laptop, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The same edge code, with the ssh runner plugged in: squeue (a stand-in: it no longer knows the job),
    no sacct, scontrol's record, and the exit code file the batch script wrote, read on the login node."""
    bin_dir = sshd.login_bin(tmp_path, {
        "squeue": "import sys\nsys.stderr.write('slurm_load_jobs error: Invalid job id specified\\n')\n"
                  "sys.exit(1)\n",
        "scontrol": "print('JobId=41 JobName=x JobState=FAKE UserId=0(0) JobState=FAILED ExitCode=1:0 '\n"
                    "      'RunTime=00:00:07 NodeList=node2')\n"})
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "job-41.exitcode").write_text("3\n")
    setup = [f"export PATH={bin_dir}"]
    with remote.Connection(remote.parse_destination("login"), setup=setup) as conn, use_runner(SshRunner(conn)):
        there = slurm.EDGE.status("41", str(logs))
    monkeypatch.setenv("PATH", str(bin_dir))
    here = slurm.EDGE.status("41", str(logs))
    assert there == here == slurm.JobStatus("FAILED", 3, "node2", elapsed="00:00:07")


def test_the_users_own_control_master_is_used_and_left_running(laptop: sshd.Laptop, server: sshd.Sshd,
                                                               tmp_path: Path) -> None:
    """~/.ssh/config gives the destination a ControlMaster with ControlPersist (a 2FA login asked once a
    day): two slurmlaunch commands log in once, through the user's master, which is still running after
    them; without that configuration (every other test) no ssh process is left."""
    project = tmp_path / "proj"
    project.mkdir()
    (project / "train.py").write_text("")
    sockets = Path(tempfile.mkdtemp(prefix="slcm-"))  # short: a socket path has ~100 bytes
    config = laptop.ssh_dir / "config"
    assert remote.user_control_path("ssh", "login") is None  # the laptop's config as it was: ours
    config.write_text(config.read_text() + f"    ControlMaster auto\n    ControlPath {sockets}/%C\n"
                      "    ControlPersist 600\n")
    assert str(remote.user_control_path("ssh", "login")).startswith(f"{sockets}/")
    before = server.log.count("Accepted publickey")
    masters = []
    try:
        for _ in range(2):
            r = sshd.on_laptop(laptop, "submit", "--remote", "login", "--dry-run", "train.py", cwd=project)
            assert r.returncode == 0, r.stderr
            check = subprocess.run(["ssh", "-O", "check", "login"], env=laptop.env, capture_output=True,
                                   text=True, timeout=30)
            assert check.returncode == 0 and "Master running (pid=" in check.stderr, check.stderr
            masters.append(check.stderr.split("pid=")[1].split(")")[0])
        assert masters[0] == masters[1]  # the second command went through the first one's master
        assert server.log.count("Accepted publickey") == before + 1  # two commands (4 round trips), one login
        # the user's master outlives the commands, as configured ("ssh: SOCKET [mux]")
        assert [args for args in sshd.processes_naming(str(sockets)) if "[mux]" in args]
    finally:
        subprocess.run(["ssh", "-O", "exit", "login"], env=laptop.env, capture_output=True, timeout=30)
        shutil.rmtree(sockets, ignore_errors=True)
    deadline = time.monotonic() + 30  # -O exit answers before the master has exited
    while sshd.processes_naming(str(sockets)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sshd.masters_left(laptop) == [] and sshd.processes_naming(str(sockets)) == []
