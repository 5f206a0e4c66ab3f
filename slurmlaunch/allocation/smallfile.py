"""The one reader of the small files slurmlaunch and its ranks leave (records, exit codes, reasons, failure
lines): bounded, and never fooled by what else could stand at the path.

Standard library only (``os`` and ``stat``, which every interpreter has loaded before ``site``), and
imported lazily by what reads, so that the launcher's path gains nothing.
"""

from __future__ import annotations

import os
import stat


def read_small(path: str, limit: int, *, whole: bool = False) -> bytes:
    """At most ``limit`` bytes of the regular file at ``path``. The file is opened without following a link
    in its last component (O_NOFOLLOW) and without waiting for a writer (O_NONBLOCK); OSError for a link,
    anything but a regular file (a FIFO would block, /dev/zero never ends), and with ``whole`` for a file
    larger than ``limit`` (one that is not ours: a record is a few KB)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{path!r} is not a regular file")
        if whole and st.st_size > limit:
            raise OSError(f"{path!r} is {st.st_size} bytes, more than the {limit} such a file ever is")
        return os.read(fd, limit)
    finally:
        os.close(fd)
