"""A job's outcome from the files its ranks left: the values asked for, or RankFailed for the first
failure by time (see the package's docstring)."""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ...core.errors import SlurmLaunchError
from .calls import _exit_record, _Packed
from .failures import _MARK, RankFailed, _signal_name

# A rank that ended without a Python exception (os._exit, a signal) is only seen ending by the controller,
# a busy machine's scheduling delay late, while its peers' errors about the lost connection carry the
# time they happened: within this slack, the death comes first, as it caused them.
_DEATH_SLACK_S = 0.5
# submitit waits this long for a result file that the file system may show late (NFS); here only when
# the job COMPLETED (every rank returned, so every result must come), once per job.
_RESULT_WAIT_S = 15.0
# Job states after which the ranks that left nothing were stopped from outside, not failed on their own.
_STOPPED_STATES = ("CANCELLED", "TIMEOUT", "PREEMPTED", "DEADLINE")


def _tail(task: Any, lines: int = 20) -> str:
    for path in (task.paths.stderr, task.paths.stdout):
        try:
            with open(path, "rb") as f:
                f.seek(max(0, os.fstat(f.fileno()).st_size - 8192))
                text = f.read().decode(errors="replace").rstrip()
        except OSError:
            continue
        if text:
            return f"--- the last lines of {path} ---\n" + "\n".join(text.splitlines()[-lines:])
    return f"(nothing in {task.paths.stderr} nor {task.paths.stdout})"


def _outcome(result_pickle: Path) -> str:
    """"success" or "error", read from the start of a result file without loading the value after it
    (submitit pickles the tuple (outcome, value): the outcome is the first string)."""
    import pickletools

    with open(result_pickle, "rb") as f:
        for _, arg, _ in pickletools.genops(f):
            if isinstance(arg, str):
                return arg
    return "unreadable"


def _step_ends(log_dir: str | None, job_id: str) -> dict[int, tuple[int, int | None, str, str | None]]:
    """The batch step's word on the first rank(s) that failed (allocation/batch_step.py's failure file, read by
    its own reader, under Slurm and PBS alike): rank -> (0, the return code as subprocess has it (-N: signal N),
    the batch step's words, the node); empty where it named none (or no batch step ran: the local scheduler)."""
    if log_dir is None:
        return {}
    from ...allocation.step_rules import read_failure
    from ...core.jobfiles import JobFiles

    found = read_failure(JobFiles(log_dir, job_id).failure)
    if found is None:
        return {}
    ranks, node, code, how = found
    rc = 128 - code if how.startswith("killed by ") and code > 128 else code  # the batch step's 128 + N: signal N
    words = f"{how or f'exit code {code}'} on {node}"
    return {rank: (0, rc, words, node) for rank in ranks}


def _how(code: int | None) -> str:
    return ("ended without a result" if code is None else
            f"was killed by {_signal_name(-code)}" if code < 0 else f"exited with code {code}")


class _Findings:
    """What the ranks' files say, rank by rank (_collect): the values, the failures that carry their time,
    the ends without a time (in srun's order), the ranks stopped from outside."""

    def __init__(self) -> None:
        self.values: dict[int, Any] = {}
        self.timed: list[tuple[float, int, str, int | None]] = []
        self.deaths: list[tuple[int, int, str, int | None]] = []
        self.stopped: list[int] = []
        self.hosts: dict[int, str] = {}  # where a rank ran, where its error or srun's or mpiexec's words say


def _collect(job: Any, world: int, state: str | None, wanted: Iterable[int] | None = None,
             log_dir: str | None = None) -> dict[int, Any]:
    """The values of the ranks in ``wanted`` (all: None) once the job has ended (Job.results); RankFailed
    for the first failure by time, SlurmLaunchError for a job cancelled or stopped from outside. ``state``:
    the job's final state as its scheduler says it;
    ``log_dir``: the job's output directory, where its batch step left the first failure (queued schedulers)."""
    tasks = [job.task(rank) for rank in range(world)]
    results = [Path(t.paths.result_pickle) for t in tasks]
    if state == "COMPLETED":
        _await_results(results)
    steps = _step_ends(log_dir, str(job.job_id))
    keep = set(range(world)) if wanted is None else set(wanted)
    found = _Findings()
    for rank, task in enumerate(tasks):
        _read_rank(found, rank, task, results[rank], None, steps.get(rank), rank in keep, state)
    if state is not None and state.split()[0] in _STOPPED_STATES:
        # The ranks' errors are the consequences (a peer killed first): the job's end is the news.
        unfinished = [r for r in range(world) if r not in found.values and not _success(results[r])]
        how = "was cancelled" if state.startswith("CANCELLED") else "was stopped"
        raise SlurmLaunchError(f"job {job.job_id} {how} ({state}) before rank(s) {_ranks(unfinished)} finished"
                               f" (no rank failed before that)")
    _raise_first(found, steps)
    if found.stopped:
        raise SlurmLaunchError(f"job {job.job_id} was stopped before "
                               f"rank(s) {_ranks(found.stopped)} finished (no rank failed)")
    return found.values


