"""PBS Pro / OpenPBS and Torque: render the qsub script, submit, ask for the state, cancel.

Tested against a real OpenPBS 23.06 (the PBS dev cluster, app/devcluster/pbs.py): qsub takes the rendered
script, the states and substates below are the ones its qstat -x -f -F json showed, and the ranks start
through Open MPI's rsh launcher over pbs_tmrsh (allocation/tmrsh.py). Torque's qstat text is read too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shlex
import shutil
import time
from collections.abc import Sequence
from typing import Any

from ..core import REQUEUE_OF
from ..core.errors import SchedulerError
from ..core.jobfiles import JobFiles
from ..core.spec import MPI_FLAVOURS, JobSpec
from ..render.pbs_script import check, job_name
from ..render.pbs_script import render_script as render_script  # the edge renders what it submits
from . import Held, JobStatus, Submission, array_outcome, run_command, submit_with
from .interface import QueuedEdge
from .runner import read_file
from .support import Refusals

_TORQUE = {"exclusive": "Torque's qsub script has no exclusive placement (leave it out, or --pbs-flavour pro)",
           "stage_env": "the environment is staged through pbs_tmrsh, which Torque has not (leave it out, or "
                        "--pbs-flavour pro)"}
# An array's element (or a Torque job) is not submitted again at the warning (render/pbs_script.py resubmits):
# there --requeue is -r y alone, and PBS does not count its reruns.
_NO_RESUBMIT = {"max_requeues": "a PBS job array's element (or a Torque job) is not submitted again at the warning, "
                                "and PBS does not count its own reruns of a -r y job (leave it out)"}
# What PBS cannot carry out (schedulers/support.py).
REFUSALS = Refusals(
    not_carried_out={
        "qos": "PBS has no QOS (a site's equivalent is a queue, --partition, or a resource, --pbs-resource "
               "KEY=VALUE)",
        "constraint": "PBS has no node features list (ask for a site resource of every node with --pbs-chunk "
                      "KEY=VALUE, e.g. system=polaris)",
        "gpu_flag": "it only chooses how sbatch is asked for GPUs (leave it out)",
        "container_image": "it uses Slurm's pyxis plugin through srun (use --apptainer IMAGE under PBS)",
        "mode": "under PBS mpiexec starts one launcher per rank (leave out --mode)",
    },
    values={"mpi": (MPI_FLAVOURS, "the MPI whose mpiexec starts the ranks")},
    more=lambda spec: {**(_TORQUE if spec.site.pbs_flavour == "torque" else {}), **(_NO_RESUBMIT if (
        spec.site.pbs_flavour == "torque" or spec.is_array) else {})},
)
# `slurmlaunch logs --rank`: no file of a rank's own
SHARED_OUTPUT = "under PBS every rank's lines are in the job's one output, tagged by mpiexec"
SCRIPT_SUFFIX = "qsub"

# job_state letters; F (PBS Pro) and C (Torque) are finished: the exit status says how.
_STATES = {"Q": "PENDING", "H": "PENDING", "W": "PENDING", "T": "PENDING", "S": "SUSPENDED", "R": "RUNNING",
           "E": "COMPLETING", "B": "RUNNING", "X": "COMPLETED", "F": "COMPLETED", "C": "COMPLETED"}


def available() -> bool:
    return shutil.which("qsub") is not None


def auto_check() -> tuple[bool, str]:
    return True, ""  # qsub on PATH says enough (no cheap "is the server up" to ask)


def qsub_command(spec: JobSpec, script_path: str) -> list[str]:
    # A directory as -o: PBS names the file after the job id inside it.
    return ["qsub", "-N", job_name(spec), "-o", spec.log_dir.rstrip("/") + "/", script_path]


def parse_job_id(out: str) -> str | None:
    """The short job id in what qsub printed: 1234 of 1234.server; an array 1234[].server is 1234 (its subjobs
    1234_N); None when it is not a job id."""
    return out.split(".", 1)[0].split("[", 1)[0] if re.fullmatch(r"\d+(\[\d*\])?(\.[\w.-]+)?", out) else None


def submit(spec: JobSpec, script_text: str) -> Submission:
    """Save the script beside the logs, qsub it, and keep a record; SchedulerError when PBS refuses."""
    return submit_with(spec, script_text, "pbs", SCRIPT_SUFFIX, qsub_command, parse_job_id, held=HELD)


def _hold(spec: JobSpec, command: list[str]) -> list[str]:
    return [*command[:-1], "-h", command[-1]]  # qsub checks the request against the queue's limits all the same


def cluster() -> dict[str, str]:
    """Which server this is: its name and host (and version), as `qstat -B -f` says; {} where it cannot be
    asked. A server started again keeps its name: its jobs' ctime tells them apart (see :func:`identity`)."""
    try:
        out = run_command(["qstat", "-B", "-f", "-F", "json"], timeout=30).stdout
        servers = json.loads(out).get("Server") or {}
        name, attrs = next(iter(servers.items()))
        return {"server": str(name), "host": str(attrs.get("server_host", "")),
                "version": str(attrs.get("pbs_version", ""))}
    except (SchedulerError, ValueError, AttributeError, StopIteration):
        pass
    try:  # Torque: text only
        text = run_command(["qstat", "-B", "-f"], timeout=30).stdout
    except SchedulerError:
        return {}
    found = re.search(r"^Server:\s*(\S+)", text, re.M)
    return {"server": found[1]} if found else {}


