"""The project's sync to the remote directory: rsync over the destination's connection, counted first."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from ...core.errors import SpecError
from .dest import DEFAULT_PARENT, shell_command
from .shell import RemoteError, Unreachable, ssh_failure
from .ssh import COMMAND_TIMEOUT_S, Connection

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
    proc = conn.run(shell_command(script, conn.setup, conn.timeout), what=what)
    out = proc.stdout.decode("utf-8", errors="surrogateescape")
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


GIT_RULE = "as git lists them"  # which rule chose the files: the summary line says it
FILTER_RULE = "as rsync's .gitignore filter leaves them"


@dataclass(frozen=True)
class SyncSummary:
    files: int  # regular files in the project (after the excludes)
    sent_files: int  # those that were new or changed
    sent_bytes: int  # their size
    wire_bytes: int  # what rsync sent over the connection, lists and checksums included
    rule: str = FILTER_RULE  # GIT_RULE or FILTER_RULE

    def line(self, dest: str) -> str:
        if not self.sent_files:
            return (f"slurmlaunch: synced to {dest}: nothing changed ({plural(self.files, 'file')} up to date), "
                    f"files {self.rule}")
        return (f"slurmlaunch: synced to {dest}: {self.sent_files} of {plural(self.files, 'file')} new or changed "
                f"({_human(self.sent_bytes)}; {_human(self.wire_bytes)} over the connection), files {self.rule}")


def _stat(stats: str, label: str) -> int:
    m = re.search(rf"^{re.escape(label)}: ([\d,]+)", stats, re.MULTILINE)
    return int(m.group(1).replace(",", "")) if m else 0


def _regular_files(stats: str) -> int:
    """rsync's "Number of files: 1,003 (reg: 1,000, dir: 3)": the regular ones."""
    m = re.search(r"^Number of files: [\d,]+ \(reg: ([\d,]+)", stats, re.MULTILINE)
    return int(m.group(1).replace(",", "")) if m else _stat(stats, "Number of files")


def sync_argv(conn: Connection, local_dir: str, remote_dir: str, excludes: Sequence[str],
              dry_run: bool = False, listed: bool | None = None) -> list[str]:
    """rsync of ``local_dir`` into ``remote_dir``; nothing on the remote is deleted. ``listed`` (None: when
    local_dir is in a git work tree and git is on PATH, see git_files): the files are the NUL-separated list
    on rsync's stdin, git's answer to what .gitignore means; otherwise rsync reads each directory's
    .gitignore itself (`:- .gitignore`, which knows no `!` line). Either way .git/, .slurmlaunch/ and
    ``excludes`` are left out."""
    if listed is None:
        listed = git_files(local_dir) is not None
    # --chmod=go-rwx: what is sent is private to the user there, whatever its permissions here (-a copies
    # them, and a laptop's umask is usually 022).
    argv = ["rsync", "-a", "--chmod=go-rwx", "--stats", "-s", "-e", conn.rsync_shell()]
    if listed:
        argv += ["--files-from=-", "--from0"]
    else:
        argv.append("--filter=:- .gitignore")
    for pattern in ("/.git/", f"/{SHIPPED_DIR}/", *excludes):
        argv.append(f"--exclude={pattern}")
        if listed:  # rsync does not walk a list: what is below an excluded directory is left out by name
            argv.append(f"--exclude={pattern if pattern.endswith('/') else pattern + '/'}**")
    if dry_run:
        argv.append("--dry-run")
    return [*argv, "--", local_dir.rstrip("/") + "/", f"{conn.dest.path_target}:{remote_dir}/"]


def _git_list(top: str, below: str, depth: int = 0) -> list[bytes] | None:
    """What git sends of ``top/below`` (a work tree's directory): tracked files still there and untracked
    ones not ignored, relative to ``top``; a submodule or nested repository's own list in its place."""
    try:
        proc = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                              cwd=os.path.join(top, below), stdin=subprocess.DEVNULL, capture_output=True,
                              timeout=COMMAND_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None  # not a work tree (or git refuses it: another user's)
    found: list[bytes] = []
    prefix = os.fsencode(below + "/" if below else "")
    for name in dict.fromkeys(proc.stdout.split(b"\0")):  # a conflicted file is listed once per stage
        if not name:
            continue
        rel = prefix + name.rstrip(b"/")
        path = os.path.join(os.fsencode(top), rel)
        try:
            mode = os.lstat(path).st_mode
        except OSError:
            continue  # tracked, deleted here
        if stat.S_ISDIR(mode):  # a submodule or an untracked repository
            inner = _git_list(top, os.fsdecode(rel), depth + 1) if depth < 8 else None
            found += inner or []
        else:
            found.append(rel)
    return found


