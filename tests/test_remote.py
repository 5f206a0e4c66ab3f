"""--remote's pieces against a real OpenSSH server (tests/sshd.py) and the real rsync: destinations, the
multiplexed transport, strings as data, one-line errors for what ssh refuses, and the sync."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from slurmlaunch.app import remote
from slurmlaunch.core.errors import SlurmLaunchError, SpecError

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