def identity(job_id: str) -> dict[str, str] | None:
    """What PBS says of job ``job_id`` that a later job given the same id (a server started again numbers from
    0) cannot share: when it was created (ctime) and its name; None when PBS knows no such job (its history
    kept no longer, or another server). SchedulerError when PBS cannot be asked."""
    try:
        attrs = _qstat_json(pbs_id(job_id))
        if attrs is None:
            return identity_from_text(_qstat(pbs_id(job_id)))
    except SchedulerError as e:
        if any(words in str(e) for words in _UNKNOWN):
            return None
        raise
    return {"submitted": " ".join(str(attrs.get("ctime", "")).split()), "name": str(attrs.get("Job_Name", ""))}


def unfold(text: str) -> str:
    """qstat -f's text with a long value's folded lines (a tab, then more of the value) joined again. A tab
    followed by "Name = " begins an attribute (Slurm's Torque wrapper indents every one with a tab)."""
    return re.sub(r"\n\t(?![\w.]+ = )", "", text)


def identity_from_text(text: str) -> dict[str, str]:
    """:func:`identity` from qstat -f's text form (Torque's, Slurm's Torque wrapper's). The wrapper shows no
    ctime while the job lives and its end time as ctime after: recorded empty, it is not compared
    (schedulers.same_job), and the job's name decides."""
    attrs = dict(re.findall(r"^\s*(ctime|Job_Name)\s*=\s*(.*?)\s*$", unfold(text), re.M))
    return {"submitted": " ".join(attrs.get("ctime", "").split()), "name": attrs.get("Job_Name", "")}


# What qstat says of a job id it does not know (PBS Pro, OpenPBS, Torque), history expired or never there.
_UNKNOWN = ("Unknown Job Id", "Job has finished", "Unknown Job")


def prepare(spec: JobSpec, job_id: str, short: str, log_dir: str) -> None:
    """Where the held job's files are in a directory of their own: its output goes there too (qalter -o)."""
    if log_dir != spec.log_dir:
        run_command(["qalter", "-o", log_dir.rstrip("/") + "/", job_id], timeout=30)


def _users_own_hold(spec: JobSpec) -> bool:
    """Whether the user's own qsub arguments (--sbatch-arg) hold the job (-h) or set its start (-a): theirs to
    release."""
    return any(arg.split("=", 1)[0] in ("-h", "-a") for arg in spec.site.sbatch_args)


def release(spec: JobSpec, job_id: str) -> None:
    """Let the held job go, unless the user's own qsub arguments hold it."""
    if not _users_own_hold(spec):
        run_command(["qrls", job_id], timeout=30)


def _array_base(job_id: str) -> str:
    """1234 of 1234[].server, 1234[] or 1234."""
    return job_id.split(".", 1)[0].removesuffix("[]")


def pbs_id(job_id: str) -> str:
    """slurmlaunch's name of a job array's element, ARRAYID_INDEX (as Slurm's), in PBS's spelling ARRAYID[INDEX]."""
    base, sep, index = job_id.rpartition("_")
    return f"{_array_base(base)}[{index}]" if sep and index.isdigit() else job_id


