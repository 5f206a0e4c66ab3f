"""An ssh destination (``[user@]host[:dir]``) and the command lines its login shell is given.

Strings are data: every argument of a remote command is quoted with shlex.quote, so the remote shell sees
each as one word, byte for byte; only --remote-setup lines are shell code on purpose.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from ...core.errors import SpecError

DEFAULT_PARENT = "slurmlaunch-projects"  # a project without a :DIR goes to ~/slurmlaunch-projects/<its name>
SETUP_STEP = "slurmlaunch_setup_step"  # the remote shell's variable: which --remote-setup line runs
SETUP_FAILED = "slurmlaunch-setup-failed:"  # on stderr, with that line's number, when one fails

_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.$-]*")
_HOST = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.%+-]*")  # a name, an address or a ~/.ssh/config alias
_IPV6 = re.compile(r"[0-9A-Fa-f:.]+(%[A-Za-z0-9_.-]+)?")


@dataclass(frozen=True)
class Destination:
    """``[user@]host[:dir]``: ``dir`` relative to the remote home, absolute, or None (the default)."""

    host: str
    user: str | None = None
    directory: str | None = None

    @property
    def target(self) -> str:
        """What ssh is given as the host (an IPv6 address bare: ssh takes it so)."""
        return f"{self.user}@{self.host}" if self.user else self.host

    @property
    def path_target(self) -> str:
        """The host in rsync's and scp's ``HOST:PATH`` form, before the ``:``: an IPv6 address in brackets
        (``user@[::1]``), since rsync reads a bare ``user@::1:/path`` as its daemon's ``host::module``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.user}@{host}" if self.user else host

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        where = f":{self.directory}" if self.directory is not None else ""
        return (f"{self.user}@" if self.user else "") + host + where


def parse_destination(text: str) -> Destination:
    """Parse --remote's ``[user@]host[:dir]`` (an IPv6 address in brackets); SpecError, naming the value, for
    anything ssh could read as an option or the shell as more than a name."""
    def bad(why: str) -> SpecError:
        return SpecError(f"--remote {text!r}: {why} (expected [user@]host[:dir], e.g. login or "
                         f"me@cluster.example.org:work/proj)")

    if not text:
        raise bad("empty")
    if any(not c.isprintable() for c in text):
        raise bad("contains a control character")
    user: str | None = None
    rest = text
    at = text.find("@")
    colon = text.find(":")
    if at != -1 and (colon == -1 or at < colon) and not text.startswith("["):
        user, rest = text[:at], text[at + 1:]
        if not _USER.fullmatch(user):
            raise bad(f"user {user!r} is not a user name")
    if rest.startswith("["):
        end = rest.find("]")
        if end == -1:
            raise bad("an opening [ without its ]")
        host, after = rest[1:end], rest[end + 1:]
        if not host or not _IPV6.fullmatch(host):
            raise bad(f"{host!r} in brackets is not an IPv6 address")
        if after and not after.startswith(":"):
            raise bad(f"{after!r} after the address (a directory follows a ':')")
        directory = after[1:] if after else None
    else:
        host, sep, directory_part = rest.partition(":")
        directory = directory_part if sep else None
        if not host:
            raise bad("no host")
        if not _HOST.fullmatch(host):
            raise bad(f"host {host!r} is not a host name, address or ~/.ssh/config alias"
                      + (" (it would read as an ssh option)" if host.startswith("-") else ""))
    if directory is not None:
        if directory.startswith("~/"):
            directory = directory[2:]  # relative to the home is what a relative directory means here
        if directory in ("", "~"):
            directory = None
        elif "\n" in directory or "\0" in directory:
            raise bad("the directory contains a newline")
    return Destination(host, user, directory)


SETUP_WATCH = "slurmlaunch_setup_watch"  # the remote shell's variable: the pid of the setup lines' bound
SETUP_KILL_AFTER_S = 5  # after the setup bound's TERM, the KILL of a line that ignores it


