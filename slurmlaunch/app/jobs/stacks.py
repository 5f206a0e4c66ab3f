"""`slurmlaunch stacks JOB`: every rank's Python stacks, collected in bounded time and grouped; the stacks
saved when a job was stopped; `cancel --stacks`; ``Job.stacks()``'s data.

A running job's ranks are asked through the RUNNER's faulthandler (allocation.stacks): locally this process
signals them itself (every emulated node is this machine); under a batch scheduler one small command per node
does it next to the ranks (the edge's node_commands: an srun --overlap step, ssh to a PBS execution host) and
prints one JSON line per rank. A node that does not answer within the bound names its ranks as not reached.
An ended job shows what its ranks saved when they were stopped.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ...allocation.stacks import answers as to_answers
from ...allocation.stacks import armed, collect, saved, source_line
from ...core.errors import JobStateError, SchedulerError, SpecError
from ...core.jobfiles import JobFiles
from ...core.stacks import Grouping, RankStacks, group, render_stack, to_data
from ..records import GONE, OTHER, JobRecord, checked_status
from .commands import _edge, find, recorded_spec

NODE_START_S = 30.0  # seconds a node's collector may take to start (an srun step, ssh), on top of --timeout


@dataclass(frozen=True)
class Stacks:
    """What `stacks` found: the ranks' answers, their grouping, whether they are live or saved at a stop."""

    job_id: str
    answers: tuple[RankStacks, ...]
    grouping: Grouping
    live: bool  # False: the job has ended; these are the stacks its ranks saved when they were stopped
    seconds: float  # how long the collection took
    directory: str  # where the dumps are

    def data(self) -> dict[str, object]:
        return {"job_id": self.job_id, "live": self.live, "seconds": round(self.seconds, 3),
                "directory": self.directory, **to_data(self.grouping, self.answers)}


def _missing(files: JobFiles, world: int, have: Collection[int], unreached: dict[str, str],
             wanted: Collection[int] | None) -> list[RankStacks]:
    """The ranks no collector reported: on a node that did not answer, or never armed (not started yet, or
    not run through the RUNNER: --no-python)."""
    hosts = {a.rank: a.host for a in armed(files.stacks)}
    out = []
    for rank in range(world):
        if rank in have or (wanted is not None and rank not in wanted):
            continue
        host = hosts.get(rank, "")
        if host and host in unreached:
            out.append(RankStacks(rank, host, (), f"not reached: {unreached[host]}"))
        elif host:
            out.append(RankStacks(rank, host, (), f"not reported by the collector on {host}"))
        else:
            out.append(RankStacks(rank, "", (), "no stacks armed: the rank has not started its script through "
                                                "slurmlaunch's runner (not started yet, or --no-python)"))
    return out


def _on_nodes(commands: dict[str, list[str]], timeout: float,
              parallel: bool = True) -> tuple[list[dict[str, object]], dict[str, str]]:
    """Run each node's collector (at once, unless not ``parallel``); (the JSON entries they printed, node -> why
    it did not answer)."""
    from ...schedulers.runner import run_command

    def one(node: str, argv: list[str]) -> tuple[str, list[dict[str, object]], str | None]:
        try:
            out = run_command(argv, timeout=timeout + NODE_START_S).stdout
        except SchedulerError as e:
            return node, [], str(e)
        entries = []
        for line in out.splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if isinstance(entry, dict) and isinstance(entry.get("rank"), int):
                entries.append(entry)
        return node, entries, None

    entries: list[dict[str, object]] = []
    unreached: dict[str, str] = {}
    with ThreadPoolExecutor(max_workers=min(32, max(1, len(commands))) if parallel else 1) as pool:
        for node, got, error in pool.map(lambda item: one(*item), commands.items()):
            entries += got
            if error is not None:
                unreached[node] = f"{node} did not answer within {timeout + NODE_START_S:g}s ({error[:300]})"
    return entries, unreached


def _remote(record: JobRecord, world: int, timeout: float, ranks: Collection[int] | None) -> Stacks:
    """A job of a remote cluster, from the laptop: its edge over ssh (remote_jobs), the node collectors run
    from the login node one after another (one ssh connection), each in the environment the ranks got (the
    job's setup lines: the shipped package on PYTHONPATH, module loads)."""
    from ..remote.jobs import login_node

    saved = record.data.get("spec", {})
    python = str(saved.get("python") or "python3")
    setup = [str(line) for line in saved.get("setup", ())]
    files = JobFiles(record.log_dir, record.tag)
    started = time.monotonic()
    with login_node(record) as (_, edge):
        st, verdict = checked_status(record, edge)
        if verdict in (GONE, OTHER):
            raise JobStateError(f"{st.note}: no stacks taken")
        if st.state != "RUNNING":
            raise JobStateError(f"job {record.tag} on {record.remote} is {st.state}: from here, stacks are of a "
                                f"running job (what its ranks saved when stopped is in {files.stacks} there)")
        argv = [python, "-m", "slurmlaunch", "stacks-node", files.stacks, "--timeout", f"{timeout:g}"]
        if setup:
            argv = ["bash", "-c", "\n".join(setup) + '\nexec "$@"', "slurmlaunch-stacks", *argv]
        entries, unreached = _on_nodes(edge.node_commands(record.full_id, st.nodes or "", argv), timeout, False)
    answers = to_answers([e for e in entries if ranks is None or e["rank"] in ranks], timeout)
    have = {a.rank for a in answers}
    why = "; ".join(unreached.values())[:400]
    answers += [RankStacks(r, "", (), f"not reached: {why}" if why else "not reported (not started yet, or "
                           "--no-python)") for r in range(world) if r not in have and (ranks is None or r in ranks)]
    return Stacks(record.tag, tuple(sorted(answers, key=lambda a: a.rank)), group(answers, source_line), True,
                  time.monotonic() - started, files.stacks)