def _qstat(job_id: str, *flags: str) -> str:
    """qstat -x -f (PBS Pro keeps finished jobs with -x), else qstat -f (Torque)."""
    try:
        return run_command(["qstat", "-x", "-f", *flags, job_id], timeout=30).stdout
    except SchedulerError:
        return run_command(["qstat", "-f", *flags, job_id], timeout=30).stdout


def _fields(block: str) -> dict[str, str]:
    return dict(re.findall(r"^\s*(job_state|Exit_status|exit_status|exec_host)\s*=\s*(\S+)", block, re.M))


# The server's comment on a job a user deleted ("Job run at ... and terminated by root@head"; it ends "and
# finished" or "and failed" otherwise): qdel'd after a sister host's MoM was started again, the job reads
# substate 93 and Exit_status 0 (seen on OpenPBS 23.06), and this is the word that it was cancelled.
_DELETED_BY = re.compile(r" and terminated by \S+@\S+")
# Substates of a finished job (OpenPBS src/include/job.h, JOB_SUBSTATE_*), as a real server sets them:
# 91 terminated (qdel, running or not: Exit_status 0 or none at all), 92 finished, 93 failed (a non-zero
# exit, or killed by PBS: Exit_status negative, JOB_EXEC_*).
SUBSTATE_TERMINATED = 91
# Negative Exit_status values are PBS's own (JOB_EXEC_*): the job did not end by itself.
EXIT_KILLED_WALLTIME = -29  # JOB_EXEC_KILL_WALLTIME: resources_used.walltime passed Resource_List.walltime
# What a job queued again for a rerun carries until it starts again (Exit_status of the run that was stopped):
# JOB_EXEC_RERUN (qrerun; seen on the real server: Q, substate 10, run_count still the stopped run's),
# _RERUN_SIS_FAIL (a sister host lost), _HOOK_RERUN, _FAILHOOK_RERUN, _RERUN_MS_FAIL (mother superior lost).
EXIT_RERUN = {-11: "qrerun", -14: "a host of it failed", -18: "a hook asked", -16: "a hook refused to start it",
              -20: "its first host failed"}


def job_status(attrs: dict[str, Any], code_file: int | None = None, now: float | None = None) -> JobStatus:
    """One job of `qstat -x -f -F json`'s "Jobs" as slurmlaunch's state (Slurm's words) and exit code. A qdel'd
    job (substate 91, or the server's comment "terminated by USER@HOST") is CANCELLED whatever its Exit_status
    says (PBS leaves 0 there); past its walltime
    (Exit_status -29) TIMEOUT; PBS's other negative codes FAILED with code 1; Exit_status 256+N (the job
    script killed by signal N) reads as 128+N, as a shell shows it. ``code_file`` (the script's own word,
    the first failing rank's code) wins over Exit_status for a job that ended by itself. The elapsed time of
    a running job is ``now`` (seconds since the epoch) less its stime, see :func:`elapsed_of`."""
    letter = str(attrs.get("job_state", ""))
    if letter not in _STATES:
        raise SchedulerError(f"qstat: unknown job_state {letter!r} (expected one of {''.join(_STATES)})")
    state = _STATES[letter]
    nodes = attrs.get("exec_host")
    elapsed = elapsed_of(attrs, now if state in ("RUNNING", "SUSPENDED", "COMPLETING") else None)
    raw = attrs.get("Exit_status")
    code = int(raw) if isinstance(raw, int) or (isinstance(raw, str) and raw.lstrip("-").isdigit()) else None
    if state != "COMPLETED":
        note = _rerun_note(state, code, attrs.get("run_count"))
        comment = attrs.get("comment")
        if note is None and state == "PENDING" and isinstance(comment, str) and comment.strip():
            # the scheduler's word on why it waits ("Not Running: Insufficient amount of resource: ncpus", "Can
            # Never Run: Not enough total nodes available"), as Slurm's reason is shown
            note = f"PBS's comment: {comment.strip()}"
        return JobStatus(state, None, nodes, elapsed=elapsed, note=note)
    if _substate(attrs) == SUBSTATE_TERMINATED or _DELETED_BY.search(str(attrs.get("comment") or "")):
        state = "CANCELLED"
    elif code == EXIT_KILLED_WALLTIME:
        state = "TIMEOUT"
    elif code is not None and code < 0:
        state = "FAILED"
    else:
        if code is not None and code > 256:
            code = 128 + code - 256
        if code_file is not None:
            code = code_file
        state = "COMPLETED" if not code else "FAILED"
    if code is None or code < 0 or (code == 0 and state != "COMPLETED"):
        code = 0 if state == "COMPLETED" else 1
    return JobStatus(state, code, nodes, elapsed=elapsed)


