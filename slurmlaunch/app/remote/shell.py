"""What ssh and the remote login shell say: the resolved client configuration (``ssh -G``), one line for
what ssh could not do, and the first command's check of the login shell."""

from __future__ import annotations

import re
import subprocess

from ...core.errors import SchedulerError
from .dest import Destination

# Put in front of a connection's first command: a POSIX shell prints exactly this line first; a chatty
# dotfile (~/.bashrc, ~/.zshenv echoing for non-interactive shells) prints before it; csh, tcsh and fish
# cannot run the assignment and never print it.
_MARK = b"slurmlaunch-sh:posix\n"
PROBE = "slurmlaunch_sh=posix; echo \"slurmlaunch-sh:$slurmlaunch_sh\"\n"


class RemoteError(SchedulerError):
    """ssh or rsync failed, the login shell cannot be used, or a remote command failed (its message names
    the command and its output)."""


class Unreachable(RemoteError):
    """ssh itself failed (exit 255: no connection, a refused key, an unknown host key, a cut connection) or
    no answer came in time: the only failure a follower retries."""


def ssh_config(ssh: str, target: str) -> dict[str, str]:
    """The client's resolved configuration for ``target`` (``ssh -G``: nothing is connected), keys in lower
    case; empty when this ssh cannot say."""
    try:
        shown = subprocess.run([ssh, "-G", "--", target], stdin=subprocess.DEVNULL, capture_output=True,
                               timeout=15, text=True, errors="replace")
    except (OSError, subprocess.TimeoutExpired):
        return {}
    if shown.returncode != 0:
        return {}
    pairs = (line.partition(" ")[::2] for line in shown.stdout.splitlines())
    return {key.lower(): value.strip() for key, value in pairs if key}


def user_master_path(config: dict[str, str]) -> str | None:
    """The ControlPath of the user's own master in a resolved ssh configuration (``ssh -G``), or None. A
    ControlPath with ControlMaster no (`ssh -G` says false) makes no master: every ssh call would log in
    anew (18 logins for one submit --wait, a second factor asked as often), so that is none of theirs."""
    path = config.get("controlpath", "none")
    makes_master = config.get("controlmaster", "false").lower() not in ("false", "no")
    return None if path.lower() == "none" or not path or not makes_master else path


def user_control_path(ssh: str, target: str) -> str | None:
    """The ControlPath of the user's own master for ``target`` (:func:`user_master_path`), or None."""
    return user_master_path(ssh_config(ssh, target))


def _known_hosts_advice(dest: Destination, config: dict[str, str]) -> str:
    """The ssh-keygen -R line for this host's recorded key: its HostKeyAlias, or host[:port], in the first
    UserKnownHostsFile."""
    host = config.get("hostname", dest.host)
    port = config.get("port", "22")
    name = config.get("hostkeyalias") or (host if port == "22" else f"[{host}]:{port}")
    files = config.get("userknownhostsfile", "").split()
    where = f" -f {files[0]}" if files and files[0] not in ("~/.ssh/known_hosts",) else ""
    return f"ssh-keygen -R '{name}'{where}"


# ssh's lines that say why, where there are several (through a ProxyJump host, the jump's own refusal comes
# first and "kex_exchange_identification: Connection closed" last).
_TELLING = ("Could not resolve hostname", "Permission denied", "connect to host", "Connection refused",
            "Connection timed out", "No route to host", "Network is unreachable", "Host key verification failed")


def _telling_line(text: str) -> str:
    """The line of ssh's stderr that says most: the first naming a cause, else the last."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return next((line for line in lines if any(words in line for words in _TELLING)),
                lines[-1] if lines else "(no output)")


def ssh_failure(dest: Destination, config: dict[str, str], stderr: str, exited_255: bool = True) -> str | None:
    """One line naming what ssh itself could not do, from its stderr; without ``exited_255`` (rsync's
    stderr), None when nothing in it is ssh's."""
    text = stderr.strip()
    last = _telling_line(text)
    name = str(dest)
    if "Could not resolve hostname" in text:
        return (f"--remote {name}: host {dest.host!r} cannot be resolved ({last}); check the name, or its Host "
                f"entry in ~/.ssh/config")
    if "REMOTE HOST IDENTIFICATION HAS CHANGED" in text:
        return (f"--remote {name}: the host key of {dest.host} has CHANGED since it was recorded in known_hosts "
                f"(someone may be in between, or the host was reinstalled); if the change is expected, remove "
                f"the old key with `{_known_hosts_advice(dest, config)}` and connect once with plain ssh. "
                f"slurmlaunch never turns host key checking off")
    if "Host key verification failed" in text or re.search(r"No \S+ host key is known", text):
        return (f"--remote {name}: the host key of {dest.host} is not known (not in known_hosts); connect once "
                f"with plain `ssh {dest.target}` to check and record it. slurmlaunch never turns host key "
                f"checking off")
    if "Permission denied" in text:
        return (f"--remote {name}: the server refused the login ({last}); add your key to ssh-agent or name "
                f"it with IdentityFile in ~/.ssh/config (slurmlaunch asks for no password)")
    if "ControlPath too long" in text:
        return (f"--remote {name}: {last}; give the destination a shorter ControlPath in ~/.ssh/config "
                f"(e.g. ~/.ssh/cm-%C)")
    jump = config.get("proxyjump", "none")
    via = "" if jump.lower() == "none" else (f"; it goes through the ProxyJump host {jump}: check that "
                                            f"`ssh {jump.split(',')[0]}` works")
    for words in ("Connection refused", "Connection timed out", "No route to host", "Network is unreachable",
                  "Connection closed", "Connection reset", "Broken pipe", "connect to host",
                  "Control socket connect", "mux_client", "kex_exchange_identification"):
        if words in text:
            return f"--remote {name}: cannot reach {dest.host} over ssh ({last}){via}"
    return f"--remote {name}: ssh failed (exit 255: {last}){via}" if exited_255 else None


def check_shell(dest: Destination, out: bytes, stderr: str) -> bytes:
    """A connection's first command's stdout without PROBE's line; RemoteError in one line when the login
    shell is not POSIX or its dotfiles print on stdout."""
    at = out.find(_MARK)
    if at == -1:
        said = (stderr.strip().splitlines() or ["(no output)"])[0]
        raise RemoteError(f"--remote {dest}: the login shell on {dest.host} does not read POSIX sh (it said: "
                          f"{said[:200]}); csh, tcsh and fish cannot run slurmlaunch's commands: make sh, bash, "
                          f"zsh or ksh the login shell there (chsh -s /bin/bash)")
    if at:
        noise = out[:at].decode(errors="replace").strip().splitlines() or [""]
        raise RemoteError(f"--remote {dest}: the login shell on {dest.host} prints {noise[0][:80]!r} on stdout "
                          f"before every command: a dotfile such as ~/.bashrc, ~/.zshenv or ~/.cshrc prints for "
                          f"non-interactive shells, which breaks rsync and the job commands' output; make it "
                          f"print only in interactive shells (e.g. `[ -z \"$PS1\" ] && return` first in ~/.bashrc, "
                          f"or move it to ~/.zshrc), or send it to stderr (>&2)")
    return out[len(_MARK):]