def git_files(local_dir: str) -> bytes | None:
    """The files to send as git says (its ignore rules: `!` lines, every directory's .gitignore,
    .git/info/exclude, core.excludesFile), NUL-separated; None where git is not on PATH, local_dir is not
    in a git work tree, or git lists nothing there."""
    if not shutil.which("git"):
        return None
    names = _git_list(os.path.abspath(local_dir), "")
    # none: not git's project (a repository above that ignores this directory, e.g. a home under git)
    return b"".join(name + b"\0" for name in names) if names else None


def negation_warning(local_dir: str) -> str | None:
    """One line naming the first `!` line of a .gitignore under ``local_dir``, which the rsync filter reads
    as an ordinary pattern: what git would send again stays here. None when there is none."""
    found: list[tuple[str, int, str]] = []
    for parent, dirs, files in os.walk(local_dir):
        dirs[:] = sorted(d for d in dirs if d not in (".git", SHIPPED_DIR))
        if ".gitignore" in files:
            path = os.path.join(parent, ".gitignore")
            with contextlib.suppress(OSError), open(path, encoding="utf-8", errors="replace") as f:
                found += [(path, n, line.rstrip("\n")) for n, line in enumerate(f, 1) if line.startswith("!")]
    if not found:
        return None
    path, n, line = found[0]
    more = f" (and {plural(len(found) - 1, 'other')})" if len(found) > 1 else ""
    return (f"slurmlaunch: warning: {os.path.relpath(path, local_dir)}:{n}: {line!r}{more}: rsync's .gitignore "
            f"filter reads no '!' line, so what it re-includes is not sent (git's meaning needs git on PATH and a "
            f"git work tree here)")


def _rsync(conn: Connection, argv: list[str], timeout: float, files: bytes | None = None) -> str:
    if not conn.shell_checked:  # rsync's own protocol error is all a chatty dotfile would otherwise leave
        conn.run("true", timeout=60, what="true")
    try:
        proc = subprocess.run(argv, input=files if files is not None else b"", capture_output=True,
                              timeout=timeout)
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
    """Send what changed in ``local_dir`` (the files git lists, in a git work tree; else what rsync's
    .gitignore filter leaves, with a warning line on stderr for a `!` line it cannot read). Counted first (a
    dry run, same argv): more than ``limit`` bytes to send is refused with one line, before anything is sent."""
    files = git_files(local_dir)
    rule = GIT_RULE if files is not None else FILTER_RULE
    if files is None:
        warning = negation_warning(local_dir)
        if warning:
            sys.stderr.write(warning + "\n")
    listed = files is not None
    counted = _rsync(conn, sync_argv(conn, local_dir, remote_dir, excludes, dry_run=True, listed=listed),
                     COMMAND_TIMEOUT_S, files)
    to_send = _stat(counted, "Total transferred file size")
    if to_send > limit:
        raise SpecError(
            f"sync of {local_dir!r} to {conn.dest.path_target}:{remote_dir} would send "
            f"{plural(_stat(counted, 'Number of regular files transferred'), 'file')}, {_human(to_send)}, "
            f"more than the limit {_human(limit)}; leave out what is not code (.gitignore or --remote-exclude), raise "
            f"--sync-limit, or --no-sync")
    if not _stat(counted, "Number of regular files transferred"):
        return SyncSummary(_regular_files(counted), 0, 0, _stat(counted, "Total bytes sent"), rule)
    done = _rsync(conn, sync_argv(conn, local_dir, remote_dir, excludes, listed=listed), timeout, files)
    return SyncSummary(_regular_files(done), _stat(done, "Number of regular files transferred"),
                       _stat(done, "Total transferred file size"), _stat(done, "Total bytes sent"), rule)