def elapsed_of(attrs: dict[str, Any], now: float | None = None) -> str | None:
    """HH:MM:SS the job has run. resources_used.walltime is the MoM's, sent to the server only when it polls
    the job (a real OpenPBS showed 00:00:00 for a job running for a minute), so while the job runs (``now``
    given) it is ``now`` less stime (when the job started, as qstat -F json prints it: ctime's form in the
    server's local time, or seconds since the epoch) where that is later."""
    used = (attrs.get("resources_used") or {}).get("walltime")
    used = str(used) if used is not None else None
    started = _epoch(attrs.get("stime"))
    if now is None or started is None:
        return used
    seconds = max(0, int(now - started), _seconds(used))
    return f"{seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def _epoch(value: object) -> float | None:
    if isinstance(value, int) or (isinstance(value, str) and value.isdigit()):
        return float(value)
    if isinstance(value, str):
        with contextlib.suppress(ValueError, OverflowError):
            return time.mktime(time.strptime(" ".join(value.split()), "%a %b %d %H:%M:%S %Y"))
    return None


def _seconds(hms: str | None) -> int:
    parts = (hms or "").split(":")
    return sum(int(p) * 60 ** i for i, p in enumerate(reversed(parts))) if all(p.isdigit() for p in parts) else 0


def _rerun_note(state: str, code: int | None, run_count: object) -> str | None:
    """A rerunnable (-r y) job that PBS stopped and queued again, from the start of its script: while it waits
    (its Exit_status is the stopped run's JOB_EXEC_*RERUN* code) and while it runs again (run_count > 1)."""
    runs = int(run_count) if isinstance(run_count, int) or (isinstance(run_count, str) and run_count.isdigit()) else 0
    if state == "PENDING" and code in EXIT_RERUN:
        return f"PBS stopped run {runs or 1} and queued it again to rerun ({EXIT_RERUN[code]})"
    if state == "RUNNING" and runs > 1:
        return f"run {runs}: PBS reran it from the start"
    return None


def _substate(attrs: dict[str, Any]) -> int | None:
    raw = attrs.get("substate")
    return raw if isinstance(raw, int) else int(raw) if isinstance(raw, str) and raw.isdigit() else None


def _qstat_json(job_id: str) -> dict[str, Any] | None:
    """The job's attributes from `qstat -x -f -F json` (PBS Pro, OpenPBS), or None where qstat has no JSON
    form (Torque's): the caller reads the text form then. An unknown job id is an error either way."""
    try:
        out = run_command(["qstat", "-x", "-f", "-F", "json", job_id], timeout=30).stdout
    except SchedulerError as e:
        # an unknown job, and a server that gave no answer in time (asking qstat's text form next would
        # only wait as long again), are errors; any other failure is a qstat without -F json (Torque's)
        if any(words in str(e) for words in ("Unknown Job Id", "Job has finished", "no answer within")):
            raise
        return None
    try:
        jobs = json.loads(out).get("Jobs") or {}
    except (ValueError, AttributeError):
        return None
    if len(jobs) != 1:
        raise SchedulerError(f"qstat -x -f -F json {job_id}: expected one job, got {len(jobs)}")
    return dict(next(iter(jobs.values())))


