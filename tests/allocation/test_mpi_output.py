"""mpiexec --tag-output's pieces joined back into whole lines (allocation/mpi_output.py). The input cases are
what Open MPI 4.1.4 wrote under PBS for `print("hello from", rank, ...)` under `python -u` (one write() per
piece), copied from a real job's output file."""

from __future__ import annotations

import pytest

from slurmlaunch.allocation.mpi_output import PENDING_MAX, TagJoiner, joined

SEEN = (b"[1,1]<stdout>:hello from[1,1]<stdout>: 1 argv=[]\n"
        b"[1,2]<stdout>:hello from[1,3]<stdout>:hello from[1,3]<stdout>: [1,3]<stdout>:3[1,3]<stdout>: "
        b"[1,3]<stdout>:argv=[][1,3]<stdout>:\n"
        b"[1,2]<stdout>: [1,2]<stdout>:2[1,2]<stdout>: [1,2]<stdout>:argv=[][1,2]<stdout>:\n"
        b"--------------------------------------------------------------------------\n"
        b"  Process name: [[782,1],3]\n")


def _join(data: bytes) -> bytes:
    return b"".join(joined(data.splitlines(keepends=True)))


@pytest.mark.parametrize(("given", "expected"), [
    (SEEN, b"[1,1]<stdout>:hello from 1 argv=[]\n[1,3]<stdout>:hello from 3 argv=[]\n"
           b"[1,2]<stdout>:hello from 2 argv=[]\n"
           b"--------------------------------------------------------------------------\n"
           b"  Process name: [[782,1],3]\n"),
    (b"[1,0]<stdout>:a\n[1,0]<stdout>:\n[1,0]<stderr>:b", b"[1,0]<stdout>:a\n[1,0]<stdout>:\n[1,0]<stderr>:b\n"),
    (b"[1,0]<stdout>:a[1,1]<stdout>:b\n", b"[1,1]<stdout>:b\n[1,0]<stdout>:a\n"),  # rank 0's line, unended
    (b"plain line\n", b"plain line\n"),
    # mpiexec's own harmless warning goes; another errno of the same call is a real fault and stays
    (b"plm:rsh: Warning: setpgid(4242,4242) failed in parent with errno=Permission denied(13)\n", b""),
    (b"[node1:0123] plm:rsh: Warning: setpgid(4242,4242) failed in parent with errno=Permission denied(13)\n", b""),
    (b"plm:rsh: Warning: setpgid(4242,4242) failed in parent with errno=No such process(3)\n",
     b"plm:rsh: Warning: setpgid(4242,4242) failed in parent with errno=No such process(3)\n"),
    (b"[1,0]<stderr>:plm:rsh: Warning: setpgid(1,1) failed in parent with errno=Permission denied(13)\n",
     b"[1,0]<stderr>:plm:rsh: Warning: setpgid(1,1) failed in parent with errno=Permission denied(13)\n"),
])
def test_pieces_become_lines(given: bytes, expected: bytes) -> None:
    assert _join(given) == expected


def test_a_line_without_end_is_passed_on_in_bounded_pieces() -> None:
    joiner = TagJoiner()
    out = joiner.feed(b"[1,0]<stdout>:" + b"x" * PENDING_MAX) + joiner.feed(b"[1,0]<stdout>:y\n")
    assert out == [b"[1,0]<stdout>:" + b"x" * PENDING_MAX + b"\n", b"[1,0]<stdout>:y\n"]
    assert joiner.close() == []
