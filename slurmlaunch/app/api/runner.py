"""The login node's half of the API with ``remote=`` (app/remote/api.py is the laptop's): run there as
``python -m slurmlaunch.app.api.runner ACTION X.Y`` (X.Y: the laptop's Python) with a pickle on stdin, by the
slurmlaunch that was shipped with the call; it prints one line, base64 of a pickled dict (an ``error`` key: a
SlurmLaunchError).

ACTION submit, map_array, batch: submit with this same API on the login node's Slurm or PBS (login_scheduler),
and answer with the jobs (each
pickled whole), the spec and submitit's batch script, for the laptop's job index. state, logs, cancel: a
question about one pickled job. wait: about several (the laptop's handles of one destination that have no
answer yet, the one its caller waits for first): one bounded wait for all of them, so that a loop over a
map_array's handles costs one ssh command per poll, not one per job (_wait_several).
"""

from __future__ import annotations

import base64
import pickle
import sys
import time
from collections.abc import Sequence
from typing import Any

from ...core.errors import SlurmLaunchError, SpecError
from .functions import batch, map_array, submit, submit_script
from .job import Job, link_logs


def _reply(**out: Any) -> None:
    try:
        blob = pickle.dumps(out)
    except Exception as e:  # a value that cannot travel: say which, as the API says it locally
        blob = pickle.dumps({"error": SlurmLaunchError(f"the result could not be pickled to go back over ssh: "
                                                       f"{type(e).__name__}: {e}")})
    sys.stdout.write(base64.b64encode(blob).decode() + "\n")


def login_scheduler(requested: str) -> str:
    """The scheduler the laptop's call goes to here: as named (slurm, pbs); auto: PBS where qsub is on PATH
    and sbatch is not (as `submit --remote` chooses), else Slurm. Never the local scheduler: a login node
    does not run the laptop's job itself."""
    from ...schedulers.choice import login_choice
    from ...schedulers.registry import NAMES, scheduler

    return login_choice(requested, [e for e in map(scheduler, NAMES) if e.queued])


def _submitted(jobs: Sequence[Job], scheduler: str) -> None:
    for job in jobs:
        link_logs(job.spec, job._job)
    script_path = str(getattr(jobs[0]._job.paths, "submission_file", ""))
    try:
        with open(script_path, encoding="utf-8", errors="replace") as f:
            script = f.read()
    except OSError:
        script = ""
    _reply(jobs=[{"job_id": j.job_id, "job": pickle.dumps(j), "world": j.spec.world_size} for j in jobs],
           spec=jobs[0].spec, script=script, script_path=script_path, scheduler=scheduler)


def _submit(action: str, data: dict[str, Any]) -> None:
    scheduler = login_scheduler(str(data.pop("scheduler", "slurm")))  # a laptop before PBS over ssh: Slurm
    if action == "submit":
        fn = data.pop("fn")
        job = submit(fn, *data.pop("args"), scheduler=scheduler, **data) if fn is not None else \
            submit_script(data.pop("path"), data.pop("args"), scheduler=scheduler, **data)
        _submitted([job], scheduler)  # type: ignore[list-item]  # without remote=: Jobs
    elif action == "map_array":
        _submitted(map_array(data.pop("fn"), *data.pop("iterables"), scheduler=scheduler, **data),  # type: ignore[arg-type]
                   scheduler)
    else:
        calls = data.pop("calls")
        with batch(scheduler=scheduler, **data) as b:
            for fn, args, kwargs in calls:
                b.submit(fn, *args, **kwargs)
        _submitted(b.jobs, scheduler)  # type: ignore[arg-type]


# After the job waited for ended with its values, the others of the same wait are given this much longer to
# end too (a sweep's jobs end together: one answer for all of them, not one more ssh command each); never past
# the wait's limit, and not at all after a failure (it goes back at once).
GATHER_S = 1.0


def _outcome(job: Job, state: str | None, rank0: bool) -> tuple[bytes, bool]:
    """A job's answer, pickled on its own (a value that cannot travel spoils its own answer, not the others'),
    and whether it is a failure."""
    try:
        out: dict[str, Any] = {"values": job._values(state, rank0=rank0)}
    except SlurmLaunchError as e:  # RankFailed, a job cancelled or stopped: the laptop raises it
        out = {"error": e}
    try:
        return pickle.dumps(out), "error" in out
    except Exception as e:
        return pickle.dumps({"error": SlurmLaunchError(f"the result of job {job.job_id} could not be pickled to go "
                                                       f"back over ssh: {type(e).__name__}: {e}")}), True