def status(job_id: str, log_dir: str | None = None) -> JobStatus:
    """`qstat -x -f -F json` (PBS Pro keeps finished jobs with -x), else the text of qstat -x -f / qstat -f
    (Torque); a finished job's exit code is its exit-code file in ``log_dir`` when the script wrote one, else
    PBS's Exit_status (see :func:`job_status`)."""
    attrs = _attributes(job_id)
    note = None
    if _STATES.get(str(attrs.get("job_state", ""))) == "COMPLETED" and log_dir is not None:
        chain = resubmissions(job_id, log_dir)
        if chain and not resubmission_of(chain[-1], job_id):  # a planted or garbled list: not followed
            planted = os.path.basename(JobFiles(log_dir, _array_base(job_id)).requeued)
            note = f"its {planted} lists job {chain[-1]}, which PBS does not show as its resubmission: not followed"
        elif chain:  # resubmitted at the warning (allocation/batch_step.py): the last one is the job now
            attrs = _attributes(chain[-1])
            note = f"run {len(chain) + 1}: resubmitted at the warning as job {chain[-1]}"
    code_file = None
    if _STATES.get(str(attrs.get("job_state", ""))) == "COMPLETED" and log_dir is not None:
        # The script's own word wins: some qstat (Slurm's Torque wrappers) report no exit status at all.
        # Read where the job ran (through the runner: over ssh for a remote job).
        text = read_file(JobFiles(log_dir, _array_base(job_id)).exit_code, limit=64)
        with contextlib.suppress(ValueError):
            code_file = int(text.strip()) if text is not None else None
    st = job_status(attrs, code_file, now=time.time())
    if st.state in _ON_HOSTS and st.nodes:  # a host lost under the job: PBS keeps it running (see node_trouble)
        note = "; ".join([*([note] if note else []), *node_trouble(st.nodes)]) or None
    return dataclasses.replace(st, note=f"{note}; {st.note}" if st.note and note else note or st.note)


# The states in which a job holds hosts whose loss matters to it.
_ON_HOSTS = frozenset({"RUNNING", "COMPLETING", "SUSPENDED"})
# pbsnodes' states of a host that runs nothing of a job's (state-unknown: the server never heard from its MoM).
_HOST_TROUBLE = ("down", "offline", "state-unknown", "unresolvable", "stale")


def node_trouble(exec_host: str) -> list[str]:
    """What the server says of each host in ``exec_host`` ("n1/0*2+n2/0*2") that is not healthy: "node2 down
    (PBS's comment: node down: communication closed)". A sister host whose MoM died is marked down at once
    (its connection closes), while the job stays R, its ranks there perhaps still running, until its
    walltime (seen on OpenPBS 23.06): this is the word that it lost a host. Nothing where pbsnodes cannot say
    (Torque's has no JSON form)."""
    hosts = list(dict.fromkeys(part.split("/", 1)[0] for part in exec_host.split("+") if part.split("/", 1)[0]))
    try:
        out = run_command(["pbsnodes", "-F", "json", "-v", *hosts], timeout=30).stdout
        nodes = json.loads(out).get("nodes") or {}
    except (SchedulerError, ValueError, AttributeError):
        return []
    said = []
    for host in hosts:
        attrs = nodes.get(host)
        if not isinstance(attrs, dict):
            continue
        state = str(attrs.get("state", ""))
        trouble = [w for w in state.split(",") if w in _HOST_TROUBLE]
        if trouble:
            comment = str(attrs.get("comment") or "").strip()
            said.append(f"{host} {' and '.join(trouble)}" + (f" (PBS's comment: {comment})" if comment else ""))
    return said


def _attributes(job_id: str) -> dict[str, Any]:
    attrs = _qstat_json(pbs_id(job_id))
    if attrs is None:
        attrs = dict(_fields(_qstat(pbs_id(job_id))))
        if "Exit_status" not in attrs and "exit_status" in attrs:  # Torque's spelling
            attrs["Exit_status"] = attrs["exit_status"]
    return attrs


def resubmissions(job_id: str, log_dir: str) -> list[str]:
    """The jobs the batch step submitted job ``job_id`` again as at the warning (its job-ID.requeued, one id a
    line, in order; read where the job ran), each one's files being the first job's."""
    data = read_file(JobFiles(log_dir, _array_base(job_id)).requeued, limit=64 << 10)
    lines = (data or b"").decode("utf-8", errors="replace").split()
    return [line for line in lines if re.fullmatch(r"\d+(\.[\w.-]+)?", line)
            and _array_base(line) != _array_base(job_id)]  # a list that names the job itself is no chain


