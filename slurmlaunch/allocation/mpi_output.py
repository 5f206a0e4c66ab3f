"""Open MPI's tagged output (``mpiexec --tag-output``), passed on whole lines at a time.

mpiexec tags what it reads from a rank in one go, and a rank under ``python -u`` writes a print()'s pieces
with one write() each (the text, the separator, the newline), so one line of a rank's arrives as several
tagged pieces, and pieces of other ranks' lines land in between::

    [1,2]<stdout>:hello from[1,3]<stdout>:hello from[1,3]<stdout>: 3[1,3]<stdout>:
    [1,2]<stdout>: 2[1,2]<stdout>:

:class:`TagJoiner` puts each rank's pieces back together and passes on one tagged line per line of the
rank's (``[1,3]<stdout>:hello from 3``, then ``[1,2]<stdout>:hello from 2``). mpiexec's own lines carry no
tag and pass as they are, but for one warning (:data:`HARMLESS`). Standard library only: the batch step
imports it inside the allocation.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

# A rank's tag: [JOBID,RANK]<stdout>: (or <stderr>:, <stddiag>:), as Open MPI 4 writes it.
TAG = re.compile(rb"\[\d+,\d+\]<std(?:out|err|diag)>:")
# Open MPI's rsh launcher (which starts its daemons through pbs_tmrsh under PBS) sets each daemon's process
# group twice, in the child and in mpiexec; when the child has already exec'd, mpiexec's call fails with EACCES
# (13) and it says "plm:rsh: Warning: setpgid(PID,PID) failed in parent with errno=Permission denied(13)"
# (plm_rsh_module.c), though the child's own call did the work: seen on a loaded machine in most PBS jobs.
# Only that errno is dropped; any other is a real fault and is shown.
HARMLESS = re.compile(rb"plm:rsh: Warning: setpgid\((\d+),\1\) failed in parent with errno=[^\n]*\(13\)\s*$")
# A rank's line is passed on in pieces of at most this many bytes (a line without end: a progress bar).
PENDING_MAX = 64 << 10


class TagJoiner:
    """Reads mpiexec's output as it comes (one physical line at a time, :meth:`feed`) and gives the whole
    lines it completes; :meth:`close` gives what is left."""

    def __init__(self) -> None:
        self.pending: dict[bytes, bytes] = {}  # a rank's tag -> its line so far

    def feed(self, line: bytes) -> list[bytes]:
        """The whole lines (each ending in a newline) that the physical line ``line`` completes."""
        ends = line.endswith(b"\n")
        body = line[:-1] if ends else line
        tags = list(TAG.finditer(body))
        if not tags:  # mpiexec's own words, or a rank's line without tags (not under --tag-output)
            return [] if HARMLESS.search(body) or not line else [body + b"\n"]
        out = [body[:tags[0].start()] + b"\n"] if tags[0].start() else []
        for i, m in enumerate(tags):
            end = tags[i + 1].start() if i + 1 < len(tags) else len(body)
            tag = m.group()
            text = self.pending.get(tag, b"") + body[m.end():end]
            if len(text) >= PENDING_MAX:
                out.append(tag + text + b"\n")
                text = b""
            self.pending[tag] = text
        if ends:  # the newline ends the last tagged piece's line
            last = tags[-1].group()
            out.append(last + self.pending.pop(last) + b"\n")
        return out

    def close(self) -> list[bytes]:
        """What the ranks wrote without a last newline, one line each."""
        out = [tag + text + b"\n" for tag, text in self.pending.items() if text]
        self.pending.clear()
        return out


def joined(lines: Iterable[bytes]) -> Iterator[bytes]:
    """The whole lines of mpiexec's physical ``lines``, ending with what was left unended."""
    joiner = TagJoiner()
    for line in lines:
        yield from joiner.feed(line)
    yield from joiner.close()