def _running(record: JobRecord) -> tuple[bool, str | None]:
    """(whether the job runs now, its nodes in the scheduler's words)."""
    st, verdict = checked_status(record, _edge(record))
    if verdict in (GONE, OTHER) and st.note:  # never signal the ranks of another job of that id
        sys.stderr.write(f"slurmlaunch: {st.note}\n")
    return st.state == "RUNNING", st.nodes


def job_stacks(record: JobRecord, timeout: float = 10.0, ranks: Collection[int] | None = None) -> Stacks:
    """The stacks of every rank (only ``ranks`` when given) of the job ``record`` names: live while it runs,
    else those its ranks saved when they were stopped. Each node answers within ``timeout`` seconds (plus
    NODE_START_S for its collector to start) or its ranks are named as not reached."""
    spec = recorded_spec(record)
    if spec.is_array and record.element is None:
        raise SpecError(f"stacks: job {record.tag} is an array: name one element, e.g. {record.tag}_"
                        f"{spec.array_indices[0]}")
    if record.remote:
        return _remote(record, spec.world_size, timeout, ranks)
    live, nodes = _running(record)
    python = str(record.data.get("spec", {}).get("python") or "python3")
    return collect_stacks(record.scheduler, record.full_id, JobFiles(record.log_dir, record.tag), spec.world_size,
                          python, live, nodes, timeout, ranks)


def collect_stacks(scheduler_name: str, job_id: str, files: JobFiles, world: int, python: str, live: bool,
                   nodes: str | None, timeout: float = 10.0, ranks: Collection[int] | None = None) -> Stacks:
    """The stacks of a job of ``scheduler_name`` (``job_id`` as the scheduler knows it; its files): live
    when it runs (on ``nodes``, the scheduler's words), else what its ranks saved when they were stopped."""
    from ...schedulers.registry import scheduler

    edge = scheduler(scheduler_name)
    started = time.monotonic()
    unreached: dict[str, str] = {}
    record_tag = files.job
    if not live:
        entries = [e for e in saved(files.stacks) if ranks is None or e["rank"] in ranks]
        if not entries:
            raise JobStateError(f"job {record_tag} is not running and its ranks saved no stacks when they ended "
                                f"(in {files.stacks})")
    elif not edge.queued:  # every (emulated) node is this machine: signal the ranks here
        entries = collect(files.stacks, None, timeout, ranks)
    else:
        argv = [python, "-m", "slurmlaunch", "stacks-node", files.stacks, "--timeout", f"{timeout:g}"]
        commands = edge.node_commands(job_id, nodes or "", argv)
        if not commands:
            raise JobStateError(f"stacks: job {record_tag} runs on no node the scheduler names ({nodes!r})")
        entries, unreached = _on_nodes(commands, timeout)
        if ranks is not None:
            entries = [e for e in entries if e["rank"] in ranks]
    answers = to_answers(entries, timeout)
    if live:
        answers += _missing(files, world, {a.rank for a in answers}, unreached, ranks)
    return Stacks(record_tag, tuple(sorted(answers, key=lambda a: a.rank)), group(answers, source_line), live,
                  time.monotonic() - started, files.stacks)


def render(stacks: Stacks, rank: int | None) -> str:
    """The text `stacks` prints: a line per group (the odd ones first) with its main-thread stack; with
    ``rank``, every thread of that rank."""
    when = "now" if stacks.live else "when they were stopped (the job has ended)"
    lines = [f"job {stacks.job_id}: {len(stacks.answers)} rank(s), stacks {when}, collected in "
             f"{stacks.seconds:.1f}s"]
    if rank is not None:
        for a in stacks.answers:
            if a.rank != rank:
                continue
            if a.problem:
                lines.append(f"rank {a.rank}{f' on {a.host}' if a.host else ''}: {a.problem}")
            for i, t in enumerate(a.threads):
                kind = "main thread" if i == len(a.threads) - 1 else "thread"
                lines.append(f"rank {a.rank} on {a.host}, {kind} {t.ident}{' (truncated)' if t.truncated else ''}:")
                lines += render_stack(t.frames)
        return "\n".join(lines) + "\n"
    for g in stacks.grouping.groups:
        lines.append(g.line)
        lines += render_stack(g.frames)
    lines.append(f"(every thread of a rank: slurmlaunch stacks {stacks.job_id} --rank N; the dumps: "
                 f"{stacks.directory})")
    return "\n".join(lines) + "\n"


def cmd_stacks(job_id: str, rank: int | None, as_json: bool, timeout: float) -> int:
    record = find(job_id)
    spec = recorded_spec(record)
    if rank is not None and not 0 <= rank < spec.world_size:
        raise SpecError(f"stacks --rank {rank}: job {record.tag} has ranks 0-{spec.world_size - 1}")
    stacks = job_stacks(record, timeout, None if rank is None else {rank})
    if as_json:
        print(json.dumps(stacks.data()))
    else:
        sys.stdout.write(render(stacks, rank))
    return 0


def print_before_cancel(job_id: str, timeout: float) -> None:
    """`cancel --stacks`: the live stacks, grouped, before the job is cancelled (kept in the stacks directory
    too: the ranks write them again at the SIGTERM that follows)."""
    try:
        stacks = job_stacks(find(job_id), timeout)
    except (JobStateError, SpecError, SchedulerError) as e:
        sys.stderr.write(f"slurmlaunch: no stacks before cancelling: {e}\n")
        return
    sys.stdout.write(render(stacks, None))
    sys.stdout.flush()