def resubmission_of(job_id: str, first: str) -> bool:
    """Whether PBS job ``job_id`` is one the batch step submitted job ``first`` again as: its qsub -v gave it
    SLURMLAUNCH_REQUEUE_OF=FIRST (allocation/batch_step.py), which qstat -f shows in its Variable_List. A
    job-ID.requeued file is only a file in the log directory, which anyone who may write there can plant or
    garble: cancel deletes no id it lists without this word of the server's. False when qstat cannot say."""
    try:
        attrs = _qstat_json(pbs_id(job_id))  # OpenPBS, PBS Pro: Variable_List is an object
        if attrs is not None:
            listed = attrs.get("Variable_List")
            value = listed.get(REQUEUE_OF) if isinstance(listed, dict) else None
            return value is not None and _array_base(str(value)) == _array_base(first)
        text = _qstat(pbs_id(job_id))  # Torque: the text form
    except SchedulerError:
        return False
    text = unfold(text)  # qstat -f folds a long attribute onto lines that begin with a tab
    named = re.findall(rf"(?:^|[\s,]){REQUEUE_OF}=(\d+)", text)
    return bool(named) and all(n == _array_base(first) for n in named)


def _subjobs_json(base: str) -> dict[int, dict[str, Any]] | None:
    """Every subjob of array ``base`` (index -> attributes) from `qstat -x -f -F json -t ID[]`, or None where
    qstat has no JSON form (Torque's). The array itself (ID[]) is left out."""
    try:
        out = run_command(["qstat", "-x", "-f", "-F", "json", "-t", f"{base}[]"], timeout=30).stdout
        jobs = json.loads(out).get("Jobs") or {}
    except (SchedulerError, ValueError, AttributeError):
        return None
    found = {int(m[1]): dict(attrs) for name, attrs in jobs.items() if (m := re.match(r"\d+\[(\d+)\]", name))}
    return found or None


def array_status(job_id: str, log_dir: str, indices: list[int]) -> JobStatus:
    """A job array as one job (as Slurm's): running while a subjob is, then the first (in index order)
    subjob that did not succeed says how it ended: FAILED with its exit code, or CANCELLED (qdel: substate 91,
    which PBS reports with Exit_status 0) or TIMEOUT; else COMPLETED. Subjobs come from `qstat -x -f -F json
    -t ID[]` (Torque: the text of qstat -f -t, one "Job Id: ID[N].server" block each); a finished one's code
    is its exit-code file, else PBS's Exit_status."""
    base = _array_base(job_id)
    subjobs = _subjobs_json(base)
    if subjobs is not None:
        return _array_from_json(base, log_dir, indices, subjobs)
    text = _qstat(f"{base}[]", "-t")
    live: dict[int, tuple[str, str]] = {}
    ended: dict[int, int | None] = {}
    for block in re.split(r"^Job Id:\s*", text, flags=re.M)[1:]:
        m = re.match(r"\d+\[(\d+)\]", block)
        if not m:
            continue  # the array itself (ID[]), not a subjob
        fields = _fields(block)
        state = _STATES.get(fields.get("job_state", ""), "PENDING")
        code_text = fields.get("Exit_status") or fields.get("exit_status") or ""
        if state == "COMPLETED":
            ended[int(m[1])] = int(code_text) if code_text.lstrip("-").isdigit() else None
        else:
            live[int(m[1])] = (state, fields.get("exec_host", ""))
    return array_outcome(base, log_dir, indices, live, ended, "deleted, or the walltime ran out")


