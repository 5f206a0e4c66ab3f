"""Why a job whose output directory failed it ended as it did, said from the submitting side.

Two exit codes mean the job's own words could not be kept: the batch script's pre-flight write test refused
(WRITE_FAILED, 74: nothing the script said could be written either), and Slurm's 181 (sacct ExitCode 0:53),
a batch step Slurm could not start, most often because slurmd could not open the batch log (the cause then
is only in slurmd's log on the node: "Could not open stdout file ...: Read-only file system"). For both,
`--wait` adds one line with what a write test of the directory says from here, on the shared
file system the logs live on ("No space left on device", "Read-only file system"). A job that failed
otherwise gets the line only when that test fails: its file system filled up during the run.
"""

from __future__ import annotations

import contextlib
import os
import tempfile

from ..core.jobfiles import WRITE_FAILED

# 128 + 53: Slurm ends a batch step it could not start (its output could not be opened, the fork failed) as
# if killed by "signal" 53, which sacct shows as ExitCode 0:53 (seen on Slurm 22.05).
BATCH_NOT_STARTED = 128 + 53
PROBE_BYTES = 4096  # more than a page: a file system with inodes but no blocks left refuses it


def write_test(log_dir: str) -> str | None:
    """What the system says to a new file of PROBE_BYTES in ``log_dir`` (removed at once), or None when it
    takes the write."""
    try:
        fd, path = tempfile.mkstemp(prefix=".slurmlaunch-probe.", dir=log_dir)
    except OSError as e:
        return e.strerror or str(e)
    try:
        os.write(fd, b"\0" * PROBE_BYTES)
        os.fsync(fd)
    except OSError as e:
        return e.strerror or str(e)
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(path)
    return None


def explain(code: int, log_dir: str) -> str | None:
    """One line when the output directory failed the job: for the codes that say so (74, 181), with what a
    write test there says now; for any other failure, only when that write test fails (the file system filled
    up during the run: the ranks' output, srun's words and the failure line were cut short or lost, and a
    rank whose output could not be written may itself have died of it). None otherwise."""
    if code == 0:
        return None
    if code not in (WRITE_FAILED, BATCH_NOT_STARTED):
        if not os.path.isdir(log_dir):  # not here (another host's job): nothing to test
            return None
        error = write_test(log_dir)
        return None if error is None else (
            f"the output directory {log_dir} takes no write now (a write test there from this host says: "
            f"{error}): the job's logs and its failure line may be cut short or missing")
    error = write_test(log_dir)
    now = (f"a write test there from this host says: {error}" if error else
           "it takes a write from this host now (the fault was on the nodes only, or has passed)")
    if code == WRITE_FAILED:
        return (f"exit code {code}: the batch script could not write in the output directory {log_dir}, so no "
                f"rank was started; {now}")
    return (f"exit code {code} (sacct: 0:53): Slurm could not start the batch script, most often because it could "
            f"not open the batch log in {log_dir} (slurmd's log on the node says why); {now}")
