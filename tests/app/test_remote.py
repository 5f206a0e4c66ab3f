"""--remote's pieces against a real OpenSSH server (tests/sshd.py) and the real rsync: destinations, the
multiplexed transport (ours, or the user's own ControlMaster), the ssh command runner under the scheduler
edges, strings as data, one-line errors for what ssh refuses, and the sync."""

from __future__ import annotations

import ast
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from slurmlaunch.app import remote
from slurmlaunch.app.remote.runner import SshRunner
from slurmlaunch.core.errors import SchedulerError, SlurmLaunchError, SpecError
from slurmlaunch.schedulers import slurm
from slurmlaunch.schedulers.runner import READ_LIMIT, LocalRunner, use_runner
from tests import ports, sshd
from tests.helpers import alive

# The remote calls here run in this process, as the laptop: its environment is this process's (conftest laptop).
pytestmark = pytest.mark.laptop_env

HOSTILE = [
    "two words", "it's", 'say "hi"', "$(touch /tmp/slurmlaunch-pwned)", "`touch /tmp/slurmlaunch-pwned`",
    "line1\nline2", "tab\there", "naïve ünïcødé ✓ 日本", "; rm -rf ~ #", "a\\b\\\\c", "*", "~", "$HOME", "-n",
    "'", '"', "&& echo no", "|cat", "> /tmp/x", "\r", " leading and trailing ", "!event", "{a,b}",
]


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


def test_setup_line_that_fails_stops_the_command_and_is_named(laptop: sshd.Laptop, tmp_path: Path) -> None:
    """Audit 8: the error names the --remote-setup line that failed (which of them, its output), not the end
    of the script slurmlaunch wrapped around it; the command after it never runs."""
    ran = tmp_path / "ran"
    setup = ["export SL_A=1", "echo 'zsh:2: command not found: module' >&2; false", "export SL_C=3"]
    with remote.Connection(remote.parse_destination("login"), setup=setup) as conn:
        with pytest.raises(remote.RemoteError) as e:
            conn.run_argv(["touch", str(ran)], timeout=60, check=False)
        with pytest.raises(SchedulerError) as e2:
            SshRunner(conn).run(["squeue", "--me"], timeout=60)
    for text in (str(e.value), str(e2.value)):
        assert "--remote-setup " in text and "(line 2 of 3) failed (exit 1): zsh:2: command not found: module" \
            in text, text
        assert "slurmlaunch_setup_step" not in text and "\n" not in text and "touch" not in text
    assert not ran.exists()
    # a command (not a setup line) that fails is named by its words, not by the snippet around it
    with remote.Connection(remote.parse_destination("login"), setup=["true"]) as conn:
        with pytest.raises(SchedulerError) as e3:
            SshRunner(conn).run(["sh", "-c", "echo nope >&2; exit 3"], timeout=60)
        proc = conn.run_argv(["sh", "-c", "echo out; echo err >&2; exit 4"], timeout=60, check=False)
    assert str(e3.value) == "on login: sh -c 'echo nope >&2; exit 3' failed (exit 3): nope"
    assert (proc.returncode, proc.stdout, proc.stderr) == (4, b"out\n", b"err\n")  # no marker left in stderr


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
    changed = attempt()
    # the advice names the entry as recorded and the file it is in (ssh -G: port, UserKnownHostsFile)
    assert "has CHANGED" in changed and f"ssh-keygen -R '[127.0.0.1]:{server.port}' -f {known}" in changed
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


