"""The project's sync to the remote directory: rsync over the destination's connection, counted first."""

from __future__ import annotations

import re
import shlex
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

from ..core.errors import SpecError
from .remote_dest import DEFAULT_PARENT, shell_command
from .remote_shell import RemoteError, Unreachable, ssh_failure
from .remote_ssh import COMMAND_TIMEOUT_S, Connection

DEFAULT_SYNC_LIMIT = 1 << 30
SHIPPED_DIR = ".slurmlaunch"  # in the remote project directory: the slurmlaunch package this laptop sent


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def resolve_directory(conn: Connection, directory: str | None, project: str, create: bool) -> str:
    """The absolute remote directory for ``directory`` (relative to the remote home; None: the default for
    ``project``), created (0700) when ``create``; one round trip."""
    where = directory if directory is not None else f"{DEFAULT_PARENT}/{project}"
    q = shlex.quote(where)
    # `cd` alone goes home: a --remote-setup line may have changed directory.
    # umask 077: the directories mkdir -p creates on the way are private too, not only the last one.
    script = f"cd && umask 077 && mkdir -p -- {q} && cd -- {q} && pwd -P" if create else \
        f"cd && if cd -- {q} 2>/dev/null; then pwd -P; else printf '%s/%s\\n' \"$(pwd -P)\" {q}; fi"
    what = f"mkdir -p -- {q}" if create else f"cd -- {q}"
    out = conn.run(shell_command(script, conn.setup), what=what).stdout.decode("utf-8", errors="surrogateescape")
    path = out.rstrip("\n").rsplit("\n", 1)[-1]
    if not path.startswith("/"):
        raise RemoteError(f"--remote {conn.dest}: could not resolve the remote directory {where!r} (got "
                          f"{path!r})")
    return path if not where.startswith("/") or create else where


def parse_size(text: str, what: str = "--sync-limit") -> int:
    """``N``, ``N[KMGT]`` (powers of 1024) in bytes."""
    m = re.fullmatch(r"(\d{1,15})([KMGT]?)i?B?", text, re.IGNORECASE)
    if not m:
        raise SpecError(f"{what} {text!r} is not a size (expected bytes or N with K, M, G or T, e.g. 500M)")
    return int(m.group(1)) << (10 * " KMGT".index(m.group(2).upper() or " "))


def _human(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


@dataclass(frozen=True)
class SyncSummary:
    files: int  # regular files in the project (after the excludes)
    sent_files: int  # those that were new or changed
    sent_bytes: int  # their size
    wire_bytes: int  # what rsync sent over the connection, lists and checksums included

    def line(self, dest: str) -> str:
        if not self.sent_files:
            return f"slurmlaunch: synced to {dest}: nothing changed ({plural(self.files, 'file')} up to date)"
        return (f"slurmlaunch: synced to {dest}: {self.sent_files} of {plural(self.files, 'file')} new or changed "
                f"({_human(self.sent_bytes)}; {_human(self.wire_bytes)} over the connection)")


def _stat(stats: str, label: str) -> int:
    m = re.search(rf"^{re.escape(label)}: ([\d,]+)", stats, re.MULTILINE)
    return int(m.group(1).replace(",", "")) if m else 0


def _regular_files(stats: str) -> int:
    """rsync's "Number of files: 1,003 (reg: 1,000, dir: 3)": the regular ones."""
    m = re.search(r"^Number of files: [\d,]+ \(reg: ([\d,]+)", stats, re.MULTILINE)
    return int(m.group(1).replace(",", "")) if m else _stat(stats, "Number of files")


def sync_argv(conn: Connection, local_dir: str, remote_dir: str, excludes: Sequence[str],
              dry_run: bool = False) -> list[str]:
    """rsync of ``local_dir`` into ``remote_dir``: .gitignore files honoured as rsync reads them (each
    directory's own, `:- .gitignore`), .git/ and ``excludes`` left out; nothing on the remote is deleted."""
    # --chmod=go-rwx: what is sent is private to the user there, whatever its permissions here (-a copies
    # them, and a laptop's umask is usually 022).
    argv = ["rsync", "-a", "--chmod=go-rwx", "--stats", "-s", "-e", conn.rsync_shell(),
            "--filter=:- .gitignore", "--exclude=/.git/", f"--exclude=/{SHIPPED_DIR}/",
            *(f"--exclude={e}" for e in excludes)]
    if dry_run:
        argv.append("--dry-run")
    return [*argv, "--", local_dir.rstrip("/") + "/", f"{conn.dest.target}:{remote_dir}/"]


def _rsync(conn: Connection, argv: list[str], timeout: float) -> str:
    if not conn.shell_checked:  # rsync's own protocol error is all a chatty dotfile would otherwise leave
        conn.run("true", timeout=60, what="true")
    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout)
    except FileNotFoundError:
        raise RemoteError("rsync is not on PATH here (install it, or --no-sync)") from None
    except subprocess.TimeoutExpired:
        raise RemoteError(f"--remote {conn.dest}: rsync did not finish within {timeout:.0f}s") from None
    err = proc.stderr.decode(errors="replace")
    if proc.returncode != 0:
        why = ssh_failure(conn.dest, conn.config, err, exited_255=False)
        if why:
            raise Unreachable(why)
        # all of rsync's lines: its explanation ("is your shell clean?") comes before its last one
        said = " | ".join(line.strip() for line in err.splitlines() if line.strip())[-1500:] or "(no output)"
        raise RemoteError(f"--remote {conn.dest}: rsync failed (exit {proc.returncode}): {said}")
    return proc.stdout.decode(errors="replace")


def sync(conn: Connection, local_dir: str, remote_dir: str, excludes: Sequence[str] = (),
         limit: int = DEFAULT_SYNC_LIMIT, timeout: float = 3600.0) -> SyncSummary:
    """Send what changed in ``local_dir``. Counted first (a dry run): more than ``limit`` bytes to send is
    refused with one line, before anything is sent."""
    counted = _rsync(conn, sync_argv(conn, local_dir, remote_dir, excludes, dry_run=True), COMMAND_TIMEOUT_S)
    to_send = _stat(counted, "Total transferred file size")
    if to_send > limit:
        raise SpecError(
            f"sync of {local_dir!r} to {conn.dest.target}:{remote_dir} would send "
            f"{plural(_stat(counted, 'Number of regular files transferred'), 'file')}, {_human(to_send)}, "
            f"more than the limit {_human(limit)}; leave out what is not code (.gitignore or --remote-exclude), raise "
            f"--sync-limit, or --no-sync")
    if not _stat(counted, "Number of regular files transferred"):
        return SyncSummary(_regular_files(counted), 0, 0, _stat(counted, "Total bytes sent"))
    done = _rsync(conn, sync_argv(conn, local_dir, remote_dir, excludes), timeout)
    return SyncSummary(_regular_files(done), _stat(done, "Number of regular files transferred"),
                       _stat(done, "Total transferred file size"), _stat(done, "Total bytes sent"))
