"""`slurmlaunch timeline JOB`: where a job's start-up went, per rank, from the moments its batch step, launchers,
runners and script recorded in its output directory (allocation/timeline.py writes them, core/timeline.py
reads and draws them); ``Job.timeline()``'s data. The same for local, Slurm and PBS jobs: the directory is
the job record's."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace

from ...allocation.timeline import read
from ...core.errors import JobStateError, SpecError
from ...core.jobfiles import JobFiles
from ...core.timeline import Timeline, build, chart, svg
from ..records import JobRecord
from .commands import find, recorded_spec


def files_timeline(files: JobFiles, world_size: int | None) -> Timeline:
    """The timeline of the job whose files ``files`` names; JobStateError when no moment was recorded."""
    texts = read(files.timeline)
    if not texts:
        raise JobStateError(f"job {files.job}: no start-up moments in {files.timeline} (the job has not started, "
                            f"or was submitted by a slurmlaunch without `timeline`)")
    return build(files.job, texts, world_size)


def job_timeline(record: JobRecord) -> tuple[Timeline, JobFiles]:
    """The timeline of the job ``record`` names (an array: one element), and its files."""
    spec = recorded_spec(record)
    if spec.is_array and record.element is None:
        raise SpecError(f"timeline: job {record.tag} is an array: name one element, e.g. {record.tag}_"
                        f"{spec.array_indices[0]}")
    if record.remote:
        raise JobStateError(f"timeline: job {record.tag} ran on {record.remote}: its moments are in "
                            f"{JobFiles(record.log_dir, record.tag).timeline} there (run `slurmlaunch timeline` on "
                            f"the login node)")
    files = JobFiles(record.log_dir, record.tag)
    return files_timeline(files, spec.world_size), files


def write_svg(timeline: Timeline, path: str) -> str | None:
    """The picture written to ``path`` (replacing what was there, never through a link); why not, or None."""
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(svg(timeline))
        os.replace(tmp, path)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return e.strerror or str(e)
    return None


def cmd_timeline(job_id: str, as_json: bool, svg_path: str | None) -> int:
    timeline, files = job_timeline(find(job_id))
    timeline = replace(timeline, job_id=job_id)  # named as the user named it (PBS: 12.server, files: 12)
    path = svg_path or files.timeline_svg
    why = write_svg(timeline, path)
    if as_json:
        print(json.dumps({**timeline.data(), "svg": None if why else path}))
    else:
        sys.stdout.write(chart(timeline))
    if why:
        sys.stderr.write(f"slurmlaunch: could not write the picture to {path}: {why}\n")
        return 1
    if not as_json:
        sys.stdout.write(f"picture: {path}\n")
    return 0