def shell_command(script: str, setup: Sequence[str] = (), bound: float | None = None) -> str:
    """``script`` (a line of ours, its values already quoted) after the --remote-setup lines: each must
    succeed (set -e); when one fails, an EXIT trap names it on stderr (SETUP_FAILED and its number, which
    setup_failure reads), so the error can say which line it was rather than the end of this script.
    ``bound``: the setup lines are stopped after that many seconds, as ``script``'s own bound (coreutils
    timeout) stops it: sshd stops nothing it started without a terminal, so a hung line (a module system
    waiting on a file system) would run on after the laptop gave up. They are shell code run by this very
    shell (a `module` function, an `export`), so no `timeout` can run them: a watcher in the background
    (where coreutils' timeout and tail are) TERMs the shell's process group, which sshd made, then KILLs it,
    unless the shell ends first; it is stopped as soon as the setup lines are done."""
    if not setup:
        return script
    steps = "".join(f"{SETUP_STEP}={i}\n{line}\n" for i, line in enumerate(setup, 1))
    # A line that ends the shell itself with status 0 (`exit`, `exit 0`) has the command not run at all: the trap
    # makes that a failure (125), else the caller would take the empty output for the command's.
    trap = (f"trap '{SETUP_STEP}_rc=$?; [ \"${SETUP_STEP}\" = 0 ] || {{ echo \"{SETUP_FAILED}${SETUP_STEP}\" >&2; "
            f"[ \"${SETUP_STEP}_rc\" != 0 ] || exit 125; }}' EXIT")
    watch = disarm = ""
    if bound is not None:
        limit = max(1, math.ceil(bound))
        # The watcher ignores the TERM it sends its own group; `tail --pid` ends when this shell does. It is
        # started from a command substitution, so that it is no job of this shell's: bash would report its
        # KILL below on stderr ("Killed ..."), which is the command's output.
        watch = (f"{SETUP_WATCH}=\nif command -v timeout >/dev/null 2>&1; then {SETUP_WATCH}=$( ( trap '' TERM; "
                 f"timeout -s KILL {limit} tail --pid=$$ -f /dev/null || {{ kill -TERM -$$; "
                 f"sleep {SETUP_KILL_AFTER_S}; kill -KILL -$$; }} ) </dev/null >/dev/null 2>&1 & echo $! ); fi\n")
        disarm = f'[ -z "${SETUP_WATCH}" ] || kill -KILL "${SETUP_WATCH}" 2>/dev/null\n'
    # What the setup lines print on stdout (a module system's "Loading ...", an echo) goes to stderr: stdout is
    # the command's answer (a job id, JSON), which a line before it would garble. fd 9 keeps stdout meanwhile.
    return (f"{trap}\n{watch}set -e\nexec 9>&1 1>&2\n{steps}exec 1>&9 9>&-\nset +e\n{disarm}{SETUP_STEP}=0\n"
            f"trap - EXIT\n{script}")


def remote_command(argv: Sequence[str], setup: Sequence[str] = ()) -> str:
    """The command line the remote login shell runs: the --remote-setup lines (shell code, each must
    succeed), then ``argv`` with every word quoted, so that no byte of it is read by the shell."""
    return shell_command(shlex.join(argv), setup)


def setup_failure(setup: Sequence[str], stderr: str) -> tuple[str, str] | None:
    """(``--remote-setup 'LINE'`` (its number too when there are several), the rest of stderr) when a setup
    line failed, from shell_command's marker; None otherwise."""
    found = re.search(rf"^{re.escape(SETUP_FAILED)}(\d+)$", stderr, re.MULTILINE)
    if not found or not 0 < int(found.group(1)) <= len(setup):
        return None
    n = int(found.group(1))
    rest = (stderr[:found.start()] + stderr[found.end():]).strip()
    which = f" (line {n} of {len(setup)})" if len(setup) > 1 else ""
    return f"--remote-setup {shlex.quote(setup[n - 1])}{which}", rest


def without_marker(stderr: str) -> str:
    """stderr without shell_command's marker line."""
    return re.sub(rf"^{re.escape(SETUP_FAILED)}\d+\n?", "", stderr, flags=re.MULTILINE)