def _ended(job: Job, full: bool, gathering: bool) -> tuple[bool, str | None]:
    """Whether a job has ended, and its state, without waiting. ``full`` (the job waited for): as its own wait
    asks (its squeue while sacct has no record of it). The others under Slurm: only what costs no query of
    their own (every rank's file, the one squeue that confirms all such jobs together, the sacct that the
    full question refreshes for every job: job.py's watcher); a failure without accounting is seen when the
    laptop waits for that job itself. Under PBS (no early end, a qstat per job): once the job waited for has
    ended (``gathering``), at most one qstat each per GATHER_S."""
    if full or (gathering and not job._watched):
        return job._wait(0)
    if not job._watched:
        return False, None
    early = job._early_end()
    if early is not None:
        return True, early
    from .job import _watcher

    watcher = _watcher()
    if watcher.is_done(job.job_id, mode="cache"):
        return True, str(watcher.get_state(job.job_id, mode="cache"))
    return False, None


def _wait_several(jobs: Sequence[Job], limit: float, rank0: bool) -> dict[int, bytes]:
    """One bounded wait for ``jobs`` (the first: the one the laptop's caller waits for): the answers of those
    that ended, by index. It ends when the first has ended (a failure at once, values after GATHER_S for the
    others at most, or sooner when they all ended), or after ``limit`` seconds. The first is asked as its own
    wait asks (job.py: files, sacct every 2 s for all, squeue to confirm); the others add no query per job."""
    from .job import _FILES_BACKOFF_S, _FILES_FIRST_S, _FILES_LAST_S

    start = time.monotonic()
    deadline, gather_until = start + limit, None
    answers: dict[int, bytes] = {}
    while True:
        for index, job in enumerate(jobs):
            if index in answers:
                continue
            ended, state = _ended(job, index == 0, gather_until is not None)
            if not ended:
                continue
            answers[index], failed = _outcome(job, state, rank0)
            if index == 0:
                if failed:
                    return answers
                gather_until = time.monotonic() + GATHER_S
        now = time.monotonic()
        if len(answers) == len(jobs) or now >= deadline or (gather_until is not None and now >= gather_until):
            return answers
        until = deadline if gather_until is None else min(deadline, gather_until)
        time.sleep(min(until - now, _FILES_LAST_S, _FILES_FIRST_S + (now - start) * _FILES_LAST_S / _FILES_BACKOFF_S))


def _question(action: str, data: dict[str, Any]) -> None:
    if action == "wait":  # the same wait as here (job.py), for several jobs, bounded: the laptop asks again
        jobs: list[Job] = [pickle.loads(blob) for blob in data["jobs"]]
        _reply(answers=_wait_several(jobs, float(data["limit"]), bool(data["rank0"])))
        return
    job: Job = pickle.loads(data["job"])
    if action == "state":
        _reply(state=job.state, done=job.done())
    elif action == "logs":
        _reply(text=job.logs(data["rank"]))
    elif action == "cancel":
        job.cancel()
        _reply(done=True)


def version_refusal(laptop: str) -> SpecError | None:
    """The call is pickled by cloudpickle on the laptop: code objects do not carry across Python minor
    versions (unpickling one can crash the interpreter), so the versions must match; checked before any
    unpickling."""
    here = "{}.{}".format(*sys.version_info[:2])
    if laptop in ("", here):
        return None
    return SpecError(f"remote_python {sys.executable} is Python {here} and the laptop's is Python {laptop}: the "
                     f"call travels pickled and needs the same Python minor version on both sides (name a Python "
                     f"{laptop} there with remote_python=, or run the laptop's code under Python {here})")


def main(argv: Sequence[str]) -> int:
    refused = version_refusal(argv[1] if len(argv) > 1 else "")
    if refused is not None:
        sys.stdin.buffer.read()  # unread: the laptop's ssh is still writing it
        _reply(error=refused)
        return 0
    action, data = argv[0], pickle.loads(sys.stdin.buffer.read())
    try:
        if action in ("submit", "map_array", "batch"):
            _submit(action, data)
        else:
            _question(action, data)
    except SlurmLaunchError as e:
        _reply(error=e)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