def _array_from_json(base: str, log_dir: str, indices: list[int], subjobs: dict[int, dict[str, Any]]) -> JobStatus:
    live: dict[int, tuple[str, str]] = {}
    ended: dict[int, JobStatus] = {}
    for index, attrs in subjobs.items():
        st = job_status(attrs)
        if st.finished:
            ended[index] = st
        else:
            live[index] = (st.state, st.nodes or "")
    outcome = array_outcome(base, log_dir, indices, live, {i: st.exit_code for i, st in ended.items()},
                            "deleted, or the walltime ran out")
    # PBS's word on a subjob it stopped (qdel, walltime), where the script wrote no exit code (it was killed
    # first): a qdel'd one says Exit_status 0. A qdel of the array marks its finished subjobs substate 91 too,
    # so a subjob that wrote its code ended by itself, whatever PBS says later.
    stopped = {i: st for i, st in ended.items() if st.state in ("CANCELLED", "TIMEOUT") and i in indices
               and not os.path.exists(JobFiles(log_dir, base).element(i).exit_code)}
    if not stopped or outcome.elements is None:
        return outcome
    elements = {**outcome.elements, **{str(i): f"{st.state} {st.exit_code}" for i, st in stopped.items()}}
    if live:
        return dataclasses.replace(outcome, elements=elements)
    first = next((i for i in sorted(indices) if not elements[str(i)].startswith("COMPLETED")), None)
    if first is None:
        return dataclasses.replace(outcome, elements=elements)
    state, _, code = elements[str(first)].partition(" ")
    return dataclasses.replace(outcome, state=state if state in ("CANCELLED", "TIMEOUT", "FAILED") else "FAILED",
                               exit_code=int(code) if code.isdigit() and int(code) > 0 else 1, elements=elements)


def cancel(job_id: str) -> None:
    """qdel ID; an array's element ID_N is ID[N] to PBS (the whole array is recorded as ID[].server)."""
    run_command(["qdel", pbs_id(job_id)], timeout=30)


def _rank_log(spec: JobSpec, job_id: str, rank: int) -> str | None:
    return None  # mpiexec tags every rank's lines in the job's one output file


def _batch_log(spec: JobSpec, job_id: str) -> str | None:
    return None  # PBS names it after the job id inside the -o directory


def _output_log(log_dir: str, job: str, printed_id: str) -> str:
    """qsub -o DIR/: PBS Pro writes DIR/<full id>.OU, Torque DIR/<name>.o<number>; mpiexec tags each line with
    its rank, so one file holds every rank's output. (Listed here: a remote job's directory is not, and
    then the PBS Pro name is the guess.)"""
    for name in sorted(os.listdir(log_dir)) if os.path.isdir(log_dir) else []:
        if name.startswith(f"{printed_id}.") or name.endswith(f".o{job}"):
            return os.path.join(log_dir, name)
    return os.path.join(log_dir, f"{printed_id}.OU")


def node_commands(job_id: str, nodes: str, argv: Sequence[str]) -> dict[str, list[str]]:
    """ssh to each execution host of the running job (exec_host "n1/0*2+n2/0*2"): PBS sites let a job's owner
    onto the hosts the job holds (pbs_attach / the PAM module put the session into the job); pbsdsh and
    pbs_tmrsh work only from inside the job. Tried on the real OpenPBS dev cluster (its hosts run sshd)."""
    hosts = dict.fromkeys(part.split("/", 1)[0] for part in nodes.split("+") if part.split("/", 1)[0])
    return {host: ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "--", host, shlex.join(argv)]
            for host in hosts}


HELD = Held(hold=_hold, cluster=cluster, identity=identity, prepare=prepare, release=release, cancel=cancel)

# The pbs edge as a Scheduler (schedulers.interface)
EDGE = QueuedEdge(
    name="pbs", title="PBS", client="qsub", readers=("read_mpi", "read_pbs_script"), refusals=REFUSALS,
    script_suffix=SCRIPT_SUFFIX, is_available=available, check_auto=auto_check, render_script=render_script,
    submit_script_command=qsub_command, submit_script=submit, parse_id=parse_job_id, job_status=status,
    array_status=array_status, cancel_job=cancel, resubmissions_of=resubmissions, rank_log_of=_rank_log,
    resubmission_check=resubmission_of, identity_of=identity, cluster_of=cluster,
    batch_log_of=_batch_log, output_log_of=_output_log, node_commands_of=node_commands, check_request=check,
    # False: no Lightning adaptation (its requeue on the warning is Slurm's scontrol); --signal itself is carried
    # out, sent by the batch step before the walltime (allocation/batch_step.py)
    warning_signal=False,
    shared_output=SHARED_OUTPUT,
    submitit_executor=None,  # the API's own PBS executor (app/api/pbs.py) runs its jobs through this edge
    exports_environment=False,  # qsub without -V: the job has the script's environment, not the shell's
    doctor_checks="pbs",  # app/doctor/pbs.py: the server, the queue, the execution hosts
)
