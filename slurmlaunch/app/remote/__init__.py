"""Submitting from a laptop, in one import: the modules it is made of, by meaning.

- remote_dest: ``[user@]host[:dir]`` and the command lines the login shell is given (strings are data);
- remote_shell: what ssh and the login shell say (``ssh -G``, one line per ssh failure, the shell check);
- remote_ssh: the one multiplexed connection (ours in a short private directory, or the user's own);
- remote_sync: the project's rsync, counted first, and the remote directory;
- remote_ship: the package that travels with the job and the interpreter there that runs it.

Standard library only.
"""

from __future__ import annotations

from .dest import DEFAULT_PARENT, Destination, parse_destination, remote_command, shell_command
from .shell import RemoteError, Unreachable, user_control_path
from .ship import (
    MIN_PYTHON,
    check_python,
    package_dir,
    package_tag,
    pythonpath_setup,
    ship_argv,
    ship_package,
    shipped_path,
)
from .ssh import (
    COMMAND_TIMEOUT_S,
    CONNECT_TIMEOUT_S,
    CONTROL_PERSIST_S,
    SOCKET_PATH_MAX,
    Connection,
    private_control_dir,
)
from .sync import (
    DEFAULT_SYNC_LIMIT,
    SHIPPED_DIR,
    SyncSummary,
    parse_size,
    plural,
    resolve_directory,
    sync,
    sync_argv,
)

__all__ = [
    "COMMAND_TIMEOUT_S", "CONNECT_TIMEOUT_S", "CONTROL_PERSIST_S", "DEFAULT_PARENT", "DEFAULT_SYNC_LIMIT",
    "MIN_PYTHON", "SHIPPED_DIR", "SOCKET_PATH_MAX", "Connection", "Destination", "RemoteError", "SyncSummary",
    "Unreachable",
    "check_python", "package_dir", "package_tag", "parse_destination", "parse_size", "plural",
    "private_control_dir", "pythonpath_setup", "remote_command", "resolve_directory", "shell_command",
    "ship_argv", "ship_package", "shipped_path", "sync", "sync_argv", "user_control_path",
]