def _await_results(results: Sequence[Path]) -> None:
    """Every rank returned, so every result file will come; a shared file system may show one late."""
    deadline = time.monotonic() + _RESULT_WAIT_S
    while time.monotonic() < deadline and not all(r.exists() or _exit_record(r).exists() for r in results):
        time.sleep(0.5)


def _read_rank(found: _Findings, rank: int, task: Any, result: Path, end: dict[str, Any] | None,
               step: tuple[int, int | None, str, str | None] | None, keep: bool, state: str | None) -> None:
    """What rank ``rank`` left: its value (loaded when ``keep``), or how it failed or was stopped."""
    from submitit.core.utils import pickle_load

    code = int(end["code"]) if end is not None else step[1] if step is not None else None
    if step is not None and step[3]:
        found.hosts[rank] = step[3]
    exit_path = _exit_record(result)
    if result.exists():
        success = _outcome(result) == "success"
        if success and not keep:
            return
        payload = pickle_load(result)[1]
        if success:
            found.values[rank] = payload.value() if isinstance(payload, _Packed) else payload
            return
        mark = re.search(_MARK + r" rank=(\S+) at=([\d.]+)(?: host=(\S+))?\n", payload)
        when = float(mark.group(2)) if mark else float(end["at"]) if end else float("inf")
        if mark and mark.group(3):
            found.hosts[rank] = mark.group(3)
        found.timed.append((when, rank, payload[mark.end():] if mark else payload, code))
    elif exit_path.exists():
        record = json.loads(exit_path.read_text())
        if record["code"] == 0 and not code:
            found.values[rank] = None  # sys.exit(0): ended well, returned nothing
            return
        said = f": {record['message']}" if record["message"] else ""
        text = f"it raised SystemExit with exit code {record['code']}{said}\n{_tail(task)}"
        found.timed.append((float(record["at"]), rank, text, int(record["code"])))
    elif end is not None and end["stopped"]:
        found.stopped.append(rank)  # stopped because another rank failed, or the job was cancelled
    elif end is not None or step is not None:
        seen = "" if end is not None else f" ({step[2]})" if step is not None else ""
        text = (f"its process {_how(code)}{seen}, without a Python exception (os._exit, a crash in native code, "
                f"a kill from outside, running out of memory)\n{_tail(task)}")
        if end is not None:
            found.timed.append((float(end["at"]) - _DEATH_SLACK_S, rank, text, code))
        elif step is not None:
            found.deaths.append((step[0], rank, text, code))
    else:
        found.timed.append((float("inf"), rank, f"its process ended without a result (the job ended {state})\n"
                            f"{_tail(task)}", None))


def _raise_first(found: _Findings, steps: dict[int, tuple[int, int | None, str, str | None]]) -> None:
    """RankFailed for the first failure, if any rank failed."""
    first = min(found.timed) if found.timed else None
    if found.deaths:
        death = min(found.deaths)
        step = steps.get(first[1]) if first is not None else None
        # A rank's error is timed, a death only ordered by srun's report: the death came first when srun
        # saw it end before the rank that erred (whose error then is the death's consequence).
        if first is None or step is None or step[0] > death[0]:
            _, rank, text, code = death
            raise RankFailed(rank, text, code, host=found.hosts.get(rank))
    if first is not None:
        when, rank, text, code = first
        raise RankFailed(rank, text, code, None if when == float("inf") else when, found.hosts.get(rank))


def _success(result_pickle: Path) -> bool:
    return result_pickle.exists() and _outcome(result_pickle) == "success"


def _ranks(ranks: Sequence[int]) -> str:
    return ", ".join(map(str, ranks))