def test_a_job_slurm_forgot_without_accounting_ended_how_is_unknown(laptop: sshd.Laptop, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """squeue and scontrol no longer know the job (MinJobAge passed), there is no sacct, and no exit-code file
    (an API job's submitit script writes none): it has ended, and how is unknown, not "GONE, exit code 1"."""
    forgot = ("import sys\nsys.stderr.write('slurm_load_jobs error: Invalid job id specified\\n')\n"
              "sys.exit(1)\n")
    bin_dir = sshd.login_bin(tmp_path, {"squeue": forgot, "scontrol": forgot})
    logs = tmp_path / "logs"
    logs.mkdir()
    with remote.Connection(remote.parse_destination("login"), setup=[f"export PATH={bin_dir}"]) as conn, \
            use_runner(SshRunner(conn)):
        there = slurm.EDGE.status("41", str(logs))
    monkeypatch.setenv("PATH", str(bin_dir))
    here = slurm.EDGE.status("41", str(logs))
    assert there == here == slurm.JobStatus("ENDED", None, note=slurm.FORGOTTEN)
    assert there.finished and "how it ended is unknown" in str(there.note)


# A squeue that never answers (slurmctld hung): it says where it runs, and ignores SIGTERM as a process stuck in
# an RPC may; only KILL ends it.
HUNG_SQUEUE = ("import os, signal, sys, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
               "open(os.path.join(os.environ['HUNG_DIR'], f'squeue-{os.getpid()}'), 'w').close()\n"
               "time.sleep(600)\n")


def _hung_ones(where: Path) -> list[int]:
    return [int(p.name.split("-")[1]) for p in where.glob("squeue-*")]


def _gone(pids: list[int], bound: float = 60.0) -> bool:
    deadline = time.monotonic() + bound
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    return not any(alive(pid) for pid in pids)


def test_a_command_the_laptop_gave_up_on_does_not_run_on(laptop: sshd.Laptop, tmp_path: Path) -> None:
    """The laptop's bound (here 10 s) ends the ssh session; sshd stops nothing it started without a terminal,
    so the remote side has the same bound (coreutils timeout, KILL 5 s after TERM): the hung squeue dies."""
    hung = tmp_path / "hung"
    hung.mkdir()
    bin_dir = sshd.login_bin(tmp_path, {"squeue": HUNG_SQUEUE})
    setup = [f"export PATH={bin_dir}:/usr/bin:/bin", f"export HUNG_DIR={hung}"]
    with remote.Connection(remote.parse_destination("login"), setup=setup) as conn:
        with pytest.raises(SchedulerError, match="no answer within 10s"):
            SshRunner(conn).run(["squeue", "-h", "--me"], timeout=10)
    started = _hung_ones(hung)
    assert len(started) == 1
    assert _gone(started), "the hung squeue still runs on the login node"


def test_a_setup_line_the_laptop_gave_up_on_does_not_run_on(laptop: sshd.Laptop, tmp_path: Path) -> None:
    """The same bound for the --remote-setup lines, which are shell code of the remote shell itself (no
    `timeout` can run them): a hung line that ignores TERM is stopped with the shell's process group."""
    hung = tmp_path / "hung"
    hung.mkdir()
    bin_dir = sshd.login_bin(tmp_path, {"hung-setup": HUNG_SQUEUE})
    setup = [f"export PATH={bin_dir}:/usr/bin:/bin", f"export HUNG_DIR={hung}", "hung-setup"]
    with remote.Connection(remote.parse_destination("login"), setup=setup) as conn:
        with pytest.raises(SlurmLaunchError, match="10s"):
            SshRunner(conn).run(["squeue", "-h", "--me"], timeout=10)
    started = _hung_ones(hung)
    assert len(started) == 1
    assert _gone(started), "the hung setup line still runs on the login node"


def test_list_asks_every_destination_at_once_within_one_bound(laptop: sshd.Laptop, tmp_path: Path) -> None:
    """Two destinations (the same host, set up differently) whose squeue hangs: both are asked at the same
    time (each hung squeue started: asked one after another within one bound, the second would not be), each
    row says "?" and one line per destination says why, and no squeue is left running."""
    from slurmlaunch.app.remote import jobs as remote_jobs

    hung = tmp_path / "hung"
    hung.mkdir()
    bin_dir = sshd.login_bin(tmp_path, {"squeue": HUNG_SQUEUE})
    rows = []
    for n in (1, 2):
        record = tmp_path / f"job-{n}.json"
        record.write_text(json.dumps({"job_id": str(n), "scheduler": "slurm", "log_dir": str(tmp_path),
                                      "remote": "login", "remote_setup": [
                                          f"export PATH={bin_dir}:/usr/bin:/bin", f"export HUNG_DIR={hung}",
                                          f"export DESTINATION={n}"]}))
        rows.append({"job_id": str(n), "scheduler": "slurm", "record": str(record), "remote": "login"})
    live: dict[str, dict[str, str] | None] = {}
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        remote_jobs.prefetch(rows, live, bound=10)
        shown = [remote_jobs.list_row(row, live)["state"] for row in rows]
    assert shown == ["?", "?"], err.getvalue()
    lines = err.getvalue().splitlines()
    assert len(lines) == 2 and all(line.startswith("slurmlaunch: list: no states from login: ") for line in lines)
    started = _hung_ones(hung)
    assert len(started) == 2, lines
    assert _gone(started), "a hung squeue still runs on the login node"


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


# -- the client set-ups of the independent audit (/tmp/sl-brief/audit.md numbers) --

def _add_host(lap: sshd.Laptop, text: str) -> None:
    """A Host block in front of the laptop's (ssh takes the first value it reads)."""
    config = lap.ssh_dir / "config"
    config.write_text(text + config.read_text())


def _bash_env(lap: sshd.Laptop, tmp_path: Path, body: str) -> None:
    """The login node's non-interactive bash reads ``body`` first (sshd accepts BASH_ENV: tests/sshd.py): the
    stand-in for the user's own dotfiles there."""
    rc = tmp_path / "dotfile.sh"
    rc.write_text(body)
    config = lap.ssh_dir / "config"
    config.write_text(config.read_text().replace("Host login\n", f"Host login\n    SetEnv BASH_ENV={rc}\n", 1))


def test_control_socket_is_short_and_private_under_a_long_tmpdir(laptop: sshd.Laptop, request: pytest.FixtureRequest,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Audit 1: macOS's TMPDIR (/var/folders/.../T/) pushed ControlPath over the socket limit; ours is a short
    private directory of /tmp, and a path that would still be too long is refused in one line."""
    base = tempfile.mkdtemp(prefix="sl-long-", dir="/tmp")  # tmp_path itself is longer than 60
    long_tmp = Path(base, "t" * (60 - len(base) - 1))
    long_tmp.mkdir()
    assert len(str(long_tmp)) == 60
    request.addfinalizer(lambda: shutil.rmtree(base, ignore_errors=True))
    monkeypatch.setenv("TMPDIR", str(long_tmp))
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() caches its answer
    with remote.Connection(remote.parse_destination("login")) as conn:
        assert conn.run_argv(["echo", "ok"], timeout=60).stdout == b"ok\n"
        control_dir = conn.control_dir
        assert control_dir.startswith("/tmp/sl-") and not control_dir.startswith(str(long_tmp))
        assert os.stat(control_dir).st_mode & 0o777 == 0o700
        assert len(os.path.join(control_dir, os.listdir(control_dir)[0])) < remote.SOCKET_PATH_MAX - 17
    assert not os.path.exists(control_dir) and os.listdir(long_tmp) == []
    # no writable /tmp: TMPDIR it is, and one that is too long is one line
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: False if path == "/tmp" else real_access(path, mode))
    error = _one_line_error(lambda: remote.private_control_dir())
    assert "more than the 104 bytes a socket path may have" in error and "ControlPath" in error
    assert os.listdir(long_tmp) == []


def test_a_dotfile_printing_on_stdout_is_named_before_anything_breaks(laptop: sshd.Laptop, tmp_path: Path) -> None:
    """Audit 3: a chatty dotfile broke rsync ("protocol incompatibility") and spoiled `logs`: the connection's
    first command sees it and says what it is; rsync's own explanation lines are kept when rsync fails."""
    project = tmp_path / "proj"
    project.mkdir()
    (project / "a.py").write_text("x = 1\n")
    _bash_env(laptop, tmp_path, "echo 'Welcome to the cluster!'\n")
    dest = remote.parse_destination(f"login:{tmp_path / 'there'}")
    for attempt in (lambda c: c.run_argv(["true"], timeout=60), lambda c: SshRunner(c).read(str(project / "a.py")),
                    lambda c: remote.sync(c, str(project), str(tmp_path / "there"))):
        with remote.Connection(dest) as conn:
            error = _one_line_error(lambda: attempt(conn))  # noqa: B023
        assert "prints 'Welcome to the cluster!' on stdout before every command" in error, error
        assert "~/.bashrc" in error and "~/.zshenv" in error and "interactive" in error
    with remote.Connection(dest) as conn:
        conn.shell_checked = True  # as if unchecked: rsync meets the noise itself
        error = _one_line_error(lambda: remote.sync(conn, str(project), str(tmp_path / "there")))
    assert "protocol" in error and "shell clean" in error, error


def test_a_non_posix_login_shell_is_one_line(laptop: sshd.Laptop, tmp_path: Path) -> None:
    """Audit 12: tcsh as the login shell (here the real tcsh runs every command, as `tcsh -c` would) is named
    in one line, not 70 parts of tcsh's complaints."""
    tcsh = shutil.which("tcsh", path="/usr/bin:/bin")
    if not tcsh:
        pytest.skip("tcsh is not installed")
    _bash_env(laptop, tmp_path, f'exec {tcsh} -c "$BASH_EXECUTION_STRING"\n')
    with remote.Connection(remote.parse_destination("login")) as conn:
        error = _one_line_error(lambda: SshRunner(conn).run(["squeue"], timeout=60))
    assert "does not read POSIX sh" in error and "tcsh" in error and "chsh" in error, error


def test_logs_reads_tell_missing_from_failing(laptop: sshd.Laptop, tmp_path: Path) -> None:
    """Audit 9: no such file is "no log yet" (None); a path there that cannot be read is a failure."""
    (tmp_path / "log").write_bytes(b"line\n")
    with remote.Connection(remote.parse_destination("login"), setup=["false"]) as conn:
        runner = SshRunner(conn)
        assert runner.read(str(tmp_path / "log")) == b"line\n"  # the setup lines are not run for a read
        assert runner.read(str(tmp_path / "missing")) is None
        with pytest.raises(SchedulerError, match="not a readable file"):
            runner.read(str(tmp_path))


def test_jump_host_and_host_key_alias_are_named(laptop: sshd.Laptop, server: sshd.Sshd, tmp_path: Path) -> None:
    """Audit 13: through a ProxyJump host that is closed the error names it; the changed-key advice uses
    HostKeyAlias and UserKnownHostsFile as `ssh -G` resolves them."""
    closed = ports.port()
    key = laptop.ssh_dir / "id_ed25519"
    other = laptop.home / "impostor"
    sshd.keygen(other, "impostor")
    kind, wrong = other.with_suffix(".pub").read_text().split()[:2]
    cluster_known = laptop.ssh_dir / "known_hosts.cluster"
    cluster_known.write_text(f"cluster-login {kind} {wrong}\n")
    _add_host(laptop, f"Host hpc\n    HostName 127.0.0.1\n    Port {server.port}\n    User root\n"
                      f"    ProxyJump jumpbox\n    IdentityFile {key}\n"
                      f"Host jumpbox\n    HostName 127.0.0.1\n    Port {closed}\n    User root\n"
                      f"Host aliased\n    HostName 127.0.0.1\n    Port {server.port}\n    User root\n"
                      f"    HostKeyAlias cluster-login\n    UserKnownHostsFile {cluster_known}\n"
                      f"    StrictHostKeyChecking yes\n    IdentityFile {key}\n")

    def attempt(dest: str) -> str:
        def go() -> None:
            with remote.Connection(remote.parse_destination(dest)) as conn:
                conn.run_argv(["true"], timeout=60)
        return _one_line_error(go)

    jumped = attempt("hpc")
    assert "cannot reach" in jumped or "ssh failed" in jumped, jumped
    assert "ProxyJump host jumpbox" in jumped and "`ssh jumpbox`" in jumped, jumped
    changed = attempt("aliased")
    assert f"ssh-keygen -R 'cluster-login' -f {cluster_known}" in changed, changed


def test_the_remote_interpreter_is_checked_and_tilde_expanded_there(laptop: sshd.Laptop, tmp_path: Path) -> None:
    """Audit 4/6: `--python ~/venv/bin/python` is the remote home's; a missing or too old interpreter is one
    line at submit time, not a job that fails in the queue."""
    home = tmp_path / "remote home"
    (home / "venv/bin").mkdir(parents=True)
    py = home / "venv/bin/python"
    py.write_text(f"#!/bin/sh\nexec {shutil.which('python3')} \"$@\"\n")
    py.chmod(0o755)
    old = home / "old/bin/python"
    old.parent.mkdir(parents=True)
    old.write_text("#!/bin/sh\nprintf 3.6\n")
    old.chmod(0o755)
    with remote.Connection(remote.parse_destination("login"), setup=[f"export HOME='{home}'"]) as conn:
        assert remote.check_python(conn, "~/venv/bin/python") == str(py)
        assert remote.check_python(conn, "python3") == "python3"
        missing = _one_line_error(lambda: remote.check_python(conn, "~/nope/bin/python"))
        too_old = _one_line_error(lambda: remote.check_python(conn, "~/old/bin/python"))
        other_user = _one_line_error(lambda: remote.check_python(conn, "~bob/venv/bin/python"))
    assert "--python ~/nope/bin/python on login: not found" in missing, missing
    assert "is Python 3.6" in too_old and "needs Python >= 3.10" in too_old, too_old
    assert "only ~/" in other_user


def test_the_follower_retries_a_drop_but_not_a_failing_command(laptop: sshd.Laptop) -> None:
    """Audit 5: a command that fails (here a --remote-setup line) ends the follower at once, in one line; only
    ssh's own failure is retried (follow() retries SchedulerError, which Unreachable is)."""
    from slurmlaunch.app.follow import follow
    from slurmlaunch.app.remote.follow import RemoteCommandFailed, RemoteFollower

    with remote.Connection(remote.parse_destination("login"), setup=["echo 'module: not found' >&2; false"]) as conn:
        follower = RemoteFollower(SshRunner(conn), slurm.EDGE, "12345", "/tmp", None)
        with pytest.raises(RemoteCommandFailed, match="--remote-setup .* failed .*module: not found"):
            follow("12345", follower, None, poll=0.0)
        assert follower.failures == 0
    with remote.Connection(remote.parse_destination("no-such-host.invalid")) as conn:
        follower = RemoteFollower(SshRunner(conn), slurm.EDGE, "12345", "/tmp", None)
        with pytest.raises(remote.Unreachable):
            follower()
        assert follower.failures == 1 and isinstance(remote.Unreachable("x"), SchedulerError)


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGHUP"])
def test_a_signal_during_a_remote_command_stops_the_master(laptop: sshd.Laptop, tmp_path: Path,
                                                           signame: str) -> None:
    """Audit 11: SIGTERM or SIGHUP while a remote command runs (as `logs --follow` does) still stops our
    master and removes its private directory."""
    import signal

    started = tmp_path / "started"
    script = (f"import sys\nfrom slurmlaunch.app import remote\n"
              f"with remote.Connection(remote.parse_destination('login')) as conn:\n"
              f"    print(conn.control_dir, flush=True)\n"
              f"    conn.run_argv(['sh', '-c', 'touch {started}; sleep 120'], timeout=300)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=laptop.env)
    assert proc.stdout is not None
    control_dir = proc.stdout.readline().strip()
    deadline = time.monotonic() + 60
    while not started.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert started.exists()
    proc.send_signal(getattr(signal, signame))
    assert proc.wait(60) == 128 + getattr(signal, signame)
    assert not os.path.exists(control_dir) and sshd.processes_naming(control_dir) == []


def test_an_sshd_banner_is_not_shown_as_a_commands_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Audit 8: an sshd Banner (on ssh's stderr at login) is not part of a failing command's text."""
    banner = tmp_path / "banner"
    banner.write_text("AUTHORISED USE ONLY - this banner is not output\n")
    server = sshd.start_sshd([f"Banner {banner}"])
    try:
        lap = sshd.make_laptop(server, tmp_path / "lap")
        for key, value in lap.env.items():
            monkeypatch.setenv(key, value)
        with remote.Connection(remote.parse_destination("login"), setup=["echo bad >&2; false"]) as conn:
            error = _one_line_error(lambda: conn.run_argv(["true"], timeout=60))
        assert "AUTHORISED" not in error and error.endswith("failed (exit 1): bad"), error
    finally:
        sshd.remove(server)


def test_zsh_as_the_login_shell_runs_setup_lines_and_its_chatty_zshenv_is_named(laptop: sshd.Laptop,
                                                                               tmp_path: Path) -> None:
    """zsh (the real one) runs the setup wrapper and names a failing line as sh does; a ~/.zshenv that
    echoes (zsh reads it for every shell) is refused in one line."""
    zsh = shutil.which("zsh", path="/usr/bin:/bin")
    if not zsh:
        pytest.skip("zsh is not installed")
    zdot = tmp_path / "zdot"
    zdot.mkdir()
    _bash_env(laptop, tmp_path, f'ZDOTDIR={zdot} exec {zsh} -c "$BASH_EXECUTION_STRING"\n')
    with remote.Connection(remote.parse_destination("login"), setup=["export SL_Z=1", "false"]) as conn:
        error = _one_line_error(lambda: conn.run_argv(["true"], timeout=60))
    assert "--remote-setup false (line 2 of 2) failed (exit 1)" in error, error
    with remote.Connection(remote.parse_destination("login"), setup=["export SL_Z=zsh"]) as conn:
        assert conn.run_argv(["printenv", "SL_Z"], timeout=60).stdout == b"zsh\n"
        assert conn.run('echo "${ZSH_VERSION:+zsh}"', timeout=60).stdout == b"zsh\n"  # zsh ran it
    (zdot / ".zshenv").write_text("echo 'zsh says hi'\n")
    with remote.Connection(remote.parse_destination("login")) as conn:
        error = _one_line_error(lambda: conn.run_argv(["true"], timeout=60))
    assert "prints 'zsh says hi' on stdout" in error and "~/.zshenv" in error, error


@pytest.mark.parametrize(("config", "theirs"), [
    ({"controlpath": "/s/%C", "controlmaster": "auto"}, "/s/%C"),
    ({"controlpath": "/s/%C", "controlmaster": "autoask"}, "/s/%C"),
    ({"controlpath": "/s/%C", "controlmaster": "true"}, "/s/%C"),
    ({"controlpath": "/s/%C", "controlmaster": "false"}, None),  # a path alone: every call logs in anew
    ({"controlpath": "none", "controlmaster": "auto"}, None),
    ({}, None),
])
def test_only_a_control_path_with_a_master_is_the_users_own(config: dict[str, str], theirs: str | None) -> None:
    """Audit 2, finding 3: `ControlPath` without `ControlMaster` made one submit --wait log in 18 times."""
    from slurmlaunch.app.remote.shell import user_master_path

    assert user_master_path(config) == theirs


def test_through_a_jump_host_the_line_that_says_why_is_shown() -> None:
    """Audit 2, item 13: ssh's last line through a ProxyJump host is always kex_exchange_identification's; the
    cause (a refused connection, a refused key) comes first."""
    from slurmlaunch.app.remote.shell import ssh_failure

    dest = remote.parse_destination("hpc")
    for first in ("ssh: connect to host 127.0.0.2 port 1: Connection refused",
                  "nobody@127.0.0.2: Permission denied (publickey)."):
        said = ssh_failure(dest, {"proxyjump": "jumpbox"},
                           f"{first}\nkex_exchange_identification: Connection closed by remote host\n"
                           "Connection closed by UNKNOWN port 65535\n")
        assert said is not None and first in said, said


@pytest.mark.parametrize(("tools", "requested", "chosen"), [
    (("qsub",), "auto", "pbs"), (("qsub", "sbatch"), "auto", "slurm"), (("sbatch",), "auto", "slurm"),
    ((), "auto", "slurm"), (("qsub", "sbatch"), "pbs", "pbs"), (("qsub",), "slurm", "slurm"),
])
def test_the_login_nodes_runner_chooses_as_submit_remote_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              tools: tuple[str, ...], requested: str,
                                                              chosen: str) -> None:
    """The API's remote= runner (on the login node) and `doctor`: auto is PBS where qsub is on PATH and sbatch
    is not, else Slurm (never the local scheduler); a named one as named. The tools are never run."""
    from slurmlaunch.app.api.runner import login_scheduler
    from slurmlaunch.app.doctor.command import doctor_scheduler

    for tool in tools:
        (tmp_path / tool).write_text("#!/bin/sh\nexit 99\n")
        (tmp_path / tool).chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert login_scheduler(requested) == chosen and doctor_scheduler(requested) == chosen


class _StandInLogin:
    """A login node's runner as doctor --remote asks it: which clients are on its PATH (recorded)."""

    def __init__(self, tools: tuple[str, ...]) -> None:
        self.tools = tools
        self.asked: list[str] = []
        self.conn = type("Conn", (), {"dest": remote.Destination("login")})()

    def which(self, name: str) -> bool:
        self.asked.append(name)
        return name in self.tools


@pytest.mark.parametrize(("tools", "requested", "chosen"), [
    (("qsub",), "auto", "pbs"), (("qsub", "sbatch"), "auto", "slurm"), (("sbatch",), "auto", "slurm"),
    ((), "auto", "slurm"), (("qsub", "sbatch"), "pbs", "pbs"), (("qsub",), "slurm", "slurm"),
])
def test_doctor_remote_chooses_on_the_login_node_as_submit_remote_does(tools: tuple[str, ...], requested: str,
                                                                       chosen: str, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """doctor --remote: the scheduler is chosen from the login node's clients (never this machine's PATH, which
    has sbatch here), as doctor there would choose it; a named one is taken as named, without asking. Auto's
    choice is said once (issue 41), as on this machine: not again by the next command that makes the same one."""
    from slurmlaunch.app.remote.doctor import login_node_scheduler

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    login = _StandInLogin(tools)
    assert login_node_scheduler(requested, login) == chosen  # type: ignore[arg-type]
    assert bool(login.asked) == (requested == "auto"), login.asked
    said = capsys.readouterr().err
    assert (f"--scheduler auto chose {chosen} on login" in said) == (requested == "auto"), said
    assert login_node_scheduler(requested, _StandInLogin(tools)) == chosen  # type: ignore[arg-type]
    assert "auto chose" not in capsys.readouterr().err


def test_submit_remote_says_autos_choice_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """issue 41: `--remote` said auto's choice on every command; now once, and again when it changes."""
    from slurmlaunch.app.remote.submit import remote_scheduler

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    said = []
    for tools in (("qsub",), ("qsub",), ("sbatch",), ("sbatch",)):
        assert remote_scheduler("auto", _StandInLogin(tools)) == ("pbs" if tools == ("qsub",) else "slurm")  # type: ignore[arg-type]
        said.append(capsys.readouterr().err)
    assert [s.count("--scheduler auto chose") for s in said] == [1, 0, 1, 0], said
    assert "auto chose pbs on login (qsub is on its PATH" in said[0] and "auto chose slurm on login" in said[2]


def test_doctor_remote_refuses_a_scheduler_it_does_not_check_before_connecting() -> None:
    from slurmlaunch.app.remote.doctor import cmd_doctor_remote

    with pytest.raises(SpecError, match="--scheduler 'local' is not valid for doctor"):
        cmd_doctor_remote("nosuchhost.invalid", None, None, None, False, 1, 0, 60.0, "local")


def test_doctor_remote_with_pbs_allocate_runs_pbs_s_checks_there(laptop: sshd.Laptop, tmp_path: Path) -> None:
    """--scheduler pbs --allocate 1 over ssh: the probe job is rendered here for PBS and the login node's doctor
    runs PBS's checks (its clients are not on that PATH here, so it stops there, exit 1, no job submitted)."""
    r = sshd.on_laptop(laptop, "doctor", "--remote", f"login:{tmp_path / 'proj'}", "--python", sys.executable,
                       "--scheduler", "pbs", "--allocate", "1", "--json", cwd=tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr  # doctor's own verdict: no PBS clients there
    report = json.loads(r.stdout)
    checks = {c["name"]: c["detail"] for c in report["checks"]}
    assert "qsub" in checks["commands"] and "sbatch" not in checks["commands"], report
    assert report["probe_job"] is None, report


@pytest.mark.parametrize("shell", ["bash", "dash"])
def test_setup_lines_leave_the_commands_stdout_alone_and_cannot_end_it_silently(laptop: sshd.Laptop, tmp_path: Path,
                                                                              shell: str) -> None:
    """What a setup line prints on stdout (a module system's chatter) goes to stderr, not before the command's
    answer (a job id, JSON); a line that ends the shell with status 0 (`exit`) is a failure naming it, not an
    empty answer taken for the command's. The same with dash (Debian's sh) as the login shell."""
    if shell == "dash":
        dash = shutil.which("dash", path="/usr/bin:/bin")
        if not dash:
            pytest.skip("dash is not installed")
        _bash_env(laptop, tmp_path, f'exec {dash} -c "$BASH_EXECUTION_STRING"\n')
    setup = ["echo 'Loading module cuda/12'", "export SL_S=1"]
    with remote.Connection(remote.parse_destination("login"), setup=setup) as conn:
        proc = conn.run_argv(["printenv", "SL_S"], timeout=60, check=False)
        assert (proc.returncode, proc.stdout, proc.stderr) == (0, b"1\n", b"Loading module cuda/12\n")
        assert SshRunner(conn).run(["printf", "%s", "a b"], timeout=60).stdout == "a b"  # within the setup bound
    with remote.Connection(remote.parse_destination("login"), setup=["export SL_S=1", "exit 0"]) as conn:
        error = _one_line_error(lambda: SshRunner(conn).run(["printenv", "SL_S"], timeout=60))
    assert "--remote-setup 'exit 0' (line 2 of 2) failed (exit 125)" in error, error
